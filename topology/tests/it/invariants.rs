//! On small instances of every fabric and server shape: every route is a walk from source to
//! destination through switches only, and minimal routings are shortest.

use petgraph::visit::EdgeRef;
use topology::{
    CascadeSpec, ClusterSpec, DragonflySpec, FabricSpec, HostId, IntraNode, LinkSpec, NetworkSpec, Routing,
    Tier, Topology, Vertex, XgftSpec,
};

use crate::{assert_walk, link};

struct Case {
    name: &'static str,
    nodes: u32,
    gpus: u32,
    nics: Option<u32>,
    rails: bool,
    mesh: bool,
    fabric: FabricSpec,
    routings: &'static [Routing],
}

fn cases() -> Vec<Case> {
    let l = link("100 Gb/s", "1 us");
    let tree = |text: &str| FabricSpec::FatTree(XgftSpec::from_simgrid(text, l).unwrap());
    let dragonfly = |groups, routers, hosts, ports| {
        FabricSpec::Dragonfly(DragonflySpec {
            groups,
            routers_per_group: routers,
            hosts_per_router: hosts,
            global_links_per_router: ports,
            terminal: l,
            local: l,
            global: l,
        })
    };
    let cascade = |text: &str| FabricSpec::CascadeDragonfly(CascadeSpec::from_simgrid(text, l).unwrap());
    let fat_tree_routings: &[Routing] = &[Routing::DModK, Routing::Ecmp];
    let dragonfly_routings: &[Routing] = &[Routing::Minimal, Routing::Valiant, Routing::Ugal];
    let shortest: &[Routing] = &[Routing::Shortest];
    let case = |name, nodes, gpus, fabric, routings| Case {
        name,
        nodes,
        gpus,
        nics: None,
        rails: false,
        mesh: false,
        fabric,
        routings,
    };
    vec![
        case("switch", 5, 2, FabricSpec::Switch { link: l }, shortest),
        Case {
            nics: Some(1),
            mesh: true,
            ..case("switch, shared NIC, mesh", 3, 4, FabricSpec::Switch { link: l }, shortest)
        },
        case("FT3-k4", 16, 1, tree("3;2,2,4;1,2,2;1,1,1"), fat_tree_routings),
        Case { rails: true, ..case("FT3-k4, rails", 4, 4, tree("3;2,2,4;1,2,2;1,1,1"), fat_tree_routings) },
        Case {
            nics: Some(2),
            rails: true,
            ..case("leaf-spine, shared NICs, rails", 8, 4, tree("2;4,8;1,4;1,1"), fat_tree_routings)
        },
        case("odd XGFT, parallel cables", 9, 2, tree("3;3,2,3;1,3,2;3,2,2"), fat_tree_routings),
        case("XGFT, partly populated", 5, 2, tree("4;2,2,2,2;2,2,2,2;1,2,1,3"), fat_tree_routings),
        case("dragonfly 5x2x2, h=2", 10, 2, dragonfly(5, 2, 2, 2), dragonfly_routings),
        case("dragonfly 3 groups, 4 copies", 12, 1, dragonfly(3, 4, 1, 2), dragonfly_routings),
        Case {
            nics: Some(2),
            ..case("dragonfly, shared NICs", 8, 4, dragonfly(4, 3, 2, 1), dragonfly_routings)
        },
        case("DF16", 16, 1, cascade("2,1;1,1;2,1;4"), dragonfly_routings),
        case("cascade 3,2;3,2;4,3;2", 36, 2, cascade("3,2;3,2;4,3;2"), dragonfly_routings),
        Case {
            nics: Some(1),
            ..case("DF128b, shared NIC", 32, 4, cascade("4,1;2,1;4,1;4"), dragonfly_routings)
        },
        case("torus 3x4", 6, 2, FabricSpec::Torus { dims: vec![3, 4], link: l }, shortest),
        case("torus 2x3x2", 12, 1, FabricSpec::Torus { dims: vec![2, 3, 2], link: l }, shortest),
        case("torus 4x4, partly populated", 10, 1, FabricSpec::Torus { dims: vec![4, 4], link: l }, shortest),
        case("torus 1x5", 5, 1, FabricSpec::Torus { dims: vec![1, 5], link: l }, shortest),
        case("ring", 7, 1, FabricSpec::Ring { link: l }, shortest),
        Case { mesh: true, ..case("ring of 2, mesh", 2, 3, FabricSpec::Ring { link: l }, shortest) },
        Case {
            nics: Some(1),
            ..case("fully connected, shared NIC", 6, 2, FabricSpec::FullyConnected { link: l }, shortest)
        },
    ]
}

