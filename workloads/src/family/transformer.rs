//! Transformers: GPT (Megatron-LM's layout), BERT, Llama and Mixtral-style mixtures of experts,
//! all built by one parametric [`Transformer`].
//!
//! Per-sample shapes are `[tokens, features]`. A layer is laid out as the fused kernels of
//! Megatron-LM: a fused QKV projection writing `[tokens, (heads + 2 kv_heads) head_dim]`, rotary
//! embeddings (if any) on it, the attention core ([`LayerKind::Attention`]), the output
//! projection, then the MLP (one `h -> ffn` projection, or a fused gate-and-up `h -> 2 ffn`
//! projection followed by a SwiGLU for Llama). Names: `layers.<i>.attention.qkv`,
//! `layers.<i>.mlp.fc1`, ...
//!
//! Parameter counts: GPT's are `12 l h^2 + 13 l h + (V + s) h` (Megatron-LM's Eq. 2) plus the
//! final layer norm's `2h`; its output layer is tied to the word embeddings.

use serde::Deserialize;

use crate::family::invalid;
use crate::layer::{Activation, AttentionKernel, LayerKind, LossKernels, Shape};
use crate::model::{Model, ModelBuilder, ModelError};

/// Normalization used in each layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Norm {
    /// Layer norm with scale and shift (GPT, BERT).
    LayerNorm,
    /// RMS norm, scale only (Llama).
    RmsNorm,
}

/// The feed-forward block of each layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mlp {
    /// `h -> ffn`, GELU, `ffn -> h` (GPT, BERT).
    Gelu,
    /// `h -> 2 ffn` (gate and up, fused), SwiGLU, `ffn -> h` (Llama).
    SwiGlu,
}

/// How token positions enter the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Positions {
    /// A learned table of `max_positions` rows added to the embeddings.
    Learned {
        /// Rows of the table.
        max_positions: u64,
    },
    /// Rotary embeddings applied to queries and keys in every layer.
    Rope,
}

/// What follows the last layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// Final norm (pre-norm models), logits over the vocabulary and the cross-entropy loss.
    LanguageModel {
        /// The logits layer reuses the word embedding table.
        tied: bool,
    },
    /// BERT's pre-training heads: the masked-LM head (dense, GELU, layer norm, logits tied to
    /// the word embeddings with their own bias, loss) over every position, and the pooler and
    /// next-sentence classifier on the first token.
    BertPretraining,
}

/// Mixture-of-experts feed-forward blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moe {
    /// Experts per layer.
    pub experts: u64,
    /// Experts per token.
    pub top_k: u64,
}

/// A transformer, every knob explicit; the model-file sections (`[gpt]`, `[bert]`, `[llama]`,
/// `[mixtral]`) fill in their family's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transformer {
    /// Family name, for the model's description (`"gpt"`).
    pub family: &'static str,
    /// Transformer layers.
    pub layers: u64,
    /// Hidden size `h`.
    pub hidden: u64,
    /// Attention (query) heads; must divide `hidden`.
    pub heads: u64,
    /// Key/value heads; must divide `heads`.
    pub kv_heads: u64,
    /// Hidden size of the feed-forward block (of each expert).
    pub ffn_hidden: u64,
    /// Tokens per sample.
    pub sequence: u64,
    /// Vocabulary size.
    pub vocabulary: u64,
    /// Segment (token-type) embeddings, BERT's 2; 0 for none.
    pub token_types: u64,
    /// Normalization.
    pub norm: Norm,
    /// Normalize before each sub-block (GPT, Llama) or after the residual add (BERT).
    pub pre_norm: bool,
    /// Feed-forward block.
    pub mlp: Mlp,
    /// Position information.
    pub positions: Positions,
    /// Biases in the projections.
    pub bias: bool,
    /// Dropout on the hidden states: after the embeddings, the attention projection and the
    /// MLP (Megatron-LM's `--hidden-dropout`).
    pub hidden_dropout: bool,
    /// Dropout on the attention probabilities (Megatron-LM's `--attention-dropout`).
    pub attention_dropout: bool,
    /// Causal (decoder) attention.
    pub causal: bool,
    /// Attention kernel.
    pub attention: AttentionKernel,
    /// Mixture of experts in place of every feed-forward block.
    pub moe: Option<Moe>,
    /// The output head.
    pub head: Head,
    /// How its cross-entropy losses run.
    pub loss: LossKernels,
}

