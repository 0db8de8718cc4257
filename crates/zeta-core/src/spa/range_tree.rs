//! Sets of disjoint byte ranges. Adjacent ranges merge, so the segment count is a fair
//! measure of fragmentation.
//!
//! [`RangeTree`] also indexes its segments by size, for the allocator's best-fit and
//! largest-segment queries: the in-memory free space of a metaslab. [`RangeSet`] keeps no such
//! index, for sets that are only added to, taken from and walked (a metaslab's deferred frees
//! and its allocations not yet in a space map): under random 128K writes half of the
//! allocator's range operations went to those sets, and each kept a size index no query read.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

/// What a set of ranges keeps beside its segments by start: told of every segment that
/// enters or leaves.
pub trait SegmentIndex: Default + Clone + std::fmt::Debug {
    fn inserted(&mut self, start: u64, end: u64);
    fn removed(&mut self, start: u64, end: u64);
}

/// No index.
#[derive(Default, Clone, Debug)]
pub struct NoIndex;

impl SegmentIndex for NoIndex {
    fn inserted(&mut self, _: u64, _: u64) {}
    fn removed(&mut self, _: u64, _: u64) {}
}

/// The segments by (length, start), and their histogram.
#[derive(Default, Clone, Debug)]
pub struct BySize {
    by_len: BTreeSet<(u64, u64)>,
    hist: Histogram,
}

impl SegmentIndex for BySize {
    fn inserted(&mut self, s: u64, e: u64) {
        self.by_len.insert((e - s, s));
        self.hist.add(e - s);
    }
    fn removed(&mut self, s: u64, e: u64) {
        self.by_len.remove(&(e - s, s));
        self.hist.remove(e - s);
    }
}

/// Segments by power-of-two size class: bucket `i` holds those of 2^i to 2^(i+1)-1 bytes,
/// with how many there are and how many bytes they hold. Kept as segments come and go, so
/// the fragmentation metric (`spa::frag`) costs no walk of the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Histogram {
    pub count: [u64; 64],
    pub bytes: [u64; 64],
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            count: [0; 64],
            bytes: [0; 64],
        }
    }
}

impl Histogram {
    /// The bucket of a segment of `len` bytes (`len` > 0).
    pub fn bucket(len: u64) -> usize {
        debug_assert!(len > 0);
        63 - len.leading_zeros() as usize
    }

    pub fn add(&mut self, len: u64) {
        let b = Self::bucket(len);
        self.count[b] += 1;
        self.bytes[b] += len;
    }

    pub fn remove(&mut self, len: u64) {
        let b = Self::bucket(len);
        assert!(
            self.count[b] > 0,
            "histogram: removing a segment it never had"
        );
        self.count[b] -= 1;
        self.bytes[b] -= len;
    }

    /// Adds another histogram's segments to this one (a vdev's from its metaslabs').
    pub fn merge(&mut self, other: &Histogram) {
        for i in 0..64 {
            self.count[i] += other.count[i];
            self.bytes[i] += other.bytes[i];
        }
    }

    /// The histogram of `segments`, counted afresh.
    pub fn of(segments: impl Iterator<Item = (u64, u64)>) -> Histogram {
        let mut h = Histogram::default();
        segments.for_each(|(s, e)| h.add(e - s));
        h
    }
}

/// A set of disjoint ranges with index `I` (see [`RangeTree`], [`RangeSet`]).
#[derive(Default, Clone, Debug)]
pub struct Ranges<I: SegmentIndex> {
    /// start -> end (exclusive).
    segs: BTreeMap<u64, u64>,
    index: I,
    space: u64,
}

/// Ranges indexed by size as well: free space to allocate from.
pub type RangeTree = Ranges<BySize>;

/// Ranges by start only.
pub type RangeSet = Ranges<NoIndex>;

#[derive(Debug, PartialEq, Eq)]
pub struct Overlap;

