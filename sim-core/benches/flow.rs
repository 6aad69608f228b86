//! Flow-level network throughput on a 1024-host k = 16 fat-tree: a 1 GiB ring allreduce with
//! one flow per message (2,095,104 transfers) and a random permutation of 1 GiB flows. Run with `cargo bench -p sim-core --bench
//! flow`; criterion reports time per run and transfers per second ("elem/s").

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sim_core::exec::run;
use sim_core::flow::FlowNetwork;
use sim_core::graph::{
    Collective, CollectiveAlgorithm, CollectiveKind, ExecGraph, GraphBuilder, RankId, StreamId,
};
use sim_core::units::Bytes;
use topology::{ClusterSpec, FabricSpec, IntraNode, LinkSpec, NetworkSpec, Topology, XgftSpec};

const HOSTS: u32 = 1024;

fn ring_allreduce() -> ExecGraph {
    let mut graph = GraphBuilder::new(HOSTS);
    let group = graph.add_group((0..HOSTS).map(RankId).collect());
    let collective = graph.add_collective(Collective {
        kind: CollectiveKind::AllReduce,
        group,
        bytes: Bytes(1 << 30),
        algorithm: CollectiveAlgorithm::Ring,
    });
    for rank in 0..HOSTS {
        graph.collective(RankId(rank), StreamId(0), collective, "allreduce", &[]);
    }
    graph.build().expect("valid graph")
}

/// Every host sends 1 GiB to one other host; the destinations are a fixed pseudo-random
/// permutation (a multiplicative shuffle, so the run is the same every time).
fn random_permutation() -> ExecGraph {
    let mut graph = GraphBuilder::new(HOSTS);
    for src in 0..HOSTS {
        let mut dst = (src * 389 + 71) % HOSTS;
        if dst == src {
            dst = (dst + 1) % HOSTS;
        }
        graph.transfer(RankId(src), StreamId(0), RankId(dst), Bytes(1 << 30), "flow", &[]);
    }
    graph.build().expect("valid graph")
}

fn flow(c: &mut Criterion) {
    let link = LinkSpec::new("100 Gb/s".parse().expect("unit"), "1 us".parse().expect("unit"));
    // A k = 16 three-level fat-tree: 1024 hosts, D-mod-K routing, 100 Gb/s and 1 us per link.
    let fat_tree = XgftSpec::k_ary(16, 3, vec![link; 3]).expect("fat-tree");
    let topology = Topology::build(&ClusterSpec {
        nodes: HOSTS,
        gpus_per_node: 1,
        intra_node: IntraNode::NvSwitch(link),
        network: NetworkSpec::new(FabricSpec::FatTree(fat_tree)),
        host_memory: None,
    })
    .expect("topology");
    let mut group = c.benchmark_group("flow");
    group.sample_size(10);

    let ring = ring_allreduce();
    let transfers = u64::from(HOSTS) * 2 * u64::from(HOSTS - 1);
    group.throughput(Throughput::Elements(transfers));
    group.bench_function("k16 fat-tree: ring allreduce 1 GiB, per-step flows (transfers/s)", |b| {
        b.iter(|| run(&ring, &mut FlowNetwork::new(&topology)).expect("run"))
    });

    let permutation = random_permutation();
    group.throughput(Throughput::Elements(u64::from(HOSTS)));
    group.bench_function("k16 fat-tree: random permutation of 1 GiB flows (transfers/s)", |b| {
        b.iter(|| run(&permutation, &mut FlowNetwork::new(&topology)).expect("run"))
    });
    group.finish();
}

criterion_group!(benches, flow);
criterion_main!(benches);
