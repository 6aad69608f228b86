//! Kernel fusion of a CNN's normalizations: which batch norms, residual adds and ReLUs a
//! framework runs as one kernel (`[compute] fusion`), applied by the lowering to the layers
//! each rank runs.
//!
//! The zoo prices every `BatchNorm`, residual `Add` and `ReLU` as its own memory-bound kernel,
//! as eager PyTorch runs them. NVIDIA's MLPerf ResNet-50 (MXNet) does not: its run script
//! passes `--fuse-bn-relu 1 --fuse-bn-add-relu 1` and its symbol (`resnet-v1b-fl.py`) then
//! builds every ReLU that follows a batch norm into the batch norm (`BatchNorm(act_type =
//! 'relu')`) and every block's last batch norm, residual add and ReLU into one
//! `BatchNormAddRelu` (docs/compute-model.md, "Kernel fusion", has the sources).
//!
//! ```
//! use workloads::fusion::Fusion;
//! use workloads::layer::Pass;
//! use workloads::device::Dtype;
//!
//! let mut model = workloads::family::resnet50();
//! let bytes = |model: &workloads::model::Model| -> f64 {
//!     model.layers.iter().map(|l| l.cost.bytes(Pass::Forward, 1, Dtype::Fp16)).sum()
//! };
//! let before = bytes(&model);
//! "bn-relu".parse::<Fusion>().unwrap().apply(&mut model.layers);
//! assert!(bytes(&model) < before);
//! ```

use std::fmt;

use crate::layer::{
    Activation, AttentionKernel, Layer, LayerCost, LayerKind, LossKernels, Pass, RopeKernels, Traffic,
};

/// Which normalization kernels run fused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fusion {
    /// Every layer is its own kernel (eager frameworks; the default).
    #[default]
    None,
    /// A batch norm directly followed by a ReLU is one kernel, and a batch norm directly
    /// before a residual add that a ReLU follows is one kernel with the add and the ReLU
    /// (MXNet's `BatchNorm(act_type='relu')` and `BatchNormAddRelu`).
    BnRelu,
    /// TorchInductor (`torch.compile`): the element-wise chain of an attention written as
    /// separate operators ([`AttentionKernel::Math`]: scale, mask, autocast's casts, softmax,
    /// dropout) runs as one kernel between the two products, priced as
    /// [`AttentionKernel::Standard`]'s fused softmax; PyTorch's autocast cross-entropy
    /// ([`LossKernels::Torch`]) runs as [`LossKernels::Fused`]. Inductor's other fusions (a
    /// bias or activation into its neighbours, a residual add into the next norm) are not
    /// modelled: the zoo's layers already run those as one kernel each.
    Inductor,
}

impl Fusion {
    /// Every mode, in the order messages list them.
    pub const ALL: [Fusion; 3] = [Fusion::None, Fusion::BnRelu, Fusion::Inductor];

    /// The scenario spelling.
    pub fn name(self) -> &'static str {
        match self {
            Fusion::None => "none",
            Fusion::BnRelu => "bn-relu",
            Fusion::Inductor => "inductor",
        }
    }

    /// Rewrites the costs of `layers` (in forward order) so that each fused group is priced
    /// as one kernel: the group's batch norm carries the fused kernel's FLOPs and traffic, the
    /// ReLU and the add it absorbs move nothing (the lowering skips a layer that does no
    /// work). Names, kinds, shapes, parameters and the activations kept for the backward are
    /// unchanged, so blocks, pipeline cuts and memory stay as they were. The lowering applies
    /// it to each rank's local layers (`strategy::emit`), whose costs it prices. Returns the
    /// number of kernels fused away.
    pub fn apply<'l>(self, layers: impl IntoIterator<Item = &'l mut Layer>) -> usize {
        match self {
            Fusion::None => return 0,
            Fusion::Inductor => return layers.into_iter().map(inductor).sum(),
            Fusion::BnRelu => {}
        }
        let mut layers: Vec<&mut Layer> = layers.into_iter().collect();
        let mut removed = 0;
        for index in 1..layers.len() {
            if !is_relu(layers[index]) {
                continue;
            }
            let previous = &*layers[index - 1];
            if is_batch_norm(previous) && previous.output == layers[index].input {
                let fused = bn_relu(&previous.cost, &layers[index].cost, None);
                layers[index - 1].cost = fused;
                absorb(&mut layers[index].cost);
                removed += 1;
            } else if previous.kind == LayerKind::Add
                && index >= 2
                && is_batch_norm(layers[index - 2])
                && layers[index - 2].output == previous.output
                && previous.output == layers[index].input
            {
                let fused = bn_relu(&layers[index - 2].cost, &layers[index].cost, Some(&previous.cost));
                layers[index - 2].cost = fused;
                absorb(&mut layers[index - 1].cost);
                absorb(&mut layers[index].cost);
                removed += 2;
            }
        }
        removed
    }
}

