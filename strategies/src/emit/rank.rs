//! The per-rank driver and the layer-level emission: [`RankEmitter::iteration`] walks a
//! rank's schedule (input, micro-batch forwards and backwards of its chunks, the tied
//! embedding's and the pipeline flush's allreduces, the optimizer step) and calls the rank's
//! gradient-synchronisation policy ([`super::policy::RankPolicy`]) at fixed points; the layer
//! methods emit each layer's kernels, collectives, launches and context ring.
//!
//! Invariants: a rank's ops are buffered in emission order, which is their order in the graph
//! (and on each stream); every kernel, collective, send and copy is preceded by its host launch
//! when launches are modelled; a collective instance is shared by the members of its group in
//! the order they issue it.

use sim_core::lookup::FastLookupMap;
use std::collections::VecDeque;

use sim_core::graph::{
    Collective, CollectiveAlgorithm, CollectiveKind, GraphBuilder, GroupId, LabelId, Op, OpId, OpKind,
    OpMeta, Origin, Pass, RankId, StreamId, Work,
};
use sim_core::units::{Bytes, SimDuration};

use super::moe_overlap::LayerPart;
use super::offload::OffloadState;
use super::plan::{Labels, Plan};
use super::policy::RankPolicy;
use super::{Dep, Key};
use crate::pipeline::Step;
use crate::{
    Axis, CHANNEL_STREAM, COMPUTE_STREAM, CONTEXT_STREAM, Comm, DATA_STREAM, EXPERT_STREAM, ExpertAxis,
    ExpertCommunicator, FILTER_STREAM, GroupKind, HOST_STREAM, PIPELINE_STREAM, Role, SPATIAL_STREAM,
    STAGING_STREAM, StrategyError, TENSOR_STREAM, cnn, shard,
};

/// Kinds of communicator groups, for interning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum GroupClass {
    Tensor,
    Embedding,
    ModelParallel,
    Expert,
    Data,
    ExpertData,
    /// The experts' tensor group (`expt_tp`).
    ExpertTensor,
    /// The expert-tensor x expert group (`tp_ep`).
    ExpertTensorExpert,
    /// The expert group's members on the rank's node (a DeepEP-style dispatcher's NVLink hop).
    ExpertNode,
    /// Under DualPipe, the rank and its mirror (pipeline stage `p - 1 - s`), which hold the
    /// same two stages of the two model copies.
    Mirror,
    /// The expert group's members at the rank's local index (its RDMA hop).
    ExpertRail,
    /// A policy's own groups, which it lists and interns itself under its name for them
    /// (DASO's node and global groups): keyed apart from every other class.
    Named(&'static str),
}

/// The graph under construction and the collective instances shared by group members.
pub(super) struct Shared {
    pub(super) graph: GraphBuilder,
    pub(super) groups: FastLookupMap<(GroupClass, u32), GroupId>,
    pub(super) instances: FastLookupMap<GroupId, Vec<sim_core::graph::CollectiveId>>,
    /// Per rank: collectives issued so far on each group.
    pub(super) issued: Vec<FastLookupMap<GroupId, u32>>,
    pub(super) comm_labels: FastLookupMap<&'static str, LabelId>,
    /// Origins interned by name ([`RankEmitter::origin`]): a dozen at most, so a list.
    pub(super) origins: Vec<(&'static str, Origin)>,
    pub(super) keys: FastLookupMap<Key, (u32, u32)>,
}

/// One rank's buffered ops of one iteration.
pub(super) struct Buffer {
    pub(super) ops: Vec<Op>,
    pub(super) dep_ends: Vec<u32>,
    pub(super) deps: Vec<Dep>,
    /// Compute ops (by index) slowed beside communication, with their time there.
    pub(super) beside: Vec<(u32, SimDuration)>,
}

impl Buffer {
    pub(super) fn push(&mut self, op: Op, deps: &[Dep]) -> u32 {
        self.ops.push(op);
        self.deps.extend_from_slice(deps);
        self.dep_ends.push(self.deps.len() as u32);
        self.ops.len() as u32 - 1
    }

