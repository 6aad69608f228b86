//! Execution traces: PyTorch execution traces (ET JSON), Chakra JSON `workload_graph` traces
//! and Chakra protobuf `.et` files, read into one graph form ([`EtJob`]) and turned into a
//! [`Trace`] that [`crate::replay`] replays like a Kineto trace (docs/chakra.md).
//!
//! An execution trace records what ran and in which order, not (except Chakra's `runtime` /
//! `duration_micros`) how long each GPU op took. [`to_trace`] takes each op's duration from the
//! trace where it records one, else from a caller's cost function (parasim's compute model for
//! the operator's shapes, or a Chakra node's `num_ops` and `tensor_size`), and lays the ops out
//! as the trace orders them: compute on one stream, collectives on another, point-to-point on a
//! third, each waiting for the ops it depends on (Chakra `ctrl_deps` / `data_deps`; in a
//! PyTorch ET, a collective waits for the compute issued before it and compute after a `wait`
//! waits for the collectives before it).

pub mod export;
pub mod files;
mod pytorch;
pub mod schema;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::TraceError;
use crate::model::{
    CollectiveCall, CollectiveType, GpuOp, GpuOpKind, RankTrace, Step, StreamInfo, StreamWait, Trace,
};
use crate::warnings::Warnings;

pub use files::{Format, sniff};

/// One node of an execution trace, in the form every reader produces.
#[derive(Debug, Clone, PartialEq)]
pub struct EtNode {
    /// The node's id in its file.
    pub id: u64,
    /// Its name (`aten::mm`, `nccl:all_gather`, a kernel name, ...).
    pub name: String,
    /// The node it was called from (PyTorch ET `ctrl_deps` / `parent`), if any.
    pub parent: Option<u64>,
    /// Nodes it must wait for (Chakra `ctrl_deps` and `data_deps`).
    pub deps: Vec<u64>,
    /// What it is.
    pub role: Role,
    /// Start (ns) if the trace records one.
    pub start_ns: Option<u64>,
    /// Duration (ns) if the trace records one.
    pub duration_ns: Option<u64>,
    /// The stream it ran on, if the trace records one (parasim's exports do).
    pub stream: Option<u32>,
}

/// What a node is for a replay.
#[derive(Debug, Clone, PartialEq)]
pub enum Role {
    /// GPU compute: its duration is recorded or estimated.
    Compute(ComputeWork),
    /// A collective or point-to-point operation.
    Comm(CommNode),
    /// Host-side work or a container of other nodes: not replayed.
    Host,
    /// A `wait` on earlier collectives (PyTorch ET `record_param_comms` "wait").
    Wait,
    /// `ProfilerStep#N`.
    Step(u64),
}

/// What a compute node does, as far as the trace says.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ComputeWork {
    /// Each input's sizes (`None`: not a flat list of sizes), as Kineto's `Input Dims`.
    pub dims: Vec<Option<Vec<u64>>>,
    /// Each input's element type as Kineto writes it (`float`, `c10::Half`, `Scalar`, ``).
    pub types: Vec<Option<String>>,
    /// Floating-point operations (Chakra `num_ops`).
    pub flops: Option<f64>,
    /// Bytes read and written (Chakra `tensor_size`).
    pub bytes: Option<f64>,
    /// Host work (Chakra `is_cpu_op`) with a recorded duration: replayed on a host stream.
    pub host: bool,
}

/// A communication node.
#[derive(Debug, Clone, PartialEq)]
pub struct CommNode {
    /// What it does.
    pub kind: CollectiveType,
    /// The full buffer in bytes, as [`sim_core::graph::CollectiveKind`] defines it, if known.
    pub bytes: Option<u64>,
    /// Its process group as global ranks; `None` for the whole world.
    pub group: Option<Vec<u32>>,
    /// The peer of a send or receive, if recorded.
    pub peer: Option<u32>,
}

/// One rank's execution trace.
#[derive(Debug, Clone, PartialEq)]
pub struct EtRank {
    /// Its global rank.
    pub rank: u32,
    /// The file it came from.
    pub source: String,
    /// Its nodes, in file order.
    pub nodes: Vec<EtNode>,
}

