//! End-to-end tests of the `parasim` binary: the quickstart runs, its JSON is deterministic,
//! and bad scenarios give a clear error with exit code 2.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod bench;
mod binary;
mod budgets;
mod calibrate;
mod chakra;
mod collective;
mod compare;
mod daso;
mod errors;
mod failures;
mod framework;
mod hostile;
mod hyparflow;
mod json;
mod lora;
mod memory;
mod models;
mod muon;
mod network;
mod outputs;
mod pipes;
mod plan;
mod plot;
mod readme;
mod set;
mod strategies;
mod sweep;
mod traffic;
mod validate;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const QUICKSTART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/quickstart.toml");

fn parasim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_parasim")).args(args).output().expect("the parasim binary runs")
}

/// `parasim args`, which must succeed, its standard output parsed as JSON.
fn parasim_json(args: &[&str]) -> serde_json::Value {
    let output = parasim(args);
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON: {e}"))
}

/// Writes `text` to a scratch scenario file named `name` and returns its path.
fn scenario_file(name: &str, text: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    fs_err::write(&path, text).unwrap();
    path
}

/// The quickstart with `from` replaced by `to` (which must occur).
fn quickstart_with(from: &str, to: &str) -> String {
    let text = fs_err::read_to_string(QUICKSTART).unwrap();
    assert!(text.contains(from), "the quickstart no longer contains {from:?}");
    text.replacen(from, to, 1)
}

