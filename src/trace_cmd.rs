//! `parasim replay`, `parasim trace convert` and the `--trace` timeline export: glue between
//! the `traces` crate, the cluster and the engine.

use crate::output::stderr;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use sim_core::exec::Timeline;
use sim_core::fidelity::NetworkSettings;
use sim_core::graph::ExecGraph;
use sim_core::units::Bytes;
use topology::ClusterSpec;
use traces::replay::{Comparison, Replay};
use validation::replay::{ReplayRequest, ReplayRun, ReplayStep, abbreviate};

use scenario::Cluster;

/// What `parasim replay` was asked.
#[derive(Debug, Clone)]
pub struct ReplayArgs {
    /// Kineto JSON files or directories, or one `.pstrace`, or execution traces.
    pub traces: Vec<PathBuf>,
    /// The Kineto trace of the same run as execution traces in `traces`.
    pub kineto: Vec<PathBuf>,
    /// A scenario whose `[cluster]` table is the cluster to replay on.
    pub cluster: Option<PathBuf>,
    /// Device for the inferred cluster, overriding the trace's.
    pub device: Option<String>,
    /// Network model, collective launch cost and chunk size.
    pub network: NetworkSettings,
    /// NCCL protocols (`None`: by the device's collective library).
    pub protocols: Option<sim_core::nccl::protocol::ProtocolChoice>,
    /// Ranks to simulate (re-targeting).
    pub ranks: Option<u32>,
    /// Replay only this traced rank (the others as its copies).
    pub rank: Option<u32>,
    /// Write the simulated timeline here (Chrome trace JSON).
    pub trace_out: Option<PathBuf>,
    /// Print JSON.
    pub json: bool,
    /// No progress on standard error.
    pub quiet: bool,
}

fn describe_cluster(spec: &ClusterSpec, device: &str) -> String {
    let intra = spec.intra_node.describe();
    let network = spec.network.describe(spec.gpus_per_node, "GPU");
    format!(
        "{} x {device} = {} node{} x {} GPUs; intra-node {intra}; network {network}",
        spec.nodes * spec.gpus_per_node,
        spec.nodes,
        if spec.nodes == 1 { "" } else { "s" },
        spec.gpus_per_node
    )
}

/// Writes `graph`'s `timeline` as Chrome trace JSON to `path`, naming tracks with `names`.
pub fn export_timeline(
    graph: &ExecGraph,
    timeline: &Timeline,
    names: Option<&dyn Fn(sim_core::graph::RankId, sim_core::graph::StreamId) -> String>,
    path: &Path,
) -> anyhow::Result<traces::chrome::ExportStats> {
    let mut export = traces::chrome::ChromeTrace::new(graph, timeline);
    if let Some(names) = names {
        export = export.with_stream_names(names);
    }
    write_trace_file(path, |out| export.write(out))
        .with_context(|| format!("writing the timeline to {}", path.display()))
}

/// Writes a Chrome trace to `path` with `write`: gzip-compressed when the name ends in `.gz`
/// (`x.json.gz`, which Perfetto opens as it is), plain JSON otherwise.
pub fn write_trace_file<T>(
    path: &Path,
    write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<T>,
) -> anyhow::Result<T> {
    let gzip = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gz"));
    // Through traces::atomic: a cut run leaves no trace under its final name.
    let value = traces::atomic::write_with(path, |file| {
        if gzip {
            let mut encoder = flate2::write::GzEncoder::new(file, flate2::Compression::default());
            let value = write(&mut encoder)?;
            encoder.finish()?;
            Ok::<_, std::io::Error>(value)
        } else {
            write(file)
        }
    })?;
    Ok(value)
}

/// What `replay --json` prints.
#[derive(Debug, Serialize)]
struct ReplayReport<'a> {
    traces: Vec<String>,
    format: &'a str,
    timing: Option<&'a str>,
    traced_world_size: u32,
    traced_ranks: Vec<u32>,
    simulated_ranks: u32,
    device: Option<&'a str>,
    cluster: String,
    fidelity: &'static str,
    graph: traces::replay::ReplayCounts,
    comparison: &'a Comparison,
    warnings: Vec<(String, u64)>,
}

