//! Layers: shape propagation and per-sample cost (parameters, FLOPs, memory traffic, saved
//! activations) of each kind of neural-network layer.
//!
//! Conventions used throughout:
//! - Shapes are per sample, without the batch dimension. Images and volumes are channels first
//!   (`3x224x224`, `4x128x128x128`); sequences are tokens first, features last (`2048x12288`).
//! - One multiply-accumulate (MAC) is 2 FLOPs. [`LayerCost::macs`] counts the MACs of matrix
//!   products only, the number model papers quote as "FLOPs" or "MACs".
//! - FLOPs and activation traffic are per sample and scale linearly with the batch; weights are
//!   read (and their gradients written) once per batch, whatever its size.
//! - Traffic is counted in elements; [`LayerCost::bytes`] turns it into bytes for a dtype. It is
//!   the compulsory traffic of a straightforward kernel: each tensor read or written once per
//!   kernel, tiles re-read from cache not counted.
//! - Convolution and linear layers cost the same FLOPs in each of forward, backward-data and
//!   backward-weight (three matrix products of the same size). Element-wise, normalization and
//!   pooling layers count a few FLOPs per element (the count of each is documented on its
//!   kind): they are memory-bound on every GPU in the catalog, so these counts barely matter.
//! - Normalization layers compute their scale and shift gradients in their backward-data
//!   kernel, so their backward-weight pass is empty.
//! - Attention: see [`LayerKind::Attention`] for the causal-masking convention.

mod dense;
mod pointwise;
mod sequence;

use std::fmt;

use serde::Serialize;

use crate::device::Dtype;
use sequence::AttentionCost;

/// A per-sample tensor shape without the batch dimension (`[3, 224, 224]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Shape(pub Vec<u64>);

impl Shape {
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a rank-0 shape); saturates at `u64::MAX`.
    pub fn elements(&self) -> u64 {
        self.0.iter().fold(1u64, |product, &dim| product.saturating_mul(dim))
    }

    /// Number of elements, or `None` if it does not fit a `u64`.
    pub fn checked_elements(&self) -> Option<u64> {
        self.0.iter().try_fold(1u64, |product, &dim| product.checked_mul(dim))
    }
}

impl From<Vec<u64>> for Shape {
    fn from(dims: Vec<u64>) -> Self {
        Shape(dims)
    }
}

impl<const N: usize> From<[u64; N]> for Shape {
    fn from(dims: [u64; N]) -> Self {
        Shape(dims.to_vec())
    }
}

impl fmt::Display for Shape {
    /// `3x224x224`; a rank-0 shape prints as `scalar`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("scalar");
        }
        for (i, dim) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("x")?;
            }
            write!(f, "{dim}")?;
        }
        Ok(())
    }
}

/// How a convolution pads its input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Padding {
    /// This many zeros before and after the input, per spatial axis (PyTorch's `padding`).
    Symmetric(Vec<u64>),
    /// TensorFlow's `"same"`: the output has `ceil(input / stride)` positions; the zeros needed
    /// are split evenly, the odd one after (so an even kernel pads one side only).
    Same,
}

/// An element-wise activation function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activation {
    /// `max(x, 0)`: 1 FLOP forward, 1 backward per element.
    Relu,
    /// `max(x, a x)`: 2 FLOPs forward, 2 backward.
    LeakyRelu,
    /// Gaussian error linear unit (tanh approximation): 8 FLOPs forward, 12 backward.
    Gelu,
    /// Sigmoid-weighted linear unit `x sigmoid(x)` (Swish): 5 FLOPs forward, 8 backward.
    Silu,
    /// Logistic sigmoid: 4 FLOPs forward, 3 backward.
    Sigmoid,
    /// Hyperbolic tangent: 4 FLOPs forward, 3 backward.
    Tanh,
    /// Squared ReLU `max(x, 0)²` (So et al. 2021, "Primer"; modded-nanogpt's MLP from its
    /// 2024-10-14 record, `F.relu(x).square()`): 2 FLOPs forward, 3 backward (`2 relu(x) g`).
    ReluSquared,
}

impl Activation {
    /// Every activation, in declaration order.
    pub const ALL: [Activation; 7] = [
        Activation::Relu,
        Activation::LeakyRelu,
        Activation::Gelu,
        Activation::Silu,
        Activation::Sigmoid,
        Activation::Tanh,
        Activation::ReluSquared,
    ];

    /// The lowercase name used in model files (`"leaky-relu"`).
    pub const fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
            Activation::LeakyRelu => "leaky-relu",
            Activation::Gelu => "gelu",
            Activation::Silu => "silu",
            Activation::Sigmoid => "sigmoid",
            Activation::Tanh => "tanh",
            Activation::ReluSquared => "relu2",
        }
    }

    /// FLOPs per element of the forward and of the backward pass (documented on each variant).
    pub const fn flops_per_element(self) -> (f64, f64) {
        match self {
            Activation::Relu => (1.0, 1.0),
            Activation::LeakyRelu => (2.0, 2.0),
            Activation::Gelu => (8.0, 12.0),
            Activation::Silu => (5.0, 8.0),
            Activation::Sigmoid | Activation::Tanh => (4.0, 3.0),
            Activation::ReluSquared => (2.0, 3.0),
        }
    }
}

/// How a [`LayerKind::CrossEntropy`] loss is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossKernels {
    /// One kernel per pass in the compute dtype: log-softmax and the label's pick forward,
    /// softmax minus one-hot backward.
    Fused,
    /// Megatron-LM's `vocab_parallel_cross_entropy` on logits upcast to fp32, as
    /// `post_language_model_processing` (megatron/model/gpt_model.py, 2021) calls it without
    /// `--fp16-lm-cross-entropy`: forward the cast to fp32, the maximum over the vocabulary,
    /// its in-place subtraction, the in-place exponential, their sum and the in-place division
    /// (megatron/mpu/cross_entropy.py); backward the in-place multiply by the loss gradient and
    /// the cast back to the compute dtype. Every kernel but the casts reads and writes fp32,
    /// whatever the compute dtype; in fp32 the casts do not run (`Tensor.float()` returns the
    /// tensor itself).
    Megatron,
    /// PyTorch's `F.cross_entropy` as eager PyTorch runs it under `torch.autocast` in half
    /// precision (`cross_entropy_loss` is on autocast's fp32 list): forward the cast of the
    /// logits to fp32, `log_softmax` and `nll_loss` (the labels' pick); backward
    /// `nll_loss_backward` (a zero-filled fp32 gradient, the labels' entries scattered in),
    /// `log_softmax_backward` and the cast back to the compute dtype. In fp32 the casts do not
    /// run. A compiler that fuses reductions (`compute.fusion = "inductor"`) runs it as
    /// [`LossKernels::Fused`].
    Torch,
}

impl LossKernels {
    /// Every value, for error messages.
    pub const ALL: [LossKernels; 3] = [LossKernels::Fused, LossKernels::Megatron, LossKernels::Torch];

    /// The name used in model files.
    pub const fn name(self) -> &'static str {
        match self {
            LossKernels::Fused => "fused",
            LossKernels::Megatron => "megatron",
            LossKernels::Torch => "torch",
        }
    }

    /// The value named `name`, or an error listing the valid names.
    pub fn parse(name: &str) -> Result<LossKernels, String> {
        LossKernels::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| {
            let valid: Vec<String> = LossKernels::ALL.iter().map(|k| format!("{:?}", k.name())).collect();
            format!("{name:?}; use {}", valid.join(" or "))
        })
    }
}

/// How a [`LayerKind::Rope`] rotation is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RopeKernels {
    /// One kernel each way over the queries and keys (Megatron-Core's and Transformer Engine's
    /// fused rotary embedding, FlashAttention's `apply_rotary_emb`).
    #[default]
    Fused,
    /// The rotation as eager PyTorch operators, Hugging Face's `apply_rotary_pos_emb`:
    /// `x * cos + rotate_half(x) * sin` with `rotate_half(x) = cat(-x2, x1)`, on the queries and
    /// the keys apart. Forward `neg`, `cat`, two `mul` and an `add` per tensor; backward two
    /// `mul`, the `neg`, and for each of the two slices a zero-filled gradient the slice is
    /// copied into and added to the tensor's gradient (`SliceBackward0`'s `fill_`, `copy_` and
    /// the accumulation's `add_`), as the H200 Llama trace shows: 10 kernels forward and 18
    /// backward per layer.
    Eager,
}

