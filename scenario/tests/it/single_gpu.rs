//! Single-GPU training steps against real measurements: ParaDL's one-V100 data-parallel logs
//! (`../shared/data/published-measurements.md`, section 6.3: Chainer, fp32, ResNet-50 at 64
//! images per step, VGG-16 at 32) and its layer-wise AlexNet runs (`../shared/data/paradl/
//! MEASURED.md`: four V100s used one after another, no micro-batching, so a step is one GPU's
//! worth of compute plus the activation copies between them). The measured times include data
//! loading (a prefetching iterator), the copy of the batch to the GPU and the Adam update; ours
//! are the compute of forward, backward and the optimizer step, with the default compute model,
//! plus the copy of the batch over PCIe: Chainer's `StandardUpdater` copies it on the stream
//! the kernels run on, so it adds to every step (`[workload.input] copy = "compute-stream"`,
//! docs/compute-model.md "Input pipeline").

use workloads::{
    ComputeModel, DeviceCatalog, Dtype, KernelShape, Optimizer, OptimizerPasses, OptimizerStep, Pass,
    StepWidths, zoo,
};

/// Seconds of one training step of `model` at `batch` in fp32 on a V100 (the batch's copy to
/// the device over the V100's PCIe link, forward, both backward passes of every layer, Adam one
/// tensor at a time as Chainer runs it), the part in convolutions, and the step priced by FLOPs
/// alone (the model before shapes; with the copy). The first layer has no backward-data pass.
fn step(compute: &ComputeModel, model: &str, batch: u64) -> (f64, f64, f64) {
    step_of(compute, &zoo::by_name(model).unwrap(), batch)
}

/// [`step`] of a model given as layers.
fn step_of(compute: &ComputeModel, model: &workloads::Model, batch: u64) -> (f64, f64, f64) {
    let v100 = DeviceCatalog::builtin().get("v100-sxm2-16gb").unwrap();
    let (mut total, mut conv, mut flat) = (0.0, 0.0, 0.0);
    // One GEMM ceiling for all units: the model before shapes.
    let before = ComputeModel { vector_gemm_efficiency: compute.gemm_efficiency, ..compute.clone() };
    for (index, layer) in model.layers.iter().enumerate() {
        if layer.cost.is_free() {
            continue;
        }
        for pass in Pass::ALL {
            if pass == Pass::BackwardWeight && layer.cost.backward_weight_flops == 0.0 {
                continue;
            }
            // The input of the first layer needs no gradient (as the lowering does).
            if pass == Pass::BackwardData && index == 0 {
                continue;
            }
            let seconds =
                compute.layer_duration(v100, Dtype::Fp32, layer, pass, batch).unwrap().as_secs_f64();
            total += seconds;
            let (flops, bytes) = (layer.cost.flops(pass, batch), layer.cost.bytes(pass, batch, Dtype::Fp32));
            flat += before.duration(v100, Dtype::Fp32, flops, bytes, layer.cost.class).unwrap().as_secs_f64();
            if matches!(KernelShape::of_layer(layer, pass, batch), KernelShape::Conv { .. }) {
                conv += seconds;
            }
        }
    }
    // Chainer's Adam: one kernel per tensor, fp32 throughout.
    let adam = OptimizerStep { fused: false, ..adam_over(model, Dtype::Fp32, OptimizerPasses::Fused) };
    let optimizer = compute.optimizer_step_duration(v100, &adam).unwrap().as_secs_f64();
    // The batch in fp32 over the host link, as the simulation copies it (`input_copy_bytes`).
    let copy = (model.input.elements() * batch * 4) as f64 / v100.pcie_bandwidth.bytes_per_second();
    (total + optimizer + copy, conv, flat + optimizer + copy)
}

