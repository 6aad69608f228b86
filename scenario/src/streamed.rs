//! A simulation whose iterations stream: each iteration's ops are lowered while the engine
//! needs them and dropped once finished ([`sim_core::stream`]), and the report's statistics
//! are gathered as they go, so memory holds a few iterations however many are simulated. The
//! numbers are those of the whole-graph run (`simulation::simulate`), op for op: the
//! breakdown's interval unions and sweeps are settled up to a watermark before which no op
//! can start any more, and per-op waits are read while the ops they wait for are still held.

use std::collections::VecDeque;
use std::time::Instant;

use sim_core::graph::{OpId, OpKind, RankId, Work};
use sim_core::network::Network;
use sim_core::stats::{Activity, RankBreakdown};
use sim_core::stream::{StreamError, StreamRun};
use sim_core::units::{SimDuration, SimTime};
use strategies::{Axis, GroupKind, IterationSource, StrategyError};

use crate::Scenario;
use crate::simulation::{Measured, Outcome, SimulationError};

/// Chunks (iterations) taken in ahead of the ops that finish: an iteration's ops wait for the
/// previous iteration's (the optimizer step before the next forward) and, with a loader or
/// DASO, for a few before it; a lookahead too short is detected, never silently wrong, and
/// the run is then repeated with twice the lookahead.
const LOOKAHEAD: u32 = 2;

/// The length of a union of intervals that arrive in any order, settled up to a watermark
/// before which no new interval starts.
#[derive(Debug, Default, Clone)]
struct Union {
    pending: Vec<(SimTime, SimTime)>,
    total: SimDuration,
}

impl Union {
    fn push(&mut self, start: SimTime, end: SimTime) {
        if start < end {
            self.pending.push((start, end));
        }
    }

    /// Adds the merged stretches that end before `watermark` (nothing later can touch them)
    /// and keeps the rest, merged.
    fn settle(&mut self, watermark: SimTime) {
        self.pending.sort_unstable();
        let mut kept: Vec<(SimTime, SimTime)> = Vec::new();
        let mut current: Option<(SimTime, SimTime)> = None;
        let mut close_out = |segment: (SimTime, SimTime), kept: &mut Vec<(SimTime, SimTime)>| {
            if segment.1 < watermark {
                self.total = self.total.saturating_add(segment.1.saturating_since(segment.0));
            } else {
                kept.push(segment);
            }
        };
        for &(start, end) in &self.pending {
            current = match current {
                Some((open, close)) if start <= close => Some((open, close.max(end))),
                Some(segment) => {
                    close_out(segment, &mut kept);
                    Some((start, end))
                }
                None => Some((start, end)),
            };
        }
        if let Some(segment) = current {
            close_out(segment, &mut kept);
        }
        self.pending = kept;
    }

    /// The whole length, with every interval cut at `to`.
    fn finish(&mut self, to: SimTime) -> SimDuration {
        for interval in &mut self.pending {
            interval.1 = interval.1.min(to);
        }
        self.pending.retain(|(start, end)| start < end);
        self.settle(SimTime::from_ps(u64::MAX));
        self.total
    }
}

/// Exposed communication by class ([`sim_core::stats::exposed_by_class`]) swept as the
/// intervals come: edges before a watermark are swept, the sweep's state carried on.
#[derive(Debug, Clone)]
struct ClassSweep {
    /// Intervals not yet fully swept: start, end, class (`usize::MAX` for compute), and
    /// whether the start edge was swept.
    pending: Vec<(SimTime, SimTime, usize, bool)>,
    totals: Vec<u128>,
    active: Vec<i64>,
    computing: i64,
    last: SimTime,
}

impl ClassSweep {
    fn new(classes: usize) -> Self {
        ClassSweep {
            pending: Vec::new(),
            totals: vec![0; classes],
            active: vec![0; classes],
            computing: 0,
            last: SimTime::ZERO,
        }
    }

    fn push(&mut self, start: SimTime, end: SimTime, tag: usize) {
        if start < end {
            self.pending.push((start, end, tag, false));
        }
    }

