//! DASO (Coquelin et al. 2022, `heat.optim.DASO`): each gradient bucket all-reduced inside
//! the node every iteration; every `every`-th iteration the GPUs of one local rank (rotating)
//! all-reduce the parameters across the nodes in chunks, then broadcast them inside their node,
//! at once (blocking) or `wait` iterations later (non-blocking, the receiving iteration's
//! broadcast waiting for the sender's allreduce).
//!
//! Invariants: replicas differ (the global sync rotates over local ranks), so no rank is
//! folded ([`Policy::symmetric_replicas`]); the next iteration's forward waits for the step's
//! end; a rank's global allreduce is remembered ([`RankPolicy::appended`]) until the iteration
//! that receives it.

use sim_core::graph::{CollectiveKind, GroupId, LabelId, OpId, Pass, RankId};
use sim_core::units::Bytes;

use super::super::Dep;
use super::super::plan::Plan;
use super::super::rank::{GroupClass, RankEmitter};
use super::buckets::{self, PlannedBucket};
use super::{Policy, RankPolicy, policy_meta};
use crate::{Comm, DASO_STREAM, DATA_STREAM, GroupKind, StrategyError};

/// DASO sends its parameters in chunks of at most this many elements (`sending_chunk_size`,
/// 10,000,000 in `heat.optim.DASO`), each its own non-blocking allreduce.
const DASO_CHUNK_ELEMENTS: u64 = 10_000_000;

/// DASO's knobs (`parallelism.sync = "daso"`).
#[derive(Clone, Copy)]
pub(in super::super) struct Daso {
    /// Iterations between global synchronisations.
    pub(in super::super) every: u32,
    /// Whether the global sync is waited for at once.
    pub(in super::super) blocking: bool,
    /// Iterations between sending and receiving a non-blocking global sync.
    pub(in super::super) wait: u32,
    /// GPUs per node.
    pub(in super::super) node: u32,
}

impl Policy for Daso {
    fn symmetric_replicas(&self) -> bool {
        false
    }

    fn communication_buffers(&self, plan: &Plan<'_>, chunks: &[usize]) -> Bytes {
        buckets::buffer_bytes(plan, chunks)
    }

    fn for_rank(&self) -> Box<dyn RankPolicy + '_> {
        Box::new(DasoRank { daso: self, sent: Vec::new(), pending: None, sent_local: None })
    }
}

/// A rank's DASO across iterations.
struct DasoRank<'a> {
    daso: &'a Daso,
    /// The rank's last global allreduce op of each iteration so far, if it sent one.
    sent: Vec<Option<OpId>>,
    /// Non-blocking: the global allreduce to wait for at this iteration's step.
    pending: Option<OpId>,
    /// This iteration's last global allreduce (local index), if the rank sent.
    sent_local: Option<u32>,
}

impl RankPolicy for DasoRank<'_> {
    fn begin_iteration(&mut self, emitter: &mut RankEmitter<'_, '_>, previous_end: Option<OpId>) {
        // Non-blocking: the global allreduce this rank sent `wait` iterations ago, if this is
        // a receiving iteration and it was the sender.
        self.pending = if self.daso.blocking {
            None
        } else {
            emitter
                .iteration
                .checked_sub(self.daso.wait)
                .and_then(|from| self.sent.get(from as usize).copied().flatten())
        };
        self.sent_local = None;
        // The next iteration's forward waits for the step (and its broadcast).
        if let Some(end) = previous_end {
            emitter.waiting.push(Dep::Global(end));
        }
    }

    fn backward_chunk(
        &mut self,
        emitter: &mut RankEmitter<'_, '_>,
        chunk: usize,
        micro: u32,
        last: bool,
    ) -> Result<Option<u32>, StrategyError> {
        let node = self.daso.node;
        let mut sync =
            |emitter: &mut RankEmitter<'_, '_>, bucket: &PlannedBucket, label: LabelId, ready: u32| {
                // Inside the node.
                let comm = Comm {
                    group: GroupKind::Data,
                    kind: CollectiveKind::AllReduce,
                    bytes: bucket.bucket.bytes,
                    what: "",
                };
                let group = daso_group(emitter, false, node, emitter.rank % node);
                let meta = policy_meta(emitter, ORIGIN, Pass::BackwardWeight);
                emitter.collective(comm, DATA_STREAM, group, label, &[Dep::Local(ready)], meta)
            };
        buckets::backward_chunk(emitter, chunk, micro, last, &mut sync)
    }

    fn after_step(&mut self, emitter: &mut RankEmitter<'_, '_>, optimizer: u32, _end: u32) -> u32 {
        self.step(emitter, optimizer)
    }

    fn appended(&mut self, offset: u32) {
        self.sent.push(self.sent_local.take().map(|op| OpId(offset + op)));
    }
}

