//! DeepSpeed's ZeRO stage 3 as it was when Megatron-LM's SC'21 paper compared against it
//! (DeepSpeed v0.3.13, 2021-03-16, and v0.3.14, 2021-04-08, tag commit `0cd9abf20`; ZeRO-3
//! itself landed in `599258f97`, "ZeRO 3 Offload (#834)", 2021-03-08): which parameters it
//! gathers, when, how many it keeps, and how it reduces gradients.
//!
//! Every number is a default of that code (`deepspeed/runtime/zero/constants.py`,
//! <https://github.com/microsoft/DeepSpeed/blob/v0.3.14/deepspeed/runtime/zero/constants.py>):
//! the paper (arXiv 2104.04473, section 5.2) says it used "the DeepSpeed Python library" and
//! gives no configuration, so the code's defaults are the only sourced choice.
//!
//! What the code does (`deepspeed/runtime/zero/stage3.py`, `partition_parameters.py` at
//! v0.3.14), and what this module takes from it:
//! - hooks on every sub-module fetch the sub-module's own parameters before its forward and
//!   its backward (`fetch_sub_module`): one `torch.distributed.all_gather` per parameter
//!   (`_allgather_param`), each preceded by `torch.cuda.synchronize()`, and a device-wide
//!   `torch.cuda.synchronize()` once they arrive (`_synchronize_communication`). Parameters
//!   under [`PARAM_PERSISTENCE_THRESHOLD`] elements are never partitioned (biases, norms);
//! - after the fetch, if no gather is in flight and fewer than [`MAX_LIVE_PARAMETERS`]
//!   elements are gathered, the next not-gathered parameters of the recorded trace are
//!   prefetched, up to [`PREFETCH_BUCKET_SIZE`] elements (`prefetch_next_sub_modules`); the
//!   sub-module's compute overlaps them;
//! - after the sub-module, each parameter is freed unless the trace uses it again within
//!   [`MAX_REUSE_DISTANCE`] elements of other sub-modules' parameters (`_keep_for_later`);
//! - gradients: each parameter's gradient hook adds it to a bucket of at most
//!   [`REDUCE_BUCKET_SIZE`] elements; the full bucket (with `contiguous_gradients` off, the
//!   ZeRO-3 default) is flattened and all-reduced in fp16 on the reduction stream
//!   (`buffered_reduce_fallback` -> `allreduce_bucket`), after the host waited for the previous
//!   one (`reduction_stream.synchronize()`); the last bucket after the backward
//!   (`independent_gradient_partition_epilogue`). `fp32_allreduce` is refused with ZeRO
//!   (`engine.py`, `_configure_zero_optimizer`), so gradients travel in fp16.
//!
//! The host's side (each gather's `world_size` copy-out kernels, PyTorch's list
//! `all_gather`; the host held at every synchronize) is emitted by `emit.rs`
//! (`RankEmitter::deepspeed_events`).
//!
//! parasim's layers stand for DeepSpeed's sub-modules: each layer with parameters is one
//! fetch; parameter-free layers are sub-modules whose hooks may prefetch. The output layer tied
//! to the input embedding fetches the embedding's weight (Megatron registers it as an external
//! parameter of the language model).

use std::ops::Range;

use workloads::layer::{Layer, LayerKind};

/// `stage3_param_persistence_threshold`: parameters with fewer elements stay whole on every
/// rank (`ZERO_OPTIMIZATION_PARAM_PERSISTENCE_THRESHOLD_DEFAULT = 100000`, constants.py at
/// v0.3.14; `persistent_parameters` in stage3.py).
pub const PARAM_PERSISTENCE_THRESHOLD: u64 = 100_000;

/// `stage3_prefetch_bucket_size`: elements prefetched at once
/// (`ZERO_OPTIMIZATION_PREFETCH_BUCKET_SIZE_DEFAULT = 50000000`, constants.py at v0.3.14).
pub const PREFETCH_BUCKET_SIZE: u64 = 50_000_000;

