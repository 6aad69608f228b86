//! Link conditions that change while a job runs: capacity windows (a link degraded or down
//! for a while, once or periodically: a NIC that flaps) and per-link latency jitter. The
//! topology only carries them; the `flow` and `packet-steps` models of `sim-core` apply them
//! (the analytical model has no link state over time, and scenarios refuse them there).

use units::SimDuration;

use crate::LinkId;

/// A link's capacity scaled by `factor` from `start` for `length`, and again every `every`
/// after that if given (a flapping NIC), times measured from the start of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkWindow {
    /// The links hit (both directions of a cable are listed).
    pub links: Vec<LinkId>,
    /// The capacity factor during the window: in (0, 1], or 0 for a link down (its flows
    /// stall and resume when it is back).
    pub factor: f64,
    /// When the first window opens.
    pub start: SimDuration,
    /// How long each window lasts (more than zero).
    pub length: SimDuration,
    /// The period of a repeating window (longer than `length`); `None`: once.
    pub every: Option<SimDuration>,
}

impl LinkWindow {
    /// Whether the window is open at `time` (from the start of the run): in `[start + k
    /// every, start + k every + length)` for some whole `k >= 0`.
    pub fn is_open(&self, time: SimDuration) -> bool {
        let Some(since) = time.as_ps().checked_sub(self.start.as_ps()) else { return false };
        let offset = match self.every {
            Some(every) if every.as_ps() > 0 => since % every.as_ps(),
            _ => since,
        };
        offset < self.length.as_ps()
    }

    /// The first time after `time` at which the window opens or closes; `None` if it never
    /// changes again.
    pub fn next_change(&self, time: SimDuration) -> Option<SimDuration> {
        let (start, length, now) = (self.start.as_ps(), self.length.as_ps(), time.as_ps());
        if now < start {
            return Some(self.start);
        }
        let since = now - start;
        match self.every {
            Some(every) if every.as_ps() > 0 => {
                let period = every.as_ps();
                let base = since - since % period;
                let offset = since % period;
                let next = if offset < length { base + length } else { base + period };
                start.checked_add(next).map(SimDuration::from_ps)
            }
            _ => (since < length).then(|| SimDuration::from_ps(start + length)),
        }
    }
}

/// The shape of the latency jitter's draws (each of mean 1 and coefficient of variation
/// `cv`; see `sim_core::variability` for the parameterisations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JitterShape {
    /// `exp(N(mu, sigma^2))`, `sigma^2 = ln(1 + cv^2)`.
    Lognormal,
    /// Shape `1 / cv^2`, scale `cv^2`.
    Gamma,
    /// `N(1, cv^2)` truncated at zero.
    Normal,
}

/// Extra latency on every link crossing: each flow draws, for each link of its route that
/// `on` marks, `mean` times a draw of mean 1 and coefficient of variation `cv` (queueing in
/// switches, which the fluid model has no other way to show), from a stream seeded by `seed`.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyJitter {
    /// Mean extra latency per link crossed.
    pub mean: SimDuration,
    /// Coefficient of variation of the draws (0: every crossing adds exactly `mean`).
    pub cv: f64,
    /// The draws' distribution.
    pub shape: JitterShape,
    /// Which links add jitter, by link id.
    pub on: Vec<bool>,
    /// Seed of the draws.
    pub seed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(start: u64, length: u64, every: Option<u64>) -> LinkWindow {
        LinkWindow {
            links: vec![LinkId(0)],
            factor: 0.0,
            start: SimDuration::from_us(start),
            length: SimDuration::from_us(length),
            every: every.map(SimDuration::from_us),
        }
    }

    #[test]
    fn a_single_window_opens_and_closes_once() {
        let w = window(10, 5, None);
        let at = |us| w.is_open(SimDuration::from_us(us));
        assert!(!at(9) && at(10) && at(14) && !at(15) && !at(100));
        assert_eq!(w.next_change(SimDuration::ZERO), Some(SimDuration::from_us(10)));
        assert_eq!(w.next_change(SimDuration::from_us(10)), Some(SimDuration::from_us(15)));
        assert_eq!(w.next_change(SimDuration::from_us(15)), None);
    }

    #[test]
    fn a_periodic_window_repeats_every_period() {
        let w = window(10, 5, Some(20));
        let at = |us| w.is_open(SimDuration::from_us(us));
        assert!(at(10) && !at(15) && !at(29) && at(30) && at(34) && !at(35) && at(50));
        assert_eq!(w.next_change(SimDuration::from_us(12)), Some(SimDuration::from_us(15)));
        assert_eq!(w.next_change(SimDuration::from_us(15)), Some(SimDuration::from_us(30)));
        assert_eq!(w.next_change(SimDuration::from_us(30)), Some(SimDuration::from_us(35)));
    }
}
