//! The suite's statistics and how they are printed: per case, per family, overall, and the
//! ranking agreement of strategy comparisons.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::ledger::Role;
use crate::run::{CaseResult, Status};

/// Accuracy statistics of a set of cases that ran.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Stats {
    /// Cases that ran and were compared.
    pub ran: usize,
    /// Cases pending (not runnable yet).
    pub pending: usize,
    /// Cases that failed to run.
    pub failed: usize,
    /// Mean accuracy of the cases that ran.
    pub mean: Option<f64>,
    /// Median accuracy.
    pub median: Option<f64>,
    /// The least accurate case: (id, accuracy).
    pub worst: Option<(String, f64)>,
}

impl Stats {
    /// True if no case was selected: none ran, none pending, none failed.
    pub fn is_empty(&self) -> bool {
        self.ran + self.pending + self.failed == 0
    }

    /// The statistics of `results`.
    pub fn of<'a>(results: impl IntoIterator<Item = &'a CaseResult>) -> Stats {
        let mut ran = Vec::new();
        let (mut pending, mut failed) = (0, 0);
        for result in results {
            match (&result.status, result.accuracy) {
                (Status::Ok, Some(accuracy)) => ran.push((result.id.as_str(), accuracy)),
                (Status::Pending { .. }, _) => pending += 1,
                _ => failed += 1,
            }
        }
        let mut sorted: Vec<f64> = ran.iter().map(|&(_, a)| a).collect();
        sorted.sort_by(f64::total_cmp);
        let median = match sorted.len() {
            0 => None,
            n if n % 2 == 1 => Some(sorted[n / 2]),
            n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
        };
        let mean = (!sorted.is_empty()).then(|| sorted.iter().sum::<f64>() / sorted.len() as f64);
        let worst = ran.iter().min_by(|a, b| a.1.total_cmp(&b.1)).map(|&(id, a)| (id.to_string(), a));
        Stats { ran: ran.len(), pending, failed, mean, median, worst }
    }
}

/// A strategy comparison: cases of one ranking group, measured order against simulated.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Ranking {
    /// The group.
    pub group: String,
    /// The family its cases belong to.
    pub family: String,
    /// Case ids, fastest first by measurement: by how many others each was measured faster
    /// than ([`measured_difference`]), then by its measured value.
    pub measured_order: Vec<String>,
    /// Case ids, fastest first by simulation.
    pub simulated_order: Vec<String>,
    /// Kendall's tau-b between the two (1: same order, -1: reversed).
    pub kendall_tau: f64,
    /// Cases of the group that did not run (pending or failed), left out of the ranking.
    pub not_ranked: usize,
}

/// Kendall's tau-b of paired values (ties in either count as neither concordant nor
/// discordant); 1 for fewer than two pairs.
pub fn kendall_tau(pairs: &[(f64, f64)]) -> f64 {
    kendall_tau_of(pairs.len(), |i, j| (pairs[i].0 - pairs[j].0, pairs[i].1 - pairs[j].1))
}

/// Kendall's tau-b over `n` items whose pairwise orders `order(i, j)` gives (for `i < j`) as two
/// signed differences, the first ranking's and the second's; a zero is a tie. Each pair may be
/// compared on its own terms (two cases in the environments both were measured in), which a
/// single value per item cannot express.
pub fn kendall_tau_of(n: usize, order: impl Fn(usize, usize) -> (f64, f64)) -> f64 {
    let (mut concordant, mut discordant, mut ties_x, mut ties_y) = (0i64, 0i64, 0i64, 0i64);
    for i in 0..n {
        for j in i + 1..n {
            let (dx, dy) = order(i, j);
            match (dx == 0.0, dy == 0.0) {
                (true, true) => {}
                (true, false) => ties_x += 1,
                (false, true) => ties_y += 1,
                (false, false) if dx.signum() == dy.signum() => concordant += 1,
                _ => discordant += 1,
            }
        }
    }
    let n0 = (concordant + discordant + ties_x) as f64;
    let n1 = (concordant + discordant + ties_y) as f64;
    if n0 == 0.0 || n1 == 0.0 {
        return 1.0;
    }
    (concordant - discordant) as f64 / (n0 * n1).sqrt()
}

/// How much slower `a` was measured than `b`, as a signed log ratio: the median over the
/// environments both were measured in (`measured-in`), so that the two are compared on the
/// same cluster and container; their medians' ratio when they share none.
pub fn measured_difference(a: &CaseResult, b: &CaseResult) -> f64 {
    let mut shared: Vec<f64> = a
        .measured_in
        .iter()
        .filter_map(|(environment, x)| b.measured_in.get(environment).map(|y| (x / y).ln()))
        .collect();
    match crate::calibration::median(&mut shared) {
        Some(difference) => difference,
        None => (a.measured.unwrap_or_default() / b.measured.unwrap_or_default()).ln(),
    }
}

