//! The compute model's knobs, each written once: [`KNOBS`] has one entry per field of
//! [`ComputeModel`] with its key (in scenario `[compute]` tables, profiles and `--hold`), what
//! it sets, its kind (which decides how it is read, checked and fitted), whether calibration
//! fits it, and how to read and write it on a model.
//!
//! [`ComputeModel::validate`], the scenario's `[compute]` section, calibration's parameter list
//! ([`crate::calibrate::PARAMETERS`]) and `parasim calibrate`'s report all read this table.
//!
//! ```
//! use workloads::ComputeModel;
//! use workloads::compute::knobs::{KnobValue, knob};
//!
//! let gemm = knob("gemm-efficiency").unwrap();
//! let mut model = ComputeModel::default();
//! gemm.set(&mut model, KnobValue::Number(0.7));
//! assert_eq!(model.gemm_efficiency, 0.7);
//! gemm.set(&mut model, KnobValue::Number(1.5));
//! assert!(model.validate().unwrap_err().to_string().contains("`gemm-efficiency` is 1.5"));
//! ```

use std::fmt;

use serde::Deserializer;
use serde::de::{Deserialize, DeserializeSeed};
use sim_core::units::SimDuration;

use super::{ComputeError, ComputeModel};

/// What values a knob takes: how a scenario's value is read, which range it must be in, and
/// how calibration searches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnobKind {
    /// A number in (0, 1]: an efficiency, a factor on one, or the GEMM ramp's exponent.
    /// Calibration fits its logit, from 5% up.
    Efficiency,
    /// A share in [0, 1] that may be 0 (off). Calibration fits its logit, from 0.01% up.
    Fraction,
    /// A factor of at least 1 (1 is no slowdown). Calibration fits the logit of its inverse,
    /// the rate a kernel keeps, from 5% up.
    Slowdown,
    /// A finite number, not negative. Calibration fits its logarithm.
    NonNegative,
    /// A duration with a unit (`"3 us"`). Calibration fits its logarithm in microseconds,
    /// between e^-20 and e^20 us.
    Duration,
    /// `true` or `false`; never fitted.
    Switch,
}

impl KnobKind {
    /// The kinds whose values [`ComputeModel::validate`] checks, in the order it checks them:
    /// of several bad values, the one of the earliest kind is reported (then table order).
    pub const CHECKED: [KnobKind; 4] =
        [KnobKind::Efficiency, KnobKind::Slowdown, KnobKind::Fraction, KnobKind::NonNegative];
}

/// The value of one knob.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KnobValue {
    /// The value of an efficiency, fraction, slowdown or other number.
    Number(f64),
    /// The value of a duration.
    Duration(SimDuration),
    /// The value of a switch.
    Switch(bool),
}

/// One knob of the compute model.
#[derive(Clone, Copy)]
pub struct Knob {
    /// Its key in scenario `[compute]` tables, profiles and `--hold`: the field's serde name.
    pub key: &'static str,
    /// What it sets, in one line (the field's documentation says more).
    pub doc: &'static str,
    /// Its values.
    pub kind: KnobKind,
    /// Its position among the parameters calibration fits ([`crate::calibrate::PARAMETERS`],
    /// the order of the fit's coordinates and of the calibration report), or `None` if
    /// calibration leaves it alone.
    pub fit: Option<usize>,
    get: fn(&ComputeModel) -> KnobValue,
    set: fn(&mut ComputeModel, KnobValue) -> bool,
}

impl fmt::Debug for Knob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Knob")
            .field("key", &self.key)
            .field("kind", &self.kind)
            .field("fit", &self.fit)
            .finish()
    }
}

impl Knob {
    /// The knob's value in `model`.
    pub fn get(&self, model: &ComputeModel) -> KnobValue {
        (self.get)(model)
    }

