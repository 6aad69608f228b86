//! The compute model: how long one kernel takes on one device.
//!
//! A roofline per kernel with size-dependent efficiencies (documented with their sources in
//! `docs/compute-model.md`):
//!
//! ```text
//! time = max(flops / compute_rate, memory_time) + combine + launch_overhead
//!
//! GEMM class:              compute_rate = peak(dtype) * gemm_efficiency * a * w^g / (w^g + w_half^g)
//!                          w = flops, w_half = gemm_half_time * reference_rate(device, dtype)
//!                          g = gemm_ramp_exponent, a = 1 or unaligned_gemm_efficiency
//! element-wise, reduction: compute_rate = vector_peak(device, dtype) * vector_efficiency
//! every class:             memory_time  = bytes / (bandwidth * e_mem)
//!                                         + memory_half_time / memory_efficiency
//!                          (over unaligned_memory_efficiency for an unaligned product)
//!                          e_mem = reduction_memory_efficiency for reductions,
//!                                  memory_efficiency for the others (row-wise
//!                                  normalisations included)
//! reductions, normalisations: combine = reduction_overhead (0 for the other classes)
//! reductions with a shape:  memory_time = max(memory_time, rounds * MEMORY_LATENCY_CYCLES / clock)
//!                           rounds: PyTorch's launch of the reduction (`ReductionShape::launch`)
//! ```
//!
//! Both efficiencies rise with the work of the kernel and saturate: a large matrix product
//! reaches `gemm_efficiency` of the dtype's peak, a small one cannot fill the device (too few
//! tiles for its multiprocessors, pipeline fill and drain), and a small copy does not reach the
//! memory's bandwidth. The hyperbolic form is the same as an affine time: a GEMM costs
//! `(flops / peak + gemm_half_time * reference_rate / peak) / gemm_efficiency`, a fixed ramp plus
//! work at the saturated rate; likewise for memory.
//!
//! Mixed precision: the dtype decides the peak a GEMM runs at (fp16/bf16/fp8/tf32 on the matrix
//! units). Element-wise and reduction kernels compute in fp32 registers whatever the storage
//! dtype (as PyTorch does for half-precision tensors), so their compute rate is the device's
//! fp32 rate (fp64 for fp64 tensors); they move `dtype`-sized elements.

pub mod knobs;

use serde::{Deserialize, Serialize};
use sim_core::units::{Bandwidth, SimDuration, TimeOverflow, UnitError};

use crate::device::{CONV_VECTOR_TILES, Device, DeviceError, Dtype};
#[cfg(test)]
use crate::kernel_shape::GemmLayout;
use crate::kernel_shape::{ConvDirection, GemmShape, KernelShape, WINOGRAD_NONFUSED_TILE};
use crate::layer::{KernelPart, KernelRole, Layer, OpClass, Pass};
use crate::optimizer::{Optimizer, OptimizerPasses};

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
    /// A fraction that may be 0 is outside [0, 1].
    #[error("compute model: `{parameter}` is {value}; it must be at least 0 and at most 1")]
    InvalidFraction {
        /// The parameter's name as written in scenario files.
        parameter: &'static str,
        /// The value given.
        value: String,
    },
    /// A slowdown factor is below 1 or not finite.
    #[error(
        "compute model: `{parameter}` is {value}; it must be a finite number of at least 1 (1 is no slowdown)"
    )]
    InvalidSlowdown {
        /// The parameter's name as written in scenario files.
        parameter: &'static str,
        /// The value given.
        value: String,
    },
    /// A FLOP or byte count, or a parameter that must not be negative
    /// (`gemm-tile-half-intensity`), is negative or not a number.
    #[error("compute model: {quantity} is {value}; it must be a finite number, not negative")]
    InvalidWork {
        /// `"flops"`, `"bytes"` or the parameter's name.
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
    /// `host-synchronous` with `cuda-graphs`: a graph replays a whole step from one launch, so
    /// there is no launch between kernels to synchronize before.
    #[error(
        "compute model: `host-synchronous = true` and `cuda-graphs = true` exclude each other (a CUDA graph \
         replays the step from one launch); set one of them to false"
    )]
    SynchronousGraphs,
}

/// The work of one kernel as the compute model prices it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelWork {
    /// The kind of kernel, which decides the efficiencies that apply.
    pub class: OpClass,
    /// The dtype whose peak rate it computes at.
    pub dtype: Dtype,
    /// Floating-point operations.
    pub flops: f64,
    /// Bytes of device memory read plus written.
    pub bytes: f64,
    /// False for a product whose feature dimensions are not all multiples of 16 bytes of its
    /// elements (4 fp32, 8 fp16 or bf16 values): libraries run such shapes with
    /// narrower-vector kernels, far below the aligned rate (NVIDIA, *Matrix Multiplication
    /// Background User's Guide*, "Tensor Core Requirements"). Always true for other classes.
    pub aligned: bool,
    /// The product's shape, when known: GEMM-class kernels with a shape on a device whose
    /// catalog entry has [`crate::device::Execution`] data are priced by tile and wave
    /// quantization; others by their FLOPs.
    pub shape: KernelShape,
}

impl KernelWork {
    /// Work without a shape, priced by its FLOPs and bytes.
    pub const fn flat(class: OpClass, dtype: Dtype, flops: f64, bytes: f64) -> KernelWork {
        KernelWork { class, dtype, flops, bytes, aligned: true, shape: KernelShape::Unknown }
    }

    /// One matrix product of `shape` in `dtype`: its FLOPs, and one pass over both operands and
    /// the output.
    pub fn gemm(shape: GemmShape, dtype: Dtype) -> KernelWork {
        let GemmShape { m, n, k, .. } = shape;
        let bytes = (m * k + k * n + m * n) as f64 * dtype.bytes() as f64;
        KernelWork {
            shape: KernelShape::Gemm(shape),
            ..KernelWork::flat(OpClass::Gemm, dtype, shape.flops(), bytes)
        }
    }
}

/// The compute model's parameters: efficiency curves per operation class and the fixed cost of
/// launching a kernel. A scenario's `[compute]` table sets them (kebab-case keys, unknown keys
/// rejected); every key has the default below. [`knobs::KNOBS`] lists them, one entry per
/// field, for everything that reads, checks, fits or prints them by key.
///
/// The defaults are documented with their sources in `docs/compute-model.md`: `gemm-efficiency`
/// 0.8 is the median of the published maximum achievable matmul efficiencies of NVIDIA data
/// centre GPUs (Bekman, "Machine Learning Engineering", MAMF table: A100 SXM 85.9%, GH200 83%,
/// A100 PCIe 82.2%, H100 SXM 80.1%); the other five are assumptions informed by public
/// measurements, to be replaced by calibration against traces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct ComputeModel {
    /// Fraction of the dtype's peak FLOP/s that large GEMM-class kernels (matrix products,
    /// convolutions, attention) reach, in (0, 1]: the curve's saturation value.
    pub gemm_efficiency: f64,
    /// The same ceiling for products on a device's vector units (dtypes its catalog entry does
    /// not list under `matrix-dtypes`: fp32 SGEMM on a V100, every product on a P100), in
    /// (0, 1]. Vector and matrix units saturate differently, and a trace of one says nothing
    /// about the other. Devices without execution data use `gemm-efficiency` for all.
    pub vector_gemm_efficiency: f64,
    /// Factor on `gemm-efficiency` for products whose feature dimensions are not multiples of
    /// 16 bytes of their elements (4 fp32, 8 fp16 values; [`Layer::gemm_aligned`]), in (0, 1]:
    /// libraries run such shapes with narrower-vector kernels. 1 by default; calibration
    /// measures it on traces' unaligned products.
    pub unaligned_gemm_efficiency: f64,
    /// The rate of a thin product whose wide operand is stored contiguous along the reduction
    /// ([`GemmShape::thin_and_k_major`]: BLAS `TN` with a thin `n`), relative to the same
    /// product with that operand stored along its output side, in (0, 1], for 4-byte
    /// elements (narrower elements lose more: [`Curves::layout_rate`]). The whole kernel (its
    /// compute and its streaming) runs at this rate. 1 by default (no layout effect):
    /// DeepBench's V100 and P100 tables measure it (`TN` against `NN`) and calibration on
    /// them fits it; traces record no layouts.
    pub k_major_thin_gemm_efficiency: f64,
    /// The same for the memory side of an unaligned product other than a convolution, in
    /// (0, 1]: its memory time is divided by it. Such kernels cannot use 16-byte vector loads
    /// and stores and move their operands element by element, which lowers the bandwidth they
    /// reach (NVIDIA, "CUDA Pro Tip: Increase Performance with Vectorized Memory Access"), but
    /// not as much as their issue-bound compute: a memory-bound product and a compute-bound one
    /// lose different shares. 1 (off) by default; calibration fits it on traces' memory-bound
    /// unaligned products (docs/compute-model.md, "Results").
    pub unaligned_memory_efficiency: f64,
    /// How gradually GEMM efficiency rises with work, in (0, 1]: the efficiency at `w` FLOPs is
    /// `gemm-efficiency * w^g / (w^g + w_half^g)`. 1 is the hyperbola (10% to 90% of the
    /// ceiling over two decades of work); smaller values spread the rise over more decades, as
    /// products of many shapes do.
    pub gemm_ramp_exponent: f64,
    /// Work, expressed as time at the device's reference rate (its fp16 matrix rate, else bf16,
    /// else its fastest), at which a GEMM reaches half of `gemm_efficiency`. Zero makes the GEMM
    /// efficiency flat.
    pub gemm_half_time: SimDuration,
    /// Fraction of the device's fp32 rate (fp64 for fp64 tensors) that element-wise and
    /// reduction kernels reach, in (0, 1]. They are memory-bound on every device in the
    /// catalog, so this rarely decides a time.
    pub vector_efficiency: f64,
    /// Fraction of the device's peak memory bandwidth that large GEMM and element-wise kernels
    /// reach, in (0, 1].
    pub memory_efficiency: f64,
    /// Fraction of the peak memory bandwidth that large reduction kernels (norms, softmax,
    /// sums, pooling) reach, in (0, 1]: their rows and columns are reduced by cooperating
    /// threads, so they stream less evenly than element-wise kernels. Only the sustained rate:
    /// their ramp is everyone's, `memory_half_time / memory_efficiency`.
    pub reduction_memory_efficiency: f64,
    /// Traffic of a reduction, expressed as time at the device's peak bandwidth, at which its
    /// sustained efficiency is halfway from `reduction-memory-efficiency` to
    /// `memory-efficiency`: small reductions are starved of parallelism, large ones (a batch
    /// norm over a whole activation) stream like copies. Zero keeps every reduction at
    /// `reduction-memory-efficiency`.
    pub reduction_half_time: SimDuration,
    /// Traffic, expressed as time at the device's peak bandwidth, at which a kernel reaches half
    /// of `memory_efficiency`. Zero makes the bandwidth efficiency flat.
    pub memory_half_time: SimDuration,
    /// Share, in [0, 1], of a streaming kernel's traffic (element-wise, reduction and
    /// normalisation kernels) that its device's L2 cache serves instead of device memory, up
    /// to the L2's capacity (`[device.execution] l2-cache`): the inputs a kernel reads were
    /// written by the kernels just before it, and what of them still sits in the L2 is not
    /// read from DRAM again. `bytes - l2-hit-fraction * min(bytes, L2) * L2 / max(bytes, L2)`
    /// go through memory (beyond the L2's size the share falls: the head of a larger input was
    /// evicted first); the hits cost nothing more (the L2 streams several times faster). 0 (off) by default;
    /// calibration fits it: 0.375 on the A100 40 GB trace (40 MB L2), where element-wise kernels
    /// of 10-30 MB that ran alone streamed at 1.6 TB/s, above the 1.555 TB/s of its HBM
    /// (`docs/compute-model.md`). Devices without execution data have no L2 size: no effect.
    pub l2_hit_fraction: f64,
    /// Fixed time of a reduction's combine, added to every reduction and row-wise
    /// normalisation kernel ([`OpClass::Reduction`], [`OpClass::Normalization`]): after
    /// streaming its input, a block combines its threads' partial results through shared
    /// memory in a tree of synchronised steps (and a multi-block reduction combines the
    /// blocks' results once more), where an element-wise kernel just stores. 0 by default,
    /// so that the defaults price every kernel as before this parameter (a measured 3 us made
    /// ResNet-50's batch norms too slow); calibration fits it: 3.0 us on the V100 traces,
    /// 3.9 us on the A100 trace (`docs/compute-model.md`).
    pub reduction_overhead: SimDuration,
    /// Fixed time added to every kernel (launch and scheduling).
    pub launch_overhead: SimDuration,
    /// Operand reuse of a GEMM tile, `rows * columns / (rows + columns)` elements, at which a
    /// thread block reaches half of `gemm-efficiency`: small tiles load more operand bytes per
    /// multiply-add and keep the matrix units less busy. Used for products with a shape on
    /// devices with execution data; 0 makes every tile equally efficient.
    pub gemm_tile_half_intensity: f64,
    /// Fixed time of each wave of thread blocks of a shaped GEMM (filling the block's
    /// pipeline, writing its tile).
    pub gemm_wave_overhead: SimDuration,
    /// Factor on `gemm-efficiency` for convolutions priced by their shape, in (0, 1]: implicit
    /// GEMM gathers its operands through index arithmetic instead of streaming them.
    pub conv_efficiency: f64,
    /// Further factor for the backward-weight (wgrad) kernels of convolutions, in (0, 1]: their
    /// long reductions over batch and positions are split and summed across blocks.
    pub conv_backward_weight_efficiency: f64,
    /// Further factor for the backward-data (dgrad) kernels of convolutions, in (0, 1]: strided
    /// ones scatter into a larger input.
    pub conv_backward_data_efficiency: f64,
    /// Factor on `gemm-efficiency` for the products of a fused (flash) attention kernel priced
    /// by its shape, in (0, 1]: the rate its on-chip products and online softmax reach relative
    /// to cuBLAS's GEMMs of the same shapes. 1 by default (a flash kernel as fast as the GEMMs
    /// it replaces); a kernel of its own (llm-foundry's Triton flash attention) runs slower,
    /// which nothing public measures: only a fitted value sets it (data/validation/fitted.toml).
    pub flash_attention_efficiency: f64,
    /// How much slower a memory-bound kernel progresses while a communication kernel or copy
    /// runs on the same GPU, at least 1: a kernel of time `T` alone takes
    /// `T * communication-memory-slowdown` fully beside communication, and in proportion for a
    /// partial overlap (its rate is the inverse while communication runs). NCCL's kernels and
    /// copies stream through the same memory, so this is a property of the device (and of the
    /// communication library), not of a workload: `1 / (1 - s)` for a share `s` of the
    /// bandwidth they take. 1 (off) by default; calibration fits it from the operators that
    /// ran beside communication against those that ran alone, and the engine runs a kernel
    /// at that rate while its rank communicates
    /// ([`ComputeModel::layer_duration_beside_communication`]).
    pub communication_memory_slowdown: f64,
    /// The same for compute-bound kernels (their compute time above their memory time): NCCL's
    /// kernels hold some of the multiprocessors, `1 / (1 - s)` for a share `s` of them.
    pub communication_compute_slowdown: f64,
    /// The same for every kernel's fixed cost (`launch-overhead`): while a persistent NCCL
    /// kernel holds multiprocessors, another stream's kernel takes longer to get its blocks
    /// scheduled and drained. On the V100 traces this, not the streaming rate, is most of the
    /// slowdown of small kernels beside communication (`docs/compute-model.md`).
    pub communication_launch_slowdown: f64,
    /// Host time to issue one kernel (framework dispatch plus the CUDA launch call) in eager
    /// mode: a rank's GPU cannot start a kernel before its host thread has issued it.
    pub dispatch_overhead: SimDuration,
    /// Host time to issue each further kernel of a layer pass beyond its first (a math
    /// attention core's scale, mask, softmax and casts, a loss's kernels, a flash backward's
    /// helpers, a linear layer's bias gradient, autocast's casts: [`launched_kernels`]).
    /// `dispatch-overhead` prices the pass's first kernel, which in a framework that wraps each
    /// layer in its own module code carries the module's cost; the further kernels are the
    /// framework's ops. Equal to the built-in `dispatch-overhead` by default (the same
    /// measurement), and a host of `cluster.host` writes both.
    pub op_dispatch_overhead: SimDuration,
    /// Host time per iteration outside the per-kernel dispatch: the training loop's own work
    /// once it has synchronised with the GPU at the step's end (reading the loss and the
    /// gradient norm with `.item()`, logging, timers, the scheduler), during which the GPU has
    /// nothing queued. Paid once per iteration after the rank's last op, also under CUDA
    /// graphs (the loop is not in the graph). Zero by default: a framework or a measured job
    /// gives it.
    pub step_overhead: SimDuration,
    /// Whether kernels are replayed from a CUDA graph: the host issues a whole step at once and
    /// the per-kernel dispatch cost disappears.
    pub cuda_graphs: bool,
    /// Whether the model runs under PyTorch's `torch.autocast` over fp32 parameters (automatic
    /// mixed precision): each linear layer's forward casts its fp32 weight and bias to the
    /// compute dtype, one `aten::copy_` kernel each, and its backward casts their gradients
    /// back (`ToCopyBackward0`); a norm runs in fp32 (autocast's fp32 list), so its output is
    /// cast for the next product and that gradient back; a residual add of a half-precision
    /// branch into the fp32 stream casts the gradient for the branch. Each cast is a launch of
    /// its own ([`autocast_casts`]). The software's fact, not calibration: the kernels a PyTorch
    /// 2.11 trace of such a step shows under `aten::linear` and `ToCopyBackward0`
    /// (docs/compute-model.md, "Host dispatch"). Without effect in fp32.
    pub autocast: bool,
    /// Whether the host waits for each kernel to finish before it issues the next: every
    /// kernel (and every collective) then pays its dispatch after its predecessor's end, and a
    /// step takes the sum of `dispatch-overhead` + kernel time over its kernels
    /// ([`crate::dispatch::issue_synchronous`]). The software's fact, not calibration: a
    /// profiling hook that synchronizes after every function (Chainer's `TimerHook` records a
    /// CUDA event after each function's forward and backward and calls `synchronize()` on it,
    /// `chainer/function_hooks/timer.py`, v7.0.0), or `CUDA_LAUNCH_BLOCKING=1`, with which
    /// "kernel launches are synchronous" (CUDA Programming Guide, "CUDA Environment Variables").
    pub host_synchronous: bool,
    /// Whether the host checks the loss and the gradients for NaN and Inf as it goes, waiting
    /// for the device each time: after each micro-batch's forward it reads that micro-batch's
    /// loss, and before each gradient bucket's data-parallel reduction the bucket's norm (a
    /// device-to-host read that returns once the kernels it depends on have run); the host
    /// issues nothing more meanwhile, so the launches after it no longer run ahead of the GPU.
    /// The software's fact, not calibration: Megatron-LM's `--check-for-nan-in-loss-and-grad`
    /// (on by default) tests the loss in `pretrain_gpt.py`'s `loss_func` and each bucket's norm
    /// in `param_and_grad_buffer.py`'s `check_grads` through the rerun state machine's
    /// `validate_result`, whose `if result_rejected:` on a CUDA tensor reads it to the host
    /// (`data/frameworks.toml`, framework `megatron-core`). It matters where the host sets the
    /// pace (small, overhead-bound steps): there a pipeline's last stage waits for each
    /// micro-batch to arrive before it issues more.
    pub host_nan_checks: bool,
    /// Whether vector-unit convolutions may run as Winograd kernels (3x3, stride 1) or FFTs
    /// (2-D, stride 1), as cuDNN's benchmark mode (`cudnnFind*`: the fastest of all its
    /// algorithms) picks them when faster (PyTorch's `cudnn.benchmark = True`, DeepBench). Off by
    /// default: the frameworks' default heuristics with a small workspace (Chainer's 8 MiB)
    /// run implicit GEMM.
    pub winograd_convolutions: bool,
}

impl Default for ComputeModel {
    /// The documented defaults: GEMMs saturate at 80% of peak and reach half of it at 3 us of
    /// work, element-wise math at 50% of the fp32 rate, memory at 80% of its bandwidth with a
    /// 1 us ramp, and 4 us per kernel launch.
    fn default() -> Self {
        ComputeModel {
            gemm_efficiency: 0.8,
            vector_gemm_efficiency: 0.9,
            unaligned_gemm_efficiency: 1.0,
            k_major_thin_gemm_efficiency: 1.0,
            unaligned_memory_efficiency: 1.0,
            gemm_ramp_exponent: 1.0,
            gemm_half_time: SimDuration::from_us(3),
            vector_efficiency: 0.5,
            memory_efficiency: 0.8,
            reduction_memory_efficiency: 0.8,
            reduction_half_time: SimDuration::from_us(10),
            memory_half_time: SimDuration::from_us(1),
            l2_hit_fraction: 0.0,
            reduction_overhead: SimDuration::ZERO,
            launch_overhead: SimDuration::from_us(4),
            gemm_tile_half_intensity: 6.0,
            gemm_wave_overhead: SimDuration::from_us(2),
            conv_efficiency: 1.0,
            conv_backward_weight_efficiency: 1.0,
            conv_backward_data_efficiency: 1.0,
            flash_attention_efficiency: 1.0,
            communication_memory_slowdown: 1.0,
            communication_compute_slowdown: 1.0,
            communication_launch_slowdown: 1.0,
            dispatch_overhead: SimDuration::from_ns(DEFAULT_DISPATCH_NS),
            op_dispatch_overhead: SimDuration::from_ns(DEFAULT_DISPATCH_NS),
            step_overhead: SimDuration::ZERO,
            cuda_graphs: false,
            autocast: false,
            host_synchronous: false,
            host_nan_checks: false,
            winograd_convolutions: false,
        }
    }
}

