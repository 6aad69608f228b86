//! From raw records to a [`RankTrace`]: streams and threads numbered, every GPU op linked to
//! the runtime call that launched it (by `correlation`), every NCCL kernel linked to its
//! collective's kind, size, dtype and group, iterations and exact stream waits resolved.

use sim_core::lookup::LookupMap;
use std::collections::{BTreeMap, BTreeSet};

use super::raw::{AnnotationKind, CommsArgs, GpuCategory, RawAnnotation, RawFile, RawGpu};
use crate::model::{
    CallKind, CollectiveCall, CollectiveType, CopyDirection, GpuOp, GpuOpKind, RankTrace, RuntimeCall, Step,
    StreamInfo, StreamWait, SyncScope,
};
use crate::nccl;
use crate::warnings::Warnings;

/// Process groups of the whole import, interned (groups that are the whole world are `None`).
#[derive(Debug, Default)]
pub(crate) struct Groups {
    pub(crate) lists: Vec<Vec<u32>>,
    ids: BTreeMap<Vec<u32>, u32>,
}

impl Groups {
    /// The group id of `ranks` in a world of `world` ranks; `None` for the whole world.
    pub(crate) fn intern(&mut self, ranks: &[u32], world: u32) -> Option<u32> {
        if ranks.len() == world as usize && ranks.iter().enumerate().all(|(i, &r)| r == i as u32) {
            return None;
        }
        if let Some(&id) = self.ids.get(ranks) {
            return Some(id);
        }
        let id = self.lists.len() as u32;
        self.lists.push(ranks.to_vec());
        self.ids.insert(ranks.to_vec(), id);
        Some(id)
    }
}

/// What a runtime call name means for replay, if anything beyond launching GPU work.
fn call_role(name: &str) -> Option<CallKind> {
    Some(match name {
        "cudaDeviceSynchronize" | "cuCtxSynchronize" => CallKind::Synchronize(SyncScope::Device),
        "cudaStreamSynchronize" | "cuStreamSynchronize" => CallKind::Synchronize(SyncScope::Stream),
        "cudaEventSynchronize" | "cuEventSynchronize" => CallKind::Synchronize(SyncScope::Event),
        "cudaStreamWaitEvent" | "cuStreamWaitEvent" => CallKind::StreamWaitEvent,
        _ => return None,
    })
}

/// Copy direction from a Kineto memcpy name ("Memcpy HtoD (Pinned -> Device)").
fn copy_direction(name: &str) -> CopyDirection {
    if name.contains("HtoD") {
        CopyDirection::HostToDevice
    } else if name.contains("DtoH") {
        CopyDirection::DeviceToHost
    } else if name.contains("DtoD") || name.contains("PtoP") {
        CopyDirection::DeviceToDevice
    } else {
        CopyDirection::Other
    }
}

/// Host annotations about collectives on one thread, sorted by start, for "which annotation
/// encloses this launch" queries.
struct Enclosing<'a> {
    by_thread: BTreeMap<u64, Vec<&'a RawAnnotation>>,
}

impl<'a> Enclosing<'a> {
    fn new(annotations: &'a [RawAnnotation]) -> Self {
        let mut by_thread: BTreeMap<u64, Vec<&RawAnnotation>> = BTreeMap::new();
        for annotation in annotations {
            if matches!(annotation.kind, AnnotationKind::Comms | AnnotationKind::Nccl(_)) {
                by_thread.entry(annotation.thread).or_default().push(annotation);
            }
        }
        for list in by_thread.values_mut() {
            list.sort_by_key(|a| (a.ts_ns, std::cmp::Reverse(a.duration_ns)));
        }
        Enclosing { by_thread }
    }

    /// The annotations on `thread` that contain instant `ts`, innermost last. Annotations
    /// nest (record_param_comms around nccl:all_reduce), and a launch is usually inside both.
    fn at(&self, thread: u64, ts: i64) -> Vec<&'a RawAnnotation> {
        let Some(list) = self.by_thread.get(&thread) else { return Vec::new() };
        let end = list.partition_point(|a| a.ts_ns <= ts);
        // Collective annotations are short and rarely nest more than two deep; look back a
        // bounded distance.
        let mut found: Vec<&RawAnnotation> = list[end.saturating_sub(8)..end]
            .iter()
            .copied()
            .filter(|a| a.ts_ns.saturating_add(a.duration_ns as i64) >= ts)
            .collect();
        found.sort_by_key(|a| (a.ts_ns, std::cmp::Reverse(a.duration_ns)));
        found
    }
}

