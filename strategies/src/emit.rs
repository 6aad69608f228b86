//! The per-stage, per-micro-batch emitter: turns a [`Strategy`] into execution-graph ops.
//!
//! Each rank's ops of one iteration are emitted into a buffer in schedule order, with
//! dependencies on other ranks' ops named by key (a pipeline send of micro-batch `m`, chunk
//! `k`; a context-ring step). When every rank of the iteration is emitted, the buffers are
//! appended rank after rank and the keys resolved, so a rank's ops are contiguous and plain
//! data parallelism keeps the op order it always had.
//!
//! Streams: compute kernels on [`COMPUTE_STREAM`]; each communicator kind on its own stream
//! ([`super::group_of_stream`]), so a pipeline send or a gradient bucket overlaps compute while
//! a tensor-parallel allreduce, which the next kernel needs, does not.
//!
//! Per micro-batch and chunk, forward: receive the activation from the previous chunk's
//! stage, run each layer's collectives and kernels, send the output on. Backward: receive the
//! output gradient, then per layer in reverse: recomputation (forward kernels and their
//! collectives again), the collectives before the backward, backward-data, the collectives on
//! the input gradient (overlapped by the backward-weight kernel), backward-weight, and, in the
//! last micro-batch, the gradient bucket the layer closes. After the schedule: the optimizer
//! step on the rank's parameters, then (ZeRO stages 1 and 2) the parameter allgather.

pub mod kernel_table;

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex, RwLock};

use sim_core::graph::{
    Collective, CollectiveAlgorithm, CollectiveKind, GraphBuilder, GroupId, LabelId, MemcpyDirection, Op,
    OpId, OpKind, RankId, StreamId,
};
use sim_core::units::{Bytes, SimDuration};

use super::{
    Axis, Bucket, CHANNEL_STREAM, COMPUTE_STREAM, CONTEXT_STREAM, CnnSplit, Comm, DASO_STREAM, DATA_STREAM,
    EXPERT_STREAM, FILTER_STREAM, GATHER_STREAM, GroupKind, HALO_STREAM, INPUT_STREAM, LOADER_STREAM,
    Lowered, PIPELINE_STREAM, RankLayout, Role, SPATIAL_STREAM, STAGING_STREAM, StageSummary, Strategy,
    StrategyError, TENSOR_STREAM, cnn, pipeline, shard,
};
use workloads::compute::{ComputeError, ComputeModel};
use workloads::device::{Device, Dtype};
use workloads::layer::{Layer, LayerKind, Pass};
use workloads::memory::MemoryBreakdown;
use workloads::model::Model;

/// A dependency of a buffered op.
#[derive(Debug, Clone, Copy)]
enum Dep {
    /// An op of the same rank's buffer.
    Local(u32),
    /// An op already in the graph (an earlier iteration).
    Global(OpId),
    /// Another rank's op of this iteration, by what it is.
    Key(Key),
}

/// Names an op another rank depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    /// The pipeline send of `sender`: micro-batch, global chunk, forward or backward.
    Stage { sender: u32, micro: u32, chunk: u32, forward: bool },
    /// Step `step` of the context ring of layer `layer` on `sender`; `pass` 0 forward, 1
    /// recomputation, 2 backward.
    Ring { sender: u32, layer: u32, micro: u32, step: u32, pass: u8 },
    /// The halo `sender` sends along grid dimension `dim` of layer `layer` to its upper (or
    /// lower) neighbour; `pass` 0 forward, 1 recomputation, 2 backward (the halo's gradient).
    Halo { sender: u32, layer: u32, micro: u32, dim: u8, up: bool, pass: u8 },
}

/// Kinds of communicator groups, for interning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum GroupClass {
    Tensor,
    Embedding,
    ModelParallel,
    Expert,
    Data,
    ExpertData,
    /// DASO: the GPUs of one node.
    Node,
    /// DASO: the GPUs of one local rank, one per node.
    Global,
}

/// DASO sends its parameters in chunks of at most this many elements (`sending_chunk_size`,
/// 10,000,000 in `heat.optim.DASO`), each its own non-blocking allreduce.
const DASO_CHUNK_ELEMENTS: u64 = 10_000_000;

/// One kernel: duration and FLOPs.
type Kernel = Option<(SimDuration, f64)>;

/// What every rank shares: computed once.
struct Plan<'s> {
    strategy: &'s Strategy<'s>,
    layout: RankLayout,
    micro_batches: u32,
    local: Arc<Vec<shard::LocalLayer>>,
    /// Forward, backward-data, backward-weight per layer.
    kernels: Arc<Vec<[Kernel; 3]>>,
    /// The same kernels' times fully beside communication, when the compute model slows them
    /// there; empty when it does not.
    beside: Arc<Vec<[Option<SimDuration>; 3]>>,
    /// Layer range of each global chunk.
    chunk_layers: Vec<Range<usize>>,
    /// Recomputation: the forward range re-run before the backward of its last layer.
    recompute_before: Vec<Option<Range<usize>>>,
    /// Schedule of each stage.
    actions: Vec<Vec<pipeline::Action>>,
    /// Gradient buckets of each chunk, and which bucket each layer closes.
    buckets: Vec<Vec<PlannedBucket>>,
    bucket_closed_by: Vec<Option<usize>>,
    /// Optimizer step of each stage.
    optimizer: Vec<(SimDuration, f64)>,
    /// Each layer's in-place gradient add on every micro-batch but the first, if priced
    /// ([`Strategy::accumulation`]).
    accumulate: Vec<Option<SimDuration>>,
    /// Bytes sent between consecutive chunks (activation or gradient of one micro-batch).
    boundary_bytes: Vec<Bytes>,
    /// Host time to launch one kernel (zero under CUDA graphs).
    host_cost: SimDuration,
    /// The host waits for the GPU work it issued last before it launches more
    /// (`compute.host-synchronous`).
    host_synchronous: bool,
    /// The data loader's work per iteration, if modelled.
    input: Option<InputPlan>,
    /// Bytes a first-stage rank copies to its device on the compute stream at the start of
    /// each iteration, if modelled ([`workloads::input::InputCopy`]).
    input_copy: Option<Bytes>,
    /// ZeRO-3 units (FSDP's wrapping: each numbered block, and the layers around them) of
    /// each chunk.
    units: Vec<Vec<Unit>>,
    /// DeepSpeed's ZeRO-3: each chunk's trace of one micro-batch (what is gathered, prefetched
    /// and reduced around each layer); `None` for every other strategy.
    deepspeed: Vec<Option<super::deepspeed_zero3::Trace>>,
    /// DeepSpeed's ZeRO-3: elements of each layer's parameters kept whole on every rank.
    persistent: Vec<u64>,
    /// Parameters of the embedding copy the last stage keeps for a tied output layer (0
    /// without a pipeline or tying).
    tied_embedding: u64,
    /// Parameters one GPU of each stage holds (after tensor and expert splitting, before
    /// ZeRO), the last stage's embedding copy included.
    stage_parameters: Vec<u64>,
    /// Under filter, channel or spatial parallelism, the model as one rank runs it (its local
    /// layers), for the memory model.
    local_model: Option<Model>,
    /// Under spatial parallelism, the rank grid of a group.
    spatial_grid: Vec<u32>,
    /// Out-of-core training: what each layer copies out and back, and when.
    offload: Option<OffloadPlan>,
    /// Out-of-core training: the memory the device would need without it (set by `stages`).
    without_offload: std::cell::Cell<Option<MemoryBreakdown>>,
}

/// What the data loader does each iteration (`[workload.input]`, [`workloads::input`]).
struct InputPlan {
    /// Whether the replica's batch is loaded by one rank of its model-parallel group and
    /// broadcast (a group of one rank loads for itself).
    broadcast: bool,
    /// Batches loaded ahead.
    prefetch: u32,
    /// One loader's time for the replica's batch.
    load: SimDuration,
    /// Host time to serialise the broadcast batch on the loader, and to unpack it on each
    /// receiver.
    pack: SimDuration,
    /// The broadcast batch.
    bytes: Bytes,
}

impl InputPlan {
    fn new(strategy: &Strategy<'_>) -> Result<Option<InputPlan>, StrategyError> {
        let Some((input, batch)) = strategy.input_batch() else { return Ok(None) };
        let time = |result: Result<SimDuration, sim_core::units::UnitError>, key: &'static str| {
            result.map_err(|error| StrategyError::Invalid { key, message: format!("{error}") })
        };
        let bytes = batch.broadcast.unwrap_or(Bytes::ZERO);
        Ok(Some(InputPlan {
            broadcast: batch.broadcast.is_some(),
            prefetch: input.prefetch,
            load: time(input.load_time(batch.samples), "workload.input.rate")?,
            pack: time(input.unpack_time(bytes), "workload.input.broadcast-rate")?,
            bytes,
        }))
    }
}

/// Out-of-core training (vDNN-like): each layer's saved activations are copied to host memory
/// after its forward and prefetched before its backward, on their own streams, with at most
/// `window` bytes of them on the device at once.
struct OffloadPlan {
    /// Saved activation bytes of each layer for one micro-batch.
    bytes: Vec<u64>,
    /// Device bytes the offloaded activations may occupy at once: twice the largest layer's
    /// (one layer's being written while the previous one's drains to the host).
    window: u64,
    /// Before the forward of layer `j`: the layer whose copy to the host must have ended so
    /// that the resident activations stay within the window.
    forward_wait: Vec<Option<usize>>,
    /// For each layer `m`, the layers whose prefetch starts once `m`'s backward is done
    /// (descending); `untriggered` start with the backward pass.
    prefetch_after: Vec<Vec<usize>>,
    untriggered: Vec<usize>,
    /// `"activations+weights"`: the weights' side.
    weights: Option<WeightOffload>,
}

/// The optimizer step of out-of-core weights streams the state through the GPU in chunks of at
/// most this many parameters: each chunk's buffers are a few hundred MB, and filling and
/// draining the copy pipeline costs one chunk's copies.
const OPTIMIZER_CHUNK_PARAMETERS: u64 = 1 << 24;

/// Layers whose weights out-of-core weights keeps on the device at once: the one computing and
/// three prefetched ahead. Each direction of the host link is one in-order copy queue, and in
/// the backward the activation prefetches run ahead of the compute by their window; a weight
/// fetch issued only one layer ahead queues behind them and holds the next kernel back, which
/// costs ResNet-1001 (whose weights are 0.3% of its traffic) 5% of its iteration; three ahead,
/// 1%.
const WEIGHT_BUFFERS: usize = 4;

/// Out-of-core weights (`"activations+weights"`): the weights, gradients and optimizer state
/// live in host memory. Each layer's weights are prefetched before its forward and before its
/// backward-data kernel (at most [`WEIGHT_BUFFERS`] layers' on the device: a prefetch waits
/// until the layer that many before it is done), each gradient bucket is written to host memory
/// after its allreduce (at most two buckets on the device), and the optimizer step streams
/// gradients, fp32 weights and state in and the updated state out, chunk by chunk, on the two
/// copy streams around one optimizer kernel per chunk (two chunks' buffers).
struct WeightOffload {
    /// Working-weight bytes of each layer.
    weights: Vec<u64>,
    /// Before the backward of layer `l`: the bucket whose copy to the host must have ended, so
    /// that at most two buckets are on the device (`l` opens bucket `b`, this is `b - 2`).
    bucket_wait: Vec<Option<usize>>,
    /// The optimizer's chunks: (parameters, the kernel's time).
    chunks: Vec<(u64, SimDuration)>,
    /// Bytes per parameter the optimizer streams in: the gradient, the fp32 weight (the master
    /// copy, or the weight itself in fp32) and the optimizer's fp32 states.
    in_per_parameter: u64,
    /// Bytes per parameter it streams out: the fp32 weight and states, and the working weight
    /// when it is narrower than fp32.
    out_per_parameter: u64,
}

impl WeightOffload {
    /// Working-weight bytes prefetched per iteration: every layer before its forward, and
    /// before its backward every layer that has a backward-data kernel (the first layer's
    /// backward computes only its weight gradient, which does not read the weights).
    fn prefetched(&self, kernels: &[[Kernel; 3]]) -> u64 {
        let forward: u64 = self.weights.iter().sum();
        let backward: u64 =
            self.weights.iter().zip(kernels).filter(|(_, k)| k[1].is_some()).map(|(w, _)| w).sum();
        forward + backward
    }

    /// Whether layer `index`'s backward prefetches its weights.
    fn fetched_for_backward(&self, index: usize, kernels: &[[Kernel; 3]]) -> bool {
        self.weights[index] > 0 && kernels[index][1].is_some()
    }

    /// Parameters the optimizer streams.
    fn parameters(&self) -> u64 {
        self.chunks.iter().map(|(parameters, _)| parameters).sum()
    }

    /// The `n` largest of `values`, summed: what a window of `n` holds at most.
    fn largest(values: impl Iterator<Item = u64>, n: usize) -> u64 {
        let mut values: Vec<u64> = values.collect();
        values.sort_unstable_by(|a, b| b.cmp(a));
        values.iter().take(n).sum()
    }
}

impl OffloadPlan {
    fn new(bytes: Vec<u64>) -> OffloadPlan {
        let layers = bytes.len();
        let window = 2 * bytes.iter().copied().max().unwrap_or(0);
        let mut forward_wait = vec![None; layers];
        for (j, wait) in forward_wait.iter_mut().enumerate() {
            // The latest m < j with bytes[m..=j] over the window.
            let mut sum = bytes[j];
            for m in (0..j).rev() {
                sum += bytes[m];
                if bytes[m] > 0 && sum > window {
                    *wait = Some(m);
                    break;
                }
            }
        }
        let mut prefetch_after = vec![Vec::new(); layers];
        let mut untriggered = Vec::new();
        for l in (0..layers).rev() {
            if bytes[l] == 0 {
                continue;
            }
            // The first m > l with bytes[l..=m] over the window: its backward frees room.
            let mut sum = bytes[l];
            let mut trigger = None;
            for (m, &b) in bytes.iter().enumerate().skip(l + 1) {
                sum += b;
                if b > 0 && sum > window {
                    trigger = Some(m);
                    break;
                }
            }
            match trigger {
                Some(m) => prefetch_after[m].push(l),
                None => untriggered.push(l),
            }
        }
        OffloadPlan { bytes, window, forward_wait, prefetch_after, untriggered, weights: None }
    }

    /// Bytes copied each way per micro-batch.
    fn total(&self) -> u64 {
        self.bytes.iter().sum()
    }
}

/// A group of layers whose parameters ZeRO-3 gathers and whose gradients it scatters together.
struct Unit {
    layers: Range<usize>,
    /// Parameters of one rank.
    parameters: u64,
}

/// The global chunks stage `stage` of `pipeline` holds among `chunks` (chunk `k` is on stage
/// `k % pipeline`).
fn chunks_of_stage(chunks: usize, pipeline: u32, stage: u32) -> impl Iterator<Item = usize> {
    (stage as usize..chunks).step_by(pipeline.max(1) as usize)
}

