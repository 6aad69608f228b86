//! `parasim models` (the zoo) and `parasim inspect MODEL` (one model, layer by layer).

use std::fmt::Write;

use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use workloads::{Model, zoo};

/// One zoo model, for `parasim models --json`.
#[derive(Debug, Serialize)]
struct ZooEntryJson {
    name: String,
    family: String,
    parameters: u64,
    /// Forward pass, one sample.
    forward_flops_per_sample: f64,
    /// Per sample, e.g. `[3, 224, 224]`.
    input_shape: Vec<u64>,
    description: String,
}

/// One layer, for `parasim inspect --json`.
#[derive(Debug, Serialize)]
struct LayerJson {
    index: usize,
    name: String,
    kind: String,
    /// Per sample.
    output_shape: Vec<u64>,
    parameters: u64,
    /// Forward pass, for the batch.
    forward_flops: f64,
    /// Elements saved for the backward pass, for the batch.
    activation_elements: f64,
}

/// `parasim inspect --json`: the layers and the totals of the text report.
#[derive(Debug, Serialize)]
struct InspectJson {
    model: String,
    family: String,
    description: String,
    batch: u64,
    input_shape: Vec<u64>,
    output_shape: Vec<u64>,
    layers: Vec<LayerJson>,
    parameters: u64,
    forward_flops_per_sample: f64,
    forward_flops: f64,
    /// Forward + backward-data + backward-weight, for the batch.
    training_flops: f64,
    macs_per_sample: f64,
    activation_elements: f64,
    /// The activations in fp16 (a sum over layers, so an upper bound).
    activation_bytes_fp16: f64,
}

/// The zoo as a table: name, family, parameters, forward GFLOPs per sample, input shape and
/// description, one model per line, in catalog order.
pub fn list(json: bool) -> anyhow::Result<String> {
    let mut rows = Vec::with_capacity(zoo::NAMES.len());
    let mut entries = Vec::with_capacity(zoo::NAMES.len());
    for name in zoo::NAMES {
        let model = zoo::by_name(name).with_context(|| format!("building zoo model {name}"))?;
        entries.push(ZooEntryJson {
            name: model.name.clone(),
            family: model.family.clone(),
            parameters: model.parameters(),
            forward_flops_per_sample: model.forward_flops_per_sample(),
            input_shape: model.input.0.clone(),
            description: model.description.clone(),
        });
        rows.push([
            model.name.clone(),
            model.family.clone(),
            si(model.parameters() as f64),
            gflops(model.forward_flops_per_sample() / 1e9),
            model.input.to_string(),
            model.description.clone(),
        ]);
    }
    if json {
        return Ok(serde_json::to_string_pretty(&entries).context("writing JSON")? + "\n");
    }
    let mut out =
        table(&["model", "family", "parameters", "GFLOP/sample", "input", "description"], &rows, &[2, 3]);
    writeln!(
        out,
        "\nGFLOP/sample: forward pass, one sample, matrix products and element-wise work (backward costs about 2x more).\n\
         `parasim inspect MODEL` shows one model layer by layer; MODEL may also be the path of a model file (docs/models.md)."
    )?;
    Ok(out)
}

/// One model layer by layer: name, kind, output shape, parameters, forward FLOPs and saved
/// activations for `batch` samples, then totals.
pub fn inspect(model: &str, batch: u64, json: bool) -> anyhow::Result<String> {
    anyhow::ensure!(batch > 0, "--batch must be at least 1");
    let model = load(model, Path::new("."))?;
    if json {
        return Ok(serde_json::to_string_pretty(&inspect_json(&model, batch)).context("writing JSON")? + "\n");
    }
    Ok(render(&model, batch))
}

