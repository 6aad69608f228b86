//! Fitting kept apart from testing: what each scenario key of a validation case is
//! (`data/validation/keys.toml`) and every constant chosen by looking at a measurement, with
//! the cases it was fitted on (`data/validation/fitted.toml`).
//!
//! The ledger decides each case's [`Role`]: a case a declared constant was fitted on is
//! *calibration*, every other case is *test*, and the headline accuracy is over test cases
//! only. It also checks every key of every scenario table a case is built from: a fact, a
//! software setting or a simulation choice passes; a constant passes only where fitted.toml
//! declares it for the case's family with the same value; anything else is refused by name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::case::CaseError;

/// What a scenario key states about a validation case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyClass {
    /// The published configuration (hardware, cluster, model, strategy, batch, precision).
    Fact,
    /// A setting of the measured software (a framework's or library's switch).
    Software,
    /// How parasim simulates the run; says nothing about the run.
    Simulation,
    /// A number chosen by looking at a measurement: needs a [`Fitted`] declaration.
    Constant,
}

impl KeyClass {
    /// The name used in keys.toml.
    pub fn name(self) -> &'static str {
        match self {
            KeyClass::Fact => "fact",
            KeyClass::Software => "software",
            KeyClass::Simulation => "simulation",
            KeyClass::Constant => "constant",
        }
    }
}

/// `keys.toml` as written: the dotted keys of each class.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    fact: Vec<String>,
    software: Vec<String>,
    simulation: Vec<String>,
    constant: Vec<String>,
}

/// One declared fitted constant (`[[fitted]]` of fitted.toml).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Fitted {
    /// Unique id.
    pub id: String,
    /// The scenario key it sets, or, for a built-in constant, its name in the code or data.
    pub key: String,
    /// True for a default of the code or shipped data, which no scenario sets.
    #[serde(default)]
    pub builtin: bool,
    /// Where a built-in constant lives (`path: NAME`).
    #[serde(default)]
    pub location: Option<String>,
    /// Its value, as a scenario writes it (checked against scenarios for non-built-ins).
    pub value: toml::Value,
    /// Families whose scenarios may set it (non-built-in constants).
    #[serde(default)]
    pub families: Vec<String>,
    /// The cases it was fitted on (`family/case`): calibration cases.
    pub fitted_on: Vec<String>,
    /// What was looked at, and how the value follows from it.
    pub method: String,
}

/// fitted.toml as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FittedFile {
    #[serde(default)]
    fitted: Vec<Fitted>,
}

/// Whether a case may count in the headline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "kebab-case", tag = "role", content = "fitted")]
pub enum Role {
    /// No declared constant was fitted on it: it tests parasim.
    #[default]
    Test,
    /// These declared constants (ids) were fitted on it: it calibrates parasim.
    Calibration(Vec<String>),
}

impl Role {
    /// `test` or `calibration`.
    pub fn name(&self) -> &'static str {
        match self {
            Role::Test => "test",
            Role::Calibration(_) => "calibration",
        }
    }

    /// True for a test case.
    pub fn is_test(&self) -> bool {
        *self == Role::Test
    }
}

/// The key classification and the declared fitted constants, read and checked.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    classes: BTreeMap<String, KeyClass>,
    /// Every declared fitted constant, in file order.
    pub fitted: Vec<Fitted>,
    keys_file: PathBuf,
    fitted_file: PathBuf,
}

/// The ledger's file names in the suite's folder.
pub const KEYS_FILE: &str = "keys.toml";
/// The fitted constants' file name in the suite's folder.
pub const FITTED_FILE: &str = "fitted.toml";

fn format_error(file: &Path, key: impl Into<String>, message: impl Into<String>) -> CaseError {
    CaseError::Format { file: file.to_path_buf(), key: key.into(), message: message.into() }
}

fn parse<T: serde::de::DeserializeOwned>(text: &str, file: &Path) -> Result<T, CaseError> {
    let deserializer = toml::Deserializer::parse(text).map_err(|e| format_error(file, "", e.to_string()))?;
    serde_path_to_error::deserialize(deserializer)
        .map_err(|e| format_error(file, e.path().to_string(), e.into_inner().to_string()))
}

impl Ledger {
    /// Reads `keys.toml` and `fitted.toml` from the suite's folder `directory`.
    pub fn load(directory: &Path) -> Result<Ledger, CaseError> {
        let read = |name: &str| {
            let path = directory.join(name);
            fs_err::read_to_string(&path)
                .map(|text| (text, path.clone()))
                .map_err(|error| CaseError::Read { path, message: error.to_string() })
        };
        let (keys, keys_path) = read(KEYS_FILE)?;
        let (fitted, fitted_path) = read(FITTED_FILE)?;
        Ledger::parse(&keys, &keys_path, &fitted, &fitted_path)
    }

