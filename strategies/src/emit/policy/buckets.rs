//! Gradient buckets, as PyTorch DDP forms them (in backward order, the first capped at
//! `first-bucket-cap`, the others at `bucket-cap`, expert parameters apart), and the bucketed
//! backward that DDP, ZeRO-1/2 and DASO share: per layer in reverse, its backward, then, in the
//! last micro-batch, the synchronisation of the bucket it closes, which the policy emits
//! ([`BucketSync`]).
//!
//! Invariants: a bucket is synchronised right after the backward of the layer that closes it
//! (its last gradient), in the last micro-batch only; the out-of-core hooks
//! ([`super::super::offload`]) run at the same points of each layer as they always did.

use sim_core::graph::{GraphBuilder, LabelId};
use sim_core::units::Bytes;

use super::super::Dep;
use super::super::plan::Plan;
use super::super::rank::{GRADIENT_CHECK_LABEL, RankEmitter};
use super::Policy;
use crate::{Bucket, BucketRow, Role, Strategy, StrategyError, shard};

/// A gradient bucket of one chunk: its layers and gradient bytes, whether it holds expert
/// parameters (synchronised over the expert-data group), and its parameter bytes (for ZeRO's
/// parameter allgather).
pub(in super::super) struct PlannedBucket {
    pub(in super::super) bucket: Bucket,
    pub(in super::super) expert: bool,
    pub(in super::super) parameter_bytes: Bytes,
}

impl PlannedBucket {
    /// `"allreduce gradient bucket 3 (24.00 MiB)"`.
    fn sync_name(&self, index: usize, zero: u8) -> String {
        let kind = if zero >= 1 { "reduce-scatter" } else { "allreduce" };
        let expert = if self.expert { "expert " } else { "" };
        format!("{kind} {expert}gradient bucket {index} ({})", self.bucket.bytes)
    }
}

/// How a policy synchronises one bucket: the collectives after `ready` (the op after which the
/// bucket's last gradient is ready), labelled `label`; returns the last of them.
pub(in super::super) type BucketSync<'a> =
    &'a mut dyn FnMut(&mut RankEmitter<'_, '_>, &PlannedBucket, LabelId, u32) -> u32;

/// The gradient buckets of each chunk of `chunk_layers`.
pub(in super::super) fn plan(
    strategy: &Strategy<'_>,
    local: &[shard::LocalLayer],
    chunk_layers: &[std::ops::Range<usize>],
) -> Vec<Vec<PlannedBucket>> {
    let p = &strategy.parallelism;
    let gradient_width = strategy.gradient_precision.bytes();
    // The parameters all-gathered after a sharded step, in the compute weights' width (FP8
    // parameters: 1 byte for the layers whose products run in FP8).
    let weight_width = strategy.precision.bytes().max(2);
    let fp8_weights = strategy.weights.fp8 && strategy.precision == workloads::Dtype::Fp8;
    let parameter_width = |layer: &workloads::Layer| {
        if fp8_weights && workloads::compute::fp8_linear(layer) { 1 } else { weight_width }
    };
    let mut buckets = Vec::with_capacity(chunk_layers.len());
    // Expert gradients sum over the expert-data group, which differs from the data group when
    // the experts are spread over ranks (expert parallelism) or split their own way.
    let separate_experts = p.expert > 1 || p.expert_tensor_degree() != p.tensor;
    for range in chunk_layers {
        let mut chunk_buckets: Vec<PlannedBucket> = Vec::new();
        for expert in [false, true] {
            if expert && !separate_experts {
                continue;
            }
            let mut current = Bucket { layers: Vec::new(), bytes: Bytes::ZERO };
            let mut parameter_bytes = 0u64;
            let mut count = 0;
            let close = |current: &mut Bucket, parameters: &mut u64, list: &mut Vec<PlannedBucket>| {
                let bucket = std::mem::replace(current, Bucket { layers: Vec::new(), bytes: Bytes::ZERO });
                let parameter_bytes = Bytes(std::mem::take(parameters));
                list.push(PlannedBucket { bucket, expert, parameter_bytes });
            };
            for index in range.clone().rev() {
                let layer = &local[index];
                let params = layer.layer.cost.params;
                if params == 0 || (separate_experts && (layer.role == Role::Experts) != expert) {
                    continue;
                }
                current.layers.push(index);
                current.bytes.0 += params * gradient_width;
                parameter_bytes += params * parameter_width(&layer.layer);
                let cap = if count == 0 { p.first_bucket_cap } else { p.bucket_cap };
                if current.bytes >= cap {
                    close(&mut current, &mut parameter_bytes, &mut chunk_buckets);
                    count += 1;
                }
            }
            if !current.layers.is_empty() {
                close(&mut current, &mut parameter_bytes, &mut chunk_buckets);
            }
        }
        buckets.push(chunk_buckets);
    }
    buckets
}

/// Whether `strategy`'s buckets are synchronised: DDP launches its bucket allreduces whatever
/// the world size; other strategies synchronise only over more than one rank, or when
/// out-of-core weights or a host optimizer write each bucket's gradients to host memory after its
/// allreduce (over one rank under a tensor split alone); and only policies that synchronise buckets
/// ([`Policy::syncs_buckets`]).
fn synchronised(strategy: &Strategy<'_>, policy: &dyn Policy) -> bool {
    let p = &strategy.parallelism;
    (p.gradient_sync_ranks() > 1 || p.is_data_parallel() || p.offload.gradients_to_host())
        && policy.syncs_buckets()
}

