//! The executor: runs an [`ExecGraph`] to completion on a [`Network`] and records when every
//! op started and ended.
//!
//! Streams are in-order queues: an op waits for the previous op on its (rank, stream) exactly
//! as it waits for its explicit dependencies, so "stream free" is one more dependency. When an
//! op's last dependency finishes it starts at that instant: a compute op schedules its own end,
//! a transfer or copy is handed to the network, and a collective op waits until every member of
//! its group has arrived, then the network runs the collective and ends all members together.
//! The loop pops one event per op completion (one per collective), allocates nothing, and is
//! deterministic: same graph, same network, same timeline.
//!
//! ```
//! use sim_core::exec::run;
//! use sim_core::graph::{GraphBuilder, RankId, StreamId};
//! use sim_core::network::AnalyticalNetwork;
//! use sim_core::units::SimDuration;
//! use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology};
//!
//! let link = LinkSpec::new("100 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
//! let network = NetworkSpec::single_switch(link);
//! let topology = Topology::build(&ClusterSpec { nodes: 2, gpus_per_node: 1, intra_node: IntraNode::NvSwitch(link), network, host_memory: None  }).unwrap();
//! let mut graph = GraphBuilder::new(2);
//! let a = graph.compute(RankId(0), StreamId(0), SimDuration::from_us(5), "work", &[]);
//! let send = graph.transfer(RankId(0), StreamId(0), RankId(1), "125 kB".parse().unwrap(), "send", &[a]);
//! graph.compute(RankId(1), StreamId(0), SimDuration::from_us(5), "work", &[send]);
//! let graph = graph.build().unwrap();
//! let timeline = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
//! // 5 us + (2 links x 1 us + 10 us on the wire) + 5 us.
//! assert_eq!(timeline.makespan(), SimDuration::from_us(22));
//! ```

use crate::lookup::LookupMap;
use units::{SimDuration, SimTime, TimeOverflow};

use crate::graph::{Collective, CollectiveId, ExecGraph, GroupId, MemcpyDirection, Op, OpId, OpKind, RankId};
use crate::nccl::protocol::Choice;
use crate::network::{Completion, Event, Least, Movement, NetContext, Network, NetworkError};
use crate::queue::EventQueue;

/// A run could not complete.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The graph has more ranks than the network has hosts.
    #[error("the graph has {ranks} ranks but the network has only {hosts} hosts")]
    TooFewHosts {
        /// Ranks in the graph.
        ranks: u32,
        /// Hosts in the network.
        hosts: usize,
    },
    /// The network model failed while moving data for an op.
    #[error("{op}: {source}")]
    Network {
        /// The op (or a member of the collective) being started.
        op: String,
        /// What went wrong.
        #[source]
        source: NetworkError,
    },
    /// Simulated time ran past its end.
    #[error("{op}: {source}")]
    Time {
        /// The op being scheduled.
        op: String,
        /// The overflow.
        #[source]
        source: TimeOverflow,
    },
    /// The queue ran dry with ops left (a network model that lost a completion).
    #[error("the run stalled at {time}: {unfinished} ops never finished, first {op}")]
    Stalled {
        /// When the last event happened.
        time: SimTime,
        /// How many ops did not finish.
        unfinished: usize,
        /// The first of them.
        op: String,
    },
    /// The run was given an [`EndLimit`] and its last end can no longer come by it: an op
    /// started at a time from which its remaining kernels alone reach past the limit.
    #[error("{op}: the run cannot end before {bound}, past its limit {limit}")]
    PastLimit {
        /// The op whose start showed it.
        op: String,
        /// The earliest the watched ends can still come.
        bound: SimTime,
        /// The limit.
        limit: SimTime,
    },
}

/// A limit on when a run's watched ends may come ([`run_within`]): the run gives up with
/// [`ExecError::PastLimit`] as soon as an op starts at a time `t` from which some chain of
/// ops (dependencies and stream order) leads to one of the ends and the least times of its
/// ops alone take more than `limit - t`. Each op of such a chain starts after the one before
/// it ends; a kernel takes at least its duration (one slowed beside communication takes
/// longer), and a transfer, copy or collective at least what the network model guarantees
/// it ([`Network::least`]: its exact time under `analytical`, which has no contention;
/// under `flow`, its time alone on the network, which other traffic only stretches), so the
/// last end then comes after `limit` for certain: a run that is not given up ends no later
/// than it would without the limit, event for event the same.
///
/// The limit lives in a [`LimitHandle`] that the caller may keep: it can tighten the limit
/// while the run goes on (the run then gives up as soon as an op start shows its ends are
/// past the tighter one), and it tells afterwards the furthest any op start showed the ends
/// to be ([`LimitHandle::highest`]): the run would have been given up under any limit below
/// that, and under none at or above it.
#[derive(Debug, Clone)]
pub struct EndLimit {
    /// The watched ends.
    ends: Vec<OpId>,
    /// Per op (by `OpId`): the least time from its start to the last watched end along its
    /// dependents and stream successors, in picoseconds; [`NO_TAIL`] where none leads there.
    /// Computed when the run starts, with its network model (empty before).
    tails: Vec<u64>,
    /// The latest the watched ends may come, and the furthest bound shown so far.
    handle: LimitHandle,
    /// This run's own copy of the furthest bound shown (the handle's is written when it rises).
    highest: u64,
    /// The links whose occupancy still ahead bounds the ends (see [`Occupancy`]).
    occupancy: Occupancy,
}

/// The second bound of an [`EndLimit`]: a link cannot carry the movements still ahead of a
/// run in less than the sum of their occupancies ([`crate::network::Least::occupancy`]). At
/// each op start the ends are at least the occupancy still ahead on the busiest tracked link
/// away; a movement's occupancy leaves the sum when it starts (a collective's: when its first
/// member does, before its data can move). Only the links busiest over the whole run are
/// tracked ([`TRACKED_LINKS`]); the others' sums are never larger at the start.
#[derive(Debug, Clone, Default)]
struct Occupancy {
    /// Per op (by `OpId`): its entry in `charge_at` ([`NO_CHARGE`] if it has none); the
    /// member ops of a collective share one.
    charge_of: Vec<u32>,
    /// Where each charge's (tracked link, picoseconds) pairs start in `items`, plus the end.
    charge_at: Vec<u32>,
    items: Vec<(u16, u64)>,
    /// Whether each charge has left the sums.
    charged: Vec<bool>,
    /// Per tracked link, the occupancy still ahead, in picoseconds.
    ahead: Vec<u64>,
    /// The largest of `ahead`.
    most: u64,
}