/// A fused Adam step over `model`'s parameters, one tensor per layer with weights, its
/// gradients in `precision` (an fp16 model keeps an fp32 master copy), with `passes` around it.
fn adam_over(model: &workloads::Model, precision: Dtype, passes: OptimizerPasses) -> OptimizerStep {
    let mixed = precision != Dtype::Fp32;
    OptimizerStep {
        optimizer: Optimizer::Adam,
        parameters: model.parameters(),
        tensors: model.layers.iter().filter(|l| l.cost.params > 0).count() as u64,
        fused: true,
        gradient_bytes: precision.bytes(),
        widths: if mixed { StepWidths::MIXED } else { StepWidths::FP32 },
        passes,
    }
}

#[test]
fn resnet50_and_vgg16_steps_on_one_v100() {
    let compute = ComputeModel::default();
    // (model, images per step, measured seconds, accuracy bound recorded with the defaults).
    // ResNet-50's floor stepped down once, 0.945 -> 0.94: cuDNN's helper kernels (two launches
    // per SIMT backward-data pass, three per backward-weight pass) took it from 94.8% to 94.2%
    // (docs/compute-model.md, "cuDNN's helper kernels"), and once more, 0.94 -> 0.925, when the
    // step gained the copy of its batch to the GPU (38.5 MB at 64 images: 2.4 ms), which the
    // measured step contains; our ResNet-50 compute was already 5.8% slower than the
    // measurement, so the copy took it from 94.2% to 92.9% (VGG-16 from 95.4% to 95.8%).
    // ResNet-50's stepped down once more, 0.925 -> 0.92, with the zeroing pass of strided 1x1
    // backward-data (docs/compute-model.md, "DeepBench"): its three strided 1x1 projections
    // took it from 92.9% to 92.6%, our step being already slower than the measurement.
    // VGG-16's stepped down once, 0.955 -> 0.95, with the filling split of 2-D SIMT
    // backward-weight: its RGB layer's (3 -> 64 channels at 224x224, one output tile) took it
    // from 95.8% to 95.3%; DeepBench times that very layer at half what 32 slices take.
    for (model, batch, measured, bound) in [("resnet50", 64, 0.1855, 0.92), ("vgg16", 32, 0.2633, 0.95)] {
        let (ours, conv, flat) = step(&compute, model, batch);
        let winograd =
            step(&ComputeModel { winograd_convolutions: true, ..ComputeModel::default() }, model, batch).0;
        let accuracy = 1.0 - (ours / measured - 1.0).abs();
        println!(
            "{model} b={batch}: {:.1} ms (convolutions {:.1} ms; with Winograd {:.1} ms; FLOPs only {:.1} ms), measured {:.1} ms: {:.1}%",
            ours * 1e3,
            conv * 1e3,
            winograd * 1e3,
            flat * 1e3,
            measured * 1e3,
            accuracy * 100.0
        );
        assert!(accuracy >= bound, "{model}: {accuracy}");
    }
}

/// ParaDL's layer-wise model-parallel AlexNet (Chainer's single-tower AlexNet at 226x226, fp32,
/// four V100s in turn): 0.034, 0.047 and 0.092 s per step at 32, 64 and 128 images. Ours leaves
/// out the copies between GPUs (the largest activation, conv1's output, is 56 MB at 128 images:
/// under 1 ms over NVLink).
#[test]
fn chainer_alexnet_steps_on_v100s_in_turn() {
    let model = workloads::zoo::by_name("paradl-alexnet").unwrap();
    for (batch, measured, bound) in [(32, 0.034, 0.68), (64, 0.047, 0.89), (128, 0.092, 0.85)] {
        let (ours, conv, flat) = step_of(&ComputeModel::default(), &model, batch);
        let accuracy = 1.0 - (ours / measured - 1.0).abs();
        println!(
            "alexnet (Chainer) b={batch}: {:.1} ms (convolutions {:.1} ms; FLOPs only {:.1} ms), measured {:.1} ms: {:.1}%",
            ours * 1e3,
            conv * 1e3,
            flat * 1e3,
            measured * 1e3,
            accuracy * 100.0
        );
        assert!(accuracy >= bound, "b={batch}: {accuracy}");
    }
}

