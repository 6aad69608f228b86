//! The execution-graph IR: what every rank does, on which stream, after what.
//!
//! Workload lowering, trace import and the engine all meet here, so a parallel strategy and a
//! replayed trace are simulated by the same code. An [`ExecGraph`] is a list of [`Op`]s:
//!
//! - [`OpKind::Compute`]: a kernel (or fused group of kernels) of known duration;
//! - [`OpKind::Transfer`]: a point-to-point message from the op's rank to another rank;
//! - [`OpKind::Collective`]: this rank's part in a collective (allreduce, ...). Every member of
//!   the collective's group has exactly one op for it; the collective begins when the last
//!   member reaches it (a rendezvous, as NCCL's kernels do) and ends for all members together;
//! - [`OpKind::Memcpy`]: a host <-> device copy.
//!
//! Ops on the same (rank, stream) run in the order they were added, like CUDA streams; an op
//! starts when its stream predecessor and all its dependencies are done. [`GraphBuilder::build`]
//! validates the whole graph: a dependency on a missing op, a rank, group or collective out of
//! range, a malformed collective and a dependency cycle (including deadlocks through collective
//! rendezvous: rank 0 doing A then B while rank 1 does B then A) are errors naming the op.
//!
//! ```
//! use sim_core::graph::{GraphBuilder, RankId, StreamId};
//! use sim_core::units::SimDuration;
//! let mut graph = GraphBuilder::new(2);
//! let forward = graph.compute(RankId(0), StreamId(0), SimDuration::from_us(10), "forward", &[]);
//! let send = graph.transfer(RankId(0), StreamId(1), RankId(1), "1 MiB".parse().unwrap(), "activations", &[forward]);
//! graph.compute(RankId(1), StreamId(0), SimDuration::from_us(10), "forward", &[send]);
//! let graph = graph.build().unwrap();
//! assert_eq!(graph.op_count(), 3);
//! ```

use crate::lookup::FastLookupMap;
use std::fmt;

use units::{Bytes, SimDuration};

mod meta;
mod ops;
pub use meta::{GroupKind, OpMeta, Origin, Pass, Work};
pub use ops::{Ops, OpsIter};

/// A rank: one device (GPU) of the simulated job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RankId(pub u32);

/// A stream of one rank (compute, communication, copy...), numbered from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u16);

/// An op, numbered densely in insertion order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u32);

/// A group of ranks that take part in collectives together (a communicator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupId(pub u32);

/// One collective operation instance, shared by the ops of all its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CollectiveId(pub u32);

/// An interned op name (layer and phase, kernel name...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LabelId(pub u32);

impl fmt::Display for RankId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}", self.0)
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op {}", self.0)
    }
}

/// What a collective computes. `Bytes` in [`Collective`] always means the size of the full
/// buffer, as nccl-tests' "size" column does: the input of an allreduce, the (gathered) output
/// of an allgather, the (unscattered) input of a reduce-scatter, one rank's whole send buffer
/// of an all-to-all, the message of a broadcast or reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    /// Every rank ends with the elementwise sum of all ranks' buffers.
    AllReduce,
    /// Every rank ends with its 1/p share of the sum.
    ReduceScatter,
    /// Every rank ends with the concatenation of all ranks' shares.
    AllGather,
    /// Every rank sends a distinct 1/p of its buffer to each rank.
    AllToAll,
    /// The root's buffer is copied to every rank.
    Broadcast {
        /// Position of the root in the group's rank list.
        root: u32,
    },
    /// The sum of all buffers ends at the root.
    Reduce {
        /// Position of the root in the group's rank list.
        root: u32,
    },
}

impl CollectiveKind {
    /// The name used in reports and traces (`allreduce`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "allreduce",
            CollectiveKind::ReduceScatter => "reduce-scatter",
            CollectiveKind::AllGather => "allgather",
            CollectiveKind::AllToAll => "all-to-all",
            CollectiveKind::Broadcast { .. } => "broadcast",
            CollectiveKind::Reduce { .. } => "reduce",
        }
    }
}

/// How a collective is carried out on the network (see the `schedule` module for each one's
/// steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveAlgorithm {
    /// Let the network model pick among the kind's candidates the one its alpha-beta estimate
    /// says is fastest on this topology, for this size and group, as NCCL's tuner does.
    Auto,
    /// A ring (reduce-scatter then allgather for allreduce), with rail-aligned channels.
    Ring,
    /// NCCL's double binary tree: two trees, each reducing then broadcasting half the buffer
    /// in pipelined chunks (allreduce).
    DoubleBinaryTree,
    /// NCCL's topology-aware tree (allreduce): a chain through the GPUs of each server and a
    /// double binary tree across servers, one pair of trees per channel, each channel's
    /// trees entering and leaving the servers through another GPU (and NIC); pipelined
    /// chunks reduced up and broadcast down.
    Tree,
    /// NVLink SHARP (allreduce inside one server): the NVSwitch reduces what the GPUs send it
    /// and multicasts the result (NVSwitch 3, Hopper and later).
    Nvls,
    /// NVLink SHARP inside every server and a tree across servers, pipelined (allreduce).
    NvlsTree,
    /// NCCL's CollNet Direct (allreduce; NVSwitch servers, InfiniBand switches with SHARP):
    /// every GPU sends each NIC owner of its server its share, the switches reduce across
    /// servers, the results come back directly.
    CollNetDirect,
    /// NCCL's CollNet Chain (allreduce; InfiniBand switches with SHARP): a chain through each
    /// server's GPUs per channel reduces towards the NIC, the switches reduce across servers,
    /// the chain broadcasts the result.
    CollNetChain,
    /// Rabenseifner's recursive halving reduce-scatter then recursive doubling allgather
    /// (allreduce); either half alone for a reduce-scatter or an allgather over a
    /// power-of-two group (a ring otherwise).
    HalvingDoubling,
    /// Full-buffer exchanges with partners at doubling distances (allreduce, small messages).
    RecursiveDoubling,
    /// Reduce-scatter inside each server, a ring allreduce across servers per local rank, an
    /// allgather inside each server (allreduce; as NCCL/Horovod hierarchical).
    Hierarchical,
    /// A binomial tree rooted at the root (broadcast, reduce).
    BinomialTree,
    /// A pipelined chain from the root in group order (broadcast, reduce).
    Chain,
    /// p-1 rounds; in round k rank i sends to rank i+k (all-to-all).
    Pairwise,
    /// Every rank sends to every other at once (all-to-all, as NCCL's grouped send/receive).
    Direct,
}

impl CollectiveAlgorithm {
    /// Every algorithm, in the order listed in messages.
    pub const ALL: [CollectiveAlgorithm; 15] = [
        CollectiveAlgorithm::Auto,
        CollectiveAlgorithm::Ring,
        CollectiveAlgorithm::Tree,
        CollectiveAlgorithm::Nvls,
        CollectiveAlgorithm::NvlsTree,
        CollectiveAlgorithm::CollNetDirect,
        CollectiveAlgorithm::CollNetChain,
        CollectiveAlgorithm::DoubleBinaryTree,
        CollectiveAlgorithm::HalvingDoubling,
        CollectiveAlgorithm::RecursiveDoubling,
        CollectiveAlgorithm::Hierarchical,
        CollectiveAlgorithm::BinomialTree,
        CollectiveAlgorithm::Chain,
        CollectiveAlgorithm::Pairwise,
        CollectiveAlgorithm::Direct,
    ];

