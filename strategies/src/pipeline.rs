//! Pipeline parallelism: the partition of a model's layers into stages (and virtual chunks)
//! and the order each stage runs its micro-batches in (GPipe, 1F1B, interleaved 1F1B).
//!
//! The schedules are Megatron-LM's (`megatron/core/pipeline_parallel/schedules.py`):
//! - GPipe: every micro-batch's forward, then every backward;
//! - 1F1B (`forward_backward_pipelining_without_interleaving`): stage `s` of `p` runs
//!   `min(p - s - 1, m)` warm-up forwards, then alternates one forward and one backward, then
//!   drains the remaining backwards;
//! - interleaved 1F1B (`forward_backward_pipelining_with_interleaving`), with `v` model chunks
//!   per stage: the `m v` chunk-micro-batches run in groups of `p` micro-batches per chunk,
//!   `(p - s - 1) 2 + (v - 1) p` warm-up forwards (all of them when `m = p`).
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
}

impl PipelineSchedule {
    /// Every schedule.
    pub const ALL: [PipelineSchedule; 2] = [PipelineSchedule::GPipe, PipelineSchedule::OneFOneB];

    /// The name used in scenario files.
    pub const fn name(self) -> &'static str {
        match self {
            PipelineSchedule::GPipe => "gpipe",
            PipelineSchedule::OneFOneB => "1f1b",
        }
    }
}

impl std::str::FromStr for PipelineSchedule {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        PipelineSchedule::ALL.into_iter().find(|s| s.name() == name).ok_or_else(|| {
            format!("unknown pipeline schedule {name:?}; valid: \"gpipe\", \"1f1b\" (interleaved when virtual-stages > 1)")
        })
    }
}

/// One step of a stage's schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    /// Forward (true) or backward.
    pub forward: bool,
    /// Which micro-batch.
    pub micro_batch: u32,
    /// Which of the stage's model chunks (0 without virtual stages).
    pub chunk: u32,
}

