//! The work of one profiled PyTorch operator: FLOPs, bytes of device memory, operation class
//! and the dtype that decides its rate, from the argument shapes and element types a profiler
//! (Kineto) trace records.
//!
//! `parasim calibrate` fits the [compute model](crate::compute)'s efficiencies to measured
//! kernels; this module says how much work each measured operator did. A trace records each
//! argument's sizes (`Input Dims`) and element type (`Input type`) but not argument values
//! (strides, the dims to reduce, flags), so every formula works from shapes alone, and says
//! below what it assumes when a value would matter.
//!
//! ```
//! use workloads::Dtype;
//! use workloads::aten::{OperatorCall, operator_work};
//!
//! let dims = [Some(vec![1024, 512]), Some(vec![512, 256])];
//! let types = [Some("c10::BFloat16".to_string()), Some("c10::BFloat16".to_string())];
//! let call = OperatorCall { name: "aten::mm", dims: &dims, types: &types, kernel_names: &[] };
//! let work = operator_work(&call)?;
//! assert_eq!((work.flops, work.dtype), (2.0 * 1024.0 * 512.0 * 256.0, Dtype::Bf16));
//! # Ok::<(), workloads::aten::Uncosted>(())
//! ```
//!
//! # Conventions
//!
//! - B(x) is the bytes of tensor `x`: elements times element size (float 4, double 8, half and
//!   bfloat16 2, long 8, int 4, short 2, bool, char and fp8 1). A zero-dim tensor has one
//!   element; scalars, None and lists of numbers move nothing.
//! - Bytes are the compulsory traffic of a straightforward kernel: each tensor it reads counted
//!   once, each output written once, tiles re-read from cache not counted.
//! - Rate dtype. GEMM class: the first product operand's dtype (half -> fp16, bfloat16 -> bf16,
//!   double -> fp64, float -> fp32, or tf32 when a launched kernel is a TF32 tensor-core kernel:
//!   its name contains `tf32` (cuBLAS/cuDNN `sm80_xmma_gemm_f32f32_tf32f32_f32...`) or an fp32
//!   tensor-op tile, `s1688gemm` or `s16816gemm` (CUTLASS `cutlass_80_tensorop_s1688gemm_...`,
//!   cuBLAS `ampere_s16816gemm_...`: single-precision operands on the 16x8x8 / 16x8x16 MMA,
//!   which only TF32 provides); integer
//!   products are unsupported. Element-wise and reduction classes: fp64 if an input is double,
//!   else fp32, whatever the storage (the compute model runs them at the fp32 rate).
//! - An out-of-place element-wise result has the widest floating type of the inputs with
//!   dimensions (else their widest integer type), approximately PyTorch's type promotion.
//!
//! # Formulas
//!
//! GEMM class (b: batch, 1 for mm; out in the first operand's dtype). A product that launched
//! further kernels (split-K reduction, bias epilogue) has one element-wise pass per further
//! kernel, reading and writing out once ([`operator_kernels`]):
//! ```text
//! mm A[M,K]·B[K,N], bmm [b,M,K]·[b,K,N], mv [M,K]·[K]   flops 2bMKN        bytes B(A)+B(B)+B(out)
//! addmm, baddbmm, addmv: + an input broadcast onto out   flops + bMN        bytes + B(input)
//! convolution_backward(g[N,O,*out], x[N,C,*in], w[O,C/g,*k], ...)
//!     MACs = N·prod(out)·O·(C/g)·prod(k) = N·prod(out)·elements(w) per gradient
//!     flops 2·2·MACs (input and weight gradients: output_mask is not recorded)
//!     bytes B(g) + 2B(x) + 2B(w) (the bias gradient is negligible)
//!     `transposed` is not recorded: non-transposed unless only the transposed layout
//!     w[C,O/g,*k] fits the shapes, then prod(in) replaces prod(out)
//! attention q[b,h,s,d], k[b,h_k,s_k,d], v[b,h_k,s_k,d_v] ([b,s,h,d] for the kernel-level
//!     _flash_/_efficient_attention ops): flops 2·b·h·s·s_k·(d + d_v), i.e. 4bhs·s_k·d
//!     forward bytes B(q)+B(k)+B(v)+B(out); backward: 2.5x the forward FLOPs (Dao 2023,
//!     FlashAttention-2, section 4.1), reads grad_out, q, k, v, out, writes dq, dk, dv.
//!     No causal mask assumed: the flag is not recorded (a causal kernel does about half).
//! ```
//! Element-wise class (out: the numpy broadcast of the tensor inputs, n: its elements):
//! ```text
//! arithmetic, activations, their backward kernels    flops n   bytes all inputs + B(out)
//!     1 FLOP per element for every op, transcendental ones too: all are memory-bound
//! in place (add_, relu_, ...): out is the first input, written in its own dtype
//! an out= tensor (the .out variants: a tensor argument after the functional form's
//!     positional arguments, `mul.out(self, other, *, out)`): written in its own dtype, not read
//! comparisons and logical ops: out is bool, 1 byte per element
//! copy_(self, src)            flops 0   bytes B(src) + B(self), each in its own dtype
//! fill_, zero_                flops 0   bytes B(self)
//! clone, contiguous, to, _to_copy     flops 0   bytes 2B(input) (output dtype not recorded:
//!                                               assumed the input's)
//! dropout, native_dropout     flops n   bytes 2B(input) + n (a one-byte mask)
//! embedding(w, idx), index_select(x, dim, idx): rows along dim 0 (dim is not recorded)
//!                             flops 0   bytes B(idx) + 2·elements(idx)·bytes of a row
//! gather(x, dim, idx)         flops 0   bytes B(idx) + 2·elements(idx)·element size of x
//! scatter_add_, index_add_(self, dim, index, src): flops elements(src),
//!                             bytes B(index) + B(src) + elements(src)·element size of self
//! ```
//! Reduction class (n: input elements):
//! ```text
//! sum, mean, amax, max, norm, var, prod, argmax, ...   flops n   bytes B(input)
//!     the reduced dims are not recorded: the output is counted negligible. The launched
//!     kernel's name tells some of them (`reduce_kernel<threads, output vector width, ...>`,
//!     PyTorch's `Reduce.cuh`): a width above 1 means a 2-D input `[rows, columns]` reduced
//!     over its rows; a 1-D input is reduced whole. Those get a `KernelShape::Reduction`,
//!     whose launch the compute model prices (docs/compute-model.md, "Kernel time")
//! ```
//! Normalization class (row-wise: one block or warp per row, [`OpClass::Normalization`]):
//! ```text
//! softmax, log_softmax     flops 5n (max, subtract, exp, sum, divide)    bytes 2B(input)
//! their _backward_data     flops 4n (multiply, sum, subtract, multiply)  bytes 2B(grad) + B(out)
//! native_layer_norm        flops 8n   bytes B(x)+B(w)+B(bias)+B(out) + 2 fp32 statistics a row
//! _fused_rms_norm, rms_norm flops 6n  bytes B(x)+B(w)+B(out) + 1 fp32 statistic a row
//!     rows = n / elements(w), or n / the last dim without a weight (normalized_shape is a value)
//! their backward: flops 2x forward; reads grad_out, input, statistics, weight; writes
//!     grad_input, grad_weight (and grad_bias)
//! ```
//! Reduction class again (statistics across rows or positions):
//! ```text
//! batch norm: training assumed (the flag is not recorded). Reads the input twice (statistics,
//!     then normalise) and the parameters and running statistics once, writes the output;
//!     flops 8n. Backward: reads grad_out and input twice, writes grad_input, grad_weight,
//!     grad_bias; flops 16n
//! pooling backward         flops n   bytes every tensor argument + B(grad_input)
//! nll_loss forward and backward (and 2d): one element gathered and one written per target:
//!                          flops t   bytes B(target) + 2·t·element size of the input
//! cross_entropy_loss: log_softmax and nll_loss, summed
//! ```
//!
//! Forward convolutions, pooling forwards and `cat` are known but return
//! [`Uncosted::MissingShapes`]: the output size depends on stride and padding values (or a
//! tensor list's sizes) that traces do not record. Composites whose children launch the
//! kernels (`aten::linear`, `aten::matmul`, `aten::conv2d`, ...) are not in the table: the
//! caller costs the innermost operators.

