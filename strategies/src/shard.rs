//! What one rank computes of each layer under tensor, sequence, context and expert
//! parallelism, and the collectives each layer needs around it.
//!
//! Every layer gets a [`Role`] and a *local layer*: the same kind on the rank's own shapes
//! (built with [`Layer::new`], so the compute model sees the shapes the rank really
//! multiplies). Roles follow Megatron-LM:
//! - inside a numbered block, the first linear layer met while activations are replicated is
//!   *column-parallel* (output features split: QKV, `fc1`, gate/up) and the next one that
//!   reads the split features *row-parallel* (input features split: the attention projection,
//!   `fc2`); attention, rotary embeddings, activations and dropout between them work on the
//!   split features (heads split). A linear layer whose output is normalized (a norm needs
//!   whole rows: multi-head latent attention's down-projections) is replicated, as
//!   Megatron-Core duplicates it; one that reads whole rows while features are split is a
//!   second column-parallel layer (latent attention's key/value up-projection beside its query
//!   one); shared experts are a dense MLP split like any other;
//! - norms, dropout and residual adds outside those regions are replicated, or split along the
//!   sequence with sequence parallelism;
//! - the input embedding and the output layer are vocabulary-parallel (the table's rows and the
//!   logits split), the loss is Megatron's vocabulary-parallel cross-entropy;
//! - mixture-of-experts banks hold `experts / expert` experts per rank, each split over the
//!   tensor ranks like an MLP.
//!
//! Collectives per transformer layer (Korthikanti et al. 2022, section 4.2.2): with tensor
//! parallelism, an allreduce of `b s h` after each row-parallel layer (forward) and after each
//! column-parallel layer's input gradient (backward): 4 per layer. With sequence parallelism
//! each allreduce becomes a reduce-scatter and an allgather moves before the column-parallel
//! layer (forward) or the row-parallel layer's backward: the same bytes. Context parallelism
//! splits the sequence into `context` chunks and passes key/value chunks around the context
//! ring during attention (the backward passes them and their gradients). Expert parallelism
//! sends each token to its experts and back by all-to-all (dispatch and combine, mirrored in
//! the backward).

use sim_core::graph::CollectiveKind;
use sim_core::units::Bytes;

use workloads::device::Dtype;
use workloads::layer::{Layer, LayerError, LayerKind, Shape};
use workloads::model::Model;

/// A communicator kind: which parallel dimension a collective or transfer belongs to (the
/// graph's op metadata records it, [`sim_core::graph::OpMeta::group`]).
pub use sim_core::graph::GroupKind;

/// How a layer is split over the tensor ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Every tensor rank computes it whole (or its sequence share, with sequence parallelism).
    Replicated,
    /// Linear layer with its output features split.
    Column,
    /// Linear layer with its input features split; its partial outputs are summed.
    Row,
    /// Works on features already split by a column-parallel layer (attention heads, the MLP's
    /// activation).
    Split,
    /// Input embedding with its vocabulary rows split.
    VocabularyEmbedding,
    /// Output layer with its logits split over the vocabulary.
    VocabularyOutput,
    /// Cross-entropy over vocabulary-split logits.
    VocabularyLoss,
    /// A bank of experts: `experts / expert` per rank, each split over the tensor ranks.
    Experts,
    /// Convolution or fully connected layer with its output channels split (filter parallelism).
    FilterSplit,
    /// Convolution or fully connected layer with its input channels split (channel parallelism).
    ChannelSplit,
    /// Layer on a spatial tile of the activations (spatial parallelism).
    SpatialSplit,
}

/// One collective a layer needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Comm {
    /// Over which communicator.
    pub group: GroupKind,
    /// What it computes.
    pub kind: CollectiveKind,
    /// Size of the full buffer (the convention of `sim_core::graph::Collective`).
    pub bytes: Bytes,
    /// What it is, for labels (`"tp allreduce"`).
    pub what: &'static str,
}

/// One layer as one rank runs it.
#[derive(Debug, Clone)]
pub struct LocalLayer {
    /// Index of the layer in the model.
    pub index: usize,
    /// How it is split.
    pub role: Role,
    /// The layer on this rank's shapes (per sample).
    pub layer: Layer,
    /// The rank does `1 / work_divisor` of the local layer's work: context-parallel attention
    /// computes its queries against every key chunk in turn, `1 / context` of the
    /// full-sequence attention (balanced causal masking).
    pub work_divisor: u32,
    /// The rank does `work_multiplier` times the local layer's work (the busiest rank of an
    /// expert group under skewed routing).
    pub work_multiplier: f64,
    /// Collectives before the forward kernel, in order.
    pub before_forward: Vec<Comm>,
    /// Collectives after the forward kernel, in order.
    pub after_forward: Vec<Comm>,
    /// Collectives before the backward kernels (on the output gradient), in order.
    pub before_backward: Vec<Comm>,
    /// Collectives on the input gradient, after the backward-data kernel; the backward-weight
    /// kernel overlaps them.
    pub after_backward_data: Vec<Comm>,
    /// Context-parallel ring: bytes of the key/value chunk passed to the next context rank at
    /// each of the `context - 1` steps of the forward (the backward passes twice as much: the
    /// chunk and its gradient).
    pub context_ring: Option<Bytes>,
    /// Spatial parallelism: the halo exchange before the forward kernel (and, reversed, the
    /// halo gradients sent back after the backward-data kernel).
    pub halo: Option<super::cnn::Halo>,
}

impl LocalLayer {
    /// Layer `index` as `layer` under `role`: whole work, no collectives yet.
    pub fn new(index: usize, role: Role, layer: Layer) -> LocalLayer {
        LocalLayer {
            index,
            role,
            layer,
            work_divisor: 1,
            work_multiplier: 1.0,
            before_forward: Vec::new(),
            after_forward: Vec::new(),
            before_backward: Vec::new(),
            after_backward_data: Vec::new(),
            context_ring: None,
            halo: None,
        }
    }
}

