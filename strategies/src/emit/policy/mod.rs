//! Gradient-synchronisation and sharding policies: how a rank keeps its parameters and
//! gradients in step with the other data-parallel replicas. One file per policy:
//!
//! - [`ddp`]: PyTorch DDP, each gradient bucket all-reduced as its last gradient is ready;
//! - [`zero`]: ZeRO stages 1 and 2, each bucket reduce-scattered, the parameters all-gathered
//!   after the optimizer step;
//! - [`fsdp`]: ZeRO-3 as PyTorch FSDP runs it, each unit's parameters gathered one unit ahead
//!   and its gradients reduce-scattered after its backward;
//! - [`deepspeed`]: DeepSpeed v0.3.14's ZeRO-3 (per-parameter gathers, bounded live
//!   parameters, bucketed fp16 gradient allreduce);
//! - [`daso`]: DASO's node-local bucket allreduce and periodic global parameter allreduce;
//!
//! and [`buckets`], the gradient buckets and the bucketed backward that DDP, ZeRO-1/2 and DASO
//! share. A policy is two halves: [`Policy`], what it adds to the plan (shared by every rank,
//! computed once), and [`RankPolicy`], the hooks the per-rank driver
//! ([`super::rank::RankEmitter::iteration`]) calls while it emits an iteration, holding the
//! rank's state across iterations.
//!
//! Adding a policy: a file here implementing both traits, a line in [`select`], and its knob
//! and check in the crate root (`GradientSync`, `Strategy::check`).
//!
//! Invariant: the driver calls the hooks at fixed points of the schedule, so a policy decides
//! what it emits there, never when; every hook emits through the rank's buffer, so op order is
//! emission order.

pub(super) mod buckets;
pub(super) mod daso;
pub(super) mod ddp;
pub(super) mod deepspeed;
pub(super) mod fsdp;
pub(super) mod zero;

use std::ops::Range;

use sim_core::graph::{GroupKind, OpId, OpMeta, Pass};
use sim_core::units::Bytes;

use super::plan::Plan;
use super::rank::RankEmitter;
use crate::{Bucket, GradientSync, Strategy, StrategyError, ZeroImplementation, shard};
use workloads::memory::MemoryBreakdown;

/// A policy's part of the plan: what it planned (FSDP's units, DeepSpeed's traces), what it
/// adds to each stage's memory and to the report, and a rank's side of it.
pub(super) trait Policy {
    /// Whether data-parallel replicas do the same work at the same times, so that the
    /// lowering may simulate one and replay its traffic for the others (DASO's rotating
    /// global sync makes them differ).
    fn symmetric_replicas(&self) -> bool {
        true
    }

    /// Whether the gradient buckets of the plan ([`buckets`]) are synchronised as their last
    /// gradient is ready (DDP, ZeRO-1/2, DASO); ZeRO-3 synchronises its own units.
    fn syncs_buckets(&self) -> bool {
        true
    }

    /// Chunk `chunk`'s gradient buckets as the report lists them.
    fn report_buckets(&self, plan: &Plan<'_>, chunk: usize) -> Vec<Bucket> {
        plan.buckets[chunk].iter().map(|b| b.bucket.clone()).collect()
    }

    /// Chunk `chunk`'s rows of the kernel table's buckets (stage `stage`).
    fn bucket_rows(&self, plan: &Plan<'_>, stage: u32, chunk: usize) -> Vec<crate::BucketRow> {
        buckets::rows(plan, stage, chunk)
    }

    /// Bytes of the communication buffers a rank of a stage (chunks `chunks`) holds.
    fn communication_buffers(&self, _plan: &Plan<'_>, _chunks: &[usize]) -> Bytes {
        Bytes::ZERO
    }

    /// Parameters a rank of stage `stage` (chunks `chunks`) holds gathered at once, whole: by
    /// default the largest layer's.
    fn gathered_parameters(&self, plan: &Plan<'_>, stage: u32, _chunks: &[usize]) -> u64 {
        plan.stage_layers(stage).map(|i| plan.local[i].layer.cost.params).max().unwrap_or(0)
    }

    /// The parameters of each unit chunk `chunk` gathers whole before each of its passes
    /// (ZeRO-3's units); none for the policies that keep the weights whole.
    fn gathered_units(&self, _plan: &Plan<'_>, _chunk: usize) -> Vec<u64> {
        Vec::new()
    }

    /// What the policy adds to the memory model's breakdown of stage `stage`.
    fn adjust_memory(&self, _plan: &Plan<'_>, _stage: u32, _chunks: &[usize], _memory: &mut MemoryBreakdown) {
    }

    /// A rank's side of the policy, with its state for the whole run.
    fn for_rank(&self) -> Box<dyn RankPolicy + '_>;
}

