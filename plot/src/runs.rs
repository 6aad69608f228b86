//! Charts of runs rather than sweeps: the iteration-time distribution of Monte Carlo runs
//! (`parasim run --iterations N --json`, one line per run) and goodput against the checkpoint
//! interval (`parasim run --hours H --json`). Both are line charts ([`LineChart`]); the caller
//! reads the runs' JSON and hands over the numbers.

use crate::PlotError;
use crate::line::{LineChart, Series};
use crate::quantity::Quantity;

/// One run's iteration times, in seconds, under the name its line gets.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The legend's name (the scenario, or the file).
    pub name: String,
    /// Where the times came from, for errors (the file).
    pub source: String,
    /// The simulated iteration times in seconds, in iteration order.
    pub times_s: Vec<f64>,
    /// The run's median in seconds as the run reported it (its hdrhistogram's
    /// `distribution.p50_s`), for the legend.
    pub p50_s: f64,
    /// The run's 99th percentile in seconds as the run reported it (`distribution.p99_s`).
    pub p99_s: f64,
}

/// The iteration-time distribution of `runs` as frequency polygons over `bins` equal bins
/// spanning every run's times: per run, the share of its iterations (%) in each bin, at the
/// bin's centre. Each line's name gives the run's own p50 and p99. A run of fewer than two iterations,
/// or a time that is not finite and positive, is an error naming its source.
pub fn distribution(runs: &[Run], bins: usize, title: Option<String>) -> Result<LineChart, PlotError> {
    let bins = bins.max(1);
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for run in runs {
        if run.times_s.len() < 2 {
            return Err(PlotError::NoData {
                file: run.source.clone(),
                skipped: format!(
                    "{} iteration time(s): a distribution needs at least two (run with --iterations N)",
                    run.times_s.len()
                ),
            });
        }
        for (i, &t) in run.times_s.iter().enumerate() {
            if !(t.is_finite() && t > 0.0) {
                return Err(PlotError::NotANumber {
                    file: run.source.clone(),
                    line: i + 1,
                    column: "iteration_times_s".into(),
                    value: t.to_string(),
                });
            }
            lo = lo.min(t);
            hi = hi.max(t);
        }
    }
    if runs.is_empty() {
        return Err(PlotError::NoData { file: "(no runs)".into(), skipped: String::new() });
    }
    // All times equal: one bin around them.
    let width = if hi > lo { (hi - lo) / bins as f64 } else { hi.max(1e-12) * 1e-3 };
    let bins = if hi > lo { bins } else { 1 };
    let scale = Quantity::of_column("iteration_time_s").scale(hi);
    let series = runs
        .iter()
        .map(|run| {
            let mut counts = vec![0usize; bins];
            for &t in &run.times_s {
                let bin = (((t - lo) / width) as usize).min(bins - 1);
                counts[bin] += 1;
            }
            let n = run.times_s.len() as f64;
            let points = counts
                .iter()
                .enumerate()
                .map(|(i, &c)| ((lo + (i as f64 + 0.5) * width) * scale.factor, 100.0 * c as f64 / n))
                .collect();
            let at = |seconds: f64| format_time(seconds * scale.factor, &scale.label);
            Series { name: format!("{}: p50 {}, p99 {}", run.name, at(run.p50_s), at(run.p99_s)), points }
        })
        .collect();
    Ok(LineChart {
        title,
        x_label: scale.label,
        y_label: "share of iterations (%)".into(),
        logx: None,
        logy: None,
        series,
        notes: Vec::new(),
    })
}

/// `value` with the unit of an axis label `name (unit)`.
fn format_time(value: f64, label: &str) -> String {
    let unit = label.rsplit_once('(').and_then(|(_, u)| u.strip_suffix(')')).unwrap_or("s");
    format!("{value:.2} {unit}")
}

/// One point of a goodput curve: a checkpoint interval and the goodput it gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GoodputPoint {
    /// The interval in iterations.
    pub iterations: f64,
    /// The interval in hours.
    pub hours: f64,
    /// Useful training time over wall time, in [0, 1].
    pub goodput: f64,
}