use crate::compute::KernelWork;
use crate::device::Dtype;
use crate::kernel_shape::KernelShape;
use crate::layer::OpClass;

/// One profiled operator as the trace records it.
#[derive(Debug, Clone, Copy)]
pub struct OperatorCall<'a> {
    /// The operator's name: `"aten::mm"`.
    pub name: &'a str,
    /// `Input Dims`, one entry per argument: a tensor's sizes, `[]` for a scalar, a non-tensor
    /// or a zero-dim tensor; `None` where the entry is missing or not a flat list of sizes (a
    /// tensor list's nested lists).
    pub dims: &'a [Option<Vec<u64>>],
    /// `Input type`, one entry per argument: a tensor's element type (`"float"`,
    /// `"c10::BFloat16"`), `"Scalar"`, `""` for None, `"TensorList"`, ...; `None` where the trace
    /// wrote nothing or something other than a string.
    pub types: &'a [Option<String>],
    /// Names of the GPU kernels the operator launched; `tf32` in one marks an fp32 product that
    /// ran on TF32 tensor cores.
    pub kernel_names: &'a [&'a str],
}

/// Why an operator has no cost. The caller names the operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Uncosted {
    /// The operator is not in [`KNOWN_OPERATORS`]: a composite whose children launch the
    /// kernels, a communication, or a library's own operator.
    #[error("no cost formula for this operator")]
    UnknownOperator,
    /// The trace lacks what the cost depends on: shapes and types were not recorded (profile
    /// with `record_shapes=True`), an argument the formula reads has no flat sizes (a tensor
    /// list), or the cost depends on argument values traces do not record.
    #[error("the trace does not record the argument shapes or values this operator's cost needs")]
    MissingShapes,
    /// An argument the formula reads has an element type without a rate (complex, quantized)
    /// or a matrix product is on integers.
    #[error("unsupported element type `{0}`")]
    UnsupportedDtype(String),
    /// The recorded shapes contradict the operator's schema.
    #[error("malformed shapes: {0}")]
    Malformed(String),
}

