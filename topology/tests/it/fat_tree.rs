//! Fat-trees: shapes, SimGrid's D-mod-K hop for hop, non-blocking shifts, ECMP, oversubscription.

use std::collections::BTreeSet;

use topology::{FabricSpec, HostId, LinkId, Routing, Tier, Topology, Vertex, XgftSpec};

use crate::{assert_walk, cluster, link, link_loads, simgrid_cluster, simgrid_link, simgrid_route};

fn simgrid_tree(text: &str) -> FabricSpec {
    FabricSpec::FatTree(XgftSpec::from_simgrid(text, simgrid_link()).unwrap())
}

/// Network switches by the tiers of their links: (edge, middle, top).
fn switches_by_role(topology: &Topology, levels: u8) -> (usize, usize, usize) {
    let graph = topology.graph();
    let (mut edge, mut middle, mut top) = (0, 0, 0);
    for vertex in graph.node_indices().filter(|&v| matches!(graph[v], Vertex::NetworkSwitch { .. })) {
        let tiers: BTreeSet<Tier> = graph.edges(vertex).map(|e| e.weight().tier).collect();
        if tiers.contains(&Tier::NetworkEdge) {
            edge += 1;
        } else if tiers.iter().all(|&t| t == Tier::FatTree { level: levels - 1 }) {
            top += 1;
        } else {
            middle += 1;
        }
    }
    (edge, middle, top)
}

#[test]
fn k_ary_three_level_trees_have_the_textbook_counts() {
    let l = simgrid_link();
    for (k, hosts, edge, aggregation, core) in [(4u32, 16u32, 8, 8, 4), (8, 128, 32, 32, 16)] {
        let spec = XgftSpec::k_ary(k, 3, vec![l; 3]).unwrap();
        assert_eq!(spec.terminal_capacity(), u64::from(k * k * k / 4));
        let label = format!("3;{0},{0},{1};1,{0},{0};1,1,1", k / 2, k);
        assert_eq!(spec, XgftSpec::from_simgrid(&label, l).unwrap(), "k = {k} is SimGrid's {label}");
        let topology = simgrid_cluster(hosts, FabricSpec::FatTree(spec));
        assert_eq!(topology.host_count(), hosts as usize);
        assert_eq!(switches_by_role(&topology, 3), (edge, aggregation, core), "k = {k}");
        assert_eq!(topology.switch_count(), edge + aggregation + core);
        // Three tiers of k^3/4 cables each (full bisection), two links per cable.
        assert_eq!(topology.link_count(), 3 * hosts as usize * 2);
    }
}

#[test]
fn leaf_spine_has_radix_leaves_and_half_radix_spines() {
    let spec = XgftSpec::leaf_spine(8, vec![simgrid_link(); 2]).unwrap();
    assert_eq!(spec, XgftSpec::from_simgrid("2;4,8;1,4;1,1", simgrid_link()).unwrap());
    let topology = simgrid_cluster(32, FabricSpec::FatTree(spec));
    assert_eq!(switches_by_role(&topology, 2), (8, 0, 4));
    // Same leaf: 2 links; other leaf: up to a spine and down, 4.
    assert_eq!(topology.route(HostId(0), HostId(3)).unwrap().len(), 2);
    assert_eq!(topology.route(HostId(0), HostId(4)).unwrap().len(), 4);
}

