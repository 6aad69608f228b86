//! The strategy layer against closed forms: pipeline bubbles and in-flight micro-batches,
//! tensor- and sequence-parallel bytes, context-parallel key/value bytes, expert all-to-all
//! bytes, ZeRO traffic, and plain data parallelism through the general emitter.

use sim_core::fidelity::{Fidelity, NetworkSettings};
use sim_core::graph::{CollectiveKind, ExecGraph, OpKind, RankId};
use sim_core::stats::idle_until;
use sim_core::units::{Bandwidth, Bytes, SimDuration, SimTime};
use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology};

use super::*;
use workloads::device::DeviceCatalog;
use workloads::layer::{LayerKind, Shape};
use workloads::model::ModelBuilder;
use workloads::zoo;

/// `blocks` identical blocks of two square linear layers on `[1024, hidden]` samples, after a
/// free reshape (so every linear layer has a backward-data kernel): uniform pipeline stages.
fn uniform_model(blocks: usize, hidden: u64) -> Model {
    let mut builder = ModelBuilder::new("uniform", Shape::from([1024, hidden]));
    builder.layer("stem", LayerKind::Reshape { shape: Shape::from([1024, hidden]) }).unwrap();
    for block in 0..blocks {
        for name in ["fc1", "fc2"] {
            builder
                .layer(
                    format!("layers.{block}.{name}"),
                    LayerKind::Linear { out_features: hidden, bias: false },
                )
                .unwrap();
        }
    }
    builder.finish()
}

/// One server of `gpus` GPUs behind a switch so fast that transfers take next to no time.
fn instant_server(gpus: u32) -> Topology {
    let link =
        LinkSpec::new(Bandwidth::from_bits_per_second(8_000_000_000_000_000_000).unwrap(), SimDuration::ZERO);
    Topology::build(&ClusterSpec {
        nodes: 1,
        gpus_per_node: gpus,
        intra_node: IntraNode::NvSwitch(link),
        network: NetworkSpec::single_switch(link),
        host_memory: None,
    })
    .unwrap()
}

/// A DGX-A100-like cluster: `nodes` servers of 8 GPUs, 300 GB/s NVSwitch, 200 Gb/s NICs.
pub(super) fn dgx(nodes: u32) -> Topology {
    let nvlink = LinkSpec::new("300 GB/s".parse().unwrap(), "0.7 us".parse().unwrap());
    let nic = LinkSpec::new("200 Gb/s".parse().unwrap(), "1 us".parse().unwrap());
    Topology::build(&ClusterSpec {
        nodes,
        gpus_per_node: 8,
        intra_node: IntraNode::NvSwitch(nvlink),
        network: NetworkSpec::single_switch(nic),
        host_memory: None,
    })
    .unwrap()
}

/// A strategy on one A100 80 GB in fp16 with Adam, one iteration, no folding: what the tests
/// here and in `tests_sync` vary from.
pub(super) fn strategy<'a>(
    model: &'a Model,
    compute: &'a ComputeModel,
    parallelism: Parallelism,
    global: u64,
    micro: u64,
) -> Strategy<'a> {
    Strategy {
        model,
        device: DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap(),
        compute,
        precision: Dtype::Fp16,
        gradient_precision: Dtype::Fp32,
        optimizer_precision: Dtype::Fp32,
        optimizer: Optimizer::Adam,
        weights: workloads::WeightStorage::default(),
        recompute: Recompute::None,
        passes: Default::default(),
        global_batch: global,
        micro_batch: micro,
        parallelism,
        iterations: 1,
        fold_symmetric_ranks: false,
        input: None,
        layer_tables: None,
        chunk_layers: None,
        host_cpu: None,
        nvme: None,
        fusion: workloads::fusion::Fusion::None,
        batch_norm_group: workloads::groupbn::BatchNormGroup::NONE,
        optimizer_passes: workloads::optimizer::OptimizerPasses::Fused,
        gradient_accumulation: workloads::optimizer::GradientAccumulation::InKernel,
        muon: workloads::muon::Muon::default(),
    }
}

fn pipelined(stages: u32, chunks: u32, schedule: PipelineSchedule) -> Parallelism {
    Parallelism {
        data: 1,
        pipeline: stages,
        virtual_stages: chunks,
        schedule,
        ..Parallelism::data_parallel(1)
    }
}

/// Mean over ranks of the idle time before the last backward of the pipeline, over the
/// length of the pipeline phase (first op to last backward), and the compute time per rank.
fn bubble(lowered: &Lowered, topology: &Topology) -> (f64, f64) {
    let timeline = NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, topology).unwrap();
    let end = lowered.pipeline_ends[0].iter().map(|op| timeline.end[op.0 as usize]).max().unwrap();
    let ranks = lowered.graph.ranks() as usize;
    // The pipeline flush's wait counts as bubble; host work is not the GPU's.
    let flush = lowered.graph.find_origin(FLUSH_ORIGIN);
    let idle = idle_until(&lowered.graph, &timeline, SimTime::ZERO, &vec![end; ranks], &|op| {
        (Some(op.meta.origin()) == flush && matches!(op.kind, OpKind::Collective(_)))
            || op.meta.work().is_host()
    });
    let mean_idle = idle.iter().map(|d| d.as_secs_f64()).sum::<f64>() / ranks as f64;
    (mean_idle / end.since_start().as_secs_f64(), mean_idle)
}

/// Picoseconds of kernels on `rank`'s compute stream (its busy time, every kernel).
pub(super) fn compute_busy_ps(graph: &ExecGraph, rank: u32) -> u64 {
    graph
        .ops()
        .iter()
        .filter(|op| op.rank == RankId(rank) && op.stream == COMPUTE_STREAM)
        .map(|op| match op.kind {
            OpKind::Compute { duration } => duration.as_ps(),
            _ => 0,
        })
        .sum()
}

/// Compute time of one rank in the pipeline phase (every kernel but the optimizer).
fn rank_compute(graph: &ExecGraph, rank: u32) -> f64 {
    graph
        .ops()
        .iter()
        .filter(|op| {
            op.rank == RankId(rank)
                && op.stream == COMPUTE_STREAM
                && graph.label(op.label) != "optimizer step"
        })
        .filter_map(|op| match op.kind {
            OpKind::Compute { duration } => Some(duration.as_secs_f64()),
            _ => None,
        })
        .sum()
}

#[test]
fn gpipe_and_1f1b_bubbles_are_p_minus_1_over_m_plus_p_minus_1() {
    let model = uniform_model(8, 4096);
    let compute = ComputeModel::default();
    let topology = instant_server(4);
    for schedule in [PipelineSchedule::GPipe, PipelineSchedule::OneFOneB] {
        for m in [4u64, 8, 16] {
            let lowered = strategy(&model, &compute, pipelined(4, 1, schedule), m * 2, 2).lower().unwrap();
            let (fraction, _) = bubble(&lowered, &topology);
            let expected = 3.0 / (m as f64 + 3.0);
            assert!(
                (fraction - expected).abs() < 0.002,
                "{schedule:?} m={m}: bubble {fraction:.4}, closed form {expected:.4}"
            );
        }
    }
}

#[test]
fn interleaving_divides_the_bubble_by_the_virtual_stages() {
    let model = uniform_model(16, 4096);
    let compute = ComputeModel::default();
    let topology = instant_server(4);
    for (chunks, m) in [(2u32, 8u64), (4, 8), (2, 16)] {
        let lowered = strategy(&model, &compute, pipelined(4, chunks, PipelineSchedule::OneFOneB), m * 2, 2)
            .lower()
            .unwrap();
        let (_, idle) = bubble(&lowered, &topology);
        let ratio = idle / rank_compute(&lowered.graph, 0);
        let expected = 3.0 / (f64::from(chunks) * m as f64);
        assert!(
            (ratio - expected).abs() < 0.01 * expected + 0.002,
            "v={chunks} m={m}: bubble/compute {ratio:.4}, closed form {expected:.4}"
        );
    }
}

/// Compute time of `rank`'s kernels of `pass` (per iteration).
fn pass_compute(graph: &ExecGraph, rank: u32, pass: sim_core::graph::Pass) -> f64 {
    graph
        .ops()
        .iter()
        .filter(|op| op.rank == RankId(rank) && op.stream == COMPUTE_STREAM && op.meta.pass() == Some(pass))
        .filter_map(|op| match op.kind {
            OpKind::Compute { duration } => Some(duration.as_secs_f64()),
            _ => None,
        })
        .sum()
}

#[test]
fn zb_h1_bubble_is_the_papers_closed_form() {
    // Qi et al. 2024, table 3: the bubble of p stages is (p - 1)(T_F + T_B + T_W) under 1F1B and
    // (p - 1)(T_F + T_B - T_W) under ZB-H1, with T_B the input-gradient and T_W the
    // weight-gradient time of one micro-batch on one stage. Equal stages, an instant network:
    // the mean idle time per rank before the last backward pass is that bubble.
    use sim_core::graph::Pass;
    let model = uniform_model(8, 4096);
    let compute = ComputeModel::default();
    let topology = instant_server(4);
    for m in [4u64, 8, 13] {
        let mut idle = Vec::new();
        for schedule in [PipelineSchedule::OneFOneB, PipelineSchedule::ZbH1] {
            let lowered = strategy(&model, &compute, pipelined(4, 1, schedule), m * 2, 2).lower().unwrap();
            let per_micro = |pass| pass_compute(&lowered.graph, 1, pass) / m as f64;
            let (f, b, w) =
                (per_micro(Pass::Forward), per_micro(Pass::BackwardData), per_micro(Pass::BackwardWeight));
            assert!(w > 0.0 && w <= f.min(b) * 1.0001, "T_W {w} within T_F {f} and T_B {b}");
            let expected = 3.0 * if schedule == PipelineSchedule::ZbH1 { f + b - w } else { f + b + w };
            let (_, mean_idle) = bubble(&lowered, &topology);
            // Within 0.2% of 1F1B's bubble (the lowering adds the same few microseconds to
            // both schedules: see the difference below).
            let one_f_one_b = 3.0 * (f + b + w);
            assert!(
                (mean_idle - expected).abs() < 0.002 * one_f_one_b,
                "{schedule:?} m={m}: mean idle {mean_idle:.6} s, closed form {expected:.6} s"
            );
            idle.push((mean_idle, w));
            // The same kernels, only reordered.
            assert!((rank_compute(&lowered.graph, 1) - m as f64 * (f + b + w)).abs() < 1e-9 * m as f64);
        }
        // What ZB-H1 saves: (p - 1) 2 T_W, to 0.1%.
        let (saved, w) = (idle[0].0 - idle[1].0, idle[1].1);
        assert!(
            (saved - 6.0 * w).abs() < 0.001 * 6.0 * w,
            "m={m}: saved {saved:.6} s, 2 (p - 1) T_W = {:.6} s",
            6.0 * w
        );
    }
}

#[test]
fn zb_h1_holds_1f1b_peak_on_every_stage_and_refuses_what_it_cannot_split() {
    let model = uniform_model(8, 1024);
    let compute = ComputeModel::default();
    let zb = strategy(&model, &compute, pipelined(4, 1, PipelineSchedule::ZbH1), 16, 1).lower().unwrap();
    let one = strategy(&model, &compute, pipelined(4, 1, PipelineSchedule::OneFOneB), 16, 1).lower().unwrap();
    let in_flight: Vec<f64> = zb.stages.iter().map(|s| s.peak_micro_batches_in_flight).collect();
    assert_eq!(in_flight, vec![4.0; 4]);
    let peak = |l: &Lowered| l.stages.iter().map(|s| s.memory.activations.0).max().unwrap();
    assert_eq!(peak(&zb), peak(&one));
    // ZeRO-3 gathers per unit around a whole backward: refused.
    let sharded = Parallelism { zero: 3, data: 1, ..pipelined(4, 1, PipelineSchedule::ZbH1) };
    let error = strategy(&model, &compute, sharded, 16, 1).lower().unwrap_err().to_string();
    assert!(error.contains("parallelism.schedule") && error.contains("zero = 3"), "{error}");
}

#[test]
fn first_and_last_stage_layers_set_the_ends_and_split_the_rest_evenly() {
    let model = uniform_model(8, 1024);
    let compute = ComputeModel::default();
    let uneven = Parallelism {
        first_stage_layers: Some(1),
        last_stage_layers: Some(1),
        ..pipelined(4, 1, PipelineSchedule::OneFOneB)
    };
    let lowered = strategy(&model, &compute, uneven, 8, 1).lower().unwrap();
    let blocks: Vec<usize> = lowered.stages.iter().map(|s| s.blocks).collect();
    assert_eq!(blocks, vec![1, 3, 3, 1]);
    // Parameters follow the blocks (every block has the same two linear layers).
    let per_block = lowered.stages[0].parameters;
    assert!(lowered.stages.iter().zip(&blocks).all(|(s, &b)| s.parameters == b as u64 * per_block));
    let even = strategy(&model, &compute, pipelined(4, 1, PipelineSchedule::OneFOneB), 8, 1).lower().unwrap();
    assert!(even.stages.iter().all(|s| s.blocks == 2));
    // Megatron's rule: the blocks left split evenly over the other stages.
    let odd = Parallelism { first_stage_layers: Some(2), ..uneven };
    let error = strategy(&model, &compute, odd, 8, 1).lower().unwrap_err().to_string();
    assert!(
        error.contains("parallelism.first-stage-layers") && error.contains("5 blocks are left for the 2"),
        "{error}"
    );
}

/// Six blocks of two linear layers between a stem (standing for the embedding) and a head
/// (the output layer), layers 0 and 13.
fn stem_blocks_head() -> Model {
    let mut builder = ModelBuilder::new("uniform-head", Shape::from([1024, 1024]));
    builder.layer("stem", LayerKind::Reshape { shape: Shape::from([1024, 1024]) }).unwrap();
    for block in 0..6 {
        for name in ["fc1", "fc2"] {
            let linear = LayerKind::Linear { out_features: 1024, bias: false };
            builder.layer(format!("layers.{block}.{name}"), linear).unwrap();
        }
    }
    builder.layer("head", LayerKind::Linear { out_features: 1024, bias: false }).unwrap();
    builder.finish()
}

