//! One simulation of a scenario: topology + lowering -> engine -> [`Summary`]. The function
//! `parasim run`, `validate`, `sweep` and `plan` share, so each of them reports the same
//! numbers for the same scenario.

use std::time::{Duration, Instant};

use serde::{Serialize, Serializer};
use sim_core::stats::breakdown;
use sim_core::units::{SimDuration, SimTime};
use topology::{FabricSpec, IntraNode, Topology, TopologyError};

use crate::data_parallel::{DataParallel, LoweringError};
use crate::device::DeviceError;
use crate::memory::{MemoryBreakdown, MemoryError};
use crate::scenario::Scenario;

/// Everything `parasim run` reports. A pure function of the scenario: no wall-clock numbers,
/// so two runs print byte-identical JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The scenario file.
    pub scenario: String,
    /// What was trained.
    pub model: ModelSummary,
    /// On what.
    pub cluster: ClusterSummary,
    /// How it was split.
    pub strategy: StrategySummary,
    /// Network model.
    pub fidelity: &'static str,
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
    /// FLOP/s one GPU achieves, in TFLOP/s.
    pub achieved_tflops_per_device: f64,
    /// The device's datasheet peak for the compute dtype, in TFLOP/s.
    pub peak_tflops_per_device: f64,
    /// Model FLOPs utilization: achieved / peak.
    pub mfu: f64,
    /// Where one iteration's time goes, mean over GPUs.
    pub breakdown: Breakdown,
    /// What one GPU holds at the peak of an iteration.
    pub memory: MemorySummary,
    /// Engine counters.
    pub engine: EngineCounters,
}

/// The model part of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct ModelSummary {
    /// Zoo name.
    pub name: String,
    /// Trainable parameters.
    pub parameters: u64,
    /// Multiply-accumulates of one sample's forward pass.
    pub macs_per_sample: f64,
    /// Samples per GPU per iteration.
    pub batch_per_device: u64,
    /// Compute dtype.
    pub precision: String,
    /// Dtype of the all-reduced gradients.
    pub gradient_precision: String,
    /// Optimizer.
    pub optimizer: String,
    /// Where the compute model's parameters came from (defaults or a calibrated profile).
    pub compute_model: String,
}

/// The cluster part of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterSummary {
    /// Total GPUs.
    pub gpus: u32,
    /// Servers.
    pub nodes: u32,
    /// GPUs per server.
    pub gpus_per_node: u32,
    /// Device name.
    pub device: String,
    /// Inside a server, e.g. "nvswitch 300 GB/s 0.7 us".
    pub intra_node: String,
    /// Between servers.
    pub network: String,
}

/// The parallel strategy part of the summary.
#[derive(Debug, Clone, Serialize)]
pub struct StrategySummary {
    /// Data-parallel ranks.
    pub data_parallel: u32,
    /// Gradient buckets per iteration.
    pub gradient_buckets: usize,
    /// Gradient bytes all-reduced per iteration.
    pub gradient_bytes: u64,
    /// Allreduce algorithm.
    pub allreduce: &'static str,
}

/// One iteration's time split three ways, mean over GPUs.
#[derive(Debug, Clone, Serialize)]
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
}

/// Memory of one GPU, in bytes, against its capacity.
#[derive(Debug, Clone, Serialize)]
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
}

impl MemorySummary {
    fn new(memory: &MemoryBreakdown, scenario: &Scenario) -> MemorySummary {
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
        }
    }
}

/// Engine counters (deterministic).
#[derive(Debug, Clone, Serialize)]
pub struct EngineCounters {
    /// Ops in the execution graph.
    pub ops: usize,
    /// Events the engine processed.
    pub events: u64,
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
}

