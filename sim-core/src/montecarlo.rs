//! Monte Carlo iterations: the same execution graph re-timed many times with fresh draws of
//! [`Variability`], without lowering it or running the event loop again.
//!
//! [`Retimer::new`] takes a graph and the timeline of its noise-free run, and keeps each op's
//! duration there: a compute op's end minus its start, a transfer's or copy's likewise, a
//! collective's end minus the arrival of its last member. It orders the graph once
//! topologically, with each collective as one node that waits for every member's
//! predecessors. [`Retimer::run`] then replays the graph `iterations` times: an op starts when
//! its last predecessor ends (its stream predecessor included), device compute is multiplied by
//! the iteration's draws, host interruptions lengthen the ops they hit, and communication keeps
//! its noise-free duration. Under the `analytical` network model that is exact: a collective's or
//! message's time depends only on itself there, so with no variability the re-timed run is the
//! engine's run, op for op (a test pins it). Under `flow` and `packet-steps`, contention stays as
//! it was in the noise-free run.
//!
//! Repetitions are chained: each rank starts repetition `k + 1` when its last op of
//! repetition `k` ends (as the next iteration's ops follow this one's on their streams), and
//! an iteration's time is the end of its last op minus the end of the iteration before.
//!
//! Draws are made per (repetition, rank) on rayon, each rank's in its nodes' fixed order into
//! its own slots, while the previous repetition is re-timed: the results are the same whatever
//! the thread count.

use rayon::prelude::*;
use units::SimDuration;

use crate::exec::Timeline;
use crate::graph::{ExecGraph, OpId, OpKind};
use crate::variability::{Purpose, Sampler, Variability, stream};
use rand::Rng;

/// Marks "no predecessor" in the critical-path links.
const NONE: u32 = u32::MAX;

/// What a node's duration is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeKind {
    /// Communication: its noise-free duration.
    Fixed,
    /// Device compute: multiplied by the iteration's draw.
    Device,
    /// Host work: as it was (interruptions may lengthen it).
    Host,
}

/// A graph ready to be re-timed: its nodes in topological order with their predecessors.
#[derive(Debug, Clone)]
pub struct Retimer {
    ranks: u32,
    /// Per node (topological order), its predecessors' positions; `n + rank` is that rank's
    /// release (the end of its previous repetition).
    pred_offsets: Vec<u32>,
    preds: Vec<u32>,
    /// Noise-free duration in picoseconds.
    base: Vec<u64>,
    kind: Vec<NodeKind>,
    /// The rank of a compute or transfer node; [`NONE`] for a collective.
    rank: Vec<u32>,
    /// Per device-compute node, its slot in the draws (grouped by rank, node order within).
    draw_slot: Vec<u32>,
    /// Start of each rank's draw slots (ranks + 1 entries).
    draw_offsets: Vec<u32>,
    /// Whether interruptions lengthen the node.
    interruptible: Vec<bool>,
    /// Per collective node (in node order), the ranks of its members: their ends are its end.
    collective_ranks_offsets: Vec<u32>,
    collective_ranks: Vec<u32>,
    /// Per node, its index in `collective_ranks_offsets` (collectives only).
    collective_index: Vec<u32>,
    /// Per iteration of the graph, the nodes whose latest end closes it.
    iteration_ends: Vec<Vec<u32>>,
    /// What a repetition reads of each node, packed in one array (one cache stream, not six).
    hot: Vec<Hot>,
}

/// A node as [`Retimer::pass`] reads it.
#[derive(Debug, Clone, Copy)]
struct Hot {
    /// Noise-free duration in picoseconds.
    base: u64,
    /// Its predecessors: `preds[first..last]`.
    first: u32,
    last: u32,
    /// Its draw slot, or [`NONE`].
    draw_slot: u32,
    /// Its rank, or [`NONE`] for a collective.
    rank: u32,
    /// A collective's index in `collective_ranks_offsets`, else [`NONE`].
    collective: u32,
    /// Whether interruptions lengthen it.
    interruptible: bool,
}

