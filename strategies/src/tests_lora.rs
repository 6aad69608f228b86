//! LoRA fine-tuning ([`workloads::lora`]) against closed forms: the network carries the
//! adapters' gradients alone (the ring's bytes scale with the trained parameters), no frozen
//! layer runs a weight-gradient kernel, nothing below the first adapter runs a backward, and
//! memory holds every weight but gradients and optimizer state for the adapters only.

use sim_core::graph::{CollectiveAlgorithm, OpKind, Pass as GraphPass};
use sim_core::units::SimDuration;
use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Tier, Topology};

use super::tests_sync::bytes_on;

use super::*;
use workloads::compute::ComputeModel;
use workloads::lora::{Lora, apply};
use workloads::zoo;

/// GPT 1.7B (24 layers, hidden 2304, tied embedding) with rank-16 adapters on its qkv
/// projections.
fn tuned() -> (Model, Model) {
    let model = zoo::by_name("megatron-1.7b").unwrap();
    let lora = Lora { rank: 16, targets: vec!["attention.qkv".into()] };
    let tuned = apply(&model, &lora).unwrap();
    (model, tuned)
}

/// `nodes` servers of 2 GPUs on one switch, one NIC per GPU.
pub(super) fn cluster(nodes: u32) -> Topology {
    let nvlink = LinkSpec::new("300 GB/s".parse().unwrap(), "0.7 us".parse().unwrap());
    let nic = LinkSpec::new("200 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    Topology::build(&ClusterSpec {
        nodes,
        gpus_per_node: 2,
        intra_node: IntraNode::NvSwitch(nvlink),
        network: NetworkSpec::single_switch(nic),
        host_memory: None,
    })
    .unwrap()
}

fn strategy<'a>(model: &'a Model, compute: &'a ComputeModel, parallelism: Parallelism) -> Strategy<'a> {
    let global = u64::from(parallelism.data) * 2;
    super::tests::strategy(model, compute, parallelism, global, 1)
}

#[test]
fn the_network_carries_the_adapters_gradients_alone() {
    let (model, tuned) = tuned();
    let compute = ComputeModel::default();
    let topology = cluster(4);
    let parallelism =
        Parallelism { data_algorithm: CollectiveAlgorithm::Ring, ..Parallelism::data_parallel(8) };
    let full = bytes_on(&strategy(&model, &compute, parallelism), &topology, Tier::NetworkEdge);
    let lora = bytes_on(&strategy(&tuned, &compute, parallelism), &topology, Tier::NetworkEdge);
    // A ring all-reduce moves 2 (P-1)/P of its buffer over each hop whatever the buckets: the
    // bytes scale with the gradients, here the adapters' 24 x 16 x (2304 + 3 x 2304).
    let trained = 24 * 16 * (2304 + 3 * 2304);
    assert_eq!(tuned.parameters(), trained);
    let expected = trained as f64 / model.parameters() as f64;
    assert!(
        (lora / full / expected - 1.0).abs() < 1e-9,
        "LoRA/full network bytes {:.6e}, trained/all parameters {expected:.6e}",
        lora / full
    );
}

#[test]
fn no_frozen_layer_runs_a_weight_gradient_and_nothing_below_the_first_adapter_a_backward() {
    let (_, tuned) = tuned();
    let compute = ComputeModel::default();
    let parallelism = Parallelism::data_parallel(2);
    let lowered = strategy(&tuned, &compute, parallelism).lower().unwrap();
    let kernels = |pass: GraphPass| -> Vec<usize> {
        lowered
            .graph
            .ops()
            .iter()
            .filter(|op| op.rank.0 == 0 && matches!(op.kind, OpKind::Compute { .. }))
            .filter(|op| op.meta.pass() == Some(pass))
            .filter_map(|op| op.meta.layer().map(|layer| layer as usize))
            .collect()
    };
    let adapters: Vec<usize> = tuned
        .layers
        .iter()
        .enumerate()
        .filter(|(_, layer)| matches!(layer.kind, workloads::layer::LayerKind::LoraAdapter { .. }))
        .map(|(index, _)| index)
        .collect();
    assert_eq!(adapters.len(), 24);
    // Weight-gradient work (kernels and their accumulation) of the adapters alone.
    let mut weights = kernels(GraphPass::BackwardWeight);
    weights.sort_unstable();
    weights.dedup();
    assert_eq!(weights, adapters);
    // The embedding and the first block's norm sit below the first adapter.
    let mut data = kernels(GraphPass::BackwardData);
    data.sort_unstable();
    data.dedup();
    let first = adapters[0];
    assert!(
        data.iter().all(|&layer| layer >= first - 1),
        "backward-data kernels below the first adapter: {data:?}"
    );
    // Every frozen linear layer still computes its input gradient.
    let frozen_linears = tuned
        .layers
        .iter()
        .enumerate()
        .filter(|(index, layer)| {
            *index > first && matches!(layer.kind, workloads::layer::LayerKind::Linear { .. })
        })
        .count();
    let linear_data = data
        .iter()
        .filter(|&&layer| matches!(tuned.layers[layer].kind, workloads::layer::LayerKind::Linear { .. }))
        .count();
    assert_eq!(linear_data, frozen_linears + 1, "the first adapted qkv too");
}

#[test]
fn memory_holds_every_weight_but_trains_only_the_adapters() {
    let (model, tuned) = tuned();
    let compute = ComputeModel::default();
    let parallelism = Parallelism::data_parallel(2);
    let memory = |model: &Model| {
        strategy(model, &compute, parallelism).estimate(&|_| SimDuration::ZERO).unwrap().peak_memory()
    };
    let (full, lora) = (memory(&model), memory(&tuned));
    let (all, trained) = (model.parameters(), tuned.parameters());
    assert_eq!(tuned.frozen_parameters(), all);
    // fp16 weights (2 bytes) for every parameter, frozen or not; fp32 gradients (4) and Adam's
    // fp32 master copy and two moments (12) for the trained ones alone.
    assert_eq!(full.weights.0, 2 * all);
    assert_eq!(lora.weights.0, 2 * (all + trained));
    assert_eq!(lora.gradients.0, 4 * trained);
    assert_eq!(lora.optimizer.0, 12 * trained);
    assert_eq!(full.optimizer.0, 12 * all);
}