/// Megatron-LM's 1.7B GPT (Narayanan et al. 2021, Table 1: 32 A100s, data parallel, micro-batch
/// 16, s = 2048, full recomputation, 137 TFLOP/s per GPU = 3.53 s per iteration): the compute
/// of one GPU's micro-batch (forward, the transformer layers' recomputed forward, backward) and
/// its Adam step with Megatron-LM's mixed-precision passes, without the gradient all-reduce,
/// which overlaps the backward. Megatron checkpoints only the transformer layers
/// (`ParallelTransformer._checkpointed_forward`, megatron/model/transformer.py, 2021): the
/// embeddings, the final norm, the logits and the loss run forward once.
#[test]
fn megatron_1_7b_micro_batch_on_one_a100() {
    let model = zoo::by_name("megatron-1.7b").unwrap();
    let a100 = DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap();
    let measured = 3.53;
    let compute = ComputeModel::default();
    let (mut shaped, mut flat) = (0.0, 0.0);
    for layer in &model.layers {
        if layer.cost.is_free() {
            continue;
        }
        // The transformer layers run forward twice: once more in the backward.
        let forwards = if layer.name.starts_with("layers.") { 2 } else { 1 };
        let passes =
            std::iter::repeat_n(Pass::Forward, forwards).chain([Pass::BackwardData, Pass::BackwardWeight]);
        for pass in passes {
            if pass == Pass::BackwardWeight && layer.cost.backward_weight_flops == 0.0 {
                continue;
            }
            shaped += compute.layer_duration(a100, Dtype::Fp16, layer, pass, 16).unwrap().as_secs_f64();
            let (flops, bytes) = (layer.cost.flops(pass, 16), layer.cost.bytes(pass, 16, Dtype::Fp16));
            flat +=
                compute.duration(a100, Dtype::Fp16, flops, bytes, layer.cost.class).unwrap().as_secs_f64();
        }
    }
    let adam = adam_over(&model, Dtype::Fp16, OptimizerPasses::Megatron);
    let optimizer = compute.optimizer_step_duration(a100, &adam).unwrap().as_secs_f64();
    let (shaped, flat) = (shaped + optimizer, flat + optimizer);
    let accuracy = 1.0 - (shaped / measured - 1.0).abs();
    println!(
        "megatron-1.7b micro-batch 16: {shaped:.3} s (FLOPs only: {flat:.3} s; optimizer {:.1} ms), measured {measured} s: {:.1}%",
        optimizer * 1e3,
        accuracy * 100.0
    );
    // Raised from 0.77 to 0.89 with Megatron's fp32 loss and optimizer passes (89.0%), to 0.92
    // with the A100 80 GB's sustained matrix rate (`matrix-sustained-fraction`: 92.7%).
    assert!(accuracy >= 0.92, "{accuracy}");
}

