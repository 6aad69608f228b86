//! NCCL's protocols (LL, LL128, Simple) and what each costs: a base latency per collective,
//! a latency per hop by the kind of link crossed, and the share of the link bandwidth that
//! carries data.
//!
//! The numbers are NCCL's own tuning constants (`src/graph/tuning.cc`, `baseLat`, `hwLat`
//! and the "model refinements" of `ncclTopoTuneModel`), which NCCL uses to choose a
//! protocol and an algorithm for every collective. They differ between releases, so every
//! method takes the scenario's release table ([`NcclTable`]); the default (NCCL 2.23-2.27):
//!
//! | | LL | LL128 | Simple |
//! |---|---|---|---|
//! | base latency, ring / tree (us) | 6.6 / 6.8 | 14 / 14 | 8.4 / 8.4 |
//! | per hop over NVLink, ring / tree (us) | 0.6 / 0.6 | 1.9 / 1.25 | 3.4 / 4.0 |
//! | per hop over PCIe, ring / tree (us) | 1.0 / 1.0 | 2.5 / 1.9 | 5.7 / 4.0 |
//! | per hop over the network, ring / tree (us) | 2.7 / 5.0 | 4.0 / 8.5 | 14 / 14 |
//! | data per byte on the wire, ring | 1/2 | 0.92 | 1 |
//! | data per byte on the wire, tree | 1/3.8 | 120/128 (7/9 in one server) | 0.92 |
//!
//! LL sends 8-byte lines of 4 data bytes and a 4-byte flag (half the bandwidth, no memory
//! fence: the lowest latency); LL128 sends 128-byte lines with 8 flag bytes; Simple sends
//! large chunks behind a fence. NCCL's tuner also charges a ring over several servers its
//! network post overhead on each in-server step (1 us, 3 us with Simple), and a pipelined ring
//! in its bandwidth regime 1.4 times its latency (NCCL's "plateau effect", Ampere and later).
//! parasim's timing keeps the plateau but lets a ring across servers pay its network hops
//! only: its in-server hops are done while the network hops of the same step still send
//! (`collective::step_extra`).
//!
//! Base latencies scale with the network settings' collective launch (8.4 us by default, the
//! Simple base): a launch of zero (replayed kernels that already include it) zeroes them all.

use std::fmt;
use std::str::FromStr;

use units::SimDuration;

use crate::nccl::NcclTable;

/// An NCCL protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// Low latency: 8-byte lines with a flag, half the bandwidth.
    Ll,
    /// 128-byte lines with 8 flag bytes.
    Ll128,
    /// Large chunks behind memory fences: full bandwidth, the highest latency.
    Simple,
}

/// Which links a hop of a collective crosses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// NVLink or NVSwitch inside a server.
    NvLink,
    /// PCIe inside a server.
    Pci,
    /// The network between servers.
    Net,
}

/// NCCL's two latency families: rings (and every point-to-point exchange) and trees (and
/// every pipelined chain).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Ring-like: every step is an exchange with a neighbour.
    Ring,
    /// Tree-like: pipelined chunks along parent-child edges.
    Tree,
}

/// NCCL's base latency of the Simple protocol (us), the default collective launch.
pub const SIMPLE_BASE_US: f64 = 8.4;

impl Protocol {
    /// Every protocol, lowest latency first.
    pub const ALL: [Protocol; 3] = [Protocol::Ll, Protocol::Ll128, Protocol::Simple];

    /// The name NCCL uses (`NCCL_PROTO`).
    pub const fn name(self) -> &'static str {
        match self {
            Protocol::Ll => "LL",
            Protocol::Ll128 => "LL128",
            Protocol::Simple => "Simple",
        }
    }

    /// Base latency of one collective with this protocol, for a collective launch `launch`
    /// (the release's `baseLat`, [`NcclTable::base_latency`], scaled by `launch / 8.4 us`).
    pub fn base_latency(self, table: &NcclTable, family: Family, launch: SimDuration) -> SimDuration {
        let ps = launch.as_ps() as f64 * table.base_latency_us(family, self) / SIMPLE_BASE_US;
        SimDuration::from_ps(ps.round() as u64)
    }

    /// Latency of one hop of a step (the release's `hwLat`, [`NcclTable::hop_latency_us`]);
    /// `multi_server`: the collective spans servers.
    pub fn hop_latency(self, table: &NcclTable, family: Family, hop: Hop, multi_server: bool) -> SimDuration {
        let ns = table.hop_latency_us(family, self, hop, multi_server) * 1e3;
        SimDuration::from_ps((ns * 1e3).round() as u64)
    }

    /// The network post overhead NCCL's tuner charges every in-server step of a ring across
    /// servers at least (NCCL's `getNetOverhead`, 1 us on x86, tripled for Simple; zero in
    /// releases without it); in a ring whose steps are alike it is hidden behind the network
    /// hops (`collective::step_extra`).
    pub fn ring_net_overhead(self, table: &NcclTable) -> SimDuration {
        if !table.ring_net_overhead {
            return SimDuration::ZERO;
        }
        SimDuration::from_us(if self == Protocol::Simple { 3 } else { 1 })
    }

    /// Bytes on the wire per byte of data, as `(numerator, denominator)`: the inverse of
    /// NCCL's bandwidth factor for this protocol (`single_server`: the group is inside one
    /// server, where LL128 trees reach 7/9 rather than 120/128).
    /// Ring/LL moves the release's [`NcclTable::ring_ll_share`] (1/2, or 1/4 in NCCL 2.11).
    pub fn wire_ratio(self, table: &NcclTable, family: Family, single_server: bool) -> (u64, u64) {
        match (self, family) {
            (Protocol::Simple, Family::Ring) => (1, 1),
            (Protocol::Simple, Family::Tree) => (25, 23), // 1 / 0.92
            (Protocol::Ll, Family::Ring) => ((1.0 / table.ring_ll_share).round() as u64, 1),
            (Protocol::Ll, Family::Tree) => (19, 5), // 3.8
            (Protocol::Ll128, Family::Ring) => (25, 23),
            (Protocol::Ll128, Family::Tree) if single_server => (9, 7),
            (Protocol::Ll128, Family::Tree) => (128, 120),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Protocol {
    type Err = String;
    fn from_str(name: &str) -> Result<Protocol, String> {
        Protocol::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(name)).ok_or_else(|| {
            format!("unknown protocol {name:?}; valid: \"LL\", \"LL128\", \"Simple\" (or \"auto\", \"off\")")
        })
    }
}

/// Which protocols a network model uses for collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProtocolChoice {
    /// No protocol costs: the pure network (alpha-beta on the links, the collective launch
    /// added as is).
    #[default]
    Off,
    /// The protocol NCCL's tuner would pick for each collective: the fastest estimate.
    Auto,
    /// Always this protocol.
    Only(Protocol),
}

