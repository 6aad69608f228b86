//! The `flow` fidelity: fluid flows on topology routes with max-min fair bandwidth sharing.
//!
//! A message becomes a flow on its route. It enters the network after its route latency (its
//! first byte has arrived), then shares every link it crosses with the other flows there: the
//! rates are the max-min fair allocation, found by progressive filling (raise every unfrozen
//! flow's rate together; when a link fills, freeze the flows crossing it). Rates change only
//! when a flow enters or leaves, and then only for the flows connected to it through shared
//! links (its connected component): those are re-filled, their progress is brought up to date,
//! and their completion is rescheduled (stale completion events are skipped by generation).
//! The re-fill waits until every event of the current instant has run ([`FlowEvent::Refill`]):
//! when many flows enter and leave at once (every message of a collective step), their
//! components are re-filled once, together, and rates that would have lived for no time are
//! never computed. Until then the old rates stand, which is exact: no time passes. Routes that
//! depend on the flow (ECMP hashes its serial number, UGAL counts the flows already routed) are
//! the exception: batching reorders the completions of one instant, hence the order in which
//! the next flows start and the routes they draw, so there every change re-fills at once.
//!
//! Routes come from the topology per flow (ECMP hashes the flow id). Under UGAL routing on a
//! dragonfly, a flow takes its Valiant route instead of the minimal one when the minimal
//! route's hop count times (1 + the most unfinished flows routed over one of its links) is
//! larger than the Valiant route's.
//!
//! Collectives run their [`Schedule`] message by message (`packet-steps` behaviour): each
//! member posts the messages of a step, a message's flow starts once both its sender and its
//! receiver have reached that step, and a member moves on once all its messages of the step are
//! done, exactly the per-host step dependencies of SimGrid's reference harness.
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

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use topology::{HostId, LinkId, Route, Routing, Topology};
use units::{Bytes, SimDuration, SimTime};

use crate::fast_hash::FastMap;
use crate::graph::{Collective, CollectiveAlgorithm, CollectiveKind, MemcpyDirection, RankId};
use crate::nccl::choice::choose_for;
use crate::nccl::overhead::protocol_overhead;
use crate::nccl::protocol::{Choice, ProtocolChoice, is_in_network};
use crate::nccl::timing::{data_time, in_network_time};
use crate::nccl::tuner::GpuGeneration;
use crate::nccl::wire::{pipeline_chunk, tree_step_floor, wire_bytes};
use crate::network::AnalyticalNetwork;
use crate::network::{Completion, NetContext, Network, NetworkError};
use crate::schedule::{CollectiveError, Message, Schedule, ring_channels};

/// A timer of the flow model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowEvent {
    /// The flow's first byte has crossed its route: it starts sharing bandwidth.
    Enter {
        /// The flow.
        flow: u32,
    },
    /// Every edge of a steady-state collective has delivered its data, if their common rate has
    /// not changed since (same generation).
    CouplingDone {
        /// The coupling.
        coupling: u32,
        /// Its generation when the event was scheduled.
        generation: u32,
    },
    /// Every edge flow of a steady-state collective enters the network.
    Couple {
        /// The coupling.
        coupling: u32,
    },
    /// A collective's launch overhead is over: its members enter their first step.
    Begin {
        /// The running collective.
        run: u32,
    },
    /// The flow's last byte is due, if its rate has not changed since (same generation).
    Finish {
        /// The flow.
        flow: u32,
        /// Its generation when the event was scheduled.
        generation: u32,
    },
    /// Flows entered or left at this instant: once no other event is due now, the rates of
    /// the flows connected to their links are re-filled, all at once.
    Refill,
    /// A collective's message whose flow finished before its schedule's step floor
    /// ([`Schedule::step_floor`]) is done now.
    MessageDue {
        /// The running collective.
        run: u32,
        /// The lane.
        lane: u32,
        /// The sender's position.
        from: u32,
        /// The receiver's position.
        to: u32,
    },
}

/// Who is waiting for a flow.
#[derive(Debug, Clone, Copy)]
enum Owner {
    /// A transfer op (or other single completion).
    Single(Completion),
    /// One message of a running collective: sender and receiver positions on a lane, and the
    /// earliest time it may be done (its start plus the schedule's step floor).
    Message { run: u32, lane: u32, from: u32, to: u32, due: SimTime },
    /// One edge flow of a steady-state collective.
    Coupled,
}

/// A collective in its steady-state form: one long-lived flow per edge, all advancing at one
/// common rate.
#[derive(Debug)]
struct Coupling {
    members: Vec<u32>,
    token: Completion,
    /// Latency still owed after the data has moved (the steps' latencies beyond the first).
    tail: SimDuration,
    /// Bytes a pipeline's fill and drain add on its busiest edge, charged when the data has
    /// moved at `fill_rate`: the slowest edge path's own bandwidth, because few edges are busy
    /// while a pipeline fills or drains.
    fill_bytes: f64,
    fill_rate: f64,
    /// For a ring: its steps, its shortest edge latency, its slowest uncontended step
    /// (latency plus one step's message at the path's own bandwidth, over all edges), and when
    /// its data started moving (see [`FlowNetwork::coupling_done`]).
    ring: Option<RingTiming>,
    /// Completion bookkeeping: the latest edge's remaining time as of the re-fill `epoch`
    /// `due_generation`, whether it changed, and the generation of the pending completion.
    due: SimDuration,
    due_generation: u64,
    rescheduled: bool,
    generation: u32,
}

/// The server of `rank` (rank r runs on host r), as collective schedules need it.
fn server_of(topology: &Topology, rank: RankId) -> Result<u32, CollectiveError> {
    topology.node_of(HostId(rank.0)).map_err(|error| CollectiveError::Network(error.to_string()))
}

/// The rings a ring collective over one group runs, as edges.
#[derive(Debug)]
struct RingEdges {
    /// Rings (NCCL's channels).
    channels: usize,
    /// Every ring's edges (source, destination), ring after ring.
    edges: Vec<(RankId, RankId)>,
}

/// What a steady-state ring needs to turn its data time into its step-by-step time.
#[derive(Debug, Clone, Copy)]
struct RingTiming {
    steps: u64,
    shortest_latency: SimDuration,
    slowest_uncontended_step: SimDuration,
    entered: SimTime,
    entry_latency: SimDuration,
}

/// Algorithms that run under `flow` as coupled edge flows topped up to their analytical time
/// (see `FlowNetwork::start_topped_up`): those with many messages and no barrier
/// between them that other traffic could turn into a wait (a hierarchical allreduce's
/// 2(g-1) + 2(n-1) ring steps, a chain's C + p - 2 pipeline steps, the direct all-to-all's
/// p(p-1) concurrent sends, as NCCL posts them). Halving-doubling, recursive doubling and
/// binomial trees (log2 p steps) and the pairwise all-to-all (p-1 steps) wait for each step's
/// slowest message before the next, as MPI runs them: they stay message by message, where a
/// member slowed by other traffic holds every later step up. A steady form would miss that:
/// tried on them, it came out far faster than message by message beside a transfer that
/// shares one GPU's link (docs/collectives.md, "Fidelities").
fn has_coupled_form(algorithm: CollectiveAlgorithm) -> bool {
    matches!(
        algorithm,
        CollectiveAlgorithm::Hierarchical | CollectiveAlgorithm::Chain | CollectiveAlgorithm::Direct
    )
}

/// `Flow::coupling` of an independent flow.
const INDEPENDENT: u32 = u32::MAX;

/// The smallest weight an edge of a weighted coupling claims (see `Flow::weight`): an edge a
/// million times smaller than the largest still holds a share, so no division by zero.
const MIN_WEIGHT: f64 = 1e-9;

/// A route with what every flow on it needs: the sum of its link latencies (the time its first
/// byte takes) and its slowest link's capacity (its rate alone), computed once per pair of
/// ranks when routes do not depend on the flow.
#[derive(Debug, Clone, Copy)]
struct Path {
    route: Route,
    latency: SimDuration,
    alone: f64,
}