impl RopeKernels {
    /// Every value, for error messages.
    pub const ALL: [RopeKernels; 2] = [RopeKernels::Fused, RopeKernels::Eager];

    /// The name used in model files.
    pub const fn name(self) -> &'static str {
        match self {
            RopeKernels::Fused => "fused",
            RopeKernels::Eager => "eager",
        }
    }

    /// The value named `name`, or an error listing the valid names.
    pub fn parse(name: &str) -> Result<RopeKernels, String> {
        RopeKernels::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| {
            let valid: Vec<String> = RopeKernels::ALL.iter().map(|k| format!("{:?}", k.name())).collect();
            format!("{name:?}; use {}", valid.join(" or "))
        })
    }
}

/// How an attention layer is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionKernel {
    /// Three kernels: `S = Q K^T`, `P = softmax(S)`, `O = P V`, with the `heads x s x s` score
    /// and probability matrices written to and read from device memory.
    Standard,
    /// One fused kernel (FlashAttention): scores stay on chip, only the output and the
    /// per-row log-sum-exp are written; the backward recomputes `Q K^T`.
    Flash,
    /// The attention written as separate PyTorch operators, as nanoGPT's `model.py` writes it:
    /// `q @ k.transpose(-2, -1)`, `* scale`, `masked_fill`, `F.softmax`, dropout, `att @ v`.
    /// Eager PyTorch runs each as a kernel of its own, and under `torch.autocast` in half
    /// precision the softmax runs in fp32 between two casts (softmax is on autocast's fp32
    /// list); a compiler that fuses element-wise chains (`compute.fusion = "inductor"`) runs
    /// the chain between the two products as one kernel, as [`AttentionKernel::Standard`].
    Math,
}

impl AttentionKernel {
    /// The lowercase name used in model files.
    pub const fn name(self) -> &'static str {
        match self {
            AttentionKernel::Standard => "standard",
            AttentionKernel::Flash => "flash",
            AttentionKernel::Math => "math",
        }
    }
}

/// How an upsampling layer interpolates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpsampleMode {
    /// Copies the nearest input element: no FLOPs.
    Nearest,
    /// Linear, bilinear or trilinear interpolation (by the number of spatial axes):
    /// `2 * 2^axes - 1` FLOPs per output element.
    Linear,
}

impl UpsampleMode {
    /// The lowercase name used in model files.
    pub const fn name(self) -> &'static str {
        match self {
            UpsampleMode::Nearest => "nearest",
            UpsampleMode::Linear => "linear",
        }
    }
}

