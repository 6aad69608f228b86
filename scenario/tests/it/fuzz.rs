//! Mutation fuzzing of the scenario crate's readers with the workspace's one mutation engine
//! (the `fuzzing` crate, docs/fuzzing.md): real inputs with characters replaced, deleted,
//! inserted or duplicated give a value or an error naming the file (or the `--set` key), never
//! a panic, a hang or a runaway allocation. The case-count properties run 128 cases in
//! `cargo test` (`PROPTEST_CASES=N` for more); the time-budgeted targets run for
//! `FUZZ_SECONDS` (unset: 128 cases).

use std::path::{Path, PathBuf};

use fuzzing::{Campaign, mutate, names_one_of, text_edits};
use proptest::prelude::*;
use scenario::{Override, Scenario};
use workloads::Model;

const QUICKSTART: &str = include_str!("../../../scenarios/quickstart.toml");
const GPT3: &str = include_str!("../../../scenarios/gpt3-175b-1024.toml");
const LAYERS: &str = "[model]\nname = \"tiny\"\ninput = [3, 32, 32]\n\n[[layers]]\nname = \"stem\"\nkind = \"conv2d\"\nout-channels = 16\nkernel = 3\npadding = 1\n\n[[layers]]\nname = \"add\"\nkind = \"add\"\nwith = \"stem\"\n\n[[layers]]\nname = \"pool\"\nkind = \"global-avgpool\"\n\n[[layers]]\nname = \"fc\"\nkind = \"linear\"\nout-features = 10\n";

fn text(seed: &str, edits: &[fuzzing::Edit<char>]) -> String {
    let seed: Vec<char> = seed.chars().collect();
    mutate(&seed, edits, &[]).into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn scenario_parsing_never_panics(gpt in any::<bool>(), edits in text_edits()) {
        let text = text(if gpt { GPT3 } else { QUICKSTART }, &edits);
        if let Err(error) = Scenario::parse(&text, Path::new("fuzz.toml")) {
            let message = error.to_string();
            prop_assert!(message.contains("fuzz.toml"), "{}", message);
        }
    }

    #[test]
    fn model_files_never_panic(edits in text_edits()) {
        let text = text(LAYERS, &edits);
        let _ = Model::from_toml_str(&text, "models/fuzz.toml");
    }
}

/// The scenario files of the checkout (every `*.toml` under scenarios/ with a `[cluster]`
/// table, sweeps apart), with their paths, so that model files they name resolve.
fn scenario_seeds() -> Vec<(PathBuf, String)> {
    fuzzing::seed_files("scenarios", ".toml", 64_000)
        .into_iter()
        .filter(|(path, _)| !path.components().any(|c| c.as_os_str() == "sweeps"))
        .filter_map(|(path, bytes)| String::from_utf8(bytes).ok().map(|text| (path, text)))
        .filter(|(_, text)| text.contains("[cluster]") && !text.contains("[axes]"))
        .collect()
}

/// Every scenario file of the checkout (every section: cluster, network, hosts, compute,
/// workload, parallelism, simulation, failures, variability...) and the hostile catalog's
/// scenarios, mutated: a scenario, or an error naming the file. Runs for `FUZZ_SECONDS`.
#[test]
fn scenario_files() {
    let mut seeds = scenario_seeds();
    let folder = fuzzing::root().join("scenarios");
    seeds.extend(
        fuzzing::hostile_texts("scenario").into_iter().map(|text| (folder.join("hostile.toml"), text)),
    );
    let paths: Vec<PathBuf> = seeds.iter().map(|(path, _)| path.clone()).collect();
    let strategy = fuzzing::text_mutants(seeds.into_iter().map(|(_, text)| text).collect());
    Campaign::from_env("scenario_files").with_default_cases(32).run(strategy, |(seed, text)| {
        let path = &paths[seed];
        if let Err(error) = Scenario::parse(&text, path) {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            names_one_of(&error.to_string(), &[name])?;
        }
        Ok(())
    });
}

/// Every model file of the zoo (data/models: layer lists, `[gpt]`, `[moe]`, `[dlrm]`...) and
/// the hostile catalog's model files, mutated: a model, or an error naming the file; the
/// model's layers are then counted (a model file is built eagerly, so a huge layer count
/// must be refused before it is allocated).
#[test]
fn model_files() {
    let mut seeds = fuzzing::seed_texts("data/models", ".toml", 64_000);
    seeds.push(LAYERS.to_string());
    seeds.extend(fuzzing::hostile_texts("model"));
    Campaign::from_env("model_files").with_default_cases(64).run(fuzzing::mutated_text(seeds), |text| {
        match Model::from_toml_str(&text, "data/models/fuzz.toml") {
            Ok(model) => prop_assert!(!model.name.is_empty()),
            Err(error) => names_one_of(&error.to_string(), &["fuzz.toml"])?,
        }
        Ok(())
    });
}

/// `--set KEY=VALUE` overrides: lines of every key of the quickstart and the GPT-3 scenario as
/// `key=value`, four at a time, mutated, each line parsed as `run --set` parses it and the
/// valid ones applied to that scenario: a scenario, or an error naming the scenario file or
/// the override's key.
#[test]
fn set_overrides() {
    let mut seeds = Vec::new();
    let mut bases = Vec::new();
    for (name, text) in [("quickstart.toml", QUICKSTART), ("gpt3-175b-1024.toml", GPT3)] {
        let table: toml::Table = toml::from_str(text).unwrap();
        let lines: Vec<String> = scenario::dotted_leaves(&table)
            .into_iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        for group in lines.chunks(4) {
            seeds.push(group.join("\n"));
            bases.push((name, text));
        }
    }
    let scenarios = fuzzing::root().join("scenarios");
    Campaign::from_env("set_overrides").with_default_cases(32).run(
        fuzzing::text_mutants(seeds),
        |(seed, lines)| {
            let (name, base) = bases[seed];
            let mut overrides = Vec::new();
            for line in lines.lines() {
                match line.parse::<Override>() {
                    Ok(setting) => overrides.push(setting),
                    // The message quotes the text as written (escaped as a Rust string).
                    Err(error) => names_one_of(&error.to_string(), &[line.trim(), &format!("{line:?}")])?,
                }
            }
            if let Err(error) = Scenario::parse_with(base, &scenarios.join(name), &overrides) {
                let mut names = vec![name];
                names.extend(lines.lines().filter_map(|l| l.split_once('=')).map(|(key, _)| key.trim()));
                names_one_of(&error.to_string(), &names)?;
            }
            Ok(())
        },
    );
}

const SWEEP: &str = include_str!("../../../scenarios/sweeps/quickstart-scaling.toml");

/// Sweep files (axes, derived keys, filters, the base scenario) mutated: a sweep or an error
/// naming the file. The checkout's sweep files are the seeds, the quickstart scaling sweep
/// first (as `fuzz.toml` beside it, so that relative scenario paths resolve).
#[test]
fn sweep_files_never_panic() {
    let mut seeds = vec![SWEEP.to_string()];
    seeds.extend(
        fuzzing::seed_texts("scenarios", ".toml", 64_000).into_iter().filter(|text| text.contains("[axes]")),
    );
    let path = fuzzing::root().join("scenarios/sweeps/fuzz.toml");
    Campaign::from_env("sweep_files_never_panic").run(fuzzing::mutated_text(seeds), |text| {
        if let Err(error) = scenario::sweep::Sweep::parse(&text, &path) {
            names_one_of(&error.to_string(), &["fuzz.toml"])?;
        }
        Ok(())
    });
}
