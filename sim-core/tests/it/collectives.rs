//! Collective algorithms end to end: the flow model against the analytical closed forms where
//! nothing else contends, NCCL-like choice, bus bandwidth, and all-to-all under
//! oversubscription.

use sim_core::exec::run;
use sim_core::flow::FlowNetwork;
use sim_core::graph::{CollectiveAlgorithm, CollectiveKind, RankId};
use sim_core::nccl::choice::{analytical_time, choose};
use sim_core::nccl::protocol::ProtocolChoice;
use sim_core::network::AnalyticalNetwork;
use sim_core::units::Bytes;
use topology::{ClusterSpec, FabricSpec, IntraNode, LinkSpec, NetworkSpec, Topology, XgftSpec};

use crate::{lone_collective, single_switch};

/// `nodes` DGX-like servers: 8 GPUs on an NVSwitch (300 GB/s, 0.7 us), one 200 Gb/s NIC each.
fn dgx(nodes: u32) -> Topology {
    let nvswitch = LinkSpec::new("300 GB/s".parse().unwrap(), "0.7 us".parse().unwrap());
    let nic = LinkSpec::new("200 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    Topology::build(&ClusterSpec {
        nodes,
        gpus_per_node: 8,
        intra_node: IntraNode::NvSwitch(nvswitch),
        network: NetworkSpec::single_switch(nic),
        host_memory: None,
    })
    .unwrap()
}

fn times(
    topology: &Topology,
    kind: CollectiveKind,
    algorithm: CollectiveAlgorithm,
    bytes: u64,
) -> (f64, f64) {
    let ranks = topology.host_count() as u32;
    let graph = lone_collective(ranks, kind, algorithm, Bytes(bytes));
    let analytical = run(&graph, &mut AnalyticalNetwork::new(topology)).unwrap().makespan().as_secs_f64();
    let flow = run(&graph, &mut FlowNetwork::new(topology)).unwrap().makespan().as_secs_f64();
    (analytical, flow)
}

#[test]
fn flow_and_analytical_agree_on_an_uncontended_network_for_large_messages() {
    use CollectiveAlgorithm as A;
    use CollectiveKind as K;
    let switch = single_switch(16, "100 Gb/s", "1 us");
    let servers = dgx(2);
    let cases = [
        (&switch, K::AllReduce, A::Ring),
        (&switch, K::AllReduce, A::HalvingDoubling),
        (&switch, K::AllReduce, A::DoubleBinaryTree),
        (&switch, K::AllGather, A::Ring),
        (&switch, K::ReduceScatter, A::Ring),
        (&switch, K::ReduceScatter, A::HalvingDoubling),
        (&switch, K::AllGather, A::HalvingDoubling),
        (&switch, K::Broadcast { root: 3 }, A::Chain),
        (&switch, K::AllToAll, A::Pairwise),
        (&servers, K::AllReduce, A::Ring),
        (&servers, K::AllReduce, A::Hierarchical),
    ];
    for (topology, kind, algorithm) in cases {
        let (analytical, flow) = times(topology, kind, algorithm, 64 << 20);
        let gap = (flow - analytical) / analytical;
        println!(
            "{:>14} {:>18}: analytical {analytical:.6} s, flow {flow:.6} s ({:+.3}%)",
            kind.name(),
            algorithm.name(),
            gap * 100.0
        );
        assert!(gap.abs() < 0.01, "{kind:?} by {algorithm:?}: analytical {analytical} s vs flow {flow} s");
    }
}

#[test]
fn ring_bus_bandwidth_approaches_the_link_bandwidth() {
    let topology = single_switch(16, "100 Gb/s", "1 us");
    let (analytical, flow) = times(&topology, CollectiveKind::AllReduce, CollectiveAlgorithm::Ring, 1 << 30);
    for seconds in [analytical, flow] {
        let bus_bandwidth = (1u64 << 30) as f64 / seconds * 2.0 * 15.0 / 16.0;
        assert!(bus_bandwidth > 0.99 * 12.5e9 && bus_bandwidth <= 12.5e9, "busbw {bus_bandwidth} B/s");
    }
}

