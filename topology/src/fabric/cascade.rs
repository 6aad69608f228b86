//! SimGrid 3.32's Cray-Cascade-like dragonfly (`G,GL;C,CL;R,RL;NODES`), wired and routed as
//! SimGrid wires and routes it; see [`CascadeSpec`].
//!
//! Routers are numbered group, chassis, blade (`((group * C) + chassis) * R + blade`);
//! terminal `t` sits on router `t / NODES`. Cables are added in SimGrid's order (terminals,
//! green, black, blue), so cable `u` is SimGrid's link with unique id `u`.
//!
//! Minimal route, as SimGrid's: from the source router, to another group: a green hop to blade
//! = destination group, a black hop to chassis 0, the blue hop (arriving at chassis 0, blade =
//! source group); then a green hop to the destination blade and a black hop to the
//! destination chassis. A hop whose router is already right is skipped. One deliberate
//! difference: SimGrid, after a green hop, believes it stands in chassis 0 even when it does
//! not (same-group traffic from a chassis other than 0 to another blade), and then adds a
//! black link that does not touch the path or omits one it needs; here the black hop leaves
//! from the chassis the route is really in, so every route is a connected walk.

use petgraph::graph::NodeIndex;

use super::{
    Wiring, backward, check_capacity, check_positive, check_size, forward, link_of, merged, pair_index,
};
use crate::hash::FlowKey;
use crate::spec::{CascadeSpec, FabricSpec};
use crate::{LinkSpec, Route, RouteFull, Tier, TopologyError};

#[derive(Debug, Clone)]
pub(crate) struct Cascade {
    base: u32,
    groups: u64,
    chassis: u64,
    blades: u64,
    hosts: u64,
    green_base: u64,
    black_base: u64,
    blue_base: u64,
    /// Terminal, green, black, blue links, parallel cables merged.
    links: [LinkSpec; 4],
}

/// Where a route stands: group, chassis, blade.
#[derive(Debug, Clone, Copy)]
struct At {
    group: u64,
    chassis: u64,
    blade: u64,
}

const SALT_INTERMEDIATE: u64 = 1;

impl Cascade {
    pub(crate) fn validate(
        fabric: &FabricSpec,
        spec: &CascadeSpec,
        terminals: u64,
    ) -> Result<(), TopologyError> {
        Cascade::links(fabric, spec, terminals).map(|_| ())
    }

    fn links(
        fabric: &FabricSpec,
        spec: &CascadeSpec,
        terminals: u64,
    ) -> Result<[LinkSpec; 4], TopologyError> {
        check_positive(&[
            ("cascade-dragonfly groups", spec.groups),
            ("cascade-dragonfly global-links", spec.global_links),
            ("cascade-dragonfly chassis-per-group", spec.chassis_per_group),
            ("cascade-dragonfly chassis-links", spec.chassis_links),
            ("cascade-dragonfly routers-per-chassis", spec.routers_per_chassis),
            ("cascade-dragonfly router-links", spec.router_links),
            ("cascade-dragonfly hosts-per-router", spec.hosts_per_router),
        ])?;
        if spec.groups > spec.routers_per_chassis {
            return Err(TopologyError::Invalid {
                parameter: "cascade-dragonfly groups",
                problem: format!(
                    "{} groups but {} routers per chassis: SimGrid 3.32 attaches the link to group j to \
                     router j of chassis 0, so groups must be at most routers-per-chassis",
                    spec.groups, spec.routers_per_chassis
                ),
            });
        }
        check_capacity(fabric, spec.terminal_capacity(), terminals)?;
        let (g, c, r) =
            (u64::from(spec.groups), u64::from(spec.chassis_per_group), u64::from(spec.routers_per_chassis));
        let cables = terminals + g * c * r * (r - 1) / 2 + g * c * (c - 1) / 2 * r + g * (g - 1) / 2;
        check_size(cables.saturating_mul(2))?;
        Ok([
            spec.terminal,
            merged(spec.green, spec.router_links, "cascade-dragonfly router-links")?,
            merged(spec.black, spec.chassis_links, "cascade-dragonfly chassis-links")?,
            merged(spec.blue, spec.global_links, "cascade-dragonfly global-links")?,
        ])
    }

    pub(crate) fn build(
        fabric: &FabricSpec,
        spec: &CascadeSpec,
        terminals: &[NodeIndex],
        wiring: &mut Wiring<'_>,
    ) -> Result<Cascade, TopologyError> {
        let links = Cascade::links(fabric, spec, terminals.len() as u64)?;
        let (groups, chassis, blades) =
            (u64::from(spec.groups), u64::from(spec.chassis_per_group), u64::from(spec.routers_per_chassis));
        let green_base = terminals.len() as u64;
        let black_base = green_base + groups * chassis * blades * (blades - 1) / 2;
        let blue_base = black_base + groups * chassis * (chassis - 1) / 2 * blades;
        let cascade = Cascade {
            base: wiring.next_link(),
            groups,
            chassis,
            blades,
            hosts: u64::from(spec.hosts_per_router),
            green_base,
            black_base,
            blue_base,
            links,
        };
        let first = wiring.add_switches(groups * chassis * blades);
        let router = |g: u64, c: u64, b: u64| {
            NodeIndex::new(first.index() + ((g * chassis + c) * blades + b) as usize)
        };
        for (t, &terminal) in terminals.iter().enumerate() {
            let index = t as u64 / cascade.hosts;
            let vertex = NodeIndex::new(first.index() + index as usize);
            wiring.cable(terminal, vertex, link_of(links[0], Tier::NetworkEdge));
        }
        for g in 0..groups {
            for c in 0..chassis {
                for j in 0..blades {
                    for k in j + 1..blades {
                        wiring.cable(router(g, c, j), router(g, c, k), link_of(links[1], Tier::Local));
                    }
                }
            }
        }
        for g in 0..groups {
            for j in 0..chassis {
                for k in j + 1..chassis {
                    for b in 0..blades {
                        wiring.cable(router(g, j, b), router(g, k, b), link_of(links[2], Tier::InterChassis));
                    }
                }
            }
        }
        for i in 0..groups {
            for j in i + 1..groups {
                wiring.cable(router(i, 0, j), router(j, 0, i), link_of(links[3], Tier::Global));
            }
        }
        Ok(cascade)
    }

