//! Models: layers in forward execution order, and a builder that propagates shapes through
//! them. Model files (TOML) are parsed by [`Model::from_toml_str`] (the caller reads the file)
//! (format in `docs/models.md`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::layer::{Layer, LayerError, LayerKind, Shape};

pub(crate) mod structure;

use structure::StructureCache;

/// A model could not be built, read or found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A layer's shape or parameters are invalid.
    #[error("model {model}: {error}")]
    Layer {
        /// The model being built.
        model: String,
        /// What is wrong with the layer.
        error: LayerError,
    },
    /// Two layers have the same name.
    #[error("model {model}: layer name {layer:?} is used twice; layer names must be unique")]
    DuplicateLayer {
        /// The model being built.
        model: String,
        /// The repeated name.
        layer: String,
    },
    /// A layer refers to a tensor that no earlier layer produced.
    #[error(
        "model {model}: layer {layer} reads {reference:?}, which is not an earlier layer; name a layer \
         defined above it, or \"input\" for the model's input"
    )]
    UnknownReference {
        /// The model being built.
        model: String,
        /// The layer that refers.
        layer: String,
        /// The name it refers to.
        reference: String,
    },
    /// A model-level parameter or a relation between layers is invalid.
    #[error("model {model}: {key}: {message}")]
    Invalid {
        /// The model being built.
        model: String,
        /// The parameter (`gpt.heads`) or layer concerned.
        key: String,
        /// What is wrong and what would be valid.
        message: String,
    },
    /// No model of that name in the zoo.
    #[error("unknown model {given:?}; known models: {known} (or give the path of a model file)")]
    UnknownModel {
        /// The name asked for.
        given: String,
        /// The zoo's names, comma-separated.
        known: String,
    },
    /// A model file is not valid TOML or does not match the format.
    #[error("{file}: {message}")]
    Toml {
        /// The file.
        file: String,
        /// The parser's message, with line, column and the offending text.
        message: String,
    },
    /// A key of a model file has an invalid value.
    #[error("{file}: {}key `{key}`: {message}", line.map(|line| format!("line {line}: ")).unwrap_or_default())]
    Format {
        /// The file.
        file: String,
        /// The line of the table holding the key, if known.
        line: Option<usize>,
        /// The key, with its table (`layers[3].kernel`).
        key: String,
        /// What is wrong and what would be valid.
        message: String,
    },
    /// Building the model a file describes failed.
    #[error("{file}: {}{error}", line.map(|line| format!("line {line}: ")).unwrap_or_default())]
    InFile {
        /// The file.
        file: String,
        /// The line of the layer or section that failed, if known.
        line: Option<usize>,
        /// What went wrong.
        error: Box<ModelError>,
    },
}

/// A neural network as a list of layers in forward execution order.
///
/// Branches (residual shortcuts, inception branches) are flattened into that order: a layer's
/// input is not always the previous layer's output; [`LayerKind::Add`] and
/// [`LayerKind::Concat`] join branches.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Model {
    /// Name (`"resnet50"`).
    pub name: String,
    /// The family it was built by (`"resnet"`, `"gpt"`), or `"custom"` for a layer-by-layer
    /// definition.
    pub family: String,
    /// One line on what it is and where its definition comes from.
    pub description: String,
    /// Per-sample input shape.
    pub input: Shape,
    /// Layers in forward execution order.
    pub layers: Vec<Layer>,
    /// The block structure, computed from the layers' names on first use (the strategy layer
    /// asks for it several times per configuration, and a plan prices thousands).
    #[serde(skip)]
    pub(crate) structure: StructureCache,
}

impl Model {
    /// Learned parameters of all layers (tied weights counted once); a frozen layer's are not
    /// learned here ([`Model::frozen_parameters`]).
    pub fn parameters(&self) -> u64 {
        self.layers.iter().map(|layer| layer.cost.params).sum()
    }

    /// Whether some layer is frozen ([`crate::layer::Training`]: LoRA's base model), without
    /// counting its weights.
    pub fn has_frozen_layers(&self) -> bool {
        self.layers.iter().any(|layer| !layer.cost.training.is_trained())
    }

    /// Parameters of frozen layers ([`crate::layer::Training`]): held in memory, not trained.
    pub fn frozen_parameters(&self) -> u64 {
        self.layers.iter().map(Layer::frozen_weights).sum()
    }

