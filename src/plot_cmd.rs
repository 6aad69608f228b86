//! `parasim plot`: charts of a sweep's CSV (scaling curves, stacked breakdowns, heatmaps), of
//! `parasim validate --csv` (the accuracy scatter), of `parasim run --csv` (a per-kernel
//! roofline) and of runs' JSON (iteration-time
//! distributions, goodput against the checkpoint interval), as SVG or PNG by the output's
//! extension.

use crate::output::stderr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use plot::table::Table;
use plot::{Chart, Format, Size};

/// What `parasim plot` was asked.
#[derive(Debug, Args)]
pub struct PlotCli {
    #[command(subcommand)]
    kind: Kind,
}

#[derive(Debug, Subcommand)]
enum Kind {
    /// The charts of a CSV table.
    #[command(flatten)]
    Table(TableKind),
    /// The iteration-time distribution of Monte Carlo runs, one line per run: the share of
    /// iterations in each time bin, with each run's p50 and p99 (`parasim run S.toml
    /// --iterations 1000 --seed 1 --json > a.json`, then `parasim plot distribution a.json b.json
    /// -o dist.svg`).
    Distribution {
        /// `parasim run --iterations N --json` outputs (their `iteration_times_s`), one line each.
        #[arg(required = true, num_args = 1..)]
        inputs: Vec<PathBuf>,
        /// Bins over the range of every run's times.
        #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..=10000))]
        bins: u32,
        #[command(flatten)]
        picture: Picture,
    },
    /// Goodput against the checkpoint interval, with the best interval and Young's, from
    /// `parasim run S.toml --hours H --json > g.json` (its `goodput.curve`).
    Goodput {
        /// A `parasim run --hours H --json` output.
        input: PathBuf,
        #[command(flatten)]
        picture: Picture,
    },
}

/// The charts of a CSV table: a sweep's, or `parasim validate --csv`'s.
#[derive(Debug, Subcommand)]
enum TableKind {
    /// Scaling curves: --y against --x, one line per value of --series
    /// (`parasim plot line sweep.csv --x cluster.gpus --y samples_per_second --series strategy.tensor --logx=2 -o scaling.svg`).
    Line {
        #[command(flatten)]
        common: Common,
        /// The x column, e.g. cluster.gpus.
        #[arg(long)]
        x: String,
        /// The y column, e.g. samples_per_second, iteration_time_s, mfu.
        #[arg(long)]
        y: String,
        /// Columns whose values tell the lines apart (comma-separated), e.g.
        /// cluster.network.link-bandwidth.
        #[arg(long, value_delimiter = ',')]
        series: Vec<String>,
        /// Logarithmic x axis: `--logx` (base 10) or `--logx=2` (powers of two, for GPU counts).
        #[arg(long, value_name = "BASE", num_args = 0..=1, require_equals = true, default_missing_value = "10", value_parser = log_base)]
        logx: Option<u32>,
        /// Logarithmic y axis: `--logy` or `--logy=2`.
        #[arg(long, value_name = "BASE", num_args = 0..=1, require_equals = true, default_missing_value = "10", value_parser = log_base)]
        logy: Option<u32>,
    },
    /// Stacked bars of each configuration's iteration: compute, exposed communication by
    /// kind, pipeline bubble, host-bound and other idle time (a sweep's breakdown.* columns).
    Bars {
        #[command(flatten)]
        common: Common,
        /// Columns that label each bar (comma-separated; default: the sweep's swept columns).
        #[arg(long, value_delimiter = ',')]
        x: Vec<String>,
        /// Shares of each iteration instead of seconds.
        #[arg(long)]
        fraction: bool,
    },
    /// A heatmap of --z over the values of --x and --y, each cell labelled with its value.
    Heatmap {
        #[command(flatten)]
        common: Common,
        /// The column along x.
        #[arg(long)]
        x: String,
        /// The column along y.
        #[arg(long)]
        y: String,
        /// The metric in the cells, e.g. mfu.
        #[arg(long)]
        z: String,
    },
    /// Simulated against measured, log-log, coloured by family, with y = x and the ±10% band,
    /// from `parasim validate --csv` (with --points, every point of multi-point cases).
    Accuracy {
        #[command(flatten)]
        common: Common,
    },
    /// A roofline of a run's kernels, from `parasim run SCENARIO --csv LAYERS.csv`: log-log,
    /// arithmetic intensity (FLOP/byte) against achieved FLOP/s, one dot per kernel, under the
    /// device's memory-bandwidth slope and peak ceiling (the CSV's `peak_flops_per_s` and
    /// `memory_bandwidth_bytes_per_s` unless --peak and --bandwidth give others).
    Roofline {
        #[command(flatten)]
        common: Common,
        /// The compute ceiling, e.g. "125 TFLOP/s" (default: the CSV's peak_flops_per_s, the
        /// device's dense peak in the run's compute dtype).
        #[arg(long, value_name = "RATE")]
        peak: Option<sim_core::units::FlopRate>,
        /// The memory roof's bandwidth, e.g. "900 GB/s" (default: the CSV's
        /// memory_bandwidth_bytes_per_s).
        #[arg(long, value_name = "RATE")]
        bandwidth: Option<sim_core::units::Bandwidth>,
        /// What colours the dots: the kernel's pass (forward, backward-data, ...) or its
        /// layer's kind (conv2d, linear, batchnorm, ...).
        #[arg(long, value_enum, default_value_t = ColourBy::Pass)]
        colour_by: ColourBy,
    },
}

