//! Several jobs on one fabric, run: each job of a [`JobsScenario`] is lowered on its own
//! ranks (every rank simulated), placed on the fabric's GPUs ([`GraphBuilder::append`]), and
//! the jobs run together in one graph under the scenario's flow model, so their traffic shares
//! links; then each runs alone on the same fabric and the same GPUs. A job's slowdown is its
//! time shared over its time alone. The links that carried the traffic of more than one job
//! are reported busiest first: where the jobs met.
//!
//! With `[variability]` the shared run is re-timed ([`sim_core::montecarlo::Retimer`]): every
//! iteration of every job with fresh draws for the fabric's GPUs, each communication at its
//! duration in the shared run (contention as it was there), and each job's iteration times
//! summarised as a distribution ([`JobDistribution`]).

use serde::Serialize;
use sim_core::graph::{ExecGraph, GraphBuilder, OpId, RankId};
use sim_core::units::{SimDuration, SimTime};
use strategies::StrategyError;
use topology::LinkId;

use crate::links::LinkLoad;
use crate::simulation::{SimulationError, fabric, prepare};
use crate::{Job, JobsScenario};

/// What `parasim run` reports for a scenario with several jobs. A pure function of the
/// scenario: no wall-clock numbers.
#[derive(Debug, Clone, Serialize)]
pub struct JobsSummary {
    /// The scenario file.
    pub scenario: String,
    /// Network model (`flow` or `packet-steps`).
    pub fidelity: &'static str,
    /// The placement policy of the jobs without a `node-list`.
    pub placement: crate::Placement,
    /// Its seed (used by `random`).
    pub placement_seed: u64,
    /// GPUs of the whole fabric.
    pub gpus: u32,
    /// Nodes of the whole fabric.
    pub nodes: u32,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// The fabric, as `run` describes a network.
    pub network: String,
    /// Each job, in file order.
    pub jobs: Vec<JobSummary>,
    /// From zero to the end of the last job in the shared run, in seconds.
    pub makespan_s: f64,
    /// The 10 links that carried the traffic of at least two jobs, by mean utilisation over
    /// the shared run (ties: more bytes, lower id).
    pub contended_links: Vec<ContendedLink>,
    /// The 10 busiest links of the shared run, whoever's traffic they carried.
    pub busiest_links: Vec<ContendedLink>,
}

/// One job's line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct JobSummary {
    /// `jobs[i].name`.
    pub name: String,
    /// The model it trains.
    pub model: String,
    /// How it is split (as `run` writes a strategy).
    pub strategy: String,
    /// GPUs it runs on.
    pub gpus: u32,
    /// The fabric's nodes it runs on, in rank order.
    pub node_list: Vec<u32>,
    /// When it starts, in seconds.
    pub start_s: f64,
    /// Iterations it runs.
    pub iterations: u32,
    /// From its start to the end of its last iteration, alone on the fabric (same GPUs), in
    /// seconds.
    pub alone_s: f64,
    /// The same with every job running, in seconds.
    pub shared_s: f64,
    /// Shared over alone (1.0: the others did not slow it down).
    pub slowdown: f64,
    /// Its iteration times re-timed with `[variability]`'s draws, if the scenario has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distribution: Option<JobDistribution>,
    /// Its goodput under `[failures]`, if the scenario has any: the failures of the GPUs and
    /// nodes it runs on and of the cables its traffic crossed (in its run alone), its step the
    /// shared run's mean iteration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goodput: Option<crate::failures::GoodputSummary>,
}

/// One job's iteration times under `[variability]`: its iterations in the shared run, re-timed
/// with fresh draws for every iteration (communication as in the shared run), summarised by an
/// HdrHistogram (4 significant digits).
#[derive(Debug, Clone, Serialize)]
pub struct JobDistribution {
    /// Iterations re-timed (the job's `simulation.iterations`).
    pub iterations: u32,
    /// The draws' seed (`simulation.seed`).
    pub seed: u64,
    /// Its mean iteration time in the shared run without variability, in seconds.
    pub nominal_s: f64,
    /// Mean iteration time with variability, in seconds.
    pub mean_s: f64,
    /// Median, in seconds.
    pub p50_s: f64,
    /// 90th percentile, in seconds.
    pub p90_s: f64,
    /// 99th percentile, in seconds.
    pub p99_s: f64,
    /// The slowest iteration, in seconds.
    pub max_s: f64,
    /// Mean with variability over the nominal mean.
    pub slowdown: f64,
}

