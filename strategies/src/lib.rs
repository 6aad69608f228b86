//! The strategy layer: any product of data, tensor (+ sequence), pipeline, context and expert
//! parallelism with a ZeRO stage, lowered to one execution graph, with its memory per stage.
//!
//! The lowering is built from reusable parts, so that every strategy is a configuration of
//! them rather than a copy of another:
//! - [`layout`]: ranks to (tensor, context, data, pipeline) coordinates and the communicator
//!   groups of each dimension;
//! - [`shard`]: each layer as one rank runs it (its local shapes) and the collectives around
//!   it;
//! - [`pipeline`]: the stage partition and the per-stage schedule of micro-batches;
//! - the kernel-time table (one entry per local layer and pass, computed once), the
//!   recomputation plan, the gradient-synchronisation policy (DDP buckets, ZeRO
//!   reduce-scatter + allgather) and the per-stage, per-micro-batch emitter (`emit`).
//!
//! Plain data parallelism is the configuration with every other degree 1 and one micro-batch:
//! it lowers to the same graph, op for op, as the PyTorch DDP lowering always did.

pub mod cnn;
pub mod deepspeed_zero3;
mod emit;
pub mod experts;
pub mod layout;
pub mod passes;
pub mod pipeline;
pub mod shard;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_lora;
#[cfg(test)]
mod tests_moe;
#[cfg(test)]
mod tests_muon;
#[cfg(test)]
mod tests_sync;
mod zb_auto;

use std::ops::Range;

/// The most iterations whose graph is built whole, every iteration in memory at once (what
/// `--trace` and the Monte Carlo re-timer read); more are streamed
/// ([`Strategy::lower_streaming`]): each iteration's ops are built while the run needs them and
/// dropped once finished, so memory stays that of a few iterations and time grows with the count.
pub const MAX_ITERATIONS: u32 = 100;

/// The most iterations one run simulates. Streamed, they cost time, not memory, except the
/// report's list of every iteration's time (8 bytes each, 8 MB at the limit).
pub const MAX_SIMULATED_ITERATIONS: u32 = 1_000_000;

/// `"data 8 x tensor 8 x pipeline 16"`: the degrees other than 1.
pub fn describe_parallelism(p: &Parallelism) -> String {
    let mut parts = vec![format!("data {}", p.data)];
    for (name, value) in
        [("tensor", p.tensor), ("pipeline", p.pipeline), ("context", p.context), ("expert", p.expert)]
    {
        if value > 1 {
            parts.push(format!("{name} {value}"));
        }
    }
    parts.join(" x ")
}

use sim_core::graph::{CollectiveAlgorithm, ExecGraph, GraphError, OpId, StreamId};
use sim_core::units::{Bytes, SimDuration};

use workloads::compute::{ComputeError, ComputeModel};
use workloads::device::{Device, Dtype};
use workloads::layer::{OpClass, Pass};
use workloads::memory::{MemoryBreakdown, MemoryError, MemoryPlan, Recompute, Sharding};
use workloads::model::Model;
use workloads::optimizer::Optimizer;

pub use cnn::{CnnSplit, CnnTransport, FilterBackward, HostStaging, SpatialDims, SpatialHalos};
pub use emit::kernel_table::{BucketRow, KernelRow, KernelTable, RowPass};
pub use emit::{FLUSH_ORIGIN, IterationOps, LayerTables, OFFLOAD_ORIGIN};
pub use layout::{Axis, Coordinates, ExpertAxis, ExpertCoordinates, RankLayout, RankOrder};
pub use pipeline::{Action, PipelineSchedule};
pub use shard::{Comm, ExpertCommunicator, GroupKind, LocalLayer, Role, ShardError, Split};

/// The stream compute kernels run on.
pub const COMPUTE_STREAM: StreamId = StreamId(0);
/// The stream data-parallel gradient and parameter synchronisation runs on.
pub const DATA_STREAM: StreamId = StreamId(1);
/// The stream of tensor-parallel collectives.
pub const TENSOR_STREAM: StreamId = StreamId(2);
/// The stream pipeline sends are issued on.
pub const PIPELINE_STREAM: StreamId = StreamId(3);
/// The stream of the context-parallel key/value ring.
pub const CONTEXT_STREAM: StreamId = StreamId(4);
/// The stream of expert-parallel all-to-alls.
pub const EXPERT_STREAM: StreamId = StreamId(5);
/// The stream ZeRO-3 parameter allgathers are prefetched on.
pub const GATHER_STREAM: StreamId = StreamId(6);
/// The host thread that launches a rank's kernels: one op per kernel, each costing the compute
/// model's dispatch time, which the kernel waits for. Host time, not GPU time.
pub const HOST_STREAM: StreamId = StreamId(7);
/// The stream of filter-parallel collectives.
pub const FILTER_STREAM: StreamId = StreamId(8);
/// The stream of channel-parallel collectives.
pub const CHANNEL_STREAM: StreamId = StreamId(9);
/// The stream of the spatial allgather and of halo sends to the upper neighbour.
pub const SPATIAL_STREAM: StreamId = StreamId(10);
/// The stream of halo sends to the lower neighbour (both directions at once).
pub const HALO_STREAM: StreamId = StreamId(11);

/// The stream of DASO's global parameter allreduce (overlapped with the next iterations when
/// non-blocking).
pub const DASO_STREAM: StreamId = StreamId(12);
/// The stream out-of-core training copies activations (and weights) to host memory on.
pub const OFFLOAD_STREAM: StreamId = StreamId(13);
/// The stream out-of-core training prefetches them back on (the host link is full duplex).
pub const PREFETCH_STREAM: StreamId = StreamId(14);
/// The data loader of a rank that loads (`[workload.input]`): host work, one batch after
/// another (and, for a per-group loader, the serialisation of the batch it broadcasts, which
/// holds the same interpreter).
pub const LOADER_STREAM: StreamId = StreamId(15);
/// Where a rank takes its batch: the hand-over from the loader, the broadcast of a per-group
/// loader's batch and its unpacking, and the end of the iteration (the loop's next fetch).
pub const INPUT_STREAM: StreamId = StreamId(16);
/// The host staging of a CNN group's MPI messages that Open MPI pipelines with their transfer
/// (`cnn::HostStaging::pipelined`): beside the collective, not after it.
pub const STAGING_STREAM: StreamId = StreamId(17);
/// The reads and writes of a host optimizer's state on NVMe (ZeRO-Infinity,
/// [`Strategy::nvme`]): host-side I/O, one in-order queue per rank.
pub const NVME_STREAM: StreamId = StreamId(18);

/// The label of CUDA-aware MPI's staging of a message through host memory
/// ([`cnn::HostStaging`]): a device-side delay that belongs to the transfer, so its ops carry
/// [`sim_core::graph::Work::Staging`] and breakdowns count it as communication.
pub const HOST_STAGING_LABEL: &str = "mpi host staging";

/// The name of the timeline track of a rank's `stream` (`"compute"`, `"tensor communication"`,
/// `"data (parameter gathers)"`, `"host (kernel launches)"`). Streams are in-order queues only;
/// what an op on one is for, its metadata says ([`sim_core::graph::OpMeta`]).
pub fn stream_name(stream: StreamId) -> String {
    let group = match stream {
        DATA_STREAM | GATHER_STREAM | DASO_STREAM => GroupKind::Data,
        TENSOR_STREAM => GroupKind::Tensor,
        PIPELINE_STREAM => GroupKind::Pipeline,
        CONTEXT_STREAM => GroupKind::Context,
        EXPERT_STREAM => GroupKind::Expert,
        FILTER_STREAM => GroupKind::Filter,
        CHANNEL_STREAM => GroupKind::Channel,
        SPATIAL_STREAM | HALO_STREAM => GroupKind::Spatial,
        HOST_STREAM => return "host (kernel launches)".to_string(),
        NVME_STREAM => return "host (NVMe reads and writes)".to_string(),
        _ => return "compute".to_string(),
    };
    match stream {
        GATHER_STREAM => format!("{} (parameter gathers)", group.name()),
        _ => format!("{} communication", group.name()),
    }
}

/// How context-parallel attention exchanges its inputs: Megatron-Core's `--cp-comm-type`, run
/// by Transformer Engine's `attn_forward_func_with_cp` (NVIDIA/Megatron-LM @ d98e8a64dd :
/// megatron/core/transformer/transformer_config.py `cp_comm_type`; megatron/core/
/// parallel_state.py, the hierarchical context-parallel groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContextComm {
    /// `p2p`: a ring over the context ranks passes key/value chunks, one step per rank, each
    /// step's attention overlapping the next exchange (the default).
    #[default]
    P2p,
    /// `a2a` (DeepSpeed-Ulysses): an all-to-all of the queries, keys and values trades each
    /// rank's sequence chunk for the whole sequence of `1 / context` of the heads; the
    /// attention runs locally, and a second all-to-all returns the output (mirrored in the
    /// backward).
    A2a,
    /// `a2a+p2p` with `--hierarchical-context-parallel-sizes a2a p2p`: an all-to-all over
    /// groups of `a2a` consecutive context ranks, then a p2p ring over the ranks at the same
    /// place in each group.
    A2aP2p {
        /// Ranks of each all-to-all group (the first hierarchical size).
        a2a: u32,
    },
}

/// How the model is split over the GPUs, and how gradients are synchronised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Parallelism {
    /// Data-parallel replicas.
    pub data: u32,
    /// Tensor-parallel degree.
    pub tensor: u32,
    /// Megatron-LM sequence parallelism on the tensor ranks.
    pub sequence_parallel: bool,
    /// Pipeline stages.
    pub pipeline: u32,
    /// Model chunks per pipeline rank (interleaved 1F1B when > 1).
    pub virtual_stages: u32,
    /// Pipeline schedule.
    pub schedule: PipelineSchedule,
    /// Interleaved 1F1B: micro-batches per group through each chunk
    /// (`parallelism.microbatch-group-size`, Megatron-LM's
    /// `--microbatch-group-size-per-virtual-pipeline-stage`); `None`: the pipeline degree.
    pub microbatch_group: Option<u32>,
    /// Numbered blocks on the first pipeline stage (`parallelism.first-stage-layers`,
    /// Megatron-LM's `--decoder-first-pipeline-num-layers`); `None`: an even split.
    pub first_stage_layers: Option<u32>,
    /// Numbered blocks on the last pipeline stage (`parallelism.last-stage-layers`,
    /// `--decoder-last-pipeline-num-layers`); `None`: an even split.
    pub last_stage_layers: Option<u32>,
    /// The zero-bubble repository's `--allow-padding-num-layers` (`parallelism.pad-layers`):
    /// the blocks padded up to a multiple of the pipeline degree and split evenly over the
    /// model chunks, then one block taken off the last chunk, the first, the second, ... for
    /// each block of padding ([`pipeline::padded_sizes`]): the first and last chunks, which hold
    /// the embedding and the output layer, run one block fewer (or none).
    pub pad_layers: bool,
    /// Megatron-Core's `--account-for-embedding-in-pipeline-split`
    /// (`parallelism.account-for-embedding`): the embedding counts as one layer of the split,
    /// so the first model chunk builds one block fewer ([`pipeline::accounted_sizes`]).
    pub account_for_embedding: bool,
    /// Megatron-Core's `--account-for-loss-in-pipeline-split` (`parallelism.account-for-loss`):
    /// the loss (with the output layer) counts as one layer of the split, so the last model
    /// chunk builds one block fewer.
    pub account_for_loss: bool,
    /// Context-parallel degree.
    pub context: u32,
    /// Expert-parallel degree (inside data x context).
    pub expert: u32,
    /// The experts' own tensor degree (`parallelism.expert-tensor`); `None`: the dense tensor
    /// degree, as Megatron-Core's `--expert-tensor-parallel-size` defaults to
    /// `--tensor-model-parallel-size`. See [`Parallelism::expert_tensor_degree`].
    pub expert_tensor: Option<u32>,
    /// How tokens reach their experts and come back (`parallelism.moe-dispatcher`).
    pub moe_dispatcher: MoeDispatcher,
    /// Megatron-Core's EP A2A overlap (`parallelism.moe-overlap`,
    /// `--overlap-moe-expert-parallel-comm`): the forward of one micro-batch merged with the
    /// backward of the one before, layer by layer, so that each one's expert all-to-alls run
    /// beside the other's computation (docs/strategies.md, "All-to-all overlap").
    pub moe_overlap: bool,
    /// GPUs per NVLink domain a DeepEP-style dispatcher's first hop stays in: the cluster's
    /// `gpus-per-node`, set by the scenario (`MoeDispatcher::DeepEp`).
    pub moe_node: u32,
    /// How each rank runs its local experts (`parallelism.moe-experts`): one grouped kernel per
    /// product, or one dense block per expert in turn (the host launches differ).
    pub moe_experts: experts::MoeExperts,
    /// The dtype of the router's probabilities (`parallelism.moe-router-dtype`, Megatron-Core's
    /// `--moe-router-dtype`); `None`: the compute dtype (the logits', Megatron's default). The
    /// all-gather dispatcher moves the probabilities, and reduce-scatters the experts' outputs,
    /// in it.
    pub moe_router_dtype: Option<Dtype>,
    /// ZeRO stage: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters.
    pub zero: u8,
    /// Megatron-Core's partial distributed optimizer (`parallelism.distributed-optimizer-instances`,
    /// `--num-distributed-optimizer-instances`): the data-parallel ranks (with context) split
    /// into this many instances of consecutive ranks, each sharding the optimizer state over
    /// its own ranks only. A bucket's gradients are reduce-scattered within the instance, then
    /// each shard all-reduced across the instances; the parameters are all-gathered within the
    /// instance. 1 (the default): one instance over every data-parallel rank. ZeRO-1 only.
    pub distributed_optimizer_instances: u32,
    /// Megatron-Core's `--defer-embedding-wgrad-compute` (`parallelism.defer-embedding-wgrad`,
    /// with `parallelism.wgrad-deferral-limit`): the output layer's weight-gradient products of
    /// the first `limit` micro-batches (every one with 0) run after the pipeline schedule, in
    /// the last stage's flush, instead of in their backward. `None`: not deferred.
    pub defer_embedding_wgrad: Option<u32>,
    /// How the context-parallel ranks exchange attention inputs (`parallelism.context-comm`,
    /// Megatron-Core's `--cp-comm-type`).
    pub context_comm: ContextComm,
    /// Tokens the busiest expert receives relative to balanced routing (1: balanced).
    pub expert_skew: f64,
    /// Expert capacity factor: tokens above `capacity x balanced` are dropped (`None`:
    /// dropless, as Megatron-Core's default).
    pub capacity_factor: Option<f64>,
    /// Rank numbering.
    pub order: RankOrder,
    /// Gradient bucket cap (DDP: 25 MiB).
    pub bucket_cap: Bytes,
    /// First bucket's cap (DDP: 1 MiB).
    pub first_bucket_cap: Bytes,
    /// Algorithm of the data-parallel gradient collectives.
    pub data_algorithm: CollectiveAlgorithm,
    /// Filter-parallel degree (CNNs: output channels split inside a group).
    pub filter: u32,
    /// Channel-parallel degree (CNNs: input channels split inside a group).
    pub channel: u32,
    /// Spatial-parallel degree (CNNs: activations split along `spatial_dims` inside a group).
    pub spatial: u32,
    /// The dimensions spatial parallelism splits.
    pub spatial_dims: SpatialDims,
    /// The last layer spatial parallelism splits (an index into the model's layers;
    /// `parallelism.spatial-until`); `None`: up to the first non-spatial layer.
    pub spatial_until: Option<u32>,
    /// Which layers of the spatial split exchange halos (`parallelism.spatial-halos`).
    pub spatial_halos: SpatialHalos,
    /// The collective of the filter split's backward (`parallelism.filter-backward`).
    pub filter_backward: FilterBackward,
    /// The host staging of the CNN group's MPI messages (`parallelism.cnn-transport`,
    /// [`CnnTransport`]); `None`: they go GPU to GPU.
    pub cnn_staging: Option<HostStaging>,
    /// How the data-parallel replicas synchronise: one allreduce per iteration, or DASO's
    /// node-local allreduce with a periodic global one.
    pub sync: GradientSync,
    /// What is kept in host memory instead of on the device (out-of-core training).
    pub offload: Offload,
    /// Which software runs ZeRO-3 (`parallelism.zero-implementation`): what it gathers at
    /// once, how far ahead, and how it reduces gradients.
    pub zero_implementation: ZeroImplementation,
    /// Whether the host waits for the device at each pipeline exchange
    /// (`parallelism.pipeline-host-sync`, [`PipelineHostSync`]).
    pub pipeline_host_sync: PipelineHostSync,
    /// Megatron-LM's scatter-gather of pipeline activations
    /// (`parallelism.pipeline-scatter-gather`): with tensor parallelism and no sequence
    /// parallelism every tensor rank holds the whole boundary activation, so each sends only
    /// its 1/t slice to its peer of the next stage, and the receivers all-gather the slices
    /// over their tensor group before using them.
    pub pipeline_scatter_gather: bool,
    /// Where data-parallel gradient buckets live (`parallelism.gradient-buffers`): copies
    /// beside the gradients, or the gradients' own storage.
    pub gradient_buffers: GradientBuffers,
}

