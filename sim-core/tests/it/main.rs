//! sim-core integration tests: closed forms, reference simulators, stream semantics,
//! validation errors and determinism.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod collectives;
mod faults;
mod fidelities;
mod flow;
mod link_series;
mod network;
mod reference;
mod semantics;
mod validation;
mod windows;

use sim_core::graph::{
    Collective, CollectiveAlgorithm, CollectiveKind, ExecGraph, GraphBuilder, RankId, StreamId,
};
use sim_core::units::Bytes;
use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology};

/// `nodes` single-GPU hosts on one switch, every link `bandwidth` and `latency`.
pub fn single_switch(nodes: u32, bandwidth: &str, latency: &str) -> Topology {
    let link = LinkSpec::new(bandwidth.parse().unwrap(), latency.parse().unwrap());
    Topology::build(&ClusterSpec {
        nodes,
        gpus_per_node: 1,
        intra_node: IntraNode::NvSwitch(link),
        network: NetworkSpec::single_switch(link),
        host_memory: None,
    })
    .unwrap()
}

/// One collective of `kind` by `algorithm` over all `ranks`, nothing else.
pub fn lone_collective(
    ranks: u32,
    kind: CollectiveKind,
    algorithm: CollectiveAlgorithm,
    bytes: Bytes,
) -> ExecGraph {
    let mut graph = GraphBuilder::new(ranks);
    let group = graph.add_group((0..ranks).map(RankId).collect());
    let collective = graph.add_collective(Collective { kind, group, bytes, algorithm });
    for rank in 0..ranks {
        graph.collective(RankId(rank), StreamId(0), collective, kind.name(), &[]);
    }
    graph.build().unwrap()
}
