//! The canonical dragonfly (Kim, Dally, Scott, Abts, ISCA 2008): all-to-all groups joined by
//! global links in the consecutive arrangement documented on [`DragonflySpec`].
//!
//! Routers are numbered group by group (`router = group * a + r`), terminal `t` sits on router
//! `t / p`. Cables: terminals first, then each group's local pairs, then the global links pair
//! of groups by pair of groups, copy by copy.

use petgraph::graph::NodeIndex;

use super::{Wiring, backward, check_capacity, check_positive, check_size, forward, link_of, pair_index};
use crate::hash::FlowKey;
use crate::spec::{DragonflySpec, FabricSpec};
use crate::{Route, RouteFull, Tier, TopologyError};

#[derive(Debug, Clone)]
pub(crate) struct Dragonfly {
    base: u32,
    groups: u64,
    /// Routers per group (`a`).
    routers: u64,
    /// Terminals per router (`p`).
    hosts: u64,
    /// Global ports per router (`h`).
    ports: u64,
    /// Global links between each pair of groups.
    copies: u64,
    local_base: u64,
    global_base: u64,
    spec: DragonflySpec,
}

/// Salts of the hash decisions, so that they are independent.
const SALT_INTERMEDIATE: u64 = 1;
const SALT_FIRST_GLOBAL: u64 = 2;
const SALT_SECOND_GLOBAL: u64 = 3;

impl Dragonfly {
    pub(crate) fn validate(
        fabric: &FabricSpec,
        spec: &DragonflySpec,
        terminals: u64,
    ) -> Result<(), TopologyError> {
        check_positive(&[
            ("dragonfly groups", spec.groups),
            ("dragonfly routers-per-group", spec.routers_per_group),
            ("dragonfly hosts-per-router", spec.hosts_per_router),
            ("dragonfly global-links-per-router", spec.global_links_per_router),
        ])?;
        let ports = u64::from(spec.routers_per_group) * u64::from(spec.global_links_per_router);
        if u64::from(spec.groups) - 1 > ports {
            return Err(TopologyError::Invalid {
                parameter: "dragonfly groups",
                problem: format!(
                    "{} groups need at least {} global ports per group, but {} routers x {} global links \
                     give {ports}: use at most {} groups",
                    spec.groups,
                    spec.groups - 1,
                    spec.routers_per_group,
                    spec.global_links_per_router,
                    ports + 1
                ),
            });
        }
        check_capacity(fabric, spec.terminal_capacity(), terminals)?;
        let routers = u64::from(spec.groups) * u64::from(spec.routers_per_group);
        let a = u64::from(spec.routers_per_group);
        let g = u64::from(spec.groups);
        let copies = if g > 1 { ports / (g - 1) } else { 0 };
        let cables = terminals + routers * (a - 1) / 2 + g * (g - 1) / 2 * copies;
        check_size(cables.saturating_mul(2))
    }

    pub(crate) fn build(
        fabric: &FabricSpec,
        spec: &DragonflySpec,
        terminals: &[NodeIndex],
        wiring: &mut Wiring<'_>,
    ) -> Result<Dragonfly, TopologyError> {
        Dragonfly::validate(fabric, spec, terminals.len() as u64)?;
        let (groups, routers) = (u64::from(spec.groups), u64::from(spec.routers_per_group));
        let ports = u64::from(spec.global_links_per_router);
        let copies = if groups > 1 { routers * ports / (groups - 1) } else { 0 };
        let terminal_count = terminals.len() as u64;
        let dragonfly = Dragonfly {
            base: wiring.next_link(),
            groups,
            routers,
            hosts: u64::from(spec.hosts_per_router),
            ports,
            copies,
            local_base: terminal_count,
            global_base: terminal_count + groups * routers * (routers - 1) / 2,
            spec: spec.clone(),
        };
        let first = wiring.add_switches(groups * routers);
        let router = |index: u64| NodeIndex::new(first.index() + index as usize);
        for (t, &terminal) in terminals.iter().enumerate() {
            wiring.cable(
                terminal,
                router(t as u64 / dragonfly.hosts),
                link_of(spec.terminal, Tier::NetworkEdge),
            );
        }
        for group in 0..groups {
            for x in 0..routers {
                for y in x + 1..routers {
                    let link = link_of(spec.local, Tier::Local);
                    wiring.cable(router(group * routers + x), router(group * routers + y), link);
                }
            }
        }
        for i in 0..groups {
            for j in i + 1..groups {
                for copy in 0..copies {
                    let (a, b) = (dragonfly.global_router(i, j, copy), dragonfly.global_router(j, i, copy));
                    wiring.cable(
                        router(i * routers + a),
                        router(j * routers + b),
                        link_of(spec.global, Tier::Global),
                    );
                }
            }
        }
        Ok(dragonfly)
    }

    /// The router of group `i` that carries copy `copy` of the global link to group `j`.
    fn global_router(&self, i: u64, j: u64, copy: u64) -> u64 {
        let other = if j < i { j } else { j - 1 };
        (copy * (self.groups - 1) + other) / self.ports
    }

