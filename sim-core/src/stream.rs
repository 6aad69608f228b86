//! Streamed runs: a graph handed to the engine a chunk at a time (one training iteration, say),
//! run as it comes, and dropped as it finishes, so that memory holds a window of chunks however
//! many there are.
//!
//! A source adds each chunk's ops to a [`GraphBuilder`] whose ids go on from the previous
//! chunk's ([`GraphBuilder::take_chunk`]); a chunk's ops may depend on any earlier op. The run
//! is the same, event for event, as [`crate::exec::run`] on the whole graph, provided every
//! op is in the window before the first of its dependencies (or its stream predecessor)
//! finishes: the op then waits for exactly what it would have waited for. [`StreamRun`] holds
//! that by asking for chunks ahead: before an op of chunk `c` finishes, chunks up to
//! `c + lookahead` are taken in. A chunk that comes too late (one of its ops finds everything
//! it waits for already finished) is an error ([`StreamError::Late`]), never a different
//! result; so is one that changes which ranks share a server's links under a symmetry
//! ([`StreamError::Shadows`]), which the whole-graph run decides from every op up front.
//!
//! ```
//! use sim_core::graph::{GraphBuilder, OpId, RankId, StreamId};
//! use sim_core::network::AnalyticalNetwork;
//! use sim_core::stream::{ChunkSource, StreamRun};
//! use sim_core::units::SimDuration;
//! use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology};
//!
//! // Each chunk: 10 us of work on each of two ranks, after the previous chunk's.
//! struct Steps { left: u32, last: Vec<OpId> }
//! impl ChunkSource for Steps {
//!     type Error = std::convert::Infallible;
//!     fn next_chunk(&mut self, graph: &mut GraphBuilder) -> Result<bool, Self::Error> {
//!         if self.left == 0 { return Ok(false); }
//!         self.left -= 1;
//!         self.last = (0..2).map(|r| {
//!             let after: Vec<OpId> = self.last.clone();
//!             graph.compute(RankId(r), StreamId(0), SimDuration::from_us(10), "step", &after)
//!         }).collect();
//!         Ok(true)
//!     }
//! }
//! let link = LinkSpec::new("100 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
//! let cluster = ClusterSpec { nodes: 2, gpus_per_node: 1, intra_node: IntraNode::NvSwitch(link),
//!     network: NetworkSpec::single_switch(link), host_memory: None };
//! let topology = Topology::build(&cluster).unwrap();
//! let mut network = AnalyticalNetwork::new(&topology);
//! let mut source = Steps { left: 1000, last: Vec::new() };
//! let mut run = StreamRun::new(GraphBuilder::new(2), &mut network, 1);
//! run.begin(&mut source).unwrap();
//! while run.step(&mut source).unwrap() {
//!     run.retire_finished(|_, _| {});
//! }
//! assert_eq!(run.now(), sim_core::units::SimTime::from_ps(1000 * 10_000_000));
//! assert!(run.peak_held_ops() <= 8); // a few chunks of 2 ops, not 2,000
//! ```

use std::collections::VecDeque;

use units::{SimDuration, SimTime};

use crate::exec::{ExecError, Executor, View};
use crate::graph::{Collective, CollectiveId, GraphBuilder, GraphChunk, GroupId, Op, OpId, OpKind, RankId};
use crate::lookup::LookupMap;
use crate::network::Network;

/// Marks "none" in the stream links.
const NO_OP: OpId = OpId(u32::MAX);

/// A streamed run could not complete.
#[derive(Debug, thiserror::Error)]
pub enum StreamError<S: std::error::Error + 'static> {
    /// The source failed to make a chunk.
    #[error(transparent)]
    Source(S),
    /// A chunk's ops were not valid.
    #[error("chunk {chunk}: {source}")]
    Graph {
        /// The chunk.
        chunk: u64,
        /// Why.
        #[source]
        source: crate::graph::GraphError,
    },
    /// The engine failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// A chunk came in after everything one of its ops waits for had finished: a whole-graph
    /// run would have started that op earlier. Streaming again with a longer lookahead fixes it.
    #[error(
        "chunk {chunk} came too late: {op} waits only for ops that finished already (a lookahead of {lookahead} chunks is too short)"
    )]
    Late {
        /// The chunk.
        chunk: u64,
        /// The op that would have started earlier.
        op: String,
        /// The lookahead that was too short.
        lookahead: u32,
    },
    /// A chunk brought traffic inside a server that the run had already decided was quiet
    /// (symmetric ranks replayed as shadows), or slowed kernels into a run without them.
    #[error("chunk {chunk}: {what}, which a streamed run must know from its first chunks")]
    Shadows {
        /// The chunk.
        chunk: u64,
        /// What changed.
        what: &'static str,
    },
}

