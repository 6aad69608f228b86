//! One simulation of a scenario: topology + lowering -> engine -> [`Summary`]. The function
//! `parasim run`, `validate`, `sweep` and `plan` share, so each of them reports the same
//! numbers for the same scenario.

use std::time::{Duration, Instant};

use serde::{Serialize, Serializer};
use sim_core::stats::{Activity, breakdown_by, exposed_by_class, idle_until_besides};
use sim_core::units::{SimDuration, SimTime};
use topology::{Topology, TopologyError};

use crate::Scenario;
use sim_core::graph::{Op, OpKind, RankId, Work};
use strategies::{Axis, GroupKind, StrategyError};
use workloads::device::DeviceError;
use workloads::memory::{MemoryBreakdown, MemoryError, Recompute};

/// Everything `parasim run` reports. A pure function of the scenario: no wall-clock numbers,
/// so two runs print byte-identical JSON. A field `run --json` leaves out for some
/// configurations (`skip_serializing_if`) must be set in `sweep::full_summary`, which names a
/// sweep's metric columns.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// The scenario file.
    pub scenario: String,
    /// The training framework (`workload.framework`) and the settings it implied, skipped or
    /// left to the scenario. Omitted when the scenario names none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub framework: Option<crate::framework::FrameworkUse>,
    /// The host (`cluster.host`) and execution mode (`workload.execution`) and the per-op
    /// dispatch cost they gave. Omitted when the scenario names neither.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::host::HostUse>,
    /// What was trained.
    pub model: ModelSummary,
    /// On what.
    pub cluster: ClusterSummary,
    /// How it was split.
    pub strategy: StrategySummary,
    /// Network model.
    pub fidelity: &'static str,
    /// Faults that hold for a while and latency noise (`[faults]`), described; empty without.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub link_conditions: Vec<String>,
    /// NCCL protocols of the collectives (`simulation.protocol`): `auto`, one protocol, or `off`.
    pub protocol: String,
    /// Iterations simulated.
    pub iterations: u32,
    /// Mean time of one iteration.
    #[serde(rename = "iteration_time_s", serialize_with = "seconds")]
    pub iteration_time: SimDuration,
    /// Time of each iteration.
    #[serde(rename = "iteration_times_s", serialize_with = "seconds_list")]
    pub iteration_times: Vec<SimDuration>,
    /// Training throughput of the whole job.
    pub samples_per_second: f64,
    /// Throughput per GPU.
    pub samples_per_second_per_device: f64,
    /// Tokens per second of the whole job, for sequence models.
    pub tokens_per_second: Option<f64>,
    /// FLOP/s one GPU achieves, in TFLOP/s.
    pub achieved_tflops_per_device: f64,
    /// The device's datasheet peak for the compute dtype, in TFLOP/s.
    pub peak_tflops_per_device: f64,
    /// Model FLOPs utilization: achieved / peak.
    pub mfu: f64,
    /// Where one iteration's time goes, mean over GPUs.
    pub breakdown: Breakdown,
    /// What one GPU of the most loaded stage holds at the peak of an iteration.
    pub memory: MemorySummary,
    /// Model FLOPs of one iteration (Megatron-LM: 6 x multiply-accumulates x samples).
    pub model_flops_per_iteration: f64,
    /// Model FLOPs utilization: model FLOPs per second per GPU over the peak.
    pub model_flops_utilization: f64,
    /// Hardware FLOPs utilization: FLOPs the GPUs execute (recomputation included) over the peak.
    pub hardware_flops_utilization: f64,
    /// Every pipeline stage's layers and memory.
    pub stages: Vec<StageMemory>,
    /// Engine counters.
    pub engine: EngineCounters,
    /// Median iteration time of a Monte Carlo run (`[variability]`), in seconds; omitted
    /// without variability. A sweep column.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iteration_p50_s: Option<f64>,
    /// 99th-percentile iteration time of a Monte Carlo run, in seconds; omitted without
    /// variability. A sweep column.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iteration_p99_s: Option<f64>,
    /// The iteration-time distribution of a Monte Carlo run (`[variability]`): then
    /// `iteration_time_s`, `iteration_times_s` and the throughputs are the Monte Carlo
    /// iterations', and the breakdown and memory are the noise-free iteration's. Omitted without
    /// variability.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distribution: Option<DistributionSummary>,
    /// What the user should know about this configuration that is not an error (out-of-core
    /// training on a configuration that fits without it). Omitted when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Goodput under the scenario's failures (`[failures]`): useful training time over wall
    /// time, time lost per cause, the best checkpoint interval. Omitted without `[failures]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goodput: Option<crate::failures::GoodputSummary>,
    /// Per device type of a cluster of node groups (`[[cluster.node-groups]]`): busy share,
    /// achieved and peak TFLOP/s of the noise-free iterations. Omitted without node groups.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<crate::mixed::DeviceUtilisation>,
}

/// The iteration-time distribution of a Monte Carlo run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DistributionSummary {
    /// Iterations drawn.
    pub iterations: u32,
    /// `simulation.seed`.
    pub seed: u64,
    /// The sources of variability, one line each.
    pub sources: Vec<String>,
    /// Iterations in the re-timed graph (1, or DASO's global-sync period): the graph is
    /// re-timed `repetitions` times.
    pub graph_iterations: u32,
    /// Repetitions of the graph.
    pub repetitions: u32,
    /// The noise-free iteration time, in seconds.
    pub nominal_s: f64,
    /// Mean iteration time (exact), in seconds.
    pub mean_s: f64,
    /// Sample standard deviation, in seconds.
    pub stdev_s: f64,
    /// Shortest iteration (exact), in seconds.
    pub min_s: f64,
    /// Median, from an hdrhistogram of nanoseconds with 4 significant digits.
    pub p50_s: f64,
    /// 90th percentile (histogram).
    pub p90_s: f64,
    /// 99th percentile (histogram).
    pub p99_s: f64,
    /// Longest iteration (exact), in seconds.
    pub max_s: f64,
    /// Mean over noise-free: what the variability costs (1.05: 5% slower).
    pub slowdown: f64,
    /// The ranks most often on the critical path (some compute of theirs on the chain of
    /// latest-ending predecessors back from the op that ended the repetition last), most first;
    /// at most 10.
    pub critical_ranks: Vec<CriticalRank>,
    /// How communication was timed.
    pub communication: &'static str,
}

/// A rank on the critical path of Monte Carlo repetitions.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CriticalRank {
    /// The rank.
    pub rank: u32,
    /// Repetitions in which it was on the critical path.
    pub repetitions: u32,
    /// Their share of all repetitions.
    pub share: f64,
}

/// The model part of the summary.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModelSummary {
    /// Zoo name.
    pub name: String,
    /// Trainable parameters.
    pub parameters: u64,
    /// Frozen parameters (LoRA's base model, `[workload.lora]`): held, not trained; absent when
    /// every parameter is trained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frozen_parameters: Option<u64>,
    /// Multiply-accumulates of one sample's forward pass.
    pub macs_per_sample: f64,
    /// Samples per data-parallel replica per iteration (per GPU under pure data parallelism).
    pub batch_per_device: u64,
    /// Compute dtype.
    pub precision: String,
    /// Dtype of the all-reduced gradients.
    pub gradient_precision: String,
    /// Optimizer.
    pub optimizer: String,
    /// Muon's settings (`[workload.muon]`) when the optimizer is Muon: Newton-Schulz steps, the
    /// iteration's form and the spread over the data ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub muon: Option<MuonSummary>,
    /// `"forward"` when only the forward pass of the step runs (`workload.passes`); absent for
    /// a whole training step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passes: Option<String>,
    /// Where the compute model's parameters came from (defaults or a calibrated profile).
    pub compute_model: String,
}

/// Muon's settings as the summary reports them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MuonSummary {
    /// Newton-Schulz iterations per update.
    pub steps: u32,
    /// The iteration's form (`"three-wide"`, `"square-first"`).
    pub iteration: String,
    /// Which data ranks orthogonalise which matrices (`"replicated"`, `"round-robin"`).
    pub distribution: String,
}

/// The cluster part of the summary.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClusterSummary {
    /// Total GPUs.
    pub gpus: u32,
    /// Servers.
    pub nodes: u32,
    /// GPUs per server.
    pub gpus_per_node: u32,
    /// Device name.
    pub device: String,
    /// GPU or CPU: what the report calls one device.
    pub device_kind: workloads::device::DeviceKind,
    /// Inside a server, e.g. "nvswitch 300 GB/s 0.7 us".
    pub intra_node: String,
    /// Between servers.
    pub network: String,
}

/// The parallel strategy part of the summary.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StrategySummary {
    /// Data-parallel ranks.
    pub data_parallel: u32,
    /// Gradient buckets per iteration.
    pub gradient_buckets: usize,
    /// Gradient bytes all-reduced per iteration.
    pub gradient_bytes: u64,
    /// Allreduce algorithm.
    pub allreduce: &'static str,
    /// Tensor-parallel degree.
    pub tensor: u32,
    /// Megatron sequence parallelism.
    pub sequence_parallel: bool,
    /// Pipeline stages.
    pub pipeline: u32,
    /// Model chunks per pipeline rank.
    pub virtual_stages: u32,
    /// Pipeline schedule (`gpipe`, `1f1b`, `interleaved-1f1b`).
    pub schedule: &'static str,
    /// `parallelism.pipeline-host-sync` when the host synchronises at this pipeline's
    /// exchanges (`"every-exchange"`, `"unless-interleaved"`); omitted when it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline_host_sync: Option<&'static str>,
    /// Context-parallel degree.
    pub context: u32,
    /// Expert-parallel degree.
    pub expert: u32,
    /// Filter-parallel degree (omitted when 1).
    #[serde(skip_serializing_if = "is_one")]
    pub filter: u32,
    /// Channel-parallel degree (omitted when 1).
    #[serde(skip_serializing_if = "is_one")]
    pub channel: u32,
    /// Spatial-parallel degree (omitted when 1).
    #[serde(skip_serializing_if = "is_one")]
    pub spatial: u32,
    /// The spatially split dimensions (omitted without spatial parallelism).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spatial_dims: Option<&'static str>,
    /// ZeRO stage.
    pub zero: u8,
    /// `"deepspeed"` when DeepSpeed's ZeRO-3 runs (omitted for FSDP's, the default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zero_implementation: Option<&'static str>,
    /// Rank order, fastest dimension first.
    pub order: String,
    /// Samples per iteration.
    pub global_batch: u64,
    /// Samples per micro-batch.
    pub micro_batch: u64,
    /// Micro-batches per replica per iteration.
    pub micro_batches: u32,
    /// DASO's settings (omitted with a flat allreduce).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daso: Option<DasoSummary>,
    /// Out-of-core training (omitted without offloading).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload: Option<OffloadSummary>,
    /// The data loader (omitted when not modelled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<InputSummary>,
    /// Bytes each first-stage GPU copies from host memory on its compute stream per iteration
    /// (`[workload.input] copy = "compute-stream"`; omitted when not modelled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_copy_bytes: Option<u64>,
}

