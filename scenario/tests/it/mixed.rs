//! Node groups of different devices (`[[cluster.node-groups]]`) end to end: synchronous steps
//! wait for the slowest device, stages balanced by device speed, per-type utilisation, errors.

use std::path::Path;

use scenario::Scenario;
use scenario::simulation::{Summary, simulate};

/// The quickstart (ResNet-50, data parallel) on 2 servers of 4 GPUs, with `cluster` in place
/// of its `device` line (`""`: the quickstart's A100s).
fn data_parallel(cluster: &str) -> Result<Scenario, scenario::ScenarioError> {
    let mut text = scenario::QUICKSTART
        .replace("nodes = 8", "nodes = 2")
        .replace("gpus-per-node = 8", "gpus-per-node = 4")
        .replace("data = 64", "data = 8");
    if !cluster.is_empty() {
        text = text
            .replace("device = \"a100-sxm4-80gb\"\n", "")
            .replace("[cluster.network]", &format!("{cluster}\n[cluster.network]"));
    }
    Scenario::parse(&text, Path::new("mixed.toml"))
}

const HALF_AND_HALF: &str = "[[cluster.node-groups]]\nnodes = 1\ndevice = \"a100-sxm4-80gb\"\n\
                             [[cluster.node-groups]]\nnodes = 1\ndevice = \"h100-sxm5-80gb\"";

fn run(scenario: &Scenario) -> Summary {
    simulate(scenario).unwrap().summary
}

fn compute_share(summary: &Summary) -> f64 {
    summary.breakdown.compute.as_secs_f64() / summary.iteration_time.as_secs_f64()
}

#[test]
fn synchronous_data_parallelism_on_half_a100_half_h100_steps_as_all_a100() {
    let mixed = run(&data_parallel(HALF_AND_HALF).unwrap());
    let a100 = run(&data_parallel("").unwrap());
    let mut h100_table: toml::Table = toml::from_str(
        &scenario::QUICKSTART
            .replace("nodes = 8", "nodes = 2")
            .replace("gpus-per-node = 8", "gpus-per-node = 4")
            .replace("data = 64", "data = 8")
            .replace("a100-sxm4-80gb", "h100-sxm5-80gb"),
    )
    .unwrap();
    h100_table.remove("simulation");
    let h100 = run(&Scenario::from_table(&h100_table, Path::new("h100.toml")).unwrap());
    // Every bucket's allreduce waits for the A100s' backward: the same step to the picosecond.
    assert_eq!(mixed.iteration_time, a100.iteration_time);
    assert!(h100.iteration_time < a100.iteration_time);
    // Two device types, four GPUs each; the A100s compute as in the all-A100 run, the H100s
    // their own compute (the all-H100 run's) in the A100s' step.
    let [slow, fast] = &mixed.devices[..] else { panic!("{:?}", mixed.devices) };
    assert!(slow.device.starts_with("A100") && fast.device.starts_with("H100"));
    assert_eq!((slow.gpus, fast.gpus), (4, 4));
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    assert!(close(slow.busy, compute_share(&a100)), "{} {}", slow.busy, compute_share(&a100));
    let h100_busy = h100.breakdown.compute.as_secs_f64() / mixed.iteration_time.as_secs_f64();
    assert!(close(fast.busy, h100_busy), "{} {h100_busy}", fast.busy);
    assert!(slow.busy > 0.9 && fast.busy < 0.75 * slow.busy, "{} {}", slow.busy, fast.busy);
    // Same work in the same step: the same achieved rate, a lower MFU on the faster device.
    assert!(close(slow.achieved_tflops_per_device, fast.achieved_tflops_per_device));
    assert!(fast.mfu < slow.mfu);
}

#[test]
fn per_type_utilisation_adds_up_to_the_cluster_means() {
    let mixed = run(&data_parallel(HALF_AND_HALF).unwrap());
    let gpus = f64::from(mixed.cluster.gpus);
    let weighted = |field: fn(&scenario::mixed::DeviceUtilisation) -> f64| {
        mixed.devices.iter().map(|d| field(d) * f64::from(d.gpus)).sum::<f64>() / gpus
    };
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs();
    assert!(close(weighted(|d| d.busy), compute_share(&mixed)));
    assert!(close(weighted(|d| d.achieved_tflops_per_device), mixed.achieved_tflops_per_device));
    assert!(close(weighted(|d| d.peak_tflops_per_device), mixed.peak_tflops_per_device));
    assert!(mixed.cluster.device.starts_with("mixed (4 x A100-SXM4-80GB + 4 x H100-SXM5-80GB)"));
    // The JSON carries them; a run on one device type leaves the field out.
    let json = serde_json::to_string(&mixed).unwrap();
    assert!(json.contains("\"devices\":[{\"device\":\"A100-SXM4-80GB\""), "{json}");
    let plain = serde_json::to_string(&run(&data_parallel("").unwrap())).unwrap();
    assert!(!plain.contains("\"devices\""));
}

