//! The one home of network fidelity: which network model runs a graph, and with which
//! collective settings. `run`, `collective`, `replay` and every library caller build their
//! network here, so a setting added to the models reaches all of them.

use std::fmt;

use topology::{LinkId, Topology};
use units::{Bandwidth, Bytes, SimDuration};

use crate::exec::{self, ExecError, Timeline};
use crate::flow::{FlowNetwork, LinkSeries};
use crate::graph::ExecGraph;
use crate::nccl::protocol::ProtocolChoice;
use crate::nccl::tuner::GpuGeneration;
use crate::network::AnalyticalNetwork;

/// The network model used to simulate a graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fidelity {
    /// Alpha-beta closed forms on topology paths, no contention between collectives.
    #[default]
    Analytical,
    /// Fluid flows with max-min fair sharing; rings and double binary trees as coupled
    /// steady-state edge flows.
    Flow,
    /// Fluid flows, every message of every collective step its own flow.
    PacketSteps,
}

impl Fidelity {
    /// Every fidelity, cheapest first.
    pub const ALL: [Fidelity; 3] = [Fidelity::Analytical, Fidelity::Flow, Fidelity::PacketSteps];

    /// The name used in scenario files, command lines and reports.
    pub const fn name(self) -> &'static str {
        match self {
            Fidelity::Analytical => "analytical",
            Fidelity::Flow => "flow",
            Fidelity::PacketSteps => "packet-steps",
        }
    }

    /// The valid names, quoted and comma-separated, for error messages.
    pub fn valid_names() -> String {
        Fidelity::ALL.iter().map(|f| format!("{:?}", f.name())).collect::<Vec<_>>().join(", ")
    }
}

impl fmt::Display for Fidelity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Fidelity {
    type Err = String;
    fn from_str(name: &str) -> Result<Fidelity, String> {
        Fidelity::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| format!("unknown fidelity {name:?}; valid: {}", Fidelity::valid_names()))
    }
}

/// A network model and its collective settings: everything needed to turn a graph and a
/// topology into a timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkSettings {
    /// Which model.
    pub fidelity: Fidelity,
    /// Fixed cost of every collective before its data moves (library launch and
    /// synchronisation).
    pub collective_launch: SimDuration,
    /// Chunk size of pipelined collective algorithms (tree, chain).
    pub chunk: Bytes,
    /// Which NCCL protocols collectives use (off: the pure network, the launch as is).
    pub protocols: ProtocolChoice,
    /// The GPUs' generation, for NCCL's tuner (which it uses once protocols are on).
    pub generation: GpuGeneration,
    /// How fast a GPU copies a buffer within its own memory (`None`: unknown), for the copy
    /// a ring's kernel makes without crossing a link ([`crate::nccl::overhead::ring_copy_time`]).
    pub device_copy: Option<Bandwidth>,
    /// Work (`FlowStats::work`) after which a flow or packet run gives up (none by default).
    pub work_budget: Option<u64>,
}

impl NetworkSettings {
    /// `fidelity` with no launch cost and the default chunk: the pure network.
    pub const fn new(fidelity: Fidelity) -> NetworkSettings {
        NetworkSettings {
            fidelity,
            collective_launch: SimDuration::ZERO,
            chunk: Bytes(crate::schedule::CHUNK_BYTES),
            protocols: ProtocolChoice::Off,
            generation: GpuGeneration::Ampere,
            device_copy: None,
            work_budget: None,
        }
    }

    /// The same settings tuning for GPUs of `generation`.
    pub const fn with_generation(mut self, generation: GpuGeneration) -> NetworkSettings {
        self.generation = generation;
        self
    }

    /// The same settings on GPUs that copy within their own memory at `rate` (the device's
    /// memory bandwidth times the efficiency large copies reach; `None`: unknown).
    pub const fn with_device_copy(mut self, rate: Option<Bandwidth>) -> NetworkSettings {
        self.device_copy = rate;
        self
    }

    /// The same settings with collectives run by `protocols` (see [`crate::nccl::protocol`]).
    pub const fn with_protocols(mut self, protocols: ProtocolChoice) -> NetworkSettings {
        self.protocols = protocols;
        self
    }

    /// The same settings with a fixed cost per collective.
    pub const fn with_collective_launch(mut self, launch: SimDuration) -> NetworkSettings {
        self.collective_launch = launch;
        self
    }

    /// The same settings with another chunk size (at least one byte).
    pub const fn with_chunk(mut self, chunk: Bytes) -> NetworkSettings {
        self.chunk = Bytes(if chunk.0 == 0 { 1 } else { chunk.0 });
        self
    }

