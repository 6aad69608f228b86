//! `parasim validate --plot`: simulated against measured on log-log axes, one dot per
//! measured point, coloured by family, the y = x line and the +-10% band shaded.

use std::fmt::Write as _;

use crate::report::Report;
use crate::run::Status;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 760.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 280.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
const PALETTE: [&str; 12] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
    "#17becf", "#393b79", "#ad494a",
];

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The plot of `report` as an SVG document.
pub fn svg(report: &Report) -> String {
    // (family index, measured, simulated) of every point of every case that ran.
    let families: Vec<&str> = report.families.iter().map(|f| f.id.as_str()).collect();
    let mut dots = Vec::new();
    for case in report.cases.iter().filter(|c| matches!(c.status, Status::Ok)) {
        let index = families.iter().position(|f| *f == case.family).unwrap_or(0);
        for point in &case.points {
            if point.measured > 0.0 && point.simulated > 0.0 {
                dots.push((index, point.measured, point.simulated));
            }
        }
    }
    let (mut low, mut high) = (f64::INFINITY, f64::NEG_INFINITY);
    for &(_, m, s) in &dots {
        low = low.min(m.min(s));
        high = high.max(m.max(s));
    }
    if !low.is_finite() {
        (low, high) = (1e-6, 1.0);
    }
    let (lo, hi) = ((low.log10() - 0.1).floor(), (high.log10() + 0.1).ceil().max(low.log10().floor() + 1.0));
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |v: f64| LEFT + (v.log10() - lo) / (hi - lo) * plot_w;
    let y = |v: f64| TOP + plot_h - (v.log10() - lo) / (hi - lo) * plot_h;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">parasim validate: simulated against measured ({} points, each in its family's unit)</text>\n",
        WIDTH / 2.0,
        dots.len()
    );
    // The +-10% band and y = x, clipped to the square.
    let (a, b) = (10f64.powf(lo), 10f64.powf(hi));
    let band = [(a, a * 1.1), (b / 1.1, b), (b, b), (b, b / 1.1), (a * 1.1, a), (a, a)];
    let polygon: Vec<String> = band.iter().map(|&(m, s)| format!("{:.1},{:.1}", x(m), y(s))).collect();
    let _ = writeln!(svg, "<polygon points=\"{}\" fill=\"#dddddd\" opacity=\"0.7\"/>", polygon.join(" "));
    let _ = writeln!(
        svg,
        "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#555\" stroke-dasharray=\"4 3\"/>",
        x(a),
        y(a),
        x(b),
        y(b)
    );
    // Decade grid and labels.
    let mut decade = lo as i32;
    while f64::from(decade) <= hi {
        let v = 10f64.powi(decade);
        let _ = writeln!(
            svg,
            "<line x1=\"{0:.1}\" y1=\"{1}\" x2=\"{0:.1}\" y2=\"{2}\" stroke=\"#eee\"/><line x1=\"{3}\" y1=\"{4:.1}\" x2=\"{5}\" y2=\"{4:.1}\" stroke=\"#eee\"/>",
            x(v),
            TOP,
            TOP + plot_h,
            LEFT,
            y(v),
            LEFT + plot_w
        );
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">1e{decade}</text><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">1e{decade}</text>",
            x(v),
            TOP + plot_h + 18.0,
            LEFT - 6.0,
            y(v) + 4.0
        );
        decade += 1;
    }
    let _ = writeln!(
        svg,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{plot_w}\" height=\"{plot_h}\" fill=\"none\" stroke=\"#333\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">measured</text>\n\
         <text x=\"20\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 20 {})\">simulated</text>",
        LEFT + plot_w / 2.0,
        HEIGHT - 25.0,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );
    for &(family, m, s) in &dots {
        let _ = writeln!(
            svg,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{}\" fill-opacity=\"0.75\"/>",
            x(m),
            y(s),
            PALETTE[family % PALETTE.len()]
        );
    }
    // Legend: each family with its mean accuracy.
    for (index, family) in report.families.iter().enumerate() {
        let top = TOP + 10.0 + 22.0 * index as f64;
        let mean = family.stats.mean.map_or("pending".to_string(), |m| format!("{:.1}%", 100.0 * m));
        let _ = writeln!(
            svg,
            "<circle cx=\"{}\" cy=\"{top}\" r=\"5\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{} ({mean})</text>",
            WIDTH - RIGHT + 20.0,
            PALETTE[index % PALETTE.len()],
            WIDTH - RIGHT + 32.0,
            top + 4.0,
            escape(&family.id)
        );
    }
    let top = TOP + 20.0 + 22.0 * report.families.len() as f64;
    let _ = writeln!(
        svg,
        "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"#dddddd\"/><text x=\"{}\" y=\"{}\">within 10%</text>",
        WIDTH - RIGHT + 15.0,
        top - 5.0,
        WIDTH - RIGHT + 32.0,
        top + 4.0
    );
    svg += "</svg>\n";
    svg
}
