//! Cluster graphs: GPUs, switches and the directed links between them, and the routes that
//! traffic takes.
//!
//! A [`Topology`] is a petgraph directed graph. Every physical cable is two links, one per
//! direction (full duplex), each with its own bandwidth and latency. Hosts (GPUs, in rank
//! order) are dense [`HostId`]s; links are dense [`LinkId`]s. The crate is a pure library: no
//! event loop, no I/O.
//!
//! ```
//! use topology::{ClusterSpec, IntraNode, LinkSpec, Topology};
//! let nic = LinkSpec::new("200 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
//! let nvswitch = LinkSpec::new("300 GB/s".parse().unwrap(), "0.7 us".parse().unwrap());
//! let cluster = ClusterSpec { nodes: 2, gpus_per_node: 8, intra_node: IntraNode::NvSwitch(nvswitch), inter_node: nic };
//! let topology = Topology::build(&cluster).unwrap();
//! assert_eq!(topology.host_count(), 16);
//! // Two GPUs of one node talk through the NVSwitch; of two nodes, through the network switch.
//! let path = topology.shortest_path(topology::HostId(0), topology::HostId(9)).unwrap();
//! assert_eq!(path.len(), 2);
//! assert_eq!(topology.link(path[0]).bandwidth.display_bits().to_string(), "200 Gb/s");
//! ```

use std::collections::VecDeque;
use std::fmt;

use petgraph::graph::{DiGraph, EdgeIndex, NodeIndex};
use petgraph::visit::EdgeRef;
use units::{Bandwidth, SimDuration};

/// A host (one GPU, one rank's device), numbered densely in rank order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostId(pub u32);

/// A directed link, numbered densely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinkId(pub u32);

impl fmt::Display for HostId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "host {}", self.0)
    }
}

/// Bandwidth and latency of one direction of a cable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkSpec {
    /// Rate of one direction.
    pub bandwidth: Bandwidth,
    /// Time for the first byte to cross the link.
    pub latency: SimDuration,
}

impl LinkSpec {
    /// A link of `bandwidth` per direction and `latency`.
    pub const fn new(bandwidth: Bandwidth, latency: SimDuration) -> Self {
        LinkSpec { bandwidth, latency }
    }
}

/// Which part of the cluster a link belongs to (for reports and per-tier settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Inside a node: GPU to NVSwitch / PCIe switch.
    IntraNode,
    /// Between a GPU's NIC and the first network switch.
    NetworkEdge,
}

/// A directed link of the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Rate of this direction.
    pub bandwidth: Bandwidth,
    /// Time for the first byte to cross.
    pub latency: SimDuration,
    /// Where in the cluster the link is.
    pub tier: Tier,
}

/// A vertex of the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vertex {
    /// A GPU: `node` is the server it sits in, `local` its index inside the server.
    Gpu {
        /// The host id (= rank) of this GPU.
        host: HostId,
        /// The server.
        node: u32,
        /// Index inside the server.
        local: u32,
    },
    /// A node-internal switch (NVSwitch or PCIe switch) of server `node`.
    NodeSwitch {
        /// The server.
        node: u32,
    },
    /// A network switch.
    NetworkSwitch {
        /// Index among the network switches.
        index: u32,
    },
}

/// How the GPUs inside one server are connected to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntraNode {
    /// Every GPU has one link (of the given per-direction rate) to a non-blocking NVSwitch.
    NvSwitch(LinkSpec),
    /// Every GPU sits behind one PCIe switch.
    PcieSwitch(LinkSpec),
}

impl IntraNode {
    /// The GPU-to-switch link.
    pub fn link(self) -> LinkSpec {
        match self {
            IntraNode::NvSwitch(link) | IntraNode::PcieSwitch(link) => link,
        }
    }
}