/// What a layer computes.
///
/// Spatial kinds (convolutions, pooling, upsampling) take `[channels, spatial...]` with one to
/// three spatial axes; their per-axis parameters (kernel, stride, ...) have one entry per
/// spatial axis. Sequence kinds take `[tokens, features]` and act on the last dimension.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum LayerKind {
    /// 1-, 2- or 3-D convolution (cross-correlation), by the length of `kernel`.
    Conv {
        /// Output channels.
        out_channels: u64,
        /// Kernel size per spatial axis.
        kernel: Vec<u64>,
        /// Stride per spatial axis.
        stride: Vec<u64>,
        /// Zero padding.
        padding: Padding,
        /// Spacing between kernel taps per spatial axis (1: a dense kernel).
        dilation: Vec<u64>,
        /// Channel groups: 1 is a dense convolution, `in_channels` a depthwise one.
        groups: u64,
        /// Whether a bias is added per output channel.
        bias: bool,
    },
    /// Transposed convolution ("deconvolution"), PyTorch's `ConvTranspose{1,2,3}d`: output size
    /// `(in - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1`.
    ConvTranspose {
        /// Output channels.
        out_channels: u64,
        /// Kernel size per spatial axis.
        kernel: Vec<u64>,
        /// Stride per spatial axis.
        stride: Vec<u64>,
        /// Padding removed from each side of the output, per spatial axis.
        padding: Vec<u64>,
        /// Extra positions added to one side of the output, per spatial axis.
        output_padding: Vec<u64>,
        /// Spacing between kernel taps per spatial axis.
        dilation: Vec<u64>,
        /// Channel groups.
        groups: u64,
        /// Whether a bias is added per output channel.
        bias: bool,
    },
    /// Fully connected layer applied to the last dimension.
    Linear {
        /// Output features.
        out_features: u64,
        /// Whether a bias is added.
        bias: bool,
    },
    /// A linear layer whose weight matrix belongs to another layer (weight tying: GPT's and
    /// BERT's output layers reuse the input embedding's table). Its weights are counted as that
    /// layer's parameters, not here (a bias is counted here); it costs a full linear layer's
    /// FLOPs and traffic, and its weight gradient is added to the owner's.
    TiedLinear {
        /// Output features.
        out_features: u64,
        /// Whether a bias (owned by this layer) is added.
        bias: bool,
        /// The layer that owns the weights.
        tied_to: String,
    },
    /// LoRA's low-rank update beside a frozen linear layer (Hu et al. 2021, arXiv 2106.09685):
    /// the layer's input `x` times `A` (`in x rank`), times `B` (`rank x out_features`), added
    /// to the frozen layer's output. Two small products per pass and the add; `A` and `B` are
    /// the only trained parameters of a LoRA fine-tuning ([`crate::lora`]).
    LoraAdapter {
        /// The adapter's rank (NeMo's `adapter_dim`, PEFT's `r`).
        rank: u64,
        /// Output features: the adapted layer's.
        out_features: u64,
    },
    /// Batched product of the input `[batch..., m, k]` with another activation (not a weight)
    /// of shape `[batch..., k, n]`, giving `[batch..., m, n]`.
    Matmul {
        /// Shape of the second operand.
        other: Shape,
    },
    /// Batch normalization over each channel (dimension 0), in training mode (batch
    /// statistics), with a learned scale and shift per channel. 7 FLOPs per element forward, 12
    /// backward.
    BatchNorm,
    /// Layer normalization over the last dimension, with a learned scale (and shift). 7 FLOPs
    /// per element forward, 12 backward.
    LayerNorm {
        /// Whether the learned shift is present.
        bias: bool,
    },
    /// Root-mean-square normalization over the last dimension, learned scale only. 4 FLOPs per
    /// element forward, 8 backward.
    RmsNorm,
    /// Max pooling; one comparison per window element.
    MaxPool {
        /// Window size per spatial axis.
        kernel: Vec<u64>,
        /// Stride per spatial axis.
        stride: Vec<u64>,
        /// Implicit padding on each side, at most half the window.
        padding: Vec<u64>,
        /// Round the output size up (PyTorch's `ceil_mode`, Caffe's and Chainer's default).
        ceil_mode: bool,
    },
    /// Average pooling; one add per window element.
    AvgPool {
        /// Window size per spatial axis.
        kernel: Vec<u64>,
        /// Stride per spatial axis.
        stride: Vec<u64>,
        /// Implicit zero padding on each side, at most half the window.
        padding: Vec<u64>,
        /// Round the output size up.
        ceil_mode: bool,
    },
    /// Average over all spatial positions of each channel: `[C, spatial...]` -> `[C]` (includes
    /// the flatten that follows it in torchvision models).
    GlobalAvgPool,
    /// Maximum over all spatial positions of each channel: `[C, spatial...]` -> `[C]`.
    GlobalMaxPool,
    /// Average pooling to a fixed output size (PyTorch's `AdaptiveAvgPool`): output position
    /// `i` of an axis averages inputs `floor(i * in / out)` to `ceil((i + 1) * in / out)`.
    AdaptiveAvgPool {
        /// Output size per spatial axis.
        output: Vec<u64>,
    },
    /// An element-wise activation function.
    Activation {
        /// Which function.
        function: Activation,
    },
    /// Gated linear unit: splits the last dimension `2f` into halves `a, b` and computes
    /// `function(a) * b` (`[.., 2f]` -> `[.., f]`); SwiGLU with SiLU, GEGLU with GELU.
    Glu {
        /// The gate's activation.
        function: Activation,
    },
    /// Softmax over the last dimension: 5 FLOPs per element forward, 4 backward.
    Softmax,
    /// Dropout (training): zeroes elements at random and rescales the rest. The mask is saved
    /// for the backward; it is counted as one element per element (real masks take a byte or
    /// a bit, so this over-counts in wide dtypes).
    Dropout,
    /// Softmax cross-entropy loss over the last dimension (the classes), averaged to one
    /// number per sample. Saves the log-probabilities for the backward.
    CrossEntropy {
        /// The kernels it runs as.
        kernels: LossKernels,
    },
    /// Table lookup `[ids...]` -> `[ids..., dim]`. Memory-bound: no FLOPs forward; the weight
    /// gradient is a scatter-add of the output gradient into a dense gradient table (PyTorch's
    /// default), so the whole table's gradient is written once per batch.
    Embedding {
        /// Rows of the table (the vocabulary).
        vocabulary: u64,
        /// Columns of the table (the hidden size).
        dim: u64,
    },
    /// Adds one learned row per token to `[tokens, dim]`: position embeddings (row = position,
    /// so there must be at least as many rows as tokens) or BERT's token-type embeddings (row =
    /// segment id).
    AddEmbedding {
        /// Rows of the table.
        rows: u64,
        /// Rows are indexed by position: the sequence may not be longer than `rows`.
        positional: bool,
    },
    /// A bank of embedding tables looked up and sum-pooled in one fused kernel (DLRM's sparse
    /// features): `[tables]` -> `[tables, dim]`. Updates are sparse (only the rows looked up),
    /// as recommendation models train them.
    EmbeddingBag {
        /// Rows of each table.
        tables: Vec<u64>,
        /// Columns of every table.
        dim: u64,
        /// Rows looked up and summed per table and sample (1: one-hot features).
        lookups: u64,
    },
    /// DLRM's dot-product feature interaction: for `[features, dim]` (the dense features'
    /// vector first, then one per embedding table) computes all pairwise dot products and
    /// outputs the first vector followed by the strictly lower triangle:
    /// `[dim + features * (features - 1) / 2]`.
    Interaction,
    /// Multi-head scaled dot-product attention over packed projections. The input
    /// `[tokens, (heads + 2 * kv_heads) * head_dim]` holds the queries, keys and values (as a
    /// fused QKV projection writes them); the output is `[tokens, heads * head_dim]`.
    /// `kv_heads == heads` is multi-head attention, `1` multi-query, anything dividing `heads`
    /// grouped-query.
    ///
    /// Causal masking: the standard kernels compute the full `s x s` score matrix and mask it,
    /// so a causal mask saves nothing and FLOPs count all `s^2` scores (as Megatron-LM's
    /// FLOP formula does). A flash kernel skips the masked blocks, so causal flash attention
    /// counts `s (s + 1) / 2` scores per head: half the matrix-product FLOPs.
    Attention {
        /// Query heads.
        heads: u64,
        /// Key/value heads; must divide `heads`.
        kv_heads: u64,
        /// Whether each token attends only to itself and earlier tokens.
        causal: bool,
        /// How the attention is computed.
        implementation: AttentionKernel,
        /// Dropout on the attention probabilities (`torch.nn.Dropout` between the softmax and
        /// `P V`, Megatron-LM's `--attention-dropout`). With standard kernels it is a kernel of
        /// its own each way: the forward reads the probabilities, writes the dropped ones and a
        /// one-byte mask, which the backward reads with the gradient. A flash kernel draws the
        /// mask on chip (no traffic), and recomputes it in its backward.
        dropout: bool,
        /// Width of each value head where it differs from the query/key head width
        /// (multi-head latent attention: 128 against 192); the packed input is then
        /// `[tokens, (heads + kv_heads) * head_dim + kv_heads * value_head_dim]` and the output
        /// `[tokens, heads * value_head_dim]`. `None`: values as wide as queries and keys.
        #[serde(skip_serializing_if = "Option::is_none")]
        value_head_dim: Option<u64>,
    },
    /// Rotary position embedding applied in place to the queries and keys of a packed QKV
    /// tensor (as [`LayerKind::Attention`] takes it): 3 FLOPs per rotated element, no
    /// parameters.
    Rope {
        /// Query heads.
        heads: u64,
        /// Key/value heads.
        kv_heads: u64,
        /// One fused kernel each way, or eager PyTorch's operators.
        kernels: RopeKernels,
    },
    /// RMS normalisation of each query and key head of a packed QKV tensor over its head
    /// dimension, without weights (QK-norm: `F.rms_norm(q, (head_dim,))` and the same on `k`,
    /// as modded-nanogpt writes it from its 2024-10-14 record): a row norm over the queries'
    /// and keys' elements, the values untouched.
    QkNorm {
        /// Query heads.
        heads: u64,
        /// Key/value heads.
        kv_heads: u64,
    },
    /// Mixture-of-experts router: a linear layer without bias from the hidden size to one
    /// logit per expert, a softmax and a top-k selection. `[tokens, hidden]` ->
    /// `[tokens, experts]` (the routing weights).
    MoeRouter {
        /// Experts to choose from.
        experts: u64,
        /// Experts each token is sent to.
        top_k: u64,
    },
    /// A bank of feed-forward experts, each token processed by `top_k` of them and the results
    /// combined with the routing weights: `[tokens, hidden]` -> `[tokens, hidden]`. Parameters
    /// count all experts; FLOPs count the `top_k` each token visits (perfect load balance);
    /// every expert's weights are read once per batch.
    MoeExperts {
        /// Experts in the bank.
        experts: u64,
        /// Experts each token visits.
        top_k: u64,
        /// Hidden size inside each expert.
        ffn_hidden: u64,
        /// The experts' activation function.
        activation: Activation,
        /// Gated experts (SwiGLU-style: two input projections, `function(a) * b`).
        gated: bool,
        /// Whether the expert projections have biases.
        bias: bool,
    },
    /// Upsampling of the spatial axes by integer factors.
    Upsample {
        /// Factor per spatial axis.
        scale: Vec<u64>,
        /// Interpolation.
        mode: UpsampleMode,
    },
    /// Center crop of the spatial axes (U-Net's skip connections): a copy.
    Crop {
        /// Output size per spatial axis.
        size: Vec<u64>,
    },
    /// Element-wise sum of two inputs of the same shape (a residual connection); the layer's
    /// input shape is the shape of each operand.
    Add,
    /// Concatenation of the input and `others` along `axis`: a copy. All other dimensions must
    /// agree.
    Concat {
        /// The axis joined along (0: channels of an image, tokens of a sequence).
        axis: usize,
        /// Shapes of the other operands, in order after the input.
        others: Vec<Shape>,
    },
    /// Reshape to one dimension. A view: no kernel, no traffic, no FLOPs.
    Flatten,
    /// Reshape to any shape with the same number of elements. A view.
    Reshape {
        /// The new shape.
        shape: Shape,
    },
    /// A contiguous range of one axis. A view.
    Slice {
        /// The axis sliced.
        axis: usize,
        /// First index kept.
        start: u64,
        /// Number of indices kept.
        length: u64,
    },
}

