//! The memory model against Korthikanti et al. 2022 ("Reducing Activation Recomputation in
//! Large Transformer Models", arXiv 2205.05198), section 2 of
//! `../shared/data/published-measurements.md`: the paper's per-layer activation formulas
//! (its Table 2) and the configurations of its Table 3, which ran on 80 GB A100s and so must fit.

use sim_core::units::Bytes;
use workloads::{
    DeviceCatalog, Dtype, MasterWeights, MemoryPlan, Model, Optimizer, Recompute, Sharding, WeightStorage,
    zoo,
};

/// A Megatron GPT as in the paper: s = 2048, V = 51,200.
fn gpt(layers: u64, hidden: u64, heads: u64) -> Model {
    let text = format!(
        "[model]\nname = \"gpt-{layers}x{hidden}\"\n[gpt]\nlayers = {layers}\nhidden = {hidden}\nheads = {heads}\n\
         sequence = 2048\nvocabulary = 51200\n"
    );
    Model::from_toml_str(&text, "test").unwrap()
}

fn plan(model: &Model, batch: u64, recompute: Recompute, sharding: Sharding) -> MemoryPlan<'_> {
    MemoryPlan {
        model,
        precision: Dtype::Fp16,
        gradient_precision: Dtype::Fp16,
        optimizer_precision: Dtype::Fp32,
        optimizer: Optimizer::Adam,
        weights: WeightStorage::default(),
        micro_batch: batch,
        micro_batches_in_flight: u64::from(sharding.pipeline),
        recompute,
        sharding,
        communication_buffers: Bytes::ZERO,
    }
}

fn tensor_parallel(tensor: u32, pipeline: u32, sequence_parallel: bool) -> Sharding {
    Sharding { data: 1, tensor, pipeline, zero_stage: 0, sequence_parallel }
}

/// Activation bytes of one transformer layer: the difference between a 2-layer and a 1-layer
/// model (the embedding and head cancel out).
fn per_layer(hidden: u64, heads: u64, batch: u64, recompute: Recompute, sharding: Sharding) -> u64 {
    let one = gpt(1, hidden, heads);
    let two = gpt(2, hidden, heads);
    let bytes = |model: &Model| plan(model, batch, recompute, sharding).activations();
    let (one, two) = (bytes(&one), bytes(&two));
    assert_eq!(one.before_blocks, two.before_blocks);
    assert_eq!(one.after_blocks, two.after_blocks);
    two.blocks - one.blocks
}

/// The paper's Table 3 models: (name, heads, hidden, layers, TP, PP, micro-batch).
const TABLE_3: [(&str, u64, u64, u64, u32, u32, u64); 4] = [
    ("22B", 64, 6144, 48, 8, 1, 4),
    ("175B", 96, 12288, 96, 8, 8, 1),
    ("530B", 128, 20480, 105, 8, 35, 1),
    ("1T", 160, 25600, 128, 8, 64, 1),
];

