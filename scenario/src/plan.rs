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
//! Degrees a user fixes (`--set parallelism.tensor=8`) are not enumerated. Every configuration
//! is a scenario built through the override path ([`Search::scenario`]), validated as a file
//! saying the same would be.

use sim_core::lookup::{LookupMap, LookupSet};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::Serialize;
use sim_core::fidelity::Fidelity;
use sim_core::units::SimDuration;

use crate::file::node_groups::StagePlacement;
use crate::simulation::{RunLimit, SharedRuns, Summary, simulate, simulate_within_limit};
use crate::{Override, OverrideError, Scenario, ScenarioError, ValidationCache, apply, get_dotted};
use std::sync::{Mutex, MutexGuard};
use strategies::{
    CnnSplit, Comm, GroupKind, LayerTables, Offload, Parallelism, SpatialDims, Strategy, StrategyError, shard,
};
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
    /// The most configurations the final stage checks (`--final-max`): it takes the best
    /// `keep` screened, then, in order of their floor, every configuration whose floor is below
    /// the winner's result, until none is left (the stop is then exact) or this many were
    /// checked (at least `keep`). `None`: no limit.
    pub final_max: Option<usize>,
}

/// The flow model's work (`sim_core::flow::FlowStats::work`) per second of wall time, measured
/// on the 2-core development VM (docs/plan.md): converts `--final-time-limit`'s seconds into
/// [`PlanOptions::final_work_budget`].
pub const FLOW_WORK_PER_SECOND: u64 = 20_000_000;

/// Degrees and settings the user fixed (read from the validated scenario): those are not
/// enumerated.
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
    /// `parallelism.schedule`.
    pub schedule: Option<strategies::PipelineSchedule>,
    /// `parallelism.moe-dispatcher`.
    pub moe_dispatcher: Option<strategies::MoeDispatcher>,
    /// `parallelism.moe-overlap`.
    pub moe_overlap: Option<bool>,
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
    /// `parallelism.spatial-dims`.
    pub spatial_dims: Option<SpatialDims>,
    /// `parallelism.spatial-until`: the layer's name (each spatial configuration's validation
    /// checks it).
    pub spatial_until: Option<String>,
    /// `workload.offload`.
    pub offload: Option<Offload>,
    /// `workload.micro-batch`.
    pub micro_batch: Option<u64>,
    /// `workload.recompute`.
    pub recompute: Option<Recompute>,
    /// `simulation.fold-symmetric-ranks`.
    pub fold_symmetric_ranks: Option<bool>,
    /// `parallelism.stage-placement` (node groups of mixed devices).
    pub stage_placement: Option<StagePlacement>,
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
    /// The cluster file has no `[cluster]`.
    #[error("{file}: has no [cluster] table: give a scenario or cluster file (see scenarios/)")]
    NoCluster {
        /// The cluster file.
        file: PathBuf,
    },
    /// A GPU count other than the node groups' own: the groups fix the cluster's size.
    #[error(
        "--gpus {gpus}: {file}: key `cluster.node-groups`: the groups hold {total} GPUs ({groups}), and plan searches node groups at their own size: give --gpus {total} or leave --gpus out"
    )]
    NodeGroupGpus {
        /// The cluster file.
        file: PathBuf,
        /// The GPU count asked for.
        gpus: u64,
        /// The groups' GPUs.
        total: u64,
        /// The groups' GPUs, one term each (`8 + 8`).
        groups: String,
    },
    /// `parallelism.stage-placement` fixed with a value the cluster cannot take.
    #[error("--set parallelism.stage-placement={value}: {file}: key `parallelism.stage-placement` {message}")]
    StagePlacement {
        /// The cluster file.
        file: PathBuf,
        /// The value given.
        value: String,
        /// What is wrong and what is valid.
        message: String,
    },
    /// Neither the settings nor the cluster file name a model.
    #[error("no model: give --model NAME (`parasim models` lists the zoo) or a [workload] model in {file}")]
    NoModel {
        /// The cluster file.
        file: PathBuf,
    },
    /// Neither the settings nor the cluster file give a global batch.
    #[error(
        "no global batch: give --global-batch B (samples per iteration over all replicas) or workload.global-batch in {file}"
    )]
    NoGlobalBatch {
        /// The cluster file.
        file: PathBuf,
    },
    /// The global batch is not a positive integer.
    #[error("{file}: workload.global-batch is {value}; give a positive integer")]
    GlobalBatch {
        /// The cluster file.
        file: PathBuf,
        /// The value given.
        value: String,
    },
    /// A GPU count that is not whole nodes.
    #[error("--gpus {gpus}: must be a positive multiple of the cluster's {per_node} GPUs per node")]
    Gpus {
        /// The GPU count asked for.
        gpus: u64,
        /// The cluster's GPUs per node.
        per_node: u64,
    },
    /// An override does not apply to the cluster file's table.
    #[error(transparent)]
    Override(#[from] OverrideError),
    /// The scenario of a GPU count is not valid.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
}

/// Degrees plan chooses, in `[parallelism]`: a cluster file's are ignored.
const CHOSEN_PARALLELISM: [&str; 14] = [
    "data",
    "tensor",
    "sequence-parallel",
    "pipeline",
    "virtual-stages",
    "context",
    "expert",
    "zero",
    "filter",
    "channel",
    "spatial",
    "spatial-dims",
    "spatial-until",
    "stage-placement",
];

/// Settings of `[workload]` plan chooses (or that would fix the batch per device): a cluster
/// file's are ignored.
const CHOSEN_WORKLOAD: [&str; 4] = ["micro-batch", "recompute", "batch-per-device", "offload"];

/// The scenario every configuration of one GPU count is built from.
#[derive(Debug, Clone)]
pub struct Base {
    /// GPUs.
    pub gpus: u64,
    /// The validated scenario of this GPU count: the cluster at this size, the model, its
    /// precision and compute model, the settings of `[parallelism]` plan does not choose. It
    /// is validated with a batch every degree divides (one sample per micro-batch per rank):
    /// each configuration gives its own micro-batch with the search's global batch.
    pub scenario: Scenario,
    /// The table it was validated from, without that batch: each configuration's overrides
    /// apply to it.
    table: toml::Table,
}

/// A search: a cluster file with the user's settings, one [`Base`] per GPU count, and the
/// settings the user fixed. Every configuration is a scenario built through the override
/// path ([`Search::scenario`]): its base's table with the configuration's degrees and
/// settings as [`Override`]s, validated as a file that says the same would be, with one
/// [`ValidationCache`] for the whole search (the configurations share their cluster, model
/// and compute model).
#[derive(Debug)]
pub struct Search {
    /// One per GPU count, in the order asked.
    pub bases: Vec<Base>,
    /// Samples per iteration over all replicas: every configuration's
    /// `workload.global-batch`.
    pub global_batch: u64,
    /// The settings the user fixed, read from the validated scenario.
    pub fixed: Fixed,
    /// The keys the user fixed, in order.
    pub fixed_keys: Vec<String>,
    /// The keys of the cluster file that plan chooses, so ignores (`parallelism.tensor`,
    /// `workload.micro-batch`...), unless the user fixed them.
    pub ignored: Vec<String>,
    /// The cluster file: names it in messages and anchors the paths in it.
    file: PathBuf,
    cache: ValidationCache,
    /// The cluster has node groups of more than one device (`[[cluster.node-groups]]`): each
    /// configuration says its `parallelism.stage-placement`, and the symmetric ranks are not
    /// folded (a mixed cluster simulates every rank).
    mixed: bool,
}

