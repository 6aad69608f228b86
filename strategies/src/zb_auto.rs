//! The zero-bubble repository's automatic pipeline schedule (Qi et al., "Zero Bubble Pipeline
//! Parallelism", ICLR 2024, section 3.1; sail-sg/zero-bubble-pipeline-parallelism @ 39f2c186 :
//! `megatron/core/pipeline_parallel/zerobubble/scheduler/zb.py`, `Graph.manual_order` and
//! `initial_solution`), which ZB-1p and ZB-2p run under a memory limit: read from that code
//! and written anew.
//!
//! Every stage's order of forward (F), input-gradient (B) and weight-gradient (W) passes is
//! built by simulating the stages with one F, B and W time each (the median over the stages,
//! as the repository's runtime passes them) and a transfer time between stages:
//! - warm-up: each stage runs as many forwards as fit under the memory limit before its first
//!   B would arrive (`allow_bubble_before_first_b`: or one more, leaving a bubble);
//! - then one F and one B per micro-batch, a stage skipping its F when it runs two ahead of the
//!   next and a B would be delayed (`prioritize_b`), with W passes inserted wherever they fit
//!   before the next F or B can start, or, when the gap is shorter than a W, if the stage's
//!   bubble is not the largest (`no_bubble_greedy`), and whenever the memory limit is hit;
//! - the W passes left run at the end.
//!
//! Of the eight combinations of the three switches, the one with the shortest simulated time
//! wins (the first on a tie), and each stage's passes run in the order of their simulated
//! completion. The repository then refines the order with an integer program; its heuristic
//! solution, used here, is what it starts from (and what runs without the solver).
//!
//! Memory is counted as parasim's pipeline memory counts it ([`crate::pipeline::peak_in_flight`]):
//! a micro-batch's activations are held from its F to its W (F +1, B 0, W -1), so the limit is
//! the number of micro-batches in flight on a stage: `2p` for ZB-2p. The paper counts the
//! memory a B frees apart (`M_B - M_W`), which lets more micro-batches into flight under the
//! same limit when it binds.

use crate::pipeline::{Action, Step};

/// Pass kinds, indexing the cost and memory tables.
const F: usize = 0;
const B: usize = 1;
const W: usize = 2;

/// Micro-batches each kind of pass adds to a stage's in-flight count: held from F to W.
const MEMORY: [i64; 3] = [1, 0, -1];

/// The transfer time between stages in the simulation: an instant network, as ZB-V's list
/// schedule assumes ([`crate::pipeline::zb_v_orders`]); the engine then runs the real
/// transfers.
const COMM: f64 = 0.0;

/// One simulation of the heuristic with its three switches.
struct Heuristic {
    stages: usize,
    micro_batches: usize,
    cost: [f64; 3],
    limit: i64,
    /// Passes of each kind put on each stage so far.
    count: [Vec<usize>; 3],
    /// Each stage's end time and held memory.
    end: Vec<f64>,
    held: Vec<i64>,
    /// Each stage's idle time after its first F.
    bubble: Vec<f64>,
    /// Completion time of each (kind, stage, micro-batch) put, 0 before.
    done: Vec<f64>,
}

impl Heuristic {
    fn new(stages: usize, micro_batches: usize, cost: [f64; 3], limit: i64) -> Heuristic {
        Heuristic {
            stages,
            micro_batches,
            cost,
            limit,
            count: [vec![0; stages], vec![0; stages], vec![0; stages]],
            end: vec![0.0; stages],
            held: vec![0; stages],
            bubble: vec![0.0; stages],
            done: vec![0.0; 3 * stages * micro_batches],
        }
    }

    fn id(&self, kind: usize, stage: usize, micro_batch: usize) -> usize {
        (kind * self.stages + stage) * self.micro_batches + micro_batch
    }

    /// Completion of (kind, stage, micro-batch), 0 if not put (the repository's default).
    fn time(&self, kind: usize, stage: usize, micro_batch: usize) -> f64 {
        if micro_batch < self.micro_batches { self.done[self.id(kind, stage, micro_batch)] } else { 0.0 }
    }

    fn max_bubble(&self) -> f64 {
        self.bubble.iter().copied().fold(0.0, f64::max)
    }

    /// The next pass of `kind` on `stage`, after its dependencies.
    fn put(&mut self, stage: usize, kind: usize) {
        let micro_batch = self.count[kind][stage];
        let cost = self.cost[kind];
        let no_bubble = self.end[stage] + cost;
        let mut finish = no_bubble;
        if stage > 0 && kind == F {
            finish = finish.max(self.time(F, stage - 1, micro_batch) + COMM + cost);
        }
        if stage + 1 < self.stages && kind == B {
            finish = finish.max(self.time(B, stage + 1, micro_batch) + COMM + cost);
        }
        if self.count[F][stage] > 0 {
            self.bubble[stage] += finish - no_bubble;
        }
        self.end[stage] = finish;
        let id = self.id(kind, stage, micro_batch);
        self.done[id] = finish;
        self.held[stage] += MEMORY[kind];
        self.count[kind][stage] += 1;
    }

