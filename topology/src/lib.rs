//! Cluster graphs: GPUs, NICs, switches and the directed links between them, and the routes
//! that traffic takes.
//!
//! A [`Topology`] is a petgraph directed graph. Every physical cable is two links, one per
//! direction (full duplex), each with its own bandwidth and latency. Hosts (GPUs, in rank
//! order) are dense [`HostId`]s; links are dense [`LinkId`]s. The crate is a pure library: no
//! event loop, no I/O.
//!
//! ```
//! use topology::{ClusterSpec, FabricSpec, IntraNode, LinkSpec, NetworkSpec, Topology, XgftSpec};
//! let nic = LinkSpec::new("200 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
//! let nvswitch = LinkSpec::new("300 GB/s".parse().unwrap(), "0.7 us".parse().unwrap());
//! let cluster = ClusterSpec {
//!     nodes: 2,
//!     gpus_per_node: 8,
//!     intra_node: IntraNode::NvSwitch(nvswitch),
//!     network: NetworkSpec::single_switch(nic),
//!     host_memory: None,
//! };
//! let topology = Topology::build(&cluster).unwrap();
//! assert_eq!(topology.host_count(), 16);
//! // Two GPUs of one node talk through the NVSwitch; of two nodes, through the network switch.
//! let path = topology.route(topology::HostId(0), topology::HostId(9)).unwrap();
//! assert_eq!(path.len(), 2);
//! assert_eq!(topology.link(path[0]).bandwidth.display_bits().to_string(), "200 Gb/s");
//!
//! // 16 single-GPU servers on SimGrid's FT3-k4 (a k = 4 three-level fat-tree), D-mod-K routing.
//! let fat_tree = XgftSpec::k_ary(4, 3, vec![nic; 3]).unwrap();
//! let cluster = ClusterSpec {
//!     nodes: 16,
//!     gpus_per_node: 1,
//!     intra_node: IntraNode::NvSwitch(nvswitch),
//!     network: NetworkSpec::new(FabricSpec::FatTree(fat_tree)),
//!     host_memory: None,
//! };
//! let topology = Topology::build(&cluster).unwrap();
//! assert_eq!(topology.switch_count(), 8 + 8 + 4);
//! // Across pods: up to a core switch and down again, six links.
//! assert_eq!(topology.route(topology::HostId(0), topology::HostId(8)).unwrap().len(), 6);
//! ```
//!
//! # How a cluster is composed
//!
//! - **GPUs** are the hosts, in rank order: host `h` is GPU `h % g` of server `h / g` (`g`
//!   GPUs per server), so consecutive hosts share a server.
//! - **Inside a server**, GPUs talk over the [`IntraNode`] fabric: a star through an NVSwitch
//!   or a PCIe switch (two links), or an NVLink mesh (a direct link between every pair of
//!   GPUs, one link). A server with one GPU has no intra-node fabric.
//! - **NICs are the fabric's terminals.** With one NIC per GPU (`nics_per_node: None`), the GPU
//!   vertex itself is the terminal: its NIC link is the fabric's terminal link (for a fat-tree,
//!   the level-0 cable), so SimGrid's shapes with one GPU per server have exactly SimGrid's
//!   host links. With `n` NICs for `g` GPUs, NIC `i` of a server is its own vertex serving
//!   GPUs `i*g/n .. (i+1)*g/n` through `gpu_to_nic` links (PCIe).
//! - **Terminal order.** Without rail optimization a server's NICs are consecutive terminals
//!   (`node * n + i`), so they share a leaf switch. With `rail_optimized`, NIC `i` of server
//!   `node` is terminal `i * nodes + node`: the same NIC of every server lands on the same
//!   leaf, a "rail", as in NVIDIA DGX SuperPOD. A fabric with more terminal positions than
//!   NICs populates the first ones.
//! - **Between servers** traffic goes GPU → (its NIC) → the fabric's route → (the NIC) → GPU.
//!   A single server has no network at all: no NICs, no fabric (its spec is still checked).
//!
//! Terminals and GPUs never forward traffic: a route enters the fabric at its source's
//! terminal and leaves it at its destination's, and [`Topology::shortest_path`] obeys the same
//! rule.
//!
//! # Routing
//!
//! Routes are computed structurally on demand from positions, in O(levels) time (O(copies of a
//! global link) on dragonflies), with no per-pair tables, so memory stays linear in links
//! (16k hosts need a few megabytes). [`Topology::route_for_flow`] hands out an inline
//! [`Route`] of at most [`Route::CAPACITY`] links.
//!
//! | fabric | routings (default first) |
//! |---|---|
//! | switch, fully connected | shortest (the only path) |
//! | ring, torus | shortest: dimension order, the shorter way round, ties the `+` way |
//! | fat-tree (XGFT) | `dmodk`, `ecmp` |
//! | dragonfly, cascade dragonfly | `minimal`, `valiant`, `ugal` |
//!
//! **D-mod-K** is SimGrid 3.32's: climbing from a node at level `l`, take up-port
//! `(d / prod(up[..l])) mod (up[l] * count[l])` where `d` is the destination terminal's leaf
//! position; port `p` is parent `p mod up[l]` over parallel cable `p / up[l]` (parallel cables
//! are separate links, each of the level's bandwidth). Climb until the switch's subtree holds
//! the destination, then go down the unique switch path; among parallel cables going down,
//! the one SimGrid's port scan picks (see the `xgft` module). Cables are created in SimGrid's
//! order, so with one GPU per server and every leaf populated, fabric cable `u` (links `2u`
//! up and `2u + 1` down) is SimGrid's link `..._u_UP` / `..._u_DOWN`; the same holds for the
//! cascade dragonfly.
//! **ECMP** picks every up-port (and every parallel cable down) by a deterministic hash
//! (SplitMix64) of (source host, destination host, flow id, level).
//!
//! **Dragonflies**: *minimal* takes at most one global link (on the canonical dragonfly, the
//! copy of the group pair's global links with the fewest local hops, ties by flow hash; as
//! in Kim et al., a path through two global links is never taken even where it happens to
//! be a hop shorter);
//! *valiant* goes minimally to an intermediate group, picked by a hash of (source,
//! destination, flow id) among the groups other than both ends, then minimally on (traffic
//! inside a group, and everything with two groups or fewer, stays minimal); *ugal* routes
//! minimally in [`Topology::route_for_flow`] and offers the Valiant route beside it in
//! [`Topology::route_candidates`], for the flow model to choose from its link loads. The
//! cascade variant routes exactly as SimGrid 3.32 (see [`CascadeSpec`] and the `cascade`
//! module for the one place it deliberately does not).

