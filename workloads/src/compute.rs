//! The roofline compute model: how long one kernel takes on one device.
//!
//! `time = max(flops / (peak(dtype) * efficiency(class)), bytes / (memory_bandwidth *
//! memory_efficiency)) + launch_overhead`.

use serde::{Deserialize, Serialize};
use sim_core::units::{SimDuration, TimeOverflow, UnitError};

use crate::device::{Device, DeviceError, Dtype};
use crate::layer::{Layer, OpClass, Pass};

/// A kernel's time could not be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ComputeError {
    /// An efficiency is outside (0, 1].
    #[error("compute model: `{parameter}` is {value}; it must be greater than 0 and at most 1")]
    InvalidEfficiency {
        /// The parameter's name as written in scenario files.
        parameter: &'static str,
        /// The value given.
        value: String,
    },
    /// A FLOP or byte count is negative or not a number.
    #[error("compute model: {quantity} is {value}; it must be a finite number, not negative")]
    InvalidWork {
        /// `"flops"` or `"bytes"`.
        quantity: &'static str,
        /// The value given.
        value: String,
    },
    /// The device has no peak rate for the dtype.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The time is not a representable duration.
    #[error("compute model: {0}")]
    Duration(UnitError),
    /// The time plus the launch overhead is past the longest representable duration.
    #[error("compute model: {0}")]
    Overflow(TimeOverflow),
}

/// Roofline parameters: the fraction of peak compute and memory bandwidth kernels reach, and
/// the fixed cost of launching one.
///
/// The defaults (60% of peak FLOP/s, 70% of peak memory bandwidth, 4 us per kernel) are
/// assumptions, not measurements: they stand until calibration from real traces (a later
/// issue) replaces them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct ComputeModel {
    /// Fraction of the device's peak FLOP/s that kernels reach, in (0, 1]. Applied to every
    /// [`OpClass`]: element-wise and reduction kernels are memory-bound, so for them the
    /// memory term decides and this value rarely matters.
    pub gemm_efficiency: f64,
    /// Fraction of the device's peak memory bandwidth that kernels reach, in (0, 1].
    pub memory_efficiency: f64,
    /// Fixed time added to every kernel (launch and scheduling).
    pub launch_overhead: SimDuration,
}

impl Default for ComputeModel {
    /// Assumed values until calibration lands: 0.6, 0.7 and 4 us.
    fn default() -> Self {
        ComputeModel {
            gemm_efficiency: 0.6,
            memory_efficiency: 0.7,
            launch_overhead: SimDuration::from_us(4),
        }
    }
}

impl ComputeModel {
    /// Checks that both efficiencies are in (0, 1].
    pub fn validate(&self) -> Result<(), ComputeError> {
        for (parameter, value) in
            [("gemm-efficiency", self.gemm_efficiency), ("memory-efficiency", self.memory_efficiency)]
        {
            // Written so that NaN fails too.
            if !(value > 0.0 && value <= 1.0) {
                return Err(ComputeError::InvalidEfficiency { parameter, value: value.to_string() });
            }
        }
        Ok(())
    }

    /// The compute efficiency applied to kernels of `class`.
    pub fn compute_efficiency(&self, class: OpClass) -> f64 {
        match class {
            OpClass::Gemm | OpClass::Elementwise | OpClass::Reduction => self.gemm_efficiency,
        }
    }

