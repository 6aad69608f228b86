//! A fast hasher for the engine's small integer keys (rank pairs, groups of ranks).
//!
//! The std hasher (SipHash) resists collision attacks, which keys the simulator makes itself
//! do not need, and costs more than the lookups it guards. This is the multiply-rotate hash of
//! rustc's `FxHasher`. Maps using it are only looked up, never iterated where order would
//! matter, so results stay deterministic.

#[allow(clippy::disallowed_types)] // only for FastMap below
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash's multiplier (from Firefox and rustc).
const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// The multiply-rotate hasher (see the module documentation).
#[derive(Debug, Default, Clone, Copy)]
pub struct FastHasher {
    hash: u64,
}

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, value: u8) {
        self.add(u64::from(value));
    }

    fn write_u32(&mut self, value: u32) {
        self.add(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }

    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}

/// A `HashMap` with [`FastHasher`].
#[allow(clippy::disallowed_types)] // a fixed hasher: the same insertions give the same order in every run
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_keys_hash_equal_and_lookups_work() {
        let mut map: FastMap<(u32, u32), u32> = FastMap::default();
        for a in 0..64 {
            for b in 0..64 {
                map.insert((a, b), a * 64 + b);
            }
        }
        assert_eq!(map.len(), 64 * 64);
        assert_eq!(map.get(&(3, 5)), Some(&(3 * 64 + 5)));
        let mut groups: FastMap<Vec<u32>, usize> = FastMap::default();
        groups.insert(vec![1, 2, 3], 7);
        assert_eq!(groups.get(&[1u32, 2, 3][..]), Some(&7));
    }
}
