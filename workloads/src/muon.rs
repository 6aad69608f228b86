//! Muon's optimizer step (`workload.optimizer = "muon"`, [`crate::optimizer::Optimizer::Muon`]):
//! which weights it orthogonalises, the kernels of one orthogonalisation (Newton-Schulz
//! iterations of bf16 matrix products), the element-wise kernels around them, and how the work
//! is spread over the data-parallel ranks.
//!
//! Sources: KellerJordan/modded-nanogpt @ f411b3d3 (`records/track_1_short/2024-10-10_Muon`,
//! `2024-10-17_DistributedMuon`: `Muon.step`, `zeropower_via_newtonschulz5`), the Muon
//! repository's later iteration (`A = X Xᵀ`, `B = bA + cA²`, `X = aX + BX`), and Megatron-Core's
//! `TensorParallelMuon` (NVIDIA/Megatron-LM @ d98e8a64dd :
//! megatron/core/optimizer/emerging_optimizers.py: `num_ns_steps = 5`, embeddings and
//! non-matrix parameters left to the scalar optimizer, `_is_muon_excluded`).

use std::fmt;

use sim_core::units::SimDuration;

use crate::compute::{ComputeError, ComputeModel, KernelWork, StepWidths};
use crate::device::{Device, Dtype};
use crate::kernel_shape::GemmShape;
use crate::layer::{Layer, LayerKind, OpClass};

/// Newton-Schulz iterations per orthogonalisation when the scenario does not say: Muon's
/// `backend_steps = 5` (modded-nanogpt) and Megatron-Core's `num_ns_steps = 5`.
pub const DEFAULT_STEPS: u32 = 5;

/// How one Newton-Schulz iteration computes the quintic `aX + b(XXᵀ)X + c(XXᵀ)²X` of the
/// `m x n` update `X` (`m <= n`, transposed first if taller than wide).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Iteration {
    /// `A = X Xᵀ`, `B = bA + cA A`, `X = aX + B X`: two products over the wide side and one
    /// `m x m` (`4m²n + 2m³` FLOPs): the Muon repository's and modded-nanogpt's form since
    /// late October 2024 (the default).
    #[default]
    SquareFirst,
    /// `A = X Xᵀ`, `B = A X`, `X = aX + bB + c A B`: three products over the wide side
    /// (`6m²n` FLOPs): modded-nanogpt's records of 2024-10-10 to 2024-10-18.
    ThreeWide,
}

impl Iteration {
    /// Every form, for error messages.
    pub const ALL: [Iteration; 2] = [Iteration::SquareFirst, Iteration::ThreeWide];

    /// The name used in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Iteration::SquareFirst => "square-first",
            Iteration::ThreeWide => "three-wide",
        }
    }
}

impl fmt::Display for Iteration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Iteration {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        Iteration::ALL.into_iter().find(|o| o.name() == name).ok_or_else(|| {
            let valid: Vec<String> = Iteration::ALL.iter().map(|o| format!("{:?}", o.name())).collect();
            format!("unknown Newton-Schulz iteration {name:?}; valid: {}", valid.join(", "))
        })
    }
}

/// Which data-parallel ranks orthogonalise which matrices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Distribution {
    /// Every rank orthogonalises every matrix it holds (modded-nanogpt's `Muon` under DDP until
    /// 2024-10-17; Megatron-Core's `muon` without the layer-wise distributed optimizer).
    #[default]
    Replicated,
    /// Matrix `i` of a stage (in parameter order) is orthogonalised by data rank `i mod d`, which
    /// writes its update into a flat bf16 buffer zeroed beforehand; the buffers are summed by
    /// one all-reduce and every rank applies every update (modded-nanogpt's
    /// `2024-10-17_DistributedMuon`).
    RoundRobin,
}

impl Distribution {
    /// Every value, for error messages.
    pub const ALL: [Distribution; 2] = [Distribution::Replicated, Distribution::RoundRobin];

    /// The name used in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Distribution::Replicated => "replicated",
            Distribution::RoundRobin => "round-robin",
        }
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Distribution {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        Distribution::ALL.into_iter().find(|o| o.name() == name).ok_or_else(|| {
            let valid: Vec<String> = Distribution::ALL.iter().map(|o| format!("{:?}", o.name())).collect();
            format!("unknown Muon distribution {name:?}; valid: {}", valid.join(", "))
        })
    }
}

/// Muon's settings (`[workload.muon]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Muon {
    /// Newton-Schulz iterations per orthogonalisation (`steps`).
    pub steps: u32,
    /// The form of each iteration (`iteration`).
    pub iteration: Iteration,
    /// Which data ranks orthogonalise which matrices (`distribution`).
    pub distribution: Distribution,
}

