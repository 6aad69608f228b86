//! `parasim validate`: the validation suite of `data/validation/`, run in parallel, printed,
//! plotted and checked against its recorded floors.

use crate::output::stderr;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, bail};
use validation::bounds::Bounds;
use validation::case::{Paths, load_suite};
use validation::suite::{Selection, run};

/// What `parasim validate` was asked: its command-line arguments.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ValidateArgs {
    /// Only this family (repeatable), e.g. megatron-sc21-table1.
    #[arg(long = "suite", value_name = "FAMILY")]
    pub suites: Vec<String>,
    /// Only this case (repeatable): family/case, or a case id.
    #[arg(long = "case", value_name = "ID")]
    pub cases: Vec<String>,
    /// Only the families of the CI ratchet (ci = true: seconds each).
    #[arg(long)]
    pub ci: bool,
    /// List the selected cases and whether they run, without running them.
    #[arg(long)]
    pub list: bool,
    /// Print JSON (every case and point, families, rankings, overall).
    #[arg(long, conflicts_with_all = ["csv", "markdown"])]
    pub json: bool,
    /// Print CSV, one row per case (per point with --points).
    #[arg(long, conflicts_with = "markdown")]
    pub csv: bool,
    /// Print Markdown: the summary, a table per family, pending reasons, rankings.
    #[arg(long)]
    pub markdown: bool,
    /// Rewrite the generated part of this Markdown file (between its markers) with the
    /// Markdown report: `--write-doc docs/validation.md`.
    #[arg(long, value_name = "FILE.md")]
    pub write_doc: Option<PathBuf>,
    /// Rewrite the accuracy summary of this Markdown file (between its summary markers) with
    /// the summary table, test cases beside calibration cases: `--write-summary README.md`.
    #[arg(long, value_name = "FILE.md")]
    pub write_summary: Option<PathBuf>,
    /// Also show every point of multi-point cases (nccl-tests sizes, DeepBench kernels).
    #[arg(long)]
    pub points: bool,
    /// Price every case on a device with this calibrated compute profile (a built-in profile's
    /// device name, or a profile file; repeatable): how a profile fitted to one workload
    /// transfers to the suite. Cases never name a profile themselves.
    #[arg(long = "profile", value_name = "PROFILE")]
    pub profiles: Vec<String>,
    /// Run every case without this declared fitted constant (an id of
    /// data/validation/fitted.toml; repeatable): its key is taken out of the scenarios, so
    /// parasim's default applies. Shows what each fitted constant buys, and on which cases.
    #[arg(long = "without-fitted", value_name = "ID")]
    pub without_fitted: Vec<String>,
    /// Run every case with this declared fitted constant multiplied by FACTOR (ID=FACTOR, an
    /// id of data/validation/fitted.toml; repeatable): how sensitive the results are to it.
    #[arg(long = "scale-fitted", value_name = "ID=FACTOR")]
    pub scale_fitted: Vec<String>,
    /// Print each case's source (paper and table row, or repository @ commit : path) under
    /// its row; families always show theirs.
    #[arg(long)]
    pub sources: bool,
    /// Write a plot of simulated against measured (log-log), every point of every case, to
    /// this file (SVG or PNG by its extension; the same chart as `parasim plot accuracy`).
    #[arg(long, value_name = "FILE.svg|FILE.png")]
    pub plot: Option<PathBuf>,
    /// Exit with status 1 if a family's mean or test mean, its number of test cases, or a case
    /// falls below its recorded floor (data/validation/bounds.toml).
    #[arg(long)]
    pub check_bounds: bool,
    /// Raise the recorded floors to this run's results (never lowers one).
    #[arg(long)]
    pub update_bounds: bool,
    /// The suite's folder (default: data/validation under the working directory when there is
    /// one, as in the checkout; else the copy of the suite embedded in the binary).
    #[arg(long, value_name = "DIR")]
    pub suite_dir: Option<PathBuf>,
    /// The shared data folder with traces, nccl-tests logs and kernel tables
    /// (default: $PARASIM_SHARED_DATA, else ../shared/data beside the checkout).
    #[arg(long, value_name = "DIR")]
    pub shared: Option<PathBuf>,
    /// Worker threads (default: every core).
    #[arg(long, short = 'j')]
    pub jobs: Option<usize>,
    /// No progress on standard error (a bar on a terminal, else a line every 5 s).
    #[arg(long)]
    pub quiet: bool,
}

