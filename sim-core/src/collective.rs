//! Collective algorithms as alpha-beta closed forms (the `analytical` fidelity).
//!
//! Each algorithm is a sequence of synchronous steps; in a step every participating pair moves
//! one message, and the step lasts as long as its slowest message:
//! `latency(path) + message / bottleneck bandwidth(path)`. Contention is ignored by
//! definition: this is the uncontended reference that the flow-level models are tested
//! against. Reduction arithmetic is not charged (it overlaps with the transfers on GPUs).
//!
//! | algorithm | kinds | steps | message per step |
//! |---|---|---|---|
//! | ring | allreduce | 2(p-1) | S/p |
//! | ring | reduce-scatter, allgather | p-1 | S/p |
//! | binomial tree | broadcast, reduce | ceil(log2 p) | S |
//! | pairwise | all-to-all | p-1 | S/p |
//!
//! On a uniform network (every pair alpha, B) the ring allreduce is the textbook
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
    /// Time for a message of `1/parts` of `bytes` to cross the path without contention.
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
    /// A path cost could not be found.
    #[error("no path between {src} and {dst}: {reason}")]
    NoPath {
        /// Source rank.
        src: RankId,
        /// Destination rank.
        dst: RankId,
        /// Why.
        reason: String,
    },
    /// The time does not fit in simulated time.
    #[error("collective time out of range: {0}")]
    Time(#[from] UnitError),
}

/// The uncontended completion time of a collective of `bytes` over `group` (in ring order),
/// given the cost of the path between any two ranks.
pub fn analytical_time(
    kind: CollectiveKind,
    algorithm: CollectiveAlgorithm,
    bytes: Bytes,
    group: &[RankId],
    mut cost: impl FnMut(RankId, RankId) -> Result<PathCost, CollectiveError>,
) -> Result<SimDuration, CollectiveError> {
    let p = group.len();
    if p <= 1 {
        return Ok(SimDuration::ZERO);
    }
    let resolved = algorithm
        .resolve(kind)
        .ok_or(CollectiveError::Unsupported { algorithm: algorithm.name(), kind: kind.name() })?;
    let parts = p as u64;
    let overflow = || UnitError::OutOfRange {
        input: format!("{} of {bytes} over {p} ranks", kind.name()),
        quantity: "collective time",
        reason: "longer than the largest representable duration",
    };
    let mut total = SimDuration::ZERO;
    match resolved {
        CollectiveAlgorithm::Ring => {
            let steps = if kind == CollectiveKind::AllReduce { 2 * (parts - 1) } else { parts - 1 };
            let mut step = SimDuration::ZERO;
            for i in 0..p {
                step = step.max(cost(group[i], group[(i + 1) % p])?.time_for_share(bytes, parts)?);
            }
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
                let mut round = SimDuration::ZERO;
                for v in 0..span.min(p - span) {
                    let (a, b) = (group[(v + root) % p], group[(v + span + root) % p]);
                    let (src, dst) =
                        if matches!(kind, CollectiveKind::Reduce { .. }) { (b, a) } else { (a, b) };
                    round = round.max(cost(src, dst)?.time_for_share(bytes, 1)?);
                }
                total = total.checked_add(round).map_err(|_| overflow())?;
                span *= 2;
            }
        }
        CollectiveAlgorithm::Pairwise => {
            for k in 1..p {
                let mut round = SimDuration::ZERO;
                for i in 0..p {
                    round = round.max(cost(group[i], group[(i + k) % p])?.time_for_share(bytes, parts)?);
                }
                total = total.checked_add(round).map_err(|_| overflow())?;
            }
        }
        CollectiveAlgorithm::Auto => unreachable!("resolve never returns Auto"),
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uniform(
        latency_us: u64,
        bandwidth: &str,
    ) -> impl FnMut(RankId, RankId) -> Result<PathCost, CollectiveError> {
        let cost =
            PathCost { latency: SimDuration::from_us(latency_us), bandwidth: bandwidth.parse().unwrap() };
        move |_, _| Ok(cost)
    }

    fn ranks(p: u32) -> Vec<RankId> {
        (0..p).map(RankId).collect()
    }

    fn time(kind: CollectiveKind, p: u32, bytes: u64) -> SimDuration {
        analytical_time(kind, CollectiveAlgorithm::Auto, Bytes(bytes), &ranks(p), uniform(2, "100 Gb/s"))
            .unwrap()
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
        let one = PathCost { latency: SimDuration::from_us(2), bandwidth: "100 Gb/s".parse().unwrap() }
            .time_for_share(Bytes(1 << 20), 1)
            .unwrap();
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
    fn the_slowest_ring_edge_sets_the_pace() {
        // Ranks 0-3 on one fast island, 4-7 on another; the ring crosses the slow link twice.
        let cost = |a: RankId, b: RankId| {
            let same_island = a.0 / 4 == b.0 / 4;
            Ok(PathCost {
                latency: SimDuration::from_us(if same_island { 1 } else { 5 }),
                bandwidth: if same_island { "300 GB/s" } else { "25 GB/s" }.parse().unwrap(),
            })
        };
        let got = analytical_time(
            CollectiveKind::AllReduce,
            CollectiveAlgorithm::Ring,
            Bytes(8 << 20),
            &ranks(8),
            cost,
        )
        .unwrap();
        let slow_step = 5_000_000 + (1u64 << 20) * 40; // 1 MiB at 25 GB/s is 40 ps per byte
        assert_eq!(got.as_ps(), 14 * slow_step);
    }

    #[test]
    fn one_rank_costs_nothing_and_bad_algorithms_are_refused() {
        assert_eq!(time(CollectiveKind::AllReduce, 1, 1 << 30), SimDuration::ZERO);
        let refused = analytical_time(
            CollectiveKind::AllReduce,
            CollectiveAlgorithm::Pairwise,
            Bytes(1),
            &ranks(4),
            uniform(1, "1 GB/s"),
        );
        assert!(matches!(refused, Err(CollectiveError::Unsupported { .. })));
    }
}
