//! Element-wise, normalization and data-movement layers: activations, gated units, norms,
//! softmax, dropout, loss, residual add, concatenation and views.

use super::{Activation, Checker, LayerCost, LayerError, LossKernels, OpClass, Shape, Traffic};

impl Checker<'_> {
    pub(super) fn batch_norm(
        &self,
        input: &Shape,
        elements_in: u64,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let Some(&channels) = input.0.first() else {
            return Err(self.rank(input, "at least 1 ([channels, ...])"));
        };
        let n = elements_in as f64;
        let params = self.product("the parameter count", &[2, channels])?;
        let cost = LayerCost {
            params,
            // Statistics (sum, sum of squares: 3 per element) then the affine normalization
            // (subtract, 2 multiplies, add: 4 per element).
            forward_flops: 7.0 * n,
            // Reductions for the scale and shift gradients, then the input gradient.
            backward_data_flops: 12.0 * n,
            // Read the input twice (statistics, normalize), write the output.
            forward_traffic: Traffic {
                per_sample: self.sum("the traffic", &[(3, elements_in)])?,
                per_batch: params,
            },
            // Read gradient and input twice (reduce, then apply), write the input gradient; read
            // scale and shift, write their gradients.
            backward_data_traffic: Traffic {
                per_sample: self.sum("the traffic", &[(5, elements_in)])?,
                per_batch: 2 * params,
            },
            activation_elements: elements_in,
            ..LayerCost::free(OpClass::Reduction)
        };
        Ok((input.clone(), cost))
    }

    /// Layer or RMS normalization over the last dimension: `params_per_feature` learned vectors,
    /// `statistics` saved numbers per row (mean and inverse deviation, or only the latter).
    pub(super) fn row_norm(
        &self,
        input: &Shape,
        elements_in: u64,
        params_per_feature: u64,
        forward_per_element: f64,
        backward_per_element: f64,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let features = self.features(input)?;
        let rows = elements_in / features;
        let statistics = params_per_feature; // LayerNorm keeps mean and 1/std, RMSNorm 1/rms.
        let params = self.product("the parameter count", &[params_per_feature, features])?;
        let n = elements_in as f64;
        let cost = LayerCost {
            params,
            forward_flops: forward_per_element * n,
            backward_data_flops: backward_per_element * n,
            // A row fits on chip: read it once, write the output and the row statistics.
            forward_traffic: Traffic {
                per_sample: self.sum("the traffic", &[(2, elements_in), (statistics, rows)])?,
                per_batch: params,
            },
            // Read the output gradient, the input and the statistics, write the input gradient;
            // read the scale, write the parameter gradients.
            backward_data_traffic: Traffic {
                per_sample: self.sum("the traffic", &[(3, elements_in), (statistics, rows)])?,
                per_batch: 2 * params,
            },
            activation_elements: self
                .sum("the saved activations", &[(1, elements_in), (statistics, rows)])?,
            ..LayerCost::free(OpClass::Normalization)
        };
        Ok((input.clone(), cost))
    }

    pub(super) fn activation(&self, elements_in: u64, function: Activation) -> LayerCost {
        let n = elements_in as f64;
        let (forward, backward) = function.flops_per_element();
        LayerCost {
            forward_flops: forward * n,
            backward_data_flops: backward * n,
            forward_traffic: Traffic { per_sample: 2 * elements_in, per_batch: 0 },
            // Read the output gradient and the saved input (or output), write the input gradient.
            backward_data_traffic: Traffic { per_sample: 3 * elements_in, per_batch: 0 },
            activation_elements: elements_in,
            ..LayerCost::free(OpClass::Elementwise)
        }
    }

    pub(super) fn glu(&self, input: &Shape, function: Activation) -> Result<(Shape, LayerCost), LayerError> {
        let features = self.features(input)?;
        if features % 2 != 0 {
            return Err(self.invalid(format!(
                "the last dimension of {input} is {features}; a gated unit needs an even size (gate and value halves)"
            )));
        }
        let mut dims = input.0.clone();
        if let Some(last) = dims.last_mut() {
            *last = features / 2;
        }
        let output = Shape(dims);
        let elements_in = self.product("the input size", &input.0)?;
        let elements_out = elements_in / 2;
        let (forward, backward) = function.flops_per_element();
        let n = elements_out as f64;
        let cost = LayerCost {
            // The activation of the gate, then one multiply.
            forward_flops: (forward + 1.0) * n,
            // The gate's derivative, and two multiplies for the two halves' gradients.
            backward_data_flops: (backward + 2.0) * n,
            forward_traffic: Traffic { per_sample: elements_in + elements_out, per_batch: 0 },
            backward_data_traffic: Traffic { per_sample: 2 * elements_in + elements_out, per_batch: 0 },
            activation_elements: elements_in,
            ..LayerCost::free(OpClass::Elementwise)
        };
        Ok((output, cost))
    }

    pub(super) fn softmax(&self, input: &Shape, elements_in: u64) -> Result<(Shape, LayerCost), LayerError> {
        self.features(input)?;
        let n = elements_in as f64;
        let cost = LayerCost {
            // Max, subtract, exponential, sum, divide.
            forward_flops: 5.0 * n,
            // dx = y * (dy - sum(y * dy)).
            backward_data_flops: 4.0 * n,
            forward_traffic: Traffic { per_sample: 2 * elements_in, per_batch: 0 },
            backward_data_traffic: Traffic { per_sample: 3 * elements_in, per_batch: 0 },
            activation_elements: elements_in,
            ..LayerCost::free(OpClass::Normalization)
        };
        Ok((input.clone(), cost))
    }

    pub(super) fn dropout(elements_in: u64) -> LayerCost {
        let n = elements_in as f64;
        LayerCost {
            // Draw and compare, then scale.
            forward_flops: 2.0 * n,
            backward_data_flops: n,
            // Read the input, write the output and the mask.
            forward_traffic: Traffic { per_sample: 3 * elements_in, per_batch: 0 },
            // Read the output gradient and the mask, write the input gradient.
            backward_data_traffic: Traffic { per_sample: 3 * elements_in, per_batch: 0 },
            activation_elements: elements_in,
            ..LayerCost::free(OpClass::Elementwise)
        }
    }

    pub(super) fn cross_entropy(
        &self,
        input: &Shape,
        elements_in: u64,
        kernels: LossKernels,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let classes = self.features(input)?;
        let rows = elements_in / classes;
        let n = elements_in as f64;
        let cost = match kernels {
            LossKernels::Fused => LayerCost {
                // Log-softmax (5 per logit), then pick the label's and average (1 per row).
                forward_flops: 5.0 * n + rows as f64,
                // softmax - one-hot, scaled: 2 per logit.
                backward_data_flops: 2.0 * n,
                // Read the logits and labels, write the log-probabilities and the losses.
                forward_traffic: Traffic { per_sample: 2 * elements_in + 2 * rows, per_batch: 0 },
                // Read the log-probabilities and labels, write the logits' gradient.
                backward_data_traffic: Traffic { per_sample: 2 * elements_in + rows, per_batch: 0 },
                activation_elements: elements_in,
                ..LayerCost::free(OpClass::Reduction)
            },
            // The sums of Layer::kernels' parts (megatron_loss_kernels): the cast's 2 elements,
            // then max 1, sub 2, exp 2, sum 1, div 2 per logit forward (one FLOP each but the
            // cast's), multiply 2 and cast 2 backward; the fp32 parts' elements count 4 bytes
            // whatever the compute dtype when the compute model prices the kernels.
            // The sums of torch_loss_kernels' parts: cast 2, log_softmax 2, the pick 2 per
            // row forward; the zero-filled gradient 1 (+ 1 per row), log_softmax's backward 3
            // and the cast 2 backward.
            LossKernels::Torch => LayerCost {
                forward_flops: 5.0 * n + rows as f64,
                backward_data_flops: 2.0 * n,
                forward_traffic: Traffic { per_sample: 4 * elements_in + 2 * rows, per_batch: 0 },
                backward_data_traffic: Traffic { per_sample: 6 * elements_in + rows, per_batch: 0 },
                activation_elements: elements_in,
                ..LayerCost::free(OpClass::Reduction)
            },
            LossKernels::Megatron => LayerCost {
                forward_flops: 5.0 * n,
                backward_data_flops: n,
                forward_traffic: Traffic { per_sample: 10 * elements_in + 4 * rows, per_batch: 0 },
                backward_data_traffic: Traffic { per_sample: 4 * elements_in + rows, per_batch: 0 },
                activation_elements: elements_in,
                ..LayerCost::free(OpClass::Reduction)
            },
        };
        Ok((Shape(vec![]), cost))
    }

    pub(super) fn add(elements_in: u64) -> LayerCost {
        let n = elements_in as f64;
        LayerCost {
            forward_flops: n,
            // The add's backward passes its gradient to both branches unchanged; the two branch
            // gradients are summed where the branches split, and that sum is counted here.
            backward_data_flops: n,
            forward_traffic: Traffic { per_sample: 3 * elements_in, per_batch: 0 },
            backward_data_traffic: Traffic { per_sample: 3 * elements_in, per_batch: 0 },
            ..LayerCost::free(OpClass::Elementwise)
        }
    }

    pub(super) fn concat(
        &self,
        input: &Shape,
        axis: usize,
        others: &[Shape],
    ) -> Result<(Shape, LayerCost), LayerError> {
        if axis >= input.rank() {
            return Err(self.invalid(format!(
                "axis {axis} does not exist in the input {input} (rank {})",
                input.rank()
            )));
        }
        if others.is_empty() {
            return Err(self.invalid("nothing to concatenate: give at least one other operand".to_string()));
        }
        let mut dims = input.0.clone();
        for other in others {
            let agree = other.rank() == input.rank()
                && other.0.iter().zip(&input.0).enumerate().all(|(index, (a, b))| index == axis || a == b);
            if !agree {
                return Err(self.invalid(format!(
                    "operand {other} does not fit {input}: all dimensions but axis {axis} must be equal"
                )));
            }
            self.nonzero("an operand dimension", &other.0)?;
            dims[axis] = self.sum("the output size", &[(1, dims[axis]), (1, other.0[axis])])?;
        }
        let output = Shape(dims);
        let elements_out = self.product("the output size", &output.0)?;
        let cost = LayerCost {
            // Read every operand, write the output. The backward hands each branch a view of
            // the output gradient: no kernel.
            forward_traffic: Traffic { per_sample: 2 * elements_out, per_batch: 0 },
            ..LayerCost::free(OpClass::Elementwise)
        };
        Ok((output, cost))
    }

    pub(super) fn reshape(&self, shape: &Shape, elements_in: u64) -> Result<(Shape, LayerCost), LayerError> {
        self.nonzero("a dimension of the new shape", &shape.0)?;
        if shape.checked_elements() != Some(elements_in) {
            return Err(self.invalid(format!(
                "cannot reshape {elements_in} elements to {shape} ({} elements)",
                shape.elements()
            )));
        }
        Ok((shape.clone(), LayerCost::free(OpClass::Elementwise)))
    }

    pub(super) fn slice(
        &self,
        input: &Shape,
        axis: usize,
        start: u64,
        length: u64,
    ) -> Result<(Shape, LayerCost), LayerError> {
        let Some(&size) = input.0.get(axis) else {
            return Err(self.invalid(format!(
                "axis {axis} does not exist in the input {input} (rank {})",
                input.rank()
            )));
        };
        self.nonzero("length", &[length])?;
        if start.checked_add(length).is_none_or(|end| end > size) {
            return Err(self.invalid(format!(
                "indices {start}..{start}+{length} are outside axis {axis} of {input} (size {size})"
            )));
        }
        let mut dims = input.0.clone();
        dims[axis] = length;
        let output = Shape(dims);
        let elements_in = self.product("the input size", &input.0)?;
        let elements_out = self.product("the output size", &output.0)?;
        let cost = LayerCost {
            // The forward is a view; the backward writes the slice's gradient into a zeroed
            // gradient of the whole input.
            backward_data_traffic: Traffic { per_sample: elements_in + elements_out, per_batch: 0 },
            ..LayerCost::free(OpClass::Elementwise)
        };
        Ok((output, cost))
    }
}