/// The shipped profiles on these steps, next to the defaults. Issue 12 asks that a profile fitted
/// to other workloads be at most 2 points worse than the defaults, and the V100 profile (DLRM
/// traces) is, on both steps. The floors ratchet, with one recorded step down: VGG-16 reached
/// 99.4% with the profile's earlier fp32 ceiling of 0.851, fitted through the FLOP ramp to
/// DLRM's unsaturated products, which made VGG's convolutions slower than the defaults by
/// chance; held at the default ceiling it is 95.8% (defaults 95.3%) and ResNet-50 rose from
/// 89.4% to 93.0% (docs/compute-model.md, "Results"); cuDNN's helper kernels then took
/// ResNet-50 to 92.4% (defaults 94.8% -> 94.2%), its floor from 0.925 to 0.92; the copy of the
/// batch to the GPU (2.4 ms, in the measured step too) took it to 91.1%, its floor to 0.91,
/// because our ResNet-50 step was already slower than the measurement; the zeroing pass of
/// strided 1x1 backward-data took it to 90.8%, its floor to 0.905 (docs/compute-model.md,
/// "DeepBench").
#[test]
fn shipped_profiles_on_the_one_gpu_steps() {
    let v100 = workloads::profile::Profile::builtin("v100-sxm2-16gb").unwrap().compute;
    let accuracy = |ours: f64, measured: f64| 1.0 - (ours / measured - 1.0).abs();
    for (model, batch, measured, bound) in [("resnet50", 64, 0.1855, 0.905), ("vgg16", 32, 0.2633, 0.955)] {
        let default = accuracy(step(&ComputeModel::default(), model, batch).0, measured);
        let profile = accuracy(step(&v100, model, batch).0, measured);
        println!("V100 profile on {model}: {:.1}% (defaults {:.1}%)", profile * 100.0, default * 100.0);
        assert!(profile >= bound, "{model}: {profile}");
        assert!(
            profile >= default - 0.02,
            "{model}: {profile} with the profile, {default} with the defaults"
        );
    }
}

/// ParaDL's CosmoFlow (Kahira et al., HPDC'21) on one V100 at batch 1, fp32, Chainer with
/// cuDNN 7: the first layer row of `../shared/data/paradl/model/COSMOFLOW.net_256` and
/// `COSMOFLOW.net` carries the measured training compute per sample (FORMAT.md: "seconds per
/// sample of training compute on one GPU"), 0.263517898 s for 4x256^3 and 2.108143184 s for
/// 4x512^3 (exactly 8 times the first: the 512^3 value scales the 256^3 one by the voxel count).
/// The zoo's `cosmoflow-256` and `cosmoflow-512` follow those layer tables. The bounds record
/// what the model reaches and only ratchet up; issue 12's target is 85%
/// (docs/compute-model.md, "One-GPU steps", says what is still missing).
#[test]
fn cosmoflow_steps_on_one_v100() {
    let compute = ComputeModel::default();
    for (model, measured, bound) in
        [("cosmoflow-256", 0.263517898, 0.39), ("cosmoflow-512", 2.108143184, 0.35)]
    {
        let (ours, conv, flat) = step(&compute, model, 1);
        let accuracy = 1.0 - (ours / measured - 1.0).abs();
        println!(
            "{model} b=1: {:.1} ms (convolutions {:.1} ms; FLOPs only {:.1} ms), measured {:.1} ms: {:.1}%",
            ours * 1e3,
            conv * 1e3,
            flat * 1e3,
            measured * 1e3,
            accuracy * 100.0
        );
        assert!(accuracy >= bound, "{model}: {accuracy}");
    }
}

/// The Megatron SC'21 scenarios name Megatron-LM as their framework, which implies its
/// optimizer passes and gradient accumulation (`[compute] optimizer-passes`,
/// `gradient-accumulation`); any other value the scenario sets is refused with the key and the
/// valid names.
#[test]
fn megatron_scenarios_name_their_optimizer_passes() {
    use scenario::Scenario;
    use std::path::Path;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/megatron-sc21/gpt-1.7b.toml");
    let text = fs_err::read_to_string(&path).unwrap();
    assert!(text.contains("framework = \"megatron-lm\""));
    let scenario = Scenario::parse(&text, &path).unwrap();
    assert_eq!(scenario.optimizer_passes, OptimizerPasses::Megatron);
    assert_eq!(scenario.gradient_accumulation, workloads::GradientAccumulation::Add);
    for (key, valid) in
        [("optimizer-passes", "fused, megatron, for-loop"), ("gradient-accumulation", "in-kernel, add")]
    {
        let broken = format!("{text}\n[compute]\n{key} = \"apex\"\n");
        let error = Scenario::parse(&broken, &path).unwrap_err().to_string();
        assert!(error.contains(&format!("compute.{key}")) && error.contains(valid), "{error}");
    }
}
