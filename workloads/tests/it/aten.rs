//! Operator costs from profiler argument shapes: closed forms on shapes taken from real Kineto
//! traces, the errors, and invariants of the element-wise rule on random shapes.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use proptest::prelude::*;
use workloads::KernelWork;
use workloads::aten::{KNOWN_OPERATORS, OperatorCall, Uncosted, operator_kernels, operator_work};
use workloads::{Dtype, OpClass};

/// The work of `name` on arguments with these sizes and `Input type` strings, launching `kernels`.
fn launched(name: &str, dims: &[&[u64]], types: &[&str], kernels: &[&str]) -> Result<KernelWork, Uncosted> {
    let dims: Vec<Option<Vec<u64>>> = dims.iter().map(|dims| Some(dims.to_vec())).collect();
    let types: Vec<Option<String>> = types.iter().map(|name| Some(name.to_string())).collect();
    operator_work(&OperatorCall { name, dims: &dims, types: &types, kernel_names: kernels })
}

fn work(name: &str, dims: &[&[u64]], types: &[&str]) -> Result<KernelWork, Uncosted> {
    launched(name, dims, types, &[])
}

#[test]
fn mm_costs_2mkn_and_reads_both_operands_and_writes_the_product() {
    let (m, k, n) = (1024.0, 1705.0, 512.0);
    let fp32 = work("aten::mm", &[&[1024, 1705], &[1705, 512]], &["float", "float"]).unwrap();
    assert_eq!(fp32.flops, 2.0 * m * k * n);
    assert_eq!(fp32.bytes, 4.0 * (m * k + k * n + m * n));
    assert_eq!((fp32.class, fp32.dtype), (OpClass::Gemm, Dtype::Fp32));

    let kernel =
        "sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_stage3_warpsize2x2x1_tensor16x8x8";
    let tf32 = launched("aten::mm", &[&[1024, 1705], &[1705, 512]], &["float", "float"], &[kernel]).unwrap();
    assert_eq!((tf32.dtype, tf32.flops, tf32.bytes), (Dtype::Tf32, fp32.flops, fp32.bytes));
    // CUTLASS's and cuBLAS's fp32 tensor-op tiles are TF32 too (the A100 traces' GEMMs).
    for kernel in [
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4::Params)",
        "ampere_s16816gemm_128x128_ldg8_stages_32x5_nn",
    ] {
        let tf32 = launched("aten::mm", &[&[1024, 1705], &[1705, 512]], &["float", "float"], &[kernel]);
        assert_eq!(tf32.unwrap().dtype, Dtype::Tf32, "{kernel}");
    }
    let plain = launched(
        "aten::mm",
        &[&[1024, 1705], &[1705, 512]],
        &["float", "float"],
        &["ampere_sgemm_128x64_tn"],
    );
    assert_eq!(plain.unwrap().dtype, Dtype::Fp32);

    let half = work("aten::mm", &[&[1024, 1705], &[1705, 512]], &["c10::Half", "c10::Half"]).unwrap();
    assert_eq!((half.dtype, half.flops, half.bytes), (Dtype::Fp16, fp32.flops, fp32.bytes / 2.0));
    let bf16 = work("aten::mm", &[&[64, 64], &[64, 64]], &["c10::BFloat16", "c10::BFloat16"]).unwrap();
    let fp64 = work("aten::mm", &[&[64, 64], &[64, 64]], &["double", "double"]).unwrap();
    assert_eq!((bf16.dtype, fp64.dtype), (Dtype::Bf16, Dtype::Fp64));
    // A TF32 kernel name does not turn a half-precision product into TF32.
    let half = launched("aten::mm", &[&[64, 64], &[64, 64]], &["c10::Half", "c10::Half"], &[kernel]).unwrap();
    assert_eq!(half.dtype, Dtype::Fp16);
}

