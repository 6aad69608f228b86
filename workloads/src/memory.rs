//! The memory model: what one device holds at the peak of a training iteration, split into
//! weights, gradients, optimizer state, activations, temporary buffers and communication
//! buffers, as a function of how the strategy shards the model ([`Sharding`]).
//!
//! Model state follows the ZeRO paper's accounting (Rajbhandari et al. 2020, "ZeRO: Memory
//! Optimizations Toward Training Trillion Parameter Models", section 3.1), per parameter:
//! - weights in the compute dtype (2 bytes in fp16/bf16; fp8 training keeps bf16 weights);
//! - gradients in the gradient dtype;
//! - optimizer state in fp32: an fp32 master copy of the weights when they are narrower than
//!   fp32 (mixed precision), plus one fp32 tensor per state (momentum; Adam's two moments).
//!   Adam in mixed precision is the paper's 2 + 2 + 12 = 16 bytes per parameter. The copy is
//!   2 bytes of remainders, or none, where the optimizer keeps it so
//!   ([`MasterWeights`](crate::optimizer::MasterWeights)); the states are narrower where the
//!   optimizer keeps them in bf16 (`optimizer_precision`).
//!
//! ZeRO stage 1 shards the optimizer state over the data-parallel ranks, stage 2 also the
//! gradients, stage 3 also the weights. Tensor parallelism shards every layer's parameters
//! (Megatron-LM replicates norms and row-parallel biases, well under 0.1% of a transformer);
//! pipeline parallelism gives each stage its share of the numbered blocks plus the layers before
//! (first stage) or after (last stage) them, and the worse of the two stages is reported.
//!
//! Activations: each layer's [`LayerCost::activation_elements`](crate::LayerCost) are the tensors its backward
//! reads. Neighbouring layers share tensors (a convolution keeps its input, which is the
//! previous ReLU's output, which the ReLU keeps too), so the model identifies tensors and counts
//! each once: a layer whose input shape is the previous layer's output shape reads that output;
//! views (flatten, reshape, slice) pass their input's identity on. A layer that starts a branch
//! (its input is not the previous output) is assumed to read a tensor of its own, so a branch
//! input that another layer also keeps is counted twice (ResNet projection shortcuts, Inception
//! branches): a small overestimate, never an underestimate. What PyTorch keeps per kind:
//! convolutions, linear layers, batch/layer/RMS norm, GELU, SiLU keep their input; ReLU
//! (torchvision's in-place ReLU), sigmoid, tanh and softmax their output; dropout a one-byte
//! mask; max pooling its input and int64 indices; norms their fp32 statistics; cross-entropy
//! its log-probabilities in fp32 under mixed precision (autocast runs it in fp32).
//!
//! Recomputation (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
//! Transformer Models"): `selective` drops the `heads x s x s` attention tensors (recomputed in
//! the backward); `full` keeps only the input of each numbered block (`layers.<i>`,
//! `layer<k>.<j>`: the name up to its first numeric component) and recomputes the block in its
//! backward, so one block's activations are live on top of the checkpoints. A numbered name
//! that only one layer has is not a block (VGG's `features.3`), and where checkpointing would
//! keep more than it saves, the layers keep their activations. For a GPT layer in
//! fp16 without recomputation this gives Korthikanti's `34 s b h + 5 a s^2 b` (the softmax
//! output, the attention dropout's one-byte mask and its output: 2 + 1 + 2 bytes per score);
//! `34 s b h` with selective; `2 s b h` with full.
//!
//! Under tensor parallelism, tensors of a block are split over the tensor ranks except those
//! Megatron-LM replicates: tensors of the block's input shape (norm inputs, the inputs of the
//! column-parallel projections, dropout masks) and norm statistics. The input of a linear layer
//! whose output has the block's input shape (a row-parallel projection) is split. This is
//! Korthikanti's `s b h (10 + 24/t + 5 a s/(h t))`; with sequence parallelism everything in a
//! block is split (`34 s b h / t`). Outside the blocks tensors are replicated, except the
//! cross-entropy's log-probabilities (Megatron's vocabulary-parallel loss).
//!
//! FP8 training (Transformer Engine): only the GEMMs run in FP8. Activations are kept in bf16,
//! except that each FP8 linear layer keeps the FP8 cast of its input (one byte per element, a
//! tensor of its own), which makes a GPT layer's `34 s b h` (selective recomputation) `27 s b h`;
//! weights are bf16 plus an FP8 copy and an FP8 transpose of every linear weight, which TE
//! caches across micro-batches (NVIDIA/TransformerEngine @ v1.8 :
//! transformer_engine/pytorch/module/linear.py). With FP8 parameters
//! ([`WeightStorage::fp8`](crate::optimizer::WeightStorage)) the linear weights are the FP8
//! tensor and its cached transpose only: 2 bytes instead of 4.
//!
//! Temporary buffers: the largest pair of input and output gradients alive during one layer's
//! backward, plus (ZeRO stage 3) the largest layer's gathered weights and gradients.
//! Communication buffers are the strategy's (DDP's gradient buckets, when they are copies beside
//! the gradients: `parallelism.gradient-buffers`).
//!
//! What the breakdown adds up to is what `torch.cuda.max_memory_allocated()` would report. Not
//! modelled: the CUDA context and NCCL's internal buffers (outside PyTorch's allocator) and the
//! caching allocator's free-but-reserved blocks, for which no public source gives a figure that
//! holds across devices and versions (reports print the margin left for them instead,
//! [`Margin`]); the optimizer step's temporaries; inputs prefetched by the data loader.

use std::fmt;
use std::ops::Range;

use serde::Serialize;
use sim_core::units::Bytes;

use crate::device::{Device, Dtype};
use crate::layer::{Activation, AttentionKernel, Layer, LayerKind};
use crate::model::Model;
use crate::optimizer::{MasterWeights, Optimizer, WeightStorage};

/// Which activations are recomputed in the backward pass instead of being kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Recompute {
    /// Keep everything the backward reads.
    #[default]
    None,
    /// Recompute the attention scores and probabilities (Korthikanti et al.'s selective
    /// recomputation): the `heads x s x s` tensors are not kept.
    Selective,
    /// Keep each numbered block's input only and recompute the block in its backward.
    Full,
}

