//! Collectives in the `analytical` fidelity, and the choice of algorithm.
//!
//! A collective runs as the [`Schedule`] of its algorithm: synchronous steps in which members
//! exchange point-to-point messages. Analytically a step lasts as long as its slowest message,
//! a message costing the latency of its path plus the bytes of the step on its busiest link
//! over that link's bandwidth (the messages of one step share the links they cross). Traffic
//! of anything else is ignored: this is the uncontended reference the flow-level models are
//! tested against. Reduction arithmetic is not charged (it overlaps with the transfers).
//!
//! **Ring channels.** Like NCCL, a ring over a group that spans several servers runs as `c`
//! parallel rings (channels), each carrying `1/c` of the buffer, where `c` is the smallest
//! number of group members on one server. Channel `j` visits the servers in group order and,
//! inside each server, its members rotated by `j`, every other server backwards (a snake), so
//! every channel leaves a server from a different GPU and every server-to-server hop joins
//! two GPUs of the same local index: with one NIC per GPU, every NIC carries one channel
//! instead of one NIC carrying the whole ring, and on rail-optimized networks (NIC i of every
//! server on leaf i) the hops stay on their rail, as NCCL's rail-aligned rings do. On 8-GPU
//! servers with 8 x 200 Gb/s NICs the bus bandwidth approaches 8 x 25 GB/s = 200 GB/s (NVIDIA
//! reports 192 GB/s measured on DGX A100, nccl issue #1576). With one rank per server, `c = 1`
//! and the ring is the textbook `2(p-1) alpha + 2(p-1)/p S/B`.
//!
//! **Choosing (`auto`).** NCCL's tuner (`src/graph/tuning.cc`) estimates, for every algorithm
//! it has for a collective, `latency + size / bandwidth` on the detected topology and runs the
//! fastest. [`choose`] does the same with this module's alpha-beta model on the real topology:
//! among [`CollectiveAlgorithm::candidates`] of the kind it picks the one with the smallest
//! [`analytical_time`] (ties go to the first candidate). On a multi-server cluster that gives
//! the tree for small allreduces (fewer latency terms: 2 log2 p against 2(p-1)) and the ring
//! for large ones (the tree's pipeline moves each byte through more hops).

use std::fmt;

use units::{Bandwidth, Bytes, SimDuration, UnitError};

use crate::graph::{CollectiveAlgorithm, CollectiveKind, RankId};
use crate::protocol::{Family, Hop, Protocol, ProtocolChoice};
use crate::schedule::Pipeline;
pub use crate::schedule::Schedule;
use crate::tuner::{TunerFabric, allreduce_time};
pub use topology::NcclSettings;

/// Latency and bottleneck bandwidth of the path between two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathCost {
    /// Sum of the link latencies on the path.
    pub latency: SimDuration,
    /// The smallest link bandwidth on the path.
    pub bandwidth: Bandwidth,
}

impl PathCost {
    /// Time for a message of `1/parts` of `bytes` to cross the path alone.
    pub fn time_for_share(self, bytes: Bytes, parts: u64) -> Result<SimDuration, UnitError> {
        let serialization = self.bandwidth.time_to_send_share(bytes, parts)?;
        self.latency.checked_add(serialization).map_err(|_| UnitError::OutOfRange {
            input: format!("{bytes}"),
            quantity: "message time",
            reason: "longer than the largest representable duration",
        })
    }
}

/// A collective could not be timed.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    /// The algorithm cannot perform the kind (the graph validation normally catches this).
    #[error("algorithm {algorithm} cannot perform {kind}")]
    Unsupported {
        /// The algorithm asked for.
        algorithm: &'static str,
        /// The collective kind.
        kind: &'static str,
    },
    /// The network could not time a message (no path, unknown rank).
    #[error("{0}")]
    Network(String),
    /// The time does not fit in simulated time.
    #[error("collective time out of range: {0}")]
    Time(#[from] UnitError),
}

/// What an algorithm needs from the network: where ranks sit, and how long one step takes.
pub trait StepNetwork {
    /// The server that `rank` sits in (ring channels are rotated within servers).
    fn node_of(&self, rank: RankId) -> Result<u32, CollectiveError>;

    /// The chunk size of pipelined algorithms (tree, chain).
    fn chunk(&self) -> Bytes {
        Bytes(crate::schedule::CHUNK_BYTES)
    }

    /// The sum of link latencies between two ranks (what a protocol's per-hop latency
    /// replaces when it is larger).
    fn path_latency(&mut self, _src: RankId, _dst: RankId) -> Result<SimDuration, CollectiveError> {
        Ok(SimDuration::ZERO)
    }

    /// The links inside a server (NVLink or PCIe), for the protocols' per-hop latencies.
    fn intra_hop(&self) -> Hop {
        Hop::NvLink
    }

    /// The transport's software cost per message that crosses the network.
    fn message_overhead(&self) -> SimDuration {
        SimDuration::ZERO
    }

    /// The fixed cost of every channel a collective runs on, with protocols (see
    /// [`channel_time`]).
    fn channel_overhead(&self) -> SimDuration {
        SimDuration::ZERO
    }

    /// The rate at which an LL step reaches the network through host memory (see
    /// [`ll_host_time`]); `None` for no such cost.
    fn ll_host_rate(&self) -> Option<Bandwidth> {
        None
    }

    /// The fixed cost of every collective (with protocols: the Simple protocol's base latency).
    fn collective_launch(&self) -> SimDuration {
        SimDuration::ZERO
    }

    /// Which protocols collectives use.
    fn protocols(&self) -> ProtocolChoice {
        ProtocolChoice::Off
    }

    /// True if the servers' NVSwitches can reduce (NVLS), given a GPU generation that has it.
    fn nvls(&self) -> bool {
        false
    }

    /// True if the switches between servers reduce (InfiniBand SHARP: NCCL's CollNet).
    fn sharp(&self) -> bool {
        false
    }

    /// The cluster as NCCL's tuner sees it; `None` to choose by this network's own estimate.
    fn tuner_fabric(&self) -> Option<TunerFabric> {
        None
    }

    /// The rate at which a GPU copies a buffer within its own memory (reading and writing it:
    /// a copy of `b` bytes moves `2b`), for the copy a ring's kernel makes without crossing a
    /// link ([`ring_copy_time`]); `None` where the device is not known.
    fn device_copy(&self) -> Option<Bandwidth> {
        None
    }

