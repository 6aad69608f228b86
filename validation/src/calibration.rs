//! What calibration fits, read from parsed traces: the join behind `parasim calibrate`.
//!
//! - [`collect`]: each profiled operator joined to the kernels it launched
//!   (`traces::kineto::operators`) and costed by `workloads::aten` into a fit
//!   [`Sample`]; operators the device's roofline does not describe (communication, host copies)
//!   are counted by reason instead.
//! - [`add_tables`]: DeepBench kernel tables (`<family>-<precision>-gemm.csv`, `-conv.csv`) of
//!   the device's family as more samples; [`split_inputs`] tells them from traces.
//! - [`host_threads`] and [`launch_record`]: the host threads' kernel launches and the
//!   intervals between them, which price the dispatch of one kernel (`dispatch-overhead`).
//! - [`traced_devices`]: the GPUs the traces record, checked against the device calibrated.
//! - [`nccl_share`], [`tiny_kernels`], [`Collected::errors_by_operator`] and
//!   [`Collected::errors_by_sharing`]: the figures the report prints beside the fit.
//!
//! The fit itself is `workloads::calibrate`'s; this module only reads what it needs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use sim_core::units::SimDuration;
use traces::kineto::operators::{Activity, ActivityKind, OperatorImport, ProfiledOperator};
use traces::model::{CallKind, RankTrace};
use workloads::aten::{OperatorCall, Uncosted, operator_kernels};
use workloads::calibrate::{Sample, class_errors};
use workloads::deepbench::{self, DeepBenchError};
use workloads::dispatch::{HostCall, launch_intervals};
use workloads::profile::{ClassError, LaunchRecord};
use workloads::{Device, DeviceCatalog, Dtype};

/// Calibration inputs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    /// A file or directory could not be read.
    #[error(transparent)]
    Read(#[from] std::io::Error),
    /// A kernel table's name does not say its device family and precision.
    #[error("{path}: expected a name <device>-<precision>-gemm.csv or -conv.csv")]
    TableName {
        /// The table.
        path: PathBuf,
    },
    /// A kernel table's precision is not one DeepBench measures.
    #[error("{path}: unknown precision {precision:?} (fp32 or fp16-mixed)")]
    TablePrecision {
        /// The table.
        path: PathBuf,
        /// The precision its name gives.
        precision: String,
    },
    /// A kernel table does not parse.
    #[error("{path}: {source}")]
    Table {
        /// The table.
        path: PathBuf,
        /// What is wrong, with the line.
        #[source]
        source: DeepBenchError,
    },
    /// No kernel table is of the device's family.
    #[error(
        "no kernel table of the {family} family among {tables} (file names start with the device family)"
    )]
    NoTables {
        /// The device's family (`v100`).
        family: String,
        /// The tables given.
        tables: String,
    },
    /// A trace was recorded on another device type.
    #[error(
        "{path} was recorded on a {traced} with {traced_gb:.1} GB of memory, which is not --device {device} \
         ({device_gb:.1} GB) or a device that computes like it; a profile describes one device type. Catalog \
         devices of that memory size: {same_size}"
    )]
    OtherDevice {
        /// The trace file.
        path: PathBuf,
        /// The GPU it records.
        traced: String,
        /// That GPU's memory, GB.
        traced_gb: f64,
        /// The device calibrated.
        device: String,
        /// Its memory, GB.
        device_gb: f64,
        /// Catalog devices with the traced GPU's memory size, or "none".
        same_size: String,
    },
}

/// Operators left out of the fit for one reason, with their kernel time.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LeftOut {
    /// How many.
    pub operators: u64,
    /// Their kernel time, s.
    pub kernel_s: f64,
}

/// The traces' operators as fit samples, and what was left out.
#[derive(Debug, Default, Clone)]
pub struct Collected {
    /// One per costed operator (or kernel table row).
    pub samples: Vec<Sample>,
    /// The operator name of each sample.
    pub names: Vec<String>,
    /// The dtypes the GEMMs ran in.
    pub gemm_dtypes: BTreeSet<String>,
    /// (reason, operator name) -> count and time.
    pub left_out: BTreeMap<(String, String), LeftOut>,
    /// Compute-kernel time of the inputs, s.
    pub kernel_s: f64,
    /// The part of it in samples, s.
    pub fitted_s: f64,
    /// Whether each sample's kernels shared the GPU with another stream's work for more than
    /// half their time.
    pub shared: Vec<bool>,
    /// The share of each sample's kernel time beside another stream's copy
    /// (`Activity::copy_ns`): part of its communication share.
    pub copy: Vec<f64>,
}

