//! From a measured [`Trace`] to an execution graph that replays it, and from the simulated
//! timeline back to a comparison with the measurement.
//!
//! # The rules (docs/traces.md explains each with its reasons)
//!
//! **GPU ops.** Every kernel, memset and device-to-device copy becomes a compute op of its
//! measured duration on its stream; host<->device copies become `Memcpy` ops that the network
//! model times over the host link; an NCCL kernel becomes this rank's member op of a
//! collective. Ops on a stream keep their measured order.
//!
//! **Host threads.** Each host thread that launched GPU work is a chain of compute ops on a
//! stream of its own: the measured time between consecutive calls that matter is replayed as
//! is (the CPU does not get faster or slower in a replay). A GPU op may start once its launch
//! call has been reached: at the call's end, or at the op's measured start if that was
//! earlier. A kernel whose launch is not in the trace is anchored at its measured start.
//!
//! **Synchronization.** A `cudaDeviceSynchronize` waits for the last op launched before it on
//! every stream; a `cudaStreamSynchronize` or `cudaEventSynchronize` (whose stream or event
//! Kineto does not record) waits for the op launched before it that ended last before it
//! returned; a blocking copy (`cudaMemcpy`, or `cudaMemcpyAsync` that returned after its copy
//! ended) waits for its copy. The host then continues after the measured time the call took
//! once its wait was over.
//!
//! **Cross-stream waits.** Where Kineto recorded them (`cuda_sync` events), exactly. Otherwise
//! a `cudaStreamWaitEvent` makes the next GPU op its thread launches wait for, on every other
//! stream, the last op launched before the wait call, if that op ended no later than the
//! waiting op started (plus 1 us of timestamp rounding): an event can only have been recorded
//! behind work launched before the wait, and a wait that held the op back implies that order.
//!
//! **Collectives.** The k-th collective of a kind on a process group on one rank is the same
//! collective as the k-th of that kind on that group on every other member. Its size is the
//! largest any member reports. A collective whose size the trace does not record is replayed
//! as a rendezvous followed by the measured kernel duration. Point-to-point kernels (peer not
//! recorded) and kernels of unknown operation replay at their measured duration.
//!
//! **Ranks not traced, and re-targeting.** Simulated rank `m` replays traced rank `m mod N`
//! (or, when that rank was not traced, a traced rank chosen round-robin). The whole world stays
//! the whole world; a group of aligned consecutive ranks (e.g. a server's tensor-parallel
//! group) keeps its size and tiles the new world; a strided group (the data-parallel replicas
//! of a model-parallel layout) grows to `M / stride` members. Message sizes are the full
//! buffers of [`sim_core::graph::CollectiveKind`] and do not change: an allreduce moves the
//! same gradients, an all-to-all's per-peer share shrinks as `N / M`, an allgather's shard
//! shrinks as `N / M`. Compute is per rank and does not change (weak scaling).

use sim_core::lookup::LookupMap;
use std::collections::BTreeMap;

use serde::Serialize;
use sim_core::exec::Timeline;
use sim_core::graph::{
    Collective, CollectiveAlgorithm, CollectiveId, CollectiveKind, ExecGraph, GraphBuilder, GraphError,
    GroupId, LabelId, MemcpyDirection, Op, OpId, OpKind, OpMeta, RankId, StreamId,
};
use sim_core::units::{Bytes, SimDuration, SimTime};

use crate::error::TraceError;
use crate::kineto::is_matched;
use crate::model::{CallKind, CollectiveType, CopyDirection, GpuOpKind, RankTrace, SyncScope, Trace};
use crate::warnings::Warnings;

/// The most ranks a replay simulates (each is a copy of a traced rank's whole graph).
pub const MAX_RANKS: u32 = 1 << 20;

/// Timestamp rounding allowed when deciding whether one op ended before another started.
const TOLERANCE_NS: u64 = 1_000;
/// The longest a launch call is assumed to take by itself; a GPU op may start this long after
/// its launch call began even if the call lasted longer.
const LAUNCH_CAP_NS: u64 = 20_000;
/// A launch call longer than this waited for the GPU (a full launch queue).
const LONG_CALL_NS: u64 = 100_000;

/// How to build the replay.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Ranks to simulate; `None` replays the traced world size.
    pub ranks: Option<u32>,
}

/// A marked iteration of one simulated rank. It is complete at the later of the end of its
/// host-side `ProfilerStep#N` annotation and the end of the last GPU op launched during it
/// (the annotation alone misses GPU work still queued when it closes); its time is the time
/// from the previous iteration's completion (or, for the first, from its own begin) to its
/// completion, so that in steady state it is the period of the training loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepMarkers {
    /// The simulated rank.
    pub rank: u32,
    /// `N` of `ProfilerStep#N`.
    pub number: u64,
    /// The op that ends when the step begins.
    pub begin: OpId,
    /// The op that ends when the step's annotation ends.
    pub end: OpId,
    /// The GPU ops launched during the step.
    pub gpu_ops: Vec<OpId>,
    /// Measured begin (ns after the traced rank's origin) on the traced rank this rank replays.
    pub measured_begin_ns: u64,
    /// Measured completion (ns after the traced rank's origin), by the definition above.
    pub measured_completion_ns: u64,
    /// True if this simulated rank is itself a traced rank (not a copy).
    pub traced: bool,
}

/// One rank's NCCL kernel in the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveOp {
    /// The simulated rank.
    pub rank: u32,
    /// What it was.
    pub kind: CollectiveType,
    /// Its first op (the collective member op, or the measured-duration compute op).
    pub first: OpId,
    /// Its last op (the same, or the measured part after a size-less rendezvous).
    pub last: OpId,
    /// Measured kernel duration (ns).
    pub measured_ns: u64,
    /// True if the size was known and the network model timed it.
    pub simulated: bool,
    /// True if this simulated rank is itself a traced rank.
    pub traced: bool,
}