/// The work of one operator, from the formulas in the [module documentation](self).
pub fn operator_work(call: &OperatorCall) -> Result<KernelWork, Uncosted> {
    use OpClass::{Elementwise, Normalization, Reduction};
    let rule = lookup(call.name).ok_or(Uncosted::UnknownOperator)?;
    if call.dims.is_empty() || call.types.is_empty() {
        return Err(Uncosted::MissingShapes);
    }
    let args = Args { dims: call.dims, types: call.types };
    let kernels = call.kernel_names;
    match rule {
        Rule::Product { addend } => product(&args, addend, kernels),
        Rule::ConvolutionBackward => convolution_backward(&args, kernels),
        Rule::Attention { backward, seq_axis, packed } => {
            fused_attention(&args, backward, seq_axis, packed, kernels)
        }
        Rule::Pointwise { output, in_place } => pointwise(&args, output, in_place, arity(call.name)),
        Rule::Copy => {
            let (target, source) = (args.tensor(0)?, args.tensor(1)?);
            broadcasts_onto(source.dims, target.dims)?;
            Ok(vector(Elementwise, &[target, source], 0.0, target.bytes() + source.bytes()))
        }
        Rule::Unary { class, per_element, passes } => {
            let input = args.tensor(0)?;
            let mut work = vector(class, &[input], per_element * input.elements(), passes * input.bytes());
            if class == Reduction {
                work.shape = reduction_shape(input.dims, kernels);
            }
            Ok(work)
        }
        Rule::Dropout => {
            let input = args.tensor(0)?;
            let n = input.elements();
            Ok(vector(Elementwise, &[input], n, 2.0 * input.bytes() + n))
        }
        Rule::Gather { table, index, rows } => {
            let (table, index) = (args.tensor(table)?, args.tensor(index)?);
            let row = if rows { count(table.dims.get(1..).unwrap_or_default()) } else { 1.0 };
            let moved = 2.0 * index.elements() * row * table.element.size();
            Ok(vector(Elementwise, &[table], 0.0, index.bytes() + moved))
        }
        Rule::Scatter { index, source } => {
            let (target, index, source) = (args.tensor(0)?, args.tensor(index)?, args.tensor(source)?);
            let bytes = index.bytes() + source.bytes() + source.elements() * target.element.size();
            Ok(vector(Elementwise, &[target, source], source.elements(), bytes))
        }
        Rule::SoftmaxBackward => {
            let (grad, output) = (args.tensor(0)?, args.tensor(1)?);
            let bytes = 2.0 * grad.bytes() + output.bytes();
            Ok(vector(Normalization, &[grad, output], 4.0 * grad.elements(), bytes))
        }
        Rule::Norm { weight, bias, statistics, per_element } => {
            norm(&args, weight, bias, statistics, per_element)
        }
        Rule::NormBackward { weight, per_element } => {
            let (all, input) = (args.tensors()?, args.tensor(1)?);
            let weight = args.arg(weight)?.map_or(0.0, |weight| weight.bytes());
            let bytes = total(&all) + input.bytes() + weight;
            Ok(vector(Normalization, &all, per_element * input.elements(), bytes))
        }
        Rule::BatchNorm => {
            let (all, input) = (args.tensors()?, args.tensor(0)?);
            Ok(vector(Reduction, &all, 8.0 * input.elements(), total(&all) + 2.0 * input.bytes()))
        }
        Rule::BatchNormBackward => {
            // (grad_out, input, weight, ...) natively, (input, grad_out, weight, ...) in cuDNN:
            // the first two have the same shape either way.
            let (all, first, second) = (args.tensors()?, args.tensor(0)?, args.tensor(1)?);
            let parameters = 2.0 * args.arg(2)?.map_or(0.0, |weight| weight.bytes());
            let bytes = total(&all) + 2.0 * first.bytes() + second.bytes() + parameters;
            Ok(vector(Reduction, &all, 16.0 * first.elements(), bytes))
        }
        Rule::PoolBackward => {
            let (all, input) = (args.tensors()?, args.tensor(1)?);
            Ok(vector(Reduction, &all, input.elements(), total(&all) + input.bytes()))
        }
        Rule::NllLoss { input, target } => {
            let (input, target) = (args.tensor(input)?, args.tensor(target)?);
            let picked = target.elements();
            let bytes = target.bytes() + 2.0 * picked * input.element.size();
            Ok(vector(Reduction, &[input], picked, bytes))
        }
        Rule::CrossEntropy => {
            let (input, target) = (args.tensor(0)?, args.tensor(1)?);
            let picked = target.elements();
            let bytes = 2.0 * input.bytes() + target.bytes() + 2.0 * picked * input.element.size();
            Ok(vector(Reduction, &[input], 5.0 * input.elements() + picked, bytes))
        }
        Rule::Unrecorded => Err(Uncosted::MissingShapes),
    }
}

/// The work of each compute kernel an operator ran, in launch order: [`operator_work`]'s, then,
/// for a matrix product that launched more kernels than its product (cuBLAS's split-K
/// reduction `splitKreduce_kernel`, or its bias epilogue `epilogue::impl::globalKernel` after an
/// `addmm`), one element-wise pass over the product's output per further kernel, reading and
/// writing it once. Those passes run after the product, not under its arithmetic: in HTA's V100
/// trace (`trace_diff/test`) an `addmm` of `[1024, 64] x [64, 512]` ran `volta_sgemm_128x32_tn`
/// for 16 us, then the epilogue for 11 us. Memsets and copies
/// among `kernel_names` (Kineto names them `Memset ...`, `Memcpy ...`) are not kernels here.
pub fn operator_kernels(call: &OperatorCall) -> Result<Vec<KernelWork>, Uncosted> {
    let main = operator_work(call)?;
    let launched = call
        .kernel_names
        .iter()
        .filter(|name| !name.starts_with("Memset") && !name.starts_with("Memcpy"))
        .count();
    let args = Args { dims: call.dims, types: call.types };
    if let Some(Rule::NormBackward { weight, .. }) = lookup(call.name)
        && launched >= 2
    {
        return norm_backward_kernels(&args, weight, main);
    }
    let Some(Rule::Product { addend }) = lookup(call.name) else { return Ok(vec![main]) };
    let (outputs, element) = product_output(&args, addend)?;
    // Element-wise math runs at the fp32 rate, fp64 for double products (as `vector` decides).
    let dtype = if element == Element::Float(Dtype::Fp64) { Dtype::Fp64 } else { Dtype::Fp32 };
    let pass = KernelWork::flat(OpClass::Elementwise, dtype, outputs, 2.0 * outputs * element.size());
    let mut kernels = vec![main];
    kernels.extend(std::iter::repeat_n(pass, launched.saturating_sub(1)));
    Ok(kernels)
}

/// A layer or RMS norm's backward as its two kernels (PyTorch's `layer_norm_grad_input_kernel`
/// and `GammaBetaBackwardCUDAKernel`): the input gradient, row by row (a normalisation: reads
/// the output gradient, the input, the statistics and the scale, writes the input gradient),
/// then the parameter gradients, a reduction across the rows (reads the output gradient, the
/// input and the statistics again, writes the scale's and shift's gradients). `whole` is the
/// operator's work as one kernel; its FLOPs are shared half and half.
fn norm_backward_kernels(args: &Args, weight: usize, whole: KernelWork) -> Result<Vec<KernelWork>, Uncosted> {
    let all = args.tensors()?;
    let (gradient, input) = (args.tensor(0)?, args.tensor(1)?);
    let scale = args.arg(weight)?.map_or(0.0, |weight| weight.bytes());
    let statistics = total(&all) - gradient.bytes() - input.bytes() - total(&args.tensors_from(weight)?);
    let rows = gradient.bytes() + input.bytes() + statistics;
    let grad_input = KernelWork { flops: whole.flops / 2.0, bytes: rows + scale + input.bytes(), ..whole };
    let parameters = KernelWork {
        class: OpClass::Reduction,
        flops: whole.flops / 2.0,
        bytes: rows + 2.0 * scale,
        ..whole
    };
    Ok(vec![grad_input, parameters])
}

