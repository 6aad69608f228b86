//! Describing a topology: counts, bisection bandwidth, diameter, path lengths
//! ([`Topology::summary`]) and a Graphviz picture ([`Topology::to_dot`]).

use std::fmt::{self, Write as _};

use units::Bandwidth;

use crate::hash::splitmix64;
use petgraph::graph::EdgeIndex;

use crate::{HostId, Intra, IntraNode, LinkId, Route, Routing, Tier, Topology, Vertex};

/// All ordered host pairs are examined when there are at most this many (2048 hosts).
const EXACT_PAIRS: u64 = 2048 * 2047;
/// Otherwise this many pairs, drawn deterministically.
const SAMPLED_PAIRS: u64 = 1 << 20;

/// The hop counts of routes between host pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathLengths {
    /// `histogram[k]`: ordered pairs whose route has `k` links.
    pub histogram: Vec<u64>,
    /// Ordered pairs examined.
    pub pairs: u64,
    /// Whether every ordered pair of distinct hosts was examined (otherwise a deterministic
    /// sample of [`PathLengths::pairs`] pairs, the same on every run).
    pub exact: bool,
    /// Pairs whose route would exceed [`Route::CAPACITY`] links (not in the histogram).
    pub too_long: u64,
}

/// What [`Topology::summary`] reports.
#[derive(Debug, Clone, PartialEq)]
pub struct TopologySummary {
    /// The fabric, described (`none` for a single server).
    pub fabric: String,
    /// The routing in force.
    pub routing: Routing,
    /// Servers.
    pub nodes: u32,
    /// GPUs (hosts).
    pub hosts: usize,
    /// NICs (fabric terminals).
    pub nics: usize,
    /// Switches and routers, node-internal and network.
    pub switches: usize,
    /// Directed links (two per cable).
    pub links: usize,
    /// Bisection bandwidth, one direction: `None` when there is nothing to cut (one GPU).
    pub bisection: Option<Bandwidth>,
    /// How [`TopologySummary::bisection`] was computed.
    pub bisection_method: String,
    /// Links on the longest route among the pairs examined (exact when
    /// [`PathLengths::exact`]).
    pub diameter: usize,
    /// Route lengths between host pairs, under the topology's routing (flow 0).
    pub path_lengths: PathLengths,
    /// How a fat-tree larger than the NICs need was pruned ([`Topology::pruned`]).
    pub pruned: Option<String>,
}

impl Topology {
    /// Counts, bisection bandwidth, diameter and the path-length histogram.
    ///
    /// Bisection bandwidth is a closed form per fabric for the fully populated fabric (a fat-
    /// tree: the up-links of half the nodes at its narrowest level; a dragonfly: the global
    /// links between two halves of its groups; a torus: the cables cut by halving its longest
    /// dimension; see [`TopologySummary::bisection_method`]), capped by the terminal links of
    /// half the cluster's NICs; for a single server, the intra-node links of half its GPUs
    /// (for a mesh, the links between the halves). Path lengths are route lengths (what
    /// traffic takes, not BFS), over all ordered host pairs up to 2048 hosts, otherwise over
    /// 2^20 pairs drawn by a fixed-seed SplitMix64 sequence.
    pub fn summary(&self) -> TopologySummary {
        let (bisection, bisection_method) = self.bisection();
        let path_lengths = self.path_lengths();
        let diameter = path_lengths.histogram.len().saturating_sub(1);
        TopologySummary {
            fabric: self.fabric_name(),
            routing: self.routing,
            nodes: self.nodes,
            hosts: self.hosts.len(),
            nics: self.terminals.len(),
            switches: self.switch_count(),
            links: self.link_count(),
            bisection: u64::try_from(bisection).ok().and_then(Bandwidth::from_bits_per_second),
            bisection_method,
            diameter,
            path_lengths,
            pruned: self.pruned.clone(),
        }
    }

    /// The fabric between servers as [`TopologySummary::fabric`] names it, without the
    /// summary's routing of every host pair.
    pub fn fabric_name(&self) -> String {
        if self.fabric.is_some() {
            self.spec.network.fabric.to_string()
        } else {
            "none (a single server)".to_string()
        }
    }