    /// The name used in scenario files and reports.
    pub fn name(self) -> &'static str {
        match self {
            CollectiveAlgorithm::Auto => "auto",
            CollectiveAlgorithm::Ring => "ring",
            CollectiveAlgorithm::DoubleBinaryTree => "double-binary-tree",
            CollectiveAlgorithm::Tree => "tree",
            CollectiveAlgorithm::Nvls => "nvls",
            CollectiveAlgorithm::NvlsTree => "nvls-tree",
            CollectiveAlgorithm::CollNetDirect => "collnet-direct",
            CollectiveAlgorithm::CollNetChain => "collnet-chain",
            CollectiveAlgorithm::HalvingDoubling => "halving-doubling",
            CollectiveAlgorithm::RecursiveDoubling => "recursive-doubling",
            CollectiveAlgorithm::Hierarchical => "hierarchical",
            CollectiveAlgorithm::BinomialTree => "binomial-tree",
            CollectiveAlgorithm::Chain => "chain",
            CollectiveAlgorithm::Pairwise => "pairwise",
            CollectiveAlgorithm::Direct => "direct",
        }
    }

    /// True if this algorithm can carry out `kind` (`Auto` can carry out every kind).
    pub fn supports(self, kind: CollectiveKind) -> bool {
        use CollectiveAlgorithm::*;
        use CollectiveKind::*;
        match self {
            Auto => true,
            Ring => matches!(kind, AllReduce | ReduceScatter | AllGather),
            HalvingDoubling => matches!(kind, AllReduce | ReduceScatter | AllGather),
            DoubleBinaryTree | Tree | Nvls | NvlsTree | CollNetDirect | CollNetChain | RecursiveDoubling
            | Hierarchical => kind == AllReduce,
            BinomialTree | Chain => matches!(kind, Broadcast { .. } | Reduce { .. }),
            Pairwise | Direct => kind == AllToAll,
        }
    }

    /// What `Auto` chooses among for `kind`: NCCL's algorithms for it (ring, NCCL's
    /// topology-aware tree and, where the NVSwitches can reduce, NVLS and NVLS-tree for
    /// allreduce; ring for reduce-scatter and allgather; pipelined chain for broadcast and
    /// reduce, plus the binomial tree MPI libraries use for small messages; all-to-all as all
    /// sends at once or in pairwise rounds).
    pub fn candidates(kind: CollectiveKind) -> &'static [CollectiveAlgorithm] {
        use CollectiveAlgorithm::*;
        use CollectiveKind::*;
        match kind {
            AllReduce => &[Ring, Tree, Nvls, NvlsTree, CollNetDirect, CollNetChain],
            ReduceScatter | AllGather => &[Ring],
            Broadcast { .. } | Reduce { .. } => &[Chain, BinomialTree],
            AllToAll => &[Direct, Pairwise],
        }
    }
}

impl std::str::FromStr for CollectiveAlgorithm {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        CollectiveAlgorithm::ALL.into_iter().find(|a| a.name() == name).ok_or_else(|| {
            let valid: Vec<&str> = CollectiveAlgorithm::ALL.iter().map(|a| a.name()).collect();
            format!("unknown algorithm {name:?}; valid: {}", valid.join(", "))
        })
    }
}

/// One collective operation: what, among whom, how big, how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Collective {
    /// What it computes.
    pub kind: CollectiveKind,
    /// Who takes part.
    pub group: GroupId,
    /// Size of the full buffer (see [`CollectiveKind`]).
    pub bytes: Bytes,
    /// How it is carried out.
    pub algorithm: CollectiveAlgorithm,
}

/// Direction of a host <-> device copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemcpyDirection {
    /// Host memory to the device.
    HostToDevice,
    /// Device memory to the host.
    DeviceToHost,
}

/// What an op does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Busy the stream for `duration`.
    Compute {
        /// How long the kernel runs.
        duration: SimDuration,
    },
    /// Send `bytes` from the op's rank to `dst`; done when the last byte has arrived.
    Transfer {
        /// The receiving rank.
        dst: RankId,
        /// Message size.
        bytes: Bytes,
    },
    /// This rank's part in a collective.
    Collective(CollectiveId),
    /// Copy `bytes` between the rank's device and its host.
    Memcpy {
        /// Which way.
        direction: MemcpyDirection,
        /// How much.
        bytes: Bytes,
    },
}

impl OpKind {
    /// True for ops that move data (transfers, collectives, copies) rather than compute.
    pub fn is_communication(&self) -> bool {
        !matches!(self, OpKind::Compute { .. })
    }
}

/// One operation on one (rank, stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Op {
    /// What it does.
    pub kind: OpKind,
    /// The rank that issues it.
    pub rank: RankId,
    /// The stream it occupies.
    pub stream: StreamId,
    /// Its name.
    pub label: LabelId,
    /// What it is for ([`OpMeta`]): where its time goes, its layer, pass, communicator and
    /// origin. [`OpMeta::NONE`] when the builder does not say.
    pub meta: OpMeta,
}

/// A graph that is not well formed; every variant names the op (or group, or collective) at
/// fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// An op depends on an op that does not exist.
    #[error("{op} ({label:?}) depends on op {dependency}, but the graph has only {op_count} ops")]
    MissingDependency {
        /// The op with the bad dependency.
        op: OpId,
        /// Its label.
        label: String,
        /// The id it names.
        dependency: u32,
        /// How many ops exist.
        op_count: usize,
    },
    /// An op names a rank past the end.
    #[error("{op} ({label:?}) is on or sends to {rank}, but the graph has only {ranks} ranks")]
    RankOutOfRange {
        /// The op.
        op: OpId,
        /// Its label.
        label: String,
        /// The rank it names.
        rank: RankId,
        /// How many ranks exist.
        ranks: u32,
    },
    /// A transfer from a rank to itself.
    #[error("{op} ({label:?}) sends from {rank} to itself")]
    SelfTransfer {
        /// The op.
        op: OpId,
        /// Its label.
        label: String,
        /// The rank.
        rank: RankId,
    },
    /// An op names a collective that does not exist.
    #[error(
        "{op} ({label:?}) takes part in collective {collective}, but the graph has only {count} collectives"
    )]
    CollectiveOutOfRange {
        /// The op.
        op: OpId,
        /// Its label.
        label: String,
        /// The collective id it names.
        collective: u32,
        /// How many exist.
        count: usize,
    },
    /// A group or collective is malformed (unknown group, empty group, a rank twice, a rank
    /// past the end, a root outside the group, an algorithm that cannot do the kind).
    #[error("{what}: {reason}")]
    BadCollective {
        /// Which group or collective.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// The members' ops of a collective do not match its group.
    #[error("collective {collective} ({kind}, group {group}): {reason}")]
    Membership {
        /// The collective.
        collective: u32,
        /// Its kind.
        kind: &'static str,
        /// Its group.
        group: u32,
        /// What is wrong, naming the op or rank.
        reason: String,
    },
    /// More origins than op metadata can name ([`Origin::MAX`]).
    #[error("the graph names {count} op origins; op metadata names at most 63")]
    TooManyOrigins {
        /// Origins interned.
        count: usize,
    },
    /// More ops than a 32-bit `OpId` can number.
    #[error("the graph has {op_count} ops; parasim numbers at most 4,294,967,294")]
    TooLarge {
        /// Ops added.
        op_count: usize,
    },
    /// Chunks of the builder went to a streamed run ([`GraphBuilder::take_chunk`]): the
    /// rest is not a whole graph.
    #[error("the builder's first {ops} ops went out in chunks: it no longer holds a whole graph")]
    ChunksTaken {
        /// Ops taken out.
        ops: u32,
    },
    /// A graph with folded symmetric ranks was to be copied onto other ranks
    /// ([`GraphBuilder::append`]).
    #[error(
        "a graph with folded symmetric ranks cannot be placed on other ranks: lower it with every rank simulated"
    )]
    Folded,
    /// Two graphs meant to differ only in compute durations differ elsewhere
    /// ([`ExecGraph::take_compute_times`]).
    #[error("{op} ({label:?}): {reason}")]
    Mismatch {
        /// The first op that differs.
        op: OpId,
        /// Its label.
        label: String,
        /// What differs.
        reason: String,
    },
    /// The graph can never finish: the listed ops wait on each other.
    #[error("dependency cycle (deadlock): {cycle}")]
    Cycle {
        /// The ops on the cycle, in order, each with label, rank and stream.
        cycle: String,
    },
}