impl ValidateArgs {
    /// The cases the arguments select.
    fn selection(&self) -> Selection {
        Selection { families: self.suites.clone(), cases: self.cases.clone(), ci_only: self.ci }
    }
}

/// Recorded floors were broken: `parasim validate` exits with status 1.
#[derive(Debug)]
pub struct BoundsBroken(pub usize);

impl std::fmt::Display for BoundsBroken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} recorded accuracy floor(s) broken (data/validation/bounds.toml)", self.0)
    }
}

impl std::error::Error for BoundsBroken {}

/// Where the suite comes from: a folder on disk, or the copy embedded in the binary.
enum Suite {
    /// `--suite-dir DIR`, or `data/validation` of the checkout the command runs in.
    Folder(PathBuf),
    /// The suite compiled into the binary (src/embedded.rs), written to a temporary folder
    /// for this run.
    Embedded(crate::embedded::Extracted),
}

impl Suite {
    /// `--suite-dir` if given; else `data/validation` under the working directory (running in
    /// the checkout uses the checkout's files, edits included); else the embedded copy.
    fn choose(args: &ValidateArgs) -> anyhow::Result<Self> {
        if let Some(dir) = &args.suite_dir {
            return Ok(Self::Folder(dir.clone()));
        }
        let local = PathBuf::from("data/validation");
        if local.is_dir() {
            return Ok(Self::Folder(local));
        }
        let writer = [
            (args.write_doc.is_some(), "--write-doc"),
            (args.write_summary.is_some(), "--write-summary"),
            (args.update_bounds, "--update-bounds"),
        ]
        .into_iter()
        .find_map(|(set, flag)| set.then_some(flag));
        if let Some(flag) = writer {
            bail!(
                "{flag} writes the checkout's files from the checkout's suite, but there is no data/validation here, so this run would use the copy of the suite embedded in the binary: run it in the parasim checkout, or pass --suite-dir DIR"
            );
        }
        Ok(Self::Embedded(crate::embedded::Extracted::new()?))
    }

    /// The suite's folder.
    fn dir(&self) -> PathBuf {
        match self {
            Self::Folder(dir) => dir.clone(),
            Self::Embedded(extracted) => extracted.path("data/validation"),
        }
    }

    /// How a file of the suite is named to the user.
    fn name(&self, file: &str) -> String {
        match self {
            Self::Folder(dir) => dir.join(file).display().to_string(),
            Self::Embedded(_) => format!("data/validation/{file}, embedded in the binary"),
        }
    }
}

/// The shared data folder: `--shared`, else `PARASIM_SHARED_DATA`, else `../shared/data`
/// beside the checkout that holds the suite (none for the embedded suite).
fn shared_dir(args: &ValidateArgs, suite: &Suite) -> Option<PathBuf> {
    if let Some(dir) = &args.shared {
        return Some(dir.clone());
    }
    if let Some(dir) = std::env::var_os("PARASIM_SHARED_DATA") {
        return Some(PathBuf::from(dir));
    }
    match suite {
        Suite::Folder(dir) => Some(dir.join("../../../shared/data")),
        Suite::Embedded(_) => None,
    }
}

