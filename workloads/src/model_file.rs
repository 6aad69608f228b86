//! Model files: TOML that names a parametric family and its parameters (`[gpt]`, `[resnet]`, ...)
//! or lists the layers one by one (`[[layers]]`). The format is documented in
//! `docs/models.md`; every key is checked, and errors name the file, the line and the key.

use std::path::Path;

use serde::Deserialize;
use toml::{Spanned, Table, Value};

use crate::family::dlrm::Dlrm;
use crate::family::inception::InceptionV3;
use crate::family::resnet::{PreActResNet, ResNet};
use crate::family::transformer::{Bert, Gpt, Llama, MoeTransformer};
use crate::family::unet::UNet3d;
use crate::family::vgg::Vgg;
use crate::layer::{
    Activation, AttentionKernel, LayerKind, LossKernels, Padding, RopeKernels, Shape, UpsampleMode,
};
use crate::model::{Model, ModelBuilder, ModelError};

/// The sections that select a parametric family, in the order the docs list them.
pub const FAMILIES: [&str; 11] = [
    "resnet",
    "preact-resnet",
    "vgg",
    "inception-v3",
    "unet3d",
    "gpt",
    "bert",
    "llama",
    "mixtral",
    "moe",
    "dlrm",
];

/// The layer kinds a `[[layers]]` entry may name.
pub const LAYER_KINDS: &[&str] = &[
    "conv1d",
    "conv2d",
    "conv3d",
    "conv-transpose1d",
    "conv-transpose2d",
    "conv-transpose3d",
    "linear",
    "matmul",
    "batchnorm",
    "layernorm",
    "rmsnorm",
    "maxpool1d",
    "maxpool2d",
    "maxpool3d",
    "avgpool1d",
    "avgpool2d",
    "avgpool3d",
    "global-avgpool",
    "global-maxpool",
    "adaptive-avgpool",
    "relu",
    "relu2",
    "leaky-relu",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "swiglu",
    "geglu",
    "glu",
    "reglu",
    "softmax",
    "dropout",
    "cross-entropy",
    "embedding",
    "position-embedding",
    "token-type-embedding",
    "embedding-bag",
    "interaction",
    "attention",
    "rope",
    "qk-norm",
    "moe-router",
    "moe-experts",
    "upsample",
    "crop",
    "add",
    "concat",
    "flatten",
    "reshape",
    "slice",
];

/// The wire form of a whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileSpec {
    #[serde(default)]
    model: Option<Header>,
    #[serde(default)]
    resnet: Option<Spanned<ResNet>>,
    #[serde(default)]
    preact_resnet: Option<Spanned<PreActResNet>>,
    #[serde(default)]
    vgg: Option<Spanned<Vgg>>,
    #[serde(default)]
    inception_v3: Option<Spanned<InceptionV3>>,
    #[serde(default)]
    unet3d: Option<Spanned<UNet3d>>,
    #[serde(default)]
    gpt: Option<Spanned<Gpt>>,
    #[serde(default)]
    bert: Option<Spanned<Bert>>,
    #[serde(default)]
    llama: Option<Spanned<Llama>>,
    #[serde(default)]
    mixtral: Option<Spanned<Llama>>,
    #[serde(default)]
    moe: Option<Spanned<MoeTransformer>>,
    #[serde(default)]
    dlrm: Option<Spanned<Dlrm>>,
    #[serde(default)]
    layers: Option<Vec<Spanned<Table>>>,
}

/// The `[model]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Header {
    /// Defaults to the file's stem.
    #[serde(default)]
    name: Option<String>,
    /// A label for layer-by-layer files; must match the section in family files.
    #[serde(default)]
    family: Option<String>,
    /// Replaces the family's generated description.
    #[serde(default)]
    description: Option<String>,
    /// Per-sample input shape (layer-by-layer files only).
    #[serde(default)]
    input: Option<Vec<u64>>,
}

