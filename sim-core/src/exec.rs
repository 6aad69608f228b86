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

use crate::graph::{ExecGraph, GroupId, OpId, OpKind, RankId};
use crate::nccl::protocol::Choice;
use crate::network::{Completion, Event, NetContext, Network, NetworkError};
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
    Executor::new(graph).run(network)
}

/// Mutable state of one run; the graph is only read.
struct Executor<'g, E> {
    graph: &'g ExecGraph,
    queue: EventQueue<Event<E>>,
    /// Dependencies (including the stream predecessor) not yet finished, per op.
    waiting_on: Vec<u32>,
    /// Members that have arrived, per collective.
    arrived: Vec<u32>,
    timeline: Timeline,
    finished: usize,
    /// Whether activities are replayed on the graph's symmetric images (see
    /// [`crate::graph::GraphBuilder::set_symmetry`]).
    shadows: bool,
    /// Per rank: some transfer or collective (or one of its images) moves data between it and
    /// another rank of its server, so its intra-server links may be shared.
    intra_server_active: Vec<bool>,
    /// The shadow groups of each group, computed on first use.
    shadow_groups: LookupMap<GroupId, Vec<Vec<RankId>>>,
    /// The shadow (source, destination) pairs of each transfer's pair, computed on first use.
    shadow_pairs: LookupMap<(RankId, RankId), Vec<(RankId, RankId)>>,
    /// Kernels slowed beside communication ([`crate::graph::GraphBuilder::compute_slowed`]);
    /// `None` when the graph has none, and then nothing below is tracked.
    slowdowns: Option<Slowdowns>,
}

/// The state of kernels that run slower while their rank communicates.
#[derive(Debug, Default)]
struct Slowdowns {
    /// Per rank: its transfers, copies and collective members running now (a transfer counts
    /// on both its ranks).
    communicating: Vec<u32>,
    /// Per rank: its slowed kernels running now.
    running: Vec<Vec<RunningKernel>>,
    /// Per op: rate changes so far (an end scheduled at an older one is stale).
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

impl<'g, E: Copy + std::fmt::Debug> Executor<'g, E> {
    fn new(graph: &'g ExecGraph) -> Self {
        let op_count = graph.op_count();
        let waiting_on = (0..op_count as u32)
            .map(OpId)
            .map(|op| graph.deps(op).len() as u32 + u32::from(graph.previous_in_stream(op).is_some()))
            .collect();
        let queue_capacity = (graph.ranks() as usize * graph.streams_per_rank() as usize).max(16);
        Executor {
            graph,
            queue: EventQueue::with_capacity(queue_capacity),
            waiting_on,
            arrived: vec![0; graph.collectives().len()],
            timeline: Timeline {
                start: vec![SimTime::ZERO; op_count],
                end: vec![SimTime::ZERO; op_count],
                collective_begin: vec![SimTime::ZERO; graph.collectives().len()],
                collective_choice: vec![None; graph.collectives().len()],
                events: 0,
            },
            finished: 0,
            shadows: false,
            intra_server_active: Vec::new(),
            shadow_groups: LookupMap::new(),
            shadow_pairs: LookupMap::new(),
            slowdowns: graph.has_slowdowns().then(|| Slowdowns {
                communicating: vec![0; graph.ranks() as usize],
                running: vec![Vec::new(); graph.ranks() as usize],
                generation: vec![0; op_count],
            }),
        }
    }

    /// A slowed kernel's durations alone and beside communication.
    fn durations(&self, op: OpId) -> (SimDuration, SimDuration) {
        let alone = match self.graph.op(op).kind {
            OpKind::Compute { duration } => duration,
            _ => SimDuration::ZERO,
        };
        (alone, self.graph.beside_communication(op).unwrap_or(alone))
    }

    /// Schedules the end of slowed kernel `kernel` at its current rate (`slowed` or not).
    fn schedule_kernel(&mut self, kernel: RunningKernel, slowed: bool) -> Result<(), ExecError> {
        let (alone, beside) = self.durations(kernel.op);
        let full = if slowed { beside } else { alone };
        let delay = SimDuration::from_ps((kernel.remaining * full.as_ps() as f64).round() as u64);
        let Some(state) = &mut self.slowdowns else { return Ok(()) };
        let generation = &mut state.generation[kernel.op.0 as usize];
        *generation = generation.wrapping_add(1);
        let event = Event::Done(Completion::Kernel { op: kernel.op, generation: *generation });
        self.queue
            .schedule_after(delay, event)
            .map(|_| ())
            .map_err(|source| ExecError::Time { op: self.graph.describe(kernel.op), source })
    }

