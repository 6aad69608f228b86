//! The ratchet: recorded floors of each family's mean accuracy (over every case and over its
//! test cases), of its number of test cases, of its ranking groups' mean Kendall tau, and of
//! each case's accuracy (`data/validation/bounds.toml`). Checking fails when a family's mean or
//! test mean drops below its floor, its test cases become fewer, its mean tau falls, or a case
//! drops more than [`CASE_SLACK`] below its record; updating only raises floors.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::case::CaseError;
use crate::report::Report;
use crate::run::Status;

/// How far (accuracy, as a fraction) a case may fall below its recorded accuracy.
pub const CASE_SLACK: f64 = 0.03;

/// Recorded floors.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bounds {
    /// Floor of each family's mean accuracy, by family id.
    #[serde(default)]
    pub family: BTreeMap<String, FamilyBound>,
    /// Recorded accuracy of each case, by `family/case`.
    #[serde(default)]
    pub case: BTreeMap<String, f64>,
}

/// One family's floor.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FamilyBound {
    /// Mean accuracy over every case, a fraction.
    pub mean: f64,
    /// Mean accuracy over the test cases (the headline), a fraction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_mean: Option<f64>,
    /// Test cases that ran: the count may not fall, so a case cannot leave the headline by
    /// becoming calibration (or pending) unnoticed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_cases: Option<usize>,
    /// Mean Kendall tau over the family's ranking groups: the measured order of its
    /// configurations may not be reproduced worse (checked when the whole family ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranking_tau: Option<f64>,
}

/// One broken bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// The family or case.
    pub id: String,
    /// What happened.
    pub message: String,
}

/// Each family's mean Kendall tau over its ranking groups, by family id.
fn family_taus(report: &Report) -> BTreeMap<&str, f64> {
    report.family_kendall_taus().into_iter().map(|(family, _, tau)| (family, tau)).collect()
}

/// Rounds a fraction down to 3 decimals, so a floor never exceeds what was measured.
fn floor3(value: f64) -> f64 {
    (value * 1000.0).floor() / 1000.0
}

impl Bounds {
    /// Reads `path`; a missing file is an empty record.
    pub fn load(path: &Path) -> Result<Bounds, CaseError> {
        if !path.exists() {
            return Ok(Bounds::default());
        }
        let text = fs_err::read_to_string(path)
            .map_err(|e| CaseError::Read { path: path.to_path_buf(), message: e.to_string() })?;
        toml::from_str(&text).map_err(|e| CaseError::Format {
            file: path.to_path_buf(),
            key: String::new(),
            message: e.to_string(),
        })
    }