    /// Sets the knob in `model` to `value`.
    ///
    /// # Panics
    ///
    /// If `value` is not of the knob's kind ([`KnobValue::Number`] for the numbers,
    /// [`KnobValue::Duration`] for durations, [`KnobValue::Switch`] for switches).
    pub fn set(&self, model: &mut ComputeModel, value: KnobValue) {
        assert!((self.set)(model, value), "compute knob `{}` is a {:?}, not {value:?}", self.key, self.kind);
    }

    /// Checks `value` against the knob's range: the error [`ComputeModel::validate`] reports
    /// for it. Durations and switches are always valid.
    pub fn check(&self, value: KnobValue) -> Result<(), ComputeError> {
        let KnobValue::Number(value) = value else { return Ok(()) };
        let parameter = self.key;
        // Each condition is written so that NaN fails it.
        match self.kind {
            KnobKind::Efficiency if !(value > 0.0 && value <= 1.0) => {
                Err(ComputeError::InvalidEfficiency { parameter, value: value.to_string() })
            }
            KnobKind::Fraction if !(0.0..=1.0).contains(&value) => {
                Err(ComputeError::InvalidFraction { parameter, value: value.to_string() })
            }
            KnobKind::Slowdown if !(value.is_finite() && value >= 1.0) => {
                Err(ComputeError::InvalidSlowdown { parameter, value: value.to_string() })
            }
            KnobKind::NonNegative if !(value.is_finite() && value >= 0.0) => {
                Err(ComputeError::InvalidWork { quantity: parameter, value: value.to_string() })
            }
            _ => Ok(()),
        }
    }

    /// Reads a value of the knob's kind (a number, a duration with its unit, or a boolean)
    /// from `deserializer`, with the deserializer's own errors for a value of another type.
    pub fn deserialize_value<'de, D: Deserializer<'de>>(
        &self,
        deserializer: D,
    ) -> Result<KnobValue, D::Error> {
        Ok(match self.kind {
            KnobKind::Duration => KnobValue::Duration(SimDuration::deserialize(deserializer)?),
            KnobKind::Switch => KnobValue::Switch(bool::deserialize(deserializer)?),
            KnobKind::Efficiency | KnobKind::Fraction | KnobKind::Slowdown | KnobKind::NonNegative => {
                KnobValue::Number(f64::deserialize(deserializer)?)
            }
        })
    }
}

/// Reads the knob's value: [`Knob::deserialize_value`] as a seed (`map.next_value_seed(knob)`).
impl<'de> DeserializeSeed<'de> for &Knob {
    type Value = KnobValue;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<KnobValue, D::Error> {
        self.deserialize_value(deserializer)
    }
}

/// A field type a knob reads and writes.
trait Field: Sized {
    fn wrap(self) -> KnobValue;
    fn unwrap(value: KnobValue) -> Option<Self>;
}

impl Field for f64 {
    fn wrap(self) -> KnobValue {
        KnobValue::Number(self)
    }
    fn unwrap(value: KnobValue) -> Option<f64> {
        if let KnobValue::Number(number) = value { Some(number) } else { None }
    }
}

impl Field for SimDuration {
    fn wrap(self) -> KnobValue {
        KnobValue::Duration(self)
    }
    fn unwrap(value: KnobValue) -> Option<SimDuration> {
        if let KnobValue::Duration(duration) = value { Some(duration) } else { None }
    }
}

impl Field for bool {
    fn wrap(self) -> KnobValue {
        KnobValue::Switch(self)
    }
    fn unwrap(value: KnobValue) -> Option<bool> {
        if let KnobValue::Switch(switch) = value { Some(switch) } else { None }
    }
}

/// A [`Knob`] entry for field `$field`.
macro_rules! knob {
    ($key:literal, $field:ident, $kind:ident, $fit:expr, $doc:literal) => {
        Knob {
            key: $key,
            doc: $doc,
            kind: KnobKind::$kind,
            fit: $fit,
            get: |model| Field::wrap(model.$field),
            set: |model, value| Field::unwrap(value).map(|value| model.$field = value).is_some(),
        }
    };
}

