//! Calibration: the compute model's efficiency parameters fitted to measured kernels.
//!
//! Each [`Sample`] is one profiled operator: the work the model sees (class, dtype, FLOPs,
//! bytes, number of kernels) and the GPU time it measured. [`fit`] finds the parameters of
//! [`ComputeModel`] that minimize the squared log-ratio of predicted to measured time over all
//! samples (relative error: a 3 us element-wise kernel counts as much as a 3 ms GEMM), by
//! Levenberg-Marquardt in an unconstrained parametrization (logit of the efficiencies, log of
//! the times). A weak pull towards the starting model keeps parameters that no sample decides
//! (the element-wise compute rate of a memory-bound GPU) where they were; [`Fit::support`]
//! says how many samples decide each parameter.
//!
//! The prediction is exactly what a simulation charges an operator: the slower of its compute
//! and memory sides, plus `launch-overhead` per kernel. Measured time is kernel time on the GPU,
//! so the fitted `launch-overhead` is the fixed cost of a kernel on the device (ramp, tail,
//! scheduling), not the host's launch rate.

use std::collections::BTreeMap;

use sim_core::units::SimDuration;

use crate::compute::knobs::{FITTED, FITTED_COUNT, KnobKind, KnobValue, fit_position};
use crate::compute::{ComputeError, ComputeModel, Curves, KernelWork};
use crate::device::Device;
use crate::kernel_shape::KernelShape;
use crate::layer::OpClass;
use crate::profile::ClassError;

/// One measured operator.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// What it computes and moves.
    pub work: KernelWork,
    /// The work of kernels it ran after `work`, each priced on its own (a product's bias or
    /// split-K epilogue, [`crate::aten::operator_kernels`]); empty for one-kernel operators.
    pub after: Vec<KernelWork>,
    /// Kernels it launched (each pays the launch overhead).
    pub kernels: u32,
    /// Measured GPU time of its kernels, seconds (must be positive).
    pub measured_s: f64,
    /// The share of `measured_s`, in [0, 1], during which a communication kernel or copy of
    /// another stream ran on the same GPU (`Activity::communication_ns` of the trace import):
    /// the kernels progressed at `1 / communication-slowdown` of their own rate meanwhile. 0
    /// for kernel benchmarks.
    pub communication: f64,
    /// Samples of the same operator and shapes share a group: cross-validation holds out whole
    /// groups, so it measures how well the fit predicts shapes it has not seen.
    pub group: u64,
}