/// Clock cycles a load from device memory takes to return: NVIDIA's CUDA C++ Best Practices
/// Guide, "Memory Instructions": "When accessing uncached local or global memory, there are 400
/// to 600 clock cycles of memory latency"; the middle of that range.
pub const MEMORY_LATENCY_CYCLES: f64 = 500.0;

/// Seconds a reduction kernel with a [`KernelShape::Reduction`] shape spends waiting on memory:
/// each thread reads its values in rounds of loads it keeps in flight and waits for each round
/// before the next ([`crate::kernel_shape::ReductionShape::launch`], from PyTorch's
/// `Reduce.cuh`), so the kernel takes at least its rounds times the memory latency
/// ([`MEMORY_LATENCY_CYCLES`] at the device's boost clock), whatever its bytes. A bias
/// gradient's sum over 1024 rows of 96 columns runs in 2 blocks of 128 threads, each thread
/// reading 128 values in 32 rounds: 10-11 us of latency on a V100 or an A100 for 393 kB. 0 for
/// other shapes and on devices without execution data.
fn dependent_load_seconds(device: &Device, shape: &KernelShape) -> f64 {
    match (shape, device.execution.as_ref()) {
        (KernelShape::Reduction(reduction), Some(execution)) if execution.boost_clock_mhz > 0.0 => {
            let rounds = reduction.launch(execution.sm_count).rounds as f64;
            rounds * MEMORY_LATENCY_CYCLES / (execution.boost_clock_mhz * 1e6)
        }
        _ => 0.0,
    }
}

/// Most slices a shaped product's reduction is split into (cuBLAS's and CUTLASS's split-K, and
/// cuDNN's backward-weight kernels), unless [`Split::Fill`] lets a product with few output
/// tiles split further.
const GEMM_MAX_SPLIT: u64 = 32;

/// How a shaped product may split its reduction over thread blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    /// Into at most this many slices (1: never split).
    UpTo(u64),
    /// Into up to [`GEMM_MAX_SPLIT`] slices, and beyond that while the output tiles times the
    /// slices so far leave multiprocessors idle: one more doubling may fill them. cuDNN 7's 2-D
    /// SIMT backward-weight kernels (`*_stridedB_splitK_*`) on a product with one or two output
    /// tiles (a first layer's `K x C·R·S` of 16-64 by 27-144): on DeepBench's V100 (80
    /// multiprocessors) these layers take 0.53-0.63 of the time 32 slices give (one 32-block
    /// wave), on the P100 (56) 0.88-0.93 of it: 32 fill most of it. Flash attention's
    /// `num_splits_heuristic` (github.com/Dao-AILab/flash-attention,
    /// `csrc/flash_attn/flash_api.cpp`) bounds its splits the same way, by the multiprocessor
    /// count over the blocks there are, and uses none once the blocks nearly fill the device.
    Fill,
}

/// Bytes of channels a matrix-unit (Tensor Core) implicit-GEMM convolution kernel takes per
/// filter tap and reduction step: its k-tile, 32 fp16 channels. CUTLASS's implicit GEMM, the
/// public form of these kernels, assumes channel and filter counts that are multiples of 32
/// elements (`media/docs/implicit_gemm_convolution.md`, "CUTLASS Convolution
/// Implementation"), and steps through the reduction one filter tap and 32 channels at a time;
/// fewer channels leave part of every step empty. With it, the forward passes of DeepBench's
/// V100 fp16 first layers (8 channels as padded by the benchmark) come out at 0.68-1.06 of their
/// measured times instead of 0.25-0.41 (docs/compute-model.md, "DeepBench").
const MATRIX_CONV_CHANNEL_BYTES: u64 = 64;

/// The convolution algorithms the model prices, as cuDNN runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConvAlgorithm {
    /// Implicit GEMM on the vector units (cuDNN's SIMT `scudnn` kernels).
    VectorImplicitGemm,
    /// Implicit GEMM on the matrix units (cuDNN 7's Tensor Core `884cudnn` kernels).
    MatrixImplicitGemm,
    /// Winograd F(4x4, 3x3) with its transforms in separate kernels, through memory
    /// (`WINOGRAD_NONFUSED`), its batch counted in groups of 16 images.
    Winograd,
    /// Winograd F(2x2, 3x3) with the data and output transforms inside the product's kernel
    /// (`WINOGRAD`).
    FusedWinograd,
    /// FFT or FFT tiling.
    Fft,
}

/// Kernels a cuDNN convolution call launches besides the one that does its arithmetic, each
/// priced at `launch-overhead` (the model's cost of a kernel without work): one-block kernels
/// that precompute the implicit GEMM's gather offsets or zero the output that split slices
/// add into, and the transforms of the fast algorithms.
/// - SIMT implicit GEMM, from a Paddle profiler listing of cuDNN convolution gradients
///   (github.com/PaddlePaddle/docs, `docs/guides/performance_improving/profiling_model.md`,
///   "Operator Summary" of `conv2d_grad`): every backward-data kernel (`*_stridedB_*`, 240
///   calls) comes with `computeOffsetsKernel` (240 calls) and `computeBOffsetsKernel`, every
///   backward-weight kernel (`*_stridedB_splitK_*`, 224 calls) with
///   `computeWgradOffsetsKernel` (224), `scalePackedTensor_kernel` (224: the weight gradient
///   scaled to zero before the slices add into it) and `computeBOffsetsKernel` (464 calls =
///   240 + 224). Each takes 2.0-3.5 us on the GPU there (2.0-2.5 us in the nvprof listings of
///   pytorch/pytorch#13412 and #51382: `computeBOffsetsKernel`,
///   `computeWgradSplitKOffsetsKernel`, `computeWgradBOffsetsKernel`). So 2 for backward-data
///   and 3 for backward-weight. Forward has none: `IMPLICIT_GEMM` (`implicit_convolve_sgemm`)
///   computes its offsets inside; only `IMPLICIT_PRECOMP_GEMM` launches a
///   `computeOffsetsKernel` first.
/// - Tensor Core implicit GEMM (cuDNN 7 on Volta, the devices whose catalog entry lists its
///   `conv-tiles`; none elsewhere): no public listing names its helpers. Backward-data gets one,
///   chosen on the half of DeepBench's V100 fp16 shapes the half-fitted profile test trains on
///   (0, 1, 2, 3 helpers: 83.8%, 85.5%, 85.1%, 83.7% with the defaults); it takes the other
///   half from 83.6% to 85.2%. Its 1x1 layers with as many input as output channels do the
///   forward's product in backward-data and take the forward's time plus 5-10 us.
/// - Winograd through memory: its three transforms (`winogradForwardData4x4`,
///   `winogradForwardFilter4x4`, `winogradForwardOutput4x4`; `winogradWgradData4x4`,
///   `winogradWgradDelta4x4`, `winogradWgradOutput4x4` for backward-weight, in the same
///   Paddle listing and public TensorFlow profiles) around its batched product.
/// - Fused Winograd: the filter transform, `generateWinogradTilesKernel` (48 calls beside 48
///   `*_scudnn_winograd_128x128_*` in the Paddle listing).
/// - FFT: the input's and the filter's transforms, `compute_gemm_pointers` and the inverse
///   transform (`fft2d_r2c_*`, `fft2d_c2r_*`) around the complex product.
pub(crate) fn conv_helper_kernels(algorithm: ConvAlgorithm, direction: ConvDirection) -> u32 {
    match (algorithm, direction) {
        (ConvAlgorithm::VectorImplicitGemm, ConvDirection::Forward) => 0,
        (ConvAlgorithm::VectorImplicitGemm, ConvDirection::BackwardData) => 2,
        (ConvAlgorithm::VectorImplicitGemm, ConvDirection::BackwardWeight) => 3,
        (ConvAlgorithm::MatrixImplicitGemm, ConvDirection::BackwardData) => 1,
        (ConvAlgorithm::MatrixImplicitGemm, ConvDirection::Forward | ConvDirection::BackwardWeight) => 0,
        (ConvAlgorithm::Winograd, _) => 3,
        (ConvAlgorithm::FusedWinograd, _) => 1,
        (ConvAlgorithm::Fft, _) => 4,
    }
}

/// Default host time per kernel, nanoseconds: the median over six real traces of their launch
/// intervals' lower quartile (`docs/compute-model.md`, "Host dispatch"; checked by a test).
pub const DEFAULT_DISPATCH_NS: u64 = 18_500;

impl ComputeModel {
    /// The rate at which `device` copies a buffer within its own memory under this model: its
    /// memory bandwidth times [`ComputeModel::memory_efficiency`], the share large memory-bound
    /// kernels reach (a copy of `b` bytes moves `2b` through memory). What NCCL's kernels
    /// copy without crossing a link goes at this rate
    /// (`sim_core::nccl::overhead::ring_copy_time`), as does nccl-tests' one-rank allreduce.
    pub fn device_copy(&self, device: &Device) -> Option<Bandwidth> {
        let rate = device.memory_bandwidth.bytes_per_second() * self.memory_efficiency;
        Bandwidth::from_bytes_per_second(rate.round() as u64)
    }

    /// Checks every knob's value against its range ([`knobs::KNOBS`], kind by kind in the
    /// order of [`knobs::KnobKind::CHECKED`]), and that `host-synchronous` and `cuda-graphs` are
    /// not both on.
    pub fn validate(&self) -> Result<(), ComputeError> {
        for kind in knobs::KnobKind::CHECKED {
            for knob in knobs::KNOBS.iter().filter(|knob| knob.kind == kind) {
                knob.check(knob.get(self))?;
            }
        }
        if self.host_synchronous && self.cuda_graphs {
            return Err(ComputeError::SynchronousGraphs);
        }
        Ok(())
    }

    /// The saturated compute efficiency of kernels of `class`: `gemm_efficiency` for GEMMs,
    /// `vector_efficiency` (of the fp32 rate) for the others.
    pub fn compute_efficiency(&self, class: OpClass) -> f64 {
        match class {
            OpClass::Gemm => self.gemm_efficiency,
            OpClass::Elementwise | OpClass::Reduction | OpClass::Normalization => self.vector_efficiency,
        }
    }

    /// The rate that sets the GEMM curve's scale for `dtype` products on `device`. Products in
    /// a matrix-unit dtype (tf32, fp16, bf16, fp8) share the device's fp16 matrix rate (else
    /// bf16, else its fastest): the same tiles fill the device whatever units multiply them.
    /// fp32 and fp64 products run on their own units (SIMT cores, fp64 pipes), which fill with
    /// fewer FLOPs: their own peak sets the scale. A bigger device needs more work to fill;
    /// tying the half-saturation work to these rates says so with one parameter for all.
    pub fn reference_rate(device: &Device, dtype: Dtype) -> f64 {
        if matches!(dtype, Dtype::Fp32 | Dtype::Fp64)
            && let Some(rate) = device.peak.get(&dtype)
        {
            return rate.per_second();
        }
        device
            .peak
            .get(&Dtype::Fp16)
            .or_else(|| device.peak.get(&Dtype::Bf16))
            .copied()
            .or_else(|| device.fastest_peak())
            .map_or(0.0, |rate| rate.per_second())
    }

    /// FLOPs at which a `dtype` GEMM on `device` reaches half of `gemm_efficiency`.
    pub fn gemm_half_work(&self, device: &Device, dtype: Dtype) -> f64 {
        self.gemm_half_time.as_secs_f64() * Self::reference_rate(device, dtype)
    }

    /// Fraction of the dtype's peak an aligned `dtype` GEMM of `flops` FLOPs reaches on
    /// `device`: `gemm_efficiency * w^g / (w^g + gemm_half_work^g)`, g the ramp exponent. Never
    /// decreases with `flops`.
    pub fn gemm_efficiency_at(&self, device: &Device, dtype: Dtype, flops: f64) -> f64 {
        let half = self.gemm_half_work(device, dtype);
        if half <= 0.0 {
            return self.curves().gemm_ceiling(device, dtype);
        }
        let g = self.gemm_ramp_exponent;
        self.curves().gemm_ceiling(device, dtype) * flops.powf(g) / (flops.powf(g) + half.powf(g))
    }

    /// Bytes at which a kernel on `device` reaches half of `memory_efficiency`.
    pub fn memory_half_bytes(&self, device: &Device) -> f64 {
        self.memory_half_time.as_secs_f64() * device.memory_bandwidth.bytes_per_second()
    }

    /// Fraction of the peak bandwidth a GEMM or element-wise kernel moving `bytes` reaches on
    /// `device`: `memory_efficiency * bytes / (bytes + memory_half_bytes)`. Never decreases.
    pub fn memory_efficiency_at(&self, device: &Device, bytes: f64) -> f64 {
        let half = self.memory_half_bytes(device);
        if half <= 0.0 {
            return self.memory_efficiency;
        }
        self.memory_efficiency * bytes / (bytes + half)
    }

    /// The model's curves in seconds, for arithmetic that must not round to picoseconds
    /// (calibration differentiates through them).
    pub(crate) fn curves(&self) -> Curves {
        Curves {
            gemm_efficiency: self.gemm_efficiency,
            vector_gemm_efficiency: self.vector_gemm_efficiency,
            unaligned_gemm_efficiency: self.unaligned_gemm_efficiency,
            k_major_thin_gemm_efficiency: self.k_major_thin_gemm_efficiency,
            unaligned_memory_efficiency: self.unaligned_memory_efficiency,
            gemm_ramp_exponent: self.gemm_ramp_exponent,
            gemm_half_s: self.gemm_half_time.as_secs_f64(),
            vector_efficiency: self.vector_efficiency,
            memory_efficiency: self.memory_efficiency,
            reduction_memory_efficiency: self.reduction_memory_efficiency,
            memory_half_s: self.memory_half_time.as_secs_f64(),
            l2_hit_fraction: self.l2_hit_fraction,
            reduction_half_s: self.reduction_half_time.as_secs_f64(),
            reduction_overhead_s: self.reduction_overhead.as_secs_f64(),
            tile_half_intensity: self.gemm_tile_half_intensity,
            wave_overhead_s: self.gemm_wave_overhead.as_secs_f64(),
            conv_efficiency: self.conv_efficiency,
            conv_backward_weight_efficiency: self.conv_backward_weight_efficiency,
            conv_backward_data_efficiency: self.conv_backward_data_efficiency,
            flash_attention_efficiency: self.flash_attention_efficiency,
            winograd: self.winograd_convolutions,
            launch_s: self.launch_overhead.as_secs_f64(),
        }
    }

    /// Host time to issue one kernel: `dispatch-overhead`, or nothing under CUDA graphs.
    pub fn host_cost_per_kernel(&self) -> SimDuration {
        if self.cuda_graphs { SimDuration::ZERO } else { self.dispatch_overhead }
    }

    /// Host time to issue each further kernel of a layer pass: `op-dispatch-overhead`, or
    /// nothing under CUDA graphs.
    pub fn host_cost_per_op(&self) -> SimDuration {
        if self.cuda_graphs { SimDuration::ZERO } else { self.op_dispatch_overhead }
    }

    /// Seconds of one kernel without the launch overhead: the slower of its compute and memory
    /// sides (unrounded).
    pub fn kernel_seconds(&self, device: &Device, work: &KernelWork) -> Result<f64, ComputeError> {
        self.curves().kernel_seconds(device, work)
    }

    /// Whether kernels run slower beside communication: a slowdown is above 1.
    pub fn slows_beside_communication(&self) -> bool {
        self.communication_memory_slowdown > 1.0
            || self.communication_compute_slowdown > 1.0
            || self.communication_launch_slowdown > 1.0
    }

    /// The time of one kernel doing `work` (as [`ComputeModel::work_duration`] prices it) fully
    /// beside communication on its GPU: its work slowed by `communication-memory-slowdown` if
    /// it is bound by memory (its memory time at least its compute time), by
    /// `communication-compute-slowdown` otherwise, and its launch overhead by
    /// `communication-launch-slowdown`. The executor runs a kernel at
    /// `alone / beside` of its own rate while communication runs.
    pub fn beside_communication_seconds(
        &self,
        device: &Device,
        work: &KernelWork,
    ) -> Result<f64, ComputeError> {
        let curves = self.curves();
        let seconds = curves.kernel_seconds(device, work)?;
        let slowdown = if curves.bound_by_memory(device, work)? {
            self.communication_memory_slowdown
        } else {
            self.communication_compute_slowdown
        };
        Ok(seconds * slowdown + self.launch_overhead.as_secs_f64() * self.communication_launch_slowdown)
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
        self.work_duration(device, &KernelWork::flat(class, dtype, flops, bytes))
    }

    /// [`ComputeModel::duration`] of a kernel's work, which may be a product off the 16-byte
    /// grid.
    pub fn work_duration(&self, device: &Device, work: &KernelWork) -> Result<SimDuration, ComputeError> {
        self.validate()?;
        self.validated_work_duration(device, work)
    }

    /// [`ComputeModel::work_duration`] of a model already validated (a layer checks it once for
    /// all its kernels).
    fn validated_work_duration(
        &self,
        device: &Device,
        work: &KernelWork,
    ) -> Result<SimDuration, ComputeError> {
        for (quantity, value) in [("flops", work.flops), ("bytes", work.bytes)] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(ComputeError::InvalidWork { quantity, value: value.to_string() });
            }
        }
        let seconds = self.kernel_seconds(device, work)?;
        SimDuration::from_secs_f64(seconds)
            .map_err(ComputeError::Duration)?
            .checked_add(self.launch_overhead)
            .map_err(ComputeError::Overflow)
    }

    /// Time of `pass` of `layer` for `batch` samples on `device` in `dtype`: the sum of its
    /// kernels ([`Layer::kernels`]: one, or a standard attention core's products, softmax and
    /// dropout), each with its launch overhead. Matrix-product kernels are priced by their
    /// shape ([`KernelShape::of_layer`]) where the device has execution data; one whose
    /// feature dimensions are off the 16-byte grid ([`Layer::gemm_aligned`]) runs at
    /// `unaligned-gemm-efficiency`. A pass without work takes no time.
    pub fn layer_duration(
        &self,
        device: &Device,
        dtype: Dtype,
        layer: &Layer,
        pass: Pass,
        batch: u64,
    ) -> Result<SimDuration, ComputeError> {
        self.validate()?;
        let mut total = SimDuration::ZERO;
        for work in layer_kernel_works(layer, pass, batch, dtype, self.autocast) {
            total = total
                .checked_add(self.validated_work_duration(device, &work)?)
                .map_err(ComputeError::Overflow)?;
        }
        Ok(total)
    }

    /// Bytes of device memory `pass` of `layer` reads and writes for `batch` samples in
    /// `dtype`, as [`ComputeModel::layer_duration`] prices them: the sum over the same kernels
    /// (fp8's and autocast's casts included), each kernel's traffic in its own dtype. The
    /// memory side of a roofline (`parasim run --csv`'s `bytes` column).
    pub fn layer_bytes(&self, layer: &Layer, pass: Pass, batch: u64, dtype: Dtype) -> f64 {
        layer_kernel_works(layer, pass, batch, dtype, self.autocast).iter().map(|work| work.bytes).sum()
    }

    /// [`ComputeModel::layer_duration`] fully beside communication: each of the layer's
    /// kernels at [`ComputeModel::beside_communication_seconds`]. The lowering gives it to the
    /// engine, which runs a kernel at that rate while its rank communicates.
    pub fn layer_duration_beside_communication(
        &self,
        device: &Device,
        dtype: Dtype,
        layer: &Layer,
        pass: Pass,
        batch: u64,
    ) -> Result<SimDuration, ComputeError> {
        self.validate()?;
        let mut seconds = 0.0;
        for work in layer_kernel_works(layer, pass, batch, dtype, self.autocast) {
            seconds += self.beside_communication_seconds(device, &work)?;
        }
        SimDuration::from_secs_f64(seconds).map_err(ComputeError::Duration)
    }
}