#[derive(Debug, Clone)]
struct Flow {
    route: Route,
    /// Size in bytes.
    size: f64,
    /// Bytes still to deliver as of `updated`.
    remaining: f64,
    /// Current rate in bytes per second (0 until it enters).
    rate: f64,
    updated: SimTime,
    generation: u32,
    owner: Owner,
    /// The steady-state collective this flow is an edge of, or `INDEPENDENT`.
    coupling: u32,
    /// Its claim in max-min filling, in flows: 1, except for the edges of a weighted coupled
    /// collective, whose edges carry different amounts and advance in proportion to them (see
    /// [`FlowNetwork::weigh_by_bottleneck`] and [`FlowNetwork::fill`]).
    weight: f64,
}

/// A collective in progress: where each member of each lane is in the schedule.
#[derive(Debug)]
struct CollectiveRun {
    schedule: Schedule,
    token: Completion,
    /// Step each member has entered (`NOT_ENTERED` before), indexed lane * members + position.
    step: Vec<u32>,
    /// Messages of its current step each member still waits for.
    pending: Vec<u32>,
    /// Members (over all lanes) that have finished every step.
    finished_members: usize,
}

const NOT_ENTERED: u32 = u32::MAX;

/// An f64 that orders totally (rates and shares are finite and non-negative).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Share(f64);
impl Eq for Share {}
impl PartialOrd for Share {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Share {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Counters of a flow-level run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// Flows started (one per transfer, one per collective message).
    pub flows: u64,
    /// Rate recomputations: one per simulated instant at which flows entered or left links
    /// they share, however many changed then (a completion due at once, at the new rates, may
    /// add one more); with [`FlowNetwork::refilling_immediately`], one per such change. A flow
    /// alone on its links gets its rate without one.
    pub recomputations: u64,
    /// Flows whose rate was re-filled, summed over recomputations.
    pub refilled_flows: u64,
    /// Most flows sharing the network at once.
    pub peak_concurrent_flows: usize,
    /// The model's work so far, in flow and link visits: one per flow started, and per rate
    /// recomputation one per flow and per link of the component it re-filled. What a run's
    /// wall time grows with, counted the same on every machine ([`FlowNetwork::with_work_budget`]).
    pub work: u64,
}

/// The `flow` fidelity (see the module documentation). Rank `r` runs on host `r`.
#[derive(Debug)]
pub struct FlowNetwork<'t> {
    topology: &'t Topology,
    /// Link capacities in bytes per second.
    capacity: Vec<f64>,
    flows: Vec<Flow>,
    free_flows: Vec<u32>,
    /// Flows sharing each link.
    on_link: Vec<Vec<u32>>,
    active_flows: usize,
    runs: Vec<Option<CollectiveRun>>,
    free_runs: Vec<u32>,
    next_flow_id: u64,
    /// Adaptive (UGAL) routing: routes are chosen from `routed`.
    adaptive: bool,
    /// Unfinished flows routed over each link (kept only for adaptive routing).
    routed: Vec<u32>,
    /// Per source host: the last destination and its path (see [`FlowNetwork::path`]).
    last_path: Vec<(u32, Path)>,
    /// The path of every (source, destination) pair seen (see [`FlowNetwork::path`]).
    paths: FastMap<(u32, u32), Path>,
    /// The rings of each group's ring collectives (see [`FlowNetwork::start_coupled_ring`]).
    ring_edges: FastMap<Vec<RankId>, RingEdges>,
    stats: FlowStats,
    /// Work after which the run gives up ([`NetworkError::OverBudget`]).
    work_budget: Option<u64>,
    // Scratch state of the max-min filling, reused across recomputations.
    epoch: u64,
    link_epoch: Vec<u64>,
    flow_epoch: Vec<u64>,
    component_links: Vec<u32>,
    component_flows: Vec<u32>,
    remaining_capacity: Vec<f64>,
    unfrozen: Vec<u32>,
    new_rate: Vec<f64>,
    /// Each component link's fair share when it was last pushed: a lower bound of its current
    /// share, since shares only grow as flows freeze (see [`FlowNetwork::fill`]).
    heap: BinaryHeap<(std::cmp::Reverse<Share>, u32)>,
    /// Fixed cost of every collective (see [`FlowNetwork::with_collective_launch`]).
    collective_launch: SimDuration,
    /// Run collectives in their steady-state form (see [`FlowNetwork::steady_state`]).
    steady_state: bool,
    couplings: Vec<Option<Coupling>>,
    /// Free coupling slots, with the generation their last coupling ended at.
    free_couplings: Vec<(u32, u32)>,
    /// Scratch: the flows to freeze together.
    freeze_scratch: Vec<u32>,
    /// Alpha-beta estimates for choosing `Auto` algorithms, and the choices made.
    estimator: AnalyticalNetwork<'t>,
    chosen: HashMap<Collective, (Choice, SimDuration, Bytes)>,
    /// The analytical data time of the collectives already seen that run as coupled flows
    /// topped up to it (see `start_topped_up`).
    references: HashMap<Collective, SimDuration>,
    /// Scratch for a member's messages of a step, and the ones to start now.
    scratch_messages: Vec<Message>,
    scratch_starts: Vec<(u32, u32, RankId, RankId, f64)>,
    /// Scratch for the edges (source, destination, bytes) of a coupled collective.
    scratch_edges: Vec<(RankId, RankId, f64)>,
    /// Scratch for the links a coupled collective enters or leaves.
    scratch_seeds: Vec<LinkId>,
    /// Scratch: a coupled collective's edge flows on each link (see `start_coupled`).
    link_members: Vec<f64>,
    /// Flows of weight other than 1 on each link: where this is 0, a link's weight is its
    /// flow count (see [`FlowNetwork::link_weight`]).
    weighted_on_link: Vec<u32>,
    /// The weight of the flows not yet frozen on each link of the component being filled.
    unfrozen_weight: Vec<f64>,
    /// Member lists of finished couplings, reused by the next ones.
    spare_members: Vec<Vec<u32>>,
    /// Check the allocation after every re-fill (tests); the first violation found.
    audit: Option<Audit>,
    /// Links where flows entered or left since the last re-fill (see [`FlowEvent::Refill`]).
    pending_seeds: Vec<LinkId>,
    /// A [`FlowEvent::Refill`] is scheduled for the current instant.
    refill_scheduled: bool,
    /// Re-fill after every change instead of once per instant: when routes depend on the
    /// flow (see the module documentation), and in tests that compare the two.
    immediate: bool,
}

/// How a coupled collective's time adds up besides its data (see `start_coupled`).
#[derive(Debug, Clone, Copy)]
struct CoupledTiming {
    /// Steps of the schedule.
    steps: u64,
    /// Bytes of the pipeline's fill and drain, charged at the end at the coupled rate.
    fill_bytes: f64,
    /// The sum of every step's latency (a pipeline), or `None`: every step costs the slowest
    /// edge's (a ring).
    latency_sum: Option<SimDuration>,
    /// Fixed cost before the first byte (launch, protocol latencies).
    delay: SimDuration,
    /// The collective's uncontended time by the analytical model, if the coupled flows
    /// stand for its steady state only: what they take alone is topped up to it, and
    /// contention stretches the flows (NCCL's tree).
    reference: Option<SimDuration>,
    /// Edges carry different amounts and advance in proportion to them, all finishing
    /// together (see [`FlowNetwork::weigh_by_bottleneck`]); otherwise every edge advances at
    /// the same rate.
    weighted: bool,
}

/// Invariant checks of a run with [`FlowNetwork::audited`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Audit {
    /// The first violated invariant, if any.
    pub violation: Option<String>,
    /// Bytes of all flows started.
    pub bytes_sent: f64,
    /// Bytes of all flows delivered (size minus what was left when they finished).
    pub bytes_delivered: f64,
    /// Re-fills checked.
    pub checks: u64,
    /// Bytes of the flows started on each link (indexed by `LinkId`; empty until the first
    /// flow): what a test counts on one tier (the inter-node network, the host links).
    pub link_bytes: Vec<f64>,
}

