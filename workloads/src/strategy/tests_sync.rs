//! DASO and out-of-core training against closed forms, counting the bytes the flow model
//! carries on each link (the audit's per-link counter), not re-deriving them from the
//! lowering: DASO's inter-node traffic is 1/k of flat data parallelism's, and out-of-core
//! training moves twice the offloaded activations over the host link.

use sim_core::flow::FlowNetwork;
use sim_core::graph::CollectiveAlgorithm;
use topology::{ClusterSpec, IntraNode, LinkId, LinkSpec, NetworkSpec, Tier, Topology};

use super::*;
use crate::compute::ComputeModel;
use crate::device::DeviceCatalog;
use crate::layer::{LayerKind, Shape};
use crate::model::ModelBuilder;

/// `nodes` servers of `gpus` GPUs, each GPU with its own NIC on one switch and a host link.
fn cluster(nodes: u32, gpus: u32) -> Topology {
    let nvlink = LinkSpec::new("300 GB/s".parse().unwrap(), "0.7 us".parse().unwrap());
    let nic = LinkSpec::new("200 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    let host = LinkSpec::new("16 GB/s".parse().unwrap(), "1 us".parse().unwrap());
    Topology::build(&ClusterSpec {
        nodes,
        gpus_per_node: gpus,
        intra_node: IntraNode::NvSwitch(nvlink),
        network: NetworkSpec::single_switch(nic),
        host_memory: Some(host),
    })
    .unwrap()
}

/// Bytes the flow model (every message a flow) carried on the links of `tier`.
fn bytes_on(strategy: &Strategy<'_>, topology: &Topology, tier: Tier) -> f64 {
    let lowered = strategy.lower().unwrap();
    let mut network = FlowNetwork::new(topology).audited();
    sim_core::exec::run(&lowered.graph, &mut network).unwrap();
    let audit = network.audit().unwrap();
    assert_eq!(audit.violation, None);
    audit
        .link_bytes
        .iter()
        .enumerate()
        .filter(|(link, _)| topology.link(LinkId(*link as u32)).tier == tier)
        .map(|(_, bytes)| bytes)
        .sum()
}

/// A small CNN: convolutions with ReLUs, then a classifier.
fn small_cnn() -> Model {
    let mut builder = ModelBuilder::new("small-cnn", Shape::from([3, 32, 32]));
    for (i, channels) in [16u64, 32, 32].iter().enumerate() {
        builder
            .layer(
                format!("conv{i}"),
                LayerKind::Conv {
                    out_channels: *channels,
                    kernel: vec![3, 3],
                    stride: vec![1, 1],
                    padding: crate::layer::Padding::Symmetric(vec![1, 1]),
                    dilation: vec![1, 1],
                    groups: 1,
                    bias: false,
                },
            )
            .unwrap();
        builder
            .layer(format!("relu{i}"), LayerKind::Activation { function: crate::layer::Activation::Relu })
            .unwrap();
    }
    builder.layer("flatten", LayerKind::Flatten).unwrap();
    builder.layer("fc", LayerKind::Linear { out_features: 10, bias: true }).unwrap();
    builder.finish()
}

fn data_parallel<'a>(
    model: &'a Model,
    compute: &'a ComputeModel,
    parallelism: Parallelism,
    iterations: u32,
) -> Strategy<'a> {
    let global = u64::from(parallelism.data) * 8;
    Strategy {
        device: DeviceCatalog::builtin().get("a100-sxm4-40gb").unwrap(),
        optimizer: Optimizer::SgdMomentum,
        iterations,
        ..super::tests::strategy(model, compute, parallelism, global, 8)
    }
}

#[test]
fn daso_crosses_the_network_one_k_th_as_much_as_flat_data_parallelism() {
    let model = small_cnn();
    let compute = ComputeModel::default();
    let (nodes, gpus, every) = (4u32, 4u32, 4u32);
    let topology = cluster(nodes, gpus);
    let ranks = nodes * gpus;
    let flat_parallelism =
        Parallelism { data_algorithm: CollectiveAlgorithm::Ring, ..Parallelism::data_parallel(ranks) };
    let flat =
        bytes_on(&data_parallel(&model, &compute, flat_parallelism, every), &topology, Tier::NetworkEdge);
    for blocking in [false, true] {
        let daso = Parallelism {
            sync: GradientSync::Daso { every, blocking, wait: 1, node: gpus },
            ..flat_parallelism
        };
        let measured = bytes_on(&data_parallel(&model, &compute, daso, every), &topology, Tier::NetworkEdge);
        // A ring over P ranks moves 2(P-1)/P of the buffer over each of its hops; flat data
        // parallelism's rings cross the N node boundaries every iteration, DASO's ring of one GPU
        // per node crosses them once per k iterations with every hop between nodes:
        // (2 (N-1)/N S N / k) / (2 (P-1)/P S N) = (N-1) P / (N (P-1) k), which tends to 1/k.
        let (n, p) = (f64::from(nodes), f64::from(ranks));
        let expected = (n - 1.0) * p / (n * (p - 1.0)) / f64::from(every);
        let ratio = measured / flat;
        assert!(
            (ratio / expected - 1.0).abs() < 1e-6,
            "blocking {blocking}: DASO/flat inter-node bytes {ratio:.6}, expected {expected:.6} (1/k = {})",
            1.0 / f64::from(every)
        );
    }
}

