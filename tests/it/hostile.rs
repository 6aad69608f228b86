//! The standing catalog of hostile inputs (issue 38): `tests/hostile/cases.toml` lists, for
//! every command and every input format, inputs a hostile or careless user could give, each
//! with the exit code and a fragment of the message it must get. Each case runs the binary in
//! its own scratch folder inside a 2 GiB address space (`ulimit -v`, so an allocation that
//! runs away aborts instead of swapping) and under a time limit (a case still running then is
//! killed and counted as a hang).
//!
//! `cargo test --test it hostile:: -- --nocapture` prints the counts: inputs tried, clean
//! refusals, valid runs, panics, hangs, out-of-memory aborts, nonsense accepted and wrong
//! messages. Any case that is not a clean refusal or a valid run as expected fails the test,
//! except those marked `defect = "..."`: known defects outside this catalog's fixes, counted
//! and listed, so the counts stay honest until they are fixed (a marked case that passes
//! fails the test: remove its mark).
//!
//! A case (`[[case]]`): `name`, `format` (the input format it attacks), `args` (run in the
//! scratch folder; `{root}` is the checkout, `{shared}` the shared data folder), `exit`,
//! `message` (a fragment of standard error, or of standard output for `exit = 0`),
//! optional `timeout` (seconds, default 30), `reported = true` for a refusal a command reports
//! in its output and goes on (`validate` lists a refused case as FAILED and exits 0), and
//! `files`: the inputs to write first, each
//! `name` plus `text`, `hex`, `copy` (a path under `{root}`/`{shared}`), or `base` with an
//! optional `replace = [FROM, TO]` and `append`; `repeat` repeats the text, `gzip` compresses
//! it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

const CASES: &str = include_str!("../hostile/cases.toml");
/// Commands the catalog must cover.
const COMMANDS: [&str; 19] = [
    "run",
    "export",
    "replay",
    "calibrate",
    "compare",
    "sweep",
    "sweep merge",
    "plan",
    "plot",
    "trace convert",
    "bench",
    "collective",
    "validate",
    "topo",
    "traffic",
    "models",
    "inspect",
    "completions",
    "man",
];
/// Input formats the catalog must cover.
const FORMATS: [&str; 11] = [
    "scenario",
    "execution-trace",
    "model",
    "sweep",
    "kineto",
    "pstrace",
    "nccl-tests",
    "csv",
    "suite",
    "sweep-output",
    "arguments",
];
/// The address space of each case, in KiB.
const MEMORY_KIB: u64 = 2 * 1024 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Catalog {
    case: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    format: String,
    args: Vec<String>,
    exit: i32,
    message: String,
    timeout: Option<u64>,
    defect: Option<String>,
    #[serde(default)]
    reported: bool,
    #[serde(default)]
    files: Vec<File>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: String,
    text: Option<String>,
    hex: Option<String>,
    copy: Option<String>,
    base: Option<String>,
    replace: Option<[String; 2]>,
    append: Option<String>,
    repeat: Option<usize>,
    #[serde(default)]
    gzip: bool,
}

