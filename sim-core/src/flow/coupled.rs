//! Collectives in their steady-state form (the `flow` fidelity): all the edges of a
//! collective advance together, instead of one flow per message.
//!
//! A coupling's edges are one group flow of the max-min solver ([`super::maxmin`]): the links
//! they cross, each with the summed weight of the edges crossing it. It enters the network
//! after the longest edge latency, shares the links at one rate per unit of weight, and
//! leaves in one event, after which the collective completes once its remaining latency (and
//! a pipeline's fill and drain) has passed. A 64-rank all-to-all is one flow on a few
//! hundred links, not 4,032 flows, and its spread is built once per distinct edge list.
//! Rings and double binary trees advance every edge at one rate, and a ring's time is rebuilt
//! step by step from the rate its data actually moved at. NCCL's tree, the hierarchical
//! allreduce, chains and the direct all-to-all ([`has_coupled_form`]) are topped up to their
//! analytical time when alone, the last three weighing each edge by its bytes (on its
//! bottleneck link each edge claims one flow's share).
//!
//! Invariants: a coupling's group flow is on all its links or none; its completion event is
//! rescheduled whenever its rate changes and carries the coupling's generation, so a
//! stale one is skipped; uncontended, a topped-up collective takes exactly its analytical
//! time; a coupling's slot is reused once it has completed.

use crate::lookup::FastLookupMap;
use std::collections::BTreeMap;

use topology::{LinkId, Route};
use units::{SimDuration, SimTime};

use crate::fast_hash::FastMap;
use crate::graph::{Collective, CollectiveAlgorithm, CollectiveKind, RankId};
use crate::nccl::protocol::Choice;
use crate::nccl::timing::data_time;
use crate::network::{AnalyticalNetwork, Completion, NetContext, NetworkError};
use crate::schedule::{Schedule, ring_channels};

use super::event::{FlowEvent, Owner};
use super::flows::{Flows, GroupTiming, Path, server_of};
use super::maxmin::{MIN_WEIGHT, MaxMin, SpreadLink};

/// The steady-state collectives in progress, and what they keep between collectives.
#[derive(Debug)]
pub(super) struct Couplings {
    /// Each coupling in progress, by id (the group id of its group flow in the solver).
    slots: Vec<Option<Coupling>>,
    /// Free coupling slots, with the generation their last coupling ended at.
    free: Vec<(u32, u32)>,
    /// The rings of each group's ring collectives (see [`Couplings::start_coupled_ring`]).
    ring_edges: FastMap<Vec<RankId>, RingEdges>,
    /// The analytical data time of the collectives already seen that run as coupled flows
    /// topped up to it (see `start_topped_up`).
    references: FastLookupMap<Collective, SimDuration>,
    /// Scratch for a list of links: those a coupled collective enters, leaves or crosses.
    scratch_seeds: Vec<LinkId>,
    /// Scratch, zero between uses: per link, where its entry is in the spread being built,
    /// plus one (see [`Couplings::prepare`]).
    spread_index: Vec<u32>,
    /// The steady-state form of every collective already started as a ring, a pipeline or
    /// topped up, by collective and the first rank of its group (a folded run starts one
    /// collective over its replicas' groups too): a collective seen again (every layer's
    /// all-to-all, every bucket's ring) skips building its schedule and, where it can, its
    /// group flow (see [`Couplings::start_known`]). Pipelines draw their jitter per start
    /// and are not kept when links draw jitter.
    forms: FastLookupMap<(Collective, RankId), SteadyForm>,
}

/// A collective to start in its steady-state form: who waits for it, what it is, over which
/// ranks, and the fixed cost before its first byte.
#[derive(Debug, Clone, Copy)]
pub(super) struct Start<'a> {
    /// Completed when the collective is.
    pub(super) token: Completion,
    /// The collective (the key its steady-state form is kept under).
    pub(super) collective: &'a Collective,
    /// Its ranks.
    pub(super) group: &'a [RankId],
    /// Launch and protocol latencies before its first byte.
    pub(super) delay: SimDuration,
}

/// A collective's steady-state form, as [`Couplings::start_known`] restarts it.
#[derive(Debug)]
struct SteadyForm {
    /// The ranks it ran over (checked on reuse).
    group: Vec<RankId>,
    /// Its edges (source, destination, bytes).
    edges: Vec<(RankId, RankId, f64)>,
    /// Its timing.
    timing: CoupledTiming,
    /// Its group flow, kept where paths do not change between starts (routes that do not
    /// depend on the flow, no jitter drawn per start; see [`Couplings::start_form`]).
    prepared: Option<Prepared>,
}

