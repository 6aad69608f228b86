//! Data-parallel lowering: a model, a device and a rank count become an execution graph, the
//! way PyTorch DistributedDataParallel (DDP) runs an iteration.
//!
//! Per rank and iteration:
//! - stream 0 (compute): every layer's forward, then in reverse order every layer's
//!   backward-data and backward-weight kernels (the first layer has no backward-data: nothing
//!   upstream needs its input gradient), then the optimizer step;
//! - stream 1 (communication): one allreduce per gradient bucket, launched as soon as the
//!   backward kernel that produces the bucket's last gradient is done, so communication overlaps
//!   the rest of the backward pass;
//! - the optimizer step waits for the last bucket's allreduce; the next iteration's forward
//!   waits for the optimizer (same stream).
//!
//! Buckets follow DDP's rule (`torch.nn.parallel.DistributedDataParallel`, `bucket_cap_mb=25`,
//! `_DEFAULT_FIRST_BUCKET_BYTES` = 1 MiB): parameters are taken in reverse model order (the
//! order their gradients become ready) and a bucket is closed as soon as it holds at least the
//! cap; the first bucket's cap is smaller so communication starts early. parasim buckets whole
//! layers (a layer's weight and bias go to the same bucket), which moves boundaries by at most
//! one layer.
//!
//! Activation recomputation ([`Recompute`]) re-runs forward kernels in the backward pass:
//! `selective` re-runs each standard attention core just before its backward, `full` re-runs a
//! whole numbered block (a transformer layer, a residual block) before the block's backward, as
//! [`MemoryPlan::recomputed_ranges`] lists them. Recomputed kernels take time but are not
//! counted in [`Lowered::flops_per_rank_iteration`] (model FLOPs, for MFU).
//!
//! [`DataParallel::memory`] is what one rank holds: the model state, the activations of its
//! batch and DDP's bucket buffers (DDP copies gradients into its buckets unless
//! `gradient_as_bucket_view=True`, so the buckets are a second copy of the gradients).
//!
//! Not modelled (yet): data loading, the loss kernel, slowdown of compute kernels while NCCL
//! kernels share the GPU, gradient scaling checks of mixed precision.

use sim_core::graph::{
    Collective, CollectiveAlgorithm, CollectiveKind, ExecGraph, GraphBuilder, GraphError, LabelId, Op, OpId,
    OpKind, RankId, StreamId,
};
use sim_core::units::{Bytes, SimDuration};

use crate::compute::{ComputeError, ComputeModel};
use crate::device::{Device, Dtype};
use crate::layer::{OpClass, Pass};
use crate::memory::{MemoryBreakdown, MemoryError, MemoryPlan, Recompute, Sharding};
use crate::model::Model;
use crate::optimizer::Optimizer;

/// The stream compute kernels run on.
pub const COMPUTE_STREAM: StreamId = StreamId(0);
/// The stream gradient allreduces run on.
pub const COMMUNICATION_STREAM: StreamId = StreamId(1);

/// Everything the data-parallel lowering needs.
#[derive(Debug, Clone)]
pub struct DataParallel<'a> {
    /// What is trained.
    pub model: &'a Model,
    /// On what.
    pub device: &'a Device,
    /// How kernel times are estimated.
    pub compute: &'a ComputeModel,
    /// Dtype of activations and of the matrix units (fp16/bf16 = mixed precision).
    pub precision: Dtype,
    /// Dtype of the all-reduced gradients (fp32 under PyTorch AMP, whose parameters stay fp32).
    pub gradient_precision: Dtype,
    /// Samples per rank per iteration.
    pub batch_per_device: u64,
    /// Number of data-parallel ranks (the allreduce group, in ring order 0..ranks).
    pub ranks: u32,
    /// Bucket cap (DDP: 25 MiB).
    pub bucket_cap: Bytes,
    /// Cap of the first bucket (DDP: 1 MiB).
    pub first_bucket_cap: Bytes,
    /// The optimizer step at the end of the iteration.
    pub optimizer: Optimizer,
    /// Allreduce algorithm.
    pub algorithm: CollectiveAlgorithm,
    /// Iterations to chain.
    pub iterations: u32,
    /// Activations recomputed in the backward pass instead of kept.
    pub recompute: Recompute,
}

/// The data-parallel graph could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LoweringError {
    /// A count that must be positive is zero.
    #[error("{what} must be at least 1")]
    Zero {
        /// Which count.
        what: &'static str,
    },
    /// A kernel time could not be computed.
    #[error("layer {layer}: {source}")]
    Compute {
        /// The layer.
        layer: String,
        /// Why.
        #[source]
        source: ComputeError,
    },
    /// The graph is malformed (a bug in the lowering).
    #[error("internal error in the data-parallel lowering: {0}")]
    Graph(#[from] GraphError),
}