/// What [`Retimer::run`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonteCarloRun {
    /// Time of every simulated iteration, in order.
    pub iteration_times: Vec<SimDuration>,
    /// Repetitions of the graph (each holds the graph's iterations).
    pub repetitions: u32,
    /// Per rank, in how many repetitions some compute of it lay on the critical path (the chain
    /// of latest-ending predecessors back from the op that ended the repetition last).
    pub critical_path_counts: Vec<u32>,
}

/// The graph could not be re-timed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MonteCarloError {
    /// The graph's timeline does not belong to it.
    #[error("the timeline has {timeline} ops but the graph has {graph}")]
    Mismatch {
        /// Ops in the timeline.
        timeline: usize,
        /// Ops in the graph.
        graph: usize,
    },
    /// The graph (with collectives as rendezvous) has a cycle.
    #[error("the graph's collectives form a cycle: it cannot be ordered")]
    Cycle,
}

impl Retimer {
    /// Prepares `graph`, whose noise-free run is `timeline`, for re-timing; `iteration_ends`
    /// lists per iteration of the graph the ops whose latest end closes it.
    pub fn new(
        graph: &ExecGraph,
        timeline: &Timeline,
        iteration_ends: &[Vec<OpId>],
    ) -> Result<Retimer, MonteCarloError> {
        let op_count = graph.op_count();
        if timeline.end.len() != op_count {
            return Err(MonteCarloError::Mismatch { timeline: timeline.end.len(), graph: op_count });
        }
        let ranks = graph.ranks();
        let collectives = graph.collectives().len();
        let temp_count = op_count + collectives;
        let temp_of = |op: OpId| match graph.op(op).kind {
            OpKind::Collective(c) => (op_count + c.0 as usize) as u32,
            _ => op.0,
        };
        // Predecessors of every temporary node (ops, then collectives); a release is encoded as
        // `temp_count + rank`.
        let release = |rank: u32| (temp_count as u32) + rank;
        let mut temp_preds: Vec<Vec<u32>> = vec![Vec::new(); temp_count];
        let mut exists = vec![false; temp_count];
        for (index, op) in graph.ops().iter().enumerate() {
            let id = OpId(index as u32);
            let node = temp_of(id) as usize;
            exists[node] = true;
            let before = temp_preds[node].len();
            let own: Vec<u32> = graph
                .deps(id)
                .iter()
                .chain(graph.previous_in_stream(id).as_ref())
                .map(|p| temp_of(*p))
                .collect();
            if own.is_empty() {
                temp_preds[node].push(release(op.rank.0));
            } else {
                temp_preds[node].extend(own);
            }
            debug_assert!(temp_preds[node].len() > before);
        }
        for preds in &mut temp_preds {
            preds.sort_unstable();
            preds.dedup();
        }
        // In-degrees and successor lists.
        let mut indegree = vec![0u32; temp_count];
        let mut successor_count = vec![0u32; temp_count + 1];
        for (node, preds) in temp_preds.iter().enumerate() {
            for &p in preds {
                if (p as usize) < temp_count {
                    indegree[node] += 1;
                    successor_count[p as usize + 1] += 1;
                }
            }
        }
        for i in 0..temp_count {
            successor_count[i + 1] += successor_count[i];
        }
        let mut fill = successor_count.clone();
        let mut successors = vec![0u32; successor_count[temp_count] as usize];
        for (node, preds) in temp_preds.iter().enumerate() {
            for &p in preds {
                if (p as usize) < temp_count {
                    successors[fill[p as usize] as usize] = node as u32;
                    fill[p as usize] += 1;
                }
            }
        }
        // Kahn's algorithm with a stack: a rank's ops run on as far as they can before the next
        // rank's (each rank's nodes, and its draws, stay together in memory).
        let mut ready: Vec<u32> = (0..temp_count as u32)
            .rev()
            .filter(|&n| exists[n as usize] && indegree[n as usize] == 0)
            .collect();
        let mut order: Vec<u32> = Vec::with_capacity(temp_count);
        while let Some(node) = ready.pop() {
            order.push(node);
            let node = node as usize;
            for &next in
                successors[successor_count[node] as usize..successor_count[node + 1] as usize].iter().rev()
            {
                indegree[next as usize] -= 1;
                if indegree[next as usize] == 0 {
                    ready.push(next);
                }
            }
        }
        let real = exists.iter().filter(|e| **e).count();
        if order.len() != real {
            return Err(MonteCarloError::Cycle);
        }
        let n = order.len();
        let mut position = vec![NONE; temp_count];
        for (pos, &node) in order.iter().enumerate() {
            position[node as usize] = pos as u32;
        }
        let map = |p: u32| {
            if (p as usize) < temp_count { position[p as usize] } else { n as u32 + (p - temp_count as u32) }
        };
        let has_host = graph
            .ops()
            .iter()
            .any(|op| matches!(op.kind, OpKind::Compute { .. }) && op.meta.work().is_host());
        let mut retimer = Retimer {
            ranks,
            pred_offsets: Vec::with_capacity(n + 1),
            preds: Vec::new(),
            base: Vec::with_capacity(n),
            kind: Vec::with_capacity(n),
            rank: Vec::with_capacity(n),
            draw_slot: vec![NONE; n],
            draw_offsets: Vec::new(),
            interruptible: Vec::with_capacity(n),
            collective_ranks_offsets: vec![0],
            collective_ranks: Vec::new(),
            collective_index: vec![NONE; n],
            iteration_ends: Vec::new(),
            hot: Vec::new(),
        };
        retimer.pred_offsets.push(0);
        for &node in &order {
            retimer.preds.extend(temp_preds[node as usize].iter().map(|&p| map(p)));
            retimer.pred_offsets.push(retimer.preds.len() as u32);
            if (node as usize) < op_count {
                let id = OpId(node);
                let op = graph.op(id);
                let duration =
                    timeline.end[node as usize].saturating_since(timeline.start[node as usize]).as_ps();
                let kind = match op.kind {
                    OpKind::Compute { .. } if op.meta.work().is_host() => NodeKind::Host,
                    OpKind::Compute { .. } if op.meta.work() == crate::graph::Work::Device => {
                        NodeKind::Device
                    }
                    _ => NodeKind::Fixed,
                };
                retimer.base.push(duration);
                retimer.kind.push(kind);
                retimer.rank.push(op.rank.0);
                retimer.interruptible.push(if has_host {
                    kind == NodeKind::Host
                } else {
                    kind == NodeKind::Device
                });
            } else {
                let c = node as usize - op_count;
                let members = graph.members(crate::graph::CollectiveId(c as u32));
                let first = members.first().map(|m| m.0 as usize);
                let duration = first
                    .map_or(0, |m| timeline.end[m].saturating_since(timeline.collective_begin[c]).as_ps());
                retimer.base.push(duration);
                retimer.kind.push(NodeKind::Fixed);
                retimer.rank.push(NONE);
                retimer.interruptible.push(false);
                retimer.collective_index[retimer.base.len() - 1] =
                    (retimer.collective_ranks_offsets.len() - 1) as u32;
                retimer.collective_ranks.extend(members.iter().map(|m| graph.op(*m).rank.0));
                retimer.collective_ranks_offsets.push(retimer.collective_ranks.len() as u32);
            }
        }
        // Draw slots: per rank, its device compute ops in the (fixed) topological order.
        let mut per_rank = vec![0u32; ranks as usize + 1];
        for pos in 0..n {
            if retimer.kind[pos] == NodeKind::Device {
                per_rank[retimer.rank[pos] as usize + 1] += 1;
            }
        }
        for r in 0..ranks as usize {
            per_rank[r + 1] += per_rank[r];
        }
        let mut next = per_rank.clone();
        for pos in 0..n {
            if retimer.kind[pos] == NodeKind::Device {
                let rank = retimer.rank[pos] as usize;
                retimer.draw_slot[pos] = next[rank];
                next[rank] += 1;
            }
        }
        retimer.draw_offsets = per_rank;
        retimer.iteration_ends = iteration_ends
            .iter()
            .map(|ops| ops.iter().map(|op| position[temp_of(*op) as usize]).collect())
            .collect();
        if retimer.iteration_ends.is_empty() {
            retimer.iteration_ends.push((0..n as u32).collect());
        }
        retimer.hot = (0..n)
            .map(|i| Hot {
                base: retimer.base[i],
                first: retimer.pred_offsets[i],
                last: retimer.pred_offsets[i + 1],
                draw_slot: retimer.draw_slot[i],
                rank: retimer.rank[i],
                collective: retimer.collective_index[i],
                interruptible: retimer.interruptible[i],
            })
            .collect();
        Ok(retimer)
    }

