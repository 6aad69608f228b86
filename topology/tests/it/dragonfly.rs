//! Dragonflies: the canonical one (shapes, minimal, Valiant, UGAL) and SimGrid's Cascade
//! variant hop for hop.

use std::collections::BTreeSet;

use topology::{CascadeSpec, DragonflySpec, FabricSpec, HostId, LinkId, Routing, Tier, Topology, Vertex};

use crate::{assert_walk, cluster, link, simgrid_cluster, simgrid_link, simgrid_route};

fn cascade(text: &str) -> FabricSpec {
    FabricSpec::CascadeDragonfly(CascadeSpec::from_simgrid(text, simgrid_link()).unwrap())
}

/// The four dragonflies of simulators.md: label, string, hosts, groups.
const SIMGRID_DRAGONFLIES: [(&str, &str, u32, u32); 4] = [
    ("DF16", "2,1;1,1;2,1;4", 16, 2),
    ("DF64", "4,1;1,1;4,1;4", 64, 4),
    ("DF128a", "8,1;1,1;8,1;2", 128, 8),
    ("DF128b", "4,1;2,1;4,1;4", 128, 4),
];

fn balanced(h: u32) -> FabricSpec {
    let l = link("200 Gb/s", "1 us");
    FabricSpec::Dragonfly(DragonflySpec::balanced(h, l, l, l))
}

/// The group of the router a link leaves from (canonical dragonfly: `router / a`).
fn group_of_switch(topology: &Topology, vertex: petgraph::graph::NodeIndex, routers_per_group: u32) -> u32 {
    match topology.graph()[vertex] {
        Vertex::NetworkSwitch { index } => index / routers_per_group,
        other => panic!("{other:?} is not a router"),
    }
}

#[test]
fn canonical_dragonfly_has_kim_et_al_counts() {
    // h = 2: p = 2 hosts per router, a = 4 routers per group, 9 groups.
    let topology = cluster(72, 1, balanced(2), Routing::Auto);
    assert_eq!(topology.routing(), Routing::Minimal);
    assert_eq!(topology.host_count(), 72);
    assert_eq!(topology.switch_count(), 36);
    // 72 terminal cables, 9 groups x 6 local pairs, 36 group pairs x 1 global link.
    assert_eq!(topology.link_count(), 2 * (72 + 9 * 6 + 36));
    let globals = topology.graph().raw_edges().iter().filter(|e| e.weight.tier == Tier::Global).count();
    assert_eq!(globals, 2 * 36);
    // Every router has h = 2 global ports in use.
    for router in topology
        .graph()
        .node_indices()
        .filter(|&v| matches!(topology.graph()[v], Vertex::NetworkSwitch { .. }))
    {
        let ports = topology.graph().edges(router).filter(|e| e.weight().tier == Tier::Global).count();
        assert_eq!(ports, 2);
    }
}

#[test]
fn fewer_groups_get_several_global_links_per_pair() {
    // 3 groups of 4 routers with 2 global ports each: 8 ports per group, 4 links per pair.
    let l = link("100 Gb/s", "1 us");
    let spec = DragonflySpec {
        groups: 3,
        routers_per_group: 4,
        hosts_per_router: 1,
        global_links_per_router: 2,
        terminal: l,
        local: l,
        global: l,
    };
    let topology = cluster(12, 1, FabricSpec::Dragonfly(spec), Routing::Minimal);
    let globals = topology.graph().raw_edges().iter().filter(|e| e.weight.tier == Tier::Global).count();
    assert_eq!(globals, 2 * 3 * 4);
    // Minimal routes pick the copy with the fewest local hops: router 0 of group 0 owns a
    // link to group 1 whose far end is router 0 of group 1, so host 0 -> host 4 is direct.
    assert_eq!(topology.route(HostId(0), HostId(4)).unwrap().len(), 3);
}