impl Default for Muon {
    fn default() -> Muon {
        Muon { steps: DEFAULT_STEPS, iteration: Iteration::default(), distribution: Distribution::default() }
    }
}

/// The matrices (rows, columns) Muon orthogonalises in `layer`: the weight of a trained linear
/// layer inside a numbered block (a transformer layer's projections; not the embedding or the
/// output layer; a fused QKV projection with as many key and value heads as query heads as its
/// three matrices), and the two matrices of each expert of a bank (three when gated: gate, up
/// and down). Biases, norms and every layer outside the blocks go to AdamW.
pub fn matrices(layer: &Layer) -> Vec<(u64, u64)> {
    if !layer.cost.training.is_trained() || crate::model::structure::block_of(&layer.name).is_none() {
        return Vec::new();
    }
    let features = layer.input.0.last().copied().unwrap_or(0);
    match &layer.kind {
        // A fused QKV projection of as many keys and values as queries is three matrices:
        // modded-nanogpt splits its gradient (`g.split(g.size(1))` when `g.size(0) == 3 *
        // g.size(1)`) or has three layers; Megatron-Core splits it (`qkv_split_shapes`).
        LayerKind::Linear { out_features, .. }
            if features > 0 && layer.name.ends_with("attention.qkv") && *out_features == 3 * features =>
        {
            vec![(features, features); 3]
        }
        LayerKind::Linear { out_features, .. } if features > 0 => vec![(*out_features, features)],
        LayerKind::MoeExperts { experts, ffn_hidden, gated, .. } if features > 0 => {
            let inputs = if *gated { 2 } else { 1 };
            let mut each = vec![(*ffn_hidden, features); inputs];
            each.push((features, *ffn_hidden));
            (0..*experts).flat_map(|_| each.clone()).collect()
        }
        _ => Vec::new(),
    }
}

/// Parameters of [`matrices`] of `layer`.
pub fn matrix_parameters(layer: &Layer) -> u64 {
    matrices(layer).iter().map(|&(rows, cols)| rows.saturating_mul(cols)).sum()
}

/// Matrix-product FLOPs of one orthogonalisation of a `rows x cols` update.
pub fn newton_schulz_flops(muon: &Muon, rows: u64, cols: u64) -> f64 {
    let (m, n) = (rows.min(cols) as f64, rows.max(cols) as f64);
    let per_iteration = match muon.iteration {
        Iteration::SquareFirst => 4.0 * m * m * n + 2.0 * m * m * m,
        Iteration::ThreeWide => 6.0 * m * m * n,
    };
    f64::from(muon.steps) * per_iteration
}

fn gemm(m: u64, n: u64, k: u64) -> KernelWork {
    KernelWork::gemm(GemmShape::new(m, n, k), Dtype::Bf16)
}

fn streaming(class: OpClass, elements: u64, bytes_per_element: f64) -> KernelWork {
    KernelWork::flat(class, Dtype::Bf16, elements as f64, elements as f64 * bytes_per_element)
}

/// The kernels of one orthogonalisation of a `rows x cols` update held in fp32, in order, as
/// `torch.compile` runs `zeropower_via_newtonschulz5`: the cast to bf16 (4 bytes read, 2
/// written per element), the Frobenius norm (a reduction reading 2), the division by it (2 + 2),
/// then per iteration its products and the element-wise combination of each form
/// ([`Iteration`]: `bA + cA²` reads two `m x m` bf16 matrices and writes one, `aX + BX` two
/// `m x n` and one; `aX + bB + cAB` three and one).
pub fn newton_schulz_kernels(muon: &Muon, rows: u64, cols: u64) -> Vec<KernelWork> {
    let (m, n) = (rows.min(cols), rows.max(cols));
    let elements = m.saturating_mul(n);
    let mut kernels = vec![
        streaming(OpClass::Elementwise, elements, 6.0),
        streaming(OpClass::Reduction, elements, 2.0),
        streaming(OpClass::Elementwise, elements, 4.0),
    ];
    for _ in 0..muon.steps {
        match muon.iteration {
            Iteration::SquareFirst => {
                kernels.push(gemm(m, m, n));
                kernels.push(gemm(m, m, m));
                kernels.push(streaming(OpClass::Elementwise, m.saturating_mul(m), 6.0));
                kernels.push(gemm(m, n, m));
                kernels.push(streaming(OpClass::Elementwise, elements, 6.0));
            }
            Iteration::ThreeWide => {
                kernels.push(gemm(m, m, n));
                kernels.push(gemm(m, n, m));
                kernels.push(gemm(m, n, m));
                kernels.push(streaming(OpClass::Elementwise, elements, 8.0));
            }
        }
    }
    kernels
}