/// A rank's side of a policy: the hooks the driver calls while it emits an iteration, in this
/// order: [`begin_iteration`](RankPolicy::begin_iteration) (after the batch is taken), then
/// per schedule step [`forward_chunk`](RankPolicy::forward_chunk) or
/// [`backward_chunk`](RankPolicy::backward_chunk), [`after_step`](RankPolicy::after_step)
/// after the optimizer step, and [`appended`](RankPolicy::appended) once the iteration's ops
/// are in the graph.
pub(super) trait RankPolicy {
    /// The start of an iteration that follows `previous_end` (the rank's last op of the
    /// previous iteration, if any).
    fn begin_iteration(&mut self, _emitter: &mut RankEmitter<'_, '_>, _previous_end: Option<OpId>) {}

    /// The forward of micro-batch `micro` through chunk `chunk`: by default each layer's.
    fn forward_chunk(
        &mut self,
        emitter: &mut RankEmitter<'_, '_>,
        chunk: usize,
        micro: u32,
    ) -> Result<(), StrategyError> {
        for index in emitter.plan.chunk_layers[chunk].clone() {
            emitter.forward_layer(index, micro, false)?;
        }
        Ok(())
    }

    /// The backward of micro-batch `micro` through chunk `chunk` (`last`: the iteration's last
    /// micro-batch), with the gradient synchronisation it starts; returns the last
    /// synchronisation op, which the optimizer step waits for. By default
    /// [`backward_layers`](RankPolicy::backward_layers) over all the chunk's layers (the
    /// bucketed DDP and ZeRO-1/2); the other policies emit their own.
    fn backward_chunk(
        &mut self,
        emitter: &mut RankEmitter<'_, '_>,
        chunk: usize,
        micro: u32,
        last: bool,
    ) -> Result<Option<u32>, StrategyError> {
        let layers = emitter.plan.chunk_layers[chunk].clone();
        self.backward_layers(emitter, chunk, layers, micro, last)
    }

    /// The backward of micro-batch `micro` through layers `layers` of chunk `chunk` only
    /// (highest first), a part of [`backward_chunk`](RankPolicy::backward_chunk): what a merged
    /// forward-and-backward step ([`super::moe_overlap`]) emits between the other micro-batch's
    /// layers. Returns the last synchronisation it started. The bucketed policies (DDP, ZeRO-1/2)
    /// have it; the others are refused by `Strategy::check` before the lowering asks.
    fn backward_layers(
        &mut self,
        _emitter: &mut RankEmitter<'_, '_>,
        _chunk: usize,
        _layers: Range<usize>,
        _micro: u32,
        _last: bool,
    ) -> Result<Option<u32>, StrategyError> {
        Err(crate::invalid(
            "parallelism.moe-overlap",
            "is modelled with DDP and ZeRO-1/2 only (a layer-by-layer backward)".into(),
        ))
    }

    /// After the optimizer step `optimizer`; `end` is the rank's last op so far. Returns the
    /// op that ends the rank's iteration.
    fn after_step(&mut self, _emitter: &mut RankEmitter<'_, '_>, _optimizer: u32, end: u32) -> u32 {
        end
    }

    /// The iteration's ops are in the graph, the rank's first at `offset`: local indexes kept
    /// for later iterations become op ids.
    fn appended(&mut self, _offset: u32) {}
}

/// The policy `strategy` runs: DeepSpeed's or FSDP's ZeRO-3, ZeRO-1/2, DASO or DDP.
pub(super) fn select(
    strategy: &Strategy<'_>,
    local: &[shard::LocalLayer],
    chunk_layers: &[Range<usize>],
    recompute_before: &[Option<Range<usize>>],
) -> Box<dyn Policy> {
    let p = &strategy.parallelism;
    if p.zero >= 3 {
        let units = fsdp::units(strategy.model, local, chunk_layers);
        return match p.zero_implementation {
            ZeroImplementation::DeepSpeed => {
                Box::new(deepspeed::DeepSpeed::new(local, chunk_layers, recompute_before, units))
            }
            ZeroImplementation::Fsdp => Box::new(fsdp::Fsdp { units }),
        };
    }
    if p.zero >= 1 {
        return Box::new(zero::Zero);
    }
    match p.sync {
        GradientSync::Daso { every, blocking, wait, node } => {
            Box::new(daso::Daso { every, blocking, wait, node })
        }
        GradientSync::AllReduce => Box::new(ddp::Ddp),
    }
}

/// The metadata of a policy's data-parallel collective in `pass`, emitted by the policy named
/// `origin`.
/// The next iteration's forward waits for `previous_end`, the end of this rank's optimizer
/// step (ZeRO's parameter allgather, FSDP's and DeepSpeed's step on the shard): what the
/// sharded policies do at the start of every iteration after the first.
fn wait_for_step(emitter: &mut RankEmitter<'_, '_>, previous_end: Option<OpId>) {
    if let Some(end) = previous_end {
        emitter.waiting.push(super::Dep::Global(end));
    }
}

fn policy_meta(emitter: &mut RankEmitter<'_, '_>, origin: &'static str, pass: Pass) -> OpMeta {
    OpMeta::NONE.with_pass(pass).with_group(GroupKind::Data).with_origin(emitter.origin(origin))
}
