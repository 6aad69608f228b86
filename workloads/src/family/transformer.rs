//! Transformers: GPT (Megatron-LM's layout), BERT, Llama, Mixtral-style mixtures of experts and
//! DeepSeek-style ones (fine-grained routed experts, shared experts, dense leading layers,
//! multi-head latent attention), all built by one parametric [`Transformer`].
//!
//! Per-sample shapes are `[tokens, features]`. A layer is laid out as the fused kernels of
//! Megatron-LM: a fused QKV projection writing `[tokens, (heads + 2 kv_heads) head_dim]`, rotary
//! embeddings (if any) on it, the attention core ([`LayerKind::Attention`]), the output
//! projection, then the MLP (one `h -> ffn` projection, or a fused gate-and-up `h -> 2 ffn`
//! projection followed by a SwiGLU for Llama). Names: `layers.<i>.attention.qkv`,
//! `layers.<i>.mlp.fc1`, ...; a mixture of experts is `layers.<i>.moe.router` and
//! `layers.<i>.moe.experts` (with `layers.<i>.moe.shared.*` for shared experts), latent attention
//! `layers.<i>.attention.q-down`, `q-norm`, `kv-down`, `kv-latent`, `kv-norm`, `q-up`, `kv-up`,
//! `qkv` (the packing), `core`, `proj`.
//!
//! Parameter counts: GPT's are `12 l h^2 + 13 l h + (V + s) h` (Megatron-LM's Eq. 2) plus the
//! final layer norm's `2h`; its output layer is tied to the word embeddings.

use serde::Deserialize;

use crate::family::invalid;
use crate::layer::{Activation, AttentionKernel, LayerKind, LossKernels, RopeKernels, Shape};
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
    /// `h -> 2 ffn` (gate and up, fused), GELU-gated, `ffn -> h` (Grok-1's experts:
    /// `dense(gelu(w1 x) * v x)`).
    GeGlu,
    /// `h -> ffn`, squared ReLU, `ffn -> h` (Primer; modded-nanogpt's MLP from 2024-10-14).
    Relu2,
}

impl Mlp {
    /// The activation of the (gated) projection.
    fn activation(self) -> Activation {
        match self {
            Mlp::Gelu | Mlp::GeGlu => Activation::Gelu,
            Mlp::SwiGlu => Activation::Silu,
            Mlp::Relu2 => Activation::ReluSquared,
        }
    }

    /// Whether a second input projection gates the activation.
    fn gated(self) -> bool {
        matches!(self, Mlp::SwiGlu | Mlp::GeGlu)
    }
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
    /// Routed experts per layer.
    pub experts: u64,
    /// Routed experts per token.
    pub top_k: u64,
    /// Hidden size of each routed expert (Megatron-Core's `--moe-ffn-hidden-size`): the dense
    /// FFN's for Mixtral, narrower for fine-grained experts (DeepSeek-V3: 2,048 against 18,432).
    pub ffn_hidden: u64,
    /// Shared experts run on every token beside the routed ones (DeepSeek, Qwen2-MoE): one
    /// dense MLP of `shared_experts x ffn_hidden`, as Megatron-Core's `SharedExpertMLP`.
    pub shared_experts: u64,
    /// The first layers keep a dense feed-forward block of the transformer's `ffn_hidden`
    /// (DeepSeek-V3's `first_k_dense_replace`): no router, no dispatch.
    pub dense_layers: u64,
}

/// Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1; DeepSeek-V3): the
/// queries and the keys and values are projected down to low-rank latents, normalized and
/// projected back up per head; a decoupled rotary key of `qk_rope_head_dim` is shared by all
/// heads. Every head has its own key and value (no grouping).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LatentAttention {
    /// Rank of the query latent (`q_lora_rank`); none: queries projected directly from the
    /// hidden states (DeepSeek-V2-Lite).
    #[serde(default)]
    pub q_lora_rank: Option<u64>,
    /// Rank of the key/value latent (`kv_lora_rank`).
    pub kv_lora_rank: u64,
    /// Per-head query/key width without rotary embedding (`qk_nope_head_dim`).
    pub qk_nope_head_dim: u64,
    /// Per-head query/key width with rotary embedding (`qk_rope_head_dim`); the key's is one
    /// projection shared by every head.
    pub qk_rope_head_dim: u64,
    /// Per-head value width (`v_head_dim`).
    pub v_head_dim: u64,
}