/// Per element of one matrix, the eager kernels before its orthogonalisation, as `Muon.step`
/// runs them on its fp32 momentum, with `gradient` bytes per gradient element:
/// `buf.mul_(momentum)` (read and write 4), `buf.add_(g)` (4 + g + 4), Nesterov's
/// `g.add(buf, alpha=momentum)` (g + 4 read, 4 written).
pub fn momentum_kernels(gradient: u64) -> Vec<f64> {
    let g = gradient as f64;
    vec![8.0, 8.0 + g, g + 8.0]
}

/// Per element of one matrix, the kernels that apply its orthogonalised bf16 update (`widths`:
/// the weights the update is added to and the compute copy written back, as the fused step's):
/// replicated, `p.add_(X, alpha)` (the weights read and written, 2 bytes of update read, the
/// compute copy written); round-robin, on the owner the scaling `g *= scale` (2 + 2) and the copy into the
/// flat buffer (2 + 2) before the all-reduce, and on every rank after it the cast back
/// (`type_as`: 2 read, the weights' width written) and the add.
pub fn apply_kernels(distribution: Distribution, widths: StepWidths) -> (Vec<f64>, Vec<f64>) {
    let master = widths.master as f64;
    let add = 2.0 * master + 2.0 + widths.copy as f64;
    match distribution {
        Distribution::Replicated => (vec![add], Vec::new()),
        Distribution::RoundRobin => (vec![4.0, 4.0], vec![2.0 + master, add + master - 2.0]),
    }
}

/// The times of one rank's Muon step over a stage's `matrices` (in parameter order).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTimes {
    /// Until the update is ready: replicated, every matrix's momentum, orthogonalisation and
    /// update; round-robin, the zeroed buffer and the busiest rank's own matrices (every rank
    /// waits for it at the all-reduce).
    pub before: SimDuration,
    /// Round-robin: the all-reduce's bytes (the flat bf16 buffer of every matrix) and the
    /// time to apply every update after it; `None` when replicated.
    pub exchange: Option<(u64, SimDuration)>,
    /// Matrix-product FLOPs of the busiest rank's orthogonalisations.
    pub flops: f64,
}

/// The kernel times of `kernels` on `device`, each at least the host's time to issue it
/// (`compute.dispatch-overhead`: Muon's loop over the parameters is Python, one launch per
/// kernel), summed.
fn issued(compute: &ComputeModel, device: &Device, kernels: &[KernelWork]) -> Result<f64, ComputeError> {
    let issue = compute.host_cost_per_kernel().as_secs_f64();
    kernels.iter().try_fold(0.0, |total, work| {
        Ok(total + compute.work_duration(device, work)?.as_secs_f64().max(issue))
    })
}