impl Model {
    /// Parses a model file's text; `origin` (a path) names it in errors and gives the default
    /// model name (its stem).
    ///
    /// ```
    /// use workloads::{Model, Shape};
    /// let text = r#"
    /// [model]
    /// input = [784]
    ///
    /// [[layers]]
    /// name = "fc1"
    /// kind = "linear"
    /// out-features = 128
    ///
    /// [[layers]]
    /// name = "relu"
    /// kind = "relu"
    ///
    /// [[layers]]
    /// name = "fc2"
    /// kind = "linear"
    /// out-features = 10
    /// "#;
    /// let model = Model::from_toml_str(text, "models/mlp.toml")?;
    /// assert_eq!(model.name, "mlp");
    /// assert_eq!(model.parameters(), 784 * 128 + 128 + 128 * 10 + 10);
    /// assert_eq!(model.output(), &Shape::from([10]));
    ///
    /// let error = Model::from_toml_str("[gpt]\nlayers = 2\nhiden = 64\nheads = 2\n", "typo.toml").unwrap_err();
    /// assert!(error.to_string().contains("typo.toml") && error.to_string().contains("hiden"));
    /// # Ok::<(), workloads::ModelError>(())
    /// ```
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Model, ModelError> {
        let file = origin.to_string();
        let spec: FileSpec = toml::from_str(text)
            .map_err(|error| ModelError::Toml { file: file.clone(), message: error.to_string() })?;
        let header = spec.model.unwrap_or_default();
        let stem = Path::new(origin).file_stem().and_then(|stem| stem.to_str()).unwrap_or(origin);
        let name = header.name.clone().unwrap_or_else(|| stem.to_string());
        let format_error = |line: Option<usize>, key: &str, message: String| ModelError::Format {
            file: file.clone(),
            line,
            key: key.to_string(),
            message,
        };
        if name.trim().is_empty() {
            return Err(format_error(None, "model.name", "is empty; give the model a name".to_string()));
        }
        let mut defined = Vec::new();
        let mut note = |present: bool, section: &'static str| {
            if present {
                defined.push(section);
            }
        };
        note(spec.resnet.is_some(), "[resnet]");
        note(spec.preact_resnet.is_some(), "[preact-resnet]");
        note(spec.vgg.is_some(), "[vgg]");
        note(spec.inception_v3.is_some(), "[inception-v3]");
        note(spec.unet3d.is_some(), "[unet3d]");
        note(spec.gpt.is_some(), "[gpt]");
        note(spec.bert.is_some(), "[bert]");
        note(spec.llama.is_some(), "[llama]");
        note(spec.mixtral.is_some(), "[mixtral]");
        note(spec.moe.is_some(), "[moe]");
        note(spec.dlrm.is_some(), "[dlrm]");
        note(spec.layers.is_some(), "[[layers]]");
        match defined.len() {
            1 => {}
            0 => {
                return Err(format_error(
                    None,
                    "model",
                    format!(
                        "the file defines no model; add one family section ({}) or a list of [[layers]]",
                        FAMILIES.map(|family| format!("[{family}]")).join(", ")
                    ),
                ));
            }
            _ => {
                return Err(format_error(
                    None,
                    "model",
                    format!("the file defines {}; a file holds exactly one model", defined.join(" and ")),
                ));
            }
        }
        // Line numbers by binary search over the newlines' offsets, found once: counting them
        // again for every layer made loading a long layer-by-layer file quadratic.
        let newlines: Vec<usize> = text.match_indices('\n').map(|(offset, _)| offset).collect();
        let line_of = |offset: usize| {
            (offset <= text.len()).then(|| newlines.partition_point(|&newline| newline < offset) + 1)
        };
        let built = |section: &str, span: std::ops::Range<usize>, result: Result<Model, ModelError>| {
            result.map_err(|error| ModelError::InFile { file: file.clone(), line: line_of(span.start), error: Box::new(error) })
                .and_then(|model| {
                    if header.input.is_some() {
                        return Err(format_error(
                            None,
                            "model.input",
                            format!("only layer-by-layer files give an input shape; [{section}] derives it from its parameters"),
                        ));
                    }
                    match &header.family {
                        Some(family) if family != section => Err(format_error(
                            None,
                            "model.family",
                            format!("is {family:?} but the file has a [{section}] section; remove the key or make it {section:?}"),
                        )),
                        _ => Ok(model),
                    }
                })
        };
        let mut model = if let Some(section) = spec.resnet {
            built("resnet", section.span(), section.get_ref().build(&name))?
        } else if let Some(section) = spec.preact_resnet {
            built("preact-resnet", section.span(), section.get_ref().build(&name))?
        } else if let Some(section) = spec.vgg {
            built("vgg", section.span(), section.get_ref().build(&name))?
        } else if let Some(section) = spec.inception_v3 {
            built("inception-v3", section.span(), section.get_ref().build(&name))?
        } else if let Some(section) = spec.unet3d {
            built("unet3d", section.span(), section.get_ref().build(&name))?
        } else if let Some(section) = spec.gpt {
            built("gpt", section.span(), section.get_ref().build(&name))?
        } else if let Some(section) = spec.bert {
            built("bert", section.span(), section.get_ref().build(&name))?
        } else if let Some(section) = spec.llama {
            built("llama", section.span(), section.get_ref().build(&name, "llama"))?
        } else if let Some(section) = spec.mixtral {
            built("mixtral", section.span(), section.get_ref().build(&name, "mixtral"))?
        } else if let Some(section) = spec.moe {
            built("moe", section.span(), section.get_ref().build(&name))?
        } else if let Some(section) = spec.dlrm {
            built("dlrm", section.span(), section.get_ref().build(&name))?
        } else {
            let layers = spec.layers.unwrap_or_default();
            let Some(input) = header.input.clone() else {
                return Err(format_error(
                    None,
                    "model.input",
                    "missing; a layer-by-layer model needs its per-sample input shape, e.g. input = [3, 224, 224]"
                        .to_string(),
                ));
            };
            if input.is_empty() || input.contains(&0) {
                return Err(format_error(
                    None,
                    "model.input",
                    format!("{input:?} is not a shape; give positive sizes"),
                ));
            }
            if layers.is_empty() {
                return Err(format_error(
                    None,
                    "layers",
                    "the list is empty; give at least one layer".to_string(),
                ));
            }
            let mut builder = ModelBuilder::new(name.clone(), Shape(input));
            builder.describe(header.family.clone().unwrap_or_else(|| "custom".to_string()), String::new());
            for (index, layer) in layers.iter().enumerate() {
                let line = line_of(layer.span().start);
                add_layer(&mut builder, layer.get_ref(), &file, line, index)?;
            }
            builder.finish()
        };
        if let Some(description) = header.description {
            model.description = description;
        }
        Ok(model)
    }
}