    /// [`Buffer::push`] with `last` after `deps`.
    pub(super) fn push_with(&mut self, op: Op, deps: &[Dep], last: Dep) -> u32 {
        self.deps.extend_from_slice(deps);
        self.push(op, &[last])
    }
}

/// Emits one rank's ops of one iteration: the driver ([`RankEmitter::iteration`]) and the
/// layer-level emission every policy builds on.
pub(super) struct RankEmitter<'p, 's> {
    pub(super) plan: &'p Plan<'s>,
    pub(super) labels: &'p Labels,
    /// (synchronisation, parameter allgather) labels of each bucket of each chunk.
    pub(super) bucket_labels: &'p [Vec<(LabelId, LabelId)>],
    pub(super) shared: &'p mut Shared,
    pub(super) rank: u32,
    pub(super) buffer: Buffer,
    /// What the next compute op must wait for besides its stream.
    pub(super) waiting: Vec<Dep>,
    /// The last compute op emitted.
    pub(super) last_compute: Option<u32>,
    /// The ends of the last GPU work issued (a compute op, or a collective with its host
    /// staging): what a synchronous host waits for before its next launch.
    pub(super) last_issued: Vec<Dep>,
    /// Schedule steps as (name, first compute op, last compute op), local indexes.
    pub(super) spans: Vec<(String, u32, u32)>,
    /// What the first host launch of the iteration waits for (the previous iteration's end:
    /// the framework synchronises once per step).
    pub(super) host_start: Option<Dep>,
    /// The iteration being emitted (0-based).
    pub(super) iteration: u32,
    /// Out-of-core training's state ([`super::offload`]).
    pub(super) offload: OffloadState,
    /// The part of the backward the policy's `backward_chunk` emits: the whole backward, or
    /// zero-bubble's input-gradient (B) or weight-gradient (W) half.
    pub(super) backward_part: Step,
    /// The loader's batches in flight: (batch, its load op), oldest first ([`super::input`]).
    pub(super) loads: VecDeque<(u32, Dep)>,
    /// The output layer's weight gradients deferred to the pipeline's flush
    /// (`Parallelism::defer_embedding_wgrad`): (layer, micro-batch), in backward order.
    pub(super) deferred_wgrads: Vec<(usize, u32)>,
    /// The part of a layer's pass the layer methods emit: all of it but inside a merged
    /// forward-and-backward step ([`super::moe_overlap`]).
    pub(super) layer_part: LayerPart,
}

impl RankEmitter<'_, '_> {
    /// Emits the iteration; returns the local index of the rank's last op and of its last
    /// compute op of the schedule.
    pub(super) fn iteration(
        &mut self,
        policy: &mut dyn RankPolicy,
        previous_end: Option<OpId>,
    ) -> Result<(u32, u32), StrategyError> {
        let plan = self.plan;
        let p = &plan.strategy.parallelism;
        let rank = RankId(self.rank);
        let coordinates = plan.layout.coordinates(rank);
        let stage = coordinates.pipeline;
        let chunks = p.chunks();
        let map = plan.chunk_map;
        let stage_rank = |target: u32| {
            let mut c = coordinates;
            c.pipeline = target;
            plan.layout.rank(c).0
        };
        self.host_start = previous_end.map(Dep::Global);
        let loader = if stage == 0 { self.take_batch(coordinates.tensor == 0) } else { false };
        policy.begin_iteration(self, previous_end);
        // The input enters on the stages that hold a path's first chunk (both ends under DualPipe).
        if plan.chunks_of(stage).any(|chunk| map.previous(chunk as u32).is_none())
            && let Some(bytes) = plan.input_copy
        {
            self.copy_batch(bytes);
        }
        let mut last_sync: Vec<Option<u32>> = vec![None; chunks as usize];
        // `parallelism.pipeline-host-sync`: the device work issued so far, and whether the last
        // action sent anything (an exchange to synchronise after).
        let mut frontier = DeviceFrontier::default();
        let mut sent = false;
        // `workload.passes = "forward"`: the schedule's forward actions alone, in its order
        // (the memory stays the training schedule's: see `crate::passes`).
        let trains = plan.strategy.passes.trains();
        // DualPipe's and the EP A2A overlap's forward-and-backward pair: the forward's send, held until the backward has
        // run (the pair sends both outputs after computing both).
        let mut held_send: Option<(u32, Bytes, Key)> = None;
        // Whether the last forward ran merged with the backward after it (DualPipe's pair).
        let mut merged_pair = false;
        let actions = &plan.actions()[stage as usize];
        for (index, action) in actions.iter().enumerate().filter(|(_, a)| trains || a.is_forward()) {
            let chunk = map.global(stage, action.chunk);
            let micro = action.micro_batch;
            let mark = self.buffer.ops.len();
            // A weight-gradient pass (zero-bubble's W) exchanges nothing.
            if action.step == Step::BackwardWeight {
                let last = micro + 1 == plan.path_micro_batches;
                self.backward_part = Step::BackwardWeight;
                let sync = policy.backward_chunk(self, chunk as usize, micro, last);
                self.backward_part = Step::Backward;
                if let Some(sync) = sync? {
                    last_sync[chunk as usize] = Some(sync);
                }
                self.span(mark, format!("W{micro}"));
                continue;
            }
            // What this action receives from the neighbouring stage, if anything (nothing
            // from a chunk on this stage: the V's tip runs both in order).
            let receive = |action: &crate::Action| {
                let chunk = map.global(stage, action.chunk);
                let micro = action.micro_batch;
                let (from, forward) =
                    if action.is_forward() { (map.previous(chunk), true) } else { (map.next(chunk), false) };
                from.filter(|&from| map.stage_of(from) != stage).map(|from| {
                    let sender = stage_rank(map.stage_of(from));
                    Dep::Key(Key::Stage { sender, micro, chunk: from, forward })
                })
            };
            let received = receive(action);
            // The backward a forward runs merged with, if any: the forward also waits for its
            // input.
            let pair = actions.get(index + 1).filter(|_| action.with_next && trains && action.is_forward());
            let partner = pair.and_then(&receive);
            // The exchange between the last action and this one: its send and this receive.
            if plan.pipeline_host_sync && (sent || received.is_some()) {
                self.pipeline_host_sync(&mut frontier, received);
            }
            sent = false;
            self.waiting.extend(received);
            self.waiting.extend(partner);
            // Megatron-LM's scatter-gather: the slices received are all-gathered over the
            // tensor group before the chunk uses them (`gather_split_1d_tensor`).
            let boundary = if action.is_forward() { map.previous(chunk) } else { Some(chunk) };
            if let (Some(_), Some(boundary)) = (received, boundary)
                && plan.pipeline_scatter[boundary as usize] > 1
            {
                let comm = Comm {
                    group: GroupKind::Tensor,
                    kind: CollectiveKind::AllGather,
                    bytes: plan.boundary_bytes[boundary as usize],
                    what: PIPELINE_GATHER_LABEL,
                };
                let pass = if action.is_forward() { Pass::Forward } else { Pass::BackwardData };
                let meta = OpMeta::NONE.with_pass(pass).with_origin(self.origin(PIPELINE_ORIGIN));
                self.comm(comm, meta);
            }
            // A pair runs merged, layer pair by layer pair, each pass in its own lane
            // (`super::moe_overlap`): one's expert all-to-alls beside the other's kernels. The
            // pair's backward action then only sends.
            let pair_backward = !action.is_forward() && std::mem::take(&mut merged_pair);
            if let Some(partner) = pair {
                let global = |a: &crate::Action| crate::Action { chunk: map.global(stage, a.chunk), ..*a };
                let last = partner.micro_batch + 1 == plan.path_micro_batches;
                let reads_loss = map.next(chunk).is_none();
                let sync = self.overlapped_step(policy, global(action), global(partner), last, reads_loss)?;
                if let Some(sync) = sync {
                    last_sync[map.global(stage, partner.chunk) as usize] = Some(sync);
                }
                merged_pair = true;
            }
            if action.is_forward() {
                if !merged_pair {
                    policy.forward_chunk(self, chunk as usize, micro)?;
                    // The last chunk ends with the loss, which the host reads to check it (a
                    // merged pair's read is in its forward's lane).
                    if plan.host_nan_checks && map.next(chunk).is_none() {
                        let deps: Vec<Dep> = self.last_compute.map(Dep::Local).into_iter().collect();
                        self.host_read(&deps, LOSS_CHECK_LABEL);
                    }
                }
                if let Some(next) = map.next(chunk).filter(|&next| map.stage_of(next) != stage) {
                    let to = stage_rank(map.stage_of(next));
                    let key = Key::Stage { sender: self.rank, micro, chunk, forward: true };
                    let bytes = scattered(plan, chunk as usize);
                    if action.with_next && trains {
                        held_send = Some((to, bytes, key));
                    } else {
                        self.send(to, bytes, self.labels.send_forward, key, Pass::Forward);
                        sent = true;
                    }
                }
            } else {
                if !pair_backward {
                    let last = micro + 1 == plan.path_micro_batches;
                    self.backward_part = action.step;
                    let sync = policy.backward_chunk(self, chunk as usize, micro, last);
                    self.backward_part = Step::Backward;
                    if let Some(sync) = sync? {
                        last_sync[chunk as usize] = Some(sync);
                    }
                }
                if let Some((to, bytes, key)) = held_send.take() {
                    self.send(to, bytes, self.labels.send_forward, key, Pass::Forward);
                    sent = true;
                }
                if let Some(previous) =
                    map.previous(chunk).filter(|&previous| map.stage_of(previous) != stage)
                {
                    let to = stage_rank(map.stage_of(previous));
                    let key = Key::Stage { sender: self.rank, micro, chunk, forward: false };
                    let label = self.labels.send_backward;
                    let bytes = scattered(plan, previous as usize);
                    self.send(to, bytes, label, key, Pass::BackwardData);
                    sent = true;
                }
            }
            // The step as one named slice around its kernels (a 1F1B schedule in Perfetto).
            let direction = if action.is_forward() { "F" } else { "B" };
            let name = if p.virtual_stages > 1 {
                format!("{direction}{micro} chunk {}", action.chunk)
            } else {
                format!("{direction}{micro}")
            };
            self.span(mark, name);
        }
        if plan.pipeline_host_sync && sent {
            self.pipeline_host_sync(&mut frontier, None);
        }
        // The output layer's deferred weight gradients no bucket synchronisation drained.
        self.drain_deferred_wgrads(None);
        let pipeline_end = self.last_compute.unwrap_or(0);
        // Without the training step (`workload.passes = "forward"`) the iteration ends with its
        // last forward kernel (a send still in flight overlaps the next iteration, as it does
        // between the forward passes of one).
        let mut end = if trains { self.step(policy, &last_sync) } else { pipeline_end };
        if loader {
            end = self.fetch_next_batch(end);
        }
        if plan.step_overhead > SimDuration::ZERO {
            end = self.step_host_work(end);
        }
        Ok((end, pipeline_end))
    }