#[test]
fn padded_layers_take_one_block_off_the_last_chunk_then_the_first_as_the_zero_bubble_repository_does() {
    // sail-sg/zero-bubble-pipeline-parallelism @ 39f2c186, ParallelTransformer.get_offset: pad
    // to a multiple of the pipeline degree, split evenly over the chunks, then one block off
    // chunks -1, 0, 1, ... per block of padding.
    let ones = |n: usize| vec![1usize; n];
    let ends = |n: usize| [vec![0], ones(n), vec![0]].concat();
    assert_eq!(pipeline::padded_sizes(30, 16, 2), Ok(ends(30)), "ZB-V, 6.2B on 16 GPUs");
    assert_eq!(pipeline::padded_sizes(22, 8, 3), Ok(ends(22)), "1F1B-I, 1.5B on 8 GPUs");
    assert_eq!(pipeline::padded_sizes(22, 8, 1), Ok(vec![2, 3, 3, 3, 3, 3, 3, 2]));
    assert_eq!(pipeline::padded_sizes(13, 8, 1), Ok(vec![1, 1, 2, 2, 2, 2, 2, 1]), "three of padding");
    assert_eq!(pipeline::padded_sizes(24, 8, 3), Ok(ones(24)), "no padding: even");
    // The repository's assertion: the padded layers per stage split over the virtual stages.
    assert!(pipeline::padded_sizes(22, 8, 2).unwrap_err().contains("virtual stages do not split"));
    // A chunk in the middle left without a block is refused.
    assert!(pipeline::padded_sizes(5, 4, 2).unwrap_err().contains("chunk 1 of 8 with no block"));

    let model = stem_blocks_head();
    let compute = ComputeModel::default();
    // One chunk per stage: the same split as first- and last-stage-layers of 1, the same run.
    let padded = Parallelism { pad_layers: true, ..pipelined(4, 1, PipelineSchedule::OneFOneB) };
    let uneven = Parallelism {
        first_stage_layers: Some(1),
        last_stage_layers: Some(1),
        ..pipelined(4, 1, PipelineSchedule::OneFOneB)
    };
    let run = |p: Parallelism| {
        let lowered = strategy(&model, &compute, p, 8, 1).lower().unwrap();
        let blocks: Vec<usize> = lowered.stages.iter().map(|s| s.blocks).collect();
        let timeline = NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, &dgx(1)).unwrap();
        (blocks, timeline.makespan())
    };
    let (blocks, time) = run(padded);
    assert_eq!(blocks, vec![1, 2, 2, 1]);
    assert_eq!((blocks, time), run(uneven));
    // ZB-V: the first chunk (the stem alone) and the last (no block) both on stage 0.
    let v = Parallelism { pad_layers: true, ..pipelined(4, 2, PipelineSchedule::ZbV) };
    let lowered = strategy(&model, &compute, v, 8, 1).lower().unwrap();
    let blocks: Vec<usize> = lowered.stages.iter().map(|s| s.blocks).collect();
    assert_eq!(blocks, vec![0, 2, 2, 2]);
    assert_eq!(lowered.stages[0].layers[0], 0..1, "the stem alone");
    assert_eq!(lowered.stages[0].layers[1], 13..14, "the head alone");
    // Not with first- or last-stage-layers, and not for a model without numbered blocks.
    let both = Parallelism { pad_layers: true, ..uneven };
    let error = strategy(&model, &compute, both, 8, 1).lower().unwrap_err().to_string();
    assert!(error.contains("parallelism.pad-layers"), "{error}");
    // An end chunk with neither a block nor a head is refused, not run empty.
    let headless = uniform_model(6, 1024);
    let error = strategy(&headless, &compute, v, 8, 1).lower().unwrap_err().to_string();
    assert!(error.contains("parallelism.pad-layers") && error.contains("no output layer"), "{error}");
}

#[test]
fn counted_embedding_and_loss_leave_the_end_chunks_a_block_fewer_as_megatron_core_does() {
    // Six blocks between a stem (the embedding) and a head (the output layer and loss).
    let model = stem_blocks_head();
    let compute = ComputeModel::default();
    let counted = |embedding, loss, p: Parallelism| Parallelism {
        account_for_embedding: embedding,
        account_for_loss: loss,
        ..p
    };
    // Megatron-CI's shape: 6 + 2 over 4 x 2 chunks, one each: the first chunk the stem alone
    // (stage 0), the last the head alone (stage 3's second chunk); two blocks on stages 1-3.
    let interleaved = counted(true, true, pipelined(4, 2, PipelineSchedule::OneFOneB));
    let lowered = strategy(&model, &compute, interleaved, 8, 1).lower().unwrap();
    let blocks: Vec<usize> = lowered.stages.iter().map(|s| s.blocks).collect();
    assert_eq!(blocks, vec![1, 2, 2, 1]);
    assert_eq!(lowered.stages[0].layers[0], 0..1, "the stem alone");
    assert_eq!(lowered.stages[3].layers[1], 13..14, "the head alone");
    // One chunk per stage, the embedding alone counted: 6 + 1 is not a multiple of 4 ...
    let error =
        strategy(&model, &compute, counted(true, false, pipelined(4, 1, PipelineSchedule::OneFOneB)), 8, 1)
            .lower()
            .unwrap_err()
            .to_string();
    assert!(error.contains("parallelism.account-for-embedding") && error.contains("7 layers"), "{error}");
    // ... over 7 stages it divides: the first stage holds the stem alone.
    let seven = counted(true, false, pipelined(7, 1, PipelineSchedule::OneFOneB));
    let lowered = strategy(&model, &compute, seven, 14, 1).lower().unwrap();
    let blocks: Vec<usize> = lowered.stages.iter().map(|s| s.blocks).collect();
    assert_eq!(blocks, vec![0, 1, 1, 1, 1, 1, 1]);
    assert_eq!(lowered.stages[0].layers[0], 0..1, "the stem alone");
    // Not beside pad-layers or first-stage-layers (Megatron-Core refuses both), nor DualPipe.
    for other in [
        Parallelism { pad_layers: true, ..interleaved },
        Parallelism {
            first_stage_layers: Some(1),
            ..counted(true, true, pipelined(4, 1, PipelineSchedule::OneFOneB))
        },
    ] {
        let error = strategy(&model, &compute, other, 8, 1).lower().unwrap_err().to_string();
        assert!(
            error.contains("parallelism.account-for-embedding") && error.contains("already sets"),
            "{error}"
        );
    }
    // The last chunk would hold the counted loss alone, but a model without a head has nothing
    // to put there: refused, not run empty.
    let headless = uniform_model(6, 1024);
    let error = strategy(&headless, &compute, interleaved, 8, 1).lower().unwrap_err().to_string();
    assert!(
        error.contains("parallelism.account-for-embedding") && error.contains("no output layer"),
        "{error}"
    );
}

#[test]
fn one_f_one_b_holds_p_micro_batches_on_the_first_stage_and_gpipe_all_of_them() {
    let model = uniform_model(8, 1024);
    let compute = ComputeModel::default();
    let lowered =
        strategy(&model, &compute, pipelined(4, 1, PipelineSchedule::OneFOneB), 16, 1).lower().unwrap();
    let in_flight: Vec<f64> = lowered.stages.iter().map(|s| s.peak_micro_batches_in_flight).collect();
    assert_eq!(in_flight, vec![4.0, 3.0, 2.0, 1.0]);
    let gpipe = strategy(&model, &compute, pipelined(4, 1, PipelineSchedule::GPipe), 16, 1).lower().unwrap();
    assert!(gpipe.stages.iter().all(|s| s.peak_micro_batches_in_flight == 16.0));
    // Activations grow with what is in flight; the other parts do not.
    assert!(lowered.stages[0].memory.activations.0 == 4 * lowered.stages[3].memory.activations.0);
}

/// Bytes of the collectives and transfers of `graph` on `rank`, by (kind, stream).
fn rank_traffic(
    graph: &ExecGraph,
    rank: u32,
    stream: sim_core::graph::StreamId,
) -> Vec<(Option<CollectiveKind>, u64)> {
    graph
        .ops()
        .iter()
        .filter(|op| op.rank == RankId(rank) && op.stream == stream)
        .filter_map(|op| match op.kind {
            OpKind::Collective(id) => {
                let c = graph.collective(id);
                Some((Some(c.kind), c.bytes.0))
            }
            OpKind::Transfer { bytes, .. } => Some((None, bytes.0)),
            _ => None,
        })
        .collect()
}

#[test]
fn megatron_tensor_parallel_bytes_per_layer_and_sequence_parallel_moves_the_same() {
    let model = zoo::by_name("megatron-1.7b").unwrap(); // 24 layers, hidden 2304, sequence 2048
    let compute = ComputeModel::default();
    let (b, s, h, layers) = (2u64, 2048u64, 2304u64, 24u64);
    let mut totals = Vec::new();
    for sequence_parallel in [false, true] {
        let parallelism =
            Parallelism { data: 1, tensor: 4, sequence_parallel, ..Parallelism::data_parallel(1) };
        let lowered = strategy(&model, &compute, parallelism, b, b).lower().unwrap();
        let traffic = rank_traffic(&lowered.graph, 0, TENSOR_STREAM);
        // Allreduce = reduce-scatter + allgather of the same buffer.
        let equivalent: u64 = traffic
            .iter()
            .map(|(kind, bytes)| if *kind == Some(CollectiveKind::AllReduce) { 2 * bytes } else { *bytes })
            .sum();
        // 4 allreduces of b s h (fp16) per layer, plus the embedding's and the loss's.
        let per_layers = layers * 4 * 2 * b * s * h * 2;
        let embedding = if sequence_parallel { b * s * h * 2 } else { 2 * b * s * h * 2 };
        let loss = 2 * 3 * 4 * b * s;
        let output_layer = 2 * b * s * h * 2;
        assert_eq!(
            equivalent,
            per_layers + embedding + loss + output_layer,
            "sequence parallel {sequence_parallel}"
        );
        totals.push(per_layers);
    }
    assert_eq!(totals[0], totals[1]);
}

#[test]
fn context_parallel_ring_passes_every_other_ranks_key_value_chunk() {
    let model = zoo::by_name("llama3-8b").unwrap();
    let compute = ComputeModel::default();
    let parallelism = Parallelism { data: 1, context: 4, ..Parallelism::data_parallel(1) };
    let lowered = strategy(&model, &compute, parallelism, 1, 1).lower().unwrap();
    let sends = rank_traffic(&lowered.graph, 0, CONTEXT_STREAM);
    let LayerKind::Attention { heads, kv_heads, .. } =
        model.layers.iter().find(|l| matches!(l.kind, LayerKind::Attention { .. })).unwrap().kind
    else {
        unreachable!()
    };
    let attention_layers =
        model.layers.iter().filter(|l| matches!(l.kind, LayerKind::Attention { .. })).count() as u64;
    let sequence = model.input.0[0];
    let head_dim = 4096 / heads;
    // Forward: 3 steps of the K and V of a quarter of the sequence; backward: twice that.
    let chunk = (sequence / 4) * 2 * kv_heads * head_dim * 2;
    assert_eq!(sends.len() as u64, attention_layers * 3 * 2);
    assert_eq!(sends.iter().map(|(_, b)| b).sum::<u64>(), attention_layers * 3 * chunk * 3);
}

/// Context parallelism by all-to-all (`context-comm = "a2a"`, DeepSpeed-Ulysses) and the
/// hierarchical a2a+p2p: per attention layer, all-to-alls of the queries, keys and values and
/// of the output (and their gradients) over the all-to-all group, and a ring over the rest
/// whose key/value chunks cover 1/a of the heads over 1/p of the sequence.
#[test]
fn context_all_to_all_trades_sequence_for_heads() {
    let model = zoo::by_name("llama3-8b").unwrap();
    let compute = ComputeModel::default();
    let LayerKind::Attention { heads, kv_heads, .. } =
        model.layers.iter().find(|l| matches!(l.kind, LayerKind::Attention { .. })).unwrap().kind
    else {
        unreachable!()
    };
    let attention_layers =
        model.layers.iter().filter(|l| matches!(l.kind, LayerKind::Attention { .. })).count() as u64;
    let sequence = model.input.0[0];
    let head_dim = 4096 / heads;
    let lower = |comm: ContextComm| {
        let parallelism =
            Parallelism { data: 1, context: 4, context_comm: comm, ..Parallelism::data_parallel(1) };
        let lowered = strategy(&model, &compute, parallelism, 1, 1).lower().unwrap();
        let graph = &lowered.graph;
        let ops: Vec<_> =
            graph.ops().iter().filter(|op| op.rank == RankId(1) && op.stream == CONTEXT_STREAM).collect();
        let collectives: Vec<(u64, Vec<RankId>)> = ops
            .iter()
            .filter_map(|op| match op.kind {
                OpKind::Collective(id) => {
                    let c = graph.collective(id);
                    assert_eq!(c.kind, CollectiveKind::AllToAll);
                    Some((c.bytes.0, graph.group(c.group).to_vec()))
                }
                _ => None,
            })
            .collect();
        let sends: Vec<(u64, RankId)> = ops
            .iter()
            .filter_map(|op| match op.kind {
                OpKind::Transfer { dst, bytes } => Some((bytes.0, dst)),
                _ => None,
            })
            .collect();
        (collectives, sends)
    };
    let tokens = sequence / 4;
    let qkv = tokens * (heads + 2 * kv_heads) * head_dim * 2;
    let out = tokens * heads * head_dim * 2;
    // Ulysses: four all-to-alls per layer over all 4 context ranks, no ring.
    let (collectives, sends) = lower(ContextComm::A2a);
    assert!(sends.is_empty());
    assert_eq!(collectives.len() as u64, attention_layers * 4);
    assert_eq!(collectives.iter().map(|(b, _)| b).sum::<u64>(), attention_layers * 2 * (qkv + out));
    assert!(collectives.iter().all(|(_, g)| g.len() == 4));
    // a2a+p2p [2, 2]: the all-to-alls over rank 1's pair (0, 1), the ring to the rank at the
    // same place in the other pair (3), one step forward, its key/value chunk 1/2 of the
    // heads over 1/2 of the sequence.
    let (collectives, sends) = lower(ContextComm::A2aP2p { a2a: 2 });
    assert_eq!(collectives.len() as u64, attention_layers * 4);
    assert!(collectives.iter().all(|(_, g)| g == &vec![RankId(0), RankId(1)]));
    let chunk = (sequence / 2) * 2 * (kv_heads / 2) * head_dim * 2;
    assert!(sends.iter().all(|&(bytes, dst)| dst == RankId(3) && (bytes == chunk || bytes == 2 * chunk)));
    assert_eq!(sends.len() as u64, attention_layers * 2);
    let error = strategy(
        &model,
        &compute,
        Parallelism {
            data: 1,
            context: 4,
            context_comm: ContextComm::A2aP2p { a2a: 4 },
            ..Parallelism::data_parallel(1)
        },
        1,
        1,
    )
    .lower()
    .unwrap_err()
    .to_string();
    assert!(error.contains("parallelism.hierarchical-context-sizes"), "{error}");
}

#[test]
fn expert_all_to_all_moves_two_times_tokens_times_hidden_off_each_rank_per_layer() {
    let model = zoo::by_name("mixtral-8x7b").unwrap();
    let compute = ComputeModel::default();
    let experts_per_rank = 4;
    let parallelism =
        Parallelism { data: experts_per_rank, expert: experts_per_rank, ..Parallelism::data_parallel(4) };
    let lowered = strategy(&model, &compute, parallelism, 4, 1).lower().unwrap();
    let traffic = rank_traffic(&lowered.graph, 0, EXPERT_STREAM);
    let (tokens, hidden, top_k, layers) = (4096u64, 4096u64, 2u64, 32u64);
    // An all-to-all's buffer is the whole send buffer; (1 - 1/E) of it leaves the rank.
    let forward_off_rank: f64 = traffic.iter().take(2).map(|(_, b)| *b as f64 * (1.0 - 1.0 / 4.0)).sum();
    assert_eq!(forward_off_rank, 2.0 * (tokens * top_k * hidden * 2) as f64 * 0.75);
    assert_eq!(traffic.len() as u64, layers * 4);
}

#[test]
fn plain_data_parallelism_is_one_micro_batch_of_the_general_emitter() {
    let model = zoo::by_name("resnet50").unwrap();
    let compute = ComputeModel::default();
    let lowered = strategy(&model, &compute, Parallelism::data_parallel(8), 8 * 64, 64).lower().unwrap();
    assert_eq!(lowered.micro_batches, 1);
    // Every rank: the same ops, one allreduce per bucket on the data stream.
    let per_rank = lowered.graph.op_count() / 8;
    assert_eq!(lowered.graph.op_count() % 8, 0);
    assert_eq!(lowered.graph.collectives().len(), lowered.buckets.len());
    let total: u64 = lowered.buckets.iter().map(|b| b.bytes.0).sum();
    assert_eq!(total, model.parameters() * 4);
    assert!(per_rank > 100);
    // Gradient accumulation: 4 micro-batches of 16, still one allreduce per bucket.
    let accumulated = strategy(&model, &compute, Parallelism::data_parallel(8), 8 * 64, 16).lower().unwrap();
    assert_eq!(accumulated.micro_batches, 4);
    assert_eq!(accumulated.graph.collectives().len(), lowered.buckets.len());
    let timeline = NetworkSettings::new(Fidelity::Analytical).run(&accumulated.graph, &dgx(1)).unwrap();
    assert!(timeline.makespan() > SimDuration::ZERO);
}

