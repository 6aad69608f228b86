//! Collective algorithms as schedules: synchronous steps of point-to-point messages.
//!
//! A [`Schedule`] lists, for every member of every lane and every step, the messages the
//! member sends and receives, each a fraction `num / den` of the collective's buffer. The
//! `analytical` model times the steps in closed form; the `flow` model plays every message as a
//! flow and lets each member move on to its next step once its own messages of the step are
//! done (per-member dependencies, no global barrier).
//!
//! | algorithm | kinds | steps (p members) | message |
//! |---|---|---|---|
//! | `ring` (c rail-aligned channels) | allreduce; reduce-scatter, allgather | 2(p-1); p-1 | S/(c p) |
//! | `double-binary-tree` (two trees, C pipelined chunks) | allreduce | C + 2h - 1 | S/(2C) |
//! | `tree` (NCCL: chain in each server, double binary tree across servers, c channels) | allreduce | C + 2H - 1 | S/(2cC) |
//! | `halving-doubling` (Rabenseifner) | allreduce | 2 log2 p (+2 if p is not a power of 2) | S/2 ... S/p ... S/2 |
//! | `recursive-doubling` | allreduce | log2 p (+2) | S |
//! | `hierarchical` (intra-server RS, inter-server ring AR, intra-server AG) | allreduce | 2(g-1) + 2(n-1) | S/g, S/(g n) |
//! | `binomial-tree` | broadcast, reduce | ceil(log2 p) | S |
//! | `chain` (pipelined, C chunks) | broadcast, reduce | C + p - 2 | S/C |
//! | `pairwise` | all-to-all | p-1 | S/p |
//! | `direct` | all-to-all | 1 | S/p to each peer |
//!
//! Here h is the height of a binary tree over p members (floor(log2 p)), g the members per
//! server, n the servers, c the channels (the fewest members on one server) and H = g - 1 +
//! floor(log2 n) the height of NCCL's tree. Pipelined algorithms cut the buffer into chunks of at most the
//! chunk size ([`CHUNK_BYTES`] unless [`Schedule::with_chunk`] says otherwise;
//! C = ceil(message / chunk), at least 1).
//!
//! **Ring channels.** Like NCCL, a ring over a group that spans several servers runs as `c`
//! parallel rings (channels), each carrying `1/c` of the buffer, where `c` is the smallest
//! number of group members on one server. Channel `j` visits the servers in group order and,
//! inside each server, its members rotated by `j`, every other server backwards (a snake), so
//! every channel leaves a server from a different GPU and every server-to-server hop joins
//! two GPUs of the same local index: with one NIC per GPU, every NIC carries one channel
//! instead of one NIC carrying the whole ring, and on rail-optimized networks (NIC i of every
//! server on leaf i) the hops stay on their rail, as NCCL's rail-aligned rings do. On 8-GPU
//! servers with 8 x 200 Gb/s NICs the bus bandwidth approaches 8 x 25 GB/s = 200 GB/s (NVIDIA
//! reports 192 GB/s measured on DGX A100, nccl issue #1576). With one rank per server, `c = 1`
//! and the ring is the textbook `2(p-1) alpha + 2(p-1)/p S/B`.
//!
//! This module knows nothing of protocols or of NCCL's tuner: what a collective costs is
//! timed above it (`collective`, `nccl`), from the messages it lists. Invariants: every step
//! of every lane sends exactly what its partners receive, each message a fraction `num / den`
//! of the buffer, and a schedule is the same for the same (kind, algorithm, bytes, group,
//! servers, chunk).

use units::{Bytes, SimDuration, UnitError};

use crate::graph::{CollectiveAlgorithm, CollectiveKind, RankId};

/// Default largest chunk of a pipelined algorithm (tree, chain): 1 MiB.
pub const CHUNK_BYTES: u64 = 1 << 20;

/// A collective could not be timed.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    /// The algorithm cannot perform the kind (the graph validation normally catches this).
    #[error("algorithm {algorithm} cannot perform {kind}")]
    Unsupported {
        /// The algorithm asked for.
        algorithm: &'static str,
        /// The collective kind.
        kind: &'static str,
    },
    /// The network could not time a message (no path, unknown rank).
    #[error("{0}")]
    Network(String),
    /// The time does not fit in simulated time.
    #[error("collective time out of range: {0}")]
    Time(#[from] UnitError),
}

/// One message of one member in one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// The other member's position on the lane.
    pub peer: u32,
    /// True if this member sends it, false if it receives it.
    pub send: bool,
    /// Its size is `num / den` of the buffer (see [`Schedule::fraction`]).
    pub num: u64,
}

/// A pipelined tree by its levels: the hops of the first chunk's journey, up from the deepest
/// members (level 0) to the roots, then down from the roots (level `2h - 1` reaches the
/// deepest members), each level as the (sender, receiver) pairs that carry it.
///
/// Level `l` carries one chunk on each of its hops in every step from `l` to
/// `l + chunks - 1`, so the messages of step `t` are the hops of the levels
/// [`PipelineSteps::active_levels`]`(t)`, each `1 / den` of the buffer: the levels are what a
/// step is made of, and a step is timed by adding up the loads its levels put on each link
/// instead of listing its messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pipeline {
    /// The hops of each level, in the order the first chunk takes them.
    pub levels: Vec<Vec<(RankId, RankId)>>,
    /// The chunks every hop carries.
    pub chunks: u64,
    /// The least time a step takes, whatever its links: how long one channel takes to move
    /// its chunk at its own rate ([`Schedule::with_step_floor`]; zero: the links decide).
    pub step_floor: SimDuration,
}

impl Pipeline {
    /// Which levels are active in which steps.
    pub fn steps(&self) -> PipelineSteps {
        PipelineSteps { levels: self.levels.len(), chunks: self.chunks, floor: self.step_floor }
    }
}

