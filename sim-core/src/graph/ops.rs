//! The ops of a graph, each distinct op stored once ([`Ops`]).
//!
//! A lowered training job repeats the same few thousand ops (a layer's kernels, a stage's
//! sends) for every micro-batch and iteration; only a collective's member op is unique (it
//! names its collective instance). So the graph keeps, per op, a 4-byte index into a table of
//! the distinct ops instead of the 32-byte [`Op`]: for Megatron's 529.6B model on 560 GPUs
//! (12.65 M ops, 6% of them distinct), 6.0 bytes per op instead of 32. Where most ops are
//! distinct (every rank simulated, each rank's ops its own; an imported trace), the index
//! would cost more than it saves: the ops are then stored one per op, in order ("plain"), as
//! they always were, and looked up no more.
//!
//! Invariant: `ops[i]` is `distinct[index[i]]`, or `distinct[i]` when plain; the table may
//! hold entries no op indexes (an op replaced by [`Ops::set`]) or an op twice (after the
//! lookup is cleared), so graphs are compared and hashed by their ops in order, never by
//! their storage.

use super::{Op, OpKind};
use crate::fast_hash::FastMap;

/// Distinct ops the builder's lookup holds at most; past it, it starts again empty (the table
/// keeps what it has), so its memory stays bounded.
const LOOKUP_CAPACITY: usize = 1 << 17;

/// Every this many ops added, the ops go plain if more than half of them are distinct (the
/// lookups cost time for nothing, and the index memory).
const PLAIN_CHECK: usize = 1 << 14;

/// The ops of a graph in id order: indexable (`ops[i]`), iterable, each distinct op stored
/// once (see the module documentation).
#[derive(Clone, Default)]
pub struct Ops {
    /// Per op, its position in `distinct`; empty when `plain`.
    index: Vec<u32>,
    /// The distinct ops; every op, in order, when `plain`.
    distinct: Vec<Op>,
    /// Whether the ops are stored one per op (mostly distinct), without an index.
    plain: bool,
    /// Position in `distinct` of the ops added so far that are not collective members (those
    /// are unique, and never looked up); emptied once the graph is built, or when plain.
    lookup: FastMap<Op, u32>,
}

impl Ops {
    /// Number of ops.
    pub fn len(&self) -> usize {
        if self.plain { self.distinct.len() } else { self.index.len() }
    }

    /// Whether there is no op.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of ops stored: the distinct ones, or every op when most are distinct.
    pub fn distinct_count(&self) -> usize {
        self.distinct.len()
    }