    /// Nodes (ops, one per collective) re-timed per repetition.
    pub fn node_count(&self) -> usize {
        self.base.len()
    }

    /// Re-times the graph until `iterations` iterations have been simulated, drawing
    /// `variability` from streams keyed by `seed`.
    pub fn run(&self, variability: &Variability, seed: u64, iterations: u32) -> MonteCarloRun {
        let n = self.base.len();
        let per_repetition = self.iteration_ends.len() as u32;
        let repetitions = iterations.div_ceil(per_repetition.max(1));
        let rank_factors = variability.rank_factors(seed, self.ranks);
        let phases = variability.interrupt_phases(seed, self.ranks);
        let sampler = variability.op_noise.as_ref().map_or(Sampler::One, |noise| noise.sampler());
        let interrupts = Interrupts { setting: variability.host_interrupt, phases, seed };
        let slots = *self.draw_offsets.last().unwrap_or(&0) as usize;
        let mut draws = vec![1.0f64; slots];
        let mut next_draws = vec![1.0f64; slots];
        self.draw(&sampler, &rank_factors, seed, 0, &mut draws);

        let mut end = vec![0u64; n + self.ranks as usize];
        let mut critical = vec![NONE; n];
        let mut rank_end = vec![0u64; self.ranks as usize];
        let mut iteration_times = Vec::with_capacity(iterations as usize);
        let mut critical_path_counts = vec![0u32; self.ranks as usize];
        let mut seen = vec![NONE; self.ranks as usize];
        let mut previous_end = 0u64;
        for repetition in 0..repetitions {
            let last = repetition + 1 == repetitions;
            let state = Pass { end: &mut end, critical: &mut critical, rank_end: &mut rank_end };
            if last {
                self.pass(state, &draws, &interrupts);
            } else {
                rayon::join(
                    || self.pass(state, &draws, &interrupts),
                    || self.draw(&sampler, &rank_factors, seed, u64::from(repetition) + 1, &mut next_draws),
                );
            }
            // Iteration times.
            let mut final_node = NONE;
            for ends in &self.iteration_ends {
                let mut best = previous_end;
                for &node in ends {
                    if end[node as usize] > best || (final_node == NONE && end[node as usize] == best) {
                        best = end[node as usize];
                        final_node = node;
                    }
                }
                if iteration_times.len() < iterations as usize {
                    iteration_times.push(SimDuration::from_ps(best.saturating_sub(previous_end)));
                }
                previous_end = best;
            }
            // The critical path, back from the last node to end.
            let mut node = final_node;
            while (node as usize) < n {
                let rank = self.rank[node as usize];
                if self.kind[node as usize] != NodeKind::Fixed && seen[rank as usize] != repetition {
                    seen[rank as usize] = repetition;
                    critical_path_counts[rank as usize] += 1;
                }
                node = critical[node as usize];
            }
            end[n..].copy_from_slice(&rank_end);
            std::mem::swap(&mut draws, &mut next_draws);
        }
        MonteCarloRun { iteration_times, repetitions, critical_path_counts }
    }

