//! `parasim sweep`: runs a sweep's configurations on every core and streams the rows in
//! configuration order (scenario::sweep), resumes a cut-short output, runs one shard of a
//! job array, and merges shard outputs (docs/sweep.md, docs/slurm.md).

use crate::output::stderr;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use scenario::sweep::output::{self, Format, Header, Shard};
use scenario::sweep::{Status, Sweep};

/// `parasim sweep SWEEP.toml ...` or `parasim sweep merge OUT SHARD...`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SweepCli {
    #[command(subcommand)]
    command: Option<SweepCommand>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, clap::Subcommand)]
enum SweepCommand {
    /// Merge shard outputs into one output of the whole sweep, in configuration order; the
    /// shards must be of one sweep, complete and non-overlapping.
    Merge {
        /// The merged output (.csv or .jsonl, as the shards).
        output: PathBuf,
        /// The shard outputs.
        #[arg(required = true)]
        shards: Vec<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The sweep file (docs/sweep.md).
    #[arg(required = true)]
    sweep: Option<PathBuf>,
    /// Write the rows here (.csv or .jsonl) instead of CSV on standard output.
    #[arg(short, long, value_name = "OUT.csv|OUT.jsonl")]
    output: Option<PathBuf>,
    /// Keep the rows already complete in the output and run the rest (the output's header
    /// must be this sweep's).
    #[arg(long, requires = "output")]
    resume: bool,
    /// Run only slice I of N (0-based; configuration i is in slice i mod N). Default: from
    /// SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX, else the whole sweep.
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
    /// The shard count for JOB_COMPLETION_INDEX (Kubernetes indexed Jobs), or when Slurm's
    /// array size is not the shard count. Default: $SWEEP_SHARDS.
    #[arg(long, value_name = "N")]
    shards: Option<u64>,
    /// Worker threads (default: every core).
    #[arg(short = 'j', long, value_name = "THREADS")]
    jobs: Option<usize>,
    /// Only these metric columns (comma-separated; any key `run --json` can print, and a prefix
    /// such as `breakdown` takes every column under it). The index, the swept values
    /// (`axis.KEY`), status and error are always written.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    columns: Vec<String>,
    /// Print how many configurations the sweep has and the shard's, and run nothing.
    #[arg(long)]
    count: bool,
}

/// Runs `parasim sweep`.
pub fn sweep(cli: SweepCli) -> anyhow::Result<()> {
    match cli.command {
        Some(SweepCommand::Merge { output, shards }) => merge(&output, &shards),
        None => run(&cli.run),
    }
}

fn merge(output: &Path, shards: &[PathBuf]) -> anyhow::Result<()> {
    // As `sweep -o`: the output's name says its format, so a `.txt` (or no extension) is refused
    // before anything is read or written.
    let wanted = Format::of_name(&output.display().to_string()).with_context(|| {
        let given = output
            .extension()
            .map_or_else(|| "no extension".to_string(), |ext| format!(".{}", ext.to_string_lossy()));
        format!(
            "{}: {given} names no sweep format; name the merged output .csv or .jsonl, as the shards",
            output.display()
        )
    })?;
    let _lock = crate::lock::OutputLock::acquire(output, "parasim sweep merge")?;
    let mut inputs = Vec::new();
    for path in shards {
        let text = fs_err::read_to_string(path)?;
        inputs.push((path.display().to_string(), text));
    }
    let merged = output::merge(&inputs).map_err(anyhow::Error::msg)?;
    let format = Format::of_text(&merged);
    if wanted != format {
        bail!(
            "{}: the shards are {}, not the format this name asks for",
            output.display(),
            format_name(format)
        );
    }
    traces::atomic::write(output, &merged)?;
    let rows = merged.lines().count() - if format == Format::Csv { 2 } else { 1 };
    stderr!("merged {} shard files: {rows} configurations into {}", shards.len(), output.display());
    Ok(())
}

fn format_name(format: Format) -> &'static str {
    match format {
        Format::Csv => "CSV",
        Format::Jsonl => "JSON Lines",
    }
}