fn build(case: &Case, routing: Routing) -> Topology {
    let intra = link("300 GB/s", "0.7 us");
    Topology::build(&ClusterSpec {
        nodes: case.nodes,
        gpus_per_node: case.gpus,
        intra_node: if case.mesh { IntraNode::NvLinkMesh(intra) } else { IntraNode::NvSwitch(intra) },
        network: NetworkSpec {
            fabric: case.fabric.clone(),
            routing,
            nics_per_node: case.nics,
            rail_optimized: case.rails,
            gpu_to_nic: Some(LinkSpec::new("32 GB/s".parse().unwrap(), "0.5 us".parse().unwrap())),
            transport: topology::Transport::default(),
        },
        host_memory: None,
    })
    .unwrap_or_else(|error| panic!("{}: {error}", case.name))
}

#[test]
fn every_route_is_a_walk_through_switches_and_minimal_ones_are_shortest() {
    for case in cases() {
        for &routing in case.routings {
            let topology = build(&case, routing);
            let canonical_dragonfly = matches!(case.fabric, FabricSpec::Dragonfly(_));
            let hosts = topology.host_count() as u32;
            for src in 0..hosts {
                let shortest = topology.paths_from(HostId(src)).unwrap();
                for dst in 0..hosts {
                    for flow in [0, 1, 2, 77] {
                        let (src, dst) = (HostId(src), HostId(dst));
                        let label = format!("{} ({routing}): {src} -> {dst}, flow {flow}", case.name);
                        let (route, alternative) = topology.route_candidates(src, dst, flow).unwrap();
                        assert_eq!(route, topology.route_for_flow(src, dst, flow).unwrap(), "{label}");
                        assert_walk(&topology, src, dst, &route);
                        if let Some(alternative) = alternative {
                            assert_walk(&topology, src, dst, &alternative);
                        }
                        // A canonical dragonfly's minimal route takes at most one global link,
                        // which is sometimes longer than a path through two.
                        let best = if canonical_dragonfly {
                            shortest_with_one_global_link(&topology, src, dst)
                        } else {
                            shortest[dst.0 as usize].len()
                        };
                        if routing == Routing::Valiant {
                            assert!(route.len() >= shortest[dst.0 as usize].len(), "{label}");
                        } else {
                            assert_eq!(route.len(), best, "{label}: {:?}", &*route);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn dragonfly_minimal_routes_take_at_most_one_global_link() {
    for case in cases() {
        if !matches!(case.fabric, FabricSpec::Dragonfly(_) | FabricSpec::CascadeDragonfly(_)) {
            continue;
        }
        let topology = build(&case, Routing::Minimal);
        let hosts = topology.host_count() as u32;
        for src in 0..hosts {
            for dst in 0..hosts {
                let route = topology.route(HostId(src), HostId(dst)).unwrap();
                let globals =
                    route.iter().filter(|&&l| topology.link(l).tier == topology::Tier::Global).count();
                assert!(globals <= 1, "{}: {src} -> {dst}", case.name);
            }
        }
    }
}

/// Links on the shortest walk from `src` to `dst` through switches that takes at most one
/// global link: breadth-first over (vertex, global links used).
fn shortest_with_one_global_link(topology: &Topology, src: HostId, dst: HostId) -> usize {
    use std::collections::VecDeque;
    let graph = topology.graph();
    let start = topology.vertex_of(src).unwrap();
    let goal = topology.vertex_of(dst).unwrap();
    if start == goal {
        return 0;
    }
    let mut distance = vec![[usize::MAX; 2]; graph.node_count()];
    distance[start.index()][0] = 0;
    let mut frontier = VecDeque::from([(start, 0usize)]);
    while let Some((vertex, globals)) = frontier.pop_front() {
        let here = distance[vertex.index()][globals];
        if vertex == goal {
            return here;
        }
        if vertex != start && matches!(graph[vertex], Vertex::Gpu { .. }) {
            continue;
        }
        for edge in graph.edges(vertex) {
            let used = globals + usize::from(edge.weight().tier == Tier::Global);
            let next = edge.target();
            // A NIC forwards only between its GPUs and the fabric, never GPU to GPU.
            let via_nic_to_gpu = matches!(graph[vertex], Vertex::Nic { .. })
                && matches!(graph[next], Vertex::Gpu { .. })
                && here == 1;
            if used <= 1 && !via_nic_to_gpu && distance[next.index()][used] == usize::MAX {
                distance[next.index()][used] = here + 1;
                frontier.push_back((next, used));
            }
        }
    }
    panic!("{src} -> {dst}: no walk with at most one global link")
}
