//! A simulated strategy against a real multi-rank trace of the same job: per-iteration time,
//! GPU time per kernel class and time per NCCL collective kind, each per rank per iteration,
//! measured next to simulated (`parasim compare`).
//!
//! The two sides are classified into the same [`KernelClass`]es:
//!
//! - **measured** kernels by their name ([`KernelClass::of_kernel`]): the trace keeps kernel
//!   names, not the operators that launched them, so an optimizer written as plain
//!   element-wise kernels (PyTorch's non-fused `Adagrad`: `addcmul_`, `sqrt`, `addcdiv_`) counts
//!   as element-wise, while fused optimizer kernels (`multi_tensor_apply`, `adam`, ...) count as
//!   the optimizer; copies and memsets are [`KernelClass::Copy`];
//! - **simulated** ops by the layer they belong to ([`KernelClass::of_layer`]): the lowering
//!   labels every kernel `"<layer> <pass>"`, and the layer's kind says its class; the optimizer
//!   step is its own label.
//!
//! What counts as an iteration on the measured side: the GPU ops launched during a
//! `ProfilerStep#N` annotation (by their launch call), and the ops whose launch the trace lacks
//! that ran between the step's begin and its completion. Ops outside every step are counted in
//! [`Comparison::outside_steps`] and left out. The measured iteration time is `parasim
//! replay`'s: the mean over ranks of each step's completion-to-completion time, after the first
//! step when there are several.

use std::collections::BTreeMap;

use scenario::Scenario;
use scenario::simulation::{Outcome, SimulationError, simulate};
use serde::Serialize;
use sim_core::graph::{CollectiveKind, OpKind, Pass};
use topology::Topology;
use traces::Trace;
use traces::model::{CollectiveType, GpuOp, GpuOpKind, RankTrace};
use traces::replay::{ReplayOptions, relative_error};
use workloads::layer::LayerKind;

/// A trace and a scenario could not be compared.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// The scenario simulates another number of GPUs than the traced job ran on.
    #[error(
        "scenario {scenario} has {gpus} GPUs, but the trace {trace} has world size {world_size}: compare needs the scenario of the traced job"
    )]
    WorldSize {
        /// The scenario file.
        scenario: String,
        /// Its GPU count.
        gpus: u32,
        /// The trace.
        trace: String,
        /// The traced job's world size.
        world_size: u32,
    },
    /// A traced rank has no iteration marker, so there is no per-iteration measurement.
    #[error(
        "{file}: no ProfilerStep#N markers (record with torch.profiler.profile and call prof.step() every iteration); {count} of {ranks} rank files lack them"
    )]
    NoSteps {
        /// The first rank file without markers.
        file: String,
        /// How many rank files lack markers.
        count: usize,
        /// Traced rank files.
        ranks: usize,
    },
    /// The trace cannot be replayed (needed for the measured iteration time).
    #[error("{trace}: {source}")]
    Replay {
        /// The trace.
        trace: String,
        /// Why.
        #[source]
        source: traces::TraceError,
    },
    /// The replay of the trace failed on the scenario's cluster.
    #[error("{trace}: replaying on the cluster of {scenario}: {message}")]
    ReplayRun {
        /// The trace.
        trace: String,
        /// The scenario whose cluster it ran on.
        scenario: String,
        /// Why.
        message: String,
    },
    /// The scenario could not be simulated.
    #[error(transparent)]
    Simulation(#[from] SimulationError),
}

/// The class of a GPU kernel, shared by the measured and the simulated side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelClass {
    /// Matrix products: GEMM, GEMV, batched products, attention, DLRM's interaction.
    Gemm,
    /// Convolutions (forward and both backward passes).
    Convolution,
    /// One output per input element: activations, additions, copies inside the device,
    /// concatenation, gathers by index. Memory-bound.
    Elementwise,
    /// Batch, layer, RMS and group normalization.
    Normalization,
    /// Reductions: sums, softmax, pooling, losses.
    Reduction,
    /// Embedding lookups and their backward (fused embedding optimizers included).
    Embedding,
    /// The optimizer step.
    Optimizer,
    /// Host-device copies and memsets.
    Copy,
    /// Everything else (sorts, scans, index bookkeeping, unrecognized kernels).
    Other,
}