impl LayerKind {
    /// Short lowercase name of the kind (`"conv2d"`), as written in model files and tables.
    pub fn name(&self) -> &'static str {
        const fn by_axes(axes: usize, names: [&'static str; 4]) -> &'static str {
            match axes {
                1 => names[1],
                2 => names[2],
                3 => names[3],
                _ => names[0],
            }
        }
        match self {
            LayerKind::Conv { kernel, .. } => by_axes(kernel.len(), ["conv", "conv1d", "conv2d", "conv3d"]),
            LayerKind::ConvTranspose { kernel, .. } => by_axes(
                kernel.len(),
                ["conv-transpose", "conv-transpose1d", "conv-transpose2d", "conv-transpose3d"],
            ),
            LayerKind::Linear { .. } | LayerKind::TiedLinear { .. } => "linear",
            LayerKind::LoraAdapter { .. } => "lora-adapter",
            LayerKind::Matmul { .. } => "matmul",
            LayerKind::BatchNorm => "batchnorm",
            LayerKind::LayerNorm { .. } => "layernorm",
            LayerKind::RmsNorm => "rmsnorm",
            LayerKind::MaxPool { kernel, .. } => {
                by_axes(kernel.len(), ["maxpool", "maxpool1d", "maxpool2d", "maxpool3d"])
            }
            LayerKind::AvgPool { kernel, .. } => {
                by_axes(kernel.len(), ["avgpool", "avgpool1d", "avgpool2d", "avgpool3d"])
            }
            LayerKind::GlobalAvgPool => "global-avgpool",
            LayerKind::GlobalMaxPool => "global-maxpool",
            LayerKind::AdaptiveAvgPool { .. } => "adaptive-avgpool",
            LayerKind::Activation { function } => function.name(),
            LayerKind::Glu { function } => match function {
                Activation::Silu => "swiglu",
                Activation::Gelu => "geglu",
                Activation::Sigmoid => "glu",
                Activation::Relu => "reglu",
                Activation::LeakyRelu | Activation::Tanh | Activation::ReluSquared => "gated",
            },
            LayerKind::Softmax => "softmax",
            LayerKind::Dropout => "dropout",
            LayerKind::CrossEntropy { .. } => "cross-entropy",
            LayerKind::Embedding { .. } => "embedding",
            LayerKind::AddEmbedding { positional: true, .. } => "position-embedding",
            LayerKind::AddEmbedding { positional: false, .. } => "token-type-embedding",
            LayerKind::EmbeddingBag { .. } => "embedding-bag",
            LayerKind::Interaction => "interaction",
            LayerKind::Attention { .. } => "attention",
            LayerKind::Rope { .. } => "rope",
            LayerKind::QkNorm { .. } => "qk-norm",
            LayerKind::MoeRouter { .. } => "moe-router",
            LayerKind::MoeExperts { .. } => "moe-experts",
            LayerKind::Upsample { .. } => "upsample",
            LayerKind::Crop { .. } => "crop",
            LayerKind::Add => "add",
            LayerKind::Concat { .. } => "concat",
            LayerKind::Flatten => "flatten",
            LayerKind::Reshape { .. } => "reshape",
            LayerKind::Slice { .. } => "slice",
        }
    }

    /// A ReLU.
    pub const fn relu() -> LayerKind {
        LayerKind::Activation { function: Activation::Relu }
    }

    /// A 2-D convolution with a square kernel, equal strides and padding, no dilation, no
    /// groups and no bias (as in ResNets).
    pub fn conv2d(out_channels: u64, kernel: u64, stride: u64, padding: u64) -> LayerKind {
        LayerKind::Conv {
            out_channels,
            kernel: vec![kernel; 2],
            stride: vec![stride; 2],
            padding: Padding::Symmetric(vec![padding; 2]),
            dilation: vec![1; 2],
            groups: 1,
            bias: false,
        }
    }
}

/// The kind of kernel an operation is, which decides the efficiency the compute model applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpClass {
    /// Matrix products: convolution, linear, matmul, attention. Usually compute-bound.
    Gemm,
    /// One output per input element: activation functions, residual add, copies, gathers.
    Elementwise,
    /// Outputs that combine many inputs along a dimension shared across rows or positions:
    /// sums, batch-norm statistics (per channel, over the batch), pooling, losses.
    Reduction,
    /// Row-wise normalisations: layer and RMS norm, softmax, and their backward kernels. Each
    /// row is reduced by its own block (or warp) and written back, so a tensor of many rows
    /// streams like an element-wise kernel, plus the reduction's fixed cost
    /// (`reduction-overhead`); column reductions starved of parallelism are `Reduction`.
    Normalization,
}

/// One of the three computations training runs per layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pass {
    /// Computes the output from the input.
    Forward,
    /// Computes the gradient with respect to the input from the gradient of the output.
    BackwardData,
    /// Computes the gradient with respect to the weights.
    BackwardWeight,
}

impl Pass {
    /// The three passes, in the order a layer's training step needs them.
    pub const ALL: [Pass; 3] = [Pass::Forward, Pass::BackwardData, Pass::BackwardWeight];
}

/// Elements read plus written by one pass of a layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Traffic {
    /// Activation (and activation-gradient) elements per sample.
    pub per_sample: u64,
    /// Weight (and weight-gradient) elements, once per batch.
    pub per_batch: u64,
}

impl Traffic {
    /// Elements moved for a batch of `batch` samples: `batch * per_sample + per_batch`.
    pub fn elements(self, batch: u64) -> f64 {
        batch as f64 * self.per_sample as f64 + self.per_batch as f64
    }
}

/// What a layer costs: parameters, FLOPs and memory traffic per pass, saved activations.
///
/// FLOPs and activation traffic are per sample (batch 1); see [`LayerCost::flops`] and
/// [`LayerCost::bytes`] for a batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerCost {
    /// Learned parameters (weights and biases; not running statistics, not tied weights).
    pub params: u64,
    /// Multiply-accumulates per sample of the forward pass's matrix products (convolution,
    /// linear, matmul, attention, experts); 0 for other kinds.
    pub macs: f64,
    /// Forward FLOPs per sample.
    pub forward_flops: f64,
    /// Backward FLOPs per sample to compute the input gradient.
    pub backward_data_flops: f64,
    /// Backward FLOPs per sample to compute the weight gradient (0 without weights; for
    /// normalization layers the weight gradient comes out of the backward-data kernel and is
    /// counted there).
    pub backward_weight_flops: f64,
    /// Elements moved by the forward pass.
    pub forward_traffic: Traffic,
    /// Elements moved by the backward-data pass.
    pub backward_data_traffic: Traffic,
    /// Elements moved by the backward-weight pass.
    pub backward_weight_traffic: Traffic,
    /// Elements per sample this layer keeps from forward to backward (the inputs or outputs its
    /// backward reads). Consecutive layers often keep the same tensor (a ReLU's output is the
    /// next convolution's input), so a sum over layers is an upper bound on activation memory.
    pub activation_elements: u64,
    /// One-byte elements per sample (dropout masks: PyTorch's are `bool`, whatever the compute
    /// dtype) read or written by the forward, backward-data and backward-weight passes, on top
    /// of the traffic counted in compute-dtype elements.
    pub mask_bytes: [u64; 3],
    /// Kernel class, for the compute model's efficiencies.
    pub class: OpClass,
    /// Whether the layer's weights are trained ([`Layer::freeze`] sets it with the passes it
    /// takes out).
    #[serde(skip_serializing_if = "Training::is_trained")]
    pub training: Training,
}

/// One kernel of a layer's pass: most passes are one kernel, a standard attention core is
/// several ([`Layer::kernels`]). FLOPs and traffic are per sample, as in [`LayerCost`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KernelPart {
    /// What the kernel computes.
    pub role: KernelRole,
    /// Kernel class, for the compute model's efficiencies.
    pub class: OpClass,
    /// FLOPs per sample.
    pub flops: f64,
    /// Elements moved (compute dtype).
    pub traffic: Traffic,
    /// Elements moved in fp32 whatever the compute dtype (Megatron-LM's fp32 loss,
    /// [`LossKernels::Megatron`]).
    pub fp32_traffic: Traffic,
    /// One-byte mask elements moved per sample.
    pub mask_bytes: u64,
}

impl KernelPart {
    /// Bytes moved for `batch` samples stored as `dtype`.
    pub fn bytes(&self, batch: u64, dtype: Dtype) -> f64 {
        self.traffic.elements(batch) * dtype.bytes() as f64
            + self.fp32_traffic.elements(batch) * Dtype::Fp32.bytes() as f64
            + (batch as f64) * self.mask_bytes as f64
    }
}