    /// Fills `draws` for `repetition`: each rank's device compute factors, from its own stream.
    fn draw(&self, sampler: &Sampler, rank_factors: &[f64], seed: u64, repetition: u64, draws: &mut [f64]) {
        let mut slices: Vec<(usize, &mut [f64])> = Vec::with_capacity(self.ranks as usize);
        let mut rest = draws;
        for rank in 0..self.ranks as usize {
            let len = (self.draw_offsets[rank + 1] - self.draw_offsets[rank]) as usize;
            let (mine, tail) = rest.split_at_mut(len);
            slices.push((rank, mine));
            rest = tail;
        }
        slices.into_par_iter().with_min_len(16).for_each(|(rank, slots)| {
            let factor = rank_factors[rank];
            if sampler.is_one() {
                slots.fill(factor);
            } else {
                let mut rng = stream(seed, Purpose::OpNoise as u64, repetition, rank as u64);
                for slot in slots {
                    *slot = factor * sampler.sample(&mut rng);
                }
            }
        });
    }

    /// One repetition: every node's end, in topological order.
    fn pass(&self, state: Pass<'_>, draws: &[f64], interrupts: &Interrupts) {
        let Pass { end, critical, rank_end } = state;
        let has_interrupts = interrupts.setting.is_some();
        for (i, node) in self.hot.iter().enumerate() {
            let preds = &self.preds[node.first as usize..node.last as usize];
            let mut ready = 0u64;
            let mut arg = NONE;
            for &p in preds {
                let e = end[p as usize];
                if arg == NONE || e > ready {
                    ready = e;
                    arg = p;
                }
            }
            let mut duration = node.base;
            let slot = node.draw_slot;
            if slot != NONE {
                // Rounded to the nearest picosecond (`f64::round` is a libm call here).
                duration = (duration as f64 * draws[slot as usize] + 0.5) as u64;
            }
            let rank = node.rank;
            if has_interrupts && node.interruptible {
                duration = interrupts.lengthen(rank, ready, duration);
            }
            let finish = ready.saturating_add(duration);
            end[i] = finish;
            critical[i] = arg;
            if rank != NONE {
                let slot = &mut rank_end[rank as usize];
                *slot = (*slot).max(finish);
            } else {
                let c = node.collective as usize;
                let members = &self.collective_ranks[self.collective_ranks_offsets[c] as usize
                    ..self.collective_ranks_offsets[c + 1] as usize];
                for &member in members {
                    let slot = &mut rank_end[member as usize];
                    *slot = (*slot).max(finish);
                }
            }
        }
    }
}

