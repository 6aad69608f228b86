//! Operator import (for calibration) on a real trace: kernels are attributed to the innermost
//! operator around their launch, and the counts agree with an independent reading of the file.

use traces::kineto::import_operators;
use traces::kineto::operators::ActivityKind;

use crate::common::shared;

#[test]
fn the_a100_trace_attributes_its_kernels_to_operators_with_shapes() {
    let import =
        import_operators(&[shared("HolisticTraceAnalysis/trace_diff/control/control.json.gz")]).unwrap();
    let file = &import.files[0];
    assert_eq!(file.device.as_ref().unwrap().name, "NVIDIA A100-PG509-200");
    // Counted independently with a short Python script over the same JSON (HTA's rule:
    // innermost cpu_op on the launching thread whose interval holds the launch):
    // 283,278 us of compute kernels, 275,636 us of them attributed, 48 activities orphaned.
    assert_eq!(file.kernel_ns, 283_278_000);
    let attributed: u64 = file.operators.iter().map(|op| op.duration_ns(ActivityKind::Kernel)).sum();
    assert_eq!(attributed, 275_636_000);
    assert_eq!(file.unattributed, 48);
    let count = |name: &str| file.operators.iter().filter(|op| import.name(op.name) == name).count();
    assert_eq!((count("aten::mm"), count("aten::addmm"), count("aten::bmm")), (1092, 594, 90));
    // Every product carries its operands' shapes and types.
    let mm = file.operators.iter().find(|op| import.name(op.name) == "aten::mm").unwrap();
    assert!(
        matches!(mm.dims.as_slice(), [Some(a), Some(b)] if a.len() == 2 && b.len() == 2),
        "{:?}",
        mm.dims
    );
    assert_eq!(mm.types, [Some("float".to_string()), Some("float".to_string())]);
}

#[test]
fn nccl_kernels_record_the_multiprocessors_they_hold() {
    // Counted independently with a short Python script over the same JSON: the V100 trace's 64
    // NCCL kernels ran 251,341 us, all on grids of 2 blocks (of its 80 SMs); the A100 trace's
    // 60 ran 163,535 us on 24, 8 or 7 blocks (of 108), 3,561,548 block-microseconds.
    let v100 = import_operators(&[shared("HolisticTraceAnalysis/trace_diff/test/test.json.gz")]).unwrap();
    let file = &v100.files[0];
    assert_eq!(file.device.as_ref().unwrap().multiprocessors, 80);
    assert_eq!(file.nccl_ns, 251_341_000);
    assert_eq!(file.nccl_blocks(), Some(2.0));
    let a100 =
        import_operators(&[shared("HolisticTraceAnalysis/trace_diff/control/control.json.gz")]).unwrap();
    let file = &a100.files[0];
    assert_eq!(file.device.as_ref().unwrap().multiprocessors, 108);
    assert_eq!(file.nccl_ns, 163_535_000);
    assert_eq!(file.nccl_block_ns, 3_561_548_000);
}

/// One parse per file gives what two imports gave: the operators of `import_operators` over all
/// the inputs, and for each input the trace (or the error) of `import` of that input alone.
#[test]
fn one_parse_gives_the_operators_and_each_inputs_replay_import() {
    let inputs = [
        shared(
            "HolisticTraceAnalysis/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
        ),
        shared("HolisticTraceAnalysis/trace_filter/sampled_rank-0.json.gz"),
        shared(
            "HolisticTraceAnalysis/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
        ),
    ];
    let mut jobs = Vec::new();
    let both = traces::kineto::import_operators_and_jobs(&inputs, |input, imported| {
        jobs.push((input.to_path_buf(), imported.map(|i| i.trace).map_err(|e| e.to_string())));
    })
    .unwrap();
    let alone = import_operators(&inputs).unwrap();
    assert_eq!(both.names, alone.names);
    assert_eq!(format!("{:?}", both.files), format!("{:?}", alone.files));
    assert_eq!(both.warnings, alone.warnings);
    assert_eq!(jobs.len(), inputs.len());
    for ((input, trace), expected) in jobs.iter().zip(&inputs) {
        assert_eq!(input, expected);
        let replay = traces::kineto::import(std::slice::from_ref(expected))
            .map(|i| i.trace)
            .map_err(|e| e.to_string());
        assert_eq!(trace, &replay, "{}", input.display());
    }
    assert!(jobs.iter().any(|(_, trace)| trace.as_ref().is_ok_and(|t| !t.ranks[0].calls.is_empty())));
}