/// The steps of a [`Pipeline`] of `levels` levels and `chunks` chunks: level `l` is active in
/// steps `l .. l + chunks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineSteps {
    /// Number of levels (`2h`).
    pub levels: usize,
    /// The chunks every hop carries (at least 1).
    pub chunks: u64,
    /// The least time a step takes ([`Pipeline::step_floor`]).
    pub floor: SimDuration,
}

impl PipelineSteps {
    /// Number of steps: `chunks + 2h - 1` (none without levels).
    pub fn count(self) -> u64 {
        if self.levels == 0 { 0 } else { self.chunks + self.levels as u64 - 1 }
    }

    /// The levels whose hops carry a chunk in `step`.
    pub fn active_levels(self, step: u64) -> std::ops::Range<usize> {
        let levels = self.levels as u64;
        let first = step.saturating_sub(self.chunks.saturating_sub(1)).min(levels) as usize;
        let end = step.saturating_add(1).min(levels) as usize;
        first..end.max(first)
    }

    /// The first step after `step` whose levels differ from `step`'s (or the end): the
    /// steps in between are alike (every level active, once the pipeline is full).
    pub fn next_change(self, step: u64) -> u64 {
        let next = step.saturating_add(1);
        let change = if next < self.levels as u64 || next >= self.chunks { next } else { self.chunks };
        change.min(self.count()).max(next)
    }
}

/// How messages flow in each step.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// Position i sends to i+1 and receives from i-1, every step.
    Ring,
    /// Rabenseifner: fold the extra members, recursive-halving reduce-scatter,
    /// recursive-doubling allgather, unfold.
    HalvingDoubling(Recursive, Phases),
    /// Fold, full-buffer exchanges with partners at doubling distances, unfold.
    RecursiveDoubling(Recursive),
    /// Binomial tree from the root outwards (broadcast) or inwards (reduce).
    Binomial { root: usize, inwards: bool },
    /// A pipelined chain in lane order (the root first); a reduce flows backwards.
    Chain { chunks: u64, inwards: bool },
    /// Two heap-ordered binary trees (the second over the reversed group), each reducing then
    /// broadcasting half the buffer in pipelined chunks.
    DoubleTree { chunks: u64, height: u32 },
    /// Pipelined trees of any shape (one per lane), reducing then broadcasting in chunks.
    Trees { chunks: u64, height: u32, shapes: Vec<TreeShape> },
    /// In step t, position i sends to i+t+1 and receives from i-t-1.
    Pairwise,
    /// One step: everyone sends to everyone.
    Direct,
    /// Servers of `g` members, `n` servers, lane in server-major order.
    Hierarchical { g: u32, n: u32 },
}

/// The shape of one tree over a lane's positions.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TreeShape {
    /// Parent of each position (`u32::MAX` for the root).
    parent: Vec<u32>,
    /// Depth of each position (the root is 0).
    depth: Vec<u32>,
    /// Children of position i: `children[child_start[i]..child_start[i + 1]]`.
    child_start: Vec<u32>,
    children: Vec<u32>,
}

impl TreeShape {
    fn new(parent: Vec<u32>) -> TreeShape {
        let p = parent.len();
        let mut depth = vec![u32::MAX; p];
        // Parents come before children in every lane built here, but do not rely on it.
        fn depth_of(i: usize, parent: &[u32], depth: &mut [u32]) -> u32 {
            if depth[i] != u32::MAX {
                return depth[i];
            }
            let d = if parent[i] == u32::MAX { 0 } else { depth_of(parent[i] as usize, parent, depth) + 1 };
            depth[i] = d;
            d
        }
        for i in 0..p {
            depth_of(i, &parent, &mut depth);
        }
        let mut counts = vec![0u32; p + 1];
        for &q in parent.iter().filter(|&&q| q != u32::MAX) {
            counts[q as usize + 1] += 1;
        }
        for i in 0..p {
            counts[i + 1] += counts[i];
        }
        let child_start = counts.clone();
        let mut fill = counts;
        let mut children = vec![0u32; child_start[p] as usize];
        for (i, &q) in parent.iter().enumerate() {
            if q != u32::MAX {
                children[fill[q as usize] as usize] = i as u32;
                fill[q as usize] += 1;
            }
        }
        TreeShape { parent, depth, child_start, children }
    }

    fn children(&self, position: u32) -> &[u32] {
        let i = position as usize;
        &self.children[self.child_start[i] as usize..self.child_start[i + 1] as usize]
    }
}

/// NCCL's trees over `group`: for each of `c` channels (the fewest members on one server),
/// two trees. Inside a server the members form a chain from the channel's head (the member at
/// local index `j`, rotated like ring channels so every channel leaves through another GPU
/// and NIC); the heads form a binary tree across servers in heap order, the second tree over
/// the servers in reverse order (a double binary tree: the first tree's inner servers are
/// mostly the second's leaves).
fn nccl_trees(servers: &[(u32, Vec<RankId>)]) -> (Vec<Vec<RankId>>, Vec<TreeShape>) {
    let channels = servers.iter().map(|(_, m)| m.len()).min().unwrap_or(1).max(1);
    let mut lanes = Vec::with_capacity(2 * channels);
    let mut shapes = Vec::with_capacity(2 * channels);
    for j in 0..channels {
        for mirrored in [false, true] {
            let order: Vec<usize> =
                if mirrored { (0..servers.len()).rev().collect() } else { (0..servers.len()).collect() };
            let mut lane = Vec::new();
            let mut parent = Vec::new();
            let mut heads = Vec::with_capacity(order.len());
            for (q, &server) in order.iter().enumerate() {
                let members = &servers[server].1;
                let rotation = j % members.len();
                let head = lane.len() as u32;
                heads.push(head);
                for (offset, &rank) in members[rotation..].iter().chain(&members[..rotation]).enumerate() {
                    lane.push(rank);
                    parent.push(if offset > 0 {
                        head + offset as u32 - 1
                    } else if q > 0 {
                        heads[(q - 1) / 2]
                    } else {
                        u32::MAX
                    });
                }
            }
            lanes.push(lane);
            shapes.push(TreeShape::new(parent));
        }
    }
    (lanes, shapes)
}

