//! `[variability]`: what is drawn afresh in each Monte Carlo iteration (docs/variability.md).
//! Read into serde wire structs, then validated into [`sim_core::variability::Variability`]
//! with every error naming its key (`variability.op-noise.cv must be >= 0 ...`).

use serde::Deserialize;
use sim_core::units::SimDuration;
use sim_core::variability::{Distribution, HostInterrupt, Noise, SlowRanks, Variability};

/// The `[variability]` section as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct VariabilitySection {
    op_noise: Option<NoiseSection>,
    slow_ranks: Option<SlowRanksSection>,
    gpu_speed: Option<NoiseSection>,
    host_interrupt: Option<InterruptSection>,
}

/// `op-noise` and `gpu-speed`: a distribution with a coefficient of variation, or measured
/// ratios.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct NoiseSection {
    distribution: String,
    cv: Option<f64>,
    ratios: Option<Vec<f64>>,
}

/// `slow-ranks`: a fraction of the ranks, or named ranks, and their time factor.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct SlowRanksSection {
    fraction: Option<f64>,
    ranks: Option<Vec<u32>>,
    factor: f64,
}

/// `host-interrupt`: period, duration and optional jitter.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct InterruptSection {
    every_ms: f64,
    duration_us: f64,
    #[serde(default)]
    jitter_us: f64,
}

fn noise(section: &NoiseSection, key: &str) -> Result<Noise, (String, String)> {
    let err = |suffix: &str, message: String| (format!("{key}.{suffix}"), message);
    if section.distribution == "empirical" {
        if section.cv.is_some() {
            return Err(err(
                "cv",
                "is implied by the measured ratios of an empirical distribution: leave it out".into(),
            ));
        }
        let Some(ratios) = &section.ratios else {
            return Err(err(
                "ratios",
                "is missing: an empirical distribution needs measured ratios (each op's time over the median \
                 of its kind, e.g. ratios = [0.98, 1.0, 1.03])"
                    .into(),
            ));
        };
        return Noise::empirical(ratios).map_err(|e| err("ratios", e.to_string()));
    }
    let distribution = match section.distribution.as_str() {
        "lognormal" => Distribution::LogNormal,
        "gamma" => Distribution::Gamma,
        "normal" => Distribution::Normal,
        other => {
            return Err(err("distribution", format!("is {other:?}; valid: {}", Distribution::NAMES)));
        }
    };
    if section.ratios.is_some() {
        return Err(err(
            "ratios",
            format!("is only for distribution = \"empirical\", not {:?}", section.distribution),
        ));
    }
    let Some(cv) = section.cv else {
        return Err(err(
            "cv",
            "is missing: give the coefficient of variation (standard deviation over mean), e.g. 0.05".into(),
        ));
    };
    if !(cv.is_finite() && cv >= 0.0) {
        return Err(err("cv", format!("must be >= 0 (0: no noise), got {cv}")));
    }
    if cv > 1.0 {
        return Err(err(
            "cv",
            format!("must be at most 1 (a standard deviation as large as the mean), got {cv}"),
        ));
    }
    Noise::new(distribution, cv).map_err(|e| err("cv", e.to_string()))
}