/// A coupled collective's edges as one group flow (see [`Couplings::prepare`]), with what
/// its timing needs of their paths.
#[derive(Debug, Clone)]
struct Prepared {
    /// The links the edges cross, each once, in the order first crossed.
    spread: Vec<SpreadLink>,
    /// Bytes per unit of weight the slowest edge moves (see [`MaxMin::add_group`]).
    size: f64,
    /// Bytes of all edges.
    bytes: f64,
    /// The longest and shortest edge latency.
    slowest: SimDuration,
    shortest: SimDuration,
    /// The slowest uncontended step: latency plus one step's message at the path's own
    /// bandwidth, over all edges.
    slowest_step: SimDuration,
    /// The slowest link's capacity on any edge.
    fill_rate: f64,
    /// Latency still owed after the data has moved (see [`Coupling::tail`]).
    tail: SimDuration,
}

impl Couplings {
    /// No coupling yet, on a topology of `links` links.
    pub(super) fn new(links: usize) -> Self {
        Couplings {
            slots: Vec::new(),
            free: Vec::new(),
            ring_edges: FastMap::default(),
            references: FastLookupMap::new(),
            scratch_seeds: Vec::new(),
            spread_index: vec![0; links],
            forms: FastLookupMap::new(),
        }
    }
}

/// A coupling's edges are one group flow of the solver: its completion follows that flow's rate.
impl GroupTiming for Couplings {
    /// The group flow of `coupling` has a new rate, its last byte due after `delay`: the edges
    /// of a coupled collective end together, when the edge that needs the most at its weight
    /// does, rescheduled (by `schedule_done`) whenever the rate changes.
    fn rate_changed(&mut self, coupling: u32, delay: Option<SimDuration>) {
        if let Some(Some(state)) = self.slots.get_mut(coupling as usize) {
            // At rate 0 (a link of its spread down) no completion until a re-fill raises it.
            state.due = delay;
            state.rescheduled = true;
        }
    }

    /// Schedules the completion of every coupling of the component `solver` re-filled last
    /// whose rate changed.
    fn schedule_done(
        &mut self,
        solver: &MaxMin<Owner>,
        context: &mut NetContext<'_, FlowEvent>,
    ) -> Result<(), NetworkError> {
        for &flow in solver.component() {
            let coupling = solver.flow(flow).group;
            if let Some(Some(state)) = self.slots.get_mut(coupling as usize)
                && state.rescheduled
            {
                state.rescheduled = false;
                // The new generation makes the completion scheduled at the old rate stale; at
                // rate 0 none is scheduled until a re-fill raises it.
                state.generation = state.generation.wrapping_add(1);
                let (delay, generation) = (state.due, state.generation);
                if let Some(delay) = delay {
                    context.wake_after(delay, FlowEvent::CouplingDone { coupling, generation })?;
                }
            }
        }
        Ok(())
    }
}

