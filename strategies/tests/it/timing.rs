//! How long building (and lowering) the largest zoo models takes. Printed, not timed: run
//! `cargo test --release -p workloads --test it timing -- --nocapture` to read the numbers.
//! The bound asserted is far above them (a debug build on a loaded CI runner), only to catch a
//! pathological slowdown.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use strategies::{Parallelism, Strategy};
use workloads::{ComputeModel, DeviceCatalog, Dtype, Optimizer, Recompute, zoo};

/// The fastest of `runs` calls of `f`.
fn fastest<T>(runs: u32, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = None;
    let mut last = None;
    for _ in 0..runs {
        let start = Instant::now();
        let value = f();
        let elapsed = start.elapsed();
        best = Some(best.map_or(elapsed, |best: Duration| best.min(elapsed)));
        last = Some(value);
    }
    (best.unwrap(), last.unwrap())
}

#[test]
fn building_and_lowering_the_largest_models_takes_milliseconds() {
    let compute = ComputeModel::default();
    let device = DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap();
    for name in ["gpt3-175b", "megatron-1t", "resnet1001", "llama3-70b", "inception-v3"] {
        let (build, model) = fastest(5, || zoo::by_name(name).unwrap());
        let spec = Strategy {
            model: &model,
            device,
            compute: &compute,
            precision: Dtype::Bf16,
            gradient_precision: Dtype::Fp32,
            optimizer_precision: Dtype::Fp32,
            optimizer: Optimizer::Adam,
            weights: workloads::WeightStorage::default(),
            recompute: Recompute::None,
            passes: Default::default(),
            global_batch: 8,
            micro_batch: 1,
            parallelism: Parallelism::data_parallel(8),
            iterations: 1,
            fold_symmetric_ranks: false,
            input: None,
            layer_tables: None,
            chunk_layers: None,
            host_cpu: None,
            nvme: None,
            fusion: workloads::fusion::Fusion::None,
            batch_norm_group: workloads::groupbn::BatchNormGroup::NONE,
            optimizer_passes: workloads::OptimizerPasses::Fused,
            gradient_accumulation: workloads::GradientAccumulation::InKernel,
            muon: workloads::muon::Muon::default(),
        };
        let (lower, lowered) = fastest(5, || spec.lower().unwrap());
        let full = Strategy { recompute: Recompute::Full, ..spec.clone() };
        let (memory, _) = fastest(5, || full.lower().unwrap().stages[0].memory);
        println!(
            "{name:<14} {:>5} layers: build {:>8.3} ms, data-parallel lowering on 8 ranks {:>8.3} ms ({} ops), \
             lowering with full recomputation {:>7.3} ms",
            model.layers.len(),
            build.as_secs_f64() * 1e3,
            lower.as_secs_f64() * 1e3,
            lowered.graph.ops().len(),
            memory.as_secs_f64() * 1e3
        );
        assert!(
            build < Duration::from_secs(2)
                && lower < Duration::from_secs(5)
                && memory < Duration::from_secs(2),
            "{name}: {build:?}, {lower:?}, {memory:?}"
        );
    }
}