/// The work of each kernel of `pass` of `layer` for `batch` samples in `dtype`
/// ([`Layer::kernels`]); a pass without kernels is one kernel without work (it still pays a
/// launch when asked for). In fp8 ([`Dtype::storage`], [`fp8_linear`]) only a linear layer's
/// matrix products run in fp8, after the cast of their inputs ([`fp8_cast_works`]); every
/// other kernel runs in bf16. Under `autocast` in half precision, [`autocast_cast_works`] come
/// first.
fn layer_kernel_works(
    layer: &Layer,
    pass: Pass,
    batch: u64,
    dtype: Dtype,
    autocast: bool,
) -> Vec<KernelWork> {
    let storage = dtype.storage();
    let fp8_products = dtype == Dtype::Fp8 && fp8_linear(layer);
    // A cast to fp32 (or back) does not run when the compute dtype is fp32 already.
    let kernels: Vec<KernelPart> = layer
        .kernels(pass)
        .into_iter()
        .filter(|part| {
            !(matches!(part.role, KernelRole::LossCast | KernelRole::AttentionCast) && storage == Dtype::Fp32)
        })
        .collect();
    if kernels.is_empty() {
        return vec![KernelWork::flat(layer.cost.class, storage, 0.0, 0.0)];
    }
    let mut works = if fp8_products { fp8_cast_works(layer, pass, batch) } else { Vec::new() };
    if autocast {
        works.extend(autocast_cast_works(layer, pass, batch, dtype));
    }
    works.extend(kernels.into_iter().map(|part| {
        // An fp32 part of a loss ([`KernelPart::fp32_traffic`]) keeps the compute dtype: its
        // bytes count 4 per fp32 element, and element-wise and reduction kernels compute at
        // the device's fp32 rate whatever their dtype.
        let gemm = part.class == OpClass::Gemm;
        let dtype = if gemm && fp8_products { Dtype::Fp8 } else { storage };
        KernelWork {
            class: part.class,
            dtype,
            flops: part.flops * batch as f64,
            bytes: part.bytes(batch, dtype),
            aligned: !gemm || layer.gemm_aligned(dtype),
            shape: if gemm { KernelShape::of_layer(layer, pass, batch) } else { KernelShape::Unknown },
        }
    }));
    works
}

/// The kernels eager PyTorch launches for `pass` of `layer` in `dtype` (each a host launch):
/// the kernels parasim prices (those [`ComputeModel::layer_duration`] sums: a standard or math
/// attention core's parts, a loss's kernels, fp8's and autocast's casts), with an attention
/// core's products as the separate matrix products they are (`Q K^T` and `P V` forward, four
/// gradient products backward; a flash core's backward is its three kernels,
/// [`Layer::kernels`]), and a biased linear layer's weight-gradient pass with its bias
/// gradient's reduction (`AddmmBackward0`: `mm` and `sum`). At least 1. Only the host's
/// launches count the bias reduction: its GPU time is not priced.
pub fn launched_kernels(layer: &Layer, pass: Pass, dtype: Dtype, autocast: bool) -> u32 {
    use crate::layer::LayerKind;
    let priced = layer_kernel_works(layer, pass, 1, dtype, autocast).len();
    let products =
        layer.kernels(pass).iter().filter(|part| part.role == KernelRole::AttentionProducts).count();
    let extra = match (&layer.kind, pass) {
        (
            LayerKind::Linear { bias: true, .. } | LayerKind::TiedLinear { bias: true, .. },
            Pass::BackwardWeight,
        ) => 1,
        // A LoRA adapter's pass is two products (and forward the add, backward-data the add
        // into the input gradient): priced as one kernel, launched as its three or two.
        (LayerKind::LoraAdapter { .. }, Pass::Forward | Pass::BackwardData) => 2,
        (LayerKind::LoraAdapter { .. }, Pass::BackwardWeight) => 1,
        _ => 0,
    };
    // Each products part is 2 kernels forward and 4 backward: 1 and 3 more.
    let per_products = if pass == Pass::Forward { 1 } else { 3 };
    u32::try_from(priced + products * per_products + extra).unwrap_or(u32::MAX).max(1)
}

/// Bytes per element of one of autocast's casts between fp32 and a half-precision dtype: it
/// reads one and writes the other (4 + 2).
pub const AUTOCAST_CAST_BYTES: u64 = 6;

/// The elements of each cast `torch.autocast` runs around `pass` of `layer` over fp32
/// parameters ([`ComputeModel::autocast`]), one kernel each, as a PyTorch 2.11 trace shows them:
/// a linear layer casts its weight and its bias to the compute dtype in the forward
/// (`aten::linear > aten::copy_`) and their gradients back in the weight-gradient pass
/// (`ToCopyBackward0`); a norm, which autocast runs in fp32, has its output cast to the compute
/// dtype in the forward and that gradient cast back in the backward; a residual add of a
/// half-precision branch into the fp32 stream casts the gradient for the branch
/// (`AddBackward0 > aten::copy_`). Nothing in fp32 (no cast runs) or for other layers.
pub fn autocast_casts(layer: &Layer, pass: Pass, dtype: Dtype) -> Vec<u64> {
    use crate::layer::LayerKind;
    if dtype.storage() == Dtype::Fp32 || dtype.storage() == Dtype::Fp64 {
        return Vec::new();
    }
    match (&layer.kind, pass) {
        (LayerKind::Linear { out_features, bias }, Pass::Forward | Pass::BackwardWeight) => {
            let biases = if *bias { *out_features } else { 0 };
            let weights = layer.cost.params.saturating_sub(biases);
            [weights, biases].into_iter().filter(|&elements| elements > 0).collect()
        }
        (LayerKind::LayerNorm { .. } | LayerKind::RmsNorm, Pass::Forward | Pass::BackwardData) => {
            vec![layer.output.elements()]
        }
        (LayerKind::Add, Pass::BackwardData) => vec![layer.output.elements()],
        _ => Vec::new(),
    }
}

/// The kernels of [`autocast_casts`] for `batch` samples: element-wise, [`AUTOCAST_CAST_BYTES`]
/// per element; a parameter's cast is once per pass whatever the batch.
pub fn autocast_cast_works(layer: &Layer, pass: Pass, batch: u64, dtype: Dtype) -> Vec<KernelWork> {
    let per_sample = !matches!(layer.kind, crate::layer::LayerKind::Linear { .. });
    autocast_casts(layer, pass, dtype)
        .into_iter()
        .map(|elements| {
            let elements = if per_sample { elements.saturating_mul(batch) } else { elements };
            let bytes = elements.saturating_mul(AUTOCAST_CAST_BYTES) as f64;
            KernelWork::flat(OpClass::Elementwise, dtype.storage(), 0.0, bytes)
        })
        .collect()
}

/// Whether `layer`'s matrix products run in fp8 when the model trains in fp8: a linear layer
/// inside a numbered block (a transformer layer's QKV, projection and MLP products). Transformer
/// Engine's `fp8_autocast` covers the modules Megatron-Core builds from TE layers (the
/// transformer blocks); the embedding, the output layer (a plain
/// `tensor_parallel.ColumnParallelLinear`), attention's own products, normalisations,
/// activations and the loss stay bf16 (docs/compute-model.md, "FP8 training").
pub fn fp8_linear(layer: &Layer) -> bool {
    matches!(layer.kind, crate::layer::LayerKind::Linear { .. })
        && crate::model::structure::block_of(&layer.name).is_some()
}

/// Bytes per element of Transformer Engine's fused cast-transpose of one bf16 tensor to fp8:
/// it reads the bf16 element (2 bytes) and writes it in fp8 twice, as is and transposed (1 + 1)
/// (`fp8_cast_transpose_fused`; the amax of the tensor is reduced in the same kernel).
pub const FP8_CAST_TRANSPOSE_BYTES: u64 = 4;

/// The memory-bound kernels Transformer Engine runs around an fp8 linear layer's products in
/// `pass` for `batch` samples (TransformerEngine v1.8, transformer_engine/pytorch/module/
/// linear.py): the forward casts its bf16 input to fp8 and its transpose (the transpose feeds
/// the weight-gradient product); the backward-data pass casts the output gradient the same way
/// (`grad_output_preprocess`: fp8 for the data-gradient product, its transpose for the
/// weight-gradient one). The weight-gradient pass reuses both. Each is one element-wise kernel
/// moving [`FP8_CAST_TRANSPOSE_BYTES`] per element. The weights' fp8 copies are cast once per
/// iteration, not per micro-batch ([`fp8_weight_cast_bytes`]).
pub fn fp8_cast_works(layer: &Layer, pass: Pass, batch: u64) -> Vec<KernelWork> {
    let elements = match pass {
        Pass::Forward => layer.input.elements(),
        Pass::BackwardData => layer.output.elements(),
        Pass::BackwardWeight => return Vec::new(),
    };
    let bytes = (elements.saturating_mul(batch).saturating_mul(FP8_CAST_TRANSPOSE_BYTES)) as f64;
    vec![KernelWork::flat(OpClass::Elementwise, Dtype::Bf16, 0.0, bytes)]
}

/// Bytes the per-iteration fp8 copy of `layer`'s weights moves when it runs in fp8
/// ([`fp8_linear`]): Transformer Engine casts the bf16 weight to fp8 and its transpose on the
/// first micro-batch of each iteration and keeps them for the others (`is_first_microbatch`,
/// `get_fp8_workspace` with `cache_name = "weight"`), [`FP8_CAST_TRANSPOSE_BYTES`] per
/// parameter; 0 for a layer that does not. With FP8 parameters (`fp8_weights`) the weight
/// already is FP8 (the optimizer writes it so): only its transpose is made, reading and
/// writing one byte per parameter. Frozen weights ([`crate::layer::Training`]) in bf16 are
/// cast like trained ones (the module does not know they are frozen); frozen FP8 parameters
/// are never written, so their transpose, made once, stays valid: nothing per iteration.
pub fn fp8_weight_cast_bytes(layer: &Layer, dtype: Dtype, fp8_weights: bool) -> u64 {
    if dtype == Dtype::Fp8 && fp8_linear(layer) {
        let per_parameter = if fp8_weights { 2 } else { FP8_CAST_TRANSPOSE_BYTES };
        let frozen = if fp8_weights { 0 } else { layer.frozen_weights() };
        (layer.cost.params + frozen).saturating_mul(per_parameter)
    } else {
        0
    }
}

/// The optimizer step of one rank: memory-bound element-wise kernels over the parameters it
/// holds (all of them, or its ZeRO shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptimizerStep {
    /// The update rule.
    pub optimizer: Optimizer,
    /// Parameters this rank updates.
    pub parameters: u64,
    /// Parameter tensors they are split into (weights and biases of each layer).
    pub tensors: u64,
    /// One multi-tensor kernel over every parameter (PyTorch's `fused=True` or apex's fused
    /// optimizers) instead of one kernel per tensor (the `foreach=False` loop).
    pub fused: bool,
    /// Bytes of one gradient element (2 in mixed precision, 4 in fp32).
    pub gradient_bytes: u64,
    /// Bytes per parameter of the tensors the rule reads and writes: the optimizer's weights,
    /// each state, and the narrower compute copy it writes back (mixed precision).
    pub widths: StepWidths,
    /// The kernels around the update rule: one fused kernel, or Megatron-LM's separate passes.
    pub passes: OptimizerPasses,
}

/// Bytes per parameter of what an optimizer step reads and writes besides the gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepWidths {
    /// The weights the rule updates: the fp32 master copy, the weights themselves (fp32
    /// training, or an in-place update), or a bf16 weight and its 16-bit remainder (4).
    pub master: u64,
    /// Each state tensor (momentum, Adam's moments): fp32, or bf16 where the optimizer keeps
    /// them so.
    pub state: u64,
    /// The compute copy written back after the update: 2 (fp16/bf16), 1 (FP8 parameters), or
    /// 0 when the rule updates the compute weights themselves.
    pub copy: u64,
}

impl StepWidths {
    /// Mixed precision: fp32 master weights and states, a 2-byte compute copy.
    pub const MIXED: StepWidths = StepWidths { master: 4, state: 4, copy: 2 };
    /// fp32 training: the fp32 weights updated in place.
    pub const FP32: StepWidths = StepWidths { master: 4, state: 4, copy: 0 };

    /// Whether a narrower compute copy is written back.
    pub const fn copies(&self) -> bool {
        self.copy > 0
    }
}

impl OptimizerStep {
    /// fp32 state tensors the rule reads and writes per parameter besides the weight:
    /// momentum for SGD with momentum, two moments for Adam.
    fn states(&self) -> u64 {
        match self.optimizer {
            Optimizer::Sgd => 0,
            // Muon's element-wise part is SGD with momentum's; its Newton-Schulz products and
            // the AdamW step of the other parameters are priced apart (`crate::muon`).
            Optimizer::SgdMomentum | Optimizer::Lars | Optimizer::Muon => 1,
            Optimizer::Adam => 2,
        }
    }

    /// Bytes moved per parameter by the update rule's kernel. Fused: read the fp32 weight, the
    /// gradient and the states; write the weight and the states (and the low-precision copy).
    /// Megatron's step reads the fp32 main gradient and leaves the copy to its own pass.
    pub fn bytes_per_parameter(&self) -> u64 {
        let fp32 = Dtype::Fp32.bytes();
        let widths = self.widths;
        let megatron = self.passes == OptimizerPasses::Megatron && widths.copies();
        let gradient = if megatron { fp32 } else { self.gradient_bytes };
        let copy = if megatron { 0 } else { widths.copy };
        let tensors = widths.master + widths.state * self.states();
        tensors + gradient + tensors + copy
    }

    /// The memory-bound passes besides the update rule's kernel, in order, as (kernels, bytes
    /// per parameter, FLOPs per parameter): none when fused; Megatron-LM's
    /// ([`OptimizerPasses::Megatron`]) in mixed precision the cast of the gradients to fp32
    /// (one kernel per tensor: read the gradient, write 4 bytes), the unscale (read and write
    /// 4), the L2 norm (read 4) and the copy of the weights to the 2-byte model weights (read
    /// 4, write 2); in fp32 the norm only.
    pub fn extra_passes(&self) -> Vec<(u64, u64, f64)> {
        let fp32 = Dtype::Fp32.bytes();
        let norm = (1, fp32, 2.0);
        match (self.passes, self.widths.copies()) {
            (OptimizerPasses::Fused | OptimizerPasses::ForLoop, _) => Vec::new(),
            (OptimizerPasses::Megatron, false) => vec![norm],
            (OptimizerPasses::Megatron, true) => vec![
                (self.tensors.clamp(1, self.parameters.max(1)), self.gradient_bytes + fp32, 0.0),
                (1, 2 * fp32, 1.0),
                norm,
                (1, self.widths.master + self.widths.copy, 0.0),
            ],
        }
    }

    /// The operators PyTorch's for-loop implementation runs on each parameter tensor
    /// ([`OptimizerPasses::ForLoop`]), as bytes read and written per element, `g` the
    /// gradient's bytes (pytorch/pytorch @ v1.13.0 : torch/optim/adamw.py
    /// `_single_tensor_adamw`, adam.py `_single_tensor_adam`, sgd.py `_single_tensor_sgd`):
    /// - Adam(W): `param.mul_(1 - lr * wd)` (8), `exp_avg.mul_(b1)` (8), `.add_(grad)` (8 + g),
    ///   `exp_avg_sq.mul_(b2)` (8), `.addcmul_(grad, grad)` (8 + g), `exp_avg_sq.sqrt()` (8),
    ///   `/ bias_correction2_sqrt` (8), `.add_(eps)` (8), `param.addcdiv_(exp_avg, denom)` (16);
    ///   the step counter and the bias corrections are CPU scalars;
    /// - SGD with momentum (and LARS's update): `buf.mul_(momentum)` (8), `.add_(grad)` (8 + g),
    ///   `param.add_(buf)` (12);
    /// - SGD: `param.add_(grad)` (8 + g).
    pub fn for_loop_operators(&self) -> Vec<u64> {
        let g = self.gradient_bytes;
        match self.optimizer {
            Optimizer::Adam => vec![8, 8, 8 + g, 8, 8 + g, 8, 8, 8, 16],
            Optimizer::SgdMomentum | Optimizer::Lars | Optimizer::Muon => vec![8, 8 + g, 12],
            Optimizer::Sgd => vec![8 + g],
        }
    }

    /// Bytes of device memory the whole step reads and writes: every one of its
    /// [`OptimizerStep::kernels`], as [`ComputeModel::optimizer_step_duration`] prices them
    /// (none without parameters: no step runs).
    pub fn bytes(&self) -> f64 {
        if self.parameters == 0 {
            return 0.0;
        }
        self.kernels().iter().map(|pass| pass.elements as f64 * pass.bytes_per_element).sum()
    }

    /// FLOPs per parameter of the update kernel: SGD 2 (scale, add), with momentum 4, Adam 12
    /// (moments, bias correction, square root, division, weight decay), LARS 5 (momentum and
    /// the per-layer rate; its norms are [`OptimizerStep::lars_norm_passes`]).
    pub fn flops_per_parameter(&self) -> f64 {
        match self.optimizer {
            Optimizer::Sgd => 2.0,
            Optimizer::SgdMomentum => 4.0,
            Optimizer::Adam => 12.0,
            Optimizer::Lars => 5.0,
            Optimizer::Muon => 6.0,
        }
    }

    /// LARS's two norm passes before the update, as MXNet's `sgdwfastlarsv2` runs them
    /// (NVIDIA's MLPerf ResNet-50, `common/optimizer.py`, `SGDwFASTLARSV2._update_impl`):
    /// `multi_sum_sq` over the weights (the compute copy the update reads: 2 bytes in mixed
    /// precision, else 4), then over the gradients. Each is, per apache/mxnet
    /// `src/operator/contrib/multi_sum_sq.cu` (`MultiSumSqRun`): blocks of 32768 elements, at
    /// most 320 blocks per `MultiSumSqKernel` launch (so at least `parameters / (32768 x 320)`
    /// launches, rounded up; more where tensors end mid-chunk), then one
    /// `GlobalReductionKernel` over the per-block sums. Returns, per pass, the bytes read per
    /// parameter and the streaming launches; empty for other optimizers. Every parameter is
    /// counted (LARS skips the batch norms' scales and shifts and the biases: 0.2% of
    /// ResNet-50's).
    pub fn lars_norm_passes(&self) -> Vec<(u64, u64)> {
        if self.optimizer != Optimizer::Lars {
            return Vec::new();
        }
        let launches = self.parameters.div_ceil(LARS_CHUNK * LARS_BLOCKS_PER_LAUNCH).max(1);
        let weight = if self.widths.copies() { self.widths.copy } else { self.widths.master };
        vec![(weight, launches), (self.gradient_bytes, launches)]
    }

    /// Every kernel of the step, in the order they run: the update rule (one kernel, or one per
    /// tensor unfused), the [`OptimizerStep::extra_passes`], and for LARS each of its
    /// [`OptimizerStep::lars_norm_passes`] followed by its global reduction, then the per-layer
    /// rates. The reductions and the rates are kernels over one fp32 value per tensor (read
    /// two such arrays, write one: next to no work).
    pub fn kernels(&self) -> Vec<OptimizerKernels> {
        let over_parameters = |kernels: u64, bytes: u64, flops: f64| OptimizerKernels {
            kernels,
            elements: self.parameters,
            bytes_per_element: bytes as f64,
            flops_per_element: flops,
        };
        let per_tensor = OptimizerKernels {
            kernels: 1,
            elements: self.tensors.max(1),
            bytes_per_element: 12.0,
            flops_per_element: 1.0,
        };
        let tensors = self.tensors.clamp(1, self.parameters.max(1));
        let mut kernels = if self.passes == OptimizerPasses::ForLoop {
            // One kernel per operator per tensor; FLOPs spread over the operators.
            let operators = self.for_loop_operators();
            let flops = self.flops_per_parameter() / operators.len().max(1) as f64;
            operators.into_iter().map(|bytes| over_parameters(tensors, bytes, flops)).collect()
        } else {
            let update = if self.fused { 1 } else { tensors };
            vec![over_parameters(update, self.bytes_per_parameter(), self.flops_per_parameter())]
        };
        kernels.extend(
            self.extra_passes().into_iter().map(|(k, bytes, flops)| over_parameters(k, bytes, flops)),
        );
        for (bytes, launches) in self.lars_norm_passes() {
            kernels.push(over_parameters(launches, bytes, 2.0));
            kernels.push(per_tensor);
        }
        if self.optimizer == Optimizer::Lars {
            kernels.extend(std::iter::repeat_n(per_tensor, LARS_SCALAR_KERNELS as usize));
        }
        kernels
    }
}

/// Kernels of an optimizer step that split `elements` evenly, each a memory-bound element-wise
/// kernel ([`OptimizerStep::kernels`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerKernels {
    /// How many kernels share the elements.
    pub kernels: u64,
    /// The elements they cover together (parameters, or one value per tensor).
    pub elements: u64,
    /// Bytes read and written per element.
    pub bytes_per_element: f64,
    /// Arithmetic per element.
    pub flops_per_element: f64,
}

/// `chunk_size` of MXNet's `multi_sum_sq` (elements per block).
const LARS_CHUNK: u64 = 32_768;
/// `BLOCK_LIMIT` of MXNet's `multi_sum_sq` (blocks per launch).
const LARS_BLOCKS_PER_LAUNCH: u64 = 320;
/// The per-layer scalar kernels between the norms and the update, over one value per tensor,
/// that both of NVIDIA's MXNet LARS variants run: `multi_lars` (`SGDwFASTLARS`,
/// `common/fit.py`) or `multi_lars_v2` (`SGDwFASTLARSV2`, `common/optimizer.py`), the
/// per-layer rates. The v2 variant also runs `broadcast_mul`, `broadcast_div`, `slice_assign`
/// and `copyto` on those values, the v1 variant copies the rates and weight decays from the
/// host every step: neither is priced (the floor common to both).
const LARS_SCALAR_KERNELS: u64 = 1;

