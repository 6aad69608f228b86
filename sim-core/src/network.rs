//! The seam between the executor and the network models, and the `analytical` model.
//!
//! The executor hands every data movement to a [`Network`] together with a [`Completion`]
//! token, and the network reports the token back through the [`NetContext`] when the movement
//! is done: immediately known for the analytical model, or later, after its own timer events,
//! for a flow-level model whose rates change as other flows come and go. The interface is the
//! whole contract: start a transfer, a collective or a copy; handle your own event.

use crate::lookup::LookupMap;
use std::fmt;

use std::collections::BTreeMap;
use std::collections::hash_map::Entry;

use topology::{HostId, LinkId, Route, Topology, TopologyError};
use units::{Bandwidth, Bytes, SimDuration, SimTime, TimeOverflow, UnitError};

use crate::collective::{LevelLatencies, PathCost, StepNetwork, pipeline_time_by_steps};
use crate::fast_hash::FastMap;
use crate::graph::{Collective, CollectiveId, MemcpyDirection, OpId, RankId};
use crate::nccl::choice::choose_for;
use crate::nccl::network::NcclNetwork;
use crate::nccl::protocol::{Choice, Hop, ProtocolChoice};
use crate::nccl::timing::time_of;
use crate::nccl::tuner::{GpuGeneration, TunerFabric};
use crate::queue::EventQueue;
use crate::schedule::{CollectiveError, Pipeline, PipelineSteps, Schedule};

/// What a finished data movement completes: one op, or every member op of a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// A transfer, copy or compute op.
    Op(OpId),
    /// All member ops of a collective.
    Collective(CollectiveId),
    /// A shadow: the copy of a transfer or collective on a symmetric image of its ranks, which
    /// loads the network but nothing waits for.
    Shadow,
    /// A compute op that runs slower beside communication, as scheduled at its `generation`th
    /// rate change: an end scheduled before a later change is stale (the executor's own).
    Kernel {
        /// The op.
        op: OpId,
        /// Its rate changes when this end was scheduled.
        generation: u32,
    },
}

/// An event of the engine's queue: a completion, or a network model's own timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<E> {
    /// Something finished.
    Done(Completion),
    /// The network model asked to be woken up.
    Network(E),
}

/// The network model's window on the event queue.
pub struct NetContext<'q, E> {
    pub(crate) queue: &'q mut EventQueue<Event<E>>,
}

impl<E: Copy> NetContext<'_, E> {
    /// The current simulated time.
    pub fn now(&self) -> SimTime {
        self.queue.now()
    }

    /// True if another event is due at the current time: a model that batches its work per
    /// instant waits until this is false.
    pub fn more_due_now(&self) -> bool {
        self.queue.has_due_now()
    }

    /// Reports `token` done `delay` from now.
    pub fn complete_after(&mut self, delay: SimDuration, token: Completion) -> Result<(), TimeOverflow> {
        self.queue.schedule_after(delay, Event::Done(token)).map(|_| ())
    }

    /// Wakes the network model with `event` `delay` from now.
    pub fn wake_after(&mut self, delay: SimDuration, event: E) -> Result<(), TimeOverflow> {
        self.queue.schedule_after(delay, Event::Network(event)).map(|_| ())
    }
}

/// A network model could not carry out a movement.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The topology has no host for a rank, or no path between two.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// A collective could not be timed.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// A time went past the end of representable time.
    #[error(transparent)]
    Time(#[from] TimeOverflow),
    /// A quantity was out of range.
    #[error(transparent)]
    Unit(#[from] units::UnitError),
    /// The run passed the work budget it was given (`FlowNetwork::with_work_budget`).
    #[error("gave up: the simulation passed its work budget of {budget} flow and link updates")]
    OverBudget {
        /// The budget, in the flow model's units of work (`FlowStats::work`).
        budget: u64,
    },
}

/// A network model: moves data between ranks and reports when it is done.
pub trait Network {
    /// The model's own timer events (`std::convert::Infallible` if it needs none).
    type Event: Copy + fmt::Debug;

    /// The model's name in reports (`analytical`, `flow`, ...).
    fn name(&self) -> &'static str;

    /// Number of hosts; rank `r` runs on host `r`.
    fn host_count(&self) -> usize;

    /// Whether shadows (copies of activities on symmetric ranks) can change this model's
    /// timing: true for models with contention.
    fn carries_shadows(&self) -> bool {
        true
    }

    /// The server (node) of `rank`, if the model knows it: a shadow confined to a server with no
    /// simulated rank cannot share a link with simulated traffic and is skipped.
    fn server_of(&self, rank: RankId) -> Option<u32> {
        let _ = rank;
        None
    }

    /// Starts sending `bytes` from `src` to `dst`; report `token` when the last byte arrives.
    fn start_transfer(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        src: RankId,
        dst: RankId,
        bytes: Bytes,
    ) -> Result<(), NetworkError>;

    /// Starts `collective` over `group` (every member has arrived); report `token` when done.
    fn start_collective(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        collective: &Collective,
        group: &[RankId],
    ) -> Result<(), NetworkError>;

    /// Starts a host <-> device copy on `rank`; report `token` when done.
    fn start_memcpy(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        rank: RankId,
        direction: MemcpyDirection,
        bytes: Bytes,
    ) -> Result<(), NetworkError>;

    /// The algorithm and protocol `collective` ran with, once started (what `auto` resolved
    /// to); `None` if the model does not resolve them.
    fn chosen(&self, collective: &Collective) -> Option<Choice> {
        let _ = collective;
        None
    }

    /// Handles one of the model's own events.
    fn handle(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        event: Self::Event,
    ) -> Result<(), NetworkError>;

    /// What `movement` needs at least on this model, whatever else the network carries then:
    /// what [`crate::exec::EndLimit`] counts for the op, so that a run certain to end past its
    /// limit is given up sooner. Nothing, the default, is always right; a model that gives
    /// more must never give a run less.
    fn least(&mut self, movement: Movement<'_>) -> Least {
        let _ = movement;
        Least::default()
    }
}

/// What a movement needs at least on a network model ([`Network::least`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Least {
    /// A floor on its time from its start (a collective's: from the arrival of its last
    /// member) to its end.
    pub time: SimDuration,
    /// Per link (each once), a floor on the time the link spends carrying it. Under a model
    /// that never loads a link past its capacity the occupancies of the movements that cross
    /// a link add up: the link cannot carry them all in less than their sum. Empty where the
    /// model lets movements share no link's capacity (`analytical`).
    pub occupancy: Vec<(LinkId, SimDuration)>,
}

