//! The input pipeline (`[workload.input]`, [`workloads::input`]): the data loader of a
//! first-stage rank, the hand-over of each batch, the broadcast of a per-group loader's batch
//! to its model-parallel group and its unpacking, the loop's fetch of the next batch, and the
//! copy of the batch to the device on the compute stream.
//!
//! Invariants: the loader's and the input's ops run on the host ([`LOADER_STREAM`],
//! [`INPUT_STREAM`]), one batch after another; batches loaded ahead are carried from one
//! iteration to the next ([`RankEmitter::loads`]).

use sim_core::graph::{CollectiveKind, MemcpyDirection, Op, OpKind, OpMeta, RankId, Work};
use sim_core::units::{Bytes, SimDuration};

use super::Dep;
use super::rank::{GroupClass, RankEmitter};
use crate::{COMPUTE_STREAM, Comm, GroupKind, INPUT_STREAM, LOADER_STREAM, Strategy, StrategyError};

/// What the data loader does each iteration (`[workload.input]`, [`workloads::input`]).
pub(super) struct InputPlan {
    /// Whether the replica's batch is loaded by one rank of its model-parallel group and
    /// broadcast (a group of one rank loads for itself).
    broadcast: bool,
    /// Batches loaded ahead.
    prefetch: u32,
    /// One loader's time for the replica's batch.
    load: SimDuration,
    /// Host time to serialise the broadcast batch on the loader, and to unpack it on each
    /// receiver.
    pack: SimDuration,
    /// The broadcast batch.
    bytes: Bytes,
}

impl InputPlan {
    /// The loader's work of `strategy`, if modelled.
    pub(super) fn new(strategy: &Strategy<'_>) -> Result<Option<InputPlan>, StrategyError> {
        let Some((input, batch)) = strategy.input_batch() else { return Ok(None) };
        let time = |result: Result<SimDuration, sim_core::units::UnitError>, key: &'static str| {
            result.map_err(|error| StrategyError::Invalid { key, message: format!("{error}") })
        };
        let bytes = batch.broadcast.unwrap_or(Bytes::ZERO);
        Ok(Some(InputPlan {
            broadcast: batch.broadcast.is_some(),
            prefetch: input.prefetch,
            load: time(input.load_time(batch.samples), "workload.input.rate")?,
            pack: time(input.unpack_time(bytes), "workload.input.broadcast-rate")?,
            bytes,
        }))
    }
}

impl RankEmitter<'_, '_> {
    /// The input pipeline at the start of an iteration on a rank of the first stage: the
    /// batch is taken from the loader (waiting for it if it is not ready), broadcast to the
    /// group by a per-group loader, and the loader starts on the batch `prefetch` ahead; the
    /// first kernel waits for the batch. `group_root`: the rank is its model-parallel group's
    /// first (the per-group loader). Returns whether the rank runs a loader.
    pub(super) fn take_batch(&mut self, group_root: bool) -> bool {
        let Some(input) = &self.plan.input else { return false };
        let (loading, hand_over) = (self.input_meta(Work::Loader), self.input_meta(Work::Input));
        let batch = self.iteration;
        let loader = group_root || !input.broadcast;
        let previous: Vec<Dep> = self.host_start.into_iter().collect();
        let comm = Comm {
            group: GroupKind::Tensor,
            kind: CollectiveKind::Broadcast { root: 0 },
            bytes: input.bytes,
            what: "input: broadcast batch",
        };
        if !loader {
            // A receiver: the broadcast, then unpacking the batch on its host.
            let broadcast = self.host_collective(comm, &previous);
            let unpack = self.host_op(
                INPUT_STREAM,
                input.pack,
                "input: unpack batch",
                &[Dep::Local(broadcast)],
                hand_over,
            );
            self.waiting.push(Dep::Local(unpack));
            return false;
        }
        // The batch's load, if it was not prefetched before the first iteration.
        let mut deps = previous;
        if self.loads.front().is_some_and(|(b, _)| *b == batch)
            && let Some((_, load)) = self.loads.pop_front()
        {
            deps.push(load);
        }
        // What the next load starts after, and what the first kernel waits for.
        let (taken, ready) = if input.broadcast {
            // Serialising holds the loader's interpreter: on the loader's stream, and the next
            // load starts after it.
            let pack = self.host_op(LOADER_STREAM, input.pack, "input: serialise batch", &deps, loading);
            (pack, self.host_collective(comm, &[Dep::Local(pack)]))
        } else {
            let take = self.host_op(INPUT_STREAM, SimDuration::ZERO, "input: take batch", &deps, hand_over);
            (take, take)
        };
        self.waiting.push(Dep::Local(ready));
        // Batches up to the one after the last iteration's: the last iteration ends when the
        // loop could fetch it.
        let ahead = batch + input.prefetch;
        if ahead <= self.plan.strategy.iterations {
            let load =
                self.host_op(LOADER_STREAM, input.load, "input: load batch", &[Dep::Local(taken)], loading);
            self.loads.push_back((ahead, Dep::Local(load)));
        }
        true
    }

    /// The end of a loader rank's iteration: the training loop's fetch of the next batch,
    /// which waits for the loader if it is behind. Returns the op that ends the iteration.
    pub(super) fn fetch_next_batch(&mut self, end: u32) -> u32 {
        let next = self.iteration + 1;
        let Some(&(_, load)) = self.loads.iter().find(|(b, _)| *b == next) else { return end };
        let meta = self.input_meta(Work::Input);
        self.host_op(
            INPUT_STREAM,
            SimDuration::ZERO,
            "input: fetch next batch",
            &[Dep::Local(end), load],
            meta,
        )
    }

    /// The copy of the iteration's batch from host memory to the device on the compute stream
    /// (Chainer's converter: `cudaMemcpyAsync` on the kernels' stream), after what the first
    /// kernel would wait for; the first kernel waits for it instead.
    pub(super) fn copy_batch(&mut self, bytes: Bytes) {
        let label = self.comm_label("input: copy batch to device");
        let meta = self.input_meta(Work::Device);
        let launch = self.launch(meta);
        let mut deps = std::mem::take(&mut self.waiting);
        deps.extend(launch);
        let op = self.buffer.push(
            Op {
                kind: OpKind::Memcpy { direction: MemcpyDirection::HostToDevice, bytes },
                rank: RankId(self.rank),
                stream: COMPUTE_STREAM,
                label,
                meta,
            },
            &deps,
        );
        deps.clear();
        deps.push(Dep::Local(op));
        self.waiting = deps;
    }

    /// The broadcast of the batch over the rank's model-parallel group, sent by the host (no
    /// kernel launch): ChainerMN's `bcast_obj` over MPI.
    pub(super) fn host_collective(&mut self, comm: Comm, deps: &[Dep]) -> u32 {
        let group = self.group(GroupClass::Tensor);
        let label = self.comm_label(comm.what);
        let id = self.collective_instance(comm, group);
        let meta = self.input_meta(Work::Input).with_group(comm.group);
        self.buffer.push(
            Op { kind: OpKind::Collective(id), rank: RankId(self.rank), stream: INPUT_STREAM, label, meta },
            deps,
        )
    }

    /// The metadata of the input pipeline's `work`.
    fn input_meta(&mut self, work: Work) -> OpMeta {
        OpMeta::NONE.with_work(work).with_origin(self.origin(INPUT_ORIGIN))
    }
}

/// The origin of the input pipeline's ops.
const INPUT_ORIGIN: &str = "input";
