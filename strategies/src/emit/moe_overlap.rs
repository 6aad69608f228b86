//! Megatron-Core's EP A2A overlap (`parallelism.moe-overlap`, `--overlap-moe-expert-parallel-comm`):
//! the forward of one micro-batch and the backward of the micro-batch before it run as one
//! merged step, transformer layer by transformer layer, so that each one's expert all-to-alls
//! run beside the other's computation.
//!
//! The order is Megatron-Core's (NVIDIA/Megatron-LM @ d98e8a64dd:
//! megatron/core/models/common/model_chunk_schedule_plan.py, `TransformerModelChunkSchedulePlan.run`
//! and `TransformerLayerSchedulePlan.run`; megatron/core/pipeline_parallel/combined_1f1b.py):
//! the forward's stem (embedding) and the backward's head (loss, logits, final norm) first;
//! then forward layer `k` beside backward layer `n - 1 - k`, each split at its experts into the
//! part before them (attention and router: "pre-dispatch"), the dispatch all-to-all, the
//! experts ("mlp") and the combine all-to-all, issued as
//!
//! ```text
//! comm stream: combine_bwd       | dispatch_fwd -> dispatch_bwd  | combine_fwd
//! comp stream: pre_dispatch_fwd  | mlp_bwd (and its wgrad) -> mlp_fwd | pre_dispatch_bwd
//! ```
//!
//! and last the forward's head (with the loss the host reads) and the backward's stem. In
//! parasim each pass keeps its own dependencies (a [`Lane`]: what its next kernel waits for,
//! its last kernel), so a collective of one pass waits only for that pass's kernels; the
//! kernels of both share the compute stream in the order above and the all-to-alls share the
//! expert stream, as Megatron's one computation and one communication stream do. Layers
//! after the experts inside a transformer layer (dropout, residual add) run after the
//! backward's pre-dispatch part, once the combine has arrived.
//!
//! The merged step runs DualPipe's forward-and-backward pairs and, with `moe-overlap`, the 1F1B
//! steady state's pairs ([`crate::pipeline::pair_steady_state`], with or without a pipeline):
//! both come through the driver's pair path (`Action::with_next`), which receives both inputs
//! before and sends both outputs after.
//!
//! Invariant: each pass's ops are emitted in the order its unmerged emission has, so every
//! dependency still points to an earlier op.

use std::ops::Range;

use super::Dep;
use super::rank::RankEmitter;
use crate::StrategyError;
use crate::pipeline::{Action, Step};
use crate::shard::Role;

use super::policy::RankPolicy;

/// Which part of a layer's pass the layer methods emit ([`RankEmitter::forward_layer`],
/// [`RankEmitter::backward_layer`]): all of it, or one of the three parts a merged step
/// interleaves with the other pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum LayerPart {
    /// The whole pass.
    #[default]
    Whole,
    /// The collectives before the pass's kernels (the forward's dispatch, the backward's
    /// combine gradient), with the host's read of the token counts.
    Receive,
    /// The kernels; in the forward also the collectives after them (the combine).
    Kernels,
    /// The backward's collectives after its input-gradient kernel (the dispatch gradient).
    Send,
}

impl LayerPart {
    /// Whether the part emits the collectives before the kernels (and recomputation).
    pub(super) fn receives(self) -> bool {
        matches!(self, LayerPart::Whole | LayerPart::Receive)
    }

    /// Whether the part emits the kernels.
    pub(super) fn computes(self) -> bool {
        matches!(self, LayerPart::Whole | LayerPart::Kernels)
    }
}

/// One pass's dependencies inside a merged step: what its next kernel waits for, and its last
/// kernel (what its next collective waits for).
#[derive(Debug, Default)]
struct Lane {
    waiting: Vec<Dep>,
    last_compute: Option<u32>,
}

/// One transformer layer of a chunk, split at its experts.
#[derive(Debug, Clone)]
struct Block {
    /// The layers before the experts (all of them without experts).
    pre: Range<usize>,
    /// The expert bank, if the layer has one.
    experts: Option<usize>,
    /// The layers after the experts.
    post: Range<usize>,
}

