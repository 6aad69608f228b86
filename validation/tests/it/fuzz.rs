//! Mutation fuzzing of validation suite files (`parasim validate --suite-dir`), with the
//! workspace's one mutation engine (the `fuzzing` crate, docs/fuzzing.md): every family file
//! of data/validation and the hostile catalog's suite files, mutated, give a family or an error
//! naming the file, never a panic, a hang or a runaway allocation; and whatever scenario file
//! a parsed family names resolves inside the checkout or the shared data folder, or is refused
//! (issue 38: a shared suite must not make parasim read files it was not pointed at).

use std::path::{Component, Path, PathBuf};

use fuzzing::{Campaign, names_one_of};
use proptest::prelude::*;
use validation::case::{NOT_FAMILIES, Paths, parse_family};

/// `path` with `.` dropped and each `..` cancelling the name before it (no file system access).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Runs for `FUZZ_SECONDS` (unset: 128 cases).
#[test]
fn suite_files() {
    let mut seeds: Vec<String> = fuzzing::seed_files("data/validation", ".toml", 200_000)
        .into_iter()
        .filter(|(path, _)| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            path.parent().is_some_and(|p| p.ends_with("data/validation")) && !NOT_FAMILIES.contains(&name)
        })
        .filter_map(|(_, bytes)| String::from_utf8(bytes).ok())
        .collect();
    seeds.extend(fuzzing::hostile_texts("suite"));
    let root = lexical(&fuzzing::root());
    let file = root.join("data/validation/fuzz.toml");
    let paths = Paths { shared: root.join("../shared/data"), ..Paths::default() };
    let shared = lexical(&paths.shared);
    Campaign::from_env("suite_files").with_default_cases(64).run(fuzzing::mutated_text(seeds), |text| {
        match parse_family(&text, &file) {
            Ok(family) => {
                for case in &family.cases {
                    let Some(named) = &case.scenario_file else { continue };
                    if let Ok(path) = paths.resolve(named, &family.file) {
                        let path = lexical(&path);
                        prop_assert!(
                            path.starts_with(&root) || path.starts_with(&shared),
                            "{named:?} resolved outside the checkout and the shared data: {}",
                            path.display()
                        );
                    }
                }
            }
            Err(error) => names_one_of(&error.to_string(), &["fuzz.toml"])?,
        }
        Ok(())
    });
}