impl Transformer {
    /// Checks the sizes fit together; errors name the key.
    fn validate(&self, name: &str) -> Result<(), ModelError> {
        let key = |field: &str| format!("{}.{field}", self.family);
        // About a dozen layers per block: refuse before building what the builder would.
        let most = (crate::model::MAX_LAYERS / 16) as u64;
        if self.layers > most {
            return Err(invalid(
                name,
                &key("layers"),
                format!(
                    "{} is more than {most}, the most blocks parasim builds (a model of at most {} layers)",
                    self.layers,
                    crate::model::MAX_LAYERS
                ),
            ));
        }
        for (field, value) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("kv-heads", self.kv_heads),
            ("ffn-hidden", self.ffn_hidden),
            ("sequence", self.sequence),
            ("vocabulary", self.vocabulary),
        ] {
            if value == 0 {
                return Err(invalid(name, &key(field), "must be at least 1".to_string()));
            }
        }
        if self.hidden % self.heads != 0 {
            return Err(invalid(
                name,
                &key("heads"),
                format!(
                    "{} heads do not divide the hidden size {}; every head must have the same width",
                    self.heads, self.hidden
                ),
            ));
        }
        if self.heads % self.kv_heads != 0 {
            return Err(invalid(
                name,
                &key("kv-heads"),
                format!("{} key/value heads do not divide the {} query heads", self.kv_heads, self.heads),
            ));
        }
        if let Positions::Learned { max_positions } = self.positions
            && self.sequence > max_positions
        {
            return Err(invalid(
                name,
                &key("sequence"),
                format!("{} tokens but only {max_positions} learned positions", self.sequence),
            ));
        }
        if let Some(moe) = self.moe
            && (moe.experts == 0 || moe.top_k == 0 || moe.top_k > moe.experts)
        {
            return Err(invalid(
                name,
                &key("top-k"),
                format!("top-k {} with {} experts; need 1 <= top-k <= experts", moe.top_k, moe.experts),
            ));
        }
        Ok(())
    }

    fn norm(&self) -> LayerKind {
        match self.norm {
            Norm::LayerNorm => LayerKind::LayerNorm { bias: true },
            Norm::RmsNorm => LayerKind::RmsNorm,
        }
    }

    /// Builds the network, named `name`, described as `description`.
    pub fn build(&self, name: &str, description: &str) -> Result<Model, ModelError> {
        self.validate(name)?;
        let h = self.hidden;
        let head_dim = h / self.heads;
        let mut b = ModelBuilder::new(name, Shape::from([self.sequence]));
        b.describe(self.family, description);
        b.layer("embedding", LayerKind::Embedding { vocabulary: self.vocabulary, dim: h })?;
        if let Positions::Learned { max_positions } = self.positions {
            b.layer("position-embedding", LayerKind::AddEmbedding { rows: max_positions, positional: true })?;
        }
        if self.token_types > 0 {
            b.layer(
                "token-type-embedding",
                LayerKind::AddEmbedding { rows: self.token_types, positional: false },
            )?;
        }
        if !self.pre_norm {
            b.layer("embedding.norm", self.norm())?;
        }
        if self.hidden_dropout {
            b.layer("embedding.dropout", LayerKind::Dropout)?;
        }
        let qkv_width = (self.heads + 2 * self.kv_heads) * head_dim;
        for i in 0..self.layers {
            let p = format!("layers.{i}");
            // Attention block.
            let residual = b.shape().clone();
            if self.pre_norm {
                b.layer(format!("{p}.norm1"), self.norm())?;
            }
            b.layer(
                format!("{p}.attention.qkv"),
                LayerKind::Linear { out_features: qkv_width, bias: self.bias },
            )?;
            if self.positions == Positions::Rope {
                b.layer(
                    format!("{p}.attention.rope"),
                    LayerKind::Rope { heads: self.heads, kv_heads: self.kv_heads },
                )?;
            }
            let core = LayerKind::Attention {
                heads: self.heads,
                kv_heads: self.kv_heads,
                causal: self.causal,
                implementation: self.attention,
                dropout: self.attention_dropout,
            };
            b.layer(format!("{p}.attention.core"), core)?;
            b.layer(format!("{p}.attention.proj"), LayerKind::Linear { out_features: h, bias: self.bias })?;
            if self.hidden_dropout {
                b.layer(format!("{p}.attention.dropout"), LayerKind::Dropout)?;
            }
            b.add(format!("{p}.add1"), &residual)?;
            if !self.pre_norm {
                b.layer(format!("{p}.norm1"), self.norm())?;
            }
            // Feed-forward block.
            let residual = b.shape().clone();
            if self.pre_norm {
                b.layer(format!("{p}.norm2"), self.norm())?;
            }
            match self.moe {
                Some(moe) => {
                    let normed = b.shape().clone();
                    b.layer(
                        format!("{p}.moe.router"),
                        LayerKind::MoeRouter { experts: moe.experts, top_k: moe.top_k },
                    )?;
                    b.branch_from(normed);
                    let experts = LayerKind::MoeExperts {
                        experts: moe.experts,
                        top_k: moe.top_k,
                        ffn_hidden: self.ffn_hidden,
                        activation: match self.mlp {
                            Mlp::Gelu => Activation::Gelu,
                            Mlp::SwiGlu => Activation::Silu,
                        },
                        gated: self.mlp == Mlp::SwiGlu,
                        bias: self.bias,
                    };
                    b.layer(format!("{p}.moe.experts"), experts)?;
                }
                None => match self.mlp {
                    Mlp::Gelu => {
                        b.layer(
                            format!("{p}.mlp.fc1"),
                            LayerKind::Linear { out_features: self.ffn_hidden, bias: self.bias },
                        )?;
                        b.layer(
                            format!("{p}.mlp.gelu"),
                            LayerKind::Activation { function: Activation::Gelu },
                        )?;
                        b.layer(
                            format!("{p}.mlp.fc2"),
                            LayerKind::Linear { out_features: h, bias: self.bias },
                        )?;
                    }
                    Mlp::SwiGlu => {
                        let gate_up =
                            LayerKind::Linear { out_features: 2 * self.ffn_hidden, bias: self.bias };
                        b.layer(format!("{p}.mlp.gate-up"), gate_up)?;
                        b.layer(format!("{p}.mlp.swiglu"), LayerKind::Glu { function: Activation::Silu })?;
                        b.layer(
                            format!("{p}.mlp.down"),
                            LayerKind::Linear { out_features: h, bias: self.bias },
                        )?;
                    }
                },
            }
            if self.hidden_dropout {
                b.layer(format!("{p}.mlp.dropout"), LayerKind::Dropout)?;
            }
            b.add(format!("{p}.add2"), &residual)?;
            if !self.pre_norm {
                b.layer(format!("{p}.norm2"), self.norm())?;
            }
        }
        match self.head {
            Head::LanguageModel { tied } => {
                if self.pre_norm {
                    b.layer("final-norm", self.norm())?;
                }
                if tied {
                    b.tied_linear("logits", self.vocabulary, false, "embedding")?;
                } else {
                    b.layer("logits", LayerKind::Linear { out_features: self.vocabulary, bias: false })?;
                }
                b.layer("loss", LayerKind::CrossEntropy { kernels: self.loss })?;
            }
            Head::BertPretraining => {
                let encoded = b.shape().clone();
                b.layer("mlm.transform", LayerKind::Linear { out_features: h, bias: true })?;
                b.layer("mlm.gelu", LayerKind::Activation { function: Activation::Gelu })?;
                b.layer("mlm.norm", self.norm())?;
                b.tied_linear("mlm.decoder", self.vocabulary, true, "embedding")?;
                b.layer("mlm.loss", LayerKind::CrossEntropy { kernels: self.loss })?;
                b.branch_from(encoded);
                b.layer("pooler.first-token", LayerKind::Slice { axis: 0, start: 0, length: 1 })?;
                b.layer("pooler.dense", LayerKind::Linear { out_features: h, bias: true })?;
                b.layer("pooler.tanh", LayerKind::Activation { function: Activation::Tanh })?;
                b.layer("nsp.classifier", LayerKind::Linear { out_features: 2, bias: true })?;
                b.layer("nsp.loss", LayerKind::CrossEntropy { kernels: self.loss })?;
            }
        }
        Ok(b.finish())
    }
}