mod conditions;
mod error;
mod fabric;
mod hash;
mod spec;
mod summary;

use std::collections::VecDeque;
use std::fmt;

use petgraph::graph::{DiGraph, EdgeIndex, NodeIndex};
use petgraph::visit::EdgeRef;
use units::{Bandwidth, SimDuration};

pub use conditions::{JitterShape, LatencyJitter, LinkWindow};
pub use error::TopologyError;
pub use spec::{
    CascadeSpec, DragonflySpec, FabricSpec, HostCpu, NcclAlgorithms, NcclProtocols, NcclSettings,
    NcclVersion, NetworkSpec, Routing, Transport, TransportKind, XgftSpec,
};
pub use summary::{PathLengths, TopologySummary};

use fabric::{Fabric, Wiring, backward, forward, pair_index};
use hash::FlowKey;

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
    /// Inside a node: GPU to NVSwitch / PCIe switch, or GPU to GPU in an NVLink mesh.
    IntraNode,
    /// Inside a node: GPU to the NIC it shares with other GPUs.
    GpuToNic,
    /// Between a terminal (a NIC, or a GPU with its own NIC) and its first switch or router.
    NetworkEdge,
    /// Fat-tree cables between switch levels `level` and `level + 1` (level 1 = leaves).
    FatTree {
        /// The lower level.
        level: u8,
    },
    /// Dragonfly router-to-router links inside a group; the cascade dragonfly's green links
    /// inside a chassis.
    Local,
    /// The cascade dragonfly's black links between the chassis of a group.
    InterChassis,
    /// Dragonfly links between groups (the cascade dragonfly's blue links).
    Global,
    /// Torus (or ring) cables along dimension `dimension`.
    Torus {
        /// The dimension.
        dimension: u8,
    },
    /// A fully connected fabric's direct terminal-to-terminal cables.
    Direct,
    /// A GPU's link to its server's host memory.
    HostMemory,
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
    /// A NIC shared by several GPUs of server `node` (a terminal of the fabric).
    Nic {
        /// The server.
        node: u32,
        /// Index among the server's NICs.
        index: u32,
    },
    /// The host memory of server `node` (reached over each GPU's host link).
    HostMemory {
        /// The server.
        node: u32,
    },
    /// A network switch or router.
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
    /// A direct NVLink between every pair of GPUs (of the given per-direction rate), no
    /// switch.
    NvLinkMesh(LinkSpec),
}

impl IntraNode {
    /// "nvswitch 300 GB/s 0.7 us": the kind, rate and latency, as reports print it.
    pub fn describe(self) -> String {
        let (kind, link) = match self {
            IntraNode::NvSwitch(link) => ("nvswitch", link),
            IntraNode::PcieSwitch(link) => ("pcie-switch", link),
            IntraNode::NvLinkMesh(link) => ("nvlink-mesh", link),
        };
        format!("{kind} {} {}", link.bandwidth, link.latency)
    }

