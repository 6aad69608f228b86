//! n-dimensional tori (and rings, the one-dimensional case) of routers, one terminal each,
//! routed in dimension order.
//!
//! Router `r` has coordinates `r / stride[k] % dims[k]` (dimension 0 fastest); terminal `t`
//! sits on router `t`. Cables: terminals first, then dimension by dimension the cable from
//! each router to its `+1` neighbour (with wraparound). A dimension of size 2 has a single
//! cable per pair of routers (from the one at coordinate 0), one of size 1 none.

use petgraph::graph::NodeIndex;

use super::{Wiring, backward, check_capacity, check_size, forward, link_of};
use crate::spec::FabricSpec;
use crate::{LinkSpec, Route, RouteFull, Tier, TopologyError};

#[derive(Debug, Clone)]
pub(crate) struct Torus {
    base: u32,
    dims: Vec<u64>,
    strides: Vec<u64>,
    routers: u64,
    /// First cable of each dimension.
    dim_base: Vec<u64>,
    link: LinkSpec,
}

impl Torus {
    /// The cables of dimension `k` (one per router, half as many for size 2, none for 1).
    fn dimension_cables(routers: u64, size: u64) -> u64 {
        match size {
            1 => 0,
            2 => routers / 2,
            _ => routers,
        }
    }

    pub(crate) fn validate(fabric: &FabricSpec, dims: &[u32], terminals: u64) -> Result<(), TopologyError> {
        if dims.is_empty() {
            return Err(TopologyError::Invalid {
                parameter: "dims",
                problem: "is empty; give the number of routers along each dimension, e.g. [4, 4, 4]".into(),
            });
        }
        if let Some(k) = dims.iter().position(|&d| d == 0) {
            return Err(TopologyError::Invalid {
                parameter: "dims",
                problem: format!("dimension {k} is 0; every dimension needs at least 1 router"),
            });
        }
        let routers = dims.iter().fold(1u128, |p, &d| p.saturating_mul(u128::from(d)));
        let routers = u64::try_from(routers).unwrap_or(u64::MAX);
        check_capacity(fabric, routers, terminals)?;
        let cables: u64 = terminals.saturating_add(
            dims.iter().map(|&d| Torus::dimension_cables(routers, u64::from(d))).sum::<u64>(),
        );
        check_size(cables.saturating_mul(2))
    }

    pub(crate) fn build(
        fabric: &FabricSpec,
        dims: &[u32],
        link: LinkSpec,
        terminals: &[NodeIndex],
        wiring: &mut Wiring<'_>,
    ) -> Result<Torus, TopologyError> {
        Torus::validate(fabric, dims, terminals.len() as u64)?;
        let dims: Vec<u64> = dims.iter().map(|&d| u64::from(d)).collect();
        let mut strides = Vec::with_capacity(dims.len());
        let mut routers = 1;
        for &d in &dims {
            strides.push(routers);
            routers *= d;
        }
        let mut dim_base = Vec::with_capacity(dims.len());
        let mut cables = terminals.len() as u64;
        for &d in &dims {
            dim_base.push(cables);
            cables += Torus::dimension_cables(routers, d);
        }
        let torus = Torus { base: wiring.next_link(), dims, strides, routers, dim_base, link };
        let first = wiring.add_switches(routers);
        let router = |r: u64| NodeIndex::new(first.index() + r as usize);
        for (t, &terminal) in terminals.iter().enumerate() {
            wiring.cable(terminal, router(t as u64), link_of(link, Tier::NetworkEdge));
        }
        for (k, &d) in torus.dims.iter().enumerate() {
            let tier = link_of(link, Tier::Torus { dimension: k as u8 });
            for r in 0..routers {
                let x = torus.coordinate(r, k);
                if d >= 3 || (d == 2 && x == 0) {
                    wiring.cable(router(r), router(torus.plus(r, k)), tier);
                }
            }
        }
        Ok(torus)
    }

    fn coordinate(&self, r: u64, k: usize) -> u64 {
        r / self.strides[k] % self.dims[k]
    }

    /// The `+1` neighbour of `r` along `k`, with wraparound.
    fn plus(&self, r: u64, k: usize) -> u64 {
        if self.coordinate(r, k) + 1 == self.dims[k] {
            r + self.strides[k] - self.dims[k] * self.strides[k]
        } else {
            r + self.strides[k]
        }
    }

    /// The `-1` neighbour of `r` along `k`, with wraparound.
    fn minus(&self, r: u64, k: usize) -> u64 {
        if self.coordinate(r, k) == 0 {
            r + (self.dims[k] - 1) * self.strides[k]
        } else {
            r - self.strides[k]
        }
    }

    /// The cable from `r` to its `+1` neighbour along `k`.
    fn plus_cable(&self, r: u64, k: usize) -> u64 {
        if self.dims[k] == 2 {
            // Only coordinate-0 routers own a cable; compress them to consecutive indices.
            let stride = self.strides[k];
            self.dim_base[k] + r % stride + stride * (r / (2 * stride))
        } else {
            self.dim_base[k] + r
        }
    }

    pub(crate) fn route(&self, s: u32, t: u32, out: &mut Route) -> Result<(), RouteFull> {
        let (mut r, target) = (u64::from(s), u64::from(t));
        out.push(forward(self.base, r))?;
        for k in 0..self.dims.len() {
            let d = self.dims[k];
            let delta = (self.coordinate(target, k) + d - self.coordinate(r, k)) % d;
            if delta == 0 {
                continue;
            }
            if delta <= d / 2 {
                // The shorter way is up (ties go up).
                for _ in 0..delta {
                    let link = if d == 2 && self.coordinate(r, k) == 1 {
                        backward(self.base, self.plus_cable(self.minus(r, k), k))
                    } else {
                        forward(self.base, self.plus_cable(r, k))
                    };
                    out.push(link)?;
                    r = self.plus(r, k);
                }
            } else {
                for _ in 0..d - delta {
                    let next = self.minus(r, k);
                    out.push(backward(self.base, self.plus_cable(next, k)))?;
                    r = next;
                }
            }
        }
        out.push(backward(self.base, target))
    }

    pub(crate) fn switch_name(&self, index: u32) -> String {
        let r = u64::from(index);
        let coordinates: Vec<String> =
            (0..self.dims.len()).map(|k| self.coordinate(r, k).to_string()).collect();
        format!("router ({})", coordinates.join(","))
    }

    pub(crate) fn bisection(&self) -> (u128, &'static str) {
        let widest = self.dims.iter().copied().max().unwrap_or(1);
        let lines = u128::from(self.routers / widest);
        let cut = match widest {
            1 => 0,
            2 => lines,
            _ => 2 * lines,
        };
        (
            cut * u128::from(self.link.bandwidth.bits_per_second()),
            "torus: the cables cut by halving the longest dimension (two per ring along it)",
        )
    }

    pub(crate) fn terminal_link(&self) -> LinkSpec {
        self.link
    }
}