/// A link of the shared run and whose traffic it carried.
#[derive(Debug, Clone, Serialize)]
pub struct ContendedLink {
    /// The link, its bytes in the shared run and its utilisation over the shared run's
    /// makespan (the same keys as every other report's links, in one JSON object with `jobs`).
    #[serde(flatten)]
    pub link: LinkLoad,
    /// The jobs whose traffic crossed it (in their runs alone).
    pub jobs: Vec<String>,
}

/// A run of several jobs, with what a report needs besides the summary.
pub struct JobsOutcome {
    /// The results.
    pub summary: JobsSummary,
    /// Ops of the shared graph.
    pub ops: usize,
    /// Events of the shared run.
    pub events: u64,
    /// Wall time of lowering the jobs.
    pub lowering_wall: std::time::Duration,
    /// Wall time of the shared run and the runs alone (side by side on the thread pool).
    pub simulation_wall: std::time::Duration,
}

/// One job lowered: its graph, the fabric GPU of each of its ranks, and per iteration the ops
/// whose latest end closes it.
struct Lowered {
    graph: ExecGraph,
    ranks: Vec<RankId>,
    iteration_ends: Vec<Vec<OpId>>,
}

/// Runs the jobs of `scenario` together and each alone (see the module documentation).
pub fn simulate(scenario: &JobsScenario) -> Result<JobsOutcome, SimulationError> {
    let started = std::time::Instant::now();
    let gpus_per_node = scenario.cluster.gpus_per_node;
    let total = scenario.cluster.nodes * gpus_per_node;
    let lowered: Vec<Lowered> =
        scenario.jobs.iter().map(|job| lower(job, gpus_per_node)).collect::<Result<_, SimulationError>>()?;
    let topology = fabric(&scenario.cluster, scenario.faults.as_ref(), &scenario.source)?;
    if let Some((key, message)) =
        scenario.failures.as_ref().and_then(|failures| crate::failures::unknown_link(failures, &topology))
    {
        return Err(SimulationError::Key { scenario: scenario.source.clone(), key, message });
    }
    let lowering_wall = started.elapsed();
    let started = std::time::Instant::now();
    let source = &scenario.source;
    // The jobs share `[simulation]` and the device, so their network settings differ at most
    // in the device-copy rate a job's own `[compute]` gives: the shared run takes the first
    // job's, each run alone its own.
    let network = &scenario.jobs[0].scenario.network;
    let merged = |jobs: &[usize]| -> Result<(ExecGraph, Vec<OpId>), SimulationError> {
        let mut builder = GraphBuilder::new(total);
        let mut firsts = Vec::with_capacity(jobs.len());
        for &index in jobs {
            let job = &lowered[index];
            firsts.push(
                builder
                    .append(&job.graph, &job.ranks, scenario.jobs[index].start)
                    .map_err(|error| graph_error(source, &scenario.jobs[index].name, error))?,
            );
        }
        let graph = builder.build().map_err(|error| graph_error(source, "all jobs", error))?;
        Ok((graph, firsts))
    };
    // The end of each job's last op (its ops are `first..first + count`).
    let end_of = |timeline: &sim_core::exec::Timeline, first: OpId, index: usize| {
        let count = lowered[index].graph.op_count();
        let range = first.0 as usize..first.0 as usize + count;
        timeline.end[range].iter().copied().max().unwrap_or(SimTime::ZERO)
    };
    let exec_error = |source: sim_core::exec::ExecError| SimulationError::Exec {
        scenario: scenario.source.clone(),
        source: Box::new(source),
    };
    let everyone: Vec<usize> = (0..lowered.len()).collect();
    let shared = || -> Result<_, SimulationError> {
        let (graph, firsts) = merged(&everyone)?;
        let (timeline, link_bytes) =
            network.run_counting_link_bytes(&graph, &topology).map_err(exec_error)?;
        let ends: Vec<SimTime> =
            firsts.iter().zip(&everyone).map(|(&first, &index)| end_of(&timeline, first, index)).collect();
        let distributions = if scenario.variability.is_active() {
            firsts
                .iter()
                .enumerate()
                .map(|(index, &first)| {
                    distribution(scenario, &graph, &timeline, &lowered[index], first, index)
                })
                .map(|result| result.map(Some))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            vec![None; firsts.len()]
        };
        Ok((
            ends,
            link_bytes.unwrap_or_default(),
            graph.op_count(),
            timeline.events,
            timeline.makespan(),
            distributions,
        ))
    };
    let alone = |index: usize| -> Result<_, SimulationError> {
        let (graph, firsts) = merged(&[index])?;
        let (timeline, link_bytes) = scenario.jobs[index]
            .scenario
            .network
            .run_counting_link_bytes(&graph, &topology)
            .map_err(exec_error)?;
        Ok((end_of(&timeline, firsts[0], index), link_bytes.unwrap_or_default()))
    };
    let (shared, alone) = rayon::join(shared, || {
        use rayon::prelude::*;
        everyone.par_iter().map(|&index| alone(index)).collect::<Vec<_>>()
    });
    let (shared_ends, shared_bytes, ops, events, makespan, mut distributions) = shared?;
    let alone = alone.into_iter().collect::<Result<Vec<_>, _>>()?;
    let simulation_wall = started.elapsed();

    let jobs = scenario
        .jobs
        .iter()
        .enumerate()
        .map(|(index, job)| {
            let since_start = |end: SimTime| end.saturating_since(SimTime::ZERO).saturating_sub(job.start);
            let alone_time = since_start(alone[index].0);
            let shared_time = since_start(shared_ends[index]);
            JobSummary {
                name: job.name.clone(),
                model: job.scenario.model.name.clone(),
                strategy: strategies::describe_parallelism(&job.scenario.parallelism),
                gpus: job.nodes.len() as u32 * gpus_per_node,
                node_list: job.nodes.clone(),
                start_s: job.start.as_secs_f64(),
                iterations: job.scenario.iterations,
                alone_s: alone_time.as_secs_f64(),
                shared_s: shared_time.as_secs_f64(),
                slowdown: ratio(shared_time, alone_time),
                distribution: distributions[index].take(),
                goodput: scenario.failures.as_ref().map(|failures| {
                    let step = shared_time.as_secs_f64() / f64::from(job.scenario.iterations.max(1));
                    job_goodput(failures, job, gpus_per_node, &topology, &alone[index].1, step)
                }),
            }
        })
        .collect();
    let seconds = makespan.as_secs_f64();
    let link = |id: usize, bytes: f64| ContendedLink {
        link: LinkLoad::new(&topology, LinkId(id as u32), bytes, seconds),
        jobs: scenario
            .jobs
            .iter()
            .zip(&alone)
            .filter(|(_, (_, bytes))| bytes.get(id).is_some_and(|&b| b > 0.0))
            .map(|(job, _)| job.name.clone())
            .collect(),
    };
    let mut links: Vec<ContendedLink> = shared_bytes
        .iter()
        .enumerate()
        .filter(|&(_, &bytes)| bytes > 0.0)
        .map(|(id, &bytes)| link(id, bytes))
        .collect();
    links.sort_by(|a, b| a.link.busier_first(&b.link));
    let contended_links: Vec<ContendedLink> =
        links.iter().filter(|link| link.jobs.len() > 1).take(10).cloned().collect();
    links.truncate(10);
    let summary = JobsSummary {
        scenario: scenario.source.clone(),
        fidelity: network.fidelity.name(),
        placement: scenario.placement,
        placement_seed: scenario.placement_seed,
        gpus: total,
        nodes: scenario.cluster.nodes,
        gpus_per_node,
        network: scenario
            .cluster
            .network
            .describe(gpus_per_node, scenario.jobs[0].scenario.device.kind.noun()),
        jobs,
        makespan_s: seconds,
        contended_links,
        busiest_links: links,
    };
    Ok(JobsOutcome { summary, ops, events, lowering_wall, simulation_wall })
}