/// [`Occupancy::charge_of`] of an op that moves nothing over a tracked link.
const NO_CHARGE: u32 = u32::MAX;

/// How many links an [`EndLimit`] tracks the occupancy of: the busiest over the whole run.
const TRACKED_LINKS: usize = 32;

impl Occupancy {
    /// The occupancy of `op`'s movement leaves the sums (once for a collective's members).
    #[inline]
    fn charge(&mut self, op: OpId) {
        let Some(&charge) = self.charge_of.get(op.0 as usize) else { return };
        if charge == NO_CHARGE || self.charged[charge as usize] {
            return;
        }
        self.charged[charge as usize] = true;
        let (from, to) =
            (self.charge_at[charge as usize] as usize, self.charge_at[charge as usize + 1] as usize);
        for &(link, ps) in &self.items[from..to] {
            let ahead = &mut self.ahead[link as usize];
            *ahead = ahead.saturating_sub(ps);
        }
        self.most = self.ahead.iter().copied().max().unwrap_or(0);
    }
}

/// The limit of a run with an [`EndLimit`], shared with whoever keeps a clone: the latest
/// its watched ends may come, which may only be tightened ([`LimitHandle::tighten`]), and the
/// furthest bound on them that the run's op starts have shown so far. A run reads the limit
/// at each op start, so a limit tightened by another thread takes effect at the next one.
#[derive(Debug, Clone)]
pub struct LimitHandle(std::sync::Arc<LimitState>);

/// What a [`LimitHandle`] shares, in picoseconds.
#[derive(Debug)]
struct LimitState {
    limit: std::sync::atomic::AtomicU64,
    highest: std::sync::atomic::AtomicU64,
}

impl LimitHandle {
    /// A limit of `limit` on the watched ends, no bound shown yet.
    pub fn new(limit: SimTime) -> LimitHandle {
        LimitHandle(std::sync::Arc::new(LimitState {
            limit: std::sync::atomic::AtomicU64::new(limit.as_ps()),
            highest: std::sync::atomic::AtomicU64::new(0),
        }))
    }

