//! What a column measures and in which unit, from its name: `_s` is seconds, `bytes` and
//! `memory.*` bytes, `_per_second` a rate, `mfu` and `*_utilization` fractions; an axis shows
//! the quantity's name and a unit scaled to its values (`iteration time (ms)`, `memory total
//! (GB)`, `MFU (%)`).

/// A column's unit.
#[derive(Debug, Clone, PartialEq)]
pub enum Unit {
    /// Seconds (shown as s, ms, us or ns).
    Seconds,
    /// Bytes (B, kB, MB, GB, TB: powers of 1000, as parasim's reports print them).
    Bytes,
    /// Bytes per second (B/s to TB/s).
    BytesPerSecond,
    /// A rate of things per second, e.g. `samples/s`.
    PerSecond(String),
    /// A fraction of 1, shown in percent.
    Fraction,
    /// A unit written as is (`TFLOP/s`).
    Named(String),
    /// A count or a plain number.
    None,
}

/// A column's quantity: a readable name and a unit.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantity {
    /// The readable name, e.g. `iteration time`.
    pub name: String,
    /// The unit.
    pub unit: Unit,
}

/// How an axis shows its values: multiply by `factor`, and label it `label`.
#[derive(Debug, Clone, PartialEq)]
pub struct Scale {
    /// Factor from the column's unit to the axis's.
    pub factor: f64,
    /// The axis label, with the unit.
    pub label: String,
}

impl Quantity {
    /// The quantity a column holds, from its name.
    pub fn of_column(column: &str) -> Quantity {
        let mut lower = column.to_ascii_lowercase();
        // A sweep's swept values (`axis.cluster.nodes`) are named by their scenario key.
        if let Some(key) = lower.strip_prefix("axis.") {
            lower = key.to_string();
        }
        // A sweep's breakdown columns read better without the table's name.
        if let Some(kind) = lower.strip_prefix("breakdown.exposed_by_group_s.") {
            lower = format!("exposed_{kind}_communication_s");
        } else if let Some(rest) = lower.strip_prefix("breakdown.") {
            lower = rest.to_string();
        }
        let leaf = lower.rsplit('.').next().unwrap_or(&lower);
        let rate = ["_per_second", "_per_s"].iter().find_map(|marker| {
            lower.find(marker).map(|at| (at, marker.len())).filter(|_| !lower.contains("bytes_per"))
        });
        let (name, unit) = if lower.contains("bytes_per_s") {
            (
                strip_words(
                    &lower,
                    &["_bytes_per_second", "_bytes_per_s", "bytes_per_second", "bytes_per_s"],
                ),
                Unit::BytesPerSecond,
            )
        } else if let Some((at, len)) = rate {
            let (before, after) = (&lower[..at], &lower[at + len..]);
            let thing = before.rsplit(['.', '_']).next().unwrap_or(before).to_string();
            let prefix = &before[..before.len() - thing.len()];
            (format!("{prefix}throughput{after}"), Unit::PerSecond(format!("{thing}/s")))
        } else if lower.contains("tflops") {
            (
                lower.replace("achieved_tflops", "achieved").replace("tflops", "compute rate"),
                Unit::Named("TFLOP/s".into()),
            )
        } else if lower == "mfu"
            || leaf.ends_with("utilization")
            || leaf.ends_with("efficiency")
            || leaf == "accuracy"
        {
            (lower.clone(), Unit::Fraction)
        } else if lower.split('.').any(|part| part.ends_with("_s")) {
            let parts: Vec<&str> = lower.split('.').map(|p| p.strip_suffix("_s").unwrap_or(p)).collect();
            (parts.join("."), Unit::Seconds)
        } else if lower.contains("bytes") || (lower.starts_with("memory.") && leaf != "recompute") {
            (strip_words(&lower, &["_bytes", "bytes_", "bytes"]), Unit::Bytes)
        } else {
            (lower.clone(), Unit::None)
        };
        Quantity { name: readable(&name), unit }
    }

