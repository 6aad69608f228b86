//! The choice of a collective's algorithm and protocol (`auto`), as NCCL makes it.
//!
//! **Choosing (`auto`).** NCCL's tuner (`src/graph/tuning.cc`) estimates, for every algorithm
//! it has for a collective, `latency + size / bandwidth` on the detected topology and runs the
//! fastest. For an allreduce with protocols on, on a cluster NCCL's tuner knows, [`choose`]
//! asks that same model (`tuner`); otherwise it times every candidate
//! ([`CollectiveAlgorithm::candidates`] of the kind, with every allowed protocol) on the real
//! topology and picks the one with the smallest time ([`time_of`]; ties go to the first
//! candidate). On a multi-server cluster that gives the tree for small allreduces (fewer
//! latency terms: 2 log2 p against 2(p-1)) and the ring for large ones (the tree's pipeline
//! moves each byte through more hops). The run's NCCL settings (`nccl-algorithms`,
//! `nccl-protocols`) narrow what `auto` chooses from; an algorithm or protocol asked for by
//! name runs as asked.
//!
//! [`analytical_time`] is the choice followed by its time: the `analytical` fidelity's cost
//! of a collective, and the estimate the flow models choose by.

use units::{Bytes, SimDuration};

use crate::graph::{CollectiveAlgorithm, CollectiveKind, RankId};
use crate::nccl::network::NcclNetwork;
use crate::nccl::protocol::{Choice, Protocol, ProtocolChoice, is_in_network};
use crate::nccl::timing::{in_network_fits, time_of};
use crate::nccl::tuner::allreduce_time;
use crate::schedule::{CollectiveError, members_by_server};

/// The uncontended completion time of a collective of `bytes` over `group` (in ring order)
/// by `algorithm`, its fixed cost included; `Auto` (and the protocol, when protocols are
/// `auto`) are resolved with [`choose`] first.
pub fn analytical_time(
    kind: CollectiveKind,
    algorithm: CollectiveAlgorithm,
    bytes: Bytes,
    group: &[RankId],
    network: &mut impl NcclNetwork,
) -> Result<SimDuration, CollectiveError> {
    let choice = choose_for(kind, algorithm, bytes, group, network)?;
    time_of(kind, choice, bytes, group, network)
}

/// What `Auto` runs for this collective: the candidate algorithm (and protocol) with the
/// smallest [`time_of`] on `network` (see the module documentation).
pub fn choose(
    kind: CollectiveKind,
    bytes: Bytes,
    group: &[RankId],
    network: &mut impl NcclNetwork,
) -> Result<Choice, CollectiveError> {
    choose_for(kind, CollectiveAlgorithm::Auto, bytes, group, network)
}