/// Calibration could not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalibrationError {
    /// There is nothing to fit.
    #[error("calibration: no measured operators to fit ({0})")]
    NoSamples(String),
    /// A sample has a non-positive or non-finite time or work.
    #[error("calibration: sample {index} is invalid: {reason}")]
    InvalidSample {
        /// Its position.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A parameter to hold is not one of [`PARAMETERS`].
    #[error("calibration: no parameter `{name}` to hold; the parameters are {known}")]
    UnknownParameter {
        /// The name given.
        name: String,
        /// The valid names.
        known: String,
    },
    /// The model cannot price a sample (e.g. the device lacks its dtype).
    #[error(transparent)]
    Compute(#[from] ComputeError),
}

/// The fitted parameters, in the order of [`PARAMETERS`].
const COUNT: usize = FITTED_COUNT;

/// The parameters calibration fits, by their scenario keys, in the order of the fit's
/// coordinates: the knobs with a fit position ([`crate::compute::knobs::Knob::fit`]).
pub const PARAMETERS: [&str; COUNT] = {
    let mut keys = [""; COUNT];
    let mut j = 0;
    while j < COUNT {
        keys[j] = FITTED[j].key;
        j += 1;
    }
    keys
};

// Positions of the parameters the fit names (in the curves and the starting points).
const GEMM_EFFICIENCY: usize = fit_position("gemm-efficiency");
const UNALIGNED_GEMM: usize = fit_position("unaligned-gemm-efficiency");
const RAMP_EXPONENT: usize = fit_position("gemm-ramp-exponent");
const GEMM_HALF_TIME: usize = fit_position("gemm-half-time");
const MEMORY_EFFICIENCY: usize = fit_position("memory-efficiency");
const REDUCTION_MEMORY: usize = fit_position("reduction-memory-efficiency");
const MEMORY_HALF_TIME: usize = fit_position("memory-half-time");
const VECTOR_EFFICIENCY: usize = fit_position("vector-efficiency");
const LAUNCH: usize = fit_position("launch-overhead");
const TILE_HALF_INTENSITY: usize = fit_position("gemm-tile-half-intensity");
const WAVE_OVERHEAD: usize = fit_position("gemm-wave-overhead");
const CONV: usize = fit_position("conv-efficiency");
const CONV_BACKWARD_WEIGHT: usize = fit_position("conv-backward-weight-efficiency");
const CONV_BACKWARD_DATA: usize = fit_position("conv-backward-data-efficiency");
const VECTOR_GEMM: usize = fit_position("vector-gemm-efficiency");
const REDUCTION_HALF_TIME: usize = fit_position("reduction-half-time");
const K_MAJOR_THIN: usize = fit_position("k-major-thin-gemm-efficiency");
const UNALIGNED_MEMORY: usize = fit_position("unaligned-memory-efficiency");

/// Positions of `communication-memory-slowdown`, `communication-compute-slowdown` and
/// `communication-launch-slowdown`, each fitted as its inverse (the rate a kernel keeps beside
/// communication), an efficiency.
const SLOWDOWNS: [usize; 3] = [
    fit_position("communication-memory-slowdown"),
    fit_position("communication-compute-slowdown"),
    fit_position("communication-launch-slowdown"),
];

/// Position of `reduction-overhead`.
const COMBINE: usize = fit_position("reduction-overhead");

/// Position of `l2-hit-fraction`, fitted as a logit like the efficiencies but free to approach
/// 0 (off): a device whose kernels show no L2 hits fits it near 0, not at [`MIN_EFFICIENCY`].
const L2_HITS: usize = fit_position("l2-hit-fraction");

/// The smallest fitted `l2-hit-fraction` (reported as 0.0001 and below).
const MIN_L2_HITS: f64 = 1e-4;

/// Whether coordinate `j` is a logit (an efficiency, the inverse of a slowdown, or a
/// fraction); the others are logarithms (of a time in microseconds, or of a number).
fn is_logit(j: usize) -> bool {
    matches!(FITTED[j].kind, KnobKind::Efficiency | KnobKind::Slowdown | KnobKind::Fraction)
}

/// Lowest fitted efficiency. Below 5% of a peak a kernel is not limited by the rate the
/// roofline describes but by its parallelism (a reduction over six rows, a tiny product):
/// fitting such kernels with a tiny efficiency would price every large kernel of the class as
/// if it were one of them. An efficiency at this bound is reported as a warning instead.
pub const MIN_EFFICIENCY: f64 = 0.05;

/// The lowest value of unconstrained coordinate `j`, by its knob's kind: the logit of
/// [`MIN_L2_HITS`] for a fraction, of [`MIN_EFFICIENCY`] for an efficiency or a slowdown's
/// inverse; for a time, e^-20 us (no e-fold jump past 20 from 1 us), and e^-20 for a number.
/// Every coordinate's highest value is 20.
fn lower_bound(j: usize) -> f64 {
    match FITTED[j].kind {
        KnobKind::Fraction => logit(MIN_L2_HITS),
        KnobKind::Efficiency | KnobKind::Slowdown => logit(MIN_EFFICIENCY),
        KnobKind::NonNegative | KnobKind::Duration | KnobKind::Switch => -20.0,
    }
}

/// Weight of the pull towards the starting model, per unit of the unconstrained parameter; a
/// sample's residual is a log-ratio, so this is worth one sample off by 1% per e-fold change.
const PRIOR_WEIGHT: f64 = 0.01;

/// A sample "depends on" a parameter if its predicted time's elasticity to the parameter
/// (relative change of the time per relative change of the parameter) exceeds this.
const SUPPORT_THRESHOLD: f64 = 0.05;

/// Efficiencies stay inside (0, 1] with a margin the logit can reach.
const EFFICIENCY_MAX: f64 = 0.999;

fn logit(p: f64) -> f64 {
    let p = p.clamp(1e-6, EFFICIENCY_MAX);
    (p / (1.0 - p)).ln()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Times are fitted as ln(microseconds), floored at 1 ps.
fn log_us(seconds: f64) -> f64 {
    (seconds.max(1e-12) * 1e6).ln()
}

/// The model as a point in unconstrained coordinates, plus the exact values of held
/// parameters (a logit cannot reach an efficiency of 1, and a held value must stay as given).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Point {
    x: [f64; COUNT],
    fixed: [Option<f64>; COUNT],
    /// The starting model's convolution-algorithm setting, not fitted.
    winograd: bool,
}

/// Parameter `j` of `model` in the units the fit works in: a fraction (the rate a kernel keeps,
/// for a slowdown), seconds, or a number.
fn natural(model: &ComputeModel, j: usize) -> f64 {
    let knob = FITTED[j];
    match knob.get(model) {
        KnobValue::Number(rate) if knob.kind == KnobKind::Slowdown => 1.0 / rate,
        KnobValue::Number(number) => number,
        KnobValue::Duration(duration) => duration.as_secs_f64(),
        KnobValue::Switch(_) => unreachable!("calibration fits no switch ({})", knob.key),
    }
}

impl Point {
    /// `model` as a point whose `held` parameters keep `model`'s exact values.
    fn holding(model: &ComputeModel, held: &Held) -> Point {
        let mut point = Point::of(model);
        for (j, fixed) in point.fixed.iter_mut().enumerate() {
            if held[j] {
                *fixed = Some(natural(model, j));
            }
        }
        point
    }

    fn of(model: &ComputeModel) -> Point {
        let x = std::array::from_fn(|j| {
            let value = natural(model, j);
            match FITTED[j].kind {
                KnobKind::Efficiency | KnobKind::Slowdown => logit(value),
                KnobKind::Fraction => logit(value.max(MIN_L2_HITS)),
                KnobKind::NonNegative => value.max(1e-6).ln(),
                KnobKind::Duration | KnobKind::Switch => log_us(value),
            }
        });
        Point { x, fixed: [None; COUNT], winograd: model.winograd_convolutions }
    }

    /// Parameter `j` in its own units (a fraction, or seconds).
    fn value(&self, j: usize) -> f64 {
        match self.fixed[j] {
            Some(value) => value,
            None if is_logit(j) => sigmoid(self.x[j]),
            None if FITTED[j].kind == KnobKind::NonNegative => self.x[j].exp(),
            None => self.x[j].exp() * 1e-6,
        }
    }

    /// The kernel curves, the launch overhead (seconds) and the rates kernels keep beside
    /// communication (the inverse slowdowns).
    fn curves(&self) -> (Curves, f64, Rates) {
        let curves = Curves {
            gemm_efficiency: self.value(GEMM_EFFICIENCY),
            unaligned_gemm_efficiency: self.value(UNALIGNED_GEMM),
            k_major_thin_gemm_efficiency: self.value(K_MAJOR_THIN),
            unaligned_memory_efficiency: self.value(UNALIGNED_MEMORY),
            gemm_ramp_exponent: self.value(RAMP_EXPONENT),
            gemm_half_s: self.value(GEMM_HALF_TIME),
            memory_efficiency: self.value(MEMORY_EFFICIENCY),
            reduction_memory_efficiency: self.value(REDUCTION_MEMORY),
            memory_half_s: self.value(MEMORY_HALF_TIME),
            l2_hit_fraction: self.value(L2_HITS),
            vector_efficiency: self.value(VECTOR_EFFICIENCY),
            tile_half_intensity: self.value(TILE_HALF_INTENSITY),
            wave_overhead_s: self.value(WAVE_OVERHEAD),
            conv_efficiency: self.value(CONV),
            conv_backward_weight_efficiency: self.value(CONV_BACKWARD_WEIGHT),
            vector_gemm_efficiency: self.value(VECTOR_GEMM),
            reduction_half_s: self.value(REDUCTION_HALF_TIME),
            reduction_overhead_s: self.value(COMBINE),
            conv_backward_data_efficiency: self.value(CONV_BACKWARD_DATA),
            // Calibration's samples (profiled operators, DeepBench rows) have no fused attention
            // shape: the knob is not fitted and reads nothing here.
            flash_attention_efficiency: 1.0,
            winograd: self.winograd,
            launch_s: self.value(LAUNCH),
        };
        (
            curves,
            self.value(LAUNCH),
            Rates {
                memory: self.value(SLOWDOWNS[0]),
                compute: self.value(SLOWDOWNS[1]),
                launch: self.value(SLOWDOWNS[2]),
            },
        )
    }

    /// The point as a model, rounded to what measurements support: efficiencies to four
    /// decimals, times to the nanosecond, other numbers to three decimals (profiles stay
    /// readable; predictions move by far less than the fit's error). The knobs calibration
    /// does not fit keep their defaults.
    fn model(&self) -> ComputeModel {
        let mut model = ComputeModel { winograd_convolutions: self.winograd, ..ComputeModel::default() };
        for (j, knob) in FITTED.iter().enumerate() {
            let value = self.value(j);
            let rounded = match knob.kind {
                KnobKind::Efficiency => KnobValue::Number(((value * 1e4).round() / 1e4).clamp(1e-4, 1.0)),
                KnobKind::Slowdown => KnobValue::Number(((1e4 / value).round() / 1e4).max(1.0)),
                KnobKind::Fraction => KnobValue::Number((value * 1e4).round() / 1e4),
                KnobKind::NonNegative => KnobValue::Number((value * 1e3).round() / 1e3),
                KnobKind::Duration | KnobKind::Switch => {
                    KnobValue::Duration(SimDuration::from_ns((value * 1e9).round().max(0.0) as u64))
                }
            };
            knob.set(&mut model, rounded);
        }
        model
    }
}

/// The rates kernels keep beside communication: the inverses of `communication-memory-slowdown`
/// (the work of memory-bound kernels), `communication-compute-slowdown` (of compute-bound ones)
/// and `communication-launch-slowdown` (every kernel's fixed cost).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rates {
    memory: f64,
    compute: f64,
    launch: f64,
}

/// Predicted seconds of `sample` under `curves`, a per-kernel `launch` cost and the `rates` its
/// kernels keep beside communication: each kernel's work at the rate of the resource that
/// bounds it, its launch at the launch rate (kernels beyond the modelled ones, memsets, are
/// launches alone, counted with the first).
fn predict_with(
    curves: &Curves,
    launch: f64,
    rates: Rates,
    device: &Device,
    sample: &Sample,
) -> Result<f64, ComputeError> {
    let modelled = 1 + sample.after.len() as u32;
    let extra = f64::from(sample.kernels.saturating_sub(modelled)) * launch;
    let mut total = 0.0;
    for (i, work) in std::iter::once(&sample.work).chain(&sample.after).enumerate() {
        let seconds = curves.kernel_seconds(device, work)?;
        let fixed = if i < sample.kernels as usize { launch } else { 0.0 } + if i == 0 { extra } else { 0.0 };
        if sample.communication == 0.0 {
            total += seconds + fixed;
            continue;
        }
        let rate = if curves.bound_by_memory(device, work)? { rates.memory } else { rates.compute };
        total += beside_communication(seconds, sample.communication, rate)
            + beside_communication(fixed, sample.communication, rates.launch);
    }
    Ok(total)
}

/// The measured-time equivalent of `alone` seconds of work that spent the share `shared` of its
/// measured time beside communication, progressing at `rate` of its own speed meanwhile:
/// `alone = d (1 - shared) + d shared rate`, solved for `d`. This is what the executor's
/// slowdown gives a kernel whose overlap with communication is that share.
fn beside_communication(alone: f64, shared: f64, rate: f64) -> f64 {
    alone / (1.0 - shared * (1.0 - rate))
}

