//! The model zoo: well-known networks by name.
//!
//! The catalog is data: one model file per entry in `data/models/` (compiled in), each naming a
//! parametric family and its parameters (`gpt3-175b.toml` is `[gpt]` with 96 layers, ...) or
//! listing its layers. The families are built by [`crate::family`], layer for layer as their
//! reference implementations define them. Users' own files load with
//! [`Model::from_toml_str`] (the CLI reads the file).

use crate::model::{Model, ModelError};

/// The built-in model files, in the order `parasim models` lists them.
macro_rules! builtin {
    ($($name:literal),* $(,)?) => {
        [$(($name, include_str!(concat!("../../../data/models/", $name, ".toml")))),*]
    };
}

const BUILTIN: [(&str, &str); 43] = builtin![
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "resnet164",
    "resnet1001",
    "vgg16",
    "vgg19",
    "alexnet",
    "paradl-alexnet",
    "paradl-alexnet-spatial",
    "inception-v3",
    "cosmoflow",
    "cosmoflow-256",
    "cosmoflow-512",
    "unet3d",
    "bert-base",
    "bert-large",
    "gpt3-175b",
    "megatron-1.7b",
    "megatron-3.6b",
    "megatron-7.5b",
    "megatron-18.4b",
    "megatron-39.1b",
    "megatron-76.1b",
    "megatron-145.6b",
    "megatron-310.1b",
    "megatron-529.6b",
    "megatron-1t",
    "llama2-7b",
    "llama2-13b",
    "llama2-70b",
    "llama3-8b",
    "llama3-70b",
    "llama3-405b",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "deepseek-v3",
    "grok-1",
    "dlrm",
];

const fn names<const N: usize>(files: &[(&'static str, &'static str); N]) -> [&'static str; N] {
    let mut names = [""; N];
    let mut index = 0;
    while index < N {
        names[index] = files[index].0;
        index += 1;
    }
    names
}

/// Names [`by_name`] knows, in the order `parasim models` lists them.
pub const NAMES: [&str; BUILTIN.len()] = names(&BUILTIN);

/// The text of the built-in model file called `name` (exact, lowercase), if any.
pub fn source(name: &str) -> Option<&'static str> {
    BUILTIN.iter().find(|(known, _)| *known == name).map(|(_, text)| *text)
}

/// The zoo model called `name` (case does not matter), or an error listing the known names.
///
/// ```
/// let model = workloads::zoo::by_name("ResNet50")?;
/// assert_eq!(model.name, "resnet50");
/// let gpt3 = workloads::zoo::by_name("gpt3-175b")?;
/// assert_eq!(gpt3.family, "gpt");
/// assert!(workloads::zoo::by_name("vgg17").is_err());
/// # Ok::<(), workloads::ModelError>(())
/// ```
pub fn by_name(name: &str) -> Result<Model, ModelError> {
    let wanted = name.trim().to_ascii_lowercase();
    match BUILTIN.iter().find(|(known, _)| *known == wanted) {
        Some((known, text)) => Model::from_toml_str(text, &format!("data/models/{known}.toml")),
        None => Err(ModelError::UnknownModel { given: name.to_string(), known: NAMES.join(", ") }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_builds_a_model_of_that_name() {
        for name in NAMES {
            let model = by_name(name).unwrap_or_else(|error| panic!("{error}"));
            assert_eq!(model.name, name);
            assert!(!model.description.is_empty(), "{name} has a description");
        }
    }

    #[test]
    fn zoo_files_reproduce_the_builders() {
        assert_eq!(by_name("resnet50").unwrap(), crate::family::resnet50());
        assert_eq!(by_name("resnet152").unwrap(), crate::family::resnet152());
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let error = by_name("resnet51").unwrap_err().to_string();
        assert!(error.contains("\"resnet51\"") && error.contains("resnet18, resnet34, resnet50"), "{error}");
    }
}