/// A movement of data an op asks of a network model, as [`Network::least`] floors it.
#[derive(Debug, Clone, Copy)]
pub enum Movement<'a> {
    /// `bytes` from `src` to `dst`.
    Transfer {
        /// The sender.
        src: RankId,
        /// The receiver.
        dst: RankId,
        /// Message size.
        bytes: Bytes,
    },
    /// `collective` over `group`.
    Collective {
        /// The collective.
        collective: &'a Collective,
        /// Its ranks, in ring order.
        group: &'a [RankId],
    },
    /// A host <-> device copy of `bytes` on `rank`.
    Memcpy {
        /// The GPU's rank.
        rank: RankId,
        /// Which way.
        direction: MemcpyDirection,
        /// How much.
        bytes: Bytes,
    },
}

/// Rank pairs' paths (route and latency), each computed once. Paths are kept in the order
/// they were first asked for, so a collective that walks its pairs in the same order every step
/// (an all-to-all: each source's destinations in turn) reads them sequentially. Pairs are found
/// through a table indexed by source and destination on clusters of up to
/// [`PathCache::DENSE_HOSTS`] hosts (4 bytes per pair), else through a hash map.
#[derive(Debug)]
struct PathCache {
    hosts: usize,
    dense: Vec<u32>,
    sparse: FastMap<(u32, u32), u32>,
    paths: Vec<(Route, SimDuration)>,
}

impl PathCache {
    /// The largest cluster indexed by a table: 16 MB of indices at 2048 hosts.
    const DENSE_HOSTS: usize = 2048;
    /// The most paths kept (about 80 MB): every pair of 1024 ranks, as an all-to-all over
    /// them needs. Beyond, pairs are routed every time.
    const LIMIT: usize = 1 << 20;
    const NONE: u32 = u32::MAX;

    fn new(hosts: usize) -> Self {
        PathCache { hosts, dense: Vec::new(), sparse: FastMap::default(), paths: Vec::new() }
    }

    fn slot(&self, src: u32, dst: u32) -> Option<usize> {
        let (src, dst) = (src as usize, dst as usize);
        (self.hosts <= Self::DENSE_HOSTS && src < self.hosts && dst < self.hosts)
            .then(|| src * self.hosts + dst)
    }

    fn get(&self, src: u32, dst: u32) -> Option<(Route, SimDuration)> {
        let index = match self.slot(src, dst) {
            Some(slot) => *self.dense.get(slot)?,
            None => *self.sparse.get(&(src, dst))?,
        };
        self.paths.get(index as usize).copied()
    }

    fn insert(&mut self, src: u32, dst: u32, path: (Route, SimDuration)) {
        if self.paths.len() >= Self::LIMIT {
            return;
        }
        let index = self.paths.len() as u32;
        match self.slot(src, dst) {
            Some(slot) => {
                if self.dense.is_empty() {
                    self.dense = vec![Self::NONE; self.hosts * self.hosts];
                }
                self.dense[slot] = index;
            }
            None => {
                self.sparse.insert((src, dst), index);
            }
        }
        self.paths.push(path);
    }
}

/// The `analytical` fidelity: alpha-beta costs on topology paths, no contention with other
/// traffic.
///
/// A message costs the sum of the link latencies on its path plus its size over the bandwidth
/// it gets; collectives use the step-by-step closed forms of [`crate::collective`] (with the
/// NCCL model's choice and overheads, [`crate::nccl`]), in which
/// the messages of one step share the links they cross. Rank `r` runs on host `r`. A
/// collective's time depends only on the collective, so each distinct one is computed once.
#[derive(Debug)]
pub struct AnalyticalNetwork<'t> {
    topology: &'t Topology,
    /// Messages of the step being timed on each link; all zero between steps.
    link_load: Vec<u64>,
    /// The links whose load is non-zero, to clear them after the step.
    loaded_links: Vec<LinkId>,
    /// Serialization time of each loaded link's share of the step being timed (valid for the
    /// links in `loaded_links`): computed once per link, not once per message crossing it.
    /// Empty until the first step is timed.
    link_time: Vec<SimDuration>,
    /// Times of the collectives already seen, and what ran them.
    known_collectives: LookupMap<Collective, (SimDuration, Choice)>,
    /// Fixed cost of every collective (see [`AnalyticalNetwork::with_collective_launch`]).
    collective_launch: SimDuration,
    /// Chunk size of pipelined collective algorithms.
    chunk: Bytes,
    /// Which protocols collectives use.
    protocols: ProtocolChoice,
    /// The GPUs' generation, for NCCL's tuner.
    generation: GpuGeneration,
    /// The GPUs' copy rate within their own memory (see [`NcclNetwork::device_copy`]).
    device_copy: Option<units::Bandwidth>,
    /// Scratch: the routes of the step being timed, one per message.
    step_routes: Vec<Route>,
    /// Each rank pair's route and path latency, found once (the analytical model routes
    /// without a flow, so a pair's route never changes): collectives over large groups time
    /// the same pairs step after step and size after size.
    paths: PathCache,
    /// What the levels of each pipelined tree seen so far put on the links, by the tree's
    /// levels (NCCL's tree over a group is the same for every collective of the group).
    tree_levels: TreeCache,
    /// The loaded links of a pipeline's step, counted by bandwidth and load.
    load_counts: LoadCounts,
}