/// A collective in its steady-state form: its edges as one group flow, all advancing at one
/// common rate per unit of weight.
#[derive(Debug)]
struct Coupling {
    token: Completion,
    /// Its edges as one group flow of the solver.
    flow: u32,
    /// The bytes its edges carry in all.
    bytes: f64,
    /// Latency still owed after the data has moved (the steps' latencies beyond the first).
    tail: SimDuration,
    /// Bytes a pipeline's fill and drain add on its busiest edge, charged when the data has
    /// moved at `fill_rate`: the slowest edge path's own bandwidth, because few edges are busy
    /// while a pipeline fills or drains.
    fill_bytes: f64,
    fill_rate: f64,
    /// For a ring: its steps, its shortest edge latency, its slowest uncontended step
    /// (latency plus one step's message at the path's own bandwidth, over all edges), and when
    /// its data started moving (see [`Couplings::coupling_done`]).
    ring: Option<RingTiming>,
    /// Completion bookkeeping: the group flow's remaining time at its last new rate, whether
    /// it changed in the last re-fill, and the generation of the pending completion.
    due: Option<SimDuration>,
    rescheduled: bool,
    generation: u32,
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
/// (see `Couplings::start_topped_up`): those with many messages and no barrier
/// between them that other traffic could turn into a wait (a hierarchical allreduce's
/// 2(g-1) + 2(n-1) ring steps, a chain's C + p - 2 pipeline steps, the direct all-to-all's
/// p(p-1) concurrent sends, as NCCL posts them). Halving-doubling, recursive doubling and
/// binomial trees (log2 p steps) and the pairwise all-to-all (p-1 steps) wait for each step's
/// slowest message before the next, as MPI runs them: they stay message by message, where a
/// member slowed by other traffic holds every later step up. A steady form would miss that:
/// tried on them, it came out far faster than message by message beside a transfer that
/// shares one GPU's link (docs/collectives.md, "Fidelities").
pub(super) fn has_coupled_form(algorithm: CollectiveAlgorithm) -> bool {
    matches!(
        algorithm,
        CollectiveAlgorithm::Hierarchical | CollectiveAlgorithm::Chain | CollectiveAlgorithm::Direct
    )
}

/// How a coupled collective's time adds up besides its data and the fixed cost before its
/// first byte (see [`Couplings::start_form`]).
#[derive(Debug, Clone, Copy)]
struct CoupledTiming {
    /// Steps of the schedule.
    steps: u64,
    /// Bytes of the pipeline's fill and drain, charged at the end at the coupled rate.
    fill_bytes: f64,
    /// The sum of every step's latency (a pipeline), or `None`: every step costs the slowest
    /// edge's (a ring).
    latency_sum: Option<SimDuration>,
    /// The collective's uncontended time by the analytical model, if the coupled flows
    /// stand for its steady state only: what they take alone is topped up to it, and
    /// contention stretches the flows (NCCL's tree).
    reference: Option<SimDuration>,
    /// Edges carry different amounts and advance in proportion to them, all finishing
    /// together (see [`Couplings::prepare`]); otherwise every edge advances at
    /// the same rate.
    weighted: bool,
    /// The latency jitter its steps add (each step the largest draw among its messages),
    /// when the caller drew it per step; `None`: drawn in `start_form`, every step over
    /// every edge.
    jitter: Option<SimDuration>,
}

impl Couplings {
    /// The analytical data time of `collective` under `choice` over `group`, the reference a
    /// topped-up steady state takes alone (computed once per distinct collective).
    pub(super) fn reference(
        &mut self,
        estimator: &mut AnalyticalNetwork<'_>,
        collective: &Collective,
        choice: Choice,
        group: &[RankId],
    ) -> Result<SimDuration, NetworkError> {
        Ok(match self.references.get(collective) {
            Some(&reference) => reference,
            None => {
                let reference = data_time(collective.kind, choice, collective.bytes, group, estimator)?;
                self.references.insert(*collective, reference);
                reference
            }
        })
    }

    /// Starts `start.collective` over `start.group` again in the steady-state form it took
    /// before (a ring, a pipeline or topped up); `None` if it has not run in such a form yet.
    pub(super) fn start_known(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        start: Start<'_>,
    ) -> Option<Result<(), NetworkError>> {
        let key = (*start.collective, *start.group.first()?);
        // The forms are set aside while the form starts in place (`start_form` never reads
        // them): one lookup, and the form is not moved out of the map and back.
        let mut forms = std::mem::take(&mut self.forms);
        let result = match forms.get_mut(&key) {
            Some(form) if form.group == start.group => {
                Some(self.start_form(flows, context, start.token, start.delay, form))
            }
            _ => None,
        };
        self.forms = forms;
        result
    }

    /// Starts `start.collective` in the steady-state form of `edges` and `timing`, kept for
    /// [`Couplings::start_known`] if `keep`.
    fn start_new(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        start: Start<'_>,
        edges: Vec<(RankId, RankId, f64)>,
        timing: CoupledTiming,
        keep: bool,
    ) -> Result<(), NetworkError> {
        let mut form = SteadyForm { group: start.group.to_vec(), edges, timing, prepared: None };
        let result = self.start_form(flows, context, start.token, start.delay, &mut form);
        if keep && let Some(&first) = start.group.first() {
            self.forms.insert((*start.collective, first), form);
        }
        result
    }

