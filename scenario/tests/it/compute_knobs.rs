//! The `[compute]` section reads every knob of the compute model's table by its key.

use std::path::Path;

use scenario::Scenario;
use sim_core::units::SimDuration;
use workloads::compute::knobs::{KNOBS, KnobKind, KnobValue};

/// One A100 training ResNet-50, with `compute` as the `[compute]` table.
fn parse(compute: &str) -> Result<Scenario, String> {
    let text = format!(
        "[cluster]\ndevice = \"a100-sxm4-80gb\"\nnodes = 1\ngpus-per-node = 1\n\
         [workload]\nmodel = \"resnet50\"\nbatch-per-device = 8\n[compute]\n{compute}\n"
    );
    Scenario::parse(&text, Path::new("knobs.toml")).map_err(|error| error.to_string())
}

#[test]
fn every_knob_round_trips_through_a_compute_section() {
    for knob in KNOBS {
        let (value, written) = match knob.kind {
            KnobKind::Efficiency => (KnobValue::Number(0.4375), "0.4375".to_string()),
            KnobKind::Fraction => (KnobValue::Number(0.25), "0.25".to_string()),
            KnobKind::Slowdown => (KnobValue::Number(1.5), "1.5".to_string()),
            KnobKind::NonNegative => (KnobValue::Number(3.5), "3.5".to_string()),
            KnobKind::Duration => {
                (KnobValue::Duration(SimDuration::from_ns(7_250)), "\"7.25 us\"".to_string())
            }
            KnobKind::Switch => (KnobValue::Switch(true), "true".to_string()),
        };
        let scenario = parse(&format!("{} = {written}", knob.key)).unwrap();
        assert_eq!(knob.get(&scenario.compute), value, "{}", knob.key);
        assert!(
            scenario.compute_source.ends_with(", 1 key(s) set in [compute]"),
            "{}",
            scenario.compute_source
        );
        // Every other knob keeps its default.
        for other in KNOBS.iter().filter(|other| other.key != knob.key) {
            assert_eq!(other.get(&scenario.compute), other.get(&Default::default()), "{}", other.key);
        }
    }
}

#[test]
fn compute_keys_are_refused_by_name_with_the_knobs_listed_in_table_order() {
    let error = parse("gemm-eff = 0.5").unwrap_err();
    let keys: Vec<String> = KNOBS.iter().map(|knob| format!("`{}`", knob.key)).collect();
    let listed = format!(
        "unknown field `gemm-eff`, expected one of `profile`, {}, `fusion`, `optimizer-passes`, `gradient-accumulation`",
        keys.join(", ")
    );
    assert!(error.contains("key `compute.gemm-eff`") && error.contains(&listed), "{error}");
    let error = parse("gemm-efficiency = \"x\"").unwrap_err();
    assert!(error.contains("key `compute.gemm-efficiency`") && error.contains("expected f64"), "{error}");
    let error = parse("launch-overhead = 3").unwrap_err();
    assert!(error.contains("a bare number 3 is ambiguous"), "{error}");
    let error = parse("cuda-graphs = 1").unwrap_err();
    assert!(error.contains("expected a boolean"), "{error}");
    let error = parse("conv-efficiency = 0").unwrap_err();
    assert!(error.contains("`conv-efficiency` is 0; it must be greater than 0 and at most 1"), "{error}");
    // The section written as an array is read by position, as serde reads any struct.
    let text =
        "compute = [\"x\"]\n[cluster]\ndevice = \"a100-sxm4-80gb\"\n[workload]\nmodel = \"resnet50\"\n";
    let error = Scenario::parse(text, Path::new("knobs.toml")).unwrap_err().to_string();
    let expected =
        format!("invalid length 1, expected struct ComputeSection with {} elements", KNOBS.len() + 4);
    assert!(error.contains(&expected), "{error}");
}
