//! The maps of an object's unsynced changes, by block id.
//!
//! The open txg's map is looked up on every write (twice for a short one: whether it can
//! patch, then to lay the patch) and grows to tens of thousands of blocks per txg under
//! random writes. As an ordered tree that cost a chain of cache misses per look-up: 4K sync
//! writes into 16K blocks spent 12 % of the NBD server's samples searching it. So it is a
//! hash map, and only the syncing txg's map is kept in block order, sorted once when the txg
//! closes: the sync writes blocks in that order and walks the tree up from them in it.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::ops::Range;

use rustc_hash::FxHasher;

use super::Dirty;

/// The open txg's changes.
pub type OpenMap = HashMap<u64, Dirty, BuildHasherDefault<FxHasher>>;

/// How many of the open txg's changes fall in each group of blocks under one level-1
/// indirect block, by group (`Object`'s count of the indirect blocks its sync writes).
pub type GroupMap = HashMap<u64, u32, BuildHasherDefault<FxHasher>>;

/// The most changes a new open map makes room for at once (`open_map_after`).
const OPEN_ROOM_MAX: usize = 1 << 14;

/// The open map that follows one of `closed` changes: empty, with room for as many, up to
/// `OPEN_ROOM_MAX`. A txg tends to dirty as many blocks as the last one, and growing the
/// table under the object's lock rehashes every entry; but a txg of a streaming write can
/// dirty a quarter of a million blocks, and the next may dirty few.
pub fn open_map_after(closed: usize) -> OpenMap {
    OpenMap::with_capacity_and_hasher(closed.min(OPEN_ROOM_MAX), Default::default())
}

/// The ids of the open map's changes in `range`, in order, with whether each holds data
/// (not `Dirty::Free`). A short range is looked up block by block; a long one scans the map.
pub fn open_range(map: &OpenMap, range: Range<u64>) -> Vec<(u64, bool)> {
    let span = range.end.saturating_sub(range.start);
    if span <= map.len() as u64 {
        range
            .filter_map(|b| map.get(&b).map(|d| (b, d.holds_data())))
            .collect()
    } else {
        let mut v: Vec<(u64, bool)> = (map.iter())
            .filter(|(b, _)| range.contains(b))
            .map(|(&b, d)| (b, d.holds_data()))
            .collect();
        v.sort_unstable_by_key(|e| e.0);
        v
    }
}

/// A syncing txg's changes, in block order.
pub struct SyncingMap(Vec<(u64, Dirty)>);

impl SyncingMap {
    /// Sorts a closed txg's changes. Never empty: a txg with no change has nothing to sync.
    pub fn from_open(open: OpenMap) -> SyncingMap {
        assert!(!open.is_empty(), "a syncing map holds changes");
        let mut v: Vec<(u64, Dirty)> = open.into_iter().collect();
        v.sort_unstable_by_key(|e| e.0);
        SyncingMap(v)
    }

    pub fn get(&self, blkid: u64) -> Option<&Dirty> {
        (self.0.binary_search_by_key(&blkid, |e| e.0).ok()).map(|i| &self.0[i].1)
    }

    /// The changes to blocks in `range`, in order.
    pub fn range(&self, range: Range<u64>) -> &[(u64, Dirty)] {
        let from = self.0.partition_point(|e| e.0 < range.start);
        let to = self.0.partition_point(|e| e.0 < range.end);
        &self.0[from..to.max(from)]
    }

    /// Every change, in block order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Dirty)> {
        self.0.iter().map(|(b, d)| (*b, d))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The highest block id changed.
    pub fn last_blkid(&self) -> u64 {
        self.0.last().expect("never empty").0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_with(blocks: &[(u64, bool)]) -> OpenMap {
        let mut m = OpenMap::default();
        for &(b, data) in blocks {
            let d = if data {
                Dirty::Data(std::sync::Arc::new(vec![1; 8]))
            } else {
                Dirty::Free
            };
            m.insert(b, d);
        }
        m
    }

    #[test]
    fn open_ranges_come_in_block_order_either_way_they_are_found() {
        let blocks = [(900, true), (3, false), (7, true), (5, true), (1000, true)];
        let m = open_with(&blocks);
        // Shorter than the map: looked up block by block.
        assert_eq!(open_range(&m, 4..8), vec![(5, true), (7, true)]);
        // Longer: scanned, then sorted.
        assert_eq!(
            open_range(&m, 0..1000),
            vec![(3, false), (5, true), (7, true), (900, true)]
        );
        assert_eq!(open_range(&m, 1001..5000), vec![]);
        assert_eq!(open_range(&m, 8..8), vec![]);
    }

    #[test]
    fn the_next_open_map_has_room_for_the_last_one_up_to_a_bound() {
        assert!(open_map_after(1000).capacity() >= 1000);
        let after_a_stream = open_map_after(1 << 18).capacity();
        assert!((OPEN_ROOM_MAX..1 << 18).contains(&after_a_stream));
        assert_eq!(open_map_after(0).capacity(), 0);
    }

    #[test]
    fn a_syncing_map_finds_its_changes_in_order() {
        let m = SyncingMap::from_open(open_with(&[(9, true), (2, false), (4, true)]));
        assert_eq!(m.iter().map(|e| e.0).collect::<Vec<_>>(), vec![2, 4, 9]);
        assert!(matches!(m.get(2), Some(Dirty::Free)));
        assert!(matches!(m.get(9), Some(Dirty::Data(_))));
        assert!(m.get(3).is_none() && m.get(10).is_none());
        let ids = |r: &[(u64, Dirty)]| r.iter().map(|e| e.0).collect::<Vec<_>>();
        assert_eq!(ids(m.range(3..9)), vec![4]);
        assert_eq!(ids(m.range(0..100)), vec![2, 4, 9]);
        assert_eq!(ids(m.range(10..20)), Vec::<u64>::new());
        // A range that ends before it starts (a shrink's) holds nothing.
        let (start, end) = (5, 3);
        assert_eq!(ids(m.range(start..end)), Vec::<u64>::new());
        assert_eq!(open_range(&open_with(&[(4, true)]), start..end), vec![]);
        assert_eq!((m.len(), m.last_blkid()), (3, 9));
    }
}
