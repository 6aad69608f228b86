//! Simulated against measured: the bundled suite of published measurements and real traces
//! (`data/validation/`) that `parasim validate` runs, the replay of real traces behind
//! `parasim replay`, and the trace-against-scenario view of `parasim compare`.
//!
//! - [`case`], [`suite`], [`run`], [`report`], [`bounds`]: the suite, from its data
//!   files to the table and the ratchet (the binary draws the plot with the `plot` crate).
//! - [`ledger`]: what each scenario key of a case is and the declared fitted constants, which
//!   make the cases they were fitted on calibration cases, apart from the test cases.
//! - [`replay`]: a real trace replayed on a cluster, against its measurement.
//! - [`calibration`]: what `parasim calibrate` fits the compute model to, read from real
//!   traces: operators joined to their kernels, the host threads' launch intervals.
//! - [`compare`]: a scenario's simulated strategy against a real multi-rank profiler trace of
//!   the same job: iteration time, GPU time per kernel class and NCCL time per collective
//!   kind, per rank per iteration, sorted by how far apart they are.
//!
//! This crate only compares results; it never reaches into engine internals.
//!
//! ```no_run
//! use std::path::{Path, PathBuf};
//! let loaded = traces::load(&[PathBuf::from("dlrm_kineto/")])?;
//! let scenario = scenario::Scenario::load(Path::new("scenarios/dlrm-8xv100.toml"))?;
//! let comparison = validation::compare::compare(&loaded.trace, "dlrm_kineto/", &scenario)?;
//! for row in &comparison.kernels {
//!     println!("{}: measured {:.3} ms, simulated {:.3} ms", row.name, row.measured_s * 1e3, row.simulated_s * 1e3);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bounds;
pub mod calibration;
pub mod case;
pub mod compare;
pub mod ledger;
pub mod replay;
pub mod report;
pub mod run;
pub mod suite;
