//! Writing the labels of every leaf (the config, or a txg's uberblock) so that a leaf which
//! fails the update drops out of it while the rest go on, as long as each top-level vdev
//! keeps a leaf that took every write.

use std::sync::Arc;

use crate::vdev::{Leaf, TopVdev, VdevError};

use super::PoolError;

/// A write to the labels of every leaf (an uberblock or a config), done in steps such as
/// write, then flush. It has the success rule of a mirror write (`TopVdev::write`): a leaf may
/// fail, as long as every data vdev keeps at least one leaf that took every step, so that
/// some label on each vdev describes the update. Log devices (the tops after the first
/// `required`) take part but may drop out entirely: the pool imports without them.
pub(super) struct LabelUpdate<'a> {
    tops: &'a [Arc<TopVdev>],
    required: usize,
    what: String,
    /// Per top-level vdev and leaf: why the leaf dropped out, or None while it takes part.
    dropped: Vec<Vec<Option<Dropped>>>,
}

/// What one leaf made of a step.
type LeafResult = Result<(), VdevError>;

/// Why a leaf dropped out of a label update.
struct Dropped {
    why: String,
    /// Its device had no room for the write (`VdevError::out_of_space`).
    out_of_space: bool,
}

impl Dropped {
    fn fault(why: String) -> Self {
        Dropped {
            why,
            out_of_space: false,
        }
    }
}

impl<'a> LabelUpdate<'a> {
    pub(super) fn new(tops: &'a [Arc<TopVdev>], required: usize, what: String) -> Self {
        // An offline leaf takes no part: its labels keep describing what it holds.
        let dropped = tops
            .iter()
            .map(|t| {
                t.children
                    .iter()
                    .map(|l| {
                        l.is_offline()
                            .then(|| Dropped::fault(format!("{}: offline", l.name())))
                    })
                    .collect()
            })
            .collect();
        LabelUpdate {
            tops,
            required,
            what,
            dropped,
        }
    }

    /// Drops the leaves that missed a block of txg `txg` which their vdev took without them
    /// (`Leaf::owes`). Such a leaf lacks a block the new labels point at: its labels must not
    /// claim that block, and its flush cannot make that block durable.
    ///
    /// Unless every leaf still taking part on some data vdev missed a block of the txg (file
    /// systems under a mirror filling one a moment after the other while the txg was open):
    /// each of those blocks was written as its vdev's rule asks (a copy on a mirror, all but
    /// the parity's columns on a raidz), so the vdev holds the whole txg among its leaves,
    /// though none holds all of it. Those leaves stay in the update rather than fail the txg
    /// and suspend the pool; returns true then, and before its uberblock the caller must
    /// write a config that says they owe the txg, since their uberblocks will not tell.
    pub(super) fn drop_leaves_that_missed(&mut self, txg: u64) -> Result<bool, PoolError> {
        let mut kept = false;
        for (t, top) in self.tops.iter().enumerate() {
            let missed: Vec<bool> = top
                .children
                .iter()
                .map(|l| l.missed.lock().contains(txg))
                .collect();
            let live: Vec<bool> = self.dropped[t].iter().map(Option::is_none).collect();
            let missers = (0..missed.len()).filter(|&l| missed[l] && live[l]);
            if t < self.required && (0..live.len()).all(|l| missed[l] || !live[l]) {
                kept |= missers.count() > 0;
                continue;
            }
            for (l, leaf) in top.children.iter().enumerate() {
                if missed[l] && live[l] {
                    self.dropped[t][l] =
                        Some(Dropped::fault(format!("{}: missed a write", leaf.name())));
                }
            }
        }
        self.check().map(|()| kept)
    }

    /// Runs `op` on every leaf still taking part, in parallel. A leaf it fails on counts a
    /// write error and drops out: after a failed write or flush its earlier writes are in
    /// doubt, so a later flush could not vouch for them (a flush is never retried). Fails
    /// once some top-level vdev has no leaf left.
    pub(super) fn step(
        &mut self,
        op: impl Fn(&Leaf) -> Result<(), VdevError> + Sync,
    ) -> Result<(), PoolError> {
        let (live, results) = self.run(&op);
        self.settle(&live, results)
    }

