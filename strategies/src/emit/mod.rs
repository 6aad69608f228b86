//! The per-stage, per-micro-batch emitter: turns a [`Strategy`] into execution-graph ops.
//!
//! Layout: [`plan`] (what every rank shares, and each stage's memory), [`tables`] (local layers
//! and kernel times), [`rank`] (the per-rank driver and the layer-level emission), [`policy`]
//! (one file per gradient-synchronisation and sharding policy: DDP, ZeRO-1/2, FSDP, DeepSpeed's
//! ZeRO-3, DASO), [`offload`] (out-of-core training), [`halo`] (spatial halo exchanges),
//! [`input`] (the data loader), [`kernel_table`] (the plan as a table).
//!
//! Each rank's ops of one iteration are emitted into a buffer in schedule order, with
//! dependencies on other ranks' ops named by key (a pipeline send of micro-batch `m`, chunk
//! `k`; a context-ring step). When every rank of the iteration is emitted, the buffers are
//! appended rank after rank and the keys resolved, so a rank's ops are contiguous and plain
//! data parallelism keeps the op order it always had.
//!
//! Streams: compute kernels on [`crate::COMPUTE_STREAM`]; each communicator kind on its own
//! stream, so a pipeline send or a gradient bucket overlaps compute while a tensor-parallel
//! allreduce, which the next kernel needs, does not. Streams are in-order queues only: what an
//! op is for (host or device work, layer, pass, communicator, the policy that emitted it), its
//! metadata says ([`sim_core::graph::OpMeta`]), and that is what the report and the timeline
//! export read back.
//!
//! Per micro-batch and chunk, forward: receive the activation from the previous chunk's
//! stage, run each layer's collectives and kernels, send the output on. Backward: receive the
//! output gradient, then per layer in reverse: recomputation (forward kernels and their
//! collectives again), the collectives before the backward, backward-data, the collectives on
//! the input gradient (overlapped by the backward-weight kernel), backward-weight, and, in the
//! last micro-batch, the gradient bucket the layer closes. After the schedule: the optimizer
//! step on the rank's parameters, then the policy's step (ZeRO stages 1 and 2: the parameter allgather).

mod halo;
mod input;
pub mod kernel_table;
mod moe_overlap;
mod offload;
mod plan;
mod policy;
mod rank;
mod tables;

use sim_core::lookup::FastLookupMap;
use std::collections::VecDeque;

use sim_core::graph::{GraphBuilder, OpId, RankId};
use sim_core::units::{Bytes, SimDuration};

use crate::{Axis, Bucket, CnnSplit, Comm, Lowered, Strategy, StrategyError};
pub use offload::OFFLOAD_ORIGIN;
use offload::OffloadState;
use plan::Plan;
use policy::RankPolicy;
pub use rank::FLUSH_ORIGIN;
use rank::{Buffer, RankEmitter, Shared};
pub use tables::LayerTables;

/// A dependency of a buffered op.
#[derive(Debug, Clone, Copy)]
enum Dep {
    /// An op of the same rank's buffer.
    Local(u32),
    /// An op already in the graph (an earlier iteration).
    Global(OpId),
    /// Another rank's op of this iteration, by what it is.
    Key(Key),
}

/// Names an op another rank depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    /// The pipeline send of `sender`: micro-batch, global chunk, forward or backward.
    Stage { sender: u32, micro: u32, chunk: u32, forward: bool },
    /// Step `step` of the context ring of layer `layer` on `sender`; `pass` 0 forward, 1
    /// recomputation, 2 backward.
    Ring { sender: u32, layer: u32, micro: u32, step: u32, pass: u8 },
    /// The halo `sender` sends along grid dimension `dim` of layer `layer` to its upper (or
    /// lower) neighbour; `pass` 0 forward, 1 recomputation, 2 backward (the halo's gradient).
    Halo { sender: u32, layer: u32, micro: u32, dim: u8, up: bool, pass: u8 },
}

/// One kernel: duration and FLOPs.
type Kernel = Option<(SimDuration, f64)>;

/// How `plan`'s symmetric ranks are folded.
struct Folding {
    /// Whether they are.
    fold: bool,
    /// Whether they could be: the replicas are symmetric and some permutation of them keeps
    /// every group whole (`simulation.fold-symmetric-ranks` decides the rest).
    foldable: bool,
    /// Whether the CNN split is spatial (its tiles differ: only replicas are folded).
    spatial: bool,
    /// The tensor degree folded (1 under a spatial split).
    tensor: u32,
    /// The mixed radix the data index is rotated in ([`data_radices`]).
    data_radices: Vec<u32>,
}

impl Folding {
    /// The rank that plays `coordinates`' role in image `shift` (`1..tensor x data`): tensor
    /// index shifted by `shift % tensor`, data index rotated digit by digit by `shift / tensor`.
    /// [`Images`] tabulates it for every rank at once.
    #[cfg(test)]
    fn image(&self, layout: &crate::RankLayout, coordinates: crate::Coordinates, shift: u32) -> RankId {
        let mut c = coordinates;
        let t = self.tensor.max(1);
        if !self.spatial {
            c.tensor = (c.tensor + shift % t) % t;
        }
        c.data = crate::layout::rotate_digits(c.data, shift / t, &self.data_radices);
        layout.rank(c)
    }
}

/// Sets `out[value]` to `rotate_digits(value, shift, radices)` for every value below `count`,
/// counting in the mixed radix (digits and rotated digits carried along, no division per
/// value): a rotated digit is the digit plus the shift's, modulo the radix, and a carry out of
/// the last digit drops, as `rotate_digits` drops what lies above the last radix.
fn rotated_digits(count: u32, shift: u32, radices: &[u32], out: &mut Vec<u32>) {
    // Per digit: radix, place, the value's digit and its rotated digit (of value 0 first).
    let mut digits: Vec<(u32, u32, u32, u32)> = Vec::with_capacity(radices.len());
    let (mut rest, mut place, mut value) = (shift, 1u32, 0u32);
    for &radix in radices {
        let radix = radix.max(1);
        digits.push((radix, place, 0, rest % radix));
        value += rest % radix * place;
        rest /= radix;
        place *= radix;
    }
    out.clear();
    out.reserve(count as usize);
    for _ in 0..count {
        out.push(value);
        for (radix, place, digit, rotated) in digits.iter_mut() {
            *rotated += 1;
            if *rotated == *radix {
                *rotated = 0;
                value -= (*radix - 1) * *place;
            } else {
                value += *place;
            }
            *digit += 1;
            if *digit < *radix {
                break;
            }
            *digit = 0;
        }
    }
}

