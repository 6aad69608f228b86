//! The order in which the max-min filling takes a component's links (`super::maxmin`): each
//! link as one integer key (its fair share, then its id), sorted a chunk at a time, and popped
//! against the heap of links whose share has grown since. One policy: what comes first when
//! shares tie, and how the keys are sorted fast when few shares are distinct.

use std::collections::BinaryHeap;

/// A link's place in the filling's order as one integer: larger for a smaller `share`, and
/// for equal shares for a larger link id, which is how a max-heap of `(Reverse(share), link)`
/// orders them (shares are finite and non-negative, so their bits order as they do).
#[inline]
pub(super) fn order_key(share: f64, link: u32) -> u128 {
    // `+ 0.0` turns a -0.0 share into 0.0, whose bits are the smallest.
    (u128::from(u64::MAX - (share + 0.0).to_bits()) << 32) | u128::from(link)
}

/// The share and link of an [`order_key`] (a share of -0.0 comes back as 0.0, which compares
/// equal to it).
#[inline]
pub(super) fn share_and_link(key: u128) -> (f64, u32) {
    (f64::from_bits(u64::MAX - (key >> 32) as u64), key as u32)
}

/// The most distinct shares [`sort_order_keys`] ranks; with more it sorts the keys as they are.
pub(super) const RANKED_SHARES: usize = 16;

/// Scratch of [`sort_order_keys`], kept across fillings so that sorting allocates nothing.
#[derive(Debug, Default)]
pub(super) struct KeySort {
    /// The distinct shares (an [`order_key`]'s upper bits) of the keys being sorted, in order
    /// of first appearance.
    distinct: Vec<u64>,
    /// Each key as its share's index in `distinct` (upper half) and its link (lower half).
    ranked: Vec<u64>,
    /// The other buffer of each radix pass.
    spare: Vec<u64>,
    /// One bit per link id (all clear between sorts): the links of one share, set and read
    /// back in order.
    bits: Vec<u64>,
}