/// Megatron-LM's parameter count, Eq. 2 of Narayanan et al. 2021:
/// `P = 12 l h^2 (1 + 13 / (12 h) + (V + s) / (12 l h))`.
pub fn megatron_parameters(layers: u64, hidden: u64, vocabulary: u64, sequence: u64) -> f64 {
    let (l, h, v, s) = (layers as f64, hidden as f64, vocabulary as f64, sequence as f64);
    12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (v + s) / (12.0 * l * h))
}

/// Megatron-LM's default dropout probabilities, `--attention-dropout` and `--hidden-dropout`
/// (`megatron/arguments.py`, `_add_regularization_args`, 0.1 each in the 2021 code the SC'21
/// runs used, commit de7dc40f88 of NVIDIA/Megatron-LM; `examples/sc21/CONFIG.sh` does not
/// override them).
pub const MEGATRON_DROPOUT: f64 = 0.1;

/// A GPT, the `[gpt]` section of a model file (Megatron-LM's layout: learned positions, pre-norm
/// layer norm, GELU MLP of 4h, biases, output layer tied to the embeddings, dropout on the
/// attention probabilities and the hidden states).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Gpt {
    /// Transformer layers `l`.
    pub layers: u64,
    /// Hidden size `h`.
    pub hidden: u64,
    /// Attention heads.
    pub heads: u64,
    /// Tokens per sample `s` (also the learned position table's size unless `max-positions`
    /// says otherwise). Default 2048.
    #[serde(default)]
    pub sequence: Option<u64>,
    /// Rows of the learned position table. Default: `sequence`.
    #[serde(default)]
    pub max_positions: Option<u64>,
    /// Vocabulary `V`. Default 51,200 (GPT-2's 50,257 padded as Megatron-LM does).
    #[serde(default)]
    pub vocabulary: Option<u64>,
    /// Feed-forward hidden size. Default `4h`.
    #[serde(default)]
    pub ffn_hidden: Option<u64>,
    /// Key/value heads (grouped-query attention). Default: `heads`.
    #[serde(default)]
    pub kv_heads: Option<u64>,
    /// `"standard"` (default, as Megatron-LM's 2021 runs), `"flash"` or `"math"` (separate
    /// PyTorch operators, as nanoGPT writes it).
    #[serde(default)]
    pub attention: Option<String>,
    /// Dropout layers at all: `false` removes both kinds whatever their probabilities.
    /// Default true.
    #[serde(default)]
    pub dropout: Option<bool>,
    /// Dropout probability on the attention probabilities, in [0, 1); 0 runs no dropout.
    /// Default 0.1 ([`MEGATRON_DROPOUT`]).
    #[serde(default)]
    pub attention_dropout: Option<f64>,
    /// Dropout probability on the hidden states (after the embeddings, the attention
    /// projection and the MLP), in [0, 1); 0 runs no dropout. Default 0.1.
    #[serde(default)]
    pub hidden_dropout: Option<f64>,
    /// Output layer tied to the word embeddings. Default true.
    #[serde(default)]
    pub tied_embeddings: Option<bool>,
    /// The loss's kernels: `"megatron"` (default: Megatron-LM's vocabulary-parallel
    /// cross-entropy on the logits cast to fp32, as without `--fp16-lm-cross-entropy`) or
    /// `"fused"` (one kernel per pass in the compute dtype).
    #[serde(default)]
    pub loss: Option<String>,
    /// The MLP: `"gelu"` (default) or `"swiglu"` (Megatron-LM's `--swiglu`: gate and up
    /// projections fused into one `h -> 2 ffn` product, SiLU-gated).
    #[serde(default)]
    pub mlp: Option<String>,
    /// Token positions: `"learned"` (default: a table of `max-positions` rows) or `"rope"`
    /// (Megatron-LM's `--position-embedding-type rope`: rotary embeddings on the queries and
    /// keys of every layer, no table).
    #[serde(default)]
    pub positions: Option<String>,
    /// Biases on the linear layers. Default true; `false` is Megatron-LM's
    /// `--disable-bias-linear`.
    #[serde(default)]
    pub bias: Option<bool>,
    /// Experts per layer: every feed-forward block a mixture of experts of `ffn-hidden` each
    /// (Megatron-LM's `--num-experts`, with `--moe-ffn-hidden-size` equal to `ffn-hidden`).
    /// Needs `top-k`. Default: none (dense MLPs).
    #[serde(default)]
    pub experts: Option<u64>,
    /// Experts each token is routed to (Megatron-LM's `--moe-router-topk`).
    #[serde(default)]
    pub top_k: Option<u64>,
}