/// Where a data-parallel gradient synchronisation's buckets live
/// (`parallelism.gradient-buffers`), which decides whether they add to the memory peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GradientBuffers {
    /// Buckets are persistent buffers beside the gradients, which are copied into them
    /// (PyTorch DDP's default, `gradient_as_bucket_view=False`: torch/nn/parallel/distributed.py):
    /// one more copy of the gradients at every instant.
    #[default]
    Copy,
    /// The synchronisation runs on the gradients' own storage (a contiguous gradient buffer
    /// whose buckets are views: Megatron-LM's DDP with contiguous buffers, Megatron-Core's
    /// `_ParamAndGradBuffer`, PyTorch DDP's `gradient_as_bucket_view=True`), or on a copy made
    /// only after the backward, once the micro-batches' activations are freed (Megatron-LM
    /// 2021's local DDP without contiguous buffers, `_flatten_dense_tensors` in
    /// `allreduce_gradients`): nothing beside the gradients at the activation peak.
    InPlace,
}

impl GradientBuffers {
    /// Every setting, in the order errors list them.
    pub const ALL: [GradientBuffers; 2] = [GradientBuffers::Copy, GradientBuffers::InPlace];

    /// The scenario name: `"copy"` or `"in-place"`.
    pub const fn name(self) -> &'static str {
        match self {
            GradientBuffers::Copy => "copy",
            GradientBuffers::InPlace => "in-place",
        }
    }
}

impl std::str::FromStr for GradientBuffers {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        GradientBuffers::ALL.into_iter().find(|s| s.name() == name).ok_or_else(|| {
            format!(
                "unknown gradient buffers {name:?}; valid: \"copy\" (persistent buckets beside the \
                 gradients: PyTorch DDP's default), \"in-place\" (the gradients' own contiguous buffer, \
                 or a copy made after the backward: Megatron-LM, Megatron-Core)"
            )
        })
    }
}

/// Whether the framework's host synchronises the device after each pipeline exchange
/// (`parallelism.pipeline-host-sync`). Megatron-LM calls `torch.cuda.synchronize()` after its
/// batched `isend`/`irecv` ("to protect against race condition when using
/// batch_isend_irecv()"): every call of `_communicate` in the 2021-2022 code
/// (`megatron/p2p_communication.py`), and in Megatron-Core when `batch_p2p_comm` and
/// `batch_p2p_sync` are on (`megatron/core/pipeline_parallel/p2p_communication.py`), which is
/// every non-interleaved pipeline and no interleaved one unless it turns the p2p overlap off
/// (`megatron/training/argument_utils.py`: `batch_p2p_comm = not overlap_p2p_comm`).
///
/// At an exchange the host issues nothing more until every op the rank has put on the device
/// (kernels, collectives, its sends) and the transfers it receives there have finished; a
/// host-bound pipeline's fill and drain are then host time as well (docs/strategies.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PipelineHostSync {
    /// The host runs ahead of the device across exchanges (PyTorch's own `isend`/`irecv`).
    #[default]
    None,
    /// At every exchange (Megatron-LM 2021-2022; NeMo, which keeps batched p2p with the sync).
    EveryExchange,
    /// At every exchange of a non-interleaved pipeline; an interleaved one overlaps its p2p
    /// without it (Megatron-Core's defaults).
    UnlessInterleaved,
}

impl PipelineHostSync {
    /// Every setting, in the order errors list them.
    pub const ALL: [PipelineHostSync; 3] =
        [PipelineHostSync::None, PipelineHostSync::EveryExchange, PipelineHostSync::UnlessInterleaved];

    /// The scenario name: `"none"`, `"every-exchange"` or `"unless-interleaved"`.
    pub const fn name(self) -> &'static str {
        match self {
            PipelineHostSync::None => "none",
            PipelineHostSync::EveryExchange => "every-exchange",
            PipelineHostSync::UnlessInterleaved => "unless-interleaved",
        }
    }

    /// Whether the host synchronises at the exchanges of a pipeline of `stages` stages with
    /// `virtual_stages` model chunks per stage.
    pub const fn applies(self, stages: u32, virtual_stages: u32) -> bool {
        stages > 1
            && match self {
                PipelineHostSync::None => false,
                PipelineHostSync::EveryExchange => true,
                PipelineHostSync::UnlessInterleaved => virtual_stages <= 1,
            }
    }
}

impl std::str::FromStr for PipelineHostSync {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        PipelineHostSync::ALL.into_iter().find(|s| s.name() == name).ok_or_else(|| {
            format!(
                "unknown pipeline host sync {name:?}; valid: \"none\" (the host runs ahead across \
                 pipeline exchanges), \"every-exchange\" (torch.cuda.synchronize() after every exchange: \
                 Megatron-LM 2021-2022, NeMo), \"unless-interleaved\" (the same on non-interleaved \
                 pipelines only: Megatron-Core)"
            )
        })
    }
}

/// Megatron-Core's token dispatcher (`parallelism.moe-dispatcher`,
/// `--moe-token-dispatcher-type`): how each mixture-of-experts layer's tokens reach the ranks
/// holding their experts and how the experts' outputs come back
/// (megatron/core/transformer/moe/token_dispatcher.py).
///
/// Both are dropless and size their buffers from the number of tokens routed to each expert,
/// which the host reads once per expert layer's forward (and recomputation), waiting for it:
/// the all-to-all dispatcher before its expert-parallel exchange (`preprocess`: the
/// `before_ep_alltoall` sync point, or `before_finish` without expert or tensor parallelism),
/// the all-gather one after its gathers (`dispatch_postprocess`:
/// `self.local_map.sum(dim=0).long().cpu()`). Where the host sets the pace the launches after
/// it then wait for the GPU to get there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MoeDispatcher {
    /// `MoEAlltoAllTokenDispatcher`: each token sent to the ranks of its top-k experts by an
    /// all-to-all over the expert-parallel group, and back by another (parasim's model since
    /// expert parallelism was added).
    #[default]
    AllToAll,
    /// `MoEAllGatherTokenDispatcher` (Megatron-Core's default): the hidden states, routing
    /// probabilities and routing map all-gathered over the expert-tensor x expert group
    /// (`tp_ep`), each rank running its local experts on the tokens routed to them, and the
    /// outputs reduce-scattered back over the same group.
    AllGather,
    /// A DeepEP-style two-hop dispatcher (DeepSeek-V3 technical report, arXiv 2412.19437,
    /// section 3.2.2; deepseek-ai/DeepEP's normal kernels, Megatron-Core's `flex` dispatcher
    /// with `--moe-enable-deepep`): each token crosses the network once per node that hosts
    /// one of its experts (to the GPU of its own local index there, over RDMA), then is
    /// forwarded over NVLink to each GPU of that node that hosts one of them; the combine
    /// reduces on the node first and crosses the network back once per node. Two all-to-alls
    /// each way, over the expert group's rail (its members at the rank's local index) and its
    /// node part, with the deduplicated volumes of balanced top-k routing ([`deepep_copies`]).
    DeepEp,
}

/// The expected number of distinct holders among `holders` equal shares of `experts`
/// experts that a token routed to `top_k` distinct experts chosen uniformly reaches:
/// `holders (1 - C(E - E/holders, k) / C(E, k))`. A DeepEP-style dispatcher sends a token
/// once per node (holders: the expert group's nodes) and once per GPU (holders: its ranks)
/// that hosts one of its experts.
pub fn deepep_copies(experts: u64, top_k: u64, holders: u64) -> f64 {
    if holders == 0 || experts == 0 {
        return 0.0;
    }
    let (e, share) = (experts as f64, experts as f64 / holders as f64);
    let missed: f64 =
        (0..top_k.min(experts)).map(|i| ((e - share - i as f64) / (e - i as f64)).max(0.0)).product();
    holders as f64 * (1.0 - missed)
}

impl MoeDispatcher {
    /// Every dispatcher, in the order errors list them.
    pub const ALL: [MoeDispatcher; 3] =
        [MoeDispatcher::AllToAll, MoeDispatcher::AllGather, MoeDispatcher::DeepEp];

    /// The scenario name: `"all-to-all"`, `"all-gather"` or `"deepep"`.
    pub const fn name(self) -> &'static str {
        match self {
            MoeDispatcher::AllToAll => "all-to-all",
            MoeDispatcher::AllGather => "all-gather",
            MoeDispatcher::DeepEp => "deepep",
        }
    }
}

impl std::str::FromStr for MoeDispatcher {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        MoeDispatcher::ALL.into_iter().find(|d| d.name() == name).ok_or_else(|| {
            format!(
                "unknown MoE dispatcher {name:?}; valid: \"all-to-all\" (Megatron-Core's alltoall: tokens \
                 to their experts' ranks and back by all-to-all over the expert group), \"all-gather\" \
                 (Megatron-Core's allgather: tokens all-gathered over the expert-tensor x expert group, \
                 outputs reduce-scattered back), \"deepep\" (DeepEP-style two hops: each token over the \
                 network once per node hosting its experts, then over NVLink inside it)"
            )
        })
    }
}

