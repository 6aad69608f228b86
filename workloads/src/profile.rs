//! Compute profiles: a calibrated [`ComputeModel`] for one device type, as `parasim calibrate`
//! writes it and a scenario's `[compute] profile` reads it, with the record of how it was
//! fitted; and the profiles shipped in `data/profiles/` (compiled in).
//!
//! Above [`crate::compute`] (a profile holds a model, and [`ComputeModel::builtin_for`] reads
//! the shipped ones) and below [`crate::calibrate`], which fits the models profiles hold.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::compute::{ComputeError, ComputeModel};
use crate::device::{Device, DeviceCatalog};

/// A calibrated compute model for one device type, as `parasim calibrate` writes it and a
/// scenario's `[compute] profile` reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Profile {
    /// Catalog name of the device type the traces were measured on; a scenario may use the
    /// profile only on that device.
    pub device: String,
    /// The fitted parameters.
    pub compute: ComputeModel,
    /// Where the parameters came from and how well they fit (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationRecord>,
}

/// Provenance and quality of a calibration, kept in the profile it produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CalibrationRecord {
    /// The trace files, by file name.
    pub traces: Vec<String>,
    /// The GPU as the traces name it (`deviceProperties`).
    pub trace_device: String,
    /// Operators fitted.
    pub operators: usize,
    /// Dtypes of the fitted GEMMs: the GEMM efficiency is measured on these.
    pub gemm_dtypes: Vec<String>,
    /// For each parameter, the operators whose predicted time depends on it; a parameter with
    /// few stayed near its default.
    pub support: BTreeMap<String, usize>,
    /// Parameters held at a given value instead of fitted (`parasim calibrate --hold`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held: BTreeMap<String, String>,
    /// In-sample errors of the fitted model, per class and over all.
    pub fit: Vec<ClassError>,
    /// Errors on shapes held out of the fit (5-fold cross-validation by operator shape).
    pub held_out: Vec<ClassError>,
    /// Errors of the default model on the same operators, for comparison.
    pub default_model: Vec<ClassError>,
    /// The host's launch intervals measured on the traces, which set `dispatch-overhead` (their
    /// lower quartile); absent without traces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_intervals: Option<LaunchRecord>,
}

/// Launch intervals of the traces' host threads, in microseconds
/// ([`crate::dispatch::launch_intervals`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LaunchRecord {
    /// Intervals measured.
    pub intervals: usize,
    /// 10th percentile, us.
    pub p10_us: f64,
    /// Lower quartile, us: the profile's `dispatch-overhead`.
    pub p25_us: f64,
    /// Median, us.
    pub median_us: f64,
    /// Upper quartile, us.
    pub p75_us: f64,
}

/// A profile file could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// Not TOML, or a key is missing, unknown or mistyped.
    #[error("compute profile: {0}")]
    Parse(String),
    /// No built-in profile has the name.
    #[error("no built-in compute profile `{name}`; built-in profiles: {known}")]
    UnknownBuiltin {
        /// The name asked for.
        name: String,
        /// The names that exist.
        known: String,
    },
    /// A parameter is out of range.
    #[error("compute profile: {0}")]
    Invalid(#[from] ComputeError),
}

/// Profiles shipped with parasim (`data/profiles/`), fitted to the public traces named in them.
const BUILTIN_PROFILES: [(&str, &str); 5] = [
    ("a100-sxm4-40gb", include_str!("../../data/profiles/a100-sxm4-40gb.toml")),
    ("a100-sxm4-80gb", include_str!("../../data/profiles/a100-sxm4-80gb.toml")),
    ("v100-sxm2-16gb", include_str!("../../data/profiles/v100-sxm2-16gb.toml")),
    ("p100-pcie-16gb", include_str!("../../data/profiles/p100-pcie-16gb.toml")),
    ("h200-sxm-141gb", include_str!("../../data/profiles/h200-sxm-141gb.toml")),
];

impl Profile {
    /// Reads a profile in the format [`Profile::to_toml`] writes, and checks its parameters.
    pub fn from_toml_str(text: &str) -> Result<Profile, ProfileError> {
        let profile: Profile = toml::from_str(text).map_err(|e| ProfileError::Parse(e.to_string()))?;
        profile.compute.validate()?;
        Ok(profile)
    }

    /// The built-in profile of a device type, by the device's catalog name: its own, or that
    /// of a device that computes exactly like it ([`Device::same_compute`]).
    pub fn builtin(name: &str) -> Result<Profile, ProfileError> {
        let catalog = DeviceCatalog::builtin();
        let same = |profile: &str| match (catalog.get(profile), catalog.get(name)) {
            (Ok(a), Ok(b)) => a.same_compute(b),
            _ => false,
        };
        let found = BUILTIN_PROFILES
            .iter()
            .find(|(n, _)| *n == name)
            .or_else(|| BUILTIN_PROFILES.iter().find(|(n, _)| same(n)));
        let Some((_, text)) = found else {
            return Err(ProfileError::UnknownBuiltin {
                name: name.to_string(),
                known: Self::builtin_names().join(", "),
            });
        };
        Self::from_toml_str(text)
    }