/// Execution traces of one job.
#[derive(Debug, Clone, PartialEq)]
pub struct EtJob {
    /// The format, as reports name it ("PyTorch execution trace (schema 1.1.0-chakra.0.0.4)").
    pub format: String,
    /// Ranks of the job (the largest process group, or the number of files).
    pub world_size: u32,
    /// The traced ranks, in rank order.
    pub ranks: Vec<EtRank>,
    /// What the readers skipped or assumed.
    pub warnings: Warnings,
}

impl EtJob {
    /// Nodes over all ranks.
    pub fn node_count(&self) -> usize {
        self.ranks.iter().map(|r| r.nodes.len()).sum()
    }
}

/// The duration (ns) a caller gives a compute node that records none; `None`: no cost.
pub type CostFn<'a> = dyn Fn(&CostQuery) -> Option<u64> + 'a;

/// A compute node without a recorded duration, as the cost function sees it.
#[derive(Debug, Clone, Copy)]
pub struct CostQuery<'a> {
    /// The operator's name.
    pub name: &'a str,
    /// What the trace says it does.
    pub work: &'a ComputeWork,
}

/// Where the durations of a converted execution trace came from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timing {
    /// Compute ops whose duration the trace recorded.
    pub from_trace: u64,
    /// Compute ops costed by the caller's model.
    pub from_model: u64,
    /// GPU operators left out: no recorded duration and no cost (by name).
    pub uncosted: BTreeMap<String, u64>,
    /// Collectives and point-to-point ops.
    pub communication: u64,
    /// Of those, with a byte count (simulated by the network model).
    pub communication_sized: u64,
}

impl Timing {
    /// One line for reports.
    pub fn describe(&self) -> String {
        let uncosted: u64 = self.uncosted.values().sum();
        let mut top: Vec<(&String, &u64)> = self.uncosted.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let names: Vec<String> = top.iter().take(4).map(|(n, c)| format!("{n} x{c}")).collect();
        let mut text = format!(
            "{} compute ops timed by the trace, {} by parasim's compute model",
            self.from_trace, self.from_model
        );
        if uncosted > 0 {
            text += &format!(
                ", {uncosted} operators on GPU tensors left out (no duration and no cost formula; most launch no kernel: {})",
                names.join(", ")
            );
        }
        text += &format!(
            "; {} communication ops, {} with byte counts (the others replay at their recorded duration)",
            self.communication, self.communication_sized
        );
        text
    }
}

/// Reads the execution traces in `files` (already unpacked; one rank each, with the name
/// messages give it) of format `format`.
pub fn read(files: &[(PathBuf, String)], format: &Format) -> Result<EtJob, TraceError> {
    let mut warnings = Warnings::new();
    let mut ranks = Vec::with_capacity(files.len());
    let mut world = 0u32;
    for (position, (path, shown)) in files.iter().enumerate() {
        let rank = rank_from_name(Path::new(shown)).unwrap_or(position as u32);
        let (nodes, group_size) = match format {
            Format::PytorchEt { .. } => pytorch::read_pytorch(path, &mut warnings)?,
            Format::ChakraJson => pytorch::read_chakra_json(path, &mut warnings)?,
            Format::ChakraProtobuf { .. } => files::read_protobuf(path, &mut warnings)?,
            other => {
                return Err(TraceError::Meaningless {
                    path: path.clone(),
                    reason: format!("{} is not an execution trace", other.describe()),
                });
            }
        };
        world = world.max(group_size);
        ranks.push(EtRank { rank, source: shown.clone(), nodes });
    }
    ranks.sort_by_key(|r| r.rank);
    for pair in ranks.windows(2) {
        if pair[0].rank == pair[1].rank {
            return Err(TraceError::Inconsistent {
                reason: format!(
                    "{} and {} are both rank {} (ranks come from the number that ends each file name): give the files of one job, one per rank",
                    pair[0].source, pair[1].source, pair[0].rank
                ),
            });
        }
    }
    let highest = ranks.last().map_or(0, |r| r.rank + 1);
    let world_size = world.max(highest).max(ranks.len() as u32).max(1);
    Ok(EtJob { format: format.describe(), world_size, ranks, warnings })
}

