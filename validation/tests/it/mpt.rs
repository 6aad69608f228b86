//! mpt-llm-foundry: every case's model, at the case's sequence length, has the parameter count
//! of its row of llm-foundry's table (the `NumParams` its derivation transcribes), and the
//! measured step is the row's tokens per step over its tokens per second.

use std::path::{Path, PathBuf};

use validation::case::{CaseEntry, load_family};

fn suite() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/validation")
}

/// The number after `label` in the case's derivation.
fn number_after(case: &CaseEntry, label: &str) -> f64 {
    let derivation = case.derivation.as_deref().unwrap_or_default();
    let start =
        derivation.find(label).unwrap_or_else(|| panic!("{}: no {label:?} in {derivation:?}", case.id));
    let digits: String =
        derivation[start + label.len()..].trim_start().chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().unwrap_or_else(|_| panic!("{}: no number after {label:?}", case.id))
}

/// A `[case.scenario.workload]` key.
fn workload<'a>(case: &'a CaseEntry, key: &str) -> &'a toml::Value {
    case.scenario
        .as_ref()
        .and_then(|scenario| scenario.get("workload"))
        .and_then(|workload| workload.get(key))
        .unwrap_or_else(|| panic!("{}: no workload.{key}", case.id))
}

#[test]
fn every_mpt_case_has_its_rows_parameter_count_and_step() {
    let suite = suite();
    let family = load_family(&suite.join("mpt-llm-foundry.toml")).unwrap();
    // Both A100 sections of the table, one case per row.
    assert_eq!(family.cases.len(), 139);
    for case in &family.cases {
        let model = workload(case, "model").as_str().unwrap();
        let tokens = workload(case, "sequence-length").as_integer().unwrap() as u64;
        let built = scenario::load_model_with_sequence(model, &suite, tokens).unwrap();
        let published = number_after(case, "NumParams");
        let counted = built.parameters() as f64;
        // Within 1% is the family's requirement; the count is Megatron's formula, exact.
        assert!(
            (counted / published - 1.0).abs() < 0.01,
            "{}: {counted} parameters against the table's {published}",
            case.id
        );
        assert_eq!(counted, published, "{}", case.id);
        let step = number_after(case, "GlobalBatchSize (T)") / number_after(case, "Throughput (T/s)");
        let measured = case.measured.unwrap();
        assert!((measured / step - 1.0).abs() < 1e-5, "{}: measured {measured}, row {step}", case.id);
    }
}
