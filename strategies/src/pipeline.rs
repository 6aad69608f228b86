//! Pipeline parallelism: the partition of a model's layers into stages (and virtual chunks)
//! and the order each stage runs its micro-batches in (GPipe, 1F1B, interleaved 1F1B, ZB-H1,
//! ZB-V, DualPipe), and where each schedule places its model chunks ([`ChunkMap`]).
//!
//! The schedules are Megatron-LM's (`megatron/core/pipeline_parallel/schedules.py` at
//! NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553) and Qi et al.'s:
//! - GPipe: every micro-batch's forward, then every backward;
//! - 1F1B (`forward_backward_pipelining_without_interleaving`): stage `s` of `p` runs
//!   `min(p - s - 1, m)` warm-up forwards, then alternates one forward and one backward, then
//!   drains the remaining backwards;
//! - interleaved 1F1B (`forward_backward_pipelining_with_interleaving`), with `v` model chunks
//!   per stage: the `m v` chunk-micro-batches follow `get_schedule_table`: micro-batches in
//!   groups of `g` (`--microbatch-group-size-per-virtual-pipeline-stage`, default `p`), each
//!   group through chunk 0, then chunk 1, ...; the last group takes the remaining
//!   micro-batches. `get_pp_rank_microbatches` gives `(p - s - 1) 2 + (v - 1) g` warm-up
//!   forwards (capped at `m v`); backward `k` runs the chunk mirrored of forward `k`'s (`v - 1 -
//!   c`) on the same micro-batch. When `m = p`, every forward runs in the warm-up (the rule of
//!   Megatron-LM before the tunable groups, kept so that existing scenarios simulate as before;
//!   the commit above caps the warm-up only at `m v`);
//! - ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241,
//!   section 2.1 and figure 3): the backward split into B (input gradient) and W (weight
//!   gradient); stage `s` runs 1F1B's warm-up and F, B pairs, but starts its W passes `s` steps
//!   late, so every stage holds at most `p` micro-batches (1F1B's peak, on its first stage), and
//!   the postponed W passes fill the cool-down bubble: the bubble shrinks from `(p - 1)(T_F +
//!   T_B + T_W)` to `(p - 1)(T_F + T_B - T_W)` (the paper's table 3);
//! - ZB-V (Qi et al., section 6, and "Pipeline Parallelism with Controllable Memory", arXiv
//!   2405.15362): two chunks per stage in a V (stage `s` holds chunks `s` and `2p - 1 - s`), the
//!   backward split into B and W; the order is built by [`zb_v_orders`], a list schedule of the
//!   stages' own F, B and W times under 1F1B's peak activation memory (`2p` chunk activations,
//!   `p` micro-batches of a whole stage);
//! - DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437, section 3.2.1, and
//!   deepseek-ai/DualPipe@3da1bbe `dualpipe/dualpipe.py`): each of the `p` (even) ranks holds
//!   stage `s` of a model copy fed from rank 0 and stage `p - 1 - s` of a second copy fed from
//!   rank `p - 1`; half the micro-batches go each way, in the reference's eight steps
//!   ([`dual_pipe`]), with forward-and-backward pairs ([`Action::with_next`]).
//!
//! No bubble is computed here: it emerges when the engine runs the schedule with the
//! stage-to-stage transfers as dependencies.

use std::ops::Range;

/// The pipeline schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PipelineSchedule {
    /// All forwards, then all backwards (Huang et al. 2019).
    #[serde(rename = "gpipe")]
    GPipe,
    /// One forward, one backward (PipeDream-Flush, Megatron-LM's default); interleaved when
    /// there are virtual stages.
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// Zero-bubble ZB-H1 (Qi et al. 2024): 1F1B with the weight-gradient passes split off the
    /// backward and postponed into the cool-down bubble, at 1F1B's peak memory.
    #[serde(rename = "zb-h1")]
    ZbH1,
    /// Zero-bubble ZB-2p (Qi et al. 2024): the repository's automatic schedule (its
    /// heuristic, `zb_auto`) with the backward split and at most `2p` micro-batches in flight
    /// on a stage, twice 1F1B's peak activation memory.
    #[serde(rename = "zb-2p")]
    Zb2p,
    /// Zero-bubble ZB-V (Qi et al. 2024): two chunks per stage in a V, the backward split, at
    /// 1F1B's peak activation memory.
    #[serde(rename = "zb-v")]
    ZbV,
    /// DeepSeek's DualPipe (DeepSeek-V3 report, section 3.2.1): a bidirectional pipeline over
    /// two model copies, forward-and-backward pairs and the backward split.
    #[serde(rename = "dualpipe")]
    DualPipe,
}

impl PipelineSchedule {
    /// Every schedule.
    pub const ALL: [PipelineSchedule; 6] = [
        PipelineSchedule::GPipe,
        PipelineSchedule::OneFOneB,
        PipelineSchedule::ZbH1,
        PipelineSchedule::Zb2p,
        PipelineSchedule::ZbV,
        PipelineSchedule::DualPipe,
    ];

    /// The name used in scenario files.
    pub const fn name(self) -> &'static str {
        match self {
            PipelineSchedule::GPipe => "gpipe",
            PipelineSchedule::OneFOneB => "1f1b",
            PipelineSchedule::ZbH1 => "zb-h1",
            PipelineSchedule::Zb2p => "zb-2p",
            PipelineSchedule::ZbV => "zb-v",
            PipelineSchedule::DualPipe => "dualpipe",
        }
    }

    /// Whether the schedule runs two model chunks per stage in its own placement
    /// (`virtual-stages = 2`, [`ChunkMap`]): ZB-V and DualPipe.
    pub const fn two_chunks(self) -> bool {
        matches!(self, PipelineSchedule::ZbV | PipelineSchedule::DualPipe)
    }

    /// Whether the schedule splits the backward into input- and weight-gradient passes.
    pub const fn splits_backward(self) -> bool {
        matches!(
            self,
            PipelineSchedule::ZbH1
                | PipelineSchedule::Zb2p
                | PipelineSchedule::ZbV
                | PipelineSchedule::DualPipe
        )
    }
}

impl std::str::FromStr for PipelineSchedule {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        PipelineSchedule::ALL.into_iter().find(|s| s.name() == name).ok_or_else(|| {
            format!(
                "unknown pipeline schedule {name:?}; valid: \"gpipe\", \"1f1b\" (interleaved when \
                 virtual-stages > 1), \"zb-h1\" (zero-bubble ZB-H1: backward split into input- and \
                 weight-gradient passes), \"zb-2p\" (zero-bubble's automatic schedule under twice \
                 1F1B's activation memory), \"zb-v\" (zero-bubble ZB-V, virtual-stages = 2), \"dualpipe\" \
                 (DeepSeek's bidirectional DualPipe, virtual-stages = 2)"
            )
        })
    }
}

/// What one step of a stage's schedule runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The forward.
    Forward,
    /// The whole backward (input and weight gradients).
    Backward,
    /// The input-gradient half of a split backward (zero-bubble's B): what the previous stage
    /// waits for.
    BackwardInput,
    /// The weight-gradient half of a split backward (zero-bubble's W): after its B, needed by
    /// no other stage.
    BackwardWeight,
}

/// One step of a stage's schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    /// What the step runs.
    pub step: Step,
    /// Which micro-batch.
    pub micro_batch: u32,
    /// Which of the stage's model chunks (0 without virtual stages).
    pub chunk: u32,
    /// Runs with the next action as one unit (DualPipe's forward-and-backward pair): both
    /// receive before either computes, both send after both computed.
    pub with_next: bool,
}

impl Action {
    /// A step of `micro_batch` through the stage's chunk `chunk`, on its own.
    pub const fn new(step: Step, micro_batch: u32, chunk: u32) -> Action {
        Action { step, micro_batch, chunk, with_next: false }
    }

    /// A forward.
    pub const fn is_forward(&self) -> bool {
        matches!(self.step, Step::Forward)
    }

    /// A backward or its input-gradient half: what receives from the next stage and sends to
    /// the previous one.
    pub const fn is_backward(&self) -> bool {
        matches!(self.step, Step::Backward | Step::BackwardInput)
    }
}

/// Megatron-Core's `get_schedule_table`: the (micro-batch, chunk) of each forward of the
/// interleaved schedule, micro-batches in groups of `group` (the last group takes the rest),
/// each group through every chunk in turn.
pub fn schedule_table(micro_batches: u32, chunks: u32, group: u32) -> Vec<(u32, u32)> {
    let group = group.max(1);
    let mut table = Vec::with_capacity((micro_batches * chunks) as usize);
    let mut start = 0;
    while start < micro_batches {
        let end = if start + group >= micro_batches { micro_batches } else { start + group };
        for chunk in 0..chunks {
            table.extend((start..end).map(|micro| (micro, chunk)));
        }
        start += group;
    }
    table
}

