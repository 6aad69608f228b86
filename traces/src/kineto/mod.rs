//! Import of PyTorch profiler (Kineto) traces: one JSON file per rank, plain or gzipped, or a
//! directory of them.
//!
//! Parsing streams (see `raw.rs`); what a replay needs is kept and linked per rank (see
//! `link.rs`); the ranks are put together into one [`Trace`]. Unknown or malformed events
//! become counted warnings. Import fails only when the result would be meaningless: a file
//! that is not JSON, no GPU activity at all, two files claiming the same rank, files of
//! different jobs, or collectives that cannot be matched across the traced ranks (named).
//!
//! [`operators`] reads the same files for calibration instead: host operators with their
//! argument shapes, each with the GPU kernels it launched.

mod lenient;
mod link;
pub mod operators;
pub(crate) mod raw;
mod write;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use operators::{OperatorImport, import_operators, import_operators_and_jobs};
pub use write::{write_rank, write_trace_files};

use crate::error::TraceError;
use crate::meter::{Meter, ReadProgressFn};
use crate::model::{CollectiveType, DeviceInfo, GpuOpKind, Trace};
use crate::warnings::Warnings;
use lenient::Number;

/// An imported trace and what the import skipped or assumed.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The trace.
    pub trace: Trace,
    /// Counted warnings (unknown events, missing sizes, ...).
    pub warnings: Warnings,
}

/// The trace files `paths` stand for: files as given, directories expanded to their
/// `*.json` and `*.json.gz` files in name order.
pub fn expand_paths(paths: &[PathBuf]) -> Result<Vec<PathBuf>, TraceError> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = fs_err::read_dir(path).map_err(|e| TraceError::io(path, e))?;
            let mut found = Vec::new();
            for entry in entries {
                let entry = entry.map_err(|e| TraceError::io(path, e))?;
                let name = entry.file_name().to_string_lossy().to_string();
                if (name.ends_with(".json") || name.ends_with(".json.gz")) && entry.path().is_file() {
                    found.push(entry.path());
                }
            }
            if found.is_empty() {
                return Err(TraceError::Meaningless {
                    path: path.clone(),
                    reason: "directory has no *.json or *.json.gz trace files".into(),
                });
            }
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    if files.is_empty() {
        return Err(TraceError::Meaningless {
            path: PathBuf::from("(no input)"),
            reason: "no trace files given".into(),
        });
    }
    Ok(files)
}

/// Imports the Kineto traces at `paths` (files or directories), one file per rank.
pub fn import(paths: &[PathBuf]) -> Result<Imported, TraceError> {
    import_with_progress(paths, None)
}

/// [`import`], reporting the files, bytes and events read so far to `progress` as it reads.
pub fn import_with_progress(
    paths: &[PathBuf],
    progress: Option<&ReadProgressFn<'_>>,
) -> Result<Imported, TraceError> {
    let files = expand_paths(paths)?;
    let meter = Meter::new(progress);
    meter.begin(&files);
    let mut names = raw::Interner::default();
    let mut job = Job::new(files.clone());
    for (position, path) in files.iter().enumerate() {
        let raw = raw::parse_file_metered(path, &mut names, false, &meter)?;
        meter.file_done();
        job.add(position, &raw, &names.names);
    }
    meter.finish();
    job.finish(names.names)
}

/// The ranks of one job, linked file by file as they are parsed (each file's parse is dropped
/// once linked) and put together by [`Job::finish`].
pub(crate) struct Job {
    files: Vec<PathBuf>,
    groups: link::Groups,
    warnings: Warnings,
    ranks: Vec<crate::model::RankTrace>,
    world_sizes: Vec<(u32, PathBuf)>,
    device: Option<DeviceInfo>,
}

impl Job {
    /// A job of the rank files `files`, none read yet.
    pub(crate) fn new(files: Vec<PathBuf>) -> Self {
        Job {
            ranks: Vec::with_capacity(files.len()),
            files,
            groups: link::Groups::default(),
            warnings: Warnings::new(),
            world_sizes: Vec::new(),
            device: None,
        }
    }

    /// Links the parse of the job's file at `position`; `names` are the interner's names so far.
    pub(crate) fn add(&mut self, position: usize, raw: &raw::RawFile, names: &[String]) {
        let (path, files) = (&raw.path, self.files.len());
        self.warnings.extend(&raw.warnings);
        let info = raw.distributed.clone().unwrap_or_default();
        let rank = match info.rank.0.and_then(Number::as_u64).and_then(|r| u32::try_from(r).ok()) {
            Some(rank) => rank,
            None => {
                self.warnings.add("files without distributedInfo.rank (numbered by their position)");
                position as u32
            }
        };
        let world = match info.world_size.0.and_then(Number::as_u64).and_then(|w| u32::try_from(w).ok()) {
            Some(world) if world > 0 => world,
            _ => {
                self.warnings.add("files without distributedInfo.world_size (world = number of files)");
                files as u32
            }
        };
        self.world_sizes.push((world, path.clone()));
        if self.device.is_none() && !raw.devices.is_empty() {
            self.device = device_info(raw);
        }
        let rank_trace =
            link::link(raw, rank, world.max(rank + 1), names, &mut self.groups, &mut self.warnings);
        self.ranks.push(rank_trace);
    }