/// What the levels of a pipelined tree ([`Pipeline`]) put on the links of a topology.
#[derive(Debug)]
struct LevelLoads {
    /// Each level's hops' path latencies.
    latencies: Vec<LevelLatencies>,
    /// Each level's messages on each link its hops cross, as (link, messages).
    links: Vec<Vec<(LinkId, u64)>>,
}

/// The links loaded by a pipeline's step, counted by bandwidth and load: a step's busiest
/// link is found from these counts as levels come and go, without visiting every link. A
/// link's time for a step depends only on its bandwidth and its load, so the slowest of the
/// links is the slowest of the (bandwidth, load) pairs that some link has.
#[derive(Debug, Default)]
struct LoadCounts {
    /// The bandwidth class of each link of the topology (empty until a pipeline is timed).
    class: Vec<u32>,
    /// The bandwidth of each class.
    bandwidths: Vec<Bandwidth>,
    /// `links[class][load]`: how many links of the class carry `load` messages (`load` > 0),
    /// without trailing zeros, so a class's largest load is its length minus one.
    links: Vec<Vec<u64>>,
}

impl LoadCounts {
    /// Classes for the links of `topology`, if not done yet.
    fn classify(&mut self, topology: &Topology) {
        if self.class.len() == topology.link_count() {
            return;
        }
        let mut classes = BTreeMap::new();
        self.bandwidths.clear();
        self.class.clear();
        for link in 0..topology.link_count() {
            let bandwidth = topology.link(LinkId(link as u32)).bandwidth;
            let class = *classes.entry(bandwidth).or_insert_with(|| {
                self.bandwidths.push(bandwidth);
                self.bandwidths.len() as u32 - 1
            });
            self.class.push(class);
        }
        self.links = vec![Vec::new(); self.bandwidths.len()];
    }

    /// Adds a level's messages to the links' loads (`loads`, indexed by link).
    fn add(&mut self, loads: &mut [u64], level: &[(LinkId, u64)]) {
        for &(link, messages) in level {
            let load = &mut loads[link.0 as usize];
            let counts = &mut self.links[self.class[link.0 as usize] as usize];
            if *load > 0 {
                counts[*load as usize] -= 1;
            }
            *load += messages;
            if counts.len() <= *load as usize {
                counts.resize(*load as usize + 1, 0);
            }
            counts[*load as usize] += 1;
        }
    }

    /// Takes a level's messages off the links' loads.
    fn remove(&mut self, loads: &mut [u64], level: &[(LinkId, u64)]) {
        for &(link, messages) in level {
            let load = &mut loads[link.0 as usize];
            let counts = &mut self.links[self.class[link.0 as usize] as usize];
            counts[*load as usize] -= 1;
            *load -= messages;
            if *load > 0 {
                counts[*load as usize] += 1;
            }
            while counts.last() == Some(&0) {
                counts.pop();
            }
        }
    }

    /// The time of a pipeline of `levels` on the links: its levels' longest path latencies
    /// plus, for every step, its busiest link's time (at least the steps' floor, a channel's own
    /// time for its chunk), each level's loads added when the level starts and removed when it ends.
    /// `loads` is zero on every link before and after.
    fn time_steps(
        &mut self,
        loads: &mut [u64],
        levels: &LevelLoads,
        steps: PipelineSteps,
        bytes: Bytes,
        den: u64,
    ) -> Result<SimDuration, NetworkError> {
        let mut active = 0..0;
        let time = self.step_through(loads, levels, steps, bytes, den, &mut active);
        // Whatever happened, the loads go back to zero for the next pipeline or step.
        for level in &levels.links[active] {
            self.remove(loads, level);
        }
        time
    }

    /// The steps of [`LoadCounts::time_steps`] (`active`: the levels loaded on return).
    fn step_through(
        &mut self,
        loads: &mut [u64],
        levels: &LevelLoads,
        steps: PipelineSteps,
        bytes: Bytes,
        den: u64,
        active: &mut std::ops::Range<usize>,
    ) -> Result<SimDuration, NetworkError> {
        let mut total = SimDuration::ZERO;
        for level in &levels.latencies {
            total = total.checked_add(level.longest())?;
        }
        let mut step = 0;
        while step < steps.count() {
            let now = steps.active_levels(step);
            while active.end < now.end {
                self.add(loads, &levels.links[active.end]);
                active.end += 1;
            }
            while active.start < now.start {
                self.remove(loads, &levels.links[active.start]);
                active.start += 1;
            }
            let next = steps.next_change(step);
            let busiest = self.busiest(bytes, den)?.max(steps.floor);
            total = total.checked_add(busiest.checked_mul(next - step)?)?;
            step = next;
        }
        Ok(total)
    }