/// Labels interned once.
struct Labels {
    passes: Vec<[LabelId; 3]>,
    recompute: Vec<LabelId>,
    optimizer: LabelId,
    send_forward: LabelId,
    send_backward: LabelId,
    ring: LabelId,
    dispatch: LabelId,
    gather: LabelId,
    scatter: LabelId,
    /// Halo sends: forward, backward.
    halo: [LabelId; 2],
    /// Input pipeline: load a batch, take it from the loader, serialise it for the broadcast,
    /// unpack it on a receiver, the loop's fetch of the next batch.
    load: LabelId,
    take: LabelId,
    pack: LabelId,
    unpack: LabelId,
    fetch: LabelId,
}

/// The graph under construction and the collective instances shared by group members.
struct Shared {
    graph: GraphBuilder,
    groups: HashMap<(GroupClass, u32), GroupId>,
    instances: HashMap<GroupId, Vec<sim_core::graph::CollectiveId>>,
    /// Per rank: collectives issued so far on each group.
    issued: Vec<HashMap<GroupId, u32>>,
    comm_labels: HashMap<&'static str, LabelId>,
    keys: HashMap<Key, (u32, u32)>,
}

/// One rank's buffered ops of one iteration.
struct Buffer {
    ops: Vec<Op>,
    dep_ends: Vec<u32>,
    deps: Vec<Dep>,
    /// Compute ops (by index) slowed beside communication, with their time there.
    beside: Vec<(u32, SimDuration)>,
}

impl Buffer {
    fn push(&mut self, op: Op, deps: &[Dep]) -> u32 {
        self.ops.push(op);
        self.deps.extend_from_slice(deps);
        self.dep_ends.push(self.deps.len() as u32);
        self.ops.len() as u32 - 1
    }

    /// [`Buffer::push`] with `last` after `deps`.
    fn push_with(&mut self, op: Op, deps: &[Dep], last: Dep) -> u32 {
        self.deps.extend_from_slice(deps);
        self.push(op, &[last])
    }
}

pub(super) fn lower(strategy: &Strategy<'_>) -> Result<Lowered, StrategyError> {
    let plan = Plan::new(strategy)?;
    let ranks = plan.layout.ranks();
    let mut shared = Shared {
        graph: GraphBuilder::new(ranks),
        groups: HashMap::new(),
        instances: HashMap::new(),
        issued: vec![HashMap::new(); ranks as usize],
        comm_labels: HashMap::new(),
        keys: HashMap::new(),
    };
    // Folding: tensor ranks and data-parallel replicas do the same work at the same times, so
    // only tensor rank 0 of replica 0 of each (pipeline, context) position gets ops; the
    // engine replays their traffic on the other ranks (shadows), so the network still carries
    // every rank's bytes.
    // Spatial ranks differ (a tile on the border has one neighbour, not two): all of them get
    // ops, and only the replicas are folded.
    let spatial = matches!(strategy.parallelism.cnn(), CnnSplit::Spatial { .. });
    let folded_tensor = if spatial { 1 } else { plan.layout.size(Axis::Tensor) };
    // DASO's global sync rotates over the local ranks of a node, so replicas differ: no folding.
    let daso = matches!(strategy.parallelism.sync, super::GradientSync::Daso { .. });
    let fold = strategy.fold_symmetric_ranks && !daso && folded_tensor * plan.layout.size(Axis::Data) > 1;
    let simulated: Vec<u32> = (0..ranks)
        .filter(|&rank| {
            let c = plan.layout.coordinates(RankId(rank));
            !fold || ((spatial || c.tensor == 0) && c.data == 0)
        })
        .collect();
    let mut position_of = vec![u32::MAX; ranks as usize];
    for (position, &rank) in simulated.iter().enumerate() {
        position_of[rank as usize] = position as u32;
    }
    if fold {
        let (t, d) = (folded_tensor, plan.layout.size(Axis::Data));
        // Every rank's coordinates once, not once per image (t x d images of every rank).
        let coordinates: Vec<_> = (0..ranks).map(|rank| plan.layout.coordinates(RankId(rank))).collect();
        let images = (0..t * d)
            .skip(1)
            .map(|shift| {
                coordinates
                    .iter()
                    .map(|&c| {
                        let mut c = c;
                        if !spatial {
                            c.tensor = (c.tensor + shift % t) % t;
                        }
                        c.data = (c.data + shift / t) % d;
                        plan.layout.rank(c)
                    })
                    .collect()
            })
            .collect();
        shared.graph.set_symmetry(images);
    }
    let labels = plan.labels(&mut shared.graph);
    // (synchronisation, parameter allgather) labels of each bucket of each chunk.
    let bucket_labels: Vec<Vec<(LabelId, LabelId)>> = plan
        .buckets
        .iter()
        .map(|chunk| {
            chunk
                .iter()
                .enumerate()
                .map(|(index, b)| {
                    let sync = shared.graph.label(&b.sync_name(index, strategy.parallelism.zero));
                    let gather =
                        shared.graph.label(&format!("allgather parameter bucket ({})", b.parameter_bytes));
                    (sync, gather)
                })
                .collect()
        })
        .collect();
    let mut iteration_ends = Vec::with_capacity(strategy.iterations as usize);
    let mut pipeline_ends = Vec::with_capacity(strategy.iterations as usize);
    let mut previous_end: Vec<Option<OpId>> = vec![None; simulated.len()];
    let mut spans = Vec::new();
    // DASO: each simulated rank's last global allreduce op of each iteration, if it sent one.
    let mut daso_sent: Vec<Vec<Option<OpId>>> = Vec::with_capacity(strategy.iterations as usize);
    // Each simulated rank's loader batches in flight, carried from one iteration to the next.
    let mut loads: Vec<VecDeque<(u32, Dep)>> = vec![VecDeque::new(); simulated.len()];
    for iteration in 0..strategy.iterations {
        shared.keys.clear();
        let mut buffers = Vec::with_capacity(simulated.len());
        let mut span_buffers: Vec<Vec<(String, u32, u32)>> = Vec::with_capacity(simulated.len());
        let mut ends = Vec::with_capacity(simulated.len());
        let mut daso_local: Vec<Option<u32>> = Vec::with_capacity(simulated.len());
        let mut rank_loads: Vec<VecDeque<(u32, Dep)>> = Vec::with_capacity(simulated.len());
        for (position, &rank) in simulated.iter().enumerate() {
            // Ranks emit about as many ops as each other: room for the previous one's.
            let (ops, deps) = buffers.last().map_or((0, 0), |b: &Buffer| (b.ops.len(), b.deps.len()));
            let mut emitter = RankEmitter {
                plan: &plan,
                labels: &labels,
                bucket_labels: &bucket_labels,
                shared: &mut shared,
                rank,
                buffer: Buffer {
                    ops: Vec::with_capacity(ops),
                    dep_ends: Vec::with_capacity(ops),
                    deps: Vec::with_capacity(deps),
                    beside: Vec::new(),
                },
                waiting: Vec::new(),
                last_compute: None,
                last_issued: Vec::new(),
                spans: Vec::new(),
                host_start: None,
                iteration,
                daso_pending: None,
                daso_sent: None,
                offloaded: HashMap::new(),
                prefetched: HashMap::new(),
                loads: std::mem::take(&mut loads[position]),
                weight_users: VecDeque::new(),
                iteration_start: previous_end[position],
                bucket_copies: Vec::new(),
                deepspeed_gather: None,
                deepspeed_reduce: None,
                deepspeed_copies: None,
            };
            emitter.daso_pending = daso_pending(&plan, &daso_sent, iteration, position);
            let (end, pipeline_end) = emitter.iteration(previous_end[position])?;
            daso_local.push(emitter.daso_sent);
            rank_loads.push(std::mem::take(&mut emitter.loads));
            let rank_spans = std::mem::take(&mut emitter.spans);
            buffers.push(emitter.buffer);
            ends.push((end, pipeline_end));
            span_buffers.push(rank_spans);
        }
        // Append rank after rank, resolving keys.
        let mut offsets = Vec::with_capacity(simulated.len());
        let mut next = shared.graph.op_count() as u32;
        for buffer in &buffers {
            offsets.push(next);
            next += buffer.ops.len() as u32;
        }
        shared
            .graph
            .reserve(buffers.iter().map(|b| b.ops.len()).sum(), buffers.iter().map(|b| b.deps.len()).sum());
        let mut resolved = Vec::new();
        for (rank, buffer) in buffers.into_iter().enumerate() {
            let mut start = 0usize;
            for (op, &end) in buffer.ops.into_iter().zip(&buffer.dep_ends) {
                resolved.clear();
                for dep in &buffer.deps[start..end as usize] {
                    resolved.push(match *dep {
                        Dep::Local(index) => OpId(offsets[rank] + index),
                        Dep::Global(id) => id,
                        Dep::Key(key) => {
                            let (owner, index) = shared.keys.get(&key).copied().ok_or_else(|| {
                                StrategyError::Internal(format!(
                                    "rank {rank} waits for {key:?}, which no rank sends"
                                ))
                            })?;
                            OpId(offsets[position_of[owner as usize] as usize] + index)
                        }
                    });
                }
                start = end as usize;
                shared.graph.add_op(op, &resolved);
            }
            for &(index, beside) in &buffer.beside {
                shared.graph.slow_beside_communication(OpId(offsets[rank] + index), beside);
            }
        }
        for (position, mut in_flight) in rank_loads.into_iter().enumerate() {
            for (_, dep) in in_flight.iter_mut() {
                if let Dep::Local(index) = *dep {
                    *dep = Dep::Global(OpId(offsets[position] + index));
                }
            }
            loads[position] = in_flight;
        }
        for (position, rank_spans) in span_buffers.into_iter().enumerate() {
            for (name, first, last) in rank_spans {
                spans.push(super::ScheduleSpan {
                    rank: RankId(simulated[position]),
                    name,
                    first: OpId(offsets[position] + first),
                    last: OpId(offsets[position] + last),
                });
            }
        }
        let iteration_end: Vec<OpId> =
            ends.iter().enumerate().map(|(rank, (end, _))| OpId(offsets[rank] + end)).collect();
        pipeline_ends.push(ends.iter().enumerate().map(|(rank, (_, p))| OpId(offsets[rank] + p)).collect());
        for (rank, end) in iteration_end.iter().enumerate() {
            previous_end[rank] = Some(*end);
        }
        daso_sent.push(
            daso_local
                .iter()
                .enumerate()
                .map(|(rank, sent)| sent.map(|op| OpId(offsets[rank] + op)))
                .collect(),
        );
        iteration_ends.push(iteration_end);
    }
    let stages = plan.stages()?;
    let (flops_per_rank_iteration, recompute_flops_per_rank_iteration) = plan.mean_flops_per_rank();
    // Stage 0's gradient buckets, or its ZeRO-3 units (each gathered and scattered whole).
    let stage0: Vec<Bucket> = plan
        .chunks_of(0)
        .flat_map(|k| -> Vec<Bucket> {
            if let Some(trace) = &plan.deepspeed[k] {
                // DeepSpeed's gradient buckets, in backward order.
                trace
                    .events
                    .iter()
                    .map(|e| e.reduce)
                    .chain(std::iter::once(trace.final_reduce))
                    .filter(|&elements| elements > 0)
                    .map(|elements| Bucket { layers: Vec::new(), bytes: plan.weight_bytes(elements) })
                    .collect()
            } else if strategy.parallelism.zero >= 3 {
                plan.units[k]
                    .iter()
                    .filter(|unit| unit.parameters > 0)
                    .map(|unit| Bucket {
                        layers: unit.layers.clone().collect(),
                        bytes: plan.gradient_bytes(unit.parameters),
                    })
                    .collect()
            } else {
                plan.buckets[k].iter().map(|b| b.bucket.clone()).collect()
            }
        })
        .collect();
    let offload = plan.offload.as_ref().map(|offload| plan.offload_totals(offload));
    Ok(Lowered {
        offload,
        graph: shared.graph.build()?,
        ranks: simulated.into_iter().map(RankId).collect(),
        spans,
        iteration_ends,
        pipeline_ends,
        gradient_bytes: stage0.iter().map(|b| b.bytes.0).sum(),
        buckets: stage0,
        flops_per_rank_iteration,
        recompute_flops_per_rank_iteration,
        micro_batches: plan.micro_batches,
        stages,
    })
}

/// The memory of every stage and a lower bound of the iteration time, from the kernel-time
/// table and the schedule alone: no graph is built.
///
/// The bound: a rank's compute kernels run one after another on its compute stream, so a
/// stage takes at least the sum of its kernels over every micro-batch (recomputation
/// included) plus its optimizer step; and stage `s` cannot start before micro-batch 0 has
/// gone forward through chunks `0..s`, nor finish before its last backward has gone back
/// through them (the fill and drain of the pipeline). The layer collectives a kernel waits for
/// (tensor-parallel allreduces, expert all-to-alls) add `comm_floor` each, a time no network
/// can beat; gradient synchronisation, pipeline sends and the host are left out, so a
/// simulation never comes out faster (`tests.rs` checks it).
pub(super) fn estimate(
    strategy: &Strategy<'_>,
    comm_floor: &dyn Fn(&Comm) -> SimDuration,
) -> Result<super::Estimate, StrategyError> {
    let plan = Plan::new(strategy)?;
    let stages = plan.stages()?;
    let p = strategy.parallelism.pipeline;
    let kernel_ps = |kernel: &Kernel| kernel.map_or(0u128, |(duration, _)| u128::from(duration.as_ps()));
    let comms_ps = |comms: &[Comm]| comms.iter().map(|c| u128::from(comm_floor(c).as_ps())).sum::<u128>();
    // A layer's forward: the collectives before it, its kernel, the collectives after it;
    // the next kernel waits for each.
    let forward_ps = |i: usize| {
        let local = &plan.local[i];
        comms_ps(&local.before_forward) + kernel_ps(&plan.kernels[i][0]) + comms_ps(&local.after_forward)
    };
    // Backward: recomputation, the collectives before it, backward-data, then backward-weight
    // and the input gradient's collectives side by side.
    let backward_ps = |i: usize| {
        let local = &plan.local[i];
        let again = plan.recompute_before[i].as_ref().map_or(0, |r| r.clone().map(forward_ps).sum::<u128>());
        again
            + comms_ps(&local.before_backward)
            + kernel_ps(&plan.kernels[i][1])
            + kernel_ps(&plan.kernels[i][2]).max(if plan.kernels[i][1].is_some() {
                comms_ps(&local.after_backward_data)
            } else {
                0
            })
    };
    // Forward and backward of one micro-batch of each global chunk.
    let chunk_times: Vec<(u128, u128)> = plan
        .chunk_layers
        .iter()
        .map(|range| {
            (range.clone().map(forward_ps).sum::<u128>(), range.clone().map(backward_ps).sum::<u128>())
        })
        .collect();
    let micro_batches = u128::from(plan.micro_batches);
    let mut bound = 0u128;
    let mut fill_and_drain = 0u128;
    for stage in 0..p {
        // Every micro-batch but the first adds its weight gradients in place, if priced.
        let accumulate: u128 = plan
            .chunks_of(stage)
            .flat_map(|k| plan.chunk_layers[k].clone())
            .map(|i| plan.accumulate[i].map_or(0, |d| u128::from(d.as_ps())))
            .sum();
        let work: u128 = plan.chunks_of(stage).map(|k| chunk_times[k].0 + chunk_times[k].1).sum::<u128>()
            * micro_batches
            + accumulate * micro_batches.saturating_sub(1)
            + u128::from(plan.optimizer[stage as usize].0.as_ps());
        bound = bound.max(work + fill_and_drain);
        if let Some((forward, backward)) = chunk_times.get(stage as usize) {
            fill_and_drain += forward + backward;
        }
    }
    // A context-parallel ring splits a kernel into `context` steps, each rounded down to the
    // picosecond.
    let rounding = u128::from(strategy.parallelism.context) * plan.local.len() as u128 * micro_batches * 3;
    let bound = bound.saturating_sub(rounding);
    Ok(super::Estimate {
        stages,
        micro_batches: plan.micro_batches,
        time_lower_bound: SimDuration::from_ps(u64::try_from(bound).unwrap_or(u64::MAX)),
        flops_per_rank_iteration: plan.mean_flops_per_rank().0,
    })
}