    /// A collective of the training step on `class`'s group (`stream`, its ops' origin
    /// `origin`): it waits for everything `deps` holds and the rank's last kernel, and becomes
    /// what the rest of the step waits for.
    fn step_collective(
        &mut self,
        deps: &mut Vec<Dep>,
        comm: Comm,
        class: GroupClass,
        stream: StreamId,
        origin: &'static str,
    ) {
        let group = self.group(class);
        let label = self.comm_label(comm.what);
        let mut waits = std::mem::take(deps);
        waits.extend(self.last_compute.map(Dep::Local));
        let meta = OpMeta::NONE.with_group(comm.group).with_origin(self.origin(origin));
        deps.push(Dep::Local(self.collective(comm, stream, group, label, &waits, meta)));
    }

    /// The training step after the schedule: the tied embedding's gradient allreduce, the
    /// gradient-norm allreduce of a pipeline, the optimizer step and the policy's step (ZeRO's
    /// parameter allgather); returns the rank's last op. `last_sync` holds each chunk's last
    /// gradient synchronisation, which the step waits for.
    fn step(&mut self, policy: &mut dyn RankPolicy, last_sync: &[Option<u32>]) -> u32 {
        let plan = self.plan;
        let p = &plan.strategy.parallelism;
        let rank = RankId(self.rank);
        let stage = plan.layout.coordinates(rank).pipeline;
        let mut deps: Vec<Dep> = last_sync.iter().flatten().map(|&op| Dep::Local(op)).collect();
        // The tied embedding's two copies (first and last stage) sum their gradients.
        if plan.tied_embedding > 0 && (stage == 0 || stage + 1 == p.pipeline) {
            let comm = Comm {
                group: GroupKind::Data,
                kind: CollectiveKind::AllReduce,
                bytes: plan.gradient_bytes(plan.tied_embedding),
                what: "tied embedding gradient allreduce",
            };
            self.step_collective(&mut deps, comm, GroupClass::Embedding, DATA_STREAM, TIED_EMBEDDING_ORIGIN);
        }
        // DualPipe's two model copies: this rank holds stage `s` of one and stage `p - 1 - s` of
        // the other, its mirror the same two stages of the other copies, so the two sum their
        // gradients before either steps (deepseek-ai/DualPipe @3da1bbe,
        // examples/example_dualpipe.py adds each parameter's gradient to its mirror rank's
        // copy after the step). After the data-parallel synchronisation, of what it left on the
        // rank: the whole gradients, or under ZeRO its optimizer shard's.
        if p.schedule == crate::PipelineSchedule::DualPipe && p.pipeline > 1 {
            let held = p.optimizer_held(plan.stage_parameters[stage as usize]);
            let comm = Comm {
                group: GroupKind::Pipeline,
                kind: CollectiveKind::AllReduce,
                bytes: plan.gradient_bytes(held),
                what: "DualPipe copies' gradient allreduce",
            };
            self.step_collective(&mut deps, comm, GroupClass::Mirror, PIPELINE_STREAM, DUAL_PIPE_ORIGIN);
        }
        // Megatron-LM clips gradients by their global norm: an allreduce of one fp32 value over
        // the model-parallel group before the optimizer, so no stage steps before the whole
        // pipeline has flushed. Modelled over the pipeline stages only: the tensor ranks of a
        // stage are in step already, and 4 bytes over NVLink change nothing measurable (while
        // keeping the group off the servers lets folded runs skip the tensor ranks' shadows).
        if p.pipeline > 1 {
            let comm = Comm {
                group: GroupKind::Pipeline,
                kind: CollectiveKind::AllReduce,
                bytes: Bytes(4),
                what: "gradient norm allreduce",
            };
            self.step_collective(&mut deps, comm, GroupClass::ModelParallel, PIPELINE_STREAM, FLUSH_ORIGIN);
        }
        if let Some(host) = plan.offload.as_ref().and_then(|o| o.host.as_ref()) {
            // The last stage's copy of a tied embedding has its gradient outside the buckets:
            // to the host after the two copies' allreduce.
            if let Some(bytes) = plan.tied_copy_gradient(stage)
                && let Some(copy) = self.offload_gradients(bytes, &deps)
            {
                deps = vec![Dep::Local(copy)];
            }
            let end = self.host_optimizer_step(host, stage, &deps);
            return policy.after_step(self, end, end);
        }
        let (optimizer, end) = match plan.offload.as_ref().and_then(|o| o.weights.as_ref()) {
            Some(weights) => self.streamed_optimizer(weights, &deps),
            None => {
                let (duration, _) = plan.optimizer[stage as usize];
                let mut optimizer = self.buffer.push(
                    Op {
                        kind: OpKind::Compute { duration },
                        rank,
                        stream: COMPUTE_STREAM,
                        label: self.labels.optimizer,
                        meta: OpMeta::NONE.with_pass(Pass::Optimizer),
                    },
                    &deps,
                );
                // Muon spread round-robin: the owners' updates summed over the data group,
                // then every update applied.
                if let Some((bytes, apply)) = plan.muon_exchange[stage as usize] {
                    self.last_compute = Some(optimizer);
                    let mut waits = Vec::new();
                    let comm = Comm {
                        group: GroupKind::Data,
                        kind: CollectiveKind::AllReduce,
                        bytes,
                        what: "Muon updates allreduce",
                    };
                    // The collective waits for the owners' step (the last compute op); the
                    // updates are applied after it.
                    self.step_collective(&mut waits, comm, GroupClass::Data, DATA_STREAM, MUON_ORIGIN);
                    optimizer = self.buffer.push(
                        Op {
                            kind: OpKind::Compute { duration: apply },
                            rank,
                            stream: COMPUTE_STREAM,
                            label: self.labels.optimizer,
                            meta: OpMeta::NONE.with_pass(Pass::Optimizer),
                        },
                        &waits,
                    );
                }
                (optimizer, optimizer)
            }
        };
        self.last_compute = Some(optimizer);
        policy.after_step(self, optimizer, end)
    }

    /// Names the compute ops emitted since op `mark` as one slice `name`, if there are any.
    pub(super) fn span(&mut self, mark: usize, name: String) {
        let first = self.buffer.ops[mark..].iter().position(|op| op.stream == COMPUTE_STREAM);
        if let (Some(first), Some(last)) = (first, self.last_compute)
            && last as usize >= mark
        {
            self.spans.push((name, (mark + first) as u32, last));
        }
    }

