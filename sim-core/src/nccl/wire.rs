//! What a collective puts on the links under a resolved [`Choice`]: its wire bytes (the
//! protocol's share of the links, or NCCL's model's slowdown for an allreduce), the chunks
//! its pipeline cuts them into, the least time a step of NCCL's tree takes, and the
//! [`Schedule`] all of that makes.
//!
//! The flow models play this schedule message by message or in its steady state; the
//! analytical model times it step by step. Invariants: with protocols off a collective's wire
//! bytes are its bytes and its chunk the network's chunk setting, so the bare schedule is
//! timed; a Simple pipeline carries as many chunks as its data (not its wire bytes) fills.

use units::{Bytes, SimDuration};

use crate::collective::single_server;
use crate::graph::{CollectiveAlgorithm, CollectiveKind, RankId};
use crate::nccl::network::{NcclNetwork, nccl_table};
use crate::nccl::protocol::{Choice, Family, Protocol, family};
use crate::nccl::tuner;
use crate::schedule::{CollectiveError, Schedule, members_by_server};

/// The bytes a collective of `bytes` puts on the wire under `choice`'s protocol: for an
/// allreduce on a cluster NCCL's tuner knows, its model's slowdown over the bare links (the
/// protocol's share and the per-channel limits, [`tuner::allreduce_slowdown`]);
/// otherwise the protocol's own share ([`Protocol::wire_ratio`]).
pub fn wire_bytes(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<Bytes, CollectiveError> {
    let Some(protocol) = choice.protocol else { return Ok(bytes) };
    if kind == CollectiveKind::AllReduce
        && let Some(fabric) = network.tuner_fabric()
    {
        let nodes = members_by_server(group, &|rank| network.node_of(rank))?.len() as u32;
        if let Some(slowdown) =
            tuner::allreduce_slowdown(&fabric, choice.algorithm, protocol, group.len() as u32, nodes, bytes.0)
        {
            return Ok(Bytes((bytes.0 as f64 * slowdown).round().min(u64::MAX as f64) as u64));
        }
    }
    let (num, den) =
        protocol.wire_ratio(nccl_table(network), family(choice.algorithm), single_server(group, network)?);
    Ok(Bytes((u128::from(bytes.0) * u128::from(num) / u128::from(den)).min(u128::from(u64::MAX)) as u64))
}

/// The chunk size of `choice`'s pipeline: with a protocol, NCCL's tree chunks (its step
/// size, `buffSize / NCCL_STEPS`: with Simple the `NCCL_BUFFSIZE` of the run over 8, 512 KiB
/// by default, halved for small per-channel sizes up to NCCL 2.19
/// ([`crate::nccl::tables::NcclTable::tree_simple_chunk_shrinks`]) and never shrunk from NCCL 2.20 on; 32 KiB of data with LL, 576,000
/// bytes with LL128, halved for LL128 while a channel has too few chunks to fill the
/// pipeline, as `calcCollChunking` in `enqueue.cc` does); otherwise the network's chunk
/// setting.
pub fn chunk_for(
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<Bytes, CollectiveError> {
    let (Some(protocol), CollectiveAlgorithm::Tree) = (choice.protocol, choice.algorithm) else {
        return Ok(network.chunk());
    };
    Ok(Bytes(match protocol {
        Protocol::Simple => {
            let step = network.nccl().simple_step();
            if !nccl_table(network).tree_simple_chunk_shrinks {
                step
            } else {
                // NCCL 2.11-2.19's `computeColl`: halve while a channel has too few chunks for
                // the tree's depth.
                let (nodes, channels) = nodes_and_channels(group, network)?;
                let depth = (group.len() as u64 / nodes).saturating_sub(1) + u64::from(nodes.ilog2());
                let per_channel = |chunk: u64| bytes.0 / (channels * chunk);
                let mut chunk = step;
                for (times, floor) in [(8, 131_072), (4, 65_536), (1, 32_768)] {
                    while per_channel(chunk) < depth * times && chunk > floor {
                        chunk /= 2;
                    }
                }
                chunk
            }
        }
        Protocol::Ll => LL_STEP_DATA,
        Protocol::Ll128 => {
            let (nodes, channels) = nodes_and_channels(group, network)?;
            let ppn = group.len() as f64 / nodes as f64;
            let steps = 1.0 + nodes.ilog2() as f64 + 0.1 * ppn;
            let mut chunk: u64 = 576_000;
            let per_channel = |chunk: u64| (bytes.0 / (channels * chunk)) as f64;
            while per_channel(chunk) < steps * 64.0 / ppn && chunk > 131_072 {
                chunk /= 2;
            }
            while per_channel(chunk) < steps * 16.0 / ppn && chunk > 32_768 {
                chunk /= 2;
            }
            chunk
        }
    }))
}

/// The servers `group` spans and the channels NCCL's chunking counts for it: one per GPU of
/// its smallest server (at least one each).
fn nodes_and_channels(group: &[RankId], network: &impl NcclNetwork) -> Result<(u64, u64), CollectiveError> {
    let servers = members_by_server(group, &|rank| network.node_of(rank))?;
    let channels = servers.iter().map(|(_, m)| m.len() as u64).min().unwrap_or(1).max(1);
    Ok((servers.len().max(1) as u64, channels))
}

/// The data of one LL step: `DEFAULT_LL_BUFFSIZE` (`NCCL_LL_LINES_PER_THREAD` x
/// `NCCL_LL_MAX_NTHREADS` x `NCCL_STEPS` x 16-byte lines) over `NCCL_STEPS`, half of each line
/// being flags.
pub(super) const LL_STEP_DATA: u64 = 32 << 10;

/// The schedule a collective of `bytes` runs under `choice` (not an in-network algorithm): its
/// wire bytes ([`wire_bytes`]) in the chunks of [`chunk_for`].
pub(super) fn schedule_of(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<Schedule, CollectiveError> {
    let wire = wire_bytes(kind, choice, bytes, group, network)?;
    let chunk = pipeline_chunk(choice, bytes, wire, group, network)?;
    let schedule =
        Schedule::with_chunk(kind, choice.algorithm, wire, group, |rank| network.node_of(rank), chunk)?;
    let floor = tree_step_floor(kind, choice, bytes, &schedule, group, network)?;
    Ok(schedule.with_step_floor(floor))
}

/// The chunk a schedule of `choice` cuts its wire bytes `wire` (for a collective of `bytes`)
/// into: [`chunk_for`]'s, and with the Simple protocol the same chunk of data counted in wire
/// bytes ([`wire_chunk`]). NCCL cuts the data into chunks, and Simple moves each one whole from
/// hop to hop (see [`tree_step_floor`]), so a Simple tree carries as many chunks as its data
/// fills, whatever its share of the links: counted in wire bytes, 16 MiB over 16 channels of
/// 1 MiB chunks made two chunks per channel instead of NCCL's one. LL and LL128 forward each
/// line as it arrives, so their chunks set no store-and-forward pipeline, and the schedule
/// keeps counting them in wire bytes, as before.
pub fn pipeline_chunk(
    choice: Choice,
    bytes: Bytes,
    wire: Bytes,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<Bytes, CollectiveError> {
    let chunk = chunk_for(choice, bytes, group, network)?;
    Ok(if choice.protocol == Some(Protocol::Simple) { wire_chunk(chunk, bytes, wire) } else { chunk })
}

/// A pipeline's chunk of data `chunk` in the wire bytes `wire` a collective of `bytes` puts on
/// the links ([`wire_bytes`]), rounded up so that a buffer of n chunks stays n chunks.
pub fn wire_chunk(chunk: Bytes, bytes: Bytes, wire: Bytes) -> Bytes {
    if bytes.0 == 0 || wire == bytes {
        return chunk;
    }
    let scaled = (u128::from(chunk.0) * u128::from(wire.0)).div_ceil(u128::from(bytes.0));
    Bytes(scaled.clamp(1, u128::from(u64::MAX)) as u64)
}

/// The least time a step of NCCL's tree takes under `choice` with the Simple protocol: one
/// channel's chunk at a tree channel's own rate ([`tuner::tree_channel_rate`]).
/// Every channel is a CUDA block that receives, reduces and sends each chunk on every hop, and
/// with Simple a hop's receiver sees a step only once all of it is written (the sender posts
/// the step's tail after the whole slice, `prims_simple.h`; a tree's slice is its chunk,
/// `ProtoSimple<1, 1>`), so a chunk crosses its hops one after the other, each no faster than
/// its channel moves data, however fast the hop's links are: on NVLink, where the links alone
/// would take a few microseconds, this is what a tree's pipeline fill costs. A channel carries
/// its share of the channels NCCL launches for the size ([`tuner::launch_channels`]:
/// one per 32 KiB with Simple), the schedule's lanes still spreading the links' loads. LL and
/// LL128 flag every 16- or 128-byte line, so the next hop forwards a chunk's first lines while
/// the rest arrives: no floor there. Zero for other schedules, without a protocol, and where
/// NCCL's tuner does not know the cluster.
pub fn tree_step_floor(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    schedule: &Schedule,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<SimDuration, CollectiveError> {
    let (Some(protocol), Some(fabric)) = (choice.protocol, network.tuner_fabric()) else {
        return Ok(SimDuration::ZERO);
    };
    if choice.algorithm != CollectiveAlgorithm::Tree
        || kind != CollectiveKind::AllReduce
        || protocol != Protocol::Simple
        || group.len() <= 1
    {
        return Ok(SimDuration::ZERO);
    }
    let Some(rate) = tuner::tree_channel_rate(&fabric) else {
        return Ok(SimDuration::ZERO);
    };
    let nodes = members_by_server(group, &|rank| network.node_of(rank))?.len() as u32;
    let lanes = schedule.lanes().len() as u32;
    let ranks = group.len() as u32;
    // The schedule cuts the buffer into `den` messages, `lanes` per step; NCCL's launched
    // channels carry the same chunks per channel, each `1 / (launched x chunks)` of the data.
    let (_, den) = schedule.fraction();
    let chunks = (den / u64::from(lanes.max(1))).max(1);
    let launched =
        tuner::launch_channels(&fabric, Family::Tree, protocol, ranks, nodes, bytes.0).clamp(1, lanes.max(1));
    let chunk = bytes.as_f64() / (f64::from(launched) * chunks as f64);
    Ok(SimDuration::from_secs_f64(chunk / (rate * 1e9))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::testing::{Tuned, ranks, tuned};
    use CollectiveAlgorithm as A;

    #[test]
    fn a_simple_tree_chunk_shrinks_for_small_sizes_until_nccl_2_20() {
        use crate::nccl::tables::NcclVersion;
        let group = ranks(64);
        let tree = Choice { algorithm: A::Tree, protocol: Some(Protocol::Simple) };
        let network = |release| Tuned { release, ..tuned() };
        // 8 servers of 8: depth 7 + log2(8) = 10, 8 channels. 1 MiB is 0, 1 and 2 chunks per
        // channel at 512, 128 and 64 KiB: halved to 128 KiB (< 80), 64 KiB (< 40), 32 KiB (< 10).
        let old = network(NcclVersion::V2_11);
        assert_eq!(chunk_for(tree, Bytes(1 << 20), &group, &old).unwrap(), Bytes(32 << 10));
        // 1 GiB has 256 chunks of 512 KiB per channel, past 8 x the depth: one step.
        assert_eq!(chunk_for(tree, Bytes(1 << 30), &group, &old).unwrap(), Bytes(512 << 10));
        // From 2.20 on the chunk is always the step.
        let new = network(NcclVersion::V2_27);
        assert_eq!(chunk_for(tree, Bytes(1 << 20), &group, &new).unwrap(), Bytes(512 << 10));
    }

    #[test]
    fn a_simple_pipelines_chunks_count_data_not_wire_bytes() {
        // A chunk of data in wire bytes four times the data is four times as many wire bytes,
        // so a buffer of n chunks stays n chunks.
        assert_eq!(wire_chunk(Bytes(32 << 10), Bytes(1 << 20), Bytes(4 << 20)), Bytes(128 << 10));
        assert_eq!(wire_chunk(Bytes(1 << 20), Bytes(3), Bytes(4)), Bytes(1_398_102));
        assert_eq!(wire_chunk(Bytes(1 << 20), Bytes(0), Bytes(0)), Bytes(1 << 20));
        assert_eq!(wire_chunk(Bytes(1 << 20), Bytes(7), Bytes(7)), Bytes(1 << 20));
    }
}