#[test]
fn addmm_adds_the_bias_once_per_output() {
    // As recorded for a Linear(1705, 512) on a batch of 1024.
    let addmm = work(
        "aten::addmm",
        &[&[512], &[1024, 1705], &[1705, 512], &[], &[]],
        &["float", "float", "float", "Scalar", "Scalar"],
    )
    .unwrap();
    let (m, k, n) = (1024.0, 1705.0, 512.0);
    assert_eq!(addmm.flops, 2.0 * m * k * n + m * n);
    assert_eq!(addmm.bytes, 4.0 * (n + m * k + k * n + m * n));
    assert_eq!((addmm.class, addmm.dtype), (OpClass::Gemm, Dtype::Fp32));
    // A bias that cannot broadcast onto the product is malformed.
    let wrong = work("aten::addmm", &[&[300], &[1024, 1705], &[1705, 512]], &["float"; 3]);
    assert!(matches!(wrong, Err(Uncosted::Malformed(_))), "{wrong:?}");
}

#[test]
fn bmm_baddbmm_and_mv_count_every_batch() {
    let bmm = work("aten::bmm", &[&[1024, 96, 50], &[1024, 50, 8]], &["float", "float"]).unwrap();
    assert_eq!(bmm.flops, 2.0 * 1024.0 * 96.0 * 50.0 * 8.0);
    assert_eq!(bmm.bytes, 4.0 * 1024.0 * (96.0 * 50.0 + 50.0 * 8.0 + 96.0 * 8.0));
    let baddbmm =
        work("aten::baddbmm", &[&[1024, 96, 8], &[1024, 96, 50], &[1024, 50, 8], &[], &[]], &["float"; 3])
            .unwrap();
    assert_eq!(baddbmm.flops, bmm.flops + 1024.0 * 96.0 * 8.0);
    assert_eq!(baddbmm.bytes, bmm.bytes + 4.0 * 1024.0 * 96.0 * 8.0);
    let mv = work("aten::mv", &[&[4096, 1024], &[1024]], &["c10::Half"; 2]).unwrap();
    assert_eq!((mv.flops, mv.bytes), (2.0 * 4096.0 * 1024.0, 2.0 * (4096.0 * 1024.0 + 1024.0 + 4096.0)));
    let different_batches = work("aten::bmm", &[&[8, 96, 50], &[4, 50, 8]], &["float", "float"]);
    assert!(matches!(different_batches, Err(Uncosted::Malformed(_))));
}

#[test]
fn mismatched_inner_dimensions_are_malformed_and_name_both_shapes() {
    let error = work("aten::mm", &[&[1024, 1705], &[1000, 512]], &["float", "float"]).unwrap_err();
    let Uncosted::Malformed(message) = &error else { panic!("{error:?}") };
    assert!(message.contains("[1024, 1705]") && message.contains("[1000, 512]"), "{message}");
    assert!(error.to_string().contains("inner dimensions"), "{error}");
    let rank = work("aten::mm", &[&[1024], &[1024, 512]], &["float", "float"]);
    assert!(matches!(rank, Err(Uncosted::Malformed(_))), "{rank:?}");
}

#[test]
fn convolution_backward_computes_both_gradients_from_the_shapes() {
    // ResNet-50's 3x3 stride-2 convolution of stage 3, batch 32, half precision.
    let dims: [&[u64]; 3] = [&[32, 128, 28, 28], &[32, 64, 56, 56], &[128, 64, 3, 3]];
    let types = ["c10::Half", "c10::Half", "c10::Half", "", "", "", "", "Scalar", "", "Scalar", ""];
    let conv = work("aten::convolution_backward", &dims, &types).unwrap();
    let macs = 32.0 * 28.0 * 28.0 * 128.0 * 64.0 * 9.0;
    assert_eq!((conv.flops, conv.class, conv.dtype), (4.0 * macs, OpClass::Gemm, Dtype::Fp16));
    let (grad, input, weight) = (32.0 * 128.0 * 28.0 * 28.0, 32.0 * 64.0 * 56.0 * 56.0, 128.0 * 64.0 * 9.0);
    assert_eq!(conv.bytes, 2.0 * (grad + 2.0 * input + 2.0 * weight));

    // A transposed convolution (weight [C_in, C_out, k, k]) only fits the other layout: its
    // products run over the input's positions.
    let transposed = work(
        "aten::convolution_backward",
        &[&[8, 32, 16, 16], &[8, 64, 8, 8], &[64, 32, 4, 4]],
        &["float"; 3],
    )
    .unwrap();
    assert_eq!(transposed.flops, 4.0 * 8.0 * 8.0 * 8.0 * 64.0 * 32.0 * 16.0);
    let neither = work(
        "aten::convolution_backward",
        &[&[8, 32, 16, 16], &[8, 64, 8, 8], &[16, 32, 4, 4]],
        &["float"; 3],
    );
    assert!(matches!(neither, Err(Uncosted::Malformed(_))), "{neither:?}");
}

