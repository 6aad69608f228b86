//! Matrix-product and spatial layers: convolution, transposed convolution, linear, matmul,
//! pooling, upsampling, cropping.

use super::{Checker, LayerCost, LayerError, OpClass, Padding, Shape, Traffic, Training, UpsampleMode};

/// Output sizes of a sliding window over `spatial`, per axis.
struct Window<'a> {
    kernel: &'a [u64],
    stride: &'a [u64],
    dilation: Option<&'a [u64]>,
    padding: &'a Padding,
    ceil_mode: bool,
}

impl Checker<'_> {
    fn window(&self, spatial: &[u64], window: &Window<'_>) -> Result<Vec<u64>, LayerError> {
        let axes = spatial.len();
        self.per_axis("kernel", window.kernel, axes)?;
        self.per_axis("stride", window.stride, axes)?;
        self.nonzero("kernel size", window.kernel)?;
        self.nonzero("stride", window.stride)?;
        if let Some(dilation) = window.dilation {
            self.per_axis("dilation", dilation, axes)?;
            self.nonzero("dilation", dilation)?;
        }
        if let Padding::Symmetric(padding) = window.padding {
            self.per_axis("padding", padding, axes)?;
        }
        let mut effective = Vec::with_capacity(axes);
        for (axis, &kernel) in window.kernel.iter().enumerate() {
            let dilation = window.dilation.map_or(1, |dilation| dilation[axis]);
            let span = (kernel - 1).checked_mul(dilation).and_then(|span| span.checked_add(1));
            effective.push(self.bounded("the dilated kernel", span)?);
        }
        match window.padding {
            Padding::Same => {
                Ok(spatial.iter().zip(window.stride).map(|(&size, &stride)| size.div_ceil(stride)).collect())
            }
            Padding::Symmetric(padding) => {
                let mut padded = Vec::with_capacity(axes);
                for (&size, &pad) in spatial.iter().zip(padding) {
                    let both = pad.checked_mul(2).and_then(|both| size.checked_add(both));
                    padded.push(self.bounded("the padded input", both)?);
                }
                if effective.iter().zip(&padded).any(|(kernel, padded)| kernel > padded) {
                    return Err(LayerError::KernelTooLarge {
                        layer: self.layer.to_string(),
                        kind: self.kind,
                        kernel: Shape(effective),
                        padded: Shape(padded),
                    });
                }
                let mut output = Vec::with_capacity(axes);
                for axis in 0..axes {
                    let (span, stride) = (padded[axis] - effective[axis], window.stride[axis]);
                    let mut size = if window.ceil_mode { span.div_ceil(stride) } else { span / stride } + 1;
                    // PyTorch: with ceil_mode, the last window must start inside the input or
                    // its left padding.
                    if window.ceil_mode && (size - 1) * stride >= spatial[axis] + padding[axis] {
                        size -= 1;
                    }
                    output.push(size);
                }
                Ok(output)
            }
        }
    }

    /// Pooling padding may be at most half the window, as PyTorch requires.
    fn pool_padding(&self, kernel: &[u64], padding: &[u64]) -> Result<(), LayerError> {
        if padding.iter().zip(kernel).any(|(&pad, &kernel)| pad > kernel / 2) {
            return Err(LayerError::PaddingTooLarge {
                layer: self.layer.to_string(),
                kind: self.kind,
                padding: Shape(padding.to_vec()),
                kernel: Shape(kernel.to_vec()),
            });
        }
        Ok(())
    }

    fn groups(&self, in_channels: u64, out_channels: u64, groups: u64) -> Result<(), LayerError> {
        self.nonzero("out_channels", &[out_channels])?;
        self.nonzero("groups", &[groups])?;
        if in_channels % groups != 0 || out_channels % groups != 0 {
            return Err(LayerError::Groups {
                layer: self.layer.to_string(),
                in_channels,
                out_channels,
                groups,
            });
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)] // the fields of LayerKind::Conv
    pub(super) fn conv(
        &self,
        input: &Shape,
        out_channels: u64,
        kernel: &[u64],
        stride: &[u64],
        padding: &Padding,
        dilation: &[u64],
        groups: u64,
        bias: bool,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let (channels, spatial) = self.spatial(input, kernel.len())?;
        self.groups(channels, out_channels, groups)?;
        let window = Window { kernel, stride, dilation: Some(dilation), padding, ceil_mode: false };
        let mut dims = vec![out_channels];
        dims.extend(self.window(spatial, &window)?);
        let output = Shape(dims);
        let elements_in = self.product("the input size", &input.0)?;
        let elements_out = self.product("the output size", &output.0)?;
        let taps = self.product("the kernel size", kernel)?;
        let weights = self.product("the weight count", &[out_channels, channels / groups, taps])?;
        let macs = self.product("the MAC count", &[elements_out, channels / groups, taps])?;
        let bias = bias.then_some(out_channels);
        Ok((output, gemm_cost(weights, bias, false, macs, elements_in, elements_out)))
    }

    #[allow(clippy::too_many_arguments)] // the fields of LayerKind::ConvTranspose
    pub(super) fn conv_transpose(
        &self,
        input: &Shape,
        out_channels: u64,
        kernel: &[u64],
        stride: &[u64],
        padding: &[u64],
        output_padding: &[u64],
        dilation: &[u64],
        groups: u64,
        bias: bool,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let axes = kernel.len();
        let (channels, spatial) = self.spatial(input, axes)?;
        self.groups(channels, out_channels, groups)?;
        for (parameter, values) in
            [("kernel", kernel), ("stride", stride), ("padding", padding), ("output_padding", output_padding)]
        {
            self.per_axis(parameter, values, axes)?;
        }
        self.per_axis("dilation", dilation, axes)?;
        self.nonzero("kernel size", kernel)?;
        self.nonzero("stride", stride)?;
        self.nonzero("dilation", dilation)?;
        let mut dims = vec![out_channels];
        for axis in 0..axes {
            if output_padding[axis] >= stride[axis].max(dilation[axis]) {
                return Err(self.invalid(format!(
                    "output_padding {} must be smaller than the stride {} or the dilation {}",
                    output_padding[axis], stride[axis], dilation[axis]
                )));
            }
            // (in - 1) * stride + dilation * (kernel - 1) + output_padding + 1 - 2 * padding
            let full = (spatial[axis] - 1)
                .checked_mul(stride[axis])
                .and_then(|size| {
                    dilation[axis].checked_mul(kernel[axis] - 1).and_then(|span| size.checked_add(span))
                })
                .and_then(|size| size.checked_add(output_padding[axis] + 1));
            let full = self.bounded("the output size", full)?;
            match padding[axis].checked_mul(2).filter(|&both| both < full) {
                Some(both) => dims.push(full - both),
                None => {
                    return Err(self.invalid(format!(
                        "padding {} removes the whole output (size {full} before padding) along spatial axis {axis}",
                        padding[axis]
                    )));
                }
            }
        }
        let output = Shape(dims);
        let elements_in = self.product("the input size", &input.0)?;
        let elements_out = self.product("the output size", &output.0)?;
        let taps = self.product("the kernel size", kernel)?;
        let weights = self.product("the weight count", &[channels, out_channels / groups, taps])?;
        // Every input element is scattered into `out_channels / groups` kernels of `taps` taps.
        let macs = self.product("the MAC count", &[elements_in, out_channels / groups, taps])?;
        let bias = bias.then_some(out_channels);
        Ok((output, gemm_cost(weights, bias, false, macs, elements_in, elements_out)))
    }

    pub(super) fn linear(
        &self,
        input: &Shape,
        out_features: u64,
        bias: bool,
        tied: bool,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let Some((&in_features, leading)) = input.0.split_last() else {
            return Err(self.rank(input, "at least 1 (features last)"));
        };
        self.nonzero("out_features", &[out_features])?;
        let mut dims = leading.to_vec();
        dims.push(out_features);
        let output = Shape(dims);
        let elements_in = self.product("the input size", &input.0)?;
        let elements_out = self.product("the output size", &output.0)?;
        let weights = self.product("the weight count", &[in_features, out_features])?;
        let macs = self.product("the MAC count", &[elements_out, in_features])?;
        let bias = bias.then_some(out_features);
        Ok((output, gemm_cost(weights, bias, tied, macs, elements_in, elements_out)))
    }

    /// LoRA's adapter beside a linear layer reading `input`: `x A` then `(x A) B`, added to
    /// the frozen layer's output (which it reads and writes again). Backward-data: the two
    /// transposed products, the result added into the input gradient the frozen layer wrote;
    /// backward-weight: the gradients of `B` and `A`. It keeps its intermediate `x A` for the
    /// backward (the input `x` is the frozen layer's, kept by it).
    pub(super) fn lora_adapter(
        &self,
        input: &Shape,
        rank: u64,
        out_features: u64,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let Some((&in_features, leading)) = input.0.split_last() else {
            return Err(self.rank(input, "at least 1 (features last)"));
        };
        self.nonzero("rank", &[rank])?;
        self.nonzero("out_features", &[out_features])?;
        let mut dims = leading.to_vec();
        dims.push(out_features);
        let output = Shape(dims);
        let tokens = self.product("the token count", leading)?;
        let elements_in = self.product("the input size", &input.0)?;
        let elements_out = self.product("the output size", &output.0)?;
        let inner = self.product("the adapter's intermediate size", &[tokens, rank])?;
        let weights =
            self.product("the adapter's weight count", &[rank, in_features.saturating_add(out_features)])?;
        let macs = self.product("the MAC count", &[tokens, weights])?;
        let gemm_flops = 2.0 * macs as f64;
        Ok((
            output,
            LayerCost {
                params: weights,
                macs: macs as f64,
                // The add into the frozen layer's output: one FLOP per output element.
                forward_flops: gemm_flops + elements_out as f64,
                backward_data_flops: gemm_flops + elements_in as f64,
                backward_weight_flops: gemm_flops,
                // x in, x A out and in again, the frozen output read and written.
                forward_traffic: Traffic {
                    per_sample: elements_in + 2 * inner + 2 * elements_out,
                    per_batch: weights,
                },
                // The output gradient in, its product out and in, the input gradient read and written.
                backward_data_traffic: Traffic {
                    per_sample: elements_out + 2 * inner + 2 * elements_in,
                    per_batch: weights,
                },
                // x, x A and the output gradient in; the weight gradients out.
                backward_weight_traffic: Traffic {
                    per_sample: elements_in + inner + elements_out,
                    per_batch: weights,
                },
                activation_elements: inner,
                mask_bytes: [0; 3],
                class: OpClass::Gemm,
                training: Training::Trained,
            },
        ))
    }

    pub(super) fn matmul(&self, input: &Shape, other: &Shape) -> Result<(Shape, LayerCost), LayerError> {
        let (Some((batch, [m, k])), Some((other_batch, [other_k, n]))) =
            (input.0.split_last_chunk::<2>(), other.0.split_last_chunk::<2>())
        else {
            return Err(self.invalid(format!(
                "operands {input} and {other} must both have rank at least 2 ([batch..., rows, columns])"
            )));
        };
        if batch != other_batch || k != other_k {
            return Err(self.invalid(format!(
                "cannot multiply {input} by {other}: expected the second operand to be [{}{k}, n]",
                batch.iter().map(|dim| format!("{dim}, ")).collect::<String>()
            )));
        }
        self.nonzero("a dimension of the second operand", &other.0)?;
        let mut dims = batch.to_vec();
        dims.extend([*m, *n]);
        let output = Shape(dims);
        let elements_in = self.product("the input size", &input.0)?;
        let elements_other = self.product("the second operand's size", &other.0)?;
        let elements_out = self.product("the output size", &output.0)?;
        let macs = self.product("the MAC count", &[elements_out, *k])?;
        let flops = 2.0 * macs as f64;
        let operands = self.sum("the traffic", &[(1, elements_in), (1, elements_other)])?;
        let cost = LayerCost {
            macs: macs as f64,
            forward_flops: flops,
            // One product per operand's gradient.
            backward_data_flops: 2.0 * flops,
            forward_traffic: Traffic { per_sample: operands + elements_out, per_batch: 0 },
            backward_data_traffic: Traffic { per_sample: 2 * operands + elements_out, per_batch: 0 },
            activation_elements: operands,
            ..LayerCost::free(OpClass::Gemm)
        };
        Ok((output, cost))
    }

    pub(super) fn pool(
        &self,
        input: &Shape,
        kernel: &[u64],
        stride: &[u64],
        padding: &[u64],
        ceil_mode: bool,
        max: bool,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let (channels, spatial) = self.spatial(input, kernel.len())?;
        self.per_axis("padding", padding, kernel.len())?;
        self.pool_padding(kernel, padding)?;
        let padding = Padding::Symmetric(padding.to_vec());
        let window = Window { kernel, stride, dilation: None, padding: &padding, ceil_mode };
        let mut dims = vec![channels];
        dims.extend(self.window(spatial, &window)?);
        let output = Shape(dims);
        let elements_in = self.product("the input size", &input.0)?;
        let elements_out = self.product("the output size", &output.0)?;
        let taps = self.product("the window size", kernel)?;
        let cost = if max {
            LayerCost {
                // One comparison per window element.
                forward_flops: elements_out as f64 * taps as f64,
                backward_data_flops: elements_out as f64,
                // Read the input, write the output and the argmax indices.
                forward_traffic: Traffic { per_sample: elements_in + 2 * elements_out, per_batch: 0 },
                // Read the output gradient and the indices, write (scatter) the input gradient.
                backward_data_traffic: Traffic { per_sample: elements_in + 2 * elements_out, per_batch: 0 },
                // PyTorch keeps the input and the argmax indices.
                activation_elements: elements_in + elements_out,
                ..LayerCost::free(OpClass::Reduction)
            }
        } else {
            LayerCost {
                // One add per window element and a divide per output.
                forward_flops: elements_out as f64 * (taps + 1) as f64,
                backward_data_flops: elements_out as f64 * taps as f64,
                forward_traffic: Traffic { per_sample: elements_in + elements_out, per_batch: 0 },
                backward_data_traffic: Traffic { per_sample: elements_in + elements_out, per_batch: 0 },
                // The backward needs only the shapes.
                activation_elements: 0,
                ..LayerCost::free(OpClass::Reduction)
            }
        };
        Ok((output, cost))
    }

    pub(super) fn global_pool(
        &self,
        input: &Shape,
        elements_in: u64,
        max: bool,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let Some((&channels, _)) = input.0.split_first().filter(|(_, spatial)| !spatial.is_empty()) else {
            return Err(self.rank(input, "at least 2 ([channels, spatial...])"));
        };
        let cost = LayerCost {
            // One add (or comparison) per input element, one divide per channel.
            forward_flops: (elements_in + channels) as f64,
            backward_data_flops: elements_in as f64,
            forward_traffic: Traffic { per_sample: elements_in + channels, per_batch: 0 },
            backward_data_traffic: Traffic { per_sample: elements_in + channels, per_batch: 0 },
            // An average's backward only needs the input's shape; a max keeps the argmax.
            activation_elements: if max { channels } else { 0 },
            ..LayerCost::free(OpClass::Reduction)
        };
        Ok((Shape(vec![channels]), cost))
    }

    pub(super) fn adaptive_pool(
        &self,
        input: &Shape,
        output: &[u64],
    ) -> Result<(Shape, LayerCost), LayerError> {
        let (channels, spatial) = self.spatial(input, output.len())?;
        self.nonzero("an output size", output)?;
        // Inputs read: per axis, the windows' lengths summed. Windows overlap where the output
        // size does not divide the input size; their lengths sum to `in + out - gcd(in, out)`.
        let mut reads = channels as f64;
        for (&size, &out) in spatial.iter().zip(output) {
            reads *= (size as f64) + (out as f64) - gcd(size, out) as f64;
        }
        let mut dims = vec![channels];
        dims.extend_from_slice(output);
        let output = Shape(dims);
        let elements_in = self.product("the input size", &input.0)?;
        let elements_out = self.product("the output size", &output.0)?;
        let cost = LayerCost {
            forward_flops: reads + elements_out as f64,
            backward_data_flops: reads,
            forward_traffic: Traffic { per_sample: elements_in + elements_out, per_batch: 0 },
            backward_data_traffic: Traffic { per_sample: elements_in + elements_out, per_batch: 0 },
            ..LayerCost::free(OpClass::Reduction)
        };
        Ok((output, cost))
    }

    pub(super) fn upsample(
        &self,
        input: &Shape,
        scale: &[u64],
        mode: UpsampleMode,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let (channels, spatial) = self.spatial(input, scale.len())?;
        self.nonzero("scale", scale)?;
        let mut dims = vec![channels];
        for (&size, &factor) in spatial.iter().zip(scale) {
            dims.push(self.product("the output size", &[size, factor])?);
        }
        let output = Shape(dims);
        let elements_in = self.product("the input size", &input.0)?;
        let elements_out = self.product("the output size", &output.0)?;
        let per_output = match mode {
            UpsampleMode::Nearest => 0.0,
            UpsampleMode::Linear => (2u64 << scale.len()) as f64 - 1.0,
        };
        let cost = LayerCost {
            forward_flops: per_output * elements_out as f64,
            // The backward sums each output gradient into the inputs it came from.
            backward_data_flops: (per_output.max(1.0)) * elements_out as f64,
            forward_traffic: Traffic { per_sample: elements_in + elements_out, per_batch: 0 },
            backward_data_traffic: Traffic { per_sample: elements_in + elements_out, per_batch: 0 },
            ..LayerCost::free(OpClass::Elementwise)
        };
        Ok((output, cost))
    }

    pub(super) fn crop(&self, input: &Shape, size: &[u64]) -> Result<(Shape, LayerCost), LayerError> {
        let (channels, spatial) = self.spatial(input, size.len())?;
        self.nonzero("a crop size", size)?;
        if size.iter().zip(spatial).any(|(crop, size)| crop > size) {
            return Err(self.invalid(format!(
                "cannot crop {} to {}: the crop must not be larger than the input",
                Shape(spatial.to_vec()),
                Shape(size.to_vec())
            )));
        }
        let mut dims = vec![channels];
        dims.extend_from_slice(size);
        let output = Shape(dims);
        let elements_in = self.product("the input size", &input.0)?;
        let elements_out = self.product("the output size", &output.0)?;
        let cost = LayerCost {
            forward_traffic: Traffic { per_sample: 2 * elements_out, per_batch: 0 },
            // The input gradient is zero outside the crop: written in full.
            backward_data_traffic: Traffic { per_sample: elements_out + elements_in, per_batch: 0 },
            ..LayerCost::free(OpClass::Elementwise)
        };
        Ok((output, cost))
    }
}

