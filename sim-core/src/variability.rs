//! Variability of compute: what is drawn, from which distribution, and the random streams it is
//! drawn from.
//!
//! Four sources, all off by default ([`Variability::default`]):
//! - **per-op noise** ([`Variability::op_noise`]): every device compute op's duration is
//!   multiplied by a fresh draw with mean 1 and the given coefficient of variation;
//! - **slow ranks** ([`Variability::slow_ranks`]): a set of ranks, chosen once per run (a
//!   fraction drawn at random, or named), whose device compute takes `factor` times longer;
//! - **per-GPU speed spread** ([`Variability::gpu_speed`]): one factor per rank, drawn once per
//!   run, multiplying its device compute (PRISM, arXiv 2510.15596, measures such a spread
//!   between nominally identical GPUs; the user gives its distribution);
//! - **host interruptions** ([`Variability::host_interrupt`]): each rank's host is interrupted
//!   periodically (a phase drawn per rank, an optional jitter per interruption); an op that is
//!   running on the rank when an interruption fires is lengthened by its duration.
//!
//! Every draw comes from a ChaCha8 stream keyed by the seed, a purpose, the iteration and the
//! rank ([`stream`]), and within a stream ops are drawn in op-id order, so a draw never depends
//! on the thread count or on the order events are processed in.
//!
//! ```
//! use sim_core::variability::{Distribution, Noise};
//! use rand::SeedableRng;
//!
//! let noise = Noise::new(Distribution::LogNormal, 0.05).unwrap();
//! let sampler = noise.sampler();
//! let mut rng = sim_core::variability::stream(7, 0, 0, 0);
//! let draws: Vec<f64> = (0..10_000).map(|_| sampler.sample(&mut rng)).collect();
//! let mean = draws.iter().sum::<f64>() / draws.len() as f64;
//! assert!((mean - 1.0).abs() < 0.005);
//! ```

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::Distribution as _;
use units::SimDuration;

/// A distribution of multiplicative factors with mean 1.
#[derive(Debug, Clone, PartialEq)]
pub enum Distribution {
    /// `exp(N(mu, sigma^2))` with `sigma^2 = ln(1 + cv^2)` and `mu = -sigma^2 / 2`.
    LogNormal,
    /// Gamma with shape `1 / cv^2` and scale `cv^2`.
    Gamma,
    /// `N(1, cv^2)` truncated at zero (draws at or below zero are drawn again; the mean rises by
    /// less than 1e-4 for cv up to 0.25).
    Normal,
    /// Measured ratios, scaled to mean 1, drawn uniformly with replacement.
    Empirical(Arc<[f64]>),
}

impl Distribution {
    /// The distribution's name in scenario files.
    pub fn name(&self) -> &'static str {
        match self {
            Distribution::LogNormal => "lognormal",
            Distribution::Gamma => "gamma",
            Distribution::Normal => "normal",
            Distribution::Empirical(_) => "empirical",
        }
    }

    /// The names scenario files may give, for error messages.
    pub const NAMES: &'static str = "\"lognormal\", \"gamma\", \"normal\" (truncated at zero), \"empirical\"";
}

/// A noise source: a distribution of factors with mean 1 and a coefficient of variation.
#[derive(Debug, Clone, PartialEq)]
pub struct Noise {
    distribution: Distribution,
    cv: f64,
}

/// A noise setting that cannot be drawn from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NoiseError {
    /// The coefficient of variation is negative or not finite.
    #[error("must be >= 0 and finite, got {0}")]
    Cv(f64),
    /// An empirical distribution without samples, or with a sample that is not positive.
    #[error("{0}")]
    Samples(String),
}

impl Noise {
    /// Noise from a parametric distribution with coefficient of variation `cv` (0: no noise).
    pub fn new(distribution: Distribution, cv: f64) -> Result<Noise, NoiseError> {
        if !(cv.is_finite() && cv >= 0.0) {
            return Err(NoiseError::Cv(cv));
        }
        Ok(Noise { distribution, cv })
    }

