//! Scenario overrides: a scenario as a TOML table, changed table by table ([`merge`]) or key by
//! dotted key ([`set_dotted`]). `validate` builds its cases this way and `sweep` its
//! configurations, so both change a scenario by the same rules.

use std::fmt;

/// A dotted key could not be set: a part of its path holds a value that is not a table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: `{part}` is not a table")]
pub struct OverrideError {
    /// The dotted key, e.g. `workload.model.x`.
    pub key: String,
    /// The part of its path that is not a table, e.g. `model`.
    pub part: String,
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

/// Sets every dotted key of `changes` (`"parallelism.data" = 8`) in `table`, creating the
/// tables on its path that are missing. A part of the path that holds a value other than a
/// table is an error naming the key.
///
/// ```
/// let mut table = toml::Table::new();
/// let changes: toml::Table = toml::from_str("\"cluster.nodes\" = 4\n")?;
/// scenario::set_dotted(&mut table, &changes)?;
/// assert_eq!(table["cluster"]["nodes"].as_integer(), Some(4));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn set_dotted(table: &mut toml::Table, changes: &toml::Table) -> Result<(), OverrideError> {
    for (dotted, value) in changes {
        set_dotted_key(table, dotted, value.clone())?;
    }
    Ok(())
}

/// Sets one dotted key (`"cluster.network.link-bandwidth"`) in `table` to `value`, creating
/// the tables on its path that are missing.
pub fn set_dotted_key(
    table: &mut toml::Table,
    dotted: &str,
    value: toml::Value,
) -> Result<(), OverrideError> {
    let mut parts: Vec<&str> = dotted.split('.').collect();
    let Some(last) = parts.pop() else { return Ok(()) };
    let mut current = table;
    for part in parts {
        let entry = current.entry(part.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = entry
            .as_table_mut()
            .ok_or_else(|| OverrideError { key: dotted.to_string(), part: part.to_string() })?;
    }
    current.insert(last.to_string(), value);
    Ok(())
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
        set_dotted(&mut base, &changes).unwrap();
        assert_eq!(base["parallelism"]["data"].as_integer(), Some(1));
        assert_eq!(base["cluster"]["nodes"].as_integer(), Some(1));
        assert_eq!(get_dotted(&base, "cluster.nodes").and_then(toml::Value::as_integer), Some(1));
        assert!(get_dotted(&base, "cluster.gpus").is_none());
        let bad: toml::Table = toml::from_str("\"workload.model.x\" = 1\n").unwrap();
        let error = set_dotted(&mut base, &bad).unwrap_err();
        assert_eq!(error, OverrideError { key: "workload.model.x".into(), part: "model".into() });
        let leaves: Vec<String> = dotted_leaves(&base).into_iter().map(|(k, _)| k).collect();
        assert_eq!(leaves, ["cluster.nodes", "parallelism.data", "workload.model", "workload.precision"]);
    }
}