/// The order stage `stage` of `stages` runs `micro_batches` micro-batches of its `chunks` model
/// chunks in, interleaved micro-batches in groups of `group` (Megatron's default: `stages`);
/// ZB-V's as [`zb_v_orders`] builds it with equal F, B and W times (the lowering uses
/// [`orders`] with the chunks' own). The caller has checked the combination (see
/// [`check_schedule`]).
pub fn actions(
    schedule: PipelineSchedule,
    stages: u32,
    chunks: u32,
    group: u32,
    stage: u32,
    micro_batches: u32,
) -> Vec<Action> {
    let m = micro_batches;
    let mut order = Vec::with_capacity(3 * (m * chunks) as usize);
    let forward = |micro_batch, chunk| Action::new(Step::Forward, micro_batch, chunk);
    let backward = |micro_batch, chunk| Action::new(Step::Backward, micro_batch, chunk);
    if schedule == PipelineSchedule::GPipe {
        order.extend((0..m).map(|mb| forward(mb, 0)));
        order.extend((0..m).map(|mb| backward(mb, 0)));
        return order;
    }
    if schedule == PipelineSchedule::ZbH1 {
        return zb_h1(stages, stage, m);
    }
    if schedule == PipelineSchedule::DualPipe {
        return dual_pipe(stages, stage, m);
    }
    if schedule == PipelineSchedule::ZbV {
        let mut orders = zb_v_orders(stages, m, &vec![[1, 1, 1]; 2 * stages as usize]);
        return orders.swap_remove(stage as usize);
    }
    if schedule == PipelineSchedule::Zb2p {
        let mut orders = crate::zb_auto::orders(stages, m, &vec![[1, 1, 1]; stages as usize], 2 * stages);
        return orders.swap_remove(stage as usize);
    }
    if chunks == 1 {
        let warmup = (stages - stage - 1).min(m);
        order.extend((0..warmup).map(|mb| forward(mb, 0)));
        for i in 0..m - warmup {
            order.push(forward(warmup + i, 0));
            order.push(backward(i, 0));
        }
        order.extend((m - warmup..m).map(|mb| backward(mb, 0)));
        return order;
    }
    // Interleaved: virtual micro-batch k -> (micro-batch, chunk) by Megatron's table; the
    // backward of k runs the mirrored chunk.
    let table = schedule_table(m, chunks, group);
    let forward_of = |k: u32| {
        let (micro, chunk) = table[k as usize];
        forward(micro, chunk)
    };
    let backward_of = |k: u32| {
        let (micro, chunk) = table[k as usize];
        backward(micro, chunks - 1 - chunk)
    };
    let total = m * chunks;
    let warmup =
        if m == stages { total } else { ((stages - stage - 1) * 2 + (chunks - 1) * group).min(total) };
    order.extend((0..warmup).map(forward_of));
    for i in 0..total - warmup {
        order.push(forward_of(warmup + i));
        order.push(backward_of(i));
    }
    order.extend((total - warmup..total).map(backward_of));
    order
}

/// Megatron-Core's EP A2A overlap (megatron/core/pipeline_parallel/combined_1f1b.py at
/// d98e8a64dd): every forward that a whole backward follows in `order`'s 1F1B steady state runs
/// with it as one merged step ([`Action::with_next`]). Without a pipeline the plain order
/// `F0 B0 F1 B1 ...` becomes `F0, F1+B0, F2+B1, ..., B(m-1)`
/// (`combined_1f1b_schedule_for_no_pipelining`), which holds two micro-batches' activations.
///
/// Megatron-Core runs one forward more in the warm-up first ("to ensure the forward and
/// backward computations are independent in all 1f1b steps", `get_pp_rank_microbatches` at
/// d98e8a64dd), so the order is rebuilt with that warm-up before the pairs are marked: without
/// it a stage's pair would wait for a gradient whose pair on the next stage waits for this
/// pair's forward output.
pub fn pair_steady_state(order: &mut Vec<Action>) {
    let forwards: Vec<Action> = order.iter().copied().filter(Action::is_forward).collect();
    let backwards: Vec<Action> = order.iter().copied().filter(|a| !a.is_forward()).collect();
    // The forwards before the first backward are the warm-up and the first steady step's: the
    // warm-up one longer keeps them all alone, the steady state's pairs start after them.
    let warmup = order.iter().take_while(|a| a.is_forward()).count();
    let mut rebuilt = Vec::with_capacity(order.len());
    rebuilt.extend_from_slice(&forwards[..warmup]);
    let mut backward = backwards.iter();
    for forward in &forwards[warmup..] {
        rebuilt.push(*forward);
        rebuilt.extend(backward.next());
    }
    rebuilt.extend(backward);
    *order = rebuilt;
    // The steady state only: a forward of the warm-up (all of them when every forward is in
    // it) runs alone, as Megatron-Core's 1F1B loop has no step for it.
    let mut index = warmup;
    while index + 1 < order.len() && order[index].is_forward() && order[index + 1].step == Step::Backward {
        order[index].with_next = true;
        index += 2;
    }
}

/// ZB-H1 on stage `stage` of `stages`: 1F1B's `min(p - s - 1, m)` warm-up forwards, then F, B
/// pairs and the remaining B passes, each followed by a W once `s` of them have run without
/// (the W passes start `s` steps late, so every stage holds `p` micro-batches at most), then
/// the W passes left.
fn zb_h1(stages: u32, stage: u32, m: u32) -> Vec<Action> {
    let action = |step, micro_batch| Action::new(step, micro_batch, 0);
    let warmup = (stages - stage - 1).min(m);
    let mut order = Vec::with_capacity(3 * m as usize);
    order.extend((0..warmup).map(|mb| action(Step::Forward, mb)));
    let mut next_weight = 0;
    for i in 0..m {
        if warmup + i < m {
            order.push(action(Step::Forward, warmup + i));
        }
        order.push(action(Step::BackwardInput, i));
        if i >= stage {
            order.push(action(Step::BackwardWeight, next_weight));
            next_weight += 1;
        }
    }
    order.extend((next_weight..m).map(|mb| action(Step::BackwardWeight, mb)));
    order
}

/// Every stage's order (see [`actions`]); ZB-V's is built from `times`, each global chunk's
/// (forward, input-gradient, weight-gradient) time in any one unit ([`zb_v_orders`]), which
/// the other schedules ignore.
pub fn orders(
    schedule: PipelineSchedule,
    stages: u32,
    chunks: u32,
    group: u32,
    micro_batches: u32,
    times: &[[u64; 3]],
) -> Vec<Vec<Action>> {
    if schedule == PipelineSchedule::ZbV {
        return zb_v_orders(stages, micro_batches, times);
    }
    if schedule == PipelineSchedule::Zb2p {
        return crate::zb_auto::orders(stages, micro_batches, times, 2 * stages);
    }
    (0..stages).map(|stage| actions(schedule, stages, chunks, group, stage, micro_batches)).collect()
}

/// ZB-V's order on each of `stages` stages for `micro_batches` micro-batches, chunk `c` of the
/// `2 stages` on stage `c` or `2 stages - 1 - c` (the V), `times[c]` its (F, B, W) times.
///
/// A list schedule, in the spirit of the zero-bubble repository's ZB-V generator
/// (sail-sg/zero-bubble-pipeline-parallelism, `zerobubble/scheduler/zbv.py`, which also tries
/// variants and keeps the best), written anew: it simulates the stages with these times (an
/// instant network) and, whenever a stage is free, runs a ready step of its oldest micro-batch,
/// the second chunk first, by one of two rules; the order with the shorter simulated makespan
/// wins (the first on a tie):
/// - forwards first, then B, then the oldest pending W; but a W first once the stage holds
///   `2p - 1` chunk activations;
/// - B first, then forwards, then W.
///
/// The first chunk's forwards run only while fewer than `2p - 1` chunk activations are held (so
/// a micro-batch that has entered can always turn at the V's tip); activations are held from F
/// to W, so no stage holds more than `2p` chunk activations, the `p` whole-stage micro-batches
/// of 1F1B's first stage. With equal F, B and W the only idle time is the V's tip waiting for
/// its first forward, `(p - 1) T_F` (tested below).
pub fn zb_v_orders(stages: u32, micro_batches: u32, times: &[[u64; 3]]) -> Vec<Vec<Action>> {
    let (first, first_end) = zb_v_list(stages, micro_batches, times, true);
    let (second, second_end) = zb_v_list(stages, micro_batches, times, false);
    if second_end < first_end { second } else { first }
}

