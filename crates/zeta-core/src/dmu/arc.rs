//! The lists of an adaptive replacement cache (ARC: Megiddo and Modha, "ARC: A Self-Tuning,
//! Low Overhead Replacement Cache", FAST 2003), counted in bytes as OpenZFS's `arc.c` runs it.
//!
//! Four lists, each in recency order: `T1` holds what was used once lately, `T2` what was
//! used at least twice; `B1` and `B2` are their ghosts, the keys (no data) of what each
//! lately evicted. A miss that finds its key in a ghost list says that list was evicted too
//! soon, and moves `p`, the target size of `T1`, toward it: a `B1` hit grows `p` (recency
//! pays), a `B2` hit shrinks it (frequency pays). Eviction then takes from whichever of `T1`
//! and `T2` is over its share. A scan of blocks read once passes through `T1` and never
//! touches `T2`, so a working set read twice or more survives a scan many times the cache.
//!
//! With blocks of one size and `bytes` 1, every step is the paper's (figure 4), with `p`
//! moved by integer steps as OpenZFS does (`δ = max(|B2| / |B1|, 1)`, rounded down): the
//! test below checks that against a page-count reference written from the paper. With blocks
//! of several sizes each list is bounded by bytes: `T1 + T2 ≤ c`, `T1 + B1 ≤ c` and all four
//! `≤ 2c`.
//!
//! A block read ahead (prefetch) goes into `T1` marked so; its first demand hit clears the
//! mark and leaves it in `T1` rather than promote it (OpenZFS does the same: a prefetch and
//! the read it served are one use, not two). Prefetches do not move `p`. A sequential
//! reader's reads within one block are one use too (`get_again`).

use std::hash::Hash;

use lru::LruCache;

struct Resident<V> {
    value: V,
    bytes: u64,
    prefetched: bool,
}

/// How a `get` found its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hit {
    /// In `T1` or `T2`: now at the front of `T2`.
    Demand,
    /// A block read ahead, used for the first time: still in `T1`.
    Prefetched,
}

/// Which ghost list an insert found its key in, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ghost {
    B1,
    B2,
}

/// The bytes of each list and the target, for statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListSizes {
    pub t1: u64,
    pub t2: u64,
    pub b1: u64,
    pub b2: u64,
    pub p: u64,
    pub c: u64,
}

pub struct Lists<K: Hash + Eq + Clone, V> {
    t1: LruCache<K, Resident<V>>,
    t2: LruCache<K, Resident<V>>,
    b1: LruCache<K, u64>,
    b2: LruCache<K, u64>,
    sizes: ListSizes,
}

impl<K: Hash + Eq + Clone, V> Lists<K, V> {
    pub fn new(capacity: u64) -> Self {
        Lists {
            t1: LruCache::unbounded(),
            t2: LruCache::unbounded(),
            b1: LruCache::unbounded(),
            b2: LruCache::unbounded(),
            sizes: ListSizes {
                c: capacity,
                ..Default::default()
            },
        }
    }

    pub fn sizes(&self) -> ListSizes {
        self.sizes
    }

    /// Bytes resident (`T1 + T2`).
    pub fn resident(&self) -> u64 {
        self.sizes.t1 + self.sizes.t2
    }

    /// Entries in the ghost lists.
    pub fn ghost_entries(&self) -> usize {
        self.b1.len() + self.b2.len()
    }

    /// The value under `k`, if resident, as the paper's case I: moved to the front of `T2`
    /// (a prefetched block's first use: to the front of `T1`, its mark cleared).
    pub fn get(&mut self, k: &K) -> Option<(&V, Hit)> {
        if let Some(r) = self.t1.get_mut(k) {
            if r.prefetched {
                r.prefetched = false;
                return self.t1.peek(k).map(|r| (&r.value, Hit::Prefetched));
            }
            let r = self.t1.pop(k).expect("just found");
            self.sizes.t1 -= r.bytes;
            self.sizes.t2 += r.bytes;
            self.t2.put(k.clone(), r);
            return self.t2.peek(k).map(|r| (&r.value, Hit::Demand));
        }
        self.t2.get(k).map(|r| (&r.value, Hit::Demand))
    }

