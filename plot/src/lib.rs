//! Charts of parasim's tables, drawn with plotters as SVG or PNG: scaling curves
//! ([`line`]), stacked per-iteration time breakdowns ([`bars`]), heatmaps over two axes
//! ([`heatmap`]), simulated-against-measured accuracy scatters ([`scatter`]), per-kernel
//! rooflines of a run's per-layer CSV ([`roofline`]), and, from runs' JSON, iteration-time
//! distributions and goodput curves ([`runs`]).
//!
//! The input is a CSV [`table::Table`] (a `parasim sweep` output or `parasim validate --csv`);
//! each chart kind has a `from_table` that picks its columns, naming the file, the line and the
//! column in every error. Rows with a `status` other than `ok` are left out and counted, never
//! plotted as zeros. Axis labels carry units derived from the column names ([`quantity`]).
//! Text is laid out with the DejaVu Sans font compiled into the crate, so PNG output needs no
//! system fonts.
//!
//! ```
//! use plot::{Chart, Format, Size, table::Table};
//!
//! let csv = "index,cluster.gpus,samples_per_second,status,error\n\
//!            0,8,18000,ok,\n1,16,36000,ok,\n2,32,,failed,out of memory\n";
//! let table = Table::parse(csv, "scaling.csv")?;
//! let options = plot::line::Options { x: "cluster.gpus".into(), y: "samples_per_second".into(), ..Default::default() };
//! let chart = plot::line::LineChart::from_table(&table, &options)?;
//! assert_eq!(table.skipped().to_string(), "1 failed");
//! let svg = Chart::Line(chart).render(Format::Svg, Size::default())?;
//! assert!(String::from_utf8_lossy(&svg).contains("<svg"));
//! # Ok::<(), plot::PlotError>(())
//! ```

pub mod bars;
mod glyphs;
pub mod heatmap;
pub mod line;
mod png;
pub mod quantity;
mod render;
pub mod roofline;
pub mod runs;
pub mod scatter;
pub mod table;

pub use render::{Format, Size};

/// Why a chart could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The CSV text is malformed.
    #[error("{file}: line {line}: {message}")]
    Csv {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A column the chart needs is not in the table.
    #[error("{file}: no column `{column}`{hint}; the columns are: {}", available.join(", "))]
    MissingColumn {
        /// The file.
        file: String,
        /// The column asked for.
        column: String,
        /// Where the column is usually found, or empty.
        hint: String,
        /// The table's columns.
        available: Vec<String>,
    },
    /// A cell that must be a number is not.
    #[error("{file}: line {line}: column `{column}`: {value:?} is not a number")]
    NotANumber {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// The column.
        column: String,
        /// The cell's text.
        value: String,
    },
    /// A value too large in magnitude for an axis to span.
    #[error(
        "{file}: line {line}: column `{column}`: {value} is out of range: a chart plots values from -1e300 to 1e300"
    )]
    OutOfRange {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// The column.
        column: String,
        /// The cell's text.
        value: String,
    },
    /// A value cannot be placed on a logarithmic axis.
    #[error(
        "{file}: line {line}: column `{column}` is {value}, which a logarithmic axis cannot show (drop --log{axis})"
    )]
    NotPositive {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// The column.
        column: String,
        /// The value.
        value: f64,
        /// `x` or `y`.
        axis: &'static str,
    },
    /// A kernel's FLOPs, bytes or time below zero.
    #[error(
        "{file}: line {line}: column `{column}` is {value}: a kernel's FLOPs, bytes and time are 0 or more"
    )]
    Negative {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// The column.
        column: String,
        /// The cell's text.
        value: String,
    },
    /// A roofline's peak rate or bandwidth that is not above 0.
    #[error("{place} is {value}: a roof is a rate above 0")]
    BadRoof {
        /// Where it was given: a flag (`--peak`), or the file, line and column.
        place: String,
        /// The value.
        value: String,
    },
    /// No row of a per-layer table can be placed on a roofline's log axes.
    #[error(
        "{file}: none of its {rows} rows has FLOPs, bytes and a kernel time all above 0: a roofline places a kernel by its FLOPs per byte and per second"
    )]
    NoKernels {
        /// The file.
        file: String,
        /// Its rows.
        rows: usize,
    },
    /// No row has the value a `--where COLUMN=VALUE` selects.
    #[error("{file}: no row has {column} = {value:?}; its values are: {}", if values.is_empty() { "none (no rows)".to_string() } else { values.join(", ") })]
    NoMatch {
        /// The file.
        file: String,
        /// The column.
        column: String,
        /// The value asked for.
        value: String,
        /// The column's values, in order of first appearance.
        values: Vec<String>,
    },
    /// Nothing is left to plot.
    #[error("{file}: no rows to plot: {}", if skipped.is_empty() { "the file has column names and no rows".to_string() } else { format!("only rows with status ok have results, and this file has none ({skipped})") })]
    NoData {
        /// The file.
        file: String,
        /// What was skipped, e.g. `2 failed, 1 does-not-fit`.
        skipped: String,
    },
    /// Two rows fall on one heatmap cell.
    #[error(
        "{file}: lines {first} and {second} both have {cell}: a heatmap cell must be one row (sweep fewer axes, or plot a slice of the file)"
    )]
    DuplicateCell {
        /// The file.
        file: String,
        /// The first row's line.
        first: usize,
        /// The second row's line.
        second: usize,
        /// The cell: `X = "a" and Y = "b"`.
        cell: String,
    },
    /// The output's extension names no format.
    #[error("{path}: {reason}; write a file name ending in .svg or .png")]
    UnknownFormat {
        /// The output path.
        path: String,
        /// What is wrong with its name.
        reason: String,
    },
    /// The drawing backend failed.
    #[error("drawing the chart: {0}")]
    Draw(String),
}

/// Any chart this crate draws.
#[derive(Debug, Clone)]
pub enum Chart {
    /// Scaling curves.
    Line(line::LineChart),
    /// Stacked breakdown bars.
    Bars(bars::BarChart),
    /// A heatmap of two axes.
    Heatmap(heatmap::Heatmap),
    /// Simulated against measured.
    Scatter(scatter::Scatter),
    /// Kernels under a device's roofs.
    Roofline(roofline::Roofline),
}

impl Chart {
    /// The chart as the bytes of an SVG or PNG file of `size` pixels.
    pub fn render(&self, format: Format, size: Size) -> Result<Vec<u8>, PlotError> {
        render::render(self, format, size)
    }
}