    /// Noise drawn from measured ratios (e.g. each kernel's time over its median), scaled so
    /// that their mean is 1; the coefficient of variation is theirs.
    pub fn empirical(samples: &[f64]) -> Result<Noise, NoiseError> {
        if samples.is_empty() {
            return Err(NoiseError::Samples("needs at least one measured ratio".into()));
        }
        if let Some(bad) = samples.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(NoiseError::Samples(format!("every ratio must be positive and finite, got {bad}")));
        }
        let n = samples.len() as f64;
        let mean = samples.iter().sum::<f64>() / n;
        let scaled: Arc<[f64]> = samples.iter().map(|s| s / mean).collect();
        let variance = scaled.iter().map(|s| (s - 1.0) * (s - 1.0)).sum::<f64>() / n;
        Ok(Noise { distribution: Distribution::Empirical(scaled), cv: variance.sqrt() })
    }

    /// The distribution.
    pub fn distribution(&self) -> &Distribution {
        &self.distribution
    }

    /// The coefficient of variation (for an empirical distribution, of its scaled samples).
    pub fn cv(&self) -> f64 {
        self.cv
    }

    /// A sampler of this noise's factors.
    pub fn sampler(&self) -> Sampler {
        let cv = self.cv;
        if cv == 0.0 {
            return Sampler::One;
        }
        match &self.distribution {
            Distribution::LogNormal => {
                let sigma2 = (1.0 + cv * cv).ln();
                rand_distr::LogNormal::new(-sigma2 / 2.0, sigma2.sqrt())
                    .map_or(Sampler::One, Sampler::LogNormal)
            }
            Distribution::Gamma => {
                rand_distr::Gamma::new(1.0 / (cv * cv), cv * cv).map_or(Sampler::One, Sampler::Gamma)
            }
            Distribution::Normal => rand_distr::Normal::new(1.0, cv).map_or(Sampler::One, Sampler::Normal),
            Distribution::Empirical(samples) => Sampler::Empirical(samples.clone()),
        }
    }
}

/// Draws factors of one [`Noise`].
#[derive(Debug, Clone)]
pub enum Sampler {
    /// Always 1 (no noise).
    One,
    /// Lognormal.
    LogNormal(rand_distr::LogNormal<f64>),
    /// Gamma.
    Gamma(rand_distr::Gamma<f64>),
    /// Normal, truncated at zero.
    Normal(rand_distr::Normal<f64>),
    /// Uniform over measured ratios.
    Empirical(Arc<[f64]>),
}

impl Sampler {
    /// One factor.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        match self {
            Sampler::One => 1.0,
            Sampler::LogNormal(d) => d.sample(rng),
            Sampler::Gamma(d) => d.sample(rng),
            Sampler::Normal(d) => loop {
                let x = d.sample(rng);
                if x > 0.0 {
                    break x;
                }
            },
            Sampler::Empirical(samples) => samples[rng.random_range(0..samples.len())],
        }
    }

    /// Whether every draw is 1.
    pub fn is_one(&self) -> bool {
        matches!(self, Sampler::One)
    }
}

/// Ranks whose device compute is persistently slower.
#[derive(Debug, Clone, PartialEq)]
pub enum SlowRanks {
    /// `round(fraction x ranks)` ranks drawn once per run, without replacement.
    Fraction {
        /// Share of the ranks, in [0, 1].
        fraction: f64,
        /// Their time factor (>= 1 slower; 2.0 takes twice as long).
        factor: f64,
    },
    /// The named ranks.
    Named {
        /// Rank indices.
        ranks: Vec<u32>,
        /// Their time factor.
        factor: f64,
    },
}

/// Periodic host interruptions (OS noise, daemons): each rank is interrupted at
/// `phase + k x every + jitter_k`, with `phase` drawn uniformly in `[0, every)` once per rank and
/// `jitter_k` uniformly in `[0, jitter)` per interruption.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostInterrupt {
    /// Period between interruptions (> 0).
    pub every: SimDuration,
    /// How long each interruption holds the rank.
    pub duration: SimDuration,
    /// Upper bound of each interruption's random delay (zero: strictly periodic; less than
    /// `every`).
    pub jitter: SimDuration,
}

/// Every source of variability of a run; the default has none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Variability {
    /// Per-op duration noise on device compute, drawn afresh for every op of every iteration.
    pub op_noise: Option<Noise>,
    /// Persistently slow ranks.
    pub slow_ranks: Option<SlowRanks>,
    /// Per-GPU speed spread: one time factor per rank, drawn once per run.
    pub gpu_speed: Option<Noise>,
    /// Periodic host interruptions.
    pub host_interrupt: Option<HostInterrupt>,
}

/// What a random stream is for: part of its key, so that streams never overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Purpose {
    /// Per-op noise of one (iteration, rank).
    OpNoise = 1,
    /// The choice of slow ranks.
    SlowRanks = 2,
    /// One rank's GPU speed.
    GpuSpeed = 3,
    /// One rank's interruption phase.
    InterruptPhase = 4,
    /// One interruption's jitter (the "iteration" slot holds the interruption's index).
    InterruptJitter = 5,
}

/// The ChaCha8 stream keyed by `(seed, purpose, iteration, rank)`: its 256-bit seed is those
/// four words, so distinct keys give independent streams.
pub fn stream(seed: u64, purpose: u64, iteration: u64, rank: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    for (slot, word) in key.chunks_exact_mut(8).zip([seed, purpose, iteration, rank]) {
        slot.copy_from_slice(&word.to_le_bytes());
    }
    ChaCha8Rng::from_seed(key)
}