    /// One layer's forward (or its recomputation).
    pub(super) fn forward_layer(
        &mut self,
        index: usize,
        micro: u32,
        recompute: bool,
    ) -> Result<(), StrategyError> {
        let plan = self.plan;
        let local = &plan.local[index];
        let meta = layer_meta(index, if recompute { Pass::Recompute } else { Pass::Forward });
        // Megatron-Core's dropless dispatchers size their buffers from the token counts, which
        // the host reads once per expert layer's forward (`crate::MoeDispatcher`): the
        // all-to-all one after the router, before its exchange; the all-gather one after its
        // gathers. Launches after it wait (nothing to wait for without modelled launches).
        let reads_counts = local.role == Role::Experts && plan.host_cost > SimDuration::ZERO;
        let dispatcher = plan.strategy.parallelism.moe_dispatcher;
        let part = self.layer_part;
        if part.receives() {
            if reads_counts && dispatcher == crate::MoeDispatcher::AllToAll {
                let deps: Vec<Dep> = self.last_compute.map(Dep::Local).into_iter().collect();
                self.host_read(&deps, MOE_COUNTS_LABEL);
            }
            for comm in &local.before_forward {
                self.comm(*comm, meta);
            }
            // The all-gather dispatcher and DeepEP's (whose dispatch returns the received
            // counts to the host) read them after their exchange.
            if reads_counts && dispatcher != crate::MoeDispatcher::AllToAll {
                let mut deps = self.waiting.clone();
                deps.extend(self.last_compute.map(Dep::Local));
                self.host_read(&deps, MOE_COUNTS_LABEL);
            }
        }
        if !part.computes() {
            return Ok(());
        }
        if let Some(halo) = &local.halo
            && halo.forward
        {
            let received = self.halo(index, micro, halo, if recompute { 1 } else { 0 });
            self.waiting.extend(received);
        }
        // Out-of-core training's copies around the kernel (nothing to do without).
        let offloads = plan.offload.is_some();
        let fetch_weights = offloads && self.offload_before_forward(index, micro, recompute);
        if let Some((duration, _)) = plan.kernels[index][0] {
            let label = if recompute { self.labels.recompute[index] } else { self.labels.passes[index][0] };
            match local.context_ring {
                Some(bytes) => {
                    self.ring(index, micro, duration, bytes, label, if recompute { 1 } else { 0 });
                }
                None => {
                    self.compute_launched(duration, label, meta, wide(plan.launches()[index][0]));
                    self.slow_last_compute(index, 0);
                }
            }
        }
        if fetch_weights {
            self.offload_weights_used();
        }
        for comm in &local.after_forward {
            self.comm(*comm, meta);
        }
        if offloads {
            self.offload_after_forward(index, micro, recompute);
        }
        Ok(())
    }

    /// One layer's backward (with its recomputation and collectives); returns the op after
    /// which its weight gradient is ready, if it has a backward kernel.
    pub(super) fn backward_layer(&mut self, index: usize, micro: u32) -> Result<Option<u32>, StrategyError> {
        if self.backward_part == Step::BackwardWeight {
            return Ok(self.weight_kernels(index, micro));
        }
        if self.layer_part.receives()
            && let Some(range) = &self.plan.recompute_before[index]
        {
            for again in range.clone() {
                self.forward_layer(again, micro, true)?;
            }
        }
        self.backward_kernels(index, micro)
    }

    /// One layer's backward without its recomputation: its collectives and kernels; returns
    /// the op after which its weight gradient is ready, if it has a backward kernel.
    pub(super) fn backward_kernels(
        &mut self,
        index: usize,
        micro: u32,
    ) -> Result<Option<u32>, StrategyError> {
        let plan = self.plan;
        {
            let local = &plan.local[index];
            let meta = layer_meta(index, Pass::BackwardData);
            let part = self.layer_part;
            if part.receives() {
                for comm in &local.before_backward {
                    self.comm(*comm, meta);
                }
            }
            if part == LayerPart::Send {
                // A merged step's dispatch gradient, after this pass's weight gradient.
                for comm in &local.after_backward_data {
                    self.comm(*comm, meta);
                }
                return Ok(None);
            }
            if !part.computes() {
                return Ok(None);
            }
            let [_, data, _] = plan.kernels[index];
            let mut gradient_ready = None;
            if let Some((duration, _)) = data {
                let label = self.labels.passes[index][1];
                gradient_ready = Some(match local.context_ring {
                    Some(bytes) => self.ring(index, micro, duration, Bytes(bytes.0 * 2), label, 2),
                    None => {
                        let op =
                            self.compute_launched(duration, label, meta, wide(plan.launches()[index][1]));
                        self.slow_last_compute(index, 1);
                        op
                    }
                });
            }
            // Collectives on the input gradient run while backward-weight computes.
            let mut deferred = Vec::new();
            if let Some(halo) = &local.halo
                && halo.backward
                && data.is_some()
            {
                deferred.extend(self.halo(index, micro, halo, 2));
            }
            if part == LayerPart::Whole {
                for comm in &local.after_backward_data {
                    self.comm(*comm, meta);
                    deferred.append(&mut self.waiting);
                }
            }
            // Zero-bubble's B: the weight gradient waits for its own W step; a deferred output
            // layer's waits for the flush.
            if self.defers_wgrad(index, micro) {
                self.deferred_wgrads.push((index, micro));
            } else if self.backward_part != Step::BackwardInput {
                gradient_ready = self.weight_kernels(index, micro).or(gradient_ready);
            }
            self.waiting.extend(deferred);
            Ok(gradient_ready)
        }
    }

    /// Whether `index`'s weight gradient of `micro` waits for the pipeline's flush: Megatron-
    /// Core's `--defer-embedding-wgrad-compute` buffers the output layer's activation and output
    /// gradient of the first `--wgrad-deferral-limit` micro-batches (all with 0) in its
    /// backward (megatron/core/tensor_parallel/layers.py,
    /// `LinearWithGradAccumulationAndAsyncCommunication.backward`) and computes their weight
    /// gradients after the schedule (megatron/core/pipeline_parallel/schedules.py,
    /// `finish_embedding_wgrad_compute`, NVIDIA/Megatron-LM @ d98e8a64dd).
    fn defers_wgrad(&self, index: usize, micro: u32) -> bool {
        let Some(limit) = self.plan.strategy.parallelism.defer_embedding_wgrad else {
            return false;
        };
        self.plan.local[index].role == crate::shard::Role::VocabularyOutput && (limit == 0 || micro < limit)
    }

    /// The deferred weight gradients of `layers` (all of them with `None`), emitted now in the
    /// order they were deferred; returns the last op, if any.
    pub(super) fn drain_deferred_wgrads(&mut self, layers: Option<&[usize]>) -> Option<u32> {
        if self.deferred_wgrads.is_empty() {
            return None;
        }
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred_wgrads)
            .into_iter()
            .partition(|(index, _)| layers.is_none_or(|layers| layers.contains(index)));
        self.deferred_wgrads = later;
        let mut last = None;
        for (index, micro) in now {
            last = self.weight_kernels(index, micro).or(last);
        }
        last
    }