/// What colours a roofline's dots.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ColourBy {
    /// The kernel's pass.
    Pass,
    /// The layer's kind.
    Kind,
}

/// Where the picture goes and how it looks.
#[derive(Debug, Args)]
struct Picture {
    /// The picture to write: FILE.svg or FILE.png.
    #[arg(short, long, value_name = "FILE.svg|FILE.png")]
    output: PathBuf,
    /// A title above the chart.
    #[arg(long)]
    title: Option<String>,
    /// Width in pixels.
    #[arg(long, default_value_t = 960, value_parser = clap::value_parser!(u32).range(200..=8000))]
    width: u32,
    /// Height in pixels.
    #[arg(long, default_value_t = 640, value_parser = clap::value_parser!(u32).range(150..=8000))]
    height: u32,
}

impl Picture {
    /// The picture's format, from its file name (checked before any input is read).
    fn format(&self) -> anyhow::Result<Format> {
        Ok(Format::of_path(&self.output)?)
    }

    /// Renders `chart` in `format` at the picture's size and writes it.
    fn write(&self, chart: &Chart, format: Format) -> anyhow::Result<()> {
        write_chart(chart, format, Size { width: self.width, height: self.height }, &self.output)
    }
}

/// What every chart of a table takes.
#[derive(Debug, Args)]
struct Common {
    /// The CSV file: `parasim sweep -o FILE.csv` output, `parasim validate --csv` output for
    /// `accuracy`, `parasim run --csv` output for `roofline`.
    input: PathBuf,
    /// Plot only the rows whose COLUMN is VALUE (repeatable: every one must hold), e.g.
    /// `--where axis.cluster.flops-scale=1` for a slice of a sweep, `--where stage=0` for one
    /// pipeline stage of a per-layer CSV.
    #[arg(long = "where", value_name = "COLUMN=VALUE", value_parser = selection)]
    select: Vec<(String, String)>,
    #[command(flatten)]
    picture: Picture,
}

fn selection(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((column, value)) if !column.trim().is_empty() => {
            Ok((column.trim().to_string(), value.to_string()))
        }
        _ => Err(format!("{text:?} is not COLUMN=VALUE: write e.g. axis.cluster.nodes=16")),
    }
}

fn log_base(text: &str) -> Result<u32, String> {
    match text {
        "2" => Ok(2),
        "10" => Ok(10),
        other => Err(format!("{other:?} is not a logarithm base: write 2 or 10")),
    }
}

/// Runs the command: writes the picture, and reports it (and any skipped rows) on stderr.
pub fn plot(cli: PlotCli) -> anyhow::Result<()> {
    match &cli.kind {
        Kind::Table(kind) => plot_table(kind),
        Kind::Distribution { inputs, bins, picture } => plot_distribution(inputs, *bins, picture),
        Kind::Goodput { input, picture } => plot_goodput(input, picture),
    }
}

