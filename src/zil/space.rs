//! Log space: the region of each top-level vdev reserved for log blocks.
//!
//! Log blocks live for a txg or two, so letting them into the data metaslabs would punch
//! short-lived holes all over them (OpenZFS keeps an "embedded log" metaslab apart for the
//! same reason). Each vdev's last few metaslabs are set aside when the pool is created; the
//! data allocator never sees them. Their free space is kept here, in memory only: which
//! blocks are live is known from the chains themselves (import walks them and claims what
//! they hold), so no space map is written for log churn.

use parking_lot::Mutex;

use crate::spa::range_tree::RangeTree;

/// One vdev's log region: `[start, end)` in the vdev's address space.
struct Region {
    start: u64,
    end: u64,
    free: RangeTree,
    cursor: u64,
}

pub struct LogSpace {
    /// Indexed by top-level vdev id; `None` for a vdev without a log region.
    regions: Vec<Option<Mutex<Region>>>,
}

impl LogSpace {
    /// `regions[v]` is vdev v's log region as (start, length), if it has one.
    pub fn new(regions: &[Option<(u64, u64)>]) -> LogSpace {
        LogSpace {
            regions: regions
                .iter()
                .map(|r| {
                    r.filter(|&(_, len)| len > 0).map(|(start, len)| {
                        let mut free = RangeTree::new();
                        free.add(start, len);
                        Mutex::new(Region {
                            start,
                            end: start + len,
                            free,
                            cursor: start,
                        })
                    })
                })
                .collect(),
        }
    }

    /// The vdevs that have a log region, in id order.
    pub fn vdevs(&self) -> Vec<u32> {
        (0..self.regions.len() as u32)
            .filter(|&v| self.regions[v as usize].is_some())
            .collect()
    }

    /// Takes `asize` bytes on vdev `v`, next-fit from the last allocation (so successive
    /// blocks of a chain land in order, which keeps a device's log writes sequential).
    pub fn alloc(&self, v: u32, asize: u64) -> Option<u64> {
        let mut r = self.regions.get(v as usize)?.as_ref()?.lock();
        let Region { free, cursor, .. } = &mut *r;
        free.take(asize, cursor)
    }

    pub fn free(&self, v: u32, off: u64, asize: u64) {
        if let Some(Some(r)) = self.regions.get(v as usize) {
            r.lock().free.add(off, asize);
        }
    }

    /// Marks a block found in a chain at import as in use. Fails if it lies outside the
    /// region or overlaps another claimed block (a corrupt or hostile header).
    pub fn claim(&self, v: u32, off: u64, asize: u64) -> Result<(), String> {
        let Some(Some(r)) = self.regions.get(v as usize) else {
            return Err(format!("log block on vdev {v}, which has no log space"));
        };
        let mut r = r.lock();
        if off < r.start || off.checked_add(asize).is_none_or(|e| e > r.end) {
            return Err(format!(
                "log block at {off}+{asize} lies outside vdev {v}'s log region"
            ));
        }
        r.free
            .try_remove(off, asize)
            .map_err(|_| format!("log block at {off}+{asize} on vdev {v} is claimed twice"))
    }

    /// Bytes in use and in total, over every region.
    pub fn usage(&self) -> (u64, u64) {
        let mut used = 0;
        let mut total = 0;
        for r in self.regions.iter().flatten() {
            let r = r.lock();
            total += r.end - r.start;
            used += r.end - r.start - r.free.space();
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
        assert!(s.claim(0, (1 << 20) + 32768, 4096).is_err());
        assert!(s.claim(0, 0, 4096).is_err());
        assert!(s.claim(1, 0, 4096).is_err());
        assert!(s.claim(0, u64::MAX - 10, 4096).is_err());
    }
}
