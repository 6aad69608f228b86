//! Collectives in their steady-state form (the `flow` fidelity): one long-lived flow per edge
//! of the collective, all its edges coupled, instead of one flow per message.
//!
//! A coupling's edge flows are one group of the max-min solver ([`super::maxmin`]): they
//! enter the network together after the longest edge latency, share the links at one rate
//! per unit of weight, and leave together in one event, after which the collective completes
//! once its remaining latency (and a pipeline's fill and drain) has passed. Rings and double
//! binary trees advance every edge at one rate, and a ring's time is rebuilt step by step from
//! the rate its data actually moved at. NCCL's tree, the hierarchical allreduce, chains and the
//! direct all-to-all ([`has_coupled_form`]) are topped up to their analytical time when alone,
//! the last three weighing each edge by its bytes (on its bottleneck link each edge claims one
//! flow's share).
//!
//! Invariants: a coupling's edges are all on their links or none is; its completion event is
//! rescheduled whenever their common rate changes and carries the coupling's generation, so a
//! stale one is skipped; uncontended, a topped-up collective takes exactly its analytical
//! time; a coupling's slot and member list are reused once it has completed.

use crate::lookup::LookupMap;
use std::collections::BTreeMap;

use topology::LinkId;
use units::{SimDuration, SimTime};

use crate::fast_hash::FastMap;
use crate::graph::{Collective, CollectiveAlgorithm, CollectiveKind, RankId};
use crate::nccl::protocol::Choice;
use crate::nccl::timing::data_time;
use crate::network::{AnalyticalNetwork, Completion, NetContext, NetworkError};
use crate::schedule::{Schedule, ring_channels};

use super::event::{FlowEvent, Owner};
use super::flows::{Flows, GroupTiming, Path, server_of};
use super::maxmin::{MIN_WEIGHT, MaxMin};

/// The steady-state collectives in progress, and what they keep between collectives.
#[derive(Debug)]
pub(super) struct Couplings {
    /// Each coupling in progress, by id (its edge flows are the solver's group of that id).
    slots: Vec<Option<Coupling>>,
    /// Free coupling slots, with the generation their last coupling ended at.
    free: Vec<(u32, u32)>,
    /// The rings of each group's ring collectives (see [`Couplings::start_coupled_ring`]).
    ring_edges: FastMap<Vec<RankId>, RingEdges>,
    /// The analytical data time of the collectives already seen that run as coupled flows
    /// topped up to it (see `start_topped_up`).
    references: LookupMap<Collective, SimDuration>,
    /// Scratch for the edges (source, destination, bytes) of a coupled collective.
    scratch_edges: Vec<(RankId, RankId, f64)>,
    /// Scratch for a list of links: those a coupled collective enters, leaves or crosses.
    scratch_seeds: Vec<LinkId>,
    /// Scratch: a coupled collective's edge weight on each link (see `start_coupled`).
    link_members: Vec<f64>,
    /// Scratch: a coupled collective's bytes and edges on each link, zero between uses (see
    /// `weigh_by_bottleneck`).
    link_load: Vec<(f64, u32)>,
    /// Member lists of finished couplings, reused by the next ones.
    spare_members: Vec<Vec<u32>>,
    /// The paths of every edge list started so far, by a hash of its (source, destination)
    /// pairs, when routes do not depend on the flow: a collective that starts again (every
    /// layer's all-to-all, every bucket's ring) reads its edges' paths in order instead of
    /// looking each pair up in the map of all pairs, whose entries a 64-rank all-to-all
    /// touches at random (4,032 pairs per start). Checked pair by pair against the edges.
    edge_paths: FastMap<u64, Vec<EdgePath>>,
}

/// One edge of a cached edge list and its path (see [`Couplings::edge_paths`]).
#[derive(Debug, Clone, Copy)]
struct EdgePath {
    src: u32,
    dst: u32,
    path: Path,
}

impl Couplings {
    /// No coupling yet, on a topology of `links` links.
    pub(super) fn new(links: usize) -> Self {
        Couplings {
            slots: Vec::new(),
            free: Vec::new(),
            ring_edges: FastMap::default(),
            references: LookupMap::new(),
            scratch_edges: Vec::new(),
            scratch_seeds: Vec::new(),
            link_members: vec![0.0; links],
            link_load: vec![(0.0, 0); links],
            spare_members: Vec::new(),
            edge_paths: FastMap::default(),
        }
    }
}

/// A hash of an edge list's (source, destination) pairs, in order (see
/// [`Couplings::edge_paths`]; a collision is caught by comparing the pairs).
fn edge_list_key(edges: &[(RankId, RankId, f64)]) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::hash::BuildHasherDefault::<crate::fast_hash::FastHasher>::default().build_hasher();
    hasher.write_usize(edges.len());
    for &(src, dst, _) in edges {
        hasher.write_u64(u64::from(src.0) << 32 | u64::from(dst.0));
    }
    hasher.finish()
}