/// Everything known about one NCCL kernel's collective, merged from the kernel's own
/// arguments and its host annotations, in that order of preference.
#[derive(Debug, Default)]
struct CollectiveFacts {
    kind: Option<CollectiveType>,
    in_elements: Option<u64>,
    out_elements: Option<u64>,
    input_elements: Option<u64>,
    dtype: Option<String>,
    group_size: Option<u64>,
    group_ranks: Option<Vec<u32>>,
}

impl CollectiveFacts {
    fn absorb(&mut self, comms: &CommsArgs) {
        if self.kind.is_none() {
            self.kind = comms.collective.as_deref().and_then(nccl::parse_collective_name);
        }
        self.in_elements = self.in_elements.or(comms.in_elements);
        self.out_elements = self.out_elements.or(comms.out_elements);
        self.input_elements = self.input_elements.or(comms.input_elements);
        if self.dtype.is_none() {
            self.dtype = comms.dtype.clone().or_else(|| comms.input_type.clone());
        }
        self.group_size = self.group_size.or(comms.group_size);
        if self.group_ranks.is_none() {
            self.group_ranks = comms.group_ranks.clone();
        }
    }

    fn absorb_annotation(&mut self, annotation: &RawAnnotation) {
        if let AnnotationKind::Nccl(Some(kind)) = annotation.kind
            && self.kind.is_none()
        {
            self.kind = Some(kind);
        }
        if let Some(comms) = &annotation.comms {
            self.absorb(comms);
        }
    }

    /// Full-buffer bytes as `CollectiveKind` defines them.
    fn bytes(&self, kind: CollectiveType, world: u32) -> Option<u64> {
        if kind == CollectiveType::Barrier {
            return Some(self.element_bytes().unwrap_or(1));
        }
        let element = self.element_bytes()?;
        let group =
            self.group_ranks.as_ref().map(|r| r.len() as u64).or(self.group_size).unwrap_or(u64::from(world));
        let elements = if self.in_elements.is_some() || self.out_elements.is_some() {
            match kind {
                CollectiveType::AllGather => {
                    self.out_elements.or_else(|| self.in_elements.and_then(|e| e.checked_mul(group)))
                }
                _ => self.in_elements.or(self.out_elements),
            }
        } else {
            // `Input Dims` of the annotation: the first input tensor. For an allgather that is
            // this rank's shard; for every other kind the full buffer.
            match kind {
                CollectiveType::AllGather => self.input_elements.and_then(|e| e.checked_mul(group)),
                _ => self.input_elements,
            }
        }?;
        elements.checked_mul(element)
    }

    fn element_bytes(&self) -> Option<u64> {
        self.dtype.as_deref().and_then(nccl::dtype_bytes)
    }
}