/// Accumulates ops, groups and collectives; [`GraphBuilder::build`] validates them into an
/// [`ExecGraph`].
#[derive(Debug, Clone, Default)]
pub struct GraphBuilder {
    ranks: u32,
    ops: Ops,
    dep_offsets: Vec<u32>,
    deps: Vec<OpId>,
    groups: Vec<Vec<RankId>>,
    collectives: Vec<Collective>,
    labels: Vec<String>,
    label_ids: FastLookupMap<String, LabelId>,
    /// The label [`GraphBuilder::label`] returned last (if `labels` has it): ops in a row
    /// mostly share one, which is then found without hashing the name.
    last_label: u32,
    images: Vec<Vec<RankId>>,
    /// Compute ops that run slower beside communication, with their duration when they do.
    beside_communication: Vec<(OpId, SimDuration)>,
    /// Names of the layers ops' metadata index ([`OpMeta::layer`]).
    layer_names: Vec<String>,
    /// Names of the origins ops' metadata name ([`OpMeta::origin`]), from [`Origin`] 1.
    origins: Vec<String>,
    /// The id of `ops[0]`: ops before it went out in chunks ([`GraphBuilder::take_chunk`]).
    op_base: u32,
    /// The id of `collectives[0]`, likewise.
    collective_base: u32,
}

/// The ops (and their collectives) added to a [`GraphBuilder`] since its last chunk, checked,
/// for a streamed run ([`crate::stream`]).
#[derive(Debug, Clone)]
pub struct GraphChunk {
    /// The id of the first op.
    pub(crate) first: OpId,
    pub(crate) ops: Vec<Op>,
    /// `deps[dep_offsets[i]..dep_offsets[i + 1]]` are op `i`'s dependencies.
    pub(crate) dep_offsets: Vec<u32>,
    pub(crate) deps: Vec<OpId>,
    pub(crate) collectives: Vec<Collective>,
    /// Slowed kernels ([`GraphBuilder::compute_slowed`]) among the ops.
    pub(crate) beside: Vec<(OpId, SimDuration)>,
}

impl GraphChunk {
    /// Number of ops.
    pub fn op_count(&self) -> usize {
        self.ops.len()
    }
}

