//! Choosing and running cases in parallel.

use rayon::prelude::*;

use crate::case::{CaseEntry, Family, Paths};
use crate::report::Report;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use crate::run::{CaseResult, case_weight, run_case};

/// Which cases to run.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Family ids (all if empty).
    pub families: Vec<String>,
    /// Case ids, `family/case` or just `case` (all if empty).
    pub cases: Vec<String>,
    /// Only the families marked `ci = true`.
    pub ci_only: bool,
}

/// Why a selection is wrong.
#[derive(Debug, thiserror::Error)]
pub enum SelectionError {
    /// A family id that the suite does not have.
    #[error("--suite {0:?}: no such family; valid: {1}")]
    NoFamily(String, String),
    /// A case id that matches nothing.
    #[error("--case {0:?}: no such case (write family/case; `parasim validate --list` lists them)")]
    NoCase(String),
}

impl Selection {
    /// The (family, case) pairs chosen from `families`, in suite order.
    pub fn choose<'a>(
        &self,
        families: &'a [Family],
    ) -> Result<Vec<(&'a Family, &'a CaseEntry)>, SelectionError> {
        for wanted in &self.families {
            if !families.iter().any(|f| &f.header.id == wanted) {
                let valid: Vec<&str> = families.iter().map(|f| f.header.id.as_str()).collect();
                return Err(SelectionError::NoFamily(wanted.clone(), valid.join(", ")));
            }
        }
        let matches_case = |family: &Family, case: &CaseEntry, wanted: &str| {
            wanted == family.case_id(case) || wanted == case.id
        };
        for wanted in &self.cases {
            let found = families.iter().any(|f| f.cases.iter().any(|c| matches_case(f, c, wanted)));
            if !found {
                return Err(SelectionError::NoCase(wanted.clone()));
            }
        }
        let mut chosen = Vec::new();
        for family in families {
            if self.ci_only && !family.header.ci {
                continue;
            }
            if !self.families.is_empty() && !self.families.contains(&family.header.id) {
                continue;
            }
            for case in &family.cases {
                if self.cases.is_empty() || self.cases.iter().any(|w| matches_case(family, case, w)) {
                    chosen.push((family, case));
                }
            }
        }
        Ok(chosen)
    }
}

/// Runs `chosen` on every core of the current thread pool, calling `done` after each case
/// (from any thread), and returns the report in suite order whatever the thread count.
///
/// Cases are taken heaviest first ([`crate::run::case_weight`], a lower bound of the ops a
/// case's graph holds, which its memory grows with) so that the long ones start early and
/// the light ones fill in around them, and a case starts only while it and the cases running
/// beside it weigh no more together than the heaviest chosen case alone: the suite's peak
/// memory stays near its heaviest case's instead of the sum of the two heaviest (the suite's
/// largest job, 12.7 M ops, peaks at 0.80 GB on its own; docs/benchmarks.md, "Validation suite
/// memory"), and the cases that fit beside each other still run in parallel. Results do not
/// depend on the order (every case is independent).
pub fn run(
    families: &[Family],
    chosen: &[(&Family, &CaseEntry)],
    paths: &Paths,
    done: &(dyn Fn(&CaseResult) + Sync),
) -> Report {
    let gate = Gate::new(chosen.par_iter().map(|(family, case)| case_weight(family, case, paths)).collect());
    let results: Vec<Mutex<Option<CaseResult>>> = chosen.iter().map(|_| Mutex::new(None)).collect();
    let workers = rayon::current_num_threads().clamp(1, chosen.len().max(1));
    rayon::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|_| {
                while let Some(index) = gate.take() {
                    // Finished even if the case panics, so the other workers do not wait for it.
                    let _running = Running { gate: &gate, index };
                    let (family, case) = chosen[index];
                    let result = run_case(family, case, paths);
                    done(&result);
                    *lock(&results[index]) = Some(result);
                }
            });
        }
    });
    let results: Vec<CaseResult> = results
        .into_iter()
        .map(|slot| slot.into_inner().unwrap_or_else(PoisonError::into_inner))
        .collect::<Option<Vec<_>>>()
        .unwrap_or_default();
    let headers: Vec<(String, String, String)> = families
        .iter()
        .map(|f| (f.header.id.clone(), f.header.title.clone(), f.header.source.clone()))
        .collect();
    Report::new(results, &headers)
}

/// The cases not started yet, and the weight of those running.
struct GateState {
    /// Indexes into the chosen cases, in the order they are to start.
    waiting: Vec<usize>,
    running: usize,
    weight: u64,
}

/// Hands out cases to the workers, heaviest first, the weight of those running at once
/// within the heaviest case's.
struct Gate {
    /// Each case's weight.
    weights: Vec<u64>,
    /// The most the running cases may weigh together (a case alone always starts).
    budget: u64,
    state: Mutex<GateState>,
    changed: Condvar,
}

/// A running case: tells the gate it finished when dropped.
struct Running<'g> {
    gate: &'g Gate,
    index: usize,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.gate.finish(self.index);
    }
}

/// `mutex`'s guard, even if a worker panicked while holding it (the panic is re-raised by the
/// scope; the state stays consistent, every change to it being one assignment).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Gate {
    /// A gate over cases of these weights.
    fn new(weights: Vec<u64>) -> Gate {
        let mut waiting: Vec<usize> = (0..weights.len()).collect();
        // Stable: equal weights (every light case weighs 0) keep the suite's order.
        waiting.sort_by_key(|&index| std::cmp::Reverse(weights[index]));
        Gate {
            budget: weights.iter().copied().max().unwrap_or(0),
            weights,
            state: Mutex::new(GateState { waiting, running: 0, weight: 0 }),
            changed: Condvar::new(),
        }
    }

    /// The next case that fits beside those running (waiting while none does), or `None` when
    /// every case has started.
    fn take(&self) -> Option<usize> {
        let mut state = lock(&self.state);
        loop {
            if state.waiting.is_empty() {
                return None;
            }
            let fits = |index: &usize| {
                state.running == 0 || state.weight.saturating_add(self.weights[*index]) <= self.budget
            };
            if let Some(position) = state.waiting.iter().position(fits) {
                let index = state.waiting.remove(position);
                state.running += 1;
                state.weight += self.weights[index];
                return Some(index);
            }
            state = self.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Case `index` has finished.
    fn finish(&self, index: usize) {
        let mut state = lock(&self.state);
        state.running -= 1;
        state.weight -= self.weights[index];
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_start_heaviest_first_never_outweigh_the_heaviest_together_and_all_run_once() {
        let weights = vec![0, 9, 0, 10, 4, 0, 6, 0, 1, 5, 3, 0];
        let gate = Gate::new(weights.clone());
        assert_eq!(gate.budget, 10);
        let started = Mutex::new(Vec::new());
        let most = Mutex::new(0u64);
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| {
                    while let Some(index) = gate.take() {
                        let _running = Running { gate: &gate, index };
                        lock(&started).push(index);
                        let weight = lock(&gate.state).weight;
                        let mut most = lock(&most);
                        *most = (*most).max(weight);
                        drop(most);
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                });
            }
        });
        let mut started = started.into_inner().unwrap();
        assert_eq!(started[0], 3, "the heaviest case starts first");
        let most = most.into_inner().unwrap();
        assert!(most <= 10, "cases weighing {most} ran at once, more than the heaviest (10)");
        started.sort_unstable();
        assert_eq!(started, (0..weights.len()).collect::<Vec<_>>());
        let state = gate.state.into_inner().unwrap();
        assert_eq!((state.running, state.weight), (0, 0));
    }
}