/// One of [`zb_v_orders`]'s list schedules (`forwards_first`: the first rule) and its simulated
/// makespan.
fn zb_v_list(
    stages: u32,
    micro_batches: u32,
    times: &[[u64; 3]],
    forwards_first: bool,
) -> (Vec<Vec<Action>>, u64) {
    let p = stages as usize;
    let m = micro_batches as usize;
    let chunks = 2 * p;
    let map = ChunkMap::new(PipelineSchedule::ZbV, stages, 2);
    let cap = 2 * p;
    let cost = |global: usize, step: usize| times.get(global).map_or(1, |t| t[step]);
    // Ends of each (micro-batch, global chunk)'s F and B, once run.
    let mut forward_end: Vec<Option<u64>> = vec![None; m * chunks];
    let mut backward_end: Vec<Option<u64>> = vec![None; m * chunks];
    let mut next_forward = vec![[0usize; 2]; p];
    let mut next_backward = vec![[0usize; 2]; p];
    let mut pending: Vec<std::collections::VecDeque<(u32, u32)>> = vec![Default::default(); p];
    let mut held = vec![0usize; p];
    let mut clock = vec![0u64; p];
    let mut orders: Vec<Vec<Action>> = (0..p).map(|_| Vec::with_capacity(6 * m)).collect();
    let total = 6 * m;
    let (forward_class, backward_class) = if forwards_first { (0u8, 1u8) } else { (1, 0) };
    // Set when no stage could act: the first chunk's forwards then ignore the memory cap (a
    // guard; the rules above never stall in the tests).
    let mut relaxed = false;
    loop {
        // The stage that can act earliest: (when, stage, step, local chunk).
        let mut best: Option<(u64, usize, Step, usize)> = None;
        for s in 0..p {
            if orders[s].len() >= total {
                continue;
            }
            let now = clock[s];
            // The candidate steps: (ready at, class, micro-batch, 1 - local chunk, step, local).
            let mut earliest: Option<(u64, u8, usize, usize, Step, usize)> = None;
            let mut consider = |c: (u64, u8, usize, usize, Step, usize)| {
                let key = |c: &(u64, u8, usize, usize, Step, usize)| (c.0.max(now), c.1, c.2, c.3);
                if earliest.as_ref().is_none_or(|e| key(&c) < key(e)) {
                    earliest = Some(c);
                }
            };
            for local in [1usize, 0] {
                let global = map.global(s as u32, local as u32) as usize;
                let j = next_backward[s][local];
                if j < m
                    && let Some(f) = forward_end[j * chunks + global]
                {
                    let upstream =
                        if global + 1 < chunks { backward_end[j * chunks + global + 1] } else { Some(0) };
                    if let Some(b) = upstream {
                        consider((f.max(b), backward_class, j, 1 - local, Step::BackwardInput, local));
                    }
                }
                let j = next_forward[s][local];
                let room = relaxed || held[s] < if local == 1 { cap } else { cap - 1 };
                if j < m && room {
                    let upstream = if global > 0 { forward_end[j * chunks + global - 1] } else { Some(0) };
                    if let Some(f) = upstream {
                        consider((f, forward_class, j, 1 - local, Step::Forward, local));
                    }
                }
            }
            let weight_now = !pending[s].is_empty() && (forwards_first && held[s] + 1 >= cap);
            let choice = match earliest {
                Some((ready, _, _, _, step, local)) if ready <= now && !weight_now => {
                    Some((now, step, local))
                }
                _ if !pending[s].is_empty() => Some((now, Step::BackwardWeight, 0)),
                Some((ready, _, _, _, step, local)) => Some((ready, step, local)),
                None => None,
            };
            if let Some((when, step, local)) = choice
                && best.is_none_or(|b| when < b.0)
            {
                best = Some((when, s, step, local));
            }
        }
        let Some((when, s, step, local)) = best else {
            if orders.iter().all(|o| o.len() >= total) || relaxed {
                break;
            }
            relaxed = true;
            continue;
        };
        match step {
            Step::BackwardWeight => {
                if let Some((j, local)) = pending[s].pop_front() {
                    let global = map.global(s as u32, local) as usize;
                    clock[s] = when + cost(global, 2);
                    held[s] = held[s].saturating_sub(1);
                    orders[s].push(Action::new(Step::BackwardWeight, j, local));
                }
            }
            Step::Forward => {
                let j = next_forward[s][local];
                let global = map.global(s as u32, local as u32) as usize;
                clock[s] = when + cost(global, 0);
                forward_end[j * chunks + global] = Some(clock[s]);
                next_forward[s][local] += 1;
                held[s] += 1;
                orders[s].push(Action::new(Step::Forward, j as u32, local as u32));
            }
            _ => {
                let j = next_backward[s][local];
                let global = map.global(s as u32, local as u32) as usize;
                clock[s] = when + cost(global, 1);
                backward_end[j * chunks + global] = Some(clock[s]);
                next_backward[s][local] += 1;
                pending[s].push_back((j as u32, local as u32));
                orders[s].push(Action::new(Step::BackwardInput, j as u32, local as u32));
            }
        }
    }
    let makespan = clock.into_iter().max().unwrap_or(0);
    (orders, makespan)
}

/// DualPipe on rank `stage` of `stages` (even) with `micro_batches` (even, at least `2
/// stages`): the eight steps of deepseek-ai/DualPipe's `DualPipe.step` (@3da1bbe), with `h` the
/// rank's distance from the nearer end, `n = micro_batches / 2` micro-batches each way, and
/// "near" the direction fed from that end (chunk 0 on the first half of the ranks, chunk 1 on
/// the second), "far" the other:
/// 1. `(p/2 - h - 1) 2` near forwards;
/// 2. `h + 1` pairs of a near and a far forward;
/// 3. `p/2 - h - 1` times: a far B (its W queued), the oldest queued W, a far forward;
/// 4. `n - p + h + 1` times: a near forward with a far (whole) backward, then a far forward
///    with a near backward, each pair one unit ([`Action::with_next`]). The reference runs the
///    middle ranks' first pair apart and holds back their last step-2 send, which shortens the
///    bubble below table 2's; here every pair is one, as in the report's figure 5 and table 2;
/// 5. `p/2 - h - 1` times: a far backward, then a far forward with a near backward;
/// 6. `h + 1` times a far then a near backward, whole until half-way, then B only (W queued);
/// 7. `p/2 - h - 1` times: the oldest W, a near B;
/// 8. the `h + 1` W passes left.
///
/// Micro-batches are numbered from 0 in each direction: chunk 0's and chunk 1's are
/// different micro-batches.
pub fn dual_pipe(stages: u32, stage: u32, micro_batches: u32) -> Vec<Action> {
    let half_ranks = stages / 2;
    let h = stage.min(stages - 1 - stage);
    let n = micro_batches / 2;
    let second = u32::from(stage >= half_ranks);
    let mut plan =
        DualPipeOrder { order: Vec::with_capacity(3 * micro_batches as usize), ..Default::default() };
    let (near, far) = (second, 1 - second);
    let rest = half_ranks - h - 1;
    for _ in 0..2 * rest {
        plan.forward(near);
    }
    for _ in 0..=h {
        plan.forward(near);
        plan.forward(far);
    }
    for _ in 0..rest {
        plan.backward(far, true);
        plan.weight();
        plan.forward(far);
    }
    for _ in 0..(n + h + 1).saturating_sub(stages) {
        plan.forward(near);
        plan.pair();
        plan.backward(far, false);
        plan.forward(far);
        plan.pair();
        plan.backward(near, false);
    }
    for _ in 0..rest {
        plan.backward(far, false);
        plan.forward(far);
        plan.pair();
        plan.backward(near, false);
    }
    let mut split = false;
    for i in 0..=h {
        if i == h.div_ceil(2) && h % 2 == 1 {
            split = true;
        }
        plan.backward(far, split);
        if i == h.div_ceil(2) && h % 2 == 0 {
            split = true;
        }
        plan.backward(near, split);
    }
    for _ in 0..rest {
        plan.weight();
        plan.backward(near, true);
    }
    while !plan.weights.is_empty() {
        plan.weight();
    }
    plan.order
}

/// DualPipe's order under construction: per chunk, the next forward and backward micro-batch,
/// and the queue of split-off W passes (first in, first out, as the reference's
/// `WeightGradStore`).
#[derive(Default)]
struct DualPipeOrder {
    order: Vec<Action>,
    forwards: [u32; 2],
    backwards: [u32; 2],
    weights: std::collections::VecDeque<(u32, u32)>,
}

impl DualPipeOrder {
    fn forward(&mut self, chunk: u32) {
        let micro = &mut self.forwards[chunk as usize];
        self.order.push(Action::new(Step::Forward, *micro, chunk));
        *micro += 1;
    }

    /// A backward of `chunk`: only its B when `split` (the W queued), else whole.
    fn backward(&mut self, chunk: u32, split: bool) {
        let micro = &mut self.backwards[chunk as usize];
        let step = if split { Step::BackwardInput } else { Step::Backward };
        self.order.push(Action::new(step, *micro, chunk));
        if split {
            self.weights.push_back((*micro, chunk));
        }
        *micro += 1;
    }

    fn weight(&mut self) {
        if let Some((micro, chunk)) = self.weights.pop_front() {
            self.order.push(Action::new(Step::BackwardWeight, micro, chunk));
        }
    }

    /// Marks the last action as running with the next.
    fn pair(&mut self) {
        if let Some(last) = self.order.last_mut() {
            last.with_next = true;
        }
    }
}

/// How a schedule places the global model chunks (`pipeline x virtual-stages` of them) on
/// stages, and the path a micro-batch takes through them: the one map the plan, the emitter
/// and the memory model use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkMap {
    placement: Placement,
    stages: u32,
    chunks: u32,
}

/// Where the chunks sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// Chunk `k` on stage `k mod p` (Megatron-LM's interleaved layout; one chunk per stage
    /// without virtual stages).
    Looped,
    /// Chunk `k < p` on stage `k`, chunk `k >= p` on stage `2p - 1 - k` (ZB-V).
    V,
    /// Two model copies of `p` chunks each: chunks `0..p` (the first copy, fed from stage 0)
    /// on stages `0..p`, chunk `p + k` (the second copy's stage `k`, fed from stage `p - 1`)
    /// on stage `p - 1 - k` (DualPipe).
    Mirrored,
}

impl ChunkMap {
    /// The placement of `schedule` on `stages` stages of `virtual_stages` chunks each.
    pub fn new(schedule: PipelineSchedule, stages: u32, virtual_stages: u32) -> ChunkMap {
        let placement = match schedule {
            PipelineSchedule::ZbV => Placement::V,
            PipelineSchedule::DualPipe => Placement::Mirrored,
            _ => Placement::Looped,
        };
        ChunkMap { placement, stages: stages.max(1), chunks: stages.max(1) * virtual_stages.max(1) }
    }

    /// The global chunks.
    pub const fn chunks(&self) -> u32 {
        self.chunks
    }

    /// The global index of stage `stage`'s chunk `local`.
    pub const fn global(&self, stage: u32, local: u32) -> u32 {
        match self.placement {
            Placement::Looped => local * self.stages + stage,
            Placement::V | Placement::Mirrored => {
                if local == 0 {
                    stage
                } else {
                    2 * self.stages - 1 - stage
                }
            }
        }
    }

    /// The stage that holds global chunk `chunk`.
    pub const fn stage_of(&self, chunk: u32) -> u32 {
        match self.placement {
            Placement::Looped => chunk % self.stages,
            Placement::V | Placement::Mirrored => {
                if chunk < self.stages {
                    chunk
                } else {
                    2 * self.stages - 1 - chunk
                }
            }
        }
    }

    /// The global chunks stage `stage` holds, in the order of its local chunks.
    pub fn chunks_of(&self, stage: u32) -> impl Iterator<Item = usize> + use<> {
        let map = *self;
        (0..self.chunks / self.stages).map(move |local| map.global(stage, local) as usize)
    }

