//! `parasim`: the command-line front end. Parses arguments, loads scenarios, calls the
//! libraries and prints reports; no simulation logic lives here.

// `println!` and `eprintln!` panic when the stream is closed (`parasim ... | head`): print
// through `output` instead.
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod bench;
mod bench_guard;
mod calibrate_cmd;
mod collective_cmd;
mod compare_cmd;
mod embedded;
mod export_cmd;
#[cfg(test)]
mod fuzz;
mod layers_csv;
mod lock;
mod models;
mod output;
mod plan_cmd;
mod plot_cmd;
mod progress;
mod report;
mod sweep_cmd;
mod topo;
mod trace_cmd;
mod traffic_cmd;
mod validate_cmd;

use crate::output::stderr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};

use scenario::Scenario;

/// Discrete-event simulator of distributed deep-learning training on GPU clusters.
#[derive(Debug, Parser)]
#[command(name = "parasim", version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("PARASIM_REVISION"), ")"), about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Simulate the training iterations of one scenario and report where the time goes.
    Run {
        /// Scenario file (TOML). Without one, runs the built-in quickstart scenario
        /// (scenarios/quickstart.toml).
        scenario: Option<PathBuf>,
        /// Print the results as JSON (deterministic: wall-clock figures go to stderr).
        #[arg(long)]
        json: bool,
        /// Also write the simulated timeline as a Chrome trace (open it in Perfetto).
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// Also write a per-layer breakdown as CSV: one row per layer and pass (forward,
        /// backward-data, backward-weight, recompute) per pipeline stage, with FLOPs and kernel
        /// time, and the optimizer step.
        #[arg(long, value_name = "FILE.csv")]
        csv: Option<PathBuf>,
        /// Also write the gradient buckets as CSV: stage, collective, bytes, layers.
        #[arg(long, value_name = "FILE.csv")]
        buckets_csv: Option<PathBuf>,
        /// Change a scenario key before it is validated (repeatable; later ones win), as
        /// editing the file would: `--set parallelism.data=32 --set cluster.nodes=4`,
        /// `--set cluster.network.link-bandwidth="400 Gb/s"`. Numbers, booleans and quoted
        /// strings are typed as TOML reads them; other text is a string.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Wall-clock budget for the goodput report, in hours (the scenario's `[failures]`
        /// draws failures over it; overrides `failures.hours`, default 24).
        #[arg(long, value_name = "H")]
        hours: Option<f64>,
        /// Also write expected goodput against the checkpoint interval as CSV (needs
        /// `[failures]`): plot it with `parasim plot line FILE.csv --x checkpoint_interval_hours
        /// --y expected_goodput --logx -o goodput.svg`.
        #[arg(long, value_name = "FILE.csv")]
        goodput_csv: Option<PathBuf>,
        /// Iterations to simulate (`simulation.iterations`): with `[variability]`, Monte Carlo
        /// iterations with fresh draws each, summarised as a distribution (docs/variability.md).
        #[arg(long, value_name = "N")]
        iterations: Option<u32>,
        /// Seed of every draw of `[variability]` (`simulation.seed`; default 0).
        #[arg(long, value_name = "S")]
        seed: Option<u64>,
    },
    /// Replay real PyTorch profiler (Kineto) traces or execution traces (PyTorch ET, Chakra
    /// JSON or .et) on a cluster and compare simulated with measured iteration and collective
    /// times (docs/traces.md, docs/chakra.md).
    Replay {
        /// Kineto JSON files (plain or gzipped, one per rank), directories of them, or one
        /// .pstrace file; or execution traces (PyTorch ET JSON, Chakra JSON, Chakra .et files
        /// or a folder of them), one per rank; any of them may be in a .tar, .tar.gz or .tgz.
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// The Kineto trace of the same run as the execution traces given: kernel times come
        /// from it, collective sizes from the execution trace where it lacks them.
        #[arg(long, value_name = "KINETO")]
        kineto: Vec<PathBuf>,
        /// Replay on the [cluster] of this scenario instead of the cluster the trace implies.
        #[arg(long, value_name = "SCENARIO")]
        cluster: Option<PathBuf>,
        /// Device for the inferred cluster (a catalog name), when the trace records none or
        /// another is wanted.
        #[arg(long)]
        device: Option<String>,
        /// Network model: analytical, flow or packet-steps.
        #[arg(long, default_value = "analytical")]
        fidelity: String,
        /// Fixed cost per collective launch, on top of the network (0: the traced collectives'
        /// kernels already include NCCL's own launch).
        #[arg(long, default_value = "0 us")]
        launch: String,
        /// Chunk size of pipelined collective algorithms (tree, chain).
        #[arg(long, default_value = "1 MiB")]
        chunk: String,
        /// NCCL protocol: auto (NCCL's tuner; the default for NVIDIA GPUs), LL, LL128, Simple,
        /// or off (the links alone; the default for devices whose catalog `collectives` is not
        /// nccl).
        #[arg(long)]
        protocol: Option<String>,
        /// Re-target: simulate M ranks of data parallelism instead of the traced number.
        #[arg(long, value_name = "M")]
        ranks: Option<u32>,
        /// Replay only this traced rank; the other ranks of the job run as its copies.
        #[arg(long, value_name = "R")]
        rank: Option<u32>,
        /// Also write the simulated timeline as a Chrome trace (open it in Perfetto).
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// Print the comparison as JSON (wall-clock figures go to stderr).
        #[arg(long)]
        json: bool,
        /// No progress on standard error (a spinner on a terminal, else a line every 5 s
        /// while the traces are read and simulated).
        #[arg(long)]
        quiet: bool,
    },
    /// Fit the compute model to the kernels of real PyTorch profiler traces of one device type
    /// and write a profile a scenario can name (`[compute] profile = "FILE"`); reports the fit
    /// error per operation class (docs/compute-model.md).
    Calibrate {
        /// Kineto JSON files (plain or gzipped) or directories of them, recorded with
        /// `record_shapes=True`, all on one GPU type.
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// The traced GPU's catalog name (data/devices.toml), e.g. a100-sxm4-40gb.
        #[arg(long)]
        device: String,
        /// Where to write the profile (TOML); optional with --json, which prints it.
        #[arg(short, long, value_name = "PROFILE", required_unless_present_any = ["check", "json"])]
        output: Option<PathBuf>,
        /// Do not fit: report how well this profile (a file, or a built-in by device name)
        /// predicts the traces' kernels, next to the defaults.
        #[arg(long, value_name = "PROFILE", conflicts_with = "output")]
        check: Option<String>,
        /// With --check: allow a profile calibrated on another device type, to measure how a
        /// profile transfers (`run` refuses such a profile).
        #[arg(long, requires = "check")]
        any_device: bool,
        /// Print the profile as JSON instead of the report (with --check: the check's errors
        /// as JSON).
        #[arg(long)]
        json: bool,
        /// Also report the fit's error per operator name (aten::mm, aten::add, ...).
        #[arg(long)]
        by_operator: bool,
        /// Hold a parameter at a value instead of fitting it (repeatable), e.g.
        /// `--hold gemm-ramp-exponent=1` or `--hold launch-overhead="2 us"`.
        #[arg(long, value_name = "KEY=VALUE")]
        hold: Vec<String>,
    },
    /// Compare a scenario's simulated strategy with a real multi-rank profiler trace of the same
    /// job: iteration time, GPU time per kernel class, NCCL time per collective kind
    /// (docs/traces.md).
    Compare {
        /// Kineto trace: a directory of rank files, rank files, or a .pstrace file; or an
        /// execution trace (docs/chakra.md).
        trace: PathBuf,
        /// The Kineto trace of the same run when TRACE is an execution trace.
        #[arg(long, value_name = "KINETO")]
        kineto: Vec<PathBuf>,
        /// Scenario of the traced job (same GPU count as the trace's world size).
        scenario: PathBuf,
        /// Print the comparison as JSON (deterministic).
        #[arg(long)]
        json: bool,
    },
    /// Run a parameter sweep on every core (`parasim sweep SWEEP.toml [-o OUT.csv]`), or merge
    /// the outputs of its shards (`parasim sweep merge OUT.csv SHARD...`); docs/sweep.md.
    Sweep(sweep_cmd::SweepCli),
    /// The strategy oracle: search every way of splitting a model over a cluster (data, tensor,
    /// sequence, pipeline, virtual stages, context, expert, ZeRO, micro-batch, recomputation;
    /// CNNs: data, spatial, filter, channel, pipeline), refuse what does not fit, simulate the
    /// rest cheapest bound first, print the best and why (`parasim plan --model gpt3-175b
    /// --cluster scenarios/gpt3-175b-1024.toml`)
    Plan(plan_cmd::PlanArgs),
    /// Draw a chart of a sweep's CSV (scaling curves, stacked time breakdowns, heatmaps), of
    /// `parasim validate --csv` (simulated against measured), of `parasim run --csv` (a roofline
    /// of its kernels) or of runs' JSON (iteration-time distributions, goodput against the
    /// checkpoint interval), as SVG or PNG.
    Plot(plot_cmd::PlotCli),
    /// Trace file utilities.
    #[command(subcommand)]
    Trace(TraceCommand),
    /// Write a scenario's lowered iteration in another tool's format: `--chakra DIR` writes
    /// Chakra execution traces, one protobuf .et file per rank, for ASTRA-sim (docs/chakra.md).
    Export {
        /// Folder to write `NAME.RANK.et` and `comm_group.json` into (created if missing).
        #[arg(long, value_name = "DIR", required = true)]
        chakra: PathBuf,
        /// Scenario file (TOML).
        scenario: PathBuf,
        /// Change a scenario key before it is validated (repeatable), as `run --set` does.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Time standard scenarios on this machine: wall time and events per second.
    Bench {
        /// GPU counts to run the quickstart at (multiples of 8).
        #[arg(long, value_delimiter = ',', default_value = "64,1024,16384")]
        gpus: Vec<u32>,
        /// Runs per configuration; the fastest is reported. With --guard: attempts of a case
        /// that looks slower than the tolerance allows (of every case with --write-baseline).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        repeats: u32,
        /// Also time GPT-3 175B (tensor 8 x pipeline 16) at these GPU counts (multiples of
        /// 128): `flow` at 1024 GPUs and less, `analytical` above. With no value, skips it.
        #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1024,16384")]
        strategy_gpus: Vec<u32>,
        /// Also time this many Monte Carlo iterations of the quickstart on 1,024 GPUs with 1% of
        /// the GPUs 1.2x slower and 5% lognormal kernel noise (the straggler tour's variability,
        /// docs/variability.md); 0 skips it.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
        monte_carlo: u32,
        /// Print the measurements as JSON (seconds, events per second).
        #[arg(long, conflicts_with = "guard")]
        json: bool,
        /// Instead of the tables, time the slow paths (deep lowering, collectives over many
        /// ranks, calibration, charts of many series, the packet-steps allreduce, both tables'
        /// runs) against the committed baselines and exit with status 1 naming any case more
        /// than --tolerance times slower (docs/benchmarks.md).
        #[arg(long)]
        guard: bool,
        /// With --guard: a case fails when this many times slower than its baseline, per unit
        /// of size and relative to a reference workload timed beside it (CI uses 10).
        #[arg(long, requires = "guard", default_value_t = bench_guard::DEFAULT_TOLERANCE)]
        tolerance: f64,
        /// With --guard: only this case (repeatable): run-quickstart, run-gpt3-flow,
        /// lowering-deep, collective-ranks, calibrate-trace, plot-series, run-moe-flow,
        /// packet-steps-tree, packet-steps-ring.
        #[arg(long = "case", requires = "guard", value_name = "NAME")]
        cases: Vec<String>,
        /// With --guard: the baseline file (the committed data/bench/baseline.toml, embedded,
        /// if omitted).
        #[arg(long, requires = "guard", value_name = "FILE", conflicts_with = "write_baseline")]
        baseline: Option<PathBuf>,
        /// With --guard: measure every case (fastest of --repeats) and write this build's
        /// baselines to FILE, keeping the other build's.
        #[arg(long, requires = "guard", value_name = "FILE")]
        write_baseline: Option<PathBuf>,
    },
    /// Time one collective over a range of sizes, printed like nccl-tests
    /// (`parasim collective allreduce --cluster SCENARIO --ranks 16 -b 8 -e 8G -f 2`).
    Collective {
        /// allreduce, reduce-scatter, allgather, alltoall, broadcast, reduce (or nccl-tests'
        /// all_reduce, reduce_scatter, all_gather).
        kind: String,
        /// Scenario whose [cluster] is used (the built-in quickstart's if omitted).
        #[arg(long)]
        cluster: Option<PathBuf>,
        /// Ranks taking part: the first N GPUs (all if omitted).
        #[arg(long)]
        ranks: Option<u32>,
        /// Smallest size (8, 1K, 128M, 8G: powers of 1024).
        #[arg(short = 'b', long = "minbytes", default_value = "8")]
        min_bytes: String,
        /// Largest size.
        #[arg(short = 'e', long = "maxbytes", default_value = "128M")]
        max_bytes: String,
        /// Factor between sizes.
        #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
        factor: u64,
        /// Algorithm: auto (the fastest by estimate, as NCCL's tuner) or one by name.
        #[arg(long, default_value = "auto")]
        algorithm: String,
        /// Network model: analytical, flow or packet-steps.
        #[arg(long, default_value = "flow")]
        fidelity: String,
        /// Element type (for the count column).
        #[arg(short = 'd', long = "datatype", default_value = "float")]
        dtype: String,
        /// Fixed cost per collective launch (NCCL's tuning model: 8.4 us).
        #[arg(long, default_value = "8.4 us")]
        launch: String,
        /// nccl-tests output (e.g. all_reduce_perf's) to print next to the simulation, with
        /// the error per size.
        #[arg(long)]
        compare: Option<PathBuf>,
        /// Chunk size of pipelined algorithms (tree, chain).
        #[arg(long, default_value = "1 MiB")]
        chunk: String,
        /// NCCL protocol: auto (the fastest by NCCL's model), LL, LL128, Simple, or off (pure
        /// network).
        #[arg(long, default_value = "auto")]
        protocol: String,
        /// GPUs driven by each benchmark process (nccl-tests' -g); from the compared output's
        /// header, else 1, if omitted.
        #[arg(short = 'g', long = "gpus-per-process")]
        gpus_per_process: Option<u32>,
        /// Host time to launch one collective on one GPU (nccl-tests' iterations cannot run
        /// faster than the launches of every GPU of a process).
        #[arg(long, default_value = "4 us")]
        host_launch: String,
        /// Write a plot of bus bandwidth against size (simulated, and measured with --compare)
        /// to this file: SVG or PNG by its extension.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Print the sizes as JSON (seconds, bytes/s) instead of the nccl-tests table.
        #[arg(long)]
        json: bool,
    },
    /// Run the validation suite (data/validation/): every published measurement as a case,
    /// simulated in parallel, with accuracy per case, per family and overall, test cases apart
    /// from the calibration cases fitted constants were set on (docs/validation.md).
    Validate(validate_cmd::ValidateArgs),
    /// Describe a scenario's cluster: hosts, switches, links, bisection bandwidth, diameter,
    /// path lengths.
    Topo {
        /// Scenario file (only its [cluster] table is read).
        scenario: PathBuf,
        /// Also write the graph in Graphviz format to this file.
        #[arg(long)]
        dot: Option<PathBuf>,
        /// Print the description as JSON (numbers in SI base units: bytes/s, seconds).
        #[arg(long)]
        json: bool,
    },
    /// Run a traffic matrix on a scenario's cluster (hosts are its GPUs, as ranks), every flow
    /// one fluid flow of the max-min fair flow network: completion time, per-flow completion
    /// percentiles, throughput against offered, the 10 most loaded links
    /// (`parasim traffic --cluster SCENARIO shift 1 --size 16M`).
    Traffic {
        /// Scenario whose [cluster] is used.
        #[arg(long)]
        cluster: PathBuf,
        /// permutation, shift K, all-to-all, incast N, bisection, uniform-random, adversarial
        /// (dragonflies: every host of group g sends to group g+1), or a file of
        /// src,dst,bytes[,start] rows.
        pattern: String,
        /// The pattern's argument: K of shift, N of incast.
        argument: Option<String>,
        /// Bytes of every flow of a built-in pattern (8, 1K, 16M, 1G: powers of 1024; or "1 MiB").
        #[arg(long, default_value = "16M")]
        size: String,
        /// Seed of permutation and uniform-random (the same seed gives the same flows).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Flows of uniform-random.
        #[arg(long)]
        flows: Option<u64>,
        /// Refuse patterns with more flows than this (a 16,384-host all-to-all has 268 M).
        #[arg(long, default_value_t = traffic_cmd::DEFAULT_MAX_FLOWS)]
        max_flows: u64,
        /// Print everything as JSON (seconds, bytes/s), every flow included.
        #[arg(long, conflicts_with = "csv")]
        json: bool,
        /// Print one CSV row per flow: src, dst, bytes, start_s, finish_s.
        #[arg(long)]
        csv: bool,
    },
    /// List the model zoo: name, family, parameters, forward GFLOPs per sample, input shape.
    Models {
        /// Print the list as JSON (FLOPs, not GFLOPs).
        #[arg(long)]
        json: bool,
    },
    /// Show one model layer by layer: output shapes, parameters, FLOPs, activations, totals.
    Inspect {
        /// A zoo model (`parasim models` lists them) or the path of a model file.
        model: String,
        /// Samples the FLOP and activation columns are computed for.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
        batch: u64,
        /// Print the layers and totals as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout
    ///
    /// For example `parasim completions bash >
    /// ~/.local/share/bash-completion/completions/parasim` (README, quick start).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), or write it to a file (`-o parasim.1`), or write it and a page
    /// per subcommand to a folder (`--dir DIR`)
    Man {
        /// Write the man page to this file instead of stdout.
        #[arg(long, short = 'o', value_name = "FILE")]
        output: Option<PathBuf>,
        /// Write parasim.1 and a page per subcommand (parasim-validate.1, ...) to this folder.
        #[arg(long, value_name = "DIR", conflicts_with = "output")]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum TraceCommand {
    /// Convert between Kineto JSON (files or a directory, one rank per file) and the binary
    /// .pstrace format, chosen by the output's extension (.pstrace, or .json / a directory).
    Convert {
        /// Input trace(s), then the output path.
        #[arg(required = true, num_args = 2.., value_name = "INPUT... OUTPUT")]
        paths: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // A closed pipe (`parasim run | head`) is not an error.
            if output::closed_pipe(&error) {
                return ExitCode::SUCCESS;
            }
            stderr!("error: {}", message(&error));
            if error.downcast_ref::<validate_cmd::BoundsBroken>().is_some()
                || error.downcast_ref::<bench_guard::GuardFailed>().is_some()
            {
                return ExitCode::from(1);
            }
            ExitCode::from(2)
        }
    }
}

/// The error and its causes, each cause once: library errors often print their source in
/// their own message too, and `{:#}` would repeat it at every level.
fn message(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&cause);
        }
    }
    text
}

fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run {
            scenario,
            json,
            trace,
            csv,
            buckets_csv,
            set,
            hours,
            goodput_csv,
            iterations,
            seed,
        } => {
            let mut overrides = overrides(&set)?;
            if let Some(iterations) = iterations {
                overrides.push(scenario::Override::new("simulation.iterations", i64::from(iterations)));
            }
            if let Some(seed) = seed {
                overrides.push(
                    scenario::Override::integer("simulation.seed", seed)
                        .map_err(|error| anyhow::anyhow!("--seed {error}"))?,
                );
            }
            if let Some(path) = &scenario
                && fs_err::read_to_string(path).is_ok_and(|text| scenario::text_has_jobs(&text))
            {
                let refused = [
                    ("--trace", trace.is_some()),
                    ("--csv", csv.is_some()),
                    ("--buckets-csv", buckets_csv.is_some()),
                    ("--hours", hours.is_some()),
                    ("--goodput-csv", goodput_csv.is_some()),
                ];
                if let Some((flag, _)) = refused.iter().find(|(_, given)| *given) {
                    anyhow::bail!(
                        "{flag}: {} holds several jobs ([[jobs]]), whose run reports each job's slowdown; {flag} takes a one-job scenario",
                        path.display()
                    );
                }
                let jobs = scenario::JobsScenario::load_with(path, &overrides).map_err(set_error)?;
                let outcome = scenario::jobs::simulate(&jobs)?;
                if json {
                    let mut text = serde_json::to_vec_pretty(&outcome.summary).context("writing JSON")?;
                    text.push(b'\n');
                    output::print(text).context("writing JSON")?;
                    stderr!("{}", report::jobs_engine_line(&outcome).trim_start_matches("engine").trim());
                } else {
                    output::print(report::jobs_human(&outcome)).context("writing the report")?;
                }
                return Ok(());
            }
            let mut scenario = match scenario {
                Some(path) => Scenario::load_with(&path, &overrides),
                None => {
                    stderr!("no scenario given: running the built-in quickstart (scenarios/quickstart.toml)");
                    Scenario::parse_with(
                        scenario::QUICKSTART,
                        Path::new("scenarios/quickstart.toml"),
                        &overrides,
                    )
                }
            }
            .map_err(set_error)?;
            refuse_mixed_devices(
                &scenario,
                &[("--csv", csv.is_some()), ("--buckets-csv", buckets_csv.is_some())],
            )?;
            if let Some(hours) = hours {
                let failures = scenario.failures.as_mut().ok_or_else(|| {
                    anyhow::anyhow!(
                        "--hours: {} has no [failures] table: goodput needs failures (gpu-mtbf-hours, events) and a checkpoint policy (docs/failures.md)",
                        scenario.source
                    )
                })?;
                failures.hours = scenario::failures::check_hours(hours)
                    .map_err(|message| anyhow::anyhow!("--hours: {message}"))?;
            }
            if trace.is_some()
                && scenario.iterations > scenario::MAX_ITERATIONS
                && !scenario.variability.is_active()
            {
                anyhow::bail!(
                    "--trace: {}: key `simulation.iterations` is {}; a timeline keeps every op, so --trace takes at most {} iterations (more are streamed and dropped as they finish)",
                    scenario.source,
                    scenario.iterations,
                    scenario::MAX_ITERATIONS
                );
            }
            let outcome = scenario::simulation::simulate_counting_link_bytes(&scenario)?;
            for warning in &outcome.summary.warnings {
                stderr!("warning: {}: {warning}", scenario.source);
            }
            let links = traffic_cmd::run_links(&scenario, &outcome)?;
            if let Some(path) = &trace {
                trace_cmd::export_run(&scenario, &outcome, links.as_deref(), path)?;
            }
            if csv.is_some() || buckets_csv.is_some() {
                layers_csv::write(&scenario, csv.as_deref(), buckets_csv.as_deref())?;
            }
            if let Some(path) = &goodput_csv {
                let goodput = outcome.summary.goodput.as_ref().ok_or_else(|| {
                    anyhow::anyhow!(
                        "--goodput-csv: {} has no [failures] table: goodput needs failures and a checkpoint policy (docs/failures.md)",
                        scenario.source
                    )
                })?;
                let mut text = scenario::csv_text::line(&[
                    "checkpoint_interval_iterations",
                    "checkpoint_interval_hours",
                    "expected_goodput",
                ]);
                for point in &goodput.curve {
                    text.push_str(&scenario::csv_text::line(&[
                        point.iterations.to_string(),
                        point.hours.to_string(),
                        point.goodput.to_string(),
                    ]));
                }
                traces::atomic::write(path, text.into_bytes()).context("writing the goodput CSV")?;
            }
            if json {
                // Serialized first: serde_json would hide a broken pipe inside its own error.
                let mut text = serde_json::to_vec_pretty(&traffic_cmd::RunJson {
                    summary: &outcome.summary,
                    busiest_link_per_kind: links.as_deref().map(traffic_cmd::per_kind),
                    busiest_links: links.map(|mut all| {
                        all.truncate(10);
                        all
                    }),
                })
                .context("writing JSON")?;
                text.push(b'\n');
                output::print(text).context("writing JSON")?;
                stderr!("{}", report::engine_line(&outcome).trim_start_matches("engine").trim());
            } else {
                let mut text = report::human(&outcome);
                text.push_str(&traffic_cmd::links_text(links.as_deref()));
                output::print(text).context("writing the report")?;
            }
            Ok(())
        }
        Command::Replay {
            traces,
            kineto,
            cluster,
            device,
            fidelity,
            launch,
            chunk,
            protocol,
            ranks,
            rank,
            trace,
            json,
            quiet,
        } => {
            let protocols = protocol
                .map(|name| name.parse::<sim_core::nccl::protocol::ProtocolChoice>())
                .transpose()
                .map_err(anyhow::Error::msg)
                .context("--protocol")?;
            let args = trace_cmd::ReplayArgs {
                traces,
                kineto,
                cluster,
                device,
                network: network_settings(&fidelity, &launch, &chunk)?,
                protocols,
                ranks,
                rank,
                trace_out: trace,
                json,
                quiet,
            };
            let text = trace_cmd::replay(&args)?;
            output::print(text).context("writing the report")?;
            Ok(())
        }
        Command::Calibrate { traces, device, output, check, any_device, json, by_operator, hold } => {
            let args =
                calibrate_cmd::Args { traces, device, output, check, any_device, json, by_operator, hold };
            let text = calibrate_cmd::calibrate(&args)?;
            output::print(text).context("writing the report")?;
            Ok(())
        }
        Command::Compare { trace, kineto, scenario, json } => {
            let text = compare_cmd::compare(&trace, &kineto, &scenario, json)?;
            output::print(text).context("writing the report")?;
            Ok(())
        }
        Command::Export { chakra, scenario, set } => {
            let overrides = overrides(&set)?;
            let scenario = Scenario::load_with(&scenario, &overrides).map_err(set_error)?;
            refuse_mixed_devices(&scenario, &[("export --chakra", true)])?;
            let text = export_cmd::chakra(&scenario, &chakra)?;
            output::print(text).context("writing the report")?;
            Ok(())
        }
        Command::Sweep(args) => sweep_cmd::sweep(args),
        Command::Plan(args) => {
            let text = plan_cmd::plan(&args)?;
            output::print(text).context("writing the plan")?;
            Ok(())
        }
        Command::Plot(args) => plot_cmd::plot(args),
        Command::Trace(TraceCommand::Convert { mut paths }) => {
            let output = paths.pop().context("no output path")?;
            let text = trace_cmd::convert(&paths, &output)?;
            output::print(text).context("writing the report")?;
            Ok(())
        }
        Command::Bench { guard: true, repeats, tolerance, cases, baseline, write_baseline, .. } => {
            let table = bench_guard::guard(&bench_guard::GuardOptions {
                baseline: baseline.as_deref(),
                tolerance,
                cases: &cases,
                attempts: repeats,
                write_baseline: write_baseline.as_deref(),
            })?;
            output::print(table).context("writing the table")?;
            Ok(())
        }
        Command::Bench { gpus, repeats, strategy_gpus, json, monte_carlo, .. } => {
            let quickstart = bench::run(&gpus, repeats)?;
            let configurations: Vec<(u32, sim_core::fidelity::Fidelity)> = strategy_gpus
                .iter()
                .map(|&g| {
                    let fidelity = if g <= 1024 {
                        sim_core::fidelity::Fidelity::Flow
                    } else {
                        sim_core::fidelity::Fidelity::Analytical
                    };
                    (g, fidelity)
                })
                .collect();
            let gpt3 = bench::strategies(&configurations, repeats)?;
            let monte_carlo = bench::monte_carlo(monte_carlo, repeats)?;
            let text = if json {
                bench::json(&quickstart, &gpt3, monte_carlo.as_ref(), repeats)?
            } else {
                let mut table = bench::run_table(&quickstart, repeats);
                if !gpt3.is_empty() {
                    table.push('\n');
                    table.push_str(&bench::strategies_table(&gpt3, repeats));
                }
                if let Some(monte_carlo) = &monte_carlo {
                    table.push('\n');
                    table.push_str(&bench::monte_carlo_table(monte_carlo, repeats));
                }
                table
            };
            output::print(text).context("writing the table")?;
            Ok(())
        }
        command @ Command::Collective { .. } => {
            let table = collective(command)?;
            output::print(table).context("writing the table")?;
            Ok(())
        }
        Command::Validate(args) => {
            let text = validate_cmd::validate(&args)?;
            output::print(text).context("writing the report")?;
            Ok(())
        }
        Command::Topo { scenario, dot, json } => {
            let text = topo::describe(&scenario, dot.as_deref(), json)?;
            output::print(text).context("writing the description")?;
            Ok(())
        }
        command @ Command::Traffic { .. } => {
            let text = traffic(command, None)?;
            output::print(text).context("writing the report")?;
            Ok(())
        }
        Command::Models { json } => {
            let table = models::list(json)?;
            output::print(table).context("writing the table")?;
            Ok(())
        }
        Command::Inspect { model, batch, json } => {
            let table = models::inspect(&model, batch, json)?;
            output::print(table).context("writing the table")?;
            Ok(())
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "parasim", &mut script);
            output::print(script).context("writing the completion script")?;
            Ok(())
        }
        Command::Man { dir: Some(dir), .. } => {
            fs_err::create_dir_all(&dir).context("writing the man pages")?;
            // As clap_mangen::generate_to names and renders them, each page written whole.
            let mut command = Cli::command().disable_help_subcommand(true);
            command.build();
            write_man_pages(command, &dir)
                .with_context(|| format!("writing the man pages to {}", dir.display()))?;
            Ok(())
        }
        Command::Man { output, dir: None } => {
            let mut page = Vec::new();
            // As `--dir` writes it: no `parasim help` entry, which has no page of its own.
            clap_mangen::Man::new(Cli::command().disable_help_subcommand(true))
                .render(&mut page)
                .context("rendering the man page")?;
            match output {
                Some(path) => traces::atomic::write(&path, page).context("writing the man page")?,
                None => output::print(page).context("writing the man page")?,
            }
            Ok(())
        }
    }
}

