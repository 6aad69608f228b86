//! The imported trace: what a profiler measured on every rank, filtered to what a replay needs
//! and linked (each GPU op to the host call that launched it, each NCCL kernel to its
//! collective's kind, size and group).
//!
//! A [`Trace`] is what the Kineto importer produces, what the binary `.pstrace` format stores
//! and what the Kineto writer writes back; [`crate::replay`] turns it into an execution graph.
//! Times are integer nanoseconds on the profiler's clock, relative to each rank's
//! [`RankTrace::origin_ns`].

use serde::{Deserialize, Serialize};

use crate::error::TraceError;

/// Index into [`Trace::names`].
pub type NameId = u32;

/// A whole job (or the part of it that was traced): every traced rank's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// Ranks of the job (`distributedInfo.world_size`); at least the number of traced ranks.
    pub world_size: u32,
    /// The GPU the job ran on, from `deviceProperties`, if recorded.
    pub device: Option<DeviceInfo>,
    /// Interned names of kernels, copies and runtime calls.
    pub names: Vec<String>,
    /// Process groups that are not the whole world, as lists of global ranks in ring order.
    pub groups: Vec<Vec<u32>>,
    /// The traced ranks, in increasing rank order, each at most once.
    pub ranks: Vec<RankTrace>,
}

/// The GPU of the traced job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// The CUDA name, e.g. "Tesla V100-SXM2-32GB" or "NVIDIA A100-SXM4-80GB".
    pub name: String,
    /// Device memory in bytes (`totalGlobalMem`).
    pub memory_bytes: u64,
    /// Streaming multiprocessors (`numSms`).
    pub multiprocessors: u32,
    /// Compute capability, major and minor.
    pub compute_capability: (u32, u32),
    /// GPUs the profiled process could see on its host (entries of `deviceProperties`): the
    /// best available guess of GPUs per server.
    pub devices_per_host: u32,
}

/// One rank's measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankTrace {
    /// Global rank (`distributedInfo.rank`).
    pub rank: u32,
    /// The file it was read from (for messages).
    pub source: String,
    /// The profiler-clock time (ns) that this rank's times are relative to. Ranks of one job
    /// share a clock only as well as their hosts' clocks agree.
    pub origin_ns: i64,
    /// GPU streams, indexed by [`GpuOp::stream`].
    pub streams: Vec<StreamInfo>,
    /// Host thread ids, indexed by [`RuntimeCall::thread`] and [`Step::thread`].
    pub threads: Vec<u64>,
    /// Kernels, copies and memsets, sorted by (stream, start).
    pub gpu_ops: Vec<GpuOp>,
    /// The host calls that matter for replay (launches, synchronizations, stream waits),
    /// sorted by (thread, start).
    pub calls: Vec<RuntimeCall>,
    /// Iterations (`ProfilerStep#N`), sorted by start.
    pub steps: Vec<Step>,
    /// Cross-stream waits known exactly (Kineto's `cuda_sync` events): `op` waited for
    /// `after`; indexes into `gpu_ops`.
    pub stream_waits: Vec<StreamWait>,
}

/// A GPU stream of one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StreamInfo {
    /// Device index (the Kineto `pid` of GPU events).
    pub device: u32,
    /// CUDA stream id (the Kineto `tid` / `args.stream`).
    pub stream: u64,
}

/// One kernel, copy or memset as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuOp {
    /// Index into [`RankTrace::streams`].
    pub stream: u32,
    /// Measured start (ns after the rank's origin).
    pub start_ns: u64,
    /// Measured duration (ns).
    pub duration_ns: u64,
    /// Index into [`Trace::names`].
    pub name: NameId,
    /// What it does.
    pub kind: GpuOpKind,
    /// The host call that launched it (index into [`RankTrace::calls`]), if recorded.
    pub launch: Option<u32>,
}

impl GpuOp {
    /// Measured end (ns after the rank's origin).
    pub fn end_ns(&self) -> u64 {
        self.start_ns.saturating_add(self.duration_ns)
    }
}

/// What a GPU op does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum GpuOpKind {
    /// A compute kernel.
    Kernel,
    /// A copy.
    Memcpy {
        /// Which way.
        direction: CopyDirection,
        /// How much.
        bytes: u64,
    },
    /// A memset.
    Memset {
        /// How much.
        bytes: u64,
    },
    /// An NCCL kernel: one rank's part in a collective or point-to-point operation.
    Collective(CollectiveCall),
}

/// Direction of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CopyDirection {
    /// Host to device.
    HostToDevice,
    /// Device to host.
    DeviceToHost,
    /// Within a device (or between devices).
    DeviceToDevice,
    /// Anything else (host to host, unknown).
    Other,
}