/// The rank a file's name gives: the number that ends its name before the extensions, after
/// a `.`, `_` or `-` (`dlrm_eg_3.json` -> 3, `chakra.0.json` -> 0, `llama.12.et` -> 12;
/// `resnet_2gpu_et.json.gz` -> none).
pub fn rank_from_name(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_string_lossy().to_string();
    let mut stem = name.as_str();
    for extension in [".gz", ".json", ".et", ".trace", ".pt"] {
        stem = stem.strip_suffix(extension).unwrap_or(stem);
    }
    let digits = stem.len() - stem.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    let (before, number) = stem.split_at(stem.len() - digits);
    // After a separator, and not the last part of a dotted version (`1.0.2-chakra.0.0.4`).
    let mut head = before.chars().rev();
    if !head.next().is_some_and(|c| matches!(c, '.' | '_' | '-'))
        || head.next().is_some_and(|c| c.is_ascii_digit())
    {
        return None;
    }
    number.parse().ok()
}

const COMPUTE_STREAM: u32 = 0;
const COLLECTIVE_STREAM: u32 = 1;
const P2P_STREAM: u32 = 2;
const HOST_STREAM: u32 = 3;
/// Streams a trace records are numbered from here.
const RECORDED_STREAMS: u32 = 4;

/// Converts `job` into a [`Trace`]: every compute node with a duration (recorded, or from
/// `cost`, in nanoseconds) and every communication node becomes a GPU op, in the order the
/// rules of the [module documentation](self) give, at the times they give.
pub fn to_trace(
    job: &EtJob,
    cost: &dyn Fn(&CostQuery) -> Option<u64>,
) -> Result<(Trace, Warnings, Timing), TraceError> {
    let mut warnings = job.warnings.clone();
    let mut timing = Timing::default();
    let mut names: Vec<String> = Vec::new();
    let mut name_ids: BTreeMap<String, u32> = BTreeMap::new();
    let mut groups: Vec<Vec<u32>> = Vec::new();
    let mut out_ranks = Vec::with_capacity(job.ranks.len());
    for rank in &job.ranks {
        let mut intern = |name: &str| -> u32 {
            if let Some(&id) = name_ids.get(name) {
                return id;
            }
            let id = names.len() as u32;
            names.push(name.to_string());
            name_ids.insert(name.to_string(), id);
            id
        };
        let converted = convert_rank(job, rank, cost, &mut timing, &mut warnings, &mut groups, &mut intern)?;
        out_ranks.push(converted);
    }
    let mut trace = Trace { world_size: job.world_size, device: None, names, groups, ranks: out_ranks };
    trace.canonicalize();
    let path = PathBuf::from(job.ranks.first().map_or(String::new(), |r| r.source.clone()));
    if trace.ranks.iter().all(|r| r.gpu_ops.is_empty()) {
        return Err(TraceError::Meaningless {
            path,
            reason: format!(
                "{}: no GPU work to replay: {}{}",
                job.format,
                timing.describe(),
                if timing.uncosted.is_empty() {
                    ""
                } else {
                    "; give --device or --cluster to time operators with parasim's compute model"
                }
            ),
        });
    }
    trace.validate(&path)?;
    crate::kineto::check_collective_counts(&trace)?;
    Ok((trace, warnings, timing))
}

/// A GPU op before sorting: (stream, start, duration, name, kind, node index).
struct Pending {
    stream: u32,
    start_ns: u64,
    duration_ns: u64,
    name: u32,
    kind: GpuOpKind,
    waits: Vec<usize>,
}

