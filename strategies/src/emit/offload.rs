//! Out-of-core training (`workload.offload`): each layer's saved activations copied to host
//! memory after its forward and prefetched before its backward (vDNN-like), and with
//! `"activations+weights"` the weights fetched before each use, the synchronised gradients
//! written back and the optimizer step streamed through the GPU chunk by chunk.
//!
//! Invariants: copies to the host run on [`OFFLOAD_STREAM`], copies to the device on
//! [`PREFETCH_STREAM`] (one in-order queue per direction of the host link); at most
//! [`OffloadPlan::window`] bytes of offloaded activations, [`WEIGHT_BUFFERS`] layers' weights
//! and two gradient buckets are on the device at once. The hooks below are called by the
//! layer emitter ([`RankEmitter::forward_layer`]) and the bucketed backward
//! ([`super::policy::buckets::backward_chunk`]) at fixed points, so the op order is the one
//! those loops always had.

use sim_core::lookup::LookupMap;
use std::collections::VecDeque;
use std::ops::Range;

use sim_core::graph::{MemcpyDirection, Op, OpId, OpKind, OpMeta, Pass, RankId};
use sim_core::units::{Bytes, SimDuration};

use super::plan::Plan;
use super::policy::buckets::PlannedBucket;
use super::rank::{RankEmitter, layer_meta};
use super::{Dep, Kernel};
use crate::{COMPUTE_STREAM, OFFLOAD_STREAM, Offload, PREFETCH_STREAM, Strategy, StrategyError, shard};
use workloads::memory::{MemoryBreakdown, MemoryPlan};

/// Out-of-core training (vDNN-like): each layer's saved activations are copied to host memory
/// after its forward and prefetched before its backward, on their own streams, with at most
/// `window` bytes of them on the device at once.
pub(super) struct OffloadPlan {
    /// Saved activation bytes of each layer for one micro-batch.
    pub(super) bytes: Vec<u64>,
    /// Device bytes the offloaded activations may occupy at once: twice the largest layer's
    /// (one layer's being written while the previous one's drains to the host).
    pub(super) window: u64,
    /// Before the forward of layer `j`: the layer whose copy to the host must have ended so
    /// that the resident activations stay within the window.
    forward_wait: Vec<Option<usize>>,
    /// For each layer `m`, the layers whose prefetch starts once `m`'s backward is done
    /// (descending); `untriggered` start with the backward pass of their chunk (each chunk's
    /// layer range, with its layers).
    pub(super) prefetch_after: Vec<Vec<usize>>,
    pub(super) untriggered: Vec<(Range<usize>, Vec<usize>)>,
    /// `"activations+weights"`: the weights' side.
    pub(super) weights: Option<WeightOffload>,
    /// `"optimizer"`, `"activations+optimizer"`: the optimizer step on the host CPU.
    pub(super) host: Option<HostOptimizer>,
}

/// ZeRO-Offload's optimizer on the host CPU (Ren et al., "ZeRO-Offload: Democratizing
/// Billion-Scale Model Training", USENIX ATC '21, section 4: the fp16 gradients go to the CPU,
/// the CPU updates the fp32 parameters and optimizer states it holds, and the fp16 parameters
/// come back). Each synchronised gradient bucket (its shard under ZeRO-1/2) is copied to host
/// memory after its synchronisation; once every one is there, the host CPU steps the rank's
/// parameters chunk by chunk, and each chunk's updated working weights are copied back while
/// the CPU steps the next (DeepSpeed's CPU Adam writes the fp16 copy tile by tile and copies it
/// asynchronously). The next iteration's forward waits for the weights.
pub(super) struct HostOptimizer {
    /// Per pipeline stage: the chunks of the parameters one of its ranks steps, and the host
    /// CPU's time for each.
    pub(super) chunks: Vec<Vec<(u64, SimDuration)>>,
    /// With the state on NVMe (ZeRO-Infinity): the process's share of the NVMe bandwidth, in
    /// bytes per second, at which the state and the weights' shards are read and written.
    pub(super) nvme_rate: Option<f64>,
    /// Bytes per parameter of the fp32 weight and states (on NVMe or in host memory).
    pub(super) state_bytes: u64,
    /// Bytes per parameter of the working weights copied back.
    pub(super) weight_bytes: u64,
    /// The fraction of each synchronised bucket a rank copies to the host: 1, or under
    /// ZeRO its shard's (1 / the optimizer shard's ranks).
    pub(super) shard_ranks: u64,
    /// ZeRO-Infinity's parameter offload (`"optimizer+parameters"`): the rank's shard of the
    /// working weights lives in host memory (or on NVMe), where the step updates it, and is
    /// fetched before each allgather, instead of being copied back after the step.
    pub(super) parameters_offloaded: bool,
}