impl Search {
    /// The search of cluster file `source` (its table; `file` names it and anchors the paths
    /// in it): its `[cluster]`, `[compute]` and `[simulation]`, its `[workload]` and
    /// `[parallelism]` but for what plan chooses, then `settings` (the model, the batch, the
    /// precision...) and `fixed` (keys not to search) applied in that order, on each of `gpus`
    /// GPUs (none: the cluster's own). Without a precision anywhere, bf16 where the device has
    /// it, else fp16.
    pub fn new(
        source: &toml::Table,
        file: &Path,
        settings: &[Override],
        fixed: &[Override],
        gpus: &[u64],
    ) -> Result<Search, PlanError> {
        if !source.contains_key("cluster") {
            return Err(PlanError::NoCluster { file: file.to_path_buf() });
        }
        // The stage placement applies to a pipeline, which the base (validated on one stage)
        // has not got: it is read here and set on each configuration.
        let (placement, fixed): (Vec<&Override>, Vec<&Override>) =
            fixed.iter().partition(|change| change.key == "parallelism.stage-placement");
        // So does the end of a spatial split, which applies to a spatial split only: each
        // spatial configuration says it (and its validation checks the name).
        let (until, fixed): (Vec<&Override>, Vec<&Override>) =
            fixed.into_iter().partition(|change| change.key == "parallelism.spatial-until");
        let fixed: Vec<Override> = fixed.into_iter().cloned().collect();
        let fixed = fixed.as_slice();
        let mut table = toml::Table::new();
        for key in ["cluster", "compute", "simulation"] {
            if let Some(value) = source.get(key) {
                table.insert(key.into(), value.clone());
            }
        }
        let mut ignored = Vec::new();
        for (section, chosen) in
            [("workload", &CHOSEN_WORKLOAD[..]), ("parallelism", &CHOSEN_PARALLELISM[..])]
        {
            let mut kept = toml::Table::new();
            if let Some(toml::Value::Table(given)) = source.get(section) {
                for (key, value) in given {
                    if chosen.contains(&key.as_str()) {
                        ignored.push(format!("{section}.{key}"));
                    } else {
                        kept.insert(key.clone(), value.clone());
                    }
                }
            }
            table.insert(section.into(), kept.into());
        }
        apply(&mut table, settings)?;
        apply(&mut table, fixed)?;
        if get_dotted(&table, "workload.model").is_none() {
            return Err(PlanError::NoModel { file: file.to_path_buf() });
        }
        let global_batch = match get_dotted(&table, "workload.global-batch") {
            Some(toml::Value::Integer(n)) if *n >= 1 => *n as u64,
            Some(other) => {
                return Err(PlanError::GlobalBatch { file: file.to_path_buf(), value: other.to_string() });
            }
            None => return Err(PlanError::NoGlobalBatch { file: file.to_path_buf() }),
        };
        let mut fixed_keys: Vec<String> = fixed.iter().map(|change| change.key.clone()).collect();
        fixed_keys.extend(placement.iter().map(|change| change.key.clone()));
        fixed_keys.extend(until.iter().map(|change| change.key.clone()));
        ignored.retain(|key| !fixed_keys.contains(key));
        // A key's value, else the scenario format's default.
        let defaults = crate::numeric_defaults();
        let positive = |key: &str| match get_dotted(&table, key).or_else(|| get_dotted(&defaults, key)) {
            Some(toml::Value::Integer(n)) if *n >= 1 => Some(*n as u64),
            _ => None,
        };
        let per_node = positive("cluster.gpus-per-node").unwrap_or(1);
        let own = positive("cluster.nodes").unwrap_or(1).saturating_mul(per_node);
        let gpus = match gpus {
            [] => vec![own],
            given => given.to_vec(),
        };
        // Node groups fix the cluster's size: their nodes add up to cluster.nodes.
        if let Some(toml::Value::Array(groups)) = get_dotted(&table, "cluster.node-groups")
            && let Some(&other) = gpus.iter().find(|&&gpus| gpus != own)
        {
            let nodes = |group: &toml::Value| group.get("nodes").and_then(toml::Value::as_integer);
            return Err(PlanError::NodeGroupGpus {
                file: file.to_path_buf(),
                gpus: other,
                total: own,
                groups: groups
                    .iter()
                    .map(|group| {
                        nodes(group)
                            .and_then(|n| u64::try_from(n).ok())
                            .map_or("?".into(), |n| n.saturating_mul(per_node).to_string())
                    })
                    .collect::<Vec<_>>()
                    .join(" + "),
            });
        }
        let micro = positive("workload.micro-batch");
        let mut search = Search {
            bases: Vec::new(),
            global_batch,
            fixed: Fixed::default(),
            fixed_keys,
            ignored,
            file: file.to_path_buf(),
            cache: ValidationCache::default(),
            mixed: false,
        };
        for gpus in gpus {
            if gpus == 0 || gpus % per_node != 0 {
                return Err(PlanError::Gpus { gpus, per_node });
            }
            let mut table = table.clone();
            Override::integer("cluster.nodes", gpus / per_node)?.apply(&mut table)?;
            // A batch every degree divides: one sample per micro-batch (the fixed one, else 1)
            // per rank.
            let mut batch =
                vec![Override::integer("workload.global-batch", gpus.saturating_mul(micro.unwrap_or(1)))?];
            if get_dotted(&table, "workload.micro-batch").is_none() {
                batch.push(Override::integer("workload.micro-batch", 1)?);
            }
            let scenario = if get_dotted(&table, "workload.precision").is_some() {
                search.validate(&table, &batch, fixed)?
            } else {
                // Not set anywhere: bf16, or fp16 on devices without it (on node groups, where
                // any group's device lacks it: that group's `device` key is named).
                Override::new("workload.precision", "bf16").apply(&mut table)?;
                let refuses_precision = |error: &ScenarioError| match error.key() {
                    Some("workload.precision") => true,
                    Some(key) => {
                        key.starts_with("cluster.node-groups[")
                            && error.to_string().contains("cannot run workload.precision")
                    }
                    None => false,
                };
                match search.validate(&table, &batch, fixed) {
                    Err(error) if refuses_precision(&error) => {
                        Override::new("workload.precision", "fp16").apply(&mut table)?;
                        search.validate(&table, &batch, fixed)?
                    }
                    other => other?,
                }
            };
            search.bases.push(Base { gpus, scenario, table });
        }
        search.fixed = search.bases.first().map(|base| fixed_of(&base.scenario, fixed)).unwrap_or_default();
        search.mixed = search
            .bases
            .first()
            .and_then(|base| base.scenario.node_groups.as_deref())
            .is_some_and(|groups| groups.is_mixed());
        if let Some(change) = until.last() {
            search.fixed.spatial_until = Some(match &change.value {
                toml::Value::String(text) => text.clone(),
                other => other.to_string(),
            });
        }
        if let Some(change) = placement.last() {
            let text = match &change.value {
                toml::Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            let error = |message: String| PlanError::StagePlacement {
                file: file.to_path_buf(),
                value: text.clone(),
                message,
            };
            let value: StagePlacement = text.parse().map_err(error)?;
            if value == StagePlacement::BySpeed && !search.mixed {
                return Err(error(
                    "is \"by-speed\", but the cluster has one device type: give [[cluster.node-groups]] of different devices, or leave the key out".into(),
                ));
            }
            search.fixed.stage_placement = Some(value);
        }
        Ok(search)
    }

    /// `table` (the user's fixed keys applied) with `batch`, validated; an error at a key the
    /// user fixed names the key's override.
    fn validate(
        &self,
        table: &toml::Table,
        batch: &[Override],
        fixed: &[Override],
    ) -> Result<Scenario, ScenarioError> {
        Scenario::from_table_with(table, batch, &self.file, &self.cache).map_err(|error| match error {
            ScenarioError::Overridden { .. } => error,
            other => other.attributed(fixed),
        })
    }

    /// The overrides that make `choice` of its base: its degrees, micro-batch and
    /// recomputation, the search's global batch, and the symmetric ranks folded unless the
    /// user said otherwise.
    pub fn overrides(&self, choice: &Choice) -> Vec<Override> {
        let p = &choice.parallelism;
        let integer = |key: &str, value: u32| Override::new(key, i64::from(value));
        let mut overrides = vec![
            Override::new("workload.global-batch", i64::try_from(self.global_batch).unwrap_or(i64::MAX)),
            Override::new("workload.micro-batch", i64::try_from(choice.micro_batch).unwrap_or(i64::MAX)),
            Override::new("workload.recompute", choice.recompute.to_string()),
            integer("parallelism.data", p.data),
            integer("parallelism.tensor", p.tensor),
            Override::new("parallelism.sequence-parallel", p.sequence_parallel),
            integer("parallelism.pipeline", p.pipeline),
            integer("parallelism.virtual-stages", p.virtual_stages),
            Override::new("parallelism.schedule", p.schedule.name().to_string()),
            Override::new("parallelism.moe-dispatcher", p.moe_dispatcher.name().to_string()),
            Override::new("parallelism.moe-overlap", p.moe_overlap),
            integer("parallelism.context", p.context),
            integer("parallelism.expert", p.expert),
            Override::new("parallelism.zero", i64::from(p.zero)),
            integer("parallelism.filter", p.filter),
            integer("parallelism.channel", p.channel),
            integer("parallelism.spatial", p.spatial),
        ];
        // The spatial split's settings and out-of-core training where they apply (the keys'
        // defaults otherwise, as the base table leaves them out).
        if p.spatial > 1 {
            overrides.push(Override::new("parallelism.spatial-dims", p.spatial_dims.name()));
        }
        if let Some(name) = &choice.spatial_until {
            overrides.push(Override::new("parallelism.spatial-until", name.clone()));
        }
        if p.offload != Offload::None {
            overrides.push(Override::new("workload.offload", p.offload.name()));
        }
        if let Some(placement) = choice.stage_placement {
            overrides.push(Override::new("parallelism.stage-placement", placement.name()));
        }
        // A cluster of mixed devices simulates every rank (the key is refused there).
        match (self.fixed.fold_symmetric_ranks, self.mixed) {
            (Some(fold), _) => overrides.push(Override::new("simulation.fold-symmetric-ranks", fold)),
            (None, false) => overrides.push(Override::new("simulation.fold-symmetric-ranks", true)),
            (None, true) => {}
        }
        overrides
    }

    /// The validated scenario of `choice`: its base's table with [`Search::overrides`] and
    /// then `extra` (`simulation.fidelity = "analytical"` for the screen) applied.
    pub fn scenario(&self, choice: &Choice, extra: &[Override]) -> Result<Scenario, ScenarioError> {
        let table = || -> Result<toml::Table, ScenarioError> {
            let mut table = self.bases[choice.base].table.clone();
            apply(&mut table, &self.overrides(choice))?;
            apply(&mut table, extra)?;
            Ok(table)
        };
        let scenario = match Scenario::from_valid_table(table()?, &self.file, &self.cache) {
            Some(scenario) => scenario?,
            // Not the scenario format: the table again, for the error naming the key.
            None => Scenario::from_table_cached(&table()?, &self.file, &self.cache)?,
        };
        // A framework's CNN defaults (`parallelism.filter-backward`, `cnn-transport`: ChainerMN's
        // alltoall) apply to splits above 1 only, so the base (no split) does not carry them:
        // the validated scenario's are the ones that run.
        debug_assert_eq!(
            scenario.parallelism,
            Parallelism {
                filter_backward: scenario.parallelism.filter_backward,
                cnn_staging: scenario.parallelism.cnn_staging,
                ..choice.parallelism
            },
            "{}",
            choice.label()
        );
        Ok(scenario)
    }
}

/// The settings of `fixed` (the keys the user fixed), read from `scenario`, validated with
/// them.
fn fixed_of(scenario: &Scenario, fixed: &[Override]) -> Fixed {
    let mut out = Fixed::default();
    let p = &scenario.parallelism;
    for change in fixed {
        match change.key.as_str() {
            "parallelism.tensor" => out.tensor = Some(p.tensor),
            "parallelism.sequence-parallel" => out.sequence_parallel = Some(p.sequence_parallel),
            "parallelism.pipeline" => out.pipeline = Some(p.pipeline),
            "parallelism.virtual-stages" => out.virtual_stages = Some(p.virtual_stages),
            "parallelism.schedule" => out.schedule = Some(p.schedule),
            "parallelism.moe-dispatcher" => out.moe_dispatcher = Some(p.moe_dispatcher),
            "parallelism.moe-overlap" => out.moe_overlap = Some(p.moe_overlap),
            "parallelism.context" => out.context = Some(p.context),
            "parallelism.expert" => out.expert = Some(p.expert),
            "parallelism.zero" => out.zero = Some(p.zero),
            "parallelism.data" => out.data = Some(p.data),
            "parallelism.filter" => out.filter = Some(p.filter),
            "parallelism.channel" => out.channel = Some(p.channel),
            "parallelism.spatial" => out.spatial = Some(p.spatial),
            "parallelism.spatial-dims" => out.spatial_dims = Some(p.spatial_dims),
            "workload.offload" => out.offload = Some(p.offload),
            "workload.micro-batch" => out.micro_batch = Some(scenario.micro_batch),
            "workload.recompute" => out.recompute = Some(scenario.recompute),
            "simulation.fold-symmetric-ranks" => {
                out.fold_symmetric_ranks = Some(scenario.fold_symmetric_ranks)
            }
            _ => {}
        }
    }
    out
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
    /// The last layer of the spatial split (`parallelism.spatial-until`), by name; its index
    /// is `parallelism.spatial_until`. `None`: the split runs to the first non-spatial layer.
    pub spatial_until: Option<String>,
    /// How pipeline stages get their layers on node groups of mixed devices
    /// (`parallelism.stage-placement`); `None` on a cluster of one device type.
    pub stage_placement: Option<StagePlacement>,
}

impl Choice {
    /// `"t8 sp p16 v2 d8 zero1 mb1 selective"`: the degrees above 1 and the settings (a
    /// spatial split's dimensions other than rows and its last layer: `"spatial4 dhw
    /// until:APOOL_2 d4 mb1"`; out-of-core training: `"d4 mb4 offload:activations"`).
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
            if name == "spatial" && degree > 1 {
                if p.spatial_dims != SpatialDims::H {
                    parts.push(p.spatial_dims.name().into());
                }
                if let Some(until) = &self.spatial_until {
                    parts.push(format!("until:{until}"));
                }
            }
            if name == "t" && p.sequence_parallel {
                parts.push("sp".into());
            }
        }
        if p.pipeline > 1 && p.schedule.two_chunks() {
            parts.push(p.schedule.name().into());
        }
        if self.stage_placement == Some(StagePlacement::BySpeed) {
            parts.push(StagePlacement::BySpeed.name().into());
        }
        if p.expert > 1 && p.moe_dispatcher != strategies::MoeDispatcher::AllToAll {
            parts.push(p.moe_dispatcher.name().into());
        }
        if p.moe_overlap {
            parts.push("a2a-overlap".into());
        }
        parts.push(format!("d{}", p.data));
        if p.zero > 0 {
            parts.push(format!("zero{}", p.zero));
        }
        parts.push(format!("mb{}", self.micro_batch));
        if self.recompute != Recompute::None {
            parts.push(self.recompute.to_string());
        }
        if p.offload != Offload::None {
            parts.push(format!("offload:{}", p.offload.name()));
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
    /// Of [`PlanReport::could_beat_final`], those whose final simulation ran over
    /// [`PlanOptions::final_work_budget`] (`--final-time-limit`); the rest were not among the
    /// `keep` best screened the final stage takes (`--top`).
    pub could_beat_over_limit: u64,
    /// Final simulations that ran over [`PlanOptions::final_work_budget`].
    pub finals_over_limit: u64,
    /// Of [`PlanReport::finals`], those given up part way (`simulate_within`): their time was
    /// certain to be above the `top`-th best final result before their batch, so they could
    /// not be listed, let alone win.
    pub finals_stopped: u64,
    /// Configurations the final stage took in floor order whose analytical score (the screen
    /// skipped them, so it ran them then) was not below the winner: they cannot win.
    pub final_pruned: u64,
    /// When the final stage stopped at [`PlanOptions::final_max`] with configurations left
    /// that could still beat the winner: the lowest of their floors (in the objective's
    /// score). `None` when the stop is exact.
    pub left_best_floor: Option<f64>,
    /// The best configurations, best first.
    pub top: Vec<Ranked>,
    /// Wall time of enumeration and estimates, of the screen and of the final simulations.
    pub walls: [Duration; 3],
    /// The cluster's network model.
    pub fidelity: Fidelity,
    /// How many of the best screened configurations the bound protects and the final
    /// simulations take.
    pub keep: usize,
    /// Nothing fit in device memory, so out-of-core training (`workload.offload`) was searched
    /// too, and some of it fits.
    pub out_of_core: bool,
    /// ... and the cluster names its CPUs (`cluster.host-cpu`), so ZeRO-Offload's host
    /// optimizer was among the out-of-core modes tried.
    pub host_optimizer: bool,
}

/// Configurations screened per batch: fixed, so the result does not depend on the threads.
const BATCH: usize = 8;

/// Where a search is, for a progress display: its stage, how many of the stage's items are
/// done out of how many, and a note (the best so far, the limit that applies).
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// `estimates`, `screen` or `final`.
    pub stage: &'static str,
    /// What the stage counts: `configurations`, or `flow simulations` (the final model's).
    pub unit: &'a str,
    /// Done so far.
    pub done: u64,
    /// In the stage: every configuration for the estimates, every valid one for the screen
    /// (which stops earlier when no bound can beat the `keep`-th best), the `keep` best for
    /// the final.
    pub total: u64,
    /// What a reader wants beside the counts.
    pub note: &'a str,
}

/// Searches the configurations of `search` (one base per GPU count, the fixed settings),
/// ranked by `options.objective`.
pub fn plan(search: &Search, options: &PlanOptions) -> Result<PlanReport, PlanError> {
    plan_with_progress(search, options, &|_| {})
}