#[test]
fn per_layer_activations_match_korthikanti_table_2() {
    let s = 2048u64;
    for (name, a, h, _, t, _, b) in TABLE_3 {
        let sbh = s * b * h;
        // Layer norms keep mean and 1/std per token in fp32: 2 norms x 2 x 4 bytes x s b. The
        // paper leaves them out (4 / h of the total).
        let statistics = 16 * s * b;
        // The fp16 softmax output, the attention dropout's one-byte mask and its fp16 output.
        let scores = 5 * a * s * s * b;
        let no_split = tensor_parallel(1, 1, false);

        // Korthikanti's sbh (34 + 5 a s / h), exactly, plus the statistics.
        let none = per_layer(h, a, b, Recompute::None, no_split);
        assert_eq!(none, 34 * sbh + scores + statistics, "{name}: no recomputation");
        println!(
            "{name:>5}: no recomputation {:8.1} MB per layer (the paper's sbh(34 + 5as/h) plus statistics)",
            none as f64 / 1e6,
        );
        // Without attention dropout the core keeps only the softmax output: 2 a s^2 b.
        let without = {
            let text = |layers: u64| {
                format!(
                    "[model]\nname = \"g\"\n[gpt]\nlayers = {layers}\nhidden = {h}\nheads = {a}\n\
                     attention-dropout = 0.0\n"
                )
            };
            let bytes = |layers| {
                let model = Model::from_toml_str(&text(layers), "test").unwrap();
                plan(&model, b, Recompute::None, no_split).activations().blocks
            };
            bytes(2) - bytes(1)
        };
        assert_eq!(without, 34 * sbh + 2 * a * s * s * b + statistics, "{name}: no attention dropout");

        let selective = per_layer(h, a, b, Recompute::Selective, no_split);
        assert_eq!(selective, 34 * sbh + statistics, "{name}: selective");
        assert!((selective as f64 / (34 * sbh) as f64 - 1.0).abs() < 1e-3);

        let full = per_layer(h, a, b, Recompute::Full, no_split);
        assert_eq!(full, 2 * sbh, "{name}: full recomputation keeps 2sbh per layer");

        // Tensor parallelism without sequence parallelism: sbh (10 + 24/t) + scores / t.
        let split = per_layer(h, a, b, Recompute::None, tensor_parallel(t, 1, false));
        let t = u64::from(t);
        assert_eq!(split, 10 * sbh + 24 * sbh / t + scores / t + statistics, "{name}: tensor parallel");
        // With sequence parallelism everything is split: 34 sbh / t with selective recomputation.
        let sequence = per_layer(h, a, b, Recompute::Selective, tensor_parallel(t as u32, 1, true));
        assert_eq!(sequence, (34 * sbh + statistics) / t, "{name}: selective + sequence parallel");
        println!(
            "{name:>5}: t = {t}: {:.1} MB per layer (paper sbh(10 + 24/t + 5as/(ht)): {:.1} MB); selective + \
             sequence parallel {:.1} MB (paper 34sbh/t: {:.1} MB)",
            split as f64 / 1e6,
            (10 * sbh + 24 * sbh / t + scores / t) as f64 / 1e6,
            sequence as f64 / 1e6,
            (34 * sbh / t) as f64 / 1e6
        );
    }
}

/// Every Table 3 configuration ran on 80 GB A100s with full recomputation and with selective
/// recomputation plus sequence parallelism (Table 5), so both must fit; the 22B model does not
/// fit without recomputation (which is why the paper's baseline of Table 4 times one layer).
#[test]
fn table_3_configurations_fit_on_a100_80gb() {
    let a100 = DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap();
    for (name, a, h, layers, t, p, b) in TABLE_3 {
        let model = gpt(layers, h, a);
        for (recompute, sequence_parallel) in [(Recompute::Full, false), (Recompute::Selective, true)] {
            let memory =
                plan(&model, b, recompute, tensor_parallel(t, p, sequence_parallel)).breakdown().unwrap();
            println!(
                "{name:>5} t={t} p={p} b={b} {recompute:>9}{}: {:6.1} GB of {:.1} GB (weights {:.1}, optimizer {:.1}, \
                 activations {:.1})",
                if sequence_parallel { " + SP" } else { "     " },
                memory.total().as_f64() / 1e9,
                a100.memory_capacity.as_f64() / 1e9,
                memory.weights.as_f64() / 1e9,
                memory.optimizer.as_f64() / 1e9,
                memory.activations.as_f64() / 1e9
            );
            memory.check(a100).unwrap_or_else(|error| panic!("{name} {recompute}: {error}"));
        }
    }
    let model = gpt(48, 6144, 64);
    let memory = plan(&model, 4, Recompute::None, tensor_parallel(8, 1, false)).breakdown().unwrap();
    let error = memory.check(a100).unwrap_err().to_string();
    assert!(error.contains("does not fit") && error.contains("activations"), "{error}");
}

/// The activations of a model never depend on the device, grow linearly with the micro-batch,
/// and are at most the sum of the layers' own counts (each tensor once) in the compute dtype
/// (plus the narrow tensors counted wider: fp32 statistics and loss, int64 indices).
#[test]
fn activations_scale_with_the_batch_and_stay_below_the_layer_sum() {
    for name in zoo::NAMES {
        let model = zoo::by_name(name).unwrap();
        let one = MemoryPlan::data_parallel(&model, Dtype::Fp32, Dtype::Fp32, Optimizer::Adam, 1, 1);
        let eight = MemoryPlan { micro_batch: 8, ..one.clone() };
        let (small, large) = (one.activations().total(), eight.activations().total());
        assert_eq!(large, 8 * small, "{name}");
        let layer_sum = model.activation_elements_per_sample() * 4;
        assert!(small <= layer_sum * 2, "{name}: {small} vs layer sum {layer_sum}");
        assert!(small > 0, "{name}");
        let full = MemoryPlan { recompute: Recompute::Full, ..one.clone() }.activations().total();
        let selective = MemoryPlan { recompute: Recompute::Selective, ..one }.activations().total();
        assert!(full <= selective.max(small) && selective <= small, "{name}: {full} {selective} {small}");
    }
}