/// Sizes of the replay graph.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReplayCounts {
    /// Ops from GPU activity (kernels, copies, memsets, collectives).
    pub gpu_ops: usize,
    /// Ops from host threads (launch gaps, synchronizations, step markers, anchors).
    pub host_ops: usize,
    /// Collective instances the network model times.
    pub collectives: usize,
    /// Dependencies from synchronizations and cross-stream waits.
    pub sync_dependencies: usize,
}

/// A trace turned into an execution graph, with what is needed to compare a run of it with
/// the measurement.
#[derive(Debug, Clone)]
pub struct Replay {
    /// The execution graph.
    pub graph: ExecGraph,
    /// For each simulated rank, the traced rank it replays.
    pub source: Vec<u32>,
    /// Ranks in the traced job.
    pub traced_world: u32,
    /// Iteration markers of every simulated rank.
    pub steps: Vec<StepMarkers>,
    /// Every rank's NCCL kernels.
    pub collectives: Vec<CollectiveOp>,
    /// Graph sizes.
    pub counts: ReplayCounts,
    /// What the rules assumed or skipped.
    pub warnings: Warnings,
    /// Track names per traced rank position (as in `Trace::ranks`), indexed by stream.
    stream_names: Vec<Vec<String>>,
    /// For each simulated rank, its source's position in `Trace::ranks`.
    source_position: Vec<usize>,
}

/// How a process group maps onto a world of another size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupPattern {
    /// `size` consecutive ranks starting at a multiple of `size`.
    Blocks { size: u32 },
    /// Every `stride`-th rank, starting below `stride`, covering the world.
    Strided { stride: u32 },
    /// Anything else.
    Irregular,
}

fn pattern(group: &[u32], world: u32) -> GroupPattern {
    let Some(&first) = group.first() else { return GroupPattern::Irregular };
    let size = group.len() as u32;
    let consecutive = group.iter().enumerate().all(|(i, &r)| u64::from(r) == u64::from(first) + i as u64);
    if consecutive && first % size == 0 && world % size == 0 {
        return GroupPattern::Blocks { size };
    }
    if size >= 2 {
        let stride = group[1].saturating_sub(first);
        let progression = stride > 0
            && group
                .iter()
                .enumerate()
                .all(|(i, &r)| u64::from(r) == u64::from(first) + u64::from(stride) * i as u64);
        if progression && first < stride && stride.checked_mul(size) == Some(world) {
            return GroupPattern::Strided { stride };
        }
    }
    GroupPattern::Irregular
}

/// The members of the group that simulated rank `rank` (of `world`) uses where the traced
/// ranks used `group` (of `traced_world`).
fn map_group(group: &[u32], traced_world: u32, rank: u32, world: u32) -> Result<Vec<u32>, TraceError> {
    if world == traced_world && group.contains(&rank) {
        return Ok(group.to_vec());
    }
    let error = |reason: String| TraceError::Retarget { ranks: world, reason };
    match pattern(group, traced_world) {
        GroupPattern::Blocks { size } => {
            if world % size != 0 {
                return Err(error(format!(
                    "process group {group:?} is a block of {size} consecutive ranks, and {world} is not a multiple of {size}"
                )));
            }
            let start = rank - rank % size;
            Ok((start..start + size).collect())
        }
        GroupPattern::Strided { stride } => {
            if world % stride != 0 {
                return Err(error(format!(
                    "process group {group:?} takes every {stride}th rank, and {world} is not a multiple of {stride}"
                )));
            }
            Ok((0..world / stride).map(|i| rank % stride + i * stride).collect())
        }
        GroupPattern::Irregular => Err(error(format!(
            "process group {group:?} is neither a block of consecutive ranks nor a strided set, so the group of rank {rank} cannot be inferred"
        ))),
    }
}

/// What a template op does.
#[derive(Debug, Clone, Copy)]
enum TemplateKind {
    Compute(SimDuration),
    Memcpy(MemcpyDirection, Bytes),
    /// Member of the `index`-th collective call of the template.
    Collective(usize),
}

#[derive(Debug, Clone)]
struct TemplateOp {
    stream: StreamId,
    label: LabelId,
    kind: TemplateKind,
    /// Range in `Template::deps`.
    deps: (u32, u32),
}

/// A collective call of a template, in measured start order.
#[derive(Debug, Clone)]
struct TemplateCollective {
    kind: CollectiveType,
    bytes: Option<u64>,
    group: Option<u32>,
    algorithm: Option<String>,
    /// Local index of the member op.
    op: u32,
}

/// The graph of one traced rank, in rank-local op indexes, instantiated once per simulated
/// rank that replays it.
#[derive(Debug, Clone, Default)]
struct Template {
    ops: Vec<TemplateOp>,
    deps: Vec<u32>,
    collectives: Vec<TemplateCollective>,
    /// (local first op, local last op, kind, measured ns, simulated) per NCCL kernel.
    nccl: Vec<(u32, u32, CollectiveType, u64, bool)>,
    /// (number, local begin op, local end op, measured begin and completion ns, local GPU ops
    /// launched during it).
    steps: Vec<(u64, u32, u32, u64, u64, Vec<u32>)>,
    stream_names: Vec<String>,
    counts: ReplayCounts,
}

/// Builds a template op by op; ops are pushed per stream in stream order.
struct TemplateBuilder<'b> {
    template: Template,
    builder: &'b mut GraphBuilder,
    /// Deps of each op, collected before flattening.
    pending_deps: Vec<Vec<u32>>,
}

