//! The `flow` and `packet-steps` fidelities: fluid flows on topology routes with max-min fair
//! bandwidth sharing.
//!
//! A message becomes a flow on its route. It enters the network after its route latency (its
//! first byte has arrived), then shares every link it crosses with the other flows there, at
//! the max-min fair rates of `maxmin` (progressive filling over the component of links and
//! flows its change touches). Rates change only when a flow enters or leaves; the re-fill
//! waits until every event of the current instant has run ([`FlowEvent::Refill`]): when many
//! flows enter and leave at once (every message of a collective step), their components are
//! re-filled once, together, and rates that would have lived for no time are never computed.
//! Until then the old rates stand, which is exact: no time passes. Routes that depend on the
//! flow (ECMP hashes its serial number, UGAL counts the flows already routed) are the
//! exception: batching reorders the completions of one instant, hence the order in which the
//! next flows start and the routes they draw, so there every change re-fills at once.
//!
//! Routes come from the topology per flow (ECMP hashes the flow id). Under UGAL routing on a
//! dragonfly, a flow takes its Valiant route instead of the minimal one when the minimal
//! route's hop count times (1 + the most unfinished flows routed over one of its links) is
//! larger than the Valiant route's.
//!
//! The parts, bottom up (each private, each importing only the ones before it):
//! - `link_lists`: the flows on each link, every link's list in one buffer;
//! - `link_order`: the order the filling takes a component's links in (keys, sorted a chunk
//!   at a time);
//! - `maxmin`: the max-min fair solver: flows on link routes and groups of flows that advance
//!   together, the component a change touches re-filled by progressive filling;
//! - `event`: the events ([`FlowEvent`]) and who waits for a flow;
//! - `series`: the utilisation over time of chosen links ([`LinkSeries`]), when asked for,
//!   from the rate changes `flows` reports to it (the solver is not touched);
//! - `flows`: flows on the topology's routes: paths and routing, a flow's life from first to
//!   last byte, re-fills batched per instant, counters ([`FlowStats`]) and audit ([`Audit`]);
//! - `messages`: collectives message by message (the `packet-steps` behaviour);
//! - `coupled`: collectives in their steady state (under `flow`).
//!
//! This module wires them together: the [`Network`] seam, the choice of each collective's
//! algorithm and protocol (once per distinct collective, by the analytical estimate; NVLS and
//! CollNet, whose reduction happens in a switch, in closed form), and the dispatch of events
//! and finished flows to the part they belong to.
//!
//! Invariants: every transfer, copy and collective completes exactly once; a completion
//! scheduled at a rate that has changed since is skipped (by generation), never acted on; a
//! collective's algorithm, protocol and wire bytes are resolved once per distinct collective.
//!
//! ```
//! use sim_core::exec::run;
//! use sim_core::flow::FlowNetwork;
//! use sim_core::graph::{GraphBuilder, RankId, StreamId};
//! use sim_core::units::{Bytes, SimDuration};
//! use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology};
//!
//! // Two senders into one receiver on a 100 Gb/s switch: they share its down-link.
//! let link = LinkSpec::new("100 Gb/s".parse()?, "1 us".parse()?);
//! let cluster = ClusterSpec { nodes: 3, gpus_per_node: 1, intra_node: IntraNode::NvSwitch(link), network: NetworkSpec::single_switch(link), host_memory: None  };
//! let topology = Topology::build(&cluster)?;
//! let mut graph = GraphBuilder::new(3);
//! graph.transfer(RankId(0), StreamId(0), RankId(2), Bytes(125_000_000), "a", &[]);
//! graph.transfer(RankId(1), StreamId(0), RankId(2), Bytes(125_000_000), "b", &[]);
//! let timeline = run(&graph.build()?, &mut FlowNetwork::new(&topology))?;
//! // Each gets 6.25 GB/s: 2 us of latency + 125 MB / 6.25 GB/s = 20.002 ms.
//! assert_eq!(timeline.makespan(), SimDuration::from_us(20_002));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod coupled;
mod event;
mod flows;
mod link_lists;
mod link_order;
mod maxmin;
#[cfg(test)]
mod maxmin_tests;
mod messages;
mod series;
mod windows;

