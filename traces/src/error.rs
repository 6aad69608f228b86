//! Errors of the trace formats. Every variant names the file, and where it helps the event
//! index, key, rank or collective at fault.

use std::path::PathBuf;

/// A trace could not be read, written, converted or turned into a replay graph.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened, read or written.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong (the operating system's message).
        message: String,
    },
    /// The file is not valid JSON, or its top level is not a Chrome trace (an array of events
    /// or an object with `traceEvents`).
    #[error("{path}: {context}: {message}")]
    Json {
        /// The file.
        path: PathBuf,
        /// Where in the file: "event 1234", "key `deviceProperties`", ...
        context: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// The trace parses but cannot be replayed meaningfully.
    #[error("{path}: {reason}")]
    Meaningless {
        /// The file (or directory, or list of files).
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// Two or more rank files do not belong together.
    #[error("{reason}")]
    Inconsistent {
        /// Which files and what disagrees.
        reason: String,
    },
    /// A collective cannot be matched across the ranks of its group.
    #[error("cannot match collectives across ranks: {reason}")]
    Unmatched {
        /// Which collective, which group, which ranks have how many.
        reason: String,
    },
    /// A binary `.pstrace` file is malformed.
    #[error("{path}: {reason}")]
    Binary {
        /// The file.
        path: PathBuf,
        /// What is wrong (bad magic number, unsupported version, truncated, corrupt).
        reason: String,
    },
    /// Re-targeting to another number of ranks is not possible for this trace.
    #[error("cannot re-target to {ranks} ranks: {reason}")]
    Retarget {
        /// The requested number of ranks.
        ranks: u32,
        /// Why not, naming the process group.
        reason: String,
    },
    /// The replay graph is not well formed (a bug in the rules, or a corrupt trace).
    #[error("building the replay graph: {0}")]
    Graph(sim_core::graph::GraphError),
    /// A time or size is out of range.
    #[error("{what}: {message}")]
    OutOfRange {
        /// Which op or value.
        what: String,
        /// Why.
        message: String,
    },
}

impl TraceError {
    /// The error with the file it names passed through `name`: a member that `load` unpacked
    /// from an archive into a temporary folder is named `ARCHIVE:MEMBER`, not by a temporary
    /// path that means nothing to the user and is gone once the command ends.
    pub(crate) fn renamed(self, name: impl Fn(&std::path::Path) -> String) -> Self {
        match self {
            TraceError::Io { path, message } => TraceError::Io { path: name(&path).into(), message },
            TraceError::Json { path, context, message } => {
                TraceError::Json { path: name(&path).into(), context, message }
            }
            TraceError::Meaningless { path, reason } => {
                TraceError::Meaningless { path: name(&path).into(), reason }
            }
            TraceError::Binary { path, reason } => TraceError::Binary { path: name(&path).into(), reason },
            // These name their files inside the text (two rank files that disagree).
            TraceError::Inconsistent { reason } => {
                TraceError::Inconsistent { reason: renamed_in(&reason, &name) }
            }
            TraceError::Unmatched { reason } => TraceError::Unmatched { reason: renamed_in(&reason, &name) },
            other => other,
        }
    }

    /// `path` holds no GPU activity to time: refused whatever reads it.
    pub(crate) fn no_gpu_activity(path: impl Into<PathBuf>) -> Self {
        TraceError::Meaningless {
            path: path.into(),
            reason: "no GPU kernels, copies or memsets: was the profiler run with CUDA activities?".into(),
        }
    }

    /// An I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        // fs-err's errors already name the path; keep only the operating system's message.
        let message =
            std::error::Error::source(&error).map_or_else(|| error.to_string(), |inner| inner.to_string());
        TraceError::Io { path: path.into(), message }
    }
}

/// `text` with every word that is a path under the temporary folder (a member `load` unpacked)
/// passed through `name`, the punctuation after it kept.
fn renamed_in(text: &str, name: &impl Fn(&std::path::Path) -> String) -> String {
    let temporary = std::env::temp_dir();
    let words: Vec<String> = text
        .split(' ')
        .map(|word| {
            let path = word.trim_end_matches([',', ':', ';', ')', '.']);
            if path.len() > 1 && std::path::Path::new(path).starts_with(&temporary) {
                format!("{}{}", name(std::path::Path::new(path)), &word[path.len()..])
            } else {
                word.to_string()
            }
        })
        .collect();
    words.join(" ")
}