/// Goodput (%) against the checkpoint interval (hours, logarithmic), with the best interval
/// as a point of its own and, when given, Young's interval `young_iterations` (in iterations)
/// named in the best point's legend. An empty curve, or a goodput outside [0, 1], is an error naming
/// `source`.
pub fn goodput(
    source: &str,
    curve: &[GoodputPoint],
    best: GoodputPoint,
    young_iterations: Option<f64>,
    title: Option<String>,
) -> Result<LineChart, PlotError> {
    if curve.is_empty() {
        return Err(PlotError::NoData {
            file: source.into(),
            skipped: "no goodput curve: run with --hours H and a [failures] section".into(),
        });
    }
    for (i, point) in curve.iter().chain([&best]).enumerate() {
        let bad = |column: &str, value: f64| PlotError::NotANumber {
            file: source.into(),
            line: i + 1,
            column: column.into(),
            value: value.to_string(),
        };
        if !(point.goodput.is_finite() && (0.0..=1.0).contains(&point.goodput)) {
            return Err(bad("goodput", point.goodput));
        }
        if !(point.hours.is_finite() && point.hours > 0.0) {
            return Err(bad("hours", point.hours));
        }
    }
    let mut points: Vec<(f64, f64)> = curve.iter().map(|p| (p.hours, 100.0 * p.goodput)).collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let young = young_iterations.map_or(String::new(), |y| format!("; Young {y:.1}"));
    let best_name =
        format!("best: every {} iterations, {:.2}%{young}", best.iterations, 100.0 * best.goodput);
    Ok(LineChart {
        title,
        x_label: "checkpoint interval (h)".into(),
        y_label: "goodput (%)".into(),
        logx: Some(10),
        logy: None,
        series: vec![
            Series { name: "goodput".into(), points },
            Series { name: best_name, points: vec![(best.hours, 100.0 * best.goodput)] },
        ],
        notes: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run whose reported p50 and p99 are its first two times.
    fn run(name: &str, times: &[f64]) -> Run {
        let p = |i: usize| times.get(i).copied().unwrap_or(0.0);
        Run {
            name: name.into(),
            source: format!("{name}.json"),
            times_s: times.to_vec(),
            p50_s: p(0),
            p99_s: p(1),
        }
    }

    /// Every run's shares add up to 100%, the bins span all runs' times, and the legend gives
    /// the quantiles the run reported, in the axis's unit.
    #[test]
    fn a_distribution_bins_every_iteration_once_over_a_shared_range() {
        let a = run("ddp", &[0.031, 0.040, 0.031, 0.032, 0.030]);
        let b = run("daso", &[0.020, 0.021, 0.022, 0.023]);
        let chart = distribution(&[a, b], 10, None).unwrap();
        assert_eq!(chart.x_label, "iteration time (ms)");
        for series in &chart.series {
            assert_eq!(series.points.len(), 10);
            let total: f64 = series.points.iter().map(|p| p.1).sum();
            assert!((total - 100.0).abs() < 1e-9, "{total}");
        }
        // Bin centres from 20 ms + 1 ms to 40 ms - 1 ms.
        assert!((chart.series[0].points[0].0 - 21.0).abs() < 1e-9);
        assert!((chart.series[0].points[9].0 - 39.0).abs() < 1e-9);
        assert_eq!(chart.series[0].name, "ddp: p50 31.00 ms, p99 40.00 ms");
        // The last time falls in the last bin, not past it.
        assert_eq!(chart.series[0].points[9].1, 20.0);
    }

    #[test]
    fn a_distribution_refuses_a_single_iteration_and_a_bad_time_naming_the_file() {
        let error = distribution(&[run("one", &[0.03])], 10, None).unwrap_err().to_string();
        assert!(error.starts_with("one.json") && error.contains("--iterations"), "{error}");
        let error = distribution(&[run("bad", &[0.03, f64::NAN])], 10, None).unwrap_err().to_string();
        assert!(error.contains("bad.json") && error.contains("line 2"), "{error}");
        // Identical times make one bin holding them all.
        let flat = distribution(&[run("flat", &[0.5, 0.5, 0.5])], 10, None).unwrap();
        assert_eq!(flat.series[0].points.len(), 1);
        assert_eq!(flat.series[0].points[0].1, 100.0);
    }

    #[test]
    fn a_goodput_chart_marks_the_best_interval_and_refuses_an_empty_curve() {
        let p =
            |iterations: f64, goodput: f64| GoodputPoint { iterations, hours: iterations / 100.0, goodput };
        let curve = [p(10.0, 0.80), p(1.0, 0.50), p(100.0, 0.70)];
        let chart = goodput("f.json", &curve, p(10.0, 0.80), Some(9.6), None).unwrap();
        assert_eq!(chart.series[0].points.first().unwrap().0, 0.01, "sorted by interval");
        assert_eq!(chart.series[1].points, vec![(0.1, 80.0)]);
        assert_eq!(chart.series[1].name, "best: every 10 iterations, 80.00%; Young 9.6");
        let error = goodput("f.json", &[], p(1.0, 0.5), None, None).unwrap_err().to_string();
        assert!(error.starts_with("f.json") && error.contains("--hours"), "{error}");
        let error = goodput("f.json", &[p(1.0, 1.5)], p(1.0, 0.5), None, None).unwrap_err().to_string();
        assert!(error.contains("goodput"), "{error}");
    }
}