/// The operator names [`operator_work`] knows, for documentation and reports. The element-wise
/// arithmetic ones are listed by their out-of-place name; their in-place forms (`aten::add_`)
/// are known too, and so is every `aten::_foreach_*` operator (whose tensor lists give
/// [`Uncosted::MissingShapes`]).
pub const KNOWN_OPERATORS: &[&str] = &KNOWN;

const KNOWN: [&str; known_count()] = {
    let mut names = [""; known_count()];
    let (mut group, mut next) = (0, 0);
    while group < TABLE.len() {
        let mut member = 0;
        while member < TABLE[group].1.len() {
            names[next] = TABLE[group].1[member];
            (member, next) = (member + 1, next + 1);
        }
        group += 1;
    }
    names
};

const fn known_count() -> usize {
    let (mut group, mut count) = (0, 0);
    while group < TABLE.len() {
        count += TABLE[group].1.len();
        group += 1;
    }
    count
}

/// Which formula an operator follows, with the argument positions of its schema.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// A matrix product, after an addend argument if `addend`.
    Product {
        addend: bool,
    },
    ConvolutionBackward,
    /// q, k, v from the argument after grad_out if `backward`; `seq_axis` is 2 for `[b,h,s,d]`,
    /// 1 for `[b,s,h,d]`; `packed` is the position of the cumulative sequence lengths a packed
    /// variable-length batch passes.
    Attention {
        backward: bool,
        seq_axis: usize,
        packed: Option<usize>,
    },
    Pointwise {
        output: Output,
        in_place: bool,
    },
    Copy,
    /// `per_element` FLOPs per element of the first argument, moving its bytes `passes` times.
    Unary {
        class: OpClass,
        per_element: f64,
        passes: f64,
    },
    Dropout,
    /// Reads `index` and gathers rows (or single elements) of `table`.
    Gather {
        table: usize,
        index: usize,
        rows: bool,
    },
    Scatter {
        index: usize,
        source: usize,
    },
    SoftmaxBackward,
    Norm {
        weight: usize,
        bias: Option<usize>,
        statistics: f64,
        per_element: f64,
    },
    NormBackward {
        weight: usize,
        per_element: f64,
    },
    BatchNorm,
    BatchNormBackward,
    PoolBackward,
    NllLoss {
        input: usize,
        target: usize,
    },
    CrossEntropy,
    /// Costs depend on argument values or tensor-list sizes that traces do not record.
    Unrecorded,
}

/// The element type of an out-of-place element-wise result.
#[derive(Debug, Clone, Copy)]
enum Output {
    Promoted,
    Bool,
}

const POINTWISE: Rule = Rule::Pointwise { output: Output::Promoted, in_place: false };
const COMPARISON: Rule = Rule::Pointwise { output: Output::Bool, in_place: false };
const FILL: Rule = Rule::Unary { class: OpClass::Elementwise, per_element: 0.0, passes: 1.0 };
const CLONE: Rule = Rule::Unary { class: OpClass::Elementwise, per_element: 0.0, passes: 2.0 };
const REDUCE: Rule = Rule::Unary { class: OpClass::Reduction, per_element: 1.0, passes: 1.0 };
const SOFTMAX: Rule = Rule::Unary { class: OpClass::Normalization, per_element: 5.0, passes: 2.0 };
const fn attention(backward: bool, seq_axis: usize, packed: Option<usize>) -> Rule {
    Rule::Attention { backward, seq_axis, packed }
}

