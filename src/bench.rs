//! `parasim bench`: wall time and events per second of standard scenarios on this machine.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use scenario::simulation::simulate;
use scenario::{Override, QUICKSTART, Scenario, ValidationCache, get_dotted};
use serde::Serialize;
use sim_core::fidelity::Fidelity;

/// One benchmarked configuration.
#[derive(Debug, Clone)]
pub struct Measurement {
    gpus: u32,
    /// The network model, where the table names it.
    fidelity: Option<Fidelity>,
    ops: usize,
    events: u64,
    lowering: Duration,
    simulation: Duration,
}

/// The fastest of `repeats` simulations of `scenario`.
fn fastest(scenario: &Scenario, gpus: u32, repeats: u32) -> anyhow::Result<Measurement> {
    let mut best: Option<Measurement> = None;
    for _ in 0..repeats.max(1) {
        let outcome = simulate(scenario)?;
        let measurement = Measurement {
            gpus,
            fidelity: None,
            ops: outcome.summary.engine.ops,
            events: outcome.summary.engine.events,
            lowering: outcome.lowering_wall,
            simulation: outcome.simulation_wall,
        };
        if best
            .as_ref()
            .is_none_or(|b| measurement.lowering + measurement.simulation < b.lowering + b.simulation)
        {
            best = Some(measurement);
        }
    }
    best.ok_or_else(|| anyhow::anyhow!("no run"))
}

/// Runs the quickstart (ResNet-50, data parallel, A100 servers of 8) at each GPU count,
/// `repeats` times, keeping the fastest run.
pub fn run(gpu_counts: &[u32], repeats: u32) -> anyhow::Result<Vec<Measurement>> {
    let file = Path::new("scenarios/quickstart.toml");
    let base: toml::Table = toml::from_str(QUICKSTART).context("the quickstart")?;
    let cache = ValidationCache::default();
    let mut rows = Vec::new();
    for &gpus in gpu_counts {
        anyhow::ensure!(
            gpus > 0 && gpus % 8 == 0,
            "--gpus {gpus}: the benchmark uses servers of 8 GPUs, so give a multiple of 8"
        );
        // Its batch is per device: the global batch grows with the GPUs.
        let overrides = [Override::new("cluster.nodes", gpus / 8), Override::new("parallelism.data", gpus)];
        let scenario = Scenario::from_table_with(&base, &overrides, file, &cache)?;
        rows.push(fastest(&scenario, gpus, repeats)?);
    }
    Ok(rows)
}

/// The quickstart table of [`run`]'s measurements.
pub fn run_table(rows: &[Measurement], repeats: u32) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "ResNet-50 data parallel, analytical network, one iteration; fastest of {} runs",
        repeats.max(1)
    );
    table(&mut out, "", rows);
    out
}

/// The GPT-3 175B scenario the strategy benchmark scales.
const GPT3_1024: &str = include_str!("../scenarios/gpt3-175b-1024.toml");

/// Runs the GPT-3 175B Megatron scenario (tensor 8 x pipeline 16, 1F1B, symmetric ranks folded)
/// at each (GPUs, fidelity) of `configurations` on one non-blocking switch, `repeats` times,
/// keeping the fastest.
pub fn strategies(configurations: &[(u32, Fidelity)], repeats: u32) -> anyhow::Result<Vec<Measurement>> {
    let file = Path::new("scenarios/gpt3-175b-1024.toml");
    let base: toml::Table = toml::from_str(GPT3_1024).context("the GPT-3 scenario")?;
    // One non-blocking switch with the fat-tree's links.
    let mut switch = toml::Table::new();
    switch.insert("topology".into(), "switch".into());
    for key in ["link-bandwidth", "link-latency"] {
        let value = get_dotted(&base, &format!("cluster.network.{key}"))
            .with_context(|| format!("{} is expected to give cluster.network.{key}", file.display()))?;
        switch.insert(key.into(), value.clone());
    }
    let cache = ValidationCache::default();
    let mut rows = Vec::new();
    for &(gpus, fidelity) in configurations {
        anyhow::ensure!(
            gpus > 0 && gpus % 128 == 0,
            "the GPT-3 benchmark needs a multiple of 128 GPUs, got {gpus}"
        );
        let overrides = [
            Override::new("cluster.nodes", gpus / 8),
            Override::new("cluster.network", switch.clone()),
            Override::new("parallelism.data", gpus / 128),
            Override::new("workload.global-batch", 12 * gpus / 8),
            Override::new("simulation.fidelity", fidelity.name()),
        ];
        let scenario = Scenario::from_table_with(&base, &overrides, file, &cache)?;
        rows.push(Measurement { fidelity: Some(fidelity), ..fastest(&scenario, gpus, repeats)? });
    }
    Ok(rows)
}

