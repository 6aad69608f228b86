//! Layers: shape propagation and per-sample cost (parameters, FLOPs, memory traffic, saved
//! activations) of each kind of neural-network layer.
//!
//! Conventions used throughout:
//! - Shapes are per sample, channels first, without the batch dimension (`3x224x224`).
//! - One multiply-accumulate (MAC) is 2 FLOPs.
//! - FLOPs and activation traffic are per sample and scale linearly with the batch; weights are
//!   read (and their gradients written) once per batch, whatever its size.
//! - Traffic is counted in elements; [`LayerCost::bytes`] turns it into bytes for a dtype.
//! - Convolution and linear layers cost the same FLOPs in each of forward, backward-data and
//!   backward-weight (three matrix products of the same size). Element-wise, normalization and
//!   pooling layers count a few FLOPs per element: they are memory-bound on every GPU in the
//!   catalog, so these counts barely matter.

use std::fmt;

use serde::Serialize;

use crate::device::Dtype;

/// A per-sample tensor shape, channels first, without the batch dimension (`[3, 224, 224]`).
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

/// What a layer computes. Two-dimensional kinds take `[channels, height, width]`; pairs are
/// `(height, width)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum LayerKind {
    /// 2-D convolution (cross-correlation), dilation 1.
    Conv2d {
        /// Output channels.
        out_channels: u64,
        /// Kernel size.
        kernel: (u64, u64),
        /// Stride.
        stride: (u64, u64),
        /// Zero padding added on each side.
        padding: (u64, u64),
        /// Channel groups: 1 is a dense convolution, `in_channels` a depthwise one.
        groups: u64,
        /// Whether a bias is added per output channel.
        bias: bool,
    },
    /// Batch normalization over each channel, in training mode (batch statistics), with a
    /// learned scale and shift per channel.
    BatchNorm2d,
    /// Rectified linear unit.
    Relu,
    /// 2-D max pooling (floor rounding of the output size, as PyTorch's default).
    MaxPool2d {
        /// Window size.
        kernel: (u64, u64),
        /// Stride.
        stride: (u64, u64),
        /// Implicit padding on each side; at most half the window.
        padding: (u64, u64),
    },
    /// Average over all spatial positions of each channel: `[C, H, W]` -> `[C]` (includes the
    /// flatten that follows it in torchvision models).
    GlobalAvgPool,
    /// Fully connected layer applied to the last dimension.
    Linear {
        /// Output features.
        out_features: u64,
        /// Whether a bias is added.
        bias: bool,
    },
    /// Reshape to one dimension. A view: no kernel, no traffic, no FLOPs.
    Flatten,
    /// Element-wise sum of two inputs of the same shape (a residual connection); the layer's
    /// input shape is the shape of each operand.
    Add,
}

impl LayerKind {
    /// Short lowercase name of the kind (`"conv2d"`), for tables and errors.
    pub const fn name(&self) -> &'static str {
        match self {
            LayerKind::Conv2d { .. } => "conv2d",
            LayerKind::BatchNorm2d => "batchnorm2d",
            LayerKind::Relu => "relu",
            LayerKind::MaxPool2d { .. } => "maxpool2d",
            LayerKind::GlobalAvgPool => "global-avg-pool",
            LayerKind::Linear { .. } => "linear",
            LayerKind::Flatten => "flatten",
            LayerKind::Add => "add",
        }
    }
}

/// The kind of kernel an operation is, which decides the efficiency the compute model applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpClass {
    /// Matrix products: convolution, linear, matmul. Usually compute-bound.
    Gemm,
    /// One output per input element: activation functions, residual add, reshapes.
    Elementwise,
    /// Outputs that combine many inputs: normalization statistics, pooling.
    Reduction,
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
    /// Learned parameters (weights and biases; not running statistics).
    pub params: u64,
    /// Forward FLOPs per sample.
    pub forward_flops: f64,
    /// Backward FLOPs per sample to compute the input gradient.
    pub backward_data_flops: f64,
    /// Backward FLOPs per sample to compute the weight gradient (0 without weights; for
    /// batch normalization the weight gradient comes out of the backward-data kernel and is
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
    /// Kernel class, for the compute model's efficiencies.
    pub class: OpClass,
}