/// Sorts a filling's [`order_key`]s ascending, into exactly the order `sort_unstable` gives
/// (the keys are distinct: one per link). A component's links have few distinct fair shares
/// (a capacity over a count of flows: 1.5 per filling on average in NCCL's tree allreduce over
/// 1,024 ranks under packet-steps), so with at most [`RANKED_SHARES`] of them the keys are
/// sorted by radix on (the share's rank among them, the link id): one counting pass per byte
/// of the link ids in which they differ, then one by rank if there is more than one share,
/// where the comparison sort of 128-bit keys took a fifth of that run's instructions. When
/// the link ids span no more 64-bit words than there are keys, each share's links are
/// instead set in a bitmap and read back in order: a pass by rank (if more than one share),
/// then a set and a read per key and a look at each word of the span per share.
pub(super) fn sort_order_keys(keys: &mut [u128], scratch: &mut KeySort) {
    // Below this a comparison sort is as cheap as the radix passes' counts.
    const SMALL: usize = 48;
    if keys.len() <= SMALL {
        keys.sort_unstable();
        return;
    }
    let KeySort { distinct, ranked, spare, bits } = scratch;
    distinct.clear();
    ranked.clear();
    // Each key's share as its index in `distinct`, and which bits of the link ids differ.
    let (mut last, mut varying, mut lowest, mut highest) = (0, 0u32, u32::MAX, 0u32);
    let first_link = keys[0] as u32;
    for &key in keys.iter() {
        let share = (key >> 32) as u64;
        if distinct.get(last) != Some(&share) {
            match distinct.iter().position(|&seen| seen == share) {
                Some(index) => last = index,
                None if distinct.len() < RANKED_SHARES => {
                    last = distinct.len();
                    distinct.push(share);
                }
                None => {
                    keys.sort_unstable();
                    return;
                }
            }
        }
        varying |= key as u32 ^ first_link;
        lowest = lowest.min(key as u32);
        highest = highest.max(key as u32);
        ranked.push(((last as u64) << 32) | u64::from(key as u32));
    }
    // Each index's rank: how many distinct shares are smaller.
    let mut rank = [0usize; RANKED_SHARES];
    for (index, &share) in distinct.iter().enumerate() {
        rank[index] = distinct.iter().filter(|&&other| other < share).count();
    }
    let ranks = distinct.len() > 1;
    let (low_word, high_word) = ((lowest >> 6) as usize, (highest >> 6) as usize);
    if high_word - low_word < ranked.len() {
        if bits.len() <= high_word {
            bits.resize(high_word + 1, 0);
        }
        if ranks {
            // By rank, links in any order within one.
            let mut starts = [0u32; RANKED_SHARES];
            for &entry in ranked.iter() {
                starts[rank[(entry >> 32) as usize]] += 1;
            }
            let mut total = 0;
            for start in starts.iter_mut() {
                let count = *start;
                *start = total;
                total += count;
            }
            spare.resize(ranked.len(), 0);
            for &entry in ranked.iter() {
                let at = &mut starts[rank[(entry >> 32) as usize]];
                spare[*at as usize] = entry;
                *at += 1;
            }
            std::mem::swap(ranked, spare);
        }
        let (mut next, mut written) = (0, 0);
        while next < ranked.len() {
            let index = ranked[next] >> 32;
            while let Some(&entry) = ranked.get(next)
                && entry >> 32 == index
            {
                let link = entry as u32;
                bits[(link >> 6) as usize] |= 1 << (link & 63);
                next += 1;
            }
            let share = u128::from(distinct[index as usize]) << 32;
            for (word, set) in bits[low_word..=high_word].iter_mut().enumerate() {
                let mut links = std::mem::take(set);
                let base = ((low_word + word) as u32) << 6;
                while links != 0 {
                    keys[written] = share | u128::from(base | links.trailing_zeros());
                    written += 1;
                    links &= links - 1;
                }
            }
        }
        return;
    }
    // The histograms of every pass at once (a permutation leaves them as they are).
    let mut counts = [[0u32; 256]; 4];
    let mut by_rank = [0u32; RANKED_SHARES];
    let bytes: &[u32] = match varying {
        0..=0xff => &[0],
        0x100..=0xffff => &[0, 8],
        0x1_0000..=0xff_ffff => &[0, 8, 16],
        _ => &[0, 8, 16, 24],
    };
    for &entry in ranked.iter() {
        for (pass, &shift) in bytes.iter().enumerate() {
            counts[pass][((entry >> shift) & 0xff) as usize] += 1;
        }
        if ranks {
            by_rank[rank[(entry >> 32) as usize]] += 1;
        }
    }
    // Only grows (a shorter length truncates): every pass writes each entry before reading.
    spare.resize(ranked.len(), 0);
    // Least significant byte first, the rank last.
    for (pass, &shift) in bytes.iter().enumerate() {
        let starts = &mut counts[pass];
        if (varying >> shift) & 0xff == 0 {
            continue;
        }
        let mut total = 0;
        for start in starts.iter_mut() {
            let count = *start;
            *start = total;
            total += count;
        }
        for &entry in ranked.iter() {
            let byte = ((entry >> shift) & 0xff) as usize;
            spare[starts[byte] as usize] = entry;
            starts[byte] += 1;
        }
        std::mem::swap(ranked, spare);
    }
    if ranks {
        let mut total = 0;
        for start in by_rank.iter_mut() {
            let count = *start;
            *start = total;
            total += count;
        }
        for &entry in ranked.iter() {
            let at = &mut by_rank[rank[(entry >> 32) as usize]];
            spare[*at as usize] = entry;
            *at += 1;
        }
        std::mem::swap(ranked, spare);
    }
    for (key, &entry) in keys.iter_mut().zip(ranked.iter()) {
        *key = (u128::from(distinct[(entry >> 32) as usize]) << 32) | u128::from(entry as u32);
    }
}

/// Sorts the largest `chunk` of `keys` (the links with the smallest shares: the next to pop)
/// into place at its end, above every other key, and returns where they start: the filling
/// pops from the end, and sorts the next chunk when they are gone. A filling pops a link per
/// bottleneck until its flows are frozen, often a few of a component's links (on the
/// 1,024-host dragonfly's random permutation, 8 of 73 links per re-fill on average), so
/// sorting them all was most of the sort's work. With `chunk` at least half the keys, all
/// of them are sorted (by [`sort_order_keys`], as are the chunks). The keys are distinct, so
/// the pops are those of the whole sort.
pub(super) fn sort_largest(keys: &mut [u128], chunk: usize, scratch: &mut KeySort) -> usize {
    let count = keys.len();
    if count <= chunk.saturating_mul(2) {
        sort_order_keys(keys, scratch);
        return 0;
    }
    let start = count - chunk;
    keys.select_nth_unstable(start);
    sort_order_keys(&mut keys[start..], scratch);
    start
}

/// The next link of the filling: the larger of `sorted`'s last [`order_key`] and the heap's
/// top (the smaller share; for equal shares the larger link id, as one heap of both would
/// pop them).
#[inline]
pub(super) fn next_link(sorted: &mut Vec<u128>, heap: &mut BinaryHeap<u128>) -> Option<u128> {
    match (sorted.last(), heap.peek()) {
        (Some(&listed), Some(&queued)) if queued > listed => heap.pop(),
        (Some(_), _) => sorted.pop(),
        (None, _) => heap.pop(),
    }
}