fn convert_rank(
    job: &EtJob,
    rank: &EtRank,
    cost: &dyn Fn(&CostQuery) -> Option<u64>,
    timing: &mut Timing,
    warnings: &mut Warnings,
    groups: &mut Vec<Vec<u32>>,
    intern: &mut dyn FnMut(&str) -> u32,
) -> Result<RankTrace, TraceError> {
    let index_of: BTreeMap<u64, usize> = rank.nodes.iter().enumerate().map(|(i, n)| (n.id, i)).collect();
    // Program order: a topological order of the dependencies, ties by id (PyTorch ET ids
    // follow execution order; Chakra's follow the converter's).
    let order = topological(rank, &index_of);
    let chakra_deps = rank.nodes.iter().any(|n| !n.deps.is_empty());
    let recorded_times = rank.nodes.iter().any(|n| n.start_ns.is_some_and(|s| s > 0));

    let mut op_of_node: Vec<Option<usize>> = vec![None; rank.nodes.len()];
    let mut pending: Vec<Pending> = Vec::new();
    let mut stream_free: BTreeMap<u32, u64> = BTreeMap::new();
    let mut end_of: Vec<u64> = vec![0; rank.nodes.len()];
    let mut last_compute: Option<usize> = None;
    let mut last_collective: Option<usize> = None;
    let mut waited_collective: Option<usize> = None;
    for &index in &order {
        let node = &rank.nodes[index];
        // Dependencies that are GPU ops (through host nodes: a host node's dependencies count).
        let dep_ops: Vec<usize> =
            if chakra_deps { gpu_deps(rank, index, &index_of, &op_of_node) } else { Vec::new() };
        let dep_end = node.deps.iter().filter_map(|d| index_of.get(d)).map(|&d| end_of[d]).max().unwrap_or(0);
        match &node.role {
            Role::Compute(work) => {
                let duration = match node.duration_ns {
                    Some(d) => {
                        timing.from_trace += 1;
                        d
                    }
                    None => match cost(&CostQuery { name: &node.name, work }) {
                        Some(d) => {
                            timing.from_model += 1;
                            d
                        }
                        None => {
                            *timing.uncosted.entry(node.name.clone()).or_default() += 1;
                            end_of[index] = dep_end;
                            continue;
                        }
                    },
                };
                let mut waits = dep_ops;
                if !chakra_deps && let Some(c) = waited_collective.take() {
                    waits.push(c);
                }
                let stream = node
                    .stream
                    .map_or(if work.host { HOST_STREAM } else { COMPUTE_STREAM }, |s| RECORDED_STREAMS + s);
                let kernel = Pending {
                    stream,
                    start_ns: 0,
                    duration_ns: duration,
                    name: intern(&node.name),
                    kind: GpuOpKind::Kernel,
                    waits,
                };
                let (op, end) = place(&mut pending, &mut stream_free, node, recorded_times, dep_end, kernel);
                end_of[index] = end;
                op_of_node[index] = Some(op);
                last_compute = Some(op);
            }
            Role::Comm(comm) => {
                timing.communication += 1;
                if comm.bytes.is_some() {
                    timing.communication_sized += 1;
                }
                let group = match &comm.group {
                    Some(members)
                        if members.len() as u32 != job.world_size
                            || members.iter().enumerate().any(|(i, &r)| r != i as u32) =>
                    {
                        if members.iter().any(|&r| r >= job.world_size) {
                            return Err(TraceError::Meaningless {
                                path: PathBuf::from(&rank.source),
                                reason: format!(
                                    "node {} ({}): process group {members:?} names a rank outside the world of {}",
                                    node.id, node.name, job.world_size
                                ),
                            });
                        }
                        Some(match groups.iter().position(|g| g == members) {
                            Some(g) => g as u32,
                            None => {
                                groups.push(members.clone());
                                (groups.len() - 1) as u32
                            }
                        })
                    }
                    _ => None,
                };
                let p2p = matches!(comm.kind, CollectiveType::Send | CollectiveType::Recv);
                let stream = node
                    .stream
                    .map_or(if p2p { P2P_STREAM } else { COLLECTIVE_STREAM }, |s| RECORDED_STREAMS + s);
                let mut waits = dep_ops;
                if !chakra_deps && let Some(c) = last_compute {
                    waits.push(c);
                }
                // Recorded duration, else none: the network model times it.
                let duration = node.duration_ns.unwrap_or(0);
                let collective = Pending {
                    stream,
                    start_ns: 0,
                    duration_ns: duration,
                    name: intern(&node.name),
                    kind: GpuOpKind::Collective(CollectiveCall {
                        kind: comm.kind,
                        bytes: comm.bytes,
                        dtype: None,
                        group,
                        algorithm: None,
                    }),
                    waits,
                };
                let (op, end) =
                    place(&mut pending, &mut stream_free, node, recorded_times, dep_end, collective);
                end_of[index] = end;
                op_of_node[index] = Some(op);
                if !p2p {
                    last_collective = Some(op);
                }
            }
            Role::Wait => {
                waited_collective = last_collective.or(waited_collective);
                end_of[index] = dep_end;
            }
            Role::Host | Role::Step(_) => {
                end_of[index] = dep_end;
            }
        }
    }

    // Steps: the GPU ops under each ProfilerStep#N node.
    let mut steps = Vec::new();
    let parent_of =
        |i: usize| rank.nodes[i].parent.and_then(|p| index_of.get(&p).copied()).filter(|&p| p != i);
    let mut step_of: Vec<Option<usize>> = vec![None; rank.nodes.len()];
    for (i, step) in step_of.iter_mut().enumerate() {
        let mut at = Some(i);
        let mut hops = 0;
        while let Some(a) = at {
            if let Role::Step(_) = rank.nodes[a].role {
                *step = Some(a);
                break;
            }
            at = parent_of(a);
            hops += 1;
            if hops > rank.nodes.len() {
                break;
            }
        }
    }
    let mut spans: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    for (i, op) in op_of_node.iter().enumerate() {
        if let (Some(op), Some(step)) = (op, step_of[i]) {
            let p = &pending[*op];
            let span = spans.entry(step).or_insert((u64::MAX, 0));
            span.0 = span.0.min(p.start_ns);
            span.1 = span.1.max(p.start_ns + p.duration_ns);
        }
    }
    for (step, (from, to)) in spans {
        if let Role::Step(number) = rank.nodes[step].role {
            steps.push(Step { number, thread: 0, start_ns: from, duration_ns: to.saturating_sub(from) });
        }
    }
    steps.sort_by_key(|s| s.start_ns);

    // Streams in use, numbered in order; then sort by (stream, start) and re-index the waits.
    let used: Vec<u32> = {
        let mut used: Vec<u32> = pending.iter().map(|p| p.stream).collect();
        used.sort_unstable();
        used.dedup();
        used
    };
    for p in &mut pending {
        p.stream = used.binary_search(&p.stream).unwrap_or(0) as u32;
    }
    let mut sorted: Vec<usize> = (0..pending.len()).collect();
    sorted.sort_by_key(|&i| (pending[i].stream, pending[i].start_ns, i));
    let mut new_index = vec![0u32; pending.len()];
    for (position, &old) in sorted.iter().enumerate() {
        new_index[old] = position as u32;
    }
    let mut stream_waits = Vec::new();
    for (old, p) in pending.iter().enumerate() {
        let mut waits = p.waits.clone();
        waits.sort_unstable();
        waits.dedup();
        for after in waits {
            if pending[after].stream != p.stream {
                stream_waits.push(StreamWait { op: new_index[old], after: new_index[after] });
            }
        }
    }
    stream_waits.sort_by_key(|w| (w.op, w.after));
    let mut gpu_ops: Vec<GpuOp> = Vec::with_capacity(pending.len());
    let mut pending: Vec<Option<Pending>> = pending.into_iter().map(Some).collect();
    for &old in &sorted {
        if let Some(p) = pending[old].take() {
            gpu_ops.push(GpuOp {
                stream: p.stream,
                start_ns: p.start_ns,
                duration_ns: p.duration_ns,
                name: p.name,
                kind: p.kind,
                launch: None,
            });
        }
    }
    if steps.is_empty() {
        warnings.add("execution traces without ProfilerStep#N nodes (the replay reports the makespan)");
    }
    Ok(RankTrace {
        rank: rank.rank,
        source: rank.source.clone(),
        origin_ns: 0,
        streams: used.iter().map(|&s| StreamInfo { device: 0, stream: u64::from(s) }).collect(),
        threads: vec![0],
        gpu_ops,
        calls: Vec::new(),
        steps,
        stream_waits,
    })
}