impl GraphBuilder {
    /// An empty graph over `ranks` ranks.
    pub fn new(ranks: u32) -> Self {
        GraphBuilder { ranks, dep_offsets: vec![0], ..Default::default() }
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// Number of ops added so far (chunks taken out included); the next op gets this id.
    pub fn op_count(&self) -> usize {
        self.op_base as usize + self.ops.len()
    }

    /// Number of collective instances added so far (chunks taken out included).
    pub fn collective_count(&self) -> usize {
        self.collective_base as usize + self.collectives.len()
    }

    /// The ranks of `group`, in ring order.
    pub fn group(&self, group: GroupId) -> &[RankId] {
        &self.groups[group.0 as usize]
    }

    /// The rank maps set by [`GraphBuilder::set_symmetry`].
    pub fn images(&self) -> &[Vec<RankId>] {
        &self.images
    }

    /// The name of `label`.
    pub fn label_name(&self, label: LabelId) -> &str {
        &self.labels[label.0 as usize]
    }

    /// The origin named `name`, if interned.
    pub fn find_origin(&self, name: &str) -> Option<Origin> {
        self.origins.iter().position(|known| known == name).map(|index| Origin(index as u8 + 1))
    }

    /// The name of layer `layer` ([`GraphBuilder::set_layer_names`]).
    pub fn layer_name(&self, layer: u32) -> Option<&str> {
        self.layer_names.get(layer as usize).map(String::as_str)
    }

    /// Checks the ops added since the last chunk and hands them out, with their collectives,
    /// for a streamed run ([`crate::stream`]); ids go on where they stopped, and later ops may
    /// depend on these. Checked as [`GraphBuilder::build`] checks a graph, except for cycles
    /// (a streamed run that cannot go on reports the ops it stalled on).
    pub fn take_chunk(&mut self) -> Result<GraphChunk, GraphError> {
        let op_count = self.op_count();
        if op_count >= u32::MAX as usize {
            return Err(GraphError::TooLarge { op_count });
        }
        if self.origins.len() > Origin::MAX {
            return Err(GraphError::TooManyOrigins { count: self.origins.len() });
        }
        self.check_groups_and_collectives()?;
        let base = self.op_base;
        let describe = |index: usize| self.labels[self.ops[index].label.0 as usize].clone();
        for (index, op) in self.ops.iter().enumerate() {
            let id = OpId(base + index as u32);
            let mut ranks = [op.rank, op.rank];
            match op.kind {
                OpKind::Transfer { dst, .. } => {
                    if dst == op.rank {
                        return Err(GraphError::SelfTransfer { op: id, label: describe(index), rank: dst });
                    }
                    ranks[1] = dst;
                }
                OpKind::Collective(collective)
                    if collective.0 < self.collective_base
                        || collective.0 as usize >= self.collective_count() =>
                {
                    return Err(GraphError::CollectiveOutOfRange {
                        op: id,
                        label: describe(index),
                        collective: collective.0,
                        count: self.collective_count(),
                    });
                }
                _ => {}
            }
            if let Some(&rank) = ranks.iter().find(|rank| rank.0 >= self.ranks) {
                return Err(GraphError::RankOutOfRange {
                    op: id,
                    label: describe(index),
                    rank,
                    ranks: self.ranks,
                });
            }
            let deps = &self.deps[self.dep_offsets[index] as usize..self.dep_offsets[index + 1] as usize];
            if let Some(dep) = deps.iter().find(|dep| dep.0 as usize >= op_count) {
                return Err(GraphError::MissingDependency {
                    op: id,
                    label: describe(index),
                    dependency: dep.0,
                    op_count,
                });
            }
        }
        // Membership, with ops and collectives counted from this chunk's first.
        let mut member_count = vec![0u32; self.collectives.len()];
        for op in &self.ops {
            if let OpKind::Collective(c) = op.kind {
                member_count[(c.0 - self.collective_base) as usize] += 1;
            }
        }
        let member_offsets = prefix_sums(&member_count);
        let mut members = vec![OpId(0); *member_offsets.last().unwrap_or(&0) as usize];
        let mut fill = member_offsets.clone();
        for (index, op) in self.ops.iter().enumerate() {
            if let OpKind::Collective(c) = op.kind {
                let c = (c.0 - self.collective_base) as usize;
                members[fill[c] as usize] = OpId(index as u32);
                fill[c] += 1;
            }
        }
        self.check_membership(&member_offsets, &members)?;
        let chunk = GraphChunk {
            first: OpId(base),
            dep_offsets: std::mem::replace(&mut self.dep_offsets, vec![0]),
            deps: std::mem::take(&mut self.deps),
            collectives: std::mem::take(&mut self.collectives),
            beside: std::mem::take(&mut self.beside_communication),
            ops: self.ops.take_all(),
        };
        self.op_base += chunk.ops.len() as u32;
        self.collective_base += chunk.collectives.len() as u32;
        Ok(chunk)
    }

    /// Makes room for `ops` more ops with `deps` more dependencies in all, so that adding them
    /// does not grow (and copy) the graph's arrays again and again.
    pub fn reserve(&mut self, ops: usize, deps: usize) {
        self.ops.reserve(ops);
        self.dep_offsets.reserve(ops);
        self.deps.reserve(deps);
    }

    /// Stores each op as it comes, without looking for an equal one first: for graphs whose
    /// ops are all distinct by construction (a traffic matrix's flows). Only storage and the
    /// time to build change; call it before the first op (later it does nothing).
    pub fn distinct_ops(&mut self) {
        self.ops.start_plain();
    }

    /// Makes room for `additional` more labels (a lowering interns a few per layer).
    pub fn reserve_labels(&mut self, additional: usize) {
        self.labels.reserve(additional);
        self.label_ids.reserve(additional);
    }

    /// Interns `name` and returns its id (the same name always gets the same id).
    pub fn label(&mut self, name: &str) -> LabelId {
        if self.labels.get(self.last_label as usize).is_some_and(|last| last == name) {
            return LabelId(self.last_label);
        }
        let id = match self.label_ids.get(name) {
            Some(&id) => id,
            None => {
                let id = LabelId(self.labels.len() as u32);
                self.labels.push(name.to_string());
                self.label_ids.insert(name.to_string(), id);
                id
            }
        };
        self.last_label = id.0;
        id
    }

    /// Names the layers that ops' metadata index ([`OpMeta::layer`]): `names[i]` is layer
    /// `i`'s.
    pub fn set_layer_names(&mut self, names: Vec<String>) {
        self.layer_names = names;
    }

    /// Interns the origin `name` (a policy or mechanism that emits ops) and returns its id for
    /// [`OpMeta::with_origin`] (the same name always gets the same id). A graph names at most
    /// [`Origin::MAX`]; [`GraphBuilder::build`] refuses more.
    pub fn origin(&mut self, name: &str) -> Origin {
        if let Some(position) = self.origins.iter().position(|known| known == name) {
            return Origin(position as u8 + 1);
        }
        self.origins.push(name.to_string());
        Origin(self.origins.len().min(Origin::MAX) as u8)
    }

    /// Sets dependency `index` of op `op`, already added (and not taken out in a chunk), to
    /// `dep`: for a builder that adds an op before it knows the id of one it waits for (a
    /// lowering that appends each rank's ops as soon as they are made, and fills in the ids
    /// of later ranks' ops once those are added). Nothing if `op` or `index` is out of range.
    pub fn set_dep(&mut self, op: OpId, index: usize, dep: OpId) {
        let Some(at) = op.0.checked_sub(self.op_base).map(|at| at as usize) else { return };
        if let (Some(&start), Some(&end)) = (self.dep_offsets.get(at), self.dep_offsets.get(at + 1))
            && index < (end - start) as usize
        {
            self.deps[start as usize + index] = dep;
        }
    }

    /// Sets the metadata of op `op`, already added (graphs built op by op with
    /// [`GraphBuilder::compute`] and its siblings, which add [`OpMeta::NONE`]).
    pub fn set_meta(&mut self, op: OpId, meta: OpMeta) {
        if let Some(index) = op.0.checked_sub(self.op_base).map(|index| index as usize)
            && let Some(&op) = self.ops.get(index)
        {
            self.ops.set(index, Op { meta, ..op });
        }
    }

    /// Declares the job symmetric under each rank map of `images` (`images[i][r]`: the rank
    /// that plays rank `r`'s role in copy `i`), so that only representative ranks need ops:
    /// a rank without ops stands for the copy of a rank that has them. Collectives may then
    /// list ranks without a member op (they arrive with their representative), and the executor
    /// replays every transfer and collective on each image ("shadows") so the network still
    /// carries every rank's traffic. Each map must be a permutation of the ranks.
    pub fn set_symmetry(&mut self, images: Vec<Vec<RankId>>) {
        self.images = images;
    }

    /// Adds a communicator over `ranks` (in ring order) and returns its id.
    pub fn add_group(&mut self, ranks: Vec<RankId>) -> GroupId {
        self.groups.push(ranks);
        GroupId(self.groups.len() as u32 - 1)
    }

    /// Adds a collective instance; each member then adds its op with [`GraphBuilder::collective`].
    pub fn add_collective(&mut self, collective: Collective) -> CollectiveId {
        self.collectives.push(collective);
        CollectiveId(self.collective_base + self.collectives.len() as u32 - 1)
    }

    /// Adds `op`, which starts only after every op in `deps` is done (and after the previous op
    /// on its stream), and returns its id. Dependencies may name ops added later; `build`
    /// checks that they exist.
    pub fn add_op(&mut self, op: Op, deps: &[OpId]) -> OpId {
        self.ops.push(op);
        self.deps.extend_from_slice(deps);
        self.dep_offsets.push(self.deps.len() as u32);
        OpId(self.op_base + self.ops.len() as u32 - 1)
    }

    /// Adds a compute op of known duration.
    pub fn compute(
        &mut self,
        rank: RankId,
        stream: StreamId,
        duration: SimDuration,
        label: &str,
        deps: &[OpId],
    ) -> OpId {
        let label = self.label(label);
        self.add_op(Op { kind: OpKind::Compute { duration }, rank, stream, label, meta: OpMeta::NONE }, deps)
    }

    /// Adds a compute op like [`GraphBuilder::compute`] that runs slower while its rank's GPU
    /// also communicates: it takes `beside_communication` (at least `duration`) if a transfer,
    /// copy or collective of its rank runs the whole time, and in proportion for a partial
    /// overlap (the executor advances it at `1 / duration` of its work per second alone and
    /// `1 / beside_communication` beside communication). For kernels sharing the GPU's
    /// multiprocessors and memory with NCCL's kernels and copies (docs/compute-model.md).
    pub fn compute_slowed(
        &mut self,
        rank: RankId,
        stream: StreamId,
        duration: SimDuration,
        beside_communication: SimDuration,
        label: &str,
        deps: &[OpId],
    ) -> OpId {
        let op = self.compute(rank, stream, duration, label, deps);
        self.slow_beside_communication(op, beside_communication);
        op
    }

    /// Makes compute op `op`, already added, one that takes `beside_communication` fully
    /// beside its rank's communication ([`GraphBuilder::compute_slowed`]); nothing for another
    /// kind of op or a duration that is not longer.
    pub fn slow_beside_communication(&mut self, op: OpId, beside_communication: SimDuration) {
        if let Some(Op { kind: OpKind::Compute { duration }, .. }) =
            op.0.checked_sub(self.op_base).and_then(|index| self.ops.get(index as usize))
            && beside_communication > *duration
        {
            self.beside_communication.push((op, beside_communication));
        }
    }

    /// Adds a point-to-point transfer of `bytes` from `rank` to `dst`, issued on `rank`'s `stream`.
    pub fn transfer(
        &mut self,
        rank: RankId,
        stream: StreamId,
        dst: RankId,
        bytes: Bytes,
        label: &str,
        deps: &[OpId],
    ) -> OpId {
        let label = self.label(label);
        self.add_op(
            Op { kind: OpKind::Transfer { dst, bytes }, rank, stream, label, meta: OpMeta::NONE },
            deps,
        )
    }

    /// Adds `rank`'s part in `collective`.
    pub fn collective(
        &mut self,
        rank: RankId,
        stream: StreamId,
        collective: CollectiveId,
        label: &str,
        deps: &[OpId],
    ) -> OpId {
        let label = self.label(label);
        self.add_op(
            Op { kind: OpKind::Collective(collective), rank, stream, label, meta: OpMeta::NONE },
            deps,
        )
    }

    /// Adds a host <-> device copy.
    pub fn memcpy(
        &mut self,
        rank: RankId,
        stream: StreamId,
        direction: MemcpyDirection,
        bytes: Bytes,
        label: &str,
        deps: &[OpId],
    ) -> OpId {
        let label = self.label(label);
        self.add_op(
            Op { kind: OpKind::Memcpy { direction, bytes }, rank, stream, label, meta: OpMeta::NONE },
            deps,
        )
    }

    /// Copies every op, communicator group and collective of `graph` into this builder, with
    /// rank `r` of `graph` played by rank `ranks[r]` of this one, and returns the id of the
    /// first op copied (the others follow in order, so `graph`'s op `i` is that plus `i`).
    /// Several jobs sharing one cluster are built this way: each lowered on its own ranks,
    /// then placed on the cluster's GPUs. Labels, layer names and origins are interned again;
    /// dependencies, groups and collective ids are shifted. With `not_before` above zero, no
    /// op of `graph` starts before it: each rank with ops gets a compute op of that duration
    /// (labelled `not before`, on a stream of its own after `graph`'s), added after `graph`'s
    /// ops, and every op without a dependency waits for its rank's.
    ///
    /// A graph with folded symmetric ranks ([`ExecGraph::images`]) is refused: its shadows
    /// replay traffic on ranks by a map of its own ranks, which placing them would break.
    pub fn append(
        &mut self,
        graph: &ExecGraph,
        ranks: &[RankId],
        not_before: SimDuration,
    ) -> Result<OpId, GraphError> {
        if !graph.images.is_empty() {
            return Err(GraphError::Folded);
        }
        if ranks.len() < graph.ranks as usize {
            return Err(GraphError::BadCollective {
                what: "appended graph".into(),
                reason: format!("has {} ranks, but only {} are placed", graph.ranks, ranks.len()),
            });
        }
        let first = OpId(
            u32::try_from(self.op_count()).map_err(|_| GraphError::TooLarge { op_count: self.op_count() })?,
        );
        let place = |rank: RankId| ranks[rank.0 as usize];
        let labels: Vec<LabelId> = graph.labels.iter().map(|name| self.label(name)).collect();
        let origins: Vec<Origin> = graph.origins.iter().map(|name| self.origin(name)).collect();
        let layer_base = self.layer_names.len() as u32;
        self.layer_names.extend(graph.layer_names.iter().cloned());
        let group_base = self.groups.len() as u32;
        for group in &graph.groups {
            self.groups.push(group.iter().map(|&rank| place(rank)).collect());
        }
        let collective_base = self.collective_count() as u32;
        for collective in &graph.collectives {
            self.collectives
                .push(Collective { group: GroupId(group_base + collective.group.0), ..*collective });
        }
        // The rank's `not before` op: its index among the ranks with ops, in rank order.
        let delayed = not_before > SimDuration::ZERO;
        let mut delay_of = vec![u32::MAX; graph.ranks as usize];
        let mut delayed_ranks = Vec::new();
        if delayed {
            for op in &graph.ops {
                let slot = &mut delay_of[op.rank.0 as usize];
                if *slot == u32::MAX {
                    *slot = 0;
                }
            }
            for (rank, slot) in delay_of.iter_mut().enumerate() {
                if *slot == 0 {
                    *slot = delayed_ranks.len() as u32;
                    delayed_ranks.push(RankId(rank as u32));
                }
            }
        }
        let delay_base = first.0 as u64 + graph.ops.len() as u64;
        if delay_base + delayed_ranks.len() as u64 >= u64::from(u32::MAX) {
            return Err(GraphError::TooLarge { op_count: delay_base as usize + delayed_ranks.len() });
        }
        self.reserve(graph.ops.len() + delayed_ranks.len(), graph.deps.len() + delayed_ranks.len());
        let mut deps = Vec::new();
        for (index, op) in graph.ops.iter().enumerate() {
            let mut meta = op.meta;
            if let Some(layer) = meta.layer() {
                meta = meta.with_layer(layer_base + layer);
            }
            if meta.origin() != Origin::NONE
                && let Some(&origin) = origins.get(usize::from(meta.origin().0) - 1)
            {
                meta = meta.with_origin(origin);
            }
            let kind = match op.kind {
                OpKind::Transfer { dst, bytes } => OpKind::Transfer { dst: place(dst), bytes },
                OpKind::Collective(id) => OpKind::Collective(CollectiveId(collective_base + id.0)),
                other => other,
            };
            deps.clear();
            let own = graph.deps(OpId(index as u32));
            deps.extend(own.iter().map(|dep| OpId(first.0 + dep.0)));
            if delayed && own.is_empty() {
                deps.push(OpId((delay_base + u64::from(delay_of[op.rank.0 as usize])) as u32));
            }
            let id = self.add_op(
                Op {
                    kind,
                    rank: place(op.rank),
                    stream: op.stream,
                    label: labels[op.label.0 as usize],
                    meta,
                },
                &deps,
            );
            if let Some(&slowed) = graph.beside_communication.get(index)
                && slowed > SimDuration::ZERO
            {
                self.beside_communication.push((id, slowed));
            }
        }
        let stream = StreamId(graph.streams_per_rank);
        let label = self.label("not before");
        let meta = OpMeta::NONE.with_work(crate::graph::Work::Wait);
        for rank in delayed_ranks {
            let op =
                Op { kind: OpKind::Compute { duration: not_before }, rank: place(rank), stream, label, meta };
            self.add_op(op, &[]);
        }
        Ok(first)
    }

    /// Validates the graph and builds the indexes the executor needs.
    pub fn build(self) -> Result<ExecGraph, GraphError> {
        let op_count = self.ops.len();
        if self.op_base > 0 || self.collective_base > 0 {
            return Err(GraphError::ChunksTaken { ops: self.op_base });
        }
        if op_count >= u32::MAX as usize {
            return Err(GraphError::TooLarge { op_count });
        }
        let describe = |id: usize| self.labels[self.ops[id].label.0 as usize].clone();
        if self.origins.len() > Origin::MAX {
            return Err(GraphError::TooManyOrigins { count: self.origins.len() });
        }
        self.check_groups_and_collectives()?;
        for (index, image) in self.images.iter().enumerate() {
            let mut seen = vec![false; self.ranks as usize];
            let valid = image.len() == self.ranks as usize
                && image
                    .iter()
                    .all(|rank| rank.0 < self.ranks && !std::mem::replace(&mut seen[rank.0 as usize], true));
            if !valid {
                return Err(GraphError::BadCollective {
                    what: format!("symmetry {index}"),
                    reason: format!("is not a permutation of the {} ranks", self.ranks),
                });
            }
        }

        // Ops: ranks, collectives, dependencies.
        for (index, op) in self.ops.iter().enumerate() {
            let id = OpId(index as u32);
            // The op's rank and, for a transfer, its destination (no allocation per op).
            let mut ranks = [op.rank, op.rank];
            match op.kind {
                OpKind::Transfer { dst, .. } => {
                    if dst == op.rank {
                        return Err(GraphError::SelfTransfer { op: id, label: describe(index), rank: dst });
                    }
                    ranks[1] = dst;
                }
                OpKind::Collective(collective) if collective.0 as usize >= self.collectives.len() => {
                    return Err(GraphError::CollectiveOutOfRange {
                        op: id,
                        label: describe(index),
                        collective: collective.0,
                        count: self.collectives.len(),
                    });
                }
                _ => {}
            }
            if let Some(&rank) = ranks.iter().find(|rank| rank.0 >= self.ranks) {
                return Err(GraphError::RankOutOfRange {
                    op: id,
                    label: describe(index),
                    rank,
                    ranks: self.ranks,
                });
            }
            let deps = &self.deps[self.dep_offsets[index] as usize..self.dep_offsets[index + 1] as usize];
            if let Some(dep) = deps.iter().find(|dep| dep.0 as usize >= op_count) {
                return Err(GraphError::MissingDependency {
                    op: id,
                    label: describe(index),
                    dependency: dep.0,
                    op_count,
                });
            }
        }

        // Collective members: one op per group rank, no op from outside the group.
        let mut member_count = vec![0u32; self.collectives.len()];
        for op in &self.ops {
            if let OpKind::Collective(c) = op.kind {
                member_count[c.0 as usize] += 1;
            }
        }
        let member_offsets = prefix_sums(&member_count);
        let mut members = vec![OpId(0); *member_offsets.last().unwrap_or(&0) as usize];
        let mut fill = member_offsets.clone();
        for (index, op) in self.ops.iter().enumerate() {
            if let OpKind::Collective(c) = op.kind {
                members[fill[c.0 as usize] as usize] = OpId(index as u32);
                fill[c.0 as usize] += 1;
            }
        }
        self.check_membership(&member_offsets, &members)?;

        // Stream order: each op's predecessor and successor on its (rank, stream), tracked in
        // a dense table indexed by rank * streams + stream.
        let streams_per_rank = self.ops.iter().map(|op| op.stream.0.saturating_add(1)).max().unwrap_or(0);
        let mut last_on_stream = vec![NO_OP; self.ranks as usize * usize::from(streams_per_rank)];
        let mut stream_heads = vec![NO_OP; last_on_stream.len()];
        let mut next_in_stream = vec![NO_OP; op_count];
        let mut has_previous = vec![0u64; op_count.div_ceil(64)];
        for (index, op) in self.ops.iter().enumerate() {
            let slot = op.rank.0 as usize * usize::from(streams_per_rank) + usize::from(op.stream.0);
            let previous = std::mem::replace(&mut last_on_stream[slot], OpId(index as u32));
            if previous != NO_OP {
                next_in_stream[previous.0 as usize] = OpId(index as u32);
                has_previous[index / 64] |= 1 << (index % 64);
            } else {
                stream_heads[slot] = OpId(index as u32);
            }
        }

        // Dependents (reverse of deps), as a compressed adjacency list, built in the offsets'
        // own array (no per-op count or cursor array beside it: 8 bytes per op less at the
        // peak of a graph of millions of ops). Counts first, at `op + 1`; summed in place,
        // `dependent_offsets[op]` is where `op`'s list starts and serves as its cursor while
        // the list is filled, which leaves it at the next op's start: shifted back by one.
        let mut dependent_offsets = vec![0u32; op_count + 1];
        for dep in &self.deps {
            dependent_offsets[dep.0 as usize + 1] += 1;
        }
        for index in 1..dependent_offsets.len() {
            dependent_offsets[index] += dependent_offsets[index - 1];
        }
        let mut dependents = vec![OpId(0); self.deps.len()];
        for index in 0..op_count {
            for dep in &self.deps[self.dep_offsets[index] as usize..self.dep_offsets[index + 1] as usize] {
                let cursor = &mut dependent_offsets[dep.0 as usize];
                dependents[*cursor as usize] = OpId(index as u32);
                *cursor += 1;
            }
        }
        dependent_offsets.copy_within(..op_count, 1);
        dependent_offsets[0] = 0;

        let mut beside_communication = Vec::new();
        if !self.beside_communication.is_empty() {
            beside_communication = vec![SimDuration::ZERO; self.ops.len()];
            for &(op, slowed) in &self.beside_communication {
                beside_communication[op.0 as usize] = slowed;
            }
        }
        let mut ops = self.ops;
        ops.finish();
        let graph = ExecGraph {
            beside_communication,
            ranks: self.ranks,
            streams_per_rank,
            ops,
            dep_offsets: self.dep_offsets,
            deps: self.deps,
            dependent_offsets,
            dependents,
            next_in_stream,
            previous_in_stream: PreviousLinks::default(),
            has_previous,
            stream_heads,
            groups: self.groups,
            collectives: self.collectives,
            member_offsets,
            members,
            labels: self.labels,
            images: self.images,
            layer_names: self.layer_names,
            origins: self.origins,
        };
        graph.check_acyclic()?;
        Ok(graph)
    }

    fn check_groups_and_collectives(&self) -> Result<(), GraphError> {
        for (index, group) in self.groups.iter().enumerate() {
            let what = || format!("group {index}");
            if group.is_empty() {
                return Err(GraphError::BadCollective { what: what(), reason: "has no ranks".into() });
            }
            if let Some(rank) = group.iter().find(|rank| rank.0 >= self.ranks) {
                return Err(GraphError::BadCollective {
                    what: what(),
                    reason: format!("contains {rank}, but the graph has only {} ranks", self.ranks),
                });
            }
            let mut sorted = group.clone();
            sorted.sort_unstable();
            if let Some(pair) = sorted.windows(2).find(|pair| pair[0] == pair[1]) {
                return Err(GraphError::BadCollective {
                    what: what(),
                    reason: format!("contains {} twice", pair[0]),
                });
            }
        }
        for (index, collective) in self.collectives.iter().enumerate() {
            let what = || format!("collective {index} ({})", collective.kind.name());
            let group =
                self.groups.get(collective.group.0 as usize).ok_or_else(|| GraphError::BadCollective {
                    what: what(),
                    reason: format!(
                        "uses group {}, but only {} groups exist",
                        collective.group.0,
                        self.groups.len()
                    ),
                })?;
            if let CollectiveKind::Broadcast { root } | CollectiveKind::Reduce { root } = collective.kind
                && root as usize >= group.len()
            {
                return Err(GraphError::BadCollective {
                    what: what(),
                    reason: format!("root position {root} is outside its group of {} ranks", group.len()),
                });
            }
            if !collective.algorithm.supports(collective.kind) {
                return Err(GraphError::BadCollective {
                    what: what(),
                    reason: format!(
                        "algorithm {} cannot perform {}",
                        collective.algorithm.name(),
                        collective.kind.name()
                    ),
                });
            }
        }
        Ok(())
    }

    fn check_membership(&self, member_offsets: &[u32], members: &[OpId]) -> Result<(), GraphError> {
        // Under a symmetry, ranks without any op are represented by others.
        let mut has_ops = vec![self.images.is_empty(); self.ranks as usize];
        for op in &self.ops {
            has_ops[op.rank.0 as usize] = true;
        }
        // Per group, its ranks sorted (membership by binary search) and how many have ops:
        // once per group, not once per collective (a lowering issues thousands of collectives
        // on a few groups of up to thousands of ranks, and folded, one member op each).
        let sorted: Vec<Vec<RankId>> = self
            .groups
            .iter()
            .map(|group| {
                let mut sorted = group.clone();
                sorted.sort_unstable();
                sorted
            })
            .collect();
        let live: Vec<usize> = self
            .groups
            .iter()
            .map(|group| group.iter().filter(|rank| has_ops[rank.0 as usize]).count())
            .collect();
        // `seen[rank] == index + 1` once collective `index` has a member op on `rank`.
        let mut seen = vec![0usize; self.ranks as usize];
        for (index, collective) in self.collectives.iter().enumerate() {
            let group = &self.groups[collective.group.0 as usize];
            let ops = &members[member_offsets[index] as usize..member_offsets[index + 1] as usize];
            let error = |reason: String| GraphError::Membership {
                collective: index as u32,
                kind: collective.kind.name(),
                group: collective.group.0,
                reason,
            };
            if ops.is_empty() {
                return Err(error("has no member op at all".into()));
            }
            for &op in ops {
                let rank = self.ops[op.0 as usize].rank;
                let label = || &self.labels[self.ops[op.0 as usize].label.0 as usize];
                if sorted[collective.group.0 as usize].binary_search(&rank).is_err() {
                    return Err(error(format!(
                        "{op} ({:?}) is on {rank}, which is not in the group",
                        label()
                    )));
                }
                if std::mem::replace(&mut seen[rank.0 as usize], index + 1) == index + 1 {
                    return Err(error(format!(
                        "{rank} has more than one op for it ({op} {:?} is the second)",
                        label()
                    )));
                }
            }
            // Each member op is on a distinct rank of the group that has ops: all of those
            // have one when there are as many member ops.
            if ops.len() != live[collective.group.0 as usize]
                && let Some(rank) =
                    group.iter().find(|rank| seen[rank.0 as usize] != index + 1 && has_ops[rank.0 as usize])
            {
                return Err(error(format!(
                    "{rank} is in the group but has no op for it, so the others would wait forever"
                )));
            }
        }
        Ok(())
    }
}

/// Exclusive prefix sums with a trailing total: `[2, 0, 3]` -> `[0, 2, 2, 5]`.
fn prefix_sums(counts: &[u32]) -> Vec<u32> {
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    let mut total = 0u32;
    offsets.push(0);
    for &count in counts {
        total += count;
        offsets.push(total);
    }
    offsets
}

/// Marks "no successor" in `next_in_stream`.
const NO_OP: OpId = OpId(u32::MAX);

/// [`ExecGraph::previous_in_stream`]'s links, made on first use. Derived from the stream
/// successors, so they take no part in a graph's equality or hash.
#[derive(Debug, Clone, Default)]
struct PreviousLinks(std::sync::OnceLock<Vec<OpId>>);

impl PartialEq for PreviousLinks {
    fn eq(&self, _: &PreviousLinks) -> bool {
        true
    }
}

impl Eq for PreviousLinks {}

impl std::hash::Hash for PreviousLinks {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

/// A validated execution graph with the indexes the executor walks.
///
/// Two graphs are equal (`==`) when every op, dependency, group, collective, label and
/// symmetry is: the engine, which reads nothing else of a graph, then runs them the same way
/// on the same network, so a caller may run such graphs once ([`ExecGraph::fingerprint`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExecGraph {
    ranks: u32,
    streams_per_rank: u16,
    ops: Ops,
    dep_offsets: Vec<u32>,
    deps: Vec<OpId>,
    dependent_offsets: Vec<u32>,
    dependents: Vec<OpId>,
    next_in_stream: Vec<OpId>,
    /// The inverse of `next_in_stream`, made on first use ([`ExecGraph::previous_in_stream`]):
    /// a run of the engine asks only whether an op has a predecessor
    /// ([`ExecGraph::has_previous_in_stream`]), which a bit per op answers.
    previous_in_stream: PreviousLinks,
    /// Bit `op % 64` of word `op / 64`: whether `op` has a stream predecessor (1 bit per op).
    has_previous: Vec<u64>,
    /// The first op of every (rank, stream), at `rank * streams_per_rank + stream`
    /// ([`NO_OP`] for an empty stream): with `next_in_stream`, a rank's ops without a list
    /// per rank ([`ExecGraph::rank_ops`]).
    stream_heads: Vec<OpId>,
    groups: Vec<Vec<RankId>>,
    collectives: Vec<Collective>,
    member_offsets: Vec<u32>,
    members: Vec<OpId>,
    labels: Vec<String>,
    images: Vec<Vec<RankId>>,
    /// Per op, a slowed compute op's duration beside communication
    /// ([`GraphBuilder::compute_slowed`]), zero for the others; empty when no op is slowed.
    beside_communication: Vec<SimDuration>,
    /// [`GraphBuilder::set_layer_names`].
    layer_names: Vec<String>,
    /// [`GraphBuilder::origin`]'s names, from [`Origin`] 1.
    origins: Vec<String>,
}

impl ExecGraph {
    /// A hash of the whole graph, the same in every run of the program: equal graphs have
    /// equal fingerprints, so a cache of runs keyed by it finds a graph's twins quickly; it
    /// then compares the graphs themselves (`==`), as different graphs may share one.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        // Fixed keys: deterministic, unlike a `RandomState`'s.
        let mut hasher = std::hash::DefaultHasher::new();
        self.hash(&mut hasher);
        hasher.finish()
    }

