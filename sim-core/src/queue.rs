//! The deterministic event queue.
//!
//! A binary min-heap keyed by `(time, sequence)`: events at the same instant pop in the order
//! they were scheduled, so the same input always yields the same run. Events are small `Copy`
//! values (ids, not payloads), so pushing and popping allocates nothing once the heap has grown
//! to its working size.
//!
//! Events scheduled with no delay (a completion reported at once) skip the heap: they wait in
//! a first-in first-out list, which pops after the heap's events due at the same instant.
//! That is their `(time, sequence)` order: the heap's events due now were all scheduled before
//! the clock reached now, so before any zero-delay event of this instant; and the clock moves
//! on only once the list is empty.
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

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use units::{SimDuration, SimTime, TimeOverflow};

/// An event with its due time and insertion sequence number. Entries compare by the single
/// integer `time << 64 | sequence`; the halves are stored as two `u64`s so an entry stays 8-byte
/// aligned (24 bytes with a small event instead of the 32 a `u128` field would take).
#[derive(Debug, Clone, Copy)]
struct Entry<E> {
    time: u64,
    sequence: u64,
    event: E,
}

impl<E> Entry<E> {
    fn key(&self) -> u128 {
        (u128::from(self.time) << 64) | u128::from(self.sequence)
    }
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest `(time, sequence)` first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.key().cmp(&self.key())
    }
}

/// A future-event list with a clock: popping an event advances `now` to its time.
#[derive(Debug, Clone)]
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    /// Events due now, scheduled with no delay, in the order they were scheduled.
    due_now: VecDeque<E>,
    next_sequence: u64,
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

    /// An empty queue with room for `capacity` pending events.
    pub fn with_capacity(capacity: usize) -> Self {
        EventQueue {
            heap: BinaryHeap::with_capacity(capacity),
            due_now: VecDeque::new(),
            next_sequence: 0,
            now: SimTime::ZERO,
        }
    }

    /// The time of the last popped event (zero before the first).
    pub fn now(&self) -> SimTime {
        self.now
    }

    /// Number of pending events.
    pub fn len(&self) -> usize {
        self.heap.len() + self.due_now.len()
    }

    /// True if no event is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty() && self.due_now.is_empty()
    }

    /// Schedules `event` `delay` after now and returns its due time. Events can never be
    /// scheduled in the past; past the end of representable time is an error.
    pub fn schedule_after(&mut self, delay: SimDuration, event: E) -> Result<SimTime, TimeOverflow> {
        if delay == SimDuration::ZERO {
            self.due_now.push_back(event);
            return Ok(self.now);
        }
        let time = self.now.checked_add(delay)?;
        self.heap.push(Entry { time: time.as_ps(), sequence: self.next_sequence, event });
        self.next_sequence += 1;
        Ok(time)
    }

    /// Removes the earliest event, advances the clock to its time, and returns both.
    pub fn pop(&mut self) -> Option<(SimTime, E)> {
        let heap_due_now = self.heap.peek().is_some_and(|entry| entry.time == self.now.as_ps());
        if !heap_due_now && let Some(event) = self.due_now.pop_front() {
            return Some((self.now, event));
        }
        let entry = self.heap.pop()?;
        self.now = SimTime::from_ps(entry.time);
        Some((self.now, entry.event))
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
        /// Scheduling while popping (zero delays included) gives the `(time, insertion)` order
        /// of a plain sorted list.
        #[test]
        fn zero_delays_keep_time_then_insertion_order(
            plan in proptest::collection::vec(proptest::collection::vec(0u64..4, 0..4), 1..60)
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