#[test]
fn fused_attention_counts_two_products_and_its_backward_two_and_a_half_times_that() {
    let q: &[u64] = &[4, 16, 1024, 64];
    let forward =
        work("aten::_scaled_dot_product_flash_attention", &[q, q, q, &[], &[], &[]], &["c10::BFloat16"; 3])
            .unwrap();
    let (b, h, s, d) = (4.0, 16.0, 1024.0, 64.0);
    assert_eq!(forward.flops, 4.0 * b * h * s * s * d);
    assert_eq!(forward.bytes, 4.0 * b * h * s * d * 2.0);
    assert_eq!((forward.class, forward.dtype), (OpClass::Gemm, Dtype::Bf16));

    let dims: [&[u64]; 8] = [q, q, q, q, q, &[4, 16, 1024], &[], &[]];
    let types = [
        "c10::BFloat16",
        "c10::BFloat16",
        "c10::BFloat16",
        "c10::BFloat16",
        "c10::BFloat16",
        "float",
        "",
        "",
    ];
    let backward = work("aten::_scaled_dot_product_flash_attention_backward", &dims, &types).unwrap();
    assert_eq!(backward.flops, 10.0 * b * h * s * s * d);
    assert_eq!(backward.bytes, 8.0 * b * h * s * d * 2.0);

    // The kernel-level operator takes [b, s, h, d]; grouped-query keys with a longer sequence.
    let keys: &[u64] = &[4, 2048, 4, 64];
    let grouped =
        work("aten::_flash_attention_forward", &[&[4, 1024, 16, 64], keys, keys], &["c10::Half"; 3]).unwrap();
    assert_eq!(grouped.flops, 4.0 * b * h * s * 2048.0 * d);
    assert_eq!(grouped.bytes, 2.0 * (2.0 * b * h * s * d + 2.0 * 4.0 * 2048.0 * 4.0 * 64.0));
    // A packed variable-length batch: the sequence lengths are values, not recorded.
    let packed = work(
        "aten::_flash_attention_forward",
        &[&[1, 4096, 16, 64], &[1, 4096, 16, 64], &[1, 4096, 16, 64], &[5], &[5]],
        &["c10::Half", "c10::Half", "c10::Half", "int", "int"],
    );
    assert_eq!(packed, Err(Uncosted::MissingShapes));
}

#[test]
fn in_place_broadcast_add_reads_both_and_writes_the_first() {
    let add = work("aten::add_", &[&[1024, 96, 15], &[15], &[]], &["float", "float", "Scalar"]).unwrap();
    let elements = 1024.0 * 96.0 * 15.0;
    assert_eq!(add.flops, elements);
    assert_eq!(add.bytes, 4.0 * (elements + 15.0 + elements));
    assert_eq!((add.class, add.dtype), (OpClass::Elementwise, Dtype::Fp32));
    // Out of place the same: the broadcast output has the first input's shape here.
    assert_eq!(work("aten::add", &[&[1024, 96, 15], &[15], &[]], &["float", "float", "Scalar"]), Ok(add));
    // The other way round, out of place writes the broadcast shape, in place only the first.
    let out = work("aten::mul", &[&[15], &[1024, 96, 15]], &["float", "float"]).unwrap();
    assert_eq!((out.flops, out.bytes), (elements, 4.0 * (15.0 + 2.0 * elements)));
    let impossible = work("aten::add", &[&[3, 4], &[5]], &["float", "float"]);
    assert!(matches!(impossible, Err(Uncosted::Malformed(_))), "{impossible:?}");
}

