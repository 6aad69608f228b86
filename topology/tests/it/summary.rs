//! `Topology::summary` and `Topology::to_dot`.

use topology::{CascadeSpec, ClusterSpec, FabricSpec, IntraNode, NetworkSpec, Routing, Topology, XgftSpec};

use crate::{link, simgrid_cluster, simgrid_link};

#[test]
fn fat_tree_summary_is_exact() {
    let l = simgrid_link();
    let topology = simgrid_cluster(16, FabricSpec::FatTree(XgftSpec::k_ary(4, 3, vec![l; 3]).unwrap()));
    let summary = topology.summary();
    assert_eq!((summary.hosts, summary.nics, summary.switches, summary.links), (16, 16, 20, 96));
    assert_eq!(summary.routing, Routing::DModK);
    // Full bisection: 8 hosts' worth of 100 Gb/s.
    assert_eq!(summary.bisection.unwrap().display_bits().to_string(), "800 Gb/s");
    assert_eq!(summary.diameter, 6);
    // From each host: 1 neighbour on its edge switch (2 links), 2 in its pod (4), 12 beyond (6).
    assert_eq!(summary.path_lengths.histogram, [0, 0, 16, 0, 32, 0, 192]);
    assert!(summary.path_lengths.exact);
    assert_eq!(summary.path_lengths.pairs, 16 * 15);
    let text = summary.to_string();
    assert!(text.contains("800 Gb/s per direction") && text.contains("all 240 ordered host pairs"), "{text}");

    let mut oversubscribed = XgftSpec::k_ary(4, 3, vec![l; 3]).unwrap();
    oversubscribed.oversubscription = vec![1.0, 1.0, 2.0];
    let topology = simgrid_cluster(16, FabricSpec::FatTree(oversubscribed));
    assert_eq!(topology.summary().bisection.unwrap().display_bits().to_string(), "400 Gb/s");
}

#[test]
fn other_fabrics_bisect_by_their_closed_forms() {
    let l = simgrid_link();
    let df64 = simgrid_cluster(
        64,
        FabricSpec::CascadeDragonfly(CascadeSpec::from_simgrid("4,1;1,1;4,1;4", l).unwrap()),
    );
    let summary = df64.summary();
    // 2 x 2 groups: 4 blue links.
    assert_eq!(summary.bisection.unwrap().display_bits().to_string(), "400 Gb/s");
    assert!(summary.bisection_method.contains("blue"));
    assert_eq!(summary.diameter, 5);
    let torus = simgrid_cluster(64, FabricSpec::Torus { dims: vec![4, 4, 4], link: l });
    let summary = torus.summary();
    // Halving a 4x4x4 torus cuts 2 x 16 cables.
    assert_eq!(summary.bisection.unwrap().display_bits().to_string(), "3.2 Tb/s");
    assert_eq!(summary.diameter, 2 + 6);
    // A small cluster on a big fabric: the tree is pruned to the two leaves and four spines its
    // 8 hosts use, whose bisection is its own 4 terminal links' (it was the full tree's, capped
    // by those links).
    let small = simgrid_cluster(8, FabricSpec::FatTree(XgftSpec::k_ary(8, 3, vec![l; 3]).unwrap()));
    let summary = small.summary();
    assert_eq!(summary.bisection.unwrap().display_bits().to_string(), "400 Gb/s");
    assert_eq!(summary.fabric, "fat-tree 2;4,2;1,4;1,1");
    assert!(summary.pruned.is_some());
    // One server with an NVLink mesh: 4 x 4 links between the halves.
    let server = Topology::build(&ClusterSpec {
        nodes: 1,
        gpus_per_node: 8,
        intra_node: IntraNode::NvLinkMesh(link("50 GB/s", "0.7 us")),
        network: NetworkSpec::single_switch(l),
        host_memory: None,
    })
    .unwrap();
    let summary = server.summary();
    assert_eq!(summary.bisection.unwrap().display_bits().to_string(), "6.4 Tb/s");
    assert_eq!(summary.fabric, "none (a single server)");
    assert_eq!(summary.path_lengths.histogram, [0, 56]);
}

#[test]
fn large_topologies_sample_their_path_lengths_deterministically() {
    let l = link("200 Gb/s", "1 us");
    let spec = ClusterSpec {
        nodes: 512,
        gpus_per_node: 8,
        intra_node: IntraNode::NvSwitch(link("450 GB/s", "0.7 us")),
        network: NetworkSpec::new(FabricSpec::FatTree(XgftSpec::k_ary(32, 3, vec![l; 3]).unwrap())),
        host_memory: None,
    };
    let topology = Topology::build(&spec).unwrap();
    let summary = topology.summary();
    assert!(!summary.path_lengths.exact);
    assert_eq!(summary.path_lengths.pairs, 1 << 20);
    assert_eq!(summary.path_lengths.histogram.iter().sum::<u64>(), 1 << 20);
    assert_eq!(summary.diameter, 6);
    assert_eq!(summary, topology.summary(), "the sample is the same every time");
    assert!(summary.to_string().contains("sampled host pairs"));
}

#[test]
fn dot_output_draws_every_vertex_and_cable_once() {
    let l = simgrid_link();
    let topology = Topology::build(&ClusterSpec {
        nodes: 4,
        gpus_per_node: 2,
        intra_node: IntraNode::NvSwitch(link("300 GB/s", "0.7 us")),
        network: NetworkSpec::new(FabricSpec::FatTree(XgftSpec::leaf_spine(4, vec![l; 2]).unwrap())),
        host_memory: None,
    })
    .unwrap();
    let dot = topology.to_dot();
    assert!(dot.starts_with("graph topology {") && dot.trim_end().ends_with('}'));
    assert_eq!(dot.matches(" -- ").count(), topology.link_count() / 2);
    assert_eq!(dot.matches("[label=\"").count() - dot.matches(" -- ").count(), topology.graph().node_count());
    for name in [
        "gpu 7 (node 3.1)",
        "nvswitch 0",
        "leaf 3",
        "spine 1",
        "subgraph cluster_node2",
        "100 Gb/s",
        "2.4 Tb/s",
    ] {
        assert!(dot.contains(name), "no {name:?} in\n{dot}");
    }
}
