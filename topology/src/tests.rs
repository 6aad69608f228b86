//! Unit tests of the cluster composition: intra-node fabrics, NICs, rails, route plumbing.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use super::*;

fn link(bandwidth: &str, latency: &str) -> LinkSpec {
    LinkSpec::new(bandwidth.parse().unwrap(), latency.parse().unwrap())
}

fn cluster(nodes: u32, gpus_per_node: u32) -> Topology {
    Topology::build(&ClusterSpec {
        nodes,
        gpus_per_node,
        intra_node: IntraNode::NvSwitch(link("300 GB/s", "0.7 us")),
        network: NetworkSpec::single_switch(link("200 Gb/s", "1 us")),
        host_memory: None,
    })
    .unwrap()
}

/// `nodes` servers of `gpus` GPUs with `nics` NICs each on one switch.
fn shared(nodes: u32, gpus: u32, nics: u32, rail_optimized: bool, intra_node: IntraNode) -> Topology {
    Topology::build(&ClusterSpec {
        nodes,
        gpus_per_node: gpus,
        intra_node,
        network: NetworkSpec {
            nics_per_node: Some(nics),
            rail_optimized,
            gpu_to_nic: Some(link("32 GB/s", "0.5 us")),
            ..NetworkSpec::single_switch(link("400 Gb/s", "1 us"))
        },
        host_memory: None,
    })
    .unwrap()
}

#[test]
fn counts_match_the_shape() {
    let topology = cluster(8, 8);
    assert_eq!(topology.host_count(), 64);
    assert_eq!(topology.switch_count(), 8 + 1);
    assert_eq!(topology.nic_count(), 64);
    // Each GPU: one cable to its NVSwitch and one to the network switch, two links each.
    assert_eq!(topology.link_count(), 64 * 2 * 2);
    assert_eq!(topology.node_of(HostId(9)).unwrap(), 1);
    assert_eq!(topology.routing(), Routing::Shortest);
}

#[test]
fn intra_node_traffic_stays_on_nvswitch_and_inter_node_uses_the_nic() {
    let topology = cluster(2, 4);
    let inside = topology.shortest_path(HostId(0), HostId(3)).unwrap();
    assert_eq!(inside.len(), 2);
    assert!(inside.iter().all(|&l| topology.link(l).tier == Tier::IntraNode));
    let across = topology.shortest_path(HostId(1), HostId(6)).unwrap();
    assert_eq!(across.len(), 2);
    assert!(across.iter().all(|&l| topology.link(l).tier == Tier::NetworkEdge));
    assert!(topology.shortest_path(HostId(5), HostId(5)).unwrap().is_empty());
    let all = topology.paths_from(HostId(1)).unwrap();
    assert_eq!(all[6], across);
}

#[test]
fn structural_routes_are_shortest_paths() {
    for topology in [cluster(3, 4), cluster(1, 8), cluster(5, 1)] {
        for src in 0..topology.host_count() as u32 {
            let paths = topology.paths_from(HostId(src)).unwrap();
            for (dst, path) in paths.iter().enumerate() {
                let route = topology.route(HostId(src), HostId(dst as u32)).unwrap();
                assert_eq!(&*route, path.as_slice(), "{src} -> {dst}");
            }
        }
    }
}

#[test]
fn single_gpu_nodes_and_single_nodes_have_no_useless_switches() {
    assert_eq!(cluster(1, 8).switch_count(), 1);
    assert_eq!(cluster(1, 8).nic_count(), 0);
    assert_eq!(cluster(1, 8).nic_of(HostId(3)).unwrap(), None);
    assert_eq!(cluster(4, 1).switch_count(), 1);
    assert_eq!(cluster(1, 1).link_count(), 0);
}