/// Makes a streamed graph's chunks.
pub trait ChunkSource {
    /// Why a chunk could not be made.
    type Error: std::error::Error + 'static;
    /// Adds the next chunk's ops to `graph` and returns `true`, or `false` when there are no
    /// more chunks.
    fn next_chunk(&mut self, graph: &mut GraphBuilder) -> Result<bool, Self::Error>;
}

/// One chunk held in the window.
#[derive(Debug, Clone, Copy)]
struct HeldChunk {
    /// Its first op id and one past its last.
    ops: (u32, u32),
    /// One past its last collective id.
    collectives_end: u32,
    /// How many of its first ops are known to have finished.
    finished: u32,
}

/// The held window of a streamed graph: every op of the chunks taken in and not yet dropped,
/// with the indexes the executor walks.
#[derive(Debug)]
pub struct StreamGraph {
    /// Groups, labels, images and names, and the chunk being built.
    builder: GraphBuilder,
    base: u32,
    ops: Vec<Op>,
    /// Per held op, the end of its dependencies in `deps` (from `deps_base`).
    dep_ends: Vec<usize>,
    deps: Vec<OpId>,
    deps_base: usize,
    dependents: Vec<Vec<OpId>>,
    next_in_stream: Vec<OpId>,
    previous_in_stream: Vec<OpId>,
    /// Per held op, a slowed kernel's duration beside communication (zero for the others).
    beside: Vec<SimDuration>,
    collective_base: u32,
    collectives: Vec<Collective>,
    members: Vec<Vec<OpId>>,
    last_on_stream: LookupMap<(RankId, u16), OpId>,
    chunks: VecDeque<HeldChunk>,
    /// Index of the first held chunk.
    chunk_base: u64,
}

impl StreamGraph {
    fn new(builder: GraphBuilder) -> Self {
        let base = builder.op_count() as u32;
        let collective_base = builder.collective_count() as u32;
        StreamGraph {
            builder,
            base,
            ops: Vec::new(),
            dep_ends: Vec::new(),
            deps: Vec::new(),
            deps_base: 0,
            dependents: Vec::new(),
            next_in_stream: Vec::new(),
            previous_in_stream: Vec::new(),
            beside: Vec::new(),
            collective_base,
            collectives: Vec::new(),
            members: Vec::new(),
            last_on_stream: LookupMap::new(),
            chunks: VecDeque::new(),
            chunk_base: 0,
        }
    }

    /// The builder the source adds ops to, which also names labels, groups and origins.
    pub fn builder(&self) -> &GraphBuilder {
        &self.builder
    }

    /// The first held op id.
    pub fn first_held(&self) -> OpId {
        OpId(self.base)
    }

    /// One past the last op id taken in.
    pub fn end(&self) -> OpId {
        OpId(self.base + self.ops.len() as u32)
    }

    /// Chunks taken in so far.
    pub fn chunks_taken(&self) -> u64 {
        self.chunk_base + self.chunks.len() as u64
    }

    /// The held chunk `chunk`'s op ids, if held.
    pub fn chunk_ops(&self, chunk: u64) -> Option<std::ops::Range<u32>> {
        let held = self.chunks.get(usize::try_from(chunk.checked_sub(self.chunk_base)?).ok()?)?;
        Some(held.ops.0..held.ops.1)
    }

    /// The chunk op `op` belongs to (held).
    fn chunk_of(&self, op: OpId) -> u64 {
        let position = self.chunks.partition_point(|chunk| chunk.ops.1 <= op.0);
        self.chunk_base + position as u64
    }

    fn at(&self, op: OpId) -> usize {
        (op.0 - self.base) as usize
    }

    /// Held op `op`.
    pub fn op(&self, op: OpId) -> &Op {
        &self.ops[self.at(op)]
    }