/// Every ranking group of `results`.
pub fn rankings(results: &[CaseResult]) -> Vec<Ranking> {
    let mut groups: BTreeMap<&str, Vec<&CaseResult>> = BTreeMap::new();
    for result in results {
        if let Some(group) = &result.ranking {
            groups.entry(group.as_str()).or_default().push(result);
        }
    }
    groups
        .into_iter()
        .filter_map(|(group, members)| {
            let ran: Vec<&CaseResult> =
                members.iter().copied().filter(|r| r.measured.is_some() && r.simulated.is_some()).collect();
            if ran.len() < 2 {
                return None;
            }
            let faster_than: Vec<usize> = (0..ran.len())
                .map(|i| (0..ran.len()).filter(|&j| measured_difference(ran[i], ran[j]) < 0.0).count())
                .collect();
            let mut measured_order: Vec<usize> = (0..ran.len()).collect();
            measured_order.sort_by(|&a, &b| {
                faster_than[b]
                    .cmp(&faster_than[a])
                    .then(ran[a].measured.unwrap_or_default().total_cmp(&ran[b].measured.unwrap_or_default()))
                    .then(ran[a].id.cmp(&ran[b].id))
            });
            let simulated = |r: &CaseResult| r.simulated.unwrap_or_default();
            let mut simulated_order = ran.clone();
            simulated_order.sort_by(|a, b| simulated(a).total_cmp(&simulated(b)).then(a.id.cmp(&b.id)));
            Some(Ranking {
                group: group.to_string(),
                family: ran[0].family.clone(),
                measured_order: measured_order.into_iter().map(|i| ran[i].id.clone()).collect(),
                simulated_order: simulated_order.iter().map(|r| r.id.clone()).collect(),
                kendall_tau: kendall_tau_of(ran.len(), |i, j| {
                    (measured_difference(ran[i], ran[j]), simulated(ran[i]) - simulated(ran[j]))
                }),
                not_ranked: members.len() - ran.len(),
            })
        })
        .collect()
}

/// One family's summary.
#[derive(Debug, Clone, Serialize)]
pub struct FamilySummary {
    /// The family id.
    pub id: String,
    /// Its title.
    pub title: String,
    /// Its source.
    pub source: String,
    /// Its accuracy statistics, every case.
    #[serde(flatten)]
    pub stats: Stats,
    /// Over its test cases only: the ones no declared constant was fitted on.
    pub test: Stats,
    /// Over its calibration cases only.
    pub calibration: Stats,
}

/// Another model against parasim on the cases of one family it predicted (and parasim ran).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ModelComparison {
    /// The family.
    pub family: String,
    /// The other model, as the case files name it.
    pub model: String,
    /// Cases both predicted.
    pub cases: usize,
    /// The other model's mean accuracy on them.
    pub model_mean: f64,
    /// parasim's mean accuracy on the same cases.
    pub parasim_mean: f64,
}

/// Every (family, model) pair of `results`' published predictions, over the cases that ran.
pub fn comparisons(results: &[CaseResult]) -> Vec<ModelComparison> {
    let mut pairs: BTreeMap<(&str, &str), (usize, f64, f64)> = BTreeMap::new();
    for result in results {
        let (Status::Ok, Some(parasim)) = (&result.status, result.accuracy) else { continue };
        for prediction in &result.predictions {
            let entry = pairs.entry((result.family.as_str(), prediction.model.as_str())).or_default();
            entry.0 += 1;
            entry.1 += prediction.accuracy;
            entry.2 += parasim;
        }
    }
    pairs
        .into_iter()
        .map(|((family, model), (cases, model_sum, parasim_sum))| ModelComparison {
            family: family.to_string(),
            model: model.to_string(),
            cases,
            model_mean: model_sum / cases as f64,
            parasim_mean: parasim_sum / cases as f64,
        })
        .collect()
}

/// The whole run: every case, every family, overall, rankings.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Every case, in suite order.
    pub cases: Vec<CaseResult>,
    /// Every family that had a case selected.
    pub families: Vec<FamilySummary>,
    /// Every ranking group with at least two cases that ran.
    pub rankings: Vec<Ranking>,
    /// Other models' published predictions against parasim, per family and model.
    pub comparisons: Vec<ModelComparison>,
    /// Over every case that ran.
    pub overall: Stats,
    /// Over every test case: the headline.
    pub test: Stats,
    /// Over every calibration case.
    pub calibration: Stats,
    /// The mean of the ranking groups' Kendall tau.
    pub mean_kendall_tau: Option<f64>,
    /// The mean of the families' test means (families with a test case that ran): each source
    /// weighs the same, however many cases it has.
    pub test_family_mean: Option<f64>,
}

