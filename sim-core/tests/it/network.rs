//! The flow model on fat-trees and dragonflies: side by side with SimGrid 3.32 (the MAXMIN
//! column of `../shared/reference/simulators.md`, read from there), and the classic results
//! (a shift permutation is non-blocking on a full-bisection fat-tree and halves with 2:1
//! oversubscription; Valiant routing relieves an adversarial dragonfly pattern).

use sim_core::exec::run;
use sim_core::flow::FlowNetwork;
use sim_core::graph::{CollectiveAlgorithm, CollectiveKind, ExecGraph, GraphBuilder, RankId, StreamId};
use sim_core::units::{Bytes, SimDuration};
use topology::{
    CascadeSpec, ClusterSpec, DragonflySpec, FabricSpec, IntraNode, LinkSpec, NetworkSpec, Routing, Topology,
    XgftSpec,
};

use crate::lone_collective;

fn link() -> LinkSpec {
    LinkSpec::new("100 Gb/s".parse().unwrap(), "1 us".parse().unwrap())
}

/// `hosts` single-GPU servers on `network` (the first `hosts` terminals of the fabric).
fn cluster(hosts: u32, network: NetworkSpec) -> Topology {
    Topology::build(&ClusterSpec {
        nodes: hosts,
        gpus_per_node: 1,
        intra_node: IntraNode::NvSwitch(link()),
        network,
        host_memory: None,
    })
    .unwrap()
}

/// Every host i sends `bytes` to (i + n/2) mod n at time zero (simulators.md's `perm`).
fn shift_permutation(hosts: u32, bytes: u64) -> ExecGraph {
    let mut graph = GraphBuilder::new(hosts);
    for src in 0..hosts {
        graph.transfer(
            RankId(src),
            StreamId(0),
            RankId((src + hosts / 2) % hosts),
            Bytes(bytes),
            "perm",
            &[],
        );
    }
    graph.build().unwrap()
}

fn makespan(topology: &Topology, graph: &ExecGraph) -> SimDuration {
    run(graph, &mut FlowNetwork::new(topology)).unwrap().makespan()
}

/// SimGrid's topology strings for the labels of simulators.md.
fn simgrid_fabric(label: &str) -> FabricSpec {
    let xgft = |text| FabricSpec::FatTree(XgftSpec::from_simgrid(text, link()).unwrap());
    let cascade = |text| FabricSpec::CascadeDragonfly(CascadeSpec::from_simgrid(text, link()).unwrap());
    match label {
        "FT3-k4" => xgft("3;2,2,4;1,2,2;1,1,1"),
        "FT3-k8" => xgft("3;4,4,8;1,4,4;1,1,1"),
        "FT2-k8" => xgft("2;4,8;1,4;1,1"),
        "FT2-k16" => xgft("2;8,16;1,8;1,1"),
        "DF16" => cascade("2,1;1,1;2,1;4"),
        "DF64" => cascade("4,1;1,1;4,1;4"),
        "DF128a" => cascade("8,1;1,1;8,1;2"),
        "DF128b" => cascade("4,1;2,1;4,1;4"),
        other => panic!("simulators.md has a topology label this test does not know: {other}"),
    }
}

#[test]
fn every_fat_tree_and_dragonfly_row_matches_simgrid_maxmin() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/reference/simulators.md");
    let table = fs_err::read_to_string(path).unwrap_or_else(|error| {
        panic!("cannot read {path}: {error}; ../shared/reference must sit beside the checkout")
    });
    let section = table
        .split("## Results: SimGrid, fat-tree and dragonfly")
        .nth(1)
        .and_then(|rest| rest.split("Observations").next())
        .expect("simulators.md has no 'Results: SimGrid, fat-tree and dragonfly' section");
    let mut rows = 0;
    let mut worst: f64 = 0.0;
    for line in section.lines().filter(|line| line.starts_with("| FT") || line.starts_with("| DF")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).filter(|cell| !cell.is_empty()).collect();
        let (label, hosts, pattern) = (cells[0], cells[1].parse::<u32>().unwrap(), cells[2]);
        let bytes: Bytes = cells[3].replace("MiB", " MiB").replace("GiB", " GiB").parse().unwrap();
        let maxmin_ms: f64 = cells[4].parse().unwrap();
        let topology = cluster(hosts, NetworkSpec::new(simgrid_fabric(label)));
        let graph = match pattern {
            "ring" => lone_collective(hosts, CollectiveKind::AllReduce, CollectiveAlgorithm::Ring, bytes),
            "perm" => shift_permutation(hosts, bytes.0),
            other => panic!("unknown pattern {other}"),
        };
        let ours_ms = makespan(&topology, &graph).as_secs_f64() * 1e3;
        let error = (ours_ms - maxmin_ms).abs() / maxmin_ms;
        // The issue asks for 0.5%; hold 0.01%, or the table's 4-decimal rounding where larger.
        let tolerance = 1e-4_f64.max(0.5e-4 / maxmin_ms);
        assert!(
            error < tolerance,
            "{label} N={hosts} {pattern} {bytes}: parasim {ours_ms:.6} ms vs SimGrid {maxmin_ms} ms ({:+.4}%)",
            100.0 * (ours_ms - maxmin_ms) / maxmin_ms
        );
        worst = worst.max(error);
        rows += 1;
    }
    println!("{rows} rows, worst difference {:.4}%", worst * 100.0);
    assert_eq!(rows, 78, "expected the 78 fat-tree and dragonfly rows of simulators.md");
}