/// PyTorch's in-place gradient accumulation ([`workloads::optimizer::GradientAccumulation::Add`]):
/// on one GPU, 4 micro-batches add 3 element-wise kernels per layer with parameters, each
/// reading two and writing one fp16 gradient, and the iteration grows by exactly their time.
#[test]
fn in_place_gradient_accumulation_adds_a_kernel_per_layer_and_later_micro_batch() {
    use workloads::optimizer::GradientAccumulation;
    let model = zoo::by_name("resnet50").unwrap();
    let compute = ComputeModel::default();
    let base = strategy(&model, &compute, Parallelism::data_parallel(1), 64, 16);
    let add = Strategy { gradient_accumulation: GradientAccumulation::Add, ..base.clone() };
    let (plain, added) = (base.lower().unwrap(), add.lower().unwrap());
    assert_eq!(plain.micro_batches, 4);
    let with_parameters: Vec<&workloads::layer::Layer> =
        model.layers.iter().filter(|l| l.cost.params > 0).collect();
    // Each kernel is a host launch and a compute op.
    assert_eq!(added.graph.op_count() - plain.graph.op_count(), 2 * 3 * with_parameters.len());
    let a100 = DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap();
    let kernels: f64 = with_parameters
        .iter()
        .map(|l| {
            let p = l.cost.params as f64;
            let work = workloads::compute::KernelWork::flat(
                workloads::layer::OpClass::Elementwise,
                Dtype::Fp16,
                p,
                6.0 * p,
            );
            compute.work_duration(a100, &work).unwrap().as_secs_f64()
        })
        .sum();
    let run = |lowered: &Lowered| {
        NetworkSettings::new(Fidelity::Analytical)
            .run(&lowered.graph, &dgx(1))
            .unwrap()
            .makespan()
            .as_secs_f64()
    };
    let grown = run(&added) - run(&plain);
    assert!((grown - 3.0 * kernels).abs() < 1e-9, "{grown} vs {}", 3.0 * kernels);
    // One micro-batch: nothing to accumulate.
    let single = Strategy { micro_batch: 64, ..add.clone() }.lower().unwrap();
    assert_eq!(
        single.graph.op_count(),
        Strategy { micro_batch: 64, ..base.clone() }.lower().unwrap().graph.op_count()
    );
    // ZeRO-2 reduces each micro-batch into its shards instead.
    let zero2 = |s: &Strategy| {
        Strategy { parallelism: Parallelism { zero: 2, ..Parallelism::data_parallel(1) }, ..s.clone() }
            .lower()
            .unwrap()
            .graph
            .op_count()
    };
    assert_eq!(zero2(&add), zero2(&base));
}

#[test]
fn zero_1_reduce_scatters_gradients_and_allgathers_parameters() {
    let model = zoo::by_name("megatron-1.7b").unwrap();
    let compute = ComputeModel::default();
    let plain = strategy(&model, &compute, Parallelism::data_parallel(8), 8, 1).lower().unwrap();
    let zero = strategy(&model, &compute, Parallelism { zero: 1, ..Parallelism::data_parallel(8) }, 8, 1)
        .lower()
        .unwrap();
    let kinds = |lowered: &Lowered| {
        let traffic = rank_traffic(&lowered.graph, 0, DATA_STREAM);
        let of = |kind| traffic.iter().filter(|(k, _)| *k == Some(kind)).map(|(_, b)| b).sum::<u64>();
        (of(CollectiveKind::AllReduce), of(CollectiveKind::ReduceScatter), of(CollectiveKind::AllGather))
    };
    let (allreduce, _, _) = kinds(&plain);
    let (none, reduce_scatter, allgather) = kinds(&zero);
    assert_eq!(none, 0);
    assert_eq!(reduce_scatter, allreduce);
    // fp16 parameters gathered, fp32 gradients scattered.
    assert_eq!(allgather * 2, reduce_scatter);
}