fn millis(seconds: f64) -> String {
    format!("{:.3} ms", seconds * 1e3)
}

fn percent(error: f64) -> String {
    if error.is_finite() { format!("{:+.1}%", error * 100.0) } else { "n/a".into() }
}

/// `parasim replay`: returns the report to print.
pub fn replay(args: &ReplayArgs) -> anyhow::Result<String> {
    let cluster = args
        .cluster
        .as_deref()
        .map(|path| Cluster::load(path).with_context(|| format!("--cluster {}", path.display())))
        .transpose()?;
    // Reading (bytes and files read of the total, events parsed), building (ranks and traced
    // ops) and simulating (ops and ranks): each stage with its counts, as the replay reports
    // them (a line every period, none for a short replay).
    let progress = crate::progress::Progress::new("replay", args.quiet);
    let run = validation::replay::replay_with_progress(
        &ReplayRequest {
            traces: args.traces.clone(),
            cluster,
            device: args.device.clone(),
            network: args.network,
            protocols: args.protocols,
            ranks: args.ranks,
            rank: args.rank,
            kineto: args.kineto.clone(),
        },
        &|step| show_step(&progress, step),
    );
    progress.finish();
    let run = run?;
    let ReplayRun { loaded, replay, spec, device_name, ranks, timeline, comparison, .. } = &run;
    let trace = &loaded.trace;
    let cluster_origin = match &args.cluster {
        Some(path) => path.display().to_string(),
        None => "inferred from the trace".to_string(),
    };
    let (load_wall, build_wall, simulation_wall) = (run.load_wall, run.build_wall, run.simulation_wall);
    let ranks = *ranks;
    if let Some(path) = &args.trace_out {
        let names = |rank, stream| replay.stream_name(rank, stream);
        export_timeline(&replay.graph, timeline, Some(&names), path)?;
    }
    let cluster_text = format!("{} ({cluster_origin})", describe_cluster(spec, device_name));
    let mut warnings = loaded.warnings.clone();
    warnings.extend(&replay.warnings);
    if args.json {
        let report = ReplayReport {
            traces: args.traces.iter().map(|p| p.display().to_string()).collect(),
            format: &loaded.format,
            timing: loaded.timing.as_deref(),
            traced_world_size: trace.world_size,
            traced_ranks: trace.ranks.iter().map(|r| r.rank).collect(),
            simulated_ranks: ranks,
            device: trace.device.as_ref().map(|d| d.name.as_str()),
            cluster: cluster_text,
            fidelity: args.network.fidelity.name(),
            graph: replay.counts,
            comparison,
            warnings: warnings.iter().map(|(m, c)| (m.to_string(), c)).collect(),
        };
        let mut text = serde_json::to_string_pretty(&report).context("writing JSON")?;
        text.push('\n');
        stderr!("{}", engine_line(replay, timeline, load_wall, build_wall, simulation_wall, loaded.binary));
        return Ok(text);
    }
    Ok(human_report(args, &run, &cluster_text, &warnings)
        + &engine_line(replay, timeline, load_wall, build_wall, simulation_wall, loaded.binary)
        + "\n")
}

/// Shows a replay's `step` on `progress`: `reading 41/98 MB (2/8 files, 1234567 events)`,
/// `building the graph (8 ranks from 1234567 traced ops and calls)`, `simulating (1234567 ops
/// on 8 ranks)`.
fn show_step(progress: &crate::progress::Progress, step: ReplayStep) {
    const MB: u64 = 1_000_000;
    match step {
        ReplayStep::Reading(counts) => {
            progress.stage("reading", "MB", Some(counts.bytes.div_ceil(MB).max(1)));
            progress.set_position(counts.bytes_read / MB);
            progress.set_message(&format!(
                "{}/{} files, {} events",
                counts.files_read, counts.files, counts.events
            ));
        }
        ReplayStep::Building { ranks, traced_ops } => {
            progress.stage("building the graph", "", None);
            progress.set_message(&format!("{ranks} ranks from {traced_ops} traced ops and calls"));
        }
        ReplayStep::Simulating { ranks, ops } => {
            progress.stage("simulating", "", None);
            progress.set_message(&format!("{ops} ops on {ranks} ranks"));
        }
    }
}