/// Routes printed by SimGrid 3.32 (Debian's libsimgrid-dev 3.32-2) with the reference harness,
/// `collsim TOPO N PATTERN 1 --routes` (../shared/reference/simgrid/collsim.cpp), one command
/// per block.
const SIMGRID_FAT_TREE_ROUTES: &[(&str, u32, &str)] = &[
    // collsim "ft:3;2,2,4;1,2,2;1,1,1" 16 perm 1 --routes
    (
        "3;2,2,4;1,2,2;1,1,1",
        16,
        "h0 -> h8 (6 links, lat 6e-06): link_from_0_31_0_UP link_from_31_23_16_UP link_from_23_15_32_UP link_from_19_15_40_DOWN link_from_27_19_24_DOWN link_from_8_27_8_DOWN
h5 -> h13 (6 links, lat 6e-06): link_from_5_29_5_UP link_from_29_20_21_UP link_from_20_14_38_UP link_from_16_14_46_DOWN link_from_25_16_29_DOWN link_from_13_25_13_DOWN
h10 -> h2 (6 links, lat 6e-06): link_from_10_26_10_UP link_from_26_19_26_UP link_from_19_13_41_UP link_from_23_13_33_DOWN link_from_30_23_18_DOWN link_from_2_30_2_DOWN
h15 -> h7 (6 links, lat 6e-06): link_from_15_24_15_UP link_from_24_16_31_UP link_from_16_12_47_UP link_from_20_12_39_DOWN link_from_28_20_23_DOWN link_from_7_28_7_DOWN",
    ),
    // collsim "ft:3;2,2,2;1,2,2;1,2,2" 8 "pairs:0-4,1-4,0-5,1-5,0-6,0-7,3-6,2-7,4-0,5-1" 1 --routes
    // (two parallel cables above the leaves: SimGrid's port scan picks the cable going down)
    (
        "3;2,2,2;1,2,2;1,2,2",
        8,
        "h0 -> h4 (6 links, lat 6e-06): link_from_0_15_0_UP link_from_15_11_8_UP link_from_11_7_25_UP link_from_9_7_32_DOWN link_from_13_9_17_DOWN link_from_4_13_4_DOWN
h1 -> h4 (6 links, lat 6e-06): link_from_1_15_1_UP link_from_15_11_8_UP link_from_11_7_25_UP link_from_9_7_33_DOWN link_from_13_9_17_DOWN link_from_4_13_4_DOWN
h0 -> h5 (6 links, lat 6e-06): link_from_0_15_0_UP link_from_15_10_10_UP link_from_10_6_29_UP link_from_8_6_36_DOWN link_from_13_8_19_DOWN link_from_5_13_5_DOWN
h0 -> h7 (6 links, lat 6e-06): link_from_0_15_0_UP link_from_15_10_11_UP link_from_10_4_31_UP link_from_8_4_38_DOWN link_from_12_8_23_DOWN link_from_7_12_7_DOWN
h3 -> h6 (6 links, lat 6e-06): link_from_3_14_3_UP link_from_14_11_13_UP link_from_11_5_27_UP link_from_9_5_35_DOWN link_from_12_9_21_DOWN link_from_6_12_6_DOWN
h4 -> h0 (6 links, lat 6e-06): link_from_4_13_4_UP link_from_13_9_16_UP link_from_9_7_32_UP link_from_11_7_24_DOWN link_from_15_11_9_DOWN link_from_0_15_0_DOWN
h5 -> h1 (6 links, lat 6e-06): link_from_5_13_5_UP link_from_13_8_18_UP link_from_8_6_36_UP link_from_10_6_29_DOWN link_from_15_10_11_DOWN link_from_1_15_1_DOWN",
    ),
    // collsim "ft:2;2,2;1,2;2,1" 4 "pairs:0-2,0-3,1-2,2-0" 1 --routes
    // (two cables per host: D-mod-K divides by prod(UP) only, as simulators.md says)
    (
        "2;2,2;1,2;2,1",
        4,
        "h0 -> h2 (4 links, lat 4e-06): link_from_0_7_0_UP link_from_7_5_8_UP link_from_6_5_10_DOWN link_from_2_6_5_DOWN
h0 -> h3 (4 links, lat 4e-06): link_from_0_7_1_UP link_from_7_4_9_UP link_from_6_4_11_DOWN link_from_3_6_7_DOWN
h1 -> h2 (4 links, lat 4e-06): link_from_1_7_2_UP link_from_7_5_8_UP link_from_6_5_10_DOWN link_from_2_6_5_DOWN
h2 -> h0 (4 links, lat 4e-06): link_from_2_6_4_UP link_from_6_5_10_UP link_from_7_5_8_DOWN link_from_0_7_1_DOWN",
    ),
];

#[test]
fn d_mod_k_routes_are_simgrids_link_for_link() {
    for &(shape, hosts, lines) in SIMGRID_FAT_TREE_ROUTES {
        let topology = simgrid_cluster(hosts, simgrid_tree(shape));
        assert_eq!(topology.routing(), Routing::DModK);
        for line in lines.lines() {
            let (src, dst, expected) = simgrid_route(line);
            assert_eq!(&*topology.route(src, dst).unwrap(), expected.as_slice(), "{shape}: {line}");
        }
    }
}