impl Recompute {
    /// Every mode, for error messages.
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    /// The name used in scenario files.
    pub const fn name(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        }
    }
}

impl fmt::Display for Recompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Recompute {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        Recompute::ALL.into_iter().find(|mode| mode.name() == name).ok_or_else(|| {
            let valid: Vec<&str> = Recompute::ALL.iter().map(|mode| mode.name()).collect();
            format!("unknown recomputation {name:?}; valid: {}", valid.join(", "))
        })
    }
}

/// How a strategy splits the model over devices: the factors the memory of one device
/// depends on. The data-parallel strategy uses [`Sharding::data_parallel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sharding {
    /// Data-parallel ranks (ZeRO shards over these).
    pub data: u32,
    /// Tensor-parallel ranks (Megatron-LM style).
    pub tensor: u32,
    /// Pipeline stages.
    pub pipeline: u32,
    /// ZeRO stage: 0 (none), 1 (optimizer state), 2 (and gradients), 3 (and weights).
    pub zero_stage: u8,
    /// Megatron-LM sequence parallelism: activations of a block are all split over the tensor
    /// ranks.
    pub sequence_parallel: bool,
}

impl Sharding {
    /// Plain data parallelism over `ranks` devices: every device holds everything.
    pub const fn data_parallel(ranks: u32) -> Sharding {
        Sharding { data: ranks, tensor: 1, pipeline: 1, zero_stage: 0, sequence_parallel: false }
    }

    /// Checks that every factor is at least 1 and the ZeRO stage at most 3.
    pub fn validate(&self) -> Result<(), MemoryError> {
        for (key, value) in [("data", self.data), ("tensor", self.tensor), ("pipeline", self.pipeline)] {
            if value == 0 {
                return Err(MemoryError::Invalid { key, message: "must be at least 1, got 0".into() });
            }
        }
        if self.zero_stage > 3 {
            return Err(MemoryError::Invalid {
                key: "zero-stage",
                message: format!("is {}; ZeRO stages are 0, 1, 2 and 3", self.zero_stage),
            });
        }
        Ok(())
    }
}

impl Default for Sharding {
    /// One device.
    fn default() -> Self {
        Sharding::data_parallel(1)
    }
}

/// The memory model's input could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MemoryError {
    /// A sharding factor or count is invalid.
    #[error("memory model: `{key}` {message}")]
    Invalid {
        /// The parameter.
        key: &'static str,
        /// What is wrong and what would be valid.
        message: String,
    },
    /// The configuration needs more memory than the device has.
    #[error(
        "does not fit in memory: needs {} per device, {device} has {} ({capacity}): over by {} ({:.1}% of its memory)\n{breakdown}",
        gigabytes(breakdown.total()),
        gigabytes(*capacity),
        gigabytes(Bytes(breakdown.total().0.saturating_sub(capacity.0))),
        -100.0 * Margin::new(breakdown.total(), *capacity).fraction()
    )]
    DoesNotFit {
        /// The device's name for reports.
        device: String,
        /// Its memory capacity.
        capacity: Bytes,
        /// What the configuration needs.
        breakdown: MemoryBreakdown,
    },
}

/// What one device holds at the peak of an iteration, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct MemoryBreakdown {
    /// Model weights in the compute dtype (this device's shard).
    pub weights: Bytes,
    /// Gradients in the gradient dtype.
    pub gradients: Bytes,
    /// Optimizer state: fp32 master weights (mixed precision) and momenta / moments.
    pub optimizer: Bytes,
    /// Activations kept for the backward pass (checkpoints and one block's working set under
    /// full recomputation).
    pub activations: Bytes,
    /// Transient buffers: gradients flowing through the backward, gathered ZeRO-3 weights.
    pub temporary: Bytes,
    /// Communication buffers (DDP's gradient buckets).
    pub communication: Bytes,
}

impl MemoryBreakdown {
    /// The sum of every part.
    pub fn total(&self) -> Bytes {
        Bytes(
            [
                self.weights,
                self.gradients,
                self.optimizer,
                self.activations,
                self.temporary,
                self.communication,
            ]
            .iter()
            .fold(0u64, |sum, part| sum.saturating_add(part.0)),
        )
    }

    /// How far the total is from `device`'s memory.
    pub fn margin(&self, device: &Device) -> Margin {
        Margin::new(self.total(), device.memory_capacity)
    }

    /// `Ok` if the total fits in `device`'s memory, else [`MemoryError::DoesNotFit`] with this
    /// breakdown.
    pub fn check(&self, device: &Device) -> Result<(), MemoryError> {
        if self.total() <= device.memory_capacity {
            Ok(())
        } else {
            Err(MemoryError::DoesNotFit {
                device: device.display_name.clone(),
                capacity: device.memory_capacity,
                breakdown: *self,
            })
        }
    }

    /// The parts with their report names, in report order.
    pub fn parts(&self) -> [(&'static str, Bytes); 6] {
        [
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("optimizer state", self.optimizer),
            ("activations", self.activations),
            ("temporary buffers", self.temporary),
            ("communication buffers", self.communication),
        ]
    }
}

/// How far what a configuration needs is from its device's capacity: the figure a planner
/// reads, rather than a yes or no.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Margin {
    /// What one device needs at its peak.
    pub needed: Bytes,
    /// The device's memory.
    pub capacity: Bytes,
}

impl Margin {
    /// The margin of `needed` on a device of `capacity`.
    pub const fn new(needed: Bytes, capacity: Bytes) -> Margin {
        Margin { needed, capacity }
    }

    /// Whether it fits (what it needs is at most the capacity).
    pub const fn fits(&self) -> bool {
        self.needed.0 <= self.capacity.0
    }

    /// Bytes to spare: the capacity less what is needed, negative when over.
    pub fn spare_bytes(&self) -> i128 {
        i128::from(self.capacity.0) - i128::from(self.needed.0)
    }

    /// [`Margin::spare_bytes`] as a fraction of the capacity (negative when over).
    pub fn fraction(&self) -> f64 {
        self.spare_bytes() as f64 / self.capacity.0.max(1) as f64
    }
}

