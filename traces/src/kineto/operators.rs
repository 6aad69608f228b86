//! Host operators and the GPU work each one launched: what calibrating the compute model needs.
//!
//! PyTorch's profiler records every operator on the host (`cpu_op` events, with `Input Dims`
//! and `Input type` when `record_shapes=True`), every CUDA runtime call, and every kernel with
//! the `correlation` id of the call that launched it. A kernel belongs to the innermost operator
//! whose host interval contains its launch call, on the launching thread: `aten::mm` rather
//! than the `aten::linear` around it. This is the rule Holistic Trace Analysis uses for traces
//! whose kernels' `External id` does not name an operator (PyTorch before 2.0 wrote the
//! correlation id there).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::raw::{self, GpuCategory, RawFile, RawOperator};
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
        let raw = raw::parse_file(path, &mut names, true)?;
        warnings.extend(&raw.warnings);
        if raw.gpu.is_empty() {
            return Err(TraceError::Meaningless {
                path: path.clone(),
                reason: "no GPU kernels, copies or memsets: was the profiler run with CUDA activities?"
                    .into(),
            });
        }
        out.push(attribute(&raw, path, &names.names));
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

fn end(op: &RawOperator) -> i64 {
    op.ts_ns.saturating_add(i64::try_from(op.duration_ns).unwrap_or(i64::MAX))
}

/// Attributes every GPU activity of `raw` to the operator that launched it.
fn attribute(raw: &RawFile, path: &Path, names: &[String]) -> OperatorFile {
    let mut by_thread: HashMap<u64, Vec<&RawOperator>> = HashMap::new();
    for op in &raw.operators {
        by_thread.entry(op.thread).or_default().push(op);
    }
    let nestings: HashMap<u64, Nesting> =
        by_thread.into_iter().map(|(t, ops)| (t, Nesting::new(ops))).collect();
    let calls: HashMap<u64, (u64, i64)> =
        raw.calls.iter().filter_map(|c| c.correlation.map(|id| (id, (c.thread, c.ts_ns)))).collect();

    // (thread, position in its nesting) -> activities, in launch order.
    let mut launched: HashMap<(u64, usize), Vec<(i64, Activity)>> = HashMap::new();
    let mut unattributed = 0;
    let mut kernel_ns = 0;
    for gpu in &raw.gpu {
        let name = names.get(gpu.name as usize).map_or("", String::as_str);
        let kind = match gpu.category {
            GpuCategory::Kernel if nccl::is_nccl_kernel(name) => ActivityKind::Nccl,
            GpuCategory::Kernel => ActivityKind::Kernel,
            GpuCategory::Memset => ActivityKind::Memset,
            GpuCategory::Memcpy => ActivityKind::Memcpy,
        };
        if kind == ActivityKind::Kernel {
            kernel_ns += gpu.duration_ns;
        }
        let owner = gpu.correlation.and_then(|c| calls.get(&c)).and_then(|&(thread, ts)| {
            nestings.get(&thread).and_then(|n| n.innermost(ts)).map(|position| ((thread, position), ts))
        });
        match owner {
            Some((key, ts)) => launched
                .entry(key)
                .or_default()
                .push((ts, Activity { name: gpu.name, kind, duration_ns: gpu.duration_ns })),
            None => unattributed += 1,
        }
    }

    let mut operators: Vec<(i64, ProfiledOperator)> = launched
        .into_iter()
        .map(|((thread, position), mut activities)| {
            activities.sort_by_key(|(ts, _)| *ts);
            let op = nestings[&thread].operators[position];
            (
                op.ts_ns,
                ProfiledOperator {
                    name: op.name,
                    dims: op.dims.clone(),
                    types: op.types.clone(),
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
}