    /// The GPU-to-switch (or, for a mesh, GPU-to-GPU) link.
    pub fn link(self) -> LinkSpec {
        match self {
            IntraNode::NvSwitch(link) | IntraNode::PcieSwitch(link) | IntraNode::NvLinkMesh(link) => link,
        }
    }
}

/// A cluster of identical servers: `gpus_per_node` GPUs per server connected by `intra_node`,
/// and a `network` between the servers.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSpec {
    /// Number of servers.
    pub nodes: u32,
    /// GPUs in each server.
    pub gpus_per_node: u32,
    /// How GPUs inside a server reach each other.
    pub intra_node: IntraNode,
    /// The network between servers.
    pub network: NetworkSpec,
    /// Each GPU's link to its server's host memory (PCIe), for host <-> device copies
    /// (offload, out-of-core training); `None` for none.
    pub host_memory: Option<LinkSpec>,
}

/// A path through the network: up to [`Route::CAPACITY`] link ids stored inline (no heap),
/// in travel order. Dereferences to `&[LinkId]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    links: [LinkId; Route::CAPACITY],
    len: u8,
}

/// A route ran past [`Route::CAPACITY`] links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RouteFull;

impl Route {
    /// The longest route a topology may hand out: enough for Valiant routes on the cascade
    /// dragonfly with shared NICs (11 links) and 3-D tori of up to 9 routers a side.
    pub const CAPACITY: usize = 16;

    /// The route of no links (a host to itself).
    pub const EMPTY: Route = Route { links: [LinkId(0); Route::CAPACITY], len: 0 };

    pub(crate) fn push(&mut self, link: LinkId) -> Result<(), RouteFull> {
        let slot = self.links.get_mut(self.len as usize).ok_or(RouteFull)?;
        *slot = link;
        self.len += 1;
        Ok(())
    }
}

impl TryFrom<&[LinkId]> for Route {
    type Error = TopologyError;
    /// A route of `links`; an error if they are more than [`Route::CAPACITY`].
    fn try_from(links: &[LinkId]) -> Result<Route, TopologyError> {
        let mut route = Route::EMPTY;
        for &link in links {
            route.push(link).map_err(|RouteFull| TopologyError::Invalid {
                parameter: "route",
                problem: format!("{} links, more than the {} a route holds", links.len(), Route::CAPACITY),
            })?;
        }
        Ok(route)
    }
}

impl std::ops::Deref for Route {
    type Target = [LinkId];
    // Inlined across crates: the flow model walks routes in its innermost loops (a call per
    // walk cost 1.2% of a packet-steps run's instructions, plus the calls around it).
    #[inline]
    fn deref(&self) -> &[LinkId] {
        &self.links[..self.len as usize]
    }
}

/// How GPUs of a server reach each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Intra {
    /// One GPU per server.
    None,
    /// Through a node switch: host `h`'s cable to it is cable `h`.
    Star,
    /// GPU to GPU: pair `a < b` of server `n` is cable `n * g(g-1)/2 + pair_index(a, b)`.
    Mesh,
}

/// A cluster graph with dense host and link ids.
#[derive(Debug, Clone)]
pub struct Topology {
    graph: DiGraph<Vertex, Link>,
    /// Each host's GPU vertex.
    hosts: Vec<NodeIndex>,
    /// The fabric's terminals (NICs, or GPUs with their own NIC), in terminal order; empty
    /// for a single server.
    terminals: Vec<NodeIndex>,
    nodes: u32,
    gpus_per_node: u32,
    nics_per_node: u32,
    /// Whether GPUs share NICs (and have `gpu_to_nic` links to them).
    shared_nics: bool,
    rail_optimized: bool,
    intra: Intra,
    /// The cable of host 0 to its NIC (host `h`'s is this plus `h`), when NICs are shared.
    nic_cable_base: u64,
    /// The inter-node fabric; `None` for a single server.
    fabric: Option<Fabric>,
    /// The routing in force (never [`Routing::Auto`]).
    routing: Routing,
    /// The spec built: the one given, with a fat-tree pruned to what the NICs need.
    spec: ClusterSpec,
    /// How the fat-tree was pruned ([`XgftSpec::pruned`]), if it was.
    pruned: Option<String>,
    /// Each host's (to memory, to device) links, if the cluster has host memory.
    host_memory_links: Vec<(LinkId, LinkId)>,
    /// Which links are down ([`Topology::take_down`]), by link id; empty while none is.
    down: Vec<bool>,
    /// Capacity windows ([`Topology::add_window`]), in the order added.
    windows: Vec<LinkWindow>,
    /// Latency jitter ([`Topology::set_latency_jitter`]), if any.
    jitter: Option<LatencyJitter>,
}

