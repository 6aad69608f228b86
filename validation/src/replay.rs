//! Replaying real profiler traces on a cluster and comparing with their measurement: the
//! engine behind `parasim replay` and the suite's `replay` cases.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use scenario::Cluster;
use sim_core::exec::{ExecError, Timeline};
use sim_core::fidelity::NetworkSettings;
use sim_core::nccl::protocol::ProtocolChoice;
use sim_core::nccl::tuner::GpuGeneration;
use sim_core::units::{Bandwidth, SimDuration};
use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology, TopologyError};
use traces::replay::{Comparison, Replay, ReplayOptions};
use traces::{Loaded, TraceError};
use workloads::{Device, DeviceCatalog};

/// Defaults of the cluster inferred from a trace; docs/traces.md lists them.
const INFERRED_NETWORK_BANDWIDTH_BITS: u64 = 200_000_000_000;
const INFERRED_LATENCY: SimDuration = SimDuration::from_us(1);
/// GPUs per server when the trace does not list its host's devices.
const INFERRED_GPUS_PER_NODE: u32 = 8;

/// The largest replay graph built (ops): the work budget every command shares
/// ([`sim_core::budget::MAX_ITEMS`]).
pub const MAX_REPLAY_OPS: u64 = sim_core::budget::MAX_ITEMS;

/// Why a replay cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The traces cannot be read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// `--rank` names a rank the trace does not hold.
    #[error("--rank {rank}: the trace has {traced}")]
    NoSuchRank {
        /// The rank asked for.
        rank: u32,
        /// The ranks it has, abbreviated.
        traced: String,
    },
    /// The trace's device is not in the catalog.
    #[error(
        "the trace's device {name:?} is not in the catalog; pass --device with one of: {valid}, or --cluster SCENARIO"
    )]
    UnknownDevice {
        /// The profiler's device name.
        name: String,
        /// Catalog names.
        valid: String,
    },
    /// `--protocol` names NCCL protocols for a device whose jobs do not use NCCL.
    #[error("--protocol: {0}")]
    Protocol(String),
    /// A device named by the user is not in the catalog.
    #[error("--device: {0}")]
    Device(String),
    /// Neither the trace nor the user names a device.
    #[error(
        "the trace does not record its GPU (no deviceProperties): pass --device NAME or --cluster SCENARIO"
    )]
    NoDevice,
    /// The cluster is smaller than the replay.
    #[error("the cluster has {gpus} GPUs, but the replay needs {ranks} ranks (one per GPU)")]
    TooFewGpus {
        /// GPUs in the cluster.
        gpus: u32,
        /// Ranks replayed.
        ranks: u32,
    },
    /// The replay graph would not fit in memory.
    #[error(
        "replaying {ranks} ranks of about {per_rank} ops each needs about {estimate} ops, more than the {MAX_REPLAY_OPS} parasim builds (about 90 bytes each); replay fewer ranks (--ranks), or simulate the job at scale with `parasim run` and a scenario"
    )]
    TooLarge {
        /// Ranks asked for.
        ranks: u32,
        /// Ops and host calls per traced rank.
        per_rank: u64,
        /// The estimated graph size.
        estimate: u64,
    },
    /// The cluster cannot be built.
    #[error("building the cluster topology: {0}")]
    Topology(#[from] TopologyError),
    /// The engine failed.
    #[error("simulating the replay: {0}")]
    Simulation(#[from] Box<ExecError>),
}

/// What to replay, and on what.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    /// Kineto JSON files or directories, or one `.pstrace`.
    pub traces: Vec<PathBuf>,
    /// The cluster to replay on; inferred from the trace if `None`.
    pub cluster: Option<Cluster>,
    /// Device for the inferred cluster (a catalog name), overriding the trace's.
    pub device: Option<String>,
    /// Network model, collective launch cost and chunk size (the GPU generation is the
    /// replayed device's).
    pub network: NetworkSettings,
    /// NCCL protocols; `None`: NCCL's tuner (`auto`) on devices whose jobs use NCCL, off on
    /// others (the catalog's `collectives`).
    pub protocols: Option<ProtocolChoice>,
    /// Ranks to simulate (re-targeting data parallelism).
    pub ranks: Option<u32>,
    /// Replay only this traced rank (the others as its copies).
    pub rank: Option<u32>,
    /// Kineto traces of the same run as the execution traces in `traces` (kernel times).
    pub kineto: Vec<PathBuf>,
}

