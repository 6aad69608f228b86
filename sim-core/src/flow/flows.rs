//! Flows on the topology's routes: their paths, their life from first to last byte, and the
//! batching of rate re-fills.
//!
//! A flow starts on the path between two ranks (rank `r` runs on host `r`) or on a given
//! route, enters the network once its first byte has crossed the route's latency
//! ([`FlowEvent::Enter`]), shares its links at the max-min fair rates of [`MaxMin`], and is
//! done when its last byte is due at its current rate ([`FlowEvent::Finish`]). Paths are
//! computed once per pair of ranks when routes do not depend on the flow; under UGAL routing a
//! flow takes its Valiant route when the minimal one is busier by more than its extra hops
//! ([`Flows::path`]). Rate changes are re-filled once per simulated instant
//! ([`FlowEvent::Refill`]), or at once when routes depend on the flow.
//!
//! A group flow (a steady-state collective's edges as one flow with a weight on each link,
//! see [`MaxMin::add_group`]) is the caller's: it starts, joins and leaves here, counted as
//! the edges it stands for, and [`GroupTiming`] hears of its new rates.
//! Nothing here knows what a flow carries: its owner comes back to the caller when it is
//! done. Every change of a flow's rate (a lone flow joining, a re-fill, a flow or group
//! leaving) passes through here, which is where a link-series recorder, when there is one,
//! hears of it.
//!
//! Invariants: a flow's slot is freed exactly once, after it has left its links (or never
//! joined them); a stale [`FlowEvent::Finish`] (the flow's rate changed since, or its slot
//! was reused) does nothing; at most one [`FlowEvent::Refill`] is pending, and every link
//! where flows entered or left since the last re-fill is in its seeds; the work counted
//! ([`FlowStats::work`]) is the same on every machine for the same run.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use topology::{HostId, JitterShape, LinkId, Route, Routing, Topology};
use units::{SimDuration, SimTime};

use crate::fast_hash::FastMap;
use crate::graph::RankId;
use crate::network::{NetContext, NetworkError};
use crate::schedule::CollectiveError;
use crate::variability::{Distribution, Noise, Sampler};

use super::event::{FlowEvent, Owner};
use super::maxmin::{Joined, MaxMin, NO_GROUP, SpreadLink};
use super::series::SeriesRecorder;

/// The server of `rank` (rank r runs on host r), as collective schedules need it.
pub(super) fn server_of(topology: &Topology, rank: RankId) -> Result<u32, CollectiveError> {
    topology.node_of(HostId(rank.0)).map_err(|error| CollectiveError::Network(error.to_string()))
}

/// A route with what every flow on it needs: the sum of its link latencies (the time its first
/// byte takes) and its slowest link's capacity (its rate alone), computed once per pair of
/// ranks when routes do not depend on the flow.
#[derive(Debug, Clone, Copy)]
pub(super) struct Path {
    /// The links.
    pub(super) route: Route,
    /// The sum of their latencies.
    pub(super) latency: SimDuration,
    /// The slowest link's capacity (bytes per second).
    pub(super) alone: f64,
}

/// [`Flows::path_index`] of a path not kept (its route depends on the flow): `Flows::fresh`.
const FRESH: u32 = u32::MAX;

/// Counters of a flow-level run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// Flows started (one per transfer, one per collective message).
    pub flows: u64,
    /// Rate recomputations: one per simulated instant at which flows entered or left links
    /// they share, however many changed then (a completion due at once, at the new rates, may
    /// add one more); with `FlowNetwork::refilling_immediately`, one per such change. A flow
    /// alone on its links gets its rate without one.
    pub recomputations: u64,
    /// Flows whose rate was re-filled, summed over recomputations.
    pub refilled_flows: u64,
    /// Most flows sharing the network at once.
    pub peak_concurrent_flows: usize,
    /// The model's work so far, in flow and link visits: one per flow started, and per rate
    /// recomputation one per flow and per link of the component it re-filled. What a run's
    /// wall time grows with, counted the same on every machine (`FlowNetwork::with_work_budget`).
    pub work: u64,
}

/// Invariant checks of a run with `FlowNetwork::audited`.
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

/// What the owner of the solver's groups does when their rates change (see
/// [`Flows::request_refill`]).
pub(super) trait GroupTiming {
    /// The group flow of `group` has a new rate, its last byte due after `delay` (`None`:
    /// never at this rate, a link of its spread is down).
    fn rate_changed(&mut self, group: u32, delay: Option<SimDuration>);