    /// Held op `op`'s explicit dependencies (held or not).
    pub fn deps(&self, op: OpId) -> &[OpId] {
        let index = self.at(op);
        let start = if index == 0 { self.deps_base } else { self.dep_ends[index - 1] };
        &self.deps[start - self.deps_base..self.dep_ends[index] - self.deps_base]
    }

    /// Held op `op`'s stream predecessor (held or not).
    pub fn previous_in_stream(&self, op: OpId) -> Option<OpId> {
        let previous = self.previous_in_stream[self.at(op)];
        (previous != NO_OP).then_some(previous)
    }

    /// Takes the builder's pending ops in as the next chunk; returns the range of its ids and
    /// whether a slowed kernel or a group or transfer pair came with it.
    fn take_in(&mut self) -> Result<(std::ops::Range<u32>, GraphChunk), crate::graph::GraphError> {
        let chunk = self.builder.take_chunk()?;
        let first = chunk.first.0;
        debug_assert_eq!(first, self.end().0);
        for (index, op) in chunk.ops.iter().enumerate() {
            let id = OpId(first + index as u32);
            let deps = &chunk.deps[chunk.dep_offsets[index] as usize..chunk.dep_offsets[index + 1] as usize];
            self.ops.push(*op);
            self.deps.extend_from_slice(deps);
            self.dep_ends.push(self.deps_base + self.deps.len());
            self.dependents.push(Vec::new());
            self.next_in_stream.push(NO_OP);
            for dep in deps {
                // Dependencies added later are linked below, once they are held.
                if dep.0 >= self.base && dep.0 < id.0 {
                    let at = self.at(*dep);
                    self.dependents[at].push(id);
                }
            }
            let previous = self.last_on_stream.insert((op.rank, op.stream.0), id).unwrap_or(NO_OP);
            if previous != NO_OP && previous.0 >= self.base {
                let at = self.at(previous);
                self.next_in_stream[at] = id;
            }
            self.previous_in_stream.push(previous);
            self.beside.push(SimDuration::ZERO);
            if let OpKind::Collective(c) = op.kind {
                let held = (c.0 - self.collective_base) as usize;
                if self.members.len() <= held {
                    self.members.resize(held + 1, Vec::new());
                }
                self.members[held].push(id);
            }
        }
        // Forward references inside the chunk: a dependency added after its dependent.
        for (index, _) in chunk.ops.iter().enumerate() {
            let id = OpId(first + index as u32);
            let deps = &chunk.deps[chunk.dep_offsets[index] as usize..chunk.dep_offsets[index + 1] as usize];
            for dep in deps.iter().filter(|dep| dep.0 > id.0) {
                let at = self.at(*dep);
                let list = &mut self.dependents[at];
                // Keep dependents in id order, as the whole graph's index has them.
                let position = list.partition_point(|&other| other.0 < id.0);
                list.insert(position, id);
            }
        }
        for &(op, slowed) in &chunk.beside {
            let at = self.at(op);
            self.beside[at] = slowed;
        }
        self.collectives.extend_from_slice(&chunk.collectives);
        self.members.resize(self.collectives.len(), Vec::new());
        let end = self.end().0;
        self.chunks.push_back(HeldChunk {
            ops: (first, end),
            collectives_end: self.collective_base + self.collectives.len() as u32,
            finished: 0,
        });
        Ok((first..end, chunk))
    }

    /// Drops the first held chunk.
    fn drop_front(&mut self) {
        let Some(chunk) = self.chunks.pop_front() else { return };
        let ops = (chunk.ops.1 - self.base) as usize;
        let deps_end = self.dep_ends.get(ops.wrapping_sub(1)).copied().unwrap_or(self.deps_base);
        self.deps.drain(..deps_end - self.deps_base);
        self.deps_base = deps_end;
        self.ops.drain(..ops);
        self.dep_ends.drain(..ops);
        self.dependents.drain(..ops);
        self.next_in_stream.drain(..ops);
        self.previous_in_stream.drain(..ops);
        self.beside.drain(..ops);
        self.base = chunk.ops.1;
        let collectives = (chunk.collectives_end - self.collective_base) as usize;
        self.collectives.drain(..collectives);
        self.members.drain(..collectives);
        self.collective_base = chunk.collectives_end;
        self.chunk_base += 1;
    }
}