impl LayerCost {
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

    /// Bytes moved by `pass` for `batch` samples stored as `dtype`.
    pub fn bytes(&self, pass: Pass, batch: u64, dtype: Dtype) -> f64 {
        self.traffic(pass).elements(batch) * dtype.bytes() as f64
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
        Pass::ALL
            .into_iter()
            .all(|pass| self.flops(pass, 1) == 0.0 && self.traffic(pass) == Traffic::default())
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
        /// Which parameter.
        parameter: &'static str,
    },
    /// Input or output channels are not a multiple of the groups.
    #[error(
        "layer {layer} (conv2d): {in_channels} input and {out_channels} output channels must both be \
         multiples of groups = {groups}"
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
        "layer {layer} ({kind}): kernel {kernel_h}x{kernel_w} is larger than the padded input \
         {padded_h}x{padded_w}; use a smaller kernel or more padding"
    )]
    KernelTooLarge {
        /// The layer's name.
        layer: String,
        /// The layer kind.
        kind: &'static str,
        /// Kernel height.
        kernel_h: u64,
        /// Kernel width.
        kernel_w: u64,
        /// Input height plus padding.
        padded_h: u64,
        /// Input width plus padding.
        padded_w: u64,
    },
    /// Pooling padding larger than half the window (PyTorch rejects it too).
    #[error(
        "layer {layer} (maxpool2d): padding {padding_h}x{padding_w} is more than half the kernel \
         {kernel_h}x{kernel_w}"
    )]
    PaddingTooLarge {
        /// The layer's name.
        layer: String,
        /// Padding height.
        padding_h: u64,
        /// Padding width.
        padding_w: u64,
        /// Kernel height.
        kernel_h: u64,
        /// Kernel width.
        kernel_w: u64,
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
    /// Parameters, FLOPs and traffic.
    pub cost: LayerCost,
}

impl Layer {
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

    /// Multiply-accumulates per sample of a convolution or linear layer; 0 for other kinds.
    pub fn macs(&self) -> f64 {
        let outputs = self.output.elements() as f64;
        match self.kind {
            LayerKind::Conv2d { kernel, groups, .. } => {
                let in_channels = self.input.0.first().copied().unwrap_or(0);
                outputs
                    * in_channels.checked_div(groups).unwrap_or(0) as f64
                    * kernel.0 as f64
                    * kernel.1 as f64
            }
            LayerKind::Linear { .. } => outputs * self.input.0.last().copied().unwrap_or(0) as f64,
            LayerKind::BatchNorm2d
            | LayerKind::Relu
            | LayerKind::MaxPool2d { .. }
            | LayerKind::GlobalAvgPool
            | LayerKind::Flatten
            | LayerKind::Add => 0.0,
        }
    }
}