impl<'t> FlowNetwork<'t> {
    /// A flow model over `topology`. Host <-> device copies are flows on the GPU's host link.
    pub fn new(topology: &'t Topology) -> Self {
        let links = topology.link_count();
        FlowNetwork {
            topology,
            capacity: (0..links)
                .map(|l| topology.link(LinkId(l as u32)).bandwidth.bytes_per_second())
                .collect(),
            flows: Vec::new(),
            free_flows: Vec::new(),
            on_link: vec![Vec::new(); links],
            active_flows: 0,
            runs: Vec::new(),
            free_runs: Vec::new(),
            next_flow_id: 0,
            adaptive: topology.routing() == Routing::Ugal,
            routed: vec![0; links],
            last_path: vec![
                (
                    u32::MAX,
                    Path { route: Route::EMPTY, latency: SimDuration::ZERO, alone: f64::INFINITY }
                );
                topology.host_count()
            ],
            paths: FastMap::default(),
            ring_edges: FastMap::default(),
            stats: FlowStats::default(),
            work_budget: None,
            epoch: 0,
            link_epoch: vec![0; links],
            flow_epoch: Vec::new(),
            component_links: Vec::new(),
            component_flows: Vec::new(),
            remaining_capacity: vec![0.0; links],
            unfrozen: vec![0; links],
            new_rate: Vec::new(),
            heap: BinaryHeap::new(),
            collective_launch: SimDuration::ZERO,
            steady_state: false,
            couplings: Vec::new(),
            free_couplings: Vec::new(),
            freeze_scratch: Vec::new(),
            estimator: AnalyticalNetwork::new(topology),
            chosen: HashMap::new(),
            references: HashMap::new(),
            scratch_messages: Vec::new(),
            scratch_starts: Vec::new(),
            scratch_edges: Vec::new(),
            scratch_seeds: Vec::new(),
            spare_members: Vec::new(),
            link_members: vec![0.0; links],
            weighted_on_link: vec![0; links],
            unfrozen_weight: vec![0.0; links],
            audit: None,
            pending_seeds: Vec::new(),
            refill_scheduled: false,
            immediate: topology.routes_depend_on_flow(),
        }
    }

    /// The same model, checking after every re-fill that no link carries more than its
    /// capacity and that every flow has a bottleneck (a full link on which no flow is faster),
    /// and accounting every byte sent and delivered. For tests: it costs a pass over the
    /// component per re-fill.
    pub fn audited(mut self) -> Self {
        self.audit = Some(Audit::default());
        self
    }

    /// The same model re-filling rates after every flow that enters or leaves, as it did before
    /// re-fills were batched per instant: the same rates, computed more often (for tests).
    pub fn refilling_immediately(mut self) -> Self {
        self.immediate = true;
        self
    }

    /// The audit so far, if enabled.
    pub fn audit(&self) -> Option<&Audit> {
        self.audit.as_ref()
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
        self.work_budget = budget;
        self
    }

    /// Counters so far.
    pub fn stats(&self) -> FlowStats {
        self.stats
    }

    /// The current rate of every flow on `link`, in bytes per second (for tests and reports).
    pub fn link_rates(&self, link: LinkId) -> Vec<f64> {
        self.on_link[link.0 as usize].iter().map(|&f| self.flows[f as usize].rate).collect()
    }

    /// Starts a flow of `bytes` from `src` to `dst` for `owner`.
    fn start_flow(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        src: RankId,
        dst: RankId,
        bytes: f64,
        owner: Owner,
    ) -> Result<(), NetworkError> {
        let path = self.path(src, dst)?;
        let (id, latency) = self.new_flow(context.now(), path.route, path.latency, bytes, owner)?;
        context.wake_after(latency, FlowEvent::Enter { flow: id })?;
        Ok(())
    }

    /// Starts a flow of `bytes` on `route` for `owner`.
    fn start_flow_on(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        route: Route,
        bytes: f64,
        owner: Owner,
    ) -> Result<(), NetworkError> {
        let latency = self.topology.route_latency(&route);
        let (id, latency) = self.new_flow(context.now(), route, latency, bytes, owner)?;
        context.wake_after(latency, FlowEvent::Enter { flow: id })?;
        Ok(())
    }

    /// Allocates a flow on `route`, whose links' latencies sum to `latency` (not yet on its
    /// links) and returns it with that latency.
    fn new_flow(
        &mut self,
        now: SimTime,
        route: Route,
        latency: SimDuration,
        bytes: f64,
        owner: Owner,
    ) -> Result<(u32, SimDuration), NetworkError> {
        if self.adaptive {
            for link in route.iter() {
                self.routed[link.0 as usize] += 1;
            }
        }
        self.next_flow_id += 1;
        self.stats.flows += 1;
        self.stats.work += 1;
        if let Some(audit) = &mut self.audit {
            audit.bytes_sent += bytes;
            if audit.link_bytes.is_empty() {
                audit.link_bytes = vec![0.0; self.topology.link_count()];
            }
            for link in route.iter() {
                audit.link_bytes[link.0 as usize] += bytes;
            }
        }
        let mut flow = Flow {
            route,
            size: bytes,
            remaining: bytes,
            rate: 0.0,
            updated: now,
            generation: 0,
            owner,
            weight: 1.0,
            coupling: INDEPENDENT,
        };
        let id = match self.free_flows.pop() {
            Some(id) => {
                // Generations keep counting across reuse of a slot, so a stale completion of the
                // slot's previous flow can never match the new one.
                flow.generation = self.flows[id as usize].generation.wrapping_add(1);
                self.flows[id as usize] = flow;
                id
            }
            None => {
                self.flows.push(flow);
                self.flow_epoch.push(0);
                self.new_rate.push(0.0);
                (self.flows.len() - 1) as u32
            }
        };
        Ok((id, latency))
    }

    /// Starts a ring collective in its steady-state form: one flow per ring edge of every
    /// channel, each carrying what the edge carries over the whole ring (2(p-1)/p of the
    /// channel's share for an allreduce, (p-1)/p for reduce-scatter and allgather).
    fn start_coupled_ring(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        token: Completion,
        collective: &Collective,
        group: &[RankId],
        delay: SimDuration,
    ) -> Result<(), NetworkError> {
        // A group's rings are the same every time: computed on its first collective.
        if !self.ring_edges.contains_key(group) {
            let topology = self.topology;
            let channels = ring_channels(group, |rank| server_of(topology, rank))?;
            let edges = channels
                .iter()
                .flat_map(|ring| (0..ring.len()).map(move |i| (ring[i], ring[(i + 1) % ring.len()])))
                .collect();
            self.ring_edges.insert(group.to_vec(), RingEdges { channels: channels.len(), edges });
        }
        let p = group.len() as f64;
        let (steps, volume) = if collective.kind == CollectiveKind::AllReduce {
            (2 * (group.len() - 1), 2.0 * (p - 1.0) / p)
        } else {
            (group.len() - 1, (p - 1.0) / p)
        };
        let mut edges = std::mem::take(&mut self.scratch_edges);
        edges.clear();
        if let Some(rings) = self.ring_edges.get(group) {
            let bytes = collective.bytes.as_f64() * volume / rings.channels as f64;
            edges.extend(rings.edges.iter().map(|&(src, dst)| (src, dst, bytes)));
        }
        let timing = CoupledTiming {
            steps: steps as u64,
            fill_bytes: 0.0,
            latency_sum: None,
            delay,
            reference: None,
            weighted: false,
        };
        let result = self.start_coupled(context, token, &edges, timing);
        self.scratch_edges = edges;
        result
    }

