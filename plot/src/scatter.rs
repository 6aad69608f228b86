//! Simulated against measured on log-log axes (`parasim validate --csv` output): one dot per
//! case or point, coloured by family, the y = x line and the ±10% band shaded; one panel per
//! unit (s, ms, s/epoch, fractions, ...), so that no axis mixes units.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::PlotError;
use crate::line::label_width;
use crate::render::{FAMILY, LegendEntry, Marker, Ticks, colour, draw_error, draw_legend, with_legend};
use crate::table::Table;

/// One family's dots.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The family's id.
    pub name: String,
    /// The legend's text (the family, its unit and mean accuracy).
    pub label: String,
    /// The unit of its values (`validate --csv`'s `unit`; empty when the table has none).
    pub unit: String,
    /// (measured, simulated).
    pub points: Vec<(f64, f64)>,
}

/// An accuracy scatter, ready to draw.
#[derive(Debug, Clone)]
pub struct Scatter {
    /// The title.
    pub title: Option<String>,
    /// The shaded band: simulated within this fraction of measured.
    pub band: f64,
    /// The groups, in order of first appearance.
    pub groups: Vec<Group>,
    /// Things the reader should know (points that a log axis cannot show).
    pub notes: Vec<String>,
}

const HINT: &str = " (the accuracy scatter reads parasim validate --csv output)";

impl Scatter {
    /// The scatter of a `parasim validate --csv` table (`measured`, `simulated`, and
    /// optionally `family`, `unit`, `accuracy`).
    pub fn from_table(table: &Table, title: Option<String>) -> Result<Scatter, PlotError> {
        let measured = table.column_or("measured", HINT)?;
        let simulated = table.column_or("simulated", HINT)?;
        let family = table.column("family").ok();
        let unit = table.column("unit").ok();
        let accuracy = table.column("accuracy").ok();
        table.require_rows()?;
        // (name, unit, points, accuracies)
        type Collected = (String, String, Vec<(f64, f64)>, Vec<f64>);
        let mut groups: Vec<Collected> = Vec::new();
        // Each group's position in `groups` by name (a scan per row was quadratic in groups).
        let mut positions: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
        let mut unplottable = 0;
        for row in &table.rows {
            let point = (table.number(row, measured)?, table.number(row, simulated)?);
            let score = match accuracy {
                Some(c) => table.number(row, c)?,
                None => (1.0 - ((point.1 - point.0) / point.0).abs()).max(0.0),
            };
            let name = family.map_or("cases".to_string(), |c| row.cells[c].clone());
            let index = match positions.get(&name) {
                Some(&index) => index,
                None => {
                    let unit = unit.map_or(String::new(), |c| row.cells[c].clone());
                    positions.insert(name.clone(), groups.len());
                    groups.push((name, unit, Vec::new(), Vec::new()));
                    groups.len() - 1
                }
            };
            groups[index].3.push(score);
            if point.0 > 0.0 && point.1 > 0.0 {
                groups[index].2.push(point);
            } else {
                unplottable += 1;
            }
        }
        let mut notes = Vec::new();
        if unplottable > 0 {
            notes.push(format!("{unplottable} row(s) with a measured or simulated value of 0 or less are not drawn (log axes)"));
        }
        let groups = groups
            .into_iter()
            .map(|(name, unit, points, scores)| {
                let mean = 100.0 * scores.iter().sum::<f64>() / scores.len().max(1) as f64;
                let label = if unit.is_empty() { name.clone() } else { format!("{name}, {unit}") };
                Group { label: format!("{label} ({mean:.1}%)"), name, points, unit }
            })
            .collect();
        Ok(Scatter { title, band: 0.1, groups, notes })
    }
}