impl ComputeModel {
    /// Time of `step` on `device`: each of its [`OptimizerStep::kernels`] an element-wise kernel
    /// over its equal share (each pays the launch overhead and the memory ramp); under
    /// [`OptimizerPasses::ForLoop`] each kernel takes at least the host's time to issue it
    /// ([`ComputeModel::host_cost_per_kernel`]).
    pub fn optimizer_step_duration(
        &self,
        device: &Device,
        step: &OptimizerStep,
    ) -> Result<SimDuration, ComputeError> {
        if step.parameters == 0 {
            return Ok(SimDuration::ZERO);
        }
        // A for-loop step issues one small kernel per operator and tensor from the host: each
        // takes at least the host's time to issue it (the GPU waits for the next launch).
        let issue = if step.passes == OptimizerPasses::ForLoop {
            self.host_cost_per_kernel().as_secs_f64()
        } else {
            0.0
        };
        let mut seconds = 0.0;
        for pass in step.kernels() {
            let per_kernel = pass.elements as f64 / pass.kernels as f64;
            let work = KernelWork::flat(
                OpClass::Elementwise,
                Dtype::Fp32,
                pass.flops_per_element * per_kernel,
                pass.bytes_per_element * per_kernel,
            );
            seconds += self.work_duration(device, &work)?.as_secs_f64().max(issue) * pass.kernels as f64;
        }
        SimDuration::from_secs_f64(seconds).map_err(ComputeError::Duration)
    }
}

/// The efficiency curves with half-times in seconds: the arithmetic of [`ComputeModel`] in
/// plain floats.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Curves {
    pub(crate) gemm_efficiency: f64,
    pub(crate) vector_gemm_efficiency: f64,
    pub(crate) unaligned_gemm_efficiency: f64,
    pub(crate) k_major_thin_gemm_efficiency: f64,
    pub(crate) unaligned_memory_efficiency: f64,
    pub(crate) gemm_ramp_exponent: f64,
    pub(crate) gemm_half_s: f64,
    pub(crate) vector_efficiency: f64,
    pub(crate) memory_efficiency: f64,
    pub(crate) reduction_memory_efficiency: f64,
    pub(crate) memory_half_s: f64,
    pub(crate) l2_hit_fraction: f64,
    pub(crate) reduction_half_s: f64,
    pub(crate) reduction_overhead_s: f64,
    pub(crate) tile_half_intensity: f64,
    pub(crate) wave_overhead_s: f64,
    pub(crate) conv_efficiency: f64,
    pub(crate) conv_backward_weight_efficiency: f64,
    pub(crate) conv_backward_data_efficiency: f64,
    pub(crate) flash_attention_efficiency: f64,
    pub(crate) winograd: bool,
    /// `launch-overhead` in seconds: what each of cuDNN's helper kernels of a convolution
    /// costs ([`conv_helper_kernels`]).
    pub(crate) launch_s: f64,
}

impl Curves {
    /// The peak that element-wise and reduction kernels compute at: the device's fp64 rate for
    /// fp64 tensors, its fp32 rate otherwise (the dtype's own rate if it lists no fp32).
    fn vector_peak(device: &Device, dtype: Dtype) -> Result<f64, DeviceError> {
        let wide = if dtype == Dtype::Fp64 { Dtype::Fp64 } else { Dtype::Fp32 };
        match device.peak.get(&wide) {
            Some(rate) => Ok(rate.per_second()),
            None => Ok(device.peak(dtype)?.per_second()),
        }
    }

    /// The saturated efficiency of `dtype` products on `device`: `vector-gemm-efficiency` on
    /// its vector units, `gemm-efficiency` on its matrix units (or without execution data)
    /// times the share of the datasheet's matrix rate the device sustains under long dense
    /// products (`[device.execution] matrix-sustained-fraction`, 1 unless measured; for fp8,
    /// `fp8-sustained-fraction` where it was measured apart).
    pub(crate) fn gemm_ceiling(&self, device: &Device, dtype: Dtype) -> f64 {
        match &device.execution {
            Some(execution) if !execution.on_matrix_units(dtype) => self.vector_gemm_efficiency,
            Some(execution) => self.gemm_efficiency * execution.sustained_fraction(dtype),
            None => self.gemm_efficiency,
        }
    }

    /// Seconds of the compute side of a kernel: 0 without FLOPs.
    fn compute_seconds(&self, device: &Device, work: &KernelWork) -> Result<f64, ComputeError> {
        let KernelWork { class, dtype, flops, aligned, .. } = *work;
        // The dtype must exist on the device whatever the class: a scenario in fp16 on a CPU
        // node is an error even for its element-wise layers.
        let peak = device.peak(dtype)?.per_second();
        if flops == 0.0 {
            return Ok(0.0);
        }
        Ok(match class {
            OpClass::Gemm => {
                let fused = matches!(work.shape, KernelShape::Attention(shape) if shape.fused);
                let unaligned = || {
                    let measured = device.execution.as_ref().map_or(1.0, |e| e.unaligned_fraction(dtype));
                    self.unaligned_gemm_efficiency * measured
                };
                let efficiency = self.gemm_ceiling(device, dtype)
                    * if aligned { 1.0 } else { unaligned() }
                    * if fused { self.flash_attention_efficiency } else { 1.0 };
                if let Some(seconds) = self.shaped_seconds(device, work, peak, efficiency) {
                    return Ok(seconds);
                }
                // flops / (peak * e * w / (w + w_half)) = (w + w_half) / (peak * e): no division
                // by a vanishing efficiency for tiny kernels.
                let half = self.gemm_half_s * ComputeModel::reference_rate(device, dtype);
                // w / (w^g / (w^g + h^g)) = w + h^g w^(1-g): the hyperbola's fixed ramp when g = 1.
                let ramp = if self.gemm_ramp_exponent == 1.0 {
                    half
                } else {
                    half.powf(self.gemm_ramp_exponent) * flops.powf(1.0 - self.gemm_ramp_exponent)
                };
                (flops + ramp) / (peak * efficiency)
            }
            OpClass::Elementwise | OpClass::Reduction | OpClass::Normalization => {
                flops / (Self::vector_peak(device, dtype)? * self.vector_efficiency)
            }
        })
    }

    /// Seconds of a shaped GEMM-class kernel by tile and wave quantization, or `None` when the
    /// kernel has no shape or the device no execution data.
    fn shaped_seconds(&self, device: &Device, work: &KernelWork, peak: f64, efficiency: f64) -> Option<f64> {
        let execution = device.execution.as_ref()?;
        let matrix = execution.on_matrix_units(work.dtype);
        // Matrix-unit kernels step through the reduction in 16-byte vectors.
        let vector = (16 / work.dtype.bytes()).max(1);
        let grid = if matrix { vector } else { 1 };
        let tiles = execution.tiles();
        let tiled = |shape: &GemmShape| {
            self.tiled_seconds(device, shape, peak, efficiency, grid, tiles, Split::UpTo(GEMM_MAX_SPLIT))
        };
        let bytes = work.dtype.bytes() as f64;
        match &work.shape {
            KernelShape::Unknown | KernelShape::Reduction(_) => None,
            KernelShape::Gemm(shape) => {
                let scale = work.flops / shape.flops().max(1.0);
                Some(tiled(shape)? * scale)
            }
            KernelShape::Attention(shape) => {
                let products = shape.products();
                let shape_flops: f64 = products.iter().map(GemmShape::flops).sum();
                let seconds = products.iter().map(tiled).sum::<Option<f64>>()?;
                Some(seconds * work.flops / shape_flops.max(1.0))
            }
            KernelShape::Conv { shape, direction } => {
                // Channels off the 16-byte grid (an RGB input, CosmoFlow's 4 channels) keep a
                // convolution off the matrix units: cuDNN's Tensor Core kernels need them
                // aligned. It runs on the vector units at the fp32 rate and their ceiling,
                // which replaces the unaligned factor.
                let groups = shape.groups.max(1);
                let channels_aligned =
                    (shape.in_channels / groups) % vector == 0 && (shape.out_channels / groups) % vector == 0;
                let (peak, grid, efficiency) = if matrix && !channels_aligned {
                    (Self::vector_peak(device, work.dtype).ok()?, 1, self.vector_gemm_efficiency)
                } else {
                    (peak, grid, efficiency)
                };
                let efficiency = efficiency
                    * self.conv_efficiency
                    * match direction {
                        ConvDirection::Forward => 1.0,
                        ConvDirection::BackwardData => self.conv_backward_data_efficiency,
                        ConvDirection::BackwardWeight => self.conv_backward_weight_efficiency,
                    };
                let on_vector_units = grid == 1;
                let tiled = |shape: &GemmShape| {
                    self.tiled_seconds(
                        device,
                        shape,
                        peak,
                        efficiency,
                        grid,
                        tiles,
                        Split::UpTo(GEMM_MAX_SPLIT),
                    )
                };
                // cuDNN splits the reduction in its backward-weight kernels (named
                // `*_splitK_*`), whose reduction over N·P·Q(·O) positions is long and whose
                // output (K x C·R·S) is small, and in its Tensor Core forward kernels (cuDNN 7:
                // `volta_fp16_s884cudnn_fp16_128x128_ldg8_splitK_relu_*`). Its SIMT forward
                // (`*_relu_*`) and its backward-data kernels (`*_stridedB_*`, `*_dgrad_*`) keep
                // each output tile's whole reduction in one thread block: a product with few
                // output tiles (a 7x7 layer of a small batch) leaves multiprocessors idle. The 2-D
                // SIMT backward-weight kernels split further while their few output tiles leave
                // multiprocessors idle (`Split::Fill`); 3-D backward-weight is another engine
                // (`convolveNd_wgrad_engine`, named as cuDNN's 3-D weight-gradient kernel in
                // pytorch/pytorch#22961), whose split nothing public says: it keeps 32.
                let split = match direction {
                    ConvDirection::BackwardWeight if on_vector_units && shape.is_two_d() => Split::Fill,
                    ConvDirection::BackwardWeight => Split::UpTo(GEMM_MAX_SPLIT),
                    ConvDirection::Forward if !on_vector_units => Split::UpTo(GEMM_MAX_SPLIT),
                    ConvDirection::Forward | ConvDirection::BackwardData => Split::UpTo(1),
                };
                // Implicit GEMM in a vector-unit dtype (fp32 on a V100 or an A100, everything on
                // a P100) runs cuDNN's SIMT kernels, whose tiles are 128 positions by 128, 64 or
                // 32 channels (`CONV_VECTOR_TILES`): thin channel counts waste part of every
                // tile. On matrix units the device's convolution tiles apply
                // (`Execution::conv_tiles`: cuDNN 7 on Volta has 256x128, 256x64 and 128x128,
                // none narrower), and the kernels step through each filter tap's channels one
                // k-tile of `MATRIX_CONV_CHANNEL_BYTES` at a time, so channels count as padded
                // to it (32 in fp16: a layer of 8 or 16 channels wastes 3/4 or 1/2 of every
                // step). Forward and backward-data put the positions on the rows; which operand
                // of backward-weight's `K x C·R·S(·T)` product takes the rows is not documented,
                // so both orientations are tried. A half-precision convolution moved off the
                // matrix units by unaligned channels keeps the GEMM tiles: newer cuDNN versions
                // pad such channels onto Tensor Cores instead.
                let (channel_grid, conv_tiles) = if !matrix {
                    (1, &CONV_VECTOR_TILES[..])
                } else if on_vector_units {
                    (1, tiles)
                } else {
                    ((MATRIX_CONV_CHANNEL_BYTES / work.dtype.bytes()).max(grid), execution.conv_tiles())
                };
                let gemm = shape.implicit_gemm(*direction, channel_grid);
                let conv = |tiles: &[[u32; 2]]| {
                    self.tiled_seconds(device, &gemm, peak, efficiency, grid, tiles, split)
                };
                let mut best = conv(conv_tiles)?;
                if *direction == ConvDirection::BackwardWeight {
                    let transposed: Vec<[u32; 2]> =
                        conv_tiles.iter().map(|&[rows, columns]| [columns, rows]).collect();
                    best = best.min(conv(&transposed)?);
                }
                // Every algorithm pays the helper kernels cuDNN launches with it, so they
                // weigh in the choice between algorithms too. The Tensor Core count is cuDNN
                // 7's on Volta, the kernels the catalog names by their tiles (`conv-tiles`);
                // other devices' libraries (cuDNN 8's `sm80_xmma_*`) get none, as nothing
                // public says.
                let helpers =
                    |algorithm| f64::from(conv_helper_kernels(algorithm, *direction)) * self.launch_s;
                best += if on_vector_units {
                    helpers(ConvAlgorithm::VectorImplicitGemm)
                } else if execution.conv_tiles.is_empty() {
                    0.0
                } else {
                    helpers(ConvAlgorithm::MatrixImplicitGemm)
                };
                // In cuDNN's benchmark mode (the fastest algorithm wins) vector-unit
                // convolutions may use Winograd (fewer multiplications; its transforms in
                // kernels of their own, through memory, or fused into the product's kernel)
                // or FFT (four real products per complex multiply-add over the frequencies,
                // plus its transforms through memory).
                if self.winograd && on_vector_units {
                    let bandwidth = self.sustained_bandwidth(device);
                    let through_memory = |elements: f64| elements * bytes / bandwidth;
                    if shape.winograd_applies() {
                        // Through memory cuDNN runs F(4x4, 3x3): the batched SGEMM beside its
                        // `*4x4` transforms has 36 = 6 x 6 products (`ConvShape::winograd`).
                        let (product, elements) = shape.winograd(*direction, WINOGRAD_NONFUSED_TILE);
                        best = best.min(
                            tiled(&product)? + through_memory(elements) + helpers(ConvAlgorithm::Winograd),
                        );
                        if let Some((product, elements)) = shape.fused_winograd(*direction) {
                            best = best.min(
                                tiled(&product)?
                                    + through_memory(elements)
                                    + helpers(ConvAlgorithm::FusedWinograd),
                            );
                        }
                    }
                    if shape.fft_applies() {
                        for size in [16, 32] {
                            if let Some((product, elements)) = shape.fft(*direction, size) {
                                best = best.min(
                                    4.0 * tiled(&product)?
                                        + through_memory(elements)
                                        + helpers(ConvAlgorithm::Fft),
                                );
                            }
                        }
                    }
                }
                // A backward-data pass whose kernel is narrower than its stride computes only the
                // input positions some output reads; the others' gradient is zero. The SIMT path
                // zeroes the whole input gradient first, a pass and a launch of its own
                // (Composable Kernel's design); the Tensor Core kernels write the unreached
                // positions' zeros from their own thread blocks (CUTLASS's strided dgrad, the
                // public form of these kernels), those bytes at the memory's rate.
                if let Some((whole, unreached)) = shape.unreached_input_gradient(*direction) {
                    best += if on_vector_units {
                        self.memory_seconds(device, whole as f64 * bytes, OpClass::Gemm) + self.launch_s
                    } else {
                        unreached as f64 * bytes / self.sustained_bandwidth(device)
                    };
                }
                Some(best)
            }
        }
    }

    /// Seconds of one (batched) product by tile and wave quantization: for every tile shape in
    /// `tiles` (what the kernel library offers for this product) and every split of the
    /// reduction, the tiles are spread over the multiprocessors in waves; each wave takes its
    /// tile's FLOPs at the multiprocessor's share of the peak, scaled by the tile's efficiency
    /// relative to the device's best-reusing GEMM tile, plus `gemm-wave-overhead`. The fastest
    /// choice wins, as a library's heuristic (or autotuner) picks it. The reduction is split
    /// as `split` allows, each slice at least 128 deep.
    #[allow(clippy::too_many_arguments)]
    fn tiled_seconds(
        &self,
        device: &Device,
        shape: &GemmShape,
        peak: f64,
        efficiency: f64,
        grid: u64,
        tiles: &[[u32; 2]],
        splitting: Split,
    ) -> Option<f64> {
        let (max_split, fill) = match splitting {
            Split::UpTo(slices) => (slices, false),
            Split::Fill => (GEMM_MAX_SPLIT, true),
        };
        let execution = device.execution.as_ref()?;
        let units = f64::from(execution.sm_count);
        let per_unit = peak / units;
        let depth = shape.k.div_ceil(grid) * grid;
        if shape.batch == 0 || shape.m == 0 || shape.n == 0 || depth == 0 {
            return Some(0.0);
        }
        let bandwidth = self.sustained_bandwidth(device);
        let reuse = |rows: u64, columns: u64| (rows * columns) as f64 / (rows + columns) as f64;
        let saturation = |reuse: f64| reuse / (reuse + self.tile_half_intensity);
        // The best-reusing tile runs at `efficiency`: large products reach gemm-efficiency.
        let widest =
            execution.tiles().iter().map(|&[r, c]| reuse(u64::from(r), u64::from(c))).fold(0.0, f64::max);
        let mut best = f64::INFINITY;
        for &[rows, columns] in tiles {
            let (rows, columns) = (u64::from(rows), u64::from(columns));
            let tile_efficiency = efficiency * saturation(reuse(rows, columns)) / saturation(widest);
            let tiles = shape.batch as f64 * shape.m.div_ceil(rows) as f64 * shape.n.div_ceil(columns) as f64;
            let mut split = 1u64;
            loop {
                // Past `max_split`, a filling product doubles its slices only while the tiles
                // of the last count left multiprocessors idle.
                if split > max_split && !(fill && tiles * ((split / 2) as f64) < units) {
                    break;
                }
                // Each split of the reduction keeps at least 128 of it.
                if split > 1 && depth / split < 128 {
                    break;
                }
                let slice = depth.div_ceil(split) as f64;
                let waves = (tiles * split as f64 / units).ceil();
                let wave = 2.0 * (rows * columns) as f64 * slice / (per_unit * tile_efficiency)
                    + self.wave_overhead_s;
                let mut seconds = waves * wave;
                if split > 1 {
                    // Partial tiles written and summed in fp32.
                    let partials = shape.batch as f64 * shape.m as f64 * shape.n as f64 * split as f64;
                    seconds += 2.0 * 4.0 * partials / bandwidth + self.memory_half_s / self.memory_efficiency;
                }
                best = best.min(seconds);
                split *= 2;
            }
        }
        Some(best)
    }

    /// The bandwidth large streams reach: the device's memory bandwidth times
    /// `memory-efficiency` (no ramp): what a product's operands, partial tiles and transforms
    /// move at under its compute.
    fn sustained_bandwidth(&self, device: &Device) -> f64 {
        device.memory_bandwidth.bytes_per_second() * self.memory_efficiency
    }

    /// Seconds of the memory side of a kernel: 0 without traffic.
    fn memory_seconds(&self, device: &Device, bytes: f64, class: OpClass) -> f64 {
        if bytes == 0.0 {
            return 0.0;
        }
        let bandwidth = device.memory_bandwidth.bytes_per_second();
        let efficiency = match class {
            // Small reductions (few rows, or few blocks per row) cannot keep the memory busy;
            // large ones stream like copies. Their sustained efficiency moves from
            // `reduction-memory-efficiency` to `memory-efficiency` with their size.
            OpClass::Reduction => {
                let half = self.reduction_half_s * bandwidth;
                let large = if half > 0.0 { bytes / (bytes + half) } else { 0.0 };
                self.reduction_memory_efficiency
                    + (self.memory_efficiency - self.reduction_memory_efficiency) * large
            }
            // One block per row: many rows stream like an element-wise kernel.
            OpClass::Gemm | OpClass::Elementwise | OpClass::Normalization => self.memory_efficiency,
        };
        // Streaming kernels read what the kernels before them wrote: the part of it still in
        // the L2 does not come from memory. Beyond the L2's size the share falls as L2 / bytes:
        // the kernel reads the head of its input first, which its producer wrote first and the
        // L2 evicted first, and its own traffic evicts the rest before it gets there. Products' operand tiles are re-read through the L2
        // whatever their source; their traffic is the compulsory one, priced as it is.
        let bytes = match (class, device.execution.as_ref()) {
            (OpClass::Gemm, _) | (_, None) => bytes,
            (OpClass::Elementwise | OpClass::Reduction | OpClass::Normalization, Some(execution)) => {
                let l2 = execution.l2_cache.as_f64();
                bytes - self.l2_hit_fraction * bytes.min(l2) * (l2 / bytes.max(l2))
            }
        };
        // The ramp (filling the memory pipeline) is the same for every class; only the sustained
        // rate differs. For element-wise kernels this is (bytes + q_half) / (bandwidth * e).
        bytes / (bandwidth * efficiency) + self.memory_half_s / self.memory_efficiency
    }

    /// Seconds of one kernel without the launch overhead.
    /// Whether the kernel doing `work` is bound by memory: its memory time is at least its
    /// compute time.
    pub(crate) fn bound_by_memory(&self, device: &Device, work: &KernelWork) -> Result<bool, ComputeError> {
        Ok(self.streaming_seconds(device, work) >= self.compute_seconds(device, work)?)
    }

    pub(crate) fn kernel_seconds(&self, device: &Device, work: &KernelWork) -> Result<f64, ComputeError> {
        let compute = self.compute_seconds(device, work)?;
        let memory = self.streaming_seconds(device, work);
        Ok(compute.max(memory) / self.layout_rate(work) + self.combine_seconds(work.class))
    }

