//! Extended generalized fat-trees (XGFT), routed D-mod-K exactly as SimGrid 3.32 does, or by
//! ECMP.
//!
//! A node at level `l` (0 = terminals) has position `q`, read as a mixed-radix label whose
//! digit `i` (least significant first) counts up to `up[i]` for `i < l` and to `down[i]`
//! otherwise; a node and its parent differ only in digit `l` (the child's position among its
//! siblings, the parent's index among the child's parents). This is SimGrid's labelling, and
//! the cables are added in SimGrid's order (level by level, child by child, parent by parent,
//! parallel cable by parallel cable), so with every leaf populated cable `u` here is
//! SimGrid's `link_from_..._u`. Only populated leaves get a terminal cable; they come first,
//! so a partly populated tree keeps the same arithmetic.

use petgraph::graph::NodeIndex;

use super::{Wiring, backward, check_capacity, check_size, forward, link_of};
use crate::hash::FlowKey;
use crate::spec::{FabricSpec, Routing, XgftSpec};
use crate::{LinkSpec, Route, RouteFull, Tier, TopologyError};
use units::Bandwidth;

#[derive(Debug, Clone)]
pub(crate) struct Xgft {
    /// First link of the fabric.
    base: u32,
    levels: usize,
    down: Vec<u64>,
    up: Vec<u64>,
    count: Vec<u64>,
    /// Nodes at each level `0..=levels` (level 0: terminal positions).
    nodes: Vec<u64>,
    /// `prod(up[..l])` for `l` in `0..=levels`.
    low_up: Vec<u64>,
    /// First cable between level `l` and `l + 1`.
    cable_base: Vec<u64>,
    /// First network-switch index at level `l` (`1..=levels`; entry 0 unused).
    switch_base: Vec<u64>,
    /// The cables of each level, oversubscription applied.
    links: Vec<LinkSpec>,
    ecmp: bool,
}

impl Xgft {
    pub(crate) fn validate(
        fabric: &FabricSpec,
        spec: &XgftSpec,
        terminals: u64,
    ) -> Result<(), TopologyError> {
        Xgft::shape(fabric, spec, terminals).map(|_| ())
    }