impl HostOptimizer {
    /// The host optimizer of `strategy` over each stage's `stage_parameters`.
    fn new(strategy: &Strategy<'_>, stage_parameters: &[u64]) -> Result<HostOptimizer, StrategyError> {
        let p = &strategy.parallelism;
        let one = HostOptimizer::per_parameter(strategy);
        let weight_bytes = one.weights.0;
        let state_bytes = one.optimizer.0;
        let chunks = stage_parameters
            .iter()
            .map(|&parameters| {
                optimizer_chunks(p.optimizer_held(parameters), |size| strategy.host_optimizer_step(size))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let shard_ranks = if p.zero >= 1 { u64::from(p.optimizer_shard_ranks()) } else { 1 };
        Ok(HostOptimizer {
            chunks,
            nvme_rate: strategy.nvme.map(|bandwidth| bandwidth.bytes_per_second()),
            state_bytes,
            weight_bytes,
            shard_ranks,
            parameters_offloaded: p.offload.parameters(),
        })
    }

    /// The NVMe read (or write) of `parameters`' fp32 weights and states, if they live there.
    fn nvme_time(&self, parameters: u64) -> Option<SimDuration> {
        self.nvme_rate.map(|rate| {
            SimDuration::from_ps((self.state_bytes as f64 / rate * 1e12 * parameters as f64).round() as u64)
        })
    }

    /// The NVMe read (or write) of `bytes` of the weights' shards, if they live there.
    fn nvme_bytes_time(&self, bytes: u64) -> Option<SimDuration> {
        self.nvme_rate.map(|rate| SimDuration::from_ps((bytes as f64 / rate * 1e12).round() as u64))
    }

    /// Bytes of a rank's shard of `bytes` (a unit's gathered weights or gradients).
    pub(super) fn shard(&self, bytes: u64) -> u64 {
        bytes.div_ceil(self.shard_ranks)
    }

    /// One parameter's weights, gradient and optimizer state (its fp32 weight included), as
    /// one rank holds them before any ZeRO sharding: what the host keeps per parameter it steps.
    fn per_parameter(strategy: &Strategy<'_>) -> MemoryBreakdown {
        let unsharded = Strategy {
            parallelism: crate::Parallelism { zero: 0, ..strategy.parallelism },
            ..strategy.clone()
        };
        unsharded.memory_plan(strategy.model, Bytes::ZERO).device_breakdown(1, 0, 0, 0)
    }

    /// Parameters one rank of stage `stage` steps on the host.
    pub(super) fn parameters(&self, stage: u32) -> u64 {
        self.chunks
            .get(stage as usize)
            .map_or(0, |chunks| chunks.iter().map(|(parameters, _)| parameters).sum())
    }

    /// The host CPU's time to step stage `stage`'s parameters.
    pub(super) fn step_time(&self, stage: u32) -> SimDuration {
        let chunks = self.chunks.get(stage as usize).map_or(&[][..], Vec::as_slice);
        SimDuration::from_ps(chunks.iter().map(|(_, time)| time.as_ps()).sum())
    }
}

/// The optimizer step of out-of-core weights streams the state through the GPU in chunks of at
/// most this many parameters: each chunk's buffers are a few hundred MB, and filling and
/// draining the copy pipeline costs one chunk's copies.
const OPTIMIZER_CHUNK_PARAMETERS: u64 = 1 << 24;

/// `parameters` cut into optimizer chunks of at most [`OPTIMIZER_CHUNK_PARAMETERS`], each with
/// its step's time as `price` gives it.
fn optimizer_chunks(
    parameters: u64,
    mut price: impl FnMut(u64) -> Result<SimDuration, StrategyError>,
) -> Result<Vec<(u64, SimDuration)>, StrategyError> {
    let mut chunks = Vec::new();
    let mut offset = 0;
    while offset < parameters {
        let size = OPTIMIZER_CHUNK_PARAMETERS.min(parameters - offset);
        chunks.push((size, price(size)?));
        offset += size;
    }
    Ok(chunks)
}

/// Layers whose weights out-of-core weights keeps on the device at once: the one computing and
/// three prefetched ahead. Each direction of the host link is one in-order copy queue, and in
/// the backward the activation prefetches run ahead of the compute by their window; a weight
/// fetch issued only one layer ahead queues behind them and holds the next kernel back, which
/// costs ResNet-1001 (whose weights are 0.3% of its traffic) 5% of its iteration; three ahead,
/// 1%.
pub(super) const WEIGHT_BUFFERS: usize = 4;

/// Out-of-core weights (`"activations+weights"`): the weights, gradients and optimizer state
/// live in host memory. Each layer's weights are prefetched before its forward and before its
/// backward-data kernel (at most [`WEIGHT_BUFFERS`] layers' on the device: a prefetch waits
/// until the layer that many before it is done), each gradient bucket is written to host memory
/// after its allreduce (at most two buckets on the device), and the optimizer step streams
/// gradients, fp32 weights and state in and the updated state out, chunk by chunk, on the two
/// copy streams around one optimizer kernel per chunk (two chunks' buffers).
pub(super) struct WeightOffload {
    /// Working-weight bytes of each layer.
    pub(super) weights: Vec<u64>,
    /// Before the backward of layer `l`: the bucket whose copy to the host must have ended, so
    /// that at most two buckets are on the device (`l` opens bucket `b`, this is `b - 2`).
    pub(super) bucket_wait: Vec<Option<usize>>,
    /// The optimizer's chunks: (parameters, the kernel's time).
    pub(super) chunks: Vec<(u64, SimDuration)>,
    /// Bytes per parameter the optimizer streams in: the gradient, the fp32 weight (the master
    /// copy, or the weight itself in fp32) and the optimizer's fp32 states.
    pub(super) in_per_parameter: u64,
    /// Bytes per parameter it streams out: the fp32 weight and states, and the working weight
    /// when it is narrower than fp32.
    pub(super) out_per_parameter: u64,
}

impl WeightOffload {
    /// Out-of-core weights: what each layer fetches, the gradient buckets' window and the
    /// optimizer's chunks (data parallelism only: one chunk of layers, every bucket synchronised).
    fn new(
        strategy: &Strategy<'_>,
        local: &[shard::LocalLayer],
        buckets: &[Vec<PlannedBucket>],
    ) -> Result<WeightOffload, StrategyError> {
        let plan = strategy.memory_plan(strategy.model, Bytes::ZERO);
        // Per parameter: working weight, gradient, fp32 master copy (if narrower) and states.
        let one = plan.device_breakdown(1, 0, 0, 0);
        let (weight, gradient, state) = (one.weights.0, one.gradients.0, one.optimizer.0);
        let mut bucket_wait = vec![None; local.len()];
        for (b, bucket) in buckets.iter().flatten().enumerate() {
            if let (Some(older), Some(&first)) = (b.checked_sub(2), bucket.bucket.layers.first()) {
                bucket_wait[first] = Some(older);
            }
        }
        let parameters: u64 = local.iter().map(|l| l.layer.cost.params).sum();
        let chunks = optimizer_chunks(parameters, |size| Ok(strategy.optimizer_step(size, 1)?.0))?;
        Ok(WeightOffload {
            weights: local.iter().map(|l| l.layer.cost.params * weight).collect(),
            bucket_wait,
            chunks,
            // The fp32 weight is the master copy under mixed precision (counted in `state`),
            // else the weight itself.
            in_per_parameter: gradient + state + if weight >= 4 { weight } else { 0 },
            out_per_parameter: state + weight,
        })
    }

    /// The device memory of stage `stage` (chunks `chunks`) with its weights out of core.
    pub(super) fn adjust_memory(
        &self,
        plan: &Plan<'_>,
        stage: u32,
        chunk_indexes: &[usize],
        memory_plan: &MemoryPlan<'_>,
        memory: &mut MemoryBreakdown,
    ) {
        // Out-of-core weights: the device holds the weights of `WEIGHT_BUFFERS` layers,
        // the gradients of two (computed, then copied into their bucket), two gradient
        // buckets and the optimizer's two chunks in transit (all counted at once,
        // although the optimizer's chunks are not alive during the backward).
        let one = memory_plan.device_breakdown(1, 0, 0, 0);
        let layers = || plan.stage_layers(stage).map(|i| plan.local[i].layer.cost.params);
        memory.weights = Bytes(WeightOffload::largest(layers(), WEIGHT_BUFFERS) * one.weights.0);
        memory.gradients = Bytes(WeightOffload::largest(layers(), 2) * one.gradients.0);
        // A chunk's buffer: its gradients, fp32 weights and states, working weights.
        let chunks = WeightOffload::largest(self.chunks.iter().map(|(parameters, _)| *parameters), 2);
        memory.optimizer = Bytes(chunks * (one.weights.0 + one.gradients.0 + one.optimizer.0));
        memory.communication = Bytes(WeightOffload::largest(
            chunk_indexes.iter().flat_map(|&k| &plan.buckets[k]).map(|b| b.bucket.bytes.0),
            2,
        ));
    }

    /// Working-weight bytes prefetched per iteration: every layer before its forward, and
    /// before its backward every layer that has a backward-data kernel (the first layer's
    /// backward computes only its weight gradient, which does not read the weights).
    pub(super) fn prefetched(&self, kernels: &[[Kernel; 3]]) -> u64 {
        let forward: u64 = self.weights.iter().sum();
        let backward: u64 =
            self.weights.iter().zip(kernels).filter(|(_, k)| k[1].is_some()).map(|(w, _)| w).sum();
        forward + backward
    }

    /// Whether layer `index`'s backward prefetches its weights.
    pub(super) fn fetched_for_backward(&self, index: usize, kernels: &[[Kernel; 3]]) -> bool {
        self.weights[index] > 0 && kernels[index][1].is_some()
    }

    /// Parameters the optimizer streams.
    pub(super) fn parameters(&self) -> u64 {
        self.chunks.iter().map(|(parameters, _)| parameters).sum()
    }

    /// The `n` largest of `values`, summed: what a window of `n` holds at most.
    pub(super) fn largest(values: impl Iterator<Item = u64>, n: usize) -> u64 {
        let mut values: Vec<u64> = values.collect();
        values.sort_unstable_by(|a, b| b.cmp(a));
        values.iter().take(n).sum()
    }
}

impl OffloadPlan {
    /// The offload plan of `strategy`, if it offloads (`buckets`: the plan's gradient buckets,
    /// which out-of-core weights writes to host memory).
    pub(super) fn for_strategy(
        strategy: &Strategy<'_>,
        local: &[shard::LocalLayer],
        chunks: &[Range<usize>],
        buckets: &[Vec<PlannedBucket>],
        stage_parameters: &[u64],
    ) -> Result<Option<OffloadPlan>, StrategyError> {
        let p = &strategy.parallelism;
        let model = strategy.model;
        let mut offload = (p.offload != Offload::None).then(|| {
            // Without activation offloading every layer's bytes are 0: no copies, no waits.
            let mut bytes = strategy.memory_plan(model, Bytes::ZERO).activations_per_layer();
            if !p.offload.activations() {
                bytes.iter_mut().for_each(|b| *b = 0);
            }
            OffloadPlan::new(bytes, chunks)
        });
        if let Some(offload) = offload.as_mut() {
            if p.offload == Offload::ActivationsAndWeights {
                offload.weights = Some(WeightOffload::new(strategy, local, buckets)?);
            }
            if p.offload.host_optimizer() {
                offload.host = Some(HostOptimizer::new(strategy, stage_parameters)?);
            }
        }
        Ok(offload)
    }

    /// The plan of layers whose saved activations are `bytes`, run in pipeline chunks
    /// `chunks` (one range of every layer without a pipeline): the window's waits and
    /// prefetches stay inside a chunk, which one rank runs.
    pub(super) fn new(bytes: Vec<u64>, chunks: &[Range<usize>]) -> OffloadPlan {
        let layers = bytes.len();
        let window = 2 * bytes.iter().copied().max().unwrap_or(0);
        let mut forward_wait = vec![None; layers];
        let mut prefetch_after = vec![Vec::new(); layers];
        let mut untriggered = Vec::with_capacity(chunks.len());
        for chunk in chunks {
            for j in chunk.clone() {
                // The latest m < j of the chunk with bytes[m..=j] over the window.
                let mut sum = bytes[j];
                for m in (chunk.start..j).rev() {
                    sum += bytes[m];
                    if bytes[m] > 0 && sum > window {
                        forward_wait[j] = Some(m);
                        break;
                    }
                }
            }
            let mut first = Vec::new();
            for l in chunk.clone().rev() {
                if bytes[l] == 0 {
                    continue;
                }
                // The first m > l of the chunk with bytes[l..=m] over the window: its backward
                // frees room.
                let mut sum = bytes[l];
                let mut trigger = None;
                for (m, &b) in bytes.iter().enumerate().take(chunk.end).skip(l + 1) {
                    sum += b;
                    if b > 0 && sum > window {
                        trigger = Some(m);
                        break;
                    }
                }
                match trigger {
                    Some(m) => prefetch_after[m].push(l),
                    None => first.push(l),
                }
            }
            untriggered.push((chunk.clone(), first));
        }
        OffloadPlan { bytes, window, forward_wait, prefetch_after, untriggered, weights: None, host: None }
    }

    /// Saved activation bytes of stage `stage`'s layers for one micro-batch: what one of its
    /// GPUs copies each way per micro-batch.
    pub(super) fn stage_total(&self, plan: &Plan<'_>, stage: u32) -> u64 {
        plan.stage_layers(stage).map(|l| self.bytes[l]).sum()
    }

    /// What out-of-core training moves over one GPU's host link per iteration and keeps in
    /// host memory: on a pipeline, the busiest stage's GPU (`stages`: the plan's stages, whose
    /// micro-batches in flight each keep their activations in host memory).
    pub(super) fn totals(&self, plan: &Plan<'_>, stages: &[crate::StageSummary]) -> crate::OffloadTotals {
        let per_stage = |stage: &crate::StageSummary| self.stage_total(plan, stage.stage);
        let busiest = stages.iter().map(per_stage).max().unwrap_or(0);
        let activation_bytes = busiest * u64::from(plan.micro_batches);
        let host_activations = stages
            .iter()
            .map(|stage| per_stage(stage) * (stage.peak_micro_batches_in_flight.ceil() as u64).max(1))
            .max()
            .unwrap_or(0);
        let mut totals = crate::OffloadTotals {
            to_host_bytes: activation_bytes,
            to_device_bytes: activation_bytes,
            activation_bytes,
            weight_bytes: 0,
            gradient_bytes: 0,
            optimizer_to_device_bytes: 0,
            optimizer_to_host_bytes: 0,
            host_bytes: host_activations,
            host_step: SimDuration::ZERO,
            nvme_bytes: 0,
            nvme_read_bytes: 0,
            without: plan.without_offload.get().unwrap_or_default(),
        };
        if let Some(weights) = &self.weights {
            let parameters = weights.parameters();
            let state = plan
                .strategy
                .memory_plan(plan.strategy.model, Bytes::ZERO)
                .device_breakdown(parameters, 0, 0, 0);
            totals.weight_bytes = weights.prefetched(&plan.kernels);
            totals.gradient_bytes = plan.buckets.iter().flatten().map(|b| b.bucket.bytes.0).sum();
            totals.optimizer_to_device_bytes = parameters * weights.in_per_parameter;
            totals.optimizer_to_host_bytes = parameters * weights.out_per_parameter;
            totals.to_host_bytes += totals.gradient_bytes + totals.optimizer_to_host_bytes;
            totals.to_device_bytes += totals.weight_bytes + totals.optimizer_to_device_bytes;
            totals.host_bytes += state.weights.0 + state.gradients.0 + state.optimizer.0;
        }
        if let Some(host) = &self.host {
            // The stage whose ranks step the most parameters.
            let stage =
                (0..plan.strategy.parallelism.pipeline).max_by_key(|&s| host.parameters(s)).unwrap_or(0);
            let parameters = host.parameters(stage);
            let one = HostOptimizer::per_parameter(plan.strategy);
            let tied = plan.tied_copy_gradient(stage).map_or(0, |bytes| host.shard(bytes.0));
            let micro_batches = u64::from(plan.micro_batches);
            if plan.strategy.parallelism.zero >= 3 {
                // ZeRO-3: every unit's gradient shard after each micro-batch's reduce-scatter;
                // with the weights' shards offloaded, each unit's shard fetched before its
                // forward's and its backward's allgather.
                let units: Vec<u64> = plan
                    .chunks_of(stage)
                    .flat_map(|k| plan.policy.report_buckets(plan, k))
                    .map(|b| b.bytes.0)
                    .collect();
                totals.gradient_bytes =
                    micro_batches * units.iter().map(|&b| host.shard(b)).sum::<u64>() + tied;
                totals.weight_bytes = if host.parameters_offloaded {
                    let shards: u64 = plan
                        .chunks_of(stage)
                        .flat_map(|k| plan.policy.gathered_units(plan, k))
                        .map(|parameters| host.shard(plan.weight_bytes(parameters).0))
                        .sum();
                    2 * micro_batches * shards
                } else {
                    parameters * host.weight_bytes
                };
            } else {
                totals.gradient_bytes = plan
                    .chunks_of(stage)
                    .flat_map(|k| &plan.buckets[k])
                    .map(|b| host.shard(b.bucket.bytes.0))
                    .sum::<u64>()
                    + tied;
                totals.weight_bytes = parameters * host.weight_bytes;
            }
            totals.to_host_bytes += totals.gradient_bytes;
            totals.to_device_bytes += totals.weight_bytes;
            // The gradients the CPU reads, and the fp32 weights and states: all of them, or with
            // them on NVMe two chunks' in transit; the weights' shards where they are offloaded.
            totals.host_bytes += parameters * one.gradients.0;
            if host.nvme_rate.is_some() {
                let chunks = host.chunks.get(stage as usize).map_or(&[][..], Vec::as_slice);
                totals.host_bytes += WeightOffload::largest(chunks.iter().map(|c| c.0), 2) * host.state_bytes;
                totals.nvme_read_bytes = parameters * host.state_bytes;
                totals.nvme_bytes = 2 * parameters * host.state_bytes;
                if host.parameters_offloaded {
                    // Each fetch reads its shard from NVMe; the step writes the shard back.
                    totals.nvme_read_bytes += totals.weight_bytes;
                    totals.nvme_bytes += totals.weight_bytes + parameters * host.weight_bytes;
                }
            } else {
                totals.host_bytes += parameters * one.optimizer.0;
                if host.parameters_offloaded {
                    totals.host_bytes += parameters * host.weight_bytes;
                }
            }
            totals.host_step = host.step_time(stage);
        }
        totals
    }
}

/// One rank's offload state during one iteration (local op indexes).
#[derive(Default)]
pub(super) struct OffloadState {
    /// The copy to the host of each (micro-batch, layer), and the prefetch back.
    offloaded: LookupMap<(u32, usize), u32>,
    prefetched: LookupMap<(u32, usize), u32>,
    /// Out-of-core weights: the last kernels of the (at most [`WEIGHT_BUFFERS`]) layers whose
    /// weights are on the device, oldest first; a prefetch reuses the oldest one's buffer once
    /// it is done.
    weight_users: VecDeque<u32>,
    /// The previous iteration's last op: weights fetched before any buffer is reused wait for
    /// the optimizer step that wrote them.
    iteration_start: Option<OpId>,
    /// Out-of-core weights: each gradient bucket's copy to the host, in bucket order.
    bucket_copies: Vec<u32>,
}

impl OffloadState {
    /// The state at the start of an iteration that follows `previous_end`.
    pub(super) fn new(previous_end: Option<OpId>) -> OffloadState {
        OffloadState { iteration_start: previous_end, ..OffloadState::default() }
    }
}

/// The offload side of one chunk's bucketed backward ([`super::policy::buckets::backward_chunk`]):
/// the weight fetches issued ahead of the layers that read them.
pub(super) struct BackwardOffload {
    layers: Range<usize>,
    /// Weight fetches issued and not yet waited for: (layer, op).
    fetched: VecDeque<(usize, u32)>,
}

impl RankEmitter<'_, '_> {
    /// Before the forward kernel of layer `index` (micro-batch `micro`; `recompute`: its
    /// recomputation): the wait that keeps the offloaded activations within the window, and the
    /// fetch of the layer's weights (returns whether it fetched them).
    pub(super) fn offload_before_forward(&mut self, index: usize, micro: u32, recompute: bool) -> bool {
        let plan = self.plan;
        if let Some(offload) = &plan.offload
            && let Some(m) = offload.forward_wait[index]
            && let Some(&copy) = self.offload.offloaded.get(&(micro, m))
        {
            self.waiting.push(Dep::Local(copy));
        }
        let fetch_weights = !recompute
            && plan.offload.as_ref().and_then(|o| o.weights.as_ref()).is_some_and(|w| w.weights[index] > 0);
        if fetch_weights {
            let fetch = self.fetch_weights(index);
            self.waiting.push(Dep::Local(fetch));
        }
        fetch_weights
    }

    /// After the forward kernel of a layer whose weights were fetched: its buffer is in use
    /// until that kernel is done.
    pub(super) fn offload_weights_used(&mut self) {
        self.offload.weight_users.extend(self.last_compute);
    }

    /// After the forward of layer `index` (and its collectives): the copy of its saved
    /// activations to the host.
    pub(super) fn offload_after_forward(&mut self, index: usize, micro: u32, recompute: bool) {
        if let Some(offload) = &self.plan.offload
            && offload.bytes[index] > 0
            && !recompute
        {
            let bytes = Bytes(offload.bytes[index]);
            let deps: Vec<Dep> = self.last_compute.map(Dep::Local).into_iter().collect();
            let copy = self.memcpy(
                MemcpyDirection::DeviceToHost,
                bytes,
                &deps,
                "offload activations to host",
                layer_meta(index, Pass::Forward),
            );
            self.offload.offloaded.insert((micro, index), copy);
        }
    }

    /// The start of the backward of `layers` (one chunk, micro-batch `micro`): the first
    /// weight fetches and the activation prefetches no layer's backward triggers; `None` (and
    /// nothing to do around each layer) without offloading.
    pub(super) fn offload_backward(&mut self, layers: Range<usize>, micro: u32) -> Option<BackwardOffload> {
        let plan = self.plan;
        plan.offload.as_ref()?;
        let mut backward = BackwardOffload { layers: layers.clone(), fetched: VecDeque::new() };
        // Weights are fetched `WEIGHT_BUFFERS - 1` layers ahead, each before the activation
        // prefetches that the previous layer's backward triggers, so that a weight fetch does
        // not queue behind activations the window fetches far ahead (one copy stream per
        // direction, in issue order).
        let mut below = layers.end;
        while backward.fetched.len() + 1 < WEIGHT_BUFFERS
            && let Some(next) = backward.next_fetch(plan, below)
        {
            backward.fetched.push_back((next, self.fetch_weights(next)));
            below = next;
        }
        if let Some(offload) = &plan.offload
            && let Some((_, first)) =
                offload.untriggered.iter().find(|(chunk, _)| chunk.contains(&layers.start))
        {
            self.prefetch(micro, first);
        }
        Some(backward)
    }

    /// Before the backward of layer `index`: its activations' prefetch and weight fetch, and
    /// (at most two gradient buckets on the device) the copy of the bucket two before the one
    /// it opens.
    fn offload_before_backward(&mut self, backward: &mut BackwardOffload, index: usize, micro: u32) {
        let weights = self.plan.offload.as_ref().and_then(|o| o.weights.as_ref());
        if let Some(&prefetch) = self.offload.prefetched.get(&(micro, index)) {
            self.waiting.push(Dep::Local(prefetch));
        }
        if let Some(&(_, fetch)) = backward.fetched.front().filter(|(layer, _)| *layer == index) {
            backward.fetched.pop_front();
            self.waiting.push(Dep::Local(fetch));
        }
        // At most two gradient buckets on the device: the one this layer opens waits for
        // the copy of the one two before it.
        if let Some(&copy) =
            weights.and_then(|w| w.bucket_wait[index]).and_then(|b| self.offload.bucket_copies.get(b))
        {
            self.waiting.push(Dep::Local(copy));
        }
    }

    /// After the backward of layer `index`: its weight buffer in use until its kernels are
    /// done, the next weight fetch, and the activation prefetches its backward triggers.
    fn offload_after_backward(&mut self, backward: &mut BackwardOffload, index: usize, micro: u32) {
        let plan = self.plan;
        if backward.fetches(plan, index) {
            self.offload.weight_users.extend(self.last_compute);
            let below = backward.fetched.back().map_or(index, |(layer, _)| *layer);
            if let Some(next) = backward.next_fetch(plan, below) {
                backward.fetched.push_back((next, self.fetch_weights(next)));
            }
        }
        if let Some(offload) = &plan.offload {
            self.prefetch(micro, &offload.prefetch_after[index]);
        }
    }

    /// The backward of layer `index` (micro-batch `micro`) with the out-of-core fetches and
    /// copies around it when `offload` is the chunk's ([`RankEmitter::offload_backward`]):
    /// what every policy's per-layer backward runs. Returns [`RankEmitter::backward_layer`]'s.
    pub(super) fn backward_layer_offloaded(
        &mut self,
        offload: &mut Option<BackwardOffload>,
        index: usize,
        micro: u32,
    ) -> Result<Option<u32>, crate::StrategyError> {
        if let Some(offload) = offload.as_mut() {
            self.offload_before_backward(offload, index, micro);
        }
        let ready = self.backward_layer(index, micro)?;
        if let Some(offload) = offload.as_mut() {
            self.offload_after_backward(offload, index, micro);
        }
        Ok(ready)
    }

    /// Out-of-core weights or a host optimizer: synchronised gradients (`bytes`, a bucket's or
    /// a tied embedding's, synchronised by `deps`) to host memory, where the optimizer reads
    /// them; returns the copy, `None` when both the weights and the optimizer are on the device.
    pub(super) fn offload_gradients(&mut self, bytes: Bytes, deps: &[Dep]) -> Option<u32> {
        let offload = self.plan.offload.as_ref()?;
        // A host optimizer reads the rank's shard of the bucket (all of it without ZeRO).
        let bytes = match (&offload.weights, &offload.host) {
            (Some(_), _) => bytes,
            (None, Some(host)) => Bytes(bytes.0.div_ceil(host.shard_ranks)),
            (None, None) => return None,
        };
        let copy = self.memcpy(
            MemcpyDirection::DeviceToHost,
            bytes,
            deps,
            "offload gradients to host",
            OpMeta::NONE.with_pass(Pass::BackwardWeight),
        );
        self.offload.bucket_copies.push(copy);
        Some(copy)
    }

    /// ZeRO-Offload: the optimizer step on the host CPU once every gradient is in host memory
    /// (`deps`), chunk by chunk on the host thread (which issues nothing else meanwhile), each
    /// chunk's updated working weights copied back to the device after it. Returns the last
    /// copy, which the next iteration's weights wait for (and ZeRO-1/2's allgather). With the
    /// weights' shards offloaded (ZeRO-Infinity) nothing comes back: the step updates the shard
    /// where it lives (written to NVMe with the state), and the next iteration's fetches wait
    /// for the last step, or the last NVMe write.
    pub(super) fn host_optimizer_step(&mut self, host: &HostOptimizer, stage: u32, deps: &[Dep]) -> u32 {
        let meta = OpMeta::NONE
            .with_pass(Pass::Optimizer)
            .with_work(sim_core::graph::Work::Launch)
            .with_origin(self.origin(OFFLOAD_ORIGIN));
        let mut last = None;
        let mut waits = deps.to_vec();
        let chunks = host.chunks.get(stage as usize).map_or(&[][..], Vec::as_slice);
        // State on NVMe: each chunk's state is read before its step and written back after
        // it, on one in-order queue; the next chunk's read is issued before this chunk's write
        // (two chunks' buffers in host memory), so reads run ahead of the steps.
        let read = |emitter: &mut Self, c: usize| -> Option<u32> {
            let duration = host.nvme_time(chunks.get(c)?.0)?;
            Some(emitter.host_op(crate::NVME_STREAM, duration, NVME_READ_LABEL, deps, meta))
        };
        let mut next_read = read(self, 0);
        for (c, &(parameters, duration)) in chunks.iter().enumerate() {
            let this_read = next_read;
            next_read = read(self, c + 1);
            waits.extend(this_read.map(Dep::Local));
            let step = self.host_op(crate::HOST_STREAM, duration, HOST_STEP_LABEL, &waits, meta);
            waits = vec![Dep::Local(step)];
            let mut write = None;
            if let Some(state) = host.nvme_time(parameters) {
                // The weights' shard goes back to NVMe with the state it was updated from.
                let weights = if host.parameters_offloaded {
                    host.nvme_bytes_time(parameters * host.weight_bytes).unwrap_or_default()
                } else {
                    SimDuration::ZERO
                };
                let duration = state.saturating_add(weights);
                write = Some(self.host_op(
                    crate::NVME_STREAM,
                    duration,
                    NVME_WRITE_LABEL,
                    &[Dep::Local(step)],
                    meta,
                ));
            }
            last = Some(if host.parameters_offloaded {
                write.unwrap_or(step)
            } else {
                self.memcpy(
                    MemcpyDirection::HostToDevice,
                    Bytes(parameters * host.weight_bytes),
                    &[Dep::Local(step)],
                    "updated weights to device",
                    OpMeta::NONE.with_pass(Pass::Optimizer),
                )
            });
        }
        match last {
            Some(copy) => copy,
            // No parameters on this stage: an empty step after the gradients.
            None => self.host_op(crate::HOST_STREAM, SimDuration::ZERO, HOST_STEP_LABEL, deps, meta),
        }
    }

    /// Out-of-core weights: the optimizer step streamed through the GPU, chunk by chunk, once
    /// every gradient is in host memory (`deps`): each chunk's gradients, fp32 weights and
    /// states are prefetched, updated by one optimizer kernel and written back, the copies of
    /// one chunk overlapping the kernels and copies of its neighbours; a chunk's prefetch
    /// reuses the buffer of the chunk two before it once that one is written back. Returns
    /// the last kernel and the last copy back.
    pub(super) fn streamed_optimizer(&mut self, weights: &WeightOffload, deps: &[Dep]) -> (u32, u32) {
        let mut kernel = None;
        let mut written: Vec<u32> = Vec::with_capacity(weights.chunks.len());
        let step_meta = OpMeta::NONE.with_pass(Pass::Optimizer).with_origin(self.origin(OFFLOAD_ORIGIN));
        for (c, &(parameters, duration)) in weights.chunks.iter().enumerate() {
            let mut fetch_deps = deps.to_vec();
            fetch_deps.extend(c.checked_sub(2).map(|older| Dep::Local(written[older])));
            let fetch = self.memcpy(
                MemcpyDirection::HostToDevice,
                Bytes(parameters * weights.in_per_parameter),
                &fetch_deps,
                "optimizer: prefetch gradients and state",
                OpMeta::NONE.with_pass(Pass::Optimizer),
            );
            // Like the single optimizer kernel, launched with the step (no host op per chunk).
            let step = self.buffer.push(
                Op {
                    kind: OpKind::Compute { duration },
                    rank: RankId(self.rank),
                    stream: COMPUTE_STREAM,
                    label: self.labels.optimizer,
                    meta: step_meta,
                },
                &[Dep::Local(fetch)],
            );
            kernel = Some(step);
            written.push(self.memcpy(
                MemcpyDirection::DeviceToHost,
                Bytes(parameters * weights.out_per_parameter),
                &[Dep::Local(step)],
                "optimizer: write back weights and state",
                OpMeta::NONE.with_pass(Pass::Optimizer),
            ));
        }
        match (kernel, written.last()) {
            (Some(kernel), Some(&end)) => (kernel, end),
            // A model without parameters: an empty step after the gradients.
            _ => {
                let step = self.buffer.push(
                    Op {
                        kind: OpKind::Compute { duration: SimDuration::ZERO },
                        rank: RankId(self.rank),
                        stream: COMPUTE_STREAM,
                        label: self.labels.optimizer,
                        meta: step_meta,
                    },
                    deps,
                );
                (step, step)
            }
        }
    }

    /// ZeRO-Infinity's parameter offload: the rank's shard (`bytes`) of a unit's weights to the
    /// device before its allgather, after `deps` (read from NVMe first when it lives there, on
    /// the rank's in-order NVMe queue); returns the copy, which the allgather waits for.
    pub(super) fn fetch_parameter_shard(
        &mut self,
        host: &HostOptimizer,
        bytes: u64,
        deps: &[Dep],
        pass: Pass,
    ) -> u32 {
        let meta = OpMeta::NONE.with_pass(pass);
        let mut deps = deps.to_vec();
        if let Some(read) = host.nvme_bytes_time(bytes) {
            let launch = OpMeta::NONE
                .with_pass(pass)
                .with_work(sim_core::graph::Work::Launch)
                .with_origin(self.origin(OFFLOAD_ORIGIN));
            deps = vec![Dep::Local(self.host_op(
                crate::NVME_STREAM,
                read,
                NVME_PARAMETERS_LABEL,
                &deps,
                launch,
            ))];
        }
        self.memcpy(
            MemcpyDirection::HostToDevice,
            Bytes(bytes),
            &deps,
            "prefetch parameter shard to device",
            meta,
        )
    }

    /// Out-of-core weights: the prefetch of layer `index`'s weights; returns the op. It reuses
    /// the buffer of the oldest layer on the device once that layer's kernels are done (or,
    /// before any reuse, waits for the previous iteration's optimizer step).
    fn fetch_weights(&mut self, index: usize) -> u32 {
        let bytes = Bytes(
            self.plan.offload.as_ref().and_then(|o| o.weights.as_ref()).map_or(0, |w| w.weights[index]),
        );
        let freed = if self.offload.weight_users.len() >= WEIGHT_BUFFERS {
            self.offload.weight_users.pop_front()
        } else {
            None
        };
        let deps: Vec<Dep> = match freed {
            Some(op) => vec![Dep::Local(op)],
            None => self.offload.iteration_start.map(Dep::Global).into_iter().collect(),
        };
        let meta = OpMeta::NONE.with_layer(index as u32);
        self.memcpy(MemcpyDirection::HostToDevice, bytes, &deps, "prefetch weights to device", meta)
    }

    /// A copy between the device and host memory, on the offload (to host) or prefetch (to
    /// device) stream, labelled `what` (of the layer and pass `meta` names).
    fn memcpy(
        &mut self,
        direction: MemcpyDirection,
        bytes: Bytes,
        deps: &[Dep],
        what: &'static str,
        meta: OpMeta,
    ) -> u32 {
        let stream = match direction {
            MemcpyDirection::DeviceToHost => OFFLOAD_STREAM,
            MemcpyDirection::HostToDevice => PREFETCH_STREAM,
        };
        let label = self.comm_label(what);
        let meta = meta.with_origin(self.origin(OFFLOAD_ORIGIN));
        let mut deps = deps.to_vec();
        deps.extend(self.launch(meta));
        self.buffer.push(
            Op { kind: OpKind::Memcpy { direction, bytes }, rank: RankId(self.rank), stream, label, meta },
            &deps,
        )
    }

    /// Out-of-core: the prefetches of `layers` back to the device (each after its copy out).
    fn prefetch(&mut self, micro: u32, layers: &[usize]) {
        let Some(offload) = &self.plan.offload else { return };
        for &l in layers {
            let bytes = Bytes(offload.bytes[l]);
            let mut deps: Vec<Dep> =
                self.offload.offloaded.get(&(micro, l)).map(|&op| Dep::Local(op)).into_iter().collect();
            deps.extend(self.last_compute.map(Dep::Local));
            let meta = OpMeta::NONE.with_layer(l as u32);
            let op = self.memcpy(
                MemcpyDirection::HostToDevice,
                bytes,
                &deps,
                "prefetch activations to device",
                meta,
            );
            self.offload.prefetched.insert((micro, l), op);
        }
    }
}

impl BackwardOffload {
    /// Whether layer `index`'s backward reads weights fetched from the host.
    fn fetches(&self, plan: &Plan<'_>, index: usize) -> bool {
        plan.offload
            .as_ref()
            .and_then(|o| o.weights.as_ref())
            .is_some_and(|w| w.fetched_for_backward(index, &plan.kernels))
    }

    /// The next layer below `below` (in backward order) whose backward reads its weights.
    fn next_fetch(&self, plan: &Plan<'_>, below: usize) -> Option<usize> {
        (self.layers.start..below).rev().find(|&l| self.fetches(plan, l))
    }
}

/// The label of a host optimizer step's chunks.
const HOST_STEP_LABEL: &str = "optimizer step on the host CPU";
/// The labels of a host optimizer's state read from and written to NVMe.
const NVME_READ_LABEL: &str = "optimizer state from NVMe";
const NVME_WRITE_LABEL: &str = "optimizer state to NVMe";
/// The label of a weights' shard read from NVMe before its copy to the device.
const NVME_PARAMETERS_LABEL: &str = "parameter shard from NVMe";

/// The origin of out-of-core training's copies (and of its streamed optimizer step): time a
/// copy runs while no kernel does is the report's offload stall.
pub const OFFLOAD_ORIGIN: &str = "offload";
