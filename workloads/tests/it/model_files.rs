//! The model file format: layer-by-layer files with branches, family files, the examples in
//! `docs/models.md`, and errors that name the file, the line and the key.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use workloads::{LayerKind, LossKernels, Model, ModelError, Shape, zoo};

fn parse(text: &str) -> Result<Model, ModelError> {
    Model::from_toml_str(text, "models/test-model.toml")
}

/// The error `text` gives, checking it names the file and every one of `needles`.
fn rejected(text: &str, needles: &[&str]) -> String {
    let error = match parse(text) {
        Ok(model) => panic!("expected an error, got a model of {} layers", model.layers.len()),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("models/test-model.toml"), "the error names the file: {error}");
    for needle in needles {
        assert!(error.contains(needle), "missing {needle:?} in: {error}");
    }
    error
}

const RESIDUAL: &str = r#"
[model]
name = "tiny-resnet"
family = "resnet"
description = "two convolutions and a shortcut"
input = [3, 32, 32]

[[layers]]
name = "stem"
kind = "conv2d"
out-channels = 16
kernel = 3
padding = 1
bias = false

[[layers]]
name = "conv"
kind = "conv2d"
out-channels = 16
kernel = [3, 3]
padding = "same"

[[layers]]
name = "add"
kind = "add"
with = "stem"

[[layers]]
name = "branch"
kind = "conv2d"
input = "stem"
out-channels = 8
kernel = 1

[[layers]]
name = "concat"
kind = "concat"
input = "add"
with = ["branch"]

[[layers]]
name = "pool"
kind = "global-avgpool"

[[layers]]
name = "fc"
kind = "linear"
out-features = 10
"#;

#[test]
fn layer_by_layer_files_with_branches() {
    let model = parse(RESIDUAL).unwrap();
    assert_eq!((model.name.as_str(), model.family.as_str()), ("tiny-resnet", "resnet"));
    assert_eq!(model.description, "two convolutions and a shortcut");
    let output = |name: &str| model.layer(name).map(|layer| layer.output.clone()).unwrap();
    assert_eq!(output("add"), Shape::from([16, 32, 32]));
    assert_eq!(output("branch"), Shape::from([8, 32, 32]));
    assert_eq!(output("concat"), Shape::from([24, 32, 32]));
    assert_eq!(model.output(), &Shape::from([10]));
    let params = 3 * 16 * 9 + (16 * 16 * 9 + 16) + (16 * 8 + 8) + (24 * 10 + 10);
    assert_eq!(model.parameters(), params);
}

#[test]
fn transformer_layers_with_tied_weights() {
    let text = r#"
[model]
input = [128]

[[layers]]
name = "embedding"
kind = "embedding"
vocabulary = 1000
dim = 64

[[layers]]
name = "positions"
kind = "position-embedding"
positions = 128

[[layers]]
name = "qkv"
kind = "linear"
out-features = 192

[[layers]]
name = "rope"
kind = "rope"
heads = 4

[[layers]]
name = "attention"
kind = "attention"
heads = 4
causal = true
implementation = "flash"

[[layers]]
name = "logits"
kind = "linear"
out-features = 1000
bias = false
tied-to = "embedding"

[[layers]]
name = "loss"
kind = "cross-entropy"
"#;
    let model = parse(text).unwrap();
    assert_eq!(model.name, "test-model", "the name defaults to the file's stem");
    assert_eq!(model.family, "custom");
    assert_eq!(model.parameters(), 1000 * 64 + 128 * 64 + 64 * 192 + 192);
    let logits = model.layer("logits").unwrap();
    assert_eq!(
        logits.kind,
        LayerKind::TiedLinear { out_features: 1000, bias: false, tied_to: "embedding".to_string() }
    );
    assert_eq!(logits.cost.params, 0);
    // The loss is one fused kernel unless the file says it runs as Megatron-LM's.
    let kernels = |model: &Model| model.layer("loss").unwrap().kind.clone();
    assert_eq!(kernels(&model), LayerKind::CrossEntropy { kernels: LossKernels::Fused });
    let megatron =
        parse(&text.replace("kind = \"cross-entropy\"", "kind = \"cross-entropy\"\nkernels = \"megatron\""));
    assert_eq!(kernels(&megatron.unwrap()), LayerKind::CrossEntropy { kernels: LossKernels::Megatron });
    rejected(
        &text.replace("kind = \"cross-entropy\"", "kind = \"cross-entropy\"\nkernels = \"fp32\""),
        &["kernels", "\"megatron\""],
    );
}

