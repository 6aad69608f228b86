//! The NCCL model's vocabulary: its protocols (LL, LL128, Simple), the kinds of links a hop
//! crosses, its two latency families, which protocols a network model runs, and what runs a
//! collective ([`Choice`]: an algorithm and, with protocols on, a protocol).
//!
//! LL sends 8-byte lines of 4 data bytes and a 4-byte flag (half the bandwidth, no memory
//! fence: the lowest latency); LL128 sends 128-byte lines with 8 flag bytes; Simple sends
//! large chunks behind a fence. What each costs (base and per-hop latencies, the share of the
//! links that carries data) is a release's constant: see `tables`, which prices a protocol
//! under a release's table.
//!
//! Plain types only: this module reads no table and depends on nothing above the graph IR.

use std::fmt;
use std::str::FromStr;

use crate::graph::CollectiveAlgorithm;

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

/// What runs a collective: the algorithm and, with protocols on, the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Choice {
    /// The algorithm (never `Auto`).
    pub algorithm: CollectiveAlgorithm,
    /// The protocol, `None` when protocols are off.
    pub protocol: Option<Protocol>,
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.protocol {
            Some(protocol) => write!(f, "{}/{}", self.algorithm.name(), protocol.name()),
            None => f.write_str(self.algorithm.name()),
        }
    }
}

/// The latency family of an algorithm.
pub fn family(algorithm: CollectiveAlgorithm) -> Family {
    use CollectiveAlgorithm as A;
    match algorithm {
        A::DoubleBinaryTree | A::Tree | A::Chain | A::BinomialTree => Family::Tree,
        A::Auto
        | A::Ring
        | A::Nvls
        | A::NvlsTree
        | A::CollNetDirect
        | A::CollNetChain
        | A::HalvingDoubling
        | A::RecursiveDoubling
        | A::Hierarchical
        | A::Pairwise
        | A::Direct => Family::Ring,
    }
}

/// True for the NVLS algorithms, which are timed in closed form (see `nvls`).
pub fn is_nvls(algorithm: CollectiveAlgorithm) -> bool {
    matches!(algorithm, CollectiveAlgorithm::Nvls | CollectiveAlgorithm::NvlsTree)
}

/// True for the algorithms whose reduction happens in a switch (NVLS in the NVSwitch, CollNet
/// in InfiniBand switches): timed in closed form at every fidelity, Simple protocol only.
pub fn is_in_network(algorithm: CollectiveAlgorithm) -> bool {
    is_nvls(algorithm)
        || matches!(algorithm, CollectiveAlgorithm::CollNetDirect | CollectiveAlgorithm::CollNetChain)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