    /// Sweeps the edges before `watermark` (with `to`, the end of the run, once known).
    fn settle(&mut self, watermark: SimTime, to: Option<SimTime>) {
        let mut edges: Vec<(SimTime, i8, usize)> = Vec::new();
        self.pending.retain_mut(|(start, end, tag, started)| {
            if let Some(to) = to {
                *end = (*end).min(to);
                if !*started && *start >= *end {
                    return false;
                }
            }
            if !*started && *start < watermark {
                edges.push((*start, 1, *tag));
                *started = true;
            }
            if *end < watermark {
                edges.push((*end, -1, *tag));
                return false;
            }
            true
        });
        edges.sort_unstable();
        let classes = self.totals.len();
        for &(time, delta, tag) in &edges {
            if time > self.last && self.computing == 0 {
                let busy: Vec<usize> = (0..classes).filter(|&c| self.active[c] > 0).collect();
                if !busy.is_empty() {
                    let share = u128::from(time.saturating_since(self.last).as_ps()) / busy.len() as u128;
                    for c in busy {
                        self.totals[c] += share;
                    }
                }
            }
            self.last = self.last.max(time);
            if tag == usize::MAX {
                self.computing += i64::from(delta);
            } else {
                self.active[tag] += i64::from(delta);
            }
        }
    }

    fn finish(&mut self, to: SimTime) -> Vec<SimDuration> {
        self.settle(SimTime::from_ps(u64::MAX), Some(to));
        self.totals.iter().map(|&ps| SimDuration::from_ps(ps as u64)).collect()
    }
}

/// One simulated rank's statistics in progress.
#[derive(Debug, Clone)]
struct RankStats {
    compute: Union,
    communication: Union,
    busy: Union,
    groups: ClassSweep,
    offload: ClassSweep,
    /// Bubble: intervals of the rank's device ops (`true`: the pipeline flush's collective).
    device: Vec<(SimTime, SimTime, bool)>,
    /// Bubble: the rank's waits for its host.
    host_waits: Vec<(SimTime, SimTime)>,
}

/// The statistics of a streamed run, gathered chunk by chunk.
struct Gather<'s> {
    scenario: &'s Scenario,
    is_simulated: Vec<bool>,
    ranks: Vec<RankId>,
    stats: Vec<Option<RankStats>>,
    flush: Option<sim_core::graph::Origin>,
    offload: Option<sim_core::graph::Origin>,
    pipelined: bool,
    /// Per (rank, stream), the end of the last op processed (stream predecessors).
    stream_ends: sim_core::lookup::LookupMap<(RankId, u16), SimTime>,
    /// The ends and kinds of work of the ops of recently dropped chunks: (first id, ops).
    old_ends: VecDeque<(u32, Vec<(SimTime, Work)>)>,
    host_bound_ps: u128,
    input_bound_ps: u128,
    bubble_ps: u128,
    flush_wait_ps: u128,
    /// Per iteration: its end, and per rank the end of its last pipeline compute op.
    iteration_ends: Vec<SimTime>,
    pipeline_ends: VecDeque<(u32, Vec<Option<SimTime>>)>,
    ops: usize,
}