/// The degrees that shape one rank's work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Split {
    /// Tensor-parallel degree.
    pub tensor: u32,
    /// Megatron sequence parallelism on the tensor ranks.
    pub sequence_parallel: bool,
    /// Context-parallel degree.
    pub context: u32,
    /// Of the context ranks, how many exchange their attention inputs by all-to-all
    /// (Ulysses-style, heads for sequence) before a ring over the rest
    /// ([`crate::ContextComm`]): 1 for the p2p ring alone, `context` for all-to-all alone.
    pub context_a2a: u32,
    /// Expert-parallel degree.
    pub expert: u32,
    /// The experts' tensor degree (the tensor degree unless `parallelism.expert-tensor` says
    /// otherwise).
    pub expert_tensor: u32,
    /// The token dispatcher of the expert layers.
    pub dispatcher: crate::MoeDispatcher,
    /// Members of an expert group on one node, for a DeepEP-style dispatcher's two hops (1
    /// otherwise): the node part has this many ranks, the rail `expert / expert_node`.
    pub expert_node: u32,
    /// The dtype of the router's probabilities; `None`: the compute dtype.
    pub router_dtype: Option<Dtype>,
    /// Tokens the busiest expert rank receives, relative to balanced routing (1: balanced;
    /// already capped by the capacity factor). Every rank of the expert group waits for it at
    /// the combine, so its load sets the layer's time and all-to-all size.
    pub expert_load: f64,
    /// The CNN strategy inside the model-parallel group (filter, channel, spatial).
    pub cnn: super::cnn::CnnSplit,
}

impl Split {
    /// Whether the expert layers run apart from the dense tensor split: an expert-tensor
    /// degree of their own or the all-gather dispatcher ([`crate::Parallelism::experts_apart`]).
    pub fn experts_apart(&self) -> bool {
        self.expert_tensor != self.tensor || self.dispatcher == crate::MoeDispatcher::AllGather
    }
}

/// Which communicator an expert layer's collective (a [`Comm`] of [`GroupKind::Expert`]) runs
/// over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertCommunicator {
    /// The expert-parallel group (`ep`): the all-to-all dispatcher's all-to-alls.
    Expert,
    /// The expert-tensor group (`expt_tp`): the all-to-all dispatcher's all-gather and
    /// reduce-scatter of the tokens among the ranks that split the same experts.
    ExpertTensor,
    /// The expert-tensor x expert group (`tp_ep`): the all-gather dispatcher's collectives.
    ExpertTensorExpert,
    /// The expert group's members on the rank's node: a DeepEP-style dispatcher's NVLink hop.
    ExpertNode,
    /// The expert group's members at the rank's local index, one per node: a DeepEP-style
    /// dispatcher's RDMA hop.
    ExpertRail,
}

/// Label prefix of a DeepEP-style dispatcher's network hop (its [`Comm::what`] starts with it).
pub const DEEPEP_RDMA: &str = "deepep rdma";
/// Label prefix of a DeepEP-style dispatcher's NVLink hop.
pub const DEEPEP_NVLINK: &str = "deepep nvlink";

/// The communicator of an expert collective of `kind` under `dispatcher`: all-to-alls go over
/// the expert group; all-gathers and reduce-scatters over the expert-tensor x expert group with
/// the all-gather dispatcher (`MoEAllGatherTokenDispatcher`, `group=self.tp_ep_group`), over
/// the expert-tensor group with the all-to-all dispatcher (`MoEAlltoAllTokenDispatcher`'s
/// `AG(TP)` / `RS(TP)` on `pg_collection.expt_tp`).
/// A DeepEP-style dispatcher's all-to-alls go over the rail or the node part of the expert group,
/// told apart by their labels ([`DEEPEP_RDMA`], [`DEEPEP_NVLINK`]).
pub fn expert_communicator(
    kind: CollectiveKind,
    dispatcher: crate::MoeDispatcher,
    what: &str,
) -> ExpertCommunicator {
    match (kind, dispatcher) {
        (CollectiveKind::AllToAll, crate::MoeDispatcher::DeepEp) if what.starts_with(DEEPEP_RDMA) => {
            ExpertCommunicator::ExpertRail
        }
        (CollectiveKind::AllToAll, crate::MoeDispatcher::DeepEp) if what.starts_with(DEEPEP_NVLINK) => {
            ExpertCommunicator::ExpertNode
        }
        (CollectiveKind::AllToAll, _) => ExpertCommunicator::Expert,
        (_, crate::MoeDispatcher::AllGather) => ExpertCommunicator::ExpertTensorExpert,
        (_, crate::MoeDispatcher::AllToAll | crate::MoeDispatcher::DeepEp) => {
            ExpertCommunicator::ExpertTensor
        }
    }
}

/// A model cannot be split as asked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShardError {
    /// The split is not valid for this model; the message says what would be.
    #[error("parallelism.{key}: {message}")]
    Invalid {
        /// The scenario key at fault (`tensor`, `context`, `expert`).
        key: &'static str,
        /// What is wrong and what would be valid.
        message: String,
    },
    /// A local layer could not be built (a bug: the checks above should have caught it).
    #[error("splitting layer {layer}: {source}")]
    Layer {
        /// The layer.
        layer: String,
        /// Why.
        #[source]
        source: LayerError,
    },
}

fn invalid(key: &'static str, message: String) -> ShardError {
    ShardError::Invalid { key, message }
}

/// The vocabulary of the model's input embedding, if it has one.
fn vocabulary(model: &Model) -> Option<u64> {
    model.layers.iter().find_map(|layer| match layer.kind {
        LayerKind::Embedding { vocabulary, .. } => Some(vocabulary),
        _ => None,
    })
}

/// The sequence length: the first dimension of the first embedding's input, if the model
/// starts with token ids.
pub fn sequence_length(model: &Model) -> Option<u64> {
    match model.layers.first().map(|layer| &layer.kind) {
        Some(LayerKind::Embedding { .. }) => model.input.0.first().copied(),
        _ => None,
    }
}