/// [`plan`], telling `progress` where it is (each estimate, each screened batch, each final
/// simulation), for a progress display.
pub fn plan_with_progress(
    search: &Search,
    options: &PlanOptions,
    progress: &(dyn Fn(Step<'_>) + Sync),
) -> Result<PlanReport, PlanError> {
    let bases = &search.bases;
    if bases.is_empty() {
        return Err(PlanError::NoGpus);
    }
    let started = Instant::now();
    let mut choices: Vec<Choice> = bases
        .iter()
        .enumerate()
        .flat_map(|(index, base)| enumerate(index, base, search.global_batch, &search.fixed))
        .collect();
    if choices.is_empty() {
        let gpus: Vec<String> = bases.iter().map(|b| b.gpus.to_string()).collect();
        return Err(PlanError::Empty(format!(
            "no configuration to try on {} GPUs: the degrees must multiply to the GPU count, and data x \
             micro-batch must divide the global batch ({}); check the fixed settings and the batch",
            gpus.join(" or "),
            search.global_batch
        )));
    }
    // Configurations with the same split, micro-batch and precision share their local layers
    // and kernel times.
    // (Every configuration shares its base's model, device and compute model: one validation
    // cache.)
    let tables: Vec<LayerTables<'_>> = bases
        .iter()
        .map(|base| LayerTables::new(&base.scenario.model, &base.scenario.device, &base.scenario.compute))
        .collect();
    let estimated = AtomicU64::new(0);
    let step = |stage, unit, done, total, note: &str| progress(Step { stage, unit, done, total, note });
    step("estimates", "configurations", 0, choices.len() as u64, "");
    // With `precheck`, a configuration whose memory floor does not fit is refused before its
    // estimate, without the message (`MEMORY_PENDING`): only a reason's example needs it.
    let estimate_with = |choice: &Choice, precheck: bool| -> Result<SimDuration, (String, String)> {
        let scenario = search.scenario(choice, &[]).map_err(|error| match error {
            ScenarioError::Invalid { key, message, .. } => (key.clone(), format!("{key}: {message}")),
            other => ("other".to_string(), other.to_string()),
        })?;
        let strategy = Strategy { layer_tables: Some(&tables[choice.base]), ..scenario.strategy() };
        let floor = comm_floor(&scenario);
        let mixed = scenario.node_groups.as_deref().filter(|groups| groups.is_mixed());
        // Validating the scenario checked its strategy.
        // What the memory check below refuses: above `(1 - headroom)` of the device's
        // capacity.
        let usable = |device: &workloads::device::Device| {
            device.memory_capacity.0 as f64 * (1.0 - options.memory_headroom)
        };
        let estimate = match mixed {
            Some(groups) => crate::mixed::estimate(&scenario, groups, &strategy, &floor),
            None if precheck => {
                // A floor above the usable memory: the estimate's own memory is too.
                let fits = |floor: sim_core::units::Bytes| floor.0 as f64 <= usable(&scenario.device);
                match strategy.estimate_checked_fitting(&floor, &fits) {
                    Ok(None) => return Err((MEMORY.to_string(), MEMORY_PENDING.to_string())),
                    Ok(Some(estimate)) => Ok(estimate),
                    Err(error) => Err(error),
                }
            }
            None => strategy.estimate_checked(&floor),
        }
        .map_err(|error| match error {
            StrategyError::Invalid { key, message } => (key.to_string(), format!("{key}: {message}")),
            other => ("other".to_string(), other.to_string()),
        })?;
        // Each group's GPUs against their own device's memory (the cluster's one device's
        // without node groups of mixed devices).
        let needs: Vec<(workloads::memory::MemoryBreakdown, &workloads::device::Device, String)> = match mixed
        {
            Some(groups) => crate::mixed::group_memory(&scenario, groups, &estimate.stages)
                .into_iter()
                .zip(groups.groups.iter().enumerate())
                .map(|(memory, (index, group))| {
                    let on = format!(" on cluster.node-groups[{index}] ({})", group.device.name);
                    (memory, &*group.device, on)
                })
                .collect(),
            None => vec![(estimate.peak_memory(), &*scenario.device, String::new())],
        };
        for (memory, device, on) in needs {
            let memory = memory.total().0 as f64;
            let capacity = device.memory_capacity.0 as f64;
            if memory > usable(device) {
                return Err((
                    MEMORY.to_string(),
                    format!(
                        "needs {:.1} GB per GPU{on}; {:.1} GB usable of {:.1} GB",
                        memory / 1e9,
                        usable(device) / 1e9,
                        capacity / 1e9
                    ),
                ));
            }
        }
        Ok(estimate.time_lower_bound)
    };
    let estimate_one = |choice: &Choice, total: u64| -> Result<SimDuration, (String, String)> {
        let done = estimated.fetch_add(1, AtomicOrdering::Relaxed) + 1;
        step("estimates", "configurations", done, total, "");
        estimate_with(choice, true)
    };
    let total = choices.len() as u64;
    let mut estimates: Vec<Result<SimDuration, (String, String)>> =
        choices.par_iter().map(|choice| estimate_one(choice, total)).collect();
    // Nothing fits in device memory and offloading was not chosen: out-of-core training too
    // (`workload.offload`: both activation modes, on each configuration tried without
    // recomputation or ZeRO, which they do not model; with the cluster's CPUs named, ZeRO-Offload's
    // host optimizer too, with ZeRO and, without the activations' offload, recomputation, and
    // under ZeRO-3 ZeRO-Infinity's offload of the weights' shards).
    let too_big = |estimate: &Result<SimDuration, (String, String)>| matches!(estimate, Err((reason, _)) if reason == MEMORY);
    let mut out_of_core = false;
    let host_optimizer = bases.iter().all(|base| base.scenario.host_cpu.is_some());
    // LoRA takes no offload (the scenario refuses it).
    let lora = bases.iter().any(|base| base.scenario.model.has_frozen_layers());
    if search.fixed.offload.is_none()
        && !lora
        && estimates.iter().all(Result::is_err)
        && estimates.iter().any(too_big)
    {
        let tried: LookupSet<String> = choices.iter().map(Choice::label).collect();
        let mut extra = Vec::new();
        // ZeRO-Offload's host optimizer where the cluster names its CPUs (`cluster.host-cpu`).
        let modes: &[Offload] = if host_optimizer {
            &[
                Offload::Activations,
                Offload::ActivationsAndWeights,
                Offload::Optimizer,
                Offload::ActivationsAndOptimizer,
                Offload::OptimizerAndParameters,
                Offload::ActivationsOptimizerAndParameters,
            ]
        } else {
            &[Offload::Activations, Offload::ActivationsAndWeights]
        };
        for &offload in modes {
            for choice in &choices {
                let p = &choice.parallelism;
                // A host optimizer takes recomputation (without the activations' offload) and
                // ZeRO (the weights' shards offloaded: ZeRO-3 only); the others neither.
                let recompute_ok = !offload.activations() || choice.recompute == Recompute::None;
                let zero_ok = if offload.parameters() {
                    p.zero == 3
                } else if offload.host_optimizer() {
                    true
                } else {
                    p.zero == 0
                };
                if !recompute_ok || !zero_ok || p.offload != Offload::None {
                    continue;
                }
                let variant = Choice { parallelism: Parallelism { offload, ..*p }, ..choice.clone() };
                if !tried.contains(&variant.label()) {
                    extra.push(variant);
                }
            }
        }
        let total = total + extra.len() as u64;
        let more: Vec<_> = extra.par_iter().map(|choice| estimate_one(choice, total)).collect();
        out_of_core = more.iter().any(Result::is_ok);
        choices.extend(extra);
        estimates.extend(more);
    }
    let mut rejected: BTreeMap<String, Rejection> = BTreeMap::new();
    let mut valid: Vec<(usize, SimDuration)> = Vec::new();
    for (index, estimate) in estimates.into_iter().enumerate() {
        match estimate {
            Ok(bound) => valid.push((index, bound)),
            Err((reason, message)) => {
                rejected.entry(reason).and_modify(|r| r.count += 1).or_insert_with(|| {
                    // A reason's example says how much memory it needs: the whole estimate.
                    let message = if message == MEMORY_PENDING {
                        match estimate_with(&choices[index], false) {
                            Err((_, message)) => message,
                            Ok(_) => message,
                        }
                    } else {
                        message
                    };
                    Rejection { count: 1, example: format!("{}: {message}", choices[index].label()) }
                });
            }
        }
    }
    let estimate_wall = started.elapsed();
    let screen_note = format!(
        "{} of {} configurations valid and fit; analytical simulations in order of their lower bound",
        valid.len(),
        choices.len(),
    );
    step("screen", "configurations", 0, valid.len() as u64, &screen_note);
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
                let analytical = Override::new("simulation.fidelity", Fidelity::Analytical.name());
                let summary = search
                    .scenario(&choices[index], &[analytical])
                    .map_err(|error| error.to_string())
                    .and_then(|scenario| simulate(&scenario).map_err(|error| error.to_string()))
                    .map(|outcome| outcome.summary);
                (index, bound, summary)
            })
            .collect();
        for (index, bound, result) in results {
            match result {
                Ok(summary) => {
                    screened.push((score(&choices[index], summary.iteration_time), index, bound, summary))
                }
                Err(error) => failed.push((choices[index].label(), error)),
            }
        }
        screened.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let best = screened.first().map_or(0.0, |s| s.0);
        let next_bound = valid.get(next).map_or(f64::INFINITY, |&(i, b)| score(&choices[i], b));
        let note = format!(
            "best {best:.4}, {keep}th best {:.4}, next bound {next_bound:.4}; stops when no bound is below \
             the {keep}th best",
            screened.get(keep - 1).map_or(f64::INFINITY, |s| s.0)
        );
        step("screen", "configurations", next as u64, valid.len() as u64, &note);
    }
    let fidelity = bases[0].scenario.network.fidelity;
    let final_unit = format!("{} simulations", fidelity.name());
    let screened_count = next as u64;
    let bounded_out = (valid.len() - next) as u64;
    let screen_wall = started.elapsed();

    // The final ranking with the cluster's network model.
    let started = Instant::now();
    let mut finals = 0;
    let mut final_pruned = 0;
    let mut finals_stopped = 0;
    let mut left_best_floor = None;
    let mut ranked: Vec<(f64, usize, SimDuration, Summary, Fidelity, bool)>;
    let could_beat_final;
    let could_beat_over_limit;
    if fidelity == Fidelity::Analytical {
        screened.truncate(keep);
        ranked = screened
            .into_iter()
            .map(|(s, i, b, summary)| (s, i, b, summary, Fidelity::Analytical, false))
            .collect();
        could_beat_final = 0;
        could_beat_over_limit = 0;
    } else {
        // Every configuration that fits, in order of its floor for the final model: its
        // analytical score when the screen ran it (the analytical network leaves contention
        // out), else its lower bound. Those that failed the screen are left out.
        let failed_screen: LookupSet<usize> =
            valid.iter().take(next).map(|v| v.0).filter(|i| !screened.iter().any(|s| s.1 == *i)).collect();
        let mut screens: LookupMap<usize, (f64, Summary)> =
            screened.into_iter().map(|(s, i, _, summary)| (i, (s, summary))).collect();
        let mut order: Vec<(f64, usize, SimDuration)> = valid
            .iter()
            .filter(|(index, _)| !failed_screen.contains(index))
            .map(|&(index, bound)| {
                let floor = screens.get(&index).map_or_else(|| score(&choices[index], bound), |s| s.0);
                (floor, index, bound)
            })
            .collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        // The first batch is the best `keep` screened; then batches of BATCH in floor order,
        // until no floor left is below the winner (exact) or `final_max` have been checked.
        let limit = options.final_max.map(|max| max.max(keep));
        let mut winner = f64::INFINITY;
        let mut taken = 0;
        let places = options.top.max(1);
        ranked = Vec::new();
        let left = |order: &[(f64, usize, SimDuration)], taken: usize, winner: f64| {
            order[taken..].iter().take_while(|c| c.0 < winner).count() as u64
        };
        let note = |taken: usize, winner: f64, over: u64, left: u64| {
            let max = match limit {
                Some(max) => format!("--final-max {max}"),
                None => "no count limit (--final-max 0)".to_string(),
            };
            let time = match options.final_work_budget {
                Some(work) => format!("{} s each (--final-time-limit)", work / FLOW_WORK_PER_SECOND),
                None => "no time limit (--final-time-limit 0)".to_string(),
            };
            let left = if winner.is_finite() {
                format!("{left} left could still beat the winner {winner:.4}")
            } else {
                format!("the best {left} screened first, no winner yet")
            };
            format!("{taken} checked in floor order, {left}; {max}, {time}; {over} over it")
        };
        let first = keep.min(order.len()) as u64;
        step("final", &final_unit, 0, first, &note(0, winner, 0, first));
        // The batches, one after another: the first is the best `keep` screened, then
        // batches of BATCH in floor order, while a floor left is below the winner (exact) and
        // `final_max` allow. Each batch's final simulations are given up once certain to end
        // above the `top`-th best final result before the batch (they could not be listed,
        // nor win: what is listed is the same as if they had run to the end), and the
        // analytical runs of those the screen skipped once above the winner before it.
        //
        // The threads run the batch and, as they free up while its last simulations finish,
        // the next batch under the limits known so far (looser than its own), tightened
        // while they run as soon as the batch completes ([`RunLimit::tighten`]). A batch is
        // then classified under exactly the limits it would have had run on its own
        // ([`settle`], from how far each run's bounds reached): the result, the counts and
        // the order are those of the batches run one after another, whatever the threads.
        let next_batch = |taken: usize, winner: f64| -> Result<(usize, usize), Option<f64>> {
            if !(taken < order.len() && order[taken].0 < winner && (taken == 0 || winner.is_finite())) {
                return Err(None);
            }
            let size = if taken == 0 { keep } else { BATCH };
            let size = match limit {
                Some(max) => size.min(max.saturating_sub(taken)),
                None => size,
            };
            if size == 0 {
                return Err(Some(order[taken].0));
            }
            Ok((taken, (taken + size).min(order.len())))
        };
        // The batch after `end`, were the search to go on (run ahead by idle threads).
        let ahead = |end: usize| -> usize {
            let size = match limit {
                Some(max) => BATCH.min(max.saturating_sub(end)),
                None => BATCH,
            };
            (end + size).min(order.len())
        };
        let batch = match next_batch(0, winner) {
            Ok(batch) => Some(batch),
            Err(floor) => {
                left_best_floor = floor;
                None
            }
        };
        if let Some(batch) = batch {
            let board = Mutex::new(Board {
                batch,
                dispatched: 0,
                dispatch_end: ahead(batch.1),
                deferred: Vec::new(),
                running: Vec::new(),
                screens: std::mem::take(&mut screens),
                results: BTreeMap::new(),
                shared: BTreeMap::new(),
                threshold: f64::INFINITY,
                listed: f64::INFINITY,
                live: Vec::new(),
                next_live: 0,
                done: false,
                active: 0,
                finished_in_batch: 0,
                batch_note: note(0, winner, 0, first),
                batch_total: first,
                fold: Fold {
                    winner,
                    ranked: std::mem::take(&mut ranked),
                    finals,
                    final_pruned,
                    finals_stopped,
                    over_limit: 0,
                    failed: std::mem::take(&mut failed),
                    left_best_floor: None,
                    taken: 0,
                },
            });
            // Registers a run about to start under the board's limit of its stage: `None` once
            // the search is over (its result would not be used).
            let register = |index: usize, stage: Stage, scenario: &Scenario| -> Option<(u64, RunLimit)> {
                let mut board = lock(&board);
                if board.done {
                    return None;
                }
                let run_limit =
                    RunLimit::new(scenario, time_above(objective, &choices[index], board.limit(stage)));
                let id = board.next_live;
                board.next_live += 1;
                board.live.push(Live { id, limit: run_limit.clone(), index, stage });
                Some((id, run_limit))
            };
            let unregister = |id: u64| {
                let mut board = lock(&board);
                board.live.retain(|live| live.id != id);
            };
            // Each final simulation's work budget (`--final-time-limit`).
            let budget: Vec<Override> = options
                .final_work_budget
                .map(|work| Override::new("simulation.work-budget", i64::try_from(work).unwrap_or(i64::MAX)))
                .into_iter()
                .collect();
            // One configuration's runs, under the limits the board has when each starts;
            // `None` if the search ended before they could.
            let run_job = |index: usize,
                           bound: SimDuration,
                           screen: Option<(f64, Summary)>,
                           shared: &SharedRuns|
             -> Option<Ran> {
                let choice = &choices[index];
                // A configuration the screen skipped gets its analytical run first: a tighter
                // floor, and the result kept if its final simulation runs over budget.
                let screen = match screen {
                    Some(screen) => Screened::Given(screen),
                    None => {
                        let analytical = Override::new("simulation.fidelity", Fidelity::Analytical.name());
                        match search.scenario(choice, &[analytical]) {
                            Err(error) => Screened::Ran(Err(Final::Invalid(error)), None),
                            Ok(scenario) => {
                                let (id, run_limit) = register(index, Stage::Screen, &scenario)?;
                                let outcome = simulate_within_limit(&scenario, &run_limit, None);
                                unregister(id);
                                let outcome = outcome.map_err(Final::Simulation).map(|outcome| {
                                    outcome.map(|outcome| {
                                        (score(choice, outcome.summary.iteration_time), outcome.summary)
                                    })
                                });
                                Screened::Ran(outcome, Some(run_limit))
                            }
                        }
                    }
                };
                // The threshold it ran under: an analytical score not below it cannot win.
                let passed = match &screen {
                    Screened::Given(screen) | Screened::Ran(Ok(Some(screen)), _) => {
                        let board = lock(&board);
                        !board.done && screen.0 < board.threshold
                    }
                    Screened::Ran(..) => false,
                };
                if !passed {
                    return Some(Ran { index, bound, screen, last: None });
                }
                let last = match search.scenario(choice, &budget) {
                    Err(error) => (Err(Final::Invalid(error)), None),
                    Ok(scenario) => {
                        let (id, run_limit) = register(index, Stage::Final, &scenario)?;
                        let outcome = simulate_within_limit(&scenario, &run_limit, Some(shared));
                        unregister(id);
                        // Its summary alone is kept (not the graph and timeline).
                        let outcome = outcome.map(|outcome| outcome.map(|outcome| outcome.summary));
                        (outcome.map_err(Final::Simulation), Some(run_limit))
                    }
                };
                Some(Ran { index, bound, screen, last: Some(last) })
            };
            // Classifies the batch under its own limits, folds it in, and moves on to the next
            // batch (or ends the search), tightening the runs in progress to the new limits.
            let commit = |board: &mut Board| {
                let (start, end) = board.batch;
                let (threshold, listed) = (board.threshold, board.listed);
                for position in start..end {
                    let Some(ran) = board.results.remove(&position) else { continue };
                    let settled = settle(ran, objective, &choices, threshold, listed);
                    board.fold.add(settled, &choices, fidelity, &score);
                }
                board.fold.taken = end;
                board.shared.remove(&start);
                let fold = &board.fold;
                let left_now = left(&order, end, fold.winner);
                step(
                    "final",
                    &final_unit,
                    end as u64,
                    end as u64 + left_now,
                    &note(end, fold.winner, fold.over_limit, left_now),
                );
                // The limits of the next batch: the winner, and the `top`-th best finished result.
                let mut finished: Vec<f64> = fold.ranked.iter().filter(|r| !r.5).map(|r| r.0).collect();
                finished.sort_by(f64::total_cmp);
                board.threshold = fold.winner;
                board.listed = finished.get(places - 1).copied().unwrap_or(f64::INFINITY);
                match next_batch(end, fold.winner) {
                    Ok(batch) => {
                        board.batch = batch;
                        board.dispatch_end = ahead(batch.1);
                        board.finished_in_batch = board.results.range(..batch.1).count() as u64;
                        let left_before = left(&order, batch.0, board.fold.winner);
                        board.batch_total = batch.0 as u64 + left_before;
                        board.batch_note =
                            note(batch.0, board.fold.winner, board.fold.over_limit, left_before);
                    }
                    Err(floor) => {
                        board.fold.left_best_floor = floor;
                        board.done = true;
                    }
                }
                for live in &board.live {
                    // Over: every run in progress gives up at its next op start.
                    let score = if board.done { 0.0 } else { board.limit(live.stage) };
                    if let Some(time) = time_above(objective, &choices[live.index], score) {
                        live.limit.tighten(time);
                    }
                }
            };
            let progress = |done: u64, total: u64, note: &str| step("final", &final_unit, done, total, note);
            let threads = rayon::current_num_threads().max(1);
            let workers = Workers {
                board: &board,
                order: &order,
                threads,
                run_job: &run_job,
                commit: &commit,
                progress: &progress,
            };
            lock(&board).active = threads;
            rayon::scope(|scope| {
                for _ in 1..threads {
                    scope.spawn(|scope| workers.work(scope));
                }
                workers.work(scope);
            });
            let board = board.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
            let fold = board.fold;
            winner = fold.winner;
            ranked = fold.ranked;
            finals = fold.finals;
            final_pruned = fold.final_pruned;
            finals_stopped = fold.finals_stopped;
            failed = fold.failed;
            left_best_floor = fold.left_best_floor;
            taken = fold.taken;
        }
        // What might still beat the winner: those the count limit left, and those whose final
        // simulation ran over its time limit.
        let left = if winner.is_finite() { left(&order, taken, winner) } else { 0 };
        if left == 0 {
            left_best_floor = None;
        }
        let over =
            if winner.is_finite() { ranked.iter().filter(|r| r.5 && r.0 < winner).count() as u64 } else { 0 };
        could_beat_final = left + over;
        could_beat_over_limit = over;
    }
    ranked.sort_by(|a, b| final_order((a.5, a.0, a.1), (b.5, b.0, b.1)));
    let finals_over_limit = ranked.iter().filter(|r| r.5).count() as u64;
    ranked.truncate(options.top.max(1));
    let final_wall = started.elapsed();
    let top = ranked
        .into_iter()
        .map(|(_, index, bound, summary, fidelity, over_time_limit)| {
            let choice = choices[index].clone();
            let base = &bases[choice.base].scenario;
            let global_batch = search.global_batch as f64;
            let iterations = options.budget.map(|budget| match budget {
                Budget::Samples(samples) => samples / global_batch,
                Budget::Tokens(tokens) => {
                    let sequence = shard::sequence_length(&base.model).unwrap_or(1);
                    tokens / (global_batch * sequence as f64)
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
        could_beat_over_limit,
        finals_over_limit,
        finals_stopped,
        final_pruned,
        left_best_floor,
        top,
        walls: [estimate_wall, screen_wall, final_wall],
        fidelity,
        keep,
        out_of_core,
        host_optimizer: out_of_core && host_optimizer,
    })
}

/// The reason a configuration that does not fit in device memory is refused for.
const MEMORY: &str = "does not fit in memory";

/// The message of a configuration refused on its memory floor
/// ([`strategies::Strategy::estimate_checked_fitting`]) until its whole estimate is made, if
/// it is its reason's example.
const MEMORY_PENDING: &str = "(memory floor above the usable memory)";

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

/// Why a final simulation gave no result.
enum Final {
    /// The configuration's scenario is not valid (its screen's was).
    Invalid(ScenarioError),
    /// The simulation failed (or ran over its work budget).
    Simulation(crate::simulation::SimulationError),
    /// The simulation was given up once its time was certain to be above its limit.
    Stopped,
    /// The simulation was not run although its batch needed it (an internal error).
    NotRun,
}
/// Which run of a final job a [`RunLimit`] is on: the analytical run of a configuration the
/// screen skipped (limited by the winner) or its final simulation (by the `top`-th best).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Screen,
    Final,
}

/// A run in progress in the final stage, tightened when a batch completes.
struct Live {
    id: u64,
    limit: RunLimit,
    index: usize,
    stage: Stage,
}

/// A configuration's analytical score as the final stage found it.
enum Screened {
    /// The screen's.
    Given((f64, Summary)),
    /// Run now (the screen skipped it), under the limit given.
    Ran(Result<Option<(f64, Summary)>, Final>, Option<RunLimit>),
}

/// A configuration's runs in the final stage, under limits at least as loose as its batch's:
/// [`settle`] classifies them under the batch's own.
struct Ran {
    index: usize,
    bound: SimDuration,
    screen: Screened,
    /// The final simulation and its limit, when the analytical score was below the
    /// threshold it was checked against.
    last: Option<(FinalOutcome, Option<RunLimit>)>,
}

/// A final simulation's summary (`None`: given up at its limit).
type FinalOutcome = Result<Option<Summary>, Final>;

/// A configuration's final-stage result as its batch would have had it: its index, its
/// lower bound, its analytical score, and its final simulation's result (`None`: its
/// analytical score could not beat the winner).
type Settled = (usize, SimDuration, Option<(f64, Summary)>, Option<Result<Summary, Final>>);

/// `ran` as it would have gone under the batch's own limits, `threshold` (the winner before
/// the batch) on the analytical run and `listed` (the `top`-th best before it) on the final
/// simulation: a run under a looser limit that the batch's limit would have given up (some
/// op start showed its time above it, [`RunLimit::gives_up_under`]) is given up; any other
/// ran as it would have, event for event.
fn settle(ran: Ran, objective: Objective, choices: &[Choice], threshold: f64, listed: f64) -> Settled {
    let choice = &choices[ran.index];
    let gives_up = |limit: &Option<RunLimit>, score: f64| match (limit, time_above(objective, choice, score))
    {
        (Some(limit), Some(time)) => limit.gives_up_under(time),
        _ => false,
    };
    let screen = match ran.screen {
        Screened::Given(screen) => Ok(Some(screen)),
        Screened::Ran(_, limit) if gives_up(&limit, threshold) => Ok(None),
        Screened::Ran(outcome, _) => outcome,
    };
    let screen = match screen {
        Ok(None) => return (ran.index, ran.bound, None, None),
        Ok(Some(screen)) if screen.0 >= threshold => return (ran.index, ran.bound, Some(screen), None),
        Err(error) => return (ran.index, ran.bound, None, Some(Err(error))),
        Ok(Some(screen)) => screen,
    };
    let result = match ran.last {
        // Checked against a threshold no lower than `threshold`, its score passed that too.
        None => Err(Final::NotRun),
        Some((_, limit)) if gives_up(&limit, listed) => Err(Final::Stopped),
        Some((outcome, _)) => outcome.and_then(|summary| summary.ok_or(Final::Stopped)),
    };
    (ran.index, ran.bound, Some(screen), Some(result))
}

/// What the final stage has found so far, batch after batch.
struct Fold {
    winner: f64,
    ranked: Vec<(f64, usize, SimDuration, Summary, Fidelity, bool)>,
    finals: u64,
    final_pruned: u64,
    finals_stopped: u64,
    /// Final simulations that ran over their work budget.
    over_limit: u64,
    failed: Vec<(String, String)>,
    left_best_floor: Option<f64>,
    /// Configurations checked, in floor order.
    taken: usize,
}

impl Fold {
    /// Adds a configuration's settled result.
    fn add(
        &mut self,
        (index, bound, screen, result): Settled,
        choices: &[Choice],
        fidelity: Fidelity,
        score: &impl Fn(&Choice, SimDuration) -> f64,
    ) {
        if matches!(&result, Some(Err(Final::Simulation(error))) if over_budget(error)) {
            self.over_limit += 1;
        }
        match (screen, result) {
            // Its analytical score is not below the winner: it cannot win.
            (_, None) => self.final_pruned += 1,
            (Some((screen_score, screen)), Some(Err(Final::Simulation(error)))) if over_budget(&error) => {
                self.finals += 1;
                self.ranked.push((screen_score, index, bound, screen, Fidelity::Analytical, true));
            }
            (_, Some(Ok(summary))) => {
                self.finals += 1;
                let result = score(&choices[index], summary.iteration_time);
                self.winner = self.winner.min(result);
                self.ranked.push((result, index, bound, summary, fidelity, false));
            }
            (_, Some(Err(Final::Simulation(error)))) => {
                self.finals += 1;
                self.failed.push((choices[index].label(), error.to_string()))
            }
            (_, Some(Err(Final::Invalid(error)))) => {
                self.failed.push((choices[index].label(), error.to_string()))
            }
            (_, Some(Err(Final::NotRun))) => self.failed.push((
                choices[index].label(),
                "internal error: its final simulation was not run; please report it".to_string(),
            )),
            // Above the `top`-th best before the batch: neither listed nor the winner.
            (_, Some(Err(Final::Stopped))) => {
                self.finals += 1;
                self.finals_stopped += 1;
            }
        }
    }
}

/// The final stage's threads: each takes the next position handed out, runs it, and folds in
/// every batch it completes. None ever waits for another: one with nothing to take ends, and
/// one that completes a batch starts threads for what that hands out. So rayon work nested in
/// a simulation (Monte Carlo iterations) that picks up one of these tasks never waits on a
/// run it is itself part of.
struct Workers<'a> {
    board: &'a Mutex<Board>,
    order: &'a [(f64, usize, SimDuration)],
    threads: usize,
    run_job: &'a RunJob<'a>,
    commit: &'a (dyn Fn(&mut Board) + Sync),
    progress: &'a (dyn Fn(u64, u64, &str) + Sync),
}