/// Predicted seconds of `sample` under `model`: what a simulation charges it.
pub fn predict(model: &ComputeModel, device: &Device, sample: &Sample) -> Result<f64, ComputeError> {
    let rates = Rates {
        memory: 1.0 / model.communication_memory_slowdown,
        compute: 1.0 / model.communication_compute_slowdown,
        launch: 1.0 / model.communication_launch_slowdown,
    };
    predict_with(&model.curves(), model.launch_overhead.as_secs_f64(), rates, device, sample)
}

/// The samples of a fit, grouped by distinct pricing. Samples that the model prices alike
/// (the same work, kernels and share beside communication: the same operator and shapes in
/// every iteration of a long trace) share one prediction `p`, so their squared log-ratios sum
/// to `n (ln p - m)^2 + s`, where `n` counts them, `m` is the mean of their measured
/// log-times and `s` the spread of those around `m`, which no parameter moves. The fit
/// therefore takes one residual per distinct pricing, `sqrt(n) (ln p - m)`, and adds the
/// spreads as a constant: the same loss, gradient and normal equations as sample by sample
/// (up to rounding), at a cost per evaluation that grows with the distinct pricings, not the
/// samples: a trace of a thousand iterations fits as fast as one of one.
struct Priced<'a> {
    samples: &'a [Sample],
    /// The first sample of each distinct pricing, in sample order.
    distinct: Vec<usize>,
    /// Per distinct pricing: how many samples share it.
    count: Vec<f64>,
    /// Per distinct pricing: the mean natural log of its samples' measured seconds.
    mean_log: Vec<f64>,
    /// The sum over samples of the squared distance of each measured log-time from its
    /// pricing's mean: the part of the loss no parameter moves.
    spread: f64,
}

impl<'a> Priced<'a> {
    fn new(samples: &'a [Sample]) -> Self {
        use std::fmt::Write;
        // The key is what `predict_with` reads, as text: `Debug` writes every field, and every
        // float in a form that reads back to the same value, so equal keys price equally.
        let mut keys: sim_core::lookup::LookupMap<String, u32> = sim_core::lookup::LookupMap::new();
        let mut distinct = Vec::new();
        let mut pricing = Vec::with_capacity(samples.len());
        let mut key = String::new();
        for (i, sample) in samples.iter().enumerate() {
            key.clear();
            let _ = write!(
                key,
                "{:?}|{:?}|{}|{:?}",
                sample.work, sample.after, sample.kernels, sample.communication
            );
            let id = match keys.get(key.as_str()) {
                Some(&id) => id,
                None => {
                    let id = distinct.len() as u32;
                    keys.insert(key.clone(), id);
                    distinct.push(i);
                    id
                }
            };
            pricing.push(id);
        }
        let mut count = vec![0.0; distinct.len()];
        let mut mean_log = vec![0.0; distinct.len()];
        for (sample, &id) in samples.iter().zip(&pricing) {
            count[id as usize] += 1.0;
            mean_log[id as usize] += sample.measured_s.ln();
        }
        for (mean, n) in mean_log.iter_mut().zip(&count) {
            *mean /= n;
        }
        let spread = samples
            .iter()
            .zip(&pricing)
            .map(|(sample, &id)| (sample.measured_s.ln() - mean_log[id as usize]).powi(2))
            .sum();
        Priced { samples, distinct, count, mean_log, spread }
    }

    /// The residuals that stand for the samples: one per distinct pricing.
    fn len(&self) -> usize {
        self.distinct.len()
    }
}

/// The prior's pull on each coordinate of `point`.
fn pulls<'p>(point: &'p Point, prior: &'p Point) -> impl Iterator<Item = f64> + 'p {
    // No pull on a reduction's combine: its default, 0, is the logarithm's floor, and a pull
    // towards it from every e-fold of a few microseconds outweighs what the reductions say.
    // Without reductions it is held instead ([`held_set`]).
    point
        .x
        .iter()
        .zip(&prior.x)
        .enumerate()
        .map(|(j, (x, x0))| if j == COMBINE { 0.0 } else { PRIOR_WEIGHT * (x - x0) })
}

/// Residuals: one weighted log-ratio per distinct pricing (`sqrt(n) (ln p - m)`, see
/// [`Priced`]), then the prior's pulls.
fn residuals(
    point: &Point,
    prior: &Point,
    device: &Device,
    priced: &Priced,
) -> Result<Vec<f64>, ComputeError> {
    let (curves, launch, rates) = point.curves();
    let mut out = Vec::with_capacity(priced.len() + COUNT);
    for (k, &i) in priced.distinct.iter().enumerate() {
        let predicted = predict_with(&curves, launch, rates, device, &priced.samples[i])?;
        out.push(priced.count[k].sqrt() * (predicted.ln() - priced.mean_log[k]));
    }
    out.extend(pulls(point, prior));
    Ok(out)
}

fn sum_of_squares(residuals: &[f64]) -> f64 {
    residuals.iter().map(|r| r * r).sum()
}

/// The loss: the residuals' squares and the samples' spread that no parameter moves (so that
/// the loss, and the relative gain that stops the fit, are those of the samples one by one).
fn loss(residuals: &[f64], priced: &Priced) -> f64 {
    sum_of_squares(residuals) + priced.spread
}

/// Forward-difference Jacobian, column per parameter. A held coordinate (a fixed value) moves
/// no prediction: its column is zero but for its pull, which is all that is computed.
fn jacobian(
    point: &Point,
    base: &[f64],
    prior: &Point,
    device: &Device,
    priced: &Priced,
) -> Result<Vec<Vec<f64>>, ComputeError> {
    const STEP: f64 = 1e-6;
    let samples = priced.len();
    let mut columns = Vec::with_capacity(COUNT);
    for j in 0..COUNT {
        let mut moved = *point;
        moved.x[j] += STEP;
        let column = if point.fixed[j].is_some() {
            let mut column = vec![0.0; samples];
            column.extend(pulls(&moved, prior).zip(&base[samples..]).map(|(a, b)| (a - b) / STEP));
            column
        } else {
            let r = residuals(&moved, prior, device, priced)?;
            r.iter().zip(base).map(|(a, b)| (a - b) / STEP).collect()
        };
        columns.push(column);
    }
    Ok(columns)
}

/// Solves the symmetric positive definite system `a x = b` by Gaussian elimination with
/// partial pivoting; `None` if singular.
fn solve(mut a: [[f64; COUNT]; COUNT], mut b: [f64; COUNT]) -> Option<[f64; COUNT]> {
    for col in 0..COUNT {
        let pivot = (col..COUNT).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let pivot_row = a[col];
        for row in col + 1..COUNT {
            let factor = a[row][col] / pivot_row[col];
            for (value, above) in a[row][col..].iter_mut().zip(&pivot_row[col..]) {
                *value -= factor * above;
            }
            b[row] -= factor * b[col];
        }
    }
    let mut x = [0.0; COUNT];
    for row in (0..COUNT).rev() {
        let tail: f64 = (row + 1..COUNT).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - tail) / a[row][row];
    }
    Some(x)
}

/// Which parameters a fit leaves where its start put them.
type Held = [bool; COUNT];

/// The [`Held`] set of parameter `names`, plus the communication slowdowns when no sample ran
/// beside communication and `reduction-overhead` when no sample is a reduction or
/// normalisation (nothing decides them, and they stay exactly at their start); an error for a
/// name not in [`PARAMETERS`].
fn held_set(names: &[&str], samples: &[Sample]) -> Result<Held, CalibrationError> {
    let mut held = [false; COUNT];
    for name in names {
        let Some(j) = PARAMETERS.iter().position(|p| p == name) else {
            return Err(CalibrationError::UnknownParameter {
                name: name.to_string(),
                known: PARAMETERS.join(", "),
            });
        };
        held[j] = true;
    }
    if samples.iter().all(|s| s.communication == 0.0) {
        for j in SLOWDOWNS {
            held[j] = true;
        }
    }
    let combines = |work: &KernelWork| matches!(work.class, OpClass::Reduction | OpClass::Normalization);
    if !samples.iter().any(|s| std::iter::once(&s.work).chain(&s.after).any(combines)) {
        held[COMBINE] = true;
    }
    // Only streaming kernels read through the L2 rule: without one, nothing decides it.
    let streams = |work: &KernelWork| work.class != OpClass::Gemm;
    if !samples.iter().any(|s| std::iter::once(&s.work).chain(&s.after).any(streams)) {
        held[L2_HITS] = true;
    }
    // Only thin products with a known layout read the layout factor (traces record none).
    let k_major =
        |work: &KernelWork| matches!(&work.shape, KernelShape::Gemm(shape) if shape.thin_and_k_major());
    if !samples.iter().any(|s| std::iter::once(&s.work).chain(&s.after).any(k_major)) {
        held[K_MAJOR_THIN] = true;
    }
    Ok(held)
}