impl Variability {
    /// Whether any source is on.
    pub fn is_active(&self) -> bool {
        *self != Variability::default()
    }

    /// Each rank's persistent time factor (slow ranks times GPU speed), drawn once per run.
    pub fn rank_factors(&self, seed: u64, ranks: u32) -> Vec<f64> {
        let mut factors = vec![1.0; ranks as usize];
        match &self.slow_ranks {
            Some(SlowRanks::Fraction { fraction, factor }) => {
                let count = ((fraction * f64::from(ranks)).round() as usize).min(ranks as usize);
                let mut rng = stream(seed, Purpose::SlowRanks as u64, 0, 0);
                for rank in rand::seq::index::sample(&mut rng, ranks as usize, count) {
                    factors[rank] *= factor;
                }
            }
            Some(SlowRanks::Named { ranks: named, factor }) => {
                for &rank in named {
                    if let Some(slot) = factors.get_mut(rank as usize) {
                        *slot *= factor;
                    }
                }
            }
            None => {}
        }
        if let Some(speed) = &self.gpu_speed {
            let sampler = speed.sampler();
            for (rank, slot) in factors.iter_mut().enumerate() {
                let mut rng = stream(seed, Purpose::GpuSpeed as u64, 0, rank as u64);
                *slot *= sampler.sample(&mut rng);
            }
        }
        factors
    }

    /// Each rank's interruption phase, in picoseconds (empty without interruptions).
    pub fn interrupt_phases(&self, seed: u64, ranks: u32) -> Vec<u64> {
        let Some(interrupt) = self.host_interrupt else { return Vec::new() };
        (0..ranks)
            .map(|rank| {
                let mut rng = stream(seed, Purpose::InterruptPhase as u64, 0, u64::from(rank));
                rng.random_range(0..interrupt.every.as_ps().max(1))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moments(noise: &Noise, n: usize) -> (f64, f64) {
        let sampler = noise.sampler();
        let mut rng = stream(1, Purpose::OpNoise as u64, 0, 0);
        let draws: Vec<f64> = (0..n).map(|_| sampler.sample(&mut rng)).collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        let variance = draws.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
        (mean, variance.sqrt() / mean)
    }

    #[test]
    fn parametric_noise_has_mean_one_and_the_given_cv() {
        let n = 200_000;
        for distribution in [Distribution::LogNormal, Distribution::Gamma, Distribution::Normal] {
            let cv = 0.1;
            let (mean, measured_cv) = moments(&Noise::new(distribution.clone(), cv).unwrap(), n);
            // Standard error of the mean: cv / sqrt(n) = 2.2e-4; allow 5 of them.
            assert!((mean - 1.0).abs() < 5.0 * cv / (n as f64).sqrt(), "{distribution:?}: mean {mean}");
            assert!((measured_cv - cv).abs() < 0.002, "{distribution:?}: cv {measured_cv}");
        }
    }

    #[test]
    fn empirical_noise_is_scaled_to_mean_one() {
        let noise = Noise::empirical(&[2.0, 4.0, 6.0]).unwrap();
        // Scaled: 0.5, 1, 1.5; population cv sqrt(1/6).
        assert!((noise.cv() - (1.0f64 / 6.0).sqrt()).abs() < 1e-12);
        let (mean, _) = moments(&noise, 90_000);
        assert!((mean - 1.0).abs() < 0.01);
        assert!(Noise::empirical(&[]).is_err());
        assert!(Noise::empirical(&[1.0, 0.0]).is_err());
        assert!(Noise::new(Distribution::Gamma, -0.1).is_err());
    }

    #[test]
    fn zero_cv_draws_exactly_one() {
        let sampler = Noise::new(Distribution::LogNormal, 0.0).unwrap().sampler();
        assert!(sampler.is_one());
    }

    #[test]
    fn slow_fraction_picks_the_rounded_count_and_depends_on_the_seed() {
        let variability = Variability {
            slow_ranks: Some(SlowRanks::Fraction { fraction: 0.01, factor: 1.2 }),
            ..Variability::default()
        };
        let a = variability.rank_factors(1, 4096);
        assert_eq!(a.iter().filter(|f| **f == 1.2).count(), 41);
        assert_eq!(a, variability.rank_factors(1, 4096));
        assert_ne!(a, variability.rank_factors(2, 4096));
    }

    #[test]
    fn streams_differ_by_every_part_of_their_key() {
        let first = |mut rng: ChaCha8Rng| rng.random::<u64>();
        let base = first(stream(1, 1, 1, 1));
        assert_ne!(base, first(stream(2, 1, 1, 1)));
        assert_ne!(base, first(stream(1, 2, 1, 1)));
        assert_ne!(base, first(stream(1, 1, 2, 1)));
        assert_ne!(base, first(stream(1, 1, 1, 2)));
        assert_eq!(base, first(stream(1, 1, 1, 1)));
    }
}
