//! DeepSpeed's ZeRO stage 3 as released in v0.3.13-v0.3.14, with its code's default
//! configuration: each chunk's trace of one micro-batch ([`crate::deepspeed_zero3`]: what is
//! gathered, prefetched and reduced around each layer) replayed in order, with the host's
//! `torch.cuda.synchronize()` calls and the copy-out launches of PyTorch's list allgather;
//! gathers and gradient allreduces on the gather stream (one NCCL stream per process group).
//!
//! Invariants: a rank's gathers, copies and reduces of one iteration are tracked from its
//! start ([`RankPolicy::begin_iteration`] resets them); memory counts the most parameters the
//! coordinator holds live, the fp16 gradient buckets and the parameters kept whole.

use std::ops::Range;

use sim_core::graph::{CollectiveKind, OpId, OpMeta, Pass, Work};
use sim_core::units::{Bytes, SimDuration};

use super::super::Dep;
use super::super::plan::Plan;
use super::super::rank::{GroupClass, RankEmitter};
use super::fsdp::{GATHER_LABEL, Unit, unit_rows};
use super::{Policy, RankPolicy, policy_meta};
use crate::{
    Bucket, BucketRow, Comm, GATHER_STREAM, GroupKind, HOST_STREAM, Role, StrategyError, deepspeed_zero3,
    shard,
};
use workloads::memory::MemoryBreakdown;

/// DeepSpeed's ZeRO-3: each chunk's trace and each layer's parameters kept whole.
pub(in super::super) struct DeepSpeed {
    /// Each chunk's trace of one micro-batch.
    traces: Vec<deepspeed_zero3::Trace>,
    /// Elements of each layer's parameters kept whole on every rank.
    persistent: Vec<u64>,
    /// FSDP's units of each chunk, which the kernel table lists as the buckets.
    units: Vec<Vec<Unit>>,
}

impl DeepSpeed {
    /// The traces of `chunk_layers` (`recompute_before`: the plan's recomputation).
    pub(in super::super) fn new(
        local: &[shard::LocalLayer],
        chunk_layers: &[Range<usize>],
        recompute_before: &[Option<Range<usize>>],
        units: Vec<Vec<Unit>>,
    ) -> DeepSpeed {
        // Each layer's gathered and whole-kept elements (the output layer tied to the
        // embedding gathers the embedding's weight), its gradient elements, and each chunk's
        // trace over them.
        let split: Vec<(u64, u64)> =
            local.iter().map(|l| deepspeed_zero3::partitioned_and_persistent(&l.layer)).collect();
        let embedding = local.iter().position(|l| l.role == Role::VocabularyEmbedding);
        let partitioned: Vec<u64> = local
            .iter()
            .zip(&split)
            .map(|(l, &(gathered, _))| match (&l.layer.kind, embedding) {
                (workloads::layer::LayerKind::TiedLinear { .. }, Some(e)) => split[e].0,
                _ => gathered,
            })
            .collect();
        let gradients: Vec<u64> = local.iter().map(|l| l.layer.cost.params).collect();
        let traces = chunk_layers
            .iter()
            .map(|range| deepspeed_zero3::trace(range.clone(), recompute_before, &partitioned, &gradients))
            .collect();
        DeepSpeed { traces, persistent: split.iter().map(|&(_, kept)| kept).collect(), units }
    }
}

impl Policy for DeepSpeed {
    fn syncs_buckets(&self) -> bool {
        false
    }

    /// DeepSpeed's gradient buckets, in backward order.
    fn report_buckets(&self, plan: &Plan<'_>, chunk: usize) -> Vec<Bucket> {
        let trace = &self.traces[chunk];
        trace
            .events
            .iter()
            .map(|e| e.reduce)
            .chain(std::iter::once(trace.final_reduce))
            .filter(|&elements| elements > 0)
            .map(|elements| Bucket { layers: Vec::new(), bytes: plan.weight_bytes(elements) })
            .collect()
    }

    fn bucket_rows(&self, plan: &Plan<'_>, stage: u32, chunk: usize) -> Vec<BucketRow> {
        unit_rows(plan, &self.units[chunk], stage, chunk)
    }

    /// Counted by [`Policy::adjust_memory`] instead.
    fn gathered_parameters(&self, _plan: &Plan<'_>, _stage: u32, _chunks: &[usize]) -> u64 {
        0
    }

    /// The most parameters its coordinator holds gathered at once (bounded by
    /// stage3_max_live_parameters and the reuse distance), the fp16 gradient buckets
    /// ([`deepspeed_zero3::gradient_buffer_elements`]), and the parameters too small to
    /// partition, whole on every rank.
    fn adjust_memory(&self, plan: &Plan<'_>, stage: u32, chunks: &[usize], memory: &mut MemoryBreakdown) {
        let live = chunks.iter().map(|&k| self.traces[k].peak_live).max().unwrap_or(0);
        let largest_gradient =
            plan.stage_layers(stage).map(|i| plan.local[i].layer.cost.params).max().unwrap_or(0);
        let gradients = deepspeed_zero3::gradient_buffer_elements(largest_gradient);
        memory.temporary = Bytes(memory.temporary.0 + plan.weight_bytes(live + gradients).0);
        let persistent: u64 = plan.stage_layers(stage).map(|i| self.persistent[i]).sum();
        memory.weights = Bytes(memory.weights.0 + plan.weight_bytes(persistent).0);
    }