/// Which software's ZeRO-3 a job runs (`parallelism.zero-implementation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZeroImplementation {
    /// PyTorch FSDP (full shard): each unit (a numbered block, or the layers around the
    /// blocks) gathered whole one unit ahead; its gradients reduce-scattered after its backward.
    #[default]
    Fsdp,
    /// DeepSpeed's ZeRO stage 3 as released in v0.3.13-v0.3.14 (March-April 2021), with its
    /// code's default configuration ([`deepspeed_zero3`] holds every number and its source).
    DeepSpeed,
}

impl ZeroImplementation {
    /// Every implementation, in the order errors list them.
    pub const ALL: [ZeroImplementation; 2] = [ZeroImplementation::Fsdp, ZeroImplementation::DeepSpeed];

    /// The scenario name: `"fsdp"` or `"deepspeed"`.
    pub const fn name(self) -> &'static str {
        match self {
            ZeroImplementation::Fsdp => "fsdp",
            ZeroImplementation::DeepSpeed => "deepspeed",
        }
    }
}

impl std::str::FromStr for ZeroImplementation {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        ZeroImplementation::ALL.into_iter().find(|i| i.name() == name).ok_or_else(|| {
            format!(
                "unknown ZeRO-3 implementation {name:?}; valid: \"fsdp\" (PyTorch FSDP: per-block gathers \
                 one block ahead, per-block reduce-scatter), \"deepspeed\" (DeepSpeed v0.3.14's ZeRO-3: \
                 per-parameter gathers, bounded live parameters, bucketed fp16 gradient allreduce)"
            )
        })
    }
}

/// How data-parallel replicas synchronise (`parallelism.sync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GradientSync {
    /// Every gradient bucket all-reduced over every replica, every iteration (PyTorch DDP).
    #[default]
    AllReduce,
    /// DASO (Coquelin et al. 2022): gradient buckets all-reduced inside each node every
    /// iteration; every `every` iterations the parameters all-reduced across the nodes by one
    /// GPU per node (the GPUs of one local rank, rotating) and broadcast inside the node.
    Daso {
        /// Iterations between global synchronisations (`global-sync-every`, DASO's
        /// `global_skip`).
        every: u32,
        /// Wait for the global allreduce at once (`global-sync = "blocking"`); otherwise it
        /// overlaps the next `wait` iterations and the iteration that needs it waits.
        blocking: bool,
        /// Iterations between sending and receiving a non-blocking global sync (DASO's
        /// `batches_to_wait`).
        wait: u32,
        /// GPUs per node: the node-local group.
        node: u32,
    },
}

impl GradientSync {
    /// `"allreduce"` or `"daso"`.
    pub fn name(self) -> &'static str {
        match self {
            GradientSync::AllReduce => "allreduce",
            GradientSync::Daso { .. } => "daso",
        }
    }
}

/// What out-of-core training keeps in host memory (`workload.offload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Offload {
    /// Everything on the device.
    #[default]
    None,
    /// Each layer's saved activations copied to host memory after its forward and prefetched
    /// before its backward (vDNN, OC-DNN).
    Activations,
    /// The activations, and each layer's weights too (ZeRO-Offload / ZeRO-Infinity style): the
    /// weights, gradients and optimizer state live in host memory; each layer's weights are
    /// prefetched before its forward and before its backward, its gradient written back after
    /// its synchronisation, and the optimizer step streams the state through the GPU in chunks.
    ActivationsAndWeights,
    /// ZeRO-Offload (Ren et al., USENIX ATC '21): the optimizer's state and fp32 master
    /// weights live in host memory and the optimizer step runs on the host CPU; each gradient
    /// bucket is copied to host memory after its synchronisation and the updated working
    /// weights come back. The working weights, gradients and activations stay on the device.
    Optimizer,
    /// [`Offload::Activations`] and [`Offload::Optimizer`] together.
    ActivationsAndOptimizer,
    /// ZeRO-3 with every model state off the device (ZeRO-Infinity, Rajbhandari et al., SC '21;
    /// DeepSpeed's `offload_param` with `offload_optimizer`, PyTorch FSDP's
    /// `CPUOffload(offload_params=True)`): [`Offload::Optimizer`], and each rank's shard of the
    /// working weights kept in host memory (or on NVMe), copied to the device before each of
    /// its unit's allgathers; the gradient shards go to the host after each reduce-scatter.
    OptimizerAndParameters,
    /// [`Offload::Activations`] and [`Offload::OptimizerAndParameters`] together.
    ActivationsOptimizerAndParameters,
}

impl Offload {
    /// Every value, in the order the scenario documents them.
    pub const ALL: [Offload; 7] = [
        Offload::None,
        Offload::Activations,
        Offload::ActivationsAndWeights,
        Offload::Optimizer,
        Offload::ActivationsAndOptimizer,
        Offload::OptimizerAndParameters,
        Offload::ActivationsOptimizerAndParameters,
    ];

    /// The scenario value: `"none"`, `"activations"`, `"activations+weights"`, `"optimizer"`,
    /// `"activations+optimizer"`, `"optimizer+parameters"`, `"activations+optimizer+parameters"`.
    pub fn name(self) -> &'static str {
        match self {
            Offload::None => "none",
            Offload::Activations => "activations",
            Offload::ActivationsAndWeights => "activations+weights",
            Offload::Optimizer => "optimizer",
            Offload::ActivationsAndOptimizer => "activations+optimizer",
            Offload::OptimizerAndParameters => "optimizer+parameters",
            Offload::ActivationsOptimizerAndParameters => "activations+optimizer+parameters",
        }
    }

    /// Whether saved activations go to host memory between their forward and backward.
    pub fn activations(self) -> bool {
        matches!(
            self,
            Offload::Activations
                | Offload::ActivationsAndWeights
                | Offload::ActivationsAndOptimizer
                | Offload::ActivationsOptimizerAndParameters
        )
    }

    /// Whether the optimizer step runs on the host CPU (ZeRO-Offload).
    pub fn host_optimizer(self) -> bool {
        matches!(
            self,
            Offload::Optimizer
                | Offload::ActivationsAndOptimizer
                | Offload::OptimizerAndParameters
                | Offload::ActivationsOptimizerAndParameters
        )
    }

    /// Whether ZeRO-3's shards of the working weights live off the device (ZeRO-Infinity's
    /// parameter offload), fetched before each allgather.
    pub fn parameters(self) -> bool {
        matches!(self, Offload::OptimizerAndParameters | Offload::ActivationsOptimizerAndParameters)
    }

    /// Whether synchronised gradients are written to host memory (out-of-core weights, or a
    /// host optimizer that reads them there).
    pub fn gradients_to_host(self) -> bool {
        self == Offload::ActivationsAndWeights || self.host_optimizer()
    }
}

impl std::str::FromStr for Offload {
    type Err = String;
    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "none" => Ok(Offload::None),
            "activations" => Ok(Offload::Activations),
            "activations+weights" => Ok(Offload::ActivationsAndWeights),
            "optimizer" => Ok(Offload::Optimizer),
            "activations+optimizer" => Ok(Offload::ActivationsAndOptimizer),
            "optimizer+parameters" => Ok(Offload::OptimizerAndParameters),
            "activations+optimizer+parameters" => Ok(Offload::ActivationsOptimizerAndParameters),
            other => Err(format!(
                "unknown offload {other:?}; valid: \"none\", \"activations\" (saved activations to host memory \
                 after their forward, back before their backward), \"activations+weights\" (the weights, \
                 gradients and optimizer state too), \"optimizer\" (ZeRO-Offload: optimizer state in host \
                 memory, the step on the host CPU), \"activations+optimizer\" (both), \"optimizer+parameters\" \
                 (ZeRO-Infinity, with zero = 3: the optimizer's offload and each rank's shard of the weights \
                 off the device), \"activations+optimizer+parameters\" (all three)"
            )),
        }
    }
}

impl Parallelism {
    /// Plain data parallelism over `ranks` GPUs with DDP's buckets.
    pub fn data_parallel(ranks: u32) -> Parallelism {
        Parallelism {
            data: ranks,
            tensor: 1,
            sequence_parallel: false,
            pipeline: 1,
            virtual_stages: 1,
            schedule: PipelineSchedule::OneFOneB,
            microbatch_group: None,
            first_stage_layers: None,
            last_stage_layers: None,
            pad_layers: false,
            account_for_embedding: false,
            account_for_loss: false,
            context: 1,
            expert: 1,
            expert_tensor: None,
            moe_dispatcher: MoeDispatcher::AllToAll,
            moe_overlap: false,
            moe_node: 8,
            moe_experts: experts::MoeExperts::Grouped,
            moe_router_dtype: None,
            zero: 0,
            distributed_optimizer_instances: 1,
            defer_embedding_wgrad: None,
            context_comm: ContextComm::P2p,
            expert_skew: 1.0,
            capacity_factor: None,
            order: RankOrder::default(),
            bucket_cap: Bytes(25 << 20),
            first_bucket_cap: Bytes(1 << 20),
            data_algorithm: CollectiveAlgorithm::Auto,
            filter: 1,
            channel: 1,
            spatial: 1,
            spatial_dims: SpatialDims::H,
            spatial_until: None,
            spatial_halos: SpatialHalos::EveryWindow,
            filter_backward: FilterBackward::InputAllreduce,
            cnn_staging: None,
            sync: GradientSync::AllReduce,
            offload: Offload::None,
            zero_implementation: ZeroImplementation::Fsdp,
            pipeline_host_sync: PipelineHostSync::None,
            pipeline_scatter_gather: false,
            gradient_buffers: GradientBuffers::Copy,
        }
    }

    /// GPUs used: data x tensor x pipeline x context x the CNN group.
    pub fn gpus(&self) -> u64 {
        [self.data, self.tensor, self.pipeline, self.context, self.cnn_degree()]
            .iter()
            .map(|&d| u64::from(d))
            .product()
    }

    /// Ranks of the CNN model-parallel group: filter x channel x spatial (one of them is
    /// above 1 at most).
    pub fn cnn_degree(&self) -> u32 {
        self.filter.saturating_mul(self.channel).saturating_mul(self.spatial)
    }

    /// The CNN strategy inside a group, if any.
    pub fn cnn(&self) -> CnnSplit {
        if self.filter > 1 {
            CnnSplit::Filter { degree: self.filter, backward: self.filter_backward }
        } else if self.channel > 1 {
            CnnSplit::Channel(self.channel)
        } else if self.spatial > 1 {
            CnnSplit::Spatial {
                degree: self.spatial,
                dims: self.spatial_dims,
                until: self.spatial_until,
                halos: self.spatial_halos,
            }
        } else {
            CnnSplit::None
        }
    }

    /// Ranks each gradient is summed over: data x context, times the spatial ranks (which hold
    /// replicated weights; filter and channel ranks hold shards).
    pub fn gradient_sync_ranks(&self) -> u32 {
        self.data * self.context * self.spatial
    }

    /// Ranks one optimizer state is sharded over under ZeRO: every gradient-synchronising
    /// rank, or one distributed-optimizer instance's share of them.
    pub fn optimizer_shard_ranks(&self) -> u32 {
        self.gradient_sync_ranks() / self.distributed_optimizer_instances.max(1)
    }

    /// Of `parameters` on a rank, those whose optimizer state it holds (and whose gradients
    /// the step's synchronisation leaves it): all of them, or under ZeRO its shard.
    pub fn optimizer_held(&self, parameters: u64) -> u64 {
        if self.zero >= 1 { parameters.div_ceil(u64::from(self.optimizer_shard_ranks())) } else { parameters }
    }

    /// Model chunks in the whole pipeline: pipeline x virtual stages.
    pub fn chunks(&self) -> u32 {
        self.pipeline * self.virtual_stages
    }

    /// The rank layout.
    pub fn layout(&self) -> RankLayout {
        // The CNN group takes the tensor dimension's place: contiguous ranks, inside a node.
        RankLayout::new(
            self.tensor * self.cnn_degree(),
            self.context,
            self.data,
            self.pipeline,
            self.expert,
            self.order,
        )
        .with_expert_tensor(self.experts_apart().then(|| self.expert_tensor_degree()))
    }

    /// The experts' tensor degree: `parallelism.expert-tensor`, else the dense tensor degree.
    pub fn expert_tensor_degree(&self) -> u32 {
        self.expert_tensor.unwrap_or(self.tensor)
    }

    /// Whether the expert layers are laid out apart from the dense ones: an expert-tensor
    /// degree of their own or the all-gather dispatcher (what Megatron-Core's expert rank
    /// generator and `MoEAllGatherTokenDispatcher` do, which parasim's first expert model,
    /// expert groups carved out of data x context with the all-to-all dispatcher, did not).
    pub fn experts_apart(&self) -> bool {
        self.expert_tensor_degree() != self.tensor || self.moe_dispatcher == MoeDispatcher::AllGather
    }

    /// Ranks each expert parameter's gradient is summed over: the expert-data degree,
    /// `world / (pipeline x expert-tensor x expert)` (Megatron-Core's
    /// `expert_data_parallel_size`, megatron/core/parallel_state.py).
    pub fn expert_data(&self) -> u32 {
        let per_stage = self.tensor * self.context * self.data * self.cnn_degree();
        per_stage / (self.expert_tensor_degree() * self.expert).max(1)
    }