    /// Starts a pipelined schedule (the double binary tree) in its steady-state form: one flow per edge
    /// the schedule uses, carrying all its messages; the pipeline's fill and drain (the steps
    /// in which even the busiest edge is idle) are charged at the end at the coupled rate.
    fn start_coupled_pipeline(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        token: Completion,
        schedule: &Schedule,
        delay: SimDuration,
    ) -> Result<(), NetworkError> {
        let (bytes, den) = schedule.fraction();
        // Per edge: the steps it is used in and its largest message; per step, the latency of
        // its slowest path (a tree's steps near the leaves cross other links than near the
        // root, so the steps do not all cost the slowest edge's latency).
        let mut usage: BTreeMap<(usize, u32, u32), (u64, u64)> = BTreeMap::new();
        let mut edge_latency: BTreeMap<(RankId, RankId), SimDuration> = BTreeMap::new();
        let mut step_latency = vec![SimDuration::ZERO; schedule.steps() as usize];
        let mut messages = Vec::new();
        for (lane, members) in schedule.lanes().iter().enumerate() {
            for step in 0..schedule.steps() {
                for position in 0..members.len() as u32 {
                    messages.clear();
                    schedule.messages(lane, step, position, &mut messages);
                    for message in messages.iter().filter(|m| m.send) {
                        let entry = usage.entry((lane, position, message.peer)).or_insert((0, 0));
                        entry.0 += 1;
                        entry.1 = entry.1.max(message.num);
                        let edge = (members[position as usize], members[message.peer as usize]);
                        let latency = match edge_latency.get(&edge) {
                            Some(&latency) => latency,
                            None => {
                                let latency = self.path(edge.0, edge.1)?.latency;
                                edge_latency.insert(edge, latency);
                                latency
                            }
                        };
                        let slot = &mut step_latency[step as usize];
                        *slot = (*slot).max(latency);
                    }
                }
            }
        }
        let latency_sum = step_latency.iter().fold(SimDuration::ZERO, |sum, &l| sum.saturating_add(l));
        let steps = u64::from(schedule.steps());
        let message = |num: u64| bytes.as_f64() * num as f64 / den as f64;
        // Fill and drain: the steps in which even the busiest edge is idle.
        let (busiest_count, busiest_num) = usage.values().copied().max().unwrap_or((0, 0));
        let fill_bytes = steps.saturating_sub(busiest_count) as f64 * message(busiest_num);
        let edges: Vec<_> = usage
            .into_iter()
            .map(|((lane, from, to), (count, num))| {
                let lane = &schedule.lanes()[lane];
                (lane[from as usize], lane[to as usize], count as f64 * message(num))
            })
            .collect();
        let timing = CoupledTiming {
            steps,
            fill_bytes,
            latency_sum: Some(latency_sum),
            delay,
            reference: None,
            weighted: false,
        };
        self.start_coupled(context, token, &edges, timing)
    }

    /// Starts a collective in a steady-state form topped up to `reference` (its analytical
    /// time) when alone: one flow per edge the schedule uses, carrying all its messages over
    /// the whole collective. Uncontended, the collective takes exactly its analytical time;
    /// traffic on an edge's links stretches its data.
    ///
    /// - NCCL's tree: its edges carry its chunks both ways, coupled to one rate. Its pipeline
    ///   has unequal edges and, for few chunks, mostly fill and drain, which the coupled flows
    ///   alone would overcharge.
    /// - A hierarchical allreduce, a chain or the direct all-to-all ([`has_coupled_form`]):
    ///   each edge advances in proportion to its bytes so that all finish together (see
    ///   [`FlowNetwork::weigh_by_bottleneck`]). What this form does not see is which step an
    ///   edge's bytes belong to: traffic that would have fitted between a hierarchical
    ///   allreduce's phases on an idle link slows it all the same.
    fn start_topped_up(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        token: Completion,
        schedule: &Schedule,
        delay: SimDuration,
        reference: SimDuration,
    ) -> Result<(), NetworkError> {
        let (bytes, den) = schedule.fraction();
        let message = bytes.as_f64() / den as f64;
        let mut edges = std::mem::take(&mut self.scratch_edges);
        edges.clear();
        let tree = schedule.tree_edges();
        let weighted = tree.is_none();
        match tree {
            Some(tree) => {
                edges.extend(tree.into_iter().map(|(src, dst, count)| (src, dst, count as f64 * message)))
            }
            None => {
                let mut index: FastMap<(u32, u32), usize> = FastMap::default();
                let mut messages = Vec::new();
                for (step, repeat) in schedule.step_weights() {
                    messages.clear();
                    schedule.step_messages(step, &mut messages);
                    for &(src, dst, num) in &messages {
                        let amount = message * num as f64 * repeat as f64;
                        match index.entry((src.0, dst.0)) {
                            std::collections::hash_map::Entry::Occupied(slot) => {
                                edges[*slot.get()].2 += amount
                            }
                            std::collections::hash_map::Entry::Vacant(slot) => {
                                slot.insert(edges.len());
                                edges.push((src, dst, amount));
                            }
                        }
                    }
                }
            }
        }
        let timing = CoupledTiming {
            steps: u64::from(schedule.steps()),
            fill_bytes: 0.0,
            latency_sum: Some(SimDuration::ZERO),
            delay,
            reference: Some(reference),
            weighted,
        };
        let result = self.start_coupled(context, token, &edges, timing);
        self.scratch_edges = edges;
        result
    }

    /// Weighs the edge flows `members` of a coupling by their bytes over the mean bytes of the
    /// edges on its bottleneck link (the link with the most bytes per unit of capacity), so
    /// that on that link its edges claim one flow's share each, as the messages of the step
    /// that crosses it would. Edges elsewhere weigh in proportion to their bytes: heavier where
    /// they carry more, as the fast links inside a server do.
    fn weigh_by_bottleneck(&mut self, members: &[u32]) {
        let mut load: FastMap<u32, (f64, u32)> = FastMap::default();
        for &flow in members {
            let flow = &self.flows[flow as usize];
            for &link in flow.route.iter() {
                let entry = load.entry(link.0).or_insert((0.0, 0));
                entry.0 += flow.size;
                entry.1 += 1;
            }
        }
        // The most loaded link per capacity; ties go to the lowest link id (deterministic).
        let mut best: Option<(f64, u32, f64)> = None;
        for (&link, &(bytes, count)) in &load {
            let time = bytes / self.capacity[link as usize];
            let better = match best {
                None => true,
                Some((top, id, _)) => time > top || (time == top && link < id),
            };
            if better {
                best = Some((time, link, bytes / f64::from(count)));
            }
        }
        let unit = best.map_or(0.0, |(_, _, mean)| mean);
        if unit > 0.0 {
            for &flow in members {
                let flow = &mut self.flows[flow as usize];
                flow.weight = (flow.size / unit).max(MIN_WEIGHT);
            }
        }
    }

    /// Starts a coupled collective over `edges` (src, dst, bytes): all edge flows advance at
    /// one common rate, enter together after the longest edge latency, and the latencies of
    /// the remaining `steps - 1` steps are added at the end.
    fn start_coupled(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        token: Completion,
        edges: &[(RankId, RankId, f64)],
        timing: CoupledTiming,
    ) -> Result<(), NetworkError> {
        let CoupledTiming { steps, fill_bytes, latency_sum, delay, reference, weighted } = timing;
        // A ring's steps all cost the same; a pipeline's are summed by the caller.
        let ring = latency_sum.is_none();
        // Generations keep counting across reuse of a slot, so a stale completion of the slot's
        // previous coupling can never match the new one.
        let (id, generation) = match self.free_couplings.pop() {
            Some((id, generation)) => (id, generation.wrapping_add(1)),
            None => {
                self.couplings.push(None);
                ((self.couplings.len() - 1) as u32, 0)
            }
        };
        let mut members = self.spare_members.pop().unwrap_or_default();
        members.clear();
        let mut slowest = SimDuration::ZERO;
        let mut shortest = SimDuration::MAX;
        let mut slowest_step = SimDuration::ZERO;
        let now = context.now();
        for &(src, dst, bytes) in edges {
            let Path { route, latency, alone } = self.path(src, dst)?;
            let (flow, latency) = self.new_flow(now, route, latency, bytes, Owner::Coupled)?;
            self.flows[flow as usize].coupling = id;
            members.push(flow);
            slowest = slowest.max(latency);
            shortest = shortest.min(latency);
            let per_step = bytes / steps.max(1) as f64 / alone;
            slowest_step =
                slowest_step.max(latency.checked_add(SimDuration::from_ps((per_step * 1e12).ceil() as u64))?);
        }
        if weighted {
            self.weigh_by_bottleneck(&members);
        }
        let tail = match (reference, latency_sum) {
            (Some(reference), _) => {
                // Alone, the flows share only the links they cross together: the common rate
                // (per unit of weight) is the smallest capacity per member weight on any of
                // their links. Member weight per link, summed over the links `touched`.
                let mut touched = std::mem::take(&mut self.scratch_seeds);
                touched.clear();
                for &flow in &members {
                    for &link in self.flows[flow as usize].route.iter() {
                        touched.push(link);
                        self.link_members[link.0 as usize] = 0.0;
                    }
                }
                for &flow in &members {
                    let weight = self.flows[flow as usize].weight;
                    for &link in self.flows[flow as usize].route.iter() {
                        self.link_members[link.0 as usize] += weight;
                    }
                }
                // The minimum does not depend on the order: each link once is enough.
                let rate = touched
                    .iter()
                    .map(|&link| self.capacity[link.0 as usize] / self.link_members[link.0 as usize])
                    .fold(f64::INFINITY, f64::min);
                self.scratch_seeds = touched;
                // Every edge moves its bytes in the same time: the largest's at its weight.
                let data = members
                    .iter()
                    .map(|&flow| {
                        let flow = &self.flows[flow as usize];
                        flow.size / (flow.weight * rate)
                    })
                    .filter(|seconds| seconds.is_finite())
                    .fold(0.0, f64::max);
                let alone = slowest.checked_add(SimDuration::from_ps((data * 1e12).ceil() as u64))?;
                reference.saturating_sub(alone)
            }
            // The remaining steps' latencies: every step's own, less the entry latency.
            (None, Some(sum)) => sum.saturating_sub(slowest),
            (None, None) => slowest.checked_mul(steps.saturating_sub(1))?,
        };
        let fill_rate = members
            .iter()
            .map(|&flow| {
                self.flows[flow as usize]
                    .route
                    .iter()
                    .map(|l| self.capacity[l.0 as usize])
                    .fold(f64::INFINITY, f64::min)
            })
            .fold(f64::INFINITY, f64::min);
        let ring = ring.then_some(RingTiming {
            steps,
            shortest_latency: shortest,
            slowest_uncontended_step: slowest_step,
            entered: SimTime::ZERO,
            entry_latency: slowest,
        });
        self.couplings[id as usize] = Some(Coupling {
            members,
            ring,
            token,
            tail,
            fill_bytes,
            fill_rate,
            due: SimDuration::ZERO,
            due_generation: 0,
            rescheduled: false,
            generation,
        });
        Ok(context.wake_after(delay.checked_add(slowest)?, FlowEvent::Couple { coupling: id })?)
    }