#[test]
fn d_mod_k_shift_permutations_are_non_blocking() {
    // simulators.md: "Shift permutations are therefore non-blocking (verified: perm = X/B
    // exactly under plain max-min)"; N = 16 on FT3-k4, N = 16, 64, 128 on FT3-k8.
    for (shape, hosts, participants) in
        [("3;2,2,4;1,2,2;1,1,1", 16, vec![16]), ("3;4,4,8;1,4,4;1,1,1", 128, vec![16, 64, 128])]
    {
        let topology = simgrid_cluster(hosts, simgrid_tree(shape));
        for n in participants {
            let loads = link_loads(&topology, (0..n).map(|i| (i, (i + n / 2) % n)));
            let busiest = loads.iter().max().unwrap();
            assert_eq!(*busiest, 1, "{shape}, N = {n}: a link carries {busiest} flows of the shift");
        }
    }
}

#[test]
fn ecmp_spreads_flows_evenly_and_deterministically() {
    let fabric = simgrid_tree("3;4,4,8;1,4,4;1,1,1");
    let topology = cluster(128, 1, fabric.clone(), Routing::Ecmp);
    let (src, dst) = (HostId(0), HostId(127));
    let flows = 16_000;
    let mut edge_up = std::collections::BTreeMap::<LinkId, u32>::new();
    let mut core_up = std::collections::BTreeMap::<LinkId, u32>::new();
    for flow in 0..flows {
        let route = topology.route_for_flow(src, dst, flow).unwrap();
        assert_eq!(route, topology.route_for_flow(src, dst, flow).unwrap(), "deterministic");
        assert_eq!(route.len(), 6);
        *edge_up.entry(route[1]).or_default() += 1;
        *core_up.entry(route[2]).or_default() += 1;
    }
    // 4 aggregation switches above the edge, 4 core switches above each: 4 and 16 up-links.
    assert_eq!(edge_up.len(), 4);
    assert_eq!(core_up.len(), 16);
    for (ports, histogram) in [(4u64, &edge_up), (16, &core_up)] {
        let expected = flows / ports;
        for (&link, &count) in histogram {
            let deviation = (f64::from(count) - expected as f64).abs() / expected as f64;
            assert!(deviation < 0.15, "{count} of {flows} flows on {link:?}, expected about {expected}");
        }
    }
    // D-mod-K ignores the flow id.
    let d_mod_k = simgrid_cluster(128, fabric);
    let routes: BTreeSet<Vec<LinkId>> =
        (0..100).map(|f| d_mod_k.route_for_flow(src, dst, f).unwrap().to_vec()).collect();
    assert_eq!(routes.len(), 1);
    // ECMP routes are shortest walks too, and flow 0 is `route`.
    assert_eq!(topology.route(src, dst).unwrap(), topology.route_for_flow(src, dst, 0).unwrap());
    let paths = topology.paths_from(HostId(5)).unwrap();
    for dst in 0..128 {
        for flow in [1, 99] {
            let route = topology.route_for_flow(HostId(5), HostId(dst), flow).unwrap();
            assert_walk(&topology, HostId(5), HostId(dst), &route);
            assert_eq!(route.len(), paths[dst as usize].len());
        }
    }
}

#[test]
fn oversubscription_divides_the_bandwidth_of_its_tier() {
    let l = link("400 Gb/s", "1 us");
    let mut spec = XgftSpec::k_ary(4, 3, vec![l; 3]).unwrap();
    spec.oversubscription = vec![1.0, 1.0, 2.0];
    let topology = simgrid_cluster(16, FabricSpec::FatTree(spec));
    let route = topology.route(HostId(0), HostId(8)).unwrap();
    let rates: Vec<String> =
        route.iter().map(|&id| topology.link(id).bandwidth.display_bits().to_string()).collect();
    assert_eq!(rates, ["400 Gb/s", "400 Gb/s", "200 Gb/s", "200 Gb/s", "400 Gb/s", "400 Gb/s"]);
    let tiers: Vec<Tier> = route.iter().map(|&id| topology.link(id).tier).collect();
    assert_eq!(tiers[2], Tier::FatTree { level: 2 });
    assert_eq!(tiers[0], Tier::NetworkEdge);
    // The structure is unchanged: same switches, same links.
    assert_eq!(topology.switch_count(), 20);
    assert_eq!(topology.link_count(), 96);
}

#[test]
fn per_tier_links_apply_to_their_level() {
    let tiers = vec![link("400 Gb/s", "0.5 us"), link("800 Gb/s", "1 us"), link("1.6 Tb/s", "2 us")];
    let topology = simgrid_cluster(16, FabricSpec::FatTree(XgftSpec::k_ary(4, 3, tiers).unwrap()));
    let route = topology.route(HostId(15), HostId(0)).unwrap();
    let latencies: Vec<String> = route.iter().map(|&id| topology.link(id).latency.to_string()).collect();
    assert_eq!(latencies, ["500 ns", "1 us", "2 us", "2 us", "1 us", "500 ns"]);
}