/// The role of every layer, or why the model cannot be split over `tensor` ranks.
pub fn roles(model: &Model, tensor: u32) -> Result<Vec<Role>, ShardError> {
    let blocks = model.blocks();
    let vocabulary = vocabulary(model);
    let mut roles = Vec::with_capacity(model.layers.len());
    let mut split = false;
    // Whether the next layer that is not a view normalizes (a linear layer feeding it keeps
    // whole rows).
    let normalized_next = |index: usize| {
        model.layers[index + 1..]
            .iter()
            .find(|l| {
                !matches!(l.kind, LayerKind::Slice { .. } | LayerKind::Reshape { .. } | LayerKind::Flatten)
            })
            .is_some_and(|l| matches!(l.kind, LayerKind::RmsNorm | LayerKind::LayerNorm { .. }))
    };
    for (index, layer) in model.layers.iter().enumerate() {
        let in_block = blocks[index].is_some();
        if in_block && (index == 0 || blocks[index - 1] != blocks[index]) {
            split = false;
        }
        let role = match &layer.kind {
            LayerKind::Embedding { .. } => Role::VocabularyEmbedding,
            LayerKind::Linear { out_features, .. } | LayerKind::TiedLinear { out_features, .. }
                if !in_block && Some(*out_features) == vocabulary =>
            {
                Role::VocabularyOutput
            }
            LayerKind::CrossEntropy { .. } if index > 0 && roles.last() == Some(&Role::VocabularyOutput) => {
                Role::VocabularyLoss
            }
            LayerKind::Linear { .. } if in_block && !split && normalized_next(index) => Role::Replicated,
            // Split features reach a row-parallel layer from the layer just before it; a linear
            // layer reading anything else (whole rows) while they are split is another
            // column-parallel one.
            LayerKind::Linear { .. }
                if in_block
                    && split
                    && !(matches!(roles.last(), Some(Role::Split | Role::Column))
                        && model.layers[index - 1].output == layer.input) =>
            {
                Role::Column
            }
            LayerKind::Linear { .. } if in_block => {
                split = !split;
                if split { Role::Column } else { Role::Row }
            }
            LayerKind::MoeExperts { .. } => Role::Experts,
            LayerKind::Attention { .. } | LayerKind::Rope { .. } | LayerKind::QkNorm { .. }
                if tensor > 1 && !split =>
            {
                return Err(invalid(
                    "tensor",
                    format!(
                        "layer {} ({}) is not between a column- and a row-parallel linear layer, so it \
                         cannot be split over tensor ranks",
                        layer.name,
                        layer.kind.name()
                    ),
                ));
            }
            LayerKind::Conv { .. }
            | LayerKind::ConvTranspose { .. }
            | LayerKind::BatchNorm
            | LayerKind::EmbeddingBag { .. }
            | LayerKind::Interaction
                if tensor > 1 =>
            {
                return Err(invalid(
                    "tensor",
                    format!(
                        "is {tensor}, but model {} has a {} layer ({}): tensor parallelism splits \
                         transformer layers (attention and MLP); use data parallelism for this model",
                        model.name,
                        layer.kind.name(),
                        layer.name
                    ),
                ));
            }
            // A LoRA adapter runs beside its linear layer on that layer's shapes (below): it
            // adds no collective of its own.
            LayerKind::LoraAdapter { .. } => Role::Replicated,
            _ if split => Role::Split,
            _ => Role::Replicated,
        };
        roles.push(role);
        let block_ends = in_block && blocks.get(index + 1).copied().flatten() != blocks[index];
        if block_ends && split && tensor > 1 {
            return Err(invalid(
                "tensor",
                format!(
                    "block ending at layer {} leaves its features split (a column-parallel linear \
                     layer without its row-parallel partner), so it cannot be split over tensor ranks",
                    layer.name
                ),
            ));
        }
    }
    Ok(roles)
}

/// Checks that `split` divides what it must divide in `model`.
pub fn check(model: &Model, split: Split) -> Result<(), ShardError> {
    checked_roles(model, split).map(|_| ())
}