/// A chunk's layers: the stem before the first numbered block, the blocks, the head after the
/// last.
#[derive(Debug, Clone)]
struct Segments {
    stem: Range<usize>,
    blocks: Vec<Block>,
    head: Range<usize>,
}

impl RankEmitter<'_, '_> {
    /// Chunk `chunk`'s layers cut into stem, transformer layers (split at their experts) and
    /// head, by the model's numbered blocks.
    fn segments(&self, chunk: usize) -> Segments {
        let plan = self.plan;
        let layers = plan.chunk_layers[chunk].clone();
        let ids = plan.strategy.model.blocks();
        let block_of = |index: usize| ids.get(index).copied().flatten();
        let first = layers.clone().find(|&i| block_of(i).is_some());
        let Some(first) = first else {
            return Segments { stem: layers.clone(), blocks: Vec::new(), head: layers.end..layers.end };
        };
        let last = layers.clone().rev().find(|&i| block_of(i).is_some()).unwrap_or(first);
        let mut blocks = Vec::new();
        let mut start = first;
        while start <= last {
            let id = block_of(start);
            let mut end = start + 1;
            while end <= last && block_of(end) == id {
                end += 1;
            }
            let experts = (start..end).find(|&i| plan.local[i].role == Role::Experts);
            blocks.push(match experts {
                Some(e) => Block { pre: start..e, experts: Some(e), post: e + 1..end },
                None => Block { pre: start..end, experts: None, post: end..end },
            });
            start = end;
        }
        Segments { stem: layers.start..first, blocks, head: last + 1..layers.end }
    }

    /// Runs `emit` with `lane`'s dependencies in place of the emitter's.
    fn in_lane<R>(&mut self, lane: &mut Lane, emit: impl FnOnce(&mut Self) -> R) -> R {
        std::mem::swap(&mut self.waiting, &mut lane.waiting);
        std::mem::swap(&mut self.last_compute, &mut lane.last_compute);
        let result = emit(self);
        std::mem::swap(&mut self.waiting, &mut lane.waiting);
        std::mem::swap(&mut self.last_compute, &mut lane.last_compute);
        result
    }

    /// The forward of `layers` (micro-batch `micro`), in `lane`.
    fn lane_forward(
        &mut self,
        lane: &mut Lane,
        layers: Range<usize>,
        micro: u32,
    ) -> Result<(), StrategyError> {
        self.in_lane(lane, |emitter| {
            for index in layers {
                emitter.forward_layer(index, micro, false)?;
            }
            Ok(())
        })
    }

    /// Part `part` of the forward of the expert bank `index`, in `lane`.
    fn lane_forward_part(
        &mut self,
        lane: &mut Lane,
        index: usize,
        micro: u32,
        part: LayerPart,
    ) -> Result<(), StrategyError> {
        self.layer_part = part;
        let result = self.lane_forward(lane, index..index + 1, micro);
        self.layer_part = LayerPart::Whole;
        result
    }

    /// The backward of `layers` (highest first) through the policy, in `lane`, in part `part`;
    /// keeps the last synchronisation started in `sync`.
    #[allow(clippy::too_many_arguments)]
    fn lane_backward(
        &mut self,
        lane: &mut Lane,
        policy: &mut dyn RankPolicy,
        layers: Range<usize>,
        backward: Action,
        last: bool,
        part: LayerPart,
        sync: &mut Option<u32>,
    ) -> Result<(), StrategyError> {
        if layers.is_empty() {
            return Ok(());
        }
        self.layer_part = part;
        let chunk = backward.chunk as usize;
        let result = self.in_lane(lane, |emitter| {
            policy.backward_layers(emitter, chunk, layers, backward.micro_batch, last)
        });
        self.layer_part = LayerPart::Whole;
        if let Some(op) = result? {
            *sync = Some(op);
        }
        Ok(())
    }

