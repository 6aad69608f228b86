//! The Chrome trace export, parsed back and checked against the run it came from.

use serde_json::Value;
use sim_core::exec::{Timeline, run};
use sim_core::graph::{
    Collective, CollectiveAlgorithm, CollectiveKind, ExecGraph, GraphBuilder, GroupKind, MemcpyDirection,
    OpKind, OpMeta, Pass, RankId, StreamId,
};
use sim_core::network::AnalyticalNetwork;
use sim_core::units::{Bytes, SimDuration};
use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology};
use traces::chrome::ChromeTrace;

fn topology(hosts: u32) -> Topology {
    let link = LinkSpec::new("100 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    Topology::build(&ClusterSpec {
        nodes: hosts,
        gpus_per_node: 1,
        intra_node: IntraNode::NvSwitch(link),
        network: NetworkSpec::single_switch(link),
        host_memory: Some(link),
    })
    .unwrap()
}

/// Four ranks: forward/backward compute, a pipeline transfer, two allreduces with one rank
/// late (so members wait), a host copy. Durations in odd picoseconds to exercise rounding.
/// The kernels and allreduces carry metadata: layers `conv1` (0) and `layer2` (1), their pass,
/// and the allreduces' group and origin.
fn sample() -> (ExecGraph, Timeline) {
    let mut graph = GraphBuilder::new(4);
    graph.set_layer_names(vec!["conv1".into(), "layer2".into()]);
    let ddp = graph.origin("ddp");
    let kernel = |layer: u32, pass| OpMeta::NONE.with_layer(layer).with_pass(pass);
    let everyone = graph.add_group((0..4).map(RankId).collect());
    let collectives: Vec<_> = [Bytes(4 << 20), Bytes(123_457)]
        .into_iter()
        .map(|bytes| {
            graph.add_collective(Collective {
                kind: CollectiveKind::AllReduce,
                group: everyone,
                bytes,
                algorithm: CollectiveAlgorithm::Ring,
            })
        })
        .collect();
    let mut sends = Vec::new();
    for rank in (0..4).map(RankId) {
        let extra = SimDuration::from_ps(1_234_567 * u64::from(rank.0 + 1));
        let forward = graph.compute(
            rank,
            StreamId(0),
            SimDuration::from_us(100).checked_add(extra).unwrap(),
            "conv1 forward",
            &[],
        );
        graph.set_meta(forward, kernel(0, Pass::Forward));
        let backward =
            graph.compute(rank, StreamId(0), SimDuration::from_us(150), "conv1 backward-weight", &[forward]);
        graph.set_meta(backward, kernel(0, Pass::BackwardWeight));
        for &collective in &collectives {
            let op =
                graph.collective(rank, StreamId(1), collective, "allreduce gradient bucket", &[backward]);
            graph.set_meta(
                op,
                OpMeta::NONE.with_pass(Pass::BackwardWeight).with_group(GroupKind::Data).with_origin(ddp),
            );
        }
        graph.memcpy(
            rank,
            StreamId(2),
            MemcpyDirection::DeviceToHost,
            Bytes(1 << 20),
            "checkpoint",
            &[forward],
        );
        if rank.0 < 3 {
            sends.push(graph.transfer(
                rank,
                StreamId(3),
                RankId(rank.0 + 1),
                Bytes(1_000_000),
                "activations",
                &[forward],
            ));
        }
    }
    for (index, &send) in sends.iter().enumerate() {
        let op = graph.compute(
            RankId(index as u32 + 1),
            StreamId(3),
            SimDuration::from_us(7),
            "layer2 forward",
            &[send],
        );
        graph.set_meta(op, kernel(1, Pass::Forward));
    }
    let graph = graph.build().unwrap();
    let timeline = run(&graph, &mut AnalyticalNetwork::new(&topology(4))).unwrap();
    (graph, timeline)
}

fn export(graph: &ExecGraph, timeline: &Timeline) -> Value {
    let mut bytes = Vec::new();
    ChromeTrace::new(graph, timeline).write(&mut bytes).unwrap();
    serde_json::from_slice(&bytes).expect("the export is valid JSON")
}