fn engine_line(
    replay: &Replay,
    timeline: &Timeline,
    load: Duration,
    build: Duration,
    simulation: Duration,
    binary: bool,
) -> String {
    format!(
        "engine        {} ops, {} events; {} {:.1} ms, graph {:.1} ms, simulation {:.1} ms",
        replay.graph.op_count(),
        timeline.events,
        if binary { "load (binary)" } else { "import" },
        load.as_secs_f64() * 1e3,
        build.as_secs_f64() * 1e3,
        simulation.as_secs_f64() * 1e3
    )
}

fn human_report(args: &ReplayArgs, run: &ReplayRun, cluster: &str, warnings: &traces::Warnings) -> String {
    let ReplayRun { loaded, replay, comparison, network, ranks, .. } = run;
    let ranks = *ranks;
    let trace = &loaded.trace;
    let mut out = String::new();
    let inputs: Vec<String> = args.traces.iter().map(|p| p.display().to_string()).collect();
    let traced: Vec<u32> = trace.ranks.iter().map(|r| r.rank).collect();
    let copies = replay.source.iter().enumerate().filter(|&(m, &s)| m as u32 != s).count();
    let retargeted = args.ranks.is_some_and(|m| m != trace.world_size);
    // Writing to a String cannot fail.
    let _ = writeln!(out, "trace         {}", inputs.join(" "));
    if let Some(timing) = &loaded.timing {
        let _ = writeln!(out, "format        {}", loaded.format);
        let _ = writeln!(out, "durations     {timing}");
    }
    let _ = writeln!(
        out,
        "job           {} ranks, traced {} ({}); {}",
        trace.world_size,
        traced.len(),
        abbreviate(&traced),
        trace.device.as_ref().map_or("GPU not recorded".to_string(), |d| d.name.clone())
    );
    let _ = writeln!(
        out,
        "replay        {ranks} ranks{}",
        match (retargeted, copies) {
            (true, _) => format!(
                ", re-targeted from {} (data parallelism scaled; compute per rank unchanged)",
                trace.world_size
            ),
            (false, 0) => String::new(),
            (false, n) => format!(", {n} of them copies of traced ranks"),
        }
    );
    let _ = writeln!(out, "cluster       {cluster}");
    let _ = writeln!(out, "network model {}; protocol {}", network.fidelity.name(), network.protocols);
    let counts = &replay.counts;
    let _ = writeln!(
        out,
        "graph         {} ops ({} GPU, {} host), {} collectives, {} synchronization dependencies",
        replay.graph.op_count(),
        counts.gpu_ops,
        counts.host_ops,
        counts.collectives,
        counts.sync_dependencies
    );
    let _ = writeln!(out);
    // An execution trace's own times are the trace's durations laid out in its order (or the
    // compute model's estimates), not a measurement.
    let (measured, error) = match (retargeted, loaded.timing.is_some() && args.kineto.is_empty()) {
        (true, _) => ("traced", "change"),
        (false, true) => ("in trace", "diff."),
        (false, false) => ("measured", "error"),
    };
    if comparison.steps.is_empty() {
        let _ = writeln!(out, "iterations    none marked (no ProfilerStep#N in the trace)");
        let _ = writeln!(out, "makespan      {} simulated", millis(comparison.makespan_s));
    } else {
        let _ = writeln!(
            out,
            "iteration, mean over ranks     {measured:>12}  {:>12}  {error:>8}  (completion to completion)",
            "simulated"
        );
        for step in &comparison.steps {
            let _ = writeln!(
                out,
                "  ProfilerStep#{:<16} {:>12}  {:>12}  {:>8}",
                step.number,
                millis(step.measured_s),
                millis(step.simulated_s),
                percent(step.error())
            );
        }
        let (measured_mean, simulated_mean) = comparison.mean_s;
        let _ = writeln!(
            out,
            "  {:<29} {:>12}  {:>12}  {:>8}",
            "mean",
            millis(measured_mean),
            millis(simulated_mean),
            percent(traces::replay::relative_error(simulated_mean, measured_mean))
        );
        if let Some((measured, simulated)) = comparison.steady_mean_s {
            let _ = writeln!(
                out,
                "  {:<29} {:>12}  {:>12}  {:>8}",
                "mean after the first",
                millis(measured),
                millis(simulated),
                percent(traces::replay::relative_error(simulated, measured))
            );
        }
    }
    if !comparison.collectives.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "NCCL per rank, whole trace   count  {measured:>12}  {:>12}  {error:>8}  timed by the network",
            "simulated"
        );
        for kind in &comparison.collectives {
            let _ = writeln!(
                out,
                "  {:<26} {:>5.0}  {:>12}  {:>12}  {:>8}  {:.0} of {:.0}",
                kind.kind,
                kind.count_per_rank,
                millis(kind.measured_s),
                millis(kind.simulated_s),
                percent(kind.error()),
                kind.simulated_count_per_rank,
                kind.count_per_rank.max(kind.simulated_count_per_rank)
            );
        }
    }
    if !warnings.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "warnings");
        let _ = write!(out, "{warnings}");
    }
    let _ = writeln!(out);
    out
}

