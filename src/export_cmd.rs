//! `parasim export --chakra DIR SCENARIO`: the scenario's lowered iteration as Chakra
//! execution traces (one `.et` file per rank) for ASTRA-sim; docs/chakra.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use scenario::Scenario;
use sim_core::graph::{OpId, OpKind};

/// Each compute op's FLOPs: the per-layer table's FLOPs per iteration of each (stage, layer,
/// pass), shared among the rank's ops of that layer and pass in proportion to their durations
/// (a layer's pass may be several kernels, or one per micro-batch). Host ops and ops of no
/// layer and pass get none.
fn flops_per_op(scenario: &Scenario, outcome: &scenario::simulation::Outcome) -> anyhow::Result<Vec<f64>> {
    let table = scenario.strategy().kernel_table().context("building the per-layer table")?;
    let graph = &outcome.graph;
    // (stage, layer, pass) -> FLOPs per iteration; (layer, pass) -> stage.
    let mut per_key: BTreeMap<(u32, Option<usize>, &str), f64> = BTreeMap::new();
    let mut stage_of: BTreeMap<(Option<usize>, &str), u32> = BTreeMap::new();
    for row in &table.kernels {
        *per_key.entry((row.stage, row.layer, row.pass.name())).or_default() +=
            row.flops * f64::from(row.runs);
        stage_of.entry((row.layer, row.pass.name())).or_insert(row.stage);
    }
    let key = |op: &sim_core::graph::Op| -> Option<(Option<usize>, &'static str)> {
        if op.meta.work().is_host() || !matches!(op.kind, OpKind::Compute { .. }) {
            return None;
        }
        Some((op.meta.layer().map(|l| l as usize), op.meta.pass()?.name()))
    };
    // Each rank's stage: that of its first op of a layer.
    let mut rank_stage: BTreeMap<u32, u32> = BTreeMap::new();
    for op in graph.ops() {
        if let Some(k) = key(op)
            && k.0.is_some()
            && let Some(&stage) = stage_of.get(&k)
        {
            rank_stage.entry(op.rank.0).or_insert(stage);
        }
    }
    let duration = |op: &sim_core::graph::Op| match op.kind {
        OpKind::Compute { duration } => duration.as_ps() as f64,
        _ => 0.0,
    };
    // (rank, layer, pass) -> total duration of its ops.
    let mut total: BTreeMap<(u32, Option<usize>, &str), f64> = BTreeMap::new();
    for op in graph.ops() {
        if let Some((layer, pass)) = key(op) {
            *total.entry((op.rank.0, layer, pass)).or_default() += duration(op);
        }
    }
    let mut out = vec![0.0; graph.op_count()];
    for (index, op) in graph.ops().iter().enumerate() {
        let Some((layer, pass)) = key(op) else { continue };
        let Some(&stage) = rank_stage.get(&op.rank.0) else { continue };
        let Some(&flops) = per_key.get(&(stage, layer, pass)) else { continue };
        let sum = total.get(&(op.rank.0, layer, pass)).copied().unwrap_or(0.0);
        if sum > 0.0 {
            out[index] = flops * duration(op) / sum;
        }
    }
    Ok(out)
}

/// The most nodes an export writes: every rank's ops are simulated and held at once (GPT-3
/// 175B on 1,024 GPUs, about 70 million, took over 17 GB and 150 s before this bound).
const MAX_EXPORT_NODES: u64 = 5_000_000;

/// Writes the Chakra files of `scenario` to `dir`; returns the report to print.
pub fn chakra(scenario: &Scenario, dir: &Path) -> anyhow::Result<String> {
    // One iteration, every rank with its own ops (folded symmetric ranks have none). Its size
    // is estimated first from the folded simulation, which is cheap.
    let mut scenario = scenario.clone();
    scenario.iterations = 1;
    scenario.fold_symmetric_ranks = true;
    if scenario.iterations > scenario::MAX_ITERATIONS && !scenario.variability.is_active() {
        anyhow::bail!(
            "export: {}: key `simulation.iterations` is {}; an export keeps every op, so at most {} iterations (more are streamed and dropped as they finish)",
            scenario.source,
            scenario.iterations,
            scenario::MAX_ITERATIONS
        );
    }
    let folded = scenario::simulation::simulate(&scenario)?;
    let ranks = u64::from(folded.graph.ranks());
    let simulated: std::collections::BTreeSet<u32> = folded.graph.ops().iter().map(|op| op.rank.0).collect();
    let per_rank = folded.graph.op_count() as u64 / (simulated.len() as u64).max(1);
    let estimate = per_rank.saturating_mul(ranks);
    if estimate > MAX_EXPORT_NODES {
        anyhow::bail!(
            "{}: the export would hold about {estimate} nodes ({per_rank} per rank x {ranks} ranks), more than the {MAX_EXPORT_NODES} it writes; export a smaller job of the same shape (fewer data-parallel replicas: --set parallelism.data=N --set cluster.nodes=M)",
            scenario.source
        );
    }
    scenario.fold_symmetric_ranks = false;
    let outcome =
        if simulated.len() as u64 == ranks { folded } else { scenario::simulation::simulate(&scenario)? };
    let flops = flops_per_op(&scenario, &outcome)?;
    let name = Path::new(&scenario.source)
        .file_stem()
        .map_or_else(|| "parasim".to_string(), |s| s.to_string_lossy().to_string());
    let flops_of = |op: OpId| flops.get(op.0 as usize).copied().unwrap_or(0.0);
    let stats = traces::et::export::write_chakra(&outcome.graph, &outcome.timeline, &flops_of, &name, dir)
        .with_context(|| format!("writing Chakra traces to {}", dir.display()))?;
    let mut out = String::new();
    let ranks = stats.files.len();
    let _ = writeln!(
        out,
        "wrote         {ranks} Chakra ET file{} {}/{name}.{{0..{}}}.et (schema {}) and comm_group.json",
        if ranks == 1 { "" } else { "s" },
        dir.display(),
        ranks.saturating_sub(1),
        traces::et::export::CHAKRA_VERSION
    );
    let types: Vec<String> = stats.by_type.iter().map(|(t, n)| format!("{n} {t}")).collect();
    let _ = writeln!(out, "nodes         {} ({})", stats.nodes, types.join(", "));
    let flops_total: f64 = stats.flops.iter().sum();
    let bytes_total: u64 = stats.comm_bytes.iter().sum();
    let _ = writeln!(
        out,
        "per rank      {:.4e} FLOPs (num_ops), {} bytes communicated (comm_size), rank 0",
        stats.flops.first().copied().unwrap_or(0.0),
        stats.comm_bytes.first().copied().unwrap_or(0)
    );
    let _ = writeln!(out, "all ranks     {flops_total:.4e} FLOPs, {bytes_total} bytes communicated");
    let _ = writeln!(
        out,
        "iteration     {:.6} s simulated (one iteration, symmetric ranks unfolded)",
        outcome.summary.iteration_time.as_secs_f64()
    );
    Ok(out)
}
