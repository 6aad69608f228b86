//! ZeRO stages 1 and 2 (optimizer state, and gradients, sharded over the data-parallel
//! replicas): each gradient bucket reduce-scattered as its last gradient is ready, the
//! optimizer step on the rank's shard, then each bucket's parameters all-gathered; the next
//! iteration's forward waits for the gathers.
//!
//! Invariant: the buckets are DDP's ([`super::buckets`]); only the collectives differ.

use sim_core::graph::{CollectiveKind, LabelId, OpId, Pass};

use super::super::Dep;
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

    fn backward_chunk(
        &mut self,
        emitter: &mut RankEmitter<'_, '_>,
        chunk: usize,
        micro: u32,
        last: bool,
    ) -> Result<Option<u32>, StrategyError> {
        buckets::backward_chunk(emitter, chunk, micro, last, &mut sync_bucket)
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
                    let group = emitter.sync_group(bucket.expert);
                    let label = emitter.bucket_labels[k][b].1;
                    let meta = policy_meta(emitter, ORIGIN, Pass::Optimizer);
                    end = emitter.collective(comm, DATA_STREAM, group, label, &[Dep::Local(optimizer)], meta);
                }
            }
        }
        end
    }
}

/// The reduce-scatter of `bucket` after `ready`.
fn sync_bucket(emitter: &mut RankEmitter<'_, '_>, bucket: &PlannedBucket, label: LabelId, ready: u32) -> u32 {
    let comm = Comm {
        group: GroupKind::Data,
        kind: CollectiveKind::ReduceScatter,
        bytes: bucket.bucket.bytes,
        what: "",
    };
    let group = emitter.sync_group(bucket.expert);
    let meta = policy_meta(emitter, ORIGIN, Pass::BackwardWeight);
    emitter.collective(comm, DATA_STREAM, group, label, &[Dep::Local(ready)], meta)
}

/// The origin of ZeRO-1/2's reduce-scatters and parameter allgathers.
const ORIGIN: &str = "zero";