/// What one `[[layers]]` entry does.
enum Step<'t> {
    Layer(LayerKind),
    Add { with: &'t str },
    Concat { axis: usize, with: Vec<&'t str> },
    Matmul { with: &'t str },
    Tied { out_features: u64, bias: bool, owner: &'t str },
}

/// Reads the keys of one `[[layers]]` table, remembering which ones the kind accepts.
struct Fields<'t> {
    table: &'t Table,
    accepted: Vec<&'static str>,
    /// The first required key found missing. Reported only after unknown keys, so that a typo
    /// (`out-feature`) is named as such rather than as a missing `out-features`.
    missing: Option<ModelError>,
    file: &'t str,
    line: Option<usize>,
    index: usize,
}

impl<'t> Fields<'t> {
    fn error(&self, key: &str, message: String) -> ModelError {
        ModelError::Format {
            file: self.file.to_string(),
            line: self.line,
            key: format!("layers[{}].{key}", self.index),
            message,
        }
    }

    fn get(&mut self, key: &'static str) -> Option<&'t Value> {
        self.accepted.push(key);
        self.table.get(key)
    }

    fn integer_value(&self, key: &str, value: &Value) -> Result<u64, ModelError> {
        match value {
            Value::Integer(number) if *number >= 0 => Ok(*number as u64),
            other => Err(self.error(key, format!("expected a non-negative integer, found {other}"))),
        }
    }

    fn integer(&mut self, key: &'static str) -> Result<Option<u64>, ModelError> {
        self.get(key).map(|value| self.integer_value(key, value)).transpose()
    }

    /// Notes that `key` is missing (the first such key is reported, after unknown keys).
    fn defer_missing(&mut self, key: &str, message: String) {
        if self.missing.is_none() {
            self.missing = Some(self.error(key, format!("missing; {message}")));
        }
    }

    /// A required integer; a placeholder 1 if missing (see [`Fields::defer_missing`]).
    fn required_integer(&mut self, key: &'static str, kind: &str) -> Result<u64, ModelError> {
        let value = self.integer(key)?;
        Ok(value.unwrap_or_else(|| {
            self.defer_missing(key, format!("a {kind} layer needs it"));
            1
        }))
    }

    fn boolean(&mut self, key: &'static str, default: bool) -> Result<bool, ModelError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Boolean(value)) => Ok(*value),
            Some(other) => Err(self.error(key, format!("expected true or false, found {other}"))),
        }
    }

    fn string(&mut self, key: &'static str) -> Result<Option<&'t str>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(value)) => Ok(Some(value)),
            Some(other) => Err(self.error(key, format!("expected a string, found {other}"))),
        }
    }

    fn required_string(&mut self, key: &'static str, why: &str) -> Result<&'t str, ModelError> {
        self.string(key)?.ok_or_else(|| self.error(key, format!("missing; {why}")))
    }

    /// One of `choices` (a string), or `default`.
    fn choice<T: Copy>(
        &mut self,
        key: &'static str,
        choices: &[(&str, T)],
        default: T,
    ) -> Result<T, ModelError> {
        match self.string(key)? {
            None => Ok(default),
            Some(given) => {
                choices.iter().find(|(name, _)| *name == given).map(|&(_, value)| value).ok_or_else(|| {
                    let valid: Vec<String> = choices.iter().map(|(name, _)| format!("{name:?}")).collect();
                    self.error(key, format!("{given:?} is not one of {}", valid.join(", ")))
                })
            }
        }
    }

    fn float(&mut self, key: &'static str) -> Result<Option<f64>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Float(value)) => Ok(Some(*value)),
            Some(Value::Integer(value)) => Ok(Some(*value as f64)),
            Some(other) => Err(self.error(key, format!("expected a number, found {other}"))),
        }
    }

    fn integer_list(&mut self, key: &'static str) -> Result<Option<Vec<u64>>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(values)) => {
                values.iter().map(|value| self.integer_value(key, value)).collect::<Result<_, _>>().map(Some)
            }
            Some(other) => Err(self.error(key, format!("expected a list of integers, found {other}"))),
        }
    }

    /// A per-spatial-axis parameter: one integer for every axis, or a list of `axes` integers.
    fn per_axis(
        &mut self,
        key: &'static str,
        axes: usize,
        default: Option<u64>,
    ) -> Result<Option<Vec<u64>>, ModelError> {
        match self.get(key) {
            None => Ok(default.map(|value| vec![value; axes])),
            Some(Value::Array(values)) => {
                let values: Vec<u64> =
                    values.iter().map(|value| self.integer_value(key, value)).collect::<Result<_, _>>()?;
                if values.len() == axes {
                    Ok(Some(values))
                } else {
                    Err(self.error(
                        key,
                        format!(
                            "has {} values; give one integer, or a list of {axes} (one per spatial axis)",
                            values.len()
                        ),
                    ))
                }
            }
            Some(value) => self.integer_value(key, value).map(|value| Some(vec![value; axes])),
        }
    }

    fn required_per_axis(
        &mut self,
        key: &'static str,
        axes: usize,
        kind: &str,
    ) -> Result<Vec<u64>, ModelError> {
        let values = self.per_axis(key, axes, None)?;
        Ok(values.unwrap_or_else(|| {
            self.defer_missing(key, format!("a {kind} layer needs it"));
            vec![1; axes]
        }))
    }

    /// A required list of integers; empty if missing (see [`Fields::defer_missing`]).
    fn required_list(&mut self, key: &'static str, why: &str) -> Result<Vec<u64>, ModelError> {
        let values = self.integer_list(key)?;
        Ok(values.unwrap_or_else(|| {
            self.defer_missing(key, why.to_string());
            Vec::new()
        }))
    }

    /// Layer names: one string or a list of strings.
    fn names(&mut self, key: &'static str, kind: &str) -> Result<Vec<&'t str>, ModelError> {
        match self.get(key) {
            None => {
                self.defer_missing(key, format!("a {kind} layer needs the names of the layers it joins"));
                Ok(Vec::new())
            }
            Some(Value::String(name)) => Ok(vec![name.as_str()]),
            Some(Value::Array(values)) => values
                .iter()
                .map(|value| match value {
                    Value::String(name) => Ok(name.as_str()),
                    other => Err(self.error(key, format!("expected layer names, found {other}"))),
                })
                .collect(),
            Some(other) => {
                Err(self.error(key, format!("expected a layer name or a list of them, found {other}")))
            }
        }
    }

    /// An optional declared size (`in-channels`, `in-features`) that must match what the
    /// previous layers produce: a check for definitions transcribed from other frameworks.
    fn declared(
        &mut self,
        key: &'static str,
        actual: Option<u64>,
        input: &Shape,
        what: &str,
    ) -> Result<(), ModelError> {
        match self.integer(key)? {
            Some(declared) if Some(declared) != actual => Err(self.error(
                key,
                format!(
                    "is {declared} but the layer's input {input} has {} {what}; check the layers before it",
                    actual.map_or("no".to_string(), |actual| actual.to_string())
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Fails on any key the kind does not accept, listing the ones it does.
    /// Then reports the first missing required key, if any.
    fn finish(mut self, kind: &str) -> Result<(), ModelError> {
        self.accepted.extend(["name", "kind", "input"]);
        if let Some(key) = self.table.keys().find(|key| !self.accepted.contains(&key.as_str())) {
            let mut valid = self.accepted.clone();
            valid.sort_unstable();
            valid.dedup();
            return Err(self.error(
                key,
                format!(
                    "unknown key for a {kind} layer; valid keys: {}",
                    valid.iter().map(|key| format!("`{key}`")).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        self.missing.map_or(Ok(()), Err)
    }
}

/// Spatial axes encoded in a kind name's suffix (`conv3d` -> 3).
fn axes_of(kind: &str) -> usize {
    if kind.ends_with("1d") {
        1
    } else if kind.ends_with("2d") {
        2
    } else {
        3
    }
}

fn activation_of(name: &str) -> Option<Activation> {
    Activation::ALL.into_iter().find(|activation| activation.name() == name)
}

/// Converts one `[[layers]]` table's keys (beyond `name`, `kind`, `input`) into a step.
fn step<'t>(fields: &mut Fields<'t>, kind: &str, input: &Shape) -> Result<Step<'t>, ModelError> {
    let spatial_axes = input.rank().saturating_sub(1).max(1);
    let channels = input.0.first().copied();
    let features = input.0.last().copied();
    match kind {
        "conv1d" | "conv2d" | "conv3d" | "conv-transpose1d" | "conv-transpose2d" | "conv-transpose3d"
        | "batchnorm" => {
            fields.declared("in-channels", channels, input, "channels")?;
        }
        "linear" | "layernorm" | "rmsnorm" => fields.declared("in-features", features, input, "features")?,
        _ => {}
    }
    let step = match kind {
        "conv1d" | "conv2d" | "conv3d" => {
            let axes = axes_of(kind);
            let out_channels = fields.required_integer("out-channels", kind)?;
            let kernel = fields.required_per_axis("kernel", axes, kind)?;
            let stride = fields.per_axis("stride", axes, Some(1))?.unwrap_or_default();
            let padding = match fields.table.get("padding") {
                Some(Value::String(mode)) => {
                    fields.accepted.push("padding");
                    match mode.as_str() {
                        "same" => Padding::Same,
                        "valid" => Padding::Symmetric(vec![0; axes]),
                        other => {
                            return Err(fields.error(
                                "padding",
                                format!("{other:?}; use \"same\", \"valid\", an integer or a list of {axes}"),
                            ));
                        }
                    }
                }
                _ => Padding::Symmetric(fields.per_axis("padding", axes, Some(0))?.unwrap_or_default()),
            };
            let dilation = fields.per_axis("dilation", axes, Some(1))?.unwrap_or_default();
            let groups = fields.integer("groups")?.unwrap_or(1);
            let bias = fields.boolean("bias", true)?;
            Step::Layer(LayerKind::Conv { out_channels, kernel, stride, padding, dilation, groups, bias })
        }
        "conv-transpose1d" | "conv-transpose2d" | "conv-transpose3d" => {
            let axes = axes_of(kind);
            Step::Layer(LayerKind::ConvTranspose {
                out_channels: fields.required_integer("out-channels", kind)?,
                kernel: fields.required_per_axis("kernel", axes, kind)?,
                stride: fields.per_axis("stride", axes, Some(1))?.unwrap_or_default(),
                padding: fields.per_axis("padding", axes, Some(0))?.unwrap_or_default(),
                output_padding: fields.per_axis("output-padding", axes, Some(0))?.unwrap_or_default(),
                dilation: fields.per_axis("dilation", axes, Some(1))?.unwrap_or_default(),
                groups: fields.integer("groups")?.unwrap_or(1),
                bias: fields.boolean("bias", true)?,
            })
        }
        "linear" => {
            let out_features = fields.required_integer("out-features", kind)?;
            let bias = fields.boolean("bias", true)?;
            match fields.string("tied-to")? {
                Some(owner) => Step::Tied { out_features, bias, owner },
                None => Step::Layer(LayerKind::Linear { out_features, bias }),
            }
        }
        "matmul" => match fields.names("with", kind)?[..] {
            [] => Step::Matmul { with: "" }, // missing: reported by the caller
            [other] => Step::Matmul { with: other },
            ref several => {
                return Err(fields.error(
                    "with",
                    format!("names {} layers; a matmul takes exactly one other operand", several.len()),
                ));
            }
        },
        "batchnorm" => Step::Layer(LayerKind::BatchNorm),
        "layernorm" => Step::Layer(LayerKind::LayerNorm { bias: fields.boolean("bias", true)? }),
        "rmsnorm" => Step::Layer(LayerKind::RmsNorm),
        "maxpool1d" | "maxpool2d" | "maxpool3d" | "avgpool1d" | "avgpool2d" | "avgpool3d" => {
            let axes = axes_of(kind);
            let kernel = fields.required_per_axis("kernel", axes, kind)?;
            let stride = fields.per_axis("stride", axes, None)?.unwrap_or_else(|| kernel.clone());
            let padding = fields.per_axis("padding", axes, Some(0))?.unwrap_or_default();
            let ceil_mode = fields.boolean("ceil-mode", false)?;
            if kind.starts_with("max") {
                Step::Layer(LayerKind::MaxPool { kernel, stride, padding, ceil_mode })
            } else {
                Step::Layer(LayerKind::AvgPool { kernel, stride, padding, ceil_mode })
            }
        }
        "global-avgpool" => Step::Layer(LayerKind::GlobalAvgPool),
        "global-maxpool" => Step::Layer(LayerKind::GlobalMaxPool),
        "adaptive-avgpool" => Step::Layer(LayerKind::AdaptiveAvgPool {
            output: fields.required_per_axis("output", spatial_axes, kind)?,
        }),
        "relu" | "gelu" | "silu" | "sigmoid" | "tanh" | "relu2" => {
            Step::Layer(LayerKind::Activation { function: activation_of(kind).unwrap_or(Activation::Relu) })
        }
        "leaky-relu" => {
            // The slope does not change the cost; it is accepted so PyTorch definitions carry over.
            fields.float("negative-slope")?;
            Step::Layer(LayerKind::Activation { function: Activation::LeakyRelu })
        }
        "swiglu" => Step::Layer(LayerKind::Glu { function: Activation::Silu }),
        "geglu" => Step::Layer(LayerKind::Glu { function: Activation::Gelu }),
        "glu" => Step::Layer(LayerKind::Glu { function: Activation::Sigmoid }),
        "reglu" => Step::Layer(LayerKind::Glu { function: Activation::Relu }),
        "softmax" => Step::Layer(LayerKind::Softmax),
        "dropout" => {
            if let Some(probability) = fields.float("probability")?
                && !(0.0..1.0).contains(&probability)
            {
                return Err(fields.error("probability", format!("{probability} is not in [0, 1)")));
            }
            Step::Layer(LayerKind::Dropout)
        }
        "cross-entropy" => Step::Layer(LayerKind::CrossEntropy {
            kernels: fields.choice(
                "kernels",
                &[
                    ("fused", LossKernels::Fused),
                    ("megatron", LossKernels::Megatron),
                    ("torch", LossKernels::Torch),
                ],
                LossKernels::Fused,
            )?,
        }),
        "embedding" => Step::Layer(LayerKind::Embedding {
            vocabulary: fields.required_integer("vocabulary", kind)?,
            dim: fields.required_integer("dim", kind)?,
        }),
        "position-embedding" => Step::Layer(LayerKind::AddEmbedding {
            rows: fields.required_integer("positions", kind)?,
            positional: true,
        }),
        "token-type-embedding" => Step::Layer(LayerKind::AddEmbedding {
            rows: fields.required_integer("types", kind)?,
            positional: false,
        }),
        "embedding-bag" => Step::Layer(LayerKind::EmbeddingBag {
            tables: fields.required_list("tables", "give the rows of each table")?,
            dim: fields.required_integer("dim", kind)?,
            lookups: fields.integer("lookups")?.unwrap_or(1),
        }),
        "interaction" => Step::Layer(LayerKind::Interaction),
        "attention" => {
            let heads = fields.required_integer("heads", kind)?;
            Step::Layer(LayerKind::Attention {
                heads,
                kv_heads: fields.integer("kv-heads")?.unwrap_or(heads),
                causal: fields.boolean("causal", false)?,
                implementation: fields.choice(
                    "implementation",
                    &[
                        ("standard", AttentionKernel::Standard),
                        ("flash", AttentionKernel::Flash),
                        ("math", AttentionKernel::Math),
                    ],
                    AttentionKernel::Standard,
                )?,
                dropout: match fields.float("dropout")? {
                    None => false,
                    Some(probability) if (0.0..1.0).contains(&probability) => probability > 0.0,
                    Some(probability) => {
                        return Err(fields.error("dropout", format!("{probability} is not in [0, 1)")));
                    }
                },
                value_head_dim: fields.integer("value-head-dim")?,
            })
        }
        "rope" => {
            let heads = fields.required_integer("heads", kind)?;
            Step::Layer(LayerKind::Rope {
                heads,
                kv_heads: fields.integer("kv-heads")?.unwrap_or(heads),
                kernels: fields.choice(
                    "kernels",
                    &RopeKernels::ALL.map(|k| (k.name(), k)),
                    RopeKernels::Fused,
                )?,
            })
        }
        "qk-norm" => {
            let heads = fields.required_integer("heads", kind)?;
            Step::Layer(LayerKind::QkNorm { heads, kv_heads: fields.integer("kv-heads")?.unwrap_or(heads) })
        }
        "moe-router" => Step::Layer(LayerKind::MoeRouter {
            experts: fields.required_integer("experts", kind)?,
            top_k: fields.required_integer("top-k", kind)?,
        }),
        "moe-experts" => {
            let activations: Vec<(&str, Activation)> =
                Activation::ALL.iter().map(|a| (a.name(), *a)).collect();
            Step::Layer(LayerKind::MoeExperts {
                experts: fields.required_integer("experts", kind)?,
                top_k: fields.required_integer("top-k", kind)?,
                ffn_hidden: fields.required_integer("ffn-hidden", kind)?,
                activation: fields.choice("activation", &activations, Activation::Silu)?,
                gated: fields.boolean("gated", true)?,
                bias: fields.boolean("bias", false)?,
            })
        }
        "upsample" => Step::Layer(LayerKind::Upsample {
            scale: fields.required_per_axis("scale", spatial_axes, kind)?,
            mode: fields.choice(
                "mode",
                &[("nearest", UpsampleMode::Nearest), ("linear", UpsampleMode::Linear)],
                UpsampleMode::Nearest,
            )?,
        }),
        "crop" => {
            Step::Layer(LayerKind::Crop { size: fields.required_per_axis("size", spatial_axes, kind)? })
        }
        "add" => {
            let with = fields.names("with", kind)?;
            match with[..] {
                [] => Step::Add { with: "" }, // missing: reported by the caller
                [other] => Step::Add { with: other },
                _ => {
                    return Err(fields.error(
                        "with",
                        format!("names {} layers; an add takes exactly one other operand", with.len()),
                    ));
                }
            }
        }
        "concat" => {
            let axis = fields.integer("axis")?.unwrap_or(0);
            let axis =
                usize::try_from(axis).map_err(|_| fields.error("axis", format!("{axis} is too large")))?;
            Step::Concat { axis, with: fields.names("with", kind)? }
        }
        "flatten" => Step::Layer(LayerKind::Flatten),
        "reshape" => Step::Layer(LayerKind::Reshape {
            shape: Shape(fields.required_list("shape", "give the new shape")?),
        }),
        "slice" => {
            let axis = fields.integer("axis")?.unwrap_or(0);
            Step::Layer(LayerKind::Slice {
                axis: usize::try_from(axis)
                    .map_err(|_| fields.error("axis", format!("{axis} is too large")))?,
                start: fields.integer("start")?.unwrap_or(0),
                length: fields.required_integer("length", kind)?,
            })
        }
        other => {
            return Err(fields.error(
                "kind",
                format!("unknown layer kind {other:?}; valid kinds: {}", LAYER_KINDS.join(", ")),
            ));
        }
    };
    Ok(step)
}

/// Reads one `[[layers]]` table and appends its layer.
fn add_layer(
    builder: &mut ModelBuilder,
    table: &Table,
    file: &str,
    line: Option<usize>,
    index: usize,
) -> Result<(), ModelError> {
    let mut fields = Fields { table, accepted: Vec::new(), missing: None, file, line, index };
    let name = fields.required_string("name", "every layer needs a unique name")?;
    if name == "input" || name.trim().is_empty() {
        return Err(fields.error("name", format!("{name:?} is reserved or empty; choose another name")));
    }
    let kind = fields.required_string("kind", "every layer needs a kind, e.g. kind = \"conv2d\"")?;
    let in_file =
        |error: ModelError| ModelError::InFile { file: file.to_string(), line, error: Box::new(error) };
    let resolve = |builder: &ModelBuilder, reference: &str| -> Result<Shape, ModelError> {
        if reference == "input" {
            return Ok(builder.input().clone());
        }
        builder.output_of(reference).cloned().ok_or_else(|| {
            in_file(ModelError::UnknownReference {
                model: builder.name().to_string(),
                layer: name.to_string(),
                reference: reference.to_string(),
            })
        })
    };
    let input = match fields.string("input")? {
        None => builder.shape().clone(),
        Some(reference) => resolve(builder, reference)?,
    };
    let step = step(&mut fields, kind, &input)?;
    fields.finish(kind)?;
    builder.branch_from(input);
    let result = match step {
        Step::Layer(kind) => builder.layer(name, kind).map(|_| ()),
        Step::Add { with } => {
            let other = resolve(builder, with)?;
            builder.add(name, &other).map(|_| ())
        }
        Step::Concat { axis, with } => {
            let others =
                with.iter().map(|reference| resolve(builder, reference)).collect::<Result<Vec<_>, _>>()?;
            builder.concat(name, axis, &others).map(|_| ())
        }
        Step::Matmul { with } => {
            let other = resolve(builder, with)?;
            builder.matmul(name, &other).map(|_| ())
        }
        Step::Tied { out_features, bias, owner } => {
            builder.tied_linear(name, out_features, bias, owner).map(|_| ())
        }
    };
    result.map_err(in_file)
}