    /// `get` for a use that is not a new one: a sequential reader's next read in the block
    /// its last read ended in (4K reads of 16K blocks touch each block four times in a row).
    /// A block in `T1` moves to the front of `T1`, not to `T2`, so a scan in short reads
    /// stays a scan, as OpenZFS counts hits within `ARC_MINTIME` of the first as one use.
    pub fn get_again(&mut self, k: &K) -> Option<(&V, Hit)> {
        if self.t1.peek(k).is_some_and(|r| !r.prefetched) {
            return self.t1.get(k).map(|r| (&r.value, Hit::Demand));
        }
        self.get(k)
    }

    /// Whether `k` is resident, without touching the order.
    pub fn contains(&self, k: &K) -> bool {
        self.t1.contains(k) || self.t2.contains(k)
    }

    /// Puts a block read from its device into the cache (the paper's cases II to IV), after
    /// a `get` that missed; evicted values go into `evicted`, for the caller to drop or reuse
    /// outside its lock. A block larger than the whole cache is not kept. Returns the ghost
    /// list the key was found in.
    pub fn insert(
        &mut self,
        k: K,
        value: V,
        bytes: u64,
        prefetch: bool,
        evicted: &mut Vec<V>,
    ) -> Option<Ghost> {
        // Two readers missed at once and both read it: the later copy replaces the earlier.
        if let Some(r) = self.t1.pop(&k) {
            self.sizes.t1 -= r.bytes;
            evicted.push(r.value);
        } else if let Some(r) = self.t2.pop(&k) {
            self.sizes.t2 -= r.bytes;
            evicted.push(r.value);
        }
        let c = self.sizes.c;
        if bytes > c || bytes == 0 {
            return None;
        }
        let resident = Resident {
            value,
            bytes,
            prefetched: prefetch,
        };
        let ghost = if let Some(g) = self.b1.pop(&k) {
            self.sizes.b1 -= g;
            Some(Ghost::B1)
        } else if let Some(g) = self.b2.pop(&k) {
            self.sizes.b2 -= g;
            Some(Ghost::B2)
        } else {
            None
        };
        match ghost {
            // Cases II and III: the ghost's list was evicted too soon; the block goes to T2.
            Some(g) if !prefetch => {
                // The ghost's own bytes count on its side of the ratio, as in the paper,
                // where |B1| ≥ 1 at a B1 hit.
                let s = &mut self.sizes;
                match g {
                    Ghost::B1 => {
                        let delta = bytes * ((s.b2 / (s.b1 + bytes)).max(1));
                        s.p = (s.p + delta).min(c);
                    }
                    Ghost::B2 => {
                        let delta = bytes * ((s.b1 / (s.b2 + bytes)).max(1));
                        s.p = s.p.saturating_sub(delta);
                    }
                }
                self.replace(g == Ghost::B2, bytes, evicted);
                self.sizes.t2 += bytes;
                self.t2.put(k, resident);
            }
            // Case IV: new to the cache (or a prefetch, which never steers).
            _ => {
                let s = self.sizes;
                if s.t1 + s.b1 + bytes > c {
                    // L1 is full: its oldest ghost goes, or, with no ghost, its oldest block.
                    while self.sizes.t1 + self.sizes.b1 + bytes > c {
                        if let Some((_, g)) = self.b1.pop_lru() {
                            self.sizes.b1 -= g;
                        } else if let Some((_, r)) = self.t1.pop_lru() {
                            self.sizes.t1 -= r.bytes;
                            evicted.push(r.value);
                        } else {
                            break;
                        }
                    }
                } else {
                    while self.total() + bytes > 2 * c {
                        if let Some((_, g)) = self.b2.pop_lru() {
                            self.sizes.b2 -= g;
                        } else if let Some((_, g)) = self.b1.pop_lru() {
                            self.sizes.b1 -= g;
                        } else {
                            break;
                        }
                    }
                }
                self.replace(false, bytes, evicted);
                self.sizes.t1 += bytes;
                self.t1.put(k, resident);
            }
        }
        // Blocks of unequal sizes can take the directory past 2c where pages cannot (the
        // paper's steps keep it there): the oldest ghosts go.
        while self.total() > 2 * c {
            if let Some((_, g)) = self.b2.pop_lru() {
                self.sizes.b2 -= g;
            } else if let Some((_, g)) = self.b1.pop_lru() {
                self.sizes.b1 -= g;
            } else {
                break;
            }
        }
        self.check();
        ghost.filter(|_| !prefetch)
    }