/// Costs every operator that launched compute kernels and nothing else that the device's
/// roofline does not describe.
pub fn collect(import: &OperatorImport) -> Collected {
    let mut out = Collected::default();
    for file in &import.files {
        out.kernel_s += file.kernel_ns as f64 * 1e-9;
        for op in &file.operators {
            let has = |kind: ActivityKind| op.activities.iter().any(|a| a.kind == kind);
            let name = import.name(op.name);
            let mut leave = |reason: &str| {
                let entry = out.left_out.entry((reason.to_string(), name.to_string())).or_default();
                entry.operators += 1;
                entry.kernel_s += op.duration_ns(ActivityKind::Kernel) as f64 * 1e-9;
            };
            if has(ActivityKind::Nccl) {
                leave("communication");
                continue;
            }
            if !has(ActivityKind::Kernel) && !has(ActivityKind::Memset) {
                // Only copies: the host link's business, not the device's roofline.
                continue;
            }
            if has(ActivityKind::Memcpy) {
                leave("copies over the host link");
                continue;
            }
            let kernel_ns = op.duration_ns(ActivityKind::Kernel) + op.duration_ns(ActivityKind::Memset);
            if kernel_ns == 0 {
                leave("kernel time rounds to 0 us");
                continue;
            }
            let kernels = op.activities.iter().filter(|a| a.kind != ActivityKind::Memcpy).count();
            let kernel_names: Vec<&str> = op.activities.iter().map(|a| import.name(a.name)).collect();
            let call = OperatorCall { name, dims: &op.dims, types: &op.types, kernel_names: &kernel_names };
            match operator_kernels(&call) {
                Ok(works) => {
                    let mut works = works.into_iter();
                    let Some(work) = works.next() else { continue };
                    if work.class == workloads::OpClass::Gemm {
                        out.gemm_dtypes.insert(work.dtype.name().to_string());
                    }
                    out.fitted_s += op.duration_ns(ActivityKind::Kernel) as f64 * 1e-9;
                    let beside = |share: fn(&Activity) -> u64| -> u64 {
                        op.activities.iter().filter(|a| a.kind != ActivityKind::Memcpy).map(share).sum()
                    };
                    let communication_ns = beside(|a| a.communication_ns);
                    out.samples.push(Sample {
                        work,
                        after: works.collect(),
                        kernels: kernels as u32,
                        measured_s: kernel_ns as f64 * 1e-9,
                        communication: (communication_ns as f64 / kernel_ns as f64).min(1.0),
                        group: shape_key(name, op),
                    });
                    out.names.push(name.to_string());
                    out.shared.push(2 * beside(|a| a.concurrent_ns) > kernel_ns);
                    out.copy.push((beside(|a| a.copy_ns) as f64 / kernel_ns as f64).min(1.0));
                }
                Err(Uncosted::UnknownOperator) => leave("no cost formula"),
                Err(Uncosted::MissingShapes) => leave("shapes or values not recorded"),
                Err(Uncosted::UnsupportedDtype(_)) => leave("unsupported dtype"),
                Err(Uncosted::Malformed(_)) => leave("malformed shapes"),
            }
        }
    }
    out
}