/// What one rank's NCCL kernel was part of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectiveCall {
    /// What it computes.
    pub kind: CollectiveType,
    /// Full buffer size in bytes, as [`sim_core::graph::CollectiveKind`] defines it, if the
    /// trace records it.
    pub bytes: Option<u64>,
    /// Element type, as the trace spells it ("float", "Float", "c10::Half", ...).
    pub dtype: Option<String>,
    /// Index into [`Trace::groups`]; `None` for the whole world (the default group).
    pub group: Option<u32>,
    /// NCCL's algorithm from the kernel name ("RING", "TREE", ...), if present.
    pub algorithm: Option<String>,
}

/// The kinds of NCCL operations a trace can show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CollectiveType {
    /// Allreduce.
    AllReduce,
    /// Reduce-scatter.
    ReduceScatter,
    /// Allgather.
    AllGather,
    /// All-to-all.
    AllToAll,
    /// Broadcast (root: position 0 of the group; traces do not record it).
    Broadcast,
    /// Reduce (root: position 0 of the group).
    Reduce,
    /// Barrier (NCCL runs it as a one-element allreduce).
    Barrier,
    /// Point-to-point send (peer not recorded).
    Send,
    /// Point-to-point receive (peer not recorded).
    Recv,
    /// An NCCL kernel whose operation the trace does not say.
    Unknown,
}

impl CollectiveType {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            CollectiveType::AllReduce => "allreduce",
            CollectiveType::ReduceScatter => "reduce-scatter",
            CollectiveType::AllGather => "allgather",
            CollectiveType::AllToAll => "all-to-all",
            CollectiveType::Broadcast => "broadcast",
            CollectiveType::Reduce => "reduce",
            CollectiveType::Barrier => "barrier",
            CollectiveType::Send => "send",
            CollectiveType::Recv => "recv",
            CollectiveType::Unknown => "unknown nccl",
        }
    }
}

/// A host-side CUDA runtime call that a replay needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeCall {
    /// Index into [`RankTrace::threads`].
    pub thread: u32,
    /// Measured start (ns after the rank's origin).
    pub start_ns: u64,
    /// Measured duration (ns).
    pub duration_ns: u64,
    /// Index into [`Trace::names`] (`cudaLaunchKernel`, `cudaStreamSynchronize`, ...).
    pub name: NameId,
    /// What it does.
    pub kind: CallKind,
}

impl RuntimeCall {
    /// Measured end (ns after the rank's origin).
    pub fn end_ns(&self) -> u64 {
        self.start_ns.saturating_add(self.duration_ns)
    }
}

/// The role of a runtime call in a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CallKind {
    /// Launches a GPU op (the op's [`GpuOp::launch`] points here).
    Launch,
    /// Blocks the host until GPU work is done.
    Synchronize(SyncScope),
    /// Makes a stream wait for an event (`cudaStreamWaitEvent`).
    StreamWaitEvent,
}

/// What a synchronizing call waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyncScope {
    /// Every stream of the device (`cudaDeviceSynchronize`).
    Device,
    /// One stream (`cudaStreamSynchronize`).
    Stream,
    /// One event (`cudaEventSynchronize`).
    Event,
}

/// One iteration as the profiler marked it (`ProfilerStep#N`, host side).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// N.
    pub number: u64,
    /// Index into [`RankTrace::threads`].
    pub thread: u32,
    /// Measured start (ns after the rank's origin).
    pub start_ns: u64,
    /// Measured duration (ns).
    pub duration_ns: u64,
}

/// A GPU op that waited on another stream's op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamWait {
    /// The op that waited (index into [`RankTrace::gpu_ops`]).
    pub op: u32,
    /// The op it waited for.
    pub after: u32,
}

impl Trace {
    /// Keeps only traced rank `rank` (the others of the job are then replayed as its copies);
    /// `false` if it is not in the trace.
    pub fn keep_only_rank(&mut self, rank: u32) -> bool {
        if !self.ranks.iter().any(|r| r.rank == rank) {
            return false;
        }
        self.ranks.retain(|r| r.rank == rank);
        true
    }

    /// The name `id` stands for ("?" if out of range; [`Trace::validate`] rules that out).
    pub fn name(&self, id: NameId) -> &str {
        self.names.get(id as usize).map_or("?", String::as_str)
    }

