//! A closed standard output or standard error (`parasim sweep S.toml 2>&1 | head`) changes no
//! exit status and panics nothing (ripgrep's convention): a closed standard output is success,
//! exit 0; a closed standard error loses the messages and keeps the status (2 for an error).
//!
//! Each test connects one stream to a pipe whose read end is dropped right after the spawn,
//! long before the command writes: every write to it fails with a broken pipe.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::QUICKSTART;
use crate::sweep::{scratch, small_sweep};

#[derive(Clone, Copy, Debug)]
enum Closed {
    Stdout,
    Stderr,
}

/// The exit code of `parasim args` with `closed` connected to a closed pipe, and what it
/// wrote on the other stream.
fn closed(closed: Closed, args: &[&str]) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_parasim"));
    command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    match closed {
        Closed::Stdout => drop(child.stdout.take()),
        Closed::Stderr => drop(child.stderr.take()),
    }
    let output = child.wait_with_output().unwrap();
    let other = match closed {
        Closed::Stdout => &output.stderr,
        Closed::Stderr => &output.stdout,
    };
    (output.status.code(), String::from_utf8_lossy(other).into_owned())
}

/// Runs `args` with each stream closed in turn; both must exit `code`, without a panic.
fn exits_with(code: i32, args: &[&str]) {
    let mut wrong = Vec::new();
    for stream in [Closed::Stderr, Closed::Stdout] {
        let (status, other) = closed(stream, args);
        if status != Some(code) || other.contains("panicked") {
            wrong.push(format!("{stream:?} closed: exit {status:?}, expected {code}\n{other}"));
        }
    }
    assert!(wrong.is_empty(), "parasim {}:\n{}", args.join(" "), wrong.join("\n"));
}

#[test]
fn run_json_exits_0_with_either_stream_closed() {
    exits_with(0, &["run", QUICKSTART, "--json"]);
    // The report still reaches an open standard output when standard error is closed.
    let (_, stdout) = closed(Closed::Stderr, &["run", QUICKSTART, "--json"]);
    assert!(stdout.contains("\"scenario\""), "{stdout}");
}

#[test]
fn validate_exits_0_with_either_stream_closed() {
    exits_with(0, &["validate", "--suite", "korthikanti-table4"]);
}

#[test]
fn plan_exits_0_with_either_stream_closed() {
    // The streams are the subject, not the search: tensor degree fixed, a search of seconds
    // (debug build) instead of one of the whole space (tests/it/plan.rs searches that).
    let cluster = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/megatron-sc21/gpt-1.7b.toml");
    let fixed = ["--set", "workload.recompute=selective", "--set", "parallelism.tensor=2"];
    exits_with(0, &[&["plan", "--cluster", cluster, "--top", "2"][..], &fixed].concat());
    // A refusal keeps its 2 (a model that fits nowhere, as in plan.rs, in 42 configurations).
    exits_with(
        2,
        &[
            "plan",
            "--cluster",
            QUICKSTART,
            "--model",
            "megatron-1t",
            "--global-batch",
            "64",
            "--gpus",
            "8",
            "--set",
            "parallelism.tensor=8",
        ],
    );
}

#[test]
fn sweep_exits_0_with_either_stream_closed() {
    let dir = scratch("pipes");
    let sweep = small_sweep(&dir);
    let sweep = sweep.to_str().unwrap();
    exits_with(0, &["sweep", sweep]);
    exits_with(0, &["sweep", sweep, "--count"]);
    let out = dir.join("rows.csv");
    exits_with(0, &["sweep", sweep, "-o", out.to_str().unwrap()]);
}

#[test]
fn an_error_exits_2_with_either_stream_closed() {
    let missing = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pipes-no-such-scenario.toml");
    let missing = missing.to_str().unwrap();
    exits_with(2, &["run", missing]);
    exits_with(2, &["run", missing, "--json"]);
    exits_with(2, &["plan", "--cluster", missing]);
    exits_with(2, &["validate", "--suite", "no-such-suite"]);
}
