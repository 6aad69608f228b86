//! The flat fabrics: one switch, or a cable between every pair of terminals.

use petgraph::graph::NodeIndex;

use super::{Wiring, backward, forward, link_of, pair_index};
use crate::{LinkSpec, Route, RouteFull, Tier, TopologyError};

/// One non-blocking switch: terminal `t` has cable `t` to it.
#[derive(Debug, Clone)]
pub(crate) struct Switch {
    base: u32,
    terminals: u64,
    link: LinkSpec,
}

impl Switch {
    pub(crate) fn build(
        link: LinkSpec,
        terminals: &[NodeIndex],
        wiring: &mut Wiring<'_>,
    ) -> Result<Switch, TopologyError> {
        let base = wiring.next_link();
        let switch = wiring.add_switches(1);
        for &terminal in terminals {
            wiring.cable(terminal, switch, link_of(link, Tier::NetworkEdge));
        }
        Ok(Switch { base, terminals: terminals.len() as u64, link })
    }

    pub(crate) fn route(&self, s: u32, t: u32, out: &mut Route) -> Result<(), RouteFull> {
        out.push(forward(self.base, u64::from(s)))?;
        out.push(backward(self.base, u64::from(t)))
    }

    pub(crate) fn terminal_link(&self) -> LinkSpec {
        self.link
    }

    pub(crate) fn bisection(&self) -> (u128, &'static str) {
        (
            u128::from(self.terminals / 2) * u128::from(self.link.bandwidth.bits_per_second()),
            "non-blocking switch: the terminal links of half the terminals",
        )
    }
}

/// A cable between every pair of terminals: pair `i < j` is cable `pair_index(i, j)`.
#[derive(Debug, Clone)]
pub(crate) struct FullyConnected {
    base: u32,
    terminals: u64,
    link: LinkSpec,
}

impl FullyConnected {
    pub(crate) fn build(
        link: LinkSpec,
        terminals: &[NodeIndex],
        wiring: &mut Wiring<'_>,
    ) -> Result<FullyConnected, TopologyError> {
        let base = wiring.next_link();
        for (i, &a) in terminals.iter().enumerate() {
            for &b in &terminals[i + 1..] {
                wiring.cable(a, b, link_of(link, Tier::Direct));
            }
        }
        Ok(FullyConnected { base, terminals: terminals.len() as u64, link })
    }

    pub(crate) fn route(&self, s: u32, t: u32, out: &mut Route) -> Result<(), RouteFull> {
        let (s, t) = (u64::from(s), u64::from(t));
        if s < t {
            out.push(forward(self.base, pair_index(s, t, self.terminals)))
        } else {
            out.push(backward(self.base, pair_index(t, s, self.terminals)))
        }
    }

    pub(crate) fn bisection(&self) -> (u128, &'static str) {
        let half = self.terminals / 2;
        (
            u128::from(half)
                * u128::from(self.terminals - half)
                * u128::from(self.link.bandwidth.bits_per_second()),
            "every cable between the two halves of the terminals",
        )
    }
}