    /// W passes on `stage` while `ready` (the next F or B's input) leaves room for them: those
    /// that end before it, then one more if the gap is not the largest bubble (or always,
    /// greedy).
    fn fill_before(&mut self, stage: usize, ready: f64, no_bubble_greedy: bool) {
        while self.count[W][stage] < self.count[B][stage] && self.end[stage] + self.cost[W] <= ready {
            self.put(stage, W);
        }
        if self.count[W][stage] < self.count[B][stage] && self.end[stage] < ready {
            if ready - self.end[stage] <= self.max_bubble() - self.bubble[stage] {
                if no_bubble_greedy {
                    self.put(stage, W);
                }
            } else {
                self.put(stage, W);
            }
        }
    }

    /// W passes until `kind`'s memory fits; `None` when none is left to run.
    fn make_room(&mut self, stage: usize, kind: usize) -> Option<()> {
        while self.held[stage] + MEMORY[kind] > self.limit {
            if self.count[W][stage] >= self.count[B][stage] {
                return None;
            }
            self.put(stage, W);
        }
        Some(())
    }

    /// `manual_order` with its three switches; `None` when the memory limit cannot be met.
    fn run(
        mut self,
        allow_bubble_before_first_b: bool,
        prioritize_b: bool,
        greedy: bool,
    ) -> Option<(Vec<f64>, f64)> {
        let (p, m) = (self.stages, self.micro_batches);
        let [cost_f, cost_b, _] = self.cost;
        for i in 0..m {
            if i == 0 {
                for stage in 0..p {
                    self.put(stage, F);
                }
                let mut required = vec![0usize; p];
                let mut last = 0.0;
                for stage in (0..p).rev() {
                    if stage == p - 1 {
                        last = self.time(F, stage, i) + cost_b;
                        continue;
                    }
                    let (mut held, mut time) = (self.held[stage], self.end[stage]);
                    while self.count[F][stage] + required[stage] < m && held + MEMORY[F] <= self.limit {
                        let stop = if allow_bubble_before_first_b {
                            time + cost_f > last + COMM
                        } else {
                            time >= last + COMM
                        };
                        if stop {
                            break;
                        }
                        held += MEMORY[F];
                        time += cost_f;
                        required[stage] += 1;
                    }
                    last = time.max(last + COMM) + cost_b;
                }
                for stage in 1..p {
                    while required[stage] > 0
                        && required[stage] >= required[stage - 1]
                        && self.count[F][stage] + required[stage] < m
                    {
                        required[stage] -= 1;
                    }
                }
                for (stage, &n) in required.iter().enumerate() {
                    for _ in 0..n {
                        self.put(stage, F);
                    }
                }
                for stage in (0..p).rev() {
                    self.put(stage, B);
                }
                continue;
            }
            let mut required = vec![0usize; p];
            for (stage, need) in required.iter_mut().enumerate() {
                if self.count[F][stage] >= m {
                    continue;
                }
                if stage + 1 < p && self.count[F][stage] >= self.count[F][stage + 1] + 2 && prioritize_b {
                    let next = self.end[stage + 1] + cost_f + cost_b + COMM;
                    if self.end[stage] >= next {
                        continue;
                    }
                    let (mut w_cost, mut w_count) = (0.0, 0);
                    let mut held = self.held[stage] + MEMORY[F];
                    while held > self.limit && self.count[W][stage] + w_count < self.count[B][stage] {
                        w_cost += self.cost[W];
                        held += MEMORY[W];
                        w_count += 1;
                    }
                    if self.end[stage] + cost_f + w_cost <= next {
                        *need = 1;
                        continue;
                    }
                    if next - self.end[stage] <= self.max_bubble() - self.bubble[stage] {
                        continue;
                    }
                }
                *need = 1;
            }
            for stage in (0..p.saturating_sub(1)).rev() {
                required[stage] = required[stage].min(required[stage + 1]);
            }
            for (stage, &need) in required.iter().enumerate() {
                if need == 0 {
                    continue;
                }
                self.make_room(stage, F)?;
                if stage > 0 {
                    let ready = self.time(F, stage - 1, self.count[F][stage]) + COMM;
                    self.fill_before(stage, ready, greedy);
                }
                self.put(stage, F);
            }
            for stage in (0..p).rev() {
                self.make_room(stage, B)?;
                if stage + 1 < p {
                    let ready = self.time(B, stage + 1, i) + COMM;
                    self.fill_before(stage, ready, greedy);
                }
                if stage == 0 && self.count[F][stage] == m {
                    while self.count[W][stage] < self.count[B][stage] {
                        self.put(stage, W);
                    }
                }
                self.put(stage, B);
            }
        }
        for stage in 0..p {
            while self.count[W][stage] < m {
                self.put(stage, W);
            }
        }
        let makespan = (0..p)
            .map(|stage| self.time(W, stage, m - 1) - self.time(F, stage, 0) + cost_f)
            .fold(0.0, f64::max);
        Some((self.done, makespan))
    }
}