impl ProtocolChoice {
    /// The protocols to consider.
    pub fn candidates(self) -> &'static [Protocol] {
        match self {
            ProtocolChoice::Off => &[],
            ProtocolChoice::Auto => &Protocol::ALL,
            ProtocolChoice::Only(Protocol::Ll) => &[Protocol::Ll],
            ProtocolChoice::Only(Protocol::Ll128) => &[Protocol::Ll128],
            ProtocolChoice::Only(Protocol::Simple) => &[Protocol::Simple],
        }
    }
}

impl FromStr for ProtocolChoice {
    type Err = String;
    fn from_str(name: &str) -> Result<ProtocolChoice, String> {
        match name.to_ascii_lowercase().as_str() {
            "off" => Ok(ProtocolChoice::Off),
            "auto" => Ok(ProtocolChoice::Auto),
            _ => name.parse().map(ProtocolChoice::Only),
        }
    }
}

impl fmt::Display for ProtocolChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolChoice::Off => f.write_str("off"),
            ProtocolChoice::Auto => f.write_str("auto"),
            ProtocolChoice::Only(protocol) => protocol.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_latencies_are_nccls_at_the_default_launch_and_vanish_without_one() {
        let launch = SimDuration::from_ns(8_400);
        let table = NcclTable::default_table();
        assert_eq!(Protocol::Ll.base_latency(table, Family::Ring, launch), SimDuration::from_ns(6_600));
        assert_eq!(Protocol::Ll128.base_latency(table, Family::Tree, launch), SimDuration::from_us(14));
        assert_eq!(Protocol::Simple.base_latency(table, Family::Tree, launch), launch);
        assert_eq!(Protocol::Ll.base_latency(table, Family::Tree, SimDuration::ZERO), SimDuration::ZERO);
        // NCCL 2.11: ring/LL 3.6 us, tree/Simple none (its 28 us hops carry it).
        let old = NcclTable::of(crate::nccl::NcclVersion::V2_11);
        assert_eq!(Protocol::Ll.base_latency(old, Family::Ring, launch), SimDuration::from_ns(3_600));
        assert_eq!(Protocol::Simple.base_latency(old, Family::Tree, launch), SimDuration::ZERO);
    }

    #[test]
    fn names_round_trip() {
        for protocol in Protocol::ALL {
            assert_eq!(protocol.name().parse::<Protocol>(), Ok(protocol));
            assert_eq!(protocol.to_string().parse::<ProtocolChoice>(), Ok(ProtocolChoice::Only(protocol)));
        }
        assert_eq!("auto".parse::<ProtocolChoice>(), Ok(ProtocolChoice::Auto));
        assert_eq!("off".parse::<ProtocolChoice>(), Ok(ProtocolChoice::Off));
        assert!("fast".parse::<ProtocolChoice>().unwrap_err().contains("LL128"));
    }

    #[test]
    fn ll_halves_the_bandwidth_and_simple_keeps_it_on_rings() {
        let table = NcclTable::default_table();
        assert_eq!(Protocol::Ll.wire_ratio(table, Family::Ring, false), (2, 1));
        assert_eq!(Protocol::Simple.wire_ratio(table, Family::Ring, false), (1, 1));
        let old = NcclTable::of(crate::nccl::NcclVersion::V2_11);
        assert_eq!(Protocol::Ll.wire_ratio(old, Family::Ring, false), (4, 1));
        assert!(
            Protocol::Ll.hop_latency(table, Family::Ring, Hop::Net, true)
                < Protocol::Simple.hop_latency(table, Family::Ring, Hop::Net, true)
        );
    }
}
