//! Capacity windows: links degraded or down for a while, once or periodically (a flapping
//! NIC), as the topology lists them ([`topology::LinkWindow`]).
//!
//! A link's capacity at time `t` is its capacity as built times the factor of every window
//! open on it at `t` (0 while one holds it down). When a window opens or closes, the links it
//! holds take their new capacity and the flows on them are re-filled (whole components: a
//! link whose capacity rose may free flows frozen at any level). A flow on a link that is
//! down runs at rate 0 and has no completion until the link is back; it does not re-route
//! (a transport retransmits on its connection; a link that stays down longer than the
//! transport's retry budget is a failure, which scenarios refuse as a window).
//!
//! Only one change is pending at a time, and only while flows are on their links: a change
//! due when the network is idle is applied at its next event (the capacities a time implies
//! do not depend on the changes before it), so a periodic window never keeps a finished run
//! going.

use topology::{LinkId, LinkWindow, Topology};
use units::SimDuration;

use crate::network::{NetContext, NetworkError};

use super::event::FlowEvent;
use super::flows::{Flows, GroupTiming};

/// The windows of a topology and the state of their links (see the module documentation).
#[derive(Debug, Default)]
pub(super) struct Windows {
    list: Vec<LinkWindow>,
    /// Every link some window holds, each once, in id order.
    links: Vec<LinkId>,
    /// A [`FlowEvent::Capacity`] is scheduled.
    pending: bool,
    /// No window opens or closes after the last capacities applied.
    exhausted: bool,
    /// Scratch: the links whose capacity changed.
    changed: Vec<LinkId>,
    /// Scratch: the product of the open windows' factors per link, by link id (1 where none).
    factors: Vec<f64>,
}

impl Windows {
    /// The topology's windows, none applied yet.
    pub(super) fn new(topology: &Topology) -> Self {
        let list = topology.windows().to_vec();
        let mut links: Vec<LinkId> = list.iter().flat_map(|w| w.links.iter().copied()).collect();
        links.sort_unstable_by_key(|link| link.0);
        links.dedup();
        let factors = if list.is_empty() { Vec::new() } else { vec![1.0; topology.link_count()] };
        Windows { list, links, pending: false, exhausted: false, changed: Vec::new(), factors }
    }

    /// Whether there is nothing left to apply (no windows, or none changes any more).
    #[inline]
    pub(super) fn idle(&self) -> bool {
        // Most runs have no window: that test first (every network event asks).
        self.list.is_empty() || self.pending || self.exhausted
    }

    /// Before any other event of the network: brings the capacities up to `now` and schedules
    /// the next change, unless one is already scheduled.
    #[inline]
    pub(super) fn catch_up(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        groups: &mut impl GroupTiming,
    ) -> Result<(), NetworkError> {
        if self.idle() {
            return Ok(());
        }
        self.apply(flows, context, groups)?;
        self.schedule_next(context)
    }

    /// The scheduled change is due: applies it, and schedules the next while flows are on
    /// their links (an idle network catches up at its next event instead).
    pub(super) fn change_due(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        groups: &mut impl GroupTiming,
    ) -> Result<(), NetworkError> {
        self.pending = false;
        self.apply(flows, context, groups)?;
        if flows.solver.active_flows() > 0 { self.schedule_next(context) } else { Ok(()) }
    }

    /// Sets every held link to its capacity at `now`; re-fills the flows on those that changed.
    fn apply(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        groups: &mut impl GroupTiming,
    ) -> Result<(), NetworkError> {
        let time = context.now().since_start();
        let mut changed = std::mem::take(&mut self.changed);
        changed.clear();
        // The open windows' factors, multiplied per link: one pass over each open window's
        // links, whatever the number of windows.
        for window in self.list.iter().filter(|window| window.is_open(time)) {
            for link in &window.links {
                self.factors[link.0 as usize] *= window.factor;
            }
        }
        for &link in &self.links {
            let factor = std::mem::replace(&mut self.factors[link.0 as usize], 1.0);
            let capacity = flows.solver.nominal(link) * factor;
            if capacity != flows.solver.capacity(link) {
                flows.solver.set_capacity(link, capacity);
                if flows.solver.is_busy(link) {
                    changed.push(link);
                }
            }
        }
        let refilled =
            if changed.is_empty() { Ok(()) } else { flows.request_refill(context, &changed, groups) };
        self.changed = changed;
        refilled
    }

    /// Schedules the next time a window opens or closes, if any.
    fn schedule_next(&mut self, context: &mut NetContext<'_, FlowEvent>) -> Result<(), NetworkError> {
        let now = context.now();
        let time = now.since_start();
        match self.list.iter().filter_map(|window| window.next_change(time)).min() {
            Some(next) => {
                let delay = SimDuration::from_ps(next.as_ps() - time.as_ps());
                context.wake_after(delay, FlowEvent::Capacity)?;
                self.pending = true;
            }
            None => self.exhausted = true,
        }
        Ok(())
    }
}