/// [`check`], returning every layer's role when the split is valid.
fn checked_roles(model: &Model, split: Split) -> Result<Vec<Role>, ShardError> {
    super::cnn::check(model, split.cnn)?;
    let Split { tensor, context, expert, expert_load, .. } = split;
    if !(expert_load.is_finite() && expert_load > 0.0) {
        return Err(invalid(
            "expert-skew",
            format!(
                "gives a busiest-expert load of {expert_load}; give a finite skew of at least 1 (1 = balanced routing)"
            ),
        ));
    }
    for (key, value) in [("tensor", tensor), ("context", context), ("expert", expert)] {
        if value == 0 {
            return Err(invalid(key, "must be at least 1, got 0".into()));
        }
    }
    let sequence = sequence_length(model);
    let has_attention = model.layers.iter().any(|l| matches!(l.kind, LayerKind::Attention { .. }));
    if context > 1 {
        if !has_attention {
            return Err(invalid(
                "context",
                format!(
                    "is {context}, but model {} has no attention layer: context parallelism splits \
                     the sequence of attention models; use 1",
                    model.name
                ),
            ));
        }
        let sequence = sequence.unwrap_or(0);
        if sequence % (2 * u64::from(context)) != 0 {
            return Err(invalid(
                "context",
                format!(
                    "is {context}: the sequence ({sequence} tokens) must divide into 2 x context \
                     chunks (causal load balancing gives each context rank two chunks)"
                ),
            ));
        }
    }
    if split.sequence_parallel && tensor > 1 {
        let tokens = sequence.unwrap_or(0) / u64::from(context);
        if tokens % u64::from(tensor) != 0 {
            return Err(invalid(
                "sequence-parallel",
                format!("the {tokens} tokens of each context rank do not divide over {tensor} tensor ranks"),
            ));
        }
    }
    let experts = model.layers.iter().find_map(|l| match l.kind {
        LayerKind::MoeExperts { experts, .. } => Some(experts),
        _ => None,
    });
    if expert_load != 1.0 && experts.is_none() {
        return Err(invalid(
            "expert-skew",
            format!("applies to mixture-of-experts models; model {} has no expert layer", model.name),
        ));
    }
    if expert > 1 {
        match experts {
            None => {
                return Err(invalid(
                    "expert",
                    format!("is {expert}, but model {} has no mixture-of-experts layer; use 1", model.name),
                ));
            }
            Some(experts) if experts % u64::from(expert) != 0 => {
                return Err(invalid(
                    "expert",
                    format!(
                        "is {expert}, but the model has {experts} experts per layer: the expert \
                         degree must divide it (valid: {})",
                        divisors(experts)
                    ),
                ));
            }
            _ => {}
        }
    }
    if split.expert_tensor == 0 {
        return Err(invalid("expert-tensor", "must be at least 1, got 0".into()));
    }
    if split.experts_apart() {
        let Some(ffn_hidden) = model.layers.iter().find_map(|l| match l.kind {
            LayerKind::MoeExperts { ffn_hidden, .. } => Some(ffn_hidden),
            _ => None,
        }) else {
            let key = if split.expert_tensor != tensor { "expert-tensor" } else { "moe-dispatcher" };
            return Err(invalid(
                key,
                format!("applies to mixture-of-experts models; model {} has no expert layer", model.name),
            ));
        };
        if ffn_hidden % u64::from(split.expert_tensor) != 0 {
            return Err(invalid(
                "expert-tensor",
                format!(
                    "is {}, which does not divide the experts' hidden size {ffn_hidden} (valid: {})",
                    split.expert_tensor,
                    divisors(ffn_hidden)
                ),
            ));
        }
        if tensor > 1 && !split.sequence_parallel {
            // megatron/core/transformer/moe/moe_layer.py, MoELayer.forward: "During training,
            // performance may degrade if MoE and tensor parallelism are enabled without also
            // enabling sequence parallelism" (a ValueError).
            return Err(invalid(
                "sequence-parallel",
                format!(
                    "is off with tensor = {tensor}, but Megatron-Core's MoE layer refuses to train with \
                     tensor parallelism and no sequence parallelism (moe_layer.py); set sequence-parallel \
                     = true"
                ),
            ));
        }
    }
    if tensor > 1 {
        let t = u64::from(tensor);
        // Attention first: the head count is the constraint users know. (Two passes rather
        // than a sorted copy: a plan checks thousands of configurations.)
        let is_attention = |layer: &&Layer| matches!(layer.kind, LayerKind::Attention { .. });
        let ordered =
            model.layers.iter().filter(is_attention).chain(model.layers.iter().filter(|l| !is_attention(l)));
        for layer in ordered {
            let bad = match &layer.kind {
                LayerKind::Attention { heads, kv_heads, .. } => {
                    if heads % t != 0 {
                        Some(format!("its {heads} attention heads (valid: {})", divisors(*heads)))
                    } else if kv_heads % t != 0 {
                        Some(format!(
                            "its {kv_heads} key/value heads (Megatron-LM splits query groups over the \
                             tensor ranks; valid: {})",
                            divisors(*kv_heads)
                        ))
                    } else {
                        None
                    }
                }
                LayerKind::Linear { out_features, .. } if layer.input.0.len() >= 2 => {
                    let inputs = layer.input.0.last().copied().unwrap_or(1);
                    (out_features % t != 0 && inputs % t != 0)
                        .then(|| format!("the features of {} ({inputs} -> {out_features})", layer.name))
                }
                LayerKind::MoeExperts { ffn_hidden, .. } if !split.experts_apart() && ffn_hidden % t != 0 => {
                    Some(format!("the experts' hidden size {ffn_hidden} (valid: {})", divisors(*ffn_hidden)))
                }
                _ => None,
            };
            if let Some(what) = bad {
                return Err(invalid(
                    "tensor",
                    format!("is {tensor}, which does not divide {what} in layer {}", layer.name),
                ));
            }
        }
    }
    roles(model, tensor)
}

/// `"1, 2, 4, 8"`: the divisors of `n` up to 64, for error messages.
pub(crate) fn divisors(n: u64) -> String {
    let list: Vec<String> = (1..=n.min(64)).filter(|d| n % d == 0).map(|d| d.to_string()).collect();
    list.join(", ")
}

