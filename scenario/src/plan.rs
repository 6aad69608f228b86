//! The strategy oracle behind `parasim plan`: every valid way of splitting a model over a
//! cluster, the ones that do not fit refused by the memory model, the rest ranked by
//! simulation, cheapest first.
//!
//! The search is exact with respect to the screening simulation and cheap in practice:
//! 1. **enumerate** the degrees (transformers: tensor, sequence parallelism, pipeline, virtual
//!    stages, context, expert, ZeRO stage, micro-batch, recomputation; CNNs: data, spatial,
//!    filter, channel, pipeline, micro-batch) and the GPU counts asked for;
//! 2. **estimate** each: the strategy's checks, its per-stage memory, and a lower bound of its
//!    iteration time ([`strategies::Strategy::estimate`], no graph built);
//! 3. **screen** the configurations that fit, in order of their bound, with the analytical
//!    network: a batch at a time, stopping when the next bound cannot beat the `keep`-th best
//!    screened time (what it skips cannot enter the top `keep`);
//! 4. **final**: the best `keep` simulated again with the cluster's own network model (flow or
//!    packet) when it is not the analytical one, and ranked by that.
//!
//! Degrees a user fixes (`--set parallelism.tensor=8`) are not enumerated.

use sim_core::lookup::{LookupMap, LookupSet};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::Serialize;
use sim_core::fidelity::Fidelity;
use sim_core::units::SimDuration;

use crate::Scenario;
use crate::simulation::{Summary, simulate};
use strategies::{CnnSplit, Comm, GroupKind, LayerTables, Parallelism, Strategy, StrategyError, shard};
use workloads::memory::Recompute;

/// What the ranking minimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// Iteration time (so the time to train a budget).
    Time,
    /// Throughput per GPU (samples or tokens per second per GPU): the most efficient use of
    /// the GPUs, which can favour fewer of them.
    Throughput,
    /// GPU-hours to train the budget (times `--gpu-hour-price` if given). For a fixed global
    /// batch this ranks as throughput per GPU does; it prints the bill.
    Cost,
}

/// A training budget, for time-to-train and cost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Budget {
    /// Tokens (sequence models).
    Tokens(f64),
    /// Samples.
    Samples(f64),
}

/// The settings of a search.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// What is ranked.
    pub objective: Objective,
    /// How many configurations the result lists.
    pub top: usize,
    /// What to train, for time-to-train and cost.
    pub budget: Option<Budget>,
    /// Price of one GPU-hour, for cost.
    pub gpu_hour_price: Option<f64>,
    /// Share of each device's memory kept free (CUDA context, NCCL buffers, allocator
    /// fragmentation): a configuration fits in `(1 - headroom) x capacity`.
    pub memory_headroom: f64,
    /// Work budget of each final simulation (`sim_core::flow::FlowStats::work`): one that
    /// runs over keeps its screening (analytical) result, marked as such. `None`: no limit. A
    /// budget rather than a wall-clock limit, so that the same search gives the same answer
    /// on any machine and under any load; [`FLOW_WORK_PER_SECOND`] converts seconds.
    pub final_work_budget: Option<u64>,
}

/// The flow model's work (`sim_core::flow::FlowStats::work`) per second of wall time, measured
/// on the 2-core development VM (docs/plan.md): converts `--final-time-limit`'s seconds into
/// [`PlanOptions::final_work_budget`].
pub const FLOW_WORK_PER_SECOND: u64 = 20_000_000;

/// Degrees and settings the user fixed: those are not enumerated.
#[derive(Debug, Clone, Default)]
pub struct Fixed {
    /// `parallelism.tensor`.
    pub tensor: Option<u32>,
    /// `parallelism.sequence-parallel`.
    pub sequence_parallel: Option<bool>,
    /// `parallelism.pipeline`.
    pub pipeline: Option<u32>,
    /// `parallelism.virtual-stages`.
    pub virtual_stages: Option<u32>,
    /// `parallelism.context`.
    pub context: Option<u32>,
    /// `parallelism.expert`.
    pub expert: Option<u32>,
    /// `parallelism.zero`.
    pub zero: Option<u8>,
    /// `parallelism.data`.
    pub data: Option<u32>,
    /// `parallelism.filter`.
    pub filter: Option<u32>,
    /// `parallelism.channel`.
    pub channel: Option<u32>,
    /// `parallelism.spatial`.
    pub spatial: Option<u32>,
    /// `workload.micro-batch`.
    pub micro_batch: Option<u64>,
    /// `workload.recompute`.
    pub recompute: Option<Recompute>,
    /// `simulation.fold-symmetric-ranks`.
    pub fold_symmetric_ranks: Option<bool>,
}

