//! Zoo totals against published numbers. Each check says which count it compares (with or
//! without batch norm, pre-training heads, ...) and its tolerance; `cargo test -- --nocapture`
//! prints ours next to the published figure.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use workloads::family::transformer::megatron_parameters;
use workloads::{LayerKind, Model, zoo};

fn model(name: &str) -> Model {
    zoo::by_name(name).unwrap_or_else(|error| panic!("{error}"))
}

fn without_batch_norm(model: &Model) -> u64 {
    model
        .layers
        .iter()
        .filter(|layer| layer.kind != LayerKind::BatchNorm)
        .map(|layer| layer.cost.params)
        .sum()
}

/// Asserts `ours` is within `tolerance` (relative) of `published`, and prints both.
fn close(what: &str, ours: f64, published: f64, tolerance: f64) {
    let error = ours / published - 1.0;
    println!("{what:<58} ours {ours:>20.0}  published {published:>20.0}  {:+.4}%", 100.0 * error);
    assert!(
        error.abs() <= tolerance,
        "{what}: ours {ours} vs published {published} ({:+.4}%)",
        100.0 * error
    );
}

#[test]
fn cnn_parameter_and_mac_counts() {
    // torchvision's model documentation (parameters exact, "GFLOPS" = GMACs at 224x224).
    close("resnet50 parameters (torchvision)", model("resnet50").parameters() as f64, 25_557_032.0, 0.0);
    close("resnet50 MACs (torchvision 4.09 G)", model("resnet50").macs_per_sample(), 4.09e9, 0.002);
    close("vgg16 parameters (torchvision)", model("vgg16").parameters() as f64, 138_357_544.0, 0.0);
    close("vgg16 MACs (torchvision 15.47 G)", model("vgg16").macs_per_sample(), 15.47e9, 0.002);
    close("alexnet parameters (torchvision)", model("alexnet").parameters() as f64, 61_100_840.0, 0.0);
    close("alexnet MACs (torchvision 0.71 G)", model("alexnet").macs_per_sample(), 0.71e9, 0.01);
    close(
        "inception-v3 parameters (torchvision, with AuxLogits)",
        model("inception-v3").parameters() as f64,
        27_161_264.0,
        0.0,
    );
    close("inception-v3 MACs (torchvision 5.71 G)", model("inception-v3").macs_per_sample(), 5.71e9, 0.005);
    // He et al. 2016, Table 2; the paper's counts leave out batch norm (ours with it: 10.33 M).
    close(
        "resnet1001 parameters without BN (paper 10.2 M)",
        without_batch_norm(&model("resnet1001")) as f64,
        10.2e6,
        0.005,
    );
    close(
        "resnet164 parameters without BN (paper 1.7 M)",
        without_batch_norm(&model("resnet164")) as f64,
        1.7e6,
        0.013,
    );
    // Çiçek et al. 2016, section 2: 19,069,955, without batch norm.
    close(
        "unet3d parameters without BN (paper 19,069,955)",
        without_batch_norm(&model("unet3d")) as f64,
        19_069_955.0,
        0.0,
    );
}

#[test]
fn bert_counts() {
    // Hugging Face BertForPreTraining (embeddings, encoder, pooler, MLM head with its own
    // decoder bias tied to the word embeddings, NSP head): bert-large-uncased 336,226,108,
    // bert-base-uncased 110,106,428. The paper's rounded figures: 340 M and 110 M.
    let large = model("bert-large");
    close(
        "bert-large with pre-training heads (HF BertForPreTraining)",
        large.parameters() as f64,
        336_226_108.0,
        0.0,
    );
    let heads: u64 = large
        .layers
        .iter()
        .filter(|layer| layer.name.starts_with("mlm.") || layer.name.starts_with("nsp."))
        .map(|layer| layer.cost.params)
        .sum();
    close(
        "bert-large embeddings + encoder + pooler (HF BertModel)",
        (large.parameters() - heads) as f64,
        335_141_888.0,
        0.0,
    );
    close("bert-large vs the paper's 340 M", large.parameters() as f64, 340e6, 0.015);
    close(
        "bert-base with pre-training heads (HF BertForPreTraining)",
        model("bert-base").parameters() as f64,
        110_106_428.0,
        0.0,
    );
}

