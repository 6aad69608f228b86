//! Engine throughput: queue + executor on a synthetic graph of about 1.1 M ops.
//!
//! 64 ranks, each with a chain of compute ops on stream 0 that also waits on the previous
//! step of its ring neighbour, a point-to-point transfer on stream 1 every 16 steps, and an
//! allreduce over all ranks every 1024 steps. Run with `cargo bench -p sim-core`; criterion
//! reports time per run and events per second ("elem/s").

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sim_core::exec::run;
use sim_core::graph::{
    Collective, CollectiveAlgorithm, CollectiveKind, ExecGraph, GraphBuilder, OpId, RankId, StreamId,
};
use sim_core::network::AnalyticalNetwork;
use sim_core::units::{Bytes, SimDuration};
use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology};

const RANKS: u32 = 64;
const STEPS: u32 = 16_384;

fn synthetic_graph() -> ExecGraph {
    let mut graph = GraphBuilder::new(RANKS);
    let everyone = graph.add_group((0..RANKS).map(RankId).collect());
    let mut previous: Vec<Option<OpId>> = vec![None; RANKS as usize];
    for step in 0..STEPS {
        let last_step = previous.clone();
        for rank in 0..RANKS {
            let neighbour = last_step[((rank + RANKS - 1) % RANKS) as usize];
            let deps: Vec<OpId> = neighbour.into_iter().collect();
            let duration = SimDuration::from_ns(1_000 + u64::from((rank * 7 + step * 13) % 500));
            let op = graph.compute(RankId(rank), StreamId(0), duration, "kernel", &deps);
            previous[rank as usize] = Some(op);
            if step % 16 == 0 {
                graph.transfer(
                    RankId(rank),
                    StreamId(1),
                    RankId((rank + 1) % RANKS),
                    Bytes(1 << 20),
                    "send",
                    &[op],
                );
            }
        }
        if step % 1024 == 1023 {
            let collective = graph.add_collective(Collective {
                kind: CollectiveKind::AllReduce,
                group: everyone,
                bytes: Bytes(64 << 20),
                algorithm: CollectiveAlgorithm::Ring,
            });
            for rank in 0..RANKS {
                let deps: Vec<OpId> = previous[rank as usize].into_iter().collect();
                graph.collective(RankId(rank), StreamId(2), collective, "allreduce", &deps);
            }
        }
    }
    graph.build().expect("the synthetic graph is valid")
}

fn engine(c: &mut Criterion) {
    let graph = synthetic_graph();
    let link = LinkSpec::new("200 Gb/s".parse().expect("unit"), "1 us".parse().expect("unit"));
    let nvswitch = LinkSpec::new("300 GB/s".parse().expect("unit"), "0.7 us".parse().expect("unit"));
    let topology = Topology::build(&ClusterSpec {
        nodes: 8,
        gpus_per_node: 8,
        intra_node: IntraNode::NvSwitch(nvswitch),
        network: NetworkSpec::single_switch(link),
        host_memory: None,
    })
    .expect("topology");
    let events = run(&graph, &mut AnalyticalNetwork::new(&topology)).expect("run").events;
    println!("synthetic graph: {} ops, {} events per run", graph.op_count(), events);

    let mut group = c.benchmark_group("engine");
    group.sample_size(10);
    group.throughput(Throughput::Elements(events));
    group.bench_function("run 1.1M-op graph (events/s)", |b| {
        b.iter(|| run(&graph, &mut AnalyticalNetwork::new(&topology)).expect("run"))
    });
    group.throughput(Throughput::Elements(graph.op_count() as u64));
    group.bench_function("build + validate 1.1M-op graph (ops/s)", |b| b.iter(synthetic_graph));
    group.finish();
}

criterion_group!(benches, engine);
criterion_main!(benches);