/// What became of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    CleanRefusal,
    ValidRun,
    Panic,
    Hang,
    OutOfMemory,
    NonsenseAccepted,
    WrongMessage,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::CleanRefusal => "clean refusals",
            Outcome::ValidRun => "valid runs",
            Outcome::Panic => "panics",
            Outcome::Hang => "hangs",
            Outcome::OutOfMemory => "OOM aborts",
            Outcome::NonsenseAccepted => "nonsense accepted",
            Outcome::WrongMessage => "wrong exit or message",
        }
    }

    fn good(self) -> bool {
        matches!(self, Outcome::CleanRefusal | Outcome::ValidRun)
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn shared() -> PathBuf {
    root().join("../shared/data")
}

fn expand(text: &str) -> String {
    text.replace("{root}", &root().display().to_string()).replace("{shared}", &shared().display().to_string())
}

fn write_file(dir: &Path, file: &File) {
    let mut bytes: Vec<u8> = if let Some(text) = &file.text {
        expand(text).into_bytes()
    } else if let Some(hex) = &file.hex {
        (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect()
    } else if let Some(copy) = &file.copy {
        fs_err::read(expand(copy)).unwrap()
    } else if let Some(base) = &file.base {
        let mut text = fs_err::read_to_string(root().join(base)).unwrap();
        if let Some([from, to]) = &file.replace {
            assert!(text.contains(from.as_str()), "{}: {base} no longer contains {from:?}", file.name);
            text = text.replacen(from.as_str(), &expand(to), 1);
        }
        if let Some(append) = &file.append {
            text.push_str(&expand(append));
        }
        text.into_bytes()
    } else {
        Vec::new()
    };
    if let Some(times) = file.repeat {
        bytes = bytes.repeat(times);
    }
    if file.gzip {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(&bytes).unwrap();
        bytes = encoder.finish().unwrap();
    }
    let path = dir.join(&file.name);
    fs_err::create_dir_all(path.parent().unwrap()).unwrap();
    fs_err::write(path, bytes).unwrap();
}

/// Runs one case: its outcome and what it printed (for the failure report).
fn run_case(index: usize, case: &Case) -> (Outcome, String) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hostile").join(index.to_string());
    let _ = fs_err::remove_dir_all(&dir);
    fs_err::create_dir_all(&dir).unwrap();
    for file in &case.files {
        write_file(&dir, file);
    }
    let stdout_path = dir.join(".stdout");
    let stderr_path = dir.join(".stderr");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {MEMORY_KIB} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_parasim"))
        .args(case.args.iter().map(|a| expand(a)))
        .current_dir(&dir)
        .env("PARASIM_SHARED", shared())
        .stdin(Stdio::null())
        .stdout(fs_err::File::create(&stdout_path).unwrap().into_parts().0)
        .stderr(fs_err::File::create(&stderr_path).unwrap().into_parts().0)
        .spawn()
        .unwrap();
    let limit = Duration::from_secs(case.timeout.unwrap_or(30));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = String::from_utf8_lossy(&fs_err::read(&stdout_path).unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&fs_err::read(&stderr_path).unwrap()).into_owned();
    let _ = fs_err::remove_dir_all(&dir);
    let shown = format!("stderr: {}\nstdout: {:.300}", stderr.trim_end(), stdout);
    let Some(status) = status else { return (Outcome::Hang, shown) };
    let code = status.code();
    let outcome = if stderr.contains("panicked") || code == Some(101) {
        Outcome::Panic
    } else if stderr.contains("memory allocation of") || stderr.contains("out of memory") || code.is_none() {
        Outcome::OutOfMemory
    } else if code == Some(case.exit) {
        let text = if case.exit == 0 { format!("{stdout}{stderr}") } else { stderr.clone() };
        if !text.contains(&expand(&case.message)) {
            Outcome::WrongMessage
        } else if case.exit == 0 && !case.reported {
            Outcome::ValidRun
        } else {
            Outcome::CleanRefusal
        }
    } else if code == Some(0) {
        Outcome::NonsenseAccepted
    } else {
        Outcome::WrongMessage
    };
    (outcome, shown)
}

#[test]
fn the_hostile_catalog_is_refused_cleanly() {
    let catalog: Catalog = toml::from_str(CASES).expect("tests/hostile/cases.toml");
    let cases = &catalog.case;
    for command in COMMANDS {
        let words: Vec<&str> = command.split(' ').collect();
        assert!(
            cases.iter().any(|c| c
                .args
                .iter()
                .map(String::as_str)
                .take(words.len())
                .eq(words.iter().copied())),
            "the catalog has no case for `parasim {command}`"
        );
    }
    for format in FORMATS {
        assert!(cases.iter().any(|c| c.format == format), "the catalog has no case for the {format} format");
    }
    for case in cases {
        assert!(FORMATS.contains(&case.format.as_str()), "{}: unknown format {:?}", case.name, case.format);
    }
    let mut names = std::collections::BTreeSet::new();
    for case in cases {
        assert!(names.insert(&case.name), "two cases are named {:?}", case.name);
    }
    // Two workers: the cases are small, and CI machines have at least two cores.
    let results: Vec<(usize, Outcome, String)> = {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let collected = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    loop {
                        let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(case) = cases.get(index) else { break };
                        let (outcome, shown) = run_case(index, case);
                        collected.lock().unwrap().push((index, outcome, shown));
                    }
                });
            }
        });
        let mut results = collected.into_inner().unwrap();
        results.sort_by_key(|r| r.0);
        results
    };
    let mut counts: BTreeMap<Outcome, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut defects = Vec::new();
    for (index, outcome, shown) in &results {
        let case = &cases[*index];
        *counts.entry(*outcome).or_default() += 1;
        match (&case.defect, outcome.good()) {
            (None, true) => {}
            (None, false) => failures.push(format!(
                "{} ({:?}): parasim {}\n  expected exit {} with {:?}\n  {}",
                case.name,
                outcome,
                case.args.join(" "),
                case.exit,
                case.message,
                shown.replace('\n', "\n  ")
            )),
            (Some(defect), false) => defects.push(format!("{} ({outcome:?}): {defect}", case.name)),
            (Some(_), true) => {
                failures.push(format!("{}: marked as a defect but passes: remove the mark", case.name))
            }
        }
    }
    let count = |o: Outcome| counts.get(&o).copied().unwrap_or(0);
    let summary: Vec<String> = [
        Outcome::CleanRefusal,
        Outcome::ValidRun,
        Outcome::Panic,
        Outcome::Hang,
        Outcome::OutOfMemory,
        Outcome::NonsenseAccepted,
        Outcome::WrongMessage,
    ]
    .iter()
    .map(|&o| format!("{} {}", count(o), o.label()))
    .collect();
    println!(
        "hostile catalog: {} inputs tried over {} commands and {} formats: {}",
        results.len(),
        COMMANDS.len(),
        FORMATS.len(),
        summary.join(", ")
    );
    for defect in &defects {
        println!("known defect: {defect}");
    }
    assert!(results.len() >= 150, "the catalog shrank to {} cases", results.len());
    assert!(failures.is_empty(), "{} hostile cases failed:\n{}", failures.len(), failures.join("\n"));
}