    /// The chunk a micro-batch's forward runs after `chunk`, if any.
    pub const fn next(&self, chunk: u32) -> Option<u32> {
        if chunk + 1 >= self.chunks
            || (matches!(self.placement, Placement::Mirrored) && chunk + 1 == self.stages)
        {
            None
        } else {
            Some(chunk + 1)
        }
    }

    /// The chunk a micro-batch's forward runs before `chunk`, if any.
    pub const fn previous(&self, chunk: u32) -> Option<u32> {
        if chunk == 0 || (matches!(self.placement, Placement::Mirrored) && chunk == self.stages) {
            None
        } else {
            Some(chunk - 1)
        }
    }

    /// How many distinct layer groups the model is split into: the chunks, or under DualPipe
    /// the `p` stages of one copy.
    pub const fn partitions(&self) -> u32 {
        match self.placement {
            Placement::Mirrored => self.stages,
            _ => self.chunks,
        }
    }

    /// How many of a stage's chunks one micro-batch passes through: all of them, or under
    /// DualPipe one (a micro-batch takes one copy's path).
    pub const fn chunks_per_micro_batch(&self) -> u32 {
        match self.placement {
            Placement::Mirrored => 1,
            _ => self.chunks / self.stages,
        }
    }

    /// The layer group (of [`ChunkMap::partitions`]) global chunk `chunk` runs.
    pub const fn partition_of(&self, chunk: u32) -> u32 {
        chunk % self.partitions()
    }

    /// The micro-batches each path (model copy) carries of `micro_batches`: half each way
    /// under DualPipe.
    pub const fn path_micro_batches(&self, micro_batches: u32) -> u32 {
        match self.placement {
            Placement::Mirrored => micro_batches / 2,
            _ => micro_batches,
        }
    }

    /// Whether the stage that computes a path's loss also holds that path's input embedding
    /// (the first and the last chunk on one stage, or each end holding the other copy's
    /// embedding): then a tied output layer needs no copy of its own.
    pub const fn ends_share_a_stage(&self) -> bool {
        !matches!(self.placement, Placement::Looped) || self.stages == 1
    }
}

/// Why a schedule cannot run: a message naming what would be valid. `group` is
/// `parallelism.microbatch-group-size` if set (Megatron's default: `stages`).
pub fn check_schedule(
    schedule: PipelineSchedule,
    stages: u32,
    chunks: u32,
    group: Option<u32>,
    micro_batches: u32,
) -> Result<(), String> {
    if schedule.two_chunks() {
        return check_two_chunks(schedule, stages, chunks, group, micro_batches);
    }
    if chunks > 1 {
        if schedule != PipelineSchedule::OneFOneB {
            return Err(format!(
                "virtual-stages = {chunks} needs schedule = \"1f1b\" (interleaved 1F1B); {:?} runs one \
                 chunk per stage",
                schedule.name()
            ));
        }
        if stages < 2 {
            return Err("virtual-stages > 1 needs pipeline > 1".into());
        }
        let m = micro_batches;
        match group {
            // Megatron's own checks (forward_backward_pipelining_with_interleaving).
            Some(g) => {
                if g < stages || g > m {
                    return Err(format!(
                        "microbatch-group-size = {g}: interleaved 1F1B needs a group size between \
                         `pipeline` = {stages} and the micro-batches per replica = {m}"
                    ));
                }
                if m % g != 0 && m % g < stages {
                    return Err(format!(
                        "microbatch-group-size = {g} leaves a last group of {} micro-batches (of {m}): \
                         it must be 0 or at least `pipeline` = {stages}",
                        m % g
                    ));
                }
            }
            None => {
                if m % stages != 0 {
                    return Err(format!(
                        "interleaved 1F1B runs micro-batches in groups of `pipeline` = {stages}, but there \
                         are {m} micro-batches: make global-batch / (micro-batch x data) a multiple of \
                         {stages}"
                    ));
                }
            }
        }
    } else if let Some(g) = group {
        return Err(format!(
            "microbatch-group-size = {g} applies to interleaved 1F1B only (virtual-stages > 1)"
        ));
    }
    Ok(())
}

/// [`check_schedule`] for ZB-V and DualPipe: two chunks per stage; DualPipe mirrors the
/// reference's asserts (`DualPipe.step`: `num_ranks % 2 == 0`, `num_chunks % 2 == 0 and
/// num_chunks >= num_ranks * 2`).
fn check_two_chunks(
    schedule: PipelineSchedule,
    stages: u32,
    chunks: u32,
    group: Option<u32>,
    micro_batches: u32,
) -> Result<(), String> {
    let name = schedule.name();
    if chunks != 2 {
        return Err(format!(
            "schedule = {name:?} runs two model chunks per stage: set virtual-stages = 2 (it is {chunks})"
        ));
    }
    if stages < 2 {
        return Err(format!("schedule = {name:?} needs pipeline > 1"));
    }
    if let Some(g) = group {
        return Err(format!("microbatch-group-size = {g} applies to interleaved 1F1B only, not {name:?}"));
    }
    if schedule == PipelineSchedule::DualPipe {
        if stages % 2 != 0 {
            return Err(format!(
                "schedule = \"dualpipe\" pairs rank s with rank pipeline - 1 - s: it needs an even pipeline \
                 degree (it is {stages})"
            ));
        }
        let m = micro_batches;
        if m % 2 != 0 || m < 2 * stages {
            return Err(format!(
                "schedule = \"dualpipe\" feeds half the micro-batches from each end: it needs an even number \
                 of micro-batches per replica, at least 2 x pipeline = {}; there are {m} (global-batch / \
                 (micro-batch x data))",
                2 * stages
            ));
        }
    }
    Ok(())
}

/// The most chunk-micro-batches whose activations a stage holds at once under `actions`
/// (forwards done whose backward, or weight-gradient pass, is not), weighted by
/// `weight[chunk]`.
pub fn peak_in_flight(actions: &[Action], weight: &[u64]) -> u64 {
    let mut live = 0u64;
    let mut peak = 0u64;
    for action in actions {
        let w = weight.get(action.chunk as usize).copied().unwrap_or(0);
        match action.step {
            Step::Forward => {
                live += w;
                peak = peak.max(live);
            }
            // A split backward frees the activations with its weight-gradient pass, the last
            // to read them (Qi et al.'s table 1 frees most with B: this is the upper bound).
            Step::Backward | Step::BackwardWeight => live = live.saturating_sub(w),
            Step::BackwardInput => {}
        }
    }
    peak
}

/// The number of units (numbered blocks) in each of the `stages x virtual` model chunks, in
/// model order, under the zero-bubble repository's `--allow-padding-num-layers`
/// (sail-sg/zero-bubble-pipeline-parallelism @ 39f2c186: `megatron/training/arguments.py` pads
/// the layers up to a multiple of the pipeline degree; `megatron/legacy/model/transformer.py`,
/// `ParallelTransformer.get_offset`, splits the padded count evenly over the chunks and takes
/// one layer off chunks -1, 0, 1, ... for each layer of padding). A chunk may hold no block
/// only at either end (the embedding or the output layer alone; the repository runs a no-op
/// layer there).
pub fn padded_sizes(units: usize, stages: usize, virtual_stages: usize) -> Result<Vec<usize>, String> {
    if stages < 2 {
        return Err("padding the layers needs pipeline > 1".into());
    }
    let padded = units.div_ceil(stages) * stages;
    let per_stage = padded / stages;
    if per_stage % virtual_stages != 0 {
        return Err(format!(
            "the {units} blocks padded to {padded} give {per_stage} per stage, which {virtual_stages} virtual \
             stages do not split evenly (the repository's assertion): choose virtual-stages dividing {per_stage}"
        ));
    }
    let chunks = stages * virtual_stages;
    let mut sizes = vec![per_stage / virtual_stages; chunks];
    // range(-1, padding - 1): the last chunk, then the first, the second, ...
    for step in 0..padded - units {
        let chunk = if step == 0 { chunks - 1 } else { step - 1 };
        sizes[chunk] = sizes[chunk].checked_sub(1).ok_or_else(|| {
            format!("{} blocks of padding leave chunk {chunk} of {chunks} less than empty", padded - units)
        })?;
    }
    if let Some(empty) = sizes[1..chunks - 1].iter().position(|&size| size == 0) {
        return Err(format!(
            "the {units} blocks padded to {padded} leave chunk {} of {chunks} with no block (only the first \
             and last chunks, beside the embedding and the output layer, may be empty): use fewer virtual \
             stages or a pipeline degree closer to a divisor of {units}",
            empty + 1
        ));
    }
    Ok(sizes)
}

/// The number of units (numbered blocks) in each of the `stages x virtual_stages` model chunks,
/// in model order, when Megatron-Core counts the embedding (`embedding`,
/// `--account-for-embedding-in-pipeline-split`) and the loss (`loss`,
/// `--account-for-loss-in-pipeline-split`) as one layer each of the split
/// (NVIDIA/Megatron-LM @ d98e8a64dd : megatron/core/transformer/transformer_block.py,
/// `get_num_layers_to_build`): the blocks plus the counted ones must divide evenly over the
/// stages, and each stage's share over its virtual stages; every chunk gets that share, and
/// the first chunk (stage 0's first virtual stage) builds one block fewer for the embedding,
/// the last (the last stage's last virtual stage) one fewer for the loss.
pub fn accounted_sizes(
    units: usize,
    stages: usize,
    virtual_stages: usize,
    embedding: bool,
    loss: bool,
) -> Result<Vec<usize>, String> {
    if stages < 2 {
        return Err("counting the embedding or the loss in the pipeline split needs pipeline > 1".into());
    }
    let counted = units + usize::from(embedding) + usize::from(loss);
    let what = match (embedding, loss) {
        (true, true) => "the embedding and the loss",
        (true, false) => "the embedding",
        _ => "the loss",
    };
    if counted % stages != 0 {
        return Err(format!(
            "{units} blocks and {what} make {counted} layers, which {stages} stages do not split evenly \
             (Megatron-Core's assertion): the pipeline degree must divide {counted}"
        ));
    }
    let per_stage = counted / stages;
    if per_stage % virtual_stages.max(1) != 0 {
        return Err(format!(
            "{counted} layers over {stages} stages give {per_stage} per stage, which {virtual_stages} virtual \
             stages do not split evenly (Megatron-Core's assertion): choose virtual-stages dividing {per_stage}"
        ));
    }
    let per_chunk = per_stage / virtual_stages.max(1);
    let chunks = stages * virtual_stages.max(1);
    let mut sizes = vec![per_chunk; chunks];
    for (counted_here, chunk, name) in [(embedding, 0, "first"), (loss, chunks - 1, "last")] {
        if counted_here {
            sizes[chunk] = sizes[chunk].checked_sub(1).ok_or_else(|| {
                format!("not enough layers in the {name} virtual pipeline stage (Megatron-Core's assertion)")
            })?;
        }
    }
    Ok(sizes)
}