impl Gpt {
    /// The transformer this section describes.
    pub fn transformer(&self, name: &str) -> Result<Transformer, ModelError> {
        let sequence = self.sequence.unwrap_or(2048);
        let enabled = self.dropout.unwrap_or(true);
        // The probability only decides whether the kernels run: their cost does not depend on it.
        let dropout = |key: &str, given: Option<f64>| -> Result<bool, ModelError> {
            let probability = given.unwrap_or(MEGATRON_DROPOUT);
            if !(0.0..1.0).contains(&probability) {
                return Err(invalid(name, &format!("gpt.{key}"), format!("{probability} is not in [0, 1)")));
            }
            Ok(enabled && probability > 0.0)
        };
        Ok(Transformer {
            family: "gpt",
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads.unwrap_or(self.heads),
            ffn_hidden: self.ffn_hidden.unwrap_or(4 * self.hidden),
            sequence,
            vocabulary: self.vocabulary.unwrap_or(51_200),
            token_types: 0,
            norm: Norm::LayerNorm,
            pre_norm: true,
            mlp: match self.mlp.as_deref() {
                None | Some("gelu") => Mlp::Gelu,
                Some("swiglu") => Mlp::SwiGlu,
                Some(other) => {
                    return Err(invalid(name, "gpt.mlp", format!("{other:?} is not \"gelu\" or \"swiglu\"")));
                }
            },
            positions: match self.positions.as_deref() {
                None | Some("learned") => {
                    Positions::Learned { max_positions: self.max_positions.unwrap_or(sequence) }
                }
                Some("rope") if self.max_positions.is_none() => Positions::Rope,
                Some("rope") => {
                    return Err(invalid(
                        name,
                        "gpt.max-positions",
                        "rotary positions have no table to size".into(),
                    ));
                }
                Some(other) => {
                    return Err(invalid(
                        name,
                        "gpt.positions",
                        format!("{other:?} is not \"learned\" or \"rope\""),
                    ));
                }
            },
            bias: self.bias.unwrap_or(true),
            hidden_dropout: dropout("hidden-dropout", self.hidden_dropout)?,
            attention_dropout: dropout("attention-dropout", self.attention_dropout)?,
            causal: true,
            attention: attention_kernel(name, "gpt", self.attention.as_deref(), AttentionKernel::Standard)?,
            moe: match (self.experts, self.top_k) {
                (None, None) => None,
                (Some(experts), Some(top_k)) => Some(Moe { experts, top_k }),
                (Some(_), None) | (None, Some(_)) => {
                    return Err(invalid(
                        name,
                        if self.experts.is_none() { "gpt.experts" } else { "gpt.top-k" },
                        "a mixture of experts needs both `experts` and `top-k`".to_string(),
                    ));
                }
            },
            head: Head::LanguageModel { tied: self.tied_embeddings.unwrap_or(true) },
            loss: match self.loss.as_deref() {
                None => LossKernels::Megatron,
                Some(given) => {
                    LossKernels::parse(given).map_err(|message| invalid(name, "gpt.loss", message))?
                }
            },
        })
    }

