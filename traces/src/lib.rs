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
pub mod et;
pub mod kineto;
mod meter;
pub mod model;
pub mod nccl;
pub mod replay;
pub mod synthetic;
mod warnings;

pub use error::TraceError;
pub use meter::{ReadCounts, ReadProgressFn};
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
    /// The input's format as reports name it ("a PyTorch profiler (Kineto) trace", "a PyTorch
    /// execution trace (schema 1.1.0-chakra.0.0.4)", ...).
    pub format: String,
    /// For an execution trace: where its op durations came from (one line for reports).
    pub timing: Option<String>,
}

/// How to load an execution trace: the Kineto trace of the same run, or a cost for ops whose
/// duration the trace does not record.
#[derive(Default, Clone, Copy)]
pub struct LoadOptions<'a> {
    /// Kineto traces of the same run (files, directories or archives): kernel times come from
    /// them, the execution trace adds what they lack (docs/chakra.md, "Paired with Kineto").
    pub kineto: &'a [PathBuf],
    /// The duration (ns) of a compute node that records none; `None` leaves such nodes out.
    pub cost: Option<&'a et::CostFn<'a>>,
    /// Told the files, bytes and events read so far as the load goes on (Kineto JSON as it is
    /// read; other formats when each is read).
    pub progress: Option<&'a ReadProgressFn<'a>>,
}

impl std::fmt::Debug for LoadOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("kineto", &self.kineto)
            .field("cost", &self.cost.is_some())
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// Loads `paths`: one `.pstrace` file (recognized by its magic number, whatever its name), or
/// Kineto JSON files and directories, or execution traces (durations from the traces alone).
pub fn load(paths: &[PathBuf]) -> Result<Loaded, TraceError> {
    load_with(paths, &LoadOptions::default())
}

/// Inputs with archives unpacked: the files (and directories) to read, each with its format,
/// and the folders that must live while they are read.
struct Inputs {
    files: Vec<(PathBuf, et::Format)>,
    _unpacked: Vec<et::files::Unpacked>,
}

fn expand_inputs(paths: &[PathBuf]) -> Result<Inputs, TraceError> {
    let mut files = Vec::new();
    let mut unpacked = Vec::new();
    for path in paths {
        if path.is_dir() {
            // A folder of Chakra `.et` files, else a folder of Kineto files.
            let mut ets: Vec<PathBuf> = fs_err::read_dir(path)
                .map_err(|e| TraceError::io(path, e))?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "et"))
                .collect();
            ets.sort();
            if ets.is_empty() {
                files.push((path.clone(), et::Format::Kineto));
            }
            for file in ets {
                let format = et::sniff(&file)?;
                files.push((file, format));
            }
            continue;
        }
        if !path.exists() {
            // The Kineto reader says it, as it always has.
            files.push((path.clone(), et::Format::Kineto));
            continue;
        }
        let format = et::sniff(path)?;
        if format != et::Format::Archive {
            files.push((path.clone(), format));
            continue;
        }
        let archive = et::files::unpack(path)?;
        let mut members = Vec::new();
        for file in &archive.files {
            members.push((file.clone(), et::sniff(file)?));
        }
        let traces: Vec<(PathBuf, et::Format)> = members
            .iter()
            .filter(|(_, f)| !matches!(f, et::Format::Other(_) | et::Format::Archive))
            .cloned()
            .collect();
        if traces.is_empty() {
            let listed: Vec<String> = members
                .iter()
                .map(|(p, f)| format!("{} ({})", et::files::member_name(p), f.describe()))
                .collect();
            return Err(TraceError::Meaningless {
                path: path.clone(),
                reason: format!(
                    "a tar archive holding {} file{} and no trace parasim reads: {}",
                    members.len(),
                    if members.len() == 1 { "" } else { "s" },
                    if listed.is_empty() { "(none)".into() } else { listed.join(", ") }
                ),
            });
        }
        files.extend(traces);
        unpacked.push(archive);
    }
    Ok(Inputs { files, _unpacked: unpacked })
}

/// How messages name `file`: itself, or `ARCHIVE:MEMBER` for a member of an archive in `paths`.
fn shown(file: &std::path::Path, paths: &[PathBuf]) -> String {
    if paths.iter().any(|p| p == file) || !file.starts_with(std::env::temp_dir()) {
        return file.display().to_string();
    }
    let archives: Vec<&PathBuf> = paths.iter().filter(|p| p.is_file()).collect();
    match archives.as_slice() {
        [archive] => format!("{}:{}", archive.display(), et::files::member_name(file)),
        _ => et::files::member_name(file),
    }
}

/// Loads `paths` as [`load`] does; execution traces are paired with `options.kineto` or costed
/// with `options.cost`. An error about a member of an archive names it `ARCHIVE:MEMBER`.
pub fn load_with(paths: &[PathBuf], options: &LoadOptions) -> Result<Loaded, TraceError> {
    load_unpacked(paths, options).map_err(|error| error.renamed(|path| shown(path, paths)))
}