    /// All edges of a steady-state collective leave the network at once; the others re-fill
    /// once, and the collective completes after its remaining latency and pipeline fill.
    fn coupling_done(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        coupling: u32,
        generation: u32,
    ) -> Result<(), NetworkError> {
        let members = match self.couplings.get_mut(coupling as usize) {
            Some(Some(state)) if state.generation == generation => std::mem::take(&mut state.members),
            _ => return Ok(()), // stale: the common rate changed since
        };
        let now = context.now();
        let mut seeds = std::mem::take(&mut self.scratch_seeds);
        seeds.clear();
        // Every edge leaves its links in one pass per link (a coupling can have a million
        // edges, hundreds of them on one link), keeping the order of the flows that stay.
        // Each link once: marked with a fresh epoch, as a re-fill marks its component's.
        self.epoch = self.epoch.wrapping_add(2);
        let mark = self.epoch;
        for &id in &members {
            for &link in self.flows[id as usize].route.iter() {
                let l = link.0 as usize;
                if self.link_epoch[l] != mark {
                    self.link_epoch[l] = mark;
                    seeds.push(link);
                }
            }
        }
        let flows = &self.flows;
        for &link in &seeds {
            self.on_link[link.0 as usize].retain(|&f| flows[f as usize].coupling != coupling);
        }
        for &id in &members {
            let flow = &mut self.flows[id as usize];
            if let Some(audit) = &mut self.audit {
                let left = flow.remaining - flow.rate * now.saturating_since(flow.updated).as_secs_f64();
                audit.bytes_delivered += flow.size - left.max(0.0);
            }
            flow.rate = 0.0;
            flow.remaining = 0.0;
            flow.generation = flow.generation.wrapping_add(1);
            flow.coupling = INDEPENDENT;
            let weighted = flow.weight != 1.0;
            flow.weight = 1.0;
            let route = flow.route;
            if weighted {
                for &link in route.iter() {
                    self.weighted_on_link[link.0 as usize] -= 1;
                }
            }
            if self.adaptive {
                for link in route.iter() {
                    self.routed[link.0 as usize] -= 1;
                }
            }
            self.free_flows.push(id);
        }
        self.active_flows -= members.len();
        self.spare_members.push(members);
        let Some(state) = self.couplings[coupling as usize].take() else { return Ok(()) };
        self.free_couplings.push((coupling, state.generation));
        let shared = seeds.iter().any(|link| !self.on_link[link.0 as usize].is_empty());
        let refilled = if shared { self.request_refill(context, &seeds) } else { Ok(()) };
        self.scratch_seeds = seeds;
        refilled?;
        if let Some(timing) = state.ring {
            // Step by step, a ring step lasts as long as its slowest message: either the
            // longest edge at its own bandwidth, or the bottleneck edges at the rate the data
            // actually moved (taking the shortest latency for them). Ring time = steps times
            // that; the data time and the entry latency are already behind us.
            let data = now.saturating_since(timing.entered);
            let per_step = SimDuration::from_ps(data.as_ps() / timing.steps.max(1));
            let step = timing.slowest_uncontended_step.max(timing.shortest_latency.checked_add(per_step)?);
            let total = step.checked_mul(timing.steps)?;
            let behind = timing.entry_latency.checked_add(data)?;
            return Ok(context.complete_after(total.saturating_sub(behind), state.token)?);
        }
        let fill = if state.fill_bytes > 0.0 && state.fill_rate.is_finite() && state.fill_rate > 0.0 {
            SimDuration::from_ps((state.fill_bytes / state.fill_rate * 1e12).ceil() as u64)
        } else {
            SimDuration::ZERO
        };
        Ok(context.complete_after(state.tail.checked_add(fill)?, state.token)?)
    }

    /// All edges of a steady-state collective enter the network together.
    fn couple(&mut self, context: &mut NetContext<'_, FlowEvent>, coupling: u32) -> Result<(), NetworkError> {
        let members = match self.couplings.get_mut(coupling as usize) {
            Some(Some(state)) => std::mem::take(&mut state.members),
            _ => return Ok(()),
        };
        let now = context.now();
        if let Some(Some(Coupling { ring: Some(timing), .. })) = self.couplings.get_mut(coupling as usize) {
            timing.entered = now;
        }
        let mut seeds = std::mem::take(&mut self.scratch_seeds);
        seeds.clear();
        for &flow in &members {
            self.flows[flow as usize].updated = now;
            let weighted = self.flows[flow as usize].weight != 1.0;
            for &link in self.flows[flow as usize].route.iter() {
                self.on_link[link.0 as usize].push(flow);
                if weighted {
                    self.weighted_on_link[link.0 as usize] += 1;
                }
                seeds.push(link);
            }
        }
        self.active_flows += members.len();
        self.stats.peak_concurrent_flows = self.stats.peak_concurrent_flows.max(self.active_flows);
        if let Some(Some(state)) = self.couplings.get_mut(coupling as usize) {
            state.members = members;
        }
        let refilled = self.request_refill(context, &seeds);
        self.scratch_seeds = seeds;
        refilled
    }

    /// The path of the next flow from `src` to `dst`. When routes do not depend on the flow,
    /// each pair's path is computed once, and each source remembers its last destination's
    /// (a ring sends to the same neighbour every step) in front of the map of all pairs.
    fn path(&mut self, src: RankId, dst: RankId) -> Result<Path, NetworkError> {
        let cacheable = !self.topology.routes_depend_on_flow();
        if cacheable {
            if let Some(&(last, path)) = self.last_path.get(src.0 as usize)
                && last == dst.0
            {
                return Ok(path);
            }
            if let Some(&path) = self.paths.get(&(src.0, dst.0)) {
                if let Some(slot) = self.last_path.get_mut(src.0 as usize) {
                    *slot = (dst.0, path);
                }
                return Ok(path);
            }
        }
        let (minimal, alternative) =
            self.topology.route_candidates(HostId(src.0), HostId(dst.0), self.next_flow_id)?;
        let route = match alternative {
            Some(valiant) if self.congestion(&valiant) < self.congestion(&minimal) => valiant,
            _ => minimal,
        };
        let latency = self.topology.route_latency(&route);
        let alone = route.iter().map(|l| self.capacity[l.0 as usize]).fold(f64::INFINITY, f64::min);
        let path = Path { route, latency, alone };
        if cacheable {
            self.paths.insert((src.0, dst.0), path);
            if let Some(slot) = self.last_path.get_mut(src.0 as usize) {
                *slot = (dst.0, path);
            }
        }
        Ok(path)
    }