    /// After a re-fill: schedules whatever the rate changes of the groups in `solver`'s last
    /// component call for.
    fn schedule_done(
        &mut self,
        solver: &MaxMin<Owner>,
        context: &mut NetContext<'_, FlowEvent>,
    ) -> Result<(), NetworkError>;
}

/// The flows on a topology (see the module documentation).
#[derive(Debug)]
pub(super) struct Flows<'t> {
    /// The network.
    pub(super) topology: &'t Topology,
    /// The flows and their max-min fair rates.
    pub(super) solver: MaxMin<Owner>,
    next_flow_id: u64,
    /// Adaptive (UGAL) routing: routes are chosen from `routed`.
    adaptive: bool,
    /// Unfinished flows routed over each link (kept only for adaptive routing: empty otherwise).
    routed: Vec<u32>,
    /// Routes do not depend on the flow (see [`Flows::routes_cached`]), asked of the topology
    /// once.
    cached_routes: bool,
    /// Per source host: the last destination and where its path is in `path_list` (see
    /// [`Flows::path`]): eight bytes a host, so a ring's 1,024 sources fit in the L1 cache.
    last_path: Vec<(u32, u32)>,
    /// Where in `path_list` the path of every (source, destination) pair seen is (see
    /// [`Flows::path`]): a dense map of small entries, the paths themselves in the order they
    /// were first asked for, which is the order a collective's edges ask for them again.
    paths: FastMap<(u32, u32), u32>,
    /// The paths `paths` points into.
    path_list: Vec<Path>,
    /// The path of the last flow whose route depends on the flow (not kept in `path_list`):
    /// [`FRESH`] points here.
    fresh: Path,
    /// Counters so far.
    pub(super) stats: FlowStats,
    /// Work after which the run gives up ([`NetworkError::OverBudget`]).
    pub(super) work_budget: Option<u64>,
    /// Check the allocation after every re-fill (tests); the first violation found.
    pub(super) audit: Option<Audit>,
    /// Links where flows entered or left since the last re-fill (see [`FlowEvent::Refill`]).
    pending_seeds: Vec<LinkId>,
    /// A [`FlowEvent::Refill`] is scheduled for the current instant.
    refill_scheduled: bool,
    /// Re-fill after every change instead of once per instant: when routes depend on the
    /// flow (see the module documentation), and in tests that compare the two.
    pub(super) immediate: bool,
    /// Bytes routed over each link so far, when asked for (see
    /// [`super::FlowNetwork::recording_link_bytes`]): each flow adds its size to every link of
    /// its route when it starts, so the count costs one addition per link of a route.
    pub(super) link_bytes: Option<Vec<f64>>,
    /// The load over time of chosen links, when asked for (see
    /// [`super::FlowNetwork::recording_link_series`]): told every rate change of a flow.
    pub(super) series: Option<SeriesRecorder>,
    /// The topology's latency jitter, if any: each flow draws its extra latency at its start.
    jitter: Option<Jitter>,
    /// When asked for (the model that times movements alone for their floors): each flow's
    /// and group flow's occupancy of every link it crosses, as it starts, in seconds: its
    /// size times the weight it claims there over the link's capacity, the least time the
    /// link spends carrying it, since the solver never loads a link past its capacity.
    pub(super) occupancy: Option<Vec<(LinkId, f64)>>,
}

/// Extra latency per link crossing ([`topology::LatencyJitter`]): every flow, at its start,
/// draws one factor of mean 1 per marked link of its route from one stream, in the order
/// flows start (the same run gives the same draws).
#[derive(Debug)]
struct Jitter {
    /// Mean extra latency per crossing, in picoseconds.
    mean_ps: f64,
    sampler: Sampler,
    /// Which links add it, by link id.
    on: Vec<bool>,
    rng: ChaCha8Rng,
}

impl Jitter {
    /// The extra latency of one flow on `route`.
    fn draw(&mut self, route: &Route) -> SimDuration {
        let mut extra = 0.0;
        for link in route.iter() {
            if self.on.get(link.0 as usize).copied().unwrap_or(false) {
                extra += self.mean_ps * self.sampler.sample(&mut self.rng);
            }
        }
        SimDuration::from_ps(extra.round() as u64)
    }
}

