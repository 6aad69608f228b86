//! Models: layers in forward execution order, and a builder that propagates shapes through
//! them.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::layer::{Layer, LayerError, LayerKind, Shape};

/// A model could not be built or found.
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
    /// No model of that name in the zoo.
    #[error("unknown model {given:?}; known models: {known}")]
    UnknownModel {
        /// The name asked for.
        given: String,
        /// The zoo's names, comma-separated.
        known: String,
    },
}

/// A neural network as a list of layers in forward execution order.
///
/// Branches (residual shortcuts) are flattened into that order: a layer's input is not always
/// the previous layer's output, and each [`LayerKind::Add`] joins two branches.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Model {
    /// Name (`"resnet50"`).
    pub name: String,
    /// Per-sample input shape.
    pub input: Shape,
    /// Layers in forward execution order.
    pub layers: Vec<Layer>,
}

impl Model {
    /// Learned parameters of all layers.
    pub fn parameters(&self) -> u64 {
        self.layers.iter().map(|layer| layer.cost.params).sum()
    }

    /// Multiply-accumulates per sample of the convolution and linear layers (the number model
    /// papers and torchvision quote as "FLOPs").
    pub fn macs_per_sample(&self) -> f64 {
        self.layers.iter().map(Layer::macs).sum()
    }

    /// Forward FLOPs per sample, all layers.
    pub fn forward_flops_per_sample(&self) -> f64 {
        self.layers.iter().map(|layer| layer.cost.forward_flops).sum()
    }

    /// Forward plus backward (data and weight) FLOPs per sample, all layers.
    pub fn training_flops_per_sample(&self) -> f64 {
        self.layers.iter().map(|layer| layer.cost.training_flops()).sum()
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

/// Builds a [`Model`] layer by layer, feeding each layer the current tensor's shape.
///
/// ```
/// use workloads::{LayerKind, ModelBuilder, Shape};
/// let mut builder = ModelBuilder::new("mlp", Shape::from([784]));
/// builder.layer("fc1", LayerKind::Linear { out_features: 128, bias: true })?;
/// builder.layer("relu", LayerKind::Relu)?;
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
    names: BTreeSet<String>,
}

impl ModelBuilder {
    /// An empty model taking `input` per sample.
    pub fn new(name: impl Into<String>, input: Shape) -> Self {
        let model = Model { name: name.into(), input: input.clone(), layers: Vec::new() };
        ModelBuilder { model, current: input, names: BTreeSet::new() }
    }

    /// The shape of the current tensor: the last layer's output, or the input at the start.
    pub fn shape(&self) -> &Shape {
        &self.current
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

    /// The finished model.
    pub fn finish(self) -> Model {
        self.model
    }

    fn error(&self, error: LayerError) -> ModelError {
        ModelError::Layer { model: self.model.name.clone(), error }
    }

    fn push(&mut self, layer: Layer) -> Result<&Shape, ModelError> {
        if !self.names.insert(layer.name.clone()) {
            return Err(ModelError::DuplicateLayer { model: self.model.name.clone(), layer: layer.name });
        }
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
        builder.layer("bn", LayerKind::BatchNorm2d).unwrap();
        builder.layer("relu", LayerKind::Relu).unwrap();
        builder.add("add", &block_input).unwrap();
        builder.branch_from(block_input);
        builder.layer("flatten", LayerKind::Flatten).unwrap();
        builder.layer("fc", LayerKind::Linear { out_features: 2, bias: false }).unwrap();
        let model = builder.finish();
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
        let error = builder.layer("bn", LayerKind::BatchNorm2d).unwrap_err().to_string();
        assert!(error.contains("model toy") && error.contains("layer bn"), "{error}");
        builder.layer("relu", LayerKind::Relu).unwrap();
        let error = builder.layer("relu", LayerKind::Relu).unwrap_err();
        assert!(matches!(error, ModelError::DuplicateLayer { .. }), "{error}");
    }
}
