//! Parameter sweeps (`parasim sweep`, docs/sweep.md): a base scenario, axes over any scenario
//! key (lists, ranges by step or factor), a zipped group of axes that advance together,
//! derived values computed from other keys, and filters that skip combinations with a reason.
//!
//! Configurations are numbered `0..count` in a fixed order: the cartesian product of the axes in
//! file order, last axis fastest, then the zipped group fastest of all. [`Sweep::configuration`]
//! builds the scenario of one number without building the others, and [`Sweep::run`] simulates
//! it into a [`Row`] whose cells are a pure function of the sweep file: the same number gives
//! the same row on any machine, in any shard, at any thread count.
//!
//! ```
//! use std::path::Path;
//! use scenario::sweep::{Status, Sweep};
//!
//! let text = format!(
//!     "{}\n[axes]\n\"cluster.nodes\" = [1, 2]\n[derived]\n\"parallelism.data\" = \"gpus\"\n",
//!     scenario::QUICKSTART.replace("[cluster", "[base.cluster")
//!         .replace("[workload]", "[base.workload]").replace("[parallelism]", "[base.parallelism]")
//!         .replace("[simulation]", "[base.simulation]"),
//! );
//! let sweep = Sweep::parse(&text, Path::new("scaling.toml"))?;
//! assert_eq!(sweep.count(), 2);
//! let row = sweep.run(1);
//! assert_eq!(row.status, Status::Ok);
//! assert_eq!(row.values[1], serde_json::json!(16)); // parallelism.data = 2 nodes x 8 GPUs
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod expr;
pub mod output;

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::simulation::{SimulationError, Summary, simulate};
use crate::{
    InlineValue, Override, Scenario, ScenarioError, ValidationCache, dotted_leaves, get_dotted, merge,
    numeric_defaults,
};
use expr::{Expression, Value};
use workloads::memory::{Margin, MemoryError};

/// The most configurations one sweep may have: past it, a typo in a range (a step of 1 where 1024
/// was meant) would run for days.
pub const MAX_CONFIGURATIONS: u64 = 1_000_000;

/// A sweep file could not be read or is not valid.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// A file could not be read.
    #[error("{path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The sweep file is not valid TOML, or a key is wrong.
    #[error("{file}: key `{key}`: {message}")]
    Key {
        /// The sweep file.
        file: PathBuf,
        /// The key at fault, e.g. `axes."cluster.nodes"` or `filter[1].when`.
        key: String,
        /// What is wrong and what would be valid.
        message: String,
    },
    /// The sweep file is not valid TOML.
    #[error("{file}: {message}")]
    Syntax {
        /// The sweep file.
        file: PathBuf,
        /// The parser's message with line and column.
        message: String,
    },
    /// Too many configurations.
    #[error(
        "{file}: {count} configurations ({product}); a sweep runs at most {MAX_CONFIGURATIONS}: shorten an axis or split the sweep"
    )]
    TooMany {
        /// The sweep file.
        file: PathBuf,
        /// How many (or "more than 18446744073709551615").
        count: String,
        /// The axes' lengths, e.g. `cluster.nodes 4 x workload.micro-batch 1000000`.
        product: String,
    },
}

/// One axis: a scenario key and the values it takes, in order.
#[derive(Debug, Clone)]
pub struct Axis {
    /// The dotted scenario key.
    pub key: String,
    /// Its values.
    pub values: Vec<toml::Value>,
}

/// A value computed from other keys.
#[derive(Debug, Clone)]
pub struct Derived {
    /// The dotted scenario key it sets.
    pub key: String,
    /// The expression.
    pub expression: Expression,
}

/// A condition that skips a configuration.
#[derive(Debug, Clone)]
pub struct Filter {
    /// Skip when this is true.
    pub when: Expression,
    /// Why, recorded in the skipped configuration's row.
    pub reason: String,
    /// It reads a derived key, so it is checked after the derived values are computed.
    after_derived: bool,
}

/// What became of one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Simulated.
    Ok,
    /// Its scenario is not valid, or the simulation failed.
    Failed,
    /// A filter skipped it.
    Skipped,
    /// It needs more memory than the device has.
    DoesNotFit,
}

impl Status {
    /// The name in the output's `status` column.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "failed",
            Status::Skipped => "skipped",
            Status::DoesNotFit => "does-not-fit",
        }
    }
}

/// One configuration's results: the cells of one output row.
#[derive(Debug, Clone)]
pub struct Row {
    /// Its number.
    pub index: u64,
    /// The value of each of [`Sweep::value_columns`] (null where a derived value failed).
    pub values: Vec<serde_json::Value>,
    /// The value of each of [`metric_columns`] (null where the simulation did not run).
    pub metrics: Vec<serde_json::Value>,
    /// What became of it.
    pub status: Status,
    /// The error, the reason it does not fit, or the filter's reason; empty when ok.
    pub error: String,
}

/// One configuration's scenario, before simulation.
#[derive(Debug, Clone)]
pub struct Configuration {
    /// Its number.
    pub index: u64,
    /// The value of each of [`Sweep::value_columns`].
    pub values: Vec<serde_json::Value>,
    /// The scenario as a table, or why there is none.
    pub prepared: Result<toml::Table, (Status, String)>,
}