    /// Builds the network, named `name`.
    pub fn build(&self, name: &str) -> Result<Model, ModelError> {
        let t = self.transformer(name)?;
        let experts =
            t.moe.map(|moe| format!(", {} experts (top-{})", moe.experts, moe.top_k)).unwrap_or_default();
        let description = format!(
            "GPT: {} layers, hidden {}, {} heads, {} tokens, vocabulary {}{experts}",
            t.layers, t.hidden, t.heads, t.sequence, t.vocabulary
        );
        t.build(name, &description)
    }
}

/// BERT, the `[bert]` section of a model file (Devlin et al. 2019; post-norm, GELU, learned
/// positions, two segment types, pre-training heads as Hugging Face's `BertForPreTraining`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Bert {
    /// Transformer layers.
    pub layers: u64,
    /// Hidden size.
    pub hidden: u64,
    /// Attention heads.
    pub heads: u64,
    /// Tokens per sample. Default 512.
    #[serde(default)]
    pub sequence: Option<u64>,
    /// Vocabulary. Default 30,522 (uncased WordPiece).
    #[serde(default)]
    pub vocabulary: Option<u64>,
    /// Learned positions. Default 512.
    #[serde(default)]
    pub max_positions: Option<u64>,
    /// Feed-forward hidden size. Default `4h`.
    #[serde(default)]
    pub ffn_hidden: Option<u64>,
    /// `"standard"` (default), `"flash"` or `"math"`.
    #[serde(default)]
    pub attention: Option<String>,
}