/// Levenberg-Marquardt from `start`, leaving `held` coordinates alone; returns the best point
/// and its sum of squares.
fn levenberg_marquardt(
    start: Point,
    prior: &Point,
    held: &Held,
    device: &Device,
    priced: &Priced,
) -> Result<(Point, f64, u32), ComputeError> {
    let mut point = start;
    let mut r = residuals(&point, prior, device, priced)?;
    let mut cost = loss(&r, priced);
    let mut damping = 1e-3;
    let mut iterations = 0;
    for _ in 0..300 {
        iterations += 1;
        let columns = jacobian(&point, &r, prior, device, priced)?;
        let mut normal = [[0.0; COUNT]; COUNT];
        let mut gradient = [0.0; COUNT];
        for i in 0..COUNT {
            gradient[i] = -columns[i].iter().zip(&r).map(|(j, r)| j * r).sum::<f64>();
            // Symmetric: each product is the same either way round, summed in the same order.
            for k in i..COUNT {
                normal[i][k] = columns[i].iter().zip(&columns[k]).map(|(a, b)| a * b).sum();
                normal[k][i] = normal[i][k];
            }
        }
        let mut improved = false;
        while damping < 1e12 {
            let mut damped = normal;
            for (i, row) in damped.iter_mut().enumerate() {
                row[i] += damping * (normal[i][i] + 1e-9);
            }
            let Some(step) = solve(damped, gradient) else {
                damping *= 10.0;
                continue;
            };
            let mut trial = point;
            for (j, (x, dx)) in trial.x.iter_mut().zip(step).enumerate() {
                if !held[j] {
                    *x = (*x + dx).clamp(lower_bound(j), 20.0);
                }
            }
            let trial_r = residuals(&trial, prior, device, priced)?;
            let trial_cost = loss(&trial_r, priced);
            if trial_cost < cost {
                let gain = (cost - trial_cost) / cost.max(1e-300);
                point = trial;
                r = trial_r;
                cost = trial_cost;
                damping = (damping / 3.0).max(1e-12);
                improved = gain > 1e-12;
                break;
            }
            damping *= 4.0;
        }
        if !improved {
            break;
        }
    }
    Ok((point, cost, iterations))
}

/// The fitted model and how well it is determined.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    /// The calibrated model.
    pub model: ComputeModel,
    /// For each of [`PARAMETERS`], how many samples' predictions depend on it materially: a
    /// parameter decided by few samples stayed near the starting model.
    pub support: [usize; COUNT],
    /// Root mean square of the log-ratio predicted/measured over the samples.
    pub rms_log_error: f64,
    /// Levenberg-Marquardt iterations of the winning start.
    pub iterations: u32,
}