impl<I: SegmentIndex> Ranges<I> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn space(&self) -> u64 {
        self.space
    }

    pub fn segments(&self) -> usize {
        self.segs.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.segs.iter().map(|(&s, &e)| (s, e))
    }

    /// The segment containing `offset`, if any.
    fn containing(&self, offset: u64) -> Option<(u64, u64)> {
        self.segs
            .range(..=offset)
            .next_back()
            .map(|(&s, &e)| (s, e))
            .filter(|&(_, e)| offset < e)
    }

    pub fn contains(&self, start: u64, len: u64) -> bool {
        self.containing(start)
            .is_some_and(|(_, e)| start + len <= e)
    }

    pub fn overlaps(&self, start: u64, len: u64) -> bool {
        let end = start + len;
        if self.containing(start).is_some() {
            return true;
        }
        self.segs.range(start..end).next().is_some()
    }

    fn insert_seg(&mut self, s: u64, e: u64) {
        self.segs.insert(s, e);
        self.index.inserted(s, e);
    }

    fn remove_seg(&mut self, s: u64, e: u64) {
        self.segs.remove(&s);
        self.index.removed(s, e);
    }

    /// Adds a range that must not overlap any present one.
    pub fn try_add(&mut self, start: u64, len: u64) -> Result<(), Overlap> {
        assert!(len > 0);
        let (mut s, mut e) = (start, start + len);
        // One lookup finds the segment at or before the range (which must end by its start)
        // and one the segment after it (which must start at or past its end).
        let before = self.segs.range(..=s).next_back().map(|(&a, &b)| (a, b));
        if before.is_some_and(|(_, pe)| pe > s) {
            return Err(Overlap);
        }
        let after = self.segs.range(s + 1..).next().map(|(&a, &b)| (a, b));
        if after.is_some_and(|(ns, _)| ns < e) {
            return Err(Overlap);
        }
        if let Some((ps, pe)) = before.filter(|&(_, pe)| pe == s) {
            self.remove_seg(ps, pe);
            s = ps;
        }
        if let Some((ns, ne)) = after.filter(|&(ns, _)| ns == e) {
            self.remove_seg(ns, ne);
            e = ne;
        }
        self.insert_seg(s, e);
        self.space += len;
        Ok(())
    }

    /// Removes a range that must lie wholly inside one present segment.
    pub fn try_remove(&mut self, start: u64, len: u64) -> Result<(), Overlap> {
        assert!(len > 0);
        let (s, e) = self.containing(start).ok_or(Overlap)?;
        let end = start + len;
        if end > e {
            return Err(Overlap);
        }
        self.remove_seg(s, e);
        if s < start {
            self.insert_seg(s, start);
        }
        if end < e {
            self.insert_seg(end, e);
        }
        self.space -= len;
        Ok(())
    }

    /// Adds a range that may overlap present ones (the set becomes their union).
    pub fn union(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (mut s, mut e) = (start, start + len);
        // Every segment that overlaps or touches [s, e) merges into it.
        let touching: Vec<(u64, u64)> = self
            .segs
            .range(..=e)
            .rev()
            .take_while(|&(_, &se)| se >= s)
            .map(|(&a, &b)| (a, b))
            .collect();
        for (a, b) in touching {
            self.remove_seg(a, b);
            self.space -= b - a;
            s = s.min(a);
            e = e.max(b);
        }
        self.insert_seg(s, e);
        self.space += e - s;
    }

    pub fn add(&mut self, start: u64, len: u64) {
        self.try_add(start, len)
            .expect("range tree: adding an overlapping range")
    }

    pub fn remove(&mut self, start: u64, len: u64) {
        self.try_remove(start, len)
            .expect("range tree: removing a range that is not present")
    }
}

impl Ranges<BySize> {
    pub fn largest(&self) -> u64 {
        self.index
            .by_len
            .iter()
            .next_back()
            .map_or(0, |&(len, _)| len)
    }

    /// The space in segments counted in whole `piece`s: what blocks of that size can take.
    pub fn space_in_pieces(&self, piece: u64) -> u64 {
        self.index
            .by_len
            .iter()
            .rev()
            .take_while(|&&(len, _)| len >= piece)
            .map(|&(len, _)| len - len % piece)
            .sum()
    }

    /// The free segments by size class, as kept (not counted afresh).
    pub fn histogram(&self) -> &Histogram {
        &self.index.hist
    }

    /// Takes `len` bytes found by [`find`](Self::find) from `cursor`, and moves the cursor past
    /// them (next fit: successive allocations land in order). `None` if nothing fits.
    pub fn take(&mut self, len: u64, cursor: &mut u64) -> Option<u64> {
        if self.largest() < len {
            return None;
        }
        let off = self.find(len, *cursor)?;
        self.remove(off, len);
        *cursor = off + len;
        Some(off)
    }