/// One gradient bucket: which layers' gradients it carries and how many bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Indexes into the model's layers, in the order their gradients become ready.
    pub layers: Vec<usize>,
    /// Gradient bytes.
    pub bytes: Bytes,
}

/// The lowered graph plus what the report needs to interpret it.
#[derive(Debug, Clone)]
pub struct Lowered {
    /// The execution graph.
    pub graph: ExecGraph,
    /// The gradient buckets of one iteration.
    pub buckets: Vec<Bucket>,
    /// For each iteration, the optimizer op of every rank: the iteration is over when the
    /// last of them ends.
    pub iteration_ends: Vec<Vec<OpId>>,
    /// Model FLOPs of one rank per iteration (forward, backward, optimizer; recomputation not
    /// included).
    pub flops_per_rank_iteration: f64,
}

impl DataParallel<'_> {
    /// The memory plan of one rank: its whole batch in flight, DDP's bucket buffers when there
    /// is more than one rank.
    pub fn memory_plan(&self) -> MemoryPlan<'_> {
        let buckets = if self.ranks > 1 {
            Bytes(self.buckets().iter().map(|bucket| bucket.bytes.0).sum())
        } else {
            Bytes::ZERO
        };
        MemoryPlan {
            model: self.model,
            precision: self.precision,
            gradient_precision: self.gradient_precision,
            optimizer: self.optimizer,
            micro_batch: self.batch_per_device,
            micro_batches_in_flight: 1,
            recompute: self.recompute,
            sharding: Sharding::data_parallel(self.ranks),
            communication_buffers: buckets,
        }
    }

    /// What one rank holds at the peak of an iteration. [`MemoryBreakdown::check`] says whether
    /// it fits the device.
    pub fn memory(&self) -> Result<MemoryBreakdown, MemoryError> {
        self.memory_plan().breakdown()
    }

    /// Groups the layers with parameters into DDP buckets, in reverse model order.
    pub fn buckets(&self) -> Vec<Bucket> {
        let mut buckets = Vec::new();
        let mut current = Bucket { layers: Vec::new(), bytes: Bytes::ZERO };
        for (index, layer) in self.model.layers.iter().enumerate().rev() {
            if layer.cost.params == 0 {
                continue;
            }
            current.layers.push(index);
            current.bytes.0 += layer.cost.params * self.gradient_precision.bytes();
            let cap = if buckets.is_empty() { self.first_bucket_cap } else { self.bucket_cap };
            if current.bytes >= cap {
                buckets
                    .push(std::mem::replace(&mut current, Bucket { layers: Vec::new(), bytes: Bytes::ZERO }));
            }
        }
        if !current.layers.is_empty() {
            buckets.push(current);
        }
        buckets
    }

    /// Builds the execution graph.
    pub fn lower(&self) -> Result<Lowered, LoweringError> {
        for (what, value) in [
            ("ranks", u64::from(self.ranks)),
            ("batch-per-device", self.batch_per_device),
            ("iterations", u64::from(self.iterations)),
        ] {
            if value == 0 {
                return Err(LoweringError::Zero { what });
            }
        }
        let layers = &self.model.layers;
        let kernel = |index: usize, pass: Pass| -> Result<Option<(SimDuration, f64)>, LoweringError> {
            let layer = &layers[index];
            let flops = layer.cost.flops(pass, self.batch_per_device);
            let bytes = layer.cost.bytes(pass, self.batch_per_device, self.precision);
            if flops == 0.0 && bytes == 0.0 {
                return Ok(None); // a view (flatten) or a pass with nothing to do
            }
            let duration = self
                .compute
                .layer_duration(self.device, self.precision, layer, pass, self.batch_per_device)
                .map_err(|source| LoweringError::Compute { layer: layer.name.clone(), source })?;
            Ok(Some((duration, flops)))
        };
        // Kernel times are the same on every rank: compute them once.
        let mut forward = Vec::with_capacity(layers.len());
        let mut backward_data = Vec::with_capacity(layers.len());
        let mut backward_weight = Vec::with_capacity(layers.len());
        let mut flops = 0.0;
        for index in 0..layers.len() {
            forward.push(kernel(index, Pass::Forward)?);
            // The input of the first layer needs no gradient.
            backward_data.push(if index == 0 { None } else { kernel(index, Pass::BackwardData)? });
            backward_weight.push(kernel(index, Pass::BackwardWeight)?);
            flops += [&forward[index], &backward_data[index], &backward_weight[index]]
                .iter()
                .filter_map(|k| k.map(|(_, f)| f))
                .sum::<f64>();
        }
        let parameters = self.model.parameters();
        let optimizer_flops = self.optimizer.flops_per_parameter() * parameters as f64;
        let optimizer_bytes = (self.optimizer.tensors_touched() * Dtype::Fp32.bytes() * parameters) as f64;
        let optimizer_time = self
            .compute
            .duration(self.device, Dtype::Fp32, optimizer_flops, optimizer_bytes, OpClass::Elementwise)
            .map_err(|source| LoweringError::Compute { layer: "optimizer".into(), source })?;
        flops += optimizer_flops;

        // Forward kernels re-run just before the backward of the last layer of each range.
        let mut recompute_before: Vec<Option<std::ops::Range<usize>>> = vec![None; layers.len()];
        let mut recomputed = vec![false; layers.len()];
        for range in self.memory_plan().recomputed_ranges() {
            recomputed[range.clone()].iter_mut().for_each(|flag| *flag = true);
            if let Some(last) = range.end.checked_sub(1) {
                recompute_before[last] = Some(range);
            }
        }

        let buckets = self.buckets();
        // Which bucket (if any) closes when layer i's gradient is ready.
        let mut bucket_closed_by = vec![None; layers.len()];
        for (b, bucket) in buckets.iter().enumerate() {
            if let Some(&last) = bucket.layers.last() {
                bucket_closed_by[last] = Some(b);
            }
        }

        let mut graph = GraphBuilder::new(self.ranks);
        let everyone = graph.add_group((0..self.ranks).map(RankId).collect());
        // Labels are interned once; every rank's ops share them.
        let names: Vec<[LabelId; 3]> = layers
            .iter()
            .map(|l| {
                ["forward", "backward-data", "backward-weight"]
                    .map(|pass| graph.label(&format!("{} {pass}", l.name)))
            })
            .collect();
        let bucket_names: Vec<LabelId> = buckets
            .iter()
            .enumerate()
            .map(|(b, bucket)| graph.label(&format!("allreduce gradient bucket {b} ({})", bucket.bytes)))
            .collect();
        let optimizer_label = graph.label("optimizer step");
        let recompute_names: Vec<LabelId> = layers
            .iter()
            .enumerate()
            .map(|(index, l)| {
                if recomputed[index] {
                    graph.label(&format!("{} recompute", l.name))
                } else {
                    names[index][0]
                }
            })
            .collect();
        let compute = |duration: SimDuration, rank, label| Op {
            kind: OpKind::Compute { duration },
            rank,
            stream: COMPUTE_STREAM,
            label,
        };
        let mut iteration_ends = Vec::with_capacity(self.iterations as usize);
        for _ in 0..self.iterations {
            let collectives: Vec<_> = buckets
                .iter()
                .map(|bucket| {
                    graph.add_collective(Collective {
                        kind: CollectiveKind::AllReduce,
                        group: everyone,
                        bytes: bucket.bytes,
                        algorithm: self.algorithm,
                    })
                })
                .collect();
            let mut ends = Vec::with_capacity(self.ranks as usize);
            for rank in (0..self.ranks).map(RankId) {
                for (index, kernel) in forward.iter().enumerate() {
                    if let Some((duration, _)) = kernel {
                        graph.add_op(compute(*duration, rank, names[index][0]), &[]);
                    }
                }
                let mut last_allreduce = None;
                for index in (0..layers.len()).rev() {
                    if let Some(range) = &recompute_before[index] {
                        for again in range.clone() {
                            if let Some((duration, _)) = forward[again] {
                                graph.add_op(compute(duration, rank, recompute_names[again]), &[]);
                            }
                        }
                    }
                    let mut gradient_ready = None;
                    for (pass, kernel) in [(1, &backward_data[index]), (2, &backward_weight[index])] {
                        if let Some((duration, _)) = kernel {
                            let op = graph.add_op(compute(*duration, rank, names[index][pass]), &[]);
                            gradient_ready = Some(op);
                        }
                    }
                    if let (Some(b), Some(ready)) = (bucket_closed_by[index], gradient_ready) {
                        let kind = OpKind::Collective(collectives[b]);
                        let label = bucket_names[b];
                        let op =
                            graph.add_op(Op { kind, rank, stream: COMMUNICATION_STREAM, label }, &[ready]);
                        last_allreduce = Some(op);
                    }
                }
                let deps: Vec<OpId> = last_allreduce.into_iter().collect();
                ends.push(graph.add_op(compute(optimizer_time, rank, optimizer_label), &deps));
            }
            iteration_ends.push(ends);
        }
        Ok(Lowered { graph: graph.build()?, buckets, iteration_ends, flops_per_rank_iteration: flops })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceCatalog;
    use crate::zoo;

    fn resnet50() -> (Model, ComputeModel) {
        (zoo::by_name("resnet50").unwrap(), ComputeModel::default())
    }

    fn spec<'a>(
        model: &'a Model,
        compute: &'a ComputeModel,
        ranks: u32,
        iterations: u32,
    ) -> DataParallel<'a> {
        DataParallel {
            model,
            device: DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap(),
            compute,
            precision: Dtype::Fp16,
            gradient_precision: Dtype::Fp32,
            batch_per_device: 64,
            ranks,
            bucket_cap: Bytes(25 << 20),
            first_bucket_cap: Bytes(1 << 20),
            optimizer: Optimizer::SgdMomentum,
            algorithm: CollectiveAlgorithm::Auto,
            iterations,
            recompute: Recompute::None,
        }
    }

    #[test]
    fn buckets_hold_every_gradient_once_and_respect_the_caps() {
        let (model, compute) = resnet50();
        let dp = spec(&model, &compute, 4, 1);
        let buckets = dp.buckets();
        let total: u64 = buckets.iter().map(|b| b.bytes.0).sum();
        assert_eq!(total, model.parameters() * 4);
        // Every bucket but the last reached its cap; none exceeds it by more than one layer.
        let largest_layer = model.layers.iter().map(|l| l.cost.params * 4).max().unwrap();
        for (i, bucket) in buckets.iter().enumerate() {
            let cap = if i == 0 { 1 << 20 } else { 25 << 20 };
            if i + 1 < buckets.len() {
                assert!(bucket.bytes.0 >= cap, "bucket {i} closed early");
            }
            assert!(bucket.bytes.0 < cap + largest_layer, "bucket {i} overfull");
        }
        // The first bucket starts with the classifier, the last gradient to be produced is conv1's.
        assert_eq!(model.layers[buckets[0].layers[0]].name, "fc");
        assert_eq!(model.layers[*buckets.last().unwrap().layers.last().unwrap()].name, "conv1");
    }

    #[test]
    fn every_rank_gets_the_same_ops_and_one_op_per_bucket() {
        let (model, compute) = resnet50();
        let lowered = spec(&model, &compute, 8, 2).lower().unwrap();
        let graph = &lowered.graph;
        let per_rank = graph.op_count() / 8;
        assert_eq!(graph.op_count() % 8, 0);
        assert_eq!(graph.collectives().len(), 2 * lowered.buckets.len());
        for rank in 0..8 {
            let ops = graph.ops().iter().filter(|op| op.rank.0 == rank).count();
            assert_eq!(ops, per_rank);
        }
        assert_eq!(lowered.iteration_ends.len(), 2);
        assert!(lowered.flops_per_rank_iteration > 3.0 * 64.0 * 4.0e9 * 2.0 * 0.9);
    }

    #[test]
    fn recomputation_reruns_forward_kernels_without_counting_their_flops() {
        let model = zoo::by_name("bert-base").unwrap();
        let compute = ComputeModel::default();
        let mut dp = spec(&model, &compute, 2, 1);
        dp.batch_per_device = 4;
        let none = dp.lower().unwrap();
        dp.recompute = Recompute::Selective;
        let selective = dp.lower().unwrap();
        dp.recompute = Recompute::Full;
        let full = dp.lower().unwrap();
        let per_rank = |lowered: &Lowered| lowered.graph.op_count() / 2;
        // BERT-base: 12 attention cores re-run under selective recomputation.
        assert_eq!(per_rank(&selective), per_rank(&none) + 12);
        // Full: every layer of the 12 encoder blocks re-runs its forward (views excepted).
        let block_kernels =
            model.layers.iter().filter(|l| l.name.starts_with("layers.") && !l.cost.is_free()).count();
        assert_eq!(per_rank(&full), per_rank(&none) + block_kernels);
        assert_eq!(none.flops_per_rank_iteration, full.flops_per_rank_iteration);
    }

    #[test]
    fn memory_counts_the_ddp_buckets_once_there_are_peers() {
        let (model, compute) = resnet50();
        let dp = spec(&model, &compute, 8, 1);
        let memory = dp.memory().unwrap();
        let buckets: u64 = dp.buckets().iter().map(|bucket| bucket.bytes.0).sum();
        assert_eq!(memory.communication, Bytes(buckets));
        assert_eq!(memory.gradients, Bytes(4 * model.parameters()));
        let alone = spec(&model, &compute, 1, 1).memory().unwrap();
        assert_eq!(alone.communication, Bytes::ZERO);
        // ResNet-50 at batch 64 in fp16 fits an 80 GB A100 with room to spare.
        let a100 = DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap();
        memory.check(a100).unwrap();
        assert!(memory.activations > Bytes(1 << 30) && memory.total() < Bytes(40 << 30), "{memory}");
    }

    #[test]
    fn zero_sizes_are_refused() {
        let (model, compute) = resnet50();
        let mut dp = spec(&model, &compute, 0, 1);
        assert!(matches!(dp.lower(), Err(LoweringError::Zero { what: "ranks" })));
        dp.ranks = 1;
        dp.batch_per_device = 0;
        assert!(matches!(dp.lower(), Err(LoweringError::Zero { what: "batch-per-device" })));
    }
}
