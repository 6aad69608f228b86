//! Collective algorithms as alpha-beta closed forms (the `analytical` fidelity).
//!
//! Each algorithm is a sequence of synchronous steps; in a step every participating pair moves
//! one message, and the step lasts as long as its slowest message. A message costs the latency
//! of its path plus its size over the bandwidth it gets, where the messages *of the same step*
//! share every link they cross equally ([`StepNetwork::step_time`]). Traffic of anything else
//! is ignored: this is the uncontended reference the flow-level models are tested against.
//! Reduction arithmetic is not charged (it overlaps with the transfers on GPUs).
//!
//! | algorithm | kinds | steps | message per step |
//! |---|---|---|---|
//! | ring (c channels) | allreduce | 2(p-1) | S/(c p) per channel |
//! | ring (c channels) | reduce-scatter, allgather | p-1 | S/(c p) per channel |
//! | binomial tree | broadcast, reduce | ceil(log2 p) | S |
//! | pairwise | all-to-all | p-1 | S/p |
//!
//! **Ring channels.** Like NCCL, a ring over a group that spans several servers runs as `c`
//! parallel rings (channels), each carrying `1/c` of the buffer, where `c` is the smallest
//! number of group members on one server. Channel `j` visits the servers in group order and,
//! inside each server, its members rotated by `j`, every other server backwards (a snake), so
//! every channel leaves a server from a different GPU and every server-to-server hop joins
//! two GPUs of the same local index: with one NIC per GPU, every NIC carries one channel
//! instead of one NIC carrying the whole ring, and on rail-optimized networks (NIC i of every
//! server on leaf i) the hops stay on their rail, as NCCL's rail-aligned rings do. On 8-GPU servers with 8 x 200 Gb/s NICs the bus bandwidth
//! approaches 8 x 25 GB/s = 200 GB/s (NVIDIA reports 192 GB/s measured on DGX A100, nccl issue
//! #1576). With one rank per server, `c = 1` and the ring is the textbook
//! `2(p-1) alpha + 2(p-1)/p S/B`.

use units::{Bandwidth, Bytes, SimDuration, UnitError};

use crate::graph::{CollectiveAlgorithm, CollectiveKind, RankId};

/// Latency and bottleneck bandwidth of the path between two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathCost {
    /// Sum of the link latencies on the path.
    pub latency: SimDuration,
    /// The smallest link bandwidth on the path.
    pub bandwidth: Bandwidth,
}

impl PathCost {
    /// Time for a message of `1/parts` of `bytes` to cross the path alone.
    pub fn time_for_share(self, bytes: Bytes, parts: u64) -> Result<SimDuration, UnitError> {
        let serialization = self.bandwidth.time_to_send_share(bytes, parts)?;
        self.latency.checked_add(serialization).map_err(|_| UnitError::OutOfRange {
            input: format!("{bytes}"),
            quantity: "message time",
            reason: "longer than the largest representable duration",
        })
    }
}

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

/// What an algorithm needs from the network: where ranks sit, and how long one step takes.
pub trait StepNetwork {
    /// The server that `rank` sits in (ring channels are rotated within servers).
    fn node_of(&self, rank: RankId) -> Result<u32, CollectiveError>;

    /// Duration of one synchronous step in which every `(src, dst)` pair sends `1/parts` of
    /// `bytes`, the step's messages sharing each link they cross equally: the slowest message's
    /// path latency plus its size times the number of the step's messages on its busiest link,
    /// over that link's bandwidth.
    fn step_time(
        &mut self,
        pairs: &[(RankId, RankId)],
        bytes: Bytes,
        parts: u64,
    ) -> Result<SimDuration, CollectiveError>;
}

/// The rings a ring collective over `group` runs: `c` channels, each a permutation of the
/// group (see the module documentation).
pub fn ring_channels(
    group: &[RankId],
    node_of: impl Fn(RankId) -> Result<u32, CollectiveError>,
) -> Result<Vec<Vec<RankId>>, CollectiveError> {
    // Members per server, servers in order of first appearance, members in group order.
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

/// How messages flow in each step of an algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    /// Position i sends to i+1 and receives from i-1, every step.
    Ring,
    /// Binomial tree from the root outwards (broadcast).
    TreeOut {
        /// Position of the root.
        root: usize,
    },
    /// Binomial tree towards the root (reduce): the broadcast's rounds reversed.
    TreeIn {
        /// Position of the root.
        root: usize,
    },
    /// In step t, position i sends to i+t+1 and receives from i-t-1.
    Pairwise,
}

