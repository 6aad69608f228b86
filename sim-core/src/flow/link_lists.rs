//! The flows on each link, as lists of flow ids that share one buffer.
//!
//! A `Vec` per link costs an allocation the first time a link carries a flow and each time its
//! list outgrows its room, and a free per link when the network is dropped: on a random
//! permutation of 1,024 flows on a dragonfly, where most links carry one or two flows, those
//! allocations and frees were an eighth of the run's instructions. Here every list lives in
//! one buffer, each with room for [`FIRST_ROOM`] flows from the start (one zeroed allocation
//! for all links: 16 bytes a link); a list that outgrows its room moves to the buffer's end
//! with twice the room (its old place is not reused), so growing costs no allocation once the
//! buffer has grown, and dropping the network frees two buffers.
//!
//! The operations and their order are a `Vec`'s (`push` appends, `swap_remove` moves the
//! last element into the hole), so the filling visits a link's flows in the order it did.
//!
//! Invariants: each list's elements are `items[start..start + len]`, with room for `room`
//! elements from `start`; the rooms of different lists never overlap; the buffer holds at
//! most twice the rooms of the lists now (a list's abandoned rooms sum to less than its room
//! now), which are at most twice the longest each list has been, or [`FIRST_ROOM`].

/// Lists of `u32` (flow ids), one per link, in one buffer (see the module documentation).
#[derive(Debug, Clone, Default)]
pub(super) struct LinkLists {
    /// Where each list is in `items`.
    heads: Vec<Head>,
    /// Every list's elements and room.
    items: Vec<u32>,
}

/// One list: its elements are `items[start..start + len]`, with room for `room`.
#[derive(Debug, Clone, Copy, Default)]
struct Head {
    start: u32,
    len: u32,
    room: u32,
}

/// The room each list has from the start.
const FIRST_ROOM: u32 = 4;

impl LinkLists {
    /// `lists` empty lists, each with room for [`FIRST_ROOM`] elements.
    pub(super) fn new(lists: usize) -> Self {
        let places = lists * FIRST_ROOM as usize;
        assert!(u32::try_from(places).is_ok(), "more than 2^32 flow places on links");
        let heads = (0..lists as u32).map(|list| Head { start: list * FIRST_ROOM, len: 0, room: FIRST_ROOM });
        // Room for as much again from the start: the first list to outgrow its room would
        // otherwise make the buffer move (a copy of it all, onto fresh pages).
        let mut items = Vec::with_capacity(places * 2);
        items.resize(places, 0);
        LinkLists { heads: heads.collect(), items }
    }

    /// The elements of list `list`.
    #[inline]
    pub(super) fn get(&self, list: usize) -> &[u32] {
        let head = self.heads[list];
        &self.items[head.start as usize..(head.start + head.len) as usize]
    }

    /// How many elements list `list` has.
    #[inline]
    pub(super) fn len(&self, list: usize) -> usize {
        self.heads[list].len as usize
    }

    /// Whether list `list` is empty.
    #[inline]
    pub(super) fn is_empty(&self, list: usize) -> bool {
        self.heads[list].len == 0
    }

    /// Appends `value` to list `list`; returns its position there.
    #[inline]
    pub(super) fn push(&mut self, list: usize, value: u32) -> u32 {
        let head = &mut self.heads[list];
        if head.len == head.room {
            Self::grow(head, &mut self.items);
        }
        let position = head.len;
        self.items[(head.start + position) as usize] = value;
        head.len += 1;
        position
    }

    /// Moves a full list to the end of the buffer with twice its room.
    #[cold]
    fn grow(head: &mut Head, items: &mut Vec<u32>) {
        let room = (head.room * 2).max(FIRST_ROOM);
        let start = items.len();
        let end = start + room as usize;
        assert!(u32::try_from(end).is_ok(), "more than 2^32 flow places on links");
        items.resize(end, 0);
        let old = head.start as usize;
        items.copy_within(old..old + head.len as usize, start);
        head.start = start as u32;
        head.room = room;
    }

    /// Removes the element at `position` of list `list`, moving the list's last element into
    /// its place (`Vec::swap_remove`); returns the element that moved there, if any (none
    /// when the last was removed).
    #[inline]
    pub(super) fn swap_remove(&mut self, list: usize, position: u32) -> Option<u32> {
        let head = &mut self.heads[list];
        assert!(position < head.len, "position {position} of a list of {}", head.len);
        head.len -= 1;
        let last = head.start + head.len;
        if position == head.len {
            return None;
        }
        let moved = self.items[last as usize];
        self.items[(head.start + position) as usize] = moved;
        Some(moved)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::LinkLists;

    /// One operation on a few lists: a push of a value, or a removal at a position (taken
    /// modulo the list's length; none when it is empty).
    #[derive(Debug, Clone)]
    enum Operation {
        Push(usize, u32),
        Remove(usize, usize),
    }

    fn operation() -> impl Strategy<Value = Operation> {
        prop_oneof![
            3 => (0usize..6, any::<u32>()).prop_map(|(list, value)| Operation::Push(list, value)),
            2 => (0usize..6, any::<usize>()).prop_map(|(list, at)| Operation::Remove(list, at)),
        ]
    }

    proptest! {
        /// Any sequence of pushes and swap-removes leaves every list as a `Vec` per list
        /// would, element for element and in order, and reports the same positions and moved
        /// elements; the buffer holds at most four times the longest each list has been.
        #[test]
        fn link_lists_behave_as_a_vec_per_list(operations in prop::collection::vec(operation(), 0..400)) {
            let mut lists = LinkLists::new(6);
            let mut naive: Vec<Vec<u32>> = vec![Vec::new(); 6];
            let mut longest = [0usize; 6];
            for operation in operations {
                match operation {
                    Operation::Push(list, value) => {
                        let position = lists.push(list, value);
                        prop_assert_eq!(position as usize, naive[list].len());
                        naive[list].push(value);
                        longest[list] = longest[list].max(naive[list].len());
                    }
                    Operation::Remove(list, at) => {
                        if naive[list].is_empty() {
                            continue;
                        }
                        let position = at % naive[list].len();
                        let moved = lists.swap_remove(list, position as u32);
                        naive[list].swap_remove(position);
                        prop_assert_eq!(moved, naive[list].get(position).copied());
                    }
                }
                for (list, expected) in naive.iter().enumerate() {
                    prop_assert_eq!(lists.get(list), expected.as_slice());
                    prop_assert_eq!(lists.len(list), expected.len());
                    prop_assert_eq!(lists.is_empty(list), expected.is_empty());
                }
            }
            let bound: usize = longest.iter().map(|&n| 4 * n.max(1)).sum();
            prop_assert!(lists.items.len() <= bound, "{} places for lists of at most {:?}", lists.items.len(), longest);
        }
    }
}