/// The layer ranges of chunks holding `sizes` units (numbered blocks) each, in model order:
/// the stem goes with the first chunk and the head with the last, also when that chunk holds
/// no block (then it holds the stem or the head alone).
pub fn chunk_ranges(model: &workloads::model::Model, sizes: &[usize]) -> Vec<Range<usize>> {
    let units = model.pipeline_units();
    let layers = model.layers.len();
    let blocks = model.blocks();
    // Where the first block starts and the last ends (the stem before, the head after).
    let first_block = blocks.iter().position(Option::is_some).unwrap_or(0);
    let last_block = blocks.iter().rposition(Option::is_some).map_or(layers, |last| last + 1);
    let mut bounds = Vec::with_capacity(sizes.len() + 1);
    bounds.push(0);
    let mut before = 0;
    for &size in &sizes[..sizes.len().saturating_sub(1)] {
        before += size;
        bounds.push(match before {
            0 => first_block,
            k if k >= units.len() => last_block,
            k => units[k].start,
        });
    }
    bounds.push(layers);
    bounds.windows(2).map(|w| w[0]..w[1]).collect()
}

/// The number of units (numbered blocks) on each of `stages` stages when the first and last
/// stage's counts are set: Megatron-Core's uneven split (`--decoder-first-pipeline-num-layers`,
/// `--decoder-last-pipeline-num-layers`; `TransformerConfig.__post_init__`'s checks at
/// d98e8a64dd): the set counts at least 1, the units left spread evenly over the other stages,
/// which must exist exactly when units are left. `None` when neither is set.
pub fn uneven_sizes(
    units: usize,
    stages: usize,
    first: Option<u32>,
    last: Option<u32>,
) -> Result<Option<Vec<usize>>, String> {
    if first.is_none() && last.is_none() {
        return Ok(None);
    }
    if stages < 2 {
        return Err("an uneven first or last stage needs pipeline > 1".into());
    }
    let mut left = units;
    let mut middle = stages;
    for (name, count) in [("first-stage-layers", first), ("last-stage-layers", last)] {
        let Some(count) = count else { continue };
        if count == 0 {
            return Err(format!("{name} must be at least 1, got 0"));
        }
        left = left.checked_sub(count as usize).ok_or_else(|| {
            format!(
                "first-stage-layers + last-stage-layers = {} is more than the model's {units} blocks",
                first.unwrap_or(0) + last.unwrap_or(0)
            )
        })?;
        middle = middle.saturating_sub(1);
    }
    if (left > 0) != (middle > 0) || (middle > 0 && left % middle != 0) {
        return Err(format!(
            "{left} blocks are left for the {middle} other stage(s) of {stages}: they must split evenly, \
             and there must be blocks for every stage (Megatron-Core's uneven pipeline split)"
        ));
    }
    let mut sizes = vec![left.checked_div(middle).unwrap_or(0); stages];
    if let Some(count) = first {
        sizes[0] = count as usize;
    }
    if let Some(count) = last {
        sizes[stages - 1] = count as usize;
    }
    Ok(Some(sizes))
}

/// Splits `units` (each a contiguous range of layers with a cost) into `parts` contiguous
/// groups: evenly when the count divides (Megatron-LM's default split), else so that the most
/// expensive group is as cheap as possible (Megatron-Core balances an uneven split by counting
/// the embedding and the output layer as layers); ties give earlier groups more units. Returns
/// the unit ranges of each group. `parts` must be between 1 and `units.len()`.
pub fn partition(costs: &[f64], parts: usize) -> Vec<Range<usize>> {
    let n = costs.len();
    if n % parts == 0 {
        let per = n / parts;
        return (0..parts).map(|k| k * per..(k + 1) * per).collect();
    }
    let prefix: Vec<f64> = std::iter::once(0.0)
        .chain(costs.iter().scan(0.0, |sum, c| {
            *sum += c;
            Some(*sum)
        }))
        .collect();
    let cost = |a: usize, b: usize| prefix[b] - prefix[a];
    // best[k][i]: the smallest maximum over splits of units i.. into k groups.
    let mut best = vec![vec![f64::INFINITY; n + 1]; parts + 1];
    best[0][n] = 0.0;
    for k in 1..=parts {
        for i in (0..n).rev() {
            let rest = &best[k - 1];
            best[k][i] = (i + 1..=n - (k - 1)).map(|j| cost(i, j).max(rest[j])).fold(f64::INFINITY, f64::min);
        }
    }
    let limit = best[parts][0] * (1.0 + 1e-12);
    let mut groups = Vec::with_capacity(parts);
    let mut start = 0;
    for k in (1..=parts).rev() {
        // The longest group that keeps the rest feasible under the optimum.
        let mut end = start + 1;
        for j in (start + 1..=n - (k - 1)).rev() {
            if cost(start, j) <= limit && best[k - 1][j] <= limit {
                end = j;
                break;
            }
        }
        groups.push(start..end);
        start = end;
    }
    groups
}