/// Which halves of halving-doubling run: both for an allreduce, the recursive-halving
/// reduce-scatter alone, or the recursive-doubling allgather alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phases {
    Both,
    ReduceScatter,
    AllGather,
}

/// The power-of-two core of a recursive algorithm over p members: `power = 2^log <= p`, and
/// the `p - power` extra members fold into their neighbours first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Recursive {
    power: u32,
    log: u32,
    extra: u32,
}

impl Recursive {
    fn new(p: usize) -> Recursive {
        let log = usize::BITS - 1 - p.leading_zeros();
        let power = 1u32 << log;
        Recursive { power, log, extra: p as u32 - power }
    }

    fn folds(self) -> u32 {
        u32::from(self.extra > 0)
    }

    /// The core index of position `pos`, if it takes part in the core (odd positions below
    /// `2 * extra` fold into their even neighbour and wait).
    fn virtual_of(self, pos: u32) -> Option<u32> {
        if pos < 2 * self.extra { (pos % 2 == 0).then_some(pos / 2) } else { Some(pos - self.extra) }
    }

    fn position_of(self, virtual_id: u32) -> u32 {
        if virtual_id < self.extra { 2 * virtual_id } else { virtual_id + self.extra }
    }
}

/// A collective as steps of point-to-point messages on one or more lanes (see the module
/// documentation).
#[derive(Debug, Clone)]
pub struct Schedule {
    lanes: Vec<Vec<RankId>>,
    pattern: Pattern,
    steps: u32,
    bytes: Bytes,
    den: u64,
    step_floor: SimDuration,
}

impl Schedule {
    /// The schedule of `kind` by `algorithm` (not `Auto`: choose first) over `group`, with
    /// pipelined algorithms cut into chunks of at most [`CHUNK_BYTES`]; `node_of` says which
    /// server a rank is on.
    pub fn new(
        kind: CollectiveKind,
        algorithm: CollectiveAlgorithm,
        bytes: Bytes,
        group: &[RankId],
        node_of: impl Fn(RankId) -> Result<u32, CollectiveError>,
    ) -> Result<Schedule, CollectiveError> {
        Schedule::with_chunk(kind, algorithm, bytes, group, node_of, Bytes(CHUNK_BYTES))
    }

    /// [`Schedule::new`] with pipelined algorithms (tree, chain) cut into chunks of at most
    /// `chunk` (at least one byte).
    pub fn with_chunk(
        kind: CollectiveKind,
        algorithm: CollectiveAlgorithm,
        bytes: Bytes,
        group: &[RankId],
        node_of: impl Fn(RankId) -> Result<u32, CollectiveError>,
        chunk: Bytes,
    ) -> Result<Schedule, CollectiveError> {
        use CollectiveAlgorithm as A;
        use CollectiveKind as K;
        let p = group.len();
        let unsupported = || CollectiveError::Unsupported { algorithm: algorithm.name(), kind: kind.name() };
        if !algorithm.supports(kind) || algorithm == A::Auto {
            return Err(unsupported());
        }
        let single = || vec![group.to_vec()];
        if p <= 1 {
            return Ok(Schedule {
                lanes: single(),
                pattern: Pattern::Direct,
                steps: 0,
                bytes,
                den: 1,
                step_floor: SimDuration::ZERO,
            });
        }
        let chunks = |message: u64| message.div_ceil(chunk.0.max(1)).max(1);
        let recursive = Recursive::new(p);
        let (lanes, pattern, steps, den) = match (algorithm, kind) {
            (A::Ring, _) => {
                let channels = ring_channels(group, &node_of)?;
                let den = (channels.len() * p) as u64;
                let steps = if kind == K::AllReduce { 2 * (p - 1) } else { p - 1 };
                (channels, Pattern::Ring, steps as u32, den)
            }
            (A::HalvingDoubling, K::AllReduce) => {
                let steps = 2 * recursive.log + 2 * recursive.folds();
                (
                    single(),
                    Pattern::HalvingDoubling(recursive, Phases::Both),
                    steps,
                    u64::from(recursive.power),
                )
            }
            // A reduce-scatter by recursive halving, an allgather by recursive doubling:
            // power-of-two groups only (each member ends with its own 1/p); others use a ring.
            (A::HalvingDoubling, K::ReduceScatter | K::AllGather) if recursive.extra == 0 => {
                let phases = if kind == K::ReduceScatter { Phases::ReduceScatter } else { Phases::AllGather };
                (
                    single(),
                    Pattern::HalvingDoubling(recursive, phases),
                    recursive.log,
                    u64::from(recursive.power),
                )
            }
            (A::HalvingDoubling, _) => {
                return Schedule::with_chunk(kind, A::Ring, bytes, group, node_of, chunk);
            }
            (A::RecursiveDoubling, _) => {
                let steps = recursive.log + 2 * recursive.folds();
                (single(), Pattern::RecursiveDoubling(recursive), steps, 1)
            }
            (A::DoubleBinaryTree, _) => {
                let chunks = chunks(bytes.0.div_ceil(2));
                let height = usize::BITS - 1 - p.leading_zeros(); // depth of position p-1
                let reversed = group.iter().rev().copied().collect();
                let steps = (chunks + 2 * u64::from(height) - 1) as u32;
                (vec![group.to_vec(), reversed], Pattern::DoubleTree { chunks, height }, steps, 2 * chunks)
            }
            (A::Tree, _) => {
                let servers = members_by_server(group, &node_of)?;
                let (lanes, shapes) = nccl_trees(&servers);
                let lane_count = lanes.len() as u64;
                let chunks = chunks(bytes.0.div_ceil(lane_count));
                let height = shapes.iter().flat_map(|s| s.depth.iter().copied()).max().unwrap_or(0);
                let steps = (chunks + 2 * u64::from(height) - 1) as u32;
                (lanes, Pattern::Trees { chunks, height, shapes }, steps, lane_count * chunks)
            }
            (A::Hierarchical, _) => match servers(group, &node_of)? {
                Some((lane, g, n)) => {
                    let steps = 2 * (g - 1) + 2 * (n - 1);
                    (vec![lane], Pattern::Hierarchical { g, n }, steps, u64::from(g * n))
                }
                // Not several servers of equally many members: an ordinary ring.
                None => return Schedule::with_chunk(kind, A::Ring, bytes, group, node_of, chunk),
            },
            (A::BinomialTree, K::Broadcast { root } | K::Reduce { root }) => {
                let rounds = usize::BITS - (p - 1).leading_zeros(); // ceil(log2 p)
                let inwards = matches!(kind, K::Reduce { .. });
                (single(), Pattern::Binomial { root: root as usize, inwards }, rounds, 1)
            }
            (A::Chain, K::Broadcast { root } | K::Reduce { root }) => {
                let chunks = chunks(bytes.0);
                let mut lane = group.to_vec();
                lane.rotate_left(root as usize);
                let steps = (chunks + p as u64 - 2) as u32;
                (
                    vec![lane],
                    Pattern::Chain { chunks, inwards: matches!(kind, K::Reduce { .. }) },
                    steps,
                    chunks,
                )
            }
            (A::Pairwise, _) => (single(), Pattern::Pairwise, (p - 1) as u32, p as u64),
            (A::Direct, _) => (single(), Pattern::Direct, 1, p as u64),
            _ => return Err(unsupported()),
        };
        Ok(Schedule { lanes, pattern, steps, bytes, den, step_floor: SimDuration::ZERO })
    }