    /// The analytical model with these collective settings (also the estimator that resolves
    /// `auto` algorithms, whatever the fidelity).
    pub fn analytical<'t>(&self, topology: &'t Topology) -> AnalyticalNetwork<'t> {
        AnalyticalNetwork::new(topology)
            .with_collective_launch(self.collective_launch)
            .with_chunk(self.chunk)
            .with_protocols(self.protocols)
            .with_generation(self.generation)
            .with_device_copy(self.device_copy)
    }

    /// Runs `graph` on `topology` under this model and also returns the bytes routed over each
    /// link (indexed by `LinkId`) under `flow` and `packet-steps`; `None` under `analytical`,
    /// which has no flows to count.
    pub fn run_counting_link_bytes(
        &self,
        graph: &ExecGraph,
        topology: &Topology,
    ) -> Result<(Timeline, Option<Vec<f64>>), ExecError> {
        match self.fidelity {
            Fidelity::Analytical => Ok((exec::run(graph, &mut self.analytical(topology))?, None)),
            Fidelity::Flow | Fidelity::PacketSteps => {
                let mut network = self.flow_network(topology).recording_link_bytes();
                let timeline = exec::run(graph, &mut network)?;
                Ok((timeline, network.link_bytes().map(<[f64]>::to_vec)))
            }
        }
    }

    /// Runs `graph` on `topology` under this model and also returns the utilisation over time
    /// of `links` (see [`FlowNetwork::recording_link_series`]) under `flow` and
    /// `packet-steps`; `None` under `analytical`, which has no links to load. The timeline is
    /// the one [`NetworkSettings::run`] gives: recording changes no rate and no event.
    pub fn run_recording_link_series(
        &self,
        graph: &ExecGraph,
        topology: &Topology,
        links: &[LinkId],
    ) -> Result<(Timeline, Option<Vec<LinkSeries>>), ExecError> {
        match self.fidelity {
            Fidelity::Analytical => Ok((exec::run(graph, &mut self.analytical(topology))?, None)),
            Fidelity::Flow | Fidelity::PacketSteps => {
                let mut network = self.flow_network(topology).recording_link_series(links);
                let timeline = exec::run(graph, &mut network)?;
                Ok((timeline, network.link_series().map(<[LinkSeries]>::to_vec)))
            }
        }
    }

    /// The flow model with these settings (`steady_state` under `flow`).
    fn flow_network<'t>(&self, topology: &'t Topology) -> FlowNetwork<'t> {
        let network = FlowNetwork::new(topology)
            .with_collective_launch(self.collective_launch)
            .with_chunk(self.chunk)
            .with_protocols(self.protocols)
            .with_generation(self.generation)
            .with_device_copy(self.device_copy)
            .with_work_budget(self.work_budget);
        if self.fidelity == Fidelity::Flow { network.steady_state() } else { network }
    }

    /// Runs `job` on `topology` under this model, and, when `count_link_bytes`, also returns
    /// the bytes routed over each link as [`NetworkSettings::run_counting_link_bytes`] does:
    /// for runs that do not hand the engine one whole graph ([`crate::stream`]).
    pub fn run_on<J: OnNetwork>(
        &self,
        topology: &Topology,
        job: J,
        count_link_bytes: bool,
    ) -> (J::Output, Option<Vec<f64>>) {
        match self.fidelity {
            Fidelity::Analytical => (job.run(&mut self.analytical(topology)), None),
            Fidelity::Flow | Fidelity::PacketSteps => {
                let mut network = self.flow_network(topology);
                if count_link_bytes {
                    network = network.recording_link_bytes();
                }
                let output = job.run(&mut network);
                (output, network.link_bytes().map(<[f64]>::to_vec))
            }
        }
    }

    /// Runs `graph` on `topology` under this model as [`NetworkSettings::run`] does, keeping
    /// only the ends of the `watched` ops ([`exec::run_watching`]).
    pub fn run_watching(
        &self,
        graph: &ExecGraph,
        topology: &Topology,
        watched: &[crate::graph::OpId],
    ) -> Result<exec::WatchedEnds, ExecError> {
        match self.fidelity {
            Fidelity::Analytical => exec::run_watching(graph, &mut self.analytical(topology), watched),
            Fidelity::Flow | Fidelity::PacketSteps => {
                exec::run_watching(graph, &mut self.flow_network(topology), watched)
            }
        }
    }

    /// Runs `graph` on `topology` under this model as [`NetworkSettings::run`] does, giving up
    /// with [`ExecError::PastLimit`] once `limit` shows its watched ends cannot come by it
    /// ([`exec::run_within`]).
    pub fn run_within(
        &self,
        graph: &ExecGraph,
        topology: &Topology,
        limit: exec::EndLimit,
    ) -> Result<Timeline, ExecError> {
        self.run_limited(graph, topology, Some(limit))
    }

    /// Runs `graph` on `topology` under this model.
    pub fn run(&self, graph: &ExecGraph, topology: &Topology) -> Result<Timeline, ExecError> {
        self.run_limited(graph, topology, None)
    }

    /// [`NetworkSettings::run`], or [`NetworkSettings::run_within`] with a limit.
    fn run_limited(
        &self,
        graph: &ExecGraph,
        topology: &Topology,
        limit: Option<exec::EndLimit>,
    ) -> Result<Timeline, ExecError> {
        match self.fidelity {
            Fidelity::Analytical => exec::run_limited(graph, &mut self.analytical(topology), limit),
            Fidelity::Flow | Fidelity::PacketSteps => {
                exec::run_limited(graph, &mut self.flow_network(topology), limit)
            }
        }
    }
}

/// Something run on the network model of a fidelity ([`NetworkSettings::run_on`]), whichever
/// type that model is.
pub trait OnNetwork {
    /// What the run gives.
    type Output;
    /// Runs on `network`.
    fn run<N: crate::network::Network>(self, network: &mut N) -> Self::Output;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_valid_ones() {
        for fidelity in Fidelity::ALL {
            assert_eq!(fidelity.name().parse::<Fidelity>(), Ok(fidelity));
        }
        let error = "fluid".parse::<Fidelity>().unwrap_err();
        assert!(error.contains("\"analytical\", \"flow\", \"packet-steps\""), "{error}");
    }

    #[test]
    fn a_zero_chunk_becomes_one_byte() {
        assert_eq!(NetworkSettings::new(Fidelity::Flow).with_chunk(Bytes(0)).chunk, Bytes(1));
    }
}
