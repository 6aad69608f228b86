//! Overrides: a varied scenario is the scenario a file saying the same would be, and a bad
//! override is the scenario's own error, attributed to the override.

use std::path::Path;

use scenario::simulation::simulate;
use scenario::{Override, QUICKSTART, Scenario, ScenarioError, ValidationCache};

fn overrides(texts: &[&str]) -> Vec<Override> {
    texts.iter().map(|text| text.parse().unwrap()).collect()
}

fn quickstart_with(texts: &[&str]) -> Result<Scenario, ScenarioError> {
    Scenario::parse_with(QUICKSTART, Path::new("quickstart.toml"), &overrides(texts))
}

#[test]
fn an_overridden_scenario_runs_as_the_edited_file_does() {
    let varied = quickstart_with(&[
        "cluster.nodes=4",
        "parallelism.data=32",
        "cluster.network.link-bandwidth=400 Gb/s",
    ])
    .unwrap();
    let edited = QUICKSTART
        .replace("nodes = 8", "nodes = 4")
        .replace("data = 64", "data = 32")
        .replace("link-bandwidth = \"200 Gb/s\"", "link-bandwidth = \"400 Gb/s\"");
    let edited = Scenario::parse(&edited, Path::new("quickstart.toml")).unwrap();
    let json = |s: &Scenario| serde_json::to_string(&simulate(s).unwrap().summary).unwrap();
    assert_eq!(json(&varied), json(&edited));
    let plain = quickstart_with(&[]).unwrap();
    assert_ne!(json(&varied), json(&plain));
}

#[test]
fn an_unknown_key_or_a_wrong_type_is_the_scenarios_error_naming_the_key() {
    let error = quickstart_with(&["parallelism.dta=32"]).unwrap_err();
    assert!(matches!(&error, ScenarioError::Overridden { setting, .. } if setting == "parallelism.dta=32"));
    assert_eq!(error.key(), Some("parallelism.dta"));
    let text = error.to_string();
    assert!(text.contains("unknown field `dta`") && text.contains("`data`"), "{text}");

    let error = quickstart_with(&["nothing.here=1"]).unwrap_err();
    assert!(error.to_string().contains("unknown field `nothing`"), "{error}");
    assert!(matches!(error, ScenarioError::Overridden { .. }), "{error}");

    let error = quickstart_with(&["parallelism.data=many"]).unwrap_err();
    let text = error.to_string();
    // The override is at fault, not the file: the message names the override and its key.
    assert!(
        text.starts_with("parallelism.data=\"many\": key `parallelism.data` (set by this override)"),
        "{text}"
    );
    assert!(!text.contains("quickstart.toml"), "{text}");
    assert!(text.ends_with("invalid type: string \"many\", expected u32"), "{text}");

    // A value of the right type that validation refuses: its message, attributed.
    let error = quickstart_with(&["parallelism.data=3"]).unwrap_err();
    assert!(
        error.to_string().starts_with("parallelism.data=3: key `parallelism.data` (set by this override)")
    );

    // A key through a value that is not a table.
    let error = quickstart_with(&["workload.model.name=x"]).unwrap_err();
    assert!(matches!(error, ScenarioError::Override(_)), "{error}");
}

#[test]
fn later_overrides_win_and_the_cache_shares_what_validation_derives() {
    let scenario = quickstart_with(&["parallelism.data=32", "cluster.nodes=4", "parallelism.data=16"]);
    assert!(scenario.is_err(), "16 x 1 does not use 32 GPUs");
    let table: toml::Table = toml::from_str(QUICKSTART).unwrap();
    let cache = ValidationCache::default();
    let file = Path::new("quickstart.toml");
    let a = Scenario::from_table_with(&table, &overrides(&["workload.batch-per-device=32"]), file, &cache)
        .unwrap();
    let b = Scenario::from_table_with(&table, &overrides(&["workload.batch-per-device=16"]), file, &cache)
        .unwrap();
    assert!(std::sync::Arc::ptr_eq(&a.model, &b.model));
    assert!(std::sync::Arc::ptr_eq(&a.device, &b.device));
    assert!(std::sync::Arc::ptr_eq(&a.compute, &b.compute));
    assert_eq!((a.global_batch, b.global_batch), (32 * 64, 16 * 64));
    // Another precision is another compute model's description; another model, another model.
    let c =
        Scenario::from_table_with(&table, &overrides(&["workload.model=resnet101"]), file, &cache).unwrap();
    assert!(!std::sync::Arc::ptr_eq(&a.model, &c.model));
    assert_eq!(c.model.name, "resnet101");
}
