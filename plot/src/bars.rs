//! Stacked bars of where each configuration's iteration goes, from a sweep's `breakdown.*`
//! columns: compute, exposed communication by communicator kind, the offload stall, the
//! pipeline bubble, host-bound and input-bound time and other idle time; in seconds or as
//! shares of the iteration. Every breakdown column a sweep writes has its segment, so no
//! modelled time is drawn as "other".

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::PlotError;
use crate::line::{label_width, series_name};
use crate::quantity::{Quantity, Unit};
use crate::render::{FAMILY, LegendEntry, Marker, Ticks, colour, draw_error, draw_legend, with_legend};
use crate::table::Table;

/// What to plot.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Columns whose values label each bar (none: the row's `index`).
    pub labels: Vec<String>,
    /// Shares of each bar's iteration instead of seconds.
    pub fraction: bool,
    /// The chart's title.
    pub title: Option<String>,
}

/// One part of every bar.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// The legend's text.
    pub name: String,
    /// Its height in each bar, in axis units.
    pub values: Vec<f64>,
}

/// A stacked bar chart, ready to draw.
#[derive(Debug, Clone)]
pub struct BarChart {
    /// The title.
    pub title: Option<String>,
    /// The y axis label, with its unit.
    pub y_label: String,
    /// The bars' labels, left to right.
    pub bars: Vec<String>,
    /// The segments, bottom to top.
    pub segments: Vec<Segment>,
}

const HINT: &str = " (stacked bars read a parasim sweep's breakdown.* columns: sweep without --columns, or with --columns breakdown)";
const GROUPS: &str = "breakdown.exposed_by_group_s.";

impl BarChart {
    /// The chart of `table` that `options` ask for.
    pub fn from_table(table: &Table, options: &Options) -> Result<BarChart, PlotError> {
        let compute = table.column_or("breakdown.compute_s", HINT)?;
        let exposed = table.column_or("breakdown.exposed_communication_s", HINT)?;
        let idle = table.column_or("breakdown.idle_s", HINT)?;
        let bubble = table.column("breakdown.bubble_s").ok();
        let host = table.column("breakdown.host_bound_s").ok();
        let input = table.column("breakdown.input_bound_s").ok();
        let offload = table.column("breakdown.offload_stall_s").ok();
        let groups: Vec<(usize, String)> = table
            .columns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.strip_prefix(GROUPS).map(|kind| (i, kind.to_string())))
            .collect();
        let labels =
            options.labels.iter().map(|c| table.column(c)).collect::<Result<Vec<usize>, PlotError>>()?;
        let index = table.column("index").ok();
        table.require_rows()?;

