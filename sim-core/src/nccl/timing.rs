//! A collective's completion time under a resolved [`Choice`], uncontended: the time its data
//! takes on the links (its schedule timed step by step, or an in-network algorithm's closed
//! form) plus what it costs beyond the data (`overhead`).
//!
//! In-network algorithms (NVLS in the NVSwitch, CollNet in InfiniBand switches) are not
//! point-to-point messages: they are timed in closed form at every fidelity (`nvls`,
//! `collnet`), and only where their shape fits ([`in_network_fits`]).

use units::{Bytes, SimDuration, UnitError};

use crate::collective::schedule_time;
use crate::graph::{CollectiveAlgorithm, CollectiveKind, RankId};
use crate::nccl::network::NcclNetwork;
use crate::nccl::overhead::{protocol_overhead, protocol_overhead_with};
use crate::nccl::protocol::{Choice, is_in_network, is_nvls};
use crate::nccl::wire::schedule_of;
use crate::nccl::{collnet, nvls};
use crate::schedule::CollectiveError;

/// The completion time of a collective under a resolved `choice`, fixed costs included.
pub fn time_of(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &mut impl NcclNetwork,
) -> Result<SimDuration, CollectiveError> {
    let overflow = || UnitError::OutOfRange {
        input: format!("{} of {bytes} over {} ranks", kind.name(), group.len()),
        quantity: "collective time",
        reason: "longer than the largest representable duration",
    };
    let (data, overhead) = if is_in_network(choice.algorithm) {
        (
            data_time(kind, choice, bytes, group, network)?,
            protocol_overhead(kind, choice, bytes, group, network)?,
        )
    } else {
        let schedule = schedule_of(kind, choice, bytes, group, network)?;
        (
            schedule_time(kind, group, &schedule, network)?,
            protocol_overhead_with(kind, choice, bytes, group, Some(&schedule), network)?,
        )
    };
    Ok(data.checked_add(overhead).map_err(|_| overflow())?)
}

/// The time the links take to move a collective's data under `choice` (path latencies
/// included, fixed costs not; NVLS: its closed form, latency included).
pub fn data_time(
    kind: CollectiveKind,
    choice: Choice,
    bytes: Bytes,
    group: &[RankId],
    network: &mut impl NcclNetwork,
) -> Result<SimDuration, CollectiveError> {
    if is_in_network(choice.algorithm) {
        return in_network_time(choice.algorithm, bytes, group, network);
    }
    let schedule = schedule_of(kind, choice, bytes, group, network)?;
    schedule_time(kind, group, &schedule, network)
}

/// Whether an in-network algorithm ([`is_in_network`]) can run on `group`.
pub fn in_network_fits(
    algorithm: CollectiveAlgorithm,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<bool, CollectiveError> {
    Ok(if is_nvls(algorithm) {
        nvls::shape(algorithm, group, network)?.is_some()
    } else {
        collnet::shape(algorithm, group, network)?.is_some()
    })
}

/// The closed-form time of an in-network algorithm ([`is_in_network`]), latency included.
pub fn in_network_time(
    algorithm: CollectiveAlgorithm,
    bytes: Bytes,
    group: &[RankId],
    network: &impl NcclNetwork,
) -> Result<SimDuration, CollectiveError> {
    let (seconds, quantity) = if is_nvls(algorithm) {
        (nvls::seconds(algorithm, bytes, group, network)?, "NVLS allreduce time")
    } else {
        (collnet::seconds(algorithm, bytes, group, network)?, "CollNet allreduce time")
    };
    SimDuration::from_secs_f64(seconds).map_err(|_: UnitError| {
        CollectiveError::Time(UnitError::OutOfRange {
            input: format!("{bytes}"),
            quantity,
            reason: "longer than the largest representable duration",
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::protocol::Protocol;
    use crate::nccl::testing::{Uniform, hopper, ranks, uniform};
    use crate::nccl::wire::chunk_for;
    use CollectiveAlgorithm as A;
    use CollectiveKind as K;
    use topology::NcclSettings;

    #[test]
    fn a_simple_tree_moves_nccl_buffsize_chunks_each_at_its_channels_rate() {
        let group = ranks(16);
        let tree = Choice { algorithm: A::Tree, protocol: Some(Protocol::Simple) };
        let gcp = NcclSettings { buffsize: 8 << 20, ..NcclSettings::DEFAULT };
        // Simple chunks are a step of NCCL_BUFFSIZE: 512 KiB by default, 1 MiB with 8 MiB.
        assert_eq!(
            chunk_for(tree, Bytes(1 << 30), &group, &hopper(NcclSettings::DEFAULT)).unwrap(),
            Bytes(512 << 10)
        );
        assert_eq!(chunk_for(tree, Bytes(1 << 30), &group, &hopper(gcp)).unwrap(), Bytes(1 << 20));
        // 16 MiB over 16 channels is one 1 MiB chunk per channel: every one of the tree's 16
        // levels (a chain of 7 NVLink hops and one network hop, up and down) takes the chunk
        // at the channel's rate, Hopper's 38.7 GB/s per graph channel over 2 channels each.
        let mut network = hopper(gcp);
        let bytes = Bytes(16 << 20);
        let schedule = schedule_of(K::AllReduce, tree, bytes, &group, &network).unwrap();
        assert_eq!(schedule.lanes().len(), 16);
        assert_eq!(
            schedule.pipeline().unwrap().chunks,
            1,
            "the tree's wire bytes do not split NCCL's chunks"
        );
        let close = |a: SimDuration, b: SimDuration| a.as_ps().abs_diff(b.as_ps()) <= 20;
        let floor = schedule.step_floor();
        assert!(close(floor, SimDuration::from_secs_f64((1u64 << 20) as f64 / 19.35e9).unwrap()), "{floor}");
        let data = data_time(K::AllReduce, tree, bytes, &group, &mut network).unwrap();
        assert_eq!(data, floor.checked_mul(16).unwrap());
        // Twice the data, twice the chunks: one more step.
        let twice = data_time(K::AllReduce, tree, Bytes(32 << 20), &group, &mut network).unwrap();
        assert_eq!(twice, floor.checked_mul(17).unwrap());
        // A small allreduce runs on one channel per 32 KiB (`launch_channels`): 64 KiB on two,
        // each carrying 32 KiB up and down the tree.
        let small = schedule_of(K::AllReduce, tree, Bytes(64 << 10), &group, &network).unwrap();
        let expected = SimDuration::from_secs_f64((32u64 << 10) as f64 / 19.35e9).unwrap();
        assert!(close(small.step_floor(), expected), "{}", small.step_floor());
        // LL and LL128 forward every line as it arrives: no floor.
        for protocol in [Protocol::Ll, Protocol::Ll128] {
            let choice = Choice { algorithm: A::Tree, protocol: Some(protocol) };
            let schedule = schedule_of(K::AllReduce, choice, bytes, &group, &network).unwrap();
            assert_eq!(schedule.step_floor(), SimDuration::ZERO, "{protocol}");
        }
        // Nor without NCCL's tuner, or for rings.
        let mut plain = Uniform { per_node: 8, ..uniform() };
        assert_eq!(
            schedule_of(K::AllReduce, tree, bytes, &group, &plain).unwrap().step_floor(),
            SimDuration::ZERO
        );
        let ring = Choice { algorithm: A::Ring, protocol: Some(Protocol::Simple) };
        assert_eq!(
            schedule_of(K::AllReduce, ring, bytes, &group, &network).unwrap().step_floor(),
            SimDuration::ZERO
        );
        let _ = data_time(K::AllReduce, tree, bytes, &group, &mut plain).unwrap();
    }
}
