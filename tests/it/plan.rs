//! `parasim plan`: the strategy oracle against known-good answers (Megatron-LM SC'21 Table 1's
//! configurations), its JSON, fixed settings, and refusals.

use super::parasim;

const SC21: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/megatron-sc21/");

/// `parasim plan --cluster` a Table 1 row's scenario with `args`, `--quiet`; its standard
/// output (the run must succeed).
fn plan(row: &str, args: &[&str]) -> Vec<u8> {
    let cluster = format!("{SC21}{row}.toml");
    let mut all = vec!["plan", "--cluster", &cluster, "--quiet"];
    all.extend_from_slice(args);
    let output = parasim(&all);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

/// `plan --json` on a Table 1 row with the features Megatron-LM had in 2021 fixed (full
/// recomputation, no sequence parallelism, no distributed optimizer); the top configurations.
fn plan_sc21(row: &str, top: &str) -> serde_json::Value {
    let args = ["--set", "workload.recompute=full", "--set", "parallelism.sequence-parallel=false"];
    let args = [&args[..], &["--set", "parallelism.zero=0", "--top", top, "--json"]].concat();
    serde_json::from_slice(&plan(row, &args)).unwrap()
}

#[test]
fn megatron_table_1_configurations_are_in_the_top_3_of_plan() {
    // Rows small enough for CI; docs/plan.md lists every row's rank (the larger ones miss).
    for (row, tensor, pipeline) in [("gpt-1.7b", 1, 1), ("gpt-3.6b", 2, 1), ("gpt-7.5b", 4, 1)] {
        let plan = plan_sc21(row, "3");
        let top = plan["top"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let found = top.iter().any(|c| c["tensor"] == tensor && c["pipeline"] == pipeline);
        let listed: Vec<&str> = top.iter().map(|c| c["configuration"].as_str().unwrap()).collect();
        assert!(found, "{row}: the paper's tensor {tensor} x pipeline {pipeline} is not in {listed:?}");
        // Ranked best first, every one simulated, each below its lower bound's floor.
        let times: Vec<f64> =
            top.iter().map(|c| c["summary"]["iteration_time_s"].as_f64().unwrap()).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{row}: {times:?}");
        for c in top {
            assert!(
                c["lower_bound_s"].as_f64().unwrap() <= c["summary"]["iteration_time_s"].as_f64().unwrap()
            );
            assert_eq!(c["recompute"], "full");
            assert_eq!(c["sequence_parallel"], false);
        }
        assert!(plan["bounded_out"].as_u64().unwrap() > 0, "{row}: the bound skipped nothing");
    }
}

#[test]
fn budgets_give_time_to_train_and_cost_and_fixed_degrees_hold() {
    let args = ["--set", "parallelism.tensor=2", "--set", "workload.recompute=selective", "--tokens", "10G"];
    let args = [&args[..], &["--gpu-hour-price", "2", "--top", "2", "--json"]].concat();
    let plan: serde_json::Value = serde_json::from_slice(&plan("gpt-1.7b", &args)).unwrap();
    for c in plan["top"].as_array().unwrap() {
        assert_eq!(c["tensor"], 2);
        let iteration = c["summary"]["iteration_time_s"].as_f64().unwrap();
        // 10e9 tokens / (512 sequences x 2048 tokens) iterations.
        let expected = 10e9 / (512.0 * 2048.0) * iteration;
        let time = c["time_to_train_s"].as_f64().unwrap();
        assert!((time / expected - 1.0).abs() < 1e-9, "{time} vs {expected}");
        let hours = c["gpu_hours"].as_f64().unwrap();
        assert!((hours - time * 32.0 / 3600.0).abs() < 1e-6 * hours);
        assert!((c["cost"].as_f64().unwrap() - 2.0 * hours).abs() < 1e-6 * hours);
    }
}

#[test]
fn the_text_report_explains_the_winner_against_the_runner_up() {
    let text =
        String::from_utf8(plan("gpt-1.7b", &["--set", "workload.recompute=full", "--top", "2"])).unwrap();
    for wanted in ["searched", "valid and fit", "screened", "rank", "why #1", "compute", "#1 gains in"] {
        assert!(text.contains(wanted), "no {wanted:?} in\n{text}");
    }
}

#[test]
fn a_model_that_fits_nowhere_is_an_error_with_the_reasons() {
    let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/quickstart.toml");
    let output = parasim(&[
        "plan",
        "--cluster",
        quickstart,
        "--model",
        "megatron-1t",
        "--global-batch",
        "64",
        "--gpus",
        "8",
        "--quiet",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no configuration of megatron-1t fits") && stderr.contains("does not fit in memory"),
        "{stderr}"
    );
}

#[test]
fn the_answer_is_the_same_bytes_whatever_the_thread_count() {
    let run = |threads: &str| {
        plan(
            "gpt-1.7b",
            &["--set", "workload.recompute=selective", "--top", "4", "--json", "--threads", threads],
        )
    };
    let one = run("1");
    assert_eq!(one, run("2"));
    assert_eq!(one, run("8"));
}

/// Plan's progress goes to standard error (plain lines when it is not a terminal, one a
/// period: shortened here by PARASIM_PROGRESS_PERIOD_MS), naming the stage and its counts,
/// and leaves the report alone.
#[test]
fn progress_lines_name_each_stage_on_stderr_only() {
    let cluster = format!("{SC21}gpt-1.7b.toml");
    let args =
        ["plan", "--cluster", &cluster, "--set", "workload.recompute=selective", "--top", "2", "--json"];
    let with = std::process::Command::new(env!("CARGO_BIN_EXE_parasim"))
        .args(args)
        .env("PARASIM_PROGRESS_PERIOD_MS", "2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&with.stderr);
    assert!(with.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("plan: ")).collect();
    assert!(
        lines.iter().any(|l| l.starts_with("plan: screen ") && l.contains(" configurations, ")),
        "{stderr}"
    );
    let quiet = plan("gpt-1.7b", &["--set", "workload.recompute=selective", "--top", "2", "--json"]);
    let strip = |json: &[u8]| {
        let mut value: serde_json::Value = serde_json::from_slice(json).unwrap();
        value.as_object_mut().unwrap().remove("wall_s");
        value
    };
    assert_eq!(strip(&with.stdout), strip(&quiet));
}

/// A model file on the command line is a path from the working directory, not from the
/// cluster file's folder (issue 38: `--model out/my_model.toml` was looked for beside the
/// cluster file).
#[test]
fn a_model_path_on_the_command_line_is_from_the_working_directory() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("plan-model-path");
    let _ = fs_err::remove_dir_all(&dir);
    fs_err::create_dir_all(dir.join("out")).unwrap();
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/data/models/bert-base.toml");
    fs_err::copy(model, dir.join("out/my_model.toml")).unwrap();
    let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/quickstart.toml");
    // `plan` with `--model PATH`, run from `dir`.
    let plan = |model: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_parasim"))
            .args([
                "plan",
                "--cluster",
                quickstart,
                "--model",
                model,
                "--gpus",
                "8",
                "--global-batch",
                "64",
                "--quiet",
            ])
            .current_dir(&dir)
            .output()
            .unwrap()
    };
    let output = plan("out/my_model.toml");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // A missing one names the path as given from the working directory.
    let output = plan("out/missing.toml");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&dir.join("out/missing.toml").display().to_string()), "{stderr}");
}

