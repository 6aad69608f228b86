//! `workload.framework`: a scenario with only the published configuration and the framework's
//! name runs exactly as the same scenario with the framework's settings written out by hand,
//! and the report says what the framework implied.

use serde_json::Value;

/// `run --json` of a scenario file, without the file's path (the two files differ in it).
fn run_json(path: &std::path::Path) -> Value {
    let output = crate::parasim(&["run", path.to_str().unwrap(), "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let mut json: Value = serde_json::from_slice(&output.stdout).unwrap();
    json.as_object_mut().unwrap().remove("scenario");
    json
}

#[test]
fn a_framework_gives_the_same_run_as_its_settings_written_out() {
    // A Megatron-LM GPT with data and pipeline parallelism (every implied setting has an effect).
    let published = r#"
[cluster]
nodes = 2
gpus-per-node = 8
device = "a100-sxm4-80gb"

[workload]
framework = "megatron-lm"
model = "megatron-1.7b"
global-batch = 64
micro-batch = 4
precision = "fp16"
recompute = "full"

[parallelism]
pipeline = 2
"#;
    let by_hand = published.replace("framework = \"megatron-lm\"\n", "optimizer = \"adam\"\n")
        + r#"bucket-size = "1 TiB"
first-bucket-size = "1 TiB"
pipeline-host-sync = "every-exchange"
pipeline-scatter-gather = true
gradient-buffers = "in-place"

[compute]
optimizer-passes = "megatron"
gradient-accumulation = "add"
"#;
    let framework = run_json(&crate::scenario_file("framework-megatron.toml", published));
    let mut written = run_json(&crate::scenario_file("framework-megatron-by-hand.toml", &by_hand));
    let used = framework["framework"].clone();
    assert_eq!(used["name"], "megatron-lm");
    let implied: Vec<&str> =
        used["implied"].as_array().unwrap().iter().map(|s| s["key"].as_str().unwrap()).collect();
    assert_eq!(
        implied,
        [
            "workload.optimizer",
            "compute.optimizer-passes",
            "compute.gradient-accumulation",
            "parallelism.bucket-size",
            "parallelism.first-bucket-size",
            "parallelism.pipeline-host-sync",
            "parallelism.pipeline-scatter-gather",
            "parallelism.gradient-buffers"
        ]
    );
    assert!(written.get("framework").is_none());
    // The compute model's description counts the [compute] keys the file sets.
    let mut framework = framework;
    framework.as_object_mut().unwrap().remove("framework");
    for json in [&mut framework, &mut written] {
        json["model"].as_object_mut().unwrap().remove("compute_model");
    }
    assert_eq!(framework, written);
}

#[test]
fn the_text_report_names_the_framework_and_what_it_implied() {
    let text = crate::quickstart_with("optimizer = \"sgd-momentum\"", "framework = \"horovod-pytorch\"");
    let path = crate::scenario_file("framework-horovod.toml", &text);
    let output = crate::parasim(&["run", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report = String::from_utf8(output.stdout).unwrap();
    assert!(report.contains("framework     horovod-pytorch (Horovod over PyTorch"), "{report}");
    assert!(report.contains("implies compute.gradient-accumulation = \"add\""), "{report}");
    // The quickstart writes PyTorch DDP's buckets itself: they stay.
    assert!(
        report.contains("parallelism.bucket-size: the scenario's own value (the framework's: \"64 MiB\")"),
        "{report}"
    );
}