/// Runs the command; returns what to print on stdout.
pub fn validate(args: &ValidateArgs) -> anyhow::Result<String> {
    let suite = Suite::choose(args)?;
    let result = run_suite(args, &suite);
    match &suite {
        // Errors name the suite's files as the checkout does, not the temporary folder.
        Suite::Embedded(extracted) => result.map_err(|error| {
            let root = format!("{}/", extracted.root().display());
            if error.downcast_ref::<BoundsBroken>().is_some() || !crate::message(&error).contains(&root) {
                error
            } else {
                anyhow::anyhow!(
                    "{} (the suite embedded in the binary)",
                    crate::message(&error).replace(&root, "")
                )
            }
        }),
        Suite::Folder(_) => result,
    }
}

/// Runs the suite of `suite`; returns what to print on stdout.
fn run_suite(args: &ValidateArgs, suite: &Suite) -> anyhow::Result<String> {
    let plot_format = args.plot.as_deref().map(plot::Format::of_path).transpose()?;
    let dir = suite.dir();
    let families = load_suite(&dir)?;
    let selection = args.selection();
    let chosen = selection.choose(&families)?;
    if args.list {
        let mut out = String::new();
        for (family, case) in &chosen {
            let state = case.pending.as_deref().map_or("runnable".to_string(), |r| format!("pending: {r}"));
            out += &format!("{:<52} {:<10} {}\n", family.case_id(case), family.header.kind.name(), state);
        }
        return Ok(out);
    }
    if chosen.is_empty() {
        bail!(
            "no case selected (the suite has {} families; --ci selects those marked ci = true)",
            families.len()
        );
    }
    let mut profiles = Vec::new();
    for name in &args.profiles {
        let (profile, label) = scenario::read_profile(name, Path::new("."))
            .map_err(|error| anyhow::anyhow!("--profile {name}: {error}"))?;
        let name = if Path::new(name).exists() {
            fs_err::canonicalize(name).with_context(|| format!("--profile {name}"))?.display().to_string()
        } else {
            name.clone()
        };
        stderr!(
            "profile       {label} prices every case on {} (or a device that computes the same)",
            profile.device
        );
        profiles.push((profile.device, name));
    }
    let (without, scale) = fitted_changes(args, &dir)?;
    let shared = shared_dir(args, suite);
    let needs_shared = chosen.iter().any(|(_, case)| {
        let shared = |path: &str| path.starts_with("shared:");
        case.pending.is_none()
            && (case.log.as_deref().is_some_and(shared)
                || case.table.as_deref().is_some_and(shared)
                || case.traces.iter().any(|t| shared(t)))
    });
    let shared = match shared {
        Some(shared) if needs_shared && !shared.is_dir() => bail!(
            "the shared data folder {} is missing (nccl-tests logs, DeepBench tables and traces are read from it, never copied): put ../shared/data beside the checkout, or pass --shared DIR",
            shared.display()
        ),
        None if needs_shared => bail!(
            "the selected cases read the shared data folder (nccl-tests logs, DeepBench tables and traces, never embedded in the binary): pass --shared DIR or set PARASIM_SHARED_DATA"
        ),
        Some(shared) => shared,
        None => PathBuf::from("shared/data"),
    };
    let paths = Paths { shared, profiles, without, scale };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.jobs.unwrap_or(0))
        .build()
        .context("starting the worker threads")?;
    let progress = crate::progress::Progress::new("validate", args.quiet);
    progress.stage("", "cases", Some(chosen.len() as u64));
    let slowest = Mutex::new((0.0f64, String::new()));
    let started = Instant::now();
    let done = |result: &validation::run::CaseResult| {
        if let Ok(mut slowest) = slowest.lock()
            && result.wall_s > slowest.0
        {
            *slowest = (result.wall_s, result.id.clone());
        }
        progress.inc(&format!("last: {}", result.id));
    };
    let report = pool.install(|| run(&families, &chosen, &paths, &done));
    progress.finish();
    let (slowest_s, slowest_id) = slowest.into_inner().unwrap_or_default();
    stderr!(
        "ran {} cases in {:.1} s on {} threads (slowest: {slowest_id}, {slowest_s:.2} s)",
        chosen.len(),
        started.elapsed().as_secs_f64(),
        pool.current_num_threads()
    );

    let caveats: BTreeMap<String, Vec<String>> =
        families.iter().map(|f| (f.header.id.clone(), f.header.caveats.clone())).collect();
    if let Some(path) = &args.write_doc {
        write_doc(path, &report.markdown(&caveats), (DOC_BEGIN, DOC_END))?;
        stderr!("doc           {} (the generated part rewritten)", path.display());
    }
    if let Some(path) = &args.write_summary {
        write_doc(path, &report.summary_markdown(), (SUMMARY_BEGIN, SUMMARY_END))?;
        stderr!("summary       {} (the accuracy summary rewritten)", path.display());
    }
    let mut out = if args.json {
        let mut text = serde_json::to_string_pretty(&report).context("writing JSON")?;
        text.push('\n');
        text
    } else if args.csv {
        report.csv(args.points)
    } else if args.markdown {
        report.markdown(&caveats)
    } else {
        report.text(args.points, args.sources)
    };
    if let (Some(path), Some(format)) = (&args.plot, plot_format) {
        crate::plot_cmd::write_chart(
            &accuracy_chart(&report)?,
            format,
            plot::Size { width: 1100, height: 760 },
            path,
        )?;
        stderr!("plot          {}", path.display());
    }
    let bounds_path = dir.join("bounds.toml");
    let bounds = Bounds::load(&bounds_path)?;
    if args.update_bounds {
        let raised = bounds.raised(&report);
        traces::atomic::write(&bounds_path, raised.to_toml()).context("writing the bounds")?;
        stderr!("bounds        {} (raised where this run did better)", bounds_path.display());
    }
    if args.check_bounds {
        let suite_cases: BTreeSet<String> =
            families.iter().flat_map(|f| f.cases.iter().map(|c| f.case_id(c))).collect();
        let violations = bounds.check(&report, &suite_cases);
        if !violations.is_empty() {
            // A closed standard output loses the report, not the exit status 1.
            if let Err(error) = crate::output::print(&out)
                && error.kind() != std::io::ErrorKind::BrokenPipe
            {
                return Err(anyhow::Error::new(error).context("writing the report"));
            }
            for violation in &violations {
                stderr!("broken floor  {}: {}", violation.id, violation.message);
            }
            return Err(BoundsBroken(violations.len()).into());
        }
        if !args.json && !args.csv {
            out += &format!("\nbounds: every recorded floor holds ({})\n", suite.name("bounds.toml"));
        }
    }
    Ok(out)
}

