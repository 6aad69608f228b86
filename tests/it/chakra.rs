//! Chakra execution traces in and out: `parasim export --chakra` read back by parasim's own
//! reader and decoded with the schema, compared with `run --json` / `--csv` /
//! `--buckets-csv`; `replay` of the real PyTorch and Chakra execution traces of ../shared
//! (read from there, never copied), alone and paired with their Kineto traces.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use traces::et::schema::{self, AttributeProto, NodeType};

use super::{QUICKSTART, parasim, quickstart_with, scenario_file};

fn shared(relative: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/traces").join(relative);
    assert!(
        path.is_file(),
        "missing the shared trace {} (the shared data folder beside the checkout; its PROVENANCE.md lists the files)",
        path.display()
    );
    path.display().to_string()
}

fn scratch(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&path);
    path
}

fn ok(args: &[&str]) -> Vec<u8> {
    let output = parasim(args);
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_slice(&ok(args)).unwrap()
}

/// Sums of a CSV column over the rows whose `key` column is `value`.
fn csv_sum(path: &Path, key: &str, value: &str, column: &str) -> f64 {
    let text = fs_err::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (k, c) = (at(key), at(column));
    // The columns read here come before any quoted name.
    lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f[k] == value)
        .map(|f| f[c].parse::<f64>().unwrap())
        .sum()
}

/// The decoded files of an export, by rank, checked against the published schema's required
/// fields: metadata version, node types, the attributes each type needs, dependencies that
/// name nodes of the same file, groups that `comm_group.json` defines.
fn decode_export(dir: &Path, name: &str, ranks: u32) -> Vec<schema::EtFile> {
    let groups: BTreeMap<String, Vec<u32>> =
        serde_json::from_str(&fs_err::read_to_string(dir.join("comm_group.json")).unwrap()).unwrap();
    let mut files = Vec::new();
    for rank in 0..ranks {
        let bytes = fs_err::read(dir.join(format!("{name}.{rank}.et"))).unwrap();
        let file = schema::decode(&bytes).unwrap();
        assert_eq!(file.metadata.version, "0.0.4");
        let ids: BTreeSet<u64> = file.nodes.iter().map(|n| n.id).collect();
        assert_eq!(ids.len(), file.nodes.len(), "rank {rank}: node ids are unique");
        for node in &file.nodes {
            let has = |attr: &str| node.attribute(attr).is_some();
            assert!(!node.name.is_empty());
            assert!(node.ctrl_deps.iter().chain(&node.data_deps).all(|d| ids.contains(d)), "{node:?}");
            assert!(has("is_cpu_op"), "{node:?}");
            match NodeType::try_from(node.r#type).unwrap() {
                NodeType::CompNode => assert!(has("num_ops"), "{node:?}"),
                NodeType::CommCollNode => {
                    assert!(has("comm_type") && has("comm_size"), "{node:?}");
                    let group = node.attribute("pg_name").and_then(AttributeProto::as_str).unwrap();
                    assert!(groups[group].contains(&rank), "rank {rank} in its group {group}");
                }
                NodeType::CommSendNode | NodeType::CommRecvNode => {
                    assert!(
                        has("comm_src") && has("comm_dst") && has("comm_tag") && has("comm_size"),
                        "{node:?}"
                    );
                }
                other => panic!("unexpected node type {other:?}"),
            }
        }
        files.push(file);
    }
    files
}

