//! The kernel table of a strategy, for a per-layer breakdown of one run (`parasim run --csv`,
//! the layer-by-layer view ASTRA-sim's and SimAI's workload files give): every layer's
//! kernels as one rank of its pipeline stage runs them, recomputation, the optimizer step, and
//! the gradient buckets. It reads the same plan the emitter lowers, so its FLOPs and kernel
//! times are the simulated ones.

use sim_core::units::{Bytes, SimDuration};

use workloads::layer::Pass;

use super::plan::Plan;
use crate::{Strategy, StrategyError};

/// What a kernel row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowPass {
    /// A layer's forward kernel.
    Forward,
    /// A layer's input-gradient kernel.
    BackwardData,
    /// A layer's weight-gradient kernel.
    BackwardWeight,
    /// A forward kernel run again before the backward (activation recomputation).
    Recompute,
    /// The optimizer step of the stage's parameters (once per iteration).
    Optimizer,
}

impl RowPass {
    /// `forward`, `backward-data`, `backward-weight`, `recompute`, `optimizer`.
    pub fn name(self) -> &'static str {
        match self {
            RowPass::Forward => "forward",
            RowPass::BackwardData => "backward-data",
            RowPass::BackwardWeight => "backward-weight",
            RowPass::Recompute => "recompute",
            RowPass::Optimizer => "optimizer",
        }
    }
}

/// One kernel of one rank of a stage.
#[derive(Debug, Clone)]
pub struct KernelRow {
    /// The pipeline stage.
    pub stage: u32,
    /// The global pipeline chunk (the stage under non-interleaved schedules).
    pub chunk: usize,
    /// The layer's index in the model (`None` for the optimizer step).
    pub layer: Option<usize>,
    /// The layer's name, or `optimizer step`.
    pub name: String,
    /// The layer's kind (`conv2d`, `linear`, ...), or `optimizer`.
    pub kind: String,
    /// Which kernel.
    pub pass: RowPass,
    /// Kernel time of one run of it (one micro-batch; the optimizer's: one iteration).
    pub time: SimDuration,
    /// FLOPs of one run of it.
    pub flops: f64,
    /// Bytes of device memory one run of it reads and writes, as the compute model prices its
    /// kernels (the memory side of a roofline: `flops / bytes` is its arithmetic intensity).
    pub bytes: f64,
    /// Runs per iteration (the micro-batches; 1 for the optimizer step).
    pub runs: u32,
}

/// One gradient bucket (or ZeRO-3 unit) of one rank of a stage.
#[derive(Debug, Clone)]
pub struct BucketRow {
    /// The pipeline stage.
    pub stage: u32,
    /// The global pipeline chunk.
    pub chunk: usize,
    /// The bucket's number within its chunk, in the order they are synchronised.
    pub index: usize,
    /// `allreduce` (DDP), `reduce-scatter` (ZeRO-1/2), `gather-scatter` (a ZeRO-3 unit: its
    /// parameters gathered, its gradients scattered).
    pub collective: &'static str,
    /// Expert parameters (synchronised over the expert-data group).
    pub expert: bool,
    /// Gradient bytes.
    pub bytes: Bytes,
    /// The layers, in the order their gradients become ready (model indexes).
    pub layers: Vec<usize>,
}

/// The kernel table of a strategy.
#[derive(Debug, Clone)]
pub struct KernelTable {
    /// Micro-batches per iteration per replica.
    pub micro_batches: u32,
    /// Pipeline stages.
    pub stages: u32,
    /// Every kernel, stage by stage, layer by layer in model order, forward, backward-data,
    /// backward-weight, then recomputation and the optimizer step.
    pub kernels: Vec<KernelRow>,
    /// Gradient buckets, stage by stage (empty when gradients are not synchronised).
    pub buckets: Vec<BucketRow>,
    /// The device's dense peak rate in the run's compute dtype (its matrix units': fp8's for an
    /// fp8 run; with `cluster.flops-scale` applied): a roofline's compute ceiling, which no
    /// kernel's FLOPs over its time exceed.
    pub peak_flops_per_s: f64,
    /// The device's peak memory bandwidth in bytes per second (with
    /// `cluster.memory-bandwidth-scale` applied): a roofline's slope.
    pub memory_bandwidth_bytes_per_s: f64,
}