/// The accuracy scatter of `report`: its CSV with every point, drawn as `parasim plot
/// accuracy` draws it, with each family's mean accuracy over its cases in the legend.
fn accuracy_chart(report: &validation::report::Report) -> anyhow::Result<plot::Chart> {
    let table = plot::table::Table::parse(&report.csv(true), "the validation report")?;
    let mut scatter = plot::scatter::Scatter::from_table(&table, None)?;
    let points: usize = scatter.groups.iter().map(|g| g.points.len()).sum();
    scatter.title = Some(format!(
        "parasim validate: simulated against measured ({points} points, each in its family's unit)"
    ));
    for group in &mut scatter.groups {
        if let Some(family) = report.families.iter().find(|f| f.id == group.name)
            && let Some(mean) = family.stats.mean
        {
            let unit = report.cases.iter().find(|c| c.family == group.name).map_or("", |c| c.unit.as_str());
            group.label = format!("{}, {unit} ({:.1}%)", group.name, 100.0 * mean);
        }
    }
    Ok(plot::Chart::Scatter(scatter))
}

/// The markers around the generated part of a Markdown file.
pub const DOC_BEGIN: &str =
    "<!-- generated by: parasim validate --write-doc docs/validation.md (do not edit by hand) -->";
/// The end marker.
pub const DOC_END: &str = "<!-- end of generated part -->";