/// The GPT-3 table of [`strategies`]' measurements, with the process's peak memory.
pub fn strategies_table(rows: &[Measurement], repeats: u32) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "GPT-3 175B, tensor 8 x pipeline 16 x data GPUs/128, global batch 1.5 x GPUs, micro-batch 1, \
         one iteration on one switch; fastest of {} runs",
        repeats.max(1)
    );
    table(&mut out, "fidelity", rows);
    let mut lines: Vec<String> = out.lines().map(str::to_string).collect();
    for (line, row) in lines.iter_mut().skip(2).zip(rows) {
        line.push_str(&format!("   {}", row.fidelity.map_or("", Fidelity::name)));
    }
    let mut out = lines.join("\n");
    out.push('\n');
    if let Some(peak) = peak_resident_memory() {
        let _ = writeln!(out, "peak resident memory of this process: {:.0} MB", peak as f64 / 1e6);
    }
    out
}

/// A Monte Carlo benchmark: the iterations re-timed and how long the whole run took.
#[derive(Debug, Clone)]
pub struct MonteCarlo {
    gpus: u32,
    iterations: u32,
    /// Nodes re-timed per iteration (the graph's ops, a collective counted once).
    ops: usize,
    /// Lowering and the noise-free simulation of the one iteration re-timed.
    setup: Duration,
    /// The re-timing of every iteration, draws included.
    retiming: Duration,
}

/// The GPUs of the Monte Carlo benchmark.
const MONTE_CARLO_GPUS: u32 = 1024;

/// The straggler tour (docs/variability.md), whose `[variability]` the Monte Carlo benchmark
/// takes: 1% of the GPUs 1.2x slower, 5% lognormal noise on every kernel.
const STRAGGLERS: &str = include_str!("../scenarios/variability/stragglers-4096.toml");

/// Times `iterations` Monte Carlo iterations (none: `None`) of the quickstart on 1,024 GPUs
/// with the straggler tour's variability ([`STRAGGLERS`]); the fastest of `repeats` runs.
pub fn monte_carlo(iterations: u32, repeats: u32) -> anyhow::Result<Option<MonteCarlo>> {
    if iterations == 0 {
        return Ok(None);
    }
    let file = Path::new("scenarios/quickstart.toml");
    let mut base: toml::Table = toml::from_str(QUICKSTART).context("the quickstart")?;
    let tour: toml::Table = toml::from_str(STRAGGLERS).context("the straggler tour")?;
    let variability = tour.get("variability").context("the straggler tour has a [variability] section")?;
    base.insert("variability".into(), variability.clone());
    let overrides = [
        Override::new("cluster.nodes", MONTE_CARLO_GPUS / 8),
        Override::new("parallelism.data", MONTE_CARLO_GPUS),
        Override::new("simulation.iterations", iterations),
        Override::new("simulation.seed", 1),
    ];
    let scenario = Scenario::from_table_with(&base, &overrides, file, &ValidationCache::default())?;
    let mut best: Option<MonteCarlo> = None;
    for _ in 0..repeats.max(1) {
        let outcome = simulate(&scenario)?;
        let retiming = outcome.monte_carlo_wall.context("the benchmark's run was not a Monte Carlo run")?;
        let run = MonteCarlo {
            gpus: MONTE_CARLO_GPUS,
            iterations,
            ops: outcome.summary.engine.ops,
            setup: outcome.lowering_wall + outcome.simulation_wall,
            retiming,
        };
        if best.as_ref().is_none_or(|b| run.setup + run.retiming < b.setup + b.retiming) {
            best = Some(run);
        }
    }
    Ok(best)
}

/// The Monte Carlo table of [`monte_carlo`]'s measurement.
pub fn monte_carlo_table(run: &MonteCarlo, repeats: u32) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Monte Carlo: ResNet-50 data parallel, 1% of GPUs 1.2x slower, 5% lognormal kernel noise; fastest of {} runs",
        repeats.max(1)
    );
    let _ = writeln!(
        out,
        "{:>6} {:>10} {:>10} {:>12} {:>14} {:>12} {:>16}",
        "GPUs", "iterations", "ops", "setup", "re-timing", "total", "ops re-timed/s"
    );
    let retiming = run.retiming.as_secs_f64();
    let _ = writeln!(
        out,
        "{:>6} {:>10} {:>10} {:>9.1} ms {:>11.1} ms {:>9.1} ms {:>14.1} M",
        run.gpus,
        run.iterations,
        run.ops,
        run.setup.as_secs_f64() * 1e3,
        retiming * 1e3,
        (run.setup + run.retiming).as_secs_f64() * 1e3,
        run.ops as f64 * f64::from(run.iterations) / retiming.max(1e-9) / 1e6
    );
    out
}