/// Argument positions follow `native_functions.yaml`.
#[rustfmt::skip]
const TABLE: &[(Rule, &[&str])] = &[
    (Rule::Product { addend: false }, &["aten::mm", "aten::bmm", "aten::mv"]),
    (Rule::Product { addend: true }, &["aten::addmm", "aten::baddbmm", "aten::addmv"]),
    (Rule::ConvolutionBackward, &["aten::convolution_backward"]),
    (attention(false, 2, None), &["aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention"]),
    (attention(true, 2, Some(6)), &["aten::_scaled_dot_product_flash_attention_backward"]),
    (attention(true, 2, None), &["aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_cudnn_attention_backward"]),
    (attention(false, 1, Some(3)), &["aten::_flash_attention_forward"]),
    (attention(true, 1, Some(6)), &["aten::_flash_attention_backward",
        "aten::_efficient_attention_backward"]),
    (attention(false, 1, Some(4)), &["aten::_efficient_attention_forward"]),
    (POINTWISE, &["aten::add", "aten::sub", "aten::mul", "aten::div", "aten::rsub", "aten::neg", "aten::abs",
        "aten::exp", "aten::log", "aten::log2", "aten::log1p", "aten::sqrt", "aten::rsqrt", "aten::pow",
        "aten::reciprocal", "aten::sin", "aten::cos", "aten::erf", "aten::sigmoid", "aten::tanh",
        "aten::relu", "aten::gelu", "aten::silu", "aten::hardtanh", "aten::leaky_relu", "aten::elu",
        "aten::clamp", "aten::clamp_min", "aten::clamp_max", "aten::threshold", "aten::nan_to_num",
        "aten::where", "aten::masked_fill", "aten::lerp", "aten::addcmul", "aten::addcdiv", "aten::maximum",
        "aten::minimum", "aten::bitwise_and", "aten::bitwise_or", "aten::bitwise_xor", "aten::bitwise_not",
        "aten::sigmoid_backward", "aten::tanh_backward", "aten::threshold_backward", "aten::gelu_backward",
        "aten::silu_backward", "aten::hardtanh_backward", "aten::leaky_relu_backward", "aten::elu_backward",
        "aten::native_dropout_backward"]),
    (COMPARISON, &["aten::eq", "aten::ne", "aten::lt", "aten::le", "aten::gt", "aten::ge",
        "aten::logical_and", "aten::logical_or", "aten::logical_not"]),
    (Rule::Copy, &["aten::copy_"]),
    (FILL, &["aten::fill_", "aten::zero_"]),
    (CLONE, &["aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous"]),
    (Rule::Dropout, &["aten::dropout", "aten::native_dropout"]),
    (Rule::Gather { table: 0, index: 1, rows: true }, &["aten::embedding"]),
    (Rule::Gather { table: 0, index: 2, rows: true }, &["aten::index_select"]),
    (Rule::Gather { table: 0, index: 2, rows: false }, &["aten::gather"]),
    (Rule::Scatter { index: 2, source: 3 }, &["aten::scatter_add_", "aten::index_add_"]),
    (REDUCE, &["aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::max", "aten::min", "aten::norm",
        "aten::linalg_vector_norm", "aten::var", "aten::std", "aten::var_mean", "aten::std_mean",
        "aten::prod", "aten::argmax", "aten::argmin"]),
    (SOFTMAX, &["aten::_softmax", "aten::softmax", "aten::_log_softmax", "aten::log_softmax"]),
    (Rule::SoftmaxBackward, &["aten::_softmax_backward_data", "aten::_log_softmax_backward_data"]),
    (Rule::Norm { weight: 2, bias: Some(3), statistics: 2.0, per_element: 8.0 },
        &["aten::native_layer_norm"]),
    (Rule::Norm { weight: 2, bias: None, statistics: 1.0, per_element: 6.0 },
        &["aten::_fused_rms_norm", "aten::rms_norm"]),
    (Rule::NormBackward { weight: 5, per_element: 16.0 }, &["aten::native_layer_norm_backward"]),
    (Rule::NormBackward { weight: 4, per_element: 12.0 }, &["aten::_fused_rms_norm_backward"]),
    (Rule::BatchNorm, &["aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::_batch_norm_impl_index"]),
    (Rule::BatchNormBackward, &["aten::native_batch_norm_backward", "aten::cudnn_batch_norm_backward"]),
    (Rule::PoolBackward, &["aten::max_pool2d_with_indices_backward", "aten::avg_pool2d_backward",
        "aten::_adaptive_avg_pool2d_backward"]),
    (Rule::NllLoss { input: 0, target: 1 }, &["aten::nll_loss_forward", "aten::nll_loss2d_forward"]),
    (Rule::NllLoss { input: 1, target: 2 }, &["aten::nll_loss_backward", "aten::nll_loss2d_backward"]),
    (Rule::CrossEntropy, &["aten::cross_entropy_loss"]),
    (Rule::Unrecorded, &["aten::convolution", "aten::_convolution", "aten::cudnn_convolution",
        "aten::cudnn_convolution_transpose", "aten::max_pool2d_with_indices", "aten::avg_pool2d",
        "aten::_adaptive_avg_pool2d", "aten::cat"]),
];

/// The rule of `name`: its table entry, else `_foreach_*`, else an in-place element-wise op.
fn lookup(name: &str) -> Option<Rule> {
    let find = |name: &str| TABLE.iter().find(|(_, names)| names.contains(&name)).map(|&(rule, _)| rule);
    if let Some(rule) = find(name) {
        return Some(rule);
    }
    if name.starts_with("aten::_foreach_") {
        return Some(Rule::Unrecorded);
    }
    match find(name.strip_suffix('_')?)? {
        Rule::Pointwise { output, .. } => Some(Rule::Pointwise { output, in_place: true }),
        _ => None,
    }
}

/// A tensor's element type: floating point (with a rate) or integer and bool (bytes only).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Element {
    Float(Dtype),
    Integer(u8),
}

impl Element {
    /// Reads a profiler dtype name (`caffe2::TypeMeta` names, plus the capitalised forms).
    fn parse(name: &str) -> Option<Element> {
        use Element::{Float, Integer};
        Some(match name {
            "float" | "Float" => Float(Dtype::Fp32),
            "double" | "Double" => Float(Dtype::Fp64),
            "c10::Half" | "Half" => Float(Dtype::Fp16),
            "c10::BFloat16" | "BFloat16" => Float(Dtype::Bf16),
            "long" | "long int" | "long long" | "int64" | "int64_t" => Integer(8),
            "int" => Integer(4),
            "short" | "short int" => Integer(2),
            "bool" | "unsigned char" | "signed char" => Integer(1),
            _ if name.starts_with("c10::Float8_") => Float(Dtype::Fp8),
            _ => return None,
        })
    }

    fn size(self) -> f64 {
        match self {
            Element::Float(dtype) => dtype.bytes() as f64,
            Element::Integer(bytes) => f64::from(bytes),
        }
    }
}

/// Whether every one of `dims` is a multiple of 16 bytes of `element`s.
fn aligned(element: Element, dims: &[u64]) -> bool {
    let per_vector = (16.0 / element.size()).max(1.0) as u64;
    dims.iter().all(|d| d % per_vector == 0)
}

/// `Input type` entries of arguments that are not tensors: scalars, None, lists of numbers.
fn is_not_tensor(name: &str) -> bool {
    matches!(name, "" | "Scalar") || name.ends_with("[]") || (name.ends_with("List") && name != "TensorList")
}

/// A tensor argument.
#[derive(Debug, Clone, Copy)]
struct Tensor<'a> {
    dims: &'a [u64],
    element: Element,
    type_name: &'a str,
}

impl Tensor<'_> {
    fn elements(&self) -> f64 {
        count(self.dims)
    }

    fn bytes(&self) -> f64 {
        self.elements() * self.element.size()
    }
}

/// Elements of a shape (1 for a zero-dim tensor).
fn count(dims: &[u64]) -> f64 {
    dims.iter().map(|&size| size as f64).product()
}

/// Total bytes of `tensors`.
fn total(tensors: &[Tensor]) -> f64 {
    tensors.iter().map(Tensor::bytes).sum()
}

/// An operator's arguments, read by position.
struct Args<'a> {
    dims: &'a [Option<Vec<u64>>],
    types: &'a [Option<String>],
}