#[test]
fn valiant_routes_through_a_third_group() {
    let topology = cluster(72, 1, balanced(2), Routing::Valiant);
    let minimal = cluster(72, 1, balanced(2), Routing::Minimal);
    let mut intermediates = BTreeSet::new();
    for (src, dst) in [(0u32, 71u32), (9, 30), (40, 2)] {
        let (gs, gd) = (src / 8, dst / 8);
        for flow in 0..200 {
            let route = topology.route_for_flow(HostId(src), HostId(dst), flow).unwrap();
            assert_walk(&topology, HostId(src), HostId(dst), &route);
            let globals: Vec<LinkId> =
                route.iter().copied().filter(|&l| topology.link(l).tier == Tier::Global).collect();
            assert_eq!(globals.len(), 2, "Valiant takes two global links");
            let edge = &topology.graph().raw_edges()[globals[0].0 as usize];
            let via = group_of_switch(&topology, edge.target(), 4);
            assert!(via != gs && via != gd, "intermediate group {via} is an end ({gs}, {gd})");
            intermediates.insert(via);
        }
        // Inside a group Valiant stays minimal.
        let same_group = (src / 8 * 8, src / 8 * 8 + 7);
        assert_eq!(
            topology.route(HostId(same_group.0), HostId(same_group.1)).unwrap(),
            minimal.route(HostId(same_group.0), HostId(same_group.1)).unwrap()
        );
    }
    // The hash spreads over the 7 possible intermediate groups and more.
    assert!(intermediates.len() >= 7, "{intermediates:?}");
    // With two groups there is no third one: Valiant is minimal.
    let l = link("100 Gb/s", "1 us");
    let two = DragonflySpec {
        groups: 2,
        routers_per_group: 2,
        hosts_per_router: 2,
        global_links_per_router: 1,
        terminal: l,
        local: l,
        global: l,
    };
    let valiant = cluster(8, 1, FabricSpec::Dragonfly(two.clone()), Routing::Valiant);
    let minimal = cluster(8, 1, FabricSpec::Dragonfly(two), Routing::Minimal);
    for flow in 0..10 {
        assert_eq!(
            valiant.route_for_flow(HostId(0), HostId(7), flow).unwrap(),
            minimal.route_for_flow(HostId(0), HostId(7), flow).unwrap()
        );
    }
}

#[test]
fn ugal_offers_minimal_and_valiant_candidates() {
    let ugal = cluster(72, 1, balanced(2), Routing::Ugal);
    let minimal = cluster(72, 1, balanced(2), Routing::Minimal);
    let valiant = cluster(72, 1, balanced(2), Routing::Valiant);
    for flow in 0..20 {
        let (src, dst) = (HostId(3), HostId(60));
        let (first, second) = ugal.route_candidates(src, dst, flow).unwrap();
        assert_eq!(first, minimal.route_for_flow(src, dst, flow).unwrap());
        assert_eq!(first, ugal.route_for_flow(src, dst, flow).unwrap());
        assert_eq!(second, Some(valiant.route_for_flow(src, dst, flow).unwrap()));
        // Same group: nothing to adapt.
        assert_eq!(ugal.route_candidates(HostId(0), HostId(7), flow).unwrap().1, None);
    }
    // Other routings never offer a second route.
    assert_eq!(valiant.route_candidates(HostId(3), HostId(60), 1).unwrap().1, None);
    let cascade_ugal = cluster(64, 1, cascade("4,1;1,1;4,1;4"), Routing::Ugal);
    let (first, second) = cascade_ugal.route_candidates(HostId(0), HostId(63), 7).unwrap();
    assert_eq!(first.len(), 5);
    let second = second.unwrap();
    assert_walk(&cascade_ugal, HostId(0), HostId(63), &second);
    assert_eq!(second.iter().filter(|&&l| cascade_ugal.link(l).tier == Tier::Global).count(), 2);
}

#[test]
fn cascade_dragonflies_have_simgrids_counts() {
    for (label, text, hosts, groups) in SIMGRID_DRAGONFLIES {
        let spec = CascadeSpec::from_simgrid(text, simgrid_link()).unwrap();
        assert_eq!(spec.terminal_capacity(), u64::from(hosts), "{label}");
        let topology = simgrid_cluster(hosts, FabricSpec::CascadeDragonfly(spec.clone()));
        let (g, c, r) =
            (u64::from(groups), u64::from(spec.chassis_per_group), u64::from(spec.routers_per_chassis));
        assert_eq!(topology.switch_count() as u64, g * c * r, "{label}");
        let cables = u64::from(hosts) + g * c * r * (r - 1) / 2 + g * c * (c - 1) / 2 * r + g * (g - 1) / 2;
        assert_eq!(topology.link_count() as u64, 2 * cables, "{label}");
    }
}

#[test]
fn cascade_perm_crosses_one_blue_link_per_group() {
    // simulators.md: "in perm, all N/G flows of a group cross one blue link".
    for (label, text, hosts, groups) in SIMGRID_DRAGONFLIES {
        let topology = simgrid_cluster(hosts, cascade(text));
        let per_group = hosts / groups;
        for group in 0..groups {
            let mut blue = BTreeSet::new();
            for src in group * per_group..(group + 1) * per_group {
                let dst = (src + hosts / 2) % hosts;
                let route = topology.route(HostId(src), HostId(dst)).unwrap();
                let globals: Vec<LinkId> =
                    route.iter().copied().filter(|&l| topology.link(l).tier == Tier::Global).collect();
                assert_eq!(globals.len(), 1, "{label}: {src} -> {dst}");
                blue.insert(globals[0]);
            }
            assert_eq!(blue.len(), 1, "{label}: group {group}'s perm flows use {} blue links", blue.len());
        }
    }
}

