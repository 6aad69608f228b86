//! Every file format parasim reads or writes for timelines, and trace replay.
//!
//! - [`kineto`]: import of PyTorch profiler (Kineto) JSON traces, plain or gzipped, one file
//!   per rank or a directory of them, into a [`Trace`]; streaming, tolerant (unknown events are
//!   counted warnings), and back to Kineto JSON.
//! - [`binary`]: the compact `.pstrace` format (postcard, with a magic number, a version and a
//!   checksum), which loads an imported trace without parsing JSON again.
//! - [`replay`]: a [`Trace`] as a `sim_core` execution graph (measured kernel durations,
//!   simulated collectives, host launch and synchronization rules), re-targeted to another
//!   number of ranks if asked, and the comparison of a simulated timeline with the
//!   measurement.
//! - [`atomic`]: how every output file is written: through a temporary name, renamed when
//!   complete.
//! - [`chrome`]: export of any simulated timeline as Chrome Trace Event JSON for Perfetto.
//!
//! ```no_run
//! use sim_core::exec::run;
//! use sim_core::network::AnalyticalNetwork;
//! # fn topology() -> topology::Topology { unimplemented!() }
//! let imported = traces::kineto::import(&["dlrm_kineto/".into()])?;
//! let replay = traces::replay::build(&imported.trace, &traces::replay::ReplayOptions::default())?;
//! let topology = topology();
//! let timeline = run(&replay.graph, &mut AnalyticalNetwork::new(&topology))?;
//! for step in replay.compare(&timeline).steps {
//!     println!("ProfilerStep#{}: measured {:.3} ms, simulated {:.3} ms", step.number, step.measured_s * 1e3, step.simulated_s * 1e3);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod atomic;
pub mod binary;
pub mod chrome;
mod error;
pub mod kineto;
pub mod model;
pub mod nccl;
pub mod replay;
pub mod synthetic;
mod warnings;

pub use error::TraceError;
pub use model::Trace;
pub use warnings::Warnings;

use std::path::PathBuf;

/// A trace loaded from any supported input, with the warnings of its import.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The trace.
    pub trace: Trace,
    /// What the import skipped or assumed (empty for a binary trace: those were reported when
    /// it was converted).
    pub warnings: Warnings,
    /// True if it came from a `.pstrace` file.
    pub binary: bool,
}

/// Loads `paths`: one `.pstrace` file (recognized by its magic number, whatever its name), or
/// Kineto JSON files and directories.
pub fn load(paths: &[PathBuf]) -> Result<Loaded, TraceError> {
    if let [path] = paths
        && path.is_file()
        && binary::has_magic(path)
    {
        return Ok(Loaded { trace: binary::read(path)?, warnings: Warnings::new(), binary: true });
    }
    // A file named .pstrace that is not one: say so, rather than report it as broken JSON.
    if let Some(path) = paths
        .iter()
        .find(|p| p.is_file() && p.extension().is_some_and(|e| e == "pstrace") && !binary::has_magic(p))
    {
        return Err(TraceError::Meaningless {
            path: path.clone(),
            reason: "named .pstrace but not a parasim binary trace (no PSTRACE magic number at the start); write one with `parasim trace convert`".into(),
        });
    }
    if let Some(path) = paths.iter().find(|p| p.is_file() && binary::has_magic(p)) {
        return Err(TraceError::Meaningless {
            path: path.clone(),
            reason: "a binary .pstrace holds a whole job: give it alone, not with other files".into(),
        });
    }
    let imported = kineto::import(paths)?;
    Ok(Loaded { trace: imported.trace, warnings: imported.warnings, binary: false })
}
