//! Utilisation over time of chosen links: the counter tracks of a Chrome trace.
//!
//! A link's load is the sum of the rates of the flows on it, so it changes only where a flow's
//! rate does: when a flow alone on its links joins them at its bottleneck's rate, when a
//! re-fill gives flows new rates, and when flows leave. [`SeriesRecorder`] hears of each of
//! those changes from `flows` (never from the solver itself) as the flow's new rate, keeps the
//! rate it last counted for every flow, and adds the difference to every chosen link of the
//! flow's route.
//!
//! Memory is bounded by the choice: one entry per link of the topology (which links are
//! chosen), one rate per flow slot, and one point per change of a chosen link's load (changes
//! at one instant collapse into one point), so a caller records the few links it will show
//! (the busiest ones, found by a first run that counts bytes), not every link of a 16,384-GPU
//! fabric. Recording never changes a rate or an event: the run's times are the same with and
//! without it.

use topology::{LinkId, Route};

use super::maxmin::SpreadLink;
use units::SimTime;

/// The utilisation over time of one link: a piecewise-constant function of time.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkSeries {
    /// The link (an index into the topology's links).
    pub link: LinkId,
    /// `(time, utilisation)` points in time order: from each point's time until the next
    /// point's, the link carries that fraction of its capacity (0 to 1: the sum of the
    /// max-min fair rates of the flows on it over its capacity). The first point is at time
    /// zero, at 0; the last value holds until the run ends.
    pub points: Vec<(SimTime, f64)>,
}

/// No slot: a link that is not recorded.
const UNRECORDED: u32 = u32::MAX;

/// The recorder of [`super::FlowNetwork::recording_link_series`] (see the module
/// documentation).
#[derive(Debug)]
pub(super) struct SeriesRecorder {
    /// Per link of the topology: its index in `series`, or [`UNRECORDED`].
    slot: Vec<u32>,
    /// Per recorded link: its capacity in bytes per second.
    capacity: Vec<f64>,
    /// Per recorded link: the sum of the counted rates of the flows on it.
    load: Vec<f64>,
    /// Per recorded link: flows with a non-zero counted rate on it (at 0 the load is exactly
    /// 0, whatever rounding the additions left).
    carrying: Vec<u32>,
    /// Per flow slot: the rate last counted for it (0 when it is off its links).
    counted: Vec<f64>,
    /// Per recorded link: its points so far.
    series: Vec<LinkSeries>,
}

impl SeriesRecorder {
    /// Records `links` (each once, in the order given) of a topology of `link_count` links of
    /// `capacity(link)` bytes per second.
    pub(super) fn new(links: &[LinkId], link_count: usize, capacity: impl Fn(LinkId) -> f64) -> Self {
        let mut slot = vec![UNRECORDED; link_count];
        let mut recorded = Vec::new();
        for &link in links {
            if let Some(entry) = slot.get_mut(link.0 as usize)
                && *entry == UNRECORDED
            {
                *entry = recorded.len() as u32;
                recorded.push(link);
            }
        }
        SeriesRecorder {
            slot,
            capacity: recorded.iter().map(|&link| capacity(link)).collect(),
            load: vec![0.0; recorded.len()],
            carrying: vec![0; recorded.len()],
            counted: Vec::new(),
            series: recorded
                .into_iter()
                .map(|link| LinkSeries { link, points: vec![(SimTime::ZERO, 0.0)] })
                .collect(),
        }
    }

    /// Flow `id` on `route` runs at `rate` bytes per second from `now` on (0: it left its
    /// links); a group flow (on `spread`, its route empty) carries its rate per unit of weight
    /// times its weight on each link.
    #[inline]
    pub(super) fn rate(&mut self, now: SimTime, id: u32, route: &Route, spread: &[SpreadLink], rate: f64) {
        let index = id as usize;
        if self.counted.len() <= index {
            self.counted.resize(index + 1, 0.0);
        }
        let before = self.counted[index];
        if before == rate {
            return;
        }
        self.counted[index] = rate;
        let links = route
            .iter()
            .map(|&link| (link, 1.0))
            .chain(spread.iter().map(|entry| (entry.link, entry.weight)));
        for (link, weight) in links {
            let Some(&slot) = self.slot.get(link.0 as usize) else { continue };
            if slot == UNRECORDED {
                continue;
            }
            let s = slot as usize;
            if before == 0.0 {
                self.carrying[s] += 1;
            } else if rate == 0.0 {
                self.carrying[s] = self.carrying[s].saturating_sub(1);
            }
            self.load[s] = if self.carrying[s] == 0 { 0.0 } else { self.load[s] + (rate - before) * weight };
            let utilisation = (self.load[s] / self.capacity[s]).clamp(0.0, 1.0);
            push(&mut self.series[s].points, now, utilisation);
        }
    }

    /// The series recorded so far, in the order the links were chosen.
    pub(super) fn series(&self) -> &[LinkSeries] {
        &self.series
    }
}

/// Appends `(now, value)` to `points`: a change at the same instant as the last point replaces
/// it, and a point that repeats the value before it is left out.
fn push(points: &mut Vec<(SimTime, f64)>, now: SimTime, value: f64) {
    if let Some(&(last_time, _)) = points.last()
        && last_time == now
    {
        points.pop();
    }
    if points.last().is_some_and(|&(_, last)| last == value) {
        return;
    }
    points.push((now, value));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_at_one_instant_collapse_and_repeats_are_left_out() {
        let mut points = vec![(SimTime::ZERO, 0.0)];
        let t = |ps| SimTime::from_ps(ps);
        push(&mut points, t(5), 0.5);
        push(&mut points, t(5), 1.0);
        push(&mut points, t(7), 1.0);
        push(&mut points, t(9), 0.0);
        push(&mut points, t(9), 1.0);
        // Back to 1.0 at 9 after a passing 0: no change at all.
        assert_eq!(points, vec![(t(0), 0.0), (t(5), 1.0)]);
    }
}