    /// The share of its rate a product keeps for its operands' layout: for a thin product
    /// read along the reduction ([`GemmShape::thin_and_k_major`]), `k-major-thin-gemm-efficiency`
    /// with 4-byte elements; else 1. Each row of the wide operand is read in contiguous runs
    /// of the same number of elements per step of the reduction, and each run has a fixed
    /// cost besides its bytes, so with `b`-byte elements the cost beyond the bytes is `4/b`
    /// times the fp32 one: `rate = 1 / (1 + (1/e - 1) 4/b)`. (DeepBench's V100 `TN` against
    /// `NN` thin products: 0.89 of the `NN` rate in fp32, 0.77 in fp16, which one `e` of
    /// about 0.88 gives; docs/compute-model.md, "Layout".)
    fn layout_rate(&self, work: &KernelWork) -> f64 {
        match &work.shape {
            KernelShape::Gemm(shape) if work.class == OpClass::Gemm && shape.thin_and_k_major() => {
                let fp32_cost = 1.0 / self.k_major_thin_gemm_efficiency - 1.0;
                1.0 / (1.0 + fp32_cost * 4.0 / work.dtype.bytes().max(1) as f64)
            }
            _ => 1.0,
        }
    }

    /// Seconds of the memory side of a kernel: its traffic at the memory curve (divided by
    /// `unaligned-memory-efficiency` for an unaligned product other than a convolution), or,
    /// for a reduction with a shape, its threads' dependent rounds of loads if they take longer
    /// ([`dependent_load_seconds`]).
    fn streaming_seconds(&self, device: &Device, work: &KernelWork) -> f64 {
        let memory = self.memory_seconds(device, work.bytes, work.class);
        // Convolutions keep their own rule for unaligned channels (`shaped_seconds`).
        let product = work.class == OpClass::Gemm && !matches!(work.shape, KernelShape::Conv { .. });
        let memory =
            if product && !work.aligned { memory / self.unaligned_memory_efficiency } else { memory };
        memory.max(dependent_load_seconds(device, &work.shape))
    }

    /// The fixed time of a reduction's combine (`reduction-overhead`): partial results meet
    /// through shared memory over a tree of synchronised steps, after the streaming, for
    /// reductions and row-wise normalisations; 0 for other classes.
    pub(crate) fn combine_seconds(&self, class: OpClass) -> f64 {
        match class {
            OpClass::Reduction | OpClass::Normalization => self.reduction_overhead_s,
            OpClass::Gemm | OpClass::Elementwise => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceCatalog;

    fn a100() -> &'static Device {
        DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap()
    }

    fn ps(seconds: f64) -> f64 {
        seconds * 1e12
    }

    /// The A100 80 GB's sustained share of its datasheet matrix rate (`data/devices.toml`).
    fn sustained() -> f64 {
        a100().execution.as_ref().unwrap().matrix_sustained_fraction
    }

    #[test]
    fn a_big_gemm_is_compute_bound_near_the_saturated_efficiency() {
        let model = ComputeModel::default();
        // 8192^3 matrix product in fp16: 1.1 TFLOP over 3 x 128 MiB.
        let n = 8192.0_f64;
        let flops = 2.0 * n * n * n;
        let bytes = 3.0 * n * n * 2.0;
        let time = model.duration(a100(), Dtype::Fp16, flops, bytes, OpClass::Gemm).unwrap();
        let half_work = 3e-6 * 312e12;
        let expected = ps((flops + half_work) / (312e12 * 0.8 * sustained()) + 4e-6);
        assert!((time.as_ps() as f64 - expected).abs() <= 1.0, "{time} vs {expected} ps");
        assert!(model.gemm_efficiency_at(a100(), Dtype::Fp16, flops) > 0.999 * 0.8 * sustained());
        let memory = ps(bytes / (2039e9 * 0.8));
        assert!(expected > 10.0 * memory);
    }

    #[test]
    fn an_unaligned_products_memory_side_is_slowed_by_its_own_factor() {
        let model = ComputeModel { unaligned_memory_efficiency: 0.5, ..ComputeModel::default() };
        let unaligned = |work: KernelWork| KernelWork { aligned: false, ..work };
        // DLRM's memory-bound batched product (`[1024, 647, 96] x [1024, 96, 30]`, TF32: 3.8
        // GFLOP in 38 us at the default ceiling and ramp, 345 MB in 212 us): its memory side
        // takes twice as long unaligned, aligned it does not move.
        let bmm = KernelWork::flat(
            OpClass::Gemm,
            Dtype::Tf32,
            2.0 * 1024.0 * 647.0 * 96.0 * 30.0,
            4.0 * 1024.0 * (647.0 * 96.0 + 96.0 * 30.0 + 647.0 * 30.0),
        );
        let defaults = ComputeModel::default();
        assert!(defaults.curves().bound_by_memory(a100(), &bmm).unwrap());
        let alone = defaults.kernel_seconds(a100(), &bmm).unwrap();
        assert_eq!(model.kernel_seconds(a100(), &bmm).unwrap(), alone);
        let slow = model.kernel_seconds(a100(), &unaligned(bmm)).unwrap();
        assert!((slow / alone - 2.0).abs() < 1e-9, "{slow} vs {alone}");
        // A compute-bound product keeps its time: its compute side has `unaligned-gemm-efficiency`.
        let big =
            KernelWork::flat(OpClass::Gemm, Dtype::Fp16, 2.0 * 4096f64.powi(3), 3.0 * 4096f64.powi(2) * 2.0);
        assert_eq!(
            model.kernel_seconds(a100(), &unaligned(big)).unwrap(),
            defaults.kernel_seconds(a100(), &unaligned(big)).unwrap()
        );
        // Element-wise kernels have no alignment.
        let copy = KernelWork::flat(OpClass::Elementwise, Dtype::Fp32, 0.0, 1e9);
        assert_eq!(
            model.kernel_seconds(a100(), &copy).unwrap(),
            defaults.kernel_seconds(a100(), &copy).unwrap()
        );
        let invalid = ComputeModel { unaligned_memory_efficiency: 0.0, ..ComputeModel::default() };
        let error = invalid.validate().unwrap_err().to_string();
        assert!(error.contains("unaligned-memory-efficiency"), "{error}");
    }

    /// The A100 80 GB's sustained matrix rate reproduces its source: the default model prices
    /// an fp16 8192^3 product (shaped, as PyTorch's `a @ b` runs it) at the 230 TFLOP/s measured
    /// over at least 3 s (mli/transformers-benchmarks); at the datasheet's rate it gave 247.
    /// Only matrix-unit products slow down: an fp32 product (SIMT units on an A100) and a
    /// memory-bound kernel take the same time with the fraction at 1.
    #[test]
    fn the_a100_sustained_matrix_rate_reproduces_its_measurement() {
        let model = ComputeModel::default();
        let n = 8192_u64;
        let shape = GemmShape { batch: 1, m: n, n, k: n, layout: None };
        let product = |dtype: Dtype| KernelWork {
            class: OpClass::Gemm,
            dtype,
            flops: shape.flops(),
            bytes: 3.0 * (n * n) as f64 * dtype.bytes() as f64,
            aligned: true,
            shape: KernelShape::Gemm(shape),
        };
        let rate = |device: &Device, dtype| {
            shape.flops() / (model.kernel_seconds(device, &product(dtype)).unwrap() + 4e-6) / 1e12
        };
        let measured = rate(a100(), Dtype::Fp16);
        assert!((measured / 230.0 - 1.0).abs() < 0.01, "{measured} TFLOP/s");
        let mut datasheet = a100().clone();
        datasheet.execution.as_mut().unwrap().matrix_sustained_fraction = 1.0;
        let boost = rate(&datasheet, Dtype::Fp16);
        assert!(boost > 240.0 && measured < boost, "{boost} TFLOP/s");
        assert_eq!(rate(&datasheet, Dtype::Fp32), rate(a100(), Dtype::Fp32));
        let copy = KernelWork::flat(OpClass::Elementwise, Dtype::Fp16, 1e9, 1e9);
        assert_eq!(
            model.kernel_seconds(&datasheet, &copy).unwrap(),
            model.kernel_seconds(a100(), &copy).unwrap()
        );
    }

    /// The rate the default model gives `device` on an `m x n x k` product in `dtype`
    /// (`torch.mm` of `[m, k]` by `[k, n]`), launch included, in TFLOP/s.
    fn product_rate(device: &Device, dtype: Dtype, m: u64, n: u64, k: u64) -> f64 {
        shaped_product_rate(device, dtype, m, n, k, true)
    }

    /// [`product_rate`] for a product on or off the 16-byte grid.
    fn shaped_product_rate(device: &Device, dtype: Dtype, m: u64, n: u64, k: u64, aligned: bool) -> f64 {
        let model = ComputeModel::default();
        let shape = GemmShape { batch: 1, m, n, k, layout: None };
        let work = KernelWork {
            class: OpClass::Gemm,
            dtype,
            flops: shape.flops(),
            bytes: ((m * k + k * n) * dtype.bytes() + m * n * 2) as f64,
            aligned,
            shape: KernelShape::Gemm(shape),
        };
        shape.flops()
            / (model.kernel_seconds(device, &work).unwrap() + model.launch_overhead.as_secs_f64())
            / 1e12
    }

    /// Without the measured fractions, the Hopper entries' products run at the datasheet rates.
    fn hopper_datasheet(name: &str) -> Device {
        let mut datasheet = DeviceCatalog::builtin().get(name).unwrap().clone();
        let execution = datasheet.execution.as_mut().unwrap();
        execution.matrix_sustained_fraction = 1.0;
        execution.fp8_sustained_fraction = None;
        execution.unaligned_matrix_fraction = None;
        datasheet
    }

    #[test]
    fn the_h100_burst_matrix_rates_are_the_datasheet_rates_through_the_default_model() {
        // stas00/ml-engineering @ b9e29720ee: compute/accelerator/README.md, "Maximum Achievable
        // Matmul FLOPS comparison table": H100 SXM BF16 794.5 TFLOP/s at 2048x2048x13312, FP8
        // (float8_e4m3fn) 1402.6 TFLOP/s at 1024x9216x14336 (MxNxK, 100 iterations). At the
        // datasheet rates, tile and wave quantization alone give the measured fp8 / bf16 ratio
        // (1.77, not 2) within 2%, and both within 9% below the measurements: bursts run at the
        // boost clock. The catalog's sustained fractions are for products held for seconds.
        let datasheet = hopper_datasheet("h100-sxm5-80gb");
        let bf16 = product_rate(&datasheet, Dtype::Bf16, 2048, 2048, 13312);
        let fp8 = product_rate(&datasheet, Dtype::Fp8, 1024, 9216, 14336);
        assert!(bf16 < 794.5 && bf16 > 0.91 * 794.5, "{bf16} TFLOP/s");
        assert!(fp8 < 1402.6 && fp8 > 0.91 * 1402.6, "{fp8} TFLOP/s");
        let ratio = fp8 / bf16;
        assert!((ratio / (1402.6 / 794.5) - 1.0).abs() < 0.02, "fp8 / bf16 = {ratio}");
        // The catalog: both below the bursts, at their measured sustained shares.
        for (dtype, m, n, k, burst) in
            [(Dtype::Bf16, 2048, 2048, 13312, bf16), (Dtype::Fp8, 1024, 9216, 14336, fp8)]
        {
            let sustained = product_rate(h100(), dtype, m, n, k);
            assert!(sustained < 0.92 * burst && sustained > 0.8 * burst, "{dtype:?}: {sustained} TFLOP/s");
        }
    }

    /// The Hopper entries reproduce what one H200 measured (tools/device/h200_measure.py,
    /// data/measurements/h200-2026-12-04/run1-results.jsonl): an 8192^3 product held for at
    /// least 3 s at 671.2 TFLOP/s in bf16 and 1233.0 in fp8, and the 8192 x 50257 x 768 bf16
    /// product off the 16-byte grid (GPT-2's logits) at 94.9. The H100 SXM5 takes the same
    /// values (same chip, clock and power limit).
    #[test]
    fn the_hopper_sustained_and_unaligned_rates_reproduce_the_h200_measurement() {
        let path =
            concat!(env!("CARGO_MANIFEST_DIR"), "/../data/measurements/h200-2026-12-04/run1-results.jsonl");
        let results = fs_err::read_to_string(path).unwrap();
        for figure in [
            "\"dtype\": \"bf16\", \"n\": 8192, \"median_s\": 0.0016381847699999952",
            "\"tflops_median\": 671.17",
            "\"tflops_median\": 1232.95",
            "\"n\": 50257, \"k\": 768, \"median_ms\": 6.666",
        ] {
            assert!(results.contains(figure), "{figure} is not in {path}");
        }
        for name in ["h100-sxm5-80gb", "h200-sxm-141gb"] {
            let device = DeviceCatalog::builtin().get(name).unwrap();
            let bf16 = product_rate(device, Dtype::Bf16, 8192, 8192, 8192);
            assert!((bf16 / 671.2 - 1.0).abs() < 0.01, "{name}: {bf16} TFLOP/s");
            let fp8 = product_rate(device, Dtype::Fp8, 8192, 8192, 8192);
            assert!((fp8 / 1233.0 - 1.0).abs() < 0.01, "{name}: {fp8} TFLOP/s");
            let unaligned = shaped_product_rate(device, Dtype::Bf16, 8192, 50257, 768, false);
            assert!((unaligned / 94.9 - 1.0).abs() < 0.02, "{name}: {unaligned} TFLOP/s");
            // The fractions were solved against these datasheet-rate prices.
            let datasheet = hopper_datasheet(name);
            let at_boost = product_rate(&datasheet, Dtype::Bf16, 8192, 8192, 8192);
            assert!((at_boost - 748.7).abs() < 0.5, "{name}: {at_boost} TFLOP/s");
            let at_boost = product_rate(&datasheet, Dtype::Fp8, 8192, 8192, 8192);
            assert!((at_boost - 1461.7).abs() < 0.5, "{name}: {at_boost} TFLOP/s");
            // Aligned products and vector-unit ones are untouched by the unaligned share.
            let fp32 = |device: &Device| shaped_product_rate(device, Dtype::Fp32, 4096, 4095, 4096, false);
            assert_eq!(fp32(device), fp32(&datasheet));
        }
    }

    fn h100() -> &'static Device {
        DeviceCatalog::builtin().get("h100-sxm5-80gb").unwrap()
    }

    fn linear(name: &str, tokens: u64, inputs: u64, outputs: u64) -> Layer {
        let kind = crate::layer::LayerKind::Linear { out_features: outputs, bias: false };
        Layer::new(name, kind, crate::layer::Shape(vec![tokens, inputs])).unwrap()
    }

    #[test]
    fn an_fp8_linear_layer_is_faster_than_bf16_but_gains_less_than_twice() {
        let model = ComputeModel::default();
        let fc1 = linear("layers.3.mlp.fc1", 4096, 4096, 16384);
        for pass in [Pass::Forward, Pass::BackwardData, Pass::BackwardWeight] {
            let time = |dtype| model.layer_duration(h100(), dtype, &fc1, pass, 2).unwrap().as_secs_f64();
            let (bf16, fp8) = (time(Dtype::Bf16), time(Dtype::Fp8));
            assert!(fp8 < bf16, "{pass:?}: fp8 {fp8} s, bf16 {bf16} s");
            assert!(bf16 / fp8 < 2.0, "{pass:?}: gain {}", bf16 / fp8);
        }
        // The product alone runs at the fp8 rate: its kernel's dtype is fp8, the casts' bf16.
        let works = layer_kernel_works(&fc1, Pass::Forward, 2, Dtype::Fp8, false);
        assert_eq!(works.len(), 2);
        assert_eq!((works[0].class, works[0].dtype), (OpClass::Elementwise, Dtype::Bf16));
        assert_eq!((works[1].class, works[1].dtype), (OpClass::Gemm, Dtype::Fp8));
    }

    /// Autocast's casts as a PyTorch 2.11 trace shows them: a linear layer's weight and bias in
    /// the forward and their gradients in the weight-gradient pass, a norm's fp32 output and its
    /// gradient, a residual add's branch gradient; 6 bytes per element (read 4, write 2, or the
    /// reverse); nothing in fp32. A pass's time grows by exactly its casts' kernels.
    #[test]
    fn autocast_casts_each_parameter_and_fp32_activation_once_per_pass() {
        use crate::layer::{LayerKind, Shape};
        let fc = Layer::new(
            "layers.0.mlp.fc1",
            LayerKind::Linear { out_features: 3072, bias: true },
            Shape(vec![1024, 768]),
        )
        .unwrap();
        let (weights, biases) = (768 * 3072, 3072);
        assert_eq!(autocast_casts(&fc, Pass::Forward, Dtype::Bf16), vec![weights, biases]);
        assert_eq!(autocast_casts(&fc, Pass::BackwardWeight, Dtype::Bf16), vec![weights, biases]);
        assert!(autocast_casts(&fc, Pass::BackwardData, Dtype::Bf16).is_empty());
        assert!(autocast_casts(&fc, Pass::Forward, Dtype::Fp32).is_empty());
        let norm =
            Layer::new("layers.0.ln1", LayerKind::LayerNorm { bias: true }, Shape(vec![1024, 768])).unwrap();
        assert_eq!(autocast_casts(&norm, Pass::Forward, Dtype::Fp16), vec![1024 * 768]);
        assert_eq!(autocast_casts(&norm, Pass::BackwardData, Dtype::Fp16), vec![1024 * 768]);
        assert!(autocast_casts(&norm, Pass::BackwardWeight, Dtype::Fp16).is_empty());
        // A parameter is cast once per pass, an activation per sample.
        let batch = 4;
        let bytes = |layer: &Layer, pass| {
            autocast_cast_works(layer, pass, batch, Dtype::Bf16).iter().map(|work| work.bytes).sum::<f64>()
        };
        assert_eq!(bytes(&fc, Pass::Forward), ((weights + biases) * AUTOCAST_CAST_BYTES) as f64);
        assert_eq!(bytes(&norm, Pass::Forward), (1024 * 768 * batch * AUTOCAST_CAST_BYTES) as f64);
        let device = h100();
        let plain = ComputeModel::default();
        let autocast = ComputeModel { autocast: true, ..ComputeModel::default() };
        for pass in Pass::ALL {
            let casts = autocast_cast_works(&fc, pass, batch, Dtype::Bf16)
                .iter()
                .map(|work| plain.validated_work_duration(device, work).unwrap())
                .fold(SimDuration::ZERO, |sum, time| sum.checked_add(time).unwrap());
            let without = plain.layer_duration(device, Dtype::Bf16, &fc, pass, batch).unwrap();
            let with = autocast.layer_duration(device, Dtype::Bf16, &fc, pass, batch).unwrap();
            assert_eq!(with, without.checked_add(casts).unwrap(), "{pass:?}");
        }
    }

    #[test]
    fn fp8_cast_kernels_move_their_tensors_once_in_bf16_and_twice_in_fp8() {
        let (tokens, inputs, outputs, batch) = (2048, 4096, 12288, 3);
        let qkv = linear("layers.0.attention.qkv", tokens, inputs, outputs);
        let bytes = |pass| fp8_cast_works(&qkv, pass, batch).iter().map(|work| work.bytes).sum::<f64>();
        // Forward: the input, read as bf16 (2 bytes), written as fp8 and its transpose (1 + 1).
        assert_eq!(bytes(Pass::Forward), (tokens * inputs * batch * 4) as f64);
        // Backward-data: the output gradient, the same way.
        assert_eq!(bytes(Pass::BackwardData), (tokens * outputs * batch * 4) as f64);
        // Backward-weight reuses both transposes.
        assert!(fp8_cast_works(&qkv, Pass::BackwardWeight, batch).is_empty());
        // The weights' copy: once per iteration, the same 4 bytes per parameter.
        assert_eq!(fp8_weight_cast_bytes(&qkv, Dtype::Fp8, false), inputs * outputs * 4);
        assert_eq!(fp8_weight_cast_bytes(&qkv, Dtype::Fp8, true), inputs * outputs * 2);
        assert_eq!(fp8_weight_cast_bytes(&qkv, Dtype::Bf16, false), 0);
    }

    #[test]
    fn outside_the_linear_layers_of_the_blocks_fp8_training_runs_in_bf16() {
        let model = ComputeModel::default();
        let same = |layer: &Layer| {
            for pass in [Pass::Forward, Pass::BackwardData, Pass::BackwardWeight] {
                let time = |dtype| model.layer_duration(h100(), dtype, layer, pass, 2).unwrap();
                assert_eq!(time(Dtype::Fp8), time(Dtype::Bf16), "{} {pass:?}", layer.name);
            }
        };
        // The output layer (no block) and a block's normalisation.
        let logits = linear("logits", 4096, 4096, 32000);
        same(&logits);
        assert!(!fp8_linear(&logits) && fp8_weight_cast_bytes(&logits, Dtype::Fp8, false) == 0);
        let norm = Layer::new(
            "layers.0.norm1",
            crate::layer::LayerKind::RmsNorm,
            crate::layer::Shape(vec![4096, 4096]),
        )
        .unwrap();
        same(&norm);
        assert_eq!(Dtype::Fp8.storage(), Dtype::Bf16);
        assert_eq!(Dtype::Fp16.storage(), Dtype::Fp16);
    }