/// The data loader as simulated (`[workload.input]`).
#[derive(Debug, Clone, Serialize)]
pub struct InputSummary {
    /// `per-rank` or `per-group`.
    pub loader: &'static str,
    /// Samples per second one loader produces.
    pub rate: f64,
    /// Batches loaded ahead.
    pub prefetch: u32,
    /// Samples one loader loads per iteration.
    pub samples_per_loader: u64,
    /// Bytes a per-group loader broadcasts per iteration (0 without a broadcast).
    pub broadcast_bytes: u64,
    /// Host serialisation rate of the broadcast, bytes per second (omitted if not given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broadcast_rate: Option<f64>,
}

/// DASO's synchronisation as simulated.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DasoSummary {
    /// GPUs of a node: the node-local allreduce group.
    pub node_gpus: u32,
    /// Iterations between global synchronisations.
    pub global_sync_every: u32,
    /// `"blocking"` or `"non-blocking"`.
    pub global_sync: &'static str,
    /// Non-blocking: iterations between sending a global sync and receiving it (0 blocking).
    pub global_sync_wait: u32,
    /// Parameter bytes of one global allreduce.
    pub global_bytes: u64,
}

/// Out-of-core training as simulated.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OffloadSummary {
    /// `workload.offload`: `"activations"`, `"activations+weights"`, `"optimizer"` or
    /// `"activations+optimizer"`.
    pub offload: &'static str,
    /// Bytes one GPU copies to host memory per iteration.
    pub to_host_bytes: u64,
    /// Bytes one GPU copies back per iteration.
    pub to_device_bytes: u64,
    /// Of these, saved activation bytes one GPU copies out (and as many back) per iteration.
    pub activation_bytes: u64,
    /// Weight bytes one GPU prefetches per iteration, before each layer's forward and backward
    /// (`"activations+weights"`; 0 otherwise).
    pub weight_bytes: u64,
    /// Gradient bytes one GPU writes to host memory per iteration.
    pub gradient_bytes: u64,
    /// Bytes the optimizer step streams into one GPU per iteration (gradients, fp32 weights,
    /// optimizer state).
    pub optimizer_to_device_bytes: u64,
    /// Bytes the optimizer step streams back per iteration (fp32 weights, optimizer state,
    /// working weights).
    pub optimizer_to_host_bytes: u64,
    /// Host memory one node needs for its GPUs' offloaded data.
    pub host_memory_bytes: u64,
    /// Host memory of one node (`cluster.host-memory`).
    pub host_memory_capacity: u64,
    /// The host CPU's optimizer step per iteration, in seconds, on the busiest stage's GPU's
    /// share of the node's CPUs (`"optimizer"`, `"activations+optimizer"`; omitted otherwise).
    #[serde(skip_serializing_if = "is_zero")]
    pub host_optimizer_step_s: f64,
    /// What that step runs on: one GPU's process's share of `cluster.host-cpu`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_cpu: Option<String>,
    /// Bytes that GPU's host optimizer (and with `"optimizer+parameters"` its weights' shards)
    /// reads from and writes to NVMe per iteration (`workload.offload-device = "nvme"`; omitted
    /// otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvme_bytes: Option<u64>,
    /// Of `nvme_bytes`, those read (omitted without NVMe).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvme_read_bytes: Option<u64>,
    /// Its share of the node's NVMe bandwidth, in bytes per second (omitted without NVMe).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvme_bandwidth_bytes_per_s: Option<f64>,
}

/// Exposed communication (no compute running) by communicator kind, in seconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ExposedByGroup {
    /// Tensor (and sequence) parallel collectives.
    pub tensor: f64,
    /// Pipeline sends.
    pub pipeline: f64,
    /// Data-parallel gradient and parameter synchronisation.
    pub data: f64,
    /// Context-parallel ring.
    pub context: f64,
    /// Expert-parallel all-to-all.
    pub expert: f64,
    /// Filter-parallel allgathers and allreduces (omitted when zero).
    #[serde(skip_serializing_if = "is_zero")]
    pub filter: f64,
    /// Channel-parallel allreduces and allgathers (omitted when zero).
    #[serde(skip_serializing_if = "is_zero")]
    pub channel: f64,
    /// Spatial halo exchanges and allgather (omitted when zero).
    #[serde(skip_serializing_if = "is_zero")]
    pub spatial: f64,
}

fn is_one(value: &u32) -> bool {
    *value == 1
}

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

/// One pipeline stage's layers and memory.
#[derive(Debug, Clone, Serialize)]
pub struct StageMemory {
    /// Stage index.
    pub stage: u32,
    /// First and last layer of each of its model chunks.
    pub layers: Vec<String>,
    /// Numbered blocks it holds.
    pub blocks: usize,
    /// Parameters one of its GPUs holds (after tensor and expert splitting, before ZeRO).
    pub parameters: u64,
    /// Micro-batches of activations held at the peak.
    pub peak_micro_batches_in_flight: f64,
    /// What one of its GPUs holds at its peak.
    pub memory: MemorySummary,
}

/// One iteration's time split three ways, mean over GPUs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Breakdown {
    /// Some compute kernel running.
    #[serde(rename = "compute_s", serialize_with = "seconds")]
    pub compute: SimDuration,
    /// Communication running, no compute.
    #[serde(rename = "exposed_communication_s", serialize_with = "seconds")]
    pub exposed_communication: SimDuration,
    /// Nothing running.
    #[serde(rename = "idle_s", serialize_with = "seconds")]
    pub idle: SimDuration,
    /// All communication, hidden or not.
    #[serde(rename = "communication_s", serialize_with = "seconds")]
    pub communication: SimDuration,
    /// Exposed communication by communicator kind.
    #[serde(rename = "exposed_by_group_s")]
    pub exposed_by_group: ExposedByGroup,
    /// Pipeline bubble: idle time until the last backward kernel of the rank's pipeline, not
    /// counting the time the GPU waited for its own host (`host_bound`); the rest of `idle` is
    /// waiting for gradient synchronisation and the optimizer after it.
    #[serde(rename = "bubble_s", serialize_with = "seconds")]
    pub bubble: SimDuration,
    /// Time the GPU waited for the host to launch its next kernel (part of `idle`):
    /// host-bound steps show it.
    #[serde(rename = "host_bound_s", serialize_with = "seconds")]
    pub host_bound: SimDuration,
    /// Time the GPU waited for its input (part of `idle`): the data loader not keeping up,
    /// and a per-group loader's broadcast of the batch (`[workload.input]`). Omitted when
    /// zero.
    #[serde(rename = "input_bound_s", serialize_with = "seconds", skip_serializing_if = "is_zero_duration")]
    pub input_bound: SimDuration,
    /// Out-of-core training: time no kernel runs while a copy to or from host memory does
    /// (the host link not keeping up); part of `exposed_communication`. Omitted when zero.
    #[serde(
        rename = "offload_stall_s",
        serialize_with = "seconds",
        skip_serializing_if = "is_zero_duration"
    )]
    pub offload_stall: SimDuration,
}

fn is_zero_duration(duration: &SimDuration) -> bool {
    *duration == SimDuration::ZERO
}

/// Memory of one GPU, in bytes, against its capacity.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MemorySummary {
    /// Activations recomputed in the backward pass: `none`, `selective` or `full`.
    pub recompute: String,
    /// Model weights.
    pub weights: u64,
    /// Gradients.
    pub gradients: u64,
    /// Optimizer state (fp32 master weights and moments).
    pub optimizer: u64,
    /// Activations kept for the backward pass.
    pub activations: u64,
    /// Transient buffers of the backward pass.
    pub temporary: u64,
    /// Communication buffers (DDP gradient buckets).
    pub communication: u64,
    /// The sum of the above.
    pub total: u64,
    /// The device's memory.
    pub capacity: u64,
    /// Bytes to spare: `capacity - total` (a configuration that runs has at least 0).
    pub spare: i64,
    /// `spare` as a fraction of `capacity`.
    pub spare_fraction: f64,
}

impl MemorySummary {
    fn new(memory: &MemoryBreakdown, scenario: &Scenario) -> MemorySummary {
        let margin = memory.margin(&scenario.device);
        MemorySummary {
            recompute: scenario.recompute.to_string(),
            weights: memory.weights.0,
            gradients: memory.gradients.0,
            optimizer: memory.optimizer.0,
            activations: memory.activations.0,
            temporary: memory.temporary.0,
            communication: memory.communication.0,
            total: memory.total().0,
            capacity: scenario.device.memory_capacity.0,
            spare: i64::try_from(margin.spare_bytes()).unwrap_or(i64::MIN),
            spare_fraction: margin.fraction(),
        }
    }
}

