//! Host operators and the GPU work each one launched: what calibrating the compute model needs.
//!
//! PyTorch's profiler records every operator on the host (`cpu_op` events, with `Input Dims`
//! and `Input type` when `record_shapes=True`), every CUDA runtime call, and every kernel with
//! the `correlation` id of the call that launched it. A kernel belongs to the innermost operator
//! whose host interval contains its launch call, on the launching thread: `aten::mm` rather
//! than the `aten::linear` around it. This is the rule Holistic Trace Analysis uses for traces
//! whose kernels' `External id` does not name an operator (PyTorch before 2.0 wrote the
//! correlation id there).

use std::collections::BTreeMap;

use sim_core::lookup::LookupMap;
use std::path::{Path, PathBuf};

use super::raw::{self, GpuCategory, RawFile, RawGpu, RawOperator};
use crate::error::TraceError;
use crate::model::DeviceInfo;
use crate::nccl;
use crate::warnings::Warnings;

/// What kind of GPU activity an operator launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivityKind {
    /// A compute kernel.
    Kernel,
    /// An NCCL kernel (communication, not compute).
    Nccl,
    /// A memset.
    Memset,
    /// A copy (between host and device, or device to device).
    Memcpy,
}

/// One GPU activity launched by an operator.
#[derive(Debug, Clone, PartialEq)]
pub struct Activity {
    /// The kernel's name (index into [`OperatorImport::names`]).
    pub name: u32,
    /// What it is.
    pub kind: ActivityKind,
    /// Measured duration (ns).
    pub duration_ns: u64,
    /// How long (ns) another stream of the same GPU had an activity (a kernel, copy or memset)
    /// running while this one ran. Such an activity shared the GPU's multiprocessors or memory,
    /// and its duration is not its own alone (`parasim calibrate` reports the operators that
    /// ran alone and those beside other streams apart).
    pub concurrent_ns: u64,
    /// The part of `concurrent_ns` (ns) during which the other streams ran communication: an
    /// NCCL kernel or a copy. This is what a simulation knows of a kernel's neighbours (its
    /// rank's collectives, transfers and copies), and what the compute model's
    /// `communication-slowdown` is fitted to.
    pub communication_ns: u64,
    /// The part of `communication_ns` (ns) during which another stream ran a copy (a
    /// `gpu_memcpy`: host to device, device to host or device to device), NCCL kernel or not
    /// meanwhile. Tiny kernels beside host-to-device copies measured several times their fixed
    /// cost alone, more than beside NCCL kernels, so `parasim calibrate` reports them apart
    /// (docs/compute-model.md, "Tiny kernels beside NCCL kernels and beside copies").
    pub copy_ns: u64,
}

/// One host operator and the GPU activities it launched directly (not through a nested
/// operator).
#[derive(Debug, Clone, PartialEq)]
pub struct ProfiledOperator {
    /// The operator's name (index into [`OperatorImport::names`]), e.g. `aten::mm`.
    pub name: u32,
    /// `Input Dims`, one entry per argument: the sizes of a tensor (`[]` for a scalar, a
    /// zero-dimensional tensor or an untracked argument), `None` where the trace wrote
    /// something else (a tensor list's nested sizes). Empty if shapes were not recorded.
    pub dims: Vec<Option<Vec<u64>>>,
    /// `Input type`, one entry per argument ("float", "c10::Half", "Scalar", ...). Empty if
    /// shapes were not recorded.
    pub types: Vec<Option<String>>,
    /// Its GPU activities, in launch order.
    pub activities: Vec<Activity>,
}

impl ProfiledOperator {
    /// Total measured time of its activities of `kind` (ns).
    pub fn duration_ns(&self, kind: ActivityKind) -> u64 {
        self.activities.iter().filter(|a| a.kind == kind).map(|a| a.duration_ns).sum()
    }
}