    /// The limit now.
    pub fn limit(&self) -> SimTime {
        SimTime::from_ps(self.0.limit.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Lowers the limit to `limit` if that is below it (a limit is never raised).
    pub fn tighten(&self, limit: SimTime) {
        self.0.limit.fetch_min(limit.as_ps(), std::sync::atomic::Ordering::Relaxed);
    }

    /// The furthest bound on the watched ends that an op start has shown so far (zero before
    /// any): a run given up showed one past its limit; a run that ended showed none past any
    /// limit it had.
    pub fn highest(&self) -> SimTime {
        SimTime::from_ps(self.0.highest.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Raises [`LimitHandle::highest`] to `bound` if that is above it (a run whose result
    /// another run of the same inputs gave records that run's).
    pub fn record(&self, bound: SimTime) {
        self.0.highest.fetch_max(bound.as_ps(), std::sync::atomic::Ordering::Relaxed);
    }
}

/// [`EndLimit::tails`] of an op from which no chain leads to a watched end.
const NO_TAIL: u64 = u64::MAX;

/// The [`Occupancy`] of a run of `graph`: the movements of the ops that lead to a watched end
/// (`tails`), each movement once (`movement_of` per op, into `movements`), summed per link;
/// the [`TRACKED_LINKS`] busiest links tracked.
fn occupancy(graph: &ExecGraph, tails: &[u64], movements: &[Least], movement_of: &[u32]) -> Occupancy {
    use crate::fast_hash::FastMap;
    // Each movement of an op before a watched end, once per collective (its members share
    // it) and once per transfer or copy op.
    let mut collective_counted = vec![false; graph.collectives().len()];
    let mut counted: Vec<(u32, u32)> = Vec::new(); // (op, movement)
    for (index, op) in graph.ops().iter().enumerate() {
        let movement = movement_of[index];
        if movement == u32::MAX
            || tails[index] == NO_TAIL
            || movements[movement as usize].occupancy.is_empty()
        {
            continue;
        }
        if let OpKind::Collective(collective) = op.kind {
            let seen = &mut collective_counted[collective.0 as usize];
            if *seen {
                continue;
            }
            *seen = true;
        }
        counted.push((index as u32, movement));
    }
    if counted.is_empty() {
        return Occupancy::default();
    }
    let mut totals: FastMap<topology::LinkId, u64> = FastMap::default();
    for &(_, movement) in &counted {
        for &(link, time) in &movements[movement as usize].occupancy {
            *totals.entry(link).or_default() += time.as_ps();
        }
    }
    let mut busiest: Vec<(topology::LinkId, u64)> = totals.into_iter().collect();
    busiest.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.0.cmp(&b.0.0)));
    busiest.truncate(TRACKED_LINKS);
    let tracked: FastMap<topology::LinkId, u16> =
        busiest.iter().enumerate().map(|(at, &(link, _))| (link, at as u16)).collect();
    let mut result = Occupancy {
        charge_of: vec![NO_CHARGE; graph.op_count()],
        charge_at: vec![0],
        items: Vec::new(),
        charged: Vec::new(),
        ahead: busiest.iter().map(|&(_, ps)| ps).collect(),
        most: busiest.first().map_or(0, |&(_, ps)| ps),
    };
    for &(op, movement) in &counted {
        let before = result.items.len();
        result.items.extend(
            movements[movement as usize]
                .occupancy
                .iter()
                .filter_map(|&(link, time)| tracked.get(&link).map(|&at| (at, time.as_ps()))),
        );
        if result.items.len() == before {
            continue;
        }
        let charge = result.charged.len() as u32;
        result.charged.push(false);
        result.charge_at.push(result.items.len() as u32);
        match graph.op(OpId(op)).kind {
            OpKind::Collective(collective) => {
                for &member in graph.members(collective) {
                    result.charge_of[member.0 as usize] = charge;
                }
            }
            _ => result.charge_of[op as usize] = charge,
        }
    }
    result
}

impl EndLimit {
    /// The limit `limit` on the last of `ends` (ops of `graph`) in a run of `graph`.
    ///
    /// # Panics
    ///
    /// If an op of `ends` is not in the graph.
    pub fn new(graph: &ExecGraph, ends: &[OpId], limit: SimTime) -> EndLimit {
        EndLimit::with_handle(graph, ends, LimitHandle::new(limit))
    }

    /// [`EndLimit::new`] with the limit of `handle`, which the caller may keep to tighten the
    /// limit during the run and read how far the run's bounds reached.
    ///
    /// # Panics
    ///
    /// If an op of `ends` is not in the graph.
    pub fn with_handle(graph: &ExecGraph, ends: &[OpId], handle: LimitHandle) -> EndLimit {
        let count = graph.op_count();
        assert!(ends.iter().all(|end| (end.0 as usize) < count), "a watched end is not in the graph");
        EndLimit {
            ends: ends.to_vec(),
            tails: Vec::new(),
            handle,
            highest: 0,
            occupancy: Occupancy::default(),
        }
    }

    /// Each op's least time to the last watched end ([`EndLimit::tails`]), with the floors
    /// `network` gives transfers, copies and collectives, and the occupancy of the links
    /// busiest over the run ([`Occupancy`]).
    fn prepare<N: Network>(&mut self, graph: &ExecGraph, network: &mut N) {
        use crate::fast_hash::FastMap;
        let count = graph.op_count();
        // What each distinct movement needs at least, asked once: `movements[i]`, found per
        // collective (by id) and per op of a transfer or copy.
        let mut movements: Vec<Least> = Vec::new();
        let mut distinct: FastMap<Collective, u32> = FastMap::default();
        let collectives: Vec<u32> = graph
            .collectives()
            .iter()
            .map(|collective| {
                *distinct.entry(*collective).or_insert_with(|| {
                    let group = graph.group(collective.group);
                    movements.push(network.least(Movement::Collective { collective, group }));
                    (movements.len() - 1) as u32
                })
            })
            .collect();
        let mut transfers: FastMap<(RankId, RankId, u64), u32> = FastMap::default();
        let mut copies: FastMap<(RankId, bool, u64), u32> = FastMap::default();
        let mut movement_of = vec![u32::MAX; count];
        for (index, op) in graph.ops().iter().enumerate() {
            let mut ask = |movement: Movement<'_>| {
                movements.push(network.least(movement));
                (movements.len() - 1) as u32
            };
            movement_of[index] = match op.kind {
                OpKind::Compute { .. } => continue,
                OpKind::Collective(collective) => collectives[collective.0 as usize],
                OpKind::Transfer { dst, bytes } => *transfers
                    .entry((op.rank, dst, bytes.0))
                    .or_insert_with(|| ask(Movement::Transfer { src: op.rank, dst, bytes })),
                OpKind::Memcpy { direction, bytes } => *copies
                    .entry((op.rank, direction == MemcpyDirection::HostToDevice, bytes.0))
                    .or_insert_with(|| ask(Movement::Memcpy { rank: op.rank, direction, bytes })),
            };
        }
        // The least time an op takes: a kernel its duration (less a margin for the rounding
        // of a slowed kernel's remaining share, which only takes longer), anything else the
        // network's floor.
        let least = |op: OpId| -> u64 {
            match graph.op(op).kind {
                OpKind::Compute { duration }
                    if graph.beside_communication(op).is_some_and(|beside| beside > duration) =>
                {
                    let ps = duration.as_ps();
                    ps.saturating_sub(ps / 1_000_000_000 + 1)
                }
                OpKind::Compute { duration } => duration.as_ps(),
                _ => movements[movement_of[op.0 as usize] as usize].time.as_ps(),
            }
        };
        // Ops walked backwards in an order where each comes after its dependencies and stream
        // predecessor: by number when every successor is numbered after its op (builders add
        // ops after what they wait for), else Kahn's order (a built graph has no cycle).
        let successors = |op: OpId| graph.dependents(op).iter().copied().chain(graph.next_in_stream(op));
        let numbered = (0..count as u32).map(OpId).all(|op| successors(op).all(|next| next.0 > op.0));
        let order: Vec<OpId> = if numbered {
            Vec::new()
        } else {
            let mut waiting: Vec<u32> = (0..count as u32)
                .map(OpId)
                .map(|op| graph.deps(op).len() as u32 + u32::from(graph.has_previous_in_stream(op)))
                .collect();
            let mut order: Vec<OpId> =
                (0..count as u32).map(OpId).filter(|op| waiting[op.0 as usize] == 0).collect();
            let mut next = 0;
            while let Some(&op) = order.get(next) {
                next += 1;
                for successor in successors(op) {
                    let waits = &mut waiting[successor.0 as usize];
                    *waits -= 1;
                    if *waits == 0 {
                        order.push(successor);
                    }
                }
            }
            order
        };
        let mut tails = vec![NO_TAIL; count];
        for &end in &self.ends {
            tails[end.0 as usize] = least(end);
        }
        let mut visit = |op: OpId| {
            let after = successors(op)
                .map(|successor| tails[successor.0 as usize])
                .filter(|&tail| tail != NO_TAIL)
                .max();
            if let Some(after) = after {
                let tail = least(op).saturating_add(after);
                let own = &mut tails[op.0 as usize];
                *own = if *own == NO_TAIL { tail } else { (*own).max(tail) };
            }
        };
        if numbered {
            (0..count as u32).rev().map(OpId).for_each(&mut visit);
        } else {
            order.iter().rev().copied().for_each(&mut visit);
        }
        self.occupancy = occupancy(graph, &tails, &movements, &movement_of);
        self.tails = tails;
    }

    /// The handle of this limit: tightens it during the run, tells how far its bounds reached.
    pub fn handle(&self) -> LimitHandle {
        self.handle.clone()
    }

    /// Whether `op`, starting at `now`, shows the ends cannot come by the limit.
    #[inline]
    fn check(&mut self, op: OpId, now: SimTime) -> Option<(SimTime, SimTime)> {
        let tail = self.tails.get(op.0 as usize).copied().unwrap_or(NO_TAIL);
        // The occupancy still ahead counts this op's movement, which has not moved yet; it
        // leaves the sums at the start of any op of it, whether or not that one leads to an end.
        let most = self.occupancy.most;
        self.occupancy.charge(op);
        if tail == NO_TAIL {
            return None;
        }
        let bound = now.as_ps().saturating_add(tail.max(most));
        if bound > self.highest {
            self.highest = bound;
            self.handle.record(SimTime::from_ps(bound));
        }
        let limit = self.handle.limit();
        (bound > limit.as_ps()).then(|| (SimTime::from_ps(bound), limit))
    }
}

/// When every op started and ended, plus engine counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeline {
    /// Start of each op (indexed by `OpId`): when its stream and dependencies released it.
    pub start: Vec<SimTime>,
    /// End of each op.
    pub end: Vec<SimTime>,
    /// When each collective began moving data: the arrival of its last member.
    pub collective_begin: Vec<SimTime>,
    /// The algorithm and protocol each collective ran with, as the network model resolved
    /// them (NCCL's tuner for `auto`); `None` where the model does not say.
    pub collective_choice: Vec<Option<Choice>>,
    /// Events popped from the queue.
    pub events: u64,
}

impl Timeline {
    /// Time from zero to the end of the last op.
    pub fn makespan(&self) -> SimDuration {
        self.end.iter().max().copied().unwrap_or(SimTime::ZERO).since_start()
    }
}

/// Runs `graph` to completion on `network`.
pub fn run<N: Network>(graph: &ExecGraph, network: &mut N) -> Result<Timeline, ExecError> {
    run_limited(graph, network, None)
}

/// Runs `graph` on `network` as [`run`] does, event for event, but gives up with
/// [`ExecError::PastLimit`] once `limit` shows its watched ends cannot come by it.
pub fn run_within<N: Network>(
    graph: &ExecGraph,
    network: &mut N,
    limit: EndLimit,
) -> Result<Timeline, ExecError> {
    run_limited(graph, network, Some(limit))
}

/// [`run`], or [`run_within`] with a limit.
pub(crate) fn run_limited<N: Network>(
    graph: &ExecGraph,
    network: &mut N,
    limit: Option<EndLimit>,
) -> Result<Timeline, ExecError> {
    let mut executor = Executor::new(graph.ranks(), graph.streams_per_rank(), graph.has_slowdowns());
    executor.limit = limit.map(|mut limit| {
        limit.prepare(graph, network);
        limit
    });
    let executor = execute(graph, network, executor)?;
    Ok(Timeline {
        start: executor.start,
        end: executor.end,
        collective_begin: executor.collective_begin,
        collective_choice: executor.collective_choice,
        events: executor.events,
    })
}

/// When the watched ops of a run ended ([`run_watching`]), and the events it popped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedEnds {
    /// The end of each watched op, in the order they were given.
    pub ends: Vec<SimTime>,
    /// Events popped from the queue ([`Timeline::events`]).
    pub events: u64,
}

