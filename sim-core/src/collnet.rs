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
//! in closed form in every fidelity (as NVLS is, [`crate::nvls`]): the slower of the two
//! stages on the links' nominal rates, pipelined, plus NCCL's latency (`src/graph/tuning.cc`,
//! NCCL 2.18: no base latency; per hop inside the server 2.8 us for Chain, 3.7 us for Direct's
//! one hop plus 0.4 us per peer, twice; 30 us (Chain) or 31 us (Direct) for the network, plus
//! the transport's message overhead twice, flushed as Simple is). NCCL derates Direct by 0.85
//! on Hopper; parasim keeps that. NCCL's own bandwidth for CollNet comes from its graph
//! search; parasim uses the links' rates instead, so the tuner and the timing agree.

use units::Bytes;

use crate::collective::{CollectiveError, StepNetwork, members_by_server};
use crate::graph::{CollectiveAlgorithm, RankId};
use crate::tuner::{GpuGeneration, TunerFabric};

/// The servers and members per server of `group` if `algorithm` (CollNet Direct or Chain)
/// can run on it: switches that reduce, at least two servers, the same number of members on
/// each, and for Direct an NVSwitch inside the servers.
pub fn shape(
    algorithm: CollectiveAlgorithm,
    group: &[RankId],
    network: &impl StepNetwork,
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

/// NCCL's latency (us) and the algorithm bandwidth (GB/s) of a CollNet allreduce with `g`
/// GPUs per server on `fabric` (its NICs at `fabric.nic`); `None` for other algorithms.
pub fn model(fabric: &TunerFabric, algorithm: CollectiveAlgorithm, g: u32) -> Option<(f64, f64)> {
    let direct = match algorithm {
        CollectiveAlgorithm::CollNetDirect => true,
        CollectiveAlgorithm::CollNetChain => false,
        _ => return None,
    };
    let g_f = f64::from(g.max(1));
    let nics = f64::from(fabric.nics_per_node.clamp(1, g.max(1)));
    // Seconds per byte of buffer, each stage; bandwidths in GB/s.
    let network = 1.0 / (nics * fabric.nic);
    let inside = if g <= 1 {
        0.0
    } else if direct {
        (g_f - 1.0) / g_f / fabric.intra
    } else {
        1.0 / fabric.intra
    };
    let mut algbw = 1.0 / network.max(inside);
    if direct && matches!(fabric.generation, GpuGeneration::Hopper | GpuGeneration::Blackwell) {
        algbw *= 0.85;
    }
    let overhead = 2.0 * fabric.net_latency_us;
    let peers = g_f - 1.0;
    let latency = if direct {
        2.0 * (peers.min(1.0) * 3.7 + peers * 0.4) + 31.0 + overhead
    } else {
        2.0 * peers * 2.8 + 30.0 + overhead
    };
    Some((latency, algbw))
}

/// The seconds of a CollNet allreduce of `bytes` over `group`, latency included
/// ([`crate::collective::in_network_time`] makes it a duration).
pub fn seconds(
    algorithm: CollectiveAlgorithm,
    bytes: Bytes,
    group: &[RankId],
    network: &impl StepNetwork,
) -> Result<f64, CollectiveError> {
    let unsupported = || CollectiveError::Unsupported { algorithm: algorithm.name(), kind: UNSUPPORTED };
    let (_, g) = shape(algorithm, group, network)?.ok_or_else(unsupported)?;
    let fabric = network.tuner_fabric().ok_or_else(unsupported)?;
    let (latency_us, algbw) = model(&fabric, algorithm, g).ok_or_else(unsupported)?;
    Ok(latency_us * 1e-6 + bytes.0 as f64 / (algbw * 1e9))
}

/// What CollNet needs, for the error of an explicit `collnet-*` choice that cannot run.
pub const UNSUPPORTED: &str = "allreduce here: CollNet needs switches that reduce (cluster.network.sharp = true), \
    at least two servers with the same number of GPUs each, and for collnet-direct an NVSwitch in each";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuner::dgx_a100;

    #[test]
    fn each_nic_carries_its_share_once_whatever_the_servers() {
        // DGX A100: 8 NICs of 25 GB/s carry the buffer at 200 GB/s; a chain moves it over
        // 240 GB/s of NVLink, Direct 7/8 of it: the NICs set both paces.
        let fabric = dgx_a100();
        let (chain_latency, chain) = model(&fabric, CollectiveAlgorithm::CollNetChain, 8).unwrap();
        let (direct_latency, direct) = model(&fabric, CollectiveAlgorithm::CollNetDirect, 8).unwrap();
        assert!((chain - 200.0).abs() < 1e-9 && (direct - 200.0).abs() < 1e-9, "{chain} {direct}");
        // NCCL's latencies: 2 x 7 x 2.8 + 30, and 2 x (3.7 + 7 x 0.4) + 31.
        assert!((chain_latency - 69.2).abs() < 1e-9, "{chain_latency}");
        assert!((direct_latency - 44.0).abs() < 1e-9, "{direct_latency}");
        // NVLink slower than the NICs: the chain's whole buffer over it, Direct's 7/8.
        let slow = TunerFabric { intra: 100.0, ..fabric };
        assert!((model(&slow, CollectiveAlgorithm::CollNetChain, 8).unwrap().1 - 100.0).abs() < 1e-9);
        let direct = model(&slow, CollectiveAlgorithm::CollNetDirect, 8).unwrap().1;
        assert!((direct - 800.0 / 7.0).abs() < 1e-9, "{direct}");
        assert!(model(&fabric, CollectiveAlgorithm::Ring, 8).is_none());
    }
}
