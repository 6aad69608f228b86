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
    /// Muon (Jordan et al. 2024, "Muon: an optimizer for hidden layers in neural networks";
    /// KellerJordan/modded-nanogpt, Megatron-Core's `TensorParallelMuon`): SGD with Nesterov
    /// momentum whose update of each 2-D weight of the hidden layers is orthogonalised by
    /// Newton-Schulz iterations of matrix products ([`crate::muon`]); every other parameter
    /// (embeddings, the output layer, norms, biases) is stepped by AdamW. The state is one
    /// momentum buffer per Muon parameter and Adam's two moments for the rest.
    Muon,
}

impl Optimizer {
    /// Every optimizer, for error messages.
    pub const ALL: [Optimizer; 5] =
        [Optimizer::Sgd, Optimizer::SgdMomentum, Optimizer::Adam, Optimizer::Lars, Optimizer::Muon];

    /// The name used in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::SgdMomentum => "sgd-momentum",
            Optimizer::Adam => "adam",
            Optimizer::Lars => "lars",
            Optimizer::Muon => "muon",
        }
    }

    /// fp32 tensors read or written per parameter by one fused step (weight, gradient, state).
    pub fn tensors_touched(self) -> u64 {
        match self {
            Optimizer::Sgd => 3,
            Optimizer::SgdMomentum | Optimizer::Lars | Optimizer::Muon => 5,
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
            // The momentum update, Nesterov's look-ahead and the update: its Newton-Schulz
            // products are counted apart ([`crate::muon`]).
            Optimizer::Muon => 6.0,
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

/// The copy of the weights the optimizer updates (`workload.master-weights`), when the weights
/// the model computes with are narrower than the optimizer's precision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MasterWeights {
    /// A full copy in the optimizer's precision beside the compute weights (the default;
    /// PyTorch AMP, Megatron-LM's fp32 main parameters, Apex's `DistributedFusedAdam` with
    /// its default `store_params=True`); none when the weights are already that wide.
    #[default]
    Copy,
    /// Only the 16 low bits of each fp32 weight, beside the bf16 weight that holds its high
    /// bits: Apex's `DistributedFusedAdam(store_param_remainders=True)` ("if model is BF16 and
    /// optimizer is FP32, store bits required to reconstruct FP32 params"; NVIDIA/apex @
    /// 810ffae374 : apex/contrib/optimizers/distributed_fused_adam.py, an `int16` shard), which
    /// NeMo turns on whenever it runs that optimizer with bf16 O2 weights and fp32 states
    /// (NVIDIA/NeMo @ 070a0bb168 : nemo/collections/nlp/models/language_modeling/
    /// megatron_base_model.py, `setup_optimization`). 2 bytes per parameter.
    Remainders,
    /// No copy: the optimizer updates the compute weights in place (NeMo's
    /// `store_params=False` when the optimizer's dtype is the weights', the same source).
    InPlace,
}

impl MasterWeights {
    /// Every value, for error messages.
    pub const ALL: [MasterWeights; 3] =
        [MasterWeights::Copy, MasterWeights::Remainders, MasterWeights::InPlace];

    /// The name used in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            MasterWeights::Copy => "copy",
            MasterWeights::Remainders => "remainders",
            MasterWeights::InPlace => "in-place",
        }
    }
}

impl fmt::Display for MasterWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for MasterWeights {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        MasterWeights::ALL.into_iter().find(|o| o.name() == name).ok_or_else(|| {
            let valid: Vec<&str> = MasterWeights::ALL.iter().map(|o| o.name()).collect();
            format!("unknown master weights {name:?}; valid: {}", valid.join(", "))
        })
    }
}

/// How a training step stores its weights: what the memory model counts per parameter and
/// what the optimizer step and the parameter all-gathers move.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WeightStorage {
    /// The optimizer's copy of the weights (`workload.master-weights`).
    pub master: MasterWeights,
    /// Transformer Engine's FP8 parameters (`workload.fp8-weights`; NeMo's `fp8_params`,
    /// TE's `fp8_model_init`): the weights of the layers whose products run in FP8 are kept
    /// in FP8 only (1 byte, plus the FP8 transpose TE caches for the backward), never in
    /// bf16; the optimizer writes them in FP8 from its copy and the data-parallel parameter
    /// all-gathers move 1 byte per such weight. Only with `workload.precision = "fp8"`.
    pub fp8: bool,
}

