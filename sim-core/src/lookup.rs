//! Hash maps and sets that can only be looked up, never iterated.
//!
//! A std `HashMap` iterates in an order that changes from one process to the next, so a
//! result computed by iterating one would break "same scenario, byte-identical output".
//! `clippy.toml` forbids `HashMap` and `HashSet`; where hashing is wanted for speed, these
//! wrappers give the lookups (`get`, `insert`, `entry`, `remove`, ...) and leave out every way
//! to iterate, so the order cannot reach a result by construction. Anything that must be
//! walked is a `BTreeMap` or a `Vec`.
//!
//! A map's hasher is std's SipHash unless it says otherwise: [`FastLookupMap`] takes the
//! crate's multiply-rotate hash ([`crate::fast_hash`]) for keys the simulator makes itself
//! and looks up per event.

#![allow(clippy::disallowed_types)] // the one place the std types are used, wrapped

use std::borrow::Borrow;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault, Hash, RandomState};

pub use crate::fast_hash::FastHasher;

/// A `HashMap` without iteration: see the module documentation.
#[derive(Debug, Clone)]
pub struct LookupMap<K, V, S = RandomState>(HashMap<K, V, S>);

/// A [`LookupMap`] with the crate's fast hasher ([`FastHasher`]): for keys a program makes
/// itself (ranks, groups, op keys of a lowering), looked up too often for SipHash's price.
pub type FastLookupMap<K, V> = LookupMap<K, V, BuildHasherDefault<FastHasher>>;

impl<K, V, S: Default> Default for LookupMap<K, V, S> {
    fn default() -> Self {
        LookupMap(HashMap::with_hasher(S::default()))
    }
}

impl<K: Hash + Eq, V> LookupMap<K, V> {
    /// An empty map with room for `capacity` entries.
    pub fn with_capacity(capacity: usize) -> Self {
        LookupMap(HashMap::with_capacity(capacity))
    }
}

impl<K: Hash + Eq, V, S: BuildHasher + Default> LookupMap<K, V, S> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes room for at least `additional` more entries.
    pub fn reserve(&mut self, additional: usize) {
        self.0.reserve(additional);
    }

    /// The value of `key`, if any.
    pub fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.0.get(key)
    }

    /// The value of `key` to change, if any.
    pub fn get_mut<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.0.get_mut(key)
    }

    /// Whether `key` has a value.
    pub fn contains_key<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.0.contains_key(key)
    }

    /// Sets `key` to `value`, returning the value it replaces.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.0.insert(key, value)
    }

    /// Takes `key`'s value out.
    pub fn remove<Q: Hash + Eq + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        self.0.remove(key)
    }

    /// The entry of `key`, to read, insert or change in place.
    pub fn entry(&mut self, key: K) -> Entry<'_, K, V> {
        self.0.entry(key)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Removes every entry, keeping the memory.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<K: Hash + Eq + Borrow<Q>, Q: Hash + Eq + ?Sized, V, S: BuildHasher> std::ops::Index<&Q>
    for LookupMap<K, V, S>
{
    type Output = V;

    /// The value of `key`; panics if there is none, as `HashMap`'s index does.
    fn index(&self, key: &Q) -> &V {
        &self.0[key]
    }
}

impl<K: Hash + Eq, V, S: BuildHasher + Default> FromIterator<(K, V)> for LookupMap<K, V, S> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        LookupMap(iter.into_iter().collect())
    }
}

/// A `HashSet` without iteration: see the module documentation.
#[derive(Debug, Clone)]
pub struct LookupSet<T>(HashSet<T>);

impl<T> Default for LookupSet<T> {
    fn default() -> Self {
        LookupSet(HashSet::new())
    }
}

impl<T: Hash + Eq> LookupSet<T> {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `value`; whether it was new.
    pub fn insert(&mut self, value: T) -> bool {
        self.0.insert(value)
    }

    /// Whether `value` is in the set.
    pub fn contains<Q: Hash + Eq + ?Sized>(&self, value: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        self.0.contains(value)
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T: Hash + Eq> FromIterator<T> for LookupSet<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        LookupSet(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_see_what_was_inserted() {
        let mut map: LookupMap<(u32, u32), u32> = [((1, 2), 3)].into_iter().collect();
        *map.entry((4, 5)).or_insert(0) += 6;
        assert_eq!(map.get(&(1, 2)), Some(&3));
        assert_eq!(map.remove(&(4, 5)), Some(6));
        assert_eq!(map.len(), 1);
        let set: LookupSet<&str> = ["a", "b"].into_iter().collect();
        assert!(set.contains("a") && !set.contains("c"));
    }
}
