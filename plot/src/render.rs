//! Output formats, the embedded font, and what every chart shares: title, axes with nice or
//! logarithmic ticks, a legend beside the plot (never over the data), the palette.

use std::path::Path;
use std::sync::Once;

use std::ops::Range;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::quantity::format_number;
use crate::{Chart, PlotError};

/// DejaVu Sans (assets/fonts/README.md): text is measured and rasterised with it.
pub(crate) static FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");
/// The family name charts ask for; SVG viewers substitute their own sans-serif.
pub(crate) const FAMILY: &str = "sans-serif";

pub(crate) fn register_font() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // The font is compiled in and known to parse (a unit test renders with it).
        let _ = plotters::style::register_font(FAMILY, FontStyle::Normal, FONT);
    });
}

/// An output file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Scalable vector graphics.
    Svg,
    /// A PNG image.
    Png,
}

impl Format {
    /// The format a file name asks for by its extension (`.svg`, `.png`, any case).
    pub fn of_path(path: &Path) -> Result<Format, PlotError> {
        let unknown = |reason: String| PlotError::UnknownFormat { path: path.display().to_string(), reason };
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .ok_or_else(|| unknown("the name has no extension".into()))?;
        match extension.to_ascii_lowercase().as_str() {
            "svg" => Ok(Format::Svg),
            "png" => Ok(Format::Png),
            other => Err(unknown(format!(".{other} names no image format"))),
        }
    }
}

/// An image's size in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// Width.
    pub width: u32,
    /// Height.
    pub height: u32,
}

impl Default for Size {
    fn default() -> Size {
        Size { width: 960, height: 640 }
    }
}

pub(crate) fn render(chart: &Chart, format: Format, size: Size) -> Result<Vec<u8>, PlotError> {
    register_font();
    let dimensions = (size.width, size.height);
    match format {
        Format::Svg => {
            let mut text = String::new();
            {
                let root = SVGBackend::with_string(&mut text, dimensions).into_drawing_area();
                draw(chart, &root)?;
                root.present().map_err(draw_error)?;
            }
            Ok(text.into_bytes())
        }
        Format::Png => png(size, |root| draw(chart, root)),
    }
}

/// The backend PNG charts are drawn on.
pub(crate) type PngBackend<'a> = crate::glyphs::GlyphText<'a>;

/// A white PNG canvas of `size` drawn on by `draw`, encoded: the one path every PNG chart takes
/// (its text is tested through it).
pub(crate) fn png(
    size: Size,
    draw: impl FnOnce(&Area<PngBackend<'_>>) -> Result<(), PlotError>,
) -> Result<Vec<u8>, PlotError> {
    let mut pixels = vec![255u8; size.width as usize * size.height as usize * 3];
    {
        let bitmap = BitMapBackend::with_buffer(&mut pixels, (size.width, size.height));
        // Text through crate::glyphs: plotters' bitmap text lets neighbouring glyphs touch.
        let root = crate::glyphs::GlyphText::new(bitmap, FONT)
            .map_err(|e| PlotError::Draw(format!("the embedded font: {e}")))?
            .into_drawing_area();
        draw(&root)?;
        root.present().map_err(draw_error)?;
    }
    crate::png::encode(size.width, size.height, &pixels)
        .map_err(|e| PlotError::Draw(format!("encoding the PNG: {e}")))
}

fn draw<DB: DrawingBackend>(chart: &Chart, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
    root.fill(&WHITE).map_err(draw_error)?;
    let title = match chart {
        Chart::Line(c) => &c.title,
        Chart::Bars(c) => &c.title,
        Chart::Heatmap(c) => &c.title,
        Chart::Scatter(c) => &c.title,
        Chart::Roofline(c) => &c.title,
    };
    let area = match title {
        Some(title) => root.titled(title, (FAMILY, 20)).map_err(draw_error)?,
        None => root.margin(8, 0, 0, 0),
    };
    match chart {
        Chart::Line(c) => crate::line::draw(c, &area),
        Chart::Bars(c) => crate::bars::draw(c, &area),
        Chart::Heatmap(c) => crate::heatmap::draw(c, &area),
        Chart::Scatter(c) => crate::scatter::draw(c, &area),
        Chart::Roofline(c) => crate::roofline::draw(c, &area),
    }
}

/// A drawing area in pixels.
pub(crate) type Area<DB> = DrawingArea<DB, Shift>;

/// A plotters error as ours.
pub(crate) fn draw_error(error: impl std::fmt::Display) -> PlotError {
    PlotError::Draw(error.to_string())
}

/// Tableau's 10 colours (distinct, and readable for most colour-blind viewers), then two dark
/// ones, so a dozen series (the validation suite's families) never share a colour.
pub(crate) const PALETTE: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(57, 59, 121),
    RGBColor(173, 73, 74),
];

