//! Host dispatch: a rank's host thread issues its kernels one after another, each costing host
//! time (framework dispatch and the CUDA launch call), and the GPU cannot start a kernel before
//! it has been issued. Short kernels therefore leave the GPU waiting on the host: the step is
//! host-bound.
//!
//! [`issue`] is the closed form for one in-order stream: kernel `i` is issued at
//! `issue_i = (i + 1) * cost` and starts at `start_i = max(end_{i-1}, issue_i)`. Under CUDA
//! graphs the cost is zero ([`crate::ComputeModel::host_cost_per_kernel`]) and every kernel
//! starts when its predecessor ends. A host that synchronizes after every kernel
//! (`host-synchronous = true`: Chainer's `TimerHook`, `CUDA_LAUNCH_BLOCKING=1`) issues the next
//! only then: [`issue_synchronous`], `start_i = end_{i-1} + cost`, so the step is the sum of
//! `cost + duration` over its kernels.
//!
//! ```
//! use sim_core::units::SimDuration;
//! use workloads::dispatch::issue;
//!
//! let us = SimDuration::from_us;
//! // Three 5 us kernels issued at 10 us each: the GPU waits for the host.
//! let schedule = issue(&[us(5), us(5), us(5)], us(10))?;
//! assert_eq!(schedule.starts, [us(10), us(20), us(30)]);
//! assert_eq!(schedule.end, us(35));
//! assert_eq!(schedule.host_bound, us(10)); // two 5 us gaps after the first kernel
//! # Ok::<(), sim_core::units::TimeOverflow>(())
//! ```

use sim_core::units::{SimDuration, TimeOverflow};

/// When a rank's kernels run if one host thread issues them in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// GPU start of each kernel, from the moment the host begins issuing.
    pub starts: Vec<SimDuration>,
    /// When the last kernel ends (zero without kernels).
    pub end: SimDuration,
    /// GPU time spent waiting for the host between kernels (not counting the wait for the
    /// first kernel, which overlaps whatever preceded the stream).
    pub host_bound: SimDuration,
}

/// [`issue`] (or [`issue_synchronous`] when the model's host synchronizes after every kernel)
/// at the model's host cost per kernel (`dispatch-overhead`, or nothing under CUDA graphs):
/// what a lowering calls for each rank's in-order stream.
pub fn issue_with(model: &crate::ComputeModel, durations: &[SimDuration]) -> Result<Schedule, TimeOverflow> {
    if model.host_synchronous {
        issue_synchronous(durations, model.host_cost_per_kernel())
    } else {
        issue(durations, model.host_cost_per_kernel())
    }
}

/// The start times of kernels of `durations` when the host waits for each kernel to finish
/// before it spends `cost` issuing the next: `start_i = end_{i-1} + cost`, the end is
/// `sum(cost + duration_i)`, and every gap after the first kernel is host-bound time.
pub fn issue_synchronous(durations: &[SimDuration], cost: SimDuration) -> Result<Schedule, TimeOverflow> {
    let mut starts = Vec::with_capacity(durations.len());
    let mut end = SimDuration::ZERO;
    for &duration in durations {
        let start = end.checked_add(cost)?;
        starts.push(start);
        end = start.checked_add(duration)?;
    }
    let gaps = durations.len().saturating_sub(1) as u64;
    let host_bound = cost.checked_mul(gaps)?;
    Ok(Schedule { starts, end, host_bound })
}

/// The start times of kernels of `durations`, in issue order, when the host spends `cost` on
/// each before the GPU may start it: `start_i = max(end_{i-1}, (i + 1) * cost)`.
pub fn issue(durations: &[SimDuration], cost: SimDuration) -> Result<Schedule, TimeOverflow> {
    let mut starts = Vec::with_capacity(durations.len());
    let mut issued = SimDuration::ZERO;
    let mut end = SimDuration::ZERO;
    let mut host_bound = SimDuration::ZERO;
    for (index, &duration) in durations.iter().enumerate() {
        issued = issued.checked_add(cost)?;
        let start = if issued > end {
            if index > 0 {
                host_bound = host_bound.checked_add(SimDuration::from_ps(issued.as_ps() - end.as_ps()))?;
            }
            issued
        } else {
            end
        };
        starts.push(start);
        end = start.checked_add(duration)?;
    }
    Ok(Schedule { starts, end, host_bound })
}

/// How far apart one host thread issued its kernels, over the intervals between consecutive
/// launch calls (an interval across a synchronizing call is left out: the host was waiting
/// for the GPU, not dispatching).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchIntervals {
    /// Intervals measured.
    pub intervals: usize,
    /// 10th percentile.
    pub p10: SimDuration,
    /// Lower quartile: the dispatch cost estimate. When the host is what limits the step it
    /// issues back to back, one operator after another; longer intervals hold host work
    /// between operators (Python, data loading, logging).
    pub p25: SimDuration,
    /// Median.
    pub median: SimDuration,
    /// Upper quartile.
    pub p75: SimDuration,
}

/// One host thread's runtime calls, in start order, as the interval statistics need them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostCall {
    /// A kernel (or copy, or memset) launch starting at this time (ns).
    Launch(u64),
    /// A call that waits for the GPU.
    Synchronize,
}