impl<'a> Args<'a> {
    fn type_name(&self, position: usize) -> Option<&'a str> {
        self.types.get(position).and_then(Option::as_deref)
    }

    /// Argument `position` if it is a tensor, `None` if it is not one (or is absent and
    /// sizeless), an error if it is a tensor this module cannot read.
    fn arg(&self, position: usize) -> Result<Option<Tensor<'a>>, Uncosted> {
        let dims = self.dims.get(position).and_then(Option::as_deref);
        let sized = dims.is_some_and(|dims| !dims.is_empty());
        let Some(name) = self.type_name(position) else {
            // Sizes without a type: a tensor of unknown dtype.
            return if sized { Err(Uncosted::MissingShapes) } else { Ok(None) };
        };
        match Element::parse(name) {
            Some(element) => {
                let dims = dims.ok_or(Uncosted::MissingShapes)?;
                Ok(Some(Tensor { dims, element, type_name: name }))
            }
            None if name == "TensorList" => Err(Uncosted::MissingShapes),
            // An unknown type without sizes is taken for a scalar tag.
            None if is_not_tensor(name) || !sized => Ok(None),
            None => Err(Uncosted::UnsupportedDtype(name.to_string())),
        }
    }

    /// Argument `position`, which the schema says is a tensor.
    fn tensor(&self, position: usize) -> Result<Tensor<'a>, Uncosted> {
        let Some(name) = self.type_name(position) else { return Err(Uncosted::MissingShapes) };
        match self.arg(position)? {
            Some(tensor) => Ok(tensor),
            None if is_not_tensor(name) => {
                Err(Uncosted::Malformed(format!("argument {position} is `{name}`, not a tensor")))
            }
            None => Err(Uncosted::UnsupportedDtype(name.to_string())),
        }
    }

    /// Every tensor argument, in order.
    fn tensors(&self) -> Result<Vec<Tensor<'a>>, Uncosted> {
        self.tensors_before(usize::MAX)
    }

    /// The tensor arguments before position `end`, in order.
    fn tensors_before(&self, end: usize) -> Result<Vec<Tensor<'a>>, Uncosted> {
        (0..self.dims.len().max(self.types.len()).min(end))
            .filter_map(|position| self.arg(position).transpose())
            .collect()
    }

    /// The tensor arguments from position `start` on, in order.
    fn tensors_from(&self, start: usize) -> Result<Vec<Tensor<'a>>, Uncosted> {
        (start..self.dims.len().max(self.types.len()))
            .filter_map(|position| self.arg(position).transpose())
            .collect()
    }
}

/// The numpy broadcast of `shapes`: aligned at the right, each size equal to the others or 1.
fn broadcast(shapes: &[&[u64]]) -> Result<Vec<u64>, Uncosted> {
    let rank = shapes.iter().map(|shape| shape.len()).max().unwrap_or(0);
    let mut out = vec![1; rank];
    for shape in shapes {
        for (slot, &size) in out[rank - shape.len()..].iter_mut().zip(*shape) {
            if *slot == 1 {
                *slot = size;
            } else if size != 1 && size != *slot {
                return Err(Uncosted::Malformed(format!("shapes {shapes:?} do not broadcast")));
            }
        }
    }
    Ok(out)
}

/// Checks that `shape` broadcasts onto `target` without growing it.
fn broadcasts_onto(shape: &[u64], target: &[u64]) -> Result<(), Uncosted> {
    if broadcast(&[shape, target])? != target {
        return Err(Uncosted::Malformed(format!("{shape:?} does not broadcast onto {target:?}")));
    }
    Ok(())
}

/// Element-wise and reduction work: fp64 if an input is double, else fp32.
fn vector(class: OpClass, inputs: &[Tensor], flops: f64, bytes: f64) -> KernelWork {
    let double = inputs.iter().any(|tensor| tensor.element == Element::Float(Dtype::Fp64));
    KernelWork {
        class,
        dtype: if double { Dtype::Fp64 } else { Dtype::Fp32 },
        flops,
        bytes,
        aligned: true,
        shape: KernelShape::Unknown,
    }
}

/// The shape of a reduction over `dims` that launched `kernels`, when the trace tells which
/// dimensions it reduced: a trace records the input's sizes but not the reduced dimensions, and
/// the name of PyTorch's reduction kernel, `reduce_kernel<threads, output_vec_size,
/// ReduceOp<..., vt0>>` (`Reduce.cuh`), says how it was launched. An output vector width above 1
/// is chosen only when the outputs, not the reduced values, are the contiguous dimension
/// ("vectorize along output"), so a 2-D input `[rows, columns]` was reduced over its rows into
/// `columns` outputs (a bias gradient). A 0-D or 1-D input is reduced whole. Otherwise
/// (several dimensions and a width of 1: a row sum, or columns of an odd count)
/// [`KernelShape::Unknown`].
fn reduction_shape(dims: &[u64], kernels: &[&str]) -> KernelShape {
    use crate::kernel_shape::ReductionShape;
    let Some(name) = kernels.iter().find(|name| name.contains("reduce_kernel<")) else {
        return KernelShape::Unknown;
    };
    let arguments = name.split_once("reduce_kernel<").map_or("", |(_, rest)| rest);
    let mut numbers = arguments.split(',').map(|part| part.trim().parse::<u64>().ok());
    let (Some(Some(_threads)), Some(Some(output_vector))) = (numbers.next(), numbers.next()) else {
        return KernelShape::Unknown;
    };
    // `vt0`, ReduceOp's last template argument: the number before the closing `>` of the
    // template list (4 unless written otherwise).
    let unroll = arguments
        .split_once(">(")
        .map(|(template, _)| template.trim_end_matches([' ', '>']))
        .and_then(|template| template.rsplit([',', ' ']).next())
        .and_then(|last| last.parse::<u64>().ok())
        .unwrap_or(4);
    let reduction = |outputs, inputs_per_output, contiguous| {
        KernelShape::Reduction(ReductionShape { outputs, inputs_per_output, contiguous, unroll })
    };
    match dims {
        [] if output_vector == 1 => reduction(1, 1, true),
        &[n] if output_vector == 1 => reduction(1, n, true),
        &[rows, columns] if output_vector > 1 && columns % output_vector == 0 => {
            reduction(columns, rows, false)
        }
        _ => KernelShape::Unknown,
    }
}