impl fmt::Display for Margin {
    /// `"needs 71.30 GB of 85.90 GB (80 GiB): 14.60 GB (17.0%) to spare"`, or `"...: over by
    /// 5.96 GB (6.9%)"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gap = Bytes(self.spare_bytes().unsigned_abs().min(u128::from(u64::MAX)) as u64);
        let percent = 100.0 * self.fraction().abs();
        write!(f, "needs {} of {} ({})", gigabytes(self.needed), gigabytes(self.capacity), self.capacity)?;
        if self.fits() {
            write!(f, ": {} ({percent:.1}%) to spare", gigabytes(gap))
        } else {
            write!(f, ": over by {} ({percent:.1}%)", gigabytes(gap))
        }
    }
}

/// `"85.90 GB"`: decimal gigabytes with two decimals, the unit memory reports use throughout.
pub fn gigabytes(bytes: Bytes) -> String {
    format!("{:.2} GB", bytes.as_f64() / 1e9)
}

impl fmt::Display for MemoryBreakdown {
    /// One part per line, then the total, sizes in GB.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, bytes) in self.parts() {
            writeln!(f, "  {name:<22} {:>12}", gigabytes(bytes))?;
        }
        write!(f, "  {:<22} {:>12}", "total", gigabytes(self.total()))
    }
}

/// Everything the memory model needs: the model, the dtypes, the optimizer, the micro-batch and
/// the strategy's sharding and buffers.
#[derive(Debug, Clone)]
pub struct MemoryPlan<'a> {
    /// What is trained.
    pub model: &'a Model,
    /// Compute dtype: activations and working weights.
    pub precision: Dtype,
    /// Dtype of the gradients.
    pub gradient_precision: Dtype,
    /// Dtype of the optimizer's states and of its copy of the weights: fp32 (at least the
    /// weights' width), or narrower where the optimizer keeps them so (Apex's
    /// DistributedFusedAdam: "dtype (torch.dtype, optional): datatype for optimizer state
    /// (default: torch.float32)").
    pub optimizer_precision: Dtype,
    /// The optimizer, whose state is kept in fp32.
    pub optimizer: Optimizer,
    /// How the weights and the optimizer's copy of them are stored.
    pub weights: WeightStorage,
    /// Samples per device per forward pass.
    pub micro_batch: u64,
    /// Micro-batches whose activations are alive at once on the first pipeline stage: the
    /// pipeline depth under 1F1B. Used only when `sharding.pipeline > 1`: without pipelining,
    /// gradient accumulation runs one micro-batch at a time.
    pub micro_batches_in_flight: u64,
    /// What is recomputed instead of kept.
    pub recompute: Recompute,
    /// How the model is split.
    pub sharding: Sharding,
    /// Communication buffers the strategy allocates (e.g. DDP's gradient buckets).
    pub communication_buffers: Bytes,
}

/// A tensor a layer keeps for its backward.
#[derive(Debug, Clone, Copy)]
struct Saved {
    /// Identity: 0 is the model input, `i + 1` the output of layer `i`; `None` a tensor only
    /// this layer keeps.
    tensor: Option<usize>,
    /// Elements per sample.
    elements: u64,
    /// Bytes per element.
    width: u64,
    /// Never split over tensor ranks (norm statistics).
    replicated: bool,
    /// The input of a linear layer whose output has the block's shape (row-parallel).
    row_parallel_input: bool,
}

/// The tensors one layer keeps: at most three (input, output or own tensor, and statistics or
/// a mask), held inline because the accounting asks for them once per layer and strategy.
#[derive(Debug, Clone, Copy)]
struct SavedTensors {
    list: [Saved; 3],
    len: usize,
}

impl SavedTensors {
    const NONE: Saved =
        Saved { tensor: None, elements: 0, width: 0, replicated: false, row_parallel_input: false };

    fn new() -> SavedTensors {
        SavedTensors { list: [Self::NONE; 3], len: 0 }
    }

    fn of(saved: &[Saved]) -> SavedTensors {
        let mut list = SavedTensors::new();
        for &one in saved {
            list.push(one);
        }
        list
    }

