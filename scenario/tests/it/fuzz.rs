//! Mutation fuzzing of the scenario and model-file parsers with proptest: a shipped scenario
//! and a layer-by-layer model file with random bytes replaced, deleted, inserted or
//! duplicated give a scenario or an error naming the file, never a panic. `PROPTEST_CASES=N`
//! runs longer campaigns (docs/fuzzing.md).

use std::path::Path;

use proptest::prelude::*;
use scenario::Scenario;
use workloads::Model;

const QUICKSTART: &str = include_str!("../../../scenarios/quickstart.toml");
const GPT3: &str = include_str!("../../../scenarios/gpt3-175b-1024.toml");
const LAYERS: &str = "[model]\nname = \"tiny\"\ninput = [3, 32, 32]\n\n[[layers]]\nname = \"stem\"\nkind = \"conv2d\"\nout-channels = 16\nkernel = 3\npadding = 1\n\n[[layers]]\nname = \"add\"\nkind = \"add\"\nwith = \"stem\"\n\n[[layers]]\nname = \"pool\"\nkind = \"global-avgpool\"\n\n[[layers]]\nname = \"fc\"\nkind = \"linear\"\nout-features = 10\n";

/// One edit of a text, at a character boundary.
#[derive(Debug, Clone)]
enum Edit {
    Replace(prop::sample::Index, char),
    Delete(prop::sample::Index, usize),
    Insert(prop::sample::Index, String),
    Duplicate(prop::sample::Index, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<prop::sample::Index>(), prop::char::any()).prop_map(|(i, c)| Edit::Replace(i, c)),
        (any::<prop::sample::Index>(), 1usize..40).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<prop::sample::Index>(), "[0-9a-z\\[\\]=\". \\n-]{1,12}").prop_map(|(i, s)| Edit::Insert(i, s)),
        (any::<prop::sample::Index>(), 1usize..200).prop_map(|(i, n)| Edit::Duplicate(i, n)),
    ]
}

fn mutate(seed: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = seed.chars().collect();
    for edit in edits {
        if chars.is_empty() {
            break;
        }
        match edit {
            Edit::Replace(i, c) => {
                let at = i.index(chars.len());
                chars[at] = *c;
            }
            Edit::Delete(i, n) => {
                let at = i.index(chars.len());
                let end = (at + n).min(chars.len());
                chars.drain(at..end);
            }
            Edit::Insert(i, text) => {
                let at = i.index(chars.len());
                chars.splice(at..at, text.chars());
            }
            Edit::Duplicate(i, n) => {
                let at = i.index(chars.len());
                let end = (at + n).min(chars.len());
                let copy: Vec<char> = chars[at..end].to_vec();
                chars.splice(end..end, copy);
            }
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn scenario_parsing_never_panics(gpt in any::<bool>(), edits in prop::collection::vec(edit(), 1..6)) {
        let text = mutate(if gpt { GPT3 } else { QUICKSTART }, &edits);
        if let Err(error) = Scenario::parse(&text, Path::new("fuzz.toml")) {
            let message = error.to_string();
            prop_assert!(message.contains("fuzz.toml"), "{}", message);
        }
    }

    #[test]
    fn model_files_never_panic(edits in prop::collection::vec(edit(), 1..6)) {
        let text = mutate(LAYERS, &edits);
        let _ = Model::from_toml_str(&text, "models/fuzz.toml");
    }
}

const SWEEP: &str = include_str!("../../../scenarios/sweeps/quickstart-scaling.toml");
const SWEEP_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/sweeps/fuzz.toml");

/// Sweep files (axes, derived keys, filters, the base scenario) with the same mutations: a
/// sweep or an error naming the file, never a panic. Runs for `FUZZ_SECONDS` seconds (batches
/// of 1,000 freshly seeded cases) when set, else 128 cases (docs/fuzzing.md).
#[test]
fn sweep_files_never_panic() {
    use proptest::test_runner::{Config, TestRunner};
    let seconds: u64 = std::env::var("FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    let mut cases = 0u64;
    loop {
        let batch = if seconds == 0 { 128 } else { 1000 };
        let mut runner =
            TestRunner::new(Config { cases: batch, failure_persistence: None, ..Config::default() });
        runner
            .run(&prop::collection::vec(edit(), 1..6), |edits| {
                let text = mutate(SWEEP, &edits);
                if let Err(error) = scenario::sweep::Sweep::parse(&text, Path::new(SWEEP_PATH)) {
                    let message = error.to_string();
                    prop_assert!(message.contains("fuzz.toml"), "{}", message);
                }
                Ok(())
            })
            .unwrap();
        cases += u64::from(batch);
        if std::time::Instant::now() >= deadline {
            break;
        }
    }
    eprintln!("sweep_files_never_panic: {cases} cases");
}
