//! LoRA fine-tuning from the command line: the shipped scenario runs, reports its trained and
//! frozen parameters, is faster than the same job fully fine-tuned (no weight gradients), and
//! bad `[workload.lora]` tables are refused naming the key.

use super::parasim;

const LORA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/fine-tuning/llama2-7b-lora-dgx-h100.toml");

use super::parasim_json as json;

#[test]
fn the_lora_scenario_reports_trained_and_frozen_parameters_and_beats_full_fine_tuning() {
    let lora = json(&["run", LORA, "--json"]);
    let model = &lora["model"];
    // 32 layers x rank 32 x (4096 + 3 x 4096) trained; Llama 2 7B's 6,738,415,616 frozen.
    assert_eq!(model["parameters"], 16_777_216);
    assert_eq!(model["frozen_parameters"], 6_738_415_616u64);
    let text = parasim(&["run", LORA]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("16.78 M parameters trained, 6.74 B frozen"), "{text}");
    // `--set` reaches the table: rank 16 trains half as many parameters.
    let half = json(&["run", LORA, "--json", "--set", "workload.lora.rank=16"]);
    assert_eq!(half["model"]["parameters"], 8_388_608);
    // The same job with every weight trained: slower (weight gradients, their all-reduce, the
    // optimizer over 6.7B parameters) and heavier.
    let path = super::scenario_file(
        "llama2-7b-full.toml",
        &fs_err::read_to_string(LORA)
            .unwrap()
            .replace("[workload.lora]\nrank = 32\ntargets = [\"attention.qkv\"]\n", ""),
    );
    // Without the adapters, plain Adam on every rank does not fit (an fp32 copy and two
    // moments of 6.7B parameters); ZeRO-1 over the 8 GPUs makes it fit.
    let unsharded = parasim(&["run", path.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&unsharded.stderr).contains("does not fit in memory"));
    let full = json(&["run", path.to_str().unwrap(), "--json", "--set", "parallelism.zero=1"]);
    assert!(full["model"].get("frozen_parameters").is_none());
    let time = |value: &serde_json::Value| value["iteration_time_s"].as_f64().unwrap();
    assert!(time(&lora) < 0.85 * time(&full), "LoRA {} s against full {} s", time(&lora), time(&full));
}

#[test]
fn bad_lora_tables_name_the_key_and_what_is_valid() {
    let cases: [(&[&str], &str); 3] = [
        (&["--set", "workload.lora.rank=0"], "workload.lora.rank"),
        (
            &["--set", "workload.lora.targets=[\"q_proj\"]"],
            "its linear layers end in: attention.proj, attention.qkv",
        ),
        (&["--set", "parallelism.zero=3"], "parasim does not shard or offload frozen weights"),
    ];
    for (set, expected) in cases {
        let mut args = vec!["run", LORA];
        args.extend_from_slice(set);
        let output = parasim(&args);
        assert_eq!(output.status.code(), Some(2), "{set:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{set:?}: {stderr}");
    }
}

#[test]
fn plan_searches_a_lora_job_without_the_layouts_lora_refuses() {
    let output = parasim(&["plan", "--cluster", LORA, "--quiet"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("(LoRA rank 32)"), "{text}");
    // ZeRO-3 and offload are not tried, so nothing is rejected for them.
    assert!(!text.contains("zero3") && !text.contains("[workload.lora]"), "{text}");
    assert!(text.lines().any(|line| line.starts_with("1 ")), "{text}");
}