    /// Names of the built-in profiles.
    pub fn builtin_names() -> Vec<&'static str> {
        BUILTIN_PROFILES.iter().map(|(n, _)| *n).collect()
    }

    /// The profile as TOML, with `header` lines written first as comments.
    pub fn to_toml(&self, header: &[String]) -> Result<String, ProfileError> {
        let body = toml::to_string(self).map_err(|e| ProfileError::Parse(e.to_string()))?;
        let mut text = String::new();
        for line in header {
            text.push_str("# ");
            text.push_str(line);
            text.push('\n');
        }
        if !header.is_empty() {
            text.push('\n');
        }
        text.push_str(&body);
        Ok(text)
    }
}

impl ComputeModel {
    /// The compute model of `device`'s built-in calibrated profile, else the defaults.
    pub fn builtin_for(device: &Device) -> ComputeModel {
        Profile::builtin(&device.name).map_or_else(|_| ComputeModel::default(), |p| p.compute)
    }
}

/// How well a model predicts one class of samples (or all of them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ClassError {
    /// "gemm", "elementwise", "reduction" or "all".
    pub class: String,
    /// Samples.
    pub samples: usize,
    /// Measured time, seconds.
    pub measured_s: f64,
    /// Predicted time, seconds.
    pub predicted_s: f64,
    /// Median of |predicted / measured - 1| over the samples.
    pub median_error: f64,
    /// Sum of |predicted - measured| over the sum of measured: the error weighted by time.
    pub weighted_error: f64,
}

impl ClassError {
    /// Predicted total over measured total, minus one: the error of the class's summed time.
    pub fn total_error(&self) -> f64 {
        self.predicted_s / self.measured_s - 1.0
    }
}

#[cfg(test)]
mod tests {
    use sim_core::units::SimDuration;

    use super::*;
    use crate::compute::knobs::{KNOBS, KnobKind, KnobValue};

    #[test]
    fn builtin_profiles_parse_and_round_trip() {
        for name in Profile::builtin_names() {
            let profile = Profile::builtin(name).unwrap();
            assert_eq!(profile.device, name);
            assert!(DeviceCatalog::builtin().get(name).is_ok());
            let again = Profile::from_toml_str(&profile.to_toml(&["x".into()]).unwrap()).unwrap();
            assert_eq!(again, profile);
        }
        // A device that computes exactly like a shipped one shares its profile; one with other
        // bandwidth does not: the A100 80 GB has its own, the H100 none.
        assert_eq!(Profile::builtin("v100-sxm2-32gb").unwrap().device, "v100-sxm2-16gb");
        assert_eq!(Profile::builtin("a100-sxm4-80gb").unwrap().device, "a100-sxm4-80gb");
        assert!(Profile::builtin("h100-sxm5-80gb").is_err());
        let error = Profile::builtin("tpu-v9").unwrap_err().to_string();
        assert!(error.contains("tpu-v9") && error.contains("a100-sxm4-40gb"), "{error}");
        let error = Profile::from_toml_str("device = \"x\"\n[compute]\ngemm-efficiency = 2.0\n").unwrap_err();
        assert!(error.to_string().contains("gemm-efficiency"), "{error}");
    }

    /// Every knob, set to a value other than its default, is written into a profile's
    /// `[compute]` under its key and read back the same.
    #[test]
    fn every_knob_round_trips_through_a_profile() {
        for knob in KNOBS {
            let value = match knob.kind {
                KnobKind::Efficiency => KnobValue::Number(0.4375),
                KnobKind::Fraction => KnobValue::Number(0.25),
                KnobKind::Slowdown => KnobValue::Number(1.5),
                KnobKind::NonNegative => KnobValue::Number(3.5),
                KnobKind::Duration => KnobValue::Duration(SimDuration::from_ns(7_250)),
                KnobKind::Switch => KnobValue::Switch(true),
            };
            let mut compute = ComputeModel::default();
            assert_ne!(knob.get(&compute), value, "{}", knob.key);
            knob.set(&mut compute, value);
            let profile = Profile { device: "a100-sxm4-80gb".into(), compute, calibration: None };
            let text = profile.to_toml(&[]).unwrap();
            let written = match value {
                KnobValue::Number(number) => format!("\n{} = {number}\n", knob.key),
                KnobValue::Duration(duration) => format!("\n{} = \"{duration}\"\n", knob.key),
                KnobValue::Switch(switch) => format!("\n{} = {switch}\n", knob.key),
            };
            assert!(text.contains(&written), "{written:?} not in {text}");
            let read = Profile::from_toml_str(&text).unwrap();
            assert_eq!(knob.get(&read.compute), value, "{}", knob.key);
            assert_eq!(read, profile);
        }
    }
}
