//! parasim's workloads: what is trained, on what.
//!
//! - [`device`]: the device catalog (peak FLOP/s per dtype, memory and interconnect
//!   bandwidths), from the vendors' datasheets.
//! - [`layer`] and [`model`]: layers with shape propagation and per-sample costs (parameters,
//!   FLOPs per pass, memory traffic, saved activations), and models as layers in execution order.
//! - [`family`]: the parametric families (ResNet, VGG, Inception, U-Net, GPT/BERT/Llama, DLRM)
//!   that model files name; users' own model files (`docs/models.md`) parse with
//!   [`Model::from_toml_str`].
//! - [`zoo`]: well-known models by name (`resnet50`, `gpt3-175b`, `llama2-7b`, ...), defined by
//!   the model files in `data/models/`.
//! - [`compute`]: the roofline model with efficiency curves that turns a kernel's FLOPs and
//!   bytes into a duration (`docs/compute-model.md`); its knobs, each written once, are
//!   [`compute::knobs::KNOBS`].
//! - [`profile`]: calibrated compute models per device type, and the shipped ones;
//!   [`calibrate`] fits them to measured kernels.
//! - [`input`]: the data loader (decode rate, prefetching, per-group broadcast of the batch).
//! - [`aten`]: FLOPs, bytes, class and rate dtype of a profiled PyTorch operator, for calibration.
//! - [`memory`]: what one device holds (weights, gradients, optimizer state, activations,
//!   buffers) under a sharding, with or without recomputation, and whether it fits.
//!
//! How a model is split over a cluster and lowered to an execution graph is the `strategies`
//! crate's; scenario files, `simulate`, sweeps and the planner are the `scenario` crate's.
//! Nothing here reads a file, starts a thread or runs the engine: every function takes text or
//! values (the built-in device catalog and model zoo are compiled in).
//!
//! ```
//! use workloads::{ComputeModel, DeviceCatalog, Dtype, Pass, zoo};
//!
//! let model = zoo::by_name("resnet50")?;
//! assert_eq!(model.parameters(), 25_557_032);
//!
//! let a100 = DeviceCatalog::builtin().get("a100-sxm4-80gb")?;
//! let compute = ComputeModel::default();
//! let mut forward = 0.0;
//! for layer in &model.layers {
//!     forward += compute.layer_duration(a100, Dtype::Fp16, layer, Pass::Forward, 256)?.as_secs_f64();
//! }
//! // Roofline estimate of one forward pass of 256 images; a few tens of milliseconds.
//! assert!(forward > 0.01 && forward < 0.2, "{forward} s");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod aten;
pub mod calibrate;
pub mod compute;
pub mod deepbench;
pub mod device;
pub mod dispatch;
pub mod family;
pub mod fusion;
pub mod groupbn;
pub mod input;
pub mod kernel_shape;
pub mod layer;
pub mod lora;
pub mod memory;
pub mod model;
mod model_file;
pub mod muon;
pub mod optimizer;
pub mod profile;
pub mod zoo;

pub use compute::{ComputeError, ComputeModel, KernelWork, OptimizerStep, StepWidths};
pub use device::{Device, DeviceCatalog, DeviceError, DeviceKind, Dtype, Execution};
pub use kernel_shape::{
    AttentionShape, ConvDirection, ConvShape, GemmLayout, GemmShape, KernelShape, Major, ReductionLaunch,
    ReductionShape, THIN_GEMM_SIDE,
};
pub use layer::{
    Activation, AttentionKernel, KernelPart, KernelRole, Layer, LayerCost, LayerError, LayerKind,
    LossKernels, OpClass, Padding, Pass, Shape, Traffic, Training, UpsampleMode,
};
pub use memory::{ActivationBytes, MemoryBreakdown, MemoryError, MemoryPlan, Recompute, Sharding};
pub use model::{Model, ModelBuilder, ModelError};
pub use model_file::{FAMILIES, LAYER_KINDS};
pub use optimizer::{GradientAccumulation, MasterWeights, Optimizer, OptimizerPasses, WeightStorage};
