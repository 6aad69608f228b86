//! Bad command-line input: each is refused with exit code 2 and a message that says what
//! would be valid (issue: accepted nonsense), never run with a silent substitute. The catalog
//! of docs/errors.md is checked here message for message; the broader catalog of hostile
//! inputs (absurd arguments and sizes, every command and format) is tests/hostile/cases.toml,
//! run by `hostile.rs`.

use crate::parasim;

/// GPUs sharing NICs are reported as such, not as a NIC per GPU.
#[test]
fn shared_nics_are_reported_per_nic() {
    let text = crate::quickstart_with(
        "link-latency = \"1 us\"",
        "link-latency = \"1 us\"\nnics-per-node = 4\ngpu-to-nic = { bandwidth = \"32 GB/s\", latency = \"1 us\" }",
    );
    let path = crate::scenario_file("shared-nics.toml", &text);
    let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let network = json["cluster"]["network"].as_str().unwrap();
    assert!(network.ends_with("per NIC, 4 NICs for 8 GPUs per node"), "{network}");
}

/// Messages that once named the wrong thing, or said it three times.
#[test]
fn messages_name_the_right_thing_once() {
    let empty = crate::scenario_file("errors-empty.toml", "");
    let fake = crate::scenario_file("errors-fake.pstrace", "{}");
    let slow = crate::scenario_file(
        "errors-slow.toml",
        &crate::quickstart_with("link-bandwidth = \"200 Gb/s\"", "link-bandwidth = \"1 b/s\""),
    );
    let unit = crate::scenario_file(
        "errors-unit.toml",
        &crate::quickstart_with("link-bandwidth = \"200 Gb/s\"", "link-bandwidth = \"8E\""),
    );
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["run", empty.to_str().unwrap()],
            vec!["errors-empty.toml", "key `cluster`", "no [cluster] table"],
        ),
        (vec!["replay", fake.to_str().unwrap()], vec!["errors-fake.pstrace", "no PSTRACE magic number"]),
        (
            vec!["calibrate", fake.to_str().unwrap(), "--device", "v100-sxm2-16gb", "-o", "x.toml"],
            vec!["errors-fake.pstrace", "Kineto JSON"],
        ),
        (vec!["run", unit.to_str().unwrap()], vec!["cluster.network.link-bandwidth", "unknown unit \"E\""]),
        (vec!["run", slow.to_str().unwrap()], vec!["out of range"]),
    ];
    for (args, needles) in cases {
        let output = parasim(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{args:?}: {needle:?} not in {stderr}");
        }
        // No message repeats itself: every line of the error is said once.
        let first = stderr.lines().next().unwrap_or_default();
        for part in first.split(": ").filter(|p| p.len() > 20) {
            assert_eq!(first.matches(part).count(), 1, "{args:?} repeats {part:?}: {first}");
        }
    }
}

/// One entry of docs/errors.md: how to make the bad input, and the message.
struct CatalogEntry {
    title: String,
    args: Vec<String>,
    /// The scenario the entry's `bad.toml` starts from, if any.
    base: Option<String>,
    /// `(from, to)`: the one change that makes it bad.
    replace: Option<(String, String)>,
    /// Text appended to the base.
    append: Option<String>,
    /// `bad.toml` is empty.
    empty: bool,
    /// `bad.pstrace` is a JSON file pretending to be a binary trace.
    fake_pstrace: bool,
    /// The text of `bad.csv`, if any.
    csv: Option<String>,
    message: String,
}

/// The text between the first pair of backticks after `label` in `spec`.
fn ticked<'a>(spec: &'a str, label: &str) -> Option<&'a str> {
    let rest = &spec[spec.find(label)? + label.len()..];
    let start = rest.find('`')? + 1;
    let end = start + rest[start..].find('`')?;
    Some(&rest[start..end])
}