    fn total(&self) -> u64 {
        let s = &self.sizes;
        s.t1 + s.t2 + s.b1 + s.b2
    }

    /// The paper's REPLACE, until `incoming` more bytes fit: the oldest block of `T1` goes to
    /// `B1` if `T1` is over its target `p` (or at it, for a block coming back from `B2`),
    /// else the oldest of `T2` goes to `B2`.
    fn replace(&mut self, from_b2: bool, incoming: u64, evicted: &mut Vec<V>) {
        while self.resident() + incoming > self.sizes.c {
            let s = self.sizes;
            let take_t1 =
                s.t1 > 0 && (s.t1 > s.p || (from_b2 && s.t1 == s.p) || self.t2.is_empty());
            let (list, ghosts, gbytes) = if take_t1 {
                (&mut self.t1, &mut self.b1, &mut self.sizes.b1)
            } else {
                (&mut self.t2, &mut self.b2, &mut self.sizes.b2)
            };
            let Some((k, r)) = list.pop_lru() else {
                break;
            };
            ghosts.put(k, r.bytes);
            *gbytes += r.bytes;
            if take_t1 {
                self.sizes.t1 -= r.bytes;
            } else {
                self.sizes.t2 -= r.bytes;
            }
            evicted.push(r.value);
        }
    }

    /// Takes `k` out if it was read ahead and never used: its one use is now, by a reader
    /// that keeps no copy (a streaming read), so it leaves no ghost either. `None` (and
    /// nothing changed) for any other key.
    pub fn take_prefetched(&mut self, k: &K) -> Option<V> {
        if !self.t1.peek(k).is_some_and(|r| r.prefetched) {
            return None;
        }
        let r = self.t1.pop(k).expect("just found");
        self.sizes.t1 -= r.bytes;
        Some(r.value)
    }

    /// Drops `k` from every list: a block no reader will ask for again (replaced by a sync),
    /// which must neither take room nor, as a ghost, steer `p`.
    pub fn remove(&mut self, k: &K) -> Option<V> {
        if let Some(g) = self.b1.pop(k) {
            self.sizes.b1 -= g;
        }
        if let Some(g) = self.b2.pop(k) {
            self.sizes.b2 -= g;
        }
        if let Some(r) = self.t1.pop(k) {
            self.sizes.t1 -= r.bytes;
            return Some(r.value);
        }
        if let Some(r) = self.t2.pop(k) {
            self.sizes.t2 -= r.bytes;
            return Some(r.value);
        }
        None
    }

    /// Sets the capacity `c`, evicting (into `evicted`) and dropping ghosts at once until the
    /// lists fit it.
    pub fn set_capacity(&mut self, c: u64, evicted: &mut Vec<V>) {
        self.sizes.c = c;
        self.sizes.p = self.sizes.p.min(c);
        self.replace(false, 0, evicted);
        while self.sizes.t1 + self.sizes.b1 > c {
            match self.b1.pop_lru() {
                Some((_, g)) => self.sizes.b1 -= g,
                None => break,
            }
        }
        while self.total() > 2 * c {
            if let Some((_, g)) = self.b2.pop_lru() {
                self.sizes.b2 -= g;
            } else if let Some((_, g)) = self.b1.pop_lru() {
                self.sizes.b1 -= g;
            } else {
                break;
            }
        }
        self.check();
    }