/// What one [`KernelPart`] of a layer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelRole {
    /// The whole pass of the layer in one kernel.
    Whole,
    /// The matrix products of an attention core (`Q K^T` and `P V`, or their gradients).
    AttentionProducts,
    /// The scale, causal mask and softmax of an attention core (Megatron-LM's fused
    /// `scaled_upper_triang_masked_softmax`; the softmax alone in a math core), or its
    /// backward.
    AttentionSoftmax,
    /// Dropout on the attention probabilities, or its backward.
    AttentionDropout,
    /// A cast of the logits to fp32 before a loss computed in fp32, or of their gradient back
    /// to the compute dtype: it does not run when the compute dtype is fp32.
    LossCast,
    /// One of a flash attention backward's two helper kernels: the row sums of `dO * O`
    /// before the main kernel, the conversion of dQ's fp32 accumulator after it.
    AttentionHelper,
    /// Autocast's cast of the attention scores to fp32 before the softmax, or of the
    /// probabilities back to the compute dtype for `P V` (and the casts of their gradients):
    /// it does not run when the compute dtype is fp32.
    AttentionCast,
    /// One element-wise operator of an attention written as separate operators
    /// ([`AttentionKernel::Math`]): the scale or the causal mask, or its backward.
    AttentionElementwise,
    /// One of the kernels of a loss computed as several ([`LossKernels::Megatron`]).
    Loss,
    /// One element-wise operator of a rotary embedding run as eager PyTorch operators
    /// ([`RopeKernels::Eager`]).
    Rope,
}

impl LayerCost {
    /// A layer that does nothing (a view): all zeros.
    pub const fn free(class: OpClass) -> LayerCost {
        LayerCost {
            params: 0,
            macs: 0.0,
            forward_flops: 0.0,
            backward_data_flops: 0.0,
            backward_weight_flops: 0.0,
            forward_traffic: Traffic { per_sample: 0, per_batch: 0 },
            backward_data_traffic: Traffic { per_sample: 0, per_batch: 0 },
            backward_weight_traffic: Traffic { per_sample: 0, per_batch: 0 },
            activation_elements: 0,
            mask_bytes: [0; 3],
            class,
            training: Training::Trained,
        }
    }

    /// FLOPs of `pass` for `batch` samples.
    pub fn flops(&self, pass: Pass, batch: u64) -> f64 {
        let per_sample = match pass {
            Pass::Forward => self.forward_flops,
            Pass::BackwardData => self.backward_data_flops,
            Pass::BackwardWeight => self.backward_weight_flops,
        };
        per_sample * batch as f64
    }

    /// Elements moved by `pass`.
    pub fn traffic(&self, pass: Pass) -> Traffic {
        match pass {
            Pass::Forward => self.forward_traffic,
            Pass::BackwardData => self.backward_data_traffic,
            Pass::BackwardWeight => self.backward_weight_traffic,
        }
    }

    /// One-byte mask elements moved per sample by `pass`.
    pub fn mask_bytes(&self, pass: Pass) -> u64 {
        match pass {
            Pass::Forward => self.mask_bytes[0],
            Pass::BackwardData => self.mask_bytes[1],
            Pass::BackwardWeight => self.mask_bytes[2],
        }
    }

    /// Bytes moved by `pass` for `batch` samples stored as `dtype` (masks in one byte).
    pub fn bytes(&self, pass: Pass, batch: u64, dtype: Dtype) -> f64 {
        self.traffic(pass).elements(batch) * dtype.bytes() as f64
            + batch as f64 * self.mask_bytes(pass) as f64
    }

    /// Bytes moved by the forward pass for `batch` samples stored as `dtype`.
    pub fn forward_bytes(&self, batch: u64, dtype: Dtype) -> f64 {
        self.bytes(Pass::Forward, batch, dtype)
    }

    /// Bytes moved by both backward passes for `batch` samples stored as `dtype`.
    pub fn backward_bytes(&self, batch: u64, dtype: Dtype) -> f64 {
        self.bytes(Pass::BackwardData, batch, dtype) + self.bytes(Pass::BackwardWeight, batch, dtype)
    }

    /// Forward plus both backward FLOPs per sample.
    pub fn training_flops(&self) -> f64 {
        self.forward_flops + self.backward_data_flops + self.backward_weight_flops
    }

    /// True if the layer does no work at all (a view such as [`LayerKind::Flatten`]): a lowering
    /// can skip it instead of paying a kernel launch.
    pub fn is_free(&self) -> bool {
        Pass::ALL.into_iter().all(|pass| {
            self.flops(pass, 1) == 0.0
                && self.traffic(pass) == Traffic::default()
                && self.mask_bytes(pass) == 0
        })
    }
}

/// A layer's parameters or input shape do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayerError {
    /// The input has the wrong number of dimensions.
    #[error("layer {layer} ({kind}): input {given} has rank {rank}, expected {expected}")]
    Rank {
        /// The layer's name.
        layer: String,
        /// The layer kind.
        kind: &'static str,
        /// The input shape given.
        given: Shape,
        /// Its rank.
        rank: usize,
        /// What the kind accepts.
        expected: &'static str,
    },
    /// A size, stride or count that must be positive is zero (or the input is empty).
    #[error("layer {layer} ({kind}): {parameter} is zero; it must be at least 1")]
    Zero {
        /// The layer's name.
        layer: String,
        /// The layer kind.
        kind: &'static str,
        /// The parameter.
        parameter: &'static str,
    },
    /// Channels are not divisible by the convolution's groups.
    #[error(
        "layer {layer}: {groups} groups do not divide the {in_channels} input and {out_channels} \
         output channels"
    )]
    Groups {
        /// The layer's name.
        layer: String,
        /// Input channels.
        in_channels: u64,
        /// Output channels.
        out_channels: u64,
        /// The groups asked for.
        groups: u64,
    },
    /// The window does not fit in the padded input.
    #[error(
        "layer {layer} ({kind}): kernel {kernel} is larger than the padded input {padded}; use a \
         smaller kernel or more padding"
    )]
    KernelTooLarge {
        /// The layer's name.
        layer: String,
        /// The layer kind.
        kind: &'static str,
        /// Kernel size (with dilation) per spatial axis.
        kernel: Shape,
        /// Input plus padding per spatial axis.
        padded: Shape,
    },
    /// Pooling padding larger than half the window (PyTorch rejects it too).
    #[error("layer {layer} ({kind}): padding {padding} is more than half the kernel {kernel}")]
    PaddingTooLarge {
        /// The layer's name.
        layer: String,
        /// The layer kind.
        kind: &'static str,
        /// Padding per spatial axis.
        padding: Shape,
        /// Kernel size per spatial axis.
        kernel: Shape,
    },
    /// The two operands of an add differ in shape.
    #[error("layer {layer} (add): operands {left} and {right} differ; a residual add needs equal shapes")]
    ShapeMismatch {
        /// The layer's name.
        layer: String,
        /// The first operand's shape.
        left: Shape,
        /// The second operand's shape.
        right: Shape,
    },
    /// A count is too large to compute with (more than 2^61).
    #[error("layer {layer} ({kind}): {what} is too large (more than 2^61)")]
    TooLarge {
        /// The layer's name.
        layer: String,
        /// The layer kind.
        kind: &'static str,
        /// What overflowed.
        what: &'static str,
    },
    /// A parameter does not fit the input or the other parameters.
    #[error("layer {layer} ({kind}): {message}")]
    Invalid {
        /// The layer's name.
        layer: String,
        /// The layer kind.
        kind: &'static str,
        /// What is wrong and what was expected.
        message: String,
    },
}

/// What training does with a layer's weights and gradients. Full training trains every
/// layer; parameter-efficient fine-tuning ([`crate::lora`]) freezes the base model. One byte,
/// kept in [`LayerCost`]'s padding: a model of a million layers is no larger for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Training {
    /// Its parameters are trained: weight gradients, optimizer state, gradient reduction.
    #[default]
    Trained,
    /// Its weights are frozen: the backward computes its input gradient (a trained layer below
    /// needs it) but no weight gradient; the weights take memory, nothing else
    /// ([`Layer::frozen_weights`]).
    Frozen,
    /// Frozen and below every trained layer: no gradient reaches it, so its backward does not
    /// run and it keeps no activations (autograd stops at the first trained layer).
    Inert,
}

