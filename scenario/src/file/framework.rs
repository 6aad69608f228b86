//! `workload.framework`: the training framework a scenario runs, and the settings it decides.
//!
//! The catalog is `data/frameworks.toml`, compiled in: each framework names the scenario keys
//! its code or documentation fixes (PyTorch DDP's 25 MiB buckets, Megatron-LM's optimizer
//! passes, Chainer's in-step input copy, ...), each with its source. Before a scenario table
//! is read, [`apply`] writes the framework's settings into it where the scenario leaves the key
//! out, so the precedence is: a key the scenario (or an override) sets, then the framework's
//! setting, then parasim's built-in default. A setting the scenario's own rules would refuse
//! for this scenario (a filter-parallel backward without a filter split) does not apply, and
//! [`FrameworkUse`] says why.
//!
//! ```
//! let table: toml::Table = toml::from_str(scenario::QUICKSTART)?;
//! let mut table = table;
//! let _ = scenario::Override::new("workload.framework", "megatron-lm").apply(&mut table);
//! let used = scenario::framework::apply(&mut table)?.expect("a framework is named");
//! assert_eq!(used.name, "megatron-lm");
//! // The scenario's own optimizer wins; the framework's passes apply.
//! assert!(used.explicit.iter().any(|setting| setting.key == "workload.optimizer"));
//! assert!(used.implied.iter().any(|setting| setting.key == "compute.optimizer-passes"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::overrides::{InlineValue, Override, get_dotted};

/// The catalog's text (`data/frameworks.toml`).
const CATALOG_TOML: &str = include_str!("../../../data/frameworks.toml");

/// The scenario key that names the framework.
pub const KEY: &str = "workload.framework";

/// One framework of the catalog.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Framework {
    /// The name `workload.framework` takes.
    pub name: String,
    /// What it is, in words.
    pub title: String,
    /// The settings it decides, in the catalog's order.
    #[serde(rename = "setting", default)]
    pub settings: Vec<Setting>,
}

/// One setting a framework decides: a scenario key, its value, and where that comes from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setting {
    /// The dotted scenario key (`parallelism.bucket-size`).
    pub key: String,
    /// Its value, as a scenario would write it.
    pub value: toml::Value,
    /// The framework's code (repository @ commit : path) or documentation (URL) that fixes it.
    pub source: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFile {
    framework: Vec<Framework>,
}

/// Every framework of the built-in catalog, in the catalog's order.
pub fn catalog() -> &'static [Framework] {
    static CATALOG: OnceLock<Vec<Framework>> = OnceLock::new();
    CATALOG.get_or_init(|| match toml::from_str::<CatalogFile>(CATALOG_TOML) {
        Ok(file) => file.framework,
        // The catalog is compiled in and parsed by a test: this is a build defect.
        Err(error) => panic!("data/frameworks.toml does not parse: {error}"),
    })
}

/// The framework named `name`, or a message naming the valid names.
pub fn by_name(name: &str) -> Result<&'static Framework, String> {
    catalog()
        .iter()
        .find(|framework| framework.name == name)
        .ok_or_else(|| format!("unknown framework {name:?}; valid: {}", names().join(", ")))
}

/// One of a framework's settings, as it went for one scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SettingUse {
    /// The dotted scenario key.
    pub key: String,
    /// The framework's value, as TOML writes it.
    pub value: String,
    /// Where the value comes from.
    pub source: String,
    /// Why it does not apply (only for [`FrameworkUse::not_applied`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a scenario's framework decided: the settings it implied, those the scenario set
/// itself, and those that do not apply to it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FrameworkUse {
    /// The framework's name.
    pub name: String,
    /// What it is.
    pub title: String,
    /// Settings written into the scenario (it left their keys out).
    pub implied: Vec<SettingUse>,
    /// Settings whose key the scenario sets itself: its value wins.
    pub explicit: Vec<SettingUse>,
    /// Settings the scenario's rules refuse for this scenario, with the reason.
    pub not_applied: Vec<SettingUse>,
}