/// A misspelt `--set` key is the override's fault: the error names the override and its key,
/// not the cluster file (which holds no such key).
#[test]
fn a_bad_set_key_blames_the_override_not_the_cluster_file() {
    let cluster = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/gpt3-175b-1024.toml");
    let output = parasim(&["plan", "--cluster", cluster, "--quiet", "--set", "parallelism.tensr=4"]);
    assert_eq!(output.status.code(), Some(2));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        error.contains(
            "--set parallelism.tensr=4: key `parallelism.tensr` (set by this override): unknown field `tensr`"
        ),
        "{error}"
    );
    assert!(!error.contains("gpt3-175b-1024.toml"), "{error}");
}

/// A sequence model's throughput in tokens beside samples in every report (issue 35: `plan`
/// printed 0.07 samples/s per GPU for GPT-3): `run` of a data-parallel GPT (the form that printed
/// samples alone) and `plan`'s table (`README.md`'s plan snapshot shows the column).
#[test]
fn sequence_models_report_tokens_per_second_beside_samples() {
    let gpt = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/megatron-sc21/gpt-1.7b.toml");
    let output = parasim(&["run", gpt]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().find(|l| l.starts_with("throughput")).unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("samples/s (") && line.contains("tokens/s (") && line.contains("per GPU)"),
        "{line}"
    );
    let table = String::from_utf8(plan("gpt-1.7b", &["--top", "2"])).unwrap();
    let header = table.lines().find(|l| l.starts_with("rank")).unwrap();
    assert!(header.contains("samples/s/GPU") && header.contains("tokens/s/GPU"), "{header}");
}