/// Why a search could not run.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Nothing to search.
    #[error("no GPU count to plan for")]
    NoGpus,
    /// The fixed settings leave no configuration.
    #[error("{0}")]
    Empty(String),
}

/// One configuration of the search space.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// Index into the base scenarios (one per GPU count).
    pub base: usize,
    /// GPUs.
    pub gpus: u64,
    /// The degrees.
    pub parallelism: Parallelism,
    /// Samples per micro-batch.
    pub micro_batch: u64,
    /// Recomputation.
    pub recompute: Recompute,
}

impl Choice {
    /// `"t8 sp p16 v2 d8 zero1 mb1 selective"`: the degrees above 1 and the settings.
    pub fn label(&self) -> String {
        let p = &self.parallelism;
        let mut parts = Vec::new();
        for (name, degree) in [
            ("t", p.tensor),
            ("c", p.context),
            ("e", p.expert),
            ("spatial", p.spatial),
            ("filter", p.filter),
            ("channel", p.channel),
            ("p", p.pipeline),
            ("v", p.virtual_stages),
        ] {
            if degree > 1 {
                parts.push(format!("{name}{degree}"));
            }
            if name == "t" && p.sequence_parallel {
                parts.push("sp".into());
            }
        }
        parts.push(format!("d{}", p.data));
        if p.zero > 0 {
            parts.push(format!("zero{}", p.zero));
        }
        parts.push(format!("mb{}", self.micro_batch));
        if self.recompute != Recompute::None {
            parts.push(self.recompute.to_string());
        }
        parts.join(" ")
    }
}

/// A simulated configuration.
#[derive(Debug, Clone)]
pub struct Ranked {
    /// What was simulated.
    pub choice: Choice,
    /// Its lower bound.
    pub bound: SimDuration,
    /// The simulation's summary (the final network model's, or the screen's).
    pub summary: Summary,
    /// The network model of `summary`.
    pub fidelity: Fidelity,
    /// The final simulation ran over its work budget: `summary` is the screen's, and it ranks
    /// after the configurations whose final simulation finished.
    pub over_time_limit: bool,
    /// Time to train the budget, in seconds.
    pub time_to_train_s: Option<f64>,
    /// GPU-hours to train the budget.
    pub gpu_hours: Option<f64>,
    /// GPU-hours times the price.
    pub cost: Option<f64>,
}

/// Configurations refused for one reason.
#[derive(Debug, Clone, Serialize)]
pub struct Rejection {
    /// How many.
    pub count: u64,
    /// One of them, with its message.
    pub example: String,
}

/// The result of a search.
#[derive(Debug, Clone)]
pub struct PlanReport {
    /// Configurations enumerated.
    pub enumerated: u64,
    /// Refused, by reason (the scenario key, or "does not fit in memory").
    pub rejected: BTreeMap<String, Rejection>,
    /// Configurations that fit.
    pub valid: u64,
    /// Simulated by the screen.
    pub screened: u64,
    /// Skipped because their bound could not beat the `keep`-th best screened time.
    pub bounded_out: u64,
    /// Failed in simulation (with messages).
    pub failed: Vec<(String, String)>,
    /// Simulated again with the cluster's own network model.
    pub finals: u64,
    /// Configurations not simulated with the cluster's network model that might still beat
    /// the best of those that were: their lower bound (their analytical time when the screen
    /// ran them, which leaves contention out) is below the winner's score. The search is exact
    /// with respect to the screen; this says how far it is from exact with respect to the
    /// final model. 0 with the analytical network.
    pub could_beat_final: u64,
    /// The best configurations, best first.
    pub top: Vec<Ranked>,
    /// Wall time of enumeration and estimates, of the screen and of the final simulations.
    pub walls: [Duration; 3],
    /// The cluster's network model.
    pub fidelity: Fidelity,
    /// How many of the best screened configurations the bound protects and the final
    /// simulations take.
    pub keep: usize,
}

/// Configurations screened per batch: fixed, so the result does not depend on the threads.
const BATCH: usize = 8;

/// Searches the configurations of `bases` (one validated scenario per GPU count: cluster,
/// model, batch, precision and every fixed setting), ranked by `options.objective`.
pub fn plan(bases: &[Scenario], fixed: &Fixed, options: &PlanOptions) -> Result<PlanReport, PlanError> {
    plan_with_progress(bases, fixed, options, &|_| {})
}