/// `parasim trace convert INPUT... OUTPUT`: returns the report to print.
pub fn convert(inputs: &[PathBuf], output: &Path) -> anyhow::Result<String> {
    let extension = output.extension().map(|e| e.to_string_lossy().to_ascii_lowercase());
    if let Some(extension) = extension.as_deref()
        && !["pstrace", "json"].contains(&extension)
    {
        bail!(
            "{}: the output's extension .{extension} names no format; write OUT.pstrace (binary), OUT.json (one rank) or a directory without an extension (one JSON file per rank)",
            output.display()
        );
    }
    let started = Instant::now();
    let loaded = traces::load(inputs)?;
    let load_wall = started.elapsed();
    let trace = &loaded.trace;
    let mut out = String::new();
    let started = Instant::now();
    let is_binary = output.extension().is_some_and(|e| e == "pstrace");
    let written = if is_binary {
        traces::binary::write(trace, output)?;
        vec![output.to_path_buf()]
    } else {
        traces::kineto::write_trace_files(trace, output)?
    };
    let write_wall = started.elapsed();
    let ops: usize = trace.ranks.iter().map(|r| r.gpu_ops.len()).sum();
    let _ = writeln!(
        out,
        "read          {} ({} rank{} of {}, {} GPU ops) in {:.1} ms",
        inputs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" "),
        trace.ranks.len(),
        if trace.ranks.len() == 1 { "" } else { "s" },
        trace.world_size,
        ops,
        load_wall.as_secs_f64() * 1e3
    );
    for path in &written {
        let size = fs_err::metadata(path).map(|m| m.len()).unwrap_or(0);
        let _ = writeln!(out, "wrote         {} ({})", path.display(), Bytes(size));
    }
    let _ = writeln!(out, "              in {:.1} ms", write_wall.as_secs_f64() * 1e3);
    if !loaded.warnings.is_empty() {
        let _ = writeln!(out, "warnings");
        let _ = write!(out, "{}", loaded.warnings);
    }
    Ok(out)
}

/// How many links `run --trace` draws as counter tracks: the busiest, as many as `run --json`
/// lists in `busiest_links`.
pub const TRACE_LINKS: usize = 10;