        let mut names: Vec<String> = vec!["compute".into()];
        names.extend(groups.iter().map(|(_, kind)| format!("exposed {kind} communication")));
        names.extend(
            [
                "offload stall (host copies)",
                if groups.is_empty() { "exposed communication" } else { "exposed communication, other" },
                "pipeline bubble",
                "host-bound (waiting for launches)",
                "input-bound (waiting for the batch)",
                "other idle",
            ]
            .map(String::from),
        );
        let mut columns: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        let mut bars = Vec::new();
        for row in &table.rows {
            let number = |column: Option<usize>| column.map_or(Ok(0.0), |c| table.number(row, c));
            // A breakdown entry `run --json` leaves out for this configuration (the offload
            // stall without offloading, the spatial halo without spatial parallelism) is empty:
            // no such time.
            let optional = |column: Option<usize>| match column {
                Some(c) if row.cells[c].trim().is_empty() => Ok(0.0),
                other => number(other),
            };
            let mut parts = vec![number(Some(compute))?];
            let mut by_group = 0.0;
            for (column, _) in &groups {
                let value = optional(Some(*column))?;
                by_group += value;
                parts.push(value);
            }
            let exposed = number(Some(exposed))?;
            // The offload stall (copies to or from host memory, no kernel running) is part of
            // the exposed communication outside the communicator groups.
            let stall = optional(offload)?.min(exposed - by_group).max(0.0);
            parts.push(stall);
            let rest = exposed - by_group - stall;
            parts.push(if rest > 1e-9 * exposed.max(1e-12) { rest } else { 0.0 });
            let idle = number(Some(idle))?;
            let bubble = optional(bubble)?.min(idle);
            // Host- and input-bound time are part of idle; count each once, outside the bubble.
            let host = optional(host)?.min(idle - bubble).max(0.0);
            let input = optional(input)?.min(idle - bubble - host).max(0.0);
            let other = idle - bubble - host - input;
            parts.extend([bubble, host, input, if other > 1e-9 * idle.max(1e-12) { other } else { 0.0 }]);
            if options.fraction {
                let total: f64 = parts.iter().sum();
                for part in &mut parts {
                    *part = if total > 0.0 { *part / total } else { 0.0 };
                }
            }
            for (column, part) in columns.iter_mut().zip(parts) {
                column.push(part);
            }
            let values: Vec<&str> = labels.iter().map(|&c| row.cells[c].as_str()).collect();
            bars.push(match (values.is_empty(), index) {
                (false, _) => series_name(&options.labels, &values),
                (true, Some(index)) => format!("#{}", row.cells[index]),
                (true, None) => format!("line {}", row.line),
            });
        }
        let highest = (0..bars.len()).map(|b| columns.iter().map(|c| c[b]).sum::<f64>()).fold(0.0, f64::max);
        let quantity = if options.fraction {
            Quantity { name: "share of the iteration".into(), unit: Unit::Fraction }
        } else {
            Quantity { name: "time per iteration".into(), unit: Unit::Seconds }
        };
        let scale = quantity.scale(highest);
        let segments = names
            .into_iter()
            .zip(columns)
            .filter(|(_, values)| values.iter().any(|v| *v > 0.0))
            .map(|(name, values)| Segment { name, values: values.iter().map(|v| v * scale.factor).collect() })
            .collect();
        Ok(BarChart { title: options.title.clone(), y_label: scale.label, bars, segments })
    }
}

/// The colour of a segment: compute blue, communication warm, idle greys.
fn segment_colour(name: &str, i: usize) -> RGBColor {
    match name {
        "compute" => RGBColor(31, 119, 180),
        "pipeline bubble" => RGBColor(150, 150, 150),
        "other idle" => RGBColor(200, 200, 200),
        n if n.starts_with("host-bound") => RGBColor(140, 86, 75),
        n if n.starts_with("input-bound") => RGBColor(196, 156, 148),
        n if n.starts_with("offload stall") => RGBColor(127, 127, 60),
        _ => [
            RGBColor(255, 127, 14),
            RGBColor(214, 39, 40),
            RGBColor(44, 160, 44),
            RGBColor(148, 103, 189),
            RGBColor(227, 119, 194),
            RGBColor(188, 189, 34),
            RGBColor(23, 190, 207),
            RGBColor(255, 187, 120),
            colour(i),
        ][i.saturating_sub(1).min(8)],
    }
}