/// Megatron-Core's partial distributed optimizer: with 2 instances over 8 data-parallel ranks,
/// each bucket is reduce-scattered within an instance of 4 consecutive ranks, its quarter
/// all-reduced between the 2 ranks at the same place in each instance, and the parameters
/// all-gathered within the instance; the optimizer state is sharded over 4 ranks, not 8.
#[test]
fn distributed_optimizer_instances_reduce_within_and_all_reduce_across() {
    let model = zoo::by_name("megatron-1.7b").unwrap();
    let compute = ComputeModel::default();
    let one = strategy(&model, &compute, Parallelism { zero: 1, ..Parallelism::data_parallel(8) }, 8, 1);
    let two = Strategy {
        parallelism: Parallelism { distributed_optimizer_instances: 2, ..one.parallelism },
        ..one.clone()
    };
    let collectives = |strategy: &Strategy, rank: u32| {
        let lowered = strategy.lower().unwrap();
        let graph = &lowered.graph;
        graph
            .ops()
            .iter()
            .filter(|op| op.rank == RankId(rank) && op.stream == DATA_STREAM)
            .filter_map(|op| match op.kind {
                OpKind::Collective(id) => {
                    let c = graph.collective(id);
                    Some((c.kind, c.bytes.0, graph.group(c.group).to_vec()))
                }
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let whole = collectives(&one, 5);
    let split = collectives(&two, 5);
    let bytes = |list: &[(CollectiveKind, u64, Vec<RankId>)], kind| {
        list.iter().filter(|(k, _, _)| *k == kind).map(|(_, b, _)| b).sum::<u64>()
    };
    let scattered = bytes(&whole, CollectiveKind::ReduceScatter);
    assert_eq!(bytes(&split, CollectiveKind::ReduceScatter), scattered);
    assert_eq!(bytes(&whole, CollectiveKind::AllReduce), 0);
    // Each bucket's shard of a quarter, rounded up per bucket.
    let across = bytes(&split, CollectiveKind::AllReduce);
    assert!(across >= scattered / 4 && across <= scattered / 4 + 4 * split.len() as u64, "{across}");
    assert_eq!(bytes(&split, CollectiveKind::AllGather), bytes(&whole, CollectiveKind::AllGather));
    let instance: Vec<RankId> = (4..8).map(RankId).collect();
    let partners = vec![RankId(1), RankId(5)];
    for (kind, _, group) in &split {
        match kind {
            CollectiveKind::AllReduce => assert_eq!(group, &partners),
            _ => assert_eq!(group, &instance, "{kind:?}"),
        }
    }
    // The optimizer state of one instance's share.
    let memory = |strategy: &Strategy| strategy.lower().unwrap().stages[0].memory.optimizer.0;
    let (sharded_8, sharded_4) = (memory(&one), memory(&two));
    assert!(sharded_4.abs_diff(2 * sharded_8) <= 16, "{sharded_4} vs 2 x {sharded_8}");
    // Partial sharding is Megatron's distributed optimizer only.
    let zero_2 = Strategy {
        parallelism: Parallelism { zero: 2, distributed_optimizer_instances: 2, ..one.parallelism },
        ..one.clone()
    };
    let error = zero_2.lower().unwrap_err().to_string();
    assert!(
        error.contains("parallelism.distributed-optimizer-instances") && error.contains("zero = 2"),
        "{error}"
    );
}

/// Megatron-Core's `--defer-embedding-wgrad-compute`: on the last stage, the output layer's
/// weight-gradient kernels of the first `limit` micro-batches (every one with 0) run after the
/// stage's last input-gradient kernel, the others in their own backward; the same kernels
/// run, only later.
#[test]
fn deferred_output_layer_weight_gradients_run_after_the_schedule() {
    use sim_core::graph::Pass as GraphPass;
    let model = zoo::by_name("megatron-1.7b").unwrap();
    let compute = ComputeModel::default();
    let base = Strategy {
        gradient_accumulation: workloads::optimizer::GradientAccumulation::InKernel,
        ..strategy(&model, &compute, Parallelism { pipeline: 2, ..Parallelism::data_parallel(1) }, 8, 1)
    };
    let output = (0..model.layers.len())
        .rev()
        .find(|&i| matches!(model.layers[i].kind, LayerKind::TiedLinear { .. } | LayerKind::Linear { .. }))
        .unwrap() as u32;
    // (position of each of the output layer's weight-gradient kernels, position of the last
    // input-gradient kernel) on the last stage's rank.
    let order = |limit: Option<u32>| {
        let strategy = Strategy {
            parallelism: Parallelism { defer_embedding_wgrad: limit, ..base.parallelism },
            ..base.clone()
        };
        let lowered = strategy.lower().unwrap();
        let ops: Vec<_> = lowered
            .graph
            .ops()
            .iter()
            .filter(|op| op.rank == RankId(1) && op.stream == COMPUTE_STREAM)
            .collect();
        let weights: Vec<usize> = ops
            .iter()
            .enumerate()
            .filter(|(_, op)| {
                op.meta.layer() == Some(output) && op.meta.pass() == Some(GraphPass::BackwardWeight)
            })
            .map(|(i, _)| i)
            .collect();
        let last_data = ops.iter().rposition(|op| op.meta.pass() == Some(GraphPass::BackwardData)).unwrap();
        (weights, last_data)
    };
    let (inline, last_data) = order(None);
    assert_eq!(inline.len(), 8);
    assert!(inline.iter().filter(|&&i| i > last_data).count() == 0);
    let (all, last_data) = order(Some(0));
    assert_eq!(all.len(), 8);
    assert!(all.iter().all(|&i| i > last_data), "{all:?} vs {last_data}");
    let (two, last_data) = order(Some(2));
    assert_eq!(two.len(), 8);
    assert_eq!(two.iter().filter(|&&i| i > last_data).count(), 2);
    // Megatron's checks: a pipeline, and gradient accumulation fusion.
    let error = Strategy {
        parallelism: Parallelism { defer_embedding_wgrad: Some(0), ..Parallelism::data_parallel(1) },
        ..base.clone()
    }
    .lower()
    .unwrap_err()
    .to_string();
    assert!(error.contains("pipeline > 1"), "{error}");
    let error = Strategy {
        gradient_accumulation: workloads::optimizer::GradientAccumulation::Add,
        parallelism: Parallelism { defer_embedding_wgrad: Some(0), ..base.parallelism },
        ..base.clone()
    }
    .lower()
    .unwrap_err()
    .to_string();
    assert!(error.contains("in-kernel"), "{error}");
}

/// Transformer Engine's FP8 parameters (`workload.fp8-weights`): ZeRO-1's parameter
/// all-gathers move 1 byte per weight of an FP8 layer and 2 per other weight; the gradients'
/// reduce-scatters do not change, and the step's per-iteration weight casts and its write-back
/// shrink, so the iteration is no slower.
#[test]
fn fp8_parameters_gather_one_byte_per_fp8_weight() {
    let model = zoo::by_name("megatron-1.7b").unwrap();
    let compute = ComputeModel::default();
    let h100 = DeviceCatalog::builtin().get("h100-sxm5-80gb").unwrap();
    let bf16_weights = Strategy {
        device: h100,
        precision: Dtype::Fp8,
        ..strategy(&model, &compute, Parallelism { zero: 1, ..Parallelism::data_parallel(8) }, 8, 1)
    };
    let fp8_weights = Strategy {
        weights: workloads::WeightStorage { fp8: true, ..Default::default() },
        ..bf16_weights.clone()
    };
    let traffic = |strategy: &Strategy| {
        let lowered = strategy.lower().unwrap();
        let traffic = rank_traffic(&lowered.graph, 0, DATA_STREAM);
        let of = |kind| traffic.iter().filter(|(k, _)| *k == Some(kind)).map(|(_, b)| b).sum::<u64>();
        (of(CollectiveKind::ReduceScatter), of(CollectiveKind::AllGather))
    };
    let (scattered, gathered) = traffic(&bf16_weights);
    let (scattered_fp8, gathered_fp8) = traffic(&fp8_weights);
    assert_eq!(scattered, scattered_fp8);
    let fp8_linear: u64 = model
        .layers
        .iter()
        .filter(|layer| workloads::compute::fp8_linear(layer))
        .map(|layer| layer.cost.params)
        .sum();
    assert!(fp8_linear > 0);
    assert_eq!(gathered, 2 * model.parameters());
    assert_eq!(gathered_fp8, 2 * model.parameters() - fp8_linear);
    let time = |strategy: &Strategy| {
        let lowered = strategy.lower().unwrap();
        NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, &dgx(1)).unwrap().makespan()
    };
    assert!(time(&fp8_weights) <= time(&bf16_weights));
}

fn resnet_data_parallel<'a>(model: &'a Model, compute: &'a ComputeModel, ranks: u32) -> Strategy<'a> {
    Strategy {
        optimizer: Optimizer::SgdMomentum,
        ..strategy(model, compute, Parallelism::data_parallel(ranks), u64::from(ranks) * 64, 64)
    }
}

#[test]
fn ddp_buckets_hold_every_gradient_once_and_respect_the_caps() {
    let model = zoo::by_name("resnet50").unwrap();
    let compute = ComputeModel::default();
    let buckets = resnet_data_parallel(&model, &compute, 4).lower().unwrap().buckets;
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
fn recomputation_reruns_forward_kernels_without_counting_their_flops() {
    let model = zoo::by_name("bert-base").unwrap();
    let compute = ComputeModel::default();
    let mut spec = strategy(&model, &compute, Parallelism::data_parallel(2), 8, 4);
    let none = spec.lower().unwrap();
    spec.recompute = Recompute::Selective;
    let selective = spec.lower().unwrap();
    spec.recompute = Recompute::Full;
    let full = spec.lower().unwrap();
    let per_rank =
        |lowered: &Lowered| lowered.graph.ops().iter().filter(|op| !op.meta.work().is_host()).count() / 2;
    // BERT-base: 12 attention cores re-run under selective recomputation.
    assert_eq!(per_rank(&selective), per_rank(&none) + 12);
    // Full: every layer of the 12 encoder blocks re-runs its forward (views excepted).
    let block_kernels =
        model.layers.iter().filter(|l| l.name.starts_with("layers.") && !l.cost.is_free()).count();
    assert_eq!(per_rank(&full), per_rank(&none) + block_kernels);
    assert_eq!(none.flops_per_rank_iteration, full.flops_per_rank_iteration);
    assert!(full.recompute_flops_per_rank_iteration > selective.recompute_flops_per_rank_iteration);
    assert_eq!(none.recompute_flops_per_rank_iteration, 0.0);
}

#[test]
fn memory_counts_the_ddp_buckets_once_there_are_peers() {
    let model = zoo::by_name("resnet50").unwrap();
    let compute = ComputeModel::default();
    let lowered = resnet_data_parallel(&model, &compute, 8).lower().unwrap();
    let memory = lowered.stages[0].memory;
    let buckets: u64 = lowered.buckets.iter().map(|bucket| bucket.bytes.0).sum();
    assert_eq!(memory.communication, Bytes(buckets));
    assert_eq!(memory.gradients, Bytes(4 * model.parameters()));
    let alone = resnet_data_parallel(&model, &compute, 1).lower().unwrap().stages[0].memory;
    assert_eq!(alone.communication, Bytes::ZERO);
    // ResNet-50 at batch 64 in fp16 fits an 80 GB A100 with room to spare.
    let a100 = DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap();
    memory.check(a100).unwrap();
    assert!(memory.activations > Bytes(1 << 30) && memory.total() < Bytes(40 << 30), "{memory}");
}

#[test]
fn impossible_strategies_are_refused_with_the_key_and_what_would_be_valid() {
    let model = zoo::by_name("megatron-1.7b").unwrap(); // 24 layers, 24 heads
    let compute = ComputeModel::default();
    let cases: Vec<(Parallelism, u64, u64, &str, &str)> = vec![
        (
            Parallelism { pipeline: 32, ..pipelined(32, 1, PipelineSchedule::OneFOneB) },
            64,
            1,
            "parallelism.pipeline",
            "at most 24 chunks",
        ),
        (pipelined(4, 2, PipelineSchedule::GPipe), 8, 1, "parallelism.virtual-stages", "1f1b"),
        (pipelined(4, 2, PipelineSchedule::OneFOneB), 6, 1, "parallelism.virtual-stages", "multiple of 4"),
        (
            Parallelism { microbatch_group: Some(5), ..pipelined(4, 2, PipelineSchedule::OneFOneB) },
            6,
            1,
            "parallelism.microbatch-group-size",
            "last group of 1",
        ),
        (
            Parallelism { microbatch_group: Some(3), ..pipelined(4, 2, PipelineSchedule::OneFOneB) },
            6,
            1,
            "parallelism.microbatch-group-size",
            "between `pipeline` = 4 and the micro-batches per replica = 6",
        ),
        (
            Parallelism { microbatch_group: Some(4), ..pipelined(4, 1, PipelineSchedule::OneFOneB) },
            8,
            1,
            "parallelism.microbatch-group-size",
            "interleaved 1F1B only",
        ),
        (
            pipelined(4, 2, PipelineSchedule::ZbH1),
            8,
            1,
            "parallelism.virtual-stages",
            "needs schedule = \"1f1b\"",
        ),
        (
            Parallelism { tensor: 5, ..Parallelism::data_parallel(1) },
            1,
            1,
            "parallelism.tensor",
            "24 attention heads",
        ),
        (Parallelism::data_parallel(4), 6, 1, "workload.global-batch", "multiple of micro-batch x data = 4"),
        (Parallelism { zero: 4, ..Parallelism::data_parallel(2) }, 2, 1, "parallelism.zero", "ZeRO stages"),
        (
            Parallelism { expert: 2, ..Parallelism::data_parallel(2) },
            2,
            1,
            "parallelism.expert",
            "no mixture-of-experts",
        ),
        (
            Parallelism { data: 2, expert: 4, ..Parallelism::data_parallel(2) },
            2,
            1,
            "parallelism.expert",
            "must divide",
        ),
    ];
    for (parallelism, global, micro, key, text) in cases {
        let model = if key == "parallelism.expert" && text == "must divide" {
            zoo::by_name("mixtral-8x7b").unwrap()
        } else {
            model.clone()
        };
        match strategy(&model, &compute, parallelism, global, micro).check() {
            Err(StrategyError::Invalid { key: got, message }) => {
                assert_eq!(got, key, "{message}");
                assert!(message.contains(text), "{key}: {message}");
            }
            other => panic!("{key}: expected an error, got {other:?}"),
        }
    }
}

#[test]
fn zero_3_moves_one_and_a_half_times_the_bytes_of_plain_data_parallelism() {
    let model = zoo::by_name("megatron-1.7b").unwrap();
    let compute = ComputeModel::default();
    let bf16 = |parallelism| Strategy {
        gradient_precision: Dtype::Fp16,
        optimizer_precision: Dtype::Fp32,
        ..strategy(&model, &compute, parallelism, 8, 1)
    };
    let plain = bf16(Parallelism::data_parallel(8)).lower().unwrap();
    let sharded = bf16(Parallelism { zero: 3, ..Parallelism::data_parallel(8) }).lower().unwrap();
    // Bytes each rank puts on the wire: (d-1)/d of an allgather's or reduce-scatter's buffer,
    // twice that for an allreduce.
    let wire = |lowered: &Lowered| -> u64 {
        [DATA_STREAM, GATHER_STREAM]
            .iter()
            .flat_map(|stream| rank_traffic(&lowered.graph, 0, *stream))
            .map(|(kind, bytes)| if kind == Some(CollectiveKind::AllReduce) { 2 * bytes } else { bytes })
            .sum()
    };
    assert_eq!(2 * wire(&sharded), 3 * wire(&plain));
    // Parameters gathered per unit twice (forward and backward), gradients scattered once.
    let gathers = rank_traffic(&sharded.graph, 0, GATHER_STREAM);
    assert!(gathers.iter().all(|(kind, _)| *kind == Some(CollectiveKind::AllGather)));
    assert_eq!(gathers.iter().map(|(_, b)| b).sum::<u64>(), 2 * 2 * model.parameters());
    // And it runs: every rank's optimizer holds an eighth of the parameters.
    let timeline = NetworkSettings::new(Fidelity::Analytical).run(&sharded.graph, &dgx(1)).unwrap();
    assert!(timeline.makespan() > SimDuration::ZERO);
    assert!(sharded.stages[0].memory.weights.0 * 8 <= 2 * model.parameters() + 8);
}

#[test]
fn deepspeed_zero3_gathers_per_parameter_and_all_reduces_fp16_gradient_buckets() {
    use crate::deepspeed_zero3::{PARAM_PERSISTENCE_THRESHOLD, REDUCE_BUCKET_SIZE};
    let model = zoo::by_name("megatron-1.7b").unwrap();
    let compute = ComputeModel::default();
    let lower = |zero_implementation, recompute| {
        Strategy {
            recompute,
            ..strategy(
                &model,
                &compute,
                Parallelism { zero: 3, zero_implementation, ..Parallelism::data_parallel(8) },
                8,
                1,
            )
        }
        .lower()
        .unwrap()
    };
    let deepspeed = lower(ZeroImplementation::DeepSpeed, Recompute::Full);
    let ops = rank_traffic(&deepspeed.graph, 0, GATHER_STREAM);
    let gathers: Vec<u64> =
        ops.iter().filter(|(kind, _)| *kind == Some(CollectiveKind::AllGather)).map(|(_, b)| *b).collect();
    let reduces: Vec<u64> =
        ops.iter().filter(|(kind, _)| *kind == Some(CollectiveKind::AllReduce)).map(|(_, b)| *b).collect();
    assert_eq!(gathers.len() + reduces.len(), ops.len(), "only gathers and gradient allreduces: {ops:?}");
    // One gather per parameter tensor (never a whole block): none larger than the largest
    // weight (the embedding, 50304 x 2304 in fp16), none of a bias or a norm.
    let largest = model.layers.iter().map(|l| l.cost.params).max().unwrap();
    assert!(gathers.iter().all(|&b| b <= 2 * largest && b >= 2 * PARAM_PERSISTENCE_THRESHOLD), "{gathers:?}");
    // Forward, recomputation and backward: every partitioned weight at least once, at most
    // three times, plus the tied output layer's embedding; fewer than twice on average here,
    // as the model's 1.7e9 parameters are not much above the 1e9-element reuse distance (the
    // last blocks' forward copies are kept for their recomputation, the recomputed copies for
    // the backward).
    let partitioned: u64 =
        model.layers.iter().map(|l| crate::deepspeed_zero3::partitioned_and_persistent(l).0).sum();
    let gathered: u64 = gathers.iter().sum();
    assert!(gathered > 2 * partitioned && gathered <= 2 * 3 * (partitioned + largest), "{gathered}");
    // Every gradient all-reduced once, in fp16, in buckets of at most 5e8 elements.
    assert_eq!(reduces.iter().sum::<u64>(), 2 * model.parameters());
    assert!(reduces.iter().all(|&b| b <= 2 * REDUCE_BUCKET_SIZE.max(largest)));
    assert_eq!(deepspeed.gradient_bytes, 2 * model.parameters());
    // FSDP gathers whole blocks, so DeepSpeed issues several times as many gathers.
    let fsdp = lower(ZeroImplementation::Fsdp, Recompute::Full);
    let fsdp_gathers = rank_traffic(&fsdp.graph, 0, GATHER_STREAM).len();
    assert!(gathers.len() > 3 * fsdp_gathers, "{} vs {fsdp_gathers}", gathers.len());
    // PyTorch's list allgather copies each of the 8 ranks' chunks out with its own kernel: the
    // host issues 8 launches after every gather.
    let host_cost = compute.host_cost_per_kernel();
    assert!(host_cost > SimDuration::ZERO);
    let copies: Vec<SimDuration> = deepspeed
        .graph
        .ops()
        .iter()
        .filter(|op| op.rank == RankId(0) && deepspeed.graph.label(op.label).contains("copy-out"))
        .map(|op| match op.kind {
            OpKind::Compute { duration } => duration,
            _ => panic!("a host op"),
        })
        .collect();
    assert_eq!(copies.len(), gathers.len());
    assert!(copies.iter().all(|&d| d.as_ps() == 8 * host_cost.as_ps()));
    let timeline = NetworkSettings::new(Fidelity::Analytical).run(&deepspeed.graph, &dgx(1)).unwrap();
    assert!(timeline.makespan() > SimDuration::ZERO);
}

#[test]
fn deepspeed_zero3_host_time_grows_with_the_ranks_by_the_copy_out_launches() {
    // After DeepSpeed's torch.cuda.synchronize the GPU waits while the host issues a gather
    // and its `world_size` copy-out kernels (in part behind the gather itself). The host's
    // share of the step (eager minus CUDA graphs, same per-GPU work) grows from 8 to 16 ranks
    // by about 8 more launches per gather.
    let model = zoo::by_name("megatron-1.7b").unwrap();
    let eager = ComputeModel::default();
    let graphs = ComputeModel { cuda_graphs: true, ..eager.clone() };
    let run = |compute: &ComputeModel, ranks: u32| {
        let parallelism = Parallelism {
            zero: 3,
            zero_implementation: ZeroImplementation::DeepSpeed,
            ..Parallelism::data_parallel(ranks)
        };
        let lowered = strategy(&model, compute, parallelism, u64::from(ranks), 1).lower().unwrap();
        let gathers = rank_traffic(&lowered.graph, 0, GATHER_STREAM)
            .iter()
            .filter(|(kind, _)| *kind == Some(CollectiveKind::AllGather))
            .count() as u64;
        let timeline =
            NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, &dgx(ranks / 8)).unwrap();
        (timeline.makespan().as_ps() as f64, gathers)
    };
    let host_share = |ranks| {
        let ((with_host, gathers), (without_host, same)) = (run(&eager, ranks), run(&graphs, ranks));
        assert_eq!(gathers, same);
        (with_host - without_host, gathers)
    };
    let ((eight, gathers), (sixteen, same)) = (host_share(8), host_share(16));
    assert_eq!(gathers, same);
    let launches = (gathers * 8) as f64 * eager.host_cost_per_kernel().as_ps() as f64;
    let growth = sixteen - eight;
    assert!(growth > 0.5 * launches && growth < 1.2 * launches, "{growth} vs {launches}");
}

#[test]
fn deepspeed_zero3_holds_a_bounded_number_of_gathered_parameters() {
    // GPT 529.6B on 640 GPUs at micro-batch 4 (Megatron-LM SC'21 Table 2): FSDP-style units
    // (two 5e9-parameter blocks gathered with their fp32 gradients) do not fit in 80 GB;
    // DeepSpeed's coordinator holds at most a few weights (each up to 1.68e9 elements) past
    // stage3_max_live_parameters, and its gradient buckets.
    let model = zoo::by_name("megatron-529.6b").unwrap();
    let compute = ComputeModel::default();
    let memory = |zero_implementation| {
        let parallelism = Parallelism { zero: 3, zero_implementation, ..Parallelism::data_parallel(640) };
        let strategy = Strategy {
            recompute: Recompute::Full,
            passes: Default::default(),
            fold_symmetric_ranks: true,
            ..strategy(&model, &compute, parallelism, 2560, 4)
        };
        strategy.estimate(&|_| SimDuration::ZERO).unwrap().stages[0].memory
    };
    let fsdp = memory(ZeroImplementation::Fsdp);
    let deepspeed = memory(ZeroImplementation::DeepSpeed);
    let largest = model.layers.iter().map(|l| l.cost.params).max().unwrap();
    let gradients = crate::deepspeed_zero3::gradient_buffer_elements(largest);
    let temporary = |m: &MemoryBreakdown| m.temporary.0;
    let block: u64 =
        model.layers.iter().filter(|l| l.name.starts_with("layers.0.")).map(|l| l.cost.params).sum();
    assert!(block > 5_000_000_000 && temporary(&fsdp) >= 2 * block * 6, "{}", temporary(&fsdp));
    // Gathered parameters under 4 weights, plus the gradient buffers, plus the same activation
    // gradient pair as FSDP's.
    let pair = temporary(&fsdp) - 2 * block * 6;
    assert!(temporary(&deepspeed) <= pair + 2 * (4 * largest + gradients), "{}", temporary(&deepspeed));
    assert!(fsdp.total().0 > 80 << 30 && deepspeed.total().0 < 80 << 30, "{fsdp:?} {deepspeed:?}");
}

#[test]
fn skewed_routing_slows_the_expert_layers_up_to_the_capacity_factor() {
    let model = zoo::by_name("mixtral-8x7b").unwrap();
    let compute = ComputeModel::default();
    let expert_time = |skew: f64, capacity: Option<f64>| -> (f64, u64) {
        let parallelism = Parallelism {
            data: 4,
            expert: 4,
            expert_skew: skew,
            capacity_factor: capacity,
            ..Parallelism::data_parallel(4)
        };
        let lowered = strategy(&model, &compute, parallelism, 4, 1).lower().unwrap();
        let graph = &lowered.graph;
        let time = graph
            .ops()
            .iter()
            .filter(|op| op.rank == RankId(0) && graph.label(op.label) == "layers.0.moe.experts forward")
            .map(|op| match op.kind {
                OpKind::Compute { duration } => duration.as_secs_f64(),
                _ => 0.0,
            })
            .sum();
        let bytes = rank_traffic(graph, 0, EXPERT_STREAM)[0].1;
        (time, bytes)
    };
    let (balanced, balanced_bytes) = expert_time(1.0, None);
    let (skewed, skewed_bytes) = expert_time(2.0, None);
    let (capped, capped_bytes) = expert_time(2.0, Some(1.25));
    assert!((skewed / balanced - 2.0).abs() < 1e-6, "{skewed} vs {balanced}");
    assert!((capped / balanced - 1.25).abs() < 1e-6, "{capped} vs {balanced}");
    assert_eq!(skewed_bytes, 2 * balanced_bytes);
    assert_eq!(capped_bytes * 4, balanced_bytes * 5);
}

#[test]
fn a_tied_output_layer_sums_its_embedding_copies_between_the_first_and_last_stages() {
    let model = zoo::by_name("megatron-1.7b").unwrap(); // output layer tied to the embedding
    let compute = ComputeModel::default();
    let lowered =
        strategy(&model, &compute, pipelined(4, 1, PipelineSchedule::OneFOneB), 8, 1).lower().unwrap();
    let graph = &lowered.graph;
    let tied = |rank: u32| -> Vec<u64> {
        graph
            .ops()
            .iter()
            .filter(|op| {
                op.rank == RankId(rank) && graph.label(op.label) == "tied embedding gradient allreduce"
            })
            .map(|op| match op.kind {
                OpKind::Collective(id) => graph.collective(id).bytes.0,
                _ => 0,
            })
            .collect()
    };
    let vocabulary = 51_200u64; // Megatron's padded GPT-2 vocabulary
    let embedding = vocabulary * 2304;
    assert_eq!(tied(0), vec![embedding * 4]);
    assert_eq!(tied(3), vec![embedding * 4]);
    assert!(tied(1).is_empty() && tied(2).is_empty());
    // The last stage holds the copy.
    let last = &lowered.stages[3];
    let first = &lowered.stages[0];
    assert!(last.parameters > embedding && first.parameters > embedding);
}

#[test]
fn llama_405b_on_8_by_8_chunks_gives_each_end_one_layer_as_megatron_core_does() {
    // 126 layers do not divide into 64 chunks; counting the embedding and the output layer as
    // layers (Megatron-Core's account_for_embedding_in_pipeline_split) gives each end one.
    let model = zoo::by_name("llama3-405b").unwrap();
    assert!((model.parameters() as f64 / 405.85e9 - 1.0).abs() < 0.001, "{}", model.parameters());
    let compute = ComputeModel::default();
    let parallelism = Parallelism { tensor: 8, ..pipelined(8, 8, PipelineSchedule::OneFOneB) };
    let lowered = strategy(&model, &compute, parallelism, 8, 1).lower().unwrap();
    let blocks_per_chunk: Vec<Vec<usize>> = lowered
        .stages
        .iter()
        .map(|stage| {
            stage
                .layers
                .iter()
                .map(|range| {
                    let names: std::collections::BTreeSet<&str> = model.layers[range.clone()]
                        .iter()
                        .filter_map(|l| {
                            l.name.strip_prefix("layers.").and_then(|rest| rest.split('.').next())
                        })
                        .collect();
                    names.len()
                })
                .collect()
        })
        .collect();
    // Chunk k is on stage k % 8: the first chunk (stage 0, chunk 0) and the last (stage 7,
    // chunk 7) hold one layer, every other two.
    assert_eq!(blocks_per_chunk[0][0], 1, "{blocks_per_chunk:?}");
    assert_eq!(blocks_per_chunk[7][7], 1, "{blocks_per_chunk:?}");
    let total: usize = blocks_per_chunk.iter().flatten().sum();
    assert_eq!(total, 126);
    assert!(blocks_per_chunk.iter().flatten().filter(|&&n| n == 2).count() == 62);
}

#[test]
fn tiny_kernels_wait_for_the_host_unless_cuda_graphs_launch_them() {
    // 16 linear layers of 64 features on 1024 tokens: each kernel takes a few microseconds, less
    // than the 50 us the host spends launching it, so the step is host-bound.
    let model = uniform_model(8, 64);
    let host = SimDuration::from_us(50);
    let eager = ComputeModel { dispatch_overhead: host, ..ComputeModel::default() };
    let graphs = ComputeModel { cuda_graphs: true, ..eager.clone() };
    let time = |compute: &ComputeModel| {
        let lowered = strategy(&model, compute, Parallelism::data_parallel(1), 1, 1).lower().unwrap();
        let kernels = lowered.graph.ops().iter().filter(|op| op.stream == COMPUTE_STREAM).count() as u64;
        let timeline =
            NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, &instant_server(1)).unwrap();
        (timeline.makespan(), kernels)
    };
    let (eager_time, kernels) = time(&eager);
    let (graph_time, _) = time(&graphs);
    // Every kernel but the optimizer is launched by the host, 50 us apart; the last then runs.
    let launches = host.checked_mul(kernels - 1).unwrap();
    assert!(
        eager_time > launches && eager_time < launches.checked_add(SimDuration::from_us(200)).unwrap(),
        "{eager_time} for {kernels} kernels"
    );
    assert!(graph_time.checked_mul(4).unwrap() < eager_time, "CUDA graphs {graph_time}, eager {eager_time}");
}

/// `compute.autocast`: each linear layer's weight cast (forward) and its gradient's cast back
/// (weight-gradient pass) are launches of their own, further kernels of their pass at the
/// host's cost per op, so a host-bound step of 16 bias-free linear layers pays exactly 2 x 16
/// more op launches, and the casts' own GPU time is hidden behind them.
#[test]
fn autocast_casts_are_launches_of_their_own() {
    let model = uniform_model(8, 64);
    let (host, op) = (SimDuration::from_us(50), SimDuration::from_us(30));
    let eager = ComputeModel { dispatch_overhead: host, op_dispatch_overhead: op, ..ComputeModel::default() };
    let autocast = ComputeModel { autocast: true, ..eager.clone() };
    let time = |compute: &ComputeModel| {
        let lowered = strategy(&model, compute, Parallelism::data_parallel(1), 1, 1).lower().unwrap();
        NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, &instant_server(1)).unwrap().makespan()
    };
    let (plain, cast) = (time(&eager), time(&autocast));
    let extra = op.checked_mul(2 * 16).unwrap();
    assert!(
        cast >= plain.checked_add(extra).unwrap()
            && cast < plain.checked_add(extra).unwrap().checked_add(SimDuration::from_us(20)).unwrap(),
        "autocast {cast}, without {plain}: {extra} of launches expected"
    );
    // In fp32 autocast casts nothing.
    let fp32 = |compute: &ComputeModel| {
        let mut strategy = strategy(&model, compute, Parallelism::data_parallel(1), 1, 1);
        strategy.precision = Dtype::Fp32;
        let lowered = strategy.lower().unwrap();
        NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, &instant_server(1)).unwrap().makespan()
    };
    assert_eq!(fp32(&eager), fp32(&autocast));
}

