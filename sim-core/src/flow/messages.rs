//! Collectives message by message (the `packet-steps` behaviour, and under `flow` the
//! algorithms without a steady-state form): each collective runs its [`Schedule`], every
//! message of a step its own flow.
//!
//! Each member posts the messages of a step; a message's flow starts once both its sender and
//! its receiver have reached that step, and a member moves on once all its messages of the
//! step are done, exactly the per-host step dependencies of SimGrid's reference harness. A
//! step with a floor ([`Schedule::step_floor`]) holds a message that finishes early until the
//! floor has passed since it started.
//!
//! Invariants: a member is in one step at a time and counts the messages of it still pending
//! (both ends of a message count it, and hear of it once); a message's flow starts exactly
//! once, when the later of its two ends reaches the step; the collective completes, once,
//! when the last member of the last lane has passed its last step, and its slot is then free
//! for the next run.

use units::SimDuration;

use crate::network::{Completion, NetContext, NetworkError};
use crate::schedule::{Message, Schedule};

use super::event::{FlowEvent, Owner};
use super::flows::Flows;

/// The collectives running message by message, and the scratch they share.
#[derive(Debug, Default)]
pub(super) struct Runs {
    /// Each running collective, by id (`None`: a free slot).
    slots: Vec<Option<CollectiveRun>>,
    /// Free slots.
    free: Vec<u32>,
    /// Scratch for a member's messages of a step.
    scratch_messages: Vec<Message>,
    /// Messages held until their step floor has passed, as (run, lane, from, to), by the
    /// `FlowEvent::MessageDue` that waits for them (`None`: a free place).
    held: Vec<Option<(u32, u32, u32, u32)>>,
    /// Free places of `held`.
    free_held: Vec<u32>,
}

/// A collective in progress: where each member of each lane is in the schedule.
#[derive(Debug)]
struct CollectiveRun {
    schedule: Schedule,
    token: Completion,
    /// Step each member has entered (`NOT_ENTERED` before), indexed lane * members + position.
    step: Vec<u32>,
    /// Messages of its current step each member still waits for.
    pending: Vec<u32>,
    /// Members (over all lanes) that have finished every step.
    finished_members: usize,
    /// Members of each lane (every lane is a permutation of the same group), kept here so
    /// that a message's end finds its member's counters without reading the schedule.
    per_lane: usize,
}

const NOT_ENTERED: u32 = u32::MAX;

impl Runs {
    /// Whether a collective is running message by message.
    pub(super) fn running(&self) -> bool {
        self.slots.len() > self.free.len()
    }