impl<'t> Flows<'t> {
    /// No flow yet on `topology`.
    pub(super) fn new(topology: &'t Topology) -> Self {
        let links = topology.link_count();
        Flows {
            topology,
            solver: MaxMin::new(
                (0..links).map(|l| topology.link(LinkId(l as u32)).bandwidth.bytes_per_second()).collect(),
            ),
            next_flow_id: 0,
            adaptive: topology.routing() == Routing::Ugal,
            // Read and written only under adaptive routing.
            routed: if topology.routing() == Routing::Ugal { vec![0; links] } else { Vec::new() },
            cached_routes: !topology.routes_depend_on_flow(),
            last_path: vec![(u32::MAX, FRESH); topology.host_count()],
            paths: FastMap::default(),
            path_list: Vec::new(),
            fresh: Path { route: Route::EMPTY, latency: SimDuration::ZERO, alone: f64::INFINITY },
            stats: FlowStats::default(),
            work_budget: None,
            audit: None,
            pending_seeds: Vec::new(),
            refill_scheduled: false,
            immediate: topology.routes_depend_on_flow(),
            link_bytes: None,
            series: None,
            occupancy: None,
            jitter: topology.latency_jitter().map(|jitter| {
                let shape = match jitter.shape {
                    JitterShape::Lognormal => Distribution::LogNormal,
                    JitterShape::Gamma => Distribution::Gamma,
                    JitterShape::Normal => Distribution::Normal,
                };
                Jitter {
                    mean_ps: jitter.mean.as_ps() as f64,
                    // The topology checked the coefficient of variation.
                    sampler: Noise::new(shape, jitter.cv).map_or(Sampler::One, |noise| noise.sampler()),
                    on: jitter.on.clone(),
                    rng: ChaCha8Rng::seed_from_u64(jitter.seed),
                }
            }),
        }
    }

    /// Room for `flows` flows and, when paths are kept, as many pairs' paths (see
    /// [`super::FlowNetwork::reserving_flows`]).
    pub(super) fn reserve(&mut self, flows: usize) {
        self.solver.reserve(flows);
        if self.cached_routes {
            self.paths.reserve(flows);
            self.path_list.reserve(flows);
        }
    }

    /// Whether [`Flows::path`] gives every flow between two hosts the same path (routes do
    /// not depend on the flow), so that callers may keep paths they asked for.
    #[inline]
    pub(super) fn routes_cached(&self) -> bool {
        self.cached_routes
    }

    /// The path of the next flow from `src` to `dst`. When routes do not depend on the flow,
    /// each pair's path is computed once, and each source remembers its last destination's
    /// (a ring sends to the same neighbour every step) in front of the map of all pairs.
    #[inline]
    pub(super) fn path(&mut self, src: RankId, dst: RankId) -> Result<Path, NetworkError> {
        let index = self.path_index(src, dst)?;
        Ok(*self.path_at(index))
    }

    /// Where [`Flows::path`]'s path is: an index into the kept paths, or [`FRESH`]. What a
    /// flow's start reads its route from in place: the path is not copied on the way (a copy
    /// of it in a `Result` cost a stalled store forward per message).
    #[inline]
    fn path_index(&mut self, src: RankId, dst: RankId) -> Result<u32, NetworkError> {
        if self.cached_routes
            && let Some(&(last, index)) = self.last_path.get(src.0 as usize)
            && last == dst.0
        {
            return Ok(index);
        }
        self.path_looked_up(src, dst)
    }

    /// The path at `index` (from [`Flows::path_index`]).
    #[inline]
    fn path_at(&self, index: u32) -> &Path {
        if index == FRESH { &self.fresh } else { &self.path_list[index as usize] }
    }

    /// [`Flows::path_index`] past its source's last destination: from the map of pairs, or
    /// routed.
    #[inline(never)]
    fn path_looked_up(&mut self, src: RankId, dst: RankId) -> Result<u32, NetworkError> {
        let cacheable = self.cached_routes;
        if cacheable {
            if let Some(&index) = self.paths.get(&(src.0, dst.0)) {
                if let Some(slot) = self.last_path.get_mut(src.0 as usize) {
                    *slot = (dst.0, index);
                }
                return Ok(index);
            }
        }
        let (minimal, alternative) =
            self.topology.route_candidates(HostId(src.0), HostId(dst.0), self.next_flow_id)?;
        let route = match alternative {
            Some(valiant) if self.congestion(&valiant) < self.congestion(&minimal) => valiant,
            _ => minimal,
        };
        let latency = self.topology.route_latency(&route);
        let alone = route.iter().map(|&l| self.solver.nominal(l)).fold(f64::INFINITY, f64::min);
        let path = Path { route, latency, alone };
        if !cacheable {
            self.fresh = path;
            return Ok(FRESH);
        }
        let index = self.path_list.len() as u32;
        self.paths.insert((src.0, dst.0), index);
        self.path_list.push(path);
        if let Some(slot) = self.last_path.get_mut(src.0 as usize) {
            *slot = (dst.0, index);
        }
        Ok(index)
    }