    /// UGAL's cost of a route: its hop count times (1 + the most unfinished flows routed over
    /// any of its links, including those whose first byte is still on its way), so a longer
    /// non-minimal route is taken only when the minimal one is that much busier.
    fn congestion(&self, route: &Route) -> usize {
        let busiest = route.iter().map(|link| self.routed[link.0 as usize]).max().unwrap_or(0);
        route.len() * (1 + busiest as usize)
    }

    /// The flow's first byte has arrived: it joins its links and rates are re-filled.
    fn enter(&mut self, context: &mut NetContext<'_, FlowEvent>, id: u32) -> Result<(), NetworkError> {
        let flow = &mut self.flows[id as usize];
        flow.updated = context.now();
        if flow.remaining <= 0.0 || flow.route.is_empty() {
            // Nothing to share: done as soon as it arrives.
            if let Some(audit) = &mut self.audit {
                audit.bytes_delivered += flow.size;
            }
            return self.release(context, id);
        }
        for &link in flow.route.iter() {
            self.on_link[link.0 as usize].push(id);
        }
        self.active_flows += 1;
        self.stats.peak_concurrent_flows = self.stats.peak_concurrent_flows.max(self.active_flows);
        let route = flow.route;
        if route.iter().all(|link| self.on_link[link.0 as usize].len() == 1) {
            // Alone on every link (the common uncontended case): its bottleneck's full rate,
            // and nobody else's rate changes.
            let rate = route.iter().map(|link| self.capacity[link.0 as usize]).fold(f64::INFINITY, f64::min);
            let flow = &mut self.flows[id as usize];
            flow.rate = rate;
            flow.generation = flow.generation.wrapping_add(1);
            let generation = flow.generation;
            let delay = SimDuration::from_ps((flow.remaining / rate * 1e12).ceil() as u64);
            return Ok(context.wake_after(delay, FlowEvent::Finish { flow: id, generation })?);
        }
        self.request_refill(context, &route)
    }

    /// The flow's last byte has arrived: it leaves its links, the others re-fill, and its
    /// owner is told.
    fn finish(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        id: u32,
        generation: u32,
    ) -> Result<(), NetworkError> {
        let flow = &self.flows[id as usize];
        if flow.generation != generation || flow.rate == 0.0 {
            return Ok(()); // a stale completion: the rate changed since it was scheduled
        }
        let route = flow.route;
        for &link in route.iter() {
            let flows = &mut self.on_link[link.0 as usize];
            if let Some(position) = flows.iter().position(|&f| f == id) {
                flows.swap_remove(position);
            }
        }
        self.active_flows -= 1;
        let now = context.now();
        let flow = &mut self.flows[id as usize];
        if let Some(audit) = &mut self.audit {
            let left = flow.remaining - flow.rate * now.saturating_since(flow.updated).as_secs_f64();
            // The completion is rounded up to the next picosecond, so at most one picosecond of
            // the rate is over-delivered.
            if left.abs() > flow.rate * 1e-12 + 1e-6 && audit.violation.is_none() {
                audit.violation = Some(format!("flow {id} finished with {left} bytes left"));
            }
            audit.bytes_delivered += flow.size - left.max(0.0);
        }
        flow.rate = 0.0;
        flow.remaining = 0.0;
        flow.generation = flow.generation.wrapping_add(1);
        // Re-fill only if the flow shared a link with others: their rates may rise.
        if route.iter().any(|link| !self.on_link[link.0 as usize].is_empty()) {
            self.request_refill(context, &route)?;
        }
        self.release(context, id)
    }

    /// Frees the flow's slot and tells its owner.
    fn release(&mut self, context: &mut NetContext<'_, FlowEvent>, id: u32) -> Result<(), NetworkError> {
        let owner = self.flows[id as usize].owner;
        if self.adaptive {
            for link in self.flows[id as usize].route.iter() {
                self.routed[link.0 as usize] -= 1;
            }
        }
        self.free_flows.push(id);
        match owner {
            Owner::Single(token) => Ok(context.complete_after(SimDuration::ZERO, token)?),
            Owner::Message { run, lane, from, to, due } => {
                let early = due.saturating_since(context.now());
                if early > SimDuration::ZERO {
                    return Ok(context.wake_after(early, FlowEvent::MessageDue { run, lane, from, to })?);
                }
                self.message_done(context, run, lane, from)?;
                self.message_done(context, run, lane, to)
            }
            // Coupled edges never finish one by one: `coupling_done` ends them together.
            Owner::Coupled => Ok(()),
        }
    }

    /// Flows entered or left `seeds`: their neighbours' rates are re-filled once every event
    /// of this instant has run (or now, with [`FlowNetwork::refilling_immediately`]). Until
    /// then every flow keeps the rate it had, which no one reads before time moves on: a
    /// completion due now was scheduled at that rate and still holds, and a flow that entered
    /// now has rate 0 and no completion yet.
    fn request_refill(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        seeds: &[LinkId],
    ) -> Result<(), NetworkError> {
        if self.immediate {
            return self.refill(context, seeds);
        }
        self.pending_seeds.extend_from_slice(seeds);
        if !self.refill_scheduled {
            self.refill_scheduled = true;
            context.wake_after(SimDuration::ZERO, FlowEvent::Refill)?;
        }
        Ok(())
    }

    /// The batched re-fill of this instant, once it is the last event due now: events due at
    /// the same time but scheduled after it (completions that start new flows, flows that
    /// finish as soon as they enter) run first, so one re-fill covers every change.
    fn refill_pending(&mut self, context: &mut NetContext<'_, FlowEvent>) -> Result<(), NetworkError> {
        if context.more_due_now() {
            return Ok(context.wake_after(SimDuration::ZERO, FlowEvent::Refill)?);
        }
        self.refill_scheduled = false;
        let seeds = std::mem::take(&mut self.pending_seeds);
        let refilled = self.refill(context, &seeds);
        self.pending_seeds = seeds;
        self.pending_seeds.clear();
        refilled
    }

