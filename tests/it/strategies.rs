//! Strategies through the binary: plain data parallelism keeps the results the DDP lowering
//! gave before the strategy layer existed, tensor/pipeline scenarios run and report their
//! degrees, bubble and per-stage memory, and every bad `[parallelism]` or batch is named.

use crate::{QUICKSTART, assert_rejected, parasim, quickstart_with, scenario_file};

/// Every value of `pinned` (recursively) equals the one at the same key of `actual`.
fn assert_contains(pinned: &serde_json::Value, actual: &serde_json::Value, path: &str) {
    match pinned {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                let Some(found) = actual.get(key) else { panic!("{path}.{key} is gone from the output") };
                assert_contains(value, found, &format!("{path}.{key}"));
            }
        }
        other => assert_eq!(other, actual, "{path} changed"),
    }
}

#[test]
fn plain_data_parallelism_reproduces_the_ddp_lowering_to_the_last_bit() {
    // The quickstart's `run --json` as the data-parallel lowering printed it before the
    // strategy layer (commit 994d157; regenerated when NCCL's tree became `auto`'s choice, a
    // collective-model change, again when `run` took NCCL's protocols and tuner by default, and
    // when convolutions paid cuDNN's helper kernels: +12 us, the three of the RGB layer's SIMT
    // backward-weight, and when strided backward-data wrote its unreached positions' zeros and
    // 2-D SIMT backward-weight split until its tiles fill the device: +53 us, and when the A100 80 GB's
    // matrix units ran at their sustained fraction: +475 us): every number must stay identical.
    let pinned: serde_json::Value = serde_json::from_str(include_str!("pinned/quickstart-ddp.json")).unwrap();
    let output = parasim(&["run", "scenarios/quickstart.toml", "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let actual: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_contains(&pinned, &actual, "");
}

/// HyPar-Flow's hybrid (scenarios/hyparflow/): ResNet-1001 pipelined over 4 CPU nodes with
/// micro-batches of 8, whose thousands of kernel launches per stage make it host-bound.
const HOST_BOUND_PIPELINE: &str = r#"
[cluster]
nodes = 16
gpus-per-node = 1
device = "xeon-8160-2s"
[cluster.network]
topology = "switch"
link-bandwidth = "100 Gb/s"
[workload]
model = "resnet1001"
global-batch = 512
micro-batch = 8
precision = "fp32"
gradient-precision = "fp32"
optimizer = "sgd-momentum"
[parallelism]
allreduce = "ring"
pipeline = 4
[simulation]
fidelity = "analytical"
"#;

#[test]
fn a_host_bound_pipeline_counts_its_host_waits_once_not_also_as_bubble() {
    let path = scenario_file("host-bound-pipeline.toml", HOST_BOUND_PIPELINE);
    let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let b = &json["breakdown"];
    let seconds = |key: &str| b[key].as_f64().unwrap();
    let iteration = json["iteration_time_s"].as_f64().unwrap();
    // Host-bound and bubble are both parts of idle: counting a host wait in the bubble too (as
    // parasim did: bubble 0.372 s + host-bound 0.070 s against 0.373 s idle) breaks this.
    assert!(seconds("host_bound_s") > 0.05 * iteration, "not host-bound: {b}");
    assert!(seconds("bubble_s") > 0.05 * iteration, "no bubble: {b}");
    assert!(
        seconds("bubble_s") + seconds("host_bound_s") <= seconds("idle_s") * (1.0 + 1e-9),
        "bubble and host-bound overlap: {b}"
    );
}

const MEGATRON: &str = r#"
[cluster]
nodes = 4
gpus-per-node = 8
device = "a100-sxm4-80gb"
intra-node = { kind = "nvswitch", bandwidth = "300 GB/s", latency = "0.7 us" }
[cluster.network]
link-bandwidth = "200 Gb/s"
[workload]
model = "megatron-1.7b"
global-batch = 128
micro-batch = 4
optimizer = "adam"
[parallelism]
tensor = 2
sequence-parallel = true
pipeline = 4
virtual-stages = 2
[simulation]
fidelity = "analytical"
"#;

#[test]
fn a_tensor_and_pipeline_scenario_reports_degrees_bubble_and_stages() {
    let path = scenario_file("megatron.toml", MEGATRON);
    let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let strategy = &json["strategy"];
    assert_eq!(strategy["data_parallel"], 4);
    assert_eq!(strategy["tensor"], 2);
    assert_eq!(strategy["pipeline"], 4);
    assert_eq!(strategy["schedule"], "interleaved-1f1b");
    assert_eq!(strategy["micro_batches"], 8);
    let b = &json["breakdown"];
    let iteration = json["iteration_time_s"].as_f64().unwrap();
    let parts = b["compute_s"].as_f64().unwrap()
        + b["exposed_communication_s"].as_f64().unwrap()
        + b["idle_s"].as_f64().unwrap();
    assert!((parts - iteration).abs() <= 1e-9 * iteration, "{parts} vs {iteration}");
    let bubble = b["bubble_s"].as_f64().unwrap();
    assert!(bubble > 0.05 * iteration && bubble <= b["idle_s"].as_f64().unwrap(), "bubble {bubble}");
    let groups = &b["exposed_by_group_s"];
    let by_group: f64 =
        ["tensor", "pipeline", "data", "context", "expert"].iter().map(|k| groups[k].as_f64().unwrap()).sum();
    assert!((by_group - b["exposed_communication_s"].as_f64().unwrap()).abs() < 1e-6 * iteration);
    assert!(groups["tensor"].as_f64().unwrap() > 0.0);
    let stages = json["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 4);
    // 1F1B: the first stage holds the most micro-batches.
    let in_flight: Vec<f64> =
        stages.iter().map(|s| s["peak_micro_batches_in_flight"].as_f64().unwrap()).collect();
    assert!(in_flight.windows(2).all(|w| w[0] >= w[1]), "{in_flight:?}");
    let mfu = json["model_flops_utilization"].as_f64().unwrap();
    assert!(mfu > 0.1 && mfu < 0.8, "{mfu}");

    let text = parasim(&["run", path.to_str().unwrap()]);
    let report = String::from_utf8_lossy(&text.stdout);
    for needle in
        ["tensor 2 (sequence parallel)", "pipeline 4 (interleaved-1f1b", "pipeline bubble", "per stage"]
    {
        assert!(report.contains(needle), "{needle:?} missing from:\n{report}");
    }
}

#[test]
fn bad_strategies_name_the_key_and_what_would_be_valid() {
    let megatron = |from: &str, to: &str| {
        assert!(MEGATRON.contains(from), "{from}");
        MEGATRON.replacen(from, to, 1)
    };
    assert_rejected("tp-heads.toml", &megatron("tensor = 2", "tensor = 5\ndata = 1"), &["parallelism.", "5"]);
    assert_rejected(
        "tp-heads2.toml",
        &megatron("tensor = 2\n", "tensor = 16\n").replace("pipeline = 4", "pipeline = 2"),
        &["parallelism.tensor", "24 attention heads"],
    );
    assert_rejected(
        "too-many-stages.toml",
        &megatron("pipeline = 4", "pipeline = 16")
            .replace("tensor = 2", "tensor = 1")
            .replace("global-batch = 128", "global-batch = 256"),
        &["parallelism.", "24 units to split"],
    );
    assert_rejected(
        "batch.toml",
        &megatron("global-batch = 128", "global-batch = 100"),
        &["workload.global-batch", "multiple of"],
    );
    assert_rejected(
        "both-batches.toml",
        &megatron("global-batch = 128", "global-batch = 128\nbatch-per-device = 4"),
        &["workload.batch-per-device", "global-batch"],
    );
    assert_rejected(
        "per-device-with-tp.toml",
        &megatron("global-batch = 128\nmicro-batch = 4", "batch-per-device = 4"),
        &["workload.batch-per-device", "pure data parallelism"],
    );
    assert_rejected(
        "gpus.toml",
        &megatron("pipeline = 4", "pipeline = 3"),
        &["parallelism.tensor", "does not divide", "32 GPUs"],
    );
    assert_rejected(
        "data.toml",
        &megatron("pipeline = 4", "pipeline = 4\ndata = 2"),
        &["parallelism.data", "32 GPUs"],
    );
    assert_rejected(
        "schedule.toml",
        &megatron("virtual-stages = 2", "virtual-stages = 2\nschedule = \"gpipe\""),
        &["parallelism.virtual-stages", "1f1b"],
    );
    assert_rejected(
        "schedule-name.toml",
        &megatron("virtual-stages = 2", "schedule = \"zb\""),
        &["parallelism.schedule", "gpipe"],
    );
    assert_rejected(
        "order.toml",
        &megatron("virtual-stages = 2", "order = \"tp-dp-pp\""),
        &["parallelism.order", "exactly once"],
    );
    assert_rejected("zero.toml", &megatron("virtual-stages = 2", "zero = 5"), &["parallelism.zero", "FSDP"]);
    let cnn = |from: &str, to: &str| {
        quickstart_with(from, to).replace("batch-per-device = 64", "global-batch = 64")
    };
    assert_rejected(
        "context.toml",
        &cnn("data = 64", "context = 2"),
        &["parallelism.context", "no attention"],
    );
    assert_rejected(
        "expert.toml",
        &megatron("virtual-stages = 2", "expert = 2"),
        &["parallelism.expert", "no mixture-of-experts"],
    );
    assert_rejected(
        "tp-cnn.toml",
        &cnn("data = 64", "tensor = 2"),
        &["parallelism.tensor", "conv2d", "transformer layers"],
    );
    assert_rejected(
        "sequence.toml",
        &megatron("model = \"megatron-1.7b\"", "model = \"resnet50\"\nsequence-length = 4096"),
        &["workload.sequence-length", "no `sequence`"],
    );
    assert_rejected(
        "micro.toml",
        &megatron("micro-batch = 4", "micro-batch = 0"),
        &["workload.micro-batch", "at least 1"],
    );
}

#[test]
fn bad_cnn_strategies_name_the_key_and_what_would_be_valid() {
    let cnn = |from: &str, to: &str| {
        quickstart_with(from, to).replace("batch-per-device = 64", "global-batch = 256\nmicro-batch = 16")
    };
    for key in ["filter", "channel", "spatial"] {
        assert_rejected(
            &format!("{key}-zero.toml"),
            &cnn("data = 64", &format!("{key} = 0")),
            &[&format!("parallelism.{key}"), "at least 1"],
        );
    }
    assert_rejected(
        "spatial-dims.toml",
        &cnn("data = 64", "spatial = 4\nspatial-dims = \"xy\""),
        &["parallelism.spatial-dims", "\"hw\""],
    );
    assert_rejected(
        "spatial-dims-3d.toml",
        &cnn("data = 64", "spatial = 4\nspatial-dims = \"dhw\""),
        &["parallelism.spatial-dims", "\"h\", \"hw\""],
    );
    assert_rejected(
        "spatial-too-many.toml",
        &cnn("data = 64", "spatial = 8"),
        &["parallelism.spatial", "7 positions along the height"],
    );
    assert_rejected(
        "channel-rgb.toml",
        &cnn("data = 64", "channel = 4"),
        &["parallelism.channel", "conv1 has 3 input channels", "valid: 1 to 3"],
    );
    assert_rejected(
        "filter-channel.toml",
        &cnn("data = 64", "filter = 2\nchannel = 2"),
        &["parallelism.filter", "one CNN strategy"],
    );
    assert_rejected(
        "filter-tensor.toml",
        &cnn("data = 64", "filter = 2\ntensor = 2"),
        &["parallelism.filter", "tensor = 2 is not supported yet"],
    );
    assert_rejected(
        "filter-gpus.toml",
        &cnn("data = 64", "filter = 3"),
        &["parallelism.filter", "filter = 3", "does not divide", "64 GPUs"],
    );
    assert_rejected(
        "filter-per-device.toml",
        &quickstart_with("data = 64", "filter = 4"),
        &["workload.batch-per-device", "filter, channel or spatial"],
    );
    let transformer = MEGATRON.replace("tensor = 2", "filter = 2").replace("pipeline = 4", "pipeline = 1");
    assert_rejected("filter-gpt.toml", &transformer, &["parallelism.filter"]);
}

#[test]
fn bad_cnn_transports_name_the_key_and_what_would_be_valid() {
    let cnn = |from: &str, to: &str| {
        quickstart_with(from, to).replace("batch-per-device = 64", "global-batch = 256\nmicro-batch = 16")
    };
    assert_rejected(
        "cnn-transport-unknown.toml",
        &cnn("data = 64", "data = 16\nfilter = 4\ncnn-transport = \"nccl\""),
        &["parallelism.cnn-transport", "\"nccl\"", "\"device\"", "\"mpi\"", "\"mpi-managed\""],
    );
    assert_rejected(
        "cnn-transport-no-rate.toml",
        &cnn("data = 64", "data = 16\nfilter = 4\ncnn-transport = \"mpi\""),
        &["parallelism.cnn-staging-rate", "is missing", "\"mpi\""],
    );
    assert_rejected(
        "cnn-transport-no-cnn.toml",
        &cnn("data = 64", "data = 64\ncnn-transport = \"mpi-managed\"\ncnn-staging-rate = \"1 GB/s\""),
        &["parallelism.cnn-transport", "filter, channel or spatial"],
    );
    assert_rejected(
        "cnn-rate-without-mpi.toml",
        &cnn("data = 64", "data = 16\nfilter = 4\ncnn-staging-rate = \"1 GB/s\""),
        &["parallelism.cnn-staging-rate", "\"mpi\" or \"mpi-managed\" only"],
    );
    assert_rejected(
        "cnn-rate-too-low.toml",
        &cnn("data = 64", "data = 16\nfilter = 4\ncnn-transport = \"mpi\"\ncnn-staging-rate = \"1 kB/s\""),
        &["parallelism.cnn-staging-rate", "at least 1 MB/s"],
    );
}

#[test]
fn cnn_strategies_run_and_split_the_memory() {
    let run = |name: &str, to: &str| -> serde_json::Value {
        let text = quickstart_with("data = 64", to)
            .replace("batch-per-device = 64", "global-batch = 512\nmicro-batch = 16");
        let path = scenario_file(name, &text);
        let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let weights = |json: &serde_json::Value| json["stages"][0]["memory"]["weights"].as_f64().unwrap();
    let activations = |json: &serde_json::Value| json["stages"][0]["memory"]["activations"].as_f64().unwrap();
    let filter = run("filter.toml", "filter = 4");
    let spatial = run("spatial.toml", "spatial = 4");
    let channel = run("channel.toml", "channel = 2\ndata = 32");
    assert_eq!(filter["strategy"]["filter"], 4);
    assert_eq!(spatial["strategy"]["spatial_dims"], "h");
    // Filter shards the convolutions' weights (batch norms stay whole); spatial replicates
    // them and splits the activations of the convolutional part.
    assert!(weights(&filter) < 0.3 * weights(&spatial), "{} vs {}", weights(&filter), weights(&spatial));
    assert!(weights(&channel) < 0.6 * weights(&spatial));
    assert!(
        activations(&spatial) < 0.3 * activations(&filter),
        "{} vs {}",
        activations(&spatial),
        activations(&filter)
    );
}

#[test]
fn sequence_length_overrides_the_models_and_gradient_accumulation_runs_with_data_parallelism() {
    let longer = MEGATRON.replacen(
        "model = \"megatron-1.7b\"",
        // Selective recomputation: the attention scores of 4096 tokens (5 a s^2 b with attention
        // dropout) would not fit otherwise.
        "model = \"megatron-1.7b\"\nsequence-length = 4096\nrecompute = \"selective\"",
        1,
    );
    let path = scenario_file("longer.toml", &longer);
    let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let base = parasim(&["run", scenario_file("base.toml", MEGATRON).to_str().unwrap(), "--json"]);
    let base: serde_json::Value = serde_json::from_slice(&base.stdout).unwrap();
    let flops = |j: &serde_json::Value| j["model_flops_per_iteration"].as_f64().unwrap();
    // Twice the tokens: more than twice the FLOPs (attention grows with the square).
    assert!(flops(&json) > 2.0 * flops(&base));

    let accumulated = quickstart_with("batch-per-device = 64", "batch-per-device = 64\nmicro-batch = 16");
    let output =
        parasim(&["run", scenario_file("accumulate.toml", &accumulated).to_str().unwrap(), "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["strategy"]["micro_batches"], 4);
    let plain = parasim(&["run", QUICKSTART, "--json"]);
    let plain: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    // Four smaller micro-batches hold a quarter of the activations.
    let activations = |j: &serde_json::Value| j["memory"]["activations"].as_u64().unwrap();
    assert_eq!(activations(&plain), 4 * activations(&json));
}

#[test]
fn folding_symmetric_ranks_gives_the_full_graphs_result_at_64_gpus() {
    // 64 GPUs under the flow model: tensor 2 x data 32 (identical results), and tensor 2 x
    // pipeline 4 x data 8 on a switch and on an ECMP leaf-spine (within 50 parts per million).
    let scenario = |fabric: &str| {
        MEGATRON
            .replace("nodes = 4", "nodes = 8")
            .replace("link-bandwidth = \"200 Gb/s\"", &format!("{fabric}\nlink-bandwidth = \"200 Gb/s\""))
            .replace("global-batch = 128", "global-batch = 256")
            .replace("fidelity = \"analytical\"", "fidelity = \"flow\"")
    };
    let run = |text: &str, fold: bool| -> serde_json::Value {
        let text = text.replace("[simulation]", &format!("[simulation]\nfold-symmetric-ranks = {fold}"));
        let path = scenario_file(&format!("fold-{fold}-{}.toml", text.len()), &text);
        let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let mut json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let ops = json["engine"]["ops"].as_u64().unwrap();
        json.as_object_mut().unwrap().remove("engine");
        json.as_object_mut().unwrap().remove("scenario");
        json["ops"] = ops.into();
        json
    };
    let iteration = |j: &serde_json::Value| j["iteration_time_s"].as_f64().unwrap();
    let ops = |j: &mut serde_json::Value| j.as_object_mut().unwrap().remove("ops").unwrap().as_u64().unwrap();
    // Tensor x data on a switch: every replica and tensor rank sees the same network.
    let symmetric = scenario("topology = \"switch\"").replace("pipeline = 4\nvirtual-stages = 2", "");
    let (mut folded, mut full) = (run(&symmetric, true), run(&symmetric, false));
    assert_eq!(full["cluster"]["gpus"], 64);
    let (folded_ops, full_ops) = (ops(&mut folded), ops(&mut full));
    assert!(folded_ops * 10 < full_ops, "{folded_ops} vs {full_ops}");
    assert_eq!(folded, full);
    // With a pipeline, a stage's sends share NICs with the data-parallel ring's channels, which
    // NCCL's rail-aligned rings load unevenly; ECMP hashes each flow to its own spine: the
    // replicas differ by microseconds (parts per million), which folding does not see.
    for fabric in ["topology = \"switch\"", "topology = \"leaf-spine\"\nradix = 16"] {
        let text = scenario(fabric);
        let (mut folded, mut full) = (run(&text, true), run(&text, false));
        let (folded_ops, full_ops) = (ops(&mut folded), ops(&mut full));
        assert!(folded_ops * 10 < full_ops, "{folded_ops} vs {full_ops}");
        let difference = (iteration(&folded) / iteration(&full) - 1.0).abs();
        assert!(
            difference < 5e-5,
            "{fabric}: folded {} s vs full {} s",
            iteration(&folded),
            iteration(&full)
        );
    }
}

#[test]
fn the_trace_shows_stages_as_processes_and_micro_batches_as_slices() {
    let one_f_one_b = MEGATRON.replace("virtual-stages = 2", "virtual-stages = 1");
    let path = scenario_file("trace-1f1b.toml", &one_f_one_b);
    let trace = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("trace-1f1b.json");
    let output = parasim(&["run", path.to_str().unwrap(), "--trace", trace.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&fs_err::read(&trace).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let processes: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    // Folded: one simulated rank per stage.
    assert_eq!(processes.len(), 4, "{processes:?}");
    assert!(processes[3].starts_with("stage 3"), "{processes:?}");
    // The last stage runs 1F1B without warm-up: F0 B0 F1 B1 ...; the first warms up with 3.
    let steps = |pid: u64| -> Vec<String> {
        let mut spans: Vec<(f64, String)> = events
            .iter()
            .filter(|e| e["cat"] == "span" && e["pid"] == pid)
            .map(|e| (e["ts"].as_f64().unwrap(), e["name"].as_str().unwrap().to_string()))
            .collect();
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        spans.into_iter().map(|(_, name)| name).collect()
    };
    let last_stage = 3 * 8; // tensor 2 x data 4 ranks per stage
    assert_eq!(&steps(last_stage)[..4], ["F0", "B0", "F1", "B1"]);
    assert_eq!(&steps(0)[..5], ["F0", "F1", "F2", "F3", "B0"]);
    assert_eq!(steps(0).len(), 16);
}

#[test]
fn what_if_device_scales_speed_up_compute_and_refuse_nonsense() {
    let compute = |extra: &str| -> f64 {
        let text = super::quickstart_with(
            "device = \"a100-sxm4-80gb\"",
            &format!("device = \"a100-sxm4-80gb\"\n{extra}"),
        );
        let path = super::scenario_file(&format!("scale-{}.toml", extra.len()), &text);
        let output = parasim(&["run", path.to_str().unwrap(), "--json"]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        json["breakdown"]["compute_s"].as_f64().unwrap()
    };
    let base = compute("");
    let both = compute("flops-scale = 2\nmemory-bandwidth-scale = 2");
    let flops = compute("flops-scale = 2");
    // Every kernel is bound by one of the two rates plus fixed ramps and launches: twice both
    // rates takes a little over half the time; twice the FLOP/s alone helps less.
    assert!(both > 0.5 * base && both < 0.6 * base, "{both} vs {base}");
    assert!(flops < base && flops > both, "{flops} vs {base}, {both}");
    let text =
        super::quickstart_with("device = \"a100-sxm4-80gb\"", "device = \"a100-sxm4-80gb\"\nflops-scale = 0");
    let path = super::scenario_file("scale-zero.toml", &text);
    let output = parasim(&["run", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cluster.flops-scale"));
}

/// `run --trace x.json.gz` writes gzip (it used to write plain JSON under a `.gz` name), and
/// each collective carries the algorithm and protocol NCCL's tuner chose, never `auto`: the
/// quickstart's allreduces, analytical and flow.
#[test]
fn a_gz_trace_is_gzip_and_names_the_chosen_algorithm_and_protocol() {
    use std::io::Read as _;
    for fidelity in ["analytical", "flow"] {
        let trace =
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chosen-{fidelity}.json.gz"));
        let output = parasim(&[
            "run",
            super::QUICKSTART,
            "--set",
            &format!("simulation.fidelity=\"{fidelity}\""),
            "--trace",
            trace.to_str().unwrap(),
        ]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let bytes = fs_err::read(&trace).unwrap();
        assert!(bytes.starts_with(&[0x1f, 0x8b]), "{fidelity}: not gzip");
        let mut text = String::new();
        flate2::read::GzDecoder::new(&bytes[..]).read_to_string(&mut text).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let collectives: Vec<&serde_json::Value> =
            json["traceEvents"].as_array().unwrap().iter().filter(|e| e["cat"] == "collective").collect();
        assert!(!collectives.is_empty(), "{fidelity}");
        for event in collectives {
            let algorithm = event["args"]["algorithm"].as_str().unwrap();
            assert!(["ring", "tree"].contains(&algorithm), "{fidelity}: {algorithm} in {event}");
            let protocol = event["args"]["protocol"].as_str().unwrap_or_else(|| panic!("{event}"));
            assert!(["LL", "LL128", "Simple"].contains(&protocol), "{fidelity}: {protocol}");
        }
    }
}