/// [`choose`] among `algorithm` alone unless it is `Auto`; the protocol is the fastest of the
/// network's protocol choice (none when protocols are off).
pub fn choose_for(
    kind: CollectiveKind,
    algorithm: CollectiveAlgorithm,
    bytes: Bytes,
    group: &[RankId],
    network: &mut impl NcclNetwork,
) -> Result<Choice, CollectiveError> {
    // The run's NCCL settings narrow what `auto` chooses from (NCCL_ALGO for an allreduce,
    // NCCL_PROTO); an algorithm or protocol asked for by name runs as asked.
    let nccl = network.nccl();
    let allowed: Vec<CollectiveAlgorithm>;
    let algorithms: &[CollectiveAlgorithm] = match algorithm {
        CollectiveAlgorithm::Auto if kind == CollectiveKind::AllReduce => {
            allowed = CollectiveAlgorithm::candidates(kind)
                .iter()
                .copied()
                .filter(|candidate| nccl.algorithms.allows(candidate.name()))
                .collect();
            &allowed
        }
        CollectiveAlgorithm::Auto => CollectiveAlgorithm::candidates(kind),
        _ => std::slice::from_ref(&algorithm),
    };
    let protocols: Vec<Option<Protocol>> = match network.protocols() {
        ProtocolChoice::Off => vec![None],
        ProtocolChoice::Auto => Protocol::ALL
            .iter()
            .copied()
            .filter(|protocol| nccl.protocols.allows(protocol.name()))
            .map(Some)
            .collect(),
        choice => choice.candidates().iter().copied().map(Some).collect(),
    };
    if algorithms.len() == 1 && protocols.len() == 1 {
        if !algorithms[0].supports(kind) {
            return Err(CollectiveError::Unsupported { algorithm: algorithms[0].name(), kind: kind.name() });
        }
        let protocol =
            if is_in_network(algorithms[0]) { protocols[0].map(|_| Protocol::Simple) } else { protocols[0] };
        return Ok(Choice { algorithm: algorithms[0], protocol });
    }
    if kind == CollectiveKind::AllReduce
        && network.protocols() != ProtocolChoice::Off
        && let Some(fabric) = network.tuner_fabric()
        && algorithms
            .iter()
            .all(|&a| matches!(a, CollectiveAlgorithm::Ring | CollectiveAlgorithm::Tree) || is_in_network(a))
    {
        // As NCCL: its own latency/bandwidth model picks, not a simulation.
        let nodes = members_by_server(group, &|rank| network.node_of(rank))?.len() as u32;
        let launch_us = network.collective_launch().as_ps() as f64 / 1e6;
        let mut best: Option<(f64, Choice)> = None;
        for &candidate in algorithms {
            if is_in_network(candidate) && !in_network_fits(candidate, group, network)? {
                continue;
            }
            for &protocol in protocols.iter().flatten() {
                let estimate = allreduce_time(
                    &fabric,
                    candidate,
                    protocol,
                    group.len() as u32,
                    nodes,
                    launch_us,
                    bytes.0,
                );
                if let Some(time) = estimate
                    && best.is_none_or(|(fastest, _)| time < fastest)
                {
                    best = Some((time, Choice { algorithm: candidate, protocol: Some(protocol) }));
                }
            }
        }
        if let Some((_, choice)) = best {
            return Ok(choice);
        }
    }
    let mut best: Option<(SimDuration, Choice)> = None;
    for &candidate in algorithms {
        if is_in_network(candidate) && !in_network_fits(candidate, group, network)? {
            continue;
        }
        for &protocol in &protocols {
            if is_in_network(candidate) && protocol.is_some_and(|p| p != Protocol::Simple) {
                continue;
            }
            let choice = Choice { algorithm: candidate, protocol };
            let time = time_of(kind, choice, bytes, group, network)?;
            if best.is_none_or(|(fastest, _)| time < fastest) {
                best = Some((time, choice));
            }
        }
    }
    best.map(|(_, choice)| choice).ok_or(match algorithm {
        CollectiveAlgorithm::Nvls | CollectiveAlgorithm::NvlsTree => CollectiveError::Unsupported {
            algorithm: algorithm.name(),
            kind: "allreduce here: NVLS needs an NVSwitch and Hopper or later GPUs (nvls: one server; nvls-tree: \
                   several, the same number of GPUs on each)",
        },
        CollectiveAlgorithm::CollNetDirect | CollectiveAlgorithm::CollNetChain => {
            CollectiveError::Unsupported { algorithm: algorithm.name(), kind: crate::nccl::collnet::UNSUPPORTED }
        }
        CollectiveAlgorithm::Auto if nccl.algorithms != topology::NcclAlgorithms::ALL => {
            CollectiveError::Unsupported {
                algorithm: "auto",
                kind: "allreduce here: none of the algorithms cluster.network.nccl-algorithms allows runs on \
                       this group",
            }
        }
        _ => CollectiveError::Unsupported { algorithm: algorithm.name(), kind: kind.name() },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::testing::{Uniform, hopper, ranks, uniform};
    use CollectiveAlgorithm as A;
    use CollectiveKind as K;
    use topology::NcclSettings;

    /// Picoseconds of `kind` by `algorithm` over `p` ranks, `per_node` per server.
    fn ps(kind: K, algorithm: A, p: u32, per_node: u32, bytes: u64) -> u64 {
        let mut network = Uniform { per_node, ..uniform() };
        analytical_time(kind, algorithm, Bytes(bytes), &ranks(p), &mut network).unwrap().as_ps()
    }

    /// alpha = 2 us; 12.5 GB/s is 80 ps per byte.
    const ALPHA: u64 = 2_000_000;

    #[test]
    fn ring_allreduce_is_the_textbook_formula() {
        // 2(p-1) alpha + 2(p-1)/p S/B: exact in picoseconds.
        for (p, bytes) in [(8u64, 1u64 << 20), (16, 64 << 20), (1024, 1 << 30)] {
            let expected = 2 * (p - 1) * (ALPHA + bytes * 80 / p);
            assert_eq!(ps(K::AllReduce, A::Ring, p as u32, 1, bytes), expected, "p={p}");
        }
    }

    #[test]
    fn reduce_scatter_and_allgather_are_half_a_ring_allreduce() {
        let all = ps(K::AllReduce, A::Ring, 16, 1, 1 << 26);
        assert_eq!(ps(K::ReduceScatter, A::Ring, 16, 1, 1 << 26) * 2, all);
        assert_eq!(ps(K::AllGather, A::Ring, 16, 1, 1 << 26) * 2, all);
    }

    #[test]
    fn halving_doubling_is_2_log2_p_alpha_plus_2_p_minus_1_over_p_s_over_b() {
        for p in [2u64, 4, 16, 64] {
            let bytes = 64u64 << 20;
            let log = 63 - p.leading_zeros() as u64;
            let expected = 2 * log * ALPHA + 2 * (p - 1) * bytes * 80 / p;
            assert_eq!(ps(K::AllReduce, A::HalvingDoubling, p as u32, 1, bytes), expected, "p={p}");
        }
        // Not a power of two: one fold and one unfold of the whole buffer more.
        let (p, bytes) = (12u64, 12u64 << 20);
        let expected = 2 * 3 * ALPHA + 2 * 7 * bytes * 80 / 8 + 2 * (ALPHA + bytes * 80);
        assert_eq!(ps(K::AllReduce, A::HalvingDoubling, p as u32, 1, bytes), expected);
    }

    #[test]
    fn recursive_halving_reduce_scatter_and_doubling_allgather_are_half_of_halving_doubling() {
        // log2 p alpha + (p-1)/p S/B each.
        let (p, bytes) = (16u64, 64u64 << 20);
        let expected = 4 * ALPHA + (p - 1) * bytes * 80 / p;
        assert_eq!(ps(K::ReduceScatter, A::HalvingDoubling, p as u32, 1, bytes), expected);
        assert_eq!(ps(K::AllGather, A::HalvingDoubling, p as u32, 1, bytes), expected);
        // Not a power of two: a ring.
        assert_eq!(
            ps(K::AllGather, A::HalvingDoubling, 12, 1, bytes),
            ps(K::AllGather, A::Ring, 12, 1, bytes)
        );
    }

    #[test]
    fn recursive_doubling_is_log2_p_full_exchanges() {
        let bytes = 1u64 << 16;
        assert_eq!(ps(K::AllReduce, A::RecursiveDoubling, 32, 1, bytes), 5 * (ALPHA + bytes * 80));
    }

    #[test]
    fn pipelined_chain_broadcast_is_chunks_plus_p_minus_2_steps() {
        // 8 MiB in 1 MiB chunks over 16 ranks: (8 + 14) steps of one chunk.
        let bytes = 8u64 << 20;
        let chunk = ALPHA + (1 << 20) * 80;
        assert_eq!(ps(K::Broadcast { root: 5 }, A::Chain, 16, 1, bytes), 22 * chunk);
        assert_eq!(ps(K::Reduce { root: 0 }, A::Chain, 16, 1, bytes), 22 * chunk);
    }

    #[test]
    fn double_binary_tree_is_chunks_plus_2h_minus_1_steps_of_half_chunks() {
        // 16 MiB: each tree carries 8 MiB in 8 chunks of 1 MiB; 16 ranks: height 4.
        let bytes = 16u64 << 20;
        let step = ALPHA + (1 << 20) * 80;
        assert_eq!(ps(K::AllReduce, A::DoubleBinaryTree, 16, 1, bytes), (8 + 2 * 4 - 1) * step);
    }

    #[test]
    fn nccl_tree_is_chunks_plus_twice_its_height_steps_over_its_channels() {
        // 4 servers of 8: 8 channels of two trees, each carrying S/16 in 1 MiB chunks; height
        // 7 (the chain) + 2 (the tree over 4 servers).
        let bytes = 64u64 << 20;
        let step = ALPHA + (1 << 20) * 80;
        assert_eq!(ps(K::AllReduce, A::Tree, 32, 8, bytes), (4 + 2 * 9 - 1) * step);
        // One server: the chain alone (height 7), 8 channels.
        assert_eq!(ps(K::AllReduce, A::Tree, 8, 8, bytes), (4 + 2 * 7 - 1) * step);
    }

    #[test]
    fn the_runs_nccl_settings_narrow_what_auto_chooses() {
        let group = ranks(16);
        let mut free = hopper(NcclSettings::DEFAULT);
        // NCCL's defaults: LL for small allreduces, NVLS-tree (2 servers, Hopper) for large ones.
        let small = choose(K::AllReduce, Bytes(8), &group, &mut free).unwrap();
        assert_eq!(small.protocol, Some(Protocol::Ll), "{small}");
        let large = choose(K::AllReduce, Bytes(1 << 30), &group, &mut free).unwrap();
        assert_eq!(large.algorithm, A::NvlsTree, "{large}");
        // NCCL_ALGO=Ring,Tree, NCCL_PROTO=Simple: NVLS is gone, every protocol is Simple.
        let names = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let ring_tree = NcclSettings {
            algorithms: topology::NcclAlgorithms::from_names(&names(&["ring", "tree"])).unwrap(),
            protocols: topology::NcclProtocols::from_names(&names(&["Simple"])).unwrap(),
            ..NcclSettings::DEFAULT
        };
        let mut gcp = hopper(ring_tree);
        for bytes in [8, 1 << 20, 1 << 30] {
            let choice = choose(K::AllReduce, Bytes(bytes), &group, &mut gcp).unwrap();
            assert!(matches!(choice.algorithm, A::Ring | A::Tree), "{bytes}: {choice}");
            assert_eq!(choice.protocol, Some(Protocol::Simple), "{bytes}: {choice}");
        }
        // An algorithm or protocol asked for by name runs as asked.
        let ll = choose_for(K::AllReduce, A::Ring, Bytes(8), &group, &mut gcp).unwrap();
        assert_eq!(ll.algorithm, A::Ring);
        // Other kinds keep their candidates (parasim's reduce-scatter is a ring).
        let tree_only = NcclSettings {
            algorithms: topology::NcclAlgorithms::from_names(&names(&["tree"])).unwrap(),
            ..ring_tree
        };
        let mut tree = hopper(tree_only);
        assert_eq!(choose(K::AllReduce, Bytes(1 << 30), &group, &mut tree).unwrap().algorithm, A::Tree);
        assert_eq!(choose(K::ReduceScatter, Bytes(1 << 30), &group, &mut tree).unwrap().algorithm, A::Ring);
        // Nothing allowed runs here (NVLS needs Hopper on NVSwitch, CollNet needs SHARP).
        let collnet = NcclSettings {
            algorithms: topology::NcclAlgorithms::from_names(&names(&["collnet-chain"])).unwrap(),
            ..NcclSettings::DEFAULT
        };
        let error = choose(K::AllReduce, Bytes(1 << 30), &group, &mut hopper(collnet)).unwrap_err();
        assert!(error.to_string().contains("cluster.network.nccl-algorithms"), "{error}");
    }

    #[test]
    fn hierarchical_is_two_server_rings_around_a_ring_across_servers() {
        // 4 servers of 8: 2 x 7 steps of S/8 inside, 2 x 3 steps of S/32 across.
        let bytes = 32u64 << 20;
        let expected = 14 * (ALPHA + bytes / 8 * 80) + 6 * (ALPHA + bytes / 32 * 80);
        assert_eq!(ps(K::AllReduce, A::Hierarchical, 32, 8, bytes), expected);
        // One rank per server: an ordinary ring.
        assert_eq!(ps(K::AllReduce, A::Hierarchical, 8, 1, bytes), ps(K::AllReduce, A::Ring, 8, 1, bytes));
    }

    #[test]
    fn binomial_broadcast_takes_ceil_log2_rounds() {
        let one = ALPHA + (1 << 20) * 80;
        for (p, rounds) in [(2u32, 1u64), (3, 2), (8, 3), (9, 4), (1000, 10)] {
            for root in [0, p - 1] {
                assert_eq!(ps(K::Broadcast { root }, A::BinomialTree, p, 1, 1 << 20), rounds * one);
                assert_eq!(ps(K::Reduce { root }, A::BinomialTree, p, 1, 1 << 20), rounds * one);
            }
        }
    }

    #[test]
    fn all_to_all_pairwise_takes_p_minus_1_rounds_and_direct_one() {
        let p = 8u64;
        let share = ALPHA + (80 << 20) / p;
        assert_eq!(ps(K::AllToAll, A::Pairwise, p as u32, 1, 1 << 20), (p - 1) * share);
        // Without link sharing (this test network), all sends at once take one share's time.
        assert_eq!(ps(K::AllToAll, A::Direct, p as u32, 1, 1 << 20), share);
    }

    #[test]
    fn auto_takes_the_fastest_candidate() {
        // A 4 KiB allreduce over 64 ranks is latency-bound: the tree's 2h + C - 1 = 12 steps
        // beat the ring's 126. (Which wins for large buffers depends on link sharing, which
        // this test network does not model: see the integration tests.)
        let mut network = uniform();
        // NCCL's tree with one rank per server is the double binary tree.
        assert_eq!(choose(K::AllReduce, Bytes(4096), &ranks(64), &mut network).unwrap().algorithm, A::Tree);
        let auto = ps(K::AllReduce, A::Auto, 64, 1, 4096);
        assert_eq!(auto, ps(K::AllReduce, A::DoubleBinaryTree, 64, 1, 4096));
        assert_eq!(auto, ps(K::AllReduce, A::Tree, 64, 1, 4096));
    }

    #[test]
    fn one_rank_costs_nothing_and_bad_algorithms_are_refused() {
        assert_eq!(ps(K::AllReduce, A::Ring, 1, 1, 1 << 30), 0);
        let refused = analytical_time(K::AllReduce, A::Pairwise, Bytes(1), &ranks(4), &mut uniform());
        assert!(matches!(refused, Err(CollectiveError::Unsupported { .. })));
    }
}