    fn at(&self, terminal: u32) -> At {
        let router = u64::from(terminal) / self.hosts;
        At {
            group: router / (self.chassis * self.blades),
            chassis: router / self.blades % self.chassis,
            blade: router % self.blades,
        }
    }

    /// A green hop inside the current chassis to `blade`, if not there already.
    fn green(&self, at: &mut At, blade: u64, out: &mut Route) -> Result<(), RouteFull> {
        if at.blade == blade {
            return Ok(());
        }
        let chassis = at.group * self.chassis + at.chassis;
        let offset = chassis * (self.blades * (self.blades - 1) / 2);
        let (lo, hi) = (at.blade.min(blade), at.blade.max(blade));
        let cable = self.green_base + offset + pair_index(lo, hi, self.blades);
        out.push(if at.blade < blade { forward(self.base, cable) } else { backward(self.base, cable) })?;
        at.blade = blade;
        Ok(())
    }

    /// A black hop at the current blade to `chassis`, if not there already.
    fn black(&self, at: &mut At, chassis: u64, out: &mut Route) -> Result<(), RouteFull> {
        if at.chassis == chassis {
            return Ok(());
        }
        let (lo, hi) = (at.chassis.min(chassis), at.chassis.max(chassis));
        let pairs = self.chassis * (self.chassis - 1) / 2;
        let cable =
            self.black_base + (at.group * pairs + pair_index(lo, hi, self.chassis)) * self.blades + at.blade;
        out.push(if at.chassis < chassis { forward(self.base, cable) } else { backward(self.base, cable) })?;
        at.chassis = chassis;
        Ok(())
    }

    /// Out of the current group to group `to`: green to blade `to`, black to chassis 0, blue.
    fn exit(&self, at: &mut At, to: u64, out: &mut Route) -> Result<(), RouteFull> {
        self.green(at, to, out)?;
        self.black(at, 0, out)?;
        let from = at.group;
        let cable = self.blue_base + pair_index(from.min(to), from.max(to), self.groups);
        out.push(if from < to { forward(self.base, cable) } else { backward(self.base, cable) })?;
        *at = At { group: to, chassis: 0, blade: from };
        Ok(())
    }

    pub(crate) fn has_detour(&self, s: u32, t: u32) -> bool {
        self.groups > 2 && self.at(s).group != self.at(t).group
    }

    pub(crate) fn route(
        &self,
        s: u32,
        t: u32,
        key: FlowKey,
        detour: bool,
        out: &mut Route,
    ) -> Result<(), RouteFull> {
        let (mut at, target) = (self.at(s), self.at(t));
        out.push(forward(self.base, u64::from(s)))?;
        if at.group != target.group {
            if detour && self.has_detour(s, t) {
                let mut via = u64::from(key.pick(SALT_INTERMEDIATE, (self.groups - 2) as u32));
                for end in [at.group.min(target.group), at.group.max(target.group)] {
                    if via >= end {
                        via += 1;
                    }
                }
                self.exit(&mut at, via, out)?;
            }
            self.exit(&mut at, target.group, out)?;
        }
        self.green(&mut at, target.blade, out)?;
        self.black(&mut at, target.chassis, out)?;
        out.push(backward(self.base, u64::from(t)))
    }

    pub(crate) fn switch_name(&self, index: u32) -> String {
        let index = u64::from(index);
        format!(
            "group {} chassis {} blade {}",
            index / (self.chassis * self.blades),
            index / self.blades % self.chassis,
            index % self.blades
        )
    }

    pub(crate) fn bisection(&self) -> (u128, &'static str) {
        let halves = |n: u64| u128::from(n / 2) * u128::from(n - n / 2);
        let bits = |l: LinkSpec| u128::from(l.bandwidth.bits_per_second());
        if self.groups > 1 {
            (
                halves(self.groups) * bits(self.links[3]),
                "cascade dragonfly: the blue links between two halves of the groups",
            )
        } else if self.chassis > 1 {
            (
                halves(self.chassis) * u128::from(self.blades) * bits(self.links[2]),
                "cascade dragonfly (one group): the black links between two halves of its chassis",
            )
        } else {
            (
                halves(self.blades) * bits(self.links[1]),
                "cascade dragonfly (one chassis): the green links between two halves of its routers",
            )
        }
    }

    pub(crate) fn terminal_link(&self) -> LinkSpec {
        self.links[0]
    }
}