/// Every knob of the compute model, in the order the scenario format lists them (the order
/// of `[compute]`'s keys in its messages).
pub const KNOBS: &[Knob] = &[
    knob!(
        "gemm-efficiency",
        gemm_efficiency,
        Efficiency,
        Some(0),
        "Fraction of the dtype's peak FLOP/s that large GEMM-class kernels reach: the GEMM curve's ceiling."
    ),
    knob!(
        "vector-gemm-efficiency",
        vector_gemm_efficiency,
        Efficiency,
        Some(13),
        "The same ceiling for products on a device's vector units (dtypes not among its matrix dtypes)."
    ),
    knob!(
        "unaligned-gemm-efficiency",
        unaligned_gemm_efficiency,
        Efficiency,
        Some(1),
        "Factor on the ceiling for products whose feature dimensions are not multiples of 16 bytes."
    ),
    knob!(
        "k-major-thin-gemm-efficiency",
        k_major_thin_gemm_efficiency,
        Efficiency,
        Some(21),
        "Rate of a thin product whose wide operand is stored along the reduction, relative to along its output."
    ),
    knob!(
        "unaligned-memory-efficiency",
        unaligned_memory_efficiency,
        Efficiency,
        Some(22),
        "Factor on the memory rate of an unaligned product other than a convolution."
    ),
    knob!(
        "gemm-ramp-exponent",
        gemm_ramp_exponent,
        Efficiency,
        Some(2),
        "How gradually GEMM efficiency rises with work (1: the hyperbola; smaller: over more decades)."
    ),
    knob!(
        "gemm-half-time",
        gemm_half_time,
        Duration,
        Some(3),
        "Work, as time at the device's reference rate, at which a GEMM reaches half its ceiling."
    ),
    knob!(
        "vector-efficiency",
        vector_efficiency,
        Efficiency,
        Some(7),
        "Fraction of the fp32 (fp64) rate that element-wise and reduction kernels reach."
    ),
    knob!(
        "memory-efficiency",
        memory_efficiency,
        Efficiency,
        Some(4),
        "Fraction of the peak memory bandwidth that large GEMM and element-wise kernels reach."
    ),
    knob!(
        "reduction-memory-efficiency",
        reduction_memory_efficiency,
        Efficiency,
        Some(5),
        "Fraction of the peak memory bandwidth that large reduction kernels reach."
    ),
    knob!(
        "memory-half-time",
        memory_half_time,
        Duration,
        Some(6),
        "Traffic, as time at the peak bandwidth, at which a kernel reaches half of memory-efficiency."
    ),
    knob!(
        "reduction-half-time",
        reduction_half_time,
        Duration,
        Some(14),
        "Traffic at which a reduction's efficiency is halfway from reduction-memory-efficiency to memory-efficiency."
    ),
    knob!(
        "reduction-overhead",
        reduction_overhead,
        Duration,
        Some(19),
        "Fixed time of the combine of every reduction and row-wise normalisation kernel."
    ),
    knob!(
        "l2-hit-fraction",
        l2_hit_fraction,
        Fraction,
        Some(20),
        "Share of a streaming kernel's traffic, up to the L2's size, that the L2 cache serves."
    ),
    knob!(
        "launch-overhead",
        launch_overhead,
        Duration,
        Some(8),
        "Fixed time added to every kernel (launch and scheduling on the device)."
    ),
    knob!(
        "gemm-tile-half-intensity",
        gemm_tile_half_intensity,
        NonNegative,
        Some(9),
        "Operand reuse of a GEMM tile at which a thread block reaches half the ceiling (0: every tile alike)."
    ),
    knob!(
        "gemm-wave-overhead",
        gemm_wave_overhead,
        Duration,
        Some(10),
        "Fixed time of each wave of thread blocks of a shaped GEMM."
    ),
    knob!(
        "conv-efficiency",
        conv_efficiency,
        Efficiency,
        Some(11),
        "Factor on the GEMM ceiling for convolutions priced by their shape (implicit GEMM)."
    ),
    knob!(
        "conv-backward-weight-efficiency",
        conv_backward_weight_efficiency,
        Efficiency,
        Some(12),
        "Further factor for the backward-weight (wgrad) kernels of convolutions."
    ),
    knob!(
        "conv-backward-data-efficiency",
        conv_backward_data_efficiency,
        Efficiency,
        Some(15),
        "Further factor for the backward-data (dgrad) kernels of convolutions."
    ),
    knob!(
        "flash-attention-efficiency",
        flash_attention_efficiency,
        Efficiency,
        None,
        "Factor on the ceiling for the products of a fused (flash) attention kernel."
    ),
    knob!(
        "communication-memory-slowdown",
        communication_memory_slowdown,
        Slowdown,
        Some(16),
        "How much slower a memory-bound kernel runs beside a communication kernel or copy on its GPU."
    ),
    knob!(
        "communication-compute-slowdown",
        communication_compute_slowdown,
        Slowdown,
        Some(17),
        "The same for compute-bound kernels."
    ),
    knob!(
        "communication-launch-slowdown",
        communication_launch_slowdown,
        Slowdown,
        Some(18),
        "The same for every kernel's fixed cost (launch-overhead)."
    ),
    knob!(
        "dispatch-overhead",
        dispatch_overhead,
        Duration,
        None,
        "Host time to issue one kernel in eager mode (framework dispatch and the launch call)."
    ),
    knob!(
        "op-dispatch-overhead",
        op_dispatch_overhead,
        Duration,
        None,
        "Host time to issue each further kernel of a layer pass beyond its first (the framework's ops inside a module)."
    ),
    knob!(
        "step-overhead",
        step_overhead,
        Duration,
        None,
        "Host time per iteration after the step's synchronisation (loss read, logging), the GPU idle."
    ),
    knob!(
        "cuda-graphs",
        cuda_graphs,
        Switch,
        None,
        "Whether kernels replay from a CUDA graph: no per-kernel dispatch."
    ),
    knob!(
        "autocast",
        autocast,
        Switch,
        None,
        "Whether the model runs under torch.autocast over fp32 parameters: weight, norm-output and gradient casts as kernels of their own."
    ),
    knob!(
        "host-synchronous",
        host_synchronous,
        Switch,
        None,
        "Whether the host waits for each kernel to finish before it issues the next."
    ),
    knob!(
        "host-nan-checks",
        host_nan_checks,
        Switch,
        None,
        "Whether the host reads each micro-batch's loss and each gradient bucket's norm (NaN/Inf checks), waiting for each."
    ),
    knob!(
        "winograd-convolutions",
        winograd_convolutions,
        Switch,
        None,
        "Whether vector-unit convolutions may run as Winograd or FFT kernels (cuDNN's benchmark mode)."
    ),
];

