//! The memory section of `parasim run` and the refusal of configurations that do not fit.

use crate::{QUICKSTART, assert_rejected, parasim, quickstart_with, scenario_file};

#[test]
fn the_quickstart_fits_and_reports_its_memory() {
    let output = parasim(&["run", QUICKSTART]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    for needle in [
        "memory ",
        "memory        per GPU needs ",
        " of 85.90 GB (80 GiB): ",
        "to spare",
        "recomputation none",
        "weights",
        "gradients",
        "optimizer state",
        "activations",
        "temporary buffers",
        "communication buffers",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }

    let output = parasim(&["run", QUICKSTART, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let memory = &json["memory"];
    let part = |key: &str| memory[key].as_u64().unwrap_or_else(|| panic!("memory.{key} in {memory}"));
    let parts = ["weights", "gradients", "optimizer", "activations", "temporary", "communication"];
    assert_eq!(parts.iter().map(|key| part(key)).sum::<u64>(), part("total"));
    assert_eq!(part("capacity"), 80 << 30);
    assert!(part("total") < part("capacity"));
    assert_eq!(memory["spare"].as_i64().unwrap(), (part("capacity") - part("total")) as i64);
    let fraction = memory["spare_fraction"].as_f64().unwrap();
    assert!((fraction - (part("capacity") - part("total")) as f64 / part("capacity") as f64).abs() < 1e-12);
    // ResNet-50 in fp16 with fp32 gradients and SGD momentum: 2 + 4 + (4 + 4) bytes per parameter.
    assert_eq!(part("weights"), 2 * 25_557_032);
    assert_eq!(part("optimizer"), 8 * 25_557_032);
    assert_eq!(memory["recompute"], "none");
}

/// Llama-2-7B, data parallel with Adam on 80 GB A100s: 6.74 B parameters x 16 bytes of bf16
/// weights and gradients, fp32 master weights and two moments = 108 GB before any activation.
const LLAMA: &str = "[cluster]\nnodes = 1\ngpus-per-node = 8\ndevice = \"a100-sxm4-80gb\"\n\
    [workload]\nmodel = \"llama2-7b\"\nbatch-per-device = 4\nprecision = \"bf16\"\n\
    gradient-precision = \"bf16\"\noptimizer = \"adam\"\n";

#[test]
fn llama2_7b_with_adam_does_not_fit_an_a100_80gb() {
    assert_rejected(
        "llama2-7b-adam.toml",
        LLAMA,
        &[
            "llama2-7b",
            "does not fit in memory",
            "A100-SXM4-80GB has 85.90 GB (80 GiB)",
            "over by ",
            "weights                    13.48 GB",
            "gradients                  13.48 GB",
            "optimizer state            80.86 GB",
            "activations",
            "communication buffers",
            "total",
        ],
    );
}

/// The refusal says how to get out: for Llama's model state (108 GB against 86 GB), ZeRO over
/// the 8 replicas and offloading first, `plan` last; for the quickstart at 4096 images per GPU
/// (206 GB of activations, 0.36 GB of state), recomputation and a smaller micro-batch, and no
/// ZeRO, which would shrink the 0.36 GB.
#[test]
fn the_out_of_memory_error_suggests_ways_out() {
    let path = scenario_file("llama2-7b-ways-out.toml", LLAMA);
    let output = parasim(&["run", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let error = String::from_utf8_lossy(&output.stderr);
    let ways = error.split("ways out (").nth(1).unwrap_or_else(|| panic!("no ways out: {error}"));
    assert!(ways.starts_with("model state "), "{ways}");
    let zero = ways.find("parallelism.zero = 1, 2 or 3").unwrap_or_else(|| panic!("{ways}"));
    assert!(ways.contains("8 data-parallel replicas"), "{ways}");
    let plan = ways.find("parasim plan --cluster").unwrap_or_else(|| panic!("{ways}"));
    assert!(zero < plan);

    let big = quickstart_with("batch-per-device = 64", "batch-per-device = 4096");
    let path = scenario_file("quickstart-ways-out.toml", &big);
    let output = parasim(&["run", path.to_str().unwrap()]);
    let error = String::from_utf8_lossy(&output.stderr);
    let ways = error.split("ways out (").nth(1).unwrap_or_else(|| panic!("no ways out: {error}"));
    assert!(ways.starts_with("activations "), "{ways}");
    assert!(ways.contains("workload.recompute = \"full\"") && ways.contains("smaller micro-batch"), "{ways}");
    assert!(!ways.contains("parallelism.zero"), "ZeRO shrinks too little here: {ways}");
}

#[test]
fn recomputation_is_a_workload_key() {
    // Full recomputation shrinks the activations of the quickstart, and costs time.
    let run = |name: &str, text: &str| {
        let path = scenario_file(name, text);
        let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()
    };
    let kept =
        run("kept.toml", &quickstart_with("optimizer = \"sgd-momentum\"", "optimizer = \"sgd-momentum\""));
    let full = run(
        "recomputed.toml",
        &quickstart_with(
            "optimizer = \"sgd-momentum\"",
            "optimizer = \"sgd-momentum\"\nrecompute = \"full\"",
        ),
    );
    assert_eq!(full["memory"]["recompute"], "full");
    let activations = |json: &serde_json::Value| json["memory"]["activations"].as_u64().unwrap();
    assert!(activations(&full) < activations(&kept) / 2);
    let time = |json: &serde_json::Value| json["iteration_time_s"].as_f64().unwrap();
    assert!(time(&full) > time(&kept));
    assert_rejected(
        "bad-recompute.toml",
        &quickstart_with(
            "optimizer = \"sgd-momentum\"",
            "optimizer = \"sgd-momentum\"\nrecompute = \"some\"",
        ),
        &["workload.recompute", "none, selective, full"],
    );
}

/// Published runs that really ran on 80 GB cards must fit, with their margin printed: NeMo's
/// GPT-3 175B at micro-batch 2 on 512 H100 in FP8 (tensor 4, pipeline 8, virtual 6, selective
/// recomputation, sequence parallelism, distributed optimizer), Megatron-LM SC'21's GPT 3.6B
/// (tensor 2, full recomputation, PyTorch DDP) and the 1T model (tensor 8, pipeline 64), and GPT-3
/// 175B with tensor 8 and pipeline 16 (interleaved, full recomputation).
#[test]
fn published_runs_fit_with_their_margin() {
    for scenario in [
        "scenarios/nemo/gpt3-175b-512-h100-fp8.toml",
        "scenarios/megatron-sc21/gpt-3.6b.toml",
        "scenarios/megatron-sc21/gpt-1t.toml",
        "scenarios/gpt3-175b-1024.toml",
    ] {
        let path = format!("{}/{scenario}", env!("CARGO_MANIFEST_DIR"));
        let output = parasim(&["run", &path, "--set", "simulation.fidelity=analytical"]);
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{scenario}: {}", String::from_utf8_lossy(&output.stderr));
        assert!(text.contains("to spare; recomputation"), "{scenario}:\n{text}");
    }
}