    fn local(&self, group: u64, x: u64, y: u64, out: &mut Route) -> Result<(), RouteFull> {
        let pairs = self.routers * (self.routers - 1) / 2;
        match x.cmp(&y) {
            std::cmp::Ordering::Equal => Ok(()),
            std::cmp::Ordering::Less => {
                out.push(forward(self.base, self.local_base + group * pairs + pair_index(x, y, self.routers)))
            }
            std::cmp::Ordering::Greater => out
                .push(backward(self.base, self.local_base + group * pairs + pair_index(y, x, self.routers))),
        }
    }

    fn global(&self, i: u64, j: u64, copy: u64, out: &mut Route) -> Result<(), RouteFull> {
        if i < j {
            out.push(forward(
                self.base,
                self.global_base + pair_index(i, j, self.groups) * self.copies + copy,
            ))
        } else {
            out.push(backward(
                self.base,
                self.global_base + pair_index(j, i, self.groups) * self.copies + copy,
            ))
        }
    }

    /// The global link from router `ri` of group `i` to group `j` (ending at router `rj` if
    /// given) with the fewest local hops; ties broken by the flow hash.
    fn choose_copy(&self, i: u64, ri: u64, j: u64, rj: Option<u64>, key: FlowKey, salt: u64) -> u64 {
        let cost = |copy: u64| {
            u32::from(self.global_router(i, j, copy) != ri)
                + rj.map_or(0, |rj| u32::from(self.global_router(j, i, copy) != rj))
        };
        let best = (0..self.copies).map(cost).min().unwrap_or(0);
        let ties = (0..self.copies).filter(|&c| cost(c) == best).count() as u32;
        let pick = u64::from(key.pick(salt, ties));
        (0..self.copies).filter(|&c| cost(c) == best).nth(pick as usize).unwrap_or(0)
    }

    /// From router `ri` of group `i` through one global link into group `j`, then to router
    /// `rj` if given; returns the router reached in group `j`.
    fn cross(
        &self,
        (i, ri): (u64, u64),
        (j, rj): (u64, Option<u64>),
        key: FlowKey,
        salt: u64,
        out: &mut Route,
    ) -> Result<u64, RouteFull> {
        let copy = self.choose_copy(i, ri, j, rj, key, salt);
        self.local(i, ri, self.global_router(i, j, copy), out)?;
        self.global(i, j, copy, out)?;
        let arrival = self.global_router(j, i, copy);
        match rj {
            Some(rj) => {
                self.local(j, arrival, rj, out)?;
                Ok(rj)
            }
            None => Ok(arrival),
        }
    }

    pub(crate) fn has_detour(&self, s: u32, t: u32) -> bool {
        let group = |terminal: u32| u64::from(terminal) / self.hosts / self.routers;
        self.groups > 2 && group(s) != group(t)
    }

    pub(crate) fn route(
        &self,
        s: u32,
        t: u32,
        key: FlowKey,
        detour: bool,
        out: &mut Route,
    ) -> Result<(), RouteFull> {
        let (rs, rd) = (u64::from(s) / self.hosts, u64::from(t) / self.hosts);
        let (gs, gd) = (rs / self.routers, rd / self.routers);
        let (rs, rd) = (rs % self.routers, rd % self.routers);
        out.push(forward(self.base, u64::from(s)))?;
        if gs == gd {
            self.local(gs, rs, rd, out)?;
        } else if detour && self.has_detour(s, t) {
            // Valiant: minimally to an intermediate group other than both ends, then minimally on.
            let mut gx = u64::from(key.pick(SALT_INTERMEDIATE, (self.groups - 2) as u32));
            for end in [gs.min(gd), gs.max(gd)] {
                if gx >= end {
                    gx += 1;
                }
            }
            let arrival = self.cross((gs, rs), (gx, None), key, SALT_FIRST_GLOBAL, out)?;
            self.cross((gx, arrival), (gd, Some(rd)), key, SALT_SECOND_GLOBAL, out)?;
        } else {
            self.cross((gs, rs), (gd, Some(rd)), key, SALT_FIRST_GLOBAL, out)?;
        }
        out.push(backward(self.base, u64::from(t)))
    }

    pub(crate) fn switch_name(&self, index: u32) -> String {
        let index = u64::from(index);
        format!("group {} router {}", index / self.routers, index % self.routers)
    }

    pub(crate) fn bisection(&self) -> (u128, &'static str) {
        let halves = |n: u64| u128::from(n / 2) * u128::from(n - n / 2);
        if self.groups > 1 {
            (
                halves(self.groups)
                    * u128::from(self.copies)
                    * u128::from(self.spec.global.bandwidth.bits_per_second()),
                "dragonfly: the global links between two halves of the groups",
            )
        } else {
            (
                halves(self.routers) * u128::from(self.spec.local.bandwidth.bits_per_second()),
                "dragonfly (one group): the local links between two halves of its routers",
            )
        }
    }

    pub(crate) fn terminal_link(&self) -> crate::LinkSpec {
        self.spec.terminal
    }
}
