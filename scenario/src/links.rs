//! Links as every report names them: the one record of a link's load over a run that
//! `run --json`, `traffic --json` and the jobs report share.

use serde::Serialize;
use topology::{LinkId, Topology};

/// One directed link and the bytes it carried over a run.
///
/// `run --json`'s `busiest_links`, `traffic --json`'s and the jobs report's (whose
/// `ContendedLink` adds the jobs that crossed it, flattened into the same object) all
/// serialize this, in this field order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkLoad {
    /// Both ends, `"FROM -> TO"` (as `topo --json` names it).
    pub name: String,
    /// NVLink, PCIe, NIC, leaf-spine, spine-core, local, global, ...
    pub kind: &'static str,
    /// Id in `topo --json`'s link list.
    pub id: u32,
    /// Bytes per second, one direction.
    pub capacity_bytes_per_s: f64,
    /// Bytes carried.
    pub bytes: f64,
    /// Bytes carried / (capacity x time): the mean over the run.
    pub utilisation: f64,
}

impl LinkLoad {
    /// `link` of `topology`, which carried `bytes` over `seconds` (a utilisation of 0 when no
    /// time passed).
    pub fn new(topology: &Topology, link: LinkId, bytes: f64, seconds: f64) -> Self {
        Self::unnamed(topology, link, bytes, seconds).named(topology)
    }

    /// As [`LinkLoad::new`] without the name and kind (strings a ranking does not need).
    fn unnamed(topology: &Topology, link: LinkId, bytes: f64, seconds: f64) -> Self {
        let capacity = topology.link(link).bandwidth.bytes_per_second();
        LinkLoad {
            name: String::new(),
            kind: "",
            id: link.0,
            capacity_bytes_per_s: capacity,
            bytes,
            utilisation: if seconds > 0.0 { bytes / (capacity * seconds) } else { 0.0 },
        }
    }

    /// The same record with its link's name and kind.
    fn named(mut self, topology: &Topology) -> Self {
        self.name = topology.link_name(LinkId(self.id));
        self.kind = topology.link_kind(LinkId(self.id));
        self
    }

    /// The order of a report: higher utilisation first, then more bytes, then the lower id.
    pub fn busier_first(&self, other: &Self) -> std::cmp::Ordering {
        other
            .utilisation
            .total_cmp(&self.utilisation)
            .then(other.bytes.total_cmp(&self.bytes))
            .then(self.id.cmp(&other.id))
    }
}

/// The `count` links of `topology` with the highest utilisation over `seconds`, given the
/// bytes each carried (indexed by [`LinkId`]), in [`LinkLoad::busier_first`] order; links
/// that carried nothing are left out.
pub fn busiest(topology: &Topology, link_bytes: &[f64], seconds: f64, count: usize) -> Vec<LinkLoad> {
    // Ranked without names (naming every link was 38% of the instructions of a 1,024-host
    // dragonfly `traffic` run), then only the chosen ones named.
    let mut links: Vec<LinkLoad> = link_bytes
        .iter()
        .enumerate()
        .filter(|&(_, &bytes)| bytes > 0.0)
        .map(|(id, &bytes)| LinkLoad::unnamed(topology, LinkId(id as u32), bytes, seconds))
        .collect();
    links.sort_by(LinkLoad::busier_first);
    links.truncate(count);
    links.into_iter().map(|link| link.named(topology)).collect()
}