    /// UGAL's cost of a route: its hop count times (1 + the most unfinished flows routed over
    /// any of its links, including those whose first byte is still on its way), so a longer
    /// non-minimal route is taken only when the minimal one is that much busier.
    fn congestion(&self, route: &Route) -> usize {
        let busiest = route.iter().map(|link| self.routed[link.0 as usize]).max().unwrap_or(0);
        route.len() * (1 + busiest as usize)
    }

    /// Whether link crossings draw extra latency ([`topology::LatencyJitter`]).
    #[inline]
    pub(super) fn has_jitter(&self) -> bool {
        self.jitter.is_some()
    }

    /// One draw of the extra latency of a message on `route` (zero without jitter): the
    /// topology's jitter on each marked link, from one stream in the order of the draws.
    #[inline]
    pub(super) fn jitter(&mut self, route: &Route) -> SimDuration {
        match &mut self.jitter {
            Some(jitter) => jitter.draw(route),
            None => SimDuration::ZERO,
        }
    }

    /// Starts a flow of `bytes` from `src` to `dst` for `owner`, after its route's latency
    /// (and a draw of jitter).
    pub(super) fn start_flow(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        src: RankId,
        dst: RankId,
        bytes: f64,
        owner: Owner,
    ) -> Result<(), NetworkError> {
        let index = self.path_index(src, dst)?;
        let route = self.path_at(index).route;
        let latency = self.path_at(index).latency.saturating_add(self.jitter(&route));
        let (id, latency) = self.new_flow(context.now(), &route, latency, bytes, owner)?;
        context.wake_after(latency, FlowEvent::Enter { flow: id })?;
        Ok(())
    }

    /// Starts a flow of `bytes` on `route` for `owner`.
    pub(super) fn start_flow_on(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        route: Route,
        bytes: f64,
        owner: Owner,
    ) -> Result<(), NetworkError> {
        let latency = self.topology.route_latency(&route).saturating_add(self.jitter(&route));
        let (id, latency) = self.new_flow(context.now(), &route, latency, bytes, owner)?;
        context.wake_after(latency, FlowEvent::Enter { flow: id })?;
        Ok(())
    }

    /// Counts `flows` flows started, `bytes` in all, each `(link, bytes, flows)` of `links`
    /// carrying that many of them: UGAL's routed flows, the work and its budget, the audit's
    /// and the link counters' bytes.
    #[inline]
    fn count_started(
        &mut self,
        flows: u64,
        bytes: f64,
        links: impl Iterator<Item = (LinkId, f64, u32)> + Clone,
    ) -> Result<(), NetworkError> {
        if self.adaptive {
            for (link, _, count) in links.clone() {
                self.routed[link.0 as usize] += count;
            }
        }
        self.stats.flows += flows;
        self.stats.work += flows;
        // Checked here too: a run of flows that never share a link (a chain's chunks, one hop
        // each) takes the fast path and never refills, so the budget would not bound it.
        if let Some(budget) = self.work_budget
            && self.stats.work > budget
        {
            return Err(NetworkError::OverBudget { budget });
        }
        if let Some(audit) = &mut self.audit {
            audit.bytes_sent += bytes;
            if audit.link_bytes.is_empty() {
                audit.link_bytes = vec![0.0; self.topology.link_count()];
            }
            for (link, carried, _) in links.clone() {
                audit.link_bytes[link.0 as usize] += carried;
            }
        }
        if let Some(counters) = &mut self.link_bytes {
            for (link, carried, _) in links {
                counters[link.0 as usize] += carried;
            }
        }
        Ok(())
    }

    /// Allocates a flow on `route`, whose links' latencies sum to `latency` (not yet on its
    /// links) and returns it with that latency.
    pub(super) fn new_flow(
        &mut self,
        now: SimTime,
        route: &Route,
        latency: SimDuration,
        bytes: f64,
        owner: Owner,
    ) -> Result<(u32, SimDuration), NetworkError> {
        self.next_flow_id += 1;
        self.count_started(1, bytes, route.iter().map(|&link| (link, bytes, 1)))?;
        if let Some(occupancy) = &mut self.occupancy {
            occupancy.extend(route.iter().map(|&link| (link, bytes / self.solver.nominal(link))));
        }
        let id = self.solver.add(now, route, bytes, owner);
        Ok((id, latency))
    }

