//! ZeRO stages 1 and 2 (optimizer state, and gradients, sharded over the data-parallel
//! replicas): each gradient bucket reduce-scattered as its last gradient is ready, the
//! optimizer step on the rank's shard, then each bucket's parameters all-gathered; the next
//! iteration's forward waits for the gathers.
//!
//! With several distributed-optimizer instances (Megatron-Core's partial distributed optimizer,
//! `Parallelism::distributed_optimizer_instances`), the synchronising ranks split into
//! instances of consecutive ranks: a bucket is reduce-scattered within the rank's instance,
//! then its shard all-reduced across the instances (the ranks at the same place in each),
//! and the parameters are all-gathered within the instance (NVIDIA/Megatron-LM @ d98e8a64dd :
//! megatron/core/distributed/param_and_grad_buffer.py, `start_grad_sync`;
//! megatron/core/parallel_state.py, the intra- and inter-partial data-parallel groups).
//!
//! Invariant: the buckets are DDP's ([`super::buckets`]); only the collectives differ.

use sim_core::graph::{CollectiveKind, GroupId, LabelId, OpId, Pass, RankId};
use sim_core::units::Bytes;

use super::super::Dep;
use super::super::rank::GroupClass;
use super::super::rank::RankEmitter;
use super::buckets::{self, PlannedBucket};
use super::{Policy, RankPolicy, policy_meta};
use crate::{Comm, DATA_STREAM, GroupKind, StrategyError};

/// ZeRO-1/2: bucketed reduce-scatter, parameter allgather after the step.
pub(in super::super) struct Zero;

impl Policy for Zero {
    fn for_rank(&self) -> Box<dyn RankPolicy + '_> {
        Box::new(Zero)
    }
}

impl RankPolicy for Zero {
    fn begin_iteration(&mut self, emitter: &mut RankEmitter<'_, '_>, previous_end: Option<OpId>) {
        super::wait_for_step(emitter, previous_end);
    }

    fn backward_layers(
        &mut self,
        emitter: &mut RankEmitter<'_, '_>,
        chunk: usize,
        layers: std::ops::Range<usize>,
        micro: u32,
        last: bool,
    ) -> Result<Option<u32>, StrategyError> {
        buckets::backward_layers(emitter, chunk, layers, micro, last, &mut sync_bucket)
    }

    /// Each bucket's parameters all-gathered after the step (over more than one rank).
    fn after_step(&mut self, emitter: &mut RankEmitter<'_, '_>, optimizer: u32, mut end: u32) -> u32 {
        let plan = emitter.plan;
        let p = &plan.strategy.parallelism;
        let stage = plan.layout.coordinates(sim_core::graph::RankId(emitter.rank)).pipeline;
        if p.data * p.context > 1 {
            for k in plan.chunks_of(stage) {
                for (b, bucket) in plan.buckets[k].iter().enumerate() {
                    let comm = Comm {
                        group: GroupKind::Data,
                        kind: CollectiveKind::AllGather,
                        bytes: bucket.parameter_bytes,
                        what: "",
                    };
                    let group = instance_group(emitter, bucket.expert, false);
                    let label = emitter.bucket_labels[k][b].1;
                    let meta = policy_meta(emitter, ORIGIN, Pass::Optimizer);
                    end = emitter.collective(comm, DATA_STREAM, group, label, &[Dep::Local(optimizer)], meta);
                }
            }
        }
        end
    }
}

/// The reduce-scatter of `bucket` after `ready` (within the rank's instance), and with
/// several distributed-optimizer instances the all-reduce of its shard across them.
fn sync_bucket(emitter: &mut RankEmitter<'_, '_>, bucket: &PlannedBucket, label: LabelId, ready: u32) -> u32 {
    let comm = Comm {
        group: GroupKind::Data,
        kind: CollectiveKind::ReduceScatter,
        bytes: bucket.bucket.bytes,
        what: "",
    };
    let group = instance_group(emitter, bucket.expert, false);
    let meta = policy_meta(emitter, ORIGIN, Pass::BackwardWeight);
    let scattered = emitter.collective(comm, DATA_STREAM, group, label, &[Dep::Local(ready)], meta);
    if emitter.plan.strategy.parallelism.distributed_optimizer_instances <= 1 {
        return scattered;
    }
    let across = instance_group(emitter, bucket.expert, true);
    let shard_ranks = emitter.shared.graph.group(group).len().max(1) as u64;
    let comm = Comm {
        group: GroupKind::Data,
        kind: CollectiveKind::AllReduce,
        bytes: Bytes(bucket.bucket.bytes.0.div_ceil(shard_ranks)),
        what: "",
    };
    emitter.collective(comm, DATA_STREAM, across, label, &[Dep::Local(scattered)], meta)
}

/// The synchronising group of this rank (the data group, or the expert-data group for an
/// expert bucket), or with several distributed-optimizer instances the part of it that is
/// this rank's instance (`across` false: consecutive ranks) or the ranks at the same place
/// in every instance (`across` true).
fn instance_group(emitter: &mut RankEmitter<'_, '_>, expert: bool, across: bool) -> GroupId {
    let whole = emitter.sync_group(expert);
    let instances = emitter.plan.strategy.parallelism.distributed_optimizer_instances.max(1) as usize;
    if instances == 1 {
        return whole;
    }
    let members = emitter.shared.graph.group(whole).to_vec();
    let chosen = instance_members(members, RankId(emitter.rank), instances, across);
    let class = match (across, expert) {
        (true, true) => GroupClass::Named("expert instances"),
        (true, false) => GroupClass::Named("instances"),
        (false, true) => GroupClass::Named("expert instance"),
        (false, false) => GroupClass::Named("instance"),
    };
    let key = (class, chosen[0].0);
    if let Some(&group) = emitter.shared.groups.get(&key) {
        return group;
    }
    let group = emitter.shared.graph.add_group(chosen);
    emitter.shared.groups.insert(key, group);
    group
}

/// The part of the synchronising group `members` that is `rank`'s distributed-optimizer
/// instance, of `instances` (`across` false: consecutive ranks), or the ranks at its place in
/// every instance (`across` true). Folding checks its rank maps against the same split.
pub(in crate::emit) fn instance_members(
    members: Vec<RankId>,
    rank: RankId,
    instances: usize,
    across: bool,
) -> Vec<RankId> {
    let size = (members.len() / instances.max(1)).max(1);
    let position = members.iter().position(|r| *r == rank).unwrap_or(0);
    if across {
        members.into_iter().skip(position % size).step_by(size).collect()
    } else {
        let start = position - position % size;
        members[start..(start + size).min(members.len())].to_vec()
    }
}

/// The origin of ZeRO-1/2's reduce-scatters and parameter allgathers.
const ORIGIN: &str = "zero";