/// The kernels a mixed-precision training step runs around the update rule (`[compute]
/// optimizer-passes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OptimizerPasses {
    /// One multi-tensor kernel reads the gradients as synchronised and writes the fp32 weights,
    /// the states and the low-precision copy of the weights (the default).
    #[default]
    Fused,
    /// Megatron-LM's `Float16OptimizerWithFloat16Params` around apex's multi-tensor `FusedAdam`
    /// (megatron/optimizer/optimizer.py and clip_grads.py, 2021 and 2022): the gradients cast
    /// to fp32 main gradients one tensor at a time (`model_param.grad.float()`), unscaled with
    /// the inf check (`torch._amp_foreach_non_finite_check_and_unscale_`), their L2 norm for
    /// `--clip-grad` (`amp_C.multi_tensor_l2norm`), the step on the fp32 gradients, and the
    /// fp32 weights copied to the fp16 model weights (`amp_C.multi_tensor_scale`). The clip's
    /// own scaling runs only when the norm exceeds the threshold, which depends on the data,
    /// and is left out. Without a low-precision copy (fp32 training, Megatron's
    /// `FP32Optimizer`) only the norm runs besides the step.
    Megatron,
    /// PyTorch's for-loop ("single-tensor") implementation of `torch.optim`, the default of
    /// SGD, Adam and AdamW on CUDA until early 2023 (pytorch/pytorch#92306, 2023-01-17, and
    /// #95862, 2023-03-02, made the multi-tensor `foreach` implementation the default, for
    /// `nn.Parameter`s only from the second): every parameter tensor runs the update rule's
    /// operators one at a time, each a kernel of its own over that tensor
    /// ([`OptimizerStep::kernels`]), and the host issues each, so a model of many small tensors
    /// steps at the host's pace. The parameters are updated in place in their own dtype: no
    /// low-precision copy is written.
    ForLoop,
}

impl OptimizerPasses {
    /// Every value, for error messages.
    pub const ALL: [OptimizerPasses; 3] =
        [OptimizerPasses::Fused, OptimizerPasses::Megatron, OptimizerPasses::ForLoop];

    /// The name used in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            OptimizerPasses::Fused => "fused",
            OptimizerPasses::Megatron => "megatron",
            OptimizerPasses::ForLoop => "for-loop",
        }
    }
}

impl fmt::Display for OptimizerPasses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for OptimizerPasses {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        OptimizerPasses::ALL.into_iter().find(|o| o.name() == name).ok_or_else(|| {
            let valid: Vec<&str> = OptimizerPasses::ALL.iter().map(|o| o.name()).collect();
            format!("unknown optimizer passes {name:?}; valid: {}", valid.join(", "))
        })
    }
}

/// How the gradients of a training step's micro-batches add up (`[compute]
/// gradient-accumulation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GradientAccumulation {
    /// Not priced: the weight-gradient kernels add into the gradient themselves (the default).
    #[default]
    InKernel,
    /// PyTorch's `AccumulateGrad` (torch/csrc/autograd/functions/accumulate_grad.h): the first
    /// micro-batch's weight gradient becomes the parameter's `.grad`; every later one is added
    /// to it in place (`variable_grad += new_grad`), an element-wise kernel that reads both and
    /// writes one gradient in the parameters' dtype. Megatron-LM's 2021 runs (fp16 parameters,
    /// no `gradient_accumulation_fusion`, which came in 2022) pay it on every micro-batch but
    /// the first.
    Add,
}

impl GradientAccumulation {
    /// Every value, for error messages.
    pub const ALL: [GradientAccumulation; 2] = [GradientAccumulation::InKernel, GradientAccumulation::Add];

    /// The name used in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            GradientAccumulation::InKernel => "in-kernel",
            GradientAccumulation::Add => "add",
        }
    }
}

impl fmt::Display for GradientAccumulation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for GradientAccumulation {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        GradientAccumulation::ALL.into_iter().find(|o| o.name() == name).ok_or_else(|| {
            let valid: Vec<&str> = GradientAccumulation::ALL.iter().map(|o| o.name()).collect();
            format!("unknown gradient accumulation {name:?}; valid: {}", valid.join(", "))
        })
    }
}