impl View for StreamGraph {
    fn ranks(&self) -> u32 {
        self.builder.ranks()
    }
    fn op(&self, id: OpId) -> &Op {
        StreamGraph::op(self, id)
    }
    fn dependents(&self, id: OpId) -> &[OpId] {
        &self.dependents[self.at(id)]
    }
    fn next_in_stream(&self, id: OpId) -> Option<OpId> {
        let next = self.next_in_stream[self.at(id)];
        (next != NO_OP).then_some(next)
    }
    fn members(&self, collective: CollectiveId) -> &[OpId] {
        &self.members[(collective.0 - self.collective_base) as usize]
    }
    fn collective(&self, id: CollectiveId) -> &Collective {
        &self.collectives[(id.0 - self.collective_base) as usize]
    }
    fn group(&self, group: GroupId) -> &[RankId] {
        self.builder.group(group)
    }
    fn images(&self) -> &[Vec<RankId>] {
        self.builder.images()
    }
    fn describe(&self, op: OpId) -> String {
        let o = StreamGraph::op(self, op);
        format!("{op} {:?} ({}, stream {})", self.builder.label_name(o.label), o.rank, o.stream.0)
    }
    fn beside_communication(&self, op: OpId) -> Option<SimDuration> {
        match StreamGraph::op(self, op).kind {
            OpKind::Compute { duration } => Some(self.beside[self.at(op)].max(duration)),
            _ => None,
        }
    }
    fn deps(&self, op: OpId) -> &[OpId] {
        StreamGraph::deps(self, op)
    }
    fn previous_pending(&self, op: OpId, is_done: impl Fn(OpId) -> bool) -> bool {
        StreamGraph::previous_in_stream(self, op).is_some_and(|previous| !is_done(previous))
    }
}

/// A run of a streamed graph on a network: chunks are taken in ahead of the ops that need
/// them, and dropped once finished ([`StreamRun::retire_finished`]).
pub struct StreamRun<'n, N: Network> {
    graph: StreamGraph,
    executor: Executor<N::Event>,
    network: &'n mut N,
    lookahead: u32,
    /// No chunk left to take.
    exhausted: bool,
    /// The run's transfer pairs and collective groups so far (for shadows).
    pairs: Vec<(RankId, RankId)>,
    groups: Vec<GroupId>,
    /// Whether the run has started (ops taken in later may not be ready).
    started: bool,
    peak_held_ops: usize,
    slowdowns: bool,
}

impl<'n, N: Network> StreamRun<'n, N> {
    /// A run on `network` of the graph whose chunks come after what `builder` holds (groups,
    /// labels, symmetry; no ops), taking chunks in `lookahead` ahead.
    pub fn new(builder: GraphBuilder, network: &'n mut N, lookahead: u32) -> Self {
        let ranks = builder.ranks();
        StreamRun {
            graph: StreamGraph::new(builder),
            // Streams per rank only size the queue's first allocation.
            executor: Executor::new(ranks, 4, false),
            network,
            lookahead: lookahead.max(1),
            exhausted: false,
            pairs: Vec::new(),
            groups: Vec::new(),
            started: false,
            peak_held_ops: 0,
            slowdowns: false,
        }
    }

    /// The held window.
    pub fn graph(&self) -> &StreamGraph {
        &self.graph
    }

    /// The time of the last event.
    pub fn now(&self) -> SimTime {
        self.executor.queue.now()
    }

    /// Events processed so far.
    pub fn events(&self) -> u64 {
        self.executor.events
    }

    /// The most ops held at once so far.
    pub fn peak_held_ops(&self) -> usize {
        self.peak_held_ops
    }

    /// When held op `op` started and ended, and whether it has ended.
    pub fn times(&self, op: OpId) -> (SimTime, SimTime, bool) {
        let index = (op.0 - self.executor.base) as usize;
        (self.executor.start[index], self.executor.end[index], self.executor.done[index])
    }

    /// The earliest start of a held op that has started (or finished); `now` if none has. An
    /// op that has not started starts no earlier than now, so no interval of a held op or of
    /// one taken in later begins before this.
    pub fn earliest_held_start(&self) -> SimTime {
        let now = self.now();
        (0..self.graph.ops.len())
            .filter(|&i| self.executor.done[i] || self.executor.waiting_on[i] == 0)
            .map(|i| self.executor.start[i])
            .min()
            .unwrap_or(now)
            .min(now)
    }

