//! The flow models' events, and who waits for a flow.
//!
//! Plain types shared by the flow models' parts: the solver's flows carry an [`Owner`], and
//! every part schedules its own [`FlowEvent`]s, which the network's event handler dispatches
//! back to it.

use units::SimTime;

use crate::network::Completion;

/// A timer of the flow model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowEvent {
    /// The flow's first byte has crossed its route: it starts sharing bandwidth.
    Enter {
        /// The flow.
        flow: u32,
    },
    /// Every edge of a steady-state collective has delivered its data, if their common rate has
    /// not changed since (same generation).
    CouplingDone {
        /// The coupling.
        coupling: u32,
        /// Its generation when the event was scheduled.
        generation: u32,
    },
    /// Every edge flow of a steady-state collective enters the network.
    Couple {
        /// The coupling.
        coupling: u32,
    },
    /// A collective's launch overhead is over: its members enter their first step.
    Begin {
        /// The running collective.
        run: u32,
    },
    /// The flow's last byte is due, if its rate has not changed since (same generation).
    Finish {
        /// The flow.
        flow: u32,
        /// Its generation when the event was scheduled.
        generation: u32,
    },
    /// Flows entered or left at this instant: once no other event is due now, the rates of
    /// the flows connected to their links are re-filled, all at once.
    Refill,
    /// A capacity window opens or closes now (see `windows`).
    Capacity,
    /// A collective's message whose flow finished before its schedule's step floor
    /// ([`Schedule::step_floor`](crate::schedule::Schedule::step_floor)) is done now. Which
    /// message it is waits in the message runs' table (`messages`), at `held`: the payload
    /// of the commonest events is two words, and this rare one stays as small, so that every
    /// queued event is 16 bytes instead of 24.
    MessageDue {
        /// Its place in the table of held messages.
        held: u32,
    },
}

/// Who is waiting for a flow.
#[derive(Debug, Clone, Copy)]
pub(super) enum Owner {
    /// A transfer op (or other single completion).
    Single(Completion),
    /// One message of a running collective: sender and receiver positions on a lane, and the
    /// earliest time it may be done (its start plus the schedule's step floor).
    Message {
        /// The running collective.
        run: u32,
        /// The lane.
        lane: u32,
        /// The sender's position.
        from: u32,
        /// The receiver's position.
        to: u32,
        /// The earliest time it may be done.
        due: SimTime,
    },
    /// One edge flow of a steady-state collective.
    Coupled,
}

#[cfg(test)]
mod tests {
    use super::FlowEvent;
    use crate::network::Event;

    #[test]
    fn a_queued_flow_event_takes_16_bytes() {
        // The queue moves every event several times (see `crate::queue`): a 24-byte event
        // (a payload of four words) made a 1,024-host ring 4% slower.
        assert_eq!(std::mem::size_of::<Event<FlowEvent>>(), 16);
    }
}