    /// Op `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<&Op> {
        if self.plain {
            self.distinct.get(index)
        } else {
            self.index.get(index).map(|&at| &self.distinct[at as usize])
        }
    }

    /// The ops in order.
    pub fn iter(&self) -> OpsIter<'_> {
        OpsIter { ops: self, front: 0, back: self.len() }
    }

    /// Stores the ops one per op from the start: for a caller whose ops are all distinct by
    /// construction (every flow of a traffic matrix), which would otherwise look each up for
    /// nothing until the first check. Changes no op.
    pub(crate) fn start_plain(&mut self) {
        if !self.plain && self.index.is_empty() {
            self.plain = true;
            self.lookup = FastMap::default();
        }
    }

    /// Makes room for `additional` more ops.
    pub(crate) fn reserve(&mut self, additional: usize) {
        if self.plain {
            self.distinct.reserve(additional);
        } else {
            self.index.reserve(additional);
        }
    }

    /// Appends `op`.
    pub(crate) fn push(&mut self, op: Op) {
        if self.plain {
            self.distinct.push(op);
            return;
        }
        let at = self.intern(op);
        self.index.push(at);
        if self.index.len() % PLAIN_CHECK == 0 && self.distinct.len() * 2 > self.index.len() {
            self.make_plain();
        }
    }

    /// Replaces op `index` with `op`; nothing if there is no op `index`.
    pub(crate) fn set(&mut self, index: usize, op: Op) {
        if self.plain {
            if let Some(slot) = self.distinct.get_mut(index) {
                *slot = op;
            }
        } else if index < self.index.len() {
            self.index[index] = self.intern(op);
        }
    }

    /// Drops the lookup (a built graph adds no op); stores the ops plain if at most an eighth
    /// of them repeat (the index would cost more than it saves), else drops the table's spare
    /// room.
    pub(crate) fn finish(&mut self) {
        self.lookup = FastMap::default();
        if !self.plain {
            if self.distinct.len() * 8 > self.index.len() * 7 {
                self.make_plain();
            } else {
                self.distinct.shrink_to_fit();
            }
        }
    }

    /// Takes every op out, in order, leaving this empty.
    pub(crate) fn take_all(&mut self) -> Vec<Op> {
        let ops =
            if self.plain { std::mem::take(&mut self.distinct) } else { self.iter().copied().collect() };
        *self = Ops::default();
        ops
    }

    /// Stores the ops one per op, in order, from now on.
    fn make_plain(&mut self) {
        // With the room reserved for the index (a lowering reserves its ops up front).
        let mut plain = Vec::with_capacity(self.index.capacity());
        plain.extend(self.iter().copied());
        self.distinct = plain;
        self.index = Vec::new();
        self.lookup = FastMap::default();
        self.plain = true;
    }

    /// The position of `op` in the table, added if new.
    fn intern(&mut self, op: Op) -> u32 {
        let unique = matches!(op.kind, OpKind::Collective(_));
        if !unique && let Some(&at) = self.lookup.get(&op) {
            return at;
        }
        let at = self.distinct.len() as u32;
        self.distinct.push(op);
        if !unique {
            if self.lookup.len() >= LOOKUP_CAPACITY {
                self.lookup.clear();
            }
            self.lookup.insert(op, at);
        }
        at
    }
}

impl std::ops::Index<usize> for Ops {
    type Output = Op;

    fn index(&self, index: usize) -> &Op {
        if self.plain { &self.distinct[index] } else { &self.distinct[self.index[index] as usize] }
    }
}

/// The ops in order, as a list (the table is a matter of storage).
impl std::fmt::Debug for Ops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Ops {
    fn eq(&self, other: &Ops) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Ops {}

impl std::hash::Hash for Ops {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.len().hash(state);
        for op in self {
            op.hash(state);
        }
    }
}

impl<'a> IntoIterator for &'a Ops {
    type Item = &'a Op;
    type IntoIter = OpsIter<'a>;

    fn into_iter(self) -> OpsIter<'a> {
        self.iter()
    }
}

/// The ops of an [`Ops`] in order ([`Ops::iter`]).
#[derive(Debug, Clone)]
pub struct OpsIter<'a> {
    ops: &'a Ops,
    /// The next op from the front.
    front: usize,
    /// One past the next op from the back.
    back: usize,
}

impl<'a> Iterator for OpsIter<'a> {
    type Item = &'a Op;

    fn next(&mut self) -> Option<&'a Op> {
        (self.front < self.back).then(|| {
            self.front += 1;
            &self.ops[self.front - 1]
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.back - self.front, Some(self.back - self.front))
    }

    fn nth(&mut self, n: usize) -> Option<&'a Op> {
        self.front = self.front.saturating_add(n).min(self.back);
        self.next()
    }
}

impl DoubleEndedIterator for OpsIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        (self.front < self.back).then(|| {
            self.back -= 1;
            &self.ops[self.back]
        })
    }
}