/// Local layers and their kernel times, shared by the configurations of a search that split a
/// model the same way ("kernel tables shared between configurations"): the estimate and the
/// lowering of every strategy with the same split, micro-batch and precision take them from
/// here instead of building and pricing them again. Bound to one model, device and compute
/// model: a strategy on other ones (compared by address) does not use it.
pub struct LayerTables<'a> {
    model: &'a Model,
    device: &'a Device,
    compute: &'a ComputeModel,
    /// A search has a few dozen splits: a list is as fast as a map and needs no hashing of
    /// floats.
    tables: RwLock<Vec<(TableKey, Arc<LayerTable>)>>,
}

/// What the local layers and their kernel times depend on besides the model, device and
/// compute model.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TableKey {
    split: shard::Split,
    micro_batch: u64,
    precision: Dtype,
    fusion: workloads::fusion::Fusion,
    batch_norm_group: workloads::groupbn::BatchNormGroup,
}

/// Every layer as one rank runs it, its forward, backward-data and backward-weight kernels,
/// and the pipeline partitions these kernels give.
#[derive(Debug)]
struct LayerTable {
    local: Arc<Vec<shard::LocalLayer>>,
    kernels: Arc<Vec<[Kernel; 3]>>,
    /// [`Plan::beside`].
    beside: Arc<Vec<[Option<SimDuration>; 3]>>,
    /// Layer ranges of each chunk, by chunk count ([`Plan::partition`]).
    partitions: Mutex<Vec<(usize, Vec<Range<usize>>)>>,
}

impl LayerTable {
    /// [`Plan::partition`] of `model` into `chunks` by this table's kernels, computed once
    /// per chunk count.
    fn partition(&self, model: &Model, chunks: usize) -> Vec<Range<usize>> {
        let cached = |list: &[(usize, Vec<Range<usize>>)]| {
            list.iter().find(|(count, _)| *count == chunks).map(|(_, ranges)| ranges.clone())
        };
        if let Some(ranges) = self.partitions.lock().ok().and_then(|list| cached(&list)) {
            return ranges;
        }
        let ranges = Plan::partition(model, &self.kernels, chunks);
        if let Ok(mut list) = self.partitions.lock()
            && cached(&list).is_none()
        {
            list.push((chunks, ranges.clone()));
        }
        ranges
    }
}

impl std::fmt::Debug for LayerTables<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tables = self.tables.read().map_or(0, |tables| tables.len());
        f.debug_struct("LayerTables").field("model", &self.model.name).field("tables", &tables).finish()
    }
}

impl<'a> LayerTables<'a> {
    /// Empty tables for strategies on `model`, `device` and `compute`.
    pub fn new(model: &'a Model, device: &'a Device, compute: &'a ComputeModel) -> LayerTables<'a> {
        LayerTables { model, device, compute, tables: RwLock::new(Vec::new()) }
    }

    /// Whether `strategy` runs on this table's model, device and compute model.
    fn serves(&self, strategy: &Strategy<'_>) -> bool {
        std::ptr::eq(self.model, strategy.model)
            && std::ptr::eq(self.device, strategy.device)
            && std::ptr::eq(self.compute, strategy.compute)
    }

    /// `strategy`'s local layers and kernels: from its tables if it has them and they hold
    /// this split, else built (and kept there). Errors are not kept: the next strategy with
    /// the split gets the same error again.
    fn layers_and_kernels(strategy: &Strategy<'_>) -> Result<Arc<LayerTable>, StrategyError> {
        let key = TableKey {
            split: strategy.parallelism.split(),
            micro_batch: strategy.micro_batch,
            precision: strategy.precision,
            fusion: strategy.fusion,
            batch_norm_group: strategy.batch_norm_group,
        };
        let Some(tables) = strategy.layer_tables.filter(|tables| tables.serves(strategy)) else {
            return build_layer_table(strategy);
        };
        let found = |list: &[(TableKey, Arc<LayerTable>)]| {
            list.iter().find(|(k, _)| *k == key).map(|(_, table)| Arc::clone(table))
        };
        if let Some(table) = tables.tables.read().ok().and_then(|list| found(&list)) {
            return Ok(table);
        }
        let table = build_layer_table(strategy)?;
        if let Ok(mut list) = tables.tables.write() {
            // Another thread may have built it meanwhile: keep one copy (they are equal).
            if let Some(existing) = found(&list) {
                return Ok(existing);
            }
            list.push((key, Arc::clone(&table)));
        }
        Ok(table)
    }
}

/// Every layer of `strategy`'s model as one rank runs it, and its kernels' times.
fn build_layer_table(strategy: &Strategy<'_>) -> Result<Arc<LayerTable>, StrategyError> {
    let model = strategy.model;
    let p = &strategy.parallelism;
    let mut local = shard::local_layers(model, p.split(), strategy.micro_batch, strategy.precision)?;
    strategy.fusion.apply(local.iter_mut().map(|entry| &mut entry.layer));
    let group = strategy.batch_norm_group;
    group.apply_ordering_add(local.iter_mut().map(|entry| &mut entry.layer));
    let mut kernels: Vec<[Kernel; 3]> = Vec::with_capacity(local.len());
    // Repeated blocks (a transformer's layers, a ResNet stage's bottlenecks) run the same
    // kernels: a layer doing the same work as the one at its position in the previous block
    // takes its times instead of pricing them again.
    let twins = block_twins(model.blocks());
    for (index, layer) in local.iter().enumerate() {
        if let Some(twin) = twins.get(index).copied().flatten()
            && twin > 0
            && same_work(&local[twin], layer)
        {
            kernels.push(kernels[twin]);
            continue;
        }
        let forward = strategy.kernel(layer, Pass::Forward)?;
        // The input of the first layer needs no gradient.
        let backward_data = if index == 0 { None } else { strategy.kernel(layer, Pass::BackwardData)? };
        let backward_weight = strategy.kernel(layer, Pass::BackwardWeight)?;
        let exchange = group_exchange(group, &layer.layer)?;
        let (forward, mut backward_data, mut backward_weight) =
            (with_exchange(forward, exchange), with_exchange(backward_data, exchange), backward_weight);
        let forward = match filter_copies(strategy, layer)? {
            Some((gather, alltoall)) => {
                // The alltoall's copies precede the first backward kernel the layer has.
                if backward_data.is_some() {
                    backward_data = with_exchange(backward_data, alltoall);
                } else {
                    backward_weight = with_exchange(backward_weight, alltoall);
                }
                with_exchange(forward, gather)
            }
            None => forward,
        };
        kernels.push([forward, backward_data, backward_weight]);
    }
    let mut beside = Vec::new();
    if strategy.compute.slows_beside_communication() {
        for (index, layer) in local.iter().enumerate() {
            let data = if index == 0 {
                None
            } else {
                strategy.kernel_beside_communication(layer, Pass::BackwardData)?
            };
            let exchange = group_exchange(group, &layer.layer)?;
            let add = |time: Option<SimDuration>| time.map(|time| time.saturating_add(exchange));
            beside.push([
                add(strategy.kernel_beside_communication(layer, Pass::Forward)?),
                add(data),
                strategy.kernel_beside_communication(layer, Pass::BackwardWeight)?,
            ]);
        }
    }
    Ok(Arc::new(LayerTable {
        local: Arc::new(local),
        kernels: Arc::new(kernels),
        beside: Arc::new(beside),
        partitions: Mutex::new(Vec::new()),
    }))
}

/// The GPU copies around ChainerMN's allgather function on a filter-split layer whose backward
/// is its alltoall (`filter-backward = "output-alltoall"`), as (forward, backward) time, each
/// copy its own kernel over the layer's whole output `Y` (`B y_l w` bytes) at the compute
/// model's memory rate; `None` for other layers. Chainer v7.0.0 and CuPy:
/// - forward: `F.concat` of the `p` gathered blocks, `xp.concatenate` (`chainer/functions/
///   array/concat.py`): reads and writes `Y`;
/// - backward: `Concat.backward` splits the gradient into `p` views (`split_axis`, `xp.split`),
///   which `MpiCommunicatorBase.alltoall` flattens (`x.reshape(-1)` of a non-contiguous view
///   copies: `p` kernels of `2 Y / p`) and joins (`xp.hstack`: `2 Y`); `AllGather.backward`
///   then `xp.stack`s the `p` received blocks (`2 Y`) and sums them (`.sum(axis=0)`: reads `Y`,
///   writes `Y / p`) (`chainermn/communicators/mpi_communicator_base.py`,
///   `chainermn/functions/collective_communication.py`).
fn filter_copies(
    strategy: &Strategy<'_>,
    layer: &shard::LocalLayer,
) -> Result<Option<(SimDuration, SimDuration)>, StrategyError> {
    let Some(alltoall) = layer
        .before_backward
        .iter()
        .find(|c| c.group == GroupKind::Filter && c.kind == CollectiveKind::AllToAll)
    else {
        return Ok(None);
    };
    let output = alltoall.bytes.0 as f64;
    let blocks = strategy.parallelism.filter.max(1);
    let p = f64::from(blocks);
    let copy = |bytes: f64, class| {
        strategy
            .compute
            .duration(strategy.device, strategy.precision, 0.0, bytes, class)
            .map_err(|source| StrategyError::Compute { layer: layer.layer.name.clone(), source })
    };
    let elementwise = workloads::layer::OpClass::Elementwise;
    // Reading and writing `Y` once: the forward's concat, the backward's hstack and stack.
    let whole = copy(2.0 * output, elementwise)?;
    let flatten = copy(2.0 * output / p, elementwise)?.checked_mul(u64::from(blocks)).map_err(|error| {
        StrategyError::Compute { layer: layer.layer.name.clone(), source: ComputeError::Overflow(error) }
    })?;
    let backward = flatten
        .saturating_add(whole)
        .saturating_add(whole)
        .saturating_add(copy(output + output / p, workloads::layer::OpClass::Reduction)?);
    let forward = whole;
    Ok(Some((forward, backward)))
}

/// What a batch norm's kernel (forward or backward) waits for its group's peers under
/// `group` ([`workloads::groupbn::BatchNormGroup::exchange_time`]): on the kernel's critical path,
/// as every CTA spins until the peer's sums arrive. Zero for other layers and without a group.
fn group_exchange(
    group: workloads::groupbn::BatchNormGroup,
    layer: &Layer,
) -> Result<SimDuration, StrategyError> {
    if !group.is_grouped() || layer.kind != LayerKind::BatchNorm {
        return Ok(SimDuration::ZERO);
    }
    group.exchange_time(workloads::groupbn::channels(layer)).map_err(|error| StrategyError::Compute {
        layer: layer.name.clone(),
        source: ComputeError::Duration(error),
    })
}

/// `kernel` lengthened by `exchange` (a batch norm's kernel that does no other work still
/// runs, to exchange).
fn with_exchange(kernel: Kernel, exchange: SimDuration) -> Kernel {
    if exchange == SimDuration::ZERO {
        return kernel;
    }
    let (time, flops) = kernel.unwrap_or((SimDuration::ZERO, 0.0));
    Some((time.saturating_add(exchange), flops))
}

/// For every layer in a numbered block, the layer at the same position in the block before
/// (if that block is as long), a candidate for the same kernels.
fn block_twins(blocks: &[Option<u32>]) -> Vec<Option<usize>> {
    let mut twins = vec![None; blocks.len()];
    // Layer ranges of the previous block and of the current one.
    let mut previous: Option<Range<usize>> = None;
    let mut current: Option<Range<usize>> = None;
    for (index, block) in blocks.iter().enumerate() {
        let Some(block) = block else { continue };
        match &mut current {
            Some(range) if range.end == index && blocks[range.start] == Some(*block) => range.end += 1,
            _ => {
                previous = current.take();
                current = Some(index..index + 1);
            }
        }
        if let (Some(previous), Some(current)) = (&previous, &current) {
            let twin = previous.start + (index - current.start);
            if twin < previous.end {
                twins[index] = Some(twin);
            }
        }
    }
    twins
}

/// Whether two local layers price the same: the same kind, shapes and cost (the name aside),
/// and the same share of the work.
fn same_work(a: &shard::LocalLayer, b: &shard::LocalLayer) -> bool {
    a.work_divisor == b.work_divisor
        && a.work_multiplier.to_bits() == b.work_multiplier.to_bits()
        && a.layer.kind == b.layer.kind
        && a.layer.input == b.layer.input
        && a.layer.output == b.layer.output
        && a.layer.cost == b.layer.cost
}

/// DASO, non-blocking: the global allreduce that the rank at `position` sent `wait` iterations
/// before `iteration` and must wait for now, if this is a receiving iteration and it was the
/// sender.
fn daso_pending(
    plan: &Plan<'_>,
    sent: &[Vec<Option<OpId>>],
    iteration: u32,
    position: usize,
) -> Option<OpId> {
    let super::GradientSync::Daso { blocking: false, wait, .. } = plan.strategy.parallelism.sync else {
        return None;
    };
    let from = iteration.checked_sub(wait)?;
    sent.get(from as usize).and_then(|ranks| ranks.get(position)).copied().flatten()
}

/// A gradient bucket of one chunk: its layers and gradient bytes, whether it holds expert
/// parameters (synchronised over the expert-data group), and its parameter bytes (for ZeRO's
/// parameter allgather).
struct PlannedBucket {
    bucket: Bucket,
    expert: bool,
    parameter_bytes: Bytes,
}

impl PlannedBucket {
    /// `"allreduce gradient bucket 3 (24.00 MiB)"`.
    fn sync_name(&self, index: usize, zero: u8) -> String {
        let kind = if zero >= 1 { "reduce-scatter" } else { "allreduce" };
        let expert = if self.expert { "expert " } else { "" };
        format!("{kind} {expert}gradient bucket {index} ({})", self.bucket.bytes)
    }
}

impl<'s> Plan<'s> {
    fn new(strategy: &'s Strategy<'s>) -> Result<Plan<'s>, StrategyError> {
        let p = &strategy.parallelism;
        let model = strategy.model;
        let micro_batches = strategy.micro_batches()?;
        let table = LayerTables::layers_and_kernels(strategy)?;
        let (local, kernels) = (Arc::clone(&table.local), Arc::clone(&table.kernels));
        let beside = Arc::clone(&table.beside);
        let chunk_layers = table.partition(model, p.chunks() as usize);