/// A collective as synchronous steps of point-to-point messages, on one or more independent
/// lanes (ring channels). In each step every member of a lane sends at most one message and
/// receives at most one, all of `bytes / parts`. The `analytical` model times the steps with
/// closed forms; the `flow` model turns each message into a flow and lets each member move on
/// to the next step once its own messages of the step are done (per-member dependencies, no
/// global barrier, as SimGrid's reference harness does).
#[derive(Debug, Clone)]
pub struct Schedule {
    lanes: Vec<Vec<RankId>>,
    pattern: Pattern,
    steps: u32,
    bytes: Bytes,
    parts: u64,
}

impl Schedule {
    /// The schedule of `kind` by `algorithm` over `group`; `node_of` says which server a rank
    /// is on (ring channels are rotated within servers).
    pub fn new(
        kind: CollectiveKind,
        algorithm: CollectiveAlgorithm,
        bytes: Bytes,
        group: &[RankId],
        node_of: impl Fn(RankId) -> Result<u32, CollectiveError>,
    ) -> Result<Schedule, CollectiveError> {
        let p = group.len();
        let resolved = algorithm
            .resolve(kind)
            .ok_or(CollectiveError::Unsupported { algorithm: algorithm.name(), kind: kind.name() })?;
        let single = || vec![group.to_vec()];
        let rounds = usize::BITS - p.saturating_sub(1).leading_zeros(); // ceil(log2 p)
        let (lanes, pattern, steps, parts) = match (resolved, kind) {
            _ if p <= 1 => (single(), Pattern::Ring, 0, 1),
            (CollectiveAlgorithm::Ring, _) => {
                let channels = ring_channels(group, node_of)?;
                let parts = (channels.len() * p) as u64;
                let steps = if kind == CollectiveKind::AllReduce { 2 * (p - 1) } else { p - 1 };
                (channels, Pattern::Ring, steps as u32, parts)
            }
            (CollectiveAlgorithm::BinomialTree, CollectiveKind::Reduce { root }) => {
                (single(), Pattern::TreeIn { root: root as usize }, rounds, 1)
            }
            (CollectiveAlgorithm::BinomialTree, CollectiveKind::Broadcast { root }) => {
                (single(), Pattern::TreeOut { root: root as usize }, rounds, 1)
            }
            (CollectiveAlgorithm::Pairwise, _) => (single(), Pattern::Pairwise, (p - 1) as u32, p as u64),
            _ => return Err(CollectiveError::Unsupported { algorithm: algorithm.name(), kind: kind.name() }),
        };
        Ok(Schedule { lanes, pattern, steps, bytes, parts })
    }

    /// The lanes, each a permutation of the group.
    pub fn lanes(&self) -> &[Vec<RankId>] {
        &self.lanes
    }

    /// Number of steps (the same on every lane).
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// The buffer size and the number of parts it is cut into: a message is `bytes / parts`.
    pub fn message(&self) -> (Bytes, u64) {
        (self.bytes, self.parts)
    }

    /// True if every step has the same messages (a ring), so one step's time is all steps'.
    pub fn steps_are_identical(&self) -> bool {
        self.pattern == Pattern::Ring
    }

    fn members(&self) -> usize {
        self.lanes.first().map_or(0, Vec::len)
    }

    /// The round of a binomial tree that `step` is, and the virtual position of `position`.
    fn tree(&self, root: usize, step: u32, position: usize, inwards: bool) -> (usize, usize) {
        let round = if inwards { self.steps - 1 - step } else { step };
        let p = self.members();
        (1usize << round, (position + p - root) % p)
    }

    /// The position that `position` sends to in `step`, if it sends.
    pub fn send_to(&self, step: u32, position: usize) -> Option<usize> {
        let p = self.members();
        match self.pattern {
            Pattern::Ring => Some((position + 1) % p),
            Pattern::Pairwise => Some((position + step as usize + 1) % p),
            Pattern::TreeOut { root } => {
                let (span, v) = self.tree(root, step, position, false);
                (v < span && v + span < p).then(|| (v + span + root) % p)
            }
            Pattern::TreeIn { root } => {
                let (span, v) = self.tree(root, step, position, true);
                (span <= v && v < 2 * span).then(|| (v - span + root) % p)
            }
        }
    }