#[test]
fn auto_picks_the_tree_for_small_and_the_ring_for_large_allreduces_across_servers() {
    // As NCCL's tuner does, with its protocols: its per-channel tree bandwidth caps make the
    // ring win large allreduces across servers.
    let topology = dgx(4);
    let group: Vec<RankId> = (0..32).map(RankId).collect();
    let mut network = AnalyticalNetwork::new(&topology).with_protocols(ProtocolChoice::Auto);
    let mut crossover = None;
    let mut previous = None;
    for power in 10..=32 {
        let bytes = Bytes(1 << power);
        let chosen = choose(CollectiveKind::AllReduce, bytes, &group, &mut network).unwrap().algorithm;
        if power == 10 {
            assert_eq!(chosen, CollectiveAlgorithm::Tree, "1 KiB");
        }
        if previous == Some(CollectiveAlgorithm::Tree) && chosen == CollectiveAlgorithm::Ring {
            crossover = Some(bytes);
        }
        previous = Some(chosen);
    }
    assert_eq!(previous, Some(CollectiveAlgorithm::Ring), "4 GiB");
    println!("tree up to, ring from {}", crossover.unwrap());
    // Without protocols, auto is the fastest candidate on the links alone.
    let mut network = AnalyticalNetwork::new(&topology);
    for bytes in [1u64 << 12, 1 << 20, 1 << 26, 1 << 30] {
        let mut time = |algorithm| {
            analytical_time(CollectiveKind::AllReduce, algorithm, Bytes(bytes), &group, &mut network).unwrap()
        };
        let auto = time(CollectiveAlgorithm::Auto);
        assert_eq!(auto, time(CollectiveAlgorithm::Ring).min(time(CollectiveAlgorithm::Tree)));
    }
}

