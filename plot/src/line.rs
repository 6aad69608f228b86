//! Scaling curves: a numeric column against another, one line per value of the series
//! columns (e.g. throughput against GPUs, one line per network bandwidth).

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::PlotError;
use crate::quantity::Quantity;
use crate::render::{FAMILY, LegendEntry, Marker, Ticks, colour, draw_error, draw_legend, with_legend};
use crate::table::Table;

/// What to plot.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The x column.
    pub x: String,
    /// The y column.
    pub y: String,
    /// Columns whose values tell the series apart (none: one series).
    pub series: Vec<String>,
    /// Logarithmic x axis in this base (2 or 10).
    pub logx: Option<u32>,
    /// Logarithmic y axis in this base.
    pub logy: Option<u32>,
    /// The chart's title.
    pub title: Option<String>,
}

/// One line: (x, y) in axis units, sorted by x.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The legend's text.
    pub name: String,
    /// The points.
    pub points: Vec<(f64, f64)>,
}

/// A line chart, ready to draw.
#[derive(Debug, Clone)]
pub struct LineChart {
    /// The title.
    pub title: Option<String>,
    /// The x axis label, with its unit.
    pub x_label: String,
    /// The y axis label, with its unit.
    pub y_label: String,
    /// Logarithmic x axis base.
    pub logx: Option<u32>,
    /// Logarithmic y axis base.
    pub logy: Option<u32>,
    /// The lines, in order of first appearance in the table.
    pub series: Vec<Series>,
    /// Things the reader of the chart should know (e.g. x values repeated within a series).
    pub notes: Vec<String>,
}

/// A series' name from its columns' values: a bare number gets its column's name
/// (`tensor 8`), a value with a unit stands alone (`200 Gb/s`).
pub(crate) fn series_name(columns: &[String], values: &[&str]) -> String {
    let parts: Vec<String> = columns
        .iter()
        .zip(values)
        .map(|(column, value)| {
            if value.parse::<f64>().is_ok() || value.is_empty() {
                let leaf = column.rsplit('.').next().unwrap_or(column);
                format!("{} {value}", leaf.replace(['_', '-'], " "))
            } else {
                value.to_string()
            }
        })
        .collect();
    parts.join(", ")
}

impl LineChart {
    /// The chart of `table` that `options` ask for.
    pub fn from_table(table: &Table, options: &Options) -> Result<LineChart, PlotError> {
        let x = table.column(&options.x)?;
        let y = table.column(&options.y)?;
        let series_columns =
            options.series.iter().map(|s| table.column(s)).collect::<Result<Vec<usize>, PlotError>>()?;
        table.require_rows()?;
        let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        // Each series' position in `series` (first seen first), by name: a scan of the series
        // per row made the chart quadratic in series.
        let mut position: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
        let (mut max_x, mut max_y) = (0f64, 0f64);
        for row in &table.rows {
            let point = (table.number(row, x)?, table.number(row, y)?);
            for (value, column, axis, log) in
                [(point.0, x, "x", options.logx), (point.1, y, "y", options.logy)]
            {
                if log.is_some() && value <= 0.0 {
                    return Err(PlotError::NotPositive {
                        file: table.file.clone(),
                        line: row.line,
                        column: table.columns[column].clone(),
                        value,
                        axis,
                    });
                }
            }
            max_x = max_x.max(point.0.abs());
            max_y = max_y.max(point.1.abs());
            let values: Vec<&str> = series_columns.iter().map(|&c| row.cells[c].as_str()).collect();
            let name = if values.is_empty() {
                Quantity::of_column(&options.y).name
            } else {
                series_name(&options.series, &values)
            };
            match position.get(&name) {
                Some(&index) => series[index].1.push(point),
                None => {
                    position.insert(name.clone(), series.len());
                    series.push((name, vec![point]));
                }
            }
        }
        let x_scale = Quantity::of_column(&options.x).scale(max_x);
        let y_scale = Quantity::of_column(&options.y).scale(max_y);
        let mut repeated = 0;
        let series: Vec<Series> = series
            .into_iter()
            .map(|(name, mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                repeated += points.windows(2).filter(|w| w[0].0 == w[1].0).count();
                let points =
                    points.into_iter().map(|(a, b)| (a * x_scale.factor, b * y_scale.factor)).collect();
                Series { name, points }
            })
            .collect();
        let mut notes = Vec::new();
        if repeated > 0 {
            notes.push(format!(
                "{repeated} point(s) share an x value with another point of their series: the rows differ in a column that is not a series column (add it with --series)"
            ));
        }
        Ok(LineChart {
            title: options.title.clone(),
            x_label: x_scale.label,
            y_label: y_scale.label,
            logx: options.logx,
            logy: options.logy,
            series,
            notes,
        })
    }
}

/// Axis ticks for `values`.
fn ticks_of(values: impl Iterator<Item = f64>, log: Option<u32>, from_zero: bool) -> Ticks {
    let (min, max) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if min.is_finite() { Ticks::new(min, max, log, from_zero) } else { Ticks::new(1.0, 10.0, log, from_zero) }
}

/// The width of the widest of `labels` in the axis font.
pub(crate) fn label_width<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    labels: impl Iterator<Item = String>,
) -> Result<u32, PlotError> {
    let style = (FAMILY, 13).into_text_style(area);
    let mut widest = 0;
    for label in labels {
        widest = widest.max(area.estimate_text_size(&label, &style).map_err(draw_error)?.0);
    }
    Ok(widest)
}

pub(crate) fn draw<DB: DrawingBackend>(
    chart: &LineChart,
    area: &DrawingArea<DB, Shift>,
) -> Result<(), PlotError> {
    let entries: Vec<LegendEntry> = chart
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| LegendEntry { text: s.name.clone(), colour: colour(i), marker: Marker::Line })
        .collect();
    let (plot, legend) = if entries.len() > 1 {
        let (plot, legend) = with_legend(area, &entries, 0)?;
        (plot, Some(legend))
    } else {
        (area.clone(), None)
    };
    let points = || chart.series.iter().flat_map(|s| s.points.iter());
    let xs = ticks_of(points().map(|p| p.0), chart.logx, false);
    let ys = ticks_of(points().map(|p| p.1), chart.logy, true);
    let y_labels = label_width(area, ys.points.iter().map(|p| ys.label(*p)))?;
    let mut context = ChartBuilder::on(&plot)
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(y_labels + 40)
        .build_cartesian_2d(xs.clone(), ys.clone())
        .map_err(draw_error)?;
    let x_format = |v: &f64| xs.label(*v);
    let y_format = |v: &f64| ys.label(*v);
    context
        .configure_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .x_label_formatter(&x_format)
        .y_label_formatter(&y_format)
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .bold_line_style(RGBColor(225, 225, 225))
        .light_line_style(WHITE)
        .draw()
        .map_err(draw_error)?;
    for (i, series) in chart.series.iter().enumerate() {
        let colour = colour(i);
        let plotted: Vec<(f64, f64)> =
            series.points.iter().map(|&(x, y)| (xs.to_plot(x), ys.to_plot(y))).collect();
        context
            .draw_series(LineSeries::new(plotted.iter().copied(), colour.stroke_width(2)))
            .map_err(draw_error)?;
        context
            .draw_series(plotted.iter().map(|&p| Circle::new(p, 4, colour.filled())))
            .map_err(draw_error)?;
    }
    if let Some(legend) = legend {
        draw_legend(&legend, &entries, 30)?;
    }
    Ok(())
}