/// Engine counters (deterministic).
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineCounters {
    /// Ops in the execution graph.
    pub ops: usize,
    /// Events the engine processed.
    pub events: u64,
}

fn seconds_of(duration: SimDuration) -> f64 {
    duration.as_secs_f64()
}

fn seconds<S: Serializer>(duration: &SimDuration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64())
}

fn seconds_list<S: Serializer>(durations: &[SimDuration], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(durations.iter().map(|d| d.as_secs_f64()))
}

/// A summary plus how long the work took on this machine.
pub struct Outcome {
    /// The results.
    pub summary: Summary,
    /// Wall time of building the topology and lowering the workload to a graph.
    pub lowering_wall: Duration,
    /// Wall time of the event loop.
    pub simulation_wall: Duration,
    /// The lowered execution graph (for `--trace`).
    pub graph: sim_core::graph::ExecGraph,
    /// When every op ran (for `--trace`).
    pub timeline: sim_core::exec::Timeline,
    /// Each micro-batch step of each simulated rank (for `--trace`).
    pub spans: Vec<strategies::ScheduleSpan>,
    /// A name for each rank's timeline track: its stage and coordinates.
    pub rank_names: Vec<String>,
    /// Bytes routed over each link (by `LinkId`) under `flow` and `packet-steps` when counted
    /// ([`simulate_counting_link_bytes`]); `None` under `analytical` or when not counted.
    pub link_bytes: Option<Vec<f64>>,
    /// Per iteration of the graph, the ops whose latest end closes it.
    pub iteration_ends: Vec<Vec<sim_core::graph::OpId>>,
    /// Wall time of re-timing the Monte Carlo iterations (`None` without variability).
    pub monte_carlo_wall: Option<Duration>,
}

/// A scenario could not be simulated.
#[derive(Debug, thiserror::Error)]
pub enum SimulationError {
    /// The cluster's graph could not be built.
    #[error("building the cluster topology: {0}")]
    Topology(#[from] TopologyError),
    /// The memory model refused the configuration, or it does not fit (then with the ways
    /// out, [`ways_out`]).
    #[error("{context}: {source}{hint}")]
    Memory {
        /// The scenario and the configuration.
        context: String,
        /// Why.
        #[source]
        source: MemoryError,
        /// For a configuration that does not fit: lines naming the settings that would shrink
        /// it; empty otherwise (boxed: the error stays small).
        hint: Box<String>,
    },
    /// The strategy could not be lowered to an execution graph.
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    /// The execution graph would pass the work budget: refused before it is built.
    #[error("{scenario}: key `{}`: {}", budget.key, budget.reason())]
    OverBudget {
        /// The scenario file.
        scenario: String,
        /// The estimate, the key at fault and what to do instead.
        budget: Box<sim_core::budget::OverBudget>,
    },
    /// `[failures]` or `[faults]` names something the cluster does not have (a link by a name
    /// no link has), or faults cut ranks off.
    #[error("{scenario}: key `{key}`: {message}")]
    Key {
        /// The scenario file.
        scenario: String,
        /// The key at fault.
        key: String,
        /// What is wrong and what would be valid.
        message: String,
    },
    /// The engine failed.
    #[error("{scenario}: simulating: {source}")]
    Exec {
        /// The scenario file.
        scenario: String,
        /// The engine's error.
        source: Box<sim_core::exec::ExecError>,
    },
    /// A second run of a graph (recording link utilisation) ended its ops at other times than
    /// the first: an engine defect, not bad input.
    #[error("{scenario}: the run recording link utilisation differs from the first run (an engine defect)")]
    RerunDiffers {
        /// The scenario file.
        scenario: String,
    },
    /// The Monte Carlo re-timer could not order the graph (an engine defect, not bad input).
    #[error("{scenario}: Monte Carlo iterations: {source}")]
    MonteCarlo {
        /// The scenario file.
        scenario: String,
        /// Why.
        source: sim_core::montecarlo::MonteCarloError,
    },
    /// The iteration-time histogram could not be made (an hdrhistogram defect, not bad input).
    #[error("{scenario}: iteration-time histogram: {message}")]
    MonteCarloHistogram {
        /// The scenario file.
        scenario: String,
        /// hdrhistogram's message.
        message: String,
    },
    /// The device has no peak for the compute dtype.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Out-of-core training needs more host memory than a node has.
    #[error(
        "{context}: key `cluster.host-memory`: out-of-core training keeps {} per GPU in host memory, \
         {} for the {gpus} GPUs of a node, but a node has {} ({capacity}): give nodes more host memory, \
         a smaller micro-batch, or more GPUs (data parallelism) to split the batch",
        workloads::memory::gigabytes(*per_gpu),
        workloads::memory::gigabytes(*needed),
        workloads::memory::gigabytes(*capacity)
    )]
    HostMemory {
        /// The scenario and the configuration.
        context: String,
        /// Host bytes the node's GPUs need.
        needed: sim_core::units::Bytes,
        /// `cluster.host-memory`.
        capacity: sim_core::units::Bytes,
        /// Host bytes one GPU needs.
        per_gpu: sim_core::units::Bytes,
        /// GPUs per node.
        gpus: u32,
    },
}

/// The settings that would make a configuration that does not fit smaller, largest part of its memory first: recomputation and a smaller micro-batch for activations,
/// ZeRO and offloading for the model state (each only when that part is at least a tenth of
/// what the device needs, so that shrinking it matters), tensor or pipeline parallelism for
/// both, and `parasim plan`, which searches them all. Each line starts with a newline (appended
/// to the error).
pub fn ways_out(scenario: &Scenario, memory: &MemoryBreakdown) -> String {
    let significant = memory.total().0 / 10;
    let activations = memory.activations.0 + memory.temporary.0;
    let state = memory.weights.0 + memory.gradients.0 + memory.optimizer.0;
    let gb = |bytes: u64| workloads::memory::gigabytes(sim_core::units::Bytes(bytes));
    let mut activation_ways = Vec::new();
    if scenario.recompute != Recompute::Full {
        activation_ways.push(
            "recompute activations in the backward pass: workload.recompute = \"full\" (\"selective\" for transformers' attention)".to_string(),
        );
    }
    activation_ways.push("a smaller micro-batch: workload.micro-batch (or workload.batch-per-device)".into());
    activation_ways.push(
        "offload activations to host memory: workload.offload = \"activations\" (with cluster.host-memory)"
            .into(),
    );
    let mut state_ways = Vec::new();
    if scenario.parallelism.zero < 3 && scenario.parallelism.data > 1 {
        state_ways.push(format!(
            "shard the model state over the {} data-parallel replicas: parallelism.zero = {} (ZeRO)",
            scenario.parallelism.data,
            if scenario.parallelism.zero == 0 {
                "1, 2 or 3".to_string()
            } else {
                format!("{} or 3", scenario.parallelism.zero + 1)
            }
        ));
    }
    state_ways.push(
        "keep weights, gradients and optimizer state in host memory: workload.offload = \"activations+weights\"".into(),
    );
    let (first, second) = if activations >= state {
        (format!("activations {}", gb(activations)), format!("model state {}", gb(state)))
    } else {
        (format!("model state {}", gb(state)), format!("activations {}", gb(activations)))
    };
    if activations < significant {
        activation_ways.clear();
    }
    if state < significant {
        state_ways.clear();
    }
    let mut ways = if activations >= state {
        activation_ways.into_iter().chain(state_ways).collect::<Vec<_>>()
    } else {
        state_ways.into_iter().chain(activation_ways).collect::<Vec<_>>()
    };
    ways.push("split the model: parallelism.tensor or parallelism.pipeline".into());
    ways.push(format!(
        "or let `parasim plan --cluster {}` search the configurations that fit",
        scenario.source
    ));
    let mut text = format!("\nways out ({first}, {second}):");
    for way in ways {
        text.push_str("\n  - ");
        text.push_str(&way);
    }
    text
}

/// Simulates `scenario`.
pub fn simulate(scenario: &Scenario) -> Result<Outcome, SimulationError> {
    simulate_with(scenario, false)
}

/// Simulates `scenario` and counts the bytes routed over every link under `flow` and
/// `packet-steps` ([`Outcome::link_bytes`]; `parasim run` reports the busiest links). Only
/// callers that report them pay for the count.
pub fn simulate_counting_link_bytes(scenario: &Scenario) -> Result<Outcome, SimulationError> {
    simulate_with(scenario, true)
}

/// The utilisation over time of `links` in the run of `scenario` that gave `outcome` (a run of
/// [`simulate`] or [`simulate_counting_link_bytes`] that kept its graph: not streamed), under
/// `flow` and `packet-steps`; `None` under `analytical`, which has no links to load.
///
/// The graph runs a second time on the same fabric with a recorder of those links' loads:
/// exact, since the engine is deterministic (the second run's times are checked against the
/// first's), and bounded, since only the links asked for are recorded (`parasim run --trace`
/// asks for the busiest ones, which only the first run's byte counts can name).
pub fn link_series(
    scenario: &Scenario,
    outcome: &Outcome,
    links: &[topology::LinkId],
) -> Result<Option<Vec<sim_core::flow::LinkSeries>>, SimulationError> {
    let topology = topology(scenario)?;
    let exec_error =
        |source| SimulationError::Exec { scenario: scenario.source.clone(), source: Box::new(source) };
    let (timeline, series) =
        scenario.network.run_recording_link_series(&outcome.graph, &topology, links).map_err(exec_error)?;
    if timeline.end != outcome.timeline.end {
        return Err(SimulationError::RerunDiffers { scenario: scenario.source.clone() });
    }
    Ok(series)
}

fn simulate_with(scenario: &Scenario, count_link_bytes: bool) -> Result<Outcome, SimulationError> {
    if scenario.variability.is_active() {
        monte_carlo(scenario, count_link_bytes)
    } else if scenario.iterations > strategies::MAX_ITERATIONS {
        simulate_streamed(scenario, count_link_bytes)
    } else {
        simulate_once(scenario, count_link_bytes, None)
    }
}