impl Topology {
    /// Builds the graph of `spec` (see the crate documentation for how it is composed). A
    /// fat-tree larger than the cluster's NICs need is built pruned ([`XgftSpec::pruned`]:
    /// the same routes, without the switches no route crosses); [`Topology::pruned`] says how.
    pub fn build(spec: &ClusterSpec) -> Result<Topology, TopologyError> {
        let nics = match spec.network.nics_per_node {
            Some(n) if (1..=spec.gpus_per_node).contains(&n) => n,
            _ => spec.gpus_per_node,
        };
        let terminals = u64::from(spec.nodes) * u64::from(nics);
        if let FabricSpec::FatTree(tree) = &spec.network.fabric
            && spec.nodes > 1
            && let Some((pruned, how)) = tree.pruned(terminals)
        {
            let mut cut = spec.clone();
            cut.network.fabric = FabricSpec::FatTree(pruned);
            let mut topology = Topology::build_whole(&cut)?;
            topology.pruned = Some(how);
            return Ok(topology);
        }
        Topology::build_whole(spec)
    }

    /// How the fat-tree was pruned to the switches the NICs need, if it was.
    pub fn pruned(&self) -> Option<&str> {
        self.pruned.as_deref()
    }

    /// [`Topology::build`] of the fabric as given.
    fn build_whole(spec: &ClusterSpec) -> Result<Topology, TopologyError> {
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
        let network = &spec.network;
        let routing = network.fabric.resolve_routing(network.routing)?;
        let (nodes, g) = (spec.nodes, spec.gpus_per_node);
        let nics = match network.nics_per_node {
            None => g,
            Some(0) => return Err(TopologyError::Zero { what: "nics-per-node" }),
            Some(n) if n > g => {
                return Err(TopologyError::Invalid {
                    parameter: "nics-per-node",
                    problem: format!("{n} NICs for {g} GPUs per node; give at most one NIC per GPU"),
                });
            }
            Some(n) => n,
        };
        let shared_nics = nics < g;
        let gpu_to_nic = match (shared_nics, network.gpu_to_nic) {
            (true, None) => {
                return Err(TopologyError::Invalid {
                    parameter: "gpu-to-nic",
                    problem: format!(
                        "is required when GPUs share NICs ({nics} NICs for {g} GPUs per node): give the \
                         PCIe link between a GPU and its NIC"
                    ),
                });
            }
            (_, link) => link,
        };
        let terminal_count = u64::from(nodes) * u64::from(nics);
        Fabric::validate(&network.fabric, terminal_count)?;
        let intra = match (g, spec.intra_node) {
            (1, _) => Intra::None,
            (_, IntraNode::NvLinkMesh(_)) => Intra::Mesh,
            _ => Intra::Star,
        };
        let intra_cables = match intra {
            Intra::None => 0,
            Intra::Star => host_count,
            Intra::Mesh => u64::from(nodes) * u64::from(g) * u64::from(g - 1) / 2,
        };
        let has_network = nodes > 1;
        let nic_cables = if has_network && shared_nics { host_count } else { 0 };
        fabric::check_size(2 * (intra_cables + nic_cables))?;

        let mut graph = DiGraph::new();
        let mut hosts = Vec::with_capacity(host_count as usize);
        let mut node_switches = Vec::new();
        let mut nic_vertices = Vec::new();
        let mut memories = Vec::new();
        for node in 0..nodes {
            if intra == Intra::Star {
                node_switches.push(graph.add_node(Vertex::NodeSwitch { node }));
            }
            for local in 0..g {
                let host = HostId(hosts.len() as u32);
                hosts.push(graph.add_node(Vertex::Gpu { host, node, local }));
            }
            if has_network && shared_nics {
                for index in 0..nics {
                    nic_vertices.push(graph.add_node(Vertex::Nic { node, index }));
                }
            }
            if spec.host_memory.is_some() {
                memories.push(graph.add_node(Vertex::HostMemory { node }));
            }
        }
        let intra_link = fabric::link_of(spec.intra_node.link(), Tier::IntraNode);
        let mut wiring = Wiring::new(&mut graph);
        match intra {
            Intra::None => {}
            Intra::Star => {
                for (h, &gpu) in hosts.iter().enumerate() {
                    wiring.cable(gpu, node_switches[h / g as usize], intra_link);
                }
            }
            Intra::Mesh => {
                for server in hosts.chunks(g as usize) {
                    for (a, &gpu) in server.iter().enumerate() {
                        for &peer in &server[a + 1..] {
                            wiring.cable(gpu, peer, intra_link);
                        }
                    }
                }
            }
        }
        let mut topology = Topology {
            graph: DiGraph::new(),
            hosts,
            terminals: Vec::new(),
            nodes,
            gpus_per_node: g,
            nics_per_node: nics,
            shared_nics,
            rail_optimized: network.rail_optimized,
            intra,
            nic_cable_base: intra_cables,
            fabric: None,
            routing,
            spec: spec.clone(),
            pruned: None,
            host_memory_links: Vec::new(),
            down: Vec::new(),
            windows: Vec::new(),
            jitter: None,
        };
        if has_network {
            if let Some(link) = gpu_to_nic.filter(|_| shared_nics) {
                let link = fabric::link_of(link, Tier::GpuToNic);
                for h in 0..host_count as u32 {
                    let nic = topology.nic_index(h);
                    let node = h / g;
                    wiring.cable(
                        topology.hosts[h as usize],
                        nic_vertices[(node * nics + nic) as usize],
                        link,
                    );
                }
            }
            topology.terminals = (0..terminal_count as u32)
                .map(|t| {
                    let (node, nic) = topology.terminal_position(t);
                    if shared_nics {
                        nic_vertices[(node * nics + nic) as usize]
                    } else {
                        topology.hosts[(node * g + nic) as usize]
                    }
                })
                .collect();
            topology.fabric =
                Some(Fabric::build(&network.fabric, routing, &topology.terminals, &mut wiring)?);
        }
        // Host-memory cables come last, so that the fabric's link ids are SimGrid's.
        if let Some(link) = spec.host_memory {
            let link = fabric::link_of(link, Tier::HostMemory);
            for (h, &gpu) in topology.hosts.iter().enumerate() {
                let memory = memories[h / g as usize];
                let up = graph.add_edge(gpu, memory, link);
                let down = graph.add_edge(memory, gpu, link);
                topology.host_memory_links.push((LinkId(up.index() as u32), LinkId(down.index() as u32)));
            }
        }
        topology.graph = graph;
        Ok(topology)
    }