    /// This schedule with every step of its pipeline ([`Schedule::pipeline`]) lasting at least
    /// `floor`: a pipelined tree whose channels move their chunks no faster than their own
    /// rate, whatever the links would allow (see `nccl::wire::schedule_of`).
    pub fn with_step_floor(self, floor: SimDuration) -> Schedule {
        Schedule { step_floor: floor, ..self }
    }

    /// The least time a step of this schedule's pipeline takes ([`Schedule::with_step_floor`]).
    pub fn step_floor(&self) -> SimDuration {
        self.step_floor
    }

    /// The lanes, each a permutation of the group.
    pub fn lanes(&self) -> &[Vec<RankId>] {
        &self.lanes
    }

    /// Number of steps (the same on every lane).
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// The buffer size and the denominator of message fractions: a message is
    /// `bytes * num / den`.
    pub fn fraction(&self) -> (Bytes, u64) {
        (self.bytes, self.den)
    }

    /// True if every step has the same messages (a ring, or a single step), so one step's
    /// time is every step's.
    pub fn steps_are_identical(&self) -> bool {
        matches!(self.pattern, Pattern::Ring) || self.steps <= 1
    }

    /// The steps to time, each with how many steps it stands for: every step once, except
    /// that identical steps are timed once. A ring's steps are all alike; a pipelined tree's
    /// are alike from step 2h to step C-1, where every edge carries a chunk both ways (it
    /// reduces chunk t - (h - d) and broadcasts chunk t - (h + d) at depth d); a chain's from
    /// step p-2 to C-1; a hierarchical allreduce's inside the servers, and across them.
    pub fn step_weights(&self) -> Vec<(u32, u64)> {
        if self.steps == 0 {
            return Vec::new();
        }
        if self.steps_are_identical() {
            return vec![(0, u64::from(self.steps))];
        }
        let steady = match self.pattern {
            Pattern::DoubleTree { chunks, height } | Pattern::Trees { chunks, height, .. } => {
                let first = 2 * u64::from(height);
                (chunks > first + 1).then_some((first as u32, chunks as u32))
            }
            Pattern::Chain { chunks, .. } => {
                // From step p - 2 to C - 1 every member but the last sends a chunk on.
                let first = self.lanes.first().map_or(0, Vec::len).saturating_sub(2) as u64;
                (chunks > first + 1).then_some((first as u32, chunks as u32))
            }
            Pattern::Hierarchical { g, n } => {
                // The steps inside the servers (reduce-scatter, then allgather) are all alike,
                // and so are the ring steps across them.
                return vec![(0, 2 * u64::from(g - 1)), (g - 1, 2 * u64::from(n - 1))];
            }
            _ => None,
        };
        match steady {
            Some((first, end)) => (0..first)
                .map(|step| (step, 1))
                .chain(std::iter::once((first, u64::from(end - first))))
                .chain((end..self.steps).map(|step| (step, 1)))
                .collect(),
            None => (0..self.steps).map(|step| (step, 1)).collect(),
        }
    }

    /// The edges of a pipelined tree (NCCL's) with the messages each carries over the whole
    /// collective: every chunk once up from each member to its parent and once down to it
    /// (each message `1 / den` of the buffer); `None` for other schedules.
    pub fn tree_edges(&self) -> Option<Vec<(RankId, RankId, u64)>> {
        let Pattern::Trees { chunks, ref shapes, .. } = self.pattern else { return None };
        let mut edges = Vec::new();
        for (lane, shape) in self.lanes.iter().zip(shapes) {
            for (position, &parent) in shape.parent.iter().enumerate() {
                if parent != u32::MAX {
                    edges.push((lane[position], lane[parent as usize], chunks));
                    edges.push((lane[parent as usize], lane[position], chunks));
                }
            }
        }
        Some(edges)
    }

    /// True for a pipeline whose latency is paid once along its critical path (see
    /// [`Schedule::pipeline`]).
    pub fn is_pipelined(&self) -> bool {
        matches!(self.pattern, Pattern::Trees { .. })
    }