    /// Whether some compute op runs slower beside communication
    /// ([`GraphBuilder::compute_slowed`]).
    pub fn has_slowdowns(&self) -> bool {
        !self.beside_communication.is_empty()
    }

    /// How long compute op `op` takes if its rank communicates the whole time: more than its
    /// duration for an op added with [`GraphBuilder::compute_slowed`], else its duration.
    pub fn beside_communication(&self, op: OpId) -> Option<SimDuration> {
        match self.ops[op.0 as usize].kind {
            OpKind::Compute { duration } => Some(
                self.beside_communication.get(op.0 as usize).map_or(duration, |&slowed| slowed.max(duration)),
            ),
            _ => None,
        }
    }

    /// The rank maps the job is symmetric under ([`GraphBuilder::set_symmetry`]); empty when
    /// every rank has its own ops.
    pub fn images(&self) -> &[Vec<RankId>] {
        &self.images
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// One more than the highest stream id used.
    pub fn streams_per_rank(&self) -> u16 {
        self.streams_per_rank
    }

    /// Number of ops.
    pub fn op_count(&self) -> usize {
        self.ops.len()
    }

    /// All ops, indexed by `OpId` (`ops()[i]`), each distinct op stored once ([`Ops`]).
    pub fn ops(&self) -> &Ops {
        &self.ops
    }

    /// The op with id `id`.
    pub fn op(&self, id: OpId) -> &Op {
        &self.ops[id.0 as usize]
    }

    /// The name of `label`.
    pub fn label(&self, label: LabelId) -> &str {
        &self.labels[label.0 as usize]
    }

    /// The name of layer `layer` of ops' metadata ([`OpMeta::layer`]), if the builder named it.
    pub fn layer_name(&self, layer: u32) -> Option<&str> {
        self.layer_names.get(layer as usize).map(String::as_str)
    }

    /// The name of `origin` ([`OpMeta::origin`]); `None` for [`Origin::NONE`].
    pub fn origin_name(&self, origin: Origin) -> Option<&str> {
        (origin.0 as usize).checked_sub(1).and_then(|index| self.origins.get(index)).map(String::as_str)
    }

    /// The origin named `name`, if any op's builder interned it.
    pub fn find_origin(&self, name: &str) -> Option<Origin> {
        self.origins.iter().position(|known| known == name).map(|index| Origin(index as u8 + 1))
    }

    /// The explicit dependencies of `op` (not counting its stream predecessor).
    pub fn deps(&self, op: OpId) -> &[OpId] {
        &self.deps[self.dep_offsets[op.0 as usize] as usize..self.dep_offsets[op.0 as usize + 1] as usize]
    }

    /// The ops that name `op` as a dependency.
    pub fn dependents(&self, op: OpId) -> &[OpId] {
        &self.dependents[self.dependent_offsets[op.0 as usize] as usize
            ..self.dependent_offsets[op.0 as usize + 1] as usize]
    }

    /// The next op on the same (rank, stream), if any.
    pub fn next_in_stream(&self, op: OpId) -> Option<OpId> {
        let next = self.next_in_stream[op.0 as usize];
        (next != NO_OP).then_some(next)
    }

    /// The ops of `rank`, stream after stream, each stream's in its order: every op of the
    /// rank once, found through the streams' links rather than a scan of the whole graph, so
    /// that a per-rank pass over a large graph holds one rank's data at a time.
    ///
    /// # Panics
    ///
    /// If `rank` is not below [`ExecGraph::ranks`].
    pub fn rank_ops(&self, rank: RankId) -> impl Iterator<Item = OpId> + '_ {
        let streams = usize::from(self.streams_per_rank);
        let heads = &self.stream_heads[rank.0 as usize * streams..(rank.0 as usize + 1) * streams];
        heads
            .iter()
            .filter(|&&head| head != NO_OP)
            .flat_map(move |&head| std::iter::successors(Some(head), move |&op| self.next_in_stream(op)))
    }