    /// The route of a host <-> device copy of `host`: its host link, towards the device if
    /// `to_device`, else towards host memory.
    pub fn host_memory_route(&self, host: HostId, to_device: bool) -> Result<Route, TopologyError> {
        self.check_host(host)?;
        let &(up, down) =
            self.host_memory_links.get(host.0 as usize).ok_or_else(|| TopologyError::Invalid {
                parameter: "host-link",
                problem:
                    "the cluster has no host-memory links, so host <-> device copies cannot be simulated"
                        .into(),
            })?;
        Route::try_from(&[if to_device { down } else { up }][..])
    }

    /// Which of its server's NICs host `h` uses: NIC `i` serves GPUs `i*g/n .. (i+1)*g/n`.
    fn nic_index(&self, h: u32) -> u32 {
        let (g, n) = (u64::from(self.gpus_per_node), u64::from(self.nics_per_node));
        let local = u64::from(h % self.gpus_per_node);
        (((local + 1) * n).div_ceil(g) - 1) as u32
    }

    /// The (server, NIC) of terminal `t`.
    fn terminal_position(&self, t: u32) -> (u32, u32) {
        if self.rail_optimized {
            (t % self.nodes, t / self.nodes)
        } else {
            (t / self.nics_per_node, t % self.nics_per_node)
        }
    }

    /// The terminal that carries host `h`'s traffic between servers.
    fn terminal(&self, h: u32) -> u32 {
        let (node, nic) = (h / self.gpus_per_node, self.nic_index(h));
        if self.rail_optimized { nic * self.nodes + node } else { node * self.nics_per_node + nic }
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
        let nic_vertices = if self.shared_nics { self.terminals.len() } else { 0 };
        let memories = if self.host_memory_links.is_empty() { 0 } else { self.nodes as usize };
        self.graph.node_count() - self.hosts.len() - nic_vertices - memories
    }

    /// Number of NICs, that is, of the fabric's terminals (one per GPU unless GPUs share
    /// them); 0 for a single server, which has no network.
    pub fn nic_count(&self) -> usize {
        self.terminals.len()
    }

    /// Number of servers.
    pub fn node_count(&self) -> u32 {
        self.nodes
    }

    /// GPUs per server.
    pub fn gpus_per_node(&self) -> u32 {
        self.gpus_per_node
    }

    /// The routing in force (the fabric's default if the spec said [`Routing::Auto`]).
    pub fn routing(&self) -> Routing {
        self.routing
    }

    /// True if two flows between the same hosts may take different routes (ECMP, Valiant and
    /// UGAL hash the flow id; minimal routing on the canonical dragonfly hashes ties between
    /// global links). When false, a caller may reuse a route for every flow of a pair.
    pub fn routes_depend_on_flow(&self) -> bool {
        match self.routing {
            Routing::DModK | Routing::Shortest => false,
            Routing::Minimal => matches!(self.spec.network.fabric, FabricSpec::Dragonfly(_)),
            Routing::Auto | Routing::Ecmp | Routing::Valiant | Routing::Ugal => true,
        }
    }