    /// Starts a ring collective in its steady-state form: one flow per ring edge of every
    /// channel, each carrying what the edge carries over the whole ring (2(p-1)/p of the
    /// channel's share for an allreduce, (p-1)/p for reduce-scatter and allgather).
    /// `wired` is the collective with its bytes on the wire.
    pub(super) fn start_coupled_ring(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        start: Start<'_>,
        wired: &Collective,
    ) -> Result<(), NetworkError> {
        let (collective, group) = (wired, start.group);
        // A group's rings are the same every time: computed on its first collective.
        if !self.ring_edges.contains_key(group) {
            let topology = flows.topology;
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
        let mut edges = Vec::new();
        if let Some(rings) = self.ring_edges.get(group) {
            let bytes = collective.bytes.as_f64() * volume / rings.channels as f64;
            edges.extend(rings.edges.iter().map(|&(src, dst)| (src, dst, bytes)));
        }
        let timing = CoupledTiming {
            steps: steps as u64,
            fill_bytes: 0.0,
            latency_sum: None,
            reference: None,
            weighted: false,
            jitter: None,
        };
        self.start_new(flows, context, start, edges, timing, true)
    }

    /// Starts a pipelined schedule (the double binary tree) in its steady-state form: one flow per edge
    /// the schedule uses, carrying all its messages; the pipeline's fill and drain (the steps
    /// in which even the busiest edge is idle) are charged at the end at the coupled rate.
    pub(super) fn start_coupled_pipeline(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        start: Start<'_>,
        schedule: &Schedule,
    ) -> Result<(), NetworkError> {
        let (bytes, den) = schedule.fraction();
        // Per edge: the steps it is used in and its largest message; per step, the latency of
        // its slowest path (a tree's steps near the leaves cross other links than near the
        // root, so the steps do not all cost the slowest edge's latency).
        let mut usage: BTreeMap<(usize, u32, u32), (u64, u64)> = BTreeMap::new();
        let mut edge_latency: BTreeMap<(RankId, RankId), SimDuration> = BTreeMap::new();
        let mut step_latency = vec![SimDuration::ZERO; schedule.steps() as usize];
        let mut step_jitter = vec![SimDuration::ZERO; schedule.steps() as usize];
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
                                let latency = flows.path(edge.0, edge.1)?.latency;
                                edge_latency.insert(edge, latency);
                                latency
                            }
                        };
                        let slot = &mut step_latency[step as usize];
                        *slot = (*slot).max(latency);
                        if flows.has_jitter() {
                            let route = flows.path(edge.0, edge.1)?.route;
                            let draw = flows.jitter(&route);
                            let slot = &mut step_jitter[step as usize];
                            *slot = (*slot).max(draw);
                        }
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
        let jitter = step_jitter.iter().fold(SimDuration::ZERO, |sum, &j| sum.saturating_add(j));
        let timing = CoupledTiming {
            steps,
            fill_bytes,
            latency_sum: Some(latency_sum),
            reference: None,
            weighted: false,
            jitter: Some(jitter),
        };
        // Its jitter is drawn above, per start: a kept form would repeat one draw.
        let keep = !flows.has_jitter();
        self.start_new(flows, context, start, edges, timing, keep)
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
    ///   [`Couplings::weigh_by_bottleneck`]). What this form does not see is which step an
    ///   edge's bytes belong to: traffic that would have fitted between a hierarchical
    ///   allreduce's phases on an idle link slows it all the same.
    pub(super) fn start_topped_up(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        start: Start<'_>,
        schedule: &Schedule,
        reference: SimDuration,
    ) -> Result<(), NetworkError> {
        let (bytes, den) = schedule.fraction();
        let message = bytes.as_f64() / den as f64;
        let mut edges = Vec::new();
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
            reference: Some(reference),
            weighted,
            jitter: None,
        };
        self.start_new(flows, context, start, edges, timing, true)
    }

