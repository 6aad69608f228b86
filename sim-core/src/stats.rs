//! Where the time went: per-rank breakdown of a timeline into compute, exposed communication
//! and idle time.
//!
//! Intervals on all streams of a rank are merged first, so overlap is counted once: a rank is
//! *computing* while any compute op runs, *exposed communication* while data moves (or waits
//! in a collective for its peers) and nothing computes, and *idle* otherwise. The three add up
//! to the length of the window.

use units::{SimDuration, SimTime};

use crate::exec::Timeline;
use crate::graph::{ExecGraph, RankId, Work};

/// One rank's time split three ways over a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankBreakdown {
    /// Time at least one compute op ran.
    pub compute: SimDuration,
    /// Time communication ran and no compute did.
    pub exposed_communication: SimDuration,
    /// Time nothing ran.
    pub idle: SimDuration,
    /// Time communication ran, overlapped or not.
    pub communication: SimDuration,
}

/// What an op counts as in a breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// Work on the device's compute units.
    Compute,
    /// Moving data (or waiting in a collective for peers), including the copies a transfer
    /// needs on its way, such as MPI's staging through host memory.
    Communication,
    /// Left out (work off the device, such as a host thread's).
    Ignored,
}

impl Activity {
    /// The default, by the op's metadata ([`crate::graph::OpMeta::work`]): host work is left
    /// out, the staging of a message through host memory is communication, and device work
    /// counts by the op's kind ([`crate::graph::OpKind::is_communication`]).
    pub fn of(op: &crate::graph::Op) -> Activity {
        match op.meta.work() {
            work if work.is_host() || work == Work::Wait => Activity::Ignored,
            Work::Staging => Activity::Communication,
            _ if op.kind.is_communication() => Activity::Communication,
            _ => Activity::Compute,
        }
    }
}

/// Splits `[from, to)` of every rank's timeline into compute, exposed communication and idle.
pub fn breakdown(graph: &ExecGraph, timeline: &Timeline, from: SimTime, to: SimTime) -> Vec<RankBreakdown> {
    breakdown_by(graph, timeline, from, to, &Activity::of)
}

/// [`breakdown`] with each op counted as `activity` says (left out when [`Activity::Ignored`]).
pub fn breakdown_by(
    graph: &ExecGraph,
    timeline: &Timeline,
    from: SimTime,
    to: SimTime,
    activity: &dyn Fn(&crate::graph::Op) -> Activity,
) -> Vec<RankBreakdown> {
    // One rank at a time, its ops found through its streams: the intervals of one rank are
    // held at once, not every rank's (two intervals of 16 bytes per op of a 12 M-op graph,
    // the validation suite's largest, were 200 MB).
    let mut compute: Vec<(SimTime, SimTime)> = Vec::new();
    let mut communication: Vec<(SimTime, SimTime)> = Vec::new();
    let window = to.saturating_since(from);
    (0..graph.ranks())
        .map(|rank| {
            compute.clear();
            communication.clear();
            for id in graph.rank_ops(RankId(rank)) {
                let op = graph.op(id);
                let list = match activity(op) {
                    Activity::Compute => &mut compute,
                    Activity::Communication => &mut communication,
                    Activity::Ignored => continue,
                };
                let index = id.0 as usize;
                let start = timeline.start[index].max(from);
                let end = timeline.end[index].min(to);
                if start >= end {
                    continue;
                }
                list.push((start, end));
            }
            let compute_time = union_length(&mut compute);
            let communication_time = union_length(&mut communication);
            compute.append(&mut communication);
            let busy = union_length(&mut compute);
            RankBreakdown {
                compute: compute_time,
                exposed_communication: busy.saturating_sub(compute_time),
                idle: window.saturating_sub(busy),
                communication: communication_time,
            }
        })
        .collect()
}

/// Exposed communication of every rank over `[from, to)` split by class: `class` maps a
/// communication op (by its metadata, say) to one of `classes` classes (`None`: not counted).
/// Time when no compute op runs and communication of several classes does is shared equally
/// among them, so the classes add up to [`RankBreakdown::exposed_communication`] when every
/// communication op has a class. Ops count as `activity` says, as in [`breakdown_by`]. Returns,
/// per rank, the exposed time of each class.
pub fn exposed_by_class(
    graph: &ExecGraph,
    timeline: &Timeline,
    from: SimTime,
    to: SimTime,
    class: &dyn Fn(&crate::graph::Op) -> Option<usize>,
    classes: usize,
    activity: &dyn Fn(&crate::graph::Op) -> Activity,
) -> Vec<Vec<SimDuration>> {
    // One rank at a time (as in [`breakdown_by`]): edges `(time, +1/-1, class or usize::MAX
    // for compute)` of one rank, in a buffer reused for the next.
    let mut edges: Vec<(SimTime, i8, usize)> = Vec::new();
    let mut active = vec![0i64; classes];
    (0..graph.ranks())
        .map(|rank| {
            edges.clear();
            for id in graph.rank_ops(RankId(rank)) {
                let op = graph.op(id);
                let index = id.0 as usize;
                let start = timeline.start[index].max(from);
                let end = timeline.end[index].min(to);
                if start >= end {
                    continue;
                }
                let tag = match activity(op) {
                    Activity::Communication => match class(op) {
                        Some(c) if c < classes => c,
                        _ => continue,
                    },
                    Activity::Compute => usize::MAX,
                    Activity::Ignored => continue,
                };
                edges.push((start, 1, tag));
                edges.push((end, -1, tag));
            }
            edges.sort_unstable();
            let mut totals = vec![0u128; classes];
            active.fill(0);
            let mut computing = 0i64;
            let mut last = from;
            for &(time, delta, tag) in edges.iter() {
                if time > last && computing == 0 {
                    let busy = active.iter().filter(|&&count| count > 0).count();
                    if busy > 0 {
                        let share = u128::from(time.saturating_since(last).as_ps()) / busy as u128;
                        for (total, _) in totals.iter_mut().zip(&active).filter(|(_, count)| **count > 0) {
                            *total += share;
                        }
                    }
                }
                last = last.max(time);
                if tag == usize::MAX {
                    computing += i64::from(delta);
                } else {
                    active[tag] += i64::from(delta);
                }
            }
            totals.into_iter().map(|ps| SimDuration::from_ps(ps as u64)).collect()
        })
        .collect()
}