#[test]
fn rail_optimized_servers_meet_their_rail_at_one_leaf() {
    // 8 DGX-like servers of 8 GPUs, one NIC per GPU, on a leaf-spine of 16-port switches (8
    // hosts per leaf): with rails, GPU i of every server sits on leaf i.
    let fabric = FabricSpec::FatTree(XgftSpec::leaf_spine(16, vec![link("200 Gb/s", "1 us"); 2]).unwrap());
    let spec = |rail_optimized| topology::ClusterSpec {
        nodes: 8,
        gpus_per_node: 8,
        intra_node: topology::IntraNode::NvSwitch(link("300 GB/s", "0.7 us")),
        network: topology::NetworkSpec { rail_optimized, ..topology::NetworkSpec::new(fabric.clone()) },
        host_memory: None,
    };
    let rails = Topology::build(&spec(true)).unwrap();
    let plain = Topology::build(&spec(false)).unwrap();
    // GPU 3 of server 0 to GPU 3 of server 5: same rail, one leaf; without rails, two leaves.
    assert_eq!(rails.route(HostId(3), HostId(5 * 8 + 3)).unwrap().len(), 2);
    assert_eq!(plain.route(HostId(3), HostId(5 * 8 + 3)).unwrap().len(), 4);
    // Different rails cross a spine.
    assert_eq!(rails.route(HostId(3), HostId(5 * 8 + 4)).unwrap().len(), 4);
}

/// A fat-tree larger than its hosts need is built pruned (issue 35: 256 GPUs on a radix-32
/// tree reported the full 1,280 network switches of an 8,192-host tree): here k = 8, 3 levels
/// (room for 128), 20 hosts fill one pod and part of a second, so 2 of the 8 pods are built
/// (4 + 4 edge, 4 + 4 aggregation, all 16 core switches); 16 hosts fill one pod, so the core
/// level is dropped too. Routes keep the full tree's lengths: 2 links within a leaf, 4 within
/// a pod, 6 between pods; and the summary says how it pruned.
#[test]
fn a_tree_larger_than_the_hosts_need_is_pruned_to_the_switches_they_use() {
    let spec = XgftSpec::k_ary(8, 3, vec![simgrid_link(); 3]).unwrap();
    let (pruned, how) = spec.pruned(20).unwrap();
    assert_eq!(pruned, XgftSpec::from_simgrid("3;4,4,2;1,4,4;1,1,1", simgrid_link()).unwrap());
    assert!(how.contains("2 of the 8 subtrees") && how.contains("room for 128"), "{how}");
    let topology = simgrid_cluster(20, FabricSpec::FatTree(spec.clone()));
    // 8 leaves (5 with hosts: the second pod is built whole, 3 of its leaves empty), 8
    // aggregation and 16 core switches: 32 of the full tree's 80.
    assert_eq!(switches_by_role(&topology, 3), (5, 8 + 3, 16));
    assert_eq!(topology.switch_count(), 32);
    assert_eq!(topology.pruned(), Some(how.as_str()));
    assert!(topology.summary().describe("GPU").contains("pruned:     from fat-tree 3;4,4,8;1,4,4;1,1,1"));
    for (a, b, links) in [(0, 3, 2), (0, 4, 4), (0, 15, 4), (0, 16, 6), (19, 1, 6)] {
        assert_eq!(topology.route(HostId(a), HostId(b)).unwrap().len(), links, "{a} -> {b}");
    }

    let (pruned, how) = spec.pruned(16).unwrap();
    assert_eq!(pruned, XgftSpec::from_simgrid("2;4,4;1,4;1,1", simgrid_link()).unwrap());
    assert!(how.contains("1 top level dropped"), "{how}");
    let topology = simgrid_cluster(16, FabricSpec::FatTree(spec.clone()));
    assert_eq!(switches_by_role(&topology, 2), (4, 0, 4));
    assert_eq!(topology.route(HostId(0), HostId(15)).unwrap().len(), 4);

    // A full tree is built whole.
    assert!(spec.pruned(128).is_none());
    assert!(simgrid_cluster(128, FabricSpec::FatTree(spec)).pruned().is_none());
}