/// `stage3_max_live_parameters`: no prefetch while this many elements are gathered
/// (`ZERO_OPTIMIZATION_MAX_LIVE_PARAMETERS_DEFAULT = 1000000000`, constants.py at v0.3.14).
pub const MAX_LIVE_PARAMETERS: u64 = 1_000_000_000;

/// `stage3_max_reuse_distance`: a parameter used again within this many elements of other
/// parameters is kept (`ZERO_OPTIMIZATION_MAX_REUSE_DISTANCE_DEFAULT = 1000000000`,
/// constants.py at v0.3.14).
pub const MAX_REUSE_DISTANCE: u64 = 1_000_000_000;

/// `reduce_bucket_size`: elements of gradients all-reduced at once
/// (`ZERO_OPTIMIZATION_REDUCE_BUCKET_SIZE_DEFAULT = 500000000`, constants.py at v0.3.14).
pub const REDUCE_BUCKET_SIZE: u64 = 500_000_000;

/// Which pass of a layer an event of the trace runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventPass {
    /// The forward.
    Forward,
    /// The forward again, before the backward (activation recomputation).
    Recompute,
    /// The backward (data and weight gradients).
    Backward,
}

/// One sub-module call of one micro-batch and what ZeRO-3 does around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The layer.
    pub layer: usize,
    /// Its pass.
    pub pass: EventPass,
    /// Elements gathered before it because they were not prefetched (0: none).
    pub fetch: u64,
    /// Whether its fetch synchronises the device (it gathered, or its parameters were in
    /// flight): its compute waits for every gather issued so far.
    pub sync: bool,
    /// Elements of each parameter prefetched after its fetch, in order (one gather each).
    pub prefetch: Vec<u64>,
    /// Backward only: elements of the gradient bucket all-reduced when this layer's gradient
    /// is ready (the bucket before it, which it would overflow; 0: none).
    pub reduce: u64,
}

/// The ZeRO-3 plan of one chunk's micro-batch: its events in order, forward then backward
/// (with recomputation before the backward of the layer that triggers it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Every event, in order.
    pub events: Vec<Event>,
    /// How many of them are the forward.
    pub forward_events: usize,
    /// Elements of the last gradient bucket, all-reduced after the backward.
    pub final_reduce: u64,
    /// Most parameter elements gathered at once.
    pub peak_live: u64,
}

/// Elements of `layer`'s parameters ZeRO-3 partitions (tensors of at least
/// [`PARAM_PERSISTENCE_THRESHOLD`] elements) and keeps whole (smaller tensors). A linear
/// layer's weight and bias are separate tensors; any other layer's parameters count as one.
pub fn partitioned_and_persistent(layer: &Layer) -> (u64, u64) {
    let total = layer.cost.params;
    let tensors: Vec<u64> = match &layer.kind {
        LayerKind::Linear { out_features, bias: true } if total > *out_features => {
            vec![total - out_features, *out_features]
        }
        _ => vec![total],
    };
    tensors.iter().fold((0, 0), |(partitioned, persistent), &t| {
        if t >= PARAM_PERSISTENCE_THRESHOLD {
            (partitioned + t, persistent)
        } else {
            (partitioned, persistent + t)
        }
    })
}