/// Megatron-LM's 1.7B GPT in 2 pipeline stages, one server of 1 GPU each: an A100 first, an
/// H100 second; `placement` is `parallelism.stage-placement`.
fn pipeline(placement: &str) -> Scenario {
    let text = format!(
        "[cluster]\nnodes = 2\ngpus-per-node = 1\n\
         [[cluster.node-groups]]\nnodes = 1\ndevice = \"a100-sxm4-80gb\"\n\
         [[cluster.node-groups]]\nnodes = 1\ndevice = \"h100-sxm5-80gb\"\n\
         [workload]\nmodel = \"megatron-1.7b\"\nglobal-batch = 8\nmicro-batch = 1\nprecision = \"bf16\"\n\
         [parallelism]\npipeline = 2\nstage-placement = \"{placement}\"\n"
    );
    Scenario::parse(&text, Path::new("pipeline.toml")).unwrap()
}

#[test]
fn by_speed_stages_give_the_slower_device_fewer_layers_and_a_shorter_step() {
    let in_order = run(&pipeline("in-order"));
    let by_speed = run(&pipeline("by-speed"));
    // 24 blocks: 12 and 12 in order; by speed the A100's stage holds fewer.
    assert_eq!((in_order.stages[0].blocks, in_order.stages[1].blocks), (12, 12));
    assert!(by_speed.stages[0].blocks < 12, "{}", by_speed.stages[0].blocks);
    assert_eq!(by_speed.stages[0].blocks + by_speed.stages[1].blocks, 24);
    assert!(
        by_speed.iteration_time.as_secs_f64() < 0.9 * in_order.iteration_time.as_secs_f64(),
        "{} against {}",
        by_speed.iteration_time,
        in_order.iteration_time
    );
    // Balanced, the two devices are about as busy; in order the H100 waits.
    let busy = |s: &Summary| (s.devices[0].busy, s.devices[1].busy);
    let (a, h) = busy(&in_order);
    assert!(h < 0.75 * a, "{a} {h}");
    let (a, h) = busy(&by_speed);
    assert!((a - h).abs() < 0.25 * a, "{a} {h}");
}

#[test]
fn node_group_errors_name_their_key() {
    let cases = [
        (HALF_AND_HALF.replace("h100-sxm5-80gb", "h100-sxm9"), "cluster.node-groups[1].device"),
        (HALF_AND_HALF.replacen("nodes = 1", "nodes = 2", 1), "cluster.node-groups"),
        (HALF_AND_HALF.replacen("nodes = 1", "nodes = 0", 1), "cluster.node-groups[0].nodes"),
        (format!("device = \"a100-sxm4-80gb\"\n{HALF_AND_HALF}"), "cluster.device"),
        (HALF_AND_HALF.replace("h100-sxm5-80gb", "mi300x"), "cluster.node-groups[1].device"),
        (format!("{HALF_AND_HALF}\n[compute]\nprofile = \"a100-sxm4-80gb\""), "compute.profile"),
    ];
    for (cluster, key) in cases {
        let error = data_parallel(&cluster).unwrap_err().to_string();
        assert!(error.contains(&format!("key `{key}`")), "{key}: {error}");
    }
    let error = data_parallel(&HALF_AND_HALF.replacen("nodes = 1", "node = 1", 1)).unwrap_err().to_string();
    assert!(error.contains("unknown field `node`"), "{error}");
    // Without groups or a device, the device is missing.
    let error = data_parallel("# none").unwrap_err().to_string();
    assert!(error.contains("key `cluster.device`") && error.contains("node-groups"), "{error}");
    let by_speed =
        scenario::QUICKSTART.replace("[parallelism]", "[parallelism]\nstage-placement = \"by-speed\"");
    let error = Scenario::parse(&by_speed, Path::new("q.toml")).unwrap_err().to_string();
    assert!(error.contains("key `parallelism.stage-placement`"), "{error}");
    let folded = data_parallel(HALF_AND_HALF).map(|_| ()).and_then(|()| {
        let text = scenario::QUICKSTART
            .replace("nodes = 8", "nodes = 2")
            .replace("gpus-per-node = 8", "gpus-per-node = 4")
            .replace("data = 64", "data = 8")
            .replace("device = \"a100-sxm4-80gb\"\n", "")
            .replace("[cluster.network]", &format!("{HALF_AND_HALF}\n[cluster.network]"))
            .replace("iterations = 1", "iterations = 1\nfold-symmetric-ranks = true");
        Scenario::parse(&text, Path::new("f.toml")).map(|_| ())
    });
    assert!(folded.unwrap_err().to_string().contains("key `simulation.fold-symmetric-ranks`"));
}

#[test]
fn a_group_whose_device_memory_is_too_small_is_named() {
    // ResNet-50 at 400 samples per GPU fits 80 GB, not a 16 GB V100.
    let cluster = HALF_AND_HALF.replace("h100-sxm5-80gb", "v100-sxm2-16gb");
    let scenario = data_parallel(&cluster).unwrap();
    let mut big = scenario.clone();
    big.global_batch = 8 * 400;
    big.micro_batch = 400;
    let Err(error) = simulate(&big) else { panic!("fits") };
    let error = error.to_string();
    assert!(error.contains("cluster.node-groups[1] (v100-sxm2-16gb)"), "{error}");
}