    /// The time of the busiest loaded link for its load: each load `load / den` of `bytes`.
    fn busiest(&self, bytes: Bytes, den: u64) -> Result<SimDuration, NetworkError> {
        let mut step = SimDuration::ZERO;
        for (&bandwidth, counts) in self.bandwidths.iter().zip(&self.links) {
            if let Some(load) = counts.len().checked_sub(1).filter(|&load| load > 0) {
                step = step.max(share_time(bandwidth, load as u64, bytes, den)?);
            }
        }
        Ok(step)
    }
}

/// How long a link of `bandwidth` takes to carry `load / den` of `bytes`.
fn share_time(bandwidth: Bandwidth, load: u64, bytes: Bytes, den: u64) -> Result<SimDuration, NetworkError> {
    let shared = bytes.0.checked_mul(load).map(Bytes).ok_or_else(|| UnitError::OutOfRange {
        input: format!("{load}/{den} of {bytes}"),
        quantity: "link load",
        reason: "more than 16 EiB",
    })?;
    Ok(bandwidth.time_to_send_share(shared, den)?)
}

/// What each of a tree's levels (`hops`, see [`Pipeline::levels`]) puts on the links of
/// `topology`, and its hops' path latencies. `loads` (zero on every link) and `loaded` are
/// scratch, left as they were found.
fn level_loads(
    topology: &Topology,
    loads: &mut [u64],
    loaded: &mut Vec<LinkId>,
    hops: &[Vec<(RankId, RankId)>],
) -> Result<LevelLoads, NetworkError> {
    let mut latencies = Vec::with_capacity(hops.len());
    let mut links = Vec::with_capacity(hops.len());
    for level in hops {
        let mut level_latencies = LevelLatencies::default();
        for &(src, dst) in level {
            let hop = topology.node_of(HostId(src.0)).and_then(|server| {
                Ok((
                    server != topology.node_of(HostId(dst.0))?,
                    topology.route(HostId(src.0), HostId(dst.0))?,
                ))
            });
            let (across, route) = match hop {
                Ok(hop) => hop,
                Err(error) => {
                    for link in loaded.drain(..) {
                        loads[link.0 as usize] = 0;
                    }
                    return Err(error.into());
                }
            };
            let mut latency = SimDuration::ZERO;
            for &link in route.iter() {
                latency = latency.saturating_add(topology.link(link).latency);
                let load = &mut loads[link.0 as usize];
                if *load == 0 {
                    loaded.push(link);
                }
                *load += 1;
            }
            level_latencies.add(across, latency);
        }
        latencies.push(level_latencies);
        links
            .push(loaded.drain(..).map(|link| (link, std::mem::take(&mut loads[link.0 as usize]))).collect());
    }
    Ok(LevelLoads { latencies, links })
}

/// The trees seen so far by their levels' hops: looked up, never iterated, so the fast hash
/// (over a few hundred thousand rank pairs for a large tree) keeps results deterministic.
type TreeCache = FastMap<Vec<Vec<(RankId, RankId)>>, LevelLoads>;

impl<'t> AnalyticalNetwork<'t> {
    /// An analytical model over `topology`.
    pub fn new(topology: &'t Topology) -> Self {
        AnalyticalNetwork {
            topology,
            link_load: vec![0; topology.link_count()],
            loaded_links: Vec::new(),
            // Made when first needed (`time_loaded_links`): a flow network's estimator that
            // times no step never touches it.
            link_time: Vec::new(),
            known_collectives: LookupMap::new(),
            collective_launch: SimDuration::ZERO,
            chunk: Bytes(crate::schedule::CHUNK_BYTES),
            protocols: ProtocolChoice::Off,
            generation: GpuGeneration::default(),
            device_copy: None,
            step_routes: Vec::new(),
            paths: PathCache::new(topology.host_count()),
            tree_levels: TreeCache::default(),
            load_counts: LoadCounts::default(),
        }
    }