/// A chart of a CSV table.
fn plot_table(kind: &TableKind) -> anyhow::Result<()> {
    let common = match kind {
        TableKind::Line { common, .. }
        | TableKind::Bars { common, .. }
        | TableKind::Heatmap { common, .. }
        | TableKind::Accuracy { common }
        | TableKind::Roofline { common, .. } => common,
    };
    let picture = &common.picture;
    let format = picture.format()?;
    let mut table = read_table(&common.input)?;
    for (column, value) in &common.select {
        table.select(column, value)?;
    }
    let title = picture.title.clone();
    let (chart, what, notes) = match kind {
        TableKind::Line { x, y, series, logx, logy, .. } => {
            let options = plot::line::Options {
                x: x.clone(),
                y: y.clone(),
                series: series.clone(),
                logx: *logx,
                logy: *logy,
                title,
            };
            let chart = plot::line::LineChart::from_table(&table, &options)?;
            let points: usize = chart.series.iter().map(|s| s.points.len()).sum();
            let what = format!("{} line(s), {points} points", chart.series.len());
            let notes = chart.notes.clone();
            (Chart::Line(chart), what, notes)
        }
        TableKind::Bars { x, fraction, .. } => {
            let labels = if x.is_empty() { swept_columns(&table) } else { x.clone() };
            let options = plot::bars::Options { labels, fraction: *fraction, title };
            let chart = plot::bars::BarChart::from_table(&table, &options)?;
            let what = format!("{} bars of {} segments", chart.bars.len(), chart.segments.len());
            (Chart::Bars(chart), what, Vec::new())
        }
        TableKind::Heatmap { x, y, z, .. } => {
            let options = plot::heatmap::Options { x: x.clone(), y: y.clone(), z: z.clone(), title };
            let chart = plot::heatmap::Heatmap::from_table(&table, &options)?;
            let what = format!("{} x {} cells", chart.xs.len(), chart.ys.len());
            (Chart::Heatmap(chart), what, Vec::new())
        }
        TableKind::Accuracy { .. } => {
            let chart = plot::scatter::Scatter::from_table(&table, title)?;
            let points: usize = chart.groups.iter().map(|g| g.points.len()).sum();
            let what = format!("{points} points in {} families", chart.groups.len());
            let notes = chart.notes.clone();
            (Chart::Scatter(chart), what, notes)
        }
        TableKind::Roofline { peak, bandwidth, colour_by, .. } => {
            let options = plot::roofline::Options {
                peak_flops_per_s: peak.map(|rate| rate.per_second()),
                bandwidth_bytes_per_s: bandwidth.map(|rate| rate.bytes_per_second()),
                colour_by: match colour_by {
                    ColourBy::Pass => plot::roofline::ColourBy::Pass,
                    ColourBy::Kind => plot::roofline::ColourBy::Kind,
                },
                title,
            };
            let chart = plot::roofline::Roofline::from_table(&table, &options)?;
            let roofs = chart.roofs;
            let kernels = chart.points().count();
            let below = chart.points().filter(|p| roofs.memory_bound(p.intensity)).count();
            let what = format!(
                "{kernels} kernels in {} groups; {below} left of the ridge at {:.1} FLOP/byte",
                chart.groups.len(),
                roofs.ridge()
            );
            let notes = chart.notes.clone();
            (Chart::Roofline(chart), what, notes)
        }
    };
    picture.write(&chart, format)?;
    stderr!("plot          {} ({what})", picture.output.display());
    let skipped = table.skipped();
    if !skipped.is_empty() {
        stderr!(
            "note: {} row(s) left out ({skipped}): only rows with status ok have results to plot",
            skipped.total()
        );
    }
    for note in notes {
        stderr!("note: {note}");
    }
    Ok(())
}

/// `plot distribution`: each run's `iteration_times_s`, named by its scenario (by its file
/// where two runs share a scenario).
fn plot_distribution(inputs: &[PathBuf], bins: u32, picture: &Picture) -> anyhow::Result<()> {
    let format = picture.format()?;
    let mut runs = Vec::with_capacity(inputs.len());
    for path in inputs {
        let json = read_json(path)?;
        let times = json.get("iteration_times_s").and_then(serde_json::Value::as_array).ok_or_else(|| {
            anyhow::anyhow!(
                "{}: no `iteration_times_s` array: write the file with `parasim run SCENARIO --iterations N --json`",
                path.display()
            )
        })?;
        let times_s = times
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.as_f64().ok_or_else(|| {
                    anyhow::anyhow!(
                        "{}: `iteration_times_s[{i}]` is {t}, not a number of seconds",
                        path.display()
                    )
                })
            })
            .collect::<anyhow::Result<Vec<f64>>>()?;
        let quantile = |key: &str| {
            json.pointer(&format!("/distribution/{key}")).and_then(serde_json::Value::as_f64).ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: no `distribution.{key}`: write the file with `parasim run SCENARIO --iterations N --json`",
                    path.display()
                )
            })
        };
        let (p50_s, p99_s) = (quantile("p50_s")?, quantile("p99_s")?);
        let name = json
            .get("scenario")
            .and_then(serde_json::Value::as_str)
            .and_then(|s| Path::new(s).file_stem())
            .or_else(|| path.file_stem())
            .map_or_else(|| path.display().to_string(), |stem| stem.to_string_lossy().into_owned());
        runs.push(plot::runs::Run { name, source: path.display().to_string(), times_s, p50_s, p99_s });
    }
    // Runs of one scenario (e.g. with and without a `--set`) are told apart by their files.
    let mut names: Vec<&str> = runs.iter().map(|run| run.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|pair| pair[0] == pair[1]) {
        for (run, path) in runs.iter_mut().zip(inputs) {
            run.name =
                path.file_stem().map_or(run.source.clone(), |stem| stem.to_string_lossy().into_owned());
        }
    }
    let chart = plot::runs::distribution(&runs, bins as usize, picture.title.clone())?;
    let iterations: usize = runs.iter().map(|r| r.times_s.len()).sum();
    picture.write(&Chart::Line(chart), format)?;
    stderr!(
        "plot          {} ({} run(s), {iterations} iterations, {bins} bins)",
        picture.output.display(),
        runs.len()
    );
    Ok(())
}