impl Gather<'_> {
    /// The end and kind of work of `op`: held in `run`, or of a recently dropped chunk.
    fn end_of<N: Network>(
        &self,
        run: &StreamRun<'_, N>,
        op: OpId,
    ) -> Result<(SimTime, Work), SimulationError> {
        if op >= run.graph().first_held() {
            return Ok((run.times(op).1, run.graph().op(op).meta.work()));
        }
        for (first, ends) in &self.old_ends {
            if op.0 >= *first && ((op.0 - first) as usize) < ends.len() {
                return Ok(ends[(op.0 - first) as usize]);
            }
        }
        Err(self
            .internal(format!("{op} is waited for from more than {} iterations later", self.old_ends.len())))
    }

    fn internal(&self, message: String) -> SimulationError {
        SimulationError::Strategy(StrategyError::Internal(format!("streamed run: {message}")))
    }

    /// Takes in every op of dropped chunk `range` (all finished).
    fn chunk<N: Network>(
        &mut self,
        run: &StreamRun<'_, N>,
        range: std::ops::Range<u32>,
    ) -> Result<(), SimulationError> {
        let graph = run.graph();
        let is_launch = |work: Work| work == Work::Launch;
        let is_loader = |work: Work| work == Work::Loader;
        let is_input = |work: Work| work.is_input();
        let waited = |until: SimTime, from: SimTime| u128::from(until.saturating_since(from).as_ps());
        let mut ends = Vec::with_capacity(range.len());
        for id in range.clone().map(OpId) {
            let op = *graph.op(id);
            let (start, end, _) = run.times(id);
            ends.push((end, op.meta.work()));
            self.ops += 1;
            let previous_end = self.stream_ends.insert((op.rank, op.stream.0), end);
            let rank = op.rank.0 as usize;
            if !self.is_simulated[rank] {
                continue;
            }
            let activity = Activity::of(&op);
            let Some(stats) = self.stats[rank].as_mut() else { continue };
            match activity {
                Activity::Compute => {
                    stats.compute.push(start, end);
                    stats.busy.push(start, end);
                    stats.groups.push(start, end, usize::MAX);
                }
                Activity::Communication => {
                    stats.communication.push(start, end);
                    stats.busy.push(start, end);
                    if let Some(group) = op.meta.group().map(GroupKind::index)
                        && group < GroupKind::ALL.len()
                    {
                        stats.groups.push(start, end, group);
                    }
                }
                Activity::Ignored => {}
            }
            if self.offload.is_some() && activity != Activity::Ignored {
                let tag = if activity == Activity::Compute {
                    usize::MAX
                } else if Some(op.meta.origin()) == self.offload {
                    0
                } else {
                    1
                };
                stats.offload.push(start, end, tag);
            }
            let off_device = op.meta.work().is_host();
            if self.pipelined && !off_device && start < end {
                let flush = Some(op.meta.origin()) == self.flush && matches!(op.kind, OpKind::Collective(_));
                stats.device.push((start, end, flush));
            }
            // Host- and input-bound, as `simulation` measures them.
            let work = op.meta.work();
            if is_launch(work) || is_loader(work) {
                continue;
            }
            let mut launch = None;
            let mut input = None;
            let mut ready = match graph.previous_in_stream(id) {
                Some(_) => previous_end.unwrap_or(SimTime::ZERO),
                None => SimTime::ZERO,
            };
            for &dep in graph.deps(id) {
                let (dep_end, dep_work) = self.end_of(run, dep)?;
                if is_launch(dep_work) {
                    launch = Some(dep_end);
                } else if is_loader(dep_work) || (is_input(dep_work) && !is_input(work)) {
                    input = Some(input.unwrap_or(dep_end).max(dep_end));
                } else {
                    ready = ready.max(dep_end);
                }
            }
            if is_input(work) {
                if let Some(input) = input
                    && matches!(op.kind, OpKind::Compute { .. })
                    && ready > SimTime::ZERO
                {
                    self.input_bound_ps += waited(input, ready);
                }
                continue;
            }
            if let Some(input) = input {
                let started = ready.max(launch.unwrap_or(SimTime::ZERO));
                if input > started {
                    self.input_bound_ps += waited(input, started);
                    ready = input;
                }
            }
            if let Some(launch) = launch
                && graph.previous_in_stream(id).is_some()
            {
                self.host_bound_ps += waited(launch, ready);
                if self.pipelined
                    && launch > ready
                    && let Some(stats) = self.stats[rank].as_mut()
                {
                    stats.host_waits.push((ready, launch));
                }
            }
        }
        self.old_ends.push_back((range.start, ends));
        while self.old_ends.len() > 2 * LOOKAHEAD as usize + 2 {
            self.old_ends.pop_front();
        }
        Ok(())
    }

    /// Settles every rank's sums before `watermark`.
    fn settle(&mut self, watermark: SimTime) {
        for stats in self.stats.iter_mut().flatten() {
            stats.compute.settle(watermark);
            stats.communication.settle(watermark);
            stats.busy.settle(watermark);
            stats.groups.settle(watermark, None);
            stats.offload.settle(watermark, None);
        }
    }

    /// Measures the bubble of the iterations up to `last` whose windows end before `watermark`.
    fn bubbles_through(&mut self, watermark: SimTime, last: u32) {
        if !self.pipelined {
            return;
        }
        let layout = self.scenario.parallelism.layout();
        while let Some((index, ends)) = self.pipeline_ends.front() {
            let iteration = *index;
            if iteration as usize >= self.iteration_ends.len() || iteration > last {
                break;
            }
            let start =
                if iteration == 0 { SimTime::ZERO } else { self.iteration_ends[iteration as usize - 1] };
            let until: Vec<SimTime> = (0..layout.ranks())
                .map(|rank| match ends[rank as usize] {
                    None => start,
                    Some(_) => layout
                        .group(Axis::Pipeline, RankId(rank))
                        .iter()
                        .filter_map(|member| ends[member.0 as usize])
                        .max()
                        .unwrap_or(start),
                })
                .collect();
            let latest = until.iter().copied().max().unwrap_or(start);
            if latest >= watermark {
                break;
            }
            let idle = |stats: &RankStats, until: SimTime, with_flush: bool| -> u128 {
                let mut busy: Vec<(SimTime, SimTime)> = stats
                    .host_waits
                    .iter()
                    .map(|&(s, e)| (s.max(start), e.min(until)))
                    .filter(|(s, e)| s < e)
                    .collect();
                busy.extend(
                    stats
                        .device
                        .iter()
                        .filter(|(_, _, flush)| !(with_flush && *flush))
                        .map(|&(s, e, _)| (s.max(start), e.min(until)))
                        .filter(|(s, e)| s < e),
                );
                let mut union = Union { pending: busy, total: SimDuration::ZERO };
                let covered = union.finish(SimTime::from_ps(u64::MAX));
                u128::from(until.saturating_since(start).saturating_sub(covered).as_ps())
            };
            let mut with_flush = 0u128;
            let mut without = 0u128;
            for (rank, stats) in self.stats.iter().enumerate() {
                if let Some(stats) = stats {
                    with_flush += idle(stats, until[rank], true);
                    without += idle(stats, until[rank], false);
                }
            }
            self.bubble_ps += with_flush;
            self.flush_wait_ps += with_flush.saturating_sub(without);
            // Later windows start at this iteration's end: what ends before it is done with.
            let end = self.iteration_ends[iteration as usize];
            for stats in self.stats.iter_mut().flatten() {
                stats.device.retain(|&(_, e, _)| e > end);
                stats.host_waits.retain(|&(_, e)| e > end);
            }
            self.pipeline_ends.pop_front();
        }
    }
}