/// Runs `graph` to completion on `network` as [`run`] does, event for event, but records the
/// ends of the `watched` ops alone: no start and end of every op (16 bytes per op of a
/// [`Timeline`]), for callers that read only a few ends (an iteration's last ops).
///
/// # Panics
///
/// If a watched op is not in the graph.
pub fn run_watching<N: Network>(
    graph: &ExecGraph,
    network: &mut N,
    watched: &[OpId],
) -> Result<WatchedEnds, ExecError> {
    let mut executor = Executor::new(graph.ranks(), graph.streams_per_rank(), graph.has_slowdowns());
    let mut sorted = watched.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert!(sorted.last().is_none_or(|last| (last.0 as usize) < graph.op_count()), "watched op out of range");
    let ends = vec![SimTime::ZERO; sorted.len()];
    executor.watched = Some((sorted, ends));
    let executor = execute(graph, network, executor)?;
    let (sorted, ends) = executor.watched.unwrap_or_default();
    let ends = watched
        .iter()
        .map(|op| sorted.binary_search(op).ok().and_then(|at| ends.get(at).copied()).unwrap_or(SimTime::ZERO))
        .collect();
    Ok(WatchedEnds { ends, events: executor.events })
}

/// Runs `graph` to completion on `network` with `executor` (new, holding no op) and returns it.
fn execute<N: Network>(
    graph: &ExecGraph,
    network: &mut N,
    mut executor: Executor<N::Event>,
) -> Result<Executor<N::Event>, ExecError> {
    executor.admit(graph, 0..graph.op_count() as u32, graph.collectives().len() as u32);
    if graph.ranks() as usize > network.host_count() {
        return Err(ExecError::TooFewHosts { ranks: graph.ranks(), hosts: network.host_count() });
    }
    let mut groups: Vec<GroupId> = graph.collectives().iter().map(|c| c.group).collect();
    groups.sort_unstable();
    groups.dedup();
    let mut pairs: Vec<(RankId, RankId)> = graph
        .ops()
        .iter()
        .filter_map(|op| match op.kind {
            OpKind::Transfer { dst, .. } => Some((op.rank, dst)),
            _ => None,
        })
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    executor.prepare_shadows(graph, network, &groups, &pairs);
    executor.start_ready(graph, network, 0..graph.op_count() as u32)?;
    while let Some((_, event)) = executor.queue.pop() {
        executor.process(graph, network, event)?;
    }
    if executor.finished < graph.op_count() {
        let first = executor.waiting_on.iter().position(|&waiting| waiting > 0).unwrap_or(0);
        return Err(ExecError::Stalled {
            time: executor.queue.now(),
            unfinished: graph.op_count() - executor.finished,
            op: graph.describe(OpId(first as u32)),
        });
    }
    Ok(executor)
}

