//! One collective timed alone on a cluster, size by size, the way nccl-tests times it: the
//! engine behind `parasim collective` and the validation suite's nccl-tests cases.

use sim_core::exec::ExecError;
use sim_core::fidelity::{Fidelity, NetworkSettings};
use sim_core::graph::{
    Collective, CollectiveAlgorithm, CollectiveKind, GraphBuilder, GraphError, RankId, StreamId,
};
use sim_core::nccl::choice::choose_for;
use sim_core::nccl::protocol::Choice;
use sim_core::nccl::tuner::GpuGeneration;
use sim_core::schedule::CollectiveError;
use sim_core::units::{Bytes, SimDuration, TimeOverflow, UnitError};
use topology::{Topology, TopologyError};

use crate::Cluster;

/// Why a collective benchmark cannot be set up or run.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveBenchError {
    /// The collective's name is not one parasim knows.
    #[error(
        "unknown collective {0:?}; valid: allreduce, reduce-scatter, allgather, alltoall, broadcast, reduce \
         (nccl-tests' all_reduce, reduce_scatter, all_gather also work)"
    )]
    UnknownCollective(String),
    /// More ranks than GPUs, or none.
    #[error("{ranks} ranks: the cluster has {gpus} GPUs; give 1 to {gpus}")]
    Ranks {
        /// Ranks asked for.
        ranks: u32,
        /// GPUs in the cluster.
        gpus: u32,
    },
    /// The algorithm cannot perform this collective.
    #[error("algorithm {algorithm} cannot perform {kind}; valid: {valid}")]
    Unsupported {
        /// The algorithm asked for.
        algorithm: &'static str,
        /// The collective.
        kind: &'static str,
        /// The algorithms that can.
        valid: String,
    },
    /// The collective would be timed over more messages than the work budget allows.
    #[error(transparent)]
    OverBudget(#[from] Box<sim_core::budget::OverBudget>),
    /// The cluster's topology cannot be built.
    #[error("building the cluster topology: {0}")]
    Topology(#[from] TopologyError),
    /// The tuner could not choose.
    #[error(transparent)]
    Choice(#[from] CollectiveError),
    /// The one-collective graph is invalid.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// The engine failed.
    #[error("simulating {kind} of {bytes}: {source}")]
    Simulation {
        /// The collective.
        kind: &'static str,
        /// Its size.
        bytes: Bytes,
        /// The engine's error.
        source: Box<ExecError>,
    },
    /// A time does not fit the simulator's clock.
    #[error(transparent)]
    Time(#[from] TimeOverflow),
    /// A duration is not representable.
    #[error(transparent)]
    Duration(#[from] UnitError),
}

/// A collective by name, with nccl-tests' bus-bandwidth factor and reduction name.
#[derive(Debug, Clone, Copy)]
pub struct NamedCollective {
    /// The collective.
    pub kind: CollectiveKind,
    /// busbw = algbw x this (nccl-tests' PERFORMANCE.md) for `ranks` ranks.
    pub bus_factor: f64,
    /// nccl-tests' `redop` column.
    pub redop: &'static str,
}

/// Parses `name` (parasim's or nccl-tests' spelling) for a run over `ranks` ranks.
pub fn collective_named(name: &str, ranks: u32) -> Result<NamedCollective, CollectiveBenchError> {
    let n = f64::from(ranks);
    let normalized = name.to_ascii_lowercase().replace('_', "-");
    let (kind, bus_factor, redop) = match normalized.as_str() {
        "allreduce" | "all-reduce" => (CollectiveKind::AllReduce, 2.0 * (n - 1.0) / n, "sum"),
        "reduce-scatter" | "reducescatter" => (CollectiveKind::ReduceScatter, (n - 1.0) / n, "sum"),
        "allgather" | "all-gather" => (CollectiveKind::AllGather, (n - 1.0) / n, "none"),
        "alltoall" | "all-to-all" => (CollectiveKind::AllToAll, (n - 1.0) / n, "none"),
        "broadcast" => (CollectiveKind::Broadcast { root: 0 }, 1.0, "none"),
        "reduce" => (CollectiveKind::Reduce { root: 0 }, 1.0, "sum"),
        _ => return Err(CollectiveBenchError::UnknownCollective(name.to_string())),
    };
    Ok(NamedCollective { kind, bus_factor, redop })
}

/// How to time a collective: what nccl-tests would be asked, and the cost of its host loop.
#[derive(Debug, Clone, Copy)]
pub struct BenchSettings {
    /// Ranks taking part: the first N GPUs.
    pub ranks: u32,
    /// Algorithm, or `Auto` for the tuner's choice.
    pub algorithm: CollectiveAlgorithm,
    /// Network model, collective launch cost, chunk and protocols.
    pub network: NetworkSettings,
    /// Host time to launch one collective on one GPU.
    pub host_launch: SimDuration,
    /// GPUs each benchmark process drives from one thread (nccl-tests' `-g`).
    pub gpus_per_process: u32,
}

/// One size's result.
#[derive(Debug, Clone)]
pub struct BenchPoint {
    /// Message size in bytes.
    pub bytes: u64,
    /// Time of one collective, as nccl-tests reports it (seconds).
    pub seconds: f64,
    /// Algorithm bandwidth, bytes / time (GB/s).
    pub algbw: f64,
    /// Bus bandwidth (GB/s).
    pub busbw: f64,
    /// What ran: `algorithm/protocol`, or `copy` for one rank.
    pub chosen: String,
}

/// A collective ready to be timed at any size on one cluster.
pub struct CollectiveBench {
    topology: Topology,
    collective: NamedCollective,
    settings: BenchSettings,
    /// Bytes per second a one-rank (copy) collective moves through device memory.
    copy_rate: f64,
    /// No iteration of the benchmark loop is faster than its host launches.
    host_floor: SimDuration,
}

/// Refuses a collective whose timing would materialise more messages than the work budget
/// ([`sim_core::budget`]): an all-to-all's every member sends to every other (n(n-1) messages,
/// timed together whatever the fidelity), and `packet-steps` makes every message of every
/// step a flow (a ring's n messages per step over some n steps: about n^2). Rings and trees
/// under `analytical` and `flow` are timed by their levels and steady state, linear in ranks.
fn within_budget(
    kind: CollectiveKind,
    ranks: u32,
    fidelity: Fidelity,
) -> Result<(), sim_core::budget::OverBudget> {
    let n = u64::from(ranks);
    let squared = kind == CollectiveKind::AllToAll || fidelity == Fidelity::PacketSteps;
    if !squared {
        return Ok(());
    }
    let needed = n.saturating_mul(n.saturating_sub(1));
    let largest = (1..=ranks)
        .rev()
        .find(|&r| u64::from(r) * u64::from(r - 1) <= sim_core::budget::MAX_ITEMS)
        .unwrap_or(1);
    sim_core::budget::check(
        needed,
        "messages",
        || format!("--ranks {ranks}"),
        || {
            if kind == CollectiveKind::AllToAll {
                format!(
                    "an all-to-all over {ranks} ranks (every rank sends to every other: {ranks} x {})",
                    ranks - 1
                )
            } else {
                format!(
                    "{} under packet-steps over {ranks} ranks (every message of every step a flow: about {ranks} x {})",
                    kind.name(),
                    ranks - 1
                )
            }
        },
        || {
            if kind == CollectiveKind::AllToAll {
                format!("time it over at most {largest} ranks (--ranks {largest}) and extrapolate")
            } else {
                format!(
                    "use --fidelity flow (rings and trees as coupled steady-state flows, a few events each) or analytical, or at most {largest} ranks (--ranks {largest})"
                )
            }
        },
    )
}

impl CollectiveBench {
    /// Prepares `name` over the first `settings.ranks` GPUs of `cluster`.
    pub fn new(cluster: &Cluster, name: &str, settings: BenchSettings) -> Result<Self, CollectiveBenchError> {
        let topology = Topology::build(&cluster.spec)?;
        let gpus = topology.host_count() as u32;
        if settings.ranks == 0 || settings.ranks > gpus {
            return Err(CollectiveBenchError::Ranks { ranks: settings.ranks, gpus });
        }
        let collective = collective_named(name, settings.ranks)?;
        within_budget(collective.kind, settings.ranks, settings.network.fidelity).map_err(Box::new)?;
        if !settings.algorithm.supports(collective.kind) {
            let valid: Vec<&str> = CollectiveAlgorithm::ALL
                .iter()
                .filter(|a| a.supports(collective.kind))
                .map(|a| a.name())
                .collect();
            return Err(CollectiveBenchError::Unsupported {
                algorithm: settings.algorithm.name(),
                kind: collective.kind.name(),
                valid: valid.join(", "),
            });
        }
        // NCCL's kernels copy within a GPU's memory, and one rank copies its buffer to the output
        // (out-of-place), at the rate large memory-bound kernels reach on the device (its
        // calibrated profile, else the compute model's default).
        let device_copy =
            workloads::compute::ComputeModel::builtin_for(&cluster.device).device_copy(&cluster.device);
        let settings = BenchSettings {
            network: settings
                .network
                .with_generation(GpuGeneration::of_device(&cluster.device.name))
                .with_device_copy(device_copy),
            gpus_per_process: settings.gpus_per_process.max(1),
            ..settings
        };
        let host_floor =
            settings.host_launch.checked_mul(u64::from(settings.gpus_per_process.min(settings.ranks)))?;
        let copy_rate = device_copy.map_or(f64::INFINITY, |rate| rate.bytes_per_second());
        Ok(CollectiveBench { topology, collective, settings, copy_rate, host_floor })
    }

    /// The collective being timed.
    pub fn collective(&self) -> NamedCollective {
        self.collective
    }

    /// The settings in force (the network's GPU generation filled in from the cluster).
    pub fn settings(&self) -> &BenchSettings {
        &self.settings
    }

    /// GPUs in the cluster.
    pub fn gpus(&self) -> u32 {
        self.topology.host_count() as u32
    }

    /// Times one collective of `bytes`: the larger of the simulated collective and the
    /// benchmark loop's serial host path (the process's launches, one per GPU it drives, plus
    /// what the collective's channels cost beyond the first: [`CollectiveBench::serial_channels`]).
    pub fn time(&self, bytes: u64) -> Result<BenchPoint, CollectiveBenchError> {
        let (time, serial, chosen) = if self.settings.ranks == 1 {
            let copy = bytes.saturating_mul(2) as f64 / self.copy_rate;
            let time = SimDuration::from_secs_f64(copy)?.checked_add(self.settings.host_launch)?;
            (time, self.host_floor, "copy".to_string())
        } else {
            let (time, choice) = self.simulate(Bytes(bytes))?;
            let serial = self.host_floor.checked_add(self.serial_channels(choice, Bytes(bytes))?)?;
            (time, serial, choice.to_string())
        };
        let seconds = time.max(serial).as_secs_f64();
        let algbw = bytes as f64 / seconds / 1e9;
        Ok(BenchPoint { bytes, seconds, algbw, busbw: algbw * self.collective.bus_factor, chosen })
    }

    /// What the channels NCCL launches for a collective of `bytes` under `choice` add to the
    /// benchmark loop's host floor ([`sim_core::nccl::overhead::channel_time`]: `channel-overhead`
    /// per channel beyond the first). The one-server curves measured with one process driving
    /// g GPUs rise above their floor of g launches by this much from the first size that runs
    /// on two channels, whatever g (docs/collectives.md, "Channels per size"): the cost is
    /// serial with the launches, not hidden under them as a kernel's time is.
    fn serial_channels(&self, choice: Choice, bytes: Bytes) -> Result<SimDuration, CollectiveBenchError> {
        let BenchSettings { ranks, network, .. } = self.settings;
        let group: Vec<RankId> = (0..ranks).map(RankId).collect();
        let estimator =
            NetworkSettings { fidelity: Fidelity::Analytical, ..network }.analytical(&self.topology);
        Ok(sim_core::nccl::overhead::channel_time(self.collective.kind, choice, bytes, &group, &estimator)?)
    }

    /// Simulates one collective of `bytes` over the ranks; returns its time and the algorithm
    /// that ran (what `Auto` chose).
    fn simulate(&self, bytes: Bytes) -> Result<(SimDuration, Choice), CollectiveBenchError> {
        let BenchSettings { ranks, algorithm, network, .. } = self.settings;
        let kind = self.collective.kind;
        let group: Vec<RankId> = (0..ranks).map(RankId).collect();
        let estimator = NetworkSettings { fidelity: Fidelity::Analytical, ..network };
        let chosen = choose_for(kind, algorithm, bytes, &group, &mut estimator.analytical(&self.topology))?;
        let mut graph = GraphBuilder::new(ranks);
        let everyone = graph.add_group(group);
        let collective =
            graph.add_collective(Collective { kind, group: everyone, bytes, algorithm: chosen.algorithm });
        for rank in 0..ranks {
            graph.collective(RankId(rank), StreamId(0), collective, kind.name(), &[]);
        }
        let graph = graph.build()?;
        let timeline = network.run(&graph, &self.topology).map_err(|source| {
            CollectiveBenchError::Simulation { kind: kind.name(), bytes, source: Box::new(source) }
        })?;
        Ok((timeline.makespan(), chosen))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_factors_are_nccl_tests_ones() {
        assert_eq!(collective_named("all_reduce", 16).unwrap().bus_factor, 2.0 * 15.0 / 16.0);
        assert_eq!(collective_named("all_gather", 16).unwrap().bus_factor, 15.0 / 16.0);
        assert_eq!(collective_named("broadcast", 16).unwrap().bus_factor, 1.0);
        assert!(collective_named("gossip", 4).is_err());
    }

    /// One server of 8 A100s with a per-channel cost, NCCL 2.11.
    fn server(channel_overhead: &str) -> Cluster {
        let text = format!(
            "[cluster]\nnodes = 1\ngpus-per-node = 8\ndevice = \"a100-sxm4-40gb\"\n\
             intra-node = {{ kind = \"nvswitch\", bandwidth = \"240 GB/s\", latency = \"0.3 us\" }}\n\
             [cluster.network]\ntopology = \"switch\"\nlink-bandwidth = \"200 Gb/s\"\n\
             channel-overhead = \"{channel_overhead}\"\nnccl-version = \"2.11\"\n"
        );
        Cluster::parse(&text, std::path::Path::new("server.toml")).unwrap()
    }

    fn bench(cluster: &Cluster, ranks: u32, gpus_per_process: u32) -> CollectiveBench {
        let settings = BenchSettings {
            ranks,
            algorithm: CollectiveAlgorithm::Auto,
            network: NetworkSettings::new(Fidelity::Analytical)
                .with_collective_launch(SimDuration::from_ns(8_400))
                .with_chunk(Bytes(1 << 20))
                .with_protocols(sim_core::nccl::protocol::ProtocolChoice::Auto),
            host_launch: SimDuration::from_us(4),
            gpus_per_process,
        };
        CollectiveBench::new(cluster, "allreduce", settings).unwrap()
    }

    #[test]
    fn channels_beyond_the_first_add_to_the_host_launches() {
        let (with, without) = (server("1.5 us"), server("0 us"));
        // 4 GPUs in one process: ring/LL runs one channel per 512 threads x 8 x 4 ranks = 16 KiB.
        // Host-bound sizes cost 4 launches + 1.5 us per channel beyond the first.
        let host = |bench: &CollectiveBench, bytes: u64| bench.time(bytes).unwrap().seconds;
        let (four, bare) = (bench(&with, 4, 4), bench(&without, 4, 4));
        for (bytes, channels) in [(8u64, 1u64), (16 << 10, 1), (32 << 10, 2), (64 << 10, 4)] {
            assert_eq!(bare.time(bytes).unwrap().chosen, "ring/LL");
            let expected = 16e-6 + 1.5e-6 * (channels - 1) as f64;
            assert!((host(&four, bytes) - expected).abs() < 1e-12, "{bytes} B: {}", host(&four, bytes));
            assert!((host(&bare, bytes) - 16e-6).abs() < 1e-12);
        }
        // One process per GPU: the single launch is far below the kernel, which carries the
        // same per-channel cost inside; the serial path does not add it twice.
        let alone = bench(&with, 4, 1).time(1 << 30).unwrap().seconds;
        let kernel_only = bench(&without, 4, 1).time(1 << 30).unwrap().seconds;
        // At most 24 channels (a communicator's most on one A100 server), 23 of them paying.
        assert!(alone > kernel_only && alone - kernel_only <= 23.0 * 1.5e-6 + 1e-9);
    }

    #[test]
    fn rings_inside_a_server_lose_bandwidth_to_their_copy_the_fewer_their_gpus() {
        // 1 GiB ring/Simple: NCCL 2.11's 235 GB/s bus bandwidth less the copy each GPU makes in
        // its own memory (S / p, at the A100 profile's copy rate): 1 / (1/235 + 1/((p-1) C)).
        let cluster = server("0 us");
        let device = &cluster.device;
        let copy = workloads::compute::ComputeModel::builtin_for(device).device_copy(device).unwrap();
        let rate = copy.bytes_per_second() / 1e9;
        for p in [2u32, 4, 8] {
            let point = bench(&cluster, p, 1).time(1 << 30).unwrap();
            assert_eq!(point.chosen, "ring/Simple");
            let expected = 1.0 / (1.0 / 235.0 + 1.0 / (f64::from(p - 1) * rate));
            // The latencies (tens of us) are what the 1 GiB point adds beyond the formula.
            assert!(point.busbw < expected && point.busbw > 0.98 * expected, "{p} GPUs: {}", point.busbw);
        }
    }
}