/// Every rank's image under a shift of a [`Folding`], made from a small map per axis instead
/// of coordinates per rank and per image (t x d images of every rank: 16% of a folded GPT-3
/// lowering's instructions). A rank is linear in its coordinates (`RankLayout::rank`: each
/// coordinate times the product of the sizes ordered before it), and an image changes only
/// the tensor and data coordinates, each by a map of its own: the ranks are then counted in
/// their order, axis by axis, adding up each axis's mapped term.
struct Images<'f> {
    folding: &'f Folding,
    /// The axes, fastest-varying first ([`crate::RankOrder`]).
    order: [Axis; 4],
    /// Per axis of `order`: its size, and the rank distance between its neighbours.
    sizes: [u32; 4],
    strides: [u32; 4],
    /// Per axis of `order`, per index: its image's term of the rank under the current shift.
    terms: [Vec<u32>; 4],
    /// Scratch: the sums of the faster axes' terms, in rank order.
    block: Vec<u32>,
    next: Vec<u32>,
}

impl<'f> Images<'f> {
    fn new(folding: &'f Folding, layout: &crate::RankLayout) -> Images<'f> {
        let order = layout.order().0;
        let sizes = order.map(|axis| layout.size(axis));
        let mut strides = [1u32; 4];
        for k in 1..4 {
            strides[k] = strides[k - 1] * sizes[k - 1];
        }
        Images {
            folding,
            order,
            sizes,
            strides,
            terms: Default::default(),
            block: Vec::new(),
            next: Vec::new(),
        }
    }

    /// Sets `out[rank]` to the rank that plays `rank`'s role in image `shift`
    /// ([`Folding::image`]), for every rank.
    fn fill(&mut self, shift: u32, out: &mut Vec<RankId>) {
        let folding = self.folding;
        let t = folding.tensor.max(1);
        for (k, terms) in self.terms.iter_mut().enumerate() {
            let (size, stride) = (self.sizes[k], self.strides[k]);
            match self.order[k] {
                Axis::Tensor if !folding.spatial => {
                    terms.clear();
                    terms.extend((0..size).map(|tensor| (tensor + shift % t) % t * stride));
                }
                Axis::Data => {
                    rotated_digits(size, shift / t, &folding.data_radices, terms);
                    for term in terms.iter_mut() {
                        *term *= stride;
                    }
                }
                _ => {
                    terms.clear();
                    terms.extend((0..size).map(|index| index * stride));
                }
            }
        }
        // The ranks counted in their order: the faster axes' sums as one block, every index
        // of the next axis adding its term to all of the block (long loops, few of them).
        let [fastest, middle @ .., slowest] = &self.terms;
        let (block, next) = (&mut self.block, &mut self.next);
        block.clear();
        block.extend_from_slice(fastest);
        for terms in middle {
            next.clear();
            next.resize(block.len() * terms.len(), 0);
            if block.len() >= terms.len() {
                for (part, &term) in next.chunks_exact_mut(block.len().max(1)).zip(terms) {
                    for (slot, &below) in part.iter_mut().zip(block.iter()) {
                        *slot = term + below;
                    }
                }
            } else {
                // A short block under a long axis: along the axis, one block position at a time.
                for (position, &below) in block.iter().enumerate() {
                    for (slot, &term) in next[position..].iter_mut().step_by(block.len()).zip(terms) {
                        *slot = term + below;
                    }
                }
            }
            std::mem::swap(block, next);
        }
        out.clear();
        out.resize(block.len() * slowest.len(), RankId(0));
        for (part, &term) in out.chunks_exact_mut(block.len().max(1)).zip(slowest) {
            for (slot, &below) in part.iter_mut().zip(block.iter()) {
                *slot = RankId(term + below);
            }
        }
    }
}

/// Whether `plan`'s symmetric ranks are folded, whether its CNN split is spatial, the tensor
/// degree folded (1 under a spatial split, whose tiles differ), and how the data index is
/// permuted. Folding is off where no permutation of the replicas keeps every group narrower
/// than the data group (expert groups, distributed-optimizer instances) whole.
fn folding(strategy: &Strategy<'_>, plan: &Plan<'_>) -> Folding {
    let spatial = matches!(strategy.parallelism.cnn(), CnnSplit::Spatial { .. });
    let folded_tensor = if spatial { 1 } else { plan.layout.size(Axis::Tensor) };
    // A policy whose replicas differ (DASO's rotating global sync) is not folded.
    let symmetric =
        plan.policy.symmetric_replicas() && folded_tensor.saturating_mul(plan.layout.size(Axis::Data)) > 1;
    let radices = if symmetric { data_radices(strategy, plan) } else { None };
    let mut folding = Folding {
        fold: false,
        foldable: radices.is_some(),
        spatial,
        tensor: folded_tensor,
        data_radices: radices.unwrap_or_default(),
    };
    folding.foldable = folding.foldable && images_keep_groups(strategy, plan, &folding);
    folding.fold = strategy.fold_symmetric_ranks && folding.foldable;
    folding
}

/// The mixed radix, least significant first, in which folding rotates a rank's data index to
/// find the rank that plays its role in another image: the sizes, in data ranks, of the nested
/// runs of consecutive data ranks that a group narrower than the data group keeps together
/// (an expert group carved out of data x context, Megatron-Core's expert-parallel groups being
/// built from consecutive data-parallel ranks; a distributed-optimizer instance), so that every
/// image maps such a group onto another one and not onto ranks of two. Without such groups,
/// the data degree alone (a cyclic shift of the replicas). `None` when the runs do not nest or
/// do not split the data index.
fn data_radices(strategy: &Strategy<'_>, plan: &Plan<'_>) -> Option<Vec<u32>> {
    let layout = &plan.layout;
    let (tensor, context, data) =
        (layout.size(Axis::Tensor), layout.size(Axis::Context), layout.size(Axis::Data));
    let expert = layout.expert();
    let mut runs = Vec::new();
    // The data ranks of a group of `ranks` consecutive ranks along the (context, data) index,
    // context fastest (1: inside one data index); `None` when it splits a data index's contexts
    // unevenly.
    let along_data_context = |ranks: u32| -> Option<u32> {
        let ranks = ranks.max(1);
        if ranks % context == 0 {
            Some(ranks / context)
        } else if context % ranks == 0 {
            Some(1)
        } else {
            None
        }
    };
    if expert > 1 {
        match layout.expert_tensor_degree() {
            // Megatron-Core's expert rank generator: an expert-tensor x expert block of the
            // ranks of a stage (checked by `images_keep_groups`).
            Some(expert_tensor) => {
                let block = expert_tensor.saturating_mul(expert);
                if block % (tensor * context) == 0 {
                    runs.push(block / (tensor * context));
                }
            }
            None => runs.push(along_data_context(expert)?),
        }
        // A DeepEP-style dispatcher's NVLink hop: the expert group's members on one node, a
        // node's consecutive ranks (its RDMA hop, the members at one local index of every
        // node, is kept whole by the same digits).
        let node = strategy.parallelism.moe_node;
        if strategy.parallelism.moe_dispatcher == crate::MoeDispatcher::DeepEp && node % tensor == 0 {
            runs.push(along_data_context(node / tensor)?);
        }
    }
    let instances = strategy.parallelism.distributed_optimizer_instances.max(1);
    if instances > 1 {
        runs.push(along_data_context(context.saturating_mul(data) / instances)?);
    }
    runs.retain(|&run| run > 1 && run < data);
    runs.sort_unstable();
    runs.dedup();
    let mut radices = Vec::with_capacity(runs.len() + 1);
    let mut below = 1;
    for run in runs.into_iter().chain(std::iter::once(data)) {
        if run % below != 0 {
            return None;
        }
        radices.push(run / below);
        below = run;
    }
    Some(radices)
}

/// Whether every image of `folding` maps each group narrower than the data group that the
/// lowering may use (expert, expert-data, expert-tensor, expert-tensor x expert groups and the
/// distributed-optimizer instances) onto a group of the same kind. Checked one image at a time
/// (no image is stored); nothing to check, and true, without such groups.
fn images_keep_groups(strategy: &Strategy<'_>, plan: &Plan<'_>, folding: &Folding) -> bool {
    let layout = &plan.layout;
    let ranks = layout.ranks();
    let instances = strategy.parallelism.distributed_optimizer_instances.max(1) as usize;
    let mut partitions: Vec<Box<dyn Fn(RankId) -> Vec<RankId> + '_>> = Vec::new();
    if layout.expert() > 1 {
        partitions.push(Box::new(|rank| layout.expert_group(rank)));
        partitions.push(Box::new(|rank| layout.expert_data_group(rank)));
        if layout.megatron_experts() {
            partitions.push(Box::new(|rank| layout.expert_tensor_group(rank)));
            partitions.push(Box::new(|rank| layout.expert_tensor_expert_group(rank)));
        }
        if strategy.parallelism.moe_dispatcher == crate::MoeDispatcher::DeepEp {
            let node = strategy.parallelism.moe_node;
            partitions.push(Box::new(move |rank| layout.expert_node_group(rank, node)));
            partitions.push(Box::new(move |rank| layout.expert_rail_group(rank, node)));
        }
    }
    if instances > 1 {
        for across in [false, true] {
            partitions.push(Box::new(move |rank| {
                policy::zero::instance_members(layout.data_context_group(rank), rank, instances, across)
            }));
            if layout.expert() > 1 {
                partitions.push(Box::new(move |rank| {
                    policy::zero::instance_members(layout.expert_data_group(rank), rank, instances, across)
                }));
            }
        }
    }
    if partitions.is_empty() {
        return true;
    }
    // Each partition as the smallest member of every rank's group.
    let keys: Vec<Vec<u32>> = partitions
        .iter()
        .map(|group_of| {
            let mut key = vec![u32::MAX; ranks as usize];
            for rank in 0..ranks {
                if key[rank as usize] == u32::MAX {
                    let members = group_of(RankId(rank));
                    let first = members.iter().map(|r| r.0).min().unwrap_or(rank);
                    for member in members {
                        key[member.0 as usize] = first;
                    }
                }
            }
            key
        })
        .collect();
    let mut images = Images::new(folding, layout);
    let mut image = Vec::with_capacity(ranks as usize);
    let mut maps_to = vec![u32::MAX; ranks as usize];
    for shift in 1..folding.tensor.saturating_mul(layout.size(Axis::Data)) {
        images.fill(shift, &mut image);
        for key in &keys {
            maps_to.fill(u32::MAX);
            for rank in 0..ranks as usize {
                let (from, to) = (key[rank] as usize, key[image[rank].0 as usize]);
                let slot = &mut maps_to[from];
                if *slot == u32::MAX {
                    *slot = to;
                } else if *slot != to {
                    return false; // two members of one group land in two groups
                }
            }
        }
    }
    true
}

/// The size of `plan`'s graph as [`within_budget`] counts it, from the kernel table alone.
struct GraphSize {
    ranks: u64,
    /// Images of a simulated rank (tensor x data) when folded.
    symmetric: u64,
    /// Kernels and host launches of one simulated rank per iteration.
    per_rank: u64,
    /// Iterations held at once.
    iterations: u64,
}

impl GraphSize {
    fn of(strategy: &Strategy<'_>, plan: &Plan<'_>, folding: &Folding, held_iterations: u32) -> GraphSize {
        let p = &strategy.parallelism;
        let ranks = u64::from(plan.layout.ranks());
        let symmetric = u64::from(folding.tensor) * u64::from(plan.layout.size(Axis::Data));
        let launches = if plan.host_cost > SimDuration::ZERO { 2 } else { 1 };
        // Kernels per micro-batch of each stage; every stage has as many simulated ranks.
        let per_stage: Vec<u64> = (0..p.pipeline)
            .map(|stage| {
                plan.stage_layers(stage).map(|l| plan.kernels[l].iter().flatten().count() as u64).sum()
            })
            .collect();
        let per_micro_batch = per_stage.iter().sum::<u64>() / u64::from(p.pipeline.max(1));
        let per_rank = per_micro_batch.saturating_mul(u64::from(plan.micro_batches)).saturating_mul(launches);
        GraphSize { ranks, symmetric, per_rank, iterations: u64::from(held_iterations) }
    }