pub use crate::streamed::simulate_streamed;

/// A limit on a run's iteration time ([`simulate_within_limit`]) that its caller may tighten
/// while the run goes on, and that tells afterwards under which limits the run would have
/// been given up: a search can start a run under a loose limit before it knows the one that
/// applies, tighten it when it does, and still classify the run exactly as a run under that
/// limit from the start would have ended.
#[derive(Debug, Clone)]
pub struct RunLimit {
    handle: sim_core::exec::LimitHandle,
    iterations: u64,
}

impl RunLimit {
    /// A limit of `limit` on the iteration time of a run of `scenario`; `None`: no limit (the
    /// run still records how far its bounds reached).
    pub fn new(scenario: &Scenario, limit: Option<SimDuration>) -> RunLimit {
        let iterations = u64::from(scenario.iterations.max(1));
        let last = limit.map_or(SimTime::from_ps(u64::MAX), |limit| last_end(limit, iterations));
        RunLimit { handle: sim_core::exec::LimitHandle::new(last), iterations }
    }

    /// Lowers the limit to `limit` if that is below it.
    pub fn tighten(&self, limit: SimDuration) {
        self.handle.tighten(last_end(limit, self.iterations));
    }

    /// Whether the run (once it has ended or been given up) would have been given up under
    /// `limit` from its start: some op start showed its iteration time above `limit`.
    pub fn gives_up_under(&self, limit: SimDuration) -> bool {
        self.handle.highest() > last_end(limit, self.iterations)
    }
}

/// The latest the last iteration's end may come for an iteration time of `limit` over
/// `iterations` (the iteration time is that end over the iterations, rounded down): above
/// `limit` once the end is at `(limit + 1 ps) x iterations` or later.
fn last_end(limit: SimDuration, iterations: u64) -> SimTime {
    SimTime::from_ps(limit.as_ps().saturating_add(1).saturating_mul(iterations).saturating_sub(1))
}

/// [`simulate`], given up (`Ok(None)`) as soon as the run shows that its iteration time will
/// be above `limit` ([`sim_core::exec::EndLimit`]: from the start of some op, the kernels that
/// must still run one after another before the last iteration's end reach past `limit` times
/// the iterations). A run that is not given up is [`simulate`]'s, event for event. Runs with
/// variability or streamed iterations are simulated whole.
pub fn simulate_within(scenario: &Scenario, limit: SimDuration) -> Result<Option<Outcome>, SimulationError> {
    simulate_within_sharing(scenario, Some(limit), None)
}

/// [`simulate_within`] (without a limit: [`simulate`]) that runs the engine once for every
/// configuration of `shared` with the same inputs ([`SharedRuns`]): the outcome is the one
/// the run would give alone.
pub fn simulate_within_sharing(
    scenario: &Scenario,
    limit: Option<SimDuration>,
    shared: Option<&SharedRuns>,
) -> Result<Option<Outcome>, SimulationError> {
    let limit = limit.map(|limit| RunLimit::new(scenario, Some(limit)));
    simulate_within_limit_or_none(scenario, limit.as_ref(), shared)
}

/// [`simulate_within_sharing`] under `limit`, which the caller may tighten from another thread
/// while the run goes on ([`RunLimit::tighten`]; the run is given up at the next op start that
/// shows its iteration time above the tighter limit) and read afterwards: the run would have
/// been given up under exactly the limits [`RunLimit::gives_up_under`] names, and otherwise
/// ended as it did, event for event. Runs with variability or streamed iterations are
/// simulated whole (no limit applies to them, and none gives them up).
pub fn simulate_within_limit(
    scenario: &Scenario,
    limit: &RunLimit,
    shared: Option<&SharedRuns>,
) -> Result<Option<Outcome>, SimulationError> {
    simulate_within_limit_or_none(scenario, Some(limit), shared)
}

/// [`simulate_within_limit`], or without a limit [`simulate_within_sharing`]'s unlimited run.
fn simulate_within_limit_or_none(
    scenario: &Scenario,
    limit: Option<&RunLimit>,
    shared: Option<&SharedRuns>,
) -> Result<Option<Outcome>, SimulationError> {
    if scenario.variability.is_active() || scenario.iterations > strategies::MAX_ITERATIONS {
        return simulate(scenario).map(Some);
    }
    match simulate_once_sharing(scenario, false, limit, shared) {
        Err(SimulationError::Exec { source, .. })
            if matches!(*source, sim_core::exec::ExecError::PastLimit { .. }) =>
        {
            Ok(None)
        }
        other => other.map(Some),
    }
}

/// Simulates `scenario` for its iteration times alone: the summary's iteration times and
/// throughputs are [`simulate`]'s, bit for bit, while its breakdowns (compute, exposed
/// communication, idle, bubble, host- and input-bound time) are left at zero and `devices`
/// empty. For callers that read nothing else (the validation suite): the run keeps the ends
/// of each iteration's last ops, not the start and end of every op (16 bytes per op at the
/// peak), and skips the breakdowns (seconds on graphs of millions of ops). Runs with
/// variability, streamed iterations or node groups take [`simulate`]'s path whole.
pub fn simulate_iteration_times(scenario: &Scenario) -> Result<Summary, SimulationError> {
    if scenario.variability.is_active()
        || scenario.iterations > strategies::MAX_ITERATIONS
        || scenario.node_groups.is_some()
    {
        return simulate(scenario).map(|outcome| outcome.summary);
    }
    let lowered = lower(scenario)?;
    let (topology, memory, warnings) = prepare(scenario, &lowered.stages, lowered.offload.as_ref())?;
    let watched: Vec<sim_core::graph::OpId> = lowered.iteration_ends.iter().flatten().copied().collect();
    let run = scenario.network.run_watching(&lowered.graph, &topology, &watched).map_err(|source| {
        SimulationError::Exec { scenario: scenario.source.clone(), source: Box::new(source) }
    })?;
    let ops = lowered.graph.op_count();
    let info = lowered.info();
    // The graph goes before the summary is made, as `simulate` keeps it for its caller.
    let strategies::Lowered { graph, iteration_ends, .. } = lowered;
    drop(graph);
    let mut ends = run.ends.iter();
    let (iteration_times, last_end) = iteration_times(
        iteration_ends.iter().map(|iteration| ends.by_ref().take(iteration.len()).copied().max()),
    );
    let measured = Measured {
        iteration_times,
        total: last_end.since_start(),
        per_rank: Vec::new(),
        by_group: Vec::new(),
        offload_stall_ps: 0,
        host_bound_ps: 0,
        input_bound_ps: 0,
        bubble_ps: 0,
        flush_wait_ps: 0,
        ops,
        events: run.events,
    };
    summarize(scenario, &info, &topology, memory, warnings, measured)
}

/// Lowers `scenario`, an over-budget job refused with the scenario's name.
fn lower(scenario: &Scenario) -> Result<strategies::Lowered, SimulationError> {
    crate::mixed::lower(scenario).map_err(|error| match error {
        StrategyError::OverBudget(budget) => {
            SimulationError::OverBudget { scenario: scenario.source.clone(), budget }
        }
        error => error.into(),
    })
}

/// Each iteration's time from the end of its last op (iteration k ends when the last rank
/// finishes its optimizer step; `None`, an iteration without ops, ends where the one before
/// did), and the last end.
fn iteration_times(last_ends: impl Iterator<Item = Option<SimTime>>) -> (Vec<SimDuration>, SimTime) {
    let mut previous_end = SimTime::ZERO;
    let times = last_ends
        .map(|end| {
            let end = end.unwrap_or(previous_end);
            let time = end.saturating_since(previous_end);
            previous_end = end;
            time
        })
        .collect();
    (times, previous_end)
}

/// Significant digits of the iteration-time histogram.
const HISTOGRAM_DIGITS: u8 = 4;

