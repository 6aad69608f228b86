//! Large fabrics build fast, in memory linear in their links, and route without tables.

use std::time::Instant;

use topology::{
    CascadeSpec, ClusterSpec, DragonflySpec, FabricSpec, HostId, IntraNode, NetworkSpec, Topology, XgftSpec,
};

use crate::link;

fn build_timed(label: &str, spec: &ClusterSpec) -> Topology {
    let started = Instant::now();
    let topology = Topology::build(spec).unwrap();
    let built = started.elapsed();
    let started = Instant::now();
    let hosts = topology.host_count() as u64;
    let mut total = 0;
    for i in 0..100_000u64 {
        let (src, dst) = ((i * 7919) % hosts, (i * 104_729 + 1) % hosts);
        total += topology.route_for_flow(HostId(src as u32), HostId(dst as u32), i).unwrap().len();
    }
    println!(
        "{label}: {hosts} hosts, {} links, built in {built:?}; 100k routes in {:?} (mean {:.2} links)",
        topology.link_count(),
        started.elapsed(),
        total as f64 / 1e5
    );
    // A generous bound: this runs unoptimized in CI; optimized builds take a few milliseconds.
    assert!(built.as_secs_f64() < 5.0, "{label} took {built:?} to build");
    topology
}

#[test]
fn a_k32_fat_tree_has_8192_hosts_and_linear_size() {
    let l = link("400 Gb/s", "1 us");
    let spec = ClusterSpec {
        nodes: 1024,
        gpus_per_node: 8,
        intra_node: IntraNode::NvSwitch(link("450 GB/s", "0.7 us")),
        network: NetworkSpec {
            rail_optimized: true,
            ..NetworkSpec::new(FabricSpec::FatTree(XgftSpec::k_ary(32, 3, vec![l; 3]).unwrap()))
        },
        host_memory: None,
    };
    let topology = build_timed("k=32 fat-tree", &spec);
    assert_eq!(topology.host_count(), 8192);
    // 8192 NVSwitch cables, then 3 tiers of 8192 cables: no per-pair state anywhere.
    assert_eq!(topology.link_count(), 2 * 4 * 8192);
    assert_eq!(topology.switch_count(), 1024 + 512 + 512 + 256);
}

#[test]
fn a_16k_host_dragonfly_builds_in_linear_size() {
    // Kim et al.'s balanced dragonfly with h = 8: 129 groups of 16 routers of 8 hosts
    // (16512 terminals), 2048 servers of 8 GPUs use 16384 of them.
    let l = link("200 Gb/s", "1 us");
    let spec = ClusterSpec {
        nodes: 2048,
        gpus_per_node: 8,
        intra_node: IntraNode::NvSwitch(link("450 GB/s", "0.7 us")),
        network: NetworkSpec::new(FabricSpec::Dragonfly(DragonflySpec::balanced(8, l, l, l))),
        host_memory: None,
    };
    let topology = build_timed("16k dragonfly", &spec);
    assert_eq!(topology.host_count(), 16_384);
    let cables = 16_384 + 16_384 + 129 * 16 * 15 / 2 + 129 * 128 / 2;
    assert_eq!(topology.link_count(), 2 * cables);

    let cascade = ClusterSpec {
        nodes: 16_384,
        gpus_per_node: 1,
        intra_node: IntraNode::NvSwitch(link("450 GB/s", "0.7 us")),
        network: NetworkSpec::new(FabricSpec::CascadeDragonfly(
            CascadeSpec::from_simgrid("16,1;8,1;16,1;8", l).unwrap(),
        )),
        host_memory: None,
    };
    let topology = build_timed("16k cascade dragonfly", &cascade);
    assert_eq!(topology.host_count(), 16_384);
}