/// What the executor reads of a graph: a whole [`ExecGraph`], or the window of a streamed one
/// ([`crate::stream::StreamGraph`]) that holds every op not yet finished.
pub(crate) trait View {
    /// Number of ranks.
    fn ranks(&self) -> u32;
    /// The op with id `id` (held by the view).
    fn op(&self, id: OpId) -> &Op;
    /// The held ops that name `id` as a dependency, in id order.
    fn dependents(&self, id: OpId) -> &[OpId];
    /// The next op on `id`'s (rank, stream), if the view holds one.
    fn next_in_stream(&self, id: OpId) -> Option<OpId>;
    /// The member ops of `collective`.
    fn members(&self, collective: CollectiveId) -> &[OpId];
    /// The collective with id `id`.
    fn collective(&self, id: CollectiveId) -> &Collective;
    /// The ranks of `group`.
    fn group(&self, group: GroupId) -> &[RankId];
    /// The symmetry's rank maps.
    fn images(&self) -> &[Vec<RankId>];
    /// A description of `op` for errors.
    fn describe(&self, op: OpId) -> String;
    /// A compute op's duration beside communication.
    fn beside_communication(&self, op: OpId) -> Option<SimDuration>;
    /// The explicit dependencies of `op`.
    fn deps(&self, op: OpId) -> &[OpId];
    /// Whether `op` has a previous op on its (rank, stream) (held or not) that `is_done` says
    /// has not finished.
    fn previous_pending(&self, op: OpId, is_done: impl Fn(OpId) -> bool) -> bool;
}

impl View for ExecGraph {
    fn ranks(&self) -> u32 {
        ExecGraph::ranks(self)
    }
    fn op(&self, id: OpId) -> &Op {
        ExecGraph::op(self, id)
    }
    fn dependents(&self, id: OpId) -> &[OpId] {
        ExecGraph::dependents(self, id)
    }
    fn next_in_stream(&self, id: OpId) -> Option<OpId> {
        ExecGraph::next_in_stream(self, id)
    }
    fn members(&self, collective: CollectiveId) -> &[OpId] {
        ExecGraph::members(self, collective)
    }
    fn collective(&self, id: CollectiveId) -> &Collective {
        ExecGraph::collective(self, id)
    }
    fn group(&self, group: GroupId) -> &[RankId] {
        ExecGraph::group(self, group)
    }
    fn images(&self) -> &[Vec<RankId>] {
        ExecGraph::images(self)
    }
    fn describe(&self, op: OpId) -> String {
        ExecGraph::describe(self, op)
    }
    fn beside_communication(&self, op: OpId) -> Option<SimDuration> {
        ExecGraph::beside_communication(self, op)
    }
    fn deps(&self, op: OpId) -> &[OpId] {
        ExecGraph::deps(self, op)
    }
    /// A whole graph is admitted before any of its ops runs ([`execute`]), so a stream
    /// predecessor has not finished: whether there is one is the answer, without the
    /// predecessor links (4 bytes per op), unless they are made already.
    fn previous_pending(&self, op: OpId, is_done: impl Fn(OpId) -> bool) -> bool {
        match self.known_previous_in_stream(op) {
            Some(previous) => previous.is_some_and(|previous| !is_done(previous)),
            None => self.has_previous_in_stream(op),
        }
    }
}

/// Mutable state of one run; the graph is only read, and passed to every step, so that a
/// streamed graph can grow between events. Per-op and per-collective state is held for a
/// window of ids, from `base` and `collective_base` on: a streamed run drops the finished
/// front ([`Executor::retire`]); a whole-graph run holds everything.
pub(crate) struct Executor<E> {
    pub(crate) queue: EventQueue<Event<E>>,
    /// The first op id held.
    pub(crate) base: u32,
    /// The first collective id held.
    pub(crate) collective_base: u32,
    /// Dependencies (including the stream predecessor) not yet finished, per held op.
    pub(crate) waiting_on: Vec<u32>,
    /// Whether each held op has finished.
    pub(crate) done: Vec<bool>,
    /// Members that have arrived, per held collective.
    arrived: Vec<u32>,
    /// Start of each held op.
    pub(crate) start: Vec<SimTime>,
    /// End of each held op.
    pub(crate) end: Vec<SimTime>,
    /// [`Timeline::collective_begin`] of each held collective.
    pub(crate) collective_begin: Vec<SimTime>,
    /// [`Timeline::collective_choice`] of each held collective.
    pub(crate) collective_choice: Vec<Option<Choice>>,
    /// Events popped from the queue.
    pub(crate) events: u64,
    /// Ops finished (held or dropped).
    pub(crate) finished: usize,
    /// Whether activities are replayed on the graph's symmetric images (see
    /// [`crate::graph::GraphBuilder::set_symmetry`]).
    shadows: bool,
    /// Per rank: some transfer or collective (or one of its images) moves data between it and
    /// another rank of its server, so its intra-server links may be shared.
    pub(crate) intra_server_active: Vec<bool>,
    /// The shadow groups of each group, computed on first use.
    shadow_groups: LookupMap<GroupId, Vec<Vec<RankId>>>,
    /// The shadow (source, destination) pairs of each transfer's pair, computed on first use.
    shadow_pairs: LookupMap<(RankId, RankId), Vec<(RankId, RankId)>>,
    /// Kernels slowed beside communication ([`crate::graph::GraphBuilder::compute_slowed`]);
    /// `None` when the graph has none, and then nothing below is tracked.
    slowdowns: Option<Slowdowns>,
    /// [`run_watching`]: the watched ops (sorted) and their ends, filled as they finish
    /// (all zero until then); `start` and `end` then stay empty. `None`: every op's times
    /// are kept.
    watched: Option<(Vec<OpId>, Vec<SimTime>)>,
    /// [`run_within`]'s limit (whole graphs only: indexed by `OpId`).
    limit: Option<EndLimit>,
}

/// The state of kernels that run slower while their rank communicates.
#[derive(Debug, Default)]
struct Slowdowns {
    /// Per rank: its transfers, copies and collective members running now (a transfer counts
    /// on both its ranks).
    communicating: Vec<u32>,
    /// Per rank: its slowed kernels running now.
    running: Vec<Vec<RunningKernel>>,
    /// Per held op: rate changes so far (an end scheduled at an older one is stale).
    generation: Vec<u32>,
}

/// A slowed kernel in progress.
#[derive(Debug, Clone, Copy)]
struct RunningKernel {
    op: OpId,
    /// Share of its work still to do.
    remaining: f64,
    /// When `remaining` was last brought up to date.
    updated: SimTime,
}