use crate::lookup::FastLookupMap;
use topology::{HostId, LinkId, Topology};
use units::{Bytes, SimDuration};

use crate::graph::{Collective, CollectiveAlgorithm, MemcpyDirection, RankId};
use crate::nccl::choice::choose_for;
use crate::nccl::overhead::protocol_overhead;
use crate::nccl::protocol::{Choice, ProtocolChoice, is_in_network};
use crate::nccl::timing::in_network_time;
use crate::nccl::tuner::GpuGeneration;
use crate::nccl::wire::{pipeline_chunk, tree_step_floor, wire_bytes};
use crate::network::AnalyticalNetwork;
use crate::network::{Completion, Event, Least, Movement, NetContext, Network, NetworkError};
use crate::queue::EventQueue;
use crate::schedule::Schedule;

use coupled::{Couplings, has_coupled_form};
use event::Owner;
use flows::{Flows, server_of};
use messages::Runs;
use windows::Windows;

pub use event::FlowEvent;
pub use flows::{Audit, FlowStats};
pub use series::LinkSeries;

/// The `flow` fidelity (see the module documentation). Rank `r` runs on host `r`.
#[derive(Debug)]
pub struct FlowNetwork<'t> {
    /// The flows on the topology, their rates and their counters.
    flows: Flows<'t>,
    /// Collectives running message by message.
    runs: Runs,
    /// Collectives running in their steady state.
    coupled: Couplings,
    /// Fixed cost of every collective (see [`FlowNetwork::with_collective_launch`]).
    collective_launch: SimDuration,
    /// Run collectives in their steady-state form (see [`FlowNetwork::steady_state`]).
    steady_state: bool,
    /// Alpha-beta estimates for choosing `Auto` algorithms, and the choices made.
    estimator: AnalyticalNetwork<'t>,
    chosen: FastLookupMap<Collective, (Choice, SimDuration, Bytes)>,
    /// The topology's capacity windows, applied as time passes.
    windows: Windows,
    /// A second model of the same settings on which movements run alone, for their floors
    /// ([`Network::least`]); made when first asked.
    alone: Option<Box<Alone<'t>>>,
}

/// A flow model on which movements run one at a time, each alone on the network, to time
/// them for [`Network::least`] without touching the model the run uses.
#[derive(Debug)]
struct Alone<'t> {
    network: FlowNetwork<'t>,
    queue: EventQueue<Event<FlowEvent>>,
    /// A movement failed part way (or ran past the work budget): the model's state is not to
    /// be trusted any more, and no later movement gets a floor.
    broken: bool,
}

/// A movement run alone ([`Alone::time`]).
#[derive(Debug)]
struct Solo {
    /// Its time, if it is a floor (`None`: it ran message by message).
    time: Option<SimDuration>,
    /// Each flow's occupancy of each link it crossed, in seconds (a link may repeat).
    occupancy: Vec<(LinkId, f64)>,
}

impl Alone<'_> {
    /// The time `movement` takes alone on the network, from its start to its completion
    /// (`None` if it ran message by message: several flows of its own, whose max-min shares
    /// other traffic can reorder), and each link occupancy of its flows as they started;
    /// `None` if it failed.
    fn time(&mut self, movement: Movement<'_>) -> Option<Solo> {
        if self.broken {
            return None;
        }
        let timed = self.run(movement);
        let occupancy = self.network.flows.occupancy.as_mut().map(std::mem::take).unwrap_or_default();
        if timed.is_err() {
            self.broken = true;
        }
        timed.ok().map(|time| Solo { time, occupancy })
    }

    fn run(&mut self, movement: Movement<'_>) -> Result<Option<SimDuration>, NetworkError> {
        let network = &mut self.network;
        let begin = self.queue.now();
        // Any token: the only completion in the queue is this movement's.
        let token = Completion::Shadow;
        let mut context = NetContext { queue: &mut self.queue };
        match movement {
            Movement::Transfer { src, dst, bytes } => {
                network.start_transfer(&mut context, token, src, dst, bytes)?
            }
            Movement::Collective { collective, group } => {
                network.start_collective(&mut context, token, collective, group)?
            }
            Movement::Memcpy { rank, direction, bytes } => {
                network.start_memcpy(&mut context, token, rank, direction, bytes)?
            }
        }
        let several = network.runs.running();
        let mut end = None;
        while let Some((time, event)) = self.queue.pop() {
            match event {
                Event::Done(_) => end = Some(time),
                Event::Network(event) => network.handle(&mut NetContext { queue: &mut self.queue }, event)?,
            }
        }
        Ok(end.filter(|_| !several).map(|end| end.saturating_since(begin)))
    }
}