/// Writes the settings of the framework `table` names (`workload.framework`) into `table`
/// where it leaves their keys out; `None` if it names none. The error is the message for
/// `workload.framework` (an unknown name, or a value that is not a string).
pub fn apply(table: &mut toml::Table) -> Result<Option<FrameworkUse>, String> {
    let Some(value) = get_dotted(table, KEY) else { return Ok(None) };
    let Some(name) = value.as_str() else {
        return Err(format!(
            "is {}; give a framework's name as a string (valid: {})",
            InlineValue(value),
            names().join(", ")
        ));
    };
    let framework = by_name(name)?;
    let mut used = FrameworkUse {
        name: framework.name.clone(),
        title: framework.title.clone(),
        implied: Vec::new(),
        explicit: Vec::new(),
        not_applied: Vec::new(),
    };
    for setting in &framework.settings {
        let record = |reason: Option<String>| SettingUse {
            key: setting.key.clone(),
            value: InlineValue(&setting.value).to_string(),
            source: setting.source.clone(),
            reason,
        };
        if get_dotted(table, &setting.key).is_some() {
            used.explicit.push(record(None));
            continue;
        }
        if let Err(reason) = applies(setting, table) {
            used.not_applied.push(record(Some(reason)));
            continue;
        }
        // A non-table on the key's path is the scenario's error, named when it is read.
        if Override::new(setting.key.as_str(), setting.value.clone()).apply(table).is_err() {
            used.not_applied.push(record(Some("the scenario has a value where its table would be".into())));
            continue;
        }
        if setting.key.starts_with("workload.input.") && get_dotted(table, "workload.input.loader").is_none()
        {
            // A copy without a loader: the loader is not modelled (`loader = "none"`).
            let _ = Override::new("workload.input.loader", "none").apply(table);
        }
        used.implied.push(record(None));
    }
    Ok(Some(used))
}

/// The catalog's names, quoted, for messages.
fn names() -> Vec<String> {
    catalog().iter().map(|f| format!("{:?}", f.name)).collect()
}

/// The integer at `key` in `table`, or `default` if it is absent (or not an integer: the
/// scenario names that error when it is read).
fn integer(table: &toml::Table, key: &str, default: i64) -> i64 {
    get_dotted(table, key).and_then(toml::Value::as_integer).unwrap_or(default)
}