/// The trace of `layers` (one chunk) under DeepSpeed's parameter coordinator, for one
/// micro-batch. `recompute_before[i]` is the forward range re-run before layer `i`'s backward;
/// `partitioned[i]` the elements layer `i` gathers (the tied output layer: its embedding's);
/// `gradients[i]` the gradient elements its backward produces.
pub fn trace(
    layers: Range<usize>,
    recompute_before: &[Option<Range<usize>>],
    partitioned: &[u64],
    gradients: &[u64],
) -> Trace {
    let event = |layer, pass| Event { layer, pass, fetch: 0, sync: false, prefetch: Vec::new(), reduce: 0 };
    let mut events: Vec<Event> = layers.clone().map(|i| event(i, EventPass::Forward)).collect();
    let forward_events = events.len();
    for i in layers.clone().rev() {
        if let Some(range) = &recompute_before[i] {
            events.extend(range.clone().map(|j| event(j, EventPass::Recompute)));
        }
        events.push(event(i, EventPass::Backward));
    }
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        NotAvailable,
        InFlight,
        Available,
    }
    let count = partitioned.len();
    let mut state = vec![State::NotAvailable; count];
    let mut in_flight: Vec<usize> = Vec::new();
    let mut live = 0u64;
    let mut peak = 0u64;
    // What a sub-module's hooks see as its parameters, for the reuse distance.
    let numel = |layer: usize| partitioned[layer].max(gradients[layer]);
    for e in 0..events.len() {
        let layer = events[e].layer;
        let p = partitioned[layer];
        if p > 0 {
            match state[layer] {
                State::NotAvailable => {
                    events[e].fetch = p;
                    events[e].sync = true;
                    live += p;
                }
                State::InFlight => events[e].sync = true,
                State::Available => {}
            }
            if events[e].sync {
                // `_synchronize_communication` waits for every handle in flight.
                for &other in &in_flight {
                    state[other] = State::Available;
                }
                in_flight.clear();
            }
            state[layer] = State::Available;
        }
        if in_flight.is_empty() && live < MAX_LIVE_PARAMETERS {
            let mut numel_prefetched = 0;
            let mut prefetch = Vec::new();
            for later in &events[e + 1..] {
                let m = later.layer;
                if partitioned[m] == 0 || state[m] != State::NotAvailable {
                    continue;
                }
                state[m] = State::InFlight;
                in_flight.push(m);
                live += partitioned[m];
                prefetch.push(partitioned[m]);
                numel_prefetched += partitioned[m];
                if numel_prefetched >= PREFETCH_BUCKET_SIZE {
                    break;
                }
            }
            events[e].prefetch = prefetch;
        }
        peak = peak.max(live);
        if p > 0 {
            let next_use = events[e + 1..].iter().position(|later| later.layer == layer);
            let keep = next_use.is_some_and(|offset| {
                let between: u64 = events[e + 1..e + 1 + offset].iter().map(|later| numel(later.layer)).sum();
                between < MAX_REUSE_DISTANCE
            });
            if !keep {
                state[layer] = State::NotAvailable;
                live -= p;
            }
        }
    }
    // Gradient buckets, in backward order.
    let mut bucket = 0u64;
    for event in events[forward_events..].iter_mut().filter(|e| e.pass == EventPass::Backward) {
        let g = gradients[event.layer];
        if g == 0 {
            continue;
        }
        if bucket > 0 && bucket + g > REDUCE_BUCKET_SIZE {
            event.reduce = bucket;
            bucket = 0;
        }
        bucket += g;
    }
    Trace { events, forward_events, final_reduce: bucket, peak_live: peak }
}