/// A cluster of identical servers: `gpus_per_node` GPUs per server connected by `intra_node`,
/// and one network link per GPU (`inter_node`, its NIC) into a non-blocking network switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Number of servers.
    pub nodes: u32,
    /// GPUs in each server.
    pub gpus_per_node: u32,
    /// How GPUs inside a server reach each other.
    pub intra_node: IntraNode,
    /// Each GPU's link into the network.
    pub inter_node: LinkSpec,
}

/// A topology could not be built or queried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// A count that must be positive is zero.
    #[error("{what} must be at least 1, got 0")]
    Zero {
        /// Which count.
        what: &'static str,
    },
    /// The cluster has more hosts than a `HostId` can number.
    #[error("{nodes} nodes x {gpus_per_node} GPUs is more hosts than parasim can number (at most {max})")]
    TooManyHosts {
        /// Servers asked for.
        nodes: u32,
        /// GPUs per server asked for.
        gpus_per_node: u32,
        /// The limit.
        max: u64,
    },
    /// A host id past the end.
    #[error("{host} does not exist: the topology has {hosts} hosts")]
    UnknownHost {
        /// The id asked for.
        host: HostId,
        /// How many there are.
        hosts: usize,
    },
    /// No path connects two hosts.
    #[error("no path from {src} to {dst}")]
    Unreachable {
        /// Source.
        src: HostId,
        /// Destination.
        dst: HostId,
    },
}

/// A cluster graph with dense host and link ids.
#[derive(Debug, Clone)]
pub struct Topology {
    graph: DiGraph<Vertex, Link>,
    hosts: Vec<NodeIndex>,
    node_of_host: Vec<u32>,
    /// Each host's (up, down) links to its server's switch, if the server has several GPUs.
    intra_node_links: Vec<Option<(LinkId, LinkId)>>,
    /// Each host's (up, down) links to the network switch, if there are several servers.
    network_links: Vec<Option<(LinkId, LinkId)>>,
}

/// A path through the network: up to [`Route::CAPACITY`] link ids stored inline (no heap),
/// in travel order. Dereferences to `&[LinkId]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    links: [LinkId; Route::CAPACITY],
    len: u8,
}

impl Route {
    /// The longest route a topology may hand out.
    pub const CAPACITY: usize = 8;

    fn new(path: &[LinkId]) -> Route {
        let mut links = [LinkId(0); Route::CAPACITY];
        links[..path.len()].copy_from_slice(path);
        Route { links, len: path.len() as u8 }
    }
}

impl std::ops::Deref for Route {
    type Target = [LinkId];
    fn deref(&self) -> &[LinkId] {
        &self.links[..self.len as usize]
    }
}

impl Topology {
    /// Builds the graph of `spec`. Hosts are numbered so that consecutive hosts share a server.
    pub fn build(spec: &ClusterSpec) -> Result<Topology, TopologyError> {
        if spec.nodes == 0 {
            return Err(TopologyError::Zero { what: "nodes" });
        }
        if spec.gpus_per_node == 0 {
            return Err(TopologyError::Zero { what: "gpus-per-node" });
        }
        let host_count = u64::from(spec.nodes) * u64::from(spec.gpus_per_node);
        let max = u64::from(u32::MAX / 4);
        if host_count > max {
            return Err(TopologyError::TooManyHosts {
                nodes: spec.nodes,
                gpus_per_node: spec.gpus_per_node,
                max,
            });
        }
        let mut graph = DiGraph::new();
        let mut hosts = Vec::with_capacity(host_count as usize);
        let mut node_of_host = Vec::with_capacity(host_count as usize);
        let mut intra_node_links = Vec::with_capacity(host_count as usize);
        let mut network_links = Vec::with_capacity(host_count as usize);
        let network_switch = (spec.nodes > 1).then(|| graph.add_node(Vertex::NetworkSwitch { index: 0 }));
        for node in 0..spec.nodes {
            let node_switch = (spec.gpus_per_node > 1).then(|| graph.add_node(Vertex::NodeSwitch { node }));
            for local in 0..spec.gpus_per_node {
                let host = HostId(hosts.len() as u32);
                let gpu = graph.add_node(Vertex::Gpu { host, node, local });
                intra_node_links.push(node_switch.map(|switch| {
                    add_cable(&mut graph, gpu, switch, spec.intra_node.link(), Tier::IntraNode)
                }));
                network_links
                    .push(network_switch.map(|switch| {
                        add_cable(&mut graph, gpu, switch, spec.inter_node, Tier::NetworkEdge)
                    }));
                hosts.push(gpu);
                node_of_host.push(node);
            }
        }
        Ok(Topology { graph, hosts, node_of_host, intra_node_links, network_links })
    }