impl<E: Copy + std::fmt::Debug> Executor<E> {
    /// An executor holding no op yet.
    pub(crate) fn new(ranks: u32, streams_per_rank: u16, slowdowns: bool) -> Self {
        let queue_capacity = (ranks as usize * streams_per_rank as usize).max(16);
        Executor {
            queue: EventQueue::with_capacity(queue_capacity),
            base: 0,
            collective_base: 0,
            waiting_on: Vec::new(),
            done: Vec::new(),
            arrived: Vec::new(),
            start: Vec::new(),
            end: Vec::new(),
            collective_begin: Vec::new(),
            collective_choice: Vec::new(),
            events: 0,
            finished: 0,
            shadows: false,
            intra_server_active: Vec::new(),
            shadow_groups: LookupMap::new(),
            shadow_pairs: LookupMap::new(),
            slowdowns: slowdowns.then(|| Slowdowns {
                communicating: vec![0; ranks as usize],
                running: vec![Vec::new(); ranks as usize],
                generation: Vec::new(),
            }),
            watched: None,
            limit: None,
        }
    }

    /// Tracks kernels slowed beside communication from now on (a streamed run learns of them
    /// from its first chunk).
    pub(crate) fn enable_slowdowns(&mut self, ranks: u32) {
        if self.slowdowns.is_none() {
            self.slowdowns = Some(Slowdowns {
                communicating: vec![0; ranks as usize],
                running: vec![Vec::new(); ranks as usize],
                generation: vec![0; self.waiting_on.len()],
            });
        }
    }

    /// Index of held op `op` in the per-op vectors.
    fn at(&self, op: OpId) -> usize {
        (op.0 - self.base) as usize
    }

    /// Whether `op` has finished (a dropped op has).
    pub(crate) fn is_done(&self, op: OpId) -> bool {
        op.0 < self.base || self.done.get((op.0 - self.base) as usize).copied().unwrap_or(false)
    }

    /// Takes in `ops` (the next ids, in order, already in `graph`) and the collectives up to
    /// `collectives`: each waits for its dependencies and its stream predecessor that have not
    /// finished yet.
    pub(crate) fn admit<G: View>(&mut self, graph: &G, ops: std::ops::Range<u32>, collectives: u32) {
        for id in ops.map(OpId) {
            let waiting = graph.deps(id).iter().filter(|&&dep| !self.is_done(dep)).count() as u32
                + u32::from(graph.previous_pending(id, |previous| self.is_done(previous)));
            self.waiting_on.push(waiting);
            self.done.push(false);
            if self.watched.is_none() {
                self.start.push(SimTime::ZERO);
                self.end.push(SimTime::ZERO);
            }
            if let Some(state) = &mut self.slowdowns {
                state.generation.push(0);
            }
        }
        let held = self.collective_base as usize + self.arrived.len();
        for _ in held..collectives as usize {
            self.arrived.push(0);
            self.collective_begin.push(SimTime::ZERO);
            self.collective_choice.push(None);
        }
    }

    /// Drops the state of the ops before `op` and the collectives before `collective` (all
    /// finished).
    pub(crate) fn retire(&mut self, op: OpId, collective: CollectiveId) {
        let ops = (op.0 - self.base) as usize;
        self.waiting_on.drain(..ops);
        self.done.drain(..ops);
        // Empty under `run_watching`, which never retires.
        self.start.drain(..ops.min(self.start.len()));
        self.end.drain(..ops.min(self.end.len()));
        if let Some(state) = &mut self.slowdowns {
            state.generation.drain(..ops);
        }
        self.base = op.0;
        let collectives = (collective.0 - self.collective_base) as usize;
        self.arrived.drain(..collectives);
        self.collective_begin.drain(..collectives);
        self.collective_choice.drain(..collectives);
        self.collective_base = collective.0;
    }

    /// Starts the ops of `ops` that wait for nothing, in id order.
    pub(crate) fn start_ready<G: View, N: Network<Event = E>>(
        &mut self,
        graph: &G,
        network: &mut N,
        ops: std::ops::Range<u32>,
    ) -> Result<(), ExecError> {
        for op in ops.map(OpId) {
            if self.waiting_on[self.at(op)] == 0 {
                self.start(graph, op, network)?;
            }
        }
        Ok(())
    }

    /// A slowed kernel's durations alone and beside communication.
    fn durations<G: View>(graph: &G, op: OpId) -> (SimDuration, SimDuration) {
        let alone = match graph.op(op).kind {
            OpKind::Compute { duration } => duration,
            _ => SimDuration::ZERO,
        };
        (alone, graph.beside_communication(op).unwrap_or(alone))
    }

    /// Schedules the end of slowed kernel `kernel` at its current rate (`slowed` or not).
    fn schedule_kernel<G: View>(
        &mut self,
        graph: &G,
        kernel: RunningKernel,
        slowed: bool,
    ) -> Result<(), ExecError> {
        let (alone, beside) = Self::durations(graph, kernel.op);
        let full = if slowed { beside } else { alone };
        let delay = SimDuration::from_ps((kernel.remaining * full.as_ps() as f64).round() as u64);
        let index = self.at(kernel.op);
        let Some(state) = &mut self.slowdowns else { return Ok(()) };
        let generation = &mut state.generation[index];
        *generation = generation.wrapping_add(1);
        let event = Event::Done(Completion::Kernel { op: kernel.op, generation: *generation });
        self.queue
            .schedule_after(delay, event)
            .map(|_| ())
            .map_err(|source| ExecError::Time { op: graph.describe(kernel.op), source })
    }

    /// `rank` starts (`+1`) or stops (`-1`) one communication; when it goes from none to some
    /// or back, its running slowed kernels change rate.
    fn communicating<G: View>(&mut self, graph: &G, rank: RankId, change: i32) -> Result<(), ExecError> {
        let now = self.queue.now();
        let Some(state) = &mut self.slowdowns else { return Ok(()) };
        let count = &mut state.communicating[rank.0 as usize];
        let before = *count > 0;
        *count = count.saturating_add_signed(change);
        let after = *count > 0;
        if before == after {
            return Ok(());
        }
        let mut kernels = std::mem::take(&mut state.running[rank.0 as usize]);
        for kernel in &mut kernels {
            let (alone, beside) = Self::durations(graph, kernel.op);
            let full = if before { beside } else { alone };
            let elapsed = now.saturating_since(kernel.updated).as_ps() as f64;
            kernel.remaining = (kernel.remaining - elapsed / full.as_ps().max(1) as f64).max(0.0);
            kernel.updated = now;
            self.schedule_kernel(graph, *kernel, after)?;
        }
        if let Some(state) = &mut self.slowdowns {
            state.running[rank.0 as usize] = kernels;
        }
        Ok(())
    }