/// `compute.host-synchronous`: the host waits for each kernel before it launches the next, so
/// one replica's step is the closed form of `dispatch::issue_synchronous`, the sum of the host
/// cost of every launch and of every kernel, however long the kernels (here 50 us launches of
/// long and short kernels alike); the asynchronous host hides its launches behind them.
#[test]
fn a_synchronous_host_pays_every_launch_after_its_kernel() {
    let model = uniform_model(8, 1024);
    let host = SimDuration::from_us(50);
    let eager = ComputeModel { dispatch_overhead: host, ..ComputeModel::default() };
    let synchronous = ComputeModel { host_synchronous: true, ..eager.clone() };
    let run = |compute: &ComputeModel| {
        let lowered = strategy(&model, compute, Parallelism::data_parallel(1), 64, 64).lower().unwrap();
        let ops = lowered.graph.ops();
        let launches = ops.iter().filter(|op| op.stream == HOST_STREAM).count() as u64;
        let kernels: u64 = ops
            .iter()
            .filter(|op| op.stream == COMPUTE_STREAM)
            .map(|op| match op.kind {
                OpKind::Compute { duration } => duration.as_ps(),
                _ => 0,
            })
            .sum();
        let timeline =
            NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, &instant_server(1)).unwrap();
        (timeline.makespan(), launches, SimDuration::from_ps(kernels))
    };
    let (synchronous_time, launches, kernels) = run(&synchronous);
    let closed_form = host.checked_mul(launches).unwrap().checked_add(kernels).unwrap();
    assert_eq!(SimDuration::from_ps(synchronous_time.as_ps()), closed_form, "{launches} launches");
    let (eager_time, eager_launches, _) = run(&eager);
    assert_eq!(eager_launches, launches);
    assert!(eager_time < synchronous_time, "eager {eager_time}, synchronous {synchronous_time}");
    // The kernels are long enough to hide all but the first launch from the eager host.
    assert!(kernels > host.checked_mul(launches).unwrap());
}

/// `compute.step-overhead`: the training loop's host work after the step's synchronisation adds
/// exactly its duration to an iteration, eager or under CUDA graphs (the loop is not captured),
/// and the host op that carries it starts only once the rank's device work has finished.
#[test]
fn the_training_loops_step_overhead_adds_exactly_once_per_iteration() {
    let model = uniform_model(8, 1024);
    let step = SimDuration::from_ms(7);
    let run = |compute: &ComputeModel| {
        let lowered = strategy(&model, compute, Parallelism::data_parallel(2), 64, 32).lower().unwrap();
        let timeline =
            NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, &instant_server(2)).unwrap();
        timeline.makespan().as_ps()
    };
    for base in [
        ComputeModel { dispatch_overhead: SimDuration::from_us(30), ..ComputeModel::default() },
        ComputeModel { cuda_graphs: true, ..ComputeModel::default() },
    ] {
        let with_step = ComputeModel { step_overhead: step, ..base.clone() };
        assert_eq!(run(&with_step), run(&base) + step.as_ps(), "cuda graphs {}", base.cuda_graphs);
    }
}

/// `compute.host-nan-checks` (Megatron-LM's NaN/Inf checks): the host reads each micro-batch's
/// loss after its forward, so it launches the next kernel only once the loss has run. On one
/// GPU whose kernels are far longer than a launch (the host otherwise runs ahead and the GPU
/// never waits), forward passes alone (`workload.passes = "forward"`): each of the `m` checks
/// but the last (after which nothing is launched) leaves the GPU idle for exactly one launch,
/// so the step grows by `m - 1` launches. In training, each micro-batch's loss and (one replica
/// still runs DDP's bucket checks) each gradient bucket is read: at least one launch per loss
/// check, at most two per bucket (the reduction's launch and the next kernel's).
#[test]
fn a_host_that_reads_each_loss_pays_one_launch_per_micro_batch_on_a_busy_gpu() {
    use crate::passes::Passes;
    let model = uniform_model(8, 1024);
    let host = SimDuration::from_us(20);
    let eager = ComputeModel { dispatch_overhead: host, ..ComputeModel::default() };
    let checked = ComputeModel { host_nan_checks: true, ..eager.clone() };
    let run = |compute: &ComputeModel, passes: Passes| {
        let lowered =
            Strategy { passes, ..strategy(&model, compute, Parallelism::data_parallel(1), 256, 64) }
                .lower()
                .unwrap();
        let graph = &lowered.graph;
        let checks = |what: &str| {
            graph
                .ops()
                .iter()
                .filter(|op| op.stream == HOST_STREAM && graph.label(op.label).contains(what))
                .count() as u64
        };
        let shortest = graph
            .ops()
            .iter()
            .filter(|op| op.stream == COMPUTE_STREAM)
            .filter_map(|op| match op.kind {
                OpKind::Compute { duration } => Some(duration),
                _ => None,
            })
            .min()
            .unwrap();
        let timeline = NetworkSettings::new(Fidelity::Analytical).run(graph, &instant_server(1)).unwrap();
        (timeline.makespan(), checks("loss NaN/Inf"), checks("gradient NaN/Inf"), shortest)
    };
    let launches = |n: u64| host.checked_mul(n).unwrap();
    let (free, loss_checks, _, shortest) = run(&eager, Passes::Forward);
    assert_eq!(loss_checks, 0);
    assert!(shortest > launches(4), "kernels of {shortest} against launches of {host}");
    let (with_checks, loss_checks, gradient_checks, _) = run(&checked, Passes::Forward);
    assert_eq!((loss_checks, gradient_checks), (4, 0), "four micro-batches of 64, no backward");
    assert_eq!(with_checks, free.checked_add(launches(3)).unwrap(), "{free} without the checks");

    let (free, _, _, _) = run(&eager, Passes::Training);
    let (with_checks, loss_checks, buckets, _) = run(&checked, Passes::Training);
    assert_eq!(loss_checks, 4);
    assert!(buckets >= 1);
    let added = SimDuration::from_ps(with_checks.as_ps() - free.as_ps());
    assert!(
        added >= launches(loss_checks) && added <= launches(loss_checks + 2 * buckets),
        "{added} for {loss_checks} losses and {buckets} buckets"
    );
}

/// `compute.host-nan-checks` checks each gradient bucket's norm before its data-parallel
/// reduction (Megatron's `check_grads`): one host read per bucket in the last micro-batch,
/// after the bucket's last gradient kernel. Without modelled launches (CUDA graphs) a host wait
/// delays nothing and the graph is the one without the checks, op for op.
#[test]
fn host_nan_checks_read_each_bucket_and_change_nothing_without_launches() {
    let model = uniform_model(8, 256);
    let eager = ComputeModel { dispatch_overhead: SimDuration::from_us(20), ..ComputeModel::default() };
    let parallelism = Parallelism {
        bucket_cap: Bytes(2 << 20),
        first_bucket_cap: Bytes(2 << 20),
        ..Parallelism::data_parallel(4)
    };
    let describe = |compute: &ComputeModel| {
        let lowered = strategy(&model, compute, parallelism, 64, 4).lower().unwrap();
        let graph = &lowered.graph;
        let named = |what: &str| graph.ops().iter().filter(|op| graph.label(op.label).contains(what)).count();
        let reductions = graph
            .ops()
            .iter()
            .filter(|op| op.rank == RankId(0) && op.stream == DATA_STREAM)
            .filter(|op| matches!(op.kind, OpKind::Collective(_)))
            .count();
        let ops: Vec<String> = graph.ops().iter().map(|op| format!("{op:?}")).collect();
        (ops, named("gradient NaN/Inf"), named("loss NaN/Inf"), reductions)
    };
    let (_, gradient_checks, loss_checks, reductions) =
        describe(&ComputeModel { host_nan_checks: true, ..eager.clone() });
    assert!(reductions > 1, "{reductions} buckets");
    assert_eq!(gradient_checks, 4 * reductions, "one check per bucket and rank");
    assert_eq!(loss_checks, 4 * 4, "four micro-batches on each of four ranks");
    let graphs = ComputeModel { cuda_graphs: true, ..eager };
    let checked_graphs = ComputeModel { host_nan_checks: true, ..graphs.clone() };
    assert_eq!(describe(&graphs), describe(&checked_graphs));
}

/// `parallelism.pipeline-host-sync`: Megatron's host calls `torch.cuda.synchronize()` after every
/// pipeline exchange. On a 2-stage pipeline of one micro-batch whose host is far slower than its
/// kernels, the stages then take turns: stage 0 launches its forward and its send, waits for the
/// gradient, which stage 1 can only start on once the activation has arrived (its host waits
/// for it), then launches its backward. The step is the host cost of every launch of both
/// stages but stage 1's last one (its gradient-norm allreduce, launched while stage 0 runs its
/// backward), plus device time at most; without the sync, each host launches ahead and the
/// step is about the busier stage's launches.
#[test]
fn a_host_that_synchronises_at_pipeline_exchanges_serialises_the_stages() {
    let model = uniform_model(4, 64);
    let host = SimDuration::from_us(500);
    let compute = ComputeModel { dispatch_overhead: host, ..ComputeModel::default() };
    let run = |sync: PipelineHostSync| {
        let parallelism =
            Parallelism { pipeline_host_sync: sync, ..pipelined(2, 1, PipelineSchedule::OneFOneB) };
        let lowered = strategy(&model, &compute, parallelism, 1, 1).lower().unwrap();
        let ops = lowered.graph.ops();
        let launches = |rank: u32| {
            ops.iter()
                .filter(|op| op.rank == RankId(rank) && op.stream == HOST_STREAM)
                .filter(|op| matches!(op.kind, OpKind::Compute { duration } if duration > SimDuration::ZERO))
                .count() as u64
        };
        // Every op's own time: the kernels, the optimizer, the transfers (next to nothing on
        // this server) are what the device can add to the host's.
        let device: u64 = ops
            .iter()
            .filter(|op| op.stream != HOST_STREAM)
            .map(|op| match op.kind {
                OpKind::Compute { duration } => duration.as_ps(),
                _ => 0,
            })
            .sum();
        let timeline =
            NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, &instant_server(2)).unwrap();
        (timeline.makespan(), launches(0), launches(1), SimDuration::from_ps(device))
    };
    let (synchronised, first, last, device) = run(PipelineHostSync::EveryExchange);
    let serial = host.checked_mul(first + last - 1).unwrap();
    // Slack for the collectives' and transfers' own times on the instant server.
    let slack = SimDuration::from_us(20);
    assert!(device < host, "device {device} against one launch {host}");
    assert!(
        synchronised >= serial
            && synchronised <= serial.checked_add(device).unwrap().checked_add(slack).unwrap(),
        "{synchronised}: {first} + {last} launches, device {device}"
    );
    let (free, free_first, free_last, _) = run(PipelineHostSync::None);
    assert_eq!((free_first, free_last), (first, last), "the sync launches nothing");
    let busier = host.checked_mul(first.max(last) + 2).unwrap().checked_add(device).unwrap();
    assert!(free <= busier, "{free} without the sync, {busier} at most");
    assert!(free.checked_add(host.checked_mul(first.min(last) - 3).unwrap()).unwrap() < synchronised);
}

