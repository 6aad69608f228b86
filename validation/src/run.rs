//! Running one case: the scenario, collective, kernel table or trace it names, simulated and
//! set against its measurement.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use scenario::collective_bench::{BenchSettings, CollectiveBench};
use scenario::simulation::{Summary, simulate, simulate_iteration_times};
use scenario::{Cluster, Override, Scenario, apply, merge};
use serde::Serialize;
use sim_core::fidelity::{Fidelity, NetworkSettings};
use sim_core::graph::{CollectiveAlgorithm, OpKind, Pass, Work};
use sim_core::nccl::protocol::ProtocolChoice;
use sim_core::units::{Bytes, SimDuration, SimTime};
use workloads::{ComputeModel, DeviceCatalog, Dtype};

use crate::case::{CaseEntry, Family, Kind, Paths};
use crate::ledger::Role;
use crate::replay::{ReplayRequest, replay};

/// `1 - |simulated - measured| / measured`, floored at 0: the suite's accuracy.
pub fn accuracy(simulated: f64, measured: f64) -> f64 {
    (1.0 - ((simulated - measured) / measured).abs()).max(0.0)
}

/// One measured point and its simulation (a multi-point case has many).
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// What the point is: a size, a kernel shape.
    pub label: String,
    /// Measured, in the family's unit.
    pub measured: f64,
    /// Simulated, in the family's unit.
    pub simulated: f64,
    /// Its accuracy.
    pub accuracy: f64,
}

/// How a case ended.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Status {
    /// Ran and compared.
    Ok,
    /// Not runnable yet, for this reason.
    Pending {
        /// Why.
        reason: String,
    },
    /// Could not run: the error.
    Failed {
        /// What went wrong.
        error: String,
    },
}

/// One case's result.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    /// `family/case`.
    pub id: String,
    /// The family's id.
    pub family: String,
    /// The family's kind.
    pub kind: &'static str,
    /// Where the measurement comes from: the case's place in the family's source.
    pub source: String,
    /// The family's unit.
    pub unit: String,
    /// GPUs of the job (ranks of a collective; none for a kernel table).
    pub gpus: Option<u32>,
    /// What ran: the strategy, the collective, the kernel kind.
    pub strategy: String,
    /// Ran, pending or failed.
    #[serde(flatten)]
    pub status: Status,
    /// Measured (a multi-point case: the sum of its points).
    pub measured: Option<f64>,
    /// Simulated (a multi-point case: the sum of its points).
    pub simulated: Option<f64>,
    /// (simulated - measured) / measured (a multi-point case: the mean over its points).
    pub error: Option<f64>,
    /// The accuracy (a multi-point case: the mean over its points).
    pub accuracy: Option<f64>,
    /// Every measured point (one for a single-value case).
    pub points: Vec<Point>,
    /// The case's and its family's caveats.
    pub caveats: Vec<String>,
    /// Its ranking group, if any.
    pub ranking: Option<String>,
    /// The measurement in each environment it was measured in (the case's `measured-in`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub measured_in: BTreeMap<String, f64>,
    /// Test or calibration (with the fitted constants' ids), from data/validation/fitted.toml.
    #[serde(flatten)]
    pub role: Role,
    /// Other models' published predictions, each set against the measurement.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub predictions: Vec<PredictionResult>,
    /// Wall time of the simulation, seconds (left out of the JSON: not deterministic).
    #[serde(skip)]
    pub wall_s: f64,
}

/// Another model's prediction of a case, and how close it came to the measurement.
#[derive(Debug, Clone, Serialize)]
pub struct PredictionResult {
    /// The model, as the case file names it.
    pub model: String,
    /// Its predicted value, in the family's unit.
    pub value: f64,
    /// Its accuracy against the measurement, by the suite's rule ([`accuracy`]).
    pub accuracy: f64,
}

/// What a run produced, before it is set against the measurement.
struct Simulated {
    gpus: Option<u32>,
    strategy: String,
    points: Vec<Point>,
}

