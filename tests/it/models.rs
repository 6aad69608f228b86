//! `parasim models`, `parasim inspect` and model files named by scenarios.

use crate::{assert_rejected, parasim, quickstart_with, scenario_file};

#[test]
fn models_lists_the_zoo() {
    let output = parasim(&["models"]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    for needle in
        ["resnet50", "25.56 M", "gpt3-175b", "174.60 B", "llama2-7b", "mixtral-8x7b", "cosmoflow-512"]
    {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn inspect_prints_layers_and_totals() {
    let output = parasim(&["inspect", "resnet50", "--batch", "64"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    for needle in ["conv1", "64x112x112", "layer4.2.conv3", "fc", "25,557,032", "4.09 GMAC per sample"] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let unknown = parasim(&["inspect", "resnet51"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("resnet50"));
}

const TINY_MLP: &str = "[model]\ninput = [784]\n\n[[layers]]\nname = \"fc1\"\nkind = \"linear\"\nout-features = 512\n\n\
[[layers]]\nname = \"act\"\nkind = \"relu\"\n\n[[layers]]\nname = \"fc2\"\nkind = \"linear\"\nout-features = 10\n";

#[test]
fn a_scenario_can_name_a_model_file_next_to_it() {
    scenario_file("tiny-mlp.toml", TINY_MLP);
    let path = scenario_file("with-model-file.toml", &quickstart_with("\"resnet50\"", "\"tiny-mlp.toml\""));
    let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["model"]["parameters"], 784 * 512 + 512 + 512 * 10 + 10);
    let inspect = parasim(&["inspect", path.with_file_name("tiny-mlp.toml").to_str().unwrap()]);
    assert!(inspect.status.success(), "{}", String::from_utf8_lossy(&inspect.stderr));
}

#[test]
fn a_bad_model_file_names_the_file_and_the_key() {
    scenario_file("bad-mlp.toml", &TINY_MLP.replace("out-features = 512", "out-feature = 512"));
    assert_rejected(
        "with-bad-model.toml",
        &quickstart_with("\"resnet50\"", "\"bad-mlp.toml\""),
        &["workload.model", "bad-mlp.toml", "out-feature"],
    );
    assert_rejected(
        "with-missing-model.toml",
        &quickstart_with("\"resnet50\"", "\"models/none.toml\""),
        &["workload.model", "none.toml"],
    );
}