    /// The spec this topology was built from.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// The server that `host` sits in.
    pub fn node_of(&self, host: HostId) -> Result<u32, TopologyError> {
        self.check_host(host)?;
        Ok(host.0 / self.gpus_per_node)
    }

    /// The NIC (fabric terminal, numbered as in the crate documentation) that carries
    /// `host`'s traffic to other servers; `None` for a single server.
    pub fn nic_of(&self, host: HostId) -> Result<Option<u32>, TopologyError> {
        self.check_host(host)?;
        Ok(self.fabric.as_ref().map(|_| self.terminal(host.0)))
    }

    /// The link with id `id`. Ids come from this topology's own paths, so a foreign id is a
    /// programming error.
    pub fn link(&self, id: LinkId) -> &Link {
        &self.graph[EdgeIndex::new(id.0 as usize)]
    }

    /// The time a message's first byte takes over `route`: the sum of its links' latencies.
    pub fn route_latency(&self, route: &Route) -> SimDuration {
        route.iter().fold(SimDuration::ZERO, |sum, &link| sum.saturating_add(self.link(link).latency))
    }

    /// The route traffic from `src` to `dst` takes: [`Topology::route_for_flow`] for flow 0.
    pub fn route(&self, src: HostId, dst: HostId) -> Result<Route, TopologyError> {
        self.route_for_flow(src, dst, 0)
    }

    /// The route of flow `flow` from `src` to `dst` under the topology's routing, computed
    /// structurally (no tables): through the server's intra-node fabric inside a server,
    /// through the NICs and the fabric between servers; empty if `src == dst`. ECMP and Valiant
    /// choices depend on a deterministic hash of (`src`, `dst`, `flow`), so equal arguments
    /// always give the same route; other routings ignore `flow`. Under [`Routing::Ugal`] this
    /// is the minimal route (see [`Topology::route_candidates`]).
    pub fn route_for_flow(&self, src: HostId, dst: HostId, flow: u64) -> Result<Route, TopologyError> {
        self.route_with(src, dst, flow, self.routing == Routing::Valiant)
    }

    /// The candidate routes of flow `flow` from `src` to `dst`, for adaptive routing.
    ///
    /// Contract: `.0` is always [`Topology::route_for_flow`]`(src, dst, flow)`. `.1` is
    /// `Some` only under [`Routing::Ugal`] on a dragonfly, for hosts in different groups of a
    /// dragonfly with at least three groups: it is the Valiant route of the same flow (through
    /// the intermediate group the flow hash picks). The caller (the flow model, which knows
    /// the link loads) picks one, e.g. UGAL's rule: the Valiant route when `load(minimal) *
    /// hops(minimal) > load(valiant) * hops(valiant)`. Both routes are deterministic.
    pub fn route_candidates(
        &self,
        src: HostId,
        dst: HostId,
        flow: u64,
    ) -> Result<(Route, Option<Route>), TopologyError> {
        let first = self.route_for_flow(src, dst, flow)?;
        let detour = self.routing == Routing::Ugal
            && self.node_of(src)? != self.node_of(dst)?
            && self.fabric.as_ref().is_some_and(|f| f.has_detour(self.terminal(src.0), self.terminal(dst.0)));
        let second = if detour { Some(self.route_with(src, dst, flow, true)?) } else { None };
        Ok((first, second))
    }

    fn route_with(&self, src: HostId, dst: HostId, flow: u64, detour: bool) -> Result<Route, TopologyError> {
        let route = self.structural_route(src, dst, flow, detour)?;
        if self.down.is_empty() || !route.iter().any(|link| self.down[link.0 as usize]) {
            return Ok(route);
        }
        // A link of the route is down: the fewest-hop path around it (lowest link ids first).
        let path = self.shortest_path(src, dst)?;
        Route::try_from(path.as_slice())
    }