/// A node's start: the recorded one if the trace records times, else as soon as its stream
/// and its dependencies allow (communication of unknown duration taking none).
/// Puts `op` on its stream: at the node's recorded start when the trace has times, else after
/// its waits, `dep_end` and the stream's last op. Returns its index in `pending` and its end.
fn place(
    pending: &mut Vec<Pending>,
    stream_free: &mut BTreeMap<u32, u64>,
    node: &EtNode,
    recorded: bool,
    dep_end: u64,
    mut op: Pending,
) -> (usize, u64) {
    let free = stream_free.get(&op.stream).copied().unwrap_or(0);
    let dep_end =
        op.waits.iter().map(|&w| pending[w].start_ns + pending[w].duration_ns).fold(dep_end, u64::max);
    op.start_ns = start_time(node, recorded, free, dep_end);
    let end = op.start_ns + op.duration_ns;
    stream_free.insert(op.stream, end);
    pending.push(op);
    (pending.len() - 1, end)
}

fn start_time(node: &EtNode, recorded: bool, stream_free: u64, dep_end: u64) -> u64 {
    match (recorded, node.start_ns) {
        (true, Some(start)) => start,
        _ => stream_free.max(dep_end),
    }
}

/// The GPU ops node `index` depends on, directly or through host nodes.
fn gpu_deps(
    rank: &EtRank,
    index: usize,
    index_of: &BTreeMap<u64, usize>,
    op_of_node: &[Option<usize>],
) -> Vec<usize> {
    let mut out = Vec::new();
    let mut stack: Vec<usize> =
        rank.nodes[index].deps.iter().filter_map(|d| index_of.get(d).copied()).collect();
    let mut seen = std::collections::BTreeSet::new();
    while let Some(d) = stack.pop() {
        if !seen.insert(d) {
            continue;
        }
        match op_of_node[d] {
            Some(op) => out.push(op),
            None => {
                if seen.len() < 4096 {
                    stack.extend(rank.nodes[d].deps.iter().filter_map(|x| index_of.get(x).copied()));
                }
            }
        }
    }
    out
}