/// A k = 4 fat-tree (16 hosts) whose core cables are `core` times oversubscribed.
fn fat_tree(core: f64) -> Topology {
    let link = LinkSpec::new("100 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    let mut spec = XgftSpec::k_ary(4, 3, vec![link; 3]).unwrap();
    spec.oversubscription = vec![1.0, 1.0, core];
    Topology::build(&ClusterSpec {
        nodes: 16,
        gpus_per_node: 1,
        intra_node: IntraNode::NvSwitch(link),
        network: NetworkSpec::new(FabricSpec::FatTree(spec)),
        host_memory: None,
    })
    .unwrap()
}

#[test]
fn all_to_all_slows_by_the_oversubscription_factor_on_the_traffic_that_crosses_the_core() {
    // On a k = 4 fat-tree a host's all-to-all sends 15 shares: 12 leave its pod over the core,
    // whose links each carry 12 shares (48 out of a pod over 4 core links). Full bisection:
    // the host links (15 shares) are the bottleneck. At 2:1 the core links behave like 24
    // shares: the run takes 24/15 = 2 x 12/15 = 1.6 times as long (the oversubscription times
    // the fraction of traffic that crosses the core, which tends to the full factor as pods
    // get smaller relative to the cluster).
    let bytes = 128u64 << 20;
    let (full_analytical, full_flow) =
        times(&fat_tree(1.0), CollectiveKind::AllToAll, CollectiveAlgorithm::Direct, bytes);
    let (over_analytical, over_flow) =
        times(&fat_tree(2.0), CollectiveKind::AllToAll, CollectiveAlgorithm::Direct, bytes);
    let ratio = over_flow / full_flow;
    println!(
        "flow: full {full_flow:.6} s, 2:1 {over_flow:.6} s: {ratio:.3}x; analytical {full_analytical:.6} / {over_analytical:.6} s"
    );
    assert!((ratio - 1.6).abs() < 0.01, "2:1 oversubscription slowed all-to-all {ratio:.3}x, expected 1.6x");
    assert!((over_analytical / full_analytical - 1.6).abs() < 0.01);
}

#[test]
fn the_analytical_model_is_optimistic_when_collectives_contend() {
    // A ring allreduce and, at the same time, a shift permutation on the same 16 hosts of a
    // single switch: every host link carries both. The analytical model times each alone; the
    // flow model shares the links and finishes later.
    let topology = single_switch(16, "100 Gb/s", "1 us");
    let mut graph = sim_core::graph::GraphBuilder::new(16);
    let group = graph.add_group((0..16).map(RankId).collect());
    let allreduce = graph.add_collective(sim_core::graph::Collective {
        kind: CollectiveKind::AllReduce,
        group,
        bytes: Bytes(256 << 20),
        algorithm: CollectiveAlgorithm::Ring,
    });
    for rank in 0..16 {
        graph.collective(RankId(rank), sim_core::graph::StreamId(0), allreduce, "allreduce", &[]);
        graph.transfer(
            RankId(rank),
            sim_core::graph::StreamId(1),
            RankId((rank + 8) % 16),
            Bytes(256 << 20),
            "shift",
            &[],
        );
    }
    let graph = graph.build().unwrap();
    let analytical = run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap().makespan().as_secs_f64();
    let flow = run(&graph, &mut FlowNetwork::new(&topology)).unwrap().makespan().as_secs_f64();
    println!("analytical {analytical:.6} s, flow {flow:.6} s");
    // Alone: the allreduce moves 480 MiB per host link in 40 ms, the shift 256 MiB in 21 ms;
    // together every link carries 736 MiB: at least 61 ms.
    assert!(flow > 1.4 * analytical, "flow {flow} s vs analytical {analytical} s");
    assert!(flow >= (736u64 << 20) as f64 / 12.5e9);
}

/// Ring allreduce time by the packet-steps flow model and by the steady-state flow model.
fn ring_both_ways(topology: &Topology, ranks: u32, bytes: u64) -> (f64, f64) {
    let graph = lone_collective(ranks, CollectiveKind::AllReduce, CollectiveAlgorithm::Ring, Bytes(bytes));
    let steps = run(&graph, &mut FlowNetwork::new(topology)).unwrap().makespan().as_secs_f64();
    let mut steady_network = FlowNetwork::new(topology).steady_state().audited();
    let steady = run(&graph, &mut steady_network).unwrap();
    let audit = steady_network.audit().unwrap();
    assert_eq!(audit.violation, None);
    assert!((audit.bytes_delivered - audit.bytes_sent).abs() <= 1e-6 * audit.bytes_sent);
    // One completion per ring edge plus a few, instead of one per message per step.
    assert!(steady.events <= 2 * u64::from(ranks) * 8 + 4, "steady state took {} events", steady.events);
    (steps, steady.makespan().as_secs_f64())
}

#[test]
fn steady_state_ring_matches_the_closed_form_uncontended() {
    for (topology, ranks) in [(single_switch(16, "100 Gb/s", "1 us"), 16), (dgx(2), 16), (dgx(8), 64)] {
        for bytes in [1u64 << 20, 1 << 30] {
            let (steps, steady) = ring_both_ways(&topology, ranks, bytes);
            let (analytical, _) = (
                run(
                    &lone_collective(
                        ranks,
                        CollectiveKind::AllReduce,
                        CollectiveAlgorithm::Ring,
                        Bytes(bytes),
                    ),
                    &mut AnalyticalNetwork::new(&topology),
                )
                .unwrap()
                .makespan()
                .as_secs_f64(),
                (),
            );
            println!(
                "{ranks} ranks, {bytes} B: analytical {analytical:.6}, packet-steps {steps:.6}, steady {steady:.6}"
            );
            assert!(
                (steady - analytical).abs() / analytical < 1e-3,
                "steady {steady} vs analytical {analytical}"
            );
        }
    }
}

#[test]
fn steady_state_and_packet_steps_agree_under_contention() {
    // Every ring of simulators.md on its fat-tree or dragonfly, DF128b's colliding rings
    // included, plus a ring sharing its links with a shift permutation.
    let link = LinkSpec::new("100 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    let cascade =
        |text| FabricSpec::CascadeDragonfly(topology::CascadeSpec::from_simgrid(text, link).unwrap());
    let xgft = |text| FabricSpec::FatTree(XgftSpec::from_simgrid(text, link).unwrap());
    for (fabric, hosts) in [
        (xgft("3;4,4,8;1,4,4;1,1,1"), 128),
        (xgft("2;8,16;1,8;1,1"), 64),
        (cascade("4,1;2,1;4,1;4"), 128),
        (cascade("8,1;1,1;8,1;2"), 128),
    ] {
        let topology = Topology::build(&ClusterSpec {
            nodes: hosts,
            gpus_per_node: 1,
            intra_node: IntraNode::NvSwitch(link),
            network: NetworkSpec::new(fabric),
            host_memory: None,
        })
        .unwrap();
        for bytes in [1u64 << 20, 64 << 20, 1 << 30] {
            let (steps, steady) = ring_both_ways(&topology, hosts, bytes);
            let gap = (steady - steps) / steps;
            println!(
                "{hosts} hosts, {bytes} B: packet-steps {steps:.6} s, steady {steady:.6} s ({:+.2}%)",
                100.0 * gap
            );
            // The bound: 5% under contention.
            assert!(gap.abs() < 0.05, "{hosts} hosts, {bytes} B: packet-steps {steps} vs steady {steady}");
        }
    }
}

#[test]
fn steady_state_trees_stay_close_to_packet_steps() {
    use CollectiveAlgorithm as A;
    use CollectiveKind as K;
    for (topology, ranks) in [(single_switch(16, "100 Gb/s", "1 us"), 16u32), (dgx(2), 16)] {
        for (kind, algorithm) in [(K::AllReduce, A::DoubleBinaryTree)] {
            for bytes in [64u64 << 20, 1 << 30] {
                let graph = lone_collective(ranks, kind, algorithm, Bytes(bytes));
                let analytical =
                    run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap().makespan().as_secs_f64();
                let steps = run(&graph, &mut FlowNetwork::new(&topology)).unwrap().makespan().as_secs_f64();
                let mut network = FlowNetwork::new(&topology).steady_state().audited();
                let steady = run(&graph, &mut network).unwrap();
                assert_eq!(network.audit().unwrap().violation, None);
                let seconds = steady.makespan().as_secs_f64();
                let gap = (seconds - steps) / steps;
                println!(
                    "{} {} {bytes} B: analytical {analytical:.6} s, packet-steps {steps:.6} s, steady {seconds:.6} s ({:+.2}% vs packet-steps), {} events",
                    kind.name(),
                    algorithm.name(),
                    100.0 * gap,
                    steady.events
                );
                assert!(
                    gap.abs() < 0.05,
                    "{kind:?} {algorithm:?} {bytes}: packet-steps {steps} vs steady {seconds}"
                );
                assert!(steady.events < 200, "{} events", steady.events);
            }
        }
    }
}

#[test]
fn the_chunk_size_sets_the_pipeline_depth() {
    // A pipelined chain broadcast of 8 MiB over 16 ranks: C + p - 2 steps of one chunk.
    let topology = single_switch(16, "100 Gb/s", "1 us");
    let graph = lone_collective(
        16,
        CollectiveKind::Broadcast { root: 0 },
        CollectiveAlgorithm::Chain,
        Bytes(8 << 20),
    );
    let step = |chunk: u64| 2_000_000 + chunk * 80; // 2 links of 1 us + the chunk at 12.5 GB/s
    for (chunk, chunks) in [(1u64 << 20, 8u64), (4 << 20, 2), (8 << 20, 1)] {
        let expected = (chunks + 14) * step(chunk);
        let analytical =
            run(&graph, &mut AnalyticalNetwork::new(&topology).with_chunk(Bytes(chunk))).unwrap().makespan();
        let flow = run(&graph, &mut FlowNetwork::new(&topology).with_chunk(Bytes(chunk))).unwrap().makespan();
        assert_eq!(analytical.as_ps(), expected, "chunk {chunk}");
        assert!(flow.as_ps().abs_diff(expected) < 100, "chunk {chunk}: flow {flow} vs {expected} ps");
    }
}

#[test]
fn all_to_all_pays_a_protocol_hop_per_peer() {
    // NCCL posts one send and one receive per peer: on one DGX-like server with LL, each
    // further peer adds LL's 0.6 us NVLink hop (the data of 8 bytes is negligible).
    let topology = dgx(1);
    let mut network = AnalyticalNetwork::new(&topology)
        .with_protocols(ProtocolChoice::Only(sim_core::nccl::protocol::Protocol::Ll))
        .with_collective_launch(sim_core::units::SimDuration::from_ns(8_400));
    let mut time = |ranks: u32| {
        let group: Vec<RankId> = (0..ranks).map(RankId).collect();
        analytical_time(CollectiveKind::AllToAll, CollectiveAlgorithm::Direct, Bytes(8), &group, &mut network)
            .unwrap()
            .as_ps() as f64
            / 1e6
    };
    let (four, eight) = (time(4), time(8));
    assert!((eight - four - 4.0 * 0.6).abs() < 0.01, "4 ranks {four} us, 8 ranks {eight} us");
    // LL's base latency (6.6 us) and one hop over the NVSwitch (2 x 0.7 us) come first.
    assert!((four - (6.6 + 1.4 + 2.0 * 0.6)).abs() < 0.01, "{four} us");
}

#[test]
fn nccl_tree_steady_form_is_its_closed_form_alone_and_slows_under_contention() {
    use CollectiveAlgorithm as A;
    use CollectiveKind as K;
    let topology = dgx(4);
    for bytes in [1u64 << 20, 64 << 20, 1 << 30] {
        let graph = lone_collective(32, K::AllReduce, A::Tree, Bytes(bytes));
        let analytical =
            run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap().makespan().as_secs_f64();
        let steps = run(&graph, &mut FlowNetwork::new(&topology)).unwrap().makespan().as_secs_f64();
        let mut network = FlowNetwork::new(&topology).steady_state().audited();
        let steady = run(&graph, &mut network).unwrap();
        assert_eq!(network.audit().unwrap().violation, None);
        let seconds = steady.makespan().as_secs_f64();
        println!(
            "tree {bytes} B: analytical {analytical:.6} s, packet-steps {steps:.6} s ({:+.2}%), steady {seconds:.6} s, {} events",
            100.0 * (steps - analytical) / analytical,
            steady.events
        );
        assert!(
            (seconds - analytical).abs() / analytical < 1e-4,
            "{bytes}: steady {seconds} vs analytical {analytical}"
        );
        assert!(steady.events < 200, "{} events", steady.events);
    }
    // A 1 GiB transfer out of GPU 0 (channel 0's head in its server) shares its NIC.
    let bytes = Bytes(256 << 20);
    let mut builder = sim_core::graph::GraphBuilder::new(32);
    let group = builder.add_group((0..32).map(RankId).collect());
    let collective = builder.add_collective(sim_core::graph::Collective {
        kind: K::AllReduce,
        group,
        bytes,
        algorithm: A::Tree,
    });
    for rank in 0..32 {
        builder.collective(RankId(rank), sim_core::graph::StreamId(0), collective, "allreduce", &[]);
    }
    builder.transfer(RankId(0), sim_core::graph::StreamId(1), RankId(8), Bytes(1 << 30), "bulk", &[]);
    let contended = builder.build().unwrap();
    let alone = lone_collective(32, K::AllReduce, A::Tree, bytes);
    let time = |graph: &sim_core::graph::ExecGraph| {
        let timeline = run(graph, &mut FlowNetwork::new(&topology).steady_state()).unwrap();
        timeline.end.iter().take(32).map(|end| end.since_start().as_secs_f64()).fold(0.0, f64::max)
    };
    let (quiet, busy) = (time(&alone), time(&contended));
    println!("tree 256 MiB alone {quiet:.6} s, beside a 1 GiB transfer {busy:.6} s");
    assert!(busy > quiet * 1.05, "alone {quiet} s, contended {busy} s");
}

#[test]
fn every_schedules_steady_form_is_its_closed_form_alone_and_slows_under_contention() {
    // The hierarchical allreduce, chains and all-to-alls run under `flow` as one coupled flow
    // per edge, each edge advancing in proportion to its bytes, topped up to the analytical
    // time: alone they take exactly that, in a few events; every byte sent is delivered and no
    // link is over capacity. Log-step algorithms stay message by message, exact too.
    use CollectiveAlgorithm as A;
    use CollectiveKind as K;
    let switch = single_switch(16, "100 Gb/s", "1 us");
    let servers = dgx(4);
    let cases = [
        (&switch, 16, K::AllReduce, A::HalvingDoubling),
        (&switch, 12, K::AllReduce, A::HalvingDoubling),
        (&switch, 16, K::AllReduce, A::RecursiveDoubling),
        (&switch, 16, K::ReduceScatter, A::HalvingDoubling),
        (&switch, 16, K::AllGather, A::HalvingDoubling),
        (&switch, 16, K::Broadcast { root: 3 }, A::Chain),
        (&switch, 16, K::Reduce { root: 0 }, A::BinomialTree),
        (&switch, 16, K::AllToAll, A::Pairwise),
        (&switch, 16, K::AllToAll, A::Direct),
        (&servers, 32, K::AllReduce, A::Hierarchical),
        (&servers, 32, K::AllReduce, A::HalvingDoubling),
        (&servers, 32, K::AllToAll, A::Direct),
    ];
    for (topology, ranks, kind, algorithm) in cases {
        for bytes in [1u64 << 20, 256 << 20] {
            let graph = lone_collective(ranks, kind, algorithm, Bytes(bytes));
            let analytical =
                run(&graph, &mut AnalyticalNetwork::new(topology)).unwrap().makespan().as_secs_f64();
            let steps = run(&graph, &mut FlowNetwork::new(topology)).unwrap().makespan().as_secs_f64();
            let mut network = FlowNetwork::new(topology).steady_state().audited();
            let steady = run(&graph, &mut network).unwrap();
            let audit = network.audit().unwrap();
            assert_eq!(audit.violation, None, "{kind:?} {algorithm:?}");
            assert!((audit.bytes_delivered - audit.bytes_sent).abs() <= 1e-6 * audit.bytes_sent);
            let seconds = steady.makespan().as_secs_f64();
            println!(
                "{:>14} {:>18} {ranks} ranks {bytes} B: analytical {analytical:.6} s, packet-steps {steps:.6} s, steady {seconds:.6} s, {} events",
                kind.name(),
                algorithm.name(),
                steady.events
            );
            assert!(
                (seconds - analytical).abs() / analytical < 1e-6,
                "{kind:?} {algorithm:?} {bytes}: steady {seconds} vs analytical {analytical}"
            );
            assert!(
                steady.events < 200 + 40 * u64::from(ranks),
                "{kind:?} {algorithm:?}: {} events",
                steady.events
            );
        }
    }
    // Beside a 1 GiB transfer out of GPU 0's NIC they slow down as message by message they
    // do: on its bottleneck link a coupled collective claims one flow's share per edge.
    for (kind, algorithm) in
        [(K::AllReduce, A::Hierarchical), (K::Broadcast { root: 0 }, A::Chain), (K::AllToAll, A::Direct)]
    {
        let bytes = Bytes(256 << 20);
        let mut builder = sim_core::graph::GraphBuilder::new(32);
        let group = builder.add_group((0..32).map(RankId).collect());
        let collective =
            builder.add_collective(sim_core::graph::Collective { kind, group, bytes, algorithm });
        for rank in 0..32 {
            builder.collective(RankId(rank), sim_core::graph::StreamId(0), collective, "collective", &[]);
        }
        builder.transfer(RankId(0), sim_core::graph::StreamId(1), RankId(8), Bytes(1 << 30), "bulk", &[]);
        let contended = builder.build().unwrap();
        let alone = lone_collective(32, kind, algorithm, bytes);
        let time = |graph: &sim_core::graph::ExecGraph, steady: bool| {
            let network = FlowNetwork::new(&servers);
            let timeline =
                if steady { run(graph, &mut network.steady_state()) } else { run(graph, &mut { network }) };
            timeline
                .unwrap()
                .end
                .iter()
                .take(32)
                .map(|end| end.since_start().as_secs_f64())
                .fold(0.0, f64::max)
        };
        let (quiet, busy) = (time(&alone, true), time(&contended, true));
        let busy_steps = time(&contended, false);
        println!(
            "{} 256 MiB: steady alone {quiet:.6} s, beside 1 GiB {busy:.6} s; packet-steps beside it {busy_steps:.6} s",
            algorithm.name()
        );
        assert!(busy > quiet, "{algorithm:?}: alone {quiet} s, contended {busy} s");
        assert!(
            (busy - busy_steps).abs() / busy_steps < 0.05,
            "{algorithm:?}: steady {busy} s vs packet-steps {busy_steps} s under contention"
        );
    }
}

/// `nodes` DGX-like servers (as [`dgx`]) whose InfiniBand switch reduces (SHARP).
fn dgx_sharp(nodes: u32) -> Topology {
    let mut spec = dgx(nodes).spec().clone();
    spec.network.transport.sharp = true;
    Topology::build(&spec).unwrap()
}

#[test]
fn collnet_carries_each_nics_share_once_at_every_fidelity() {
    // CollNet Chain: NCCL's latency (2 x 7 hops x 2.8 us + 30 us) plus the buffer over the
    // server's 8 NICs of 25 GB/s (the chain's NVLink, 300 GB/s, is faster), whatever the
    // number of servers; timed in closed form, so the flow model agrees exactly.
    let bytes = 1u64 << 30;
    let expected = 69.2e-6 + bytes as f64 / 200e9;
    for nodes in [2, 4, 16] {
        let topology = dgx_sharp(nodes);
        let group: Vec<RankId> = (0..nodes * 8).map(RankId).collect();
        let mut network = AnalyticalNetwork::new(&topology).with_protocols(ProtocolChoice::Auto);
        let chain = analytical_time(
            CollectiveKind::AllReduce,
            CollectiveAlgorithm::CollNetChain,
            Bytes(bytes),
            &group,
            &mut network,
        )
        .unwrap()
        .as_secs_f64();
        assert!((chain - expected).abs() < 1e-9, "{nodes} servers: {chain} s, expected {expected} s");
        let graph = lone_collective(
            nodes * 8,
            CollectiveKind::AllReduce,
            CollectiveAlgorithm::CollNetChain,
            Bytes(bytes),
        );
        let flow = run(&graph, &mut FlowNetwork::new(&topology).with_protocols(ProtocolChoice::Auto))
            .unwrap()
            .makespan()
            .as_secs_f64();
        assert!((flow - chain).abs() < 1e-9, "{nodes} servers: flow {flow} s, analytical {chain} s");
    }
    // NCCL's tuner takes CollNet Direct (NVSwitch servers, lower latency) for a large
    // allreduce over 16 servers with SHARP; without SHARP CollNet is not a candidate, and
    // asking for it is an error that says what it needs.
    let group: Vec<RankId> = (0..128).map(RankId).collect();
    let sharp = dgx_sharp(16);
    let mut network = AnalyticalNetwork::new(&sharp).with_protocols(ProtocolChoice::Auto);
    let chosen = choose(CollectiveKind::AllReduce, Bytes(1 << 28), &group, &mut network).unwrap();
    assert_eq!(chosen.algorithm, CollectiveAlgorithm::CollNetDirect);
    let plain = dgx(16);
    let mut network = AnalyticalNetwork::new(&plain).with_protocols(ProtocolChoice::Auto);
    let chosen = choose(CollectiveKind::AllReduce, Bytes(1 << 28), &group, &mut network).unwrap();
    assert!(!matches!(
        chosen.algorithm,
        CollectiveAlgorithm::CollNetDirect | CollectiveAlgorithm::CollNetChain
    ));
    let error = analytical_time(
        CollectiveKind::AllReduce,
        CollectiveAlgorithm::CollNetChain,
        Bytes(1 << 20),
        &group,
        &mut network,
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("cluster.network.sharp = true"), "{error}");
}