/// The mutable state one repetition writes.
struct Pass<'a> {
    end: &'a mut [u64],
    critical: &'a mut [u32],
    rank_end: &'a mut [u64],
}

/// Host interruptions as drawn for one run.
struct Interrupts {
    setting: Option<crate::variability::HostInterrupt>,
    phases: Vec<u64>,
    seed: u64,
}

impl Interrupts {
    /// The duration of an op of `rank` that starts at `start` and runs `duration` without
    /// interruption, lengthened by every interruption that fires while it runs (including
    /// during the time earlier ones added).
    fn lengthen(&self, rank: u32, start: u64, duration: u64) -> u64 {
        let Some(setting) = self.setting else { return duration };
        let every = setting.every.as_ps().max(1);
        let jitter = setting.jitter.as_ps();
        let phase = self.phases[rank as usize];
        let mut total = duration;
        let mut k = start.saturating_sub(phase).saturating_sub(jitter) / every;
        loop {
            let grid = phase.saturating_add(k.saturating_mul(every));
            if grid >= start.saturating_add(total) {
                return total;
            }
            let delay = if jitter == 0 {
                0
            } else {
                stream(self.seed, Purpose::InterruptJitter as u64, k, u64::from(rank)).random_range(0..jitter)
            };
            let fires = grid + delay;
            if fires >= start && fires < start.saturating_add(total) {
                total = total.saturating_add(setting.duration.as_ps());
            }
            k += 1;
        }
    }
}

#[cfg(test)]
mod tests;