/// The rate dtype of a product whose first operand is `first`.
fn gemm_dtype(first: &Tensor, kernels: &[&str]) -> Result<Dtype, Uncosted> {
    let tf32 = || {
        kernels.iter().any(|name| {
            let name = name.to_ascii_lowercase();
            ["tf32", "s1688gemm", "s16816gemm"].iter().any(|marker| name.contains(marker))
        })
    };
    match first.element {
        Element::Float(Dtype::Fp32) if tf32() => Ok(Dtype::Tf32),
        Element::Float(dtype) => Ok(dtype),
        Element::Integer(_) => Err(Uncosted::UnsupportedDtype(first.type_name.to_string())),
    }
}

/// A product's output elements and element type (the first operand's).
fn product_output(args: &Args, addend: bool) -> Result<(f64, Element), Uncosted> {
    let first = usize::from(addend);
    let (a, b) = (args.tensor(first)?, args.tensor(first + 1)?);
    let outputs = match (a.dims, b.dims) {
        (&[m, _], &[_]) => m,
        (&[m, _], &[_, n]) => m * n,
        (&[batch, m, _], &[_, _, n]) => batch * m * n,
        _ => return Err(Uncosted::Malformed(format!("not a matrix product: {:?} x {:?}", a.dims, b.dims))),
    };
    Ok((outputs as f64, a.element))
}

/// mm, bmm, mv and, with an addend broadcast onto the product, addmm, baddbmm, addmv.
fn product(args: &Args, addend: bool, kernels: &[&str]) -> Result<KernelWork, Uncosted> {
    let first = usize::from(addend);
    let (a, b) = (args.tensor(first)?, args.tensor(first + 1)?);
    let malformed = |why: &str| Uncosted::Malformed(format!("{why}: {:?} x {:?}", a.dims, b.dims));
    let (batch, m, k, inner, n, out) = match (a.dims, b.dims) {
        (&[m, k], &[inner]) => (1, m, k, inner, 1, vec![m]),
        (&[m, k], &[inner, n]) => (1, m, k, inner, n, vec![m, n]),
        (&[batch, m, k], &[other, inner, n]) if batch == other => (batch, m, k, inner, n, vec![batch, m, n]),
        (&[_, _, _], &[_, _, _]) => return Err(malformed("batch sizes differ")),
        _ => return Err(malformed("not a matrix or batched matrix product")),
    };
    if k != inner {
        return Err(malformed("inner dimensions differ"));
    }
    let outputs = count(&out);
    let mut flops = 2.0 * batch as f64 * m as f64 * k as f64 * n as f64;
    let mut bytes = a.bytes() + b.bytes() + outputs * a.element.size();
    if addend {
        let input = args.tensor(0)?;
        broadcasts_onto(input.dims, &out)?;
        flops += outputs;
        bytes += input.bytes();
    }
    // A matrix-vector product has no N to align.
    let aligned = aligned(a.element, &[m, k]) && (n == 1 || aligned(a.element, &[n]));
    // Priced by FLOPs although the shape is known: with `KernelShape::Gemm`, the default model
    // prices the traces' GEMMs better (time-weighted error, V100: 25.5% -> 21.8%, A100: 36.2%
    // -> 33.1%) but the fitted one worse (14.2% -> 23.9%, 26.5% -> 31.4%): the FLOP ramp with a
    // fitted exponent follows these DLRM products' mix more closely than the tile model
    // (docs/compute-model.md, "Shapes").
    Ok(KernelWork {
        class: OpClass::Gemm,
        dtype: gemm_dtype(&a, kernels)?,
        flops,
        bytes,
        aligned,
        shape: KernelShape::Unknown,
    })
}

/// `convolution_backward(grad_output, input, weight, ...)`: input and weight gradients.
fn convolution_backward(args: &Args, kernels: &[&str]) -> Result<KernelWork, Uncosted> {
    let (grad, input, weight) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
    let malformed = |why: &str| {
        Uncosted::Malformed(format!(
            "{why}: grad_output {:?}, input {:?}, weight {:?}",
            grad.dims, input.dims, weight.dims
        ))
    };
    let rank = grad.dims.len();
    if rank < 3 || input.dims.len() != rank || weight.dims.len() != rank || grad.dims[0] != input.dims[0] {
        return Err(malformed("not a convolution's shapes"));
    }
    // Non-transposed: weight [O, C/g, *k] with O the gradient's channels. Transposed: weight
    // [C, O/g, *k] with C the input's channels, and the input's positions are the products'.
    let positions = if grad.dims[1] == weight.dims[0] {
        &grad.dims[2..]
    } else if input.dims[1] == weight.dims[0] {
        &input.dims[2..]
    } else {
        return Err(malformed("channels disagree"));
    };
    let macs = grad.dims[0] as f64 * count(positions) * weight.elements();
    let bytes = grad.bytes() + 2.0 * input.bytes() + 2.0 * weight.bytes();
    // Implicit GEMM: the channel counts are the products' aligned dimensions.
    let aligned = aligned(grad.element, &[grad.dims[1], input.dims[1]]);
    Ok(KernelWork {
        class: OpClass::Gemm,
        dtype: gemm_dtype(&grad, kernels)?,
        flops: 4.0 * macs,
        bytes,
        aligned,
        shape: KernelShape::Unknown,
    })
}