    /// One layer's weight-gradient kernel and its accumulation into the gradient buffer (on
    /// every micro-batch but the first, if priced); returns the last, if any.
    fn weight_kernels(&mut self, index: usize, micro: u32) -> Option<u32> {
        let plan = self.plan;
        let weight_meta = layer_meta(index, Pass::BackwardWeight);
        let mut gradient_ready = None;
        let (launches, ops) = wide(plan.launches()[index][2]);
        if let Some((duration, _)) = plan.kernels[index][2] {
            let label = self.labels.passes[index][2];
            gradient_ready = Some(self.compute_launched(duration, label, weight_meta, (launches, ops)));
            self.slow_last_compute(index, 2);
        }
        if micro > 0
            && let Some(duration) = plan.accumulate[index]
        {
            // One add per weight-gradient kernel's module, as the backward-weight pass launches.
            let label = self.labels.passes[index][2];
            gradient_ready = Some(self.compute_launched(duration, label, weight_meta, (launches, 0)));
        }
        gradient_ready
    }

    /// A kernel (described by `meta`) after everything waited for, whose GPU work the host
    /// issues in `launches`, `(modules, ops)`: the pass's module launches at the host's cost per
    /// kernel (more than one for a sequential expert bank's modules:
    /// [`crate::experts::MoeExperts`]) and its further kernels at the cost per op; the host
    /// spends them all before the kernel can start.
    pub(super) fn compute_launched(
        &mut self,
        duration: SimDuration,
        label: LabelId,
        meta: OpMeta,
        launches: (u32, u32),
    ) -> u32 {
        // The launch goes first in the buffer; the waiting list's buffer is kept for reuse.
        let launch = self.launch_times(meta, launches);
        let mut deps = std::mem::take(&mut self.waiting);
        deps.extend(launch);
        let op = self.buffer.push(
            Op {
                kind: OpKind::Compute { duration },
                rank: RankId(self.rank),
                stream: COMPUTE_STREAM,
                label,
                meta,
            },
            &deps,
        );
        deps.clear();
        self.waiting = deps;
        self.last_compute = Some(op);
        self.last_issued.clear();
        self.last_issued.push(Dep::Local(op));
        op
    }

    /// Marks the compute op just added, pass `pass` of layer `index`, as slowed beside
    /// communication when the plan has its time there ([`Plan::beside`]).
    pub(super) fn slow_last_compute(&mut self, index: usize, pass: usize) {
        if let (Some(op), Some(beside)) =
            (self.last_compute, self.plan.beside.get(index).and_then(|passes| passes[pass]))
        {
            self.buffer.beside.push((op, beside));
        }
    }

    /// The host thread's launch of the next kernel (compute, collective or send), which the
    /// kernel waits for; `None` under CUDA graphs. The host runs ahead of the GPU as far as it
    /// can (a synchronous host, `compute.host-synchronous`, only once the GPU work it issued
    /// last has finished: [`workloads::dispatch::issue_synchronous`]); its first launch of an
    /// iteration waits for the previous iteration's end. `meta` describes what it launches.
    pub(super) fn launch(&mut self, meta: OpMeta) -> Option<Dep> {
        self.launch_times(meta, (1, 0))
    }

    /// [`RankEmitter::launch`] of `launches` launches issued back to back (one host op).
    fn launch_times(&mut self, meta: OpMeta, (launches, ops): (u32, u32)) -> Option<Dep> {
        if self.plan.host_cost == SimDuration::ZERO {
            return None;
        }
        let duration = SimDuration::from_ps(
            self.plan
                .host_cost
                .as_ps()
                .saturating_mul(u64::from(launches.max(1)))
                .saturating_add(self.plan.op_cost.as_ps().saturating_mul(u64::from(ops))),
        );
        let mut anchor: Vec<Dep> = self.host_start.take().into_iter().collect();
        if self.plan.host_synchronous {
            anchor.extend_from_slice(&self.last_issued);
        }
        let launch = self.buffer.push(
            Op {
                kind: OpKind::Compute { duration },
                rank: RankId(self.rank),
                stream: HOST_STREAM,
                label: self.labels.dispatch,
                meta: meta.with_work(Work::Launch),
            },
            &anchor,
        );
        Some(Dep::Local(launch))
    }

    /// A layer collective (of the layer and pass `meta` names) after the last compute op and
    /// anything waited for; the next compute op waits for it.
    pub(super) fn comm(&mut self, comm: Comm, meta: OpMeta) {
        // Collectives over any other communicator go with the data-parallel ones.
        let (stream, group, kind) = match comm.group {
            GroupKind::Tensor => (TENSOR_STREAM, self.group(GroupClass::Tensor), GroupKind::Tensor),
            GroupKind::Expert => {
                let class = match shard::expert_communicator(
                    comm.kind,
                    self.plan.strategy.parallelism.moe_dispatcher,
                    comm.what,
                ) {
                    ExpertCommunicator::ExpertNode => GroupClass::ExpertNode,
                    ExpertCommunicator::ExpertRail => GroupClass::ExpertRail,
                    ExpertCommunicator::Expert => GroupClass::Expert,
                    ExpertCommunicator::ExpertTensor => GroupClass::ExpertTensor,
                    ExpertCommunicator::ExpertTensorExpert => GroupClass::ExpertTensorExpert,
                };
                (EXPERT_STREAM, self.group(class), GroupKind::Expert)
            }
            GroupKind::Filter => (FILTER_STREAM, self.group(GroupClass::Tensor), GroupKind::Filter),
            GroupKind::Channel => (CHANNEL_STREAM, self.group(GroupClass::Tensor), GroupKind::Channel),
            GroupKind::Spatial => (SPATIAL_STREAM, self.group(GroupClass::Tensor), GroupKind::Spatial),
            // Context-parallel attention's all-to-alls, over the rank's all-to-all group.
            GroupKind::Context => (CONTEXT_STREAM, self.context_a2a_group(), GroupKind::Context),
            _ => (DATA_STREAM, self.group(GroupClass::Data), GroupKind::Data),
        };
        let meta = meta.with_group(kind);
        let label = self.comm_label(comm.what);
        let mut deps = std::mem::take(&mut self.waiting);
        deps.extend(self.last_compute.map(Dep::Local));
        let op = self.collective(comm, stream, group, label, &deps, meta);
        let mut ends = vec![Dep::Local(op)];
        if let Some(staging) = self.plan.strategy.parallelism.cnn_staging {
            let degree = u64::from(self.plan.strategy.parallelism.cnn_degree());
            let bytes = staging.collective_bytes(&comm, degree);
            if staging.pipelined(&comm) {
                // Copied fragment by fragment while earlier fragments travel: beside the
                // collective, on its own stream, from the same dependencies.
                if let Some(staged) = self.stage(staging, bytes, STAGING_STREAM, &deps, meta) {
                    ends.push(Dep::Local(staged));
                }
            } else if let Some(staged) = self.stage(staging, bytes, stream, &[Dep::Local(op)], meta) {
                ends = vec![Dep::Local(staged)];
            }
        }
        deps.clear();
        deps.extend_from_slice(&ends);
        self.waiting = deps;
        self.last_issued = ends;
    }

