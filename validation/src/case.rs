//! The suite's cases as data: `data/validation/<family>.toml`, one family of cases from one
//! source per file (data/validation/README.md documents the format).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ledger::{Ledger, Role};

/// Why the suite cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    /// A file or folder cannot be read.
    #[error("{path}: {message}")]
    Read {
        /// The file or folder.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A family file is not valid TOML or has a wrong key.
    #[error("{file}: {key}: {message}")]
    Format {
        /// The family file.
        file: PathBuf,
        /// The key, e.g. `case[3].measured` (empty for a syntax error).
        key: String,
        /// What is wrong and what would be valid.
        message: String,
    },
}

/// What a family's cases measure, and so how they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Time of one training iteration (or epoch) of a scenario.
    Iteration,
    /// Scaling efficiency of a scenario over a baseline.
    Scaling,
    /// An nccl-tests curve: time per size.
    NcclTests,
    /// A DeepBench kernel table: time per kernel.
    Deepbench,
    /// A real profiler trace: its iteration time, replayed.
    Replay,
    /// Forward and backward time of one transformer block inside a scenario's iteration
    /// (per-layer timings such as Korthikanti et al.'s Table 4).
    Layer,
    /// The memory one device of a scenario needs at its peak (the most loaded pipeline stage),
    /// or a part of it (`part`), from the memory model alone: no simulation.
    Memory,
}

impl Kind {
    /// The name used in files and reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Iteration => "iteration",
            Kind::Scaling => "scaling",
            Kind::NcclTests => "nccl-tests",
            Kind::Deepbench => "deepbench",
            Kind::Replay => "replay",
            Kind::Layer => "layer",
            Kind::Memory => "memory",
        }
    }
}

/// A family's header: the `[family]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FamilyHeader {
    /// Unique id, `[a-z0-9-]`.
    pub id: String,
    /// One line saying what the family is.
    pub title: String,
    /// The publication or repository the measurements come from.
    pub source: String,
    /// What the cases measure.
    pub kind: Kind,
    /// The unit of `measured`.
    pub unit: String,
    /// True if the family is part of the CI ratchet (its cases run in seconds).
    #[serde(default)]
    pub ci: bool,
    /// Caveats of every case.
    #[serde(default)]
    pub caveats: Vec<String>,
    /// Scenario keys every case starts from.
    #[serde(default)]
    pub scenario: Option<toml::Table>,
}