impl fmt::Display for Fusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Fusion {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        Fusion::ALL.into_iter().find(|mode| mode.name() == name).ok_or_else(|| {
            let valid: Vec<&str> = Fusion::ALL.iter().map(|mode| mode.name()).collect();
            format!("unknown fusion {name:?}; valid: {}", valid.join(", "))
        })
    }
}

/// TorchInductor's rewrite of one layer: a math attention core ([`fuse_math_attention`]), an
/// eager rotary embedding ([`RopeKernels::Eager`]: one kernel each way, [`RopeKernels::Fused`]), or
/// PyTorch's autocast cross-entropy ([`LossKernels::Torch`]: the casts, `log_softmax` and
/// `nll_loss` become one reduction each way, [`LossKernels::Fused`]). Returns the forward
/// kernels fused away.
fn inductor(layer: &mut Layer) -> usize {
    match layer.kind {
        // Inductor fuses the rotation's point-wise operators into one kernel each way.
        LayerKind::Rope { heads, kv_heads, kernels: RopeKernels::Eager } => {
            fused_as(layer, LayerKind::Rope { heads, kv_heads, kernels: RopeKernels::Fused })
        }
        LayerKind::CrossEntropy { kernels: LossKernels::Torch } => {
            fused_as(layer, LayerKind::CrossEntropy { kernels: LossKernels::Fused })
        }
        _ => fuse_math_attention(layer),
    }
}

/// Rewrites `layer` as `kind` (its fused form), keeping the activations it kept; returns the
/// forward kernels fused away (0, unchanged, if `kind` does not fit the layer's input).
fn fused_as(layer: &mut Layer, kind: LayerKind) -> usize {
    let Ok(fused) = Layer::new(layer.name.clone(), kind, layer.input.clone()) else {
        return 0;
    };
    let before = layer.kernels(Pass::Forward).len();
    let training = layer.cost.training;
    layer.kind = fused.kind;
    layer.cost = LayerCost { activation_elements: layer.cost.activation_elements, ..fused.cost };
    // The rewritten cost is the trained layer's: frozen again as the layer was.
    layer.train_as(training);
    before.saturating_sub(layer.kernels(Pass::Forward).len())
}

/// Rewrites a math attention core ([`AttentionKernel::Math`]) into the fused chain TorchInductor
/// generates: its kind becomes [`AttentionKernel::Standard`] (the products, one fused
/// softmax, the dropout) and its cost that kind's, keeping the activations the unfused core
/// kept (memory is unchanged, as for the other fusions). Returns the forward kernels fused
/// away; 0 for any other layer.
fn fuse_math_attention(layer: &mut Layer) -> usize {
    let LayerKind::Attention {
        heads,
        kv_heads,
        causal,
        implementation: AttentionKernel::Math,
        dropout,
        value_head_dim,
    } = layer.kind
    else {
        return 0;
    };
    let kind = LayerKind::Attention {
        heads,
        kv_heads,
        causal,
        implementation: AttentionKernel::Standard,
        dropout,
        value_head_dim,
    };
    // The same input and head counts built this core already: the standard one cannot fail.
    let Ok(fused) = Layer::new(layer.name.clone(), kind, layer.input.clone()) else {
        return 0;
    };
    let before = layer.kernels(Pass::Forward).len();
    let (kept, training) = (layer.cost.activation_elements, layer.cost.training);
    layer.kind = fused.kind;
    layer.cost = LayerCost { activation_elements: kept, ..fused.cost };
    layer.train_as(training);
    before.saturating_sub(layer.kernels(Pass::Forward).len())
}