/// A validated sweep.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// The sweep file.
    pub file: PathBuf,
    /// The base scenario.
    base: toml::Table,
    /// The file relative paths in the base scenario resolve against.
    anchor: PathBuf,
    /// Axes in file order.
    pub axes: Vec<Axis>,
    /// The zipped axes (equal lengths).
    pub zip: Vec<Axis>,
    /// Derived values in file order.
    pub derived: Vec<Derived>,
    /// Filters in file order.
    pub filters: Vec<Filter>,
    count: u64,
    fingerprint: u64,
    /// The catalog names of the base's node-group devices, in order of first appearance
    /// (empty without `[[cluster.node-groups]]`): each has its `devices.NAME.*` columns.
    device_types: Vec<String>,
    /// What validating the configurations derives expensively (the model, the cluster),
    /// shared by them.
    cache: std::sync::Arc<ValidationCache>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SweepSpec {
    base: toml::Value,
    #[serde(default)]
    axes: toml::Table,
    #[serde(default)]
    zip: toml::Table,
    #[serde(default)]
    derived: toml::Table,
    #[serde(default)]
    filter: Vec<FilterSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterSpec {
    when: String,
    reason: String,
}

impl Sweep {
    /// Reads and validates the sweep file at `path` (and the base scenario file it names).
    pub fn load(path: &Path) -> Result<Sweep, SweepError> {
        let text = fs_err::read_to_string(path)
            .map_err(|error| SweepError::Read { path: path.to_path_buf(), message: error.to_string() })?;
        Sweep::parse(&text, path)
    }

    /// Validates sweep `text`; `file` names it in messages and anchors a relative `base`.
    pub fn parse(text: &str, file: &Path) -> Result<Sweep, SweepError> {
        let key_error = |key: &str, message: String| SweepError::Key {
            file: file.to_path_buf(),
            key: key.to_string(),
            message,
        };
        let deserializer = toml::Deserializer::parse(text)
            .map_err(|error| SweepError::Syntax { file: file.to_path_buf(), message: error.to_string() })?;
        let spec: SweepSpec = serde_path_to_error::deserialize(deserializer).map_err(|error| {
            let key = error.path().to_string();
            let message = error.into_inner().to_string();
            let key = crate::missing_top_level_table(&key, &message).unwrap_or(key);
            key_error(&key, message.trim().to_string())
        })?;
        let order = key_order(text);
        let (base, anchor) = match spec.base {
            toml::Value::String(relative) => {
                let path = file.parent().unwrap_or(Path::new("")).join(&relative);
                let base_text = fs_err::read_to_string(&path)
                    .map_err(|error| key_error("base", format!("reading the base scenario: {error}")))?;
                let table: toml::Table = toml::from_str(&base_text)
                    .map_err(|error| key_error("base", format!("{}: {error}", path.display())))?;
                (table, path)
            }
            toml::Value::Table(table) => (table, file.to_path_buf()),
            other => {
                return Err(key_error(
                    "base",
                    format!(
                        "is {}; write a scenario path (base = \"quickstart.toml\") or a [base] table",
                        other.type_str()
                    ),
                ));
            }
        };
        let axes =
            read_axes(&spec.axes, "axes", &order).map_err(|(key, message)| key_error(&key, message))?;
        let zip = read_axes(&spec.zip, "zip", &order).map_err(|(key, message)| key_error(&key, message))?;
        if let Some(first) = zip.first()
            && let Some(other) = zip.iter().find(|axis| axis.values.len() != first.values.len())
        {
            return Err(key_error(
                &format!("zip.\"{}\"", other.key),
                format!(
                    "has {} values but `{}` has {}: zipped axes advance together, so they need equal lengths",
                    other.values.len(),
                    first.key,
                    first.values.len()
                ),
            ));
        }
        let mut derived_entries: Vec<(String, &toml::Value)> = flatten(&spec.derived, "");
        derived_entries.sort_by_key(|(key, _)| order.get("derived", key));
        let mut seen: Vec<(&str, String)> = Vec::new();
        for (table, key) in axes
            .iter()
            .map(|a| ("axes", &a.key))
            .chain(zip.iter().map(|a| ("zip", &a.key)))
            .chain(derived_entries.iter().map(|(k, _)| ("derived", k)))
        {
            if let Some((other, _)) = seen.iter().find(|(_, k)| k == key) {
                return Err(key_error(
                    &format!("{table}.\"{key}\""),
                    format!("is also set in [{other}]: set a key in one place"),
                ));
            }
            seen.push((table, key.clone()));
        }

        // Names in expressions: a dotted key the scenario has (its own, a default, or set by the
        // sweep), `gpus`, or the last part of exactly one such key.
        let mut known: Vec<String> = {
            let mut with_defaults = numeric_defaults();
            merge(&mut with_defaults, &base);
            dotted_leaves(&with_defaults).into_iter().map(|(key, _)| key).collect()
        };
        known.extend(seen.iter().map(|(_, key)| key.clone()));
        known.sort();
        known.dedup();
        let resolve = |name: &str| -> Result<String, String> {
            if known.iter().any(|k| k == name) {
                return Ok(name.to_string());
            }
            if name == "gpus" {
                return Ok(GPUS.to_string());
            }
            let matching: Vec<&String> =
                known.iter().filter(|k| k.rsplit('.').next() == Some(name)).collect();
            match matching.as_slice() {
                [one] => Ok((*one).clone()),
                [] => Err(format!(
                    "`{name}` is not a key of the scenario or the sweep (write a dotted key such as cluster.nodes, its last part, or gpus)"
                )),
                many => Err(format!(
                    "`{name}` is ambiguous: {}; write the dotted key",
                    many.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
                )),
            }
        };
        let mut derived = Vec::new();
        for (key, value) in &derived_entries {
            let name = format!("derived.\"{key}\"");
            let text = value.as_str().ok_or_else(|| {
                key_error(
                    &name,
                    format!(
                        "is {}; write an expression in a string, e.g. \"gpus / tensor\"",
                        value.type_str()
                    ),
                )
            })?;
            let mut expression = Expression::parse(text).map_err(|e| key_error(&name, e.to_string()))?;
            expression.resolve(&resolve).map_err(|e| key_error(&name, e.to_string()))?;
            derived.push(Derived { key: key.clone(), expression });
        }
        let mut filters = Vec::new();
        for (i, filter) in spec.filter.into_iter().enumerate() {
            let mut when = Expression::parse(&filter.when)
                .map_err(|e| key_error(&format!("filter[{i}].when"), e.to_string()))?;
            when.resolve(&resolve).map_err(|e| key_error(&format!("filter[{i}].when"), e.to_string()))?;
            if !when.may_be_boolean() {
                return Err(key_error(
                    &format!("filter[{i}].when"),
                    format!(
                        "{:?} gives a number or a string, never true or false; write a condition, e.g. \"tensor > gpus-per-node\"",
                        filter.when
                    ),
                ));
            }
            if filter.reason.trim().is_empty() {
                return Err(key_error(
                    &format!("filter[{i}].reason"),
                    "must say why the combinations are skipped".into(),
                ));
            }
            let after_derived = when.keys().iter().any(|k| derived.iter().any(|d| d.key == *k));
            filters.push(Filter { when, reason: filter.reason, after_derived });
        }

        let mut lengths: Vec<(String, u64)> =
            axes.iter().map(|a| (a.key.clone(), a.values.len() as u64)).collect();
        if let Some(first) = zip.first() {
            let names: Vec<&str> = zip.iter().map(|a| a.key.as_str()).collect();
            lengths.push((format!("zip({})", names.join(", ")), first.values.len() as u64));
        }
        let count = lengths.iter().try_fold(1u64, |product, (_, n)| product.checked_mul(*n));
        if count.is_none_or(|count| count > MAX_CONFIGURATIONS) {
            return Err(SweepError::TooMany {
                file: file.to_path_buf(),
                count: count.map_or_else(|| format!("more than {}", u64::MAX), sim_core::units::thousands),
                product: lengths.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(" x "),
            });
        }
        let count = count.unwrap_or(0);

        let device_types = device_types(&base);
        let sweep = Sweep {
            file: file.to_path_buf(),
            base,
            anchor,
            axes,
            zip,
            derived,
            filters,
            count,
            fingerprint: 0,
            device_types,
            cache: Default::default(),
        };
        sweep.check_keys()?;
        let fingerprint = output::fnv1a(sweep.canonical().as_bytes());
        Ok(Sweep { fingerprint, ..sweep })
    }

    /// Checks every axis value and derived key against the scenario format (unknown keys, wrong
    /// types) before any configuration runs.
    fn check_keys(&self) -> Result<(), SweepError> {
        let mut first = self.base.clone();
        let all = || self.axes.iter().map(|a| ("axes", a)).chain(self.zip.iter().map(|a| ("zip", a)));
        for (table, axis) in all() {
            if let Some(value) = axis.values.first() {
                Override::new(&axis.key, value.clone()).apply(&mut first).map_err(|e| SweepError::Key {
                    file: self.file.clone(),
                    key: format!("{table}.\"{}\"", axis.key),
                    message: e.to_string(),
                })?;
            }
        }
        let format_message = |error: ScenarioError| match error {
            ScenarioError::Format { key, message, .. } | ScenarioError::Invalid { key, message, .. } => {
                format!("scenario key `{key}`: {message}")
            }
            other => other.to_string(),
        };
        if let Err(error) = Scenario::check_format(&first, &self.anchor) {
            // Blame the axis or derived value that sets the key at fault, else the base.
            let at_fault = match &error {
                ScenarioError::Format { key, .. } | ScenarioError::Invalid { key, .. } => all()
                    .map(|(table, axis)| (table, axis.key.as_str()))
                    .chain(self.derived.iter().map(|d| ("derived", d.key.as_str())))
                    .find(|(_, k)| {
                        k == key || key.starts_with(&format!("{k}.")) || k.starts_with(&format!("{key}."))
                    }),
                _ => None,
            };
            return Err(SweepError::Key {
                file: self.file.clone(),
                key: at_fault.map_or("base".to_string(), |(table, k)| format!("{table}.\"{k}\"")),
                message: format!("with the first value of every axis: {}", format_message(error)),
            });
        }
        for (table, axis) in all() {
            for value in &axis.values {
                let mut table_with = first.clone();
                let checked = Override::new(&axis.key, value.clone())
                    .apply(&mut table_with)
                    .map_err(|e| e.to_string())
                    .and_then(|()| Scenario::check_format(&table_with, &self.anchor).map_err(format_message));
                if let Err(message) = checked {
                    return Err(SweepError::Key {
                        file: self.file.clone(),
                        key: format!("{table}.\"{}\"", axis.key),
                        message: format!("value {}: {message}", InlineValue(value)),
                    });
                }
            }
        }
        for derived in &self.derived {
            let mut table_with = first.clone();
            let checked = Override::new(&derived.key, toml::Value::Integer(1))
                .apply(&mut table_with)
                .map_err(|e| e.to_string())
                .and_then(|()| Scenario::check_format(&table_with, &self.anchor).map_err(format_message));
            if let Err(message) = checked {
                return Err(SweepError::Key {
                    file: self.file.clone(),
                    key: format!("derived.\"{}\"", derived.key),
                    message: format!("derived values are numbers, and this key does not take one: {message}"),
                });
            }
        }
        Ok(())
    }

    /// How many configurations the sweep has (skipped ones included).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// A hash of everything that decides the rows (base scenario, axes, derived values,
    /// filters, parasim's version): shards and resumed files must share it.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    fn canonical(&self) -> String {
        let mut text = format!(
            "parasim {}\n[base]\n{}\n",
            env!("CARGO_PKG_VERSION"),
            toml::Value::Table(self.base.clone())
        );
        for (table, axes) in [("axes", &self.axes), ("zip", &self.zip)] {
            for axis in axes {
                let values: Vec<String> = axis.values.iter().map(|v| InlineValue(v).to_string()).collect();
                text += &format!("{table} {} = [{}]\n", axis.key, values.join(", "));
            }
        }
        for derived in &self.derived {
            text += &format!("derived {} = {}\n", derived.key, derived.expression.text());
        }
        for filter in &self.filters {
            text += &format!("filter {} ({})\n", filter.when.text(), filter.reason);
        }
        text
    }

    /// The columns of the configuration's own values: the axes in order, the zipped axes,
    /// the derived keys.
    pub fn value_columns(&self) -> Vec<String> {
        self.axes
            .iter()
            .chain(&self.zip)
            .map(|a| a.key.clone())
            .chain(self.derived.iter().map(|d| d.key.clone()))
            .collect()
    }

    /// The output columns of the configuration's own values: [`Sweep::value_columns`], each
    /// under [`AXIS_PREFIX`] (`axis.cluster.nodes`), so that a swept key never shares a name
    /// with a metric (`cluster.nodes` is also what `run --json` reports).
    pub fn swept_columns(&self) -> Vec<String> {
        self.value_columns().into_iter().map(|key| format!("{AXIS_PREFIX}{key}")).collect()
    }

    /// The catalog names of the devices of the base's `[[cluster.node-groups]]`, in order of
    /// first appearance; empty without node groups. An axis cannot change them (its values
    /// are numbers, strings or booleans, and the groups are an array of tables), so every
    /// configuration of the sweep has these device types.
    pub fn device_types(&self) -> &[String] {
        &self.device_types
    }

    /// This sweep's metric columns, sorted by name: [`metric_columns`], and on node groups
    /// the [`device_columns`] of each of [`Sweep::device_types`]. A sweep without node groups
    /// has exactly [`metric_columns`].
    pub fn metric_columns(&self) -> Vec<String> {
        self.metric_columns_and_kinds().into_iter().map(|(name, _)| name).collect()
    }

    /// What each of [`Sweep::metric_columns`] holds, in the same order ([`metric_kinds`]).
    pub fn metric_kinds(&self) -> Vec<output::Kind> {
        self.metric_columns_and_kinds().into_iter().map(|(_, kind)| kind).collect()
    }

    fn metric_columns_and_kinds(&self) -> Vec<(String, output::Kind)> {
        let mut all: Vec<(String, output::Kind)> = metric_columns().into_iter().zip(metric_kinds()).collect();
        for name in &self.device_types {
            all.extend(device_columns(name));
        }
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Every output column: `index`, the swept values, the metrics, `status`, `error`.
    pub fn columns(&self) -> Vec<String> {
        let mut columns = vec!["index".to_string()];
        columns.extend(self.swept_columns());
        columns.extend(self.metric_columns());
        columns.extend(["status".to_string(), "error".to_string()]);
        columns
    }

    /// Configuration `index` (`< count()`): the base with its axis values, derived values and
    /// filters applied.
    pub fn configuration(&self, index: u64) -> Configuration {
        let mut positions = vec![0usize; self.axes.len()];
        let mut rest = index;
        let zip_position = match self.zip.first() {
            Some(first) => {
                let n = first.values.len() as u64;
                let position = (rest % n) as usize;
                rest /= n;
                Some(position)
            }
            None => None,
        };
        for (position, axis) in positions.iter_mut().zip(&self.axes).rev() {
            let n = axis.values.len() as u64;
            *position = (rest % n) as usize;
            rest /= n;
        }
        let mut chosen: Vec<(&str, &toml::Value)> =
            self.axes.iter().zip(&positions).map(|(axis, &p)| (axis.key.as_str(), &axis.values[p])).collect();
        if let Some(p) = zip_position {
            chosen.extend(self.zip.iter().map(|axis| (axis.key.as_str(), &axis.values[p])));
        }
        let mut values: Vec<serde_json::Value> = chosen.iter().map(|(_, v)| json_of(v)).collect();
        values.extend(self.derived.iter().map(|_| serde_json::Value::Null));
        let prepared = self.prepare(&chosen, &mut values);
        Configuration { index, values, prepared }
    }

    fn prepare(
        &self,
        chosen: &[(&str, &toml::Value)],
        values: &mut [serde_json::Value],
    ) -> Result<toml::Table, (Status, String)> {
        let failed = |message: String| (Status::Failed, message);
        let mut table = self.base.clone();
        for (key, value) in chosen {
            Override::new(*key, (*value).clone()).apply(&mut table).map_err(|e| failed(e.to_string()))?;
        }
        let defaults = numeric_defaults();
        let check_filters = |table: &toml::Table, after_derived: bool| -> Result<(), (Status, String)> {
            for filter in self.filters.iter().filter(|f| f.after_derived == after_derived) {
                let lookup = |key: &str| lookup(table, &defaults, key);
                match filter.when.evaluate(&lookup, false) {
                    Ok(Value::Bool(true)) => return Err((Status::Skipped, filter.reason.clone())),
                    Ok(Value::Bool(false)) => {}
                    Ok(other) => {
                        return Err(failed(format!(
                            "filter \"{}\" gives {other}, not true or false",
                            filter.when.text()
                        )));
                    }
                    Err(error) => return Err(failed(format!("filter {error}"))),
                }
            }
            Ok(())
        };
        check_filters(&table, false)?;
        let first_derived = chosen.len();
        for (i, derived) in self.derived.iter().enumerate() {
            let value = derived
                .expression
                .evaluate(&|key| lookup(&table, &defaults, key), true)
                .map_err(|error| failed(format!("derived `{}` = {error}", derived.key)))?;
            let value = value.to_toml();
            values[first_derived + i] = json_of(&value);
            Override::new(&derived.key, value).apply(&mut table).map_err(|e| failed(e.to_string()))?;
        }
        check_filters(&table, true)?;
        Ok(table)
    }

    /// Runs configuration `index`: a row whatever happens (a failure is a row, not an error).
    pub fn run(&self, index: u64) -> Row {
        let Configuration { index, values, prepared } = self.configuration(index);
        let row = |metrics: Vec<serde_json::Value>, status: Status, error: String| Row {
            index,
            values: values.clone(),
            metrics,
            status,
            error: one_line(&error),
        };
        let columns = self.metric_columns();
        let empty = || vec![serde_json::Value::Null; columns.len()];
        let table = match prepared {
            Ok(table) => table,
            Err((status, message)) => return row(empty(), status, message),
        };
        let scenario = match Scenario::from_table_cached(&table, &self.anchor, &self.cache) {
            Ok(scenario) => scenario,
            Err(error) => return row(empty(), Status::Failed, error.to_string()),
        };
        match simulate(&scenario) {
            Ok(outcome) => row(metrics_of(&outcome.summary, columns), Status::Ok, String::new()),
            Err(SimulationError::Memory { source: source @ MemoryError::DoesNotFit { .. }, .. }) => {
                let mut metrics = empty();
                if let MemoryError::DoesNotFit { breakdown, capacity, .. } = &source {
                    let memory = [
                        ("memory.recompute", serde_json::json!(scenario.recompute.to_string())),
                        ("memory.weights", breakdown.weights.0.into()),
                        ("memory.gradients", breakdown.gradients.0.into()),
                        ("memory.optimizer", breakdown.optimizer.0.into()),
                        ("memory.activations", breakdown.activations.0.into()),
                        ("memory.temporary", breakdown.temporary.0.into()),
                        ("memory.communication", breakdown.communication.0.into()),
                        ("memory.total", breakdown.total().0.into()),
                        ("memory.capacity", capacity.0.into()),
                        (
                            "memory.spare",
                            i64::try_from(Margin::new(breakdown.total(), *capacity).spare_bytes())
                                .unwrap_or(i64::MIN)
                                .into(),
                        ),
                        (
                            "memory.spare_fraction",
                            Margin::new(breakdown.total(), *capacity).fraction().into(),
                        ),
                    ];
                    for (name, value) in memory {
                        if let Some(i) = columns.iter().position(|c| c == name) {
                            metrics[i] = value;
                        }
                    }
                }
                let message = source.to_string();
                let first_line = message.lines().next().unwrap_or_default().to_string();
                row(metrics, Status::DoesNotFit, first_line)
            }
            Err(error) => row(empty(), Status::Failed, error.to_string()),
        }
    }
}

/// The name expressions use for the GPU count.
const GPUS: &str = "gpus";

/// The value of `key` in a configuration's table, else the scenario's default; `gpus` is nodes
/// times GPUs per node.
fn lookup(table: &toml::Table, defaults: &toml::Table, key: &str) -> Result<Value, String> {
    if key == GPUS {
        let nodes = lookup(table, defaults, "cluster.nodes")?;
        let per_node = lookup(table, defaults, "cluster.gpus-per-node")?;
        return match (nodes, per_node) {
            (Value::Integer(a), Value::Integer(b)) => {
                a.checked_mul(b).map(Value::Integer).ok_or_else(|| "overflows".to_string())
            }
            (a, b) => Err(format!("needs integer nodes and GPUs per node, not {a} and {b}")),
        };
    }
    let value = get_dotted(table, key)
        .or_else(|| get_dotted(defaults, key))
        .ok_or_else(|| "has no value in this configuration".to_string())?;
    Value::from_toml(value).ok_or_else(|| format!("is {}, not a number, string or boolean", value.type_str()))
}

/// What the output columns of the swept values start with: `axis.` then the scenario key
/// (`axis.cluster.nodes`), for the axes, the zipped axes and the derived keys alike. No metric
/// starts with it, so a swept key and a metric never share a column.
pub const AXIS_PREFIX: &str = "axis.";

/// The metric columns: every number, string and boolean that `run --json` can print, by dotted
/// name (`iteration_time_s`, `breakdown.offload_stall_s`, `strategy.daso.global_bytes`,
/// `memory.total`), sorted by name. They are the keys of the summary with every optional part
/// present ([`full_summary`]): a superset of the keys of any configuration's `run --json`, fixed
/// before the first row runs, so the header of a resumed or sharded output is the same. Lists
/// (per-iteration times, per-stage memory, the framework's settings, warnings) are left out;
/// the scenario path is the same in every row and is left out too.
pub fn metric_columns() -> Vec<String> {
    let summary = serde_json::to_value(full_summary()).unwrap_or_default();
    let mut names: Vec<String> = flatten_json(&summary).into_iter().map(|(name, _)| name).collect();
    names.sort();
    names
}

/// What each of [`metric_columns`] holds, in the same order: the type a kept row's cell must
/// have when `--resume` checks it.
pub fn metric_kinds() -> Vec<output::Kind> {
    let summary = serde_json::to_value(full_summary()).unwrap_or_default();
    let mut flat = flatten_json(&summary);
    flat.sort_by(|a, b| a.0.cmp(&b.0));
    flat.into_iter().map(|(_, value)| output::Kind::of(value)).collect()
}

/// A summary with every part `run --json` may omit present: the framework, the optional strategy
/// settings (DASO, offloading, the input loader, the CNN splits) and the breakdown entries
/// omitted when zero. Only its keys matter.
fn full_summary() -> Summary {
    use crate::simulation::{DasoSummary, InputSummary, OffloadSummary};
    let some = sim_core::units::SimDuration::from_ps(1);
    let mut summary = Summary {
        framework: Some(crate::framework::FrameworkUse {
            name: String::new(),
            title: String::new(),
            implied: Vec::new(),
            explicit: Vec::new(),
            not_applied: Vec::new(),
        }),
        host: Some(crate::host::HostUse {
            host: Some(String::new()),
            title: Some(String::new()),
            execution: String::new(),
            dispatch: Some(String::new()),
            source: String::new(),
        }),
        tokens_per_second: Some(0.0),
        ..Summary::default()
    };
    let strategy = &mut summary.strategy;
    strategy.pipeline_host_sync = Some("");
    strategy.filter = 2;
    strategy.channel = 2;
    strategy.spatial = 2;
    strategy.spatial_dims = Some("");
    strategy.zero_implementation = Some("");
    strategy.daso = Some(DasoSummary::default());
    strategy.offload = Some(OffloadSummary::default());
    strategy.input = Some(InputSummary {
        loader: "",
        rate: 0.0,
        prefetch: 0,
        samples_per_loader: 0,
        broadcast_bytes: 0,
        broadcast_rate: Some(0.0),
    });
    strategy.input_copy_bytes = Some(0);
    let breakdown = &mut summary.breakdown;
    breakdown.input_bound = some;
    breakdown.offload_stall = some;
    breakdown.exposed_by_group.filter = 1.0;
    breakdown.exposed_by_group.channel = 1.0;
    breakdown.exposed_by_group.spatial = 1.0;
    summary.goodput = Some(crate::failures::GoodputSummary {
        job_mtbf_hours: Some(0.0),
        young_interval_iterations: Some(0.0),
        first_order_goodput: Some(0.0),
        ..Default::default()
    });
    summary.iteration_p50_s = Some(0.0);
    summary.iteration_p99_s = Some(0.0);
    summary.distribution = Some(crate::simulation::DistributionSummary::default());
    summary
}

/// What the columns of one device type of a cluster of node groups start with:
/// `devices.` then its catalog name (`devices.a100-sxm4-80gb.busy`).
pub const DEVICES_PREFIX: &str = "devices.";

/// The columns of device type `name` (a catalog name) with the kind of each: `devices.NAME.`
/// and each number of its entry in `run --json`'s `devices` list (`gpus`, `busy`,
/// `achieved_tflops_per_device`, `peak_tflops_per_device`, `mfu`). The list's `device` (the
/// display name) is the column name's part, so it has no column.
pub fn device_columns(name: &str) -> Vec<(String, output::Kind)> {
    let entry = serde_json::to_value(crate::mixed::DeviceUtilisation::default()).unwrap_or_default();
    let mut columns: Vec<(String, output::Kind)> = flatten_json(&entry)
        .into_iter()
        .filter(|(field, _)| field != "device")
        .map(|(field, value)| (format!("{DEVICES_PREFIX}{name}.{field}"), output::Kind::of(value)))
        .collect();
    columns.sort_by(|a, b| a.0.cmp(&b.0));
    columns
}

/// The catalog names of the devices of `base`'s `[[cluster.node-groups]]`, in order of first
/// appearance (as `run --json` lists the types); empty without node groups. A name the
/// catalog does not know is left out: validating the configurations reports it.
fn device_types(base: &toml::Table) -> Vec<String> {
    let Some(toml::Value::Array(groups)) = get_dotted(base, "cluster.node-groups") else {
        return Vec::new();
    };
    let catalog = workloads::device::DeviceCatalog::builtin();
    let mut names: Vec<String> = Vec::new();
    for group in groups {
        let Some(given) = group.get("device").and_then(toml::Value::as_str) else { continue };
        if let Ok(device) = catalog.get(given)
            && !names.contains(&device.name)
        {
            names.push(device.name.clone());
        }
    }
    names
}

fn metrics_of(summary: &Summary, columns: Vec<String>) -> Vec<serde_json::Value> {
    let value = serde_json::to_value(summary).unwrap_or_default();
    let mut flat: Vec<(String, serde_json::Value)> =
        flatten_json(&value).into_iter().map(|(name, value)| (name, value.clone())).collect();
    // `run --json`'s `devices` is a list; a sweep has a column per type and number.
    for device in &summary.devices {
        let entry = serde_json::to_value(device).unwrap_or_default();
        flat.extend(
            flatten_json(&entry)
                .into_iter()
                .filter(|(field, _)| field != "device")
                .map(|(field, value)| (format!("{DEVICES_PREFIX}{}.{field}", device.name), value.clone())),
        );
    }
    columns
        .iter()
        .map(|column| {
            flat.iter().find(|(name, _)| name == column).map(|(_, v)| v.clone()).unwrap_or_default()
        })
        .collect()
}

fn flatten_json(value: &serde_json::Value) -> Vec<(String, &serde_json::Value)> {
    fn walk<'a>(prefix: &str, value: &'a serde_json::Value, out: &mut Vec<(String, &'a serde_json::Value)>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, inner) in map {
                    let name = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                    walk(&name, inner, out);
                }
            }
            serde_json::Value::Array(_) => {}
            _ if prefix == "scenario" => {}
            _ => out.push((prefix.to_string(), value)),
        }
    }
    let mut out = Vec::new();
    walk("", value, &mut out);
    out
}

