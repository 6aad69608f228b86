//! Mixture-of-experts layouts and dispatchers against Megatron-Core: the expert rank
//! generator's groups (megatron/core/parallel_state.py @ d98e8a64dd, `RankGenerator` and
//! `generate_masked_orthogonal_rank_groups`, whose output for each setting below is written
//! out by hand), the all-gather dispatcher's bytes in closed form
//! (megatron/core/transformer/moe/token_dispatcher.py, `MoEAllGatherTokenDispatcher`), the
//! conservation of expert work over the ranks, and the refusals.

use sim_core::graph::{CollectiveKind, OpKind, RankId};

use super::tests::strategy;
use super::*;
use workloads::device::Dtype;
use workloads::layer::{LayerKind, Shape};
use workloads::zoo;

/// The small MoE GPT of Megatron-LM's functional tests: 12 layers, hidden 512, 8 heads,
/// 1,024 tokens, `experts` GELU experts of 2,048 with top-`top_k` routing, no biases.
fn moe_gpt(experts: u64, top_k: u64) -> Model {
    moe_gpt_ffn(experts, top_k, 2048)
}

/// [`moe_gpt`] with experts of `ffn` hidden features.
fn moe_gpt_ffn(experts: u64, top_k: u64, ffn: u64) -> Model {
    let text = format!(
        "[model]\nname = \"moe-gpt\"\n\n[gpt]\nlayers = 12\nhidden = 512\nheads = 8\nsequence = 1024\n\
         vocabulary = 50257\nattention = \"flash\"\nbias = false\nffn-hidden = {ffn}\nexperts = {experts}\n\
         top-k = {top_k}\n"
    );
    Model::from_toml_str(&text, "moe-gpt.toml").unwrap()
}

fn ranks(list: &[u32]) -> Vec<RankId> {
    list.iter().copied().map(RankId).collect()
}

/// A layout on the expert side as Megatron-Core's generator would build it.
fn megatron(
    tensor: u32,
    context: u32,
    data: u32,
    pipeline: u32,
    expert: u32,
    etp: u32,
    order: &str,
) -> RankLayout {
    RankLayout::new(tensor, context, data, pipeline, expert, order.parse().unwrap())
        .with_expert_tensor(Some(etp))
}

/// Megatron-Core's groups for four settings, as `generate_masked_orthogonal_rank_groups`
/// lists them (ep, expert-tensor, tp-ep and expert-data groups of the first ranks).
#[test]
fn expert_groups_follow_megatrons_rank_generator() {
    // tensor 2, data 4, expert 4, expert-tensor 1 on 8 GPUs (order tp-cp-ep-dp-pp): expert side
    // etp 1 x ep 4 x edp 2. ep [[0,1,2,3],[4,5,6,7]], tp-ep the same, dp [[0,4],[1,5],...].
    let layout = megatron(2, 1, 4, 1, 4, 1, "tp-cp-dp-pp");
    assert_eq!(layout.expert_layout_error(), None);
    assert_eq!(layout.expert_group(RankId(1)), ranks(&[0, 1, 2, 3]));
    assert_eq!(layout.expert_group(RankId(6)), ranks(&[4, 5, 6, 7]));
    assert_eq!(layout.expert_tensor_group(RankId(5)), ranks(&[5]));
    assert_eq!(layout.expert_tensor_expert_group(RankId(2)), ranks(&[0, 1, 2, 3]));
    assert_eq!(layout.expert_data_group(RankId(1)), ranks(&[1, 5]));
    // tensor 4, pipeline 2, expert 2, expert-tensor 2 (order tp-cp-ep-pp-dp): ep [[0,2],[1,3],
    // [4,6],[5,7]], tp [[0,1],[2,3],...], tp-ep [[0,1,2,3],[4,5,6,7]], pp [[0,4],...] as the
    // dense side's.
    let layout = megatron(4, 1, 1, 2, 2, 2, "tp-cp-pp-dp");
    assert_eq!(layout.expert_layout_error(), None);
    assert_eq!(layout.expert_group(RankId(1)), ranks(&[1, 3]));
    assert_eq!(layout.expert_group(RankId(6)), ranks(&[4, 6]));
    assert_eq!(layout.expert_tensor_group(RankId(3)), ranks(&[2, 3]));
    assert_eq!(layout.expert_tensor_expert_group(RankId(5)), ranks(&[4, 5, 6, 7]));
    assert_eq!(layout.expert_data_group(RankId(2)), ranks(&[2]));
    assert_eq!(layout.expert_coordinates(RankId(6)).pipeline, layout.coordinates(RankId(6)).pipeline);
    // tensor 1, context 2, pipeline 2, expert 2 (tp-cp-ep-pp-dp, data 2): ep [[0,1],[2,3],...],
    // edp [[0,4],[1,5],...], pp [[0,2],[1,3],...].
    let layout = megatron(1, 2, 2, 2, 2, 1, "tp-cp-pp-dp");
    assert_eq!(layout.expert_layout_error(), None);
    assert_eq!(layout.expert_group(RankId(3)), ranks(&[2, 3]));
    assert_eq!(layout.expert_data_group(RankId(1)), ranks(&[1, 5]));
    for rank in (0..8).map(RankId) {
        assert_eq!(layout.expert_coordinates(rank).pipeline, layout.coordinates(rank).pipeline);
        assert_eq!(layout.expert_rank(layout.expert_coordinates(rank)), rank);
    }
    // Expert 32 beside data 16 and tensor 2 (expert-tensor 1): one expert group of all 32.
    let layout = megatron(2, 1, 16, 1, 32, 1, "tp-cp-dp-pp");
    assert_eq!(layout.expert_layout_error(), None);
    assert_eq!(layout.expert_group(RankId(17)), ranks(&(0..32).collect::<Vec<_>>()));
    assert_eq!(layout.expert_data_group(RankId(17)), ranks(&[17]));
    // Expert 64 on 512 GPUs with tensor 2 and pipeline 8 (expert-tensor 1): stage 3's 64 ranks.
    let layout = megatron(2, 1, 32, 8, 64, 1, "tp-cp-dp-pp");
    assert_eq!(layout.expert_layout_error(), None);
    assert_eq!(layout.expert_group(RankId(200)), ranks(&(192..256).collect::<Vec<_>>()));
}