/// The couplings' edges are the solver's groups: a coupling's completion follows their rate.
impl GroupTiming for Couplings {
    /// An edge of `coupling` has a new rate, its last byte due after `delay`, in the re-fill of
    /// `epoch`: the edges of a coupled collective end together, so its completion is the
    /// latest of theirs, rescheduled (by `schedule_done`) whenever their common
    /// rate changes.
    fn rate_changed(&mut self, coupling: u32, delay: Option<SimDuration>, epoch: u64) {
        if let Some(Some(state)) = self.slots.get_mut(coupling as usize) {
            // A member at rate 0 (a link of its route down) holds the whole coupling.
            state.due = if state.due_generation == epoch {
                state.due.zip(delay).map(|(a, b)| a.max(b))
            } else {
                delay
            };
            state.due_generation = epoch;
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

/// A collective in its steady-state form: one long-lived flow per edge, all advancing at one
/// common rate.
#[derive(Debug)]
struct Coupling {
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
    /// its data started moving (see [`Couplings::coupling_done`]).
    ring: Option<RingTiming>,
    /// Completion bookkeeping: the latest edge's remaining time as of the re-fill `epoch`
    /// `due_generation`, whether it changed, and the generation of the pending completion.
    due: Option<SimDuration>,
    due_generation: u64,
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
    /// together (see [`Couplings::weigh_by_bottleneck`]); otherwise every edge advances at
    /// the same rate.
    weighted: bool,
    /// The latency jitter its steps add (each step the largest draw among its messages),
    /// when the caller drew it per step; `None`: drawn in `start_coupled`, every step over
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

    /// Starts a ring collective in its steady-state form: one flow per ring edge of every
    /// channel, each carrying what the edge carries over the whole ring (2(p-1)/p of the
    /// channel's share for an allreduce, (p-1)/p for reduce-scatter and allgather).
    pub(super) fn start_coupled_ring(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        token: Completion,
        collective: &Collective,
        group: &[RankId],
        delay: SimDuration,
    ) -> Result<(), NetworkError> {
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
            jitter: None,
        };
        let result = self.start_coupled(flows, context, token, &edges, timing);
        self.scratch_edges = edges;
        result
    }

    /// Starts a pipelined schedule (the double binary tree) in its steady-state form: one flow per edge
    /// the schedule uses, carrying all its messages; the pipeline's fill and drain (the steps
    /// in which even the busiest edge is idle) are charged at the end at the coupled rate.
    pub(super) fn start_coupled_pipeline(
        &mut self,
        flows: &mut Flows<'_>,
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
            delay,
            reference: None,
            weighted: false,
            jitter: Some(jitter),
        };
        self.start_coupled(flows, context, token, &edges, timing)
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
            jitter: None,
        };
        let result = self.start_coupled(flows, context, token, &edges, timing);
        self.scratch_edges = edges;
        result
    }

    /// Weighs the edge flows `members` of a coupling by their bytes over the mean bytes of the
    /// edges on its bottleneck link (the link with the most bytes per unit of capacity), so
    /// that on that link its edges claim one flow's share each, as the messages of the step
    /// that crosses it would. Edges elsewhere weigh in proportion to their bytes: heavier where
    /// they carry more, as the fast links inside a server do.
    fn weigh_by_bottleneck(&mut self, solver: &mut MaxMin<Owner>, members: &[u32]) {
        // Bytes and edges per link, in dense scratch indexed by link (`touched` lists the links).
        let mut touched = std::mem::take(&mut self.scratch_seeds);
        touched.clear();
        for &flow in members {
            let flow = solver.flow(flow);
            for &link in flow.route.iter() {
                let entry = &mut self.link_load[link.0 as usize];
                if entry.1 == 0 {
                    touched.push(link);
                }
                entry.0 += flow.size;
                entry.1 += 1;
            }
        }
        // The most loaded link per capacity; ties go to the lowest link id (deterministic).
        let mut best: Option<(f64, u32, f64)> = None;
        for &link in &touched {
            let (bytes, count) = std::mem::take(&mut self.link_load[link.0 as usize]);
            let time = bytes / solver.nominal(link);
            let better = match best {
                None => true,
                Some((top, id, _)) => time > top || (time == top && link.0 < id),
            };
            if better {
                best = Some((time, link.0, bytes / f64::from(count)));
            }
        }
        self.scratch_seeds = touched;
        let unit = best.map_or(0.0, |(_, _, mean)| mean);
        if unit > 0.0 {
            for &flow in members {
                let size = solver.flow(flow).size;
                solver.set_weight(flow, (size / unit).max(MIN_WEIGHT));
            }
        }
    }