    /// Max-min fair rates for every flow connected to `seeds` through shared links.
    fn refill(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        seeds: &[LinkId],
    ) -> Result<(), NetworkError> {
        self.stats.recomputations += 1;
        // Two marks per recomputation: `epoch` = in the component, `epoch + 1` = frozen.
        self.epoch = self.epoch.wrapping_add(2);
        let epoch = self.epoch;
        self.component_links.clear();
        self.component_flows.clear();
        for &link in seeds {
            if self.link_epoch[link.0 as usize] != epoch {
                self.link_epoch[link.0 as usize] = epoch;
                self.component_links.push(link.0);
            }
        }
        // Breadth-first over links -> flows -> links.
        let mut next = 0;
        while next < self.component_links.len() {
            let link = self.component_links[next] as usize;
            next += 1;
            for &flow in &self.on_link[link] {
                if self.flow_epoch[flow as usize] == epoch {
                    continue;
                }
                // A coupled flow brings every edge of its collective into the component.
                let coupling = self.flows[flow as usize].coupling;
                let partners: &[u32] = match self.couplings.get(coupling as usize) {
                    Some(Some(state)) => &state.members,
                    _ => std::slice::from_ref(&flow),
                };
                for &member in partners {
                    if self.flow_epoch[member as usize] == epoch {
                        continue;
                    }
                    self.flow_epoch[member as usize] = epoch;
                    self.component_flows.push(member);
                    for &other in self.flows[member as usize].route.iter() {
                        if self.link_epoch[other.0 as usize] != epoch {
                            self.link_epoch[other.0 as usize] = epoch;
                            self.component_links.push(other.0);
                        }
                    }
                }
            }
        }
        self.stats.refilled_flows += self.component_flows.len() as u64;
        self.stats.work += (self.component_flows.len() + self.component_links.len()) as u64;
        if let Some(budget) = self.work_budget
            && self.stats.work > budget
        {
            return Err(NetworkError::OverBudget { budget });
        }

        if let [flow] = self.component_flows[..] {
            // A flow alone on its links (the common uncontended case) runs at its bottleneck.
            let route = self.flows[flow as usize].route;
            self.new_rate[flow as usize] =
                route.iter().map(|l| self.capacity[l.0 as usize]).fold(f64::INFINITY, f64::min);
        } else if let Some(share) = self.lone_coupling_share() {
            // One collective's edges and nothing else: they all freeze at the first link the
            // filling would fill, the one with the smallest fair share.
            for index in 0..self.component_flows.len() {
                let flow = self.component_flows[index] as usize;
                self.new_rate[flow] = share * self.flows[flow].weight;
            }
        } else {
            self.fill(epoch);
        }

        // Bring every re-filled flow up to date and reschedule its completion.
        let now = context.now();
        for index in 0..self.component_flows.len() {
            let id = self.component_flows[index] as usize;
            let rate = self.new_rate[id];
            let flow = &mut self.flows[id];
            if rate == flow.rate {
                continue;
            }
            let elapsed = now.saturating_since(flow.updated).as_secs_f64();
            flow.remaining = (flow.remaining - flow.rate * elapsed).max(0.0);
            flow.updated = now;
            flow.rate = rate;
            flow.generation = flow.generation.wrapping_add(1);
            let seconds = flow.remaining / rate;
            let delay = SimDuration::from_ps((seconds * 1e12).ceil() as u64);
            let generation = flow.generation;
            let coupling = flow.coupling;
            if coupling == INDEPENDENT {
                context.wake_after(delay, FlowEvent::Finish { flow: id as u32, generation })?;
            } else if let Some(Some(state)) = self.couplings.get_mut(coupling as usize) {
                // The edges of a coupled collective end together: one completion for all, at
                // the latest of theirs, rescheduled whenever their common rate changes.
                state.due = if state.due_generation == self.epoch { state.due.max(delay) } else { delay };
                state.due_generation = self.epoch;
                state.rescheduled = true;
            }
        }
        // Schedule the completion of every coupling whose rate changed.
        for index in 0..self.component_flows.len() {
            let coupling = self.flows[self.component_flows[index] as usize].coupling;
            if let Some(Some(state)) = self.couplings.get_mut(coupling as usize)
                && state.rescheduled
            {
                state.rescheduled = false;
                state.generation = state.generation.wrapping_add(1);
                let (delay, generation) = (state.due, state.generation);
                context.wake_after(delay, FlowEvent::CouplingDone { coupling, generation })?;
            }
        }
        if self.audit.is_some() {
            self.check_allocation();
        }
        Ok(())
    }

    /// If the current component is the edges of one steady-state collective and no other flow,
    /// the rate progressive filling gives them all: the smallest fair share of any of their
    /// links (capacity over flows on it), exactly the first share [`FlowNetwork::fill`] would pop.
    fn lone_coupling_share(&self) -> Option<f64> {
        let &first = self.component_flows.first()?;
        let coupling = self.flows[first as usize].coupling;
        let Some(Some(state)) = self.couplings.get(coupling as usize) else { return None };
        // The search brings every edge of a coupling in: if there are as many flows as edges,
        // they are all of them.
        if state.members.len() != self.component_flows.len()
            || self.component_flows.iter().any(|&flow| self.flows[flow as usize].coupling != coupling)
        {
            return None;
        }
        let share = self
            .component_links
            .iter()
            .map(|&link| self.capacity[link as usize] / self.link_weight(link as usize))
            .fold(f64::INFINITY, f64::min);
        Some(share)
    }

    /// The summed weight of the flows on link `l`: its flow count unless a weighted coupled
    /// edge is on it.
    fn link_weight(&self, l: usize) -> f64 {
        if self.weighted_on_link[l] == 0 {
            f64::from(self.on_link[l].len() as u32)
        } else {
            self.on_link[l].iter().map(|&flow| self.flows[flow as usize].weight).sum()
        }
    }

    /// Progressive filling over the current component with a min-heap of link fair shares.
    /// Flows of the component are marked `epoch`; each is marked `epoch + 1` once its rate is
    /// frozen.
    ///
    /// The heap is lazy: freezing a flow lowers its links' remaining capacity and weight but
    /// pushes nothing. A link's fair share never falls while the filling runs (a flow freezes
    /// at the smallest share `s <= r / w` of its links, which leaves another link of it at
    /// `(r - a s) / (w - a) >= r / w`), so an entry's key is a lower bound of its link's
    /// share: a popped link whose share has grown since goes back in at its current share, and
    /// the first link popped at its current share is the bottleneck. Each link has one entry at
    /// a time; a freeze costs its routes' arithmetic, not a heap push per link it crosses, and
    /// the filling stops when the last flow freezes instead of draining the heap.
    fn fill(&mut self, epoch: u64) {
        self.heap.clear();
        for &link in &self.component_links {
            let l = link as usize;
            self.remaining_capacity[l] = self.capacity[l];
            self.unfrozen[l] = self.on_link[l].len() as u32;
            self.unfrozen_weight[l] = self.link_weight(l);
            if self.unfrozen[l] > 0 {
                let share = self.capacity[l] / self.unfrozen_weight[l];
                self.heap.push((std::cmp::Reverse(Share(share)), link));
            }
        }
        let frozen = epoch.wrapping_add(1);
        // Once every flow is frozen the links left in the heap have nothing to decide.
        let mut unfrozen_flows = self.component_flows.len();
        while unfrozen_flows > 0
            && let Some((std::cmp::Reverse(Share(key)), link)) = self.heap.pop()
        {
            let l = link as usize;
            if self.unfrozen[l] == 0 {
                continue;
            }
            let share = self.remaining_capacity[l] / self.unfrozen_weight[l];
            if share > key {
                self.heap.push((std::cmp::Reverse(Share(share)), link));
                continue;
            }
            for index in 0..self.on_link[l].len() {
                let flow = self.on_link[l][index];
                if self.flow_epoch[flow as usize] != epoch {
                    continue; // already frozen
                }
                // The edges of a steady-state collective advance together: when one reaches
                // its bottleneck, all freeze at that rate, and what the others leave unused on
                // their links goes back to the rest of the traffic.
                let coupling = self.flows[flow as usize].coupling;
                let mut members = std::mem::take(&mut self.freeze_scratch);
                members.clear();
                match self.couplings.get(coupling as usize) {
                    Some(Some(state)) => members.extend_from_slice(&state.members),
                    _ => members.push(flow),
                }
                for &member in &members {
                    if self.flow_epoch[member as usize] != epoch {
                        continue;
                    }
                    self.flow_epoch[member as usize] = frozen;
                    unfrozen_flows -= 1;
                    let weight = self.flows[member as usize].weight;
                    let rate = share * weight;
                    self.new_rate[member as usize] = rate;
                    for &other in self.flows[member as usize].route.iter() {
                        let o = other.0 as usize;
                        self.remaining_capacity[o] = (self.remaining_capacity[o] - rate).max(0.0);
                        self.unfrozen[o] -= 1;
                        self.unfrozen_weight[o] = (self.unfrozen_weight[o] - weight).max(MIN_WEIGHT);
                    }
                }
                self.freeze_scratch = members;
            }
        }
    }

    /// Audit: capacity and bottleneck conditions of max-min fairness on the last component.
    fn check_allocation(&mut self) {
        let mut violation = None;
        for &link in &self.component_links {
            let l = link as usize;
            let load: f64 = self.on_link[l].iter().map(|&f| self.flows[f as usize].rate).sum();
            if load > self.capacity[l] * (1.0 + 1e-9) {
                violation = Some(format!("link {link} carries {load} B/s, capacity {}", self.capacity[l]));
            }
        }
        for &flow in &self.component_flows {
            if self.flows[flow as usize].coupling != INDEPENDENT {
                // A coupled edge may be held below its own links' share by a slower partner.
                continue;
            }
            let rate = self.flows[flow as usize].rate;
            let has_bottleneck = self.flows[flow as usize].route.iter().any(|&link| {
                let l = link.0 as usize;
                let load: f64 = self.on_link[l].iter().map(|&f| self.flows[f as usize].rate).sum();
                let fastest =
                    self.on_link[l].iter().map(|&f| self.flows[f as usize].rate).fold(0.0, f64::max);
                load >= self.capacity[l] * (1.0 - 1e-9) && rate >= fastest * (1.0 - 1e-9)
            });
            if !has_bottleneck {
                violation = Some(format!("flow {flow} at {rate} B/s has no bottleneck link"));
            }
        }
        if let Some(audit) = &mut self.audit {
            audit.checks += 1;
            if audit.violation.is_none() {
                audit.violation = violation;
            }
        }
    }