/// Writes the man page of `command` and one per visible subcommand into `dir`, named as
/// `clap_mangen::generate_to` names them, each through a temporary name.
fn write_man_pages(command: clap::Command, dir: &Path) -> anyhow::Result<()> {
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
        write_man_pages(sub, dir)?;
    }
    let man = clap_mangen::Man::new(command);
    let path = dir.join(man.get_filename());
    traces::atomic::write_with(&path, |file| man.render(file))?;
    Ok(())
}

/// `parasim collective`: its flags checked and turned into the benchmark's options, and the
/// table (or JSON) it prints. Apart from `execute` so that the fuzz tests (src/fuzz.rs) run
/// the command's whole input validation on parsed arguments.
fn collective(command: Command) -> anyhow::Result<String> {
    collective_with(command, None)
}

/// `traffic`'s report; `max_flows_cap` lowers `--max-flows` (the fuzz target's cap, so that a
/// valid matrix it draws runs in under a second).
fn traffic(command: Command, max_flows_cap: Option<u64>) -> anyhow::Result<String> {
    let Command::Traffic { cluster, pattern, argument, size, seed, flows, max_flows, json, csv } = command
    else {
        anyhow::bail!("not a traffic command");
    };
    traffic_cmd::traffic(&traffic_cmd::Options {
        cluster: &cluster,
        pattern: &pattern,
        argument: argument.as_deref(),
        seed,
        flows,
        size: &size,
        max_flows: max_flows_cap.map_or(max_flows, |cap| max_flows.min(cap)),
        json,
        csv,
    })
}