    /// `rank` starts (`+1`) or stops (`-1`) one communication; when it goes from none to some
    /// or back, its running slowed kernels change rate.
    fn communicating(&mut self, rank: RankId, change: i32) -> Result<(), ExecError> {
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
            let (alone, beside) = self.durations(kernel.op);
            let full = if before { beside } else { alone };
            let elapsed = now.saturating_since(kernel.updated).as_ps() as f64;
            kernel.remaining = (kernel.remaining - elapsed / full.as_ps().max(1) as f64).max(0.0);
            kernel.updated = now;
            self.schedule_kernel(*kernel, after)?;
        }
        if let Some(state) = &mut self.slowdowns {
            state.running[rank.0 as usize] = kernels;
        }
        Ok(())
    }

    /// Prepares shadows: on when the graph has images and the network has contention.
    fn prepare_shadows<N: Network<Event = E>>(&mut self, network: &N) {
        self.shadows = !self.graph.images().is_empty() && network.carries_shadows();
        if !self.shadows {
            return;
        }
        // A shadow confined to one server shares links only with traffic between ranks of
        // that server. Mark every rank that such traffic (of any op or of its images) reaches;
        // a confined shadow touching none of them changes nothing elsewhere and is skipped.
        let graph = self.graph;
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
        let mut groups: Vec<GroupId> = graph.collectives().iter().map(|c| c.group).collect();
        groups.sort_unstable();
        groups.dedup();
        // Real activities mark their servers' ranks; images only when they span servers (a
        // confined image is a candidate for skipping, not a reason to keep others).
        let spans_servers = |ranks: &[RankId]| {
            let first = ranks.first().and_then(|r| network.server_of(*r));
            ranks.iter().any(|r| network.server_of(*r) != first)
        };
        for group in groups {
            for (index, map) in maps.iter().enumerate() {
                let mapped: Vec<RankId> = graph.group(group).iter().map(|r| map[r.0 as usize]).collect();
                if index == 0 || spans_servers(&mapped) {
                    mark(&mapped);
                }
            }
        }
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
        for (src, dst) in pairs {
            // A transfer inside one server marks only as itself (its images would be skipped).
            mark(&[src, dst]);
        }
        self.intra_server_active = active;
    }

    /// Whether `ranks` all live on one server and no other traffic shares their links there.
    fn confined_to_quiet_server<N: Network<Event = E>>(&self, network: &N, ranks: &[RankId]) -> bool {
        let Some(first) = ranks.first().and_then(|r| network.server_of(*r)) else { return false };
        ranks.iter().all(|r| network.server_of(*r) == Some(first) && !self.intra_server_active[r.0 as usize])
    }

