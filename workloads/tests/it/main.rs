//! Invariants of the public API across every zoo model, device and dtype; the model file
//! format; cross-checks against published totals and ParaDL's layer tables; build timings.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod aten;
mod deepbench;
mod korthikanti;
mod memory;
mod model_files;
mod paradl;
mod published;

use workloads::compute::knobs::KnobValue;
use workloads::{ComputeModel, DeviceCatalog, Pass, family, zoo};

/// More samples never take less time, and every layer of every model has a duration on every
/// device for every dtype the device lists.
#[test]
fn layer_durations_exist_and_grow_with_the_batch() {
    let compute = ComputeModel::default();
    for name in zoo::NAMES {
        let model = zoo::by_name(name).unwrap();
        for device in DeviceCatalog::builtin().devices() {
            for &dtype in device.peak.keys() {
                for layer in &model.layers {
                    for pass in Pass::ALL {
                        let small = compute.layer_duration(device, dtype, layer, pass, 1).unwrap();
                        let large = compute.layer_duration(device, dtype, layer, pass, 128).unwrap();
                        assert!(small <= large, "{name} {} {} {dtype} {pass:?}", layer.name, device.name);
                        assert!(small >= compute.launch_overhead);
                    }
                }
            }
        }
    }
}

/// A newer GPU is never slower on the same kernel in the same dtype.
#[test]
fn h100_is_never_slower_than_a100() {
    let catalog = DeviceCatalog::builtin();
    let (a100, h100) = (catalog.get("a100-sxm4-80gb").unwrap(), catalog.get("h100-sxm5-80gb").unwrap());
    let compute = ComputeModel::default();
    let model = family::resnet50();
    for &dtype in a100.peak.keys() {
        for layer in &model.layers {
            for pass in Pass::ALL {
                let old = compute.layer_duration(a100, dtype, layer, pass, 64).unwrap();
                let new = compute.layer_duration(h100, dtype, layer, pass, 64).unwrap();
                assert!(new <= old, "{} {pass:?} {dtype}: {new} > {old}", layer.name);
            }
        }
    }
}

/// Every layer's input shape is the model input's or an earlier layer's output: the flattened
/// execution order never reads a tensor before something produced one of that shape.
#[test]
fn every_layer_input_was_produced_earlier() {
    for name in zoo::NAMES {
        let model = zoo::by_name(name).unwrap();
        for (index, layer) in model.layers.iter().enumerate() {
            let produced = std::iter::once(&model.input)
                .chain(model.layers[..index].iter().map(|earlier| &earlier.output))
                .any(|shape| *shape == layer.input);
            assert!(produced, "{name}: {} reads {} that nothing produced", layer.name, layer.input);
        }
    }
}

/// Every zoo model's layers have sane costs: finite, non-negative FLOPs, and weights only where
/// there are parameters or tied weights.
#[test]
fn every_zoo_layer_has_a_sane_cost() {
    for name in zoo::NAMES {
        let model = zoo::by_name(name).unwrap();
        assert!(model.parameters() > 0 && model.forward_flops_per_sample() > 0.0, "{name}");
        for layer in &model.layers {
            for pass in Pass::ALL {
                let flops = layer.cost.flops(pass, 1);
                assert!(flops.is_finite() && flops >= 0.0, "{name} {} {pass:?}: {flops}", layer.name);
            }
            assert!(layer.cost.macs * 2.0 <= layer.cost.forward_flops, "{name} {}", layer.name);
            // Lookups read only the rows they gather (per sample); every other layer with
            // parameters reads all of them once per batch.
            let lookup = layer.kind.name().contains("embedding");
            if layer.cost.params > 0 && !lookup {
                assert!(
                    layer.cost.forward_traffic.per_batch >= layer.cost.params,
                    "{name} {} reads its weights",
                    layer.name
                );
            }
        }
    }
}

/// Products with feature dimensions off the 16-byte grid are the ones libraries run slowly:
/// the RGB input convolution, small classifier heads, unpadded vocabularies. Megatron's padded
/// vocabulary (51,200) is aligned.
#[test]
fn unaligned_products_are_the_odd_shaped_layers_and_pay_the_unaligned_factor() {
    use workloads::{Dtype, OpClass};
    let unaligned = |name: &str, dtype: Dtype| -> Vec<String> {
        let model = zoo::by_name(name).unwrap();
        model
            .layers
            .iter()
            .filter(|l| l.cost.class == OpClass::Gemm && !l.gemm_aligned(dtype))
            .map(|l| l.name.clone())
            .collect()
    };
    assert_eq!(unaligned("resnet50", Dtype::Fp16), ["conv1"]);
    assert_eq!(unaligned("resnet50", Dtype::Fp32), ["conv1"]);
    assert_eq!(unaligned("gpt3-175b", Dtype::Bf16), ["logits"]);
    assert!(unaligned("megatron-1.7b", Dtype::Fp16).is_empty());
    assert!(unaligned("llama2-7b", Dtype::Bf16).is_empty());

    let model = zoo::by_name("gpt3-175b").unwrap();
    let a100 = DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap();
    let default = ComputeModel::default();
    let penalized = ComputeModel { unaligned_gemm_efficiency: 0.5, ..ComputeModel::default() };
    let time = |compute: &ComputeModel, layer: &str| {
        let layer = model.layers.iter().find(|l| l.name == layer).unwrap();
        compute.layer_duration(a100, Dtype::Bf16, layer, Pass::Forward, 8).unwrap().as_secs_f64()
    };
    // The logits product is compute-bound: half the efficiency, twice the time (less the
    // fixed launch overhead and the tile waves' fixed overhead, which do not scale).
    let launch = default.launch_overhead.as_secs_f64();
    let ratio = (time(&penalized, "logits") - launch) / (time(&default, "logits") - launch);
    assert!(ratio > 1.95 && ratio <= 2.0 + 1e-9, "{ratio}");
    let aligned =
        model.layers.iter().find(|l| l.cost.class == OpClass::Gemm && l.gemm_aligned(Dtype::Bf16)).unwrap();
    assert_eq!(time(&penalized, &aligned.name), time(&default, &aligned.name));
}

/// docs/compute-model.md's table of parameters and defaults lists every knob of the compute
/// model with its default.
#[test]
fn the_compute_model_docs_list_every_knob_with_its_default() {
    let docs = include_str!("../../../docs/compute-model.md");
    for knob in workloads::compute::knobs::KNOBS {
        let default = match knob.get(&ComputeModel::default()) {
            KnobValue::Number(number) => format!("{number:?}"),
            KnobValue::Duration(duration) => format!("`\"{duration}\"`"),
            KnobValue::Switch(switch) => switch.to_string(),
        };
        let row = format!("| `{}` | {default} |", knob.key);
        assert!(docs.contains(&row), "docs/compute-model.md lacks the row {row}");
    }
}