/// Every layer of `model` as one rank runs it for `micro_batch` samples in `precision`.
pub fn local_layers(
    model: &Model,
    split: Split,
    micro_batch: u64,
    precision: Dtype,
) -> Result<Vec<LocalLayer>, ShardError> {
    if split.cnn != super::cnn::CnnSplit::None {
        return super::cnn::local_layers(model, split.cnn, micro_batch, precision);
    }
    let roles = checked_roles(model, split)?;
    let t = u64::from(split.tensor);
    let c = u64::from(split.context);
    let sequence = sequence_length(model);
    // Activations are stored (and sent) in the storage dtype: bf16 in fp8 training.
    let width = precision.storage().bytes();
    let tp = split.tensor > 1;
    let sp = split.sequence_parallel && tp;
    // Tokens of a sequence-shaped tensor: split over context ranks, and over tensor ranks where
    // sequence parallelism applies.
    let is_sequence = |shape: &Shape| sequence.is_some_and(|s| shape.0.len() >= 2 && shape.0[0] == s);
    let localise = |shape: &Shape, tokens: u64, features: u64| -> Shape {
        let mut dims = shape.0.clone();
        if is_sequence(shape) {
            dims[0] /= tokens;
        } else if sequence.is_some() && dims.len() == 1 && Some(dims[0]) == sequence {
            dims[0] /= tokens; // token ids
        }
        if features > 1 && dims.len() >= 2 {
            let last = dims.len() - 1;
            dims[last] = dims[last].div_ceil(features);
        }
        Shape(dims)
    };
    // Bytes of one micro-batch's full activation of `features` per token (this context rank's
    // tokens).
    let activation = |features: u64| -> Bytes {
        let tokens = sequence.unwrap_or(1) / c;
        Bytes(micro_batch * tokens * features * width)
    };
    let tensor_comm = |kind, bytes, what| Comm { group: GroupKind::Tensor, kind, bytes, what };
    // The tokens a rank holds outside the tensor-parallel regions: its context share, and its
    // tensor share too with sequence parallelism (what Megatron-Core's MoE layer receives).
    let own_tokens_share = if sp { t } else { 1 };
    let own_tokens = c * own_tokens_share;
    let mut result = Vec::with_capacity(model.layers.len());
    for (index, (layer, role)) in model.layers.iter().zip(&roles).enumerate() {
        let replicated_tokens = if sp { c * t } else { c };
        let hidden_in = layer.input.0.last().copied().unwrap_or(1);
        let hidden_out = layer.output.0.last().copied().unwrap_or(1);
        let (kind, input) = match (role, &layer.kind) {
            (Role::Column, LayerKind::Linear { out_features, bias }) => (
                LayerKind::Linear { out_features: out_features.div_ceil(t), bias: *bias },
                localise(&layer.input, c, 1),
            ),
            (Role::Row, kind) => (kind.clone(), localise(&layer.input, c, t)),
            (
                Role::Split,
                LayerKind::Attention { heads, kv_heads, causal, implementation, dropout, value_head_dim },
            ) => (
                LayerKind::Attention {
                    heads: heads / t,
                    kv_heads: kv_heads / t,
                    causal: *causal,
                    implementation: *implementation,
                    dropout: *dropout,
                    value_head_dim: *value_head_dim,
                },
                // Every key of the sequence: the local queries meet all of them in turn.
                localise(&layer.input, 1, t),
            ),
            (Role::Split, LayerKind::Concat { axis, others }) => (
                LayerKind::Concat {
                    axis: *axis,
                    others: others.iter().map(|other| localise(other, c, t)).collect(),
                },
                localise(&layer.input, c, t),
            ),
            (Role::Split, LayerKind::Rope { heads, kv_heads, kernels }) => (
                LayerKind::Rope { heads: heads / t, kv_heads: kv_heads / t, kernels: *kernels },
                localise(&layer.input, c, t),
            ),
            (Role::Split, LayerKind::QkNorm { heads, kv_heads }) => {
                (LayerKind::QkNorm { heads: heads / t, kv_heads: kv_heads / t }, localise(&layer.input, c, t))
            }
            (Role::Split, kind) => (kind.clone(), localise(&layer.input, c, t)),
            (Role::VocabularyEmbedding, LayerKind::Embedding { vocabulary, dim }) => (
                LayerKind::Embedding { vocabulary: vocabulary.div_ceil(t), dim: *dim },
                localise(&layer.input, c, 1),
            ),
            (Role::VocabularyOutput, LayerKind::Linear { out_features, bias }) => (
                LayerKind::Linear { out_features: out_features.div_ceil(t), bias: *bias },
                localise(&layer.input, c, 1),
            ),
            (Role::VocabularyOutput, LayerKind::TiedLinear { out_features, bias, tied_to }) => (
                LayerKind::TiedLinear {
                    out_features: out_features.div_ceil(t),
                    bias: *bias,
                    tied_to: tied_to.clone(),
                },
                localise(&layer.input, c, 1),
            ),
            (Role::VocabularyLoss, kind) => (kind.clone(), localise(&layer.input, c, t)),
            (
                Role::Experts,
                LayerKind::MoeExperts { experts, top_k, ffn_hidden, activation, gated, bias },
            ) if split.experts_apart() => {
                // Megatron-Core's dispatchers with the experts' own tensor degree: balanced
                // routing gives each expert-tensor rank `top-k x etp` times its own tokens (the
                // all-gather dispatcher gathers `etp x ep` ranks' tokens and keeps those routed
                // to its `experts / ep` experts; the all-to-all dispatcher receives its experts'
                // share from the expert group, then gathers the expert-tensor group's).
                let mut input = localise(&layer.input, own_tokens, 1);
                input.0[0] *= top_k * u64::from(split.expert_tensor);
                (
                    LayerKind::MoeExperts {
                        experts: experts / u64::from(split.expert),
                        top_k: 1,
                        ffn_hidden: ffn_hidden / u64::from(split.expert_tensor),
                        activation: *activation,
                        gated: *gated,
                        bias: *bias,
                    },
                    input,
                )
            }
            (
                Role::Experts,
                LayerKind::MoeExperts { experts, top_k, ffn_hidden, activation, gated, bias },
            ) if split.expert > 1 => {
                // Balanced routing: each rank receives as many (token, expert) pairs as its
                // own tokens times top-k, each for one of its `experts / expert` experts.
                let mut input = localise(&layer.input, c, 1);
                input.0[0] *= top_k;
                (
                    LayerKind::MoeExperts {
                        experts: experts / u64::from(split.expert),
                        top_k: 1,
                        ffn_hidden: ffn_hidden / t,
                        activation: *activation,
                        gated: *gated,
                        bias: *bias,
                    },
                    input,
                )
            }
            (
                Role::Experts,
                LayerKind::MoeExperts { experts, top_k, ffn_hidden, activation, gated, bias },
            ) => (
                LayerKind::MoeExperts {
                    experts: *experts,
                    top_k: *top_k,
                    ffn_hidden: ffn_hidden / t,
                    activation: *activation,
                    gated: *gated,
                    bias: *bias,
                },
                localise(&layer.input, c, 1),
            ),
            // A LoRA adapter follows its layer's split: beside a column-parallel layer it reads
            // the whole input and writes this rank's output features (NeMo's adapter splits
            // its down-projection too and gathers its rank-wide result: both negligible),
            // beside a row-parallel one it reads the split features into the partial sums.
            (_, LayerKind::LoraAdapter { rank, out_features }) => {
                match index.checked_sub(1).and_then(|previous| roles.get(previous)) {
                    Some(Role::Column) => (
                        LayerKind::LoraAdapter { rank: *rank, out_features: out_features.div_ceil(t) },
                        localise(&layer.input, c, 1),
                    ),
                    Some(Role::Row) => (layer.kind.clone(), localise(&layer.input, c, t)),
                    _ => (layer.kind.clone(), localise(&layer.input, replicated_tokens, 1)),
                }
            }
            (_, kind) => (kind.clone(), localise(&layer.input, replicated_tokens, 1)),
        };
        let mut local = Layer::new(layer.name.clone(), kind, input)
            .map_err(|source| ShardError::Layer { layer: layer.name.clone(), source })?;
        local.train_as(layer.cost.training);
        let mut entry = LocalLayer::new(index, *role, local);
        use CollectiveKind::{AllGather, AllReduce, AllToAll, ReduceScatter};
        match role {
            Role::Column | Role::VocabularyOutput if tp => {
                let bytes = activation(hidden_in);
                if sp {
                    entry.before_forward.push(tensor_comm(AllGather, bytes, "tp allgather"));
                    entry.after_backward_data.push(tensor_comm(ReduceScatter, bytes, "tp reduce-scatter"));
                } else {
                    entry.after_backward_data.push(tensor_comm(AllReduce, bytes, "tp allreduce"));
                }
            }
            Role::Row if tp => {
                let bytes = activation(hidden_out);
                if sp {
                    entry.after_forward.push(tensor_comm(ReduceScatter, bytes, "tp reduce-scatter"));
                    entry.before_backward.push(tensor_comm(AllGather, bytes, "tp allgather"));
                } else {
                    entry.after_forward.push(tensor_comm(AllReduce, bytes, "tp allreduce"));
                }
            }
            Role::VocabularyEmbedding if tp => {
                let bytes = activation(hidden_out);
                let kind = if sp { ReduceScatter } else { AllReduce };
                entry.after_forward.push(tensor_comm(kind, bytes, "tp embedding reduce"));
            }
            Role::VocabularyLoss if tp => {
                // Megatron's vocabulary-parallel cross-entropy: three fp32 allreduces of one value
                // per token (logit maximum, sum of exponentials, target logit), sent as one.
                let tokens = sequence.unwrap_or(1) / c;
                let bytes = Bytes(3 * 4 * micro_batch * tokens);
                entry.after_forward.push(tensor_comm(AllReduce, bytes, "tp cross-entropy allreduce"));
            }
            Role::Experts if split.experts_apart() => {
                let LayerKind::MoeExperts { top_k, experts, .. } = layer.kind else {
                    unreachable!("experts role")
                };
                entry.work_multiplier = split.expert_load;
                let tokens = micro_batch * sequence.unwrap_or(1) / own_tokens;
                let router_width = split.router_dtype.map_or(width, Dtype::bytes);
                expert_comms(&mut entry, split, [tokens, hidden_in, width, router_width], top_k, experts);
            }
            Role::Experts => {
                let LayerKind::MoeExperts { top_k, .. } = layer.kind else { unreachable!("experts role") };
                let balanced = activation(hidden_in).0 / if sp { t } else { 1 } * top_k;
                let routed = Bytes((balanced as f64 * split.expert_load).round() as u64);
                entry.work_multiplier = split.expert_load;
                let expert_comm =
                    |what| Comm { group: GroupKind::Expert, kind: AllToAll, bytes: routed, what };
                if sp {
                    entry.before_forward.push(tensor_comm(AllGather, activation(hidden_in), "tp allgather"));
                }
                if split.expert > 1 && split.dispatcher == crate::MoeDispatcher::DeepEp {
                    // Two hops each way with the deduplicated copies of balanced routing: once
                    // per node hosting one of a token's experts over the network, once per GPU
                    // hosting one over NVLink (`crate::deepep_copies`); the combine and the
                    // backward mirror the dispatch.
                    let LayerKind::MoeExperts { experts, .. } = layer.kind else {
                        unreachable!("experts role")
                    };
                    let (ep, here) = (u64::from(split.expert), u64::from(split.expert_node.max(1)));
                    let per_token = balanced as f64 / top_k as f64 * split.expert_load;
                    let copies = |holders| {
                        Bytes((per_token * crate::deepep_copies(experts, top_k, holders)).round() as u64)
                    };
                    let (rdma, nvlink) = (copies(ep / here), copies(ep));
                    // A hop over one rank (the group on one node, or one rank per node) is none.
                    let (rails, nodes) = (ep / here > 1, here > 1);
                    let hop = |bytes, what| Comm { group: GroupKind::Expert, kind: AllToAll, bytes, what };
                    let both = |list: &mut Vec<Comm>, first: (bool, Comm), second: (bool, Comm)| {
                        list.extend([first, second].into_iter().filter(|(on, _)| *on).map(|(_, c)| c));
                    };
                    let rdma_hop = |what| (rails, hop(rdma, what));
                    let nvlink_hop = |what| (nodes, hop(nvlink, what));
                    both(
                        &mut entry.before_forward,
                        rdma_hop("deepep rdma dispatch"),
                        nvlink_hop("deepep nvlink dispatch"),
                    );
                    both(
                        &mut entry.after_forward,
                        nvlink_hop("deepep nvlink combine"),
                        rdma_hop("deepep rdma combine"),
                    );
                    both(
                        &mut entry.before_backward,
                        rdma_hop("deepep rdma combine backward"),
                        nvlink_hop("deepep nvlink combine backward"),
                    );
                    both(
                        &mut entry.after_backward_data,
                        nvlink_hop("deepep nvlink dispatch backward"),
                        rdma_hop("deepep rdma dispatch backward"),
                    );
                } else if split.expert > 1 {
                    entry.before_forward.push(expert_comm("ep dispatch"));
                    entry.after_forward.push(expert_comm("ep combine"));
                    entry.before_backward.push(expert_comm("ep combine backward"));
                    entry.after_backward_data.push(expert_comm("ep dispatch backward"));
                }
                if tp {
                    let bytes = activation(hidden_out);
                    if sp {
                        entry.after_forward.push(tensor_comm(ReduceScatter, bytes, "tp reduce-scatter"));
                        entry.before_backward.insert(0, tensor_comm(AllGather, bytes, "tp allgather"));
                        entry.after_backward_data.push(tensor_comm(
                            ReduceScatter,
                            activation(hidden_in),
                            "tp reduce-scatter",
                        ));
                    } else {
                        entry.after_forward.push(tensor_comm(AllReduce, bytes, "tp allreduce"));
                        entry.after_backward_data.push(tensor_comm(AllReduce, bytes, "tp allreduce"));
                    }
                }
            }
            _ => {}
        }
        if let LayerKind::Attention { heads, kv_heads, value_head_dim, .. } = layer.kind
            && split.context > 1
        {
            entry.work_divisor = split.context;
            let (head_dim, value_dim) =
                workloads::layer::attention_head_dims(hidden_in, heads, kv_heads, value_head_dim)
                    .unwrap_or((0, 0));
            // Megatron-Core's --cp-comm-type (Transformer Engine's context-parallel attention):
            // the all-to-all part trades each rank's sequence chunk of every local head for the
            // whole (a2a group's) sequence of 1/a of them, the ring the key/value chunks of the
            // rest.
            let a = u64::from(split.context_a2a.max(1));
            let ring = c / a;
            let tokens = micro_batch * (sequence.unwrap_or(1) / c);
            if a > 1 {
                let qkv = Bytes(tokens * ((heads + kv_heads) * head_dim + kv_heads * value_dim) / t * width);
                let out = Bytes(tokens * (heads / t) * value_dim * width);
                let a2a = |bytes, what| Comm { group: GroupKind::Context, kind: AllToAll, bytes, what };
                entry.before_forward.push(a2a(qkv, "cp all-to-all (q, k, v)"));
                entry.after_forward.insert(0, a2a(out, "cp all-to-all (output)"));
                entry.before_backward.push(a2a(out, "cp all-to-all (output gradient)"));
                entry.after_backward_data.insert(0, a2a(qkv, "cp all-to-all (q, k, v gradients)"));
            }
            if ring > 1 {
                // A key and a value per key/value head.
                let chunk = micro_batch
                    * (sequence.unwrap_or(1) / ring)
                    * (kv_heads / (t * a))
                    * (head_dim + value_dim)
                    * width;
                entry.context_ring = Some(Bytes(chunk));
            }
        }
        result.push(entry);
    }
    Ok(result)
}