    /// The run's NCCL settings: the algorithms and protocols `auto` may choose, and the
    /// Simple protocol's buffer (`[cluster.network] nccl-algorithms`, `nccl-protocols`,
    /// `nccl-buffsize`); NCCL's defaults unless the cluster says otherwise.
    fn nccl(&self) -> NcclSettings {
        NcclSettings::DEFAULT
    }

    /// [`StepNetwork::step_time`] without the path latencies: how long the step's busiest
    /// link takes to carry its bytes (a pipeline's steady steps, whose latency overlaps).
    fn step_transfer_time(
        &mut self,
        messages: &[(RankId, RankId, u64)],
        bytes: Bytes,
        den: u64,
    ) -> Result<SimDuration, CollectiveError> {
        let mut latency = SimDuration::ZERO;
        for &(src, dst, _) in messages {
            latency = latency.max(self.path_latency(src, dst)?);
        }
        Ok(self.step_time(messages, bytes, den)?.saturating_sub(latency))
    }

    /// Duration of one synchronous step in which every `(src, dst, num)` sends `num / den` of
    /// `bytes`, the step's messages sharing the links they cross: the slowest message's path
    /// latency plus the step's bytes on its busiest link over that link's bandwidth.
    fn step_time(
        &mut self,
        messages: &[(RankId, RankId, u64)],
        bytes: Bytes,
        den: u64,
    ) -> Result<SimDuration, CollectiveError>;

    /// The time a pipelined schedule ([`Schedule::is_pipelined`]: NCCL's tree) takes to move
    /// its data: its first chunk's journey (each level's slowest path latency) plus every
    /// step's [`StepNetwork::step_transfer_time`] (at least the schedule's
    /// [`Schedule::step_floor`]), since the tree keeps several chunks in flight on every edge
    /// (8 per connection) and a step adds only its transfer. By default
    /// message by message ([`pipeline_time_by_steps`]); a network may time it by its levels
    /// ([`crate::schedule::Pipeline`]) as long as the result is the same.
    fn pipeline_time(&mut self, schedule: &Schedule) -> Result<SimDuration, CollectiveError> {
        pipeline_time_by_steps(self, schedule)
    }

    /// The path latencies of each level of `pipeline`, split by whether its hops cross
    /// servers (what the protocols' per-hop latencies are compared with). By default hop by
    /// hop ([`level_latencies_by_hops`]).
    fn level_latencies(&mut self, pipeline: &Pipeline) -> Result<Vec<LevelLatencies>, CollectiveError> {
        level_latencies_by_hops(self, pipeline)
    }
}

/// The hops of one level of a pipeline by their path latencies: the shortest and the longest
/// among the hops inside a server, and among the hops between servers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LevelLatencies {
    /// (shortest, longest) path latency of the level's hops inside a server, if it has any.
    pub within: Option<(SimDuration, SimDuration)>,
    /// (shortest, longest) path latency of the level's hops between servers, if it has any.
    pub across: Option<(SimDuration, SimDuration)>,
}

impl LevelLatencies {
    /// Counts a hop of path latency `latency`, between servers if `across`.
    pub fn add(&mut self, across: bool, latency: SimDuration) {
        let kind = if across { &mut self.across } else { &mut self.within };
        *kind = Some(match *kind {
            Some((shortest, longest)) => (shortest.min(latency), longest.max(latency)),
            None => (latency, latency),
        });
    }

    /// The longest path latency of the level's hops (zero without hops).
    pub fn longest(&self) -> SimDuration {
        let longest = |kind: Option<(SimDuration, SimDuration)>| kind.map_or(SimDuration::ZERO, |(_, l)| l);
        longest(self.within).max(longest(self.across))
    }
}

/// [`StepNetwork::level_latencies`] hop by hop.
pub fn level_latencies_by_hops<N: StepNetwork + ?Sized>(
    network: &mut N,
    pipeline: &Pipeline,
) -> Result<Vec<LevelLatencies>, CollectiveError> {
    let mut levels = Vec::with_capacity(pipeline.levels.len());
    for level in &pipeline.levels {
        let mut latencies = LevelLatencies::default();
        for &(src, dst) in level {
            let across = network.node_of(src)? != network.node_of(dst)?;
            latencies.add(across, network.path_latency(src, dst)?);
        }
        levels.push(latencies);
    }
    Ok(levels)
}

/// [`StepNetwork::pipeline_time`] message by message: each step's messages listed and timed
/// (identical steps once).
pub fn pipeline_time_by_steps<N: StepNetwork + ?Sized>(
    network: &mut N,
    schedule: &Schedule,
) -> Result<SimDuration, CollectiveError> {
    let (bytes, den) = schedule.fraction();
    let overflow = || UnitError::OutOfRange {
        input: format!("a pipeline of {bytes} over {} ranks", schedule.lanes().first().map_or(0, Vec::len)),
        quantity: "collective time",
        reason: "longer than the largest representable duration",
    };
    let mut total = SimDuration::ZERO;
    for level in schedule.pipeline().iter().flat_map(|pipeline| &pipeline.levels) {
        let mut latency = SimDuration::ZERO;
        for &(src, dst) in level {
            latency = latency.max(network.path_latency(src, dst)?);
        }
        total = total.checked_add(latency).map_err(|_| overflow())?;
    }
    let mut messages = Vec::new();
    for (step_index, repeat) in schedule.step_weights() {
        messages.clear();
        schedule.step_messages(step_index, &mut messages);
        if messages.is_empty() {
            continue;
        }
        let transfer = network.step_transfer_time(&messages, bytes, den)?.max(schedule.step_floor());
        let time = transfer.checked_mul(repeat).map_err(|_| overflow())?;
        total = total.checked_add(time).map_err(|_| overflow())?;
    }
    Ok(total)
}

/// The members of `group` per server: servers in order of first appearance, members in group
/// order.
pub(crate) fn members_by_server(
    group: &[RankId],
    node_of: &impl Fn(RankId) -> Result<u32, CollectiveError>,
) -> Result<Vec<(u32, Vec<RankId>)>, CollectiveError> {
    let mut servers: Vec<(u32, Vec<RankId>)> = Vec::new();
    let mut position_of_node = std::collections::BTreeMap::new();
    for &rank in group {
        let node = node_of(rank)?;
        let position = *position_of_node.entry(node).or_insert_with(|| {
            servers.push((node, Vec::new()));
            servers.len() - 1
        });
        servers[position].1.push(rank);
    }
    Ok(servers)
}