/// `plan` on node groups of mixed devices (a server of A100-SXM4-40GB and one of
/// H100-SXM5-80GB): every row of `--json` is what `parasim run --set` of its `set` overrides
/// gives on the same file (the winner included), stage placements are searched, and `--gpus`
/// other than the groups' size is refused naming the key.
#[test]
fn plan_on_mixed_devices_rows_equal_run_of_their_overrides() {
    let cluster = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/mixed/plan-a100-40gb-h100.toml");
    let fixed = [
        "--set",
        "workload.recompute=none",
        "--set",
        "parallelism.zero=1",
        "--set",
        "parallelism.sequence-parallel=false",
        "--set",
        "parallelism.virtual-stages=1",
    ];
    let mut args = vec!["plan", "--cluster", cluster, "--quiet", "--top", "4", "--json"];
    args.extend_from_slice(&fixed);
    let output = parasim(&args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(plan["device"].as_str().unwrap().starts_with("mixed ("), "{}", plan["device"]);
    let top = plan["top"].as_array().unwrap();
    assert!(!top.is_empty(), "{plan}");
    for row in top {
        let placement = row["stage_placement"].as_str().unwrap();
        assert!(["in-order", "by-speed"].contains(&placement), "{row}");
        let set: Vec<String> = serde_json::from_value(row["set"].clone()).unwrap();
        assert!(set.contains(&format!("parallelism.stage-placement=\"{placement}\"")), "{set:?}");
        let json = assert_run_of_set_equals(cluster, row);
        assert_eq!(json["devices"], row["summary"]["devices"], "{}", row["configuration"]);
    }
    let output = parasim(&["plan", "--cluster", cluster, "--quiet", "--gpus", "16"]);
    assert_eq!(output.status.code(), Some(2));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("key `cluster.node-groups`") && error.contains("give --gpus 8"), "{error}");
}

/// `plan --cluster FILE --quiet --json` with `args`; the parsed output (the run must succeed).
fn plan_json(cluster: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["plan", "--cluster", cluster, "--quiet", "--json"];
    all.extend_from_slice(args);
    let output = parasim(&all);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// `parasim run FILE --json` with a plan row's `set` overrides: its iteration time must be the
/// row's. Returns the run's JSON.
fn assert_run_of_set_equals(cluster: &str, row: &serde_json::Value) -> serde_json::Value {
    let set: Vec<String> = serde_json::from_value(row["set"].clone()).unwrap();
    let mut run = vec!["run".to_string(), cluster.to_string(), "--json".to_string()];
    for change in &set {
        run.extend(["--set".to_string(), change.clone()]);
    }
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    let output = parasim(&run);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        json["iteration_time_s"], row["summary"]["iteration_time_s"],
        "{}: plan and run --set {set:?} differ",
        row["configuration"]
    );
    json
}

/// Issue 37: when nothing fits in device memory and offloading was not chosen, plan tries each
/// configuration without recomputation or ZeRO again out of core: GPT 1.7B (27 GB of model
/// state) on one 16 GB V100 fits only with its weights offloaded, and `run --set` of the row
/// gives its time.
#[test]
fn plan_falls_back_to_out_of_core_training_when_nothing_fits() {
    let cluster = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/out-of-core/gpt-1.7b-tensor.toml");
    let one_gpu = ["--set", "cluster.gpus-per-node=1", "--top", "3"];
    let plan = plan_json(cluster, &one_gpu);
    assert_eq!(plan["out_of_core"], true, "{plan}");
    assert!(plan["rejected"]["does not fit in memory"]["count"].as_u64().unwrap() > 0, "{plan}");
    let top = plan["top"].as_array().unwrap();
    assert_eq!(top[0]["offload"], "activations+weights", "{plan}");
    let mut row = top[0].clone();
    let mut set: Vec<String> = serde_json::from_value(row["set"].clone()).unwrap();
    set.insert(0, "cluster.gpus-per-node=1".into());
    row["set"] = serde_json::json!(set);
    assert_run_of_set_equals(cluster, &row);
    // Where something fits, nothing is tried out of core.
    let plan = plan_json(cluster, &["--top", "3"]);
    assert_eq!(plan["out_of_core"], false, "{plan}");
    assert!(plan["top"].as_array().unwrap().iter().all(|row| row["offload"].is_null()), "{plan}");
}

/// Issue 37: with the nodes' CPUs named (`cluster.host-cpu`), a plan where nothing fits also
/// tries ZeRO-Offload's host optimizer, which keeps the activations on the GPU: GPT 1.7B on one
/// 16 GB V100 of an ABCI node steps on the host CPU several times faster than with its weights
/// out of core, and `run --set` of the row gives its time.
#[test]
fn plan_with_the_hosts_cpus_finds_zero_offload_when_nothing_fits() {
    let cluster = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/out-of-core/gpt-1.7b-tensor.toml");
    let plain = plan_json(cluster, &["--set", "cluster.gpus-per-node=1", "--top", "3"]);
    let with_cpu =
        ["--set", "cluster.gpus-per-node=1", "--set", "cluster.host-cpu=xeon-6148-2s", "--top", "3"];
    let plan = plan_json(cluster, &with_cpu);
    assert_eq!(plan["out_of_core"], true, "{plan}");
    assert_eq!(plan["out_of_core_host_optimizer"], true, "{plan}");
    assert!(plain.get("out_of_core_host_optimizer").is_none(), "{plain}");
    let top = plan["top"].as_array().unwrap();
    let offload = top[0]["offload"].as_str().unwrap();
    assert!(offload == "optimizer" || offload == "activations+optimizer", "{plan}");
    let best = |plan: &serde_json::Value| plan["top"][0]["summary"]["iteration_time_s"].as_f64().unwrap();
    assert!(best(&plan) * 3.0 < best(&plain), "{} s against {} s", best(&plan), best(&plain));
    let mut row = top[0].clone();
    let mut set: Vec<String> = serde_json::from_value(row["set"].clone()).unwrap();
    set.insert(0, "cluster.host-cpu=\"xeon-6148-2s\"".into());
    set.insert(0, "cluster.gpus-per-node=1".into());
    row["set"] = serde_json::json!(set);
    assert_run_of_set_equals(cluster, &row);
}