    /// The ranks that `groups` (the groups of the graph's collectives, sorted, no repeats)
    /// and `pairs` (its transfers' (source, destination), sorted, no repeats) mark as sharing
    /// their server's links: the intra-server traffic a confined shadow may not skip.
    pub(crate) fn intra_server_marks<G: View, N: Network<Event = E>>(
        graph: &G,
        network: &N,
        groups: &[GroupId],
        pairs: &[(RankId, RankId)],
    ) -> Vec<bool> {
        // A shadow confined to one server shares links only with traffic between ranks of
        // that server. Mark every rank that such traffic (of any op or of its images) reaches;
        // a confined shadow touching none of them changes nothing elsewhere and is skipped.
        let mut active = vec![false; graph.ranks() as usize];
        let mut mark = |ranks: &[RankId]| {
            let mut by_server: Vec<(u32, RankId)> =
                ranks.iter().filter_map(|r| network.server_of(*r).map(|s| (s, *r))).collect();
            by_server.sort_unstable();
            for pair in by_server.windows(2) {
                if pair[0].0 == pair[1].0 {
                    active[pair[0].1.0 as usize] = true;
                    active[pair[1].1.0 as usize] = true;
                }
            }
        };
        let identity: Vec<RankId> = (0..graph.ranks()).map(RankId).collect();
        let maps: Vec<&Vec<RankId>> = std::iter::once(&identity).chain(graph.images()).collect();
        // Real activities mark their servers' ranks; images only when they span servers (a
        // confined image is a candidate for skipping, not a reason to keep others).
        let spans_servers = |ranks: &[RankId]| {
            let first = ranks.first().and_then(|r| network.server_of(*r));
            ranks.iter().any(|r| network.server_of(*r) != first)
        };
        for &group in groups {
            for (index, map) in maps.iter().enumerate() {
                let mapped: Vec<RankId> = graph.group(group).iter().map(|r| map[r.0 as usize]).collect();
                if index == 0 || spans_servers(&mapped) {
                    mark(&mapped);
                }
            }
        }
        for &(src, dst) in pairs {
            // A transfer inside one server marks only as itself (its images would be skipped).
            mark(&[src, dst]);
        }
        active
    }

    /// Prepares shadows: on when the graph has images and the network has contention.
    pub(crate) fn prepare_shadows<G: View, N: Network<Event = E>>(
        &mut self,
        graph: &G,
        network: &N,
        groups: &[GroupId],
        pairs: &[(RankId, RankId)],
    ) {
        self.shadows = !graph.images().is_empty() && network.carries_shadows();
        if !self.shadows {
            return;
        }
        self.intra_server_active = Self::intra_server_marks(graph, network, groups, pairs);
    }

    /// Whether shadows are played.
    pub(crate) fn shadows(&self) -> bool {
        self.shadows
    }

    /// Whether `ranks` all live on one server and no other traffic shares their links there.
    fn confined_to_quiet_server<N: Network<Event = E>>(&self, network: &N, ranks: &[RankId]) -> bool {
        let Some(first) = ranks.first().and_then(|r| network.server_of(*r)) else { return false };
        ranks.iter().all(|r| network.server_of(*r) == Some(first) && !self.intra_server_active[r.0 as usize])
    }

    /// The images of `group` that are distinct from it and from each other, and not confined
    /// to a quiet server.
    fn shadow_groups_of<G: View, N: Network<Event = E>>(
        &self,
        graph: &G,
        network: &N,
        group: GroupId,
    ) -> Vec<Vec<RankId>> {
        let members = graph.group(group);
        let mut key: Vec<RankId> = members.to_vec();
        key.sort_unstable();
        let mut seen = vec![key];
        let mut result = Vec::new();
        for image in graph.images() {
            let mapped: Vec<RankId> = members.iter().map(|r| image[r.0 as usize]).collect();
            let mut key = mapped.clone();
            key.sort_unstable();
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            if !self.confined_to_quiet_server(network, &mapped) {
                result.push(mapped);
            }
        }
        result
    }

    /// The images of the transfer pair `(src, dst)`, distinct from it and from each other, and
    /// not confined to a quiet server.
    fn shadow_pairs_of<G: View, N: Network<Event = E>>(
        &self,
        graph: &G,
        network: &N,
        src: RankId,
        dst: RankId,
    ) -> Vec<(RankId, RankId)> {
        let mut pairs: Vec<(RankId, RankId)> = graph
            .images()
            .iter()
            .map(|image| (image[src.0 as usize], image[dst.0 as usize]))
            .filter(|&pair| pair != (src, dst))
            .filter(|&(s, d)| !self.confined_to_quiet_server(network, &[s, d]))
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        pairs
    }

    /// Handles one popped event: finishes the ops it completes (starting those that waited
    /// only for them) or passes it to the network.
    pub(crate) fn process<G: View, N: Network<Event = E>>(
        &mut self,
        graph: &G,
        network: &mut N,
        event: Event<E>,
    ) -> Result<(), ExecError> {
        self.events += 1;
        match event {
            Event::Done(Completion::Op(op)) => {
                if self.slowdowns.is_some() {
                    match graph.op(op).kind {
                        OpKind::Transfer { dst, .. } => {
                            self.communicating(graph, graph.op(op).rank, -1)?;
                            self.communicating(graph, dst, -1)?;
                        }
                        OpKind::Memcpy { .. } => self.communicating(graph, graph.op(op).rank, -1)?,
                        _ => {}
                    }
                }
                self.finish(graph, op, network)
            }
            Event::Done(Completion::Kernel { op, generation }) => {
                let rank = graph.op(op).rank.0 as usize;
                let index = self.at(op);
                let Some(state) = &mut self.slowdowns else { return Ok(()) };
                if state.generation[index] != generation {
                    return Ok(()); // rescheduled since
                }
                state.running[rank].retain(|kernel| kernel.op != op);
                self.finish(graph, op, network)
            }
            Event::Done(Completion::Collective(collective)) => {
                for &member in graph.members(collective) {
                    if self.slowdowns.is_some() {
                        self.communicating(graph, graph.op(member).rank, -1)?;
                    }
                    self.finish(graph, member, network)?;
                }
                Ok(())
            }
            Event::Done(Completion::Shadow) => Ok(()),
            Event::Network(event) => {
                let mut context = NetContext { queue: &mut self.queue };
                network
                    .handle(&mut context, event)
                    .map_err(|source| ExecError::Network { op: "network event".into(), source })
            }
        }
    }