/// One `[[case]]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CaseEntry {
    /// Unique within the family.
    pub id: String,
    /// Where in the family's source (table, row).
    pub source: String,
    /// The measured value, in the family's unit (iteration and scaling cases).
    #[serde(default)]
    pub measured: Option<f64>,
    /// How the measured value was derived.
    #[serde(default)]
    pub derivation: Option<String>,
    /// Iteration cases measured in several environments (clusters, containers, each a source
    /// file of its own): the measurement in each, keyed by environment; `measured` is their
    /// median. A ranking compares two cases in the environments both were measured in, so that
    /// a configuration measured on a slower cluster does not rank as slower for it.
    #[serde(default)]
    pub measured_in: BTreeMap<String, f64>,
    /// Caveats of this case.
    #[serde(default)]
    pub caveats: Vec<String>,
    /// Cases sharing a ranking group are compared by rank (Kendall tau).
    #[serde(default)]
    pub ranking: Option<String>,
    /// Why the case cannot run yet; it is listed and counted, not run.
    #[serde(default)]
    pub pending: Option<String>,
    /// A scenario file the case starts from (relative to the family file).
    #[serde(default)]
    pub scenario_file: Option<String>,
    /// Scenario keys of this case, merged over the family's and the file's.
    #[serde(default)]
    pub scenario: Option<toml::Table>,
    /// Iterations per epoch, for a family measured in `s/epoch`.
    #[serde(default)]
    pub iterations_per_epoch: Option<f64>,
    /// Scaling cases: dotted scenario keys replaced to make the baseline.
    #[serde(default)]
    pub baseline: Option<toml::Table>,
    /// nccl-tests cases: the log (`shared:` or relative path).
    #[serde(default)]
    pub log: Option<String>,
    /// nccl-tests cases: the collective (allreduce, ...).
    #[serde(default)]
    pub collective: Option<String>,
    /// nccl-tests cases: ranks, if the log does not say.
    #[serde(default)]
    pub ranks: Option<u32>,
    /// nccl-tests cases: GPUs per benchmark process, if the log does not say.
    #[serde(default)]
    pub gpus_per_process: Option<u32>,
    /// DeepBench cases: the table (`shared:` or relative path).
    #[serde(default)]
    pub table: Option<String>,
    /// DeepBench and replay cases: the catalog device.
    #[serde(default)]
    pub device: Option<String>,
    /// DeepBench cases: the table's precision (fp32, fp16).
    #[serde(default)]
    pub precision: Option<String>,
    /// DeepBench cases: gemm or conv.
    #[serde(default)]
    pub operation: Option<String>,
    /// Replay cases: trace files or folders.
    #[serde(default)]
    pub traces: Vec<String>,
    /// Layer cases: the transformer block timed (its index in the model's `layers.N`); the
    /// blocks on both sides of it must exist, as its time is measured between their starts.
    #[serde(default)]
    pub layer: Option<u32>,
    /// Layer cases: the measured forward time of the block, in the family's unit.
    #[serde(default)]
    pub forward: Option<f64>,
    /// Layer cases: the measured backward time of the block (its recomputation included), in
    /// the family's unit.
    #[serde(default)]
    pub backward: Option<f64>,
    /// Memory cases: what is compared, `"allocated"` (the default: every tensor the memory
    /// model counts, what `torch.cuda.max_memory_allocated` measures), `"activations"` or
    /// `"model-states"` (weights, gradients and optimizer state).
    #[serde(default)]
    pub part: Option<String>,
    /// What other models (a paper's own analytical model, another simulator) predicted for
    /// this case, as published: the report sets them against the measurement next to parasim.
    #[serde(default, rename = "prediction")]
    pub predictions: Vec<Prediction>,
    /// Test or calibration, from the suite's ledger (fitted.toml); set by [`load_suite`].
    #[serde(skip)]
    pub role: Role,
}

/// Another model's published prediction of a case (`[[case.prediction]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prediction {
    /// Which model, as the report names it (e.g. "ParaDL oracle").
    pub model: String,
    /// Its predicted value, in the family's unit.
    pub value: f64,
    /// Where it is published (table, row, column).
    pub source: String,
}

/// A family file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FamilyFile {
    family: FamilyHeader,
    #[serde(default)]
    case: Vec<CaseEntry>,
}

/// A family of cases, read and checked.
#[derive(Debug, Clone)]
pub struct Family {
    /// The header.
    pub header: FamilyHeader,
    /// The file it came from.
    pub file: PathBuf,
    /// Its cases, in file order.
    pub cases: Vec<CaseEntry>,
}

impl Family {
    /// The full id of case `case`: `family/case`.
    pub fn case_id(&self, case: &CaseEntry) -> String {
        format!("{}/{}", self.header.id, case.id)
    }
}

/// The files of the suite's folder that are not families: the ratchet's floors, the key
/// classification and the declared fitted constants.
pub const NOT_FAMILIES: [&str; 3] = ["bounds.toml", "keys.toml", "fitted.toml"];

