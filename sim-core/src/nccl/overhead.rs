//! What a collective costs beyond moving its data under a resolved [`Choice`]: with protocols
//! off, the collective launch; with a protocol, its base latency, how much its per-hop
//! latencies exceed the paths' own, the channels NCCL launches beyond the first, an LL
//! chunk's wait for host memory at the network hops, the copy a ring makes inside one NVLink
//! server, and NCCL's "plateau" factor for rings across servers.
//!
//! The flow models add this to the data movement they simulate, the analytical model to the
//! schedule's time. Invariants: it is never negative and depends only on the collective, the
//! choice and the network model's settings (not on other traffic); in-network algorithms
//! (NVLS, CollNet), whose latencies are part of their closed forms, cost nothing here.

use units::{Bytes, SimDuration, UnitError};

use crate::collective::{LevelLatencies, single_server};
use crate::graph::{CollectiveAlgorithm, CollectiveKind, RankId};
use crate::nccl::network::{NcclNetwork, nccl_table};
use crate::nccl::protocol::{Choice, Family, Hop, Protocol, family, is_in_network};
use crate::nccl::tuner::{self, TunerFabric};
use crate::nccl::wire::{LL_STEP_DATA, schedule_of};
use crate::schedule::{CollectiveError, Schedule, members_by_server};

/// The fixed cost and the per-step protocol latencies of a collective under `choice`, beyond
/// what the links' own latencies and bandwidths account for: with protocols off, the
/// collective launch; with a protocol, its base latency plus, for every step, how much its
/// per-hop latency (and the transport's message overhead, on network hops) exceeds the path
/// latency of the step's messages. The flow models add this to the data movement they
/// simulate.
pub fn protocol_overhead(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &mut impl NcclNetwork,
) -> Result<SimDuration, CollectiveError> {
    protocol_overhead_with(kind, choice, bytes, group, None, network)
}

