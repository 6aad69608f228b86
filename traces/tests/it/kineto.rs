//! Import of the real Kineto traces in ../shared/data/traces, and of malformed input.

use traces::TraceError;
use traces::kineto::import;
use traces::model::{CollectiveType, GpuOpKind, Trace};

use crate::common::{dlrm_directory, scratch, shared, write_json};

fn collectives(trace: &Trace, rank: usize, kind: CollectiveType) -> Vec<Option<u64>> {
    let mut found: Vec<(u64, Option<u64>)> = trace.ranks[rank]
        .gpu_ops
        .iter()
        .filter_map(|op| match &op.kind {
            GpuOpKind::Collective(call) if call.kind == kind => Some((op.start_ns, call.bytes)),
            _ => None,
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, bytes)| bytes).collect()
}

#[test]
fn nccl_data_has_collective_arguments_on_kernels() {
    let imported = import(&[shared("HolisticTraceAnalysis/nccl_parser_config/nccl_data.json.gz")]).unwrap();
    let trace = &imported.trace;
    assert_eq!((trace.world_size, trace.ranks.len(), trace.ranks[0].rank), (2, 1, 0));
    let device = trace.device.as_ref().unwrap();
    assert_eq!(device.name, "NVIDIA A100-PG509-200");
    assert_eq!(device.devices_per_host, 8);
    let steps: Vec<u64> = trace.ranks[0].steps.iter().map(|s| s.number).collect();
    assert_eq!(steps, vec![4, 5, 6]);
    assert_eq!((trace.ranks[0].steps[0].duration_ns as f64 / 1e6).round(), 222.0);
    let allreduces = collectives(trace, 0, CollectiveType::AllReduce);
    assert_eq!(allreduces.len(), 15);
    assert_eq!(collectives(trace, 0, CollectiveType::Broadcast).len(), 6);
    // The kernel args: In msg nelems 6637568, dtype Float.
    assert!(allreduces.contains(&Some(6_637_568 * 4)), "{allreduces:?}");
    assert!(allreduces.iter().all(Option::is_some));
    // Process Group Ranks [0, 1] is the whole world of 2.
    assert!(trace.groups.is_empty());
}

#[test]
fn dlrm_sizes_come_from_host_annotations() {
    let imported = import(&[dlrm_directory()]).unwrap();
    let trace = &imported.trace;
    assert_eq!(trace.world_size, 8);
    assert_eq!(trace.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
    assert_eq!(trace.device.as_ref().unwrap().name, "Tesla V100-SXM2-32GB");
    for rank in 0..8 {
        assert_eq!(collectives(trace, rank, CollectiveType::AllToAll).len(), 5, "rank {rank}");
        assert_eq!(collectives(trace, rank, CollectiveType::AllReduce).len(), 3, "rank {rank}");
        assert_eq!(trace.ranks[rank].steps.len(), 1);
        assert_eq!(trace.ranks[rank].steps[0].number, 10);
    }
    // Rank 0: its first all-to-all is the `nccl:all_to_all` with Input Dims [[6144]] floats;
    // its first allreduce is `nccl:all_reduce` [[394241]] floats (record_param_comms around
    // it has only a TensorList).
    assert_eq!(collectives(trace, 0, CollectiveType::AllToAll)[0], Some(6144 * 4));
    assert_eq!(collectives(trace, 0, CollectiveType::AllReduce)[0], Some(394_241 * 4));
    // ProfilerStep#10 on rank 0: 14.455 ms on the host.
    assert_eq!(trace.ranks[0].steps[0].duration_ns, 14_455_000);
}

#[test]
fn hta_single_rank_traces() {
    let cases: [(&str, u32, u32, Option<&str>, usize); 4] = [
        (
            "HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz",
            2,
            1,
            Some("Tesla V100-SXM2-32GB"),
            5,
        ),
        ("HolisticTraceAnalysis/trace_diff/control/control.json.gz", 8, 3, Some("NVIDIA A100-PG509-200"), 6),
        ("HolisticTraceAnalysis/trace_diff/test/test.json.gz", 2, 1, Some("Tesla V100-SXM2-16GB"), 6),
        (
            "HolisticTraceAnalysis/negative_queue_length_values_check/rank0.json.gz",
            16,
            0,
            Some("NVIDIA A100-SXM4-80GB"),
            5,
        ),
    ];
    for (path, world, rank, device, steps) in cases {
        let imported = import(&[shared(path)]).unwrap();
        let trace = &imported.trace;
        assert_eq!((trace.world_size, trace.ranks[0].rank), (world, rank), "{path}");
        assert_eq!(trace.device.as_ref().map(|d| d.name.as_str()), device, "{path}");
        assert_eq!(trace.ranks[0].steps.len(), steps, "{path}");
    }
    // df_index_resolver: 2020 DDP allreduces, recorded without shapes.
    let imported =
        import(&[shared("HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz")]).unwrap();
    let allreduces = collectives(&imported.trace, 0, CollectiveType::AllReduce);
    assert_eq!(allreduces.len(), 2020);
    assert!(allreduces.iter().all(Option::is_none));
    assert_eq!(
        imported.warnings.count(
            "allreduce kernels whose message size the trace does not record (replayed at measured duration)"
        ),
        2020
    );
    // negative_queue: reduce-scatter input is the full buffer, allgather input is the shard.
    let imported =
        import(&[shared("HolisticTraceAnalysis/negative_queue_length_values_check/rank0.json.gz")]).unwrap();
    let trace = &imported.trace;
    let reduce_scatter = collectives(trace, 0, CollectiveType::ReduceScatter);
    assert_eq!(reduce_scatter.len(), 10);
    assert!(reduce_scatter.contains(&Some(65_536 * 384 * 4)));
    let allgather = collectives(trace, 0, CollectiveType::AllGather);
    assert!(allgather.contains(&Some(8192 * 64 * 4 * 16)), "{allgather:?}");
}

#[test]
fn two_ranks_of_a_sampled_128_rank_job() {
    let imported = import(&[
        shared("HolisticTraceAnalysis/trace_filter/sampled_rank-0.json.gz"),
        shared("HolisticTraceAnalysis/trace_filter/sampled_rank-1.json.gz"),
    ])
    .unwrap();
    let trace = &imported.trace;
    assert_eq!(trace.world_size, 128);
    assert_eq!(trace.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), vec![0, 1]);
    assert!(trace.device.is_none(), "the sampled traces do not record deviceProperties");
    // The kernels are SendRecv for every kind; the annotations say which.
    assert_eq!(collectives(trace, 0, CollectiveType::AllToAll).len(), 4);
    assert_eq!(collectives(trace, 0, CollectiveType::AllReduce).len(), 4);
    assert_eq!(collectives(trace, 0, CollectiveType::AllGather).len(), 2);
}