#[test]
fn an_out_argument_is_written_not_read() {
    // mul.out(self, other, *, out) as HTA's V100 trace records it: a tensor times a zero-dim
    // double, into a float tensor.
    let mul = work("aten::mul", &[&[512], &[], &[512]], &["float", "double", "float"]).unwrap();
    assert_eq!((mul.flops, mul.bytes), (512.0, 4.0 * 512.0 + 8.0 + 4.0 * 512.0));
    // nan_to_num.out(self, nan, posinf, neginf, *, out), from the same trace.
    let types = ["float", "Scalar", "", "", "float"];
    let nan = work("aten::nan_to_num", &[&[1024, 64], &[], &[], &[], &[1024, 64]], &types).unwrap();
    assert_eq!(nan.bytes, 2.0 * 4.0 * 1024.0 * 64.0);
    // The out tensor's own element type is what is written.
    let half =
        work("aten::add", &[&[64], &[64], &[], &[64]], &["float", "float", "Scalar", "c10::Half"]).unwrap();
    assert_eq!(half.bytes, 4.0 * 64.0 * 2.0 + 2.0 * 64.0);
    // Without the out tensor, and in place, every tensor is read.
    let plain = work("aten::mul", &[&[512], &[512]], &["float", "float"]).unwrap();
    assert_eq!(plain.bytes, 3.0 * 4.0 * 512.0);
    let in_place =
        work("aten::addcmul_", &[&[512], &[512], &[512], &[]], &["float", "float", "float", "Scalar"]);
    assert_eq!(in_place.unwrap().bytes, 4.0 * 4.0 * 512.0);
}

/// The works of `name`'s kernels, with these sizes and types, launching `kernels`.
fn kernels(name: &str, dims: &[&[u64]], types: &[&str], kernels: &[&str]) -> Vec<KernelWork> {
    let dims: Vec<Option<Vec<u64>>> = dims.iter().map(|dims| Some(dims.to_vec())).collect();
    let types: Vec<Option<String>> = types.iter().map(|name| Some(name.to_string())).collect();
    operator_kernels(&OperatorCall { name, dims: &dims, types: &types, kernel_names: kernels }).unwrap()
}

#[test]
fn a_product_s_epilogue_kernels_pass_over_its_output() {
    // HTA's V100 trace: addmm's sgemm, then cuBLAS's bias epilogue, after a memset.
    let addmm =
        ([&[512][..], &[1024, 64], &[64, 512], &[], &[]], ["float", "float", "float", "Scalar", "Scalar"]);
    let launched = [
        "Memset (Device)",
        "volta_sgemm_128x32_tn",
        "void cublasLt::epilogue::impl::globalKernel<8, 32, float, float, float, true, false, false>",
    ];
    let works = kernels("aten::addmm", &addmm.0, &addmm.1, &launched);
    assert_eq!(works.len(), 2);
    assert_eq!(works[0], work("aten::addmm", &addmm.0, &addmm.1).unwrap());
    let outputs = 1024.0 * 512.0;
    assert_eq!(
        (works[1].class, works[1].flops, works[1].bytes),
        (OpClass::Elementwise, outputs, 8.0 * outputs)
    );
    // Split-K: the partial products summed by a second kernel.
    let split = kernels(
        "aten::bmm",
        &[&[4, 96, 1024], &[4, 1024, 32]],
        &["float", "float"],
        &["volta_sgemm_32x32_sliced1x4_nt", "splitKreduce_kernel"],
    );
    assert_eq!(split[1].bytes, 2.0 * 4.0 * 4.0 * 96.0 * 32.0);
    // One kernel, or an operator that is not a product: one work.
    assert_eq!(
        kernels("aten::mm", &[&[8, 8], &[8, 8]], &["float", "float"], &["volta_sgemm_128x32_nn"]).len(),
        1
    );
    let sum = kernels(
        "aten::sum",
        &[&[1024, 512], &[], &[], &[]],
        &["float", "", "Scalar", ""],
        &["Memset (Device)", "reduce_kernel"],
    );
    assert_eq!(sum.len(), 1);
}

#[test]
fn zero_dim_tensors_are_one_element_and_scalars_nothing() {
    let add = work("aten::add_", &[&[], &[], &[]], &["long", "long", "Scalar"]).unwrap();
    assert_eq!((add.flops, add.bytes, add.dtype), (1.0, 24.0, Dtype::Fp32));
    // A zero-dim float does not widen a half tensor's result; a dimensioned one does.
    let scaled = work("aten::mul", &[&[1024], &[]], &["c10::Half", "float"]).unwrap();
    assert_eq!(scaled.bytes, 2.0 * 1024.0 + 4.0 + 2.0 * 1024.0);
    let mixed = work("aten::add", &[&[1024], &[1024]], &["c10::Half", "float"]).unwrap();
    assert_eq!(mixed.bytes, (2.0 + 4.0 + 4.0) * 1024.0);
    let double = work("aten::exp", &[&[1024]], &["double"]).unwrap();
    assert_eq!((double.dtype, double.bytes), (Dtype::Fp64, 16.0 * 1024.0));
}