impl Training {
    /// Whether the layer is trained (the default, left out of serialized models).
    pub fn is_trained(&self) -> bool {
        *self == Training::Trained
    }
}

/// One layer of a model, with its shapes and cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Layer {
    /// Name, unique in its model (torchvision module names where there is one: `layer1.0.conv1`).
    pub name: String,
    /// What it computes.
    pub kind: LayerKind,
    /// Per-sample input shape.
    pub input: Shape,
    /// Per-sample output shape.
    pub output: Shape,
    /// Parameters, FLOPs and traffic. A frozen layer's parameters, weight-gradient pass (and,
    /// inert, backward) are taken out of it ([`Layer::freeze`]).
    pub cost: LayerCost,
}

impl Layer {
    /// The feature dimensions of the layer's matrix products, which libraries need on a 16-byte
    /// grid for their fastest kernels: input and output channels per group of a convolution,
    /// in and out features of a linear layer, m, k and n of a matmul, the head size of
    /// attention, hidden and expert sizes of MoE experts. The batch and spatial dimensions are
    /// left out (the batch is chosen at run time, and products over many positions are tiled
    /// whatever their count). Empty for other layers.
    pub fn gemm_dims(&self) -> Vec<u64> {
        let channels = self.input.0.first().copied().unwrap_or(0);
        let features = self.input.0.last().copied().unwrap_or(0);
        match &self.kind {
            LayerKind::Conv { out_channels, groups, .. }
            | LayerKind::ConvTranspose { out_channels, groups, .. } => {
                let groups = (*groups).max(1);
                vec![channels / groups, out_channels / groups]
            }
            LayerKind::Linear { out_features, .. } | LayerKind::TiedLinear { out_features, .. } => {
                vec![features, *out_features]
            }
            LayerKind::Matmul { other } => {
                let rows =
                    self.input.0.len().checked_sub(2).and_then(|i| self.input.0.get(i)).copied().unwrap_or(0);
                vec![rows, features, other.0.last().copied().unwrap_or(0)]
            }
            LayerKind::Attention { heads, kv_heads, value_head_dim, .. } => {
                match attention_head_dims(features, *heads, *kv_heads, *value_head_dim) {
                    Some((head_dim, value_dim)) if value_dim != head_dim => vec![head_dim, value_dim],
                    Some((head_dim, _)) => vec![head_dim],
                    None => vec![0],
                }
            }
            LayerKind::MoeExperts { ffn_hidden, .. } => vec![features, *ffn_hidden],
            LayerKind::LoraAdapter { rank, out_features } => vec![features, *rank, *out_features],
            _ => Vec::new(),
        }
    }

    /// Whether every [`Layer::gemm_dims`] is a multiple of 16 bytes of `dtype` (4 fp32, 8 fp16
    /// or bf16 values); true for layers without products.
    pub fn gemm_aligned(&self, dtype: Dtype) -> bool {
        let per_vector = (16 / dtype.bytes()).max(1);
        self.gemm_dims().iter().all(|d| d % per_vector == 0)
    }

    /// A layer of `kind` applied to `input`, with its output shape and cost; an error if the
    /// input shape or the parameters do not fit the kind.
    pub fn new(name: impl Into<String>, kind: LayerKind, input: Shape) -> Result<Layer, LayerError> {
        let name = name.into();
        let (output, cost) = Checker { layer: &name, kind: kind.name() }.shape_and_cost(&kind, &input)?;
        Ok(Layer { name, kind, input, output, cost })
    }

    /// A residual add of two operands, checking that their shapes agree.
    pub fn residual_add(name: impl Into<String>, left: Shape, right: &Shape) -> Result<Layer, LayerError> {
        let name = name.into();
        if left != *right {
            return Err(LayerError::ShapeMismatch { layer: name, left, right: right.clone() });
        }
        Layer::new(name, LayerKind::Add, left)
    }

    /// The parameter tensors the layer owns (`nn.Parameter`s: a weight and its bias count two;
    /// a tied output layer owns only its bias): what an optimizer looping over tensors visits.
    /// 0 for a layer without parameters.
    pub fn parameter_tensors(&self) -> u64 {
        if self.cost.params == 0 {
            return 0;
        }
        let with_bias = |bias: bool| 1 + u64::from(bias);
        match &self.kind {
            LayerKind::Conv { bias, .. }
            | LayerKind::ConvTranspose { bias, .. }
            | LayerKind::Linear { bias, .. }
            | LayerKind::LayerNorm { bias, .. } => with_bias(*bias),
            LayerKind::TiedLinear { bias, .. } => u64::from(*bias),
            // Scale and shift.
            LayerKind::BatchNorm => 2,
            // Each expert's two (or, gated, three) projections, with their biases.
            LayerKind::MoeExperts { experts, gated, bias, .. } => {
                experts.saturating_mul(2 + u64::from(*gated)).saturating_mul(with_bias(*bias))
            }
            _ => 1,
        }
    }

    /// Multiply-accumulates per sample of the layer's matrix products (see
    /// [`LayerCost::macs`]).
    pub fn macs(&self) -> f64 {
        self.cost.macs
    }

    /// The layer frozen (`inert`: also below every trained layer, so its backward does not
    /// run): its parameters leave [`LayerCost::params`] ([`Layer::frozen_weights`] counts them)
    /// and the passes that no longer run lose their FLOPs and traffic, so every consumer of the
    /// cost (kernels, gradient buckets, optimizer state, memory) sees a layer without trained
    /// weights. A frozen layer's input gradient is still computed.
    pub fn freeze(&mut self, inert: bool) {
        self.cost.params = 0;
        self.cost.backward_weight_flops = 0.0;
        self.cost.backward_weight_traffic = Traffic::default();
        self.cost.mask_bytes[2] = 0;
        if inert {
            self.cost.backward_data_flops = 0.0;
            self.cost.backward_data_traffic = Traffic::default();
            self.cost.mask_bytes[1] = 0;
            self.cost.activation_elements = 0;
            self.cost.training = Training::Inert;
        } else {
            self.cost.training = Training::Frozen;
        }
    }

    /// [`Layer::freeze`] as `training` says (nothing when trained): how a layer rebuilt on
    /// other shapes (a tensor rank's share) keeps its model layer's state.
    pub fn train_as(&mut self, training: Training) {
        match training {
            Training::Trained => {}
            Training::Frozen => self.freeze(false),
            Training::Inert => self.freeze(true),
        }
    }

    /// The parameters of a frozen layer (0 for a trained one, whose parameters are
    /// [`LayerCost::params`]): what its kind holds on its input, counted again (freezing takes
    /// them out of the cost, and a frozen layer keeps no count of its own, so that a layer is
    /// no larger for being freezable).
    pub fn frozen_weights(&self) -> u64 {
        if self.cost.training.is_trained() {
            return 0;
        }
        (Checker { layer: &self.name, kind: self.kind.name() })
            .shape_and_cost(&self.kind, &self.input)
            .map_or(0, |(_, cost)| cost.params)
    }