fn inspect_json(model: &Model, batch: u64) -> InspectJson {
    let b = batch as f64;
    let layers = model
        .layers
        .iter()
        .enumerate()
        .map(|(index, layer)| LayerJson {
            index,
            name: layer.name.clone(),
            kind: layer.kind.name().to_string(),
            output_shape: layer.output.0.clone(),
            parameters: layer.cost.params,
            forward_flops: layer.cost.forward_flops * b,
            activation_elements: layer.cost.activation_elements as f64 * b,
        })
        .collect();
    let activations = model.activation_elements_per_sample() as f64 * b;
    InspectJson {
        model: model.name.clone(),
        family: model.family.clone(),
        description: model.description.clone(),
        batch,
        input_shape: model.input.0.clone(),
        output_shape: model.output().0.clone(),
        layers,
        parameters: model.parameters(),
        forward_flops_per_sample: model.forward_flops_per_sample(),
        forward_flops: model.forward_flops_per_sample() * b,
        training_flops: model.training_flops_per_sample() * b,
        macs_per_sample: model.macs_per_sample(),
        activation_elements: activations,
        activation_bytes_fp16: 2.0 * activations,
    }
}

/// A zoo model by name, or a model file by path relative to `base`
/// (see [`scenario::load_model`]).
pub fn load(model: &str, base: &Path) -> anyhow::Result<Model> {
    scenario::load_model(model, base).map_err(anyhow::Error::msg)
}

fn render(model: &Model, batch: u64) -> String {
    let b = batch as f64;
    let rows: Vec<[String; 7]> = model
        .layers
        .iter()
        .enumerate()
        .map(|(index, layer)| {
            [
                index.to_string(),
                layer.name.clone(),
                layer.kind.name().to_string(),
                layer.output.to_string(),
                if layer.cost.params == 0 { "-".to_string() } else { si(layer.cost.params as f64) },
                si(layer.cost.forward_flops * b),
                si(layer.cost.activation_elements as f64 * b),
            ]
        })
        .collect();
    let mut out = String::new();
    let _ = writeln!(out, "model         {} ({})", model.name, model.family);
    if !model.description.is_empty() {
        let _ = writeln!(out, "              {}", model.description);
    }
    let _ = writeln!(
        out,
        "input         {} per sample, batch {batch} (fwd FLOP and activations, the elements kept for the backward, are per batch)",
        model.input
    );
    let _ = writeln!(out, "output        {} per sample\n", model.output());
    out.push_str(&table(
        &["#", "layer", "kind", "output", "params", "fwd FLOP", "activations"],
        &rows,
        &[0, 4, 5, 6],
    ));
    let forward = model.forward_flops_per_sample();
    let training = model.training_flops_per_sample();
    let _ = writeln!(out);
    let _ = writeln!(out, "layers        {}", model.layers.len());
    let _ = writeln!(
        out,
        "parameters    {} ({})",
        grouped(model.parameters() as f64),
        si(model.parameters() as f64)
    );
    let _ = writeln!(
        out,
        "forward       {}FLOP for the batch ({}FLOP per sample; {}MAC per sample in matrix products)",
        si_unit(forward * b),
        si_unit(forward),
        si_unit(model.macs_per_sample())
    );
    let _ = writeln!(
        out,
        "training      {}FLOP for the batch (forward + backward-data + backward-weight, {:.2}x forward)",
        si_unit(training * b),
        if forward > 0.0 { training / forward } else { 0.0 }
    );
    let activations = model.activation_elements_per_sample() as f64 * b;
    let _ = writeln!(
        out,
        "activations   {} elements saved for backward ({}B in fp16; a sum over layers, so an upper bound)",
        si_unit(activations).trim_end(),
        si_unit(2.0 * activations)
    );
    out
}