impl KernelTable {
    /// FLOPs one rank of `stage` executes per iteration, recomputation excluded (the run's
    /// `achieved_tflops_per_device` is the mean of this over stages, per second).
    pub fn stage_flops(&self, stage: u32) -> f64 {
        self.kernels
            .iter()
            .filter(|k| k.stage == stage && k.pass != RowPass::Recompute)
            .map(|k| k.flops * f64::from(k.runs))
            .sum()
    }
}

impl Strategy<'_> {
    /// Every layer's kernels, recomputation, optimizer step and gradient buckets, as one rank
    /// of each pipeline stage runs them: what [`Strategy::lower`] emits, as a table.
    pub fn kernel_table(&self) -> Result<KernelTable, StrategyError> {
        let plan = Plan::new(self)?;
        let p = &self.parallelism;
        let mut kernels = Vec::new();
        let mut buckets = Vec::new();
        for stage in 0..p.pipeline {
            let mut recompute = Vec::new();
            for chunk in plan.chunks_of(stage) {
                for index in plan.chunk_layers[chunk].clone() {
                    let local = &plan.local[index];
                    let row = |pass, (time, flops), bytes, runs| KernelRow {
                        stage,
                        chunk,
                        layer: Some(local.index),
                        name: local.layer.name.clone(),
                        kind: local.layer.kind.name().to_string(),
                        pass,
                        time,
                        flops,
                        bytes,
                        runs,
                    };
                    let passes = [RowPass::Forward, RowPass::BackwardData, RowPass::BackwardWeight];
                    for ((pass, kernel), work) in passes.into_iter().zip(plan.kernels[index]).zip(Pass::ALL) {
                        if let Some(kernel) = kernel {
                            let bytes = self.kernel_bytes(local, work);
                            kernels.push(row(pass, kernel, bytes, plan.path_micro_batches));
                        }
                    }
                    if let Some(again) = &plan.recompute_before[index] {
                        for i in again.clone() {
                            if let Some(kernel) = plan.kernels[i][0] {
                                let local = &plan.local[i];
                                let bytes = self.kernel_bytes(local, Pass::Forward);
                                recompute.push(KernelRow {
                                    layer: Some(local.index),
                                    name: local.layer.name.clone(),
                                    kind: local.layer.kind.name().to_string(),
                                    ..row(RowPass::Recompute, kernel, bytes, plan.path_micro_batches)
                                });
                            }
                        }
                    }
                }
                buckets.extend(plan.policy.bucket_rows(&plan, stage, chunk));
            }
            kernels.extend(recompute);
            let (time, flops) = plan.optimizer[stage as usize];
            kernels.push(KernelRow {
                stage,
                chunk: plan.chunks_of(stage).next().unwrap_or(0),
                layer: None,
                name: "optimizer step".into(),
                kind: "optimizer".into(),
                pass: RowPass::Optimizer,
                time,
                flops,
                bytes: plan.optimizer_bytes[stage as usize],
                runs: 1,
            });
        }
        // The rate the matrix products run at: fp8's in fp8 (its other kernels run in bf16, below).
        let peak = self.device.peak(self.precision).ok().or_else(|| self.device.fastest_peak());
        Ok(KernelTable {
            micro_batches: plan.micro_batches,
            stages: p.pipeline,
            kernels,
            buckets,
            peak_flops_per_s: peak.map_or(0.0, |rate| rate.per_second()),
            memory_bandwidth_bytes_per_s: self.device.memory_bandwidth.bytes_per_second(),
        })
    }
}