/// A transformer, every knob explicit; the model-file sections (`[gpt]`, `[bert]`, `[llama]`,
/// `[mixtral]`, `[moe]`) fill in their family's defaults.
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
    /// Width of each attention head; `None`: `hidden / heads` (which must divide). Qwen3's
    /// MoE models use 128 with `heads x 128` wider than the hidden size.
    pub head_dim: Option<u64>,
    /// Multi-head latent attention in place of the fused QKV projection; `heads` are its
    /// heads and `kv_heads` must equal them.
    pub latent: Option<LatentAttention>,
    /// Hidden size of the dense feed-forward blocks (and of each expert, unless [`Moe`] gives
    /// its own).
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
    /// A norm also on each sub-block's output before the residual add (Grok-1's four norms
    /// per layer).
    pub sandwich_norm: bool,
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
    /// Mixture of experts in place of every feed-forward block (but the leading
    /// [`Moe::dense_layers`]).
    pub moe: Option<Moe>,
    /// The output head.
    pub head: Head,
    /// How its cross-entropy losses run.
    pub loss: LossKernels,
    /// How its rotary embeddings run (with [`Positions::Rope`]).
    pub rope: RopeKernels,
    /// QK-norm: a weightless RMS norm of each query and key head after the rotation
    /// ([`LayerKind::QkNorm`]).
    pub qk_norm: bool,
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
        if self.head_dim.is_none() && self.latent.is_none() && self.hidden % self.heads != 0 {
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
        if let Some(moe) = self.moe {
            if moe.ffn_hidden == 0 {
                return Err(invalid(name, &key("moe-ffn-hidden"), "must be at least 1".to_string()));
            }
            if moe.dense_layers >= self.layers {
                return Err(invalid(
                    name,
                    &key("dense-layers"),
                    format!(
                        "{} dense layers of {} leave no mixture-of-experts layer; valid: 0 to {}",
                        moe.dense_layers,
                        self.layers,
                        self.layers - 1
                    ),
                ));
            }
        }
        if self.head_dim == Some(0) {
            return Err(invalid(name, &key("head-dim"), "must be at least 1".to_string()));
        }
        if let Some(latent) = self.latent {
            let latent_key = |field: &str| key(&format!("latent-attention.{field}"));
            for (field, value) in [
                ("q-lora-rank", latent.q_lora_rank.unwrap_or(1)),
                ("kv-lora-rank", latent.kv_lora_rank),
                ("qk-nope-head-dim", latent.qk_nope_head_dim),
                ("qk-rope-head-dim", latent.qk_rope_head_dim),
                ("v-head-dim", latent.v_head_dim),
            ] {
                if value == 0 {
                    return Err(invalid(name, &latent_key(field), "must be at least 1".to_string()));
                }
            }
            if self.kv_heads != self.heads || self.head_dim.is_some() {
                return Err(invalid(
                    name,
                    &key(if self.head_dim.is_some() { "head-dim" } else { "kv-heads" }),
                    "latent attention gives every head its own key and value of the widths in \
                     [latent-attention]; remove the key"
                        .to_string(),
                ));
            }
        }
        Ok(())
    }

    fn norm(&self) -> LayerKind {
        match self.norm {
            Norm::LayerNorm => LayerKind::LayerNorm { bias: true },
            Norm::RmsNorm => LayerKind::RmsNorm,
        }
    }

    /// A dense feed-forward block of `width` named `prefix.*`: `fc1`, GELU, `fc2`, or a fused
    /// gate-and-up projection, the gated activation and `down`.
    fn dense_mlp(&self, b: &mut ModelBuilder, prefix: &str, width: u64) -> Result<(), ModelError> {
        let h = self.hidden;
        match self.mlp {
            Mlp::Gelu | Mlp::Relu2 => {
                let function = self.mlp.activation();
                b.layer(format!("{prefix}.fc1"), LayerKind::Linear { out_features: width, bias: self.bias })?;
                b.layer(format!("{prefix}.{}", function.name()), LayerKind::Activation { function })?;
                b.layer(format!("{prefix}.fc2"), LayerKind::Linear { out_features: h, bias: self.bias })?;
            }
            Mlp::SwiGlu | Mlp::GeGlu => {
                let gate_up = LayerKind::Linear { out_features: 2 * width, bias: self.bias };
                b.layer(format!("{prefix}.gate-up"), gate_up)?;
                let glu = if self.mlp == Mlp::SwiGlu { "swiglu" } else { "geglu" };
                b.layer(format!("{prefix}.{glu}"), LayerKind::Glu { function: self.mlp.activation() })?;
                b.layer(format!("{prefix}.down"), LayerKind::Linear { out_features: h, bias: self.bias })?;
            }
        }
        Ok(())
    }

    /// Multi-head latent attention up to its core, named `prefix.attention.*`, as
    /// DeepSeek-V3's `DeepseekV3Attention` computes it: the query down-projection, its norm
    /// and up-projection to `heads x (nope + rope)`; the key/value down-projection to the latent
    /// and the shared rotary key (`kv_lora_rank + rope`), the latent's norm and its
    /// up-projection to `heads x (nope + v)`; the queries, keys (the rotary key broadcast to
    /// every head) and values packed for the core, whose query/key heads are `nope + rope`
    /// wide and value heads `v`. The down-projections and norms come first so that a tensor
    /// split sees them on whole rows (Megatron-Core duplicates them) and both up-projections
    /// as column-parallel. The rotary embedding of the `rope` columns (under 0.01% of the
    /// layer's FLOPs) is not priced.
    fn latent_attention(
        &self,
        b: &mut ModelBuilder,
        p: &str,
        latent: LatentAttention,
    ) -> Result<(), ModelError> {
        let heads = self.heads;
        let qk_dim = latent.qk_nope_head_dim + latent.qk_rope_head_dim;
        let normed = b.shape().clone();
        let query_latent = match latent.q_lora_rank {
            Some(rank) => {
                b.layer(
                    format!("{p}.attention.q-down"),
                    LayerKind::Linear { out_features: rank, bias: false },
                )?;
                Some(b.layer(format!("{p}.attention.q-norm"), self.norm())?.clone())
            }
            None => None,
        };
        b.branch_from(normed.clone());
        let down = latent.kv_lora_rank + latent.qk_rope_head_dim;
        b.layer(format!("{p}.attention.kv-down"), LayerKind::Linear { out_features: down, bias: false })?;
        b.layer(
            format!("{p}.attention.kv-latent"),
            LayerKind::Slice { axis: 1, start: 0, length: latent.kv_lora_rank },
        )?;
        let kv_latent = b.layer(format!("{p}.attention.kv-norm"), self.norm())?.clone();
        b.branch_from(query_latent.unwrap_or(normed));
        let queries = b
            .layer(
                format!("{p}.attention.q-up"),
                LayerKind::Linear { out_features: heads * qk_dim, bias: false },
            )?
            .clone();
        b.branch_from(kv_latent);
        let up = heads * (latent.qk_nope_head_dim + latent.v_head_dim);
        let keys_values = b
            .layer(format!("{p}.attention.kv-up"), LayerKind::Linear { out_features: up, bias: false })?
            .clone();
        let rotary_keys = Shape::from([self.sequence, heads * latent.qk_rope_head_dim]);
        b.branch_from(queries);
        b.concat(format!("{p}.attention.qkv"), 1, &[keys_values, rotary_keys])?;
        let core = LayerKind::Attention {
            heads,
            kv_heads: heads,
            causal: self.causal,
            implementation: self.attention,
            dropout: self.attention_dropout,
            value_head_dim: Some(latent.v_head_dim),
        };
        b.layer(format!("{p}.attention.core"), core)?;
        Ok(())
    }

    /// Builds the network, named `name`, described as `description`.
    pub fn build(&self, name: &str, description: &str) -> Result<Model, ModelError> {
        self.validate(name)?;
        let h = self.hidden;
        let head_dim = self.head_dim.unwrap_or(h / self.heads);
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
            match self.latent {
                Some(latent) => self.latent_attention(&mut b, &p, latent)?,
                None => {
                    b.layer(
                        format!("{p}.attention.qkv"),
                        LayerKind::Linear { out_features: qkv_width, bias: self.bias },
                    )?;
                    if self.positions == Positions::Rope {
                        b.layer(
                            format!("{p}.attention.rope"),
                            LayerKind::Rope {
                                heads: self.heads,
                                kv_heads: self.kv_heads,
                                kernels: self.rope,
                            },
                        )?;
                    }
                    if self.qk_norm {
                        b.layer(
                            format!("{p}.attention.qk-norm"),
                            LayerKind::QkNorm { heads: self.heads, kv_heads: self.kv_heads },
                        )?;
                    }
                    let core = LayerKind::Attention {
                        heads: self.heads,
                        kv_heads: self.kv_heads,
                        causal: self.causal,
                        implementation: self.attention,
                        dropout: self.attention_dropout,
                        value_head_dim: None,
                    };
                    b.layer(format!("{p}.attention.core"), core)?;
                }
            }
            b.layer(format!("{p}.attention.proj"), LayerKind::Linear { out_features: h, bias: self.bias })?;
            if self.hidden_dropout {
                b.layer(format!("{p}.attention.dropout"), LayerKind::Dropout)?;
            }
            if self.sandwich_norm {
                b.layer(format!("{p}.attention.post-norm"), self.norm())?;
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
                Some(moe) if i >= moe.dense_layers => {
                    let normed = b.shape().clone();
                    b.layer(
                        format!("{p}.moe.router"),
                        LayerKind::MoeRouter { experts: moe.experts, top_k: moe.top_k },
                    )?;
                    b.branch_from(normed.clone());
                    let experts = LayerKind::MoeExperts {
                        experts: moe.experts,
                        top_k: moe.top_k,
                        ffn_hidden: moe.ffn_hidden,
                        activation: self.mlp.activation(),
                        gated: self.mlp.gated(),
                        bias: self.bias,
                    };
                    let routed = b.layer(format!("{p}.moe.experts"), experts)?.clone();
                    if moe.shared_experts > 0 {
                        // Megatron-Core's SharedExpertMLP: a dense MLP on every token, tensor
                        // split like any other, its output added to the routed experts'.
                        b.branch_from(normed);
                        self.dense_mlp(
                            &mut b,
                            &format!("{p}.moe.shared"),
                            moe.shared_experts * moe.ffn_hidden,
                        )?;
                        b.add(format!("{p}.moe.shared-add"), &routed)?;
                    }
                }
                _ => self.dense_mlp(&mut b, &format!("{p}.mlp"), self.ffn_hidden)?,
            }
            if self.hidden_dropout {
                b.layer(format!("{p}.mlp.dropout"), LayerKind::Dropout)?;
            }
            if self.sandwich_norm {
                b.layer(format!("{p}.mlp.post-norm"), self.norm())?;
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
    /// The normalisation: `"layer"` (default: layer norm with scale and shift) or `"rms"` (RMS
    /// norm with a scale, Megatron-LM's `--normalization RMSNorm`).
    #[serde(default)]
    pub norm: Option<String>,
    /// QK-norm: a weightless RMS norm of each query and key head after the rotary embedding
    /// (modded-nanogpt's `F.rms_norm(q, (head_dim,))`). Default false.
    #[serde(default)]
    pub qk_norm: Option<bool>,
    /// Experts per layer: every feed-forward block a mixture of experts of `ffn-hidden` each
    /// (Megatron-LM's `--num-experts`, with `--moe-ffn-hidden-size` equal to `ffn-hidden`).
    /// Needs `top-k`. Default: none (dense MLPs).
    #[serde(default)]
    pub experts: Option<u64>,
    /// Experts each token is routed to (Megatron-LM's `--moe-router-topk`).
    #[serde(default)]
    pub top_k: Option<u64>,
    /// Multi-head latent attention in place of the fused QKV projection (`[gpt.latent-attention]`,
    /// Megatron-LM's `--multi-latent-attention` with `--q-lora-rank`, `--kv-lora-rank`,
    /// `--qk-head-dim`, `--qk-pos-emb-head-dim`, `--v-head-dim`). Default: none.
    #[serde(default)]
    pub latent_attention: Option<LatentAttention>,
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
            head_dim: None,
            latent: self.latent_attention,
            ffn_hidden: self.ffn_hidden.unwrap_or(4 * self.hidden),
            sequence,
            vocabulary: self.vocabulary.unwrap_or(51_200),
            token_types: 0,
            norm: match self.norm.as_deref() {
                None | Some("layer") => Norm::LayerNorm,
                Some("rms") => Norm::RmsNorm,
                Some(other) => {
                    return Err(invalid(name, "gpt.norm", format!("{other:?} is not \"layer\" or \"rms\"")));
                }
            },
            pre_norm: true,
            sandwich_norm: false,
            mlp: match self.mlp.as_deref() {
                None | Some("gelu") => Mlp::Gelu,
                Some("swiglu") => Mlp::SwiGlu,
                Some("relu2") => Mlp::Relu2,
                Some(other) => {
                    return Err(invalid(
                        name,
                        "gpt.mlp",
                        format!("{other:?} is not \"gelu\", \"swiglu\" or \"relu2\""),
                    ));
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
                (Some(experts), Some(top_k)) => Some(Moe {
                    experts,
                    top_k,
                    ffn_hidden: self.ffn_hidden.unwrap_or(4 * self.hidden),
                    shared_experts: 0,
                    dense_layers: 0,
                }),
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
            rope: RopeKernels::Fused,
            qk_norm: self.qk_norm.unwrap_or(false),
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
            head_dim: None,
            latent: None,
            ffn_hidden: self.ffn_hidden.unwrap_or(4 * self.hidden),
            sequence: self.sequence.unwrap_or(512),
            vocabulary: self.vocabulary.unwrap_or(30_522),
            token_types: 2,
            norm: Norm::LayerNorm,
            pre_norm: false,
            sandwich_norm: false,
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
            rope: RopeKernels::Fused,
            qk_norm: false,
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
    /// The loss's kernels: `"fused"` (default: one kernel per pass in the compute dtype),
    /// `"torch"` (`F.cross_entropy` under autocast: the logits cast to fp32, then
    /// log-softmax and NLL as eager PyTorch runs them) or `"megatron"`.
    #[serde(default)]
    pub loss: Option<String>,
    /// The rotary embedding's kernels: `"fused"` (default: one kernel each way) or `"eager"`
    /// (Hugging Face's `apply_rotary_pos_emb` as eager PyTorch operators).
    #[serde(default)]
    pub rope_kernels: Option<String>,
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
            ("mixtral", Some(experts), Some(top_k)) => {
                Some(Moe { experts, top_k, ffn_hidden: self.ffn_hidden, shared_experts: 0, dense_layers: 0 })
            }
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
            head_dim: None,
            latent: None,
            ffn_hidden: self.ffn_hidden,
            sequence: self.sequence,
            vocabulary: self.vocabulary,
            token_types: 0,
            norm: Norm::RmsNorm,
            pre_norm: true,
            sandwich_norm: false,
            mlp: Mlp::SwiGlu,
            positions: Positions::Rope,
            bias: false,
            hidden_dropout: false,
            attention_dropout: false,
            causal: true,
            attention: attention_kernel(name, family, self.attention.as_deref(), AttentionKernel::Flash)?,
            moe,
            head: Head::LanguageModel { tied: self.tied_embeddings.unwrap_or(false) },
            loss: match self.loss.as_deref() {
                None => LossKernels::Fused,
                Some(given) => LossKernels::parse(given)
                    .map_err(|message| invalid(name, &format!("{family}.loss"), message))?,
            },
            rope: match self.rope_kernels.as_deref() {
                None => RopeKernels::Fused,
                Some(given) => RopeKernels::parse(given)
                    .map_err(|message| invalid(name, &format!("{family}.rope-kernels"), message))?,
            },
            qk_norm: false,
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

/// A mixture-of-experts transformer of the Llama line, the `[moe]` section of a model file
/// (RMS norm, rotary embeddings, no biases, flash attention, untied output layer unless told):
/// DeepSeek-V2/V3 (fine-grained routed experts of `moe-ffn-hidden`, `shared-experts`, dense
/// leading `dense-layers`, multi-head latent attention in `[moe.latent-attention]`), Qwen3-MoE
/// (`head-dim` wider than `hidden / heads`), Grok-1 (`mlp = "geglu"`, `sandwich-norm`).
/// Mixtral files keep their `[mixtral]` section (a `[moe]` section with `moe-ffn-hidden =
/// ffn-hidden` builds the same model).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct MoeTransformer {
    /// Transformer layers.
    pub layers: u64,
    /// Hidden size.
    pub hidden: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads. Default: `heads`.
    #[serde(default)]
    pub kv_heads: Option<u64>,
    /// Width of each head. Default: `hidden / heads`.
    #[serde(default)]
    pub head_dim: Option<u64>,
    /// Hidden size of the dense feed-forward blocks of the `dense-layers`; needed only with
    /// them.
    #[serde(default)]
    pub ffn_hidden: Option<u64>,
    /// Tokens per sample.
    pub sequence: u64,
    /// Vocabulary.
    pub vocabulary: u64,
    /// Routed experts per layer.
    pub experts: u64,
    /// Routed experts per token.
    pub top_k: u64,
    /// Hidden size of each routed (and shared) expert.
    pub moe_ffn_hidden: u64,
    /// Shared experts run on every token. Default 0.
    #[serde(default)]
    pub shared_experts: Option<u64>,
    /// Leading layers with a dense feed-forward block of `ffn-hidden`. Default 0.
    #[serde(default)]
    pub dense_layers: Option<u64>,
    /// The experts' MLP: `"swiglu"` (default) or `"geglu"`.
    #[serde(default)]
    pub mlp: Option<String>,
    /// A norm on each sub-block's output too (Grok-1). Default false.
    #[serde(default)]
    pub sandwich_norm: Option<bool>,
    /// `"flash"` (default), `"standard"` or `"math"`.
    #[serde(default)]
    pub attention: Option<String>,
    /// Output layer tied to the embeddings. Default false.
    #[serde(default)]
    pub tied_embeddings: Option<bool>,
    /// Multi-head latent attention in place of grouped-query attention.
    #[serde(default)]
    pub latent_attention: Option<LatentAttention>,
}

impl MoeTransformer {
    /// The transformer this section describes.
    pub fn transformer(&self, name: &str) -> Result<Transformer, ModelError> {
        let dense_layers = self.dense_layers.unwrap_or(0);
        let ffn_hidden = match (self.ffn_hidden, dense_layers) {
            (Some(ffn_hidden), _) => ffn_hidden,
            (None, 0) => self.moe_ffn_hidden,
            (None, _) => {
                return Err(invalid(
                    name,
                    "moe.ffn-hidden",
                    format!(
                        "missing; the {dense_layers} dense layers need the width of their feed-forward block"
                    ),
                ));
            }
        };
        let mlp = match self.mlp.as_deref() {
            None | Some("swiglu") => Mlp::SwiGlu,
            Some("geglu") => Mlp::GeGlu,
            Some(other) => {
                return Err(invalid(name, "moe.mlp", format!("{other:?} is not \"swiglu\" or \"geglu\"")));
            }
        };
        Ok(Transformer {
            family: "moe",
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads.unwrap_or(self.heads),
            head_dim: self.head_dim,
            latent: self.latent_attention,
            ffn_hidden,
            sequence: self.sequence,
            vocabulary: self.vocabulary,
            token_types: 0,
            norm: Norm::RmsNorm,
            pre_norm: true,
            sandwich_norm: self.sandwich_norm.unwrap_or(false),
            mlp,
            positions: Positions::Rope,
            bias: false,
            hidden_dropout: false,
            attention_dropout: false,
            causal: true,
            attention: attention_kernel(name, "moe", self.attention.as_deref(), AttentionKernel::Flash)?,
            moe: Some(Moe {
                experts: self.experts,
                top_k: self.top_k,
                ffn_hidden: self.moe_ffn_hidden,
                shared_experts: self.shared_experts.unwrap_or(0),
                dense_layers,
            }),
            head: Head::LanguageModel { tied: self.tied_embeddings.unwrap_or(false) },
            loss: LossKernels::Fused,
            rope: RopeKernels::Fused,
            qk_norm: false,
        })
    }

    /// Builds the network, named `name`.
    pub fn build(&self, name: &str) -> Result<Model, ModelError> {
        let t = self.transformer(name)?;
        let dense = self.dense_layers.unwrap_or(0);
        let shared = self.shared_experts.unwrap_or(0);
        let attention = match self.latent_attention {
            Some(_) => format!("{} heads of latent attention", t.heads),
            None => format!("{} heads ({} key/value)", t.heads, t.kv_heads),
        };
        let description = format!(
            "MoE: {} layers ({dense} dense), hidden {}, {attention}, {} experts of {} (top-{}) + {shared} shared, \
             {} tokens, vocabulary {}",
            t.layers, t.hidden, self.experts, self.moe_ffn_hidden, self.top_k, t.sequence, t.vocabulary
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
            norm: None,
            qk_norm: None,
            experts: None,
            top_k: None,
            latent_attention: None,
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
        // Squared ReLU: the same matrices as GELU's MLP.
        let relu2 = Gpt { mlp: Some("relu2".into()), ..base.clone() };
        assert_eq!(params(&relu2), plain);
        // QK-norm: no weights, one layer per block over the queries' and keys' elements only.
        let qk = Gpt { qk_norm: Some(true), ..rope.clone() }.build("t").unwrap();
        assert_eq!(qk.parameters(), params(&rope));
        let norms: Vec<_> = qk.layers.iter().filter(|l| matches!(l.kind, LayerKind::QkNorm { .. })).collect();
        assert_eq!(norms.len(), 2);
        // 2048 tokens x (8 + 8) heads of 64: read and written once, one statistic per row.
        let (elements, rows) = (2048 * 16 * 64, 2048 * 16);
        assert_eq!(norms[0].cost.forward_traffic.per_sample, 2 * elements + rows);
        assert_eq!(norms[0].cost.backward_data_traffic.per_sample, 3 * elements + rows);
        // RMS norm keeps the scale and drops the shift: two norms per layer and the final one.
        let rms = Gpt { norm: Some("rms".into()), ..base.clone() };
        assert_eq!(plain - params(&rms), (2 * 2 + 1) * 512);
        for (bad, key) in [
            (Gpt { norm: Some("batch".into()), ..base.clone() }, "gpt.norm"),
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
            loss: None,
            rope_kernels: None,
            experts: None,
            top_k: None,
        };
        // Llama-2-7B: 6,738,415,616 (Hugging Face meta-llama/Llama-2-7b-hf).
        assert_eq!(llama.build("llama2-7b", "llama").unwrap().parameters(), 6_738_415_616);
        // The loss: fused unless the file says otherwise; an unknown value names the key.
        let torch = Llama { loss: Some("torch".to_string()), ..llama.clone() };
        assert_eq!(torch.build("l", "llama").unwrap().parameters(), 6_738_415_616);
        let error = Llama { loss: Some("fp8".to_string()), ..llama.clone() }.build("l", "llama").unwrap_err();
        assert!(error.to_string().contains("llama.loss"), "{error}");
        // The rotary embedding: fused unless the file says "eager", which changes no parameter.
        let eager =
            Llama { rope_kernels: Some("eager".to_string()), ..llama.clone() }.build("l", "llama").unwrap();
        assert_eq!(eager.parameters(), 6_738_415_616);
        let rope = eager.layers.iter().find(|layer| matches!(layer.kind, LayerKind::Rope { .. })).unwrap();
        assert!(matches!(rope.kind, LayerKind::Rope { kernels: RopeKernels::Eager, .. }), "{:?}", rope.kind);
        let error =
            Llama { rope_kernels: Some("hf".to_string()), ..llama.clone() }.build("l", "llama").unwrap_err();
        assert!(
            error.to_string().contains("llama.rope-kernels") && error.to_string().contains("\"eager\""),
            "{error}"
        );
        let mixtral =
            Llama { kv_heads: Some(8), ffn_hidden: 14336, experts: Some(8), top_k: Some(2), ..llama.clone() };
        // Mixtral-8x7B: 46,702,792,704.
        let model = mixtral.build("mixtral-8x7b", "mixtral").unwrap();
        assert_eq!(model.parameters(), 46_702_792_704);
        let error = mixtral.build("mixtral", "llama").unwrap_err().to_string();
        assert!(error.contains("[mixtral]"), "{error}");
    }

    /// Whether a published figure of `published` units (billions, with `decimals` decimals) is
    /// `count` rounded or truncated to its precision: the count is within one unit of its last
    /// digit above it and less than half a unit below it.
    fn published_as(count: u64, published: f64, decimals: i32) -> bool {
        let unit = 10f64.powi(-decimals);
        let billions = count as f64 / 1e9;
        billions > published - unit / 2.0 && billions < published + unit
    }

    /// The zoo's mixture-of-experts models against their Hugging Face configurations (the
    /// sums below) and their published totals and activated counts (activated: every layer's
    /// parameters but only the top-k routed experts', embeddings included).
    #[test]
    fn moe_zoo_counts_match_their_configs_and_published_figures() {
        let model = |name: &str| crate::zoo::by_name(name).unwrap();
        // DeepSeek-V3 (h 7168, 61 layers, 3 dense, V 129280, untied). Per layer: MLA 7168 x 1536
        // + 1536 + 1536 x 128 x 192 + 7168 x 576 + 512 + 512 x 128 x 256 + 128 x 128 x 7168 =
        // 187,107,328, two norms 14,336; dense FFN 3 x 7168 x 18432 = 396,361,728; MoE layer
        // 256 x 3 x 7168 x 2048 routed + 3 x 7168 x 2048 shared + 7168 x 256 router =
        // 11,320,164,352. Total 2 x 129280 x 7168 + 7168 + 61 x 187,121,664 + 3 x 396,361,728
        // + 58 x 11,320,164,352 = 671,026,404,352 (671B). Activated: 8 routed experts, 58 x
        // 398,196,736 for the MoE blocks: 37,552,282,624 (37B).
        let deepseek = model("deepseek-v3");
        assert_eq!(deepseek.parameters(), 671_026_404_352);
        assert_eq!(deepseek.active_parameters(), 37_552_282_624);
        assert!(
            published_as(deepseek.parameters(), 671.0, 0)
                && published_as(deepseek.active_parameters(), 37.0, 0)
        );
        // Qwen3-235B-A22B (h 4096, 94 layers, 64 heads of 128, 4 key/value heads, V 151936,
        // untied). Per layer: attention 4096 x 8192 x 2 + 4096 x 512 x 2 = 71,303,168, norms
        // 8192, router 4096 x 128 = 524,288, experts 128 x 3 x 4096 x 1536 = 2,415,919,104.
        // Total 2 x 151936 x 4096 + 4096 + 94 x 2,487,754,752 = 235,093,610,496 (235B; the
        // checkpoint's per-head q/k norms, 94 x 256, are not modelled). Activated: 8 experts,
        // 94 x 222,830,592 + 1,244,663,808 = 22,190,739,456 (22B).
        let qwen = model("qwen3-235b-a22b");
        assert_eq!(qwen.parameters(), 235_093_610_496);
        assert_eq!(qwen.active_parameters(), 22_190_739_456);
        assert!(published_as(qwen.parameters(), 235.0, 0) && published_as(qwen.active_parameters(), 22.0, 0));
        // Qwen3-30B-A3B (h 2048, 48 layers, 32 heads of 128, 4 key/value heads). Per layer:
        // attention 2048 x 4096 x 2 + 2048 x 512 x 2 = 18,874,368, norms 4096, router 262,144,
        // experts 128 x 3 x 2048 x 768 = 603,979,776. Total 2 x 151936 x 2048 + 2048 + 48 x
        // 623,120,384 = 30,532,110,336 (30.5B). Activated: 48 x 56,889,344 + 622,331,904 =
        // 3,353,020,416 (3.3B).
        let small = model("qwen3-30b-a3b");
        assert_eq!(small.parameters(), 30_532_110_336);
        assert_eq!(small.active_parameters(), 3_353_020_416);
        assert!(published_as(small.parameters(), 30.5, 1) && published_as(small.active_parameters(), 3.3, 1));
        // Mixtral 8x22B (h 6144, 56 layers, 48 heads, 8 key/value heads, V 32768, untied). Per
        // layer: attention 2 x 6144^2 + 2 x 6144 x 1024 = 88,080,384, norms 12,288, router
        // 49,152, experts 8 x 3 x 6144 x 16384 = 2,415,919,104. Total 2 x 32768 x 6144 + 6144
        // + 56 x 2,504,060,928 = 140,630,071,296 (141B). Activated: 56 x 692,121,600 +
        // 402,659,328 = 39,161,468,928 (39B).
        let mixtral = model("mixtral-8x22b");
        assert_eq!(mixtral.parameters(), 140_630_071_296);
        assert_eq!(mixtral.active_parameters(), 39_161_468_928);
        assert!(
            published_as(mixtral.parameters(), 141.0, 0)
                && published_as(mixtral.active_parameters(), 39.0, 0)
        );
        // Grok-1 (h 6144, 64 layers, 48 heads, 8 key/value heads, V 131072, tied). Per layer:
        // attention 88,080,384, four norms 24,576, router 49,152, experts 8 x 3 x 6144 x 32768
        // = 4,831,838,208: 4,919,992,320; the 64 layers 314,879,508,480 (xAI's 314B, which
        // leaves out the 131072 x 6144 = 805,306,368 embedding weights and the final norm: with
        // them, 315,684,820,992). Activated: 64 x 1,296,113,664 + 805,312,512 = 83,756,587,008.
        let grok = model("grok-1");
        assert_eq!(grok.parameters(), 315_684_820_992);
        let outside: u64 =
            grok.layers.iter().filter(|l| !l.name.starts_with("layers.")).map(|l| l.cost.params).sum();
        assert_eq!(grok.parameters() - outside, 314_879_508_480);
        assert!(published_as(grok.parameters() - outside, 314.0, 0));
        assert_eq!(grok.active_parameters(), 83_756_587_008);
    }

    /// `[gpt.latent-attention]`: Megatron-LM's `--multi-latent-attention` on its GPT (the
    /// functional test's 512-wide model): each layer's attention is MLA's projections (no
    /// biases on the down and up projections, as built for `[moe]`), the rest the GPT's.
    #[test]
    fn a_gpt_takes_latent_attention() {
        let text = "[model]\nname = \"mla-gpt\"\n[gpt]\nlayers = 4\nhidden = 512\nheads = 8\nsequence = 1024\n\
                    vocabulary = 50257\ntied-embeddings = false\n[gpt.latent-attention]\nq-lora-rank = 192\n\
                    kv-lora-rank = 64\nqk-nope-head-dim = 16\nqk-rope-head-dim = 8\nv-head-dim = 16\n";
        let model = Model::from_toml_str(text, "test").unwrap();
        let params = |name: &str| model.layers.iter().find(|l| l.name == name).unwrap().cost.params;
        let (h, heads) = (512u64, 8u64);
        assert_eq!(params("layers.0.attention.q-down"), h * 192);
        assert_eq!(params("layers.0.attention.kv-down"), h * (64 + 8));
        assert_eq!(params("layers.0.attention.q-up"), 192 * heads * (16 + 8));
        assert_eq!(params("layers.0.attention.kv-up"), 64 * heads * (16 + 16));
        assert_eq!(params("layers.0.attention.proj"), heads * 16 * h + h);
        assert!(model.layers.iter().all(|l| l.name != "layers.0.attention.qkv" || l.cost.params == 0));
    }

    /// Multi-head latent attention's forward work per sample against the closed form from the
    /// configuration (DeepSeek-V3's, s = 4096 tokens, causal flash core): the five projections
    /// `s (h r_q + r_q H (d_n + d_r) + h (r_kv + d_r) + r_kv H (d_n + d_v) + H d_v h)` MACs,
    /// and the core `H s (s + 1) / 2 (d_n + d_r + d_v)` MACs (Q K^T over 192 columns, P V over
    /// 128), each MAC two FLOPs in the projections.
    #[test]
    fn latent_attention_costs_its_projections_and_a_core_of_its_head_widths() {
        let model = crate::zoo::by_name("deepseek-v3").unwrap();
        let (s, h, heads) = (4096f64, 7168f64, 128f64);
        let (r_q, r_kv, d_n, d_r, d_v) = (1536f64, 512f64, 128f64, 64f64, 128f64);
        let layer = |suffix: &str| model.layer(&format!("layers.5.attention.{suffix}")).unwrap();
        let projections = s
            * (h * r_q
                + r_q * heads * (d_n + d_r)
                + h * (r_kv + d_r)
                + r_kv * heads * (d_n + d_v)
                + heads * d_v * h);
        let linear_macs: f64 =
            ["q-down", "q-up", "kv-down", "kv-up", "proj"].iter().map(|name| layer(name).cost.macs).sum();
        assert_eq!(linear_macs, projections);
        let linear_flops: f64 = ["q-down", "q-up", "kv-down", "kv-up", "proj"]
            .iter()
            .map(|name| layer(name).cost.forward_flops)
            .sum();
        assert_eq!(linear_flops, 2.0 * projections);
        let core = layer("core");
        assert_eq!(core.input, Shape::from([4096, 128 * (192 + 192 + 128)]));
        assert_eq!(core.output, Shape::from([4096, 128 * 128]));
        assert_eq!(core.cost.macs, heads * s * (s + 1.0) / 2.0 * (d_n + d_r + d_v));
        // The core's kernels: Q K^T on 192-wide heads, P V on 128-wide ones.
        let crate::kernel_shape::KernelShape::Attention(shape) =
            crate::kernel_shape::KernelShape::of_layer(core, crate::layer::Pass::Forward, 1)
        else {
            panic!("an attention shape")
        };
        assert_eq!((shape.products()[0].k, shape.products()[1].n), (192, 128));
        // Parameters: the projections' weights and the two latent norms.
        let attention: u64 = model
            .layers
            .iter()
            .filter(|l| l.name.starts_with("layers.5.attention."))
            .map(|l| l.cost.params)
            .sum();
        assert_eq!(attention, 187_107_328);
    }

    /// `[moe]` describes Mixtral's layers too: with experts as wide as the dense FFN and no
    /// shared or dense layers it builds the `[mixtral]` section's parameters; dense leading
    /// layers have no router, shared experts add `shared x moe-ffn-hidden` dense MLPs.
    #[test]
    fn moe_section_generalizes_mixtral() {
        let mixtral = Llama {
            layers: 4,
            hidden: 512,
            heads: 8,
            kv_heads: Some(2),
            ffn_hidden: 1024,
            sequence: 256,
            vocabulary: 1000,
            attention: None,
            tied_embeddings: None,
            loss: None,
            rope_kernels: None,
            experts: Some(8),
            top_k: Some(2),
        };
        let moe = MoeTransformer {
            layers: 4,
            hidden: 512,
            heads: 8,
            kv_heads: Some(2),
            head_dim: None,
            ffn_hidden: None,
            sequence: 256,
            vocabulary: 1000,
            experts: 8,
            top_k: 2,
            moe_ffn_hidden: 1024,
            shared_experts: None,
            dense_layers: None,
            mlp: None,
            sandwich_norm: None,
            attention: None,
            tied_embeddings: None,
            latent_attention: None,
        };
        let reference = mixtral.build("m", "mixtral").unwrap();
        let built = moe.build("m").unwrap();
        assert_eq!(built.parameters(), reference.parameters());
        assert_eq!(built.macs_per_sample(), reference.macs_per_sample());
        // Two shared experts of 256 and one dense leading layer of 2048.
        let deepseek = MoeTransformer {
            moe_ffn_hidden: 256,
            shared_experts: Some(2),
            dense_layers: Some(1),
            ffn_hidden: Some(2048),
            ..moe.clone()
        };
        let model = deepseek.build("d").unwrap();
        let routers = model.layers.iter().filter(|l| matches!(l.kind, LayerKind::MoeRouter { .. })).count();
        assert_eq!(routers, 3);
        assert!(
            model.layer("layers.0.mlp.gate-up").is_some() && model.layer("layers.0.moe.router").is_none()
        );
        let shared: u64 = model
            .layers
            .iter()
            .filter(|l| l.name.starts_with("layers.2.moe.shared."))
            .map(|l| l.cost.params)
            .sum();
        assert_eq!(shared, 3 * 512 * 2 * 256);
        let without_shared = MoeTransformer { shared_experts: None, ..deepseek.clone() }.build("d").unwrap();
        assert_eq!(model.parameters() - without_shared.parameters(), 3 * 3 * 512 * 2 * 256);
    }

    /// A bad `[moe]` section is refused with the key at fault and what would be valid.
    #[test]
    fn bad_moe_sections_name_the_key() {
        let file = |extra: &str| {
            format!(
                "[moe]\nlayers = 4\nhidden = 512\nheads = 8\nsequence = 256\nvocabulary = 1000\nexperts = 8\n\
                 top-k = 2\nmoe-ffn-hidden = 256\n{extra}"
            )
        };
        let error =
            |extra: &str| crate::Model::from_toml_str(&file(extra), "bad.toml").unwrap_err().to_string();
        let message = error("dense-layers = 4\nffn-hidden = 1024\n");
        assert!(message.contains("bad.toml") && message.contains("moe.dense-layers"), "{message}");
        assert!(message.contains("valid: 0 to 3"), "{message}");
        let message = error("dense-layers = 1\n");
        assert!(message.contains("moe.ffn-hidden") && message.contains("missing"), "{message}");
        let message = error("top-k = 9\n");
        assert!(message.contains("top-k"), "{message}");
        let message = error("mlp = \"relu\"\n");
        assert!(message.contains("moe.mlp") && message.contains("\"geglu\""), "{message}");
        let message = error(
            "kv-heads = 2\n[moe.latent-attention]\nkv-lora-rank = 64\nqk-nope-head-dim = 32\nqk-rope-head-dim = 16\nv-head-dim = 32\n",
        );
        assert!(message.contains("moe.kv-heads"), "{message}");
        let message = error("[moe.latent-attention]\nkv-rank = 64\n");
        assert!(message.contains("kv-rank"), "{message}");
    }
}