    /// Whether held op `op` has started (a started op has a start time; one not started waits).
    pub fn has_started(&self, op: OpId) -> bool {
        let index = (op.0 - self.executor.base) as usize;
        self.executor.done[index] || self.executor.waiting_on[index] == 0
    }

    /// Takes the next chunk in; false when the source has no more.
    fn take_chunk<S: ChunkSource>(&mut self, source: &mut S) -> Result<bool, StreamError<S::Error>> {
        if self.exhausted {
            return Ok(false);
        }
        let chunk = self.graph.chunks_taken();
        if !source.next_chunk(&mut self.graph.builder).map_err(StreamError::Source)? {
            self.exhausted = true;
            return Ok(false);
        }
        let (ops, taken) = self.graph.take_in().map_err(|source| StreamError::Graph { chunk, source })?;
        if !taken.beside.is_empty() && !self.slowdowns {
            if self.started {
                return Err(StreamError::Shadows { chunk, what: "kernels slowed beside communication came" });
            }
            self.slowdowns = true;
            self.executor.enable_slowdowns(self.graph.ranks());
        }
        // Shadows: the pairs and groups that mark ranks as sharing their server's links.
        let before = (self.pairs.len(), self.groups.len());
        for op in &taken.ops {
            if let OpKind::Transfer { dst, .. } = op.kind {
                let pair = (op.rank, dst);
                if let Err(position) = self.pairs.binary_search(&pair) {
                    self.pairs.insert(position, pair);
                }
            }
        }
        for collective in &taken.collectives {
            if let Err(position) = self.groups.binary_search(&collective.group) {
                self.groups.insert(position, collective.group);
            }
        }
        if self.started && self.executor.shadows() && before != (self.pairs.len(), self.groups.len()) {
            let marks = Executor::<N::Event>::intra_server_marks(
                &self.graph,
                &*self.network,
                &self.groups,
                &self.pairs,
            );
            if marks != self.executor.intra_server_active {
                return Err(StreamError::Shadows {
                    chunk,
                    what: "traffic inside a server that earlier chunks left quiet came",
                });
            }
        }
        let collectives = self.graph.collective_base + self.graph.collectives.len() as u32;
        self.executor.admit(&self.graph, ops.clone(), collectives);
        if self.started
            && let Some(op) = ops
                .clone()
                .map(OpId)
                .find(|&op| self.executor.waiting_on[(op.0 - self.executor.base) as usize] == 0)
        {
            return Err(StreamError::Late { chunk, op: self.graph.describe(op), lookahead: self.lookahead });
        }
        self.peak_held_ops = self.peak_held_ops.max(self.graph.ops.len());
        Ok(true)
    }

    /// Takes in the first chunks and starts the ops that wait for nothing.
    pub fn begin<S: ChunkSource>(&mut self, source: &mut S) -> Result<(), StreamError<S::Error>> {
        if self.graph.ranks() as usize > self.network.host_count() {
            return Err(ExecError::TooFewHosts {
                ranks: self.graph.ranks(),
                hosts: self.network.host_count(),
            }
            .into());
        }
        for _ in 0..=self.lookahead {
            if !self.take_chunk(source)? {
                break;
            }
        }
        self.executor.prepare_shadows(&self.graph, &*self.network, &self.groups, &self.pairs);
        self.started = true;
        let ops = self.graph.base..self.graph.end().0;
        self.executor.start_ready(&self.graph, self.network, ops)?;
        Ok(())
    }

    /// Processes the next event, taking chunks in first as the ops it finishes need; false
    /// when no event is left (the run is over, or stalled: see [`StreamRun::finish`]).
    pub fn step<S: ChunkSource>(&mut self, source: &mut S) -> Result<bool, StreamError<S::Error>> {
        let Some((_, event)) = self.executor.queue.pop() else { return Ok(false) };
        if let Some(op) = self.executor.finishes(&self.graph, &event) {
            let needed = self.graph.chunk_of(op) + u64::from(self.lookahead);
            while self.graph.chunks_taken() <= needed && self.take_chunk(source)? {}
        }
        self.executor.process(&self.graph, self.network, event)?;
        Ok(true)
    }