    /// The flow's first byte has arrived: it joins its links and rates are re-filled. Returns its
    /// owner if it is done at once (nothing to share: its slot is free again).
    // Inlined into the event handler, its only caller, so the owner it returns stays in
    // registers: as a call, packet-steps runs took about 10% longer.
    #[inline(always)]
    pub(super) fn enter(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        id: u32,
        groups: &mut impl GroupTiming,
    ) -> Result<Option<Owner>, NetworkError> {
        match self.solver.join(id, context.now()) {
            Joined::Empty => {
                // Nothing to share: done as soon as it arrives.
                if let Some(audit) = &mut self.audit {
                    audit.bytes_delivered += self.solver.flow(id).size;
                }
                Ok(Some(self.release(id)))
            }
            Joined::Alone { delay, generation } => {
                self.stats.peak_concurrent_flows =
                    self.stats.peak_concurrent_flows.max(self.solver.active_flows());
                if let Some(series) = &mut self.series {
                    let flow = self.solver.flow(id);
                    series.rate(context.now(), id, &flow.route, &[], flow.rate);
                }
                if let Some(delay) = delay {
                    context.wake_after(delay, FlowEvent::Finish { flow: id, generation })?;
                }
                Ok(None)
            }
            Joined::Shared => {
                self.stats.peak_concurrent_flows =
                    self.stats.peak_concurrent_flows.max(self.solver.active_flows());
                let route = self.solver.flow(id).route;
                self.request_refill(context, &route, groups)?;
                Ok(None)
            }
        }
    }

    /// The flow's last byte has arrived (if `generation` is still its own): it leaves its links,
    /// the others re-fill, and its slot is free again. Returns its owner, to be told; `None`
    /// for a stale completion.
    // Inlined as `enter` is.
    #[inline(always)]
    pub(super) fn finish(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        id: u32,
        generation: u32,
        groups: &mut impl GroupTiming,
    ) -> Result<Option<Owner>, NetworkError> {
        if !self.solver.is_due(id, generation) {
            return Ok(None); // a stale completion: the rate changed since it was scheduled
        }
        let now = context.now();
        if let Some(audit) = &mut self.audit {
            let flow = self.solver.flow(id);
            let left = flow.remaining - flow.rate * now.saturating_since(flow.updated).as_secs_f64();
            // The completion is rounded up to the next picosecond, so at most one picosecond of
            // the rate is over-delivered.
            if left.abs() > flow.rate * 1e-12 + 1e-6 && audit.violation.is_none() {
                audit.violation = Some(format!("flow {id} finished with {left} bytes left"));
            }
            audit.bytes_delivered += flow.size - left.max(0.0);
        }
        // Re-fill only if the flow shared a link with others: their rates may rise.
        let shared = self.solver.leave(id);
        if let Some(series) = &mut self.series {
            series.rate(now, id, &self.solver.flow(id).route, &[], 0.0);
        }
        if shared {
            let route = self.solver.flow(id).route;
            self.request_refill(context, &route, groups)?;
        }
        Ok(Some(self.release(id)))
    }

    /// Frees the flow's slot; returns its owner.
    #[inline(always)]
    fn release(&mut self, id: u32) -> Owner {
        let owner = self.solver.flow(id).owner;
        if self.adaptive {
            for link in self.solver.flow(id).route.iter() {
                self.routed[link.0 as usize] -= 1;
            }
        }
        self.solver.free(id);
        owner
    }

