//! Machine-readable output: every `--json` parses and has its keys, in SI base units; `run
//! --csv`'s per-layer FLOPs add up to the run's FLOPs per rank per iteration.

use std::path::Path;

use crate::{QUICKSTART, parasim};

use super::parasim_json as json;

fn has_keys(value: &serde_json::Value, keys: &[&str]) {
    for key in keys {
        assert!(value.get(key).is_some(), "no {key:?} in {value}");
    }
}

#[test]
fn collective_json_has_every_size_in_si_units() {
    let value = json(&["collective", "allreduce", "-b", "1K", "-e", "1M", "-f", "32", "--json"]);
    has_keys(
        &value,
        &["collective", "ranks", "gpus", "device", "fidelity", "algorithm", "protocol", "launch_s", "sizes"],
    );
    let sizes = value["sizes"].as_array().unwrap();
    assert_eq!(sizes.len(), 3);
    for size in sizes {
        has_keys(
            size,
            &[
                "bytes",
                "count",
                "time_s",
                "algorithm_bandwidth_bytes_per_s",
                "bus_bandwidth_bytes_per_s",
                "algorithm",
            ],
        );
        let algbw = size["bytes"].as_f64().unwrap() / size["time_s"].as_f64().unwrap();
        let reported = size["algorithm_bandwidth_bytes_per_s"].as_f64().unwrap();
        assert!((algbw - reported).abs() <= 1e-9 * algbw, "{algbw} vs {reported}");
    }
    assert_eq!(value["ranks"], 64);
}

#[test]
fn topo_models_and_inspect_json() {
    let topo = json(&["topo", QUICKSTART, "--json"]);
    has_keys(
        &topo,
        &[
            "gpus",
            "nodes",
            "intra_node",
            "fabric",
            "routing",
            "switches",
            "links",
            "bisection_bandwidth_bytes_per_s",
            "diameter_links",
            "path_lengths",
        ],
    );
    assert_eq!(topo["gpus"], 64);
    // 32 NICs of 200 Gb/s across the cut: 800 GB/s.
    assert_eq!(topo["bisection_bandwidth_bytes_per_s"].as_f64(), Some(800e9));
    assert_eq!(topo["intra_node"]["bandwidth_bytes_per_s"].as_f64(), Some(300e9));

    let models = json(&["models", "--json"]);
    let resnet = models.as_array().unwrap().iter().find(|m| m["name"] == "resnet50").unwrap();
    has_keys(resnet, &["family", "parameters", "forward_flops_per_sample", "input_shape", "description"]);
    assert_eq!(resnet["parameters"], 25_557_032);

    let inspect = json(&["inspect", "resnet50", "--batch", "2", "--json"]);
    has_keys(
        &inspect,
        &["model", "batch", "layers", "parameters", "forward_flops", "training_flops", "activation_elements"],
    );
    let layers = inspect["layers"].as_array().unwrap();
    let parameters: u64 = layers.iter().map(|l| l["parameters"].as_u64().unwrap()).sum();
    assert_eq!(parameters, 25_557_032);
    let forward: f64 = layers.iter().map(|l| l["forward_flops"].as_f64().unwrap()).sum();
    let total = inspect["forward_flops"].as_f64().unwrap();
    assert!((forward - total).abs() <= 1e-9 * total, "{forward} vs {total}");
}

#[test]
fn bench_json_has_every_table() {
    let value =
        json(&["bench", "--gpus", "8", "--strategy-gpus", "--repeats", "1", "--monte-carlo", "20", "--json"]);
    has_keys(&value, &["repeats", "quickstart", "gpt3_175b", "monte_carlo", "peak_resident_memory_bytes"]);
    let row = &value["quickstart"][0];
    has_keys(row, &["gpus", "ops", "events", "lowering_s", "simulation_s", "total_s", "events_per_s"]);
    assert_eq!(row["gpus"], 8);
    let monte_carlo = &value["monte_carlo"];
    has_keys(monte_carlo, &["gpus", "iterations", "ops", "setup_s", "retiming_s", "total_s"]);
    assert_eq!((monte_carlo["gpus"].as_u64(), monte_carlo["iterations"].as_u64()), (Some(1024), Some(20)));
    let total = monte_carlo["total_s"].as_f64().unwrap();
    let parts = monte_carlo["setup_s"].as_f64().unwrap() + monte_carlo["retiming_s"].as_f64().unwrap();
    assert!((total - parts).abs() < 1e-9, "{total} vs {parts}");
    // `--monte-carlo 0` skips it.
    let value =
        json(&["bench", "--gpus", "8", "--strategy-gpus", "--repeats", "1", "--monte-carlo", "0", "--json"]);
    assert!(value["monte_carlo"].is_null(), "{}", value["monte_carlo"]);
}

