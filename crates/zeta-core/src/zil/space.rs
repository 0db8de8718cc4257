//! Log space: the region of each top-level vdev reserved for log blocks.
//!
//! Log blocks live for a txg or two, so letting them into the data metaslabs would punch
//! short-lived holes all over them (OpenZFS keeps an "embedded log" metaslab apart for the
//! same reason). Each vdev's last few metaslabs are set aside when the pool is created; the
//! data allocator never sees them. Their free space is kept here, in memory only: which
//! blocks are live is known from the chains themselves (import walks them and claims what
//! they hold), so no space map is written for log churn.

use parking_lot::{Mutex, RwLock};

use super::LogIoError;
use crate::spa::range_tree::RangeTree;

/// One vdev's log region: `[start, end)` in the vdev's address space.
struct Region {
    start: u64,
    end: u64,
    free: RangeTree,
    cursor: u64,
}

impl Region {
    fn new(start: u64, len: u64) -> Region {
        let mut free = RangeTree::new();
        free.add(start, len);
        Region {
            start,
            end: start + len,
            free,
            cursor: start,
        }
    }

    fn used(&self) -> u64 {
        self.end - self.start - self.free.space()
    }
}

pub struct LogSpace {
    /// Indexed by top-level vdev id; `None` for a vdev without a log region. The list grows
    /// when a log device is added and loses an entry when one is removed.
    regions: RwLock<Vec<Option<Mutex<Region>>>>,
}

impl LogSpace {
    /// `regions[v]` is vdev v's log region as (start, length), if it has one.
    pub fn new(regions: &[Option<(u64, u64)>]) -> LogSpace {
        let space = LogSpace {
            regions: RwLock::new(Vec::new()),
        };
        for (v, r) in regions.iter().enumerate() {
            if let Some((start, len)) = *r {
                space.add(v as u32, start, len);
            }
        }
        space
    }

    /// Gives vdev `v` a log region (a log device just added). Nothing if `len` is 0.
    pub fn add(&self, v: u32, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let mut regions = self.regions.write();
        if regions.len() <= v as usize {
            regions.resize_with(v as usize + 1, || None);
        }
        regions[v as usize] = Some(Mutex::new(Region::new(start, len)));
    }

    /// Drops vdev `v`'s region; refused while any of it is in use.
    pub fn remove(&self, v: u32) -> Result<(), u64> {
        let mut regions = self.regions.write();
        if let Some(Some(r)) = regions.get(v as usize) {
            let used = r.lock().used();
            if used > 0 {
                return Err(used);
            }
            regions[v as usize] = None;
        }
        Ok(())
    }

    /// The vdevs that have a log region, in id order.
    pub fn vdevs(&self) -> Vec<u32> {
        let regions = self.regions.read();
        (0..regions.len() as u32)
            .filter(|&v| regions[v as usize].is_some())
            .collect()
    }

    /// Takes `asize` bytes on vdev `v`, next-fit from the last allocation (so successive
    /// blocks of a chain land in order, which keeps a device's log writes sequential).
    pub fn alloc(&self, v: u32, asize: u64) -> Option<u64> {
        let regions = self.regions.read();
        let mut r = regions.get(v as usize)?.as_ref()?.lock();
        let Region { free, cursor, .. } = &mut *r;
        free.take(asize, cursor)
    }

    /// The longest run of free bytes on vdev `v` (0 if it has no log region).
    pub fn largest(&self, v: u32) -> u64 {
        match self.regions.read().get(v as usize) {
            Some(Some(r)) => r.lock().free.largest(),
            _ => 0,
        }
    }

    pub fn free(&self, v: u32, off: u64, asize: u64) {
        if let Some(Some(r)) = self.regions.read().get(v as usize) {
            r.lock().free.add(off, asize);
        }
    }

    /// Marks a block found in a chain at import as in use. Fails if it lies outside the
    /// region or overlaps another claimed block (a corrupt or hostile header).
    pub fn claim(&self, v: u32, off: u64, asize: u64) -> Result<(), LogIoError> {
        let regions = self.regions.read();
        let Some(Some(r)) = regions.get(v as usize) else {
            return Err(LogIoError::NoRegion(v));
        };
        let mut r = r.lock();
        if off < r.start || off.checked_add(asize).is_none_or(|e| e > r.end) {
            return Err(LogIoError::OutsideRegion {
                vdev: v,
                off,
                asize,
            });
        }
        r.free
            .try_remove(off, asize)
            .map_err(|_| LogIoError::ClaimedTwice {
                vdev: v,
                off,
                asize,
            })
    }

    /// Bytes in use on vdev `v`'s region (0 if it has none).
    pub fn used(&self, v: u32) -> u64 {
        match self.regions.read().get(v as usize) {
            Some(Some(r)) => r.lock().used(),
            _ => 0,
        }
    }

    /// Bytes in use and in total, over every region.
    pub fn usage(&self) -> (u64, u64) {
        let mut used = 0;
        let mut total = 0;
        for r in self.regions.read().iter().flatten() {
            let r = r.lock();
            total += r.end - r.start;
            used += r.used();
        }
        (used, total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_in_order_frees_and_refuses_bad_claims() {
        let s = LogSpace::new(&[Some((1 << 20, 64 << 10)), None, Some((0, 8192))]);
        assert_eq!(s.vdevs(), vec![0, 2]);
        assert_eq!(s.alloc(0, 8192), Some(1 << 20));
        assert_eq!(s.alloc(0, 8192), Some((1 << 20) + 8192));
        assert_eq!(s.alloc(1, 4096), None);
        assert_eq!(s.alloc(2, 16384), None);
        assert_eq!(s.usage(), (16384, (64 << 10) + 8192));
        s.free(0, 1 << 20, 8192);
        assert_eq!(s.usage().0, 8192);
        // Claims: inside and free is fine, twice or outside is refused.
        assert!(s.claim(0, (1 << 20) + 32768, 4096).is_ok());
        assert!(matches!(
            s.claim(0, (1 << 20) + 32768, 4096),
            Err(LogIoError::ClaimedTwice { .. })
        ));
        assert!(matches!(
            s.claim(0, 0, 4096),
            Err(LogIoError::OutsideRegion { .. })
        ));
        assert!(matches!(s.claim(1, 0, 4096), Err(LogIoError::NoRegion(1))));
        assert!(matches!(
            s.claim(0, u64::MAX - 10, 4096),
            Err(LogIoError::OutsideRegion { .. })
        ));
        // A region is dropped only once nothing in it is used; a new one can be added.
        assert_eq!(s.remove(0), Err(8192 + 4096));
        s.free(0, (1 << 20) + 8192, 8192);
        s.free(0, (1 << 20) + 32768, 4096);
        assert_eq!(s.used(0), 0);
        assert_eq!(s.remove(0), Ok(()));
        assert_eq!(s.vdevs(), vec![2]);
        s.add(5, 0, 1 << 20);
        assert_eq!(s.vdevs(), vec![2, 5]);
        assert_eq!(s.alloc(5, 4096), Some(0));
        assert_eq!(s.usage(), (4096, 8192 + (1 << 20)));
    }
}