    /// A fresh model on the same topology with the same settings (launch cost, chunk,
    /// protocols, generation, copy rate) and nothing computed yet.
    pub(crate) fn same_settings(&self) -> AnalyticalNetwork<'t> {
        AnalyticalNetwork::new(self.topology)
            .with_collective_launch(self.collective_launch)
            .with_chunk(self.chunk)
            .with_protocols(self.protocols)
            .with_generation(self.generation)
            .with_device_copy(self.device_copy)
    }

    /// The same model tuning for GPUs of `generation` (NCCL's tuning tables differ by it).
    pub fn with_generation(mut self, generation: GpuGeneration) -> Self {
        self.generation = generation;
        self
    }

    /// The same model with collectives run by `protocols` (see [`crate::nccl::protocol`]).
    pub fn with_protocols(mut self, protocols: ProtocolChoice) -> Self {
        self.protocols = protocols;
        self
    }

    /// The same model on GPUs that copy within their memory at `rate` (`None`: unknown; see
    /// [`NcclNetwork::device_copy`]).
    pub fn with_device_copy(mut self, rate: Option<units::Bandwidth>) -> Self {
        self.device_copy = rate;
        self
    }

    /// The same model with pipelined collective algorithms (tree, chain) cut into chunks of at
    /// most `chunk` (1 MiB by default).
    pub fn with_chunk(mut self, chunk: Bytes) -> Self {
        self.chunk = Bytes(chunk.0.max(1));
        self
    }

    /// The same model with a fixed cost added to every collective before its data moves: the
    /// communication library's launch and synchronisation overhead (zero by default: pure
    /// network).
    pub fn with_collective_launch(mut self, launch: SimDuration) -> Self {
        self.collective_launch = launch;
        self
    }

    /// The route between two ranks (rank r runs on host r).
    fn route(&mut self, src: RankId, dst: RankId) -> Result<Route, NetworkError> {
        Ok(self.path(src, dst)?.0)
    }

    /// The route between two ranks and the sum of its links' latencies, computed once per pair.
    fn path(&mut self, src: RankId, dst: RankId) -> Result<(Route, SimDuration), NetworkError> {
        if let Some(path) = self.paths.get(src.0, dst.0) {
            return Ok(path);
        }
        let route = self.topology.route(HostId(src.0), HostId(dst.0))?;
        let latency = self.topology.route_latency(&route);
        self.paths.insert(src.0, dst.0, (route, latency));
        Ok((route, latency))
    }

    /// See [`StepNetwork::step_time`]; `link_load` sums the numerators of the step's messages
    /// on each link.
    fn time_step(
        &mut self,
        messages: &[(RankId, RankId, u64)],
        bytes: Bytes,
        den: u64,
    ) -> Result<SimDuration, NetworkError> {
        self.time_step_with(messages, bytes, den, true)
    }

    /// [`AnalyticalNetwork::time_step`], with or without the messages' path latencies.
    fn time_step_with(
        &mut self,
        messages: &[(RankId, RankId, u64)],
        bytes: Bytes,
        den: u64,
        with_latency: bool,
    ) -> Result<SimDuration, NetworkError> {
        if let [(src, dst, num)] = *messages {
            // A lone message (every point-to-point transfer) has its links to itself.
            let route = [self.route(src, dst)?];
            return self.slowest_message(&[(src, dst, num)], &route, bytes, den, true, with_latency);
        }
        // Each message's route once: for the loads, then for the times.
        let mut routes = std::mem::take(&mut self.step_routes);
        routes.clear();
        for &(src, dst, num) in messages {
            let route = self.route(src, dst)?;
            for &link in route.iter() {
                let load = &mut self.link_load[link.0 as usize];
                if *load == 0 {
                    self.loaded_links.push(link);
                }
                *load += num;
            }
            routes.push(route);
        }
        let step = self
            .time_loaded_links(bytes, den)
            .and_then(|()| self.slowest_message(messages, &routes, bytes, den, false, with_latency));
        self.step_routes = routes;
        for link in self.loaded_links.drain(..) {
            self.link_load[link.0 as usize] = 0;
        }
        step
    }

    /// Each loaded link's time for its load of the step being timed, into `link_time`.
    fn time_loaded_links(&mut self, bytes: Bytes, den: u64) -> Result<(), NetworkError> {
        if self.link_time.is_empty() {
            self.link_time = vec![SimDuration::ZERO; self.topology.link_count()];
        }
        for index in 0..self.loaded_links.len() {
            let link = self.loaded_links[index];
            self.link_time[link.0 as usize] =
                self.link_share_time(link, self.link_load[link.0 as usize], bytes, den)?;
        }
        Ok(())
    }

    /// How long `link` takes to carry `load / den` of `bytes`.
    fn link_share_time(
        &self,
        link: LinkId,
        load: u64,
        bytes: Bytes,
        den: u64,
    ) -> Result<SimDuration, NetworkError> {
        share_time(self.topology.link(link).bandwidth, load, bytes, den)
    }

    /// [`StepNetwork::pipeline_time`] by the pipeline's levels: the same time as step by step
    /// ([`pipeline_time_by_steps`]), since a step's messages are the hops of its active levels
    /// and a step's transfer time is its busiest link's, but each level's routes are found
    /// once per tree (and kept for the next collective over the same tree), and a step adds
    /// or removes whole levels' link loads instead of routing its messages.
    fn time_pipeline(
        &mut self,
        pipeline: Pipeline,
        bytes: Bytes,
        den: u64,
    ) -> Result<SimDuration, NetworkError> {
        let steps = pipeline.steps();
        let levels = match self.tree_levels.entry(pipeline.levels) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => {
                let levels =
                    level_loads(self.topology, &mut self.link_load, &mut self.loaded_links, entry.key())?;
                entry.insert(levels)
            }
        };
        self.load_counts.classify(self.topology);
        self.load_counts.time_steps(&mut self.link_load, levels, steps, bytes, den)
    }

    /// The longest time of the step's messages given the link loads and their times (or,
    /// `alone`, as if each message had its links to itself).
    fn slowest_message(
        &self,
        messages: &[(RankId, RankId, u64)],
        routes: &[Route],
        bytes: Bytes,
        den: u64,
        alone: bool,
        with_latency: bool,
    ) -> Result<SimDuration, NetworkError> {
        let mut step = SimDuration::ZERO;
        for (&(_, _, num), route) in messages.iter().zip(routes) {
            let mut latency = SimDuration::ZERO;
            let mut serialization = SimDuration::ZERO;
            for &link in route.iter() {
                let spec = self.topology.link(link);
                latency = latency.checked_add(spec.latency)?;
                let time = if alone {
                    self.link_share_time(link, num, bytes, den)?
                } else {
                    // Zero where no step has timed the link (all of them before the first).
                    self.link_time.get(link.0 as usize).copied().unwrap_or(SimDuration::ZERO)
                };
                serialization = serialization.max(time);
            }
            step = step.max(if with_latency { latency.checked_add(serialization)? } else { serialization });
        }
        Ok(step)
    }
}