    /// Ranks of the communicator an expert layer's collective runs over: the expert group
    /// for all-to-alls, the expert-tensor x expert group for the all-gather dispatcher's
    /// all-gathers and reduce-scatters, the expert-tensor group for the all-to-all
    /// dispatcher's ([`shard::expert_communicator`]).
    pub fn expert_comm_ranks(&self, kind: sim_core::graph::CollectiveKind, what: &str) -> u32 {
        match shard::expert_communicator(kind, self.moe_dispatcher, what) {
            shard::ExpertCommunicator::Expert => self.expert,
            shard::ExpertCommunicator::ExpertNode => self.split().expert_node,
            shard::ExpertCommunicator::ExpertRail => self.expert / self.split().expert_node.max(1),
            shard::ExpertCommunicator::ExpertTensor => self.expert_tensor_degree(),
            shard::ExpertCommunicator::ExpertTensorExpert => self.expert_tensor_degree() * self.expert,
        }
    }

    /// What shapes one rank's layers.
    pub fn split(&self) -> Split {
        Split {
            tensor: self.tensor,
            sequence_parallel: self.sequence_parallel,
            context: self.context,
            context_a2a: match self.context_comm {
                ContextComm::P2p => 1,
                ContextComm::A2a => self.context,
                ContextComm::A2aP2p { a2a } => a2a,
            },
            expert: self.expert,
            expert_tensor: self.expert_tensor_degree(),
            dispatcher: self.moe_dispatcher,
            expert_node: self.expert_node_ranks(),
            router_dtype: self.moe_router_dtype,
            expert_load: self.capacity_factor.map_or(self.expert_skew, |cap| self.expert_skew.min(cap)),
            cnn: self.cnn(),
        }
    }

    /// Members of an expert group on one node (`moe_node` GPUs) under a DeepEP-style
    /// dispatcher, rank 0's group counted (`Strategy::check` refuses groups spread unevenly);
    /// 1 with the other dispatchers.
    pub fn expert_node_ranks(&self) -> u32 {
        if self.moe_dispatcher != MoeDispatcher::DeepEp || self.expert < 2 {
            return 1;
        }
        let layout = self.layout();
        let group = layout.expert_node_group(sim_core::graph::RankId(0), self.moe_node);
        u32::try_from(group.len()).unwrap_or(1).max(1)
    }

    /// The memory model's view of the split.
    pub fn sharding(&self) -> Sharding {
        Sharding {
            data: self.data * self.context / self.distributed_optimizer_instances.max(1),
            tensor: self.tensor,
            pipeline: 1,
            zero_stage: self.zero,
            sequence_parallel: self.sequence_parallel,
        }
    }

    /// Whether this is plain data parallelism (every other degree 1, no ZeRO).
    pub fn is_data_parallel(&self) -> bool {
        self.tensor == 1
            && self.pipeline == 1
            && self.context == 1
            && self.expert == 1
            && self.zero == 0
            && self.cnn_degree() == 1
    }
}

/// A strategy cannot be lowered.
#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    /// A degree, batch or combination is not valid; `key` is the scenario key at fault.
    #[error("{key}: {message}")]
    Invalid {
        /// Dotted scenario key (`parallelism.pipeline`, `workload.global-batch`).
        key: &'static str,
        /// What is wrong and what would be valid.
        message: String,
    },
    /// The model cannot be split as asked.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// A kernel time could not be computed.
    #[error("layer {layer}: {source}")]
    Compute {
        /// The layer.
        layer: String,
        /// Why.
        #[source]
        source: ComputeError,
    },
    /// The memory model refused the configuration.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// The graph would pass the work budget ([`sim_core::budget`]): refused before it is built.
    #[error(transparent)]
    OverBudget(#[from] Box<sim_core::budget::OverBudget>),
    /// The graph is malformed (a bug in the lowering).
    #[error("internal error in the lowering: {0}")]
    Graph(#[from] GraphError),
    /// The lowering contradicts itself (a bug).
    #[error("internal error in the lowering: {0}")]
    Internal(String),
}

fn invalid(key: &'static str, message: String) -> StrategyError {
    StrategyError::Invalid { key, message }
}

/// Everything the lowering needs: what is trained, on what, and how it is split.
#[derive(Debug, Clone)]
pub struct Strategy<'a> {
    /// What is trained.
    pub model: &'a Model,
    /// On what.
    pub device: &'a Device,
    /// How kernel times are estimated.
    pub compute: &'a ComputeModel,
    /// Dtype of activations and of the matrix units.
    pub precision: Dtype,
    /// Dtype of the synchronised gradients.
    pub gradient_precision: Dtype,
    /// Dtype of the optimizer's states and its copy of the weights (`workload.optimizer-precision`):
    /// fp32, or bf16 where the optimizer keeps them narrow (Apex's DistributedFusedAdam with
    /// `dtype = bf16`).
    pub optimizer_precision: Dtype,
    /// The optimizer step at the end of the iteration.
    pub optimizer: Optimizer,
    /// How the weights and the optimizer's copy of them are stored (`workload.master-weights`,
    /// `workload.fp8-weights`): the memory they take, the bytes the step moves and the
    /// parameter all-gathers' width.
    pub weights: workloads::WeightStorage,
    /// Activations recomputed in the backward pass.
    pub recompute: Recompute,
    /// Which passes of the step run (`workload.passes`): the whole training step, or its
    /// forward pass alone.
    pub passes: passes::Passes,
    /// Samples per iteration over all data-parallel replicas.
    pub global_batch: u64,
    /// Samples per micro-batch.
    pub micro_batch: u64,
    /// How the model is split.
    pub parallelism: Parallelism,
    /// Iterations to chain.
    pub iterations: u32,
    /// Simulate one rank per set of ranks that do the same work at the same times (tensor
    /// ranks, data-parallel replicas) and replay its traffic on the others: the same result on
    /// a symmetric fabric, far fewer ops.
    pub fold_symmetric_ranks: bool,
    /// The data loader, if modelled (`[workload.input]`).
    pub input: Option<&'a workloads::input::InputPipeline>,
    /// Local layers and kernel times shared with other strategies on the same model, device
    /// and compute model (a search's configurations), if any: the same results, computed once
    /// per split.
    pub layer_tables: Option<&'a LayerTables<'a>>,
    /// Which normalization kernels run fused: the lowering prices each rank's layers with
    /// the fused kernels' traffic ([`workloads::fusion`]).
    pub fusion: workloads::fusion::Fusion,
    /// Group batch norm: how many GPUs share each batch norm's statistics and what their
    /// exchanges cost ([`workloads::groupbn`]); [`BatchNormGroup::NONE`](workloads::groupbn::BatchNormGroup::NONE)
    /// for none.
    pub batch_norm_group: workloads::groupbn::BatchNormGroup,
    /// The kernels the optimizer step runs around its update rule (`compute.optimizer-passes`).
    pub optimizer_passes: workloads::optimizer::OptimizerPasses,
    /// How micro-batches' weight gradients add up (`compute.gradient-accumulation`).
    pub gradient_accumulation: workloads::optimizer::GradientAccumulation,
    /// Muon's settings (`[workload.muon]`), read when `optimizer` is Muon.
    pub muon: workloads::muon::Muon,
    /// The layer ranges of the pipeline chunks, if the caller sets them (one per chunk):
    /// a cluster of mixed devices lowers once per device with one split for all, balanced
    /// to the stages' devices ([`Strategy::stage_layers_by_speed`]). `None`: the split by
    /// compute on this strategy's device (or the uneven first and last stage).
    pub chunk_layers: Option<&'a [std::ops::Range<usize>]>,
    /// The host CPU that runs a host-side optimizer step (`workload.offload = "optimizer"`),
    /// as one GPU's process gets it: the node's CPUs with their memory bandwidth and peak rates
    /// divided by the GPUs per node, whose processes step at once. `None` where nothing runs
    /// on the host CPU.
    pub host_cpu: Option<&'a Device>,
    /// Where a host optimizer keeps its fp32 weights and states (`workload.offload-device =
    /// "nvme"`, ZeRO-Infinity): `Some` with one GPU's process's share of the node's NVMe
    /// bandwidth (read and write alike); `None` in host memory.
    pub nvme: Option<sim_core::units::Bandwidth>,
}

/// Muon spread round-robin: the bytes of the all-reduce of the updates after a stage's step and
/// the time to apply them; `None` for every other step.
pub(crate) type MuonExchange = Option<(Bytes, SimDuration)>;

/// One gradient bucket: which layers' gradients it carries and how many bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Indexes into the model's layers, in the order their gradients become ready.
    pub layers: Vec<usize>,
    /// Gradient bytes.
    pub bytes: Bytes,
}

/// One pipeline stage as the report shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct StageSummary {
    /// Stage index.
    pub stage: u32,
    /// The model layers of each of its chunks.
    pub layers: Vec<Range<usize>>,
    /// Numbered blocks (transformer layers, residual blocks) it holds.
    pub blocks: usize,
    /// Parameters one of its GPUs holds (after tensor and expert splitting, before ZeRO).
    pub parameters: u64,
    /// FLOPs one of its GPUs runs per iteration, recomputation not included.
    pub flops: f64,
    /// What one of its GPUs holds at its peak.
    pub memory: MemoryBreakdown,
    /// Micro-batches whose activations it holds at its peak (in chunk units: a full stage).
    pub peak_micro_batches_in_flight: f64,
}

/// One step of a rank's schedule (a micro-batch's forward or backward of one chunk), for the
/// timeline export: the compute ops from `first` to `last`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleSpan {
    /// The rank.
    pub rank: sim_core::graph::RankId,
    /// `"F12"`, `"B12"`, `"F12 chunk 1"`.
    pub name: String,
    /// Its first compute op.
    pub first: OpId,
    /// Its last compute op.
    pub last: OpId,
}

/// What the report needs of a lowering besides its graph ([`Lowered`]'s fields of the same
/// names), for a streamed run.
#[derive(Debug, Clone)]
pub struct LoweredInfo {
    /// The ranks that have ops, in the order of [`IterationOps::ends`].
    pub ranks: Vec<sim_core::graph::RankId>,
    /// Gradient buckets of one iteration (stage 0).
    pub buckets: Vec<Bucket>,
    /// Gradient bytes one rank synchronises per iteration (stage 0).
    pub gradient_bytes: u64,
    /// Mean FLOPs per rank and iteration, recomputation not included.
    pub flops_per_rank_iteration: f64,
    /// Mean FLOPs recomputation adds per rank and iteration.
    pub recompute_flops_per_rank_iteration: f64,
    /// Micro-batches per iteration per data-parallel replica.
    pub micro_batches: u32,
    /// The stages.
    pub stages: Vec<StageSummary>,
    /// Out-of-core training totals.
    pub offload: Option<OffloadTotals>,
}

/// The iterations of a streamed lowering ([`Strategy::lower_streaming`]), one chunk each; it
/// keeps what each iteration's ops are ([`IterationOps`]) until told to forget them.
pub struct IterationSource<'a> {
    lowering: Box<emit::Lowering<'a, 'a>>,
    remaining: u32,
    iterations: std::collections::VecDeque<IterationOps>,
    /// The index of `iterations[0]`.
    first: u32,
}

impl IterationSource<'_> {
    /// Iteration `index`'s ends and spans, if lowered and not forgotten.
    pub fn iteration(&self, index: u32) -> Option<&IterationOps> {
        self.iterations.get(index.checked_sub(self.first)? as usize)
    }

    /// Forgets the iterations before `index`.
    pub fn forget_before(&mut self, index: u32) {
        while self.first < index && self.iterations.pop_front().is_some() {
            self.first += 1;
        }
    }
}

impl sim_core::stream::ChunkSource for IterationSource<'_> {
    type Error = StrategyError;

    fn next_chunk(&mut self, graph: &mut sim_core::graph::GraphBuilder) -> Result<bool, StrategyError> {
        if self.remaining == 0 {
            return Ok(false);
        }
        self.remaining -= 1;
        let iteration = self.lowering.iteration_into(graph)?;
        self.iterations.push_back(iteration);
        Ok(true)
    }
}

/// The lowered graph plus what the report needs to interpret it.
#[derive(Debug, Clone)]
pub struct Lowered {
    /// The execution graph.
    pub graph: ExecGraph,
    /// The ranks that have ops (all of them, or one per folded set of symmetric ranks);
    /// `iteration_ends` and `pipeline_ends` list their ops in this order.
    pub ranks: Vec<sim_core::graph::RankId>,
    /// Every schedule step of every simulated rank.
    pub spans: Vec<ScheduleSpan>,
    /// For each iteration, the last op of every simulated rank: the iteration is over when the
    /// last of them ends.
    pub iteration_ends: Vec<Vec<OpId>>,
    /// For each iteration, the last pipeline compute op (last backward kernel) of every rank:
    /// idle time before it is pipeline bubble, after it waiting for synchronisation.
    pub pipeline_ends: Vec<Vec<OpId>>,
    /// Gradient buckets of one iteration (of stage 0's chunks; for the report).
    pub buckets: Vec<Bucket>,
    /// Gradient bytes one rank synchronises per iteration (stage 0).
    pub gradient_bytes: u64,
    /// Mean over ranks of the FLOPs one rank executes per iteration (forward, backward,
    /// optimizer; recomputation not included).
    pub flops_per_rank_iteration: f64,
    /// Mean over ranks of the FLOPs recomputation adds per iteration.
    pub recompute_flops_per_rank_iteration: f64,
    /// Micro-batches per iteration per data-parallel replica.
    pub micro_batches: u32,
    /// The stages.
    pub stages: Vec<StageSummary>,
    /// Out-of-core training: what one GPU moves and keeps in host memory.
    pub offload: Option<OffloadTotals>,
}

