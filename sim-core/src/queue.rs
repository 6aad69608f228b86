//! The deterministic event queue.
//!
//! Events pop in `(time, sequence)` order: by due time, and events due at the same instant in
//! the order they were scheduled, so the same input always yields the same run. Events are
//! small `Copy` values (ids, not payloads), so pushing and popping allocates nothing once the
//! buckets have grown to their working size.
//!
//! The queue is a radix heap (Ahuja, Mehlhorn, Orlin and Tarjan, 1990), which fits a
//! simulator's clock: no event is ever scheduled before the last one popped. A pending event
//! waits in the bucket of the highest bit in which its time differs from the clock; events due
//! now wait, in the order they were scheduled, in a first-in first-out list. When that list is
//! empty, the lowest non-empty bucket is emptied: the clock moves to its earliest time and its
//! events are dealt into lower buckets (or the list), keeping their order. Every bucket thus
//! keeps its events in the order they were scheduled, which makes ties pop in that order, and
//! each event moves down a few buckets in all instead of sifting through a binary heap on
//! every push and pop. A bucket whose events are all due at one time (a collective step's
//! messages) becomes the list as it is, without being dealt.
//!
//! ```
//! use sim_core::queue::EventQueue;
//! use sim_core::units::SimDuration;
//! let mut queue = EventQueue::new();
//! queue.schedule_after(SimDuration::from_us(2), 'b').unwrap();
//! queue.schedule_after(SimDuration::from_us(1), 'a').unwrap();
//! queue.schedule_after(SimDuration::from_us(2), 'c').unwrap();
//! let order: Vec<char> = std::iter::from_fn(|| queue.pop().map(|(_, event)| event)).collect();
//! assert_eq!(order, ['a', 'b', 'c']);
//! ```

use units::{SimDuration, SimTime, TimeOverflow};

/// Buckets: one per bit of a `u64` time.
const BUCKETS: usize = 64;

/// A future-event list with a clock: popping an event advances `now` to its time.
#[derive(Debug, Clone)]
pub struct EventQueue<E> {
    /// Events due now (with their time, `now`), in the order they were scheduled:
    /// `due_now[next_due..]` (a vector read from the front and cleared once read, cheaper than
    /// a ring buffer's wrapping). Stored as a bucket is, so that a bucket whose events are all
    /// due at one time becomes the list without a copy.
    due_now: Vec<(u64, E)>,
    /// The first event of `due_now` not popped yet.
    next_due: usize,
    /// Bucket `b`: (time, event) of the events whose time's highest bit that differs from
    /// `now`'s is bit `b`, in the order they were scheduled. An array, so that a bucket's
    /// index (a bit of a `u64`) needs no bounds check.
    buckets: [Vec<(u64, E)>; BUCKETS],
    /// Bit `b` set when bucket `b` is not empty.
    occupied: u64,
    /// Pending events in all.
    len: usize,
    now: SimTime,
}

impl<E: Copy> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: Copy> EventQueue<E> {
    /// An empty queue at time zero.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty queue with room for `capacity` events due at once.
    pub fn with_capacity(capacity: usize) -> Self {
        EventQueue {
            due_now: Vec::with_capacity(capacity),
            next_due: 0,
            buckets: std::array::from_fn(|_| Vec::new()),
            occupied: 0,
            len: 0,
            now: SimTime::ZERO,
        }
    }

    /// The time of the last popped event (zero before the first).
    pub fn now(&self) -> SimTime {
        self.now
    }

    /// Number of pending events.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if no event is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True if another event is due at the current time (all of them wait in the list once
    /// the clock has reached their time).
    pub fn has_due_now(&self) -> bool {
        self.next_due < self.due_now.len()
    }

    /// Schedules `event` `delay` after now and returns its due time. Events can never be
    /// scheduled in the past; past the end of representable time is an error.
    #[inline]
    pub fn schedule_after(&mut self, delay: SimDuration, event: E) -> Result<SimTime, TimeOverflow> {
        let time = self.now.checked_add(delay)?;
        self.insert(time.as_ps(), event);
        self.len += 1;
        Ok(time)
    }

    /// Files `event`, due at `time` (not before now), in the list or its bucket.
    #[inline(always)]
    fn insert(&mut self, time: u64, event: E) {
        let differing = time ^ self.now.as_ps();
        if differing == 0 {
            self.due_now.push((time, event));
        } else {
            // Bit 0 to 63 (`differing` is not 0); the mask, which changes nothing, spares the
            // bounds check.
            let bucket = (u64::BITS - 1 - differing.leading_zeros()) as usize & (BUCKETS - 1);
            self.buckets[bucket].push((time, event));
            self.occupied |= 1 << bucket;
        }
    }

    /// Removes the earliest event, advances the clock to its time, and returns both.
    // Inlined into the engine's loop: the common case is one read of the list of events due
    // now; refilling that list is the separate, rarer [`EventQueue::advance`].
    #[inline]
    pub fn pop(&mut self) -> Option<(SimTime, E)> {
        if self.next_due == self.due_now.len() && !self.advance() {
            return None;
        }
        let (_, event) = *self.due_now.get(self.next_due)?;
        self.next_due += 1;
        self.len -= 1;
        Some((self.now, event))
    }