/// The rings a ring collective over `group` runs: `c` channels, each a permutation of the
/// group (see the module documentation).
pub fn ring_channels(
    group: &[RankId],
    node_of: impl Fn(RankId) -> Result<u32, CollectiveError>,
) -> Result<Vec<Vec<RankId>>, CollectiveError> {
    let servers = members_by_server(group, &node_of)?;
    let channels =
        if servers.len() <= 1 { 1 } else { servers.iter().map(|(_, m)| m.len()).min().unwrap_or(1) };
    Ok((0..channels)
        .map(|j| {
            let mut ring = Vec::with_capacity(group.len());
            for (index, (_, members)) in servers.iter().enumerate() {
                let rotation = j % members.len();
                let start = ring.len();
                ring.extend(members[rotation..].iter().chain(&members[..rotation]).copied());
                if index % 2 == 1 {
                    // Snake: every other server is walked backwards, so the ring enters it on
                    // the GPU (and NIC) the previous server left from and leaves it on the one
                    // the next server enters on: every server-to-server hop joins two NICs of
                    // the same index (the same rail).
                    ring[start..].reverse();
                }
            }
            ring
        })
        .collect())
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

/// The latency family of an algorithm (see [`crate::protocol`]).
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

/// The uncontended completion time of a collective of `bytes` over `group` (in ring order)
/// by `algorithm`, its fixed cost included; `Auto` (and the protocol, when protocols are
/// `auto`) are resolved with [`choose`] first.
pub fn analytical_time(
    kind: CollectiveKind,
    algorithm: CollectiveAlgorithm,
    bytes: Bytes,
    group: &[RankId],
    network: &mut impl StepNetwork,
) -> Result<SimDuration, CollectiveError> {
    let choice = choose_for(kind, algorithm, bytes, group, network)?;
    time_of(kind, choice, bytes, group, network)
}

/// The bytes a collective of `bytes` puts on the wire under `choice`'s protocol: for an
/// allreduce on a cluster NCCL's tuner knows, its model's slowdown over the bare links (the
/// protocol's share and the per-channel limits, [`crate::tuner::allreduce_slowdown`]);
/// otherwise the protocol's own share ([`Protocol::wire_ratio`]).
pub fn wire_bytes(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &impl StepNetwork,
) -> Result<Bytes, CollectiveError> {
    let Some(protocol) = choice.protocol else { return Ok(bytes) };
    if kind == CollectiveKind::AllReduce
        && let Some(fabric) = network.tuner_fabric()
    {
        let nodes = members_by_server(group, &|rank| network.node_of(rank))?.len() as u32;
        if let Some(slowdown) = crate::tuner::allreduce_slowdown(
            &fabric,
            choice.algorithm,
            protocol,
            group.len() as u32,
            nodes,
            bytes.0,
        ) {
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
/// ([`crate::nccl::NcclTable::tree_simple_chunk_shrinks`]) and never shrunk from NCCL 2.20 on; 32 KiB of data with LL, 576,000
/// bytes with LL128, halved for LL128 while a channel has too few chunks to fill the
/// pipeline, as `calcCollChunking` in `enqueue.cc` does); otherwise the network's chunk
/// setting.
pub fn chunk_for(
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &impl StepNetwork,
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
fn nodes_and_channels(group: &[RankId], network: &impl StepNetwork) -> Result<(u64, u64), CollectiveError> {
    let servers = members_by_server(group, &|rank| network.node_of(rank))?;
    let channels = servers.iter().map(|(_, m)| m.len() as u64).min().unwrap_or(1).max(1);
    Ok((servers.len().max(1) as u64, channels))
}

/// True if every member of `group` is on one server.
pub fn single_server(group: &[RankId], network: &impl StepNetwork) -> Result<bool, CollectiveError> {
    let Some(&first) = group.first() else { return Ok(true) };
    let node = network.node_of(first)?;
    for &rank in group {
        if network.node_of(rank)? != node {
            return Ok(false);
        }
    }
    Ok(true)
}

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
    network: &mut impl StepNetwork,
) -> Result<SimDuration, CollectiveError> {
    protocol_overhead_with(kind, choice, bytes, group, None, network)
}

/// [`protocol_overhead`], with the collective's schedule ([`schedule_of`]) if the caller has
/// it.
fn protocol_overhead_with(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    schedule: Option<&Schedule>,
    network: &mut impl StepNetwork,
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
        // large enough (`crate::tuner::ring_plateau`).
        let channels = schedule.lanes().len() as u64;
        let generation =
            network.tuner_fabric().map_or(crate::tuner::GpuGeneration::default(), |f| f.generation);
        let factor = crate::tuner::ring_plateau(table, generation, bytes.0, channels, group.len() as u32);
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
    /// Channels NCCL launches for the size ([`crate::tuner::launch_channels`]).
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
        network: &impl StepNetwork,
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
        let channels =
            crate::tuner::launch_channels(&fabric, family, protocol, group.len() as u32, nodes, bytes.0);
        Ok(Some(NcclLaunch { fabric, family, nodes, channels }))
    }
}

/// What the channels of an allreduce under `choice` cost: the network's per-channel overhead
/// times the channels NCCL launches for its size ([`crate::tuner::launch_channels`]: fewer
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
    network: &impl StepNetwork,
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
/// [`StepNetwork::ll_host_rate`]; later chunks follow in the pipeline.
///
/// The chunk is NCCL's: the tree's `divUp(S, c m) m` and the ring's `divUp(S, c p m) m` over
/// the `c` channels NCCL launches ([`crate::tuner::launch_channels`]), with `m` = 8 bytes per
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
    network: &impl StepNetwork,
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
    let threshold = crate::tuner::thread_threshold(family, Protocol::Ll, ranks);
    let mut threads = u64::from(crate::tuner::max_threads(&fabric, family, Protocol::Ll, ranks, nodes));
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

/// The data of one LL step: `DEFAULT_LL_BUFFSIZE` (`NCCL_LL_LINES_PER_THREAD` x
/// `NCCL_LL_MAX_NTHREADS` x `NCCL_STEPS` x 16-byte lines) over `NCCL_STEPS`, half of each line
/// being flags.
const LL_STEP_DATA: u64 = 32 << 10;

/// The copy a ring allreduce inside one NVLink server makes in each GPU's own memory, moving
/// nothing across a link: `2 S / p` bytes of memory traffic per GPU (a buffer of `S` over `p`
/// ranks) at the device's copy rate ([`StepNetwork::device_copy`]), added to the collective.
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
    network: &impl StepNetwork,
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
    network: &mut impl StepNetwork,
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
    network: &impl StepNetwork,
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
    network: &impl StepNetwork,
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

/// The completion time of a collective under a resolved `choice`, fixed costs included.
pub fn time_of(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &mut impl StepNetwork,
) -> Result<SimDuration, CollectiveError> {
    let overflow = || UnitError::OutOfRange {
        input: format!("{} of {bytes} over {} ranks", kind.name(), group.len()),
        quantity: "collective time",
        reason: "longer than the largest representable duration",
    };
    let (data, overhead) = if is_in_network(choice.algorithm) {
        (
            data_time(kind, choice, bytes, group, network)?,
            protocol_overhead(kind, choice, bytes, group, network)?,
        )
    } else {
        let schedule = schedule_of(kind, choice, bytes, group, network)?;
        (
            schedule_time(kind, group, &schedule, network)?,
            protocol_overhead_with(kind, choice, bytes, group, Some(&schedule), network)?,
        )
    };
    Ok(data.checked_add(overhead).map_err(|_| overflow())?)
}

/// The schedule a collective of `bytes` runs under `choice` (not an in-network algorithm): its
/// wire bytes ([`wire_bytes`]) in the chunks of [`chunk_for`].
fn schedule_of(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &impl StepNetwork,
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
    network: &impl StepNetwork,
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
/// channel's chunk at a tree channel's own rate ([`crate::tuner::tree_channel_rate`]).
/// Every channel is a CUDA block that receives, reduces and sends each chunk on every hop, and
/// with Simple a hop's receiver sees a step only once all of it is written (the sender posts
/// the step's tail after the whole slice, `prims_simple.h`; a tree's slice is its chunk,
/// `ProtoSimple<1, 1>`), so a chunk crosses its hops one after the other, each no faster than
/// its channel moves data, however fast the hop's links are: on NVLink, where the links alone
/// would take a few microseconds, this is what a tree's pipeline fill costs. A channel carries
/// its share of the channels NCCL launches for the size ([`crate::tuner::launch_channels`]:
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
    network: &impl StepNetwork,
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
    let Some(rate) = crate::tuner::tree_channel_rate(&fabric) else {
        return Ok(SimDuration::ZERO);
    };
    let nodes = members_by_server(group, &|rank| network.node_of(rank))?.len() as u32;
    let lanes = schedule.lanes().len() as u32;
    let ranks = group.len() as u32;
    // The schedule cuts the buffer into `den` messages, `lanes` per step; NCCL's launched
    // channels carry the same chunks per channel, each `1 / (launched x chunks)` of the data.
    let (_, den) = schedule.fraction();
    let chunks = (den / u64::from(lanes.max(1))).max(1);
    let launched = crate::tuner::launch_channels(&fabric, Family::Tree, protocol, ranks, nodes, bytes.0)
        .clamp(1, lanes.max(1));
    let chunk = bytes.as_f64() / (f64::from(launched) * chunks as f64);
    Ok(SimDuration::from_secs_f64(chunk / (rate * 1e9))?)
}

/// The NCCL release constants `network` is priced with: its tuner fabric's release, else the
/// default's.
fn nccl_table(network: &impl StepNetwork) -> &'static crate::nccl::NcclTable {
    network.tuner_fabric().map_or(crate::nccl::NcclTable::default_table(), |fabric| fabric.table())
}

/// Greatest common divisor.
fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// True for the NVLS algorithms, which are timed in closed form (see [`crate::nvls`]).
pub fn is_nvls(algorithm: CollectiveAlgorithm) -> bool {
    matches!(algorithm, CollectiveAlgorithm::Nvls | CollectiveAlgorithm::NvlsTree)
}

/// True for the algorithms whose reduction happens in a switch (NVLS in the NVSwitch, CollNet
/// in InfiniBand switches): timed in closed form at every fidelity, Simple protocol only.
pub fn is_in_network(algorithm: CollectiveAlgorithm) -> bool {
    is_nvls(algorithm)
        || matches!(algorithm, CollectiveAlgorithm::CollNetDirect | CollectiveAlgorithm::CollNetChain)
}

/// Whether an in-network algorithm ([`is_in_network`]) can run on `group`.
pub fn in_network_fits(
    algorithm: CollectiveAlgorithm,
    group: &[RankId],
    network: &impl StepNetwork,
) -> Result<bool, CollectiveError> {
    Ok(if is_nvls(algorithm) {
        crate::nvls::shape(algorithm, group, network)?.is_some()
    } else {
        crate::collnet::shape(algorithm, group, network)?.is_some()
    })
}

/// The closed-form time of an in-network algorithm ([`is_in_network`]), latency included.
pub fn in_network_time(
    algorithm: CollectiveAlgorithm,
    bytes: Bytes,
    group: &[RankId],
    network: &impl StepNetwork,
) -> Result<SimDuration, CollectiveError> {
    let (seconds, quantity) = if is_nvls(algorithm) {
        (crate::nvls::seconds(algorithm, bytes, group, network)?, "NVLS allreduce time")
    } else {
        (crate::collnet::seconds(algorithm, bytes, group, network)?, "CollNet allreduce time")
    };
    SimDuration::from_secs_f64(seconds).map_err(|_: UnitError| {
        CollectiveError::Time(UnitError::OutOfRange {
            input: format!("{bytes}"),
            quantity,
            reason: "longer than the largest representable duration",
        })
    })
}

/// The time the links take to move a collective's data under `choice` (path latencies
/// included, fixed costs not; NVLS: its closed form, latency included).
pub fn data_time(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &mut impl StepNetwork,
) -> Result<SimDuration, CollectiveError> {
    if is_in_network(choice.algorithm) {
        return in_network_time(choice.algorithm, bytes, group, network);
    }
    let schedule = schedule_of(kind, choice, bytes, group, network)?;
    schedule_time(kind, group, &schedule, network)
}

/// [`data_time`] of a collective's schedule.
fn schedule_time(
    kind: CollectiveKind,
    group: &[RankId],
    schedule: &Schedule,
    network: &mut impl StepNetwork,
) -> Result<SimDuration, CollectiveError> {
    let (bytes, den) = schedule.fraction();
    let overflow = || UnitError::OutOfRange {
        input: format!("{} of {bytes} over {} ranks", kind.name(), group.len()),
        quantity: "collective time",
        reason: "longer than the largest representable duration",
    };
    if schedule.is_pipelined() {
        return network.pipeline_time(schedule);
    }
    let mut messages = Vec::with_capacity(2 * group.len() * schedule.lanes().len());
    let mut total = SimDuration::ZERO;
    for (step_index, repeat) in schedule.step_weights() {
        messages.clear();
        schedule.step_messages(step_index, &mut messages);
        if messages.is_empty() {
            continue;
        }
        let time = network.step_time(&messages, bytes, den)?.checked_mul(repeat).map_err(|_| overflow())?;
        total = total.checked_add(time).map_err(|_| overflow())?;
    }
    Ok(total)
}

/// What `Auto` runs for this collective: the candidate algorithm (and protocol) with the
/// smallest [`time_of`] on `network` (see the module documentation).
pub fn choose(
    kind: CollectiveKind,
    bytes: Bytes,
    group: &[RankId],
    network: &mut impl StepNetwork,
) -> Result<Choice, CollectiveError> {
    choose_for(kind, CollectiveAlgorithm::Auto, bytes, group, network)
}

/// [`choose`] among `algorithm` alone unless it is `Auto`; the protocol is the fastest of the
/// network's protocol choice (none when protocols are off).
pub fn choose_for(
    kind: CollectiveKind,
    algorithm: CollectiveAlgorithm,
    bytes: Bytes,
    group: &[RankId],
    network: &mut impl StepNetwork,
) -> Result<Choice, CollectiveError> {
    // The run's NCCL settings narrow what `auto` chooses from (NCCL_ALGO for an allreduce,
    // NCCL_PROTO); an algorithm or protocol asked for by name runs as asked.
    let nccl = network.nccl();
    let allowed: Vec<CollectiveAlgorithm>;
    let algorithms: &[CollectiveAlgorithm] = match algorithm {
        CollectiveAlgorithm::Auto if kind == CollectiveKind::AllReduce => {
            allowed = CollectiveAlgorithm::candidates(kind)
                .iter()
                .copied()
                .filter(|candidate| nccl.algorithms.allows(candidate.name()))
                .collect();
            &allowed
        }
        CollectiveAlgorithm::Auto => CollectiveAlgorithm::candidates(kind),
        _ => std::slice::from_ref(&algorithm),
    };
    let protocols: Vec<Option<Protocol>> = match network.protocols() {
        ProtocolChoice::Off => vec![None],
        ProtocolChoice::Auto => Protocol::ALL
            .iter()
            .copied()
            .filter(|protocol| nccl.protocols.allows(protocol.name()))
            .map(Some)
            .collect(),
        choice => choice.candidates().iter().copied().map(Some).collect(),
    };
    if algorithms.len() == 1 && protocols.len() == 1 {
        if !algorithms[0].supports(kind) {
            return Err(CollectiveError::Unsupported { algorithm: algorithms[0].name(), kind: kind.name() });
        }
        let protocol =
            if is_in_network(algorithms[0]) { protocols[0].map(|_| Protocol::Simple) } else { protocols[0] };
        return Ok(Choice { algorithm: algorithms[0], protocol });
    }
    if kind == CollectiveKind::AllReduce
        && network.protocols() != ProtocolChoice::Off
        && let Some(fabric) = network.tuner_fabric()
        && algorithms
            .iter()
            .all(|&a| matches!(a, CollectiveAlgorithm::Ring | CollectiveAlgorithm::Tree) || is_in_network(a))
    {
        // As NCCL: its own latency/bandwidth model picks, not a simulation.
        let nodes = members_by_server(group, &|rank| network.node_of(rank))?.len() as u32;
        let launch_us = network.collective_launch().as_ps() as f64 / 1e6;
        let mut best: Option<(f64, Choice)> = None;
        for &candidate in algorithms {
            if is_in_network(candidate) && !in_network_fits(candidate, group, network)? {
                continue;
            }
            for &protocol in protocols.iter().flatten() {
                let estimate = allreduce_time(
                    &fabric,
                    candidate,
                    protocol,
                    group.len() as u32,
                    nodes,
                    launch_us,
                    bytes.0,
                );
                if let Some(time) = estimate
                    && best.is_none_or(|(fastest, _)| time < fastest)
                {
                    best = Some((time, Choice { algorithm: candidate, protocol: Some(protocol) }));
                }
            }
        }
        if let Some((_, choice)) = best {
            return Ok(choice);
        }
    }
    let mut best: Option<(SimDuration, Choice)> = None;
    for &candidate in algorithms {
        if is_in_network(candidate) && !in_network_fits(candidate, group, network)? {
            continue;
        }
        for &protocol in &protocols {
            if is_in_network(candidate) && protocol.is_some_and(|p| p != Protocol::Simple) {
                continue;
            }
            let choice = Choice { algorithm: candidate, protocol };
            let time = time_of(kind, choice, bytes, group, network)?;
            if best.is_none_or(|(fastest, _)| time < fastest) {
                best = Some((time, choice));
            }
        }
    }
    best.map(|(_, choice)| choice).ok_or(match algorithm {
        CollectiveAlgorithm::Nvls | CollectiveAlgorithm::NvlsTree => CollectiveError::Unsupported {
            algorithm: algorithm.name(),
            kind: "allreduce here: NVLS needs an NVSwitch and Hopper or later GPUs (nvls: one server; nvls-tree: \
                   several, the same number of GPUs on each)",
        },
        CollectiveAlgorithm::CollNetDirect | CollectiveAlgorithm::CollNetChain => {
            CollectiveError::Unsupported { algorithm: algorithm.name(), kind: crate::collnet::UNSUPPORTED }
        }
        CollectiveAlgorithm::Auto if nccl.algorithms != topology::NcclAlgorithms::ALL => {
            CollectiveError::Unsupported {
                algorithm: "auto",
                kind: "allreduce here: none of the algorithms cluster.network.nccl-algorithms allows runs on \
                       this group",
            }
        }
        _ => CollectiveError::Unsupported { algorithm: algorithm.name(), kind: kind.name() },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use CollectiveAlgorithm as A;
    use CollectiveKind as K;

    /// Every message has its own path of `cost` (no sharing); `per_node` ranks per server.
    struct Uniform {
        cost: PathCost,
        per_node: u32,
    }

    impl StepNetwork for Uniform {
        fn node_of(&self, rank: RankId) -> Result<u32, CollectiveError> {
            Ok(rank.0 / self.per_node)
        }
        fn step_time(
            &mut self,
            messages: &[(RankId, RankId, u64)],
            bytes: Bytes,
            den: u64,
        ) -> Result<SimDuration, CollectiveError> {
            let largest = messages.iter().map(|m| m.2).max().expect("a step has messages");
            let share = Bytes(bytes.0.checked_mul(largest).expect("small test sizes"));
            Ok(self.cost.time_for_share(share, den)?)
        }
    }

    fn uniform() -> Uniform {
        Uniform {
            cost: PathCost { latency: SimDuration::from_us(2), bandwidth: "100 Gb/s".parse().unwrap() },
            per_node: 1,
        }
    }

    fn ranks(p: u32) -> Vec<RankId> {
        (0..p).map(RankId).collect()
    }

    /// Picoseconds of `kind` by `algorithm` over `p` ranks, `per_node` per server.
    fn ps(kind: K, algorithm: A, p: u32, per_node: u32, bytes: u64) -> u64 {
        let mut network = Uniform { per_node, ..uniform() };
        analytical_time(kind, algorithm, Bytes(bytes), &ranks(p), &mut network).unwrap().as_ps()
    }

    /// alpha = 2 us; 12.5 GB/s is 80 ps per byte.
    const ALPHA: u64 = 2_000_000;

    #[test]
    fn ring_allreduce_is_the_textbook_formula() {
        // 2(p-1) alpha + 2(p-1)/p S/B: exact in picoseconds.
        for (p, bytes) in [(8u64, 1u64 << 20), (16, 64 << 20), (1024, 1 << 30)] {
            let expected = 2 * (p - 1) * (ALPHA + bytes * 80 / p);
            assert_eq!(ps(K::AllReduce, A::Ring, p as u32, 1, bytes), expected, "p={p}");
        }
    }

    #[test]
    fn reduce_scatter_and_allgather_are_half_a_ring_allreduce() {
        let all = ps(K::AllReduce, A::Ring, 16, 1, 1 << 26);
        assert_eq!(ps(K::ReduceScatter, A::Ring, 16, 1, 1 << 26) * 2, all);
        assert_eq!(ps(K::AllGather, A::Ring, 16, 1, 1 << 26) * 2, all);
    }

    #[test]
    fn halving_doubling_is_2_log2_p_alpha_plus_2_p_minus_1_over_p_s_over_b() {
        for p in [2u64, 4, 16, 64] {
            let bytes = 64u64 << 20;
            let log = 63 - p.leading_zeros() as u64;
            let expected = 2 * log * ALPHA + 2 * (p - 1) * bytes * 80 / p;
            assert_eq!(ps(K::AllReduce, A::HalvingDoubling, p as u32, 1, bytes), expected, "p={p}");
        }
        // Not a power of two: one fold and one unfold of the whole buffer more.
        let (p, bytes) = (12u64, 12u64 << 20);
        let expected = 2 * 3 * ALPHA + 2 * 7 * bytes * 80 / 8 + 2 * (ALPHA + bytes * 80);
        assert_eq!(ps(K::AllReduce, A::HalvingDoubling, p as u32, 1, bytes), expected);
    }

    #[test]
    fn recursive_halving_reduce_scatter_and_doubling_allgather_are_half_of_halving_doubling() {
        // log2 p alpha + (p-1)/p S/B each.
        let (p, bytes) = (16u64, 64u64 << 20);
        let expected = 4 * ALPHA + (p - 1) * bytes * 80 / p;
        assert_eq!(ps(K::ReduceScatter, A::HalvingDoubling, p as u32, 1, bytes), expected);
        assert_eq!(ps(K::AllGather, A::HalvingDoubling, p as u32, 1, bytes), expected);
        // Not a power of two: a ring.
        assert_eq!(
            ps(K::AllGather, A::HalvingDoubling, 12, 1, bytes),
            ps(K::AllGather, A::Ring, 12, 1, bytes)
        );
    }

    #[test]
    fn recursive_doubling_is_log2_p_full_exchanges() {
        let bytes = 1u64 << 16;
        assert_eq!(ps(K::AllReduce, A::RecursiveDoubling, 32, 1, bytes), 5 * (ALPHA + bytes * 80));
    }

    #[test]
    fn pipelined_chain_broadcast_is_chunks_plus_p_minus_2_steps() {
        // 8 MiB in 1 MiB chunks over 16 ranks: (8 + 14) steps of one chunk.
        let bytes = 8u64 << 20;
        let chunk = ALPHA + (1 << 20) * 80;
        assert_eq!(ps(K::Broadcast { root: 5 }, A::Chain, 16, 1, bytes), 22 * chunk);
        assert_eq!(ps(K::Reduce { root: 0 }, A::Chain, 16, 1, bytes), 22 * chunk);
    }

    #[test]
    fn double_binary_tree_is_chunks_plus_2h_minus_1_steps_of_half_chunks() {
        // 16 MiB: each tree carries 8 MiB in 8 chunks of 1 MiB; 16 ranks: height 4.
        let bytes = 16u64 << 20;
        let step = ALPHA + (1 << 20) * 80;
        assert_eq!(ps(K::AllReduce, A::DoubleBinaryTree, 16, 1, bytes), (8 + 2 * 4 - 1) * step);
    }

    #[test]
    fn nccl_tree_is_chunks_plus_twice_its_height_steps_over_its_channels() {
        // 4 servers of 8: 8 channels of two trees, each carrying S/16 in 1 MiB chunks; height
        // 7 (the chain) + 2 (the tree over 4 servers).
        let bytes = 64u64 << 20;
        let step = ALPHA + (1 << 20) * 80;
        assert_eq!(ps(K::AllReduce, A::Tree, 32, 8, bytes), (4 + 2 * 9 - 1) * step);
        // One server: the chain alone (height 7), 8 channels.
        assert_eq!(ps(K::AllReduce, A::Tree, 8, 8, bytes), (4 + 2 * 7 - 1) * step);
    }

    /// [`Uniform`] as NCCL `release`'s tuner sees a DGX-A100-like server, with a per-channel
    /// cost.
    struct Tuned {
        inner: Uniform,
        per_channel: SimDuration,
        device_copy: Option<Bandwidth>,
        release: crate::nccl::NcclVersion,
        ll_rate: Option<Bandwidth>,
    }

    /// Eight GPUs per server on the DGX A100 tuner fabric, without channel, copy or LL host
    /// costs: each test sets what it checks.
    fn tuned() -> Tuned {
        Tuned {
            inner: Uniform { per_node: 8, ..uniform() },
            per_channel: SimDuration::ZERO,
            device_copy: None,
            release: crate::tuner::dgx_a100().nccl,
            ll_rate: None,
        }
    }

    impl StepNetwork for Tuned {
        fn node_of(&self, rank: RankId) -> Result<u32, CollectiveError> {
            self.inner.node_of(rank)
        }
        fn channel_overhead(&self) -> SimDuration {
            self.per_channel
        }
        fn ll_host_rate(&self) -> Option<Bandwidth> {
            self.ll_rate
        }
        fn device_copy(&self) -> Option<Bandwidth> {
            self.device_copy
        }
        fn protocols(&self) -> ProtocolChoice {
            ProtocolChoice::Auto
        }
        fn tuner_fabric(&self) -> Option<TunerFabric> {
            Some(TunerFabric { nccl: self.release, ..crate::tuner::dgx_a100() })
        }
        fn step_time(
            &mut self,
            messages: &[(RankId, RankId, u64)],
            bytes: Bytes,
            den: u64,
        ) -> Result<SimDuration, CollectiveError> {
            self.inner.step_time(messages, bytes, den)
        }
    }

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

    /// Two servers of 8 H100s with 8 NICs of 25 GB/s each as NCCL's tuner sees them (GCP
    /// A3-Mega-like), NCCL settings `nccl`, every message on its own 1 TB/s path (far faster
    /// than NCCL's per-channel tree rate), no path latency.
    struct Hopper {
        inner: Uniform,
        nccl: NcclSettings,
    }

    impl StepNetwork for Hopper {
        fn node_of(&self, rank: RankId) -> Result<u32, CollectiveError> {
            self.inner.node_of(rank)
        }
        fn protocols(&self) -> ProtocolChoice {
            ProtocolChoice::Auto
        }
        fn tuner_fabric(&self) -> Option<TunerFabric> {
            Some(TunerFabric {
                intra: 370.0,
                generation: crate::tuner::GpuGeneration::Hopper,
                ..crate::tuner::dgx_a100()
            })
        }
        fn nccl(&self) -> NcclSettings {
            self.nccl
        }
        fn nvls(&self) -> bool {
            true
        }
        fn step_time(
            &mut self,
            messages: &[(RankId, RankId, u64)],
            bytes: Bytes,
            den: u64,
        ) -> Result<SimDuration, CollectiveError> {
            self.inner.step_time(messages, bytes, den)
        }
    }

    fn hopper(nccl: NcclSettings) -> Hopper {
        let cost = PathCost { latency: SimDuration::ZERO, bandwidth: "8000 Gb/s".parse().unwrap() };
        Hopper { inner: Uniform { cost, per_node: 8 }, nccl }
    }

    #[test]
    fn the_runs_nccl_settings_narrow_what_auto_chooses() {
        let group = ranks(16);
        let mut free = hopper(NcclSettings::DEFAULT);
        // NCCL's defaults: LL for small allreduces, NVLS-tree (2 servers, Hopper) for large ones.
        let small = choose(K::AllReduce, Bytes(8), &group, &mut free).unwrap();
        assert_eq!(small.protocol, Some(Protocol::Ll), "{small}");
        let large = choose(K::AllReduce, Bytes(1 << 30), &group, &mut free).unwrap();
        assert_eq!(large.algorithm, A::NvlsTree, "{large}");
        // NCCL_ALGO=Ring,Tree, NCCL_PROTO=Simple: NVLS is gone, every protocol is Simple.
        let names = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let ring_tree = NcclSettings {
            algorithms: topology::NcclAlgorithms::from_names(&names(&["ring", "tree"])).unwrap(),
            protocols: topology::NcclProtocols::from_names(&names(&["Simple"])).unwrap(),
            ..NcclSettings::DEFAULT
        };
        let mut gcp = hopper(ring_tree);
        for bytes in [8, 1 << 20, 1 << 30] {
            let choice = choose(K::AllReduce, Bytes(bytes), &group, &mut gcp).unwrap();
            assert!(matches!(choice.algorithm, A::Ring | A::Tree), "{bytes}: {choice}");
            assert_eq!(choice.protocol, Some(Protocol::Simple), "{bytes}: {choice}");
        }
        // An algorithm or protocol asked for by name runs as asked.
        let ll = choose_for(K::AllReduce, A::Ring, Bytes(8), &group, &mut gcp).unwrap();
        assert_eq!(ll.algorithm, A::Ring);
        // Other kinds keep their candidates (parasim's reduce-scatter is a ring).
        let tree_only = NcclSettings {
            algorithms: topology::NcclAlgorithms::from_names(&names(&["tree"])).unwrap(),
            ..ring_tree
        };
        let mut tree = hopper(tree_only);
        assert_eq!(choose(K::AllReduce, Bytes(1 << 30), &group, &mut tree).unwrap().algorithm, A::Tree);
        assert_eq!(choose(K::ReduceScatter, Bytes(1 << 30), &group, &mut tree).unwrap().algorithm, A::Ring);
        // Nothing allowed runs here (NVLS needs Hopper on NVSwitch, CollNet needs SHARP).
        let collnet = NcclSettings {
            algorithms: topology::NcclAlgorithms::from_names(&names(&["collnet-chain"])).unwrap(),
            ..NcclSettings::DEFAULT
        };
        let error = choose(K::AllReduce, Bytes(1 << 30), &group, &mut hopper(collnet)).unwrap_err();
        assert!(error.to_string().contains("cluster.network.nccl-algorithms"), "{error}");
    }

    #[test]
    fn a_simple_tree_chunk_shrinks_for_small_sizes_until_nccl_2_20() {
        use crate::nccl::NcclVersion;
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
    fn a_simple_tree_moves_nccl_buffsize_chunks_each_at_its_channels_rate() {
        let group = ranks(16);
        let tree = Choice { algorithm: A::Tree, protocol: Some(Protocol::Simple) };
        let gcp = NcclSettings { buffsize: 8 << 20, ..NcclSettings::DEFAULT };
        // Simple chunks are a step of NCCL_BUFFSIZE: 512 KiB by default, 1 MiB with 8 MiB.
        assert_eq!(
            chunk_for(tree, Bytes(1 << 30), &group, &hopper(NcclSettings::DEFAULT)).unwrap(),
            Bytes(512 << 10)
        );
        assert_eq!(chunk_for(tree, Bytes(1 << 30), &group, &hopper(gcp)).unwrap(), Bytes(1 << 20));
        // 16 MiB over 16 channels is one 1 MiB chunk per channel: every one of the tree's 16
        // levels (a chain of 7 NVLink hops and one network hop, up and down) takes the chunk
        // at the channel's rate, Hopper's 38.7 GB/s per graph channel over 2 channels each.
        let mut network = hopper(gcp);
        let bytes = Bytes(16 << 20);
        let schedule = schedule_of(K::AllReduce, tree, bytes, &group, &network).unwrap();
        assert_eq!(schedule.lanes().len(), 16);
        assert_eq!(
            schedule.pipeline().unwrap().chunks,
            1,
            "the tree's wire bytes do not split NCCL's chunks"
        );
        let close = |a: SimDuration, b: SimDuration| a.as_ps().abs_diff(b.as_ps()) <= 20;
        let floor = schedule.step_floor();
        assert!(close(floor, SimDuration::from_secs_f64((1u64 << 20) as f64 / 19.35e9).unwrap()), "{floor}");
        let data = data_time(K::AllReduce, tree, bytes, &group, &mut network).unwrap();
        assert_eq!(data, floor.checked_mul(16).unwrap());
        // Twice the data, twice the chunks: one more step.
        let twice = data_time(K::AllReduce, tree, Bytes(32 << 20), &group, &mut network).unwrap();
        assert_eq!(twice, floor.checked_mul(17).unwrap());
        // A small allreduce runs on one channel per 32 KiB (`launch_channels`): 64 KiB on two,
        // each carrying 32 KiB up and down the tree.
        let small = schedule_of(K::AllReduce, tree, Bytes(64 << 10), &group, &network).unwrap();
        let expected = SimDuration::from_secs_f64((32u64 << 10) as f64 / 19.35e9).unwrap();
        assert!(close(small.step_floor(), expected), "{}", small.step_floor());
        // LL and LL128 forward every line as it arrives: no floor.
        for protocol in [Protocol::Ll, Protocol::Ll128] {
            let choice = Choice { algorithm: A::Tree, protocol: Some(protocol) };
            let schedule = schedule_of(K::AllReduce, choice, bytes, &group, &network).unwrap();
            assert_eq!(schedule.step_floor(), SimDuration::ZERO, "{protocol}");
        }
        // Nor without NCCL's tuner, or for rings.
        let mut plain = Uniform { per_node: 8, ..uniform() };
        assert_eq!(
            schedule_of(K::AllReduce, tree, bytes, &group, &plain).unwrap().step_floor(),
            SimDuration::ZERO
        );
        let ring = Choice { algorithm: A::Ring, protocol: Some(Protocol::Simple) };
        assert_eq!(
            schedule_of(K::AllReduce, ring, bytes, &group, &network).unwrap().step_floor(),
            SimDuration::ZERO
        );
        let _ = data_time(K::AllReduce, tree, bytes, &group, &mut plain).unwrap();
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

    #[test]
    fn hierarchical_is_two_server_rings_around_a_ring_across_servers() {
        // 4 servers of 8: 2 x 7 steps of S/8 inside, 2 x 3 steps of S/32 across.
        let bytes = 32u64 << 20;
        let expected = 14 * (ALPHA + bytes / 8 * 80) + 6 * (ALPHA + bytes / 32 * 80);
        assert_eq!(ps(K::AllReduce, A::Hierarchical, 32, 8, bytes), expected);
        // One rank per server: an ordinary ring.
        assert_eq!(ps(K::AllReduce, A::Hierarchical, 8, 1, bytes), ps(K::AllReduce, A::Ring, 8, 1, bytes));
    }

    #[test]
    fn binomial_broadcast_takes_ceil_log2_rounds() {
        let one = ALPHA + (1 << 20) * 80;
        for (p, rounds) in [(2u32, 1u64), (3, 2), (8, 3), (9, 4), (1000, 10)] {
            for root in [0, p - 1] {
                assert_eq!(ps(K::Broadcast { root }, A::BinomialTree, p, 1, 1 << 20), rounds * one);
                assert_eq!(ps(K::Reduce { root }, A::BinomialTree, p, 1, 1 << 20), rounds * one);
            }
        }
    }

    #[test]
    fn all_to_all_pairwise_takes_p_minus_1_rounds_and_direct_one() {
        let p = 8u64;
        let share = ALPHA + (80 << 20) / p;
        assert_eq!(ps(K::AllToAll, A::Pairwise, p as u32, 1, 1 << 20), (p - 1) * share);
        // Without link sharing (this test network), all sends at once take one share's time.
        assert_eq!(ps(K::AllToAll, A::Direct, p as u32, 1, 1 << 20), share);
    }

    #[test]
    fn ring_channels_rotate_inside_servers_so_each_leaves_from_another_gpu() {
        let network = Uniform { per_node: 4, ..uniform() };
        let channels = ring_channels(&ranks(8), |r| network.node_of(r)).unwrap();
        assert_eq!(channels.len(), 4);
        assert_eq!(channels[0], [0, 1, 2, 3, 7, 6, 5, 4].map(RankId));
        assert_eq!(channels[1], [1, 2, 3, 0, 4, 7, 6, 5].map(RankId));
        // The server-crossing edges join GPUs of the same local index, a different one per
        // channel, both ways round the ring.
        for (j, ring) in channels.iter().enumerate() {
            assert_eq!(ring[3].0 % 4, ring[4].0 % 4, "channel {j} crosses rails going out");
            assert_eq!(ring[7].0 % 4, ring[0].0 % 4, "channel {j} crosses rails coming back");
        }
        let exits: Vec<u32> = channels.iter().map(|ring| ring[3].0).collect();
        assert_eq!(exits, [3, 0, 1, 2]);
        // A group inside one server, or one rank per server, is a single ring.
        assert_eq!(ring_channels(&ranks(4), |r| network.node_of(r)).unwrap().len(), 1);
        let one_per_server = uniform();
        assert_eq!(ring_channels(&ranks(8), |r| one_per_server.node_of(r)).unwrap().len(), 1);
    }

    #[test]
    fn auto_takes_the_fastest_candidate() {
        // A 4 KiB allreduce over 64 ranks is latency-bound: the tree's 2h + C - 1 = 12 steps
        // beat the ring's 126. (Which wins for large buffers depends on link sharing, which
        // this test network does not model: see the integration tests.)
        let mut network = uniform();
        // NCCL's tree with one rank per server is the double binary tree.
        assert_eq!(choose(K::AllReduce, Bytes(4096), &ranks(64), &mut network).unwrap().algorithm, A::Tree);
        let auto = ps(K::AllReduce, A::Auto, 64, 1, 4096);
        assert_eq!(auto, ps(K::AllReduce, A::DoubleBinaryTree, 64, 1, 4096));
        assert_eq!(auto, ps(K::AllReduce, A::Tree, 64, 1, 4096));
    }

    #[test]
    fn one_rank_costs_nothing_and_bad_algorithms_are_refused() {
        assert_eq!(ps(K::AllReduce, A::Ring, 1, 1, 1 << 30), 0);
        let refused = analytical_time(K::AllReduce, A::Pairwise, Bytes(1), &ranks(4), &mut uniform());
        assert!(matches!(refused, Err(CollectiveError::Unsupported { .. })));
    }
}
