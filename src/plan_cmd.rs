//! `parasim plan`: the strategy oracle. Reads a cluster (any scenario file's `[cluster]`,
//! `[compute]` and `[simulation]` tables), searches the ways of splitting a model over it
//! (scenario::plan) and prints the best with the winner explained against the runner-up.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, bail};
use scenario::plan::{Budget, Objective, PlanError, PlanOptions, PlanReport, Ranked, Search};
use scenario::simulation::Summary;
use scenario::{Override, ScenarioError};
use serde::Serialize;
use sim_core::units::SimDuration;

/// `parasim plan --model M --cluster CLUSTER.toml --gpus N ...`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// The cluster: a scenario file whose `[cluster]`, `[compute]` and `[simulation]` tables
    /// are used (its `[workload]` gives defaults for the model, batch and precision; the
    /// degrees of its `[parallelism]` are what plan chooses, so they are ignored).
    #[arg(long, value_name = "CLUSTER.toml")]
    cluster: PathBuf,
    /// The model: a zoo name (`parasim models`) or a model file (a path from the working
    /// directory). Default: the cluster file's `workload.model`.
    #[arg(long)]
    model: Option<String>,
    /// GPU counts to plan for, comma-separated (each a multiple of the cluster's GPUs per
    /// node). Default: the cluster's.
    #[arg(long, value_name = "N[,N...]", value_delimiter = ',')]
    gpus: Vec<u64>,
    /// Samples (sequences) per iteration over all replicas. Default: the cluster file's
    /// `workload.global-batch`.
    #[arg(long, value_name = "B")]
    global_batch: Option<u64>,
    /// Sequence length (tokens), overriding the model's.
    #[arg(long, value_name = "S")]
    seq: Option<u64>,
    /// Compute precision (fp16, bf16, fp8...). Default: the cluster file's, else bf16 where
    /// the device has it, else fp16.
    #[arg(long)]
    precision: Option<String>,
    /// What to rank by.
    #[arg(long, value_enum, default_value = "time")]
    objective: ObjectiveArg,
    /// How many configurations to list.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=100))]
    top: u64,
    /// Tokens to train (for time-to-train and cost): `300e9`, `300G`.
    #[arg(long, value_name = "T", conflicts_with = "samples")]
    tokens: Option<String>,
    /// Samples to train (for time-to-train and cost): `115.2e6` (90 epochs of ImageNet-1k).
    #[arg(long, value_name = "S")]
    samples: Option<String>,
    /// Price of one GPU-hour, for the cost column.
    #[arg(long, value_name = "PRICE")]
    gpu_hour_price: Option<f64>,
    /// Share of each GPU's memory kept free for the CUDA context, NCCL and allocator
    /// fragmentation (0 to 0.9).
    #[arg(long, value_name = "FRACTION", default_value_t = 0.1)]
    memory_headroom: f64,
    /// Limit of each final simulation with the cluster's network model, in seconds of the
    /// 2-core development VM (flow at 1024 GPUs can take minutes for some strategies). It is
    /// counted as the flow model's work, not measured on the clock, so the same search gives
    /// the same answer on any machine and under any load. One over it keeps its analytical
    /// result, marked `*`, and ranks after those that finished. 0: no limit.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    final_time_limit: u64,
    /// The most configurations the final stage checks with the cluster's network model. It
    /// takes the best `max(2 x top, top + 4)` screened, then, in order of their floor (their
    /// analytical time, or lower bound), every configuration whose floor is below the best
    /// final result, until none is left (an exact stop) or this many were checked; the
    /// `unchecked` line then says how many were left and their best floor. 0: no limit.
    #[arg(long, value_name = "N", default_value_t = 20)]
    final_max: u64,
    /// Fix a scenario key instead of searching it (repeatable): `--set parallelism.tensor=8`,
    /// `--set workload.recompute=full`, `--set parallelism.sequence-parallel=false`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// No progress on standard error (a bar on a terminal, else a line every 5 s naming the
    /// stage, its counts and what is left).
    #[arg(long)]
    quiet: bool,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Worker threads (default: every core).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: Option<u64>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ObjectiveArg {
    Time,
    Throughput,
    Cost,
}