fn check(samples: &[Sample]) -> Result<(), CalibrationError> {
    if samples.is_empty() {
        return Err(CalibrationError::NoSamples("the input has no costed operator with kernel time".into()));
    }
    for (index, sample) in samples.iter().enumerate() {
        let valid = |x: f64| x.is_finite() && x >= 0.0;
        if !(sample.measured_s.is_finite() && sample.measured_s > 0.0) {
            return Err(CalibrationError::InvalidSample {
                index,
                reason: format!("measured time {} s; it must be positive", sample.measured_s),
            });
        }
        if !(0.0..=1.0).contains(&sample.communication) {
            return Err(CalibrationError::InvalidSample {
                index,
                reason: format!(
                    "share of its time beside communication {}; it must be in [0, 1]",
                    sample.communication
                ),
            });
        }
        for work in std::iter::once(&sample.work).chain(&sample.after) {
            if !valid(work.flops) || !valid(work.bytes) {
                return Err(CalibrationError::InvalidSample {
                    index,
                    reason: format!(
                        "work {} FLOPs, {} bytes; both must be finite, not negative",
                        work.flops, work.bytes
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Fits the compute model to `samples` measured on `device`, starting from (and weakly pulled
/// towards) `start`; the parameters named in `hold` keep `start`'s values. Deterministic: the
/// same samples give the same model.
pub fn fit(
    device: &Device,
    samples: &[Sample],
    start: &ComputeModel,
    hold: &[&str],
) -> Result<Fit, CalibrationError> {
    check(samples)?;
    start.validate()?;
    let mut held = held_set(hold, samples)?;
    // A device without an L2 size in its catalog entry has no L2 rule to fit.
    held[L2_HITS] |= device.execution.is_none();
    let prior = Point::holding(start, &held);
    // Several starts: the max() of the roofline makes the loss piecewise smooth, with a local
    // minimum wherever a class sits exactly on its ridge.
    let starts = [(0.0, 0.0), (-2.3, 0.0), (2.3, 0.0), (0.0, -0.7), (-2.3, -0.7)].map(|(half, launch)| {
        let mut begin = prior;
        // From mid-range: the default factor 1 sits where the logit is flat, and LM would
        // not leave it.
        begin.x[UNALIGNED_GEMM] = begin.x[UNALIGNED_GEMM].min(0.0);
        begin.x[CONV] = begin.x[CONV].min(0.0);
        begin.x[CONV_BACKWARD_WEIGHT] = begin.x[CONV_BACKWARD_WEIGHT].min(0.0);
        begin.x[CONV_BACKWARD_DATA] = begin.x[CONV_BACKWARD_DATA].min(0.0);
        for j in SLOWDOWNS {
            begin.x[j] = begin.x[j].min(0.0);
        }
        begin.x[RAMP_EXPONENT] = begin.x[RAMP_EXPONENT].min(logit(0.8));
        // A reduction's combine starts from a kernel's fixed cost at least (the launch
        // overhead's start, and 1 us): at its default, 0, the logarithm has no slope to leave by.
        begin.x[COMBINE] = begin.x[COMBINE].max(begin.x[LAUNCH]).max(0.0);
        // The L2's share starts at 10%: at its default, 0, the logit has no slope to leave by.
        begin.x[L2_HITS] = begin.x[L2_HITS].max(logit(0.1));
        begin.x[GEMM_HALF_TIME] += half;
        begin.x[MEMORY_HALF_TIME] += half;
        begin.x[LAUNCH] += launch;
        for (j, x) in begin.x.iter_mut().enumerate() {
            if held[j] {
                *x = prior.x[j];
            }
        }
        begin
    });
    fit_from(device, samples, &prior, &held, &starts)
}

/// The parameters only convolutions decide.
pub const CONV_PARAMETERS: [&str; 3] =
    ["conv-efficiency", "conv-backward-weight-efficiency", "conv-backward-data-efficiency"];

/// [`fit`] in two stages when `samples` mix plain products and shaped convolutions: the
/// device's curves from everything but the convolutions (GEMMs, element-wise, reductions),
/// then the convolution factors alone from the convolutions with the rest held. Convolutions
/// carry errors of their own (the library's algorithm choice per direction) that a joint fit
/// would push into the device's GEMM curve. Without shaped convolutions this is [`fit`].
pub fn fit_staged(
    device: &Device,
    samples: &[Sample],
    start: &ComputeModel,
    hold: &[&str],
) -> Result<Fit, CalibrationError> {
    let is_conv = |s: &Sample| matches!(s.work.shape, crate::kernel_shape::KernelShape::Conv { .. });
    let (convs, rest): (Vec<Sample>, Vec<Sample>) = samples.iter().cloned().partition(is_conv);
    if convs.is_empty() || rest.is_empty() {
        return fit(device, samples, start, hold);
    }
    let mut first_hold: Vec<&str> = hold.to_vec();
    first_hold.extend(CONV_PARAMETERS);
    let first = fit(device, &rest, start, &first_hold)?;
    let mut second_hold: Vec<&str> =
        PARAMETERS.iter().copied().filter(|p| !CONV_PARAMETERS.contains(p)).collect();
    second_hold.extend(hold.iter().copied().filter(|p| CONV_PARAMETERS.contains(p)));
    let second = fit(device, &convs, &first.model, &second_hold)?;
    // Support over all samples, each parameter counted in the stage that fitted it.
    let mut support = first.support;
    for (j, name) in PARAMETERS.iter().enumerate() {
        if CONV_PARAMETERS.contains(name) {
            support[j] = second.support[j];
        }
    }
    let mut squares = 0.0;
    for sample in samples {
        squares += (predict(&second.model, device, sample)? / sample.measured_s).ln().powi(2);
    }
    let rms_log_error = (squares / samples.len() as f64).sqrt();
    Ok(Fit { model: second.model, support, rms_log_error, iterations: first.iterations + second.iterations })
}

/// Fits from each of `starts` (pulled towards `prior`) and keeps the best.
fn fit_from(
    device: &Device,
    samples: &[Sample],
    prior: &Point,
    held: &Held,
    starts: &[Point],
) -> Result<Fit, CalibrationError> {
    let priced = Priced::new(samples);
    let mut best: Option<(Point, f64, u32)> = None;
    for begin in starts {
        let result = levenberg_marquardt(*begin, prior, held, device, &priced)?;
        if best.as_ref().is_none_or(|b| result.1 < b.1) {
            best = Some(result);
        }
    }
    let Some((point, _, iterations)) = best else {
        return Err(CalibrationError::NoSamples("no start converged".into()));
    };
    let model = point.model();
    // Support: samples whose log-prediction moves by more than the threshold per e-fold change
    // of the parameter (elasticity). The Jacobian is per unit of the unconstrained coordinate:
    // a log for times, a logit for efficiencies, whose derivative is (1 - p) times the
    // elasticity.
    let base = residuals(&point, &point, device, &priced)?;
    let columns = jacobian(&point, &base, &point, device, &priced)?;
    let mut support = [0; COUNT];
    let distinct = priced.len();
    for (j, (count, column)) in support.iter_mut().zip(&columns).enumerate() {
        let scale = if is_logit(j) { 1.0 / (1.0 - sigmoid(point.x[j])) } else { 1.0 };
        // A column holds sqrt(n) times the derivative each of its n samples shares.
        *count = column[..distinct]
            .iter()
            .zip(&priced.count)
            .filter(|(d, n)| (*d / n.sqrt() * scale).abs() > SUPPORT_THRESHOLD)
            .map(|(_, n)| *n as usize)
            .sum();
    }
    let rms_log_error = (loss(&base[..distinct], &priced) / samples.len() as f64).sqrt();
    Ok(Fit { model, support, rms_log_error, iterations })
}

/// The report name of a class.
pub fn class_name(class: OpClass) -> &'static str {
    match class {
        OpClass::Gemm => "gemm",
        OpClass::Elementwise => "elementwise",
        OpClass::Reduction => "reduction",
        OpClass::Normalization => "normalization",
    }
}

/// Errors per class (in the order gemm, elementwise, reduction, normalization; absent classes
/// left out) and
/// over all samples, for `predictions[i]` of `samples[i]`.
pub fn class_errors(samples: &[Sample], predictions: &[f64]) -> Vec<ClassError> {
    let keys: Vec<(u8, String)> =
        samples.iter().map(|s| (s.work.class as u8, class_name(s.work.class).to_string())).collect();
    grouped_errors(samples, predictions, &keys, true)
}

/// Errors per shape regime, in the order below (absent regimes left out), for `predictions[i]`
/// of `samples[i]` on `device`:
/// - shaped products: `gemm thin, wide operand along k` (a thin product whose layout is
///   known and whose wide operand is stored along the reduction:
///   [`crate::GemmShape::thin_and_k_major`]), `gemm thin` (other products with an output side of
///   at most 64), `gemm under one wave` (fewer
///   128 x 128 tiles than the device has multiprocessors), `gemm large`;
/// - convolutions by direction: `conv forward`, `conv backward-data`, `conv backward-weight`;
/// - products without a shape by FLOPs: `gemm < 0.1 GFLOP`, `gemm 0.1-10 GFLOP`,
///   `gemm > 10 GFLOP`;
/// - element-wise, reduction and normalization kernels by bytes: `< 1 MB`, `1-100 MB`,
///   `> 100 MB`.
pub fn regime_errors(device: &Device, samples: &[Sample], predictions: &[f64]) -> Vec<ClassError> {
    use crate::kernel_shape::{ConvDirection, KernelShape, THIN_GEMM_SIDE};
    let units = device.execution.as_ref().map_or(u64::MAX, |e| u64::from(e.sm_count));
    let keys: Vec<(u8, String)> = samples
        .iter()
        .map(|sample| {
            let work = &sample.work;
            let (rank, name): (u8, &str) = match (&work.shape, work.class) {
                (KernelShape::Gemm(g), _) if g.thin_and_k_major() => (0, "gemm thin, wide operand along k"),
                (KernelShape::Gemm(g), _) if g.m.min(g.n) <= THIN_GEMM_SIDE => (1, "gemm thin"),
                (KernelShape::Gemm(g), _) if g.batch * g.m.div_ceil(128) * g.n.div_ceil(128) < units => {
                    (2, "gemm under one wave")
                }
                (KernelShape::Gemm(_), _) => (3, "gemm large"),
                (KernelShape::Conv { direction, .. }, _) => match direction {
                    ConvDirection::Forward => (4, "conv forward"),
                    ConvDirection::BackwardData => (5, "conv backward-data"),
                    ConvDirection::BackwardWeight => (6, "conv backward-weight"),
                },
                (KernelShape::Attention(_), _) => (7, "attention"),
                (KernelShape::Unknown, OpClass::Gemm) if work.flops < 1e8 => (8, "gemm < 0.1 GFLOP"),
                (KernelShape::Unknown, OpClass::Gemm) if work.flops <= 1e10 => (9, "gemm 0.1-10 GFLOP"),
                (KernelShape::Unknown, OpClass::Gemm) => (10, "gemm > 10 GFLOP"),
                (KernelShape::Unknown | KernelShape::Reduction(_), class) => {
                    let (base, names) = match class {
                        OpClass::Elementwise => {
                            (11, ["elementwise < 1 MB", "elementwise 1-100 MB", "elementwise > 100 MB"])
                        }
                        OpClass::Normalization => {
                            (17, ["normalization < 1 MB", "normalization 1-100 MB", "normalization > 100 MB"])
                        }
                        OpClass::Gemm | OpClass::Reduction => {
                            (14, ["reduction < 1 MB", "reduction 1-100 MB", "reduction > 100 MB"])
                        }
                    };
                    let size = if work.bytes < 1e6 {
                        0
                    } else if work.bytes <= 1e8 {
                        1
                    } else {
                        2
                    };
                    (base + size, names[usize::from(size)])
                }
            };
            (rank, name.to_string())
        })
        .collect();
    grouped_errors(samples, predictions, &keys, false)
}

/// Errors of the samples grouped by `keys[i]` (ordered by the number, named by the text), and
/// over all of them if `total`.
fn grouped_errors(
    samples: &[Sample],
    predictions: &[f64],
    keys: &[(u8, String)],
    total: bool,
) -> Vec<ClassError> {
    let mut groups: BTreeMap<u8, (String, Vec<usize>)> = BTreeMap::new();
    for (i, (rank, name)) in keys.iter().enumerate() {
        groups.entry(*rank).or_insert_with(|| (name.clone(), Vec::new())).1.push(i);
    }
    let summarize = |name: &str, members: &[usize]| {
        let mut errors: Vec<f64> =
            members.iter().map(|&i| (predictions[i] / samples[i].measured_s - 1.0).abs()).collect();
        errors.sort_by(f64::total_cmp);
        let measured: f64 = members.iter().map(|&i| samples[i].measured_s).sum();
        let predicted: f64 = members.iter().map(|&i| predictions[i]).sum();
        let absolute: f64 = members.iter().map(|&i| (predictions[i] - samples[i].measured_s).abs()).sum();
        // Rounded for the profile file: seconds to the nanosecond, errors to 0.01%.
        let ns = |s: f64| (s * 1e9).round() / 1e9;
        let ratio = |r: f64| (r * 1e4).round() / 1e4;
        ClassError {
            class: name.to_string(),
            samples: members.len(),
            measured_s: ns(measured),
            predicted_s: ns(predicted),
            median_error: ratio(median(&errors)),
            weighted_error: ratio(absolute / measured),
        }
    };
    let mut out: Vec<ClassError> = groups.values().map(|(name, members)| summarize(name, members)).collect();
    let all: Vec<usize> = (0..samples.len()).collect();
    if total && !all.is_empty() {
        out.push(summarize("all", &all));
    }
    out
}

/// The median of `sorted` (ascending): the middle value, or the mean of the middle two; NaN
/// when empty.
pub fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]),
    }
}

/// Predictions of every sample under `model`.
pub fn predictions(
    model: &ComputeModel,
    device: &Device,
    samples: &[Sample],
) -> Result<Vec<f64>, ComputeError> {
    samples.iter().map(|s| predict(model, device, s)).collect()
}

/// Held-out predictions: samples are split into `folds` by their group (whole shapes held out
/// together), each fold predicted by a model fitted to the others. Groups are assigned to folds
/// by a hash, so the split is deterministic. `full` is [`fit`]'s model for all the samples
/// from `start`: each fold starts there (one start instead of five: the same minimum, found
/// faster), with the same pull towards `start` and the same parameters held.
pub fn cross_validate(
    device: &Device,
    samples: &[Sample],
    start: &ComputeModel,
    hold: &[&str],
    full: &ComputeModel,
    folds: u64,
) -> Result<Vec<f64>, CalibrationError> {
    check(samples)?;
    let held = held_set(hold, samples)?;
    let folds = folds.max(2);
    let fold_of = |s: &Sample| splitmix(s.group) % folds;
    let prior = Point::holding(start, &held);
    let warm = [Point { x: Point::of(full).x, ..prior }];
    let mut out = vec![f64::NAN; samples.len()];
    for fold in 0..folds {
        let training: Vec<Sample> = samples.iter().filter(|s| fold_of(s) != fold).cloned().collect();
        // With every group in one fold there is nothing to train on: the full fit predicts.
        let staged =
            training.iter().any(|s| matches!(s.work.shape, crate::kernel_shape::KernelShape::Conv { .. }));
        let model = if training.is_empty() || training.len() == samples.len() {
            full.clone()
        } else if staged {
            fit_staged(device, &training, start, hold)?.model
        } else {
            fit_from(device, &training, &prior, &held, &warm)?.model
        };
        for (prediction, sample) in out.iter_mut().zip(samples) {
            if fold_of(sample) == fold {
                *prediction = predict(&model, device, sample)?;
            }
        }
    }
    Ok(out)
}

/// SplitMix64: spreads group keys over folds.
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceCatalog;
    use crate::device::Dtype;

    fn a100() -> &'static Device {
        DeviceCatalog::builtin().get("a100-sxm4-40gb").unwrap()
    }

    /// GEMMs and element-wise kernels over four decades of size, priced by `truth`.
    fn synthetic(truth: &ComputeModel, noise: impl Fn(usize) -> f64) -> Vec<Sample> {
        synthetic_sizes(truth, noise, &[64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0])
    }

    /// The same at the given matrix sizes.
    fn synthetic_sizes(truth: &ComputeModel, noise: impl Fn(usize) -> f64, sizes: &[f64]) -> Vec<Sample> {
        let mut samples = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            samples.push(Sample {
                work: KernelWork {
                    class: OpClass::Gemm,
                    dtype: Dtype::Fp32,
                    flops: 2.0 * n * n * n,
                    bytes: 12.0 * n * n,
                    // Every other size off the 16-byte grid, as a trace's odd shapes are.
                    aligned: i % 2 == 0,
                    shape: KernelShape::Unknown,
                },
                after: Vec::new(),
                kernels: 1,
                measured_s: 0.0,
                communication: 0.0,
                group: i as u64,
            });
            for (j, (class, flops_per)) in
                [(OpClass::Elementwise, 1.0), (OpClass::Reduction, 5.0), (OpClass::Normalization, 5.0)]
                    .into_iter()
                    .enumerate()
            {
                samples.push(Sample {
                    work: KernelWork {
                        class,
                        dtype: Dtype::Fp32,
                        flops: flops_per * n * n,
                        bytes: 8.0 * n * n,
                        aligned: true,
                        shape: KernelShape::Unknown,
                    },
                    after: Vec::new(),
                    kernels: 1 + j as u32,
                    measured_s: 0.0,
                    communication: 0.0,
                    group: 100 + 10 * i as u64 + j as u64,
                });
            }
        }
        for (i, sample) in samples.iter_mut().enumerate() {
            sample.measured_s = predict(truth, a100(), sample).unwrap() * noise(i);
        }
        samples
    }

    /// The loss of `point` taken sample by sample: each sample's squared log-ratio, then the
    /// prior's pulls.
    fn loss_one_by_one(point: &Point, prior: &Point, samples: &[Sample]) -> f64 {
        let (curves, launch, rates) = point.curves();
        let samples: f64 = samples
            .iter()
            .map(|s| (predict_with(&curves, launch, rates, a100(), s).unwrap() / s.measured_s).ln().powi(2))
            .sum();
        samples + pulls(point, prior).map(|p| p * p).sum::<f64>()
    }

    /// Samples repeated with other measured times share one pricing per distinct work, kernels
    /// and communication share; the grouped loss is the loss taken sample by sample, a held
    /// coordinate's Jacobian column, found from its pull alone, is exactly the difference
    /// quotient of the full residuals, and the fit is a minimum of the sample-by-sample loss.
    #[test]
    fn repeated_samples_are_priced_once_and_fit_as_one_by_one() {
        let truth = truth();
        let base = synthetic(&truth, |_| 1.0);
        let mut samples = Vec::new();
        for copy in 0..3 {
            for (i, sample) in base.iter().enumerate() {
                let mut sample = sample.clone();
                sample.measured_s *= 1.0 + 0.01 * ((i + copy) % 5) as f64;
                samples.push(sample);
            }
        }
        // One sample beside communication: priced apart from its otherwise equal twin.
        samples[1].communication = 0.25;
        let priced = Priced::new(&samples);
        assert_eq!(priced.len(), base.len() + 1);
        assert_eq!(priced.count.iter().sum::<f64>(), samples.len() as f64);
        assert_eq!(priced.count[0], 3.0);
        assert_eq!(priced.count[1], 1.0, "the sample beside communication is its own pricing");
        assert_eq!(priced.count[priced.len() - 1], 2.0, "its two copies apart from it share one");
        assert!(priced.spread > 0.0, "the copies' measured times differ");

        let held: Held = std::array::from_fn(|j| j == LAUNCH);
        let start = ComputeModel::default();
        let prior = Point::holding(&start, &held);
        let mut point = prior;
        point.x[MEMORY_EFFICIENCY] += 0.3;
        let r = residuals(&point, &prior, a100(), &priced).unwrap();
        assert_eq!(r.len(), priced.len() + COUNT);
        let (grouped, one_by_one) = (loss(&r, &priced), loss_one_by_one(&point, &prior, &samples));
        assert!((grouped - one_by_one).abs() <= 1e-12 * one_by_one, "{grouped} vs {one_by_one}");
        let columns = jacobian(&point, &r, &prior, a100(), &priced).unwrap();
        let mut moved = point;
        moved.x[LAUNCH] += 1e-6;
        let full = residuals(&moved, &prior, a100(), &priced).unwrap();
        let quotient: Vec<u64> = full.iter().zip(&r).map(|(a, b)| ((a - b) / 1e-6).to_bits()).collect();
        let shortcut: Vec<u64> = columns[LAUNCH].iter().map(|d| d.to_bits()).collect();
        assert_eq!(shortcut, quotient);
        // A free coordinate moves the samples' residuals.
        assert!(columns[MEMORY_EFFICIENCY][..priced.len()].iter().any(|d| *d != 0.0));

        // The fit's model is a minimum of the loss taken sample by sample: no free coordinate
        // moved either way lowers it by more than a part in a million (the model keeps its
        // times in picoseconds, and a coordinate that one sample decides is flat).
        let fit = fit(a100(), &samples, &start, &[]).unwrap();
        let prior = Point::holding(&start, &held_set(&[], &samples).unwrap());
        let best = Point { x: Point::of(&fit.model).x, ..prior };
        let at_best = loss_one_by_one(&best, &prior, &samples);
        for j in (0..COUNT).filter(|&j| prior.fixed[j].is_none()) {
            for step in [-1e-3, 1e-3] {
                let mut moved = best;
                moved.x[j] += step;
                let there = loss_one_by_one(&moved, &prior, &samples);
                assert!(
                    there >= at_best * (1.0 - 1e-6),
                    "{} moved by {step}: {there} < {at_best}",
                    PARAMETERS[j]
                );
            }
        }
        let rms = (at_best - pulls(&best, &prior).map(|p| p * p).sum::<f64>()) / samples.len() as f64;
        // The same, but for the model's picoseconds.
        let rms = rms.sqrt();
        assert!((fit.rms_log_error - rms).abs() < 1e-4 * rms, "{} vs {rms}", fit.rms_log_error);
    }

    fn truth() -> ComputeModel {
        ComputeModel {
            // The synthetic products are fp32 on an A100: its vector units (tf32 is its matrix
            // dtype for fp32 tensors).
            vector_gemm_efficiency: 0.62,
            unaligned_gemm_efficiency: 0.4,
            gemm_ramp_exponent: 0.75,
            gemm_half_time: SimDuration::from_ns(1500),
            vector_efficiency: 0.5,
            memory_efficiency: 0.71,
            reduction_memory_efficiency: 0.45,
            memory_half_time: SimDuration::from_ns(2500),
            launch_overhead: SimDuration::from_ns(2200),
            reduction_overhead: SimDuration::from_ns(1800),
            ..ComputeModel::default()
        }
    }

    #[test]
    fn recovers_the_model_that_produced_the_samples() {
        let samples = synthetic(&truth(), |_| 1.0);
        let fit = fit(a100(), &samples, &ComputeModel::default(), &[]).unwrap();
        let m = &fit.model;
        let close = |a: f64, b: f64, tolerance: f64| (a / b - 1.0).abs() < tolerance;
        assert!(close(m.vector_gemm_efficiency, 0.62, 0.01), "{m:?}");
        assert!(close(m.unaligned_gemm_efficiency, 0.4, 0.01), "{m:?}");
        assert!(close(m.gemm_ramp_exponent, 0.75, 0.01), "{m:?}");
        assert!(close(m.memory_efficiency, 0.71, 0.01), "{m:?}");
        // The reduction curve's floor trades off a little with the combine.
        assert!(close(m.reduction_memory_efficiency, 0.45, 0.02), "{m:?}");
        // The ceiling, the half point and the exponent of the GEMM curve trade off a little.
        assert!(close(m.gemm_half_time.as_secs_f64(), 1.5e-6, 0.03), "{m:?}");
        // A memory-bound kernel's fixed costs, memory-half-time / efficiency + launch, trade
        // off against each other; only GEMMs and multi-kernel operators tell them apart, and
        // the weak pull towards the start takes a little of that: a few percent.
        assert!(close(m.memory_half_time.as_secs_f64(), 2.5e-6, 0.03), "{m:?}");
        assert!(close(m.launch_overhead.as_secs_f64(), 2.2e-6, 0.03), "{m:?}");
        // Reductions and normalisations pay their combine on top of the launch; element-wise
        // kernels of the same sizes do not, which tells the two apart.
        assert!(close(m.reduction_overhead.as_secs_f64(), 1.8e-6, 0.03), "{m:?}");
        // (The reduction curve's half point trades off a little with the fixed costs.)
        assert!(fit.rms_log_error < 2e-3, "{}", fit.rms_log_error);
        // No sample is compute-bound on the vector units: that parameter has no support.
        let support = |name: &str| fit.support[PARAMETERS.iter().position(|p| *p == name).unwrap()];
        assert_eq!(support("vector-efficiency"), 0, "{:?}", fit.support);
        for decided in [
            "vector-gemm-efficiency",
            "unaligned-gemm-efficiency",
            "gemm-ramp-exponent",
            "launch-overhead",
            "reduction-overhead",
        ] {
            assert!(support(decided) >= 3, "{decided}: {:?}", fit.support);
        }
        let errors = class_errors(&samples, &predictions(m, a100(), &samples).unwrap());
        assert!(errors.iter().all(|e| e.weighted_error < 0.01), "{errors:?}");
    }

    #[test]
    fn recovers_the_memory_side_of_unaligned_products_apart_from_their_compute_side() {
        // Thin products (a 4-deep reduction: 2 FLOP per byte, as DLRM's N = 30 `bmm`) stream
        // their operands and output; every other size off the 16-byte grid.
        let thin = ComputeModel { unaligned_memory_efficiency: 0.6, ..truth() };
        let mut samples = synthetic(&thin, |_| 1.0);
        for (i, n) in [256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0].into_iter().enumerate()
        {
            let work = KernelWork {
                class: OpClass::Gemm,
                dtype: Dtype::Fp32,
                flops: 2.0 * n * n * 4.0,
                bytes: 4.0 * (2.0 * 4.0 * n + n * n),
                aligned: i % 2 == 0,
                shape: KernelShape::Unknown,
            };
            let mut sample = Sample {
                work,
                after: Vec::new(),
                kernels: 1,
                measured_s: 0.0,
                communication: 0.0,
                group: 1000 + i as u64,
            };
            sample.measured_s = predict(&thin, a100(), &sample).unwrap();
            samples.push(sample);
        }
        let fit = fit(a100(), &samples, &ComputeModel::default(), &[]).unwrap();
        let m = &fit.model;
        assert!((m.unaligned_memory_efficiency / 0.6 - 1.0).abs() < 0.02, "{m:?}");
        assert!((m.unaligned_gemm_efficiency / 0.4 - 1.0).abs() < 0.02, "{m:?}");
        let support =
            fit.support[PARAMETERS.iter().position(|p| *p == "unaligned-memory-efficiency").unwrap()];
        assert!(support >= 3, "{:?}", fit.support);
        // Held, it stays where it was put.
        let m = fit_held(&samples, &["unaligned-memory-efficiency"]);
        assert_eq!(m.unaligned_memory_efficiency, 1.0);
    }

    fn fit_held(samples: &[Sample], hold: &[&str]) -> ComputeModel {
        fit(a100(), samples, &ComputeModel::default(), hold).unwrap().model
    }

    #[test]
    fn recovers_the_l2_share_of_streaming_traffic() {
        // Streaming kernels from 32 kB to 134 MB on an A100 (40 MiB of L2): those inside the L2
        // read a share of it from the cache, those beyond it the same bytes.
        let cached = ComputeModel { l2_hit_fraction: 0.3, ..truth() };
        let samples = synthetic(&cached, |_| 1.0);
        let m = fit(a100(), &samples, &ComputeModel::default(), &[]).unwrap().model;
        assert!((m.l2_hit_fraction / 0.3 - 1.0).abs() < 0.02, "{m:?}");
        assert!((m.memory_efficiency / 0.71 - 1.0).abs() < 0.02, "{m:?}");
        // Without it in the samples the fit leaves it near 0, and held it stays where it is.
        let samples = synthetic(&truth(), |_| 1.0);
        let m = fit(a100(), &samples, &ComputeModel::default(), &[]).unwrap().model;
        assert!(m.l2_hit_fraction < 0.01, "{m:?}");
        let m = fit(a100(), &samples, &ComputeModel::default(), &["l2-hit-fraction"]).unwrap().model;
        assert_eq!(m.l2_hit_fraction, 0.0);
        // Products alone (a kernel table) do not decide it: it keeps its start.
        let products: Vec<Sample> =
            samples.iter().filter(|s| s.work.class == OpClass::Gemm).cloned().collect();
        let m = fit(a100(), &products, &ComputeModel::default(), &[]).unwrap().model;
        assert_eq!(m.l2_hit_fraction, 0.0);
    }

    #[test]
    fn a_kernel_beside_communication_takes_its_time_times_the_slowdown_in_proportion() {
        // Fully beside: T * s. Half its measured time beside, at rate 1/s meanwhile:
        // T = d/2 + d/(2s), so d = 2 T s / (s + 1).
        assert!((beside_communication(3.0, 1.0, 1.0 / 2.0) - 6.0).abs() < 1e-12);
        assert!((beside_communication(3.0, 0.5, 1.0 / 2.0) - 4.0).abs() < 1e-12);
        assert_eq!(beside_communication(3.0, 0.0, 0.5), 3.0);
        assert_eq!(beside_communication(3.0, 1.0, 1.0), 3.0);
        // The model's own fully-beside time: a memory-bound kernel's work times the memory
        // slowdown plus its launch times the launch slowdown.
        let model = ComputeModel {
            communication_memory_slowdown: 1.5,
            communication_compute_slowdown: 1.2,
            communication_launch_slowdown: 2.0,
            ..ComputeModel::default()
        };
        let copy = KernelWork::flat(OpClass::Elementwise, Dtype::Fp32, 1e6, 1e9);
        let alone = model.kernel_seconds(a100(), &copy).unwrap();
        let beside = model.beside_communication_seconds(a100(), &copy).unwrap();
        assert!((beside - (1.5 * alone + 2.0 * 4e-6)).abs() < 1e-12, "{beside} {alone}");
        let sample = Sample {
            work: copy,
            after: Vec::new(),
            kernels: 1,
            measured_s: 1.0,
            communication: 1.0,
            group: 0,
        };
        assert!((predict(&model, a100(), &sample).unwrap() - beside).abs() < 1e-12);
        let product = KernelWork::flat(OpClass::Gemm, Dtype::Fp16, 1e13, 1e6);
        let alone = model.kernel_seconds(a100(), &product).unwrap();
        let beside = model.beside_communication_seconds(a100(), &product).unwrap();
        assert!((beside - (1.2 * alone + 2.0 * 4e-6)).abs() < 1e-12, "{beside} {alone}");
    }

    #[test]
    fn recovers_the_slowdowns_beside_communication() {
        let slowed = ComputeModel {
            communication_memory_slowdown: 1.1,
            communication_launch_slowdown: 1.9,
            communication_compute_slowdown: 1.3,
            ..truth()
        };
        let mut samples = synthetic(&slowed, |_| 1.0);
        // Every other operator ran beside communication, for a share that varies (four samples
        // per size: a product, then an element-wise, a reduction and a normalisation kernel;
        // the pattern shifts by one every two sizes so that aligned and unaligned products
        // run on both sides).
        for (i, sample) in samples.iter_mut().enumerate() {
            sample.communication =
                if (i + i / 8) % 2 == 0 { 0.0 } else { 0.3 + 0.7 * ((i / 2) % 4) as f64 / 3.0 };
            sample.measured_s = predict(&slowed, a100(), sample).unwrap();
        }
        let m = fit(a100(), &samples, &ComputeModel::default(), &[]).unwrap().model;
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 0.03;
        assert!(close(m.communication_memory_slowdown, 1.1), "{m:?}");
        assert!(close(m.communication_compute_slowdown, 1.3), "{m:?}");
        assert!(close(m.communication_launch_slowdown, 1.9), "{m:?}");
        // Without operators beside communication the slowdowns stay exactly at their start.
        let alone = synthetic(&truth(), |_| 1.0);
        let m = fit(a100(), &alone, &ComputeModel::default(), &[]).unwrap().model;
        assert_eq!(
            (
                m.communication_memory_slowdown,
                m.communication_compute_slowdown,
                m.communication_launch_slowdown
            ),
            (1.0, 1.0, 1.0)
        );
    }

    #[test]
    fn held_parameters_keep_their_start_and_the_rest_compensates() {
        let samples = synthetic(&truth(), |_| 1.0);
        let start = ComputeModel {
            gemm_ramp_exponent: 1.0,
            launch_overhead: SimDuration::from_ns(2200),
            ..Default::default()
        };
        let fit = fit(a100(), &samples, &start, &["gemm-ramp-exponent", "launch-overhead"]).unwrap();
        assert_eq!(fit.model.gemm_ramp_exponent, 1.0);
        assert_eq!(fit.model.launch_overhead, SimDuration::from_ns(2200));
        // The truth has an exponent of 0.75: held at 1 the GEMMs cannot all be fitted...
        assert!(fit.rms_log_error > 1e-2, "{}", fit.rms_log_error);
        // ...while the memory-bound classes, which do not depend on it, still are.
        assert!((fit.model.memory_efficiency / 0.71 - 1.0).abs() < 0.01, "{:?}", fit.model);
    }

    #[test]
    fn noisy_samples_still_give_the_model_within_a_few_percent() {
        // Deterministic +-10% multiplicative noise.
        let noise = |i: usize| 1.0 + 0.1 * ((splitmix(i as u64) % 2001) as f64 / 1000.0 - 1.0);
        let mut samples = Vec::new();
        for copy in 0..20 {
            let mut batch = synthetic(&truth(), |i| noise(i + 1000 * copy));
            samples.append(&mut batch);
        }
        let m = fit(a100(), &samples, &ComputeModel::default(), &[]).unwrap().model;
        assert!((m.vector_gemm_efficiency / 0.62 - 1.0).abs() < 0.05, "{m:?}");
        assert!((m.memory_efficiency / 0.71 - 1.0).abs() < 0.05, "{m:?}");
    }

    #[test]
    fn held_out_shapes_are_predicted_by_models_that_never_saw_them() {
        // Sizes a factor 1.26 apart: every held-out size has neighbours in the training folds.
        let sizes: Vec<f64> = (0..19).map(|k| 64.0 * 2f64.powf(k as f64 / 3.0)).collect();
        let samples = synthetic_sizes(&truth(), |_| 1.0, &sizes);
        let full = fit(a100(), &samples, &ComputeModel::default(), &[]).unwrap().model;
        let held_out = cross_validate(a100(), &samples, &ComputeModel::default(), &[], &full, 5).unwrap();
        assert!(held_out.iter().all(|p| p.is_finite()));
        let errors = class_errors(&samples, &held_out);
        let all = errors.last().unwrap();
        assert_eq!(all.class, "all");
        assert!(all.weighted_error < 0.05, "{errors:?}");
    }

    #[test]
    fn bad_input_is_refused_by_name() {
        assert!(matches!(
            fit(a100(), &[], &ComputeModel::default(), &[]),
            Err(CalibrationError::NoSamples(_))
        ));
        let samples = synthetic(&truth(), |_| 1.0);
        let error = fit(a100(), &samples, &ComputeModel::default(), &["gemm-ramp"]).unwrap_err().to_string();
        assert!(error.contains("gemm-ramp") && error.contains("gemm-ramp-exponent"), "{error}");
        let mut samples = synthetic(&truth(), |_| 1.0);
        samples[3].measured_s = 0.0;
        let error = fit(a100(), &samples, &ComputeModel::default(), &[]).unwrap_err().to_string();
        assert!(error.contains("sample 3") && error.contains("positive"), "{error}");
        let mut samples = synthetic(&truth(), |_| 1.0);
        samples[2].communication = 1.5;
        let error = fit(a100(), &samples, &ComputeModel::default(), &[]).unwrap_err().to_string();
        assert!(error.contains("sample 2") && error.contains("beside communication"), "{error}");
        let slow = ComputeModel { communication_launch_slowdown: 0.5, ..ComputeModel::default() };
        let error = fit(a100(), &synthetic(&truth(), |_| 1.0), &slow, &[]).unwrap_err().to_string();
        assert!(error.contains("communication-launch-slowdown") && error.contains("at least 1"), "{error}");
    }
}