fn is_relu(layer: &Layer) -> bool {
    layer.kind == LayerKind::Activation { function: Activation::Relu }
}

fn is_batch_norm(layer: &Layer) -> bool {
    layer.kind == LayerKind::BatchNorm
}

/// The bytes of a ReLU bitmask over `elements` values: one bit each. The fused kernels keep
/// the ReLU's sign as a bitmask for the backward (`relu_bitmask_` in
/// NVIDIA/apex `apex/contrib/csrc/groupbn/batch_norm_add_relu.h`, MXNet's NHWC batch norm
/// ported to PyTorch); its exact layout is not in the sources, one bit per element is its
/// least.
fn bitmask_bytes(elements: u64) -> u64 {
    elements.div_ceil(8)
}

/// The cost of one batch-norm kernel that also applies the ReLU (`relu`) and, with `add`,
/// adds the residual before it. Per sample, with `n` the batch norm's elements:
/// - forward: the batch norm's traffic (read the input twice, write the output), plus one
///   read of the residual with an add; the ReLU's read and write disappear; the kernel writes
///   the ReLU bitmask;
/// - backward: the batch norm's backward traffic (read the output gradient and the input
///   twice, write the input gradient), plus, with an add, one write of the residual's
///   gradient (the masked output gradient, which the shortcut branch needs); the kernel reads
///   the bitmask instead of the ReLU's saved tensor.
///
/// FLOPs are the sum of the parts' (fusion saves traffic, not arithmetic).
pub fn bn_relu(bn: &LayerCost, relu: &LayerCost, add: Option<&LayerCost>) -> LayerCost {
    let n = bn.activation_elements;
    let residual = if add.is_some() { n } else { 0 };
    let mask = bitmask_bytes(n);
    let add_flops = |f: fn(&LayerCost) -> f64| add.map_or(0.0, f);
    LayerCost {
        forward_flops: bn.forward_flops + relu.forward_flops + add_flops(|c| c.forward_flops),
        backward_data_flops: bn.backward_data_flops
            + relu.backward_data_flops
            + add_flops(|c| c.backward_data_flops),
        forward_traffic: Traffic {
            per_sample: bn.forward_traffic.per_sample + residual,
            per_batch: bn.forward_traffic.per_batch,
        },
        backward_data_traffic: Traffic {
            per_sample: bn.backward_data_traffic.per_sample + residual,
            per_batch: bn.backward_data_traffic.per_batch,
        },
        mask_bytes: [bn.mask_bytes[0] + mask, bn.mask_bytes[1] + mask, bn.mask_bytes[2]],
        ..bn.clone()
    }
}