    /// Starts `collective` as its schedule of messages.
    fn start_run(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        token: Completion,
        collective: &Collective,
        group: &[RankId],
    ) -> Result<(), NetworkError> {
        let topology = self.topology;
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
        if self.steady_state && algorithm == CollectiveAlgorithm::Ring && group.len() > 1 {
            return self.start_coupled_ring(context, token, &wired, group, delay);
        }
        let chunk = pipeline_chunk(choice, collective.bytes, wire, group, &self.estimator)?;
        let schedule = Schedule::with_chunk(collective.kind, algorithm, wire, group, node_of, chunk)?;
        let floor =
            tree_step_floor(collective.kind, choice, collective.bytes, &schedule, group, &self.estimator)?;
        let schedule = schedule.with_step_floor(floor);
        if self.steady_state && schedule.steps() > 0 && algorithm == CollectiveAlgorithm::DoubleBinaryTree {
            return self.start_coupled_pipeline(context, token, &schedule, delay);
        }
        if self.steady_state
            && schedule.steps() > 0
            && (algorithm == CollectiveAlgorithm::Tree || has_coupled_form(algorithm))
        {
            let reference = match self.references.get(collective) {
                Some(&reference) => reference,
                None => {
                    let reference =
                        data_time(collective.kind, choice, collective.bytes, group, &mut self.estimator)?;
                    self.references.insert(*collective, reference);
                    reference
                }
            };
            return self.start_topped_up(context, token, &schedule, delay, reference);
        }
        let members = schedule.lanes().iter().map(Vec::len).sum::<usize>();
        if schedule.steps() == 0 {
            return Ok(context.complete_after(delay, token)?);
        }
        let run = CollectiveRun {
            schedule,
            token,
            step: vec![NOT_ENTERED; members],
            pending: vec![0; members],
            finished_members: 0,
        };
        let id = match self.free_runs.pop() {
            Some(id) => {
                self.runs[id as usize] = Some(run);
                id
            }
            None => {
                self.runs.push(Some(run));
                (self.runs.len() - 1) as u32
            }
        };
        Ok(context.wake_after(delay, FlowEvent::Begin { run: id })?)
    }

    /// Every member of every lane of `run` enters step 0.
    fn begin_run(&mut self, context: &mut NetContext<'_, FlowEvent>, run: u32) -> Result<(), NetworkError> {
        let lanes = self.run(run).schedule.lanes().len();
        let per_lane = self.run(run).schedule.lanes()[0].len();
        for lane in 0..lanes {
            for position in 0..per_lane {
                self.enter_step(context, run, lane as u32, position as u32, 0)?;
            }
        }
        Ok(())
    }

    fn run(&self, id: u32) -> &CollectiveRun {
        self.runs[id as usize]
            .as_ref()
            .expect("a message's collective is running until its last member finishes")
    }

    fn run_mut(&mut self, id: u32) -> &mut CollectiveRun {
        self.runs[id as usize]
            .as_mut()
            .expect("a message's collective is running until its last member finishes")
    }

    /// Member `position` of `lane` enters `step`: posts its messages, starting those whose
    /// partner is already there; steps without messages are passed straight through.
    fn enter_step(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        run: u32,
        lane: u32,
        position: u32,
        step: u32,
    ) -> Result<(), NetworkError> {
        // Scratch buffers are lent out for the call and put back, so the loop allocates nothing.
        let mut messages = std::mem::take(&mut self.scratch_messages);
        let mut starts = std::mem::take(&mut self.scratch_starts);
        let result = self.enter_step_with(context, run, lane, position, step, &mut messages, &mut starts);
        self.scratch_messages = messages;
        self.scratch_starts = starts;
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn enter_step_with(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        run: u32,
        lane: u32,
        position: u32,
        mut step: u32,
        messages: &mut Vec<Message>,
        starts: &mut Vec<(u32, u32, RankId, RankId, f64)>,
    ) -> Result<(), NetworkError> {
        loop {
            let state = self.run(run);
            let members = state.schedule.lanes()[lane as usize].len();
            let index = lane as usize * members + position as usize;
            if step == state.schedule.steps() {
                let state = self.run_mut(run);
                state.step[index] = step;
                state.finished_members += 1;
                if state.finished_members == state.step.len() {
                    let token = state.token;
                    self.runs[run as usize] = None;
                    self.free_runs.push(run);
                    context.complete_after(SimDuration::ZERO, token)?;
                }
                return Ok(());
            }
            messages.clear();
            state.schedule.messages(lane as usize, step, position, messages);
            let (bytes, den) = state.schedule.fraction();
            let lane_ranks = &state.schedule.lanes()[lane as usize];
            let base = lane as usize * members;
            // Start the messages whose other end has already reached this step; the others
            // start when it does.
            starts.clear();
            for message in messages.iter() {
                if state.step[base + message.peer as usize] == step {
                    let size = bytes.as_f64() * message.num as f64 / den as f64;
                    let (from, to) =
                        if message.send { (position, message.peer) } else { (message.peer, position) };
                    starts.push((from, to, lane_ranks[from as usize], lane_ranks[to as usize], size));
                }
            }
            let count = messages.len() as u32;
            let state = self.run_mut(run);
            state.step[index] = step;
            state.pending[index] = count;
            if count == 0 {
                step += 1;
                continue;
            }
            let due = context.now().checked_add(self.run(run).schedule.step_floor())?;
            for &(from, to, src, dst, size) in starts.iter() {
                self.start_flow(context, src, dst, size, Owner::Message { run, lane, from, to, due })?;
            }
            return Ok(());
        }
    }

    /// One of `position`'s messages of its current step is done.
    fn message_done(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        run: u32,
        lane: u32,
        position: u32,
    ) -> Result<(), NetworkError> {
        let state = self.run_mut(run);
        let members = state.schedule.lanes()[lane as usize].len();
        let index = lane as usize * members + position as usize;
        state.pending[index] -= 1;
        if state.pending[index] == 0 {
            let next = state.step[index] + 1;
            self.enter_step(context, run, lane, position, next)?;
        }
        Ok(())
    }
}

impl Network for FlowNetwork<'_> {
    type Event = FlowEvent;

    fn name(&self) -> &'static str {
        "flow"
    }

    fn host_count(&self) -> usize {
        self.topology.host_count()
    }

    fn server_of(&self, rank: RankId) -> Option<u32> {
        self.topology.node_of(HostId(rank.0)).ok()
    }

    fn start_transfer(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        src: RankId,
        dst: RankId,
        bytes: Bytes,
    ) -> Result<(), NetworkError> {
        self.start_flow(context, src, dst, bytes.as_f64(), Owner::Single(token))
    }

    fn start_collective(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        collective: &Collective,
        group: &[RankId],
    ) -> Result<(), NetworkError> {
        self.start_run(context, token, collective, group)
    }

    fn start_memcpy(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        rank: RankId,
        direction: MemcpyDirection,
        bytes: Bytes,
    ) -> Result<(), NetworkError> {
        let to_device = direction == MemcpyDirection::HostToDevice;
        let route = self.topology.host_memory_route(HostId(rank.0), to_device)?;
        self.start_flow_on(context, route, bytes.as_f64(), Owner::Single(token))
    }

    fn handle(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        event: Self::Event,
    ) -> Result<(), NetworkError> {
        match event {
            FlowEvent::Enter { flow } => self.enter(context, flow),
            FlowEvent::Begin { run } => self.begin_run(context, run),
            FlowEvent::Couple { coupling } => self.couple(context, coupling),
            FlowEvent::CouplingDone { coupling, generation } => {
                self.coupling_done(context, coupling, generation)
            }
            FlowEvent::Finish { flow, generation } => self.finish(context, flow, generation),
            FlowEvent::Refill => self.refill_pending(context),
            FlowEvent::MessageDue { run, lane, from, to } => {
                self.message_done(context, run, lane, from)?;
                self.message_done(context, run, lane, to)
            }
        }
    }
}