    /// Parameters one token's forward pass uses: every layer's, but of an expert bank only the
    /// `top_k` experts it is routed to (the "activated" count mixture-of-experts papers quote,
    /// embeddings included). Equal to [`Model::parameters`] for a dense model.
    pub fn active_parameters(&self) -> u64 {
        self.layers
            .iter()
            .map(|layer| match layer.kind {
                LayerKind::MoeExperts { experts, top_k, .. } if experts > 0 => {
                    layer.cost.params / experts * top_k.min(experts)
                }
                _ => layer.cost.params,
            })
            .sum()
    }

    /// Multiply-accumulates per sample of the matrix products (convolution, linear, attention,
    /// ...): the number model papers and torchvision quote as "FLOPs".
    pub fn macs_per_sample(&self) -> f64 {
        self.layers.iter().map(Layer::macs).sum()
    }

    /// Megatron-LM's model FLOPs of one training sample: 2 per multiply-accumulate for each
    /// pass that runs, so 6 for a trained layer (forward, input gradient, weight gradient), 4
    /// for a frozen one (no weight gradient: LoRA's base model, as NeMo counts its LoRA
    /// throughput) and 2 for one below every trained layer (forward only).
    pub fn model_training_flops_per_sample(&self) -> f64 {
        // Summed apart, so that a model without frozen layers gives 6 x macs_per_sample
        // exactly.
        let (mut trained, mut frozen, mut inert) = (0.0, 0.0, 0.0);
        for layer in &self.layers {
            match layer.cost.training {
                crate::layer::Training::Trained => trained += layer.macs(),
                crate::layer::Training::Frozen => frozen += layer.macs(),
                crate::layer::Training::Inert => inert += layer.macs(),
            }
        }
        6.0 * trained + 4.0 * frozen + 2.0 * inert
    }

    /// Forward FLOPs per sample, all layers.
    pub fn forward_flops_per_sample(&self) -> f64 {
        self.layers.iter().map(|layer| layer.cost.forward_flops).sum()
    }

    /// Forward plus backward (data and weight) FLOPs per sample, all layers.
    pub fn training_flops_per_sample(&self) -> f64 {
        self.layers.iter().map(|layer| layer.cost.training_flops()).sum()
    }

    /// Elements per sample kept from forward to backward, summed over layers (an upper bound:
    /// consecutive layers often keep the same tensor).
    pub fn activation_elements_per_sample(&self) -> u64 {
        self.layers.iter().map(|layer| layer.cost.activation_elements).fold(0, u64::saturating_add)
    }

    /// Per-sample output shape: the last layer's (the input's if there are no layers).
    pub fn output(&self) -> &Shape {
        self.layers.last().map_or(&self.input, |layer| &layer.output)
    }

    /// The layer called `name`, if any.
    pub fn layer(&self, name: &str) -> Option<&Layer> {
        self.layers.iter().find(|layer| layer.name == name)
    }
}

/// The most layers a model may have: 1,000 times the deepest network trained so far, and
/// still a graph of a few hundred MB once lowered for one GPU.
pub const MAX_LAYERS: usize = 1_000_000;

/// Builds a [`Model`] layer by layer, feeding each layer the current tensor's shape.
///
/// ```
/// use workloads::{LayerKind, ModelBuilder, Shape};
/// let mut builder = ModelBuilder::new("mlp", Shape::from([784]));
/// builder.layer("fc1", LayerKind::Linear { out_features: 128, bias: true })?;
/// builder.layer("relu", LayerKind::relu())?;
/// builder.layer("fc2", LayerKind::Linear { out_features: 10, bias: true })?;
/// let model = builder.finish();
/// assert_eq!(model.parameters(), 784 * 128 + 128 + 128 * 10 + 10);
/// assert_eq!(model.output(), &Shape::from([10]));
/// # Ok::<(), workloads::ModelError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ModelBuilder {
    model: Model,
    current: Shape,
    index: BTreeMap<String, usize>,
}

impl Model {
    /// A model of already-built layers (a rank's local shapes, say), keeping `name` and
    /// `family`, with no description. The layers are taken as given: shapes are not re-checked.
    pub fn from_layers(name: String, family: String, input: Shape, layers: Vec<Layer>) -> Model {
        Model {
            name,
            family,
            description: String::new(),
            input,
            layers,
            structure: StructureCache::default(),
        }
    }
}