/// Operators with the same name, shapes and types share a key: FNV-1a over the operator's
/// name, shapes and types as text: stable across Rust versions (the standard library's hasher
/// is not), so the held-out folds, and the errors a profile records, do not change with the
/// toolchain.
pub fn shape_key(name: &str, op: &ProfiledOperator) -> u64 {
    let text = format!("{name}|{:?}|{:?}", op.dims, op.types);
    text.bytes()
        .fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

impl Collected {
    /// The three biggest reasons operators were left out (by kernel time), for a message.
    pub fn top_reasons(&self) -> String {
        let mut by_reason: BTreeMap<&str, f64> = BTreeMap::new();
        for ((reason, _), left) in &self.left_out {
            *by_reason.entry(reason).or_default() += left.kernel_s;
        }
        let mut reasons: Vec<(&str, f64)> = by_reason.into_iter().collect();
        reasons.sort_by(|a, b| b.1.total_cmp(&a.1));
        let listed: Vec<String> =
            reasons.iter().take(3).map(|(r, s)| format!("{r}: {:.1} ms of kernels", s * 1e3)).collect();
        if listed.is_empty() { "no operator launched a compute kernel".into() } else { listed.join("; ") }
    }

    /// The errors of `predicted` (one per sample) per operator name: (name, samples, the
    /// errors of all of them), largest measured time first.
    pub fn errors_by_operator(&self, predicted: &[f64]) -> Vec<(String, Vec<usize>, ClassError)> {
        let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, name) in self.names.iter().enumerate() {
            groups.entry(name).or_default().push(i);
        }
        let mut rows: Vec<(String, Vec<usize>, ClassError)> = groups
            .into_iter()
            .map(|(name, members)| {
                let subset: Vec<Sample> = members.iter().map(|&i| self.samples[i].clone()).collect();
                let predictions: Vec<f64> = members.iter().map(|&i| predicted[i]).collect();
                let all = class_errors(&subset, &predictions).last().cloned().unwrap_or_else(|| ClassError {
                    class: String::new(),
                    samples: 0,
                    measured_s: 0.0,
                    predicted_s: 0.0,
                    median_error: 0.0,
                    weighted_error: 0.0,
                });
                (name.to_string(), members, all)
            })
            .collect();
        rows.sort_by(|a, b| b.2.measured_s.total_cmp(&a.2.measured_s));
        rows
    }

    /// The errors per class of `default` and `profile` predictions (one per sample) of the
    /// operators whose kernels ran alone on their GPU (`false`) and of those that shared it
    /// with another stream's work for more than half their time (`true`), each group that
    /// has operators; empty when no operator shared its GPU.
    pub fn errors_by_sharing(
        &self,
        default: &[f64],
        profile: &[f64],
    ) -> Vec<(bool, Vec<ClassError>, Vec<ClassError>)> {
        let shared = |i: usize| self.shared.get(i).copied().unwrap_or(false);
        if !(0..self.samples.len()).any(shared) {
            return Vec::new();
        }
        let mut out = Vec::new();
        for sharing in [false, true] {
            let pick: Vec<usize> = (0..self.samples.len()).filter(|&i| shared(i) == sharing).collect();
            if pick.is_empty() {
                continue;
            }
            let samples: Vec<Sample> = pick.iter().map(|&i| self.samples[i].clone()).collect();
            let subset = |predictions: &[f64]| -> Vec<f64> { pick.iter().map(|&i| predictions[i]).collect() };
            out.push((
                sharing,
                class_errors(&samples, &subset(default)),
                class_errors(&samples, &subset(profile)),
            ));
        }
        out
    }
}

/// Kernel benchmark tables (DeepBench's `<family>-<precision>-gemm.csv` and `-conv.csv`,
/// given as files or as directories holding them) apart from traces: (tables, traces).
pub fn split_inputs(paths: &[PathBuf]) -> Result<(Vec<PathBuf>, Vec<PathBuf>), CalibrationError> {
    let is_table = |path: &Path| {
        path.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with("-gemm.csv") || n.ends_with("-conv.csv"))
    };
    let (mut tables, mut traces) = (Vec::new(), Vec::new());
    for path in paths {
        if path.is_dir() {
            let mut inside: Vec<PathBuf> = fs_err::read_dir(path)?
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|p| is_table(p))
                .collect();
            if inside.is_empty() {
                traces.push(path.clone());
            } else {
                inside.sort();
                tables.extend(inside);
            }
        } else if is_table(path) {
            tables.push(path.clone());
        } else {
            traces.push(path.clone());
        }
    }
    Ok((tables, traces))
}