/// The per-layer CSV's FLOPs (recomputation aside), summed per stage and averaged over the
/// stages, are the run's FLOPs per rank per iteration (achieved FLOP/s x iteration time).
fn assert_layer_flops_add_up(scenario: &Path, name: &str) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("json-{name}"));
    fs_err::create_dir_all(&dir).unwrap();
    let layers = dir.join("layers.csv");
    let buckets = dir.join("buckets.csv");
    let run = json(&[
        "run",
        scenario.to_str().unwrap(),
        "--json",
        "--csv",
        layers.to_str().unwrap(),
        "--buckets-csv",
        buckets.to_str().unwrap(),
    ]);
    let text = fs_err::read_to_string(&layers).unwrap();
    let records = scenario::csv_text::records(&text).unwrap();
    let mut lines = records.iter().map(|(_, cells)| cells);
    let header = lines.next().unwrap();
    let column = |name: &str| header.iter().position(|c| *c == name).unwrap();
    let (stage, pass, flops) = (column("stage"), column("pass"), column("flops_per_iteration"));
    let mut per_stage = std::collections::BTreeMap::<u32, f64>::new();
    let mut passes = std::collections::BTreeSet::new();
    for cells in lines {
        assert_eq!(cells.len(), header.len(), "{cells:?}");
        passes.insert(cells[pass].to_string());
        if cells[pass] != "recompute" {
            *per_stage.entry(cells[stage].parse().unwrap()).or_default() +=
                cells[flops].parse::<f64>().unwrap();
        }
    }
    let stages = run["strategy"]["pipeline"].as_u64().unwrap() as usize;
    assert_eq!(per_stage.len(), stages, "{name}: a row per stage");
    let mean = per_stage.values().sum::<f64>() / stages as f64;
    let reported = run["achieved_tflops_per_device"].as_f64().unwrap()
        * 1e12
        * run["iteration_time_s"].as_f64().unwrap();
    assert!((mean - reported).abs() <= 1e-9 * reported, "{name}: layers {mean} vs run {reported}");
    for expected in ["forward", "backward-data", "backward-weight", "optimizer"] {
        assert!(passes.contains(expected), "{name}: no {expected} rows");
    }
    let buckets = fs_err::read_to_string(&buckets).unwrap();
    assert!(
        buckets.starts_with("stage,chunk,bucket,collective,expert,bytes,layers,first_layer,last_layer\n")
    );
    let bytes: u64 = scenario::csv_text::records(&buckets)
        .unwrap()
        .iter()
        .skip(1)
        .map(|(_, cells)| cells[5].parse::<u64>().unwrap())
        .sum();
    assert!(bytes > 0, "{name}: no gradient bytes");
}

#[test]
fn run_csv_layer_flops_are_the_runs_flops() {
    assert_layer_flops_add_up(Path::new(QUICKSTART), "quickstart");
    // Pipeline parallelism and full recomputation: per-stage rows.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = fs_err::read_to_string(root.join("scenarios/megatron-sc21/gpt-1.7b.toml")).unwrap();
    assert!(text.contains("pipeline = 1"));
    let scenario =
        crate::scenario_file("json-gpt-pipeline.toml", &text.replacen("pipeline = 1", "pipeline = 4", 1));
    assert_layer_flops_add_up(&scenario, "gpt-pipeline");
}

/// `run --json` of a scenario with several jobs: each job's times and slowdown, the links two
/// jobs shared with the jobs that crossed them; byte-identical across runs (the engine line,
/// with its wall-clock times, goes to stderr).
#[test]
fn run_json_of_several_jobs_has_each_jobs_slowdown_and_the_contended_links() {
    let text = r#"
[cluster]
nodes = 8
gpus-per-node = 1
device = "a100-sxm4-80gb"
[cluster.network]
topology = "xgft"
simgrid = "2;4,2;1,1;1,1"
link-bandwidth = "100 Gb/s"
[workload]
model = "resnet50"
batch-per-device = 8
[parallelism]
allreduce = "ring"
[simulation]
fidelity = "flow"
[placement]
policy = "spread"
[[jobs]]
name = "a"
nodes = 4
[[jobs]]
name = "b"
nodes = 4
"#;
    let path = crate::scenario_file("two-jobs.toml", text);
    let path = path.to_str().unwrap();
    let value = json(&["run", path, "--json"]);
    has_keys(
        &value,
        &[
            "scenario",
            "fidelity",
            "placement",
            "gpus",
            "nodes",
            "jobs",
            "makespan_s",
            "contended_links",
            "busiest_links",
        ],
    );
    let jobs = value["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    for job in jobs {
        has_keys(
            job,
            &[
                "name",
                "model",
                "strategy",
                "gpus",
                "node_list",
                "start_s",
                "iterations",
                "alone_s",
                "shared_s",
                "slowdown",
            ],
        );
        assert!(job["slowdown"].as_f64().unwrap() > 1.2, "{job}");
    }
    let link = &value["contended_links"][0];
    has_keys(link, &["name", "kind", "id", "capacity_bytes_per_s", "bytes", "utilisation", "jobs"]);
    assert_eq!(link["jobs"], serde_json::json!(["a", "b"]));
    assert_eq!(parasim(&["run", path, "--json"]).stdout, parasim(&["run", path, "--json"]).stdout);
}