/// Node indices in an order that respects `deps` (Kahn's algorithm, smallest id first); nodes
/// on a dependency cycle or naming missing nodes follow in id order.
fn topological(rank: &EtRank, index_of: &BTreeMap<u64, usize>) -> Vec<usize> {
    let n = rank.nodes.len();
    let mut indegree = vec![0usize; n];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, node) in rank.nodes.iter().enumerate() {
        let mut deps: Vec<usize> =
            node.deps.iter().filter_map(|d| index_of.get(d).copied()).filter(|&d| d != i).collect();
        deps.sort_unstable();
        deps.dedup();
        indegree[i] = deps.len();
        for d in deps {
            dependents[d].push(i);
        }
    }
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<(u64, usize)>> =
        (0..n).filter(|&i| indegree[i] == 0).map(|i| std::cmp::Reverse((rank.nodes[i].id, i))).collect();
    let mut order = Vec::with_capacity(n);
    let mut placed = vec![false; n];
    while let Some(std::cmp::Reverse((_, i))) = ready.pop() {
        order.push(i);
        placed[i] = true;
        for &d in &dependents[i] {
            indegree[d] -= 1;
            if indegree[d] == 0 {
                ready.push(std::cmp::Reverse((rank.nodes[d].id, d)));
            }
        }
    }
    if order.len() < n {
        let mut rest: Vec<usize> = (0..n).filter(|&i| !placed[i]).collect();
        rest.sort_by_key(|&i| rank.nodes[i].id);
        order.extend(rest);
    }
    order
}