        let mut recompute_before: Vec<Option<Range<usize>>> = vec![None; local.len()];
        for range in strategy.memory_plan(model, Bytes::ZERO).recomputed_ranges() {
            if let Some(last) = range.end.checked_sub(1) {
                recompute_before[last] = Some(range);
            }
        }
        let actions = (0..p.pipeline)
            .map(|stage| pipeline::actions(p.schedule, p.pipeline, p.virtual_stages, stage, micro_batches))
            .collect();

        let gradient_width = strategy.gradient_precision.bytes();
        let weight_width = strategy.precision.bytes().max(2);
        let mut buckets = Vec::with_capacity(chunk_layers.len());
        let mut bucket_closed_by = vec![None; local.len()];
        let separate_experts = p.expert > 1;
        for range in &chunk_layers {
            let mut chunk_buckets: Vec<PlannedBucket> = Vec::new();
            for expert in [false, true] {
                if expert && !separate_experts {
                    continue;
                }
                let mut current = Bucket { layers: Vec::new(), bytes: Bytes::ZERO };
                let mut parameters = 0u64;
                let mut count = 0;
                let close = |current: &mut Bucket, parameters: &mut u64, list: &mut Vec<PlannedBucket>| {
                    let bucket =
                        std::mem::replace(current, Bucket { layers: Vec::new(), bytes: Bytes::ZERO });
                    let parameter_bytes = Bytes(*parameters * weight_width);
                    *parameters = 0;
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
                    parameters += params;
                    let cap = if count == 0 { p.first_bucket_cap } else { p.bucket_cap };
                    if current.bytes >= cap {
                        close(&mut current, &mut parameters, &mut chunk_buckets);
                        count += 1;
                    }
                }
                if !current.layers.is_empty() {
                    close(&mut current, &mut parameters, &mut chunk_buckets);
                }
            }
            buckets.push(chunk_buckets);
        }
        // Which bucket each layer closes (its last gradient).
        // DDP launches its bucket allreduces whatever the world size; other strategies
        // synchronise only over more than one rank.
        let sync_ranks = p.gradient_sync_ranks();
        if (sync_ranks > 1 || p.is_data_parallel()) && p.zero < 3 {
            for chunk in &buckets {
                for (b, bucket) in chunk.iter().enumerate() {
                    if let Some(&last) = bucket.bucket.layers.last() {
                        bucket_closed_by[last] = Some(b);
                    }
                }
            }
        }
        // An output layer tied to the input embedding on another stage: Megatron-LM keeps a
        // copy of the embedding on the last stage and all-reduces the two copies' gradients.
        let tied =
            local.iter().any(|l| matches!(l.layer.kind, workloads::layer::LayerKind::TiedLinear { .. }));
        let tied_embedding = if tied && p.pipeline > 1 {
            local.iter().find(|l| l.role == Role::VocabularyEmbedding).map_or(0, |l| l.layer.cost.params)
        } else {
            0
        };
        // ZeRO-2 and -3 reduce each micro-batch's gradients into their shards instead.
        let accumulate = if p.zero >= 2 {
            vec![None; local.len()]
        } else {
            local.iter().map(|layer| strategy.accumulation(layer)).collect::<Result<Vec<_>, _>>()?
        };
        let mut optimizer = Vec::with_capacity(p.pipeline as usize);
        let mut stage_parameters = Vec::with_capacity(p.pipeline as usize);
        for stage in 0..p.pipeline {
            let layers = || {
                chunks_of_stage(chunk_layers.len(), p.pipeline, stage).flat_map(|k| chunk_layers[k].clone())
            };
            let parameters = layers().map(|index| local[index].layer.cost.params).sum::<u64>()
                + if stage + 1 == p.pipeline { tied_embedding } else { 0 };
            let held = if p.zero >= 1 { parameters.div_ceil(u64::from(sync_ranks)) } else { parameters };
            let tensors = layers().filter(|&index| local[index].layer.cost.params > 0).count() as u64;
            optimizer.push(strategy.optimizer_step(held, tensors)?);
            stage_parameters.push(parameters);
        }
        let width = strategy.precision.bytes();
        let boundary_bytes = chunk_layers
            .iter()
            .map(|range| {
                let last = range.end.saturating_sub(1);
                Bytes(local[last].layer.output.elements() * strategy.micro_batch * width)
            })
            .collect();
        let blocks = model.blocks();
        let units = chunk_layers
            .iter()
            .map(|range| {
                let mut units: Vec<Unit> = Vec::new();
                for index in range.clone() {
                    let parameters = local[index].layer.cost.params;
                    match units.last_mut() {
                        Some(unit) if blocks[unit.layers.start] == blocks[index] => {
                            unit.layers.end = index + 1;
                            unit.parameters += parameters;
                        }
                        _ => units.push(Unit { layers: index..index + 1, parameters }),
                    }
                }
                units
            })
            .collect();
        let deepspeed_zero3 = p.zero >= 3 && p.zero_implementation == super::ZeroImplementation::DeepSpeed;
        // DeepSpeed's ZeRO-3 only: each layer's gathered and whole-kept elements (the output
        // layer tied to the embedding gathers the embedding's weight), its gradient elements,
        // and each chunk's trace over them.
        let (persistent, deepspeed): (Vec<u64>, Vec<Option<super::deepspeed_zero3::Trace>>) =
            if deepspeed_zero3 {
                let split: Vec<(u64, u64)> = local
                    .iter()
                    .map(|l| super::deepspeed_zero3::partitioned_and_persistent(&l.layer))
                    .collect();
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
                    .map(|range| {
                        Some(super::deepspeed_zero3::trace(
                            range.clone(),
                            &recompute_before,
                            &partitioned,
                            &gradients,
                        ))
                    })
                    .collect();
                (split.iter().map(|&(_, kept)| kept).collect(), traces)
            } else {
                (Vec::new(), vec![None; chunk_layers.len()])
            };
        let local_model = (p.cnn() != CnnSplit::None).then(|| {
            Model::from_layers(
                model.name.clone(),
                model.family.clone(),
                local.first().map_or_else(|| model.input.clone(), |l| l.layer.input.clone()),
                local.iter().map(|l| l.layer.clone()).collect(),
            )
        });
        let spatial_grid = match p.cnn() {
            CnnSplit::Spatial { degree, dims, .. } => cnn::spatial_grid(degree, dims),
            _ => Vec::new(),
        };
        let mut offload = (p.offload != super::Offload::None)
            .then(|| OffloadPlan::new(strategy.memory_plan(model, Bytes::ZERO).activations_per_layer()));
        if let Some(offload) = offload.as_mut()
            && p.offload == super::Offload::ActivationsAndWeights
        {
            offload.weights = Some(Self::weight_offload(strategy, &local, &buckets)?);
        }
        Ok(Plan {
            without_offload: std::cell::Cell::new(None),
            offload,
            local_model,
            spatial_grid,
            strategy,
            host_cost: strategy.compute.host_cost_per_kernel(),
            host_synchronous: strategy.compute.host_synchronous,
            input: InputPlan::new(strategy)?,
            input_copy: strategy.input_copy_bytes(),
            units,
            deepspeed,
            persistent,
            tied_embedding,
            stage_parameters,
            layout: p.layout(),
            micro_batches,
            local,
            kernels,
            beside,
            chunk_layers,
            recompute_before,
            actions,
            buckets,
            bucket_closed_by,
            optimizer,
            accumulate,
            boundary_bytes,
        })
    }

    /// Out-of-core weights: what each layer fetches, the gradient buckets' window and the
    /// optimizer's chunks (data parallelism only: one chunk of layers, every bucket synchronised).
    fn weight_offload(
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
        let mut chunks = Vec::new();
        let mut offset = 0;
        while offset < parameters {
            let size = OPTIMIZER_CHUNK_PARAMETERS.min(parameters - offset);
            chunks.push((size, strategy.optimizer_step(size, 1)?.0));
            offset += size;
        }
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

    /// What out-of-core training moves over one GPU's host link per iteration and keeps in
    /// host memory.
    fn offload_totals(&self, offload: &OffloadPlan) -> super::OffloadTotals {
        let activation_bytes = offload.total() * u64::from(self.micro_batches);
        let mut totals = super::OffloadTotals {
            to_host_bytes: activation_bytes,
            to_device_bytes: activation_bytes,
            activation_bytes,
            weight_bytes: 0,
            gradient_bytes: 0,
            optimizer_to_device_bytes: 0,
            optimizer_to_host_bytes: 0,
            host_bytes: offload.total(),
            without: self.without_offload.get().unwrap_or_default(),
        };
        if let Some(weights) = &offload.weights {
            let parameters = weights.parameters();
            let state = self
                .strategy
                .memory_plan(self.strategy.model, Bytes::ZERO)
                .device_breakdown(parameters, 0, 0, 0);
            totals.weight_bytes = weights.prefetched(&self.kernels);
            totals.gradient_bytes = self.buckets.iter().flatten().map(|b| b.bucket.bytes.0).sum();
            totals.optimizer_to_device_bytes = parameters * weights.in_per_parameter;
            totals.optimizer_to_host_bytes = parameters * weights.out_per_parameter;
            totals.to_host_bytes += totals.gradient_bytes + totals.optimizer_to_host_bytes;
            totals.to_device_bytes += totals.weight_bytes + totals.optimizer_to_device_bytes;
            totals.host_bytes += state.weights.0 + state.gradients.0 + state.optimizer.0;
        }
        totals
    }

    /// The global chunks stage `stage` holds.
    fn chunks_of(&self, stage: u32) -> impl Iterator<Item = usize> + use<> {
        chunks_of_stage(self.chunk_layers.len(), self.strategy.parallelism.pipeline, stage)
    }

    /// Bytes of `parameters` in the working-weight dtype (ZeRO gathers these).
    fn weight_bytes(&self, parameters: u64) -> Bytes {
        Bytes(parameters * self.strategy.precision.bytes().max(2))
    }

    /// Bytes of `parameters`' gradients (ZeRO scatters these).
    fn gradient_bytes(&self, parameters: u64) -> Bytes {
        Bytes(parameters * self.strategy.gradient_precision.bytes())
    }

    /// The layers stage `stage` holds, chunk after chunk.
    fn stage_layers(&self, stage: u32) -> impl Iterator<Item = usize> + '_ {
        self.chunks_of(stage).flat_map(|k| self.chunk_layers[k].clone())
    }

    /// Layer ranges of `chunks` pipeline chunks: whole units ([`Model::pipeline_units`]:
    /// numbered blocks, or layers of a plain CNN), balanced by compute.
    fn partition(model: &Model, kernels: &[[Kernel; 3]], chunks: usize) -> Vec<Range<usize>> {
        let layers = model.layers.len();
        if chunks <= 1 {
            return std::iter::once(0..layers).collect();
        }
        let units = model.pipeline_units();
        let cost = |range: &Range<usize>| -> f64 {
            range
                .clone()
                .map(|index| kernels[index].iter().flatten().map(|(d, _)| d.as_secs_f64()).sum::<f64>())
                .sum()
        };
        let costs: Vec<f64> = units.iter().map(cost).collect();
        pipeline::partition(&costs, chunks)
            .into_iter()
            .map(|group| units[group.start].start..units[group.end - 1].end)
            .collect()
    }

    fn labels(&self, graph: &mut GraphBuilder) -> Labels {
        let layers = &self.strategy.model.layers;
        let passes: Vec<[LabelId; 3]> = layers
            .iter()
            .map(|l| {
                ["forward", "backward-data", "backward-weight"]
                    .map(|pass| graph.label(&format!("{} {pass}", l.name)))
            })
            .collect();
        let optimizer = graph.label("optimizer step");
        let recompute = layers
            .iter()
            .enumerate()
            .map(|(index, l)| {
                let recomputed = self.recompute_before.iter().flatten().any(|range| range.contains(&index));
                if recomputed { graph.label(&format!("{} recompute", l.name)) } else { passes[index][0] }
            })
            .collect();
        Labels {
            passes,
            recompute,
            optimizer,
            send_forward: graph.label("pipeline send activations"),
            send_backward: graph.label("pipeline send gradients"),
            ring: graph.label("cp ring send key/value"),
            dispatch: graph.label("host: launch kernel"),
            gather: graph.label("zero-3 allgather parameters"),
            scatter: graph.label("zero-3 reduce-scatter gradients"),
            halo: [graph.label("spatial halo send"), graph.label("spatial halo gradient send")],
            load: graph.label("input: load batch"),
            take: graph.label("input: take batch"),
            pack: graph.label("input: serialise batch"),
            unpack: graph.label("input: unpack batch"),
            fetch: graph.label("input: fetch next batch"),
        }
    }

    /// FLOPs of one rank of `stage` per iteration (kernels of every micro-batch and the
    /// optimizer), and FLOPs of its recomputation.
    fn stage_flops(&self, stage: u32) -> (f64, f64) {
        let mut flops = 0.0;
        let mut recompute = 0.0;
        for index in self.stage_layers(stage) {
            flops += self.kernels[index].iter().filter_map(|k| k.map(|(_, f)| f)).sum::<f64>();
            if let Some(again) = &self.recompute_before[index] {
                recompute += again.clone().filter_map(|i| self.kernels[i][0].map(|(_, f)| f)).sum::<f64>();
            }
        }
        let m = f64::from(self.micro_batches);
        flops = flops * m + self.optimizer[stage as usize].1;
        (flops, recompute * m)
    }

    /// Means over stages (every stage has as many ranks) of [`Plan::stage_flops`].
    fn mean_flops_per_rank(&self) -> (f64, f64) {
        let p = self.strategy.parallelism.pipeline;
        let (flops, recompute) = (0..p)
            .map(|stage| self.stage_flops(stage))
            .fold((0.0, 0.0), |(f, r), (stage_f, stage_r)| (f + stage_f, r + stage_r));
        (flops / f64::from(p), recompute / f64::from(p))
    }