    /// The ops `event` would finish if processed now (a stale kernel end finishes none).
    pub(crate) fn finishes<G: View>(&self, graph: &G, event: &Event<E>) -> Option<OpId> {
        match *event {
            Event::Done(Completion::Op(op)) => Some(op),
            Event::Done(Completion::Kernel { op, generation }) => {
                let state = self.slowdowns.as_ref()?;
                (state.generation[self.at(op)] == generation).then_some(op)
            }
            Event::Done(Completion::Collective(collective)) => graph.members(collective).last().copied(),
            Event::Done(Completion::Shadow) | Event::Network(_) => None,
        }
    }

    /// Records `op` done and starts every op that was waiting only for it.
    fn finish<G: View, N: Network<Event = E>>(
        &mut self,
        graph: &G,
        op: OpId,
        network: &mut N,
    ) -> Result<(), ExecError> {
        let index = self.at(op);
        match &mut self.watched {
            None => self.end[index] = self.queue.now(),
            Some((watched, ends)) => {
                if let Ok(at) = watched.binary_search(&op) {
                    ends[at] = self.queue.now();
                }
            }
        }
        self.done[index] = true;
        self.finished += 1;
        for &next in graph.dependents(op).iter().chain(graph.next_in_stream(op).as_ref()) {
            let index = self.at(next);
            let waiting = &mut self.waiting_on[index];
            *waiting -= 1;
            if *waiting == 0 {
                self.start(graph, next, network)?;
            }
        }
        Ok(())
    }

    fn start<G: View, N: Network<Event = E>>(
        &mut self,
        graph: &G,
        op: OpId,
        network: &mut N,
    ) -> Result<(), ExecError> {
        let now = self.queue.now();
        if let Some(limit) = &mut self.limit
            && let Some((bound, limit)) = limit.check(op, now)
        {
            return Err(ExecError::PastLimit { op: graph.describe(op), bound, limit });
        }
        if self.watched.is_none() {
            let index = self.at(op);
            self.start[index] = now;
        }
        let spec = graph.op(op);
        let network_error = |source| ExecError::Network { op: graph.describe(op), source };
        match spec.kind {
            OpKind::Compute { duration } => {
                if let Some(state) = &mut self.slowdowns
                    && graph.beside_communication(op).is_some_and(|beside| beside > duration)
                {
                    let kernel = RunningKernel { op, remaining: 1.0, updated: now };
                    state.running[spec.rank.0 as usize].push(kernel);
                    let slowed = state.communicating[spec.rank.0 as usize] > 0;
                    return self.schedule_kernel(graph, kernel, slowed);
                }
                self.queue
                    .schedule_after(duration, Event::Done(Completion::Op(op)))
                    .map(|_| ())
                    .map_err(|source| ExecError::Time { op: graph.describe(op), source })
            }
            OpKind::Transfer { dst, bytes } => {
                if self.slowdowns.is_some() {
                    self.communicating(graph, spec.rank, 1)?;
                    self.communicating(graph, dst, 1)?;
                }
                network
                    .start_transfer(
                        &mut NetContext { queue: &mut self.queue },
                        Completion::Op(op),
                        spec.rank,
                        dst,
                        bytes,
                    )
                    .map_err(network_error)?;
                if self.shadows {
                    // Taken out of the cache while the network uses the queue, then put back.
                    let key = (spec.rank, dst);
                    let pairs = match self.shadow_pairs.remove(&key) {
                        Some(pairs) => pairs,
                        None => self.shadow_pairs_of(graph, network, spec.rank, dst),
                    };
                    for &(src, dst) in &pairs {
                        network
                            .start_transfer(
                                &mut NetContext { queue: &mut self.queue },
                                Completion::Shadow,
                                src,
                                dst,
                                bytes,
                            )
                            .map_err(network_error)?;
                    }
                    self.shadow_pairs.insert(key, pairs);
                }
                Ok(())
            }
            OpKind::Memcpy { direction, bytes } => {
                if self.slowdowns.is_some() {
                    self.communicating(graph, spec.rank, 1)?;
                }
                network
                    .start_memcpy(
                        &mut NetContext { queue: &mut self.queue },
                        Completion::Op(op),
                        spec.rank,
                        direction,
                        bytes,
                    )
                    .map_err(network_error)
            }
            OpKind::Collective(collective) => {
                // A member's kernel occupies its GPU from its launch, before the others arrive.
                if self.slowdowns.is_some() {
                    self.communicating(graph, spec.rank, 1)?;
                }
                let held = (collective.0 - self.collective_base) as usize;
                let arrived = &mut self.arrived[held];
                *arrived += 1;
                if *arrived as usize != graph.members(collective).len() {
                    return Ok(());
                }
                self.collective_begin[held] = now;
                let collective_spec = graph.collective(collective);
                network
                    .start_collective(
                        &mut NetContext { queue: &mut self.queue },
                        Completion::Collective(collective),
                        collective_spec,
                        graph.group(collective_spec.group),
                    )
                    .map_err(network_error)?;
                self.collective_choice[held] = network.chosen(collective_spec);
                if self.shadows {
                    let group = collective_spec.group;
                    let shadows = match self.shadow_groups.remove(&group) {
                        Some(shadows) => shadows,
                        None => self.shadow_groups_of(graph, network, group),
                    };
                    for shadow in &shadows {
                        network
                            .start_collective(
                                &mut NetContext { queue: &mut self.queue },
                                Completion::Shadow,
                                collective_spec,
                                shadow,
                            )
                            .map_err(network_error)?;
                    }
                    self.shadow_groups.insert(group, shadows);
                }
                Ok(())
            }
        }
    }
}