/// Runs `case` of `family`.
pub fn run_case(family: &Family, case: &CaseEntry, paths: &Paths) -> CaseResult {
    let started = Instant::now();
    let mut caveats = family.header.caveats.clone();
    caveats.extend(case.caveats.iter().cloned());
    let mut result = CaseResult {
        id: family.case_id(case),
        family: family.header.id.clone(),
        kind: family.header.kind.name(),
        source: case.source.clone(),
        unit: family.header.unit.clone(),
        gpus: None,
        strategy: String::new(),
        status: Status::Ok,
        measured: case.measured,
        simulated: None,
        error: None,
        accuracy: None,
        points: Vec::new(),
        caveats,
        ranking: case.ranking.clone(),
        measured_in: case.measured_in.clone(),
        role: case.role.clone(),
        predictions: case
            .measured
            .map(|measured| {
                case.predictions
                    .iter()
                    .map(|p| PredictionResult {
                        model: p.model.clone(),
                        value: p.value,
                        accuracy: accuracy(p.value, measured),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        wall_s: 0.0,
    };
    if let Some(reason) = &case.pending {
        result.status = Status::Pending { reason: reason.clone() };
        return result;
    }
    let outcome = match family.header.kind {
        Kind::Iteration => iteration(family, case, paths),
        Kind::Scaling => scaling(family, case, paths),
        Kind::NcclTests => nccl_tests(family, case, paths),
        Kind::Deepbench => deepbench(family, case, paths),
        Kind::Replay => replayed(family, case, paths),
        Kind::Layer => layer(family, case, paths),
        Kind::Memory => memory(family, case, paths),
    };
    result.wall_s = started.elapsed().as_secs_f64();
    match outcome {
        Ok(simulated) => {
            result.gpus = simulated.gpus;
            result.strategy = simulated.strategy;
            let points = simulated.points;
            if points.is_empty() {
                result.status = Status::Failed { error: "no measured point to compare with".into() };
                return result;
            }
            let n = points.len() as f64;
            result.measured = Some(points.iter().map(|p| p.measured).sum());
            result.simulated = Some(points.iter().map(|p| p.simulated).sum());
            result.error =
                Some(points.iter().map(|p| (p.simulated - p.measured) / p.measured).sum::<f64>() / n);
            result.accuracy = Some(points.iter().map(|p| p.accuracy).sum::<f64>() / n);
            result.points = points;
        }
        Err(error) => result.status = Status::Failed { error },
    }
    result
}

/// How heavy `case` is to run, for the runner ([`crate::suite::run`]) to keep heavy cases
/// apart: a lower bound of the ops of the largest graph it lowers
/// ([`strategies::Strategy::ops_lower_bound`]), whose memory grows with it; 0 for a case that
/// lowers no strategy (a collective, a kernel table, a trace, a memory estimate) or one
/// whose scenario does not parse (its run reports why).
pub fn case_weight(family: &Family, case: &CaseEntry, paths: &Paths) -> u64 {
    if case.pending.is_some() || !matches!(family.header.kind, Kind::Iteration | Kind::Scaling) {
        return 0;
    }
    // A scaling case runs its baseline after its large run, one at a time: the large one
    // weighs.
    scenario_table(family, case, paths)
        .and_then(|(table, anchor)| scenario_of(&table, &anchor, "case's"))
        .ok()
        .and_then(|scenario| scenario.strategy().ops_lower_bound().ok())
        .unwrap_or(0)
}

fn point(label: impl Into<String>, measured: f64, simulated: f64) -> Point {
    Point { label: label.into(), measured, simulated, accuracy: accuracy(simulated, measured) }
}

/// The case's scenario keys: the family's, then the scenario file's, then the case's own;
/// with the path relative files in it resolve against.
fn scenario_table(
    family: &Family,
    case: &CaseEntry,
    paths: &Paths,
) -> Result<(toml::Table, PathBuf), String> {
    let mut table = family.header.scenario.clone().unwrap_or_default();
    let mut anchor = family.file.clone();
    if let Some(file) = &case.scenario_file {
        let path = paths.resolve(file, &family.file).map_err(|e| format!("scenario-file: {e}"))?;
        let text = fs_err::read_to_string(&path).map_err(|e| format!("scenario-file: {e}"))?;
        let from_file: toml::Table =
            toml::from_str(&text).map_err(|e| format!("scenario-file {}: {e}", path.display()))?;
        merge(&mut table, &from_file);
        anchor = path;
    }
    if let Some(own) = &case.scenario {
        merge(&mut table, own);
    }
    // Files the scenario names resolve against `anchor`; in a suite they must stay in its tree
    // as the suite's own paths do (`--profile` files, the user's own, are applied after).
    for key in ["workload.model", "compute.profile"] {
        if let Some(toml::Value::String(text)) = leaf(&table, key)
            && (text.contains(['/', '\\']) || text.ends_with(".toml"))
        {
            crate::case::check_within_suite(text, anchor.parent().unwrap_or(Path::new(".")), &family.file)
                .map_err(|e| format!("{key}: {e}"))?;
        }
    }
    for (key, families) in &paths.without {
        if families.contains(&family.header.id) {
            remove_key(&mut table, key);
        }
    }
    for (key, families, factor) in &paths.scale {
        if families.contains(&family.header.id)
            && let Some(value) = leaf_mut(&mut table, key)
        {
            *value = scaled(value, *factor)
                .ok_or_else(|| format!("--scale-fitted: {key} = {value} is not a number or a quantity"))?;
        }
    }
    apply_profiles(&mut table, &paths.profiles);
    Ok((table, anchor))
}

/// The value at dotted key `key` of `table`, if there.
fn leaf<'t>(table: &'t toml::Table, key: &str) -> Option<&'t toml::Value> {
    match key.split_once('.') {
        None => table.get(key),
        Some((head, rest)) => match table.get(head)? {
            toml::Value::Table(inner) => leaf(inner, rest),
            _ => None,
        },
    }
}

/// The value at dotted key `key` of `table`, if there.
fn leaf_mut<'t>(table: &'t mut toml::Table, key: &str) -> Option<&'t mut toml::Value> {
    match key.split_once('.') {
        None => table.get_mut(key),
        Some((head, rest)) => match table.get_mut(head)? {
            toml::Value::Table(inner) => leaf_mut(inner, rest),
            _ => None,
        },
    }
}