/// [`load_with`], with errors naming the files as they were read (archives' members by their
/// temporary paths).
fn load_unpacked(paths: &[PathBuf], options: &LoadOptions) -> Result<Loaded, TraceError> {
    let inputs = expand_inputs(paths)?;
    let formats: Vec<&et::Format> = inputs.files.iter().map(|(_, f)| f).collect();
    if let Some((path, format)) = inputs.files.iter().find(|(_, f)| matches!(f, et::Format::Other(_))) {
        return Err(TraceError::Meaningless {
            path: path.clone(),
            reason: format!(
                "{}; parasim reads PyTorch profiler (Kineto) JSON, .pstrace, PyTorch execution traces (JSON), Chakra JSON and Chakra protobuf (.et), plain, gzipped or in a .tar/.tar.gz/.tgz",
                format.describe()
            ),
        });
    }
    let execution = formats.iter().filter(|f| f.is_execution_trace()).count();
    if execution > 0 {
        if execution < formats.len() {
            let (path, other) = inputs
                .files
                .iter()
                .find(|(_, f)| !f.is_execution_trace())
                .map(|(p, f)| (p.clone(), f.describe()))
                .unwrap_or_default();
            return Err(TraceError::Meaningless {
                path,
                reason: format!(
                    "this is {other}, given with execution traces: give a Kineto trace of the same run with --kineto, and execution traces of one format alone"
                ),
            });
        }
        let first = formats[0].clone();
        if let Some((path, other)) =
            inputs.files.iter().find(|(_, f)| std::mem::discriminant(f) != std::mem::discriminant(&first))
        {
            return Err(TraceError::Inconsistent {
                reason: format!(
                    "{} is {}, but {} is {}: give execution traces of one format",
                    path.display(),
                    other.describe(),
                    inputs.files[0].0.display(),
                    first.describe()
                ),
            });
        }
        let files: Vec<(PathBuf, String)> =
            inputs.files.iter().map(|(p, _)| (p.clone(), shown(p, paths))).collect();
        let meter = meter::Meter::new(options.progress);
        let plain: Vec<PathBuf> = inputs.files.iter().map(|(p, _)| p.clone()).collect();
        meter.begin(&plain);
        let job = et::read(&files, &first)?;
        meter.finish();
        return if options.kineto.is_empty() {
            let cost = options.cost.unwrap_or(&|_| None);
            let (trace, warnings, timing) = et::to_trace(&job, cost)?;
            Ok(Loaded {
                trace,
                warnings,
                binary: false,
                format: job.format.clone(),
                timing: Some(timing.describe()),
            })
        } else {
            let kineto = load_with(options.kineto, &LoadOptions::default())?;
            if kineto.timing.is_some() {
                return Err(TraceError::Meaningless {
                    path: options.kineto[0].clone(),
                    reason: format!(
                        "--kineto takes a PyTorch profiler (Kineto) trace; this is {}",
                        kineto.format
                    ),
                });
            }
            let (trace, warnings, mut timing) = et::pair(&job, kineto.trace, kineto.warnings)?;
            // The Kineto operators that launched GPU work, matched to the ET's by name and order.
            let kineto_inputs = expand_inputs(options.kineto)?;
            let kineto_files: Vec<PathBuf> = kineto_inputs.files.iter().map(|(p, _)| p.clone()).collect();
            let operators = kineto::import_operators(&kineto_files)?;
            timing += &et::match_operators(&job, &trace, &operators);
            Ok(Loaded { trace, warnings, binary: false, format: job.format.clone(), timing: Some(timing) })
        };
    }
    if !options.kineto.is_empty() {
        return Err(TraceError::Meaningless {
            path: paths.first().cloned().unwrap_or_default(),
            reason: "--kineto pairs an execution trace with its Kineto trace, but the main input is not an execution trace".into(),
        });
    }
    let files: Vec<PathBuf> = inputs.files.iter().map(|(p, _)| p.clone()).collect();
    if let [path] = files.as_slice()
        && path.is_file()
        && binary::has_magic(path)
    {
        let meter = meter::Meter::new(options.progress);
        meter.begin(&files);
        let trace = binary::read(path)?;
        meter.finish();
        return Ok(Loaded {
            trace,
            warnings: Warnings::new(),
            binary: true,
            format: et::Format::Pstrace.describe(),
            timing: None,
        });
    }
    // A file named .pstrace that is not one: say so, rather than report it as broken JSON.
    if let Some(path) = files
        .iter()
        .find(|p| p.is_file() && p.extension().is_some_and(|e| e == "pstrace") && !binary::has_magic(p))
    {
        return Err(TraceError::Meaningless {
            path: path.clone(),
            reason: "named .pstrace but not a parasim binary trace (no PSTRACE magic number at the start); write one with `parasim trace convert`".into(),
        });
    }
    if let Some(path) = files.iter().find(|p| p.is_file() && binary::has_magic(p)) {
        return Err(TraceError::Meaningless {
            path: path.clone(),
            reason: "a binary .pstrace holds a whole job: give it alone, not with other files".into(),
        });
    }
    let imported = kineto::import_with_progress(&files, options.progress)?;
    Ok(Loaded {
        trace: imported.trace,
        warnings: imported.warnings,
        binary: false,
        format: et::Format::Kineto.describe(),
        timing: None,
    })
}