/// Which bucket (of its chunk) each of `layers` layers closes (its last gradient), if the
/// buckets are synchronised.
pub(in super::super) fn closed_by(
    strategy: &Strategy<'_>,
    policy: &dyn Policy,
    layers: usize,
    buckets: &[Vec<PlannedBucket>],
) -> Vec<Option<usize>> {
    let mut bucket_closed_by = vec![None; layers];
    if synchronised(strategy, policy) {
        for chunk in buckets {
            for (b, bucket) in chunk.iter().enumerate() {
                if let Some(&last) = bucket.bucket.layers.last() {
                    bucket_closed_by[last] = Some(b);
                }
            }
        }
    }
    bucket_closed_by
}

/// The (synchronisation, parameter allgather) labels of each bucket of each chunk.
pub(in super::super) fn labels(plan: &Plan<'_>, graph: &mut GraphBuilder) -> Vec<Vec<(LabelId, LabelId)>> {
    plan.buckets
        .iter()
        .map(|chunk| {
            chunk
                .iter()
                .enumerate()
                .map(|(index, b)| {
                    let sync = graph.label(&b.sync_name(index, plan.strategy.parallelism.zero));
                    let gather = graph.label(&format!("allgather parameter bucket ({})", b.parameter_bytes));
                    (sync, gather)
                })
                .collect()
        })
        .collect()
}

/// The kernel table's rows of chunk `chunk`'s buckets (stage `stage`), if they are
/// synchronised.
pub(in super::super) fn rows(plan: &Plan<'_>, stage: u32, chunk: usize) -> Vec<BucketRow> {
    let p = &plan.strategy.parallelism;
    if !synchronised(plan.strategy, plan.policy.as_ref()) {
        return Vec::new();
    }
    plan.buckets[chunk]
        .iter()
        .enumerate()
        .map(|(i, bucket)| BucketRow {
            stage,
            chunk,
            index: i,
            collective: if p.zero >= 1 { "reduce-scatter" } else { "allreduce" },
            expert: bucket.expert,
            bytes: bucket.bucket.bytes,
            layers: bucket.bucket.layers.iter().map(|&l| plan.local[l].index).collect(),
        })
        .collect()
}

/// The bucket buffers DDP keeps (each bucket's gradients flattened), when it synchronises
/// over more than one rank into buckets of their own (`GradientBuffers::Copy`); none when the
/// synchronisation runs on the gradients' storage (`GradientBuffers::InPlace`).
pub(in super::super) fn buffer_bytes(plan: &Plan<'_>, chunks: &[usize]) -> Bytes {
    if plan.strategy.parallelism.gradient_sync_ranks() > 1
        && plan.strategy.parallelism.gradient_buffers == crate::GradientBuffers::Copy
    {
        Bytes(chunks.iter().flat_map(|&k| &plan.buckets[k]).map(|b| b.bucket.bytes.0).sum())
    } else {
        Bytes::ZERO
    }
}

/// Backward of one chunk, bucket by bucket: each layer's backward (with the out-of-core
/// fetches and copies around it), and in the last micro-batch the synchronisation `sync` of
/// the bucket the layer closes. Returns the last synchronisation op (or the last gradient
/// copy to the host), if any.
pub(in super::super) fn backward_chunk(
    emitter: &mut RankEmitter<'_, '_>,
    chunk: usize,
    micro: u32,
    last: bool,
    sync: BucketSync<'_>,
) -> Result<Option<u32>, StrategyError> {
    let layers = emitter.plan.chunk_layers[chunk].clone();
    backward_layers(emitter, chunk, layers, micro, last, sync)
}

/// [`backward_chunk`] over `layers` only (a run of chunk `chunk`'s layers, highest first): what
/// a merged forward-and-backward step emits between the other micro-batch's layers
/// ([`super::super::moe_overlap`]); each bucket is synchronised after the layer that closes it,
/// whichever call emits that layer.
pub(in super::super) fn backward_layers(
    emitter: &mut RankEmitter<'_, '_>,
    chunk: usize,
    layers: std::ops::Range<usize>,
    micro: u32,
    last: bool,
    sync: BucketSync<'_>,
) -> Result<Option<u32>, StrategyError> {
    let plan = emitter.plan;
    let mut last_sync = None;
    // Zero-bubble's split backward: B computes no weight gradient (nothing to synchronise),
    // W only weight gradients, bucket by bucket as the whole backward would.
    let part = emitter.backward_part;
    let last = last && part != crate::pipeline::Step::BackwardInput;
    let mut offload = emitter.offload_backward(layers.clone(), micro);
    for index in layers.rev() {
        let ready = emitter.backward_layer_offloaded(&mut offload, index, micro)?;
        if last && let (Some(b), Some(ready)) = (plan.bucket_closed_by[index], ready) {
            let bucket = &plan.buckets[chunk][b];
            // The output layer's deferred weight gradients run before their bucket is reduced.
            let ready = emitter.drain_deferred_wgrads(Some(&bucket.bucket.layers)).unwrap_or(ready);
            let label = emitter.bucket_labels[chunk][b].0;
            // Megatron-LM checks the bucket's norm before it reduces it (`check_grads`).
            if plan.host_nan_checks {
                emitter.host_read(&[Dep::Local(ready)], GRADIENT_CHECK_LABEL);
            }
            let synced = sync(emitter, bucket, label, ready);
            last_sync = Some(synced);
            // Out-of-core weights: the synchronised gradients to host memory, where the
            // optimizer reads them (never with a spatial split, which offloading excludes).
            if let Some(copy) = emitter.offload_gradients(bucket.bucket.bytes, &[Dep::Local(synced)]) {
                last_sync = Some(copy);
            }
        }
    }
    Ok(last_sync)
}