/// Reads every family file in `directory` (all `*.toml` but [`NOT_FAMILIES`]), sorted by id.
pub fn load_suite(directory: &Path) -> Result<Vec<Family>, CaseError> {
    let read_error = |path: &Path, error: std::io::Error| CaseError::Read {
        path: path.to_path_buf(),
        message: format!(
            "{error} (the suite lives in data/validation/ of the parasim checkout; pass --suite-dir)"
        ),
    };
    let mut files = Vec::new();
    for entry in fs_err::read_dir(directory).map_err(|e| read_error(directory, e))? {
        let path = entry.map_err(|e| read_error(directory, e))?.path();
        let is_family = path.extension().is_some_and(|e| e == "toml")
            && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| !NOT_FAMILIES.contains(&n));
        if is_family {
            files.push(path);
        }
    }
    let mut families = files.iter().map(|path| load_family(path)).collect::<Result<Vec<_>, _>>()?;
    families.sort_by(|a, b| a.header.id.cmp(&b.header.id));
    let ledger = Ledger::load(directory)?;
    for pair in families.windows(2) {
        if pair[0].header.id == pair[1].header.id {
            return Err(CaseError::Format {
                file: pair[1].file.clone(),
                key: "family.id".into(),
                message: format!("{:?} is also the id of {}", pair[1].header.id, pair[0].file.display()),
            });
        }
    }
    let family_ids: BTreeSet<String> = families.iter().map(|f| f.header.id.clone()).collect();
    let case_ids: BTreeSet<String> =
        families.iter().flat_map(|f| f.cases.iter().map(|c| f.case_id(c))).collect();
    ledger.check_references(&family_ids, &case_ids)?;
    for family in &mut families {
        check_keys(family, &ledger)?;
        for index in 0..family.cases.len() {
            family.cases[index].role = ledger.role(&family.case_id(&family.cases[index]));
        }
    }
    Ok(families)
}

/// Checks every scenario key a case of `family` is built from (the family's, each case's own
/// and the scenario file it names) against the ledger: the file and key that break the rule.
fn check_keys(family: &Family, ledger: &Ledger) -> Result<(), CaseError> {
    let id = family.header.id.as_str();
    let format = |file: &Path, key: String, message: String| CaseError::Format {
        file: file.to_path_buf(),
        key,
        message,
    };
    if let Some(scenario) = &family.header.scenario {
        ledger
            .check_scenario(scenario, id)
            .map_err(|(key, message)| format(&family.file, format!("family.scenario.{key}"), message))?;
    }
    let mut files_checked = BTreeSet::new();
    for (index, case) in family.cases.iter().enumerate() {
        if let Some(scenario) = &case.scenario {
            ledger.check_scenario(scenario, id).map_err(|(key, message)| {
                format(&family.file, format!("case[{index}].scenario.{key}"), message)
            })?;
        }
        let Some(file) = &case.scenario_file else { continue };
        if file.starts_with("shared:") || !files_checked.insert(file.clone()) {
            continue;
        }
        let path = Paths::default()
            .resolve(file, &family.file)
            .map_err(|message| format(&family.file, format!("case[{index}].scenario-file"), message))?;
        let text = fs_err::read_to_string(&path).map_err(|error| CaseError::Read {
            path: path.clone(),
            message: format!("{error} (case[{index}].scenario-file of {})", family.file.display()),
        })?;
        let table: toml::Table =
            toml::from_str(&text).map_err(|error| format(&path, String::new(), error.to_string()))?;
        ledger.check_scenario(&table, id).map_err(|(key, message)| {
            format(&path, key, format!("{message} (the scenario file of {})", family.case_id(case)))
        })?;
    }
    Ok(())
}

/// Reads and checks one family file.
pub fn load_family(path: &Path) -> Result<Family, CaseError> {
    let text = fs_err::read_to_string(path)
        .map_err(|error| CaseError::Read { path: path.to_path_buf(), message: error.to_string() })?;
    parse_family(&text, path)
}

/// Parses and checks family `text`; `file` names it in messages and anchors relative paths.
pub fn parse_family(text: &str, file: &Path) -> Result<Family, CaseError> {
    let format = |key: String, message: String| CaseError::Format { file: file.to_path_buf(), key, message };
    let deserializer =
        toml::Deserializer::parse(text).map_err(|error| format(String::new(), error.to_string()))?;
    let parsed: FamilyFile = serde_path_to_error::deserialize(deserializer)
        .map_err(|error| format(error.path().to_string(), error.into_inner().to_string()))?;
    let family = Family { header: parsed.family, file: file.to_path_buf(), cases: parsed.case };
    check(&family).map_err(|(key, message)| format(key, message))?;
    Ok(family)
}