impl<'t> FlowNetwork<'t> {
    /// A flow model over `topology`. Host <-> device copies are flows on the GPU's host link.
    pub fn new(topology: &'t Topology) -> Self {
        FlowNetwork {
            flows: Flows::new(topology),
            runs: Runs::default(),
            coupled: Couplings::new(topology.link_count()),
            collective_launch: SimDuration::ZERO,
            steady_state: false,
            estimator: AnalyticalNetwork::new(topology),
            chosen: FastLookupMap::new(),
            windows: Windows::new(topology),
            alone: None,
        }
    }

    /// A fresh model of the same settings on the same topology, at nominal capacity (no
    /// window: windows only lower capacities), with nothing running or recorded.
    fn same_settings(&self) -> FlowNetwork<'t> {
        FlowNetwork {
            flows: Flows::new(self.flows.topology),
            runs: Runs::default(),
            coupled: Couplings::new(self.flows.topology.link_count()),
            collective_launch: self.collective_launch,
            steady_state: self.steady_state,
            estimator: self.estimator.same_settings(),
            chosen: FastLookupMap::new(),
            windows: Windows::default(),
            alone: None,
        }
    }

    /// The same model, checking after every re-fill that no link carries more than its
    /// capacity and that every flow has a bottleneck (a full link on which no flow is faster),
    /// and accounting every byte sent and delivered. For tests: it costs a pass over the
    /// component per re-fill.
    pub fn audited(mut self) -> Self {
        self.flows.audit = Some(Audit::default());
        self
    }

    /// The same model re-filling rates after every flow that enters or leaves, as it did before
    /// re-fills were batched per instant: the same rates, computed more often (for tests).
    pub fn refilling_immediately(mut self) -> Self {
        self.flows.immediate = true;
        self
    }

    /// The same model re-filling the whole component of every change, as before re-fills
    /// kept the flows frozen below the change's level: the same rates to rounding, computed
    /// over more flows (for tests).
    pub fn refilling_whole_components(mut self) -> Self {
        self.flows.solver.whole_components = true;
        self
    }

    /// The audit so far, if enabled.
    pub fn audit(&self) -> Option<&Audit> {
        self.flows.audit.as_ref()
    }

    /// The same model with a fixed cost before every collective's first message: the
    /// communication library's launch and synchronisation overhead (zero by default: pure
    /// network).
    pub fn with_collective_launch(mut self, launch: SimDuration) -> Self {
        self.collective_launch = launch;
        self.estimator = self.estimator.with_collective_launch(launch);
        self
    }

    /// The same model with collectives run by `protocols` (see [`crate::nccl::protocol`]): their
    /// bandwidth share scales the bytes on the wire, their base and per-hop latencies delay
    /// the first message.
    pub fn with_protocols(mut self, protocols: ProtocolChoice) -> Self {
        self.estimator = self.estimator.with_protocols(protocols);
        self
    }

    /// The same model on GPUs that copy within their memory at `rate` (see
    /// [`crate::nccl::network::NcclNetwork::device_copy`]).
    pub fn with_device_copy(mut self, rate: Option<units::Bandwidth>) -> Self {
        self.estimator = self.estimator.with_device_copy(rate);
        self
    }

    /// The same model tuning for GPUs of `generation` (see [`crate::nccl::tuner`]).
    pub fn with_generation(mut self, generation: GpuGeneration) -> Self {
        self.estimator = self.estimator.with_generation(generation);
        self
    }

    /// The same model running collectives in their steady-state form: one long-lived flow per
    /// edge, all edges of a collective coupled (the `flow` fidelity; without it every message
    /// is its own flow, the `packet-steps` fidelity). Rings, double binary trees and NCCL's tree
    /// share one rate; the hierarchical allreduce, chains and the direct all-to-all advance each
    /// edge in proportion to its bytes. NCCL's tree and those three are topped up to their
    /// analytical time. Log-step
    /// algorithms and the pairwise all-to-all stay message by message (see
    /// `has_coupled_form`).
    pub fn steady_state(mut self) -> Self {
        self.steady_state = true;
        self
    }

    /// The same model with pipelined collective algorithms (tree, chain) cut into chunks of at
    /// most `chunk` (1 MiB by default).
    pub fn with_chunk(mut self, chunk: Bytes) -> Self {
        self.estimator = self.estimator.with_chunk(chunk);
        self
    }

    /// The same model giving up with [`NetworkError::OverBudget`] at the first rate
    /// recomputation after its work ([`FlowStats::work`]) passes `budget`: for callers that
    /// rank many configurations and must not wait on one. A budget, unlike a wall-clock limit,
    /// gives up at the same point on every machine and under any load, so such a caller's
    /// answer does not depend on them.
    pub fn with_work_budget(mut self, budget: Option<u64>) -> Self {
        self.flows.work_budget = budget;
        self
    }

    /// The same model with room for `flows` flows at once and as many pairs' paths, made
    /// before the run (a hint: more may run): a run that knows its flows skips the copies of
    /// the flow slots and paths as they grow. The results are the same.
    pub fn reserving_flows(mut self, flows: usize) -> Self {
        self.flows.reserve(flows);
        self
    }

    /// The same model counting the bytes routed over every link (see
    /// [`FlowNetwork::link_bytes`]); off by default, so runs that do not ask pay nothing.
    pub fn recording_link_bytes(mut self) -> Self {
        self.flows.link_bytes = Some(vec![0.0; self.flows.topology.link_count()]);
        self
    }

    /// Bytes routed over each link so far, indexed by [`LinkId`] (every flow's whole size on
    /// every link of its route, counted when it starts; a flow that finishes has carried them
    /// all), if [`FlowNetwork::recording_link_bytes`] asked for them.
    pub fn link_bytes(&self) -> Option<&[f64]> {
        self.flows.link_bytes.as_deref()
    }

    /// The same model recording the utilisation over time of `links` (see
    /// [`FlowNetwork::link_series`]); off by default, so runs that do not ask pay nothing.
    /// Memory grows with the links chosen and the rate changes on them, not with the
    /// topology: choose the few links to show (`parasim run --trace` re-runs the graph for
    /// the busiest links that a first run, counting bytes, found).
    pub fn recording_link_series(mut self, links: &[LinkId]) -> Self {
        let solver = &self.flows.solver;
        let recorder =
            series::SeriesRecorder::new(links, self.flows.topology.link_count(), |link| solver.nominal(link));
        self.flows.series = Some(recorder);
        self
    }

    /// The utilisation over time of each link [`FlowNetwork::recording_link_series`] asked for
    /// (each once, in the order asked; links out of range left out), if it did: the sum of
    /// the max-min fair rates of the flows on the link over its capacity, from each change
    /// to the next.
    pub fn link_series(&self) -> Option<&[LinkSeries]> {
        self.flows.series.as_ref().map(series::SeriesRecorder::series)
    }

    /// Counters so far.
    pub fn stats(&self) -> FlowStats {
        self.flows.stats
    }

    /// The current rate of every flow on `link`, in bytes per second (for tests and reports).
    pub fn link_rates(&self, link: LinkId) -> Vec<f64> {
        let solver = &self.flows.solver;
        solver.link_rates(link).collect()
    }

    /// A flow is done: tells its owner (a transfer or copy completes; a collective's message
    /// counts as done for both its ends, once its step floor has passed).
    #[inline(always)]
    fn notify(&mut self, context: &mut NetContext<'_, FlowEvent>, owner: Owner) -> Result<(), NetworkError> {
        match owner {
            Owner::Single(token) => Ok(context.complete_after(SimDuration::ZERO, token)?),
            Owner::Message { run, lane, from, to, due } => {
                let early = due.saturating_since(context.now());
                if early > SimDuration::ZERO {
                    let held = self.runs.hold(run, lane, from, to);
                    return Ok(context.wake_after(early, FlowEvent::MessageDue { held })?);
                }
                self.runs.message_done(&mut self.flows, context, run, lane, from)?;
                self.runs.message_done(&mut self.flows, context, run, lane, to)
            }
            // Coupled edges never finish one by one: `coupling_done` ends them together.
            Owner::Coupled => Ok(()),
        }
    }

    /// Starts `collective`: resolves its algorithm and protocol (once per distinct
    /// collective), then runs it in closed form (in-network algorithms), in its steady state
    /// (under `flow`, for the algorithms that have one) or message by message.
    fn start_run(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        token: Completion,
        collective: &Collective,
        group: &[RankId],
    ) -> Result<(), NetworkError> {
        let topology = self.flows.topology;
        let node_of = |rank: RankId| server_of(topology, rank);
        let (choice, delay, wire) = match self.chosen.get(collective) {
            Some(&resolved) => resolved,
            None => {
                let estimator = &mut self.estimator;
                let (kind, bytes) = (collective.kind, collective.bytes);
                let choice = choose_for(kind, collective.algorithm, bytes, group, estimator)?;
                let delay = protocol_overhead(kind, choice, bytes, group, estimator)?;
                let wire = wire_bytes(kind, choice, bytes, group, estimator)?;
                self.chosen.insert(*collective, (choice, delay, wire));
                (choice, delay, wire)
            }
        };
        let algorithm = choice.algorithm;
        if is_in_network(algorithm) {
            // The switch's reduction is not a flow: NVLS and CollNet are timed in closed form.
            let time = in_network_time(algorithm, collective.bytes, group, &self.estimator)?;
            return Ok(context.complete_after(delay.checked_add(time)?, token)?);
        }
        let wired = Collective { bytes: wire, algorithm, ..*collective };
        let start = coupled::Start { token, collective, group, delay };
        if self.steady_state
            && let Some(started) = self.coupled.start_known(&mut self.flows, context, start)
        {
            return started;
        }
        if self.steady_state && algorithm == CollectiveAlgorithm::Ring && group.len() > 1 {
            return self.coupled.start_coupled_ring(&mut self.flows, context, start, &wired);
        }
        let chunk = pipeline_chunk(choice, collective.bytes, wire, group, &self.estimator)?;
        let schedule = Schedule::with_chunk(collective.kind, algorithm, wire, group, node_of, chunk)?;
        let floor =
            tree_step_floor(collective.kind, choice, collective.bytes, &schedule, group, &self.estimator)?;
        let schedule = schedule.with_step_floor(floor);
        if self.steady_state && schedule.steps() > 0 && algorithm == CollectiveAlgorithm::DoubleBinaryTree {
            return self.coupled.start_coupled_pipeline(&mut self.flows, context, start, &schedule);
        }
        if self.steady_state
            && schedule.steps() > 0
            && (algorithm == CollectiveAlgorithm::Tree || has_coupled_form(algorithm))
        {
            let reference = self.coupled.reference(&mut self.estimator, collective, choice, group)?;
            return self.coupled.start_topped_up(&mut self.flows, context, start, &schedule, reference);
        }
        self.runs.start(context, token, schedule, delay)
    }
}