#[test]
fn daso_intervals_are_waited_for_only_where_the_mode_says() {
    let model = small_cnn();
    let compute = ComputeModel::default();
    let topology = cluster(2, 4);
    let time = |blocking: bool| {
        let parallelism = Parallelism {
            sync: GradientSync::Daso { every: 2, blocking, wait: 1, node: 4 },
            ..Parallelism::data_parallel(8)
        };
        let lowered = data_parallel(&model, &compute, parallelism, 4).lower().unwrap();
        let timeline = sim_core::fidelity::NetworkSettings::new(sim_core::fidelity::Fidelity::Flow)
            .run(&lowered.graph, &topology)
            .unwrap();
        lowered.iteration_ends.last().unwrap().iter().map(|op| timeline.end[op.0 as usize]).max().unwrap()
    };
    assert!(time(false) <= time(true), "non-blocking DASO is not faster than blocking");
}

#[test]
fn out_of_core_moves_twice_the_offloaded_activations_over_the_host_link() {
    let model = small_cnn();
    let compute = ComputeModel::default();
    let topology = cluster(1, 2);
    let parallelism = Parallelism { offload: Offload::Activations, ..Parallelism::data_parallel(2) };
    let strategy = data_parallel(&model, &compute, parallelism, 1);
    let moved = bytes_on(&strategy, &topology, Tier::HostMemory);
    // The memory model's activations of one micro-batch, without offloading.
    let activations = strategy.memory_plan(&model, Bytes::ZERO).activations().total();
    assert!(activations > 0);
    assert_eq!(moved, 2.0 * 2.0 * activations as f64, "2 GPUs x 2 directions x activations");
    // The device keeps only the window in transit.
    let lowered = strategy.lower().unwrap();
    let held = lowered.stages[0].memory.activations.0;
    assert!(held < activations, "the device holds {held} of {activations} activation bytes");
    assert_eq!(lowered.offload.unwrap().to_host_bytes, activations);
}

#[test]
fn daso_and_offload_refuse_what_they_do_not_model_with_the_key() {
    let model = small_cnn();
    let compute = ComputeModel::default();
    let refused = |parallelism: Parallelism, iterations: u32| -> (String, String) {
        match data_parallel(&model, &compute, parallelism, iterations).check() {
            Err(StrategyError::Invalid { key, message }) => (key.to_string(), message),
            other => panic!("{parallelism:?} not refused: {other:?}"),
        }
    };
    let daso = |every, node| GradientSync::Daso { every, blocking: false, wait: 1, node };
    let (key, message) = refused(Parallelism { sync: daso(4, 1), ..Parallelism::data_parallel(8) }, 4);
    assert_eq!(key, "parallelism.sync");
    assert!(message.contains("gpus-per-node = 1"), "{message}");
    let (key, message) = refused(Parallelism { sync: daso(4, 4), ..Parallelism::data_parallel(8) }, 6);
    assert_eq!(key, "simulation.iterations");
    assert!(message.contains("iterations = 4, 8, 12"), "{message}");
    let (key, message) =
        refused(Parallelism { sync: daso(4, 4), spatial: 2, ..Parallelism::data_parallel(4) }, 4);
    assert_eq!(key, "parallelism.sync");
    assert!(message.contains("spatial = 2"), "{message}");
    let (key, _) = refused(Parallelism { sync: daso(4, 4), ..Parallelism::data_parallel(4) }, 4);
    assert_eq!(key, "parallelism.sync", "one node");
    let (key, message) = refused(
        Parallelism { offload: Offload::Activations, pipeline: 2, ..Parallelism::data_parallel(1) },
        1,
    );
    assert_eq!(key, "workload.offload");
    assert!(message.contains("pipeline = 2"), "{message}");
}