impl Bert {
    /// Builds the network, named `name`.
    pub fn build(&self, name: &str) -> Result<Model, ModelError> {
        let t = Transformer {
            family: "bert",
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.heads,
            ffn_hidden: self.ffn_hidden.unwrap_or(4 * self.hidden),
            sequence: self.sequence.unwrap_or(512),
            vocabulary: self.vocabulary.unwrap_or(30_522),
            token_types: 2,
            norm: Norm::LayerNorm,
            pre_norm: false,
            mlp: Mlp::Gelu,
            positions: Positions::Learned { max_positions: self.max_positions.unwrap_or(512) },
            bias: true,
            hidden_dropout: true,
            // Hugging Face's BertSelfAttention drops attention probabilities too; kept off so
            // that BERT's costs stay as they were (not validated against a measurement yet).
            attention_dropout: false,
            causal: false,
            attention: attention_kernel(name, "bert", self.attention.as_deref(), AttentionKernel::Standard)?,
            moe: None,
            head: Head::BertPretraining,
            loss: LossKernels::Fused,
        };
        let description = format!(
            "BERT with pre-training heads: {} layers, hidden {}, {} heads, {} tokens",
            t.layers, t.hidden, t.heads, t.sequence
        );
        t.build(name, &description)
    }
}

/// Llama 2/3, the `[llama]` section of a model file (RMS norm, SwiGLU, rotary embeddings,
/// grouped-query attention, no biases, untied output layer, flash attention), and, with
/// `experts` and `top-k`, a Mixtral-style mixture of experts (the `[mixtral]` section).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Llama {
    /// Transformer layers.
    pub layers: u64,
    /// Hidden size.
    pub hidden: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads. Default: `heads`.
    #[serde(default)]
    pub kv_heads: Option<u64>,
    /// Feed-forward hidden size (of each expert).
    pub ffn_hidden: u64,
    /// Tokens per sample.
    pub sequence: u64,
    /// Vocabulary.
    pub vocabulary: u64,
    /// `"flash"` (default), `"standard"` or `"math"`.
    #[serde(default)]
    pub attention: Option<String>,
    /// Output layer tied to the embeddings. Default false.
    #[serde(default)]
    pub tied_embeddings: Option<bool>,
    /// Experts per layer (Mixtral only).
    #[serde(default)]
    pub experts: Option<u64>,
    /// Experts per token (Mixtral only).
    #[serde(default)]
    pub top_k: Option<u64>,
}

impl Llama {
    /// Builds the network, named `name`; `family` is `"llama"` or `"mixtral"`.
    pub fn build(&self, name: &str, family: &'static str) -> Result<Model, ModelError> {
        let moe = match (family, self.experts, self.top_k) {
            ("mixtral", Some(experts), Some(top_k)) => Some(Moe { experts, top_k }),
            ("mixtral", _, _) => {
                return Err(invalid(
                    name,
                    "mixtral.experts",
                    "a mixture of experts needs both `experts` and `top-k`".to_string(),
                ));
            }
            (_, None, None) => None,
            (_, _, _) => {
                return Err(invalid(
                    name,
                    &format!("{family}.experts"),
                    "`experts` and `top-k` belong in a [mixtral] section".to_string(),
                ));
            }
        };
        let t = Transformer {
            family,
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads.unwrap_or(self.heads),
            ffn_hidden: self.ffn_hidden,
            sequence: self.sequence,
            vocabulary: self.vocabulary,
            token_types: 0,
            norm: Norm::RmsNorm,
            pre_norm: true,
            mlp: Mlp::SwiGlu,
            positions: Positions::Rope,
            bias: false,
            hidden_dropout: false,
            attention_dropout: false,
            causal: true,
            attention: attention_kernel(name, family, self.attention.as_deref(), AttentionKernel::Flash)?,
            moe,
            head: Head::LanguageModel { tied: self.tied_embeddings.unwrap_or(false) },
            loss: LossKernels::Fused,
        };
        let experts =
            moe.map(|moe| format!(", {} experts (top-{})", moe.experts, moe.top_k)).unwrap_or_default();
        let description = format!(
            "{}: {} layers, hidden {}, {} heads ({} key/value), FFN {}{experts}, {} tokens, vocabulary {}",
            if moe.is_some() { "Mixtral-style MoE" } else { "Llama" },
            t.layers,
            t.hidden,
            t.heads,
            t.kv_heads,
            t.ffn_hidden,
            t.sequence,
            t.vocabulary
        );
        t.build(name, &description)
    }
}