pub(crate) fn draw<DB: DrawingBackend>(
    chart: &BarChart,
    area: &DrawingArea<DB, Shift>,
) -> Result<(), PlotError> {
    // Legend top to bottom as the stack reads, top segment first.
    let colours: Vec<RGBColor> =
        chart.segments.iter().enumerate().map(|(i, s)| segment_colour(&s.name, i)).collect();
    let entries: Vec<LegendEntry> = chart
        .segments
        .iter()
        .zip(&colours)
        .rev()
        .map(|(s, c)| LegendEntry { text: s.name.clone(), colour: *c, marker: Marker::Square })
        .collect();
    let (plot, legend) = with_legend(area, &entries, 0)?;
    let n = chart.bars.len();
    let highest = (0..n).map(|b| chart.segments.iter().map(|s| s.values[b]).sum::<f64>()).fold(0.0, f64::max);
    let ys = Ticks::new(0.0, highest.max(f64::MIN_POSITIVE), None, true);
    let y_labels = label_width(area, ys.points.iter().map(|p| ys.label(*p)))?;
    let x_labels = label_width(area, chart.bars.iter().cloned())?;
    let (plot_width, _) = plot.dim_in_pixel();
    let slot = plot_width.saturating_sub(y_labels + 60) / n.max(1) as u32;
    let rotate = x_labels + 8 > slot;
    let x_area = if rotate { x_labels.min(260) + 44 } else { 48 };
    let mut context = ChartBuilder::on(&plot)
        .margin(14)
        .x_label_area_size(x_area)
        .y_label_area_size(y_labels + 40)
        .build_cartesian_2d(Ticks::categories(n), ys.clone())
        .map_err(draw_error)?;
    // Rotated labels are drawn below (plotters centres axis labels on their ticks, which
    // would put half of a rotated label inside the plot).
    let x_format = |v: &f64| {
        let i = v.round();
        if !rotate && i >= 0.0 && (i as usize) < n { chart.bars[i as usize].clone() } else { String::new() }
    };
    let y_format = |v: &f64| ys.label(*v);
    context
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(chart.y_label.as_str())
        .x_label_formatter(&x_format)
        .y_label_formatter(&y_format)
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .bold_line_style(RGBColor(225, 225, 225))
        .light_line_style(WHITE)
        .draw()
        .map_err(draw_error)?;
    if rotate {
        let style = TextStyle::from((FAMILY, 13).into_font())
            .transform(FontTransform::Rotate90)
            .pos(Pos::new(HPos::Left, VPos::Center));
        let (base_x, base_y) = plot.get_base_pixel();
        for (i, label) in chart.bars.iter().enumerate() {
            let (x, y) = context.backend_coord(&(i as f64, ys.lo));
            plot.draw_text(label, &style, (x - base_x, y - base_y + 8)).map_err(draw_error)?;
        }
    }
    let half = if n > 40 { 0.45 } else { 0.35 };
    for bar in 0..n {
        let mut base = 0.0;
        for (segment, colour) in chart.segments.iter().zip(&colours) {
            let top = base + segment.values[bar];
            if top > base {
                let x = bar as f64;
                context
                    .draw_series([Rectangle::new([(x - half, base), (x + half, top)], colour.filled())])
                    .map_err(draw_error)?;
            }
            base = top;
        }
    }
    draw_legend(&legend, &entries, 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offload_stall_and_input_bound_time_have_their_own_segments() {
        let csv = "index,axis.cluster.nodes,breakdown.compute_s,breakdown.exposed_communication_s,\
                   breakdown.exposed_by_group_s.data,breakdown.offload_stall_s,breakdown.idle_s,\
                   breakdown.bubble_s,breakdown.host_bound_s,breakdown.input_bound_s,status,error\n\
                   0,1,1.0,0.5,0.2,0.3,0.4,0.0,0.1,0.3,ok,\n\
                   1,2,1.0,0.2,0.2,,0.1,0.0,0.1,,ok,\n";
        let table = Table::parse(csv, "sweep.csv").unwrap();
        let options = Options { labels: vec!["axis.cluster.nodes".into()], fraction: false, title: None };
        let chart = BarChart::from_table(&table, &options).unwrap();
        let names: Vec<&str> = chart.segments.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "compute",
                "exposed data communication",
                "offload stall (host copies)",
                "host-bound (waiting for launches)",
                "input-bound (waiting for the batch)",
            ],
            "nothing left as other: {names:?}"
        );
        assert_eq!(chart.bars, ["nodes 1", "nodes 2"]);
        // An empty optional entry (the key `run --json` left out) is no time.
        assert_eq!(chart.segments[2].values[1], 0.0);
    }
}