impl Report {
    /// Summarizes `cases` of `families` (id, title, source).
    pub fn new(cases: Vec<CaseResult>, families: &[(String, String, String)]) -> Report {
        let summaries: Vec<FamilySummary> = families
            .iter()
            .filter(|(id, ..)| cases.iter().any(|c| &c.family == id))
            .map(|(id, title, source)| FamilySummary {
                id: id.clone(),
                title: title.clone(),
                source: source.clone(),
                stats: Stats::of(cases.iter().filter(|c| &c.family == id)),
                test: Stats::of(cases.iter().filter(|c| &c.family == id && c.role.is_test())),
                calibration: Stats::of(cases.iter().filter(|c| &c.family == id && !c.role.is_test())),
            })
            .collect();
        let rankings = rankings(&cases);
        let comparisons = comparisons(&cases);
        let overall = Stats::of(&cases);
        let test = Stats::of(cases.iter().filter(|c| c.role.is_test()));
        let calibration = Stats::of(cases.iter().filter(|c| !c.role.is_test()));
        let mean_kendall_tau = mean(rankings.iter().map(|r| r.kendall_tau));
        let test_family_mean = mean(summaries.iter().filter_map(|f| f.test.mean));
        Report {
            cases,
            families: summaries,
            rankings,
            comparisons,
            overall,
            test,
            calibration,
            mean_kendall_tau,
            test_family_mean,
        }
    }

