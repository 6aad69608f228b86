//! Choosing and running cases in parallel.

use rayon::prelude::*;

use crate::case::{CaseEntry, Family, Paths};
use crate::report::Report;
use crate::run::{CaseResult, run_case};

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

/// Runs `chosen` on every core, calling `done` after each case (from any thread), and
/// returns the report in suite order whatever the thread count.
pub fn run(
    families: &[Family],
    chosen: &[(&Family, &CaseEntry)],
    paths: &Paths,
    done: &(dyn Fn(&CaseResult) + Sync),
) -> Report {
    let results: Vec<CaseResult> = chosen
        .par_iter()
        .map(|(family, case)| {
            let result = run_case(family, case, paths);
            done(&result);
            result
        })
        .collect();
    let headers: Vec<(String, String, String)> = families
        .iter()
        .map(|f| (f.header.id.clone(), f.header.title.clone(), f.header.source.clone()))
        .collect();
    Report::new(results, &headers)
}