impl KernelClass {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            KernelClass::Gemm => "gemm",
            KernelClass::Convolution => "convolution",
            KernelClass::Elementwise => "elementwise",
            KernelClass::Normalization => "normalization",
            KernelClass::Reduction => "reduction",
            KernelClass::Embedding => "embedding",
            KernelClass::Optimizer => "optimizer",
            KernelClass::Copy => "copy/memset",
            KernelClass::Other => "other",
        }
    }

    /// The class of a profiled kernel, from its (demangled) name. The first rule that matches
    /// wins, in this order: embedding (`embedding`: FBGEMM's table-batched kernels, PyTorch's
    /// `embedding_bag`), optimizer (`multi_tensor_apply`, `adam`, `adagrad`, `sgd_`: not
    /// `lamb`, which every `lambda` in a templated name contains), normalization (`batch_norm`,
    /// `layer_norm`, `rms_norm`, `group_norm` with or without the underscore, cuDNN's
    /// `bn_fw`/`bn_bw`), convolution (`convolve`, `convolution`, `conv1d`-`conv3d`,
    /// `winograd`, `fprop`, `dgrad`, `wgrad`; not `conv`, which `convert` contains), GEMM (`gemm`, `gemv`, `cublas`, `cutlass`, `xmma`, `bmm`,
    /// `attention`, `fmha`, `flash`), reduction (`reduce`, `softmax`, `pool`, `loss`),
    /// element-wise (`elementwise`, `copy`, `fill`, `cat`, `index`, `gather`, `scatter`).
    pub fn of_kernel(name: &str) -> KernelClass {
        let name = name.to_ascii_lowercase();
        let any = |needles: &[&str]| needles.iter().any(|needle| name.contains(needle));
        if any(&["embedding"]) {
            KernelClass::Embedding
        } else if any(&["multi_tensor_apply", "adam", "adagrad", "sgd_"]) {
            KernelClass::Optimizer
        } else if any(&[
            "batch_norm",
            "batchnorm",
            "layer_norm",
            "layernorm",
            "rms_norm",
            "rmsnorm",
            "group_norm",
            "groupnorm",
            "bn_fw",
            "bn_bw",
        ]) {
            KernelClass::Normalization
        } else if any(&[
            "convolve",
            "convolution",
            "conv1d",
            "conv2d",
            "conv3d",
            "winograd",
            "fprop",
            "dgrad",
            "wgrad",
        ]) {
            KernelClass::Convolution
        } else if any(&["gemm", "gemv", "cublas", "cutlass", "xmma", "bmm", "attention", "fmha", "flash"]) {
            KernelClass::Gemm
        } else if any(&["reduce", "softmax", "pool", "loss"]) {
            KernelClass::Reduction
        } else if any(&["elementwise", "copy", "fill", "cat", "index", "gather", "scatter"]) {
            KernelClass::Elementwise
        } else {
            KernelClass::Other
        }
    }

    /// The class of the kernels a layer of `kind` lowers to.
    pub fn of_layer(kind: &LayerKind) -> KernelClass {
        match kind {
            LayerKind::Conv { .. } | LayerKind::ConvTranspose { .. } => KernelClass::Convolution,
            LayerKind::Linear { .. }
            | LayerKind::TiedLinear { .. }
            | LayerKind::LoraAdapter { .. }
            | LayerKind::Matmul { .. }
            | LayerKind::Interaction
            | LayerKind::Attention { .. }
            | LayerKind::MoeRouter { .. }
            | LayerKind::MoeExperts { .. } => KernelClass::Gemm,
            LayerKind::BatchNorm
            | LayerKind::LayerNorm { .. }
            | LayerKind::RmsNorm
            | LayerKind::QkNorm { .. } => KernelClass::Normalization,
            LayerKind::MaxPool { .. }
            | LayerKind::AvgPool { .. }
            | LayerKind::GlobalAvgPool
            | LayerKind::GlobalMaxPool
            | LayerKind::AdaptiveAvgPool { .. }
            | LayerKind::Softmax
            | LayerKind::CrossEntropy { .. } => KernelClass::Reduction,
            LayerKind::Embedding { .. } | LayerKind::AddEmbedding { .. } | LayerKind::EmbeddingBag { .. } => {
                KernelClass::Embedding
            }
            LayerKind::Activation { .. }
            | LayerKind::Glu { .. }
            | LayerKind::Dropout
            | LayerKind::Rope { .. }
            | LayerKind::Upsample { .. }
            | LayerKind::Crop { .. }
            | LayerKind::Add
            | LayerKind::Concat { .. }
            | LayerKind::Flatten
            | LayerKind::Reshape { .. }
            | LayerKind::Slice { .. } => KernelClass::Elementwise,
        }
    }
}