#[test]
fn comparisons_write_one_byte_per_element() {
    let eq = work("aten::eq", &[&[1024, 1024], &[]], &["float", "Scalar"]).unwrap();
    assert_eq!((eq.flops, eq.bytes), (1024.0 * 1024.0, 5.0 * 1024.0 * 1024.0));
    let masked =
        work("aten::masked_fill_", &[&[64, 128], &[64, 128], &[]], &["c10::Half", "bool", "Scalar"]).unwrap();
    assert_eq!(masked.bytes, 64.0 * 128.0 * (2.0 + 1.0 + 2.0));
}

#[test]
fn copies_fills_and_gathers_move_bytes_without_flops() {
    let copy = work("aten::copy_", &[&[951, 1024], &[951, 1024], &[]], &["int", "int", "Scalar"]).unwrap();
    assert_eq!((copy.flops, copy.bytes, copy.class), (0.0, 2.0 * 4.0 * 951.0 * 1024.0, OpClass::Elementwise));
    let converting =
        work("aten::copy_", &[&[1000], &[1000], &[]], &["c10::Half", "float", "Scalar"]).unwrap();
    assert_eq!(converting.bytes, 6.0 * 1000.0);
    let zero = work("aten::zero_", &[&[1000]], &["float"]).unwrap();
    assert_eq!((zero.flops, zero.bytes), (0.0, 4000.0));
    let clone = work("aten::clone", &[&[10, 100], &[]], &["c10::BFloat16", ""]).unwrap();
    assert_eq!(clone.bytes, 2.0 * 2.0 * 1000.0);
    let dropout = work("aten::native_dropout", &[&[1000], &[], &[]], &["float", "Scalar", "Scalar"]).unwrap();
    assert_eq!((dropout.flops, dropout.bytes), (1000.0, 9000.0));
    // GPT-2's token embedding: 8 x 1024 token ids gather rows of 768 floats.
    let embedding =
        work("aten::embedding", &[&[50257, 768], &[8, 1024], &[], &[], &[]], &["float", "long int"]).unwrap();
    let tokens = 8.0 * 1024.0;
    assert_eq!((embedding.flops, embedding.bytes), (0.0, 8.0 * tokens + 2.0 * tokens * 768.0 * 4.0));
    let select =
        work("aten::index_select", &[&[50257, 768], &[], &[8192]], &["float", "Scalar", "long int"]).unwrap();
    assert_eq!(select.bytes, embedding.bytes);
}

#[test]
fn layer_norm_reads_parameters_and_writes_row_statistics() {
    let forward = work(
        "aten::native_layer_norm",
        &[&[1024, 512], &[], &[512], &[512], &[]],
        &["float", "", "float", "float", "Scalar"],
    )
    .unwrap();
    let elements = 1024.0 * 512.0;
    assert_eq!(forward.flops, 8.0 * elements);
    assert_eq!(forward.bytes, 4.0 * (2.0 * elements + 2.0 * 512.0) + 1024.0 * 2.0 * 4.0);
    // One block per row: a row-wise normalisation, not a reduction across rows.
    assert_eq!((forward.class, forward.dtype), (OpClass::Normalization, Dtype::Fp32));

    let backward = work(
        "aten::native_layer_norm_backward",
        &[&[1024, 4864], &[1024, 4864], &[], &[1024, 1], &[1024, 1], &[4864], &[4864], &[]],
        &["float", "float", "", "float", "float", "float", "float", ""],
    )
    .unwrap();
    let elements = 1024.0 * 4864.0;
    assert_eq!(backward.flops, 16.0 * elements);
    // Read grad_out, input, mean, rstd, weight; write grad_input, grad_weight, grad_bias.
    assert_eq!(backward.bytes, 4.0 * (3.0 * elements + 2.0 * 1024.0 + 3.0 * 4864.0));
    assert_eq!(backward.class, OpClass::Normalization);

    // Launched as PyTorch's two kernels, it is priced as those two: the input gradient row by
    // row, then the scale and shift gradients, a reduction across the rows that reads the
    // output gradient, the input and the statistics again.
    let dims: Vec<Option<Vec<u64>>> =
        [&[1024, 4864][..], &[1024, 4864], &[], &[1024, 1], &[1024, 1], &[4864], &[4864], &[]]
            .iter()
            .map(|d| Some(d.to_vec()))
            .collect();
    let types: Vec<Option<String>> = ["float", "float", "", "float", "float", "float", "float", ""]
        .iter()
        .map(|t| Some(t.to_string()))
        .collect();
    let names = ["layer_norm_grad_input_kernel", "GammaBetaBackwardCUDAKernel"];
    let call = OperatorCall {
        name: "aten::native_layer_norm_backward",
        dims: &dims,
        types: &types,
        kernel_names: &names,
    };
    let kernels = operator_kernels(&call).unwrap();
    assert_eq!(kernels.len(), 2);
    let (rows, scale) = (4.0 * (2.0 * elements + 2.0 * 1024.0), 4.0 * 4864.0);
    assert_eq!((kernels[0].class, kernels[0].flops), (OpClass::Normalization, 8.0 * elements));
    assert_eq!(kernels[0].bytes, rows + scale + 4.0 * elements);
    assert_eq!((kernels[1].class, kernels[1].flops), (OpClass::Reduction, 8.0 * elements));
    assert_eq!(kernels[1].bytes, rows + 2.0 * scale);
}

