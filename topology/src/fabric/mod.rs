//! The inter-node fabrics: how each one is wired into the graph and routes structurally.
//!
//! Every fabric adds its switches and cables to the graph after the servers' own vertices and
//! links, cable by cable (a cable is two consecutive links, forward then backward), in an
//! order it can recompute: cable `c` of a fabric whose first link is `base` is links
//! `base + 2c` (from its first endpoint) and `base + 2c + 1`. Routes are then arithmetic on
//! positions, O(levels) per route, with no per-pair tables.

pub(crate) mod cascade;
pub(crate) mod dragonfly;
pub(crate) mod flat;
pub(crate) mod torus;
pub(crate) mod xgft;

use petgraph::graph::{DiGraph, NodeIndex};
use units::Bandwidth;

use crate::hash::FlowKey;
use crate::spec::{FabricSpec, Routing};
use crate::{Link, LinkId, LinkSpec, Route, RouteFull, Tier, TopologyError, Vertex};

/// The most directed links a topology may have (64 Mi): far above any real fabric of 16k
/// hosts (a k = 32 fat-tree has 49k), low enough that a mistyped size fails fast instead of
/// exhausting memory.
pub(crate) const MAX_LINKS: u64 = 1 << 26;

/// The graph under construction, with the fabric's running switch counter.
pub(crate) struct Wiring<'g> {
    pub(crate) graph: &'g mut DiGraph<Vertex, Link>,
    switches: u32,
}

impl<'g> Wiring<'g> {
    pub(crate) fn new(graph: &'g mut DiGraph<Vertex, Link>) -> Self {
        Wiring { graph, switches: 0 }
    }

    /// The index the next link will get.
    pub(crate) fn next_link(&self) -> u32 {
        self.graph.edge_count() as u32
    }

    /// Adds `count` network switches; returns the first one's vertex.
    pub(crate) fn add_switches(&mut self, count: u64) -> NodeIndex {
        let first = NodeIndex::new(self.graph.node_count());
        for _ in 0..count {
            self.graph.add_node(Vertex::NetworkSwitch { index: self.switches });
            self.switches += 1;
        }
        first
    }

    /// Adds a full-duplex cable `a` -> `b`.
    pub(crate) fn cable(&mut self, a: NodeIndex, b: NodeIndex, link: Link) {
        self.graph.add_edge(a, b, link);
        self.graph.add_edge(b, a, link);
    }
}

/// `spec` as a link of `tier`.
pub(crate) fn link_of(spec: LinkSpec, tier: Tier) -> Link {
    Link { bandwidth: spec.bandwidth, latency: spec.latency, tier }
}

/// `spec` with `k` parallel cables merged into one link of `k` times the bandwidth.
pub(crate) fn merged(spec: LinkSpec, k: u32, parameter: &'static str) -> Result<LinkSpec, TopologyError> {
    let bits = spec.bandwidth.bits_per_second().checked_mul(u64::from(k));
    let bandwidth = bits.and_then(Bandwidth::from_bits_per_second).ok_or_else(|| TopologyError::Invalid {
        parameter,
        problem: format!("{k} parallel cables of {} overflow the largest bandwidth", spec.bandwidth),
    })?;
    Ok(LinkSpec { bandwidth, latency: spec.latency })
}

/// Cable `cable` of a fabric starting at link `base`, from its first endpoint.
pub(crate) fn forward(base: u32, cable: u64) -> LinkId {
    LinkId(base + 2 * cable as u32)
}

/// Cable `cable` of a fabric starting at link `base`, towards its first endpoint.
pub(crate) fn backward(base: u32, cable: u64) -> LinkId {
    LinkId(base + 2 * cable as u32 + 1)
}

/// Index of the unordered pair `i < j` among the pairs of `n` items in lexicographic order.
pub(crate) fn pair_index(i: u64, j: u64, n: u64) -> u64 {
    debug_assert!(i < j && j < n);
    i * n - i * (i + 1) / 2 + (j - i - 1)
}

/// Checks that a fabric of `links` directed links is not absurdly large.
pub(crate) fn check_size(links: u64) -> Result<(), TopologyError> {
    if links > MAX_LINKS {
        return Err(TopologyError::TooLarge { links, max: MAX_LINKS });
    }
    Ok(())
}

/// Checks that a fabric with room for `capacity` terminals can take the `needed` ones.
pub(crate) fn check_capacity(fabric: &FabricSpec, capacity: u64, needed: u64) -> Result<(), TopologyError> {
    if capacity < needed {
        return Err(TopologyError::TooFewTerminals { fabric: fabric.to_string(), capacity, needed });
    }
    Ok(())
}