/// Without the setting, or where it does not apply (no pipeline; an interleaved pipeline under
/// Megatron-Core's `unless-interleaved`; no modelled launches under CUDA graphs), the graph is
/// the one without it, op for op.
#[test]
fn pipeline_host_sync_changes_nothing_where_it_does_not_apply() {
    let model = uniform_model(8, 256);
    let eager = ComputeModel { dispatch_overhead: SimDuration::from_us(20), ..ComputeModel::default() };
    let graphs = ComputeModel { cuda_graphs: true, ..eager.clone() };
    let describe = |compute: &ComputeModel, parallelism: Parallelism| {
        let lowered = strategy(&model, compute, parallelism, 64, 4).lower().unwrap();
        let timeline =
            NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, &instant_server(8)).unwrap();
        let ops: Vec<String> = lowered.graph.ops().iter().map(|op| format!("{op:?}")).collect();
        (ops, timeline.makespan())
    };
    let cases = [
        (&eager, Parallelism::data_parallel(8), PipelineHostSync::EveryExchange),
        (&eager, pipelined(4, 2, PipelineSchedule::OneFOneB), PipelineHostSync::UnlessInterleaved),
        (&graphs, pipelined(4, 1, PipelineSchedule::OneFOneB), PipelineHostSync::EveryExchange),
    ];
    for (compute, parallelism, sync) in cases {
        let with = Parallelism { pipeline_host_sync: sync, ..parallelism };
        assert_eq!(describe(compute, parallelism), describe(compute, with), "{with:?}");
    }
    // Where it applies, it adds only the host's zero-time waits, and slows the step.
    let plain = pipelined(4, 1, PipelineSchedule::OneFOneB);
    let (ops, time) = describe(&eager, plain);
    let synced = Parallelism { pipeline_host_sync: PipelineHostSync::UnlessInterleaved, ..plain };
    let (synced_ops, synced_time) = describe(&eager, synced);
    assert!(synced_ops.len() > ops.len() && synced_time > time, "{time} -> {synced_time}");
}

/// `parallelism.pipeline-scatter-gather` (Megatron-LM's default before Megatron-Core): with
/// tensor parallelism every tensor rank sends 1/t of the boundary activation to its peer of the
/// next stage (and of the gradient back), and each receiver all-gathers the t slices, the whole
/// tensor, over its tensor group before the chunk runs. Bytes are conserved: t ranks send the
/// tensor once between them. With sequence parallelism (each rank already holds 1/t) or
/// without tensor parallelism the graph is the one without the setting, op for op.
#[test]
fn pipeline_scatter_gather_sends_a_slice_and_gathers_it() {
    let model = uniform_model(4, 256);
    let compute = ComputeModel::default();
    let base = Parallelism { tensor: 2, ..pipelined(2, 1, PipelineSchedule::OneFOneB) };
    let micro = 4u64;
    let lower =
        |parallelism: Parallelism| strategy(&model, &compute, parallelism, micro * 2, micro).lower().unwrap();
    let plain = lower(base);
    let scattered = lower(Parallelism { pipeline_scatter_gather: true, ..base });
    let transfers = |graph: &ExecGraph| -> Vec<u64> {
        graph
            .ops()
            .iter()
            .filter_map(|op| match op.kind {
                OpKind::Transfer { bytes, .. } => Some(bytes.0),
                _ => None,
            })
            .collect()
    };
    let gathers = |graph: &ExecGraph| -> Vec<(u32, u64)> {
        graph
            .ops()
            .iter()
            .filter_map(|op| match op.kind {
                OpKind::Collective(id) if graph.collective(id).kind == CollectiveKind::AllGather => {
                    Some((op.rank.0, graph.collective(id).bytes.0))
                }
                _ => None,
            })
            .collect()
    };
    let (whole, slices) = (transfers(&plain.graph), transfers(&scattered.graph));
    assert_eq!(whole.len(), slices.len(), "the same sends, each smaller");
    assert!(!whole.is_empty());
    for (w, s) in whole.iter().zip(&slices) {
        assert_eq!(*s * 2, *w, "each tensor rank sends half the boundary tensor");
    }
    // Every transfer is received once and all-gathered there, the whole tensor (the bytes a
    // plain send carries), by the receiving rank.
    assert!(gathers(&plain.graph).is_empty());
    let mut gathered: Vec<u64> = gathers(&scattered.graph).into_iter().map(|(_, bytes)| bytes).collect();
    let mut expected = whole.clone();
    gathered.sort_unstable();
    expected.sort_unstable();
    assert_eq!(gathered, expected);
    // It does not apply with sequence parallelism or without tensor parallelism.
    let describe = |parallelism: Parallelism| -> Vec<String> {
        lower(parallelism).graph.ops().iter().map(|op| format!("{op:?}")).collect()
    };
    for parallelism in
        [Parallelism { sequence_parallel: true, ..base }, pipelined(2, 1, PipelineSchedule::OneFOneB)]
    {
        let with = Parallelism { pipeline_scatter_gather: true, ..parallelism };
        assert_eq!(describe(parallelism), describe(with), "{with:?}");
    }
}

#[test]
fn shared_layer_tables_give_the_same_estimates_and_graphs() {
    let compute = ComputeModel::default();
    for name in ["megatron-1.7b", "resnet50"] {
        let model = zoo::by_name(name).unwrap();
        let transformer = name.starts_with("megatron");
        let device = DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap();
        let tables = LayerTables::new(&model, device, &compute);
        let mut configurations =
            vec![Parallelism::data_parallel(8), pipelined(4, 1, PipelineSchedule::OneFOneB)];
        if transformer {
            configurations.push(Parallelism { tensor: 2, ..Parallelism::data_parallel(4) });
            configurations.push(Parallelism {
                tensor: 4,
                sequence_parallel: true,
                ..pipelined(2, 2, PipelineSchedule::OneFOneB)
            });
        } else {
            configurations.push(Parallelism { channel: 2, ..Parallelism::data_parallel(4) });
        }
        // Twice over: the second round reads every table the first built.
        for _ in 0..2 {
            for &parallelism in &configurations {
                for micro in [1u64, 2] {
                    let plain =
                        Strategy { device, ..strategy(&model, &compute, parallelism, 16 * micro, micro) };
                    let shared = Strategy { layer_tables: Some(&tables), ..plain.clone() };
                    let (a, b) =
                        (plain.estimate(&|_| SimDuration::ZERO), shared.estimate(&|_| SimDuration::ZERO));
                    let label = format!("{name} {parallelism:?} micro {micro}");
                    match (a, b) {
                        (Ok(a), Ok(b)) => {
                            assert_eq!(a.time_lower_bound, b.time_lower_bound, "{label}");
                            assert_eq!(
                                a.flops_per_rank_iteration.to_bits(),
                                b.flops_per_rank_iteration.to_bits()
                            );
                            assert_eq!(a.stages, b.stages, "{label}");
                            let (a, b) = (plain.lower().unwrap(), shared.lower().unwrap());
                            assert_eq!(format!("{:?}", a.graph), format!("{:?}", b.graph), "{label}");
                        }
                        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{label}"),
                        (a, b) => panic!("{label}: {a:?} against {b:?}"),
                    }
                }
            }
        }
        // A strategy on another compute model does not use them.
        let other = ComputeModel { gemm_efficiency: 0.5, ..ComputeModel::default() };
        let plain = strategy(&model, &other, Parallelism::data_parallel(8), 16, 2);
        let shared = Strategy { layer_tables: Some(&tables), device, ..plain.clone() };
        let plain = Strategy { device, ..plain };
        assert_eq!(
            plain.estimate(&|_| SimDuration::ZERO).unwrap().time_lower_bound,
            shared.estimate(&|_| SimDuration::ZERO).unwrap().time_lower_bound
        );
    }
}

#[test]
fn the_estimate_bounds_every_simulation_from_below_and_is_exact_for_an_uncontended_pipeline() {
    // Closed form: on an instant network 1F1B and GPipe take (m + p - 1)(F + B) plus the
    // optimizer step, which is the bound.
    let model = uniform_model(8, 4096);
    let compute = ComputeModel::default();
    for schedule in [PipelineSchedule::GPipe, PipelineSchedule::OneFOneB] {
        for (chunks, m) in [(1u32, 4u64), (1, 16), (2, 8)] {
            if schedule == PipelineSchedule::GPipe && chunks > 1 {
                continue;
            }
            let s = strategy(&model, &compute, pipelined(4, chunks, schedule), m * 2, 2);
            let bound = s.estimate(&|_| SimDuration::ZERO).unwrap().time_lower_bound.as_secs_f64();
            let lowered = s.lower().unwrap();
            let timeline =
                NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, &instant_server(4)).unwrap();
            let simulated = timeline.makespan().as_secs_f64();
            assert!(
                bound <= simulated,
                "{schedule:?} v={chunks} m={m}: bound {bound} > simulated {simulated}"
            );
            if chunks == 1 {
                assert!(
                    bound > 0.995 * simulated,
                    "{schedule:?} m={m}: bound {bound}, simulated {simulated}"
                );
            }
        }
    }
    // Real models with communication, recomputation, ZeRO-3, context and the host: below.
    let gpt = zoo::by_name("megatron-1.7b").unwrap();
    let host = ComputeModel { dispatch_overhead: SimDuration::from_us(20), ..ComputeModel::default() };
    let cases: Vec<(Parallelism, Recompute, u64, u64)> = vec![
        (Parallelism { tensor: 8, data: 2, ..Parallelism::data_parallel(2) }, Recompute::Selective, 16, 2),
        (
            Parallelism {
                tensor: 2,
                sequence_parallel: true,
                pipeline: 4,
                data: 2,
                ..Parallelism::data_parallel(2)
            },
            Recompute::Full,
            32,
            1,
        ),
        (
            Parallelism { pipeline: 4, virtual_stages: 2, data: 4, ..Parallelism::data_parallel(4) },
            Recompute::None,
            32,
            1,
        ),
        (Parallelism { zero: 3, ..Parallelism::data_parallel(16) }, Recompute::None, 32, 2),
        (
            Parallelism { context: 2, tensor: 2, data: 4, ..Parallelism::data_parallel(4) },
            Recompute::None,
            8,
            2,
        ),
    ];
    for (parallelism, recompute, global, micro) in cases {
        for compute in [&compute, &host] {
            let s = Strategy { recompute, ..strategy(&gpt, compute, parallelism, global, micro) };
            let bound = s.estimate(&|_| SimDuration::ZERO).unwrap().time_lower_bound.as_secs_f64();
            let lowered = s.lower().unwrap();
            let timeline = NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, &dgx(2)).unwrap();
            let simulated = timeline.makespan().as_secs_f64();
            assert!(
                bound <= simulated && bound > 0.3 * simulated,
                "{}: bound {bound}, simulated {simulated}",
                crate::describe_parallelism(&parallelism)
            );
        }
    }
}

#[test]
fn a_plain_cnn_pipelines_layer_by_layer_sending_its_activation_per_micro_batch() {
    // HyPar-Flow / GPipe on VGG-16 (no residual blocks): stages cut between layers with
    // parameters; each stage sends, per micro-batch, the output of its last layer forward
    // and receives its gradient (the same bytes) backward.
    let model = zoo::by_name("vgg16").unwrap();
    let compute = ComputeModel::default();
    let (micro, micro_batches) = (8u64, 4u64);
    let s =
        strategy(&model, &compute, pipelined(4, 1, PipelineSchedule::GPipe), micro * micro_batches, micro);
    let lowered = s.lower().unwrap();
    assert_eq!(lowered.stages.len(), 4);
    let units = model.pipeline_units();
    assert_eq!(units.len(), 16, "13 convolutions and 3 linear layers");
    for (stage, summary) in lowered.stages.iter().enumerate() {
        let range = &summary.layers[0];
        assert!(
            units.iter().any(|u| u.start == range.start),
            "stage {stage} starts inside a unit: {range:?}"
        );
        let sent: Vec<u64> = rank_traffic(&lowered.graph, stage as u32, PIPELINE_STREAM)
            .into_iter()
            .filter(|(kind, _)| kind.is_none()) // sends, not the gradient-norm allreduce
            .map(|(_, bytes)| bytes)
            .collect();
        if stage == 0 {
            // Forward sends only (the first stage receives gradients, sends none back).
            let activation = model.layers[range.end - 1].output.elements() * micro * 2;
            assert_eq!(sent, vec![activation; micro_batches as usize], "stage 0");
        } else if stage == 3 {
            let gradient = model.layers[range.start].input.elements() * micro * 2;
            assert_eq!(sent, vec![gradient; micro_batches as usize], "stage 3");
        } else {
            assert_eq!(sent.len(), 2 * micro_batches as usize, "stage {stage}");
        }
    }
}

/// The FLOPs of a training iteration summed over every rank: what the model costs for the
/// whole batch (forward, backward-data except the first layer's, whose input needs no
/// gradient, and backward-weight).
fn model_iteration_flops(model: &Model, global: u64) -> f64 {
    let per_sample: f64 = model
        .layers
        .iter()
        .enumerate()
        .map(|(index, layer)| {
            let cost = &layer.cost;
            cost.forward_flops
                + cost.backward_weight_flops
                + if index == 0 { 0.0 } else { cost.backward_data_flops }
        })
        .sum();
    per_sample * global as f64
}

/// The lowering's layer FLOPs summed over every rank (one rank per stage in the kernel table,
/// times the ranks that run each stage's share).
fn lowered_iteration_flops(strategy: &Strategy<'_>, gpus: u32) -> f64 {
    let table = strategy.kernel_table().unwrap();
    let per_stage_ranks = f64::from(gpus / table.stages);
    table
        .kernels
        .iter()
        .filter(|row| matches!(row.pass, RowPass::Forward | RowPass::BackwardData | RowPass::BackwardWeight))
        .map(|row| row.flops * f64::from(row.runs) * per_stage_ranks)
        .sum()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// Splitting a transformer over data, tensor (with sequence parallelism) and pipeline
    /// ranks, in any micro-batching, neither loses nor duplicates work: the ranks' FLOPs add
    /// up to the model's for the batch.
    #[test]
    fn transformer_lowering_conserves_flops(
        data in proptest::sample::select(vec![1u32, 2, 4]),
        tensor in proptest::sample::select(vec![1u32, 2, 4]),
        pipeline in proptest::sample::select(vec![1u32, 2, 4]),
        micro in 1u64..=2,
        micro_batches in 1u64..=4,
    ) {
        let model = zoo::by_name("megatron-1.7b").unwrap();
        let compute = ComputeModel::default();
        let parallelism = Parallelism {
            tensor,
            sequence_parallel: tensor > 1,
            pipeline,
            ..Parallelism::data_parallel(data)
        };
        let global = u64::from(data) * micro * micro_batches;
        let lowered = lowered_iteration_flops(&strategy(&model, &compute, parallelism, global, micro), data * tensor * pipeline);
        let expected = model_iteration_flops(&model, global);
        // Tensor ranks repeat only element-wise work on whole activations: the row-parallel
        // layers' bias (added after the reduction, on every rank) and the embedding's position
        // add, 2e-5 of the total here; one matrix product repeated or lost would be over 3e-3.
        let tolerance = if tensor == 1 { 1e-9 } else { 1e-4 };
        proptest::prop_assert!(lowered >= expected * (1.0 - 1e-9), "work lost: {lowered} vs {expected}");
        proptest::prop_assert!(lowered / expected - 1.0 < tolerance, "work repeated: {lowered} vs {expected}");
    }

    /// The same for a CNN over data and layer-pipeline ranks.
    #[test]
    fn cnn_lowering_conserves_flops(
        data in proptest::sample::select(vec![1u32, 2, 4]),
        pipeline in proptest::sample::select(vec![1u32, 2, 4]),
        micro in 1u64..=8,
        micro_batches in 1u64..=3,
    ) {
        let model = zoo::by_name("resnet50").unwrap();
        let compute = ComputeModel::default();
        let parallelism = Parallelism { pipeline, ..Parallelism::data_parallel(data) };
        let global = u64::from(data) * micro * micro_batches;
        let lowered = lowered_iteration_flops(&strategy(&model, &compute, parallelism, global, micro), data * pipeline);
        let expected = model_iteration_flops(&model, global);
        proptest::prop_assert!((lowered / expected - 1.0).abs() < 1e-9, "{lowered} vs {expected}");
    }
}