/// Idle time of every rank from `from` until its own `until[rank]`: no op of the rank running,
/// ops for which `ignore` is true not counted as running (a collective a rank only waits in).
pub fn idle_until(
    graph: &ExecGraph,
    timeline: &Timeline,
    from: SimTime,
    until: &[SimTime],
    ignore: &dyn Fn(&crate::graph::Op) -> bool,
) -> Vec<SimDuration> {
    idle_until_besides(graph, timeline, from, until, ignore, &[])
}

/// [`idle_until`], with time inside `accounted[rank]`'s intervals not counted as idle either:
/// idle time already given another cause (a GPU waiting for its host to launch the next
/// kernel is host-bound, not a pipeline bubble). Ranks past the end of `accounted` have none.
pub fn idle_until_besides(
    graph: &ExecGraph,
    timeline: &Timeline,
    from: SimTime,
    until: &[SimTime],
    ignore: &dyn Fn(&crate::graph::Op) -> bool,
    accounted: &[Vec<(SimTime, SimTime)>],
) -> Vec<SimDuration> {
    // One rank at a time (as in [`breakdown_by`]).
    let mut busy: Vec<(SimTime, SimTime)> = Vec::new();
    (0..graph.ranks())
        .map(|rank| {
            busy.clear();
            let end_of_window = until.get(rank as usize).copied().unwrap_or(from);
            if let Some(intervals) = accounted.get(rank as usize) {
                busy.extend(
                    intervals
                        .iter()
                        .map(|&(start, end)| (start.max(from), end.min(end_of_window)))
                        .filter(|(start, end)| start < end),
                );
            }
            for id in graph.rank_ops(RankId(rank)) {
                if ignore(graph.op(id)) {
                    continue;
                }
                let index = id.0 as usize;
                let start = timeline.start[index].max(from);
                let end = timeline.end[index].min(end_of_window);
                if start < end {
                    busy.push((start, end));
                }
            }
            end_of_window.saturating_since(from).saturating_sub(union_length(&mut busy))
        })
        .collect()
}

/// Total length covered by `intervals` (sorted in place), overlaps counted once.
fn union_length(intervals: &mut [(SimTime, SimTime)]) -> SimDuration {
    intervals.sort_unstable();
    let mut total = SimDuration::ZERO;
    let mut current: Option<(SimTime, SimTime)> = None;
    for &(start, end) in intervals.iter() {
        current = match current {
            Some((open, close)) if start <= close => Some((open, close.max(end))),
            Some((open, close)) => {
                total = total.saturating_add(close.saturating_since(open));
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    if let Some((open, close)) = current {
        total = total.saturating_add(close.saturating_since(open));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(us: u64) -> SimTime {
        SimTime::from_ps(us * 1_000_000)
    }

    #[test]
    fn exposed_time_is_split_by_class_and_idle_is_measured_per_rank() {
        use crate::graph::{GraphBuilder, StreamId};
        // Rank 0: compute 0-10, a transfer on stream 1 ending at 30 (exposed 10-30 on class 0).
        let mut builder = GraphBuilder::new(2);
        let compute = builder.compute(RankId(0), StreamId(0), SimDuration::from_us(10), "c", &[]);
        builder.transfer(RankId(0), StreamId(1), RankId(1), units::Bytes(1), "t", &[compute]);
        let graph = builder.build().unwrap();
        let timeline = Timeline {
            start: vec![t(0), t(0)],
            end: vec![t(10), t(30)],
            collective_begin: Vec::new(),
            collective_choice: Vec::new(),
            events: 0,
        };
        let exposed = exposed_by_class(
            &graph,
            &timeline,
            t(0),
            t(40),
            &|op| (op.stream.0 == 1).then_some(0),
            1,
            &Activity::of,
        );
        assert_eq!(exposed[0], vec![SimDuration::from_us(20)]);
        // Rank 0 busy 0-30: idle until 40 is 10; rank 1 has nothing: idle 0-5 is 5.
        assert_eq!(
            idle_until(&graph, &timeline, t(0), &[t(40), t(5)], &|_| false),
            vec![SimDuration::from_us(10), SimDuration::from_us(5)]
        );
        // Rank 0's 28-35 already has a cause: 5 of its 10 idle us are left (28-30 overlaps
        // its op); rank 1's interval is clipped to its window, 0-5: 2-9 leaves 2.
        assert_eq!(
            idle_until_besides(
                &graph,
                &timeline,
                t(0),
                &[t(40), t(5)],
                &|_| false,
                &[vec![(t(28), t(35))], vec![(t(2), t(9))]]
            ),
            vec![SimDuration::from_us(5), SimDuration::from_us(2)]
        );
    }

    #[test]
    fn union_counts_overlap_once() {
        let mut intervals = vec![(t(5), t(8)), (t(0), t(2)), (t(1), t(3)), (t(8), t(9))];
        assert_eq!(union_length(&mut intervals), SimDuration::from_us(7));
        assert_eq!(union_length(&mut []), SimDuration::ZERO);
    }
}