/// A replay that ran: its inputs, the simulated timeline and the comparison.
pub struct ReplayRun {
    /// The traces as loaded.
    pub loaded: Loaded,
    /// The execution graph built from them.
    pub replay: Replay,
    /// The cluster it ran on.
    pub spec: ClusterSpec,
    /// Its device's display name.
    pub device_name: String,
    /// True if the cluster was inferred from the trace.
    pub inferred: bool,
    /// The network settings it ran with (the device's GPU generation and protocols resolved).
    pub network: NetworkSettings,
    /// Ranks simulated.
    pub ranks: u32,
    /// The simulation.
    pub timeline: Timeline,
    /// Simulated against measured.
    pub comparison: Comparison,
    /// Wall time loading the traces.
    pub load_wall: Duration,
    /// Wall time building the graph.
    pub build_wall: Duration,
    /// Wall time simulating.
    pub simulation_wall: Duration,
}

/// Where a replay is, with the counts of its stage (for a progress display).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayStep {
    /// Reading the traces: files, bytes and events so far.
    Reading(traces::ReadCounts),
    /// Building the execution graph of `ranks` simulated ranks from `traced_ops` ops and host
    /// calls of the traced ranks.
    Building {
        /// Ranks simulated.
        ranks: u32,
        /// GPU ops and host calls of the traced ranks.
        traced_ops: u64,
    },
    /// Simulating the graph's `ops` on `ranks` ranks.
    Simulating {
        /// Ranks simulated.
        ranks: u32,
        /// Ops in the graph.
        ops: u64,
    },
}

/// Loads, builds, simulates and compares.
pub fn replay(request: &ReplayRequest) -> Result<ReplayRun, ReplayError> {
    replay_with_progress(request, &|_| {})
}