#[test]
fn reductions_read_their_input() {
    let sum = work("aten::sum", &[&[1024, 40], &[], &[], &[]], &["float", "", "Scalar", ""]).unwrap();
    assert_eq!((sum.class, sum.dtype), (OpClass::Reduction, Dtype::Fp32));
    assert_eq!((sum.flops, sum.bytes), (1024.0 * 40.0, 4.0 * 1024.0 * 40.0));
    let softmax = work("aten::_softmax", &[&[64, 50257], &[], &[]], &["float", "Scalar", "Scalar"]).unwrap();
    assert_eq!((softmax.flops, softmax.bytes), (5.0 * 64.0 * 50257.0, 8.0 * 64.0 * 50257.0));
    // The loss gathers one logit per target, not the whole vocabulary.
    let nll =
        work("aten::nll_loss_forward", &[&[64, 50257], &[64], &[], &[], &[]], &["float", "long int", ""])
            .unwrap();
    assert_eq!((nll.flops, nll.bytes), (64.0, 64.0 * 8.0 + 2.0 * 64.0 * 4.0));
}

#[test]
fn tensor_lists_and_unrecorded_values_are_missing_shapes() {
    assert_eq!(work("aten::cat", &[&[], &[]], &["TensorList", "Scalar"]), Err(Uncosted::MissingShapes));
    // Newer traces write a tensor list's sizes as nested lists, which reach us as None.
    let dims = [None, Some(vec![])];
    let types = [Some("TensorList".to_string()), Some("Scalar".to_string())];
    let nested =
        operator_work(&OperatorCall { name: "aten::cat", dims: &dims, types: &types, kernel_names: &[] });
    assert_eq!(nested, Err(Uncosted::MissingShapes));
    let list = work("aten::add", &[&[], &[64]], &["TensorList", "float"]);
    assert_eq!(list, Err(Uncosted::MissingShapes));
    let foreach = work("aten::_foreach_add_", &[&[], &[], &[]], &["TensorList", "TensorList", "Scalar"]);
    assert_eq!(foreach, Err(Uncosted::MissingShapes));
    // A forward convolution's output size depends on its stride and padding values.
    let conv = work("aten::cudnn_convolution", &[&[32, 64, 56, 56], &[64, 64, 3, 3]], &["c10::Half"; 2]);
    assert_eq!(conv, Err(Uncosted::MissingShapes));
    // A tensor with nested sizes where the formula needs flat ones.
    let dims = [Some(vec![64, 64]), None];
    let types = [Some("float".to_string()), Some("float".to_string())];
    let call = OperatorCall { name: "aten::mm", dims: &dims, types: &types, kernel_names: &[] };
    assert_eq!(operator_work(&call), Err(Uncosted::MissingShapes));
}