    /// All collectives, indexed by `CollectiveId`.
    pub fn collectives(&self) -> &[Collective] {
        &self.collectives
    }

    /// The collective with id `id`.
    pub fn collective(&self, id: CollectiveId) -> &Collective {
        &self.collectives[id.0 as usize]
    }

    /// The ranks of `group`, in ring order.
    pub fn group(&self, group: GroupId) -> &[RankId] {
        &self.groups[group.0 as usize]
    }

    /// The member ops of `collective`, one per group rank.
    pub fn members(&self, collective: CollectiveId) -> &[OpId] {
        &self.members[self.member_offsets[collective.0 as usize] as usize
            ..self.member_offsets[collective.0 as usize + 1] as usize]
    }

    /// "op 12 \"layer1 fwd\" (rank 0, stream 0)".
    pub fn describe(&self, op: OpId) -> String {
        let o = self.op(op);
        format!("{op} {:?} ({}, stream {})", self.label(o.label), o.rank, o.stream.0)
    }

    /// Takes the compute durations (and slowdowns beside communication) of `other`'s ops on
    /// the ranks `take` selects: for a graph lowered once per kind of processor with the same
    /// ops, dependencies and collectives (a cluster of mixed devices), each rank then runs
    /// its own processor's kernel times. Refused, naming the first op that differs, when the
    /// two graphs differ in anything but compute durations.
    pub fn take_compute_times(
        &mut self,
        other: &ExecGraph,
        take: &dyn Fn(RankId) -> bool,
    ) -> Result<(), GraphError> {
        if self.ranks != other.ranks || self.ops.len() != other.ops.len() {
            let op = self.ops.len().min(other.ops.len());
            return Err(self.mismatch(op, "the graphs differ in ranks or op count"));
        }
        if self.deps != other.deps
            || self.dep_offsets != other.dep_offsets
            || self.collectives != other.collectives
        {
            return Err(self.mismatch(0, "the graphs differ in dependencies or collectives"));
        }
        for (index, (mine, theirs)) in self.ops.iter().zip(&other.ops).enumerate() {
            let same_shape = mine.rank == theirs.rank
                && mine.stream == theirs.stream
                && mine.meta == theirs.meta
                && std::mem::discriminant(&mine.kind) == std::mem::discriminant(&theirs.kind);
            let same_work = matches!(mine.kind, OpKind::Compute { .. }) || mine.kind == theirs.kind;
            if !same_shape || !same_work {
                return Err(
                    self.mismatch(index, "the op differs between the graphs (rank, stream, kind or size)")
                );
            }
        }
        if !other.beside_communication.is_empty() && self.beside_communication.is_empty() {
            self.beside_communication = vec![SimDuration::ZERO; self.ops.len()];
        }
        // The ops interned afresh: setting them one by one in the built table (which keeps no
        // lookup) would store every changed op anew.
        let mut ops = Ops::default();
        ops.reserve(self.ops.len());
        for (index, (&mine, theirs)) in self.ops.iter().zip(&other.ops).enumerate() {
            let mut op = mine;
            if let OpKind::Compute { duration } = theirs.kind
                && take(mine.rank)
            {
                op.kind = OpKind::Compute { duration };
                if let Some(slot) = self.beside_communication.get_mut(index) {
                    *slot = other.beside_communication.get(index).copied().unwrap_or(SimDuration::ZERO);
                }
            }
            ops.push(op);
        }
        ops.finish();
        self.ops = ops;
        Ok(())
    }