#[test]
fn df128b_ring_flows_collide_on_one_green_link() {
    // simulators.md: "the ring flow h127->h0 and the ring flow h15->h16 both use green link 3->0
    // of group 0, chassis 0".
    let topology = simgrid_cluster(128, cascade("4,1;2,1;4,1;4"));
    let a = topology.route(HostId(127), HostId(0)).unwrap();
    let b = topology.route(HostId(15), HostId(16)).unwrap();
    let shared: Vec<LinkId> = a.iter().copied().filter(|l| b.contains(l)).collect();
    assert_eq!(shared.len(), 1);
    assert_eq!(topology.link(shared[0]).tier, Tier::Local);
    let edge = &topology.graph().raw_edges()[shared[0].0 as usize];
    let names = [edge.source(), edge.target()].map(|v| match topology.graph()[v] {
        Vertex::NetworkSwitch { index } => index,
        other => panic!("{other:?}"),
    });
    // Routers (group 0, chassis 0, blade 3) -> (group 0, chassis 0, blade 0).
    assert_eq!(names, [3, 0]);
    // No other pair of ring flows shares a link.
    let mut users = vec![0u32; topology.link_count()];
    for i in 0..128 {
        for &l in topology.route(HostId(i), HostId((i + 1) % 128)).unwrap().iter() {
            users[l.0 as usize] += 1;
        }
    }
    assert_eq!(users.iter().filter(|&&n| n > 1).count(), 1);
}

/// Routes printed by SimGrid 3.32 (Debian's libsimgrid-dev 3.32-2) with the reference harness,
/// `collsim TOPO N PATTERN 1 --routes` (../shared/reference/simgrid/collsim.cpp).
const SIMGRID_CASCADE_ROUTES: &[(&str, u32, &str)] = &[
    // collsim "df:2,1;1,1;2,1;4" 16 perm 1 --routes (first line)
    (
        "2,1;1,1;2,1;4",
        16,
        "h0 -> h8 (4 links, lat 4e-06): local_link_from_router_0_to_node_0_0_UP green_link_in_chassis_0_between_routers_0_and_1_16_UP blue_link_between_group_0_and_1_routers_1_and_2_18_UP local_link_from_router_2_to_node_0_8_DOWN",
    ),
    // collsim "df:8,1;1,1;8,1;2" 128 "pairs:0-127,127-0,37-90" 1 --routes
    (
        "8,1;1,1;8,1;2",
        128,
        "h0 -> h127 (5 links, lat 5e-06): local_link_from_router_0_to_node_0_0_UP green_link_in_chassis_0_between_routers_0_and_7_134_UP blue_link_between_group_0_and_7_routers_7_and_56_358_UP green_link_in_chassis_0_between_routers_0_and_7_330_UP local_link_from_router_63_to_node_1_127_DOWN
h127 -> h0 (5 links, lat 5e-06): local_link_from_router_63_to_node_1_127_UP green_link_in_chassis_0_between_routers_0_and_7_330_DOWN blue_link_between_group_0_and_7_routers_7_and_56_358_DOWN green_link_in_chassis_0_between_routers_0_and_7_134_DOWN local_link_from_router_0_to_node_0_0_DOWN
h37 -> h90 (5 links, lat 5e-06): local_link_from_router_18_to_node_1_37_UP green_link_in_chassis_0_between_routers_2_and_5_199_UP blue_link_between_group_2_and_5_routers_21_and_42_367_UP green_link_in_chassis_0_between_routers_2_and_5_283_UP local_link_from_router_45_to_node_0_90_DOWN",
    ),
    // collsim "df:4,1;2,1;4,1;4" 128 "pairs:127-0,15-16,16-0,20-100,0-1,0-4,17-33,100-20" 1 --routes
    (
        "4,1;2,1;4,1;4",
        128,
        "h127 -> h0 (6 links, lat 6e-06): local_link_from_router_31_to_node_3_127_UP green_link_in_chassis_1_between_routers_0_and_3_172_DOWN black_link_in_group_3_between_chassis_0_and_1_blade_0_188_DOWN blue_link_between_group_0_and_3_routers_3_and_24_194_DOWN green_link_in_chassis_0_between_routers_0_and_3_130_DOWN local_link_from_router_0_to_node_0_0_DOWN
h15 -> h16 (4 links, lat 4e-06): local_link_from_router_3_to_node_3_15_UP green_link_in_chassis_0_between_routers_0_and_3_130_DOWN black_link_in_group_0_between_chassis_0_and_1_blade_0_176_UP local_link_from_router_4_to_node_0_16_DOWN
h16 -> h0 (3 links, lat 3e-06): local_link_from_router_4_to_node_0_16_UP black_link_in_group_0_between_chassis_0_and_1_blade_0_176_DOWN local_link_from_router_0_to_node_0_0_DOWN
h20 -> h100 (6 links, lat 6e-06): local_link_from_router_5_to_node_0_20_UP green_link_in_chassis_1_between_routers_1_and_3_138_UP black_link_in_group_0_between_chassis_0_and_1_blade_3_179_DOWN blue_link_between_group_0_and_3_routers_3_and_24_194_UP green_link_in_chassis_0_between_routers_0_and_1_164_UP local_link_from_router_25_to_node_0_100_DOWN
h0 -> h1 (2 links, lat 2e-06): local_link_from_router_0_to_node_0_0_UP local_link_from_router_0_to_node_1_1_DOWN
h0 -> h4 (3 links, lat 3e-06): local_link_from_router_0_to_node_0_0_UP green_link_in_chassis_0_between_routers_0_and_1_128_UP local_link_from_router_1_to_node_0_4_DOWN
h17 -> h33 (5 links, lat 5e-06): local_link_from_router_4_to_node_1_17_UP green_link_in_chassis_1_between_routers_0_and_1_134_UP black_link_in_group_0_between_chassis_0_and_1_blade_1_177_DOWN blue_link_between_group_0_and_1_routers_1_and_8_192_UP local_link_from_router_8_to_node_1_33_DOWN
h100 -> h20 (6 links, lat 6e-06): local_link_from_router_25_to_node_0_100_UP green_link_in_chassis_0_between_routers_0_and_1_164_DOWN blue_link_between_group_0_and_3_routers_3_and_24_194_DOWN green_link_in_chassis_0_between_routers_1_and_3_132_DOWN black_link_in_group_0_between_chassis_0_and_1_blade_1_177_UP local_link_from_router_5_to_node_0_20_DOWN",
    ),
    // collsim "df:3,2;3,2;4,3;2" 72 "pairs:0-71,71-0,30-50" 1 --routes (parallel cables)
    (
        "3,2;3,2;4,3;2",
        72,
        "h0 -> h71 (6 links, lat 6e-06): local_link_from_router_0_to_node_0_0_UP green_link_in_chassis_0_between_routers_0_and_2_73_UP blue_link_between_group_0_and_2_routers_2_and_24_163_UP green_link_in_chassis_0_between_routers_0_and_3_110_UP black_link_in_group_2_between_chassis_0_and_2_blade_3_157_UP local_link_from_router_35_to_node_1_71_DOWN
h71 -> h0 (6 links, lat 6e-06): local_link_from_router_35_to_node_1_71_UP green_link_in_chassis_2_between_routers_0_and_3_122_DOWN black_link_in_group_2_between_chassis_0_and_2_blade_0_154_DOWN blue_link_between_group_0_and_2_routers_2_and_24_163_DOWN green_link_in_chassis_0_between_routers_0_and_2_73_DOWN local_link_from_router_0_to_node_0_0_DOWN
h30 -> h50 (4 links, lat 4e-06): local_link_from_router_15_to_node_0_30_UP green_link_in_chassis_0_between_routers_2_and_3_95_DOWN blue_link_between_group_1_and_2_routers_14_and_25_164_UP local_link_from_router_25_to_node_0_50_DOWN",
    ),
];

