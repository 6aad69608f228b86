//! `simulate_iteration_times` (the validation suite's run) gives `simulate`'s iteration times,
//! throughput and engine counters, bit for bit, on scenarios of several kinds: data parallel
//! over one or several iterations and under the flow model, DASO's eight iterations, weights
//! offloaded to host memory, a Megatron pipeline.

use std::path::Path;

use scenario::simulation::{simulate, simulate_iteration_times};
use scenario::{Override, Scenario};

fn scenario(file: &str, overrides: Vec<Override>) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
    Scenario::load_with(&path, &overrides).unwrap()
}

#[test]
fn iteration_times_alone_are_the_whole_simulations() {
    let cases = [
        scenario("scenarios/quickstart.toml", Vec::new()),
        scenario("scenarios/quickstart.toml", vec![Override::new("simulation.iterations", 3)]),
        scenario("scenarios/quickstart.toml", vec![Override::new("simulation.fidelity", "flow")]),
        scenario("scenarios/daso/resnet50-8x4-a100.toml", Vec::new()),
        scenario("scenarios/out-of-core/gpt-1.7b-offload-weights.toml", Vec::new()),
        scenario("scenarios/megatron-sc21/gpt-18.4b.toml", Vec::new()),
    ];
    for scenario in &cases {
        let whole = simulate(scenario).unwrap().summary;
        let times = simulate_iteration_times(scenario).unwrap();
        let what = &scenario.source;
        assert_eq!(times.iteration_time, whole.iteration_time, "{what}");
        assert_eq!(times.iteration_times, whole.iteration_times, "{what}");
        assert_eq!(times.iterations, whole.iterations, "{what}");
        assert_eq!(times.samples_per_second.to_bits(), whole.samples_per_second.to_bits(), "{what}");
        assert_eq!(times.cluster.gpus, whole.cluster.gpus, "{what}");
        assert_eq!(
            (times.engine.ops, times.engine.events),
            (whole.engine.ops, whole.engine.events),
            "{what}"
        );
    }
}
