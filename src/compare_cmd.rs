//! `parasim compare TRACE SCENARIO`: glue between `traces` (loading), `workloads` (the
//! scenario) and `validation::compare`, and the printed table.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use scenario::Scenario;
use validation::compare::{Comparison, Row};

/// `parasim compare`: returns the report (or JSON) to print.
pub fn compare(trace: &Path, kineto: &[PathBuf], scenario: &Path, json: bool) -> anyhow::Result<String> {
    let scenario = Scenario::load(scenario)?;
    // An execution trace without times is costed on the scenario's device.
    let cost = validation::replay::et_cost(&scenario.device);
    let options = traces::LoadOptions { kineto, cost: Some(&cost), progress: None };
    let loaded = traces::load_with(&[PathBuf::from(trace)], &options)
        .with_context(|| format!("loading the trace {}", trace.display()))?;
    let name = trace.display().to_string();
    let comparison = validation::compare::compare(&loaded.trace, &name, &scenario)?;
    if json {
        let mut text = serde_json::to_string_pretty(&comparison).context("writing JSON")?;
        text.push('\n');
        return Ok(text);
    }
    Ok(human(&name, &comparison))
}

fn millis(seconds: f64) -> String {
    format!("{:.3} ms", seconds * 1e3)
}

fn signed_millis(seconds: f64) -> String {
    format!("{:+.3} ms", seconds * 1e3)
}

fn percent(error: Option<f64>) -> String {
    match error {
        Some(e) if e.is_finite() => format!("{:+.1}%", e * 100.0),
        _ => "n/a".into(),
    }
}

fn count(value: Option<f64>) -> String {
    let value = value.unwrap_or(0.0);
    if value.fract() == 0.0 { format!("{value:.0}") } else { format!("{value:.2}") }
}

fn human(trace: &str, c: &Comparison) -> String {
    let mut out = String::new();
    let traced = &c.trace.traced_ranks;
    let steps: Vec<String> = c.trace.steps.iter().map(|n| format!("#{n}")).collect();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "trace         {trace}: {} ranks, traced {}; {}; ProfilerStep {}",
        c.trace.world_size,
        traced.len(),
        c.trace.device.as_deref().unwrap_or("GPU not recorded"),
        steps.join(", ")
    );
    let s = &c.scenario;
    let _ = writeln!(
        out,
        "scenario      {}: {} on {} x {}, {}{}, {} iteration{} simulated",
        s.scenario,
        s.model,
        s.gpus,
        s.device,
        s.parallelism,
        if s.zero > 0 { format!(", ZeRO-{}", s.zero) } else { String::new() },
        s.iterations,
        if s.iterations == 1 { "" } else { "s" }
    );
    let _ = writeln!(out, "per rank per iteration; rows sorted by |difference|, largest first");
    let header = |out: &mut String, title: &str, counts: bool| {
        let _ = writeln!(out);
        let count_header = if counts { format!("{:>15}", "count m / s") } else { String::new() };
        let _ = writeln!(
            out,
            "{title:<18}{count_header}{:>13}{:>13}{:>13}{:>9}",
            "measured", "simulated", "difference", "error"
        );
    };
    let row = |out: &mut String, r: &Row, counts: bool| {
        let count_column = if counts {
            format!("{:>15}", format!("{} / {}", count(r.measured_count), count(r.simulated_count)))
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "  {:<16}{count_column}{:>13}{:>13}{:>13}{:>9}",
            r.name,
            millis(r.measured_s),
            millis(r.simulated_s),
            signed_millis(r.difference_s),
            percent(r.error)
        );
    };
    header(&mut out, "iteration", false);
    row(&mut out, &c.iteration, false);
    header(&mut out, "GPU kernels", false);
    for r in &c.kernels {
        row(&mut out, r, false);
    }
    header(&mut out, "NCCL", true);
    for r in &c.collectives {
        row(&mut out, r, true);
    }
    let _ = writeln!(out);
    if c.outside_steps.ops > 0 {
        let _ = writeln!(
            out,
            "left out      {} measured GPU ops ({} over all ranks) outside every ProfilerStep",
            c.outside_steps.ops,
            millis(c.outside_steps.time_s)
        );
    }
    let _ = writeln!(
        out,
        "classes       measured: by kernel name; simulated: by the kind of the layer each op belongs to (validation/src/compare.rs)"
    );
    out
}
