//! `parasim`: the command-line front end. Parses arguments, loads scenarios, calls the
//! libraries and prints reports; no simulation logic lives here.

mod bench;
mod models;
mod report;
mod run;
mod scenario;
mod topo;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::scenario::Scenario;

/// Discrete-event simulator of distributed deep-learning training on GPU clusters.
#[derive(Debug, Parser)]
#[command(name = "parasim", version, about, long_about = None)]
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
    },
    /// Time standard scenarios on this machine: wall time and events per second.
    Bench {
        /// GPU counts to run the quickstart at (multiples of 8).
        #[arg(long, value_delimiter = ',', default_value = "64,1024,16384")]
        gpus: Vec<u32>,
        /// Runs per configuration; the fastest is reported.
        #[arg(long, default_value_t = 3)]
        repeats: u32,
    },
    /// Describe a scenario's cluster: hosts, switches, links, bisection bandwidth, diameter,
    /// path lengths.
    Topo {
        /// Scenario file (only its [cluster] table is read).
        scenario: PathBuf,
        /// Also write the graph in Graphviz format to this file.
        #[arg(long)]
        dot: Option<PathBuf>,
    },
    /// List the model zoo: name, family, parameters, forward GFLOPs per sample, input shape.
    Models,
    /// Show one model layer by layer: output shapes, parameters, FLOPs, activations, totals.
    Inspect {
        /// A zoo model (`parasim models` lists them) or the path of a model file.
        model: String,
        /// Samples the FLOP and activation columns are computed for.
        #[arg(long, default_value_t = 1)]
        batch: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // A closed pipe (`parasim run | head`) is not an error.
            if error.chain().any(|cause| {
                cause
                    .downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run { scenario, json } => {
            let scenario = match scenario {
                Some(path) => Scenario::load(&path)?,
                None => {
                    eprintln!(
                        "no scenario given: running the built-in quickstart (scenarios/quickstart.toml)"
                    );
                    Scenario::parse(scenario::QUICKSTART, Path::new("scenarios/quickstart.toml"))?
                }
            };
            let outcome = run::simulate(&scenario)?;
            let mut stdout = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut stdout, &outcome.summary).context("writing JSON")?;
                writeln!(stdout).context("writing JSON")?;
                eprintln!("{}", report::engine_line(&outcome).trim_start_matches("engine").trim());
            } else {
                write!(stdout, "{}", report::human(&outcome)).context("writing the report")?;
            }
            Ok(())
        }
        Command::Bench { gpus, repeats } => {
            let table = bench::run(&gpus, repeats)?;
            std::io::stdout().lock().write_all(table.as_bytes()).context("writing the table")?;
            Ok(())
        }
        Command::Topo { scenario, dot } => {
            let text = topo::describe(&scenario, dot.as_deref())?;
            std::io::stdout().lock().write_all(text.as_bytes()).context("writing the description")?;
            Ok(())
        }
        Command::Models => {
            let table = models::list()?;
            std::io::stdout().lock().write_all(table.as_bytes()).context("writing the table")?;
            Ok(())
        }
        Command::Inspect { model, batch } => {
            let table = models::inspect(&model, batch)?;
            std::io::stdout().lock().write_all(table.as_bytes()).context("writing the table")?;
            Ok(())
        }
    }
}