/// One row: a quantity per rank per iteration, measured and simulated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// What it is: "iteration", a [`KernelClass`] name or a collective kind.
    pub name: String,
    /// Measured seconds.
    pub measured_s: f64,
    /// Simulated seconds.
    pub simulated_s: f64,
    /// Simulated minus measured, seconds.
    pub difference_s: f64,
    /// Relative error, simulated / measured - 1; `None` when nothing was measured.
    pub error: Option<f64>,
    /// For collectives, operations per rank per iteration: measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_count: Option<f64>,
    /// For collectives, operations per rank per iteration: simulated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated_count: Option<f64>,
}

impl Row {
    fn new(name: &str, measured_s: f64, simulated_s: f64) -> Row {
        let error = (measured_s > 0.0).then(|| relative_error(simulated_s, measured_s));
        Row {
            name: name.to_string(),
            measured_s,
            simulated_s,
            difference_s: simulated_s - measured_s,
            error,
            measured_count: None,
            simulated_count: None,
        }
    }
}

/// What the trace held.
#[derive(Debug, Clone, Serialize)]
pub struct TraceFacts {
    /// Ranks of the traced job.
    pub world_size: u32,
    /// Traced ranks.
    pub traced_ranks: Vec<u32>,
    /// The GPU, as the profiler names it.
    pub device: Option<String>,
    /// `ProfilerStep` numbers, over all ranks.
    pub steps: Vec<u64>,
}

/// What the scenario simulated.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioFacts {
    /// The scenario file.
    pub scenario: String,
    /// The model.
    pub model: String,
    /// GPUs.
    pub gpus: u32,
    /// The GPU.
    pub device: String,
    /// Parallel degrees, e.g. "data 8".
    pub parallelism: String,
    /// ZeRO stage.
    pub zero: u8,
    /// Iterations simulated.
    pub iterations: u32,
    /// Ranks whose ops were simulated (the others are symmetric copies).
    pub simulated_ranks: u32,
}

/// Measured GPU work outside every iteration (left out of the rows).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OutsideSteps {
    /// GPU ops (kernels, copies, NCCL kernels) over all traced ranks.
    pub ops: u64,
    /// Their measured time over all traced ranks, seconds.
    pub time_s: f64,
}

/// The comparison of a simulated strategy with a real trace; every row is per rank per
/// iteration, and each list is sorted by absolute difference, largest first.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The trace.
    pub trace: TraceFacts,
    /// The scenario.
    pub scenario: ScenarioFacts,
    /// Iteration time: measured is `parasim replay`'s steady mean over ranks, simulated the
    /// scenario's mean iteration.
    pub iteration: Row,
    /// GPU time per kernel class.
    pub kernels: Vec<Row>,
    /// Time and count per NCCL collective kind (`send/recv` for point-to-point).
    pub collectives: Vec<Row>,
    /// Measured GPU work outside every iteration.
    pub outside_steps: OutsideSteps,
}

