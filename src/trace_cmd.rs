//! `parasim replay`, `parasim trace convert` and the `--trace` timeline export: glue between
//! the `traces` crate, the cluster and the engine.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use sim_core::exec::Timeline;
use sim_core::fidelity::NetworkSettings;
use sim_core::graph::ExecGraph;
use sim_core::units::{Bandwidth, Bytes, SimDuration};
use topology::{ClusterSpec, FabricSpec, IntraNode, LinkSpec, NetworkSpec, Topology};
use traces::replay::{Comparison, Replay, ReplayOptions};
use workloads::{Device, DeviceCatalog};

use workloads::scenario::Cluster;

/// What `parasim replay` was asked.
#[derive(Debug, Clone)]
pub struct ReplayArgs {
    /// Kineto JSON files or directories, or one `.pstrace`.
    pub traces: Vec<PathBuf>,
    /// A scenario whose `[cluster]` table is the cluster to replay on.
    pub cluster: Option<PathBuf>,
    /// Device for the inferred cluster, overriding the trace's.
    pub device: Option<String>,
    /// Network model, collective launch cost and chunk size.
    pub network: NetworkSettings,
    /// Ranks to simulate (re-targeting).
    pub ranks: Option<u32>,
    /// Replay only this traced rank (the others as its copies).
    pub rank: Option<u32>,
    /// Write the simulated timeline here (Chrome trace JSON).
    pub trace_out: Option<PathBuf>,
    /// Print JSON.
    pub json: bool,
}

/// Defaults of the cluster inferred from a trace; docs/traces.md lists them.
const INFERRED_NETWORK_BANDWIDTH_BITS: u64 = 200_000_000_000;
const INFERRED_LATENCY: SimDuration = SimDuration::from_us(1);
/// GPUs per server when the trace does not list its host's devices.
const INFERRED_GPUS_PER_NODE: u32 = 8;