    /// NCCL's tree by its levels (see [`Pipeline`]); `None` for other schedules.
    pub fn pipeline(&self) -> Option<Pipeline> {
        let Pattern::Trees { chunks, height, ref shapes } = self.pattern else { return None };
        let mut levels = vec![Vec::new(); 2 * height as usize];
        for (lane, shape) in self.lanes.iter().zip(shapes) {
            for (position, &parent) in shape.parent.iter().enumerate() {
                if parent == u32::MAX {
                    continue;
                }
                let depth = shape.depth[position] as usize;
                let (me, up) = (lane[position], lane[parent as usize]);
                // Reduce: depth d sends up at level h - d; broadcast: its parent sends down
                // at level h + d - 1.
                levels[height as usize - depth].push((me, up));
                levels[height as usize + depth - 1].push((up, me));
            }
        }
        Some(Pipeline { levels, chunks, step_floor: self.step_floor })
    }

    /// Appends the messages member `position` of `lane` sends and receives in `step`.
    pub fn messages(&self, lane: usize, step: u32, position: u32, out: &mut Vec<Message>) {
        let p = self.lanes[lane].len() as u32;
        let send = |peer: u32, num: u64| Message { peer, send: true, num };
        let receive = |peer: u32, num: u64| Message { peer, send: false, num };
        match self.pattern {
            Pattern::Trees { chunks, height, ref shapes } => {
                let shape = &shapes[lane];
                let in_range = |chunk: i64| (0..chunks as i64).contains(&chunk);
                let (t, h) = (i64::from(step), i64::from(height));
                let d = i64::from(shape.depth[position as usize]);
                let parent = shape.parent[position as usize];
                // As the double binary tree: depth d reduces chunk t - (h - d) to its parent
                // and broadcasts chunk t - (h + d) to its children.
                if parent != u32::MAX && in_range(t - (h - d)) {
                    out.push(send(parent, 1));
                }
                for &child in shape.children(position) {
                    if in_range(t - (h - d - 1)) {
                        out.push(receive(child, 1));
                    }
                    if in_range(t - (h + d)) {
                        out.push(send(child, 1));
                    }
                }
                if parent != u32::MAX && in_range(t - (h + d - 1)) {
                    out.push(receive(parent, 1));
                }
            }
            Pattern::Ring => {
                out.push(send((position + 1) % p, 1));
                out.push(receive((position + p - 1) % p, 1));
            }
            Pattern::Pairwise => {
                let k = step + 1;
                out.push(send((position + k) % p, 1));
                out.push(receive((position + p - k % p) % p, 1));
            }
            Pattern::Direct => {
                for peer in (0..p).filter(|&peer| peer != position) {
                    out.push(send(peer, 1));
                    out.push(receive(peer, 1));
                }
            }
            Pattern::Binomial { root, inwards } => {
                let rounds = self.steps;
                let round = if inwards { rounds - 1 - step } else { step };
                let span = 1u32 << round;
                let v = (position + p - root as u32) % p;
                let at = |virtual_id: u32| (virtual_id + root as u32) % p;
                // Outwards, v < span sends to v + span; inwards the same pairs, reversed.
                if v < span && v + span < p {
                    out.push(if inwards { receive(at(v + span), 1) } else { send(at(v + span), 1) });
                }
                if span <= v && v < 2 * span {
                    out.push(if inwards { send(at(v - span), 1) } else { receive(at(v - span), 1) });
                }
            }
            Pattern::Chain { chunks, inwards } => {
                // Outwards, position d sends chunk t - d to d + 1 at step t. Inwards, the same
                // with distances measured from the far end.
                let distance = |pos: u32| if inwards { p - 1 - pos } else { pos };
                let toward_end =
                    |pos: u32| if inwards { pos.checked_sub(1) } else { (pos + 1 < p).then_some(pos + 1) };
                let toward_root =
                    |pos: u32| if inwards { (pos + 1 < p).then_some(pos + 1) } else { pos.checked_sub(1) };
                let in_range = |chunk: i64| (0..chunks as i64).contains(&chunk);
                let d = i64::from(distance(position));
                if let Some(next) = toward_end(position)
                    && in_range(i64::from(step) - d)
                {
                    out.push(send(next, 1));
                }
                if let Some(previous) = toward_root(position)
                    && in_range(i64::from(step) - (d - 1))
                {
                    out.push(receive(previous, 1));
                }
            }
            Pattern::DoubleTree { chunks, height } => {
                let in_range = |chunk: i64| (0..chunks as i64).contains(&chunk);
                let depth = |pos: u32| 31 - (pos + 1).leading_zeros();
                let (t, h) = (i64::from(step), i64::from(height));
                let d = i64::from(depth(position));
                let children = [2 * position + 1, 2 * position + 2];
                // Reduce: depth d sends chunk t - (h - d) to its parent; broadcast: depth d
                // sends chunk t - (h + d) to its children.
                if position > 0 && in_range(t - (h - d)) {
                    out.push(send((position - 1) / 2, 1));
                }
                for child in children.into_iter().filter(|&child| child < p) {
                    if in_range(t - (h - d - 1)) {
                        out.push(receive(child, 1));
                    }
                    if in_range(t - (h + d)) {
                        out.push(send(child, 1));
                    }
                }
                if position > 0 && in_range(t - (h + d - 1)) {
                    out.push(receive((position - 1) / 2, 1));
                }
            }
            Pattern::HalvingDoubling(r, _) | Pattern::RecursiveDoubling(r) => {
                let halving = matches!(self.pattern, Pattern::HalvingDoubling(..));
                let core_steps = if halving { 2 * r.log } else { r.log };
                let full = if halving { u64::from(r.power) } else { 1 };
                let first_core = r.folds();
                if r.extra > 0 && (step == 0 || step == first_core + core_steps) {
                    // Fold: odd positions below 2 * extra hand their buffer to the even one on
                    // their left; unfold: the result goes back.
                    let unfold = step != 0;
                    if position < 2 * r.extra {
                        let partner = position ^ 1;
                        let sender = if unfold { position % 2 == 0 } else { position % 2 == 1 };
                        out.push(if sender { send(partner, full) } else { receive(partner, full) });
                    }
                    return;
                }
                let Some(v) = r.virtual_of(position) else { return };
                // An allgather alone is the second half of halving-doubling.
                let core = match self.pattern {
                    Pattern::HalvingDoubling(_, Phases::AllGather) => step + r.log,
                    _ => step - first_core,
                };
                let (distance, num) = if !halving {
                    (1 << core, 1)
                } else if core < r.log {
                    // Reduce-scatter by recursive halving: partner P/2, P/4, ...; S/2, S/4, ...
                    (r.power >> (core + 1), u64::from(r.power >> (core + 1)))
                } else {
                    // Allgather by recursive doubling: partner 1, 2, ...; S/P, 2S/P, ...
                    let j = core - r.log;
                    (1 << j, u64::from(1u32 << j))
                };
                let partner = r.position_of(v ^ distance);
                out.push(send(partner, num));
                out.push(receive(partner, num));
            }
            Pattern::Hierarchical { g, n } => {
                let (server, local) = (position / g, position % g);
                let inside = |l: u32| server * g + l % g;
                let across = |s: u32| (s % n) * g + local;
                if step < g - 1 || step >= g - 1 + 2 * (n - 1) {
                    // Reduce-scatter, later allgather, around the server: S/g per step.
                    out.push(send(inside(local + 1), u64::from(n)));
                    out.push(receive(inside(local + g - 1), u64::from(n)));
                } else {
                    // Ring allreduce of this member's S/g across servers: S/(g n) per step.
                    out.push(send(across(server + 1), 1));
                    out.push(receive(across(server + n - 1), 1));
                }
            }
        }
    }