    /// The merged step: `forward` (a forward action) and `backward` (the backward, or its
    /// input-gradient half, of another micro-batch, `last` if it is the iteration's last) in
    /// Megatron-Core's interleaved order (the module documentation); both actions' `chunk` is
    /// the global chunk, and `reads_loss` says whether the forward's chunk ends with the loss
    /// the host checks. Returns the last gradient synchronisation the backward started, which
    /// the optimizer step waits for.
    pub(super) fn overlapped_step(
        &mut self,
        policy: &mut dyn RankPolicy,
        forward: Action,
        backward: Action,
        last: bool,
        reads_loss: bool,
    ) -> Result<Option<u32>, StrategyError> {
        self.backward_part = backward.step;
        let result = self.merged_layers(policy, forward, backward, last, reads_loss);
        self.backward_part = Step::Backward;
        result
    }

    /// [`RankEmitter::overlapped_step`]'s emission.
    fn merged_layers(
        &mut self,
        policy: &mut dyn RankPolicy,
        forward: Action,
        backward: Action,
        last: bool,
        reads_loss: bool,
    ) -> Result<Option<u32>, StrategyError> {
        let f = self.segments(forward.chunk as usize);
        let b = self.segments(backward.chunk as usize);
        let fm = forward.micro_batch;
        let mut fl = Lane { waiting: self.waiting.clone(), last_compute: self.last_compute };
        let mut bl = Lane { waiting: std::mem::take(&mut self.waiting), last_compute: self.last_compute };
        let mut sync = None;
        let whole = LayerPart::Whole;
        self.lane_backward(&mut bl, policy, b.head.clone(), backward, last, whole, &mut sync)?;
        self.lane_forward(&mut fl, f.stem.clone(), fm)?;
        let pairs = f.blocks.len().max(b.blocks.len());
        for k in 0..pairs {
            let fb = f.blocks.get(k);
            let bb = b.blocks.len().checked_sub(k + 1).map(|j| &b.blocks[j]);
            if let Some(bb) = bb {
                self.lane_backward(&mut bl, policy, bb.post.clone(), backward, last, whole, &mut sync)?;
                if let Some(e) = bb.experts {
                    let part = LayerPart::Receive;
                    self.lane_backward(&mut bl, policy, e..e + 1, backward, last, part, &mut sync)?;
                }
            }
            if let Some(fb) = fb {
                self.lane_forward(&mut fl, fb.pre.clone(), fm)?;
            }
            if let Some(e) = bb.and_then(|bb| bb.experts) {
                let part = LayerPart::Kernels;
                self.lane_backward(&mut bl, policy, e..e + 1, backward, last, part, &mut sync)?;
            }
            if let Some(e) = fb.and_then(|fb| fb.experts) {
                self.lane_forward_part(&mut fl, e, fm, LayerPart::Receive)?;
            }
            if let Some(e) = bb.and_then(|bb| bb.experts) {
                let part = LayerPart::Send;
                self.lane_backward(&mut bl, policy, e..e + 1, backward, last, part, &mut sync)?;
            }
            if let Some(e) = fb.and_then(|fb| fb.experts) {
                self.lane_forward_part(&mut fl, e, fm, LayerPart::Kernels)?;
            }
            if let Some(bb) = bb {
                self.lane_backward(&mut bl, policy, bb.pre.clone(), backward, last, whole, &mut sync)?;
            }
            if let Some(fb) = fb {
                self.lane_forward(&mut fl, fb.post.clone(), fm)?;
            }
        }
        self.lane_forward(&mut fl, f.head.clone(), fm)?;
        // The loss, which the host reads to check it (as after an unmerged forward).
        if self.plan.host_nan_checks && reads_loss {
            self.in_lane(&mut fl, |emitter| {
                let deps: Vec<Dep> = emitter.last_compute.map(Dep::Local).into_iter().collect();
                emitter.host_read(&deps, super::rank::LOSS_CHECK_LABEL);
            });
        }
        self.lane_backward(&mut bl, policy, b.stem.clone(), backward, last, whole, &mut sync)?;
        // Back to one lane: what either pass left waiting, after the later of their kernels.
        self.waiting = std::mem::take(&mut fl.waiting);
        self.waiting.append(&mut bl.waiting);
        self.last_compute = fl.last_compute.max(bl.last_compute);
        Ok(sync)
    }
}
