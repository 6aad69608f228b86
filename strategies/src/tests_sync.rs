//! DASO and out-of-core training against closed forms, counting the bytes the flow model
//! carries on each link (the audit's per-link counter), not re-deriving them from the
//! lowering: DASO's inter-node traffic is 1/k of flat data parallelism's, out-of-core
//! training moves twice the offloaded activations over the host link, and out-of-core
//! weights add the weights twice, the gradients and the optimizer's stream.

use sim_core::flow::FlowNetwork;
use sim_core::graph::CollectiveAlgorithm;
use topology::{ClusterSpec, IntraNode, LinkId, LinkSpec, NetworkSpec, Tier, Topology};

use super::*;
use workloads::compute::ComputeModel;
use workloads::device::{DeviceCatalog, Dtype};
use workloads::layer::{LayerKind, Shape};
use workloads::model::ModelBuilder;

/// `nodes` servers of `gpus` GPUs, each GPU with its own NIC on one switch and a host link.
fn cluster(nodes: u32, gpus: u32) -> Topology {
    cluster_with_host_link(nodes, gpus, "16 GB/s", "1 us")
}

/// [`cluster`] with the host link's bandwidth and latency.
fn cluster_with_host_link(nodes: u32, gpus: u32, bandwidth: &str, latency: &str) -> Topology {
    let nvlink = LinkSpec::new("300 GB/s".parse().unwrap(), "0.7 us".parse().unwrap());
    let nic = LinkSpec::new("200 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    let host = LinkSpec::new(bandwidth.parse().unwrap(), latency.parse().unwrap());
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
pub(super) fn bytes_on(strategy: &Strategy<'_>, topology: &Topology, tier: Tier) -> f64 {
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
    for (i, channels) in [16u64, 32, 32, 32, 32].iter().enumerate() {
        builder
            .layer(
                format!("conv{i}"),
                LayerKind::Conv {
                    out_channels: *channels,
                    kernel: vec![3, 3],
                    stride: vec![1, 1],
                    padding: workloads::layer::Padding::Symmetric(vec![1, 1]),
                    dilation: vec![1, 1],
                    groups: 1,
                    bias: false,
                },
            )
            .unwrap();
        builder
            .layer(format!("relu{i}"), LayerKind::Activation { function: workloads::layer::Activation::Relu })
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
fn out_of_core_weights_move_activations_weights_gradients_and_the_optimizer_state() {
    let model = small_cnn();
    let compute = ComputeModel::default();
    let topology = cluster(1, 2);
    let parameters: u64 = model.layers.iter().map(|l| l.cost.params).sum();
    // The first convolution's backward computes only its weight gradient: no weight prefetch.
    let first = model.layers[0].cost.params;
    assert!(first > 0 && parameters > first);
    // (precision, working weight, gradient, master copy) bytes; SGD with momentum: one fp32
    // state. Gradients in fp32.
    for (precision, weight, master) in [(Dtype::Fp16, 2u64, 4u64), (Dtype::Fp32, 4, 0)] {
        let (gradient, states) = (4u64, 4u64);
        let parallelism =
            Parallelism { offload: Offload::ActivationsAndWeights, ..Parallelism::data_parallel(2) };
        let strategy = Strategy { precision, ..data_parallel(&model, &compute, parallelism, 1) };
        let moved = bytes_on(&strategy, &topology, Tier::HostMemory);
        let activations = strategy.memory_plan(&model, Bytes::ZERO).activations().total();
        // Weights before every forward and before every backward but the first layer's.
        let weights = weight * (2 * parameters - first);
        // The optimizer streams in the gradient, the fp32 weight (the master copy, or the
        // weight itself in fp32) and the state; out the fp32 weight, the state and the working
        // weight when it is narrower.
        let fp32_weight = if master > 0 { master } else { weight };
        let optimizer_in = parameters * (gradient + fp32_weight + states);
        let optimizer_out = parameters * (fp32_weight + states + if master > 0 { weight } else { 0 });
        let per_gpu = 2 * activations + weights + gradient * parameters + optimizer_in + optimizer_out;
        assert_eq!(moved, 2.0 * per_gpu as f64, "{precision:?}: 2 GPUs x {per_gpu} bytes");
        let lowered = strategy.lower().unwrap();
        let totals = lowered.offload.unwrap();
        assert_eq!(
            totals.to_host_bytes + totals.to_device_bytes,
            per_gpu,
            "{precision:?}: the report's totals"
        );
        assert_eq!(
            (totals.weight_bytes, totals.gradient_bytes, totals.optimizer_to_device_bytes),
            (weights, gradient * parameters, optimizer_in)
        );
        // Host memory: one micro-batch's activations and the whole model state.
        assert_eq!(
            totals.host_bytes,
            activations + parameters * (weight + gradient + master + states),
            "{precision:?}: host bytes"
        );
        // The device keeps four layers' weights and two layers' gradients, not the model's.
        let memory = lowered.stages[0].memory;
        let mut sizes: Vec<u64> = model.layers.iter().map(|l| l.cost.params).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(
            memory.weights.0,
            sizes[..4].iter().sum::<u64>() * weight,
            "{precision:?}: weights window"
        );
        assert_eq!(memory.gradients.0, (sizes[0] + sizes[1]) * gradient, "{precision:?}: gradients window");
        assert!(memory.weights < totals.without.weights, "{precision:?}");
        // The optimizer's buffers: one chunk here (a small model), with its gradients, fp32
        // weights, states and working weights.
        assert_eq!(memory.optimizer.0, parameters * (weight + gradient + master + states), "{precision:?}");
    }
}

#[test]
fn out_of_core_with_tensor_parallelism_moves_each_ranks_own_share() {
    // Under a tensor split each rank copies out what it holds: its layers' activations as the
    // memory model counts them for it, and with the weights its shard of the weights,
    // gradients and optimizer state; the host links carry both ranks' copies.
    let model = workloads::zoo::by_name("bert-base").unwrap();
    let compute = ComputeModel::default();
    let topology = cluster(1, 2);
    for offload in [Offload::Activations, Offload::ActivationsAndWeights] {
        let lower = |tensor: u32| {
            let parallelism = Parallelism { offload, tensor, ..Parallelism::data_parallel(1) };
            let strategy = Strategy {
                device: DeviceCatalog::builtin().get("a100-sxm4-40gb").unwrap(),
                ..super::tests::strategy(&model, &compute, parallelism, 1, 1)
            };
            let lowered = strategy.lower().unwrap();
            let moved = bytes_on(&strategy, &topology, Tier::HostMemory);
            (lowered, moved)
        };
        let (whole, _) = lower(1);
        let (split, moved) = lower(2);
        let (one, two) = (whole.offload.unwrap(), split.offload.unwrap());
        assert_eq!(moved, 2.0 * (two.to_host_bytes + two.to_device_bytes) as f64, "{offload:?}");
        // The products' activations and weights halve; the norms' and the embeddings' do not.
        assert!(
            two.to_host_bytes < one.to_host_bytes && 2 * two.to_host_bytes > one.to_host_bytes,
            "{offload:?}: {} of {}",
            two.to_host_bytes,
            one.to_host_bytes
        );
        let activations = |totals: &crate::OffloadTotals| totals.without.activations.0;
        assert!(activations(&two) < activations(&one));
        if offload == Offload::Activations {
            assert_eq!(two.to_host_bytes, activations(&two), "one micro-batch's activations of the rank");
        } else {
            // Gradients out: the rank's parameters, in fp32.
            assert_eq!(two.gradient_bytes, split.stages[0].parameters * 4);
            assert!(split.stages[0].parameters < whole.stages[0].parameters);
        }
    }
}

#[test]
fn out_of_core_on_a_pipeline_moves_each_stages_activations_per_micro_batch() {
    // Each stage's GPU copies out, and back, its own layers' activations of every micro-batch;
    // host memory holds those of the micro-batches it has in flight; the report's totals are
    // the busiest stage's.
    let model = workloads::zoo::by_name("bert-base").unwrap();
    let compute = ComputeModel::default();
    let topology = cluster(1, 4);
    let micro_batches = 8u64;
    let parallelism =
        Parallelism { offload: Offload::Activations, pipeline: 4, ..Parallelism::data_parallel(1) };
    let strategy = Strategy {
        device: DeviceCatalog::builtin().get("a100-sxm4-40gb").unwrap(),
        ..super::tests::strategy(&model, &compute, parallelism, micro_batches, 1)
    };
    let lowered = strategy.lower().unwrap();
    let per_layer = strategy.memory_plan(&model, Bytes::ZERO).activations_per_layer();
    let per_stage: Vec<u64> = lowered
        .stages
        .iter()
        .map(|stage| stage.layers.iter().flat_map(|r| r.clone()).map(|l| per_layer[l]).sum())
        .collect();
    assert!(per_stage.iter().all(|&bytes| bytes > 0), "{per_stage:?}");
    let moved = bytes_on(&strategy, &topology, Tier::HostMemory);
    let expected: u64 = per_stage.iter().map(|bytes| 2 * bytes * micro_batches).sum();
    assert_eq!(moved, expected as f64, "every stage's activations out and back, per micro-batch");
    let totals = lowered.offload.unwrap();
    let busiest = *per_stage.iter().max().unwrap();
    assert_eq!(totals.activation_bytes, busiest * micro_batches);
    let host = lowered
        .stages
        .iter()
        .zip(&per_stage)
        .map(|(stage, bytes)| bytes * stage.peak_micro_batches_in_flight.ceil() as u64)
        .max()
        .unwrap();
    assert_eq!(totals.host_bytes, host);
    // 1F1B: stage 0 holds 4 micro-batches in flight, the last one.
    assert_eq!(lowered.stages[0].peak_micro_batches_in_flight, 4.0);
    // The device holds at most two windows (one each way) of twice the largest layer's.
    let largest = per_layer.iter().copied().max().unwrap();
    for stage in &lowered.stages {
        assert!(stage.memory.activations.0 <= 4 * largest, "stage {}", stage.stage);
    }
    // The weights stay on the device on a pipeline.
    let weights = Parallelism { offload: Offload::ActivationsAndWeights, ..parallelism };
    let error = super::tests::strategy(&model, &compute, weights, micro_batches, 1).check().unwrap_err();
    assert!(error.to_string().contains("pipeline = 4 is not modelled"), "{error}");
}

/// With a host link no copy waits for, out-of-core weights cost no time: every kernel runs as
/// it would with the model on the device. Kernels replayed from a CUDA graph, so that the host
/// thread issues no copy either: in eager mode each copy is one more host dispatch, and this
/// small CNN's iteration is bound by its host thread.
#[test]
fn out_of_core_weights_over_an_infinitely_fast_host_link_cost_nothing() {
    let model = small_cnn();
    let compute = ComputeModel { cuda_graphs: true, ..ComputeModel::default() };
    let topology = cluster_with_host_link(1, 2, "1000000 TB/s", "0 s");
    let time = |offload: Offload| {
        let parallelism = Parallelism { offload, ..Parallelism::data_parallel(2) };
        iteration_end_s(&data_parallel(&model, &compute, parallelism, 3), &topology)
    };
    let resident = time(Offload::None);
    for offload in [Offload::Activations, Offload::ActivationsAndWeights] {
        let offloaded = time(offload);
        assert!(
            (offloaded / resident - 1.0).abs() < 1e-6,
            "{offload:?}: {offloaded} s against {resident} s with everything on the device"
        );
    }
    // Over a real link the weights cost time.
    let slow = cluster_with_host_link(1, 2, "1 GB/s", "1 us");
    let parallelism =
        Parallelism { offload: Offload::ActivationsAndWeights, ..Parallelism::data_parallel(2) };
    let lowered = data_parallel(&model, &compute, parallelism, 3).lower().unwrap();
    let timeline = sim_core::fidelity::NetworkSettings::new(sim_core::fidelity::Fidelity::Flow)
        .run(&lowered.graph, &slow)
        .unwrap();
    let end = lowered.iteration_ends.last().unwrap().iter().map(|op| timeline.end[op.0 as usize]).max();
    assert!(end.unwrap().since_start().as_secs_f64() > resident * 1.01);
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
        Parallelism { offload: Offload::Activations, context: 2, ..Parallelism::data_parallel(1) },
        1,
    );
    assert_eq!(key, "workload.offload");
    assert!(message.contains("context = 2"), "{message}");
    let weights = Offload::ActivationsAndWeights;
    let (key, message) =
        refused(Parallelism { offload: weights, zero: 1, ..Parallelism::data_parallel(2) }, 1);
    assert_eq!(key, "workload.offload");
    assert!(message.contains("zero = 1"), "{message}");
    let (key, message) =
        refused(Parallelism { offload: weights, sync: daso(4, 4), ..Parallelism::data_parallel(8) }, 4);
    assert_eq!(key, "workload.offload");
    assert!(message.contains("sync = \"allreduce\""), "{message}");
    // Gradient accumulation: 16 samples over 2 replicas in micro-batches of 8.
    let accumulating = Strategy {
        global_batch: 32,
        ..data_parallel(
            &model,
            &compute,
            Parallelism { offload: weights, ..Parallelism::data_parallel(2) },
            1,
        )
    };
    match accumulating.check() {
        Err(StrategyError::Invalid { key, message }) => {
            assert_eq!(key, "workload.offload");
            assert!(message.contains("2 micro-batches") && message.contains("global-batch"), "{message}");
        }
        other => panic!("gradient accumulation not refused: {other:?}"),
    }
    // Activations alone accumulate as before.
    let activations = Strategy {
        global_batch: 32,
        ..data_parallel(
            &model,
            &compute,
            Parallelism { offload: Offload::Activations, ..Parallelism::data_parallel(2) },
            1,
        )
    };
    assert!(activations.check().is_ok());
}

/// When the last iteration of `strategy` ends on `topology` under the flow model, in seconds.
fn iteration_end_s(strategy: &Strategy<'_>, topology: &Topology) -> f64 {
    let lowered = strategy.lower().unwrap();
    let timeline = sim_core::fidelity::NetworkSettings::new(sim_core::fidelity::Fidelity::Flow)
        .run(&lowered.graph, topology)
        .unwrap();
    let end = lowered.iteration_ends.last().unwrap().iter().map(|op| timeline.end[op.0 as usize]).max();
    end.unwrap().since_start().as_secs_f64()
}

/// A host CPU of `bandwidth` memory bandwidth for tests (the catalog's ABCI node otherwise).
fn host_cpu(bandwidth: &str) -> workloads::device::Device {
    let mut cpu = DeviceCatalog::builtin().get("xeon-6148-2s").unwrap().clone();
    cpu.memory_bandwidth = bandwidth.parse().unwrap();
    cpu
}

#[test]
fn a_host_optimizer_moves_its_shard_and_steps_at_the_host_cpus_memory_rate() {
    // ZeRO-Offload: each GPU copies its synchronised gradients (its ZeRO-2 shard) to host
    // memory and gets its updated working weights back; the step runs on the host CPU at a rate
    // set by its memory bandwidth; the device keeps no optimizer state.
    let model = workloads::zoo::by_name("bert-base").unwrap();
    let compute = ComputeModel::default();
    let topology = cluster(1, 2);
    let parameters: u64 = model.layers.iter().map(|l| l.cost.params).sum();
    let cpu = host_cpu("64 GB/s");
    let fast = host_cpu("128 GB/s");
    for zero in [0u8, 2] {
        let parallelism = Parallelism { offload: Offload::Optimizer, zero, ..Parallelism::data_parallel(2) };
        let strategy = Strategy {
            precision: Dtype::Fp16,
            host_cpu: Some(&cpu),
            ..data_parallel(&model, &compute, parallelism, 1)
        };
        let lowered = strategy.lower().unwrap();
        let totals = lowered.offload.unwrap();
        let shard = if zero > 0 { 2 } else { 1 };
        let held = parameters.div_ceil(shard);
        // fp16 working weights; gradients in fp32 (the helper's strategy).
        let gradient = strategy.gradient_precision.bytes();
        assert_eq!(totals.weight_bytes, held * 2, "zero {zero}: updated weights back");
        let gradients = totals.gradient_bytes as f64;
        let expected = (gradient * parameters) as f64 / shard as f64;
        assert!((gradients / expected - 1.0).abs() < 1e-4, "zero {zero}: {gradients} against {expected}");
        assert_eq!(totals.activation_bytes, 0);
        // Both GPUs' copies, each way, on the host links.
        let moved = bytes_on(&strategy, &topology, Tier::HostMemory);
        assert_eq!(moved, 2.0 * (totals.to_host_bytes + totals.to_device_bytes) as f64, "zero {zero}");
        assert_eq!(
            totals.to_host_bytes + totals.to_device_bytes,
            totals.gradient_bytes + totals.weight_bytes
        );
        // The device keeps no optimizer state; without offloading it would.
        let memory = lowered.stages[0].memory;
        assert_eq!(memory.optimizer, Bytes::ZERO, "zero {zero}");
        assert!(totals.without.optimizer > Bytes::ZERO, "zero {zero}");
        // The host keeps the fp32 weights, the states (one for SGD with momentum) and the
        // gradients of what it steps.
        assert_eq!(totals.host_bytes, held * (4 + 4 + gradient), "zero {zero}: host bytes");
        // A memory-bound step: twice the host's memory bandwidth, half the time (the compute
        // model's ramp aside), and ZeRO-2 halves what each rank steps.
        let faster = Strategy { host_cpu: Some(&fast), ..strategy.clone() }.lower().unwrap();
        let ratio = totals.host_step.as_secs_f64() / faster.offload.unwrap().host_step.as_secs_f64();
        assert!((1.95..=2.0 + 1e-9).contains(&ratio), "zero {zero}: bandwidth x2 gives step / {ratio}");
        let step = compute
            .optimizer_step_duration(
                &cpu,
                &workloads::compute::OptimizerStep {
                    optimizer: strategy.optimizer,
                    parameters: held,
                    tensors: 1,
                    fused: true,
                    gradient_bytes: gradient,
                    widths: strategy.step_widths(),
                    passes: workloads::optimizer::OptimizerPasses::Fused,
                },
            )
            .unwrap();
        let chunked = totals.host_step.as_secs_f64();
        assert!(
            (chunked / step.as_secs_f64() - 1.0).abs() < 0.01,
            "zero {zero}: {chunked} s in chunks, {step} at once"
        );
        // The iteration waits for the host's step: longer than on the GPU by about its time.
        let resident = Strategy {
            parallelism: Parallelism { offload: Offload::None, ..parallelism },
            ..strategy.clone()
        };
        let time = |s: &Strategy<'_>| iteration_end_s(s, &topology);
        let (offloaded, on_device) = (time(&strategy), time(&resident));
        assert!(
            offloaded > on_device + 0.9 * chunked,
            "zero {zero}: {offloaded} s against {on_device} s + {chunked} s"
        );
    }
}

#[test]
fn a_host_optimizer_on_tensor_and_pipeline_ranks_moves_each_ranks_own_shard() {
    // Tensor 2 x pipeline 2: each rank copies its own stage's gradients, its tensor shard of
    // them, and gets its own updated weights back: the host links carry the sum over ranks.
    let model = workloads::zoo::by_name("bert-base").unwrap();
    let compute = ComputeModel::default();
    let topology = cluster(1, 4);
    let cpu = host_cpu("64 GB/s");
    let parallelism =
        Parallelism { offload: Offload::Optimizer, tensor: 2, pipeline: 2, ..Parallelism::data_parallel(1) };
    let strategy = Strategy {
        precision: Dtype::Fp16,
        host_cpu: Some(&cpu),
        ..super::tests::strategy(&model, &compute, parallelism, 8, 1)
    };
    let lowered = strategy.lower().unwrap();
    let gradient = strategy.gradient_precision.bytes();
    // Each stage's 2 tensor ranks: gradients out (the buckets, written after their one-rank
    // sync) and working weights back, per parameter they hold.
    let expected: u64 = lowered.stages.iter().map(|s| 2 * s.parameters * (gradient + 2)).sum();
    let moved = bytes_on(&strategy, &topology, Tier::HostMemory);
    assert!(
        (moved / expected as f64 - 1.0).abs() < 1e-3,
        "{moved} bytes on the host links against {expected}"
    );
    for stage in &lowered.stages {
        assert_eq!(stage.memory.optimizer, Bytes::ZERO, "stage {}", stage.stage);
    }
}

#[test]
fn a_host_optimizer_refuses_what_it_does_not_model_with_the_key() {
    let model = small_cnn();
    let compute = ComputeModel::default();
    let cpu = host_cpu("64 GB/s");
    let key = |strategy: Strategy<'_>| match strategy.check() {
        Err(StrategyError::Invalid { key, .. }) => key,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let parallelism = Parallelism { offload: Offload::Optimizer, ..Parallelism::data_parallel(2) };
    // No host CPU named.
    assert_eq!(key(data_parallel(&model, &compute, parallelism, 1)), "cluster.host-cpu");
    // ZeRO-3 takes the optimizer's offload; the weights' shards offloaded need ZeRO-3's shards.
    let zero3 = Parallelism { zero: 3, ..parallelism };
    assert!(Strategy { host_cpu: Some(&cpu), ..data_parallel(&model, &compute, zero3, 1) }.check().is_ok());
    for zero in [0u8, 1, 2] {
        let shards = Parallelism { zero, offload: Offload::OptimizerAndParameters, ..parallelism };
        assert_eq!(
            key(Strategy { host_cpu: Some(&cpu), ..data_parallel(&model, &compute, shards, 1) }),
            "workload.offload",
            "zero {zero}"
        );
    }
    // DeepSpeed v0.3.14's stage 3 is modelled without offloading.
    let deepspeed = Parallelism {
        zero: 3,
        offload: Offload::OptimizerAndParameters,
        zero_implementation: ZeroImplementation::DeepSpeed,
        ..parallelism
    };
    assert_eq!(
        key(Strategy { host_cpu: Some(&cpu), ..data_parallel(&model, &compute, deepspeed, 1) }),
        "parallelism.zero-implementation"
    );
    // Recomputation goes with the optimizer's offload, not with the activations'.
    let recompute = Strategy {
        host_cpu: Some(&cpu),
        recompute: Recompute::Full,
        ..data_parallel(&model, &compute, parallelism, 1)
    };
    assert!(recompute.check().is_ok());
    let both = Parallelism { offload: Offload::ActivationsAndOptimizer, ..parallelism };
    assert_eq!(key(Strategy { parallelism: both, ..recompute.clone() }), "workload.offload");
    // Every value parses back from its name.
    for offload in Offload::ALL {
        assert_eq!(offload.name().parse::<Offload>(), Ok(offload));
    }
}

#[test]
fn a_host_optimizer_with_its_state_on_nvme_reads_and_writes_it_every_step() {
    // ZeRO-Infinity: the fp32 weights and states come from NVMe before each chunk's step and
    // go back after it, at the process's share of the drives' bandwidth, on one queue.
    let model = workloads::zoo::by_name("bert-base").unwrap();
    let compute = ComputeModel::default();
    let topology = cluster(1, 2);
    let cpu = host_cpu("64 GB/s");
    let nvme: sim_core::units::Bandwidth = "2 GB/s".parse().unwrap();
    let parallelism = Parallelism { offload: Offload::Optimizer, ..Parallelism::data_parallel(2) };
    let in_memory = Strategy {
        precision: Dtype::Fp16,
        host_cpu: Some(&cpu),
        ..data_parallel(&model, &compute, parallelism, 1)
    };
    let on_nvme = Strategy { nvme: Some(nvme), ..in_memory.clone() };
    let parameters: u64 = model.layers.iter().map(|l| l.cost.params).sum();
    let totals = on_nvme.lower().unwrap().offload.unwrap();
    // fp32 master copy and SGD's momentum: 8 bytes per parameter, each way.
    assert_eq!(totals.nvme_bytes, 2 * parameters * 8);
    assert_eq!(in_memory.lower().unwrap().offload.unwrap().nvme_bytes, 0);
    // The host keeps the gradients and two chunks' state (one chunk here), not all of it.
    assert!(totals.host_bytes < in_memory.lower().unwrap().offload.unwrap().host_bytes);
    let time = |s: &Strategy<'_>| iteration_end_s(s, &topology);
    // One chunk: read, step, write in series; the iteration ends with the weights' copy back,
    // after the step, so it is longer by at least the read.
    let io = (parameters * 8) as f64 / nvme.bytes_per_second();
    let (slow, fast) = (time(&on_nvme), time(&in_memory));
    assert!(slow - fast > 0.99 * io, "{slow} s on NVMe against {fast} s: the read takes {io} s");
    // NVMe without a host optimizer is refused by its key.
    let none = Strategy {
        parallelism: Parallelism { offload: Offload::Activations, ..parallelism },
        ..on_nvme.clone()
    };
    match none.check() {
        Err(StrategyError::Invalid { key, .. }) => assert_eq!(key, "workload.offload-device"),
        other => panic!("{other:?}"),
    }
}

/// ZeRO-3 over `data` replicas with `offload`, bert-base in fp16 (fp32 gradients), SGD with
/// momentum, two micro-batches of 8 per replica, the optimizer on a 64 GB/s host CPU.
fn zero3_offloaded<'a>(
    model: &'a Model,
    compute: &'a ComputeModel,
    cpu: &'a workloads::device::Device,
    parallelism: Parallelism,
) -> Strategy<'a> {
    let global = u64::from(parallelism.data) * 16;
    Strategy {
        device: DeviceCatalog::builtin().get("a100-sxm4-40gb").unwrap(),
        optimizer: Optimizer::SgdMomentum,
        precision: Dtype::Fp16,
        host_cpu: Some(cpu),
        ..super::tests::strategy(model, compute, Parallelism { zero: 3, ..parallelism }, global, 8)
    }
}

#[test]
fn zero_infinity_fetches_each_units_shard_before_every_gather_and_sends_every_gradient_shard_back() {
    // ZeRO-3 with the optimizer on the host (ZeRO-Offload) and with the weights' shards there
    // too (ZeRO-Infinity, FSDP's CPU offload): every micro-batch's reduce-scatter leaves the
    // rank a gradient shard, copied to host memory; with the shards offloaded, each unit's
    // shard comes to the device before its forward's and its backward's allgather, and nothing
    // comes back after the step; without, the updated shard comes back once.
    let model = workloads::zoo::by_name("bert-base").unwrap();
    let compute = ComputeModel::default();
    let topology = cluster(1, 2);
    let cpu = host_cpu("64 GB/s");
    let parameters: u64 = model.layers.iter().map(|l| l.cost.params).sum();
    let held = parameters.div_ceil(2);
    for offload in [
        Offload::Optimizer,
        Offload::OptimizerAndParameters,
        Offload::ActivationsAndOptimizer,
        Offload::ActivationsOptimizerAndParameters,
    ] {
        let strategy =
            zero3_offloaded(&model, &compute, &cpu, Parallelism { offload, ..Parallelism::data_parallel(2) });
        let lowered = strategy.lower().unwrap();
        assert_eq!(lowered.micro_batches, 2);
        let totals = lowered.offload.unwrap();
        let gradient = strategy.gradient_precision.bytes();
        // Two micro-batches, each a gradient shard (units rounded up to whole bytes per rank).
        let expected = (2 * gradient * parameters) as f64 / 2.0;
        let gradients = totals.gradient_bytes as f64;
        assert!((gradients / expected - 1.0).abs() < 1e-4, "{offload:?}: {gradients} against {expected}");
        let weights = totals.weight_bytes as f64;
        let expected = if offload.parameters() {
            // fp16 shards, before two allgathers per unit and micro-batch.
            (2 * 2 * 2 * parameters) as f64 / 2.0
        } else {
            (held * 2) as f64
        };
        assert!((weights / expected - 1.0).abs() < 1e-4, "{offload:?}: {weights} against {expected}");
        // With the activations offloaded too, each micro-batch's go out and come back.
        assert_eq!(totals.activation_bytes > 0, offload.activations(), "{offload:?}");
        assert_eq!(totals.to_host_bytes, totals.gradient_bytes + totals.activation_bytes, "{offload:?}");
        assert_eq!(totals.to_device_bytes, totals.weight_bytes + totals.activation_bytes, "{offload:?}");
        // What the report says is what the host links carry: both GPUs, both ways.
        let moved = bytes_on(&strategy, &topology, Tier::HostMemory);
        assert_eq!(moved, 2.0 * (totals.to_host_bytes + totals.to_device_bytes) as f64, "{offload:?}");
        // The device keeps no optimizer state and no gradient shard; with the weights' shards
        // offloaded no weights either, only the gathered units (temporary buffers).
        let memory = lowered.stages[0].memory;
        assert_eq!(memory.optimizer, Bytes::ZERO);
        assert_eq!(memory.gradients, Bytes::ZERO);
        assert_eq!(memory.weights == Bytes::ZERO, offload.parameters(), "{offload:?}");
        assert!(memory.temporary > Bytes::ZERO);
        let without = totals.without;
        assert_eq!(without.weights, Bytes(held * 2));
        // The host keeps the fp32 weights, momentum and gradients of the shard, and with the
        // shards offloaded the fp16 shard.
        let shard = if offload.parameters() { 2 } else { 0 };
        let model_state = totals.host_bytes - totals.activation_bytes / 2;
        assert_eq!(model_state, held * (4 + 4 + gradient + shard), "{offload:?}: host bytes");
    }
}

#[test]
fn zero_infinity_on_tensor_and_pipeline_ranks_moves_each_ranks_own_shards() {
    // Tensor 2 x pipeline 2 x data 2 under ZeRO-3 with the weights' shards offloaded: each
    // rank copies its own stage's tensor share, sharded over its 2 replicas; the host links
    // carry the sum over the 8 ranks of its gradient shards (every micro-batch) and its weight
    // shards (before each allgather, two per unit and micro-batch). Untied embeddings: the
    // last stage holds no copy of the first's, whose gradient goes out once, after the step.
    let model = workloads::zoo::by_name("llama2-7b").unwrap();
    let compute = ComputeModel::default();
    let topology = cluster(1, 8);
    let cpu = host_cpu("64 GB/s");
    let parallelism = Parallelism {
        offload: Offload::OptimizerAndParameters,
        tensor: 2,
        pipeline: 2,
        ..Parallelism::data_parallel(2)
    };
    let strategy = zero3_offloaded(&model, &compute, &cpu, parallelism);
    let lowered = strategy.lower().unwrap();
    let m = u64::from(lowered.micro_batches);
    let gradient = strategy.gradient_precision.bytes();
    // Per stage: 4 ranks (2 tensor x 2 data), each a half of the stage's tensor share.
    let expected: u64 =
        lowered.stages.iter().map(|s| 4 * s.parameters.div_ceil(2) * m * (gradient + 2 * 2)).sum();
    let moved = bytes_on(&strategy, &topology, Tier::HostMemory);
    assert!(
        (moved / expected as f64 - 1.0).abs() < 1e-3,
        "{moved} bytes on the host links against {expected}"
    );
    for stage in &lowered.stages {
        assert_eq!(stage.memory.weights, Bytes::ZERO, "stage {}", stage.stage);
        assert_eq!(stage.memory.optimizer, Bytes::ZERO, "stage {}", stage.stage);
    }
}

#[test]
fn zero_infinity_with_nvme_reads_every_shard_from_the_drives_and_writes_it_back_after_the_step() {
    // The weights' shards and the optimizer's state on NVMe: each fetch reads its shard from
    // the drives first; the step reads the state and writes the state and the fp16 shard back.
    let model = workloads::zoo::by_name("bert-base").unwrap();
    let compute = ComputeModel::default();
    let topology = cluster(1, 2);
    let cpu = host_cpu("64 GB/s");
    let nvme: sim_core::units::Bandwidth = "2 GB/s".parse().unwrap();
    let parallelism =
        Parallelism { offload: Offload::OptimizerAndParameters, ..Parallelism::data_parallel(2) };
    let in_memory = zero3_offloaded(&model, &compute, &cpu, parallelism);
    let on_nvme = Strategy { nvme: Some(nvme), ..in_memory.clone() };
    let parameters: u64 = model.layers.iter().map(|l| l.cost.params).sum();
    let held = parameters.div_ceil(2);
    let totals = on_nvme.lower().unwrap().offload.unwrap();
    let fetched = totals.weight_bytes;
    // Read: the fp32 master copy and momentum (8 bytes per parameter), and every fetch's shard;
    // written: the state and the fp16 shard.
    assert_eq!(totals.nvme_read_bytes, held * 8 + fetched);
    assert_eq!(totals.nvme_bytes, held * 8 + fetched + held * (8 + 2));
    // The shards are no longer in host memory.
    let host = in_memory.lower().unwrap().offload.unwrap().host_bytes;
    assert!(totals.host_bytes < host, "{} against {host} in host memory", totals.host_bytes);
    // One NVMe queue per rank: the iteration takes at least every read and write in series.
    let io = totals.nvme_bytes as f64 / nvme.bytes_per_second();
    let slow = iteration_end_s(&on_nvme, &topology);
    assert!(slow > io, "{slow} s on NVMe, its queue alone {io} s");
    assert!(slow > iteration_end_s(&in_memory, &topology));
}