#[test]
fn nvlink_mesh_links_every_gpu_pair_directly() {
    let mesh = IntraNode::NvLinkMesh(link("50 GB/s", "0.7 us"));
    let topology = Topology::build(&ClusterSpec {
        nodes: 2,
        gpus_per_node: 4,
        intra_node: mesh,
        network: NetworkSpec::single_switch(link("200 Gb/s", "1 us")),
        host_memory: None,
    })
    .unwrap();
    // No node switches; 6 GPU pairs per server, plus 8 NIC cables.
    assert_eq!(topology.switch_count(), 1);
    assert_eq!(topology.link_count(), 2 * (2 * 6 + 8));
    for (src, dst) in [(0, 3), (3, 0), (5, 6), (7, 4)] {
        let route = topology.route(HostId(src), HostId(dst)).unwrap();
        assert_eq!(route.len(), 1);
        let edge = &topology.graph().raw_edges()[route[0].0 as usize];
        assert_eq!(edge.source(), topology.vertex_of(HostId(src)).unwrap());
        assert_eq!(edge.target(), topology.vertex_of(HostId(dst)).unwrap());
        assert_eq!(edge.weight.tier, Tier::IntraNode);
    }
}

#[test]
fn shared_nics_serve_contiguous_gpu_ranges() {
    // 8 GPUs, 3 NICs: NIC i serves GPUs i*8/3 .. (i+1)*8/3, that is {0,1}, {2,3,4}, {5,6,7}.
    let topology = shared(2, 8, 3, false, IntraNode::NvSwitch(link("300 GB/s", "0.7 us")));
    let nics: Vec<u32> = (0..8).map(|h| topology.nic_of(HostId(h)).unwrap().unwrap()).collect();
    assert_eq!(nics, [0, 0, 1, 1, 1, 2, 2, 2]);
    assert_eq!(topology.nic_of(HostId(13)).unwrap(), Some(5)); // node 1, NIC 2
    assert_eq!(topology.nic_count(), 6);
    // Node switches and the network switch; the NICs are not switches.
    assert_eq!(topology.switch_count(), 2 + 1);
    // GPU -> NIC -> switch -> NIC -> GPU.
    let route = topology.route(HostId(1), HostId(9)).unwrap();
    let tiers: Vec<Tier> = route.iter().map(|&l| topology.link(l).tier).collect();
    assert_eq!(tiers, [Tier::GpuToNic, Tier::NetworkEdge, Tier::NetworkEdge, Tier::GpuToNic]);
    assert_eq!(topology.shortest_path(HostId(1), HostId(9)).unwrap(), route.to_vec());
    // Inside a server, the NVSwitch, never the shared NIC.
    let inside = topology.route(HostId(0), HostId(1)).unwrap();
    assert!(inside.iter().all(|&l| topology.link(l).tier == Tier::IntraNode));
    assert_eq!(topology.shortest_path(HostId(0), HostId(1)).unwrap(), inside.to_vec());
}

#[test]
fn rail_optimized_terminals_group_the_same_nic_of_every_server() {
    let topology = shared(4, 8, 8, true, IntraNode::NvSwitch(link("300 GB/s", "0.7 us")));
    // One NIC per GPU (8 of 8): the GPUs are the terminals; GPU i of node n is i * 4 + n.
    assert_eq!(topology.nic_of(HostId(0)).unwrap(), Some(0));
    assert_eq!(topology.nic_of(HostId(8)).unwrap(), Some(1));
    assert_eq!(topology.nic_of(HostId(9)).unwrap(), Some(5));
    assert_eq!(topology.nic_of(HostId(31)).unwrap(), Some(31));
    let plain = shared(4, 8, 8, false, IntraNode::NvSwitch(link("300 GB/s", "0.7 us")));
    assert_eq!(plain.nic_of(HostId(9)).unwrap(), Some(9));
    // With 2 shared NICs per server, rails are NIC 0 of every server, then NIC 1.
    let rails = shared(4, 8, 2, true, IntraNode::NvSwitch(link("300 GB/s", "0.7 us")));
    let terminals: Vec<u32> =
        [0, 4, 8, 12, 31].iter().map(|&h| rails.nic_of(HostId(h)).unwrap().unwrap()).collect();
    assert_eq!(terminals, [0, 4, 1, 5, 7]);
}