/// `value` multiplied by `factor`: a number, or a string that starts with one (`"1.68 GB/s"`,
/// `"3.5 us"`), whose unit is kept; `None` for anything else.
fn scaled(value: &toml::Value, factor: f64) -> Option<toml::Value> {
    match value {
        toml::Value::Integer(i) => Some(toml::Value::Float(*i as f64 * factor)),
        toml::Value::Float(x) => Some(toml::Value::Float(x * factor)),
        toml::Value::String(text) => {
            let (number, unit) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
            let scaled = number.parse::<f64>().ok()? * factor;
            Some(toml::Value::String(if unit.is_empty() {
                format!("{scaled}")
            } else {
                format!("{scaled} {unit}")
            }))
        }
        _ => None,
    }
}

/// Takes dotted key `key` out of `table` (nothing if it is not there), and the tables it
/// leaves empty.
fn remove_key(table: &mut toml::Table, key: &str) {
    match key.split_once('.') {
        None => {
            table.remove(key);
        }
        Some((head, rest)) => {
            if let Some(toml::Value::Table(inner)) = table.get_mut(head) {
                remove_key(inner, rest);
                if inner.is_empty() {
                    table.remove(head);
                }
            }
        }
    }
}

/// Sets `compute.profile` to the first of `profiles` made for the scenario's device type (the
/// same device, or one the catalog says computes the same), leaving the case's own
/// `compute.cuda-graphs` and `compute.fusion`.
fn apply_profiles(table: &mut toml::Table, profiles: &[(String, String)]) {
    let Some(device) = table.get("cluster").and_then(|c| c.get("device")).and_then(toml::Value::as_str)
    else {
        return;
    };
    let catalog = DeviceCatalog::builtin();
    let Ok(device) = catalog.get(device) else { return }; // the scenario names the error
    if let Some((_, name)) =
        profiles.iter().find(|(calibrated_on, _)| catalog.same_type(calibrated_on, device))
    {
        // A `compute` that is not a table is the scenario's error to name.
        let _ = Override::new("compute.profile", name.as_str()).apply(table);
    }
}