#[test]
fn family_files_take_their_parameters() {
    let model =
        parse("[gpt]\nlayers = 2\nhidden = 256\nheads = 4\nsequence = 128\nvocabulary = 1000\n").unwrap();
    assert_eq!(model.family, "gpt");
    assert_eq!(model.input, Shape::from([128]));
    assert_eq!(model.parameters(), 12 * 2 * 256 * 256 + 13 * 2 * 256 + (1000 + 128) * 256 + 2 * 256);
    let model = parse("[resnet]\ndepth = 18\nimage-size = 32\nclasses = 10\n").unwrap();
    assert_eq!(model.output(), &Shape::from([10]));
    let model = parse("[vgg]\ndepth = 11\nbatch-norm = true\n").unwrap();
    assert!(model.layers.iter().any(|layer| layer.kind == LayerKind::BatchNorm));
}

#[test]
fn format_errors_name_the_file_line_and_key() {
    // TOML's own errors carry the line and column.
    rejected("[gpt]\nlayers = 2\nhiden = 64\nheads = 2\n", &["line 3", "hiden", "hidden"]);
    rejected("[gpt]\nlayers = \"two\"\nhidden = 64\nheads = 2\n", &["line 2", "layers"]);
    rejected("[modle]\nname = \"x\"\n", &["modle", "model"]);
    // Sections.
    rejected("[model]\nname = \"x\"\n", &["no model", "[gpt]", "[[layers]]"]);
    rejected(
        "[gpt]\nlayers = 2\nhidden = 64\nheads = 2\n[llama]\nlayers = 2\nhidden = 64\nheads = 2\nffn-hidden = 1\nsequence = 1\nvocabulary = 1\n",
        &["[gpt] and [llama]"],
    );
    rejected(
        "[model]\nfamily = \"llama\"\n[gpt]\nlayers = 2\nhidden = 64\nheads = 2\n",
        &["model.family", "[gpt]"],
    );
    rejected("[model]\ninput = [3]\n[gpt]\nlayers = 2\nhidden = 64\nheads = 2\n", &["model.input"]);
    // Family parameters that do not fit: the section's line and the key.
    rejected("\n[gpt]\nlayers = 2\nhidden = 1000\nheads = 3\n", &["line 2", "gpt.heads", "1000"]);
    rejected("[resnet]\ndepth = 51\n", &["resnet.depth", "18, 34, 50, 101 or 152"]);
    // Layers.
    rejected("[[layers]]\nname = \"fc\"\nkind = \"linear\"\nout-features = 4\n", &["model.input", "missing"]);
    let layers = "[model]\ninput = [3, 8, 8]\n\n[[layers]]\nname = \"conv\"\nkind = \"conv2d\"\nout-channels = 4\nkernel = 3\n";
    rejected(
        &format!("{layers}oops = 1\n"),
        &["line 4", "layers[0].oops", "valid keys", "`out-channels`", "`stride`"],
    );
    // A misspelt required key is reported as unknown (with the valid keys), not as missing.
    let typo = "[model]\ninput = [3, 8, 8]\n[[layers]]\nname = \"conv\"\nkind = \"conv2d\"\nout-channel = 4\nkernel = 3\n";
    rejected(
        typo,
        &["layers[0].out-channel", "unknown key for a conv2d layer", "`out-channels`", "`dilation`"],
    );
    let missing = "[model]\ninput = [3, 8, 8]\n[[layers]]\nname = \"conv\"\nkind = \"conv2d\"\nkernel = 3\n";
    rejected(missing, &["layers[0].out-channels", "missing"]);
    rejected(
        "[model]\ninput = [3, 8, 8]\n[[layers]]\nname = \"sum\"\nkind = \"add\"\n",
        &["layers[0].with", "missing"],
    );
    rejected(&format!("{layers}stride = [1, 2, 3]\n"), &["layers[0].stride", "has 3 values", "list of 2"]);
    rejected(&format!("{layers}padding = \"full\"\n"), &["layers[0].padding", "\"same\""]);
    rejected(&format!("{layers}bias = 1\n"), &["layers[0].bias", "true or false"]);
    rejected(
        &format!("{layers}\n[[layers]]\nname = \"x\"\nkind = \"convolution\"\n"),
        &["line 10", "layers[1].kind", "conv2d", "attention"],
    );
    rejected(
        &format!("{layers}\n[[layers]]\nname = \"x\"\nkind = \"relu\"\ninput = \"nope\"\n"),
        &["line 10", "\"nope\"", "layer x"],
    );
    rejected(
        &format!("{layers}\n[[layers]]\nname = \"conv\"\nkind = \"relu\"\n"),
        &["\"conv\" is used twice"],
    );
    rejected(
        &format!("{layers}\n[[layers]]\nname = \"sum\"\nkind = \"add\"\nwith = \"input\"\n"),
        &["line 10", "layer sum", "4x6x6", "3x8x8"],
    );
    // A convolution on a 1-D tensor: the layer, what it got and what it expects.
    rejected(
        "[model]\ninput = [100]\n[[layers]]\nname = \"c\"\nkind = \"conv2d\"\nout-channels = 4\nkernel = 3\n",
        &["line 3", "layer c (conv2d)", "rank 1", "expected 3 ([channels, height, width])"],
    );
    // Declared input sizes that the layers before do not produce.
    rejected(
        &format!("{layers}in-channels = 4\n"),
        &["line 4", "layers[0].in-channels", "is 4", "3x8x8 has 3 channels"],
    );
    rejected(
        &format!(
            "{layers}\n[[layers]]\nname = \"fc\"\nkind = \"linear\"\nin-features = 256\nout-features = 2\n"
        ),
        &["layers[1].in-features", "is 256", "4x6x6 has 6 features"],
    );
    assert!(parse(&format!("{layers}in-channels = 3\n")).is_ok());
    // Mismatched channels for a grouped convolution.
    rejected(&format!("{layers}groups = 2\n"), &["layer conv", "2 groups do not divide the 3 input"]);
    // Attention heads that do not divide the width.
    rejected(
        "[model]\ninput = [16, 100]\n[[layers]]\nname = \"a\"\nkind = \"attention\"\nheads = 3\n",
        &["layer a (attention)", "100", "heads + 2 x kv_heads = 9"],
    );
    // A tie to a table of the wrong size.
    rejected(
        "[model]\ninput = [16]\n[[layers]]\nname = \"e\"\nkind = \"embedding\"\nvocabulary = 10\ndim = 8\n\
         [[layers]]\nname = \"out\"\nkind = \"linear\"\nout-features = 11\ntied-to = \"e\"\n",
        &["line 8", "out", "embedding of 11 rows of 8"],
    );
}

