//! Scenario overrides: the one way to vary a scenario. An [`Override`] is a dotted key of the
//! scenario format and a value (`parallelism.data = 32`), applied to the scenario's TOML table
//! (its wire form) before validation, so a varied scenario is checked exactly as a file that
//! says the same is: an unknown key or a value of the wrong type is the scenario's own error,
//! naming the key and what is valid.
//!
//! `run --set`, `sweep` (its axes and derived values), `validate` (a scaling case's baseline),
//! `plan` (every candidate configuration) and `bench` (its GPU counts) all vary scenarios
//! this way. [`merge`] layers whole tables (a validation family's keys under a case's).

use std::fmt;
use std::str::FromStr;

/// An override could not be read or applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverrideError {
    /// A part of the key's path holds a value that is not a table.
    #[error("{key}: `{part}` is not a table")]
    NotATable {
        /// The dotted key, e.g. `workload.model.x`.
        key: String,
        /// The part of its path that is not a table, e.g. `model`.
        part: String,
    },
    /// The text is not `KEY=VALUE` with a dotted key.
    #[error("{text:?}: {message}")]
    Syntax {
        /// The text as given.
        text: String,
        /// What is wrong, with an example.
        message: String,
    },
}

/// One change of a scenario: a dotted key of the scenario format and its new value.
///
/// Parsed from `KEY=VALUE` text ([`FromStr`]), the value is typed as TOML reads it: an
/// integer (`32`), a float (`0.9`), a boolean (`true`), a quoted string (`"fp16"`), an array
/// or an inline table; any other text is a string, so quantities with units (`200 Gb/s`,
/// `1 us`, `25 MiB`) and names (`bf16`, `full`) need no quotes.
///
/// ```
/// use scenario::Override;
/// let mut table: toml::Table = toml::from_str("[cluster]\nnodes = 8\n")?;
/// let changes: Vec<Override> = ["cluster.nodes=4", "cluster.network.link-bandwidth=400 Gb/s"]
///     .iter()
///     .map(|text| text.parse())
///     .collect::<Result<_, _>>()?;
/// scenario::apply(&mut table, &changes)?;
/// assert_eq!(table["cluster"]["nodes"].as_integer(), Some(4));
/// assert_eq!(table["cluster"]["network"]["link-bandwidth"].as_str(), Some("400 Gb/s"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The dotted key, e.g. `parallelism.data`.
    pub key: String,
    /// Its value.
    pub value: toml::Value,
}

impl Override {
    /// `key = value`.
    pub fn new(key: impl Into<String>, value: impl Into<toml::Value>) -> Override {
        Override { key: key.into(), value: value.into() }
    }

    /// An integer `key = value`, or an error naming the key if `value` is past TOML's
    /// integers (2^63 - 1).
    pub fn integer(key: impl Into<String>, value: u64) -> Result<Override, OverrideError> {
        let key = key.into();
        match i64::try_from(value) {
            Ok(value) => Ok(Override::new(key, value)),
            Err(_) => Err(OverrideError::Syntax {
                text: format!("{key}={value}"),
                message: "is too large for a TOML integer".into(),
            }),
        }
    }

    /// Each entry of `changes`, a table of dotted keys and their values
    /// (`{ "cluster.nodes" = 1, "parallelism.data" = 8 }`), as an override, in key order.
    pub fn all_of(changes: &toml::Table) -> Vec<Override> {
        changes.iter().map(|(key, value)| Override::new(key, value.clone())).collect()
    }

    /// Sets this key in `table`, creating the tables on its path that are missing. A part of
    /// the path that holds a value other than a table is an error naming the key.
    pub fn apply(&self, table: &mut toml::Table) -> Result<(), OverrideError> {
        let (path, last) = match self.key.rsplit_once('.') {
            Some((path, last)) => (Some(path), last),
            None => (None, self.key.as_str()),
        };
        let mut current = table;
        for part in path.into_iter().flat_map(|path| path.split('.')) {
            if !current.contains_key(part) {
                current.insert(part.to_string(), toml::Value::Table(toml::Table::new()));
            }
            current = current
                .get_mut(part)
                .and_then(toml::Value::as_table_mut)
                .ok_or_else(|| OverrideError::NotATable { key: self.key.clone(), part: part.to_string() })?;
        }
        match current.get_mut(last) {
            Some(slot) => *slot = self.value.clone(),
            None => {
                current.insert(last.to_string(), self.value.clone());
            }
        }
        Ok(())
    }