/// The `i`th colour of the palette (cycling).
pub(crate) fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// One axis of a numeric chart: its range and ticks in plot coordinates (log_base of the value
/// on a logarithmic axis).
#[derive(Debug, Clone)]
pub(crate) struct Ticks {
    pub lo: f64,
    pub hi: f64,
    pub points: Vec<f64>,
    pub log: Option<u32>,
}

impl Ticks {
    /// Ticks for values from `min` to `max` (both positive on a logarithmic axis);
    /// `from_zero` starts a linear axis at 0 when the values are positive.
    pub fn new(min: f64, max: f64, log: Option<u32>, from_zero: bool) -> Ticks {
        match log {
            Some(base) => {
                let b = f64::from(base);
                let (lo, hi) = (min.log(b), max.log(b));
                let pad = ((hi - lo) * 0.06).max(0.15);
                let (lo, hi) = (lo - pad, hi + pad);
                let mut points: Vec<f64> = (lo.ceil() as i64..=hi.floor() as i64).map(|e| e as f64).collect();
                if base == 10 && points.len() < 3 {
                    // Less than two decades: 2 and 5 of each decade too.
                    points = (lo.floor() as i64..=hi.ceil() as i64)
                        .flat_map(|e| [1.0, 2.0, 5.0].map(|m: f64| e as f64 + m.log10()))
                        .filter(|p| *p >= lo && *p <= hi)
                        .collect();
                }
                Ticks { lo, hi, points, log }
            }
            None => {
                let mut lo = if from_zero && min > 0.0 { 0.0 } else { min };
                let mut hi = max;
                if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
                    let spread = if hi == 0.0 { 1.0 } else { hi.abs() * 0.1 };
                    (lo, hi) = (lo - spread, hi + spread);
                }
                let raw = (hi - lo) / 6.0;
                let magnitude = 10f64.powf(raw.log10().floor());
                let step = [1.0, 2.0, 2.5, 5.0, 10.0]
                    .iter()
                    .map(|m| m * magnitude)
                    .find(|s| *s >= raw)
                    .unwrap_or(10.0 * magnitude);
                let (first, last) = ((lo / step).floor(), (hi / step).ceil());
                let points: Vec<f64> = (first as i64..=last as i64).map(|k| k as f64 * step).collect();
                Ticks { lo: first * step, hi: last * step, points, log }
            }
        }
    }

    /// Categories at 0, 1, ... n - 1, each in a unit-wide slot.
    pub fn categories(n: usize) -> Ticks {
        Ticks { lo: -0.5, hi: n as f64 - 0.5, points: (0..n).map(|i| i as f64).collect(), log: None }
    }

    /// A value's plot coordinate.
    pub fn to_plot(&self, value: f64) -> f64 {
        match self.log {
            Some(base) => value.log(f64::from(base)),
            None => value,
        }
    }

    /// The label of a tick at plot coordinate `at`.
    pub fn label(&self, at: f64) -> String {
        match self.log {
            Some(2) => {
                let value = 2f64.powf(at);
                if value >= 1.0 { format!("{}", value.round()) } else { format_number(value) }
            }
            Some(10) if at.fract() == 0.0 && !(-3.0..=5.0).contains(&at) => format!("1e{at}"),
            Some(base) => format_number(f64::from(base).powf(at)),
            None => {
                // One suffix and one number of decimals for every tick of the axis.
                let largest = self.points.iter().fold(0f64, |m, p| m.max(p.abs()));
                let (_, divisor, suffix) = [(1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")]
                    .into_iter()
                    .find(|(threshold, _, _)| largest >= *threshold)
                    .unwrap_or((1.0, 1.0, ""));
                if at == 0.0 {
                    return "0".into();
                }
                if largest < 1e-3 && largest > 0.0 {
                    return format!("{at:.1e}");
                }
                let fits = |decimals: usize| {
                    self.points.iter().all(|p| {
                        let text = format!("{:.decimals$}", p / divisor);
                        text.parse::<f64>()
                            .is_ok_and(|v| (v * divisor - p).abs() <= 1e-9 * largest.max(1e-300))
                    })
                };
                let decimals = (0..6).find(|d| fits(*d)).unwrap_or(6);
                format!("{:.decimals$}{suffix}", at / divisor)
            }
        }
    }
}

/// The axis as plotters' coordinate: linear in plot coordinates, with exactly our ticks.
impl Ranged for Ticks {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let t = (value - self.lo) / (self.hi - self.lo);
        limit.0 + (f64::from(limit.1 - limit.0) * t).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() { Vec::new() } else { self.points.clone() }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

/// How a legend entry is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marker {
    /// A line with a dot: a series.
    Line,
    /// A plain line: a reference line.
    Rule,
    /// A filled square: a bar segment or a shaded band.
    Square,
    /// A dot: a scatter group.
    Dot,
}

/// One legend entry.
#[derive(Debug, Clone)]
pub(crate) struct LegendEntry {
    pub text: String,
    pub colour: RGBColor,
    pub marker: Marker,
}

const LEGEND_FONT: u32 = 14;
const LEGEND_ROW: i32 = 22;

/// Splits `area` into the plot (left) and a legend column (right) wide enough for `entries`,
/// at most 40% of the width, so the legend never covers data.
pub(crate) fn with_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[LegendEntry],
    extra_width: u32,
) -> Result<(Area<DB>, Area<DB>), PlotError> {
    let (width, _) = area.dim_in_pixel();
    let style = (FAMILY, LEGEND_FONT).into_text_style(area);
    let mut widest = extra_width;
    for entry in entries {
        widest = widest.max(area.estimate_text_size(&entry.text, &style).map_err(draw_error)?.0);
    }
    let legend_width = (widest + 48).min(width * 2 / 5);
    Ok(area.split_horizontally(width - legend_width))
}