/// [`plan`], telling `progress` what it is doing (after the estimates and after each screened
/// batch), for a progress bar.
pub fn plan_with_progress(
    bases: &[Scenario],
    fixed: &Fixed,
    options: &PlanOptions,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<PlanReport, PlanError> {
    if bases.is_empty() {
        return Err(PlanError::NoGpus);
    }
    let started = Instant::now();
    let choices: Vec<Choice> =
        bases.iter().enumerate().flat_map(|(index, base)| enumerate(index, base, fixed)).collect();
    if choices.is_empty() {
        let gpus: Vec<String> = bases
            .iter()
            .map(|b| (u64::from(b.cluster.nodes) * u64::from(b.cluster.gpus_per_node)).to_string())
            .collect();
        return Err(PlanError::Empty(format!(
            "no configuration to try on {} GPUs: the degrees must multiply to the GPU count, and data x \
             micro-batch must divide the global batch ({}); check the fixed settings and the batch",
            gpus.join(" or "),
            bases[0].global_batch
        )));
    }
    // Configurations with the same split, micro-batch and precision share their local layers
    // and kernel times.
    let tables: Vec<LayerTables<'_>> =
        bases.iter().map(|base| LayerTables::new(&base.model, &base.device, &base.compute)).collect();
    let estimates: Vec<Result<SimDuration, (String, String)>> = choices
        .par_iter()
        .map(|choice| {
            // The base's strategy with the choice's settings (as `scenario_of` sets them),
            // without copying the scenario and its model.
            let base = &bases[choice.base];
            let strategy = Strategy {
                parallelism: choice.parallelism,
                micro_batch: choice.micro_batch,
                recompute: choice.recompute,
                fold_symmetric_ranks: fixed.fold_symmetric_ranks.unwrap_or(true),
                layer_tables: Some(&tables[choice.base]),
                ..base.strategy()
            };
            let floor = cluster_comm_floor(&base.cluster, choice.parallelism);
            let estimate = strategy.estimate(&floor).map_err(|error| match error {
                StrategyError::Invalid { key, message } => (key.to_string(), format!("{key}: {message}")),
                other => ("other".to_string(), other.to_string()),
            })?;
            let memory = estimate.peak_memory().total().0 as f64;
            let capacity = base.device.memory_capacity.0 as f64;
            if memory > capacity * (1.0 - options.memory_headroom) {
                return Err((
                    "does not fit in memory".to_string(),
                    format!(
                        "needs {:.1} GB per GPU; {:.1} GB usable of {:.1} GB",
                        memory / 1e9,
                        capacity * (1.0 - options.memory_headroom) / 1e9,
                        capacity / 1e9
                    ),
                ));
            }
            Ok(estimate.time_lower_bound)
        })
        .collect();
    let mut rejected: BTreeMap<String, Rejection> = BTreeMap::new();
    let mut valid: Vec<(usize, SimDuration)> = Vec::new();
    for (index, estimate) in estimates.into_iter().enumerate() {
        match estimate {
            Ok(bound) => valid.push((index, bound)),
            Err((reason, message)) => {
                rejected.entry(reason).and_modify(|r| r.count += 1).or_insert_with(|| Rejection {
                    count: 1,
                    example: format!("{}: {message}", choices[index].label()),
                });
            }
        }
    }
    let estimate_wall = started.elapsed();
    progress(&format!(
        "{} configurations, {} valid and fit ({:.1} s); screening in order of their lower bound",
        choices.len(),
        valid.len(),
        estimate_wall.as_secs_f64()
    ));
    let objective = options.objective;
    let score = |choice: &Choice, time: SimDuration| -> f64 {
        match objective {
            Objective::Time => time.as_secs_f64(),
            Objective::Throughput | Objective::Cost => time.as_secs_f64() * choice.gpus as f64,
        }
    };
    valid.sort_by(|a, b| score(&choices[a.0], a.1).total_cmp(&score(&choices[b.0], b.1)).then(a.0.cmp(&b.0)));

    // The screen: analytical simulations in bound order, until no bound can beat the keep-th.
    let started = Instant::now();
    let keep = (options.top.max(1) * 2).max(options.top + 4);
    let mut screened: Vec<(f64, usize, SimDuration, Summary)> = Vec::new();
    let mut failed = Vec::new();
    let mut next = 0;
    while next < valid.len() {
        if screened.len() >= keep {
            let threshold = screened[keep - 1].0;
            let (index, bound) = valid[next];
            if score(&choices[index], bound) >= threshold {
                break;
            }
        }
        let batch = &valid[next..(next + BATCH).min(valid.len())];
        next += batch.len();
        let results: Vec<_> = batch
            .par_iter()
            .map(|&(index, bound)| {
                let choice = &choices[index];
                let mut scenario = scenario_of(&bases[choice.base], choice, fixed);
                scenario.network.fidelity = Fidelity::Analytical;
                (index, bound, simulate(&scenario).map(|outcome| outcome.summary))
            })
            .collect();
        for (index, bound, result) in results {
            match result {
                Ok(summary) => {
                    screened.push((score(&choices[index], summary.iteration_time), index, bound, summary))
                }
                Err(error) => failed.push((choices[index].label(), error.to_string())),
            }
        }
        screened.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let best = screened.first().map_or(0.0, |s| s.0);
        let next_bound = valid.get(next).map_or(f64::INFINITY, |&(i, b)| score(&choices[i], b));
        progress(&format!(
            "screened {next} of {}: best {best:.4}, {}th best {:.4}, next bound {next_bound:.4}",
            valid.len(),
            keep,
            screened.get(keep - 1).map_or(f64::INFINITY, |s| s.0)
        ));
    }
    let fidelity = bases[0].network.fidelity;
    if fidelity != Fidelity::Analytical {
        progress(&format!(
            "simulating the best {} with the {} network",
            screened.len().min(keep),
            fidelity.name()
        ));
    }
    let screened_count = next as u64;
    let bounded_out = (valid.len() - next) as u64;
    // Every screened configuration's analytical score: a tighter floor than its bound for the
    // final model's (which adds contention).
    let screen_scores: LookupMap<usize, f64> = screened.iter().map(|s| (s.1, s.0)).collect();
    screened.truncate(keep);
    let screen_wall = started.elapsed();

    // The final ranking with the cluster's network model.
    let started = Instant::now();
    let mut finals = 0;
    let mut ranked: Vec<(f64, usize, SimDuration, Summary, Fidelity, bool)> =
        if fidelity == Fidelity::Analytical {
            screened
                .into_iter()
                .map(|(s, i, b, summary)| (s, i, b, summary, Fidelity::Analytical, false))
                .collect()
        } else {
            finals = screened.len() as u64;
            let results: Vec<_> = screened
                .into_par_iter()
                .map(|(screen_score, index, bound, screen)| {
                    let choice = &choices[index];
                    let mut scenario = scenario_of(&bases[choice.base], choice, fixed);
                    scenario.network.work_budget = options.final_work_budget;
                    (screen_score, index, bound, screen, simulate(&scenario).map(|outcome| outcome.summary))
                })
                .collect();
            let mut ranked = Vec::new();
            for (screen_score, index, bound, screen, result) in results {
                match result {
                    Ok(summary) => ranked.push((
                        score(&choices[index], summary.iteration_time),
                        index,
                        bound,
                        summary,
                        fidelity,
                        false,
                    )),
                    Err(error) if over_budget(&error) => {
                        ranked.push((screen_score, index, bound, screen, Fidelity::Analytical, true));
                    }
                    Err(error) => failed.push((choices[index].label(), error.to_string())),
                }
            }
            ranked
        };
    ranked.sort_by(|a, b| final_order((a.5, a.0, a.1), (b.5, b.0, b.1)));
    let could_beat_final = match ranked.iter().find(|r| !r.5) {
        Some(winner) if finals > 0 => {
            let simulated: LookupSet<usize> = ranked.iter().filter(|r| !r.5).map(|r| r.1).collect();
            valid
                .iter()
                .filter(|&&(index, bound)| {
                    let floor = screen_scores.get(&index).copied().unwrap_or(score(&choices[index], bound));
                    !simulated.contains(&index) && floor < winner.0
                })
                .count() as u64
        }
        _ => 0,
    };
    ranked.truncate(options.top.max(1));
    let final_wall = started.elapsed();
    let top = ranked
        .into_iter()
        .map(|(_, index, bound, summary, fidelity, over_time_limit)| {
            let choice = choices[index].clone();
            let base = &bases[choice.base];
            let iterations = options.budget.map(|budget| match budget {
                Budget::Samples(samples) => samples / base.global_batch as f64,
                Budget::Tokens(tokens) => {
                    let sequence = shard::sequence_length(&base.model).unwrap_or(1);
                    tokens / (base.global_batch as f64 * sequence as f64)
                }
            });
            let time_to_train_s = iterations.map(|n| n * summary.iteration_time.as_secs_f64());
            let gpu_hours = time_to_train_s.map(|t| t * choice.gpus as f64 / 3600.0);
            let cost = gpu_hours.zip(options.gpu_hour_price).map(|(h, price)| h * price);
            Ranked { choice, bound, summary, fidelity, over_time_limit, time_to_train_s, gpu_hours, cost }
        })
        .collect();
    Ok(PlanReport {
        enumerated: choices.len() as u64,
        rejected,
        valid: valid.len() as u64,
        screened: screened_count,
        bounded_out,
        failed,
        finals,
        could_beat_final,
        top,
        walls: [estimate_wall, screen_wall, final_wall],
        fidelity,
        keep,
    })
}

/// The final ranking's order of (over budget, score, index): results of the cluster's network
/// model first, since an analytical result kept because its final simulation ran over budget is
/// not comparable with them (the analytical network leaves contention out and is often the
/// faster); then by score, then by enumeration order.
fn final_order(a: (bool, f64, usize), b: (bool, f64, usize)) -> std::cmp::Ordering {
    a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2))
}

