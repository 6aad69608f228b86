//! parasim's application library: what a user asks for, run.
//!
//! - the scenario file format ([`Scenario`], [`Cluster`]): TOML read into wire structs (serde,
//!   unknown keys rejected), [`Override`]s applied (the one way to vary a scenario: `run --set`,
//!   sweeps, plan's candidates, validation baselines, bench), then validated; every error names
//!   the file and the key;
//! - [`simulation`]: [`simulation::simulate`] lowers a scenario, runs the engine and summarises
//!   the run (what `run`, `validate`, `sweep` and `plan` share);
//! - [`sweep`]: parameter sweeps on every core (rayon), resumable and sharded;
//! - [`plan`]: the strategy oracle, which searches the ways of splitting a model over a cluster;
//! - [`mixed`]: node groups of different devices, lowered per device type and spliced;
//! - [`collective_bench`]: one collective timed over a range of sizes, like nccl-tests;
//! - [`csv_text`]: the one CSV writer and reader (the `csv` crate) of every CSV parasim writes.
//!
//! This is the one library crate that reads files (the scenario and the model files and
//! profiles it names) and starts threads; `workloads` (what is trained, on what) and
//! `strategies` (how it is split and lowered) take values.

mod file;

pub mod collective_bench;
pub mod csv_text;
pub mod failures;
pub mod faults;
pub mod jobs;
pub mod links;
pub mod mixed;
pub mod plan;
pub mod simulation;
mod streamed;
pub mod sweep;

pub use file::*;