fn attr_sum(file: &schema::EtFile, node_type: NodeType, attr: &str) -> f64 {
    file.nodes
        .iter()
        .filter(|n| n.r#type == node_type as i32)
        .filter_map(|n| n.attribute(attr).and_then(AttributeProto::as_f64))
        .sum()
}

#[test]
fn quickstart_exports_as_chakra_with_the_runs_flops_bytes_and_time() {
    let dir = scratch("chakra-quickstart");
    let report = String::from_utf8(ok(&["export", "--chakra", dir.to_str().unwrap(), QUICKSTART])).unwrap();
    assert!(report.contains("wrote         64 Chakra ET files"), "{report}");
    let files = decode_export(&dir, "quickstart", 64);
    let run = json(&["run", QUICKSTART, "--json"]);
    let csv = scratch("chakra-quickstart.csv");
    let buckets = scratch("chakra-quickstart-buckets.csv");
    ok(&["run", QUICKSTART, "--csv", csv.to_str().unwrap(), "--buckets-csv", buckets.to_str().unwrap()]);
    // Data parallelism: every rank runs stage 0's kernels and all-reduces its buckets.
    let flops = csv_sum(&csv, "stage", "0", "flops_per_iteration");
    let bytes = csv_sum(&buckets, "stage", "0", "bytes");
    for (rank, file) in files.iter().enumerate() {
        let written = attr_sum(file, NodeType::CompNode, "num_ops");
        assert!(
            (written - flops).abs() <= 1e-6 * flops,
            "rank {rank}: {written} FLOPs written, {flops} in run --csv"
        );
        assert_eq!(attr_sum(file, NodeType::CommCollNode, "comm_size"), bytes, "rank {rank}");
    }
    // Read back by parasim's reader: every node a GPU op, the run's iteration time.
    let replay = json(&["replay", dir.to_str().unwrap(), "--cluster", QUICKSTART, "--json", "--quiet"]);
    let nodes: usize = files.iter().map(|f| f.nodes.len()).sum();
    assert_eq!(replay["graph"]["gpu_ops"], nodes as u64);
    assert_eq!(replay["timing"].as_str().unwrap().split(' ').next(), Some("51712"));
    let iteration = run["iteration_time_s"].as_f64().unwrap();
    let makespan = replay["comparison"]["makespan_s"].as_f64().unwrap();
    // Times are written in whole nanoseconds (rounded up from the engine's picoseconds).
    assert!((makespan - iteration).abs() <= 1e-6 * iteration, "replayed {makespan} s, run {iteration} s");
}

#[test]
fn a_pipeline_exports_sends_and_receives_and_replays_in_the_runs_time() {
    let text = quickstart_with("batch-per-device = 64", "global-batch = 256\nmicro-batch = 32")
        .replacen("data = 64", "data = 4\npipeline = 2", 1)
        .replacen("nodes = 8", "nodes = 1", 1);
    let scenario = scenario_file("chakra-pipeline.toml", &text);
    let scenario = scenario.to_str().unwrap();
    let dir = scratch("chakra-pipeline");
    ok(&["export", "--chakra", dir.to_str().unwrap(), scenario]);
    let files = decode_export(&dir, "chakra-pipeline", 8);
    let count = |t: NodeType| files.iter().flat_map(|f| &f.nodes).filter(|n| n.r#type == t as i32).count();
    assert!(count(NodeType::CommSendNode) > 0);
    assert_eq!(count(NodeType::CommSendNode), count(NodeType::CommRecvNode));
    let csv = scratch("chakra-pipeline.csv");
    ok(&["run", scenario, "--csv", csv.to_str().unwrap()]);
    let stages = [
        csv_sum(&csv, "stage", "0", "flops_per_iteration"),
        csv_sum(&csv, "stage", "1", "flops_per_iteration"),
    ];
    let written: f64 = files.iter().map(|f| attr_sum(f, NodeType::CompNode, "num_ops")).sum();
    let expected = 4.0 * (stages[0] + stages[1]);
    assert!(
        (written - expected).abs() <= 1e-6 * expected,
        "{written} FLOPs written, {expected} in run --csv"
    );
    let run = json(&["run", scenario, "--json"]);
    let replay = json(&["replay", dir.to_str().unwrap(), "--cluster", scenario, "--json", "--quiet"]);
    let iteration = run["iteration_time_s"].as_f64().unwrap();
    let makespan = replay["comparison"]["makespan_s"].as_f64().unwrap();
    assert!((makespan - iteration).abs() <= 1e-6 * iteration, "replayed {makespan} s, run {iteration} s");
}

#[test]
fn a_pytorch_execution_trace_replays_with_compute_model_durations() {
    let et = shared("param/et_replay/tests/inputs/1.1.0-chakra.0.0.4/resnet_2gpu_et.json.gz");
    let replay = json(&["replay", &et, "--device", "a100-sxm4-80gb", "--json", "--quiet"]);
    assert_eq!(replay["format"], "a PyTorch execution trace (schema 1.1.0-chakra.0.0.4)");
    assert_eq!(replay["traced_world_size"], 2);
    let timing = replay["timing"].as_str().unwrap();
    assert!(
        timing.contains("by parasim's compute model")
            && timing.contains("21 communication ops, 21 with byte counts"),
        "{timing}"
    );
    let steps: Vec<u64> = replay["comparison"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["number"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [4, 5, 6]);
    let kinds: Vec<(&str, f64)> = replay["comparison"]["collectives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["kind"].as_str().unwrap(), c["count_per_rank"].as_f64().unwrap()))
        .collect();
    assert_eq!(kinds, [("allreduce", 15.0), ("broadcast", 6.0)]);
    // compare costs the operators on the scenario's device.
    let two = quickstart_with("nodes = 8", "nodes = 1")
        .replacen("gpus-per-node = 8", "gpus-per-node = 2", 1)
        .replacen("data = 64", "data = 2", 1);
    let two = scenario_file("chakra-two-gpus.toml", &two);
    let compared = json(&["compare", &et, two.to_str().unwrap(), "--json"]);
    assert_eq!(compared["trace"]["steps"], serde_json::json!([4, 5, 6]));
    assert!(compared["iteration"]["measured_s"].as_f64().unwrap() > 0.0);
    // Without a device there is nothing to cost the operators on.
    let output = parasim(&["replay", &et, "--quiet"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("pass --device NAME or --cluster SCENARIO"));
}

#[test]
fn an_execution_trace_paired_with_its_kineto_trace_replays_as_measured() {
    let et = shared("param/et_replay/tests/inputs/dlrm_pytorch_et.tar.gz");
    let kineto = shared("param/et_replay/tests/inputs/dlrm_kineto.tar.gz");
    let paired = json(&["replay", &et, "--kineto", &kineto, "--json", "--quiet"]);
    let alone = json(&["replay", &kineto, "--json", "--quiet"]);
    let timing = paired["timing"].as_str().unwrap();
    assert!(timing.contains("64 communication nodes matched to NCCL kernels by kind and order"), "{timing}");
    // Operators: matched by name and order; the count is what this pair measures (the
    // remaining 104 have no ET leaf of the same name at that position).
    assert!(
        timing.contains("1574 of the 1678 Kineto aten operators that launched GPU work matched"),
        "{timing}"
    );
    // The Kineto trace's kernel times decide: the same replay as the Kineto trace alone, and
    // the measured ProfilerStep#10 within 1% (measured 16.008 ms, replayed 15.983 ms).
    assert_eq!(paired["comparison"], alone["comparison"]);
    let step = &paired["comparison"]["steps"][0];
    let (measured, simulated) = (step["measured_s"].as_f64().unwrap(), step["simulated_s"].as_f64().unwrap());
    assert!((simulated - measured).abs() <= 0.01 * measured, "measured {measured} s, replayed {simulated} s");
    // compare reads the pair too: the measured side is the Kineto trace's.
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/dlrm-8xv100.toml");
    let paired = json(&["compare", &et, "--kineto", &kineto, scenario, "--json"]);
    let alone = json(&["compare", &kineto, scenario, "--json"]);
    assert_eq!(paired["iteration"], alone["iteration"]);
    assert_eq!(paired["collectives"], alone["collectives"]);
    // The smallest matched pair: the replayed span is the Kineto trace's.
    let et = shared("HolisticTraceAnalysis/execution_trace/benchmark_simple_add_et.json.gz");
    let kineto = shared("HolisticTraceAnalysis/execution_trace/benchmark_simple_add_trace.json.gz");
    let paired = json(&["replay", &et, "--kineto", &kineto, "--json", "--quiet"]);
    let alone = json(&["replay", &kineto, "--json", "--quiet"]);
    assert_eq!(paired["comparison"]["makespan_s"], alone["comparison"]["makespan_s"]);
    let timing = paired["timing"].as_str().unwrap();
    assert!(timing.contains("4 of the 4 Kineto aten operators that launched GPU work matched"), "{timing}");
}

#[test]
fn a_chakra_json_trace_replays_at_its_runtimes() {
    // The archive holds two unrelated traces, both rank 0: refused, naming both.
    let archive = shared("chakra/tests/data/json_trace.tar.gz");
    let output = parasim(&["replay", &archive, "--device", "a100-sxm4-80gb", "--quiet"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("json_trace.tar.gz:chakra.0.json and") && stderr.contains("are both rank 0"),
        "{stderr}"
    );
    let dir = scratch("chakra-json");
    fs_err::create_dir_all(&dir).unwrap();
    let file = fs_err::File::open(&archive).unwrap();
    tar::Archive::new(flate2::read::GzDecoder::new(file)).unpack(&dir).unwrap();
    let small = dir.join("jsonData/small_chakra.0.json");
    let replay =
        json(&["replay", small.to_str().unwrap(), "--device", "a100-sxm4-80gb", "--json", "--quiet"]);
    assert_eq!(replay["format"], "a Chakra JSON trace (workload_graph)");
    // 5 CPU operators and 1 GPU kernel with runtimes, and the NCCL broadcast kernel of 28 us.
    assert!(
        replay["timing"].as_str().unwrap().starts_with("6 compute ops timed by the trace"),
        "{}",
        replay["timing"]
    );
    let broadcast = &replay["comparison"]["collectives"][0];
    assert_eq!(broadcast["kind"], "broadcast");
    assert!((broadcast["measured_s"].as_f64().unwrap() - 28e-6).abs() < 1e-12);
}