    /// The human table: one row per case (per point too with `points`; its source under it
    /// with `sources`), each family headed by its source, then families, rankings, overall,
    /// and pending/failed cases with their reasons.
    pub fn text(&self, points: bool, sources: bool) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<46} {:>6} {:<22} {:>11} {:>11} {:>8} {:>8}",
            "case", "GPUs", "what ran", "measured", "simulated", "error", "accuracy"
        );
        let mut family = "";
        for case in &self.cases {
            if case.family != family {
                family = &case.family;
                let _ = writeln!(out, "{family}");
                if let Some(summary) = self.families.iter().find(|f| f.id == case.family) {
                    let _ = writeln!(out, "  source: {}", summary.source);
                }
            }
            let short = case.id.strip_prefix(&format!("{}/", case.family)).unwrap_or(&case.id);
            let gpus = case.gpus.map_or("-".to_string(), |g| g.to_string());
            match &case.status {
                Status::Ok => {
                    let _ = writeln!(
                        out,
                        "  {:<44} {:>6} {:<22} {:>11} {:>11} {:>8} {:>8}{}",
                        short,
                        gpus,
                        truncate(&case.strategy, 22),
                        value(case.measured, &case.unit),
                        value(case.simulated, &case.unit),
                        case.error.map_or("-".into(), |e| format!("{:+.1}%", 100.0 * e)),
                        case.accuracy.map_or("-".into(), |a| format!("{:.1}%", 100.0 * a)),
                        if case.role.is_test() { "" } else { "  calibration" },
                    );
                    if points && case.points.len() > 1 {
                        for point in &case.points {
                            let _ = writeln!(
                                out,
                                "    {:<42} {:>6} {:<22} {:>11} {:>11} {:>8} {:>8}",
                                truncate(&point.label, 42),
                                "",
                                "",
                                value(Some(point.measured), &case.unit),
                                value(Some(point.simulated), &case.unit),
                                format!(
                                    "{:+.1}%",
                                    100.0 * (point.simulated - point.measured) / point.measured
                                ),
                                format!("{:.1}%", 100.0 * point.accuracy),
                            );
                        }
                    }
                }
                Status::Pending { .. } => {
                    let _ = writeln!(out, "  {:<44} {:>6} {:<22} {:>11}", short, gpus, "", "pending");
                }
                Status::Failed { .. } => {
                    let _ = writeln!(out, "  {:<44} {:>6} {:<22} {:>11}", short, gpus, "", "FAILED");
                }
            }
            if sources {
                let _ = writeln!(out, "      source: {}", case.source);
            }
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "test cases: no declared constant was fitted on them (the headline)");
        let _ = writeln!(
            out,
            "{:<28} {:>4} {:>8} {:>7} {:>8} {:>8}  worst case",
            "family", "ran", "pending", "failed", "mean", "median"
        );
        for family in &self.families {
            let _ = writeln!(out, "{}", stats_row(&family.id, &family.test));
        }
        let _ = writeln!(out, "{}", stats_row("overall (test)", &self.test));
        if let Some(mean) = self.test_family_mean {
            let counted = self.families.iter().filter(|f| f.test.mean.is_some()).count();
            let _ = writeln!(
                out,
                "{:<28} {:>4} {:>8} {:>7} {:>7.1}%  (each family weighs the same)",
                "mean of family means",
                counted,
                "",
                "",
                100.0 * mean
            );
        }
        if !self.calibration.is_empty() {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "calibration cases: a declared constant was fitted on them (data/validation/fitted.toml)"
            );
            for family in &self.families {
                let stats = &family.calibration;
                if !stats.is_empty() {
                    let _ = writeln!(out, "{}", stats_row(&family.id, stats));
                }
            }
            let _ = writeln!(out, "{}", stats_row("overall (calibration)", &self.calibration));
            let _ = writeln!(out, "{}", stats_row("every case", &self.overall));
        }
        if !self.rankings.is_empty() {
            let _ = writeln!(out);
            let _ = writeln!(out, "strategy rankings (fastest first)   Kendall tau");
            for ranking in &self.rankings {
                let _ = writeln!(out, "  {:<33} {:>+5.2}", ranking.group, ranking.kendall_tau);
                let _ = writeln!(out, "    measured  {}", order(&ranking.measured_order));
                let _ = writeln!(out, "    simulated {}", order(&ranking.simulated_order));
                if ranking.not_ranked > 0 {
                    let _ = writeln!(out, "    ({} case(s) of the group did not run)", ranking.not_ranked);
                }
            }
            for (family, count, tau) in self.family_kendall_taus().into_iter().filter(|f| f.1 > 1) {
                let _ = writeln!(out, "  {:<33} {:>+5.2}", format!("mean of {family}'s {count} groups"), tau);
            }
            if let Some(tau) = self.mean_kendall_tau {
                let _ = writeln!(
                    out,
                    "  {:<33} {:>+5.2}",
                    format!("mean of {} groups", self.rankings.len()),
                    tau
                );
            }
        }
        if !self.comparisons.is_empty() {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "{:<48} {:>5} {:>8} {:>8}",
                "other models on the same cases (published)", "cases", "model", "parasim"
            );
            for c in &self.comparisons {
                let _ = writeln!(
                    out,
                    "  {:<46} {:>5} {:>7.1}% {:>7.1}%",
                    truncate(&format!("{}: {}", c.family, c.model), 46),
                    c.cases,
                    100.0 * c.model_mean,
                    100.0 * c.parasim_mean
                );
            }
        }
        let failed: Vec<&CaseResult> =
            self.cases.iter().filter(|c| matches!(c.status, Status::Failed { .. })).collect();
        if !failed.is_empty() {
            let _ = writeln!(out);
            let _ = writeln!(out, "failed");
            for case in failed {
                if let Status::Failed { error } = &case.status {
                    let _ = writeln!(out, "  {}: {error}", case.id);
                }
            }
        }
        let mut reasons: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for case in &self.cases {
            if let Status::Pending { reason } = &case.status {
                reasons.entry(reason.as_str()).or_default().push(case.id.as_str());
            }
        }
        if !reasons.is_empty() {
            let _ = writeln!(out);
            let _ = writeln!(out, "pending");
            for (reason, ids) in reasons {
                let shown = if ids.len() > 3 {
                    format!("{}, {} and {} more", ids[0], ids[1], ids.len() - 2)
                } else {
                    ids.join(", ")
                };
                let _ = writeln!(out, "  {} case(s): {reason}\n    ({shown})", ids.len());
            }
        }
        out
    }

    /// The report as Markdown: the summary table, then one table per family (its source,
    /// caveats, cases and pending reasons), then the strategy rankings. docs/validation.md
    /// holds this between markers, rewritten by `parasim validate --write-doc`.
    pub fn markdown(&self, caveats: &BTreeMap<String, Vec<String>>) -> String {
        let mut out = self.summary_markdown();
        let percent = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}%", 100.0 * v));
        for family in &self.families {
            let _ = writeln!(out, "\n### {}\n\n{}.\nSource: {}.\n", family.id, family.title, family.source);
            if let Some(notes) = caveats.get(&family.id)
                && !notes.is_empty()
            {
                for note in notes {
                    let _ = writeln!(out, "- {note}");
                }
                let _ = writeln!(out);
            }
            let cases: Vec<&CaseResult> = self.cases.iter().filter(|c| c.family == family.id).collect();
            let ran: Vec<&&CaseResult> =
                cases.iter().filter(|c| !matches!(c.status, Status::Pending { .. })).collect();
            if !ran.is_empty() {
                let _ = writeln!(
                    out,
                    "| case | GPUs | what ran | measured | simulated | error | accuracy | role |"
                );
                let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
                for case in ran {
                    let short = case.id.rsplit('/').next().unwrap_or(&case.id);
                    let gpus = case.gpus.map_or("-".to_string(), |g| g.to_string());
                    match &case.status {
                        Status::Failed { error } => {
                            let error = error.lines().next().unwrap_or_default().replace('|', "/");
                            let _ = writeln!(out, "| {short} | {gpus} | | failed: {error} | | | | |");
                        }
                        _ => {
                            let _ = writeln!(
                                out,
                                "| {short} | {gpus} | {} | {} | {} | {} | {} | {} |",
                                case.strategy,
                                value(case.measured, &case.unit),
                                value(case.simulated, &case.unit),
                                case.error.map_or("-".into(), |e| format!("{:+.1}%", 100.0 * e)),
                                percent(case.accuracy),
                                match &case.role {
                                    Role::Test => "test".to_string(),
                                    Role::Calibration(by) => format!("calibration ({})", by.join(", ")),
                                }
                            );
                        }
                    }
                }
            }
            for comparison in self.comparisons.iter().filter(|c| c.family == family.id) {
                let _ = writeln!(
                    out,
                    "\n{} (published predictions) on the same {} case(s): mean accuracy {}, parasim {}.\n",
                    comparison.model,
                    comparison.cases,
                    percent(Some(comparison.model_mean)),
                    percent(Some(comparison.parasim_mean))
                );
                let _ =
                    writeln!(out, "| case | measured | {} | its accuracy | parasim's |", comparison.model);
                let _ = writeln!(out, "|---|---|---|---|---|");
                for case in cases.iter().filter(|c| matches!(c.status, Status::Ok)) {
                    if let Some(p) = case.predictions.iter().find(|p| p.model == comparison.model) {
                        let _ = writeln!(
                            out,
                            "| {} | {} | {} | {} | {} |",
                            case.id.rsplit('/').next().unwrap_or(&case.id),
                            value(case.measured, &case.unit),
                            value(Some(p.value), &case.unit),
                            percent(Some(p.accuracy)),
                            percent(case.accuracy)
                        );
                    }
                }
            }
            let mut reasons: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for case in &cases {
                if let Status::Pending { reason } = &case.status {
                    reasons
                        .entry(reason.as_str())
                        .or_default()
                        .push(case.id.rsplit('/').next().unwrap_or(&case.id));
                }
            }
            if !reasons.is_empty() {
                let _ = writeln!(out, "\nPending:\n");
                for (reason, ids) in reasons {
                    let _ = writeln!(out, "- {} case(s), {reason}: {}", ids.len(), ids.join(", "));
                }
            }
            if !cases.is_empty() {
                let _ =
                    writeln!(out, "\n<details><summary>Sources of the {} case(s)</summary>\n", cases.len());
                for case in &cases {
                    let short = case.id.rsplit('/').next().unwrap_or(&case.id);
                    let _ = writeln!(out, "- {short}: {}", case.source);
                }
                let _ = writeln!(out, "\n</details>");
            }
        }
        if !self.rankings.is_empty() {
            let _ = writeln!(out, "\n### Strategy rankings\n");
            let _ =
                writeln!(out, "| group | measured, fastest first | simulated, fastest first | Kendall tau |");
            let _ = writeln!(out, "|---|---|---|---|");
            for ranking in &self.rankings {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:+.2} |",
                    ranking.group,
                    order(&ranking.measured_order),
                    order(&ranking.simulated_order),
                    ranking.kendall_tau
                );
            }
            for (family, count, tau) in self.family_kendall_taus().into_iter().filter(|f| f.1 > 1) {
                let _ = writeln!(out, "| mean of {family}'s {count} groups | | | {tau:+.2} |");
            }
            if let Some(tau) = self.mean_kendall_tau {
                let _ = writeln!(out, "| **mean of {} groups** | | | {tau:+.2} |", self.rankings.len());
            }
        }
        out
    }

    /// Each family with a ranking group: its group count and mean Kendall tau.
    pub fn family_kendall_taus(&self) -> Vec<(&str, usize, f64)> {
        let mut families: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for ranking in &self.rankings {
            families.entry(ranking.family.as_str()).or_default().push(ranking.kendall_tau);
        }
        families
            .into_iter()
            .map(|(family, taus)| (family, taus.len(), taus.iter().sum::<f64>() / taus.len() as f64))
            .collect()
    }

    /// The summary table as Markdown: per family its test cases (the headline) beside its
    /// calibration cases, then the totals, and the rule in one sentence above it. The README's
    /// accuracy table and docs/validation.md hold it, rewritten by `parasim validate
    /// --write-doc`.
    pub fn summary_markdown(&self) -> String {
        let mut out = String::new();
        let percent = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}%", 100.0 * v));
        let worst = |stats: &Stats| {
            stats.worst.as_ref().map_or("-".to_string(), |(w, a)| format!("{w} ({:.1}%)", 100.0 * a))
        };
        let _ = writeln!(
            out,
            "Test cases are the headline; a case that a declared constant was fitted on (data/validation/fitted.toml) is a calibration case, shown apart and never in the test figures.\n"
        );
        let _ = writeln!(
            out,
            "| family | test cases | test mean | test median | worst test case | calibration cases | calibration mean | pending | failed |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
        let totals = [("**overall**", &self.test, &self.calibration, &self.overall)];
        for (id, test, calibration, all) in
            self.families.iter().map(|f| (f.id.as_str(), &f.test, &f.calibration, &f.stats)).chain(totals)
        {
            let _ = writeln!(
                out,
                "| {id} | {} | {} | {} | {} | {} | {} | {} | {} |",
                test.ran,
                percent(test.mean),
                percent(test.median),
                worst(test),
                calibration.ran,
                percent(calibration.mean),
                all.pending,
                all.failed
            );
        }
        if let Some(mean) = self.test_family_mean {
            let counted = self.families.iter().filter(|f| f.test.mean.is_some()).count();
            let _ = writeln!(
                out,
                "\nThe overall test mean weighs every case the same; the mean of the {counted} families' test means, each source weighing the same, is {}.",
                percent(Some(mean))
            );
        }
        out
    }

    /// One CSV row per case (per point with `points`), RFC 4180 quoting.
    pub fn csv(&self, points: bool) -> String {
        let mut out = String::from(
            "id,family,kind,source,gpus,what_ran,status,role,point,unit,measured,simulated,error,accuracy,reason\n",
        );
        for case in &self.cases {
            let reason = match &case.status {
                Status::Ok => String::new(),
                Status::Pending { reason } => reason.clone(),
                Status::Failed { error } => error.clone(),
            };
            let status = match case.status {
                Status::Ok => "ok",
                Status::Pending { .. } => "pending",
                Status::Failed { .. } => "failed",
            };
            let number = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v}"));
            let mut row = |point: &str, measured: Option<f64>, simulated: Option<f64>, error, accuracy| {
                let fields = [
                    case.id.clone(),
                    case.family.clone(),
                    case.kind.to_string(),
                    case.source.clone(),
                    case.gpus.map_or(String::new(), |g| g.to_string()),
                    case.strategy.clone(),
                    status.to_string(),
                    case.role.name().to_string(),
                    point.to_string(),
                    case.unit.clone(),
                    number(measured),
                    number(simulated),
                    number(error),
                    number(accuracy),
                    reason.clone(),
                ];
                out.push_str(&scenario::csv_text::line(&fields));
            };
            if points && case.points.len() > 1 {
                for p in &case.points {
                    let error = (p.simulated - p.measured) / p.measured;
                    row(&p.label, Some(p.measured), Some(p.simulated), Some(error), Some(p.accuracy));
                }
            } else {
                row("", case.measured, case.simulated, case.error, case.accuracy);
            }
        }
        out
    }
}