/// `collective` with a flow work budget (`NetworkSettings::work_budget`): a run past it gives
/// up with a clean error. The fuzz target uses one, so that a valid but long benchmark (a
/// `packet-steps` chain over terabytes, linear in the bytes) is not taken for a hang.
fn collective_with(command: Command, work_budget: Option<u64>) -> anyhow::Result<String> {
    let Command::Collective {
        kind,
        cluster,
        ranks,
        min_bytes,
        max_bytes,
        factor,
        algorithm,
        fidelity,
        dtype,
        launch,
        compare,
        chunk,
        protocol,
        gpus_per_process,
        host_launch,
        plot,
        json,
    } = command
    else {
        anyhow::bail!("not a collective command");
    };
    let protocols: sim_core::nccl::protocol::ProtocolChoice =
        protocol.parse().map_err(anyhow::Error::msg).context("--protocol")?;
    let network = sim_core::fidelity::NetworkSettings {
        work_budget,
        ..network_settings(&fidelity, &launch, &chunk)?.with_protocols(protocols)
    };
    let host_launch = host_launch.parse().with_context(|| format!("--host-launch {host_launch:?}"))?;
    let options = collective_cmd::Options {
        kind: &kind,
        cluster: cluster.as_deref(),
        ranks,
        min_bytes: &min_bytes,
        max_bytes: &max_bytes,
        factor,
        algorithm: &algorithm,
        network,
        dtype: &dtype,
        compare: compare.as_deref(),
        gpus_per_process,
        host_launch,
        plot: plot.as_deref(),
        json,
    };
    collective_cmd::benchmark(&options)
}