    /// Checks `spec` and returns the per-level cables with oversubscription applied.
    fn shape(fabric: &FabricSpec, spec: &XgftSpec, terminals: u64) -> Result<Vec<LinkSpec>, TopologyError> {
        if spec.levels == 0 {
            return Err(TopologyError::Zero { what: "fat-tree levels" });
        }
        let levels = spec.levels as usize;
        let lists: [(&'static str, usize); 4] = [
            ("fat-tree down", spec.down.len()),
            ("fat-tree up", spec.up.len()),
            ("fat-tree count", spec.count.len()),
            ("fat-tree links", spec.links.len()),
        ];
        for (parameter, len) in lists {
            if len != levels {
                return Err(TopologyError::Invalid {
                    parameter,
                    problem: format!("has {len} entries but levels is {levels}: give one entry per level"),
                });
            }
        }
        for (parameter, list) in
            [("fat-tree down", &spec.down), ("fat-tree up", &spec.up), ("fat-tree count", &spec.count)]
        {
            if let Some(level) = list.iter().position(|&n| n == 0) {
                return Err(TopologyError::Invalid {
                    parameter,
                    problem: format!("entry {level} is 0; every entry must be at least 1"),
                });
            }
        }
        let ratios = &spec.oversubscription;
        if !ratios.is_empty() && ratios.len() != levels {
            return Err(TopologyError::Invalid {
                parameter: "fat-tree oversubscription",
                problem: format!(
                    "has {} entries but levels is {levels}: give one per level, or none for 1:1 everywhere",
                    ratios.len()
                ),
            });
        }
        if let Some(level) = ratios.iter().position(|r| !(r.is_finite() && *r >= 1.0)) {
            return Err(TopologyError::Invalid {
                parameter: "fat-tree oversubscription",
                problem: format!(
                    "entry {level} is {}; a ratio is at least 1 (1 = full bandwidth, 2 = 2:1)",
                    ratios[level]
                ),
            });
        }
        // Sizes in u128 so that absurd shapes are an error, not an overflow.
        let product = |v: &[u32]| v.iter().fold(1u128, |p, &n| p.saturating_mul(u128::from(n)));
        let capacity = product(&spec.down);
        check_capacity(fabric, u64::try_from(capacity).unwrap_or(u64::MAX), terminals)?;
        let mut links: u128 = 0;
        for l in 0..levels {
            let nodes = if l == 0 {
                u128::from(terminals)
            } else {
                product(&spec.down[l..]).saturating_mul(product(&spec.up[..l]))
            };
            let per_node = u128::from(spec.up[l]) * u128::from(spec.count[l]);
            links = links.saturating_add(nodes.saturating_mul(per_node).saturating_mul(2));
        }
        check_size(u64::try_from(links).unwrap_or(u64::MAX))?;
        spec.links
            .iter()
            .enumerate()
            .map(|(level, link)| {
                let ratio = ratios.get(level).copied().unwrap_or(1.0);
                let bits = (link.bandwidth.bits_per_second() as f64 / ratio).round() as u64;
                let bandwidth =
                    Bandwidth::from_bits_per_second(bits).ok_or_else(|| TopologyError::Invalid {
                        parameter: "fat-tree oversubscription",
                        problem: format!("{} divided by {ratio} leaves no bandwidth", link.bandwidth),
                    })?;
                Ok(LinkSpec { bandwidth, latency: link.latency })
            })
            .collect()
    }

    pub(crate) fn build(
        fabric: &FabricSpec,
        spec: &XgftSpec,
        routing: Routing,
        terminals: &[NodeIndex],
        wiring: &mut Wiring<'_>,
    ) -> Result<Xgft, TopologyError> {
        let links = Xgft::shape(fabric, spec, terminals.len() as u64)?;
        let levels = spec.levels as usize;
        let widen = |v: &[u32]| v.iter().map(|&n| u64::from(n)).collect::<Vec<u64>>();
        let (down, up, count) = (widen(&spec.down), widen(&spec.up), widen(&spec.count));
        let prefix = |v: &[u64]| {
            let mut out = vec![1u64];
            for &n in v {
                out.push(out[out.len() - 1] * n);
            }
            out
        };
        let (low_up, low_down) = (prefix(&up), prefix(&down));
        let nodes: Vec<u64> = (0..=levels).map(|l| low_down[levels] / low_down[l] * low_up[l]).collect();
        let mut xgft = Xgft {
            base: wiring.next_link(),
            levels,
            down,
            up,
            count,
            nodes,
            low_up,
            cable_base: vec![0; levels],
            switch_base: vec![0; levels + 1],
            links,
            ecmp: routing == Routing::Ecmp,
        };
        // Switches level by level, then cables level by level (SimGrid's order).
        let mut first_vertex = vec![NodeIndex::new(0); levels + 1];
        let mut switches = 0;
        for (l, first) in first_vertex.iter_mut().enumerate().skip(1) {
            xgft.switch_base[l] = switches;
            *first = wiring.add_switches(xgft.nodes[l]);
            switches += xgft.nodes[l];
        }
        let vertex = |l: usize, q: u64| {
            if l == 0 { terminals[q as usize] } else { NodeIndex::new(first_vertex[l].index() + q as usize) }
        };
        let mut cables = 0;
        for l in 0..levels {
            xgft.cable_base[l] = cables;
            let children = if l == 0 { terminals.len() as u64 } else { xgft.nodes[l] };
            let tier = if l == 0 { Tier::NetworkEdge } else { Tier::FatTree { level: l as u8 } };
            let link = link_of(xgft.links[l], tier);
            for q in 0..children {
                for b in 0..xgft.up[l] {
                    let parent = vertex(l + 1, xgft.parent(l, q, b));
                    for _ in 0..xgft.count[l] {
                        wiring.cable(vertex(l, q), parent, link);
                        cables += 1;
                    }
                }
            }
        }
        Ok(xgft)
    }

    /// Position of parent `b` of the node at level `l`, position `q`.
    fn parent(&self, l: usize, q: u64, b: u64) -> u64 {
        let low = q % self.low_up[l];
        let high = q / self.low_up[l] / self.down[l];
        low + self.low_up[l] * (b + self.up[l] * high)
    }

    /// Cable `j` between the node at level `l`, position `q`, and its parent `b`.
    fn cable(&self, l: usize, q: u64, b: u64, j: u64) -> u64 {
        self.cable_base[l] + (q * self.up[l] + b) * self.count[l] + j
    }

    pub(crate) fn route(&self, s: u32, t: u32, key: FlowKey, out: &mut Route) -> Result<(), RouteFull> {
        /// A route holds at most 16 links, so it never climbs more than 8 levels.
        const MAX_CLIMB: usize = Route::CAPACITY / 2;
        let (s, t) = (u64::from(s), u64::from(t));
        // The node at level `l` has position `low + prod(up[..l]) * high`: `low` holds the
        // parent indices chosen so far, `high` the source's digits from `l` up. Climb until
        // the digits above the level agree with the destination's (`high == t_high[l]`): the
        // switch's subtree then holds the destination.
        let (mut low, mut high) = (0, s);
        let mut t_high = [0; MAX_CLIMB + 1];
        t_high[0] = t;
        let mut t_up = t; // t / prod(up[..l]), D-mod-K's dividend
        let mut level = 0;
        loop {
            if level == MAX_CLIMB {
                return Err(RouteFull);
            }
            let (up, count) = (self.up[level], self.count[level]);
            let ports = up * count;
            let port = if self.ecmp {
                u64::from(key.pick(level as u64, ports as u32))
            } else {
                // D-mod-K: port (t / prod(up[..l])) mod (up[l] * count[l]); port p is parent
                // p mod up[l], parallel cable p / up[l].
                t_up % ports
            };
            let (b, j) = if count == 1 { (port, 0) } else { (port % up, port / up) };
            let q = low + self.low_up[level] * high;
            out.push(forward(self.base, self.cable(level, q, b, j)))?;
            low += b * self.low_up[level];
            high /= self.down[level];
            t_high[level + 1] = t_high[level] / self.down[level];
            t_up /= up;
            level += 1;
            if high == t_high[level] {
                break;
            }
        }
        // Down the unique switch path. With parallel cables SimGrid 3.32 scans its child ports
        // (index = child digit + cable * down) from (s mod count) * down and carries the scan
        // index over to the next level down, starting afresh when it runs off the end; that
        // scan is replayed here in O(1) per level so the cables match SimGrid's.
        let top = level;
        let mut scan = 0;
        for l in (0..top).rev() {
            let (down, count) = (self.down[l], self.count[l]);
            let a = t_high[l] - down * t_high[l + 1];
            let j = if self.ecmp {
                if count == 1 { 0 } else { u64::from(key.pick((self.levels + l) as u64, count as u32)) }
            } else {
                // The scan runs at every level, parallel cables or not: where it stands
                // decides the cable one level further down.
                let start = (s % count) * down;
                if l + 1 == top {
                    scan = start;
                }
                let mut index = scan + (a + down - scan % down) % down;
                if index >= down * count {
                    index = start + a;
                }
                scan = index + 1;
                index / down
            };
            let b = low / self.low_up[l];
            low -= b * self.low_up[l];
            let child = low + self.low_up[l] * t_high[l];
            out.push(backward(self.base, self.cable(l, child, b, j)))?;
        }
        Ok(())
    }

    pub(crate) fn switch_name(&self, index: u32) -> String {
        let index = u64::from(index);
        let level = (1..=self.levels).rev().find(|&l| self.switch_base[l] <= index).unwrap_or(1);
        let position = index - self.switch_base[level];
        let name = match (self.levels, level) {
            (2, 1) => "leaf".to_string(),
            (2, 2) => "spine".to_string(),
            (3, 1) => "edge".to_string(),
            (3, 2) => "aggregation".to_string(),
            (3, 3) => "core".to_string(),
            (_, l) => format!("level-{l}"),
        };
        format!("{name} {position}")
    }

    pub(crate) fn terminal_link(&self) -> LinkSpec {
        self.links[0]
    }

    pub(crate) fn bisection(&self) -> (u128, &'static str) {
        let narrowest = (0..self.levels)
            .map(|l| {
                u128::from(self.nodes[l] / 2)
                    * u128::from(self.up[l] * self.count[l])
                    * u128::from(self.links[l].bandwidth.bits_per_second())
            })
            .min()
            .unwrap_or(0);
        (
            narrowest,
            "fat-tree: the up-links of half the nodes at its narrowest level, halves split by the top \
             switch digit (exact when the top arity is even)",
        )
    }
}