/// The largest element, weight or MAC count a layer may have: small multiples and sums of such
/// counts (traffic is a few of them added) cannot overflow a `u64`.
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

    /// `value` if it is known and at most [`COUNT_LIMIT`], else an error naming `what`.
    fn bounded(&self, what: &'static str, value: Option<u64>) -> Result<u64, LayerError> {
        value.filter(|&value| value <= COUNT_LIMIT).ok_or_else(|| self.too_large(what))
    }

    /// The product of `factors`, or an error naming `what` if it exceeds [`COUNT_LIMIT`].
    fn product(&self, what: &'static str, factors: &[u64]) -> Result<u64, LayerError> {
        self.bounded(what, factors.iter().try_fold(1u64, |product, &factor| product.checked_mul(factor)))
    }

    fn nonzero(&self, parameter: &'static str, values: &[u64]) -> Result<(), LayerError> {
        if values.contains(&0) { Err(self.zero(parameter)) } else { Ok(()) }
    }

    /// `[C, H, W]` of a 2-D layer's input.
    fn chw(&self, input: &Shape) -> Result<(u64, u64, u64), LayerError> {
        match input.0[..] {
            [c, h, w] => Ok((c, h, w)),
            _ => Err(self.rank(input, "3 ([channels, height, width])")),
        }
    }

    /// Output size of a sliding window along one axis, or an error if it does not fit.
    fn window(
        &self,
        input: (u64, u64),
        kernel: (u64, u64),
        stride: (u64, u64),
        padding: (u64, u64),
    ) -> Result<(u64, u64), LayerError> {
        self.nonzero("kernel size", &[kernel.0, kernel.1])?;
        self.nonzero("stride", &[stride.0, stride.1])?;
        let padded = |size: u64, pad: u64| pad.checked_mul(2).and_then(|both| size.checked_add(both));
        let (Some(padded_h), Some(padded_w)) = (padded(input.0, padding.0), padded(input.1, padding.1))
        else {
            return Err(self.too_large("the padded input"));
        };
        if kernel.0 > padded_h || kernel.1 > padded_w {
            return Err(LayerError::KernelTooLarge {
                layer: self.layer.to_string(),
                kind: self.kind,
                kernel_h: kernel.0,
                kernel_w: kernel.1,
                padded_h,
                padded_w,
            });
        }
        Ok(((padded_h - kernel.0) / stride.0 + 1, (padded_w - kernel.1) / stride.1 + 1))
    }

    fn shape_and_cost(&self, kind: &LayerKind, input: &Shape) -> Result<(Shape, LayerCost), LayerError> {
        let elements_in = self.bounded("the input size", input.checked_elements())?;
        self.nonzero("an input dimension", &input.0)?;
        match *kind {
            LayerKind::Conv2d { out_channels, kernel, stride, padding, groups, bias } => {
                let (channels, h, w) = self.chw(input)?;
                self.nonzero("out_channels", &[out_channels])?;
                self.nonzero("groups", &[groups])?;
                if channels % groups != 0 || out_channels % groups != 0 {
                    return Err(LayerError::Groups {
                        layer: self.layer.to_string(),
                        in_channels: channels,
                        out_channels,
                        groups,
                    });
                }
                let (out_h, out_w) = self.window((h, w), kernel, stride, padding)?;
                let output = Shape(vec![out_channels, out_h, out_w]);
                let elements_out = self.product("the output size", &output.0)?;
                let weights =
                    self.product("the weight count", &[out_channels, channels / groups, kernel.0, kernel.1])?;
                let macs =
                    self.product("the MAC count", &[elements_out, channels / groups, kernel.0, kernel.1])?;
                Ok((
                    output,
                    gemm_cost(weights, bias.then_some(out_channels), macs, elements_in, elements_out),
                ))
            }
            LayerKind::Linear { out_features, bias } => {
                let Some((&in_features, leading)) = input.0.split_last() else {
                    return Err(self.rank(input, "at least 1 (features last)"));
                };
                self.nonzero("out_features", &[out_features])?;
                let mut dims = leading.to_vec();
                dims.push(out_features);
                let output = Shape(dims);
                let elements_out = self.product("the output size", &output.0)?;
                let weights = self.product("the weight count", &[in_features, out_features])?;
                let macs = self.product("the MAC count", &[elements_out, in_features])?;
                Ok((
                    output,
                    gemm_cost(weights, bias.then_some(out_features), macs, elements_in, elements_out),
                ))
            }
            LayerKind::BatchNorm2d => {
                let (channels, _, _) = self.chw(input)?;
                let n = elements_in as f64;
                let params = self.product("the parameter count", &[2, channels])?;
                let cost = LayerCost {
                    params,
                    // Statistics (sum, sum of squares: 3 per element) then the affine
                    // normalization (subtract, 2 multiplies, add: 4 per element).
                    forward_flops: 7.0 * n,
                    // Reductions for the scale and shift gradients, then the input gradient.
                    backward_data_flops: 12.0 * n,
                    backward_weight_flops: 0.0,
                    // Read the input twice (statistics, normalize), write the output.
                    forward_traffic: Traffic { per_sample: 3 * elements_in, per_batch: params },
                    // Read gradient and input twice (reduce, then apply), write the input
                    // gradient; read scale and shift, write their gradients.
                    backward_data_traffic: Traffic { per_sample: 5 * elements_in, per_batch: 2 * params },
                    backward_weight_traffic: Traffic::default(),
                    activation_elements: elements_in,
                    class: OpClass::Reduction,
                };
                Ok((input.clone(), cost))
            }
            LayerKind::Relu => {
                let n = elements_in as f64;
                let cost = LayerCost {
                    params: 0,
                    forward_flops: n,
                    backward_data_flops: n,
                    backward_weight_flops: 0.0,
                    forward_traffic: Traffic { per_sample: 2 * elements_in, per_batch: 0 },
                    // Read the output gradient and the saved output, write the input gradient.
                    backward_data_traffic: Traffic { per_sample: 3 * elements_in, per_batch: 0 },
                    backward_weight_traffic: Traffic::default(),
                    activation_elements: elements_in,
                    class: OpClass::Elementwise,
                };
                Ok((input.clone(), cost))
            }
            LayerKind::MaxPool2d { kernel, stride, padding } => {
                let (channels, h, w) = self.chw(input)?;
                self.nonzero("kernel size", &[kernel.0, kernel.1])?;
                if padding.0 > kernel.0 / 2 || padding.1 > kernel.1 / 2 {
                    return Err(LayerError::PaddingTooLarge {
                        layer: self.layer.to_string(),
                        padding_h: padding.0,
                        padding_w: padding.1,
                        kernel_h: kernel.0,
                        kernel_w: kernel.1,
                    });
                }
                let (out_h, out_w) = self.window((h, w), kernel, stride, padding)?;
                let output = Shape(vec![channels, out_h, out_w]);
                let elements_out = self.product("the output size", &output.0)?;
                let window = self.product("the window size", &[kernel.0, kernel.1])?;
                let cost = LayerCost {
                    params: 0,
                    // One comparison per window element.
                    forward_flops: elements_out as f64 * window as f64,
                    backward_data_flops: elements_out as f64,
                    backward_weight_flops: 0.0,
                    // Read the input, write the output and the argmax indices.
                    forward_traffic: Traffic { per_sample: elements_in + 2 * elements_out, per_batch: 0 },
                    // Read the output gradient and the indices, write (scatter) the input gradient.
                    backward_data_traffic: Traffic {
                        per_sample: elements_in + 2 * elements_out,
                        per_batch: 0,
                    },
                    backward_weight_traffic: Traffic::default(),
                    // PyTorch keeps the input and the argmax indices.
                    activation_elements: elements_in + elements_out,
                    class: OpClass::Reduction,
                };
                Ok((output, cost))
            }
            LayerKind::GlobalAvgPool => {
                let (channels, _, _) = self.chw(input)?;
                let cost = LayerCost {
                    params: 0,
                    // One add per input element, one divide per channel.
                    forward_flops: (elements_in + channels) as f64,
                    backward_data_flops: elements_in as f64,
                    backward_weight_flops: 0.0,
                    forward_traffic: Traffic { per_sample: elements_in + channels, per_batch: 0 },
                    backward_data_traffic: Traffic { per_sample: elements_in + channels, per_batch: 0 },
                    backward_weight_traffic: Traffic::default(),
                    // The backward only needs the input's shape.
                    activation_elements: 0,
                    class: OpClass::Reduction,
                };
                Ok((Shape(vec![channels]), cost))
            }
            LayerKind::Flatten => {
                let cost = LayerCost {
                    params: 0,
                    forward_flops: 0.0,
                    backward_data_flops: 0.0,
                    backward_weight_flops: 0.0,
                    forward_traffic: Traffic::default(),
                    backward_data_traffic: Traffic::default(),
                    backward_weight_traffic: Traffic::default(),
                    activation_elements: 0,
                    class: OpClass::Elementwise,
                };
                Ok((Shape(vec![elements_in]), cost))
            }
            LayerKind::Add => {
                let n = elements_in as f64;
                let cost = LayerCost {
                    params: 0,
                    forward_flops: n,
                    // The add's backward passes its gradient to both branches unchanged; the
                    // two branch gradients are summed where the branches split, and that sum
                    // is counted here.
                    backward_data_flops: n,
                    backward_weight_flops: 0.0,
                    forward_traffic: Traffic { per_sample: 3 * elements_in, per_batch: 0 },
                    backward_data_traffic: Traffic { per_sample: 3 * elements_in, per_batch: 0 },
                    backward_weight_traffic: Traffic::default(),
                    activation_elements: 0,
                    class: OpClass::Elementwise,
                };
                Ok((input.clone(), cost))
            }
        }
    }
}