fn scenario_of(table: &toml::Table, anchor: &Path, label: &str) -> Result<Scenario, String> {
    let text = toml::to_string(table).map_err(|e| format!("writing the {label} scenario: {e}"))?;
    Scenario::parse(&text, anchor).map_err(|e| format!("the {label} scenario: {e}"))
}

/// The parallel degrees of a case's run, as the report's "what ran" column shows them
/// (`DP8 TP2 PP4 v3 SP ZeRO-1`).
fn describe_strategy(p: &strategies::Parallelism) -> String {
    let mut parts = vec![format!("DP{}", p.data)];
    for (name, value) in [
        ("TP", p.tensor),
        ("PP", p.pipeline),
        ("CP", p.context),
        ("EP", p.expert),
        ("filter", p.filter),
        ("channel", p.channel),
        ("spatial", p.spatial),
    ] {
        if value > 1 {
            parts.push(format!("{name}{value}"));
        }
    }
    let mut text = parts.join(" ");
    if p.virtual_stages > 1 {
        text += &format!(" v{}", p.virtual_stages);
    }
    if p.sequence_parallel {
        text += " SP";
    }
    if p.zero > 0 {
        text += &format!(" ZeRO-{}", p.zero);
    }
    text
}

/// The iteration and scaling cases read the iteration time and throughput alone: the run
/// keeps no per-op timeline and skips the breakdowns ([`simulate_iteration_times`]).
fn run_scenario(scenario: &Scenario) -> Result<Summary, String> {
    simulate_iteration_times(scenario).map_err(|e| e.to_string())
}

fn iteration(family: &Family, case: &CaseEntry, paths: &Paths) -> Result<Simulated, String> {
    let (table, anchor) = scenario_table(family, case, paths)?;
    let scenario = scenario_of(&table, &anchor, "case's")?;
    let summary = run_scenario(&scenario)?;
    let mut simulated = summary.iteration_time.as_secs_f64();
    if family.header.unit == "s/epoch" {
        simulated *= case.iterations_per_epoch.ok_or("iterations-per-epoch is missing")?;
    }
    let measured = case.measured.ok_or("measured is missing")?;
    Ok(Simulated {
        gpus: Some(summary.cluster.gpus),
        strategy: describe_strategy(&scenario.parallelism),
        points: vec![point(family.header.unit.clone(), measured, simulated)],
    })
}

/// Memory cases: the memory model's peak on the most loaded pipeline stage (as `parasim run`
/// reports it, without the simulation, and whether it fits or not), or one part of it, in the
/// family's unit.
fn memory(family: &Family, case: &CaseEntry, paths: &Paths) -> Result<Simulated, String> {
    let (table, anchor) = scenario_table(family, case, paths)?;
    let scenario = scenario_of(&table, &anchor, "case's")?;
    let estimate = scenario
        .strategy()
        .estimate(&|_| SimDuration::ZERO)
        .map_err(|e| format!("{}: {e}", scenario.source))?;
    let peak = estimate.peak_memory();
    let part = case.part.as_deref().unwrap_or("allocated");
    let bytes = match part {
        "allocated" => peak.total(),
        "activations" => peak.activations,
        "model-states" => Bytes(peak.weights.0 + peak.gradients.0 + peak.optimizer.0),
        other => return Err(format!("part {other:?}; valid: {}", crate::case::MEMORY_PARTS.join(", "))),
    };
    let scale = if family.header.unit == "GiB" { f64::from(1u32 << 30) } else { 1e9 };
    let measured = case.measured.ok_or("measured is missing")?;
    Ok(Simulated {
        gpus: Some(scenario.cluster.nodes * scenario.cluster.gpus_per_node),
        strategy: format!(
            "{}, {} recompute, {part}",
            describe_strategy(&scenario.parallelism),
            scenario.recompute
        ),
        points: vec![point(format!("{part} {}", family.header.unit), measured, bytes.as_f64() / scale)],
    })
}