impl TemplateBuilder<'_> {
    fn push(&mut self, stream: StreamId, label: &str, kind: TemplateKind, deps: Vec<u32>) -> u32 {
        let label = self.builder.label(label);
        let id = self.template.ops.len() as u32;
        self.template.ops.push(TemplateOp { stream, label, kind, deps: (0, 0) });
        self.pending_deps.push(deps);
        id
    }

    fn finish(mut self) -> Template {
        for (op, mut deps) in self.template.ops.iter_mut().zip(self.pending_deps) {
            deps.sort_unstable();
            deps.dedup();
            let start = self.template.deps.len() as u32;
            self.template.deps.extend(deps);
            op.deps = (start, self.template.deps.len() as u32);
        }
        self.template
    }
}

fn nanos(ns: u64) -> SimDuration {
    SimDuration::from_ns(ns)
}

/// Short display name of a kernel: the part before the argument list, without `void `.
fn short_name(name: &str) -> &str {
    let name = name.strip_prefix("void ").unwrap_or(name);
    match name.find('(') {
        Some(at) if at > 0 => &name[..at],
        _ => name,
    }
}

/// Builds the template of one traced rank. `offset_ns` shifts its clock onto the job's.
fn build_template(
    trace: &Trace,
    rank: &RankTrace,
    offset_ns: u64,
    builder: &mut GraphBuilder,
    warnings: &mut Warnings,
) -> Template {
    let streams = rank.streams.len();
    let threads = rank.threads.len();
    let host_stream = |thread: u32| StreamId((streams + thread as usize) as u16);
    let anchor_stream = StreamId((streams + threads) as u16);
    let mut t = TemplateBuilder { template: Template::default(), builder, pending_deps: Vec::new() };
    for stream in &rank.streams {
        t.template.stream_names.push(format!("GPU {} stream {}", stream.device, stream.stream));
    }
    for thread in &rank.threads {
        t.template.stream_names.push(format!("host thread {thread}"));
    }
    t.template.stream_names.push("launches not in the trace".into());

    let ops = &rank.gpu_ops;
    let at = |ns: u64| ns.saturating_add(offset_ns);
    // Launch time of every GPU op: its call's start, or its own start if not recorded.
    let launch_time: Vec<u64> =
        ops.iter().map(|op| op.launch.map_or(op.start_ns, |c| rank.calls[c as usize].start_ns)).collect();
    let mut launched_by: LookupMap<u32, usize> = LookupMap::new();
    for (index, op) in ops.iter().enumerate() {
        if let Some(call) = op.launch {
            launched_by.insert(call, index);
        }
    }
    // Per stream, (launch time, op) sorted by launch time.
    let mut by_launch: Vec<Vec<(u64, usize)>> = vec![Vec::new(); streams];
    for (index, op) in ops.iter().enumerate() {
        by_launch[op.stream as usize].push((launch_time[index], index));
    }
    for list in &mut by_launch {
        list.sort_unstable();
    }
    let last_launched_before = |stream: usize, time: u64| -> Option<usize> {
        let list = &by_launch[stream];
        let end = list.partition_point(|&(launch, _)| launch < time);
        end.checked_sub(1).map(|i| list[i].1)
    };

    // Local op ids: GPU ops first (one or two each), in (stream, start) order.
    let mut first_local = vec![0u32; ops.len()];
    let mut last_local = vec![0u32; ops.len()];
    let mut next = 0u32;
    for (index, op) in ops.iter().enumerate() {
        first_local[index] = next;
        let two =
            matches!(&op.kind, GpuOpKind::Collective(call) if is_matched(call.kind) && call.bytes.is_none());
        next += if two { 2 } else { 1 };
        last_local[index] = next - 1;
    }
    let gpu_local_count = next;

    // Host chains. Local ids continue after the GPU ops; collect GPU deps on host ops here.
    let mut gpu_deps: Vec<Vec<u32>> = vec![Vec::new(); ops.len()];
    let mut host_ops: Vec<(StreamId, String, SimDuration, Vec<u32>)> = Vec::new();
    let mut step_markers: Vec<(usize, u32, u32)> = Vec::new();
    let host_id =
        |host_ops: &Vec<(StreamId, String, SimDuration, Vec<u32>)>| gpu_local_count + host_ops.len() as u32;
    // Stream-wait attribution: (op that waits) -> ops it waits for.
    let mut sync_dependencies = 0usize;
    let call_ranges = {
        let mut ranges = vec![(0usize, 0usize); threads];
        let mut start = 0;
        while start < rank.calls.len() {
            let thread = rank.calls[start].thread as usize;
            let mut end = start;
            while end < rank.calls.len() && rank.calls[end].thread as usize == thread {
                end += 1;
            }
            ranges[thread] = (start, end);
            start = end;
        }
        ranges
    };
    for thread in 0..threads as u32 {
        let stream = host_stream(thread);
        #[derive(Clone, Copy)]
        enum Point {
            StepEnd(usize),
            StepBegin(usize),
            Call(usize),
        }
        let (from, to) = call_ranges[thread as usize];
        let mut points: Vec<(u64, u8, Point)> =
            (from..to).map(|c| (rank.calls[c].start_ns, 2, Point::Call(c))).collect();
        for (index, step) in rank.steps.iter().enumerate() {
            if step.thread == thread {
                points.push((step.start_ns, 1, Point::StepBegin(index)));
                points.push((step.start_ns.saturating_add(step.duration_ns), 0, Point::StepEnd(index)));
            }
        }
        points.sort_by_key(|&(time, order, _)| (time, order));
        let mut cursor = 0u64;
        let mut step_begin: LookupMap<usize, u32> = LookupMap::new();
        for (_, _, point) in points {
            match point {
                Point::StepBegin(index) | Point::StepEnd(index) => {
                    let step = &rank.steps[index];
                    let is_begin = matches!(point, Point::StepBegin(_));
                    let time = at(if is_begin {
                        step.start_ns
                    } else {
                        step.start_ns.saturating_add(step.duration_ns)
                    });
                    let id = host_id(&host_ops);
                    let label =
                        format!("ProfilerStep#{} {}", step.number, if is_begin { "begins" } else { "ends" });
                    host_ops.push((stream, label, nanos(time.saturating_sub(cursor)), Vec::new()));
                    cursor = cursor.max(time);
                    if is_begin {
                        step_begin.insert(index, id);
                    } else if let Some(&begin) = step_begin.get(&index) {
                        step_markers.push((index, begin, id));
                    }
                }
                Point::Call(index) => {
                    let call = &rank.calls[index];
                    let name = trace.name(call.name);
                    let (start, end) = (at(call.start_ns), at(call.end_ns()));
                    match call.kind {
                        CallKind::Launch => {
                            let Some(&gpu) = launched_by.get(&(index as u32)) else { continue };
                            let op = &ops[gpu];
                            // The GPU may start the op when the call has done its own work: at
                            // the call's end or the op's measured start, whichever came first,
                            // but no later than a normal launch takes (the rest of a long call
                            // is waiting for the GPU, handled below).
                            let ready = end
                                .min(at(op.start_ns))
                                .min(start.saturating_add(LAUNCH_CAP_NS))
                                .max(start)
                                .max(cursor);
                            let id = host_id(&host_ops);
                            host_ops.push((
                                stream,
                                format!("host until {name}"),
                                nanos(ready - cursor),
                                Vec::new(),
                            ));
                            cursor = ready;
                            gpu_deps[gpu].push(id);
                            // A call that returned only after its own op ended (a blocking
                            // copy, or a kernel too short to outlive its launch) waited for it;
                            // a call much longer than a launch waited for earlier work (a full
                            // launch queue): for the op that ended last before it returned.
                            let waited = if at(op.end_ns()) <= end.saturating_add(TOLERANCE_NS) {
                                Some(gpu)
                            } else if call.duration_ns > LONG_CALL_NS {
                                (0..streams)
                                    .filter_map(|s| last_launched_before(s, call.start_ns))
                                    .filter(|&g| {
                                        ops[g].end_ns() <= call.end_ns().saturating_add(TOLERANCE_NS)
                                    })
                                    .max_by_key(|&g| (ops[g].end_ns(), g))
                            } else {
                                None
                            };
                            if let Some(waited) = waited {
                                let after = ready.max(at(ops[waited].end_ns()));
                                host_ops.push((
                                    stream,
                                    format!("{name} waits"),
                                    nanos(end.saturating_sub(after)),
                                    vec![last_local[waited]],
                                ));
                                sync_dependencies += 1;
                                cursor = cursor.max(end);
                            }
                        }
                        CallKind::Synchronize(scope) => {
                            let mut candidates: Vec<usize> = (0..streams)
                                .filter_map(|s| last_launched_before(s, call.start_ns))
                                .filter(|&g| ops[g].end_ns() <= call.end_ns().saturating_add(TOLERANCE_NS))
                                .collect();
                            if scope != SyncScope::Device {
                                candidates.sort_by_key(|&g| ops[g].end_ns());
                                candidates = candidates.pop().into_iter().collect();
                            }
                            if candidates.is_empty() {
                                host_ops.push((
                                    stream,
                                    name.to_string(),
                                    nanos(end.saturating_sub(cursor)),
                                    Vec::new(),
                                ));
                            } else {
                                if start > cursor {
                                    host_ops.push((stream, "host".into(), nanos(start - cursor), Vec::new()));
                                }
                                let waited =
                                    candidates.iter().map(|&g| at(ops[g].end_ns())).max().unwrap_or(start);
                                let deps: Vec<u32> = candidates.iter().map(|&g| last_local[g]).collect();
                                sync_dependencies += deps.len();
                                host_ops.push((
                                    stream,
                                    name.to_string(),
                                    nanos(end.saturating_sub(waited.max(start))),
                                    deps,
                                ));
                            }
                            cursor = cursor.max(end);
                        }
                        CallKind::StreamWaitEvent => {
                            // The next GPU op this thread launches waits.
                            let Some(gpu) = (index + 1..to)
                                .filter(|&c| rank.calls[c].kind == CallKind::Launch)
                                .find_map(|c| launched_by.get(&(c as u32)).copied())
                            else {
                                continue;
                            };
                            let waiting = &ops[gpu];
                            for stream in (0..streams).filter(|&s| s != waiting.stream as usize) {
                                if let Some(before) = last_launched_before(stream, call.start_ns)
                                    && ops[before].end_ns() <= waiting.start_ns.saturating_add(TOLERANCE_NS)
                                {
                                    gpu_deps[gpu].push(last_local[before]);
                                    sync_dependencies += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    // GPU ops whose launch is not in the trace: anchored at their measured start, in start
    // order, on one more host stream.
    let mut unlaunched: Vec<usize> = (0..ops.len()).filter(|&g| ops[g].launch.is_none()).collect();
    unlaunched.sort_by_key(|&g| (ops[g].start_ns, g));
    let mut cursor = 0u64;
    for gpu in unlaunched {
        let time = at(ops[gpu].start_ns);
        let id = host_id(&host_ops);
        host_ops.push((
            anchor_stream,
            "launch not in the trace".into(),
            nanos(time.saturating_sub(cursor)),
            Vec::new(),
        ));
        cursor = cursor.max(time);
        gpu_deps[gpu].push(id);
    }
    for wait in &rank.stream_waits {
        gpu_deps[wait.op as usize].push(last_local[wait.after as usize]);
        sync_dependencies += 1;
    }

    // GPU ops.
    for (index, op) in ops.iter().enumerate() {
        let stream = StreamId(op.stream as u16);
        let name = short_name(trace.name(op.name));
        let deps = std::mem::take(&mut gpu_deps[index]);
        let measured = nanos(op.duration_ns);
        match &op.kind {
            GpuOpKind::Kernel | GpuOpKind::Memset { .. } => {
                t.push(stream, name, TemplateKind::Compute(measured), deps);
            }
            GpuOpKind::Memcpy { direction, bytes } => {
                let direction = match direction {
                    CopyDirection::HostToDevice => Some(MemcpyDirection::HostToDevice),
                    CopyDirection::DeviceToHost => Some(MemcpyDirection::DeviceToHost),
                    CopyDirection::DeviceToDevice | CopyDirection::Other => None,
                };
                match direction {
                    Some(direction) if *bytes > 0 => {
                        t.push(stream, name, TemplateKind::Memcpy(direction, Bytes(*bytes)), deps);
                    }
                    _ => {
                        t.push(stream, name, TemplateKind::Compute(measured), deps);
                    }
                }
            }
            GpuOpKind::Collective(call) if is_matched(call.kind) => {
                let position = t.template.collectives.len();
                let label = match call.bytes {
                    Some(bytes) => format!("{} {} ({name})", call.kind.name(), Bytes(bytes)),
                    None => format!("{} of unknown size ({name})", call.kind.name()),
                };
                let first = t.push(stream, &label, TemplateKind::Collective(position), deps);
                t.template.collectives.push(TemplateCollective {
                    kind: call.kind,
                    bytes: call.bytes,
                    group: call.group,
                    algorithm: call.algorithm.clone(),
                    op: first,
                });
                let last = if call.bytes.is_none() {
                    t.push(
                        stream,
                        &format!("{} at measured duration", call.kind.name()),
                        TemplateKind::Compute(measured),
                        vec![],
                    )
                } else {
                    first
                };
                t.template.nccl.push((first, last, call.kind, op.duration_ns, call.bytes.is_some()));
            }
            GpuOpKind::Collective(call) => {
                let id = t.push(
                    stream,
                    &format!("{} ({name})", call.kind.name()),
                    TemplateKind::Compute(measured),
                    deps,
                );
                t.template.nccl.push((id, id, call.kind, op.duration_ns, false));
            }
        }
    }
    debug_assert_eq!(t.template.ops.len() as u32, gpu_local_count);
    let host_count = host_ops.len();
    for (stream, label, duration, deps) in host_ops {
        t.push(stream, &label, TemplateKind::Compute(duration), deps);
    }
    t.template.steps = step_markers
        .into_iter()
        .map(|(index, begin, end)| {
            let step = &rank.steps[index];
            let (from, to) = (step.start_ns, step.start_ns.saturating_add(step.duration_ns));
            let launched: Vec<usize> =
                (0..ops.len()).filter(|&g| (from..to).contains(&launch_time[g])).collect();
            let gpu_end = launched.iter().map(|&g| ops[g].end_ns()).max().unwrap_or(to);
            (
                step.number,
                begin,
                end,
                from,
                gpu_end.max(to),
                launched.iter().map(|&g| last_local[g]).collect(),
            )
        })
        .collect();
    // Measured start order of collectives decides which is the k-th.
    let mut template = t.finish();
    let start_of_local: LookupMap<u32, u64> =
        ops.iter().enumerate().map(|(index, op)| (first_local[index], op.start_ns)).collect();
    template.collectives.sort_by_key(|c| (start_of_local.get(&c.op).copied().unwrap_or(0), c.op));
    // Re-point ops at their collective's new position.
    let position_of: LookupMap<u32, usize> =
        template.collectives.iter().enumerate().map(|(position, c)| (c.op, position)).collect();
    for (local, op) in template.ops.iter_mut().enumerate() {
        if let TemplateKind::Collective(_) = op.kind
            && let Some(&position) = position_of.get(&(local as u32))
        {
            op.kind = TemplateKind::Collective(position);
        }
    }
    template.counts = ReplayCounts {
        gpu_ops: gpu_local_count as usize,
        host_ops: host_count,
        collectives: 0,
        sync_dependencies,
    };
    if rank.steps.is_empty() {
        warnings.add("ranks without ProfilerStep#N annotations (no iteration times to compare)");
    }
    template
}

/// The concrete algorithm to ask for, from NCCL's name for the one it used. A job re-targeted
/// to another size gets `Auto`: NCCL's tuner chooses again at the new size (a ring traced on 8
/// GPUs is not what NCCL runs on 64 servers).
fn algorithm(kind: CollectiveKind, nccl: Option<&str>, retargeted: bool) -> CollectiveAlgorithm {
    match (nccl, kind) {
        (
            Some("RING"),
            CollectiveKind::AllReduce | CollectiveKind::ReduceScatter | CollectiveKind::AllGather,
        ) if !retargeted => CollectiveAlgorithm::Ring,
        _ => CollectiveAlgorithm::Auto,
    }
}

fn collective_kind(kind: CollectiveType) -> Option<CollectiveKind> {
    Some(match kind {
        CollectiveType::AllReduce | CollectiveType::Barrier => CollectiveKind::AllReduce,
        CollectiveType::ReduceScatter => CollectiveKind::ReduceScatter,
        CollectiveType::AllGather => CollectiveKind::AllGather,
        CollectiveType::AllToAll => CollectiveKind::AllToAll,
        CollectiveType::Broadcast => CollectiveKind::Broadcast { root: 0 },
        CollectiveType::Reduce => CollectiveKind::Reduce { root: 0 },
        CollectiveType::Send | CollectiveType::Recv | CollectiveType::Unknown => return None,
    })
}

/// Builds the replay graph of `trace`.
pub fn build(trace: &Trace, options: &ReplayOptions) -> Result<Replay, TraceError> {
    let traced_world = trace.world_size;
    let world = options.ranks.unwrap_or(traced_world);
    if world == 0 || world > MAX_RANKS {
        return Err(TraceError::Retarget {
            ranks: world,
            reason: format!("a replay simulates between 1 and {MAX_RANKS} ranks"),
        });
    }
    let mut warnings = Warnings::new();
    let position_of_rank: BTreeMap<u32, usize> =
        trace.ranks.iter().enumerate().map(|(position, r)| (r.rank, position)).collect();
    // Which traced rank each simulated rank replays.
    let source_position: Vec<usize> = (0..world)
        .map(|m| {
            let base = m % traced_world;
            position_of_rank.get(&base).copied().unwrap_or(base as usize % trace.ranks.len())
        })
        .collect();
    let copies = (0..world).filter(|&m| trace.ranks[source_position[m as usize]].rank != m).count();
    if options.ranks.is_none() {
        warnings.add_many(
            "ranks of the job not in the trace, replayed as copies of a traced rank (SPMD assumption)",
            copies as u64,
        );
    }

    // Align rank clocks on the earliest one.
    let earliest = trace.ranks.iter().map(|r| r.origin_ns).min().unwrap_or(0);
    let mut builder = GraphBuilder::new(world);
    let mut templates = Vec::with_capacity(trace.ranks.len());
    for rank in &trace.ranks {
        let offset = u64::try_from(rank.origin_ns.saturating_sub(earliest)).unwrap_or(0);
        if offset > 1_000_000_000 {
            warnings.add(
                "ranks whose clock starts more than 1 s after the earliest rank's (clocks not synchronized?)",
            );
        }
        templates.push(build_template(trace, rank, offset, &mut builder, &mut warnings));
    }

    // Groups of every simulated rank, and the collective instances.
    let mut group_ids: BTreeMap<Vec<u32>, GroupId> = BTreeMap::new();
    let everyone: Vec<u32> = (0..world).collect();
    let mut group_of = |members: Vec<u32>, builder: &mut GraphBuilder| -> GroupId {
        *group_ids
            .entry(members)
            .or_insert_with_key(|members| builder.add_group(members.iter().copied().map(RankId).collect()))
    };
    // (group, kind) -> per rank, the template collective positions in order.
    let mut sequences: BTreeMap<(GroupId, CollectiveType), BTreeMap<u32, Vec<usize>>> = BTreeMap::new();
    let mut member_groups: LookupMap<(usize, Option<u32>), GroupId> = LookupMap::new();
    for m in 0..world {
        let position = source_position[m as usize];
        for (index, call) in templates[position].collectives.iter().enumerate() {
            let group = match member_groups.get(&(m as usize, call.group)) {
                Some(&group) => group,
                None => {
                    let members = match call.group {
                        None => everyone.clone(),
                        Some(g) => map_group(&trace.groups[g as usize], traced_world, m, world)?,
                    };
                    let group = group_of(members, &mut builder);
                    member_groups.insert((m as usize, call.group), group);
                    group
                }
            };
            sequences.entry((group, call.kind)).or_default().entry(m).or_default().push(index);
        }
    }
    let group_members: BTreeMap<GroupId, Vec<u32>> =
        group_ids.iter().map(|(members, &id)| (id, members.clone())).collect();
    // (rank, template collective index) -> collective id.
    let mut instance_of: LookupMap<(u32, usize), CollectiveId> = LookupMap::new();
    let mut collectives = 0usize;
    let mut uneven = 0u64;
    for ((group, kind), per_rank) in &sequences {
        let members = &group_members[group];
        let count_of = |rank: u32| per_rank.get(&rank).map_or(0, Vec::len);
        let first = members[0];
        if let Some(&other) = members.iter().find(|&&m| count_of(m) != count_of(first)) {
            let describe = |m: u32| {
                let source = &trace.ranks[source_position[m as usize]];
                if source.rank == m {
                    format!("rank {m} ({})", source.source)
                } else {
                    format!("rank {m} (a copy of rank {})", source.rank)
                }
            };
            return Err(TraceError::Unmatched {
                reason: format!(
                    "{} on group {:?}: {} has {}, {} has {}",
                    kind.name(),
                    abbreviate(members),
                    describe(first),
                    count_of(first),
                    describe(other),
                    count_of(other)
                ),
            });
        }
        let Some(sim_kind) = collective_kind(*kind) else { continue };
        // The k-th call of every member is one instance.
        #[allow(clippy::needless_range_loop)]
        for k in 0..count_of(first) {
            let calls: Vec<(u32, &TemplateCollective)> = members
                .iter()
                .map(|&m| (m, &templates[source_position[m as usize]].collectives[per_rank[&m][k]]))
                .collect();
            let bytes = calls.iter().filter_map(|(_, c)| c.bytes).max().unwrap_or(0);
            if calls.iter().any(|(_, c)| c.bytes.is_some_and(|b| b != bytes)) {
                uneven += 1;
            }
            let id = builder.add_collective(Collective {
                kind: sim_kind,
                group: *group,
                bytes: Bytes(bytes),
                algorithm: algorithm(sim_kind, calls[0].1.algorithm.as_deref(), world != traced_world),
            });
            collectives += 1;
            for &(m, _) in &calls {
                instance_of.insert((m, per_rank[&m][k]), id);
            }
        }
    }
    warnings.add_many(
        "collectives whose members report different sizes (all-to-allv or uneven): the largest is simulated",
        uneven,
    );

    // Instantiate every rank.
    let mut steps = Vec::new();
    let mut nccl_ops = Vec::new();
    let mut counts = ReplayCounts { collectives, ..ReplayCounts::default() };
    let mut deps: Vec<OpId> = Vec::new();
    for m in 0..world {
        let position = source_position[m as usize];
        let template = &templates[position];
        let traced = trace.ranks[position].rank == m;
        let base = builder.op_count() as u32;
        for (local, op) in template.ops.iter().enumerate() {
            deps.clear();
            deps.extend(
                template.deps[op.deps.0 as usize..op.deps.1 as usize].iter().map(|&d| OpId(base + d)),
            );
            let kind = match op.kind {
                TemplateKind::Compute(duration) => OpKind::Compute { duration },
                TemplateKind::Memcpy(direction, bytes) => OpKind::Memcpy { direction, bytes },
                TemplateKind::Collective(index) => match instance_of.get(&(m, index)) {
                    Some(&id) => OpKind::Collective(id),
                    None => {
                        return Err(TraceError::OutOfRange {
                            what: format!("rank {m}, op {local}"),
                            message: "collective member without an instance".into(),
                        });
                    }
                },
            };
            builder.add_op(
                Op { kind, rank: RankId(m), stream: op.stream, label: op.label, meta: OpMeta::NONE },
                &deps,
            );
        }
        for (number, begin, end, measured_begin_ns, measured_completion_ns, gpu_ops) in &template.steps {
            steps.push(StepMarkers {
                rank: m,
                number: *number,
                begin: OpId(base + begin),
                end: OpId(base + end),
                gpu_ops: gpu_ops.iter().map(|&op| OpId(base + op)).collect(),
                measured_begin_ns: *measured_begin_ns,
                measured_completion_ns: *measured_completion_ns,
                traced,
            });
        }
        for &(first, last, kind, measured_ns, simulated) in &template.nccl {
            nccl_ops.push(CollectiveOp {
                rank: m,
                kind,
                first: OpId(base + first),
                last: OpId(base + last),
                measured_ns,
                simulated,
                traced,
            });
        }
        counts.gpu_ops += template.counts.gpu_ops;
        counts.host_ops += template.counts.host_ops;
        counts.sync_dependencies += template.counts.sync_dependencies;
    }
    let graph = builder.build().map_err(|error| match error {
        // Every rank's own order is acyclic; a cycle means the k-th-of-a-kind matching pairs
        // collectives that the ranks issued in different orders.
        GraphError::Cycle { cycle } => TraceError::Unmatched {
            reason: format!(
                "the ranks issue collectives in orders that cannot be matched (pairing the k-th of each kind on each \
                 group deadlocks: {cycle}); are the rank files sampled, or from different iterations? \
                 Replay one rank with --rank"
            ),
        },
        other => TraceError::Graph(other),
    })?;
    Ok(Replay {
        graph,
        source: source_position.iter().map(|&p| trace.ranks[p].rank).collect(),
        traced_world,
        steps,
        collectives: nccl_ops,
        counts,
        warnings,
        stream_names: templates.into_iter().map(|t| t.stream_names).collect(),
        source_position,
    })
}

/// "[0, 1, 2, ..., 127]" for long lists.
fn abbreviate(ranks: &[u32]) -> String {
    if ranks.len() <= 8 {
        return format!("{ranks:?}");
    }
    format!("[{}, {}, ..., {}] ({} ranks)", ranks[0], ranks[1], ranks[ranks.len() - 1], ranks.len())
}

/// Measured vs simulated time of one iteration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepComparison {
    /// `N` of `ProfilerStep#N`.
    pub number: u64,
    /// Mean measured duration over the traced ranks (seconds).
    pub measured_s: f64,
    /// Mean simulated duration over all simulated ranks (seconds).
    pub simulated_s: f64,
    /// Slowest traced rank's measured duration (seconds).
    pub measured_max_s: f64,
    /// Slowest simulated rank's duration (seconds).
    pub simulated_max_s: f64,
}

impl StepComparison {
    /// (simulated - measured) / measured, of the means.
    pub fn error(&self) -> f64 {
        relative_error(self.simulated_s, self.measured_s)
    }
}

/// Measured vs simulated time in one kind of NCCL operation, per rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KindComparison {
    /// The kind.
    pub kind: &'static str,
    /// Kernels per rank (mean over traced ranks).
    pub count_per_rank: f64,
    /// Measured kernel time per rank (mean over traced ranks, seconds), waiting for peers
    /// included, as the profiler records it.
    pub measured_s: f64,
    /// Simulated time per rank (mean over simulated ranks, seconds), from the op's start to
    /// its end, waiting for peers included.
    pub simulated_s: f64,
    /// How many of these the network model timed (the others replay their measurement).
    pub simulated_count_per_rank: f64,
}

impl KindComparison {
    /// (simulated - measured) / measured.
    pub fn error(&self) -> f64 {
        relative_error(self.simulated_s, self.measured_s)
    }
}

/// A run of a replay against its measurement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// Every iteration the trace marks.
    pub steps: Vec<StepComparison>,
    /// Mean over the iterations (measured, simulated; seconds).
    pub mean_s: (f64, f64),
    /// Mean over the iterations after the first, which often includes warm-up or a pipeline
    /// filling (measured, simulated; seconds); `None` with fewer than two iterations.
    pub steady_mean_s: Option<(f64, f64)>,
    /// Every NCCL operation kind.
    pub collectives: Vec<KindComparison>,
    /// Simulated time from the start to the end of the last op (seconds).
    pub makespan_s: f64,
}

/// (simulated - measured) / measured; 0 when both are 0, infinite when only measured is.
pub fn relative_error(simulated: f64, measured: f64) -> f64 {
    if measured == 0.0 {
        if simulated == 0.0 { 0.0 } else { f64::INFINITY }
    } else {
        (simulated - measured) / measured
    }
}

impl Replay {
    /// The name of a (rank, stream) track: "GPU 0 stream 7", "host thread 4242", ...
    pub fn stream_name(&self, rank: RankId, stream: StreamId) -> String {
        self.source_position
            .get(rank.0 as usize)
            .and_then(|&position| self.stream_names.get(position))
            .and_then(|names| names.get(usize::from(stream.0)))
            .cloned()
            .unwrap_or_else(|| format!("stream {}", stream.0))
    }

    /// Compares `timeline`, a run of this replay's graph, with the measurement.
    pub fn compare(&self, timeline: &Timeline) -> Comparison {
        let seconds = |ns: u64| ns as f64 * 1e-9;
        let end = |op: OpId| timeline.end.get(op.0 as usize).copied().unwrap_or_default();
        let start = |op: OpId| timeline.start.get(op.0 as usize).copied().unwrap_or_default();
        let mut by_number: BTreeMap<u64, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        // Steps are in begin order per rank; each one's time runs from the previous one's
        // completion.
        let mut previous: Option<(u32, u64, SimTime)> = None;
        for step in &self.steps {
            let completion = step.gpu_ops.iter().map(|&op| end(op)).fold(end(step.end), std::cmp::Ord::max);
            let (measured_from, simulated_from) = match previous {
                Some((rank, measured, simulated)) if rank == step.rank => (measured, simulated),
                _ => (step.measured_begin_ns, end(step.begin)),
            };
            let entry = by_number.entry(step.number).or_default();
            if step.traced {
                entry.0.push(seconds(step.measured_completion_ns.saturating_sub(measured_from)));
            }
            entry.1.push(completion.saturating_since(simulated_from).as_secs_f64());
            previous = Some((step.rank, step.measured_completion_ns, completion));
        }
        let mean = |values: &[f64]| {
            if values.is_empty() { 0.0 } else { values.iter().sum::<f64>() / values.len() as f64 }
        };
        let max = |values: &[f64]| values.iter().copied().fold(0.0, f64::max);
        let steps: Vec<StepComparison> = by_number
            .into_iter()
            .map(|(number, (measured, simulated))| StepComparison {
                number,
                measured_s: mean(&measured),
                simulated_s: mean(&simulated),
                measured_max_s: max(&measured),
                simulated_max_s: max(&simulated),
            })
            .collect();

        let traced_ranks =
            self.source.iter().enumerate().filter(|&(m, &s)| m as u32 == s).count().max(1) as f64;
        let simulated_ranks = self.source.len().max(1) as f64;
        let mut kinds: BTreeMap<CollectiveType, (f64, f64, f64, f64)> = BTreeMap::new();
        for op in &self.collectives {
            let entry = kinds.entry(op.kind).or_default();
            if op.traced {
                entry.0 += 1.0;
                entry.1 += seconds(op.measured_ns);
            }
            entry.2 += end(op.last).saturating_since(start(op.first)).as_secs_f64();
            if op.simulated {
                entry.3 += 1.0;
            }
        }
        let collectives = kinds
            .into_iter()
            .map(|(kind, (count, measured, simulated, timed))| KindComparison {
                kind: kind.name(),
                count_per_rank: count / traced_ranks,
                measured_s: measured / traced_ranks,
                simulated_s: simulated / simulated_ranks,
                simulated_count_per_rank: timed / simulated_ranks,
            })
            .collect();
        let means = |steps: &[StepComparison]| {
            let n = steps.len().max(1) as f64;
            (
                steps.iter().map(|s| s.measured_s).sum::<f64>() / n,
                steps.iter().map(|s| s.simulated_s).sum::<f64>() / n,
            )
        };
        let steady_mean_s = (steps.len() >= 2).then(|| means(&steps[1..]));
        Comparison {
            mean_s: means(&steps),
            steady_mean_s,
            steps,
            collectives,
            makespan_s: timeline.makespan().as_secs_f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_patterns() {
        assert_eq!(pattern(&[8, 9, 10, 11], 16), GroupPattern::Blocks { size: 4 });
        assert_eq!(pattern(&[1, 5, 9, 13], 16), GroupPattern::Strided { stride: 4 });
        assert_eq!(pattern(&[0, 3], 16), GroupPattern::Irregular);
        assert_eq!(map_group(&[8, 9, 10, 11], 16, 9, 16).unwrap(), vec![8, 9, 10, 11]);
        assert_eq!(map_group(&[8, 9, 10, 11], 16, 21, 32).unwrap(), vec![20, 21, 22, 23]);
        assert_eq!(map_group(&[1, 5, 9, 13], 16, 6, 32).unwrap(), vec![2, 6, 10, 14, 18, 22, 26, 30]);
        assert!(map_group(&[8, 9, 10, 11], 16, 3, 18).is_err());
        assert!(map_group(&[0, 3], 16, 5, 16).is_err());
    }

    #[test]
    fn short_kernel_names() {
        assert_eq!(short_name("void at::native::kernel<float>(int, float*)"), "at::native::kernel<float>");
        assert_eq!(short_name("volta_sgemm_128x64_nn"), "volta_sgemm_128x64_nn");
    }
}
