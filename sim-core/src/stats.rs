//! Where the time went: per-rank breakdown of a timeline into compute, exposed communication
//! and idle time.
//!
//! Intervals on all streams of a rank are merged first, so overlap is counted once: a rank is
//! *computing* while any compute op runs, *exposed communication* while data moves (or waits
//! in a collective for its peers) and nothing computes, and *idle* otherwise. The three add up
//! to the length of the window.

use units::{SimDuration, SimTime};

use crate::exec::Timeline;
use crate::graph::ExecGraph;

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

/// Splits `[from, to)` of every rank's timeline into compute, exposed communication and idle.
pub fn breakdown(graph: &ExecGraph, timeline: &Timeline, from: SimTime, to: SimTime) -> Vec<RankBreakdown> {
    let ranks = graph.ranks() as usize;
    let mut compute: Vec<Vec<(SimTime, SimTime)>> = vec![Vec::new(); ranks];
    let mut communication: Vec<Vec<(SimTime, SimTime)>> = vec![Vec::new(); ranks];
    for (index, op) in graph.ops().iter().enumerate() {
        let start = timeline.start[index].max(from);
        let end = timeline.end[index].min(to);
        if start >= end {
            continue;
        }
        let lists = if op.kind.is_communication() { &mut communication } else { &mut compute };
        lists[op.rank.0 as usize].push((start, end));
    }
    let window = to.saturating_since(from);
    compute
        .iter_mut()
        .zip(communication.iter_mut())
        .map(|(compute, communication)| {
            let compute_time = union_length(compute);
            let communication_time = union_length(communication);
            compute.append(communication);
            let busy = union_length(compute);
            RankBreakdown {
                compute: compute_time,
                exposed_communication: busy.saturating_sub(compute_time),
                idle: window.saturating_sub(busy),
                communication: communication_time,
            }
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
    fn union_counts_overlap_once() {
        let mut intervals = vec![(t(5), t(8)), (t(0), t(2)), (t(1), t(3)), (t(8), t(9))];
        assert_eq!(union_length(&mut intervals), SimDuration::from_us(7));
        assert_eq!(union_length(&mut []), SimDuration::ZERO);
    }
}