/// One rank's Muon step over `matrices` with `data` data-parallel ranks, `gradient` bytes per
/// gradient element and the weights' `widths`: see [`StepTimes`].
pub fn step_times(
    compute: &ComputeModel,
    device: &Device,
    muon: &Muon,
    matrices: &[(u64, u64)],
    data: u32,
    (gradient, widths): (u64, StepWidths),
) -> Result<StepTimes, ComputeError> {
    let per_element = |elements: u64, bytes: &[f64]| -> Vec<KernelWork> {
        bytes.iter().map(|&b| streaming(OpClass::Elementwise, elements, b)).collect()
    };
    let (own_apply, after_apply) = apply_kernels(muon.distribution, widths);
    // One matrix's kernels up to its update (the owner's part under round-robin).
    let own = |&(rows, cols): &(u64, u64)| -> Vec<KernelWork> {
        let elements = rows.saturating_mul(cols);
        let mut kernels = per_element(elements, &momentum_kernels(gradient));
        kernels.extend(newton_schulz_kernels(muon, rows, cols));
        kernels.extend(per_element(elements, &own_apply));
        kernels
    };
    let seconds = |s: f64| SimDuration::from_secs_f64(s).map_err(ComputeError::Duration);
    match muon.distribution {
        Distribution::Replicated => {
            let kernels: Vec<KernelWork> = matrices.iter().flat_map(own).collect();
            let flops = matrices.iter().map(|&(r, c)| newton_schulz_flops(muon, r, c)).sum();
            Ok(StepTimes { before: seconds(issued(compute, device, &kernels)?)?, exchange: None, flops })
        }
        Distribution::RoundRobin => {
            let ranks = data.max(1) as usize;
            let total: u64 = matrices.iter().map(|&(r, c)| r.saturating_mul(c)).sum();
            let zero = issued(compute, device, &[streaming(OpClass::Elementwise, total, 2.0)])?;
            let mut busiest = (0.0_f64, 0.0_f64);
            for rank in 0..ranks {
                let mine: Vec<&(u64, u64)> = matrices.iter().skip(rank).step_by(ranks).collect();
                let kernels: Vec<KernelWork> = mine.iter().flat_map(|m| own(m)).collect();
                let time = issued(compute, device, &kernels)?;
                if time > busiest.0 {
                    let flops = mine.iter().map(|&&(r, c)| newton_schulz_flops(muon, r, c)).sum();
                    busiest = (time, flops);
                }
            }
            let after: Vec<KernelWork> =
                matrices.iter().flat_map(|&(r, c)| per_element(r.saturating_mul(c), &after_apply)).collect();
            Ok(StepTimes {
                before: seconds(zero + busiest.0)?,
                exchange: Some((total.saturating_mul(2), seconds(issued(compute, device, &after)?)?)),
                flops: busiest.1,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::Shape;

    fn linear(name: &str, out: u64, input: u64) -> Layer {
        Layer::new(name, LayerKind::Linear { out_features: out, bias: false }, Shape::from([1024, input]))
            .unwrap()
    }

    #[test]
    fn only_the_blocks_matrices_are_orthogonalised() {
        assert_eq!(
            matrices(&linear("layers.0.attention.qkv", 2304, 768)),
            vec![(768, 768); 3],
            "q, k and v apart"
        );
        assert_eq!(
            matrices(&linear("layers.0.attention.qkv", 1280, 1024)),
            vec![(1280, 1024)],
            "grouped-query: one"
        );
        assert_eq!(matrices(&linear("layers.0.mlp.fc1", 3072, 768)), vec![(3072, 768)]);
        assert_eq!(matrices(&linear("lm_head", 50304, 768)), Vec::new(), "the output layer goes to AdamW");
        let mut frozen = linear("layers.0.mlp.fc1", 3072, 768);
        frozen.freeze(false);
        assert_eq!(matrices(&frozen), Vec::new());
    }

    /// The two forms' products, counted by hand: modded-nanogpt's 2024-10-10 record runs three
    /// `m x n` products per iteration, `6 m² n` FLOPs; the Muon repository's form `4 m² n + 2 m³`.
    #[test]
    fn newton_schulz_flops_are_the_products_of_each_form() {
        let three = Muon { iteration: Iteration::ThreeWide, ..Muon::default() };
        // GPT-2 124M's MLP input projection, 3072 x 768 (transposed: m = 768, n = 3072).
        assert_eq!(newton_schulz_flops(&three, 3072, 768), 5.0 * 6.0 * 768.0 * 768.0 * 3072.0);
        let square = Muon::default();
        assert_eq!(
            newton_schulz_flops(&square, 768, 3072),
            5.0 * (4.0 * 768f64.powi(2) * 3072.0 + 2.0 * 768f64.powi(3))
        );
        // The kernels carry exactly those FLOPs in their products.
        for muon in [three, square] {
            let products: f64 = newton_schulz_kernels(&muon, 3072, 768)
                .iter()
                .filter(|k| k.class == OpClass::Gemm)
                .map(|k| k.flops)
                .sum();
            assert_eq!(products, newton_schulz_flops(&muon, 3072, 768));
        }
    }

    #[test]
    fn round_robin_splits_the_products_and_exchanges_every_update() {
        let compute = ComputeModel {
            dispatch_overhead: SimDuration::ZERO,
            op_dispatch_overhead: SimDuration::ZERO,
            ..ComputeModel::default()
        };
        let device = crate::DeviceCatalog::builtin().get("h100-sxm5-80gb").unwrap().clone();
        let widths = (4, StepWidths::FP32);
        // Eight equal matrices over 8 ranks: each rank one; over 1 rank all eight.
        let matrices = vec![(768, 768); 8];
        let replicated = step_times(&compute, &device, &Muon::default(), &matrices, 8, widths).unwrap();
        let spread = Muon { distribution: Distribution::RoundRobin, ..Muon::default() };
        let split = step_times(&compute, &device, &spread, &matrices, 8, widths).unwrap();
        assert_eq!(split.flops * 8.0, replicated.flops);
        assert!(replicated.exchange.is_none());
        let (bytes, _) = split.exchange.unwrap();
        assert_eq!(bytes, 8 * 768 * 768 * 2, "the flat bf16 buffer of every matrix");
        assert!(split.before < replicated.before);
        // Nine matrices over 8 ranks: rank 0 holds two, and everyone waits for it.
        let nine = vec![(768, 768); 9];
        let uneven = step_times(&compute, &device, &spread, &nine, 8, widths).unwrap();
        assert_eq!(uneven.flops, 2.0 * newton_schulz_flops(&spread, 768, 768));
    }
}