    /// Parses and checks the two files' texts; the paths name them in messages.
    pub fn parse(
        keys: &str,
        keys_file: &Path,
        fitted: &str,
        fitted_file: &Path,
    ) -> Result<Ledger, CaseError> {
        let parsed: KeysFile = parse(keys, keys_file)?;
        let mut classes = BTreeMap::new();
        for (class, keys) in [
            (KeyClass::Fact, parsed.fact),
            (KeyClass::Software, parsed.software),
            (KeyClass::Simulation, parsed.simulation),
            (KeyClass::Constant, parsed.constant),
        ] {
            for key in keys {
                if let Some(before) = classes.insert(key.clone(), class) {
                    return Err(format_error(
                        keys_file,
                        class.name(),
                        format!("{key:?} is also listed as {}: a key has one class", before.name()),
                    ));
                }
            }
        }
        let parsed: FittedFile = parse(fitted, fitted_file)?;
        let mut ids = BTreeSet::new();
        for (index, fitted) in parsed.fitted.iter().enumerate() {
            let key = |name: &str| format!("fitted[{index}].{name}");
            if !ids.insert(fitted.id.as_str()) {
                return Err(format_error(
                    fitted_file,
                    key("id"),
                    format!("{:?} is declared twice", fitted.id),
                ));
            }
            if fitted.method.trim().is_empty() {
                return Err(format_error(fitted_file, key("method"), "must say what was looked at"));
            }
            if fitted.builtin {
                if fitted.location.as_deref().is_none_or(|l| l.trim().is_empty()) {
                    return Err(format_error(
                        fitted_file,
                        key("location"),
                        "is required for a built-in constant: where it lives (path: NAME)",
                    ));
                }
                if !fitted.families.is_empty() {
                    return Err(format_error(
                        fitted_file,
                        key("families"),
                        "a built-in constant is set by no scenario; list the cases it was fitted on in fitted-on",
                    ));
                }
            } else {
                if classes.get(&fitted.key) != Some(&KeyClass::Constant) {
                    return Err(format_error(
                        fitted_file,
                        key("key"),
                        format!(
                            "{:?} is not a constant in {}: a scenario constant must be classified `constant` there (or mark a built-in with builtin = true)",
                            fitted.key,
                            keys_file.display()
                        ),
                    ));
                }
                if fitted.families.is_empty() {
                    return Err(format_error(
                        fitted_file,
                        key("families"),
                        "must name the families whose scenarios set it",
                    ));
                }
            }
        }
        Ok(Ledger {
            classes,
            fitted: parsed.fitted,
            keys_file: keys_file.to_path_buf(),
            fitted_file: fitted_file.to_path_buf(),
        })
    }

    /// The class of dotted scenario key `key`, if keys.toml lists it.
    pub fn class(&self, key: &str) -> Option<KeyClass> {
        self.classes.get(key).copied()
    }