    fn for_rank(&self) -> Box<dyn RankPolicy + '_> {
        Box::new(DeepSpeedRank { traces: &self.traces, gather: None, reduce: None, copies: None })
    }
}

/// A rank's DeepSpeed ZeRO-3 during an iteration.
struct DeepSpeedRank<'a> {
    traces: &'a [deepspeed_zero3::Trace],
    /// The last parameter allgather and the last gradient allreduce issued (local indexes): a
    /// `torch.cuda.synchronize()` waits for them.
    gather: Option<u32>,
    reduce: Option<u32>,
    /// The host's launches of the last gather's copy-out kernels.
    copies: Option<u32>,
}

impl RankPolicy for DeepSpeedRank<'_> {
    fn begin_iteration(&mut self, emitter: &mut RankEmitter<'_, '_>, previous_end: Option<OpId>) {
        (self.gather, self.reduce, self.copies) = (None, None, None);
        super::wait_for_step(emitter, previous_end);
    }

    fn forward_chunk(
        &mut self,
        emitter: &mut RankEmitter<'_, '_>,
        chunk: usize,
        micro: u32,
    ) -> Result<(), StrategyError> {
        let trace = &self.traces[chunk];
        self.events(emitter, micro, &trace.events[..trace.forward_events])?;
        Ok(())
    }

    fn backward_chunk(
        &mut self,
        emitter: &mut RankEmitter<'_, '_>,
        chunk: usize,
        micro: u32,
        _last: bool,
    ) -> Result<Option<u32>, StrategyError> {
        let trace = &self.traces[chunk];
        let mut last_sync = self.events(emitter, micro, &trace.events[trace.forward_events..])?;
        if trace.final_reduce > 0 {
            // `independent_gradient_partition_epilogue`: the last bucket, then the host
            // waits for the reduction stream.
            let deps: Vec<Dep> = emitter.last_compute.map(Dep::Local).into_iter().collect();
            let op = self.allreduce(emitter, trace.final_reduce, &deps);
            emitter.waiting.push(Dep::Local(op));
            host_synchronize(emitter, &[Dep::Local(op)]);
            last_sync = Some(op);
        }
        Ok(last_sync)
    }
}