/// Whether a simulation gave up at its work budget.
fn over_budget(error: &crate::simulation::SimulationError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = source {
        if matches!(
            error.downcast_ref::<sim_core::network::NetworkError>(),
            Some(sim_core::network::NetworkError::OverBudget { .. })
        ) {
            return true;
        }
        source = error.source();
    }
    false
}

/// `base` with `choice`'s degrees and settings.
fn scenario_of(base: &Scenario, choice: &Choice, fixed: &Fixed) -> Scenario {
    let mut scenario = base.clone();
    scenario.parallelism = choice.parallelism;
    scenario.micro_batch = choice.micro_batch;
    scenario.recompute = choice.recompute;
    scenario.fold_symmetric_ranks = fixed.fold_symmetric_ranks.unwrap_or(true);
    scenario
}

/// A lower bound of a layer collective's time on `scenario`'s cluster: every member must
/// receive at least `(n - 1) / n` of the buffer, and no GPU receives faster than all its links
/// together (inside the server and its NIC).
pub fn comm_floor(scenario: &Scenario) -> impl Fn(&Comm) -> SimDuration + use<> {
    cluster_comm_floor(&scenario.cluster, scenario.parallelism)
}

/// [`comm_floor`] of `parallelism` on `cluster`.
fn cluster_comm_floor(
    cluster: &topology::ClusterSpec,
    p: Parallelism,
) -> impl Fn(&Comm) -> SimDuration + use<> {
    let intra = cluster.intra_node.link().bandwidth.bytes_per_second();
    let intra = match cluster.intra_node {
        topology::IntraNode::NvLinkMesh(_) => {
            intra * f64::from(cluster.gpus_per_node.saturating_sub(1).max(1))
        }
        _ => intra,
    };
    // Fabrics without one terminal link rate: no floor.
    let nic = cluster
        .network
        .fabric
        .terminal_link()
        .map_or(f64::INFINITY, |link| link.bandwidth.bytes_per_second());
    let per_gpu = intra + nic;
    move |comm: &Comm| {
        let n = match comm.group {
            GroupKind::Tensor => p.tensor,
            GroupKind::Expert => p.expert,
            GroupKind::Filter => p.filter,
            GroupKind::Channel => p.channel,
            _ => 1,
        };
        if n <= 1 || !per_gpu.is_finite() || per_gpu <= 0.0 {
            return SimDuration::ZERO;
        }
        let seconds = comm.bytes.0 as f64 * f64::from(n - 1) / f64::from(n) / per_gpu;
        // Rounded down to the microsecond: a floor, not an estimate.
        SimDuration::from_us((seconds * 1e6).floor() as u64)
    }
}