impl ExactSizeIterator for OpsIter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{CollectiveId, LabelId, OpMeta, RankId, StreamId};
    use units::SimDuration;

    fn compute(rank: u32, us: u64) -> Op {
        Op {
            kind: OpKind::Compute { duration: SimDuration::from_us(us) },
            rank: RankId(rank),
            stream: StreamId(0),
            label: LabelId(0),
            meta: OpMeta::NONE,
        }
    }

    fn member(collective: u32) -> Op {
        Op { kind: OpKind::Collective(CollectiveId(collective)), ..compute(0, 0) }
    }

    #[test]
    fn repeated_ops_are_stored_once_and_read_back_in_order() {
        let mut ops = Ops::default();
        let sequence = [compute(0, 1), compute(1, 1), member(0), compute(0, 1), member(1), compute(1, 1)];
        for op in sequence {
            ops.push(op);
        }
        assert_eq!(ops.len(), sequence.len());
        assert_eq!(ops.distinct_count(), 4);
        assert!(ops.iter().copied().eq(sequence));
        assert!(ops.iter().rev().copied().eq(sequence.into_iter().rev()));
        assert_eq!(ops[4], member(1));
        assert_eq!(ops.get(6), None);
    }

    #[test]
    fn equality_and_hash_follow_the_ops_not_the_table() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let mut plain = Ops::default();
        let mut replaced = Ops::default();
        for op in [compute(0, 1), compute(0, 2)] {
            plain.push(op);
        }
        for op in [compute(0, 3), compute(0, 2)] {
            replaced.push(op);
        }
        assert_ne!(plain, replaced);
        replaced.set(0, compute(0, 1));
        assert_eq!(replaced.distinct_count(), 3);
        assert_eq!(plain, replaced);
        // Two distinct ops of two: stored plain once built, still the same ops.
        replaced.finish();
        assert_eq!(replaced.distinct_count(), 2);
        assert_eq!(plain, replaced);
        let hasher = BuildHasherDefault::<std::hash::DefaultHasher>::default();
        assert_eq!(hasher.hash_one(&plain), hasher.hash_one(&replaced));
        assert_eq!(format!("{plain:?}"), format!("{:?}", [compute(0, 1), compute(0, 2)]));
        assert_eq!(replaced.take_all(), vec![compute(0, 1), compute(0, 2)]);
        assert!(replaced.is_empty());
    }

    #[test]
    fn a_full_lookup_starts_again_without_losing_an_op() {
        let mut ops = Ops::default();
        let count = LOOKUP_CAPACITY as u64 + 10;
        for us in 0..count {
            for _ in 0..3 {
                ops.push(compute(0, us));
            }
        }
        assert_eq!(ops.distinct_count() as u64, count);
        // Forgotten with the full lookup: stored again, once.
        ops.push(compute(0, 0));
        ops.push(compute(0, 0));
        assert_eq!(ops.distinct_count() as u64, count + 1);
        assert_eq!(ops.len() as u64, 3 * count + 2);
        assert!(
            ops.iter().copied().eq((0..count).flat_map(|us| [us; 3]).chain([0, 0]).map(|us| compute(0, us)))
        );
    }

    #[test]
    fn ops_started_plain_store_every_op_and_equal_the_interned_ones() {
        let sequence = [compute(0, 1), compute(1, 1), compute(0, 1), member(0)];
        let mut interned = Ops::default();
        let mut plain = Ops::default();
        plain.start_plain();
        for op in sequence {
            interned.push(op);
            plain.push(op);
        }
        assert!(plain.plain && plain.lookup.is_empty());
        assert_eq!((interned.distinct_count(), plain.distinct_count()), (3, 4));
        assert_eq!(plain, interned);
        // Too late once an op is in: the interned ops stay as they are.
        interned.start_plain();
        assert!(!interned.plain);
    }

    #[test]
    fn mostly_distinct_ops_are_stored_plain() {
        let mut ops = Ops::default();
        let count = 2 * PLAIN_CHECK as u64 + 5;
        for us in 0..count {
            ops.push(compute(0, us));
            ops.push(member(us as u32));
        }
        assert!(ops.plain);
        assert_eq!(ops.distinct_count(), ops.len());
        let expected = || (0..count).flat_map(|us| [compute(0, us), member(us as u32)]);
        assert!(ops.iter().copied().eq(expected()));
        assert!(ops.iter().rev().copied().eq(expected().collect::<Vec<_>>().into_iter().rev()));
        assert_eq!(ops.iter().nth(3), Some(&member(1)));
        ops.set(1, compute(1, 1));
        assert_eq!(ops[1], compute(1, 1));
        ops.finish();
        assert_eq!(ops.take_all().len() as u64, 2 * count);
        assert!(ops.is_empty());
    }
}