    fn bisection(&self) -> (u128, String) {
        let bits = |link: crate::LinkSpec| u128::from(link.bandwidth.bits_per_second());
        let g = u128::from(self.gpus_per_node);
        match &self.fabric {
            None => match self.spec.intra_node {
                _ if self.intra == Intra::None => (0, "one GPU: nothing to cut".to_string()),
                IntraNode::NvLinkMesh(link) => (
                    (g / 2) * (g - g / 2) * bits(link),
                    "NVLink mesh: the links between two halves of the GPUs".into(),
                ),
                IntraNode::NvSwitch(link) | IntraNode::PcieSwitch(link) => {
                    ((g / 2) * bits(link), "node switch: the links of half the GPUs".into())
                }
            },
            Some(fabric) => {
                let (cut, method) = fabric.bisection();
                let terminal = fabric
                    .terminal_link()
                    .map(|link| (self.terminals.len() as u128 / 2) * bits(link))
                    .unwrap_or(u128::MAX);
                if terminal < cut {
                    (
                        terminal,
                        "the terminal links of half the NICs (the fabric's bisection is larger)".into(),
                    )
                } else {
                    (cut, method.to_string())
                }
            }
        }
    }

    fn path_lengths(&self) -> PathLengths {
        let n = self.hosts.len() as u64;
        let mut lengths = PathLengths { histogram: Vec::new(), pairs: 0, exact: true, too_long: 0 };
        let mut count = |src: u64, dst: u64| {
            lengths.pairs += 1;
            match self.route(HostId(src as u32), HostId(dst as u32)) {
                Ok(route) => {
                    if lengths.histogram.len() <= route.len() {
                        lengths.histogram.resize(route.len() + 1, 0);
                    }
                    lengths.histogram[route.len()] += 1;
                }
                Err(_) => lengths.too_long += 1,
            }
        };
        if n * n.saturating_sub(1) <= EXACT_PAIRS {
            for src in 0..n {
                for dst in (0..n).filter(|&dst| dst != src) {
                    count(src, dst);
                }
            }
        } else {
            let mut state = 0u64;
            for _ in 0..SAMPLED_PAIRS {
                state = state.wrapping_add(1);
                let src = splitmix64(state) % n;
                state = state.wrapping_add(1);
                let mut dst = splitmix64(state) % (n - 1);
                if dst >= src {
                    dst += 1;
                }
                count(src, dst);
            }
            lengths.exact = false;
        }
        lengths
    }

    /// The name of `vertex` as reports and the Graphviz picture print it: `gpu 3 (node 0.3)`,
    /// `nvswitch 0`, `pcie switch 0`, `nic 1.0`, `host memory 0`, or the fabric's name of a
    /// switch (`leaf 2`, `group 1 router 3`, ...).
    pub fn vertex_name(&self, vertex: Vertex) -> String {
        match vertex {
            Vertex::Gpu { host, node, local } => format!("gpu {} (node {node}.{local})", host.0),
            Vertex::NodeSwitch { node } => match self.spec.intra_node {
                IntraNode::PcieSwitch(_) => format!("pcie switch {node}"),
                _ => format!("nvswitch {node}"),
            },
            Vertex::Nic { node, index } => format!("nic {node}.{index}"),
            Vertex::HostMemory { node } => format!("host memory {node}"),
            Vertex::NetworkSwitch { index } => {
                self.fabric.as_ref().map_or_else(|| format!("switch {index}"), |f| f.switch_name(index))
            }
        }
    }

    /// The name of directed link `id`: its two ends, `"FROM -> TO"` (the names of
    /// [`Topology::vertex_name`]). Stable for a given cluster, so outputs can be joined on it.
    pub fn link_name(&self, id: LinkId) -> String {
        match self.graph.edge_endpoints(EdgeIndex::new(id.0 as usize)) {
            Some((from, to)) => {
                format!("{} -> {}", self.vertex_name(self.graph[from]), self.vertex_name(self.graph[to]))
            }
            None => format!("link {}", id.0),
        }
    }