impl StepNetwork for AnalyticalNetwork<'_> {
    fn node_of(&self, rank: RankId) -> Result<u32, CollectiveError> {
        self.topology.node_of(HostId(rank.0)).map_err(|error| CollectiveError::Network(error.to_string()))
    }

    fn chunk(&self) -> Bytes {
        self.chunk
    }

    fn path_latency(&mut self, src: RankId, dst: RankId) -> Result<SimDuration, CollectiveError> {
        Ok(self.path(src, dst).map_err(|error| CollectiveError::Network(error.to_string()))?.1)
    }

    fn step_time(
        &mut self,
        messages: &[(RankId, RankId, u64)],
        bytes: Bytes,
        den: u64,
    ) -> Result<SimDuration, CollectiveError> {
        self.time_step(messages, bytes, den).map_err(|error| CollectiveError::Network(error.to_string()))
    }

    fn step_transfer_time(
        &mut self,
        messages: &[(RankId, RankId, u64)],
        bytes: Bytes,
        den: u64,
    ) -> Result<SimDuration, CollectiveError> {
        self.time_step_with(messages, bytes, den, false)
            .map_err(|error| CollectiveError::Network(error.to_string()))
    }

    fn pipeline_time(&mut self, schedule: &Schedule) -> Result<SimDuration, CollectiveError> {
        let Some(pipeline) = schedule.pipeline() else { return pipeline_time_by_steps(self, schedule) };
        let (bytes, den) = schedule.fraction();
        self.time_pipeline(pipeline, bytes, den).map_err(|error| CollectiveError::Network(error.to_string()))
    }

    fn level_latencies(&mut self, pipeline: &Pipeline) -> Result<Vec<LevelLatencies>, CollectiveError> {
        if let Some(levels) = self.tree_levels.get(pipeline.levels.as_slice()) {
            return Ok(levels.latencies.clone());
        }
        let levels =
            level_loads(self.topology, &mut self.link_load, &mut self.loaded_links, &pipeline.levels)
                .map_err(|error| CollectiveError::Network(error.to_string()))?;
        let latencies = levels.latencies.clone();
        self.tree_levels.insert(pipeline.levels.clone(), levels);
        Ok(latencies)
    }
}

impl NcclNetwork for AnalyticalNetwork<'_> {
    fn intra_hop(&self) -> Hop {
        match self.topology.spec().intra_node {
            topology::IntraNode::PcieSwitch(_) => Hop::Pci,
            topology::IntraNode::NvSwitch(_) | topology::IntraNode::NvLinkMesh(_) => Hop::NvLink,
        }
    }

    fn message_overhead(&self) -> SimDuration {
        self.topology.spec().network.transport.message_overhead
    }

    fn channel_overhead(&self) -> SimDuration {
        self.topology.spec().network.transport.channel_overhead
    }

    fn ll_host_rate(&self) -> Option<units::Bandwidth> {
        self.topology.spec().network.transport.ll_host_rate
    }

    fn device_copy(&self) -> Option<units::Bandwidth> {
        self.device_copy
    }

    fn collective_launch(&self) -> SimDuration {
        self.collective_launch
    }

    fn protocols(&self) -> ProtocolChoice {
        self.protocols
    }

    fn nvls(&self) -> bool {
        matches!(self.topology.spec().intra_node, topology::IntraNode::NvSwitch(_))
    }

    fn sharp(&self) -> bool {
        self.topology.spec().network.transport.sharp
    }

    fn nccl(&self) -> topology::NcclSettings {
        self.topology.spec().network.transport.nccl
    }

    fn tuner_fabric(&self) -> Option<TunerFabric> {
        let spec = self.topology.spec();
        let gb = |bandwidth: units::Bandwidth| bandwidth.bytes_per_second() / 1e9;
        let intra = gb(spec.intra_node.link().bandwidth);
        let nic = spec.network.fabric.terminal_link().map_or(intra, |link| gb(link.bandwidth));
        Some(TunerFabric {
            intra,
            intra_hop: self.intra_hop(),
            nic,
            nic_line_rate: nic / spec.network.transport.efficiency,
            nics_per_node: spec.network.nics_per_node.unwrap_or(spec.gpus_per_node),
            net_latency_us: self.message_overhead().as_ps() as f64 / 1e6,
            generation: self.generation,
            amd_hosts: spec.network.transport.host_cpu == topology::HostCpu::Amd,
            nccl: spec.network.transport.nccl_version,
        })
    }
}

impl Network for AnalyticalNetwork<'_> {
    type Event = std::convert::Infallible;

    fn name(&self) -> &'static str {
        "analytical"
    }

    fn host_count(&self) -> usize {
        self.topology.host_count()
    }

    fn carries_shadows(&self) -> bool {
        false // no contention: a copy elsewhere changes nothing here
    }

    fn start_transfer(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        src: RankId,
        dst: RankId,
        bytes: Bytes,
    ) -> Result<(), NetworkError> {
        let time = self.transfer_time(src, dst, bytes)?;
        Ok(context.complete_after(time, token)?)
    }

    fn start_collective(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        collective: &Collective,
        group: &[RankId],
    ) -> Result<(), NetworkError> {
        let time = self.collective_time(collective, group)?;
        // The time includes the collective's fixed cost (launch, or protocol base latency).
        Ok(context.complete_after(time, token)?)
    }

    fn chosen(&self, collective: &Collective) -> Option<Choice> {
        self.known_collectives.get(collective).map(|&(_, choice)| choice)
    }

    fn start_memcpy(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        rank: RankId,
        direction: MemcpyDirection,
        bytes: Bytes,
    ) -> Result<(), NetworkError> {
        let time = self.memcpy_time(rank, direction, bytes)?;
        Ok(context.complete_after(time, token)?)
    }

    fn handle(
        &mut self,
        _context: &mut NetContext<'_, Self::Event>,
        event: Self::Event,
    ) -> Result<(), NetworkError> {
        match event {}
    }

    /// Exact times: every movement takes the time it is started with, which depends on the
    /// movement alone (no contention, so no occupancy either). A movement that cannot be timed
    /// gets no floor (its start fails).
    fn least(&mut self, movement: Movement<'_>) -> Least {
        let time = match movement {
            Movement::Transfer { src, dst, bytes } => self.transfer_time(src, dst, bytes),
            Movement::Collective { collective, group } => self.collective_time(collective, group),
            Movement::Memcpy { rank, direction, bytes } => self.memcpy_time(rank, direction, bytes),
        };
        Least { time: time.unwrap_or(SimDuration::ZERO), occupancy: Vec::new() }
    }
}