impl<'a> Workers<'a> {
    /// Takes and runs positions until none is handed out (or the search is over).
    fn work(&'a self, scope: &rayon::Scope<'a>) {
        loop {
            let (position, index, bound, screen, shared) = {
                let mut board = lock(self.board);
                let Some(position) = board.take(self.order) else {
                    board.active -= 1;
                    return;
                };
                let (_, index, bound) = self.order[position];
                // Handed out below `dispatch_end`: in the batch being completed or the next.
                let start = if position < board.batch.1 { board.batch.0 } else { board.batch.1 };
                let shared = std::sync::Arc::clone(board.shared.entry(start).or_default());
                (position, index, bound, board.screens.remove(&index), shared)
            };
            let ran = (self.run_job)(index, bound, screen, &shared);
            drop(shared);
            let mut board = lock(self.board);
            board.running.retain(|&running| running != position);
            let Some(ran) = ran else { continue };
            if board.done {
                continue;
            }
            board.results.insert(position, ran);
            if position < board.batch.1 {
                board.finished_in_batch += 1;
                let (done, total) = (board.batch.0 as u64 + board.finished_in_batch, board.batch_total);
                (self.progress)(done, total.max(done), &board.batch_note);
            }
            while !board.done && (board.batch.0..board.batch.1).all(|p| board.results.contains_key(&p)) {
                (self.commit)(&mut board);
            }
            // Threads for what the completed batches handed out.
            let waiting = board.dispatch_end.saturating_sub(board.dispatched) + board.deferred.len();
            let extra = if board.done { 0 } else { self.threads.saturating_sub(board.active).min(waiting) };
            board.active += extra;
            drop(board);
            for _ in 0..extra {
                scope.spawn(move |scope| self.work(scope));
            }
        }
    }
}