/// Cost of a convolution or linear layer: three products of `macs` MACs each.
///
/// Forward reads the input and the weights and writes the output; backward-data reads the
/// output gradient and the weights and writes the input gradient; backward-weight reads the
/// output gradient and the saved input and writes the weight (and bias) gradients. Tied weights
/// are read and their gradients written like owned ones, but they are not parameters here.
fn gemm_cost(
    weights: u64,
    bias: Option<u64>,
    tied: bool,
    macs: u64,
    elements_in: u64,
    elements_out: u64,
) -> LayerCost {
    let bias = bias.unwrap_or(0);
    let gemm_flops = 2.0 * macs as f64;
    // A bias adds one FLOP per output element forward, and its gradient sums one per output
    // element backward.
    let bias_flops = if bias > 0 { elements_out as f64 } else { 0.0 };
    let activations = elements_in + elements_out;
    LayerCost {
        params: if tied { bias } else { weights + bias },
        macs: macs as f64,
        forward_flops: gemm_flops + bias_flops,
        backward_data_flops: gemm_flops,
        backward_weight_flops: gemm_flops + bias_flops,
        forward_traffic: Traffic { per_sample: activations, per_batch: weights + bias },
        backward_data_traffic: Traffic { per_sample: activations, per_batch: weights },
        backward_weight_traffic: Traffic { per_sample: activations, per_batch: weights + bias },
        activation_elements: elements_in,
        mask_bytes: [0; 3],
        class: OpClass::Gemm,
        training: Training::Trained,
    }
}

/// Greatest common divisor.
fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
