//! HyPar-Flow's scaling study (scenarios/hyparflow/): ResNet-1001 on 1 to 128 Stampede2-like
//! CPU nodes, data parallel against the hybrid, next to the paper's 110x over one node.

use super::parasim;

#[test]
fn resnet_1001_data_parallel_on_128_cpu_nodes_scales_near_the_papers_110x() {
    let sweep = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/hyparflow/scaling.toml");
    let output = parasim(&["sweep", sweep, "--columns", "samples_per_second", "-j", "2"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    // index, nodes, pipeline, data, global batch, micro-batch, samples/s, status, error
    let rows: Vec<Vec<&str>> = text.lines().skip(2).map(|l| l.split(',').collect()).collect();
    let throughput = |nodes: &str, pipeline: &str| -> f64 {
        let row = rows.iter().find(|r| r[1] == nodes && r[2] == pipeline).unwrap();
        assert_eq!(row[7], "ok", "{row:?}");
        row[6].parse().unwrap()
    };
    let one = throughput("1", "1");
    let data = throughput("128", "1") / one;
    let hybrid = throughput("128", "4") / one;
    // The paper: 110x at 128 nodes (its configuration is not published; 32 samples per node
    // assumed). Weak scaling cannot exceed the node count.
    assert!(data > 0.8 * 110.0 && data <= 128.0, "data parallel {data:.1}x");
    // parasim's hybrid pays micro-batch 8 kernels, 16 times the launches and the bubble; the
    // paper's 1.6x gain over data parallelism is not reproduced (docs/strategies.md).
    assert!(hybrid < data, "hybrid {hybrid:.1}x, data parallel {data:.1}x");
    println!("speedup over one node at 128: data parallel {data:.1}x, hybrid {hybrid:.1}x (paper: 110x)");
}