fn is_id(text: &str) -> bool {
    !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// What a memory case may compare (`part`).
pub const MEMORY_PARTS: [&str; 3] = ["allocated", "activations", "model-states"];

/// The checks serde cannot make: ids, and each kind's required and forbidden keys.
fn check(family: &Family) -> Result<(), (String, String)> {
    let header = &family.header;
    if !is_id(&header.id) {
        return Err((
            "family.id".into(),
            format!("{:?}: use lower-case letters, digits, '-' and '.'", header.id),
        ));
    }
    for (key, value) in [("family.title", &header.title), ("family.source", &header.source)] {
        if value.trim().is_empty() {
            return Err((key.into(), "must say something".into()));
        }
    }
    let units: &[&str] = match header.kind {
        Kind::Iteration => &["s/iter", "s/epoch"],
        Kind::Scaling => &["fraction"],
        Kind::NcclTests | Kind::Replay => &["s"],
        Kind::Deepbench => &["s"],
        Kind::Layer => &["ms"],
        Kind::Memory => &["GB", "GiB"],
    };
    if !units.contains(&header.unit.as_str()) {
        return Err((
            "family.unit".into(),
            format!("{:?} for a {} family; valid: {}", header.unit, header.kind.name(), units.join(", ")),
        ));
    }
    let mut seen = BTreeSet::new();
    for (index, case) in family.cases.iter().enumerate() {
        let key = |name: &str| format!("case[{index}].{name}");
        if !is_id(&case.id) {
            return Err((key("id"), format!("{:?}: use lower-case letters, digits, '-' and '.'", case.id)));
        }
        if !seen.insert(case.id.as_str()) {
            return Err((key("id"), format!("{:?} appears twice in the family", case.id)));
        }
        if case.source.trim().is_empty() {
            return Err((key("source"), "must say where in the family's source the case is".into()));
        }
        if case.pending.as_deref().is_some_and(|reason| reason.trim().is_empty()) {
            return Err((key("pending"), "must give the reason the case cannot run".into()));
        }
        for (name, value) in
            [("measured", case.measured), ("forward", case.forward), ("backward", case.backward)]
        {
            if let Some(value) = value
                && !(value.is_finite() && value > 0.0)
            {
                return Err((key(name), format!("{value}: must be a positive number")));
            }
        }
        let measured_in_file = matches!(header.kind, Kind::Iteration | Kind::Scaling | Kind::Memory);
        for (number, prediction) in case.predictions.iter().enumerate() {
            let key = |name: &str| key(&format!("prediction[{number}].{name}"));
            if !measured_in_file {
                return Err((
                    key("model"),
                    format!(
                        "predictions compare one value; a {} case has many points (valid in iteration, scaling and memory families)",
                        header.kind.name()
                    ),
                ));
            }
            for (name, text) in [("model", &prediction.model), ("source", &prediction.source)] {
                if text.trim().is_empty() {
                    return Err((key(name), "must say something".into()));
                }
            }
            if !(prediction.value.is_finite() && prediction.value > 0.0) {
                return Err((key("value"), format!("{}: must be a positive number", prediction.value)));
            }
            if case.predictions[..number].iter().any(|p| p.model == prediction.model) {
                return Err((key("model"), format!("{:?} predicts this case twice", prediction.model)));
            }
        }
        if !case.measured_in.is_empty() {
            let Some(measured) = case.measured.filter(|_| header.kind == Kind::Iteration) else {
                return Err((key("measured-in"), "is for iteration cases that write `measured`".into()));
            };
            for (environment, value) in &case.measured_in {
                if environment.trim().is_empty() {
                    return Err((key("measured-in"), "an environment needs a name".into()));
                }
                if !(value.is_finite() && *value > 0.0) {
                    return Err((
                        key("measured-in"),
                        format!("{environment:?} = {value}: must be a positive number"),
                    ));
                }
            }
            let mut values: Vec<f64> = case.measured_in.values().copied().collect();
            let median = crate::calibration::median(&mut values).unwrap_or(f64::NAN);
            if (median - measured).abs() > 1e-3 * measured {
                return Err((
                    key("measured-in"),
                    format!(
                        "its median is {median}, not `measured` ({measured}): `measured` is the median over the environments"
                    ),
                ));
            }
        }
        match (measured_in_file, case.measured) {
            (true, None) => {
                return Err((
                    key("measured"),
                    format!("is required in a {} family ({})", header.kind.name(), header.unit),
                ));
            }
            (false, Some(_)) => {
                return Err((
                    key("measured"),
                    format!("is read from the {} data, not written in the case", header.kind.name()),
                ));
            }
            _ => {}
        }
        if (measured_in_file || header.kind == Kind::Layer)
            && case.derivation.as_deref().is_none_or(|d| d.trim().is_empty())
        {
            return Err((key("derivation"), "is required: how the measured value was derived".into()));
        }
        let required: &[(&str, bool)] = match header.kind {
            Kind::Iteration | Kind::Scaling | Kind::Memory => &[],
            Kind::NcclTests => &[("log", case.log.is_some()), ("collective", case.collective.is_some())],
            Kind::Deepbench => &[
                ("table", case.table.is_some()),
                ("device", case.device.is_some()),
                ("precision", case.precision.is_some()),
                ("operation", case.operation.is_some()),
            ],
            Kind::Replay => &[("traces", !case.traces.is_empty())],
            Kind::Layer => &[
                ("layer", case.layer.is_some()),
                ("forward", case.forward.is_some()),
                ("backward", case.backward.is_some()),
            ],
        };
        for (name, present) in required {
            if !present {
                return Err((key(name), format!("is required in a {} family", header.kind.name())));
            }
        }
        if case.layer == Some(0) {
            return Err((key("layer"), "0: the block timed needs one before it (use 1 or more)".into()));
        }
        if header.kind == Kind::Scaling && case.baseline.is_none() && case.pending.is_none() {
            return Err((
                key("baseline"),
                "is required in a scaling family: the keys that make the baseline run".into(),
            ));
        }
        if header.kind == Kind::Iteration
            && header.unit == "s/epoch"
            && case.iterations_per_epoch.is_none()
            && case.pending.is_none()
        {
            return Err((
                key("iterations-per-epoch"),
                "is required when the family's unit is s/epoch".into(),
            ));
        }
        if let Some(part) = &case.part {
            if header.kind != Kind::Memory {
                return Err((key("part"), format!("is for memory families, not {}", header.kind.name())));
            }
            if !MEMORY_PARTS.contains(&part.as_str()) {
                return Err((key("part"), format!("{part:?}; valid: {}", MEMORY_PARTS.join(", "))));
            }
        }
        if let Some(operation) = &case.operation
            && !["gemm", "conv"].contains(&operation.as_str())
        {
            return Err((key("operation"), format!("{operation:?}; valid: gemm, conv")));
        }
        if let Some(precision) = &case.precision
            && !["fp32", "fp16"].contains(&precision.as_str())
        {
            return Err((key("precision"), format!("{precision:?}; valid: fp32, fp16")));
        }
    }
    Ok(())
}

/// Where `shared:` paths and the suite's relative paths point, and what every case runs with.
#[derive(Debug, Clone, Default)]
pub struct Paths {
    /// The shared data folder (`../shared/data` beside the checkout).
    pub shared: PathBuf,
    /// Compute profiles applied to every scenario case on their device type (`parasim
    /// validate --profile`): (the profile's device, its name as `compute.profile` takes it,
    /// an absolute path for a file). Measures how a profile transfers to the suite; cases
    /// themselves never name one.
    pub profiles: Vec<(String, String)>,
    /// Dotted scenario keys taken out of the scenarios of the families named with each before
    /// their cases run (`parasim validate --without-fitted`): what the suite gives with
    /// parasim's defaults in place of declared fitted constants.
    pub without: Vec<(String, Vec<String>)>,
    /// Dotted scenario keys scaled by a factor in the scenarios of the families named with
    /// each (`parasim validate --scale-fitted ID=FACTOR`): how sensitive the suite is to a
    /// declared fitted constant.
    pub scale: Vec<(String, Vec<String>, f64)>,
}

impl Paths {
    /// `text`, named in the suite file `file`, as a path: `shared:x` under the shared data
    /// folder, else relative to `file`'s folder. A suite may be someone else's (`validate
    /// --suite-dir`), so what it names must stay inside its own tree: absolute paths are
    /// refused, `shared:` paths may not climb out of the shared folder (`..`), and relative
    /// paths may climb (`..`) only within the suite's root ([`suite_root`]). The check is on the
    /// path as written: a symbolic link inside the suite's tree is followed.
    pub fn resolve(&self, text: &str, file: &Path) -> Result<PathBuf, String> {
        match text.strip_prefix("shared:") {
            Some(rest) => {
                let path = self.shared.join(rest);
                if !within(&self.shared, &path) {
                    return Err(format!(
                        "{text:?} leaves the shared data folder: a shared: path names a file under it, without `..` or a leading /"
                    ));
                }
                Ok(path)
            }
            None => check_within_suite(text, file.parent().unwrap_or(Path::new(".")), file),
        }
    }
}

/// `text`, a path relative to `folder`, named (directly or through a scenario file) by the
/// suite file `suite_file`: the path, or why it leaves the suite's root ([`suite_root`]).
pub fn check_within_suite(text: &str, folder: &Path, suite_file: &Path) -> Result<PathBuf, String> {
    let root = suite_root(suite_file.parent().unwrap_or(Path::new(".")));
    let path = folder.join(text);
    if !within(root, &path) {
        let root = if root.as_os_str().is_empty() { Path::new(".") } else { root };
        return Err(format!(
            "{text:?} leaves the suite's folder {}: a suite names files under its root, relative and without climbing out of it with `..` (write shared:PATH for the shared data)",
            root.display()
        ));
    }
    Ok(path)
}

/// The root a suite in `folder` may name files under: the checkout when the suite is laid out
/// as the checkout's (`ROOT/data/validation`, whose files name `../models/...` and
/// `../../scenarios/...`), else the suite's folder itself.
pub fn suite_root(folder: &Path) -> &Path {
    if folder.ends_with("data/validation")
        && let Some(root) = folder.parent().and_then(Path::parent)
    {
        return root;
    }
    folder
}

/// `path` with `.` dropped and each `..` cancelling the name before it, as written (no file
/// system access: links are not followed).
fn lexical(path: &Path) -> Vec<std::path::Component<'_>> {
    use std::path::Component;
    let mut out: Vec<Component<'_>> = Vec::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.last(), Some(Component::Normal(_))) => {
                out.pop();
            }
            Component::ParentDir if matches!(out.last(), Some(Component::RootDir | Component::Prefix(_))) => {
            }
            other => out.push(other),
        }
    }
    out
}

