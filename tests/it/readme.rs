//! Output shown in the README is the binary's: each block marked `<!-- snapshot: parasim ARGS
//! ... -->` (optionally starting with the command line) must equal what `parasim ARGS` prints,
//! except wall-clock lines (the `engine` line, "... of wall time") and a sweep's fingerprint,
//! which covers the build's source revision (every commit has its own). `parasim ARGS | head -N`
//! compares the first N lines, `| tail -N` the last N; a marker ending in `(stderr) -->`
//! compares the error a bad input gets, which must exit with code 2.

use crate::parasim;

/// One marked block: the arguments, the line limit, whether it shows stderr, the lines.
struct Snapshot {
    arguments: Vec<String>,
    head: Option<usize>,
    tail: Option<usize>,
    stderr: bool,
    expected: Vec<String>,
}

/// The blocks of README.md marked as snapshots.
fn snapshots() -> Vec<Snapshot> {
    let readme = include_str!("../../README.md");
    let mut found = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("<!-- snapshot: parasim ") else { continue };
        let stderr = rest.ends_with("(stderr) -->");
        let command = rest.split(" (").next().unwrap_or(rest).trim_end_matches(" -->");
        let (command, head) = match command.split_once(" | head -") {
            Some((command, n)) => (command, Some(n.trim().parse::<usize>().expect("head -N takes a number"))),
            None => (command, None),
        };
        let (command, tail) = match command.split_once(" | tail -") {
            Some((command, n)) => (command, Some(n.trim().parse::<usize>().expect("tail -N takes a number"))),
            None => (command, None),
        };
        let arguments: Vec<String> = command.split_whitespace().map(String::from).collect();
        assert_eq!(lines.next(), Some("```"), "a snapshot marker must be followed by a code block");
        let mut expected: Vec<String> =
            lines.by_ref().take_while(|l| *l != "```").map(String::from).collect();
        if expected.first().is_some_and(|l| l.starts_with("$ parasim")) {
            expected.remove(0); // the command, shown as typed
        }
        found.push(Snapshot { arguments, head, tail, stderr, expected });
    }
    found
}

/// A line as far as it does not depend on wall-clock time, which no two runs share, or on the
/// build: none of a wall-time line, an engine line's op and event counts without its timings,
/// and a sweep header without its fingerprint (it covers the source revision).
fn deterministic(line: &str) -> Option<String> {
    if line.starts_with("wall time ") || line.ends_with("of wall time") {
        return None;
    }
    if line.starts_with("engine ") {
        return line.split("; lowering").next().map(str::to_string);
    }
    if line.starts_with("# parasim sweep: ")
        && let Some((head, rest)) = line.split_once("fingerprint=")
    {
        let tail = rest.split_once(' ').map_or("", |(_, tail)| tail);
        return Some(format!("{head}fingerprint=... {tail}"));
    }
    Some(line.to_string())
}

#[test]
fn readme_output_is_what_the_binary_prints() {
    let snapshots = snapshots();
    assert!(snapshots.len() >= 5, "README.md lost its snapshot markers");
    for snapshot in snapshots {
        let arguments: Vec<&str> = snapshot.arguments.iter().map(String::as_str).collect();
        let output = parasim(&arguments);
        let text = if snapshot.stderr {
            assert_eq!(output.status.code(), Some(2), "{arguments:?} should be refused");
            String::from_utf8_lossy(&output.stderr).to_string()
        } else {
            assert!(output.status.success(), "{arguments:?}: {}", String::from_utf8_lossy(&output.stderr));
            String::from_utf8_lossy(&output.stdout).to_string()
        };
        let mut actual: Vec<String> = text.trim_end().lines().filter_map(deterministic).collect();
        if let Some(head) = snapshot.head {
            actual.truncate(head);
        }
        if let Some(tail) = snapshot.tail {
            actual = actual.split_off(actual.len().saturating_sub(tail));
        }
        let expected: Vec<String> = snapshot.expected.iter().filter_map(|l| deterministic(l)).collect();
        assert_eq!(
            actual,
            expected,
            "README.md's output of `parasim {}` drifted from the binary",
            arguments.join(" ")
        );
    }
}

/// The README's table of scenario keys lists every `[compute]` knob of the model's table, so a
/// new knob cannot go undocumented there.
#[test]
fn readme_lists_every_compute_key() {
    let readme = include_str!("../../README.md");
    for knob in workloads::compute::knobs::KNOBS {
        let key = knob.key;
        assert!(readme.contains(&format!("| `compute.{key}` |")), "README's key table lacks compute.{key}");
    }
}