/// Adds the kernels of DeepBench tables measured on `device`'s family (the file name's first
/// word, `v100` for `v100-sxm2-16gb`; a directory's tables of other families are skipped),
/// and describes them for the report.
pub fn add_tables(
    collected: &mut Collected,
    tables: &[PathBuf],
    device: &Device,
) -> Result<String, CalibrationError> {
    let family = device.name.split('-').next().unwrap_or_default();
    let mut used = Vec::new();
    for path in tables {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let Some(stem) = name.strip_suffix("-gemm.csv").or_else(|| name.strip_suffix("-conv.csv")) else {
            continue;
        };
        let Some((table_family, precision)) = stem.split_once('-') else {
            return Err(CalibrationError::TableName { path: path.clone() });
        };
        if table_family != family {
            continue;
        }
        let dtype = match precision {
            "fp32" => Dtype::Fp32,
            "fp16" | "fp16-mixed" => Dtype::Fp16,
            other => {
                return Err(CalibrationError::TablePrecision { path: path.clone(), precision: other.into() });
            }
        };
        let text = fs_err::read_to_string(path)?;
        let table = |source| CalibrationError::Table { path: path.clone(), source };
        let samples = if name.ends_with("-gemm.csv") {
            deepbench::samples(device, &deepbench::parse_gemms(&text).map_err(table)?, &[], dtype)
        } else {
            deepbench::samples(device, &[], &deepbench::parse_convs(&text).map_err(table)?, dtype)
        };
        collected.gemm_dtypes.insert(dtype.name().to_string());
        for sample in samples {
            let kind = match sample.work.shape {
                workloads::KernelShape::Conv { direction, .. } => match direction {
                    workloads::ConvDirection::Forward => "convolution forward",
                    workloads::ConvDirection::BackwardData => "convolution backward-data",
                    workloads::ConvDirection::BackwardWeight => "convolution backward-weight",
                },
                _ => "gemm",
            };
            collected.kernel_s += sample.measured_s;
            collected.fitted_s += sample.measured_s;
            collected.names.push(format!("deepbench {precision} {kind}"));
            collected.shared.push(false);
            collected.copy.push(0.0);
            collected.samples.push(sample);
        }
        used.push(name.to_string());
    }
    if used.is_empty() {
        return Err(CalibrationError::NoTables {
            family: family.to_string(),
            tables: tables.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
        });
    }
    Ok(format!("DeepBench tables {}", used.join(", ")))
}

/// The traced GPUs' names (sorted, each once), after checking that every file that records
/// its GPU ran on `device` or on a catalog device that computes exactly like it (the same
/// peaks and memory bandwidth: V100-SXM2 16 GB and 32 GB); `None` if no file records its
/// GPU. GPUs are recognized by their memory capacity, within 10%, since traces name them in
/// many ways ("A100-PG509-200" is an A100 SXM4 40 GB).
pub fn traced_devices(import: &OperatorImport, device: &Device) -> Result<Option<String>, CalibrationError> {
    let recorded: Vec<(&Path, &traces::model::DeviceInfo)> =
        import.files.iter().filter_map(|f| f.device.as_ref().map(|d| (f.path.as_path(), d))).collect();
    if recorded.is_empty() {
        return Ok(None);
    }
    let catalog = DeviceCatalog::builtin();
    let near =
        |bytes: f64, candidate: &Device| (bytes / candidate.memory_capacity.as_f64() - 1.0).abs() <= 0.1;
    for (path, traced) in &recorded {
        let bytes = traced.memory_bytes as f64;
        if bytes <= 0.0 {
            continue;
        }
        let matches = catalog.devices().iter().any(|d| near(bytes, d) && d.same_compute(device));
        if !matches {
            let same_size: Vec<&str> =
                catalog.devices().iter().filter(|d| near(bytes, d)).map(|d| d.name.as_str()).collect();
            return Err(CalibrationError::OtherDevice {
                path: path.to_path_buf(),
                traced: traced.name.clone(),
                traced_gb: bytes / 1e9,
                device: device.name.clone(),
                device_gb: device.memory_capacity.as_f64() / 1e9,
                same_size: if same_size.is_empty() { "none".to_string() } else { same_size.join(", ") },
            });
        }
    }
    let mut names: Vec<&str> = recorded.iter().map(|(_, d)| d.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    Ok(Some(names.join(", ")))
}

/// Each host thread's launches and synchronizations in start order, over `ranks` (a rank's
/// calls are sorted by thread, then start): what [`launch_intervals`] reads.
pub fn host_threads(ranks: &[RankTrace]) -> Vec<Vec<HostCall>> {
    let mut threads: Vec<Vec<HostCall>> = Vec::new();
    for rank in ranks {
        let mut current: Option<u32> = None;
        for call in &rank.calls {
            if current != Some(call.thread) {
                threads.push(Vec::new());
                current = Some(call.thread);
            }
            let host = match call.kind {
                CallKind::Launch => HostCall::Launch(call.start_ns),
                CallKind::Synchronize(_) => HostCall::Synchronize,
                CallKind::StreamWaitEvent => continue,
            };
            if let Some(thread) = threads.last_mut() {
                thread.push(host);
            }
        }
    }
    threads
}

/// The launch intervals of `ranks`' host threads, in microseconds to 0.1 us as a profile
/// records them, or `None` if no thread launched twice in a row.
pub fn launch_record(ranks: &[RankTrace]) -> Option<LaunchRecord> {
    launch_record_of_threads(&host_threads(ranks))
}

/// [`launch_record`] of host threads as [`host_threads`] gives them (the threads of several
/// traces are the concatenation of each one's, so traces can be read one at a time).
pub fn launch_record_of_threads(threads: &[Vec<HostCall>]) -> Option<LaunchRecord> {
    let us = |d: SimDuration| (d.as_secs_f64() * 1e7).round() / 10.0;
    launch_intervals(threads).map(|stats| LaunchRecord {
        intervals: stats.intervals,
        p10_us: us(stats.p10),
        p25_us: us(stats.p25),
        median_us: us(stats.median),
        p75_us: us(stats.p75),
    })
}

/// The multiprocessors the traces' NCCL kernels held ([`nccl_share`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NcclShare {
    /// NCCL kernel time, s.
    pub nccl_s: f64,
    /// Thread blocks, time-weighted.
    pub blocks: f64,
    /// Their share of the GPU's multiprocessors (one block to an SM), time-weighted.
    pub share: f64,
    /// The GPUs' multiprocessor counts, ascending.
    pub multiprocessors: Vec<u32>,
}

