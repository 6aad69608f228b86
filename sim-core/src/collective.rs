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
//! inside each server, its members rotated by `j`, so every channel leaves a server from a
//! different GPU: with one NIC per GPU, every NIC carries one channel instead of one NIC
//! carrying the whole ring. On 8-GPU servers with 8 x 200 Gb/s NICs the bus bandwidth
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
    network: &impl StepNetwork,
) -> Result<Vec<Vec<RankId>>, CollectiveError> {
    // Members per server, servers in order of first appearance, members in group order.
    let mut servers: Vec<(u32, Vec<RankId>)> = Vec::new();
    let mut position_of_node = std::collections::BTreeMap::new();
    for &rank in group {
        let node = network.node_of(rank)?;
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
            servers
                .iter()
                .flat_map(|(_, members)| {
                    let rotation = j % members.len();
                    members[rotation..].iter().chain(&members[..rotation]).copied()
                })
                .collect()
        })
        .collect())
}

/// The uncontended completion time of a collective of `bytes` over `group` (in ring order).
pub fn analytical_time(
    kind: CollectiveKind,
    algorithm: CollectiveAlgorithm,
    bytes: Bytes,
    group: &[RankId],
    network: &mut impl StepNetwork,
) -> Result<SimDuration, CollectiveError> {
    let p = group.len();
    if p <= 1 {
        return Ok(SimDuration::ZERO);
    }
    let resolved = algorithm
        .resolve(kind)
        .ok_or(CollectiveError::Unsupported { algorithm: algorithm.name(), kind: kind.name() })?;
    let overflow = || UnitError::OutOfRange {
        input: format!("{} of {bytes} over {p} ranks", kind.name()),
        quantity: "collective time",
        reason: "longer than the largest representable duration",
    };
    let mut pairs = Vec::with_capacity(p);
    let mut total = SimDuration::ZERO;
    match resolved {
        CollectiveAlgorithm::Ring => {
            let channels = ring_channels(group, network)?;
            for ring in &channels {
                pairs.extend((0..p).map(|i| (ring[i], ring[(i + 1) % p])));
            }
            let parts = (channels.len() * p) as u64;
            let step = network.step_time(&pairs, bytes, parts)?;
            let steps = if kind == CollectiveKind::AllReduce { 2 * (p as u64 - 1) } else { p as u64 - 1 };
            total = step.checked_mul(steps).map_err(|_| overflow())?;
        }
        CollectiveAlgorithm::BinomialTree => {
            let root = match kind {
                CollectiveKind::Broadcast { root } | CollectiveKind::Reduce { root } => root as usize,
                _ => 0,
            };
            // Round r: virtual ranks below 2^r send to their partner 2^r higher (a reduce runs
            // the same rounds in reverse, which takes the same time).
            let mut span = 1usize;
            while span < p {
                pairs.clear();
                for v in 0..span.min(p - span) {
                    let (a, b) = (group[(v + root) % p], group[(v + span + root) % p]);
                    pairs.push(if matches!(kind, CollectiveKind::Reduce { .. }) { (b, a) } else { (a, b) });
                }
                total = total.checked_add(network.step_time(&pairs, bytes, 1)?).map_err(|_| overflow())?;
                span *= 2;
            }
        }
        CollectiveAlgorithm::Pairwise => {
            for k in 1..p {
                pairs.clear();
                pairs.extend((0..p).map(|i| (group[i], group[(i + k) % p])));
                total =
                    total.checked_add(network.step_time(&pairs, bytes, p as u64)?).map_err(|_| overflow())?;
            }
        }
        CollectiveAlgorithm::Auto => unreachable!("resolve never returns Auto"),
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
        let channels = ring_channels(&ranks(8), &network).unwrap();
        assert_eq!(channels.len(), 4);
        assert_eq!(channels[0], ranks(8));
        assert_eq!(channels[1], [1, 2, 3, 0, 5, 6, 7, 4].map(RankId));
        // The server-crossing edges (last of server 0 -> first of server 1) are all different.
        let exits: Vec<RankId> = channels.iter().map(|ring| ring[3]).collect();
        assert_eq!(exits, [3, 0, 1, 2].map(RankId));
        // A group inside one server, or one rank per server, is a single ring.
        assert_eq!(ring_channels(&ranks(4), &network).unwrap().len(), 1);
        assert_eq!(ring_channels(&ranks(8), &uniform()).unwrap().len(), 1);
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