fn scaling(family: &Family, case: &CaseEntry, paths: &Paths) -> Result<Simulated, String> {
    let (table, anchor) = scenario_table(family, case, paths)?;
    let mut baseline = table.clone();
    apply(&mut baseline, &Override::all_of(case.baseline.as_ref().ok_or("baseline is missing")?))
        .map_err(|e| format!("baseline: {e}"))?;
    let large_scenario = scenario_of(&table, &anchor, "case's")?;
    let large = run_scenario(&large_scenario)?;
    let small = run_scenario(&scenario_of(&baseline, &anchor, "baseline")?)?;
    let per_gpu = |s: &Summary| s.samples_per_second / f64::from(s.cluster.gpus);
    let efficiency = per_gpu(&large) / per_gpu(&small);
    let measured = case.measured.ok_or("measured is missing")?;
    Ok(Simulated {
        gpus: Some(large.cluster.gpus),
        strategy: format!(
            "{} vs {} GPUs",
            describe_strategy(&large_scenario.parallelism),
            small.cluster.gpus
        ),
        points: vec![point("efficiency", measured, efficiency)],
    })
}

/// nccl-tests cases run as `parasim collective` does by default: the flow network, NCCL's
/// tuner, its launch cost, 1 MiB chunks, 4 us per host launch.
fn nccl_tests(family: &Family, case: &CaseEntry, paths: &Paths) -> Result<Simulated, String> {
    let (table, anchor) = scenario_table(family, case, paths)?;
    let text = toml::to_string(&table).map_err(|e| e.to_string())?;
    let cluster = Cluster::parse(&text, &anchor).map_err(|e| e.to_string())?;
    let log = paths
        .resolve(case.log.as_deref().ok_or("log is missing")?, &family.file)
        .map_err(|e| format!("log: {e}"))?;
    let log_text =
        fs_err::read_to_string(&log).map_err(|e| format!("{e} (the shared data folder: --shared)"))?;
    let measured = traces::nccl::parse_tests_output(&log_text, &log).map_err(|e| e.to_string())?;
    let gpus = cluster.spec.nodes.saturating_mul(cluster.spec.gpus_per_node);
    let ranks = case.ranks.or(measured.ranks).unwrap_or(gpus);
    let gpus_per_process = case.gpus_per_process.or(measured.gpus_per_process).unwrap_or(1);
    let network = NetworkSettings::new(Fidelity::Flow)
        .with_collective_launch(SimDuration::from_ns(8_400))
        .with_chunk(Bytes(1 << 20))
        .with_protocols(ProtocolChoice::Auto);
    let name = case.collective.as_deref().ok_or("collective is missing")?;
    let bench = CollectiveBench::new(
        &cluster,
        name,
        BenchSettings {
            ranks,
            algorithm: CollectiveAlgorithm::Auto,
            network,
            host_launch: SimDuration::from_us(4),
            gpus_per_process,
        },
    )
    .map_err(|e| e.to_string())?;
    let mut points = Vec::new();
    for (&bytes, row) in &measured.rows {
        let simulated = bench.time(bytes).map_err(|e| e.to_string())?;
        points.push(point(format!("{bytes} B"), row.time_us * 1e-6, simulated.seconds));
    }
    Ok(Simulated { gpus: Some(ranks), strategy: bench.collective().kind.name().to_string(), points })
}