    /// Appends the (sender, receiver, num) of every message of `step` on every lane.
    pub fn step_messages(&self, step: u32, messages: &mut Vec<(RankId, RankId, u64)>) {
        let mut scratch = Vec::new();
        for (lane_index, lane) in self.lanes.iter().enumerate() {
            for position in 0..lane.len() as u32 {
                scratch.clear();
                self.messages(lane_index, step, position, &mut scratch);
                for message in scratch.iter().filter(|m| m.send) {
                    messages.push((lane[position as usize], lane[message.peer as usize], message.num));
                }
            }
        }
    }
}

/// The group in server-major order with `g` members on each of `n > 1` servers, or `None` if
/// the servers hold different numbers of members or there is only one server or one member
/// per server.
fn servers(
    group: &[RankId],
    node_of: &impl Fn(RankId) -> Result<u32, CollectiveError>,
) -> Result<Option<(Vec<RankId>, u32, u32)>, CollectiveError> {
    let servers = members_by_server(group, node_of)?;
    let g = servers[0].1.len();
    if servers.len() < 2 || g < 2 || servers.iter().any(|(_, members)| members.len() != g) {
        return Ok(None);
    }
    let n = servers.len() as u32;
    Ok(Some((servers.into_iter().flat_map(|(_, members)| members).collect(), g as u32, n)))
}

/// The members of `group` per server: servers in order of first appearance, members in group
/// order.
pub(crate) fn members_by_server(
    group: &[RankId],
    node_of: &impl Fn(RankId) -> Result<u32, CollectiveError>,
) -> Result<Vec<(u32, Vec<RankId>)>, CollectiveError> {
    let mut servers: Vec<(u32, Vec<RankId>)> = Vec::new();
    let mut position_of_node = std::collections::BTreeMap::new();
    for &rank in group {
        let node = node_of(rank)?;
        let position = *position_of_node.entry(node).or_insert_with(|| {
            servers.push((node, Vec::new()));
            servers.len() - 1
        });
        servers[position].1.push(rank);
    }
    Ok(servers)
}