impl DasoRank<'_> {
    /// DASO's step after the local optimizer step (`heat.optim.DASO.step`): on every
    /// `every`-th iteration the GPUs of one local rank (rotating, DASO's `_send_mod`) all-reduce
    /// the parameters across the nodes in chunks of 10 M elements (`sending_chunk_size`), then
    /// (blocking) broadcast them inside their node; non-blocking, the broadcast comes `wait`
    /// iterations later, after the sender has waited for its allreduce. Returns the op the next
    /// iteration waits for.
    fn step(&mut self, emitter: &mut RankEmitter<'_, '_>, optimizer: u32) -> u32 {
        let Daso { every, blocking, wait, node } = *self.daso;
        let plan = emitter.plan;
        let local = emitter.rank % node;
        let iteration = emitter.iteration;
        let interval = i64::from(iteration / every);
        // The local rank that sends in interval `j` (the previous interval's for `j = -1`).
        let sender = |j: i64| j.rem_euclid(i64::from(node)) as u32;
        let sends = iteration % every == 0;
        let bytes = plan.gradient_bytes(plan.stage_parameters[0]).0;
        let chunk = DASO_CHUNK_ELEMENTS * plan.strategy.gradient_precision.bytes();
        let mut end = optimizer;
        let broadcast = |this: &mut RankEmitter<'_, '_>, root: u32, deps: &[Dep]| -> u32 {
            let comm = Comm {
                group: GroupKind::Data,
                kind: CollectiveKind::Broadcast { root },
                bytes: Bytes(bytes),
                what: "daso node broadcast parameters",
            };
            let group = daso_group(this, false, node, local);
            let label = this.comm_label(comm.what);
            let meta = policy_meta(this, ORIGIN, Pass::Optimizer);
            this.collective(comm, DATA_STREAM, group, label, deps, meta)
        };
        // Non-blocking: receive the sync sent `wait` iterations ago (before the window for an
        // interval-long wait at iteration 0: only its broadcast is simulated).
        let receives = !blocking && iteration % every == wait % every;
        if receives {
            let from = (i64::from(iteration) - i64::from(wait)).div_euclid(i64::from(every));
            let mut deps = vec![Dep::Local(optimizer)];
            deps.extend(self.pending.map(Dep::Global));
            end = broadcast(emitter, sender(from), &deps);
        }
        if sends && local == sender(interval) {
            let group = daso_group(emitter, true, node, local);
            let label = emitter.comm_label("daso global allreduce parameters");
            let mut last = end;
            let mut offset = 0u64;
            while offset < bytes {
                let size = chunk.min(bytes - offset);
                offset += size;
                let comm = Comm {
                    group: GroupKind::Data,
                    kind: CollectiveKind::AllReduce,
                    bytes: Bytes(size),
                    what: "",
                };
                let meta = policy_meta(emitter, ORIGIN, Pass::Optimizer);
                last = emitter.collective(comm, DASO_STREAM, group, label, &[Dep::Local(end)], meta);
            }
            self.sent_local = Some(last);
            if blocking {
                end = broadcast(emitter, local, &[Dep::Local(last)]);
            }
        } else if sends && blocking {
            end = broadcast(emitter, sender(interval), &[Dep::Local(end)]);
        }
        end
    }
}

/// A DASO group: the GPUs of this rank's node (`global` false), or the GPUs of local rank
/// `local` on every node (`global` true).
fn daso_group(emitter: &mut RankEmitter<'_, '_>, global: bool, node: u32, local: u32) -> GroupId {
    let ranks = emitter.plan.layout.ranks();
    let (class, members): (GroupClass, Vec<RankId>) = if global {
        (GroupClass::Named("daso global"), (local..ranks).step_by(node as usize).map(RankId).collect())
    } else {
        let first = emitter.rank - emitter.rank % node;
        (GroupClass::Named("daso node"), (first..first + node).map(RankId).collect())
    };
    let key = (class, members[0].0);
    if let Some(&group) = emitter.shared.groups.get(&key) {
        return group;
    }
    let group = emitter.shared.graph.add_group(members);
    emitter.shared.groups.insert(key, group);
    group
}

/// The origin of DASO's node-local and global synchronisation.
const ORIGIN: &str = "daso";