/// Whether `setting` applies to the scenario `table`: the scenario format's own rules for the
/// key, which a framework's default must not break. `Err` says why it does not.
fn applies(setting: &Setting, table: &toml::Table) -> Result<(), String> {
    let filter = integer(table, "parallelism.filter", 1);
    let cnn = filter * integer(table, "parallelism.channel", 1) * integer(table, "parallelism.spatial", 1);
    match setting.key.as_str() {
        "parallelism.filter-backward" if filter < 2 => {
            Err(format!("no filter split (parallelism.filter = {filter})"))
        }
        "parallelism.spatial-halos" if integer(table, "parallelism.spatial", 1) < 2 => {
            Err("no spatial split (parallelism.spatial = 1)".into())
        }
        "parallelism.cnn-transport" if cnn < 2 => {
            Err("no filter, channel or spatial split to carry".into())
        }
        "parallelism.cnn-transport" if get_dotted(table, "parallelism.cnn-staging-rate").is_none() => Err(
            "the scenario gives no parallelism.cnn-staging-rate (a platform's measured rate, not the framework's)"
                .into(),
        ),
        "parallelism.zero-implementation" if setting.value.as_str() != Some("fsdp") => {
            let zero = integer(table, "parallelism.zero", 0);
            let model_parallel = ["tensor", "pipeline", "context", "expert"]
                .iter()
                .map(|axis| integer(table, &format!("parallelism.{axis}"), 1))
                .product::<i64>()
                * cnn;
            if zero != 3 || model_parallel != 1 || get_dotted(table, "workload.offload").is_some() {
                Err("modelled for ZeRO-3 (parallelism.zero = 3) with data parallelism only".into())
            } else {
                Ok(())
            }
        }
        "compute.cuda-graphs"
            if get_dotted(table, "compute.host-synchronous").and_then(toml::Value::as_bool) == Some(true) =>
        {
            Err("the scenario's host waits for every kernel (compute.host-synchronous = true)".into())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scenario;
    use std::path::Path;

    fn quickstart() -> toml::Table {
        toml::from_str(crate::QUICKSTART).unwrap()
    }

    #[test]
    fn every_setting_names_a_source_and_the_names_are_unique() {
        assert!(catalog().len() >= 10);
        for (i, framework) in catalog().iter().enumerate() {
            assert!(!framework.title.trim().is_empty(), "{}", framework.name);
            assert!(!framework.settings.is_empty(), "{} decides nothing", framework.name);
            assert!(catalog()[..i].iter().all(|other| other.name != framework.name), "{}", framework.name);
            for setting in &framework.settings {
                assert!(setting.source.trim().len() > 10, "{} {}: no source", framework.name, setting.key);
                let count = framework.settings.iter().filter(|s| s.key == setting.key).count();
                assert_eq!(count, 1, "{} sets {} twice", framework.name, setting.key);
            }
        }
    }

    /// Keys that make the scenario one where a setting of `key` applies.
    fn context_for(key: &str) -> Vec<Override> {
        match key {
            "parallelism.filter-backward" | "parallelism.cnn-transport" => vec![
                Override::new("parallelism.filter", 2),
                Override::new("parallelism.data", 32),
                Override::new("parallelism.cnn-staging-rate", "1.68 GB/s"),
            ],
            "parallelism.zero-implementation" => vec![Override::new("parallelism.zero", 3)],
            _ => Vec::new(),
        }
    }

    #[test]
    fn every_key_a_framework_sets_is_a_scenario_key_with_a_valid_value() {
        // Each setting alone, written into a scenario where its rules hold, must read and
        // validate: the key exists in the scenario format and the value is one it accepts.
        let mut base = quickstart();
        // A batch every split can take (batch-per-device is for pure data parallelism).
        let workload = base.get_mut("workload").and_then(toml::Value::as_table_mut).unwrap();
        workload.remove("batch-per-device");
        workload.insert("global-batch".into(), toml::Value::Integer(2048));
        for framework in catalog() {
            for setting in &framework.settings {
                let mut context = base.clone();
                let changes = context_for(&setting.key);
                crate::apply(&mut context, &changes).unwrap();
                assert_eq!(applies(setting, &context), Ok(()), "{} {}", framework.name, setting.key);
                let mut changes = changes;
                changes.push(Override::new(setting.key.as_str(), setting.value.clone()));
                if setting.key == "parallelism.filter-backward" {
                    // The staging rate belongs to an MPI transport only.
                    changes.retain(|change| change.key != "parallelism.cnn-staging-rate");
                    changes.push(Override::new("parallelism.cnn-transport", "device"));
                }
                if setting.key.starts_with("workload.input.") {
                    changes.push(Override::new("workload.input.loader", "none"));
                }
                let scenario = Scenario::from_table_with(
                    &base,
                    &changes,
                    Path::new("frameworks.toml"),
                    &Default::default(),
                );
                assert!(
                    scenario.is_ok(),
                    "{} {} = {}: {}",
                    framework.name,
                    setting.key,
                    setting.value,
                    scenario.unwrap_err()
                );
            }
        }
    }

    #[test]
    fn an_unknown_framework_names_the_valid_ones() {
        let mut table = quickstart();
        let change = Override::new(KEY, "pytorch-dpp");
        let error = Scenario::from_table_with(
            &table,
            std::slice::from_ref(&change),
            Path::new("bad.toml"),
            &Default::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("key `workload.framework`"), "{error}");
        assert!(
            error.contains("unknown framework \"pytorch-dpp\"; valid: \"pytorch\", \"pytorch-ddp\""),
            "{error}"
        );
        change.apply(&mut table).unwrap();
        let error = Scenario::from_table(&table, Path::new("bad.toml")).unwrap_err().to_string();
        assert!(error.starts_with("bad.toml: key `workload.framework`: unknown framework"), "{error}");
    }

    #[test]
    fn an_explicit_key_beats_the_framework_which_beats_the_built_in_default() {
        let file = Path::new("quickstart.toml");
        let mut table = quickstart();
        // The quickstart sets 25 MiB / 1 MiB buckets itself; leave them to the defaults.
        let parallelism = table.get_mut("parallelism").and_then(|p| p.as_table_mut()).unwrap();
        parallelism.remove("bucket-size");
        parallelism.remove("first-bucket-size");
        let built_in = Scenario::from_table(&table, file).unwrap();
        assert_eq!(built_in.parallelism.bucket_cap, sim_core::units::Bytes(25 << 20));
        assert!(built_in.framework.is_none());

        let horovod = vec![Override::new(KEY, "horovod-pytorch")];
        let framework = Scenario::from_table_with(&table, &horovod, file, &Default::default()).unwrap();
        assert_eq!(framework.parallelism.bucket_cap, sim_core::units::Bytes(64 << 20));
        assert_eq!(framework.parallelism.first_bucket_cap, sim_core::units::Bytes(64 << 20));
        let used = framework.framework.as_ref().unwrap();
        assert_eq!(used.name, "horovod-pytorch");
        assert!(used.implied.iter().any(|s| s.key == "parallelism.bucket-size" && s.value == "\"64 MiB\""));

        let mut explicit = horovod.clone();
        explicit.push(Override::new("parallelism.bucket-size", "8 MiB"));
        let scenario = Scenario::from_table_with(&table, &explicit, file, &Default::default()).unwrap();
        assert_eq!(scenario.parallelism.bucket_cap, sim_core::units::Bytes(8 << 20));
        assert_eq!(scenario.parallelism.first_bucket_cap, sim_core::units::Bytes(64 << 20));
        let used = scenario.framework.unwrap();
        assert!(used.explicit.iter().any(|s| s.key == "parallelism.bucket-size"));
        assert!(used.implied.iter().all(|s| s.key != "parallelism.bucket-size"));
    }

    #[test]
    fn a_setting_the_scenario_cannot_take_does_not_apply() {
        // ChainerMN's filter backward and MPI transport on a plain data-parallel job.
        let changes = vec![Override::new(KEY, "chainermn")];
        let scenario =
            Scenario::from_table_with(&quickstart(), &changes, Path::new("q.toml"), &Default::default())
                .unwrap();
        let used = scenario.framework.unwrap();
        let skipped: Vec<&str> = used.not_applied.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(skipped, ["parallelism.filter-backward", "parallelism.cnn-transport"]);
        assert!(used.not_applied.iter().all(|s| s.reason.is_some()));
        // The input copy applies without a loader.
        assert!(used.implied.iter().any(|s| s.key == "workload.input.copy"));
        assert_eq!(scenario.input.unwrap().copy, workloads::input::InputCopy::ComputeStream);
        // DeepSpeed's ZeRO-3 model on a job without ZeRO-3.
        let changes = vec![Override::new(KEY, "deepspeed")];
        let scenario =
            Scenario::from_table_with(&quickstart(), &changes, Path::new("q.toml"), &Default::default())
                .unwrap();
        assert_eq!(scenario.framework.unwrap().not_applied[0].key, "parallelism.zero-implementation");
    }

    #[test]
    fn every_shipped_scenario_takes_every_framework() {
        // No framework default may turn a valid scenario into an error.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let mut files = Vec::new();
        for entry in fs_err::read_dir(&root).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                files.push(path);
            }
        }
        files.sort();
        for path in files {
            let text = fs_err::read_to_string(&path).unwrap();
            let Ok(table) = toml::from_str::<toml::Table>(&text) else { continue };
            if Scenario::from_table(&table, &path).is_err() {
                continue; // not a runnable scenario (a cluster alone, an example of an error)
            }
            for framework in catalog() {
                let changes = vec![Override::new(KEY, framework.name.as_str())];
                let result = Scenario::from_table_with(&table, &changes, &path, &Default::default());
                assert!(
                    result.is_ok(),
                    "{} with {}: {}",
                    path.display(),
                    framework.name,
                    result.unwrap_err()
                );
            }
        }
    }
}