    /// [`GraphError::Mismatch`] at op `op` (its label, when it has one).
    fn mismatch(&self, op: usize, reason: &str) -> GraphError {
        let label = self.ops.get(op).and_then(|o| self.labels.get(o.label.0 as usize)).cloned();
        GraphError::Mismatch {
            op: OpId(op as u32),
            label: label.unwrap_or_default(),
            reason: reason.to_string(),
        }
    }

    /// The previous op on the same (rank, stream), if any. The first call makes the links
    /// for every op (4 bytes per op, kept with the graph); [`ExecGraph::has_previous_in_stream`]
    /// needs none.
    pub fn previous_in_stream(&self, op: OpId) -> Option<OpId> {
        let links = self.previous_in_stream.0.get_or_init(|| {
            let mut links = vec![NO_OP; self.next_in_stream.len()];
            for (index, &next) in self.next_in_stream.iter().enumerate() {
                if next != NO_OP {
                    links[next.0 as usize] = OpId(index as u32);
                }
            }
            links
        });
        let previous = links[op.0 as usize];
        (previous != NO_OP).then_some(previous)
    }

    /// Whether `op` has a previous op on its (rank, stream): whether it is not its stream's
    /// first.
    pub fn has_previous_in_stream(&self, op: OpId) -> bool {
        let index = op.0 as usize;
        self.has_previous[index / 64] >> (index % 64) & 1 == 1
    }