/// The mean of `values`; `None` for none.
fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, count) = values.fold((0.0, 0usize), |(sum, count), v| (sum + v, count + 1));
    (count > 0).then(|| sum / count as f64)
}

/// "a < b < c": case ids without their family, fastest first.
fn order(ids: &[String]) -> String {
    ids.iter().map(|id| id.rsplit('/').next().unwrap_or(id)).collect::<Vec<_>>().join(" < ")
}

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        let kept: String = text.chars().take(width.saturating_sub(1)).collect();
        format!("{kept}~")
    }
}

/// A value in its unit, short: seconds as s/ms/us, fractions as percentages, memory in its
/// unit.
fn value(value: Option<f64>, unit: &str) -> String {
    let Some(v) = value else { return "-".into() };
    match unit {
        "fraction" => format!("{:.1}%", 100.0 * v),
        "ms" => format!("{v:.2} ms"),
        "GB" | "GiB" => format!("{v:.2} {unit}"),
        _ if v >= 1.0 => format!("{v:.2} s"),
        _ if v >= 1e-3 => format!("{:.2} ms", v * 1e3),
        _ => format!("{:.1} us", v * 1e6),
    }
}

fn stats_row(label: &str, stats: &Stats) -> String {
    let percent = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.1}%", 100.0 * v));
    let worst = stats.worst.as_ref().map_or(String::new(), |(id, a)| format!("{id} ({:.1}%)", 100.0 * a));
    format!(
        "{:<28} {:>4} {:>8} {:>7} {:>8} {:>8}  {worst}",
        label,
        stats.ran,
        stats.pending,
        stats.failed,
        percent(stats.mean),
        percent(stats.median)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::Point;

    fn case(id: &str, status: Status, measured: f64, simulated: f64, ranking: Option<&str>) -> CaseResult {
        let accuracy = crate::run::accuracy(simulated, measured);
        CaseResult {
            id: format!("f/{id}"),
            family: "f".into(),
            kind: "iteration",
            source: "t".into(),
            unit: "s/iter".into(),
            gpus: Some(8),
            strategy: "DP8".into(),
            status,
            measured: Some(measured),
            simulated: Some(simulated),
            error: Some((simulated - measured) / measured),
            accuracy: Some(accuracy),
            points: vec![Point { label: "x".into(), measured, simulated, accuracy }],
            caveats: vec![],
            ranking: ranking.map(String::from),
            measured_in: BTreeMap::new(),
            role: Role::Test,
            predictions: vec![],
            wall_s: 0.0,
        }
    }

    fn predicted(mut result: CaseResult, model: &str, value: f64) -> CaseResult {
        let accuracy = crate::run::accuracy(value, result.measured.unwrap());
        result.predictions.push(crate::run::PredictionResult { model: model.into(), value, accuracy });
        result
    }

    #[test]
    fn other_models_are_compared_on_the_cases_both_ran() {
        let results = vec![
            // parasim 90%, oracle 50% (2.0 against 4.0 measured).
            predicted(case("a", Status::Ok, 4.0, 3.6, None), "oracle", 2.0),
            // parasim 100%, oracle 80%.
            predicted(case("b", Status::Ok, 1.0, 1.0, None), "oracle", 0.8),
            // Not run by parasim: left out of both means.
            predicted(case("c", Status::Pending { reason: "later".into() }, 1.0, 1.0, None), "oracle", 1.0),
            // No prediction: parasim's 50% here is not in the comparison.
            case("d", Status::Ok, 1.0, 0.5, None),
        ];
        let comparisons = comparisons(&results);
        assert_eq!(comparisons.len(), 1);
        let c = &comparisons[0];
        assert_eq!((c.family.as_str(), c.model.as_str(), c.cases), ("f", "oracle", 2));
        assert!((c.model_mean - 0.65).abs() < 1e-12, "{c:?}");
        assert!((c.parasim_mean - 0.95).abs() < 1e-12, "{c:?}");
        let report = Report::new(results, &[("f".into(), "F".into(), "S".into())]);
        let text = report.text(false, false);
        assert!(text.contains("  f: oracle") && text.contains("65.0%") && text.contains("95.0%"), "{text}");
        let markdown = report.markdown(&BTreeMap::new());
        assert!(
            markdown.contains(
                "oracle (published predictions) on the same 2 case(s): mean accuracy 65.0%, parasim 95.0%."
            ),
            "{markdown}"
        );
        assert!(markdown.contains("| a | 4.00 s | 2.00 s | 50.0% | 90.0% |"), "{markdown}");
    }

    #[test]
    fn accuracy_is_floored_at_zero() {
        assert_eq!(crate::run::accuracy(1.0, 1.0), 1.0);
        assert!((crate::run::accuracy(0.9, 1.0) - 0.9).abs() < 1e-12);
        assert!((crate::run::accuracy(1.1, 1.0) - 0.9).abs() < 1e-12);
        assert_eq!(crate::run::accuracy(3.0, 1.0), 0.0);
    }

    #[test]
    fn stats_count_every_status_and_find_the_worst() {
        let results = vec![
            case("a", Status::Ok, 1.0, 0.9, None),
            case("b", Status::Ok, 1.0, 0.5, None),
            case("c", Status::Ok, 1.0, 1.0, None),
            case("d", Status::Pending { reason: "later".into() }, 1.0, 1.0, None),
            case("e", Status::Failed { error: "boom".into() }, 1.0, 1.0, None),
        ];
        let stats = Stats::of(&results);
        assert_eq!((stats.ran, stats.pending, stats.failed), (3, 1, 1));
        assert!((stats.mean.unwrap() - 0.8).abs() < 1e-12);
        assert!((stats.median.unwrap() - 0.9).abs() < 1e-12);
        assert_eq!(stats.worst.unwrap().0, "f/b");
    }

    /// Calibration cases leave the headline: the test statistics, per family and overall, and
    /// the mean of the families' test means are over test cases only; every case is still in
    /// `overall`.
    #[test]
    fn the_headline_is_over_test_cases_only() {
        let mut calibrated = case("a", Status::Ok, 1.0, 1.0, None);
        calibrated.role = Role::Calibration(vec!["fit".into()]);
        let mut other = case("x", Status::Ok, 1.0, 0.8, None);
        other.family = "g".into();
        other.id = "g/x".into();
        let results = vec![calibrated, case("b", Status::Ok, 1.0, 0.5, None), other];
        let families = [
            ("f".to_string(), "F".to_string(), "s".to_string()),
            ("g".to_string(), "G".to_string(), "s".to_string()),
        ];
        let report = Report::new(results, &families);
        assert_eq!((report.test.ran, report.calibration.ran, report.overall.ran), (2, 1, 3));
        assert!((report.test.mean.unwrap() - 0.65).abs() < 1e-12);
        assert!((report.families[0].test.mean.unwrap() - 0.5).abs() < 1e-12);
        assert!((report.families[0].calibration.mean.unwrap() - 1.0).abs() < 1e-12);
        // Family f's test mean 0.5 and g's 0.8 weigh the same.
        assert!((report.test_family_mean.unwrap() - 0.65).abs() < 1e-12);
        let summary = report.summary_markdown();
        assert!(
            summary.contains("| f | 1 | 50.0% | 50.0% | f/b (50.0%) | 1 | 100.0% | 0 | 0 |"),
            "{summary}"
        );
        assert!(summary.contains("| **overall** | 2 | 65.0% |"), "{summary}");
        let text = report.text(false, false);
        assert!(text.contains("100.0%  calibration"), "{text}");
        assert!(text.contains("overall (test)"), "{text}");
    }

    #[test]
    fn kendall_tau_of_known_orders() {
        assert_eq!(kendall_tau(&[(1.0, 10.0), (2.0, 20.0), (3.0, 30.0)]), 1.0);
        assert_eq!(kendall_tau(&[(1.0, 30.0), (2.0, 20.0), (3.0, 10.0)]), -1.0);
        // One swapped pair of three: (2 - 1) / 3.
        assert!((kendall_tau(&[(1.0, 1.0), (2.0, 3.0), (3.0, 2.0)]) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(kendall_tau(&[(1.0, 1.0)]), 1.0);
    }

    #[test]
    fn a_family_whose_ranking_worsens_breaks_its_tau_floor() {
        let families = vec![("f".to_string(), "t".to_string(), "s".to_string())];
        let suite: std::collections::BTreeSet<String> = ["f/a", "f/b", "f/c"].map(String::from).into();
        let run = |simulated: [f64; 3]| {
            let cases = ["a", "b", "c"]
                .iter()
                .zip([1.0, 2.0, 3.0])
                .zip(simulated)
                .map(|((id, measured), simulated)| case(id, Status::Ok, measured, simulated, Some("g")))
                .collect();
            Report::new(cases, &families)
        };
        let right = run([1.0, 2.0, 3.0]);
        let bounds = crate::bounds::Bounds::default().raised(&right);
        assert_eq!(bounds.family["f"].ranking_tau, Some(1.0));
        assert!(bounds.check(&right, &suite).is_empty());
        // b and c swapped, each within 30% of its measurement: tau 1/3.
        let swapped = run([1.0, 2.6, 2.5]);
        let violations = bounds.check(&swapped, &suite);
        assert!(
            violations.iter().any(|v| v.message.contains("mean Kendall tau +0.333") && v.id == "f"),
            "{violations:?}"
        );
    }

    #[test]
    fn rankings_compare_two_cases_where_both_were_measured() {
        // `a` is faster than `b` on both clusters they share, but its median is the larger: it
        // was also measured on a third, slower cluster that `b` never ran on.
        let mut a = case("a", Status::Ok, 0.21, 1.0, Some("g"));
        a.measured_in =
            [("dev", 0.21), ("lts", 0.13), ("other", 0.30)].map(|(k, v)| (k.to_string(), v)).into();
        let mut b = case("b", Status::Ok, 0.185, 2.0, Some("g"));
        b.measured_in = [("dev", 0.22), ("lts", 0.15)].map(|(k, v)| (k.to_string(), v)).into();
        assert!(measured_difference(&a, &b) < 0.0 && measured_difference(&b, &a) > 0.0);
        let ranking = &rankings(&[a.clone(), b.clone()])[0];
        assert_eq!(ranking.measured_order, ["f/a", "f/b"]);
        assert_eq!(ranking.kendall_tau, 1.0);
        // With no environment in common, the medians decide.
        b.measured_in = [("elsewhere", 0.185)].map(|(k, v)| (k.to_string(), v)).into();
        let ranking = &rankings(&[a, b])[0];
        assert_eq!(ranking.measured_order, ["f/b", "f/a"]);
        assert_eq!(ranking.kendall_tau, -1.0);
    }

    #[test]
    fn kendall_tau_of_pairwise_orders_matches_kendall_tau_of_values() {
        let pairs = [(1.0, 2.0), (2.0, 1.0), (3.0, 3.0), (4.0, 5.0), (4.0, 4.0)];
        let tau = kendall_tau_of(pairs.len(), |i, j| (pairs[i].0 - pairs[j].0, pairs[i].1 - pairs[j].1));
        assert_eq!(tau, kendall_tau(&pairs));
        // 8 concordant, 1 discordant, 1 tied in the first only: 7 / sqrt(10 x 9).
        assert!((tau - 7.0 / 90f64.sqrt()).abs() < 1e-12, "{tau}");
    }

    #[test]
    fn rankings_leave_out_cases_that_did_not_run() {
        let results = vec![
            case("fast", Status::Ok, 1.0, 2.0, Some("g")),
            case("slow", Status::Ok, 3.0, 1.0, Some("g")),
            case("later", Status::Pending { reason: "x".into() }, 2.0, 0.0, Some("g")),
        ];
        let mut results = results;
        results[2].simulated = None;
        let rankings = rankings(&results);
        assert_eq!(rankings.len(), 1);
        assert_eq!(rankings[0].measured_order, ["f/fast", "f/slow"]);
        assert_eq!(rankings[0].simulated_order, ["f/slow", "f/fast"]);
        assert_eq!(rankings[0].kendall_tau, -1.0);
        assert_eq!(rankings[0].not_ranked, 1);
    }

    #[test]
    fn csv_quotes_fields() {
        let report = Report::new(
            vec![case("a", Status::Failed { error: "bad, \"very\"".into() }, 1.0, 1.0, None)],
            &[("f".into(), "F".into(), "S".into())],
        );
        let csv = report.csv(false);
        assert!(csv.lines().nth(1).unwrap().ends_with("\"bad, \"\"very\"\"\""), "{csv}");
    }

    #[test]
    fn every_case_can_show_its_source() {
        let mut pending = case("b", Status::Pending { reason: "later".into() }, 1.0, 1.0, None);
        pending.source = "Table 2, row 3".into();
        let report = Report::new(
            vec![case("a", Status::Ok, 1.0, 0.9, None), pending],
            &[("f".into(), "F".into(), "Paper, 2021".into())],
        );
        let plain = report.text(false, false);
        assert!(plain.contains("  source: Paper, 2021"), "{plain}");
        assert!(!plain.contains("source: t\n"), "{plain}");
        let text = report.text(false, true);
        let lines: Vec<&str> = text.lines().collect();
        let row = lines.iter().position(|l| l.trim_start().starts_with("b ")).unwrap();
        assert_eq!(lines[row + 1].trim(), "source: Table 2, row 3");
        let markdown = report.markdown(&BTreeMap::new());
        assert!(markdown.contains("- a: t\n- b: Table 2, row 3"), "{markdown}");
    }
}
