//! `parasim collective`: a collective microbenchmark in the style of nccl-tests
//! (`all_reduce_perf -b 8 -e 8G -f 2`), so real nccl-tests output can be pasted next to it.

use crate::output::stderr;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use rayon::prelude::*;
use scenario::collective_bench::{
    BenchPoint, BenchSettings, CollectiveBench, CollectiveBenchError, NamedCollective,
};
use serde::Serialize;
use sim_core::fidelity::NetworkSettings;
use sim_core::graph::{CollectiveAlgorithm, CollectiveKind};
use sim_core::units::{Bytes, SimDuration};

use scenario::{Cluster, QUICKSTART};

/// What to measure.
pub struct Options<'a> {
    /// The collective (nccl-tests names are accepted too: all_reduce, all_gather, ...).
    pub kind: &'a str,
    /// Scenario whose [cluster] is used; the quickstart's if none.
    pub cluster: Option<&'a Path>,
    /// Ranks taking part (the first N GPUs); all GPUs if none.
    pub ranks: Option<u32>,
    /// Smallest size, e.g. "8" or "1K" (K, M, G are powers of 1024, as in nccl-tests).
    pub min_bytes: &'a str,
    /// Largest size.
    pub max_bytes: &'a str,
    /// Size multiplication factor between rows.
    pub factor: u64,
    /// Algorithm name, or "auto".
    pub algorithm: &'a str,
    /// Network model, collective launch cost and chunk size.
    pub network: NetworkSettings,
    /// Element type, for the count column.
    pub dtype: &'a str,
    /// nccl-tests output to compare with (measured time per size).
    pub compare: Option<&'a Path>,
    /// GPUs each benchmark process drives (nccl-tests' `-g`); the compared output's `nGpus`,
    /// else 1, if none.
    pub gpus_per_process: Option<u32>,
    /// Write a plot of simulated (and measured) bus bandwidth against size here (SVG or PNG
    /// by the extension).
    pub plot: Option<&'a Path>,
    /// Return JSON instead of the nccl-tests table (the wall time always goes to stderr).
    pub json: bool,
    /// The host time nccl-tests spends launching one collective on one GPU (`ncclAllReduce`
    /// and the kernel launch). nccl-tests times a loop of back-to-back iterations, so a
    /// process that drives `g` GPUs from one thread (`-g g`) cannot report less than `g`
    /// launches per iteration, however fast the GPUs finish. The command's default, 4 us, is
    /// read from the one-server floors of `all_reduce_perf` on Azure ND A100 v4
    /// (../shared/data/nccl-tests/echo-azure-a100: 4.47 us with one GPU, 8.6 with two, 16.3
    /// with four, 31.0 with eight, all in one process), so those floors do not validate it.
    pub host_launch: SimDuration,
}

/// One size of `parasim collective --json`.
#[derive(Debug, Serialize)]
struct SizeJson {
    bytes: u64,
    /// Elements of the element type.
    count: u64,
    time_s: f64,
    /// Bytes / time.
    algorithm_bandwidth_bytes_per_s: f64,
    /// nccl-tests' bus bandwidth.
    bus_bandwidth_bytes_per_s: f64,
    /// What ran: `algorithm/protocol`.
    algorithm: String,
    /// With --compare: the measured time at this size, if the output has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    measured_time_s: Option<f64>,
    /// With --compare: (simulated - measured) / measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<f64>,
}

/// `parasim collective --json`: the header, every size, and the averages of the table.
#[derive(Debug, Serialize)]
struct CollectiveJson {
    collective: String,
    ranks: u32,
    gpus: u32,
    device: String,
    nodes: u32,
    gpus_per_node: u32,
    fidelity: String,
    algorithm: String,
    protocol: String,
    launch_s: f64,
    gpus_per_process: u32,
    datatype: String,
    redop: String,
    root: i32,
    sizes: Vec<SizeJson>,
    average_bus_bandwidth_bytes_per_s: f64,
    /// With --compare: the mean |error| over the sizes measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    mean_absolute_error: Option<f64>,
}