/// Compares `scenario`, simulated, with the real `trace` (named `trace_name` in messages).
/// The scenario must have as many GPUs as the traced job, and every traced rank must mark
/// its iterations.
pub fn compare(trace: &Trace, trace_name: &str, scenario: &Scenario) -> Result<Comparison, CompareError> {
    let gpus = scenario.cluster.nodes * scenario.cluster.gpus_per_node;
    if gpus != trace.world_size {
        return Err(CompareError::WorldSize {
            scenario: scenario.source.clone(),
            gpus,
            trace: trace_name.to_string(),
            world_size: trace.world_size,
        });
    }
    let without_steps: Vec<&RankTrace> = trace.ranks.iter().filter(|r| r.steps.is_empty()).collect();
    if let Some(first) = without_steps.first() {
        return Err(CompareError::NoSteps {
            file: first.source.clone(),
            count: without_steps.len(),
            ranks: trace.ranks.len(),
        });
    }

    let measured_iteration = measured_iteration(trace, trace_name, scenario)?;
    let measured = measure(trace);
    let outcome = simulate(scenario)?;
    let simulated = simulated_work(scenario, &outcome);

    let mut kernels: Vec<Row> = KernelClass::all()
        .iter()
        .filter_map(|&class| {
            let m = measured.kernels.get(&class).copied().unwrap_or(0.0);
            let s = simulated.kernels.get(&class).copied().unwrap_or(0.0);
            (m > 0.0 || s > 0.0).then(|| Row::new(class.name(), m, s))
        })
        .collect();
    sort_by_difference(&mut kernels);

    let mut names: Vec<&str> =
        measured.collectives.keys().chain(simulated.collectives.keys()).copied().collect();
    names.sort_unstable();
    names.dedup();
    let mut collectives: Vec<Row> = names
        .into_iter()
        .map(|name| {
            let (m_count, m_time) = measured.collectives.get(name).copied().unwrap_or_default();
            let (s_count, s_time) = simulated.collectives.get(name).copied().unwrap_or_default();
            Row {
                measured_count: Some(m_count),
                simulated_count: Some(s_count),
                ..Row::new(name, m_time, s_time)
            }
        })
        .collect();
    sort_by_difference(&mut collectives);

    let mut steps: Vec<u64> = trace.ranks.iter().flat_map(|r| r.steps.iter().map(|s| s.number)).collect();
    steps.sort_unstable();
    steps.dedup();
    let p = &scenario.parallelism;
    Ok(Comparison {
        trace: TraceFacts {
            world_size: trace.world_size,
            traced_ranks: trace.ranks.iter().map(|r| r.rank).collect(),
            device: trace.device.as_ref().map(|d| d.name.clone()),
            steps,
        },
        scenario: ScenarioFacts {
            scenario: scenario.source.clone(),
            model: scenario.model.name.clone(),
            gpus,
            device: scenario.device.display_name.clone(),
            parallelism: strategies::describe_parallelism(p),
            zero: p.zero,
            iterations: scenario.iterations,
            simulated_ranks: simulated.ranks,
        },
        iteration: Row::new("iteration", measured_iteration, outcome.summary.iteration_time.as_secs_f64()),
        kernels,
        collectives,
        outside_steps: measured.outside,
    })
}

impl KernelClass {
    /// Every class, in report order.
    pub fn all() -> [KernelClass; 9] {
        [
            KernelClass::Gemm,
            KernelClass::Convolution,
            KernelClass::Elementwise,
            KernelClass::Normalization,
            KernelClass::Reduction,
            KernelClass::Embedding,
            KernelClass::Optimizer,
            KernelClass::Copy,
            KernelClass::Other,
        ]
    }
}

/// Largest absolute difference first; equal differences by name, so the order is total.
fn sort_by_difference(rows: &mut [Row]) {
    rows.sort_by(|a, b| {
        b.difference_s.abs().total_cmp(&a.difference_s.abs()).then_with(|| a.name.cmp(&b.name))
    });
}

/// `parasim replay`'s measured iteration: the steady mean over ranks of each step's
/// completion-to-completion time (the mean after the first step if there are several). The
/// replay runs on the scenario's cluster; its measured side does not depend on the cluster.
fn measured_iteration(trace: &Trace, trace_name: &str, scenario: &Scenario) -> Result<f64, CompareError> {
    let replay = traces::replay::build(trace, &ReplayOptions::default())
        .map_err(|source| CompareError::Replay { trace: trace_name.to_string(), source })?;
    let run_error = |message: String| CompareError::ReplayRun {
        trace: trace_name.to_string(),
        scenario: scenario.source.clone(),
        message,
    };
    let topology = Topology::build(&scenario.cluster).map_err(|e| run_error(e.to_string()))?;
    let timeline = scenario.network.run(&replay.graph, &topology).map_err(|e| run_error(e.to_string()))?;
    let comparison = replay.compare(&timeline);
    Ok(comparison.steady_mean_s.unwrap_or(comparison.mean_s).0)
}