    /// Flows entered or left `seeds`: their neighbours' rates are re-filled once every event
    /// of this instant has run (or now, with `immediate`). Until
    /// then every flow keeps the rate it had, which no one reads before time moves on: a
    /// completion due now was scheduled at that rate and still holds, and a flow that entered
    /// now has rate 0 and no completion yet.
    #[inline]
    pub(super) fn request_refill(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        seeds: &[LinkId],
        groups: &mut impl GroupTiming,
    ) -> Result<(), NetworkError> {
        if self.immediate {
            return self.refill(context, seeds, groups);
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
    pub(super) fn refill_pending(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        groups: &mut impl GroupTiming,
    ) -> Result<(), NetworkError> {
        if context.more_due_now() {
            return Ok(context.wake_after(SimDuration::ZERO, FlowEvent::Refill)?);
        }
        self.refill_scheduled = false;
        let seeds = std::mem::take(&mut self.pending_seeds);
        let refilled = self.refill(context, &seeds, groups);
        self.pending_seeds = seeds;
        self.pending_seeds.clear();
        refilled
    }

    /// Max-min fair rates for every flow connected to `seeds` through shared links.
    fn refill(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        seeds: &[LinkId],
        groups: &mut impl GroupTiming,
    ) -> Result<(), NetworkError> {
        self.stats.recomputations += 1;
        let (flows, links) = self.solver.collect(seeds);
        self.stats.refilled_flows += flows as u64;
        self.stats.work += (flows + links) as u64;
        if let Some(budget) = self.work_budget
            && self.stats.work > budget
        {
            return Err(NetworkError::OverBudget { budget });
        }
        self.solver.solve();
        // Bring every re-filled flow up to date and reschedule its completion: a plain flow's
        // own, a group flow's through its owner (`schedule_done`, below).
        let now = context.now();
        let series = &mut self.series;
        self.solver.update(now, |id, flow, spread, delay| {
            if let Some(series) = series {
                series.rate(now, id, &flow.route, spread, flow.rate);
            }
            if flow.group == NO_GROUP {
                // At rate 0 (a link down) no completion: the re-fill that raises the rate
                // schedules one.
                if let Some(delay) = delay {
                    context.wake_after(delay, FlowEvent::Finish { flow: id, generation: flow.generation })?;
                }
            } else {
                groups.rate_changed(flow.group, delay);
            }
            Ok::<(), NetworkError>(())
        })?;
        groups.schedule_done(&self.solver, context)?;
        if self.audit.is_some() {
            self.check_allocation();
        }
        Ok(())
    }

    /// Audit: capacity and bottleneck conditions of max-min fairness on the last component.
    fn check_allocation(&mut self) {
        let violation = self.solver.violation();
        if let Some(audit) = &mut self.audit {
            audit.checks += 1;
            if audit.violation.is_none() {
                audit.violation = violation;
            }
        }
    }

    /// A group flow for group `group` of `edges` edges over `spread` (see
    /// [`MaxMin::add_group`]), carrying `bytes` in all, not yet on its links: counted as
    /// `edges` flows started, each edge's bytes on its links.
    pub(super) fn add_group(
        &mut self,
        now: SimTime,
        group: u32,
        spread: &[SpreadLink],
        size: f64,
        edges: u32,
        bytes: f64,
    ) -> Result<u32, NetworkError> {
        let links = spread.iter().map(|entry| (entry.link, entry.bytes, entry.edges));
        self.count_started(u64::from(edges), bytes, links)?;
        if let Some(occupancy) = &mut self.occupancy {
            let solver = &self.solver;
            occupancy.extend(
                spread.iter().map(|entry| (entry.link, size * entry.weight / solver.nominal(entry.link))),
            );
        }
        Ok(self.solver.add_group(now, group, spread, size, edges, Owner::Coupled))
    }

    /// Moves the flow counter on by `edges` edges whose paths were asked for (or kept), as
    /// starting their flows would: under flow-dependent routing a next path depends on it.
    pub(super) fn count_edge_paths(&mut self, edges: usize) {
        self.next_flow_id += edges as u64;
    }

    /// Group flow `id` enters the network on all its links at once; they go into `seeds`, to
    /// re-fill.
    pub(super) fn join_group(&mut self, now: SimTime, id: u32, seeds: &mut Vec<LinkId>) {
        self.solver.join_group(id, now, seeds);
        self.stats.peak_concurrent_flows = self.stats.peak_concurrent_flows.max(self.solver.active_flows());
    }

    /// Group flow `id` that stands for `bytes` has delivered its data: it leaves the network
    /// and its slot is free again. The links it leaves go into `seeds`, each once.
    pub(super) fn leave_group(&mut self, now: SimTime, id: u32, bytes: f64, seeds: &mut Vec<LinkId>) {
        if let Some(audit) = &mut self.audit {
            let flow = self.solver.flow(id);
            let left = flow.remaining - flow.rate * now.saturating_since(flow.updated).as_secs_f64();
            let fraction = if flow.size > 0.0 { 1.0 - left.max(0.0) / flow.size } else { 1.0 };
            audit.bytes_delivered += bytes * fraction;
        }
        if self.adaptive {
            for entry in self.solver.spread(id) {
                self.routed[entry.link.0 as usize] -= entry.edges;
            }
        }
        if let Some(series) = &mut self.series {
            series.rate(now, id, &Route::EMPTY, self.solver.spread(id), 0.0);
        }
        self.solver.leave_group(id, seeds);
    }
}