    /// Memory and layers of every stage.
    fn stages(&self) -> Result<Vec<StageSummary>, StrategyError> {
        let strategy = self.strategy;
        let p = &strategy.parallelism;
        let model = strategy.model;
        let sync_ranks = p.gradient_sync_ranks();
        let blocks = model.blocks();
        // Under the CNN strategies the memory model sees the layers as one rank holds them.
        let model = self.local_model.as_ref().unwrap_or(model);
        let mut stages = Vec::with_capacity(p.pipeline as usize);
        for stage in 0..p.pipeline {
            let chunk_indexes: Vec<usize> = self.chunks_of(stage).collect();
            let ranges: Vec<Range<usize>> =
                chunk_indexes.iter().map(|&k| self.chunk_layers[k].clone()).collect();
            let buffers = if sync_ranks > 1 && p.zero == 0 {
                Bytes(chunk_indexes.iter().flat_map(|&k| &self.buckets[k]).map(|b| b.bucket.bytes.0).sum())
            } else {
                Bytes::ZERO
            };
            // Activations of one micro-batch of each chunk.
            let mut per_chunk = Vec::with_capacity(ranges.len());
            let mut working_set = 0u64;
            for range in &ranges {
                let activations = if ranges.len() == 1 && range.start == 0 && range.end == model.layers.len()
                {
                    strategy.memory_plan(model, buffers).activations()
                } else {
                    strategy.memory_plan(model, buffers).activations_of(range.clone())
                };
                let context = u64::from(p.context);
                working_set = working_set.max(activations.working_set / context);
                per_chunk.push((activations.total() - activations.working_set) / context);
            }
            let actions = &self.actions[stage as usize];
            let peak = pipeline::peak_in_flight(actions, &per_chunk) + working_set;
            let per_micro: u64 = per_chunk.iter().sum();
            let parameters = self.stage_parameters[stage as usize];
            let largest_pair = self
                .stage_layers(stage)
                .map(|i| {
                    let layer = &self.local[i].layer;
                    layer.input.elements().saturating_add(layer.output.elements())
                })
                .max()
                .unwrap_or(0);
            // What ZeRO-3 holds gathered at once: the unit being computed and the one
            // prefetched (FSDP frees each after use); otherwise the largest layer.
            let deepspeed: Vec<&super::deepspeed_zero3::Trace> =
                chunk_indexes.iter().filter_map(|&k| self.deepspeed[k].as_ref()).collect();
            let largest_layer = if !deepspeed.is_empty() {
                0 // counted below
            } else if p.zero >= 3 {
                let mut units: Vec<u64> =
                    chunk_indexes.iter().flat_map(|&k| &self.units[k]).map(|unit| unit.parameters).collect();
                units.sort_unstable_by(|a, b| b.cmp(a));
                units.iter().take(2).sum()
            } else {
                self.stage_layers(stage).map(|i| self.local[i].layer.cost.params).max().unwrap_or(0)
            };
            let plan = strategy.memory_plan(model, buffers);
            // Out-of-core: the device holds only the window of activations in transit.
            let held = match &self.offload {
                Some(offload) => {
                    self.without_offload.set(Some(plan.device_breakdown(
                        parameters,
                        peak,
                        largest_pair,
                        largest_layer,
                    )));
                    offload.window.min(peak)
                }
                None => peak,
            };
            let mut memory: MemoryBreakdown =
                plan.device_breakdown(parameters, held, largest_pair, largest_layer);
            if !deepspeed.is_empty() {
                // DeepSpeed's ZeRO-3: the most parameters its coordinator holds gathered at once
                // (bounded by stage3_max_live_parameters and the reuse distance), the fp16
                // gradient buckets ([`super::deepspeed_zero3::gradient_buffer_elements`]), and
                // the parameters too small to partition, whole on every rank.
                let live = deepspeed.iter().map(|trace| trace.peak_live).max().unwrap_or(0);
                let largest_gradient =
                    self.stage_layers(stage).map(|i| self.local[i].layer.cost.params).max().unwrap_or(0);
                let gradients = super::deepspeed_zero3::gradient_buffer_elements(largest_gradient);
                memory.temporary = Bytes(memory.temporary.0 + self.weight_bytes(live + gradients).0);
                let persistent: u64 = self.stage_layers(stage).map(|i| self.persistent[i]).sum();
                memory.weights = Bytes(memory.weights.0 + self.weight_bytes(persistent).0);
            }
            if let Some(weights) = self.offload.as_ref().and_then(|offload| offload.weights.as_ref()) {
                // Out-of-core weights: the device holds the weights of `WEIGHT_BUFFERS` layers,
                // the gradients of two (computed, then copied into their bucket), two gradient
                // buckets and the optimizer's two chunks in transit (all counted at once,
                // although the optimizer's chunks are not alive during the backward).
                let one = plan.device_breakdown(1, 0, 0, 0);
                let layers = || self.stage_layers(stage).map(|i| self.local[i].layer.cost.params);
                memory.weights = Bytes(WeightOffload::largest(layers(), WEIGHT_BUFFERS) * one.weights.0);
                memory.gradients = Bytes(WeightOffload::largest(layers(), 2) * one.gradients.0);
                // A chunk's buffer: its gradients, fp32 weights and states, working weights.
                let chunks =
                    WeightOffload::largest(weights.chunks.iter().map(|(parameters, _)| *parameters), 2);
                memory.optimizer = Bytes(chunks * (one.weights.0 + one.gradients.0 + one.optimizer.0));
                memory.communication = Bytes(WeightOffload::largest(
                    chunk_indexes.iter().flat_map(|&k| &self.buckets[k]).map(|b| b.bucket.bytes.0),
                    2,
                ));
            }
            stages.push(StageSummary {
                stage,
                blocks: ranges
                    .iter()
                    .flat_map(|r| r.clone())
                    .filter_map(|i| blocks[i])
                    .collect::<std::collections::BTreeSet<_>>()
                    .len(),
                layers: ranges,
                parameters,
                memory,
                peak_micro_batches_in_flight: if per_micro == 0 {
                    0.0
                } else {
                    (peak - working_set) as f64 / per_micro as f64
                },
            });
        }
        Ok(stages)
    }
}

/// Emits one rank's ops of one iteration.
struct RankEmitter<'p, 's> {
    plan: &'p Plan<'s>,
    labels: &'p Labels,
    /// (synchronisation, parameter allgather) labels of each bucket of each chunk.
    bucket_labels: &'p [Vec<(LabelId, LabelId)>],
    shared: &'p mut Shared,
    rank: u32,
    buffer: Buffer,
    /// What the next compute op must wait for besides its stream.
    waiting: Vec<Dep>,
    /// The last compute op emitted.
    last_compute: Option<u32>,
    /// The ends of the last GPU work issued (a compute op, or a collective with its host
    /// staging): what a synchronous host waits for before its next launch.
    last_issued: Vec<Dep>,
    /// Schedule steps as (name, first compute op, last compute op), local indexes.
    spans: Vec<(String, u32, u32)>,
    /// What the first host launch of the iteration waits for (the previous iteration's end:
    /// the framework synchronises once per step).
    host_start: Option<Dep>,
    /// The iteration being emitted (0-based).
    iteration: u32,
    /// DASO, non-blocking: this rank's global allreduce to wait for at this iteration's step.
    daso_pending: Option<OpId>,
    /// DASO: this rank's last global allreduce op of this iteration (local index), if it sent.
    daso_sent: Option<u32>,
    /// Out-of-core: the copy to the host (local index) of each (micro-batch, layer), and the
    /// prefetch back.
    offloaded: HashMap<(u32, usize), u32>,
    prefetched: HashMap<(u32, usize), u32>,
    /// The loader's batches in flight: (batch, its load op), oldest first.
    loads: VecDeque<(u32, Dep)>,
    /// Out-of-core weights: the last kernels of the (at most [`WEIGHT_BUFFERS`]) layers whose
    /// weights are on the device, oldest first; a prefetch reuses the oldest one's buffer once
    /// it is done.
    weight_users: VecDeque<u32>,
    /// The previous iteration's last op: weights fetched before any buffer is reused wait for
    /// the optimizer step that wrote them.
    iteration_start: Option<OpId>,
    /// Out-of-core weights: each gradient bucket's copy to the host, in bucket order.
    bucket_copies: Vec<u32>,
    /// DeepSpeed's ZeRO-3: the last parameter allgather and the last gradient allreduce
    /// issued (local indexes): a `torch.cuda.synchronize()` waits for them.
    deepspeed_gather: Option<u32>,
    deepspeed_reduce: Option<u32>,
    /// DeepSpeed's ZeRO-3: the host's launches of the last gather's copy-out kernels.
    deepspeed_copies: Option<u32>,
}

/// PyTorch's `ProcessGroupNCCL::allgather` into a list of `world_size` tensors (the form
/// DeepSpeed v0.3.14's `_allgather_param` calls) gathers into one flat buffer, then copies each
/// of the `world_size` chunks out with its own `copy_` ("Copy the flattened output tensors to
/// the outputs", `torch/lib/c10d/ProcessGroupNCCL.cpp`): `world_size` kernels the host issues
/// at `dispatch-overhead` each. Their device time (one chunk each) is left out.
fn list_allgather_copies(ranks: u32, host_cost: SimDuration) -> SimDuration {
    SimDuration::from_ps(host_cost.as_ps().saturating_mul(u64::from(ranks)))
}

impl RankEmitter<'_, '_> {
    /// Emits the iteration; returns the local index of the rank's last op and of its last
    /// compute op of the schedule.
    fn iteration(&mut self, previous_end: Option<OpId>) -> Result<(u32, u32), StrategyError> {
        let plan = self.plan;
        let p = &plan.strategy.parallelism;
        let rank = RankId(self.rank);
        let coordinates = plan.layout.coordinates(rank);
        let stage = coordinates.pipeline;
        let chunks = p.chunks();
        let stage_rank = |target: u32| {
            let mut c = coordinates;
            c.pipeline = target;
            plan.layout.rank(c).0
        };
        self.host_start = previous_end.map(Dep::Global);
        let loader = if stage == 0 { self.take_batch(coordinates.tensor == 0) } else { false };
        // ZeRO 1/2: the next iteration's forward waits for the parameter allgather.
        let daso = matches!(p.sync, super::GradientSync::Daso { .. });
        if let Some(end) = previous_end
            && (p.zero >= 1 || daso)
        {
            self.waiting.push(Dep::Global(end));
        }
        if stage == 0
            && let Some(bytes) = plan.input_copy
        {
            self.copy_batch(bytes);
        }
        let mut last_sync: Vec<Option<u32>> = vec![None; chunks as usize];
        for action in &plan.actions[stage as usize] {
            let chunk = action.chunk * p.pipeline + stage;
            let micro = action.micro_batch;
            let mark = self.buffer.ops.len();
            if action.forward {
                if chunk > 0 {
                    let sender = stage_rank((chunk - 1) % p.pipeline);
                    self.waiting.push(Dep::Key(Key::Stage {
                        sender,
                        micro,
                        chunk: chunk - 1,
                        forward: true,
                    }));
                }
                self.forward_chunk(chunk as usize, micro)?;
                if chunk + 1 < chunks {
                    let to = stage_rank((chunk + 1) % p.pipeline);
                    let key = Key::Stage { sender: self.rank, micro, chunk, forward: true };
                    self.send(to, plan.boundary_bytes[chunk as usize], self.labels.send_forward, key);
                }
            } else {
                if chunk + 1 < chunks {
                    let sender = stage_rank((chunk + 1) % p.pipeline);
                    self.waiting.push(Dep::Key(Key::Stage {
                        sender,
                        micro,
                        chunk: chunk + 1,
                        forward: false,
                    }));
                }
                let last = micro + 1 == plan.micro_batches;
                if let Some(sync) = self.backward_chunk(chunk as usize, micro, last)? {
                    last_sync[chunk as usize] = Some(sync);
                }
                if chunk > 0 {
                    let to = stage_rank((chunk - 1) % p.pipeline);
                    let key = Key::Stage { sender: self.rank, micro, chunk, forward: false };
                    self.send(to, plan.boundary_bytes[chunk as usize - 1], self.labels.send_backward, key);
                }
            }
            // The step as one named slice around its kernels (a 1F1B schedule in Perfetto).
            let first = self.buffer.ops[mark..].iter().position(|op| op.stream == COMPUTE_STREAM);
            if let (Some(first), Some(last)) = (first, self.last_compute)
                && last as usize >= mark
            {
                let direction = if action.forward { "F" } else { "B" };
                let name = if p.virtual_stages > 1 {
                    format!("{direction}{micro} chunk {}", action.chunk)
                } else {
                    format!("{direction}{micro}")
                };
                self.spans.push((name, (mark + first) as u32, last));
            }
        }
        let pipeline_end = self.last_compute.unwrap_or(0);
        let mut deps: Vec<Dep> = last_sync.iter().flatten().map(|&op| Dep::Local(op)).collect();
        // The tied embedding's two copies (first and last stage) sum their gradients.
        if plan.tied_embedding > 0 && (stage == 0 || stage + 1 == p.pipeline) {
            let comm = Comm {
                group: GroupKind::Data,
                kind: CollectiveKind::AllReduce,
                bytes: plan.gradient_bytes(plan.tied_embedding),
                what: "tied embedding gradient allreduce",
            };
            let group = self.group(GroupClass::Embedding);
            let label = self.comm_label(comm.what);
            let mut embedding_deps = std::mem::take(&mut deps);
            embedding_deps.extend(self.last_compute.map(Dep::Local));
            deps.push(Dep::Local(self.collective(comm, DATA_STREAM, group, label, &embedding_deps)));
        }
        // Megatron-LM clips gradients by their global norm: an allreduce of one fp32 value over
        // the model-parallel group before the optimizer, so no stage steps before the whole
        // pipeline has flushed. Modelled over the pipeline stages only: the tensor ranks of a
        // stage are in step already, and 4 bytes over NVLink change nothing measurable (while
        // keeping the group off the servers lets folded runs skip the tensor ranks' shadows).
        if p.pipeline > 1 {
            let comm = Comm {
                group: GroupKind::Pipeline,
                kind: CollectiveKind::AllReduce,
                bytes: Bytes(4),
                what: "gradient norm allreduce",
            };
            let group = self.group(GroupClass::ModelParallel);
            let label = self.comm_label(comm.what);
            let mut norm_deps = std::mem::take(&mut deps);
            norm_deps.extend(self.last_compute.map(Dep::Local));
            deps.push(Dep::Local(self.collective(comm, PIPELINE_STREAM, group, label, &norm_deps)));
        }
        let (optimizer, mut end) = match plan.offload.as_ref().and_then(|o| o.weights.as_ref()) {
            Some(weights) => self.streamed_optimizer(weights, &deps),
            None => {
                let (duration, _) = plan.optimizer[stage as usize];
                let optimizer = self.buffer.push(
                    Op {
                        kind: OpKind::Compute { duration },
                        rank,
                        stream: COMPUTE_STREAM,
                        label: self.labels.optimizer,
                    },
                    &deps,
                );
                (optimizer, optimizer)
            }
        };
        self.last_compute = Some(optimizer);
        if let super::GradientSync::Daso { every, blocking, wait, node } = p.sync {
            end = self.daso_step(optimizer, every, blocking, wait, node);
        }
        if (1..3).contains(&p.zero) && p.data * p.context > 1 {
            for k in plan.chunks_of(stage) {
                for (b, bucket) in plan.buckets[k].iter().enumerate() {
                    let comm = Comm {
                        group: GroupKind::Data,
                        kind: CollectiveKind::AllGather,
                        bytes: bucket.parameter_bytes,
                        what: "",
                    };
                    let group = self.sync_group(bucket.expert);
                    let label = self.bucket_labels[k][b].1;
                    end = self.collective(comm, DATA_STREAM, group, label, &[Dep::Local(optimizer)]);
                }
            }
        }
        if loader {
            end = self.fetch_next_batch(end);
        }
        Ok((end, pipeline_end))
    }

