//! Counted warnings: what an import or a replay skipped or assumed, one line per kind of
//! problem with how often it happened, so a million unknown events make one line, not a
//! million.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Warnings, each counted; ordered by message so reports are deterministic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Warnings {
    counts: BTreeMap<String, u64>,
}

impl Warnings {
    /// No warnings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one occurrence of `message`.
    pub fn add(&mut self, message: impl Into<String>) {
        self.add_many(message, 1);
    }

    /// Counts `count` occurrences of `message` (nothing if `count` is 0).
    pub fn add_many(&mut self, message: impl Into<String>, count: u64) {
        if count > 0 {
            *self.counts.entry(message.into()).or_insert(0) += count;
        }
    }

    /// Adds every warning of `other`.
    pub fn extend(&mut self, other: &Warnings) {
        for (message, &count) in &other.counts {
            self.add_many(message.clone(), count);
        }
    }

    /// True if nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Each message with its count, ordered by message.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.counts.iter().map(|(message, &count)| (message.as_str(), count))
    }

    /// How often `message` was counted.
    pub fn count(&self, message: &str) -> u64 {
        self.counts.get(message).copied().unwrap_or(0)
    }
}

impl fmt::Display for Warnings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (message, count) in self.iter() {
            writeln!(f, "{count:>8} x {message}")?;
        }
        Ok(())
    }
}