/// Each of `stages` stages' order of F, B and W passes for `micro_batches` micro-batches under
/// the heuristic (see the module's documentation), with `times[stage]` each stage's (F, B, W)
/// time in any one unit (the median of each over the stages is used) and at most `limit`
/// micro-batches in flight on a stage (at least 1).
pub fn orders(stages: u32, micro_batches: u32, times: &[[u64; 3]], limit: u32) -> Vec<Vec<Action>> {
    let (p, m) = (stages as usize, micro_batches as usize);
    let median = |kind: usize| -> f64 {
        let mut values: Vec<u64> = times.iter().map(|t| t[kind]).collect();
        values.sort_unstable();
        values.get(values.len() / 2).map_or(1.0, |&v| v.max(1) as f64)
    };
    let cost = [median(F), median(B), median(W)];
    let limit = i64::from(limit.max(1));
    let mut best: Option<(Vec<f64>, f64)> = None;
    for allow in [true, false] {
        for prioritize in [true, false] {
            for greedy in [true, false] {
                let run = Heuristic::new(p, m, cost, limit).run(allow, prioritize, greedy);
                if let Some((done, makespan)) = run
                    && best.as_ref().is_none_or(|(_, best)| makespan < *best)
                {
                    best = Some((done, makespan));
                }
            }
        }
    }
    // The limit is at least one micro-batch: the plain F, B, W order always fits, so a run
    // succeeds; without one, fall back to that order.
    let Some((done, _)) = best else {
        return (0..p)
            .map(|_| {
                (0..micro_batches)
                    .flat_map(|mb| {
                        [Step::Forward, Step::BackwardInput, Step::BackwardWeight]
                            .map(|step| Action::new(step, mb, 0))
                    })
                    .collect()
            })
            .collect();
    };
    let steps = [Step::Forward, Step::BackwardInput, Step::BackwardWeight];
    (0..p)
        .map(|stage| {
            let mut passes: Vec<(f64, usize, u32)> = (0..3)
                .flat_map(|kind| (0..m).map(move |mb| (kind, mb)))
                .map(|(kind, mb)| (done[(kind * p + stage) * m + mb], kind, mb as u32))
                .collect();
            // Python's sort is stable: ties keep the F, B, W then micro-batch order.
            passes.sort_by(|a, b| a.0.total_cmp(&b.0));
            passes.into_iter().map(|(_, kind, mb)| Action::new(steps[kind], mb, 0)).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::peak_in_flight;

    /// Every stage runs each micro-batch's F, B and W once, F before B before W.
    fn check(orders: &[Vec<Action>], m: u32) {
        for order in orders {
            assert_eq!(order.len(), 3 * m as usize);
            for mb in 0..m {
                let at = |step| order.iter().position(|a| a.step == step && a.micro_batch == mb).unwrap();
                assert!(at(Step::Forward) < at(Step::BackwardInput));
                assert!(at(Step::BackwardInput) < at(Step::BackwardWeight));
            }
        }
    }

    #[test]
    fn the_schedule_holds_at_most_its_limit_and_every_pass_once() {
        for (p, m) in [(4u32, 8u32), (4, 24), (8, 24), (8, 64), (2, 3)] {
            for limit in [p, 2 * p] {
                let orders = orders(p, m, &vec![[1, 1, 1]; p as usize], limit);
                check(&orders, m);
                for order in &orders {
                    assert!(peak_in_flight(order, &[1]) <= u64::from(limit), "p {p} m {m} limit {limit}");
                }
            }
        }
    }

    /// With equal F, B and W times and an instant network, the heuristic under `p` micro-batches
    /// in flight leaves ZB-H1's bubble, `(p - 1)(T_F + T_B - T_W)` (the paper's section 3), and
    /// under `2p` none: ZB-2p's "almost zero" bubble.
    #[test]
    fn equal_passes_give_zb_h1s_bubble_at_p_and_none_at_2p() {
        for (p, m) in [(4usize, 12usize), (8, 24), (8, 64), (16, 48)] {
            let best = |limit: i64| {
                let mut best = f64::MAX;
                for allow in [true, false] {
                    for prioritize in [true, false] {
                        for greedy in [true, false] {
                            if let Some((_, t)) =
                                Heuristic::new(p, m, [1.0, 1.0, 1.0], limit).run(allow, prioritize, greedy)
                            {
                                best = best.min(t);
                            }
                        }
                    }
                }
                best
            };
            let ideal = 3.0 * m as f64;
            assert_eq!(best(p as i64), ideal + (p - 1) as f64, "p {p} m {m}: limit p");
            assert_eq!(best(2 * p as i64), ideal, "p {p} m {m}: limit 2p");
        }
    }
}