/// Every compute op's duration by label on rank 0 (one iteration).
fn kernel_times(graph: &ExecGraph) -> std::collections::BTreeMap<String, SimDuration> {
    graph
        .ops()
        .iter()
        .filter(|op| op.rank == RankId(0))
        .filter_map(|op| match op.kind {
            OpKind::Compute { duration } => Some((graph.label(op.label).to_string(), duration)),
            _ => None,
        })
        .collect()
}

/// Group batch norm over GPU pairs: every batch norm's forward and backward-data kernel of
/// ResNet-50 is longer by exactly its exchanges' closed form, 2 x (0.6 us + 8 C bytes at
/// 300 GB/s), except the four projection shortcuts', which also run the ordering add; nothing
/// else changes. A group of one is today's lowering to the op.
#[test]
fn group_batch_norm_adds_the_exchanges_to_every_batch_norm_kernel() {
    let model = workloads::family::resnet50();
    let compute = ComputeModel::default();
    let plain = strategy(&model, &compute, Parallelism::data_parallel(2), 64, 32);
    let rate = Bandwidth::from_bytes_per_second(300_000_000_000).unwrap();
    let pair = workloads::groupbn::BatchNormGroup::new(2, SimDuration::from_ns(600), rate);
    let grouped = Strategy { batch_norm_group: pair, ..plain.clone() };
    let one = Strategy {
        batch_norm_group: workloads::groupbn::BatchNormGroup { size: 1, ..pair },
        ..plain.clone()
    };
    let (plain, grouped, one) = (plain.lower().unwrap(), grouped.lower().unwrap(), one.lower().unwrap());
    assert_eq!(format!("{:?}", one.graph.ops()), format!("{:?}", plain.graph.ops()));
    let (before, after) = (kernel_times(&plain.graph), kernel_times(&grouped.graph));
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>());
    let mut exchanged = 0;
    for layer in &model.layers {
        for pass in ["forward", "backward-data", "backward-weight"] {
            let label = format!("{} {pass}", layer.name);
            let (Some(&old), Some(&new)) = (before.get(&label), after.get(&label)) else { continue };
            let is_exchange = layer.kind == LayerKind::BatchNorm && pass != "backward-weight";
            if !is_exchange {
                assert_eq!(new, old, "{label}");
            } else if layer.name.contains(".downsample.") {
                assert!(
                    new > old.saturating_add(pair.exchange_time(256).unwrap()),
                    "{label}: the ordering add"
                );
            } else {
                let channels = layer.input.0[0];
                let transfer_ps = (channels * 8 * 1_000_000_000_000).div_ceil(300_000_000_000);
                assert_eq!(
                    new,
                    old.saturating_add(SimDuration::from_ps(2 * (600_000 + transfer_ps))),
                    "{label}"
                );
                exchanged += 1;
            }
        }
    }
    // 49 batch norms besides the four shortcuts', forward and backward.
    assert_eq!(exchanged, 2 * 49);
}

/// Every `mpi host staging` op's duration on rank 0, sorted.
fn staging_times(graph: &ExecGraph) -> Vec<SimDuration> {
    let mut times: Vec<SimDuration> = graph
        .ops()
        .iter()
        .filter(|op| op.rank == RankId(0) && graph.label(op.label) == HOST_STAGING_LABEL)
        .filter_map(|op| match op.kind {
            OpKind::Compute { duration } => Some(duration),
            _ => None,
        })
        .collect();
    times.sort();
    times
}

/// CUDA-aware MPI's host staging (`parallelism.cnn-transport`), op by op against its closed
/// form at 2 GB/s on fp16 ResNet-50 with 8 samples: channel parallelism inside a node stages
/// only the forward allreduce of each split layer (Open MPI's `coll/cuda`: 3 x `B y` bytes);
/// filter parallelism across nodes stages the `(p - 1) / p` of every allgather (`B y`) and
/// input-gradient exchange (`B x`, all but the first layer) a rank receives; spatial stripes
/// in managed memory stage their halos; the device transport stages nothing.
#[test]
fn host_staging_adds_each_mpi_message_at_the_staging_rate() {
    let model = workloads::family::resnet50();
    let compute = ComputeModel::default();
    let rate = Bandwidth::from_bytes_per_second(2_000_000_000).unwrap();
    let (b, w) = (8, 2);
    let split = |layer: &workloads::layer::Layer| {
        matches!(layer.kind, LayerKind::Conv { .. } | LayerKind::Linear { .. })
    };
    let at_rate = |bytes: u64| rate.time_to_send(Bytes(bytes)).unwrap();
    let sorted = |mut times: Vec<SimDuration>| {
        times.sort();
        times
    };

    let staging = HostStaging::new(CnnTransport::Mpi, rate, 2, 4);
    let channel = Parallelism { channel: 2, cnn_staging: staging, ..Parallelism::data_parallel(1) };
    let lowered = strategy(&model, &compute, channel, b, b).lower().unwrap();
    let expected: Vec<SimDuration> =
        model.layers.iter().filter(|l| split(l)).map(|l| at_rate(3 * b * l.output.elements() * w)).collect();
    assert_eq!(staging_times(&lowered.graph), sorted(expected));

    let p = 8;
    let staging = HostStaging::new(CnnTransport::Mpi, rate, p, 4);
    assert!(staging.is_some_and(|s| s.every_message), "8 ranks on nodes of 4 span nodes");
    let filter = Parallelism {
        filter: p,
        filter_backward: FilterBackward::OutputAlltoall,
        cnn_staging: staging,
        ..Parallelism::data_parallel(1)
    };
    let lowered = strategy(&model, &compute, filter, b, b).lower().unwrap();
    let received = |elements: u64| at_rate(b * elements * w / u64::from(p) * u64::from(p - 1));
    // The allgather of every split layer's output and the alltoall of its gradient (the first
    // layer's too).
    let mut expected = Vec::new();
    for layer in model.layers.iter().filter(|l| split(l)) {
        expected.push(received(layer.output.elements()));
        expected.push(received(layer.output.elements()));
    }
    assert_eq!(staging_times(&lowered.graph), sorted(expected));
    // Open MPI pipelines the copies with the transfer: every staging op of the filter group
    // runs beside its collective (the op just before it), on its own stream, not after it.
    let graph = &lowered.graph;
    let mut beside = 0;
    for (index, op) in graph.ops().iter().enumerate() {
        if op.rank == RankId(0) && graph.label(op.label) == HOST_STAGING_LABEL {
            assert_eq!(op.stream, STAGING_STREAM);
            let collective = sim_core::graph::OpId(index as u32 - 1);
            assert!(matches!(graph.ops()[collective.0 as usize].kind, OpKind::Collective(_)));
            assert!(!graph.deps(sim_core::graph::OpId(index as u32)).contains(&collective));
            assert!(graph.dependents(sim_core::graph::OpId(index as u32)).iter().all(|d| {
                graph.deps(*d).contains(&collective) || graph.ops()[d.0 as usize].stream == STAGING_STREAM
            }));
            beside += 1;
        }
    }
    assert_eq!(beside, 2 * model.layers.iter().filter(|l| split(l)).count());
    // coll/cuda's allreduce (channel forward) is not pipelined: it follows its collective.
    let staging = HostStaging::new(CnnTransport::Mpi, rate, 2, 4);
    let channel = Parallelism { channel: 2, cnn_staging: staging, ..Parallelism::data_parallel(1) };
    let lowered = strategy(&model, &compute, channel, b, b).lower().unwrap();
    let graph = &lowered.graph;
    let after_collective = graph.ops().iter().enumerate().filter(|(index, op)| {
        op.rank == RankId(0)
            && graph.label(op.label) == HOST_STAGING_LABEL
            && graph
                .deps(sim_core::graph::OpId(*index as u32))
                .iter()
                .any(|d| matches!(graph.ops()[d.0 as usize].kind, OpKind::Collective(_)))
    });
    assert_eq!(after_collective.count(), model.layers.iter().filter(|l| split(l)).count());

    let spatial = |cnn_staging| Parallelism { spatial: 4, cnn_staging, ..Parallelism::data_parallel(1) };
    let managed = HostStaging::new(CnnTransport::MpiManaged, rate, 4, 4);
    let staged = strategy(&model, &compute, spatial(managed), b, b).lower().unwrap();
    let device = strategy(&model, &compute, spatial(None), b, b).lower().unwrap();
    // Rank 0 is the top stripe: it receives from its lower neighbour only. The stem's 7x7
    // stride-2 convolution reads 2 rows of it (k - s - pad = 7 - 2 - 3) of the 3-channel
    // 224-wide image.
    let stem = at_rate(2 * 3 * 224 * b * w);
    assert!(staging_times(&staged.graph).contains(&stem), "{:?}", staging_times(&staged.graph));
    assert!(staging_times(&device.graph).is_empty());
    assert!(staged.graph.ops().len() > device.graph.ops().len());
}

/// ChainerMN's allgather on a filter-split layer (`filter-backward = "output-alltoall"`) copies
/// on the GPU: the forward's concatenation (`2 Y`), and in the backward the `p` flattened views
/// (`2 Y / p` each), the `hstack` (`2 Y`), the `stack` (`2 Y`) and the sum (`Y + Y / p`), each
/// a kernel at the compute model's memory rate; the textbook backward has none of them. The
/// difference of the two graphs' compute time is that closed form over the split layers.
#[test]
fn chainermn_filter_layers_pay_their_copies() {
    let model = workloads::family::resnet50();
    let compute = ComputeModel::default();
    let (p, b) = (4u32, 8u64);
    let kernel_time = |backward| {
        let parallelism =
            Parallelism { filter: p, filter_backward: backward, ..Parallelism::data_parallel(1) };
        let lowered = strategy(&model, &compute, parallelism, b, b).lower().unwrap();
        compute_busy_ps(&lowered.graph, 0)
    };
    let device = DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap();
    let copy = |bytes: f64, class| compute.duration(device, Dtype::Fp16, 0.0, bytes, class).unwrap().as_ps();
    let elementwise = workloads::layer::OpClass::Elementwise;
    let mut expected = 0u64;
    for layer in
        model.layers.iter().filter(|l| matches!(l.kind, LayerKind::Conv { .. } | LayerKind::Linear { .. }))
    {
        let y = (layer.output.elements() * b * 2) as f64;
        let q = f64::from(p);
        expected += copy(2.0 * y, elementwise)
            + u64::from(p) * copy(2.0 * y / q, elementwise)
            + 2 * copy(2.0 * y, elementwise)
            + copy(y + y / q, workloads::layer::OpClass::Reduction);
    }
    let difference =
        kernel_time(FilterBackward::OutputAlltoall) - kernel_time(FilterBackward::InputAllreduce);
    assert_eq!(difference, expected);
}

/// Rank 0's forward and gradient halo sends in `lowered`.
fn rank0_halo_sends(lowered: &Lowered) -> (usize, usize) {
    let count = |label: &str| {
        lowered
            .graph
            .ops()
            .iter()
            .filter(|op| op.rank == RankId(0) && lowered.graph.label(op.label) == label)
            .count()
    };
    (count("spatial halo send"), count("spatial halo gradient send"))
}

/// `spatial-halos = "stem-and-gradients"` (ParaDL's ResNet-50) on four row stripes, counted on
/// rank 0 (the top stripe, one neighbour). Every window: 18 forward sends (the stem, the max
/// pooling, the 16 bottleneck 3x3 convolutions) and 13 gradient sends: the stem has no
/// backward-data pass, and a stride-2 window with padding 1 reads no rows from the stripe
/// below the top one (`k - s - pad = 0`), so the max pooling and the three strided 3x3
/// convolutions send no gradient back from rank 0. ParaDL's pattern keeps the stem's forward
/// send and the same 13 gradient sends (all convolutions').
#[test]
fn stem_and_gradients_drops_the_forward_halos_after_the_stem() {
    let model = workloads::family::resnet50();
    let compute = ComputeModel::default();
    let sends = |spatial_halos| {
        let parallelism = Parallelism { spatial: 4, spatial_halos, ..Parallelism::data_parallel(1) };
        rank0_halo_sends(&strategy(&model, &compute, parallelism, 8, 8).lower().unwrap())
    };
    let (forward, backward) = sends(SpatialHalos::EveryWindow);
    assert_eq!((forward, backward), (18, 13));
    assert_eq!(sends(SpatialHalos::StemAndGradients), (1, 13));
}

/// `spatial-halos = "padded-pooling"` (ParaDL's VGG-16) on four row stripes, counted on rank 0
/// (the top stripe, one neighbour): the 13 convolutions' halos as with every window, plus one
/// forward send before each of the 5 poolings (chainermnx's `pooling_halo_exchange` sends a
/// row to each neighbour; its backward only slices), which an exact 2x2 stride-2 tiling does
/// not need; the gradient sends are the same 12 (the first convolution has no backward-data
/// pass, so no halo gradient). The gradient sent over the group grows with the classifier the grown map feeds:
/// 270,478,120 parameters against torchvision's 138,357,544.
#[test]
fn padded_pooling_adds_a_forward_send_per_pooling_and_grows_the_gradient() {
    let text = include_str!("../../data/models/paradl-vgg16.toml");
    let model = workloads::model::Model::from_toml_str(text, "paradl-vgg16.toml").unwrap();
    let compute = ComputeModel::default();
    let lower = |spatial_halos| {
        let parallelism = Parallelism { spatial: 4, spatial_halos, ..Parallelism::data_parallel(1) };
        strategy(&model, &compute, parallelism, 8, 8).lower().unwrap()
    };
    let every = lower(SpatialHalos::EveryWindow);
    let padded = lower(SpatialHalos::PaddedPooling);
    assert_eq!(rank0_halo_sends(&every), (13, 12));
    assert_eq!(rank0_halo_sends(&padded), (18, 12));
    // The gradient reduce-scattered inside the group: every parameter once, in fp32.
    let scattered = |lowered: &Lowered| -> u64 {
        rank_traffic(&lowered.graph, 0, DATA_STREAM)
            .iter()
            .filter(|(kind, _)| *kind == Some(CollectiveKind::ReduceScatter))
            .map(|(_, bytes)| bytes)
            .sum()
    };
    assert_eq!(scattered(&every), 138_357_544 * 4);
    assert_eq!(scattered(&padded), 270_478_120 * 4);
}

/// Every op says what it is for (its metadata): kernels name their layer and pass, collectives
/// their communicator and the policy that emitted them, launches are host work; the stream an
/// op runs on is only its queue.
#[test]
fn every_op_carries_its_layer_pass_communicator_and_origin() {
    use sim_core::graph::{GroupKind, Pass, Work};
    let model = uniform_model(4, 1024);
    let compute = ComputeModel::default();
    let p = Parallelism { tensor: 2, pipeline: 2, zero: 1, ..Parallelism::data_parallel(2) };
    let lowered = strategy(&model, &compute, p, 16, 2).lower().unwrap();
    let graph = &lowered.graph;
    let origin = |name| graph.find_origin(name).unwrap_or_else(|| panic!("no {name} origin"));
    let (zero, flush, pipeline) = (origin("zero"), origin(FLUSH_ORIGIN), origin("pipeline"));
    let mut seen = std::collections::BTreeSet::new();
    for op in graph.ops() {
        let meta = op.meta;
        match (op.kind, meta.work()) {
            (_, Work::Launch) => assert_eq!(op.stream, HOST_STREAM),
            (OpKind::Compute { .. }, Work::Device) => {
                let pass = meta.pass().expect("a kernel's pass");
                if pass == Pass::Optimizer {
                    assert_eq!(meta.layer(), None);
                } else {
                    let name = graph.layer_name(meta.layer().expect("a kernel's layer")).unwrap();
                    assert_eq!(graph.label(op.label), format!("{name} {}", pass.name()));
                }
                seen.insert(pass.name());
            }
            (OpKind::Collective(_), Work::Device) => {
                let group = meta.group().expect("a collective's communicator");
                if meta.origin() == flush {
                    assert_eq!(group, GroupKind::Pipeline);
                } else if meta.origin() == zero {
                    assert_eq!(group, GroupKind::Data);
                } else {
                    assert_eq!(group, GroupKind::Tensor, "{}", graph.label(op.label));
                    assert!(meta.layer().is_some());
                }
                seen.insert(group.name());
            }
            (OpKind::Transfer { .. }, Work::Device) => {
                assert_eq!((meta.group(), meta.origin()), (Some(GroupKind::Pipeline), pipeline));
            }
            other => panic!("unexpected {other:?} {}", graph.label(op.label)),
        }
    }
    let expected = ["backward-data", "backward-weight", "data", "forward", "optimizer", "pipeline", "tensor"];
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), expected);
}