/// Runs a configuration (its index, lower bound and screen result, with its batch's shared
/// runs) under the board's limits; `None` once the search is over.
type RunJob<'a> = dyn Fn(usize, SimDuration, Option<(f64, Summary)>, &SharedRuns) -> Option<Ran> + Sync + 'a;

impl Board {
    /// The next position to run, `None` once the search is over or none is left to hand out.
    /// Twins (configurations whose runs have the same inputs, hence the same floor) run the
    /// engine once, and the second waits for the first ([`SharedRuns`]): a position whose
    /// floor equals that of a run in progress is passed over while another is left, and taken
    /// first once that run is done, when it finds the result ready. Only the order in which
    /// the threads take positions changes, never a result: each batch is classified under its
    /// own limits whatever the order ([`settle`]).
    fn take(&mut self, order: &[(f64, usize, SimDuration)]) -> Option<usize> {
        if self.done {
            return None;
        }
        let running = &self.running;
        let busy = |position: usize| running.iter().any(|&other| order[other].0 == order[position].0);
        let position = if let Some(at) = self.deferred.iter().position(|&position| !busy(position)) {
            self.deferred.remove(at)
        } else {
            let mut found = None;
            while self.dispatched < self.dispatch_end {
                let position = self.dispatched;
                self.dispatched += 1;
                // Passed over only for one of its own batch: taking the next batch's instead
                // would hold up the batch's completion, and with it the tighter limits.
                let end = if position < self.batch.1 { self.batch.1 } else { self.dispatch_end };
                if busy(position) && position + 1 < end {
                    self.deferred.push(position);
                } else {
                    found = Some(position);
                    break;
                }
            }
            match found {
                Some(position) => position,
                // Nothing else to take: a twin, which waits for its run.
                None if !self.deferred.is_empty() => self.deferred.remove(0),
                None => return None,
            }
        };
        self.running.push(position);
        Some(position)
    }

    /// The score limit of a run of `stage`: the winner for an analytical run, the `top`-th
    /// best for a final simulation.
    fn limit(&self, stage: Stage) -> f64 {
        match stage {
            Stage::Screen => self.threshold,
            Stage::Final => self.listed,
        }
    }
}

/// `board`, whether or not a thread panicked holding it (the panic ends the search anyway).
fn lock(board: &Mutex<Board>) -> MutexGuard<'_, Board> {
    board.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The final stage's state shared by its threads (see `plan_with_progress`).
struct Board {
    /// The batch being completed: positions in floor order.
    batch: (usize, usize),
    /// Positions handed out so far, and below which they may be (the batch and the next).
    dispatched: usize,
    dispatch_end: usize,
    /// Positions passed over while a run of the same floor was in progress (see
    /// [`Board::take`]), and the positions being run.
    deferred: Vec<usize>,
    running: Vec<usize>,
    /// The screen's results of those not handed out yet.
    screens: LookupMap<usize, (f64, Summary)>,
    /// Runs of positions not yet folded in, by position.
    results: BTreeMap<usize, Ran>,
    /// Each batch's runs shared by twins (configurations whose runs have the same inputs run
    /// once), by the batch's first position: dropped with the batch once it is folded in.
    shared: BTreeMap<usize, std::sync::Arc<SharedRuns>>,
    /// The limits of the batch being completed (and looser than those of any later one).
    threshold: f64,
    listed: f64,
    /// Runs in progress.
    live: Vec<Live>,
    next_live: u64,
    /// The search is over.
    done: bool,
    /// Threads taking positions.
    active: usize,
    /// For the progress display: the batch's runs done, its total and note.
    finished_in_batch: u64,
    batch_total: u64,
    batch_note: String,
    fold: Fold,
}