    /// The bounds the lists keep (in debug builds and tests).
    fn check(&self) {
        let s = &self.sizes;
        debug_assert!(
            s.t1 + s.t2 <= s.c,
            "resident {} + {} over {}",
            s.t1,
            s.t2,
            s.c
        );
        debug_assert!(s.t1 + s.b1 <= s.c, "L1 {} + {} over {}", s.t1, s.b1, s.c);
        debug_assert!(self.total() <= 2 * s.c, "directory over 2c");
        debug_assert!(s.p <= s.c);
    }

    /// The keys of `T1` and `T2`, most recent first (for tests).
    #[cfg(test)]
    fn resident_keys(&self) -> (Vec<K>, Vec<K>) {
        (
            self.t1.iter().map(|(k, _)| k.clone()).collect(),
            self.t2.iter().map(|(k, _)| k.clone()).collect(),
        )
    }

    #[cfg(test)]
    fn ghost_keys(&self) -> (Vec<K>, Vec<K>) {
        (
            self.b1.iter().map(|(k, _)| k.clone()).collect(),
            self.b2.iter().map(|(k, _)| k.clone()).collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::VecDeque;

    /// ARC in pages, written from the paper's figure 4 and nothing else: the reference.
    struct PaperArc {
        c: usize,
        p: usize,
        t1: VecDeque<u64>,
        t2: VecDeque<u64>,
        b1: VecDeque<u64>,
        b2: VecDeque<u64>,
    }

    fn take(l: &mut VecDeque<u64>, x: u64) -> bool {
        match l.iter().position(|&y| y == x) {
            Some(i) => {
                l.remove(i);
                true
            }
            None => false,
        }
    }

    impl PaperArc {
        fn new(c: usize) -> Self {
            PaperArc {
                c,
                p: 0,
                t1: VecDeque::new(),
                t2: VecDeque::new(),
                b1: VecDeque::new(),
                b2: VecDeque::new(),
            }
        }

        fn replace(&mut self, x_in_b2: bool) {
            let t1 = self.t1.len();
            if t1 >= 1 && ((x_in_b2 && t1 == self.p) || t1 > self.p) {
                let y = self.t1.pop_back().unwrap();
                self.b1.push_front(y);
            } else {
                let y = self.t2.pop_back().unwrap();
                self.b2.push_front(y);
            }
        }

        /// One request; true on a hit.
        fn access(&mut self, x: u64) -> bool {
            // Case I.
            if take(&mut self.t1, x) || take(&mut self.t2, x) {
                self.t2.push_front(x);
                return true;
            }
            // Case II.
            if take(&mut self.b1, x) {
                let d = (self.b2.len() / (self.b1.len() + 1)).max(1);
                self.p = (self.p + d).min(self.c);
                self.replace(false);
                self.t2.push_front(x);
                return false;
            }
            // Case III.
            if take(&mut self.b2, x) {
                let d = (self.b1.len() / (self.b2.len() + 1)).max(1);
                self.p = self.p.saturating_sub(d);
                self.replace(true);
                self.t2.push_front(x);
                return false;
            }
            // Case IV.
            let l1 = self.t1.len() + self.b1.len();
            let l2 = self.t2.len() + self.b2.len();
            if l1 == self.c {
                if self.t1.len() < self.c {
                    self.b1.pop_back();
                    self.replace(false);
                } else {
                    self.t1.pop_back();
                }
            } else if l1 + l2 >= self.c {
                if l1 + l2 == 2 * self.c {
                    self.b2.pop_back();
                }
                self.replace(false);
            }
            self.t1.push_front(x);
            false
        }
    }

    fn access(arc: &mut Lists<u64, u64>, x: u64, bytes: u64) -> bool {
        if arc.get(&x).is_some() {
            return true;
        }
        arc.insert(x, x, bytes, false, &mut Vec::new());
        false
    }

    /// Requests that exercise every case: a hot set, scans, and loops a little larger than
    /// the cache.
    fn workload(seed: u64, c: u64, n: usize) -> Vec<u64> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut next_scan = 1_000_000;
        let mut v = Vec::new();
        while v.len() < n {
            match rng.gen_range(0..4) {
                0 => (0..c).for_each(|_| v.push(rng.gen_range(0..(c / 2).max(1)))),
                1 => (0..rng.gen_range(1..3 * c)).for_each(|_| {
                    v.push(next_scan);
                    next_scan += 1;
                }),
                2 => {
                    let len = c + rng.gen_range(0..c);
                    (0..2 * len).for_each(|i| v.push(10_000 + i % len));
                }
                _ => (0..c).for_each(|_| v.push(rng.gen_range(0..4 * c))),
            }
        }
        v
    }

    #[test]
    fn equals_the_papers_arc_on_blocks_of_one_size() {
        for (seed, c) in [(1, 8u64), (2, 32), (3, 100), (4, 1)] {
            for bytes in [1, 4096] {
                let mut paper = PaperArc::new(c as usize);
                let mut ours: Lists<u64, u64> = Lists::new(c * bytes);
                for (i, x) in workload(seed, c, 20_000).into_iter().enumerate() {
                    let (a, b) = (paper.access(x), access(&mut ours, x, bytes));
                    assert_eq!(a, b, "hit differs at request {i} ({x}), c {c}");
                    let (t1, t2) = ours.resident_keys();
                    let (b1, b2) = ours.ghost_keys();
                    assert_eq!(t1, Vec::from(paper.t1.clone()), "T1 at {i}");
                    assert_eq!(t2, Vec::from(paper.t2.clone()), "T2 at {i}");
                    assert_eq!(b1, Vec::from(paper.b1.clone()), "B1 at {i}");
                    assert_eq!(b2, Vec::from(paper.b2.clone()), "B2 at {i}");
                    assert_eq!(ours.sizes().p, paper.p as u64 * bytes, "p at {i}");
                }
            }
        }
    }

    #[test]
    fn blocks_of_many_sizes_keep_every_bound() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let c = 64 * 16384;
        let mut arc: Lists<u64, u64> = Lists::new(c);
        let sizes = [4096u64, 16384, 65536, 131072];
        for i in 0..50_000 {
            let x = if rng.gen_bool(0.5) {
                rng.gen_range(0..40)
            } else {
                rng.gen_range(0..2000)
            };
            let bytes = sizes[(x % 4) as usize];
            if arc.get(&x).is_none() {
                let mut ev = Vec::new();
                arc.insert(x, x, bytes, rng.gen_bool(0.1), &mut ev);
            }
            let s = arc.sizes();
            assert!(
                s.t1 + s.t2 <= c && s.t1 + s.b1 <= c && s.p <= c,
                "{i}: {s:?}"
            );
            assert!(s.t1 + s.t2 + s.b1 + s.b2 <= 2 * c, "{i}: {s:?}");
            if i % 5000 == 4999 {
                arc.set_capacity(c / (1 + (i as u64 / 5000) % 3), &mut Vec::new());
                arc.set_capacity(c, &mut Vec::new());
            }
        }
        assert!(arc.resident() > c / 2, "it fills");
    }