/// `workload.passes = "forward"`: a pipeline of `p` stages runs `m` micro-batches' forwards in
/// `(m + p - 1)` stage forwards (the forward pipeline's closed form), with the training step's
/// forward kernels and nothing of its backward, gradient synchronisation or optimizer step.
#[test]
fn a_forward_pass_alone_is_the_forward_pipelines_closed_form_without_backward_or_step() {
    use crate::passes::Passes;
    use sim_core::graph::Pass;
    let model = uniform_model(8, 4096);
    let compute = ComputeModel::default();
    let topology = instant_server(8);
    let m = 6u64;
    let parallelism = Parallelism { data: 2, ..pipelined(4, 1, PipelineSchedule::OneFOneB) };
    let training = strategy(&model, &compute, parallelism, m * 2 * 2, 2);
    let forward = Strategy { passes: Passes::Forward, ..training.clone() };
    let (trained, lowered) = (training.lower().unwrap(), forward.lower().unwrap());
    for op in lowered.graph.ops() {
        let pass = op.meta.pass();
        assert!(
            !matches!(pass, Some(Pass::BackwardData | Pass::BackwardWeight | Pass::Optimizer)),
            "{} ({pass:?}) in a forward pass",
            lowered.graph.label(op.label)
        );
        assert!(!matches!(op.kind, OpKind::Collective(_)), "{}", lowered.graph.label(op.label));
    }
    assert!(trained.graph.ops().iter().any(|op| matches!(op.kind, OpKind::Collective(_))));
    for rank in 0..8 {
        let (alone, in_training) = (
            pass_compute(&lowered.graph, rank, Pass::Forward),
            pass_compute(&trained.graph, rank, Pass::Forward),
        );
        assert!((alone - in_training).abs() <= 1e-12 * in_training, "rank {rank}: {alone} vs {in_training}");
    }
    let timeline = NetworkSettings::new(Fidelity::Analytical).run(&lowered.graph, &topology).unwrap();
    let stage_forward = pass_compute(&lowered.graph, 0, Pass::Forward) / m as f64;
    let expected = (m + 3) as f64 * stage_forward;
    let makespan = timeline.makespan().as_secs_f64();
    assert!(
        (makespan - expected).abs() < 0.01 * expected,
        "{makespan} s against (m + p - 1) stage forwards {expected} s"
    );
    // The training step of the same split takes longer, and its FLOPs are three times the
    // forward's plus the step.
    let trained_time =
        NetworkSettings::new(Fidelity::Analytical).run(&trained.graph, &topology).unwrap().makespan();
    assert!(trained_time.as_secs_f64() > 2.0 * makespan);
    assert!(lowered.flops_per_rank_iteration > 0.0);
    assert!(trained.flops_per_rank_iteration > 2.9 * lowered.flops_per_rank_iteration);
}

/// Per-micro-batch compute of `rank` in `pass`, over `runs` runs of it per iteration.
fn per_run(lowered: &Lowered, rank: u32, pass: sim_core::graph::Pass, runs: u64) -> f64 {
    pass_compute(&lowered.graph, rank, pass) / runs as f64
}

#[test]
fn zb_v_bubble_is_the_tips_wait_at_1f1b_memory_and_the_v_turns_without_a_transfer() {
    // Qi et al. 2024, section 6 (ZB-V), and arXiv 2405.15362 (V-ZB): with T_F = T_B = T_W per
    // chunk no stage idles between its first and its last pass, at 1F1B's peak activation
    // memory. Every stage does the same work, so the mean idle per rank before the last
    // backward is the V's tip waiting for its first forward: (p - 1) T_F, T_F one chunk's
    // (half a stage's) forward. Here T_W is 2% under T_F (the weight gradient skips a
    // transpose): allowed (p - 1)(T_F - T_W) more, and 0.2% of 1F1B's bubble for the few
    // microseconds the lowering adds to every schedule (as in the ZB-H1 test).
    use sim_core::graph::Pass;
    let model = uniform_model(16, 4096);
    let compute = ComputeModel::default();
    let topology = instant_server(4);
    for m in [8u64, 12, 16] {
        let zb =
            strategy(&model, &compute, pipelined(4, 2, PipelineSchedule::ZbV), m * 2, 2).lower().unwrap();
        let one = strategy(&model, &compute, pipelined(4, 1, PipelineSchedule::OneFOneB), m * 2, 2)
            .lower()
            .unwrap();
        // Each rank runs 2m chunk passes of each kind.
        let (f, w) = (per_run(&zb, 1, Pass::Forward, 2 * m), per_run(&zb, 1, Pass::BackwardWeight, 2 * m));
        let b = per_run(&zb, 1, Pass::BackwardData, 2 * m);
        assert!(w <= f && (b - f).abs() < 1e-9, "T_F {f}, T_B {b}, T_W {w}");
        let (_, idle) = bubble(&zb, &topology);
        let (_, one_idle) = bubble(&one, &topology);
        let expected = 3.0 * f;
        assert!(
            (idle - expected).abs() < 3.0 * (f - w) + 0.002 * one_idle,
            "m={m}: mean idle {idle:.6} s, (p - 1) T_F = {expected:.6} s (1F1B: {one_idle:.6} s)"
        );
        // Memory: every stage holds 2p chunk activations at most, 1F1B's first stage's p
        // micro-batches of a whole stage.
        let peak = |l: &Lowered| l.stages.iter().map(|s| s.memory.activations.0).max().unwrap();
        assert_eq!(peak(&zb), peak(&one), "m={m}");
        assert!(zb.stages.iter().all(|s| s.peak_micro_batches_in_flight <= 4.0));
        assert!(zb.stages.iter().zip(&one.stages).all(|(z, o)| z.parameters == o.parameters));
        // The V's tip hands chunk 3's output to chunk 4 on the same rank: per micro-batch 2p - 2
        // activation sends and as many gradient sends, not 2p - 1.
        let sends = zb.graph.ops().iter().filter(|op| matches!(op.kind, OpKind::Transfer { .. })).count();
        assert_eq!(sends as u64, m * 2 * 6, "m={m}");
        let to_self =
            zb.graph.ops().iter().any(|op| matches!(op.kind, OpKind::Transfer { dst, .. } if dst == op.rank));
        assert!(!to_self);
    }
}

#[test]
fn dualpipe_bubble_is_deepseek_v3_table_2s_at_twice_the_parameters_and_pp_plus_1_activations() {
    // DeepSeek-V3 technical report (arXiv 2412.19437), table 2: DualPipe's bubble is
    // (PP/2 - 1)(F&B + B - 3W), parameters 2x and activations PP + 1, where a chunk is one
    // pipeline stage (each rank holds two, one per model copy), F its forward, B its whole
    // backward (input and weight gradients), W its weight-gradient part and F&B the time of an
    // overlapped forward-and-backward pair: parasim runs the pair's passes one after the
    // other, so F&B = F + B. The table's form holds while F <= B's input part (here equal).
    // Every rank works alike, so the mean idle per rank before the last backward is the
    // bubble; 0.2% of 1F1B's bubble allowed for the lowering's few microseconds.
    use sim_core::graph::Pass;
    let model = uniform_model(8, 4096);
    let compute = ComputeModel::default();
    let topology = instant_server(4);
    for m in [8u64, 10, 16] {
        let dual = strategy(&model, &compute, pipelined(4, 2, PipelineSchedule::DualPipe), m * 2, 2)
            .lower()
            .unwrap();
        let one = strategy(&model, &compute, pipelined(4, 1, PipelineSchedule::OneFOneB), m * 2, 2)
            .lower()
            .unwrap();
        // Each rank runs m chunk passes of each kind (m / 2 per copy).
        let (f, b_input, w) = (
            per_run(&dual, 1, Pass::Forward, m),
            per_run(&dual, 1, Pass::BackwardData, m),
            per_run(&dual, 1, Pass::BackwardWeight, m),
        );
        assert!(f <= b_input * 1.000001, "T_F {f} within T_B {b_input}");
        let backward = b_input + w;
        let expected = (4.0 / 2.0 - 1.0) * ((f + backward) + backward - 3.0 * w);
        let (_, idle) = bubble(&dual, &topology);
        let (_, one_idle) = bubble(&one, &topology);
        assert!(
            (idle - expected).abs() < 0.002 * one_idle,
            "m={m}: mean idle {idle:.6} s, table 2 {expected:.6} s (1F1B: {one_idle:.6} s)"
        );
        // Two copies' chunks: twice 1F1B's parameters (and their gradients and optimizer
        // state) on every rank; PP + 1 = 5 stage activations at the peak, one more than 1F1B's
        // first stage.
        for (d, o) in dual.stages.iter().zip(&one.stages) {
            assert_eq!(d.parameters, 2 * o.parameters);
            assert_eq!(d.memory.weights.0, 2 * o.memory.weights.0);
            assert_eq!(d.memory.optimizer.0, 2 * o.memory.optimizer.0);
            assert_eq!(d.peak_micro_batches_in_flight, 5.0);
        }
        let one_micro = one.stages[0].memory.activations.0 / 4;
        assert!(dual.stages.iter().all(|s| s.memory.activations.0 == 5 * one_micro), "m={m}");
    }
}

#[test]
fn dualpipe_mirrors_sum_the_two_copies_gradients_before_the_step() {
    // Rank s holds stage s of one copy and stage p - 1 - s of the other, its mirror the same
    // two stages of the other copies: the two all-reduce their gradients (deepseek-ai/DualPipe
    // examples/example_dualpipe.py sums each parameter's gradient with the mirror's), the whole
    // gradients without ZeRO and the optimizer shard's under it; 1F1B has no such exchange.
    let model = uniform_model(8, 1024);
    let compute = ComputeModel::default();
    let label = "DualPipe copies' gradient allreduce";
    let exchanges = |lowered: &Lowered| -> Vec<(u32, u64, Vec<RankId>)> {
        let graph = &lowered.graph;
        graph
            .ops()
            .iter()
            .filter(|op| graph.label(op.label) == label)
            .map(|op| match op.kind {
                OpKind::Collective(id) => {
                    let c = graph.collective(id);
                    assert_eq!(c.kind, CollectiveKind::AllReduce);
                    (op.rank.0, c.bytes.0, graph.group(c.group).to_vec())
                }
                ref other => panic!("{label} is {other:?}"),
            })
            .collect()
    };
    let dual =
        strategy(&model, &compute, pipelined(4, 2, PipelineSchedule::DualPipe), 16, 1).lower().unwrap();
    let found = exchanges(&dual);
    assert_eq!(found.iter().map(|e| e.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
    for (rank, bytes, members) in &found {
        let mirror = 3 - rank;
        assert_eq!(*members, [RankId(*rank.min(&mirror)), RankId(*rank.max(&mirror))]);
        let parameters = dual.stages[*rank as usize].parameters;
        assert_eq!(*bytes, parameters * 4, "rank {rank}: fp32 gradients of both chunks");
    }
    // Mirrors hold the same two stages, so the same bytes.
    assert_eq!(found[0].1, found[3].1);
    let sharded = Parallelism { data: 2, zero: 1, ..pipelined(4, 2, PipelineSchedule::DualPipe) };
    let zero = strategy(&model, &compute, sharded, 32, 1).lower().unwrap();
    let mut bytes: Vec<u64> = exchanges(&zero).iter().map(|e| e.1).collect();
    bytes.sort_unstable();
    let mut expected: Vec<u64> =
        dual.stages.iter().flat_map(|stage| [stage.parameters.div_ceil(2) * 4; 2]).collect();
    expected.sort_unstable();
    assert_eq!(bytes, expected, "each rank its optimizer shard's");
    let one = strategy(&model, &compute, pipelined(4, 1, PipelineSchedule::OneFOneB), 16, 1).lower().unwrap();
    assert!(exchanges(&one).is_empty());
}

#[test]
fn zb_v_and_dualpipe_refuse_what_they_cannot_run_and_name_the_key() {
    let model = uniform_model(8, 1024);
    let compute = ComputeModel::default();
    let error = |parallelism: Parallelism, global: u64| {
        strategy(&model, &compute, parallelism, global, 1).lower().unwrap_err().to_string()
    };
    let flat = error(pipelined(4, 1, PipelineSchedule::ZbV), 16);
    assert!(
        flat.contains("parallelism.virtual-stages") && flat.contains("set virtual-stages = 2 (it is 1)"),
        "{flat}"
    );
    let odd = error(pipelined(3, 2, PipelineSchedule::DualPipe), 12);
    assert!(odd.contains("parallelism.pipeline") && odd.contains("even pipeline degree (it is 3)"), "{odd}");
    let few = error(pipelined(4, 2, PipelineSchedule::DualPipe), 6);
    assert!(
        few.contains("parallelism.schedule") && few.contains("at least 2 x pipeline = 8; there are 6 "),
        "{few}"
    );
    let sharded = error(Parallelism { zero: 3, ..pipelined(4, 2, PipelineSchedule::DualPipe) }, 16);
    assert!(
        sharded.contains("\"dualpipe\" splits the backward") && sharded.contains("zero = 3"),
        "{sharded}"
    );
}

/// The lowering appends each rank's ops as soon as they are made and fills in a dependency on
/// a later rank's op (a backward receive from the next stage) once that rank is appended: in
/// every pipeline schedule, every dependency across ranks is a transfer to the waiting rank,
/// every transfer is waited for on the rank it goes to, and some of those dependencies point
/// forward (the filled-in ones).
#[test]
fn every_cross_rank_dependency_is_a_transfer_to_the_rank_that_waits() {
    let model = uniform_model(8, 256);
    let compute = ComputeModel::default();
    let cases = [
        pipelined(4, 1, PipelineSchedule::GPipe),
        pipelined(4, 1, PipelineSchedule::OneFOneB),
        pipelined(4, 2, PipelineSchedule::OneFOneB),
        pipelined(4, 1, PipelineSchedule::ZbH1),
        pipelined(4, 2, PipelineSchedule::ZbV),
        pipelined(4, 2, PipelineSchedule::DualPipe),
        Parallelism { data: 2, ..pipelined(2, 1, PipelineSchedule::OneFOneB) },
    ];
    for parallelism in cases {
        let lowered = strategy(&model, &compute, parallelism, 64, 4).lower().unwrap();
        let graph = &lowered.graph;
        let mut received = vec![false; graph.op_count()];
        let mut forward = 0;
        for (index, op) in graph.ops().iter().enumerate() {
            for &dep in graph.deps(sim_core::graph::OpId(index as u32)) {
                let sender = graph.op(dep);
                if sender.rank == op.rank {
                    continue;
                }
                assert!(
                    matches!(sender.kind, OpKind::Transfer { dst, .. } if dst == op.rank),
                    "{parallelism:?}: {} waits for {} on another rank, not a transfer to it",
                    graph.describe(sim_core::graph::OpId(index as u32)),
                    graph.describe(dep)
                );
                received[dep.0 as usize] = true;
                forward += usize::from(dep.0 as usize > index);
            }
        }
        for (index, op) in graph.ops().iter().enumerate() {
            if matches!(op.kind, OpKind::Transfer { .. }) {
                assert!(
                    received[index],
                    "{parallelism:?}: nothing waits for {}",
                    graph.describe(sim_core::graph::OpId(index as u32))
                );
            }
        }
        assert!(forward > 0, "{parallelism:?}: no dependency on a later rank's op");
    }
}