#[test]
fn every_op_once_with_its_simulated_times() {
    let (graph, timeline) = sample();
    let json = export(&graph, &timeline);
    let events = json["traceEvents"].as_array().expect("an object with traceEvents");
    let mut seen = vec![0u32; graph.op_count()];
    for event in events.iter().filter(|e| e["ph"] == "X" && e["args"]["op"].is_u64()) {
        let id = event["args"]["op"].as_u64().unwrap() as usize;
        seen[id] += 1;
        let op = graph.ops()[id];
        assert_eq!(event["pid"].as_u64(), Some(u64::from(op.rank.0)));
        assert_eq!(event["tid"].as_u64(), Some(u64::from(op.stream.0)));
        assert_eq!(event["name"].as_str(), Some(graph.label(op.label)));
        let ts = event["ts"].as_f64().unwrap();
        let dur = event["dur"].as_f64().unwrap();
        let start_us = timeline.start[id].as_ps() as f64 / 1e6;
        let end_us = timeline.end[id].as_ps() as f64 / 1e6;
        // Microsecond floats: exact to well below a picosecond at these magnitudes.
        assert!((ts - start_us).abs() <= 1e-6, "op {id}: ts {ts} vs {start_us}");
        assert!((ts + dur - end_us).abs() <= 1e-6, "op {id}: end {} vs {end_us}", ts + dur);
        match op.kind {
            OpKind::Collective(c) => {
                assert_eq!(event["cat"], "collective");
                assert_eq!(event["args"]["collective"], "allreduce");
                assert_eq!(event["args"]["algorithm"], "ring");
                assert_eq!(event["args"]["bytes"].as_u64(), Some(graph.collective(c).bytes.0));
                assert_eq!(event["args"]["group_size"].as_u64(), Some(4));
                // Metadata: a collective has no layer or phase of its own, but its pass,
                // communicator and origin.
                assert!(event["args"].get("layer").is_none());
                assert_eq!(event["args"]["phase"], "communication");
                assert_eq!(event["args"]["pass"], "backward-weight");
                assert_eq!(event["args"]["group"], "data");
                assert_eq!(event["args"]["policy"], "ddp");
            }
            OpKind::Transfer { dst, bytes } => {
                assert_eq!(event["args"]["peer"].as_u64(), Some(u64::from(dst.0)));
                assert_eq!(event["args"]["bytes"].as_u64(), Some(bytes.0));
            }
            OpKind::Memcpy { .. } => assert_eq!(event["args"]["direction"], "device-to-host"),
            OpKind::Compute { .. } => {
                // The layer and phase come from the op's metadata, not its label.
                let expected = match graph.label(op.label) {
                    "conv1 forward" => ("conv1", "forward", 0),
                    "conv1 backward-weight" => ("conv1", "backward-weight", 0),
                    _ => ("layer2", "forward", 1),
                };
                assert_eq!(event["args"]["layer"], expected.0);
                assert_eq!(event["args"]["phase"], expected.1);
                assert_eq!(event["args"]["pass"], expected.1);
                assert_eq!(event["args"]["layer_index"], expected.2);
                assert!(event["args"].get("policy").is_none() && event["args"].get("work").is_none());
            }
        }
    }
    assert!(seen.iter().all(|&count| count == 1), "each op exactly once: {seen:?}");

    // One process per rank, one thread per stream, named.
    let processes = events.iter().filter(|e| e["ph"] == "M" && e["name"] == "process_name").count();
    assert_eq!(processes, 4);
    assert!(
        events
            .iter()
            .any(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"] == "stream 1")
    );

    // A flow arrow per transfer, from sender to the receiver's dependent op.
    let starts: Vec<&Value> = events.iter().filter(|e| e["ph"] == "s").collect();
    let finishes: Vec<&Value> = events.iter().filter(|e| e["ph"] == "f").collect();
    assert_eq!((starts.len(), finishes.len()), (3, 3));
    for start in &starts {
        let finish = finishes.iter().find(|f| f["id"] == start["id"]).expect("matching finish");
        assert_eq!(finish["pid"].as_u64(), start["pid"].as_u64().map(|p| p + 1));
        assert!(finish["ts"].as_f64() >= start["ts"].as_f64());
    }
    // Members that waited for the late rank show it.
    assert!(events.iter().any(|e| e["name"] == "wait for peers"));
}

#[test]
fn export_is_deterministic_and_rejects_a_foreign_timeline() {
    let (graph, timeline) = sample();
    let mut first = Vec::new();
    let mut second = Vec::new();
    ChromeTrace::new(&graph, &timeline).write(&mut first).unwrap();
    ChromeTrace::new(&graph, &timeline).write(&mut second).unwrap();
    assert_eq!(first, second);
    let mut short = timeline.clone();
    short.start.pop();
    assert!(ChromeTrace::new(&graph, &short).write(Vec::new()).is_err());
}