    /// The kernels `pass` runs, in order: one ([`KernelRole::Whole`], the layer's cost) for
    /// every layer but an attention core, a loss computed as several kernels and an eager rotary
    /// embedding. A standard or math core runs its products, its softmax and its dropout (a
    /// math core also its scale, mask and autocast casts) as kernels of their own; a flash
    /// core's backward runs the row sums of `dO * O`, the main kernel and dQ's conversion
    /// ([`KernelRole::AttentionHelper`]); none for a pass without work. Their FLOPs and compute-dtype traffic add up to
    /// [`LayerCost`]'s; a math core's fp32 traffic is in [`KernelPart::fp32_traffic`] only.
    pub fn kernels(&self, pass: Pass) -> Vec<KernelPart> {
        match (self.cost.training, pass) {
            (Training::Inert, Pass::BackwardData | Pass::BackwardWeight)
            | (Training::Frozen, Pass::BackwardWeight) => return Vec::new(),
            _ => {}
        }
        if let LayerKind::Attention { heads, kv_heads, causal, implementation, dropout, value_head_dim } =
            self.kind
            && let Ok((_, AttentionCost { parts: Some(mut parts), .. })) =
                (Checker { layer: &self.name, kind: self.kind.name() }).attention(
                    &self.input,
                    heads,
                    kv_heads,
                    causal,
                    implementation,
                    dropout,
                    value_head_dim,
                )
        {
            let index = match pass {
                Pass::Forward => 0,
                Pass::BackwardData => 1,
                Pass::BackwardWeight => 2,
            };
            return std::mem::take(&mut parts[index]);
        }
        if let LayerKind::Rope { heads, kv_heads, kernels: RopeKernels::Eager } = self.kind
            && let Ok(parts) = (Checker { layer: &self.name, kind: self.kind.name() }).rope_eager_parts(
                &self.input,
                heads,
                kv_heads,
            )
        {
            let index = match pass {
                Pass::Forward => 0,
                Pass::BackwardData => 1,
                Pass::BackwardWeight => return Vec::new(),
            };
            return parts[index].clone();
        }
        if let LayerKind::CrossEntropy { kernels: kernels @ (LossKernels::Megatron | LossKernels::Torch) } =
            self.kind
            && let Some(&classes) = self.input.0.last()
            && classes > 0
        {
            return if kernels == LossKernels::Megatron {
                megatron_loss_kernels(self.input.elements(), classes, pass)
            } else {
                torch_loss_kernels(self.input.elements(), classes, pass)
            };
        }
        let cost = &self.cost;
        let whole = KernelPart {
            role: KernelRole::Whole,
            class: cost.class,
            flops: cost.flops(pass, 1),
            traffic: cost.traffic(pass),
            fp32_traffic: Traffic::default(),
            mask_bytes: cost.mask_bytes(pass),
        };
        if whole.flops == 0.0 && whole.traffic == Traffic::default() && whole.mask_bytes == 0 {
            Vec::new()
        } else {
            vec![whole]
        }
    }
}

/// One kernel of a loss computed as several: `traffic` elements per sample in the compute
/// dtype, then `fp32_traffic` in fp32.
fn loss_part(role: KernelRole, class: OpClass, flops: f64, traffic: u64, fp32_traffic: u64) -> KernelPart {
    let elements = |per_sample| Traffic { per_sample, per_batch: 0 };
    KernelPart {
        role,
        class,
        flops,
        traffic: elements(traffic),
        fp32_traffic: elements(fp32_traffic),
        mask_bytes: 0,
    }
}

/// The kernels of `pass` of Megatron-LM's fp32 vocabulary-parallel cross-entropy
/// ([`LossKernels::Megatron`]) over `logits` elements per sample in rows of `classes`: forward
/// the cast (`output.float()`), `max` over the vocabulary, `sub_` of the maximum, `exp` in place,
/// `sum`, `div_` by the sum (38 bytes per logit in fp16 training); backward `mul_` by the loss
/// gradient and the cast back (14 bytes per logit). The dozen per-token kernels (the label
/// masks, the gather of the label's logit, the log and the one-hot subtraction) move a few
/// bytes per token and are left out. Their sums are [`LayerCost`]'s for the layer.
fn megatron_loss_kernels(logits: u64, classes: u64, pass: Pass) -> Vec<KernelPart> {
    let (rows, n) = (logits / classes, logits as f64);
    let part = loss_part;
    let (cast, loss) = (KernelRole::LossCast, KernelRole::Loss);
    match pass {
        Pass::Forward => vec![
            // Read the logits, write them in fp32.
            part(cast, OpClass::Elementwise, 0.0, logits, logits),
            // Read them, write one maximum per row.
            part(loss, OpClass::Reduction, n, 0, logits + rows),
            // Read them and the maxima, write them.
            part(loss, OpClass::Elementwise, n, 0, 2 * logits + rows),
            // exp in place.
            part(loss, OpClass::Elementwise, n, 0, 2 * logits),
            // Read them, write one sum per row.
            part(loss, OpClass::Reduction, n, 0, logits + rows),
            // Divide in place by the sums: the softmax saved for the backward.
            part(loss, OpClass::Elementwise, n, 0, 2 * logits + rows),
        ],
        Pass::BackwardData => vec![
            // Multiply the saved softmax (one-hot already subtracted) by the loss gradient.
            part(loss, OpClass::Elementwise, n, 0, 2 * logits + rows),
            // Read it in fp32, write it in the compute dtype.
            part(cast, OpClass::Elementwise, 0.0, logits, logits),
        ],
        Pass::BackwardWeight => Vec::new(),
    }
}

/// The kernels of `pass` of PyTorch's `F.cross_entropy` under autocast
/// ([`LossKernels::Torch`]) over `logits` elements per sample in rows of `classes`
/// (pytorch/pytorch aten/src/ATen/native/LossNLL.cpp `cross_entropy_loss` =
/// `nll_loss(log_softmax(x))`; the fp32 cast is autocast's, aten/src/ATen/autocast_mode.cpp).
fn torch_loss_kernels(logits: u64, classes: u64, pass: Pass) -> Vec<KernelPart> {
    let (rows, n) = (logits / classes, logits as f64);
    let part = loss_part;
    let (cast, loss) = (KernelRole::LossCast, KernelRole::Loss);
    match pass {
        Pass::Forward => vec![
            // Read the logits, write them in fp32.
            part(cast, OpClass::Elementwise, 0.0, logits, logits),
            // log_softmax: read them, write the log-probabilities (max, exp, sum, log, subtract).
            part(loss, OpClass::Reduction, 5.0 * n, 0, 2 * logits),
            // nll_loss: one log-probability per row picked and averaged.
            part(loss, OpClass::Reduction, rows as f64, 0, 2 * rows),
        ],
        Pass::BackwardData => vec![
            // nll_loss_backward: a zero-filled fp32 gradient, one entry per row written.
            part(loss, OpClass::Elementwise, 0.0, 0, logits + rows),
            // log_softmax_backward: read the gradient and the log-probabilities, write the
            // logits' gradient (exp, sum, multiply-subtract).
            part(loss, OpClass::Reduction, 2.0 * n, 0, 3 * logits),
            // Read it in fp32, write it in the compute dtype.
            part(cast, OpClass::Elementwise, 0.0, logits, logits),
        ],
        Pass::BackwardWeight => Vec::new(),
    }
}

/// The largest element, weight or MAC count a layer may have: small multiples and sums of such
/// counts stay far from `u64::MAX`, and every sum is checked anyway.
const COUNT_LIMIT: u64 = 1 << 61;

/// Validation and cost arithmetic for one layer, carrying its name for errors.
struct Checker<'a> {
    layer: &'a str,
    kind: &'static str,
}