/// The operators of one trace file.
#[derive(Debug, Clone)]
pub struct OperatorFile {
    /// The file.
    pub path: PathBuf,
    /// Its GPU, from `deviceProperties`, if recorded.
    pub device: Option<DeviceInfo>,
    /// Operators that launched at least one GPU activity, in start order.
    pub operators: Vec<ProfiledOperator>,
    /// Operators recorded in the file (with or without GPU work).
    pub recorded_operators: u64,
    /// GPU activities whose launch lies in no operator (or whose launch call is missing).
    pub unattributed: u64,
    /// Total measured time of compute kernels in the file (ns), attributed or not.
    pub kernel_ns: u64,
    /// Measured time of the file's NCCL kernels that recorded their launch grid (ns).
    pub nccl_ns: u64,
    /// The same time weighted by each kernel's thread blocks (block-nanoseconds): see
    /// [`OperatorFile::nccl_blocks`].
    pub nccl_block_ns: u128,
}

impl OperatorFile {
    /// The thread blocks of the file's NCCL kernels, averaged over their time (kernels that
    /// recorded a grid), `None` if none did. An NCCL block holds a whole multiprocessor (NCCL
    /// 2.x launches 544 or 640 threads of 96 registers, 61,440 of an SM's 65,536, as the HTA
    /// traces record), so this is how many multiprocessors communication keeps from the other
    /// streams' kernels while it runs.
    pub fn nccl_blocks(&self) -> Option<f64> {
        (self.nccl_ns > 0).then(|| self.nccl_block_ns as f64 / self.nccl_ns as f64)
    }
}

/// Operators and their GPU work from one or more trace files.
#[derive(Debug, Clone)]
pub struct OperatorImport {
    /// Operator and kernel names.
    pub names: Vec<String>,
    /// One entry per file, in the order given (directories expanded in name order).
    pub files: Vec<OperatorFile>,
    /// What the import skipped or assumed.
    pub warnings: Warnings,
}

impl OperatorImport {
    /// The name behind an index of [`ProfiledOperator::name`] or [`Activity::name`].
    pub fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", String::as_str)
    }
}

/// Reads the operators of the Kineto traces at `paths` (files or directories) with the GPU
/// activities each one launched.
pub fn import_operators(paths: &[PathBuf]) -> Result<OperatorImport, TraceError> {
    let files = super::expand_paths(paths)?;
    let mut names = raw::Interner::default();
    let mut warnings = Warnings::new();
    let mut out = Vec::with_capacity(files.len());
    for path in &files {
        let raw = parse_with_gpu(path, &mut names, &mut warnings)?;
        out.push(attribute(&raw, path, &names.names));
    }
    Ok(OperatorImport { names: names.names, files: out, warnings })
}

/// One file parsed with its operators, its warnings counted; refused without GPU activity.
fn parse_with_gpu(
    path: &Path,
    names: &mut raw::Interner,
    warnings: &mut Warnings,
) -> Result<RawFile, TraceError> {
    let raw = raw::parse_file(path, names, true)?;
    warnings.extend(&raw.warnings);
    if raw.gpu.is_empty() {
        return Err(TraceError::no_gpu_activity(path));
    }
    Ok(raw)
}