/// The `--set KEY=VALUE` overrides, in order.
fn overrides(texts: &[String]) -> anyhow::Result<Vec<scenario::Override>> {
    texts.iter().map(|text| text.parse().map_err(|error| anyhow::anyhow!("--set {error}"))).collect()
}

/// A scenario error, naming `--set` when an override set the key at fault.
fn set_error(error: scenario::ScenarioError) -> anyhow::Error {
    match error {
        error @ (scenario::ScenarioError::Overridden { .. } | scenario::ScenarioError::Override(_)) => {
            anyhow::anyhow!("--set {error}")
        }
        other => other.into(),
    }
}

/// The network settings of `--fidelity`, `--launch` and `--chunk`.
fn network_settings(
    fidelity: &str,
    launch: &str,
    chunk: &str,
) -> anyhow::Result<sim_core::fidelity::NetworkSettings> {
    let fidelity: sim_core::fidelity::Fidelity =
        fidelity.parse().map_err(|message: String| anyhow::anyhow!("--fidelity: {message}"))?;
    let launch = launch.parse().with_context(|| format!("--launch {launch:?}"))?;
    let chunk: sim_core::units::Bytes = chunk.parse().with_context(|| format!("--chunk {chunk:?}"))?;
    if chunk.0 == 0 {
        anyhow::bail!("--chunk must be greater than 0");
    }
    Ok(sim_core::fidelity::NetworkSettings::new(fidelity).with_collective_launch(launch).with_chunk(chunk))
}

/// Refuses the outputs that describe one device's kernels (`--csv`'s layers, the Chakra
/// export) for a scenario whose node groups hold several device types, rather than writing
/// the first group's kernels for every rank.
fn refuse_mixed_devices(scenario: &Scenario, outputs: &[(&str, bool)]) -> anyhow::Result<()> {
    let mixed = scenario.node_groups.as_deref().is_some_and(|groups| groups.is_mixed());
    if let Some((flag, _)) = outputs.iter().find(|(_, given)| *given)
        && mixed
    {
        anyhow::bail!(
            "{flag}: {} runs several device types ([[cluster.node-groups]]), and {flag} describes one device's kernels; run it on a one-device copy of the scenario (docs/variability.md, Mixed devices)",
            scenario.source
        );
    }
    Ok(())
}