    fn push(&mut self, saved: Saved) {
        self.list[self.len] = saved;
        self.len += 1;
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

impl std::ops::Deref for SavedTensors {
    type Target = [Saved];
    fn deref(&self) -> &[Saved] {
        &self.list[..self.len]
    }
}

impl std::ops::DerefMut for SavedTensors {
    fn deref_mut(&mut self) -> &mut [Saved] {
        &mut self.list[..self.len]
    }
}

/// Activation bytes of one device for one micro-batch, split by where they live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActivationBytes {
    /// Kept by the layers before the first numbered block (embeddings, a CNN's stem).
    pub before_blocks: u64,
    /// Kept inside the numbered blocks, all blocks together.
    pub blocks: u64,
    /// Kept by the layers after the last numbered block (the head, the loss).
    pub after_blocks: u64,
    /// Full recomputation: one block's activations, alive while it is recomputed.
    pub working_set: u64,
}

impl ActivationBytes {
    /// Everything, for one micro-batch on one pipeline stage.
    pub fn total(&self) -> u64 {
        self.before_blocks + self.blocks + self.after_blocks + self.working_set
    }
}

/// A view: the output is the input's storage.
fn is_view(kind: &LayerKind) -> bool {
    matches!(kind, LayerKind::Flatten | LayerKind::Reshape { .. } | LayerKind::Slice { .. })
}

impl MemoryPlan<'_> {
    /// A plan for plain data parallelism without recomputation: one micro-batch in flight.
    pub fn data_parallel<'m>(
        model: &'m Model,
        precision: Dtype,
        gradient_precision: Dtype,
        optimizer: Optimizer,
        batch: u64,
        ranks: u32,
    ) -> MemoryPlan<'m> {
        MemoryPlan {
            model,
            precision,
            gradient_precision,
            optimizer_precision: Dtype::Fp32,
            optimizer,
            weights: WeightStorage::default(),
            micro_batch: batch,
            micro_batches_in_flight: 1,
            recompute: Recompute::None,
            sharding: Sharding::data_parallel(ranks),
            communication_buffers: Bytes::ZERO,
        }
    }

    /// Bytes per element of the working weights and of the activations layers keep: the
    /// compute dtype's storage ([`Dtype::storage`]: fp8 training keeps bf16 weights and
    /// activations, casts per GEMM, and keeps each fp8 linear layer's fp8 input besides,
    /// [`MemoryPlan::saved`]).
    fn storage_width(&self) -> u64 {
        self.precision.storage().bytes()
    }

    /// Bytes per parameter of the FP8 copies of the GEMM weights that FP8 training keeps beside
    /// the bf16 weights: Transformer Engine's linear layers cast each weight to FP8 and its
    /// transpose to FP8 (for the backward's data gradient) on a step's first micro-batch and
    /// cache both for the others (NVIDIA/TransformerEngine @ v1.8 :
    /// transformer_engine/pytorch/module/linear.py, `Linear.forward`: `get_fp8_workspace(...,
    /// cache_name="weight", with_transpose=...)`, `update_transpose_cache`), which Megatron-Core
    /// asks for by passing `is_first_microbatch` (megatron/core/extensions/transformer_engine.py,
    /// `TELinear.forward`, unless `disable_parameter_transpose_cache`): 1 + 1 bytes.
    /// With FP8 parameters these are the only copy of those weights: 2 bytes in all, where
    /// the bf16 weight's 2 bytes no longer count ([`MemoryPlan::device_breakdown`]).
    fn fp8_weight_copy_width(&self) -> u64 {
        if self.precision == Dtype::Fp8 { 2 } else { 0 }
    }

    /// Bytes per parameter of the optimizer's copy of the weights ([`MasterWeights`]): a full
    /// copy in the optimizer's precision when the compute weights are narrower (FP8 training's
    /// are: bf16, or FP8 parameters), 2 bytes of remainders, or none.
    fn master_width(&self) -> u64 {
        match self.weights.master {
            MasterWeights::Copy if self.storage_width() < 4 => self.state_width(),
            MasterWeights::Copy | MasterWeights::InPlace => 0,
            MasterWeights::Remainders => 2,
        }
    }

    /// Parameters of the layers whose products run in FP8 ([`crate::compute::fp8_linear`], the
    /// same rule the compute model prices them by): the weights FP8 training casts.
    fn linear_parameters(&self) -> u64 {
        self.model
            .layers
            .iter()
            .filter(|layer| crate::compute::fp8_linear(layer))
            .map(|layer| layer.cost.params + layer.frozen_weights())
            .sum()
    }

    /// Of `parameters` held by one device, those of linear layers (FP8 training keeps FP8
    /// copies of them): the model's share of linear parameters applied to the device's. 0
    /// unless the compute dtype is FP8.
    fn fp8_copied_parameters(&self, parameters: u64) -> u64 {
        if self.precision != Dtype::Fp8 {
            return 0;
        }
        let all = (self.model.parameters() + self.model.frozen_parameters()).max(1);
        (u128::from(parameters) * u128::from(self.linear_parameters().min(all)) / u128::from(all)) as u64
    }

    /// Of `parameters` held by one device, those Muon orthogonalises ([`crate::muon::matrices`]):
    /// the model's share of them applied to the device's. The rest are stepped by AdamW.
    fn muon_parameters(&self, parameters: u64) -> u64 {
        let all = (self.model.parameters() + self.model.frozen_parameters()).max(1);
        let muon: u64 = self.model.layers.iter().map(crate::muon::matrix_parameters).sum();
        (u128::from(parameters) * u128::from(muon.min(all)) / u128::from(all)) as u64
    }

    /// Bytes per element of the optimizer's tensors: fp32 (fp64 when training in fp64), or the
    /// narrower `optimizer_precision` an optimizer keeps them in.
    fn state_width(&self) -> u64 {
        if self.optimizer_precision.bytes() < 4 {
            self.optimizer_precision.bytes()
        } else {
            self.storage_width().max(4)
        }
    }

    /// The tensors `layer` keeps, with `input` the identity of the tensor it reads.
    fn saved(&self, layer: &Layer, input: Option<usize>, output: usize, block_elements: u64) -> SavedTensors {
        let width = self.storage_width();
        let elements_in = layer.input.elements();
        let elements_out = layer.output.elements();
        let kept = layer.cost.activation_elements;
        let tensor = |tensor: Option<usize>, elements: u64, width: u64| Saved {
            tensor,
            elements,
            width,
            replicated: false,
            row_parallel_input: false,
        };
        let keeps_input = |own_width: u64| {
            let from_input = kept.min(elements_in);
            let mut saved = SavedTensors::of(&[tensor(input, from_input, width)]);
            if kept > from_input {
                saved.push(tensor(None, kept - from_input, own_width));
            }
            saved
        };
        let keeps_output = || SavedTensors::of(&[tensor(Some(output), kept.min(elements_out), width)]);
        if kept == 0 {
            return SavedTensors::new();
        }
        match &layer.kind {
            LayerKind::Linear { .. } | LayerKind::TiedLinear { .. } => {
                let mut saved = keeps_input(width);
                saved[0].row_parallel_input = elements_out == block_elements;
                if self.precision == Dtype::Fp8 && crate::compute::fp8_linear(layer) {
                    // Transformer Engine's FP8 linear keeps the FP8 cast of its input (or its
                    // transpose), one byte per element, a tensor of its own: `saved_inputmat` /
                    // `saved_inputmat_t` (NVIDIA/TransformerEngine @ v1.8 :
                    // transformer_engine/pytorch/module/linear.py, `_Linear.forward`). The
                    // output layer, tied or not, is Megatron's own GEMM, not an FP8 one.
                    saved[0].tensor = None;
                    saved[0].width = 1;
                }
                saved
            }
            LayerKind::Conv { .. }
            | LayerKind::ConvTranspose { .. }
            | LayerKind::BatchNorm
            | LayerKind::Glu { .. }
            | LayerKind::Interaction
            | LayerKind::Embedding { .. }
            | LayerKind::EmbeddingBag { .. }
            | LayerKind::MoeRouter { .. }
            | LayerKind::Matmul { .. }
            | LayerKind::Activation {
                function:
                    Activation::Gelu | Activation::Silu | Activation::LeakyRelu | Activation::ReluSquared,
            } => keeps_input(width),
            LayerKind::Activation { function: Activation::Relu | Activation::Sigmoid | Activation::Tanh }
            | LayerKind::Softmax => keeps_output(),
            LayerKind::LayerNorm { .. } | LayerKind::RmsNorm => {
                let mut saved = keeps_input(4);
                for statistics in saved.iter_mut().skip(1) {
                    statistics.replicated = true;
                }
                saved
            }
            LayerKind::MaxPool { .. } => keeps_input(8),
            LayerKind::GlobalMaxPool => SavedTensors::of(&[tensor(None, kept, 8)]),
            LayerKind::Dropout => SavedTensors::of(&[tensor(None, kept, 1)]),
            LayerKind::CrossEntropy { .. } => SavedTensors::of(&[tensor(None, kept, width.max(4))]),
            LayerKind::Attention { implementation: AttentionKernel::Standard, dropout, heads, .. } => {
                let mut saved = keeps_input(width);
                if self.recompute != Recompute::None {
                    saved.truncate(1); // the probabilities (and the dropout's tensors) are recomputed
                } else if *dropout && saved.len() == 2 {
                    // The probabilities and the dropped probabilities in the compute dtype, and
                    // PyTorch's one-byte (`bool`) mask: Korthikanti's 2 + 2 + 1 bytes per score.
                    let tokens = layer.input.0.first().copied().unwrap_or(0);
                    let mask = heads.saturating_mul(tokens).saturating_mul(tokens).min(saved[1].elements);
                    saved[1].elements -= mask;
                    saved.push(tensor(None, mask, 1));
                }
                saved
            }
            LayerKind::Attention { implementation: AttentionKernel::Math, heads, .. } => {
                let mut saved = keeps_input(width);
                if self.recompute != Recompute::None {
                    saved.truncate(1);
                } else if width < 4 {
                    // Under autocast in half precision the fp32 softmax keeps its fp32 output
                    // for its backward beside the half copy `att @ v` keeps: 4 bytes more per
                    // score (torch/csrc/autograd: softmax's backward reads its result).
                    let tokens = layer.input.0.first().copied().unwrap_or(0);
                    let scores = heads.saturating_mul(tokens).saturating_mul(tokens);
                    saved.push(tensor(None, scores, 4));
                }
                saved
            }
            LayerKind::Attention { implementation: AttentionKernel::Flash, .. } => {
                let from_input = kept.min(elements_in);
                let from_output = (kept - from_input).min(elements_out);
                let mut saved = SavedTensors::of(&[
                    tensor(input, from_input, width),
                    tensor(Some(output), from_output, width),
                ]);
                let statistics = kept - from_input - from_output;
                if statistics > 0 {
                    saved.push(tensor(None, statistics, 4));
                }
                saved
            }
            _ => SavedTensors::of(&[tensor(None, kept, width)]),
        }
    }

    /// Activation bytes for one micro-batch of the whole model (every block, no pipeline
    /// split), each tensor counted once.
    pub fn activations(&self) -> ActivationBytes {
        self.activation_accounting().0
    }

    /// The activation bytes each layer keeps for one micro-batch (each tensor counted once, at
    /// the first layer that keeps it): what out-of-core training copies to host memory after
    /// the layer's forward. Without recomputation they add up to [`MemoryPlan::activations`].
    pub fn activations_per_layer(&self) -> Vec<u64> {
        self.activation_accounting().1
    }

    /// [`MemoryPlan::activations`] of the model made of layers `range` alone (taking the
    /// first one's input), as a pipeline chunk holds them: the same as a [`Model`] of those
    /// layers, without copying them. A block cut by the range's ends counts where at least two
    /// of its layers are inside, as in such a model.
    pub fn activations_of(&self, range: Range<usize>) -> ActivationBytes {
        let all = self.model.blocks();
        let blocks: Vec<Option<u32>> = range
            .clone()
            .map(|index| {
                let shared = (index > range.start && all[index - 1] == all[index])
                    || (index + 1 < range.end && all[index + 1] == all[index]);
                all[index].filter(|_| shared)
            })
            .collect();
        let input = if range.start == 0 { &self.model.input } else { &self.model.layers[range.start].input };
        self.accounting(&self.model.layers[range], input, &blocks).0
    }

    /// [`MemoryPlan::activations`] and the bytes attributed to each layer.
    fn activation_accounting(&self) -> (ActivationBytes, Vec<u64>) {
        self.accounting(&self.model.layers, &self.model.input, self.model.blocks())
    }

    /// [`MemoryPlan::activation_accounting`] of `layers`, which take `input` and are in the
    /// numbered `blocks`.
    fn accounting(
        &self,
        layers: &[Layer],
        input: &crate::layer::Shape,
        blocks: &[Option<u32>],
    ) -> (ActivationBytes, Vec<u64>) {
        let model_input = input;
        let mut per_layer = vec![0u64; layers.len()];
        let tensor_ranks = u64::from(self.sharding.tensor.max(1));
        let batch = self.micro_batch;
        // Identity of each layer's output: its own, or its input's for a view.
        let mut output_of = vec![0usize; layers.len()];
        let mut counted = vec![false; layers.len() + 1];
        let first_block = blocks.iter().position(Option::is_some);
        let last_block = blocks.iter().rposition(Option::is_some);
        let mut result = ActivationBytes::default();
        // Full recomputation: the current block's activations while it is recomputed, and the
        // tensors they include (its checkpoint counts as already kept).
        let mut block_bytes = 0u64;
        let mut block_counted: Vec<usize> = Vec::new();
        let mut block_input_elements = 0u64;
        let full = self.recompute == Recompute::Full;
        let sequence_split = if self.sharding.sequence_parallel { tensor_ranks } else { 1 };
        for (index, layer) in layers.iter().enumerate() {
            let previous = if index == 0 { model_input } else { &layers[index - 1].output };
            let input = (*previous == layer.input).then(|| if index == 0 { 0 } else { output_of[index - 1] });
            output_of[index] = if is_view(&layer.kind) { input.unwrap_or(index + 1) } else { index + 1 };
            let block = blocks[index];
            let in_block = block.is_some();
            if in_block && (index == 0 || blocks[index - 1] != block) {
                result.working_set = result.working_set.max(block_bytes);
                block_bytes = 0;
                block_counted.clear();
                block_input_elements = layer.input.elements();
                if full {
                    // The checkpoint: the block's input, kept once whatever else keeps it.
                    let fresh = match input {
                        Some(key) => !std::mem::replace(&mut counted[key], true),
                        None => true,
                    };
                    if fresh {
                        result.blocks = result.blocks.saturating_add(
                            batch.saturating_mul(block_input_elements).saturating_mul(self.storage_width())
                                / sequence_split,
                        );
                    }
                    block_counted.extend(input);
                }
            }
            for &saved in self.saved(layer, input, output_of[index], block_input_elements).iter() {
                if let Some(key) = saved.tensor {
                    if full && in_block {
                        if block_counted.contains(&key) {
                            continue;
                        }
                        block_counted.push(key);
                    } else if std::mem::replace(&mut counted[key], true) {
                        continue;
                    }
                }
                let split = if in_block {
                    let replicated = !self.sharding.sequence_parallel
                        && (saved.replicated
                            || (saved.elements == block_input_elements && !saved.row_parallel_input));
                    if replicated { 1 } else { tensor_ranks }
                } else if matches!(layer.kind, LayerKind::CrossEntropy { .. }) {
                    tensor_ranks
                } else {
                    1
                };
                let bytes = batch.saturating_mul(saved.elements).saturating_mul(saved.width) / split;
                per_layer[index] = per_layer[index].saturating_add(bytes);
                if in_block {
                    if full { block_bytes += bytes } else { result.blocks += bytes }
                } else if first_block.is_none_or(|first| index < first) {
                    result.before_blocks += bytes;
                } else if last_block.is_some_and(|last| index > last) {
                    result.after_blocks += bytes;
                } else {
                    result.blocks += bytes;
                }
            }
        }
        if full {
            result.working_set = result.working_set.max(block_bytes);
            // Checkpointing never costs more than keeping everything: a framework would not do it.
            let kept = MemoryPlan { recompute: Recompute::None, ..self.clone() }.accounting(
                layers,
                model_input,
                blocks,
            );
            if kept.0.total() < result.total() {
                return kept;
            }
        }
        (result, per_layer)
    }

    /// The layer ranges whose forward kernels the backward pass re-runs: each standard
    /// attention layer under selective recomputation; each numbered block under full
    /// recomputation, unless checkpointing would keep more than it saves (then none).
    pub fn recomputed_ranges(&self) -> Vec<Range<usize>> {
        let layers = &self.model.layers;
        match self.recompute {
            Recompute::None => Vec::new(),
            Recompute::Selective => (0..layers.len())
                .filter(|&index| {
                    matches!(
                        layers[index].kind,
                        LayerKind::Attention {
                            implementation: AttentionKernel::Standard | AttentionKernel::Math,
                            ..
                        }
                    )
                })
                .map(|index| index..index + 1)
                .collect(),
            Recompute::Full => {
                let kept = MemoryPlan { recompute: Recompute::None, micro_batch: 1, ..self.clone() };
                let checkpointed = MemoryPlan { micro_batch: 1, ..self.clone() };
                if checkpointed.activations() == kept.activations() {
                    return Vec::new();
                }
                let blocks = self.model.blocks();
                let mut ranges: Vec<Range<usize>> = Vec::new();
                for (index, block) in blocks.iter().enumerate() {
                    if block.is_none() {
                        continue;
                    }
                    match ranges.last_mut() {
                        Some(range) if range.end == index && blocks[range.start] == *block => range.end += 1,
                        _ => ranges.push(index..index + 1),
                    }
                }
                ranges
            }
        }
    }

    /// Learned parameters before the first block, inside the blocks and after the last one.
    fn parameters_by_part(&self) -> (u64, u64, u64) {
        let layers = &self.model.layers;
        let blocks = self.model.blocks();
        let first = blocks.iter().position(Option::is_some);
        let last = blocks.iter().rposition(Option::is_some);
        let (mut before, mut inside, mut after) = (0u64, 0u64, 0u64);
        for (index, layer) in layers.iter().enumerate() {
            let params = layer.cost.params;
            match (first, last) {
                (Some(first), _) if index < first => before += params,
                (_, Some(last)) if index > last => after += params,
                (None, _) => before += params,
                _ => inside += params,
            }
        }
        (before, inside, after)
    }

    /// The memory of the most loaded device.
    pub fn breakdown(&self) -> Result<MemoryBreakdown, MemoryError> {
        self.sharding.validate()?;
        if self.micro_batch == 0 || self.micro_batches_in_flight == 0 {
            return Err(MemoryError::Invalid {
                key: "batch",
                message: "micro-batch size and micro-batches in flight must be at least 1".into(),
            });
        }
        let sharding = self.sharding;
        let tensor = u64::from(sharding.tensor);
        let pipeline = u64::from(sharding.pipeline);
        let activations = self.activations();
        let (before, inside, after) = self.parameters_by_part();
        // First and last pipeline stage (the same stage without pipelining).
        let stages = if pipeline == 1 {
            vec![(before + inside + after, activations.total())]
        } else {
            let in_flight = self.micro_batches_in_flight;
            let block_share = activations.blocks.div_ceil(pipeline);
            vec![
                (
                    before + inside.div_ceil(pipeline),
                    (activations.before_blocks + block_share) * in_flight + activations.working_set,
                ),
                (
                    after + inside.div_ceil(pipeline),
                    activations.after_blocks + block_share + activations.working_set,
                ),
            ]
        };
        let largest_gradient_pair = self
            .model
            .layers
            .iter()
            .map(|layer| layer.input.elements().saturating_add(layer.output.elements()))
            .max()
            .unwrap_or(0);
        let largest_layer = self.model.layers.iter().map(|layer| layer.cost.params).max().unwrap_or(0);
        let mut worst = MemoryBreakdown::default();
        for (parameters, activation_bytes) in stages {
            let breakdown = self.device_breakdown(
                parameters.div_ceil(tensor),
                activation_bytes,
                largest_gradient_pair,
                largest_layer.div_ceil(tensor),
            );
            if breakdown.total() > worst.total() {
                worst = breakdown;
            }
        }
        Ok(worst)
    }

    /// What one device holds with `parameters` of its own (already split over tensor ranks and
    /// pipeline stages), `activation_bytes` of activations, the largest input-plus-output
    /// gradient pair of its layers (elements per sample) and its largest layer's parameters:
    /// the ZeRO stage of [`MemoryPlan::sharding`] shards the model state over its data ranks.
    pub fn device_breakdown(
        &self,
        parameters: u64,
        activation_bytes: u64,
        largest_gradient_pair: u64,
        largest_layer: u64,
    ) -> MemoryBreakdown {
        let sharding = self.sharding;
        let data = u64::from(sharding.data.max(1));
        let zero =
            |stage: u8, bytes: u64| if sharding.zero_stage >= stage { bytes.div_ceil(data) } else { bytes };
        let master = self.master_width();
        // State tensors per parameter; Muon keeps one momentum for its matrices and AdamW's two
        // moments for the rest, counted below.
        let states = match self.optimizer {
            Optimizer::Sgd => 0,
            Optimizer::SgdMomentum | Optimizer::Lars | Optimizer::Muon => 1,
            Optimizer::Adam => 2,
        } * self.state_width();
        let adam_extra = if self.optimizer == Optimizer::Muon {
            parameters.saturating_sub(self.muon_parameters(parameters)).saturating_mul(self.state_width())
        } else {
            0
        };
        let gathered = if sharding.zero_stage >= 3 {
            largest_layer * (self.storage_width() + self.gradient_precision.bytes())
        } else {
            0
        };
        MemoryBreakdown {
            weights: Bytes(zero(3, {
                let fp8 = self.fp8_copied_parameters(parameters);
                // FP8 parameters: the linear weights have no bf16 copy.
                let wide = if self.weights.fp8 { parameters - fp8 } else { parameters };
                wide.saturating_mul(self.storage_width())
                    .saturating_add(fp8.saturating_mul(self.fp8_weight_copy_width()))
            })),
            gradients: Bytes(zero(2, parameters.saturating_mul(self.gradient_precision.bytes()))),
            optimizer: Bytes(zero(1, parameters.saturating_mul(master + states).saturating_add(adam_extra))),
            activations: Bytes(activation_bytes),
            temporary: Bytes(
                self.micro_batch
                    .saturating_mul(largest_gradient_pair)
                    .saturating_mul(self.storage_width())
                    .saturating_add(gathered),
            ),
            communication: self.communication_buffers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zoo;

    #[test]
    fn blocks_are_the_name_up_to_its_first_number() {
        assert_eq!(crate::model::structure::block_of("layers.3.attention.qkv"), Some("layers.3"));
        assert_eq!(crate::model::structure::block_of("layer1.0.conv1"), Some("layer1.0"));
        assert_eq!(crate::model::structure::block_of("features.12"), Some("features.12"));
        assert_eq!(crate::model::structure::block_of("conv1"), None);
        assert_eq!(crate::model::structure::block_of("Mixed_5b.branch1x1.conv"), None);
        assert_eq!(crate::model::structure::block_of("embedding.dropout"), None);
    }

    #[test]
    fn a_layer_range_counts_as_a_model_of_those_layers() {
        // `activations_of` reads the layers in place; a model built from them (as the strategy
        // layer once did for each pipeline chunk) is the reference.
        for name in ["megatron-1.7b", "resnet50", "vgg16"] {
            let model = zoo::by_name(name).unwrap();
            let n = model.layers.len();
            let ranges = [0..n, 0..n / 3, n / 3..n, n / 4..n / 2, 5..6, 1..n - 1, n - 7..n];
            for recompute in Recompute::ALL {
                for sequence_parallel in [false, true] {
                    let sharding = Sharding { tensor: 2, sequence_parallel, ..Sharding::data_parallel(4) };
                    let plan = MemoryPlan {
                        recompute,
                        sharding,
                        ..MemoryPlan::data_parallel(&model, Dtype::Fp16, Dtype::Fp16, Optimizer::Adam, 4, 4)
                    };
                    for range in ranges.iter().cloned() {
                        let sub = Model {
                            name: model.name.clone(),
                            family: model.family.clone(),
                            description: String::new(),
                            input: if range.start == 0 {
                                model.input.clone()
                            } else {
                                model.layers[range.start].input.clone()
                            },
                            layers: model.layers[range.clone()].to_vec(),
                            structure: Default::default(),
                        };
                        let expected = MemoryPlan { model: &sub, ..plan.clone() }.activations();
                        assert_eq!(
                            plan.activations_of(range.clone()),
                            expected,
                            "{name} {recompute} {range:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn block_numbers_follow_the_names() {
        let model = zoo::by_name("resnet50").unwrap();
        let blocks = model.blocks();
        let names: Vec<Option<&str>> =
            model.layers.iter().map(|l| crate::model::structure::block_of(&l.name)).collect();
        assert_eq!(blocks.iter().flatten().max(), Some(&15), "16 bottlenecks");
        for index in 1..blocks.len() {
            if blocks[index].is_some() && blocks[index - 1].is_some() {
                assert_eq!(blocks[index] == blocks[index - 1], names[index] == names[index - 1]);
            }
        }
        assert_eq!(blocks[0], None, "the stem");
    }

    #[test]
    fn adam_in_mixed_precision_is_sixteen_bytes_per_parameter() {
        let model = zoo::by_name("llama2-7b").unwrap();
        let plan = MemoryPlan::data_parallel(&model, Dtype::Bf16, Dtype::Bf16, Optimizer::Adam, 1, 8);
        let memory = plan.breakdown().unwrap();
        let parameters = model.parameters();
        assert_eq!(memory.weights, Bytes(2 * parameters));
        assert_eq!(memory.gradients, Bytes(2 * parameters));
        assert_eq!(memory.optimizer, Bytes(12 * parameters));
        // Apex's DistributedFusedAdam with dtype = bf16: both moments and its weight copy in
        // bf16, 6 bytes per parameter.
        let narrow = MemoryPlan { optimizer_precision: Dtype::Bf16, ..plan.clone() };
        assert_eq!(narrow.breakdown().unwrap().optimizer, Bytes(6 * parameters));
        // NeMo's bf16-O2 DistributedFusedAdam: fp32 moments and the 16 low bits of each fp32
        // weight beside the bf16 weight: 4 + 4 + 2 bytes.
        let remainders = MemoryPlan {
            weights: WeightStorage { master: MasterWeights::Remainders, fp8: false },
            ..plan.clone()
        };
        assert_eq!(remainders.breakdown().unwrap().optimizer, Bytes(10 * parameters));
        // No copy when the optimizer updates bf16 weights with bf16 moments in place.
        let in_place = MemoryPlan {
            weights: WeightStorage { master: MasterWeights::InPlace, fp8: false },
            ..narrow.clone()
        };
        assert_eq!(in_place.breakdown().unwrap().optimizer, Bytes(4 * parameters));
        // fp32 training: no master copy; SGD with momentum: one state.
        let plan = MemoryPlan {
            precision: Dtype::Fp32,
            gradient_precision: Dtype::Fp32,
            optimizer_precision: Dtype::Fp32,
            optimizer: Optimizer::SgdMomentum,
            ..plan
        };
        let memory = plan.breakdown().unwrap();
        assert_eq!(
            (memory.weights, memory.gradients, memory.optimizer),
            (Bytes(4 * parameters), Bytes(4 * parameters), Bytes(4 * parameters))
        );
        let plain = MemoryPlan { optimizer: Optimizer::Sgd, ..plan };
        assert_eq!(plain.breakdown().unwrap().optimizer, Bytes::ZERO);
    }

    #[test]
    fn zero_stages_shard_state_gradients_and_weights() {
        let model = zoo::by_name("gpt3-175b").unwrap();
        let base = MemoryPlan::data_parallel(&model, Dtype::Fp16, Dtype::Fp16, Optimizer::Adam, 1, 64);
        let parameters = model.parameters();
        let per_rank = |bytes: u64| Bytes(bytes.div_ceil(64));
        for stage in 0..=3u8 {
            let plan =
                MemoryPlan { sharding: Sharding { zero_stage: stage, ..base.sharding }, ..base.clone() };
            let memory = plan.breakdown().unwrap();
            let expect = |from: u8, bytes: u64| if stage >= from { per_rank(bytes) } else { Bytes(bytes) };
            assert_eq!(memory.optimizer, expect(1, 12 * parameters), "stage {stage}");
            assert_eq!(memory.gradients, expect(2, 2 * parameters), "stage {stage}");
            assert_eq!(memory.weights, expect(3, 2 * parameters), "stage {stage}");
        }
        let bad = MemoryPlan { sharding: Sharding { zero_stage: 4, ..base.sharding }, ..base.clone() };
        assert!(bad.breakdown().unwrap_err().to_string().contains("zero-stage"));
        let bad = MemoryPlan { sharding: Sharding { tensor: 0, ..base.sharding }, ..base };
        assert!(bad.breakdown().unwrap_err().to_string().contains("`tensor`"));
    }

    #[test]
    fn neighbouring_layers_share_their_tensors() {
        // conv -> bn -> relu -> conv: the first conv keeps the input, bn its input (the conv
        // output), relu its output, which is the second conv's input: three tensors, not four.
        let mut builder = crate::ModelBuilder::new("toy", crate::Shape::from([8, 16, 16]));
        builder.layer("conv1", LayerKind::conv2d(8, 3, 1, 1)).unwrap();
        builder.layer("bn1", LayerKind::BatchNorm).unwrap();
        builder.layer("relu1", LayerKind::relu()).unwrap();
        builder.layer("conv2", LayerKind::conv2d(8, 3, 1, 1)).unwrap();
        let model = builder.finish();
        let plan = MemoryPlan::data_parallel(&model, Dtype::Fp16, Dtype::Fp32, Optimizer::Sgd, 4, 1);
        let elements = 8 * 16 * 16;
        assert_eq!(plan.activations().total(), 4 * 3 * elements * 2);
        assert_eq!(model.activation_elements_per_sample(), 4 * elements, "the layers' sum counts one twice");
    }

    #[test]
    fn full_recomputation_keeps_block_inputs_and_one_working_set() {
        let model = zoo::by_name("resnet50").unwrap();
        let plan = MemoryPlan::data_parallel(&model, Dtype::Fp16, Dtype::Fp32, Optimizer::SgdMomentum, 32, 1);
        let none = plan.activations();
        let full = MemoryPlan { recompute: Recompute::Full, ..plan.clone() }.activations();
        assert!(full.total() < none.total() / 2, "{full:?} vs {none:?}");
        assert!(full.working_set > 0);
        assert_eq!(full.before_blocks, none.before_blocks);
        // Selective recomputation only concerns attention: nothing changes for a CNN.
        let selective = MemoryPlan { recompute: Recompute::Selective, ..plan };
        assert_eq!(selective.activations(), none);
    }

    #[test]
    fn recompute_names_parse_and_print() {
        for mode in Recompute::ALL {
            assert_eq!(mode.to_string().parse::<Recompute>().unwrap(), mode);
        }
        assert!("some".parse::<Recompute>().unwrap_err().contains("none, selective, full"));
    }

    #[test]
    fn the_fit_check_names_device_capacity_and_overflow() {
        let device = crate::DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap();
        let breakdown = MemoryBreakdown { weights: Bytes(90 << 30), ..Default::default() };
        let error = breakdown.check(device).unwrap_err().to_string();
        assert!(
            error.contains("A100-SXM4-80GB has 85.90 GB (80 GiB): over by 10.74 GB (12.5% of its memory)"),
            "{error}"
        );
        assert!(error.contains("weights") && error.contains("96.64 GB"), "{error}");
        assert!(MemoryBreakdown::default().check(device).is_ok());
    }
}