/// What a streamed attempt gives back.
struct Streamed {
    measured: Measured,
    info: strategies::LoweredInfo,
    topology: topology::Topology,
    memory: workloads::memory::MemoryBreakdown,
    warnings: Vec<String>,
    lowering_wall: std::time::Duration,
    simulation_wall: std::time::Duration,
    link_bytes: Option<Vec<f64>>,
}

/// Runs `scenario` streamed; `Ok(None)` when the lookahead was too short (run again longer).
fn attempt(
    scenario: &Scenario,
    lookahead: u32,
    count_link_bytes: bool,
) -> Result<Option<Streamed>, SimulationError> {
    let started = Instant::now();
    let strategy = scenario.strategy();
    let result = strategy.lower_streaming(|info, builder, source| {
        let (topology, memory, warnings) =
            crate::simulation::prepare(scenario, &info.stages, info.offload.as_ref())?;
        let lowering_wall = started.elapsed();
        let started = Instant::now();
        let job = Job { scenario, builder, source, info: &info, lookahead };
        let (measured, link_bytes) = scenario.network.run_on(&topology, job, count_link_bytes);
        let measured = measured?;
        let simulation_wall = started.elapsed();
        Ok(measured.map(|measured| Streamed {
            measured,
            info,
            topology,
            memory,
            warnings,
            lowering_wall,
            simulation_wall,
            link_bytes,
        }))
    });
    match result {
        Ok(inner) => inner,
        Err(StrategyError::OverBudget(budget)) => {
            Err(SimulationError::OverBudget { scenario: scenario.source.clone(), budget })
        }
        Err(error) => Err(error.into()),
    }
}

/// A streamed run on whichever network model the scenario's fidelity makes.
struct Job<'a, 'b, 's> {
    scenario: &'s Scenario,
    builder: sim_core::graph::GraphBuilder,
    source: &'a mut IterationSource<'b>,
    info: &'a strategies::LoweredInfo,
    lookahead: u32,
}

impl sim_core::fidelity::OnNetwork for Job<'_, '_, '_> {
    type Output = Result<Option<Measured>, SimulationError>;
    fn run<N: Network>(self, network: &mut N) -> Self::Output {
        run_streamed(self.scenario, self.builder, self.source, self.info, self.lookahead, network)
    }
}