#[test]
fn traces_without_shapes_are_missing_shapes() {
    let call = OperatorCall { name: "aten::mm", dims: &[], types: &[], kernel_names: &["ampere_sgemm"] };
    assert_eq!(operator_work(&call), Err(Uncosted::MissingShapes));
    // Sizes without types: the dtype is unknown.
    let dims = [Some(vec![64, 64]), Some(vec![64, 64])];
    let call = OperatorCall { name: "aten::mm", dims: &dims, types: &[], kernel_names: &[] };
    assert_eq!(operator_work(&call), Err(Uncosted::MissingShapes));
    let types = [None, None];
    let call = OperatorCall { name: "aten::add", dims: &dims, types: &types, kernel_names: &[] };
    assert_eq!(operator_work(&call), Err(Uncosted::MissingShapes));
}

#[test]
fn operators_without_a_formula_are_unknown() {
    for name in [
        "record_param_comms",
        "fbgemm::jagged_to_padded_dense",
        "aten::linear",
        "aten::matmul",
        "aten::conv2d",
        "aten::copy",
        "aten::mm_",
        "nccl:all_reduce",
        "",
    ] {
        let error = work(name, &[&[64, 64], &[64, 64]], &["float", "float"]).unwrap_err();
        assert_eq!(error, Uncosted::UnknownOperator, "{name}");
        assert_eq!(error.to_string(), "no cost formula for this operator");
    }
}

#[test]
fn types_without_a_rate_are_unsupported() {
    let complex = ["c10::complex<float>", "c10::complex<float>"];
    for name in ["aten::mm", "aten::add", "aten::sum"] {
        let error = work(name, &[&[64, 64], &[64, 64]], &complex).unwrap_err();
        assert_eq!(error, Uncosted::UnsupportedDtype("c10::complex<float>".to_string()), "{name}");
    }
    let integer = work("aten::mm", &[&[64, 64], &[64, 64]], &["long int", "long int"]);
    assert_eq!(integer, Err(Uncosted::UnsupportedDtype("long int".to_string())));
    // An unknown tag on an argument without sizes is taken for a scalar, not a tensor.
    let tagged = work("aten::add", &[&[64], &[]], &["float", "Int"]).unwrap();
    assert_eq!(tagged.bytes, 2.0 * 4.0 * 64.0);
    // Integer element-wise math is costed at the fp32 rate.
    assert_eq!(work("aten::add", &[&[64], &[64]], &["long int", "int"]).unwrap().dtype, Dtype::Fp32);
}

#[test]
fn every_known_operator_has_a_formula() {
    let dims: [&[u64]; 5] = [&[64, 64]; 5];
    for name in KNOWN_OPERATORS {
        let result = work(name, &dims, &["float"; 5]);
        assert_ne!(result, Err(Uncosted::UnknownOperator), "{name}");
        if let Ok(work) = result {
            assert!(work.flops.is_finite() && work.flops >= 0.0 && work.bytes > 0.0, "{name}: {work:?}");
        }
        assert_eq!(KNOWN_OPERATORS.iter().filter(|known| *known == name).count(), 1, "{name} listed twice");
    }
    assert!(KNOWN_OPERATORS.len() > 100 && KNOWN_OPERATORS.contains(&"aten::addmm"));
}

/// Bytes per element of the dtypes the property test draws.
const DTYPES: [(&str, f64); 7] = [
    ("float", 4.0),
    ("c10::Half", 2.0),
    ("c10::BFloat16", 2.0),
    ("double", 8.0),
    ("long int", 8.0),
    ("int", 4.0),
    ("bool", 1.0),
];

/// Element-wise operators the property test draws, out of place and in place.
const ELEMENTWISE: [&str; 6] =
    ["aten::add", "aten::mul", "aten::div", "aten::maximum", "aten::lt", "aten::add_"];

