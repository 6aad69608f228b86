use super::*;

fn conv(out_channels: u64, kernel: u64, stride: u64, padding: u64) -> LayerKind {
    LayerKind::conv2d(out_channels, kernel, stride, padding)
}

fn layer(kind: LayerKind, input: impl Into<Shape>) -> Layer {
    match Layer::new("test", kind, input.into()) {
        Ok(layer) => layer,
        Err(error) => panic!("{error}"),
    }
}

fn error(kind: LayerKind, input: impl Into<Shape>) -> String {
    match Layer::new("bad.layer", kind, input.into()) {
        Ok(layer) => panic!("expected an error, got {layer:?}"),
        Err(error) => {
            let text = error.to_string();
            assert!(text.contains("bad.layer"), "the error names the layer: {text}");
            text
        }
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
    let layer = layer(conv(64, 7, 2, 3), [3, 224, 224]);
    assert_eq!(layer.output, Shape::from([64, 112, 112]));
    assert_eq!(layer.kind.name(), "conv2d");
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
    let layer = layer(LayerKind::Linear { out_features: 1000, bias: true }, [2048]);
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
fn grouped_strided_and_dilated_convolutions() {
    let depthwise = LayerKind::Conv {
        out_channels: 32,
        kernel: vec![3, 3],
        stride: vec![2, 2],
        padding: Padding::Symmetric(vec![1, 1]),
        dilation: vec![1, 1],
        groups: 32,
        bias: true,
    };
    let layer = layer(depthwise, [32, 15, 15]);
    assert_eq!(layer.output, Shape::from([32, 8, 8]));
    assert_eq!(layer.cost.params, 32 * 9 + 32);
    assert_eq!(layer.macs(), (32 * 8 * 8 * 9) as f64);

    // Dilation 2 makes a 3-tap kernel span 5 positions (PyTorch: (L + 2p - d(k-1) - 1)/s + 1).
    let dilated = LayerKind::Conv {
        out_channels: 8,
        kernel: vec![3],
        stride: vec![1],
        padding: Padding::Symmetric(vec![0]),
        dilation: vec![2],
        groups: 1,
        bias: false,
    };
    let layer = super::tests::layer(dilated, [4, 100]);
    assert_eq!(layer.kind.name(), "conv1d");
    assert_eq!(layer.output, Shape::from([8, 96]));
    assert_eq!(layer.cost.params, 8 * 4 * 3);
    assert_eq!(layer.macs(), (8 * 96 * 4 * 3) as f64);
}

#[test]
fn three_dimensional_and_same_padded_convolutions() {
    let conv3d = LayerKind::Conv {
        out_channels: 16,
        kernel: vec![3, 3, 3],
        stride: vec![1, 1, 1],
        padding: Padding::Symmetric(vec![0, 0, 0]),
        dilation: vec![1, 1, 1],
        groups: 1,
        bias: false,
    };
    let layer = layer(conv3d, [4, 512, 512, 512]);
    assert_eq!(layer.kind.name(), "conv3d");
    assert_eq!(layer.output, Shape::from([16, 510, 510, 510]));
    assert_eq!(layer.cost.params, 4 * 16 * 27);
    assert_eq!(layer.macs(), 16.0 * 510f64.powi(3) * 4.0 * 27.0);

    // TensorFlow "same": an even kernel keeps the size (padding only after), a stride rounds up.
    let same = |kernel: u64, stride: u64| LayerKind::Conv {
        out_channels: 32,
        kernel: vec![kernel; 3],
        stride: vec![stride; 3],
        padding: Padding::Same,
        dilation: vec![1; 3],
        groups: 1,
        bias: true,
    };
    assert_eq!(super::tests::layer(same(2, 1), [4, 128, 128, 128]).output, Shape::from([32, 128, 128, 128]));
    assert_eq!(super::tests::layer(same(3, 2), [4, 127, 127, 127]).output, Shape::from([32, 64, 64, 64]));
}

#[test]
fn transposed_convolutions_invert_strided_ones() {
    let up = LayerKind::ConvTranspose {
        out_channels: 256,
        kernel: vec![2, 2, 2],
        stride: vec![2, 2, 2],
        padding: vec![0; 3],
        output_padding: vec![0; 3],
        dilation: vec![1; 3],
        groups: 1,
        bias: false,
    };
    let layer = layer(up, [512, 9, 9, 7]);
    assert_eq!(layer.kind.name(), "conv-transpose3d");
    assert_eq!(layer.output, Shape::from([256, 18, 18, 14]));
    assert_eq!(layer.cost.params, 512 * 256 * 8);
    // Every input element is scattered into 256 kernels of 8 taps.
    assert_eq!(layer.macs(), (512 * 9 * 9 * 7 * 256 * 8) as f64);

    let bad = LayerKind::ConvTranspose {
        out_channels: 4,
        kernel: vec![3],
        stride: vec![2],
        padding: vec![0],
        output_padding: vec![2],
        dilation: vec![1],
        groups: 1,
        bias: false,
    };
    let text = error(bad, [4, 8]);
    assert!(text.contains("output_padding 2"), "{text}");
}

#[test]
fn pooling_and_elementwise_layers() {
    let pool =
        LayerKind::MaxPool { kernel: vec![3, 3], stride: vec![2, 2], padding: vec![1, 1], ceil_mode: false };
    let layer = layer(pool, [64, 112, 112]);
    assert_eq!(layer.output, Shape::from([64, 56, 56]));
    assert_eq!(layer.cost.class, OpClass::Reduction);
    let gap = super::tests::layer(LayerKind::GlobalAvgPool, [2048, 7, 7]);
    assert_eq!(gap.output, Shape::from([2048]));
    let bn = super::tests::layer(LayerKind::BatchNorm, [64, 56, 56]);
    assert_eq!(bn.cost.params, 128);
    assert_eq!(bn.output, bn.input);
    let relu = super::tests::layer(LayerKind::relu(), [64, 56, 56]);
    assert_eq!(relu.kind.name(), "relu");
    assert_eq!(relu.cost.class, OpClass::Elementwise);
    assert_eq!(relu.macs(), 0.0);
    let flat = super::tests::layer(LayerKind::Flatten, [512, 1, 1]);
    assert_eq!(flat.output, Shape::from([512]));
    assert!(flat.cost.is_free());
    assert!(!relu.cost.is_free());
}

#[test]
fn ceil_mode_pooling_matches_pytorch_and_chainer() {
    let pool = |kernel: u64, stride: u64, ceil_mode: bool| LayerKind::MaxPool {
        kernel: vec![kernel; 2],
        stride: vec![stride; 2],
        padding: vec![0; 2],
        ceil_mode,
    };
    // Chainer's cover_all (ParaDL's tables): 113 -> 56 with a 3x3/2 window, 113 -> 57 with 2x2/2.
    assert_eq!(layer(pool(3, 2, true), [64, 113, 113]).output, Shape::from([64, 56, 56]));
    assert_eq!(layer(pool(2, 2, true), [64, 113, 113]).output, Shape::from([64, 57, 57]));
    assert_eq!(layer(pool(2, 2, false), [64, 113, 113]).output, Shape::from([64, 56, 56]));
    // PyTorch drops a last window that would start in the right padding: 5 + 2 x 1 padded
    // positions would give ceil(5 / 2) + 1 = 4 windows of 2, but the fourth starts at 6.
    let padded = LayerKind::AvgPool { kernel: vec![2], stride: vec![2], padding: vec![1], ceil_mode: true };
    assert_eq!(layer(padded, [1, 5]).output, Shape::from([1, 3]));
}

#[test]
fn adaptive_pooling_upsampling_and_crops() {
    let adaptive = layer(LayerKind::AdaptiveAvgPool { output: vec![6, 6] }, [256, 6, 6]);
    assert_eq!(adaptive.output, Shape::from([256, 6, 6]));
    // Identity-sized windows read each input once.
    assert_eq!(adaptive.cost.forward_flops, 2.0 * 256.0 * 36.0);
    let overlapping = layer(LayerKind::AdaptiveAvgPool { output: vec![3] }, [1, 7]);
    // Windows [0,3) [2,5) [4,7): 9 reads and 3 divides.
    assert_eq!(overlapping.cost.forward_flops, 12.0);

    let up = layer(LayerKind::Upsample { scale: vec![2, 2], mode: UpsampleMode::Nearest }, [8, 5, 7]);
    assert_eq!(up.output, Shape::from([8, 10, 14]));
    assert_eq!(up.cost.forward_flops, 0.0);
    let bilinear = layer(LayerKind::Upsample { scale: vec![2, 2], mode: UpsampleMode::Linear }, [8, 5, 7]);
    assert_eq!(bilinear.cost.forward_flops, 7.0 * 8.0 * 10.0 * 14.0);

    let crop = layer(LayerKind::Crop { size: vec![18, 18, 14] }, [256, 26, 26, 22]);
    assert_eq!(crop.output, Shape::from([256, 18, 18, 14]));
    let text = error(LayerKind::Crop { size: vec![30, 30, 30] }, [256, 26, 26, 22]);
    assert!(text.contains("26x26x22") && text.contains("30x30x30"), "{text}");
}

#[test]
fn sequence_layers_act_on_the_last_dimension() {
    let ln = layer(LayerKind::LayerNorm { bias: true }, [2048, 1024]);
    assert_eq!(ln.cost.params, 2048);
    let rms = layer(LayerKind::RmsNorm, [2048, 1024]);
    assert_eq!(rms.cost.params, 1024);
    assert!(rms.cost.forward_flops < ln.cost.forward_flops);
    let gelu = layer(LayerKind::Activation { function: Activation::Gelu }, [2048, 4096]);
    assert_eq!(gelu.kind.name(), "gelu");
    assert_eq!(gelu.cost.forward_flops, 8.0 * 2048.0 * 4096.0);
    let swiglu = layer(LayerKind::Glu { function: Activation::Silu }, [2048, 2 * 11008]);
    assert_eq!(swiglu.kind.name(), "swiglu");
    assert_eq!(swiglu.output, Shape::from([2048, 11008]));
    let text = error(LayerKind::Glu { function: Activation::Silu }, [16, 7]);
    assert!(text.contains("even"), "{text}");
    let softmax = layer(LayerKind::Softmax, [16, 100]);
    assert_eq!(softmax.cost.activation_elements, 1600);
    let dropout = layer(LayerKind::Dropout, [16, 100]);
    assert_eq!(dropout.cost.params, 0);
    let loss = layer(LayerKind::CrossEntropy { kernels: LossKernels::Fused }, [2048, 50257]);
    assert_eq!(loss.output, Shape(vec![]));
    assert_eq!(loss.cost.activation_elements, 2048 * 50257);
}

#[test]
fn embeddings_are_memory_bound_lookups() {
    let wte = layer(LayerKind::Embedding { vocabulary: 51200, dim: 1024 }, [2048]);
    assert_eq!(wte.output, Shape::from([2048, 1024]));
    assert_eq!(wte.cost.params, 51200 * 1024);
    assert_eq!(wte.cost.forward_flops, 0.0);
    assert_eq!(wte.macs(), 0.0);
    // No input gradient; the weight gradient is a scatter-add into a dense table.
    assert_eq!(wte.cost.backward_data_flops, 0.0);
    assert_eq!(wte.cost.backward_data_traffic, Traffic::default());
    assert_eq!(wte.cost.backward_weight_flops, 2048.0 * 1024.0);
    assert_eq!(wte.cost.backward_weight_traffic.per_batch, 51200 * 1024);

    let positions = layer(LayerKind::AddEmbedding { rows: 2048, positional: true }, [2048, 1024]);
    assert_eq!(positions.kind.name(), "position-embedding");
    assert_eq!(positions.cost.params, 2048 * 1024);
    let text = error(LayerKind::AddEmbedding { rows: 512, positional: true }, [1024, 768]);
    assert!(text.contains("1024 tokens") && text.contains("512 positions"), "{text}");
    let types = layer(LayerKind::AddEmbedding { rows: 2, positional: false }, [512, 768]);
    assert_eq!(types.cost.params, 2 * 768);

    let bag = layer(LayerKind::EmbeddingBag { tables: vec![10, 20, 30], dim: 4, lookups: 2 }, [3]);
    assert_eq!(bag.output, Shape::from([3, 4]));
    assert_eq!(bag.cost.params, 60 * 4);
    assert_eq!(bag.cost.forward_flops, 12.0);
    let text = error(LayerKind::EmbeddingBag { tables: vec![10, 20], dim: 4, lookups: 1 }, [3]);
    assert!(text.contains("3 features") && text.contains("2 tables"), "{text}");

    let interaction = layer(LayerKind::Interaction, [27, 128]);
    assert_eq!(interaction.output, Shape::from([128 + 351]));
}

#[test]
fn attention_dropout_is_a_kernel_of_its_own_each_way() {
    // A Megatron-LM 1.7B layer: 24 heads of 96, s = 2048.
    let (s, heads, d) = (2048u64, 24u64, 96u64);
    let kind = |dropout| LayerKind::Attention {
        heads,
        kv_heads: heads,
        causal: true,
        implementation: AttentionKernel::Standard,
        dropout,
        value_head_dim: None,
    };
    let with = layer(kind(true), [s, 3 * heads * d]);
    let without = layer(kind(false), [s, 3 * heads * d]);
    let scores = heads * s * s;
    let n = scores as f64;
    // Forward: draw, compare, scale (2 FLOPs per score); read P, write the dropped P (2 elements)
    // and the one-byte mask. Backward: scale by the mask (1 FLOP); read the gradient and the
    // mask, write the gradient.
    let dropout_forward =
        with.kernels(Pass::Forward).into_iter().find(|k| k.role == KernelRole::AttentionDropout);
    let dropout_backward =
        with.kernels(Pass::BackwardData).into_iter().find(|k| k.role == KernelRole::AttentionDropout);
    let (forward, backward) = (dropout_forward.unwrap(), dropout_backward.unwrap());
    assert_eq!(
        (forward.class, forward.flops, forward.traffic.per_sample, forward.mask_bytes),
        (OpClass::Elementwise, 2.0 * n, 2 * scores, scores)
    );
    assert_eq!((backward.flops, backward.traffic.per_sample, backward.mask_bytes), (n, 2 * scores, scores));
    // In fp16: 5 bytes per score each way, on top of the core without dropout.
    for pass in [Pass::Forward, Pass::BackwardData] {
        let extra = with.cost.bytes(pass, 1, Dtype::Fp16) - without.cost.bytes(pass, 1, Dtype::Fp16);
        assert_eq!(extra, 5.0 * n, "{pass:?}");
    }
    assert_eq!(with.cost.forward_flops - without.cost.forward_flops, 2.0 * n);
    assert_eq!(with.cost.backward_data_flops - without.cost.backward_data_flops, n);
    // Saved: the dropped probabilities and the mask besides Q, K, V and the probabilities.
    assert_eq!(with.cost.activation_elements - without.cost.activation_elements, 2 * scores);
    // The kernels of each pass add up to the layer's cost: products, softmax, dropout.
    for pass in Pass::ALL {
        let kernels = with.kernels(pass);
        let flops: f64 = kernels.iter().map(|k| k.flops).sum();
        let bytes: f64 = kernels.iter().map(|k| k.bytes(3, Dtype::Fp16)).sum();
        assert_eq!(flops, with.cost.flops(pass, 1), "{pass:?}");
        assert_eq!(bytes, with.cost.bytes(pass, 3, Dtype::Fp16), "{pass:?}");
    }
    let roles: Vec<KernelRole> = with.kernels(Pass::Forward).iter().map(|k| k.role).collect();
    assert_eq!(
        roles,
        [KernelRole::AttentionProducts, KernelRole::AttentionSoftmax, KernelRole::AttentionDropout]
    );
    assert!(with.kernels(Pass::BackwardWeight).is_empty());
    // Any other layer is one kernel with the layer's cost.
    let linear = layer(LayerKind::Linear { out_features: 16, bias: true }, [8, 32]);
    let kernels = linear.kernels(Pass::Forward);
    assert_eq!(kernels.len(), 1);
    assert_eq!(kernels[0].role, KernelRole::Whole);
    assert_eq!(kernels[0].flops, linear.cost.forward_flops);
}

#[test]
fn attention_counts_the_score_matrix_and_its_variants() {
    let (s, h, heads) = (2048u64, 12288u64, 96u64);
    let standard = |causal| LayerKind::Attention {
        heads,
        kv_heads: heads,
        causal,
        implementation: AttentionKernel::Standard,
        dropout: false,
        value_head_dim: None,
    };
    let attention = layer(standard(true), [s, 3 * h]);
    assert_eq!(attention.output, Shape::from([s, h]));
    // Megatron: Q K^T and P V cost 2 s^2 h MACs, 4 s^2 h FLOPs per layer; the causal mask saves
    // nothing in the standard kernels.
    assert_eq!(attention.macs(), 2.0 * (s * s * h) as f64);
    assert_eq!(layer(standard(false), [s, 3 * h]).cost, attention.cost);
    // The s x s probabilities are kept per head.
    assert!(attention.cost.activation_elements >= heads * s * s);

    let flash = |causal| LayerKind::Attention {
        heads,
        kv_heads: heads,
        causal,
        implementation: AttentionKernel::Flash,
        dropout: false,
        value_head_dim: None,
    };
    let full = layer(flash(false), [s, 3 * h]);
    assert_eq!(full.macs(), attention.macs());
    assert!(full.cost.activation_elements < s * 4 * h + s * heads + 1, "no s x s tensor is kept");
    let causal = layer(flash(true), [s, 3 * h]);
    let ratio = causal.macs() / full.macs();
    assert!((ratio - 0.5).abs() < 1e-3, "causal flash attention computes half the scores: {ratio}");
    assert!(full.cost.forward_traffic.per_sample < attention.cost.forward_traffic.per_sample / 10);

    // Grouped-query attention: 32 query heads share 8 key/value heads of 128.
    let gqa = layer(
        LayerKind::Attention {
            heads: 32,
            kv_heads: 8,
            causal: true,
            implementation: AttentionKernel::Flash,
            dropout: false,
            value_head_dim: None,
        },
        [4096, (32 + 16) * 128],
    );
    assert_eq!(gqa.output, Shape::from([4096, 4096]));
    let text = error(
        LayerKind::Attention {
            heads: 32,
            kv_heads: 6,
            causal: true,
            implementation: AttentionKernel::Flash,
            dropout: false,
            value_head_dim: None,
        },
        [4096, 44 * 128],
    );
    assert!(text.contains("kv_heads 6 does not divide heads 32"), "{text}");
    let text = error(
        LayerKind::Attention {
            heads: 12,
            kv_heads: 12,
            causal: false,
            implementation: AttentionKernel::Standard,
            dropout: false,
            value_head_dim: None,
        },
        [512, 1000],
    );
    assert!(text.contains("1000") && text.contains("36"), "{text}");

    let rope = layer(
        LayerKind::Rope { heads: 32, kv_heads: 8, kernels: RopeKernels::Fused },
        [4096, (32 + 16) * 128],
    );
    assert_eq!(rope.output, rope.input);
    assert_eq!(rope.cost.params, 0);
    assert_eq!(rope.cost.forward_flops, 3.0 * (4096 * 40 * 128) as f64);
}

/// Hugging Face's eager rotary embedding: 10 kernels forward and 18 backward per layer (the
/// H200 Llama trace's `neg`, `cat`, `mul` and `add`; `mul`, `neg`, and `SliceBackward0`'s
/// `fill_`, `copy_` and `add_`), whose traffic and FLOPs are the layer's cost; it moves 5x the
/// fused kernel's bytes forward and more backward, and Inductor fuses it back to one kernel.
#[test]
fn an_eager_rope_runs_pytorchs_operators_and_inductor_fuses_them() {
    let shape = [4096, (32 + 16) * 128];
    let eager = layer(LayerKind::Rope { heads: 32, kv_heads: 8, kernels: RopeKernels::Eager }, shape);
    let fused = layer(LayerKind::Rope { heads: 32, kv_heads: 8, kernels: RopeKernels::Fused }, shape);
    let (forward, backward) = (eager.kernels(Pass::Forward), eager.kernels(Pass::BackwardData));
    assert_eq!((forward.len(), backward.len()), (10, 18));
    assert!(eager.kernels(Pass::BackwardWeight).is_empty());
    let sum = |parts: &[KernelPart]| parts.iter().map(|p| p.traffic.per_sample).sum::<u64>();
    assert_eq!(sum(&forward), eager.cost.forward_traffic.per_sample);
    assert_eq!(sum(&backward), eager.cost.backward_data_traffic.per_sample);
    let flops = |parts: &[KernelPart]| parts.iter().map(|p| p.flops).sum::<f64>();
    assert_eq!(flops(&forward), eager.cost.forward_flops);
    // The queries' and keys' elements (32 + 8 heads of 128 per token) and the cos/sin table.
    let (rotated, table) = (4096 * 40 * 128, 4096 * 128);
    assert_eq!(eager.cost.forward_traffic.per_sample, 10 * rotated + 4 * table);
    assert_eq!(eager.cost.backward_data_traffic.per_sample, 15 * rotated + 4 * table);
    assert_eq!(fused.cost.forward_traffic.per_sample, 2 * rotated + table);
    assert_eq!(eager.cost.activation_elements, fused.cost.activation_elements);
    let mut layers = vec![eager.clone()];
    assert_eq!(crate::fusion::Fusion::Inductor.apply(&mut layers), 9);
    assert_eq!(layers[0].kind, fused.kind);
    assert_eq!(layers[0].cost, fused.cost);
}

#[test]
fn experts_count_all_parameters_but_only_top_k_flops() {
    let experts = |top_k| LayerKind::MoeExperts {
        experts: 8,
        top_k,
        ffn_hidden: 14336,
        activation: Activation::Silu,
        gated: true,
        bias: false,
    };
    let two = layer(experts(2), [4096, 4096]);
    let one = layer(experts(1), [4096, 4096]);
    assert_eq!(two.cost.params, 8 * 3 * 4096 * 14336);
    assert_eq!(two.cost.params, one.cost.params);
    assert_eq!(two.macs(), 2.0 * one.macs());
    assert_eq!(one.macs(), (4096u64 * 3 * 4096 * 14336) as f64);
    let router = layer(LayerKind::MoeRouter { experts: 8, top_k: 2 }, [4096, 4096]);
    assert_eq!(router.output, Shape::from([4096, 8]));
    assert_eq!(router.cost.params, 4096 * 8);
    let text = error(LayerKind::MoeRouter { experts: 8, top_k: 9 }, [4096, 4096]);
    assert!(text.contains("top_k 9"), "{text}");
}

#[test]
fn matmul_concat_and_views() {
    let scores = layer(LayerKind::Matmul { other: Shape::from([12, 64, 512]) }, [12, 512, 64]);
    assert_eq!(scores.output, Shape::from([12, 512, 512]));
    assert_eq!(scores.macs(), (12 * 512 * 512 * 64) as f64);
    assert_eq!(scores.cost.params, 0);
    assert_eq!(scores.cost.backward_data_flops, 2.0 * scores.cost.forward_flops);
    let text = error(LayerKind::Matmul { other: Shape::from([12, 32, 512]) }, [12, 512, 64]);
    assert!(text.contains("12x512x64") && text.contains("12x32x512"), "{text}");

    let concat = layer(LayerKind::Concat { axis: 0, others: vec![Shape::from([32, 8, 8])] }, [64, 8, 8]);
    assert_eq!(concat.output, Shape::from([96, 8, 8]));
    let text = error(LayerKind::Concat { axis: 0, others: vec![Shape::from([32, 4, 8])] }, [64, 8, 8]);
    assert!(text.contains("32x4x8"), "{text}");

    let reshape = layer(LayerKind::Reshape { shape: Shape::from([1, 128]) }, [128]);
    assert!(reshape.cost.is_free());
    let text = error(LayerKind::Reshape { shape: Shape::from([3, 50]) }, [128]);
    assert!(text.contains("128") && text.contains("3x50"), "{text}");
    let slice = layer(LayerKind::Slice { axis: 0, start: 13, length: 26 }, [39]);
    assert_eq!(slice.output, Shape::from([26]));
    let text = error(LayerKind::Slice { axis: 0, start: 13, length: 27 }, [39]);
    assert!(text.contains("size 39"), "{text}");
}

#[test]
fn tied_linear_layers_cost_flops_but_own_no_weights() {
    let owned = layer(LayerKind::Linear { out_features: 51200, bias: false }, [2048, 1024]);
    let tied = layer(
        LayerKind::TiedLinear { out_features: 51200, bias: false, tied_to: "embedding".to_string() },
        [2048, 1024],
    );
    assert_eq!(owned.cost.params, 51200 * 1024);
    assert_eq!(tied.cost.params, 0);
    assert_eq!(tied.cost.forward_flops, owned.cost.forward_flops);
    assert_eq!(tied.cost.forward_traffic, owned.cost.forward_traffic);
    assert_eq!(tied.kind.name(), "linear");
}

#[test]
fn bad_shapes_and_parameters_name_the_layer() {
    let text = error(conv(64, 7, 2, 3), [224]);
    assert!(text.contains("rank 1") && text.contains("expected 3"), "{text}");

    let grouped = LayerKind::Conv {
        out_channels: 64,
        kernel: vec![3, 3],
        stride: vec![1, 1],
        padding: Padding::Symmetric(vec![1, 1]),
        dilation: vec![1, 1],
        groups: 4,
        bias: false,
    };
    let failure = Layer::new("layer2.0.conv2", grouped, Shape::from([30, 8, 8])).unwrap_err();
    assert!(matches!(failure, LayerError::Groups { in_channels: 30, groups: 4, .. }));
    assert!(failure.to_string().contains("layer2.0.conv2"), "{failure}");

    let text = error(conv(8, 9, 1, 0), [3, 4, 4]);
    assert!(text.contains("9x9") && text.contains("4x4"), "{text}");

    let text = error(conv(8, 3, 0, 1), [3, 4, 4]);
    assert!(text.contains("stride is zero"), "{text}");

    let pool =
        LayerKind::MaxPool { kernel: vec![2, 2], stride: vec![2, 2], padding: vec![2, 2], ceil_mode: false };
    let text = error(pool, [3, 8, 8]);
    assert!(text.contains("half"), "{text}");

    let mismatched = LayerKind::Conv {
        out_channels: 8,
        kernel: vec![3, 3],
        stride: vec![1],
        padding: Padding::Symmetric(vec![0, 0]),
        dilation: vec![1, 1],
        groups: 1,
        bias: false,
    };
    let text = error(mismatched, [3, 8, 8]);
    assert!(text.contains("stride has 1 values") && text.contains("2 axes"), "{text}");

    let text = Layer::residual_add("layer1.0.add", Shape::from([256, 56, 56]), &Shape::from([64, 56, 56]))
        .unwrap_err()
        .to_string();
    assert!(text.contains("layer1.0.add") && text.contains("64x56x56"), "{text}");

    let text = error(LayerKind::Linear { out_features: 10, bias: true }, Shape(vec![]));
    assert!(text.contains("rank 0"), "{text}");

    let text = error(LayerKind::Linear { out_features: 10, bias: true }, [u64::MAX / 2, 4]);
    assert!(text.contains("too large"), "{text}");
}

/// Megatron-LM's fp32 loss (`LossKernels::Megatron`): six kernels forward (the cast, max, sub,
/// exp, sum, div), two backward (multiply, cast back); in fp16 52 bytes per logit, in fp32 the
/// casts do not run (40 bytes); the parts add up to the layer's elements and FLOPs.
#[test]
fn megatron_loss_runs_in_fp32_as_several_kernels() {
    let (tokens, vocabulary) = (2048u64, 6400u64);
    let loss = layer(LayerKind::CrossEntropy { kernels: LossKernels::Megatron }, [tokens, vocabulary]);
    let n = tokens * vocabulary;
    let per_logit = |pass: Pass, dtype: Dtype, skip_casts: bool| -> f64 {
        loss.kernels(pass)
            .iter()
            .filter(|k| !(skip_casts && k.role == KernelRole::LossCast))
            .map(|k| k.bytes(1, dtype))
            .sum::<f64>()
            / n as f64
    };
    assert_eq!(loss.kernels(Pass::Forward).len(), 6);
    assert_eq!(loss.kernels(Pass::BackwardData).len(), 2);
    assert!(loss.kernels(Pass::BackwardWeight).is_empty());
    // Per-row fp32 values aside: the maxima and sums written, then read (4 per row forward),
    // the loss gradient read (1 per row backward).
    let row = 4.0 * tokens as f64 / n as f64;
    assert!((per_logit(Pass::Forward, Dtype::Fp16, false) - 4.0 * row - 38.0).abs() < 1e-9);
    assert!((per_logit(Pass::BackwardData, Dtype::Fp16, false) - row - 14.0).abs() < 1e-9);
    assert!((per_logit(Pass::Forward, Dtype::Fp32, true) - 4.0 * row - 32.0).abs() < 1e-9);
    assert!((per_logit(Pass::BackwardData, Dtype::Fp32, true) - row - 8.0).abs() < 1e-9);
    for pass in [Pass::Forward, Pass::BackwardData] {
        let parts = loss.kernels(pass);
        let elements: u64 = parts.iter().map(|k| k.traffic.per_sample + k.fp32_traffic.per_sample).sum();
        assert_eq!(elements, loss.cost.traffic(pass).per_sample, "{pass:?}");
        let flops: f64 = parts.iter().map(|k| k.flops).sum();
        assert_eq!(flops, loss.cost.flops(pass, 1), "{pass:?}");
    }
    // The fused loss stays one kernel in the compute dtype.
    let fused = layer(LayerKind::CrossEntropy { kernels: LossKernels::Fused }, [tokens, vocabulary]);
    assert_eq!(fused.kernels(Pass::Forward).len(), 1);
    assert_eq!(fused.kernels(Pass::Forward)[0].fp32_traffic, Traffic::default());
}

#[test]
fn math_attention_runs_each_operator_and_autocasts_the_softmax_to_fp32() {
    // nanoGPT's GPT-2 124M attention: 12 heads of 64, s = 1024, no dropout.
    let (s, heads, d) = (1024u64, 12u64, 64u64);
    let kind = |implementation| LayerKind::Attention {
        heads,
        kv_heads: heads,
        causal: true,
        implementation,
        dropout: false,
        value_head_dim: None,
    };
    let math = layer(kind(AttentionKernel::Math), [s, 3 * heads * d]);
    let standard = layer(kind(AttentionKernel::Standard), [s, 3 * heads * d]);
    let n = (heads * s * s) as f64;
    let score_bytes = |layer: &Layer, pass, dtype| -> f64 {
        // Bytes per score of every kernel but the products' reads and writes of Q, K, V and O.
        layer
            .kernels(pass)
            .iter()
            .map(|k| {
                let io = if k.role == KernelRole::AttentionProducts {
                    let per_pass = if pass == Pass::Forward { 1 } else { 2 };
                    (per_pass * (s * 3 * heads * d + s * heads * d)) as f64 * dtype_bytes(dtype)
                } else {
                    0.0
                };
                (k.bytes(1, dtype) - io) / n
            })
            .sum()
    };
    // bf16 under autocast, forward: products write S and read P (2 + 2), scale (2 + 2), mask
    // (2 + 2), cast up (2 + 4), fp32 softmax (4 + 4), cast down (4 + 2): 32 bytes per score.
    // Backward: products write dP, read P and dS twice (8), cast dP up (6), fp32 softmax
    // backward (12), cast dS down (6), mask (4), scale (4): 40. Standard (Megatron's fused
    // softmax): 8 and 14.
    assert_eq!(score_bytes(&math, Pass::Forward, Dtype::Bf16), 32.0);
    assert_eq!(score_bytes(&math, Pass::BackwardData, Dtype::Bf16), 40.0);
    assert_eq!(score_bytes(&standard, Pass::Forward, Dtype::Bf16), 8.0);
    assert_eq!(score_bytes(&standard, Pass::BackwardData, Dtype::Bf16), 14.0);
    // Six kernels each way; the casts are marked so that fp32 drops them.
    assert_eq!(math.kernels(Pass::Forward).len(), 6);
    assert_eq!(math.kernels(Pass::BackwardData).len(), 6);
    let casts = |pass| math.kernels(pass).iter().filter(|k| k.role == KernelRole::AttentionCast).count();
    assert_eq!((casts(Pass::Forward), casts(Pass::BackwardData)), (2, 2));
    // In fp32 (no autocast) without the casts: products 8, scale 8, mask 8, softmax 8 = 32
    // forward; products 16, softmax backward 12, mask 8, scale 8 = 44 backward.
    let fp32 = |pass| -> f64 {
        let io = |k: &KernelPart| {
            if k.role == KernelRole::AttentionProducts {
                let per_pass = if pass == Pass::Forward { 1 } else { 2 };
                (per_pass * (s * 3 * heads * d + s * heads * d)) as f64 * 4.0
            } else {
                0.0
            }
        };
        math.kernels(pass)
            .iter()
            .filter(|k| k.role != KernelRole::AttentionCast)
            .map(|k| (k.bytes(1, Dtype::Fp32) - io(k)) / n)
            .sum()
    };
    assert_eq!((fp32(Pass::Forward), fp32(Pass::BackwardData)), (32.0, 44.0));
    // The products and the FLOPs of the score arithmetic are the standard core's.
    assert_eq!(math.cost.macs, standard.cost.macs);
    assert_eq!(math.kernels(Pass::Forward)[0], standard.kernels(Pass::Forward)[0]);
}

fn dtype_bytes(dtype: Dtype) -> f64 {
    dtype.bytes() as f64
}

#[test]
fn parameter_tensors_count_weights_and_biases() {
    let linear = |bias| layer(LayerKind::Linear { out_features: 16, bias }, [8, 32]);
    assert_eq!(linear(true).parameter_tensors(), 2);
    assert_eq!(linear(false).parameter_tensors(), 1);
    assert_eq!(layer(LayerKind::LayerNorm { bias: true }, [8, 32]).parameter_tensors(), 2);
    assert_eq!(layer(LayerKind::Add, [8, 32]).parameter_tensors(), 0);
}

#[test]
fn torch_cross_entropy_casts_to_fp32_under_autocast() {
    let (rows, classes) = (1024u64, 50257u64);
    let n = (rows * classes) as f64;
    let torch = layer(LayerKind::CrossEntropy { kernels: LossKernels::Torch }, [rows, classes]);
    let per_logit = |pass, dtype, casts: bool| -> f64 {
        torch
            .kernels(pass)
            .iter()
            .filter(|k| casts || k.role != KernelRole::LossCast)
            .map(|k| k.bytes(1, dtype))
            .sum::<f64>()
            / n
    };
    let near = |a: f64, b: f64| (a - b).abs() < 1e-3;
    // bf16: cast 2 + 4, log_softmax 4 + 4 forward (and 8 bytes a row for the pick); zero-fill
    // 4, log_softmax backward 12, cast back 4 + 2 backward.
    assert!(
        near(per_logit(Pass::Forward, Dtype::Bf16, true), 14.0),
        "{}",
        per_logit(Pass::Forward, Dtype::Bf16, true)
    );
    assert!(near(per_logit(Pass::BackwardData, Dtype::Bf16, true), 22.0));
    // fp32 without the casts: 8 forward, 16 backward.
    assert!(near(per_logit(Pass::Forward, Dtype::Fp32, false), 8.0));
    assert!(near(per_logit(Pass::BackwardData, Dtype::Fp32, false), 16.0));
    // The kernels' FLOPs add up to the layer's cost.
    for pass in [Pass::Forward, Pass::BackwardData] {
        let flops: f64 = torch.kernels(pass).iter().map(|k| k.flops).sum();
        assert_eq!(flops, torch.cost.flops(pass, 1), "{pass:?}");
    }
    assert_eq!(torch.kernels(Pass::Forward).len(), 3);
    assert_eq!(torch.kernels(Pass::BackwardData).len(), 3);
}
