//! The model zoo: well-known networks by name, layer for layer as their reference
//! implementations define them.

pub mod resnet;

pub use resnet::{Block, resnet, resnet18, resnet34, resnet50, resnet101, resnet152};

use crate::model::{Model, ModelError};

/// Names [`by_name`] knows, in the order `parasim models` lists them.
pub const NAMES: [&str; 5] = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"];

/// The zoo model called `name` (case does not matter), or an error listing the known names.
///
/// ```
/// let model = workloads::zoo::by_name("ResNet50")?;
/// assert_eq!(model.name, "resnet50");
/// assert!(workloads::zoo::by_name("vgg16").is_err());
/// # Ok::<(), workloads::ModelError>(())
/// ```
pub fn by_name(name: &str) -> Result<Model, ModelError> {
    match name.trim().to_ascii_lowercase().as_str() {
        "resnet18" => Ok(resnet18()),
        "resnet34" => Ok(resnet34()),
        "resnet50" => Ok(resnet50()),
        "resnet101" => Ok(resnet101()),
        "resnet152" => Ok(resnet152()),
        _ => Err(ModelError::UnknownModel { given: name.to_string(), known: NAMES.join(", ") }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_builds_a_model_of_that_name() {
        for name in NAMES {
            assert_eq!(by_name(name).unwrap().name, name);
        }
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let error = by_name("resnet51").unwrap_err().to_string();
        assert!(error.contains("\"resnet51\"") && error.contains("resnet18, resnet34, resnet50"), "{error}");
    }
}