/// FP8 training as Transformer Engine runs it: only the GEMMs run in FP8, so a layer keeps
/// Korthikanti's tensors in bf16 except the inputs of its four linear layers, which each keeps
/// as its FP8 cast (one byte: QKV input 2 -> 1, projection input 2 -> 1, FC1 input 2 -> 1, FC2
/// input 8 -> 4 bytes per s b h): 34 - 7 = 27 s b h per layer with selective recomputation.
/// The weights are the bf16 weights plus an FP8 copy and its FP8 transpose of every linear
/// weight.
#[test]
fn fp8_keeps_bf16_activations_except_the_gemm_inputs_and_fp8_weight_copies() {
    let s = 2048u64;
    let (a, h, b) = (96u64, 12288u64, 1u64);
    let sbh = s * b * h;
    let statistics = 16 * s * b;
    let layer = |precision: Dtype| {
        let bytes = |layers: u64| {
            let model = gpt(layers, h, a);
            MemoryPlan { precision, ..plan(&model, b, Recompute::Selective, tensor_parallel(1, 1, false)) }
                .activations()
                .blocks
        };
        bytes(2) - bytes(1)
    };
    assert_eq!(layer(Dtype::Bf16), 34 * sbh + statistics);
    assert_eq!(layer(Dtype::Fp8), 27 * sbh + statistics);

    let model = gpt(2, h, a);
    let bf16 = plan(&model, b, Recompute::Selective, tensor_parallel(1, 1, false));
    let fp8 = MemoryPlan { precision: Dtype::Fp8, ..bf16.clone() };
    let (bf16, fp8) = (bf16.breakdown().unwrap(), fp8.breakdown().unwrap());
    let linear: u64 = model
        .layers
        .iter()
        .filter(|l| matches!(l.kind, workloads::LayerKind::Linear { .. }))
        .map(|l| l.cost.params)
        .sum();
    let difference = fp8.weights.0 - bf16.weights.0;
    assert!(difference.abs_diff(2 * linear) <= 1, "{difference} vs 2 x {linear}");
    assert_eq!((fp8.gradients, fp8.optimizer), (bf16.gradients, bf16.optimizer));
    // FP8 parameters: the linear weights are their FP8 tensor and its transpose only, so every
    // weight costs 2 bytes (bf16 for the others); the optimizer keeps its fp32 copy of all.
    let fp8_parameters = MemoryPlan {
        precision: Dtype::Fp8,
        weights: WeightStorage { master: MasterWeights::Copy, fp8: true },
        ..plan(&model, b, Recompute::Selective, tensor_parallel(1, 1, false))
    }
    .breakdown()
    .unwrap();
    assert_eq!(fp8_parameters.weights, bf16.weights);
    assert_eq!(fp8_parameters.weights.0, 2 * model.parameters());
    assert_eq!(fp8_parameters.optimizer, bf16.optimizer);
}

/// The margin a report prints: what is needed against the capacity, and by how much it fits or
/// not.
#[test]
fn the_margin_says_how_much_is_left_or_missing() {
    use workloads::memory::Margin;
    let capacity = Bytes(80 << 30);
    let fits = Margin::new(Bytes(71_300_000_000), capacity);
    assert!(fits.fits());
    assert_eq!(fits.to_string(), "needs 71.30 GB of 85.90 GB (80 GiB): 14.60 GB (17.0%) to spare");
    let over = Margin::new(Bytes(91_860_000_000), capacity);
    assert!(!over.fits());
    assert_eq!(over.spare_bytes(), i128::from(capacity.0) - 91_860_000_000);
    assert_eq!(over.to_string(), "needs 91.86 GB of 85.90 GB (80 GiB): over by 5.96 GB (6.9%)");
    assert!((over.fraction() + 0.0694).abs() < 1e-3);
}
