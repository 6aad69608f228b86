//! LoRA fine-tuning (Hu et al. 2021, arXiv 2106.09685): the base model frozen, a low-rank
//! adapter trained beside each targeted linear layer.
//!
//! [`apply`] rewrites a model as the framework runs it: every layer with parameters frozen
//! ([`Layer::freeze`]: no weight gradient, no optimizer state, no gradient reduction, its
//! weights still in memory), an adapter ([`LayerKind::LoraAdapter`]) after each targeted
//! linear layer, and the layers below the first adapter inert (autograd never reaches them:
//! no backward at all). The strategies then run it unchanged: gradient buckets, the optimizer
//! step and its memory see the adapters' parameters alone.

use crate::layer::{Layer, LayerKind};
use crate::model::Model;
use serde::Serialize;

/// Which layers get adapters, and their rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lora {
    /// The adapters' rank (NeMo's `adapter_dim`, Hugging Face PEFT's `r`).
    pub rank: u64,
    /// The linear layers adapted, by the end of their names after the block's number
    /// (`attention.qkv` adapts `layers.0.attention.qkv`, `layers.1.attention.qkv`, ...), or
    /// [`ALL_LINEAR`] for every linear layer inside the blocks.
    pub targets: Vec<String>,
}

/// LoRA cannot be applied as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoraError {
    /// The rank is out of range.
    #[error("is 0; give the adapters' rank, at least 1 (NeMo's adapter_dim, Hugging Face PEFT's r)")]
    Rank,
    /// An adapter of this rank cannot be built beside a target (its sizes overflow).
    #[error("an adapter beside {layer}: {error}")]
    Adapter {
        /// The adapted layer.
        layer: String,
        /// Why.
        error: crate::layer::LayerError,
    },
    /// No target is named.
    #[error("name at least one linear layer to adapt (e.g. [\"attention.qkv\"])")]
    NoTargets,
    /// A target names no linear layer of the model.
    #[error(
        "{target:?} names no linear layer of {model}; its linear layers end in: {available} (a block's query, \
         key and value projections are one fused layer, attention.qkv, as Megatron-LM and NeMo run them)"
    )]
    NoTarget {
        /// The target.
        target: String,
        /// The model.
        model: String,
        /// The distinct name endings of the model's linear layers, comma-separated.
        available: String,
    },
}

impl LoraError {
    /// The scenario key at fault.
    pub fn key(&self) -> &'static str {
        match self {
            LoraError::Rank | LoraError::Adapter { .. } => "workload.lora.rank",
            LoraError::NoTargets | LoraError::NoTarget { .. } => "workload.lora.targets",
        }
    }
}

/// The target that adapts every linear layer inside the model's blocks (Hugging Face PEFT's
/// `target_modules="all-linear"`, which leaves out the output layer too).
pub const ALL_LINEAR: &str = "all-linear";

/// Whether `target` names `layer` (a linear layer).
fn names(target: &str, layer: &Layer) -> bool {
    if target == ALL_LINEAR {
        crate::model::structure::block_of(&layer.name).is_some()
    } else {
        suffix(&layer.name) == target
    }
}

/// A layer's name after its block's number (`layers.3.attention.qkv` -> `attention.qkv`), or
/// the whole name outside blocks (`output`).
fn suffix(name: &str) -> &str {
    match crate::model::structure::block_of(name) {
        Some(block) => name.get(block.len()..).map_or(name, |rest| rest.trim_start_matches('.')),
        None => name,
    }
}