/// The nccl-tests output to compare with (both column layouts, MPI-tagged lines too).
fn measured(path: &Path) -> anyhow::Result<traces::nccl::TestsOutput> {
    let text = fs_err::read_to_string(path).context("reading the nccl-tests output to compare with")?;
    Ok(traces::nccl::parse_tests_output(&text, path)?)
}

/// `8`, `1K`, `128M`, `8G` (powers of 1024, as nccl-tests reads them), or any size with a
/// unit (`"1 MiB"`).
pub(crate) fn size(text: &str) -> anyhow::Result<u64> {
    let trimmed = text.trim();
    let (digits, scale) = match trimmed.chars().last() {
        Some('K' | 'k') => (&trimmed[..trimmed.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&trimmed[..trimmed.len() - 1], 1 << 20),
        Some('G' | 'g') => (&trimmed[..trimmed.len() - 1], 1 << 30),
        _ => (trimmed, 1),
    };
    if let Ok(value) = digits.parse::<u64>() {
        return value.checked_mul(scale).with_context(|| format!("size {text:?} is too large"));
    }
    let bytes: Bytes =
        trimmed.parse().with_context(|| format!("size {text:?}: write e.g. 8, 1K, 128M, 8G or \"1 MiB\""))?;
    Ok(bytes.0)
}

fn type_size(dtype: &str) -> anyhow::Result<u64> {
    Ok(match dtype {
        "int8" | "uint8" | "char" => 1,
        "half" | "float16" | "bfloat16" | "bf16" | "fp16" => 2,
        "float" | "float32" | "int32" | "uint32" | "int" | "fp32" => 4,
        "double" | "float64" | "int64" | "uint64" | "fp64" => 8,
        other => bail!(
            "-d/--datatype: unknown type {other:?}; valid: int8, half, bfloat16, float, int32, double, int64"
        ),
    })
}

/// Runs the sweep and returns the nccl-tests-style table.
pub fn benchmark(options: &Options) -> anyhow::Result<String> {
    // The plot's format comes from its name: refused before anything runs.
    let plot_format = options.plot.map(plot::Format::of_path).transpose().context("--plot")?;
    let cluster = match options.cluster {
        Some(path) => Cluster::load(path).with_context(|| format!("--cluster {}", path.display()))?,
        None => Cluster::parse(QUICKSTART, Path::new("scenarios/quickstart.toml"))?,
    };
    let measured = options.compare.map(measured).transpose()?;
    let gpus = cluster.spec.nodes.saturating_mul(cluster.spec.gpus_per_node);
    // Without --ranks, a compared run with a header says how many ranks it had.
    let ranks = options.ranks.or(measured.as_ref().and_then(|m| m.ranks)).unwrap_or(gpus);
    let gpus_per_process =
        options.gpus_per_process.or(measured.as_ref().and_then(|m| m.gpus_per_process)).unwrap_or(1).max(1);
    let algorithm: CollectiveAlgorithm =
        options.algorithm.parse().map_err(anyhow::Error::msg).context("--algorithm")?;
    let bench = CollectiveBench::new(
        &cluster,
        options.kind,
        BenchSettings {
            ranks,
            algorithm,
            network: options.network,
            host_launch: options.host_launch,
            gpus_per_process,
        },
    )
    .map_err(|error| match error {
        CollectiveBenchError::Ranks { ranks, gpus } => {
            anyhow::anyhow!("--ranks {ranks}: the cluster has {gpus} GPUs; give 1 to {gpus}")
        }
        CollectiveBenchError::Unsupported { algorithm, kind, valid } => {
            anyhow::anyhow!("--algorithm {algorithm} cannot perform {kind}; valid: {valid}")
        }
        other => other.into(),
    })?;
    // nccl-tests' -g: each process drives g of the ranks' GPUs, so 1 <= g <= ranks.
    if let Some(given) = options.gpus_per_process {
        if given == 0 || given > ranks {
            bail!(
                "-g {given}: GPUs per process must be 1 to {ranks} (the ranks taking part); a process drives at least one GPU and no more than there are ranks"
            );
        }
    } else if gpus_per_process > ranks
        && let Some(log) = options.compare
    {
        // From the compared log's header (issue 38: nGpus 2147483648 was taken as it stood).
        bail!(
            "{}: its header says nGpus {gpus_per_process} (GPUs per process), more than the {ranks} ranks taking part; give -g, or --ranks, or the log of this run",
            log.display()
        );
    }
    let NamedCollective { kind, redop, .. } = bench.collective();
    let network = bench.settings().network;
    let element = type_size(options.dtype)?;
    let min = size(options.min_bytes).context("-b/--minbytes")?;
    let max = size(options.max_bytes).context("-e/--maxbytes")?;
    if min == 0 || max < min || options.factor < 2 {
        bail!("sizes must satisfy 0 < -b <= -e, and -f must be at least 2");
    }
    if min < element {
        bail!(
            "-b {min}: smaller than one {} element ({element} B); nccl-tests counts whole elements, so give at least {element}",
            options.dtype
        );
    }
    let root = if matches!(kind, CollectiveKind::Broadcast { .. } | CollectiveKind::Reduce { .. }) {
        "0"
    } else {
        "-1"
    };

    let mut out = String::new();
    let noun = cluster.device.kind.noun();
    let _ = writeln!(
        out,
        "# parasim collective {}: {ranks} ranks of {} x {} ({} nodes x {} {noun}{}), {} network, algorithm {}, protocol {}, launch {}, {} {noun}(s) per process",
        kind.name(),
        bench.gpus(),
        cluster.device.display_name,
        cluster.spec.nodes,
        cluster.spec.gpus_per_node,
        if cluster.spec.gpus_per_node == 1 { "" } else { "s" },
        network.fidelity.name(),
        algorithm.name(),
        network.protocols,
        network.collective_launch,
        gpus_per_process
    );
    let _ = writeln!(out, "#");
    let (measured_header, measured_units) =
        if measured.is_some() { ("  measured    error", "      (us)") } else { ("", "") };
    let _ = writeln!(
        out,
        "# {:>10} {:>13} {:>9} {:>7} {:>7} {:>10} {:>7} {:>7}{measured_header}  algorithm",
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw"
    );
    let _ = writeln!(
        out,
        "# {:>10} {:>13} {:>9} {:>7} {:>7} {:>10} {:>7} {:>7}{measured_units}",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)"
    );
    let mut errors = Vec::new();
    let mut sizes = Vec::new();
    // (size, simulated busbw, measured busbw) for the plot.
    let mut points: Vec<(u64, f64, Option<f64>)> = Vec::new();
    let started = Instant::now();
    let mut bus_sum = 0.0;
    let mut rows = 0u32;
    let mut all_sizes = Vec::new();
    let mut bytes = min;
    while bytes <= max {
        all_sizes.push(bytes);
        bytes = match bytes.checked_mul(options.factor) {
            Some(next) => next,
            None => break,
        };
    }
    // Each size is its own simulation: they run on every core, and are reported in order.
    let timed: Vec<BenchPoint> =
        all_sizes.par_iter().map(|&bytes| bench.time(bytes)).collect::<Result<_, _>>()?;
    for (&bytes, point) in all_sizes.iter().zip(timed) {
        bus_sum += point.busbw;
        rows += 1;
        points.push((
            bytes,
            point.busbw,
            measured.as_ref().and_then(|m| m.rows.get(&bytes)).map(|row| row.busbw),
        ));
        let real_us = measured.as_ref().and_then(|m| m.rows.get(&bytes)).map(|row| row.time_us);
        sizes.push(SizeJson {
            bytes,
            count: bytes / element,
            time_s: point.seconds,
            algorithm_bandwidth_bytes_per_s: point.algbw * 1e9,
            bus_bandwidth_bytes_per_s: point.busbw * 1e9,
            algorithm: point.chosen.clone(),
            measured_time_s: real_us.map(|us| us * 1e-6),
            error: real_us.map(|us| (point.seconds * 1e6 - us) / us),
        });
        let comparison = match measured.as_ref().map(|m| m.rows.get(&bytes).map(|row| row.time_us)) {
            Some(Some(real)) => {
                let error = (point.seconds * 1e6 - real) / real;
                errors.push(error.abs());
                format!("  {real:>8.1} {:>+7.1}%", 100.0 * error)
            }
            Some(None) => format!("  {:>8} {:>8}", "-", ""),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "  {:>10} {:>13} {:>9} {:>7} {:>7} {:>10.1} {:>7.2} {:>7.2}{comparison}  {}",
            bytes,
            bytes / element,
            options.dtype,
            redop,
            root,
            point.seconds * 1e6,
            point.algbw,
            point.busbw,
            point.chosen
        );
    }
    let _ = writeln!(out, "# Avg bus bandwidth    : {:.3}", bus_sum / f64::from(rows.max(1)));
    if !errors.is_empty() {
        let mean = errors.iter().sum::<f64>() / errors.len() as f64;
        let _ = writeln!(
            out,
            "# compared with {} measured sizes: mean |error| {:.1}%, accuracy (1 - |sim - real| / real) {:.1}%",
            errors.len(),
            100.0 * mean,
            100.0 * (1.0 - mean)
        );
    }
    // The wall time varies from run to run: on standard error, so the report on standard output
    // is the same every time (diffable, and byte-comparable in tests).
    stderr!("simulated {rows} sizes in {:.1} ms of wall time", started.elapsed().as_secs_f64() * 1e3);
    if let Some(path) = options.plot {
        let title = format!(
            "allreduce, {ranks} x {} ({} per server): simulated{}",
            cluster.device.display_name,
            cluster.spec.gpus_per_node,
            if measured.is_some() { " and measured" } else { "" }
        );
        let format = plot_format.unwrap_or(plot::Format::Svg);
        crate::plot_cmd::write_chart(&plot_chart(title, &points), format, plot::Size::default(), path)?;
    }
    if options.json {
        let report = CollectiveJson {
            collective: kind.name().to_string(),
            ranks,
            gpus: bench.gpus(),
            device: cluster.device.display_name.clone(),
            nodes: cluster.spec.nodes,
            gpus_per_node: cluster.spec.gpus_per_node,
            fidelity: network.fidelity.name().to_string(),
            algorithm: algorithm.name().to_string(),
            protocol: network.protocols.to_string(),
            launch_s: network.collective_launch.as_secs_f64(),
            gpus_per_process,
            datatype: options.dtype.to_string(),
            redop: redop.to_string(),
            root: if root == "0" { 0 } else { -1 },
            sizes,
            average_bus_bandwidth_bytes_per_s: bus_sum / f64::from(rows.max(1)) * 1e9,
            mean_absolute_error: (!errors.is_empty())
                .then(|| errors.iter().sum::<f64>() / errors.len() as f64),
        };
        return Ok(serde_json::to_string_pretty(&report).context("writing JSON")? + "\n");
    }
    Ok(out)
}