impl Network for FlowNetwork<'_> {
    type Event = FlowEvent;

    fn name(&self) -> &'static str {
        "flow"
    }

    fn host_count(&self) -> usize {
        self.flows.topology.host_count()
    }

    fn server_of(&self, rank: RankId) -> Option<u32> {
        self.flows.topology.node_of(HostId(rank.0)).ok()
    }

    fn start_transfer(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        src: RankId,
        dst: RankId,
        bytes: Bytes,
    ) -> Result<(), NetworkError> {
        self.windows.catch_up(&mut self.flows, context, &mut self.coupled)?;
        self.flows.start_flow(context, src, dst, bytes.as_f64(), Owner::Single(token))
    }

    fn start_collective(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        collective: &Collective,
        group: &[RankId],
    ) -> Result<(), NetworkError> {
        self.windows.catch_up(&mut self.flows, context, &mut self.coupled)?;
        self.start_run(context, token, collective, group)
    }

    fn chosen(&self, collective: &Collective) -> Option<Choice> {
        self.chosen.get(collective).map(|&(choice, _, _)| choice)
    }

    fn start_memcpy(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        rank: RankId,
        direction: MemcpyDirection,
        bytes: Bytes,
    ) -> Result<(), NetworkError> {
        self.windows.catch_up(&mut self.flows, context, &mut self.coupled)?;
        let to_device = direction == MemcpyDirection::HostToDevice;
        let route = self.flows.topology.host_memory_route(HostId(rank.0), to_device)?;
        self.flows.start_flow_on(context, route, bytes.as_f64(), Owner::Single(token))
    }

    fn handle(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        event: Self::Event,
    ) -> Result<(), NetworkError> {
        self.windows.catch_up(&mut self.flows, context, &mut self.coupled)?;
        match event {
            FlowEvent::Enter { flow } => match self.flows.enter(context, flow, &mut self.coupled)? {
                Some(owner) => self.notify(context, owner),
                None => Ok(()),
            },
            FlowEvent::Begin { run } => self.runs.begin(&mut self.flows, context, run),
            FlowEvent::Couple { coupling } => self.coupled.couple(&mut self.flows, context, coupling),
            FlowEvent::CouplingDone { coupling, generation } => {
                self.coupled.coupling_done(&mut self.flows, context, coupling, generation)
            }
            FlowEvent::Finish { flow, generation } => {
                match self.flows.finish(context, flow, generation, &mut self.coupled)? {
                    Some(owner) => self.notify(context, owner),
                    None => Ok(()),
                }
            }
            FlowEvent::Refill => self.flows.refill_pending(context, &mut self.coupled),
            FlowEvent::Capacity => self.windows.change_due(&mut self.flows, context, &mut self.coupled),
            FlowEvent::MessageDue { held } => {
                let (run, lane, from, to) = self.runs.release(held);
                self.runs.message_done(&mut self.flows, context, run, lane, from)?;
                self.runs.message_done(&mut self.flows, context, run, lane, to)
            }
        }
    }

    /// The movement's time alone on the network and its occupancy of each link it crosses,
    /// each less a margin for rounding (1 ppm and 100 ns). Other traffic only stretches the
    /// time: a transfer or copy is one flow, which never gets more than its route's slowest
    /// link; a collective in its steady state is one group flow, whose rate per unit of weight
    /// never passes the least capacity over weight of its links, and whose time grows with
    /// its data's; NVLS and CollNet are closed forms. A flow's occupancy of a link is its size
    /// times its weight there over the capacity: the solver never loads a link past it.
    /// Windows only lower capacities, and the movement alone sees none. Nothing (zero) where
    /// that reasoning fails: routes drawn per flow (ECMP, UGAL) or latency jitter (alone, a
    /// movement may take a route or a draw the run does not); and no time floor for
    /// collectives run message by message (several flows of their own, which other traffic
    /// can reorder), only their occupancy.
    fn least(&mut self, movement: Movement<'_>) -> Least {
        if self.flows.has_jitter() || !self.flows.routes_cached() {
            return Least::default();
        }
        if self.alone.is_none() {
            let mut network = self.same_settings();
            network.flows.occupancy = Some(Vec::new());
            // The movements alone get the run's work budget, all of them together: past it
            // the second model gives no more floors, so timing them never costs more work
            // than the run itself may do.
            network.flows.work_budget = self.flows.work_budget;
            self.alone = Some(Box::new(Alone { network, queue: EventQueue::new(), broken: false }));
        }
        let Some(Solo { time, mut occupancy }) = self.alone.as_mut().and_then(|alone| alone.time(movement))
        else {
            return Least::default();
        };
        // Less the margin, in picoseconds.
        let less = |ps: u64| SimDuration::from_ps(ps.saturating_sub(ps / 1_000_000 + 100_000));
        occupancy.sort_unstable_by_key(|entry| entry.0.0);
        let merged = occupancy
            .chunk_by(|a, b| a.0 == b.0)
            .map(|link| {
                let seconds: f64 = link.iter().map(|entry| entry.1).sum();
                let ps = if seconds.is_finite() && seconds > 0.0 { (seconds * 1e12) as u64 } else { 0 };
                (link[0].0, less(ps))
            })
            .filter(|&(_, least)| least > SimDuration::ZERO)
            .collect();
        Least { time: time.map_or(SimDuration::ZERO, |time| less(time.as_ps())), occupancy: merged }
    }
}
