//! The input pipeline (`[workload.input]`) against its closed forms: with prefetching, a
//! per-rank loader makes the iteration `max(step, load)`; a per-group loader adds the
//! serialisation of the broadcast batch, which holds the loader:
//! `pack + max(load, broadcast + unpack + step)`. A copy of the batch on the compute stream
//! (`copy = "compute-stream"`) adds `latency + bytes / host-link` to every step.

use std::path::Path;

use scenario::Scenario;
use scenario::simulation::{Summary, simulate};
use sim_core::units::SimDuration;

/// A 4-GPU V100 server training ResNet-50 (batch 64), with `parallelism` and `input` appended
/// as TOML.
fn scenario(parallelism: &str, input: &str, iterations: u32) -> Scenario {
    let micro = if parallelism.contains("data = 4") { 16 } else { 64 };
    let text = format!(
        "[cluster]\ndevice = \"v100-sxm2-16gb\"\nnodes = 1\ngpus-per-node = 4\n\
         intra-node = {{ kind = \"nvswitch\", bandwidth = \"50 GB/s\" }}\n\
         [workload]\nmodel = \"resnet50\"\nglobal-batch = 64\nmicro-batch = {micro}\nprecision = \"fp32\"\n\
         optimizer = \"adam\"\n{input}\n[parallelism]\n{parallelism}\n\
         [simulation]\nfidelity = \"analytical\"\niterations = {iterations}\n"
    );
    Scenario::parse(&text, Path::new("input-test.toml")).unwrap()
}

fn run(scenario: &Scenario) -> Summary {
    simulate(scenario).unwrap().summary
}

/// Rate (samples per second) at which loading the 64-sample batch takes `seconds`.
fn rate_for(seconds: f64) -> f64 {
    64.0 / seconds
}

fn close(a: SimDuration, b: SimDuration, picoseconds: u64) -> bool {
    a.as_ps().abs_diff(b.as_ps()) <= picoseconds
}

#[test]
fn a_per_rank_loader_makes_the_iteration_the_longer_of_step_and_load() {
    let spatial = "data = 1\nspatial = 4";
    let step = run(&scenario(spatial, "", 1)).iteration_time;
    assert_eq!(run(&scenario(spatial, "", 1)).breakdown.input_bound, SimDuration::ZERO);
    for (factor, iterations) in [(10.0, 1), (10.0, 3), (0.1, 1), (0.1, 3)] {
        let load = step.as_secs_f64() * factor;
        let input = format!("[workload.input]\nloader = \"per-rank\"\nrate = {}", rate_for(load));
        let summary = run(&scenario(spatial, &input, iterations));
        let expected = if factor > 1.0 { SimDuration::from_secs_f64(load).unwrap() } else { step };
        // Every iteration, not only the mean: the first batch was prefetched before the run.
        for time in &summary.iteration_times {
            assert!(close(*time, expected, 1_000), "load x{factor}: {time} vs {expected}");
        }
        if factor > 1.0 {
            let waited = SimDuration::from_ps(expected.as_ps() - step.as_ps());
            assert!(close(summary.breakdown.input_bound, waited, 1_000), "{}", summary.breakdown.input_bound);
        } else {
            assert_eq!(summary.breakdown.input_bound, SimDuration::ZERO);
        }
    }
}

#[test]
fn a_per_group_loader_serialises_and_broadcasts_the_batch_every_iteration() {
    let spatial = "data = 1\nspatial = 4";
    let step = run(&scenario(spatial, "", 1)).iteration_time;
    // 64 x 3 x 224 x 224 fp32 = 38.5 MB at 0.385 GB/s: 100 ms to serialise, 100 ms to unpack.
    let pack = SimDuration::from_secs_f64(64.0 * 602_112.0 / 0.385e9).unwrap();
    let slow = step.as_secs_f64() * 10.0;
    let input = |load: f64| {
        format!(
            "[workload.input]\nloader = \"per-group\"\nrate = {}\nbroadcast-rate = \"0.385 GB/s\"",
            rate_for(load)
        )
    };
    // Loader-bound: serialising, then loading the next batch, back to back on the loader.
    let bound = run(&scenario(spatial, &input(slow), 3));
    let expected = SimDuration::from_ps(pack.as_ps() + SimDuration::from_secs_f64(slow).unwrap().as_ps());
    for time in &bound.iteration_times {
        assert!(close(*time, expected, 1_000), "{time} vs {expected}");
    }
    // Step-bound: the batch's serialisation, broadcast and unpacking precede the step; the
    // network broadcast of 38.5 MB over NVLink adds under a millisecond.
    let fast = run(&scenario(spatial, &input(step.as_secs_f64() * 0.01), 1)).iteration_time;
    let floor = SimDuration::from_ps(step.as_ps() + 2 * pack.as_ps());
    let ceiling = SimDuration::from_ps(floor.as_ps() + SimDuration::from_ms(2).as_ps());
    assert!(fast > floor && fast < ceiling, "{fast} vs {floor}");
    // A group of one rank loads for itself: per-group is per-rank.
    let single = |loader: &str| {
        let text = format!("[workload.input]\nloader = \"{loader}\"\nrate = {}", rate_for(slow));
        run(&scenario("data = 4", &text, 1)).iteration_time
    };
    assert_eq!(single("per-group"), single("per-rank"));
}

