//! The plan: everything every rank of a lowering shares, computed once from the strategy
//! (local layers and kernel times, the pipeline partition and schedule, recomputation, the
//! gradient buckets, the optimizer step, the policy's own plan, offload and input plans), and
//! what needs no graph: each stage's memory and FLOPs.
//!
//! Invariant: the plan is a pure function of the strategy; [`Plan::stages`] and the FLOPs
//! are what the report shows for both the lowering and the estimate.

use std::ops::Range;
use std::sync::Arc;

use sim_core::graph::{GraphBuilder, LabelId};
use sim_core::units::{Bytes, SimDuration};

use super::Kernel;
use super::input::InputPlan;
use super::offload::OffloadPlan;
use super::policy::{self, Policy, buckets::PlannedBucket};
use super::tables::{LayerTable, LayerTables, OrdersKey};
use crate::{CnnSplit, RankLayout, Role, StageSummary, Strategy, StrategyError, cnn, pipeline, shard};
use workloads::layer::Pass;
use workloads::memory::MemoryBreakdown;
use workloads::model::Model;

/// What every rank shares: computed once.
pub(super) struct Plan<'s> {
    pub(super) strategy: &'s Strategy<'s>,
    pub(super) layout: RankLayout,
    pub(super) micro_batches: u32,
    /// Micro-batches through each chunk: all of them, or half under DualPipe (two model copies,
    /// one each way).
    pub(super) path_micro_batches: u32,
    /// Where each global chunk sits and what runs before and after it ([`pipeline::ChunkMap`]).
    pub(super) chunk_map: pipeline::ChunkMap,
    pub(super) local: Arc<Vec<shard::LocalLayer>>,
    /// Forward, backward-data, backward-weight per layer.
    pub(super) kernels: Arc<Vec<[Kernel; 3]>>,
    /// The same kernels' times fully beside communication, when the compute model slows them
    /// there; empty when it does not.
    pub(super) beside: Arc<Vec<[Option<SimDuration>; 3]>>,
    /// Layer range of each global chunk (under DualPipe, the second copy's chunks repeat the
    /// first's).
    pub(super) chunk_layers: Vec<Range<usize>>,
    /// Recomputation: the forward range re-run before the backward of its last layer.
    pub(super) recompute_before: Vec<Option<Range<usize>>>,
    /// Schedule of each stage, made on first use ([`Plan::actions`]): a memory floor that
    /// refuses the configuration needs none (ZB-V's takes most of its plan's time).
    actions: std::cell::OnceCell<Arc<Vec<Vec<pipeline::Action>>>>,
    /// The layer table the plan's layers and kernels come from (it keeps the schedules made).
    table: Arc<LayerTable>,
    /// Gradient buckets of each chunk, and which bucket each layer closes.
    pub(super) buckets: Vec<Vec<PlannedBucket>>,
    pub(super) bucket_closed_by: Vec<Option<usize>>,
    /// Optimizer step of each stage.
    pub(super) optimizer: Vec<(SimDuration, f64)>,
    /// Bytes of device memory each stage's optimizer step moves (its fp8 weight casts too).
    pub(super) optimizer_bytes: Vec<f64>,
    /// Muon distributed round-robin ([`workloads::muon::Distribution::RoundRobin`]): per stage,
    /// the bytes of the all-reduce of the orthogonalised updates after the step and the time
    /// to apply them; `None` for every other step.
    pub(super) muon_exchange: Vec<crate::MuonExchange>,
    /// Each layer's in-place gradient add on every micro-batch but the first, if priced
    /// ([`Strategy::accumulation`]).
    pub(super) accumulate: Vec<Option<SimDuration>>,
    /// Bytes sent between consecutive chunks (activation or gradient of one micro-batch).
    pub(super) boundary_bytes: Vec<Bytes>,
    /// Host time to launch one kernel (zero under CUDA graphs).
    pub(super) host_cost: SimDuration,
    /// Host launches of each layer's forward, backward-data and backward-weight pass: the
    /// module's (1 but for an expert bank: [`crate::experts::MoeExperts::launches`]) and the
    /// further kernels', each at `op_cost` ([`workloads::compute::launched_kernels`]). 16-bit
    /// counts (saturating): the plan of a model of a million layers is built before the work
    /// budget can refuse it. Computed on first use ([`Plan::launches`]): only a lowering reads
    /// them, and counting them was most of an estimate's time.
    launches: std::cell::OnceCell<Vec<[(u16, u16); 3]>>,
    /// The host's cost of each further kernel (`op-dispatch-overhead`; zero under CUDA graphs).
    pub(super) op_cost: SimDuration,
    /// The training loop's host time per iteration after the step's synchronisation
    /// (`compute.step-overhead`; zero for none).
    pub(super) step_overhead: SimDuration,
    /// The host waits for the GPU work it issued last before it launches more
    /// (`compute.host-synchronous`).
    pub(super) host_synchronous: bool,
    /// The host waits for the device at each pipeline exchange
    /// (`parallelism.pipeline-host-sync` where it applies; never without modelled launches).
    pub(super) pipeline_host_sync: bool,
    /// The host reads each micro-batch's loss after its forward and each gradient bucket's
    /// norm before its data-parallel reduction, waiting for each (`compute.host-nan-checks`;
    /// never without modelled launches, where a wait delays nothing).
    pub(super) host_nan_checks: bool,
    /// Per chunk boundary, the tensor degree its pipeline sends are split over and their
    /// receivers all-gather over (`parallelism.pipeline-scatter-gather` where it applies: a
    /// pipeline, tensor parallelism, no sequence parallelism, and, as in Megatron-LM, a
    /// boundary tensor whose elements divide evenly); 1 where it does not.
    pub(super) pipeline_scatter: Vec<u32>,
    /// The data loader's work per iteration, if modelled.
    pub(super) input: Option<InputPlan>,
    /// Bytes a first-stage rank copies to its device on the compute stream at the start of
    /// each iteration, if modelled ([`workloads::input::InputCopy`]).
    pub(super) input_copy: Option<Bytes>,
    /// The gradient-synchronisation and sharding policy ([`policy`]): DDP, ZeRO-1/2, FSDP,
    /// DeepSpeed's ZeRO-3 or DASO, with what it planned (FSDP's units, DeepSpeed's traces).
    pub(super) policy: Box<dyn Policy>,
    /// Parameters of the embedding copy the last stage keeps for a tied output layer (0
    /// without a pipeline or tying).
    pub(super) tied_embedding: u64,
    /// Parameters one GPU of each stage holds (after tensor and expert splitting, before
    /// ZeRO), the last stage's embedding copy included.
    pub(super) stage_parameters: Vec<u64>,
    /// Frozen parameters (LoRA's base model) one GPU of each stage holds: weights in memory,
    /// nothing else.
    pub(super) stage_frozen: Vec<u64>,
    /// Under filter, channel or spatial parallelism, the model as one rank runs it (its local
    /// layers), for the memory model.
    pub(super) local_model: Option<Model>,
    /// Under spatial parallelism, the rank grid of a group.
    pub(super) spatial_grid: Vec<u32>,
    /// Out-of-core training: what each layer copies out and back, and when.
    pub(super) offload: Option<OffloadPlan>,
    /// Each stage's activations and buffers ([`Plan::stage_activations`]), computed once for
    /// both the memory floor and [`Plan::stages`].
    stage_activations: std::cell::OnceCell<Vec<StageActivations>>,
    /// Out-of-core training: the memory the device would need without it (set by `stages`).
    pub(super) without_offload: std::cell::Cell<Option<MemoryBreakdown>>,
}