/// Cost of a convolution or linear layer: three products of `macs` MACs each.
///
/// Forward reads the input and the weights and writes the output; backward-data reads the
/// output gradient and the weights and writes the input gradient; backward-weight reads the
/// output gradient and the saved input and writes the weight (and bias) gradients.
fn gemm_cost(weights: u64, bias: Option<u64>, macs: u64, elements_in: u64, elements_out: u64) -> LayerCost {
    let bias = bias.unwrap_or(0);
    let params = weights + bias;
    let gemm_flops = 2.0 * macs as f64;
    // A bias adds one FLOP per output element forward, and its gradient sums one per output
    // element backward.
    let bias_flops = if bias > 0 { elements_out as f64 } else { 0.0 };
    let activations = elements_in + elements_out;
    LayerCost {
        params,
        forward_flops: gemm_flops + bias_flops,
        backward_data_flops: gemm_flops,
        backward_weight_flops: gemm_flops + bias_flops,
        forward_traffic: Traffic { per_sample: activations, per_batch: params },
        backward_data_traffic: Traffic { per_sample: activations, per_batch: weights },
        backward_weight_traffic: Traffic { per_sample: activations, per_batch: params },
        activation_elements: elements_in,
        class: OpClass::Gemm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(out_channels: u64, kernel: u64, stride: u64, padding: u64) -> LayerKind {
        LayerKind::Conv2d {
            out_channels,
            kernel: (kernel, kernel),
            stride: (stride, stride),
            padding: (padding, padding),
            groups: 1,
            bias: false,
        }
    }

    #[test]
    fn shapes_print_and_count() {
        let shape = Shape::from([3, 224, 224]);
        assert_eq!(shape.to_string(), "3x224x224");
        assert_eq!(shape.elements(), 150_528);
        assert_eq!(Shape(vec![]).to_string(), "scalar");
        assert_eq!(Shape(vec![u64::MAX, 2]).checked_elements(), None);
    }

    #[test]
    fn resnet_stem_convolution_has_the_textbook_shape_and_cost() {
        let layer = Layer::new("conv1", conv(64, 7, 2, 3), Shape::from([3, 224, 224])).unwrap();
        assert_eq!(layer.output, Shape::from([64, 112, 112]));
        assert_eq!(layer.cost.params, 64 * 3 * 7 * 7);
        assert_eq!(layer.macs(), (64 * 112 * 112 * 3 * 7 * 7) as f64);
        assert_eq!(layer.cost.forward_flops, 2.0 * layer.macs());
        assert_eq!(layer.cost.backward_data_flops, layer.cost.forward_flops);
        assert_eq!(layer.cost.backward_weight_flops, layer.cost.forward_flops);
        assert_eq!(layer.cost.activation_elements, 3 * 224 * 224);
        assert_eq!(layer.cost.class, OpClass::Gemm);
    }

    #[test]
    fn weights_are_read_once_per_batch_and_activations_per_sample() {
        let layer =
            Layer::new("fc", LayerKind::Linear { out_features: 1000, bias: true }, Shape::from([2048]))
                .unwrap();
        assert_eq!(layer.cost.params, 2048 * 1000 + 1000);
        assert_eq!(layer.macs(), 2048.0 * 1000.0);
        let one = layer.cost.forward_bytes(1, Dtype::Fp16);
        let many = layer.cost.forward_bytes(64, Dtype::Fp16);
        let activations = (2048 + 1000) as f64 * 2.0;
        assert_eq!(one, activations + layer.cost.params as f64 * 2.0);
        assert_eq!(many - one, 63.0 * activations);
        assert_eq!(layer.cost.forward_bytes(1, Dtype::Fp32), 2.0 * one);
        assert_eq!(layer.cost.flops(Pass::Forward, 64), 64.0 * layer.cost.forward_flops);
        assert_eq!(
            layer.cost.backward_bytes(8, Dtype::Fp32),
            layer.cost.bytes(Pass::BackwardData, 8, Dtype::Fp32)
                + layer.cost.bytes(Pass::BackwardWeight, 8, Dtype::Fp32)
        );
    }

    #[test]
    fn grouped_and_strided_convolutions() {
        let depthwise = LayerKind::Conv2d {
            out_channels: 32,
            kernel: (3, 3),
            stride: (2, 2),
            padding: (1, 1),
            groups: 32,
            bias: true,
        };
        let layer = Layer::new("dw", depthwise, Shape::from([32, 15, 15])).unwrap();
        assert_eq!(layer.output, Shape::from([32, 8, 8]));
        assert_eq!(layer.cost.params, 32 * 9 + 32);
        assert_eq!(layer.macs(), (32 * 8 * 8 * 9) as f64);
    }

    #[test]
    fn pooling_and_elementwise_layers() {
        let pool = LayerKind::MaxPool2d { kernel: (3, 3), stride: (2, 2), padding: (1, 1) };
        let layer = Layer::new("maxpool", pool, Shape::from([64, 112, 112])).unwrap();
        assert_eq!(layer.output, Shape::from([64, 56, 56]));
        assert_eq!(layer.cost.class, OpClass::Reduction);
        let gap = Layer::new("avgpool", LayerKind::GlobalAvgPool, Shape::from([2048, 7, 7])).unwrap();
        assert_eq!(gap.output, Shape::from([2048]));
        let bn = Layer::new("bn", LayerKind::BatchNorm2d, Shape::from([64, 56, 56])).unwrap();
        assert_eq!(bn.cost.params, 128);
        assert_eq!(bn.output, bn.input);
        let relu = Layer::new("relu", LayerKind::Relu, Shape::from([64, 56, 56])).unwrap();
        assert_eq!(relu.cost.class, OpClass::Elementwise);
        assert_eq!(relu.macs(), 0.0);
        let flat = Layer::new("flatten", LayerKind::Flatten, Shape::from([512, 1, 1])).unwrap();
        assert_eq!(flat.output, Shape::from([512]));
        assert!(flat.cost.is_free());
        assert!(!relu.cost.is_free());
    }

    #[test]
    fn bad_shapes_and_parameters_name_the_layer() {
        let error = Layer::new("stem", conv(64, 7, 2, 3), Shape::from([224])).unwrap_err().to_string();
        assert!(
            error.contains("stem") && error.contains("rank 1") && error.contains("expected 3"),
            "{error}"
        );

        let grouped = LayerKind::Conv2d {
            out_channels: 64,
            kernel: (3, 3),
            stride: (1, 1),
            padding: (1, 1),
            groups: 4,
            bias: false,
        };
        let error = Layer::new("layer2.0.conv2", grouped, Shape::from([30, 8, 8])).unwrap_err();
        assert!(matches!(error, LayerError::Groups { in_channels: 30, groups: 4, .. }));
        assert!(error.to_string().contains("layer2.0.conv2"), "{error}");

        let error = Layer::new("big", conv(8, 9, 1, 0), Shape::from([3, 4, 4])).unwrap_err().to_string();
        assert!(error.contains("big") && error.contains("9x9") && error.contains("4x4"), "{error}");

        let error = Layer::new("z", conv(8, 3, 0, 1), Shape::from([3, 4, 4])).unwrap_err().to_string();
        assert!(error.contains("stride is zero"), "{error}");

        let pool = LayerKind::MaxPool2d { kernel: (2, 2), stride: (2, 2), padding: (2, 2) };
        let error = Layer::new("pool", pool, Shape::from([3, 8, 8])).unwrap_err().to_string();
        assert!(error.contains("pool") && error.contains("half"), "{error}");

        let error =
            Layer::residual_add("layer1.0.add", Shape::from([256, 56, 56]), &Shape::from([64, 56, 56]))
                .unwrap_err()
                .to_string();
        assert!(error.contains("layer1.0.add") && error.contains("64x56x56"), "{error}");

        let error = Layer::new("fc", LayerKind::Linear { out_features: 10, bias: true }, Shape(vec![]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("fc") && error.contains("rank 0"), "{error}");
    }
}