/// Draws `entries` top-down in the legend column, starting `top` pixels down.
pub(crate) fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[LegendEntry],
    top: i32,
) -> Result<(), PlotError> {
    let style = TextStyle::from((FAMILY, LEGEND_FONT).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, entry) in entries.iter().enumerate() {
        let y = top + LEGEND_ROW * i as i32;
        let colour = entry.colour;
        match entry.marker {
            Marker::Line => {
                area.draw(&PathElement::new(vec![(6, y), (30, y)], colour.stroke_width(2)))
                    .map_err(draw_error)?;
                area.draw(&Circle::new((18, y), 3, colour.filled())).map_err(draw_error)?;
            }
            Marker::Rule => {
                area.draw(&PathElement::new(vec![(6, y), (30, y)], colour.stroke_width(2)))
                    .map_err(draw_error)?;
            }
            Marker::Square => {
                area.draw(&Rectangle::new([(10, y - 7), (24, y + 7)], colour.filled()))
                    .map_err(draw_error)?;
            }
            Marker::Dot => area.draw(&Circle::new((17, y), 5, colour.filled())).map_err(draw_error)?,
        }
        area.draw_text(&entry.text, &style, (38, y)).map_err(draw_error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_ticks_are_round_and_cover_the_values() {
        let ticks = Ticks::new(0.3, 9.7, None, false);
        assert_eq!(ticks.points, vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert!(ticks.lo <= 0.3 && ticks.hi >= 9.7);
        let ticks = Ticks::new(18_000.0, 146_000.0, None, true);
        assert_eq!(ticks.lo, 0.0);
        let labels: Vec<String> = ticks.points.iter().map(|p| ticks.label(*p)).collect();
        assert_eq!(labels, ["0", "25k", "50k", "75k", "100k", "125k", "150k"]);
        let ticks = Ticks::new(0.0, 1.0, None, false);
        let labels: Vec<String> = ticks.points.iter().map(|p| ticks.label(*p)).collect();
        assert_eq!(labels, ["0", "0.2", "0.4", "0.6", "0.8", "1.0"]);
    }

    #[test]
    fn log2_ticks_are_powers_of_two() {
        let ticks = Ticks::new(8.0, 64.0, Some(2), false);
        let labels: Vec<String> = ticks.points.iter().map(|p| ticks.label(*p)).collect();
        assert_eq!(labels, ["8", "16", "32", "64"]);
    }

    #[test]
    fn short_log10_ranges_get_2_and_5() {
        let ticks = Ticks::new(1.5, 30.0, Some(10), false);
        let labels: Vec<String> = ticks.points.iter().map(|p| ticks.label(*p)).collect();
        assert_eq!(labels, ["2", "5", "10", "20"]);
    }

    #[test]
    fn formats_come_from_extensions() {
        assert_eq!(Format::of_path(Path::new("a/b.SVG")).ok(), Some(Format::Svg));
        assert_eq!(Format::of_path(Path::new("b.png")).ok(), Some(Format::Png));
        let error = Format::of_path(Path::new("b.pdf")).err().map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some("b.pdf: .pdf names no image format; write a file name ending in .svg or .png")
        );
    }
}