impl<'s> Plan<'s> {
    /// The plan of `strategy` (checked already).
    pub(super) fn new(strategy: &'s Strategy<'s>) -> Result<Plan<'s>, StrategyError> {
        let p = &strategy.parallelism;
        let model = strategy.model;
        let micro_batches = strategy.micro_batches()?;
        let table = LayerTables::layers_and_kernels(strategy)?;
        let (local, kernels) = (Arc::clone(&table.local), Arc::clone(&table.kernels));
        let beside = Arc::clone(&table.beside);
        let units = model.pipeline_units().len();
        let uneven = if p.pad_layers {
            pipeline::padded_sizes(units, p.pipeline as usize, p.virtual_stages as usize).ok()
        } else if p.account_for_embedding || p.account_for_loss {
            pipeline::accounted_sizes(
                units,
                p.pipeline as usize,
                p.virtual_stages as usize,
                p.account_for_embedding,
                p.account_for_loss,
            )
            .ok()
        } else {
            pipeline::uneven_sizes(units, p.pipeline as usize, p.first_stage_layers, p.last_stage_layers)
                .ok()
                .flatten()
        };
        let chunk_map = pipeline::ChunkMap::new(p.schedule, p.pipeline, p.virtual_stages);
        let chunk_layers = match (strategy.chunk_layers, uneven) {
            // Set by the caller (a cluster of mixed devices: every device's lowering the same).
            (Some(ranges), _) if ranges.len() == p.chunks() as usize => ranges.to_vec(),
            (_, uneven) => match uneven {
                // `--decoder-first/last-pipeline-num-layers`: the counts set, the rest even; the
                // zero-bubble repository's padding, or Megatron-Core's embedding and loss
                // counted in the split, whose end chunks may hold no block.
                Some(sizes) => pipeline::chunk_ranges(model, &sizes),
                None => {
                    let groups = table.partition(model, chunk_map.partitions() as usize);
                    (0..chunk_map.chunks())
                        .map(|chunk| groups[chunk_map.partition_of(chunk) as usize].clone())
                        .collect()
                }
            },
        };

