//! A heatmap of a metric over two axes of a sweep, each cell labelled with its value.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::PlotError;
use crate::line::label_width;
use crate::quantity::{Quantity, format_number};
use crate::render::{FAMILY, Ticks, draw_error, with_legend};
use crate::table::Table;

/// What to plot.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The column along x (its distinct values are the columns of cells).
    pub x: String,
    /// The column along y.
    pub y: String,
    /// The metric that colours the cells.
    pub z: String,
    /// The chart's title.
    pub title: Option<String>,
}

/// A heatmap, ready to draw.
#[derive(Debug, Clone)]
pub struct Heatmap {
    /// The title.
    pub title: Option<String>,
    /// The x axis label.
    pub x_label: String,
    /// The y axis label.
    pub y_label: String,
    /// The colour scale's label, with its unit.
    pub z_label: String,
    /// The x values, left to right.
    pub xs: Vec<String>,
    /// The y values, bottom to top.
    pub ys: Vec<String>,
    /// `cells[y][x]` in the colour scale's unit; `None` where no row is.
    pub cells: Vec<Vec<Option<f64>>>,
}

/// The distinct values of a column: numerically sorted if all are numbers, else in order of
/// first appearance.
fn categories(values: impl Iterator<Item = String>) -> Vec<String> {
    let mut distinct: Vec<String> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for value in values {
        if seen.insert(value.clone()) {
            distinct.push(value);
        }
    }
    if distinct.iter().all(|v| v.parse::<f64>().is_ok()) {
        distinct.sort_by(|a, b| a.parse::<f64>().unwrap_or(0.0).total_cmp(&b.parse::<f64>().unwrap_or(0.0)));
    }
    distinct
}

impl Heatmap {
    /// The chart of `table` that `options` ask for.
    pub fn from_table(table: &Table, options: &Options) -> Result<Heatmap, PlotError> {
        let x = table.column(&options.x)?;
        let y = table.column(&options.y)?;
        let z = table.column(&options.z)?;
        table.require_rows()?;
        let xs = categories(table.rows.iter().map(|r| r.cells[x].clone()));
        let ys = categories(table.rows.iter().map(|r| r.cells[y].clone()));
        let mut cells: Vec<Vec<Option<(f64, usize)>>> = vec![vec![None; xs.len()]; ys.len()];
        let mut highest = 0f64;
        // Each category's column (row) by its text: a scan per cell made the chart quadratic.
        let index = |values: &[String]| -> std::collections::BTreeMap<String, usize> {
            values.iter().enumerate().map(|(i, v)| (v.clone(), i)).rev().collect()
        };
        let (x_index, y_index) = (index(&xs), index(&ys));
        for row in &table.rows {
            let value = table.number(row, z)?;
            highest = highest.max(value.abs());
            let i = x_index.get(&row.cells[x]).copied().unwrap_or(0);
            let j = y_index.get(&row.cells[y]).copied().unwrap_or(0);
            if let Some((_, first)) = cells[j][i] {
                return Err(PlotError::DuplicateCell {
                    file: table.file.clone(),
                    first,
                    second: row.line,
                    cell: format!("{} = {:?} and {} = {:?}", options.x, xs[i], options.y, ys[j]),
                });
            }
            cells[j][i] = Some((value, row.line));
        }
        let scale = Quantity::of_column(&options.z).scale(highest);
        Ok(Heatmap {
            title: options.title.clone(),
            x_label: Quantity::of_column(&options.x).scale(0.0).label,
            y_label: Quantity::of_column(&options.y).scale(0.0).label,
            z_label: scale.label,
            xs,
            ys,
            cells: cells
                .into_iter()
                .map(|row| row.into_iter().map(|c| c.map(|(v, _)| v * scale.factor)).collect())
                .collect(),
        })
    }
}