/// The order stage `stage` of `stages` runs `micro_batches` micro-batches of its `chunks` model
/// chunks in. The caller has checked the combination (see [`check_schedule`]).
pub fn actions(
    schedule: PipelineSchedule,
    stages: u32,
    chunks: u32,
    stage: u32,
    micro_batches: u32,
) -> Vec<Action> {
    let m = micro_batches;
    let mut order = Vec::with_capacity(2 * (m * chunks) as usize);
    let forward = |micro_batch, chunk| Action { forward: true, micro_batch, chunk };
    let backward = |micro_batch, chunk| Action { forward: false, micro_batch, chunk };
    if schedule == PipelineSchedule::GPipe {
        order.extend((0..m).map(|mb| forward(mb, 0)));
        order.extend((0..m).map(|mb| backward(mb, 0)));
        return order;
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
    // Interleaved: virtual micro-batch k -> (micro-batch, chunk).
    let group = stages * chunks;
    let micro_of = |k: u32| (k / group) * stages + k % stages;
    let chunk_forward = |k: u32| (k % group) / stages;
    let chunk_backward = |k: u32| chunks - 1 - (k % group) / stages;
    let total = m * chunks;
    let warmup =
        if m == stages { total } else { ((stages - stage - 1) * 2 + (chunks - 1) * stages).min(total) };
    order.extend((0..warmup).map(|k| forward(micro_of(k), chunk_forward(k))));
    for i in 0..total - warmup {
        let k = warmup + i;
        order.push(forward(micro_of(k), chunk_forward(k)));
        order.push(backward(micro_of(i), chunk_backward(i)));
    }
    order.extend((total - warmup..total).map(|k| backward(micro_of(k), chunk_backward(k))));
    order
}

/// Why a schedule cannot run: a message naming what would be valid.
pub fn check_schedule(
    schedule: PipelineSchedule,
    stages: u32,
    chunks: u32,
    micro_batches: u32,
) -> Result<(), String> {
    if chunks > 1 {
        if schedule == PipelineSchedule::GPipe {
            return Err(format!(
                "virtual-stages = {chunks} needs schedule = \"1f1b\" (interleaved 1F1B); GPipe runs one \
                 chunk per stage"
            ));
        }
        if stages < 2 {
            return Err("virtual-stages > 1 needs pipeline > 1".into());
        }
        if micro_batches % stages != 0 {
            return Err(format!(
                "interleaved 1F1B runs micro-batches in groups of `pipeline` = {stages}, but there are \
                 {micro_batches} micro-batches: make global-batch / (micro-batch x data) a multiple of \
                 {stages}"
            ));
        }
    }
    Ok(())
}

/// The most chunk-micro-batches whose activations a stage holds at once under `actions`
/// (forwards done whose backward is not), weighted by `weight[chunk]`.
pub fn peak_in_flight(actions: &[Action], weight: &[u64]) -> u64 {
    let mut live = 0u64;
    let mut peak = 0u64;
    for action in actions {
        let w = weight.get(action.chunk as usize).copied().unwrap_or(0);
        if action.forward {
            live += w;
            peak = peak.max(live);
        } else {
            live = live.saturating_sub(w);
        }
    }
    peak
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

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(actions: &[Action]) -> (usize, usize) {
        let forwards = actions.iter().filter(|a| a.forward).count();
        (forwards, actions.len() - forwards)
    }

    #[test]
    fn one_f_one_b_warms_up_by_the_distance_to_the_last_stage() {
        let first = actions(PipelineSchedule::OneFOneB, 4, 1, 0, 8);
        assert_eq!(counts(&first), (8, 8));
        assert!(first[..3].iter().all(|a| a.forward) && first[3].forward && !first[4].forward);
        let last = actions(PipelineSchedule::OneFOneB, 4, 1, 3, 8);
        assert!(last.chunks(2).all(|pair| pair[0].forward && !pair[1].forward));
        // Peak in flight: p on the first stage, 1 on the last.
        assert_eq!(peak_in_flight(&first, &[1]), 4);
        assert_eq!(peak_in_flight(&last, &[1]), 1);
        assert_eq!(peak_in_flight(&actions(PipelineSchedule::GPipe, 4, 1, 0, 8), &[1]), 8);
    }

    #[test]
    fn interleaved_runs_every_chunk_of_every_micro_batch_once_in_megatron_order() {
        let (p, v, m) = (4, 2, 8);
        for stage in 0..p {
            let order = actions(PipelineSchedule::OneFOneB, p, v, stage, m);
            assert_eq!(counts(&order), ((m * v) as usize, (m * v) as usize));
            let mut seen = std::collections::BTreeSet::new();
            for a in &order {
                assert!(seen.insert((a.forward, a.micro_batch, a.chunk)), "{a:?} twice");
            }
            // Chunk 0 of micro-batches 0..p first, then chunk 1 of the same micro-batches.
            let firsts: Vec<(u32, u32)> =
                order.iter().take(8).filter(|a| a.forward).map(|a| (a.micro_batch, a.chunk)).collect();
            if stage == 0 {
                assert_eq!(&firsts[..5], &[(0, 0), (1, 0), (2, 0), (3, 0), (0, 1)]);
            }
            // A backward of a chunk comes after its forward.
            for (i, a) in order.iter().enumerate().filter(|(_, a)| !a.forward) {
                assert!(
                    order[..i]
                        .iter()
                        .any(|f| f.forward && f.micro_batch == a.micro_batch && f.chunk == a.chunk)
                );
            }
        }
    }

    #[test]
    fn schedules_that_cannot_run_say_why() {
        assert!(check_schedule(PipelineSchedule::GPipe, 4, 2, 8).unwrap_err().contains("1f1b"));
        assert!(check_schedule(PipelineSchedule::OneFOneB, 4, 2, 6).unwrap_err().contains("multiple of 4"));
        assert!(check_schedule(PipelineSchedule::OneFOneB, 4, 2, 8).is_ok());
        assert!("pipedream".parse::<PipelineSchedule>().unwrap_err().contains("gpipe"));
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