/// Builds one rank's trace from its raw records.
pub(crate) fn link(
    raw: &RawFile,
    rank: u32,
    world: u32,
    names: &[String],
    groups: &mut Groups,
    warnings: &mut Warnings,
) -> RankTrace {
    // Streams, numbered in (device, stream) order.
    let streams: Vec<StreamInfo> = raw
        .gpu
        .iter()
        .map(|g| StreamInfo { device: g.device, stream: g.stream })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let stream_index: BTreeMap<StreamInfo, u32> =
        streams.iter().enumerate().map(|(i, s)| (*s, i as u32)).collect();

    // GPU ops in (stream, start) order.
    let mut order: Vec<usize> = (0..raw.gpu.len()).collect();
    order.sort_by_key(|&i| {
        let g = &raw.gpu[i];
        (stream_index[&StreamInfo { device: g.device, stream: g.stream }], g.ts_ns, i)
    });

    // Runtime calls: the ones that launched a GPU op, synchronize or make a stream wait.
    let gpu_by_correlation: LookupMap<u64, usize> =
        raw.gpu.iter().enumerate().filter_map(|(i, g)| g.correlation.map(|c| (c, i))).collect();
    let mut kept_calls: Vec<(usize, CallKind)> = Vec::new();
    let mut launch_of_gpu: LookupMap<usize, usize> = LookupMap::new();
    for (index, call) in raw.calls.iter().enumerate() {
        let launched = call.correlation.and_then(|c| gpu_by_correlation.get(&c).copied());
        if let Some(gpu) = launched {
            kept_calls.push((index, CallKind::Launch));
            launch_of_gpu.insert(gpu, index);
        } else if let Some(role) = names.get(call.name as usize).and_then(|n| call_role(n)) {
            kept_calls.push((index, role));
        }
    }
    // The origin is the earliest of what is kept, so writing the trace back and importing it
    // again gives the same times.
    let base = raw.base_time_ns.unwrap_or(0);
    let origin = raw
        .gpu
        .iter()
        .map(|g| g.ts_ns)
        .chain(kept_calls.iter().map(|&(i, _)| raw.calls[i].ts_ns))
        .chain(raw.annotations.iter().filter(|a| matches!(a.kind, AnnotationKind::Step(_))).map(|a| a.ts_ns))
        .min()
        .unwrap_or(0);
    let relative = |ts: i64| u64::try_from(ts.saturating_sub(origin)).unwrap_or(0);
    let threads: Vec<u64> = kept_calls
        .iter()
        .map(|&(i, _)| raw.calls[i].thread)
        .chain(raw.annotations.iter().filter(|a| matches!(a.kind, AnnotationKind::Step(_))).map(|a| a.thread))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let thread_index: LookupMap<u64, u32> = threads.iter().enumerate().map(|(i, &t)| (t, i as u32)).collect();
    kept_calls.sort_by_key(|&(i, _)| (thread_index[&raw.calls[i].thread], raw.calls[i].ts_ns, i));
    let call_position: LookupMap<usize, u32> =
        kept_calls.iter().enumerate().map(|(position, &(i, _))| (i, position as u32)).collect();
    let calls: Vec<RuntimeCall> = kept_calls
        .iter()
        .map(|&(i, kind)| {
            let call = &raw.calls[i];
            RuntimeCall {
                thread: thread_index[&call.thread],
                start_ns: relative(call.ts_ns),
                duration_ns: call.duration_ns,
                name: call.name,
                kind,
            }
        })
        .collect();

    // Collective facts for NCCL kernels.
    let enclosing = Enclosing::new(&raw.annotations);
    let by_external: LookupMap<u64, Vec<&RawAnnotation>> = {
        let mut map: LookupMap<u64, Vec<&RawAnnotation>> = LookupMap::new();
        for annotation in &raw.annotations {
            if let (Some(id), AnnotationKind::Comms | AnnotationKind::Nccl(_)) =
                (annotation.external_id, annotation.kind)
            {
                map.entry(id).or_default().push(annotation);
            }
        }
        map
    };
    let mut collective_of = |index: usize, gpu: &RawGpu, warnings: &mut Warnings| -> CollectiveCall {
        let name = names.get(gpu.name as usize).map_or("", String::as_str);
        let (kernel_kind, algorithm) = nccl::parse_kernel_name(name);
        let mut facts = CollectiveFacts::default();
        if let Some(comms) = &gpu.comms {
            facts.absorb(comms);
        }
        if let Some(annotations) = gpu.external_id.and_then(|id| by_external.get(&id)) {
            for annotation in annotations {
                facts.absorb_annotation(annotation);
            }
        }
        if let Some(&call) = launch_of_gpu.get(&index) {
            let call = &raw.calls[call];
            // Innermost first: `nccl:all_reduce` is more specific than its record_param_comms.
            for annotation in enclosing.at(call.thread, call.ts_ns).iter().rev() {
                facts.absorb_annotation(annotation);
            }
        }
        let kind = match (facts.kind, kernel_kind) {
            (Some(kind), _) => kind,
            (None, CollectiveType::Unknown) => {
                warnings.add("NCCL kernels whose operation neither the kernel nor a host annotation names (replayed at measured duration)");
                CollectiveType::Unknown
            }
            (None, kind) => kind,
        };
        let bytes = facts.bytes(kind, world);
        if bytes.is_none() && !matches!(kind, CollectiveType::Unknown) {
            warnings.add(format!(
                "{} kernels whose message size the trace does not record (replayed at measured duration)",
                kind.name()
            ));
        }
        let group = match &facts.group_ranks {
            Some(ranks) if !ranks.is_empty() => groups.intern(ranks, world),
            _ => None,
        };
        CollectiveCall { kind, bytes, dtype: facts.dtype.clone(), group, algorithm }
    };

    let mut position_of_gpu = vec![0u32; raw.gpu.len()];
    let mut gpu_ops = Vec::with_capacity(raw.gpu.len());
    for (position, &index) in order.iter().enumerate() {
        position_of_gpu[index] = position as u32;
        let gpu = &raw.gpu[index];
        let name = names.get(gpu.name as usize).map_or("", String::as_str);
        let kind = match gpu.category {
            GpuCategory::Kernel if nccl::is_nccl_kernel(name) => {
                GpuOpKind::Collective(collective_of(index, gpu, warnings))
            }
            GpuCategory::Kernel => GpuOpKind::Kernel,
            GpuCategory::Memcpy => {
                GpuOpKind::Memcpy { direction: copy_direction(name), bytes: gpu.bytes.unwrap_or(0) }
            }
            GpuCategory::Memset => GpuOpKind::Memset { bytes: gpu.bytes.unwrap_or(0) },
        };
        gpu_ops.push(GpuOp {
            stream: stream_index[&StreamInfo { device: gpu.device, stream: gpu.stream }],
            start_ns: relative(gpu.ts_ns),
            duration_ns: gpu.duration_ns,
            name: gpu.name,
            kind,
            launch: launch_of_gpu.get(&index).and_then(|call| call_position.get(call).copied()),
        });
    }
    let unlaunched = gpu_ops.iter().filter(|op| op.launch.is_none()).count() as u64;
    warnings.add_many(
        "GPU ops whose launch call is not in the trace (anchored at their measured start)",
        unlaunched,
    );

    // Iterations, once each (some traces mark a step both as cpu_op and user_annotation).
    let mut steps: Vec<Step> = Vec::new();
    let mut seen_steps = BTreeSet::new();
    let mut step_annotations: Vec<&RawAnnotation> =
        raw.annotations.iter().filter(|a| matches!(a.kind, AnnotationKind::Step(_))).collect();
    step_annotations.sort_by_key(|a| a.ts_ns);
    for annotation in step_annotations {
        let AnnotationKind::Step(number) = annotation.kind else { continue };
        if seen_steps.insert(number) {
            steps.push(Step {
                number,
                thread: thread_index[&annotation.thread],
                start_ns: relative(annotation.ts_ns),
                duration_ns: annotation.duration_ns,
            });
        }
    }

    // Exact cross-stream waits (cuda_sync events of newer Kineto).
    let mut stream_waits = Vec::new();
    if !raw.stream_syncs.is_empty() {
        let record_time: LookupMap<u64, i64> =
            raw.calls.iter().filter_map(|c| c.correlation.map(|corr| (corr, c.ts_ns))).collect();
        let launch_time = |index: usize| {
            launch_of_gpu.get(&index).map_or(raw.gpu[index].ts_ns, |&call| raw.calls[call].ts_ns)
        };
        // Per stream, GPU ops (raw indexes) in start order.
        let mut per_stream: BTreeMap<StreamInfo, Vec<usize>> = BTreeMap::new();
        for &index in &order {
            let g = &raw.gpu[index];
            per_stream.entry(StreamInfo { device: g.device, stream: g.stream }).or_default().push(index);
        }
        for sync in &raw.stream_syncs {
            let waiting = per_stream.get(&StreamInfo { device: sync.device, stream: sync.stream });
            let source = sync
                .wait_on_stream
                .and_then(|s| per_stream.get(&StreamInfo { device: sync.device, stream: s }));
            let recorded = sync.record_correlation.and_then(|c| record_time.get(&c).copied());
            let (Some(waiting), Some(source), Some(recorded)) = (waiting, source, recorded) else {
                warnings.add("cuda_sync events whose streams or event record are not in the trace ignored");
                continue;
            };
            let next = waiting.iter().copied().find(|&i| raw.gpu[i].ts_ns >= sync.ts_ns);
            let before = source.iter().copied().rfind(|&i| launch_time(i) < recorded);
            if let (Some(op), Some(after)) = (next, before) {
                stream_waits.push(StreamWait { op: position_of_gpu[op], after: position_of_gpu[after] });
            }
        }
    }

    stream_waits.extend(raw.stream_waits.iter().map(|&(op, after)| StreamWait { op, after }));

    RankTrace {
        rank,
        source: raw.path.display().to_string(),
        origin_ns: base.saturating_add(origin),
        streams,
        threads,
        gpu_ops,
        calls,
        steps,
        stream_waits,
    }
}