    /// Plain LRU at the same capacity: what the ARC replaced.
    fn lru_hits(c: usize, requests: &[u64]) -> usize {
        let mut lru: LruCache<u64, ()> = LruCache::unbounded();
        let mut hits = 0;
        for &x in requests {
            if lru.get(&x).is_some() {
                hits += 1;
            } else {
                lru.put(x, ());
                if lru.len() > c {
                    lru.pop_lru();
                }
            }
        }
        hits
    }

    #[test]
    fn a_hot_set_survives_a_scan_of_four_times_the_cache_and_an_lru_does_not() {
        let c = 1000u64;
        // A hot set of half the cache, used in bursts (read twice over), while a scan of 4×
        // the cache runs through: each round reads the hot set twice and then a cache's
        // worth of the scan.
        let mut requests = Vec::new();
        let mut scan = 1_000_000u64;
        for _ in 0..4 {
            requests.extend(0..c / 2);
            requests.extend((0..c / 2).rev());
            requests.extend((0..c).map(|_| {
                scan += 1;
                scan
            }));
        }
        let hot_reads = requests.iter().filter(|&&x| x < c / 2).count();
        let mut arc: Lists<u64, u64> = Lists::new(c);
        let arc_hits = requests
            .iter()
            .filter(|&&x| access(&mut arc, x, 1) && x < c / 2)
            .count();
        let lru = lru_hits(c as usize, &requests);
        // Both keep the hot set from a round's first pass to its second; only the ARC keeps
        // it through the scan, from the second round on (7 of 8 passes hit).
        assert!(
            arc_hits * 8 >= hot_reads * 7,
            "ARC: {arc_hits} of {hot_reads}"
        );
        assert!(lru * 2 <= hot_reads, "LRU: {lru} of {hot_reads}");
        assert!(arc_hits * 2 >= lru * 3);
    }