/// Validates `[variability]` for a job of `ranks` ranks: `Err((key, message))` names the key.
pub(super) fn validate(section: &VariabilitySection, ranks: u32) -> Result<Variability, (String, String)> {
    let op_noise = section.op_noise.as_ref().map(|s| noise(s, "variability.op-noise")).transpose()?;
    let gpu_speed = section.gpu_speed.as_ref().map(|s| noise(s, "variability.gpu-speed")).transpose()?;
    let slow_ranks = match &section.slow_ranks {
        None => None,
        Some(slow) => {
            let key = |suffix: &str| format!("variability.slow-ranks.{suffix}");
            if !(slow.factor.is_finite() && slow.factor > 0.0) {
                return Err((
                    key("factor"),
                    format!("must be a positive time factor (1.2: 20% slower), got {}", slow.factor),
                ));
            }
            match (slow.fraction, &slow.ranks) {
                (Some(fraction), None) => {
                    if !(0.0..=1.0).contains(&fraction) {
                        return Err((key("fraction"), format!("must be in [0, 1], got {fraction}")));
                    }
                    Some(SlowRanks::Fraction { fraction, factor: slow.factor })
                }
                (None, Some(named)) => {
                    if let Some(bad) = named.iter().find(|r| **r >= ranks) {
                        return Err((
                            key("ranks"),
                            format!(
                                "names rank {bad}, but the job has ranks 0 to {}",
                                ranks.saturating_sub(1)
                            ),
                        ));
                    }
                    let mut named = named.clone();
                    named.sort_unstable();
                    named.dedup();
                    Some(SlowRanks::Named { ranks: named, factor: slow.factor })
                }
                _ => {
                    return Err((
                        "variability.slow-ranks".into(),
                        "give either `fraction` (a share of the ranks drawn once per run) or `ranks` (a list), not both or neither"
                            .into(),
                    ));
                }
            }
        }
    };
    let host_interrupt = match &section.host_interrupt {
        None => None,
        Some(interrupt) => {
            let key = |suffix: &str| format!("variability.host-interrupt.{suffix}");
            let positive = |value: f64| value.is_finite() && value > 0.0;
            if !positive(interrupt.every_ms) {
                return Err((
                    key("every-ms"),
                    format!("must be a positive period in milliseconds, got {}", interrupt.every_ms),
                ));
            }
            if !(interrupt.duration_us.is_finite() && interrupt.duration_us >= 0.0) {
                return Err((
                    key("duration-us"),
                    format!("must be >= 0 microseconds, got {}", interrupt.duration_us),
                ));
            }
            let every = SimDuration::from_ps((interrupt.every_ms * 1e9).round() as u64);
            let duration = SimDuration::from_ps((interrupt.duration_us * 1e6).round() as u64);
            if duration >= every {
                return Err((
                    key("duration-us"),
                    format!(
                        "is {} us, as long as the period ({} ms) or longer: the host would never run",
                        interrupt.duration_us, interrupt.every_ms
                    ),
                ));
            }
            if !(interrupt.jitter_us.is_finite() && interrupt.jitter_us >= 0.0) {
                return Err((
                    key("jitter-us"),
                    format!("must be >= 0 microseconds, got {}", interrupt.jitter_us),
                ));
            }
            let jitter = SimDuration::from_ps((interrupt.jitter_us * 1e6).round() as u64);
            if jitter >= every {
                return Err((
                    key("jitter-us"),
                    format!(
                        "is {} us; it must be shorter than the period ({} ms)",
                        interrupt.jitter_us, interrupt.every_ms
                    ),
                ));
            }
            if every.as_ps() == 0 {
                return Err((key("every-ms"), format!("rounds to zero picoseconds: {}", interrupt.every_ms)));
            }
            Some(HostInterrupt { every, duration, jitter })
        }
    };
    Ok(Variability { op_noise, slow_ranks, gpu_speed, host_interrupt })
}

/// One line per source that is on, for reports ("op-noise lognormal cv 0.05").
pub fn describe(variability: &Variability) -> Vec<String> {
    let noise = |noise: &Noise| match noise.distribution() {
        Distribution::Empirical(samples) => {
            format!("empirical ({} ratios, cv {:.3})", samples.len(), noise.cv())
        }
        other => format!("{} cv {}", other.name(), noise.cv()),
    };
    let mut lines = Vec::new();
    if let Some(op) = &variability.op_noise {
        lines.push(format!("op-noise {}", noise(op)));
    }
    match &variability.slow_ranks {
        Some(SlowRanks::Fraction { fraction, factor }) => {
            lines.push(format!("slow-ranks {} of ranks at {factor}x", fraction))
        }
        Some(SlowRanks::Named { ranks, factor }) => lines.push(format!("slow-ranks {ranks:?} at {factor}x")),
        None => {}
    }
    if let Some(speed) = &variability.gpu_speed {
        lines.push(format!("gpu-speed {}", noise(speed)));
    }
    if let Some(interrupt) = &variability.host_interrupt {
        lines.push(format!(
            "host-interrupt every {} for {}{}",
            interrupt.every,
            interrupt.duration,
            if interrupt.jitter.as_ps() > 0 {
                format!(" (jitter up to {})", interrupt.jitter)
            } else {
                String::new()
            }
        ));
    }
    lines
}