proptest! {
    /// Element-wise work on any broadcastable pair: one FLOP per output element, and traffic of
    /// at least the inputs plus one byte per output element.
    #[test]
    fn elementwise_work_covers_inputs_and_output(
        shape in prop::collection::vec(1u64..40, 0..5),
        ones in prop::collection::vec(any::<bool>(), 5),
        dropped in 0usize..5,
        op in prop::sample::select(&ELEMENTWISE[..]),
        types in (0usize..7, 0usize..7),
    ) {
        // The second operand: a suffix of the shape with some sizes set to 1.
        let suffix = &shape[dropped.min(shape.len())..];
        let other: Vec<u64> =
            suffix.iter().zip(&ones).map(|(&size, &one)| if one { 1 } else { size }).collect();
        let ((first_type, first_size), (other_type, other_size)) = (DTYPES[types.0], DTYPES[types.1]);
        let work = work(op, &[&shape, &other], &[first_type, other_type]).unwrap();
        let elements: f64 = shape.iter().map(|&size| size as f64).product();
        let other_elements: f64 = other.iter().map(|&size| size as f64).product();
        let inputs = elements * first_size + other_elements * other_size;
        prop_assert_eq!(work.flops, elements);
        prop_assert!(work.bytes.is_finite() && work.bytes >= inputs + elements, "{:?}", work);
        prop_assert_eq!(work.class, OpClass::Elementwise);
    }
}

#[test]
fn products_off_the_16_byte_grid_are_marked_unaligned() {
    let aligned = |name: &str, dims: &[&[u64]], types: &[&str]| work(name, dims, types).unwrap().aligned;
    // The A100 trace's slow products have K = 1705 (fp32: 4 values per 16 bytes).
    assert!(!aligned("aten::mm", &[&[1024, 1705], &[1705, 512]], &["float", "float"]));
    assert!(aligned("aten::mm", &[&[1024, 1024], &[1024, 2048]], &["float", "float"]));
    // 1028 is a multiple of 4 but not of 8: aligned in fp32, not in fp16.
    assert!(aligned("aten::mm", &[&[1024, 1028], &[1028, 512]], &["float", "float"]));
    assert!(!aligned("aten::mm", &[&[1024, 1028], &[1028, 512]], &["c10::Half", "c10::Half"]));
    assert!(aligned("aten::bmm", &[&[3, 64, 32], &[3, 32, 16]], &["float", "float"]));
    // A matrix-vector product has no N to align; element-wise work is always aligned.
    assert!(aligned("aten::mv", &[&[64, 32], &[32]], &["float", "float"]));
    assert!(aligned("aten::add", &[&[7, 3], &[7, 3]], &["float", "float"]));
}

#[test]
fn a_reductions_kernel_name_says_which_dimension_it_reduced() {
    use workloads::{KernelShape, ReductionShape};
    // HTA's V100 trace: `aten::sum` of [1024, 96] launched PyTorch's reduction kernel with 4
    // outputs per vector load, which it does only when the outputs are the contiguous
    // dimension: a sum over the 1024 rows into 96 outputs (a bias gradient).
    let kernel = "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)";
    let types = ["float", "", "Scalar", ""];
    let sum = |dims: &[u64], kernel: &str| {
        launched("aten::sum", &[dims, &[], &[], &[]], &types, &["Memset (Device)", kernel]).unwrap()
    };
    let bias = sum(&[1024, 96], kernel);
    assert_eq!(
        bias.shape,
        KernelShape::Reduction(ReductionShape {
            outputs: 96,
            inputs_per_output: 1024,
            contiguous: false,
            unroll: 4
        })
    );
    assert_eq!((bias.class, bias.bytes), (OpClass::Reduction, 4.0 * 1024.0 * 96.0));
    // One output per load: a row sum, or columns of an odd count; the trace does not say which.
    let scalar = kernel.replacen("<128, 4,", "<512, 1,", 1);
    assert_eq!(sum(&[1024, 1705], &scalar).shape, KernelShape::Unknown);
    // A 1-D input is reduced whole.
    assert_eq!(
        sum(&[1_003_520], &scalar).shape,
        KernelShape::Reduction(ReductionShape {
            outputs: 1,
            inputs_per_output: 1_003_520,
            contiguous: true,
            unroll: 4
        })
    );
    // Without PyTorch's reduction kernel (another library, or no kernel names) no shape.
    assert_eq!(sum(&[1024, 96], "some_other_kernel").shape, KernelShape::Unknown);
    // Welford's reductions unroll by 2 (`ReduceOp<..., 2>`).
    let welford = kernel.replace("float, 4>", "float, 2>");
    let KernelShape::Reduction(shape) = sum(&[1024, 96], &welford).shape else { panic!("a shape") };
    assert_eq!(shape.unroll, 2);
}
