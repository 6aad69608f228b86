//! `parasim plot`: charts of a sweep's CSV (scaling curves, stacked breakdowns, heatmaps) and
//! of `parasim validate --csv` (the accuracy scatter), as SVG or PNG by the output's extension.

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
}

/// What every kind takes.
#[derive(Debug, Args)]
struct Common {
    /// The CSV file: `parasim sweep -o FILE.csv` output, or `parasim validate --csv` output for
    /// `accuracy`.
    input: PathBuf,
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

fn log_base(text: &str) -> Result<u32, String> {
    match text {
        "2" => Ok(2),
        "10" => Ok(10),
        other => Err(format!("{other:?} is not a logarithm base: write 2 or 10")),
    }
}

/// Runs the command: writes the picture, and reports it (and any skipped rows) on stderr.
pub fn plot(cli: PlotCli) -> anyhow::Result<()> {
    let common = match &cli.kind {
        Kind::Line { common, .. }
        | Kind::Bars { common, .. }
        | Kind::Heatmap { common, .. }
        | Kind::Accuracy { common } => common,
    };
    let format = Format::of_path(&common.output)?;
    let table = read_table(&common.input)?;
    let title = common.title.clone();
    let (chart, what, notes) = match &cli.kind {
        Kind::Line { x, y, series, logx, logy, .. } => {
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
        Kind::Bars { x, fraction, .. } => {
            let labels = if x.is_empty() { swept_columns(&table) } else { x.clone() };
            let options = plot::bars::Options { labels, fraction: *fraction, title };
            let chart = plot::bars::BarChart::from_table(&table, &options)?;
            let what = format!("{} bars of {} segments", chart.bars.len(), chart.segments.len());
            (Chart::Bars(chart), what, Vec::new())
        }
        Kind::Heatmap { x, y, z, .. } => {
            let options = plot::heatmap::Options { x: x.clone(), y: y.clone(), z: z.clone(), title };
            let chart = plot::heatmap::Heatmap::from_table(&table, &options)?;
            let what = format!("{} x {} cells", chart.xs.len(), chart.ys.len());
            (Chart::Heatmap(chart), what, Vec::new())
        }
        Kind::Accuracy { .. } => {
            let chart = plot::scatter::Scatter::from_table(&table, title)?;
            let points: usize = chart.groups.iter().map(|g| g.points.len()).sum();
            let what = format!("{points} points in {} families", chart.groups.len());
            let notes = chart.notes.clone();
            (Chart::Scatter(chart), what, notes)
        }
    };
    write_chart(&chart, format, Size { width: common.width, height: common.height }, &common.output)?;
    stderr!("plot          {} ({what})", common.output.display());
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