/// The chart of bus bandwidth (GB/s) against size (bytes, log scale) that `--plot` draws, through
/// the `plot` crate as every other chart (SVG or PNG by the file's extension): simulated, and
/// measured where there is a measurement.
fn plot_chart(title: String, points: &[(u64, f64, Option<f64>)]) -> plot::Chart {
    let simulated = plot::line::Series {
        name: "simulated".into(),
        points: points.iter().map(|p| (p.0 as f64, p.1)).collect(),
    };
    let measured: Vec<(f64, f64)> = points.iter().filter_map(|p| p.2.map(|m| (p.0 as f64, m))).collect();
    let mut series = vec![simulated];
    if !measured.is_empty() {
        series.push(plot::line::Series { name: "measured".into(), points: measured });
    }
    plot::Chart::Line(plot::line::LineChart {
        title: Some(title),
        x_label: "size (B)".into(),
        y_label: "bus bandwidth (GB/s)".into(),
        logx: Some(2),
        logy: None,
        series,
        notes: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_nccl_tests() {
        assert_eq!(size("8").unwrap(), 8);
        assert_eq!(size("1K").unwrap(), 1024);
        assert_eq!(size("8G").unwrap(), 8 << 30);
        assert_eq!(size("1 MiB").unwrap(), 1 << 20);
        assert!(size("lots").is_err());
    }
}
