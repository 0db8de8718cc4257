//! Range locks over an object's bytes: a writer holds what it changes until its change and
//! its log record are in place, so two writes that touch the same bytes (or one that merges a
//! whole block, `Writer::write_span`) serialize instead of losing an update, and their
//! records queue in the order they were applied.

use std::collections::BTreeMap;

use parking_lot::{Condvar, Mutex};

pub struct RangeLocks {
    /// Held ranges, first byte -> last byte (inclusive).
    held: Mutex<BTreeMap<u64, u64>>,
    released: Condvar,
}

pub struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    first: u64,
}

impl RangeLocks {
    pub fn new() -> RangeLocks {
        RangeLocks {
            held: Mutex::new(BTreeMap::new()),
            released: Condvar::new(),
        }
    }

    fn overlaps(held: &BTreeMap<u64, u64>, first: u64, last: u64) -> bool {
        // Any held range starting at or before `last` whose end reaches `first`.
        held.range(..=last)
            .next_back()
            .is_some_and(|(_, &end)| end >= first)
            || held.range(first..=last).next().is_some()
    }

    /// Waits until no held range overlaps `first..=last`, then holds it.
    pub fn lock(&self, first: u64, last: u64) -> RangeGuard<'_> {
        assert!(first <= last);
        let mut held = self.held.lock();
        while Self::overlaps(&held, first, last) {
            self.released.wait(&mut held);
        }
        held.insert(first, last);
        RangeGuard { locks: self, first }
    }

    /// Holds `first..=last` if no held range overlaps it; `None` rather than wait.
    pub fn try_lock(&self, first: u64, last: u64) -> Option<RangeGuard<'_>> {
        assert!(first <= last);
        let mut held = self.held.try_lock()?;
        if Self::overlaps(&held, first, last) {
            return None;
        }
        held.insert(first, last);
        Some(RangeGuard { locks: self, first })
    }
}

impl Default for RangeLocks {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        self.locks.held.lock().remove(&self.first);
        self.locks.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn overlapping_ranges_exclude_each_other() {
        let locks = Arc::new(RangeLocks::new());
        let inside = Arc::new(AtomicU32::new(0));
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (locks, inside) = (locks.clone(), inside.clone());
                s.spawn(move || {
                    for i in 0..200u64 {
                        let first = (t + i) % 3;
                        let _g = locks.lock(first, first + 2);
                        // Every range covers block 2, so at most one holder is ever inside.
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        let _a = locks.lock(0, 1);
        let _b = locks.lock(2, 3); // disjoint ranges do not wait
    }

    #[test]
    fn try_lock_refuses_only_overlaps() {
        let locks = RangeLocks::new();
        let held = locks.lock(4096, 8191);
        assert!(locks.try_lock(8000, 8191).is_none(), "inside");
        assert!(locks.try_lock(0, 4096).is_none(), "its first byte");
        assert!(locks.try_lock(8191, 9000).is_none(), "its last byte");
        assert!(locks.try_lock(0, 16383).is_none(), "around it");
        let next = locks.try_lock(8192, 12287).expect("the bytes after it");
        assert!(locks.try_lock(8192, 8192).is_none(), "held by try_lock");
        drop(held);
        drop(next);
        assert!(locks.try_lock(0, 16383).is_some(), "all released");
    }
}
