//! A roofline chart of a run's kernels (`parasim run --csv` output): log-log, arithmetic
//! intensity (FLOPs per byte of device memory) along x, achieved FLOP/s (FLOPs over kernel
//! time) along y, one dot per kernel coloured by pass or layer kind, under the device's two
//! roofs: the memory-bandwidth slope (`bandwidth x intensity`) and the compute ceiling (the
//! peak rate), which meet at the ridge (`peak / bandwidth` FLOPs per byte). A kernel left of
//! the ridge can at best stream its bytes; one right of it can at best reach the peak.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::PlotError;
use crate::line::label_width;
use crate::quantity::format_number;
use crate::render::{FAMILY, LegendEntry, Marker, Ticks, colour, draw_error, draw_legend, with_legend};
use crate::table::Table;

/// Where the chart's columns usually come from, for a missing-column error.
const HINT: &str = " (plot roofline reads the per-layer CSV of `parasim run SCENARIO --csv FILE`)";

/// The column of the device's peak rate in a per-layer CSV.
pub const PEAK_COLUMN: &str = "peak_flops_per_s";
/// The column of the device's memory bandwidth in a per-layer CSV.
pub const BANDWIDTH_COLUMN: &str = "memory_bandwidth_bytes_per_s";

/// What colours the dots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColourBy {
    /// The `pass` column: forward, backward-data, backward-weight, recompute, optimizer.
    #[default]
    Pass,
    /// The `kind` column: conv2d, linear, batchnorm, ...
    Kind,
}

impl ColourBy {
    /// The column it reads.
    pub fn column(self) -> &'static str {
        match self {
            ColourBy::Pass => "pass",
            ColourBy::Kind => "kind",
        }
    }
}

/// What the chart is asked.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The compute ceiling in FLOP/s; `None` reads the CSV's `peak_flops_per_s`.
    pub peak_flops_per_s: Option<f64>,
    /// The memory bandwidth in bytes per second; `None` reads the CSV's
    /// `memory_bandwidth_bytes_per_s`.
    pub bandwidth_bytes_per_s: Option<f64>,
    /// What colours the dots.
    pub colour_by: ColourBy,
    /// The title.
    pub title: Option<String>,
}

/// A device's two roofs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Roofs {
    /// The compute ceiling, FLOP/s.
    pub peak_flops_per_s: f64,
    /// The memory bandwidth, bytes per second.
    pub bandwidth_bytes_per_s: f64,
}

impl Roofs {
    /// The ridge: the arithmetic intensity (FLOPs per byte) where the bandwidth slope meets the
    /// ceiling.
    pub fn ridge(&self) -> f64 {
        self.peak_flops_per_s / self.bandwidth_bytes_per_s
    }

    /// The highest rate a kernel of `intensity` FLOPs per byte can reach: the lower roof,
    /// `min(peak, bandwidth x intensity)`.
    pub fn attainable(&self, intensity: f64) -> f64 {
        self.peak_flops_per_s.min(self.bandwidth_bytes_per_s * intensity)
    }

    /// Whether a kernel of `intensity` is bound by memory (left of the ridge).
    pub fn memory_bound(&self, intensity: f64) -> bool {
        intensity < self.ridge()
    }
}

/// One kernel's place on the chart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// FLOPs per byte of device memory.
    pub intensity: f64,
    /// FLOPs per second of kernel time.
    pub achieved: f64,
}

/// One colour's dots.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The pass or kind.
    pub name: String,
    /// Its kernels.
    pub points: Vec<Point>,
}

/// A roofline chart, ready to draw.
#[derive(Debug, Clone)]
pub struct Roofline {
    /// The title.
    pub title: Option<String>,
    /// The roofs.
    pub roofs: Roofs,
    /// The dots, by pass or kind, in order of first appearance.
    pub groups: Vec<Group>,
    /// Things the reader should know (rows a log axis cannot show, rows with other roofs).
    pub notes: Vec<String>,
}