    /// Out-of-core weights: the optimizer step streamed through the GPU, chunk by chunk, once
    /// every gradient is in host memory (`deps`): each chunk's gradients, fp32 weights and
    /// states are prefetched, updated by one optimizer kernel and written back, the copies of
    /// one chunk overlapping the kernels and copies of its neighbours; a chunk's prefetch
    /// reuses the buffer of the chunk two before it once that one is written back. Returns
    /// the last kernel and the last copy back.
    fn streamed_optimizer(&mut self, weights: &WeightOffload, deps: &[Dep]) -> (u32, u32) {
        let mut kernel = None;
        let mut written: Vec<u32> = Vec::with_capacity(weights.chunks.len());
        for (c, &(parameters, duration)) in weights.chunks.iter().enumerate() {
            let mut fetch_deps = deps.to_vec();
            fetch_deps.extend(c.checked_sub(2).map(|older| Dep::Local(written[older])));
            let fetch = self.memcpy(
                MemcpyDirection::HostToDevice,
                Bytes(parameters * weights.in_per_parameter),
                &fetch_deps,
                "optimizer: prefetch gradients and state",
            );
            // Like the single optimizer kernel, launched with the step (no host op per chunk).
            let step = self.buffer.push(
                Op {
                    kind: OpKind::Compute { duration },
                    rank: RankId(self.rank),
                    stream: COMPUTE_STREAM,
                    label: self.labels.optimizer,
                },
                &[Dep::Local(fetch)],
            );
            kernel = Some(step);
            written.push(self.memcpy(
                MemcpyDirection::DeviceToHost,
                Bytes(parameters * weights.out_per_parameter),
                &[Dep::Local(step)],
                "optimizer: write back weights and state",
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
                    },
                    deps,
                );
                (step, step)
            }
        }
    }

    /// The input pipeline at the start of an iteration on a rank of the first stage: the
    /// batch is taken from the loader (waiting for it if it is not ready), broadcast to the
    /// group by a per-group loader, and the loader starts on the batch `prefetch` ahead; the
    /// first kernel waits for the batch. `group_root`: the rank is its model-parallel group's
    /// first (the per-group loader). Returns whether the rank runs a loader.
    fn take_batch(&mut self, group_root: bool) -> bool {
        let Some(input) = &self.plan.input else { return false };
        let batch = self.iteration;
        let loader = group_root || !input.broadcast;
        let previous: Vec<Dep> = self.host_start.into_iter().collect();
        let comm = Comm {
            group: GroupKind::Tensor,
            kind: CollectiveKind::Broadcast { root: 0 },
            bytes: input.bytes,
            what: "input: broadcast batch",
        };
        if !loader {
            // A receiver: the broadcast, then unpacking the batch on its host.
            let broadcast = self.host_collective(comm, &previous);
            let unpack = self.host_op(INPUT_STREAM, input.pack, self.labels.unpack, &[Dep::Local(broadcast)]);
            self.waiting.push(Dep::Local(unpack));
            return false;
        }
        // The batch's load, if it was not prefetched before the first iteration.
        let mut deps = previous;
        if self.loads.front().is_some_and(|(b, _)| *b == batch)
            && let Some((_, load)) = self.loads.pop_front()
        {
            deps.push(load);
        }
        // What the next load starts after, and what the first kernel waits for.
        let (taken, ready) = if input.broadcast {
            // Serialising holds the loader's interpreter: on the loader's stream, and the next
            // load starts after it.
            let pack = self.host_op(LOADER_STREAM, input.pack, self.labels.pack, &deps);
            (pack, self.host_collective(comm, &[Dep::Local(pack)]))
        } else {
            let take = self.host_op(INPUT_STREAM, SimDuration::ZERO, self.labels.take, &deps);
            (take, take)
        };
        self.waiting.push(Dep::Local(ready));
        // Batches up to the one after the last iteration's: the last iteration ends when the
        // loop could fetch it.
        let ahead = batch + input.prefetch;
        if ahead <= self.plan.strategy.iterations {
            let load = self.host_op(LOADER_STREAM, input.load, self.labels.load, &[Dep::Local(taken)]);
            self.loads.push_back((ahead, Dep::Local(load)));
        }
        true
    }

    /// The end of a loader rank's iteration: the training loop's fetch of the next batch,
    /// which waits for the loader if it is behind. Returns the op that ends the iteration.
    fn fetch_next_batch(&mut self, end: u32) -> u32 {
        let next = self.iteration + 1;
        let Some(&(_, load)) = self.loads.iter().find(|(b, _)| *b == next) else { return end };
        self.host_op(INPUT_STREAM, SimDuration::ZERO, self.labels.fetch, &[Dep::Local(end), load])
    }

    /// The copy of the iteration's batch from host memory to the device on the compute stream
    /// (Chainer's converter: `cudaMemcpyAsync` on the kernels' stream), after what the first
    /// kernel would wait for; the first kernel waits for it instead.
    fn copy_batch(&mut self, bytes: Bytes) {
        let label = self.comm_label("input: copy batch to device");
        let launch = self.launch();
        let mut deps = std::mem::take(&mut self.waiting);
        deps.extend(launch);
        let op = self.buffer.push(
            Op {
                kind: OpKind::Memcpy { direction: MemcpyDirection::HostToDevice, bytes },
                rank: RankId(self.rank),
                stream: COMPUTE_STREAM,
                label,
            },
            &deps,
        );
        deps.clear();
        deps.push(Dep::Local(op));
        self.waiting = deps;
    }

    /// A host-side op of the input pipeline on `stream`; returns its local index.
    fn host_op(&mut self, stream: StreamId, duration: SimDuration, label: LabelId, deps: &[Dep]) -> u32 {
        self.buffer
            .push(Op { kind: OpKind::Compute { duration }, rank: RankId(self.rank), stream, label }, deps)
    }

    /// The broadcast of the batch over the rank's model-parallel group, sent by the host (no
    /// kernel launch): ChainerMN's `bcast_obj` over MPI.
    fn host_collective(&mut self, comm: Comm, deps: &[Dep]) -> u32 {
        let group = self.group(GroupClass::Tensor);
        let label = self.comm_label(comm.what);
        let id = self.collective_instance(comm, group);
        self.buffer.push(
            Op { kind: OpKind::Collective(id), rank: RankId(self.rank), stream: INPUT_STREAM, label },
            deps,
        )
    }

    fn forward_chunk(&mut self, chunk: usize, micro: u32) -> Result<(), StrategyError> {
        let plan = self.plan;
        if let Some(trace) = &plan.deepspeed[chunk] {
            self.deepspeed_events(micro, &trace.events[..trace.forward_events])?;
            return Ok(());
        }
        if plan.strategy.parallelism.zero < 3 {
            for index in plan.chunk_layers[chunk].clone() {
                self.forward_layer(index, micro, false)?;
            }
            return Ok(());
        }
        // ZeRO-3 / FSDP: gather each unit's parameters before its forward, the next unit's
        // as soon as this one starts (one unit of prefetch), and free them after.
        let units = &plan.units[chunk];
        let mut gathered = self.gather(chunk, 0, &[]);
        for (u, unit) in units.iter().enumerate() {
            self.waiting.push(Dep::Local(gathered));
            let first = self.buffer.ops.len();
            for index in unit.layers.clone() {
                self.forward_layer(index, micro, false)?;
            }
            if u + 1 < units.len() {
                let start: Vec<Dep> =
                    (first < self.buffer.ops.len()).then_some(Dep::Local(first as u32)).into_iter().collect();
                gathered = self.gather(chunk, u + 1, &start);
            }
        }
        Ok(())
    }

    /// DeepSpeed's ZeRO-3: `events` of a chunk's trace ([`super::deepspeed_zero3::trace`]) in
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
    fn deepspeed_events(
        &mut self,
        micro: u32,
        events: &[super::deepspeed_zero3::Event],
    ) -> Result<Option<u32>, StrategyError> {
        use super::deepspeed_zero3::EventPass;
        let mut last_sync = None;
        for event in events {
            let device = |emitter: &Self| -> Vec<Dep> {
                [
                    emitter.last_compute,
                    emitter.deepspeed_gather,
                    emitter.deepspeed_copies,
                    emitter.deepspeed_reduce,
                ]
                .into_iter()
                .flatten()
                .map(Dep::Local)
                .collect()
            };
            if event.fetch > 0 {
                let deps = device(self);
                self.host_synchronize(&deps);
                self.deepspeed_gather = Some(self.gather_bytes(event.fetch, &deps));
            }
            if event.sync {
                let synchronised = [self.deepspeed_gather, self.deepspeed_copies, self.deepspeed_reduce];
                self.waiting.extend(synchronised.into_iter().flatten().map(Dep::Local));
                let deps = device(self);
                self.host_synchronize(&deps);
            }
            for (k, &elements) in event.prefetch.iter().enumerate() {
                let deps = device(self);
                self.host_synchronize(&deps);
                let op = self.gather_bytes(elements, &deps);
                if k + 1 < event.prefetch.len() {
                    self.waiting.push(Dep::Local(op));
                    self.waiting.extend(self.deepspeed_copies.map(Dep::Local));
                }
                self.deepspeed_gather = Some(op);
            }
            match event.pass {
                EventPass::Forward => self.forward_layer(event.layer, micro, false)?,
                EventPass::Recompute => self.forward_layer(event.layer, micro, true)?,
                EventPass::Backward => {
                    let ready = self.backward_kernels(event.layer, micro)?;
                    if event.reduce > 0 {
                        let deps: Vec<Dep> =
                            ready.or(self.last_compute).map(Dep::Local).into_iter().collect();
                        let previous = self.deepspeed_reduce;
                        let waited: Vec<Dep> = previous.map(Dep::Local).into_iter().collect();
                        self.host_synchronize(&waited);
                        let op = self.deepspeed_reduce(event.reduce, &deps);
                        self.waiting.extend(previous.map(Dep::Local));
                        last_sync = Some(op);
                    }
                }
            }
        }
        Ok(last_sync)
    }

    /// DeepSpeed's ZeRO-3: the allgather of `elements` parameters (working-weight dtype), on
    /// the gather stream after `deps`, then the host's launches of its copy-out kernels
    /// ([`list_allgather_copies`], kept in `deepspeed_copies`); returns the gather.
    fn gather_bytes(&mut self, elements: u64, deps: &[Dep]) -> u32 {
        let bytes = self.plan.weight_bytes(elements);
        let comm = Comm { group: GroupKind::Data, kind: CollectiveKind::AllGather, bytes, what: "" };
        let group = self.group(GroupClass::Data);
        let label = self.labels.gather;
        let gather = self.collective(comm, GATHER_STREAM, group, label, deps);
        if self.plan.host_cost > SimDuration::ZERO {
            // Issued right after the gather's launch, without waiting for it.
            let ranks = self.plan.strategy.parallelism.gradient_sync_ranks();
            let copies = list_allgather_copies(ranks, self.plan.host_cost);
            let label = self.comm_label("host: launch allgather copy-out kernels (deepspeed)");
            self.deepspeed_copies = Some(self.host_op(super::HOST_STREAM, copies, label, &[]));
        }
        gather
    }

    /// DeepSpeed's `torch.cuda.synchronize()` / `stream.synchronize()`: the host issues nothing
    /// more until `deps` are done (nothing to do when the host is not modelled).
    fn host_synchronize(&mut self, deps: &[Dep]) {
        if self.plan.host_cost == SimDuration::ZERO || deps.is_empty() {
            return;
        }
        let label = self.comm_label("host: torch.cuda.synchronize (deepspeed)");
        self.host_op(super::HOST_STREAM, SimDuration::ZERO, label, deps);
    }

    /// DeepSpeed's ZeRO-3: the allreduce of a bucket of `elements` fp16 gradients (the
    /// parameters' dtype: `allreduce_bucket` flattens `param.grad`), on the gather stream.
    fn deepspeed_reduce(&mut self, elements: u64, deps: &[Dep]) -> u32 {
        let bytes = self.plan.weight_bytes(elements);
        let comm = Comm { group: GroupKind::Data, kind: CollectiveKind::AllReduce, bytes, what: "" };
        let group = self.group(GroupClass::Data);
        let label = self.comm_label("zero-3 allreduce gradient bucket (deepspeed)");
        let op = self.collective(comm, GATHER_STREAM, group, label, deps);
        self.deepspeed_reduce = Some(op);
        op
    }

    /// The allgather of unit `unit`'s parameters (ZeRO-3), on the gather stream.
    fn gather(&mut self, chunk: usize, unit: usize, deps: &[Dep]) -> u32 {
        let bytes = self.plan.weight_bytes(self.plan.units[chunk][unit].parameters);
        let comm = Comm { group: GroupKind::Data, kind: CollectiveKind::AllGather, bytes, what: "" };
        let group = self.group(GroupClass::Data);
        let label = self.labels.gather;
        self.collective(comm, GATHER_STREAM, group, label, deps)
    }

    /// One layer's forward (or its recomputation).
    fn forward_layer(&mut self, index: usize, micro: u32, recompute: bool) -> Result<(), StrategyError> {
        let plan = self.plan;
        let local = &plan.local[index];
        for comm in &local.before_forward {
            self.comm(*comm);
        }
        if let Some(halo) = &local.halo
            && halo.forward
        {
            let received = self.halo(index, micro, halo, if recompute { 1 } else { 0 });
            self.waiting.extend(received);
        }
        if let Some(offload) = &plan.offload
            && let Some(m) = offload.forward_wait[index]
            && let Some(&copy) = self.offloaded.get(&(micro, m))
        {
            self.waiting.push(Dep::Local(copy));
        }
        let fetch_weights = !recompute
            && plan.offload.as_ref().and_then(|o| o.weights.as_ref()).is_some_and(|w| w.weights[index] > 0);
        if fetch_weights {
            let fetch = self.fetch_weights(index);
            self.waiting.push(Dep::Local(fetch));
        }
        if let Some((duration, _)) = plan.kernels[index][0] {
            let label = if recompute { self.labels.recompute[index] } else { self.labels.passes[index][0] };
            match local.context_ring {
                Some(bytes) => {
                    self.ring(index, micro, duration, bytes, label, if recompute { 1 } else { 0 });
                }
                None => {
                    self.compute(duration, label);
                    self.slow_last_compute(index, 0);
                }
            }
        }
        if fetch_weights {
            self.weight_users.extend(self.last_compute);
        }
        for comm in &local.after_forward {
            self.comm(*comm);
        }
        if let Some(offload) = &plan.offload
            && offload.bytes[index] > 0
            && !recompute
        {
            let bytes = Bytes(offload.bytes[index]);
            let deps: Vec<Dep> = self.last_compute.map(Dep::Local).into_iter().collect();
            let copy =
                self.memcpy(MemcpyDirection::DeviceToHost, bytes, &deps, "offload activations to host");
            self.offloaded.insert((micro, index), copy);
        }
        Ok(())
    }

    /// Out-of-core weights: the prefetch of layer `index`'s weights; returns the op. It reuses
    /// the buffer of the oldest layer on the device once that layer's kernels are done (or,
    /// before any reuse, waits for the previous iteration's optimizer step).
    fn fetch_weights(&mut self, index: usize) -> u32 {
        let bytes = Bytes(
            self.plan.offload.as_ref().and_then(|o| o.weights.as_ref()).map_or(0, |w| w.weights[index]),
        );
        let freed =
            if self.weight_users.len() >= WEIGHT_BUFFERS { self.weight_users.pop_front() } else { None };
        let deps: Vec<Dep> = match freed {
            Some(op) => vec![Dep::Local(op)],
            None => self.iteration_start.map(Dep::Global).into_iter().collect(),
        };
        self.memcpy(MemcpyDirection::HostToDevice, bytes, &deps, "prefetch weights to device")
    }

    /// A copy between the device and host memory, on the offload (to host) or prefetch (to
    /// device) stream, labelled `what`.
    fn memcpy(&mut self, direction: MemcpyDirection, bytes: Bytes, deps: &[Dep], what: &'static str) -> u32 {
        let stream = match direction {
            MemcpyDirection::DeviceToHost => super::OFFLOAD_STREAM,
            MemcpyDirection::HostToDevice => super::PREFETCH_STREAM,
        };
        let label = self.comm_label(what);
        let mut deps = deps.to_vec();
        deps.extend(self.launch());
        self.buffer.push(
            Op { kind: OpKind::Memcpy { direction, bytes }, rank: RankId(self.rank), stream, label },
            &deps,
        )
    }

    /// Out-of-core: the prefetches of `layers` back to the device (each after its copy out).
    fn prefetch(&mut self, micro: u32, layers: &[usize]) {
        let Some(offload) = &self.plan.offload else { return };
        for &l in layers {
            let bytes = Bytes(offload.bytes[l]);
            let mut deps: Vec<Dep> =
                self.offloaded.get(&(micro, l)).map(|&op| Dep::Local(op)).into_iter().collect();
            deps.extend(self.last_compute.map(Dep::Local));
            let op =
                self.memcpy(MemcpyDirection::HostToDevice, bytes, &deps, "prefetch activations to device");
            self.prefetched.insert((micro, l), op);
        }
    }

    /// Backward of one chunk; returns the last gradient synchronisation op, if any.
    fn backward_chunk(&mut self, chunk: usize, micro: u32, last: bool) -> Result<Option<u32>, StrategyError> {
        let plan = self.plan;
        if let Some(trace) = &plan.deepspeed[chunk] {
            let mut last_sync = self.deepspeed_events(micro, &trace.events[trace.forward_events..])?;
            if trace.final_reduce > 0 {
                // `independent_gradient_partition_epilogue`: the last bucket, then the host
                // waits for the reduction stream.
                let deps: Vec<Dep> = self.last_compute.map(Dep::Local).into_iter().collect();
                let op = self.deepspeed_reduce(trace.final_reduce, &deps);
                self.waiting.push(Dep::Local(op));
                self.host_synchronize(&[Dep::Local(op)]);
                last_sync = Some(op);
            }
            return Ok(last_sync);
        }
        if plan.strategy.parallelism.zero >= 3 {
            return self.backward_chunk_sharded(chunk, micro);
        }
        let mut last_sync = None;
        let layers = plan.chunk_layers[chunk].clone();
        let weights = plan.offload.as_ref().and_then(|o| o.weights.as_ref());
        // Out-of-core weights: the next layer's (in backward order) whose backward reads them,
        // and whether `index` is one.
        let fetches = |index: usize| weights.is_some_and(|w| w.fetched_for_backward(index, &plan.kernels));
        let next_fetch = |below: usize| (layers.start..below).rev().find(|&l| fetches(l));
        // Weights are fetched `WEIGHT_BUFFERS - 1` layers ahead, each before the activation
        // prefetches that the previous layer's backward triggers, so that a weight fetch does
        // not queue behind activations the window fetches far ahead (one copy stream per
        // direction, in issue order).
        let mut fetched: VecDeque<(usize, u32)> = VecDeque::new();
        let mut below = layers.end;
        while fetched.len() + 1 < WEIGHT_BUFFERS
            && let Some(next) = next_fetch(below)
        {
            fetched.push_back((next, self.fetch_weights(next)));
            below = next;
        }
        if let Some(offload) = &plan.offload {
            self.prefetch(micro, &offload.untriggered);
        }
        for index in layers.clone().rev() {
            if let Some(&prefetch) = self.prefetched.get(&(micro, index)) {
                self.waiting.push(Dep::Local(prefetch));
            }
            if let Some(&(_, fetch)) = fetched.front().filter(|(layer, _)| *layer == index) {
                fetched.pop_front();
                self.waiting.push(Dep::Local(fetch));
            }
            // At most two gradient buckets on the device: the one this layer opens waits for
            // the copy of the one two before it.
            if let Some(&copy) =
                weights.and_then(|w| w.bucket_wait[index]).and_then(|b| self.bucket_copies.get(b))
            {
                self.waiting.push(Dep::Local(copy));
            }
            let ready = self.backward_layer(index, micro)?;
            if fetches(index) {
                self.weight_users.extend(self.last_compute);
                let below = fetched.back().map_or(index, |(layer, _)| *layer);
                if let Some(next) = next_fetch(below) {
                    fetched.push_back((next, self.fetch_weights(next)));
                }
            }
            if let Some(offload) = &plan.offload {
                self.prefetch(micro, &offload.prefetch_after[index]);
            }
            if last && let (Some(b), Some(ready)) = (plan.bucket_closed_by[index], ready) {
                let bucket = &plan.buckets[chunk][b];
                let label = self.bucket_labels[chunk][b].0;
                let kind = if plan.strategy.parallelism.zero >= 1 {
                    CollectiveKind::ReduceScatter
                } else {
                    CollectiveKind::AllReduce
                };
                let comm = Comm { group: GroupKind::Data, kind, bytes: bucket.bucket.bytes, what: "" };
                if plan.strategy.parallelism.spatial > 1 {
                    last_sync = Some(self.spatial_sync(comm, label, ready));
                    continue;
                }
                let group = match plan.strategy.parallelism.sync {
                    super::GradientSync::Daso { node, .. } => self.daso_group(false, node, self.rank % node),
                    super::GradientSync::AllReduce => self.sync_group(bucket.expert),
                };
                let sync = self.collective(comm, DATA_STREAM, group, label, &[Dep::Local(ready)]);
                last_sync = Some(sync);
                if weights.is_some() {
                    // The synchronised gradients to host memory, where the optimizer reads them.
                    let copy = self.memcpy(
                        MemcpyDirection::DeviceToHost,
                        bucket.bucket.bytes,
                        &[Dep::Local(sync)],
                        "offload gradients to host",
                    );
                    self.bucket_copies.push(copy);
                    last_sync = Some(copy);
                }
            }
        }
        Ok(last_sync)
    }

    /// ZeRO-3 / FSDP backward: per unit in reverse, gather its parameters (prefetched one unit
    /// ahead), run its backward, reduce-scatter its gradients; every micro-batch.
    fn backward_chunk_sharded(&mut self, chunk: usize, micro: u32) -> Result<Option<u32>, StrategyError> {
        let plan = self.plan;
        let units = &plan.units[chunk];
        let mut last_sync = None;
        let mut gathered = self.gather(chunk, units.len() - 1, &[]);
        for u in (0..units.len()).rev() {
            self.waiting.push(Dep::Local(gathered));
            let first = self.buffer.ops.len();
            let mut ready = None;
            for index in units[u].layers.clone().rev() {
                ready = self.backward_layer(index, micro)?.or(ready);
            }
            if u > 0 {
                let start: Vec<Dep> =
                    (first < self.buffer.ops.len()).then_some(Dep::Local(first as u32)).into_iter().collect();
                gathered = self.gather(chunk, u - 1, &start);
            }
            if let Some(ready) = ready
                && units[u].parameters > 0
            {
                let comm = Comm {
                    group: GroupKind::Data,
                    kind: CollectiveKind::ReduceScatter,
                    bytes: plan.gradient_bytes(units[u].parameters),
                    what: "",
                };
                let group = self.group(GroupClass::Data);
                let label = self.labels.scatter;
                last_sync = Some(self.collective(comm, DATA_STREAM, group, label, &[Dep::Local(ready)]));
            }
        }
        Ok(last_sync)
    }

    /// One layer's backward (with its recomputation and collectives); returns the op after
    /// which its weight gradient is ready, if it has a backward kernel.
    fn backward_layer(&mut self, index: usize, micro: u32) -> Result<Option<u32>, StrategyError> {
        if let Some(range) = &self.plan.recompute_before[index] {
            for again in range.clone() {
                self.forward_layer(again, micro, true)?;
            }
        }
        self.backward_kernels(index, micro)
    }

    /// One layer's backward without its recomputation: its collectives and kernels; returns
    /// the op after which its weight gradient is ready, if it has a backward kernel.
    fn backward_kernels(&mut self, index: usize, micro: u32) -> Result<Option<u32>, StrategyError> {
        let plan = self.plan;
        {
            let local = &plan.local[index];
            for comm in &local.before_backward {
                self.comm(*comm);
            }
            let [_, data, weight] = plan.kernels[index];
            let mut gradient_ready = None;
            if let Some((duration, _)) = data {
                let label = self.labels.passes[index][1];
                gradient_ready = Some(match local.context_ring {
                    Some(bytes) => self.ring(index, micro, duration, Bytes(bytes.0 * 2), label, 2),
                    None => {
                        let op = self.compute(duration, label);
                        self.slow_last_compute(index, 1);
                        op
                    }
                });
            }
            // Collectives on the input gradient run while backward-weight computes.
            let mut deferred = Vec::new();
            if let Some(halo) = &local.halo
                && halo.backward
                && data.is_some()
            {
                deferred.extend(self.halo(index, micro, halo, 2));
            }
            for comm in &local.after_backward_data {
                self.comm(*comm);
                deferred.append(&mut self.waiting);
            }
            if let Some((duration, _)) = weight {
                gradient_ready = Some(self.compute(duration, self.labels.passes[index][2]));
                self.slow_last_compute(index, 2);
            }
            if micro > 0
                && let Some(duration) = plan.accumulate[index]
            {
                gradient_ready = Some(self.compute(duration, self.labels.passes[index][2]));
            }
            self.waiting.extend(deferred);
            Ok(gradient_ready)
        }
    }

    /// A compute op after everything waited for; returns its local index.
    fn compute(&mut self, duration: SimDuration, label: LabelId) -> u32 {
        // The launch goes first in the buffer; the waiting list's buffer is kept for reuse.
        let launch = self.launch();
        let mut deps = std::mem::take(&mut self.waiting);
        deps.extend(launch);
        let op = self.buffer.push(
            Op { kind: OpKind::Compute { duration }, rank: RankId(self.rank), stream: COMPUTE_STREAM, label },
            &deps,
        );
        deps.clear();
        self.waiting = deps;
        self.last_compute = Some(op);
        self.last_issued.clear();
        self.last_issued.push(Dep::Local(op));
        op
    }

    /// Marks the compute op just added, pass `pass` of layer `index`, as slowed beside
    /// communication when the plan has its time there ([`Plan::beside`]).
    fn slow_last_compute(&mut self, index: usize, pass: usize) {
        if let (Some(op), Some(beside)) =
            (self.last_compute, self.plan.beside.get(index).and_then(|passes| passes[pass]))
        {
            self.buffer.beside.push((op, beside));
        }
    }

    /// The host thread's launch of the next kernel (compute, collective or send), which the
    /// kernel waits for; `None` under CUDA graphs. The host runs ahead of the GPU as far as it
    /// can (a synchronous host, `compute.host-synchronous`, only once the GPU work it issued
    /// last has finished: [`workloads::dispatch::issue_synchronous`]); its first launch of an
    /// iteration waits for the previous iteration's end.
    fn launch(&mut self) -> Option<Dep> {
        if self.plan.host_cost == SimDuration::ZERO {
            return None;
        }
        let mut anchor: Vec<Dep> = self.host_start.take().into_iter().collect();
        if self.plan.host_synchronous {
            anchor.extend_from_slice(&self.last_issued);
        }
        let launch = self.buffer.push(
            Op {
                kind: OpKind::Compute { duration: self.plan.host_cost },
                rank: RankId(self.rank),
                stream: super::HOST_STREAM,
                label: self.labels.dispatch,
            },
            &anchor,
        );
        Some(Dep::Local(launch))
    }

    /// A layer collective after the last compute op and anything waited for; the next compute
    /// op waits for it.
    fn comm(&mut self, comm: Comm) {
        let (stream, group) = match comm.group {
            GroupKind::Tensor => (TENSOR_STREAM, self.group(GroupClass::Tensor)),
            GroupKind::Expert => (EXPERT_STREAM, self.group(GroupClass::Expert)),
            GroupKind::Filter => (FILTER_STREAM, self.group(GroupClass::Tensor)),
            GroupKind::Channel => (CHANNEL_STREAM, self.group(GroupClass::Tensor)),
            GroupKind::Spatial => (SPATIAL_STREAM, self.group(GroupClass::Tensor)),
            _ => (DATA_STREAM, self.group(GroupClass::Data)),
        };
        let label = self.comm_label(comm.what);
        let mut deps = std::mem::take(&mut self.waiting);
        deps.extend(self.last_compute.map(Dep::Local));
        let op = self.collective(comm, stream, group, label, &deps);
        let mut ends = vec![Dep::Local(op)];
        if let Some(staging) = self.plan.strategy.parallelism.cnn_staging {
            let degree = u64::from(self.plan.strategy.parallelism.cnn_degree());
            let bytes = staging.collective_bytes(&comm, degree);
            if staging.pipelined(&comm) {
                // Copied fragment by fragment while earlier fragments travel: beside the
                // collective, on its own stream, from the same dependencies.
                if let Some(staged) = self.stage(staging, bytes, STAGING_STREAM, &deps) {
                    ends.push(Dep::Local(staged));
                }
            } else if let Some(staged) = self.stage(staging, bytes, stream, &[Dep::Local(op)]) {
                ends = vec![Dep::Local(staged)];
            }
        }
        deps.clear();
        deps.extend_from_slice(&ends);
        self.waiting = deps;
        self.last_issued = ends;
    }

    /// The host round trip of `bytes` staged by CUDA-aware MPI ([`cnn::HostStaging`]) on
    /// `stream` after `deps`: a blocking delay of `bytes` at the staging rate. `None` (no op)
    /// when nothing is staged.
    fn stage(
        &mut self,
        staging: cnn::HostStaging,
        bytes: Bytes,
        stream: StreamId,
        deps: &[Dep],
    ) -> Option<u32> {
        if bytes.0 == 0 {
            return None;
        }
        // The scenario requires at least 1 MB/s, so any layer's buffer takes far less than the
        // largest duration; saturate rather than fail on an absurd one.
        let duration = staging.rate.time_to_send(bytes).unwrap_or(SimDuration::from_ps(u64::MAX / 4));
        let label = self.comm_label(super::HOST_STAGING_LABEL);
        let op = Op { kind: OpKind::Compute { duration }, rank: RankId(self.rank), stream, label };
        Some(self.buffer.push(op, deps))
    }

    /// The label of a collective called `what`, interned once.
    fn comm_label(&mut self, what: &'static str) -> LabelId {
        match self.shared.comm_labels.get(what) {
            Some(&label) => label,
            None => {
                let label = self.shared.graph.label(what);
                self.shared.comm_labels.insert(what, label);
                label
            }
        }
    }

    /// This rank's part in the next collective of `group`.
    fn collective(
        &mut self,
        comm: Comm,
        stream: StreamId,
        group: GroupId,
        label: LabelId,
        deps: &[Dep],
    ) -> u32 {
        let id = self.collective_instance(comm, group);
        let launch = self.launch();
        let op = Op { kind: OpKind::Collective(id), rank: RankId(self.rank), stream, label };
        match launch {
            Some(launch) => self.buffer.push_with(op, deps, launch),
            None => self.buffer.push(op, deps),
        }
    }

    /// The rank's next collective of `group`: created by the first member to reach it, shared
    /// by the others (members issue a group's collectives in the same order).
    fn collective_instance(&mut self, comm: Comm, group: GroupId) -> sim_core::graph::CollectiveId {
        let data_algorithm = self.plan.strategy.parallelism.data_algorithm;
        // The data-parallel algorithm is an allreduce's; DASO's node broadcast picks its own.
        let cnn_group = matches!(comm.group, GroupKind::Filter | GroupKind::Channel | GroupKind::Spatial);
        let algorithm = if comm.group == GroupKind::Data && data_algorithm.supports(comm.kind) {
            data_algorithm
        } else if cnn_group
            && comm.kind == CollectiveKind::AllToAll
            && self.plan.strategy.parallelism.cnn_staging.is_some()
        {
            // Over MPI (`cnn-transport = "mpi"` / `"mpi-managed"`), Open MPI's tuned component
            // runs every `MPI_Alltoallv` pairwise: p - 1 rounds, in round k rank i sends to
            // i + k and receives from i - k (`ompi_coll_tuned_alltoallv_intra_dec_fixed`, v2.1.6,
            // `ompi/mca/coll/tuned/coll_tuned_decision_fixed.c`).
            CollectiveAlgorithm::Pairwise
        } else {
            CollectiveAlgorithm::Auto
        };
        let issued = self.shared.issued[self.rank as usize].entry(group).or_insert(0);
        let sequence = *issued as usize;
        *issued += 1;
        let instances = self.shared.instances.entry(group).or_default();
        if sequence == instances.len() {
            let id = self.shared.graph.add_collective(Collective {
                kind: comm.kind,
                group,
                bytes: comm.bytes,
                algorithm,
            });
            instances.push(id);
        }
        instances[sequence]
    }

    /// A pipeline send to `to` after the last compute op, registered under `key`.
    fn send(&mut self, to: u32, bytes: Bytes, label: LabelId, key: Key) {
        let mut deps: Vec<Dep> = self.last_compute.map(Dep::Local).into_iter().collect();
        deps.extend(self.launch());
        let op = self.buffer.push(
            Op {
                kind: OpKind::Transfer { dst: RankId(to), bytes },
                rank: RankId(self.rank),
                stream: PIPELINE_STREAM,
                label,
            },
            &deps,
        );
        self.shared.keys.insert(key, (self.rank, op));
    }

    /// Context-parallel attention: `context` compute steps of `duration / context`, the key/value
    /// chunk of each step passed on to the next context rank while the next step computes.
    /// Returns the last step's op.
    fn ring(
        &mut self,
        layer: usize,
        micro: u32,
        duration: SimDuration,
        bytes: Bytes,
        label: LabelId,
        pass: u8,
    ) -> u32 {
        let plan = self.plan;
        let rank = RankId(self.rank);
        let members = plan.layout.group(Axis::Context, rank);
        let c = members.len() as u32;
        let position = members.iter().position(|r| *r == rank).unwrap_or(0) as u32;
        let next = members[((position + 1) % c) as usize].0;
        let previous = members[((position + c - 1) % c) as usize].0;
        let step = SimDuration::from_ps(duration.as_ps() / u64::from(c));
        let producer: Vec<Dep> =
            self.waiting.iter().copied().chain(self.last_compute.map(Dep::Local)).collect();
        let mut op = self.compute(step, label);
        let received =
            |step: u32| Dep::Key(Key::Ring { sender: previous, layer: layer as u32, micro, step, pass });
        for j in 0..c - 1 {
            let mut deps = if j == 0 { producer.clone() } else { vec![received(j - 1)] };
            deps.extend(self.launch());
            let send = self.buffer.push(
                Op {
                    kind: OpKind::Transfer { dst: RankId(next), bytes },
                    rank,
                    stream: CONTEXT_STREAM,
                    label: self.labels.ring,
                },
                &deps,
            );
            self.shared.keys.insert(
                Key::Ring { sender: self.rank, layer: layer as u32, micro, step: j, pass },
                (self.rank, send),
            );
            self.waiting.push(received(j));
            op = self.compute(step, label);
        }
        op
    }

    /// The halo exchange of layer `layer` with this rank's grid neighbours, dimension after
    /// dimension (a dimension's sends wait for the previous dimension's halos, so corners travel
    /// with the later dimension): `pass` 0 or 1 sends the rows before the forward kernel, 2
    /// sends the halo's gradient back after the backward-data kernel (dimensions in reverse).
    /// Returns the receptions the next kernel waits for.
    fn halo(&mut self, layer: usize, micro: u32, halo: &cnn::Halo, pass: u8) -> Vec<Dep> {
        let plan = self.plan;
        let rank = RankId(self.rank);
        let grid = &plan.spatial_grid;
        let mut coordinates = plan.layout.coordinates(rank);
        let position = cnn::grid_coordinates(coordinates.tensor, grid);
        let neighbour = |axis: usize, up: bool| -> Option<u32> {
            let c = position[axis];
            let moved = if up { (c + 1 < grid[axis]).then_some(c + 1) } else { c.checked_sub(1) }?;
            let mut at = position.clone();
            at[axis] = moved;
            Some(cnn::grid_index(&at, grid))
        };
        let mut producer: Vec<Dep> = self.waiting.clone();
        producer.extend(self.last_compute.map(Dep::Local));
        let backward = pass == 2;
        let order: Vec<usize> =
            if backward { (0..halo.dims.len()).rev().collect() } else { (0..halo.dims.len()).collect() };
        let mut received = Vec::new();
        for d in order {
            let dim = halo.dims[d];
            let mut this_dim = Vec::new();
            // Bytes every rank sends up (to its upper neighbour) or down. Forward: the upper
            // neighbour's lower halo is `from_lower` of my rows. Backward: the gradient of the
            // rows I received goes back to their owner.
            let sent = |up: bool| if up != backward { dim.from_lower } else { dim.from_upper };
            for up in [true, false] {
                let bytes = sent(up);
                if bytes.0 == 0 {
                    continue;
                }
                if let Some(index) = neighbour(dim.grid_axis, up) {
                    coordinates.tensor = index;
                    let to = plan.layout.rank(coordinates).0;
                    let mut deps = producer.clone();
                    deps.extend(self.launch());
                    let send = self.buffer.push(
                        Op {
                            kind: OpKind::Transfer { dst: RankId(to), bytes },
                            rank,
                            stream: if up { SPATIAL_STREAM } else { HALO_STREAM },
                            label: self.labels.halo[usize::from(backward)],
                        },
                        &deps,
                    );
                    let key =
                        Key::Halo { sender: self.rank, layer: layer as u32, micro, dim: d as u8, up, pass };
                    self.shared.keys.insert(key, (self.rank, send));
                }
                // The neighbour on the other side sends the same way to me.
                if let Some(index) = neighbour(dim.grid_axis, !up) {
                    coordinates.tensor = index;
                    let sender = plan.layout.rank(coordinates).0;
                    this_dim.push(Dep::Key(Key::Halo {
                        sender,
                        layer: layer as u32,
                        micro,
                        dim: d as u8,
                        up,
                        pass,
                    }));
                }
            }
            if let Some(staging) = plan.strategy.parallelism.cnn_staging {
                // The rows received this dimension: the neighbour on the other side of each
                // direction sends what this rank would send that way.
                let bytes: u64 = [true, false]
                    .into_iter()
                    .filter(|&up| neighbour(dim.grid_axis, !up).is_some())
                    .map(|up| sent(up).0)
                    .sum();
                let stream = if backward { HALO_STREAM } else { SPATIAL_STREAM };
                if let Some(op) = self.stage(staging, staging.halo_bytes(Bytes(bytes)), stream, &this_dim) {
                    this_dim = vec![Dep::Local(op)];
                }
            }
            received.extend(this_dim.iter().copied());
            if !this_dim.is_empty() {
                producer = this_dim;
            }
        }
        received
    }

    /// The gradient allreduce of a bucket over spatial x data ranks, hierarchical as ParaDL's
    /// (local, then across groups): a reduce-scatter inside the spatial group, an allreduce of
    /// each rank's share across the groups, an allgather inside the group. Returns the last op.
    fn spatial_sync(&mut self, comm: Comm, label: LabelId, ready: u32) -> u32 {
        let p = u64::from(self.plan.strategy.parallelism.spatial);
        let local = self.group(GroupClass::Tensor);
        let scatter = Comm { kind: CollectiveKind::ReduceScatter, ..comm };
        let op = self.collective(scatter, DATA_STREAM, local, label, &[Dep::Local(ready)]);
        let mut last = op;
        if self.plan.strategy.parallelism.data > 1 {
            let across = self.group(GroupClass::Data);
            let share = Comm { bytes: Bytes(comm.bytes.0.div_ceil(p)), ..comm };
            last = self.collective(share, DATA_STREAM, across, label, &[Dep::Local(op)]);
        }
        let gather = Comm { kind: CollectiveKind::AllGather, ..comm };
        self.collective(gather, DATA_STREAM, local, label, &[Dep::Local(last)])
    }

    /// DASO's step after the local optimizer step (`heat.optim.DASO.step`): on every
    /// `every`-th iteration the GPUs of one local rank (rotating, DASO's `_send_mod`) all-reduce
    /// the parameters across the nodes in chunks of 10 M elements (`sending_chunk_size`), then
    /// (blocking) broadcast them inside their node; non-blocking, the broadcast comes `wait`
    /// iterations later, after the sender has waited for its allreduce. Returns the op the next
    /// iteration waits for.
    fn daso_step(&mut self, optimizer: u32, every: u32, blocking: bool, wait: u32, node: u32) -> u32 {
        let plan = self.plan;
        let local = self.rank % node;
        let iteration = self.iteration;
        let interval = i64::from(iteration / every);
        // The local rank that sends in interval `j` (the previous interval's for `j = -1`).
        let sender = |j: i64| j.rem_euclid(i64::from(node)) as u32;
        let sends = iteration % every == 0;
        let bytes = plan.gradient_bytes(plan.stage_parameters[0]).0;
        let chunk = DASO_CHUNK_ELEMENTS * plan.strategy.gradient_precision.bytes();
        let mut end = optimizer;
        let broadcast = |this: &mut Self, root: u32, deps: &[Dep]| -> u32 {
            let comm = Comm {
                group: GroupKind::Data,
                kind: CollectiveKind::Broadcast { root },
                bytes: Bytes(bytes),
                what: "daso node broadcast parameters",
            };
            let group = this.daso_group(false, node, local);
            let label = this.comm_label(comm.what);
            this.collective(comm, DATA_STREAM, group, label, deps)
        };
        // Non-blocking: receive the sync sent `wait` iterations ago (before the window for an
        // interval-long wait at iteration 0: only its broadcast is simulated).
        let receives = !blocking && iteration % every == wait % every;
        if receives {
            let from = (i64::from(iteration) - i64::from(wait)).div_euclid(i64::from(every));
            let mut deps = vec![Dep::Local(optimizer)];
            deps.extend(self.daso_pending.map(Dep::Global));
            end = broadcast(self, sender(from), &deps);
        }
        if sends && local == sender(interval) {
            let group = self.daso_group(true, node, local);
            let label = self.comm_label("daso global allreduce parameters");
            let mut last = end;
            let mut offset = 0u64;
            while offset < bytes {
                let size = chunk.min(bytes - offset);
                offset += size;
                let comm = Comm {
                    group: GroupKind::Data,
                    kind: CollectiveKind::AllReduce,
                    bytes: Bytes(size),
                    what: "",
                };
                last = self.collective(comm, DASO_STREAM, group, label, &[Dep::Local(end)]);
            }
            self.daso_sent = Some(last);
            if blocking {
                end = broadcast(self, local, &[Dep::Local(last)]);
            }
        } else if sends && blocking {
            end = broadcast(self, sender(interval), &[Dep::Local(end)]);
        }
        end
    }

    /// A DASO group: the GPUs of this rank's node (`global` false), or the GPUs of local rank
    /// `local` on every node (`global` true).
    fn daso_group(&mut self, global: bool, node: u32, local: u32) -> GroupId {
        let ranks = self.plan.layout.ranks();
        let (class, members): (GroupClass, Vec<RankId>) = if global {
            (GroupClass::Global, (local..ranks).step_by(node as usize).map(RankId).collect())
        } else {
            let first = self.rank - self.rank % node;
            (GroupClass::Node, (first..first + node).map(RankId).collect())
        };
        let key = (class, members[0].0);
        if let Some(&group) = self.shared.groups.get(&key) {
            return group;
        }
        let group = self.shared.graph.add_group(members);
        self.shared.groups.insert(key, group);
        group
    }

    /// The gradient-synchronisation group: data (x context) ranks, or the expert-data group
    /// for expert parameters.
    fn sync_group(&mut self, expert: bool) -> GroupId {
        self.group(if expert { GroupClass::ExpertData } else { GroupClass::Data })
    }

    /// The group of `class` this rank belongs to, interned on first use (keyed by its first
    /// member, computed without listing the members).
    fn group(&mut self, class: GroupClass) -> GroupId {
        let layout = &self.plan.layout;
        let rank = RankId(self.rank);
        let mut first = layout.coordinates(rank);
        let contexts = layout.size(Axis::Context);
        let expert = layout.expert();
        // Index along (context, data), context fastest.
        let index = first.context + contexts * first.data;
        // DASO's groups are interned by `daso_group` (they need the node size).
        let class =
            if matches!(class, GroupClass::Node | GroupClass::Global) { GroupClass::Data } else { class };
        match class {
            GroupClass::Tensor => first.tensor = 0,
            GroupClass::ModelParallel | GroupClass::Embedding => first.pipeline = 0,
            GroupClass::Data => {
                first.data = 0;
                first.context = 0;
            }
            GroupClass::Expert => {
                let start = index - index % expert;
                first.context = start % contexts;
                first.data = start / contexts;
            }
            GroupClass::ExpertData => {
                let start = index % expert;
                first.context = start % contexts;
                first.data = start / contexts;
            }
            GroupClass::Node | GroupClass::Global => {}
        }
        let key = (class, layout.rank(first).0);
        if let Some(&group) = self.shared.groups.get(&key) {
            return group;
        }
        let members = match class {
            GroupClass::Tensor => layout.group(Axis::Tensor, rank),
            GroupClass::ModelParallel => layout.group(Axis::Pipeline, rank),
            GroupClass::Embedding => {
                let all = layout.group(Axis::Pipeline, rank);
                vec![all[0], all[all.len() - 1]]
            }
            GroupClass::Expert => layout.expert_group(rank),
            GroupClass::Data | GroupClass::Node | GroupClass::Global => {
                if contexts > 1 {
                    layout.data_context_group(rank)
                } else {
                    layout.group(Axis::Data, rank)
                }
            }
            GroupClass::ExpertData => {
                let all = layout.data_context_group(rank);
                let expert = expert as usize;
                let position = all.iter().position(|r| *r == rank).unwrap_or(0) % expert;
                all.into_iter().enumerate().filter(|(i, _)| i % expert == position).map(|(_, r)| r).collect()
            }
        };
        debug_assert_eq!(members[0].0, key.1, "group key of {class:?}");
        let group = self.shared.graph.add_group(members);
        self.shared.groups.insert(key, group);
        group
    }
}