/// A layer whose kernel a fused kernel does: no FLOPs, no traffic (the activations it keeps
/// stay counted, so memory is unchanged).
fn absorb(cost: &mut LayerCost) {
    *cost = LayerCost {
        params: cost.params,
        macs: cost.macs,
        activation_elements: cost.activation_elements,
        ..LayerCost::free(cost.class)
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Dtype;
    use crate::layer::Pass;

    /// A layer Inductor rewrites keeps its training state: an inert loss (below every LoRA
    /// adapter) stays inert with the fused kind's cost, running no backward.
    #[test]
    fn a_rewritten_layer_stays_frozen() {
        let mut loss = Layer::new(
            "loss",
            LayerKind::CrossEntropy { kernels: LossKernels::Torch },
            crate::layer::Shape::from([8, 100]),
        )
        .unwrap();
        loss.freeze(true);
        assert!(Fusion::Inductor.apply(std::iter::once(&mut loss)) > 0, "the loss's kernels fuse");
        assert_eq!(loss.kind, LayerKind::CrossEntropy { kernels: LossKernels::Fused });
        assert_eq!(loss.cost.training, crate::layer::Training::Inert);
        assert!(loss.kernels(Pass::BackwardData).is_empty());
    }

    fn bytes(layers: &[Layer], pass: Pass) -> f64 {
        layers.iter().map(|l| l.cost.bytes(pass, 1, Dtype::Fp16)).sum()
    }

    #[test]
    fn names_round_trip_and_unknown_lists_valid() {
        for mode in Fusion::ALL {
            assert_eq!(mode.name().parse::<Fusion>(), Ok(mode));
        }
        assert_eq!(
            "norm-conv".parse::<Fusion>().unwrap_err(),
            "unknown fusion \"norm-conv\"; valid: none, bn-relu, inductor"
        );
    }

    #[test]
    fn inductor_runs_a_math_attentions_chain_as_the_fused_softmax() {
        use crate::layer::{AttentionKernel, Shape};
        let attention = |implementation| crate::layer::gpt2_attention_core("attn", implementation);
        let standard = attention(AttentionKernel::Standard);
        let mut layers = vec![
            attention(AttentionKernel::Math),
            Layer::new("add", LayerKind::Add, Shape::from([1024, 768])).unwrap(),
        ];
        let kept = layers[0].cost.activation_elements;
        // Scale, mask, two casts and the softmax become one kernel: four fewer forward.
        assert_eq!(Fusion::Inductor.apply(&mut layers), 4);
        for pass in Pass::ALL {
            assert_eq!(layers[0].kernels(pass), standard.kernels(pass), "{pass:?}");
        }
        assert_eq!(layers[0].cost.activation_elements, kept);
        // Nothing else is touched, and a second pass finds nothing to fuse.
        assert_eq!(layers[1].kind, LayerKind::Add);
        assert_eq!(Fusion::Inductor.apply(&mut layers), 0);
        // PyTorch's autocast cross-entropy becomes the fused loss: three kernels to one.
        let loss = |kernels| {
            Layer::new("loss", LayerKind::CrossEntropy { kernels }, Shape::from([1024, 50257])).unwrap()
        };
        let mut losses = vec![loss(LossKernels::Torch)];
        assert_eq!(Fusion::Inductor.apply(&mut losses), 2);
        assert_eq!(
            losses[0].kernels(Pass::BackwardData),
            loss(LossKernels::Fused).kernels(Pass::BackwardData)
        );
        // Inductor leaves a ResNet's batch norms alone (that is `bn-relu`'s job).
        let mut model = crate::family::resnet50();
        let before = model.layers.clone();
        assert_eq!(Fusion::Inductor.apply(&mut model.layers), 0);
        assert_eq!(model.layers, before);
    }

    #[test]
    fn none_changes_nothing() {
        let mut model = crate::family::resnet50();
        let before = model.layers.clone();
        assert_eq!(Fusion::None.apply(&mut model.layers), 0);
        assert_eq!(model.layers, before);
    }

    /// One identity bottleneck of ResNet-50's stage 1 (256 -> 64 -> 64 -> 256 channels at
    /// 56 x 56): the fused traffic equals the closed form.
    #[test]
    fn identity_bottleneck_traffic_is_the_closed_form() {
        let mut model = crate::family::resnet50();
        let block = |model: &crate::model::Model| -> Vec<Layer> {
            model.layers.iter().filter(|l| l.name.starts_with("layer1.1.")).cloned().collect()
        };
        let unfused = block(&model);
        let names: Vec<&str> = unfused.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "layer1.1.conv1",
                "layer1.1.bn1",
                "layer1.1.relu1",
                "layer1.1.conv2",
                "layer1.1.bn2",
                "layer1.1.relu2",
                "layer1.1.conv3",
                "layer1.1.bn3",
                "layer1.1.add",
                "layer1.1.relu3"
            ]
        );
        Fusion::BnRelu.apply(&mut model.layers);
        let fused = block(&model);
        let (inner, outer) = (64 * 56 * 56_u64, 256 * 56 * 56_u64);
        let params = |c: u64| 2 * c;
        let mask = |n: u64| n.div_ceil(8) as f64;
        // Forward, in elements: bn1 and bn2 with their ReLUs read twice and write once (3),
        // bn3 with the add and the ReLU also reads the residual (4); the scale and shift
        // once per batch; each writes a bitmask.
        let bn_forward = |n: u64, extra: u64, c: u64| 2.0 * ((3 + extra) * n + params(c)) as f64 + mask(n);
        let convolutions: f64 = fused
            .iter()
            .filter(|l| l.kind != LayerKind::BatchNorm)
            .map(|l| l.cost.bytes(Pass::Forward, 1, Dtype::Fp16))
            .sum();
        let expected = convolutions + 2.0 * bn_forward(inner, 0, 64) + bn_forward(outer, 1, 256);
        assert_eq!(bytes(&fused, Pass::Forward), expected);
        // Backward data: the batch norm's 5 per element (6 with the residual's gradient),
        // twice the parameters per batch, the bitmask read.
        let bn_backward =
            |n: u64, extra: u64, c: u64| 2.0 * ((5 + extra) * n + 2 * params(c)) as f64 + mask(n);
        let convolutions: f64 = fused
            .iter()
            .filter(|l| l.kind != LayerKind::BatchNorm)
            .map(|l| l.cost.bytes(Pass::BackwardData, 1, Dtype::Fp16))
            .sum();
        let expected = convolutions + 2.0 * bn_backward(inner, 0, 64) + bn_backward(outer, 1, 256);
        assert_eq!(bytes(&fused, Pass::BackwardData), expected);
        // What disappears, in fp16 elements: forward 2 per ReLU element and 3 + 2 - 1 for the
        // add and last ReLU; backward 3 per ReLU element and 3 + 3 - 1 for the add and ReLU.
        let saved_forward =
            2.0 * (2 * 2 * inner + (3 + 2 - 1) * outer) as f64 - 2.0 * mask(inner) - mask(outer);
        assert_eq!(bytes(&unfused, Pass::Forward) - bytes(&fused, Pass::Forward), saved_forward);
        let saved_backward =
            2.0 * (2 * 3 * inner + (3 + 3 - 1) * outer) as f64 - 2.0 * mask(inner) - mask(outer);
        assert_eq!(bytes(&unfused, Pass::BackwardData) - bytes(&fused, Pass::BackwardData), saved_backward);
        // Arithmetic and kept activations are unchanged; six kernels remain where ten were.
        let flops = |layers: &[Layer]| -> f64 { layers.iter().map(|l| l.cost.training_flops()).sum() };
        assert_eq!(flops(&fused), flops(&unfused));
        let kept = |layers: &[Layer]| -> u64 { layers.iter().map(|l| l.cost.activation_elements).sum() };
        assert_eq!(kept(&fused), kept(&unfused));
        let kernels =
            |layers: &[Layer]| layers.iter().filter(|l| !l.kernels(Pass::Forward).is_empty()).count();
        assert_eq!((kernels(&unfused), kernels(&fused)), (10, 6));
    }

    /// ResNet-50: the stem's bn1 + relu, two batch norm + ReLU pairs and one batch norm + add
    /// + ReLU per bottleneck (16 of them).
    #[test]
    fn resnet50_fuses_every_pair() {
        let mut model = crate::family::resnet50();
        assert_eq!(Fusion::BnRelu.apply(&mut model.layers), 1 + 16 * (2 + 2));
    }
}