    /// Starts `schedule` message by message, after `delay` (its launch and protocol latencies);
    /// completes `token` when every member has passed its last step (at once, after `delay`,
    /// if it has no step).
    pub(super) fn start(
        &mut self,
        context: &mut NetContext<'_, FlowEvent>,
        token: Completion,
        schedule: Schedule,
        delay: SimDuration,
    ) -> Result<(), NetworkError> {
        let members = schedule.lanes().iter().map(Vec::len).sum::<usize>();
        if schedule.steps() == 0 {
            return Ok(context.complete_after(delay, token)?);
        }
        let per_lane = schedule.lanes().first().map_or(0, Vec::len);
        let run = CollectiveRun {
            schedule,
            token,
            step: vec![NOT_ENTERED; members],
            pending: vec![0; members],
            finished_members: 0,
            per_lane,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = Some(run);
                id
            }
            None => {
                self.slots.push(Some(run));
                (self.slots.len() - 1) as u32
            }
        };
        Ok(context.wake_after(delay, FlowEvent::Begin { run: id })?)
    }

    /// Every member of every lane of `run` enters step 0.
    #[inline]
    pub(super) fn begin(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        run: u32,
    ) -> Result<(), NetworkError> {
        let lanes = self.run(run).schedule.lanes().len();
        let per_lane = self.run(run).per_lane;
        for lane in 0..lanes {
            for position in 0..per_lane {
                self.enter_step(flows, context, run, lane as u32, position as u32, 0)?;
            }
        }
        Ok(())
    }

    fn run(&self, id: u32) -> &CollectiveRun {
        self.slots[id as usize]
            .as_ref()
            .expect("a message's collective is running until its last member finishes")
    }

    fn run_mut(&mut self, id: u32) -> &mut CollectiveRun {
        self.slots[id as usize]
            .as_mut()
            .expect("a message's collective is running until its last member finishes")
    }

    /// Member `position` of `lane` enters `step`: posts its messages, starting those whose
    /// partner is already there; steps without messages are passed straight through.
    fn enter_step(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        run: u32,
        lane: u32,
        position: u32,
        mut step: u32,
    ) -> Result<(), NetworkError> {
        // The run and the scratch as separate borrows: the loop allocates nothing, and starts
        // each flow as it finds it (in the order of the member's messages).
        let Runs { slots, free, scratch_messages: messages, .. } = self;
        let state = slots[run as usize]
            .as_mut()
            .expect("a message's collective is running until its last member finishes");
        let members = state.per_lane;
        loop {
            let index = lane as usize * members + position as usize;
            if step == state.schedule.steps() {
                state.step[index] = step;
                state.finished_members += 1;
                if state.finished_members == state.step.len() {
                    let token = state.token;
                    slots[run as usize] = None;
                    free.push(run);
                    context.complete_after(SimDuration::ZERO, token)?;
                }
                return Ok(());
            }
            messages.clear();
            state.schedule.messages(lane as usize, step, position, messages);
            let count = messages.len() as u32;
            if count > 0 {
                // Start the messages whose other end has already reached this step; the others
                // start when it does.
                let due = context.now().checked_add(state.schedule.step_floor())?;
                let (bytes, den) = state.schedule.fraction();
                let lane_ranks = &state.schedule.lanes()[lane as usize];
                let base = lane as usize * members;
                for message in messages.iter() {
                    if state.step[base + message.peer as usize] == step {
                        let size = bytes.as_f64() * message.num as f64 / den as f64;
                        let (from, to) =
                            if message.send { (position, message.peer) } else { (message.peer, position) };
                        let (src, dst) = (lane_ranks[from as usize], lane_ranks[to as usize]);
                        flows.start_flow(
                            context,
                            src,
                            dst,
                            size,
                            Owner::Message { run, lane, from, to, due },
                        )?;
                    }
                }
            }
            state.step[index] = step;
            state.pending[index] = count;
            if count == 0 {
                step += 1;
                continue;
            }
            return Ok(());
        }
    }

    /// Holds the message from `from` to `to` of `lane` of `run` until its step floor has
    /// passed; returns its place, for its `FlowEvent::MessageDue`.
    pub(super) fn hold(&mut self, run: u32, lane: u32, from: u32, to: u32) -> u32 {
        let message = Some((run, lane, from, to));
        match self.free_held.pop() {
            Some(place) => {
                self.held[place as usize] = message;
                place
            }
            None => {
                self.held.push(message);
                (self.held.len() - 1) as u32
            }
        }
    }

    /// The message held at `place` ([`Runs::hold`]), whose floor has passed; the place is free
    /// again.
    pub(super) fn release(&mut self, place: u32) -> (u32, u32, u32, u32) {
        self.free_held.push(place);
        self.held[place as usize].take().expect("a held message is released once, by its own event")
    }

    /// One of `position`'s messages of its current step is done.
    #[inline]
    pub(super) fn message_done(
        &mut self,
        flows: &mut Flows<'_>,
        context: &mut NetContext<'_, FlowEvent>,
        run: u32,
        lane: u32,
        position: u32,
    ) -> Result<(), NetworkError> {
        let state = self.run_mut(run);
        let index = lane as usize * state.per_lane + position as usize;
        state.pending[index] -= 1;
        if state.pending[index] == 0 {
            let next = state.step[index] + 1;
            self.enter_step(flows, context, run, lane, position, next)?;
        }
        Ok(())
    }
}