/// With the experts' tensor degree the dense one, Megatron's generator and parasim's first
/// layout (expert groups carved out of data x context) give the same groups for the default
/// order: the all-to-all default keeps its groups.
#[test]
fn megatrons_generator_agrees_with_the_carved_layout_when_expert_tensor_is_tensor() {
    for (t, c, d, p, e) in
        [(2, 1, 4, 1, 2), (2, 2, 2, 2, 2), (1, 2, 4, 1, 4), (4, 1, 2, 2, 2), (1, 1, 8, 1, 8)]
    {
        let carved = RankLayout::new(t, c, d, p, e, RankOrder::default());
        let generated = carved.clone().with_expert_tensor(Some(t));
        assert_eq!(generated.expert_layout_error(), None);
        for rank in (0..carved.ranks()).map(RankId) {
            assert_eq!(
                generated.expert_group(rank),
                carved.expert_group(rank),
                "{t} {c} {d} {p} {e} {rank:?}"
            );
            assert_eq!(generated.expert_data_group(rank), carved.expert_data_group(rank));
        }
    }
    assert!(!Parallelism::data_parallel(8).experts_apart());
}

/// The all-gather dispatcher's collectives per expert layer, per rank, against the closed form:
/// with `n = b s / t` tokens on a rank (sequence parallel), the `tp_ep` group of `etp x ep`
/// ranks gathers `G = n etp ep` tokens: routing map `G E` bytes, probabilities `G E w`, hidden
/// states `G h w` forward, outputs reduce-scattered `G h w`; backward one all-gather and two
/// reduce-scatters (hidden states and probabilities).
#[test]
fn all_gather_dispatcher_bytes_per_rank_are_the_gathered_tokens() {
    let model = moe_gpt(8, 2);
    let compute = ComputeModel::default();
    let (b, s, h, e, w) = (4u64, 1024u64, 512u64, 8u64, 2u64);
    for (tensor, etp, expert, data) in [(2u32, 2u32, 2u32, 4u32), (2, 1, 4, 4), (1, 1, 8, 8)] {
        let parallelism = Parallelism {
            tensor,
            sequence_parallel: tensor > 1,
            expert,
            expert_tensor: Some(etp),
            moe_dispatcher: MoeDispatcher::AllGather,
            ..Parallelism::data_parallel(data)
        };
        let mut s_ = strategy(&model, &compute, parallelism, b * u64::from(data), b);
        s_.precision = Dtype::Bf16;
        let local = shard::local_layers(&model, parallelism.split(), b, Dtype::Bf16).unwrap();
        let experts = local.iter().find(|l| l.role == Role::Experts).unwrap();
        let n = b * s / u64::from(tensor);
        let g = n * u64::from(etp * expert);
        let bytes = |list: &[Comm]| list.iter().map(|c| (c.kind, c.bytes.0)).collect::<Vec<_>>();
        use CollectiveKind::{AllGather, ReduceScatter};
        assert_eq!(
            bytes(&experts.before_forward),
            vec![(AllGather, g * e), (AllGather, g * e * w), (AllGather, g * h * w)]
        );
        assert_eq!(bytes(&experts.after_forward), vec![(ReduceScatter, g * h * w)]);
        assert_eq!(bytes(&experts.before_backward), vec![(AllGather, g * h * w)]);
        assert_eq!(
            bytes(&experts.after_backward_data),
            vec![(ReduceScatter, g * h * w), (ReduceScatter, g * e * w)]
        );
        // The rank's experts run on the gathered tokens routed to them: n x etp x top-k (per
        // sample: local shapes are per sample), each through ffn / etp.
        assert_eq!(experts.layer.input.0[0], s / u64::from(tensor) * u64::from(etp) * 2);
        assert!(matches!(experts.layer.kind, LayerKind::MoeExperts { experts: local, ffn_hidden, .. }
            if local == e / u64::from(expert) && ffn_hidden == 2048 / u64::from(etp)));
        // In the graph, over the tp-ep group: etp x ep ranks, Megatron's.
        let lowered = s_.lower().unwrap();
        let layout = parallelism.layout();
        let gathers: Vec<_> = lowered
            .graph
            .ops()
            .iter()
            .filter(|op| op.rank == RankId(1) && op.stream == EXPERT_STREAM)
            .filter_map(|op| match op.kind {
                OpKind::Collective(id) => Some(lowered.graph.collective(id)),
                _ => None,
            })
            .collect();
        assert_eq!(gathers.len(), 12 * 7, "7 collectives per layer, 12 layers");
        for collective in gathers {
            assert_eq!(
                lowered.graph.group(collective.group).to_vec(),
                layout.expert_tensor_expert_group(RankId(1))
            );
        }
    }
}

/// The probabilities in `moe-router-dtype` (fp32): the gathered probabilities and the outputs'
/// reduce-scatter (`hidden_states.to(self.local_probs.dtype)`) in 4 bytes.
#[test]
fn router_dtype_widens_the_probabilities_and_the_output_reduce_scatter() {
    let model = moe_gpt(8, 2);
    let parallelism = Parallelism {
        expert: 8,
        moe_dispatcher: MoeDispatcher::AllGather,
        moe_router_dtype: Some(Dtype::Fp32),
        ..Parallelism::data_parallel(8)
    };
    let local = shard::local_layers(&model, parallelism.split(), 4, Dtype::Bf16).unwrap();
    let experts = local.iter().find(|l| l.role == Role::Experts).unwrap();
    let g = 4 * 1024 * 8;
    assert_eq!(experts.before_forward[1].bytes.0, g * 8 * 4);
    assert_eq!(experts.before_forward[2].bytes.0, g * 512 * 2);
    assert_eq!(experts.after_forward[0].bytes.0, g * 512 * 4);
}

/// Whatever the dispatcher and degrees, the expert FLOPs of all ranks add up to every token's
/// top-k expert visits: each (token, expert) pair computed once, split over expert-tensor ranks.
#[test]
fn expert_work_over_all_ranks_is_every_tokens_top_k_visits() {
    let model = moe_gpt(8, 2);
    let whole = shard::local_layers(&model, Parallelism::data_parallel(1).split(), 4, Dtype::Bf16).unwrap();
    let macs = |layers: &[LocalLayer]| -> f64 {
        let experts = layers.iter().find(|l| l.role == Role::Experts).unwrap();
        experts.layer.cost.macs
    };
    let one = macs(&whole);
    for (tensor, etp, expert, data, dispatcher) in [
        (2u32, 1u32, 4u32, 4u32, MoeDispatcher::AllGather),
        (2, 1, 4, 4, MoeDispatcher::AllToAll),
        (4, 2, 2, 2, MoeDispatcher::AllGather),
        (2, 2, 2, 4, MoeDispatcher::AllGather),
    ] {
        let p = Parallelism {
            tensor,
            sequence_parallel: true,
            expert,
            expert_tensor: Some(etp),
            moe_dispatcher: dispatcher,
            ..Parallelism::data_parallel(data)
        };
        let local = shard::local_layers(&model, p.split(), 4, Dtype::Bf16).unwrap();
        // Every rank holds `data` replicas' worth of tokens between them: tensor x data ranks.
        let total = macs(&local) * f64::from(tensor * data);
        assert!((total / (one * f64::from(data)) - 1.0).abs() < 1e-12, "{p:?}: {total} vs {one}");
    }
}

