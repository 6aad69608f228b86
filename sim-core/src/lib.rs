//! parasim's engine: the only place simulated time advances.
//!
//! The layers, bottom up (each module imports only from the ones before it):
//! - [`units`] (re-exported): `SimTime` / `SimDuration` in integer picoseconds, `Bytes`,
//!   `Bandwidth`, `FlopRate`, parsed from and printed as human units;
//! - [`queue`]: the deterministic `(time, sequence)` event queue;
//! - [`graph`]: the execution-graph IR that workloads and traces lower to (compute, transfer,
//!   collective and memcpy ops on per-rank in-order streams, with dependencies), validated on
//!   construction;
//! - [`schedule`]: collective algorithms as synchronous steps of point-to-point messages;
//! - [`collective`]: those steps timed on a network model ([`collective::StepNetwork`]),
//!   without contention;
//! - [`nccl`]: the NCCL model: protocols, release tables, NCCL's tuner, NVLS and CollNet, what
//!   a collective costs beyond its data, and the choice of algorithm and protocol (`auto`);
//! - [`network`]: the narrow seam to the network models, and the `analytical` model;
//! - [`flow`]: the flow-level models (`flow`, `packet-steps`): max-min fair sharing of the
//!   links, collectives message by message or in their steady state;
//! - [`exec`]: the executor that runs a graph on a network model and records every op's start
//!   and end;
//! - [`fidelity`]: the one place a fidelity name becomes a network model with its settings;
//! - [`stats`]: where the time went (compute / exposed communication / idle per rank);
//! - [`budget`]: the work budget every command checks before it builds a graph;
//! - [`variability`]: what is drawn (per-op noise, slow ranks, GPU speed spread, host
//!   interruptions) and the seeded streams it is drawn from;
//! - [`stream`]: a graph run a chunk (an iteration) at a time and dropped as it finishes, so
//!   memory holds a few chunks however many there are;
//! - [`montecarlo`]: a graph re-timed over many iterations with fresh draws, without the
//!   event loop.
//!
//! `sim-core` never names a neural-network concept: it simulates ops, ranks and bytes.
//!
//! ```
//! use sim_core::exec::run;
//! use sim_core::graph::{Collective, CollectiveAlgorithm, CollectiveKind, GraphBuilder, RankId, StreamId};
//! use sim_core::network::AnalyticalNetwork;
//! use sim_core::units::{Bytes, SimDuration};
//! use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology};
//!
//! // Four single-GPU hosts on one switch: 100 Gb/s, 1 us per link.
//! let link = LinkSpec::new("100 Gb/s".parse()?, "1 us".parse()?);
//! let network = NetworkSpec::single_switch(link);
//! let cluster = ClusterSpec { nodes: 4, gpus_per_node: 1, intra_node: IntraNode::NvSwitch(link), network, host_memory: None  };
//! let topology = Topology::build(&cluster)?;
//!
//! // Every rank computes 100 us, then all-reduces 4 MiB.
//! let mut graph = GraphBuilder::new(4);
//! let everyone = graph.add_group((0..4).map(RankId).collect());
//! let allreduce = graph.add_collective(Collective {
//!     kind: CollectiveKind::AllReduce,
//!     group: everyone,
//!     bytes: Bytes(4 << 20),
//!     algorithm: CollectiveAlgorithm::Ring,
//! });
//! for rank in (0..4).map(RankId) {
//!     let work = graph.compute(rank, StreamId(0), SimDuration::from_us(100), "backward", &[]);
//!     graph.collective(rank, StreamId(1), allreduce, "allreduce", &[work]);
//! }
//! let graph = graph.build()?;
//! let timeline = run(&graph, &mut AnalyticalNetwork::new(&topology))?;
//!
//! // Ring allreduce: 2(p-1) steps of (2 links x 1 us + (S/p) / 12.5 GB/s).
//! let step = SimDuration::from_us(2).checked_add("1 MiB".parse::<Bytes>().map(|b| link.bandwidth.time_to_send(b))??)?;
//! assert_eq!(timeline.makespan(), SimDuration::from_us(100).checked_add(step.checked_mul(6)?)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use units;

pub mod budget;
pub mod collective;
pub mod exec;
mod fast_hash;
pub mod fidelity;
pub mod flow;
pub mod graph;
pub mod lookup;
pub mod montecarlo;
pub mod nccl;
pub mod network;
pub mod queue;
pub mod schedule;
pub mod stats;
pub mod stream;
pub mod variability;