/// Writes a `parasim run` timeline for `--trace`, and says so on stderr. With `links` (every
/// link that carried bytes, busiest first, as `run --json` ranks them: under `flow` and
/// `packet-steps`), the first [`TRACE_LINKS`] also get counter tracks of their utilisation
/// over time, recorded by running the graph again ([`scenario::simulation::link_series`]).
pub fn export_run(
    scenario: &scenario::Scenario,
    outcome: &scenario::simulation::Outcome,
    links: Option<&[scenario::links::LinkLoad]>,
    path: &Path,
) -> anyhow::Result<()> {
    let counters = match links {
        Some(links) => {
            let chosen = &links[..links.len().min(TRACE_LINKS)];
            let ids: Vec<topology::LinkId> = chosen.iter().map(|link| topology::LinkId(link.id)).collect();
            let series = scenario::simulation::link_series(scenario, outcome, &ids)?.unwrap_or_default();
            series
                .into_iter()
                .zip(chosen)
                .map(|(series, link)| traces::chrome::CounterTrack {
                    name: format!("{} {}", link.kind, link.name),
                    key: "utilisation",
                    points: series.points,
                })
                .collect()
        }
        None => Vec::new(),
    };
    let spans: Vec<traces::chrome::Span> = outcome
        .spans
        .iter()
        .map(|s| traces::chrome::Span {
            rank: s.rank,
            stream: strategies::COMPUTE_STREAM,
            name: s.name.clone(),
            first: s.first,
            last: s.last,
        })
        .collect();
    let names = |rank: sim_core::graph::RankId| {
        outcome.rank_names.get(rank.0 as usize).cloned().unwrap_or_else(|| format!("rank {}", rank.0))
    };
    let streams =
        |_: sim_core::graph::RankId, stream: sim_core::graph::StreamId| strategies::stream_name(stream);
    let export = traces::chrome::ChromeTrace::new(&outcome.graph, &outcome.timeline)
        .with_stream_names(&streams)
        .with_process_names(&names)
        .with_spans(&spans)
        .with_counters(&counters)
        .with_counter_process("busiest links (utilisation)");
    let stats = write_trace_file(path, |out| export.write(out)).context("writing the timeline")?;
    let tracks = match links {
        Some(_) => format!("{} link utilisation counter tracks", counters.len()),
        None => "no link counter tracks: analytical routes no flows (fidelity flow or packet-steps has them)"
            .to_string(),
    };
    stderr!(
        "timeline      {} ({} ops, {} transfer arrows, {tracks}; open in https://ui.perfetto.dev)",
        path.display(),
        stats.ops,
        stats.flows
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use scenario::{QUICKSTART, Scenario};

    /// `parasim run --trace`: the file is valid Chrome trace JSON with every op of the run
    /// exactly once, at its simulated times.
    #[test]
    fn run_trace_export_matches_the_run() {
        let scenario = Scenario::parse(QUICKSTART, Path::new("scenarios/quickstart.toml")).unwrap();
        let outcome = scenario::simulation::simulate(&scenario).unwrap();
        let path = std::env::temp_dir().join(format!("parasim-run-trace-{}.json", std::process::id()));
        export_run(&scenario, &outcome, None, &path).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&fs_err::read(&path).unwrap()).unwrap();
        let _ = fs_err::remove_file(&path);
        let mut seen = vec![0u32; outcome.summary.engine.ops];
        for event in json["traceEvents"].as_array().unwrap() {
            if event["ph"] == "X" && event["args"]["op"].is_u64() {
                let op = event["args"]["op"].as_u64().unwrap() as usize;
                seen[op] += 1;
                let start = outcome.timeline.start[op].as_ps() as f64 / 1e6;
                let end = outcome.timeline.end[op].as_ps() as f64 / 1e6;
                let ts = event["ts"].as_f64().unwrap();
                assert!(
                    (ts - start).abs() < 1e-6 && (ts + event["dur"].as_f64().unwrap() - end).abs() < 1e-6
                );
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
        assert_eq!(seen.len(), outcome.graph.op_count());
    }
}
