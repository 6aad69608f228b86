//! The optimizer whose step ends every training iteration: its state (for the memory model)
//! and the traffic and arithmetic of one step (for the lowering).

use std::fmt;

/// The optimizer whose step ends every iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Optimizer {
    /// Plain SGD: read weight and gradient, write weight.
    Sgd,
    /// SGD with momentum (torchvision's ResNet recipe): also read and write the momentum.
    SgdMomentum,
    /// Adam / AdamW: also read and write the first and second moments.
    Adam,
    /// LARS (You et al. 2017, "Large Batch Training of Convolutional Networks") as NVIDIA's
    /// MXNet ResNet-50 runs it (`sgdwfastlars` / `sgdwfastlarsv2`, MLPerf Training v2.0-v4.0):
    /// SGD with momentum whose learning rate is scaled per layer by the ratio of the weight's
    /// norm to the gradient's, so each step first reduces every weight and every gradient to
    /// its sum of squares (`multi_sum_sq`, twice) and computes the per-layer rates
    /// (`multi_lars`), then updates. The state is one momentum buffer, as SGD with momentum
    /// ([`crate::compute::OptimizerStep::lars_norm_passes`] prices the rest).
    Lars,
}

impl Optimizer {
    /// Every optimizer, for error messages.
    pub const ALL: [Optimizer; 4] =
        [Optimizer::Sgd, Optimizer::SgdMomentum, Optimizer::Adam, Optimizer::Lars];

    /// The name used in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::SgdMomentum => "sgd-momentum",
            Optimizer::Adam => "adam",
            Optimizer::Lars => "lars",
        }
    }

    /// fp32 tensors read or written per parameter by one fused step (weight, gradient, state).
    pub fn tensors_touched(self) -> u64 {
        match self {
            Optimizer::Sgd => 3,
            Optimizer::SgdMomentum | Optimizer::Lars => 5,
            Optimizer::Adam => 7,
        }
    }

    /// Arithmetic per parameter of one step (a handful of multiply-adds; memory-bound anyway).
    pub fn flops_per_parameter(self) -> f64 {
        match self {
            Optimizer::Sgd => 2.0,
            Optimizer::SgdMomentum => 4.0,
            Optimizer::Adam => 12.0,
            // The momentum update, the trust ratio's scaling, and a square and an add for
            // each of the two norms.
            Optimizer::Lars => 9.0,
        }
    }
}

impl fmt::Display for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Optimizer {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        Optimizer::ALL.into_iter().find(|o| o.name() == name).ok_or_else(|| {
            let valid: Vec<&str> = Optimizer::ALL.iter().map(|o| o.name()).collect();
            format!("unknown optimizer {name:?}; valid: {}", valid.join(", "))
        })
    }
}