    /// `step` for a write that may be tried again (an uberblock's, not a flush): while every
    /// leaf left on some data vdev fails it for lack of room, none of them is charged with
    /// it, and as long as `wait` (the pool's wait for room) says to go on, it is tried again
    /// on the same leaves. Not for flushes: a flush that failed cannot vouch for the writes
    /// before it, whatever it says the next time.
    pub(super) fn write_step(
        &mut self,
        op: impl Fn(&Leaf) -> Result<(), VdevError> + Sync,
        mut wait: impl FnMut(&VdevError) -> bool,
    ) -> Result<(), PoolError> {
        loop {
            let (live, results) = self.run(&op);
            let no_room = (0..self.required).find_map(|t| {
                let mut on_top = live.iter().zip(&results).filter(|((lt, _), _)| *lt == t);
                let first = on_top.clone().next()?.1.as_ref().err()?;
                on_top
                    .all(|(_, r)| r.as_ref().is_err_and(VdevError::out_of_space))
                    .then_some(first)
            });
            match no_room {
                Some(e) if wait(e) => continue,
                _ => return self.settle(&live, results),
            }
        }
    }

    /// Runs `op` on every leaf still taking part, in parallel; gives the leaves (top, leaf)
    /// and their results.
    fn run(
        &self,
        op: &(impl Fn(&Leaf) -> Result<(), VdevError> + Sync),
    ) -> (Vec<(usize, usize)>, Vec<LeafResult>) {
        use rayon::prelude::*;
        let live: Vec<(usize, usize)> = self
            .dropped
            .iter()
            .enumerate()
            .flat_map(|(t, leaves)| {
                leaves
                    .iter()
                    .enumerate()
                    .filter(|(_, why)| why.is_none())
                    .map(move |(l, _)| (t, l))
            })
            .collect();
        // A lone leaf is served by this thread: rayon would hand it to a worker and wait.
        let results: Vec<LeafResult> = if live.len() == 1 {
            live.iter()
                .map(|&(t, l)| op(&self.tops[t].children[l]))
                .collect()
        } else {
            live.par_iter()
                .map(|&(t, l)| op(&self.tops[t].children[l]))
                .collect()
        };
        (live, results)
    }

    /// Drops (and charges) the leaves whose `run` failed; fails once some top-level vdev
    /// has no leaf left.
    fn settle(
        &mut self,
        live: &[(usize, usize)],
        results: Vec<LeafResult>,
    ) -> Result<(), PoolError> {
        for (&(t, l), r) in live.iter().zip(results) {
            if let Err(e) = r {
                self.tops[t].children[l].count_write_error();
                self.dropped[t][l] = Some(Dropped {
                    why: e.to_string(),
                    out_of_space: e.out_of_space(),
                });
            }
        }
        self.check()
    }

    /// The data leaves that did not take every step (offline, or failed a write or a step):
    /// they owe a resilver. (A log device holds nothing a resilver could give back.)
    pub(super) fn dropped_leaves(&self) -> impl Iterator<Item = &Arc<Leaf>> {
        let data = &self.tops[..self.required];
        data.iter().zip(&self.dropped).flat_map(|(top, why)| {
            top.children
                .iter()
                .zip(why)
                .filter(|(_, w)| w.is_some())
                .map(|(l, _)| l)
        })
    }