pub(crate) fn draw<DB: DrawingBackend>(
    chart: &Scatter,
    area: &DrawingArea<DB, Shift>,
) -> Result<(), PlotError> {
    let band_colour = RGBColor(221, 221, 221);
    let line_colour = RGBColor(85, 85, 85);
    let mut entries: Vec<LegendEntry> = chart
        .groups
        .iter()
        .enumerate()
        .map(|(i, g)| LegendEntry { text: g.label.clone(), colour: colour(i), marker: Marker::Dot })
        .collect();
    entries.push(LegendEntry {
        text: format!("within ±{:.0}%", 100.0 * chart.band),
        colour: band_colour,
        marker: Marker::Square,
    });
    entries.push(LegendEntry {
        text: "simulated = measured".into(),
        colour: line_colour,
        marker: Marker::Rule,
    });
    let (plot, legend) = with_legend(area, &entries, 0)?;
    // One panel per unit, in order of first appearance: a panel's axes hold one unit.
    let mut units: Vec<&str> = Vec::new();
    for group in &chart.groups {
        if !units.contains(&group.unit.as_str()) {
            units.push(&group.unit);
        }
    }
    if units.is_empty() {
        units.push("");
    }
    let columns = (units.len() as f64).sqrt().ceil() as usize;
    let rows = units.len().div_ceil(columns);
    let panels = plot.split_evenly((rows, columns));
    for (unit, panel) in units.iter().zip(&panels) {
        let members: Vec<(usize, &Group)> =
            chart.groups.iter().enumerate().filter(|(_, g)| g.unit == *unit).collect();
        let (x_desc, y_desc) = if unit.is_empty() {
            ("measured".to_string(), "simulated".to_string())
        } else {
            (format!("measured ({unit})"), format!("simulated ({unit})"))
        };
        draw_panel(chart.band, &members, panel, &x_desc, &y_desc, band_colour, line_colour)?;
    }
    draw_legend(&legend, &entries, 30)
}

/// One unit's panel: its groups' dots on log-log axes, the band and the y = x line.
fn draw_panel<DB: DrawingBackend>(
    band: f64,
    members: &[(usize, &Group)],
    panel: &DrawingArea<DB, Shift>,
    x_desc: &str,
    y_desc: &str,
    band_colour: RGBColor,
    line_colour: RGBColor,
) -> Result<(), PlotError> {
    let all = members.iter().flat_map(|(_, g)| g.points.iter()).flat_map(|p| [p.0, p.1]);
    let (min, max) = all.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(v), h.max(v)));
    let (min, max) = if min.is_finite() { (min, max) } else { (1e-6, 1.0) };
    let ticks = Ticks::new(min, max, Some(10), false);
    let y_labels = label_width(panel, ticks.points.iter().map(|p| ticks.label(*p)))?;
    let mut context = ChartBuilder::on(panel)
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(y_labels + 40)
        .build_cartesian_2d(ticks.clone(), ticks.clone())
        .map_err(draw_error)?;
    let format = |v: &f64| ticks.label(*v);
    context
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&format)
        .y_label_formatter(&format)
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .bold_line_style(RGBColor(235, 235, 235))
        .light_line_style(WHITE)
        .draw()
        .map_err(draw_error)?;
    let (lo, hi) = (ticks.lo, ticks.hi);
    let (up, down) = ((1.0 + band).log10(), -(1.0 - band).log10());
    // The band between simulated = (1 - band) x measured and (1 + band) x measured, cut to
    // the plot's square.
    let band = vec![(lo, lo), (lo, lo + up), (hi - up, hi), (hi, hi), (hi, hi - down), (lo + down, lo)];
    context.draw_series([Polygon::new(band, band_colour.filled())]).map_err(draw_error)?;
    context
        .draw_series([PathElement::new(vec![(lo, lo), (hi, hi)], line_colour.stroke_width(1))])
        .map_err(draw_error)?;
    for (i, group) in members {
        let style = colour(*i).mix(0.75).filled();
        context
            .draw_series(group.points.iter().map(|&(m, s)| Circle::new((m.log10(), s.log10()), 4, style)))
            .map_err(draw_error)?;
    }
    Ok(())
}