#[test]
fn simgrid_two_flow_micro_test() {
    // FT3-k4, h0->h1 (2 links) and h2->h1 (4 links), 125 MB each: SimGrid MAXMIN finishes them
    // at 0.020000000 s and 0.020002000 s.
    let topology = cluster(16, NetworkSpec::new(simgrid_fabric("FT3-k4")));
    let mut graph = GraphBuilder::new(16);
    let a = graph.transfer(RankId(0), StreamId(0), RankId(1), Bytes(125_000_000), "h0->h1", &[]);
    let b = graph.transfer(RankId(2), StreamId(0), RankId(1), Bytes(125_000_000), "h2->h1", &[]);
    let graph = graph.build().unwrap();
    let timeline = run(&graph, &mut FlowNetwork::new(&topology)).unwrap();
    assert_eq!(timeline.end[a.0 as usize].since_start(), SimDuration::from_us(20_000));
    assert_eq!(timeline.end[b.0 as usize].since_start(), SimDuration::from_us(20_002));
}

/// A k = 8 three-level fat-tree whose core cables (level 2) are `core` times oversubscribed.
fn fat_tree(core: f64, routing: Routing) -> Topology {
    let mut spec = XgftSpec::k_ary(8, 3, vec![link(); 3]).unwrap();
    spec.oversubscription = vec![1.0, 1.0, core];
    let mut network = NetworkSpec::new(FabricSpec::FatTree(spec));
    network.routing = routing;
    cluster(128, network)
}

#[test]
fn a_shift_permutation_runs_at_line_rate_and_halves_with_2_to_1_oversubscription() {
    let bytes = 64u64 << 20;
    let graph = shift_permutation(128, bytes);
    let line_rate = bytes as f64 / 12.5e9;
    let latency = 6e-6; // 6 links of 1 us across the core
    let full = makespan(&fat_tree(1.0, Routing::DModK), &graph).as_secs_f64();
    assert!(
        (full - latency - line_rate).abs() < 1e-9,
        "full bisection: {full} s vs {} s",
        latency + line_rate
    );
    let oversubscribed = makespan(&fat_tree(2.0, Routing::DModK), &graph).as_secs_f64();
    let ratio = (oversubscribed - latency) / (full - latency);
    assert!((ratio - 2.0).abs() < 1e-6, "2:1 at the core: {ratio:.4}x the bandwidth time");
}

#[test]
fn ecmp_collides_where_d_mod_k_does_not() {
    // D-mod-K spreads a shift over the core perfectly; ECMP's hash lets some flows collide,
    // so it can only be slower, never faster.
    let graph = shift_permutation(128, 16 << 20);
    let d_mod_k = makespan(&fat_tree(1.0, Routing::DModK), &graph);
    let ecmp = makespan(&fat_tree(1.0, Routing::Ecmp), &graph);
    assert!(ecmp > d_mod_k, "ECMP {ecmp} vs D-mod-K {d_mod_k}");
}

/// A balanced dragonfly with h = 2 (9 groups of 4 routers, 2 hosts per router: 72 hosts)
/// where every host of group g sends to the same host of group g + 1.
fn adversarial(routing: Routing) -> SimDuration {
    let spec = DragonflySpec::balanced(2, link(), link(), link());
    let hosts_per_group = spec.routers_per_group * spec.hosts_per_router;
    let hosts = spec.groups * hosts_per_group;
    let mut network = NetworkSpec::new(FabricSpec::Dragonfly(spec));
    network.routing = routing;
    let topology = cluster(hosts, network);
    let mut graph = GraphBuilder::new(hosts);
    for src in 0..hosts {
        let dst = (src + hosts_per_group) % hosts;
        graph.transfer(RankId(src), StreamId(0), RankId(dst), Bytes(64 << 20), "to next group", &[]);
    }
    makespan(&topology, &graph.build().unwrap())
}

#[test]
fn valiant_routing_relieves_the_adversarial_dragonfly_pattern() {
    // Kim et al. 2008: under minimal routing all 8 flows of a group share the one global link
    // to the next group (8x the time of one flow alone); Valiant spreads them over
    // intermediate groups (with one flow per host the hash leaves some global links busier
    // than others, so the gain here is below the 4x of a long-run average); UGAL picks
    // between the two per flow.
    let alone = (64u64 << 20) as f64 / 12.5e9;
    let minimal = adversarial(Routing::Minimal).as_secs_f64();
    let valiant = adversarial(Routing::Valiant).as_secs_f64();
    let ugal = adversarial(Routing::Ugal).as_secs_f64();
    println!("alone {alone:.4} s, minimal {minimal:.4} s, Valiant {valiant:.4} s, UGAL {ugal:.4} s");
    assert!((minimal / alone - 8.0).abs() < 0.01, "minimal: {:.3}x a lone flow", minimal / alone);
    assert!(valiant < 0.7 * minimal, "Valiant {valiant} s vs minimal {minimal} s");
    assert!(ugal < 0.7 * minimal, "UGAL {ugal} s vs minimal {minimal} s");
}