    pub(super) fn check(&self) -> Result<(), PoolError> {
        let data = &self.tops[..self.required];
        for (top, leaves) in data.iter().zip(&self.dropped) {
            if leaves.iter().all(Option::is_some) {
                let why: Vec<&str> = leaves.iter().flatten().map(|d| d.why.as_str()).collect();
                return Err(PoolError::VdevLost {
                    vdev: top.id,
                    what: self.what.clone(),
                    why: why.join("; "),
                    out_of_space: leaves.iter().flatten().all(|d| d.out_of_space),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::mem::{Faults, MemDevice};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn mirror(n: usize) -> (Vec<Arc<TopVdev>>, Vec<Arc<MemDevice>>) {
        let (top, devs) = crate::vdev::top::mem_mirror(n, 9);
        (vec![Arc::new(top)], devs)
    }

    fn fail(writes: bool, flush: bool) -> Faults {
        Faults {
            fail_writes: writes,
            fail_flush: flush,
            ..Faults::default()
        }
    }

    /// A label write that finds no room on any leaf of a vdev waits for room (as long as the
    /// pool's wait says so) and is tried again on the same leaves, none charged with it.
    #[test]
    fn a_label_write_without_room_anywhere_waits_and_is_tried_again() {
        let (tops, devs) = mirror(2);
        let full = Faults {
            full: true,
            ..Faults::default()
        };
        let write = |leaf: &Leaf| leaf.write_label(0, 0, &[7u8; 512]);
        for d in &devs {
            d.set_faults(full.clone());
        }
        let mut update = LabelUpdate::new(&tops, tops.len(), "test labels".into());
        let mut waits = 0;
        update
            .write_step(write, |e| {
                assert!(e.out_of_space(), "{e}");
                waits += 1;
                if waits == 3 {
                    devs.iter().for_each(|d| d.set_faults(Faults::default()));
                }
                true
            })
            .unwrap();
        assert_eq!(waits, 3);
        assert_eq!(update.dropped_leaves().count(), 0);
        for c in &tops[0].children {
            assert_eq!(c.counters.write_errors.load(Ordering::Relaxed), 0);
        }
        // A wait given up (the pool closing) fails the update as out of space.
        for d in &devs {
            d.set_faults(full.clone());
        }
        let mut update = LabelUpdate::new(&tops, tops.len(), "test labels".into());
        match update.write_step(write, |_| false) {
            Err(PoolError::VdevLost { out_of_space, .. }) => assert!(out_of_space),
            other => panic!("{:?}", other.err()),
        }
        // One leaf with room takes the write; the other drops out, charged, with no wait.
        devs[0].set_faults(Faults::default());
        let mut update = LabelUpdate::new(&tops, tops.len(), "test labels".into());
        update.write_step(write, |_| panic!("no wait")).unwrap();
        assert_eq!(update.dropped_leaves().count(), 1);
    }

    #[test]
    fn a_failed_leaf_drops_out_of_a_label_update_and_the_rest_go_on() {
        let (tops, devs) = mirror(2);
        let mut update = LabelUpdate::new(&tops, tops.len(), "test labels".into());
        devs[1].set_faults(fail(true, false));
        let calls = AtomicUsize::new(0);
        let op = |leaf: &Leaf| {
            calls.fetch_add(1, Ordering::Relaxed);
            leaf.write_label(0, 0, &[7u8; 512])
        };
        update.step(op).unwrap();
        // The failed leaf is not asked again, even though it would now succeed.
        devs[1].set_faults(Faults::default());
        update.step(op).unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        let errors = |l: usize| {
            tops[0].children[l]
                .counters
                .write_errors
                .load(Ordering::Relaxed)
        };
        assert_eq!((errors(0), errors(1)), (0, 1));
    }

    /// Each leaf of a mirror misses a different block of txg 5 (the other took it): the
    /// vdev holds the txg only among its leaves, so both stay in the update, and the caller
    /// is told to record what they owe. A block of another txg missed counts for nothing.
    #[test]
    fn leaves_that_each_missed_part_of_a_txg_all_stay_in_its_update() {
        let (tops, devs) = mirror(2);
        for (l, at) in [(0, 0), (1, 4096)] {
            devs[l].set_faults(fail(true, false));
            tops[0].write_run(at, &[&[1u8; 4096]], Some(5)).unwrap();
            devs[l].set_faults(Faults::default());
        }
        let mut update = LabelUpdate::new(&tops, tops.len(), "the uberblock of txg 6".into());
        assert!(!update.drop_leaves_that_missed(6).unwrap());
        assert_eq!(update.dropped_leaves().count(), 0);
        let mut update = LabelUpdate::new(&tops, tops.len(), "the uberblock of txg 5".into());
        assert!(update.drop_leaves_that_missed(5).unwrap());
        assert_eq!(update.dropped_leaves().count(), 0);
        let calls = AtomicUsize::new(0);
        update
            .step(|_| {
                calls.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
            .unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_label_update_needs_a_leaf_per_vdev_that_took_every_write() {
        let (tops, devs) = mirror(2);
        let mut update = LabelUpdate::new(&tops, tops.len(), "the uberblock of txg 5".into());
        // Leaf 0 misses a data write of the txg, which the mirror survives on leaf 1.
        devs[0].set_faults(fail(true, false));
        tops[0].write_run(0, &[&[1u8; 4096]], Some(5)).unwrap();
        devs[0].set_faults(Faults::default());
        assert!(
            !update.drop_leaves_that_missed(5).unwrap(),
            "leaf 1 took it all"
        );
        // Leaf 1, the only one holding the block, cannot flush: leaf 0's flush would not make
        // the block durable, so the update must fail rather than label leaf 0.
        devs[1].set_faults(fail(false, true));
        let err = update.step(|leaf| leaf.flush()).unwrap_err();
        assert!(matches!(err, PoolError::VdevLost { vdev: 0, .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("the uberblock of txg 5")
                && msg.contains("m0: missed a write")
                && msg.contains("m1: injected flush error"),
            "{msg}"
        );
    }
}