/// The markers around the generated accuracy summary of a Markdown file (the README's).
pub const SUMMARY_BEGIN: &str =
    "<!-- generated by: parasim validate --write-summary README.md (do not edit by hand) -->";
/// The summary's end marker.
pub const SUMMARY_END: &str = "<!-- end of generated summary -->";

/// Replaces the text between `markers` (begin, end) in `path` with `generated`.
fn write_doc(path: &Path, generated: &str, (begin_marker, end_marker): (&str, &str)) -> anyhow::Result<()> {
    let text = fs_err::read_to_string(path)?;
    let (Some(begin), Some(end)) = (text.find(begin_marker), text.find(end_marker)) else {
        bail!("{}: the markers {begin_marker:?} and {end_marker:?} are missing", path.display());
    };
    if end < begin {
        bail!("{}: the end marker comes before the begin marker", path.display());
    }
    let rewritten = format!("{}{begin_marker}\n\n{generated}\n{}", &text[..begin], &text[end..]);
    traces::atomic::write(path, rewritten).context("writing the doc")?;
    Ok(())
}

/// The scenario changes `--without-fitted` and `--scale-fitted` ask for: (key, families) to
/// take out and (key, families, factor) to scale, each named by its declared fitted constant.
#[allow(clippy::type_complexity)]
fn fitted_changes(
    args: &ValidateArgs,
    dir: &Path,
) -> anyhow::Result<(Vec<(String, Vec<String>)>, Vec<(String, Vec<String>, f64)>)> {
    let (mut without, mut scale) = (Vec::new(), Vec::new());
    if args.without_fitted.is_empty() && args.scale_fitted.is_empty() {
        return Ok((without, scale));
    }
    let ledger = validation::ledger::Ledger::load(dir)?;
    let valid = || {
        let ids: Vec<&str> = ledger.fitted.iter().filter(|f| !f.builtin).map(|f| f.id.as_str()).collect();
        ids.join(", ")
    };
    let find = |flag: &str, id: &str| -> anyhow::Result<&validation::ledger::Fitted> {
        match ledger.fitted.iter().find(|f| f.id == id) {
            Some(fitted) if !fitted.builtin => Ok(fitted),
            Some(fitted) => bail!(
                "{flag} {id:?}: a built-in constant ({}), which no scenario sets; valid: {}",
                fitted.location.as_deref().unwrap_or(&fitted.key),
                valid()
            ),
            None => bail!(
                "{flag} {id:?}: no such fitted constant in {}; valid: {}",
                dir.join(validation::ledger::FITTED_FILE).display(),
                valid()
            ),
        }
    };
    for id in &args.without_fitted {
        let fitted = find("--without-fitted", id)?;
        stderr!(
            "without       {id}: {} taken out of the scenarios of {} (parasim's default instead of {})",
            fitted.key,
            fitted.families.join(", "),
            fitted.value
        );
        without.push((fitted.key.clone(), fitted.families.clone()));
    }
    for text in &args.scale_fitted {
        let Some((id, factor)) = text.split_once('=') else {
            bail!("--scale-fitted {text:?}: write ID=FACTOR, e.g. paradl-staging-rate=2");
        };
        let fitted = find("--scale-fitted", id)?;
        let factor: f64 =
            factor.parse().ok().filter(|f: &f64| f.is_finite() && *f > 0.0).ok_or_else(|| {
                anyhow::anyhow!("--scale-fitted {text:?}: the factor must be a positive number")
            })?;
        stderr!(
            "scaled        {id}: {} x {factor} in the scenarios of {} ({} declared)",
            fitted.key,
            fitted.families.join(", "),
            fitted.value
        );
        scale.push((fitted.key.clone(), fitted.families.clone(), factor));
    }
    Ok((without, scale))
}