    /// Whether a validation error at scenario key `key` is about this override: the same key,
    /// or a key inside the table it sets.
    pub fn covers(&self, key: &str) -> bool {
        key.strip_prefix(self.key.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    }
}

impl FromStr for Override {
    type Err = OverrideError;

    /// `KEY=VALUE`; the value typed as the type docs say.
    fn from_str(text: &str) -> Result<Override, OverrideError> {
        let syntax =
            |message: &str| OverrideError::Syntax { text: text.to_string(), message: message.into() };
        let (key, value) =
            text.split_once('=').ok_or_else(|| syntax("give KEY=VALUE, e.g. parallelism.data=32"))?;
        let key = key.trim();
        let valid_part = |part: &str| {
            !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if !key.split('.').all(valid_part) {
            return Err(syntax(
                "the key is a dotted scenario key of letters, digits, `-` and `_`, e.g. parallelism.data=32",
            ));
        }
        let value = value.trim();
        if value.is_empty() {
            return Err(syntax("give a value after `=`, e.g. parallelism.data=32"));
        }
        Ok(Override::new(key, typed_value(value)))
    }
}

/// `value` as TOML reads it, if it reads as an integer, float, boolean, string, array or
/// inline table; else the text as a string.
fn typed_value(value: &str) -> toml::Value {
    match toml::from_str::<toml::Table>(&format!("v = {value}")).ok().and_then(|mut t| t.remove("v")) {
        Some(toml::Value::Datetime(_)) | None => toml::Value::String(value.to_string()),
        Some(typed) => typed,
    }
}

impl fmt::Display for Override {
    /// `key=value`, the value as a file would write it (`workload.recompute="full"`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, InlineValue(&self.value))
    }
}

/// Applies `overrides` to `table` in order ([`Override::apply`]).
pub fn apply(table: &mut toml::Table, overrides: &[Override]) -> Result<(), OverrideError> {
    overrides.iter().try_for_each(|change| change.apply(table))
}

/// Merges `over` into `base`, table by table, key by key: a value in `over` wins, and a table
/// in both is merged recursively (so `[workload] model = "b"` over a base keeps the base's
/// other `[workload]` keys).
///
/// ```
/// let mut base: toml::Table = toml::from_str("[workload]\nmodel = \"a\"\nprecision = \"fp16\"\n")?;
/// let over: toml::Table = toml::from_str("[workload]\nmodel = \"b\"\n")?;
/// scenario::merge(&mut base, &over);
/// assert_eq!(base["workload"]["model"].as_str(), Some("b"));
/// assert_eq!(base["workload"]["precision"].as_str(), Some("fp16"));
/// # Ok::<(), toml::de::Error>(())
/// ```
pub fn merge(base: &mut toml::Table, over: &toml::Table) {
    for (key, value) in over {
        match (base.get_mut(key), value) {
            (Some(toml::Value::Table(existing)), toml::Value::Table(table)) => merge(existing, table),
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

/// The value at dotted key `dotted` in `table`, if every part of the path is there.
pub fn get_dotted<'a>(table: &'a toml::Table, dotted: &str) -> Option<&'a toml::Value> {
    let mut parts = dotted.split('.');
    let mut value = table.get(parts.next()?)?;
    for part in parts {
        value = value.as_table()?.get(part)?;
    }
    Some(value)
}

/// Every leaf of `table` (a value that is not a table) with its dotted key, in key order.
pub fn dotted_leaves(table: &toml::Table) -> Vec<(String, &toml::Value)> {
    fn walk<'a>(prefix: &str, table: &'a toml::Table, out: &mut Vec<(String, &'a toml::Value)>) {
        for (key, value) in table {
            let dotted = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            match value {
                toml::Value::Table(inner) => walk(&dotted, inner, out),
                _ => out.push((dotted, value)),
            }
        }
    }
    let mut out = Vec::new();
    walk("", table, &mut out);
    out
}

/// A TOML value on one line, as it would be written in a file (`4`, `"200 Gb/s"`, `[1, 2]`).
pub struct InlineValue<'a>(pub &'a toml::Value);

impl fmt::Display for InlineValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            toml::Value::String(text) => write!(f, "{text:?}"),
            other => write!(f, "{other}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Override {
        text.parse().unwrap()
    }