/// DeepBench cases: every kernel of the table priced by the default compute model, with every
/// convolution algorithm available as DeepBench times them all and keeps the fastest.
fn deepbench(family: &Family, case: &CaseEntry, paths: &Paths) -> Result<Simulated, String> {
    let path = paths
        .resolve(case.table.as_deref().ok_or("table is missing")?, &family.file)
        .map_err(|e| format!("table: {e}"))?;
    let text =
        fs_err::read_to_string(&path).map_err(|e| format!("{e} (the shared data folder: --shared)"))?;
    let device_name = case.device.as_deref().ok_or("device is missing")?;
    let device = DeviceCatalog::builtin().get(device_name).map_err(|e| format!("device: {e}"))?;
    let dtype = match case.precision.as_deref() {
        Some("fp16") => Dtype::Fp16,
        _ => Dtype::Fp32,
    };
    let operation = case.operation.as_deref().unwrap_or("gemm");
    let samples = if operation == "gemm" {
        let rows =
            workloads::deepbench::parse_gemms(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        workloads::deepbench::samples(device, &rows, &[], dtype)
    } else {
        let rows =
            workloads::deepbench::parse_convs(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        workloads::deepbench::samples(device, &[], &rows, dtype)
    };
    let model = ComputeModel { winograd_convolutions: true, ..ComputeModel::default() };
    let mut points = Vec::with_capacity(samples.len());
    for (index, sample) in samples.iter().enumerate() {
        let predicted = workloads::calibrate::predict(&model, device, sample).map_err(|e| e.to_string())?;
        points.push(point(format!("{operation} {}", index + 1), sample.measured_s, predicted));
    }
    Ok(Simulated { gpus: None, strategy: format!("{operation} kernels"), points })
}

/// A transformer block's forward and backward time inside a simulated iteration, on rank 0:
/// from the start of the block's first op to the start of the next block's (forward) or of
/// the previous block's (backward, recomputation included), so the block's tensor-parallel
/// communication and any wait inside it count, as in a per-layer timing of a real run.
fn layer(family: &Family, case: &CaseEntry, paths: &Paths) -> Result<Simulated, String> {
    let (table, anchor) = scenario_table(family, case, paths)?;
    let scenario = scenario_of(&table, &anchor, "case's")?;
    let outcome = simulate(&scenario).map_err(|e| e.to_string())?;
    let block = case.layer.ok_or("layer is missing")?;
    let starts = block_starts(&outcome.graph, &outcome.timeline, block);
    let span = |from: Option<SimTime>, to: Option<SimTime>, what: &str| match (from, to) {
        (Some(from), Some(to)) if to > from => Ok(to.saturating_since(from).as_secs_f64() * 1e3),
        _ => Err(format!(
            "layer {block}: the model has no {what} of blocks layers.{} to layers.{} on rank 0 \
             (the block timed needs a block on each side)",
            block - 1,
            block + 1
        )),
    };
    let forward = span(starts.forward[1], starts.forward[2], "forward")?;
    let backward = span(starts.backward[1], starts.backward[0], "backward")?;
    Ok(Simulated {
        gpus: Some(scenario.cluster.nodes * scenario.cluster.gpus_per_node),
        strategy: describe_strategy(&scenario.parallelism),
        points: vec![
            point("forward", case.forward.ok_or("forward is missing")?, forward),
            point("backward", case.backward.ok_or("backward is missing")?, backward),
        ],
    })
}

/// The first start on rank 0 of blocks `block - 1`, `block` and `block + 1` (index 0, 1, 2),
/// in the forward pass and in the backward pass (recomputation, backward-data, backward-weight).
struct BlockStarts {
    forward: [Option<SimTime>; 3],
    backward: [Option<SimTime>; 3],
}

fn block_starts(
    graph: &sim_core::graph::ExecGraph,
    timeline: &sim_core::exec::Timeline,
    block: u32,
) -> BlockStarts {
    let mut starts = BlockStarts { forward: [None; 3], backward: [None; 3] };
    for (index, op) in graph.ops().iter().enumerate() {
        if op.rank.0 != 0 {
            continue;
        }
        // A layer's kernel, by its metadata.
        if !matches!(op.kind, OpKind::Compute { .. }) || op.meta.work() != Work::Device {
            continue;
        }
        let Some(name) = op.meta.layer().and_then(|layer| graph.layer_name(layer)) else { continue };
        let Some(rest) = name.strip_prefix("layers.") else { continue };
        let Some((number, _)) = rest.split_once('.') else { continue };
        let Ok(number) = number.parse::<u32>() else { continue };
        let Some(slot) = (number + 1).checked_sub(block).filter(|slot| *slot < 3) else { continue };
        let phase = match op.meta.pass() {
            Some(Pass::Forward) => &mut starts.forward,
            Some(Pass::Recompute | Pass::BackwardData | Pass::BackwardWeight) => &mut starts.backward,
            _ => continue,
        };
        let start = timeline.start[index];
        let first = &mut phase[slot as usize];
        *first = Some(first.map_or(start, |known: SimTime| known.min(start)));
    }
    starts
}

/// Replay cases run as `parasim replay` does by default: the analytical network, no extra
/// launch cost (the traced NCCL kernels include theirs), on the cluster the trace implies.
fn replayed(family: &Family, case: &CaseEntry, paths: &Paths) -> Result<Simulated, String> {
    let mut traces = Vec::new();
    let mut scratch = Vec::new();
    for path in case.traces.iter().map(|t| paths.resolve(t, &family.file).map_err(|e| format!("traces: {e}")))
    {
        let path = path?;
        if !path.exists() {
            return Err(format!("{} is missing (the shared data folder: --shared)", path.display()));
        }
        if is_archive(&path) {
            let directory = unpack(&path, &family.case_id(case))?;
            scratch.push(directory.clone());
            // An archive of one folder (dlrm_kineto/...): the traces are in that folder.
            let entries: Vec<PathBuf> = fs_err::read_dir(&directory)
                .map_err(|e| e.to_string())?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .collect();
            match entries.as_slice() {
                [only] if only.is_dir() => traces.push(only.clone()),
                _ => traces.push(directory),
            }
        } else {
            traces.push(path);
        }
    }
    let outcome = replay_traces(family, case, paths, traces);
    for directory in scratch {
        let _ = fs_err::remove_dir_all(directory);
    }
    outcome
}

fn is_archive(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    name.ends_with(".tar.gz") || name.ends_with(".tgz")
}

/// Unpacks a `.tar.gz` of traces (as repositories publish multi-rank traces) into a fresh
/// scratch folder, removed after the replay.
fn unpack(archive: &Path, id: &str) -> Result<PathBuf, String> {
    let directory = std::env::temp_dir().join(format!(
        "parasim-validate-{}-{}",
        std::process::id(),
        id.replace(['/', '.'], "-")
    ));
    let _ = fs_err::remove_dir_all(&directory);
    fs_err::create_dir_all(&directory).map_err(|e| e.to_string())?;
    let file = fs_err::File::open(archive).map_err(|e| e.to_string())?;
    tar::Archive::new(flate2::read::GzDecoder::new(file))
        .unpack(&directory)
        .map_err(|e| format!("unpacking {}: {e}", archive.display()))?;
    Ok(directory)
}

fn replay_traces(
    family: &Family,
    case: &CaseEntry,
    paths: &Paths,
    traces: Vec<PathBuf>,
) -> Result<Simulated, String> {
    let cluster = match &case.scenario {
        Some(_) => {
            let (table, anchor) = scenario_table(family, case, paths)?;
            let text = toml::to_string(&table).map_err(|e| e.to_string())?;
            Some(Cluster::parse(&text, &anchor).map_err(|e| e.to_string())?)
        }
        None => None,
    };
    let run = replay(&ReplayRequest {
        traces,
        cluster,
        device: case.device.clone(),
        network: NetworkSettings::new(Fidelity::Analytical).with_chunk(Bytes(1 << 20)),
        protocols: None,
        ranks: None,
        rank: None,
        kineto: Vec::new(),
    })
    .map_err(|e| e.to_string())?;
    let comparison = &run.comparison;
    let (measured, simulated) = comparison.steady_mean_s.unwrap_or(comparison.mean_s);
    if comparison.steps.is_empty() {
        return Err("the trace marks no iteration (no ProfilerStep#N)".into());
    }
    Ok(Simulated {
        gpus: Some(run.ranks),
        strategy: format!("replay ({} traced)", run.loaded.trace.ranks.len()),
        points: vec![point("iteration", measured, simulated)],
    })
}