/// A scenario could not be simulated.
#[derive(Debug, thiserror::Error)]
pub enum SimulationError {
    /// The cluster's graph could not be built.
    #[error("building the cluster topology: {0}")]
    Topology(#[from] TopologyError),
    /// The memory model refused the configuration, or it does not fit.
    #[error("{context}: {source}")]
    Memory {
        /// The scenario and the configuration.
        context: String,
        /// Why.
        #[source]
        source: MemoryError,
    },
    /// The strategy could not be lowered to an execution graph.
    #[error("lowering the iteration to an execution graph: {0}")]
    Lowering(#[from] LoweringError),
    /// The engine failed.
    #[error("simulating: {0}")]
    Exec(#[from] sim_core::exec::ExecError),
    /// The device has no peak for the compute dtype.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Simulates `scenario`.
pub fn simulate(scenario: &Scenario) -> Result<Outcome, SimulationError> {
    let started = Instant::now();
    let topology = Topology::build(&scenario.cluster)?;
    let plan = DataParallel {
        model: &scenario.model,
        device: &scenario.device,
        compute: &scenario.compute,
        precision: scenario.precision,
        gradient_precision: scenario.gradient_precision,
        batch_per_device: scenario.batch_per_device,
        ranks: scenario.data_parallel,
        bucket_cap: scenario.bucket_size,
        first_bucket_cap: scenario.first_bucket_size,
        optimizer: scenario.optimizer,
        algorithm: scenario.allreduce,
        iterations: scenario.iterations,
        recompute: scenario.recompute,
    };
    // A configuration that does not fit is an error, not a simulation.
    let context = || {
        format!("{}: {} at batch {} per GPU", scenario.source, scenario.model.name, scenario.batch_per_device)
    };
    let memory = plan.memory().map_err(|source| SimulationError::Memory { context: context(), source })?;
    memory
        .check(&scenario.device)
        .map_err(|source| SimulationError::Memory { context: context(), source })?;
    let lowered = plan.lower()?;
    let lowering_wall = started.elapsed();
    let started = Instant::now();
    let timeline = scenario.network.run(&lowered.graph, &topology)?;
    let simulation_wall = started.elapsed();

    // Iteration k ends when the last rank finishes its optimizer step.
    let mut iteration_times = Vec::with_capacity(lowered.iteration_ends.len());
    let mut previous_end = SimTime::ZERO;
    for ends in &lowered.iteration_ends {
        let end = ends.iter().map(|op| timeline.end[op.0 as usize]).max().unwrap_or(previous_end);
        iteration_times.push(end.saturating_since(previous_end));
        previous_end = end;
    }
    let iterations = u64::from(scenario.iterations);
    let total = previous_end.since_start();
    let iteration_time = SimDuration::from_ps(total.as_ps() / iterations);
    let seconds = iteration_time.as_secs_f64();

    let per_rank = breakdown(&lowered.graph, &timeline, SimTime::ZERO, previous_end);
    let ranks = per_rank.len().max(1) as u64;
    let mean = |field: fn(&sim_core::stats::RankBreakdown) -> SimDuration| {
        let sum: u128 = per_rank.iter().map(|r| u128::from(field(r).as_ps())).sum();
        SimDuration::from_ps((sum / u128::from(ranks * iterations)) as u64)
    };
    let gpus = scenario.cluster.nodes * scenario.cluster.gpus_per_node;
    let samples = scenario.batch_per_device as f64 * f64::from(scenario.data_parallel);
    let peak = scenario.device.peak(scenario.precision)?.per_second();
    let achieved = lowered.flops_per_rank_iteration / seconds;
    let intra = match scenario.cluster.intra_node {
        IntraNode::NvSwitch(link) => format!("nvswitch {} {}", link.bandwidth, link.latency),
        IntraNode::PcieSwitch(link) => format!("pcie-switch {} {}", link.bandwidth, link.latency),
        IntraNode::NvLinkMesh(link) => format!("nvlink-mesh {} {}", link.bandwidth, link.latency),
    };
    let network = match &scenario.cluster.network.fabric {
        FabricSpec::Switch { link } => {
            format!("switch, {} {} per GPU", link.bandwidth.display_bits(), link.latency)
        }
        fabric => fabric.to_string(),
    };
    let summary = Summary {
        scenario: scenario.source.clone(),
        model: ModelSummary {
            name: scenario.model.name.clone(),
            parameters: scenario.model.parameters(),
            macs_per_sample: scenario.model.macs_per_sample(),
            batch_per_device: scenario.batch_per_device,
            precision: scenario.precision.to_string(),
            gradient_precision: scenario.gradient_precision.to_string(),
            compute_model: scenario.compute_source.clone(),
            optimizer: scenario.optimizer.to_string(),
        },
        cluster: ClusterSummary {
            gpus,
            nodes: scenario.cluster.nodes,
            gpus_per_node: scenario.cluster.gpus_per_node,
            device: scenario.device.display_name.clone(),
            intra_node: intra,
            network,
        },
        strategy: StrategySummary {
            data_parallel: scenario.data_parallel,
            gradient_buckets: lowered.buckets.len(),
            gradient_bytes: lowered.buckets.iter().map(|b| b.bytes.0).sum(),
            allreduce: scenario.allreduce.name(),
        },
        fidelity: scenario.network.fidelity.name(),
        iterations: scenario.iterations,
        iteration_time,
        iteration_times,
        samples_per_second: samples / seconds,
        samples_per_second_per_device: samples / seconds / f64::from(gpus),
        achieved_tflops_per_device: achieved / 1e12,
        peak_tflops_per_device: peak / 1e12,
        mfu: achieved / peak,
        breakdown: Breakdown {
            compute: mean(|r| r.compute),
            exposed_communication: mean(|r| r.exposed_communication),
            idle: mean(|r| r.idle),
            communication: mean(|r| r.communication),
        },
        memory: MemorySummary::new(&memory, scenario),
        engine: EngineCounters { ops: lowered.graph.op_count(), events: timeline.events },
    };
    Ok(Outcome { summary, lowering_wall, simulation_wall, graph: lowered.graph, timeline })
}
