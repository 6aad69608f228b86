//! `parasim run --set KEY=VALUE`: the scenario changed before validation, as editing the file
//! would change it; bad keys and values refused with the key named; and a sweep's
//! configuration is the same scenario as `run --set` of its values (one override path).

use crate::{QUICKSTART, parasim, quickstart_with, scenario_file};

/// `run ARGS --json` as JSON, without the scenario's path (it names the file).
fn run_json(args: &[&str]) -> serde_json::Value {
    let output = parasim(&[&["run"], args, &["--json"]].concat());
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    let mut json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    json["scenario"] = serde_json::Value::Null;
    json
}

#[test]
fn set_changes_the_result_as_the_equivalent_edited_file_does() {
    let edited = quickstart_with("nodes = 8", "nodes = 4").replacen("data = 64", "data = 32", 1);
    let edited = scenario_file("set-edited.toml", &edited);
    let expected = run_json(&[edited.to_str().unwrap()]);
    let set = ["--set", "parallelism.data=32", "--set", "cluster.nodes=4"];
    assert_eq!(run_json(&[&[QUICKSTART][..], &set].concat()), expected);
    // The built-in quickstart takes them too.
    assert_eq!(run_json(&set), expected);
    assert_ne!(run_json(&[QUICKSTART]), expected);
    // A unit string and a quoted string are strings; booleans are booleans.
    let edited = quickstart_with("link-bandwidth = \"200 Gb/s\"", "link-bandwidth = \"100 Gb/s\"")
        .replacen("optimizer = \"sgd-momentum\"", "optimizer = \"adam\"", 1)
        .replacen("iterations = 1", "iterations = 2\nfold-symmetric-ranks = true", 1);
    let edited = scenario_file("set-edited-strings.toml", &edited);
    let set = [
        QUICKSTART,
        "--set",
        "cluster.network.link-bandwidth=100 Gb/s",
        "--set",
        "workload.optimizer=\"adam\"",
        "--set",
        "simulation.iterations=2",
        "--set",
        "simulation.fold-symmetric-ranks=true",
    ];
    assert_eq!(run_json(&set), run_json(&[edited.to_str().unwrap()]));
}

#[test]
fn set_is_repeatable_and_the_last_value_of_a_key_wins() {
    let once = run_json(&[QUICKSTART, "--set", "cluster.nodes=2", "--set", "parallelism.data=16"]);
    let again = run_json(&[
        QUICKSTART,
        "--set",
        "cluster.nodes=4",
        "--set",
        "parallelism.data=16",
        "--set",
        "cluster.nodes=2",
    ]);
    assert_eq!(once, again);
    assert_eq!(once["cluster"]["gpus"], 16);
}

#[test]
fn an_unknown_key_and_a_bad_value_are_refused_naming_the_key() {
    for (set, wanted) in [
        (
            "parallelism.dta=32",
            &["--set parallelism.dta=32", "`parallelism.dta`", "unknown field `dta`", "`data`"][..],
        ),
        ("cluster.gpu=2", &["`cluster.gpu`", "`gpus-per-node`"]),
        ("parallelism.data=many", &["`parallelism.data`", "invalid type: string \"many\", expected u32"]),
        ("parallelism.data=3", &["`parallelism.data`", "the cluster has 64 GPUs"]),
        ("cluster.nodes", &["--set \"cluster.nodes\": give KEY=VALUE"]),
        ("workload.model.name=x", &["--set workload.model.name: `model` is not a table"]),
    ] {
        let output = parasim(&["run", QUICKSTART, "--set", set]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{set}: {stderr}");
        for needle in wanted {
            assert!(stderr.contains(needle), "{set}: no {needle:?} in {stderr}");
        }
    }
}

/// A sweep configuration is its base scenario with its values as overrides: the row's
/// metrics are `run --set` of the same keys'.
#[test]
fn a_sweep_row_is_run_with_its_values_set() {
    let sweep = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/sweeps/quickstart-scaling.toml");
    let output = parasim(&["sweep", sweep, "--columns", "iteration_time_s,engine.events"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    // Read with the one CSV reader (comment lines skipped).
    let records = scenario::csv_text::records(&text).unwrap();
    let mut lines = records.iter().map(|(_, cells)| cells.iter().map(String::as_str).collect::<Vec<&str>>());
    let header: Vec<&str> = lines.next().unwrap();
    assert_eq!(
        header[..4],
        ["index", "axis.cluster.nodes", "axis.cluster.network.link-bandwidth", "axis.parallelism.data"]
    );
    // Configuration 2: two nodes at 100 Gb/s (the last axis varies fastest).
    let row: Vec<&str> = lines.nth(2).unwrap();
    assert_eq!(row[..4], ["2", "2", "100 Gb/s", "16"]);
    let json = run_json(&[
        QUICKSTART,
        "--set",
        "cluster.nodes=2",
        "--set",
        "cluster.network.link-bandwidth=100 Gb/s",
        "--set",
        "parallelism.data=16",
    ]);
    let column = |name: &str| row[header.iter().position(|c| *c == name).unwrap()];
    assert_eq!(column("iteration_time_s"), json["iteration_time_s"].to_string());
    assert_eq!(column("engine.events"), json["engine"]["events"].to_string());
}