    /// Takes `len` bytes to continue or start a run: at `cursor` if the segment there holds
    /// them (the run goes on), else at the start of the smallest segment of at least
    /// `min_run` bytes (and `len`), moving the cursor past them. `None` if no segment is that
    /// large: the metaslab has only holes left, which `take_best_fit` fills.
    ///
    /// Successive blocks then lie one after another and leave in one device write, however
    /// scattered the metaslab's other free space is: next fit took the first hole past the
    /// cursor, so under random small overwrites the device saw about one block per write.
    pub fn take_run(&mut self, len: u64, cursor: &mut u64, min_run: u64) -> Option<u64> {
        let off = match self.containing(*cursor) {
            Some((_, e)) if e - *cursor >= len => *cursor,
            _ => {
                let want = min_run.max(len);
                self.index
                    .by_len
                    .range((want, 0)..)
                    .next()
                    .map(|&(_, s)| s)?
            }
        };
        self.remove(off, len);
        *cursor = off + len;
        Some(off)
    }

    /// `take` from the smallest segment that holds `len` bytes (best fit), the cursor left
    /// where it was: near full, blocks refill the holes that blocks of their size left, and
    /// larger segments stay for larger blocks (a txg's indirect blocks).
    pub fn take_best_fit(&mut self, len: u64) -> Option<u64> {
        let off = self
            .index
            .by_len
            .range((len, 0)..)
            .next()
            .map(|&(_, s)| s)?;
        self.remove(off, len);
        Some(off)
    }