    /// The host round trip of `bytes` staged by CUDA-aware MPI ([`cnn::HostStaging`]) on
    /// `stream` after `deps`: a blocking delay of `bytes` at the staging rate, part of the
    /// transfer `meta` describes. `None` (no op) when nothing is staged.
    pub(super) fn stage(
        &mut self,
        staging: cnn::HostStaging,
        bytes: Bytes,
        stream: StreamId,
        deps: &[Dep],
        meta: OpMeta,
    ) -> Option<u32> {
        if bytes.0 == 0 {
            return None;
        }
        // The scenario requires at least 1 MB/s, so any layer's buffer takes far less than the
        // largest duration; saturate rather than fail on an absurd one.
        let duration = staging.rate.time_to_send(bytes).unwrap_or(SimDuration::from_ps(u64::MAX / 4));
        let label = self.comm_label(crate::HOST_STAGING_LABEL);
        let meta = meta.with_work(Work::Staging);
        let op = Op { kind: OpKind::Compute { duration }, rank: RankId(self.rank), stream, label, meta };
        Some(self.buffer.push(op, deps))
    }

    /// A host-side op on `stream` labelled `what` (its work on the host: `meta`); returns its
    /// local index.
    pub(super) fn host_op(
        &mut self,
        stream: StreamId,
        duration: SimDuration,
        what: &'static str,
        deps: &[Dep],
        meta: OpMeta,
    ) -> u32 {
        let label = self.comm_label(what);
        let op = Op { kind: OpKind::Compute { duration }, rank: RankId(self.rank), stream, label, meta };
        self.buffer.push(op, deps)
    }

    /// The origin named `name` (what emitted an op: [`OpMeta::origin`]), interned once.
    pub(super) fn origin(&mut self, name: &'static str) -> Origin {
        let known =
            self.shared.origins.iter().find(|(known, _)| std::ptr::eq(*known, name) || *known == name);
        match known {
            Some(&(_, origin)) => origin,
            None => {
                let origin = self.shared.graph.origin(name);
                self.shared.origins.push((name, origin));
                origin
            }
        }
    }

    /// The label of a collective called `what`, interned once.
    pub(super) fn comm_label(&mut self, what: &'static str) -> LabelId {
        match self.shared.comm_labels.get(what) {
            Some(&label) => label,
            None => {
                let label = self.shared.graph.label(what);
                self.shared.comm_labels.insert(what, label);
                label
            }
        }
    }

    /// This rank's part in the next collective of `group` (described by `meta`).
    pub(super) fn collective(
        &mut self,
        comm: Comm,
        stream: StreamId,
        group: GroupId,
        label: LabelId,
        deps: &[Dep],
        meta: OpMeta,
    ) -> u32 {
        let id = self.collective_instance(comm, group);
        let launch = self.launch(meta);
        let op = Op { kind: OpKind::Collective(id), rank: RankId(self.rank), stream, label, meta };
        match launch {
            Some(launch) => self.buffer.push_with(op, deps, launch),
            None => self.buffer.push(op, deps),
        }
    }

    /// The rank's next collective of `group`: created by the first member to reach it, shared
    /// by the others (members issue a group's collectives in the same order).
    pub(super) fn collective_instance(
        &mut self,
        comm: Comm,
        group: GroupId,
    ) -> sim_core::graph::CollectiveId {
        let data_algorithm = self.plan.strategy.parallelism.data_algorithm;
        // The data-parallel algorithm is an allreduce's; DASO's node broadcast picks its own.
        let cnn_group = matches!(comm.group, GroupKind::Filter | GroupKind::Channel | GroupKind::Spatial);
        let algorithm = if comm.group == GroupKind::Data && data_algorithm.supports(comm.kind) {
            data_algorithm
        } else if cnn_group
            && comm.kind == CollectiveKind::AllToAll
            && self.plan.strategy.parallelism.cnn_staging.is_some()
        {
            // Over MPI (`cnn-transport = "mpi"` / `"mpi-managed"`), Open MPI's tuned component
            // runs every `MPI_Alltoallv` pairwise: p - 1 rounds, in round k rank i sends to
            // i + k and receives from i - k (`ompi_coll_tuned_alltoallv_intra_dec_fixed`, v2.1.6,
            // `ompi/mca/coll/tuned/coll_tuned_decision_fixed.c`).
            CollectiveAlgorithm::Pairwise
        } else {
            CollectiveAlgorithm::Auto
        };
        let issued = self.shared.issued[self.rank as usize].entry(group).or_insert(0);
        let sequence = *issued as usize;
        *issued += 1;
        let instances = self.shared.instances.entry(group).or_default();
        if sequence == instances.len() {
            let id = self.shared.graph.add_collective(Collective {
                kind: comm.kind,
                group,
                bytes: comm.bytes,
                algorithm,
            });
            instances.push(id);
        }
        instances[sequence]
    }

    /// Megatron's `torch.cuda.synchronize()` after a pipeline exchange
    /// (`parallelism.pipeline-host-sync`): the host issues nothing more until every op this
    /// rank has put on a device stream (its kernels, collectives and sends, `frontier`) and the
    /// transfer it receives at the exchange (`received`) have finished.
    fn pipeline_host_sync(&mut self, frontier: &mut DeviceFrontier, received: Option<Dep>) {
        frontier.advance(&self.buffer.ops);
        let mut deps: Vec<Dep> = frontier.last.iter().flatten().map(|&op| Dep::Local(op)).collect();
        deps.extend(received);
        let meta = OpMeta::NONE.with_work(Work::Launch).with_origin(self.origin(PIPELINE_ORIGIN));
        self.host_op(HOST_STREAM, SimDuration::ZERO, PIPELINE_HOST_SYNC_LABEL, &deps, meta);
    }

    /// A read of the host (a NaN/Inf check of `compute.host-nan-checks`, an expert layer's
    /// token counts): it copies a result to host memory, so it issues nothing more until the
    /// ops `deps` name have run (what a `.item()` or `.cpu()` on the stream waits for).
    pub(super) fn host_read(&mut self, deps: &[Dep], what: &'static str) {
        let meta = OpMeta::NONE.with_work(Work::Launch).with_origin(self.origin(HOST_READ_ORIGIN));
        self.host_op(HOST_STREAM, SimDuration::ZERO, what, deps, meta);
    }

    /// The training loop's host work at the step's end (`compute.step-overhead`): the host
    /// waits for every op this rank put on a device stream and for `end` (the loop reads the
    /// loss with `.item()`), then spends the step overhead with the GPU idle; the rank's
    /// iteration ends with it.
    fn step_host_work(&mut self, end: u32) -> u32 {
        let mut frontier = DeviceFrontier::default();
        frontier.advance(&self.buffer.ops);
        let mut deps: Vec<Dep> = frontier.last.iter().flatten().map(|&op| Dep::Local(op)).collect();
        deps.push(Dep::Local(end));
        let meta = OpMeta::NONE.with_work(Work::Launch).with_origin(self.origin(STEP_ORIGIN));
        self.host_op(HOST_STREAM, self.plan.step_overhead, STEP_HOST_LABEL, &deps, meta)
    }