impl Roofline {
    /// The roofline of a per-layer table (`flops`, `bytes`, `kernel_time_s`, and `pass` or
    /// `kind`), with the roofs of `options` or, where it gives none, of the table's
    /// `peak_flops_per_s` and `memory_bandwidth_bytes_per_s` columns. A row with no FLOPs, no
    /// bytes or no time (a log axis cannot place it) is left out and counted in a note.
    pub fn from_table(table: &Table, options: &Options) -> Result<Roofline, PlotError> {
        let flops = table.column_or("flops", HINT)?;
        let bytes = table.column_or("bytes", HINT)?;
        let time = table.column_or("kernel_time_s", HINT)?;
        let group = table.column_or(options.colour_by.column(), HINT)?;
        let mut notes = Vec::new();
        let peak = roof(table, options.peak_flops_per_s, (PEAK_COLUMN, "FLOP/s"), "--peak", &mut notes)?;
        let bandwidth =
            roof(table, options.bandwidth_bytes_per_s, (BANDWIDTH_COLUMN, "B/s"), "--bandwidth", &mut notes)?;
        table.require_rows()?;
        let roofs = Roofs { peak_flops_per_s: peak, bandwidth_bytes_per_s: bandwidth };
        let mut groups: Vec<Group> = Vec::new();
        let mut unplottable = 0;
        for row in &table.rows {
            let mut values = [0.0; 3];
            for (value, column) in values.iter_mut().zip([flops, bytes, time]) {
                *value = table.number(row, column)?;
                if *value < 0.0 {
                    return Err(PlotError::Negative {
                        file: table.file.clone(),
                        line: row.line,
                        column: table.columns[column].clone(),
                        value: row.cells[column].trim().to_string(),
                    });
                }
            }
            let [flops, bytes, seconds] = values;
            if flops == 0.0 || bytes == 0.0 || seconds == 0.0 {
                unplottable += 1;
                continue;
            }
            let point = Point { intensity: flops / bytes, achieved: flops / seconds };
            let name = &row.cells[group];
            match groups.iter_mut().find(|g| &g.name == name) {
                Some(found) => found.points.push(point),
                None => groups.push(Group { name: name.clone(), points: vec![point] }),
            }
        }
        if groups.is_empty() {
            return Err(PlotError::NoKernels { file: table.file.clone(), rows: table.rows.len() });
        }
        if unplottable > 0 {
            notes.push(format!(
                "{unplottable} row(s) with no FLOPs, no bytes or no kernel time are not drawn (log axes)"
            ));
        }
        Ok(Roofline { title: options.title.clone(), roofs, groups, notes })
    }

    /// Every dot.
    pub fn points(&self) -> impl Iterator<Item = &Point> {
        self.groups.iter().flat_map(|g| g.points.iter())
    }
}

/// A roof: `given` (a flag's value), else the table's `column` (in `unit`), the highest of its
/// rows (with a note when they differ); positive and finite either way.
fn roof(
    table: &Table,
    given: Option<f64>,
    (column, unit): (&str, &str),
    flag: &str,
    notes: &mut Vec<String>,
) -> Result<f64, PlotError> {
    if let Some(value) = given {
        if !(value.is_finite() && value > 0.0) {
            return Err(PlotError::BadRoof { place: flag.to_string(), value: value.to_string() });
        }
        return Ok(value);
    }
    let hint = format!(" (`parasim run --csv` writes it; or give {flag})");
    let index = table.column_or(column, &hint)?;
    let mut values = Vec::with_capacity(table.rows.len());
    for row in &table.rows {
        let value = table.number(row, index)?;
        if value <= 0.0 {
            return Err(PlotError::BadRoof {
                place: format!("{}: line {}: column `{column}`", table.file, row.line),
                value: row.cells[index].trim().to_string(),
            });
        }
        values.push(value);
    }
    let highest = values.iter().copied().fold(0.0, f64::max);
    let lowest = values.iter().copied().fold(f64::INFINITY, f64::min);
    if lowest < highest {
        notes.push(format!(
            "rows give `{column}` from {} to {}: the chart draws the highest (give {flag} to choose)",
            si(lowest, unit),
            si(highest, unit)
        ));
    }
    Ok(highest)
}

/// A rate in FLOP/s or bytes/s with an SI prefix: `312 TFLOP/s`, `2.04 TB/s`.
fn si(value: f64, unit: &str) -> String {
    let (divisor, prefix) = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(d, _)| value >= *d)
        .unwrap_or((1.0, ""));
    let scaled = value / divisor;
    let text = format!("{scaled:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} {prefix}{unit}")
}