impl NcclShare {
    /// The slowdown `1 / (1 - share)` this share alone gives a compute-bound kernel beside
    /// them; `None` when they hold every multiprocessor.
    pub fn slowdown(&self) -> Option<f64> {
        (self.share < 1.0).then(|| 1.0 / (1.0 - self.share))
    }
}

/// The multiprocessors the traces' NCCL kernels held, from their recorded launch grids
/// ([`traces::kineto::operators::OperatorFile::nccl_blocks`]) and the traces' `numSms`,
/// averaged over the kernels' time, to set against the fitted `communication-compute-slowdown`
/// (docs/compute-model.md, "Beside NCCL"). `None` without NCCL kernels with a grid on a GPU of
/// known size.
pub fn nccl_share(import: &OperatorImport) -> Option<NcclShare> {
    let (mut nccl_ns, mut block_ns, mut share_ns) = (0u64, 0.0, 0.0);
    let mut multiprocessors = BTreeSet::new();
    for file in &import.files {
        let sms = file.device.as_ref().map_or(0, |d| d.multiprocessors);
        let Some(blocks) = file.nccl_blocks().filter(|_| sms > 0) else { continue };
        nccl_ns += file.nccl_ns;
        block_ns += blocks * file.nccl_ns as f64;
        share_ns += (blocks / f64::from(sms)).min(1.0) * file.nccl_ns as f64;
        multiprocessors.insert(sms);
    }
    (nccl_ns > 0).then(|| NcclShare {
        nccl_s: nccl_ns as f64 * 1e-9,
        blocks: block_ns / nccl_ns as f64,
        share: share_ns / nccl_ns as f64,
        multiprocessors: multiprocessors.into_iter().collect(),
    })
}

/// Traffic up to which a one-kernel element-wise operator counts as tiny in [`tiny_kernels`]:
/// 64 KiB streams in under 0.1 us at any catalog GPU's bandwidth, so such a kernel's measured
/// time is its fixed cost.
pub const TINY_KERNEL_BYTES: f64 = 65_536.0;

/// The median time (s) of a group of operators and how many there are.
pub type Median = (f64, usize);

/// The measured fixed cost of a kernel ([`tiny_kernels`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TinyKernels {
    /// Alone on their GPU.
    pub alone: Median,
    /// Beside NCCL kernels only, if any.
    pub nccl: Option<Median>,
    /// Beside copies, if any.
    pub copies: Option<Median>,
}

/// The median of `values` (sorted in place; [`workloads::calibrate::median`]); `None` if empty.
pub fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    (!values.is_empty()).then(|| workloads::calibrate::median(values))
}