    /// A pipeline send to `to` after the last compute op (of pass `pass`), registered under
    /// `key`.
    pub(super) fn send(&mut self, to: u32, bytes: Bytes, label: LabelId, key: Key, pass: Pass) {
        let meta = OpMeta::NONE
            .with_pass(pass)
            .with_group(GroupKind::Pipeline)
            .with_origin(self.origin(PIPELINE_ORIGIN));
        let mut deps: Vec<Dep> = self.last_compute.map(Dep::Local).into_iter().collect();
        deps.extend(self.launch(meta));
        let op = self.buffer.push(
            Op {
                kind: OpKind::Transfer { dst: RankId(to), bytes },
                rank: RankId(self.rank),
                stream: PIPELINE_STREAM,
                label,
                meta,
            },
            &deps,
        );
        self.shared.keys.insert(key, (self.rank, op));
    }

    /// Context-parallel attention: `context` compute steps of `duration / context`, the key/value
    /// chunk of each step passed on to the next context rank while the next step computes.
    /// Returns the last step's op.
    pub(super) fn ring(
        &mut self,
        layer: usize,
        micro: u32,
        duration: SimDuration,
        bytes: Bytes,
        label: LabelId,
        pass: u8,
    ) -> u32 {
        let rank = RankId(self.rank);
        let members = self.context_ring_members();
        let c = members.len() as u32;
        let position = members.iter().position(|r| *r == rank).unwrap_or(0) as u32;
        let next = members[((position + 1) % c) as usize].0;
        let previous = members[((position + c - 1) % c) as usize].0;
        let step = SimDuration::from_ps(duration.as_ps() / u64::from(c));
        let kernel =
            layer_meta(layer, [Pass::Forward, Pass::Recompute, Pass::BackwardData][usize::from(pass)]);
        let transfer = kernel.with_group(GroupKind::Context);
        let producer: Vec<Dep> =
            self.waiting.iter().copied().chain(self.last_compute.map(Dep::Local)).collect();
        // Each step runs the pass's kernels on its chunk: its further kernels each an op.
        let (_, ops) = wide(self.plan.launches()[layer][if pass == 2 { 1 } else { 0 }]);
        let mut op = self.compute_launched(step, label, kernel, (1, ops));
        let received =
            |step: u32| Dep::Key(Key::Ring { sender: previous, layer: layer as u32, micro, step, pass });
        for j in 0..c - 1 {
            let mut deps = if j == 0 { producer.clone() } else { vec![received(j - 1)] };
            deps.extend(self.launch(transfer));
            let send = self.buffer.push(
                Op {
                    kind: OpKind::Transfer { dst: RankId(next), bytes },
                    rank,
                    stream: CONTEXT_STREAM,
                    label: self.labels.ring,
                    meta: transfer,
                },
                &deps,
            );
            self.shared.keys.insert(
                Key::Ring { sender: self.rank, layer: layer as u32, micro, step: j, pass },
                (self.rank, send),
            );
            self.waiting.push(received(j));
            op = self.compute_launched(step, label, kernel, (1, ops));
        }
        op
    }

    /// The context ranks this rank's attention all-to-alls run over
    /// ([`crate::ContextComm`]): the `a` consecutive ranks of its block in the context group.
    fn context_a2a_group(&mut self) -> GroupId {
        let all = self.plan.layout.group(Axis::Context, RankId(self.rank));
        let a = (self.plan.strategy.parallelism.split().context_a2a as usize).clamp(1, all.len());
        let position = all.iter().position(|r| r.0 == self.rank).unwrap_or(0);
        let start = position - position % a;
        let members = all[start..start + a].to_vec();
        let key = (GroupClass::Named("context all-to-all"), members[0].0);
        if let Some(&group) = self.shared.groups.get(&key) {
            return group;
        }
        let group = self.shared.graph.add_group(members);
        self.shared.groups.insert(key, group);
        group
    }

    /// The ranks of this rank's context ring: the whole context group, or with all-to-all
    /// groups of `a` the ranks at the same place in each ([`crate::ContextComm::A2aP2p`]).
    fn context_ring_members(&self) -> Vec<RankId> {
        let all = self.plan.layout.group(Axis::Context, RankId(self.rank));
        let a = (self.plan.strategy.parallelism.split().context_a2a as usize).clamp(1, all.len());
        let position = all.iter().position(|r| r.0 == self.rank).unwrap_or(0);
        all.into_iter().skip(position % a).step_by(a).collect()
    }

    /// The gradient-synchronisation group: data (x context) ranks, or the expert-data group
    /// for expert parameters.
    pub(super) fn sync_group(&mut self, expert: bool) -> GroupId {
        self.group(if expert { GroupClass::ExpertData } else { GroupClass::Data })
    }