#[test]
fn megatron_table_1_parameter_counts() {
    // Narayanan et al. 2021, Table 1 (../shared/data/published-measurements.md section 1.1):
    // (zoo name, parameters in billions as printed, layers, hidden), V = 51,200, s = 2048.
    let rows = [
        ("megatron-1.7b", 1.7, 24, 2304),
        ("megatron-3.6b", 3.6, 30, 3072),
        ("megatron-7.5b", 7.5, 36, 4096),
        ("megatron-18.4b", 18.4, 40, 6144),
        ("megatron-39.1b", 39.1, 48, 8192),
        ("megatron-76.1b", 76.1, 60, 10240),
        ("megatron-145.6b", 145.6, 80, 12288),
        ("megatron-310.1b", 310.1, 96, 16384),
        ("megatron-529.6b", 529.6, 105, 20480),
        ("megatron-1t", 1008.0, 128, 25600),
    ];
    for (name, billions, layers, hidden) in rows {
        let ours = model(name).parameters() as f64;
        // Eq. 2; ours adds the final layer norm's 2h, which the formula leaves out.
        let formula = megatron_parameters(layers, hidden, 51_200, 2048);
        close(&format!("{name} vs Megatron Eq. 2"), ours, formula, 0.001);
        // Expanded in integers: 12 l h^2 + 13 l h + (V + s) h.
        let expanded = 12 * layers * hidden * hidden + 13 * layers * hidden + (51_200 + 2048) * hidden;
        assert_eq!(
            model(name).parameters(),
            expanded + 2 * hidden,
            "{name}: only the final layer norm differs"
        );
        assert_eq!(
            (ours / 1e8).round() / 10.0,
            billions,
            "{name}: {ours} does not round to Table 1's {billions} B"
        );
    }
    // Table 2's GPT-3: 174.6 B (with GPT-3's 50,257-token vocabulary it is 174.60 B too).
    let gpt3 = model("gpt3-175b").parameters() as f64;
    close("gpt3-175b vs Megatron Table 2 (174.6 B)", gpt3, 174.6e9, 0.001);
    close(
        "gpt3-175b vs Megatron Eq. 2 with V = 50,257",
        gpt3,
        megatron_parameters(96, 12288, 50_257, 2048),
        0.001,
    );
}

#[test]
fn megatron_training_flops_match_eq_3_without_recomputation() {
    // Eq. 3 counts 4 forwards per iteration (full recomputation); ours is 1 forward + 2 backward
    // passes, i.e. 72 B s l h^2 (1 + s / (6h) + V / (12 l h)). Ours also counts element-wise
    // work (softmax, norms, GELU, ...): 0.17% more for the 1.7 B model, 0.03% for GPT-3.
    for (name, layers, hidden) in
        [("megatron-1.7b", 24.0, 2304.0), ("gpt3-175b", 96.0, 12288.0), ("megatron-1t", 128.0, 25600.0)]
    {
        let model = model(name);
        let vocabulary = model.layer("logits").map(|layer| layer.output.0[1]).unwrap() as f64;
        let s = 2048.0;
        let formula = 72.0
            * s
            * layers
            * hidden
            * hidden
            * (1.0 + s / (6.0 * hidden) + vocabulary / (12.0 * layers * hidden));
        close(
            &format!("{name} training FLOPs per sample vs Eq. 3 / 4 x 3"),
            model.training_flops_per_sample(),
            formula,
            0.005,
        );
        assert!(model.training_flops_per_sample() > formula);
    }
}

#[test]
fn llama_and_mixtral_counts() {
    // Hugging Face checkpoints' parameter counts (meta-llama/*, mistralai/Mixtral-8x7B-v0.1).
    for (name, published) in [
        ("llama2-7b", 6_738_415_616.0),
        ("llama2-13b", 13_015_864_320.0),
        ("llama2-70b", 68_976_648_192.0),
        ("llama3-8b", 8_030_261_248.0),
        ("llama3-70b", 70_553_706_496.0),
        ("mixtral-8x7b", 46_702_792_704.0),
    ] {
        close(&format!("{name} parameters"), model(name).parameters() as f64, published, 0.0);
    }
    // The papers' rounded figures: 6.74 B (Llama 2 model card: "7B"), 46.7 B and 12.9 B active.
    close("llama2-7b vs 6.74 B", model("llama2-7b").parameters() as f64, 6.74e9, 0.001);
    let mixtral = model("mixtral-8x7b");
    close("mixtral-8x7b vs 46.7 B", mixtral.parameters() as f64, 46.7e9, 0.001);
    let experts: u64 = mixtral
        .layers
        .iter()
        .filter(|layer| layer.kind.name() == "moe-experts")
        .map(|layer| layer.cost.params)
        .sum();
    let active = mixtral.parameters() - experts + experts / 4;
    close("mixtral-8x7b active parameters (top-2 of 8) vs 12.9 B", active as f64, 12.9e9, 0.002);
}