impl ModelBuilder {
    /// An empty model taking `input` per sample, of family `"custom"` until
    /// [`ModelBuilder::describe`] says otherwise.
    pub fn new(name: impl Into<String>, input: Shape) -> Self {
        let model = Model {
            name: name.into(),
            family: "custom".to_string(),
            description: String::new(),
            input: input.clone(),
            layers: Vec::new(),
            structure: StructureCache::default(),
        };
        ModelBuilder { model, current: input, index: BTreeMap::new() }
    }

    /// Sets the model's family and description.
    pub fn describe(&mut self, family: impl Into<String>, description: impl Into<String>) -> &mut Self {
        self.model.family = family.into();
        self.model.description = description.into();
        self
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.model.name
    }

    /// The model's per-sample input shape.
    pub fn input(&self) -> &Shape {
        &self.model.input
    }

    /// The shape of the current tensor: the last layer's output, or the input at the start.
    pub fn shape(&self) -> &Shape {
        &self.current
    }

    /// The output shape of the layer called `name`, if it has been added.
    pub fn output_of(&self, name: &str) -> Option<&Shape> {
        self.index.get(name).map(|&index| &self.model.layers[index].output)
    }

    /// The layer called `name`, if it has been added.
    pub fn get(&self, name: &str) -> Option<&Layer> {
        self.index.get(name).map(|&index| &self.model.layers[index])
    }

    /// Appends a layer that reads the current tensor; its output becomes the current tensor.
    pub fn layer(&mut self, name: impl Into<String>, kind: LayerKind) -> Result<&Shape, ModelError> {
        let layer = Layer::new(name, kind, self.current.clone()).map_err(|error| self.error(error))?;
        self.push(layer)
    }

    /// Makes `shape` the current tensor without adding a layer: the next layer starts another
    /// branch from a tensor computed earlier (e.g. a shortcut's input).
    pub fn branch_from(&mut self, shape: Shape) {
        self.current = shape;
    }

    /// Appends a residual add of the current tensor and an earlier one of shape `other`.
    pub fn add(&mut self, name: impl Into<String>, other: &Shape) -> Result<&Shape, ModelError> {
        let layer =
            Layer::residual_add(name, self.current.clone(), other).map_err(|error| self.error(error))?;
        self.push(layer)
    }

    /// Appends a concatenation of the current tensor and `others` (in that order) along `axis`.
    pub fn concat(
        &mut self,
        name: impl Into<String>,
        axis: usize,
        others: &[Shape],
    ) -> Result<&Shape, ModelError> {
        self.layer(name, LayerKind::Concat { axis, others: others.to_vec() })
    }

    /// Appends a batched product of the current tensor with an earlier one of shape `other`.
    pub fn matmul(&mut self, name: impl Into<String>, other: &Shape) -> Result<&Shape, ModelError> {
        self.layer(name, LayerKind::Matmul { other: other.clone() })
    }

    /// Appends a linear layer that uses the weights of the earlier layer `owner`: an embedding
    /// of `out_features` rows of the current width (GPT's and BERT's output layers), or a linear
    /// layer with the same (or transposed) weight matrix.
    pub fn tied_linear(
        &mut self,
        name: impl Into<String>,
        out_features: u64,
        bias: bool,
        owner: &str,
    ) -> Result<&Shape, ModelError> {
        let name = name.into();
        let in_features = self.current.0.last().copied().unwrap_or(0);
        let Some(owner_layer) = self.get(owner) else {
            return Err(ModelError::UnknownReference {
                model: self.model.name.clone(),
                layer: name,
                reference: owner.to_string(),
            });
        };
        let fits = match &owner_layer.kind {
            LayerKind::Embedding { vocabulary, dim } => *vocabulary == out_features && *dim == in_features,
            LayerKind::Linear { out_features: owner_out, .. } => {
                let owner_in = owner_layer.input.0.last().copied().unwrap_or(0);
                (owner_in, *owner_out) == (in_features, out_features)
                    || (owner_in, *owner_out) == (out_features, in_features)
            }
            _ => false,
        };
        if !fits {
            return Err(ModelError::Invalid {
                model: self.model.name.clone(),
                key: name,
                message: format!(
                    "cannot tie a {in_features} -> {out_features} linear layer to {owner} ({} on {}); it must be an \
                     embedding of {out_features} rows of {in_features}, or a linear layer of the same size",
                    owner_layer.kind.name(),
                    owner_layer.input
                ),
            });
        }
        let kind = LayerKind::TiedLinear { out_features, bias, tied_to: owner.to_string() };
        self.layer(name, kind)
    }