    /// The group flow of `edges` (src, dst, bytes) under `timing`: the links the edges cross
    /// with the weight each claims there, and what the timing needs of their paths; each
    /// edge's route goes into `routes`, in edge order.
    ///
    /// Weighted (`timing.weighted`), each edge weighs its bytes over the mean bytes of the
    /// edges on its bottleneck link (the link with the most bytes per unit of capacity), so
    /// that on that link its edges claim one flow's share each, as the messages of the step
    /// that crosses it would, and every edge finishes together; edges elsewhere weigh in
    /// proportion to their bytes, heavier where they carry more, as the fast links inside a
    /// server do. Otherwise every edge weighs 1 and advances at the same rate. Under
    /// flow-dependent routing each edge's path is its own draw, in edge order.
    fn prepare(
        &mut self,
        flows: &mut Flows<'_>,
        edges: &[(RankId, RankId, f64)],
        timing: &CoupledTiming,
        routes: &mut Vec<Route>,
    ) -> Result<Prepared, NetworkError> {
        let steps = timing.steps;
        routes.clear();
        let (mut slowest, mut shortest, mut slowest_step) =
            (SimDuration::ZERO, SimDuration::MAX, SimDuration::ZERO);
        let mut spread: Vec<SpreadLink> = Vec::new();
        for &(src, dst, bytes) in edges {
            let Path { route, latency, alone } = flows.path(src, dst)?;
            flows.count_edge_paths(1);
            routes.push(route);
            slowest = slowest.max(latency);
            shortest = shortest.min(latency);
            let per_step = bytes / steps.max(1) as f64 / alone;
            slowest_step =
                slowest_step.max(latency.checked_add(SimDuration::from_ps((per_step * 1e12).ceil() as u64))?);
            // Bytes and edges per link first (the weights need the bottleneck's mean).
            for &link in route.iter() {
                let index = &mut self.spread_index[link.0 as usize];
                if *index == 0 {
                    spread.push(SpreadLink { link, weight: 0.0, bytes: 0.0, edges: 0, weighted: false });
                    *index = spread.len() as u32;
                }
                let entry = &mut spread[*index as usize - 1];
                entry.bytes += bytes;
                entry.edges += 1;
            }
        }
        let nominal = |entry: &SpreadLink| flows.solver.nominal(entry.link);
        // The unit of weight: the mean edge on the most loaded link per capacity (ties to the
        // lowest link id); unweighted (or without bytes), every edge weighs 1.
        let mut unit = 0.0;
        if timing.weighted {
            let mut best: Option<(f64, u32)> = None;
            for entry in &spread {
                let time = entry.bytes / nominal(entry);
                if best.is_none_or(|(top, id)| time > top || (time == top && entry.link.0 < id)) {
                    best = Some((time, entry.link.0));
                    unit = entry.bytes / f64::from(entry.edges);
                }
            }
        }
        let mut size: f64 = 0.0;
        for (&(_, _, bytes), route) in edges.iter().zip(routes.iter()) {
            let weight = if unit > 0.0 { (bytes / unit).max(MIN_WEIGHT) } else { 1.0 };
            // An edge with nothing to move (or nowhere to move it) is done as soon as it enters.
            if !route.is_empty() && bytes > 0.0 {
                size = size.max(bytes / weight);
            }
            for &link in route.iter() {
                let entry = &mut spread[self.spread_index[link.0 as usize] as usize - 1];
                entry.weight += weight;
                entry.weighted |= weight != 1.0;
            }
        }
        for entry in &spread {
            self.spread_index[entry.link.0 as usize] = 0;
        }
        let tail = match (timing.reference, timing.latency_sum) {
            (Some(reference), _) => {
                // Alone, the edges share only the links they cross together: the common rate
                // (per unit of weight) is the smallest capacity per unit of weight on any of
                // their links, and every edge moves its bytes in the same time: the one that
                // needs the most at its weight.
                let rate =
                    spread.iter().map(|entry| nominal(entry) / entry.weight).fold(f64::INFINITY, f64::min);
                let data = size / rate;
                let data = if data.is_finite() { data } else { 0.0 };
                let alone = slowest.checked_add(SimDuration::from_ps((data * 1e12).ceil() as u64))?;
                reference.saturating_sub(alone)
            }
            // The remaining steps' latencies: every step's own, less the entry latency.
            (None, Some(sum)) => sum.saturating_sub(slowest),
            (None, None) => slowest.checked_mul(steps.saturating_sub(1))?,
        };
        Ok(Prepared {
            fill_rate: spread.iter().map(nominal).fold(f64::INFINITY, f64::min),
            bytes: edges.iter().map(|edge| edge.2).sum(),
            spread,
            size,
            slowest,
            shortest,
            slowest_step,
            tail,
        })
    }