/// The measured fixed cost of a kernel alone, beside NCCL kernels and beside copies: the median
/// time of the tiny one-kernel element-wise operators (at most [`TINY_KERNEL_BYTES`] moved) that
/// ran with no communication on their GPU, of those beside communication for at least 99% of
/// their time with no copy among it (NCCL kernels only), and of those with a copy
/// (`copy[i]`, the share of sample `i`'s time beside a copy, above 0). This is what
/// `communication-launch-slowdown` stands for, measured directly (docs/compute-model.md,
/// "Tiny kernels beside NCCL kernels and beside copies"); `None` unless there are operators
/// alone and beside communication.
pub fn tiny_kernels(samples: &[Sample], copy: &[f64]) -> Option<TinyKernels> {
    let (mut alone, mut nccl, mut copies) = (Vec::new(), Vec::new(), Vec::new());
    for (i, s) in samples.iter().enumerate() {
        let tiny = s.work.class == workloads::OpClass::Elementwise
            && s.after.is_empty()
            && s.kernels == 1
            && s.work.bytes <= TINY_KERNEL_BYTES;
        if !tiny {
            continue;
        }
        if s.communication == 0.0 {
            alone.push(s.measured_s);
        } else if s.communication >= 0.99 {
            if copy.get(i).copied().unwrap_or(0.0) > 0.0 { &mut copies } else { &mut nccl }
                .push(s.measured_s);
        }
    }
    let n_alone = alone.len();
    let alone = median(&mut alone)?;
    if nccl.is_empty() && copies.is_empty() {
        return None;
    }
    let group = |times: &mut Vec<f64>| {
        let n = times.len();
        median(times).map(|t| (t, n))
    };
    Some(TinyKernels { alone: (alone, n_alone), nccl: group(&mut nccl), copies: group(&mut copies) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

    use super::*;
    use traces::kineto::operators::OperatorFile;
    use traces::model::RuntimeCall;

    fn tiny(measured_us: f64, communication: f64, bytes: f64, kernels: u32) -> Sample {
        Sample {
            work: workloads::KernelWork::flat(workloads::OpClass::Elementwise, Dtype::Fp32, 0.0, bytes),
            after: Vec::new(),
            kernels,
            measured_s: measured_us * 1e-6,
            communication,
            group: 0,
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    /// Only tiny one-kernel element-wise operators count: alone (no communication) against
    /// fully beside communication (at least 99% of their time), split by whether a copy ran
    /// meanwhile; the rest are left out.
    #[test]
    fn tiny_kernels_compare_alone_with_beside_nccl_and_copies() {
        let samples = vec![
            tiny(3.0, 0.0, 4.0, 1),
            tiny(4.0, 0.0, 65_536.0, 1),
            tiny(2.0, 0.0, 1024.0, 1),
            tiny(6.0, 1.0, 4.0, 1),
            tiny(9.0, 0.995, 4.0, 1),
            tiny(12.0, 1.0, 4.0, 1),
            // Left out: half beside, too large, two kernels.
            tiny(50.0, 0.5, 4.0, 1),
            tiny(50.0, 0.0, 65_537.0, 1),
            tiny(50.0, 1.0, 4.0, 2),
        ];
        let copy = [0.0, 0.0, 0.0, 0.0, 0.0, 0.3, 0.0, 0.0, 1.0];
        let close = |a: Median, b: Median| (a.0 - b.0).abs() < 1e-12 && a.1 == b.1;
        let found = tiny_kernels(&samples, &copy).unwrap();
        assert!(close(found.alone, (3e-6, 3)), "{found:?}");
        assert!(close(found.nccl.unwrap(), (7.5e-6, 2)), "{found:?}");
        assert!(close(found.copies.unwrap(), (12e-6, 1)), "{found:?}");
        // Without copies the copies' group is empty.
        assert_eq!(tiny_kernels(&samples[..5], &copy).unwrap().copies, None);
        // Without operators beside communication there is nothing to compare.
        assert_eq!(tiny_kernels(&samples[..3], &copy), None);
    }

    fn operator(name: u32, activities: Vec<(ActivityKind, u64)>) -> ProfiledOperator {
        ProfiledOperator {
            name,
            dims: vec![Some(vec![64, 32]), Some(vec![32, 16])],
            types: vec![Some("float".into()), Some("float".into())],
            activities: activities
                .into_iter()
                .map(|(kind, duration_ns)| Activity {
                    name: 1,
                    kind,
                    duration_ns,
                    communication_ns: 0,
                    concurrent_ns: 0,
                    copy_ns: 0,
                })
                .collect(),
        }
    }

    /// An operator joined to its compute kernels is a sample; one with an NCCL kernel or a
    /// host copy is left out by reason, one of copies only is not counted at all.
    #[test]
    fn operators_joined_to_their_kernels_are_samples_and_the_rest_is_counted_by_reason() {
        let import = OperatorImport {
            names: vec!["aten::mm".into(), "volta_sgemm_64x32".into(), "nccl:all_reduce".into()],
            files: vec![OperatorFile {
                path: PathBuf::from("rank0.json"),
                device: None,
                recorded_operators: 4,
                unattributed: 0,
                nccl_ns: 0,
                nccl_block_ns: 0,
                kernel_ns: 20_000,
                operators: vec![
                    operator(0, vec![(ActivityKind::Kernel, 10_000)]),
                    operator(0, vec![(ActivityKind::Kernel, 5_000), (ActivityKind::Nccl, 5_000)]),
                    operator(0, vec![(ActivityKind::Kernel, 3_000), (ActivityKind::Memcpy, 1_000)]),
                    operator(2, vec![(ActivityKind::Memcpy, 1_000)]),
                ],
            }],
            warnings: traces::Warnings::new(),
        };
        let collected = collect(&import);
        assert_eq!(collected.samples.len(), 1);
        assert_eq!(collected.names, ["aten::mm"]);
        let sample = &collected.samples[0];
        assert_eq!(sample.work.class, workloads::OpClass::Gemm);
        assert!((sample.measured_s - 10e-6).abs() < 1e-15);
        assert_eq!(sample.group, shape_key("aten::mm", &import.files[0].operators[0]));
        assert_eq!(collected.gemm_dtypes.iter().collect::<Vec<_>>(), ["fp32"]);
        assert!((collected.kernel_s - 20e-6).abs() < 1e-15 && (collected.fitted_s - 10e-6).abs() < 1e-15);
        let reasons: Vec<&str> = collected.left_out.keys().map(|(reason, _)| reason.as_str()).collect();
        assert_eq!(reasons, ["communication", "copies over the host link"]);
        assert_eq!(
            collected.top_reasons(),
            "communication: 0.0 ms of kernels; copies over the host link: 0.0 ms of kernels"
        );
        assert_eq!(collected.shared, [false]);
        assert_eq!(collected.errors_by_sharing(&[1e-5], &[1e-5]), Vec::new());
        let by_operator = collected.errors_by_operator(&[2e-5]);
        assert_eq!(by_operator.len(), 1);
        assert_eq!((by_operator[0].0.as_str(), by_operator[0].1.as_slice()), ("aten::mm", &[0][..]));
        assert!((by_operator[0].2.median_error - 1.0).abs() < 1e-9, "{:?}", by_operator[0].2);
    }

    fn call(thread: u32, start_ns: u64, kind: CallKind) -> RuntimeCall {
        RuntimeCall { thread, start_ns, duration_ns: 1, name: 0, kind }
    }

    /// Launch intervals are counted within each host thread, and a synchronization breaks the
    /// chain.
    #[test]
    fn launch_intervals_are_within_a_thread_and_a_synchronization_breaks_them() {
        let rank = RankTrace {
            rank: 0,
            source: "rank0.json".into(),
            origin_ns: 0,
            streams: Vec::new(),
            threads: vec![11, 12],
            gpu_ops: Vec::new(),
            steps: Vec::new(),
            stream_waits: Vec::new(),
            calls: vec![
                call(0, 0, CallKind::Launch),
                call(0, 4_000, CallKind::Launch),
                call(0, 9_000, CallKind::Synchronize(traces::model::SyncScope::Device)),
                call(0, 20_000, CallKind::Launch),
                call(0, 26_000, CallKind::StreamWaitEvent),
                call(0, 30_000, CallKind::Launch),
                call(1, 100_000, CallKind::Launch),
                call(1, 102_000, CallKind::Launch),
            ],
        };
        let threads = host_threads(std::slice::from_ref(&rank));
        assert_eq!(threads.len(), 2);
        assert_eq!(threads[0].len(), 5);
        let record = launch_record(std::slice::from_ref(&rank)).unwrap();
        // Intervals 4 us, 10 us (the wait does not break the chain), 2 us.
        assert_eq!(record.intervals, 3);
        assert_eq!((record.p10_us, record.median_us), (2.0, 4.0));
        assert_eq!(launch_record(&[]), None);
    }
}