/// The knob whose key is `key`, if any.
pub fn knob(key: &str) -> Option<&'static Knob> {
    KNOBS.iter().find(|knob| knob.key == key)
}

/// How many knobs calibration fits.
pub const FITTED_COUNT: usize = {
    let mut count = 0;
    let mut i = 0;
    while i < KNOBS.len() {
        if KNOBS[i].fit.is_some() {
            count += 1;
        }
        i += 1;
    }
    count
};

/// The knobs calibration fits, by their position among its parameters. A position given
/// twice or a gap fails the build.
pub const FITTED: [&Knob; FITTED_COUNT] = {
    let mut fitted: [Option<&Knob>; FITTED_COUNT] = [None; FITTED_COUNT];
    let mut i = 0;
    while i < KNOBS.len() {
        if let Some(position) = KNOBS[i].fit {
            assert!(fitted[position].is_none(), "two knobs share a fit position");
            fitted[position] = Some(&KNOBS[i]);
        }
        i += 1;
    }
    let mut out = [&KNOBS[0]; FITTED_COUNT];
    let mut position = 0;
    while position < FITTED_COUNT {
        match fitted[position] {
            Some(knob) => out[position] = knob,
            None => panic!("a fit position has no knob"),
        }
        position += 1;
    }
    out
};