/// `model` as LoRA trains it: see the module's documentation. Layers keep their order; each
/// adapter is named after its layer (`layers.0.attention.qkv.lora`) and follows it.
pub fn apply(model: &Model, lora: &Lora) -> Result<Model, LoraError> {
    if lora.rank == 0 {
        return Err(LoraError::Rank);
    }
    if lora.targets.is_empty() {
        return Err(LoraError::NoTargets);
    }
    let linear = |layer: &Layer| matches!(layer.kind, LayerKind::Linear { .. });
    for target in &lora.targets {
        if !model.layers.iter().any(|layer| linear(layer) && names(target, layer)) {
            let mut available: Vec<&str> =
                model.layers.iter().filter(|layer| linear(layer)).map(|layer| suffix(&layer.name)).collect();
            available.sort_unstable();
            available.dedup();
            return Err(LoraError::NoTarget {
                target: target.clone(),
                model: model.name.clone(),
                available: if available.is_empty() {
                    "(none)".into()
                } else {
                    format!("{}, or \"{ALL_LINEAR}\" for every one inside the blocks", available.join(", "))
                },
            });
        }
    }
    let adapted = |layer: &Layer| match layer.kind {
        LayerKind::Linear { out_features, .. } if lora.targets.iter().any(|target| names(target, layer)) => {
            Some(out_features)
        }
        _ => None,
    };
    let mut layers = Vec::with_capacity(model.layers.len() * 2);
    let mut trained = false;
    for layer in &model.layers {
        let adapter = adapted(layer);
        let mut frozen = layer.clone();
        if !trained && adapter.is_none() {
            // Below the first adapter nothing needs a gradient: autograd stops there.
            frozen.freeze(true);
        } else if layer.cost.params > 0 || layer.cost.backward_weight_flops > 0.0 {
            // A layer with weights (or a weight gradient to add to a tied owner) is frozen;
            // the others (attention cores, norms' and activations' element-wise work) run as
            // before.
            frozen.freeze(false);
        }
        layers.push(frozen);
        if let Some(out_features) = adapter {
            trained = true;
            let kind = LayerKind::LoraAdapter { rank: lora.rank, out_features };
            let adapter = Layer::new(format!("{}.lora", layer.name), kind, layer.input.clone())
                .map_err(|error| LoraError::Adapter { layer: layer.name.clone(), error })?;
            layers.push(adapter);
        }
    }
    let mut tuned = Model::from_layers(
        format!("{} (LoRA rank {})", model.name, lora.rank),
        model.family.clone(),
        model.input.clone(),
        layers,
    );
    tuned.description = model.description.clone();
    Ok(tuned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::{Pass, Training};
    use crate::zoo;

    fn qkv(rank: u64) -> Lora {
        Lora { rank, targets: vec!["attention.qkv".into()] }
    }

    #[test]
    fn llama2_7b_qkv_adapters_have_nemos_trainable_count() {
        // 32 layers x rank 32 x (4096 in + 3 x 4096 out) = 16,777,216 trained parameters.
        let model = zoo::by_name("llama2-7b").unwrap();
        let tuned = apply(&model, &qkv(32)).unwrap();
        assert_eq!(tuned.parameters(), 32 * 32 * (4096 + 3 * 4096));
        assert_eq!(tuned.frozen_parameters(), model.parameters());
        assert_eq!(tuned.layers.len(), model.layers.len() + 32);
        let adapter = tuned.layers.iter().find(|l| l.name == "layers.0.attention.qkv.lora").unwrap();
        assert_eq!(
            adapter.output,
            tuned.layers.iter().find(|l| l.name == "layers.0.attention.qkv").unwrap().output
        );
    }

    #[test]
    fn frozen_layers_lose_their_weight_gradients_and_those_below_the_first_adapter_their_backward() {
        let model = zoo::by_name("llama2-7b").unwrap();
        let tuned = apply(&model, &qkv(8)).unwrap();
        let by_name = |name: &str| tuned.layers.iter().find(|l| l.name == name).unwrap();
        let embedding = by_name(&model.layers[0].name);
        assert!(
            embedding.cost.training == Training::Inert
                && embedding.frozen_weights() == model.layers[0].cost.params
        );
        assert!(embedding.kernels(Pass::BackwardData).is_empty());
        assert_eq!(embedding.cost.activation_elements, 0);
        let down = by_name("layers.0.mlp.down");
        assert_eq!(down.cost.training, Training::Frozen);
        assert_eq!(down.cost.params, 0);
        assert!(down.kernels(Pass::BackwardWeight).is_empty());
        assert!(!down.kernels(Pass::BackwardData).is_empty());
        let original = model.layers.iter().find(|l| l.name == "layers.0.mlp.down").unwrap();
        assert_eq!(down.cost.backward_data_flops, original.cost.backward_data_flops);
        // The attention core has no weights: it runs its whole backward.
        assert!(!by_name("layers.0.attention.core").kernels(Pass::BackwardData).is_empty());
    }

    #[test]
    fn all_linear_adapts_every_projection_of_every_block_but_not_the_output_layer() {
        let model = zoo::by_name("llama2-7b").unwrap();
        let tuned = apply(&model, &Lora { rank: 8, targets: vec![ALL_LINEAR.into()] }).unwrap();
        // qkv 4096 -> 12288, proj 4096 -> 4096, gate-up 4096 -> 22016, down 11008 -> 4096.
        let per_block = 8 * ((4096 + 12288) + (4096 + 4096) + (4096 + 22016) + (11008 + 4096));
        assert_eq!(tuned.parameters(), 32 * per_block);
        assert!(!tuned.layers.iter().any(|l| l.name == "logits.lora"));
    }

    #[test]
    fn a_target_that_names_nothing_is_refused_with_the_models_linear_layers() {
        let model = zoo::by_name("llama2-7b").unwrap();
        let error = apply(&model, &Lora { rank: 16, targets: vec!["attention_qkv".into()] }).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("attention.qkv") && message.contains("mlp.down"), "{message}");
        assert!(apply(&model, &qkv(0)).is_err());
        assert!(apply(&model, &Lora { rank: 16, targets: Vec::new() }).is_err());
    }
}