/// Viridis, from 0 (dark purple) to 1 (yellow): ordered in lightness, readable in grey.
fn viridis(t: f64) -> RGBColor {
    const STOPS: [(f64, f64, f64); 5] = [
        (68.0, 1.0, 84.0),
        (59.0, 82.0, 139.0),
        (33.0, 145.0, 140.0),
        (94.0, 201.0, 98.0),
        (253.0, 231.0, 37.0),
    ];
    let t = t.clamp(0.0, 1.0) * 4.0;
    let i = (t.floor() as usize).min(3);
    let f = t - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |p: f64, q: f64| (p + (q - p) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

pub(crate) fn draw<DB: DrawingBackend>(
    chart: &Heatmap,
    area: &DrawingArea<DB, Shift>,
) -> Result<(), PlotError> {
    let values: Vec<f64> = chart.cells.iter().flatten().flatten().copied().collect();
    let (low, high) =
        values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(*v), h.max(*v)));
    let span = if high > low { high - low } else { 1.0 };
    let (plot, legend) =
        with_legend(area, &[], label_width(area, [chart.z_label.clone()].into_iter())?.max(90))?;
    let (nx, ny) = (chart.xs.len(), chart.ys.len());
    let y_labels = label_width(area, chart.ys.iter().cloned())?;
    let mut context = ChartBuilder::on(&plot)
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(y_labels + 40)
        .build_cartesian_2d(Ticks::categories(nx), Ticks::categories(ny))
        .map_err(draw_error)?;
    let pick = |names: &[String], v: f64| {
        let i = v.round();
        if i >= 0.0 && (i as usize) < names.len() { names[i as usize].clone() } else { String::new() }
    };
    let x_format = |v: &f64| pick(&chart.xs, *v);
    let y_format = |v: &f64| pick(&chart.ys, *v);
    context
        .configure_mesh()
        .disable_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .x_label_formatter(&x_format)
        .y_label_formatter(&y_format)
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .draw()
        .map_err(draw_error)?;
    let (width, height) = plot.dim_in_pixel();
    let cell_width = width.saturating_sub(y_labels + 70) / nx.max(1) as u32;
    let cell_height = height.saturating_sub(80) / ny.max(1) as u32;
    let font = (cell_height / 3).clamp(8, 14);
    for (j, row) in chart.cells.iter().enumerate() {
        for (i, cell) in row.iter().enumerate() {
            let (x, y) = (i as f64, j as f64);
            let corners = [(x - 0.48, y - 0.48), (x + 0.48, y + 0.48)];
            let Some(value) = cell else {
                context
                    .draw_series([Rectangle::new(corners, RGBColor(240, 240, 240).filled())])
                    .map_err(draw_error)?;
                continue;
            };
            let t = (value - low) / span;
            context.draw_series([Rectangle::new(corners, viridis(t).filled())]).map_err(draw_error)?;
            let text = format_number(*value);
            // Only where the label fits in its cell.
            if (text.len() as u32) * font * 6 / 10 + 4 <= cell_width {
                let ink = if t < 0.6 { WHITE } else { BLACK };
                let style = TextStyle::from((FAMILY, font).into_font())
                    .color(&ink)
                    .pos(Pos::new(HPos::Center, VPos::Center));
                context.draw_series([Text::new(text, (x, y), style)]).map_err(draw_error)?;
            }
        }
    }
    // The colour scale: a vertical gradient with its extremes and label.
    let (_, legend_height) = legend.dim_in_pixel();
    let (top, bottom) = (40, legend_height.saturating_sub(80).max(120) as i32);
    let steps = 64;
    for k in 0..steps {
        let y0 = bottom - (bottom - top) * k / steps;
        let y1 = bottom - (bottom - top) * (k + 1) / steps;
        let colour = viridis(f64::from(k) / f64::from(steps - 1));
        legend.draw(&Rectangle::new([(12, y1), (32, y0)], colour.filled())).map_err(draw_error)?;
    }
    let style = TextStyle::from((FAMILY, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    legend.draw_text(&format_number(high), &style, (38, top)).map_err(draw_error)?;
    legend.draw_text(&format_number(low), &style, (38, bottom)).map_err(draw_error)?;
    legend
        .draw_text(&chart.z_label, &TextStyle::from((FAMILY, 14).into_font()), (8, 12))
        .map_err(draw_error)?;
    Ok(())
}