impl Checker<'_> {
    fn rank(&self, input: &Shape, expected: &'static str) -> LayerError {
        LayerError::Rank {
            layer: self.layer.to_string(),
            kind: self.kind,
            given: input.clone(),
            rank: input.rank(),
            expected,
        }
    }

    fn zero(&self, parameter: &'static str) -> LayerError {
        LayerError::Zero { layer: self.layer.to_string(), kind: self.kind, parameter }
    }

    fn too_large(&self, what: &'static str) -> LayerError {
        LayerError::TooLarge { layer: self.layer.to_string(), kind: self.kind, what }
    }

    fn invalid(&self, message: String) -> LayerError {
        LayerError::Invalid { layer: self.layer.to_string(), kind: self.kind, message }
    }

    /// `value` if it is known and at most [`COUNT_LIMIT`], else an error naming `what`.
    fn bounded(&self, what: &'static str, value: Option<u64>) -> Result<u64, LayerError> {
        value.filter(|&value| value <= COUNT_LIMIT).ok_or_else(|| self.too_large(what))
    }

    /// The product of `factors`, or an error naming `what` if it exceeds [`COUNT_LIMIT`].
    fn product(&self, what: &'static str, factors: &[u64]) -> Result<u64, LayerError> {
        self.bounded(what, factors.iter().try_fold(1u64, |product, &factor| product.checked_mul(factor)))
    }

    /// `sum(coefficient * count)`, or an error naming `what` if it exceeds [`COUNT_LIMIT`].
    fn sum(&self, what: &'static str, terms: &[(u64, u64)]) -> Result<u64, LayerError> {
        self.bounded(
            what,
            terms.iter().try_fold(0u64, |total, &(coefficient, count)| {
                coefficient.checked_mul(count).and_then(|term| total.checked_add(term))
            }),
        )
    }

    fn nonzero(&self, parameter: &'static str, values: &[u64]) -> Result<(), LayerError> {
        if values.contains(&0) { Err(self.zero(parameter)) } else { Ok(()) }
    }

    /// The last dimension of a `[..., features]` input.
    fn features(&self, input: &Shape) -> Result<u64, LayerError> {
        input.0.last().copied().ok_or_else(|| self.rank(input, "at least 1 (features last)"))
    }

    /// `[tokens, features]` of a sequence layer's input.
    fn sequence(&self, input: &Shape) -> Result<(u64, u64), LayerError> {
        match input.0[..] {
            [tokens, features] => Ok((tokens, features)),
            _ => Err(self.rank(input, "2 ([tokens, features])")),
        }
    }

    /// Channels and spatial sizes of a spatial layer with `axes` spatial axes.
    fn spatial<'s>(&self, input: &'s Shape, axes: usize) -> Result<(u64, &'s [u64]), LayerError> {
        let expected = match axes {
            1 => "2 ([channels, length])",
            2 => "3 ([channels, height, width])",
            3 => "4 ([channels, depth, height, width])",
            _ => {
                return Err(self.invalid(format!(
                    "{axes} spatial axes given by the per-axis parameters; 1, 2 or 3 are supported"
                )));
            }
        };
        match input.0.split_first() {
            Some((&channels, spatial)) if spatial.len() == axes => Ok((channels, spatial)),
            _ => Err(self.rank(input, expected)),
        }
    }

    /// Checks that a per-axis parameter has one value per spatial axis.
    fn per_axis(&self, parameter: &'static str, values: &[u64], axes: usize) -> Result<(), LayerError> {
        if values.len() == axes {
            Ok(())
        } else {
            Err(self.invalid(format!(
                "{parameter} has {} values but the kernel has {axes} axes; give one per spatial axis",
                values.len()
            )))
        }
    }

    fn shape_and_cost(&self, kind: &LayerKind, input: &Shape) -> Result<(Shape, LayerCost), LayerError> {
        let elements_in = self.bounded("the input size", input.checked_elements())?;
        self.nonzero("an input dimension", &input.0)?;
        match kind {
            LayerKind::Conv { out_channels, kernel, stride, padding, dilation, groups, bias } => {
                self.conv(input, *out_channels, kernel, stride, padding, dilation, *groups, *bias)
            }
            LayerKind::ConvTranspose {
                out_channels,
                kernel,
                stride,
                padding,
                output_padding,
                dilation,
                groups,
                bias,
            } => self.conv_transpose(
                input,
                *out_channels,
                kernel,
                stride,
                padding,
                output_padding,
                dilation,
                *groups,
                *bias,
            ),
            LayerKind::Linear { out_features, bias } => self.linear(input, *out_features, *bias, false),
            LayerKind::LoraAdapter { rank, out_features } => self.lora_adapter(input, *rank, *out_features),
            LayerKind::TiedLinear { out_features, bias, .. } => {
                self.linear(input, *out_features, *bias, true)
            }
            LayerKind::Matmul { other } => self.matmul(input, other),
            LayerKind::MaxPool { kernel, stride, padding, ceil_mode } => {
                self.pool(input, kernel, stride, padding, *ceil_mode, true)
            }
            LayerKind::AvgPool { kernel, stride, padding, ceil_mode } => {
                self.pool(input, kernel, stride, padding, *ceil_mode, false)
            }
            LayerKind::GlobalAvgPool => self.global_pool(input, elements_in, false),
            LayerKind::GlobalMaxPool => self.global_pool(input, elements_in, true),
            LayerKind::AdaptiveAvgPool { output } => self.adaptive_pool(input, output),
            LayerKind::Upsample { scale, mode } => self.upsample(input, scale, *mode),
            LayerKind::Crop { size } => self.crop(input, size),
            LayerKind::BatchNorm => self.batch_norm(input, elements_in),
            LayerKind::LayerNorm { bias } => {
                self.row_norm(input, elements_in, if *bias { 2 } else { 1 }, 7.0, 12.0)
            }
            LayerKind::RmsNorm => self.row_norm(input, elements_in, 1, 4.0, 8.0),
            LayerKind::Activation { function } => {
                Ok((input.clone(), self.activation(elements_in, *function)))
            }
            LayerKind::Glu { function } => self.glu(input, *function),
            LayerKind::Softmax => self.softmax(input, elements_in),
            LayerKind::Dropout => Ok((input.clone(), Checker::dropout(elements_in))),
            LayerKind::CrossEntropy { kernels } => self.cross_entropy(input, elements_in, *kernels),
            LayerKind::Add => Ok((input.clone(), Checker::add(elements_in))),
            LayerKind::Concat { axis, others } => self.concat(input, *axis, others),
            LayerKind::Flatten => Ok((Shape(vec![elements_in]), LayerCost::free(OpClass::Elementwise))),
            LayerKind::Reshape { shape } => self.reshape(shape, elements_in),
            LayerKind::Slice { axis, start, length } => self.slice(input, *axis, *start, *length),
            LayerKind::Embedding { vocabulary, dim } => self.embedding(input, elements_in, *vocabulary, *dim),
            LayerKind::AddEmbedding { rows, positional } => self.add_embedding(input, *rows, *positional),
            LayerKind::EmbeddingBag { tables, dim, lookups } => {
                self.embedding_bag(input, tables, *dim, *lookups)
            }
            LayerKind::Interaction => self.interaction(input),
            LayerKind::Attention { heads, kv_heads, causal, implementation, dropout, value_head_dim } => self
                .attention(input, *heads, *kv_heads, *causal, *implementation, *dropout, *value_head_dim)
                .map(|(output, parts)| (output, parts.cost)),
            LayerKind::Rope { heads, kv_heads, kernels } => self.rope(input, *heads, *kv_heads, *kernels),
            LayerKind::QkNorm { heads, kv_heads } => self.qk_norm(input, *heads, *kv_heads),
            LayerKind::MoeRouter { experts, top_k } => self.moe_router(input, *experts, *top_k),
            LayerKind::MoeExperts { experts, top_k, ffn_hidden, activation, gated, bias } => {
                self.moe_experts(input, *experts, *top_k, *ffn_hidden, *activation, *gated, *bias)
            }
        }
    }
}

/// The query/key and value head widths of an attention core over a packed input of
/// `features` per token (see [`LayerKind::Attention`]), or `None` if the heads do not divide
/// it.
pub fn attention_head_dims(
    features: u64,
    heads: u64,
    kv_heads: u64,
    value_head_dim: Option<u64>,
) -> Option<(u64, u64)> {
    match value_head_dim {
        None => {
            let head_dim = features.checked_div(heads.checked_add(kv_heads.checked_mul(2)?)?)?;
            Some((head_dim, head_dim))
        }
        Some(value_dim) => {
            let keyed = features.checked_sub(kv_heads.checked_mul(value_dim)?)?;
            let packed = heads.checked_add(kv_heads)?;
            (packed > 0 && keyed % packed == 0).then(|| (keyed / packed, value_dim))
        }
    }
}

/// A GPT-2 124M attention core (12 heads, causal, 1,024 tokens of width 768) run by
/// `implementation`: the layer the tests of kernel counts and fusion share.
#[cfg(test)]
pub(crate) fn gpt2_attention_core(name: &str, implementation: AttentionKernel) -> Layer {
    let kind = LayerKind::Attention {
        heads: 12,
        kv_heads: 12,
        causal: true,
        implementation,
        dropout: false,
        value_head_dim: None,
    };
    Layer::new(name, kind, Shape::from([1024, 3 * 768])).expect("a valid attention core")
}

#[cfg(test)]
mod tests;