/// The catalog device a profiler's device name means: "Tesla V100-SXM2-32GB" is
/// `v100-sxm2-32gb`; an unlisted variant ("NVIDIA A100-PG509-200") is the catalog entry of
/// its family ("a100") with the closest memory size.
pub fn device_for(name: &str, memory_bytes: u64) -> anyhow::Result<Device> {
    let catalog = DeviceCatalog::builtin();
    let lower = name.trim().to_ascii_lowercase();
    let stripped = lower.trim_start_matches("nvidia ").trim_start_matches("tesla ").replace(' ', "-");
    if let Ok(device) = catalog.get(&stripped) {
        return Ok(device.clone());
    }
    let family = stripped.split('-').next().unwrap_or_default().to_string();
    let candidates = catalog.devices().iter().filter(|d| d.name.split('-').next() == Some(family.as_str()));
    let closest = candidates.min_by_key(|d| d.memory_capacity.0.abs_diff(memory_bytes));
    match closest {
        Some(device) if !family.is_empty() => Ok(device.clone()),
        _ => bail!(
            "the trace's device {name:?} is not in the catalog; pass --device with one of: {}, or --cluster SCENARIO",
            catalog.names().collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The cluster a trace implies: its device, `devices_per_host` GPUs per server (the
/// `deviceProperties` count, else 8, at most the rank count) behind an NVSwitch at half the
/// device's NVLink total per direction, servers on one switch at 200 Gb/s per GPU, 1 us per
/// link, and each GPU's PCIe link to host memory.
pub fn inferred_cluster(
    device: &Device,
    devices_per_host: Option<u32>,
    ranks: u32,
) -> anyhow::Result<ClusterSpec> {
    let per_node = devices_per_host.filter(|&d| d > 0).unwrap_or(INFERRED_GPUS_PER_NODE).min(ranks).max(1);
    let nodes = ranks.div_ceil(per_node);
    let nvlink = device
        .nvlink_bandwidth
        .and_then(|total| Bandwidth::from_bits_per_second(total.bits_per_second() / 2))
        .unwrap_or(device.pcie_bandwidth);
    let network =
        Bandwidth::from_bits_per_second(INFERRED_NETWORK_BANDWIDTH_BITS).context("network bandwidth")?;
    Ok(ClusterSpec {
        nodes,
        gpus_per_node: per_node,
        intra_node: IntraNode::NvSwitch(LinkSpec::new(nvlink, INFERRED_LATENCY)),
        network: NetworkSpec::single_switch(LinkSpec::new(network, INFERRED_LATENCY)),
        host_memory: Some(LinkSpec::new(device.pcie_bandwidth, INFERRED_LATENCY)),
    })
}

fn describe_cluster(spec: &ClusterSpec, device: &str) -> String {
    let intra = match spec.intra_node {
        IntraNode::NvSwitch(link) => format!("nvswitch {} {}", link.bandwidth, link.latency),
        IntraNode::PcieSwitch(link) => format!("pcie-switch {} {}", link.bandwidth, link.latency),
        IntraNode::NvLinkMesh(link) => format!("nvlink-mesh {} {}", link.bandwidth, link.latency),
    };
    let network = match &spec.network.fabric {
        FabricSpec::Switch { link } => {
            format!("switch, {} {} per GPU", link.bandwidth.display_bits(), link.latency)
        }
        fabric => fabric.to_string(),
    };
    format!(
        "{} x {device} = {} node{} x {} GPUs; intra-node {intra}; network {network}",
        spec.nodes * spec.gpus_per_node,
        spec.nodes,
        if spec.nodes == 1 { "" } else { "s" },
        spec.gpus_per_node
    )
}

/// Runs `graph` on `topology` under `network`.
fn simulate(graph: &ExecGraph, topology: &Topology, network: &NetworkSettings) -> anyhow::Result<Timeline> {
    network.run(graph, topology).context("simulating the replay")
}

/// Writes `graph`'s `timeline` as Chrome trace JSON to `path`, naming tracks with `names`.
pub fn export_timeline(
    graph: &ExecGraph,
    timeline: &Timeline,
    names: Option<&dyn Fn(sim_core::graph::RankId, sim_core::graph::StreamId) -> String>,
    path: &Path,
) -> anyhow::Result<traces::chrome::ExportStats> {
    let file = fs_err::File::create(path)?;
    let mut export = traces::chrome::ChromeTrace::new(graph, timeline);
    if let Some(names) = names {
        export = export.with_stream_names(names);
    }
    export.write(file).with_context(|| format!("writing the timeline to {}", path.display()))
}

/// What `replay --json` prints.
#[derive(Debug, Serialize)]
struct ReplayReport<'a> {
    traces: Vec<String>,
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
    let started = Instant::now();
    let mut loaded = traces::load(&args.traces)?;
    let load_wall = started.elapsed();
    if let Some(rank) = args.rank
        && !loaded.trace.keep_only_rank(rank)
    {
        let traced: Vec<u32> = loaded.trace.ranks.iter().map(|r| r.rank).collect();
        bail!("--rank {rank}: the trace has {}", abbreviate(&traced));
    }
    let trace = &loaded.trace;
    let ranks = args.ranks.unwrap_or(trace.world_size);

    let started = Instant::now();
    let replay = traces::replay::build(trace, &ReplayOptions { ranks: args.ranks })?;
    let build_wall = started.elapsed();

    let (spec, device_name, cluster_origin) = match &args.cluster {
        Some(path) => {
            let cluster = Cluster::load(path)?;
            (cluster.spec, cluster.device.display_name.clone(), format!("{}", path.display()))
        }
        None => {
            let device = match (&args.device, &trace.device) {
                (Some(name), _) => DeviceCatalog::builtin().get(name).context("--device")?.clone(),
                (None, Some(info)) => device_for(&info.name, info.memory_bytes)?,
                (None, None) => bail!(
                    "the trace does not record its GPU (no deviceProperties): pass --device NAME or --cluster SCENARIO"
                ),
            };
            let spec = inferred_cluster(&device, trace.device.as_ref().map(|d| d.devices_per_host), ranks)?;
            (spec, device.display_name.clone(), "inferred from the trace".to_string())
        }
    };
    let gpus = spec.nodes * spec.gpus_per_node;
    if gpus < ranks {
        bail!("the cluster has {gpus} GPUs, but the replay needs {ranks} ranks (one per GPU)");
    }
    let topology = Topology::build(&spec).context("building the cluster topology")?;
    let started = Instant::now();
    let timeline = simulate(&replay.graph, &topology, &args.network)?;
    let simulation_wall = started.elapsed();
    let comparison = replay.compare(&timeline);

    if let Some(path) = &args.trace_out {
        let names = |rank, stream| replay.stream_name(rank, stream);
        export_timeline(&replay.graph, &timeline, Some(&names), path)?;
    }
    let cluster_text = format!("{} ({cluster_origin})", describe_cluster(&spec, &device_name));
    let mut warnings = loaded.warnings.clone();
    warnings.extend(&replay.warnings);
    if args.json {
        let report = ReplayReport {
            traces: args.traces.iter().map(|p| p.display().to_string()).collect(),
            traced_world_size: trace.world_size,
            traced_ranks: trace.ranks.iter().map(|r| r.rank).collect(),
            simulated_ranks: ranks,
            device: trace.device.as_ref().map(|d| d.name.as_str()),
            cluster: cluster_text,
            fidelity: args.network.fidelity.name(),
            graph: replay.counts,
            comparison: &comparison,
            warnings: warnings.iter().map(|(m, c)| (m.to_string(), c)).collect(),
        };
        let mut text = serde_json::to_string_pretty(&report).context("writing JSON")?;
        text.push('\n');
        eprintln!(
            "{}",
            engine_line(&replay, &timeline, load_wall, build_wall, simulation_wall, loaded.binary)
        );
        return Ok(text);
    }
    Ok(human_report(args, &loaded, &replay, &comparison, &cluster_text, ranks, &warnings)
        + &engine_line(&replay, &timeline, load_wall, build_wall, simulation_wall, loaded.binary)
        + "\n")
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

fn human_report(
    args: &ReplayArgs,
    loaded: &traces::Loaded,
    replay: &Replay,
    comparison: &Comparison,
    cluster: &str,
    ranks: u32,
    warnings: &traces::Warnings,
) -> String {
    let trace = &loaded.trace;
    let mut out = String::new();
    let inputs: Vec<String> = args.traces.iter().map(|p| p.display().to_string()).collect();
    let traced: Vec<u32> = trace.ranks.iter().map(|r| r.rank).collect();
    let copies = replay.source.iter().enumerate().filter(|&(m, &s)| m as u32 != s).count();
    let retargeted = args.ranks.is_some_and(|m| m != trace.world_size);
    // Writing to a String cannot fail.
    let _ = writeln!(out, "trace         {}", inputs.join(" "));
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
    let _ = writeln!(out, "network model {}", args.network.fidelity.name());
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
    let (measured, error) = if retargeted { ("traced", "change") } else { ("measured", "error") };
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

fn abbreviate(ranks: &[u32]) -> String {
    match ranks {
        [] => "none".into(),
        [one] => format!("rank {one}"),
        _ if ranks.windows(2).all(|w| w[1] == w[0] + 1) => {
            format!("ranks {}-{}", ranks[0], ranks[ranks.len() - 1])
        }
        _ => format!("ranks {}", ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")),
    }
}

/// `parasim trace convert INPUT... OUTPUT`: returns the report to print.
pub fn convert(inputs: &[PathBuf], output: &Path) -> anyhow::Result<String> {
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

/// Writes a `parasim run` timeline for `--trace`, and says so on stderr.
pub fn export_run(outcome: &workloads::simulation::Outcome, path: &Path) -> anyhow::Result<()> {
    let spans: Vec<traces::chrome::Span> = outcome
        .spans
        .iter()
        .map(|s| traces::chrome::Span {
            rank: s.rank,
            stream: workloads::strategy::COMPUTE_STREAM,
            name: s.name.clone(),
            first: s.first,
            last: s.last,
        })
        .collect();
    let names = |rank: sim_core::graph::RankId| {
        outcome.rank_names.get(rank.0 as usize).cloned().unwrap_or_else(|| format!("rank {}", rank.0))
    };
    let streams = |_: sim_core::graph::RankId, stream: sim_core::graph::StreamId| {
        match workloads::strategy::group_of_stream(stream) {
            None if stream == workloads::strategy::HOST_STREAM => "host (kernel launches)".to_string(),
            None => "compute".to_string(),
            Some(kind) if stream == workloads::strategy::GATHER_STREAM => {
                format!("{} (parameter gathers)", kind.name())
            }
            Some(kind) => format!("{} communication", kind.name()),
        }
    };
    let file = fs_err::File::create(path)?;
    let stats = traces::chrome::ChromeTrace::new(&outcome.graph, &outcome.timeline)
        .with_stream_names(&streams)
        .with_process_names(&names)
        .with_spans(&spans)
        .write(file)
        .context("writing the timeline")?;
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(
        stderr,
        "timeline      {} ({} ops, {} transfer arrows; open in https://ui.perfetto.dev)",
        path.display(),
        stats.ops,
        stats.flows
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::scenario::{QUICKSTART, Scenario};

    #[test]
    fn trace_device_names_map_to_the_catalog() {
        assert_eq!(device_for("Tesla V100-SXM2-32GB", 0).unwrap().name, "v100-sxm2-32gb");
        assert_eq!(device_for("NVIDIA A100-SXM4-80GB", 0).unwrap().name, "a100-sxm4-80gb");
        // Meta's A100 variant with 40 GB: the A100 of the closest memory size.
        assert_eq!(device_for("NVIDIA A100-PG509-200", 42_505_273_344).unwrap().name, "a100-sxm4-40gb");
        let error = device_for("Quantum QPU-9000", 1).unwrap_err().to_string();
        assert!(error.contains("--device"), "{error}");
    }

    #[test]
    fn inferred_clusters_hold_every_rank() {
        let device = device_for("Tesla V100-SXM2-32GB", 0).unwrap();
        let spec = inferred_cluster(&device, Some(8), 16).unwrap();
        assert_eq!((spec.nodes, spec.gpus_per_node), (2, 8));
        let spec = inferred_cluster(&device, Some(8), 2).unwrap();
        assert_eq!((spec.nodes, spec.gpus_per_node), (1, 2));
        let spec = inferred_cluster(&device, None, 20).unwrap();
        assert_eq!((spec.nodes, spec.gpus_per_node), (3, 8));
    }

    /// `parasim run --trace`: the file is valid Chrome trace JSON with every op of the run
    /// exactly once, at its simulated times.
    #[test]
    fn run_trace_export_matches_the_run() {
        let scenario = Scenario::parse(QUICKSTART, Path::new("scenarios/quickstart.toml")).unwrap();
        let outcome = workloads::simulation::simulate(&scenario).unwrap();
        let path = std::env::temp_dir().join(format!("parasim-run-trace-{}.json", std::process::id()));
        export_run(&outcome, &path).unwrap();
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