    /// The group of `class` this rank belongs to, interned on first use (keyed by its first
    /// member, computed without listing the members).
    pub(super) fn group(&mut self, class: GroupClass) -> GroupId {
        let layout = &self.plan.layout;
        let rank = RankId(self.rank);
        if matches!(class, GroupClass::ExpertNode | GroupClass::ExpertRail) {
            let node = self.plan.strategy.parallelism.moe_node;
            let members = if class == GroupClass::ExpertNode {
                layout.expert_node_group(rank, node)
            } else {
                layout.expert_rail_group(rank, node)
            };
            let key = (class, members.iter().map(|r| r.0).min().unwrap_or(rank.0));
            if let Some(&group) = self.shared.groups.get(&key) {
                return group;
            }
            let group = self.shared.graph.add_group(members);
            self.shared.groups.insert(key, group);
            return group;
        }
        let mut first = layout.coordinates(rank);
        let contexts = layout.size(Axis::Context);
        let expert = layout.expert();
        // Index along (context, data), context fastest.
        let index = first.context + contexts * first.data;
        // A policy's own groups are interned by the policy (`group` does not know their members).
        let class = if matches!(class, GroupClass::Named(_)) { GroupClass::Data } else { class };
        if layout.megatron_experts()
            && let Some(axes) = match class {
                GroupClass::Expert => Some(&[ExpertAxis::Expert][..]),
                GroupClass::ExpertData => Some(&[ExpertAxis::ExpertData][..]),
                GroupClass::ExpertTensor => Some(&[ExpertAxis::ExpertTensor][..]),
                GroupClass::ExpertTensorExpert => Some(&[ExpertAxis::ExpertTensor, ExpertAxis::Expert][..]),
                _ => None,
            }
        {
            // Megatron-Core's expert rank generator: keyed by the member at index 0 of `axes`.
            let mut coordinates = layout.expert_coordinates(rank);
            for axis in axes {
                match axis {
                    ExpertAxis::ExpertTensor => coordinates.expert_tensor = 0,
                    ExpertAxis::Expert => coordinates.expert = 0,
                    ExpertAxis::ExpertData => coordinates.expert_data = 0,
                    ExpertAxis::Pipeline => coordinates.pipeline = 0,
                }
            }
            let key = (class, layout.expert_rank(coordinates).0);
            if let Some(&group) = self.shared.groups.get(&key) {
                return group;
            }
            let members = layout.expert_axes_group(axes, rank);
            debug_assert_eq!(members[0].0, key.1, "group key of {class:?}");
            let group = self.shared.graph.add_group(members);
            self.shared.groups.insert(key, group);
            return group;
        }
        match class {
            GroupClass::Tensor => first.tensor = 0,
            GroupClass::ModelParallel | GroupClass::Embedding => first.pipeline = 0,
            GroupClass::Mirror => {
                first.pipeline = first.pipeline.min(layout.size(Axis::Pipeline) - 1 - first.pipeline)
            }
            GroupClass::Data => {
                first.data = 0;
                first.context = 0;
            }
            GroupClass::Expert => {
                let start = index - index % expert;
                first.context = start % contexts;
                first.data = start / contexts;
            }
            GroupClass::ExpertData => {
                let start = index % expert;
                first.context = start % contexts;
                first.data = start / contexts;
            }
            GroupClass::ExpertTensor => first.tensor = 0,
            GroupClass::ExpertTensorExpert => {
                let start = index - index % expert;
                first.context = start % contexts;
                first.data = start / contexts;
                first.tensor = 0;
            }
            GroupClass::Named(_) | GroupClass::ExpertNode | GroupClass::ExpertRail => {}
        }
        let key = (class, layout.rank(first).0);
        if let Some(&group) = self.shared.groups.get(&key) {
            return group;
        }
        let members = match class {
            GroupClass::Tensor => layout.group(Axis::Tensor, rank),
            GroupClass::ModelParallel => layout.group(Axis::Pipeline, rank),
            GroupClass::Embedding => {
                let all = layout.group(Axis::Pipeline, rank);
                vec![all[0], all[all.len() - 1]]
            }
            GroupClass::Mirror => {
                let all = layout.group(Axis::Pipeline, rank);
                let stage = layout.coordinates(rank).pipeline as usize;
                let (near, far) = (stage.min(all.len() - 1 - stage), stage.max(all.len() - 1 - stage));
                vec![all[near], all[far]]
            }
            GroupClass::Expert => layout.expert_group(rank),
            GroupClass::ExpertTensor => layout.expert_tensor_group(rank),
            GroupClass::ExpertTensorExpert => layout.expert_tensor_expert_group(rank),
            GroupClass::ExpertNode | GroupClass::ExpertRail => unreachable!("interned above"),
            GroupClass::Data | GroupClass::Named(_) => {
                if contexts > 1 {
                    layout.data_context_group(rank)
                } else {
                    layout.group(Axis::Data, rank)
                }
            }
            GroupClass::ExpertData => {
                let all = layout.data_context_group(rank);
                let expert = expert as usize;
                let position = all.iter().position(|r| *r == rank).unwrap_or(0) % expert;
                all.into_iter().enumerate().filter(|(i, _)| i % expert == position).map(|(_, r)| r).collect()
            }
        };
        debug_assert_eq!(members[0].0, key.1, "group key of {class:?}");
        let group = self.shared.graph.add_group(members);
        self.shared.groups.insert(key, group);
        group
    }
}

/// The origin of the host's reads of device results (`compute.host-nan-checks`, an expert
/// layer's token counts).
const HOST_READ_ORIGIN: &str = "host reads";
/// The host's read of a micro-batch's loss for its NaN/Inf check.
pub(super) const LOSS_CHECK_LABEL: &str = "host: loss NaN/Inf check (reads the loss)";
/// The host's read of an expert layer's token counts (Megatron-Core's dispatchers).
const MOE_COUNTS_LABEL: &str = "host: MoE token counts read (dropless dispatch)";
/// The host's read of a gradient bucket's norm for its NaN/Inf check.
pub(super) const GRADIENT_CHECK_LABEL: &str = "host: gradient NaN/Inf check (reads the bucket's norm)";
/// The origin of the pipeline's sends between stages (and of the host's synchronisation
/// after them, `parallelism.pipeline-host-sync`).
const PIPELINE_ORIGIN: &str = "pipeline";
/// The origin of the training loop's per-iteration host work (`compute.step-overhead`).
const STEP_ORIGIN: &str = "training loop";
/// The label of the training loop's per-iteration host work.
const STEP_HOST_LABEL: &str = "host: training loop per step (loss read, logging)";
/// The label of the host's synchronisation after a pipeline exchange.
const PIPELINE_HOST_SYNC_LABEL: &str = "host: torch.cuda.synchronize after pipeline exchange";
/// The label of the all-gather of a received pipeline activation's slices
/// (`parallelism.pipeline-scatter-gather`).
const PIPELINE_GATHER_LABEL: &str = "pipeline: all-gather received slices";

/// The last op of each device stream of a rank's buffer (host-side ops left out), scanned
/// incrementally: what `torch.cuda.synchronize()` waits for.
#[derive(Default)]
struct DeviceFrontier {
    /// Ops of the buffer already scanned.
    scanned: usize,
    /// The last device op of each stream, by stream number.
    last: Vec<Option<u32>>,
}

impl DeviceFrontier {
    /// Takes in the ops added to `ops` since the last call.
    fn advance(&mut self, ops: &[Op]) {
        for (index, op) in ops.iter().enumerate().skip(self.scanned) {
            if op.stream == HOST_STREAM || op.meta.work().is_host() {
                continue;
            }
            let stream = usize::from(op.stream.0);
            if self.last.len() <= stream {
                self.last.resize(stream + 1, None);
            }
            self.last[stream] = Some(index as u32);
        }
        self.scanned = ops.len();
    }
}
/// The origin of the pipeline flush: the gradient-norm allreduce over the pipeline stages
/// before the optimizer step, whose wait is pipeline bubble rather than communication.
pub const FLUSH_ORIGIN: &str = "flush";
/// The origin of the allreduce of a tied embedding's two copies' gradients.
const TIED_EMBEDDING_ORIGIN: &str = "tied-embedding";
/// The origin of DualPipe's sum of the two model copies' gradients.
const DUAL_PIPE_ORIGIN: &str = "dualpipe copies";
/// The origin of the all-reduce of Muon's round-robin updates.
const MUON_ORIGIN: &str = "muon updates";

/// The metadata of layer `index`'s work in `pass`.
pub(super) fn layer_meta(index: usize, pass: Pass) -> OpMeta {
    OpMeta::NONE.with_layer(index as u32).with_pass(pass)
}

/// The bytes one rank sends across chunk boundary `boundary`: the boundary activation (or its
/// gradient), or its 1/t slice under Megatron-LM's scatter-gather
/// (`parallelism.pipeline-scatter-gather`).
fn scattered(plan: &Plan<'_>, boundary: usize) -> Bytes {
    let bytes = plan.boundary_bytes[boundary];
    Bytes(bytes.0 / u64::from(plan.pipeline_scatter[boundary]))
}

/// A pass's `(module, further kernel)` launch counts as [`RankEmitter::compute_launched`] takes
/// them.
fn wide((modules, ops): (u16, u16)) -> (u32, u32) {
    (u32::from(modules), u32::from(ops))
}
