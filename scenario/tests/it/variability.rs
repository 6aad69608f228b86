//! `[variability]` and Monte Carlo iterations end to end: a scenario's keys, its errors, and the
//! distribution `simulate` reports.

use std::path::Path;

use scenario::Scenario;
use scenario::simulation::simulate;

/// The quickstart (ResNet-50 on 64 A100s) at 8 GPUs, with `variability` appended.
fn scenario(variability: &str, iterations: u32, seed: u64) -> Result<Scenario, scenario::ScenarioError> {
    let text = format!(
        "{}\n[variability]\n{variability}\n",
        scenario::QUICKSTART
            .replace("nodes = 8", "nodes = 1")
            .replace("data = 64", "data = 8")
            .replace("iterations = 1", &format!("iterations = {iterations}\nseed = {seed}"))
    );
    Scenario::parse(&text, Path::new("variability.toml"))
}

fn json(scenario: &Scenario) -> String {
    serde_json::to_string(&simulate(scenario).unwrap().summary).unwrap()
}

#[test]
fn zero_noise_gives_identical_iterations_equal_to_the_noise_free_run() {
    let noisy = scenario("op-noise = { distribution = \"gamma\", cv = 0.0 }", 25, 3).unwrap();
    let summary = simulate(&noisy).unwrap().summary;
    let distribution = summary.distribution.as_ref().unwrap();
    assert_eq!(summary.iteration_times.len(), 25);
    assert!(summary.iteration_times.iter().all(|t| *t == summary.iteration_times[0]));
    assert_eq!(summary.iteration_times[0].as_secs_f64(), distribution.nominal_s);
    assert_eq!(distribution.slowdown, 1.0);
    // The noise-free run is the plain simulation's iteration.
    let mut plain = noisy.clone();
    plain.variability = Default::default();
    plain.iterations = 1;
    assert_eq!(simulate(&plain).unwrap().summary.iteration_time, summary.iteration_time);
}

#[test]
fn a_named_2x_straggler_is_on_every_critical_path_and_sets_the_step() {
    let slow = scenario("slow-ranks = { ranks = [5], factor = 2.0 }", 10, 0).unwrap();
    let summary = simulate(&slow).unwrap().summary;
    let distribution = summary.distribution.unwrap();
    assert_eq!(distribution.critical_ranks[0].rank, 5);
    assert_eq!(distribution.critical_ranks[0].repetitions, 10);
    // Compute dominates ResNet-50's step here: twice the compute is most of twice the step.
    assert!(distribution.slowdown > 1.8 && distribution.slowdown < 2.05, "{}", distribution.slowdown);
    assert!(summary.iteration_times.iter().all(|t| *t == summary.iteration_times[0]));
}

#[test]
fn same_seed_gives_byte_identical_output_whatever_the_thread_count() {
    let text = "op-noise = { distribution = \"lognormal\", cv = 0.1 }\n\
                gpu-speed = { distribution = \"normal\", cv = 0.03 }\n\
                slow-ranks = { fraction = 0.25, factor = 1.1 }\n\
                host-interrupt = { every-ms = 10, duration-us = 200, jitter-us = 3000 }";
    let on = |threads: usize, seed: u64| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| json(&scenario(text, 40, seed).unwrap()))
    };
    let one = on(1, 9);
    assert_eq!(one, on(2, 9));
    assert_ne!(one, on(2, 10));
    assert!(one.contains("\"distribution\"") && one.contains("\"iteration_p99_s\""));
}

#[test]
fn without_variability_the_summary_has_no_distribution() {
    let text = scenario::QUICKSTART.replace("nodes = 8", "nodes = 1").replace("data = 64", "data = 8");
    let plain = Scenario::parse(&text, Path::new("plain.toml")).unwrap();
    let json = json(&plain);
    assert!(!json.contains("distribution") && !json.contains("iteration_p50_s"));
}

#[test]
fn bad_variability_keys_are_named() {
    let cases = [
        ("op-noise = { distribution = \"lognormal\", cv = -0.1 }", "variability.op-noise.cv", "must be >= 0"),
        (
            "op-noise = { distribution = \"weibull\", cv = 0.1 }",
            "variability.op-noise.distribution",
            "lognormal",
        ),
        ("op-noise = { distribution = \"gamma\" }", "variability.op-noise.cv", "is missing"),
        (
            "op-noise = { distribution = \"empirical\", ratios = [] }",
            "variability.op-noise.ratios",
            "at least one",
        ),
        (
            "gpu-speed = { distribution = \"empirical\", cv = 0.1, ratios = [1.0] }",
            "variability.gpu-speed.cv",
            "implied",
        ),
        ("slow-ranks = { fraction = 1.5, factor = 1.2 }", "variability.slow-ranks.fraction", "[0, 1]"),
        ("slow-ranks = { ranks = [8], factor = 2.0 }", "variability.slow-ranks.ranks", "ranks 0 to 7"),
        ("slow-ranks = { ranks = [1], fraction = 0.1, factor = 2.0 }", "variability.slow-ranks", "not both"),
        ("slow-ranks = { ranks = [1], factor = 0.0 }", "variability.slow-ranks.factor", "positive"),
        (
            "host-interrupt = { every-ms = 0, duration-us = 5 }",
            "variability.host-interrupt.every-ms",
            "positive",
        ),
        (
            "host-interrupt = { every-ms = 1, duration-us = 1000 }",
            "variability.host-interrupt.duration-us",
            "never run",
        ),
        (
            "host-interrupt = { every-ms = 1, duration-us = 5, jitter-us = 1000 }",
            "variability.host-interrupt.jitter-us",
            "shorter",
        ),
        ("noise = 0.1", "variability", "unknown field"),
    ];
    for (text, key, message) in cases {
        let error = scenario(text, 1, 0).unwrap_err().to_string();
        assert!(error.contains(&format!("`{key}")) && error.contains(message), "{text}: {error}");
    }
}

/// Monte Carlo iterations and plain ones (which stream beyond 100) both go past the old cap of
/// 100; both stop at the documented 1,000,000.
#[test]
fn monte_carlo_iterations_go_past_the_built_iterations_limit() {
    let many = scenario("op-noise = { distribution = \"normal\", cv = 0.02 }", 5000, 1).unwrap();
    assert_eq!(many.iterations, 5000);
    let text = scenario::QUICKSTART.replace("iterations = 1", "iterations = 5000");
    let plain = Scenario::parse(&text, Path::new("plain.toml")).unwrap();
    assert_eq!(plain.iterations, 5000);
    let text = scenario::QUICKSTART.replace("iterations = 1", "iterations = 1000001");
    let error = Scenario::parse(&text, Path::new("plain.toml")).unwrap_err().to_string();
    assert!(error.contains("simulation.iterations") && error.contains("1000000"), "{error}");
}