/// `plot goodput`: the run's `goodput.curve`, `best_interval` and Young's interval.
fn plot_goodput(input: &Path, picture: &Picture) -> anyhow::Result<()> {
    let format = picture.format()?;
    let json = read_json(input)?;
    let missing = |key: &str| {
        anyhow::anyhow!(
            "{}: no `{key}`: write the file with `parasim run SCENARIO --hours H --json` on a scenario with a [failures] section",
            input.display()
        )
    };
    let goodput = json.get("goodput").ok_or_else(|| missing("goodput"))?;
    let point = |value: &serde_json::Value, key: &str| -> anyhow::Result<plot::runs::GoodputPoint> {
        let field = |name: &str| {
            value
                .get(name)
                .and_then(serde_json::Value::as_f64)
                .ok_or_else(|| missing(&format!("{key}.{name}")))
        };
        Ok(plot::runs::GoodputPoint {
            iterations: field("iterations")?,
            hours: field("hours")?,
            goodput: field("goodput")?,
        })
    };
    let curve = goodput
        .get("curve")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| missing("goodput.curve"))?
        .iter()
        .map(|p| point(p, "goodput.curve[]"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let best = point(
        goodput.get("best_interval").ok_or_else(|| missing("goodput.best_interval"))?,
        "goodput.best_interval",
    )?;
    let young = goodput.get("young_interval_iterations").and_then(serde_json::Value::as_f64);
    let chart =
        plot::runs::goodput(&input.display().to_string(), &curve, best, young, picture.title.clone())?;
    picture.write(&Chart::Line(chart), format)?;
    stderr!(
        "plot          {} ({} intervals; best every {} iterations, goodput {:.2}%)",
        picture.output.display(),
        curve.len(),
        best.iterations,
        100.0 * best.goodput
    );
    Ok(())
}

/// Reads a JSON file.
fn read_json(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text = fs_err::read_to_string(path)?;
    serde_json::from_str(&text)
        .with_context(|| format!("{}: not JSON (a `parasim run --json` output)", path.display()))
}

/// Reads a CSV file into a table.
fn read_table(path: &Path) -> anyhow::Result<Table> {
    let text = fs_err::read_to_string(path)?;
    Ok(Table::parse(&text, &path.display().to_string())?)
}

/// Renders `chart` and writes it to `path`.
pub fn write_chart(chart: &Chart, format: Format, size: Size, path: &Path) -> anyhow::Result<()> {
    let bytes = chart.render(format, size)?;
    traces::atomic::write(path, bytes).context("writing the plot")?;
    Ok(())
}

/// A sweep's swept columns: those named `axis.KEY`; in a file written before that convention,
/// those between `index` and the metrics, which follow them sorted by name.
fn swept_columns(table: &Table) -> Vec<String> {
    let axes: Vec<String> =
        table.columns.iter().filter(|c| c.starts_with(scenario::sweep::AXIS_PREFIX)).cloned().collect();
    if !axes.is_empty() {
        return axes;
    }
    let metrics = scenario::sweep::metric_columns();
    let columns: Vec<&String> =
        table.columns.iter().filter(|c| !matches!(c.as_str(), "index" | "status" | "error")).collect();
    let is_metric_block = |block: &[&String]| {
        let positions: Option<Vec<usize>> =
            block.iter().map(|c| metrics.iter().position(|m| m == *c)).collect();
        positions.is_some_and(|p| p.windows(2).all(|w| w[0] < w[1]))
    };
    let first_metric = (0..=columns.len()).find(|&p| is_metric_block(&columns[p..])).unwrap_or(columns.len());
    columns[..first_metric].iter().map(|c| (*c).clone()).collect()
}