impl Lowered {
    /// What the report needs of the lowering besides its graph and timing ops.
    pub fn info(&self) -> LoweredInfo {
        LoweredInfo {
            ranks: self.ranks.clone(),
            buckets: self.buckets.clone(),
            gradient_bytes: self.gradient_bytes,
            flops_per_rank_iteration: self.flops_per_rank_iteration,
            recompute_flops_per_rank_iteration: self.recompute_flops_per_rank_iteration,
            micro_batches: self.micro_batches,
            stages: self.stages.clone(),
            offload: self.offload,
        }
    }
}

/// What out-of-core training moves over one GPU's host link and keeps in host memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OffloadTotals {
    /// Bytes copied to host memory per iteration (all of the parts below that go out).
    pub to_host_bytes: u64,
    /// Bytes prefetched back per iteration (all of the parts below that come in).
    pub to_device_bytes: u64,
    /// Saved activation bytes copied out, and as many back, per iteration.
    pub activation_bytes: u64,
    /// Weight bytes prefetched per iteration: before each layer's forward and its backward
    /// (`"activations+weights"`), or the updated working weights a host optimizer sends back
    /// (`"optimizer"`); 0 otherwise.
    pub weight_bytes: u64,
    /// Gradient bytes written to host memory per iteration (after their synchronisation; a
    /// host optimizer's shard of them under ZeRO-1/2).
    pub gradient_bytes: u64,
    /// Bytes the optimizer step streams in (gradients, fp32 weights, optimizer state).
    pub optimizer_to_device_bytes: u64,
    /// Bytes the optimizer step streams out (fp32 weights, optimizer state, and the working
    /// weights when they are narrower).
    pub optimizer_to_host_bytes: u64,
    /// Host memory one GPU's offloaded data occupies at its peak: one micro-batch's
    /// activations, and (weights offloaded) the weights, gradients and optimizer state.
    pub host_bytes: u64,
    /// The host CPU's optimizer step per iteration (`"optimizer"`; zero otherwise).
    pub host_step: SimDuration,
    /// Bytes a host optimizer reads from and writes to NVMe per iteration (its fp32 weights
    /// and states each way; 0 with them in host memory).
    pub nvme_bytes: u64,
    /// Of [`OffloadTotals::nvme_bytes`], those read (the state before each step, and with
    /// `"optimizer+parameters"` each weights' shard before its fetch).
    pub nvme_read_bytes: u64,
    /// The device memory the same configuration needs without offloading.
    pub without: MemoryBreakdown,
}

/// What a strategy costs before any simulation: per-stage memory and a lower bound of the
/// iteration time ([`Strategy::estimate`]); what `parasim plan` screens configurations with.
#[derive(Debug, Clone)]
pub struct Estimate {
    /// Memory and layers of every pipeline stage (as [`Lowered::stages`]).
    pub stages: Vec<StageSummary>,
    /// Micro-batches per iteration per data-parallel replica.
    pub micro_batches: u32,
    /// No simulation of this strategy takes less per iteration: the busiest stage's kernels
    /// and the layer collectives they wait for, plus the pipeline's fill and drain.
    pub time_lower_bound: SimDuration,
    /// Mean over ranks of the FLOPs one rank executes per iteration.
    pub flops_per_rank_iteration: f64,
}

impl Estimate {
    /// The memory of the most loaded stage.
    pub fn peak_memory(&self) -> MemoryBreakdown {
        self.stages.iter().map(|stage| stage.memory).max_by_key(|memory| memory.total()).unwrap_or_default()
    }
}

/// What one data loader handles per iteration (`[workload.input]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputBatch {
    /// Samples of the replica's batch, which the loader loads.
    pub samples: u64,
    /// Bytes a per-group loader broadcasts to its model-parallel group; `None` when nothing is
    /// broadcast (per-rank loaders, or a group of one rank, which loads for itself).
    pub broadcast: Option<Bytes>,
}