/// The rings a ring collective over `group` runs: `c` channels, each a permutation of the
/// group (see the module documentation).
pub fn ring_channels(
    group: &[RankId],
    node_of: impl Fn(RankId) -> Result<u32, CollectiveError>,
) -> Result<Vec<Vec<RankId>>, CollectiveError> {
    let servers = members_by_server(group, &node_of)?;
    let channels =
        if servers.len() <= 1 { 1 } else { servers.iter().map(|(_, m)| m.len()).min().unwrap_or(1) };
    Ok((0..channels)
        .map(|j| {
            let mut ring = Vec::with_capacity(group.len());
            for (index, (_, members)) in servers.iter().enumerate() {
                let rotation = j % members.len();
                let start = ring.len();
                ring.extend(members[rotation..].iter().chain(&members[..rotation]).copied());
                if index % 2 == 1 {
                    // Snake: every other server is walked backwards, so the ring enters it on
                    // the GPU (and NIC) the previous server left from and leaves it on the one
                    // the next server enters on: every server-to-server hop joins two NICs of
                    // the same index (the same rail).
                    ring[start..].reverse();
                }
            }
            ring
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn ranks(p: u32) -> Vec<RankId> {
        (0..p).map(RankId).collect()
    }

    fn schedule(
        kind: CollectiveKind,
        algorithm: CollectiveAlgorithm,
        p: u32,
        per_node: u32,
        bytes: u64,
    ) -> Schedule {
        Schedule::new(kind, algorithm, Bytes(bytes), &ranks(p), |rank| Ok(rank.0 / per_node)).unwrap()
    }

    /// Every algorithm, on awkward sizes too.
    fn all(p: u32) -> Vec<(CollectiveKind, CollectiveAlgorithm, u32)> {
        use CollectiveAlgorithm as A;
        use CollectiveKind as K;
        vec![
            (K::AllReduce, A::Ring, 1),
            (K::AllReduce, A::Ring, 4),
            (K::AllGather, A::Ring, 1),
            (K::ReduceScatter, A::Ring, 2),
            (K::AllReduce, A::HalvingDoubling, 1),
            (K::ReduceScatter, A::HalvingDoubling, 1),
            (K::AllGather, A::HalvingDoubling, 1),
            (K::AllReduce, A::RecursiveDoubling, 1),
            (K::AllReduce, A::DoubleBinaryTree, 1),
            (K::AllReduce, A::Tree, 1),
            (K::AllReduce, A::Tree, 4),
            (K::AllReduce, A::Tree, 3),
            (K::AllReduce, A::Hierarchical, 4),
            (K::Broadcast { root: p / 2 }, A::BinomialTree, 1),
            (K::Reduce { root: p - 1 }, A::BinomialTree, 1),
            (K::Broadcast { root: p / 3 }, A::Chain, 1),
            (K::Reduce { root: 1 }, A::Chain, 1),
            (K::AllToAll, A::Pairwise, 1),
            (K::AllToAll, A::Direct, 1),
        ]
    }

    #[test]
    fn every_message_is_listed_by_both_ends_in_the_same_step() {
        for p in [2u32, 3, 5, 6, 8, 12, 13, 16] {
            for (kind, algorithm, per_node) in all(p) {
                let s = schedule(kind, algorithm, p, per_node, 5 << 20);
                let mut mine = Vec::new();
                let mut theirs = Vec::new();
                for lane in 0..s.lanes().len() {
                    for step in 0..s.steps() {
                        for position in 0..p {
                            mine.clear();
                            s.messages(lane, step, position, &mut mine);
                            for m in &mine {
                                assert_ne!(m.peer, position, "{kind:?} {algorithm:?} p={p}");
                                theirs.clear();
                                s.messages(lane, step, m.peer, &mut theirs);
                                let mirror = Message { peer: position, send: !m.send, num: m.num };
                                assert!(
                                    theirs.contains(&mirror),
                                    "{kind:?} {algorithm:?} p={p} lane {lane} step {step}: {position} lists {m:?}, {} does not",
                                    m.peer
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Follows who holds which part of the data: after the schedule every member must hold
    /// the full result (allreduce, allgather, broadcast) or the root must (reduce).
    #[test]
    fn data_reaches_everyone_who_needs_it() {
        for p in [2u32, 3, 5, 8, 12, 16] {
            for (kind, algorithm, per_node) in all(p) {
                let s = schedule(kind, algorithm, p, per_node, 3 << 20);
                // knows[lane][pos] = set of original contributors whose data has reached pos
                // (as a bitmask), tracked for whole-buffer algorithms in a coarse but sound way:
                // a message carries everything the sender knew at the start of the step.
                if matches!(
                    kind,
                    CollectiveKind::AllToAll | CollectiveKind::ReduceScatter | CollectiveKind::AllGather
                ) {
                    continue;
                }
                for lane in 0..s.lanes().len() {
                    let mut knows: Vec<u64> = (0..p).map(|i| 1u64 << i).collect();
                    if let CollectiveKind::Broadcast { root } = kind {
                        let root_pos = s.lanes()[lane].iter().position(|r| r.0 == root).unwrap() as u32;
                        knows = (0..p).map(|i| if i == root_pos { u64::MAX } else { 0 }).collect();
                    }
                    let mut messages = Vec::new();
                    for step in 0..s.steps() {
                        let before = knows.clone();
                        for position in 0..p {
                            messages.clear();
                            s.messages(lane, step, position, &mut messages);
                            for m in messages.iter().filter(|m| !m.send) {
                                knows[position as usize] |= before[m.peer as usize];
                            }
                        }
                    }
                    let everyone = if p == 64 { u64::MAX } else { (1u64 << p) - 1 };
                    match kind {
                        CollectiveKind::Reduce { root } => {
                            let root_pos = s.lanes()[lane].iter().position(|r| r.0 == root).unwrap();
                            assert_eq!(knows[root_pos] & everyone, everyone, "{algorithm:?} p={p}: reduce");
                        }
                        CollectiveKind::Broadcast { .. } => {
                            assert!(
                                knows.iter().all(|&k| k != 0),
                                "{algorithm:?} p={p}: broadcast {knows:?}"
                            );
                        }
                        _ => {
                            for (i, &k) in knows.iter().enumerate() {
                                assert_eq!(
                                    k & everyone,
                                    everyone,
                                    "{algorithm:?} p={p} lane {lane}: position {i}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tree_edges_carry_every_chunk_both_ways() {
        let s = schedule(CollectiveKind::AllReduce, CollectiveAlgorithm::Tree, 12, 4, 256 << 20);
        let mut counted: std::collections::BTreeMap<(RankId, RankId), u64> = Default::default();
        let mut messages = Vec::new();
        for step in 0..s.steps() {
            messages.clear();
            s.step_messages(step, &mut messages);
            for &(src, dst, _) in &messages {
                *counted.entry((src, dst)).or_insert(0) += 1;
            }
        }
        let mut listed: std::collections::BTreeMap<(RankId, RankId), u64> = Default::default();
        for (src, dst, count) in s.tree_edges().unwrap() {
            *listed.entry((src, dst)).or_insert(0) += count;
        }
        assert_eq!(counted, listed);
    }

    #[test]
    fn a_tree_step_is_the_hops_of_its_active_levels() {
        // Servers of 4 (also a short last one), chunk counts around twice the height.
        for (p, per_node) in [(2u32, 1u32), (8, 4), (12, 4), (13, 4), (20, 4), (5, 1), (16, 2)] {
            for chunks in [1u64, 2, 5, 8, 9, 10, 30] {
                let tree = |bytes| {
                    schedule(CollectiveKind::AllReduce, CollectiveAlgorithm::Tree, p, per_node, bytes)
                };
                let lanes = tree(1).lanes().len() as u64;
                let s = tree(lanes * chunks * CHUNK_BYTES);
                let pipeline = s.pipeline().expect("a tree is a pipeline");
                let steps = pipeline.steps();
                assert_eq!(steps.chunks, chunks);
                assert_eq!(steps.count(), u64::from(s.steps()), "p={p} chunks={chunks}");
                let mut messages = Vec::new();
                let mut step = 0;
                while step < steps.count() {
                    let next = steps.next_change(step);
                    assert!(next > step);
                    for alike in step..next {
                        assert_eq!(steps.active_levels(alike), steps.active_levels(step));
                        messages.clear();
                        s.step_messages(alike as u32, &mut messages);
                        let mut listed: Vec<_> = messages.iter().map(|&(src, dst, _)| (src, dst)).collect();
                        let mut levels: Vec<_> =
                            pipeline.levels[steps.active_levels(alike)].iter().flatten().copied().collect();
                        listed.sort();
                        levels.sort();
                        assert_eq!(listed, levels, "p={p} chunks={chunks} step {alike}");
                        assert!(messages.iter().all(|m| m.2 == 1));
                    }
                    step = next;
                }
            }
        }
    }

    #[test]
    fn steady_tree_steps_are_alike() {
        // Every step from 2h to C-1 has the same messages as step 2h.
        for algorithm in [CollectiveAlgorithm::DoubleBinaryTree, CollectiveAlgorithm::Tree] {
            let s = schedule(CollectiveKind::AllReduce, algorithm, 12, 4, 256 << 20);
            let weights = s.step_weights();
            assert_eq!(weights.iter().map(|w| w.1).sum::<u64>(), u64::from(s.steps()));
            let &(first, count) = weights.iter().find(|w| w.1 > 1).expect("a steady range");
            let messages = |step| {
                let mut out = Vec::new();
                s.step_messages(step, &mut out);
                out
            };
            for step in first..first + count as u32 {
                assert_eq!(messages(step), messages(first), "{algorithm:?} step {step}");
            }
        }
    }

    #[test]
    fn step_weights_stand_for_every_step() {
        // The weighted steps carry exactly the messages of all the steps, as a multiset.
        let cases = [
            (CollectiveKind::AllReduce, CollectiveAlgorithm::Hierarchical, 12, 4),
            (CollectiveKind::AllReduce, CollectiveAlgorithm::Hierarchical, 16, 2),
            (CollectiveKind::Broadcast { root: 0 }, CollectiveAlgorithm::Chain, 12, 1),
            (CollectiveKind::Reduce { root: 3 }, CollectiveAlgorithm::Chain, 10, 2),
            (CollectiveKind::AllReduce, CollectiveAlgorithm::Tree, 12, 4),
            (CollectiveKind::AllReduce, CollectiveAlgorithm::HalvingDoubling, 6, 1),
            (CollectiveKind::AllToAll, CollectiveAlgorithm::Pairwise, 7, 1),
        ];
        for (kind, algorithm, p, per_node) in cases {
            let s = schedule(kind, algorithm, p, per_node, 64 << 20);
            let step = |step| {
                let mut out = Vec::new();
                s.step_messages(step, &mut out);
                out
            };
            let mut all: BTreeMap<(RankId, RankId, u64), u64> = BTreeMap::new();
            for t in 0..s.steps() {
                for message in step(t) {
                    *all.entry(message).or_default() += 1;
                }
            }
            let mut weighted: BTreeMap<(RankId, RankId, u64), u64> = BTreeMap::new();
            let weights = s.step_weights();
            for &(t, repeat) in &weights {
                for message in step(t) {
                    *weighted.entry(message).or_default() += repeat;
                }
            }
            assert_eq!(weights.iter().map(|w| w.1).sum::<u64>(), u64::from(s.steps()), "{algorithm:?}");
            assert_eq!(weighted, all, "{kind:?} {algorithm:?} p={p} per node {per_node}");
            if matches!(algorithm, CollectiveAlgorithm::Hierarchical | CollectiveAlgorithm::Chain) {
                assert!(weights.len() < s.steps() as usize, "{algorithm:?}: identical steps timed once");
            }
        }
    }

    #[test]
    fn halving_doubling_moves_the_textbook_volume() {
        // Each member sends S/2 + S/4 + ... + S/p twice: 2 (p-1)/p S.
        let p = 16u32;
        let s = schedule(CollectiveKind::AllReduce, CollectiveAlgorithm::HalvingDoubling, p, 1, 1 << 20);
        let (_, den) = s.fraction();
        let mut sent = 0u64;
        let mut messages = Vec::new();
        for step in 0..s.steps() {
            messages.clear();
            s.messages(0, step, 5, &mut messages);
            sent += messages.iter().filter(|m| m.send).map(|m| m.num).sum::<u64>();
        }
        assert_eq!(sent * u64::from(p), 2 * u64::from(p - 1) * den);
        assert_eq!(s.steps(), 8);
    }

    #[test]
    fn ring_channels_rotate_inside_servers_so_each_leaves_from_another_gpu() {
        let four_per_server = |r: RankId| Ok(r.0 / 4);
        let channels = ring_channels(&ranks(8), four_per_server).unwrap();
        assert_eq!(channels.len(), 4);
        assert_eq!(channels[0], [0, 1, 2, 3, 7, 6, 5, 4].map(RankId));
        assert_eq!(channels[1], [1, 2, 3, 0, 4, 7, 6, 5].map(RankId));
        // The server-crossing edges join GPUs of the same local index, a different one per
        // channel, both ways round the ring.
        for (j, ring) in channels.iter().enumerate() {
            assert_eq!(ring[3].0 % 4, ring[4].0 % 4, "channel {j} crosses rails going out");
            assert_eq!(ring[7].0 % 4, ring[0].0 % 4, "channel {j} crosses rails coming back");
        }
        let exits: Vec<u32> = channels.iter().map(|ring| ring[3].0).collect();
        assert_eq!(exits, [3, 0, 1, 2]);
        // A group inside one server, or one rank per server, is a single ring.
        assert_eq!(ring_channels(&ranks(4), four_per_server).unwrap().len(), 1);
        let one_per_server = |r: RankId| Ok(r.0);
        assert_eq!(ring_channels(&ranks(8), one_per_server).unwrap().len(), 1);
    }
}