    /// The axis scale for values whose largest magnitude is `max_abs`.
    pub fn scale(&self, max_abs: f64) -> Scale {
        fn pick(max_abs: f64, steps: &[(f64, &'static str)]) -> (f64, &'static str) {
            steps
                .iter()
                .find(|(f, _)| max_abs >= *f)
                .or(steps.last())
                .map_or((1.0, ""), |(f, u)| (1.0 / f, *u))
        }
        let (factor, unit) = match &self.unit {
            Unit::Seconds => pick(max_abs, &[(1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")]),
            Unit::Bytes => pick(max_abs, &[(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B")]),
            Unit::BytesPerSecond => {
                pick(max_abs, &[(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1.0, "B/s")])
            }
            Unit::Fraction => (100.0, "%"),
            Unit::PerSecond(unit) | Unit::Named(unit) => (1.0, unit.as_str()),
            Unit::None => (1.0, ""),
        };
        let label = if unit.is_empty() { self.name.clone() } else { format!("{} ({unit})", self.name) };
        Scale { factor, label }
    }
}

fn strip_words(text: &str, words: &[&str]) -> String {
    let mut out = text.to_string();
    for word in words {
        out = out.replace(word, "");
    }
    out.trim_matches(['_', '.']).to_string()
}

/// `breakdown.exposed_by_group.data` -> `breakdown exposed by group data`, with parasim's
/// words capitalised (GPUs, MFU).
fn readable(name: &str) -> String {
    let words: Vec<String> = name
        .split(['.', '_', '-'])
        .filter(|w| !w.is_empty())
        .map(|word| match word {
            "gpus" => "GPUs".to_string(),
            "gpu" | "device" => "GPU".to_string(),
            "mfu" => "MFU".to_string(),
            "flops" => "FLOPs".to_string(),
            "tp" | "dp" | "pp" | "cp" => word.to_ascii_uppercase(),
            other => other.to_string(),
        })
        .collect();
    words.join(" ")
}

/// A tick label: short, without trailing zeros (`0.25`, `120`, `15k`, `2.5M`, `1e-5`).
pub fn format_number(value: f64) -> String {
    let magnitude = value.abs();
    if value == 0.0 {
        return "0".into();
    }
    let trim = |text: String| {
        if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_string() } else { text }
    };
    if magnitude >= 1e9 {
        trim(format!("{:.2}", value / 1e9)) + "G"
    } else if magnitude >= 1e6 {
        trim(format!("{:.2}", value / 1e6)) + "M"
    } else if magnitude >= 1e5 {
        trim(format!("{:.1}", value / 1e3)) + "k"
    } else if magnitude >= 1e-3 {
        let decimals = (3 - magnitude.log10().floor() as i32).clamp(0, 6) as usize;
        trim(format!("{value:.decimals$}"))
    } else {
        format!("{value:.1e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(column: &str, max: f64) -> String {
        Quantity::of_column(column).scale(max).label
    }

    #[test]
    fn units_come_from_the_column_names() {
        assert_eq!(label("iteration_time_s", 0.028), "iteration time (ms)");
        assert_eq!(label("breakdown.exposed_by_group_s.data", 2e-6), "exposed data communication (us)");
        assert_eq!(label("breakdown.bubble_s", 2.0), "bubble (s)");
        assert_eq!(label("axis.cluster.nodes", 2.0), label("cluster.nodes", 2.0));
        assert_eq!(label("samples_per_second", 1e5), "throughput (samples/s)");
        assert_eq!(label("samples_per_second_per_device", 1e3), "throughput per GPU (samples/s)");
        assert_eq!(label("tokens_per_second", 1e5), "throughput (tokens/s)");
        assert_eq!(label("memory.total", 3.6e9), "memory total (GB)");
        assert_eq!(label("strategy.gradient_bytes", 1e8), "strategy gradient (MB)");
        assert_eq!(label("mfu", 0.2), "MFU (%)");
        assert_eq!(label("achieved_tflops_per_device", 50.0), "achieved per GPU (TFLOP/s)");
        assert_eq!(label("bus_bandwidth_bytes_per_s", 1e11), "bus bandwidth (GB/s)");
        assert_eq!(label("cluster.gpus", 64.0), "cluster GPUs");
        assert_eq!(Quantity::of_column("iteration_time_s").scale(0.028).factor, 1e3);
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(format_number(0.25), "0.25");
        assert_eq!(format_number(120.0), "120");
        assert_eq!(format_number(146_065.0), "146.1k");
        assert_eq!(format_number(2_500_000.0), "2.5M");
        assert_eq!(format_number(1e-5), "1.0e-5");
        assert_eq!(format_number(28.042), "28.04");
    }
}