impl AnalyticalNetwork<'_> {
    /// The time of `bytes` from `src` to `dst`: a lone message on its path.
    fn transfer_time(&mut self, src: RankId, dst: RankId, bytes: Bytes) -> Result<SimDuration, NetworkError> {
        self.time_step(&[(src, dst, 1)], bytes, 1)
    }

    /// The time of `collective` over `group`, its fixed cost included: the tuner's choice,
    /// then that choice's time, each computed once per distinct collective (the choice is
    /// kept for [`Network::chosen`]).
    fn collective_time(
        &mut self,
        collective: &Collective,
        group: &[RankId],
    ) -> Result<SimDuration, NetworkError> {
        if let Some(&(time, _)) = self.known_collectives.get(collective) {
            return Ok(time);
        }
        // As `analytical_time`: the choice, then its time.
        let choice = choose_for(collective.kind, collective.algorithm, collective.bytes, group, self)?;
        let time = time_of(collective.kind, choice, collective.bytes, group, self)?;
        self.known_collectives.insert(*collective, (time, choice));
        Ok(time)
    }

    /// The time of a host <-> device copy of `bytes` on `rank`: each link of its route in turn.
    fn memcpy_time(
        &self,
        rank: RankId,
        direction: MemcpyDirection,
        bytes: Bytes,
    ) -> Result<SimDuration, NetworkError> {
        let to_device = direction == MemcpyDirection::HostToDevice;
        let route = self.topology.host_memory_route(HostId(rank.0), to_device)?;
        let mut time = SimDuration::ZERO;
        for &link in route.iter() {
            let link = self.topology.link(link);
            let cost = PathCost { latency: link.latency, bandwidth: link.bandwidth };
            time = time.checked_add(cost.time_for_share(bytes, 1)?)?;
        }
        Ok(time)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::level_latencies_by_hops;
    use crate::graph::{CollectiveAlgorithm, CollectiveKind};
    use crate::nccl::overhead::{level_extra, step_extra};
    use crate::nccl::protocol::{Choice, Family, Protocol};
    use crate::nccl::timing::time_of;
    use topology::{ClusterSpec, FabricSpec, IntraNode, LinkSpec, NetworkSpec, XgftSpec};

    fn link(bandwidth: &str, latency: &str) -> LinkSpec {
        LinkSpec::new(bandwidth.parse().unwrap(), latency.parse().unwrap())
    }

    /// `nodes` servers of `gpus` GPUs on an NVSwitch, on `network`.
    fn cluster(nodes: u32, gpus: u32, network: NetworkSpec) -> Topology {
        let intra_node = IntraNode::NvSwitch(link("300 GB/s", "0.7 us"));
        Topology::build(&ClusterSpec { nodes, gpus_per_node: gpus, intra_node, network, host_memory: None })
            .unwrap()
    }

    /// Clusters whose trees load links differently: one NIC per GPU on one switch; fat-trees
    /// (D-mod-K routes through shared uplinks); two GPUs per NIC (a NIC carries two chains);
    /// rail-optimized leaves.
    fn clusters() -> Vec<Topology> {
        let nic = link("200 Gb/s", "1 us");
        let fat_tree = |k, levels| {
            let mut links = vec![nic, link("400 Gb/s", "0.5 us"), link("800 Gb/s", "0.3 us")];
            links.truncate(levels as usize);
            NetworkSpec::new(FabricSpec::FatTree(XgftSpec::k_ary(k, levels, links).unwrap()))
        };
        let shared_nics = NetworkSpec {
            nics_per_node: Some(2),
            gpu_to_nic: Some(link("32 GB/s", "0.2 us")),
            ..fat_tree(6, 2)
        };
        let rails = NetworkSpec { rail_optimized: true, ..fat_tree(8, 2) };
        vec![
            cluster(2, 8, NetworkSpec::single_switch(nic)),
            cluster(5, 8, NetworkSpec::single_switch(nic)),
            cluster(16, 4, NetworkSpec::single_switch(nic)),
            cluster(16, 1, fat_tree(4, 3)),
            cluster(7, 4, shared_nics),
            cluster(4, 8, rails),
        ]
    }

    /// Groups over `hosts` ranks: everyone, an odd number of servers with a short last one, and
    /// everyone in a scrambled order.
    fn groups(hosts: u32) -> Vec<Vec<RankId>> {
        let all: Vec<RankId> = (0..hosts).map(RankId).collect();
        let uneven = all[..(hosts * 3 / 5).max(2) as usize].to_vec();
        let mut scrambled = all.clone();
        scrambled.sort_by_key(|rank| (rank.0 * 7 + 3) % hosts);
        scrambled.reverse();
        vec![all, uneven, scrambled]
    }

    /// The analytical network without its level-based timing of trees: every pipeline timed
    /// message by message, step by step, through the defaults of [`StepNetwork`].
    struct MessageByMessage<'n, 't>(&'n mut AnalyticalNetwork<'t>);

    impl StepNetwork for MessageByMessage<'_, '_> {
        fn node_of(&self, rank: RankId) -> Result<u32, CollectiveError> {
            self.0.node_of(rank)
        }
        fn chunk(&self) -> Bytes {
            self.0.chunk()
        }
        fn path_latency(&mut self, src: RankId, dst: RankId) -> Result<SimDuration, CollectiveError> {
            self.0.path_latency(src, dst)
        }
        fn step_transfer_time(
            &mut self,
            messages: &[(RankId, RankId, u64)],
            bytes: Bytes,
            den: u64,
        ) -> Result<SimDuration, CollectiveError> {
            self.0.step_transfer_time(messages, bytes, den)
        }
        fn step_time(
            &mut self,
            messages: &[(RankId, RankId, u64)],
            bytes: Bytes,
            den: u64,
        ) -> Result<SimDuration, CollectiveError> {
            self.0.step_time(messages, bytes, den)
        }
    }

    impl NcclNetwork for MessageByMessage<'_, '_> {
        fn intra_hop(&self) -> Hop {
            self.0.intra_hop()
        }
        fn message_overhead(&self) -> SimDuration {
            self.0.message_overhead()
        }
        fn channel_overhead(&self) -> SimDuration {
            self.0.channel_overhead()
        }
        fn ll_host_rate(&self) -> Option<units::Bandwidth> {
            self.0.ll_host_rate()
        }
        fn collective_launch(&self) -> SimDuration {
            self.0.collective_launch()
        }
        fn protocols(&self) -> ProtocolChoice {
            self.0.protocols()
        }
        fn nvls(&self) -> bool {
            self.0.nvls()
        }
        fn sharp(&self) -> bool {
            self.0.sharp()
        }
        fn nccl(&self) -> topology::NcclSettings {
            self.0.nccl()
        }
        fn tuner_fabric(&self) -> Option<TunerFabric> {
            self.0.tuner_fabric()
        }
        fn device_copy(&self) -> Option<units::Bandwidth> {
            self.0.device_copy()
        }
    }

    #[test]
    fn a_tree_with_its_protocols_takes_as_long_by_levels_as_message_by_message() {
        let protocols = [None, Some(Protocol::Ll), Some(Protocol::Ll128), Some(Protocol::Simple)];
        for topology in clusters() {
            let mut network = AnalyticalNetwork::new(&topology)
                .with_protocols(ProtocolChoice::Auto)
                .with_collective_launch(SimDuration::from_us(8));
            for group in groups(topology.host_count() as u32) {
                for bytes in [8u64, 100_000, 3 << 20, 64 << 20, 1 << 30] {
                    for protocol in protocols {
                        let choice = Choice { algorithm: CollectiveAlgorithm::Tree, protocol };
                        let kind = CollectiveKind::AllReduce;
                        let by_levels = time_of(kind, choice, Bytes(bytes), &group, &mut network).unwrap();
                        let by_steps =
                            time_of(kind, choice, Bytes(bytes), &group, &mut MessageByMessage(&mut network))
                                .unwrap();
                        assert_eq!(
                            by_levels,
                            by_steps,
                            "{} servers, group of {}, {bytes} bytes by {choice}",
                            topology.spec().nodes,
                            group.len()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_tree_timed_by_its_levels_takes_as_long_as_message_by_message() {
        for topology in clusters() {
            let mut network = AnalyticalNetwork::new(&topology);
            for group in groups(topology.host_count() as u32) {
                let chunk = Bytes(1 << 16);
                let tree = |bytes| {
                    Schedule::with_chunk(
                        CollectiveKind::AllReduce,
                        CollectiveAlgorithm::Tree,
                        Bytes(bytes),
                        &group,
                        |rank| Ok(topology.node_of(HostId(rank.0)).unwrap()),
                        chunk,
                    )
                    .unwrap()
                };
                let lanes = tree(1).lanes().len() as u64;
                // Fewer chunks than levels, about as many, and a long steady state; twice, the
                // second time from the kept levels.
                for chunks in [1, 2, 5, 9, 10, 11, 12, 40, 1, 40] {
                    let schedule = tree(lanes * chunk.0 * chunks - 5);
                    assert_eq!(schedule.pipeline().unwrap().chunks, chunks);
                    let by_levels = network.pipeline_time(&schedule).unwrap();
                    let by_steps = pipeline_time_by_steps(&mut network, &schedule).unwrap();
                    let pipeline = schedule.pipeline().unwrap();
                    let latencies = network.level_latencies(&pipeline).unwrap();
                    assert_eq!(latencies, level_latencies_by_hops(&mut network, &pipeline).unwrap());
                    // A level's protocol latency, from each kind of hop's shortest path, is its
                    // slowest hop's, hop by hop.
                    for (level, &latencies) in pipeline.levels.iter().zip(&latencies) {
                        let hops: Vec<_> = level.iter().map(|&(src, dst)| (src, dst, 1)).collect();
                        for (protocol, family, multi_server) in [
                            (Protocol::Ll, Family::Tree, true),
                            (Protocol::Ll128, Family::Tree, false),
                            (Protocol::Simple, Family::Ring, true),
                        ] {
                            assert_eq!(
                                level_extra(protocol, family, multi_server, latencies, &network),
                                step_extra(protocol, family, multi_server, false, &hops, &mut network)
                                    .unwrap()
                            );
                        }
                    }
                    assert_eq!(
                        by_levels,
                        by_steps,
                        "{} servers, group of {}, {chunks} chunks",
                        topology.spec().nodes,
                        group.len()
                    );
                }
            }
            assert!(network.link_load.iter().all(|&load| load == 0), "the loads are cleared after each tree");
            assert!(network.load_counts.links.iter().all(Vec::is_empty));
        }
    }
}
