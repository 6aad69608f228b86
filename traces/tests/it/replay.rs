//! Replay graphs: invariants on synthetic traces, the real 8-rank DLRM job, re-targeting.

use sim_core::exec::run;
use sim_core::flow::FlowNetwork;
use sim_core::graph::{CollectiveAlgorithm, CollectiveKind, OpKind};
use sim_core::network::AnalyticalNetwork;
use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology};
use traces::kineto::import;
use traces::replay::{ReplayOptions, build};
use traces::synthetic::SyntheticJob;

use crate::common::{dlrm_directory, scratch};

/// GPUs behind one NVSwitch per 8, servers on one switch.
fn cluster(ranks: u32) -> Topology {
    let nvlink = LinkSpec::new("150 GB/s".parse().unwrap(), "1 us".parse().unwrap());
    let network = LinkSpec::new("200 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    let per_node = ranks.min(8);
    Topology::build(&ClusterSpec {
        nodes: ranks.div_ceil(per_node),
        gpus_per_node: per_node,
        intra_node: IntraNode::NvSwitch(nvlink),
        network: NetworkSpec::single_switch(network),
        host_memory: Some(LinkSpec::new("16 GB/s".parse().unwrap(), "1 us".parse().unwrap())),
    })
    .unwrap()
}

fn synthetic(name: &str, job: &SyntheticJob) -> std::path::PathBuf {
    let dir = scratch(name);
    for rank in 0..job.world_size {
        let mut file = fs_err::File::create(dir.join(format!("rank{rank}.json"))).unwrap();
        job.write_rank(rank, &mut file).unwrap();
    }
    dir
}

#[test]
fn a_trace_without_communication_replays_to_its_measured_iterations() {
    // Nothing in it is simulated: compute and host time are measured, so the replay must give
    // the measured iteration times back (to the nanosecond rounding of the rules).
    let job = SyntheticJob { world_size: 2, allreduce: false, ..SyntheticJob::default() };
    let trace = import(&[synthetic("no-communication", &job)]).unwrap().trace;
    let replay = build(&trace, &ReplayOptions::default()).unwrap();
    let timeline = run(&replay.graph, &mut AnalyticalNetwork::new(&cluster(2))).unwrap();
    let comparison = replay.compare(&timeline);
    assert_eq!(comparison.steps.len(), 3);
    for step in &comparison.steps {
        assert!(step.error().abs() < 1e-6, "step {}: {step:?}", step.number);
    }
}

#[test]
fn synthetic_data_parallel_job_waits_and_syncs_as_traced() {
    let job = SyntheticJob { world_size: 4, ..SyntheticJob::default() };
    let trace = import(&[synthetic("synthetic-dp", &job)]).unwrap().trace;
    let replay = build(&trace, &ReplayOptions::default()).unwrap();
    // 4 buckets x 3 steps, matched across the 4 ranks.
    assert_eq!(replay.counts.collectives, 12);
    assert!(replay.counts.sync_dependencies > 0);
    let timeline = run(&replay.graph, &mut AnalyticalNetwork::new(&cluster(4))).unwrap();
    let graph = &replay.graph;
    // Every allreduce starts after the compute kernel that precedes its stream wait, and the
    // optimizer after the last allreduce (cudaStreamWaitEvent rule).
    for (index, op) in graph.ops().iter().enumerate() {
        if graph.label(op.label).starts_with("synthetic_optimizer_kernel") {
            let last_allreduce_end = graph
                .ops()
                .iter()
                .enumerate()
                .filter(|(i, o)| {
                    o.rank == op.rank
                        && matches!(o.kind, OpKind::Collective(_))
                        && timeline.start[*i] < timeline.start[index]
                })
                .map(|(i, _)| timeline.end[i])
                .max()
                .expect("allreduces before the optimizer");
            assert!(timeline.start[index] >= last_allreduce_end, "optimizer waits for the gradients");
        }
    }
    let comparison = replay.compare(&timeline);
    assert_eq!(comparison.collectives.len(), 1);
    assert_eq!(comparison.collectives[0].count_per_rank, 12.0);
}

#[test]
fn dlrm_replays_close_to_its_measurement() {
    let trace = import(&[dlrm_directory()]).unwrap().trace;
    let replay = build(&trace, &ReplayOptions::default()).unwrap();
    assert_eq!(replay.counts.collectives, 8, "3 allreduces and 5 all-to-alls, each across the 8 ranks");
    for (index, collective) in replay.graph.collectives().iter().enumerate() {
        assert_eq!(replay.graph.group(collective.group).len(), 8, "collective {index}");
    }
    let topology = cluster(8);
    {
        let timeline = run(&replay.graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
        let comparison = replay.compare(&timeline);
        assert_eq!(comparison.steps.len(), 1);
        let step = &comparison.steps[0];
        assert!((step.measured_s - 0.016008).abs() < 1e-6, "{step:?}");
        // Recorded in docs/traces.md; a regression past 5% fails.
        assert!(step.error().abs() < 0.05, "{step:?}");
        let flow = run(&replay.graph, &mut FlowNetwork::new(&topology)).unwrap();
        assert!(replay.compare(&flow).steps[0].error().abs() < 0.05);
    }
}

#[test]
fn dlrm_retargets_to_more_and_fewer_ranks() {
    let trace = import(&[dlrm_directory()]).unwrap().trace;
    let original = build(&trace, &ReplayOptions::default()).unwrap();
    for ranks in [16, 64, 4] {
        let replay = build(&trace, &ReplayOptions { ranks: Some(ranks) }).unwrap();
        assert_eq!(replay.graph.ranks(), ranks);
        assert_eq!(replay.source.len(), ranks as usize);
        assert!(replay.source.iter().enumerate().all(|(m, &s)| s == m as u32 % 8));
        assert_eq!(replay.counts.collectives, 8);
        for (original, scaled) in original.graph.collectives().iter().zip(replay.graph.collectives()) {
            // Group resized, full buffer unchanged (so all-to-all shares shrink as 8 / M).
            assert_eq!(replay.graph.group(scaled.group).len(), ranks as usize);
            assert_eq!(scaled.bytes, original.bytes);
            assert_eq!(scaled.kind, original.kind);
            assert!(matches!(scaled.kind, CollectiveKind::AllReduce | CollectiveKind::AllToAll));
        }
        let timeline = run(&replay.graph, &mut AnalyticalNetwork::new(&cluster(ranks))).unwrap();
        let comparison = replay.compare(&timeline);
        assert_eq!(comparison.steps.len(), 1);
        assert!(comparison.steps[0].simulated_s > 0.0);
    }
}

#[test]
fn subgroups_tile_and_strided_groups_grow() {
    // Two ranks in one file each, allreduce on group [0, 1] of a world of 4 (a tensor-parallel
    // pair); ranks 2 and 3 are not traced.
    let dir = scratch("subgroups");
    for rank in 0..2u32 {
        let text = format!(
            r#"{{"distributedInfo": {{"rank": {rank}, "world_size": 4}}, "traceEvents": [
                {{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1, "dur": 10}},
                {{"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "pid": 0, "tid": 20, "ts": 20, "dur": 5,
                  "args": {{"Collective name": "allreduce", "In msg nelems": 1024, "dtype": "Float", "Process Group Ranks": "[0, 1]"}}}}
            ]}}"#
        );
        fs_err::write(dir.join(format!("rank{rank}.json")), text).unwrap();
    }
    let trace = import(&[dir]).unwrap().trace;
    assert_eq!(trace.groups, vec![vec![0, 1]]);
    let replay = build(&trace, &ReplayOptions::default()).unwrap();
    let groups: Vec<Vec<u32>> = replay
        .graph
        .collectives()
        .iter()
        .map(|c| replay.graph.group(c.group).iter().map(|r| r.0).collect())
        .collect();
    assert_eq!(groups, vec![vec![0, 1], vec![2, 3]]);
    // At the traced size the traced RING is replayed; re-targeted, NCCL's tuner chooses again.
    assert!(replay.graph.collectives().iter().all(|c| c.algorithm == CollectiveAlgorithm::Ring));
    let replay = build(&trace, &ReplayOptions { ranks: Some(8) }).unwrap();
    assert_eq!(replay.counts.collectives, 4);
    assert!(replay.graph.collectives().iter().all(|c| c.algorithm == CollectiveAlgorithm::Auto));
    let error = build(&trace, &ReplayOptions { ranks: Some(5) }).unwrap_err().to_string();
    assert!(error.contains("[0, 1]") && error.contains("multiple"), "{error}");
}