/// Left-aligned columns, except the right-aligned ones listed in `right`.
pub(crate) fn table<const N: usize>(header: &[&str; N], rows: &[[String; N]], right: &[usize]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (column, cell) in cells.enumerate() {
            let pad = widths[column].saturating_sub(cell.chars().count());
            if column > 0 {
                text.push_str("  ");
            }
            if right.contains(&column) {
                text.extend(std::iter::repeat_n(' ', pad));
                text.push_str(cell);
            } else {
                text.push_str(cell);
                if column + 1 < N {
                    text.extend(std::iter::repeat_n(' ', pad));
                }
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// `25.56 M`, `174.60 B`, `512`: a count with a decimal prefix (K, M, B for thousand, million,
/// billion, T for trillion).
pub fn si(value: f64) -> String {
    for (scale, suffix) in [(1e15, "P"), (1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")] {
        if value.abs() >= scale {
            return format!("{:.2} {suffix}", value / scale);
        }
    }
    format!("{value:.0}")
}

/// `4.09 G` with SI prefixes for units (`GFLOP`, `TB`); a prefix-less value ends with a space,
/// so that a unit can follow directly.
pub fn si_unit(value: f64) -> String {
    for (scale, prefix) in [(1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")] {
        if value.abs() >= scale {
            return format!("{:.2} {prefix}", value / scale);
        }
    }
    format!("{value:.0} ")
}

/// GFLOPs for the zoo table: thousands separators from 1,000, two decimals from 1, three
/// significant digits below.
fn gflops(value: f64) -> String {
    if value >= 1000.0 {
        grouped(value)
    } else if value >= 1.0 {
        format!("{value:.2}")
    } else if value >= 0.001 {
        // Three significant digits: 0.516, 0.00492.
        let decimals = (2.0 - value.log10().floor()) as usize;
        format!("{value:.decimals$}")
    } else {
        format!("{value:.2e}")
    }
}

/// `1,234,567`: rounded, with thousands separators.
fn grouped(value: f64) -> String {
    let digits = sim_core::units::thousands(value.abs().round() as u64);
    if value < 0.0 { format!("-{digits}") } else { digits }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(si(25_557_032.0), "25.56 M");
        assert_eq!(si(174_604_259_328.0), "174.60 B");
        assert_eq!(si(512.0), "512");
        assert_eq!(si_unit(4.089e9), "4.09 G");
        assert_eq!(si_unit(12.0), "12 ");
        assert_eq!(grouped(1_234_567.4), "1,234,567");
        assert_eq!(grouped(123.0), "123");
        assert_eq!(gflops(3.6412), "3.64");
        assert_eq!(gflops(0.516), "0.516");
        assert_eq!(gflops(0.00492), "0.00492");
        assert_eq!(gflops(0.000_012_3), "1.23e-5");
        assert_eq!(gflops(735_146.2), "735,146");
    }

    #[test]
    fn the_zoo_lists_every_model() {
        let text = list(false).unwrap();
        for name in zoo::NAMES {
            assert!(
                text.lines().any(|line| line.starts_with(&format!("{name} "))),
                "{name} missing:\n{text}"
            );
        }
        let resnet50 = text.lines().find(|line| line.starts_with("resnet50 ")).unwrap_or_default();
        assert!(resnet50.contains("25.56 M") && resnet50.contains("3x224x224"), "{resnet50}");
    }

    #[test]
    fn every_zoo_model_can_be_inspected() {
        for name in zoo::NAMES {
            let text = inspect(name, 2, false).unwrap();
            let model = zoo::by_name(name).unwrap();
            // Models serialize (for a future `--json`).
            assert!(serde_json::to_string(&model).is_ok(), "{name}");
            let last = model.layers.last().map(|layer| layer.name.as_str()).unwrap_or_default();
            assert!(text.contains(last) && text.contains("parameters"), "{name}");
        }
    }

    #[test]
    fn inspect_prints_every_layer_and_the_totals() {
        let text = inspect("resnet50", 32, false).unwrap();
        assert!(text.contains("layer4.2.relu3") && text.contains("2048x7x7"), "{text}");
        assert!(text.contains("parameters    25,557,032"), "{text}");
        assert!(text.contains("batch 32"), "{text}");
        assert!(inspect("resnet50", 0, false).is_err());
        let error = format!("{:#}", inspect("resnet51", 1, false).unwrap_err());
        assert!(error.contains("known models"), "{error}");
    }
}