#[test]
fn quickstart_json_is_byte_identical_across_runs() {
    let first = parasim(&["run", QUICKSTART, "--json"]);
    let second = parasim(&["run", QUICKSTART, "--json"]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert!(!first.stdout.is_empty());
    assert_eq!(first.stdout, second.stdout);
    let json: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(json["cluster"]["gpus"], 64);
    assert_eq!(json["model"]["parameters"], 25_557_032);
    let iteration = json["iteration_time_s"].as_f64().unwrap();
    assert!(iteration > 0.0);
    let b = &json["breakdown"];
    let parts = b["compute_s"].as_f64().unwrap()
        + b["exposed_communication_s"].as_f64().unwrap()
        + b["idle_s"].as_f64().unwrap();
    assert!(
        (parts - iteration).abs() <= 1e-9 * iteration.max(1.0),
        "breakdown {parts} s vs iteration {iteration} s"
    );
    let throughput = json["samples_per_second"].as_f64().unwrap();
    assert!((throughput * iteration - 64.0 * 64.0).abs() < 1e-6 * throughput);
}

#[test]
fn the_built_in_quickstart_is_the_file_in_scenarios() {
    let from_file = parasim(&["run", QUICKSTART, "--json"]);
    let built_in = parasim(&["run", "--json"]);
    assert!(built_in.status.success());
    let mut a: serde_json::Value = serde_json::from_slice(&from_file.stdout).unwrap();
    let mut b: serde_json::Value = serde_json::from_slice(&built_in.stdout).unwrap();
    a["scenario"] = serde_json::Value::Null;
    b["scenario"] = serde_json::Value::Null;
    assert_eq!(a, b);
}

#[test]
fn human_report_has_the_headline_numbers() {
    let output = parasim(&["run", QUICKSTART]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    for needle in
        ["iteration", "samples/s", "TFLOP/s per GPU", "MFU", "exposed communication", "idle", "events/s"]
    {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

/// Runs a bad scenario: exit code 2, no panic, and stderr names the file and every `needles`.
fn assert_rejected(name: &str, text: &str, needles: &[&str]) {
    let path = scenario_file(name, text);
    let output = parasim(&["run", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{name}: {stderr}");
    assert!(!stderr.contains("panicked"), "{name} panicked: {stderr}");
    assert!(stderr.contains(name), "{name}: the error does not name the file: {stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{name}: expected {needle:?} in: {stderr}");
    }
    assert!(output.stdout.is_empty(), "{name}: nothing may be printed on stdout");
}

#[test]
fn an_unknown_key_is_named_with_the_valid_ones() {
    assert_rejected(
        "unknown-key.toml",
        &quickstart_with("nodes = 8", "nodes = 8\nnode-count = 3"),
        &["cluster.node-count", "line 6", "expected one of", "`nodes`"],
    );
}

#[test]
fn a_bad_unit_is_named_with_the_valid_units() {
    assert_rejected(
        "bad-unit.toml",
        &quickstart_with("\"200 Gb/s\"", "\"200 Gbps\""),
        &["cluster.network.link-bandwidth", "unknown unit \"Gbps\"", "Gb/s"],
    );
}

#[test]
fn zero_gpus_are_refused() {
    assert_rejected(
        "zero-nodes.toml",
        &quickstart_with("nodes = 8", "nodes = 0"),
        &["cluster.nodes", "at least 1"],
    );
    assert_rejected(
        "zero-gpus.toml",
        &quickstart_with("gpus-per-node = 8", "gpus-per-node = 0"),
        &["cluster.gpus-per-node", "at least 1"],
    );
}

#[test]
fn an_unknown_device_lists_the_known_ones() {
    assert_rejected(
        "unknown-device.toml",
        &quickstart_with("a100-sxm4-80gb", "a200"),
        &["cluster.device", "\"a200\"", "a100-sxm4-80gb", "h100-sxm5-80gb"],
    );
}

#[test]
fn other_invalid_values_are_named() {
    assert_rejected(
        "negative.toml",
        &quickstart_with("batch-per-device = 64", "batch-per-device = -4"),
        &["workload.batch-per-device"],
    );
    assert_rejected(
        "bad-data.toml",
        &quickstart_with("data = 64", "data = 32"),
        &["parallelism.data", "64 GPUs"],
    );
    assert_rejected(
        "bad-model.toml",
        &quickstart_with("resnet50", "resnet51"),
        &["workload.model", "resnet50"],
    );
    assert_rejected(
        "bad-fidelity.toml",
        &quickstart_with("\"analytical\"", "\"exact\""),
        &["simulation.fidelity", "analytical", "flow"],
    );
    assert_rejected("syntax.toml", "[cluster\nnodes = 1\n", &["line 1"]);
}

#[test]
fn a_missing_file_is_an_error_not_a_panic() {
    let output = parasim(&["run", "no-such-scenario.toml"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no-such-scenario.toml"));
}

#[test]
fn a_five_line_scenario_runs_on_defaults() {
    let path = scenario_file(
        "minimal.toml",
        "[cluster]\nnodes = 2\ndevice = \"h100-sxm5-80gb\"\n[workload]\nmodel = \"resnet18\"\n",
    );
    let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    // Defaults: 8 GPUs per node behind an NVSwitch, one 200 Gb/s NIC per GPU.
    assert_eq!(json["cluster"]["gpus"], 16);
}

/// The compute model's communication slowdowns reach the simulation: DDP's bucket allreduces
/// overlap the backward, so its kernels slow while they run; at 1 (the default) nothing
/// changes.
#[test]
fn kernels_beside_communication_run_at_the_slowed_rate_in_the_simulation() {
    let run_with = |slowdown: &str| -> serde_json::Value {
        let text = quickstart_with(
            "[workload]",
            &format!(
                "[compute]\ncommunication-memory-slowdown = {slowdown}\ncommunication-compute-slowdown = \
                 {slowdown}\ncommunication-launch-slowdown = {slowdown}\n\n[workload]"
            ),
        );
        let dir = std::env::temp_dir().join(format!("parasim-slowdown-{}-{slowdown}", std::process::id()));
        fs_err::create_dir_all(&dir).unwrap();
        let path = dir.join("quickstart.toml");
        fs_err::write(&path, text).unwrap();
        let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let plain = parasim(&["run", QUICKSTART, "--json"]);
    let plain: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    let time = |json: &serde_json::Value| json["iteration_time_s"].as_f64().unwrap();
    let compute = |json: &serde_json::Value| json["breakdown"]["compute_s"].as_f64().unwrap();
    assert_eq!(time(&run_with("1.0")), time(&plain));
    let (two, four) = (run_with("2.0"), run_with("4.0"));
    assert!(compute(&plain) < compute(&two) && compute(&two) < compute(&four));
    assert!(time(&plain) < time(&two) && time(&two) < time(&four));
    // Only the kernels beside an allreduce slow down: far less than the slowdown itself.
    assert!(time(&four) < 1.2 * time(&plain), "{} s vs {} s", time(&four), time(&plain));
}

/// `[compute] fusion = "none"` is the default to the byte; `"bn-relu"` keeps the model and its
/// FLOPs and only takes work away (ResNet-50: fewer bytes, so a shorter iteration).
#[test]
fn fusion_none_is_the_default_and_bn_relu_only_removes_traffic() {
    let run = |name: &str, text: &str| -> serde_json::Value {
        let path = scenario_file(name, text);
        let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
        assert!(output.status.success(), "{name}: {}", String::from_utf8_lossy(&output.stderr));
        let mut json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        json["scenario"] = serde_json::Value::Null;
        json
    };
    let text = fs_err::read_to_string(QUICKSTART).unwrap();
    let plain = run("fusion-default.toml", &text);
    let none = run("fusion-none.toml", &format!("{text}\n[compute]\nfusion = \"none\"\n"));
    assert_eq!(plain, none);
    let fused = run("fusion-bn-relu.toml", &format!("{text}\n[compute]\nfusion = \"bn-relu\"\n"));
    for key in ["parameters", "macs_per_sample"] {
        assert_eq!(fused["model"][key], plain["model"][key], "{key}");
    }
    assert_eq!(fused["model"]["compute_model"], "defaults (docs/compute-model.md), fusion bn-relu");
    let iteration = |json: &serde_json::Value| json["iteration_time_s"].as_f64().unwrap();
    assert!(iteration(&fused) < iteration(&plain), "{} vs {}", iteration(&fused), iteration(&plain));
}

/// `[parallelism] batch-norm-group = 1` is the default to the byte; 2 lengthens the step (every
/// batch norm waits for its peer's sums, docs/strategies.md "Group batch norm"); a group that
/// does not fit in a server, or on a split other than plain data parallelism, is refused with
/// the key and what would be valid.
#[test]
fn batch_norm_group_one_is_the_default_and_bad_groups_are_refused() {
    let run = |name: &str, text: &str| -> std::process::Output {
        let path = scenario_file(name, text);
        parasim(&["run", path.to_str().unwrap(), "--json"])
    };
    let json = |output: std::process::Output| -> serde_json::Value {
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let mut json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        json["scenario"] = serde_json::Value::Null;
        json
    };
    let plain = json(run("bn-group-default.toml", &quickstart_with("data = 64\n", "data = 64\n")));
    let one =
        json(run("bn-group-1.toml", &quickstart_with("data = 64\n", "data = 64\nbatch-norm-group = 1\n")));
    assert_eq!(plain, one);
    let two =
        json(run("bn-group-2.toml", &quickstart_with("data = 64\n", "data = 64\nbatch-norm-group = 2\n")));
    let iteration = |json: &serde_json::Value| json["iteration_time_s"].as_f64().unwrap();
    assert!(iteration(&two) > iteration(&plain), "{} vs {}", iteration(&two), iteration(&plain));
    let refused = |name: &str, text: String, expected: &str| {
        let output = run(name, &text);
        assert_eq!(output.status.code(), Some(2), "{name}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("key `parallelism.batch-norm-group`"), "{name}: {stderr}");
        assert!(stderr.contains(expected), "{name}: {stderr}");
    };
    let text = fs_err::read_to_string(QUICKSTART).unwrap();
    let four_per_node = text
        .replacen("nodes = 8\n", "nodes = 16\n", 1)
        .replacen("gpus-per-node = 8\n", "gpus-per-node = 4\n", 1)
        .replacen("data = 64\n", "data = 64\nbatch-norm-group = 8\n", 1);
    refused("bn-group-8-of-4.toml", four_per_node, "does not divide cluster.gpus-per-node = 4");
    let zero = quickstart_with("data = 64\n", "data = 64\nbatch-norm-group = 0\n");
    refused("bn-group-0.toml", zero, "is 0; valid: 1 (no group, the default), 2, 4 or 8");
    let tensor = text.replacen("batch-per-device = 64", "global-batch = 2048\nmicro-batch = 64", 1).replacen(
        "data = 64\n",
        "data = 32\ntensor = 2\nbatch-norm-group = 2\n",
        1,
    );
    refused("bn-group-tensor.toml", tensor, "plain data parallelism only");
}

/// Outputs that describe one device's kernels are refused, by name, on a cluster of several
/// device types instead of writing the first group's kernels for every rank.
#[test]
fn one_device_outputs_are_refused_on_mixed_devices() {
    let dir = std::env::temp_dir().join(format!("parasim-mixed-outputs-{}", std::process::id()));
    let csv = dir.join("layers.csv");
    let mixed = "scenarios/mixed/half-a100-half-h100.toml";
    for (args, flag) in [
        (vec!["run", mixed, "--csv", csv.to_str().unwrap()], "--csv"),
        (vec!["export", "--chakra", dir.to_str().unwrap(), mixed], "export --chakra"),
    ] {
        let output = parasim(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(flag) && stderr.contains("several device types"), "{stderr}");
        assert!(!csv.exists(), "nothing written");
    }
}
