//! What the open txg's latest writes added to the work its sync will do.
//!
//! A txg's sync writes every block it dirtied, whole. Short writes into large blocks (4K into
//! 128K) dirty nearly every block of a volume within a few seconds; after that, each further
//! write lands in a block the sync writes anyway and costs it nothing more. Syncing such a
//! txg at a quarter of the dirty limit rewrites the whole volume twice as often as waiting for
//! half of it would. `Growth` watches a sliding window of the open txg's growth (between one
//! and two `step`s of held bytes) so the pool can tell that case from the one where writes
//! still dirty fresh blocks, where a sync costs in proportion to what it holds.

use parking_lot::Mutex;

/// The pool's running totals at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Point {
    /// What dirty changes hold in memory (all txgs not yet committed).
    pub held: u64,
    /// The dirty bytes a sync is still to write (whole blocks, all txgs not yet committed).
    pub cost: u64,
}

#[derive(Default)]
struct Window {
    /// Which txg was open and which was syncing: the window starts again when either moves
    /// (a sync that begins or ends changes what the totals count).
    epoch: (u64, u64),
    /// The window's start and its midpoint: `cur` moves on each `step` of held bytes, and
    /// `prev` takes its place.
    prev: Option<Point>,
    cur: Point,
}

#[derive(Default)]
pub(super) struct Growth(Mutex<Window>);

impl Growth {
    /// Notes the totals `now` while txg `epoch.0` is open and `epoch.1` syncing (0 if none),
    /// and returns what the last one to two `step`s of held bytes added: `(held, cost)`, or
    /// `None` until the window spans a whole step of this epoch.
    pub fn note(&self, epoch: (u64, u64), now: Point, step: u64) -> Option<(u64, u64)> {
        let mut w = self.0.lock();
        // Totals only fall when a sync ends, and that moves the epoch; a fall seen within one
        // (the sync that ended and the next that began between two notes) restarts it too.
        if w.epoch != epoch || now.held < w.cur.held || now.cost < w.cur.cost {
            *w = Window {
                epoch,
                prev: None,
                cur: now,
            };
            return None;
        }
        if now.held - w.cur.held >= step.max(1) {
            w.prev = Some(w.cur);
            w.cur = now;
        }
        // Within an epoch the totals only grow (a fall restarted it above), so `start`, an
        // earlier `cur`, is below `now` in both.
        let start = w.prev?;
        Some((now.held - start.held, now.cost - start.cost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(held: u64, cost: u64) -> Point {
        Point { held, cost }
    }

    #[test]
    fn the_window_spans_one_to_two_steps_of_the_latest_growth() {
        let g = Growth::default();
        let e = (5, 0);
        assert_eq!(g.note(e, p(0, 0), 10), None);
        // Fresh blocks: 32 bytes of sync work per byte held.
        assert_eq!(g.note(e, p(5, 160), 10), None);
        assert_eq!(g.note(e, p(10, 320), 10), Some((10, 320)));
        // Now every write lands in a dirty block: the window forgets the fresh ones as it
        // moves on.
        assert_eq!(g.note(e, p(15, 320), 10), Some((15, 320)));
        assert_eq!(g.note(e, p(20, 320), 10), Some((10, 0)));
        assert_eq!(g.note(e, p(29, 321), 10), Some((19, 1)));
        assert_eq!(g.note(e, p(30, 321), 10), Some((10, 1)));
    }

    #[test]
    fn a_sync_that_begins_or_ends_starts_the_window_again() {
        let g = Growth::default();
        g.note((5, 0), p(0, 0), 10);
        assert_eq!(g.note((5, 0), p(10, 10), 10), Some((10, 10)));
        // The sync of txg 5 begins: the same totals, another epoch.
        assert_eq!(g.note((6, 5), p(10, 10), 10), None);
        assert_eq!(g.note((6, 5), p(20, 20), 10), Some((10, 10)));
        // It ends: its bytes leave the totals.
        assert_eq!(g.note((6, 0), p(10, 10), 10), None);
        // A fall within what looks like one epoch (a whole sync between two notes).
        g.note((6, 0), p(20, 20), 10);
        assert_eq!(g.note((6, 0), p(5, 30), 10), None);
        assert_eq!(g.note((6, 0), p(15, 30), 10), Some((10, 0)));
    }
}