/// A Monte Carlo run: the noise-free graph of one period (one iteration, or DASO's global-sync
/// period) simulated once by the engine, then re-timed `scenario.iterations` times with fresh
/// draws ([`sim_core::montecarlo`]).
fn monte_carlo(scenario: &Scenario, count_link_bytes: bool) -> Result<Outcome, SimulationError> {
    let period = match scenario.parallelism.sync {
        strategies::GradientSync::Daso { every, .. } => every.max(1),
        strategies::GradientSync::AllReduce => 1,
    };
    let mut nominal = scenario.clone();
    nominal.iterations = period;
    let mut outcome = simulate_once(&nominal, count_link_bytes, None)?;
    let started = Instant::now();
    let retimer =
        sim_core::montecarlo::Retimer::new(&outcome.graph, &outcome.timeline, &outcome.iteration_ends)
            .map_err(|source| SimulationError::MonteCarlo { scenario: scenario.source.clone(), source })?;
    let run = retimer.run(&scenario.variability, scenario.seed, scenario.iterations);
    outcome.monte_carlo_wall = Some(started.elapsed());

    let summary = &mut outcome.summary;
    let count = run.iteration_times.len().max(1) as f64;
    let times: Vec<f64> = run.iteration_times.iter().map(|t| t.as_secs_f64()).collect();
    let total_ps: u128 = run.iteration_times.iter().map(|t| u128::from(t.as_ps())).sum();
    let mean_time = SimDuration::from_ps((total_ps / run.iteration_times.len().max(1) as u128) as u64);
    let mean = mean_time.as_secs_f64();
    let stdev = if times.len() > 1 {
        let exact_mean = times.iter().sum::<f64>() / count;
        (times.iter().map(|t| (t - exact_mean) * (t - exact_mean)).sum::<f64>() / (count - 1.0)).sqrt()
    } else {
        0.0
    };
    let mut histogram = hdrhistogram::Histogram::<u64>::new(HISTOGRAM_DIGITS).map_err(|error| {
        SimulationError::MonteCarloHistogram { scenario: scenario.source.clone(), message: error.to_string() }
    })?;
    for time in &run.iteration_times {
        histogram.record((time.as_ps() / 1000).max(1)).map_err(|error| {
            SimulationError::MonteCarloHistogram {
                scenario: scenario.source.clone(),
                message: error.to_string(),
            }
        })?;
    }
    let quantile = |q: f64| histogram.value_at_quantile(q) as f64 * 1e-9;
    let nominal_s = summary.iteration_time.as_secs_f64();
    let ratio = if mean > 0.0 { nominal_s / mean } else { 1.0 };
    let mut critical: Vec<CriticalRank> = run
        .critical_path_counts
        .iter()
        .enumerate()
        .filter(|(_, count)| **count > 0)
        .map(|(rank, count)| CriticalRank {
            rank: rank as u32,
            repetitions: *count,
            share: f64::from(*count) / f64::from(run.repetitions.max(1)),
        })
        .collect();
    critical.sort_by(|a, b| b.repetitions.cmp(&a.repetitions).then(a.rank.cmp(&b.rank)));
    critical.truncate(10);
    summary.distribution = Some(DistributionSummary {
        iterations: scenario.iterations,
        seed: scenario.seed,
        sources: crate::file::variability::describe(&scenario.variability),
        graph_iterations: period,
        repetitions: run.repetitions,
        nominal_s,
        mean_s: mean,
        stdev_s: stdev,
        min_s: times.iter().copied().fold(f64::INFINITY, f64::min),
        p50_s: quantile(0.5),
        p90_s: quantile(0.9),
        p99_s: quantile(0.99),
        max_s: times.iter().copied().fold(0.0, f64::max),
        slowdown: if nominal_s > 0.0 { mean / nominal_s } else { 1.0 },
        critical_ranks: critical,
        communication: if scenario.network.fidelity == sim_core::fidelity::Fidelity::Analytical {
            "as in the noise-free run (exact under analytical: no contention)"
        } else {
            "as in the noise-free run (contention as it was there)"
        },
    });
    summary.iteration_p50_s = Some(quantile(0.5));
    summary.iteration_p99_s = Some(quantile(0.99));
    summary.iterations = scenario.iterations;
    summary.iteration_time = mean_time;
    summary.iteration_times = run.iteration_times;
    // Throughputs follow the mean iteration time.
    summary.samples_per_second *= ratio;
    summary.samples_per_second_per_device *= ratio;
    summary.tokens_per_second = summary.tokens_per_second.map(|t| t * ratio);
    summary.achieved_tflops_per_device *= ratio;
    summary.mfu *= ratio;
    summary.model_flops_utilization *= ratio;
    summary.hardware_flops_utilization *= ratio;
    Ok(outcome)
}

/// Engine runs shared by configurations whose runs have the same inputs (`parasim plan`'s
/// ZeRO-1 and ZeRO-2 twins often lower to the same graph): the first to come runs, the
/// others wait for it and take its timeline. Inputs are the same when the lowered graphs are
/// equal (compared whole, after their [`ExecGraph::fingerprint`]s), and so are the cluster,
/// its faults, the network settings and the limit with the ops it watches; node groups of
/// mixed devices are never shared. The engine reads nothing else, so a shared result is the
/// run's own, event for event.
///
/// [`ExecGraph::fingerprint`]: sim_core::graph::ExecGraph::fingerprint
#[derive(Debug, Default)]
pub struct SharedRuns {
    runs: std::sync::Mutex<Vec<SharedRun>>,
    taken: std::sync::atomic::AtomicU64,
}

impl SharedRuns {
    /// No runs yet.
    pub fn new() -> SharedRuns {
        SharedRuns::default()
    }