/// Runs the search and returns what to print.
pub fn plan(args: &PlanArgs) -> anyhow::Result<String> {
    let (search, options) = prepare(args)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads.map_or(0, |n| n as usize))
        .build()
        .context("starting the worker threads")?;
    // Progress on standard error: a bar on a terminal, a line every period otherwise.
    let bar = crate::progress::Progress::new("plan", args.quiet);
    let progress = |step: scenario::plan::Step<'_>| {
        bar.stage(step.stage, step.unit, Some(step.total));
        bar.set_position(step.done);
        bar.set_message(step.note);
    };
    let report = pool.install(|| scenario::plan::plan_with_progress(&search, &options, &progress));
    bar.finish();
    let report = report?;
    if report.top.is_empty() {
        let mut reasons: Vec<String> = report
            .rejected
            .iter()
            .map(|(reason, r)| format!("{reason}: {} (e.g. {})", r.count, r.example))
            .collect();
        reasons.extend(
            report.failed.iter().take(3).map(|(label, message)| format!("{label} failed: {message}")),
        );
        bail!(
            "no configuration of {} fits on this cluster; of {} tried, rejected by {}",
            search.bases[0].scenario.model.name,
            report.enumerated,
            reasons.join("; ")
        );
    }
    if args.json {
        let json = JsonPlan::new(&report, &search, &options);
        return Ok(serde_json::to_string_pretty(&json)? + "\n");
    }
    Ok(human(&report, &search, &options))
}

/// The search and its options from the flags and the cluster file: every check of plan's input,
/// before any configuration is tried (the fuzz tests in src/fuzz.rs run it on mutated flags
/// and cluster files).
pub fn prepare(args: &PlanArgs) -> anyhow::Result<(Search, PlanOptions)> {
    let file = &args.cluster;
    let text = fs_err::read_to_string(file).with_context(|| format!("--cluster {}", file.display()))?;
    let source: toml::Table =
        toml::from_str(&text).with_context(|| format!("{}: not a valid TOML file", file.display()))?;
    if args.global_batch == Some(0) {
        bail!("--global-batch must be at least 1");
    }
    // The flags are overrides of the cluster file; `--set` fixes keys plan would search.
    let mut settings = Vec::new();
    if let Some(model) = &args.model {
        // A model file given on the command line is a path from the working directory, as
        // every path argument; the cluster file's `workload.model` stays relative to that
        // file (issue 38: `--model out/my_model.toml` was read beside the cluster file).
        let model = if workloads::zoo::by_name(model).is_err()
            && (model.contains(['/', '\\']) || model.ends_with(".toml"))
        {
            std::path::absolute(model)
                .with_context(|| format!("--model {model}: cannot resolve the path"))?
                .display()
                .to_string()
        } else {
            model.clone()
        };
        settings.push(Override::new("workload.model", model.as_str()));
    }
    if let Some(batch) = args.global_batch {
        settings.push(Override::integer("workload.global-batch", batch).context("--global-batch")?);
    }
    if let Some(seq) = args.seq {
        settings.push(Override::integer("workload.sequence-length", seq).context("--seq")?);
    }
    if let Some(precision) = &args.precision {
        settings.push(Override::new("workload.precision", precision.as_str()));
    }
    let fixed: Vec<Override> = args
        .set
        .iter()
        .map(|text| text.parse().map_err(|error| anyhow::anyhow!("--set {error}")))
        .collect::<anyhow::Result<_>>()?;
    let search = Search::new(&source, file, &settings, &fixed, &args.gpus).map_err(|error| match error {
        PlanError::Scenario(error @ ScenarioError::Overridden { .. }) => anyhow::anyhow!("--set {error}"),
        other => other.into(),
    })?;
    let budget = match (&args.tokens, &args.samples) {
        (Some(tokens), _) => Some(Budget::Tokens(count("--tokens", tokens)?)),
        (_, Some(samples)) => Some(Budget::Samples(count("--samples", samples)?)),
        _ => None,
    };
    if let Some(price) = args.gpu_hour_price
        && !(price.is_finite() && price >= 0.0)
    {
        bail!("--gpu-hour-price {price}: give a non-negative price");
    }
    let objective = match args.objective {
        ObjectiveArg::Time => Objective::Time,
        ObjectiveArg::Throughput => Objective::Throughput,
        ObjectiveArg::Cost => Objective::Cost,
    };
    if !(0.0..=0.9).contains(&args.memory_headroom) {
        bail!(
            "--memory-headroom {}: give a fraction from 0 to 0.9 (0.1 keeps 10% of each GPU free)",
            args.memory_headroom
        );
    }
    let options = PlanOptions {
        memory_headroom: args.memory_headroom,
        final_work_budget: (args.final_time_limit > 0)
            .then(|| args.final_time_limit * scenario::plan::FLOW_WORK_PER_SECOND),
        final_max: (args.final_max > 0).then_some(args.final_max as usize),
        objective,
        top: args.top as usize,
        budget,
        gpu_hour_price: args.gpu_hour_price,
    };
    Ok((search, options))
}