    /// Drops every leading chunk whose ops have all finished, after `sink` has seen it (with
    /// the window still holding it): `sink(run, chunk index)`.
    pub fn retire_finished(&mut self, mut sink: impl FnMut(&Self, u64)) {
        while let Some(&front) = self.graph.chunks.front() {
            // The first op of the front chunk not known to be finished (ops finish in any
            // order: the cursor moves over each op once).
            let mut cursor = front.ops.0 + front.finished;
            while cursor < front.ops.1 && self.executor.done[(cursor - self.executor.base) as usize] {
                cursor += 1;
            }
            if let Some(chunk) = self.graph.chunks.front_mut() {
                chunk.finished = cursor - front.ops.0;
            }
            if cursor < front.ops.1 {
                break;
            }
            sink(self, self.graph.chunk_base);
            self.graph.drop_front();
            self.executor.retire(OpId(self.graph.base), CollectiveId(self.graph.collective_base));
        }
    }

    /// Ends the run: an error if ops are left that never finished.
    pub fn finish(&self) -> Result<(), ExecError> {
        let held = self.graph.ops.len();
        let unfinished = (0..held).filter(|&i| !self.executor.done[i]).count();
        if unfinished > 0 {
            let first = (0..held).find(|&i| !self.executor.done[i]).unwrap_or(0);
            return Err(ExecError::Stalled {
                time: self.executor.queue.now(),
                unfinished,
                op: self.graph.describe(OpId(self.graph.base + first as u32)),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec;
    use crate::graph::{CollectiveAlgorithm, CollectiveKind, StreamId};
    use crate::network::AnalyticalNetwork;
    use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology};
    use units::Bytes;

    fn topology() -> Topology {
        let link = LinkSpec::new("100 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
        let cluster = ClusterSpec {
            nodes: 4,
            gpus_per_node: 1,
            intra_node: IntraNode::NvSwitch(link),
            network: NetworkSpec::single_switch(link),
            host_memory: None,
        };
        Topology::build(&cluster).unwrap()
    }

    /// Training-like iterations on 4 ranks: per rank a forward and a backward whose lengths
    /// vary with the rank and the iteration, a send to the next rank, an allreduce, an
    /// optimizer step after the previous iteration's, and a loader op on its own stream that
    /// prefetches two batches ahead: it waits for the forward of two iterations back (so
    /// iterations overlap and reach back).
    struct Iterations {
        left: u32,
        index: u32,
        group: Option<crate::graph::GroupId>,
        /// Per rank: the last optimizer step, and the forwards of past iterations.
        steps: Vec<Option<OpId>>,
        forwards: Vec<Vec<OpId>>,
    }

    impl Iterations {
        fn new(count: u32) -> Self {
            Iterations {
                left: count,
                index: 0,
                group: None,
                steps: vec![None; 4],
                forwards: vec![Vec::new(); 4],
            }
        }
    }

    impl ChunkSource for Iterations {
        type Error = std::convert::Infallible;
        fn next_chunk(&mut self, graph: &mut GraphBuilder) -> Result<bool, Self::Error> {
            if self.left == 0 {
                return Ok(false);
            }
            self.left -= 1;
            let k = self.index;
            self.index += 1;
            let group = *self.group.get_or_insert_with(|| graph.add_group((0..4).map(RankId).collect()));
            let allreduce = graph.add_collective(Collective {
                kind: CollectiveKind::AllReduce,
                group,
                bytes: Bytes(1 << 20),
                algorithm: CollectiveAlgorithm::Ring,
            });
            let us = |n: u64| SimDuration::from_us(n);
            let mut sends = Vec::new();
            for r in 0..4u32 {
                let rank = RankId(r);
                let forwards = &self.forwards[r as usize];
                let room: Vec<OpId> =
                    forwards.len().checked_sub(2).map(|i| forwards[i]).into_iter().collect();
                let load = graph.compute(rank, StreamId(2), us(3 + u64::from(r)), "load", &room);
                let mut deps = vec![load];
                deps.extend(self.steps[r as usize]);
                let forward =
                    graph.compute(rank, StreamId(0), us(10 + u64::from((r + k) % 3)), "forward", &deps);
                self.forwards[r as usize].push(forward);
                let send = graph.transfer(
                    rank,
                    StreamId(1),
                    RankId((r + 1) % 4),
                    Bytes(64 << 10),
                    "send",
                    &[forward],
                );
                sends.push(send);
            }
            for r in 0..4u32 {
                let rank = RankId(r);
                let received = sends[((r + 3) % 4) as usize];
                let backward =
                    graph.compute(rank, StreamId(0), us(20 + u64::from(r)), "backward", &[received]);
                let reduce = graph.collective(rank, StreamId(3), allreduce, "allreduce", &[backward]);
                let step = graph.compute(rank, StreamId(0), us(2), "step", &[reduce]);
                self.steps[r as usize] = Some(step);
            }
            Ok(true)
        }
    }

    /// Every op's (start, end) and the event count of a streamed run of `count` iterations,
    /// and its peak of held ops.
    fn streamed(count: u32, lookahead: u32) -> (Vec<(SimTime, SimTime)>, u64, usize) {
        let topology = topology();
        let mut network = AnalyticalNetwork::new(&topology);
        let mut source = Iterations::new(count);
        let mut run = StreamRun::new(GraphBuilder::new(4), &mut network, lookahead);
        run.begin(&mut source).unwrap();
        let mut times = Vec::new();
        while run.step(&mut source).unwrap() {
            run.retire_finished(|run, chunk| {
                for op in run.graph().chunk_ops(chunk).unwrap().map(OpId) {
                    let (start, end, done) = run.times(op);
                    assert!(done);
                    times.push((start, end));
                }
            });
        }
        run.finish().unwrap();
        (times, run.events(), run.peak_held_ops())
    }

    #[test]
    fn a_streamed_run_is_the_whole_graph_run_op_for_op() {
        let mut whole = GraphBuilder::new(4);
        let mut source = Iterations::new(12);
        while source.next_chunk(&mut whole).unwrap() {}
        let graph = whole.build().unwrap();
        let topology = topology();
        let timeline = exec::run(&graph, &mut AnalyticalNetwork::new(&topology)).unwrap();
        let (times, events, _) = streamed(12, 1);
        let expected: Vec<(SimTime, SimTime)> =
            timeline.start.iter().copied().zip(timeline.end.iter().copied()).collect();
        assert_eq!(times.len(), graph.op_count());
        assert_eq!(times, expected);
        assert_eq!(events, timeline.events);
    }

    #[test]
    fn held_ops_do_not_grow_with_the_iteration_count() {
        let (_, _, few) = streamed(4, 1);
        let (times, _, many) = streamed(60, 1);
        assert_eq!(times.len(), 60 * 4 * 6);
        // 6 ops per rank and iteration: a few iterations' worth, the same for 4 and for 60.
        assert_eq!(few, many);
        assert!(many <= 4 * 6 * 4, "{many} ops held");
    }

    /// Chunk `k` has one op on a stream of its own that waits only for chunk `k - 3`'s op.
    struct Reaching(u32, Vec<OpId>);

    impl ChunkSource for Reaching {
        type Error = std::convert::Infallible;
        fn next_chunk(&mut self, graph: &mut GraphBuilder) -> Result<bool, Self::Error> {
            let k = self.1.len() as u32;
            if k == self.0 {
                return Ok(false);
            }
            let deps: Vec<OpId> = k.checked_sub(3).map(|i| self.1[i as usize]).into_iter().collect();
            let first = graph.compute(RankId(0), StreamId(0), SimDuration::from_us(5), "work", &[]);
            let _ = first;
            let reaching =
                graph.compute(RankId(1), StreamId(k as u16 + 1), SimDuration::from_us(1), "reach", &deps);
            self.1.push(reaching);
            Ok(true)
        }
    }

    #[test]
    fn a_chunk_that_comes_after_its_op_could_have_started_is_an_error_not_a_different_run() {
        let topology = topology();
        let run_with = |lookahead: u32| {
            let mut network = AnalyticalNetwork::new(&topology);
            let mut source = Reaching(8, Vec::new());
            let mut run = StreamRun::new(GraphBuilder::new(2), &mut network, lookahead);
            run.begin(&mut source)?;
            while run.step(&mut source)? {
                run.retire_finished(|_, _| {});
            }
            Ok::<u64, StreamError<std::convert::Infallible>>(run.events())
        };
        let error = run_with(1).unwrap_err();
        assert!(matches!(error, StreamError::Late { lookahead: 1, .. }), "{error}");
        assert!(run_with(8).is_ok());
    }
}
