//! NCCL's CollNet: allreduce with the reduction in the InfiniBand switches (SHARP).
//!
//! Where the switches aggregate (`cluster.network.sharp = true`), NCCL's CollNet algorithms
//! reduce inside each server, hand the server's partial sum to the switch fabric one share per
//! NIC, let the switches' aggregation tree reduce across every server and return the sum, and
//! broadcast it inside the server. CollNet Chain (any server) runs a chain through the
//! server's GPUs per channel, reducing towards the GPU that owns the channel's NIC and
//! broadcasting back; CollNet Direct (NVSwitch servers) has every GPU send each NIC owner its
//! share directly and receive the results from them.
//!
//! Each NIC sends `S / nics` into the fabric and receives as much back, however many servers
//! take part: the fabric carries the buffer once, where a ring's latency grows with the
//! servers and a tree's with their logarithm. Inside a server a chain moves the whole buffer
//! over every GPU's link each way (its partial sums forward, the result back), Direct
//! `(g-1)/g` of it. The switch's reduction is not a point-to-point message, so both are timed
//! in closed form in every fidelity (as NVLS is, `nvls`): the slower of the two
//! stages on the links' nominal rates, pipelined, plus NCCL's latency (`src/graph/tuning.cc`,
//! NCCL 2.18: no base latency; per hop inside the server 2.8 us for Chain, 3.7 us for Direct's
//! one hop plus 0.4 us per peer, twice; 30 us (Chain) or 31 us (Direct) for the network, plus
//! the transport's message overhead twice, flushed as Simple is). NCCL derates Direct by 0.85
//! on Hopper; parasim keeps that. NCCL's own bandwidth for CollNet comes from its graph
//! search; parasim uses the links' rates instead, so the tuner and the timing agree.
//!
//! The closed form is the tuner's own model ([`collnet_model`]); CollNet runs only where
//! [`shape`] finds its shape, and is refused elsewhere.

use units::Bytes;

use crate::graph::{CollectiveAlgorithm, RankId};
use crate::nccl::network::NcclNetwork;
use crate::nccl::tuner::collnet_model;
use crate::schedule::{CollectiveError, members_by_server};

/// The servers and members per server of `group` if `algorithm` (CollNet Direct or Chain)
/// can run on it: switches that reduce, at least two servers, the same number of members on
/// each, and for Direct an NVSwitch inside the servers.
pub fn shape(
    algorithm: CollectiveAlgorithm,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<Option<(u32, u32)>, CollectiveError> {
    let fits_kind = match algorithm {
        CollectiveAlgorithm::CollNetDirect => network.nvls(),
        CollectiveAlgorithm::CollNetChain => true,
        _ => false,
    };
    if !fits_kind || !network.sharp() {
        return Ok(None);
    }
    let servers = members_by_server(group, &|rank| network.node_of(rank))?;
    let g = servers[0].1.len();
    if servers.len() < 2 || servers.iter().any(|(_, members)| members.len() != g) {
        return Ok(None);
    }
    Ok(Some((servers.len() as u32, g as u32)))
}

/// The seconds of a CollNet allreduce of `bytes` over `group`, latency included
/// (`timing::in_network_time` makes it a duration).
pub fn seconds(
    algorithm: CollectiveAlgorithm,
    bytes: Bytes,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<f64, CollectiveError> {
    let unsupported = || CollectiveError::Unsupported { algorithm: algorithm.name(), kind: UNSUPPORTED };
    let (_, g) = shape(algorithm, group, network)?.ok_or_else(unsupported)?;
    let fabric = network.tuner_fabric().ok_or_else(unsupported)?;
    let (latency_us, algbw) = collnet_model(&fabric, algorithm, g).ok_or_else(unsupported)?;
    Ok(latency_us * 1e-6 + bytes.0 as f64 / (algbw * 1e9))
}

/// What CollNet needs, for the error of an explicit `collnet-*` choice that cannot run.
pub const UNSUPPORTED: &str = "allreduce here: CollNet needs switches that reduce (cluster.network.sharp = true), \
    at least two servers with the same number of GPUs each, and for collnet-direct an NVSwitch in each";