    /// The images of `group` that are distinct from it and from each other, and not confined
    /// to a quiet server.
    fn shadow_groups_of<N: Network<Event = E>>(&self, network: &N, group: GroupId) -> Vec<Vec<RankId>> {
        let members = self.graph.group(group);
        let mut key: Vec<RankId> = members.to_vec();
        key.sort_unstable();
        let mut seen = vec![key];
        let mut result = Vec::new();
        for image in self.graph.images() {
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
    fn shadow_pairs_of<N: Network<Event = E>>(
        &self,
        network: &N,
        src: RankId,
        dst: RankId,
    ) -> Vec<(RankId, RankId)> {
        let mut pairs: Vec<(RankId, RankId)> = self
            .graph
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

    fn run<N: Network<Event = E>>(mut self, network: &mut N) -> Result<Timeline, ExecError> {
        if self.graph.ranks() as usize > network.host_count() {
            return Err(ExecError::TooFewHosts { ranks: self.graph.ranks(), hosts: network.host_count() });
        }
        self.prepare_shadows(network);
        for op in (0..self.graph.op_count() as u32).map(OpId) {
            if self.waiting_on[op.0 as usize] == 0 {
                self.start(op, network)?;
            }
        }
        while let Some((_, event)) = self.queue.pop() {
            self.timeline.events += 1;
            match event {
                Event::Done(Completion::Op(op)) => {
                    if self.slowdowns.is_some() {
                        match self.graph.op(op).kind {
                            OpKind::Transfer { dst, .. } => {
                                self.communicating(self.graph.op(op).rank, -1)?;
                                self.communicating(dst, -1)?;
                            }
                            OpKind::Memcpy { .. } => self.communicating(self.graph.op(op).rank, -1)?,
                            _ => {}
                        }
                    }
                    self.finish(op, network)?
                }
                Event::Done(Completion::Kernel { op, generation }) => {
                    let rank = self.graph.op(op).rank.0 as usize;
                    let Some(state) = &mut self.slowdowns else { continue };
                    if state.generation[op.0 as usize] != generation {
                        continue; // rescheduled since
                    }
                    state.running[rank].retain(|kernel| kernel.op != op);
                    self.finish(op, network)?
                }
                Event::Done(Completion::Collective(collective)) => {
                    for &member in self.graph.members(collective) {
                        if self.slowdowns.is_some() {
                            self.communicating(self.graph.op(member).rank, -1)?;
                        }
                        self.finish(member, network)?;
                    }
                }
                Event::Done(Completion::Shadow) => {}
                Event::Network(event) => {
                    let mut context = NetContext { queue: &mut self.queue };
                    network
                        .handle(&mut context, event)
                        .map_err(|source| ExecError::Network { op: "network event".into(), source })?;
                }
            }
        }
        if self.finished < self.graph.op_count() {
            let first = self.waiting_on.iter().position(|&waiting| waiting > 0).unwrap_or(0);
            return Err(ExecError::Stalled {
                time: self.queue.now(),
                unfinished: self.graph.op_count() - self.finished,
                op: self.graph.describe(OpId(first as u32)),
            });
        }
        Ok(self.timeline)
    }

    /// Records `op` done and starts every op that was waiting only for it.
    fn finish<N: Network<Event = E>>(&mut self, op: OpId, network: &mut N) -> Result<(), ExecError> {
        self.timeline.end[op.0 as usize] = self.queue.now();
        self.finished += 1;
        let graph = self.graph;
        for &next in graph.dependents(op).iter().chain(graph.next_in_stream(op).as_ref()) {
            let waiting = &mut self.waiting_on[next.0 as usize];
            *waiting -= 1;
            if *waiting == 0 {
                self.start(next, network)?;
            }
        }
        Ok(())
    }

    fn start<N: Network<Event = E>>(&mut self, op: OpId, network: &mut N) -> Result<(), ExecError> {
        let now = self.queue.now();
        self.timeline.start[op.0 as usize] = now;
        let graph = self.graph;
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
                    return self.schedule_kernel(kernel, slowed);
                }
                self.queue
                    .schedule_after(duration, Event::Done(Completion::Op(op)))
                    .map(|_| ())
                    .map_err(|source| ExecError::Time { op: graph.describe(op), source })
            }
            OpKind::Transfer { dst, bytes } => {
                if self.slowdowns.is_some() {
                    self.communicating(spec.rank, 1)?;
                    self.communicating(dst, 1)?;
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
                        None => self.shadow_pairs_of(network, spec.rank, dst),
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
                    self.communicating(spec.rank, 1)?;
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
                    self.communicating(spec.rank, 1)?;
                }
                let arrived = &mut self.arrived[collective.0 as usize];
                *arrived += 1;
                if *arrived as usize != graph.members(collective).len() {
                    return Ok(());
                }
                self.timeline.collective_begin[collective.0 as usize] = now;
                let collective_spec = graph.collective(collective);
                network
                    .start_collective(
                        &mut NetContext { queue: &mut self.queue },
                        Completion::Collective(collective),
                        collective_spec,
                        graph.group(collective_spec.group),
                    )
                    .map_err(network_error)?;
                self.timeline.collective_choice[collective.0 as usize] = network.chosen(collective_spec);
                if self.shadows {
                    let group = collective_spec.group;
                    let shadows = match self.shadow_groups.remove(&group) {
                        Some(shadows) => shadows,
                        None => self.shadow_groups_of(network, group),
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