    /// The route of [`Topology::route_with`] on the intact cluster.
    fn structural_route(
        &self,
        src: HostId,
        dst: HostId,
        flow: u64,
        detour: bool,
    ) -> Result<Route, TopologyError> {
        self.check_host(src)?;
        self.check_host(dst)?;
        let mut route = Route::EMPTY;
        if src == dst {
            return Ok(route);
        }
        let (s, d) = (src.0, dst.0);
        let g = self.gpus_per_node;
        let too_long = |RouteFull| TopologyError::RouteTooLong { src, dst, max: Route::CAPACITY };
        if s / g == d / g {
            match self.intra {
                Intra::None => return Err(TopologyError::Unreachable { src, dst }),
                Intra::Star => {
                    route.push(forward(0, u64::from(s))).map_err(too_long)?;
                    route.push(backward(0, u64::from(d))).map_err(too_long)?;
                }
                Intra::Mesh => {
                    let (a, b) = (u64::from(s % g), u64::from(d % g));
                    let g = u64::from(g);
                    let offset = u64::from(s / self.gpus_per_node) * (g * (g - 1) / 2);
                    let link = if a < b {
                        forward(0, offset + pair_index(a, b, g))
                    } else {
                        backward(0, offset + pair_index(b, a, g))
                    };
                    route.push(link).map_err(too_long)?;
                }
            }
            return Ok(route);
        }
        let fabric = self.fabric.as_ref().ok_or(TopologyError::Unreachable { src, dst })?;
        if self.shared_nics {
            route.push(forward(0, self.nic_cable_base + u64::from(s))).map_err(too_long)?;
        }
        let key = FlowKey::new(s, d, flow);
        fabric.route(self.terminal(s), self.terminal(d), key, detour, &mut route).map_err(too_long)?;
        if self.shared_nics {
            route.push(backward(0, self.nic_cable_base + u64::from(d))).map_err(too_long)?;
        }
        Ok(route)
    }