fn attention_kernel(
    name: &str,
    family: &str,
    given: Option<&str>,
    default: AttentionKernel,
) -> Result<AttentionKernel, ModelError> {
    match given {
        None => Ok(default),
        Some("standard") => Ok(AttentionKernel::Standard),
        Some("flash") => Ok(AttentionKernel::Flash),
        Some("math") => Ok(AttentionKernel::Math),
        Some(other) => Err(invalid(
            name,
            &format!("{family}.attention"),
            format!("{other:?}; use \"standard\", \"flash\" or \"math\""),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt(layers: u64, hidden: u64, heads: u64) -> Gpt {
        Gpt {
            layers,
            hidden,
            heads,
            sequence: None,
            max_positions: None,
            vocabulary: None,
            ffn_hidden: None,
            kv_heads: None,
            attention: None,
            dropout: None,
            attention_dropout: None,
            hidden_dropout: None,
            tied_embeddings: None,
            loss: None,
            mlp: None,
            positions: None,
            bias: None,
            experts: None,
            top_k: None,
        }
    }

    /// `[gpt]`'s Megatron-LM switches: `--swiglu` gates a fused `h -> 2 ffn` product (more
    /// parameters than the GELU MLP at the same `ffn-hidden`), `--position-embedding-type rope`
    /// drops the position table, `--disable-bias-linear` drops the linear biases, and a value
    /// outside the valid ones is an error naming the key.
    #[test]
    fn gpt_switches_change_the_parameters_as_megatron_does() {
        let base = gpt(2, 512, 8);
        let params = |g: &Gpt| g.build("t").unwrap().parameters();
        let plain = params(&base);
        let swiglu = Gpt { mlp: Some("swiglu".into()), ..base.clone() };
        // One more h x ffn matrix per layer (and its bias).
        assert_eq!(params(&swiglu) - plain, 2 * (512 * 2048 + 2048));
        let rope = Gpt { positions: Some("rope".into()), ..base.clone() };
        assert_eq!(plain - params(&rope), 2048 * 512);
        let no_bias = Gpt { bias: Some(false), ..base.clone() };
        assert!(params(&no_bias) < plain);
        for (bad, key) in [
            (Gpt { mlp: Some("relu".into()), ..base.clone() }, "gpt.mlp"),
            (Gpt { positions: Some("alibi".into()), ..base.clone() }, "gpt.positions"),
            (
                Gpt { positions: Some("rope".into()), max_positions: Some(4096), ..base.clone() },
                "gpt.max-positions",
            ),
        ] {
            let message = bad.build("t").unwrap_err().to_string();
            assert!(message.contains(key), "{message}");
        }
    }

    /// `[gpt]`'s `experts` and `top-k` (Megatron-LM's `--num-experts`, `--moe-router-topk`):
    /// every MLP becomes a bank of `experts` MLPs of `ffn-hidden` behind a router of `hidden x
    /// experts` weights, and one without the other is an error naming the key.
    #[test]
    fn gpt_experts_replace_every_mlp_with_a_bank_of_them() {
        let base = Gpt { bias: Some(false), ..gpt(2, 512, 8) };
        let params = |g: &Gpt| g.build("t").unwrap().parameters();
        let moe = Gpt { experts: Some(4), top_k: Some(2), ..base.clone() };
        let (h, ffn, e, layers) = (512, 2048, 4, 2);
        assert_eq!(params(&moe) - params(&base), layers * ((e - 1) * 2 * h * ffn + h * e));
        // Top-2 routing: twice the expert FLOPs of top-1, the same parameters.
        let top1 = Gpt { top_k: Some(1), ..moe.clone() };
        assert_eq!(params(&top1), params(&moe));
        let expert_macs = |g: &Gpt| -> f64 {
            let model = g.build("t").unwrap();
            model
                .layers
                .iter()
                .filter(|l| matches!(l.kind, LayerKind::MoeExperts { .. }))
                .map(|l| l.cost.macs)
                .sum()
        };
        assert_eq!(expert_macs(&moe), 2.0 * expert_macs(&top1));
        let message = Gpt { experts: Some(4), ..base.clone() }.build("t").unwrap_err().to_string();
        assert!(message.contains("gpt.top-k"), "{message}");
        let message = Gpt { top_k: Some(2), ..base }.build("t").unwrap_err().to_string();
        assert!(message.contains("gpt.experts"), "{message}");
    }

    #[test]
    fn gpt_parameters_follow_megatrons_formula() {
        let model = gpt(24, 2304, 24).build("gpt-1.7b").unwrap();
        let formula = megatron_parameters(24, 2304, 51_200, 2048);
        // Ours adds the final layer norm (2h) that the formula leaves out.
        assert_eq!(model.parameters() as f64, formula + 2.0 * 2304.0);
        assert_eq!(model.output(), &Shape(vec![]));
        assert_eq!(
            model.layer("logits").map(|layer| layer.output.clone()),
            Some(Shape::from([2048, 51_200]))
        );
    }

    #[test]
    fn gpt_forward_flops_match_megatrons_count() {
        // Megatron-LM's accounting (Eq. 3 is 4 forwards with recomputation): one forward is
        // 24 B s l h^2 (1 + s / (6h) + V / (12 l h)) FLOPs, matrix products only.
        let (l, h, s, v) = (24.0, 2304.0, 2048.0, 51_200.0);
        let model = gpt(24, 2304, 24).build("gpt-1.7b").unwrap();
        let expected_macs = 12.0 * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h));
        let ratio = model.macs_per_sample() / expected_macs;
        assert!((ratio - 1.0).abs() < 1e-9, "{ratio}");
    }

    #[test]
    fn heads_must_divide_the_hidden_size() {
        let error = gpt(2, 1000, 3).build("odd").unwrap_err().to_string();
        assert!(error.contains("gpt.heads") && error.contains("1000"), "{error}");
        let error = Gpt { kv_heads: Some(5), ..gpt(2, 1024, 16) }.build("odd").unwrap_err().to_string();
        assert!(error.contains("gpt.kv-heads"), "{error}");
        let error = Gpt { attention: Some("fast".to_string()), ..gpt(2, 1024, 16) }
            .build("odd")
            .unwrap_err()
            .to_string();
        assert!(error.contains("gpt.attention") && error.contains("\"flash\""), "{error}");
        let error =
            Gpt { loss: Some("fp16".to_string()), ..gpt(2, 1024, 16) }.build("odd").unwrap_err().to_string();
        assert!(error.contains("gpt.loss") && error.contains("\"megatron\""), "{error}");
    }

    /// The GPT's loss is Megatron-LM's fp32 cross-entropy unless the model file says "fused".
    #[test]
    fn gpt_loss_is_megatrons_unless_fused() {
        let kernels = |gpt: Gpt| match gpt.build("g").unwrap().layers.last().map(|l| l.kind.clone()) {
            Some(LayerKind::CrossEntropy { kernels }) => kernels,
            other => panic!("{other:?}"),
        };
        assert_eq!(kernels(gpt(2, 1024, 16)), LossKernels::Megatron);
        assert_eq!(kernels(Gpt { loss: Some("fused".to_string()), ..gpt(2, 1024, 16) }), LossKernels::Fused);
    }

    #[test]
    fn bert_large_counts() {
        let spec = Bert {
            layers: 24,
            hidden: 1024,
            heads: 16,
            sequence: None,
            vocabulary: None,
            max_positions: None,
            ffn_hidden: None,
            attention: None,
        };
        let model = spec.build("bert-large").unwrap();
        // Hugging Face BertForPreTraining (bert-large-uncased): 336,226,108; BertModel (no
        // pre-training heads, with the pooler): 335,141,888.
        assert_eq!(model.parameters(), 336_226_108);
        let heads: u64 = model
            .layers
            .iter()
            .filter(|layer| layer.name.starts_with("mlm.") || layer.name.starts_with("nsp."))
            .map(|layer| layer.cost.params)
            .sum();
        assert_eq!(model.parameters() - heads, 335_141_888);
    }

    #[test]
    fn llama_and_mixtral_counts() {
        let llama = Llama {
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: None,
            ffn_hidden: 11008,
            sequence: 4096,
            vocabulary: 32_000,
            attention: None,
            tied_embeddings: None,
            experts: None,
            top_k: None,
        };
        // Llama-2-7B: 6,738,415,616 (Hugging Face meta-llama/Llama-2-7b-hf).
        assert_eq!(llama.build("llama2-7b", "llama").unwrap().parameters(), 6_738_415_616);
        let mixtral =
            Llama { kv_heads: Some(8), ffn_hidden: 14336, experts: Some(8), top_k: Some(2), ..llama.clone() };
        // Mixtral-8x7B: 46,702,792,704.
        let model = mixtral.build("mixtral-8x7b", "mixtral").unwrap();
        assert_eq!(model.parameters(), 46_702_792_704);
        let error = mixtral.build("mixtral", "llama").unwrap_err().to_string();
        assert!(error.contains("[mixtral]"), "{error}");
    }
}