    #[test]
    fn a_use_again_keeps_a_block_in_its_list_and_moves_it_to_the_front() {
        let mut arc: Lists<u64, u64> = Lists::new(8);
        let mut ev = Vec::new();
        for x in 1..=3 {
            arc.insert(x, x, 1, false, &mut ev);
        }
        assert_eq!(arc.get_again(&1).map(|h| h.1), Some(Hit::Demand));
        assert_eq!(arc.get_again(&1).map(|h| h.1), Some(Hit::Demand));
        // Still in T1, now its most recent: T1's order is most recent first.
        assert_eq!(arc.resident_keys(), (vec![1, 3, 2], vec![]));
        // A block read ahead: its first use is the read it was read ahead for.
        arc.insert(4, 4, 1, true, &mut ev);
        assert_eq!(arc.get_again(&4).map(|h| h.1), Some(Hit::Prefetched));
        assert_eq!(arc.get_again(&4).map(|h| h.1), Some(Hit::Demand));
        assert_eq!(arc.resident_keys().1, Vec::<u64>::new());
        // A real second use still promotes, and a use again of a T2 block keeps it there.
        assert!(arc.get(&2).is_some());
        assert!(arc.get_again(&2).is_some());
        assert_eq!(arc.resident_keys().1, vec![2]);
        assert!(arc.get_again(&99).is_none());
    }

    #[test]
    fn a_prefetched_block_counts_one_use_and_removed_ones_leave_no_ghost() {
        let mut arc: Lists<u64, u64> = Lists::new(4);
        arc.insert(1, 1, 1, true, &mut Vec::new());
        assert_eq!(arc.get(&1).map(|h| h.1), Some(Hit::Prefetched));
        assert_eq!(arc.resident_keys(), (vec![1], vec![]));
        assert_eq!(arc.get(&1).map(|h| h.1), Some(Hit::Demand));
        assert_eq!(arc.resident_keys(), (vec![], vec![1]));
        assert_eq!(arc.remove(&1), Some(1));
        assert_eq!(
            arc.sizes(),
            ListSizes {
                c: 4,
                ..Default::default()
            }
        );
        // With T2 holding a block, the cache full and T1 over its target (0), the oldest of
        // T1 goes to B1; found there, a B1 ghost hit grows p.
        let mut ev = Vec::new();
        arc.insert(1, 1, 1, false, &mut ev);
        assert!(arc.get(&1).is_some());
        for x in 10..14 {
            arc.insert(x, x, 1, false, &mut ev);
        }
        assert_eq!(ev, vec![10]);
        assert_eq!(arc.ghost_keys().0, vec![10]);
        assert_eq!(arc.insert(10, 10, 1, false, &mut ev), Some(Ghost::B1));
        assert_eq!(arc.sizes().p, 1);
        assert!(arc.remove(&99).is_none());
    }
}