/// The Monte Carlo benchmark in `parasim bench --json`.
#[derive(Debug, Serialize)]
struct MonteCarloJson {
    gpus: u32,
    iterations: u32,
    ops: usize,
    setup_s: f64,
    retiming_s: f64,
    total_s: f64,
}

/// One configuration of `parasim bench --json`.
#[derive(Debug, Serialize)]
struct MeasurementJson {
    gpus: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    fidelity: Option<&'static str>,
    ops: usize,
    events: u64,
    lowering_s: f64,
    simulation_s: f64,
    total_s: f64,
    events_per_s: f64,
}

impl From<&Measurement> for MeasurementJson {
    fn from(row: &Measurement) -> MeasurementJson {
        let simulation = row.simulation.as_secs_f64();
        MeasurementJson {
            gpus: row.gpus,
            fidelity: row.fidelity.map(Fidelity::name),
            ops: row.ops,
            events: row.events,
            lowering_s: row.lowering.as_secs_f64(),
            simulation_s: simulation,
            total_s: (row.lowering + row.simulation).as_secs_f64(),
            events_per_s: row.events as f64 / simulation.max(1e-9),
        }
    }
}

/// `parasim bench --json`: both tables (wall-clock figures: they vary from run to run).
#[derive(Debug, Serialize)]
struct BenchJson {
    /// Runs per configuration; the fastest is reported.
    repeats: u32,
    /// ResNet-50 data parallel, analytical network, one iteration.
    quickstart: Vec<MeasurementJson>,
    /// GPT-3 175B, tensor 8 x pipeline 16, one iteration on one switch.
    gpt3_175b: Vec<MeasurementJson>,
    /// Monte Carlo iterations of the quickstart on 1,024 GPUs with variability, if timed.
    monte_carlo: Option<MonteCarloJson>,
    /// Peak resident memory of the process (Linux), in bytes.
    peak_resident_memory_bytes: Option<u64>,
}

/// Every benchmark's results as JSON.
pub fn json(
    quickstart: &[Measurement],
    gpt3: &[Measurement],
    monte_carlo: Option<&MonteCarlo>,
    repeats: u32,
) -> anyhow::Result<String> {
    let report = BenchJson {
        repeats: repeats.max(1),
        quickstart: quickstart.iter().map(MeasurementJson::from).collect(),
        gpt3_175b: gpt3.iter().map(MeasurementJson::from).collect(),
        monte_carlo: monte_carlo.map(|run| MonteCarloJson {
            gpus: run.gpus,
            iterations: run.iterations,
            ops: run.ops,
            setup_s: run.setup.as_secs_f64(),
            retiming_s: run.retiming.as_secs_f64(),
            total_s: (run.setup + run.retiming).as_secs_f64(),
        }),
        peak_resident_memory_bytes: peak_resident_memory(),
    };
    Ok(serde_json::to_string_pretty(&report).context("writing JSON")? + "\n")
}

/// The process's peak resident set size in bytes (Linux: `VmHWM` in /proc/self/status).
pub(crate) fn peak_resident_memory() -> Option<u64> {
    let status = fs_err::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kilobytes: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kilobytes * 1024)
}

/// Appends the header (with `extra` as a last column title) and one line per measurement.
fn table(out: &mut String, extra: &str, rows: &[Measurement]) {
    let _ = writeln!(
        out,
        "{:>6} {:>10} {:>10} {:>12} {:>14} {:>12} {:>14}{}",
        "GPUs",
        "ops",
        "events",
        "lowering",
        "simulation",
        "total",
        "events/s",
        if extra.is_empty() { String::new() } else { format!("   {extra}") }
    );
    for row in rows {
        let simulation = row.simulation.as_secs_f64();
        let _ = writeln!(
            out,
            "{:>6} {:>10} {:>10} {:>9.1} ms {:>11.1} ms {:>9.1} ms {:>11.1} M",
            row.gpus,
            row.ops,
            row.events,
            row.lowering.as_secs_f64() * 1e3,
            simulation * 1e3,
            (row.lowering + row.simulation).as_secs_f64() * 1e3,
            row.events as f64 / simulation.max(1e-9) / 1e6
        );
    }
}