    #[test]
    fn a_tiny_gemm_is_launch_bound() {
        let model = ComputeModel::default();
        let n = 64.0_f64;
        let flops = 2.0 * n * n * n;
        let time = model.duration(a100(), Dtype::Fp16, flops, 3.0 * n * n * 2.0, OpClass::Gemm).unwrap();
        assert!(model.gemm_efficiency_at(a100(), Dtype::Fp16, flops) < 0.001);
        // Launch plus the GEMM ramp (3 us / 0.8 at the sustained rate); the FLOPs themselves add
        // almost nothing.
        let floor = 4e-6 + 3e-6 / (0.8 * sustained());
        assert!(time.as_secs_f64() >= floor && time.as_secs_f64() < floor * 1.01, "{time}");
        // A kernel with no work at all costs the launch overhead alone.
        let empty = model.duration(a100(), Dtype::Fp32, 0.0, 0.0, OpClass::Gemm).unwrap();
        assert_eq!(empty, SimDuration::from_us(4));
    }

    #[test]
    fn bigger_kernels_never_run_at_lower_efficiency_or_take_less_time() {
        let model = ComputeModel::default();
        for device in DeviceCatalog::builtin().devices() {
            let mut previous = (0.0, 0.0, SimDuration::ZERO);
            for step in 0..=160 {
                let work = 10f64.powf(step as f64 / 10.0); // 1 to 1e16
                let dtype = *device.peak.keys().next().unwrap();
                let gemm = model.gemm_efficiency_at(device, dtype, work);
                let memory = model.memory_efficiency_at(device, work);
                let time = model.duration(device, dtype, work, work / 10.0, OpClass::Gemm).unwrap();
                assert!(gemm >= previous.0 && memory >= previous.1, "{} at {work}", device.name);
                assert!(time >= previous.2, "{} at {work}", device.name);
                let ceiling = model.gemm_efficiency.max(model.vector_gemm_efficiency);
                assert!(gemm <= ceiling && memory <= model.memory_efficiency);
                previous = (gemm, memory, time);
            }
        }
    }

    #[test]
    fn an_elementwise_op_is_memory_bound_at_the_memory_curve() {
        let model = ComputeModel::default();
        // ReLU over 64M fp16 elements: read and write.
        let elements = 64.0 * 1024.0 * 1024.0;
        let bytes = 2.0 * elements * 2.0;
        let time = model.duration(a100(), Dtype::Fp16, elements, bytes, OpClass::Elementwise).unwrap();
        let expected = ps((bytes + 1e-6 * 2039e9) / (2039e9 * 0.8) + 4e-6);
        assert!((time.as_ps() as f64 - expected).abs() <= 1.0, "{time} vs {expected} ps");
        // A small copy does not reach the bandwidth: 1 MB runs at under half the large rate.
        assert!(model.memory_efficiency_at(a100(), 1e6) < 0.5 * 0.8);
        assert!(model.memory_efficiency_at(a100(), 1e10) > 0.99 * 0.8);
    }

    #[test]
    fn elementwise_math_runs_at_the_fp32_rate_whatever_the_storage_dtype() {
        let model = ComputeModel::default();
        // Compute-heavy, no traffic: the fp32 rate (19.5 TFLOP/s) at 50%, not the 312 TFLOP/s
        // of the fp16 matrix units.
        let flops = 1e12;
        for dtype in [Dtype::Fp16, Dtype::Bf16, Dtype::Fp32, Dtype::Tf32] {
            let time = model.duration(a100(), dtype, flops, 0.0, OpClass::Elementwise).unwrap();
            let expected = ps(flops / (19.5e12 * 0.5) + 4e-6);
            assert!((time.as_ps() as f64 - expected).abs() <= 1.0, "{dtype}: {time}");
        }
    }

    #[test]
    fn half_precision_gemms_are_faster_than_fp32_on_every_matrix_unit_device() {
        let model = ComputeModel::default();
        for device in DeviceCatalog::builtin().devices() {
            let (Ok(half), Ok(single)) = (device.peak(Dtype::Fp16), device.peak(Dtype::Fp32)) else {
                continue; // CPU nodes have no fp16
            };
            let matrix = device.execution.as_ref().is_none_or(|e| e.on_matrix_units(Dtype::Fp16));
            if !matrix {
                // P100: no matrix units; mixed-precision products run at the fp32 rate.
                assert_eq!(half, single, "{}", device.name);
                continue;
            }
            assert!(half.per_second() > single.per_second(), "{}", device.name);
            for n in [256.0_f64, 1024.0, 8192.0] {
                let flops = 2.0 * n * n * n;
                let fp16 =
                    model.duration(device, Dtype::Fp16, flops, 3.0 * n * n * 2.0, OpClass::Gemm).unwrap();
                let fp32 =
                    model.duration(device, Dtype::Fp32, flops, 3.0 * n * n * 4.0, OpClass::Gemm).unwrap();
                if n == 256.0 {
                    // 34 MFLOP: both are fixed-cost bound (launch, ramp, one wave); on a Hopper
                    // part, whose fp32 units run 67 TFLOP/s and whose matrix ramp scales with its
                    // measured sustained share, they come within 5% (8.2 and 7.9 us on an H100).
                    assert!(
                        fp16.as_secs_f64() < 1.05 * fp32.as_secs_f64(),
                        "{} n={n}: {fp16} vs {fp32}",
                        device.name
                    );
                } else {
                    assert!(fp16 < fp32, "{} n={n}: {fp16} vs {fp32}", device.name);
                }
            }
        }
    }

    #[test]
    fn the_curve_scales_with_the_device() {
        let model = ComputeModel::default();
        let catalog = DeviceCatalog::builtin();
        let h100 = catalog.get("h100-sxm5-80gb").unwrap();
        let cpu = catalog.get("xeon-8160-2s").unwrap();
        // The same 2 GFLOP GEMM fills a CPU node but not an H100.
        let flops = 2e9;
        let fp16 = |device| model.gemm_efficiency_at(device, Dtype::Fp16, flops);
        assert!(model.gemm_efficiency_at(cpu, Dtype::Fp32, flops) > 0.75);
        assert!(fp16(h100) < 0.4);
        assert!(fp16(a100()) > fp16(h100));
        assert_eq!(ComputeModel::reference_rate(cpu, Dtype::Fp32), 6.144e12);
        assert_eq!(ComputeModel::reference_rate(h100, Dtype::Fp16), 989.4e12);
        // Every matrix-unit dtype shares the fp16 scale; fp32 products fill the SIMT cores,
        // whose own peak sets theirs.
        assert_eq!(ComputeModel::reference_rate(h100, Dtype::Bf16), 989.4e12);
        assert_eq!(ComputeModel::reference_rate(h100, Dtype::Tf32), 989.4e12);
        assert_eq!(ComputeModel::reference_rate(a100(), Dtype::Fp32), 19.5e12);
    }

    #[test]
    fn reductions_stream_at_their_own_efficiency() {
        let model = ComputeModel {
            reduction_memory_efficiency: 0.4,
            reduction_half_time: SimDuration::ZERO,
            memory_half_time: SimDuration::ZERO,
            reduction_overhead: SimDuration::ZERO,
            ..Default::default()
        };
        let bytes = 1e9;
        let seconds = |class| {
            let work = KernelWork {
                class,
                dtype: Dtype::Fp32,
                flops: 0.0,
                bytes,
                aligned: true,
                shape: KernelShape::Unknown,
            };
            model.kernel_seconds(a100(), &work).unwrap()
        };
        assert!((seconds(OpClass::Reduction) - bytes / (2039e9 * 0.4)).abs() < 1e-12);
        assert!((seconds(OpClass::Elementwise) - bytes / (2039e9 * 0.8)).abs() < 1e-12);
        // With a reduction half-time, large reductions stream like copies and small ones at
        // their own efficiency.
        let curved = ComputeModel { reduction_half_time: SimDuration::from_us(10), ..model.clone() };
        let reduction = |bytes: f64| {
            let work = KernelWork::flat(OpClass::Reduction, Dtype::Fp32, 0.0, bytes);
            bytes / curved.kernel_seconds(a100(), &work).unwrap() / 2039e9
        };
        let half = 10e-6 * 2039e9;
        assert!((reduction(half) - 0.6).abs() < 1e-9, "{}", reduction(half));
        assert!(reduction(1e3) < 0.401 && reduction(1e12) > 0.799);
        let invalid = ComputeModel { reduction_memory_efficiency: 0.0, ..Default::default() };
        assert!(invalid.validate().unwrap_err().to_string().contains("reduction-memory-efficiency"));
    }

    #[test]
    fn starved_reductions_wait_on_memory_latency() {
        use crate::kernel_shape::ReductionShape;
        let model = ComputeModel::default();
        let v100 = DeviceCatalog::builtin().get("v100-sxm2-16gb").unwrap();
        let sum = |rows: u64, columns: u64, shaped: bool| {
            let shape =
                ReductionShape { outputs: columns, inputs_per_output: rows, contiguous: false, unroll: 4 };
            let work = KernelWork {
                shape: if shaped { KernelShape::Reduction(shape) } else { KernelShape::Unknown },
                ..KernelWork::flat(
                    OpClass::Reduction,
                    Dtype::Fp32,
                    (rows * columns) as f64,
                    4.0 * (rows * columns) as f64,
                )
            };
            model.kernel_seconds(v100, &work).unwrap()
        };
        // A bias gradient over 1024 rows of 96 columns: 32 rounds of 500 cycles at 1530 MHz,
        // 10.5 us for 393 kB that stream in 1.8 us.
        let latency = 32.0 * MEMORY_LATENCY_CYCLES / 1530e6;
        assert!((sum(1024, 96, true) - latency).abs() < 1e-12, "{}", sum(1024, 96, true));
        assert!(sum(1024, 96, false) < 0.25 * latency);
        // Many columns split the reduction over enough blocks to stream like a copy.
        assert_eq!(sum(65536, 4096, true), sum(65536, 4096, false));
        // Without execution data (no clock) the shape does not matter.
        let cpu = DeviceCatalog::builtin().devices().iter().find(|d| d.execution.is_none()).unwrap();
        let work =
            |shape| KernelWork { shape, ..KernelWork::flat(OpClass::Reduction, Dtype::Fp32, 0.0, 4e5) };
        let shape = KernelShape::Reduction(ReductionShape {
            outputs: 96,
            inputs_per_output: 1024,
            contiguous: false,
            unroll: 4,
        });
        assert_eq!(
            model.kernel_seconds(cpu, &work(shape)).unwrap(),
            model.kernel_seconds(cpu, &work(KernelShape::Unknown)).unwrap()
        );
    }

    #[test]
    fn streaming_kernels_read_their_l2_share_from_the_cache() {
        // Closed forms on an A100 (2039 GB/s, 40 MiB of L2), without ramps: a streaming kernel
        // moves `bytes - f * min(bytes, L2) * L2 / max(bytes, L2)` through memory (the whole
        // share inside the L2, less and less beyond it); a product's traffic is unchanged;
        // a device without an L2 size in the catalog (B200) ignores the fraction.
        let plain = ComputeModel {
            memory_efficiency: 0.8,
            reduction_memory_efficiency: 0.8,
            memory_half_time: SimDuration::ZERO,
            ..Default::default()
        };
        let cached = ComputeModel { l2_hit_fraction: 0.25, ..plain.clone() };
        let l2 = 40.0 * 1024.0 * 1024.0;
        let seconds = |model: &ComputeModel, device: &Device, class, bytes| {
            model.kernel_seconds(device, &KernelWork::flat(class, Dtype::Fp32, 0.0, bytes)).unwrap()
        };
        for class in [OpClass::Elementwise, OpClass::Reduction, OpClass::Normalization] {
            for bytes in [1e6, 1e7, 1e9] {
                let hits = 0.25 * f64::min(bytes, l2) * l2 / f64::max(bytes, l2);
                let expected = seconds(&plain, a100(), class, bytes - hits);
                assert!((seconds(&cached, a100(), class, bytes) - expected).abs() < 1e-15, "{class:?}");
            }
            // Small kernels, inside the L2, are faster by the whole fraction.
            let small = seconds(&cached, a100(), class, 1e6) / seconds(&plain, a100(), class, 1e6);
            assert!((small - 0.75).abs() < 1e-9, "{small}");
        }
        let product = KernelWork::flat(OpClass::Gemm, Dtype::Fp32, 1.0, 1e8);
        assert_eq!(
            cached.kernel_seconds(a100(), &product).unwrap(),
            plain.kernel_seconds(a100(), &product).unwrap()
        );
        let b200 = DeviceCatalog::builtin().get("b200-sxm-180gb").unwrap();
        assert!(b200.execution.is_none());
        assert_eq!(
            seconds(&cached, b200, OpClass::Elementwise, 1e7),
            seconds(&plain, b200, OpClass::Elementwise, 1e7)
        );
        // A fraction outside [0, 1] (or NaN) is refused by name.
        for value in [-0.1, 1.5, f64::NAN] {
            let invalid = ComputeModel { l2_hit_fraction: value, ..Default::default() };
            let error = invalid.validate().unwrap_err().to_string();
            assert!(error.contains("l2-hit-fraction") && error.contains("at least 0"), "{error}");
        }
        assert!(ComputeModel { l2_hit_fraction: 0.0, ..Default::default() }.validate().is_ok());
        assert!(ComputeModel { l2_hit_fraction: 1.0, ..Default::default() }.validate().is_ok());
    }

    #[test]
    fn normalizations_stream_like_copies_and_reductions_pay_their_combine() {
        // Closed forms on an A100 (2039 GB/s), without ramps: an element-wise kernel moves its
        // bytes at memory-efficiency; a row-wise normalisation too, plus reduction-overhead; a
        // reduction at reduction-memory-efficiency, plus reduction-overhead.
        let model = ComputeModel {
            memory_efficiency: 0.8,
            reduction_memory_efficiency: 0.4,
            reduction_half_time: SimDuration::ZERO,
            memory_half_time: SimDuration::ZERO,
            reduction_overhead: SimDuration::from_us(3),
            ..Default::default()
        };
        let seconds =
            |class, bytes| model.kernel_seconds(a100(), &KernelWork::flat(class, Dtype::Fp32, 0.0, bytes));
        for bytes in [1e3, 1e6, 1e9] {
            let copy = bytes / (2039e9 * 0.8);
            assert!((seconds(OpClass::Elementwise, bytes).unwrap() - copy).abs() < 1e-15);
            assert!((seconds(OpClass::Normalization, bytes).unwrap() - (copy + 3e-6)).abs() < 1e-15);
            let reduction = bytes / (2039e9 * 0.4) + 3e-6;
            assert!((seconds(OpClass::Reduction, bytes).unwrap() - reduction).abs() < 1e-15);
        }
        // The combine is work of the kernel, not launch: a kernel with nothing to move still
        // pays it, and with reduction-overhead 0 a normalisation is priced as a copy.
        assert!((seconds(OpClass::Reduction, 0.0).unwrap() - 3e-6).abs() < 1e-15);
        let plain = ComputeModel { reduction_overhead: SimDuration::ZERO, ..model.clone() };
        let work = KernelWork::flat(OpClass::Normalization, Dtype::Fp32, 0.0, 1e6);
        let copy = KernelWork::flat(OpClass::Elementwise, Dtype::Fp32, 0.0, 1e6);
        assert_eq!(
            plain.kernel_seconds(a100(), &work).unwrap(),
            plain.kernel_seconds(a100(), &copy).unwrap()
        );
        // A simulated kernel adds the launch overhead on top, rounded to picoseconds.
        let duration = model.work_duration(a100(), &work).unwrap();
        assert!((duration.as_ps() as f64 - ps(1e6 / (2039e9 * 0.8) + 3e-6 + 4e-6)).abs() <= 1.0);
    }

    #[test]
    fn the_ramp_exponent_spreads_the_curve_and_agrees_with_kernel_time() {
        let model = ComputeModel { gemm_ramp_exponent: 0.7, ..Default::default() };
        let hyperbola = ComputeModel::default();
        let half = model.gemm_half_work(a100(), Dtype::Fp16);
        // Half of the ceiling at the half point whatever the exponent; flatter on both sides.
        assert!((model.gemm_efficiency_at(a100(), Dtype::Fp16, half) - 0.4 * sustained()).abs() < 1e-12);
        assert!(
            model.gemm_efficiency_at(a100(), Dtype::Fp16, half / 100.0)
                > hyperbola.gemm_efficiency_at(a100(), Dtype::Fp16, half / 100.0)
        );
        assert!(
            model.gemm_efficiency_at(a100(), Dtype::Fp16, half * 100.0)
                < hyperbola.gemm_efficiency_at(a100(), Dtype::Fp16, half * 100.0)
        );
        // A compute-bound product's time is its FLOPs at that efficiency.
        let flops = 3.0 * half;
        let work = KernelWork {
            class: OpClass::Gemm,
            dtype: Dtype::Fp16,
            flops,
            bytes: 0.0,
            aligned: true,
            shape: KernelShape::Unknown,
        };
        let seconds = model.kernel_seconds(a100(), &work).unwrap();
        let expected = flops / (312e12 * model.gemm_efficiency_at(a100(), Dtype::Fp16, flops));
        assert!((seconds / expected - 1.0).abs() < 1e-12, "{seconds} vs {expected}");
    }

    #[test]
    fn zero_half_times_give_the_flat_roofline() {
        let flat = ComputeModel {
            gemm_efficiency: 0.6,
            gemm_half_time: SimDuration::ZERO,
            memory_efficiency: 0.7,
            memory_half_time: SimDuration::ZERO,
            ..Default::default()
        };
        let (flops, bytes) = (1e9, 1e6);
        let time = flat.duration(a100(), Dtype::Fp16, flops, bytes, OpClass::Gemm).unwrap();
        let expected = ps((flops / (312e12 * 0.6 * sustained())).max(bytes / (2039e9 * 0.7)) + 4e-6);
        assert!((time.as_ps() as f64 - expected).abs() <= 1.0, "{time} vs {expected} ps");
        assert_eq!(flat.gemm_efficiency_at(a100(), Dtype::Fp16, 1.0), 0.6 * sustained());
        assert_eq!(flat.memory_efficiency_at(a100(), 1.0), 0.7);
    }