#[test]
fn cascade_routes_are_simgrids_link_for_link() {
    for &(shape, hosts, lines) in SIMGRID_CASCADE_ROUTES {
        let topology = simgrid_cluster(hosts, cascade(shape));
        for line in lines.lines() {
            let (src, dst, expected) = simgrid_route(line);
            assert_eq!(&*topology.route(src, dst).unwrap(), expected.as_slice(), "{shape}: {line}");
        }
    }
}

#[test]
fn cascade_routes_leave_from_the_chassis_they_are_in() {
    // SimGrid 3.32 prints, for `collsim "df:4,1;2,1;4,1;4" 128 "pairs:16-21" 1 --routes`:
    //   h16 -> h21: local_..._16_UP green_link_in_chassis_1_between_routers_0_and_1_134_UP
    //               black_link_in_group_0_between_chassis_0_and_1_blade_1_177_UP local_..._21_DOWN
    // after the green hop it believes it is in chassis 0 and adds a black link from chassis 0
    // that the walk never reaches (h16 and h21 are both in chassis 1). Here the route is the
    // connected walk: terminal, green hop inside chassis 1, terminal.
    let topology = simgrid_cluster(128, cascade("4,1;2,1;4,1;4"));
    let route = topology.route(HostId(16), HostId(21)).unwrap();
    assert_eq!(&*route, &[LinkId(32), LinkId(268), LinkId(43)]);
    assert_walk(&topology, HostId(16), HostId(21), &route);
    // And from chassis 1 to chassis 0 at another blade it takes the black hop SimGrid omits.
    let route = topology.route(HostId(16), HostId(4)).unwrap();
    assert_eq!(route.len(), 4);
    assert_walk(&topology, HostId(16), HostId(4), &route);
}