#[test]
fn no_loader_changes_nothing() {
    let spatial = "data = 1\nspatial = 4";
    let plain = run(&scenario(spatial, "", 2));
    let none = run(&scenario(spatial, "[workload.input]\nloader = \"none\"\nrate = 1", 2));
    assert_eq!(plain.iteration_times, none.iteration_times);
}

#[test]
fn deeper_prefetching_never_slows_a_run() {
    let spatial = "data = 1\nspatial = 4";
    let step = run(&scenario(spatial, "", 1)).iteration_time.as_secs_f64();
    for factor in [0.5, 1.0, 2.0] {
        let with = |prefetch: u32| {
            let text = format!(
                "[workload.input]\nloader = \"per-rank\"\nrate = {}\nprefetch = {prefetch}",
                rate_for(step * factor)
            );
            run(&scenario(spatial, &text, 4)).iteration_time
        };
        assert!(with(2) <= with(1), "load x{factor}: prefetch 2 {} vs 1 {}", with(2), with(1));
    }
}

/// The V100's host link as the scenario defaults it: 15.75 GB/s and 1 us.
fn host_link_time(bytes: u64) -> SimDuration {
    SimDuration::from_secs_f64(1e-6 + bytes as f64 / 15.75e9).unwrap()
}

/// Whether `time` is `step + copy`, less at most the time the step's GPUs waited for their
/// hosts (`host_bound`): the copy gives a host that much of a head start on the step's
/// launches (the spatial step's halo exchanges and allgathers: 25 us of 2.4 ms; the
/// data-parallel step's copy adds exactly its transfer).
fn step_plus_copy(time: SimDuration, step: &Summary, copy: SimDuration) -> bool {
    let upper = step.iteration_time.checked_add(copy).unwrap();
    let lower = SimDuration::from_ps(upper.as_ps() - step.breakdown.host_bound.as_ps().min(upper.as_ps()));
    time.as_ps() + 1_000 >= lower.as_ps() && time.as_ps() <= upper.as_ps() + 1_000
}

#[test]
fn a_copy_on_the_compute_stream_adds_the_batch_over_the_host_link_to_every_iteration() {
    let copy = "[workload.input]\nloader = \"none\"\ncopy = \"compute-stream\"";
    // Spatial ranks each copy the whole batch of 64; data-parallel replicas their 16.
    for (parallelism, samples) in [("data = 1\nspatial = 4", 64), ("data = 4", 16)] {
        let step = run(&scenario(parallelism, "", 3));
        let transfer = host_link_time(samples * 602_112);
        let summary = run(&scenario(parallelism, copy, 3));
        for time in &summary.iteration_times {
            assert!(
                step_plus_copy(*time, &step, transfer),
                "{parallelism}: {time} vs {} + {transfer} (host-bound {})",
                step.iteration_time,
                step.breakdown.host_bound
            );
        }
    }
    // With a loader that keeps up, the same: the copy is inside the step.
    let spatial = "data = 1\nspatial = 4";
    let step = run(&scenario(spatial, "", 3));
    let fast = format!(
        "[workload.input]\nloader = \"per-rank\"\nrate = {}\ncopy = \"compute-stream\"",
        rate_for(step.iteration_time.as_secs_f64() * 0.1)
    );
    let transfer = host_link_time(64 * 602_112);
    for time in &run(&scenario(spatial, &fast, 3)).iteration_times {
        assert!(step_plus_copy(*time, &step, transfer), "{time} vs {} + {transfer}", step.iteration_time);
    }
}

#[test]
fn no_copy_changes_nothing() {
    let spatial = "data = 1\nspatial = 4";
    let plain = run(&scenario(spatial, "", 2));
    let none = run(&scenario(spatial, "[workload.input]\nloader = \"none\"\ncopy = \"none\"", 2));
    assert_eq!(plain.iteration_times, none.iteration_times);
}