    /// The finished model.
    pub fn finish(self) -> Model {
        self.model
    }

    fn error(&self, error: LayerError) -> ModelError {
        ModelError::Layer { model: self.model.name.clone(), error }
    }

    fn push(&mut self, layer: Layer) -> Result<&Shape, ModelError> {
        if self.model.layers.len() >= MAX_LAYERS {
            return Err(ModelError::Invalid {
                model: self.model.name.clone(),
                key: "layers".into(),
                message: format!(
                    "more than {MAX_LAYERS} layers: a model this deep would not fit in memory once lowered (every layer becomes several ops per micro-batch and GPU); the deepest trained networks have a few thousand"
                ),
            });
        }
        if self.index.contains_key(&layer.name) {
            return Err(ModelError::DuplicateLayer { model: self.model.name.clone(), layer: layer.name });
        }
        self.index.insert(layer.name.clone(), self.model.layers.len());
        self.current = layer.output.clone();
        self.model.layers.push(layer);
        Ok(&self.current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_tracks_shapes_branches_and_totals() {
        let mut builder = ModelBuilder::new("toy", Shape::from([8, 4, 4]));
        let block_input = builder.shape().clone();
        builder.layer("bn", LayerKind::BatchNorm).unwrap();
        builder.layer("relu", LayerKind::relu()).unwrap();
        builder.add("add", &block_input).unwrap();
        builder.branch_from(block_input);
        builder.layer("flatten", LayerKind::Flatten).unwrap();
        builder.layer("fc", LayerKind::Linear { out_features: 2, bias: false }).unwrap();
        assert_eq!(builder.output_of("add"), Some(&Shape::from([8, 4, 4])));
        let model = builder.finish();
        assert_eq!(model.family, "custom");
        assert_eq!(model.layers.len(), 5);
        assert_eq!(model.output(), &Shape::from([2]));
        assert_eq!(model.parameters(), 16 + 128 * 2);
        assert_eq!(model.macs_per_sample(), 256.0);
        assert!(model.training_flops_per_sample() > model.forward_flops_per_sample());
        assert_eq!(model.layer("fc").map(|layer| layer.input.clone()), Some(Shape::from([128])));
    }

    #[test]
    fn builder_errors_name_model_and_layer() {
        let mut builder = ModelBuilder::new("toy", Shape::from([16]));
        let error = builder
            .layer("attn", LayerKind::Softmax)
            .map(|_| ())
            .and_then(|()| builder.layer("conv", LayerKind::conv2d(4, 3, 1, 1)).map(|_| ()));
        let error = error.unwrap_err().to_string();
        assert!(error.contains("model toy") && error.contains("layer conv"), "{error}");
        builder.layer("relu", LayerKind::relu()).unwrap();
        let error = builder.layer("relu", LayerKind::relu()).unwrap_err();
        assert!(matches!(error, ModelError::DuplicateLayer { .. }), "{error}");
    }

    #[test]
    fn tied_layers_must_match_their_owner() {
        let mut builder = ModelBuilder::new("lm", Shape::from([16]));
        builder.layer("embedding", LayerKind::Embedding { vocabulary: 100, dim: 8 }).unwrap();
        builder.tied_linear("logits", 100, false, "embedding").unwrap();
        let model = builder.clone().finish();
        assert_eq!(model.parameters(), 800);
        assert_eq!(model.output(), &Shape::from([16, 100]));
        let error = builder.tied_linear("wrong", 99, false, "embedding").unwrap_err().to_string();
        assert!(error.contains("wrong") && error.contains("embedding of 99 rows of 100"), "{error}");
        let error = builder.tied_linear("missing", 100, false, "nowhere").unwrap_err().to_string();
        assert!(error.contains("\"nowhere\""), "{error}");
    }
}