/// Pairs `job` with `trace`, the Kineto trace of the same run: the replay is the Kineto
/// trace's (its measured kernels, launches and synchronizations), and the execution trace adds
/// what the Kineto trace lacks: the byte count of each collective whose NCCL kernel records
/// none. The k-th communication node of a kind on an execution-trace rank is the k-th NCCL
/// kernel of that kind (in start order) on the Kineto rank of the same number (or, with one
/// rank on each side, on that rank). Returns the trace, the warnings and a line saying what
/// was matched.
pub fn pair(
    job: &EtJob,
    mut trace: Trace,
    mut warnings: Warnings,
) -> Result<(Trace, Warnings, String), TraceError> {
    warnings.extend(&job.warnings);
    let single = job.ranks.len() == 1 && trace.ranks.len() == 1;
    let mut matched = 0u64;
    let mut filled = 0u64;
    let mut et_comm = 0u64;
    let mut et_compute = 0u64;
    for et_rank in &job.ranks {
        let position = if single { Some(0) } else { trace.ranks.iter().position(|r| r.rank == et_rank.rank) };
        let Some(position) = position else {
            let traced: Vec<String> = trace.ranks.iter().map(|r| r.rank.to_string()).collect();
            return Err(TraceError::Inconsistent {
                reason: format!(
                    "{} is rank {} (from its file name), but the Kineto trace has ranks {}: pair the execution trace of each rank with that rank's Kineto trace",
                    et_rank.source,
                    et_rank.rank,
                    traced.join(", ")
                ),
            });
        };
        let rank = &mut trace.ranks[position];
        let mut by_kind: BTreeMap<CollectiveType, Vec<&CommNode>> = BTreeMap::new();
        for node in &et_rank.nodes {
            match &node.role {
                Role::Comm(comm) => {
                    et_comm += 1;
                    by_kind.entry(comm.kind).or_default().push(comm);
                }
                Role::Compute(_) => et_compute += 1,
                _ => {}
            }
        }
        let mut order: Vec<usize> = (0..rank.gpu_ops.len()).collect();
        order.sort_by_key(|&i| (rank.gpu_ops[i].start_ns, i));
        let mut seen: BTreeMap<CollectiveType, usize> = BTreeMap::new();
        for i in order {
            if let GpuOpKind::Collective(call) = &mut rank.gpu_ops[i].kind {
                let k = seen.entry(call.kind).or_default();
                if let Some(comm) = by_kind.get(&call.kind).and_then(|list| list.get(*k)) {
                    matched += 1;
                    if call.bytes.is_none() && comm.bytes.is_some() {
                        call.bytes = comm.bytes;
                        filled += 1;
                    }
                }
                *k += 1;
            }
        }
    }
    let kernels: usize = trace.ranks.iter().map(|r| r.gpu_ops.len()).sum();
    let line = format!(
        "GPU op times from the Kineto trace ({kernels} GPU ops); the execution trace's {et_compute} GPU operators and {et_comm} communication nodes: {matched} communication nodes matched to NCCL kernels by kind and order, {filled} byte counts taken from the execution trace"
    );
    Ok((trace, warnings, line))
}

/// How many of the Kineto operators that launched GPU work (`operators`, one file per rank of
/// `trace`) match an execution-trace compute operator of the same rank by name and order (the
/// k-th `aten::mm` of one is the k-th of the other), as a clause for the pairing's report.
pub fn match_operators(job: &EtJob, trace: &Trace, operators: &crate::kineto::OperatorImport) -> String {
    let single = job.ranks.len() == 1 && operators.files.len() == 1;
    let mut matched = 0u64;
    let mut total = 0u64;
    for file in &operators.files {
        // The rank whose file has this name (archives are unpacked afresh for each read).
        let name = file.path.file_name();
        let rank = trace.ranks.iter().find(|r| Path::new(&r.source).file_name() == name).map(|r| r.rank);
        let et_rank = if single {
            job.ranks.first()
        } else {
            rank.and_then(|rank| job.ranks.iter().find(|r| r.rank == rank))
        };
        let mut et_names: BTreeMap<&str, u64> = BTreeMap::new();
        if let Some(et_rank) = et_rank {
            for node in &et_rank.nodes {
                if matches!(&node.role, Role::Compute(work) if !work.host) {
                    *et_names.entry(node.name.as_str()).or_default() += 1;
                }
            }
        }
        let mut kineto_names: BTreeMap<&str, u64> = BTreeMap::new();
        for op in &file.operators {
            let name = operators.name(op.name);
            if name.starts_with("aten::")
                && op.activities.iter().any(|a| a.kind != crate::kineto::operators::ActivityKind::Nccl)
            {
                *kineto_names.entry(name).or_default() += 1;
            }
        }
        for (name, count) in kineto_names {
            total += count;
            matched += count.min(et_names.get(name).copied().unwrap_or(0));
        }
    }
    format!(
        "; {matched} of the {total} Kineto aten operators that launched GPU work matched to execution-trace operators by name and order"
    )
}