impl Strategy<'_> {
    /// The data loader and its batch, if one is modelled: what the lowering emits and the
    /// report shows.
    pub fn input_batch(&self) -> Option<(&workloads::input::InputPipeline, InputBatch)> {
        let input = self.input.filter(|input| input.loader != workloads::input::Loader::None)?;
        let p = &self.parallelism;
        let samples = self.global_batch / u64::from(p.data.max(1));
        let broadcast = (input.loader == workloads::input::Loader::PerGroup
            && p.layout().size(Axis::Tensor) > 1)
            .then(|| Bytes(input.bytes_per_sample(self.model.input.elements()).0.saturating_mul(samples)));
        Some((input, InputBatch { samples, broadcast }))
    }

    /// Bytes each rank of the first pipeline stage copies from host memory to its device at
    /// the start of every iteration, on the compute stream ([`workloads::input::InputCopy`]): the
    /// replica's batch (every rank of a model-parallel group gets the whole batch, as
    /// ChainerMN's multi-node iterator hands it over). `None` unless the copy is modelled.
    pub fn input_copy_bytes(&self) -> Option<Bytes> {
        let input = self.input.filter(|input| input.copy == workloads::input::InputCopy::ComputeStream)?;
        let samples = self.global_batch / u64::from(self.parallelism.data.max(1));
        Some(Bytes(input.bytes_per_sample(self.model.input.elements()).0.saturating_mul(samples)))
    }

    /// Micro-batches each replica runs per iteration, or why the batch does not divide.
    pub fn micro_batches(&self) -> Result<u32, StrategyError> {
        let p = &self.parallelism;
        if self.global_batch == 0 {
            return Err(invalid("workload.global-batch", "must be at least 1, got 0".into()));
        }
        if self.micro_batch == 0 {
            return Err(invalid("workload.micro-batch", "must be at least 1, got 0".into()));
        }
        let per_replica = u64::from(p.data) * self.micro_batch;
        if self.global_batch % per_replica != 0 {
            return Err(invalid(
                "workload.global-batch",
                format!(
                    "is {}, which does not divide into micro-batches of {} over {} data-parallel replicas: \
                     make it a multiple of micro-batch x data = {per_replica}",
                    self.global_batch, self.micro_batch, p.data
                ),
            ));
        }
        let micro_batches = self.global_batch / per_replica;
        u32::try_from(micro_batches).map_err(|_| {
            invalid(
                "workload.global-batch",
                format!("gives {micro_batches} micro-batches per replica; at most {}", u32::MAX),
            )
        })
    }

    /// Checks every degree and combination, with messages that say what would be valid.
    pub fn check(&self) -> Result<(), StrategyError> {
        let p = &self.parallelism;
        for (key, value) in [
            ("parallelism.data", p.data),
            ("parallelism.tensor", p.tensor),
            ("parallelism.pipeline", p.pipeline),
            ("parallelism.virtual-stages", p.virtual_stages),
            ("parallelism.context", p.context),
            ("parallelism.expert", p.expert),
            ("parallelism.filter", p.filter),
            ("parallelism.channel", p.channel),
            ("parallelism.spatial", p.spatial),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be at least 1, got 0".into()));
            }
        }
        if self.optimizer == Optimizer::Muon {
            self.check_muon()?;
        }
        if self.batch_norm_group.is_grouped() && !p.is_data_parallel() {
            return Err(invalid(
                "parallelism.batch-norm-group",
                format!(
                    "is {}; group batch norm is modelled for plain data parallelism only (no tensor, pipeline, context, expert, ZeRO or CNN split)",
                    self.batch_norm_group.size
                ),
            ));
        }
        let cnn_strategies: Vec<&str> =
            [("filter", p.filter), ("channel", p.channel), ("spatial", p.spatial)]
                .iter()
                .filter(|(_, degree)| *degree > 1)
                .map(|(name, _)| *name)
                .collect();
        if cnn_strategies.len() > 1 {
            return Err(invalid(
                "parallelism.filter",
                format!(
                    "{} are all above 1; one CNN strategy per group: give one of filter, channel, spatial \
                     (combined with data parallelism across groups)",
                    cnn_strategies.join(" and ")
                ),
            ));
        }
        if let Some(name) = cnn_strategies.first() {
            let key = match *name {
                "filter" => "parallelism.filter",
                "channel" => "parallelism.channel",
                _ => "parallelism.spatial",
            };
            for (other, degree) in
                [("tensor", p.tensor), ("pipeline", p.pipeline), ("context", p.context), ("expert", p.expert)]
            {
                if degree > 1 {
                    return Err(invalid(
                        key,
                        format!(
                            "{name} parallelism with {other} = {degree} is not supported yet: combine {name} \
                             with data parallelism only (set {other} = 1)"
                        ),
                    ));
                }
            }
            if p.zero > 0 {
                return Err(invalid(
                    key,
                    format!(
                        "{name} parallelism with ZeRO (zero = {}) is not supported yet: set zero = 0",
                        p.zero
                    ),
                ));
            }
        }
        if self.iterations == 0 {
            return Err(invalid("simulation.iterations", "must be at least 1, got 0".into()));
        }
        self.check_daso()?;
        self.check_offload()?;
        if p.zero_implementation == ZeroImplementation::DeepSpeed {
            let mut other: Vec<String> = self
                .other_degrees()
                .split(", ")
                .filter(|used| !used.is_empty() && *used != "zero = 3")
                .map(str::to_string)
                .collect();
            // other_degrees names a stage other than 3 already, but not zero = 0.
            if p.zero == 0 {
                other.push("zero = 0".into());
            }
            if p.offload != Offload::None {
                other.push(format!("offload = {:?}", p.offload.name()));
            }
            if !other.is_empty() {
                return Err(invalid(
                    "parallelism.zero-implementation",
                    format!(
                        "\"deepspeed\" is modelled for ZeRO-3 with data parallelism only (DeepSpeed v0.3.14's \
                         stage 3), but {}: set zero = 3 and every other degree to 1, or \
                         zero-implementation = \"fsdp\"",
                        other.join(", ")
                    ),
                ));
            }
        }
        if let ContextComm::A2aP2p { a2a } = p.context_comm
            && (a2a < 2 || a2a >= p.context || p.context % a2a != 0)
        {
            return Err(invalid(
                "parallelism.hierarchical-context-sizes",
                format!(
                    "splits context = {} into all-to-all groups of {a2a}: a2a+p2p needs an all-to-all size \
                     of at least 2 that divides the context degree and leaves a ring of at least 2",
                    p.context
                ),
            ));
        }
        if p.context_comm != ContextComm::P2p && p.context > 1 {
            let a2a = p.split().context_a2a;
            let ways = u64::from(p.tensor * a2a);
            for layer in &self.model.layers {
                if let workloads::layer::LayerKind::Attention { heads, kv_heads, .. } = layer.kind
                    && (heads % ways != 0 || kv_heads % ways != 0)
                {
                    return Err(invalid(
                        "parallelism.context-comm",
                        format!(
                            "trades heads for sequence over {a2a} ranks, but {} has {heads} query and {kv_heads} key/value heads, \
                             which tensor x all-to-all ranks = {} must divide",
                            layer.name, ways
                        ),
                    ));
                }
            }
        }
        if p.defer_embedding_wgrad.is_some() {
            // Megatron-Core's own checks (megatron/core/model_parallel_config.py).
            if p.pipeline < 2 {
                return Err(invalid(
                    "parallelism.defer-embedding-wgrad",
                    "defers the output layer's weight gradients into the pipeline's flush, which needs pipeline > 1".into(),
                ));
            }
            if self.gradient_accumulation != workloads::optimizer::GradientAccumulation::InKernel {
                return Err(invalid(
                    "parallelism.defer-embedding-wgrad",
                    "needs compute.gradient-accumulation = \"in-kernel\" (Megatron-Core refuses it without gradient accumulation fusion)".into(),
                ));
            }
            if p.schedule.splits_backward() {
                return Err(invalid(
                    "parallelism.defer-embedding-wgrad",
                    format!(
                        "is modelled with the 1F1B schedules; {} already postpones weight gradients",
                        p.schedule.name()
                    ),
                ));
            }
        }
        let instances = p.distributed_optimizer_instances;
        if instances == 0 {
            return Err(invalid(
                "parallelism.distributed-optimizer-instances",
                "must be at least 1, got 0".into(),
            ));
        }
        if instances > 1 {
            if p.zero != 1 {
                return Err(invalid(
                    "parallelism.distributed-optimizer-instances",
                    format!(
                        "is {instances}: partial distributed optimizers shard Megatron's distributed optimizer \
                         (zero = 1), but zero = {}",
                        p.zero
                    ),
                ));
            }
            let ranks = p.data * p.context;
            if ranks % instances != 0 || p.spatial > 1 {
                return Err(invalid(
                    "parallelism.distributed-optimizer-instances",
                    format!(
                        "is {instances}, which must divide the data-parallel ranks (data x context = {ranks}) \
                         without spatial parallelism"
                    ),
                ));
            }
            let expert_data = p.layout().expert_data_group(sim_core::graph::RankId(0)).len() as u32;
            if (p.expert > 1 || p.expert_tensor_degree() != p.tensor) && expert_data % instances != 0 {
                return Err(invalid(
                    "parallelism.distributed-optimizer-instances",
                    format!(
                        "is {instances}, which must also divide the expert-data-parallel ranks ({expert_data})"
                    ),
                ));
            }
        }
        if p.zero > 3 {
            return Err(invalid(
                "parallelism.zero",
                format!(
                    "is {}; ZeRO stages are 0 (none), 1 (optimizer state), 2 (+ gradients), 3 (+ parameters)",
                    p.zero
                ),
            ));
        }
        if p.expert_tensor == Some(0) {
            return Err(invalid("parallelism.expert-tensor", "must be at least 1, got 0".into()));
        }
        if p.experts_apart() {
            // Megatron-Core's expert rank generator: its refusals, with the key of the degree
            // that would change the layout.
            if let Some(message) = p.layout().expert_layout_error() {
                let key = if p.expert > 1 { "parallelism.expert" } else { "parallelism.expert-tensor" };
                return Err(invalid(key, message));
            }
        } else if u64::from(p.data) * u64::from(p.context) % u64::from(p.expert) != 0 {
            return Err(invalid(
                "parallelism.expert",
                format!(
                    "is {}, but expert groups are carved out of data x context = {} ranks: the expert \
                     degree must divide it",
                    p.expert,
                    p.data * p.context
                ),
            ));
        }
        shard::check(self.model, p.split()).map_err(|error| match error {
            ShardError::Invalid { key, message } => invalid(shard_key(key), message),
            other => StrategyError::Shard(other),
        })?;
        let micro_batches = self.micro_batches()?;
        let blocks = self.model.pipeline_units().len();
        // DualPipe's two copies split the model into `pipeline` chunks, not twice as many.
        let chunks = pipeline::ChunkMap::new(p.schedule, p.pipeline, p.virtual_stages).partitions();
        // Padded layers, or an embedding and a loss counted in the split, may leave the end
        // chunks without a block (checked below).
        let accounted = p.account_for_embedding || p.account_for_loss;
        if chunks > 1 && blocks < chunks as usize && !p.pad_layers && !accounted {
            return Err(invalid(
                if p.virtual_stages > 1 { "parallelism.virtual-stages" } else { "parallelism.pipeline" },
                format!(
                    "pipeline x virtual-stages = {chunks} model chunks, but model {} has {blocks} units to \
                     split (numbered blocks such as transformer layers or residual blocks, else layers \
                     with parameters): at most {blocks} chunks",
                    self.model.name
                ),
            ));
        }
        pipeline::check_schedule(p.schedule, p.pipeline, p.virtual_stages, p.microbatch_group, micro_batches)
            .map_err(|message| {
                let key = if p.microbatch_group.is_some() && message.starts_with("microbatch-group-size") {
                    "parallelism.microbatch-group-size"
                } else if p.schedule.two_chunks() {
                    if message.contains("set virtual-stages") {
                        "parallelism.virtual-stages"
                    } else if message.contains("pipeline degree") || message.contains("needs pipeline") {
                        "parallelism.pipeline"
                    } else {
                        "parallelism.schedule"
                    }
                } else if p.virtual_stages > 1 {
                    "parallelism.virtual-stages"
                } else {
                    "parallelism.schedule"
                };
                invalid(key, message)
            })?;
        if p.pad_layers {
            if p.first_stage_layers.is_some() || p.last_stage_layers.is_some() {
                return Err(invalid(
                    "parallelism.pad-layers",
                    "is true, but first-stage-layers or last-stage-layers already set the split: set one \
                     or the other"
                        .into(),
                ));
            }
            if p.schedule == PipelineSchedule::DualPipe {
                return Err(invalid(
                    "parallelism.pad-layers",
                    "is true, but DualPipe's two model copies are split by its own rule: set pad-layers = \
                     false"
                        .into(),
                ));
            }
            if self.model.blocks().iter().all(Option::is_none) {
                return Err(invalid(
                    "parallelism.pad-layers",
                    format!(
                        "is true, but {} has no numbered blocks (transformer layers) to pad: set pad-layers = \
                         false",
                        self.model.name
                    ),
                ));
            }
            let sizes = pipeline::padded_sizes(blocks, p.pipeline as usize, p.virtual_stages as usize)
                .map_err(|message| invalid("parallelism.pad-layers", message))?;
            // An end chunk without a block holds the stem or the head: the model needs one.
            let ranges = pipeline::chunk_ranges(self.model, &sizes);
            if let Some(empty) = ranges.iter().position(|range| range.is_empty()) {
                return Err(invalid(
                    "parallelism.pad-layers",
                    format!(
                        "leaves chunk {empty} of {} with no layer: {} has no {} beside its blocks for it \
                         (the repository runs a no-op layer there, which parasim does not model): set \
                         pad-layers = false",
                        ranges.len(),
                        self.model.name,
                        if empty == 0 { "embedding" } else { "output layer" }
                    ),
                ));
            }
        }
        if accounted {
            let key = if p.account_for_embedding {
                "parallelism.account-for-embedding"
            } else {
                "parallelism.account-for-loss"
            };
            // Megatron-Core refuses the other split settings beside these (TransformerConfig's
            // `__post_init__` at d98e8a64dd).
            let other = if p.pad_layers {
                Some("pad-layers")
            } else if p.first_stage_layers.is_some() {
                Some("first-stage-layers")
            } else if p.last_stage_layers.is_some() {
                Some("last-stage-layers")
            } else {
                None
            };
            if let Some(other) = other {
                return Err(invalid(
                    key,
                    format!(
                        "is true, but {other} already sets the split (Megatron-Core refuses both): set one or the other"
                    ),
                ));
            }
            if p.schedule == PipelineSchedule::DualPipe {
                return Err(invalid(
                    key,
                    "is true, but DualPipe's two model copies are split by its own rule: set it to false"
                        .into(),
                ));
            }
            if self.model.blocks().iter().all(Option::is_none) {
                return Err(invalid(
                    key,
                    format!(
                        "is true, but {} has no numbered blocks (transformer layers) to split: set it to false",
                        self.model.name
                    ),
                ));
            }
            let sizes = pipeline::accounted_sizes(
                blocks,
                p.pipeline as usize,
                p.virtual_stages as usize,
                p.account_for_embedding,
                p.account_for_loss,
            )
            .map_err(|message| invalid(key, message))?;
            let ranges = pipeline::chunk_ranges(self.model, &sizes);
            if let Some(empty) = ranges.iter().position(|range| range.is_empty()) {
                return Err(invalid(
                    key,
                    format!(
                        "leaves chunk {empty} of {} with no layer: {} has no {} beside its blocks to stand \
                         for the counted layer: set it to false",
                        ranges.len(),
                        self.model.name,
                        if empty == 0 { "embedding" } else { "output layer" }
                    ),
                ));
            }
        }
        if p.first_stage_layers.is_some() || p.last_stage_layers.is_some() {
            let key = if p.first_stage_layers.is_some() {
                "parallelism.first-stage-layers"
            } else {
                "parallelism.last-stage-layers"
            };
            if p.virtual_stages > 1 {
                return Err(invalid(
                    key,
                    "an uneven first or last stage is modelled with virtual-stages = 1 only".into(),
                ));
            }
            pipeline::uneven_sizes(blocks, p.pipeline as usize, p.first_stage_layers, p.last_stage_layers)
                .map_err(|message| invalid(key, message))?;
        }
        self.check_moe_overlap()?;
        self.check_deepep()?;
        if p.schedule.splits_backward() && (p.zero >= 3 || p.offload != Offload::None) {
            return Err(invalid(
                "parallelism.schedule",
                format!(
                    "{:?} splits the backward into input- and weight-gradient passes, modelled with \
                     DDP, ZeRO-1/2 and DASO without offload; this strategy has {}: use schedule = \
                     \"1f1b\", or zero <= 2 and offload = \"none\"",
                    p.schedule.name(),
                    if p.zero >= 3 {
                        format!("zero = {}", p.zero)
                    } else {
                        format!("offload = {:?}", p.offload.name())
                    }
                ),
            ));
        }
        Ok(())
    }

    /// The degrees in use other than data parallelism (`"tensor = 2, zero = 1"`), empty for
    /// plain data parallelism: what DASO and out-of-core training do not combine with yet.
    fn other_degrees(&self) -> String {
        self.other_degrees_than(&[])
    }

    /// [`Strategy::other_degrees`] leaving out the axes `allowed` (`"zero"` for the ZeRO stage).
    fn other_degrees_than(&self, allowed: &[&str]) -> String {
        let p = &self.parallelism;
        let mut used: Vec<String> = [
            ("tensor", p.tensor),
            ("pipeline", p.pipeline),
            ("context", p.context),
            ("expert", p.expert),
            ("filter", p.filter),
            ("channel", p.channel),
            ("spatial", p.spatial),
        ]
        .iter()
        .filter(|(name, degree)| *degree > 1 && !allowed.contains(name))
        .map(|(name, degree)| format!("{name} = {degree}"))
        .collect();
        if p.zero > 0 && !allowed.contains(&"zero") {
            used.push(format!("zero = {}", p.zero));
        }
        used.join(", ")
    }

    /// `moe-overlap`: Megatron-Core's own checks (megatron/core/transformer/transformer_config.py,
    /// `overlap_moe_expert_parallel_comm` at d98e8a64dd: expert parallelism, the all-to-all
    /// dispatcher, no full recomputation, bf16 or fp16), and what parasim models of it: no
    /// pipeline (Megatron's pipelined form needs virtual stages and pairs the steady state's
    /// forward and backward across chunks, not modelled), a bucketed gradient policy (DDP,
    /// ZeRO-1/2) and no offload.
    fn check_moe_overlap(&self) -> Result<(), StrategyError> {
        let p = &self.parallelism;
        if !p.moe_overlap {
            return Ok(());
        }
        let refuse = |why: String| Err(invalid("parallelism.moe-overlap", why));
        if p.expert < 2 {
            return refuse(format!(
                "overlaps the expert all-to-alls of one micro-batch with another's computation: it needs \
                 expert >= 2 (Megatron-Core: \"only supported with expert model parallelism\"), got expert = {}",
                p.expert
            ));
        }
        if p.moe_dispatcher == MoeDispatcher::AllGather {
            return refuse(format!(
                "needs moe-dispatcher = \"all-to-all\" or \"deepep\" (Megatron-Core supports the alltoall \
                 and flex dispatchers only), got {:?}",
                p.moe_dispatcher.name()
            ));
        }
        if self.recompute == Recompute::Full {
            return refuse(
                "cannot run with full recomputation (Megatron-Core: \"disable full recomputation when \
                 enabling overlap_moe_expert_parallel_comm\"); use recompute = \"none\" or \"selective\""
                    .into(),
            );
        }
        if matches!(self.precision, Dtype::Fp64 | Dtype::Fp32 | Dtype::Tf32) {
            return refuse(format!(
                "needs bf16 or fp16 training (Megatron-Core's check), got precision {:?}",
                self.precision.name()
            ));
        }
        if p.schedule != PipelineSchedule::OneFOneB || (p.pipeline > 1 && p.virtual_stages < 2) {
            return refuse(format!(
                "merges 1F1B's steps: with pipeline = {} it needs the interleaved 1F1B schedule (schedule = \"1f1b\", \
                 virtual-stages >= 2; Megatron-Core: \"virtual_pipeline_model_parallel_size must be \
                 specified when pipeline_model_parallel_size > 1\"), got schedule {:?} with \
                 virtual-stages = {}",
                p.pipeline,
                p.schedule.name(),
                p.virtual_stages
            ));
        }
        if p.zero >= 3 || p.offload != Offload::None || !matches!(p.sync, GradientSync::AllReduce) {
            return refuse(
                "is modelled with DDP and ZeRO-1/2 (Megatron's distributed optimizer) without offload: \
                 set zero <= 2, offload = \"none\" and sync = \"allreduce\""
                    .into(),
            );
        }
        Ok(())
    }

    /// A DeepEP-style dispatcher: the expert group holds the same number of ranks on every node
    /// it spans (its two hops are the node part and the rail of equal size).
    fn check_deepep(&self) -> Result<(), StrategyError> {
        let p = &self.parallelism;
        if p.moe_dispatcher != MoeDispatcher::DeepEp || p.expert < 2 {
            return Ok(());
        }
        if p.expert_tensor_degree() != p.tensor {
            return Err(invalid(
                "parallelism.moe-dispatcher",
                format!(
                    "\"deepep\" is modelled with the experts split like the dense layers: expert-tensor = \
                     {} differs from tensor = {}; leave expert-tensor out or use \"all-to-all\"",
                    p.expert_tensor_degree(),
                    p.tensor
                ),
            ));
        }
        let layout = p.layout();
        let node = p.moe_node.max(1);
        for rank in (0..layout.ranks()).map(sim_core::graph::RankId) {
            let group = layout.expert_group(rank);
            let here = layout.expert_node_group(rank, node).len();
            let nodes = layout.expert_rail_group(rank, node).len();
            if here * nodes != group.len() {
                return Err(invalid(
                    "parallelism.moe-dispatcher",
                    format!(
                        "\"deepep\" sends each token over the network to one GPU per node and then over \
                         NVLink inside it, so the expert group must hold the same number of ranks on each \
                         node it spans; rank {}'s group of {} has {here} on its node of {node} GPUs and \
                         {nodes} at its local index: choose expert and tensor degrees that divide the node \
                         or are multiples of it",
                        rank.0,
                        group.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// DASO: data parallelism only, over several multi-GPU nodes, simulated over whole global
    /// intervals.
    fn check_daso(&self) -> Result<(), StrategyError> {
        let p = &self.parallelism;
        let GradientSync::Daso { every, blocking, wait, node } = p.sync else {
            return Ok(());
        };
        let others = self.other_degrees();
        if !others.is_empty() {
            return Err(invalid(
                "parallelism.sync",
                format!(
                    "\"daso\" synchronises data-parallel replicas only, but {others}: with DASO set every \
                     other degree to 1 and zero = 0"
                ),
            ));
        }
        if node < 2 {
            return Err(invalid(
                "parallelism.sync",
                format!(
                    "\"daso\" needs multi-GPU nodes (its node-local allreduce runs over the GPUs of a node), \
                     but cluster.gpus-per-node = {node}: give at least 2 GPUs per node, or sync = \"allreduce\""
                ),
            ));
        }
        if p.data % node != 0 || p.data / node < 2 {
            return Err(invalid(
                "parallelism.sync",
                format!(
                    "\"daso\" needs at least 2 whole nodes of {node} GPUs (its global allreduce runs across \
                     nodes), but data = {}: use more nodes, or sync = \"allreduce\"",
                    p.data
                ),
            ));
        }
        if every == 0 {
            return Err(invalid("parallelism.global-sync-every", "must be at least 1, got 0".into()));
        }
        if !blocking && !(1..=every).contains(&wait) {
            return Err(invalid(
                "parallelism.global-sync-wait",
                format!("is {wait}; valid: 1..={every} (at most global-sync-every)"),
            ));
        }
        if self.iterations % every != 0 {
            let valid: Vec<String> = (1..=3).map(|n| (n * every).to_string()).collect();
            return Err(invalid(
                "simulation.iterations",
                format!(
                    "is {}, but DASO synchronises globally every {every} iterations: simulate whole intervals \
                     so that the mean per iteration is the steady state's (iterations = {}, ...; at most {})",
                    self.iterations,
                    valid.join(", "),
                    MAX_SIMULATED_ITERATIONS / every * every
                ),
            ));
        }
        Ok(())
    }

    /// Out-of-core training: data, tensor and pipeline parallelism (each rank offloads what it
    /// holds; the weights not on a pipeline), without recomputation.
    fn check_offload(&self) -> Result<(), StrategyError> {
        let p = &self.parallelism;
        if self.nvme.is_some() && !p.offload.host_optimizer() {
            return Err(invalid(
                "workload.offload-device",
                format!(
                    "is \"nvme\", which keeps a host optimizer's state (and with \"optimizer+parameters\" \
                     the weights' shards) on NVMe, but offload = {:?} runs no optimizer on the host: set \
                     offload = \"optimizer\", \"activations+optimizer\" or \"optimizer+parameters\", or \
                     offload-device = \"cpu\"",
                    p.offload.name()
                ),
            ));
        }
        if p.offload == Offload::None {
            return Ok(());
        }
        if p.offload.parameters() && p.zero != 3 {
            return Err(invalid(
                "workload.offload",
                format!(
                    "{:?} keeps each rank's shard of the weights off the device, which needs ZeRO-3's \
                     sharded weights, but zero = {}: set zero = 3, or offload = {:?} (ZeRO-Offload with \
                     ZeRO-0/1/2)",
                    p.offload.name(),
                    p.zero,
                    p.offload.name().trim_end_matches("+parameters")
                ),
            ));
        }
        // ZeRO-Offload is built on ZeRO-2, and ZeRO-Infinity on ZeRO-3: each data-parallel rank
        // steps its shard on the host.
        let allowed: &[&str] = if p.offload.host_optimizer() {
            &["tensor", "pipeline", "zero"]
        } else {
            &["tensor", "pipeline"]
        };
        let others = self.other_degrees_than(allowed);
        if !others.is_empty() {
            return Err(invalid(
                "workload.offload",
                format!(
                    "{:?} is modelled with data, tensor and pipeline parallelism{} only, but {}: \
                     set the other degrees to 1{}, or offload = \"none\"",
                    p.offload.name(),
                    if p.offload.host_optimizer() { " and ZeRO" } else { "" },
                    others,
                    if p.offload.host_optimizer() { "" } else { " and zero = 0" }
                ),
            ));
        }
        if p.offload.host_optimizer() {
            if self.host_cpu.is_none() {
                return Err(invalid(
                    "cluster.host-cpu",
                    format!(
                        "is missing: workload.offload = {:?} runs the optimizer step on the host CPU, so name \
                         the nodes' CPUs (a `kind = \"cpu\"` entry of the device catalog, e.g. \
                         host-cpu = \"epyc-7742-2s\" for a DGX A100), or a cluster.host that names them",
                        p.offload.name()
                    ),
                ));
            }
            if let GradientSync::Daso { .. } = p.sync {
                return Err(invalid(
                    "workload.offload",
                    format!(
                        "{:?} with sync = \"daso\" is not modelled: DASO steps and all-reduces the \
                         parameters on the device; set sync = \"allreduce\"",
                        p.offload.name()
                    ),
                ));
            }
        }
        if p.offload == Offload::ActivationsAndWeights && p.pipeline > 1 {
            return Err(invalid(
                "workload.offload",
                format!(
                    "\"activations+weights\" with pipeline = {} is not modelled: it writes each layer's \
                     gradient to host memory after its backward, which takes one micro-batch per \
                     replica, and a pipeline needs several; use offload = \"activations\" on the \
                     pipeline, or pipeline = 1",
                    p.pipeline
                ),
            ));
        }
        if p.offload == Offload::ActivationsAndWeights {
            if let GradientSync::Daso { .. } = p.sync {
                return Err(invalid(
                    "workload.offload",
                    "\"activations+weights\" with sync = \"daso\" is not modelled: DASO all-reduces the \
                     parameters, which offloading keeps in host memory; set sync = \"allreduce\", or \
                     offload = \"activations\""
                        .into(),
                ));
            }
            let micro_batches = self.micro_batches()?;
            if micro_batches > 1 {
                return Err(invalid(
                    "workload.offload",
                    format!(
                        "\"activations+weights\" with {micro_batches} micro-batches per replica is not \
                         modelled: each layer's gradient is written to host memory after its backward, so it \
                         is not accumulated on the device; run one micro-batch per replica (global-batch = \
                         micro-batch x data = {}), or offload = \"activations\"",
                        self.micro_batch * u64::from(p.data)
                    ),
                ));
            }
        }
        if self.recompute != Recompute::None && p.offload.activations() {
            return Err(invalid(
                "workload.offload",
                format!(
                    "{:?} with recompute = \"{}\" is not modelled: offloading keeps every activation \
                     (in host memory), so set recompute = \"none\"",
                    p.offload.name(),
                    self.recompute
                ),
            ));
        }
        Ok(())
    }

    /// The memory plan of the whole model under this strategy (shared settings; stages take
    /// their own layers).
    fn memory_plan<'m>(&self, model: &'m Model, buffers: Bytes) -> MemoryPlan<'m> {
        MemoryPlan {
            model,
            precision: self.precision,
            gradient_precision: self.gradient_precision,
            optimizer_precision: self.optimizer_precision,
            optimizer: self.optimizer,
            weights: self.weights,
            micro_batch: self.micro_batch,
            micro_batches_in_flight: 1,
            recompute: self.recompute,
            sharding: self.parallelism.sharding(),
            communication_buffers: buffers,
        }
    }

    /// The layer ranges of the pipeline chunks as [`Strategy::lower`] splits them (one
    /// range without a pipeline).
    pub fn chunk_layer_ranges(&self) -> Result<Vec<Range<usize>>, StrategyError> {
        self.check()?;
        emit::chunk_layers(self)
    }

    /// The layer ranges of the pipeline stages (one chunk per stage) balanced to each stage's
    /// devices: `stages[s]` holds the strategy as each device type of stage `s` runs it, and
    /// the split makes the longest stage's kernel time, a unit priced on the stage's slowest
    /// device for it, as short as possible (whole units: numbered blocks, the embedding with
    /// the first, the output layer with the last). A cluster of mixed devices gives the slower
    /// stages fewer layers.
    pub fn stage_layers_by_speed(stages: &[Vec<&Strategy<'_>>]) -> Result<Vec<Range<usize>>, StrategyError> {
        for strategy in stages.iter().flatten() {
            strategy.check()?;
        }
        emit::stage_layers_by_speed(stages)
    }

    /// Builds the execution graph (and the per-stage memory).
    pub fn lower(&self) -> Result<Lowered, StrategyError> {
        self.check()?;
        emit::lower(self)
    }

    /// Lowers one iteration at a time for a streamed run ([`sim_core::stream`]): `run` gets
    /// what the report needs, the builder that names the graph's labels, groups and symmetry
    /// (no ops yet), and the source of the iterations' ops. The ops are those of
    /// [`Strategy::lower`], id for id; the work budget counts one iteration.
    pub fn lower_streaming<R>(
        &self,
        run: impl FnOnce(LoweredInfo, sim_core::graph::GraphBuilder, &mut IterationSource<'_>) -> R,
    ) -> Result<R, StrategyError> {
        self.check()?;
        emit::lower_streaming(self, run)
    }

    /// Per-stage memory and a lower bound of the iteration time, without building the graph
    /// (milliseconds where lowering a large job takes a second).
    /// `comm_floor` is a lower bound of one layer collective's time (zero is always valid).
    pub fn estimate(&self, comm_floor: &dyn Fn(&Comm) -> SimDuration) -> Result<Estimate, StrategyError> {
        self.check()?;
        emit::estimate(self, comm_floor)
    }

    /// [`Strategy::estimate_checked`] of ranks that may run on any of `strategies`' devices
    /// (the device types of a cluster of mixed devices, each strategy passed
    /// [`Strategy::check`] and with the same split, [`Strategy::chunk_layers`]): the memory of
    /// the first, and a bound that prices each kernel, gradient accumulation and optimizer step
    /// at the fastest of the strategies' times for it, so no simulation of the strategy on any
    /// placement of ranks on those devices comes out faster.
    pub fn estimate_fastest(
        strategies: &[&Strategy<'_>],
        comm_floor: &dyn Fn(&Comm) -> SimDuration,
    ) -> Result<Estimate, StrategyError> {
        emit::estimate_fastest(strategies, comm_floor)
    }

    /// A lower bound of the ops its lowering builds (every iteration's, as the work budget
    /// counts them: kernels and their host launches of each simulated rank), from the kernel
    /// table alone, without a graph. The real graph has more (collectives, sends, the
    /// optimizer), and its memory grows with it: a caller running several jobs at once can
    /// keep the large ones apart.
    pub fn ops_lower_bound(&self) -> Result<u64, StrategyError> {
        self.check()?;
        emit::ops_lower_bound(self)
    }

    /// [`Strategy::estimate`] of a strategy that has passed [`Strategy::check`] (a validated
    /// scenario's has): the check is not run again (a search estimates thousands).
    pub fn estimate_checked(
        &self,
        comm_floor: &dyn Fn(&Comm) -> SimDuration,
    ) -> Result<Estimate, StrategyError> {
        emit::estimate(self, comm_floor)
    }

    /// [`Strategy::estimate_checked`], or `Ok(None)` when `fits` refuses a floor of the most
    /// device memory a stage needs, found before the time bound and the pipeline schedule (a
    /// search refuses most configurations for memory): whenever it gives `None`, `fits` would
    /// refuse the estimate's [`Estimate::peak_memory`] total too, since that is at least the
    /// floor. Under out-of-core training the full estimate is always made.
    pub fn estimate_checked_fitting(
        &self,
        comm_floor: &dyn Fn(&Comm) -> SimDuration,
        fits: &dyn Fn(Bytes) -> bool,
    ) -> Result<Option<Estimate>, StrategyError> {
        emit::estimate_fitting(self, comm_floor, fits)
    }

    /// The time and FLOPs of one pass of one local layer for one micro-batch, or `None` if
    /// the pass does nothing.
    fn kernel(&self, local: &LocalLayer, pass: Pass) -> Result<Option<(SimDuration, f64)>, StrategyError> {
        let layer = &local.layer;
        let flops = layer.cost.flops(pass, self.micro_batch);
        let bytes = layer.cost.bytes(pass, self.micro_batch, self.precision);
        if flops == 0.0 && bytes == 0.0 {
            return Ok(None);
        }
        let duration = self
            .compute
            .layer_duration(self.device, self.precision, layer, pass, self.micro_batch)
            .map_err(|source| StrategyError::Compute { layer: layer.name.clone(), source })?;
        let scaled = local_time(local, duration)?;
        // Under expert skew, the busiest rank's time; the FLOPs stay the mean rank's.
        let divisor = if local.work_multiplier != 1.0 { 1 } else { local.work_divisor.max(1) };
        Ok(Some((scaled, flops / f64::from(divisor))))
    }

    /// Bytes of device memory one pass of one local layer moves for one micro-batch, as the
    /// compute model prices its kernels ([`workloads::compute::ComputeModel::layer_bytes`]),
    /// shared among ranks as [`Strategy::kernel`]'s FLOPs are.
    pub(crate) fn kernel_bytes(&self, local: &LocalLayer, pass: Pass) -> f64 {
        let bytes = self.compute.layer_bytes(&local.layer, pass, self.micro_batch, self.precision);
        let divisor = if local.work_multiplier != 1.0 { 1 } else { local.work_divisor.max(1) };
        bytes / f64::from(divisor)
    }

    /// [`Strategy::kernel`]'s time fully beside communication when the compute model slows
    /// kernels there (`communication-*-slowdown` above 1), scaled as that time is; `None` when
    /// it does not or the pass does nothing.
    fn kernel_beside_communication(
        &self,
        local: &LocalLayer,
        pass: Pass,
    ) -> Result<Option<SimDuration>, StrategyError> {
        let layer = &local.layer;
        if !self.compute.slows_beside_communication()
            || (layer.cost.flops(pass, self.micro_batch) == 0.0
                && layer.cost.bytes(pass, self.micro_batch, self.precision) == 0.0)
        {
            return Ok(None);
        }
        let beside = self
            .compute
            .layer_duration_beside_communication(self.device, self.precision, layer, pass, self.micro_batch)
            .map_err(|source| StrategyError::Compute { layer: layer.name.clone(), source })?;
        local_time(local, beside).map(Some)
    }

    /// The optimizer step over `parameters` in `tensors` parameter tensors held by one rank:
    /// a multi-tensor (fused) kernel, as Megatron-LM's and PyTorch's default optimizers run.
    fn optimizer_step(&self, parameters: u64, tensors: u64) -> Result<(SimDuration, f64), StrategyError> {
        let step = self.optimizer_step_work(parameters, tensors);
        let time = self
            .compute
            .optimizer_step_duration(self.device, &step)
            .map_err(|source| StrategyError::Compute { layer: "optimizer".into(), source })?;
        Ok((time, self.optimizer.flops_per_parameter() * parameters as f64))
    }

    /// What Muon is run with here: data and pipeline parallelism, and with its replicated
    /// orthogonalisation also context, sequence and expert splits, whose ranks hold whole
    /// matrices. Refused: tensor parallelism (Megatron-Core's `TensorParallelMuon` gathers or
    /// splits the shards' Newton-Schulz products, not modelled), ZeRO/FSDP shards, offload, DASO
    /// and the CNN splits (their ranks hold parts of a matrix, or none); the round-robin
    /// spread over data ranks beside context or expert parallelism (its rank order is the data
    /// group's).
    fn check_muon(&self) -> Result<(), StrategyError> {
        let p = &self.parallelism;
        let refused = if p.tensor > 1 {
            Some(("parallelism.tensor", format!("is {}", p.tensor)))
        } else if p.zero > 0 {
            Some(("parallelism.zero", format!("is {}", p.zero)))
        } else if p.offload != Offload::None {
            Some(("workload.offload", format!("is {:?}", p.offload.name())))
        } else if p.sync != GradientSync::AllReduce {
            Some(("parallelism.sync", "is DASO".to_string()))
        } else if p.cnn_degree() > 1 {
            Some(("parallelism.filter", format!("splits a CNN's layers {} ways", p.cnn_degree())))
        } else if self.muon.distribution == workloads::muon::Distribution::RoundRobin
            && (p.context > 1 || p.expert > 1)
        {
            let (key, degree) = if p.context > 1 {
                ("parallelism.context", p.context)
            } else {
                ("parallelism.expert", p.expert)
            };
            return Err(invalid(
                key,
                format!(
                    "is {degree} with optimizer = \"muon\" spread round-robin: the round-robin spread over the \
                     data ranks is modelled beside data and pipeline parallelism only; use [workload.muon] \
                     distribution = \"replicated\" (every rank orthogonalises its own matrices)"
                ),
            ));
        } else {
            None
        };
        match refused {
            Some((key, what)) => Err(invalid(
                key,
                format!(
                    "{what} with optimizer = \"muon\": Muon is modelled with data and pipeline parallelism \
                     (and, replicated, context, sequence and expert splits), where each rank holds whole \
                     weight matrices; not with tensor parallelism, ZeRO/FSDP, offload, DASO or a CNN split"
                ),
            )),
            None => Ok(()),
        }
    }

    /// Muon's step over one stage's `layers` holding `parameters` ([`workloads::muon`]): AdamW's
    /// fused step over the parameters that are not Muon's matrices (embeddings, output layer,
    /// norms, biases), then Muon's momentum, orthogonalisation and update of each matrix.
    /// Returns the step's time and FLOPs and, distributed round-robin, the bytes of the
    /// all-reduce of the updates and the time to apply them after it.
    fn muon_step<'a>(
        &self,
        layers: impl Iterator<Item = &'a LocalLayer>,
        parameters: u64,
    ) -> Result<((SimDuration, f64), MuonExchange), StrategyError> {
        let compute_error = |source| StrategyError::Compute { layer: "optimizer (Muon)".into(), source };
        let (mut matrices, mut orthogonalised, mut other_tensors) = (Vec::new(), 0, 0);
        for local in layers {
            let mine = workloads::muon::matrices(&local.layer);
            let elements: u64 = mine.iter().map(|&(rows, cols)| rows * cols).sum();
            // A layer with parameters beside its matrices (a norm, a bias) is AdamW's tensor.
            other_tensors += u64::from(local.layer.cost.params > elements);
            orthogonalised += elements;
            matrices.extend(mine);
        }
        let rest = parameters.saturating_sub(orthogonalised);
        let adam = workloads::compute::OptimizerStep {
            optimizer: Optimizer::Adam,
            ..self.optimizer_step_work(rest, other_tensors)
        };
        let adam_time = self.compute.optimizer_step_duration(self.device, &adam).map_err(compute_error)?;
        let times = workloads::muon::step_times(
            self.compute,
            self.device,
            &self.muon,
            &matrices,
            self.parallelism.data,
            (self.gradient_precision.bytes(), self.step_widths()),
        )
        .map_err(compute_error)?;
        let time = adam_time
            .checked_add(times.before)
            .map_err(|error| compute_error(workloads::compute::ComputeError::Overflow(error)))?;
        let flops = Optimizer::Adam.flops_per_parameter() * rest as f64
            + Optimizer::Muon.flops_per_parameter() * orthogonalised as f64
            + times.flops;
        Ok(((time, flops), times.exchange.map(|(bytes, apply)| (Bytes(bytes), apply))))
    }

    /// The optimizer step over `parameters` in `tensors` tensors, as [`Strategy::optimizer_step`]
    /// prices it.
    fn optimizer_step_work(&self, parameters: u64, tensors: u64) -> workloads::compute::OptimizerStep {
        workloads::compute::OptimizerStep {
            optimizer: self.optimizer,
            parameters,
            tensors,
            fused: true,
            gradient_bytes: self.gradient_precision.bytes(),
            widths: self.step_widths(),
            passes: self.optimizer_passes,
        }
    }

    /// Bytes of device memory [`Strategy::optimizer_step`] over `parameters` in `tensors`
    /// tensors moves, with the fp8 weight casts of `layers` priced beside it
    /// ([`Strategy::fp8_weight_casts`]).
    fn optimizer_step_bytes<'a>(
        &self,
        parameters: u64,
        tensors: u64,
        layers: impl Iterator<Item = &'a LocalLayer>,
    ) -> f64 {
        let casts: u64 = layers
            .map(|local| {
                workloads::compute::fp8_weight_cast_bytes(&local.layer, self.precision, self.weights.fp8)
            })
            .sum();
        self.optimizer_step_work(parameters, tensors).bytes() + casts as f64
    }

    /// The host CPU's optimizer step over `parameters` (ZeRO-Offload's, [`Offload::Optimizer`]):
    /// DeepSpeed's CPU Adam, one fused vectorised loop over the rank's flattened fp32 partition
    /// (`deepspeed/ops/csrc/adam/cpu_adam.cpp`), priced by the compute model on
    /// [`Strategy::host_cpu`] (one GPU's process's share of the node's CPUs) with the same
    /// reads and writes as the device's fused step: the gradient, the fp32 weights and states
    /// in, the fp32 weights, states and the working copy out.
    fn host_optimizer_step(&self, parameters: u64) -> Result<SimDuration, StrategyError> {
        let Some(cpu) = self.host_cpu else {
            return Err(invalid(
                "cluster.host-cpu",
                "is missing: the optimizer step runs on the host CPU".into(),
            ));
        };
        let step = workloads::compute::OptimizerStep {
            passes: workloads::optimizer::OptimizerPasses::Fused,
            ..self.optimizer_step_work(parameters, 1)
        };
        self.compute
            .optimizer_step_duration(cpu, &step)
            .map_err(|source| StrategyError::Compute { layer: "optimizer (host CPU)".into(), source })
    }

    /// What the optimizer step reads and writes per parameter ([`workloads::StepWidths`]): its
    /// copy of the weights ([`workloads::MasterWeights`]), its states in the optimizer's
    /// precision, and the compute copy it writes back (2 bytes in 16-bit mixed precision, 1
    /// with FP8 parameters, none when it updates the compute weights themselves).
    fn step_widths(&self) -> workloads::StepWidths {
        use workloads::MasterWeights;
        let storage = self.precision.storage().bytes();
        let state = if self.optimizer_precision.bytes() < 4 { self.optimizer_precision.bytes() } else { 4 };
        let (master, copy) = match self.weights.master {
            MasterWeights::Copy if self.weights.fp8 => (state, 1),
            MasterWeights::Copy if self.precision.bytes() < 4 => (state, storage),
            MasterWeights::Copy | MasterWeights::InPlace => (storage.min(4), 0),
            // The bf16 weight and its 16-bit remainder, read and written in one kernel.
            MasterWeights::Remainders => (4, 0),
        };
        workloads::StepWidths { master, state, copy }
    }

    /// Transformer Engine's per-iteration fp8 copies of the weights of `layers` (one rank's)
    /// when the model trains in fp8: one element-wise kernel per fp8 linear layer moving
    /// [`workloads::compute::fp8_weight_cast_bytes`]; nothing in any other precision.
    fn fp8_weight_casts<'a>(
        &self,
        layers: impl Iterator<Item = &'a LocalLayer>,
    ) -> Result<SimDuration, StrategyError> {
        let mut total = SimDuration::ZERO;
        for local in layers {
            let bytes =
                workloads::compute::fp8_weight_cast_bytes(&local.layer, self.precision, self.weights.fp8);
            if bytes == 0 {
                continue;
            }
            let work =
                workloads::compute::KernelWork::flat(OpClass::Elementwise, Dtype::Bf16, 0.0, bytes as f64);
            let error = |source| StrategyError::Compute { layer: local.layer.name.clone(), source };
            let time = self.compute.work_duration(self.device, &work).map_err(error)?;
            total = total
                .checked_add(time)
                .map_err(|overflow| error(workloads::compute::ComputeError::Overflow(overflow)))?;
        }
        Ok(total)
    }

    /// The in-place add of a later micro-batch's weight gradients of `layer` into its
    /// gradients ([`workloads::optimizer::GradientAccumulation::Add`]): one element-wise kernel
    /// over the rank's share of its parameters in the compute dtype (read both, write one);
    /// `None` when the weight kernels accumulate themselves or the layer has no parameters.
    fn accumulation(&self, local: &LocalLayer) -> Result<Option<SimDuration>, StrategyError> {
        let parameters = local.layer.cost.params;
        if self.gradient_accumulation != workloads::optimizer::GradientAccumulation::Add || parameters == 0 {
            return Ok(None);
        }
        let work = workloads::compute::KernelWork::flat(
            OpClass::Elementwise,
            self.precision.storage(),
            parameters as f64,
            3.0 * (parameters * self.precision.storage().bytes()) as f64,
        );
        let time = self
            .compute
            .work_duration(self.device, &work)
            .map_err(|source| StrategyError::Compute { layer: local.layer.name.clone(), source })?;
        Ok(Some(time))
    }
}

/// One rank's share of a kernel of `duration`: the busiest rank's time under expert skew
/// (`work_multiplier`), else the rank's part when the work is divided among ranks.
fn local_time(local: &LocalLayer, duration: SimDuration) -> Result<SimDuration, StrategyError> {
    if local.work_multiplier != 1.0 {
        return SimDuration::from_secs_f64(duration.as_secs_f64() * local.work_multiplier).map_err(|_| {
            invalid("parallelism.expert-skew", format!("makes layer {} take too long", local.layer.name))
        });
    }
    Ok(SimDuration::from_ps(duration.as_ps() / u64::from(local.work_divisor.max(1))))
}

/// The scenario key of a [`ShardError::Invalid`] key.
fn shard_key(key: &'static str) -> &'static str {
    match key {
        "tensor" => "parallelism.tensor",
        "context" => "parallelism.context",
        "expert" => "parallelism.expert",
        "sequence-parallel" => "parallelism.sequence-parallel",
        "expert-skew" => "parallelism.expert-skew",
        "expert-tensor" => "parallelism.expert-tensor",
        "moe-dispatcher" => "parallelism.moe-dispatcher",
        "moe-experts" => "parallelism.moe-experts",
        "filter" => "parallelism.filter",
        "channel" => "parallelism.channel",
        "spatial" => "parallelism.spatial",
        "spatial-dims" => "parallelism.spatial-dims",
        other => other,
    }
}