pub(crate) fn draw<DB: DrawingBackend>(
    chart: &Roofline,
    area: &DrawingArea<DB, Shift>,
) -> Result<(), PlotError> {
    let roofs = chart.roofs;
    let ridge = roofs.ridge();
    let roof_colour = RGBColor(40, 40, 40);
    let mut entries: Vec<LegendEntry> = chart
        .groups
        .iter()
        .enumerate()
        .map(|(i, g)| LegendEntry {
            text: format!("{} ({})", g.name, g.points.len()),
            colour: colour(i),
            marker: Marker::Dot,
        })
        .collect();
    entries.push(LegendEntry {
        text: format!("peak {}", si(roofs.peak_flops_per_s, "FLOP/s")),
        colour: roof_colour,
        marker: Marker::Rule,
    });
    entries.push(LegendEntry {
        text: format!("memory {}", si(roofs.bandwidth_bytes_per_s, "B/s")),
        colour: roof_colour,
        marker: Marker::Rule,
    });
    entries.push(LegendEntry {
        text: format!("ridge {} FLOP/byte", format_number(ridge)),
        colour: RGBColor(170, 170, 170),
        marker: Marker::Rule,
    });
    let (plot, legend) = with_legend(area, &entries, 0)?;
    // The axes cover every dot and the ridge with room on both sides, so both roofs show.
    let (mut x_min, mut x_max) = (ridge / 4.0, ridge * 4.0);
    let (mut y_min, y_max) = (roofs.attainable(x_min), roofs.peak_flops_per_s);
    for point in chart.points() {
        x_min = x_min.min(point.intensity);
        x_max = x_max.max(point.intensity);
        y_min = y_min.min(point.achieved);
    }
    // y in TFLOP/s (GFLOP/s for a device under 1 TFLOP/s): short tick labels.
    let (scale, unit) = if roofs.peak_flops_per_s >= 1e12 { (1e12, "TFLOP/s") } else { (1e9, "GFLOP/s") };
    let xs = Ticks::new(x_min, x_max, Some(10), false);
    let ys = Ticks::new(y_min / scale, y_max.max(y_min) / scale, Some(10), false);
    let y_labels = label_width(&plot, ys.points.iter().map(|p| ys.label(*p)))?;
    let mut context = ChartBuilder::on(&plot)
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(y_labels + 40)
        .build_cartesian_2d(xs.clone(), ys.clone())
        .map_err(draw_error)?;
    let x_format = |v: &f64| xs.label(*v);
    let y_format = |v: &f64| ys.label(*v);
    let y_desc = format!("achieved ({unit})");
    context
        .configure_mesh()
        .x_desc("arithmetic intensity (FLOP/byte)")
        .y_desc(y_desc.as_str())
        .x_label_formatter(&x_format)
        .y_label_formatter(&y_format)
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .bold_line_style(RGBColor(230, 230, 230))
        .light_line_style(WHITE)
        .draw()
        .map_err(draw_error)?;
    // In plot coordinates (log10): the slope is y = log(bandwidth / scale) + x, cut where it
    // enters the plot, up to the ridge; the ceiling runs from the ridge to the right edge.
    let (ridge_x, ceiling_y) = (ridge.log10(), (roofs.peak_flops_per_s / scale).log10());
    let slope_offset = (roofs.bandwidth_bytes_per_s / scale).log10();
    let slope_start = xs.lo.max(ys.lo - slope_offset);
    context
        .draw_series([PathElement::new(
            vec![(ridge_x, ys.lo), (ridge_x, ceiling_y)],
            RGBColor(170, 170, 170).stroke_width(1),
        )])
        .map_err(draw_error)?;
    context
        .draw_series([PathElement::new(
            vec![(slope_start, slope_start + slope_offset), (ridge_x, ceiling_y), (xs.hi, ceiling_y)],
            roof_colour.stroke_width(2),
        )])
        .map_err(draw_error)?;
    for (i, group) in chart.groups.iter().enumerate() {
        let style = colour(i).mix(0.7).filled();
        context
            .draw_series(
                group
                    .points
                    .iter()
                    .map(|p| Circle::new((p.intensity.log10(), (p.achieved / scale).log10()), 3, style)),
            )
            .map_err(draw_error)?;
    }
    draw_legend(&legend, &entries, 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A100: Roofs = Roofs { peak_flops_per_s: 312e12, bandwidth_bytes_per_s: 2.039e12 };

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
    }

    #[test]
    fn a_point_at_the_ridge_lies_on_both_roofs() {
        let ridge = A100.ridge();
        assert!(close(ridge, 312e12 / 2.039e12));
        // On the slope and on the ceiling at once.
        assert!(close(A100.bandwidth_bytes_per_s * ridge, A100.peak_flops_per_s));
        assert!(close(A100.attainable(ridge), A100.peak_flops_per_s));
        // Left of it the slope is the lower roof, right of it the ceiling.
        assert!(close(A100.attainable(ridge / 2.0), A100.peak_flops_per_s / 2.0));
        assert!(close(A100.attainable(ridge * 2.0), A100.peak_flops_per_s));
        assert!(A100.memory_bound(ridge / 2.0) && !A100.memory_bound(ridge));
    }

    fn table(rows: &str) -> Table {
        let csv = format!(
            "stage,layer,name,kind,pass,flops,kernel_time_s,bytes,peak_flops_per_s,memory_bandwidth_bytes_per_s\n{rows}"
        );
        Table::parse(&csv, "layers.csv").unwrap()
    }

    #[test]
    fn a_kernel_at_peak_lies_on_the_ceiling() {
        // 312 GFLOP in 1 ms over 100 MB: 3120 FLOP/byte, right of the ridge, at 312 TFLOP/s.
        let table = table(
            "0,0,fc,linear,forward,312e9,0.001,1e8,312e12,2.039e12\n\
             0,1,bn,batchnorm,backward-data,1e6,0.001,2.039e9,312e12,2.039e12\n",
        );
        let chart = Roofline::from_table(&table, &Options::default()).unwrap();
        assert_eq!(chart.roofs, A100);
        let names: Vec<&str> = chart.groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["forward", "backward-data"]);
        let peak = chart.groups[0].points[0];
        assert!(close(peak.achieved, A100.peak_flops_per_s));
        assert!(close(peak.achieved, A100.attainable(peak.intensity)));
        assert!(!A100.memory_bound(peak.intensity));
        // 2.039 GB in 1 ms: the memory roof exactly, far left of the ridge.
        let streaming = chart.groups[1].points[0];
        assert!(close(streaming.achieved / streaming.intensity, A100.bandwidth_bytes_per_s));
        assert!(close(streaming.achieved, A100.attainable(streaming.intensity)));
        assert!(A100.memory_bound(streaming.intensity));
        let svg = crate::Chart::Roofline(chart).render(crate::Format::Svg, crate::Size::default()).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.contains("peak 312 TFLOP/s") && svg.contains("memory 2.039 TB/s"), "{svg}");
    }

    #[test]
    fn flags_override_the_columns_and_kinds_colour_the_dots() {
        let table = table("0,0,fc,linear,forward,1e9,0.001,1e6,312e12,2.039e12\n");
        let options = Options {
            peak_flops_per_s: Some(100e12),
            bandwidth_bytes_per_s: Some(1e12),
            colour_by: ColourBy::Kind,
            title: None,
        };
        let chart = Roofline::from_table(&table, &options).unwrap();
        assert_eq!(chart.roofs.ridge(), 100.0);
        assert_eq!(chart.groups[0].name, "linear");
    }

    fn error(rows: &str, options: &Options) -> String {
        Roofline::from_table(&table(rows), options).unwrap_err().to_string()
    }

    #[test]
    fn bad_input_is_named_by_file_line_and_column() {
        let ok = "0,0,fc,linear,forward,1e9,0.001,1e6,312e12,2.039e12\n";
        let options = Options::default();
        assert_eq!(
            error(&format!("{ok}0,1,bn,batchnorm,forward,1e9,-0.001,1e6,312e12,2.039e12\n"), &options),
            "layers.csv: line 3: column `kernel_time_s` is -0.001: a kernel's FLOPs, bytes and time are 0 or more"
        );
        assert_eq!(
            error("0,1,bn,batchnorm,forward,1e9,0.001,1e6,0,2.039e12\n", &options),
            "layers.csv: line 2: column `peak_flops_per_s` is 0: a roof is a rate above 0"
        );
        let bad_flag = Options { bandwidth_bytes_per_s: Some(0.0), ..Options::default() };
        assert_eq!(error(ok, &bad_flag), "--bandwidth is 0: a roof is a rate above 0");
        assert_eq!(
            error("0,1,bn,batchnorm,forward,0,0.001,1e6,312e12,2.039e12\n", &options),
            "layers.csv: none of its 1 rows has FLOPs, bytes and a kernel time all above 0: a roofline places a kernel by its FLOPs per byte and per second"
        );
        let old = Table::parse("stage,pass,flops,kernel_time_s\n0,forward,1,1\n", "old.csv").unwrap();
        let message = Roofline::from_table(&old, &options).unwrap_err().to_string();
        assert_eq!(
            message,
            "old.csv: no column `bytes` (plot roofline reads the per-layer CSV of `parasim run SCENARIO --csv FILE`); the columns are: stage, pass, flops, kernel_time_s"
        );
    }

    #[test]
    fn rows_without_work_are_counted_and_other_roofs_noted() {
        let table = table(
            "0,0,fc,linear,forward,1e9,0.001,1e6,312e12,2.039e12\n\
             0,1,drop,dropout,forward,0,0.001,1e6,312e12,2.039e12\n\
             1,2,fc,linear,forward,1e9,0.001,1e6,156e12,2.039e12\n",
        );
        let chart = Roofline::from_table(&table, &Options::default()).unwrap();
        assert_eq!(chart.points().count(), 2);
        assert_eq!(chart.roofs.peak_flops_per_s, 312e12);
        assert_eq!(
            chart.notes,
            [
                "rows give `peak_flops_per_s` from 156 TFLOP/s to 312 TFLOP/s: the chart draws the highest (give --peak to choose)",
                "1 row(s) with no FLOPs, no bytes or no kernel time are not drawn (log axes)"
            ]
        );
    }
}