/// [`protocol_overhead`], with the collective's schedule ([`schedule_of`]) if the caller has
/// it.
pub(super) fn protocol_overhead_with(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    schedule: Option<&Schedule>,
    network: &mut impl NcclNetwork,
) -> Result<SimDuration, CollectiveError> {
    let launch = network.collective_launch();
    let Some(protocol) = choice.protocol else { return Ok(launch) };
    if group.len() <= 1 || is_in_network(choice.algorithm) {
        // NVLS's and CollNet's latencies are part of their closed forms (NCCL's base latency
        // for them is zero).
        return Ok(SimDuration::ZERO);
    }
    let family = family(choice.algorithm);
    let built;
    let schedule = match schedule {
        Some(schedule) => schedule,
        None => {
            built = schedule_of(kind, choice, bytes, group, network)?;
            &built
        }
    };
    let table = nccl_table(network);
    let mut total = protocol.base_latency(table, family, launch);
    let mut messages = Vec::new();
    let identical = schedule.steps_are_identical();
    let weights = schedule.step_weights();
    let mut per_step = Vec::with_capacity(weights.len());
    let multi_server = !single_server(group, network)?;
    if let Some(pipeline) = schedule.pipeline() {
        // A pipeline pays its hops' protocol latencies once, on its first chunk's way.
        for level in network.level_latencies(&pipeline)? {
            per_step.push((level_extra(protocol, family, multi_server, level, network), 1));
        }
    } else if choice.algorithm == CollectiveAlgorithm::Direct {
        // NCCL's all-to-all posts one send and one receive per peer, one after another: after
        // the first, every further peer costs its hop's protocol latency (the mean over the
        // peers, the transport's overhead included on network hops).
        let peers = group.len() as u64 - 1;
        for &(step, repeat) in &weights {
            messages.clear();
            schedule.step_messages(step, &mut messages);
            let first = step_extra(protocol, family, multi_server, false, &messages, network)?;
            let mut sum = 0u128;
            for &(src, dst, _) in &messages {
                let across = network.node_of(src)? != network.node_of(dst)?;
                let hop = if across { Hop::Net } else { network.intra_hop() };
                let mut cost = protocol.hop_latency(table, Family::Ring, hop, multi_server);
                if across {
                    cost = cost.saturating_add(network.message_overhead());
                }
                sum += u128::from(cost.as_ps());
            }
            let mean = (sum / messages.len().max(1) as u128) as u64;
            let rest = SimDuration::from_ps(mean.saturating_mul(peers.saturating_sub(1)));
            per_step.push((first.saturating_add(rest), repeat));
        }
    } else {
        for &(step, repeat) in &weights {
            messages.clear();
            schedule.step_messages(step, &mut messages);
            per_step
                .push((step_extra(protocol, family, multi_server, identical, &messages, network)?, repeat));
        }
    }
    let overflow = |_| {
        CollectiveError::Time(UnitError::OutOfRange {
            input: format!("{} of {bytes}", kind.name()),
            quantity: "protocol latency",
            reason: "longer than the largest representable duration",
        })
    };
    for &(extra, repeat) in &per_step {
        total = total.checked_add(extra.checked_mul(repeat).map_err(overflow)?).map_err(overflow)?;
    }
    total = total.checked_add(channel_time(kind, choice, bytes, group, network)?).map_err(overflow)?;
    total = total.checked_add(ring_copy_time(kind, choice, bytes, group, network)?).map_err(overflow)?;
    total = total.checked_add(ll_host_time(kind, choice, bytes, group, network)?).map_err(overflow)?;
    if family == Family::Ring
        && multi_server
        && kind == CollectiveKind::AllReduce
        && protocol == Protocol::Simple
    {
        // NCCL's "plateau effect" of pipelined rings across servers: the release's factor
        // (1.4 on Ampere and later in 2.2x, 1.9 in 2.11) on the latency once the buffer is
        // large enough (`tuner::ring_plateau`).
        let channels = schedule.lanes().len() as u64;
        let generation = network.tuner_fabric().map_or(tuner::GpuGeneration::default(), |f| f.generation);
        let factor = tuner::ring_plateau(table, generation, bytes.0, channels, group.len() as u32);
        if factor != 1.0 {
            let base = protocol.base_latency(table, family, launch);
            let latency = total.saturating_sub(base);
            // The factor in whole tenths, reduced (1.4 = 7/5, 1.9 = 19/10), in integer picoseconds.
            let tenths = (factor * 10.0).round() as u64;
            let common = gcd(tenths, 10);
            let (num, den) = (tenths / common, 10 / common);
            total = base.checked_add(SimDuration::from_ps(latency.as_ps() / den * num)).map_err(overflow)?;
        }
    }
    Ok(total)
}

/// An allreduce as NCCL launches it: a ring or a tree under a protocol, on a cluster NCCL's
/// tuner knows, over more than one rank.
struct NcclLaunch {
    /// The cluster as the tuner sees it.
    fabric: TunerFabric,
    /// Ring or tree.
    family: Family,
    /// Servers the group spans.
    nodes: u32,
    /// Channels NCCL launches for the size ([`tuner::launch_channels`]).
    channels: u32,
}

impl NcclLaunch {
    /// The launch of `kind` under `choice` for `bytes` over `group`; `None` for other kinds,
    /// algorithms, no protocol, one rank, or a cluster the tuner does not know.
    fn of(
        kind: CollectiveKind,
        choice: Choice,
        bytes: Bytes,
        group: &[RankId],
        network: &impl NcclNetwork,
    ) -> Result<Option<NcclLaunch>, CollectiveError> {
        let (Some(protocol), Some(fabric)) = (choice.protocol, network.tuner_fabric()) else {
            return Ok(None);
        };
        let ring_or_tree = matches!(choice.algorithm, CollectiveAlgorithm::Ring | CollectiveAlgorithm::Tree);
        if kind != CollectiveKind::AllReduce || !ring_or_tree || group.len() <= 1 {
            return Ok(None);
        }
        let nodes = members_by_server(group, &|rank| network.node_of(rank))?.len() as u32;
        let family = family(choice.algorithm);
        let channels = tuner::launch_channels(&fabric, family, protocol, group.len() as u32, nodes, bytes.0);
        Ok(Some(NcclLaunch { fabric, family, nodes, channels }))
    }
}