/// The iteration time above which `choice` scores above `score` under `objective` (`None`
/// when `score` is not finite: no limit). A nanosecond above the exact conversion, so that
/// the rounding of the score's floating point can never give up a run that scores `score`
/// or below.
fn time_above(objective: Objective, choice: &Choice, score: f64) -> Option<SimDuration> {
    if !score.is_finite() {
        return None;
    }
    let seconds = match objective {
        Objective::Time => score,
        Objective::Throughput | Objective::Cost => score / choice.gpus.max(1) as f64,
    };
    let ps = (seconds.max(0.0) * 1e12).ceil();
    (ps < 1e19).then(|| SimDuration::from_ps(ps as u64 + 1_000))
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
            GroupKind::Expert => p.expert_comm_ranks(comm.kind, comm.what),
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

/// The (token dispatcher, EP A2A overlap) pairs to try for a mixture-of-experts split of
/// `expert` ranks: without expert parallelism the base's; else the all-to-all and the
/// DeepEP-style dispatcher (and the base's), each with and without the overlap where
/// Megatron-Core runs it (`Strategy::check_moe_overlap`: not with all-gather, full
/// recomputation or ZeRO-3; with a pipeline only interleaved 1F1B); the user's if fixed.
#[allow(clippy::too_many_arguments)]
fn moe_options(
    template: &Parallelism,
    fixed: &Fixed,
    expert: u64,
    pipeline: u64,
    virtual_stages: u64,
    schedule: strategies::PipelineSchedule,
    zero: u8,
    recompute: Recompute,
) -> Vec<(strategies::MoeDispatcher, bool)> {
    use strategies::MoeDispatcher;
    if expert < 2 {
        return vec![(template.moe_dispatcher, false)];
    }
    let mut dispatchers = match fixed.moe_dispatcher {
        Some(dispatcher) => vec![dispatcher],
        // DeepEP's node hop also sends a token once per GPU, not once per expert: worth trying
        // inside one node too.
        None => vec![MoeDispatcher::AllToAll, MoeDispatcher::DeepEp],
    };
    if fixed.moe_dispatcher.is_none() && !dispatchers.contains(&template.moe_dispatcher) {
        dispatchers.push(template.moe_dispatcher);
    }
    let mut out = Vec::new();
    for dispatcher in dispatchers {
        let can_overlap = dispatcher != MoeDispatcher::AllGather
            && recompute != Recompute::Full
            && zero <= 2
            && (pipeline == 1 || (virtual_stages > 1 && schedule == strategies::PipelineSchedule::OneFOneB));
        let overlaps = match fixed.moe_overlap {
            Some(overlap) => vec![overlap],
            None if can_overlap => vec![false, true],
            None => vec![false],
        };
        out.extend(overlaps.into_iter().map(|overlap| (dispatcher, overlap)));
    }
    out
}

/// The (virtual stages, schedule) pairs to try for each of `virtuals` on `pipeline` stages: the
/// base's schedule (1F1B if it is ZB-V or DualPipe), and with two chunks per stage also ZB-V and
/// DualPipe (on an even pipeline); only the user's schedule if fixed.
fn schedules(
    virtuals: &[u64],
    pipeline: u64,
    base: strategies::PipelineSchedule,
    fixed: &Fixed,
) -> Vec<(u64, strategies::PipelineSchedule)> {
    use strategies::PipelineSchedule;
    let mut out = Vec::with_capacity(virtuals.len() + 2);
    let plain = if base.two_chunks() { PipelineSchedule::OneFOneB } else { base };
    for &virtual_stages in virtuals {
        let two = virtual_stages == 2 && pipeline > 1;
        match fixed.schedule {
            Some(schedule) if !schedule.two_chunks() || two => out.push((virtual_stages, schedule)),
            Some(_) => {}
            None => {
                out.push((virtual_stages, plain));
                if two {
                    out.push((virtual_stages, PipelineSchedule::ZbV));
                    if pipeline % 2 == 0 {
                        out.push((virtual_stages, PipelineSchedule::DualPipe));
                    }
                }
            }
        }
    }
    out
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

/// The ends of a spatial split a search tries, as (index into the model's layers, name):
/// the fixed one; else none (the split runs to the first non-spatial layer) and each pooling
/// layer before that one, where ParaDL-style splits gather the tiles (CosmoFlow's
/// `spatial_cosmoflow.py` after its second pooling). The last splittable layer is left out:
/// ending there is the same split as none.
fn spatial_untils(model: &workloads::model::Model, fixed: &Fixed) -> Vec<(Option<u32>, Option<String>)> {
    if let Some(name) = &fixed.spatial_until {
        // A name that is no layer is kept: its validation refuses it, naming the key.
        let index = model.layers.iter().position(|layer| &layer.name == name).map(|i| i as u32);
        return vec![(index, Some(name.clone()))];
    }
    let end = strategies::cnn::automatic_spatial_end(model);
    let mut out = vec![(None, None)];
    for (index, layer) in model.layers.iter().enumerate().take(end.saturating_sub(1)) {
        if matches!(
            layer.kind,
            workloads::layer::LayerKind::MaxPool { .. } | workloads::layer::LayerKind::AvgPool { .. }
        ) {
            out.push((Some(index as u32), Some(layer.name.clone())));
        }
    }
    out
}

/// Every configuration of `base`'s GPUs the search tries, with `global_batch` samples per
/// iteration; `index` is the base's in the search.
pub fn enumerate(index: usize, base: &Base, global_batch: u64, fixed: &Fixed) -> Vec<Choice> {
    let gpus = base.gpus;
    let base = &base.scenario;
    let per_node = u64::from(base.cluster.gpus_per_node);
    let model = &base.model;
    let blocks = model.pipeline_units().len() as u64;
    let sequence = shard::sequence_length(model);
    let transformer = sequence.is_some();
    let one =
        |value: Option<u32>, options: Vec<u64>| -> Vec<u64> { value.map_or(options, |v| vec![u64::from(v)]) };
    let micro_batches = |data: u64| -> Vec<u64> {
        let per_replica = global_batch / data.max(1);
        let options: Vec<u64> = if let Some(micro) = fixed.micro_batch {
            vec![micro]
        } else {
            [1u64, 2, 4, 8, 16, 32, 64, 128, 256].into_iter().filter(|&m| m <= per_replica.max(1)).collect()
        };
        options.into_iter().filter(|&m| global_batch % (data * m) == 0).collect()
    };
    let recomputes: Vec<Recompute> = match fixed.recompute {
        Some(mode) => vec![mode],
        None if transformer => vec![Recompute::None, Recompute::Selective, Recompute::Full],
        None => vec![Recompute::None],
    };
    let mut out = Vec::new();
    let mut push =
        |parallelism: Parallelism, micro_batch: u64, recompute: Recompute, until: Option<String>| {
            out.push(Choice {
                base: index,
                gpus,
                parallelism,
                micro_batch,
                recompute,
                spatial_until: until,
                stage_placement: None,
            });
        };
    // LoRA's frozen weights are in no ZeRO-3 unit (the scenario refuses it).
    let lora = model.has_frozen_layers();
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
                        // ZB-V and DualPipe run two chunks per stage.
                        None if pipeline > 1 && fixed.schedule.is_some_and(|s| s.two_chunks()) => vec![2],
                        None if pipeline > 1 => [1u64, 2, 3, 4, 6, 8]
                            .into_iter()
                            .filter(|&v| v == 1 || blocks % (pipeline * v) == 0)
                            .collect(),
                        None => vec![1],
                    };
                    let expert_degrees = one(fixed.expert, powers_of_two(experts, data * context));
                    let zeros: Vec<u8> =
                        fixed.zero.map_or(if lora { vec![0, 1, 2] } else { vec![0, 1, 2, 3] }, |z| vec![z]);
                    for (virtual_stages, schedule) in schedules(&virtuals, pipeline, template.schedule, fixed)
                    {
                        for &expert in &expert_degrees {
                            for &zero in &zeros {
                                if zero > 0 && data * context == 1 {
                                    continue;
                                }
                                // A split backward is modelled up to ZeRO-2 (`Strategy::check`).
                                if zero >= 3 && schedule.splits_backward() {
                                    continue;
                                }
                                for &sequence_parallel in &sps {
                                    for micro in micro_batches(data) {
                                        // DualPipe's asserts on the micro-batches per replica.
                                        let per_replica = global_batch / (data * micro).max(1);
                                        if schedule == strategies::PipelineSchedule::DualPipe
                                            && (per_replica % 2 != 0 || per_replica < 2 * pipeline)
                                        {
                                            continue;
                                        }
                                        for &recompute in &recomputes {
                                            for (moe_dispatcher, moe_overlap) in moe_options(
                                                &template,
                                                fixed,
                                                expert,
                                                pipeline,
                                                virtual_stages,
                                                schedule,
                                                zero,
                                                recompute,
                                            ) {
                                                push(
                                                    Parallelism {
                                                        data: data as u32,
                                                        tensor: tensor as u32,
                                                        sequence_parallel,
                                                        pipeline: pipeline as u32,
                                                        virtual_stages: virtual_stages as u32,
                                                        schedule,
                                                        context: context as u32,
                                                        expert: expert as u32,
                                                        zero,
                                                        moe_dispatcher,
                                                        moe_overlap,
                                                        ..template
                                                    },
                                                    micro,
                                                    recompute,
                                                    None,
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
        }
    } else {
        // CNNs: one of spatial, filter, channel inside a group (or none), times data; or a
        // pipeline times data. A spatial split along each set of dimensions the model's samples
        // have, up to each of its cut points; plain data parallelism also out of core.
        let dims_options: Vec<SpatialDims> = match fixed.spatial_dims {
            Some(dims) => vec![dims],
            None => {
                let rank = model.layers.first().map_or(0, |layer| layer.input.0.len());
                SpatialDims::ALL
                    .into_iter()
                    .filter(|&dims| strategies::cnn::needed_rank(dims) <= rank)
                    .collect()
            }
        };
        let untils = spatial_untils(model, fixed);
        let mut splits: Vec<(CnnSplit, u64)> = vec![(CnnSplit::None, 1)];
        for degree in powers_of_two(gpus, gpus).into_iter().filter(|&d| d > 1) {
            let spatial = fixed.spatial.is_none_or(|s| u64::from(s) == degree)
                && fixed.filter.is_none()
                && fixed.channel.is_none();
            for &dims in dims_options.iter().filter(|_| spatial) {
                // Rows and columns on a grid of one column are row stripes: tried once.
                if fixed.spatial_dims.is_none()
                    && dims == SpatialDims::Hw
                    && strategies::cnn::spatial_grid(degree as u32, dims).last() == Some(&1)
                {
                    continue;
                }
                for (until, _) in &untils {
                    splits.push((
                        CnnSplit::Spatial {
                            degree: degree as u32,
                            dims,
                            until: *until,
                            halos: template.spatial_halos,
                        },
                        degree,
                    ));
                }
            }
            for split in [
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
        // The end of a spatial split applies to a spatial split only.
        if fixed.spatial_until.is_some() {
            splits.retain(|(split, _)| matches!(split, CnnSplit::Spatial { .. }));
        }
        let spatial_dims = fixed.spatial_dims.unwrap_or(template.spatial_dims);
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
                let (filter, channel, spatial, dims, until) = match split {
                    CnnSplit::Filter { degree: d, .. } => (d, 1, 1, spatial_dims, None),
                    CnnSplit::Channel(d) => (1, d, 1, spatial_dims, None),
                    CnnSplit::Spatial { degree, dims, until, .. } => (1, 1, degree, dims, until),
                    CnnSplit::None => (1, 1, 1, spatial_dims, None),
                };
                let until_name = match split {
                    CnnSplit::Spatial { .. } => {
                        untils.iter().find(|(index, _)| *index == until).and_then(|(_, name)| name.clone())
                    }
                    _ => None,
                };
                // Out of core where the enumeration sets no other degree than data (the
                // validation refuses what it does not model: micro-batches with the weights
                // offloaded, DASO, recomputation), or as fixed (refused elsewhere, by its key).
                let offloads: Vec<Offload> = match fixed.offload {
                    Some(offload) => vec![offload],
                    None if split == CnnSplit::None && pipeline == 1 => {
                        vec![Offload::None, Offload::Activations, Offload::ActivationsAndWeights]
                    }
                    None => vec![Offload::None],
                };
                for micro in micro_batches(data) {
                    for &recompute in &recomputes {
                        for &offload in &offloads {
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
                                    spatial_until: until,
                                    offload,
                                    ..template
                                },
                                micro,
                                recompute,
                                until_name.clone(),
                            );
                        }
                    }
                }
            }
        }
    }
    // Node groups of mixed devices: each pipeline's stages in order and by speed (one chunk
    // per stage, the split not set by first- or last-stage-layers: where by-speed applies).
    let mixed = base.node_groups.as_deref().is_some_and(|groups| groups.is_mixed());
    if !mixed {
        return out;
    }
    let by_speed_applies = |p: &Parallelism| {
        p.pipeline > 1
            && p.virtual_stages == 1
            && p.first_stage_layers.is_none()
            && p.last_stage_layers.is_none()
            && !p.pad_layers
            && !p.account_for_embedding
            && !p.account_for_loss
    };
    out.into_iter()
        .flat_map(|choice| {
            let placements = match fixed.stage_placement {
                Some(placement) => vec![placement],
                None if by_speed_applies(&choice.parallelism) => {
                    vec![StagePlacement::InOrder, StagePlacement::BySpeed]
                }
                None => vec![StagePlacement::InOrder],
            };
            placements
                .into_iter()
                .map(move |placement| Choice { stage_placement: Some(placement), ..choice.clone() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use super::*;
    use std::path::Path;

    /// MoE options: both dispatchers with and without the EP A2A overlap where Megatron-Core
    /// runs it; the overlap left out with full recomputation, ZeRO-3 or a plain pipeline; the
    /// user's fixed values alone; nothing to choose without expert parallelism.
    #[test]
    fn moe_options_try_both_dispatchers_and_the_overlap_where_it_runs() {
        use strategies::{MoeDispatcher::*, PipelineSchedule::OneFOneB};
        let template = Parallelism::data_parallel(8);
        let free = Fixed::default();
        let options = |fixed: &Fixed, expert, pipeline, virtuals, zero, recompute| {
            moe_options(&template, fixed, expert, pipeline, virtuals, OneFOneB, zero, recompute)
        };
        assert_eq!(
            options(&free, 8, 1, 1, 1, Recompute::Selective),
            [(AllToAll, false), (AllToAll, true), (DeepEp, false), (DeepEp, true)]
        );
        assert_eq!(options(&free, 8, 1, 1, 1, Recompute::Full), [(AllToAll, false), (DeepEp, false)]);
        assert_eq!(options(&free, 8, 1, 1, 3, Recompute::None), [(AllToAll, false), (DeepEp, false)]);
        assert_eq!(options(&free, 8, 4, 1, 1, Recompute::None), [(AllToAll, false), (DeepEp, false)]);
        assert_eq!(options(&free, 8, 4, 2, 1, Recompute::None).len(), 4);
        assert_eq!(options(&free, 1, 1, 1, 1, Recompute::None), [(AllToAll, false)]);
        let fixed = Fixed { moe_dispatcher: Some(DeepEp), moe_overlap: Some(false), ..Fixed::default() };
        assert_eq!(options(&fixed, 8, 1, 1, 1, Recompute::None), [(DeepEp, false)]);
    }

    /// GPT 1.7B at global batch 64 (Megatron-LM SC'21 Table 1's) on the cluster `cluster`
    /// (its `[cluster]` keys, then its `[cluster.network]` keys), under `fidelity`, with
    /// `fixed` (`KEY=VALUE`) fixed; `name` names the scenario.
    fn search_in(cluster: &str, network: &str, fidelity: &str, name: &str, fixed: &[&str]) -> Search {
        let text = format!(
            "[cluster]\n{cluster}\ndevice = \"a100-sxm4-80gb\"\n\
             intra-node = {{ kind = \"nvswitch\", bandwidth = \"300 GB/s\", latency = \"0.7 us\" }}\n\
             [cluster.network]\ntopology = \"switch\"\n{network}\nlink-latency = \"1 us\"\n\
             [workload]\nmodel = \"megatron-1.7b\"\nglobal-batch = 64\nmicro-batch = 1\n\
             precision = \"fp16\"\noptimizer = \"adam\"\n[simulation]\nfidelity = \"{fidelity}\"\n"
        );
        let table: toml::Table = toml::from_str(&text).unwrap();
        let fixed: Vec<Override> = fixed.iter().map(|text| text.parse().unwrap()).collect();
        Search::new(&table, Path::new(name), &[], &fixed, &[]).unwrap()
    }

    /// Megatron-LM SC'21 Table 1's GPT 1.7B on 16 A100 (two DGX servers), analytical network,
    /// global batch 64, with `fixed` (`KEY=VALUE`) fixed.
    fn search(fixed: &[&str]) -> Search {
        let cluster = "nodes = 2\ngpus-per-node = 8";
        search_in(cluster, "link-bandwidth = \"200 Gb/s\"", "analytical", "plan-test.toml", fixed)
    }

    /// The same model on a contended cluster: 4 servers of 4 A100 sharing one 25 Gb/s NIC
    /// each, flow network, recomputation selective, ZeRO-1 and sequence parallelism fixed.
    /// The analytical screen leaves the NIC's sharing out, so its ranking differs from flow's:
    /// its best five (`keep` for `--top 1`) are led by `t4 sp d4 mb16`, while the flow winner,
    /// `t2 sp p4 d2 mb1`, screens about tenth.
    /// A search whose flow winner the analytical screen ranks low: the schedule is fixed at
    /// 1F1B, the space the test was built on (DualPipe's merged pairs, searched since, hide
    /// this cluster's tensor collectives well enough that the screen finds their winner too).
    fn contended_search() -> Search {
        let fixed = [
            "workload.recompute=selective",
            "parallelism.zero=1",
            "parallelism.sequence-parallel=true",
            "parallelism.schedule=\"1f1b\"",
        ];
        let network = "nics-per-node = 1\nlink-bandwidth = \"25 Gb/s\"";
        search_in("nodes = 4\ngpus-per-node = 4", network, "flow", "plan-contended.toml", &fixed)
    }

    fn options(top: usize) -> PlanOptions {
        PlanOptions {
            objective: Objective::Time,
            top,
            budget: None,
            gpu_hour_price: None,
            memory_headroom: 0.1,
            final_work_budget: None,
            final_max: None,
        }
    }

    #[test]
    fn the_bounded_search_finds_the_same_best_configurations_as_simulating_every_one() {
        let search = search(&["workload.recompute=selective", "parallelism.zero=1"]);
        assert_eq!(search.fixed.recompute, Some(Recompute::Selective));
        assert_eq!(search.fixed.zero, Some(1));
        let report = plan(&search, &options(3)).unwrap();
        assert!(report.bounded_out > 0, "the bound skipped nothing: {} screened", report.screened);
        // Every valid configuration simulated.
        let mut all: Vec<(f64, String)> = enumerate(0, &search.bases[0], search.global_batch, &search.fixed)
            .iter()
            .filter_map(|choice| {
                let scenario = search.scenario(choice, &[]).ok()?;
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

    /// A limited run's bounds (its kernels, the floors of its movements and its links'
    /// occupancy ahead, `sim_core::exec::EndLimit`) never pass its own iteration time: on
    /// configurations of every kind plan searches (tensor, sequence, pipeline schedules,
    /// ZeRO stages, recomputation, micro-batches) on four servers sharing one NIC each, under
    /// the analytical network and under flow. A bound past it would give up a run that ends
    /// in time, and plan would lose a configuration it should list.
    #[test]
    fn a_runs_bounds_never_pass_its_own_iteration_time() {
        let network = "nics-per-node = 1\nlink-bandwidth = \"25 Gb/s\"";
        let search = search_in("nodes = 4\ngpus-per-node = 4", network, "flow", "plan-bounds.toml", &[]);
        let choices = enumerate(0, &search.bases[0], search.global_batch, &search.fixed);
        let mut checked = 0;
        let mut zero3 = 0;
        for choice in choices.iter().step_by(11) {
            for fidelity in [Fidelity::Analytical, Fidelity::Flow] {
                let fidelity = Override::new("simulation.fidelity", fidelity.name());
                let Ok(scenario) = search.scenario(choice, &[fidelity]) else { continue };
                let limit = RunLimit::new(&scenario, None);
                let Ok(Some(outcome)) = simulate_within_limit(&scenario, &limit, None) else { continue };
                let time = outcome.summary.iteration_time;
                assert!(!limit.gives_up_under(time), "{}: bounds past its own time {time}", choice.label());
                checked += 1;
                zero3 += usize::from(choice.parallelism.zero == 3);
            }
            if checked >= 60 {
                break;
            }
        }
        assert!(checked >= 40 && zero3 > 0, "{checked} runs checked, {zero3} under ZeRO-3");
    }

    #[test]
    fn the_memory_floor_refuses_only_what_the_whole_estimate_refuses() {
        // GPT 1.7B on 16 A100, every schedule, ZeRO stage and recomputation searched.
        let search = search(&[]);
        let choices = enumerate(0, &search.bases[0], search.global_batch, &search.fixed);
        let (mut refused, mut checked) = (0, 0);
        // Limits that refuse few, half and most configurations.
        for usable in [20e9, 8e9, 3e9] {
            for choice in &choices {
                let Ok(scenario) = search.scenario(choice, &[]) else { continue };
                let strategy = scenario.strategy();
                let floor = comm_floor(&scenario);
                let Ok(estimate) = strategy.estimate_checked(&floor) else { continue };
                let needs = estimate.peak_memory().total();
                let seen = std::cell::Cell::new(None);
                let fits = |bytes: sim_core::units::Bytes| {
                    seen.set(Some(bytes));
                    bytes.0 as f64 <= usable
                };
                let fitting = strategy.estimate_checked_fitting(&floor, &fits).unwrap();
                let memory_floor = seen.get().expect("a floor without offloading");
                assert!(memory_floor <= needs, "{}: floor {memory_floor:?} above {needs:?}", choice.label());
                checked += 1;
                match fitting {
                    None => {
                        refused += 1;
                        assert!(needs.0 as f64 > usable, "{}: refused at {needs:?}", choice.label());
                    }
                    // Not refused: the estimate's own, the same.
                    Some(fitted) => {
                        assert_eq!(fitted.time_lower_bound, estimate.time_lower_bound);
                        assert_eq!(fitted.peak_memory(), estimate.peak_memory());
                    }
                }
            }
        }
        assert!(refused > 100 && refused < checked, "{refused} of {checked} refused on their floor");
    }

    #[test]
    fn twins_run_once_and_keep_their_own_results_and_different_graphs_share_nothing() {
        use crate::simulation::{SharedRuns, simulate_within_sharing};
        // ZeRO-1 and ZeRO-2 with one micro-batch per replica lower to one graph; ZeRO-3 to another.
        let search = search(&["workload.recompute=selective", "parallelism.schedule=\"1f1b\""]);
        let choices = enumerate(0, &search.bases[0], search.global_batch, &search.fixed);
        let scenario_of = |zero: u8| {
            let choice = choices
                .iter()
                .find(|c| {
                    let p = &c.parallelism;
                    (p.tensor, p.pipeline, p.virtual_stages, p.data, p.zero, c.micro_batch)
                        == (2, 2, 1, 4, zero, 16)
                        && p.sequence_parallel
                })
                .unwrap();
            search.scenario(choice, &[]).unwrap()
        };
        let alone = |scenario: &Scenario| simulate(scenario).unwrap();
        for (first, second, twins) in [(1, 2, true), (1, 3, false)] {
            let (a, b) = (scenario_of(first), scenario_of(second));
            let (graph_a, graph_b) = (alone(&a).graph, alone(&b).graph);
            assert_eq!(graph_a == graph_b, twins, "ZeRO-{first} and ZeRO-{second}");
            assert_eq!(graph_a.fingerprint() == graph_b.fingerprint(), twins);
            let shared = SharedRuns::new();
            for limit in [None, Some(SimDuration::from_us(1))] {
                let shared_a = simulate_within_sharing(&a, limit, Some(&shared)).unwrap();
                let shared_b = simulate_within_sharing(&b, limit, Some(&shared)).unwrap();
                let own_b = simulate_within_sharing(&b, limit, None).unwrap();
                // Given up at a limit below any run, or the same summary as alone.
                assert_eq!(shared_b.is_none(), limit.is_some());
                assert_eq!(own_b.is_none(), limit.is_some());
                if let (Some(shared_a), Some(shared_b), Some(own_b)) = (shared_a, shared_b, own_b) {
                    let json = |summary: &Summary| serde_json::to_string(summary).unwrap();
                    assert_eq!(json(&shared_a.summary), json(&alone(&a).summary));
                    assert_eq!(json(&shared_b.summary), json(&own_b.summary));
                    assert_eq!(shared_b.timeline, own_b.timeline);
                }
            }
            // Each limit's twin took the first's result; different graphs ran on their own.
            assert_eq!(shared.taken(), if twins { 2 } else { 0 });
        }
    }

    #[test]
    fn fixed_settings_are_not_searched_and_an_impossible_one_leaves_nothing() {
        let fixed = search(&["parallelism.tensor=4", "workload.micro-batch=2"]);
        assert_eq!(fixed.fixed_keys, ["parallelism.tensor", "workload.micro-batch"]);
        assert!(!fixed.ignored.contains(&"workload.micro-batch".to_string()));
        let choices = enumerate(0, &fixed.bases[0], fixed.global_batch, &fixed.fixed);
        assert!(!choices.is_empty());
        assert!(choices.iter().all(|c| c.parallelism.tensor == 4 && c.micro_batch == 2));
        // Every configuration's scenario is its choice, built through the override path.
        for choice in choices.iter().take(20) {
            match fixed.scenario(choice, &[]) {
                Ok(scenario) => {
                    assert_eq!(scenario.parallelism, choice.parallelism);
                    assert_eq!((scenario.micro_batch, scenario.global_batch), (2, 64));
                    assert!(scenario.fold_symmetric_ranks);
                }
                Err(error) => assert!(matches!(error, ScenarioError::Invalid { .. }), "{error}"),
            }
        }
        // Data 3 does not divide 16 GPUs: the scenario says so, naming the fixed key.
        let table: toml::Table = toml::from_str(&scenario_text().replace("micro-batch = 1\n", "")).unwrap();
        let data: Override = "parallelism.data=3".parse().unwrap();
        let error = Search::new(&table, Path::new("t.toml"), &[], &[data], &[]).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("parallelism.data=3: key `parallelism.data` (set by this override)"),
            "{error}"
        );
        // A batch no split divides leaves nothing.
        let small = search(&["parallelism.tensor=1", "parallelism.pipeline=1", "workload.global-batch=8"]);
        assert!(matches!(plan(&small, &options(3)), Err(PlanError::Empty(_))));
    }

    #[test]
    fn cnns_search_their_own_strategies() {
        let table: toml::Table = toml::from_str(&scenario_text()).unwrap();
        let cnn = [Override::new("workload.model", "resnet50"), Override::new("workload.global-batch", 256)];
        let search = Search::new(&table, Path::new("plan-test.toml"), &cnn, &[], &[]).unwrap();
        assert_eq!(search.ignored, ["workload.micro-batch"]);
        let choices = enumerate(0, &search.bases[0], search.global_batch, &search.fixed);
        for wanted in ["spatial", "filter", "channel"] {
            assert!(choices.iter().any(|c| c.label().contains(wanted)), "no {wanted} configuration");
        }
        assert!(choices.iter().any(|c| c.parallelism.pipeline > 1), "no pipeline configuration");
        assert!(choices.iter().all(|c| c.parallelism.tensor == 1 && c.parallelism.zero == 0));
        let report = plan(&search, &options(2)).unwrap();
        assert_eq!(report.top.len(), 2);
    }

    /// CNN splits: every set of dimensions a model's samples have (3-D volumes: "dhw" too;
    /// images: not), each end at a pooling layer and none, and out-of-core modes on plain data
    /// parallelism only; a fixed end or offload is the only one tried.
    #[test]
    fn cnns_search_spatial_dimensions_their_ends_and_offload() {
        let table: toml::Table = toml::from_str(&scenario_text()).unwrap();
        let choices = |model: &str, fixed: &[&str]| {
            let settings = [
                Override::new("workload.model", model.to_string()),
                Override::new("workload.global-batch", 16),
                Override::new("cluster.host-memory", "384 GiB"),
            ];
            let fixed: Vec<Override> = fixed.iter().map(|f| f.parse().unwrap()).collect();
            let search = Search::new(&table, Path::new("plan-test.toml"), &settings, &fixed, &[]).unwrap();
            enumerate(0, &search.bases[0], search.global_batch, &search.fixed)
        };
        let volumes = choices("cosmoflow-512", &[]);
        let spatial: Vec<&Choice> = volumes.iter().filter(|c| c.parallelism.spatial > 1).collect();
        for dims in SpatialDims::ALL {
            assert!(spatial.iter().any(|c| c.parallelism.spatial_dims == dims), "no {dims:?}");
        }
        let ends: Vec<Option<&str>> = spatial.iter().map(|c| c.spatial_until.as_deref()).collect();
        assert!(ends.contains(&None) && ends.contains(&Some("APOOL_2")), "{ends:?}");
        // Pooling layers only: no convolution ends a split.
        assert!(ends.iter().flatten().all(|name| name.starts_with("APOOL_")), "{ends:?}");
        // The index and the name agree.
        for c in &spatial {
            let index = c.parallelism.spatial_until.map(|i| i as usize);
            let model = workloads::zoo::by_name("cosmoflow-512").unwrap();
            assert_eq!(index.map(|i| model.layers[i].name.as_str()), c.spatial_until.as_deref());
        }
        for c in volumes.iter().filter(|c| c.parallelism.offload != Offload::None) {
            assert!(c.parallelism.data as u64 == c.gpus, "{}", c.label());
        }
        assert!(volumes.iter().any(|c| c.parallelism.offload == Offload::ActivationsAndWeights));
        let images = choices("resnet50", &[]);
        assert!(images.iter().all(|c| c.parallelism.spatial_dims != SpatialDims::Dhw));
        let fixed =
            choices("cosmoflow-512", &["parallelism.spatial-until=APOOL_2", "workload.offload=activations"]);
        assert!(!fixed.is_empty());
        assert!(fixed.iter().all(|c| c.spatial_until.as_deref() == Some("APOOL_2")
            && c.parallelism.offload == Offload::Activations));
    }

    /// [`search`]'s cluster file.
    fn scenario_text() -> String {
        "[cluster]\nnodes = 2\ndevice = \"a100-sxm4-80gb\"\n[workload]\nmodel = \"megatron-1.7b\"\n\
         global-batch = 64\nmicro-batch = 1\nprecision = \"fp16\"\n"
            .to_string()
    }

    /// The flow final's exact stop: with no --final-max it checks, in floor order, every
    /// configuration that could still beat its winner, so it finds the exhaustive flow winner
    /// even where that winner is not among the screen's best `keep`, which is where the final
    /// used to stop.
    #[test]
    fn the_exact_final_finds_the_flow_winner_that_the_screens_best_keep_miss() {
        let flow = contended_search();
        let unlimited = plan(&flow, &options(1)).unwrap();
        assert!(unlimited.top.iter().all(|r| !r.over_time_limit && r.fidelity == Fidelity::Flow));
        // No --final-max: the final checks every configuration whose floor is below the winner,
        // so none is left that could beat it, and the winner is the exhaustive one.
        assert_eq!((unlimited.could_beat_final, unlimited.left_best_floor), (0, None));
        // Simulating every valid configuration with flow leaves none unchecked.
        let everything = options(unlimited.valid as usize);
        let exhaustive = plan(&flow, &everything).unwrap();
        assert_eq!(exhaustive.finals, exhaustive.valid);
        assert_eq!(exhaustive.could_beat_final, 0);
        let best = |r: &PlanReport| (r.top[0].choice.label(), r.top[0].summary.iteration_time);
        assert_eq!(best(&unlimited), best(&exhaustive));
        assert!(unlimited.finals < exhaustive.finals, "the floors pruned nothing");
        // Stopped at --final-max (the best keep screened only, as the final was before its
        // exact stop): on this cluster the flow winner is not among them, so that final
        // crowns a slower configuration, and says that some left could beat it, with their
        // best floor below its result.
        let counted = plan(&flow, &PlanOptions { final_max: Some(0), ..options(1) }).unwrap();
        assert_eq!(counted.finals + counted.final_pruned, counted.keep as u64);
        assert_ne!(
            best(&counted).0,
            best(&exhaustive).0,
            "the screen's best {} hold the flow winner",
            counted.keep
        );
        assert!(best(&counted).1 > best(&exhaustive).1);
        assert!(counted.could_beat_final > 0);
        assert!(
            counted
                .left_best_floor
                .is_some_and(|floor| floor < counted.top[0].summary.iteration_time.as_secs_f64())
        );
    }

    #[test]
    fn the_final_gives_the_same_report_on_any_number_of_threads() {
        // Threads run the next batch ahead under looser limits, tightened as batches complete,
        // and each batch is classified under its own limits: the report (winner, list, counts
        // of runs stopped, pruned, over budget) is the one of the batches run one by one (one
        // thread), however the runs interleave. With no work budget, and with one small enough
        // that some finals run over it.
        let flow = contended_search();
        let signature = |report: &PlanReport| {
            let top: Vec<_> = report
                .top
                .iter()
                .map(|r| (r.choice.label(), r.summary.iteration_time, r.over_time_limit, r.fidelity))
                .collect();
            format!(
                "{top:?} finals {} stopped {} pruned {} over {} beat {} {} floor {:?} failed {:?}",
                report.finals,
                report.finals_stopped,
                report.final_pruned,
                report.finals_over_limit,
                report.could_beat_final,
                report.could_beat_over_limit,
                report.left_best_floor,
                report.failed
            )
        };
        // The same cluster with ZeRO-1 and ZeRO-2 both searched: twins (one graph, run once)
        // that the threads take apart where they can (`Board::take`).
        let network = "nics-per-node = 1\nlink-bandwidth = \"25 Gb/s\"";
        let fixed = [
            "workload.recompute=selective",
            "parallelism.sequence-parallel=true",
            "parallelism.schedule=\"1f1b\"",
        ];
        let twins = search_in("nodes = 4\ngpus-per-node = 4", network, "flow", "plan-twins.toml", &fixed);
        for (search, budget) in [(&flow, None), (&flow, Some(20_000)), (&twins, None)] {
            let options = PlanOptions { final_work_budget: budget, final_max: None, ..options(3) };
            let on = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| plan(search, &options)).unwrap()
            };
            let report = on(1);
            // Several batches after the first: the threads have a batch to run ahead.
            assert!(
                report.finals + report.final_pruned > report.keep as u64 + 2 * BATCH as u64,
                "{} finals and {} pruned: too few batches to run ahead",
                report.finals,
                report.final_pruned
            );
            let one = signature(&report);
            for threads in [2, 3, 4] {
                assert_eq!(signature(&on(threads)), one, "{threads} threads, budget {budget:?}");
            }
            if budget.is_some() {
                assert!(!one.contains("over 0 "), "no final ran over the budget: {one}");
            }
        }
    }

    #[test]
    fn a_final_over_its_work_budget_keeps_its_screen_result_and_ranks_after_the_finished() {
        let fixed = ["workload.recompute=selective", "parallelism.zero=1", "simulation.fidelity=flow"];
        let flow = search(&fixed);
        // No budget at all: every final gives up and keeps its analytical result, in the
        // screen's order.
        let starved = PlanOptions { final_work_budget: Some(0), ..options(4) };
        let report = plan(&flow, &starved).unwrap();
        assert!(report.top.iter().all(|r| r.over_time_limit && r.fidelity == Fidelity::Analytical));
        assert_eq!(report.could_beat_final, 0, "no final finished: no winner to beat");
        let times: Vec<_> = report.top.iter().map(|r| r.summary.iteration_time).collect();
        assert!(times.windows(2).all(|pair| pair[0] <= pair[1]), "{times:?}");
        // The same budget gives the same answer however often it runs.
        let again = plan(&flow, &starved).unwrap();
        let labels = |r: &PlanReport| r.top.iter().map(|t| t.choice.label()).collect::<Vec<_>>();
        assert_eq!(labels(&report), labels(&again));
    }

    #[test]
    fn finished_finals_rank_before_those_over_budget_whatever_their_score() {
        let mut rows = [(true, 1.0, 0), (false, 3.0, 1), (false, 2.0, 2), (true, 0.5, 3)];
        rows.sort_by(|a, b| final_order(*a, *b));
        assert_eq!(rows.map(|r| r.2), [2, 1, 3, 0]);
    }

    /// Megatron-LM's GPT 1.7B at global batch 16 on a server of 4 A100-SXM4-40GB and one of 4
    /// H100-SXM5-80GB (`first`, `second`: their devices), analytical network, with `fixed`.
    fn mixed_search(first: &str, second: &str, fixed: &[&str]) -> Search {
        let text = format!(
            "[cluster]\nnodes = 2\ngpus-per-node = 4\n\
             [[cluster.node-groups]]\nnodes = 1\ndevice = \"{first}\"\n\
             [[cluster.node-groups]]\nnodes = 1\ndevice = \"{second}\"\n\
             [cluster.network]\ntopology = \"switch\"\nlink-bandwidth = \"200 Gb/s\"\n\
             [workload]\nmodel = \"megatron-1.7b\"\nglobal-batch = 16\nprecision = \"bf16\"\n\
             optimizer = \"adam\"\n[simulation]\nfidelity = \"analytical\"\n"
        );
        let table: toml::Table = toml::from_str(&text).unwrap();
        let fixed: Vec<Override> = fixed.iter().map(|text| text.parse().unwrap()).collect();
        Search::new(&table, Path::new("plan-mixed.toml"), &[], &fixed, &[]).unwrap()
    }

    /// The settings that keep the mixed searches small: the degrees and placements are searched.
    const MIXED_FIXED: [&str; 5] = [
        "workload.recompute=none",
        "workload.micro-batch=1",
        "parallelism.zero=1",
        "parallelism.sequence-parallel=false",
        "parallelism.virtual-stages=1",
    ];

    #[test]
    fn mixed_devices_search_both_placements_with_bounds_below_every_simulation() {
        let search = mixed_search("a100-sxm4-40gb", "h100-sxm5-80gb", &MIXED_FIXED);
        let choices = enumerate(0, &search.bases[0], search.global_batch, &search.fixed);
        // Every pipeline in order and by speed; no pipeline in order only.
        for choice in &choices {
            assert!(choice.stage_placement.is_some(), "{}", choice.label());
            if choice.parallelism.pipeline == 1 {
                assert_eq!(choice.stage_placement, Some(StagePlacement::InOrder));
            }
        }
        let pipelined = |placement| {
            choices
                .iter()
                .filter(|c| c.parallelism.pipeline > 1 && c.stage_placement == Some(placement))
                .count()
        };
        assert!(pipelined(StagePlacement::BySpeed) > 0);
        assert_eq!(pipelined(StagePlacement::BySpeed), pipelined(StagePlacement::InOrder));
        let report = plan(&search, &options(3)).unwrap();
        assert!(!report.top.is_empty());
        // Every valid configuration simulated: the bound (each kernel on its fastest device)
        // is below each, and the search's best three are the exhaustive best three.
        let tables = LayerTables::new(
            &search.bases[0].scenario.model,
            &search.bases[0].scenario.device,
            &search.bases[0].scenario.compute,
        );
        let mut all: Vec<(f64, String)> = Vec::new();
        for choice in &choices {
            let Ok(scenario) = search.scenario(choice, &[]) else { continue };
            let groups = scenario.node_groups.as_deref().unwrap();
            assert!(!scenario.fold_symmetric_ranks, "a mixed cluster simulates every rank");
            let strategy = Strategy { layer_tables: Some(&tables), ..scenario.strategy() };
            let Ok(estimate) = crate::mixed::estimate(&scenario, groups, &strategy, &comm_floor(&scenario))
            else {
                continue;
            };
            let memories = crate::mixed::group_memory(&scenario, groups, &estimate.stages);
            if memories
                .iter()
                .zip(&groups.groups)
                .any(|(memory, group)| memory.total().0 as f64 > 0.9 * group.device.memory_capacity.0 as f64)
            {
                continue;
            }
            let time = simulate(&scenario).unwrap().summary.iteration_time;
            assert!(
                estimate.time_lower_bound <= time,
                "{}: bound {} above the simulated {time}",
                choice.label(),
                estimate.time_lower_bound
            );
            all.push((time.as_secs_f64(), choice.label()));
        }
        assert_eq!(all.len() as u64, report.valid);
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        let exhaustive: Vec<f64> = all.iter().take(3).map(|(t, _)| *t).collect();
        let searched: Vec<f64> = report.top.iter().map(|r| r.summary.iteration_time.as_secs_f64()).collect();
        assert_eq!(searched, exhaustive, "exhaustive order: {:?}", &all[..3.min(all.len())]);
        // A fixed placement is the only one searched.
        let fixed = [&MIXED_FIXED[..], &["parallelism.stage-placement=in-order"]].concat();
        let in_order = mixed_search("a100-sxm4-40gb", "h100-sxm5-80gb", &fixed);
        assert_eq!(in_order.fixed.stage_placement, Some(StagePlacement::InOrder));
        let only = enumerate(0, &in_order.bases[0], in_order.global_batch, &in_order.fixed);
        assert!(only.iter().all(|c| c.stage_placement == Some(StagePlacement::InOrder)));
        assert_eq!(only.len(), choices.len() - pipelined(StagePlacement::BySpeed));
    }

    #[test]
    fn a_split_that_fits_the_larger_group_but_not_the_smaller_is_refused_naming_the_group() {
        // Data parallelism over the 8 GPUs: each needs the whole model's state and a
        // micro-batch's activations.
        let fixed =
            [&MIXED_FIXED[..], &["parallelism.tensor=1", "parallelism.pipeline=1", "parallelism.zero=0"]]
                .concat();
        let fixed: Vec<&str> = fixed.into_iter().filter(|key| *key != "parallelism.zero=1").collect();
        // On H100s alone, it fits.
        let large = mixed_search("h100-sxm5-80gb", "h100-sxm5-80gb", &fixed);
        let report = plan(&large, &options(1)).unwrap();
        assert_eq!((report.enumerated, report.valid), (1, 1), "{:?}", report.rejected);
        // With the A100-40GB server, it does not, and the example names its group.
        let mixed = mixed_search("a100-sxm4-40gb", "h100-sxm5-80gb", &fixed);
        let report = plan(&mixed, &options(1)).unwrap();
        // The configuration, then its two out-of-core variants (nothing fit), refused too.
        assert_eq!(
            (report.enumerated, report.valid, report.out_of_core),
            (3, 0, false),
            "{:?}",
            report.rejected
        );
        let rejection = &report.rejected["does not fit in memory"];
        assert!(
            rejection.example.contains("on cluster.node-groups[0] (a100-sxm4-40gb)"),
            "{}",
            rejection.example
        );
        // The other way round, the A100s second: the same group named by its own index.
        let swapped = mixed_search("h100-sxm5-80gb", "a100-sxm4-40gb", &fixed);
        let report = plan(&swapped, &options(1)).unwrap();
        assert!(
            report.rejected["does not fit in memory"]
                .example
                .contains("on cluster.node-groups[1] (a100-sxm4-40gb)"),
            "{:?}",
            report.rejected
        );
        // And run refuses it the same way.
        let choice = enumerate(0, &mixed.bases[0], mixed.global_batch, &mixed.fixed).remove(0);
        let error = simulate(&mixed.scenario(&choice, &[]).unwrap()).err().unwrap().to_string();
        assert!(error.contains("on cluster.node-groups[0] (a100-sxm4-40gb)"), "{error}");
    }

    #[test]
    fn node_groups_refuse_other_gpu_counts_and_by_speed_on_one_device_type() {
        let text = "[cluster]\nnodes = 2\ngpus-per-node = 4\n\
                    [[cluster.node-groups]]\nnodes = 1\ndevice = \"a100-sxm4-40gb\"\n\
                    [[cluster.node-groups]]\nnodes = 1\ndevice = \"h100-sxm5-80gb\"\n\
                    [workload]\nmodel = \"megatron-1.7b\"\nglobal-batch = 16\n";
        let table: toml::Table = toml::from_str(text).unwrap();
        let error = Search::new(&table, Path::new("m.toml"), &[], &[], &[16]).unwrap_err().to_string();
        assert!(
            error.contains("--gpus 16")
                && error.contains("`cluster.node-groups`")
                && error.contains("give --gpus 8"),
            "{error}"
        );
        let bad: Override = "parallelism.stage-placement=fastest".parse().unwrap();
        let error = Search::new(&table, Path::new("m.toml"), &[], &[bad], &[]).unwrap_err().to_string();
        assert!(error.contains("`parallelism.stage-placement`") && error.contains("\"by-speed\""), "{error}");
        let by_speed: Override = "parallelism.stage-placement=by-speed".parse().unwrap();
        let single: toml::Table = toml::from_str(&scenario_text()).unwrap();
        let error = Search::new(&single, Path::new("s.toml"), &[], &[by_speed], &[]).unwrap_err().to_string();
        assert!(error.contains("one device type"), "{error}");
        // Without a precision: bf16 where every group's device has it, else fp16.
        for (second, precision) in [("h100-sxm5-80gb", "bf16"), ("v100-sxm2-32gb", "fp16")] {
            let table: toml::Table = toml::from_str(&text.replace("h100-sxm5-80gb", second)).unwrap();
            let search = Search::new(&table, Path::new("m.toml"), &[], &[], &[]).unwrap();
            assert_eq!(search.bases[0].scenario.precision.to_string(), precision, "{second}");
        }
    }
}
