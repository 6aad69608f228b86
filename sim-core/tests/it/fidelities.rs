//! The three network fidelities on uncontended networks: a lone ring collective on one
//! switch, any size and rank count, takes the same time under `analytical` (alpha-beta),
//! `flow` (coupled steady-state flows) and `packet-steps` (every message a flow), because no
//! two of its messages ever share a link direction.

use proptest::prelude::*;
use sim_core::fidelity::{Fidelity, NetworkSettings};
use sim_core::graph::{CollectiveAlgorithm, CollectiveKind};
use sim_core::units::Bytes;

use crate::{lone_collective, single_switch};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn fidelities_agree_on_a_lone_ring(
        ranks in 2u32..33,
        kilobytes in 1u64..262_144,
        kind in prop_oneof![
            Just(CollectiveKind::AllReduce),
            Just(CollectiveKind::AllGather),
            Just(CollectiveKind::ReduceScatter),
        ],
    ) {
        let topology = single_switch(ranks, "100 Gb/s", "1 us");
        let graph = lone_collective(ranks, kind, CollectiveAlgorithm::Ring, Bytes(kilobytes * 1024));
        let time = |fidelity| {
            NetworkSettings::new(fidelity).run(&graph, &topology).map(|t| t.makespan().as_ps() as f64)
        };
        let analytical = time(Fidelity::Analytical).unwrap();
        for fidelity in [Fidelity::Flow, Fidelity::PacketSteps] {
            let other = time(fidelity).unwrap();
            prop_assert!(
                (other - analytical).abs() <= 1e-6 * analytical + 2.0,
                "{} ranks, {} KiB {}: analytical {analytical} ps, {} {other} ps",
                ranks, kilobytes, kind.name(), fidelity.name()
            );
        }
    }
}