/// The `unchecked` line: how many configurations might still beat the final winner, and which
/// limit of the final stage left each of them unchecked, with the flag that raises it.
fn unchecked(report: &PlanReport, options: &PlanOptions) -> String {
    let name = report.fidelity.name();
    let thousands = sim_core::units::thousands;
    let text = format!(
        "unchecked     {} more could still beat the {name} winner (their floor, analytical time or lower \
         bound, is below its result):",
        thousands(report.could_beat_final)
    );
    let not_taken = report.could_beat_final - report.could_beat_over_limit;
    let mut reasons = Vec::new();
    if not_taken > 0 {
        let max = options.final_max.map_or(0, |max| max.max(report.keep));
        let floor = report.left_best_floor.map_or_else(String::new, |floor| {
            format!(", the best floor left {}", score(floor, options.objective))
        });
        reasons.push(format!(
            " {} not checked with {name}: the final stage stopped at --final-max {max} configurations \
             checked{floor}; raise --final-max, or 0 to check every one (an exact stop)",
            thousands(not_taken),
        ));
    }
    if report.could_beat_over_limit > 0 {
        let limit = options.final_work_budget.map_or(0, |work| work / scenario::plan::FLOW_WORK_PER_SECOND);
        reasons.push(format!(
            " {} ran over the time limit of each final simulation, --final-time-limit {limit} (seconds of \
             {name} work; 0: none), and kept their analytical result; raise --final-time-limit to finish them",
            thousands(report.could_beat_over_limit)
        ));
    }
    text + &reasons.join(";")
}

/// A score of `objective` (a floor, a result) as text: seconds, or GPU-seconds per iteration.
fn score(value: f64, objective: Objective) -> String {
    match objective {
        Objective::Time => format!("{value:.3} s"),
        Objective::Throughput | Objective::Cost => format!("{value:.1} GPU-s per iteration"),
    }
}

/// `300e9`, `300G`, `1.2T`, `115.2M` as a number.
fn count(flag: &str, text: &str) -> anyhow::Result<f64> {
    let trimmed = text.trim();
    let (number, scale) = match trimmed.char_indices().last() {
        Some((i, 'K' | 'k')) => (&trimmed[..i], 1e3),
        Some((i, 'M')) => (&trimmed[..i], 1e6),
        Some((i, 'G' | 'B')) => (&trimmed[..i], 1e9),
        Some((i, 'T')) => (&trimmed[..i], 1e12),
        _ => (trimmed, 1.0),
    };
    let value: f64 = number
        .trim()
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v > 0.0)
        .with_context(|| format!("{flag} {text:?}: give a positive count such as 300e9 or 300G"))?;
    Ok(value * scale)
}