    /// Starts `form` after `delay`: all its edges advance at one common rate (per unit of
    /// weight) as one group flow, enter together after the longest edge latency, and the
    /// latencies of the remaining steps are added at the end. Its group flow is prepared
    /// once and kept in the form where paths do not change between starts (routes that do
    /// not depend on the flow, no jitter drawn here per start), else anew.
    fn start_form(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        token: Completion,
        delay: SimDuration,
        form: &mut SteadyForm,
    ) -> Result<(), NetworkError> {
        let timing = form.timing;
        // Generations keep counting across reuse of a slot, so a stale completion of the slot's
        // previous coupling can never match the new one.
        let (id, generation) = match self.free.pop() {
            Some((id, generation)) => (id, generation.wrapping_add(1)),
            None => {
                self.slots.push(None);
                ((self.slots.len() - 1) as u32, 0)
            }
        };
        // Jitter drawn here, per edge route in edge order, needs the routes: a fresh preparation.
        let draws_jitter = timing.jitter.is_none() && flows.has_jitter();
        let kept = flows.routes_cached() && !draws_jitter;
        let mut routes = Vec::new();
        // A kept preparation is read in place; a fresh one is kept for the next start where
        // paths do not change between starts, else dropped (with any kept before).
        let prepared: &Prepared = if kept && let Some(prepared) = &form.prepared {
            flows.count_edge_paths(form.edges.len());
            prepared
        } else {
            let fresh = self.prepare(flows, &form.edges, &timing, &mut routes)?;
            form.prepared.insert(fresh)
        };
        // Latency jitter: each step waits for its slowest message, so each adds the largest
        // of its edges' draws; it delays the whole collective (the flows enter that much
        // later), on top of the nominal latencies the timing is built from.
        let jitter = match timing.jitter {
            Some(jitter) => jitter,
            None if draws_jitter => {
                let mut sum = SimDuration::ZERO;
                for _ in 0..timing.steps.max(1) {
                    let mut step = SimDuration::ZERO;
                    for route in &routes {
                        step = step.max(flows.jitter(route));
                    }
                    sum = sum.saturating_add(step);
                }
                sum
            }
            None => SimDuration::ZERO,
        };
        // A ring's steps all cost the same; a pipeline's are summed by the caller.
        let ring = timing.latency_sum.is_none().then_some(RingTiming {
            steps: timing.steps,
            shortest_latency: prepared.shortest,
            slowest_uncontended_step: prepared.slowest_step,
            entered: SimTime::ZERO,
            entry_latency: prepared.slowest,
        });
        let (spread, size, edges, bytes) =
            (&prepared.spread, prepared.size, form.edges.len() as u32, prepared.bytes);
        let flow = flows.add_group(context.now(), id, spread, size, edges, bytes)?;
        self.slots[id as usize] = Some(Coupling {
            flow,
            bytes,
            ring,
            token,
            tail: prepared.tail,
            fill_bytes: timing.fill_bytes,
            fill_rate: prepared.fill_rate,
            due: Some(SimDuration::ZERO),
            rescheduled: false,
            generation,
        });
        let entry = delay.checked_add(prepared.slowest)?.checked_add(jitter)?;
        if !kept {
            form.prepared = None;
        }
        Ok(context.wake_after(entry, FlowEvent::Couple { coupling: id })?)
    }

    /// All edges of a steady-state collective leave the network at once; the others re-fill
    /// once, and the collective completes after its remaining latency and pipeline fill.
    pub(super) fn coupling_done(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        coupling: u32,
        generation: u32,
    ) -> Result<(), NetworkError> {
        match self.slots.get(coupling as usize) {
            Some(Some(state)) if state.generation == generation => {}
            _ => return Ok(()), // stale: the common rate changed since
        }
        let now = context.now();
        let Some(state) = self.slots[coupling as usize].take() else { return Ok(()) };
        let mut seeds = std::mem::take(&mut self.scratch_seeds);
        seeds.clear();
        flows.leave_group(now, state.flow, state.bytes, &mut seeds);
        self.free.push((coupling, state.generation));
        let shared = seeds.iter().any(|&seed| flows.solver.is_busy_seed(seed));
        let refilled = if shared { flows.request_refill(context, &seeds, self) } else { Ok(()) };
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
    pub(super) fn couple(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        coupling: u32,
    ) -> Result<(), NetworkError> {
        let Some(Some(state)) = self.slots.get_mut(coupling as usize) else { return Ok(()) };
        let now = context.now();
        if let Some(timing) = &mut state.ring {
            timing.entered = now;
        }
        let (flow, generation) = (state.flow, state.generation);
        let mut seeds = std::mem::take(&mut self.scratch_seeds);
        seeds.clear();
        flows.join_group(now, flow, &mut seeds);
        let refilled = if seeds.is_empty() {
            // No edge crosses a link (every edge stays on its rank): its data has moved.
            context
                .wake_after(SimDuration::ZERO, FlowEvent::CouplingDone { coupling, generation })
                .map_err(NetworkError::from)
        } else {
            flows.request_refill(context, &seeds, self)
        };
        self.scratch_seeds = seeds;
        refilled
    }
}