/// [`import_operators`], and from the same parse of each file the replay import of each input
/// on its own ([`super::import`] of `[input]`: a file, or a directory of one job's ranks), handed
/// to `job` in input order as soon as the input is read. Each file is parsed once and dropped
/// once read, so a large trace costs one pass and never two parses in memory. The replay
/// imports' failures go to `job` too: only the operators' failures (a file that does not parse,
/// a file without GPU activity) end the import. The operators are those of
/// [`import_operators`], and each replay import is that of [`super::import`], except that its
/// warnings also count what operator events lacked.
pub fn import_operators_and_jobs(
    paths: &[PathBuf],
    mut job: impl FnMut(&Path, Result<super::Imported, TraceError>),
) -> Result<OperatorImport, TraceError> {
    // Every input's files first: a missing or empty input is refused before any parse, as
    // [`import_operators`] refuses it.
    super::expand_paths(paths)?;
    let inputs = paths
        .iter()
        .map(|path| super::expand_paths(std::slice::from_ref(path)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut names = raw::Interner::default();
    let mut warnings = Warnings::new();
    let mut out = Vec::new();
    for (input, files) in paths.iter().zip(inputs) {
        let mut replay = super::Job::new(files.clone());
        for (position, path) in files.iter().enumerate() {
            let raw = parse_with_gpu(path, &mut names, &mut warnings)?;
            out.push(attribute(&raw, path, &names.names));
            replay.add(position, &raw, &names.names);
        }
        job(input, replay.finish(names.names.clone()));
    }
    Ok(OperatorImport { names: names.names, files: out, warnings })
}

/// Operators of one thread as a forest: sorted by start (outer before inner at equal starts),
/// each with the position of its innermost enclosing operator.
struct Nesting<'a> {
    operators: Vec<&'a RawOperator>,
    parent: Vec<Option<usize>>,
}

impl<'a> Nesting<'a> {
    fn new(mut operators: Vec<&'a RawOperator>) -> Self {
        operators.sort_by_key(|o| (o.ts_ns, std::cmp::Reverse(o.duration_ns)));
        let mut parent = Vec::with_capacity(operators.len());
        let mut open: Vec<usize> = Vec::new();
        for (i, op) in operators.iter().enumerate() {
            while let Some(&top) = open.last() {
                if end(operators[top]) >= op.ts_ns {
                    break;
                }
                open.pop();
            }
            parent.push(open.last().copied());
            open.push(i);
        }
        Nesting { operators, parent }
    }

    /// The innermost operator whose interval contains instant `ts`.
    fn innermost(&self, ts: i64) -> Option<usize> {
        let mut at = self.operators.partition_point(|o| o.ts_ns <= ts).checked_sub(1)?;
        loop {
            if end(self.operators[at]) >= ts {
                return Some(at);
            }
            at = self.parent[at]?;
        }
    }
}

/// For each GPU activity, how long (ns) activities of other streams of its device for which
/// `counts` holds ran while it did: its overlap with the union of their intervals.
fn concurrency(gpu: &[RawGpu], counts: impl Fn(&RawGpu) -> bool) -> Vec<u64> {
    let interval =
        |g: &RawGpu| (g.ts_ns, g.ts_ns.saturating_add(i64::try_from(g.duration_ns).unwrap_or(i64::MAX)));
    let mut streams: Vec<(u32, u64)> = gpu.iter().map(|g| (g.device, g.stream)).collect();
    streams.sort_unstable();
    streams.dedup();
    let mut out = vec![0; gpu.len()];
    for &(device, stream) in &streams {
        // The busy periods of the device's other streams, merged.
        let mut others: Vec<(i64, i64)> = gpu
            .iter()
            .filter(|g| g.device == device && g.stream != stream && counts(g))
            .map(interval)
            .collect();
        if others.is_empty() {
            continue;
        }
        others.sort_unstable();
        let mut busy: Vec<(i64, i64)> = Vec::with_capacity(others.len());
        for (start, stop) in others {
            match busy.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(stop),
                _ => busy.push((start, stop)),
            }
        }
        for (g, slot) in gpu.iter().zip(&mut out) {
            if g.device != device || g.stream != stream {
                continue;
            }
            let (start, stop) = interval(g);
            let first = busy.partition_point(|&(_, busy_stop)| busy_stop <= start);
            *slot = busy[first..]
                .iter()
                .take_while(|&&(busy_start, _)| busy_start < stop)
                .map(|&(busy_start, busy_stop)| (busy_stop.min(stop) - busy_start.max(start)).max(0) as u64)
                .sum();
        }
    }
    out
}

fn end(op: &RawOperator) -> i64 {
    op.ts_ns.saturating_add(i64::try_from(op.duration_ns).unwrap_or(i64::MAX))
}