/// Splits units into `costs.len()` contiguous groups where group `k` costs `costs[k][u]` for
/// unit `u` (each part priced on its own device): the split whose most expensive group is as
/// cheap as possible; of equal splits, the first found with the shortest groups first. Every
/// `costs[k]` has one entry per unit, and there are at least as many units as parts.
pub fn partition_per_part(costs: &[Vec<f64>]) -> Vec<Range<usize>> {
    let parts = costs.len();
    let n = costs.first().map_or(0, Vec::len);
    if parts <= 1 || n < parts {
        return if n == 0 { Vec::new() } else { std::iter::once(0..n).collect() };
    }
    let prefix: Vec<Vec<f64>> = costs
        .iter()
        .map(|part| {
            std::iter::once(0.0)
                .chain(part.iter().scan(0.0, |sum, c| {
                    *sum += c;
                    Some(*sum)
                }))
                .collect()
        })
        .collect();
    let cost = |k: usize, a: usize, b: usize| prefix[k][b] - prefix[k][a];
    // best[k][i]: the smallest maximum over splits of units i.. into parts k..; choice[k][i]
    // the end of part k's group in it.
    let mut best = vec![vec![f64::INFINITY; n + 1]; parts + 1];
    let mut choice = vec![vec![n; n + 1]; parts + 1];
    best[parts][n] = 0.0;
    for k in (0..parts).rev() {
        let left = parts - 1 - k;
        for i in 0..n {
            for j in i + 1..=n.saturating_sub(left) {
                let value = cost(k, i, j).max(best[k + 1][j]);
                if value < best[k][i] {
                    best[k][i] = value;
                    choice[k][i] = j;
                }
            }
        }
    }
    let mut groups = Vec::with_capacity(parts);
    let mut start = 0;
    for row in choice.iter().take(parts) {
        let end = row[start];
        groups.push(start..end);
        start = end;
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_on_a_slower_device_gets_fewer_units() {
        // Eight equal units; part 0 runs them at a third of part 1's speed: 2 and 6 units
        // (costs 6 and 6) beat 1 and 7 (3 and 7) and 3 and 5 (9 and 5), and 4 and 4 (12, 4).
        let costs = vec![vec![3.0; 8], vec![1.0; 8]];
        assert_eq!(partition_per_part(&costs), vec![0..2, 2..8]);
        // Equal speeds: the even split.
        assert_eq!(partition_per_part(&[vec![1.0; 8], vec![1.0; 8]]), vec![0..4, 4..8]);
        // Every part gets a unit, however slow.
        assert_eq!(partition_per_part(&[vec![100.0; 3], vec![1.0; 3], vec![1.0; 3]]), vec![0..1, 1..2, 2..3]);
    }

    fn counts(actions: &[Action]) -> (usize, usize) {
        let forwards = actions.iter().filter(|a| a.is_forward()).count();
        (forwards, actions.len() - forwards)
    }

    #[test]
    fn one_f_one_b_warms_up_by_the_distance_to_the_last_stage() {
        let first = actions(PipelineSchedule::OneFOneB, 4, 1, 4, 0, 8);
        assert_eq!(counts(&first), (8, 8));
        assert!(first[..3].iter().all(Action::is_forward) && first[3].is_forward() && !first[4].is_forward());
        let last = actions(PipelineSchedule::OneFOneB, 4, 1, 4, 3, 8);
        assert!(last.chunks(2).all(|pair| pair[0].is_forward() && pair[1].is_backward()));
        // Peak in flight: p on the first stage, 1 on the last.
        assert_eq!(peak_in_flight(&first, &[1]), 4);
        assert_eq!(peak_in_flight(&last, &[1]), 1);
        assert_eq!(peak_in_flight(&actions(PipelineSchedule::GPipe, 4, 1, 4, 0, 8), &[1]), 8);
    }

    #[test]
    fn interleaved_runs_every_chunk_of_every_micro_batch_once_in_megatron_order() {
        let (p, v, m) = (4, 2, 8);
        for stage in 0..p {
            let order = actions(PipelineSchedule::OneFOneB, p, v, p, stage, m);
            assert_eq!(counts(&order), ((m * v) as usize, (m * v) as usize));
            let mut seen = std::collections::BTreeSet::new();
            for a in &order {
                assert!(seen.insert((a.is_forward(), a.micro_batch, a.chunk)), "{a:?} twice");
            }
            // Chunk 0 of micro-batches 0..p first, then chunk 1 of the same micro-batches.
            let firsts: Vec<(u32, u32)> =
                order.iter().take(8).filter(|a| a.is_forward()).map(|a| (a.micro_batch, a.chunk)).collect();
            if stage == 0 {
                assert_eq!(&firsts[..5], &[(0, 0), (1, 0), (2, 0), (3, 0), (0, 1)]);
            }
            // A backward of a chunk comes after its forward.
            for (i, a) in order.iter().enumerate().filter(|(_, a)| !a.is_forward()) {
                assert!(
                    order[..i]
                        .iter()
                        .any(|f| f.is_forward() && f.micro_batch == a.micro_batch && f.chunk == a.chunk)
                );
            }
        }
    }

    #[test]
    fn schedules_that_cannot_run_say_why() {
        assert!(check_schedule(PipelineSchedule::GPipe, 4, 2, None, 8).unwrap_err().contains("1f1b"));
        assert!(check_schedule(PipelineSchedule::ZbH1, 4, 2, None, 8).unwrap_err().contains("1f1b"));
        assert!(
            check_schedule(PipelineSchedule::OneFOneB, 4, 2, None, 6).unwrap_err().contains("multiple of 4")
        );
        assert!(check_schedule(PipelineSchedule::OneFOneB, 4, 2, None, 8).is_ok());
        assert!("pipedream".parse::<PipelineSchedule>().unwrap_err().contains("zb-h1"));
        // Megatron's checks on --microbatch-group-size-per-virtual-pipeline-stage: a group
        // between p and m, and a last group of 0 or at least p.
        let group = |g, m| check_schedule(PipelineSchedule::OneFOneB, 4, 2, Some(g), m);
        assert!(group(3, 8).unwrap_err().contains("between `pipeline` = 4 and"));
        assert!(group(9, 8).unwrap_err().contains("between"));
        assert!(group(5, 6).unwrap_err().contains("last group of 1"));
        assert!(group(6, 6).is_ok() && group(5, 10).is_ok() && group(5, 9).is_ok() && group(4, 6).is_err());
        let flat = check_schedule(PipelineSchedule::OneFOneB, 4, 1, Some(4), 8);
        assert!(flat.unwrap_err().contains("interleaved 1F1B only"));
    }

    fn pairs(order: &[Action], step: Step) -> Vec<(u32, u32)> {
        order.iter().filter(|a| a.step == step).map(|a| (a.micro_batch, a.chunk)).collect()
    }

    /// The order of (step, micro-batch, chunk) as `F`/`B` strings: `"F0.1"` is micro-batch 0's
    /// forward through chunk 1.
    fn written(order: &[Action]) -> Vec<String> {
        order
            .iter()
            .map(|a| {
                let step = match a.step {
                    Step::Forward => "F",
                    Step::Backward | Step::BackwardInput => "B",
                    Step::BackwardWeight => "W",
                };
                format!("{step}{}.{}", a.micro_batch, a.chunk)
            })
            .collect()
    }

    #[test]
    fn tunable_groups_follow_megatron_schedule_table() {
        // get_schedule_table(5, 2, 3) (schedules.py @ d98e8a6): groups start at 0 and 3; 0 + 3 <
        // 5, so the first is micro-batches 0..3 through chunk 0 then chunk 1; 3 + 3 >= 5, so the
        // last takes 3..5: the docstring's PP2 N3M5 VP2 table
        // micro 0 1 2 0 1 2 3 4 3 4 / chunk 0 0 0 1 1 1 0 0 1 1.
        let table = schedule_table(5, 2, 3);
        let micro: Vec<u32> = table.iter().map(|t| t.0).collect();
        let chunk: Vec<u32> = table.iter().map(|t| t.1).collect();
        assert_eq!(micro, [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]);
        assert_eq!(chunk, [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]);
        // p = 2, v = 2, m = 5, g = 3. get_pp_rank_microbatches: warm-up (p - s - 1) 2 + (v - 1) g,
        // rank 0: 2 + 3 = 5 of 10, rank 1: 0 + 3 = 3. The forwards run table[k] in order; the
        // steady phase pairs forward k = warm-up + i with backward i, whose chunk is v - 1 -
        // table[i].chunk (get_model_chunk_id(forward=False)) on micro-batch table[i].micro
        // (input_tensors[chunk] popped in order); the cool-down runs the backwards left.
        // Rank 0: F table[0..5] = 0.0 1.0 2.0 0.1 1.1; then F table[5] = 2.1 with B table[0] = 0.0
        // -> 0.1, F 3.0 with B 1.1, F 4.0 with B 2.1, F 3.1 with B (0.1 ->) 0.0, F 4.1 with B 1.0;
        // then B table[5..10] = 2.1 3.0 4.0 3.1 4.1 mirrored: 2.0 3.1 4.1 3.0 4.0.
        let rank0 = "F0.0 F1.0 F2.0 F0.1 F1.1 F2.1 B0.1 F3.0 B1.1 F4.0 B2.1 F3.1 B0.0 F4.1 B1.0 \
                     B2.0 B3.1 B4.1 B3.0 B4.0";
        assert_eq!(written(&actions(PipelineSchedule::OneFOneB, 2, 2, 3, 0, 5)).join(" "), rank0);
        // Rank 1: F 0.0 1.0 2.0; then F table[3..10] paired with B table[0..7] mirrored: F0.1 B0.1,
        // F1.1 B1.1, F2.1 B2.1, F3.0 B0.0, F4.0 B1.0, F3.1 B2.0, F4.1 B3.1; then B table[7..10]
        // = 4.0 3.1 4.1 mirrored: 4.1 3.0 4.0.
        let rank1 = "F0.0 F1.0 F2.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.0 B0.0 F4.0 B1.0 F3.1 B2.0 \
                     F4.1 B3.1 B4.1 B3.0 B4.0";
        assert_eq!(written(&actions(PipelineSchedule::OneFOneB, 2, 2, 3, 1, 5)).join(" "), rank1);
        // megatron-ci's tunable-overlap test: p = 4, v = 3, m = 5, g = 5: one group (0 + 5 >= 5)
        // 0..5 through chunks 0, 1, 2. Rank 0 warms up 3 2 + 2 5 = 16 >= 15: every forward, then
        // every backward, chunks mirrored (2, 1, 0). Rank 3 warms up 0 + 10: chunks 0 and 1, then
        // F 0.2 B 0.2 ... F 4.2 B 4.2, then B of chunk 1 and chunk 0.
        let stage0 = actions(PipelineSchedule::OneFOneB, 4, 3, 5, 0, 5);
        let all: Vec<(u32, u32)> = (0..3).flat_map(|c| (0..5).map(move |mb| (mb, c))).collect();
        assert_eq!(pairs(&stage0, Step::Forward), all);
        assert!(stage0[..15].iter().all(Action::is_forward));
        let mirrored: Vec<(u32, u32)> = all.iter().map(|&(mb, c)| (mb, 2 - c)).collect();
        assert_eq!(pairs(&stage0, Step::Backward), mirrored);
        let stage3 = written(&actions(PipelineSchedule::OneFOneB, 4, 3, 5, 3, 5));
        let mut expected: Vec<String> =
            (0..2).flat_map(|c| (0..5).map(move |mb| format!("F{mb}.{c}"))).collect();
        expected.extend((0..5).flat_map(|mb| [format!("F{mb}.2"), format!("B{mb}.2")]));
        expected.extend((0..2).rev().flat_map(|c| (0..5).map(move |mb| format!("B{mb}.{c}"))));
        assert_eq!(stage3, expected);
    }

    #[test]
    fn the_default_group_is_the_pipeline_degree_and_keeps_the_old_order() {
        // Megatron before the tunable groups, for m a multiple of p: virtual micro-batch k is
        // micro-batch (k / pv) p + k % p through chunk (k % pv) / p; backwards mirror the chunk;
        // warm-up (p - s - 1) 2 + (v - 1) p, or everything when m = p.
        for (p, v, m) in [(2u32, 2u32, 4u32), (4, 2, 8), (4, 3, 12), (4, 2, 4), (3, 4, 9), (8, 2, 24)] {
            for stage in 0..p {
                let group = p * v;
                let micro = |k: u32| (k / group) * p + k % p;
                let total = m * v;
                let warmup = if m == p { total } else { ((p - stage - 1) * 2 + (v - 1) * p).min(total) };
                let f = |k: u32| Action::new(Step::Forward, micro(k), (k % group) / p);
                let b = |k: u32| Action::new(Step::Backward, micro(k), v - 1 - (k % group) / p);
                let mut old: Vec<Action> = (0..warmup).map(f).collect();
                for i in 0..total - warmup {
                    old.extend([f(warmup + i), b(i)]);
                }
                old.extend((total - warmup..total).map(b));
                assert_eq!(actions(PipelineSchedule::OneFOneB, p, v, p, stage, m), old, "p={p} v={v} m={m}");
                assert!(check_schedule(PipelineSchedule::OneFOneB, p, v, None, m).is_ok());
            }
        }
    }

    /// Runs each stage's `orders` with unit-free step times `t = [F, B, W]` (a whole backward
    /// is B + W) on an instant network: a forward waits for the previous stage's forward of its
    /// micro-batch, a backward (or B) for the next stage's; returns the makespan.
    fn makespan(orders: &[Vec<Action>], t: [u64; 3]) -> u64 {
        let p = orders.len();
        let mut clock = vec![0u64; p];
        let mut next = vec![0usize; p];
        let mut forward_end = std::collections::BTreeMap::new();
        let mut backward_end = std::collections::BTreeMap::new();
        while (0..p).any(|s| next[s] < orders[s].len()) {
            let mut progressed = false;
            for s in 0..p {
                let Some(a) = orders[s].get(next[s]) else { continue };
                let (ready, duration) = match a.step {
                    Step::Forward if s == 0 => (Some(0), t[0]),
                    Step::Forward => (forward_end.get(&(s - 1, a.micro_batch)).copied(), t[0]),
                    Step::Backward | Step::BackwardInput => {
                        let ready = if s + 1 == p {
                            Some(0)
                        } else {
                            backward_end.get(&(s + 1, a.micro_batch)).copied()
                        };
                        (ready, if a.step == Step::Backward { t[1] + t[2] } else { t[1] })
                    }
                    Step::BackwardWeight => (Some(0), t[2]),
                };
                let Some(ready) = ready else { continue };
                clock[s] = clock[s].max(ready) + duration;
                match a.step {
                    Step::Forward => forward_end.insert((s, a.micro_batch), clock[s]),
                    Step::Backward | Step::BackwardInput => backward_end.insert((s, a.micro_batch), clock[s]),
                    Step::BackwardWeight => None,
                };
                next[s] += 1;
                progressed = true;
            }
            assert!(progressed, "the schedule deadlocks");
        }
        clock.into_iter().max().unwrap_or(0)
    }

    #[test]
    fn zb_h1_cuts_the_bubble_to_the_papers_closed_form_at_1f1b_memory() {
        // Qi et al. 2024, table 3: on p stages the bubble is (p - 1)(T_F + T_B + T_W) under
        // 1F1B and (p - 1)(T_F + T_B - T_W) under ZB-H1, each stage computing m (T_F + T_B +
        // T_W); the handcrafted schedule reaches it while T_W is no longer than T_F and T_B
        // (figure 3's equal times among them).
        for t in [[1, 1, 1], [2, 3, 1], [3, 2, 1], [5, 4, 3]] {
            let [f, b, w] = t;
            for p in [2u32, 4, 8] {
                for m in [p, 2 * p, 3 * p + 1] {
                    let zb: Vec<Vec<Action>> =
                        (0..p).map(|s| actions(PipelineSchedule::ZbH1, p, 1, p, s, m)).collect();
                    let one: Vec<Vec<Action>> =
                        (0..p).map(|s| actions(PipelineSchedule::OneFOneB, p, 1, p, s, m)).collect();
                    let work = u64::from(m) * (f + b + w);
                    let stages = u64::from(p - 1);
                    assert_eq!(makespan(&zb, t) - work, stages * (f + b - w), "zb-h1 t={t:?} p={p} m={m}");
                    assert_eq!(makespan(&one, t) - work, stages * (f + b + w), "1f1b t={t:?} p={p} m={m}");
                    // Memory: every stage holds at most p micro-batches, 1F1B's peak (its first
                    // stage's), with activations freed by W.
                    let peak = |orders: &[Vec<Action>]| orders.iter().map(|o| peak_in_flight(o, &[1])).max();
                    assert_eq!(peak(&zb), peak(&one), "t={t:?} p={p} m={m}");
                    assert_eq!(peak_in_flight(&zb[0], &[1]), peak_in_flight(&one[0], &[1]));
                    // Each stage runs every F, B and W once, B after its F, W after its B.
                    for order in &zb {
                        for mb in 0..m {
                            let at = |step| order.iter().position(|a| a.step == step && a.micro_batch == mb);
                            let (fw, bi, bw) =
                                (at(Step::Forward), at(Step::BackwardInput), at(Step::BackwardWeight));
                            assert!(fw < bi && bi < bw && fw.is_some(), "micro-batch {mb}");
                        }
                        assert_eq!(order.len(), 3 * m as usize);
                    }
                }
            }
        }
    }

    /// Like [`makespan`] for any chunk placement: each stage's `orders` under `map`, step times
    /// `t = [F, B, W]` of one chunk (a whole backward is B + W), an instant network; a pair
    /// ([`Action::with_next`]) starts once both its inputs are there and its outputs count as
    /// sent when both have run (DualPipe's F&B). Returns the makespan.
    fn makespan_on(map: ChunkMap, orders: &[Vec<Action>], t: [u64; 3]) -> u64 {
        let p = orders.len() as u32;
        let mut clock = vec![0u64; p as usize];
        let mut next = vec![0usize; p as usize];
        let mut forward_end = std::collections::BTreeMap::new();
        let mut backward_end = std::collections::BTreeMap::new();
        let ready = |a: &Action,
                     s: u32,
                     f: &std::collections::BTreeMap<(u32, u32), u64>,
                     b: &std::collections::BTreeMap<(u32, u32), u64>| {
            let chunk = map.global(s, a.chunk);
            match a.step {
                Step::Forward => map.previous(chunk).map_or(Some(0), |c| f.get(&(c, a.micro_batch)).copied()),
                Step::Backward | Step::BackwardInput => {
                    map.next(chunk).map_or(Some(0), |c| b.get(&(c, a.micro_batch)).copied())
                }
                Step::BackwardWeight => Some(0),
            }
        };
        let duration = |a: &Action| match a.step {
            Step::Forward => t[0],
            Step::Backward => t[1] + t[2],
            Step::BackwardInput => t[1],
            Step::BackwardWeight => t[2],
        };
        while (0..p as usize).any(|s| next[s] < orders[s].len()) {
            let mut progressed = false;
            for s in 0..p {
                let i = next[s as usize];
                let Some(a) = orders[s as usize].get(i) else { continue };
                let unit: &[Action] =
                    if a.with_next { &orders[s as usize][i..i + 2] } else { &orders[s as usize][i..=i] };
                let waits: Option<Vec<u64>> =
                    unit.iter().map(|a| ready(a, s, &forward_end, &backward_end)).collect();
                let Some(waits) = waits else { continue };
                let start = waits.into_iter().fold(clock[s as usize], u64::max);
                let end = start + unit.iter().map(duration).sum::<u64>();
                let mut at = start;
                for a in unit {
                    at += duration(a);
                    // Within a pair both outputs leave at its end.
                    let done = if unit.len() == 2 { end } else { at };
                    let key = (map.global(s, a.chunk), a.micro_batch);
                    match a.step {
                        Step::Forward => forward_end.insert(key, done),
                        Step::Backward | Step::BackwardInput => backward_end.insert(key, done),
                        Step::BackwardWeight => None,
                    };
                }
                clock[s as usize] = end;
                next[s as usize] += unit.len();
                progressed = true;
            }
            assert!(progressed, "the schedule deadlocks");
        }
        clock.into_iter().max().unwrap_or(0)
    }

    /// Every (micro-batch, chunk) of each stage runs F, then B, then W (or a whole backward),
    /// once each.
    fn check_complete(orders: &[Vec<Action>], micro_batches: u32) {
        for order in orders {
            for chunk in 0..2 {
                for mb in 0..micro_batches {
                    let at = |f: fn(&Action) -> bool| {
                        order.iter().filter(|a| a.chunk == chunk && a.micro_batch == mb && f(a)).count()
                    };
                    assert_eq!(at(|a| a.step == Step::Forward), 1, "F{mb}.{chunk}");
                    let whole = at(|a| a.step == Step::Backward);
                    assert_eq!(whole + at(|a| a.step == Step::BackwardInput), 1, "B{mb}.{chunk}");
                    assert_eq!(whole + at(|a| a.step == Step::BackwardWeight), 1, "W{mb}.{chunk}");
                    let position = |step| {
                        order.iter().position(|a| a.chunk == chunk && a.micro_batch == mb && a.step == step)
                    };
                    let (f, b, w) = (
                        position(Step::Forward),
                        position(Step::BackwardInput),
                        position(Step::BackwardWeight),
                    );
                    if b.is_some() {
                        assert!(f < b && b < w, "F, B, W of {mb}.{chunk} out of order");
                    }
                }
            }
        }
    }

    #[test]
    fn the_v_and_the_mirrored_placements_put_two_chunks_on_each_stage() {
        // ZB-V on 4 stages: stage s holds chunks s and 7 - s; the path is 0..8, the tip (chunks
        // 3 and 4) on stage 3.
        let v = ChunkMap::new(PipelineSchedule::ZbV, 4, 2);
        let held: Vec<Vec<usize>> = (0..4).map(|s| v.chunks_of(s).collect()).collect();
        assert_eq!(held, [vec![0, 7], vec![1, 6], vec![2, 5], vec![3, 4]]);
        assert_eq!((v.next(3), v.next(7), v.previous(4), v.previous(0)), (Some(4), None, Some(3), None));
        assert!((0..8).all(|c| v.global(v.stage_of(c), u32::from(c >= 4)) == c));
        assert_eq!((v.partitions(), v.path_micro_batches(8)), (8, 8));
        // DualPipe: the second copy's chunk 4 + k is stage k of the model on rank 3 - k; two
        // paths, 0..4 and 4..8, over the same 4 layer groups.
        let d = ChunkMap::new(PipelineSchedule::DualPipe, 4, 2);
        assert_eq!((0..4).map(|s| d.chunks_of(s).collect()).collect::<Vec<Vec<usize>>>(), held);
        assert_eq!((d.next(3), d.previous(4), d.next(4), d.previous(7)), (None, None, Some(5), Some(6)));
        assert_eq!((d.partitions(), d.partition_of(6), d.path_micro_batches(8)), (4, 2, 4));
        // The interleaved layout stays k mod p.
        let looped = ChunkMap::new(PipelineSchedule::OneFOneB, 4, 2);
        assert_eq!(looped.chunks_of(1).collect::<Vec<_>>(), [1, 5]);
        assert_eq!((looped.next(3), looped.previous(4)), (Some(4), Some(3)));
        assert!(
            ChunkMap::new(PipelineSchedule::ZbV, 4, 2).ends_share_a_stage() && !looped.ends_share_a_stage()
        );
    }

    #[test]
    fn zb_v_leaves_only_the_tips_wait_at_equal_times_and_holds_1f1b_peak() {
        // Qi et al. 2024 (section 6) and arXiv 2405.15362 (V-ZB): with T_F = T_B = T_W the
        // bubble rate, 1 - m (T_F + T_B + T_W) / (longest stage time, from its first to its last
        // op), is 0 at 1F1B's activation memory. Here a chunk's times are 1 each and each stage
        // runs 2m of every pass: the makespan is that work plus the tip's wait for its first
        // forward, (p - 1) T_F, and no more.
        for p in [2u32, 3, 4, 8] {
            for m in [p, 2 * p, 3 * p + 1, 24] {
                let zb = zb_v_orders(p, m, &vec![[1, 1, 1]; 2 * p as usize]);
                check_complete(&zb, m);
                let map = ChunkMap::new(PipelineSchedule::ZbV, p, 2);
                let work = 2 * u64::from(m) * 3;
                assert_eq!(makespan_on(map, &zb, [1, 1, 1]) - work, u64::from(p - 1), "p={p} m={m}");
                // Memory: chunk activations (half a stage each) held from F to W: 2p at most on
                // every stage, what 1F1B's first stage holds (p micro-batches of a whole stage).
                let one_f_one_b = (0..p)
                    .map(|s| peak_in_flight(&actions(PipelineSchedule::OneFOneB, p, 1, p, s, m), &[2]))
                    .max();
                let peak = zb.iter().map(|o| peak_in_flight(o, &[1, 1])).max();
                assert_eq!(peak, one_f_one_b, "p={p} m={m}");
            }
        }
        // Every stage count and micro-batch count, any times: a complete order that runs
        // (the list schedule never stalls), under the same memory.
        for p in 2u32..=6 {
            for m in 1..=9 {
                for t in [[1u64, 1, 1], [3, 1, 1], [1, 3, 1], [1, 1, 0], [7, 5, 2]] {
                    let zb = zb_v_orders(p, m, &vec![t; 2 * p as usize]);
                    check_complete(&zb, m);
                    let _ = makespan_on(ChunkMap::new(PipelineSchedule::ZbV, p, 2), &zb, t);
                    assert!(zb.iter().all(|o| peak_in_flight(o, &[1, 1]) <= 2 * u64::from(p)), "p={p} m={m}");
                }
            }
        }
        // Uneven times still give a complete order that runs, under the same memory.
        for t in [[2u64, 3, 1], [3, 2, 1], [5, 4, 3]] {
            let zb = zb_v_orders(8, 16, &vec![t; 16]);
            check_complete(&zb, 16);
            let _ = makespan_on(ChunkMap::new(PipelineSchedule::ZbV, 8, 2), &zb, t);
            assert!(zb.iter().all(|o| peak_in_flight(o, &[1, 1]) <= 16));
        }
    }

    #[test]
    fn dualpipe_bubble_is_deepseek_v3_table_2s_at_pp_plus_1_activations() {
        // DeepSeek-V3 report, table 2: DualPipe's bubble is (PP/2 - 1)(F&B + B - 3W) with F, B,
        // W the forward, whole backward (input and weight) and weight-gradient times of one
        // chunk, F&B the time of a forward-and-backward pair; activations PP + 1 (chunks of a
        // whole stage). parasim runs a pair's two passes one after the other: F&B = F + B. The
        // table's form holds while T_F <= T_B(input) (each pair's wait is its backward's).
        for p in [2u32, 4, 6, 8] {
            let map = ChunkMap::new(PipelineSchedule::DualPipe, p, 2);
            for m in [2 * p, 2 * p + 2, 4 * p] {
                let orders: Vec<Vec<Action>> = (0..p).map(|s| dual_pipe(p, s, m)).collect();
                check_complete(&orders, m / 2);
                for t in [[1u64, 1, 1], [2, 3, 1], [4, 4, 1], [3, 5, 2]] {
                    let [f, b, w] = t;
                    let whole = b + w;
                    let table_2 = u64::from(p / 2 - 1) * ((f + whole) + whole - 3 * w);
                    let work = u64::from(m) * (f + b + w);
                    assert_eq!(makespan_on(map, &orders, t) - work, table_2, "p={p} m={m} t={t:?}");
                }
                let peaks: Vec<u64> = orders.iter().map(|o| peak_in_flight(o, &[1, 1])).collect();
                assert!(peaks.iter().all(|&peak| peak == u64::from(p) + 1), "p={p} m={m}: {peaks:?}");
            }
        }
    }

    #[test]
    fn zb_v_and_dualpipe_say_what_they_need() {
        let zb = |chunks, group, m| check_schedule(PipelineSchedule::ZbV, 4, chunks, group, m);
        assert!(zb(1, None, 8).unwrap_err().contains("set virtual-stages = 2 (it is 1)"));
        assert!(zb(3, None, 8).unwrap_err().contains("(it is 3)"));
        assert!(zb(2, Some(4), 8).unwrap_err().contains("interleaved 1F1B only"));
        assert!(zb(2, None, 5).is_ok());
        let dual = |stages, m| check_schedule(PipelineSchedule::DualPipe, stages, 2, None, m);
        assert!(dual(3, 12).unwrap_err().contains("even pipeline degree (it is 3)"));
        assert!(dual(4, 6).unwrap_err().contains("at least 2 x pipeline = 8; there are 6 "));
        assert!(dual(4, 9).unwrap_err().contains("even number"));
        assert!(dual(4, 8).is_ok() && dual(2, 4).is_ok());
        assert!(
            check_schedule(PipelineSchedule::DualPipe, 1, 2, None, 8).unwrap_err().contains("pipeline > 1")
        );
        assert_eq!("zb-v".parse(), Ok(PipelineSchedule::ZbV));
        assert_eq!("dualpipe".parse(), Ok(PipelineSchedule::DualPipe));
    }

    #[test]
    fn uneven_stages_follow_megatron_core_rules() {
        // megatron-ci's uneven-pipeline test: 12 layers, p = 4, first 2, last 2: (12 - 4) / 2.
        assert_eq!(uneven_sizes(12, 4, Some(2), Some(2)), Ok(Some(vec![2, 4, 4, 2])));
        assert_eq!(uneven_sizes(12, 4, Some(3), None), Ok(Some(vec![3, 3, 3, 3])));
        assert_eq!(uneven_sizes(10, 4, None, Some(1)), Ok(Some(vec![3, 3, 3, 1])));
        assert_eq!(uneven_sizes(4, 2, Some(1), Some(3)), Ok(Some(vec![1, 3])));
        assert_eq!(uneven_sizes(12, 4, None, None), Ok(None));
        assert!(uneven_sizes(12, 4, Some(3), Some(2)).unwrap_err().contains("7 blocks are left for the 2"));
        assert!(uneven_sizes(4, 2, Some(1), Some(2)).unwrap_err().contains("1 blocks are left for the 0"));
        assert!(uneven_sizes(12, 4, Some(0), None).unwrap_err().contains("at least 1"));
        assert!(uneven_sizes(12, 4, Some(8), Some(8)).unwrap_err().contains("more than"));
        assert!(uneven_sizes(12, 1, Some(12), None).unwrap_err().contains("pipeline > 1"));
    }

    #[test]
    fn counted_embedding_and_loss_follow_megatron_cores_split() {
        // megatron-ci's account-for test: 6 layers + embedding + loss over p = 4 x v = 2: one
        // counted layer per chunk, the first chunk the embedding alone, the last the loss.
        assert_eq!(accounted_sizes(6, 4, 2, true, true), Ok(vec![0, 1, 1, 1, 1, 1, 1, 0]));
        // 30 + 2 over 4 stages: 8 each, one block fewer at each end.
        assert_eq!(accounted_sizes(30, 4, 1, true, true), Ok(vec![7, 8, 8, 7]));
        // The embedding alone: 31 + 1 over 4; the loss alone: 7 + 1 over 2 x 2.
        assert_eq!(accounted_sizes(31, 4, 1, true, false), Ok(vec![7, 8, 8, 8]));
        assert_eq!(accounted_sizes(7, 2, 2, false, true), Ok(vec![2, 2, 2, 1]));
        // Every block is built exactly once.
        for (units, stages, virtual_stages) in [(6, 4, 2), (30, 4, 1), (126, 16, 4), (62, 8, 2)] {
            let sizes = accounted_sizes(units, stages, virtual_stages, true, true).unwrap();
            assert_eq!(sizes.iter().sum::<usize>(), units);
            assert_eq!(sizes.len(), stages * virtual_stages);
        }
        assert!(accounted_sizes(12, 4, 1, true, true).unwrap_err().contains("14 layers, which 4 stages"));
        assert!(accounted_sizes(14, 4, 3, true, true).unwrap_err().contains("4 per stage, which 3 virtual"));
        assert!(accounted_sizes(12, 1, 1, true, false).unwrap_err().contains("pipeline > 1"));
    }

    #[test]
    fn even_counts_split_evenly_and_uneven_ones_balance_the_ends() {
        assert_eq!(partition(&[1.0; 8], 4), vec![0..2, 2..4, 4..6, 6..8]);
        // Llama 3.1 405B's shape: 126 layers on 64 chunks, the first carrying the embedding and
        // the last the output layer: each end gets one layer, every other chunk two.
        let mut costs = vec![1.0; 126];
        costs[0] += 0.05;
        costs[125] += 0.6;
        let groups = partition(&costs, 64);
        assert_eq!(groups.len(), 64);
        assert_eq!(groups[0], 0..1);
        assert_eq!(groups[63], 125..126);
        assert!(groups[1..63].iter().all(|g| g.len() == 2));
    }
}