/// Elements of fp16 gradient buffers alive at the peak of the backward: the bucket being
/// reduced (at most [`REDUCE_BUCKET_SIZE`], or one larger gradient), its flattened copy
/// (`flatten(bucket)` in `allreduce_bucket`) and the gradient whose hook triggered it.
pub fn gradient_buffer_elements(largest_gradient: u64) -> u64 {
    2 * REDUCE_BUCKET_SIZE.max(largest_gradient) + largest_gradient
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy block of four linear layers (weights `w`) between parameter-free layers, three
    /// blocks, fully recomputed: layer 0 is free, each block is 1 + 4 layers.
    fn toy(w: u64) -> (Vec<Option<Range<usize>>>, Vec<u64>, Vec<u64>) {
        let layers = 1 + 3 * 5;
        let mut partitioned = vec![0; layers];
        let mut recompute = vec![None; layers];
        for block in 0..3 {
            let start = 1 + block * 5;
            partitioned[start + 1..start + 5].fill(w);
            recompute[start + 4] = Some(start..start + 5);
        }
        let gradients = partitioned.clone();
        (recompute, partitioned, gradients)
    }

    #[test]
    fn weights_are_gathered_again_unless_reused_within_the_reuse_distance() {
        // (weight elements, gathers per micro-batch): 12 weights in 3 blocks, forward,
        // recomputation and backward. With 1e8 each, the last block's forward copies are kept
        // for its recomputation (the 3e8 of weights between are under the 1e9 reuse distance)
        // and every recomputed copy for its backward (at most 6e8 between): 12 forward + 8
        // recomputation gathers. With 3e8 each, a block's first two recomputed weights are
        // released (1.8e9 and 1.2e9 of weights before their backward) and gathered again: 6 more.
        for (w, expected) in [(100_000_000, 20), (300_000_000, 26)] {
            let (recompute, partitioned, gradients) = toy(w);
            let trace = trace(0..16, &recompute, &partitioned, &gradients);
            let gathered: u64 = trace.events.iter().map(|e| e.fetch + e.prefetch.iter().sum::<u64>()).sum();
            assert_eq!(gathered / w, expected, "{:?}", trace.events);
        }
    }

    #[test]
    fn small_weights_are_prefetched_one_ahead() {
        let (recompute, partitioned, gradients) = toy(100_000_000);
        let trace = trace(0..16, &recompute, &partitioned, &gradients);
        // The free layer before the first weight prefetches it (nothing in flight or live), so
        // the weight's own fetch only synchronises; each weight's fetch prefetches the next
        // (one 1e8 weight fills the 5e7-element prefetch bucket).
        let forward = &trace.events[..trace.forward_events];
        assert_eq!(forward[0].prefetch, vec![100_000_000]);
        assert!(forward.iter().all(|e| e.fetch == 0), "{forward:?}");
        assert!(forward[2..5].iter().all(|e| e.sync && e.prefetch == vec![100_000_000]), "{forward:?}");
        assert!(trace.peak_live <= 8 * 100_000_000, "{}", trace.peak_live);
    }

    #[test]
    fn weights_above_the_live_bound_are_not_prefetched_by_their_own_fetch() {
        let (recompute, partitioned, gradients) = toy(1_200_000_000);
        let trace = trace(0..16, &recompute, &partitioned, &gradients);
        // Each weight alone exceeds stage3_max_live_parameters: an owner never prefetches, and
        // the next weight is fetched by its own layer (nothing free in between here).
        for e in &trace.events {
            if partitioned[e.layer] > 0 {
                assert!(e.prefetch.is_empty(), "{e:?}");
            }
        }
        assert!(trace.events.iter().filter(|e| e.fetch > 0).count() >= 9);
        assert!(trace.peak_live <= 2 * 1_200_000_000, "{}", trace.peak_live);
    }

    #[test]
    fn gradients_go_in_buckets_of_at_most_the_reduce_bucket_size() {
        let (recompute, partitioned, gradients) = toy(200_000_000);
        let trace = trace(0..16, &recompute, &partitioned, &gradients);
        let reduces: Vec<u64> = trace.events.iter().map(|e| e.reduce).filter(|&r| r > 0).collect();
        // 12 gradients of 2e8: two per bucket of 5e8 (a third would overflow it).
        assert_eq!(reduces, vec![400_000_000; 5]);
        assert_eq!(trace.final_reduce, 400_000_000);
        assert_eq!(reduces.iter().sum::<u64>() + trace.final_reduce, 12 * 200_000_000);
    }

    #[test]
    fn biases_and_norms_stay_whole() {
        let linear = Layer::new(
            "fc",
            LayerKind::Linear { out_features: 12288, bias: true },
            workloads::layer::Shape(vec![2048, 12288]),
        )
        .unwrap();
        assert_eq!(partitioned_and_persistent(&linear), (12288 * 12288, 12288));
        let norm = Layer::new(
            "norm",
            LayerKind::LayerNorm { bias: true },
            workloads::layer::Shape(vec![2048, 12288]),
        )
        .unwrap();
        assert_eq!(partitioned_and_persistent(&norm), (0, 2 * 12288));
    }
}