/// Job `index`'s iterations in the shared run (`graph`, `timeline`; its ops from `first`)
/// re-timed with the scenario's variability.
fn distribution(
    scenario: &JobsScenario,
    graph: &ExecGraph,
    timeline: &sim_core::exec::Timeline,
    job: &Lowered,
    first: OpId,
    index: usize,
) -> Result<JobDistribution, SimulationError> {
    let name = &scenario.jobs[index].name;
    let ends: Vec<Vec<OpId>> =
        job.iteration_ends.iter().map(|ops| ops.iter().map(|op| OpId(first.0 + op.0)).collect()).collect();
    let failed = |message: String| SimulationError::Key {
        scenario: scenario.source.clone(),
        key: "variability".into(),
        message: format!("{name}: {message}"),
    };
    let retimer = sim_core::montecarlo::Retimer::new(graph, timeline, &ends)
        .map_err(|error| failed(error.to_string()))?;
    let iterations = ends.len() as u32;
    let run = retimer.run(&scenario.variability, scenario.seed, iterations);
    // The nominal iteration times: the same ends in the shared run.
    let mut nominal = Vec::with_capacity(ends.len());
    let mut previous = scenario.jobs[index].start.as_ps();
    for ops in &ends {
        let end = ops.iter().map(|op| timeline.end[op.0 as usize].as_ps()).max().unwrap_or(previous);
        nominal.push(end.saturating_sub(previous));
        previous = end;
    }
    // The re-timing starts every rank at zero: the first iteration's time holds the job's
    // start (its wait is kept as it was), which is not an iteration's.
    let mut times = run.iteration_times.clone();
    if let Some(first_time) = times.first_mut() {
        *first_time = first_time.saturating_sub(scenario.jobs[index].start);
    }
    let run = sim_core::montecarlo::MonteCarloRun { iteration_times: times, ..run };
    let mut histogram = hdrhistogram::Histogram::<u64>::new(4).map_err(|error| failed(error.to_string()))?;
    for time in &run.iteration_times {
        histogram.record((time.as_ps() / 1000).max(1)).map_err(|error| failed(error.to_string()))?;
    }
    let count = run.iteration_times.len().max(1) as f64;
    let mean_s = run.iteration_times.iter().map(|t| t.as_secs_f64()).sum::<f64>() / count;
    let nominal_s = nominal.iter().map(|&ps| ps as f64 * 1e-12).sum::<f64>() / nominal.len().max(1) as f64;
    let quantile = |q: f64| histogram.value_at_quantile(q) as f64 * 1e-9;
    Ok(JobDistribution {
        iterations,
        seed: scenario.seed,
        nominal_s,
        mean_s,
        p50_s: quantile(0.5),
        p90_s: quantile(0.9),
        p99_s: quantile(0.99),
        max_s: run.iteration_times.iter().map(|t| t.as_secs_f64()).fold(0.0, f64::max),
        slowdown: if nominal_s > 0.0 { mean_s / nominal_s } else { 1.0 },
    })
}