    /// Finds room for `len` bytes: first fit at or after `cursor` among the next few
    /// segments (keeps sequential writes sequential), else the smallest segment that fits.
    pub fn find(&self, len: u64, cursor: u64) -> Option<u64> {
        if let Some((_, e)) = self.containing(cursor) {
            if e - cursor >= len {
                return Some(cursor);
            }
        }
        for (&s, &e) in self
            .segs
            .range((Bound::Excluded(cursor), Bound::Unbounded))
            .take(16)
        {
            if e - s >= len {
                return Some(s);
            }
        }
        self.index.by_len.range((len, 0)..).next().map(|&(_, s)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn space_in_pieces_counts_only_whole_pieces_of_each_segment() {
        let mut t = RangeTree::new();
        t.add(0, 300);
        t.add(1000, 99);
        t.add(2000, 100);
        assert_eq!(t.space(), 499);
        assert_eq!(t.space_in_pieces(100), 300 + 100);
        assert_eq!(t.space_in_pieces(1), 499);
        assert_eq!(t.space_in_pieces(301), 0);
    }

    #[test]
    fn best_fit_fills_the_smallest_hole_that_holds_the_block_and_spares_larger_ones() {
        let mut t = RangeTree::new();
        t.add(0, 1000);
        t.add(2000, 8);
        t.add(3000, 12);
        t.add(4000, 16);
        assert_eq!(t.take_best_fit(8), Some(2000));
        assert_eq!(
            t.take_best_fit(8),
            Some(3000),
            "the 12-byte hole before the 16"
        );
        assert_eq!(t.take_best_fit(16), Some(4000));
        assert_eq!(t.take_best_fit(16), Some(0));
        assert_eq!(t.take_best_fit(1000), None);
        assert_eq!(t.space(), 1000 - 16 + 4);
    }

    #[test]
    fn a_run_goes_on_at_the_cursor_and_starts_only_in_a_large_segment() {
        let mut t = RangeTree::new();
        t.add(0, 8); // holes of a block
        t.add(100, 8);
        t.add(1000, 64); // large enough to start a run
        t.add(2000, 200);
        let mut cursor = 0;
        // The cursor's hole holds the block: the run goes on there.
        assert_eq!(t.take_run(8, &mut cursor, 64), Some(0));
        // Past it no hole holds one: the smallest large segment starts the next run.
        assert_eq!(t.take_run(8, &mut cursor, 64), Some(1000));
        assert_eq!(t.take_run(8, &mut cursor, 64), Some(1008));
        assert_eq!(cursor, 1016);
        // The rest of that segment is small now, but the run continues in it.
        for i in 0..6 {
            assert_eq!(t.take_run(8, &mut cursor, 64), Some(1016 + 8 * i));
        }
        assert_eq!(t.take_run(8, &mut cursor, 64), Some(2000));
        let mut far = 5000;
        assert_eq!(t.take_run(300, &mut far, 64), None, "nothing that large");
        assert_eq!(
            t.take_run(8, &mut far, 500),
            None,
            "no segment of a run's size"
        );
        assert!(t.contains(100, 8), "holes are left for best fit");
    }

    #[test]
    fn merge_split_and_queries() {
        let mut t = RangeTree::new();
        t.add(0, 10);
        t.add(20, 10);
        t.add(10, 10); // bridges both
        assert_eq!(t.segments(), 1);
        assert_eq!(t.space(), 30);
        t.remove(5, 10);
        assert_eq!(t.iter().collect::<Vec<_>>(), vec![(0, 5), (15, 30)]);
        assert_eq!(t.largest(), 15);
        assert_eq!(t.try_add(4, 2), Err(Overlap));
        assert_eq!(t.try_remove(4, 2), Err(Overlap));
        assert_eq!(t.try_remove(10, 1), Err(Overlap));
        assert!(t.contains(16, 14) && !t.contains(16, 15));
        assert_eq!(t.find(10, 0), Some(15));
        assert_eq!(t.find(3, 1), Some(1));
        assert_eq!(t.find(16, 0), None);
    }

    #[test]
    fn union_matches_a_bitmap_model() {
        union_model::<BySize>();
        union_model::<NoIndex>();
    }

    fn union_model<I: SegmentIndex>() {
        let seed = 0x5eed_0002u64;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut t = Ranges::<I>::new();
        let mut model = vec![false; 600];
        for _ in 0..3_000 {
            let s = rng.gen_range(0..500u64);
            let l = rng.gen_range(0..40u64);
            t.union(s, l);
            model[s as usize..(s + l) as usize]
                .iter_mut()
                .for_each(|b| *b = true);
            assert_eq!(t.space(), model.iter().filter(|&&b| b).count() as u64);
            let q = rng.gen_range(0..560u64);
            let ql = rng.gen_range(1..40u64);
            let all = model[q as usize..(q + ql) as usize].iter().all(|&b| b);
            assert_eq!(t.contains(q, ql), all, "seed {seed}: [{q}, +{ql})");
        }
        let runs = (0..600)
            .filter(|&i| model[i] && (i == 0 || !model[i - 1]))
            .count();
        assert_eq!(t.segments(), runs);
    }

    #[test]
    fn matches_a_bitmap_model_under_random_operations() {
        let sized = random_operations::<BySize>(0x5eed_0001);
        let plain = random_operations::<NoIndex>(0x5eed_0001);
        // Both kinds hold the same segments after the same operations.
        assert_eq!(
            sized.iter().collect::<Vec<_>>(),
            plain.iter().collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_size_index_follows_every_change() {
        let seed = 0x5eed_0003u64;
        let mut t = random_operations::<BySize>(seed);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for _ in 0..2_000 {
            let want: Vec<(u64, u64)> = {
                let mut v: Vec<(u64, u64)> = t.iter().map(|(s, e)| (e - s, s)).collect();
                v.sort();
                v
            };
            assert_eq!(t.index.by_len.iter().copied().collect::<Vec<_>>(), want);
            assert_eq!(t.largest(), want.last().map_or(0, |&(l, _)| l));
            assert_eq!(*t.histogram(), Histogram::of(t.iter()), "seed {seed}");
            // Best fit past the cursor's neighbourhood: the smallest segment that fits.
            let len = rng.gen_range(1..16u64);
            let best = want.iter().find(|&&(l, _)| l >= len).map(|&(_, s)| s);
            assert_eq!(t.find(len, u64::MAX - 1), best, "seed {seed}");
            let mut cursor = rng.gen_range(0..512u64);
            if let Some(off) = t.take(len, &mut cursor) {
                assert_eq!(cursor, off + len);
                assert!(!t.overlaps(off, len));
            } else {
                t.union(rng.gen_range(0..500u64), len);
            }
        }
    }

    /// 20,000 random adds and removes checked against a bitmap; returns the set.
    fn random_operations<I: SegmentIndex>(seed: u64) -> Ranges<I> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut t = Ranges::<I>::new();
        let mut model = vec![false; 512];
        for _ in 0..20_000 {
            let s = rng.gen_range(0..500u64);
            let l = rng.gen_range(1..12u64).min(512 - s);
            let r = s as usize..(s + l) as usize;
            if rng.gen_bool(0.5) {
                let ok = model[r.clone()].iter().all(|&b| !b);
                assert_eq!(t.overlaps(s, l), !ok, "seed {seed}");
                assert_eq!(t.try_add(s, l).is_ok(), ok, "seed {seed}");
                if ok {
                    model[r].iter_mut().for_each(|b| *b = true);
                }
            } else {
                let ok = model[r.clone()].iter().all(|&b| b);
                // try_remove also needs one segment, which holds iff every byte is present.
                assert_eq!(t.try_remove(s, l).is_ok(), ok, "seed {seed}");
                if ok {
                    model[r].iter_mut().for_each(|b| *b = false);
                }
            }
            assert_eq!(t.space(), model.iter().filter(|&&b| b).count() as u64);
        }
        let mut runs = 0;
        for i in 0..512 {
            if model[i] && (i == 0 || !model[i - 1]) {
                runs += 1;
            }
        }
        assert_eq!(t.segments(), runs);
        t
    }
}