/// The shard from `--shard`, else the scheduler's environment: Slurm job arrays
/// (`SLURM_ARRAY_TASK_ID` minus `SLURM_ARRAY_TASK_MIN`, of `SLURM_ARRAY_TASK_COUNT` or MAX - MIN
/// + 1) or Kubernetes indexed Jobs (`JOB_COMPLETION_INDEX` of `--shards` / `SWEEP_SHARDS`).
pub fn shard_of(
    shard: Option<&str>,
    shards: Option<u64>,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<Shard>> {
    if let Some(text) = shard {
        return Shard::parse(text).map(Some).map_err(|m| anyhow::anyhow!("--shard {m}"));
    }
    let number = |name: &str| -> anyhow::Result<Option<u64>> {
        match env(name) {
            None => Ok(None),
            Some(text) => {
                text.trim().parse().map(Some).with_context(|| format!("${name} = {text:?} is not a number"))
            }
        }
    };
    let count = match shards {
        Some(n) => Some(n),
        None => number("SWEEP_SHARDS")?,
    };
    if let Some(id) = number("SLURM_ARRAY_TASK_ID")? {
        let min = number("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
        let count = match (count, number("SLURM_ARRAY_TASK_COUNT")?, number("SLURM_ARRAY_TASK_MAX")?) {
            (Some(n), _, _) | (None, Some(n), _) => n,
            (None, None, Some(max)) => max.saturating_sub(min) + 1,
            (None, None, None) => bail!(
                "SLURM_ARRAY_TASK_ID is set but not the array's size (SLURM_ARRAY_TASK_COUNT or _MAX): pass --shards N"
            ),
        };
        let index = id.checked_sub(min).context("SLURM_ARRAY_TASK_ID is below SLURM_ARRAY_TASK_MIN")?;
        return Shard::new(index, count).map(Some).map_err(|m| {
            anyhow::anyhow!("from Slurm's array variables: {m} (use --array=0-{}, step 1)", count - 1)
        });
    }
    if let Some(index) = number("JOB_COMPLETION_INDEX")? {
        let count = count.context(
            "JOB_COMPLETION_INDEX is set (a Kubernetes indexed Job) but not the shard count: pass --shards N or set SWEEP_SHARDS to the Job's completions",
        )?;
        return Shard::new(index, count)
            .map(Some)
            .map_err(|m| anyhow::anyhow!("from JOB_COMPLETION_INDEX: {m}"));
    }
    Ok(None)
}

/// The fingerprint of a sweep's outputs: the sweep's own ([`Sweep::fingerprint`]: base scenario,
/// axes, derived values, filters) with this build's source revision and a hash of its embedded
/// data (devices, models, profiles), so that resume and merge refuse outputs of another build.
fn fingerprint(sweep: &Sweep) -> u64 {
    let text = format!(
        "{:016x} revision {} data {:016x}",
        sweep.fingerprint(),
        crate::embedded::REVISION,
        crate::embedded::data_hash()
    );
    output::fnv1a(text.as_bytes())
}

/// One finished configuration, sent from a worker to the writer.
struct Done {
    position: u64,
    line: String,
    status: Status,
    wall: Duration,
}

fn run(args: &RunArgs) -> anyhow::Result<()> {
    let path = args.sweep.as_deref().context("no sweep file")?;
    let sweep = Sweep::load(path)?;
    let shard = shard_of(args.shard.as_deref(), args.shards, &|name| std::env::var(name).ok())?;
    let total = sweep.count();
    let indices: Vec<u64> = match shard {
        Some(shard) => shard.indices(total).collect(),
        None => (0..total).collect(),
    };
    if args.count {
        match shard {
            Some(s) => {
                crate::output::print(format!(
                    "{total} configurations; shard {}/{} has {}\n",
                    s.index,
                    s.count,
                    indices.len()
                ))?;
            }
            None => crate::output::print(format!("{total} configurations\n"))?,
        }
        return Ok(());
    }
    let format = match &args.output {
        Some(out) => Format::of_name(&out.display().to_string())
            .with_context(|| format!("{}: name the output .csv or .jsonl", out.display()))?,
        None => Format::Csv,
    };
    let metrics = sweep.metric_columns();
    let swept = sweep.swept_columns();
    let keep: Vec<usize> = if args.columns.is_empty() {
        (0..metrics.len()).collect()
    } else {
        let mut keep = Vec::new();
        for name in &args.columns {
            if swept.contains(name) {
                // The swept values are always written.
                continue;
            }
            let under = format!("{name}.");
            let found: Vec<usize> = (0..metrics.len())
                .filter(|&i| metrics[i] == *name || metrics[i].starts_with(&under))
                .collect();
            if found.is_empty() {
                bail!("--columns: no metric {name:?}; the metrics are: {}", metrics.join(", "));
            }
            for i in found {
                if !keep.contains(&i) {
                    keep.push(i);
                }
            }
        }
        keep
    };
    let mut columns = vec!["index".to_string()];
    let swept_count = swept.len();
    columns.extend(swept);
    columns.extend(keep.iter().map(|&i| metrics[i].clone()));
    columns.extend(["status".to_string(), "error".to_string()]);
    let metric_kinds = sweep.metric_kinds();
    let kinds = output::Kind::columns(swept_count, keep.iter().map(|&i| metric_kinds[i]));
    let file_name =
        path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().to_string());
    let header = Header {
        file: file_name,
        configurations: total,
        fingerprint: fingerprint(&sweep),
        shard,
        columns: columns.clone(),
    };

    // One writer per output: held until the last row is written.
    let _lock = match &args.output {
        Some(out) => Some(crate::lock::OutputLock::acquire(
            out,
            if args.resume { "parasim sweep --resume" } else { "parasim sweep" },
        )?),
        None => None,
    };
    // Open the output: fresh, or resumed after its complete rows.
    let mut already = 0usize;
    let mut sink: Box<dyn Write> = match &args.output {
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(header.text(format).as_bytes()).context("writing the header")?;
            Box::new(stdout)
        }
        Some(out) => {
            let existing =
                if args.resume && out.exists() { Some(fs_err::read_to_string(out)?) } else { None };
            match existing {
                Some(text) if !text.is_empty() => {
                    let found = output::read_existing(&text, format, &kinds)
                        .map_err(|m| anyhow::anyhow!("{}: cannot resume: {m}", out.display()))?;
                    if found.header.fingerprint != header.fingerprint {
                        bail!(
                            "{}: cannot resume: its fingerprint {:016x} is not this sweep's {:016x} (another sweep file or base scenario, or another parasim build or data: this is build {}); write to a new file",
                            out.display(),
                            found.header.fingerprint,
                            header.fingerprint,
                            crate::embedded::REVISION
                        );
                    }
                    if found.header != header {
                        let what = if found.header.fingerprint != header.fingerprint
                            || found.header.file != header.file
                        {
                            "another sweep's output (another sweep file, base scenario or parasim version)"
                        } else if found.header.shard != header.shard {
                            "another shard's output"
                        } else {
                            "this sweep's output with other columns (another --columns)"
                        };
                        bail!(
                            "{}: cannot resume: line 1: the header is {what}, not this run's; write to a new file",
                            out.display()
                        );
                    }
                    if found.rows.len() > indices.len() || found.rows[..] != indices[..found.rows.len()] {
                        bail!("{}: cannot resume: its rows are not this sweep's in order", out.display());
                    }
                    already = found.rows.len();
                    let file = fs_err::OpenOptions::new().write(true).open(out)?;
                    // Cut a partial last row (a run stopped mid-write) before appending.
                    file.set_len(found.complete_len as u64)?;
                    drop(file);
                    let file = fs_err::OpenOptions::new().append(true).open(out)?;
                    if found.complete_len < text.len() {
                        stderr!(
                            "resume        cut a partial last row ({} bytes)",
                            text.len() - found.complete_len
                        );
                    }
                    Box::new(file)
                }
                _ => {
                    let mut file = fs_err::File::create(out)?;
                    file.write_all(header.text(format).as_bytes())?;
                    file.flush()?;
                    Box::new(file)
                }
            }
        }
    };
    let todo = &indices[already..];

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.jobs.unwrap_or(0))
        .build()
        .context("starting the worker threads")?;
    let threads = pool.current_num_threads();
    let progress = Progress::new(todo.len() as u64)?;
    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut histogram = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 24 * 3_600_000_000, 3)
        .context("the wall-time histogram")?;
    let started = Instant::now();

    // Workers claim configurations in order; the writer puts finished rows back in order. A
    // worker waits while it is `window` rows ahead of the writer, so a slow configuration
    // never makes the buffer grow without bound.
    let window = 64 * threads as u64;
    let next = AtomicU64::new(0);
    let written = (Mutex::new(0u64), Condvar::new());
    let (sender, receiver) = mpsc::channel::<Done>();
    let mut write_error = None;
    std::thread::scope(|scope| {
        let sweep = &sweep;
        let columns = &columns;
        let keep = &keep;
        let (next, written) = (&next, &written);
        scope.spawn(move || {
            pool.scope(|workers| {
                for _ in 0..threads {
                    let sender = sender.clone();
                    workers.spawn(move |_| {
                        loop {
                            let position = next.fetch_add(1, Ordering::Relaxed);
                            let Some(&index) = todo.get(position as usize) else { break };
                            {
                                let (lock, wake) = written;
                                let mut done = lock.lock().unwrap_or_else(|e| e.into_inner());
                                while position >= *done + window {
                                    done = wake.wait(done).unwrap_or_else(|e| e.into_inner());
                                }
                            }
                            let start = Instant::now();
                            let mut row = sweep.run(index);
                            row.metrics = keep.iter().map(|&i| row.metrics[i].clone()).collect();
                            let line = output::encode_row(format, columns, &row);
                            let done = Done { position, line, status: row.status, wall: start.elapsed() };
                            if sender.send(done).is_err() {
                                break;
                            }
                        }
                    });
                }
            });
            drop(sender);
        });
        let mut pending: BTreeMap<u64, Done> = BTreeMap::new();
        let mut position = 0u64;
        for done in receiver.iter() {
            pending.insert(done.position, done);
            while let Some(done) = pending.remove(&position) {
                // One write of a whole line, then a flush: a stopped run leaves at most one
                // partial line, which --resume cuts off.
                if write_error.is_none()
                    && let Err(error) = sink.write_all(done.line.as_bytes()).and_then(|()| sink.flush())
                {
                    write_error = Some(error);
                }
                *counts.entry(done.status.name()).or_default() += 1;
                let micros = u64::try_from(done.wall.as_micros()).unwrap_or(u64::MAX);
                let _ = histogram.record(micros.clamp(1, histogram.high()));
                position += 1;
                progress.tick(position);
                let (lock, wake) = &written;
                *lock.lock().unwrap_or_else(|e| e.into_inner()) = position;
                wake.notify_all();
            }
            if write_error.is_some() {
                // Stop claiming work: the workers finish what they hold and exit.
                next.store(u64::MAX / 2, Ordering::Relaxed);
            }
        }
    });
    progress.finish();
    if let Some(error) = write_error {
        return Err(error).context(match &args.output {
            Some(out) => format!("writing {}", out.display()),
            None => "writing the rows".to_string(),
        });
    }

    // The summary goes to stderr: wall times differ from run to run, the rows do not.
    let elapsed = started.elapsed().as_secs_f64();
    let ran = todo.len() as u64;
    let mut what = match shard {
        Some(s) => format!("{} of {total} configurations (shard {}/{})", indices.len(), s.index, s.count),
        None => format!("{total} configurations"),
    };
    if already > 0 {
        what += &format!(", {already} already in the output");
    }
    let statuses: Vec<String> = [Status::Ok, Status::Failed, Status::Skipped, Status::DoesNotFit]
        .iter()
        .map(|s| format!("{} {}", counts.get(s.name()).copied().unwrap_or(0), s.name()))
        .collect();
    stderr!("sweep         {what}: ran {ran} ({})", statuses.join(", "));
    stderr!(
        "wall time     {elapsed:.2} s on {threads} thread{}, {:.1} configurations/s",
        if threads == 1 { "" } else { "s" },
        if elapsed > 0.0 { ran as f64 / elapsed } else { 0.0 }
    );
    if ran > 0 {
        let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
        stderr!(
            "per config    p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            ms(0.5),
            ms(0.9),
            ms(0.99),
            histogram.max() as f64 / 1000.0
        );
    }
    if let Some(out) = &args.output {
        stderr!("output        {}", out.display());
    }
    Ok(())
}

/// A progress bar with rate and ETA on a terminal; elsewhere (a batch job's log) a plain line
/// every 30 seconds.
struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
    started: Instant,
    last_line: Mutex<Instant>,
}

impl Progress {
    fn new(total: u64) -> anyhow::Result<Progress> {
        let bar = if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:40} {pos}/{len} configurations, {per_sec}, {elapsed} elapsed, ETA {eta}",
                )
                .context("progress style")?,
            );
            Some(bar)
        } else {
            None
        };
        let now = Instant::now();
        Ok(Progress { bar, total, started: now, last_line: Mutex::new(now) })
    }

    fn tick(&self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            return;
        }
        let Ok(mut last) = self.last_line.lock() else { return };
        if last.elapsed() >= Duration::from_secs(30) && done < self.total {
            *last = Instant::now();
            let elapsed = self.started.elapsed().as_secs_f64();
            let rate = done as f64 / elapsed;
            let eta = (self.total - done) as f64 / rate.max(1e-9);
            stderr!(
                "sweep: {done}/{} configurations ({:.1}%), {rate:.1}/s, ETA {eta:.0} s",
                self.total,
                100.0 * done as f64 / self.total as f64
            );
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