/// The position among calibration's parameters of the fitted knob `key`; fails the build if
/// no fitted knob has that key.
pub const fn fit_position(key: &str) -> usize {
    let mut position = 0;
    while position < FITTED_COUNT {
        if same(FITTED[position].key, key) {
            return position;
        }
        position += 1;
    }
    panic!("no fitted compute knob has this key")
}

/// String equality in a constant.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid value of `knob`'s kind that differs from its default.
    fn other_value(knob: &Knob) -> KnobValue {
        let value = match knob.kind {
            KnobKind::Efficiency => KnobValue::Number(0.4375),
            KnobKind::Fraction => KnobValue::Number(0.25),
            KnobKind::Slowdown => KnobValue::Number(1.5),
            KnobKind::NonNegative => KnobValue::Number(3.5),
            KnobKind::Duration => KnobValue::Duration(SimDuration::from_ns(7_250)),
            KnobKind::Switch => {
                KnobValue::Switch(!matches!(knob.get(&ComputeModel::default()), KnobValue::Switch(true)))
            }
        };
        assert_ne!(value, knob.get(&ComputeModel::default()), "{}", knob.key);
        value
    }

    #[test]
    fn the_table_and_the_models_serde_fields_agree() {
        let serialized = toml::Table::try_from(ComputeModel::default()).unwrap();
        let fields: Vec<&str> = serialized.keys().map(String::as_str).collect();
        let mut keys: Vec<&str> = KNOBS.iter().map(|knob| knob.key).collect();
        keys.sort_unstable();
        let mut sorted_fields = fields.clone();
        sorted_fields.sort_unstable();
        assert_eq!(keys, sorted_fields);
        for knob in KNOBS {
            let expected = match knob.get(&ComputeModel::default()) {
                KnobValue::Number(number) => toml::Value::Float(number),
                KnobValue::Duration(duration) => toml::Value::try_from(duration).unwrap(),
                KnobValue::Switch(switch) => toml::Value::Boolean(switch),
            };
            assert_eq!(serialized[knob.key], expected, "{}", knob.key);
            assert!(!knob.doc.is_empty() && !knob.doc.contains('\n'), "{}", knob.key);
        }
    }

    #[test]
    fn every_knob_sets_its_own_field_and_reads_a_value_of_its_kind() {
        for knob in KNOBS {
            let value = other_value(knob);
            let mut model = ComputeModel::default();
            knob.set(&mut model, value);
            assert_eq!(knob.get(&model), value, "{}", knob.key);
            // No other knob moved.
            for other in KNOBS.iter().filter(|other| other.key != knob.key) {
                assert_eq!(
                    other.get(&model),
                    other.get(&ComputeModel::default()),
                    "{} moved {}",
                    knob.key,
                    other.key
                );
            }
            let text = match value {
                KnobValue::Number(number) => number.to_string(),
                KnobValue::Duration(duration) => format!("\"{duration}\""),
                KnobValue::Switch(switch) => switch.to_string(),
            };
            let table: toml::Table = format!("value = {text}").parse().unwrap();
            let read = knob.deserialize_value(table["value"].clone()).unwrap();
            assert_eq!(read, value, "{}", knob.key);
        }
    }

    #[test]
    fn fitted_knobs_are_numbers_and_durations_in_their_positions() {
        assert_eq!(FITTED_COUNT, 23);
        for (position, knob) in FITTED.iter().enumerate() {
            assert_eq!(knob.fit, Some(position));
            assert_eq!(fit_position(knob.key), position);
            assert_ne!(knob.kind, KnobKind::Switch, "{}", knob.key);
        }
    }

    #[test]
    #[should_panic(expected = "not Switch(true)")]
    fn a_value_of_another_kind_is_refused() {
        knob("gemm-efficiency").unwrap().set(&mut ComputeModel::default(), KnobValue::Switch(true));
    }
}
