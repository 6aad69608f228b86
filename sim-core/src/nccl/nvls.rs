//! NVLink SHARP (NVLS): allreduce with the reduction in the NVSwitch.
//!
//! On NVSwitch 3 systems (Hopper and later) NCCL's NVLS algorithm has every GPU load its
//! share of the buffer through the switch with a reducing multimem load (the switch reads
//! that share from every GPU and returns the sum) and store the result with a multicast (the
//! switch writes it to every GPU). Each GPU's link then carries `(g+1)/g` of the buffer each
//! way instead of a ring's `2(g-1)/g`. NVLS-tree runs this inside every server and a double
//! binary tree across servers on each GPU's share (`1/g` of the buffer over its own NIC; twice
//! that on trees of more than two servers, whose inner servers receive from two children),
//! the two pipelined: the slower stage sets the pace.
//!
//! The switch's reduction is not a point-to-point message, so these algorithms are timed in
//! closed form in every fidelity (on the links' nominal rates, without contention from other
//! traffic). Rates and latencies are NCCL's (`src/graph/tuning.cc`): NVLS reaches 0.85 of the
//! NVLink rate on Hopper (`nvlsEfficiency`, 0.74 on Blackwell); NVLS costs 25 us of latency
//! over NVLink; every tree level across servers costs NVLS-tree's 20.9 us network latency
//! (each way), plus the transport's message overhead, twice (Simple protocol, flushed).
//!
//! An NVLS algorithm runs only where [`shape`] finds its shape (NVSwitches that reduce, Hopper
//! or later, the same number of members on every server); anywhere else it is refused, never
//! approximated.

use units::Bytes;

use crate::graph::{CollectiveAlgorithm, RankId};
use crate::nccl::network::NcclNetwork;
use crate::nccl::tuner::GpuGeneration;
use crate::schedule::{CollectiveError, members_by_server};

/// The servers and members per server of `group` if NVLS can run on it: every server holds
/// the same number (at least 2) of its members, on NVSwitches that reduce.
pub fn shape(
    algorithm: CollectiveAlgorithm,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<Option<(u32, u32)>, CollectiveError> {
    let Some(fabric) = network.tuner_fabric() else { return Ok(None) };
    if !network.nvls() || matches!(fabric.generation, GpuGeneration::Volta | GpuGeneration::Ampere) {
        return Ok(None);
    }
    let servers = members_by_server(group, &|rank| network.node_of(rank))?;
    let g = servers[0].1.len();
    if g < 2 || servers.iter().any(|(_, members)| members.len() != g) {
        return Ok(None);
    }
    let n = servers.len() as u32;
    let fits = match algorithm {
        CollectiveAlgorithm::Nvls => n == 1,
        CollectiveAlgorithm::NvlsTree => n > 1,
        _ => false,
    };
    Ok(fits.then_some((n, g as u32)))
}

/// The seconds of an NVLS or NVLS-tree allreduce of `bytes` over `group`, latency included
/// (`timing::in_network_time` makes it a duration).
pub fn seconds(
    algorithm: CollectiveAlgorithm,
    bytes: Bytes,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<f64, CollectiveError> {
    let unsupported =
        || CollectiveError::Unsupported { algorithm: algorithm.name(), kind: "allreduce on this cluster" };
    let (n, g) = shape(algorithm, group, network)?.ok_or_else(unsupported)?;
    let fabric = network.tuner_fabric().ok_or_else(unsupported)?;
    let efficiency = if fabric.generation == GpuGeneration::Blackwell { 0.74 } else { 0.85 };
    let size = bytes.0 as f64;
    let g_f = f64::from(g);
    // Seconds: bandwidths are in GB/s.
    let intra = size * (g_f + 1.0) / g_f / (fabric.intra * efficiency * 1e9);
    let inter = if n > 1 {
        let per_nic = size / g_f * if n > 2 { 2.0 } else { 1.0 };
        per_nic / (fabric.nic * 1e9)
    } else {
        0.0
    };
    let net = 20.9e-6 + 2.0 * fabric.net_latency_us * 1e-6;
    let latency = 25e-6 + 2.0 * f64::from(n.ilog2()) * net;
    Ok(intra.max(inter) + latency)
}