#[test]
fn a_file_s_name_defaults_to_its_stem() {
    let model = Model::from_toml_str(RESIDUAL, "models/residual-model.toml").unwrap();
    assert_eq!(model.name, "tiny-resnet");
}

/// Every TOML example in `docs/models.md` is a complete model file that loads.
#[test]
fn the_documented_examples_load() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/models.md");
    let text = fs_err::read_to_string(path).unwrap_or_else(|error| panic!("cannot read {path}: {error}"));
    let mut examples = 0;
    let mut rest = text.as_str();
    while let Some(start) = rest.find("```toml\n") {
        let block = &rest[start + 8..];
        let end = block.find("```").unwrap();
        let model = Model::from_toml_str(&block[..end], "docs/models.md")
            .unwrap_or_else(|error| panic!("example {} of docs/models.md: {error}", examples + 1));
        assert!(!model.layers.is_empty());
        examples += 1;
        rest = &block[end..];
    }
    assert!(examples >= 3, "docs/models.md has {examples} TOML examples");
}

/// The zoo's files are valid and each names itself as the catalog does.
#[test]
fn zoo_files_are_valid_model_files() {
    for name in zoo::NAMES {
        let text = zoo::source(name).unwrap();
        let model = Model::from_toml_str(text, &format!("{name}.toml")).unwrap();
        assert_eq!(model.name, name);
    }
}

/// Every kind the zoo uses has a name the layer-by-layer format accepts.
#[test]
fn every_kind_in_the_zoo_can_be_written_in_a_file() {
    for name in zoo::NAMES {
        for layer in &zoo::by_name(name).unwrap().layers {
            let kind = layer.kind.name();
            assert!(workloads::LAYER_KINDS.contains(&kind), "{name}: {} is a {kind}", layer.name);
        }
    }
}

/// A layer-by-layer file of 100,000 layers loads, and an error in its last layer names the
/// right line. Line numbers were once found by recounting newlines from the file's start for
/// every layer, which made this file take minutes (40,000 layers: 23 s); now they come from
/// one pass over the text.
#[test]
fn long_layer_files_load_in_linear_time_with_exact_lines() {
    let layers = 100_000;
    let mut text = String::from("[model]\ninput = [64]\n");
    for index in 0..layers {
        text += &format!("\n[[layers]]\nname = \"fc{index}\"\nkind = \"linear\"\nout-features = 64\n");
    }
    let model = parse(&text).unwrap();
    assert_eq!(model.layers.len(), layers);
    // The last layer starts at line 3 + 5 * (layers - 1) + 1.
    let last_line = 3 + 5 * (layers - 1) + 1;
    let broken = format!("{text}oops = 1\n");
    rejected(&broken, &[&format!("line {last_line}"), &format!("layers[{}].oops", layers - 1)]);
}

/// Sizes that would allocate until the machine gives up are refused up front, naming the key
/// and the limit.
#[test]
fn absurd_model_sizes_are_refused_before_they_are_built() {
    rejected("[gpt]\nlayers = 1000000000\nhidden = 64\nheads = 2\n", &["gpt.layers", "1000000000", "62500"]);
    rejected("[preact-resnet]\ndepth = 9000002\n", &["preact-resnet.depth", "333333"]);
    // A layer-by-layer file stops at the builder's limit.
    let mut text = String::from("[model]\ninput = [8]\n");
    for index in 0..=workloads::model::MAX_LAYERS {
        text += &format!("[[layers]]\nname = \"l{index}\"\nkind = \"relu\"\n");
    }
    rejected(&text, &["more than 1000000 layers"]);
}
