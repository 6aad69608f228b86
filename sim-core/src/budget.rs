//! The work budget: how much one simulation may build before it starts, checked up front.
//!
//! Every command that builds an execution graph or times a collective message by message
//! (`run` and what runs scenarios: `sweep`, `plan`'s finals, `validate`; `collective`;
//! `replay`) estimates the size of what it would build from its inputs, before allocating
//! it, and refuses a job above [`MAX_ITEMS`] with an [`OverBudget`] that names the key at
//! fault, the size, the limit and what to use instead. The one limit holds for graph ops and
//! collective messages alike: each costs about [`BYTES_PER_ITEM`] of memory, so the limit
//! keeps a job near 3 GB.
//!
//! The other budget, `simulation.work-budget` (`FlowNetwork::with_work_budget`), bounds the
//! flow network's work while a graph of an accepted size runs (`plan` gives its finals one);
//! this one decides whether the graph is built at all.

/// The most graph ops (or collective messages) one simulation builds.
pub const MAX_ITEMS: u64 = 30_000_000;

/// Memory of one op or message, about (graph, dependencies, timeline).
pub const BYTES_PER_ITEM: u64 = 100;

/// A job refused before it was built: it would pass [`MAX_ITEMS`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {}", self.reason())]
pub struct OverBudget {
    /// The key (or argument) that drives the size.
    pub key: String,
    /// What would be built, with the numbers the estimate multiplies.
    pub what: String,
    /// The estimate.
    pub needed: u64,
    /// What is counted: "ops", "messages".
    pub unit: &'static str,
    /// What to use instead.
    pub instead: String,
}

impl OverBudget {
    /// The message without the key: what, how much, the limit, what instead.
    pub fn reason(&self) -> String {
        format!(
            "{} needs at least {} {}, more than the {MAX_ITEMS} parasim builds in memory (about {BYTES_PER_ITEM} bytes each); {}",
            self.what, self.needed, self.unit, self.instead
        )
    }
}

/// `Err` when `needed` items pass [`MAX_ITEMS`].
pub fn check(
    needed: u64,
    unit: &'static str,
    key: impl FnOnce() -> String,
    what: impl FnOnce() -> String,
    instead: impl FnOnce() -> String,
) -> Result<(), OverBudget> {
    if needed <= MAX_ITEMS {
        return Ok(());
    }
    Err(OverBudget { key: key(), what: what(), needed, unit, instead: instead() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_itself_passes_and_one_more_is_refused_with_every_part_named() {
        let parts = || ("--ranks 9".to_string(), "nine ranks".to_string(), "fewer".to_string());
        assert!(check(MAX_ITEMS, "ops", || parts().0, || parts().1, || parts().2).is_ok());
        let error = check(MAX_ITEMS + 1, "ops", || parts().0, || parts().1, || parts().2).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--ranks 9: nine ranks needs at least 30000001 ops, more than the 30000000 parasim builds in memory (about 100 bytes each); fewer"
        );
    }
}