/// Whether `path`, as written, lies under `root`.
fn within(root: &Path, path: &Path) -> bool {
    let (root, path) = (lexical(root), lexical(path));
    path.starts_with(&root) && !path[root.len()..].contains(&std::path::Component::ParentDir)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAMILY: &str = r#"
[family]
id = "demo"
title = "A demo family"
source = "nowhere, table 1"
kind = "iteration"
unit = "s/iter"

[family.scenario.workload]
model = "resnet50"

[[case]]
id = "one"
source = "row 1"
measured = 0.5
derivation = "read off"
[case.scenario.parallelism]
data = 8
"#;

    fn parse(text: &str) -> Result<Family, CaseError> {
        parse_family(text, Path::new("data/validation/demo.toml"))
    }

    #[test]
    fn a_family_parses() {
        let family = parse(FAMILY).unwrap();
        assert_eq!(family.header.kind, Kind::Iteration);
        assert_eq!(family.case_id(&family.cases[0]), "demo/one");
    }

    #[test]
    fn mistakes_name_the_key() {
        for (change, key) in [
            (("measured = 0.5", "measured = -1.0"), "case[0].measured"),
            (("measured = 0.5", ""), "case[0].measured"),
            (("derivation = \"read off\"", ""), "case[0].derivation"),
            (("id = \"one\"", "id = \"One\""), "case[0].id"),
            (("unit = \"s/iter\"", "unit = \"ms\""), "family.unit"),
            (("kind = \"iteration\"", "kind = \"guess\""), "family.kind"),
            (("source = \"row 1\"", "source = \"row 1\"\nmeasurd = 3"), "case[0]"),
        ] {
            let error = parse(&FAMILY.replace(change.0, change.1)).unwrap_err().to_string();
            assert!(error.contains("demo.toml") && error.contains(key), "{change:?}: {error}");
        }
        let twice =
            format!("{FAMILY}\n[[case]]\nid = \"one\"\nsource = \"r\"\nmeasured = 1.0\nderivation = \"d\"\n");
        assert!(parse(&twice).unwrap_err().to_string().contains("twice"));
        let nccl = FAMILY.replace("kind = \"iteration\"", "kind = \"nccl-tests\"").replace("s/iter", "s");
        assert!(parse(&nccl).unwrap_err().to_string().contains("read from the nccl-tests data"));
    }

    #[test]
    fn predictions_parse_and_their_mistakes_name_the_key() {
        let one = "\n[[case.prediction]]\nmodel = \"oracle\"\nvalue = 0.4\nsource = \"Table 8\"\n";
        let family = parse(&format!("{FAMILY}{one}")).unwrap();
        assert_eq!(family.cases[0].predictions.len(), 1);
        assert_eq!(family.cases[0].predictions[0].value, 0.4);
        for (text, key, says) in [
            (one.replace("0.4", "-2.0"), "case[0].prediction[0].value", "positive"),
            (one.replace("Table 8", " "), "case[0].prediction[0].source", "must say"),
            (format!("{one}{one}"), "case[0].prediction[1].model", "twice"),
            (one.replace("value", "valu"), "case[0].prediction[0]", "valu"),
        ] {
            let error = parse(&format!("{FAMILY}{text}")).unwrap_err().to_string();
            assert!(error.contains("demo.toml") && error.contains(key) && error.contains(says), "{error}");
        }
    }

    #[test]
    fn measured_in_must_have_measured_as_its_median() {
        let two = FAMILY.replace("measured = 0.5", "measured = 0.5\nmeasured-in = { dev = 0.4, lts = 0.6 }");
        let family = parse(&two).unwrap();
        assert_eq!(family.cases[0].measured_in.len(), 2);
        for (change, says) in [
            ("{ dev = 0.4, lts = 0.5 }", "its median is 0.45"),
            ("{ dev = 0.4, lts = -0.6 }", "must be a positive number"),
            ("{ \"\" = 0.5 }", "needs a name"),
        ] {
            let text = FAMILY.replace("measured = 0.5", &format!("measured = 0.5\nmeasured-in = {change}"));
            let error = parse(&text).unwrap_err().to_string();
            assert!(error.contains("case[0].measured-in") && error.contains(says), "{change}: {error}");
        }
    }

    const LAYER: &str = r#"
[family]
id = "demo"
title = "A demo family"
source = "nowhere, table 4"
kind = "layer"
unit = "ms"

[[case]]
id = "one"
source = "row 1"
layer = 3
forward = 7.7
backward = 11.9
derivation = "read off"
"#;

    #[test]
    fn a_layer_family_needs_its_block_and_both_times() {
        let family = parse(LAYER).unwrap();
        assert_eq!(family.header.kind, Kind::Layer);
        assert_eq!((family.cases[0].forward, family.cases[0].backward), (Some(7.7), Some(11.9)));
        for (change, key, says) in [
            (("layer = 3", ""), "case[0].layer", "required"),
            (("layer = 3", "layer = 0"), "case[0].layer", "one before it"),
            (("forward = 7.7", ""), "case[0].forward", "required"),
            (("backward = 11.9", "backward = -2.0"), "case[0].backward", "positive"),
            (("derivation = \"read off\"", ""), "case[0].derivation", "required"),
            (("unit = \"ms\"", "unit = \"s\""), "family.unit", "valid: ms"),
            (
                ("derivation = \"read off\"", "derivation = \"d\"\nmeasured = 19.6"),
                "case[0].measured",
                "not written",
            ),
        ] {
            let error = parse(&LAYER.replace(change.0, change.1)).unwrap_err().to_string();
            assert!(error.contains(key) && error.contains(says), "{change:?}: {error}");
        }
    }

    #[test]
    fn a_memory_family_compares_bytes_and_names_its_part() {
        let memory = FAMILY.replace("kind = \"iteration\"", "kind = \"memory\"").replace("s/iter", "GiB");
        let family = parse(
            &memory.replace("derivation = \"read off\"", "derivation = \"read off\"\npart = \"activations\""),
        )
        .unwrap();
        assert_eq!(family.header.kind, Kind::Memory);
        assert_eq!(family.cases[0].part.as_deref(), Some("activations"));
        assert!(parse(&memory).unwrap().cases[0].part.is_none(), "allocated by default");
        for (text, key, says) in [
            (memory.replace("GiB", "s"), "family.unit", "valid: GB, GiB"),
            (memory.replace("measured = 0.5", ""), "case[0].measured", "required"),
            (
                memory.replace("derivation = \"read off\"", "derivation = \"d\"\npart = \"weights\""),
                "case[0].part",
                "valid: allocated, activations, model-states",
            ),
            (
                FAMILY.replace("derivation = \"read off\"", "derivation = \"d\"\npart = \"activations\""),
                "case[0].part",
                "memory families",
            ),
        ] {
            let error = parse(&text).unwrap_err().to_string();
            assert!(error.contains(key) && error.contains(says), "{error}");
        }
    }

    #[test]
    fn shared_paths_resolve_under_the_shared_folder() {
        let paths = Paths { shared: PathBuf::from("/s/data"), ..Paths::default() };
        let file = Path::new("/repo/data/validation/x.toml");
        assert_eq!(paths.resolve("shared:a/b.log", file), Ok(PathBuf::from("/s/data/a/b.log")));
        assert_eq!(
            paths.resolve("../../scenarios/y.toml", file),
            Ok(PathBuf::from("/repo/data/validation/../../scenarios/y.toml"))
        );
    }

    /// A suite cannot name files outside its tree (issue 38: shared suites are someone
    /// else's): absolute paths, `..` out of the checkout or out of a suite folder elsewhere,
    /// and `shared:` paths that climb out are refused, naming the path.
    #[test]
    fn suites_cannot_name_files_outside_their_tree() {
        let paths = Paths { shared: PathBuf::from("/s/data"), ..Paths::default() };
        let checkout = Path::new("/repo/data/validation/x.toml");
        let elsewhere = Path::new("/home/u/suite/x.toml");
        let relative = Path::new("data/validation/x.toml");
        for (text, file, needle) in [
            ("/etc/passwd", checkout, "leaves the suite's folder /repo"),
            ("../../../etc/passwd", checkout, "leaves the suite's folder /repo"),
            ("../models/a.toml", elsewhere, "leaves the suite's folder /home/u/suite"),
            ("models/../../x.toml", elsewhere, "leaves the suite's folder"),
            ("shared:../secret", checkout, "leaves the shared data folder"),
            ("shared:/etc/passwd", checkout, "leaves the shared data folder"),
            ("../../../x.toml", relative, "leaves the suite's folder ."),
        ] {
            let error = paths.resolve(text, file).expect_err(text);
            assert!(error.contains(needle) && error.contains(text), "{text}: {error}");
        }
        assert!(paths.resolve("models/a.toml", elsewhere).is_ok());
        assert!(paths.resolve("../../scenarios/a.toml", checkout).is_ok());
        assert!(paths.resolve("../models/a.toml", relative).is_ok());
    }
}