/// [`replay`], telling `progress` each stage as it begins, with its counts, and the counts of
/// the reading as it goes on.
pub fn replay_with_progress(
    request: &ReplayRequest,
    progress: &(dyn Fn(ReplayStep) + '_),
) -> Result<ReplayRun, ReplayError> {
    let started = Instant::now();
    // An execution trace without times is costed on the device asked for (or the cluster's).
    let asked = match (&request.cluster, &request.device) {
        (Some(cluster), _) => Some(cluster.device.clone()),
        (None, Some(name)) => {
            Some(DeviceCatalog::builtin().get(name).map_err(|e| ReplayError::Device(e.to_string()))?.clone())
        }
        (None, None) => None,
    };
    let cost = asked.as_ref().map(et_cost);
    let reading = |counts| progress(ReplayStep::Reading(counts));
    let options = traces::LoadOptions {
        kineto: &request.kineto,
        cost: cost.as_ref().map(|c| c as &dyn Fn(&traces::et::CostQuery) -> Option<u64>),
        progress: Some(&reading),
    };
    let mut loaded = traces::load_with(&request.traces, &options)?;
    let load_wall = started.elapsed();
    if let Some(rank) = request.rank
        && !loaded.trace.keep_only_rank(rank)
    {
        let traced: Vec<u32> = loaded.trace.ranks.iter().map(|r| r.rank).collect();
        return Err(ReplayError::NoSuchRank { rank, traced: abbreviate(&traced) });
    }
    let trace = &loaded.trace;
    let ranks = request.ranks.unwrap_or(trace.world_size);
    // Every simulated rank replays a traced rank's ops and host calls: refuse, before building
    // it, a graph that would not fit this machine.
    let per_rank =
        trace.ranks.iter().map(|r| r.gpu_ops.len() + r.calls.len()).sum::<usize>() / trace.ranks.len().max(1);
    let estimate = per_rank as u64 * u64::from(ranks);
    if estimate > MAX_REPLAY_OPS {
        return Err(ReplayError::TooLarge { ranks, per_rank: per_rank as u64, estimate });
    }

    let traced_ops = trace.ranks.iter().map(|r| (r.gpu_ops.len() + r.calls.len()) as u64).sum();
    progress(ReplayStep::Building { ranks, traced_ops });
    let started = Instant::now();
    let replay = traces::replay::build(trace, &ReplayOptions { ranks: request.ranks })?;
    let build_wall = started.elapsed();

    let (spec, device, inferred) = match &request.cluster {
        Some(cluster) => (cluster.spec.clone(), cluster.device.clone(), false),
        None => {
            let device = match (&request.device, &trace.device) {
                (Some(name), _) => DeviceCatalog::builtin()
                    .get(name)
                    .map_err(|e| ReplayError::Device(e.to_string()))?
                    .clone(),
                (None, Some(info)) => device_for(&info.name, info.memory_bytes)?,
                (None, None) => return Err(ReplayError::NoDevice),
            };
            let spec = inferred_cluster(&device, trace.device.as_ref().map(|d| d.devices_per_host), ranks);
            (spec, device, true)
        }
    };
    let device_name = device.display_name.clone();
    let protocols = device
        .collectives
        .protocols(request.protocols)
        .map_err(|message| ReplayError::Protocol(format!("{} {message}", device.name)))?;
    let device_copy = workloads::ComputeModel::builtin_for(&device).device_copy(&device);
    let network = request
        .network
        .with_generation(GpuGeneration::of_device(&device.name))
        .with_device_copy(device_copy)
        .with_protocols(protocols);
    let gpus = spec.nodes * spec.gpus_per_node;
    if gpus < ranks {
        return Err(ReplayError::TooFewGpus { gpus, ranks });
    }
    let topology = Topology::build(&spec)?;
    progress(ReplayStep::Simulating { ranks, ops: replay.graph.op_count() as u64 });
    let started = Instant::now();
    let timeline = network.run(&replay.graph, &topology).map_err(Box::new)?;
    let simulation_wall = started.elapsed();
    let comparison = replay.compare(&timeline);
    Ok(ReplayRun {
        loaded,
        replay,
        spec,
        device_name,
        inferred,
        network,
        ranks,
        timeline,
        comparison,
        load_wall,
        build_wall,
        simulation_wall,
    })
}

/// The duration (ns) parasim's compute model gives an execution-trace compute node on
/// `device`: the operator's work from its argument shapes ([`workloads::aten`], as `parasim
/// calibrate` costs Kineto operators), or for a Chakra node that records only `num_ops` and
/// `tensor_size`, a matrix product of that many FLOPs and bytes at the half-precision rate (or
/// an element-wise pass over the bytes when it records no FLOPs); `None` when neither applies.
pub fn et_cost(device: &Device) -> impl Fn(&traces::et::CostQuery) -> Option<u64> + use<> {
    use workloads::aten::{OperatorCall, operator_kernels};
    use workloads::calibrate::{Sample, predict};
    use workloads::compute::KernelWork;
    use workloads::layer::OpClass;
    let model = workloads::ComputeModel::builtin_for(device);
    let device = device.clone();
    move |query: &traces::et::CostQuery| {
        let work = query.work;
        let kernels: Vec<KernelWork> = match (work.flops, work.bytes) {
            (Some(flops), bytes) if flops > 0.0 => {
                vec![KernelWork::flat(OpClass::Gemm, workloads::Dtype::Fp16, flops, bytes.unwrap_or(0.0))]
            }
            (_, Some(bytes)) if bytes > 0.0 => {
                vec![KernelWork::flat(OpClass::Elementwise, workloads::Dtype::Fp32, 0.0, bytes)]
            }
            _ => operator_kernels(&OperatorCall {
                name: query.name,
                dims: &work.dims,
                types: &work.types,
                kernel_names: &[],
            })
            .ok()?,
        };
        let (first, after) = kernels.split_first()?;
        let sample = Sample {
            work: *first,
            after: after.to_vec(),
            kernels: kernels.len() as u32,
            measured_s: 1.0,
            communication: 0.0,
            group: 0,
        };
        let seconds = predict(&model, &device, &sample).ok()?;
        (seconds.is_finite() && seconds >= 0.0).then(|| (seconds * 1e9).round() as u64)
    }
}

/// The catalog device a profiler's device name means: "Tesla V100-SXM2-32GB" is
/// `v100-sxm2-32gb`; an unlisted variant ("NVIDIA A100-PG509-200") is the catalog entry of
/// its family ("a100") with the closest memory size.
pub fn device_for(name: &str, memory_bytes: u64) -> Result<Device, ReplayError> {
    let catalog = DeviceCatalog::builtin();
    let lower = name.trim().to_ascii_lowercase();
    let stripped = lower.trim_start_matches("nvidia ").trim_start_matches("tesla ").replace(' ', "-");
    if let Ok(device) = catalog.get(&stripped) {
        return Ok(device.clone());
    }
    let family = stripped.split('-').next().unwrap_or_default().to_string();
    let candidates = catalog.devices().iter().filter(|d| d.name.split('-').next() == Some(family.as_str()));
    let closest = candidates.min_by_key(|d| d.memory_capacity.0.abs_diff(memory_bytes));
    match closest {
        Some(device) if !family.is_empty() => Ok(device.clone()),
        _ => Err(ReplayError::UnknownDevice {
            name: name.to_string(),
            valid: catalog.names().collect::<Vec<_>>().join(", "),
        }),
    }
}

/// The cluster a trace implies: its device, `devices_per_host` GPUs per server (the
/// `deviceProperties` count, else 8, at most the rank count) behind an NVSwitch at half the
/// device's NVLink total per direction, servers on one switch at 200 Gb/s per GPU, 1 us per
/// link, and each GPU's PCIe link to host memory.
pub fn inferred_cluster(device: &Device, devices_per_host: Option<u32>, ranks: u32) -> ClusterSpec {
    let per_node = devices_per_host.filter(|&d| d > 0).unwrap_or(INFERRED_GPUS_PER_NODE).min(ranks).max(1);
    let nodes = ranks.div_ceil(per_node);
    let nvlink = device
        .nvlink_bandwidth
        .and_then(|total| Bandwidth::from_bits_per_second(total.bits_per_second() / 2))
        .unwrap_or(device.pcie_bandwidth);
    let network =
        Bandwidth::from_bits_per_second(INFERRED_NETWORK_BANDWIDTH_BITS).unwrap_or(device.pcie_bandwidth);
    ClusterSpec {
        nodes,
        gpus_per_node: per_node,
        intra_node: IntraNode::NvSwitch(LinkSpec::new(nvlink, INFERRED_LATENCY)),
        network: NetworkSpec::single_switch(LinkSpec::new(network, INFERRED_LATENCY)),
        host_memory: Some(LinkSpec::new(device.pcie_bandwidth, INFERRED_LATENCY)),
    }
}

/// "rank 3", "ranks 0-7", "ranks 0, 2, 5".
pub fn abbreviate(ranks: &[u32]) -> String {
    match ranks {
        [] => "none".into(),
        [one] => format!("rank {one}"),
        _ if ranks.windows(2).all(|w| w[1] == w[0] + 1) => {
            format!("ranks {}-{}", ranks[0], ranks[ranks.len() - 1])
        }
        _ => format!("ranks {}", ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_device_names_map_to_the_catalog() {
        assert_eq!(device_for("Tesla V100-SXM2-32GB", 0).unwrap().name, "v100-sxm2-32gb");
        assert_eq!(device_for("NVIDIA A100-SXM4-80GB", 0).unwrap().name, "a100-sxm4-80gb");
        // Meta's A100 variant with 40 GB: the A100 of the closest memory size.
        assert_eq!(device_for("NVIDIA A100-PG509-200", 42_505_273_344).unwrap().name, "a100-sxm4-40gb");
        let error = device_for("Quantum QPU-9000", 1).unwrap_err().to_string();
        assert!(error.contains("--device"), "{error}");
    }

    #[test]
    fn inferred_clusters_hold_every_rank() {
        let device = device_for("Tesla V100-SXM2-32GB", 0).unwrap();
        let spec = inferred_cluster(&device, Some(8), 16);
        assert_eq!((spec.nodes, spec.gpus_per_node), (2, 8));
        let spec = inferred_cluster(&device, Some(8), 2);
        assert_eq!((spec.nodes, spec.gpus_per_node), (1, 2));
        let spec = inferred_cluster(&device, None, 20);
        assert_eq!((spec.nodes, spec.gpus_per_node), (3, 8));
    }
}