    /// The bounds `report` breaks. Only families and cases in the report are checked, so a
    /// run of some families checks those; a recorded case missing from `suite_cases` (every
    /// case id of the suite) breaks its record whatever ran.
    pub fn check(&self, report: &Report, suite_cases: &BTreeSet<String>) -> Vec<Violation> {
        let mut violations = Vec::new();
        let taus = family_taus(report);
        for family in &report.families {
            let Some(bound) = self.family.get(&family.id) else { continue };
            match family.stats.mean {
                Some(mean) if mean + 1e-9 >= bound.mean => {}
                Some(mean) => violations.push(Violation {
                    id: family.id.clone(),
                    message: format!(
                        "mean accuracy {:.1}% is below its floor {:.1}%",
                        100.0 * mean,
                        100.0 * bound.mean
                    ),
                }),
                None => violations.push(Violation {
                    id: family.id.clone(),
                    message: format!("no case ran; the floor is {:.1}%", 100.0 * bound.mean),
                }),
            }
            if let (Some(floor), Some(mean)) = (bound.test_mean, family.test.mean)
                && mean + 1e-9 < floor
            {
                violations.push(Violation {
                    id: family.id.clone(),
                    message: format!(
                        "test-case mean {:.1}% is below its floor {:.1}%",
                        100.0 * mean,
                        100.0 * floor
                    ),
                });
            }
            let prefix = format!("{}/", family.id);
            let in_suite = suite_cases.iter().filter(|id| id.starts_with(&prefix)).count();
            let selected = family.stats.ran + family.stats.pending + family.stats.failed;
            if let Some(floor) = bound.ranking_tau
                && selected == in_suite
            {
                match taus.get(family.id.as_str()).copied() {
                    Some(tau) if tau + 1e-9 >= floor => {}
                    Some(tau) => violations.push(Violation {
                        id: family.id.clone(),
                        message: format!(
                            "mean Kendall tau {tau:+.3} of its ranking groups is below its floor {floor:+.3}"
                        ),
                    }),
                    None => violations.push(Violation {
                        id: family.id.clone(),
                        message: format!("no ranking group ran; its mean Kendall tau's floor is {floor:+.3}"),
                    }),
                }
            }
            // Counted only when the whole family ran: a run of some of its cases has fewer.
            if let Some(recorded) = bound.test_cases
                && selected == in_suite
                && family.test.ran < recorded
            {
                violations.push(Violation {
                    id: family.id.clone(),
                    message: format!(
                        "{} test case(s) ran, fewer than the {recorded} recorded: a case left the headline (it became calibration, pending or failed)",
                        family.test.ran
                    ),
                });
            }
        }
        for case in &report.cases {
            let Some(&recorded) = self.case.get(&case.id) else { continue };
            let problem = match (&case.status, case.accuracy) {
                (Status::Ok, Some(accuracy)) if accuracy + CASE_SLACK + 1e-9 >= recorded => continue,
                (Status::Ok, Some(accuracy)) => format!(
                    "accuracy {:.1}% fell more than {:.0} points below its record {:.1}%",
                    100.0 * accuracy,
                    100.0 * CASE_SLACK,
                    100.0 * recorded
                ),
                (Status::Ok, None) => {
                    format!("ran before ({:.1}%) but has no accuracy now", 100.0 * recorded)
                }
                (Status::Pending { reason }, _) => {
                    format!("ran before ({:.1}%) but is now pending: {reason}", 100.0 * recorded)
                }
                (Status::Failed { error }, _) => {
                    format!("ran before ({:.1}%) but now fails: {error}", 100.0 * recorded)
                }
            };
            violations.push(Violation { id: case.id.clone(), message: problem });
        }
        for id in self.case.keys().filter(|id| !suite_cases.contains(*id)) {
            violations.push(Violation {
                id: id.clone(),
                message: "has a record but is no longer in the suite (a case is never dropped)".into(),
            });
        }
        violations
    }

    /// These bounds raised to what `report` measured (never lowered).
    pub fn raised(&self, report: &Report) -> Bounds {
        let mut bounds = self.clone();
        let taus = family_taus(report);
        for family in &report.families {
            if let Some(mean) = family.stats.mean {
                let entry = bounds.family.entry(family.id.clone()).or_insert(FamilyBound {
                    mean: 0.0,
                    test_mean: None,
                    test_cases: None,
                    ranking_tau: None,
                });
                if let Some(&tau) = taus.get(family.id.as_str()) {
                    entry.ranking_tau = Some(entry.ranking_tau.unwrap_or(-1.0).max(floor3(tau)));
                }
                entry.mean = entry.mean.max(floor3(mean));
                if let Some(test) = family.test.mean {
                    entry.test_mean = Some(entry.test_mean.unwrap_or(0.0).max(floor3(test)));
                }
                entry.test_cases = Some(entry.test_cases.unwrap_or(0).max(family.test.ran));
            }
        }
        for case in &report.cases {
            if let (Status::Ok, Some(accuracy)) = (&case.status, case.accuracy) {
                let entry = bounds.case.entry(case.id.clone()).or_insert(0.0);
                *entry = entry.max(floor3(accuracy));
            }
        }
        bounds
    }

    /// The file's text.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).unwrap_or_default();
        format!(
            "# Floors of the validation suite's accuracy (fractions), written by\n\
             # `parasim validate --update-bounds`, which only raises them. Checked by\n\
             # `parasim validate --check-bounds` and the CI test: a family's mean and test-case mean\n\
             # may not fall below their floors nor its test cases become fewer nor its ranking groups'\n\
             # mean Kendall tau fall, a case may not fall more than {:.0} points below its record.\n\
             # Lowering one is an edit by hand with its reason in docs/validation.md.\n\n{body}",
            100.0 * CASE_SLACK
        )
    }
}