/// Attributes every GPU activity of `raw` to the operator that launched it.
fn attribute(raw: &RawFile, path: &Path, names: &[String]) -> OperatorFile {
    let mut by_thread: BTreeMap<u64, Vec<&RawOperator>> = BTreeMap::new();
    for op in &raw.operators {
        by_thread.entry(op.thread).or_default().push(op);
    }
    let nestings: LookupMap<u64, Nesting> =
        by_thread.into_iter().map(|(t, ops)| (t, Nesting::new(ops))).collect();
    let calls: LookupMap<u64, (u64, i64)> =
        raw.calls.iter().filter_map(|c| c.correlation.map(|id| (id, (c.thread, c.ts_ns)))).collect();

    // (thread, position in its nesting) -> activities, in launch order.
    let mut launched: BTreeMap<(u64, usize), Vec<(i64, Activity)>> = BTreeMap::new();
    let mut unattributed = 0;
    let mut kernel_ns = 0;
    let (mut nccl_ns, mut nccl_block_ns) = (0u64, 0u128);
    let kind_of = |gpu: &RawGpu| {
        let name = names.get(gpu.name as usize).map_or("", String::as_str);
        match gpu.category {
            GpuCategory::Kernel if nccl::is_nccl_kernel(name) => ActivityKind::Nccl,
            GpuCategory::Kernel => ActivityKind::Kernel,
            GpuCategory::Memset => ActivityKind::Memset,
            GpuCategory::Memcpy => ActivityKind::Memcpy,
        }
    };
    let concurrent = concurrency(&raw.gpu, |_| true);
    let communication =
        concurrency(&raw.gpu, |g| matches!(kind_of(g), ActivityKind::Nccl | ActivityKind::Memcpy));
    let copies = concurrency(&raw.gpu, |g| kind_of(g) == ActivityKind::Memcpy);
    for (((gpu, &concurrent_ns), &communication_ns), &copy_ns) in
        raw.gpu.iter().zip(&concurrent).zip(&communication).zip(&copies)
    {
        let kind = kind_of(gpu);
        if kind == ActivityKind::Kernel {
            kernel_ns += gpu.duration_ns;
        }
        if let (ActivityKind::Nccl, Some(blocks)) = (kind, gpu.blocks) {
            nccl_ns += gpu.duration_ns;
            nccl_block_ns += u128::from(blocks) * u128::from(gpu.duration_ns);
        }
        let owner = gpu.correlation.and_then(|c| calls.get(&c)).and_then(|&(thread, ts)| {
            nestings.get(&thread).and_then(|n| n.innermost(ts)).map(|position| ((thread, position), ts))
        });
        match owner {
            Some((key, ts)) => launched.entry(key).or_default().push((
                ts,
                Activity {
                    name: gpu.name,
                    kind,
                    duration_ns: gpu.duration_ns,
                    concurrent_ns,
                    communication_ns,
                    copy_ns,
                },
            )),
            None => unattributed += 1,
        }
    }

    let mut operators: Vec<(i64, ProfiledOperator)> = launched
        .into_iter()
        .map(|((thread, position), mut activities)| {
            activities.sort_by_key(|(ts, _)| *ts);
            let op = nestings[&thread].operators[position];
            let arguments = &raw.arguments.lists[op.arguments as usize];
            (
                op.ts_ns,
                ProfiledOperator {
                    name: op.name,
                    dims: arguments.dims.clone(),
                    types: arguments.types.clone(),
                    activities: activities.into_iter().map(|(_, a)| a).collect(),
                },
            )
        })
        .collect();
    operators.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
    OperatorFile {
        path: path.to_path_buf(),
        device: super::device_info(raw),
        operators: operators.into_iter().map(|(_, op)| op).collect(),
        recorded_operators: raw.operators.len() as u64,
        unattributed,
        kernel_ns,
        nccl_ns,
        nccl_block_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import(text: &str) -> OperatorImport {
        let mut names = raw::Interner::default();
        let raw = raw::parse_reader(text.as_bytes(), Path::new("t.json"), &mut names, true).unwrap();
        let file = attribute(&raw, Path::new("t.json"), &names.names);
        OperatorImport { names: names.names, files: vec![file], warnings: Warnings::new() }
    }

    #[test]
    fn kernels_belong_to_the_innermost_operator_around_their_launch() {
        let trace = import(
            r#"{"traceEvents": [
              {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "tid": 1, "ts": 0, "dur": 100,
               "args": {"Input Dims": [[8, 16], [4, 16], [4]], "Input type": ["float", "float", "float"]}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::t", "tid": 1, "ts": 1, "dur": 5, "args": {}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "tid": 1, "ts": 10, "dur": 50,
               "args": {"Input Dims": [[4], [8, 16], [16, 4], [], []],
                        "Input type": ["float", "float", "float", "Scalar", "Scalar"]}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1, "ts": 20, "dur": 5,
               "args": {"correlation": 7}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1, "ts": 70, "dur": 5,
               "args": {"correlation": 8}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1, "ts": 200, "dur": 5,
               "args": {"correlation": 9}},
              {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 30, "dur": 12.5,
               "args": {"correlation": 7, "stream": 7, "device": 0}},
              {"ph": "X", "cat": "kernel", "name": "bias", "pid": 0, "tid": 7, "ts": 80, "dur": 2,
               "args": {"correlation": 8, "stream": 7, "device": 0}},
              {"ph": "X", "cat": "kernel", "name": "orphan", "pid": 0, "tid": 7, "ts": 210, "dur": 2,
               "args": {"correlation": 9, "stream": 7, "device": 0}}
            ]}"#,
        );
        let file = &trace.files[0];
        assert_eq!(file.recorded_operators, 3);
        assert_eq!(file.unattributed, 1);
        assert_eq!(file.kernel_ns, 16_500);
        let names: Vec<&str> = file.operators.iter().map(|o| trace.name(o.name)).collect();
        // The sibling `aten::t` ended before the second launch: it goes to the parent.
        assert_eq!(names, ["aten::linear", "aten::addmm"]);
        let addmm = &file.operators[1];
        assert_eq!(addmm.duration_ns(ActivityKind::Kernel), 12_500);
        assert_eq!(addmm.dims[1], Some(vec![8, 16]));
        assert_eq!(addmm.dims[3], Some(vec![]));
        assert_eq!(addmm.types[3].as_deref(), Some("Scalar"));
        assert_eq!(trace.name(file.operators[0].activities[0].name), "bias");
    }

    #[test]
    fn activities_beside_other_streams_record_how_long_they_shared_the_gpu() {
        let trace = import(
            r#"{"traceEvents": [
              {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "tid": 1, "ts": 0, "dur": 100, "args": {}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1, "ts": 1, "dur": 1,
               "args": {"correlation": 1}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1, "ts": 3, "dur": 1,
               "args": {"correlation": 2}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1, "ts": 5, "dur": 1,
               "args": {"correlation": 3}},
              {"ph": "X", "cat": "kernel", "name": "mul", "pid": 0, "tid": 7, "ts": 10, "dur": 10,
               "args": {"correlation": 1, "stream": 7, "device": 0}},
              {"ph": "X", "cat": "kernel", "name": "mul", "pid": 0, "tid": 7, "ts": 30, "dur": 10,
               "args": {"correlation": 2, "stream": 7, "device": 0}},
              {"ph": "X", "cat": "kernel", "name": "mul", "pid": 0, "tid": 7, "ts": 50, "dur": 10,
               "args": {"correlation": 3, "stream": 7, "device": 0}},
              {"ph": "X", "cat": "kernel", "name": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "pid": 0,
               "tid": 9, "ts": 15, "dur": 20, "args": {"stream": 9, "device": 0}},
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 8,
               "ts": 33, "dur": 4, "args": {"stream": 8, "device": 0}},
              {"ph": "X", "cat": "kernel", "name": "other_gpu", "pid": 1, "tid": 9, "ts": 50, "dur": 10,
               "args": {"stream": 9, "device": 1}}
            ]}"#,
        );
        let shared: Vec<u64> =
            trace.files[0].operators[0].activities.iter().map(|a| a.concurrent_ns).collect();
        // The first kernel beside the NCCL kernel for 5 us; the second beside it for 5 us and
        // beside the copy (which overlaps the NCCL kernel) for 2 us more; the third alone on
        // its GPU (the kernel at the same time runs on another device).
        assert_eq!(shared, [5_000, 7_000, 0]);
        // All of it was communication: an NCCL kernel and a copy.
        let communication: Vec<u64> =
            trace.files[0].operators[0].activities.iter().map(|a| a.communication_ns).collect();
        assert_eq!(communication, [5_000, 7_000, 0]);
        // Of which beside the copy: the second kernel's 2 us after the NCCL kernel ended, and
        // the 2 us before (33-35 us), when the NCCL kernel ran too.
        let copies: Vec<u64> = trace.files[0].operators[0].activities.iter().map(|a| a.copy_ns).collect();
        assert_eq!(copies, [0, 4_000, 0]);
    }

    #[test]
    fn copies_and_nccl_kernels_are_told_apart() {
        let trace = import(
            r#"{"traceEvents": [
              {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "tid": 1, "ts": 0, "dur": 100, "args": {}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "tid": 1, "ts": 20, "dur": 5,
               "args": {"correlation": 1}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1, "ts": 30, "dur": 5,
               "args": {"correlation": 2}},
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 7,
               "ts": 30, "dur": 3, "args": {"correlation": 1, "stream": 7, "device": 0, "bytes": 64}},
              {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
               "pid": 0, "tid": 9, "ts": 40, "dur": 9, "args": {"correlation": 2, "stream": 9, "device": 0}}
            ]}"#,
        );
        let op = &trace.files[0].operators[0];
        assert!(op.dims.is_empty() && op.types.is_empty());
        let kinds: Vec<ActivityKind> = op.activities.iter().map(|a| a.kind).collect();
        assert_eq!(kinds, [ActivityKind::Memcpy, ActivityKind::Nccl]);
        assert_eq!(trace.files[0].kernel_ns, 0);
    }

    #[test]
    fn nccl_kernels_blocks_are_averaged_over_their_time() {
        let with_grids = import(
            r#"{"traceEvents": [
              {"ph": "X", "cat": "kernel", "name": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "pid": 0,
               "tid": 9, "ts": 0, "dur": 30, "args": {"stream": 9, "device": 0, "grid": [24, 1, 1]}},
              {"ph": "X", "cat": "kernel", "name": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "pid": 0,
               "tid": 9, "ts": 40, "dur": 10, "args": {"stream": 9, "device": 0, "grid": [4, 2, 1]}},
              {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": 0,
               "tid": 9, "ts": 60, "dur": 50, "args": {"stream": 9, "device": 0}},
              {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": 0,
               "tid": 9, "ts": 120, "dur": 50, "args": {"stream": 9, "device": 0, "grid": "[2]"}},
              {"ph": "X", "cat": "kernel", "name": "mul", "pid": 0, "tid": 7, "ts": 0, "dur": 99,
               "args": {"stream": 7, "device": 0, "grid": [1000, 1, 1]}}
            ]}"#,
        );
        let file = &with_grids.files[0];
        // 30 us on 24 blocks and 10 us on 4 x 2: (30 x 24 + 10 x 8) / 40 = 20. The kernels
        // without a grid (none, or not a list) and the compute kernel do not count.
        assert_eq!(file.nccl_ns, 40_000);
        assert_eq!(file.nccl_blocks(), Some(20.0));
        let without = import(
            r#"{"traceEvents": [
              {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": 0,
               "tid": 9, "ts": 0, "dur": 50, "args": {"stream": 9, "device": 0}}
            ]}"#,
        );
        assert_eq!(without.files[0].nccl_blocks(), None);
    }
}