/// Per rank per iteration totals of one side.
#[derive(Debug, Default)]
struct Work {
    kernels: BTreeMap<KernelClass, f64>,
    /// Kind name -> (count, seconds).
    collectives: BTreeMap<&'static str, (f64, f64)>,
    outside: OutsideSteps,
    ranks: u32,
}

fn collective_name(kind: CollectiveType) -> &'static str {
    match kind {
        CollectiveType::Send | CollectiveType::Recv => "send/recv",
        other => other.name(),
    }
}

/// The measured side: GPU ops of each traced rank attributed to its steps, per rank-iteration.
fn measure(trace: &Trace) -> Work {
    let mut work = Work::default();
    let mut rank_iterations = 0u64;
    let mut kernels: BTreeMap<KernelClass, u64> = BTreeMap::new();
    let mut collectives: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    for rank in &trace.ranks {
        let in_step = attribute_to_steps(rank);
        let mut numbers: Vec<u64> = rank.steps.iter().map(|s| s.number).collect();
        numbers.sort_unstable();
        numbers.dedup();
        rank_iterations += numbers.len() as u64;
        for (op, inside) in rank.gpu_ops.iter().zip(in_step) {
            if !inside {
                work.outside.ops += 1;
                work.outside.time_s += op.duration_ns as f64 * 1e-9;
                continue;
            }
            match &op.kind {
                GpuOpKind::Kernel => {
                    *kernels.entry(KernelClass::of_kernel(trace.name(op.name))).or_default() += op.duration_ns
                }
                GpuOpKind::Memcpy { .. } | GpuOpKind::Memset { .. } => {
                    *kernels.entry(KernelClass::Copy).or_default() += op.duration_ns
                }
                GpuOpKind::Collective(call) => {
                    let entry = collectives.entry(collective_name(call.kind)).or_default();
                    entry.0 += 1;
                    entry.1 += op.duration_ns;
                }
            }
        }
    }
    let per = rank_iterations.max(1) as f64;
    work.kernels = kernels.into_iter().map(|(class, ns)| (class, ns as f64 * 1e-9 / per)).collect();
    work.collectives = collectives
        .into_iter()
        .map(|(name, (count, ns))| (name, (count as f64 / per, ns as f64 * 1e-9 / per)))
        .collect();
    work.ranks = trace.ranks.len() as u32;
    work
}

/// For each GPU op of `rank`, whether it belongs to an iteration: launched during a step's
/// host annotation, or (launch not recorded) started between a step's begin and completion.
fn attribute_to_steps(rank: &RankTrace) -> Vec<bool> {
    let launch_start =
        |op: &GpuOp| op.launch.and_then(|call| rank.calls.get(call as usize)).map(|c| c.start_ns);
    let mut inside = vec![false; rank.gpu_ops.len()];
    for step in &rank.steps {
        let (begin, end) = (step.start_ns, step.start_ns.saturating_add(step.duration_ns));
        let mut completion = end;
        for (index, op) in rank.gpu_ops.iter().enumerate() {
            if launch_start(op).is_some_and(|start| (begin..=end).contains(&start)) {
                inside[index] = true;
                completion = completion.max(op.end_ns());
            }
        }
        for (index, op) in rank.gpu_ops.iter().enumerate() {
            if launch_start(op).is_none() && (begin..=completion).contains(&op.start_ns) {
                inside[index] = true;
            }
        }
    }
    inside
}