/// The goodput of `job` under the fabric's `failures`: its components are its GPUs, its nodes
/// and the cables whose links carried its traffic in its run alone (`bytes`, per link), and
/// the failures named at given times are those of its components; its step takes `step`
/// seconds.
fn job_goodput(
    failures: &crate::failures::Failures,
    job: &Job,
    gpus_per_node: u32,
    topology: &topology::Topology,
    bytes: &[f64],
    step: f64,
) -> crate::failures::GoodputSummary {
    use crate::failures::ComponentKind;
    use topology::Tier;
    let gpus = job.gpus(gpus_per_node);
    let is_cable = |id: usize| {
        !matches!(topology.link(LinkId(id as u32)).tier, Tier::IntraNode | Tier::GpuToNic | Tier::HostMemory)
    };
    let used: Vec<usize> = (0..bytes.len()).filter(|&id| bytes[id] > 0.0 && is_cable(id)).collect();
    let mine = |event: &crate::failures::FailureEvent| match event.kind {
        ComponentKind::Gpu => event.component.parse::<u32>().is_ok_and(|gpu| gpus.contains(&gpu)),
        ComponentKind::Node => event.component.parse::<u32>().is_ok_and(|node| job.nodes.contains(&node)),
        ComponentKind::Link => {
            used.iter().any(|&id| topology.link_name(LinkId(id as u32)) == event.component)
        }
    };
    let own = crate::failures::Failures {
        events: failures.events.iter().filter(|event| mine(event)).cloned().collect(),
        ..failures.clone()
    };
    let components = crate::failures::Components {
        gpus: gpus.len() as u64,
        nodes: job.nodes.len() as u64,
        cables: (used.len() as u64).div_ceil(2),
    };
    crate::failures::goodput(&own, step, crate::simulation::checkpoint_bytes(&job.scenario), components)
}

/// `shared / alone`, 1 for a job that took no time.
fn ratio(shared: SimDuration, alone: SimDuration) -> f64 {
    if alone.as_ps() == 0 { 1.0 } else { shared.as_ps() as f64 / alone.as_ps() as f64 }
}

/// A merged graph that does not build: an engine defect, reported with the job.
fn graph_error(scenario: &str, job: &str, error: sim_core::graph::GraphError) -> SimulationError {
    SimulationError::Key {
        scenario: scenario.to_string(),
        key: "jobs".into(),
        message: format!("{job}: {error}"),
    }
}

/// Lowers `job` on its own ranks and checks its memory as a one-job run does.
fn lower(job: &Job, gpus_per_node: u32) -> Result<Lowered, SimulationError> {
    let scenario = &job.scenario;
    let lowered = scenario.strategy().lower().map_err(|error| match error {
        StrategyError::OverBudget(budget) => {
            SimulationError::OverBudget { scenario: scenario.source.clone(), budget }
        }
        error => error.into(),
    })?;
    prepare(scenario, &lowered.stages, lowered.offload.as_ref())?;
    let ranks = job.gpus(gpus_per_node).into_iter().map(RankId).collect();
    Ok(Lowered { graph: lowered.graph, ranks, iteration_ends: lowered.iteration_ends })
}