/// What the channels of an allreduce under `choice` cost: the network's per-channel overhead
/// times the channels NCCL launches for its size ([`tuner::launch_channels`]: fewer
/// for smaller buffers, `enqueue.cc`) beyond the first. NCCL passes the first channel's work
/// element to the kernel as its argument and frees it at once (`ncclKernel` in
/// `src/collectives/device/common.h` and `setupLaunch` in `src/enqueue.cc`, v2.11.4-1: "To
/// optimize for latency, (only) the first operation is passed as argument"); every further
/// channel's block reads its 512-byte `ncclWork` from the work FIFO in host-mapped memory and
/// writes its `active` flag back. Zero without a protocol, for other kinds, for NVLS (timed in
/// closed form) and where NCCL's tuner does not know the cluster.
pub fn channel_time(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<SimDuration, CollectiveError> {
    let per_channel = network.channel_overhead();
    if per_channel == SimDuration::ZERO {
        return Ok(SimDuration::ZERO);
    }
    let Some(launch) = NcclLaunch::of(kind, choice, bytes, group, network)? else {
        return Ok(SimDuration::ZERO);
    };
    let beyond_first = launch.channels.saturating_sub(1);
    Ok(per_channel.checked_mul(u64::from(beyond_first)).map_err(|_| UnitError::OutOfRange {
        input: format!("{beyond_first} channels of {per_channel}"),
        quantity: "channel overhead",
        reason: "longer than the largest representable duration",
    })?)
}

/// What an LL allreduce across servers waits at its network hops for its first chunk to reach
/// the network through host memory: NCCL's network transport keeps LL's send buffer in host
/// memory (`netSendSetup` in `src/transport/net.cc`, v2.11.4-1: `protoLoc[p] = p !=
/// NCCL_PROTO_LL && useGdr ? LOC_DEVMEM : LOC_HOSTMEM`), and its proxy posts an LL step only
/// once every line of it carries its flags there (the `NCCL_PROTO_LL` loop of
/// `netSendProxy`), so a chunk crosses each network hop whole, where LL128 and Simple
/// (GPUDirect RDMA from device memory) and LL over NVLink forward it as it arrives. Each of
/// the network hops on the first chunk's path (a tree's `2 floor(log2 n)`, a ring's
/// `2 (n - 1)` over `n` servers) costs one channel's chunk at the network's
/// [`NcclNetwork::ll_host_rate`]; later chunks follow in the pipeline.
///
/// The chunk is NCCL's: the tree's `divUp(S, c m) m` and the ring's `divUp(S, c p m) m` over
/// the `c` channels NCCL launches ([`tuner::launch_channels`]), with `m` = 8 bytes per
/// thread (`minChunkSize` in `runTreeSplit` and `runRing`, `src/collectives/device/all_reduce.h`),
/// at most one LL step (32 KiB of data); on one channel `getAlgoInfo` (`src/enqueue.cc`) halves
/// the threads while the buffer is under threads x threshold, so 1 KiB over a tree is one
/// chunk of 1 KiB on 128 threads. Zero without a rate, inside one server, for other protocols,
/// kinds and algorithms, and where NCCL's tuner does not know the cluster.
pub fn ll_host_time(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<SimDuration, CollectiveError> {
    let (Some(rate), Some(Protocol::Ll)) = (network.ll_host_rate(), choice.protocol) else {
        return Ok(SimDuration::ZERO);
    };
    let Some(NcclLaunch { fabric, family, nodes, channels, .. }) =
        NcclLaunch::of(kind, choice, bytes, group, network)?
    else {
        return Ok(SimDuration::ZERO);
    };
    if nodes <= 1 {
        return Ok(SimDuration::ZERO);
    }
    let ranks = group.len() as u32;
    let channels = u64::from(channels.max(1));
    let threshold = tuner::thread_threshold(family, Protocol::Ll, ranks);
    let mut threads = u64::from(tuner::max_threads(&fabric, family, Protocol::Ll, ranks, nodes));
    if channels == 1 {
        // `getAlgoInfo`: `else if ((nt % 128) == 0) nt/=2;` once one channel is left.
        while bytes.0 < threads * threshold && threads % 128 == 0 {
            threads /= 2;
        }
    }
    let grain = threads * 8;
    let (per_channel, hops) = match family {
        Family::Tree => (bytes.0.div_ceil(channels * grain) * grain, 2 * u64::from(nodes.ilog2())),
        Family::Ring => {
            (bytes.0.div_ceil(channels * u64::from(ranks) * grain) * grain, 2 * (u64::from(nodes) - 1))
        }
    };
    let chunk = per_channel.min(LL_STEP_DATA);
    Ok(rate.time_to_send(Bytes(chunk.saturating_mul(hops)))?)
}

/// The copy a ring allreduce inside one NVLink server makes in each GPU's own memory, moving
/// nothing across a link: `2 S / p` bytes of memory traffic per GPU (a buffer of `S` over `p`
/// ranks) at the device's copy rate ([`NcclNetwork::device_copy`]), added to the collective.
///
/// NCCL's ring allreduce (`runRing` in `src/collectives/device/all_reduce.h`, v2.11.4-1 and
/// v2.27.3-1) takes `2p - 1` steps per loop on each channel, each moving one chunk: `send`,
/// `p - 2` `recvReduceSend`, `recvReduceCopySend`, `p - 2` `recvCopySend`, `recv`. Only
/// `2(p - 1)` of them cross a link. On Ampere over NVLink NCCL reads from its peer (P2P read:
/// `ncclTopoCheckP2p` in `src/graph/paths.cc`; `p2pSendConnect` in `src/transport/p2p.cc` puts
/// the Simple buffer on the sender), so the first step copies the input into the sender's own
/// buffer; elsewhere (P2P write, and LL and LL128 everywhere) the last step copies the
/// receiver's own buffer to the output. Every channel runs the same steps in lockstep, so
/// while they make that copy no link carries anything: one chunk in `p` per channel, `S / p`
/// per GPU, read and written at the device's copy rate `C`. A ring of bus bandwidth `B` then
/// reaches `1 / (1 / B + 1 / ((p - 1) C))`: on one A100 server (NCCL's 235 GB/s; copies at
/// 0.921 x 1555 GB/s) 202 GB/s over 2 GPUs, 223 over 4 and 230 over 8, where Azure's servers
/// measured 206, 225 and 231 GB/s at 1 GiB (docs/collectives.md, "Rings inside a server").
///
/// Simple and LL128 only: their steps move data at the links' pace, so the copy stands out;
/// LL's steps are bound by its flag checks, slower than memory, and NCCL's LL bandwidth
/// already is what its rings reach. Not for rings across servers: their steps wait on the
/// network, which NCCL's proxy feeds while the kernel copies. NCCL 2.11 with one process
/// driving every GPU over P2P write (not Ampere) writes straight into the peer's output
/// (`NCCL_DIRECT_WRITE`) and skips the copy; that case is not told apart. Zero for other
/// kinds, algorithms and networks that do not know the device.
pub fn ring_copy_time(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<SimDuration, CollectiveError> {
    let (Some(protocol), Some(rate)) = (choice.protocol, network.device_copy()) else {
        return Ok(SimDuration::ZERO);
    };
    if kind != CollectiveKind::AllReduce
        || choice.algorithm != CollectiveAlgorithm::Ring
        || protocol == Protocol::Ll
        || group.len() <= 1
        || network.intra_hop() != Hop::NvLink
        || !single_server(group, network)?
    {
        return Ok(SimDuration::ZERO);
    }
    // 2 S / p bytes through device memory: S / p read and written once.
    let traffic = Bytes(bytes.0.saturating_mul(2));
    Ok(rate.time_to_send_share(traffic, group.len() as u64)?)
}

/// How much `protocol`'s per-hop latency on the slowest hop of a step exceeds the hop's path
/// latency (plus the transport overhead on network hops). In a pipelined ring (`lapping`:
/// every step alike) a chunk crosses every edge in turn, so a step costs the edges' mean, not
/// their maximum: a ring across servers pays the network's latency on its `2(n-1)` hops
/// between servers, not on all `2(p-1)`, as NCCL's model has it.
pub(crate) fn step_extra(
    protocol: Protocol,
    family: Family,
    multi_server: bool,
    lapping: bool,
    messages: &[(RankId, RankId, u64)],
    network: &mut impl NcclNetwork,
) -> Result<SimDuration, CollectiveError> {
    let mut extra = SimDuration::ZERO;
    let mut sum = 0u128;
    // A pipelined ring across servers moves every step's data over its network hops at the
    // NICs' rate, far below NVLink's: its in-server hops finish their share (latency included)
    // while the network hops of the same step are still sending, so only the network hops'
    // latencies lengthen the ring.
    let hidden_inside = lapping && family == Family::Ring && multi_server;
    for &(src, dst, _) in messages {
        let across = network.node_of(src)? != network.node_of(dst)?;
        let this =
            hop_extra(protocol, family, multi_server, across, network.path_latency(src, dst)?, network);
        extra = extra.max(this);
        if across || !hidden_inside {
            sum += u128::from(this.as_ps());
        }
    }
    if lapping && family == Family::Ring && !messages.is_empty() {
        return Ok(SimDuration::from_ps((sum / messages.len() as u128) as u64));
    }
    Ok(extra)
}

/// [`step_extra`] of a pipeline's level, not lapping: a hop's extra only shrinks as its path
/// latency grows, so the shortest path of each kind of hop (inside a server, between
/// servers) decides.
pub(crate) fn level_extra(
    protocol: Protocol,
    family: Family,
    multi_server: bool,
    level: LevelLatencies,
    network: &impl NcclNetwork,
) -> SimDuration {
    let mut extra = SimDuration::ZERO;
    for (across, latencies) in [(false, level.within), (true, level.across)] {
        if let Some((shortest, _)) = latencies {
            extra = extra.max(hop_extra(protocol, family, multi_server, across, shortest, network));
        }
    }
    extra
}

/// How much `protocol`'s per-hop latency exceeds a hop's path latency `latency` (plus the
/// transport overhead on network hops: `across` servers).
fn hop_extra(
    protocol: Protocol,
    family: Family,
    multi_server: bool,
    across: bool,
    latency: SimDuration,
    network: &impl NcclNetwork,
) -> SimDuration {
    let hop = if across { Hop::Net } else { network.intra_hop() };
    let table = nccl_table(network);
    let mut floor = protocol.hop_latency(table, family, hop, multi_server);
    if family == Family::Ring && multi_server && !across {
        floor = floor.max(protocol.ring_net_overhead(table));
    }
    let extra = floor.saturating_sub(latency);
    if across { extra.saturating_add(network.message_overhead()) } else { extra }
}

/// Greatest common divisor.
fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::testing::{Tuned, Uniform, ranks, tuned, uniform};
    use CollectiveAlgorithm as A;
    use CollectiveKind as K;
    use units::Bandwidth;

    #[test]
    fn every_channel_nccl_launches_costs_the_channel_overhead() {
        let mut network = Tuned { per_channel: SimDuration::from_ns(1_200), ..tuned() };
        let ring_ll = Choice { algorithm: A::Ring, protocol: Some(Protocol::Ll) };
        let group = ranks(8);
        // 256 KiB over 8 ranks, ring/LL: 256 KiB / (512 threads x 64 bytes) = 8 channels, the
        // first one's work passed as the kernel's argument: 7 pay.
        let channels = channel_time(K::AllReduce, ring_ll, Bytes(256 << 10), &group, &network).unwrap();
        assert_eq!(channels, SimDuration::from_ns(7 * 1_200));
        // 32 KiB runs on one channel: nothing.
        let one = channel_time(K::AllReduce, ring_ll, Bytes(32 << 10), &group, &network).unwrap();
        assert_eq!(one, SimDuration::ZERO);
        // The protocol overhead carries it on top of the latencies it had without.
        let with = protocol_overhead(K::AllReduce, ring_ll, Bytes(256 << 10), &group, &mut network).unwrap();
        network.per_channel = SimDuration::ZERO;
        let without =
            protocol_overhead(K::AllReduce, ring_ll, Bytes(256 << 10), &group, &mut network).unwrap();
        assert_eq!(with, without.checked_add(channels).unwrap());
        // 1 GiB uses all 24 of the communicator's channels; other kinds and no protocol: none.
        network.per_channel = SimDuration::from_ns(1_200);
        let all = channel_time(K::AllReduce, ring_ll, Bytes(1 << 30), &group, &network).unwrap();
        assert_eq!(all, SimDuration::from_ns(23 * 1_200));
        let scatter = channel_time(K::ReduceScatter, ring_ll, Bytes(1 << 30), &group, &network).unwrap();
        assert_eq!(scatter, SimDuration::ZERO);
        let off = Choice { algorithm: A::Ring, protocol: None };
        assert_eq!(
            channel_time(K::AllReduce, off, Bytes(1 << 30), &group, &network).unwrap(),
            SimDuration::ZERO
        );
    }

    #[test]
    fn an_ll_chunk_crosses_each_network_hop_whole_at_the_host_rate() {
        let mut network = Tuned { ll_rate: Bandwidth::from_bytes_per_second(2_000_000_000), ..tuned() };
        let tree_ll = Choice { algorithm: A::Tree, protocol: Some(Protocol::Ll) };
        let time = |choice, bytes: u64, ranks_: u32, network: &Tuned| {
            ll_host_time(K::AllReduce, choice, Bytes(bytes), &ranks(ranks_), network).unwrap()
        };
        // 8 servers: 3 tree levels, 6 network hops. 4 KiB runs on one channel of 512 threads,
        // one 4 KiB chunk: 24 KiB at 2 GB/s.
        assert_eq!(time(tree_ll, 4 << 10, 64, &network), SimDuration::from_ps(12_288_000));
        // 1 KiB: one channel, its threads halved to 128 (1 KiB < 256 x 8), a 1 KiB chunk.
        assert_eq!(time(tree_ll, 1 << 10, 64, &network), SimDuration::from_ps(3_072_000));
        // 64 KiB over all 16 channels: still 4 KiB each; 128 KiB: 8 KiB each.
        assert_eq!(time(tree_ll, 64 << 10, 64, &network), SimDuration::from_ps(12_288_000));
        assert_eq!(time(tree_ll, 128 << 10, 64, &network), SimDuration::from_ps(24_576_000));
        // At most one LL step (32 KiB) per chunk.
        assert_eq!(time(tree_ll, 64 << 20, 64, &network), SimDuration::from_ps(6 * 16_384_000));
        // A ring over 2 servers: 2 network hops; 64 KiB over 16 ranks is one channel's 16
        // chunks of 4 KiB.
        let ring_ll = Choice { algorithm: A::Ring, protocol: Some(Protocol::Ll) };
        assert_eq!(time(ring_ll, 64 << 10, 16, &network), SimDuration::from_ps(4_096_000));
        // Nothing inside one server, for LL128, or without a rate.
        assert_eq!(time(tree_ll, 64 << 10, 8, &network), SimDuration::ZERO);
        let tree_ll128 = Choice { algorithm: A::Tree, protocol: Some(Protocol::Ll128) };
        assert_eq!(time(tree_ll128, 64 << 10, 64, &network), SimDuration::ZERO);
        // The protocol overhead carries it.
        let with =
            protocol_overhead(K::AllReduce, tree_ll, Bytes(4 << 10), &ranks(64), &mut network).unwrap();
        network.ll_rate = None;
        assert_eq!(time(tree_ll, 4 << 10, 64, &network), SimDuration::ZERO);
        let without =
            protocol_overhead(K::AllReduce, tree_ll, Bytes(4 << 10), &ranks(64), &mut network).unwrap();
        assert_eq!(with, without.checked_add(SimDuration::from_ps(12_288_000)).unwrap());
    }

    #[test]
    fn a_ring_inside_a_server_copies_one_chunk_in_p_through_device_memory() {
        // 1 TB/s of copy: a 1 GiB ring/Simple allreduce over p GPUs of one server copies S / p
        // per GPU, 2 S / p bytes through memory, on top of everything else it costs.
        let copy: Bandwidth = "1 TB/s".parse().unwrap();
        let mut network = Tuned { device_copy: Some(copy), ..tuned() };
        let simple = Choice { algorithm: A::Ring, protocol: Some(Protocol::Simple) };
        let bytes = Bytes(1 << 30);
        for p in [2u32, 4, 8] {
            let group = ranks(p);
            let expected = (2u64 << 30).div_ceil(u64::from(p)); // ps, at 1 byte per ps
            let copied = ring_copy_time(K::AllReduce, simple, bytes, &group, &network).unwrap();
            assert!(copied.as_ps().abs_diff(expected) <= 1, "{p} GPUs: {copied}");
        }
        let group = ranks(2);
        let with = protocol_overhead(K::AllReduce, simple, bytes, &group, &mut network).unwrap();
        network.device_copy = None;
        let without = protocol_overhead(K::AllReduce, simple, bytes, &group, &mut network).unwrap();
        network.device_copy = Some(copy);
        assert_eq!(with, without.checked_add(SimDuration::from_ps(1 << 30)).unwrap());
        // LL128 copies too; LL (bound by its flag checks), trees, other kinds, no protocol and
        // rings across servers do not.
        let ll128 = Choice { algorithm: A::Ring, protocol: Some(Protocol::Ll128) };
        assert!(ring_copy_time(K::AllReduce, ll128, bytes, &group, &network).unwrap() > SimDuration::ZERO);
        for choice in [
            Choice { algorithm: A::Ring, protocol: Some(Protocol::Ll) },
            Choice { algorithm: A::Tree, protocol: Some(Protocol::Simple) },
            Choice { algorithm: A::Ring, protocol: None },
        ] {
            assert_eq!(
                ring_copy_time(K::AllReduce, choice, bytes, &group, &network).unwrap(),
                SimDuration::ZERO
            );
        }
        assert_eq!(ring_copy_time(K::AllGather, simple, bytes, &group, &network).unwrap(), SimDuration::ZERO);
        network.inner.per_node = 4;
        assert_eq!(
            ring_copy_time(K::AllReduce, simple, bytes, &ranks(8), &network).unwrap(),
            SimDuration::ZERO
        );
    }

    #[test]
    fn a_ring_across_servers_pays_only_its_network_hops_latency() {
        // One lapping ring step over 2 servers of 4 (path latency 0 in this test network):
        // the two messages that cross servers cost Simple's network hop (14 us) each, the six
        // inside servers nothing, as their share is done while the network hops still send.
        let mut network = Uniform { per_node: 4, ..uniform() };
        let ring: Vec<(RankId, RankId, u64)> = (0..8).map(|r| (RankId(r), RankId((r + 1) % 8), 1)).collect();
        let extra = step_extra(Protocol::Simple, Family::Ring, true, true, &ring, &mut network).unwrap();
        assert_eq!(extra, SimDuration::from_ps(2 * 14_000_000 / 8));
        // Inside one server every hop pays NCCL's NVLink hop latency (3.4 us for Simple).
        let mut one = Uniform { per_node: 8, ..uniform() };
        let extra = step_extra(Protocol::Simple, Family::Ring, false, true, &ring, &mut one).unwrap();
        assert_eq!(extra, SimDuration::from_ns(3_400));
    }
}