const COSMOFLOW: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/cosmoflow/cosmoflow-512-v100.toml");

/// Issue 37: CosmoFlow 512^3 on 16 GB V100s fits only split spatially (one sample under data
/// parallelism or a pipeline does not fit); plan proposes a spatial split, its first row is
/// what `run --set` of its overrides gives, and the rows' `set` names the split's keys.
#[test]
fn cosmoflow_512_on_16_gb_v100s_plans_a_spatial_split_that_run_reproduces() {
    let plan = plan_json(COSMOFLOW, &["--top", "3"]);
    assert!(plan["rejected"]["does not fit in memory"]["count"].as_u64().unwrap() > 0, "{plan}");
    let top = plan["top"].as_array().unwrap();
    assert!(!top.is_empty(), "{plan}");
    for row in top {
        assert!(row["spatial"].as_u64().unwrap() > 1, "{}", row["configuration"]);
        let set: Vec<String> = serde_json::from_value(row["set"].clone()).unwrap();
        let dims = row["spatial_dims"].as_str().unwrap();
        assert!(set.contains(&format!("parallelism.spatial-dims=\"{dims}\"")), "{set:?}");
        if let Some(until) = row["spatial_until"].as_str() {
            assert!(set.contains(&format!("parallelism.spatial-until=\"{until}\"")), "{set:?}");
        }
    }
    assert_run_of_set_equals(COSMOFLOW, &top[0]);
}

/// Spatial-until is searched: plan's rows end splits at pooling layers, and a fixed end is
/// kept (ParaDL's APOOL_2) or refused by its key (a name that is no layer).
#[test]
fn plan_searches_spatial_until_and_a_fixed_one_is_kept_or_refused_by_its_key() {
    let plan = plan_json(COSMOFLOW, &["--top", "20"]);
    let untils: Vec<&str> =
        plan["top"].as_array().unwrap().iter().filter_map(|row| row["spatial_until"].as_str()).collect();
    assert!(untils.iter().any(|name| name.starts_with("APOOL_")), "{plan}");
    let plan = plan_json(COSMOFLOW, &["--top", "2", "--set", "parallelism.spatial-until=APOOL_2"]);
    let top = plan["top"].as_array().unwrap();
    assert!(!top.is_empty(), "{plan}");
    for row in top {
        assert_eq!(row["spatial_until"], "APOOL_2", "{row}");
    }
    let output = parasim(&[
        "plan",
        "--cluster",
        COSMOFLOW,
        "--quiet",
        "--set",
        "parallelism.spatial-until=NOT_A_LAYER",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("parallelism.spatial-until") && error.contains("NOT_A_LAYER"), "{error}");
}

/// Out-of-core training is searched: Awan's ResNet-1001 with 4 images per GPU on its 4 data
/// ranks fits a 16 GB V100 only with its activations in host memory, so every row offloads
/// (and the first is what `run --set` gives); the weights' offload with 4 micro-batches per
/// replica is refused naming `workload.offload`.
#[test]
fn plan_offloads_where_only_out_of_core_training_fits() {
    let cluster = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/out-of-core/resnet1001-spatial.toml");
    let fixed = ["--set", "parallelism.data=4", "--set", "workload.micro-batch=4", "--top", "3"];
    let plan = plan_json(cluster, &fixed);
    assert!(plan["rejected"]["does not fit in memory"]["count"].as_u64().unwrap() > 0, "{plan}");
    let top = plan["top"].as_array().unwrap();
    assert!(!top.is_empty(), "{plan}");
    for row in top {
        assert!(row["offload"].as_str().is_some_and(|mode| mode.starts_with("activations")), "{row}");
    }
    assert_run_of_set_equals(cluster, &top[0]);
    let plan = plan_json(cluster, &["--set", "parallelism.data=4", "--set", "workload.micro-batch=1"]);
    assert!(
        plan["rejected"]["workload.offload"]["example"].as_str().unwrap().contains("micro-batches"),
        "{plan}"
    );
}