fn catalog() -> Vec<CatalogEntry> {
    let doc = include_str!("../../docs/errors.md");
    let mut entries = Vec::new();
    let mut title = String::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        if let Some(heading) = line.strip_prefix("### ") {
            title = heading.to_string();
        }
        let Some(spec) = line.strip_prefix("<!-- error: ") else { continue };
        let unescape = |text: &str| text.replace("\\n", "\n");
        let replace = spec.contains("replace `").then(|| {
            let from = ticked(spec, "replace ").unwrap_or_default();
            let to = ticked(spec, "` with ").unwrap_or_default();
            (unescape(from), unescape(to))
        });
        assert_eq!(lines.next(), Some("```"), "{title}: the marker must precede a code block");
        let block: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        assert!(
            block.first().is_some_and(|l| l.starts_with("$ parasim ")),
            "{title}: the block starts with the command"
        );
        entries.push(CatalogEntry {
            title: title.clone(),
            args: ticked(spec, "args ").unwrap_or_default().split_whitespace().map(String::from).collect(),
            base: ticked(spec, "base ").map(String::from),
            replace,
            append: ticked(spec, "append ").map(unescape),
            empty: spec.contains(" ; empty"),
            fake_pstrace: spec.contains("fake-pstrace"),
            csv: ticked(spec, "; csv ").map(unescape),
            message: block[1..].join("\n"),
        });
    }
    entries
}

/// docs/errors.md is what the binary says: every entry's input, made as the entry describes,
/// gets exactly that message, exit code 2 and no panic.
#[test]
fn the_error_catalog_is_what_the_binary_says() {
    let entries = catalog();
    assert!(entries.len() >= 60, "docs/errors.md lost entries: {}", entries.len());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for (index, entry) in entries.iter().enumerate() {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("errors-catalog-{index}"));
        let _ = fs_err::remove_dir_all(&dir);
        fs_err::create_dir_all(&dir).unwrap();
        if entry.fake_pstrace {
            fs_err::write(dir.join("bad.pstrace"), "{}").unwrap();
        }
        if let Some(csv) = &entry.csv {
            fs_err::write(dir.join("bad.csv"), csv).unwrap();
        }
        if let Some(base) = &entry.base {
            let mut text = fs_err::read_to_string(root.join(base)).unwrap();
            if let Some((from, to)) = &entry.replace {
                assert!(text.contains(from.as_str()), "{}: {base} no longer contains {from:?}", entry.title);
                text = text.replacen(from.as_str(), to, 1);
            }
            if let Some(append) = &entry.append {
                text.push_str(append);
            }
            if entry.empty {
                text.clear();
            }
            fs_err::write(dir.join("bad.toml"), text).unwrap();
        }
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_parasim"))
            .args(&entry.args)
            .current_dir(&dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{}: {stderr}", entry.title);
        assert!(!stderr.contains("panicked"), "{}: {stderr}", entry.title);
        assert_eq!(
            stderr.trim_end(),
            entry.message,
            "docs/errors.md's entry {:?} drifted from the binary",
            entry.title
        );
        let _ = fs_err::remove_dir_all(&dir);
    }
}

/// A latency of seconds is a typo of unit (issue 38: `link-latency = "100000 s"` ran and
/// printed "throughput 0 samples/s"): every link latency is refused above 1 s, naming the key,
/// the value and the bound; 1 s itself runs.
#[test]
fn absurd_link_latencies_are_refused() {
    let cases = [
        (
            "link-latency = \"1 us\"",
            "link-latency = \"100000 s\"",
            "cluster.network.link-latency",
            "100000 s",
        ),
        ("latency = \"0.7 us\"", "latency = \"2 s\"", "cluster.intra-node.latency", "2 s"),
        (
            "link-latency = \"1 us\"",
            "link-latency = \"1 us\"\nnics-per-node = 4\ngpu-to-nic = { bandwidth = \"32 GB/s\", latency = \"5 s\" }",
            "cluster.network.gpu-to-nic",
            "5 s",
        ),
    ];
    for (from, to, key, value) in cases {
        let text = crate::quickstart_with(from, to);
        crate::assert_rejected("errors-latency.toml", &text, &[key, value, "above the bound of 1 s"]);
    }
    let text = crate::quickstart_with("link-latency = \"1 us\"", "link-latency = \"1 s\"");
    let path = crate::scenario_file("errors-latency-1s.toml", &text);
    let output = parasim(&["run", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}
