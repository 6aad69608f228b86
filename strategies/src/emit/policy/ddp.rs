//! PyTorch DDP: each gradient bucket all-reduced over the data-parallel (x context) replicas
//! as soon as its last gradient is ready, overlapping the rest of the backward; expert
//! parameters over their expert-data group. Under spatial parallelism (CNNs) the allreduce is
//! hierarchical as ParaDL's: inside the spatial group, then across groups.
//!
//! Invariant: plain data parallelism lowers to the graph the DDP lowering always produced, op
//! for op (`tests/it/strategies.rs` pins it).

use sim_core::graph::{CollectiveKind, LabelId, Pass};
use sim_core::units::Bytes;

use super::super::Dep;
use super::super::plan::Plan;
use super::super::rank::{GroupClass, RankEmitter};
use super::buckets::{self, PlannedBucket};
use super::{Policy, RankPolicy, policy_meta};
use crate::{Comm, DATA_STREAM, GroupKind, StrategyError};

/// DDP: bucketed gradient allreduce.
pub(in super::super) struct Ddp;

impl Policy for Ddp {
    fn communication_buffers(&self, plan: &Plan<'_>, chunks: &[usize]) -> Bytes {
        buckets::buffer_bytes(plan, chunks)
    }

    fn for_rank(&self) -> Box<dyn RankPolicy + '_> {
        Box::new(Ddp)
    }
}

impl RankPolicy for Ddp {
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
}

/// The allreduce of `bucket` after `ready`.
fn sync_bucket(emitter: &mut RankEmitter<'_, '_>, bucket: &PlannedBucket, label: LabelId, ready: u32) -> u32 {
    let comm = Comm {
        group: GroupKind::Data,
        kind: CollectiveKind::AllReduce,
        bytes: bucket.bucket.bytes,
        what: "",
    };
    if emitter.plan.strategy.parallelism.spatial > 1 {
        return emitter.spatial_sync(comm, label, ready);
    }
    let group = emitter.sync_group(bucket.expert);
    let meta = policy_meta(emitter, ORIGIN, Pass::BackwardWeight);
    emitter.collective(comm, DATA_STREAM, group, label, &[Dep::Local(ready)], meta)
}

impl RankEmitter<'_, '_> {
    /// The gradient allreduce of a bucket over spatial x data ranks, hierarchical as ParaDL's
    /// (local, then across groups): a reduce-scatter inside the spatial group, an allreduce of
    /// each rank's share across the groups, an allgather inside the group. Returns the last op.
    fn spatial_sync(&mut self, comm: Comm, label: LabelId, ready: u32) -> u32 {
        let p = u64::from(self.plan.strategy.parallelism.spatial);
        let local = self.group(GroupClass::Tensor);
        let scatter = Comm { kind: CollectiveKind::ReduceScatter, ..comm };
        let meta = policy_meta(self, ORIGIN, Pass::BackwardWeight);
        let op = self.collective(scatter, DATA_STREAM, local, label, &[Dep::Local(ready)], meta);
        let mut last = op;
        if self.plan.strategy.parallelism.data > 1 {
            let across = self.group(GroupClass::Data);
            let share = Comm { bytes: Bytes(comm.bytes.0.div_ceil(p)), ..comm };
            last = self.collective(share, DATA_STREAM, across, label, &[Dep::Local(op)], meta);
        }
        let gather = Comm { kind: CollectiveKind::AllGather, ..comm };
        self.collective(gather, DATA_STREAM, local, label, &[Dep::Local(last)], meta)
    }
}

/// The origin of DDP's gradient allreduces.
const ORIGIN: &str = "ddp";