fn seconds(value: f64) -> String {
    SimDuration::from_secs_f64(value).map_or_else(|_| format!("{value:.3} s"), |d| d.to_string())
}

/// A duration in days, hours or minutes.
fn long_duration(seconds: f64) -> String {
    if seconds >= 2.0 * 86_400.0 {
        format!("{:.1} days", seconds / 86_400.0)
    } else if seconds >= 2.0 * 3600.0 {
        format!("{:.1} h", seconds / 3600.0)
    } else {
        format!("{:.1} min", seconds / 60.0)
    }
}

fn human(report: &PlanReport, search: &Search, options: &PlanOptions) -> String {
    let mut out = String::new();
    let (ignored, fixed_keys) = (&search.ignored, &search.fixed_keys);
    let base = &search.bases[0].scenario;
    // "GPU" or "CPU": what one device is called.
    let unit = base.device.kind.noun();
    let gpus: Vec<String> = search.bases.iter().map(|b| b.gpus.to_string()).collect();
    let sequence =
        strategies::shard::sequence_length(&base.model).map_or(String::new(), |s| format!(", sequence {s}"));
    // A cluster of node groups: its devices, group by group.
    let devices =
        base.node_groups.as_deref().map_or_else(|| base.device.display_name.clone(), |g| g.describe());
    let _ = writeln!(
        out,
        "plan          {} on {} x {} ({} {unit}{} per node), global batch {}{sequence}, {}",
        base.model.name,
        gpus.join(" | "),
        devices,
        base.cluster.gpus_per_node,
        if base.cluster.gpus_per_node == 1 { "" } else { "s" },
        search.global_batch,
        base.precision,
    );
    let objective = match options.objective {
        Objective::Time => "iteration time".to_string(),
        Objective::Throughput => format!("throughput per {unit}"),
        Objective::Cost => format!("{unit}-hours of the budget"),
    };
    let _ = writeln!(out, "objective     {objective}");
    if !fixed_keys.is_empty() {
        let _ = writeln!(out, "fixed         {}", fixed_keys.join(", "));
    }
    if !ignored.is_empty() {
        let _ =
            writeln!(out, "ignored       {} (from the cluster file: plan chooses them)", ignored.join(", "));
    }
    let rejected: u64 = report.rejected.values().map(|r| r.count).sum();
    let _ = writeln!(
        out,
        "searched      {} configurations: {} valid and fit, {} rejected",
        sim_core::units::thousands(report.enumerated),
        sim_core::units::thousands(report.valid),
        sim_core::units::thousands(rejected)
    );
    if report.out_of_core {
        let _ = writeln!(
            out,
            "out-of-core   nothing fit in device memory: each configuration without recomputation or ZeRO \
             was tried again out of core (workload.offload, both modes{})",
            if report.host_optimizer {
                "; with cluster.host-cpu named, the optimizer on the host CPU too, with ZeRO and recomputation, and under ZeRO-3 the weights' shards"
            } else {
                ""
            }
        );
    }
    let mut reasons: Vec<_> = report.rejected.iter().collect();
    reasons.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(b.0)));
    for (reason, rejection) in reasons {
        let _ = writeln!(
            out,
            "  {:>8}  {reason} (e.g. {})",
            sim_core::units::thousands(rejection.count),
            rejection.example
        );
    }
    let [estimate, screen, finals] = report.walls;
    let _ = writeln!(
        out,
        "screened      {} simulated (analytical network) in order of their lower bound; {} could not beat the \
         {}th best and were skipped",
        sim_core::units::thousands(report.screened),
        sim_core::units::thousands(report.bounded_out),
        report.keep
    );
    if report.finals > 0 {
        let _ = writeln!(
            out,
            "final         {} simulated again with the {} network{}, in order of their floor (analytical time, \
             or lower bound) while it was below the best result{}{}",
            report.finals,
            report.fidelity.name(),
            match report.finals_stopped {
                0 => String::new(),
                n => format!(
                    " ({n} stopped part way, once certain to end after the {} best)",
                    options.top.max(1)
                ),
            },
            match report.final_pruned {
                0 => String::new(),
                n => format!("; {n} more whose analytical time was not, skipped"),
            },
            if report.could_beat_final == 0 { "; exact: none left could beat the winner" } else { "" }
        );
        if report.could_beat_final > 0 {
            let _ = writeln!(out, "{}", unchecked(report, options));
        }
    }
    let _ = writeln!(
        out,
        "wall time     {:.2} s estimates, {:.2} s screen, {:.2} s final",
        estimate.as_secs_f64(),
        screen.as_secs_f64(),
        finals.as_secs_f64()
    );
    for (label, message) in report.failed.iter().take(3) {
        let _ = writeln!(out, "failed        {label}: {message}");
    }
    let _ = writeln!(out);
    let has_budget = report.top.iter().any(|r| r.time_to_train_s.is_some());
    // A sequence model's throughput in tokens too, as LLM users count it.
    let has_tokens = report.top.iter().any(|r| r.summary.tokens_per_second.is_some());
    let has_cost = report.top.iter().any(|r| r.cost.is_some());
    let mut header = format!(
        "{:<4} {:>5} {:<34} {:>11} {:>13} {:>6} {:>11} {:>15}",
        "rank",
        format!("{unit}s"),
        "configuration",
        "iteration",
        format!("samples/s/{unit}"),
        "MFU",
        format!("memory/{unit}"),
        "spare"
    );
    if has_tokens {
        let _ = write!(header, " {:>15}", format!("tokens/s/{unit}"));
    }
    if has_budget {
        let _ = write!(header, " {:>12} {:>10}", "to train", format!("{unit}-hours"));
    }
    if has_cost {
        let _ = write!(header, " {:>10}", "cost");
    }
    let _ = writeln!(out, "{header}");
    for (i, ranked) in report.top.iter().enumerate() {
        let s = &ranked.summary;
        let mut line = format!(
            "{:<4} {:>5} {:<34} {:>11} {:>13.2} {:>5.1}% {:>8.1} GB {:>7.1} GB {:>3.0}%",
            i + 1,
            ranked.choice.gpus,
            ranked.choice.label(),
            format!("{}{}", s.iteration_time, if ranked.over_time_limit { "*" } else { "" }),
            s.samples_per_second_per_device,
            100.0 * s.model_flops_utilization,
            s.memory.total as f64 / 1e9,
            s.memory.spare as f64 / 1e9,
            100.0 * s.memory.spare_fraction
        );
        if has_tokens {
            let tokens = s.tokens_per_second.map_or(String::new(), |t| {
                sim_core::units::thousands((t / ranked.choice.gpus.max(1) as f64).round() as u64)
            });
            let _ = write!(line, " {tokens:>15}");
        }
        if let (Some(t), Some(h)) = (ranked.time_to_train_s, ranked.gpu_hours) {
            let _ = write!(
                line,
                " {:>12} {:>10}",
                long_duration(t),
                sim_core::units::thousands(h.round() as u64)
            );
        }
        if let Some(cost) = ranked.cost {
            let _ = write!(line, " {:>10}", sim_core::units::thousands(cost.round() as u64));
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    if report.top.iter().any(|r| r.over_time_limit) {
        let _ = writeln!(
            out,
            "* analytical, ranked after the rest: the {} simulation ran over --final-time-limit",
            report.fidelity.name()
        );
    }
    if let [first, second, ..] = report.top.as_slice() {
        let _ = writeln!(out);
        let _ = write!(out, "{}", explain(first, second, unit));
    }
    out
}

/// The winner against the runner-up: their breakdowns side by side and the largest
/// differences named.
fn explain(first: &Ranked, second: &Ranked, unit: &str) -> String {
    let mut out = String::new();
    let (a, b) = (&first.summary, &second.summary);
    let faster = 100.0 * (b.iteration_time.as_secs_f64() / a.iteration_time.as_secs_f64().max(1e-30) - 1.0);
    let _ = writeln!(
        out,
        "why #1: {} per iteration against {} for #2 ({:+.1}%), per {unit} (mean):",
        a.iteration_time, b.iteration_time, -faster
    );
    let rows = breakdown_rows(a, b);
    let _ = writeln!(out, "  {:<28} {:>12} {:>12} {:>12}", "", "#1", "#2", "#1 - #2");
    for (name, x, y) in &rows {
        if *x == 0.0 && *y == 0.0 {
            continue;
        }
        let _ = writeln!(out, "  {name:<28} {:>12} {:>12} {:>12}", seconds(*x), seconds(*y), signed(x - y));
    }
    let _ = writeln!(
        out,
        "  {:<28} {:>9.1} GB {:>9.1} GB",
        format!("memory per {unit}"),
        a.memory.total as f64 / 1e9,
        b.memory.total as f64 / 1e9
    );
    // Where #1 gains and where it loses (top-level rows, 1 ms or 0.1% of the iteration at least).
    let noise = (1e-3f64).min(a.iteration_time.as_secs_f64() * 1e-3);
    let mut gaps: Vec<(&str, f64)> = rows
        .iter()
        .filter(|(name, _, _)| !name.starts_with("  "))
        .map(|(name, x, y)| (*name, x - y))
        .filter(|(_, gap)| gap.abs() >= noise)
        .collect();
    gaps.sort_by(|x, y| x.1.abs().total_cmp(&y.1.abs()).reverse());
    let list = |gain: bool| -> String {
        gaps.iter()
            .filter(|(_, gap)| (*gap < 0.0) == gain)
            .map(|(name, gap)| format!("{name} ({})", signed(*gap)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (gains, losses) = (list(true), list(false));
    if !gains.is_empty() {
        let _ = writeln!(out, "  #1 gains in {gains}");
    }
    if !losses.is_empty() {
        let _ = writeln!(out, "  #1 loses in {losses}");
    }
    out
}

fn signed(value: f64) -> String {
    if value < 0.0 { format!("-{}", seconds(-value)) } else { format!("+{}", seconds(value)) }
}

/// (name, #1 seconds, #2 seconds) of the breakdown; sub-rows are indented.
fn breakdown_rows<'a>(a: &Summary, b: &Summary) -> Vec<(&'a str, f64, f64)> {
    let (x, y) = (&a.breakdown, &b.breakdown);
    let (gx, gy) = (&x.exposed_by_group, &y.exposed_by_group);
    let other_idle = |s: &Summary| {
        (s.breakdown.idle.as_secs_f64()
            - s.breakdown.bubble.as_secs_f64()
            - s.breakdown.host_bound.as_secs_f64())
        .max(0.0)
    };
    vec![
        ("compute", x.compute.as_secs_f64(), y.compute.as_secs_f64()),
        (
            "exposed communication",
            x.exposed_communication.as_secs_f64(),
            y.exposed_communication.as_secs_f64(),
        ),
        ("  tensor", gx.tensor, gy.tensor),
        ("  pipeline", gx.pipeline, gy.pipeline),
        ("  data", gx.data, gy.data),
        ("  context", gx.context, gy.context),
        ("  expert", gx.expert, gy.expert),
        ("pipeline bubble", x.bubble.as_secs_f64(), y.bubble.as_secs_f64()),
        ("host-bound", x.host_bound.as_secs_f64(), y.host_bound.as_secs_f64()),
        ("other idle", other_idle(a), other_idle(b)),
    ]
}

/// Whether a count is zero (a JSON field left out then).
fn is_zero(count: &u64) -> bool {
    *count == 0
}

/// `plan --json`.
#[derive(Serialize)]
struct JsonPlan<'a> {
    model: &'a str,
    /// The catalog name; on node groups of mixed devices, the groups' devices (`mixed (8 x
    /// A100-SXM4-80GB + 8 x H100-SXM5-80GB)`).
    device: String,
    global_batch: u64,
    objective: Objective,
    budget: Option<Budget>,
    enumerated: u64,
    valid: u64,
    rejected: &'a std::collections::BTreeMap<String, scenario::plan::Rejection>,
    screened: u64,
    bounded_out: u64,
    final_fidelity: &'static str,
    could_beat_final: u64,
    /// Of `could_beat_final`, those whose final simulation ran over `--final-time-limit`.
    could_beat_over_limit: u64,
    /// Final simulations run (with `final_fidelity`).
    finals: u64,
    /// Of `finals`, those stopped part way, once certain to end after the `--top` best;
    /// omitted when none.
    #[serde(skip_serializing_if = "is_zero")]
    finals_stopped: u64,
    /// The lowest floor of the configurations `--final-max` left unchecked (null: the stop
    /// was exact, or only time limits left some).
    could_beat_best_floor: Option<f64>,
    ignored: &'a [String],
    /// Nothing fit in device memory, so out-of-core training was searched too (and some fits).
    out_of_core: bool,
    /// ... with ZeRO-Offload's host optimizer among the modes tried (`cluster.host-cpu` named);
    /// omitted when not.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    out_of_core_host_optimizer: bool,
    top: Vec<JsonRanked<'a>>,
}

#[derive(Serialize)]
struct JsonRanked<'a> {
    gpus: u64,
    configuration: String,
    tensor: u32,
    sequence_parallel: bool,
    pipeline: u32,
    virtual_stages: u32,
    context: u32,
    expert: u32,
    data: u32,
    zero: u8,
    filter: u32,
    channel: u32,
    spatial: u32,
    micro_batch: u64,
    recompute: String,
    /// `parallelism.stage-placement` on node groups of mixed devices; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    stage_placement: Option<&'static str>,
    /// `parallelism.spatial-dims` of a spatial split; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    spatial_dims: Option<&'static str>,
    /// `parallelism.spatial-until` of a spatial split that ends before the first non-spatial
    /// layer; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    spatial_until: Option<&'a str>,
    /// `workload.offload` when out of core; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    offload: Option<&'static str>,
    /// The `KEY=VALUE` overrides that make this configuration of the cluster file as plan read
    /// it: `parasim run FILE --set ...` with each simulates it.
    set: Vec<String>,
    lower_bound_s: f64,
    time_to_train_s: Option<f64>,
    gpu_hours: Option<f64>,
    cost: Option<f64>,
    fidelity: &'static str,
    over_time_limit: bool,
    summary: &'a Summary,
}

impl<'a> JsonPlan<'a> {
    fn new(report: &'a PlanReport, search: &'a Search, options: &PlanOptions) -> Self {
        let base = &search.bases[0].scenario;
        JsonPlan {
            model: &base.model.name,
            device: match base.node_groups.as_deref().filter(|groups| groups.is_mixed()) {
                Some(groups) => groups.describe(),
                None => base.device.name.clone(),
            },
            global_batch: search.global_batch,
            objective: options.objective,
            budget: options.budget,
            enumerated: report.enumerated,
            valid: report.valid,
            rejected: &report.rejected,
            screened: report.screened,
            bounded_out: report.bounded_out,
            final_fidelity: report.fidelity.name(),
            could_beat_final: report.could_beat_final,
            could_beat_over_limit: report.could_beat_over_limit,
            finals: report.finals,
            finals_stopped: report.finals_stopped,
            could_beat_best_floor: report.left_best_floor,
            ignored: &search.ignored,
            out_of_core: report.out_of_core,
            out_of_core_host_optimizer: report.host_optimizer,
            top: report
                .top
                .iter()
                .map(|r| {
                    let p = &r.choice.parallelism;
                    JsonRanked {
                        gpus: r.choice.gpus,
                        configuration: r.choice.label(),
                        tensor: p.tensor,
                        sequence_parallel: p.sequence_parallel,
                        pipeline: p.pipeline,
                        virtual_stages: p.virtual_stages,
                        context: p.context,
                        expert: p.expert,
                        data: p.data,
                        zero: p.zero,
                        filter: p.filter,
                        channel: p.channel,
                        spatial: p.spatial,
                        micro_batch: r.choice.micro_batch,
                        recompute: r.choice.recompute.to_string(),
                        stage_placement: r.choice.stage_placement.map(|p| p.name()),
                        spatial_dims: (p.spatial > 1).then(|| p.spatial_dims.name()),
                        spatial_until: r.choice.spatial_until.as_deref(),
                        offload: (p.offload != strategies::Offload::None).then(|| p.offload.name()),
                        set: search.overrides(&r.choice).iter().map(ToString::to_string).collect(),
                        lower_bound_s: r.bound.as_secs_f64(),
                        time_to_train_s: r.time_to_train_s,
                        gpu_hours: r.gpu_hours,
                        cost: r.cost,
                        fidelity: r.fidelity.name(),
                        over_time_limit: r.over_time_limit,
                        summary: &r.summary,
                    }
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(could_beat_final: u64, could_beat_over_limit: u64) -> PlanReport {
        PlanReport {
            enumerated: 2000,
            rejected: Default::default(),
            valid: 1950,
            screened: 100,
            bounded_out: 1850,
            failed: Vec::new(),
            finals: 14,
            could_beat_final,
            could_beat_over_limit,
            finals_over_limit: could_beat_over_limit,
            finals_stopped: 0,
            final_pruned: 0,
            left_best_floor: (could_beat_final > could_beat_over_limit).then_some(16.5),
            top: Vec::new(),
            walls: Default::default(),
            fidelity: sim_core::fidelity::Fidelity::Flow,
            keep: 14,
            out_of_core: false,
            host_optimizer: false,
        }
    }

    fn options() -> PlanOptions {
        PlanOptions {
            memory_headroom: 0.1,
            final_work_budget: Some(10 * scenario::plan::FLOW_WORK_PER_SECOND),
            final_max: Some(20),
            objective: Objective::Time,
            top: 5,
            budget: None,
            gpu_hour_price: None,
        }
    }

    #[test]
    fn unchecked_names_the_limit_that_left_each_configuration_out_and_its_flag() {
        let count = unchecked(&report(513, 0), &options());
        assert_eq!(
            count,
            "unchecked     513 more could still beat the flow winner (their floor, analytical time or lower \
             bound, is below its result): 513 not checked with flow: the final stage stopped at --final-max 20 \
             configurations checked, the best floor left 16.500 s; raise --final-max, or 0 to check every one \
             (an exact stop)"
        );
        let both = unchecked(&report(515, 2), &options());
        assert!(both.contains("513 not checked with flow") && both.contains("raise --final-max"), "{both}");
        assert!(
            both.contains("2 ran over the time limit of each final simulation, --final-time-limit 10")
                && both.contains("raise --final-time-limit"),
            "{both}"
        );
        let time = unchecked(&report(3, 3), &options());
        assert!(!time.contains("--final-max") && time.contains("--final-time-limit 10"), "{time}");
        // --final-max below keep: the stage still checks the best keep.
        let small = PlanOptions { final_max: Some(4), ..options() };
        assert!(unchecked(&report(513, 0), &small).contains("--final-max 14 "));
    }
}
