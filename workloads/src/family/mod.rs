//! The parametric model families: each builds a network layer for layer as its reference
//! implementation defines it, from the parameters a model file gives its family's section
//! (`[resnet]`, `[gpt]`, ...; `docs/models.md`).
//!
//! Below the model files ([`Model::from_toml_str`](crate::Model::from_toml_str) calls these
//! builders), which are below the [zoo](crate::zoo), the built-in catalog of named files.

pub mod dlrm;
pub mod inception;
pub mod resnet;
pub mod transformer;
pub mod unet;
pub mod vgg;

pub use resnet::{Block, resnet, resnet18, resnet34, resnet50, resnet101, resnet152};

use crate::model::ModelError;

/// A [`ModelError::Invalid`] for model `model`'s parameter `key`.
pub(crate) fn invalid(model: &str, key: &str, message: String) -> ModelError {
    ModelError::Invalid { model: model.to_string(), key: key.to_string(), message }
}
