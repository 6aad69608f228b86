//! The deterministic hash behind ECMP port choices and Valiant's intermediate groups.
//!
//! SplitMix64 (Steele, Lea, Flood 2014) finalizer, chained over the key's words: fixed
//! constants, no per-process seed, so the same (source, destination, flow) picks the same path
//! on every run and every machine. std's `RandomState` is seeded per process and would not.

/// One SplitMix64 step: a bijective mix of `z`.
pub(crate) fn splitmix64(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of one flow: its hosts and its id. Hashed only when a choice is made, so routes
/// that need none (D-mod-K, minimal, shortest) pay nothing for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FlowKey {
    hosts: u64,
    flow: u64,
}

impl FlowKey {
    pub(crate) fn new(src: u32, dst: u32, flow: u64) -> FlowKey {
        FlowKey { hosts: (u64::from(src) << 32) | u64::from(dst), flow }
    }

    /// A choice among `n` (at least 1) for decision `salt` (a level, a hop), uniform and
    /// independent across salts.
    pub(crate) fn pick(self, salt: u64, n: u32) -> u32 {
        let key = splitmix64(splitmix64(self.hosts) ^ self.flow);
        let h = splitmix64(key ^ splitmix64(salt));
        // Multiply-shift maps the 64-bit hash onto 0..n without modulo bias worth noticing.
        ((u128::from(h) * u128::from(n)) >> 64) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // The first outputs of the reference SplitMix64 generator seeded with 0 (state advances
        // by the golden gamma before each mix).
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(0x9E37_79B9_7F4A_7C15), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn picks_are_in_range_deterministic_and_spread() {
        let mut histogram = [0u32; 8];
        for flow in 0..8000 {
            let pick = FlowKey::new(3, 17, flow).pick(1, 8);
            assert_eq!(pick, FlowKey::new(3, 17, flow).pick(1, 8));
            histogram[pick as usize] += 1;
        }
        assert!(histogram.iter().all(|&n| (900..1100).contains(&n)), "{histogram:?}");
    }
}