        let mut recompute_before: Vec<Option<Range<usize>>> = vec![None; local.len()];
        for range in strategy.memory_plan(model, Bytes::ZERO).recomputed_ranges() {
            if let Some(last) = range.end.checked_sub(1) {
                recompute_before[last] = Some(range);
            }
        }
        let policy = policy::select(strategy, &local, &chunk_layers, &recompute_before);
        let buckets = policy::buckets::plan(strategy, &local, &chunk_layers);
        let bucket_closed_by = policy::buckets::closed_by(strategy, policy.as_ref(), local.len(), &buckets);
        // An output layer tied to the input embedding on another stage: Megatron-LM keeps a
        // copy of the embedding on the last stage and all-reduces the two copies' gradients.
        let tied =
            local.iter().any(|l| matches!(l.layer.kind, workloads::layer::LayerKind::TiedLinear { .. }));
        let tied_embedding = if tied && !chunk_map.ends_share_a_stage() {
            local.iter().find(|l| l.role == Role::VocabularyEmbedding).map_or(0, |l| l.layer.cost.params)
        } else {
            0
        };
        // ZeRO-2 and -3 reduce each micro-batch's gradients into their shards instead.
        let accumulate = if p.zero >= 2 {
            vec![None; local.len()]
        } else {
            local.iter().map(|layer| strategy.accumulation(layer)).collect::<Result<Vec<_>, _>>()?
        };
        let mut optimizer = Vec::with_capacity(p.pipeline as usize);
        let mut optimizer_bytes = Vec::with_capacity(p.pipeline as usize);
        let mut stage_parameters = Vec::with_capacity(p.pipeline as usize);
        let mut stage_frozen = Vec::with_capacity(p.pipeline as usize);
        let mut muon_exchange = Vec::with_capacity(p.pipeline as usize);
        for stage in 0..p.pipeline {
            let layers = || chunk_map.chunks_of(stage).flat_map(|k| chunk_layers[k].clone());
            stage_frozen.push(layers().map(|index| local[index].layer.frozen_weights()).sum::<u64>());
            let parameters = layers().map(|index| local[index].layer.cost.params).sum::<u64>()
                + if stage + 1 == p.pipeline { tied_embedding } else { 0 };
            let held = p.optimizer_held(parameters);
            // A for-loop optimizer visits every parameter tensor (a weight and its bias); the
            // other steps' per-tensor passes count the layers with parameters.
            let tensors = if strategy.optimizer_passes == workloads::optimizer::OptimizerPasses::ForLoop {
                layers().map(|index| local[index].layer.parameter_tensors()).sum::<u64>()
            } else {
                layers().filter(|&index| local[index].layer.cost.params > 0).count() as u64
            };
            let (step, step_flops) = if strategy.optimizer == workloads::Optimizer::Muon {
                let (step, exchange) = strategy.muon_step(layers().map(|index| &local[index]), held)?;
                muon_exchange.push(exchange);
                step
            } else {
                muon_exchange.push(None);
                strategy.optimizer_step(held, tensors)?
            };
            // In fp8, the first micro-batch's forward casts the updated weights to fp8 (kept
            // for the others): once per iteration, on the same stream, priced with the step.
            let casts = strategy.fp8_weight_casts(layers().map(|index| &local[index]))?;
            let step = step.checked_add(casts).map_err(|error| StrategyError::Compute {
                layer: "optimizer".into(),
                source: workloads::compute::ComputeError::Overflow(error),
            })?;
            optimizer.push((step, step_flops));
            optimizer_bytes.push(strategy.optimizer_step_bytes(
                held,
                tensors,
                layers().map(|index| &local[index]),
            ));
            stage_parameters.push(parameters);
        }
        let width = strategy.precision.storage().bytes();
        let host_cost = strategy.compute.host_cost_per_kernel();
        let op_cost = strategy.compute.host_cost_per_op();
        let scatter_applies =
            p.pipeline_scatter_gather && p.pipeline > 1 && p.tensor > 1 && !p.sequence_parallel;
        let (boundary_bytes, pipeline_scatter): (Vec<Bytes>, Vec<u32>) = chunk_layers
            .iter()
            .map(|range| {
                let elements =
                    local[range.end.saturating_sub(1)].layer.output.elements() * strategy.micro_batch;
                let scatter =
                    if scatter_applies && elements % u64::from(p.tensor) == 0 { p.tensor } else { 1 };
                (Bytes(elements * width), scatter)
            })
            .unzip();
        let local_model = (p.cnn() != CnnSplit::None).then(|| {
            Model::from_layers(
                model.name.clone(),
                model.family.clone(),
                local.first().map_or_else(|| model.input.clone(), |l| l.layer.input.clone()),
                local.iter().map(|l| l.layer.clone()).collect(),
            )
        });
        let spatial_grid = match p.cnn() {
            CnnSplit::Spatial { degree, dims, .. } => cnn::spatial_grid(degree, dims),
            _ => Vec::new(),
        };
        let offload =
            OffloadPlan::for_strategy(strategy, &local, &chunk_layers, &buckets, &stage_parameters)?;
        Ok(Plan {
            without_offload: std::cell::Cell::new(None),
            stage_activations: std::cell::OnceCell::new(),
            offload,
            local_model,
            spatial_grid,
            strategy,
            host_cost,
            op_cost,
            launches: std::cell::OnceCell::new(),
            step_overhead: strategy.compute.step_overhead,
            host_synchronous: strategy.compute.host_synchronous,
            pipeline_host_sync: p.pipeline_host_sync.applies(p.pipeline, p.virtual_stages)
                && host_cost > SimDuration::ZERO,
            host_nan_checks: strategy.compute.host_nan_checks && host_cost > SimDuration::ZERO,
            pipeline_scatter,
            input: InputPlan::new(strategy)?,
            input_copy: strategy.input_copy_bytes(),
            policy,
            tied_embedding,
            stage_parameters,
            stage_frozen,
            layout: p.layout(),
            micro_batches,
            path_micro_batches: chunk_map.path_micro_batches(micro_batches),
            chunk_map,
            local,
            kernels,
            beside,
            chunk_layers,
            recompute_before,
            actions: std::cell::OnceCell::new(),
            table,
            buckets,
            bucket_closed_by,
            optimizer,
            optimizer_bytes,
            muon_exchange,
            accumulate,
            boundary_bytes,
        })
    }

    /// The gradient bytes of the tied embedding's copy that stage `stage` holds outside its
    /// buckets: the last stage's, where the pipeline's ends do not share a stage (else
    /// `tied_embedding` is 0).
    pub(super) fn tied_copy_gradient(&self, stage: u32) -> Option<Bytes> {
        (self.tied_embedding > 0 && stage + 1 == self.strategy.parallelism.pipeline)
            .then(|| self.gradient_bytes(self.tied_embedding))
    }

    /// Host launches of each layer's forward, backward-data and backward-weight pass
    /// (the field's), counted on first use.
    pub(super) fn launches(&self) -> &[[(u16, u16); 3]] {
        self.launches.get_or_init(|| {
            let strategy = self.strategy;
            let p = &strategy.parallelism;
            // Each pass's first kernel is a launch at the module's cost; every further kernel
            // it runs (an attention core's parts, a loss's, autocast's casts...) one at the
            // op's.
            let autocast = strategy.compute.autocast;
            let short = |count: u32| u16::try_from(count).unwrap_or(u16::MAX);
            self.local
                .iter()
                .map(|entry| {
                    let modules = p.moe_experts.launches(&entry.layer);
                    let mut launches = [(0, 0); 3];
                    for ((launch, modules), pass) in launches.iter_mut().zip(modules).zip(Pass::ALL) {
                        let kernels = workloads::compute::launched_kernels(
                            &entry.layer,
                            pass,
                            strategy.precision,
                            autocast,
                        );
                        *launch = (short(modules), short(kernels - 1));
                    }
                    launches
                })
                .collect()
        })
    }

    /// The schedule of each stage (its field's), made on first use.
    pub(super) fn actions(&self) -> &[Vec<pipeline::Action>] {
        self.actions.get_or_init(|| {
            let p = &self.strategy.parallelism;
            let kernels = &self.kernels;
            // ZB-V's and ZB-2p's orders follow each chunk's forward, input- and weight-gradient
            // times (B with the forwards recomputed before it).
            let times: Vec<[u64; 3]> =
                if matches!(p.schedule, pipeline::PipelineSchedule::ZbV | pipeline::PipelineSchedule::Zb2p) {
                    let ps = |kernel: &Kernel| kernel.map_or(0, |(d, _)| d.as_ps());
                    self.chunk_layers
                        .iter()
                        .map(|range| {
                            let mut sums = [0u64; 3];
                            for index in range.clone() {
                                for (sum, kernel) in sums.iter_mut().zip(&kernels[index]) {
                                    *sum = sum.saturating_add(ps(kernel));
                                }
                                for again in self.recompute_before[index].clone().into_iter().flatten() {
                                    sums[1] = sums[1].saturating_add(ps(&kernels[again][0]));
                                }
                            }
                            sums
                        })
                        .collect()
                } else {
                    Vec::new()
                };
            // Under the EP A2A overlap, Megatron-Core's combined 1F1B: each steady-state
            // forward merged with the backward after it (checked: 1F1B, interleaved with a
            // pipeline).
            self.table.orders(OrdersKey {
                schedule: p.schedule,
                stages: p.pipeline,
                chunks: p.virtual_stages,
                group: p.microbatch_group.unwrap_or(p.pipeline),
                micro_batches: self.micro_batches,
                times,
                paired: p.moe_overlap,
            })
        })
    }

    /// Adds the frozen weights `stage` holds (LoRA's base model) to `memory`'s weights, in
    /// `plan`'s storage: they take memory, no gradient or optimizer state.
    fn add_frozen_weights(
        &self,
        stage: u32,
        plan: &workloads::memory::MemoryPlan<'_>,
        memory: &mut MemoryBreakdown,
    ) {
        let frozen = self.stage_frozen[stage as usize];
        if frozen > 0 {
            memory.weights =
                Bytes(memory.weights.0.saturating_add(plan.device_breakdown(frozen, 0, 0, 0).weights.0));
        }
    }

    /// The global chunks stage `stage` holds.
    pub(super) fn chunks_of(&self, stage: u32) -> impl Iterator<Item = usize> + use<> {
        self.chunk_map.chunks_of(stage)
    }

    /// Bytes of `parameters` in the working-weight dtype (ZeRO gathers these).
    pub(super) fn weight_bytes(&self, parameters: u64) -> Bytes {
        Bytes(parameters * self.strategy.precision.bytes().max(2))
    }

    /// Bytes of `parameters`' gradients (ZeRO scatters these).
    pub(super) fn gradient_bytes(&self, parameters: u64) -> Bytes {
        Bytes(parameters * self.strategy.gradient_precision.bytes())
    }

    /// The layers stage `stage` holds, chunk after chunk.
    pub(super) fn stage_layers(&self, stage: u32) -> impl Iterator<Item = usize> + '_ {
        self.chunks_of(stage).flat_map(|k| self.chunk_layers[k].clone())
    }

    /// Layer ranges of `chunks` pipeline chunks: whole units ([`Model::pipeline_units`]:
    /// numbered blocks, or layers of a plain CNN), balanced by compute.
    pub(super) fn partition(model: &Model, kernels: &[[Kernel; 3]], chunks: usize) -> Vec<Range<usize>> {
        let layers = model.layers.len();
        if chunks <= 1 {
            return std::iter::once(0..layers).collect();
        }
        let units = model.pipeline_units();
        let cost = |range: &Range<usize>| -> f64 {
            range
                .clone()
                .map(|index| kernels[index].iter().flatten().map(|(d, _)| d.as_secs_f64()).sum::<f64>())
                .sum()
        };
        let costs: Vec<f64> = units.iter().map(cost).collect();
        pipeline::partition(&costs, chunks)
            .into_iter()
            .map(|group| units[group.start].start..units[group.end - 1].end)
            .collect()
    }

    /// The labels every rank uses, interned once (a policy's own are interned on first use).
    pub(super) fn labels(&self, graph: &mut GraphBuilder) -> Labels {
        let layers = &self.strategy.model.layers;
        graph.reserve_labels(4 * layers.len());
        let passes: Vec<[LabelId; 3]> = layers
            .iter()
            .map(|l| {
                ["forward", "backward-data", "backward-weight"]
                    .map(|pass| graph.label(&format!("{} {pass}", l.name)))
            })
            .collect();
        let optimizer = graph.label("optimizer step");
        // Which layers some range re-runs, marked by a running count of the ranges open at each
        // layer (one pass over the ranges and one over the layers: a scan of every range per
        // layer made lowering quadratic in depth).
        let mut open = vec![0i64; layers.len() + 1];
        for range in self.recompute_before.iter().flatten() {
            let (start, end) = (range.start.min(layers.len()), range.end.min(layers.len()));
            if start < end {
                open[start] += 1;
                open[end] -= 1;
            }
        }
        let mut depth = 0;
        let recompute = layers
            .iter()
            .enumerate()
            .map(|(index, l)| {
                depth += open[index];
                if depth > 0 { graph.label(&format!("{} recompute", l.name)) } else { passes[index][0] }
            })
            .collect();
        Labels {
            passes,
            recompute,
            optimizer,
            send_forward: graph.label("pipeline send activations"),
            send_backward: graph.label("pipeline send gradients"),
            ring: graph.label("cp ring send key/value"),
            dispatch: graph.label("host: launch kernel"),
        }
    }

    /// FLOPs of one rank of `stage` per iteration (kernels of every micro-batch and the
    /// optimizer), and FLOPs of its recomputation.
    pub(super) fn stage_flops(&self, stage: u32) -> (f64, f64) {
        let mut flops = 0.0;
        let mut recompute = 0.0;
        // Forward alone (`workload.passes`): the forward kernels, nothing recomputed, no step.
        let trains = self.strategy.passes.trains();
        let passes = if trains { 3 } else { 1 };
        for index in self.stage_layers(stage) {
            flops += self.kernels[index][..passes].iter().filter_map(|k| k.map(|(_, f)| f)).sum::<f64>();
            if let Some(again) = self.recompute_before[index].as_ref().filter(|_| trains) {
                recompute += again.clone().filter_map(|i| self.kernels[i][0].map(|(_, f)| f)).sum::<f64>();
            }
        }
        let m = f64::from(self.path_micro_batches);
        let step = if trains { self.optimizer[stage as usize].1 } else { 0.0 };
        flops = flops * m + step;
        (flops, recompute * m)
    }

    /// Means over stages (every stage has as many ranks) of [`Plan::stage_flops`].
    pub(super) fn mean_flops_per_rank(&self) -> (f64, f64) {
        let p = self.strategy.parallelism.pipeline;
        let (flops, recompute) = (0..p)
            .map(|stage| self.stage_flops(stage))
            .fold((0.0, 0.0), |(f, r), (stage_f, stage_r)| (f + stage_f, r + stage_r));
        (flops / f64::from(p), recompute / f64::from(p))
    }

    /// What the memory of stage `stage` needs besides its schedule: its chunks, their layer
    /// ranges, the policy's communication buffers, the activations one micro-batch leaves in
    /// each chunk (by position among the stage's chunks, as [`pipeline::peak_in_flight`]
    /// weighs them) and the largest working set.
    fn stage_activations(&self, stage: u32) -> &StageActivations {
        let all = self.stage_activations.get_or_init(|| {
            (0..self.strategy.parallelism.pipeline)
                .map(|stage| self.compute_stage_activations(stage))
                .collect()
        });
        &all[stage as usize]
    }

    /// [`Plan::stage_activations`], computed.
    fn compute_stage_activations(&self, stage: u32) -> StageActivations {
        let strategy = self.strategy;
        let p = &strategy.parallelism;
        // Under the CNN strategies the memory model sees the layers as one rank holds them.
        let model = self.local_model.as_ref().unwrap_or(strategy.model);
        let chunk_indexes: Vec<usize> = self.chunks_of(stage).collect();
        let ranges: Vec<Range<usize>> = chunk_indexes.iter().map(|&k| self.chunk_layers[k].clone()).collect();
        let buffers = self.policy.communication_buffers(self, &chunk_indexes);
        // Activations of one micro-batch of each chunk.
        let mut per_chunk = Vec::with_capacity(ranges.len());
        let mut working_set = 0u64;
        for range in &ranges {
            let activations = if ranges.len() == 1 && range.start == 0 && range.end == model.layers.len() {
                strategy.memory_plan(model, buffers).activations()
            } else {
                strategy.memory_plan(model, buffers).activations_of(range.clone())
            };
            let context = u64::from(p.context);
            working_set = working_set.max(activations.working_set / context);
            per_chunk.push((activations.total() - activations.working_set) / context);
        }
        StageActivations { chunk_indexes, ranges, buffers, per_chunk, working_set }
    }

    /// The largest input-plus-output pair of stage `stage`'s layers (elements), for the
    /// memory model's temporary buffers.
    fn largest_pair(&self, stage: u32) -> u64 {
        self.stage_layers(stage)
            .map(|i| {
                let layer = &self.local[i].layer;
                layer.input.elements().saturating_add(layer.output.elements())
            })
            .max()
            .unwrap_or(0)
    }

    /// A floor of the most device memory a stage needs ([`Plan::stages`]' largest total),
    /// without the pipeline schedule; `None` under out-of-core training (none is given).
    ///
    /// Why it is a floor: a stage's total is [`MemoryPlan::device_breakdown`] of its
    /// parameters, the activations its schedule keeps at the peak, its largest layer pair and
    /// gathered parameters, then the policy's [`Policy::adjust_memory`]. Only the activations
    /// depend on the schedule, and the breakdown counts them as given, the policy adds what
    /// does not depend on them, and every part is summed into the total. The peak
    /// ([`pipeline::peak_in_flight`] plus the working set) is at least the largest chunk's
    /// one micro-batch of activations plus the working set: every schedule runs a forward of
    /// each of a stage's chunks, and at its first the live activations are at least that
    /// chunk's. So the floor's total is at most the stage's, stage by stage.
    ///
    /// [`MemoryPlan::device_breakdown`]: workloads::memory::MemoryPlan::device_breakdown
    /// [`Policy::adjust_memory`]: super::policy::Policy::adjust_memory
    pub(super) fn peak_memory_floor(&self) -> Option<Bytes> {
        if self.offload.is_some() {
            return None;
        }
        let strategy = self.strategy;
        let model = self.local_model.as_ref().unwrap_or(strategy.model);
        let mut floor = Bytes::ZERO;
        for stage in 0..strategy.parallelism.pipeline {
            let StageActivations { chunk_indexes, buffers, per_chunk, working_set, .. } =
                self.stage_activations(stage);
            let (buffers, working_set) = (*buffers, *working_set);
            let peak = per_chunk.iter().copied().max().unwrap_or(0) + working_set;
            let parameters = self.stage_parameters[stage as usize];
            let largest_layer = self.policy.gathered_parameters(self, stage, chunk_indexes);
            let plan = strategy.memory_plan(model, buffers);
            let mut memory = plan.device_breakdown(parameters, peak, self.largest_pair(stage), largest_layer);
            self.add_frozen_weights(stage, &plan, &mut memory);
            self.policy.adjust_memory(self, stage, chunk_indexes, &mut memory);
            floor = floor.max(memory.total());
        }
        Some(floor)
    }

    /// Memory and layers of every stage.
    pub(super) fn stages(&self) -> Result<Vec<StageSummary>, StrategyError> {
        let strategy = self.strategy;
        let p = &strategy.parallelism;
        let model = strategy.model;
        let blocks = model.blocks();
        // Under the CNN strategies the memory model sees the layers as one rank holds them.
        let model = self.local_model.as_ref().unwrap_or(model);
        let mut stages = Vec::with_capacity(p.pipeline as usize);
        for stage in 0..p.pipeline {
            let StageActivations { chunk_indexes, ranges, buffers, per_chunk, working_set } =
                self.stage_activations(stage);
            let (ranges, buffers, working_set) = (ranges.clone(), *buffers, *working_set);
            let actions = &self.actions()[stage as usize];
            let peak = pipeline::peak_in_flight(actions, per_chunk) + working_set;
            // One micro-batch's activations on this stage: through every chunk it holds, or
            // under DualPipe through one (the mean of the two copies' chunks).
            let per_micro: u64 = per_chunk.iter().sum::<u64>()
                * u64::from(self.chunk_map.chunks_per_micro_batch())
                / per_chunk.len().max(1) as u64;
            let parameters = self.stage_parameters[stage as usize];
            let largest_pair = self.largest_pair(stage);
            let largest_layer = self.policy.gathered_parameters(self, stage, chunk_indexes);
            let plan = strategy.memory_plan(model, buffers);
            // Out-of-core: the device holds only the window of activations in transit.
            let held = match &self.offload {
                Some(offload) => {
                    // The worst stage's memory without offloading.
                    let mut without = plan.device_breakdown(parameters, peak, largest_pair, largest_layer);
                    self.policy.adjust_memory(self, stage, chunk_indexes, &mut without);
                    if self.without_offload.get().is_none_or(|worst| worst.total() < without.total()) {
                        self.without_offload.set(Some(without));
                    }
                    // On a pipeline a forward's copies may still drain while the next
                    // backward's prefetches arrive (each copy stream in order: one window
                    // each way).
                    let windows = if p.pipeline > 1 { 2 } else { 1 };
                    if p.offload.activations() { (windows * offload.window).min(peak) } else { peak }
                }
                None => peak,
            };
            let mut memory: MemoryBreakdown =
                plan.device_breakdown(parameters, held, largest_pair, largest_layer);
            self.add_frozen_weights(stage, &plan, &mut memory);
            self.policy.adjust_memory(self, stage, chunk_indexes, &mut memory);
            // A host optimizer keeps the fp32 weights and the states in host memory.
            if self.offload.as_ref().is_some_and(|offload| offload.host.is_some()) {
                memory.optimizer = Bytes::ZERO;
                // Under ZeRO-3 the gradient shard goes to host memory after every
                // reduce-scatter (the host accumulates it), and with ZeRO-Infinity's parameter
                // offload the weights' shard lives there too: the device keeps the gathered
                // units alone (the temporary buffers).
                if p.zero >= 3 {
                    memory.gradients = Bytes::ZERO;
                }
                if p.offload.parameters() {
                    // The last stage's copy of a tied embedding is in no unit: it stays.
                    let tied = if stage + 1 == p.pipeline { self.tied_embedding } else { 0 };
                    memory.weights =
                        Bytes(self.weight_bytes(tied).0.div_ceil(u64::from(p.optimizer_shard_ranks())));
                }
            }
            if let Some(weights) = self.offload.as_ref().and_then(|offload| offload.weights.as_ref()) {
                weights.adjust_memory(self, stage, chunk_indexes, &plan, &mut memory);
            }
            stages.push(StageSummary {
                stage,
                blocks: ranges
                    .iter()
                    .flat_map(|r| r.clone())
                    .filter_map(|i| blocks[i])
                    .collect::<std::collections::BTreeSet<_>>()
                    .len(),
                layers: ranges,
                parameters,
                flops: self.stage_flops(stage).0,
                memory,
                peak_micro_batches_in_flight: if per_micro == 0 {
                    0.0
                } else {
                    (peak - working_set) as f64 / per_micro as f64
                },
            });
        }
        Ok(stages)
    }
}

/// [`Plan::stage_activations`].
struct StageActivations {
    chunk_indexes: Vec<usize>,
    ranges: Vec<Range<usize>>,
    buffers: Bytes,
    per_chunk: Vec<u64>,
    working_set: u64,
}

/// Labels every rank uses, interned once.
pub(super) struct Labels {
    /// Forward, backward-data and backward-weight of each layer.
    pub(super) passes: Vec<[LabelId; 3]>,
    /// Each layer's recomputation (its forward label when it is never recomputed).
    pub(super) recompute: Vec<LabelId>,
    pub(super) optimizer: LabelId,
    pub(super) send_forward: LabelId,
    pub(super) send_backward: LabelId,
    pub(super) ring: LabelId,
    pub(super) dispatch: LabelId,
}