/// A TOML value as a JSON cell (arrays and tables as their TOML text).
fn json_of(value: &toml::Value) -> serde_json::Value {
    match value {
        toml::Value::Integer(n) => (*n).into(),
        toml::Value::Float(x) => serde_json::Number::from_f64(*x).map_or(serde_json::Value::Null, Into::into),
        toml::Value::Boolean(b) => (*b).into(),
        toml::Value::String(s) => s.clone().into(),
        other => InlineValue(other).to_string().into(),
    }
}

/// An error message on one line: a row is one line of the output.
fn one_line(text: &str) -> String {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" | ")
}

/// Where each key of `[axes]`, `[zip]` and `[derived]` is written in the file, so they keep
/// the file's order (a TOML table is sorted by key once parsed).
struct KeyOrder(Vec<(String, String, usize)>);

impl KeyOrder {
    fn get(&self, table: &str, key: &str) -> usize {
        self.0.iter().find(|(t, k, _)| t == table && k == key).map_or(usize::MAX, |(_, _, at)| *at)
    }
}

fn key_order(text: &str) -> KeyOrder {
    use toml::de::{DeTable, DeValue};
    fn walk(table: &str, prefix: &str, de: &DeTable<'_>, out: &mut Vec<(String, String, usize)>) {
        for (key, value) in de.iter() {
            let name = if prefix.is_empty() {
                key.get_ref().to_string()
            } else {
                format!("{prefix}.{}", key.get_ref())
            };
            match value.get_ref() {
                DeValue::Table(inner) if !is_range(inner.keys().map(|k| k.get_ref().as_ref())) => {
                    walk(table, &name, inner, out)
                }
                _ => out.push((table.to_string(), name, key.span().start)),
            }
        }
    }
    let mut out = Vec::new();
    if let Ok(document) = DeTable::parse(text) {
        for table in ["axes", "zip", "derived"] {
            if let Some(found) = document.get_ref().get(table)
                && let DeValue::Table(inner) = found.get_ref()
            {
                walk(table, "", inner, &mut out);
            }
        }
    }
    KeyOrder(out)
}