    #[test]
    fn invalid_parameters_and_missing_dtypes_are_errors() {
        let device = a100();
        for (gemm, vector, memory) in
            [(0.0, 0.5, 0.7), (1.5, 0.5, 0.7), (0.6, 0.5, -0.1), (0.6, f64::NAN, 0.7)]
        {
            let model = ComputeModel {
                gemm_efficiency: gemm,
                vector_efficiency: vector,
                memory_efficiency: memory,
                ..Default::default()
            };
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
        let cpu = DeviceCatalog::builtin().get("xeon-8280-2s").unwrap();
        let error = model.duration(cpu, Dtype::Fp16, 0.0, 1.0, OpClass::Elementwise).unwrap_err();
        assert!(error.to_string().contains("no fp16 rate"), "{error}");
        let error = model.duration(device, Dtype::Fp16, -1.0, 1.0, OpClass::Gemm).unwrap_err().to_string();
        assert!(error.contains("flops"), "{error}");
        assert!(model.duration(device, Dtype::Fp16, 1e40, 0.0, OpClass::Gemm).is_err());
    }

    #[test]
    fn layer_durations_use_the_layer_cost_and_shape() {
        let model = ComputeModel::default();
        let resnet = crate::family::resnet50();
        let conv = resnet.layer("layer3.0.conv2").unwrap();
        let forward = model.layer_duration(a100(), Dtype::Fp16, conv, Pass::Forward, 256).unwrap();
        let mut work = KernelWork::flat(
            OpClass::Gemm,
            Dtype::Fp16,
            conv.cost.flops(Pass::Forward, 256),
            conv.cost.forward_bytes(256, Dtype::Fp16),
        );
        let flat = model.work_duration(a100(), &work).unwrap();
        work.shape = KernelShape::of_layer(conv, Pass::Forward, 256);
        assert_eq!(forward, model.work_duration(a100(), &work).unwrap());
        assert_ne!(forward, flat, "the shape decides the time on a device with execution data");
        // Without execution data (CPU nodes) the shape is ignored.
        let cpu = DeviceCatalog::builtin().get("xeon-8160-2s").unwrap();
        let on_cpu = model.layer_duration(cpu, Dtype::Fp32, conv, Pass::Forward, 8).unwrap();
        let flat_cpu = model
            .duration(
                cpu,
                Dtype::Fp32,
                conv.cost.flops(Pass::Forward, 8),
                conv.cost.forward_bytes(8, Dtype::Fp32),
                OpClass::Gemm,
            )
            .unwrap();
        assert_eq!(on_cpu, flat_cpu);
    }

    #[test]
    fn a_thin_product_read_along_k_runs_at_its_layout_rate() {
        let v100 = DeviceCatalog::builtin().get("v100-sxm2-16gb").unwrap();
        let model = ComputeModel { k_major_thin_gemm_efficiency: 0.8, ..Default::default() };
        let seconds = |model: &ComputeModel, dtype: Dtype, shape: GemmShape| {
            let bytes =
                (shape.m * shape.k + shape.k * shape.n + shape.m * shape.n) as f64 * dtype.bytes() as f64;
            let work = KernelWork {
                shape: KernelShape::Gemm(shape),
                ..KernelWork::flat(OpClass::Gemm, dtype, shape.flops(), bytes)
            };
            model.kernel_seconds(v100, &work).unwrap()
        };
        // DeepBench's `7680 x 16 x 2560`: `TN` reads A along k, `NN` along m.
        let (tn, nn) = (GemmLayout::blas(true, false), GemmLayout::blas(false, false));
        let thin = GemmShape::new(7680, 16, 2560);
        for (dtype, slower) in [(Dtype::Fp32, 1.0 / 0.8), (Dtype::Fp16, 1.0 + 0.25 * 2.0)] {
            let along_k = seconds(&model, dtype, thin.with_layout(tn));
            let along_m = seconds(&model, dtype, thin.with_layout(nn));
            assert!((along_k / along_m - slower).abs() < 1e-9, "{dtype:?}: {along_k} vs {along_m}");
            // The default has no layout effect, and neither has a product without a layout.
            let default = ComputeModel::default();
            assert_eq!(seconds(&default, dtype, thin.with_layout(tn)), seconds(&default, dtype, thin));
            assert_eq!(seconds(&model, dtype, thin), along_m);
        }
        // A wide product keeps its rate whatever its layout.
        let wide = GemmShape::new(7680, 1024, 2560);
        assert_eq!(seconds(&model, Dtype::Fp16, wide.with_layout(tn)), seconds(&model, Dtype::Fp16, wide));
    }

    #[test]
    fn tiles_and_waves_quantize_products() {
        let model = ComputeModel { gemm_wave_overhead: SimDuration::ZERO, ..Default::default() };
        let v100 = DeviceCatalog::builtin().get("v100-sxm2-16gb").unwrap();
        let seconds = |m: u64, n: u64, k: u64| {
            let shape = GemmShape::new(m, n, k);
            let work = KernelWork {
                shape: KernelShape::Gemm(shape),
                ..KernelWork::flat(OpClass::Gemm, Dtype::Fp16, shape.flops(), 0.0)
            };
            model.kernel_seconds(v100, &work).unwrap()
        };
        // 80 tiles of 256 x 128 fill the 80 SMs in one wave; one row more needs a second
        // wave of narrower tiles, and costs more than its share of FLOPs.
        let full = seconds(256 * 10, 128 * 8, 4096);
        let over = seconds(256 * 10 + 1, 128 * 8, 4096);
        assert!(over > full * 1.05, "{over} vs {full}");
        // One wave of the largest tile: the product runs at gemm-efficiency of the peak.
        let rate = 125e12 * 0.8;
        let expected = 2.0 * 256.0 * 10.0 * 1024.0 * 4096.0 / rate;
        assert!((full / expected - 1.0).abs() < 1e-9, "{full} vs {expected}");
        // Thin products run far below the peak: narrow tiles reuse their operands less.
        let thin = seconds(4096, 16, 4096);
        let thin_rate = 2.0 * 4096.0 * 16.0 * 4096.0 / thin;
        assert!(thin_rate < 0.4 * 125e12, "{thin_rate}");
        // Never faster for more work.
        let mut previous = 0.0;
        for m in (64..=4096).step_by(64) {
            let time = seconds(m, 1024, 1024);
            assert!(time >= previous, "m = {m}");
            previous = time;
        }
    }

    #[test]
    fn a_thin_convolution_runs_at_its_tile_occupancy() {
        // cuDNN's fp32 convolution tiles are 128 positions by at least 32 channels, so 16 output
        // channels fill half of each tile: the convolution takes as long as one with 32, and
        // runs at half its efficiency. Hand-computed: 3-D 3x3x3 convolutions of 64 channels
        // over 40x32x32 = 40,960 output positions are 320 tiles of 128x32, four full waves on
        // the V100's 80 SMs, each K = 64 * 27 = 1728 deep.
        let model = ComputeModel { gemm_wave_overhead: SimDuration::ZERO, ..Default::default() };
        let v100 = DeviceCatalog::builtin().get("v100-sxm2-16gb").unwrap();
        let peak = v100.peak(Dtype::Fp32).unwrap().per_second();
        let conv = |out_channels: u64, direction: ConvDirection| {
            let shape = crate::kernel_shape::ConvShape {
                batch: 1,
                in_channels: 64,
                out_channels,
                groups: 1,
                input: [42, 34, 34],
                output: [40, 32, 32],
                kernel: [3, 3, 3],
                stride: [1, 1, 1],
            };
            let flops = shape.implicit_gemm(ConvDirection::Forward, 1).flops();
            let work = KernelWork {
                shape: KernelShape::Conv { shape, direction },
                ..KernelWork::flat(OpClass::Gemm, Dtype::Fp32, flops, 0.0)
            };
            let seconds = model.kernel_seconds(v100, &work).unwrap();
            (flops / seconds / peak, seconds)
        };
        // The 128x32 tile's efficiency: vector-gemm-efficiency x u(128x32) / u(256x128),
        // u = r / (r + gemm-tile-half-intensity), r = rows x cols / (rows + cols).
        let u = |rows: f64, cols: f64| {
            let r = rows * cols / (rows + cols);
            r / (r + model.gemm_tile_half_intensity)
        };
        let full = 0.9 * u(128.0, 32.0) / u(256.0, 128.0);
        let (wide, wide_seconds) = conv(32, ConvDirection::Forward);
        let (thin, thin_seconds) = conv(16, ConvDirection::Forward);
        assert!((wide / full - 1.0).abs() < 1e-9, "{wide} vs {full}");
        assert!((thin / (full * 16.0 / 32.0) - 1.0).abs() < 1e-9, "{thin} vs {}", full / 2.0);
        assert!((thin_seconds / wide_seconds - 1.0).abs() < 1e-12);
        // cuBLAS and CUTLASS have 128x16 tiles: the same product as a plain GEMM wastes less.
        let gemm = GemmShape::new(40 * 32 * 32, 16, 64 * 27);
        let work = KernelWork {
            shape: KernelShape::Gemm(gemm),
            ..KernelWork::flat(OpClass::Gemm, Dtype::Fp32, gemm.flops(), 0.0)
        };
        assert!(model.kernel_seconds(v100, &work).unwrap() < 0.8 * thin_seconds);
        // Backward-weight (16 x 1728 x 40,960) may put the 128 on either side: its 16 rows fill
        // half of a 32-row tile, not an eighth of a 128-row one.
        let (wgrad, _) = conv(16, ConvDirection::BackwardWeight);
        assert!(wgrad > 0.3 && wgrad < 0.5, "{wgrad}");
    }

    #[test]
    fn tensor_core_convolutions_run_cudnn_tiles_channel_steps_and_forward_split() {
        let model = ComputeModel::default();
        let catalog = DeviceCatalog::builtin();
        let v100 = catalog.get("v100-sxm2-16gb").unwrap();
        let a100 = catalog.get("a100-sxm4-80gb").unwrap();
        let seconds = |device: &Device, dtype: Dtype, c: u64, k: u64, hw: u64, direction: ConvDirection| {
            let shape = crate::kernel_shape::ConvShape {
                batch: if hw < 14 { 1 } else { 8 },
                in_channels: c,
                out_channels: k,
                groups: 1,
                input: [hw, hw, 1],
                output: [hw, hw, 1],
                kernel: [1, 1, 1],
                stride: [1, 1, 1],
            };
            let flops = shape.implicit_gemm(ConvDirection::Forward, 1).flops();
            let work = KernelWork {
                shape: KernelShape::Conv { shape, direction },
                ..KernelWork::flat(OpClass::Gemm, dtype, flops, 0.0)
            };
            model.kernel_seconds(device, &work).unwrap()
        };
        let forward = ConvDirection::Forward;
        // Tensor Core kernels take 32 fp16 channels per filter tap and step: 16 input channels
        // cost what 32 do.
        let (sixteen, thirty_two) = (
            seconds(v100, Dtype::Fp16, 16, 256, 56, forward),
            seconds(v100, Dtype::Fp16, 32, 256, 56, forward),
        );
        assert!((sixteen / thirty_two - 1.0).abs() < 1e-12, "{sixteen} vs {thirty_two}");
        // cuDNN 7's narrowest Volta tile has 64 channels: 32 output channels cost what 64 do.
        // The A100's library has narrower tiles.
        let narrow = |device| seconds(device, Dtype::Fp16, 256, 32, 56, forward);
        let wide = |device| seconds(device, Dtype::Fp16, 256, 64, 56, forward);
        assert!((narrow(v100) / wide(v100) - 1.0).abs() < 1e-12);
        assert!(narrow(a100) < 0.9 * wide(a100));
        // A 1x1 layer with as many input as output channels is the same product forward and
        // backward-data; with few output tiles (one image of 7x7), the Tensor Core forward
        // kernel splits its reduction and backward-data cannot. The SIMT kernels split neither.
        let split = seconds(v100, Dtype::Fp16, 2048, 2048, 7, forward);
        let unsplit = seconds(v100, Dtype::Fp16, 2048, 2048, 7, ConvDirection::BackwardData);
        assert!(split < 0.8 * unsplit, "{split} vs {unsplit}");
        // The SIMT product takes the same time both ways; backward-data adds its two helper
        // kernels (`conv_helper_kernels`).
        let simt = seconds(v100, Dtype::Fp32, 2048, 2048, 7, forward);
        let helpers = 2.0 * model.launch_overhead.as_secs_f64();
        let simt_data = seconds(v100, Dtype::Fp32, 2048, 2048, 7, ConvDirection::BackwardData);
        assert!((simt_data - simt - helpers).abs() < 1e-12, "{simt} vs {simt_data}");
    }

    #[test]
    fn convolutions_pay_cudnns_helper_kernels() {
        let catalog = DeviceCatalog::builtin();
        let v100 = catalog.get("v100-sxm2-16gb").unwrap();
        let launch = |model: &ComputeModel| model.launch_overhead.as_secs_f64();
        let seconds_on = |device: &Device, model: &ComputeModel, dtype: Dtype, shape, direction| {
            let work = KernelWork {
                shape: KernelShape::Conv { shape, direction },
                ..KernelWork::flat(OpClass::Gemm, dtype, 1e9, 0.0)
            };
            model.kernel_seconds(device, &work).unwrap()
        };
        let seconds = |model: &ComputeModel, dtype: Dtype, shape, direction| {
            seconds_on(v100, model, dtype, shape, direction)
        };
        let conv = |c: u64, k: u64, hw: u64, kernel: u64| crate::kernel_shape::ConvShape {
            batch: 8,
            in_channels: c,
            out_channels: k,
            groups: 1,
            input: [hw, hw, 1],
            output: [hw, hw, 1],
            kernel: [kernel, kernel, 1],
            stride: [1, 1, 1],
        };
        let (forward, data, weight) =
            (ConvDirection::Forward, ConvDirection::BackwardData, ConvDirection::BackwardWeight);
        // Each helper costs a launch: a longer launch overhead moves backward-data by two of
        // them on the SIMT units, backward-weight by three, forward by none; on Tensor Cores
        // backward-data by one.
        let slow = ComputeModel { launch_overhead: SimDuration::from_us(10), ..ComputeModel::default() };
        let fast = ComputeModel::default();
        let extra = launch(&slow) - launch(&fast);
        let square = conv(512, 512, 14, 1);
        for (dtype, direction, helpers) in [
            (Dtype::Fp32, forward, 0.0),
            (Dtype::Fp32, data, 2.0),
            (Dtype::Fp32, weight, 3.0),
            (Dtype::Fp16, forward, 0.0),
            (Dtype::Fp16, data, 1.0),
            (Dtype::Fp16, weight, 0.0),
        ] {
            let moved = seconds(&slow, dtype, square, direction) - seconds(&fast, dtype, square, direction);
            assert!((moved - helpers * extra).abs() < 1e-12, "{dtype:?} {direction:?}: {moved}");
        }
        // The A100's Tensor Core kernels (cuDNN 8, no `conv-tiles` in the catalog) pay none.
        let a100 = catalog.get("a100-sxm4-80gb").unwrap();
        let moved = seconds_on(a100, &slow, Dtype::Fp16, square, data)
            - seconds_on(a100, &fast, Dtype::Fp16, square, data);
        assert!(moved.abs() < 1e-12, "{moved}");
        // In benchmark mode a 3x3 layer of few channels runs as the fused Winograd kernel,
        // which moves only its input, output and filter tiles through memory: with one helper
        // it beats the transforms through memory and their three.
        let bench = ComputeModel { winograd_convolutions: true, ..ComputeModel::default() };
        let small = conv(64, 64, 56, 3);
        let (product, elements) = small.fused_winograd(forward).unwrap();
        let (_, through_memory) = small.winograd(forward, 2);
        assert!(elements < 0.5 * through_memory);
        // The same 16 products, over the images there are (the nonfused layout rounds the batch
        // up to 16 images).
        let nonfused = small.winograd(forward, 2).0;
        assert_eq!((product.batch, product.n, product.k), (nonfused.batch, nonfused.n, nonfused.k));
        assert_eq!(product.m, small.batch * 28 * 28);
        assert!(small.fused_winograd(weight).is_none());
        let implicit = seconds(&fast, Dtype::Fp32, small, forward);
        assert!(seconds(&bench, Dtype::Fp32, small, forward) < 0.8 * implicit);
    }

    #[test]
    fn strided_backward_data_zeroes_the_input_gradient_first() {
        // A 1x1 stride-2 layer's backward-data computes the reached quarter of the input
        // positions; the rest of the input gradient is zero. On the SIMT units it is zeroed
        // first, a pass of its own over the whole input gradient (its memory time and a launch);
        // the Tensor Core kernels write the unreached three quarters from their own blocks
        // (their bytes at the memory's rate, no launch). A 3x3 stride-2 layer reaches every
        // position and pays none; its forward pays none.
        let catalog = DeviceCatalog::builtin();
        let model = ComputeModel::default();
        let conv = |kernel: u64| crate::kernel_shape::ConvShape {
            batch: 16,
            in_channels: 256,
            out_channels: 128,
            groups: 1,
            input: [56, 56, 1],
            output: [28, 28, 1],
            kernel: [kernel, kernel, 1],
            stride: [2, 2, 1],
        };
        let curves = model.curves();
        for (device, dtype) in [
            ("v100-sxm2-16gb", Dtype::Fp32),
            ("v100-sxm2-16gb", Dtype::Fp16),
            ("a100-sxm4-80gb", Dtype::Fp16),
            ("p100-pcie-16gb", Dtype::Fp16),
        ] {
            let device = catalog.get(device).unwrap();
            let seconds = |shape, direction| {
                let work = KernelWork {
                    shape: KernelShape::Conv { shape, direction },
                    ..KernelWork::flat(OpClass::Gemm, dtype, 1e9, 0.0)
                };
                model.kernel_seconds(device, &work).unwrap()
            };
            let pointwise = conv(1);
            let (whole, unreached) = pointwise.unreached_input_gradient(ConvDirection::BackwardData).unwrap();
            assert_eq!((whole, unreached), (16 * 256 * 56 * 56, 16 * 256 * (56 * 56 - 28 * 28)));
            assert_eq!(pointwise.unreached_input_gradient(ConvDirection::Forward), None);
            assert_eq!(conv(3).unreached_input_gradient(ConvDirection::BackwardData), None);
            let bytes = dtype.bytes() as f64;
            let zeroing = if device.execution.as_ref().unwrap().on_matrix_units(dtype) {
                unreached as f64 * bytes
                    / (device.memory_bandwidth.bytes_per_second() * model.memory_efficiency)
            } else {
                curves.memory_seconds(device, whole as f64 * bytes, OpClass::Gemm)
                    + model.launch_overhead.as_secs_f64()
            };
            // Without the zeroing, the same product over the reached positions: a layer whose
            // input is just the reached positions (28x28, stride 1) has the same implicit GEMM.
            let reached =
                crate::kernel_shape::ConvShape { input: [28, 28, 1], stride: [1, 1, 1], ..pointwise };
            assert_eq!(
                pointwise.implicit_gemm(ConvDirection::BackwardData, 1),
                reached.implicit_gemm(ConvDirection::BackwardData, 1)
            );
            let moved = seconds(pointwise, ConvDirection::BackwardData)
                - seconds(reached, ConvDirection::BackwardData);
            assert!((moved / zeroing - 1.0).abs() < 1e-9, "{dtype:?}: {moved} vs {zeroing}");
        }
    }

    #[test]
    fn first_layer_weight_gradients_split_until_they_fill_the_device() {
        // A first layer's 2-D backward-weight (64 filters x 3·3·3 taps over 8 images of
        // 224x224) is one SIMT output tile: 32 slices fill 32 of the V100's 80 multiprocessors,
        // 64 fill 64 of them, and the split goes on while the last count left some idle
        // (cuDNN's `*_stridedB_splitK_*` kernels: DeepBench's V100 times these layers at half
        // what 32 slices would take). On the P100's 56 multiprocessors 64 slices are two waves
        // of half-depth slices, no faster than 32. A 3-D backward-weight keeps 32 slices.
        let catalog = DeviceCatalog::builtin();
        let model = ComputeModel { launch_overhead: SimDuration::ZERO, ..ComputeModel::default() };
        let first = |depth: u64| crate::kernel_shape::ConvShape {
            batch: 8,
            in_channels: 3,
            out_channels: 64,
            groups: 1,
            input: [224, 224, depth],
            output: [224, 224, depth],
            kernel: [3, 3, if depth > 1 { 3 } else { 1 }],
            stride: [1, 1, 1],
        };
        let seconds = |device: &str, shape| {
            let work = KernelWork {
                shape: KernelShape::Conv { shape, direction: ConvDirection::BackwardWeight },
                ..KernelWork::flat(OpClass::Gemm, Dtype::Fp32, 1e9, 0.0)
            };
            model.kernel_seconds(catalog.get(device).unwrap(), &work).unwrap()
        };
        let curves = model.curves();
        // Backward-weight tries both orientations of cuDNN's SIMT tiles.
        let both: Vec<[u32; 2]> = CONV_VECTOR_TILES
            .iter()
            .flat_map(|&[rows, columns]| [[rows, columns], [columns, rows]])
            .collect();
        let v100 = catalog.get("v100-sxm2-16gb").unwrap();
        let peak = v100.peak(Dtype::Fp32).unwrap().per_second();
        let gemm = first(1).implicit_gemm(ConvDirection::BackwardWeight, 1);
        let up_to =
            |slices| curves.tiled_seconds(v100, &gemm, peak, 0.9, 1, &both, Split::UpTo(slices)).unwrap();
        let split = seconds("v100-sxm2-16gb", first(1));
        assert!((split / up_to(64) - 1.0).abs() < 1e-9, "{split} vs {}", up_to(64));
        assert!(split < 0.6 * up_to(32), "{split} vs {}", up_to(32));
        // The 3-D layer (8 deep) keeps the 32-slice limit.
        let deep = seconds("v100-sxm2-16gb", first(8));
        let deep_gemm = first(8).implicit_gemm(ConvDirection::BackwardWeight, 1);
        let deep_up_to_32 =
            curves.tiled_seconds(v100, &deep_gemm, peak, 0.9, 1, &both, Split::UpTo(32)).unwrap();
        assert!((deep / deep_up_to_32 - 1.0).abs() < 1e-9, "{deep} vs {deep_up_to_32}");
        // The P100: filling splits change nothing there.
        let p100 = catalog.get("p100-pcie-16gb").unwrap();
        let p100_peak = p100.peak(Dtype::Fp32).unwrap().per_second();
        let p100_32 = curves.tiled_seconds(p100, &gemm, p100_peak, 0.9, 1, &both, Split::UpTo(32)).unwrap();
        let p100_split = seconds("p100-pcie-16gb", first(1));
        assert!((p100_split / p100_32 - 1.0).abs() < 1e-9, "{p100_split} vs {p100_32}");
    }

    #[test]
    fn vector_unit_convolutions_may_use_winograd() {
        let model = ComputeModel { winograd_convolutions: true, ..ComputeModel::default() };
        let catalog = DeviceCatalog::builtin();
        let v100 = catalog.get("v100-sxm2-16gb").unwrap();
        let conv = crate::layer::Layer::new(
            "conv",
            crate::layer::LayerKind::conv2d(256, 3, 1, 1),
            crate::layer::Shape::from([256, 28, 28]),
        )
        .unwrap();
        let shape = KernelShape::of_layer(&conv, Pass::Forward, 16);
        let KernelShape::Conv { shape: conv_shape, .. } = shape else { panic!() };
        let flops = conv.cost.flops(Pass::Forward, 16);
        let implicit =
            KernelShape::Gemm(conv_shape.implicit_gemm(crate::kernel_shape::ConvDirection::Forward, 1));
        let fp32 = |shape| {
            let work = KernelWork { shape, ..KernelWork::flat(OpClass::Gemm, Dtype::Fp32, flops, 0.0) };
            model.kernel_seconds(v100, &work).unwrap()
        };
        // Winograd beats the implicit GEMM of a 3x3 convolution on the fp32 units.
        assert!(fp32(shape) < 0.8 * fp32(implicit), "{} vs {}", fp32(shape), fp32(implicit));
    }

    #[test]
    fn winograd_through_memory_prices_a_batch_of_eight_as_sixteen() {
        // DeepBench's V100 fp32 layer of 512 channels at 14x14: 437 us forward at 8 images,
        // 506 at 16 (cuDNN's F(4x4, 3x3) through memory both times); backward-weight, whose
        // kernels reduce over the images there are, 278 and 477 us.
        let model = ComputeModel { winograd_convolutions: true, ..ComputeModel::default() };
        let catalog = DeviceCatalog::builtin();
        let v100 = catalog.get("v100-sxm2-16gb").unwrap();
        let conv = crate::layer::Layer::new(
            "conv",
            crate::layer::LayerKind::conv2d(512, 3, 1, 1),
            crate::layer::Shape::from([512, 14, 14]),
        )
        .unwrap();
        let seconds = |pass, batch| {
            let work = KernelWork {
                shape: KernelShape::of_layer(&conv, pass, batch),
                ..KernelWork::flat(OpClass::Gemm, Dtype::Fp32, conv.cost.flops(pass, batch), 0.0)
            };
            model.kernel_seconds(v100, &work).unwrap()
        };
        for pass in [Pass::Forward, Pass::BackwardData] {
            let (eight, sixteen) = (seconds(pass, 8), seconds(pass, 16));
            // Without the image groups 8 images took 0.58 of 16's time (309 against 536 us).
            assert!(eight > 0.7 * sixteen && eight < sixteen, "{pass:?}: {eight} vs {sixteen}");
            assert!(eight > 350e-6 && eight < 500e-6, "{pass:?}: {eight}");
        }
        let (eight, sixteen) = (seconds(Pass::BackwardWeight, 8), seconds(Pass::BackwardWeight, 16));
        assert!(eight < 0.65 * sixteen, "{eight} vs {sixteen}");
    }

    #[test]
    fn large_stride_one_filters_may_run_as_ffts() {
        let catalog = DeviceCatalog::builtin();
        let v100 = catalog.get("v100-sxm2-16gb").unwrap();
        // GoogLeNet's 5x5 layer of DeepBench's table: 16 images of 28x28, 192 -> 32 channels.
        let layer = |stride| {
            crate::layer::Layer::new(
                "conv",
                crate::layer::LayerKind::conv2d(32, 5, stride, 2),
                crate::layer::Shape::from([192, 28, 28]),
            )
            .unwrap()
        };
        let seconds = |model: &ComputeModel, layer: &crate::layer::Layer, pass| {
            let work = KernelWork {
                shape: KernelShape::of_layer(layer, pass, 16),
                ..KernelWork::flat(OpClass::Gemm, Dtype::Fp32, layer.cost.flops(pass, 16), 0.0)
            };
            model.kernel_seconds(v100, &work).unwrap()
        };
        let find = ComputeModel { winograd_convolutions: true, ..ComputeModel::default() };
        let heuristics = ComputeModel::default();
        for pass in [Pass::Forward, Pass::BackwardData, Pass::BackwardWeight] {
            // Every direction of the stride-1 layer is faster as an FFT (DeepBench measured
            // 189-197 us; the implicit GEMM takes over 300).
            let (fft, direct) = (seconds(&find, &layer(1), pass), seconds(&heuristics, &layer(1), pass));
            assert!(fft < 0.8 * direct && fft > 150e-6 && fft < 260e-6, "{pass:?}: {fft} vs {direct}");
            // A strided layer has no FFT.
            assert_eq!(seconds(&find, &layer(2), pass), seconds(&heuristics, &layer(2), pass));
        }
        let KernelShape::Conv { shape, .. } = KernelShape::of_layer(&layer(1), Pass::Forward, 16) else {
            panic!()
        };
        // 32x32 transforms of the 32x32 padded input: one tile per image, 32 x 17 frequencies.
        let (product, _) = shape.fft(crate::kernel_shape::ConvDirection::Forward, 32).unwrap();
        assert_eq!((product.batch, product.m, product.n, product.k), (544, 16, 32, 192));
        // 16x16 transforms give 12 outputs per axis: 3 x 3 tiles per image.
        let (product, _) = shape.fft(crate::kernel_shape::ConvDirection::BackwardWeight, 16).unwrap();
        assert_eq!((product.batch, product.m, product.n, product.k), (144, 32, 192, 16 * 9));
        assert!(shape.fft(crate::kernel_shape::ConvDirection::Forward, 4).is_none());
    }

    /// Fused Adam over 1 B parameters in 400 tensors, fp16 gradients and weights beside the
    /// fp32 master copy: the base of the optimizer tests.
    fn mixed_precision_adam() -> OptimizerStep {
        OptimizerStep {
            optimizer: Optimizer::Adam,
            parameters: 1_000_000_000,
            tensors: 400,
            fused: true,
            gradient_bytes: 2,
            widths: StepWidths::MIXED,
            passes: OptimizerPasses::Fused,
        }
    }

    #[test]
    fn optimizer_steps_are_memory_bound_and_fusing_saves_launches() {
        let model = ComputeModel::default();
        let adam = mixed_precision_adam();
        // 4 + 8 + 2 read, 4 + 8 + 2 written.
        assert_eq!(adam.bytes_per_parameter(), 28);
        let fused = model.optimizer_step_duration(a100(), &adam).unwrap().as_secs_f64();
        let streaming = 28e9 / (2039e9 * 0.8);
        assert!(fused > streaming && fused < streaming * 1.01, "{fused} vs {streaming}");
        let per_tensor = model
            .optimizer_step_duration(a100(), &OptimizerStep { fused: false, ..adam })
            .unwrap()
            .as_secs_f64();
        // 399 more launches and memory ramps: 399 x (4 us + 1.25 us).
        assert!((per_tensor - fused - 399.0 * 5.25e-6).abs() < 1e-6, "{per_tensor} vs {fused}");
        let sgd =
            OptimizerStep { optimizer: Optimizer::Sgd, gradient_bytes: 4, widths: StepWidths::FP32, ..adam };
        assert_eq!(sgd.bytes_per_parameter(), 12);
        assert_eq!(
            model.optimizer_step_duration(a100(), &OptimizerStep { parameters: 0, ..adam }).unwrap(),
            SimDuration::ZERO
        );
    }

    /// PyTorch's for-loop AdamW (`_single_tensor_adamw`): nine operators per tensor, 88 bytes
    /// per parameter with fp32 gradients; on many small tensors each kernel waits for the host
    /// to issue it, on few large ones the step streams memory.
    #[test]
    fn for_loop_adam_runs_nine_kernels_per_tensor_at_the_hosts_pace() {
        let model = ComputeModel::default();
        let adam = OptimizerStep {
            gradient_bytes: 4,
            widths: StepWidths::FP32,
            passes: OptimizerPasses::ForLoop,
            ..mixed_precision_adam()
        };
        let operators = adam.for_loop_operators();
        assert_eq!(operators.len(), 9);
        assert_eq!(operators.iter().sum::<u64>(), 88);
        let kernels = adam.kernels();
        assert_eq!(kernels.iter().map(|k| k.kernels).sum::<u64>(), 9 * 400);
        // 1 B parameters in 400 tensors (2.5 M elements a kernel): each operator's kernel
        // streams its bytes and pays the launch and the memory ramp (4 us + 1.25 us), or waits
        // for the host's 18.5 us where that is longer (the 8-byte operators: 17.5 us).
        let looped = model.optimizer_step_duration(a100(), &adam).unwrap().as_secs_f64();
        let host = model.host_cost_per_kernel().as_secs_f64();
        let expected: f64 = operators
            .iter()
            .map(|&bytes| 400.0 * (bytes as f64 * 2.5e6 / (2039e9 * 0.8) + 5.25e-6).max(host))
            .sum();
        assert!((looped - expected).abs() < 1e-3 * expected, "{looped} vs {expected}");
        let fused = model.optimizer_step_duration(a100(), &mixed_precision_adam()).unwrap().as_secs_f64();
        assert!(looped > 2.0 * fused, "{looped} vs {fused}");
        // 124 M parameters in 148,000 tensors: 840 elements a kernel, each one host issue.
        let tiny = OptimizerStep { parameters: 124_000_000, tensors: 148_000, ..adam };
        let seconds = model.optimizer_step_duration(a100(), &tiny).unwrap().as_secs_f64();
        let issued = 9.0 * 148_000.0 * model.host_cost_per_kernel().as_secs_f64();
        assert!((seconds - issued).abs() < 1e-9 * issued.max(1.0) + 1e-6, "{seconds} vs {issued}");
        // Under CUDA graphs nothing is issued per kernel: the GPU time alone.
        let graphed = ComputeModel { cuda_graphs: true, ..ComputeModel::default() };
        assert!(graphed.optimizer_step_duration(a100(), &tiny).unwrap().as_secs_f64() < seconds);
        // SGD with momentum: three operators, 8 + 12 + 12 bytes.
        let sgd = OptimizerStep { optimizer: Optimizer::SgdMomentum, ..adam };
        assert_eq!(sgd.for_loop_operators(), vec![8, 12, 12]);
    }

    /// LARS on ResNet-50 in mixed precision: the momentum update's fused kernel (as SGD with
    /// momentum, 4 more FLOPs aside), then two norm passes of 3 `multi_sum_sq` launches each
    /// (25.6 M parameters over 32768 x 320 elements per launch) reading 2 bytes per parameter,
    /// a global reduction after each, and the per-layer rates (`multi_lars`): 3 kernels of
    /// next to no work, each the launch overhead and the memory ramp.
    #[test]
    fn lars_adds_its_norm_passes_and_scalar_kernels() {
        let model = ComputeModel::default();
        let momentum = OptimizerStep {
            optimizer: Optimizer::SgdMomentum,
            parameters: 25_557_032,
            tensors: 161,
            fused: true,
            gradient_bytes: 2,
            widths: StepWidths::MIXED,
            passes: OptimizerPasses::Fused,
        };
        let lars = OptimizerStep { optimizer: Optimizer::Lars, ..momentum };
        assert_eq!(lars.bytes_per_parameter(), momentum.bytes_per_parameter());
        assert_eq!(lars.lars_norm_passes(), vec![(2, 3), (2, 3)]);
        assert!(momentum.lars_norm_passes().is_empty());
        let time = |step: &OptimizerStep| model.optimizer_step_duration(a100(), step).unwrap().as_secs_f64();
        let work = |flops: f64, bytes: f64| {
            model
                .work_duration(a100(), &KernelWork::flat(OpClass::Elementwise, Dtype::Fp32, flops, bytes))
                .unwrap()
                .as_secs_f64()
        };
        let update = work(5.0 * 25_557_032.0, momentum.bytes_per_parameter() as f64 * 25_557_032.0);
        let share = 25_557_032.0 / 3.0;
        let pass = 3.0 * work(2.0 * share, 2.0 * share);
        let scalar = work(161.0, 12.0 * 161.0);
        let expected = update + 2.0 * pass + 3.0 * scalar;
        assert!((time(&lars) - expected).abs() < 1e-9, "{} vs {expected}", time(&lars));
        // Every kernel costs at least the launch overhead: LARS is at least 9 launches and
        // two reads of the weights' and gradients' compute copies slower.
        let reads = 2.0 * 2.0 * 25_557_032.0 / 2039e9;
        assert!(time(&lars) - time(&momentum) > 9.0 * 4e-6 + reads, "{} vs {}", time(&lars), time(&momentum));
    }

    /// Megatron-LM's mixed-precision passes around Adam (`OptimizerPasses::Megatron`): the
    /// step reads the fp32 main gradient (4 + 4 + 8 read, 4 + 8 written), then the cast of the
    /// fp16 gradients (2 + 4, one kernel per tensor), the unscale (4 + 4), the norm (4) and the
    /// copy to the fp16 weights (4 + 2): 52 bytes per parameter against the fused 28.
    #[test]
    fn megatron_optimizer_passes_move_52_bytes_per_parameter() {
        let model = ComputeModel::default();
        let fused = mixed_precision_adam();
        let megatron = OptimizerStep { passes: OptimizerPasses::Megatron, ..fused };
        assert_eq!(megatron.bytes_per_parameter(), 28);
        assert_eq!(megatron.extra_passes(), vec![(400, 6, 0.0), (1, 8, 1.0), (1, 4, 2.0), (1, 6, 0.0)]);
        let total: u64 = megatron.bytes_per_parameter()
            + megatron.extra_passes().iter().map(|&(_, bytes, _)| bytes).sum::<u64>();
        assert_eq!(total, 52);
        let seconds =
            |step: &OptimizerStep| model.optimizer_step_duration(a100(), step).unwrap().as_secs_f64();
        // Streaming 24 more bytes per parameter, plus 403 more launches and memory ramps.
        let more = seconds(&megatron) - seconds(&fused);
        let expected = 24e9 / (2039e9 * 0.8) + 403.0 * 5.25e-6;
        assert!((more / expected - 1.0).abs() < 0.01, "{more} vs {expected}");
        // fp32 training (Megatron's FP32Optimizer): the norm only, 4 bytes.
        let fp32 = OptimizerStep { gradient_bytes: 4, widths: StepWidths::FP32, ..megatron };
        assert_eq!(fp32.bytes_per_parameter(), 28);
        assert_eq!(fp32.extra_passes(), vec![(1, 4, 2.0)]);
        assert!(OptimizerStep { passes: OptimizerPasses::Fused, ..fp32 }.extra_passes().is_empty());
    }

    /// Megatron's fp32 loss in fp16 training: its fp32 kernels price at 4 bytes per element and
    /// the two casts run; in fp32 training the casts do not run.
    #[test]
    fn megatron_loss_casts_run_only_below_fp32() {
        use crate::layer::{LayerKind, LossKernels, Shape};
        let model = ComputeModel::default();
        let loss = Layer::new(
            "loss",
            LayerKind::CrossEntropy { kernels: LossKernels::Megatron },
            Shape::from([2048, 51200]),
        )
        .unwrap();
        let works = |dtype| layer_kernel_works(&loss, Pass::Forward, 1, dtype, false);
        let (half, single) = (works(Dtype::Fp16), works(Dtype::Fp32));
        assert_eq!((half.len(), single.len()), (6, 5));
        let n = 2048.0 * 51200.0;
        // The cast reads 2 bytes and writes 4; exp reads and writes 4, in fp32.
        assert_eq!(half[0].bytes, 6.0 * n);
        assert_eq!(half[3].bytes, 8.0 * n);
        let bytes = |works: &[KernelWork]| works.iter().map(|w| w.bytes).collect::<Vec<f64>>();
        assert_eq!(bytes(&half[1..]), bytes(&single));
        let seconds = |dtype| model.layer_duration(a100(), dtype, &loss, Pass::BackwardData, 1).unwrap();
        assert!(seconds(Dtype::Fp16) > seconds(Dtype::Fp32));
    }

    /// The kernels eager PyTorch launches per pass, as the H200 traces count them: nanoGPT's
    /// math attention runs `bmm`, `mul`, `masked_fill`, the cast up, `softmax`, the cast down
    /// and `bmm` forward (7); a flash core one kernel forward and three backward (cuDNN's
    /// `compute_dot_do_o`, the main kernel, `convert_dq_to_16bits`); a biased linear layer's
    /// weight gradient `mm` and the bias's `sum`; autocast's casts are kernels of their own;
    /// in fp32 no cast runs.
    #[test]
    fn launched_kernels_count_what_eager_pytorch_runs() {
        use crate::layer::{AttentionKernel, LayerKind, Shape};
        let core = |implementation| crate::layer::gpt2_attention_core("core", implementation);
        let count = launched_kernels;
        let math = core(AttentionKernel::Math);
        assert_eq!(count(&math, Pass::Forward, Dtype::Bf16, true), 7);
        // Four gradient products, the casts' and the softmax's backward, the mask's and scale's.
        assert_eq!(count(&math, Pass::BackwardData, Dtype::Bf16, true), 9);
        // In fp32 the two casts do not run.
        assert_eq!(count(&math, Pass::Forward, Dtype::Fp32, false), 5);
        let flash = core(AttentionKernel::Flash);
        assert_eq!(count(&flash, Pass::Forward, Dtype::Bf16, true), 1);
        assert_eq!(count(&flash, Pass::BackwardData, Dtype::Bf16, true), 3);
        let fc = |bias| {
            Layer::new("fc", LayerKind::Linear { out_features: 3072, bias }, Shape::from([1024, 768]))
                .unwrap()
        };
        assert_eq!(count(&fc(true), Pass::BackwardWeight, Dtype::Bf16, false), 2);
        assert_eq!(count(&fc(false), Pass::BackwardWeight, Dtype::Bf16, false), 1);
        assert_eq!(count(&fc(true), Pass::BackwardData, Dtype::Bf16, false), 1);
        // Autocast: the weight's and the bias's casts before the product, their gradients' after.
        assert_eq!(count(&fc(true), Pass::Forward, Dtype::Bf16, true), 3);
        assert_eq!(count(&fc(true), Pass::BackwardWeight, Dtype::Bf16, true), 4);
        assert_eq!(count(&fc(true), Pass::Forward, Dtype::Fp32, true), 1);
    }

    /// A flash core's backward is three kernels, as run 7 on the H200 timed them at 16,384
    /// tokens of 16 heads of 128 (data/measurements/h200-2026-12-04/run7-results.jsonl):
    /// `compute_dot_do_o` 66-70 us and `convert_dq_to_16bits` 56-60 us over the grid's lengths,
    /// beside the main kernel. The helpers are memory-bound kernels of their bytes: the
    /// conversion (6 bytes per query element) is priced within 10% of its time; the row sums of
    /// `dO * O` (4 bytes per element read) run at half the streaming rate the model gives them.
    #[test]
    fn a_flash_backward_runs_its_two_helper_kernels_at_their_bytes() {
        use crate::layer::{AttentionKernel, LayerKind, Shape};
        let kind = LayerKind::Attention {
            heads: 16,
            kv_heads: 16,
            causal: true,
            implementation: AttentionKernel::Flash,
            dropout: false,
            value_head_dim: None,
        };
        let core = Layer::new("core", kind, Shape::from([4096, 3 * 2048])).unwrap();
        let works = layer_kernel_works(&core, Pass::BackwardData, 4, Dtype::Bf16, false);
        assert_eq!(works.len(), 3);
        assert_eq!(
            (works[0].class, works[1].class, works[2].class),
            (OpClass::Elementwise, OpClass::Gemm, OpClass::Elementwise)
        );
        let elements = 4.0 * 4096.0 * 2048.0;
        assert_eq!(works[2].bytes, 6.0 * elements);
        let h200 = DeviceCatalog::builtin().get("h200-sxm-141gb").unwrap();
        let us = |work: &KernelWork| {
            ComputeModel::default().work_duration(h200, work).unwrap().as_secs_f64() * 1e6
        };
        let (dot, convert) = (us(&works[0]), us(&works[2]));
        eprintln!("priced: dot(dO, O) {dot:.1} us (measured 66-70), dQ conversion {convert:.1} us (56-60)");
        assert!((convert / 57.0 - 1.0).abs() < 0.1, "{convert} us");
        assert!(dot > 0.4 * 68.0 && dot < 68.0, "{dot} us");
        // Forward: one kernel.
        assert_eq!(layer_kernel_works(&core, Pass::Forward, 4, Dtype::Bf16, false).len(), 1);
    }

    /// `flash-attention-efficiency` slows a flash core's compute-bound products by its
    /// inverse and leaves a standard core's cuBLAS products alone.
    #[test]
    fn flash_attention_efficiency_prices_only_fused_attention() {
        use crate::layer::{AttentionKernel, LayerKind, Shape};
        let core = |implementation| {
            let kind = LayerKind::Attention {
                heads: 32,
                kv_heads: 32,
                causal: true,
                implementation,
                dropout: false,
                value_head_dim: None,
            };
            Layer::new("core", kind, Shape::from([16384, 3 * 4096])).unwrap()
        };
        let slow = ComputeModel { flash_attention_efficiency: 0.5, ..ComputeModel::default() };
        let seconds = |model: &ComputeModel, implementation, pass| {
            model.layer_duration(a100(), Dtype::Bf16, &core(implementation), pass, 2).unwrap().as_secs_f64()
        };
        for pass in [Pass::Forward, Pass::BackwardData] {
            let (fast, halved) = (
                seconds(&ComputeModel::default(), AttentionKernel::Flash, pass),
                seconds(&slow, AttentionKernel::Flash, pass),
            );
            // Compute-bound at 16k tokens: nearly twice the time; the launch and the waves'
            // fixed prologue and epilogue (`gemm-wave-overhead`) do not scale.
            assert!(halved > 1.7 * fast && halved < 2.0 * fast, "{pass:?}: {fast} -> {halved}");
            assert_eq!(
                seconds(&ComputeModel::default(), AttentionKernel::Standard, pass),
                seconds(&slow, AttentionKernel::Standard, pass)
            );
        }
        let knob = knobs::knob("flash-attention-efficiency").unwrap();
        assert_eq!(knob.get(&ComputeModel::default()), knobs::KnobValue::Number(1.0));
    }

    #[test]
    fn scenario_files_can_override_parameters() {
        let model: ComputeModel = toml::from_str(
            "gemm-efficiency = 0.5\nlaunch-overhead = \"2 us\"\ngemm-half-time = \"5 us\"\nmemory-half-time = \"0 s\"\nvector-efficiency = 0.25",
        )
        .unwrap();
        assert_eq!(model.gemm_efficiency, 0.5);
        assert_eq!(model.memory_efficiency, 0.8);
        assert_eq!(model.launch_overhead, SimDuration::from_us(2));
        assert_eq!(model.gemm_half_time, SimDuration::from_us(5));
        assert_eq!(model.memory_half_time, SimDuration::ZERO);
        assert_eq!(model.vector_efficiency, 0.25);
        assert!(toml::from_str::<ComputeModel>("gemm-eff = 0.5").is_err());
        assert!(toml::from_str::<ComputeModel>("gemm-half-time = 3").is_err(), "a bare number needs a unit");
    }
}