#[test]
fn one_nic_per_gpu_named_explicitly_is_the_default() {
    let explicit = shared(2, 4, 4, false, IntraNode::PcieSwitch(link("32 GB/s", "1 us")));
    assert_eq!(explicit.nic_count(), 8);
    assert!(!explicit.graph().node_weights().any(|v| matches!(v, Vertex::Nic { .. })));
    assert_eq!(explicit.route(HostId(0), HostId(5)).unwrap().len(), 2);
}

#[test]
fn routes_beyond_capacity_are_errors_not_panics() {
    let ring = Topology::build(&ClusterSpec {
        nodes: 40,
        gpus_per_node: 1,
        intra_node: IntraNode::NvSwitch(link("1 GB/s", "1 us")),
        network: NetworkSpec::new(FabricSpec::Ring { link: link("1 GB/s", "1 us") }),
        host_memory: None,
    })
    .unwrap();
    // Neighbours are fine; the far side of a 40-router ring is 2 + 20 links away.
    assert_eq!(ring.route(HostId(0), HostId(1)).unwrap().len(), 3);
    assert_eq!(ring.route(HostId(0), HostId(39)).unwrap().len(), 3);
    assert_eq!(ring.route(HostId(0), HostId(14)).unwrap().len(), 16);
    assert_eq!(
        ring.route(HostId(0), HostId(20)).unwrap_err(),
        TopologyError::RouteTooLong { src: HostId(0), dst: HostId(20), max: Route::CAPACITY }
    );
    assert_eq!(ring.shortest_path(HostId(0), HostId(20)).unwrap().len(), 22);
    let too_many = vec![LinkId(0); Route::CAPACITY + 1];
    assert!(Route::try_from(too_many.as_slice()).is_err());
    let fits = Route::try_from(&too_many[1..]).unwrap();
    assert_eq!(fits.len(), Route::CAPACITY);
}

#[test]
fn routing_names_parse_and_print() {
    for name in ["auto", "shortest", "ecmp", "dmodk", "minimal", "valiant", "ugal"] {
        assert_eq!(name.parse::<Routing>().unwrap().to_string(), name);
    }
    let error = "adaptive".parse::<Routing>().unwrap_err().to_string();
    assert!(error.contains("routing") && error.contains("\"ugal\""), "{error}");
}

#[test]
fn bad_shapes_and_hosts_are_errors() {
    let spec = ClusterSpec {
        nodes: 0,
        gpus_per_node: 8,
        intra_node: IntraNode::NvSwitch(link("1 GB/s", "1 us")),
        network: NetworkSpec::single_switch(link("1 GB/s", "1 us")),
        host_memory: None,
    };
    assert_eq!(Topology::build(&spec).unwrap_err(), TopologyError::Zero { what: "nodes" });
    let topology = cluster(1, 2);
    assert!(matches!(topology.shortest_path(HostId(0), HostId(7)), Err(TopologyError::UnknownHost { .. })));
    assert!(matches!(topology.route(HostId(7), HostId(0)), Err(TopologyError::UnknownHost { .. })));
}

#[test]
fn nic_settings_are_checked() {
    let base = ClusterSpec {
        nodes: 2,
        gpus_per_node: 4,
        intra_node: IntraNode::NvSwitch(link("1 GB/s", "1 us")),
        network: NetworkSpec::single_switch(link("1 GB/s", "1 us")),
        host_memory: None,
    };
    let with = |nics: Option<u32>, gpu_to_nic: Option<LinkSpec>| {
        let mut spec = base.clone();
        spec.network.nics_per_node = nics;
        spec.network.gpu_to_nic = gpu_to_nic;
        Topology::build(&spec)
    };
    assert_eq!(with(Some(0), None).unwrap_err(), TopologyError::Zero { what: "nics-per-node" });
    let error = with(Some(5), None).unwrap_err().to_string();
    assert!(error.contains("nics-per-node") && error.contains("at most one NIC per GPU"), "{error}");
    let error = with(Some(2), None).unwrap_err().to_string();
    assert!(error.contains("gpu-to-nic") && error.contains("required"), "{error}");
    assert!(with(Some(2), Some(link("32 GB/s", "1 us"))).is_ok());
}