/// Checks that every count named in `counts` is at least 1.
pub(crate) fn check_positive(counts: &[(&'static str, u32)]) -> Result<(), TopologyError> {
    match counts.iter().find(|&&(_, n)| n == 0) {
        Some(&(what, _)) => Err(TopologyError::Zero { what }),
        None => Ok(()),
    }
}

/// A built fabric.
#[derive(Debug, Clone)]
pub(crate) enum Fabric {
    Switch(flat::Switch),
    FullyConnected(flat::FullyConnected),
    FatTree(xgft::Xgft),
    Dragonfly(dragonfly::Dragonfly),
    Cascade(cascade::Cascade),
    Torus(torus::Torus),
}

impl Fabric {
    /// Wires `spec` onto `terminals` (vertices in terminal order) with `routing` (already
    /// resolved for this fabric).
    pub(crate) fn build(
        spec: &FabricSpec,
        routing: Routing,
        terminals: &[NodeIndex],
        wiring: &mut Wiring<'_>,
    ) -> Result<Fabric, TopologyError> {
        Ok(match spec {
            FabricSpec::Switch { link } => Fabric::Switch(flat::Switch::build(*link, terminals, wiring)?),
            FabricSpec::FullyConnected { link } => {
                Fabric::FullyConnected(flat::FullyConnected::build(*link, terminals, wiring)?)
            }
            FabricSpec::FatTree(x) => {
                Fabric::FatTree(xgft::Xgft::build(spec, x, routing, terminals, wiring)?)
            }
            FabricSpec::Dragonfly(d) => {
                Fabric::Dragonfly(dragonfly::Dragonfly::build(spec, d, terminals, wiring)?)
            }
            FabricSpec::CascadeDragonfly(c) => {
                Fabric::Cascade(cascade::Cascade::build(spec, c, terminals, wiring)?)
            }
            FabricSpec::Torus { dims, link } => {
                Fabric::Torus(torus::Torus::build(spec, dims, *link, terminals, wiring)?)
            }
            FabricSpec::Ring { link } => {
                let routers = terminals.len() as u32;
                Fabric::Torus(torus::Torus::build(spec, &[routers], *link, terminals, wiring)?)
            }
        })
    }

    /// Checks `spec` without building it (for the error, before any graph work).
    pub(crate) fn validate(spec: &FabricSpec, terminals: u64) -> Result<(), TopologyError> {
        match spec {
            FabricSpec::Switch { .. } => check_size(4 * terminals),
            FabricSpec::FullyConnected { .. } => {
                check_size(terminals.saturating_mul(terminals.saturating_sub(1)))
            }
            FabricSpec::FatTree(x) => xgft::Xgft::validate(spec, x, terminals),
            FabricSpec::Dragonfly(d) => dragonfly::Dragonfly::validate(spec, d, terminals),
            FabricSpec::CascadeDragonfly(c) => cascade::Cascade::validate(spec, c, terminals),
            FabricSpec::Torus { dims, .. } => torus::Torus::validate(spec, dims, terminals),
            FabricSpec::Ring { .. } => torus::Torus::validate(spec, &[terminals as u32], terminals),
        }
    }

    /// Appends the route from terminal `s` to terminal `t` (distinct) to `out`. `detour` asks
    /// dragonflies for their Valiant route.
    pub(crate) fn route(
        &self,
        s: u32,
        t: u32,
        key: FlowKey,
        detour: bool,
        out: &mut Route,
    ) -> Result<(), RouteFull> {
        match self {
            Fabric::Switch(f) => f.route(s, t, out),
            Fabric::FullyConnected(f) => f.route(s, t, out),
            Fabric::FatTree(f) => f.route(s, t, key, out),
            Fabric::Dragonfly(f) => f.route(s, t, key, detour, out),
            Fabric::Cascade(f) => f.route(s, t, key, detour, out),
            Fabric::Torus(f) => f.route(s, t, out),
        }
    }

    /// Whether terminals `s` and `t` have a non-minimal (Valiant) alternative.
    pub(crate) fn has_detour(&self, s: u32, t: u32) -> bool {
        match self {
            Fabric::Dragonfly(f) => f.has_detour(s, t),
            Fabric::Cascade(f) => f.has_detour(s, t),
            _ => false,
        }
    }

    /// A readable name of network switch `index` (for Graphviz).
    pub(crate) fn switch_name(&self, index: u32) -> String {
        match self {
            Fabric::Switch(_) => "switch".to_string(),
            Fabric::FullyConnected(_) => format!("switch {index}"),
            Fabric::FatTree(f) => f.switch_name(index),
            Fabric::Dragonfly(f) => f.switch_name(index),
            Fabric::Cascade(f) => f.switch_name(index),
            Fabric::Torus(f) => f.switch_name(index),
        }
    }

    /// The link from a terminal into the fabric (`None` when terminals are cabled directly to
    /// each other).
    pub(crate) fn terminal_link(&self) -> Option<LinkSpec> {
        match self {
            Fabric::Switch(f) => Some(f.terminal_link()),
            Fabric::FullyConnected(_) => None,
            Fabric::FatTree(f) => Some(f.terminal_link()),
            Fabric::Dragonfly(f) => Some(f.terminal_link()),
            Fabric::Cascade(f) => Some(f.terminal_link()),
            Fabric::Torus(f) => Some(f.terminal_link()),
        }
    }

    /// Bisection bandwidth (one direction, bits per second) of the fully populated fabric, and
    /// how it is computed.
    pub(crate) fn bisection(&self) -> (u128, &'static str) {
        match self {
            Fabric::Switch(f) => f.bisection(),
            Fabric::FullyConnected(f) => f.bisection(),
            Fabric::FatTree(f) => f.bisection(),
            Fabric::Dragonfly(f) => f.bisection(),
            Fabric::Cascade(f) => f.bisection(),
            Fabric::Torus(f) => f.bisection(),
        }
    }
}