    /// Number of hosts.
    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }

    /// Number of directed links.
    pub fn link_count(&self) -> usize {
        self.graph.edge_count()
    }

    /// Number of switches (node-internal and network).
    pub fn switch_count(&self) -> usize {
        self.graph.node_count() - self.hosts.len()
    }

    /// The server that `host` sits in.
    pub fn node_of(&self, host: HostId) -> Result<u32, TopologyError> {
        self.node_of_host
            .get(host.0 as usize)
            .copied()
            .ok_or(TopologyError::UnknownHost { host, hosts: self.hosts.len() })
    }

    /// The link with id `id`. Ids come from this topology's own paths, so a foreign id is a
    /// programming error.
    pub fn link(&self, id: LinkId) -> &Link {
        &self.graph[EdgeIndex::new(id.0 as usize)]
    }

    /// The route traffic from `src` to `dst` takes, in O(1) from the cluster's structure: through
    /// the server's switch inside a server, through the network switch between servers; empty
    /// if `src == dst`. Memory stays linear in hosts, whatever the number of pairs asked for.
    pub fn route(&self, src: HostId, dst: HostId) -> Result<Route, TopologyError> {
        self.check_host(src)?;
        self.check_host(dst)?;
        let (s, d) = (src.0 as usize, dst.0 as usize);
        if s == d {
            return Ok(Route::new(&[]));
        }
        let links = if self.node_of_host[s] == self.node_of_host[d] {
            self.intra_node_links[s].zip(self.intra_node_links[d])
        } else {
            self.network_links[s].zip(self.network_links[d])
        };
        let ((up, _), (_, down)) = links.ok_or(TopologyError::Unreachable { src, dst })?;
        Ok(Route::new(&[up, down]))
    }

    /// The fewest-hop path from `src` to `dst` by breadth-first search, as link ids in travel
    /// order (empty if `src == dst`). Ties are broken by the lowest link id, so the path is
    /// deterministic. O(vertices + links) per call: for analyses and tests, not hot paths.
    pub fn shortest_path(&self, src: HostId, dst: HostId) -> Result<Vec<LinkId>, TopologyError> {
        self.check_host(dst)?;
        let tree = self.shortest_path_tree(src)?;
        self.path_in_tree(&tree, src, dst)
    }

    fn check_host(&self, host: HostId) -> Result<NodeIndex, TopologyError> {
        self.hosts
            .get(host.0 as usize)
            .copied()
            .ok_or(TopologyError::UnknownHost { host, hosts: self.hosts.len() })
    }

    /// Walks the search tree of `src` back from `dst`.
    fn path_in_tree(
        &self,
        tree: &[Option<EdgeIndex>],
        src: HostId,
        dst: HostId,
    ) -> Result<Vec<LinkId>, TopologyError> {
        let mut at = self.hosts[dst.0 as usize];
        let mut path = Vec::new();
        while let Some(edge) = tree[at.index()] {
            path.push(LinkId(edge.index() as u32));
            at = self.graph.raw_edges()[edge.index()].source();
        }
        if at != self.hosts[src.0 as usize] {
            return Err(TopologyError::Unreachable { src, dst });
        }
        path.reverse();
        Ok(path)
    }

    /// For every vertex, the link by which a breadth-first search from `src` first reached it.
    fn shortest_path_tree(&self, src: HostId) -> Result<Vec<Option<EdgeIndex>>, TopologyError> {
        let start = self.check_host(src)?;
        let mut reached_by = vec![None; self.graph.node_count()];
        let mut seen = vec![false; self.graph.node_count()];
        seen[start.index()] = true;
        let mut frontier = VecDeque::from([start]);
        let mut edges = Vec::new();
        while let Some(vertex) = frontier.pop_front() {
            edges.clear();
            edges.extend(self.graph.edges(vertex).map(|edge| (edge.id(), edge.target())));
            edges.sort_unstable();
            for &(edge, next) in &edges {
                if !seen[next.index()] {
                    seen[next.index()] = true;
                    reached_by[next.index()] = Some(edge);
                    // GPUs are endpoints, not routers: paths never pass through another GPU.
                    if !matches!(self.graph[next], Vertex::Gpu { .. }) {
                        frontier.push_back(next);
                    }
                }
            }
        }
        Ok(reached_by)
    }

    /// Shortest paths from `src` to every host, indexed by destination host id.
    pub fn paths_from(&self, src: HostId) -> Result<Vec<Vec<LinkId>>, TopologyError> {
        let tree = self.shortest_path_tree(src)?;
        (0..self.hosts.len()).map(|dst| self.path_in_tree(&tree, src, HostId(dst as u32))).collect()
    }

    /// The underlying graph (read-only), for analyses and export.
    pub fn graph(&self) -> &DiGraph<Vertex, Link> {
        &self.graph
    }
}