/// The collectives of an expert layer laid out apart ([`Split::experts_apart`]) whose rank
/// holds `tokens` tokens of `hidden` features of `width` bytes, routed `top_k` of `experts`
/// ways with probabilities of `router_width` bytes: Megatron-Core's dispatchers as megatron/core/transformer/moe/token_dispatcher.py
/// @ d98e8a64dd moves the bytes.
///
/// All-gather (`MoEAllGatherTokenDispatcher`, when expert-tensor x expert > 1): before the
/// experts, the routing map (one byte per token and expert), the routing probabilities (the
/// router's dtype, the compute dtype by default: `probs.type_as(logits)`) and the hidden states
/// all-gathered over the `tp_ep` group; after them, the outputs reduce-scattered back (in the
/// probabilities' dtype). The backward mirrors what autograd does: the output gradient
/// all-gathered, the hidden-state and probability gradients reduce-scattered (the routing map
/// is gathered under `no_grad`). Sizes are the gathered buffers: `etp x ep` ranks' tokens.
///
/// All-to-all (`MoEAlltoAllTokenDispatcher`): the routed tokens (`own x top-k`, times the
/// busiest expert's load) all-to-all over the expert group, then all-gathered over the
/// expert-tensor group (`AG(TP)`); after the experts, reduce-scattered over it and all-to-all
/// back. Mirrored in the backward.
fn expert_comms(
    entry: &mut LocalLayer,
    split: Split,
    [tokens, hidden, width, router_width]: [u64; 4],
    top_k: u64,
    experts: u64,
) {
    use CollectiveKind::{AllGather, AllToAll, ReduceScatter};
    let own = tokens * hidden * width;
    let comm = |kind, bytes: u64, what| Comm { group: GroupKind::Expert, kind, bytes: Bytes(bytes), what };
    let (etp, ep) = (u64::from(split.expert_tensor), u64::from(split.expert));
    match split.dispatcher {
        crate::MoeDispatcher::AllGather => {
            if etp * ep == 1 {
                return;
            }
            let gathered = own * etp * ep;
            let map = tokens * etp * ep * experts;
            let probabilities = map * router_width;
            // The outputs are reduce-scattered in the probabilities' dtype
            // (`hidden_states.to(self.local_probs.dtype)`), and so is their gradient gathered.
            let outputs = gathered / width.max(1) * router_width;
            entry.before_forward.push(comm(AllGather, map, "tp-ep allgather routing map"));
            entry.before_forward.push(comm(AllGather, probabilities, "tp-ep allgather probabilities"));
            entry.before_forward.push(comm(AllGather, gathered, "tp-ep allgather tokens"));
            entry.after_forward.push(comm(ReduceScatter, outputs, "tp-ep reduce-scatter outputs"));
            entry.before_backward.push(comm(AllGather, outputs, "tp-ep allgather output gradients"));
            entry.after_backward_data.push(comm(
                ReduceScatter,
                gathered,
                "tp-ep reduce-scatter token gradients",
            ));
            entry.after_backward_data.push(comm(
                ReduceScatter,
                probabilities,
                "tp-ep reduce-scatter probability gradients",
            ));
        }
        // DeepEP-style with an expert-tensor degree of its own is refused (`Strategy::check`).
        crate::MoeDispatcher::AllToAll | crate::MoeDispatcher::DeepEp => {
            let routed = (own as f64 * top_k as f64 * split.expert_load).round() as u64;
            let gathered = routed * etp;
            if ep > 1 {
                entry.before_forward.push(comm(AllToAll, routed, "ep dispatch"));
            }
            if etp > 1 {
                entry.before_forward.push(comm(AllGather, gathered, "etp allgather"));
                entry.after_forward.push(comm(ReduceScatter, gathered, "etp reduce-scatter"));
            }
            if ep > 1 {
                entry.after_forward.push(comm(AllToAll, routed, "ep combine"));
                entry.before_backward.push(comm(AllToAll, routed, "ep combine backward"));
            }
            if etp > 1 {
                entry.before_backward.push(comm(AllGather, gathered, "etp allgather backward"));
                entry.after_backward_data.push(comm(ReduceScatter, gathered, "etp reduce-scatter backward"));
            }
            if ep > 1 {
                entry.after_backward_data.push(comm(AllToAll, routed, "ep dispatch backward"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::zoo;

    fn split(tensor: u32, sequence_parallel: bool) -> Split {
        Split {
            tensor,
            sequence_parallel,
            context: 1,
            context_a2a: 1,
            expert: 1,
            expert_tensor: tensor,
            dispatcher: crate::MoeDispatcher::AllToAll,
            expert_node: 1,
            router_dtype: None,
            expert_load: 1.0,
            cnn: super::super::cnn::CnnSplit::None,
        }
    }

    #[test]
    fn gpt_layers_get_megatron_roles() {
        let model = zoo::by_name("megatron-1.7b").unwrap();
        let roles = roles(&model, 2).unwrap();
        let role = |name: &str| roles[model.layers.iter().position(|l| l.name == name).unwrap()];
        assert_eq!(role("embedding"), Role::VocabularyEmbedding);
        assert_eq!(role("layers.0.norm1"), Role::Replicated);
        assert_eq!(role("layers.0.attention.qkv"), Role::Column);
        assert_eq!(role("layers.0.attention.core"), Role::Split);
        assert_eq!(role("layers.0.attention.proj"), Role::Row);
        assert_eq!(role("layers.0.mlp.fc1"), Role::Column);
        assert_eq!(role("layers.0.mlp.gelu"), Role::Split);
        assert_eq!(role("layers.0.mlp.fc2"), Role::Row);
        assert_eq!(role("layers.0.add2"), Role::Replicated);
    }

    #[test]
    fn tensor_parallelism_splits_the_work_of_a_block_by_its_degree() {
        let model = zoo::by_name("megatron-1.7b").unwrap();
        let whole = local_layers(&model, split(1, false), 1, Dtype::Fp16).unwrap();
        let halves = local_layers(&model, split(4, false), 1, Dtype::Fp16).unwrap();
        let block_flops = |layers: &[LocalLayer]| -> f64 {
            layers
                .iter()
                .filter(|l| l.layer.name.starts_with("layers.3.") && l.role != Role::Replicated)
                .map(|l| l.layer.cost.training_flops())
                .sum()
        };
        let ratio = block_flops(&whole) / block_flops(&halves);
        // Row-parallel biases are added after the reduction, on every rank: a hair over 1/4.
        assert!((ratio - 4.0).abs() < 1e-3, "{ratio}");
    }

    #[test]
    fn four_tensor_allreduces_per_layer_and_sequence_parallel_moves_the_same_bytes() {
        let model = zoo::by_name("megatron-1.7b").unwrap();
        let (b, s, h) = (2u64, 2048u64, 2304u64);
        for sp in [false, true] {
            let layers = local_layers(&model, split(4, sp), b, Dtype::Fp16).unwrap();
            let comms: Vec<&Comm> = layers
                .iter()
                .filter(|l| l.layer.name.starts_with("layers.5."))
                .flat_map(|l| {
                    l.before_forward
                        .iter()
                        .chain(&l.after_forward)
                        .chain(&l.before_backward)
                        .chain(&l.after_backward_data)
                })
                .collect();
            let allreduce_equivalents: u64 = comms
                .iter()
                .map(|c| match c.kind {
                    CollectiveKind::AllReduce => 2 * c.bytes.0,
                    _ => c.bytes.0,
                })
                .sum();
            assert_eq!(allreduce_equivalents, 4 * 2 * b * s * h * 2, "sequence parallel {sp}");
            assert_eq!(comms.len(), if sp { 8 } else { 4 });
        }
    }

    #[test]
    fn splits_that_do_not_divide_say_what_would() {
        let model = zoo::by_name("megatron-1.7b").unwrap(); // 24 heads
        let error = check(&model, split(5, false)).unwrap_err().to_string();
        assert!(
            error.contains("24 attention heads") && error.contains("1, 2, 3, 4, 6, 8, 12, 24"),
            "{error}"
        );
        let resnet = zoo::by_name("resnet50").unwrap();
        let error = check(&resnet, split(2, false)).unwrap_err().to_string();
        assert!(error.contains("tensor parallelism splits transformer layers"), "{error}");
        let error = check(
            &resnet,
            Split {
                tensor: 1,
                sequence_parallel: false,
                context: 2,
                context_a2a: 1,
                expert: 1,
                expert_tensor: 1,
                dispatcher: crate::MoeDispatcher::AllToAll,
                expert_node: 1,
                router_dtype: None,
                expert_load: 1.0,
                cnn: super::super::cnn::CnnSplit::None,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("no attention layer"), "{error}");
        let error = check(
            &model,
            Split {
                tensor: 1,
                sequence_parallel: false,
                context: 1,
                context_a2a: 1,
                expert: 2,
                expert_tensor: 1,
                dispatcher: crate::MoeDispatcher::AllToAll,
                expert_node: 1,
                router_dtype: None,
                expert_load: 1.0,
                cnn: super::super::cnn::CnnSplit::None,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("no mixture-of-experts"), "{error}");
    }
}