    /// The job's trace, checked; `names` are the interner's names (names no rank uses are
    /// dropped).
    pub(crate) fn finish(self, names: Vec<String>) -> Result<Imported, TraceError> {
        let Job { files, groups, warnings, mut ranks, world_sizes, device } = self;
        let world = world_sizes.iter().map(|(w, _)| *w).max().unwrap_or(1);
        if let Some((other, path)) = world_sizes.iter().find(|(w, _)| *w != world) {
            return Err(TraceError::Inconsistent {
                reason: format!(
                    "{} says world size {other}, but {} says {world}: the files are not from one job",
                    path.display(),
                    world_sizes
                        .iter()
                        .find(|(w, _)| *w == world)
                        .map_or(String::new(), |(_, p)| p.display().to_string())
                ),
            });
        }
        ranks.sort_by_key(|r| r.rank);
        for pair in ranks.windows(2) {
            if pair[0].rank == pair[1].rank {
                return Err(TraceError::Inconsistent {
                    reason: format!(
                        "{} and {} are both rank {}",
                        pair[0].source, pair[1].source, pair[0].rank
                    ),
                });
            }
        }
        if let Some(rank) = ranks.iter().find(|r| r.rank >= world) {
            return Err(TraceError::Inconsistent {
                reason: format!("{} is rank {}, outside its world of {world}", rank.source, rank.rank),
            });
        }
        let label = files_label(&files);
        if ranks.iter().all(|r| r.gpu_ops.is_empty()) {
            return Err(TraceError::no_gpu_activity(label));
        }
        let mut trace = Trace { world_size: world, device, names, groups: groups.lists, ranks };
        trace.canonicalize();
        check_collective_counts(&trace)?;
        trace.validate(&files_label(&files))?;
        Ok(Imported { trace, warnings })
    }
}

/// "a.json" for one file, "dir/ (8 files)" style otherwise.
fn files_label(files: &[PathBuf]) -> PathBuf {
    match files {
        [one] => one.clone(),
        [first, ..] => PathBuf::from(format!("{} and {} more files", first.display(), files.len() - 1)),
        [] => PathBuf::from("(no input)"),
    }
}

/// The device entry of the GPU this rank used (the `pid` of its GPU events), else the first.
pub(crate) fn device_info(raw: &raw::RawFile) -> Option<DeviceInfo> {
    let used = raw.gpu.first().map(|g| u64::from(g.device));
    let entry = raw
        .devices
        .iter()
        .find(|d| d.id.0.and_then(Number::as_u64) == used && used.is_some())
        .or_else(|| raw.devices.first())?;
    let number = |n: &lenient::LenientNumber| n.0.and_then(Number::as_u64).unwrap_or(0);
    Some(DeviceInfo {
        name: entry.name.0.clone().unwrap_or_else(|| "unknown GPU".into()),
        memory_bytes: number(&entry.total_global_mem),
        multiprocessors: u32::try_from(number(&entry.num_sms)).unwrap_or(0),
        compute_capability: (
            u32::try_from(number(&entry.compute_major)).unwrap_or(0),
            u32::try_from(number(&entry.compute_minor)).unwrap_or(0),
        ),
        devices_per_host: u32::try_from(raw.devices.len()).unwrap_or(1),
    })
}

/// Every traced member of a process group must have issued the same number of collectives of
/// each kind on it, or the k-th ones cannot be matched.
pub(crate) fn check_collective_counts(trace: &Trace) -> Result<(), TraceError> {
    // (group, kind) -> rank -> count
    let mut counts: BTreeMap<(Option<u32>, CollectiveType), BTreeMap<u32, usize>> = BTreeMap::new();
    for rank in &trace.ranks {
        for op in &rank.gpu_ops {
            if let GpuOpKind::Collective(call) = &op.kind
                && is_matched(call.kind)
            {
                *counts.entry((call.group, call.kind)).or_default().entry(rank.rank).or_default() += 1;
            }
        }
    }
    for ((group, kind), per_rank) in &counts {
        let members: Vec<u32> = match group {
            None => trace.ranks.iter().map(|r| r.rank).collect(),
            Some(g) => trace.groups[*g as usize]
                .iter()
                .copied()
                .filter(|member| trace.ranks.iter().any(|r| r.rank == *member))
                .collect(),
        };
        let count_of = |rank: u32| per_rank.get(&rank).copied().unwrap_or(0);
        let Some(&first) = members.first() else { continue };
        if let Some(&other) = members.iter().find(|&&m| count_of(m) != count_of(first)) {
            let group_name = match group {
                None => "the default (world) group".to_string(),
                Some(g) => format!("process group {:?}", trace.groups[*g as usize]),
            };
            let source = |rank: u32| {
                trace.ranks.iter().find(|r| r.rank == rank).map_or(String::new(), |r| r.source.clone())
            };
            return Err(TraceError::Unmatched {
                reason: format!(
                    "{} on {group_name}: rank {first} ({}) has {}, rank {other} ({}) has {}; \
                     the traces must cover the same iterations on every rank",
                    kind.name(),
                    source(first),
                    count_of(first),
                    source(other),
                    count_of(other)
                ),
            });
        }
    }
    Ok(())
}

/// Collectives that are matched across ranks (the others replay at measured duration).
pub(crate) fn is_matched(kind: CollectiveType) -> bool {
    !matches!(kind, CollectiveType::Send | CollectiveType::Recv | CollectiveType::Unknown)
}

/// The label used in errors for an import of `paths`.
pub fn describe_inputs(paths: &[PathBuf]) -> String {
    match paths {
        [one] => one.display().to_string(),
        _ => paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
    }
}

/// True if `path` starts with the gzip magic number or is JSON (not a `.pstrace`).
pub fn looks_like_json(path: &Path) -> bool {
    !crate::binary::has_magic(path)
}