    /// What kind of link `id` is, for reports: `NVLink` or `PCIe` inside a server (by the
    /// server's switch), `PCIe` from a GPU to a shared NIC or to host memory, `NIC` from a
    /// terminal to its first switch, `leaf-spine`, `spine-core` (and `fat-tree L-L+1` above) in
    /// fat-trees, `local`, `inter-chassis` and `global` in dragonflies, `torus` and `direct`.
    pub fn link_kind(&self, id: LinkId) -> &'static str {
        match self.link(id).tier {
            Tier::IntraNode => match self.spec.intra_node {
                IntraNode::PcieSwitch(_) => "PCIe",
                _ => "NVLink",
            },
            Tier::GpuToNic | Tier::HostMemory => "PCIe",
            Tier::NetworkEdge => "NIC",
            Tier::FatTree { level: 1 } => "leaf-spine",
            Tier::FatTree { level: 2 } => "spine-core",
            Tier::FatTree { .. } => "fat-tree upper",
            Tier::Local => "local",
            Tier::InterChassis => "inter-chassis",
            Tier::Global => "global",
            Tier::Torus { .. } => "torus",
            Tier::Direct => "direct",
        }
    }

    /// The graph in Graphviz `dot` syntax: one vertex per GPU, NIC and switch (servers drawn
    /// as clusters), one undirected edge per cable labelled with its per-direction bandwidth.
    pub fn to_dot(&self) -> String {
        let mut dot =
            String::from("graph topology {\n  node [shape=box, fontsize=10];\n  edge [fontsize=8];\n");
        let name = |vertex: Vertex| self.vertex_name(vertex);
        let mut server = None;
        for index in self.graph.node_indices() {
            let vertex = self.graph[index];
            let node = match vertex {
                Vertex::Gpu { node, .. }
                | Vertex::NodeSwitch { node }
                | Vertex::Nic { node, .. }
                | Vertex::HostMemory { node } => Some(node),
                Vertex::NetworkSwitch { .. } => None,
            };
            if node != server {
                if server.is_some() {
                    dot.push_str("  }\n");
                }
                if let Some(node) = node {
                    let _ = writeln!(dot, "  subgraph cluster_node{node} {{\n    label=\"node {node}\";");
                }
                server = node;
            }
            let shape = match vertex {
                Vertex::Gpu { .. } => "box",
                Vertex::Nic { .. } => "note",
                Vertex::HostMemory { .. } => "cylinder",
                _ => "ellipse",
            };
            let indent = if node.is_some() { "    " } else { "  " };
            let _ = writeln!(dot, "{indent}v{} [label=\"{}\", shape={shape}];", index.index(), name(vertex));
        }
        if server.is_some() {
            dot.push_str("  }\n");
        }
        // Every cable is two consecutive links; draw each once.
        for pair in self.graph.raw_edges().chunks(2) {
            let edge = &pair[0];
            let _ = writeln!(
                dot,
                "  v{} -- v{} [label=\"{}\"];",
                edge.source().index(),
                edge.target().index(),
                edge.weight.bandwidth.display_bits()
            );
        }
        dot.push_str("}\n");
        dot
    }
}

impl TopologySummary {
    /// The summary as [`fmt::Display`] prints it, with the hosts called `device` ("GPU",
    /// "CPU"): the topology does not know what its hosts are, the cluster does.
    pub fn describe(&self, device: &str) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = self.write(&mut text, device);
        text
    }

    fn write(&self, f: &mut impl fmt::Write, device: &str) -> fmt::Result {
        writeln!(f, "fabric:     {} (routing {})", self.fabric, self.routing)?;
        writeln!(f, "hosts:      {} {device}s in {} nodes, {} NICs", self.hosts, self.nodes, self.nics)?;
        writeln!(f, "switches:   {}", self.switches)?;
        if let Some(how) = &self.pruned {
            writeln!(f, "pruned:     {how}")?;
        }
        writeln!(f, "links:      {} directed ({} cables)", self.links, self.links / 2)?;
        match self.bisection {
            Some(bandwidth) => writeln!(
                f,
                "bisection:  {} per direction ({})",
                bandwidth.display_bits(),
                self.bisection_method
            )?,
            None => writeln!(f, "bisection:  none ({})", self.bisection_method)?,
        }
        let lengths = &self.path_lengths;
        let over = if lengths.exact {
            format!("all {} ordered host pairs", lengths.pairs)
        } else {
            format!("{} sampled host pairs", lengths.pairs)
        };
        let bound = if lengths.exact { "" } else { " (at least)" };
        writeln!(f, "diameter:   {} links{bound}, over {over}", self.diameter)?;
        writeln!(f, "path lengths (links: pairs):")?;
        for (links, &pairs) in lengths.histogram.iter().enumerate().filter(|(_, pairs)| **pairs > 0) {
            writeln!(f, "  {links:>2}: {pairs}")?;
        }
        if lengths.too_long > 0 {
            writeln!(f, "  >{}: {} (longer than a route holds)", Route::CAPACITY, lengths.too_long)?;
        }
        Ok(())
    }
}

impl fmt::Display for TopologySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, "GPU")
    }
}