/// Adds a full-duplex cable between `a` and `b`: one link per direction; returns the ids of
/// (a -> b, b -> a).
fn add_cable(
    graph: &mut DiGraph<Vertex, Link>,
    a: NodeIndex,
    b: NodeIndex,
    spec: LinkSpec,
    tier: Tier,
) -> (LinkId, LinkId) {
    let link = Link { bandwidth: spec.bandwidth, latency: spec.latency, tier };
    let there = graph.add_edge(a, b, link);
    let back = graph.add_edge(b, a, link);
    (LinkId(there.index() as u32), LinkId(back.index() as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(bandwidth: &str, latency: &str) -> LinkSpec {
        LinkSpec::new(bandwidth.parse().unwrap(), latency.parse().unwrap())
    }

    fn cluster(nodes: u32, gpus_per_node: u32) -> Topology {
        Topology::build(&ClusterSpec {
            nodes,
            gpus_per_node,
            intra_node: IntraNode::NvSwitch(link("300 GB/s", "0.7 us")),
            inter_node: link("200 Gb/s", "1 us"),
        })
        .unwrap()
    }

    #[test]
    fn counts_match_the_shape() {
        let topology = cluster(8, 8);
        assert_eq!(topology.host_count(), 64);
        assert_eq!(topology.switch_count(), 8 + 1);
        // Each GPU: one cable to its NVSwitch and one to the network switch, two links each.
        assert_eq!(topology.link_count(), 64 * 2 * 2);
        assert_eq!(topology.node_of(HostId(9)).unwrap(), 1);
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
        assert_eq!(cluster(4, 1).switch_count(), 1);
        assert_eq!(cluster(1, 1).link_count(), 0);
    }

    #[test]
    fn bad_shapes_and_hosts_are_errors() {
        let spec = ClusterSpec {
            nodes: 0,
            gpus_per_node: 8,
            intra_node: IntraNode::NvSwitch(link("1 GB/s", "1 us")),
            inter_node: link("1 GB/s", "1 us"),
        };
        assert_eq!(Topology::build(&spec).unwrap_err(), TopologyError::Zero { what: "nodes" });
        let topology = cluster(1, 2);
        assert!(matches!(
            topology.shortest_path(HostId(0), HostId(7)),
            Err(TopologyError::UnknownHost { .. })
        ));
    }
}
