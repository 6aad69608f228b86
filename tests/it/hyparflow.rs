//! HyPar-Flow's scaling studies (scenarios/hyparflow/): ResNet-1001 on 1 to 128 Stampede2-like
//! and 1 to 512 Frontera-like CPU nodes, data parallel against the hybrid, next to the paper's
//! 110x and 481x over one node.

use super::parasim;

/// Throughput over one node at `nodes`, data parallel and hybrid (4 partitions), from `sweep`.
fn speedups(sweep: &str, nodes: &str) -> (f64, f64) {
    let sweep = format!("{}/scenarios/hyparflow/{sweep}", env!("CARGO_MANIFEST_DIR"));
    let output = parasim(&["sweep", &sweep, "--columns", "samples_per_second", "-j", "2"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    // index, nodes, pipeline, data, global batch, micro-batch, samples/s, status, error
    let records = scenario::csv_text::records(&text).unwrap();
    let rows: Vec<Vec<&str>> =
        records.iter().skip(1).map(|(_, cells)| cells.iter().map(String::as_str).collect()).collect();
    let throughput = |nodes: &str, pipeline: &str| -> f64 {
        let row = rows.iter().find(|r| r[1] == nodes && r[2] == pipeline).unwrap();
        assert_eq!(row[7], "ok", "{row:?}");
        row[6].parse().unwrap()
    };
    let one = throughput("1", "1");
    (throughput(nodes, "1") / one, throughput(nodes, "4") / one)
}

#[test]
fn resnet_1001_data_parallel_on_128_cpu_nodes_scales_near_the_papers_110x() {
    let (data, hybrid) = speedups("scaling.toml", "128");
    // The paper: 110x at 128 nodes (its configuration is not published; 32 samples per node
    // assumed). Weak scaling cannot exceed the node count.
    assert!(data > 0.8 * 110.0 && data <= 128.0, "data parallel {data:.1}x");
    // parasim's hybrid pays micro-batch 8 kernels, 16 times the launches and the bubble; the
    // paper's 1.6x gain over data parallelism is not reproduced (docs/strategies.md).
    assert!(hybrid < data, "hybrid {hybrid:.1}x, data parallel {data:.1}x");
    println!(
        "Stampede2, speedup over one node at 128: data parallel {data:.1}x, hybrid {hybrid:.1}x (paper: 110x)"
    );
}

#[test]
fn resnet_1001_data_parallel_on_512_frontera_nodes_scales_near_the_papers_481x() {
    let (data, hybrid) = speedups("frontera-scaling.toml", "512");
    // The paper: 481x at 512 nodes, configuration unpublished (32 samples per node assumed).
    assert!(data > 0.8 * 481.0 && data <= 512.0, "data parallel {data:.1}x");
    assert!(hybrid < data, "hybrid {hybrid:.1}x, data parallel {data:.1}x");
    println!(
        "Frontera, speedup over one node at 512: data parallel {data:.1}x, hybrid {hybrid:.1}x (paper: 481x)"
    );
}

/// `run --json` of a scenario of scenarios/hyparflow/.
fn run_json(file: &str) -> serde_json::Value {
    let path = format!("{}/scenarios/hyparflow/{file}", env!("CARGO_MANIFEST_DIR"));
    let output = parasim(&["run", &path, "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn one_rank_per_socket_does_the_nodes_work_in_halves_and_adds_the_socket_hop() {
    let node = run_json("stampede2.toml");
    let socket = run_json("stampede2-per-socket.toml");
    let f = |json: &serde_json::Value, key: &str| json[key].as_f64().unwrap();
    // Each socket has half the cores and half the batch: the same compute per iteration,
    // to the kernels' size effects (a 16-image kernel is a little less efficient).
    let (node_compute, socket_compute) = (
        node["breakdown"]["compute_s"].as_f64().unwrap(),
        socket["breakdown"]["compute_s"].as_f64().unwrap(),
    );
    assert!((socket_compute / node_compute - 1.0).abs() < 0.02, "{socket_compute} s vs {node_compute} s");
    assert!((f(&socket, "peak_tflops_per_device") * 2.0 - f(&node, "peak_tflops_per_device")).abs() < 1e-9);
    // Twice the ranks in the ring: the gradients also cross each node's UPI link, so the
    // allreduce takes longer over the same network.
    let comm = |json: &serde_json::Value| json["breakdown"]["communication_s"].as_f64().unwrap();
    assert!(comm(&socket) > comm(&node), "{} s vs {} s", comm(&socket), comm(&node));
    assert!((f(&socket, "samples_per_second") / f(&node, "samples_per_second") - 1.0).abs() < 0.02);
}

/// A CPU cluster's report counts CPUs, not GPUs: the catalog's `kind = "cpu"` reaches every
/// line of `run`, `plan`, `topo` and `collective` that names the device, and a node of one device has no intra-node link to describe.
#[test]
fn reports_on_cpu_nodes_speak_of_cpus() {
    let path = format!("{}/scenarios/hyparflow/frontera.toml", env!("CARGO_MANIFEST_DIR"));
    let output = parasim(&["run", &path]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(!text.contains("GPU"), "{text}");
    for expected in [
        "= 16 nodes x 1 CPU\n",
        "intra-node none (one CPU per node); network switch, 100 Gb/s 1 us per CPU",
        "batch 32 per CPU",
        "per iteration, mean over CPUs",
    ] {
        assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
    }
    assert_eq!(run_json("frontera.toml")["cluster"]["device_kind"], "cpu");
    let output =
        parasim(&["plan", "--model", "resnet1001", "--cluster", &path, "--gpus", "16", "--top", "2"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let plan = String::from_utf8(output.stdout).unwrap();
    assert!(!plan.contains("GPU"), "{plan}");
    assert!(plan.contains("(1 CPU per node)") && plan.contains("samples/s/CPU"), "{plan}");
    for (arguments, expected) in [
        (
            vec!["topo", &path],
            vec![
                "= 16 nodes x 1 CPU, intra-node none (one CPU per node)\n",
                "hosts:      16 CPUs in 16 nodes",
            ],
        ),
        (
            vec!["collective", "allreduce", "--cluster", &path, "-b", "1K", "-e", "1K"],
            vec!["(16 nodes x 1 CPU)", "1 CPU(s) per process"],
        ),
    ] {
        let output = parasim(&arguments);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let text = String::from_utf8(output.stdout).unwrap();
        assert!(!text.contains("GPU"), "{text}");
        for expected in expected {
            assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
        }
    }
}