    #[test]
    fn scenarios_merge_table_by_table() {
        let mut base: toml::Table =
            toml::from_str("[workload]\nmodel = \"a\"\nprecision = \"fp16\"\n").unwrap();
        let over: toml::Table =
            toml::from_str("[workload]\nmodel = \"b\"\n[parallelism]\ndata = 2\n").unwrap();
        merge(&mut base, &over);
        assert_eq!(base["workload"]["model"].as_str(), Some("b"));
        assert_eq!(base["workload"]["precision"].as_str(), Some("fp16"));
        assert_eq!(base["parallelism"]["data"].as_integer(), Some(2));
        let changes: toml::Table =
            toml::from_str("\"parallelism.data\" = 1\n\"cluster.nodes\" = 1\n").unwrap();
        apply(&mut base, &Override::all_of(&changes)).unwrap();
        assert_eq!(base["parallelism"]["data"].as_integer(), Some(1));
        assert_eq!(base["cluster"]["nodes"].as_integer(), Some(1));
        assert_eq!(get_dotted(&base, "cluster.nodes").and_then(toml::Value::as_integer), Some(1));
        assert!(get_dotted(&base, "cluster.gpus").is_none());
        let error = parsed("workload.model.x=1").apply(&mut base).unwrap_err();
        assert_eq!(error, OverrideError::NotATable { key: "workload.model.x".into(), part: "model".into() });
        let leaves: Vec<String> = dotted_leaves(&base).into_iter().map(|(k, _)| k).collect();
        assert_eq!(leaves, ["cluster.nodes", "parallelism.data", "workload.model", "workload.precision"]);
    }

    #[test]
    fn values_are_typed_as_toml_reads_them_and_other_text_is_a_string() {
        let value = |text: &str| parsed(&format!("a.b={text}")).value;
        assert_eq!(value("32"), toml::Value::Integer(32));
        assert_eq!(value(" -3 "), toml::Value::Integer(-3));
        assert_eq!(value("0.9"), toml::Value::Float(0.9));
        assert_eq!(value("1e9"), toml::Value::Float(1e9));
        assert_eq!(value("true"), toml::Value::Boolean(true));
        assert_eq!(value("\"fp16\""), toml::Value::String("fp16".into()));
        assert_eq!(value("bf16"), toml::Value::String("bf16".into()));
        assert_eq!(value("200 Gb/s"), toml::Value::String("200 Gb/s".into()));
        assert_eq!(value("\"1 us\""), toml::Value::String("1 us".into()));
        assert_eq!(value("1f1b"), toml::Value::String("1f1b".into()));
        assert_eq!(value("2026-01-01"), toml::Value::String("2026-01-01".into()));
        assert_eq!(value("[1, 2]"), toml::Value::Array(vec![1.into(), 2.into()]));
        assert_eq!(value("x=y"), toml::Value::String("x=y".into()));
        let table = value("{ kind = \"nvswitch\" }");
        assert_eq!(table.get("kind").and_then(toml::Value::as_str), Some("nvswitch"));
        let change = parsed(" parallelism.sequence-parallel = false ");
        assert_eq!(change, Override::new("parallelism.sequence-parallel", false));
        assert_eq!(change.to_string(), "parallelism.sequence-parallel=false");
        assert_eq!(parsed("workload.recompute=full").to_string(), "workload.recompute=\"full\"");
    }

    #[test]
    fn malformed_text_is_refused_with_an_example() {
        for text in ["tensor", "=4", "a..b=1", "a b=1", "a.b="] {
            let error = text.parse::<Override>().unwrap_err();
            assert!(
                matches!(&error, OverrideError::Syntax { text: t, message } if t == text && message.contains("e.g.")),
                "{text}: {error}"
            );
        }
        assert!(Override::integer("a", u64::MAX).is_err());
        assert_eq!(Override::integer("a", 3).unwrap(), Override::new("a", 3));
    }

    #[test]
    fn an_override_covers_its_key_and_the_keys_inside_it() {
        let change = Override::new("cluster.network", toml::Table::new());
        assert!(change.covers("cluster.network"));
        assert!(change.covers("cluster.network.radix"));
        assert!(!change.covers("cluster"));
        assert!(!change.covers("cluster.nodes"));
        assert!(!change.covers("cluster.network-x"));
    }
}