    /// How many runs took another's result instead of running.
    pub fn taken(&self) -> u64 {
        self.taken.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The result of running `graph` of `scenario` with `limit` (the latest end of `ends`), by
    /// `run` or by a run of the same inputs before.
    fn run(
        &self,
        scenario: &Scenario,
        graph: &sim_core::graph::ExecGraph,
        limit: Option<(&[sim_core::graph::OpId], &sim_core::exec::LimitHandle)>,
        run: impl Fn() -> Result<sim_core::exec::Timeline, sim_core::exec::ExecError>,
    ) -> Result<sim_core::exec::Timeline, sim_core::exec::ExecError> {
        let fingerprint = graph.fingerprint();
        // The run that takes another's result takes how far that run's bounds reached too.
        let handle = limit.map(|(_, handle)| handle);
        let limit = limit.map(|(ends, handle)| (ends.to_vec(), handle.limit()));
        let same = |other: &SharedRun| {
            other.fingerprint == fingerprint
                && other.limit == limit
                && other.network == scenario.network
                && other.cluster == scenario.cluster
                && other.faults == scenario.faults
                && *other.graph == *graph
        };
        let (result, first) = {
            let Ok(mut runs) = self.runs.lock() else {
                return run();
            };
            match runs.iter().find(|other| same(other)) {
                Some(other) => (std::sync::Arc::clone(&other.result), false),
                None => {
                    let result = std::sync::Arc::new(std::sync::OnceLock::new());
                    runs.push(SharedRun {
                        fingerprint,
                        graph: std::sync::Arc::new(graph.clone()),
                        limit,
                        network: scenario.network,
                        cluster: scenario.cluster.clone(),
                        faults: scenario.faults.clone(),
                        result: std::sync::Arc::clone(&result),
                    });
                    (result, true)
                }
            }
        };
        // The first runs (the others wait here for it); a failure other than the limit's is
        // not shared: each run fails on its own.
        let mut own = None;
        let shared = result.get_or_init(|| {
            let outcome = run();
            let highest = handle.map_or(SimTime::ZERO, |handle| handle.highest());
            let shared = match &outcome {
                Ok(timeline) => SharedResult::Done(timeline.clone(), highest),
                Err(sim_core::exec::ExecError::PastLimit { op, bound, limit }) => {
                    SharedResult::PastLimit { op: op.clone(), bound: *bound, limit: *limit, highest }
                }
                Err(_) => SharedResult::Failed,
            };
            own = Some(outcome);
            shared
        });
        if let Some(outcome) = own {
            return outcome;
        }
        match shared {
            SharedResult::Done(timeline, highest) => {
                self.count_taken(first);
                handle.inspect(|handle| handle.record(*highest));
                Ok(timeline.clone())
            }
            SharedResult::PastLimit { op, bound, limit, highest } => {
                self.count_taken(first);
                handle.inspect(|handle| handle.record(*highest));
                Err(sim_core::exec::ExecError::PastLimit { op: op.clone(), bound: *bound, limit: *limit })
            }
            SharedResult::Failed => run(),
        }
    }

    fn count_taken(&self, first: bool) {
        if !first {
            self.taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// One run of [`SharedRuns`]: its inputs and, once run, its result.
#[derive(Debug)]
struct SharedRun {
    fingerprint: u64,
    graph: std::sync::Arc<sim_core::graph::ExecGraph>,
    /// The watched ends and the latest they may come.
    limit: Option<(Vec<sim_core::graph::OpId>, SimTime)>,
    network: sim_core::fidelity::NetworkSettings,
    cluster: topology::ClusterSpec,
    faults: Option<crate::faults::Faults>,
    result: std::sync::Arc<std::sync::OnceLock<SharedResult>>,
}

/// What a shared run gave.
#[derive(Debug)]
enum SharedResult {
    /// It ran to the end, its bounds reaching the time given ([`sim_core::exec::LimitHandle::highest`]).
    Done(sim_core::exec::Timeline, SimTime),
    /// It was given up at its limit ([`sim_core::exec::ExecError::PastLimit`]).
    PastLimit { op: String, bound: SimTime, limit: SimTime, highest: SimTime },
    /// It failed otherwise.
    Failed,
}

/// One run of `scenario`'s graph; with `limit`, given up with [`ExecError::PastLimit`]
/// (`sim_core::exec`) once its iteration time is certain to be above it.
fn simulate_once(
    scenario: &Scenario,
    count_link_bytes: bool,
    limit: Option<&RunLimit>,
) -> Result<Outcome, SimulationError> {
    simulate_once_sharing(scenario, count_link_bytes, limit, None)
}

/// [`simulate_once`], its engine run shared through `shared` (when given, not counting link
/// bytes and without node groups).
fn simulate_once_sharing(
    scenario: &Scenario,
    count_link_bytes: bool,
    limit: Option<&RunLimit>,
    shared: Option<&SharedRuns>,
) -> Result<Outcome, SimulationError> {
    let started = Instant::now();
    // The lowering checks the graph's size against the work budget before it builds anything,
    // so an over-budget job is refused before the topology is built too.
    let lowered = lower(scenario)?;
    let (topology, memory, warnings) = prepare(scenario, &lowered.stages, lowered.offload.as_ref())?;
    let lowering_wall = started.elapsed();
    let started = Instant::now();
    let exec_error =
        |source| SimulationError::Exec { scenario: scenario.source.clone(), source: Box::new(source) };
    // The limit watches the last iteration's ends (see [`last_end`]).
    let watched = limit.map(|limit| {
        let ends =
            lowered.iteration_ends.iter().rev().find(|ends| !ends.is_empty()).map_or(&[][..], Vec::as_slice);
        (ends, &limit.handle)
    });
    let run = || match watched {
        Some((ends, handle)) => {
            let limit = sim_core::exec::EndLimit::with_handle(&lowered.graph, ends, handle.clone());
            scenario.network.run_within(&lowered.graph, &topology, limit)
        }
        None => scenario.network.run(&lowered.graph, &topology),
    };
    let (timeline, link_bytes) = if count_link_bytes {
        scenario.network.run_counting_link_bytes(&lowered.graph, &topology).map_err(exec_error)?
    } else if let Some(shared) = shared.filter(|_| scenario.node_groups.is_none()) {
        (shared.run(scenario, &lowered.graph, watched, run).map_err(exec_error)?, None)
    } else {
        (run().map_err(exec_error)?, None)
    };
    let simulation_wall = started.elapsed();

    let (iteration_times, previous_end) = iteration_times(
        lowered.iteration_ends.iter().map(|ends| ends.iter().map(|op| timeline.end[op.0 as usize]).max()),
    );

    // Means over the simulated ranks (with folding, each stands for its symmetric copies).
    let mut is_simulated = vec![false; lowered.graph.ranks() as usize];
    for rank in &lowered.ranks {
        is_simulated[rank.0 as usize] = true;
    }
    let simulated = |rank: usize| is_simulated[rank];
    // The statistics below skip the ops of ranks that are not simulated (shadow copies of
    // folded ranks' transfers) as well as host work: only the simulated ranks' are reported.
    let off_device = |op: &Op| op.meta.work().is_host() || !is_simulated[op.rank.0 as usize];
    // Each op counts as its metadata says (MPI's staging of a message through host memory is
    // part of its transfer: communication).
    let activity =
        |op: &Op| if is_simulated[op.rank.0 as usize] { Activity::of(op) } else { Activity::Ignored };
    // Exposed communication by the communicator each op talks over.
    let group_of = |op: &Op| op.meta.group().map(GroupKind::index);
    let per_rank: Vec<_> = breakdown_by(&lowered.graph, &timeline, SimTime::ZERO, previous_end, &activity)
        .into_iter()
        .enumerate()
        .filter(|(rank, _)| simulated(*rank))
        .map(|(_, b)| b)
        .collect();
    let by_group: Vec<_> = exposed_by_class(
        &lowered.graph,
        &timeline,
        SimTime::ZERO,
        previous_end,
        &group_of,
        GroupKind::ALL.len(),
        &activity,
    )
    .into_iter()
    .enumerate()
    .filter(|(rank, _)| simulated(*rank))
    .map(|(_, b)| b)
    .collect();
    // Out-of-core: time a copy to or from host memory runs while no kernel does.
    let offload_stall_ps: u128 = if lowered.offload.is_some() {
        let copies = lowered.graph.find_origin(strategies::OFFLOAD_ORIGIN);
        let offload = |op: &Op| if Some(op.meta.origin()) == copies { Some(0) } else { Some(1) };
        exposed_by_class(&lowered.graph, &timeline, SimTime::ZERO, previous_end, &offload, 2, &activity)
            .into_iter()
            .enumerate()
            .filter(|(rank, _)| simulated(*rank))
            .map(|(_, b)| u128::from(b[0].as_ps()))
            .sum()
    } else {
        0
    };
    // Host-bound: a kernel whose launch on the host ends after everything else it waits for
    // (its stream predecessor included) started late by that much: the GPU idled for the host.
    // Input-bound: the same for a kernel waiting for its batch (taken, broadcast, unpacked),
    // and for the loop's fetch of the next batch waiting for the loader.
    let graph = &lowered.graph;
    let mut host_bound_ps = 0u128;
    let mut input_bound_ps = 0u128;
    // Each rank's host waits, so that the pipeline bubble below does not count them again.
    let pipelined = scenario.parallelism.pipeline > 1;
    let mut host_waits: Vec<Vec<(SimTime, SimTime)>> =
        if pipelined { vec![Vec::new(); graph.ranks() as usize] } else { Vec::new() };
    let waited = |until: SimTime, from: SimTime| u128::from(until.saturating_since(from).as_ps());
    let is_launch = |op: &Op| op.meta.work() == Work::Launch;
    let is_loader = |op: &Op| op.meta.work() == Work::Loader;
    let is_input = |op: &Op| op.meta.work().is_input();
    for (index, op) in graph.ops().iter().enumerate() {
        if !simulated(op.rank.0 as usize) || is_launch(op) || is_loader(op) {
            continue;
        }
        let id = sim_core::graph::OpId(index as u32);
        let mut launch = None;
        let mut input = None;
        let mut ready = graph.previous_in_stream(id).map_or(SimTime::ZERO, |p| timeline.end[p.0 as usize]);
        for dep in graph.deps(id) {
            let end = timeline.end[dep.0 as usize];
            let dep = graph.op(*dep);
            if is_launch(dep) {
                launch = Some(end);
            } else if is_loader(dep) || (is_input(dep) && !is_input(op)) {
                input = Some(input.unwrap_or(end).max(end));
            } else {
                ready = ready.max(end);
            }
        }
        if is_input(op) {
            // A take or a fetch waiting for the loader beyond the end of the step before it
            // (the broadcast's wait for the serialised batch is counted where a kernel waits
            // for the broadcast).
            if let Some(input) = input
                && matches!(op.kind, OpKind::Compute { .. })
                && ready > SimTime::ZERO
            {
                input_bound_ps += waited(input, ready);
            }
            continue;
        }
        if let Some(input) = input {
            let started = ready.max(launch.unwrap_or(SimTime::ZERO));
            if input > started {
                input_bound_ps += waited(input, started);
                ready = input;
            }
        }
        if let Some(launch) = launch
            && graph.previous_in_stream(id).is_some()
        {
            host_bound_ps += waited(launch, ready);
            if pipelined && launch > ready {
                host_waits[op.rank.0 as usize].push((ready, launch));
            }
        }
    }
    // The pipeline bubble: idle time until the last backward of the rank's pipeline, counting
    // the wait in the pipeline flush as idle (the breakdown counted it as exposed pipeline
    // communication: move it), and not the time the GPU waited for its own host (host-bound).
    let mut bubble_ps = 0u128;
    let mut flush_wait_ps = 0u128;
    if pipelined {
        let layout = scenario.parallelism.layout();
        // The pipeline flush's allreduce: its wait is the pipeline draining.
        let flush = graph.find_origin(strategies::FLUSH_ORIGIN);
        let is_flush = |op: &Op| Some(op.meta.origin()) == flush && matches!(op.kind, OpKind::Collective(_));
        let mut start = SimTime::ZERO;
        for (iteration_ends, pipeline_ends) in lowered.iteration_ends.iter().zip(&lowered.pipeline_ends) {
            let mut ends = vec![None; layout.ranks() as usize];
            for (rank, op) in lowered.ranks.iter().zip(pipeline_ends) {
                ends[rank.0 as usize] = Some(timeline.end[op.0 as usize]);
            }
            let until: Vec<SimTime> = (0..layout.ranks())
                .map(|rank| match ends[rank as usize] {
                    None => start, // not simulated: an empty window
                    Some(_) => layout
                        .group(Axis::Pipeline, RankId(rank))
                        .iter()
                        .filter_map(|member| ends[member.0 as usize])
                        .max()
                        .unwrap_or(start),
                })
                .collect();
            let sum =
                |durations: Vec<SimDuration>| durations.iter().map(|d| u128::from(d.as_ps())).sum::<u128>();
            let idle = |ignore: &dyn Fn(&Op) -> bool| {
                sum(idle_until_besides(&lowered.graph, &timeline, start, &until, ignore, &host_waits))
            };
            let with_flush = idle(&|op| is_flush(op) || off_device(op));
            let without = idle(&off_device);
            bubble_ps += with_flush;
            flush_wait_ps += with_flush.saturating_sub(without);
            start = iteration_ends.iter().map(|op| timeline.end[op.0 as usize]).max().unwrap_or(start);
        }
    }
    let devices = match &scenario.node_groups {
        Some(groups) => {
            let simulated_ranks: Vec<RankId> =
                (0..lowered.graph.ranks()).filter(|rank| simulated(*rank as usize)).map(RankId).collect();
            crate::mixed::utilisation(
                scenario,
                groups,
                &simulated_ranks,
                &per_rank,
                &lowered.stages,
                previous_end.since_start(),
            )?
        }
        None => Vec::new(),
    };
    let measured = Measured {
        iteration_times,
        total: previous_end.since_start(),
        per_rank,
        by_group,
        offload_stall_ps,
        host_bound_ps,
        input_bound_ps,
        bubble_ps,
        flush_wait_ps,
        ops: lowered.graph.op_count(),
        events: timeline.events,
    };
    let info = lowered.info();
    let mut summary = summarize(scenario, &info, &topology, memory, warnings, measured)?;
    summary.devices = devices;
    let rank_names = rank_names(scenario);
    Ok(Outcome {
        summary,
        lowering_wall,
        simulation_wall,
        graph: lowered.graph,
        timeline,
        spans: lowered.spans,
        rank_names,
        link_bytes,
        iteration_ends: lowered.iteration_ends,
        monte_carlo_wall: None,
    })
}

/// What every run of `scenario` checks once it is lowered: the cluster's topology (with its
/// faults), the memory of the most loaded stage against the device's (an error when it does
/// not fit), and host memory for out-of-core training; returns the topology, that memory, and
/// the warnings.
pub(crate) fn prepare(
    scenario: &Scenario,
    stages: &[strategies::StageSummary],
    offload: Option<&strategies::OffloadTotals>,
) -> Result<(Topology, MemoryBreakdown, Vec<String>), SimulationError> {
    let context = || {
        format!(
            "{}: {} at micro-batch {} ({})",
            scenario.source,
            scenario.model.name,
            scenario.micro_batch,
            strategies::describe_parallelism(&scenario.parallelism)
        )
    };
    let topology = topology(scenario)?;
    // A configuration that does not fit is an error, not a simulation: the most loaded stage.
    let memory =
        stages.iter().map(|stage| stage.memory).max_by_key(|memory| memory.total()).unwrap_or_default();
    match &scenario.node_groups {
        // Each group's stages against its own device: a stage on a larger device than the
        // first group's may need more than that one has.
        Some(groups) => crate::mixed::check_memory(scenario, groups, stages, &context)?,
        None => memory.check(&scenario.device).map_err(|source| {
            let hint = match &source {
                MemoryError::DoesNotFit { .. } => ways_out(scenario, &memory),
                MemoryError::Invalid { .. } => String::new(),
            };
            SimulationError::Memory { context: context(), source, hint: Box::new(hint) }
        })?,
    }
    let mut warnings = Vec::new();
    if let Some(offload) = offload {
        let node = u64::from(scenario.cluster.gpus_per_node);
        let needed = offload.host_bytes.saturating_mul(node);
        let capacity = scenario.host_memory.unwrap_or(sim_core::units::Bytes::ZERO);
        if needed > capacity.0 {
            return Err(SimulationError::HostMemory {
                context: context(),
                needed: sim_core::units::Bytes(needed),
                capacity,
                per_gpu: sim_core::units::Bytes(offload.host_bytes),
                gpus: scenario.cluster.gpus_per_node,
            });
        }
        if offload.without.total() <= scenario.device.memory_capacity {
            warnings.push(format!(
                "workload.offload = {:?}, but the configuration fits in GPU memory without it ({} of {}): \
                 offloading only adds host-link traffic (set offload = \"none\")",
                scenario.parallelism.offload.name(),
                workloads::memory::gigabytes(offload.without.total()),
                workloads::memory::gigabytes(scenario.device.memory_capacity)
            ));
        }
    }
    Ok((topology, memory, warnings))
}

/// What a run measured over all its iterations, before it is averaged into a [`Summary`]:
/// sums in picoseconds over the simulated ranks.
pub(crate) struct Measured {
    /// Each iteration's time.
    pub(crate) iteration_times: Vec<SimDuration>,
    /// From zero to the end of the last iteration.
    pub(crate) total: SimDuration,
    /// Each simulated rank's breakdown over the run.
    pub(crate) per_rank: Vec<sim_core::stats::RankBreakdown>,
    /// Each simulated rank's exposed communication by communicator ([`GroupKind::ALL`]).
    pub(crate) by_group: Vec<Vec<SimDuration>>,
    /// Time copies to or from host memory ran while no kernel did.
    pub(crate) offload_stall_ps: u128,
    /// Time kernels waited for their host launch.
    pub(crate) host_bound_ps: u128,
    /// Time kernels and the loop waited for input.
    pub(crate) input_bound_ps: u128,
    /// Pipeline bubble, flush wait included.
    pub(crate) bubble_ps: u128,
    /// The part of the bubble spent waiting in the pipeline flush.
    pub(crate) flush_wait_ps: u128,
    /// Ops simulated.
    pub(crate) ops: usize,
    /// Events processed.
    pub(crate) events: u64,
}

/// The report of `scenario`'s run: what was `measured`, averaged per rank and iteration, with
/// what the lowering said (`info`), on `topology`, with the most loaded stage's `memory`.
pub(crate) fn summarize(
    scenario: &Scenario,
    info: &strategies::LoweredInfo,
    topology: &Topology,
    memory: MemoryBreakdown,
    warnings: Vec<String>,
    measured: Measured,
) -> Result<Summary, SimulationError> {
    let strategy = scenario.strategy();
    let iterations = u64::from(scenario.iterations);
    let iteration_time = SimDuration::from_ps(measured.total.as_ps() / iterations);
    let seconds = iteration_time.as_secs_f64();
    let Measured {
        iteration_times,
        per_rank,
        by_group,
        offload_stall_ps,
        host_bound_ps,
        input_bound_ps,
        bubble_ps,
        flush_wait_ps,
        ..
    } = measured;
    let ranks = per_rank.len().max(1) as u64;
    let mean = |field: fn(&sim_core::stats::RankBreakdown) -> SimDuration| {
        let sum: u128 = per_rank.iter().map(|r| u128::from(field(r).as_ps())).sum();
        SimDuration::from_ps((sum / u128::from(ranks * iterations)) as u64)
    };
    let gpus = scenario.cluster.nodes * scenario.cluster.gpus_per_node;
    let samples = scenario.global_batch as f64;
    let exposed_of = |kind: GroupKind| {
        let index = GroupKind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        let mut sum: u128 = by_group.iter().map(|r| u128::from(r[index].as_ps())).sum();
        if kind == GroupKind::Pipeline {
            sum = sum.saturating_sub(flush_wait_ps);
        }
        seconds_of(SimDuration::from_ps((sum / u128::from(ranks * iterations)) as u64))
    };
    let flush_wait = SimDuration::from_ps((flush_wait_ps / u128::from(ranks * iterations)) as u64);
    let input_bound = SimDuration::from_ps((input_bound_ps / u128::from(ranks * iterations)) as u64);
    let host_bound = SimDuration::from_ps((host_bound_ps / u128::from(ranks * iterations)) as u64);
    let bubble = SimDuration::from_ps((bubble_ps / u128::from(ranks * iterations)) as u64);
    // Megatron-LM's model FLOPs: 2 per multiply-accumulate of the matrix products, three
    // passes (forward, backward-data, backward-weight), every sample of the iteration.
    // 6 FLOPs per MAC per sample for a training step (2 forward, 4 backward), 2 for a
    // forward pass alone (`workload.passes`).
    // Under LoRA a frozen layer's weight gradient does not run: 4 per MAC
    // ([`workloads::Model::model_training_flops_per_sample`]).
    let per_sample = if scenario.passes.trains() {
        scenario.model.model_training_flops_per_sample()
    } else {
        2.0 * scenario.model.macs_per_sample()
    };
    let model_flops = per_sample * scenario.global_batch as f64;
    let hardware_flops = info.flops_per_rank_iteration + info.recompute_flops_per_rank_iteration;
    let p = &scenario.parallelism;
    let peak = match &scenario.node_groups {
        Some(groups) => crate::mixed::mean_peak(scenario, groups)?,
        None => scenario.device.peak(scenario.precision)?.per_second(),
    };
    let achieved = info.flops_per_rank_iteration / seconds;
    // A node of one device has no link inside it to describe.
    let intra = if scenario.cluster.gpus_per_node == 1 {
        format!("none (one {} per node)", scenario.device.kind.noun())
    } else {
        match scenario.node_groups.as_ref().map(|groups| server_rates(groups)) {
            // Each group's servers at their own rate: name them.
            Some(rates) if rates.len() > 1 => {
                let link = scenario.cluster.intra_node.link();
                let kind = scenario.cluster.intra_node.describe();
                let kind = kind.split(' ').next().unwrap_or("");
                format!("{kind} ({}) {}", rates.join(", "), link.latency)
            }
            _ => scenario.cluster.intra_node.describe(),
        }
    };
    let network =
        scenario.cluster.network.describe(scenario.cluster.gpus_per_node, scenario.device.kind.noun());
    let goodput = match &scenario.failures {
        Some(failures) => Some(goodput_of(scenario, failures, topology, iteration_time)?),
        None => None,
    };
    let summary = Summary {
        scenario: scenario.source.clone(),
        framework: scenario.framework.clone(),
        host: scenario.host.clone(),
        model: ModelSummary {
            name: scenario.model.name.clone(),
            parameters: scenario.model.parameters(),
            frozen_parameters: Some(scenario.model.frozen_parameters()).filter(|&frozen| frozen > 0),
            macs_per_sample: scenario.model.macs_per_sample(),
            batch_per_device: scenario.global_batch / u64::from(scenario.parallelism.data),
            precision: scenario.precision.to_string(),
            gradient_precision: scenario.gradient_precision.to_string(),
            compute_model: scenario.compute_source.clone(),
            optimizer: scenario.optimizer.to_string(),
            muon: (scenario.optimizer == workloads::Optimizer::Muon).then(|| MuonSummary {
                steps: scenario.muon.steps,
                iteration: scenario.muon.iteration.to_string(),
                distribution: scenario.muon.distribution.to_string(),
            }),
            passes: (!scenario.passes.trains()).then(|| scenario.passes.to_string()),
        },
        cluster: ClusterSummary {
            gpus,
            nodes: scenario.cluster.nodes,
            gpus_per_node: scenario.cluster.gpus_per_node,
            device: match &scenario.node_groups {
                Some(groups) => groups.describe(),
                None => scenario.device.display_name.clone(),
            },
            device_kind: scenario.device.kind,
            intra_node: intra,
            network,
        },
        strategy: StrategySummary {
            data_parallel: p.data,
            gradient_buckets: info.buckets.len(),
            gradient_bytes: info.gradient_bytes,
            allreduce: p.data_algorithm.name(),
            tensor: p.tensor,
            sequence_parallel: p.sequence_parallel,
            pipeline: p.pipeline,
            virtual_stages: p.virtual_stages,
            schedule: if p.pipeline > 1 && p.virtual_stages > 1 && !p.schedule.two_chunks() {
                "interleaved-1f1b"
            } else {
                p.schedule.name()
            },
            pipeline_host_sync: p
                .pipeline_host_sync
                .applies(p.pipeline, p.virtual_stages)
                .then_some(p.pipeline_host_sync.name()),
            context: p.context,
            expert: p.expert,
            filter: p.filter,
            channel: p.channel,
            spatial: p.spatial,
            spatial_dims: (p.spatial > 1).then_some(p.spatial_dims.name()),
            zero: p.zero,
            zero_implementation: (p.zero >= 3
                && p.zero_implementation != strategies::ZeroImplementation::Fsdp)
                .then_some(p.zero_implementation.name()),
            order: p.order.to_string(),
            global_batch: scenario.global_batch,
            micro_batch: scenario.micro_batch,
            micro_batches: info.micro_batches,
            daso: match p.sync {
                strategies::GradientSync::Daso { every, blocking, wait, node } => Some(DasoSummary {
                    node_gpus: node,
                    global_sync_every: every,
                    global_sync: if blocking { "blocking" } else { "non-blocking" },
                    global_sync_wait: if blocking { 0 } else { wait },
                    global_bytes: scenario.model.parameters() * scenario.gradient_precision.bytes(),
                }),
                strategies::GradientSync::AllReduce => None,
            },
            offload: info.offload.as_ref().map(|offload| OffloadSummary {
                offload: p.offload.name(),
                to_host_bytes: offload.to_host_bytes,
                to_device_bytes: offload.to_device_bytes,
                activation_bytes: offload.activation_bytes,
                weight_bytes: offload.weight_bytes,
                gradient_bytes: offload.gradient_bytes,
                optimizer_to_device_bytes: offload.optimizer_to_device_bytes,
                optimizer_to_host_bytes: offload.optimizer_to_host_bytes,
                host_memory_bytes: offload.host_bytes * u64::from(scenario.cluster.gpus_per_node),
                host_memory_capacity: scenario.host_memory.map_or(0, |b| b.0),
                host_optimizer_step_s: offload.host_step.as_secs_f64(),
                host_cpu: p
                    .offload
                    .host_optimizer()
                    .then(|| scenario.host_cpu.as_ref().map(|cpu| cpu.display_name.clone()))
                    .flatten(),
                nvme_bytes: scenario.nvme.map(|_| offload.nvme_bytes),
                nvme_read_bytes: scenario.nvme.map(|_| offload.nvme_read_bytes),
                nvme_bandwidth_bytes_per_s: scenario.nvme.map(|b| b.bytes_per_second()),
            }),
            input: strategy.input_batch().map(|(input, batch)| InputSummary {
                loader: input.loader.name(),
                rate: input.rate,
                prefetch: input.prefetch,
                samples_per_loader: batch.samples,
                broadcast_bytes: batch.broadcast.map_or(0, |bytes| bytes.0),
                broadcast_rate: input.broadcast_rate.map(|rate| rate.bytes_per_second()),
            }),
            input_copy_bytes: strategy.input_copy_bytes().map(|bytes| bytes.0),
        },
        fidelity: scenario.network.fidelity.name(),
        link_conditions: scenario
            .faults
            .as_ref()
            .map(crate::faults::Faults::describe_in_time)
            .unwrap_or_default(),
        protocol: scenario.network.protocols.to_string(),
        iterations: scenario.iterations,
        iteration_time,
        iteration_times,
        samples_per_second: samples / seconds,
        samples_per_second_per_device: samples / seconds / f64::from(gpus),
        tokens_per_second: strategies::shard::sequence_length(&scenario.model)
            .map(|tokens| samples * tokens as f64 / seconds),
        achieved_tflops_per_device: achieved / 1e12,
        peak_tflops_per_device: peak / 1e12,
        mfu: achieved / peak,
        breakdown: Breakdown {
            compute: mean(|r| r.compute),
            exposed_communication: mean(|r| r.exposed_communication).saturating_sub(flush_wait),
            idle: mean(|r| r.idle).saturating_add(flush_wait),
            communication: mean(|r| r.communication),
            exposed_by_group: ExposedByGroup {
                tensor: exposed_of(GroupKind::Tensor),
                pipeline: exposed_of(GroupKind::Pipeline),
                data: exposed_of(GroupKind::Data),
                context: exposed_of(GroupKind::Context),
                expert: exposed_of(GroupKind::Expert),
                filter: exposed_of(GroupKind::Filter),
                channel: exposed_of(GroupKind::Channel),
                spatial: exposed_of(GroupKind::Spatial),
            },
            bubble,
            host_bound,
            input_bound,
            offload_stall: SimDuration::from_ps((offload_stall_ps / u128::from(ranks * iterations)) as u64),
        },
        model_flops_per_iteration: model_flops,
        model_flops_utilization: model_flops / seconds / f64::from(gpus) / peak,
        hardware_flops_utilization: hardware_flops / seconds / peak,
        stages: info
            .stages
            .iter()
            .map(|stage| StageMemory {
                stage: stage.stage,
                layers: stage
                    .layers
                    .iter()
                    .map(|r| {
                        let first = &scenario.model.layers[r.start].name;
                        let last = &scenario.model.layers[r.end - 1].name;
                        format!("{first} .. {last}")
                    })
                    .collect(),
                blocks: stage.blocks,
                parameters: stage.parameters,
                peak_micro_batches_in_flight: stage.peak_micro_batches_in_flight,
                memory: MemorySummary::new(&stage.memory, scenario),
            })
            .collect(),
        memory: MemorySummary::new(&memory, scenario),
        engine: EngineCounters { ops: measured.ops, events: measured.events },
        iteration_p50_s: None,
        iteration_p99_s: None,
        distribution: None,
        warnings,
        goodput,
        devices: Vec::new(),
    };
    Ok(summary)
}

/// A name for each rank's timeline track: its stage and coordinates.
pub(crate) fn rank_names(scenario: &Scenario) -> Vec<String> {
    let layout = scenario.parallelism.layout();
    (0..layout.ranks())
        .map(|rank| {
            let c = layout.coordinates(RankId(rank));
            if scenario.parallelism.is_data_parallel() {
                format!("rank {rank}")
            } else {
                format!(
                    "stage {} · rank {rank} (tp {}, cp {}, dp {})",
                    c.pipeline, c.tensor, c.context, c.data
                )
            }
        })
        .collect()
}

/// Each device type's server link rate (`"300 GB/s on A100-SXM4-80GB"`), in order of first
/// appearance, when the node groups' servers keep their own rates; one entry when they agree.
fn server_rates(groups: &crate::file::node_groups::NodeGroups) -> Vec<String> {
    let mut rates: Vec<(String, String)> = Vec::new();
    for group in &groups.groups {
        let Some(rate) = group.intra_node else { return Vec::new() };
        let entry = (format!("{rate}"), group.device.display_name.clone());
        if !rates.contains(&entry) {
            rates.push(entry);
        }
    }
    let mut distinct: Vec<&String> = rates.iter().map(|(rate, _)| rate).collect();
    distinct.dedup();
    if distinct.len() < 2 {
        return Vec::new();
    }
    rates.into_iter().map(|(rate, device)| format!("{rate} on {device}")).collect()
}

/// The fabric `scenario` runs on: its cluster's topology, each node group's servers at their
/// own links' rates, with `[faults]` applied (a degraded link at its reduced capacity), as
/// every run builds it; what a report of its links' loads divides by.
pub fn topology(scenario: &Scenario) -> Result<Topology, SimulationError> {
    let mut topology = fabric(&scenario.cluster, None, &scenario.source)?;
    if let Some(groups) = &scenario.node_groups {
        // Each group's servers at their own links' rates, before faults scale them.
        topology.set_server_links(topology::Tier::IntraNode, |node| {
            groups.group_of_node(node).and_then(|group| group.intra_node)
        });
        topology.set_server_links(topology::Tier::HostMemory, |node| {
            groups.group_of_node(node).and_then(|group| group.host_link)
        });
    }
    if let Some(faults) = &scenario.faults {
        faults.apply(&mut topology).map_err(|error| SimulationError::Key {
            scenario: scenario.source.to_string(),
            key: error.key,
            message: error.message,
        })?;
    }
    Ok(topology)
}

/// The cluster's fabric with the scenario's `[faults]` applied (degraded or failed links):
/// what a run of one job, or of several sharing it, simulates on. A fault naming a link the
/// fabric does not have is an error at its key, in `source`.
pub(crate) fn fabric(
    cluster: &topology::ClusterSpec,
    faults: Option<&crate::faults::Faults>,
    source: &str,
) -> Result<Topology, SimulationError> {
    let mut topology = Topology::build(cluster)?;
    if let Some(faults) = faults {
        faults.apply(&mut topology).map_err(|error| SimulationError::Key {
            scenario: source.to_string(),
            key: error.key,
            message: error.message,
        })?;
    }
    Ok(topology)
}

/// Bytes of one checkpoint of `scenario`'s model: its weights and optimizer state, whole (the
/// memory model's accounting for one device holding all of it: replicas write one copy).
pub fn checkpoint_bytes(scenario: &Scenario) -> sim_core::units::Bytes {
    let plan = workloads::memory::MemoryPlan {
        model: &scenario.model,
        precision: scenario.precision,
        gradient_precision: scenario.gradient_precision,
        optimizer_precision: scenario.optimizer_precision,
        optimizer: scenario.optimizer,
        weights: scenario.weights,
        micro_batch: 1,
        micro_batches_in_flight: 1,
        recompute: Recompute::None,
        sharding: workloads::memory::Sharding::default(),
        communication_buffers: sim_core::units::Bytes::ZERO,
    };
    let state = plan.device_breakdown(scenario.model.parameters(), 0, 0, 0);
    sim_core::units::Bytes(state.weights.0.saturating_add(state.optimizer.0))
}

/// The goodput of `scenario` under `failures`, with iterations of `iteration_time`, on
/// `topology` (whose cables can fail, and which names the links of link events).
fn goodput_of(
    scenario: &Scenario,
    failures: &crate::failures::Failures,
    topology: &Topology,
    iteration_time: SimDuration,
) -> Result<crate::failures::GoodputSummary, SimulationError> {
    use topology::{LinkId, Tier};
    let is_cable = |tier: Tier| !matches!(tier, Tier::IntraNode | Tier::GpuToNic | Tier::HostMemory);
    let links = topology.link_count() as u32;
    let directed = (0..links).filter(|&id| is_cable(topology.link(LinkId(id)).tier)).count() as u64;
    if let Some((key, message)) = crate::failures::unknown_link(failures, topology) {
        return Err(SimulationError::Key { scenario: scenario.source.clone(), key, message });
    }
    let components = crate::failures::Components {
        gpus: u64::from(scenario.cluster.nodes) * u64::from(scenario.cluster.gpus_per_node),
        nodes: u64::from(scenario.cluster.nodes),
        cables: directed / 2,
    };
    Ok(crate::failures::goodput(
        failures,
        iteration_time.as_secs_f64(),
        checkpoint_bytes(scenario),
        components,
    ))
}