    /// The previous op on the same (rank, stream) if its links are made already
    /// ([`ExecGraph::previous_in_stream`]), else `None` (whether there is one or not).
    pub(crate) fn known_previous_in_stream(&self, op: OpId) -> Option<Option<OpId>> {
        let links = self.previous_in_stream.0.get()?;
        let previous = links[op.0 as usize];
        Some((previous != NO_OP).then_some(previous))
    }

    /// The node of `op` in the rendezvous graph: ops are nodes `0..n`, and all member ops of a
    /// collective share node `n + collective` (they start together).
    fn rendezvous_node(&self, op: OpId) -> usize {
        match self.ops[op.0 as usize].kind {
            OpKind::Collective(c) => self.ops.len() + c.0 as usize,
            _ => op.0 as usize,
        }
    }

    /// The ops that make up rendezvous node `node`.
    fn ops_of_node(&self, node: usize) -> impl Iterator<Item = OpId> + '_ {
        let op_count = self.ops.len();
        let (members, single): (&[OpId], _) = if node >= op_count {
            (self.members(CollectiveId((node - op_count) as u32)), None)
        } else {
            (&[], Some(OpId(node as u32)))
        };
        members.iter().copied().chain(single)
    }

    /// Kahn's algorithm over the rendezvous graph (edges: dependencies and stream order). Nodes
    /// left over are on or behind a cycle; walking back through unfinished predecessors from
    /// one of them must revisit a node, and the walk between the two visits is reported.
    ///
    /// Needs the members ([`ExecGraph::members`]), each collective with one at least (the
    /// build checks it first).
    fn check_acyclic(&self) -> Result<(), GraphError> {
        let op_count = self.ops.len();
        // The rendezvous node of each op, numbered by op: its own, or a collective member's
        // first member's (as ops are numbered, so no id passes the op count). Looked up per
        // edge below, where reading the op's kind each time cost more.
        let mut node_of: Vec<u32> = (0..op_count as u32).collect();
        for bounds in self.member_offsets.windows(2) {
            let members = &self.members[bounds[0] as usize..bounds[1] as usize];
            if let Some(first) = members.first() {
                for member in members {
                    node_of[member.0 as usize] = first.0;
                }
            }
        }
        let mut indegree = vec![0u32; op_count];
        for (op, &node) in node_of.iter().enumerate() {
            indegree[node as usize] += self.dep_offsets[op + 1] - self.dep_offsets[op]
                + u32::from(self.has_previous_in_stream(OpId(op as u32)));
        }
        let mut ready: Vec<u32> = (0..op_count as u32)
            .filter(|&node| node_of[node as usize] == node && indegree[node as usize] == 0)
            .collect();
        // The ops finished (a node's at once: a collective's members together).
        let mut finished = 0usize;
        while let Some(node) = ready.pop() {
            let single = [OpId(node)];
            let ops = match self.ops[node as usize].kind {
                OpKind::Collective(c) => self.members(c),
                _ => &single[..],
            };
            finished += ops.len();
            let mut release = |successor: OpId| {
                let target = node_of[successor.0 as usize];
                let waiting = &mut indegree[target as usize];
                *waiting -= 1;
                if *waiting == 0 {
                    ready.push(target);
                }
            };
            for &op in ops {
                for &successor in self.dependents(op) {
                    release(successor);
                }
                let next = self.next_in_stream[op.0 as usize];
                if next != NO_OP {
                    release(next);
                }
            }
        }
        // Every collective has a member, so every node finished if every op did.
        if finished == op_count {
            return Ok(());
        }
        // What is left waiting, by rendezvous node ([`ExecGraph::rendezvous_node`]): ops, then
        // collectives; a member's own node waits for nothing (as Kahn's leaves it whatever
        // the order it took the nodes in).
        let node_count = op_count + self.collectives.len();
        let indegree = {
            let mut by_node = vec![0u32; node_count];
            for (op, &node) in node_of.iter().enumerate() {
                by_node[self.rendezvous_node(OpId(op as u32))] = indegree[node as usize];
            }
            by_node
        };
        let unfinished_predecessor = |node: usize| {
            self.ops_of_node(node)
                .flat_map(|op| self.deps(op).iter().copied().chain(self.previous_in_stream(op)))
                .map(|op| self.rendezvous_node(op))
                .find(|&p| indegree[p] > 0)
        };
        let mut position = vec![usize::MAX; node_count];
        let mut walk = Vec::new();
        let mut node = (0..node_count).find(|&node| indegree[node] > 0).unwrap_or(0);
        while position[node] == usize::MAX {
            position[node] = walk.len();
            walk.push(node);
            match unfinished_predecessor(node) {
                Some(previous) => node = previous,
                None => break,
            }
        }
        let start = if position[node] == usize::MAX { 0 } else { position[node] };
        let cycle: Vec<String> = walk[start..]
            .iter()
            .rev()
            .filter_map(|&n| self.ops_of_node(n).next())
            .map(|op| self.describe(op))
            .collect();
        Err(GraphError::Cycle { cycle: cycle.join(" -> ") })
    }
}