    /// The list of events due now is empty: moves the clock to the earliest pending event and
    /// lists every event due then. False if no event is pending.
    #[inline(never)]
    fn advance(&mut self) -> bool {
        if self.occupied == 0 {
            return false;
        }
        self.due_now.clear();
        self.next_due = 0;
        // The lowest bucket holds the earliest events: move the clock to the first of them and
        // deal the bucket out again, in order, relative to the new clock.
        let bucket = self.occupied.trailing_zeros() as usize & (BUCKETS - 1);
        self.occupied &= !(1 << bucket);
        let (earliest, latest) = self.buckets[bucket]
            .iter()
            .fold((u64::MAX, 0), |(low, high), &(time, _)| (low.min(time), high.max(time)));
        self.now = SimTime::from_ps(earliest);
        if earliest == latest {
            // All due at once (a collective step's messages, say): the bucket, in the order its
            // events were scheduled, is the list; the emptied list's allocation becomes the
            // bucket's.
            std::mem::swap(&mut self.due_now, &mut self.buckets[bucket]);
        } else {
            let mut events = std::mem::take(&mut self.buckets[bucket]);
            for &(time, event) in &events {
                self.insert(time, event);
            }
            // Keep the bucket's allocation (every event moved to a lower bucket: they all agree
            // with the new clock, one of them, above bit `bucket`, and in it).
            debug_assert!(self.buckets[bucket].is_empty());
            events.clear();
            self.buckets[bucket] = events;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the schedule, events pop in (time, insertion order) and the clock never goes back.
        #[test]
        fn pops_in_time_then_insertion_order(delays in proptest::collection::vec(0u64..50, 1..200)) {
            let mut queue = EventQueue::new();
            for (index, &delay) in delays.iter().enumerate() {
                queue.schedule_after(SimDuration::from_ps(delay), index).unwrap();
            }
            let mut expected: Vec<(u64, usize)> = delays.iter().enumerate().map(|(i, &d)| (d, i)).collect();
            expected.sort();
            let mut popped = Vec::new();
            let mut last = SimTime::ZERO;
            while let Some((time, index)) = queue.pop() {
                prop_assert!(time >= last);
                prop_assert_eq!(queue.now(), time);
                last = time;
                popped.push((time.as_ps(), index));
            }
            prop_assert_eq!(popped, expected);
        }
    }

    proptest! {
        /// Scheduling while popping (zero delays, ties and far-off times included) gives the
        /// `(time, insertion)` order of a plain sorted list.
        #[test]
        fn scheduling_while_popping_keeps_time_then_insertion_order(
            plan in proptest::collection::vec(
                proptest::collection::vec(prop_oneof![0u64..4, 0u64..1 << 40], 0..4),
                1..120,
            )
        ) {
            let mut queue = EventQueue::new();
            // Reference: (time, sequence, id), the earliest removed first.
            let mut reference: Vec<(u64, u64, usize)> = Vec::new();
            let mut sequence = 0;
            let mut next_id = 0;
            let mut schedule = |queue: &mut EventQueue<usize>, reference: &mut Vec<(u64, u64, usize)>, now: u64, delay: u64| {
                queue.schedule_after(SimDuration::from_ps(delay), next_id).unwrap();
                reference.push((now + delay, sequence, next_id));
                sequence += 1;
                next_id += 1;
            };
            schedule(&mut queue, &mut reference, 0, 0);
            schedule(&mut queue, &mut reference, 0, 1);
            for delays in &plan {
                let Some((time, id)) = queue.pop() else { break };
                let earliest = (0..reference.len()).min_by_key(|&i| (reference[i].0, reference[i].1)).unwrap();
                let (expected_time, _, expected_id) = reference.remove(earliest);
                prop_assert_eq!((time.as_ps(), id), (expected_time, expected_id));
                for &delay in delays {
                    schedule(&mut queue, &mut reference, time.as_ps(), delay);
                }
            }
            prop_assert_eq!(queue.len(), reference.len());
        }
    }

    #[test]
    fn a_bucket_due_at_one_time_pops_in_order_before_what_is_scheduled_for_that_time_later() {
        // Five events due at 7 us (one bucket, one time: it becomes the list as it is) and one
        // at 9 us; while the first five are popped, one more is scheduled for now (7 us): it
        // comes after them and before the one at 9 us.
        let mut queue = EventQueue::new();
        for id in 0..5 {
            queue.schedule_after(SimDuration::from_us(7), id).unwrap();
        }
        queue.schedule_after(SimDuration::from_us(9), 9).unwrap();
        assert_eq!(queue.pop(), Some((SimTime::from_ps(7_000_000), 0)));
        queue.schedule_after(SimDuration::ZERO, 5).unwrap();
        let rest: Vec<_> = std::iter::from_fn(|| queue.pop()).collect();
        let ids: Vec<_> = rest.iter().map(|&(_, id)| id).collect();
        assert_eq!(ids, [1, 2, 3, 4, 5, 9]);
        assert_eq!(rest.last().map(|&(time, _)| time), Some(SimTime::from_ps(9_000_000)));
    }

    #[test]
    fn events_due_now_are_visible() {
        let mut queue = EventQueue::new();
        queue.schedule_after(SimDuration::from_us(1), 1).unwrap();
        queue.schedule_after(SimDuration::from_us(1), 2).unwrap();
        assert!(!queue.has_due_now());
        queue.pop();
        assert!(queue.has_due_now());
        queue.pop();
        assert!(!queue.has_due_now());
        queue.schedule_after(SimDuration::ZERO, 3).unwrap();
        assert!(queue.has_due_now());
    }

    #[test]
    fn scheduling_is_relative_to_the_clock() {
        let mut queue = EventQueue::new();
        queue.schedule_after(SimDuration::from_us(5), 1).unwrap();
        queue.pop();
        let due = queue.schedule_after(SimDuration::from_us(1), 2).unwrap();
        assert_eq!(due, SimTime::from_ps(6_000_000));
    }

    #[test]
    fn overflow_is_an_error() {
        let mut queue = EventQueue::new();
        queue.schedule_after(SimDuration::MAX, 1).unwrap();
        queue.pop();
        assert!(queue.schedule_after(SimDuration::from_ps(1), 2).is_err());
    }
}
