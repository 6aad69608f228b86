//! topology integration tests: every fabric's shape and routes, SimGrid 3.32's routes
//! transcribed hop for hop, scale, errors and the summary.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod dragonfly;
mod errors;
mod fat_tree;
mod invariants;
mod scale;
mod summary;

use topology::{
    ClusterSpec, FabricSpec, HostId, IntraNode, LinkId, LinkSpec, NetworkSpec, Routing, Topology, Vertex,
};

/// A link of `bandwidth` and `latency`.
pub fn link(bandwidth: &str, latency: &str) -> LinkSpec {
    LinkSpec::new(bandwidth.parse().unwrap(), latency.parse().unwrap())
}

/// SimGrid's reference links: 100 Gb/s, 1 us.
pub fn simgrid_link() -> LinkSpec {
    link("100 Gb/s", "1 us")
}

/// `nodes` servers of `gpus` GPUs (NVSwitch inside) on `fabric` with `routing`.
pub fn cluster(nodes: u32, gpus: u32, fabric: FabricSpec, routing: Routing) -> Topology {
    Topology::build(&ClusterSpec {
        nodes,
        gpus_per_node: gpus,
        intra_node: IntraNode::NvSwitch(link("300 GB/s", "0.7 us")),
        network: NetworkSpec { routing, ..NetworkSpec::new(fabric) },
        host_memory: None,
    })
    .unwrap()
}

/// One single-GPU server per terminal of `fabric`, as SimGrid's hosts.
pub fn simgrid_cluster(hosts: u32, fabric: FabricSpec) -> Topology {
    cluster(hosts, 1, fabric, Routing::Auto)
}

/// Parses one line of `collsim ... --routes` output (`h0 -> h8 (6 links, lat 6e-06): name...`)
/// into its hosts and links. SimGrid names every link `..._<unique id>_UP|DOWN`; with one GPU
/// per server our fabric cable `u` is SimGrid's unique id `u`, UP its forward link `2u`.
pub fn simgrid_route(line: &str) -> (HostId, HostId, Vec<LinkId>) {
    let (head, names) = line.split_once("):").unwrap();
    let mut hosts = head.split(" (").next().unwrap().split(" -> ").map(|h| HostId(h[1..].parse().unwrap()));
    let (src, dst) = (hosts.next().unwrap(), hosts.next().unwrap());
    let links = names
        .split_whitespace()
        .map(|name| {
            let (rest, direction) = name.rsplit_once('_').unwrap();
            let unique: u32 = rest.rsplit_once('_').unwrap().1.parse().unwrap();
            LinkId(2 * unique + u32::from(direction == "DOWN"))
        })
        .collect();
    (src, dst, links)
}

/// Checks that `route` is a walk from `src`'s GPU to `dst`'s that visits no vertex twice, and
/// whose inner vertices are switches, or a NIC right after the source or right before the
/// destination.
pub fn assert_walk(topology: &Topology, src: HostId, dst: HostId, route: &[LinkId]) {
    let graph = topology.graph();
    let edges = graph.raw_edges();
    let mut at = topology.vertex_of(src).unwrap();
    let mut visited = vec![at];
    for (i, &link) in route.iter().enumerate() {
        let edge = &edges[link.0 as usize];
        assert_eq!(
            edge.source(),
            at,
            "{src} -> {dst}: link {i} of {route:?} does not leave the vertex reached"
        );
        at = edge.target();
        assert!(!visited.contains(&at), "{src} -> {dst}: {route:?} visits a vertex twice");
        visited.push(at);
        if i + 1 < route.len() {
            match graph[at] {
                Vertex::Gpu { .. } => panic!("{src} -> {dst}: {route:?} passes through a GPU"),
                Vertex::Nic { .. } => {
                    assert!(i == 0 || i + 2 == route.len(), "{src} -> {dst}: {route:?} passes through a NIC")
                }
                _ => {}
            }
        }
    }
    assert_eq!(at, topology.vertex_of(dst).unwrap(), "{src} -> {dst}: {route:?} ends elsewhere");
}

/// How many routes of `pairs` use each link.
pub fn link_loads(topology: &Topology, pairs: impl IntoIterator<Item = (u32, u32)>) -> Vec<u32> {
    let mut loads = vec![0; topology.link_count()];
    for (src, dst) in pairs {
        for &link in topology.route(HostId(src), HostId(dst)).unwrap().iter() {
            loads[link.0 as usize] += 1;
        }
    }
    loads
}