/// Fused attention, forward or backward.
fn fused_attention(
    args: &Args,
    backward: bool,
    seq_axis: usize,
    packed: Option<usize>,
    kernels: &[&str],
) -> Result<KernelWork, Uncosted> {
    let first = usize::from(backward);
    let (q, k, v) = (args.tensor(first)?, args.tensor(first + 1)?, args.tensor(first + 2)?);
    // A packed variable-length batch ([total, h, d], or cumulative lengths given): the
    // per-sequence lengths are values the trace does not record.
    let lengths = match packed {
        Some(position) => args.arg(position)?.is_some(),
        None => false,
    };
    if q.dims.len() == 3 || lengths {
        return Err(Uncosted::MissingShapes);
    }
    let (&[batch, _, _, depth], &[key_batch, _, _, key_depth], &[value_batch, _, _, value_depth]) =
        (q.dims, k.dims, v.dims)
    else {
        return Err(Uncosted::Malformed(format!(
            "attention needs 4-d q, k, v: {:?}, {:?}, {:?}",
            q.dims, k.dims, v.dims
        )));
    };
    if batch != key_batch || batch != value_batch || depth != key_depth || k.dims[..3] != v.dims[..3] {
        return Err(Uncosted::Malformed(format!("q {:?}, k {:?}, v {:?} disagree", q.dims, k.dims, v.dims)));
    }
    let queries = count(&q.dims[..3]);
    let forward = 2.0 * queries * k.dims[seq_axis] as f64 * (depth + value_depth) as f64;
    let out = queries * value_depth as f64 * q.element.size();
    let inputs = q.bytes() + k.bytes() + v.bytes();
    let (flops, bytes) =
        if backward { (2.5 * forward, 2.0 * (inputs + out)) } else { (forward, inputs + out) };
    let aligned = aligned(q.element, &[depth, value_depth]);
    Ok(KernelWork {
        class: OpClass::Gemm,
        dtype: gemm_dtype(&q, kernels)?,
        flops,
        bytes,
        aligned,
        shape: KernelShape::Unknown,
    })
}

/// The positional arguments of an element-wise operator's functional form (`mul(self,
/// other)`: 2), after which a profiler records the `out=` tensor of its `.out` variant
/// (`mul.out(self, other, *, out)`); `None` for operators not listed, whose tensors are all read.
fn arity(name: &str) -> Option<usize> {
    let base = name.strip_prefix("aten::")?;
    Some(match base {
        "neg" | "abs" | "exp" | "log" | "log2" | "log1p" | "sqrt" | "rsqrt" | "reciprocal" | "sin"
        | "cos" | "erf" | "sigmoid" | "tanh" | "relu" | "silu" | "bitwise_not" | "logical_not" => 1,
        "mul" | "div" | "pow" | "maximum" | "minimum" | "bitwise_and" | "bitwise_or" | "bitwise_xor"
        | "gelu" | "leaky_relu" | "clamp_min" | "clamp_max" | "eq" | "ne" | "lt" | "le" | "gt" | "ge"
        | "logical_and" | "logical_or" | "sigmoid_backward" | "tanh_backward" | "silu_backward" => 2,
        "add"
        | "sub"
        | "rsub"
        | "clamp"
        | "hardtanh"
        | "threshold"
        | "where"
        | "masked_fill"
        | "lerp"
        | "threshold_backward"
        | "gelu_backward"
        | "native_dropout_backward" => 3,
        "nan_to_num" | "addcmul" | "addcdiv" | "elu" | "hardtanh_backward" | "leaky_relu_backward" => 4,
        "elu_backward" => 6,
        _ => return None,
    })
}

/// Element-wise arithmetic, activations, comparisons, in place or not; a tensor at or after
/// position `arity` is the `out=` tensor, written and not read.
fn pointwise(
    args: &Args,
    output: Output,
    in_place: bool,
    arity: Option<usize>,
) -> Result<KernelWork, Uncosted> {
    let mut inputs = args.tensors_before(arity.filter(|_| !in_place).unwrap_or(usize::MAX))?;
    let out = match arity {
        Some(arity) if !in_place => args.tensors_from(arity)?.pop(),
        _ => None,
    };
    if inputs.is_empty() {
        // Only an `out=` tensor: the functional arguments were scalars.
        inputs.extend(out);
    }
    let Some(first) = inputs.first() else {
        return Err(Uncosted::Malformed("no tensor argument".to_string()));
    };
    let shapes: Vec<&[u64]> = inputs.iter().map(|tensor| tensor.dims).collect();
    let shape = broadcast(&shapes)?;
    let (elements, written) = if in_place {
        (first.elements(), first.bytes())
    } else if let Some(out) = out.filter(|out| broadcasts_onto(&shape, out.dims).is_ok()) {
        (out.elements(), out.bytes())
    } else {
        let size = match output {
            Output::Bool => 1.0,
            Output::Promoted => promoted(&inputs).size(),
        };
        (count(&shape), count(&shape) * size)
    };
    Ok(vector(OpClass::Elementwise, &inputs, elements, total(&inputs) + written))
}

/// The widest floating type among the inputs with dimensions (zero-dim tensors do not promote
/// within a category, as in PyTorch), else their widest integer type.
fn promoted(inputs: &[Tensor]) -> Element {
    let dimensioned = inputs.iter().any(|tensor| !tensor.dims.is_empty());
    inputs
        .iter()
        .filter(|tensor| !dimensioned || !tensor.dims.is_empty())
        .map(|tensor| tensor.element)
        .max_by_key(|element| match *element {
            Element::Float(dtype) => (1, dtype.bytes()),
            Element::Integer(bytes) => (0, u64::from(bytes)),
        })
        .unwrap_or(Element::Integer(1))
}

/// Layer and RMS normalization forward: statistics per row, read input and parameters, write
/// the output and the statistics.
fn norm(
    args: &Args,
    weight: usize,
    bias: Option<usize>,
    statistics: f64,
    per_element: f64,
) -> Result<KernelWork, Uncosted> {
    let input = args.tensor(0)?;
    let weight = args.arg(weight)?;
    let bias = match bias {
        Some(position) => args.arg(position)?,
        None => None,
    };
    // The normalized shape is a list of values: the weight has it; without one, assume the
    // last dimension (how transformers normalise).
    let row =
        weight.map_or_else(|| input.dims.last().map_or(1.0, |&size| size as f64), |weight| weight.elements());
    let rows = if row > 0.0 { input.elements() / row } else { 0.0 };
    let read: Vec<Tensor> = [Some(input), weight, bias].into_iter().flatten().collect();
    let bytes = total(&read) + input.bytes() + rows * statistics * Dtype::Fp32.bytes() as f64;
    Ok(vector(OpClass::Normalization, &read, per_element * input.elements(), bytes))
}