    /// Checks every index and ordering invariant, so that a trace from any source (a
    /// corrupt binary file included) can be replayed without panicking. `path` names the
    /// source in errors.
    pub fn validate(&self, path: &std::path::Path) -> Result<(), TraceError> {
        let bad = |reason: String| TraceError::Meaningless { path: path.to_path_buf(), reason };
        if self.ranks.is_empty() {
            return Err(bad("no ranks".into()));
        }
        if (self.world_size as usize) < self.ranks.len() {
            return Err(bad(format!(
                "world size {} is smaller than the {} traced ranks",
                self.world_size,
                self.ranks.len()
            )));
        }
        for pair in self.ranks.windows(2) {
            if pair[0].rank >= pair[1].rank {
                return Err(bad(format!(
                    "ranks out of order or repeated: {} then {}",
                    pair[0].rank, pair[1].rank
                )));
            }
        }
        for (index, group) in self.groups.iter().enumerate() {
            if group.is_empty() || group.iter().any(|&r| r >= self.world_size) {
                return Err(bad(format!(
                    "process group {index} {group:?} is empty or names a rank outside the world of {}",
                    self.world_size
                )));
            }
            let mut sorted = group.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != group.len() {
                return Err(bad(format!("process group {index} {group:?} names a rank twice")));
            }
        }
        let names = self.names.len();
        for rank in &self.ranks {
            let bad_rank = |what: String| bad(format!("rank {} ({}): {what}", rank.rank, rank.source));
            if rank.rank >= self.world_size {
                return Err(bad_rank(format!("outside the world of {}", self.world_size)));
            }
            if rank.streams.len() > usize::from(u16::MAX) / 2
                || rank.threads.len() > usize::from(u16::MAX) / 2
            {
                return Err(bad_rank("too many streams or threads".into()));
            }
            for (index, op) in rank.gpu_ops.iter().enumerate() {
                if op.stream as usize >= rank.streams.len() || op.name as usize >= names {
                    return Err(bad_rank(format!("GPU op {index} names a stream or name out of range")));
                }
                if op.launch.is_some_and(|call| call as usize >= rank.calls.len()) {
                    return Err(bad_rank(format!("GPU op {index} names a launch call out of range")));
                }
                if let GpuOpKind::Collective(call) = &op.kind
                    && call.group.is_some_and(|group| group as usize >= self.groups.len())
                {
                    return Err(bad_rank(format!("GPU op {index} names a process group out of range")));
                }
            }
            for pair in rank.gpu_ops.windows(2) {
                if (pair[0].stream, pair[0].start_ns) > (pair[1].stream, pair[1].start_ns) {
                    return Err(bad_rank("GPU ops are not sorted by stream and start".into()));
                }
            }
            for (index, call) in rank.calls.iter().enumerate() {
                if call.thread as usize >= rank.threads.len() || call.name as usize >= names {
                    return Err(bad_rank(format!("call {index} names a thread or name out of range")));
                }
            }
            for pair in rank.calls.windows(2) {
                if (pair[0].thread, pair[0].start_ns) > (pair[1].thread, pair[1].start_ns) {
                    return Err(bad_rank("calls are not sorted by thread and start".into()));
                }
            }
            for step in &rank.steps {
                if step.thread as usize >= rank.threads.len() {
                    return Err(bad_rank(format!("step {} names a thread out of range", step.number)));
                }
            }
            for wait in &rank.stream_waits {
                if wait.op as usize >= rank.gpu_ops.len() || wait.after as usize >= rank.gpu_ops.len() {
                    return Err(bad_rank("a stream wait names a GPU op out of range".into()));
                }
            }
        }
        Ok(())
    }
}

impl Trace {
    /// Puts names and process groups in a canonical order (names: only those used, sorted;
    /// groups: sorted), so the same measurements give the same trace whatever the order the
    /// files were read in and whatever else they contained.
    pub(crate) fn canonicalize(&mut self) {
        let mut used = vec![false; self.names.len()];
        for rank in &self.ranks {
            for op in &rank.gpu_ops {
                if let Some(slot) = used.get_mut(op.name as usize) {
                    *slot = true;
                }
            }
            for call in &rank.calls {
                if let Some(slot) = used.get_mut(call.name as usize) {
                    *slot = true;
                }
            }
        }
        let mut kept: Vec<(String, NameId)> = std::mem::take(&mut self.names)
            .into_iter()
            .enumerate()
            .filter(|&(id, _)| used[id])
            .map(|(id, name)| (name, id as NameId))
            .collect();
        kept.sort();
        let mut new_id = vec![0 as NameId; used.len()];
        for (position, (_, old)) in kept.iter().enumerate() {
            new_id[*old as usize] = position as NameId;
        }
        self.names = kept.into_iter().map(|(name, _)| name).collect();

        let mut groups: Vec<(Vec<u32>, u32)> =
            std::mem::take(&mut self.groups).into_iter().enumerate().map(|(id, g)| (g, id as u32)).collect();
        groups.sort();
        let mut new_group = vec![0u32; groups.len()];
        for (position, (_, old)) in groups.iter().enumerate() {
            new_group[*old as usize] = position as u32;
        }
        self.groups = groups.into_iter().map(|(group, _)| group).collect();

        for rank in &mut self.ranks {
            for op in &mut rank.gpu_ops {
                op.name = new_id.get(op.name as usize).copied().unwrap_or(op.name);
                if let GpuOpKind::Collective(call) = &mut op.kind {
                    call.group = call.group.map(|g| new_group.get(g as usize).copied().unwrap_or(g));
                }
            }
            for call in &mut rank.calls {
                call.name = new_id.get(call.name as usize).copied().unwrap_or(call.name);
            }
        }
    }
}