    /// Time of one kernel doing `flops` FLOPs and moving `bytes` bytes of device memory on
    /// `device` in `dtype`: the slower of its compute and memory times, plus the launch
    /// overhead, rounded to the nearest picosecond.
    pub fn duration(
        &self,
        device: &Device,
        dtype: Dtype,
        flops: f64,
        bytes: f64,
        class: OpClass,
    ) -> Result<SimDuration, ComputeError> {
        self.validate()?;
        for (quantity, value) in [("flops", flops), ("bytes", bytes)] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(ComputeError::InvalidWork { quantity, value: value.to_string() });
            }
        }
        let peak = device.peak(dtype)?.per_second() * self.compute_efficiency(class);
        let bandwidth = device.memory_bandwidth.bytes_per_second() * self.memory_efficiency;
        let seconds = (flops / peak).max(bytes / bandwidth);
        SimDuration::from_secs_f64(seconds)
            .map_err(ComputeError::Duration)?
            .checked_add(self.launch_overhead)
            .map_err(ComputeError::Overflow)
    }

    /// Time of `pass` of `layer` for `batch` samples on `device` in `dtype`.
    pub fn layer_duration(
        &self,
        device: &Device,
        dtype: Dtype,
        layer: &Layer,
        pass: Pass,
        batch: u64,
    ) -> Result<SimDuration, ComputeError> {
        let cost = &layer.cost;
        self.duration(device, dtype, cost.flops(pass, batch), cost.bytes(pass, batch, dtype), cost.class)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceCatalog;

    fn a100() -> &'static Device {
        DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap()
    }

    #[test]
    fn a_big_gemm_is_compute_bound() {
        let model = ComputeModel::default();
        // 8192^3 matrix product in fp16: 1.1 TFLOP over 3 x 128 MiB.
        let n = 8192.0_f64;
        let flops = 2.0 * n * n * n;
        let bytes = 3.0 * n * n * 2.0;
        let time = model.duration(a100(), Dtype::Fp16, flops, bytes, OpClass::Gemm).unwrap();
        let expected_ps = (flops / (312e12 * 0.6) + 4e-6) * 1e12;
        assert!((time.as_ps() as f64 - expected_ps).abs() <= 1.0, "{time} vs {expected_ps} ps");
        let memory_ps = bytes / (2039e9 * 0.7) * 1e12;
        assert!(expected_ps > 10.0 * memory_ps);
    }

    #[test]
    fn an_elementwise_op_is_memory_bound() {
        let model = ComputeModel::default();
        // ReLU over 64M fp16 elements: read and write.
        let elements = 64.0 * 1024.0 * 1024.0;
        let bytes = 2.0 * elements * 2.0;
        let time = model.duration(a100(), Dtype::Fp16, elements, bytes, OpClass::Elementwise).unwrap();
        let expected_ps = (bytes / (2039e9 * 0.7) + 4e-6) * 1e12;
        assert!((time.as_ps() as f64 - expected_ps).abs() <= 1.0, "{time} vs {expected_ps} ps");
    }

    #[test]
    fn fp16_gemms_are_faster_than_fp32_on_a100() {
        let model = ComputeModel::default();
        let flops = 1e12;
        let half = model.duration(a100(), Dtype::Fp16, flops, 1e8, OpClass::Gemm).unwrap();
        let single = model.duration(a100(), Dtype::Fp32, flops, 2e8, OpClass::Gemm).unwrap();
        assert!(half < single, "{half} vs {single}");
    }

    #[test]
    fn empty_kernels_cost_the_launch_overhead() {
        let model = ComputeModel::default();
        let time = model.duration(a100(), Dtype::Fp32, 0.0, 0.0, OpClass::Elementwise).unwrap();
        assert_eq!(time, SimDuration::from_us(4));
    }

    #[test]
    fn invalid_parameters_and_missing_dtypes_are_errors() {
        let device = a100();
        for (gemm, memory) in [(0.0, 0.7), (1.5, 0.7), (0.6, -0.1), (0.6, f64::NAN)] {
            let model =
                ComputeModel { gemm_efficiency: gemm, memory_efficiency: memory, ..Default::default() };
            let error = model.duration(device, Dtype::Fp16, 1.0, 1.0, OpClass::Gemm).unwrap_err();
            assert!(matches!(error, ComputeError::InvalidEfficiency { .. }), "{error}");
            assert!(error.to_string().contains("at most 1"), "{error}");
        }
        let model = ComputeModel::default();
        let error = model.duration(device, Dtype::Fp8, 1.0, 1.0, OpClass::Gemm).unwrap_err().to_string();
        assert!(
            error.contains("a100-sxm4-80gb") && error.contains("fp8") && error.contains("bf16"),
            "{error}"
        );
        let error = model.duration(device, Dtype::Fp16, -1.0, 1.0, OpClass::Gemm).unwrap_err().to_string();
        assert!(error.contains("flops"), "{error}");
        assert!(model.duration(device, Dtype::Fp16, 1e40, 0.0, OpClass::Gemm).is_err());
    }

    #[test]
    fn layer_durations_use_the_layer_cost() {
        let model = ComputeModel::default();
        let resnet = crate::zoo::resnet50();
        let conv = resnet.layer("layer3.0.conv2").unwrap();
        let forward = model.layer_duration(a100(), Dtype::Fp16, conv, Pass::Forward, 256).unwrap();
        let direct = model
            .duration(
                a100(),
                Dtype::Fp16,
                conv.cost.flops(Pass::Forward, 256),
                conv.cost.forward_bytes(256, Dtype::Fp16),
                OpClass::Gemm,
            )
            .unwrap();
        assert_eq!(forward, direct);
    }

    #[test]
    fn scenario_files_can_override_parameters() {
        let model: ComputeModel =
            toml::from_str("gemm-efficiency = 0.5\nlaunch-overhead = \"2 us\"").unwrap();
        assert_eq!(model.gemm_efficiency, 0.5);
        assert_eq!(model.memory_efficiency, 0.7);
        assert_eq!(model.launch_overhead, SimDuration::from_us(2));
        assert!(toml::from_str::<ComputeModel>("gemm-eff = 0.5").is_err());
    }
}