    /// (simulated ranks, ops, items of the symmetry's rank maps), folded or not.
    fn held(&self, folded: bool) -> (u64, u64, u64) {
        use sim_core::budget::BYTES_PER_ITEM;
        let simulated = if folded { self.ranks / self.symmetric.max(1) } else { self.ranks };
        let maps = if folded {
            self.symmetric.saturating_sub(1).saturating_mul(self.ranks).saturating_mul(4) / BYTES_PER_ITEM
        } else {
            0
        };
        (simulated, simulated.saturating_mul(self.per_rank).saturating_mul(self.iterations), maps)
    }
}

/// A lower bound of the ops `strategy`'s lowering holds at once (every iteration's; the
/// budget's count, [`within_budget`]), from the kernel table alone: milliseconds, no graph.
pub(super) fn ops_lower_bound(strategy: &Strategy<'_>) -> Result<u64, StrategyError> {
    let plan = Plan::new(strategy)?;
    let folding = folding(strategy, &plan);
    let (_, ops, maps) = GraphSize::of(strategy, &plan, &folding, strategy.iterations).held(folding.fold);
    Ok(ops.saturating_add(maps))
}

/// Refuses, before anything per rank is allocated, a graph that would pass the work budget
/// ([`sim_core::budget`]). The estimate is a lower bound: each simulated rank's kernels of its
/// stage's layers, every micro-batch, with their host launches, every iteration (collectives,
/// sends and the optimizer come on top), so a job it refuses is at least that large. Folded,
/// the symmetry's rank maps count too: one rank id per rank per image (t x d images), which
/// grows with the square of the data-parallel degree.
fn within_budget(
    strategy: &Strategy<'_>,
    plan: &Plan<'_>,
    folding: &Folding,
    held_iterations: u32,
) -> Result<(), StrategyError> {
    let fold = folding.fold;
    use sim_core::budget::MAX_ITEMS;
    let size = GraphSize::of(strategy, plan, folding, held_iterations);
    let (ranks, symmetric, per_rank, iterations) =
        (size.ranks, size.symmetric, size.per_rank, size.iterations);
    let size = |folded: bool| size.held(folded);
    let (simulated, ops, maps) = size(fold);
    let needed = ops.saturating_add(maps);
    let layers = strategy.model.layers.len();
    let foldable = !fold && folding.foldable && {
        let (_, ops, maps) = size(true);
        ops.saturating_add(maps) <= MAX_ITEMS
    };
    // The key that drives the size: the ranks (simulated, or mapped by the symmetry), the
    // iterations, or the model's depth (per rank).
    let key = || {
        if maps > ops || simulated >= per_rank {
            if symmetric > 1 { "parallelism.data" } else { "cluster.nodes" }
        } else if iterations > 1 && simulated.saturating_mul(per_rank) <= MAX_ITEMS {
            "simulation.iterations"
        } else {
            "workload.model"
        }
        .to_string()
    };
    let what = || {
        let maps = if maps > 0 {
            format!(
                ", plus {symmetric} rank maps of {ranks} ranks for the folded replicas ({maps} ops' worth)"
            )
        } else {
            String::new()
        };
        format!(
            "{} ({layers} layers) on {ranks} GPUs: {simulated} simulated ranks x {per_rank} kernels and launches per iteration x {iterations} iterations{maps}",
            strategy.model.name
        )
    };
    let instead = || {
        let mut ways = Vec::new();
        if foldable {
            ways.push(
                "simulate one replica and replay its traffic on the others (simulation.fold-symmetric-ranks = true)"
                    .to_string(),
            );
        }
        if iterations > 1 {
            ways.push("simulate fewer iterations (simulation.iterations = 1)".to_string());
        }
        ways.push("simulate a smaller scale (fewer GPUs or layers) and extrapolate".to_string());
        let last = ways.pop().unwrap_or_default();
        if ways.is_empty() { last } else { format!("{}, or {last}", ways.join(", ")) }
    };
    sim_core::budget::check(needed, "ops", key, what, instead).map_err(Box::new)?;
    Ok(())
}

/// Lowers `strategy` (checked already) to its execution graph.
pub(super) fn lower(strategy: &Strategy<'_>) -> Result<Lowered, StrategyError> {
    let plan = Plan::new(strategy)?;
    let folding = folding(strategy, &plan);
    within_budget(strategy, &plan, &folding, strategy.iterations)?;
    let mut lowering = Lowering::new(strategy, &plan, &folding);
    let mut iteration_ends = Vec::with_capacity(strategy.iterations as usize);
    let mut pipeline_ends = Vec::with_capacity(strategy.iterations as usize);
    let mut spans = Vec::new();
    for _ in 0..strategy.iterations {
        let iteration = lowering.iteration()?;
        iteration_ends.push(iteration.ends);
        pipeline_ends.push(iteration.pipeline_ends);
        spans.extend(iteration.spans);
    }
    let info = info(&plan, lowering.simulated.iter().copied().map(RankId).collect())?;
    Ok(Lowered {
        offload: info.offload,
        graph: lowering.shared.graph.build()?,
        ranks: info.ranks,
        spans,
        iteration_ends,
        pipeline_ends,
        gradient_bytes: info.gradient_bytes,
        buckets: info.buckets,
        flops_per_rank_iteration: info.flops_per_rank_iteration,
        recompute_flops_per_rank_iteration: info.recompute_flops_per_rank_iteration,
        micro_batches: info.micro_batches,
        stages: info.stages,
    })
}

/// The layer ranges of `strategy`'s pipeline chunks, as its lowering splits them.
pub(super) fn chunk_layers(strategy: &Strategy<'_>) -> Result<Vec<std::ops::Range<usize>>, StrategyError> {
    Ok(Plan::new(strategy)?.chunk_layers)
}

/// The layer ranges of the pipeline stages, whole units each, balanced so that the slowest
/// stage's kernel time is as short as possible, each stage priced on its own devices: a unit
/// on stage `s` costs the most it costs on any of `stages[s]`'s strategies (the stage's
/// ranks wait for each other).
pub(super) fn stage_layers_by_speed(
    stages: &[Vec<&Strategy<'_>>],
) -> Result<Vec<std::ops::Range<usize>>, StrategyError> {
    let Some(first) = stages.iter().flatten().next() else { return Ok(Vec::new()) };
    let model = first.model;
    let units = model.pipeline_units();
    let mut costs = Vec::with_capacity(stages.len());
    for stage in stages {
        let mut stage_costs = vec![0.0f64; units.len()];
        for strategy in stage {
            let table = tables::LayerTables::layers_and_kernels(strategy)?;
            for (cost, unit) in stage_costs.iter_mut().zip(units.iter()) {
                let time: f64 = unit
                    .clone()
                    .map(|layer| {
                        table.kernels[layer].iter().flatten().map(|(d, _)| d.as_secs_f64()).sum::<f64>()
                    })
                    .sum();
                *cost = cost.max(time);
            }
        }
        costs.push(stage_costs);
    }
    Ok(crate::pipeline::partition_per_part(&costs)
        .into_iter()
        .map(|group| units[group.start].start..units[group.end - 1].end)
        .collect())
}

/// What the report needs of a lowering besides its graph.
fn info(plan: &Plan<'_>, ranks: Vec<RankId>) -> Result<crate::LoweredInfo, StrategyError> {
    let stages = plan.stages()?;
    let (flops_per_rank_iteration, recompute_flops_per_rank_iteration) = plan.mean_flops_per_rank();
    // Stage 0's gradient buckets (ZeRO-3: its units, each gathered and scattered whole).
    let stage0: Vec<Bucket> = plan.chunks_of(0).flat_map(|k| plan.policy.report_buckets(plan, k)).collect();
    let offload = plan.offload.as_ref().map(|offload| offload.totals(plan, &stages));
    Ok(crate::LoweredInfo {
        offload,
        ranks,
        gradient_bytes: stage0.iter().map(|b| b.bytes.0).sum(),
        buckets: stage0,
        flops_per_rank_iteration,
        recompute_flops_per_rank_iteration,
        micro_batches: plan.micro_batches,
        stages,
    })
}

/// Lowers `strategy` (checked already) one iteration at a time: `run` gets what the report
/// needs and a source that adds each iteration's ops to a builder ([`sim_core::stream`]),
/// so that a streamed run holds a few iterations' ops however many it simulates. The work
/// budget counts one iteration.
pub(super) fn lower_streaming<R>(
    strategy: &Strategy<'_>,
    run: impl FnOnce(crate::LoweredInfo, GraphBuilder, &mut crate::IterationSource<'_>) -> R,
) -> Result<R, StrategyError> {
    let plan = Plan::new(strategy)?;
    let folding = folding(strategy, &plan);
    within_budget(strategy, &plan, &folding, 1)?;
    let mut lowering = Lowering::new(strategy, &plan, &folding);
    let info = info(&plan, lowering.simulated.iter().copied().map(RankId).collect())?;
    // The builder with the labels, groups and symmetry; the source works on it when the run
    // hands it over.
    let builder = std::mem::replace(&mut lowering.shared.graph, GraphBuilder::new(0));
    let mut source = crate::IterationSource {
        lowering: Box::new(lowering),
        remaining: strategy.iterations,
        iterations: std::collections::VecDeque::new(),
        first: 0,
    };
    Ok(run(info, builder, &mut source))
}

/// The lowering's state between iterations.
pub(crate) struct Lowering<'p, 's> {
    plan: &'p Plan<'s>,
    shared: Shared,
    labels: plan::Labels,
    bucket_labels: Vec<Vec<(sim_core::graph::LabelId, sim_core::graph::LabelId)>>,
    /// The ranks that get ops.
    simulated: Vec<u32>,
    position_of: Vec<u32>,
    previous_end: Vec<Option<OpId>>,
    /// Each simulated rank's side of the policy, with its state across iterations.
    policies: Vec<Box<dyn RankPolicy + 'p>>,
    /// Each simulated rank's loader batches in flight, carried from one iteration to the next.
    loads: Vec<VecDeque<(u32, Dep)>>,
    iteration: u32,
}

/// The ops one iteration added: the last op of every simulated rank, its last pipeline
/// compute op, and its schedule steps.
#[derive(Debug, Clone)]
pub struct IterationOps {
    /// The last op of every simulated rank ([`Lowered::iteration_ends`]).
    pub ends: Vec<OpId>,
    /// The last pipeline compute op of every simulated rank ([`Lowered::pipeline_ends`]).
    pub pipeline_ends: Vec<OpId>,
    /// Its schedule steps ([`Lowered::spans`]).
    pub spans: Vec<crate::ScheduleSpan>,
}

impl<'p, 's> Lowering<'p, 's> {
    fn new(strategy: &Strategy<'s>, plan: &'p Plan<'s>, folding: &Folding) -> Self {
        let (fold, spatial) = (folding.fold, folding.spatial);
        let ranks = plan.layout.ranks();
        let mut shared = Shared {
            graph: GraphBuilder::new(ranks),
            groups: FastLookupMap::new(),
            instances: FastLookupMap::new(),
            issued: vec![FastLookupMap::new(); ranks as usize],
            comm_labels: FastLookupMap::new(),
            origins: Vec::new(),
            keys: FastLookupMap::new(),
        };
        // Ops' metadata names layers by their index in the model.
        shared.graph.set_layer_names(strategy.model.layers.iter().map(|l| l.name.clone()).collect());
        // Folding: tensor ranks and data-parallel replicas do the same work at the same times, so
        // only tensor rank 0 of replica 0 of each (pipeline, context) position gets ops; the
        // engine replays their traffic on the other ranks (shadows), so the network still carries
        // every rank's bytes.
        // Spatial ranks differ (a tile on the border has one neighbour, not two): all of them get
        // ops, and only the replicas are folded.
        let simulated: Vec<u32> = (0..ranks)
            .filter(|&rank| {
                let c = plan.layout.coordinates(RankId(rank));
                !fold || ((spatial || c.tensor == 0) && c.data == 0)
            })
            .collect();
        let mut position_of = vec![u32::MAX; ranks as usize];
        for (position, &rank) in simulated.iter().enumerate() {
            position_of[rank as usize] = position as u32;
        }
        if fold {
            let (t, d) = (folding.tensor, plan.layout.size(Axis::Data));
            // Every rank's coordinates once, not once per image (t x d images of every rank):
            // each image from a map of the tensor and one of the data indexes.
            let mut table = Images::new(folding, &plan.layout);
            // Replicas permuted so that groups narrower than the data group (expert groups,
            // optimizer instances) map onto groups: a cyclic shift of the data index would map
            // an expert group of consecutive data ranks onto ranks of two groups, two servers.
            let images = (0..t * d)
                .skip(1)
                .map(|shift| {
                    let mut image = Vec::with_capacity(ranks as usize);
                    table.fill(shift, &mut image);
                    image
                })
                .collect();
            shared.graph.set_symmetry(images);
        }
        let labels = plan.labels(&mut shared.graph);
        let bucket_labels = policy::buckets::labels(plan, &mut shared.graph);
        let previous_end: Vec<Option<OpId>> = vec![None; simulated.len()];
        let policies: Vec<Box<dyn RankPolicy + 'p>> =
            simulated.iter().map(|_| plan.policy.for_rank()).collect();
        let loads: Vec<VecDeque<(u32, Dep)>> = vec![VecDeque::new(); simulated.len()];
        Lowering {
            plan,
            shared,
            labels,
            bucket_labels,
            simulated,
            position_of,
            previous_end,
            policies,
            loads,
            iteration: 0,
        }
    }

    /// Emits the next iteration into the builder.
    fn iteration(&mut self) -> Result<IterationOps, StrategyError> {
        let iteration = self.iteration;
        self.iteration += 1;
        let plan = self.plan;
        let shared = &mut self.shared;
        let simulated = &self.simulated;
        let position_of = &self.position_of;
        shared.keys.clear();
        // Each rank's ops are appended to the graph as soon as they are made, from one buffer
        // reused rank after rank (every rank's buffered at once doubled a large iteration's
        // peak, and left the allocator a buffer per rank to keep). A dependency on another
        // rank's op by key is resolved then if that rank came first; otherwise it is filled
        // in once every rank is appended. The graph is the same, op for op.
        let mut buffer =
            Buffer { ops: Vec::new(), dep_ends: Vec::new(), deps: Vec::new(), beside: Vec::new() };
        let mut span_buffers: Vec<Vec<(String, u32, u32)>> = Vec::with_capacity(simulated.len());
        let mut ends = Vec::with_capacity(simulated.len());
        let mut rank_loads: Vec<VecDeque<(u32, Dep)>> = Vec::with_capacity(simulated.len());
        let mut offsets: Vec<u32> = Vec::with_capacity(simulated.len());
        // (op, index of the dependency, key, position of the rank that waits).
        let mut unresolved: Vec<(OpId, usize, Key, usize)> = Vec::new();
        let mut resolved = Vec::new();
        for (position, &rank) in simulated.iter().enumerate() {
            buffer.ops.clear();
            buffer.dep_ends.clear();
            buffer.deps.clear();
            buffer.beside.clear();
            let mut emitter = RankEmitter {
                plan,
                labels: &self.labels,
                bucket_labels: &self.bucket_labels,
                shared: &mut *shared,
                rank,
                buffer,
                waiting: Vec::new(),
                last_compute: None,
                last_issued: Vec::new(),
                spans: Vec::new(),
                host_start: None,
                iteration,
                offload: OffloadState::new(self.previous_end[position]),
                loads: std::mem::take(&mut self.loads[position]),
                backward_part: crate::pipeline::Step::Backward,
                deferred_wgrads: Vec::new(),
                layer_part: moe_overlap::LayerPart::Whole,
            };
            let (end, pipeline_end) =
                emitter.iteration(self.policies[position].as_mut(), self.previous_end[position])?;
            rank_loads.push(std::mem::take(&mut emitter.loads));
            span_buffers.push(std::mem::take(&mut emitter.spans));
            ends.push((end, pipeline_end));
            buffer = emitter.buffer;
            let offset = shared.graph.op_count() as u32;
            offsets.push(offset);
            if position == 0 {
                // Ranks emit about as many ops as each other: room for every rank's.
                let ranks = simulated.len();
                shared.graph.reserve(buffer.ops.len() * ranks, buffer.deps.len() * ranks);
            }
            let mut start = 0usize;
            for (local, (op, &end)) in buffer.ops.iter().zip(&buffer.dep_ends).enumerate() {
                resolved.clear();
                for (index, dep) in buffer.deps[start..end as usize].iter().enumerate() {
                    resolved.push(match *dep {
                        Dep::Local(index) => OpId(offset + index),
                        Dep::Global(id) => id,
                        Dep::Key(key) => match shared.keys.get(&key) {
                            Some(&(owner, index)) if position_of[owner as usize] as usize <= position => {
                                OpId(offsets[position_of[owner as usize] as usize] + index)
                            }
                            _ => {
                                unresolved.push((OpId(offset + local as u32), index, key, position));
                                OpId(u32::MAX)
                            }
                        },
                    });
                }
                start = end as usize;
                shared.graph.add_op(*op, &resolved);
            }
            for &(index, beside) in &buffer.beside {
                shared.graph.slow_beside_communication(OpId(offset + index), beside);
            }
        }
        for (op, index, key, rank) in unresolved {
            let (owner, at) = shared.keys.get(&key).copied().ok_or_else(|| {
                StrategyError::Internal(format!("rank {rank} waits for {key:?}, which no rank sends"))
            })?;
            shared.graph.set_dep(op, index, OpId(offsets[position_of[owner as usize] as usize] + at));
        }
        for (position, mut in_flight) in rank_loads.into_iter().enumerate() {
            for (_, dep) in in_flight.iter_mut() {
                if let Dep::Local(index) = *dep {
                    *dep = Dep::Global(OpId(offsets[position] + index));
                }
            }
            self.loads[position] = in_flight;
        }
        let mut spans = Vec::new();
        for (position, rank_spans) in span_buffers.into_iter().enumerate() {
            for (name, first, last) in rank_spans {
                spans.push(crate::ScheduleSpan {
                    rank: RankId(simulated[position]),
                    name,
                    first: OpId(offsets[position] + first),
                    last: OpId(offsets[position] + last),
                });
            }
        }
        let iteration_end: Vec<OpId> =
            ends.iter().enumerate().map(|(rank, (end, _))| OpId(offsets[rank] + end)).collect();
        let pipeline_end = ends.iter().enumerate().map(|(rank, (_, p))| OpId(offsets[rank] + p)).collect();
        for (rank, end) in iteration_end.iter().enumerate() {
            self.previous_end[rank] = Some(*end);
        }
        for (policy, &offset) in self.policies.iter_mut().zip(&offsets) {
            policy.appended(offset);
        }
        Ok(IterationOps { ends: iteration_end, pipeline_ends: pipeline_end, spans })
    }

    /// Emits the next iteration into `graph` (the builder a streamed run holds).
    pub(crate) fn iteration_into(&mut self, graph: &mut GraphBuilder) -> Result<IterationOps, StrategyError> {
        std::mem::swap(&mut self.shared.graph, graph);
        let result = self.iteration();
        std::mem::swap(&mut self.shared.graph, graph);
        result
    }
}

/// The memory of every stage and a lower bound of the iteration time, from the kernel-time
/// table and the schedule alone: no graph is built.
///
/// The bound: a rank's compute kernels run one after another on its compute stream, so a
/// stage takes at least the sum of its kernels over every micro-batch (recomputation
/// included) plus its optimizer step; and stage `s` cannot start before micro-batch 0 has
/// gone forward through chunks `0..s`, nor finish before its last backward has gone back
/// through them (the fill and drain of the pipeline). The layer collectives a kernel waits for
/// (tensor-parallel allreduces, expert all-to-alls) add `comm_floor` each, a time no network
/// can beat; gradient synchronisation, pipeline sends and the host are left out, so a
/// simulation never comes out faster (`tests.rs` checks it).
pub(super) fn estimate(
    strategy: &Strategy<'_>,
    comm_floor: &dyn Fn(&Comm) -> SimDuration,
) -> Result<crate::Estimate, StrategyError> {
    estimate_plan(&Plan::new(strategy)?, comm_floor)
}

/// [`estimate`], or `Ok(None)` without the time bound or the pipeline schedule when `fits`
/// refuses a floor of the most memory a stage needs ([`Plan::peak_memory_floor`]): the
/// estimate's own [`crate::Estimate::peak_memory`] would be refused too, as it is at least
/// that floor.
pub(super) fn estimate_fitting(
    strategy: &Strategy<'_>,
    comm_floor: &dyn Fn(&Comm) -> SimDuration,
    fits: &dyn Fn(Bytes) -> bool,
) -> Result<Option<crate::Estimate>, StrategyError> {
    let plan = Plan::new(strategy)?;
    if plan.peak_memory_floor().is_some_and(|floor| !fits(floor)) {
        return Ok(None);
    }
    estimate_plan(&plan, comm_floor).map(Some)
}

/// [`estimate`] of ranks that may run on any of `strategies`' devices (a cluster of mixed
/// devices; every strategy with the same split, [`Strategy::chunk_layers`]): the memory is
/// the first strategy's, and the bound prices each kernel, gradient accumulation and optimizer
/// step at the fastest of the strategies' times for it, so it stays below a simulation
/// whichever device each rank runs on.
pub(super) fn estimate_fastest(
    strategies: &[&Strategy<'_>],
    comm_floor: &dyn Fn(&Comm) -> SimDuration,
) -> Result<crate::Estimate, StrategyError> {
    let Some((first, others)) = strategies.split_first() else {
        return Err(StrategyError::Invalid {
            key: "cluster.node-groups",
            message: "no device to estimate on".into(),
        });
    };
    let mut plan = Plan::new(first)?;
    let fastest = |a: Kernel, b: Kernel| match (a, b) {
        (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
        (a, b) => a.or(b).map(|(_, flops)| (SimDuration::ZERO, flops)),
    };
    for other in others {
        let other = Plan::new(other)?;
        if other.chunk_layers != plan.chunk_layers || other.kernels.len() != plan.kernels.len() {
            return Err(StrategyError::Invalid {
                key: "cluster.node-groups",
                message: "the device types' strategies split the model differently; give them one split"
                    .into(),
            });
        }
        let kernels: Vec<[Kernel; 3]> = plan
            .kernels
            .iter()
            .zip(other.kernels.iter())
            .map(|(a, b)| [fastest(a[0], b[0]), fastest(a[1], b[1]), fastest(a[2], b[2])])
            .collect();
        plan.kernels = std::sync::Arc::new(kernels);
        for (mine, theirs) in plan.accumulate.iter_mut().zip(&other.accumulate) {
            *mine = match (*mine, *theirs) {
                (Some(a), Some(b)) => Some(a.min(b)),
                _ => None,
            };
        }
        for (mine, theirs) in plan.optimizer.iter_mut().zip(&other.optimizer) {
            mine.0 = mine.0.min(theirs.0);
        }
    }
    estimate_plan(&plan, comm_floor)
}

/// [`estimate`] of a built plan.
fn estimate_plan(
    plan: &Plan<'_>,
    comm_floor: &dyn Fn(&Comm) -> SimDuration,
) -> Result<crate::Estimate, StrategyError> {
    let strategy = plan.strategy;
    let stages = plan.stages()?;
    let p = strategy.parallelism.pipeline;
    let kernel_ps = |kernel: &Kernel| kernel.map_or(0u128, |(duration, _)| u128::from(duration.as_ps()));
    let comms_ps = |comms: &[Comm]| comms.iter().map(|c| u128::from(comm_floor(c).as_ps())).sum::<u128>();
    // A layer's forward: the collectives before it, its kernel, the collectives after it;
    // the next kernel waits for each.
    let forward_ps = |i: usize| {
        let local = &plan.local[i];
        comms_ps(&local.before_forward) + kernel_ps(&plan.kernels[i][0]) + comms_ps(&local.after_forward)
    };
    // Backward: recomputation, the collectives before it, backward-data, then backward-weight
    // and the input gradient's collectives side by side.
    let backward_ps = |i: usize| {
        let local = &plan.local[i];
        let again = plan.recompute_before[i].as_ref().map_or(0, |r| r.clone().map(forward_ps).sum::<u128>());
        again
            + comms_ps(&local.before_backward)
            + kernel_ps(&plan.kernels[i][1])
            + kernel_ps(&plan.kernels[i][2]).max(if plan.kernels[i][1].is_some() {
                comms_ps(&local.after_backward_data)
            } else {
                0
            })
    };
    // Forward and backward of one micro-batch of each global chunk (no backward, no
    // accumulation and no optimizer step when only the forward runs: `workload.passes`).
    let trains = strategy.passes.trains();
    let chunk_times: Vec<(u128, u128)> = plan
        .chunk_layers
        .iter()
        .map(|range| {
            let backward = if trains { range.clone().map(backward_ps).sum::<u128>() } else { 0 };
            (range.clone().map(forward_ps).sum::<u128>(), backward)
        })
        .collect();
    // Each chunk's micro-batches (half of them under DualPipe's two copies).
    let micro_batches = u128::from(plan.path_micro_batches);
    let schedule = strategy.parallelism.schedule;
    let mut bound = 0u128;
    let mut fill_and_drain = 0u128;
    for stage in 0..p {
        // Every micro-batch but the first adds its weight gradients in place, if priced.
        let accumulate: u128 = plan
            .chunks_of(stage)
            .flat_map(|k| plan.chunk_layers[k].clone())
            .map(|i| plan.accumulate[i].map_or(0, |d| u128::from(d.as_ps())))
            .sum::<u128>()
            * u128::from(trains);
        let work: u128 = plan.chunks_of(stage).map(|k| chunk_times[k].0 + chunk_times[k].1).sum::<u128>()
            * micro_batches
            + accumulate * micro_batches.saturating_sub(1)
            + u128::from(plan.optimizer[stage as usize].0.as_ps()) * u128::from(trains);
        bound = bound.max(work + fill_and_drain);
        // A stage starts after the forwards of the chunks before its first; DualPipe's ranks
        // start from both ends, and after ZB-V's last op on a stage the drain may be W alone.
        if let Some((forward, backward)) = chunk_times.get(stage as usize) {
            fill_and_drain += match schedule {
                crate::PipelineSchedule::DualPipe => 0,
                // ZB-2p's W passes may fill a stage's drain too.
                crate::PipelineSchedule::ZbV | crate::PipelineSchedule::Zb2p => *forward,
                _ => forward + backward,
            };
        }
    }
    // A context-parallel ring splits a kernel into `context` steps, each rounded down to the
    // picosecond.
    let rounding = u128::from(strategy.parallelism.context) * plan.local.len() as u128 * micro_batches * 3;
    let bound = bound.saturating_sub(rounding);
    Ok(crate::Estimate {
        stages,
        micro_batches: plan.micro_batches,
        time_lower_bound: SimDuration::from_ps(u64::try_from(bound).unwrap_or(u64::MAX)),
        flops_per_rank_iteration: plan.mean_flops_per_rank().0,
    })
}

#[cfg(test)]
mod image_tests {
    use super::*;
    use crate::{RankLayout, RankOrder};

    /// Counting in the mixed radix gives `rotate_digits` of every value, a radix of 0 or 1
    /// and values past the radices' product included.
    #[test]
    fn rotated_digits_match_rotate_digits() {
        let mut out = Vec::new();
        for radices in [vec![], vec![1], vec![0, 3], vec![12], vec![2, 3, 2], vec![4, 1, 5]] {
            for shift in 0..50 {
                rotated_digits(70, shift, &radices, &mut out);
                let expected: Vec<u32> =
                    (0..70).map(|value| crate::layout::rotate_digits(value, shift, &radices)).collect();
                assert_eq!(out, expected, "{radices:?} shift {shift}");
            }
        }
    }

    /// The tabulated images are [`Folding::image`]'s, rank for rank, whatever the rank order,
    /// the data radix and the spatial split.
    #[test]
    fn tabulated_images_match_the_coordinates() {
        for order in ["tp-cp-dp-pp", "dp-tp-cp-pp", "pp-dp-cp-tp", "cp-pp-tp-dp"] {
            let order: RankOrder = order.parse().expect("a rank order");
            let layout = RankLayout::new(4, 2, 12, 3, 1, order);
            for (spatial, tensor, radices) in
                [(false, 4, vec![12]), (false, 4, vec![2, 3, 2]), (true, 1, vec![3, 4]), (false, 4, vec![])]
            {
                let folding = Folding { fold: true, foldable: true, spatial, tensor, data_radices: radices };
                let mut images = Images::new(&folding, &layout);
                let mut image = Vec::new();
                for shift in 1..tensor * 12 {
                    images.fill(shift, &mut image);
                    let expected: Vec<RankId> = (0..layout.ranks())
                        .map(|rank| folding.image(&layout, layout.coordinates(RankId(rank)), shift))
                        .collect();
                    assert_eq!(image, expected, "{order} spatial {spatial} shift {shift}");
                }
            }
        }
    }
}