/// Simulates `scenario` with its iterations streamed ([`sim_core::stream`]): the same
/// summary as the whole-graph run, in the memory of a few iterations. The outcome has no graph
/// or timeline (`--trace` needs the whole graph); with `count_link_bytes`, the bytes routed
/// over each link as [`crate::simulation::simulate_counting_link_bytes`] counts them.
pub fn simulate_streamed(scenario: &Scenario, count_link_bytes: bool) -> Result<Outcome, SimulationError> {
    let mut lookahead = LOOKAHEAD;
    let streamed = loop {
        match attempt(scenario, lookahead, count_link_bytes)? {
            Some(streamed) => break streamed,
            None if lookahead < 64 => lookahead *= 2,
            None => {
                return Err(SimulationError::Strategy(StrategyError::Internal(format!(
                    "streamed run: iterations reach back more than {lookahead} iterations"
                ))));
            }
        }
    };
    let Streamed { measured, info, topology, memory, warnings, lowering_wall, simulation_wall, link_bytes } =
        streamed;
    let summary = crate::simulation::summarize(scenario, &info, &topology, memory, warnings, measured)?;
    Ok(Outcome {
        summary,
        lowering_wall,
        simulation_wall,
        graph: sim_core::graph::GraphBuilder::new(0).build().map_err(StrategyError::from)?,
        timeline: sim_core::exec::Timeline {
            start: Vec::new(),
            end: Vec::new(),
            collective_begin: Vec::new(),
            collective_choice: Vec::new(),
            events: 0,
        },
        spans: Vec::new(),
        rank_names: crate::simulation::rank_names(scenario),
        link_bytes,
        iteration_ends: Vec::new(),
        monte_carlo_wall: None,
    })
}

