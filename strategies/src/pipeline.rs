//! Pipeline parallelism: the partition of a model's layers into stages (and virtual chunks)
//! and the order each stage runs its micro-batches in (GPipe, 1F1B, interleaved 1F1B, ZB-H1).
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
//!   T_B + T_W)` to `(p - 1)(T_F + T_B - T_W)` (the paper's table 3).
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
}

impl PipelineSchedule {
    /// Every schedule.
    pub const ALL: [PipelineSchedule; 3] =
        [PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::ZbH1];

    /// The name used in scenario files.
    pub const fn name(self) -> &'static str {
        match self {
            PipelineSchedule::GPipe => "gpipe",
            PipelineSchedule::OneFOneB => "1f1b",
            PipelineSchedule::ZbH1 => "zb-h1",
        }
    }
}

impl std::str::FromStr for PipelineSchedule {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        PipelineSchedule::ALL.into_iter().find(|s| s.name() == name).ok_or_else(|| {
            format!(
                "unknown pipeline schedule {name:?}; valid: \"gpipe\", \"1f1b\" (interleaved when \
                 virtual-stages > 1), \"zb-h1\" (zero-bubble ZB-H1: backward split into input- and \
                 weight-gradient passes)"
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
}

impl Action {
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
/// chunks in, interleaved micro-batches in groups of `group` (Megatron's default: `stages`).
/// The caller has checked the combination (see [`check_schedule`]).
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
    let forward = |micro_batch, chunk| Action { step: Step::Forward, micro_batch, chunk };
    let backward = |micro_batch, chunk| Action { step: Step::Backward, micro_batch, chunk };
    if schedule == PipelineSchedule::GPipe {
        order.extend((0..m).map(|mb| forward(mb, 0)));
        order.extend((0..m).map(|mb| backward(mb, 0)));
        return order;
    }
    if schedule == PipelineSchedule::ZbH1 {
        return zb_h1(stages, stage, m);
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

/// Megatron-Core's EP A2A overlap without a pipeline (`combined_1f1b_schedule_for_no_pipelining`
/// in megatron/core/pipeline_parallel/combined_1f1b.py at d98e8a64dd): the first micro-batch's
/// forward alone, then each forward together with the backward of the micro-batch before it,
/// then the last backward: `F0, F1 B0, F2 B1, ..., B(m-1)`. The emitter runs every forward that
/// a backward follows as one merged step; two micro-batches' activations are held at once (one
/// with the plain order `F0 B0 F1 B1 ...`), which Megatron-Core's documentation names as the
/// feature's memory cost.
pub fn overlapped_actions(micro_batches: u32) -> Vec<Action> {
    let action = |step, micro_batch| Action { step, micro_batch, chunk: 0 };
    let mut order = Vec::with_capacity(2 * micro_batches as usize);
    for micro in 0..micro_batches {
        order.push(action(Step::Forward, micro));
        if micro > 0 {
            order.push(action(Step::Backward, micro - 1));
        }
    }
    if let Some(last) = micro_batches.checked_sub(1) {
        order.push(action(Step::Backward, last));
    }
    order
}

/// ZB-H1 on stage `stage` of `stages`: 1F1B's `min(p - s - 1, m)` warm-up forwards, then F, B
/// pairs and the remaining B passes, each followed by a W once `s` of them have run without
/// (the W passes start `s` steps late, so every stage holds `p` micro-batches at most), then
/// the W passes left.
fn zb_h1(stages: u32, stage: u32, m: u32) -> Vec<Action> {
    let action = |step, micro_batch| Action { step, micro_batch, chunk: 0 };
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

/// Why a schedule cannot run: a message naming what would be valid. `group` is
/// `parallelism.microbatch-group-size` if set (Megatron's default: `stages`).
pub fn check_schedule(
    schedule: PipelineSchedule,
    stages: u32,
    chunks: u32,
    group: Option<u32>,
    micro_batches: u32,
) -> Result<(), String> {
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
                let f =
                    |k: u32| Action { step: Step::Forward, micro_batch: micro(k), chunk: (k % group) / p };
                let b = |k: u32| Action {
                    step: Step::Backward,
                    micro_batch: micro(k),
                    chunk: v - 1 - (k % group) / p,
                };
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