    /// The fewest-hop path from `src` to `dst` by breadth-first search, as link ids in travel
    /// order (empty if `src == dst`). Ties are broken by the lowest link id, so the path is
    /// deterministic. Paths never pass through a GPU, and a NIC only between its own GPUs and
    /// the fabric. O(vertices + links) per call: for analyses and tests, not hot paths.
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
        let mut reached_by: Vec<Option<EdgeIndex>> = vec![None; self.graph.node_count()];
        let mut seen = vec![false; self.graph.node_count()];
        seen[start.index()] = true;
        let mut frontier = VecDeque::from([start]);
        let mut edges = Vec::new();
        let is_gpu = |v: NodeIndex| matches!(self.graph[v], Vertex::Gpu { .. });
        while let Some(vertex) = frontier.pop_front() {
            // A NIC forwards only between its GPUs and the fabric: onwards to the side it was
            // not reached from.
            let nic_from_gpu = match (self.graph[vertex], reached_by[vertex.index()]) {
                (Vertex::Nic { .. }, Some(edge)) => {
                    Some(is_gpu(self.graph.raw_edges()[edge.index()].source()))
                }
                _ => None,
            };
            edges.clear();
            edges.extend(
                self.graph
                    .edges(vertex)
                    .filter(|edge| !self.down.get(edge.id().index()).copied().unwrap_or(false))
                    .map(|edge| (edge.id(), edge.target())),
            );
            edges.sort_unstable();
            for &(edge, next) in &edges {
                if nic_from_gpu.is_some_and(|from_gpu| from_gpu == is_gpu(next)) {
                    continue;
                }
                if !seen[next.index()] {
                    seen[next.index()] = true;
                    reached_by[next.index()] = Some(edge);
                    // GPUs and host memories are endpoints, not routers: paths never pass
                    // through them.
                    if !is_gpu(next) && !matches!(self.graph[next], Vertex::HostMemory { .. }) {
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

    /// The link in the other direction of `id`'s cable, if there is one.
    pub fn reverse_of(&self, id: LinkId) -> Option<LinkId> {
        let (from, to) = self.graph.edge_endpoints(EdgeIndex::new(id.0 as usize))?;
        self.graph.find_edge(to, from).map(|edge| LinkId(edge.index() as u32))
    }

    /// Scales the bandwidth of link `id` by `factor` (a degraded link: a NIC or cable running
    /// at a fraction of its rate). Errors if the factor is not in (0, 1] or leaves no bandwidth.
    pub fn degrade(&mut self, id: LinkId, factor: f64) -> Result<(), TopologyError> {
        let invalid = |problem: String| TopologyError::Invalid { parameter: "bandwidth-factor", problem };
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(invalid(format!("is {factor}; give a factor above 0 and at most 1")));
        }
        let edge = self
            .graph
            .edge_weight_mut(EdgeIndex::new(id.0 as usize))
            .ok_or_else(|| invalid(format!("link {} does not exist", id.0)))?;
        let bits = (edge.bandwidth.bits_per_second() as f64 * factor).round() as u64;
        edge.bandwidth = Bandwidth::from_bits_per_second(bits)
            .ok_or_else(|| invalid(format!("is {factor}, which leaves no bandwidth")))?;
        Ok(())
    }

    /// Sets the rate of the links of tier `tier` inside each server (`Tier::IntraNode`: its
    /// GPUs' NVLink or PCIe switch links; `Tier::HostMemory`: its GPUs' host links) to
    /// `rate_of(node)`, where it gives one: a cluster whose servers differ (node groups of
    /// different devices), each server's own links at its own rate. One pass over the links;
    /// returns how many it set.
    pub fn set_server_links(&mut self, tier: Tier, rate_of: impl Fn(u32) -> Option<Bandwidth>) -> usize {
        let node_of = |vertex: &Vertex| match *vertex {
            Vertex::Gpu { node, .. } | Vertex::NodeSwitch { node } | Vertex::HostMemory { node } => {
                Some(node)
            }
            _ => None,
        };
        let mut set = 0;
        for edge in self.graph.edge_indices() {
            let Some((from, to)) = self.graph.edge_endpoints(edge) else { continue };
            let (Some(a), Some(b)) = (node_of(&self.graph[from]), node_of(&self.graph[to])) else { continue };
            if a != b {
                continue;
            }
            if let Some(rate) = rate_of(a)
                && let Some(link) = self.graph.edge_weight_mut(edge)
                && link.tier == tier
            {
                link.bandwidth = rate;
                set += 1;
            }
        }
        set
    }

    /// Takes link `id` down: routes that cross it go the fewest-hop way around it
    /// ([`Topology::shortest_path`], which skips links that are down), or fail with
    /// [`TopologyError::Unreachable`] if there is none.
    pub fn take_down(&mut self, id: LinkId) {
        if self.down.is_empty() {
            self.down = vec![false; self.graph.edge_count()];
        }
        if let Some(down) = self.down.get_mut(id.0 as usize) {
            *down = true;
        }
    }

    /// Adds a capacity window: links degraded or down for a while, once or periodically (a
    /// flapping NIC). Only the `flow` and `packet-steps` models apply it. Errors if a link does
    /// not exist, the factor is not in [0, 1], the window is empty or its period not longer
    /// than it.
    pub fn add_window(&mut self, window: LinkWindow) -> Result<(), TopologyError> {
        let invalid = |problem: String| TopologyError::Invalid { parameter: "window", problem };
        if !(0.0..=1.0).contains(&window.factor) {
            return Err(invalid(format!("capacity factor {} is not in [0, 1]", window.factor)));
        }
        if window.length == SimDuration::ZERO {
            return Err(invalid("lasts no time".into()));
        }
        if window.every.is_some_and(|every| every <= window.length) {
            return Err(invalid("repeats before it has closed".into()));
        }
        if let Some(link) = window.links.iter().find(|link| link.0 as usize >= self.graph.edge_count()) {
            return Err(invalid(format!("link {} does not exist", link.0)));
        }
        self.windows.push(window);
        Ok(())
    }

    /// The capacity windows, in the order added.
    pub fn windows(&self) -> &[LinkWindow] {
        &self.windows
    }

    /// Sets the latency jitter of link crossings (replacing any). Only the `flow` and
    /// `packet-steps` models apply it. Errors if its mask does not cover every link or its
    /// coefficient of variation is negative or not finite.
    pub fn set_latency_jitter(&mut self, jitter: LatencyJitter) -> Result<(), TopologyError> {
        let invalid = |problem: String| TopologyError::Invalid { parameter: "latency jitter", problem };
        if jitter.on.len() != self.graph.edge_count() {
            return Err(invalid(format!("marks {} links of {}", jitter.on.len(), self.graph.edge_count())));
        }
        if !(jitter.cv.is_finite() && jitter.cv >= 0.0) {
            return Err(invalid(format!(
                "coefficient of variation {} is not a finite number >= 0",
                jitter.cv
            )));
        }
        self.jitter = Some(jitter);
        Ok(())
    }

    /// The latency jitter of link crossings, if any.
    pub fn latency_jitter(&self) -> Option<&LatencyJitter> {
        self.jitter.as_ref()
    }

    /// Whether link `id` is down.
    pub fn is_down(&self, id: LinkId) -> bool {
        self.down.get(id.0 as usize).copied().unwrap_or(false)
    }

    /// The hosts `src` cannot reach over the links that are up, in id order.
    pub fn unreachable_from(&self, src: HostId) -> Result<Vec<HostId>, TopologyError> {
        let tree = self.shortest_path_tree(src)?;
        Ok((0..self.hosts.len() as u32)
            .map(HostId)
            .filter(|&host| host != src && tree[self.hosts[host.0 as usize].index()].is_none())
            .collect())
    }

    /// The underlying graph (read-only), for analyses and export.
    pub fn graph(&self) -> &DiGraph<Vertex, Link> {
        &self.graph
    }

    /// The vertex of `host`'s GPU.
    pub fn vertex_of(&self, host: HostId) -> Result<NodeIndex, TopologyError> {
        self.check_host(host)
    }

    /// The fabric's terminal vertices (NICs, or GPUs with their own NIC) in terminal order;
    /// empty for a single server.
    pub fn terminal_vertices(&self) -> &[NodeIndex] {
        &self.terminals
    }
}

#[cfg(test)]
mod tests;
