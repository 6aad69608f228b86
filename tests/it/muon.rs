//! Muon from the command line: the shipped scenario runs and says how Muon runs, the
//! round-robin spread is faster than every rank orthogonalising every matrix, Muon's step costs
//! more than AdamW's and its state less, and bad `[workload.muon]` tables are refused naming
//! the key.

use super::parasim;

const MUON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/optimizers/gpt2-124m-muon-8xh100.toml");

use super::parasim_json as json;

#[test]
fn the_muon_scenario_reports_its_settings_and_the_spread_pays() {
    let text = parasim(&["run", MUON]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("muon (5 Newton-Schulz steps, three-wide iteration, round-robin)"), "{text}");
    let spread = json(&["run", MUON, "--json"]);
    assert_eq!(spread["model"]["optimizer"], "muon");
    assert_eq!(spread["model"]["muon"]["distribution"], "round-robin");
    // `--set` reaches the table: every rank orthogonalising all 72 matrices takes longer than
    // each orthogonalising 9 and exchanging the updates.
    let replicated = json(&["run", MUON, "--json", "--set", "workload.muon.distribution=\"replicated\""]);
    let time = |value: &serde_json::Value| value["iteration_time_s"].as_f64().unwrap();
    assert!(time(&spread) < time(&replicated), "{} s against {} s", time(&spread), time(&replicated));
    // The same job with AdamW: a shorter step, two moments per parameter instead of one.
    let path = super::scenario_file(
        "gpt2-adam.toml",
        &fs_err::read_to_string(MUON)
            .unwrap()
            .replace("optimizer = \"muon\"", "optimizer = \"adam\"")
            .replace(
                "[workload.muon]\nsteps = 5\niteration = \"three-wide\"\ndistribution = \"round-robin\"\n",
                "",
            )
            .replace("../../data/models/", concat!(env!("CARGO_MANIFEST_DIR"), "/data/models/")),
    );
    let adam = json(&["run", path.to_str().unwrap(), "--json"]);
    assert!(adam["model"].get("muon").is_none());
    assert!(time(&adam) < time(&spread));
    let state = |value: &serde_json::Value| value["memory"]["optimizer"].as_f64().unwrap();
    assert!(state(&spread) < state(&adam), "{} against {}", state(&spread), state(&adam));
}

#[test]
fn bad_muon_tables_name_the_key_and_what_is_valid() {
    let cases: [(&[&str], &str); 3] = [
        (&["--set", "workload.muon.steps=0"], "workload.muon.steps"),
        (&["--set", "workload.muon.iteration=\"cubic\""], "valid: \"square-first\", \"three-wide\""),
        (&["--set", "parallelism.expert=2"], "distribution = \"replicated\""),
    ];
    for (set, expected) in cases {
        let mut args = vec!["run", MUON];
        args.extend_from_slice(set);
        let output = parasim(&args);
        assert_eq!(output.status.code(), Some(2), "{set:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{set:?}: {stderr}");
    }
}