/// A stage on the larger device may need more than the first group's device has: GPT 1.7B in
/// a 2-stage pipeline by speed over a server of A100-SXM4-40GB and one of H100-SXM5-80GB gives
/// the H100 stage more blocks and more memory than an A100-40GB holds; it runs, each stage
/// checked against its own group's device only (it was refused against the A100's).
#[test]
fn a_stage_larger_than_the_first_groups_device_runs_on_its_own_larger_device() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/mixed/plan-a100-40gb-h100.toml");
    let mut table: toml::Table = toml::from_str(&fs_err::read_to_string(&file).unwrap()).unwrap();
    let changes: Vec<scenario::Override> =
        ["workload.micro-batch=2", "parallelism.zero=0", "parallelism.data=4", "parallelism.pipeline=2"]
            .iter()
            .map(|text| text.parse().unwrap())
            .collect();
    scenario::apply(&mut table, &changes).unwrap();
    let scenario = Scenario::from_table(&table, &file).unwrap();
    let groups = scenario.node_groups.as_deref().unwrap();
    let (a100, h100) = (&groups.groups[0].device, &groups.groups[1].device);
    let summary = run(&scenario);
    let last = summary.stages.last().unwrap().memory.total;
    assert!(
        last > a100.memory_capacity.0 && last <= h100.memory_capacity.0,
        "the last stage needs {last} bytes: not the case this test is about"
    );
    assert!(summary.stages[0].memory.total <= a100.memory_capacity.0);
}

/// The rate of each direction of server `node`'s intra-node links in `scenario`'s fabric (all
/// of them must agree).
fn intra_node_rate(scenario: &Scenario, node: u32) -> f64 {
    let topology = scenario::simulation::topology(scenario).unwrap();
    let graph = topology.graph();
    let mut rates: Vec<f64> = graph
        .edge_indices()
        .filter(|&edge| {
            let (from, to) = graph.edge_endpoints(edge).unwrap();
            let inside = |v| match graph[v] {
                topology::Vertex::Gpu { node: n, .. } | topology::Vertex::NodeSwitch { node: n } => n == node,
                _ => false,
            };
            graph[edge].tier == topology::Tier::IntraNode && inside(from) && inside(to)
        })
        .map(|edge| graph[edge].bandwidth.bytes_per_second())
        .collect();
    rates.dedup();
    assert_eq!(rates.len(), 1, "server {node}'s links: {rates:?}");
    rates[0]
}

#[test]
fn each_groups_servers_keep_their_own_devices_links_unless_a_key_sets_one_rate() {
    // Without cluster.intra-node.bandwidth each server's NVLink is its own device's: half its
    // both-directions NVLink bandwidth each way (A100 600 GB/s, H100 900 GB/s in the catalog).
    let line = "intra-node = { kind = \"nvswitch\", bandwidth = \"300 GB/s\", latency = \"0.7 us\" }\n";
    let shape = |text: String| {
        text.replace("nodes = 8", "nodes = 2")
            .replace("data = 64", "data = 16")
            .replace("device = \"a100-sxm4-80gb\"\n", "")
            .replace("[cluster.network]", &format!("{HALF_AND_HALF}\n[cluster.network]"))
    };
    // The same latency, no bandwidth: each server's own.
    let text =
        scenario::QUICKSTART.replace(line, "intra-node = { kind = \"nvswitch\", latency = \"0.7 us\" }\n");
    assert_ne!(text, scenario::QUICKSTART, "the quickstart's intra-node line moved");
    let own = Scenario::parse(&shape(text), Path::new("mixed.toml")).unwrap();
    let groups = own.node_groups.as_ref().unwrap();
    let each_way =
        |group: usize| groups.groups[group].device.gpu_link_bandwidth().unwrap().bytes_per_second() / 2.0;
    assert!(each_way(1) > each_way(0), "the H100's NVLink is faster than the A100's");
    assert_eq!(intra_node_rate(&own, 0), each_way(0));
    assert_eq!(intra_node_rate(&own, 1), each_way(1));
    // The key sets one rate for every server (the A100's, 300 GB/s each way).
    let keyed = Scenario::parse(&shape(scenario::QUICKSTART.to_string()), Path::new("mixed.toml")).unwrap();
    assert_eq!(each_way(0), 300e9);
    assert_eq!(intra_node_rate(&keyed, 0), 300e9);
    assert_eq!(intra_node_rate(&keyed, 1), 300e9);
    // Faster links on the H100 server never slow the step.
    let (own_run, keyed_run) = (run(&own), run(&keyed));
    assert!(own_run.iteration_time <= keyed_run.iteration_time);
    // The report names each device's rate, or the one rate the key sets.
    assert_eq!(
        own_run.cluster.intra_node,
        "nvswitch (300 GB/s on A100-SXM4-80GB, 450 GB/s on H100-SXM5-80GB) 700 ns"
    );
    assert_eq!(keyed_run.cluster.intra_node, "nvswitch 300 GB/s 700 ns");
}