/// The simulated side: every GPU op of the simulated ranks, per rank-iteration.
fn simulated_work(scenario: &Scenario, outcome: &Outcome) -> Work {
    let graph = &outcome.graph;
    let timeline = &outcome.timeline;
    let layers: BTreeMap<&str, KernelClass> =
        scenario.model.layers.iter().map(|l| (l.name.as_str(), KernelClass::of_layer(&l.kind))).collect();
    // A kernel's class, by its metadata: the optimizer step, or the kind of its layer.
    let class_of = |op: &sim_core::graph::Op| match (op.meta.work(), op.meta.pass()) {
        (sim_core::graph::Work::Device, Some(Pass::Optimizer)) => KernelClass::Optimizer,
        (sim_core::graph::Work::Device, Some(_)) => op
            .meta
            .layer()
            .and_then(|layer| graph.layer_name(layer))
            .and_then(|name| layers.get(name).copied())
            .unwrap_or(KernelClass::Other),
        _ => KernelClass::Other,
    };
    let mut kernels: BTreeMap<KernelClass, u128> = BTreeMap::new();
    let mut collectives: BTreeMap<&'static str, (u64, u128)> = BTreeMap::new();
    let mut has_ops = vec![false; graph.ranks() as usize];
    for (index, op) in graph.ops().iter().enumerate() {
        if op.meta.work().is_host() {
            continue;
        }
        if let Some(slot) = has_ops.get_mut(op.rank.0 as usize) {
            *slot = true;
        }
        let ps = u128::from(timeline.end[index].saturating_since(timeline.start[index]).as_ps());
        match op.kind {
            OpKind::Compute { .. } => *kernels.entry(class_of(op)).or_default() += ps,
            OpKind::Memcpy { .. } => *kernels.entry(KernelClass::Copy).or_default() += ps,
            OpKind::Transfer { .. } => {
                let entry = collectives.entry("send/recv").or_default();
                entry.0 += 1;
                entry.1 += ps;
            }
            OpKind::Collective(id) => {
                let kind: CollectiveKind = graph.collectives()[id.0 as usize].kind;
                let entry = collectives.entry(kind.name()).or_default();
                entry.0 += 1;
                entry.1 += ps;
            }
        }
    }
    let ranks = has_ops.iter().filter(|&&h| h).count().max(1) as u32;
    let per = f64::from(ranks) * f64::from(scenario.iterations.max(1));
    Work {
        kernels: kernels.into_iter().map(|(class, ps)| (class, ps as f64 * 1e-12 / per)).collect(),
        collectives: collectives
            .into_iter()
            .map(|(name, (count, ps))| (name, (count as f64 / per, ps as f64 * 1e-12 / per)))
            .collect(),
        outside: OutsideSteps::default(),
        ranks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiled_kernel_names_have_the_expected_classes() {
        let cases = [
            ("volta_sgemm_128x32_nt", KernelClass::Gemm),
            ("void gemmSN_TN_kernel<float, 128, 16, 2, 4, 8, 9, false>", KernelClass::Gemm),
            ("void dot_kernel<float, 128, 0, cublasDotParams<...>>", KernelClass::Gemm),
            ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_nn", KernelClass::Gemm),
            ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512>", KernelClass::Normalization),
            (
                "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>",
                KernelClass::Normalization,
            ),
            ("void implicit_convolve_sgemm<float, float, 128, 6, 7>", KernelClass::Convolution),
            ("sm80_xmma_fprop_implicit_gemm_tf32f32", KernelClass::Convolution),
            (
                "void split_embedding_backward_codegen_adagrad_unweighted_kernel_cta_per_row_1<float>",
                KernelClass::Embedding,
            ),
            ("void dense_embedding_codegen_forward_unweighted_kernel<float>", KernelClass::Embedding),
            (
                "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>",
                KernelClass::Optimizer,
            ),
            (
                "void at::native::vectorized_elementwise_kernel<4, at::native::addcdiv_cuda_kernel>",
                KernelClass::Elementwise,
            ),
            (
                "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 64, 64>",
                KernelClass::Elementwise,
            ),
            ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float>>", KernelClass::Reduction),
            ("void cub::DeviceScanKernel<cub::DeviceScanPolicy<int>::Policy600>", KernelClass::Other),
            // `lambda` is not LAMB, `convert` not a convolution.
            (
                "void at::native::vectorized_elementwise_kernel<4, at::native::sqrt_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}>",
                KernelClass::Elementwise,
            ),
            ("void at::native::unrolled_elementwise_kernel<convert_kernel>", KernelClass::Elementwise),
        ];
        for (name, class) in cases {
            assert_eq!(KernelClass::of_kernel(name), class, "{name}");
        }
    }

    #[test]
    fn rows_sort_by_absolute_difference_then_name() {
        let mut rows = vec![Row::new("b", 1.0, 1.5), Row::new("a", 2.0, 1.0), Row::new("c", 1.0, 0.5)];
        sort_by_difference(&mut rows);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(Row::new("x", 0.0, 1.0).error, None);
        assert!((Row::new("x", 2.0, 1.0).error.unwrap_or_default() + 0.5).abs() < 1e-12);
    }
}
