//! Muon ([`workloads::muon`]) against closed forms: its state is one momentum per orthogonalised
//! parameter and AdamW's two moments for the rest; spread round-robin, the network carries one
//! more all-reduce of every update in bf16; its step is longer than AdamW's by the
//! orthogonalisations; and what it is not modelled with is refused.

use sim_core::fidelity::{Fidelity, NetworkSettings};
use sim_core::graph::CollectiveAlgorithm;
use topology::Tier;

use super::tests_lora::cluster;
use super::tests_sync::bytes_on;

use super::*;
use workloads::compute::ComputeModel;
use workloads::device::DeviceCatalog;
use workloads::muon::{Distribution, Muon};
use workloads::zoo;

fn muon<'a>(
    model: &'a Model,
    compute: &'a ComputeModel,
    parallelism: Parallelism,
    distribution: Distribution,
) -> Strategy<'a> {
    let global = u64::from(parallelism.data) * 2;
    Strategy {
        optimizer: Optimizer::Muon,
        muon: Muon { distribution, ..Muon::default() },
        ..super::tests::strategy(model, compute, parallelism, global, 1)
    }
}

/// GPT 1.7B's block weights: 24 layers of qkv (3h x h), projection (h x h) and MLP (4h x h
/// twice), 12 h² each.
const ORTHOGONALISED: u64 = 24 * 12 * 2304 * 2304;

#[test]
fn muon_keeps_one_momentum_for_the_matrices_and_two_moments_for_the_rest() {
    let model = zoo::by_name("megatron-1.7b").unwrap();
    let orthogonalised: u64 = model.layers.iter().map(workloads::muon::matrix_parameters).sum();
    assert_eq!(orthogonalised, ORTHOGONALISED);
    let compute = ComputeModel::default();
    let p = Parallelism::data_parallel(2);
    let adam = super::tests::strategy(&model, &compute, p, 4, 1).lower().unwrap();
    let with_muon = muon(&model, &compute, p, Distribution::Replicated).lower().unwrap();
    // fp32 states: the matrices drop Adam's second moment, 4 bytes each.
    let saved = adam.stages[0].memory.optimizer.0 - with_muon.stages[0].memory.optimizer.0;
    assert_eq!(saved, 4 * ORTHOGONALISED);
    // The step is longer: every rank orthogonalises every matrix (5 iterations of products).
    let step = |lowered: &Lowered| {
        lowered
            .graph
            .ops()
            .iter()
            .filter(|op| op.meta.pass() == Some(sim_core::graph::Pass::Optimizer))
            .count()
    };
    assert_eq!(step(&adam), step(&with_muon), "one optimizer op per rank, replicated");
    let time = |s: &Strategy<'_>| {
        let lowered = s.lower().unwrap();
        NetworkSettings::new(Fidelity::Analytical)
            .run(&lowered.graph, &super::tests::dgx(1))
            .unwrap()
            .makespan()
    };
    let adam_time = time(&super::tests::strategy(&model, &compute, p, 4, 1));
    let muon_time = time(&muon(&model, &compute, p, Distribution::Replicated));
    // At least the products' FLOPs at the bf16 peak: 5 x (4 m² n + 2 m³) per matrix.
    let flops: f64 = model
        .layers
        .iter()
        .flat_map(workloads::muon::matrices)
        .map(|(rows, cols)| workloads::muon::newton_schulz_flops(&Muon::default(), rows, cols))
        .sum();
    let peak =
        DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap().peak(Dtype::Bf16).unwrap().per_second();
    assert!(
        (muon_time.as_secs_f64() - adam_time.as_secs_f64()) > flops / peak,
        "{muon_time} against {adam_time}: the products alone take {} s",
        flops / peak
    );
}

#[test]
fn round_robin_adds_one_allreduce_of_every_update_in_bf16() {
    let model = zoo::by_name("megatron-1.7b").unwrap();
    let compute = ComputeModel::default();
    let topology = cluster(4);
    let p = Parallelism { data_algorithm: CollectiveAlgorithm::Ring, ..Parallelism::data_parallel(8) };
    let replicated =
        bytes_on(&muon(&model, &compute, p, Distribution::Replicated), &topology, Tier::NetworkEdge);
    let spread = bytes_on(&muon(&model, &compute, p, Distribution::RoundRobin), &topology, Tier::NetworkEdge);
    // A ring all-reduce moves 2 (P-1)/P of its buffer over each hop: the extra bytes are to the
    // gradients' (fp32, every parameter) as 2 bytes per matrix element are to 4 per parameter.
    let expected = (2 * ORTHOGONALISED) as f64 / (4 * model.parameters()) as f64;
    assert!(
        ((spread - replicated) / replicated / expected - 1.0).abs() < 1e-9,
        "{spread} {replicated} {expected}"
    );
}

#[test]
fn muon_is_refused_where_ranks_hold_parts_of_a_matrix() {
    let model = zoo::by_name("megatron-1.7b").unwrap();
    let compute = ComputeModel::default();
    for (p, distribution, key) in [
        (
            Parallelism { tensor: 2, ..Parallelism::data_parallel(2) },
            Distribution::Replicated,
            "parallelism.tensor",
        ),
        (
            Parallelism { zero: 1, ..Parallelism::data_parallel(2) },
            Distribution::Replicated,
            "parallelism.zero",
        ),
        (
            Parallelism { context: 2, ..Parallelism::data_parallel(2) },
            Distribution::RoundRobin,
            "parallelism.context",
        ),
    ] {
        let error = muon(&model, &compute, p, distribution).lower().unwrap_err().to_string();
        assert!(error.contains(key) && error.contains("muon"), "{error}");
    }
    // A pipeline is fine: each stage orthogonalises its own blocks' matrices.
    let pipelined = Parallelism { pipeline: 2, ..Parallelism::data_parallel(2) };
    assert!(muon(&model, &compute, pipelined, Distribution::RoundRobin).lower().is_ok());
}