impl DeepSpeedRank<'_> {
    /// DeepSpeed's ZeRO-3: `events` of a chunk's trace ([`deepspeed_zero3::trace`]) in
    /// order; returns the last gradient allreduce issued, if any.
    ///
    /// Before each gather DeepSpeed calls `torch.cuda.synchronize()` (`_allgather_param`), so
    /// a gather starts after every kernel and collective issued before it; a fetch that gathered
    /// or found its parameters in flight synchronises the device again
    /// (`_synchronize_communication`), so the layer's kernels wait for every gather issued
    /// before its prefetches, and for the last gradient allreduce. The prefetches are issued
    /// before the layer's kernels and overlap them (the last one: each earlier one is waited
    /// for by the next one's `synchronize`). A gradient bucket is all-reduced when the gradient
    /// that would overflow it is ready; the host first waits for the previous bucket
    /// (`reduction_stream.synchronize()`), so later kernels wait for it too. Gathers and
    /// allreduces share the data-parallel process group, hence one NCCL stream (PyTorch's
    /// `ProcessGroupNCCL` keeps one per device and group): both go on the gather stream.
    fn events(
        &mut self,
        emitter: &mut RankEmitter<'_, '_>,
        micro: u32,
        events: &[deepspeed_zero3::Event],
    ) -> Result<Option<u32>, StrategyError> {
        let mut last_sync = None;
        for event in events {
            let device = |this: &Self, emitter: &RankEmitter<'_, '_>| -> Vec<Dep> {
                [emitter.last_compute, this.gather, this.copies, this.reduce]
                    .into_iter()
                    .flatten()
                    .map(Dep::Local)
                    .collect()
            };
            if event.fetch > 0 {
                let deps = device(self, emitter);
                host_synchronize(emitter, &deps);
                self.gather = Some(self.gather_bytes(emitter, event.fetch, &deps));
            }
            if event.sync {
                let synchronised = [self.gather, self.copies, self.reduce];
                emitter.waiting.extend(synchronised.into_iter().flatten().map(Dep::Local));
                let deps = device(self, emitter);
                host_synchronize(emitter, &deps);
            }
            for (k, &elements) in event.prefetch.iter().enumerate() {
                let deps = device(self, emitter);
                host_synchronize(emitter, &deps);
                let op = self.gather_bytes(emitter, elements, &deps);
                if k + 1 < event.prefetch.len() {
                    emitter.waiting.push(Dep::Local(op));
                    emitter.waiting.extend(self.copies.map(Dep::Local));
                }
                self.gather = Some(op);
            }
            match event.pass {
                deepspeed_zero3::EventPass::Forward => emitter.forward_layer(event.layer, micro, false)?,
                deepspeed_zero3::EventPass::Recompute => emitter.forward_layer(event.layer, micro, true)?,
                deepspeed_zero3::EventPass::Backward => {
                    let ready = emitter.backward_kernels(event.layer, micro)?;
                    if event.reduce > 0 {
                        let deps: Vec<Dep> =
                            ready.or(emitter.last_compute).map(Dep::Local).into_iter().collect();
                        let previous = self.reduce;
                        let waited: Vec<Dep> = previous.map(Dep::Local).into_iter().collect();
                        host_synchronize(emitter, &waited);
                        let op = self.allreduce(emitter, event.reduce, &deps);
                        emitter.waiting.extend(previous.map(Dep::Local));
                        last_sync = Some(op);
                    }
                }
            }
        }
        Ok(last_sync)
    }

    /// DeepSpeed's ZeRO-3: the allgather of `elements` parameters (working-weight dtype), on
    /// the gather stream after `deps`, then the host's launches of its copy-out kernels
    /// ([`list_allgather_copies`], kept in `copies`); returns the gather.
    fn gather_bytes(&mut self, emitter: &mut RankEmitter<'_, '_>, elements: u64, deps: &[Dep]) -> u32 {
        let bytes = emitter.plan.weight_bytes(elements);
        let comm = Comm { group: GroupKind::Data, kind: CollectiveKind::AllGather, bytes, what: "" };
        let group = emitter.group(GroupClass::Data);
        let label = emitter.comm_label(GATHER_LABEL);
        let meta = OpMeta::NONE.with_group(GroupKind::Data).with_origin(emitter.origin(ORIGIN));
        let gather = emitter.collective(comm, GATHER_STREAM, group, label, deps, meta);
        if emitter.plan.host_cost > SimDuration::ZERO {
            // Issued right after the gather's launch, without waiting for it.
            let ranks = emitter.plan.strategy.parallelism.gradient_sync_ranks();
            let copies = list_allgather_copies(ranks, emitter.plan.host_cost);
            let what = "host: launch allgather copy-out kernels (deepspeed)";
            let meta = OpMeta::NONE.with_work(Work::Launch).with_origin(emitter.origin(ORIGIN));
            self.copies = Some(emitter.host_op(HOST_STREAM, copies, what, &[], meta));
        }
        gather
    }

    /// DeepSpeed's ZeRO-3: the allreduce of a bucket of `elements` fp16 gradients (the
    /// parameters' dtype: `allreduce_bucket` flattens `param.grad`), on the gather stream.
    fn allreduce(&mut self, emitter: &mut RankEmitter<'_, '_>, elements: u64, deps: &[Dep]) -> u32 {
        let bytes = emitter.plan.weight_bytes(elements);
        let comm = Comm { group: GroupKind::Data, kind: CollectiveKind::AllReduce, bytes, what: "" };
        let group = emitter.group(GroupClass::Data);
        let label = emitter.comm_label("zero-3 allreduce gradient bucket (deepspeed)");
        let meta = policy_meta(emitter, ORIGIN, Pass::BackwardWeight);
        let op = emitter.collective(comm, GATHER_STREAM, group, label, deps, meta);
        self.reduce = Some(op);
        op
    }
}

/// PyTorch's `ProcessGroupNCCL::allgather` into a list of `world_size` tensors (the form
/// DeepSpeed v0.3.14's `_allgather_param` calls) gathers into one flat buffer, then copies each
/// of the `world_size` chunks out with its own `copy_` ("Copy the flattened output tensors to
/// the outputs", `torch/lib/c10d/ProcessGroupNCCL.cpp`): `world_size` kernels the host issues
/// at `dispatch-overhead` each. Their device time (one chunk each) is left out.
fn list_allgather_copies(ranks: u32, host_cost: SimDuration) -> SimDuration {
    SimDuration::from_ps(host_cost.as_ps().saturating_mul(u64::from(ranks)))
}

/// DeepSpeed's `torch.cuda.synchronize()` / `stream.synchronize()`: the host issues nothing
/// more until `deps` are done (nothing to do when the host is not modelled).
fn host_synchronize(emitter: &mut RankEmitter<'_, '_>, deps: &[Dep]) {
    if emitter.plan.host_cost == SimDuration::ZERO || deps.is_empty() {
        return;
    }
    let meta = OpMeta::NONE.with_work(Work::Launch).with_origin(emitter.origin(ORIGIN));
    emitter.host_op(HOST_STREAM, SimDuration::ZERO, "host: torch.cuda.synchronize (deepspeed)", deps, meta);
}

/// The origin of DeepSpeed's gathers, allreduces and host calls.
const ORIGIN: &str = "deepspeed";