/// Launch-interval statistics over `threads` (each one thread's calls in start order); `None`
/// without two consecutive launches anywhere.
pub fn launch_intervals(threads: &[Vec<HostCall>]) -> Option<LaunchIntervals> {
    let mut gaps: Vec<u64> = Vec::new();
    for calls in threads {
        let mut previous: Option<u64> = None;
        for call in calls {
            match *call {
                HostCall::Launch(start) => {
                    if let Some(before) = previous {
                        gaps.push(start.saturating_sub(before));
                    }
                    previous = Some(start);
                }
                HostCall::Synchronize => previous = None,
            }
        }
    }
    if gaps.is_empty() {
        return None;
    }
    gaps.sort_unstable();
    let at = |fraction: f64| {
        let index = ((gaps.len() - 1) as f64 * fraction).round() as usize;
        SimDuration::from_ns(gaps[index])
    };
    Some(LaunchIntervals {
        intervals: gaps.len(),
        p10: at(0.1),
        p25: at(0.25),
        median: at(0.5),
        p75: at(0.75),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(value: u64) -> SimDuration {
        SimDuration::from_us(value)
    }

    #[test]
    fn long_kernels_hide_the_host_and_short_ones_expose_it() {
        // GPU-bound: after the first issue the queue never drains.
        let schedule = issue(&[us(50), us(50), us(50)], us(10)).unwrap();
        assert_eq!(schedule.starts, [us(10), us(60), us(110)]);
        assert_eq!((schedule.end, schedule.host_bound), (us(160), SimDuration::ZERO));
        // Host-bound: the step takes the host's time plus the last kernel.
        let short = vec![us(2); 100];
        let schedule = issue(&short, us(10)).unwrap();
        assert_eq!(schedule.end, us(1000 + 2));
        assert_eq!(schedule.host_bound, us(99 * 8));
        // Mixed: a long kernel lets the host run ahead, the short ones after it catch up.
        let schedule = issue(&[us(100), us(1), us(1), us(1)], us(10)).unwrap();
        assert_eq!(schedule.starts, [us(10), us(110), us(111), us(112)]);
    }

    #[test]
    fn cuda_graphs_remove_the_host_cost() {
        let graphs = crate::ComputeModel { cuda_graphs: true, ..Default::default() };
        assert_eq!(issue_with(&graphs, &[us(3), us(4)]).unwrap().end, us(7));
        let eager = crate::ComputeModel::default();
        assert_eq!(issue_with(&eager, &[us(3)]).unwrap().starts, [SimDuration::from_ns(18_500)]);
        let schedule = issue(&[us(3), us(4)], SimDuration::ZERO).unwrap();
        assert_eq!(schedule.starts, [SimDuration::ZERO, us(3)]);
        assert_eq!((schedule.end, schedule.host_bound), (us(7), SimDuration::ZERO));
        assert_eq!(issue(&[], us(5)).unwrap().end, SimDuration::ZERO);
    }

    #[test]
    fn a_synchronous_host_adds_its_cost_to_every_kernel() {
        // Long kernels no longer hide the host: 3 x (10 + 50) us.
        let schedule = issue_synchronous(&[us(50), us(50), us(50)], us(10)).unwrap();
        assert_eq!(schedule.starts, [us(10), us(70), us(130)]);
        assert_eq!((schedule.end, schedule.host_bound), (us(180), us(20)));
        // The closed form: the sum of cost + duration, whatever the mix.
        let durations = [us(100), us(1), us(7), us(1)];
        let schedule = issue_synchronous(&durations, us(10)).unwrap();
        assert_eq!(schedule.end, us(4 * 10 + 109));
        // Never faster than the asynchronous host; equal when there is one kernel.
        assert!(schedule.end > issue(&durations, us(10)).unwrap().end);
        assert_eq!(issue_synchronous(&[us(5)], us(3)).unwrap(), issue(&[us(5)], us(3)).unwrap());
        let model = crate::ComputeModel { host_synchronous: true, ..Default::default() };
        assert_eq!(
            issue_with(&model, &[us(3), us(4)]).unwrap().end,
            SimDuration::from_ns(2 * 18_500 + 7_000)
        );
        assert_eq!(issue_synchronous(&[], us(5)).unwrap().end, SimDuration::ZERO);
    }

    #[test]
    fn launch_intervals_skip_synchronizations_and_give_quartiles() {
        use HostCall::{Launch, Synchronize};
        let thread =
            vec![Launch(0), Launch(10_000), Launch(20_000), Synchronize, Launch(900_000), Launch(950_000)];
        let other = vec![Launch(0), Launch(30_000)];
        let stats = launch_intervals(&[thread, other]).unwrap();
        // Intervals 10, 10, 50, 30 us; the 870 us wait across the synchronization is left out.
        assert_eq!(stats.intervals, 4);
        assert_eq!((stats.p10, stats.p25, stats.median), (us(10), us(10), us(30)));
        assert_eq!(stats.p75, us(30));
        assert_eq!(launch_intervals(&[vec![Launch(5)]]), None);
    }

    #[test]
    fn overflow_is_an_error() {
        let huge = SimDuration::from_ps(u64::MAX / 2 + 1);
        assert!(issue(&[huge, huge], SimDuration::ZERO).is_err());
    }
}