    /// Checks that every case a declaration names exists in `cases` (full ids) and that every
    /// family it names is one of `families`.
    pub fn check_references(
        &self,
        families: &BTreeSet<String>,
        cases: &BTreeSet<String>,
    ) -> Result<(), CaseError> {
        for (index, fitted) in self.fitted.iter().enumerate() {
            for family in &fitted.families {
                if !families.contains(family) {
                    return Err(format_error(
                        &self.fitted_file,
                        format!("fitted[{index}].families"),
                        format!("{family:?}: no such family in the suite"),
                    ));
                }
            }
            for case in &fitted.fitted_on {
                if !cases.contains(case) {
                    return Err(format_error(
                        &self.fitted_file,
                        format!("fitted[{index}].fitted-on"),
                        format!(
                            "{case:?}: no such case (write family/case; `parasim validate --list` lists them)"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The role of case `case_id` (`family/case`).
    pub fn role(&self, case_id: &str) -> Role {
        let by: Vec<String> = self
            .fitted
            .iter()
            .filter(|f| f.fitted_on.iter().any(|c| c == case_id))
            .map(|f| f.id.clone())
            .collect();
        if by.is_empty() { Role::Test } else { Role::Calibration(by) }
    }

    /// Checks every key of scenario table `scenario`, set for a case of `family`: the dotted
    /// key that breaks the rule and why.
    pub fn check_scenario(&self, scenario: &toml::Table, family: &str) -> Result<(), (String, String)> {
        let mut leaves = Vec::new();
        collect_leaves(scenario, "", &mut leaves);
        for (key, value) in leaves {
            match self.class(&key) {
                None => {
                    return Err((
                        key.clone(),
                        format!(
                            "is not classified in {}: say whether it is a fact of the published run, a software setting, a simulation choice or a constant (fitted, declared in {})",
                            self.keys_file.display(),
                            self.fitted_file.display()
                        ),
                    ));
                }
                Some(KeyClass::Constant) => self.check_constant(&key, value, family)?,
                Some(_) => {}
            }
        }
        Ok(())
    }

    fn check_constant(&self, key: &str, value: &toml::Value, family: &str) -> Result<(), (String, String)> {
        let declared: Vec<&Fitted> = self
            .fitted
            .iter()
            .filter(|f| !f.builtin && f.key == key && f.families.iter().any(|x| x == family))
            .collect();
        if declared.is_empty() {
            return Err((
                key.to_string(),
                format!(
                    "is a constant, not a fact of the published run, and {} declares no fitted value of it for family {family:?}: declare it there with the cases it was fitted on (they become calibration cases), or remove it",
                    self.fitted_file.display()
                ),
            ));
        }
        if declared.iter().any(|f| same_value(&f.value, value)) {
            return Ok(());
        }
        let values: Vec<String> = declared.iter().map(|f| format!("{} ({})", f.value, f.id)).collect();
        Err((
            key.to_string(),
            format!(
                "= {value}, but {} declares {} for family {family:?}: a fitted constant has one value, declared once",
                self.fitted_file.display(),
                values.join(" or ")
            ),
        ))
    }
}

/// Equal TOML values, integers and floats compared as numbers.
fn same_value(a: &toml::Value, b: &toml::Value) -> bool {
    let number = |v: &toml::Value| v.as_float().or_else(|| v.as_integer().map(|i| i as f64));
    match (number(a), number(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Every non-table value of `table` with its dotted key.
fn collect_leaves<'a>(table: &'a toml::Table, prefix: &str, out: &mut Vec<(String, &'a toml::Value)>) {
    for (key, value) in table {
        let dotted = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        match value {
            toml::Value::Table(inner) => collect_leaves(inner, &dotted, out),
            other => out.push((dotted, other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: &str = r#"
fact = ["cluster.device", "parallelism.data"]
software = ["compute.cuda-graphs"]
simulation = ["simulation.fidelity"]
constant = ["workload.input.rate"]
"#;

    const FITTED: &str = r#"
[[fitted]]
id = "loader"
key = "workload.input.rate"
value = 345
families = ["demo"]
fitted-on = ["demo/one"]
method = "the 1-GPU log"

[[fitted]]
id = "tcp"
key = "tcp overhead"
builtin = true
location = "sim-core: TCP"
value = "15 us"
fitted-on = ["demo/one", "demo/two"]
method = "curves"
"#;

    fn ledger() -> Ledger {
        Ledger::parse(KEYS, Path::new("keys.toml"), FITTED, Path::new("fitted.toml")).unwrap()
    }

    fn table(text: &str) -> toml::Table {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn a_case_a_constant_was_fitted_on_is_calibration() {
        let ledger = ledger();
        assert_eq!(ledger.role("demo/one"), Role::Calibration(vec!["loader".into(), "tcp".into()]));
        assert_eq!(ledger.role("demo/two"), Role::Calibration(vec!["tcp".into()]));
        assert_eq!(ledger.role("demo/three"), Role::Test);
    }

    #[test]
    fn every_key_of_every_section_is_checked() {
        let ledger = ledger();
        let ok = table(
            "[cluster]\ndevice = \"v100\"\n[workload.input]\nrate = 345.0\n[simulation]\nfidelity = \"flow\"",
        );
        assert_eq!(ledger.check_scenario(&ok, "demo"), Ok(()));
        let unknown = table("[parallelism]\ndata = 2\ncnn-staging-rate = \"1 GB/s\"");
        let (key, message) = ledger.check_scenario(&unknown, "demo").unwrap_err();
        assert_eq!(key, "parallelism.cnn-staging-rate");
        assert!(message.contains("not classified"), "{message}");
        let other_value = table("[workload.input]\nrate = 400");
        let (key, message) = ledger.check_scenario(&other_value, "demo").unwrap_err();
        assert_eq!(key, "workload.input.rate");
        assert!(message.contains("declares 345"), "{message}");
        let other_family = table("[workload.input]\nrate = 345");
        let (_, message) = ledger.check_scenario(&other_family, "elsewhere").unwrap_err();
        assert!(message.contains("declares no fitted value"), "{message}");
    }

    #[test]
    fn bad_ledgers_name_the_key() {
        let twice = "fact = [\"a\"]\nsoftware = [\"a\"]\nsimulation = []\nconstant = []";
        let error = Ledger::parse(twice, Path::new("keys.toml"), "", Path::new("fitted.toml")).unwrap_err();
        assert!(error.to_string().contains("also listed as fact"), "{error}");
        let undeclared_class = FITTED.replace("workload.input.rate", "cluster.device");
        let error = Ledger::parse(KEYS, Path::new("keys.toml"), &undeclared_class, Path::new("fitted.toml"))
            .unwrap_err();
        assert!(error.to_string().contains("fitted[0].key"), "{error}");
        let ledger = ledger();
        let families = BTreeSet::from(["demo".to_string()]);
        let cases = BTreeSet::from(["demo/one".to_string()]);
        let error = ledger.check_references(&families, &cases).unwrap_err();
        assert!(error.to_string().contains("\"demo/two\": no such case"), "{error}");
    }
}