    /// The position that `position` receives from in `step`, if it receives.
    pub fn receive_from(&self, step: u32, position: usize) -> Option<usize> {
        let p = self.members();
        match self.pattern {
            Pattern::Ring => Some((position + p - 1) % p),
            Pattern::Pairwise => Some((position + p - (step as usize + 1) % p) % p),
            Pattern::TreeOut { root } => {
                let (span, v) = self.tree(root, step, position, false);
                (span <= v && v < 2 * span).then(|| (v - span + root) % p)
            }
            Pattern::TreeIn { root } => {
                let (span, v) = self.tree(root, step, position, true);
                (v < span && v + span < p).then(|| (v + span + root) % p)
            }
        }
    }

    /// Appends the (sender, receiver) ranks of every message of `step` on every lane.
    pub fn step_pairs(&self, step: u32, pairs: &mut Vec<(RankId, RankId)>) {
        for lane in &self.lanes {
            for (position, &rank) in lane.iter().enumerate() {
                if let Some(to) = self.send_to(step, position) {
                    pairs.push((rank, lane[to]));
                }
            }
        }
    }
}

/// The uncontended completion time of a collective of `bytes` over `group` (in ring order).
pub fn analytical_time(
    kind: CollectiveKind,
    algorithm: CollectiveAlgorithm,
    bytes: Bytes,
    group: &[RankId],
    network: &mut impl StepNetwork,
) -> Result<SimDuration, CollectiveError> {
    let schedule = Schedule::new(kind, algorithm, bytes, group, |rank| network.node_of(rank))?;
    let (bytes, parts) = schedule.message();
    let overflow = || UnitError::OutOfRange {
        input: format!("{} of {bytes} over {} ranks", kind.name(), group.len()),
        quantity: "collective time",
        reason: "longer than the largest representable duration",
    };
    let mut pairs = Vec::with_capacity(group.len() * schedule.lanes().len());
    let timed_steps = if schedule.steps_are_identical() { schedule.steps().min(1) } else { schedule.steps() };
    let mut total = SimDuration::ZERO;
    for step in 0..timed_steps {
        pairs.clear();
        schedule.step_pairs(step, &mut pairs);
        total = total.checked_add(network.step_time(&pairs, bytes, parts)?).map_err(|_| overflow())?;
    }
    if schedule.steps_are_identical() {
        total = total.checked_mul(u64::from(schedule.steps())).map_err(|_| overflow())?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pair has its own path of `cost`; `per_node` ranks per server.
    struct Uniform {
        cost: PathCost,
        per_node: u32,
    }

    impl StepNetwork for Uniform {
        fn node_of(&self, rank: RankId) -> Result<u32, CollectiveError> {
            Ok(rank.0 / self.per_node)
        }
        fn step_time(
            &mut self,
            pairs: &[(RankId, RankId)],
            bytes: Bytes,
            parts: u64,
        ) -> Result<SimDuration, CollectiveError> {
            assert!(!pairs.is_empty());
            Ok(self.cost.time_for_share(bytes, parts)?)
        }
    }

    fn uniform() -> Uniform {
        Uniform {
            cost: PathCost { latency: SimDuration::from_us(2), bandwidth: "100 Gb/s".parse().unwrap() },
            per_node: 1,
        }
    }

    fn ranks(p: u32) -> Vec<RankId> {
        (0..p).map(RankId).collect()
    }

    fn time(kind: CollectiveKind, p: u32, bytes: u64) -> SimDuration {
        analytical_time(kind, CollectiveAlgorithm::Auto, Bytes(bytes), &ranks(p), &mut uniform()).unwrap()
    }

    #[test]
    fn ring_allreduce_is_the_textbook_formula() {
        // 2(p-1) alpha + 2(p-1)/p S/B with alpha = 2 us, B = 12.5e9 B/s: exact in picoseconds.
        for (p, bytes) in [(8u64, 1u64 << 20), (16, 64 << 20), (1024, 1 << 30)] {
            let expected = 2 * (p - 1) * (2_000_000 + bytes * 80 / p);
            assert_eq!(time(CollectiveKind::AllReduce, p as u32, bytes).as_ps(), expected, "p={p}");
        }
    }

    #[test]
    fn reduce_scatter_and_allgather_are_half_an_allreduce() {
        let all = time(CollectiveKind::AllReduce, 16, 1 << 26);
        assert_eq!(time(CollectiveKind::ReduceScatter, 16, 1 << 26).as_ps() * 2, all.as_ps());
        assert_eq!(time(CollectiveKind::AllGather, 16, 1 << 26).as_ps() * 2, all.as_ps());
    }

    #[test]
    fn binomial_broadcast_takes_ceil_log2_rounds() {
        let one = uniform().cost.time_for_share(Bytes(1 << 20), 1).unwrap();
        for (p, rounds) in [(2u32, 1u64), (3, 2), (8, 3), (9, 4), (1000, 10)] {
            for root in [0, p - 1] {
                assert_eq!(
                    time(CollectiveKind::Broadcast { root }, p, 1 << 20).as_ps(),
                    rounds * one.as_ps()
                );
                assert_eq!(time(CollectiveKind::Reduce { root }, p, 1 << 20).as_ps(), rounds * one.as_ps());
            }
        }
    }

    #[test]
    fn pairwise_all_to_all_takes_p_minus_1_rounds_of_one_share() {
        let p = 8u64;
        assert_eq!(
            time(CollectiveKind::AllToAll, p as u32, 1 << 20).as_ps(),
            (p - 1) * (2_000_000 + (80 << 20) / p)
        );
    }

    #[test]
    fn ring_channels_rotate_inside_servers_so_each_leaves_from_another_gpu() {
        let network = Uniform { per_node: 4, ..uniform() };
        let channels = ring_channels(&ranks(8), |r| network.node_of(r)).unwrap();
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
        assert_eq!(ring_channels(&ranks(4), |r| network.node_of(r)).unwrap().len(), 1);
        let one_per_server = uniform();
        assert_eq!(ring_channels(&ranks(8), |r| one_per_server.node_of(r)).unwrap().len(), 1);
    }

    #[test]
    fn every_send_has_a_matching_receive_in_every_step() {
        for p in [2u32, 3, 5, 8, 13] {
            for (kind, algorithm) in [
                (CollectiveKind::AllReduce, CollectiveAlgorithm::Ring),
                (CollectiveKind::AllGather, CollectiveAlgorithm::Ring),
                (CollectiveKind::Broadcast { root: p / 2 }, CollectiveAlgorithm::BinomialTree),
                (CollectiveKind::Reduce { root: p - 1 }, CollectiveAlgorithm::BinomialTree),
                (CollectiveKind::AllToAll, CollectiveAlgorithm::Pairwise),
            ] {
                let network = uniform();
                let schedule =
                    Schedule::new(kind, algorithm, Bytes(1 << 20), &ranks(p), |r| network.node_of(r))
                        .unwrap();
                for step in 0..schedule.steps() {
                    for position in 0..p as usize {
                        if let Some(to) = schedule.send_to(step, position) {
                            assert_ne!(to, position);
                            assert_eq!(
                                schedule.receive_from(step, to),
                                Some(position),
                                "{kind:?} p={p} step {step}"
                            );
                        }
                        if let Some(from) = schedule.receive_from(step, position) {
                            assert_eq!(
                                schedule.send_to(step, from),
                                Some(position),
                                "{kind:?} p={p} step {step}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_broadcast_reaches_everyone_and_a_reduce_collects_everyone() {
        for p in [2u32, 3, 6, 8, 11] {
            let root = p / 3;
            let schedule = Schedule::new(
                CollectiveKind::Broadcast { root },
                CollectiveAlgorithm::BinomialTree,
                Bytes(1),
                &ranks(p),
                |r| uniform().node_of(r),
            )
            .unwrap();
            let mut has = vec![false; p as usize];
            has[root as usize] = true;
            for step in 0..schedule.steps() {
                let senders: Vec<usize> =
                    (0..p as usize).filter(|&i| schedule.send_to(step, i).is_some()).collect();
                for i in senders {
                    assert!(has[i], "p={p}: position {i} sends before it has the data");
                    has[schedule.send_to(step, i).unwrap()] = true;
                }
            }
            assert!(has.iter().all(|&h| h), "p={p}");
        }
    }

    #[test]
    fn one_rank_costs_nothing_and_bad_algorithms_are_refused() {
        assert_eq!(time(CollectiveKind::AllReduce, 1, 1 << 30), SimDuration::ZERO);
        let refused = analytical_time(
            CollectiveKind::AllReduce,
            CollectiveAlgorithm::Pairwise,
            Bytes(1),
            &ranks(4),
            &mut uniform(),
        );
        assert!(matches!(refused, Err(CollectiveError::Unsupported { .. })));
    }
}