    /// Starts a coupled collective over `edges` (src, dst, bytes): all edge flows advance at
    /// one common rate, enter together after the longest edge latency, and the latencies of
    /// the remaining `steps - 1` steps are added at the end.
    fn start_coupled(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        token: Completion,
        edges: &[(RankId, RankId, f64)],
        timing: CoupledTiming,
    ) -> Result<(), NetworkError> {
        let CoupledTiming { steps, fill_bytes, latency_sum, delay, reference, weighted, jitter } = timing;
        // A ring's steps all cost the same; a pipeline's are summed by the caller.
        let ring = latency_sum.is_none();
        // Generations keep counting across reuse of a slot, so a stale completion of the slot's
        // previous coupling can never match the new one.
        let (id, generation) = match self.free.pop() {
            Some((id, generation)) => (id, generation.wrapping_add(1)),
            None => {
                self.slots.push(None);
                ((self.slots.len() - 1) as u32, 0)
            }
        };
        let mut members = self.spare_members.pop().unwrap_or_default();
        members.clear();
        let mut slowest = SimDuration::ZERO;
        let mut shortest = SimDuration::MAX;
        let mut slowest_step = SimDuration::ZERO;
        let now = context.now();
        // The edges' paths: cached per edge list where routes do not depend on the flow.
        let key = flows.routes_cached().then(|| edge_list_key(edges));
        let cached = key.and_then(|key| self.edge_paths.remove(&key)).filter(|list| {
            list.len() == edges.len()
                && list.iter().zip(edges).all(|(edge, &(src, dst, _))| edge.src == src.0 && edge.dst == dst.0)
        });
        let fresh = cached.is_none();
        let mut list = cached.unwrap_or_default();
        for (index, &(src, dst, bytes)) in edges.iter().enumerate() {
            let Path { route, latency, alone } = match list.get(index) {
                Some(edge) if !fresh => edge.path,
                _ => {
                    let path = flows.path(src, dst)?;
                    if key.is_some() {
                        list.push(EdgePath { src: src.0, dst: dst.0, path });
                    }
                    path
                }
            };
            let (flow, latency) = flows.new_flow(now, &route, latency, bytes, Owner::Coupled)?;
            members.push(flow);
            slowest = slowest.max(latency);
            shortest = shortest.min(latency);
            let per_step = bytes / steps.max(1) as f64 / alone;
            slowest_step =
                slowest_step.max(latency.checked_add(SimDuration::from_ps((per_step * 1e12).ceil() as u64))?);
        }
        if let Some(key) = key {
            self.edge_paths.insert(key, list);
        }
        // Latency jitter: each step waits for its slowest message, so each adds the largest
        // of its edges' draws; it delays the whole collective (the flows enter that much
        // later), on top of the nominal latencies the timing below is built from.
        let jitter = match jitter {
            Some(jitter) => jitter,
            None if flows.has_jitter() => {
                let mut sum = SimDuration::ZERO;
                for _ in 0..steps.max(1) {
                    let mut step = SimDuration::ZERO;
                    for &flow in &members {
                        let route = flows.solver.flow(flow).route;
                        step = step.max(flows.jitter(&route));
                    }
                    sum = sum.saturating_add(step);
                }
                sum
            }
            None => SimDuration::ZERO,
        };
        if weighted {
            self.weigh_by_bottleneck(&mut flows.solver, &members);
        }
        let tail = match (reference, latency_sum) {
            (Some(reference), _) => {
                // Alone, the flows share only the links they cross together: the common rate
                // (per unit of weight) is the smallest capacity per member weight on any of
                // their links. Member weight per link, summed over the links `touched`.
                let mut touched = std::mem::take(&mut self.scratch_seeds);
                touched.clear();
                for &flow in &members {
                    for &link in flows.solver.flow(flow).route.iter() {
                        touched.push(link);
                        self.link_members[link.0 as usize] = 0.0;
                    }
                }
                for &flow in &members {
                    let weight = flows.solver.flow(flow).weight;
                    for &link in flows.solver.flow(flow).route.iter() {
                        self.link_members[link.0 as usize] += weight;
                    }
                }
                // The minimum does not depend on the order: each link once is enough.
                let rate = touched
                    .iter()
                    .map(|&link| flows.solver.nominal(link) / self.link_members[link.0 as usize])
                    .fold(f64::INFINITY, f64::min);
                self.scratch_seeds = touched;
                // Every edge moves its bytes in the same time: the largest's at its weight.
                let data = members
                    .iter()
                    .map(|&flow| {
                        let flow = flows.solver.flow(flow);
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
                flows
                    .solver
                    .flow(flow)
                    .route
                    .iter()
                    .map(|&l| flows.solver.nominal(l))
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
        flows.solver.lock(id, members);
        self.slots[id as usize] = Some(Coupling {
            ring,
            token,
            tail,
            fill_bytes,
            fill_rate,
            due: Some(SimDuration::ZERO),
            due_generation: 0,
            rescheduled: false,
            generation,
        });
        Ok(context.wake_after(
            delay.checked_add(slowest)?.checked_add(jitter)?,
            FlowEvent::Couple { coupling: id },
        )?)
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
        let mut seeds = std::mem::take(&mut self.scratch_seeds);
        seeds.clear();
        let members = flows.leave_group(now, coupling, &mut seeds);
        self.spare_members.push(members);
        let Some(state) = self.slots[coupling as usize].take() else { return Ok(()) };
        self.free.push((coupling, state.generation));
        let shared = seeds.iter().any(|&link| !flows.solver.flows_on(link).is_empty());
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
        let mut seeds = std::mem::take(&mut self.scratch_seeds);
        seeds.clear();
        flows.join_group(now, coupling, &mut seeds);
        let refilled = flows.request_refill(context, &seeds, self);
        self.scratch_seeds = seeds;
        refilled
    }
}