/// Powers of two from 1 to `max` that divide `n`.
fn powers_of_two(max: u64, n: u64) -> Vec<u64> {
    std::iter::successors(Some(1u64), |d| d.checked_mul(2))
        .take_while(|&d| d <= max)
        .filter(|d| n % d == 0)
        .collect()
}

/// Divisors of `n` up to `max`, ascending.
fn divisors(n: u64, max: u64) -> Vec<u64> {
    (1..=max.min(n)).filter(|d| n % d == 0).collect()
}

/// Every configuration of `base`'s GPUs the search tries.
pub fn enumerate(index: usize, base: &Scenario, fixed: &Fixed) -> Vec<Choice> {
    let gpus = u64::from(base.cluster.nodes) * u64::from(base.cluster.gpus_per_node);
    let per_node = u64::from(base.cluster.gpus_per_node);
    let model = &base.model;
    let blocks = model.pipeline_units().len() as u64;
    let sequence = shard::sequence_length(model);
    let transformer = sequence.is_some();
    let one =
        |value: Option<u32>, options: Vec<u64>| -> Vec<u64> { value.map_or(options, |v| vec![u64::from(v)]) };
    let micro_batches = |data: u64| -> Vec<u64> {
        let per_replica = base.global_batch / data.max(1);
        let options: Vec<u64> = if let Some(micro) = fixed.micro_batch {
            vec![micro]
        } else {
            [1u64, 2, 4, 8, 16, 32, 64, 128, 256].into_iter().filter(|&m| m <= per_replica.max(1)).collect()
        };
        options.into_iter().filter(|&m| base.global_batch % (data * m) == 0).collect()
    };
    let recomputes: Vec<Recompute> = match fixed.recompute {
        Some(mode) => vec![mode],
        None if transformer => vec![Recompute::None, Recompute::Selective, Recompute::Full],
        None => vec![Recompute::None],
    };
    let mut out = Vec::new();
    let mut push = |parallelism: Parallelism, micro_batch: u64, recompute: Recompute| {
        out.push(Choice { base: index, gpus, parallelism, micro_batch, recompute });
    };
    let template = base.parallelism;
    if transformer {
        let experts = model
            .layers
            .iter()
            .find_map(|layer| match layer.kind {
                workloads::layer::LayerKind::MoeExperts { experts, .. } => Some(experts),
                _ => None,
            })
            .unwrap_or(1);
        let long = sequence.unwrap_or(0) >= 8192;
        for tensor in one(fixed.tensor, powers_of_two(per_node, gpus)) {
            let sps: Vec<bool> = match fixed.sequence_parallel {
                Some(sp) => vec![sp],
                None if tensor > 1 => vec![true, false],
                None => vec![false],
            };
            for context in one(fixed.context, if long { powers_of_two(8, gpus / tensor) } else { vec![1] }) {
                let rest = gpus / (tensor * context).max(1);
                if tensor * context * rest != gpus {
                    continue;
                }
                for pipeline in one(fixed.pipeline, divisors(rest, blocks.max(1))) {
                    if rest % pipeline != 0 {
                        continue;
                    }
                    let data = rest / pipeline;
                    if fixed.data.is_some_and(|d| u64::from(d) != data) {
                        continue;
                    }
                    let virtuals: Vec<u64> = match fixed.virtual_stages {
                        Some(v) => vec![u64::from(v)],
                        None if pipeline > 1 => [1u64, 2, 3, 4, 6, 8]
                            .into_iter()
                            .filter(|&v| v == 1 || blocks % (pipeline * v) == 0)
                            .collect(),
                        None => vec![1],
                    };
                    let expert_degrees = one(fixed.expert, powers_of_two(experts, data * context));
                    let zeros: Vec<u8> = fixed.zero.map_or(vec![0, 1, 2, 3], |z| vec![z]);
                    for &virtual_stages in &virtuals {
                        for &expert in &expert_degrees {
                            for &zero in &zeros {
                                if zero > 0 && data * context == 1 {
                                    continue;
                                }
                                for &sequence_parallel in &sps {
                                    for micro in micro_batches(data) {
                                        for &recompute in &recomputes {
                                            push(
                                                Parallelism {
                                                    data: data as u32,
                                                    tensor: tensor as u32,
                                                    sequence_parallel,
                                                    pipeline: pipeline as u32,
                                                    virtual_stages: virtual_stages as u32,
                                                    context: context as u32,
                                                    expert: expert as u32,
                                                    zero,
                                                    ..template
                                                },
                                                micro,
                                                recompute,
                                            );
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    } else {
        // CNNs: one of spatial, filter, channel inside a group (or none), times data; or a
        // pipeline times data.
        let spatial_dims = template.spatial_dims;
        let mut splits: Vec<(CnnSplit, u64)> = vec![(CnnSplit::None, 1)];
        for degree in powers_of_two(gpus, gpus).into_iter().filter(|&d| d > 1) {
            for split in [
                (fixed.spatial.is_none_or(|s| u64::from(s) == degree)
                    && fixed.filter.is_none()
                    && fixed.channel.is_none())
                .then_some(CnnSplit::Spatial {
                    degree: degree as u32,
                    dims: spatial_dims,
                    until: None,
                    halos: template.spatial_halos,
                }),
                (fixed.filter.is_none_or(|s| u64::from(s) == degree)
                    && fixed.spatial.is_none()
                    && fixed.channel.is_none())
                .then_some(CnnSplit::Filter { degree: degree as u32, backward: template.filter_backward }),
                (fixed.channel.is_none_or(|s| u64::from(s) == degree)
                    && fixed.spatial.is_none()
                    && fixed.filter.is_none())
                .then_some(CnnSplit::Channel(degree as u32)),
            ]
            .into_iter()
            .flatten()
            {
                splits.push((split, degree));
            }
        }
        if fixed.spatial.is_some() || fixed.filter.is_some() || fixed.channel.is_some() {
            splits.retain(|(split, _)| *split != CnnSplit::None);
        }
        for (split, degree) in splits {
            let rest = gpus / degree;
            let pipelines = if split == CnnSplit::None {
                one(fixed.pipeline, divisors(rest, blocks.max(1)))
            } else {
                vec![1]
            };
            for pipeline in pipelines {
                if rest % pipeline != 0 {
                    continue;
                }
                let data = rest / pipeline;
                if fixed.data.is_some_and(|d| u64::from(d) != data) {
                    continue;
                }
                let (filter, channel, spatial, dims) = match split {
                    CnnSplit::Filter { degree: d, .. } => (d, 1, 1, spatial_dims),
                    CnnSplit::Channel(d) => (1, d, 1, spatial_dims),
                    CnnSplit::Spatial { degree, dims, .. } => (1, 1, degree, dims),
                    CnnSplit::None => (1, 1, 1, spatial_dims),
                };
                for micro in micro_batches(data) {
                    for &recompute in &recomputes {
                        push(
                            Parallelism {
                                data: data as u32,
                                tensor: 1,
                                sequence_parallel: false,
                                pipeline: pipeline as u32,
                                virtual_stages: 1,
                                context: 1,
                                expert: 1,
                                zero: 0,
                                filter,
                                channel,
                                spatial,
                                spatial_dims: dims,
                                ..template
                            },
                            micro,
                            recompute,
                        );
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use super::*;
    use std::path::Path;

    /// Megatron-LM SC'21 Table 1's GPT 1.7B on 16 A100 (two DGX servers), analytical network.
    fn base(extra: &str) -> Scenario {
        let text = format!(
            r#"
[cluster]
nodes = 2
gpus-per-node = 8
device = "a100-sxm4-80gb"
intra-node = {{ kind = "nvswitch", bandwidth = "300 GB/s", latency = "0.7 us" }}
[cluster.network]
topology = "switch"
link-bandwidth = "200 Gb/s"
link-latency = "1 us"
[workload]
model = "megatron-1.7b"
global-batch = 16
micro-batch = 1
precision = "fp16"
optimizer = "adam"
{extra}
[simulation]
fidelity = "analytical"
"#
        );
        let mut scenario = Scenario::parse(&text, Path::new("plan-test.toml")).unwrap();
        scenario.global_batch = 64;
        scenario
    }

    fn options(top: usize) -> PlanOptions {
        PlanOptions {
            objective: Objective::Time,
            top,
            budget: None,
            gpu_hour_price: None,
            memory_headroom: 0.1,
            final_work_budget: None,
        }
    }

    #[test]
    fn the_bounded_search_finds_the_same_best_configurations_as_simulating_every_one() {
        let base = base("");
        let fixed = Fixed { recompute: Some(Recompute::Selective), zero: Some(1), ..Fixed::default() };
        let report = plan(std::slice::from_ref(&base), &fixed, &options(3)).unwrap();
        assert!(report.bounded_out > 0, "the bound skipped nothing: {} screened", report.screened);
        // Every valid configuration simulated.
        let mut all: Vec<(f64, String)> = enumerate(0, &base, &fixed)
            .iter()
            .filter_map(|choice| {
                let scenario = scenario_of(&base, choice, &fixed);
                let estimate = scenario.strategy().estimate(&comm_floor(&scenario)).ok()?;
                if estimate.peak_memory().total().0 as f64 > 0.9 * scenario.device.memory_capacity.0 as f64 {
                    return None;
                }
                let summary = simulate(&scenario).unwrap().summary;
                let time = summary.iteration_time;
                assert!(
                    estimate.time_lower_bound <= time,
                    "{}: bound {} above the simulated {time}",
                    choice.label(),
                    estimate.time_lower_bound
                );
                Some((time.as_secs_f64(), choice.label()))
            })
            .collect();
        assert_eq!(all.len() as u64, report.valid);
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        let exhaustive: Vec<f64> = all.iter().take(3).map(|(t, _)| *t).collect();
        let searched: Vec<f64> = report.top.iter().map(|r| r.summary.iteration_time.as_secs_f64()).collect();
        assert_eq!(searched, exhaustive, "exhaustive order: {:?}", &all[..3]);
    }

    #[test]
    fn fixed_settings_are_not_searched_and_an_impossible_one_leaves_nothing() {
        let base = base("");
        let fixed = Fixed { tensor: Some(4), micro_batch: Some(2), ..Fixed::default() };
        let choices = enumerate(0, &base, &fixed);
        assert!(!choices.is_empty());
        assert!(choices.iter().all(|c| c.parallelism.tensor == 4 && c.micro_batch == 2));
        // Data 3 does not divide 16 GPUs.
        let fixed = Fixed { data: Some(3), ..Fixed::default() };
        assert!(matches!(plan(&[base], &fixed, &options(3)), Err(PlanError::Empty(_))));
    }

    #[test]
    fn cnns_search_their_own_strategies() {
        let mut scenario = base("");
        scenario.model = workloads::zoo::by_name("resnet50").unwrap();
        scenario.global_batch = 256;
        let choices = enumerate(0, &scenario, &Fixed::default());
        for wanted in ["spatial", "filter", "channel"] {
            assert!(choices.iter().any(|c| c.label().contains(wanted)), "no {wanted} configuration");
        }
        assert!(choices.iter().any(|c| c.parallelism.pipeline > 1), "no pipeline configuration");
        assert!(choices.iter().all(|c| c.parallelism.tensor == 1 && c.parallelism.zero == 0));
        let report = plan(&[scenario], &Fixed::default(), &options(2)).unwrap();
        assert_eq!(report.top.len(), 2);
    }

    #[test]
    fn a_final_over_its_work_budget_keeps_its_screen_result_and_ranks_after_the_finished() {
        let mut flow = base("");
        flow.network.fidelity = sim_core::fidelity::Fidelity::Flow;
        let fixed = Fixed { recompute: Some(Recompute::Selective), zero: Some(1), ..Fixed::default() };
        let unlimited = plan(std::slice::from_ref(&flow), &fixed, &options(4)).unwrap();
        assert!(unlimited.top.iter().all(|r| !r.over_time_limit && r.fidelity == Fidelity::Flow));
        assert!(unlimited.could_beat_final <= unlimited.valid - unlimited.finals);
        // Simulating every valid configuration with flow leaves none unchecked.
        let everything = options(unlimited.valid as usize);
        let exhaustive = plan(std::slice::from_ref(&flow), &fixed, &everything).unwrap();
        assert_eq!(exhaustive.finals, exhaustive.valid);
        assert_eq!(exhaustive.could_beat_final, 0);
        // No budget at all: every final gives up and keeps its analytical result, in the
        // screen's order.
        let starved = PlanOptions { final_work_budget: Some(0), ..options(4) };
        let report = plan(std::slice::from_ref(&flow), &fixed, &starved).unwrap();
        assert!(report.top.iter().all(|r| r.over_time_limit && r.fidelity == Fidelity::Analytical));
        assert_eq!(report.could_beat_final, 0, "no final finished: no winner to beat");
        let times: Vec<_> = report.top.iter().map(|r| r.summary.iteration_time).collect();
        assert!(times.windows(2).all(|pair| pair[0] <= pair[1]), "{times:?}");
        // The same budget gives the same answer however often it runs.
        let again = plan(std::slice::from_ref(&flow), &fixed, &starved).unwrap();
        let labels = |r: &PlanReport| r.top.iter().map(|t| t.choice.label()).collect::<Vec<_>>();
        assert_eq!(labels(&report), labels(&again));
    }

    #[test]
    fn finished_finals_rank_before_those_over_budget_whatever_their_score() {
        let mut rows = [(true, 1.0, 0), (false, 3.0, 1), (false, 2.0, 2), (true, 0.5, 3)];
        rows.sort_by(|a, b| final_order(*a, *b));
        assert_eq!(rows.map(|r| r.2), [2, 1, 3, 0]);
    }
}