fn is_range<'a>(mut keys: impl Iterator<Item = &'a str>) -> bool {
    keys.any(|k| k == "from")
}

/// The leaves of an `[axes]`-like table: nested tables are dotted keys, except range tables.
fn flatten<'a>(table: &'a toml::Table, prefix: &str) -> Vec<(String, &'a toml::Value)> {
    let mut out = Vec::new();
    for (key, value) in table {
        let name = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        match value {
            toml::Value::Table(inner) if !is_range(inner.keys().map(String::as_str)) => {
                out.extend(flatten(inner, &name))
            }
            _ => out.push((name, value)),
        }
    }
    out
}

fn read_axes(table: &toml::Table, section: &str, order: &KeyOrder) -> Result<Vec<Axis>, (String, String)> {
    let mut entries = flatten(table, "");
    entries.sort_by_key(|(key, _)| order.get(section, key));
    entries
        .into_iter()
        .map(|(key, value)| {
            let name = format!("{section}.\"{key}\"");
            let values = axis_values(value).map_err(|message| (name, message))?;
            Ok(Axis { key, values })
        })
        .collect()
}

/// The values of one axis: a list, or `{ from, to, step }` / `{ from, to, factor }`.
fn axis_values(value: &toml::Value) -> Result<Vec<toml::Value>, String> {
    match value {
        toml::Value::Array(values) if values.is_empty() => {
            Err("is empty: an axis needs at least one value".into())
        }
        toml::Value::Array(values) => {
            if let Some(bad) = values.iter().find(|v| v.is_table() || v.is_array()) {
                return Err(format!(
                    "holds {}; axis values are numbers, strings or booleans",
                    bad.type_str()
                ));
            }
            Ok(values.clone())
        }
        toml::Value::Table(range) => {
            for key in range.keys() {
                if !["from", "to", "step", "factor"].contains(&key.as_str()) {
                    return Err(format!(
                        "unknown range key `{key}`; a range has from, to, and step or factor"
                    ));
                }
            }
            let number = |key: &str| -> Result<Option<Value>, String> {
                match range.get(key) {
                    None => Ok(None),
                    Some(toml::Value::Integer(n)) => Ok(Some(Value::Integer(*n))),
                    Some(toml::Value::Float(x)) if x.is_finite() => Ok(Some(Value::Float(*x))),
                    Some(other) => Err(format!("range `{key}` is {}; it must be a number", other.type_str())),
                }
            };
            let (Some(from), Some(to)) = (number("from")?, number("to")?) else {
                return Err("a range needs `from` and `to`".into());
            };
            let too_many = || format!("the range has more than {MAX_CONFIGURATIONS} values");
            match (number("step")?, number("factor")?) {
                (Some(_), Some(_)) => Err("a range has a `step` or a `factor`, not both".into()),
                (None, None) => Err("a range needs a `step` (from, from + step, ...) or a `factor` (from, from x factor, ...)".into()),
                (Some(step), None) => match (from, to, step) {
                    (Value::Integer(from), Value::Integer(to), Value::Integer(step)) => {
                        if step <= 0 || to < from {
                            return Err(format!("from {from} to {to} by step {step}: need from <= to and step > 0"));
                        }
                        let count = (to - from) / step + 1;
                        if count as u64 > MAX_CONFIGURATIONS {
                            return Err(too_many());
                        }
                        Ok((0..count).map(|k| toml::Value::Integer(from + k * step)).collect())
                    }
                    (from, to, step) => {
                        let (from, to, step) = (as_f64(&from), as_f64(&to), as_f64(&step));
                        if step <= 0.0 || to < from {
                            return Err(format!("from {from} to {to} by step {step}: need from <= to and step > 0"));
                        }
                        // Values are from + k x step (no accumulated rounding); `to` is included
                        // when it is within a millionth of a step.
                        let count = ((to - from) / step + 1e-6).floor() + 1.0;
                        if count > MAX_CONFIGURATIONS as f64 {
                            return Err(too_many());
                        }
                        Ok((0..count as u64).map(|k| toml::Value::Float(from + k as f64 * step)).collect())
                    }
                },
                (None, Some(factor)) => {
                    let integers = matches!((&from, &to, &factor), (Value::Integer(_), Value::Integer(_), Value::Integer(_)));
                    let (f, t, x) = (as_f64(&from), as_f64(&to), as_f64(&factor));
                    if x <= 1.0 || f <= 0.0 || t < f {
                        return Err(format!("from {f} to {t} by factor {x}: need 0 < from <= to and factor > 1"));
                    }
                    let mut values = Vec::new();
                    if integers {
                        let (Value::Integer(mut v), Value::Integer(to), Value::Integer(factor)) = (from, to, factor) else {
                            return Err("unreachable".into());
                        };
                        while v <= to {
                            values.push(toml::Value::Integer(v));
                            match v.checked_mul(factor) {
                                Some(next) => v = next,
                                None => break,
                            }
                        }
                    } else {
                        let mut k = 0;
                        loop {
                            let v = f * x.powi(k);
                            if v > t * (1.0 + 1e-9) {
                                break;
                            }
                            values.push(toml::Value::Float(v));
                            k += 1;
                        }
                    }
                    Ok(values)
                }
            }
        }
        other => Err(format!(
            "is {}; an axis is a list of values or a range {{ from, to, step | factor }}",
            other.type_str()
        )),
    }
}

fn as_f64(value: &Value) -> f64 {
    match value {
        Value::Integer(n) => *n as f64,
        Value::Float(x) => *x,
        _ => f64::NAN,
    }
}

#[cfg(test)]
mod tests;