#[test]
fn unknown_events_are_counted_warnings() {
    let dir = scratch("unknown-events");
    let path = write_json(
        &dir,
        "odd.json",
        r#"{"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2, "args": {"correlation": 1}},
            {"ph": "X", "cat": "quantum_op", "name": "q", "ts": 1, "dur": 1},
            {"ph": "X", "cat": "quantum_op", "name": "q", "ts": 2, "dur": 1},
            {"ph": "X", "cat": "kernel", "name": "no time", "pid": 0, "tid": 7},
            {"ph": "B", "cat": "kernel", "name": "begin", "pid": 0, "tid": 7, "ts": 5},
            "not an event",
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": [1], "ts": 0, "dur": 1}
        ]}"#,
    );
    let imported = import(&[path]).unwrap();
    assert_eq!(imported.trace.ranks[0].gpu_ops.len(), 1);
    let warnings = &imported.warnings;
    assert_eq!(warnings.count("events of category `quantum_op` ignored (replay does not use them)"), 2);
    assert_eq!(warnings.count("kernel events without a valid `ts` and `dur` skipped"), 1);
    assert_eq!(warnings.count("kernel events that are not complete (\"X\") events skipped"), 1);
    assert_eq!(warnings.count("cuda_runtime events without a numeric thread id skipped"), 1);
}

#[test]
fn meaningless_input_is_an_error_that_says_why() {
    let dir = scratch("meaningless");
    let no_gpu = write_json(
        &dir,
        "cpu.json",
        r#"{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1}]}"#,
    );
    let error = import(&[no_gpu]).unwrap_err().to_string();
    assert!(error.contains("cpu.json") && error.contains("no GPU kernels"), "{error}");

    let broken = write_json(&dir, "broken.json", r#"{"traceEvents": [{"ph": "X"}, {"ph": "X", "ts": 1,"#);
    let error = import(&[broken]).unwrap_err();
    assert!(matches!(error, TraceError::Json { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains("broken.json") && message.contains("event 1"), "{message}");

    // A gzip file cut short: an error naming the file, not a panic.
    let bytes = fs_err::read(shared("HolisticTraceAnalysis/trace_filter/sampled_rank-0.json.gz")).unwrap();
    let cut = dir.join("cut.json.gz");
    fs_err::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let error = import(&[cut]).unwrap_err().to_string();
    assert!(error.contains("cut.json.gz"), "{error}");

    let kernel = r#"{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}"#;
    let a = write_json(
        &dir,
        "a.json",
        &format!(r#"{{"distributedInfo": {{"rank": 0, "world_size": 2}}, "traceEvents": [{kernel}]}}"#),
    );
    let b = write_json(
        &dir,
        "b.json",
        &format!(r#"{{"distributedInfo": {{"rank": 0, "world_size": 2}}, "traceEvents": [{kernel}]}}"#),
    );
    let error = import(&[a.clone(), b]).unwrap_err().to_string();
    assert!(error.contains("a.json") && error.contains("b.json") && error.contains("both rank 0"), "{error}");
    let c = write_json(
        &dir,
        "c.json",
        &format!(r#"{{"distributedInfo": {{"rank": 1, "world_size": 4}}, "traceEvents": [{kernel}]}}"#),
    );
    let error = import(&[a, c]).unwrap_err().to_string();
    assert!(error.contains("world size"), "{error}");
}

#[test]
fn collectives_that_cannot_be_matched_are_named() {
    let dir = scratch("unmatched");
    let allreduce = |ts: u32| {
        format!(
            r#"{{"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "pid": 0, "tid": 20, "ts": {ts}, "dur": 5,
                "args": {{"Collective name": "allreduce", "In msg nelems": 1024, "dtype": "Float"}}}}"#
        )
    };
    let zero = write_json(
        &dir,
        "rank0.json",
        &format!(
            r#"{{"distributedInfo": {{"rank": 0, "world_size": 2}}, "traceEvents": [{}, {}]}}"#,
            allreduce(10),
            allreduce(20)
        ),
    );
    let one = write_json(
        &dir,
        "rank1.json",
        &format!(
            r#"{{"distributedInfo": {{"rank": 1, "world_size": 2}}, "traceEvents": [{}]}}"#,
            allreduce(10)
        ),
    );
    let error = import(std::slice::from_ref(&dir)).unwrap_err();
    assert!(matches!(error, TraceError::Unmatched { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("allreduce") && message.contains("rank0.json") && message.contains("rank1.json"),
        "{message}"
    );
    drop((zero, one));
}