/// The engine loop of a streamed run, gathering the statistics; `Ok(None)` when the
/// lookahead was too short.
fn run_streamed<N: Network>(
    scenario: &Scenario,
    builder: sim_core::graph::GraphBuilder,
    source: &mut IterationSource<'_>,
    info: &strategies::LoweredInfo,
    lookahead: u32,
    network: &mut N,
) -> Result<Option<Measured>, SimulationError> {
    let ranks = builder.ranks() as usize;
    let flush = builder.find_origin(strategies::FLUSH_ORIGIN);
    let offload = if info.offload.is_some() { builder.find_origin(strategies::OFFLOAD_ORIGIN) } else { None };
    let mut is_simulated = vec![false; ranks];
    for rank in &info.ranks {
        is_simulated[rank.0 as usize] = true;
    }
    let pipelined = scenario.parallelism.pipeline > 1;
    let classes = GroupKind::ALL.len();
    let stats = (0..ranks)
        .map(|rank| {
            is_simulated[rank].then(|| RankStats {
                compute: Union::default(),
                communication: Union::default(),
                busy: Union::default(),
                groups: ClassSweep::new(classes),
                offload: ClassSweep::new(2),
                device: Vec::new(),
                host_waits: Vec::new(),
            })
        })
        .collect();
    let mut gather = Gather {
        scenario,
        is_simulated,
        ranks: info.ranks.clone(),
        stats,
        flush,
        offload,
        pipelined,
        stream_ends: sim_core::lookup::LookupMap::new(),
        old_ends: VecDeque::new(),
        host_bound_ps: 0,
        input_bound_ps: 0,
        bubble_ps: 0,
        flush_wait_ps: 0,
        iteration_ends: Vec::new(),
        pipeline_ends: VecDeque::new(),
        ops: 0,
    };
    let exec_error =
        |source| SimulationError::Exec { scenario: scenario.source.clone(), source: Box::new(source) };
    // A chunk that came too late means: run again with a longer lookahead.
    let fail = |error: StreamError<StrategyError>| -> Result<Option<Measured>, SimulationError> {
        match error {
            StreamError::Late { .. } => Ok(None),
            StreamError::Source(error) => Err(error.into()),
            StreamError::Exec(error) => Err(exec_error(error)),
            error => {
                Err(SimulationError::Strategy(StrategyError::Internal(format!("streamed run: {error}"))))
            }
        }
    };
    let mut run = StreamRun::new(builder, network, lookahead);
    if let Err(error) = run.begin(source) {
        return fail(error);
    }
    let mut iteration_times = Vec::with_capacity(scenario.iterations as usize);
    let mut previous_end = SimTime::ZERO;
    loop {
        match run.step(source) {
            Ok(true) => {}
            Ok(false) => break,
            Err(error) => return fail(error),
        }
        let mut failure: Option<SimulationError> = None;
        let mut retired = false;
        run.retire_finished(|run, chunk| {
            if failure.is_some() {
                return;
            }
            let Some(range) = run.graph().chunk_ops(chunk) else { return };
            if let Err(error) = gather.chunk(run, range) {
                failure = Some(error);
                return;
            }
            // The iteration's end and its ranks' pipeline ends, read while it is held.
            let Some(ops) = u32::try_from(chunk).ok().and_then(|index| source.iteration(index)) else {
                failure = Some(gather.internal(format!("iteration {chunk} was forgotten")));
                return;
            };
            let end = ops.ends.iter().map(|&op| run.times(op).1).max().unwrap_or(previous_end);
            iteration_times.push(end.saturating_since(previous_end));
            previous_end = end;
            gather.iteration_ends.push(end);
            if pipelined {
                let mut ends = vec![None; ranks];
                for (rank, &op) in gather.ranks.iter().zip(&ops.pipeline_ends) {
                    ends[rank.0 as usize] = Some(run.times(op).1);
                }
                gather.pipeline_ends.push_back((chunk as u32, ends));
            }
            retired = true;
        });
        if let Some(error) = failure {
            return Err(error);
        }
        if retired {
            let done = gather.iteration_ends.len() as u32;
            source.forget_before(done);
            // Nothing that starts from now on starts before the earliest held op's start, or
            // now; and nothing is cut short before the last retired iteration's end, which
            // the run's end is not before.
            let watermark = run.earliest_held_start().min(run.now()).min(previous_end);
            gather.settle(watermark);
            // An iteration's bubble waits for the iteration after it to be retired too (the
            // host waits of its ops are read at retirement).
            gather.bubbles_through(watermark, done.saturating_sub(1));
        }
    }
    run.finish().map_err(exec_error)?;
    let to = previous_end;
    gather.bubbles_through(SimTime::from_ps(u64::MAX), u32::MAX);
    let mut per_rank = Vec::new();
    let mut by_group = Vec::new();
    let mut offload_stall_ps = 0u128;
    for stats in gather.stats.iter_mut().flatten() {
        let compute = stats.compute.finish(to);
        let communication = stats.communication.finish(to);
        let busy = stats.busy.finish(to);
        per_rank.push(RankBreakdown {
            compute,
            exposed_communication: busy.saturating_sub(compute),
            idle: to.since_start().saturating_sub(busy),
            communication,
        });
        by_group.push(stats.groups.finish(to));
        if gather.offload.is_some() {
            offload_stall_ps += u128::from(stats.offload.finish(to)[0].as_ps());
        }
    }
    Ok(Some(Measured {
        iteration_times,
        total: to.since_start(),
        per_rank,
        by_group,
        offload_stall_ps,
        host_bound_ps: gather.host_bound_ps,
        input_bound_ps: gather.input_bound_ps,
        bubble_ps: gather.bubble_ps,
        flush_wait_ps: gather.flush_wait_ps,
        ops: gather.ops,
        events: run.events(),
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use super::*;
    use crate::Override;
    use std::path::Path;

    /// `path` (from the repository root) with `sets` (`KEY=VALUE`), simulated whole and
    /// streamed: the two reports, as JSON.
    fn both(path: &str, sets: &[&str]) -> (String, String) {
        let overrides: Vec<Override> = sets.iter().map(|set| set.parse().unwrap()).collect();
        let scenario = Scenario::load_with(&Path::new("..").join(path), &overrides).unwrap();
        let whole = crate::simulation::simulate(&scenario).unwrap();
        let streamed = simulate_streamed(&scenario, false).unwrap();
        (serde_json::to_string(&whole.summary).unwrap(), serde_json::to_string(&streamed.summary).unwrap())
    }

    #[test]
    fn streamed_iterations_report_what_the_whole_graph_does() {
        // Small versions (debug builds run these): 16 GPUs, 3 iterations, under the
        // analytical and the flow model; DASO over two global intervals on 2 nodes of 4.
        let small = ["cluster.nodes=2", "parallelism.data=16", "simulation.iterations=3"];
        for (path, sets) in [
            ("scenarios/quickstart.toml", small.to_vec()),
            ("scenarios/quickstart.toml", [&small[..], &["simulation.fidelity=\"flow\""]].concat()),
            (
                "scenarios/daso/resnet50-8x4-a100.toml",
                vec![
                    "cluster.nodes=2",
                    "parallelism.data=8",
                    "simulation.iterations=8",
                    "parallelism.global-sync-every=4",
                ],
            ),
        ] {
            let (whole, streamed) = both(path, &sets);
            assert_eq!(whole, streamed, "{path} {sets:?}");
        }
    }

    #[test]
    fn a_streamed_pipeline_reports_its_bubble_as_the_whole_graph_does() {
        let (whole, streamed) = both(
            "scenarios/megatron-sc21/gpt-1.7b.toml",
            &["simulation.iterations=3", "cluster.nodes=1", "parallelism.pipeline=2", "parallelism.data=4"],
        );
        assert!(whole.contains("\"bubble_s\""), "{whole}");
        assert_eq!(whole, streamed);
    }
}