/// What Megatron-Core refuses is refused with the key at fault; what it accepts is accepted.
#[test]
fn megatrons_refusals_name_the_key() {
    let model = moe_gpt(8, 2);
    let compute = ComputeModel::default();
    let check = |p: Parallelism| strategy(&model, &compute, p, 4 * u64::from(p.data), 4).check();
    let apart = |tensor, data, expert, etp| Parallelism {
        tensor,
        sequence_parallel: tensor > 1,
        expert,
        expert_tensor: Some(etp),
        moe_dispatcher: MoeDispatcher::AllGather,
        ..Parallelism::data_parallel(data)
    };
    // Accepted: Megatron's CI layouts and expert 8 beside data 4 and tensor 2.
    check(apart(2, 4, 4, 1)).unwrap();
    check(apart(2, 4, 8, 1)).unwrap();
    check(Parallelism { pipeline: 2, order: "tp-cp-pp-dp".parse().unwrap(), ..apart(4, 1, 2, 2) }).unwrap();
    let refused = |p: Parallelism, key: &str, text: &str| match check(p) {
        Err(StrategyError::Invalid { key: got, message }) => {
            assert_eq!(got, key, "{message}");
            assert!(message.contains(text), "{message}");
        }
        other => panic!("{key}: expected a refusal, got {other:?}"),
    };
    // expert-tensor x expert must divide a stage's ranks.
    refused(apart(2, 4, 8, 2), "parallelism.expert", "do not divide the 8 ranks");
    // The pipeline groups must agree (pipeline-last order: expert-data = data).
    refused(
        Parallelism { pipeline: 2, order: "tp-cp-pp-dp".parse().unwrap(), ..apart(1, 4, 2, 1) },
        "parallelism.expert",
        "same pipeline groups",
    );
    // The experts' FFN must divide over the expert-tensor ranks.
    let odd = moe_gpt_ffn(8, 2, 1538);
    match strategy(&odd, &compute, apart(1, 8, 1, 4), 32, 4).check() {
        Err(StrategyError::Invalid { key, message }) => {
            assert_eq!(key, "parallelism.expert-tensor", "{message}");
            assert!(message.contains("does not divide the experts' hidden size 1538"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // MoE with tensor parallelism and no sequence parallelism: Megatron's MoELayer refuses.
    refused(
        Parallelism { sequence_parallel: false, ..apart(2, 4, 4, 1) },
        "parallelism.sequence-parallel",
        "sequence parallelism",
    );
    // A dense model has no experts to dispatch.
    let dense = zoo::by_name("megatron-1.7b").unwrap();
    let p = Parallelism { moe_dispatcher: MoeDispatcher::AllGather, ..Parallelism::data_parallel(2) };
    match strategy(&dense, &compute, p, 2, 1).check() {
        Err(StrategyError::Invalid { key, message }) => {
            assert_eq!(key, "parallelism.moe-dispatcher", "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let unknown = "deep-ep".parse::<MoeDispatcher>().unwrap_err();
    assert!(unknown.contains("\"all-gather\"") && unknown.contains("\"deepep\""), "{unknown}");
}

/// A sequential expert bank costs the host a dense feed-forward block's launches per local
/// expert (3 forward, 3 backward-data, 2 backward-weight), a grouped one a dense block's once:
/// over the 12 MoE layers of one micro-batch, the host time differs by exactly
/// `12 x (local - 1) x 8` launches, the device work not at all. Without a host cost
/// (CUDA graphs) the two graphs are the same.
#[test]
fn a_sequential_expert_bank_launches_a_dense_block_per_local_expert() {
    use crate::experts::MoeExperts;
    let model = moe_gpt(8, 1);
    let host = SimDuration::from_us(100);
    let compute = ComputeModel { dispatch_overhead: host, ..ComputeModel::default() };
    let sums = |experts: MoeExperts, compute: &ComputeModel| {
        let p = Parallelism { expert: 2, moe_experts: experts, ..Parallelism::data_parallel(2) };
        let lowered = strategy(&model, compute, p, 8, 4).lower().unwrap();
        let (mut host_ps, mut device_ps) = (0u64, 0u64);
        for op in lowered.graph.ops().iter().filter(|op| op.rank == RankId(0)) {
            if let OpKind::Compute { duration } = op.kind {
                if op.stream == HOST_STREAM {
                    host_ps += duration.as_ps()
                } else {
                    device_ps += duration.as_ps()
                }
            }
        }
        (host_ps, device_ps, lowered.graph.ops().len())
    };
    let (grouped_host, grouped_device, _) = sums(MoeExperts::Grouped, &compute);
    let (sequential_host, sequential_device, _) = sums(MoeExperts::Sequential, &compute);
    // Expert 2 over 8 experts: 4 local experts; global 8, micro 4, data 2: one micro-batch.
    let extra = 12 * (4 - 1) * (3 + 3 + 2);
    assert_eq!(sequential_host - grouped_host, extra * host.as_ps());
    assert_eq!(sequential_device, grouped_device);
    let graphs = ComputeModel { cuda_graphs: true, ..compute.clone() };
    assert_eq!(sums(MoeExperts::Grouped, &graphs), sums(MoeExperts::Sequential, &graphs));
}

/// Megatron-Core's dropless dispatchers read each expert layer's token counts to the host once
/// per forward ([`MoeDispatcher`]): on every rank, one host read per MoE layer and micro-batch
/// (12 layers, two micro-batches of 4 samples of a global 16 over data 2), none in the
/// backward. The all-to-all dispatcher reads them after the router, before its exchange (the
/// read waits for a compute op and the exchange's launch follows it on the host); the
/// all-gather one after its gathers (the read waits for the gathered tokens, a collective).
/// Without modelled launches (CUDA graphs) there is nothing to wait for and no read.
#[test]
fn each_expert_layers_forward_reads_its_token_counts_on_the_host() {
    let model = moe_gpt(8, 2);
    let eager = ComputeModel { dispatch_overhead: SimDuration::from_us(20), ..ComputeModel::default() };
    let graphs = ComputeModel { cuda_graphs: true, ..eager.clone() };
    for dispatcher in MoeDispatcher::ALL {
        let p = Parallelism { expert: 2, moe_dispatcher: dispatcher, ..Parallelism::data_parallel(2) };
        let reads = |compute: &ComputeModel| {
            let lowered = strategy(&model, compute, p, 16, 4).lower().unwrap();
            let graph = &lowered.graph;
            let (mut reads, mut waited_on) = (0, Vec::new());
            for (id, op) in graph.ops().iter().enumerate() {
                if op.rank == RankId(0) && graph.label(op.label).contains("MoE token counts") {
                    reads += 1;
                    let deps = graph.deps(sim_core::graph::OpId(id as u32));
                    waited_on.extend(deps.iter().map(|dep| graph.ops()[dep.0 as usize].kind));
                }
            }
            (reads, waited_on)
        };
        let (count, waited_on) = reads(&eager);
        assert_eq!(count, 12 * 2, "{dispatcher:?}");
        let collectives = waited_on.iter().filter(|kind| matches!(kind, OpKind::Collective(_))).count();
        match dispatcher {
            MoeDispatcher::AllToAll => assert_eq!(collectives, 0, "after the router"),
            MoeDispatcher::AllGather | MoeDispatcher::DeepEp => {
                assert!(collectives >= 24, "after the exchange: {collectives}")
            }
        }
        assert_eq!(reads(&graphs).0, 0);
    }
}

/// A small DeepSeek-style model: 4 layers of hidden 512, multi-head latent attention (8 heads,
/// query rank 128, key/value rank 64, head widths 32 + 16 and 32), 8 routed experts of 256 with
/// top-2 routing, `shared` shared experts, the first `dense` layers dense (FFN 1024).
fn deepseek_like(dense: u64, shared: u64) -> Model {
    let text = format!(
        "[moe]\nlayers = 4\nhidden = 512\nheads = 8\nffn-hidden = 1024\nsequence = 1024\nvocabulary = 50257\n\
         experts = 8\ntop-k = 2\nmoe-ffn-hidden = 256\nshared-experts = {shared}\ndense-layers = {dense}\n\n\
         [moe.latent-attention]\nq-lora-rank = 128\nkv-lora-rank = 64\nqk-nope-head-dim = 32\n\
         qk-rope-head-dim = 16\nv-head-dim = 32\n"
    );
    Model::from_toml_str(&text, "deepseek-like.toml").unwrap()
}

/// Dense leading layers never dispatch: with `dense-layers = k` the expert all-to-alls run in
/// exactly `layers - k` layers (4 per layer and micro-batch: dispatch and combine, forward and
/// backward), and every one of them belongs to an expert layer.
#[test]
fn dense_leading_layers_do_not_dispatch() {
    let compute = ComputeModel::default();
    for dense in [0u64, 1, 3] {
        let model = deepseek_like(dense, 1);
        let p = Parallelism { expert: 2, ..Parallelism::data_parallel(2) };
        let local = shard::local_layers(&model, p.split(), 4, Dtype::Bf16).unwrap();
        let dispatching: Vec<&LocalLayer> =
            local.iter().filter(|l| l.before_forward.iter().any(|c| c.what == "ep dispatch")).collect();
        assert_eq!(dispatching.len() as u64, 4 - dense);
        assert!(dispatching.iter().all(|l| l.role == Role::Experts));
        for l in &local {
            let block = model.blocks()[l.index];
            if block.is_some_and(|b| u64::from(b) < dense) {
                assert!(l.before_forward.iter().all(|c| c.group != GroupKind::Expert), "{}", l.layer.name);
            }
        }
        // In the graph: global 16 over data 2 in micro-batches of 4, two micro-batches per rank.
        let lowered = strategy(&model, &compute, p, 16, 4).lower().unwrap();
        let graph = &lowered.graph;
        let mut layers = std::collections::BTreeSet::new();
        let mut all_to_alls = 0;
        for op in graph.ops().iter().filter(|op| op.rank == RankId(0)) {
            if let OpKind::Collective(id) = op.kind
                && graph.collective(id).kind == CollectiveKind::AllToAll
            {
                all_to_alls += 1;
                let layer = op.meta.layer().unwrap() as usize;
                assert!(matches!(model.layers[layer].kind, LayerKind::MoeExperts { .. }));
                layers.insert(layer);
            }
        }
        assert_eq!(layers.len() as u64, 4 - dense, "dense {dense}");
        assert_eq!(all_to_alls, 4 * 2 * (4 - dense), "dense {dense}");
    }
}

/// Shared experts are a dense MLP of `shared x moe-ffn-hidden` on every token, beside the
/// routed experts: they add exactly `3 h (shared x 256)` MACs per token and MoE layer (the
/// fused gate-up and the down projection) and nothing to the routed bank; under tensor
/// parallelism they split over the tensor group like a dense MLP (column- then row-parallel,
/// half the work per rank, their own all-gather and reduce-scatter with sequence parallelism).
#[test]
fn shared_experts_add_their_gemm_work_on_every_token() {
    let (h, width, tokens, moe_layers) = (512f64, 2.0 * 256.0, 1024f64, 3f64);
    let macs = |model: &Model, tensor: u32| -> (f64, f64) {
        let p =
            Parallelism { tensor, sequence_parallel: tensor > 1, expert: 2, ..Parallelism::data_parallel(2) };
        let local = shard::local_layers(model, p.split(), 1, Dtype::Bf16).unwrap();
        let routed = local.iter().filter(|l| l.role == Role::Experts).map(|l| l.layer.cost.macs).sum();
        let all = local.iter().map(|l| l.layer.cost.macs).sum();
        (routed, all)
    };
    let (with, without) = (deepseek_like(1, 2), deepseek_like(1, 0));
    for tensor in [1u32, 2] {
        let (routed_with, all_with) = macs(&with, tensor);
        let (routed_without, all_without) = macs(&without, tensor);
        assert_eq!(routed_with, routed_without);
        let expected = moe_layers * tokens * 3.0 * h * width / f64::from(tensor);
        assert_eq!(all_with - all_without, expected, "tensor {tensor}");
    }
    // Roles and collectives of the shared MLP under tensor 2 with sequence parallelism.
    let p = Parallelism { tensor: 2, sequence_parallel: true, expert: 2, ..Parallelism::data_parallel(2) };
    let local = shard::local_layers(&with, p.split(), 1, Dtype::Bf16).unwrap();
    let find = |name: &str| local.iter().find(|l| l.layer.name == name).unwrap();
    let gate_up = find("layers.1.moe.shared.gate-up");
    assert_eq!(gate_up.role, Role::Column);
    assert_eq!(
        gate_up.before_forward.iter().map(|c| c.kind).collect::<Vec<_>>(),
        vec![CollectiveKind::AllGather]
    );
    assert_eq!(find("layers.1.moe.shared.swiglu").role, Role::Split);
    let down = find("layers.1.moe.shared.down");
    assert_eq!(down.role, Role::Row);
    assert_eq!(
        down.after_forward.iter().map(|c| c.kind).collect::<Vec<_>>(),
        vec![CollectiveKind::ReduceScatter]
    );
    let compute = ComputeModel::default();
    strategy(&with, &compute, p, 8, 1).lower().unwrap();
}

/// Multi-head latent attention under tensor parallelism as Megatron-Core splits it: the
/// down-projections and their norms duplicated on every tensor rank (on its sequence share),
/// both up-projections column-parallel, the core on `heads / tensor` heads with its own value
/// width, the output projection row-parallel.
#[test]
fn latent_attention_splits_over_tensor_ranks_as_megatron_core() {
    let model = deepseek_like(1, 1);
    let p = Parallelism { tensor: 2, sequence_parallel: true, ..Parallelism::data_parallel(1) };
    let local = shard::local_layers(&model, p.split(), 1, Dtype::Bf16).unwrap();
    let find =
        |suffix: &str| local.iter().find(|l| l.layer.name == format!("layers.2.attention.{suffix}")).unwrap();
    for name in ["q-down", "q-norm", "kv-down", "kv-latent", "kv-norm"] {
        assert_eq!(find(name).role, Role::Replicated, "{name}");
        assert_eq!(find(name).layer.input.0[0], 512, "{name}: half the 1024 tokens");
    }
    for name in ["q-up", "kv-up"] {
        assert_eq!(find(name).role, Role::Column, "{name}");
    }
    assert_eq!(find("q-up").layer.output, Shape::from([1024, 4 * 48]));
    assert_eq!(find("kv-up").layer.output, Shape::from([1024, 4 * 64]));
    let core = find("core");
    assert_eq!(core.role, Role::Split);
    assert!(matches!(
        core.layer.kind,
        LayerKind::Attention { heads: 4, kv_heads: 4, value_head_dim: Some(32), .. }
    ));
    assert_eq!(core.layer.input, find("qkv").layer.output);
    assert_eq!(core.layer.output, Shape::from([1024, 4 * 32]));
    assert_eq!(find("proj").role, Role::Row);
    let compute = ComputeModel::default();
    strategy(&model, &compute, p, 2, 1).lower().unwrap();
}

/// Folding simulates replica 0 and replays its collectives on the other replicas through the
/// graph's images. Expert groups are runs of consecutive data ranks (Megatron-Core builds its
/// expert-parallel groups from consecutive data-parallel ranks), so every image must map one
/// onto another: a cyclic shift of the data index (the images before this test) mapped the
/// group {0..3} of tensor 1 x expert 4 x data 8 onto {1..4}, {2..5}, ..., ranks of two groups
/// (two servers of a 4-GPU-per-node cluster, so NIC traffic no job has). The same holds for the
/// expert-data groups and for distributed-optimizer instances (consecutive data ranks too).
#[test]
fn folded_images_map_expert_groups_and_optimizer_instances_onto_their_own_kind() {
    let model = moe_gpt(8, 2);
    let compute = ComputeModel::default();
    let partition = |groups: &dyn Fn(RankId) -> Vec<RankId>, ranks: u32| -> Vec<Vec<RankId>> {
        let mut all: Vec<Vec<RankId>> = (0..ranks)
            .map(|r| {
                let mut g = groups(RankId(r));
                g.sort();
                g
            })
            .collect();
        all.sort();
        all.dedup();
        all
    };
    for (tensor, expert, data, instances) in
        [(1u32, 4u32, 8u32, 1u32), (2, 2, 8, 1), (1, 2, 8, 2), (1, 1, 8, 4)]
    {
        let parallelism = Parallelism {
            tensor,
            sequence_parallel: tensor > 1,
            expert,
            zero: 1,
            distributed_optimizer_instances: instances,
            ..Parallelism::data_parallel(data)
        };
        let mut s = strategy(&model, &compute, parallelism, 4 * u64::from(data), 4);
        s.fold_symmetric_ranks = true;
        let lowered = s.lower().unwrap();
        let images = lowered.graph.images();
        assert_eq!(images.len() as u32, tensor * data - 1, "{parallelism:?}: folded");
        let layout = parallelism.layout();
        let ranks = layout.ranks();
        let size = |members: Vec<RankId>| (members.len() as u32 / instances).max(1) as usize;
        let instance = |members: Vec<RankId>, rank: RankId| {
            let n = size(members.clone());
            let at = members.iter().position(|r| *r == rank).unwrap();
            members[at - at % n..at - at % n + n].to_vec()
        };
        type Groups<'a> = Box<dyn Fn(RankId) -> Vec<RankId> + 'a>;
        let kinds: Vec<(&str, Groups<'_>)> = vec![
            ("expert", Box::new(|r| layout.expert_group(r))),
            ("expert-data", Box::new(|r| layout.expert_data_group(r))),
            ("data", Box::new(|r| layout.data_context_group(r))),
            ("instance", Box::new(|r| instance(layout.data_context_group(r), r))),
            ("expert instance", Box::new(|r| instance(layout.expert_data_group(r), r))),
        ];
        for (kind, groups) in &kinds {
            let all = partition(groups.as_ref(), ranks);
            for (index, image) in images.iter().enumerate() {
                for group in &all {
                    let mut mapped: Vec<RankId> = group.iter().map(|r| image[r.0 as usize]).collect();
                    mapped.sort();
                    assert!(
                        all.contains(&mapped),
                        "{parallelism:?}: image {index} maps the {kind} group {group:?} onto {mapped:?}"
                    );
                }
            }
        }
    }
}

/// Tensor 1 x expert 8 x data 16 on two 8-GPU servers: each expert group is one server's
/// eight data ranks, so the expert all-to-alls never touch a NIC and the flow network, folded,
/// gives the full graph's iteration. Before the images kept expert groups whole, the folded
/// run replayed the group {0..7} on {1..8}, ..., {15, 0..6}: all-to-alls over the NICs that
/// made the iteration several times slower.
#[test]
fn folded_flow_iteration_equals_the_full_graphs_with_expert_groups_inside_servers() {
    use sim_core::fidelity::{Fidelity, NetworkSettings};
    let model = moe_gpt(8, 2);
    let compute = ComputeModel::default();
    let parallelism = Parallelism { expert: 8, ..Parallelism::data_parallel(16) };
    let makespan = |fold: bool| {
        let mut s = strategy(&model, &compute, parallelism, 16 * 4, 4);
        s.fold_symmetric_ranks = fold;
        let lowered = s.lower().unwrap();
        assert_eq!(lowered.graph.images().is_empty(), !fold);
        let timeline =
            NetworkSettings::new(Fidelity::Flow).run(&lowered.graph, &super::tests::dgx(2)).unwrap();
        timeline.makespan().as_ps() as f64
    };
    let (folded, full) = (makespan(true), makespan(false));
    assert!((folded / full - 1.0).abs() < 1e-9, "folded {folded} ps vs full {full} ps");
}

/// A DeepEP-style dispatcher's two hops (the expert group's members on one server, then those
/// at one local index of every server) are kept whole by the images too: expert 16 spans two
/// 8-GPU servers, the replicas fold, and the folded flow iteration is the full graph's. Before
/// the node run was a digit of the rotation, the images split the NVLink groups, so a DeepEP
/// job of 1,024 GPUs was simulated rank by rank (9.9 M ops, 6 s instead of 0.3 s).
#[test]
fn folded_deepep_iteration_equals_the_full_graphs() {
    use sim_core::fidelity::{Fidelity, NetworkSettings};
    let model = moe_gpt(16, 2);
    let compute = ComputeModel::default();
    let parallelism = Parallelism {
        expert: 16,
        moe_dispatcher: crate::MoeDispatcher::DeepEp,
        moe_node: 8,
        ..Parallelism::data_parallel(32)
    };
    let makespan = |fold: bool| {
        let mut s = strategy(&model, &compute, parallelism, 32 * 4, 4);
        s.fold_symmetric_ranks = fold;
        let lowered = s.lower().unwrap();
        assert_eq!(lowered.graph.images().is_empty(), !fold, "fold {fold}");
        let timeline =
            NetworkSettings::new(Fidelity::Flow).run(&lowered.graph, &super::tests::dgx(4)).unwrap();
        timeline.makespan().as_ps() as f64
    };
    let (folded, full) = (makespan(true), makespan(false));
    assert!((folded / full - 1.0).abs() < 1e-9, "folded {folded} ps vs full {full} ps");
}

/// The EP A2A overlap's schedule: the first forward alone, each later forward with the
/// backward before it, the last backward alone (Megatron-Core's
/// `combined_1f1b_schedule_for_no_pipelining`), holding two micro-batches' activations.
#[test]
fn moe_overlap_actions_pair_each_forward_with_the_backward_before() {
    use crate::pipeline::{PipelineSchedule, actions, pair_steady_state, peak_in_flight};
    let merged = |m| {
        let mut order = actions(PipelineSchedule::OneFOneB, 1, 1, 1, 0, m);
        pair_steady_state(&mut order);
        order
    };
    let order: Vec<(bool, u32, bool)> =
        merged(4).iter().map(|a| (a.is_forward(), a.micro_batch, a.with_next)).collect();
    let (f, b) = (true, false);
    let expected = [(f, 0, false), (f, 1, true), (b, 0, false), (f, 2, true), (b, 1, false)];
    assert_eq!(order[..5], expected);
    assert_eq!(order[5..], [(f, 3, true), (b, 2, false), (b, 3, false)]);
    assert_eq!(peak_in_flight(&merged(4), &[1]), 2);
    assert_eq!(peak_in_flight(&merged(1), &[1]), 1);
}

/// `moe-overlap` on rank 0: the expert stream runs each merged step's all-to-alls in
/// Megatron-Core's order (`TransformerLayerSchedulePlan.run`: combine backward, dispatch
/// forward, dispatch backward, combine forward, one transformer layer pair after another), the
/// compute stream alternates the two passes inside every layer pair, and the work is the plain
/// schedule's: the same kernels, the same collectives, the same bytes.
#[test]
fn moe_overlap_interleaves_the_passes_in_megatrons_order_with_the_same_work() {
    let model = moe_gpt(8, 2);
    let compute = ComputeModel::default();
    let lower = |overlap: bool| {
        let p = Parallelism { expert: 4, moe_overlap: overlap, ..Parallelism::data_parallel(8) };
        let mut s = strategy(&model, &compute, p, 8 * 4 * 3, 4);
        s.precision = Dtype::Bf16;
        s.lower().unwrap()
    };
    let (plain, merged) = (lower(false), lower(true));
    let passes = |graph: &sim_core::graph::ExecGraph, stream: StreamId| -> Vec<bool> {
        graph
            .ops()
            .iter()
            .filter(|op| op.rank == RankId(0) && op.stream == stream)
            .map(|op| op.meta.pass() == Some(sim_core::graph::Pass::Forward))
            .collect()
    };
    // Three micro-batches, 12 expert layers, two all-to-alls each way per layer.
    let (f, b) = (true, false);
    let mut expected = vec![f; 24];
    for _ in 0..2 {
        for _ in 0..12 {
            expected.extend([b, f, b, f]);
        }
    }
    expected.extend([b; 24]);
    assert_eq!(passes(&merged.graph, EXPERT_STREAM), expected);
    let mut unmerged = Vec::new();
    for _ in 0..3 {
        unmerged.extend([f; 24]);
        unmerged.extend([b; 24]);
    }
    assert_eq!(passes(&plain.graph, EXPERT_STREAM), unmerged);
    // The compute stream switches passes at least four times per layer pair when merged, twice
    // per micro-batch when not.
    let switches = |order: Vec<bool>| order.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(switches(passes(&plain.graph, COMPUTE_STREAM)), 5);
    assert!(switches(passes(&merged.graph, COMPUTE_STREAM)) >= 2 * 12 * 4);
    // Same work: kernel time and collective bytes per rank.
    let work = |graph: &sim_core::graph::ExecGraph| {
        let (mut busy, mut bytes) = (0u64, 0u64);
        for op in graph.ops().iter().filter(|op| op.rank == RankId(0)) {
            match op.kind {
                OpKind::Compute { duration } if op.stream == COMPUTE_STREAM => busy += duration.as_ps(),
                OpKind::Collective(id) => bytes += graph.collective(id).bytes.0,
                _ => {}
            }
        }
        (busy, bytes, graph.ops().len())
    };
    assert_eq!(work(&plain.graph), work(&merged.graph));
}

/// With the all-to-alls crossing servers (expert 16 over two DGX), the merged steps hide part
/// of them behind the other pass's kernels: the iteration is shorter than the plain schedule's,
/// but never shorter than the GPU's own kernel time.
#[test]
fn moe_overlap_hides_expert_all_to_alls_behind_the_other_micro_batch() {
    use sim_core::fidelity::{Fidelity, NetworkSettings};
    let model = moe_gpt(16, 2);
    let compute = ComputeModel::default();
    let run = |overlap: bool| {
        let p = Parallelism { expert: 16, moe_overlap: overlap, ..Parallelism::data_parallel(16) };
        let mut s = strategy(&model, &compute, p, 16 * 4 * 4, 4);
        s.precision = Dtype::Bf16;
        let lowered = s.lower().unwrap();
        let busy = super::tests::compute_busy_ps(&lowered.graph, 0);
        let timeline =
            NetworkSettings::new(Fidelity::Flow).run(&lowered.graph, &super::tests::dgx(2)).unwrap();
        (timeline.makespan().as_ps(), busy)
    };
    let ((plain, busy), (merged, merged_busy)) = (run(false), run(true));
    assert_eq!(busy, merged_busy);
    assert!(merged < plain, "merged {merged} ps, plain {plain} ps");
    assert!(merged >= busy, "merged {merged} ps below the kernels' {busy} ps");
    // Something worth hiding: the plain step waits at least 10% on its all-to-alls.
    assert!(plain as f64 > 1.1 * busy as f64, "plain {plain} ps, kernels {busy} ps");
}

/// `moe-overlap` refuses what Megatron-Core refuses, and what parasim does not model, naming
/// the key.
#[test]
fn moe_overlap_refusals_name_the_key() {
    let model = moe_gpt(8, 2);
    let compute = ComputeModel::default();
    let overlap = Parallelism { expert: 4, moe_overlap: true, ..Parallelism::data_parallel(8) };
    let cases: [(Parallelism, Recompute, &str); 5] = [
        (Parallelism { expert: 1, ..overlap }, Recompute::None, "expert >= 2"),
        (Parallelism { moe_dispatcher: MoeDispatcher::AllGather, ..overlap }, Recompute::None, "all-to-all"),
        (overlap, Recompute::Full, "full recomputation"),
        (
            Parallelism { pipeline: 2, data: 4, ..overlap },
            Recompute::None,
            "needs the interleaved 1F1B schedule",
        ),
        (Parallelism { zero: 3, ..overlap }, Recompute::None, "zero <= 2"),
    ];
    for (p, recompute, says) in cases {
        let mut s = strategy(&model, &compute, p, 8 * 4 * 2, 4);
        s.precision = Dtype::Bf16;
        s.recompute = recompute;
        match s.check() {
            Err(StrategyError::Invalid { key, message }) => {
                assert_eq!(key, "parallelism.moe-overlap", "{message}");
                assert!(message.contains(says), "{message}");
            }
            other => panic!("{p:?}: {other:?}"),
        }
    }
    let mut fp32 = strategy(&model, &compute, overlap, 8 * 4 * 2, 4);
    fp32.precision = Dtype::Fp32;
    assert!(matches!(fp32.check(), Err(StrategyError::Invalid { key: "parallelism.moe-overlap", .. })));
}

/// C(n, k) as an exact integer (n <= 256, k <= 8 here).
fn binomial(n: u128, k: u128) -> u128 {
    (0..k).fold(1u128, |acc, i| acc * (n - i) / (i + 1))
}

/// The expected distinct holders a token reaches, against exact binomials: one holder per
/// token for top-1 routing, every holder when a token visits every expert, and DeepSeek-V3's
/// 256 experts, top-8, over 8 nodes and 64 GPUs.
#[test]
fn deepep_copies_are_the_expected_distinct_holders() {
    for holders in [1, 2, 8, 64] {
        assert!((deepep_copies(256, 1, holders) - 1.0).abs() < 1e-12, "{holders}");
    }
    assert!((deepep_copies(16, 16, 4) - 4.0).abs() < 1e-12);
    assert!((deepep_copies(256, 8, 1) - 1.0).abs() < 1e-12);
    for (holders, per) in [(8u128, 32u128), (64, 4)] {
        let missed = binomial(256 - per, 8) as f64 / binomial(256, 8) as f64;
        let exact = holders as f64 * (1.0 - missed);
        let model = deepep_copies(256, 8, holders as u64);
        assert!((model - exact).abs() < 1e-9 * exact, "{holders}: {model} vs {exact}");
    }
    // About 5.3 nodes and 7.6 GPUs of a token's 8 experts: the network carries a token 5.3
    // times instead of 8.
    assert!((5.2..5.3).contains(&deepep_copies(256, 8, 8)), "{}", deepep_copies(256, 8, 8));
    assert!((7.5..7.7).contains(&deepep_copies(256, 8, 64)), "{}", deepep_copies(256, 8, 64));
}

/// A DeepEP-style dispatcher's two hops over 16 expert ranks on two 8-GPU nodes: the rail
/// (one rank per node at the same local index) carries each token once per node hosting one
/// of its experts, the node part once per GPU; four all-to-alls each way per expert layer;
/// the iteration beats the plain all-to-all's, whose every copy crosses the network.
#[test]
fn deepep_dispatch_crosses_the_network_once_per_node() {
    use sim_core::fidelity::{Fidelity, NetworkSettings};
    let model = moe_gpt(16, 4);
    let compute = ComputeModel::default();
    let deepep =
        Parallelism { expert: 16, moe_dispatcher: MoeDispatcher::DeepEp, ..Parallelism::data_parallel(16) };
    let local = shard::local_layers(&model, deepep.split(), 4, Dtype::Bf16).unwrap();
    let experts = local.iter().find(|l| l.role == Role::Experts).unwrap();
    let per_token = 4 * 1024 * 512 * 2; // micro-batch x tokens x hidden x bf16
    let (rdma, nvlink) = (deepep_copies(16, 4, 2), deepep_copies(16, 4, 16));
    let bytes: Vec<(&str, u64)> = experts.before_forward.iter().map(|c| (c.what, c.bytes.0)).collect();
    assert_eq!(
        bytes,
        [
            ("deepep rdma dispatch", (per_token as f64 * rdma).round() as u64),
            ("deepep nvlink dispatch", (per_token as f64 * nvlink).round() as u64)
        ]
    );
    assert_eq!(
        experts.after_forward.len() + experts.before_backward.len() + experts.after_backward_data.len(),
        6
    );
    let layout = deepep.layout();
    assert_eq!(layout.expert_rail_group(RankId(3), 8), ranks(&[3, 11]));
    assert_eq!(layout.expert_node_group(RankId(11), 8), ranks(&[8, 9, 10, 11, 12, 13, 14, 15]));
    let run = |p: Parallelism| {
        let mut s = strategy(&model, &compute, p, 16 * 4 * 2, 4);
        s.precision = Dtype::Bf16;
        let lowered = s.lower().unwrap();
        let group_sizes: Vec<usize> = lowered
            .graph
            .ops()
            .iter()
            .filter(|op| op.rank == RankId(3))
            .filter_map(|op| match op.kind {
                OpKind::Collective(id) if lowered.graph.collective(id).kind == CollectiveKind::AllToAll => {
                    Some(lowered.graph.group(lowered.graph.collective(id).group).len())
                }
                _ => None,
            })
            .collect();
        let timeline =
            NetworkSettings::new(Fidelity::Flow).run(&lowered.graph, &super::tests::dgx(2)).unwrap();
        (timeline.makespan().as_ps(), group_sizes)
    };
    let (two_hops, sizes) = run(deepep);
    // 12 layers x 2 micro-batches x 8 all-to-alls, half over the rail of 2, half over 8.
    assert_eq!(sizes.len(), 12 * 2 * 8);
    assert_eq!(sizes.iter().filter(|&&n| n == 2).count(), 12 * 2 * 4);
    assert_eq!(sizes.iter().filter(|&&n| n == 8).count(), 12 * 2 * 4);
    let (plain, _) = run(Parallelism { moe_dispatcher: MoeDispatcher::AllToAll, ..deepep });
    assert!(two_hops < plain, "deepep {two_hops} ps, all-to-all {plain} ps");
}

/// DeepEP's hops need the expert group spread evenly over the nodes it spans.
#[test]
fn deepep_refuses_expert_groups_spread_unevenly_over_nodes() {
    let model = moe_gpt(6, 2);
    let compute = ComputeModel::default();
    let p = Parallelism { expert: 3, moe_dispatcher: MoeDispatcher::DeepEp, ..Parallelism::data_parallel(9) };
    let mut s = strategy(&model, &compute, p, 9 * 4, 4);
    s.precision = Dtype::Bf16;
    match s.check() {
        Err(StrategyError::Invalid { key, message }) => {
            assert_eq!(key, "parallelism.moe-dispatcher");
            assert!(message.contains("same number of ranks on each node"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let even = Parallelism { expert: 4, data: 8, ..p };
    let eight = moe_gpt(8, 2);
    let mut s = strategy(&eight, &compute, even, 8 * 4, 4);
    s.precision = Dtype::Bf16;
    assert!(s.check().is_ok());
}

/// DualPipe's forward-and-backward pairs run merged like the EP A2A overlap's steps: on the
/// expert stream each pair's all-to-alls alternate between the two micro-batches (combine
/// backward, dispatch forward, dispatch backward, combine forward), where an unmerged pair
/// would run one pass's all-to-alls after the other's.
#[test]
fn dualpipe_pairs_interleave_the_two_micro_batches_all_to_alls() {
    let model = moe_gpt(8, 2);
    let compute = ComputeModel::default();
    let p = Parallelism {
        pipeline: 2,
        virtual_stages: 2,
        schedule: crate::pipeline::PipelineSchedule::DualPipe,
        expert: 2,
        ..Parallelism::data_parallel(2)
    };
    let mut s = strategy(&model, &compute, p, 2 * 4 * 4, 4);
    s.precision = Dtype::Bf16;
    let lowered = s.lower().unwrap();
    let order: Vec<bool> = lowered
        .graph
        .ops()
        .iter()
        .filter(|op| op.rank == RankId(0) && op.stream == EXPERT_STREAM)
        .map(|op| op.meta.pass() == Some(sim_core::graph::Pass::Forward))
        .collect();
    let alternating = order.windows(4).filter(|w| *w == [false, true, false, true]).count();
    assert!(alternating >= 3, "{alternating} alternations in {order:?}");
}

/// `moe-overlap` with an interleaved pipeline: the steady state's forward-backward pairs are
/// merged (the expert stream alternates the two micro-batches inside them), the work is the
/// plain schedule's, and the iteration is no longer than the plain one's under `flow` with the
/// all-to-alls across servers.
#[test]
fn moe_overlap_with_an_interleaved_pipeline_merges_the_steady_state() {
    use sim_core::fidelity::{Fidelity, NetworkSettings};
    let model = moe_gpt(16, 2);
    let compute = ComputeModel::default();
    let run = |overlap: bool| {
        let p = Parallelism {
            pipeline: 2,
            virtual_stages: 2,
            expert: 16,
            moe_overlap: overlap,
            ..Parallelism::data_parallel(16)
        };
        let mut s = strategy(&model, &compute, p, 16 * 4 * 4, 4);
        s.precision = Dtype::Bf16;
        let lowered = s.lower().unwrap();
        let graph = &lowered.graph;
        let order: Vec<bool> = graph
            .ops()
            .iter()
            .filter(|op| op.rank == RankId(0) && op.stream == EXPERT_STREAM)
            .map(|op| op.meta.pass() == Some(sim_core::graph::Pass::Forward))
            .collect();
        let busy = super::tests::compute_busy_ps(graph, 0);
        let timeline = NetworkSettings::new(Fidelity::Flow).run(graph, &super::tests::dgx(4)).unwrap();
        let alternations = order.windows(4).filter(|w| *w == [false, true, false, true]).count();
        (timeline.makespan().as_ps(), busy, alternations)
    };
    let ((plain, busy, none), (merged, merged_busy, some)) = (run(false), run(true));
    assert_eq!(busy, merged_busy);
    assert_eq!(none, 0);
    assert!(some >= 3, "{some}");
    assert!(merged <= plain, "merged {merged} ps, plain {plain} ps");
}

/// `moe-overlap` with every forward of an interleaved pipeline in the warm-up (micro-batches
/// equal to the pipeline degree) has no steady state and no merged pair, and runs; with more
/// micro-batches the warm-up holds one forward more than plain interleaved 1F1B (Megatron-
/// Core's), which keeps merged pairs from waiting on each other across stages.
#[test]
fn moe_overlap_pairs_only_the_steady_state_after_one_more_warm_up_forward() {
    use crate::pipeline::{Action, Step, pair_steady_state};
    let model = moe_gpt(16, 2);
    let compute = ComputeModel::default();
    let p = Parallelism {
        pipeline: 2,
        virtual_stages: 2,
        expert: 8,
        moe_overlap: true,
        ..Parallelism::data_parallel(8)
    };
    let mut s = strategy(&model, &compute, p, 8 * 4 * 2, 4);
    s.precision = Dtype::Bf16;
    let lowered = s.lower().unwrap();
    sim_core::fidelity::NetworkSettings::new(sim_core::fidelity::Fidelity::Flow)
        .run(&lowered.graph, &super::tests::dgx(2))
        .unwrap();
    let f = |m| Action { step: Step::Forward, micro_batch: m, chunk: 0, with_next: false };
    let b = |m| Action { step: Step::Backward, micro_batch: m, chunk: 0, with_next: false };
    let mut order = vec![f(0), f(1), b(0), f(2), b(1), f(3), b(2), b(3)];
    pair_steady_state(&mut order);
    let shape: Vec<(bool, u32, bool)> =
        order.iter().map(|a| (a.is_forward(), a.micro_batch, a.with_next)).collect();
    assert_eq!(
        shape,
        [
            (true, 0, false),
            (true, 1, false),
            (true, 2, true),
            (false, 0, false),
            (true, 3, true),
            (false, 1, false),
            (false, 2, false),
            (false, 3, false)
        ]
    );
    let mut all_warm = vec![f(0), f(1), b(0), b(1)];
    pair_steady_state(&mut all_warm);
    assert!(all_warm.iter().all(|a| !a.with_next));
}
