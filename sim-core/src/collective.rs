//! Collectives timed step by step on a network model, without traffic from anything else.
//!
//! A collective runs as the [`Schedule`] of its algorithm: synchronous steps in which members
//! exchange point-to-point messages. Analytically a step lasts as long as its slowest message,
//! a message costing the latency of its path plus the bytes of the step on its busiest link
//! over that link's bandwidth (the messages of one step share the links they cross). Traffic
//! of anything else is ignored: this is the uncontended reference the flow-level models are
//! tested against. Reduction arithmetic is not charged (it overlaps with the transfers).
//!
//! [`StepNetwork`] is what this timing asks of a network model: where ranks sit, the latency
//! of a path, and how long one step's messages take. It knows nothing of NCCL: the NCCL model
//! (`nccl`: protocols, its tuner, the choice of algorithm) builds on it and on [`Schedule`].
//!
//! Invariants: a step's time never depends on the steps before it (a schedule's identical
//! steps are timed once and multiplied), and a pipelined schedule timed by its levels takes
//! exactly as long as message by message ([`pipeline_time_by_steps`]).

use units::{Bandwidth, Bytes, SimDuration, UnitError};

use crate::graph::{CollectiveKind, RankId};
use crate::schedule::{CollectiveError, Pipeline, Schedule};

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

/// The time the links take to move a collective's `schedule` (of `kind` over `group`): path
/// latencies included, fixed costs not. Step by step, each step's messages sharing the links
/// they cross (identical steps timed once); a pipelined schedule by
/// [`StepNetwork::pipeline_time`].
pub fn schedule_time(
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
