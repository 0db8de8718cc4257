//! Scrub: a background walk over every block of a pool that reads every copy of each (every
//! mirror child, every raidz column including parity), verifies it, and rewrites what is bad
//! from what is good.
//!
//! The walk goes through the MOS objects, then the volumes in name order, each in block order
//! (`dmu::object::walk_from`). Its position (volume, next block) is the bookmark: the state is
//! saved in the pool config every `SAVE_EVERY` and when the pool closes, so a scrub survives
//! export and import and resumes there (a crash loses at most the progress since the last
//! save). Each chunk of work starts from the volume's current tree and holds the allocator's
//! frees made since that tree's txg (`Allocator::hold_frees`) while it works, so no block it
//! still points at can be reallocated under it. Between blocks the scrub yields to foreground
//! I/O: when the pool saw reads or writes in the last few milliseconds, it pauses, for at most
//! 50 ms at a time, so that it still advances under constant load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{Pool, PoolError};
use crate::dmu::object::{walk_from, Visit};
use crate::dmu::DnodePhys;
use crate::spa::scan_state::{Bookmark, Damage, ScanFunc, ScanPhase, ScanState};
use crate::spa::BlkPtr;
use crate::vdev::{Leaf, TxgRanges};

/// How often a running scrub saves its bookmark.
const SAVE_EVERY: Duration = Duration::from_secs(30);
/// Blocks scrubbed per chunk (between re-reading the tree and releasing held frees).
const CHUNK_BLOCKS: u64 = 256;
/// Damaged ranges remembered (more are counted in `errors`).
const MAX_DAMAGED: usize = 100;

/// The scanner's place in the pool: the thread running a scrub or resilver, if any, and
/// whether the pool is closing, after which none starts (`close` pauses the running one
/// first, and a resilver started behind it would run on a pool whose sync has stopped).
#[derive(Default)]
pub(super) struct ScanSlot {
    running: Option<Scanner>,
    closed: bool,
    /// `resilver_owed` asked the running scrub to stop for a resilver: if none starts after
    /// all, the scrub goes on.
    yielded: bool,
}

impl ScanSlot {
    /// Marks the pool closing and pauses the scan that runs, if one does.
    pub(super) fn close(&mut self) {
        self.closed = true;
        if let Some(s) = self.running.take() {
            s.pause();
        }
    }

    /// Whether a scan thread is still at work (a finished one is only waiting to be joined).
    fn busy(&self) -> bool {
        self.running
            .as_ref()
            .is_some_and(|s| !s.thread.is_finished())
    }
}

/// The thread running a scrub, and how to stop it.
pub(super) struct Scanner {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Scanner {
    /// Pauses the scrub (its state stays `scanning`, to resume at the next import) and waits
    /// for the thread.
    pub(super) fn pause(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Pool {
    /// Starts a scrub in the background (or resumes a paused one where it stopped).
    pub fn start_scrub(self: &Arc<Self>) -> Result<(), PoolError> {
        // A scan records its progress in the labels and rewrites what it finds bad.
        self.check_writable()?;
        let mut slot = self.scanning.scanner.lock();
        if slot.closed {
            return Err(PoolError::Invalid(format!(
                "pool '{}' is closing",
                self.name
            )));
        }
        // A scanner whose scan is no longer `scanning` is only saving its end (`finish`):
        // a client that saw the scan end and asks for another must not be refused for
        // that, so wait for it (it takes no lock this one holds).
        if self.scanning.scan.lock().state != ScanPhase::Scanning {
            if let Some(s) = slot.running.take() {
                let _ = s.thread.join();
            }
        }
        if slot.busy() {
            let what = match self.scanning.scan.lock().func {
                ScanFunc::Scrub => "already being scrubbed",
                ScanFunc::Resilver => "being resilvered, which comes first",
            };
            return Err(PoolError::Invalid(format!(
                "pool '{}' is {what} (stop it with --stop)",
                self.name
            )));
        }
        self.begin_scrub();
        slot.running = Some(self.spawn_scanner());
        Ok(())
    }

    /// Marks a scrub as running from the start, unless one is already under way (paused).
    fn begin_scrub(&self) {
        let mut st = self.scanning.scan.lock();
        if st.state != ScanPhase::Scanning {
            *st = ScanState {
                state: ScanPhase::Scanning,
                to_examine: self.space().alloc,
                start_secs: now_secs(),
                ..ScanState::default()
            };
        }
    }

    /// Runs one chunk of a scrub on the calling thread, beginning one if none is under way;
    /// returns whether the scrub is done. For tests and tools that need to stop a scrub at a
    /// known point; `start_scrub` is the normal way.
    pub fn scrub_chunk(self: &Arc<Self>) -> bool {
        self.begin_scrub();
        let stop = AtomicBool::new(false);
        // Done unless the chunk ended a resilver and a scrub it interrupted goes on.
        scan_chunk(self, &stop) && !finish(self)
    }

    /// Resumes a scrub the config says was running (at import).
    pub(super) fn resume_scrub(self: &Arc<Self>) {
        let mut slot = self.scanning.scanner.lock();
        if !slot.closed
            && !self.is_read_only()
            && self.scanning.scan.lock().state == ScanPhase::Scanning
        {
            slot.running = Some(self.spawn_scanner());
        }
    }

    fn spawn_scanner(self: &Arc<Self>) -> Scanner {
        let stop = Arc::new(AtomicBool::new(false));
        let (weak, flag) = (Arc::downgrade(self), stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("scrub-{}", self.name))
            .spawn(move || scan(weak, &flag))
            .expect("spawn scrub thread");
        Scanner { stop, thread }
    }

    /// Starts a resilver of every txg some present, online leaf missed (pausing a scrub),
    /// unless there is none or one already runs. Returns whether one runs now.
    pub fn start_resilver(self: &Arc<Self>) -> bool {
        let mut slot = self.scanning.scanner.lock();
        self.start_resilver_in(&mut slot)
    }

    /// After a txg every data leaf took whole, so that all are in service and taking writes
    /// again: a leaf that still owes txgs gets its resilver now, not at the next `pool
    /// clear` or import. That is a leaf that missed part of a txg while the pool waited for
    /// room (one child of a mirror found room, the other not), or whose write failed once
    /// without its being faulted. Called by the sync thread, so it never waits: it does
    /// nothing while a scan runs (a scrub is left to finish; the next txg after it starts
    /// the resilver), nor after the administrator stopped a resilver (`pool clear`, `pool
    /// online` or the next import start it again).
    pub(super) fn resilver_owed(self: &Arc<Self>) {
        let Some(mut slot) = self.scanning.scanner.try_lock() else {
            return;
        };
        if slot.busy() {
            // A scrub gives way to a resilver (it goes on after it, where it stopped): ask
            // it to stop without waiting; its thread ends between blocks, and a txg later
            // the resilver starts here.
            let scrubbing = self.scanning.scan.lock().func == ScanFunc::Scrub;
            if scrubbing && !self.owed().0.is_empty() {
                if let Some(s) = slot.running.as_ref() {
                    s.stop.store(true, Ordering::SeqCst);
                    slot.yielded = true;
                }
            }
            return;
        }
        let yielded = std::mem::take(&mut slot.yielded);
        {
            let st = self.scanning.scan.lock();
            let stopped = st.func == ScanFunc::Resilver && st.state == ScanPhase::Canceled;
            let resilvering = st.func == ScanFunc::Resilver && st.state == ScanPhase::Scanning;
            if stopped || resilvering || left_owing(&st, &self.owed().0) {
                return;
            }
        }
        if !self.start_resilver_in(&mut slot) && yielded && !slot.closed {
            // Nothing is owed after all: the scrub that stopped for it goes on.
            if self.scanning.scan.lock().state == ScanPhase::Scanning {
                slot.running = Some(self.spawn_scanner());
            }
        }
    }

    /// The committed txgs some present, online leaf missed, and those leaves' GUIDs (sorted).
    /// A leaf that missed a block written ahead into the open txg, or one of the txg being
    /// synced, owes that txg already (`Leaf::owes`), but no tree a scan could read holds its
    /// blocks yet: a resilver that took it would find nothing, and its end would clear the
    /// debt (`finish`) before the txg commits without the leaf's copy.
    fn owed(&self) -> (TxgRanges, Vec<u64>) {
        let committed = self.synced_txg();
        let mut owed = TxgRanges::default();
        let mut leaves = Vec::new();
        for leaf in self.leaves().filter(|l| !l.is_offline()) {
            let missed = leaf.missed.lock().up_to(committed);
            if !missed.is_empty() {
                leaves.push(leaf.guid());
            }
            for &r in &missed.0 {
                owed.add_range(r);
            }
        }
        leaves.sort_unstable();
        (owed, leaves)
    }

    /// Every leaf of every top-level vdev.
    fn leaves(&self) -> impl Iterator<Item = &Arc<Leaf>> {
        self.io.zio.tops.iter().flat_map(|t| &t.children)
    }

    /// Whether a leaf of `guids` (sorted) came to owe more, or came back into service,
    /// since the running resilver started (`Leaf::owes_since_scan`).
    fn owes_since_scan(&self, guids: &[u64]) -> bool {
        self.leaves()
            .any(|l| guids.binary_search(&l.guid()).is_ok() && l.owes_since_scan())
    }

    fn start_resilver_in(self: &Arc<Self>, slot: &mut ScanSlot) -> bool {
        if slot.closed || self.is_read_only() {
            return false;
        }
        let (owed, leaves) = self.owed();
        if owed.is_empty() {
            return false;
        }
        if let Some(s) = slot.running.take() {
            s.pause();
        }
        {
            let mut st = self.scanning.scan.lock();
            if st.state == ScanPhase::Scanning
                && st.func == ScanFunc::Resilver
                && st.txgs == owed.0
                && st.leaves == leaves
                && !self.owes_since_scan(&leaves)
            {
                // The same resilver, paused: go on with it. (Not if one of its leaves was
                // out of service meanwhile: the blocks the walk passed then were not
                // written to it.)
            } else {
                self.leaves().for_each(|l| l.scan_started());
                // A scrub under way (paused just now, or before) waits for the resilver;
                // a resilver replaced by a wider one hands on the scrub it was holding.
                let interrupted = match (st.state, st.func) {
                    (ScanPhase::Scanning, ScanFunc::Scrub) => Some(Box::new(st.clone())),
                    (ScanPhase::Scanning, ScanFunc::Resilver) => st.interrupted.take(),
                    _ => None,
                };
                *st = ScanState {
                    func: ScanFunc::Resilver,
                    txgs: owed.0,
                    leaves,
                    state: ScanPhase::Scanning,
                    to_examine: self.space().alloc,
                    start_secs: now_secs(),
                    interrupted,
                    ..ScanState::default()
                };
            }
        }
        slot.running = Some(self.spawn_scanner());
        true
    }

    /// Cancels a running scrub; its state becomes `canceled`.
    pub fn stop_scrub(&self) -> Result<(), PoolError> {
        let running = self
            .scanning
            .scanner
            .lock()
            .running
            .take()
            .filter(|s| !s.thread.is_finished());
        let Some(s) = running else {
            return Err(PoolError::Invalid(format!(
                "pool '{}' is not being scrubbed",
                self.name
            )));
        };
        s.pause();
        let mut st = self.scanning.scan.lock();
        if st.state == ScanPhase::Scanning {
            st.state = ScanPhase::Canceled;
            st.end_secs = now_secs();
            // Stopping a resilver stops the scrub waiting behind it too.
            st.interrupted = None;
        }
        Ok(())
    }

    pub fn scan_status(&self) -> ScanState {
        self.scanning.scan.lock().clone()
    }

    /// Waits until no scrub runs (finished, canceled, or the pool closing).
    pub fn wait_scrub(&self) {
        let running = self.scanning.scanner.lock().running.take();
        if let Some(s) = running {
            let _ = s.thread.join();
        }
    }
}

/// Whether everything owed now is what the last scan, a finished resilver, left owing
/// because it could not rebuild it (`ScanState::unrebuilt_txg`): another resilver would
/// only meet the same damage, so none starts by itself (after every txg, it would never
/// end); `pool clear`, `pool online` or an import start one. Anything owed since does.
fn left_owing(st: &ScanState, owed: &TxgRanges) -> bool {
    let mut beyond = owed.clone();
    beyond.remove(&TxgRanges(st.txgs.clone()).up_to(st.unrebuilt_txg));
    st.func == ScanFunc::Resilver
        && st.state == ScanPhase::Finished
        && st.unrebuilt_txg > 0
        && beyond.is_empty()
}

/// The scrub thread: holds the pool only while it works on a chunk, so a dropped pool is not
/// kept alive by it.
fn scan(pool: Weak<Pool>, stop: &AtomicBool) {
    let mut last_save = Instant::now();
    loop {
        let Some(pool) = pool.upgrade() else { return };
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let done = scan_chunk(&pool, stop);
        if stop.load(Ordering::SeqCst) {
            return;
        }
        if done && !finish(&pool) {
            return;
        }
        if last_save.elapsed() >= SAVE_EVERY {
            let _ = pool.save_config();
            last_save = Instant::now();
        }
    }
}

/// Ends the scan that just walked its last block; returns whether a scrub the resilver had
/// interrupted goes on from where it stopped (on the same thread).
fn finish(pool: &Pool) -> bool {
    let (resumed, resilvered) = {
        let mut st = pool.scanning.scan.lock();
        let resilvered = st.func == ScanFunc::Resilver;
        st.state = ScanPhase::Finished;
        st.end_secs = now_secs();
        st.bookmark = None;
        if st.func == ScanFunc::Resilver {
            // The leaves it rebuilt now hold the blocks of those txgs, if they stayed in
            // service. Not a leaf that came back while it ran: the walk passed blocks
            // before that (it owes them still, and the next txg starts its resilver). Nor
            // the txgs of blocks it could not rebuild (`unrebuilt_txg`): a block that no
            // copy supplied now may yet be read (a device back from a transient fault), and
            // its leaves must not be counted on for it.
            let mut done = TxgRanges(st.txgs.clone());
            if st.unrebuilt_txg > 0 {
                done.remove(&TxgRanges(vec![[1, st.unrebuilt_txg]]));
            }
            for leaf in pool.leaves() {
                if !leaf.is_offline() && st.leaves.binary_search(&leaf.guid()).is_ok() {
                    leaf.resilvered(&done);
                }
            }
        }
        let resumed = match st.interrupted.take() {
            Some(scrub) => {
                *st = *scrub;
                true
            }
            None => false,
        };
        (resumed, resilvered)
    };
    let _ = pool.save_config();
    if resilvered {
        // Not under the scan's lock: writing the labels takes the MOS lock, then the scan's.
        pool.commit_soon();
    }
    resumed
}

/// Holds the frees made after the last committed txg (`Allocator::hold_frees`), before a
/// chunk reads its tree: that tree is of that txg or a later one, so what was freed by then
/// it does not point at. Returns the txg, for `release_frees`.
fn hold_frees(pool: &Pool) -> u64 {
    let tree_txg = pool.synced_txg();
    pool.io.zio.alloc.lock().hold_frees(tree_txg);
    tree_txg
}

/// Scrubs up to `CHUNK_BLOCKS` blocks from the bookmark on; returns whether the walk is done.
fn scan_chunk(pool: &Arc<Pool>, stop: &AtomicBool) -> bool {
    let (bookmark, filter) = {
        let st = pool.scanning.scan.lock();
        let filter = (st.func == ScanFunc::Resilver).then(|| TxgRanges(st.txgs.clone()));
        (st.bookmark.clone(), filter)
    };
    let filter = filter.as_ref();
    let Some(bookmark) = bookmark else {
        // The MOS first: it is small, and each of its objects scrubbed whole in one go,
        // under a hold of its own read afresh. (One hold over the whole MOS, on slow devices
        // beside steady overwrites, kept every free of a dozen txgs, and the MOS blocks those
        // txgs rewrote found no room: the pool suspended.)
        let objects = pool.mos_dnodes().len();
        for i in 0..objects {
            let tree_txg = hold_frees(pool);
            let Some(dn) = pool.mos_dnodes().get(i).copied() else {
                pool.io.zio.alloc.lock().release_frees(tree_txg);
                break;
            };
            let t = TreeScan {
                pool,
                label: &pool.name,
                block_bytes: 0,
                filter,
                stop,
                // Scrubbed whole, never cut short, and without pausing for foreground I/O:
                // it is small, and every free waits while it is read. (Paused at each block
                // under steady writes, a resilver's pass over the MOS took seconds, and the
                // frees held meanwhile filled a 56 MiB pool.)
                chunk_of: None,
                born_after: 0,
            };
            scrub_tree(&t, &dn, 0, u64::MAX);
            pool.io.zio.alloc.lock().release_frees(tree_txg);
        }
        // The objset blocks, which no tree reaches. A volume's is written when the volume
        // changes, so an idle volume's may be older than anything else a resilver rebuilds:
        // left out, a replaced device lacked it, and the pool did not import from the new
        // device once the old one was gone. Each is read afresh under a hold of its own.
        let labels: Vec<String> = pool.objset_bps().into_iter().map(|(l, _)| l).collect();
        for label in labels {
            let tree_txg = hold_frees(pool);
            let bp = pool.objset_bp_of(&label);
            let Some(bp) = bp.filter(|bp| filter.is_none_or(|f| f.contains(bp.birth_txg.get())))
            else {
                pool.io.zio.alloc.lock().release_frees(tree_txg);
                continue;
            };
            let t = TreeScan {
                pool,
                label: &label,
                block_bytes: 0,
                filter,
                stop,
                chunk_of: None,
                born_after: 0,
            };
            check(&t, &bp, 0, 0);
            pool.io.zio.alloc.lock().release_frees(tree_txg);
        }
        if !stop.load(Ordering::SeqCst) {
            set_bookmark(pool, first_volume_after(pool, None), 0);
        }
        return false;
    };
    let Some(name) = bookmark.volume else {
        return true; // no volume left
    };
    let Ok(ds) = pool.dataset_or_snapshot(&name) else {
        // Destroyed meanwhile: go on with the next one.
        set_bookmark(pool, first_volume_after(pool, Some(&name)), 0);
        return false;
    };
    let tree_txg = hold_frees(pool);
    let dn = ds.object.dnode();
    let label = format!("{}/{}", pool.name, name);
    let bs = ds.volblocksize as u64;
    let t = TreeScan {
        pool,
        label: &label,
        block_bytes: bs,
        filter,
        stop,
        chunk_of: Some(tree_txg),
        born_after: ds.born_after(),
    };
    let next = scrub_tree(&t, &dn, bookmark.blkid, CHUNK_BLOCKS);
    pool.io.zio.alloc.lock().release_frees(tree_txg);
    if stop.load(Ordering::SeqCst) {
        return false;
    }
    match next {
        Some(blkid) => set_bookmark(pool, Some(name), blkid),
        None => set_bookmark(pool, first_volume_after(pool, Some(&name)), 0),
    }
    false
}

fn set_bookmark(pool: &Pool, volume: Option<String>, blkid: u64) {
    pool.scanning.scan.lock().bookmark = Some(Bookmark { volume, blkid });
}

/// The next tree to scan after `after`, in name order: a volume's head, then its snapshots
/// (`VOL@SNAP`), each pruned where the tree before it holds the same blocks.
fn first_volume_after(pool: &Pool, after: Option<&str>) -> Option<String> {
    let mut names: Vec<String> = (pool.datasets().iter())
        .chain(pool.snapshots().iter())
        .map(|d| d.name.clone())
        .collect();
    names.sort();
    names
        .into_iter()
        .find(|n| after.is_none_or(|a| n.as_str() > a))
}

/// One tree to scan: where its blocks belong, and what to scan.
struct TreeScan<'a> {
    pool: &'a Pool,
    /// `POOL/VOL`, or `POOL` for the MOS: how damage is reported.
    label: &'a str,
    /// The volume's block size (0 for the MOS), to turn block ids into byte ranges.
    block_bytes: u64,
    /// For a resilver, the txgs whose blocks it rewrites.
    filter: Option<&'a TxgRanges>,
    stop: &'a AtomicBool,
    /// A chunk of a volume: the last committed txg when its tree was read (`hold_frees`).
    /// Once a later one commits, the chunk ends soon after. `None` for the MOS, whose walk
    /// neither ends early nor pauses for foreground I/O.
    chunk_of: Option<u64>,
    /// Blocks born at or before this txg are an earlier tree's too (a snapshot's), scanned
    /// with it: the walk does not enter them (copy-on-write: nothing below is newer).
    born_after: u64,
}

impl TreeScan<'_> {
    /// Pauses while the pool serves I/O (`Pool::yield_to_foreground`), except in the MOS.
    fn yield_to_foreground(&self) {
        if self.chunk_of.is_some() {
            self.pool.yield_to_foreground(self.stop);
        }
    }

    /// Whether a txg has committed since this chunk's tree was read (never, for the MOS).
    fn tree_superseded(&self) -> bool {
        self.chunk_of
            .is_some_and(|tree_txg| self.pool.synced_txg() > tree_txg)
    }
}

/// Scrubs the tree of `dn` from block `from`, at most `limit` level-0 blocks; returns the
/// block id to resume at, or None when the tree is done (or the scrub was stopped).
fn scrub_tree(t: &TreeScan, dn: &DnodePhys, from: u64, limit: u64) -> Option<u64> {
    let TreeScan {
        pool, filter, stop, ..
    } = *t;
    let (mut scrubbed, mut visits) = (0u64, 0u64);
    let mut resume = None;
    // Data blocks are checked in parallel batches (their reads and checksums are independent);
    // an indirect block is checked before the walk reads its children.
    let mut batch: Vec<(BlkPtr, u64)> = Vec::with_capacity(BATCH);
    let visit = &mut |bp: &BlkPtr, level, first| {
        if resume.is_some() || stop.load(Ordering::SeqCst) {
            return Visit::Skip;
        }
        if level == 0 && scrubbed == limit {
            resume = Some(first);
            return Visit::Skip;
        }
        // A chunk also ends once a txg has committed since its tree was read (looked at every
        // few blocks, once past where it began): the next reads the tree anew, and the frees
        // it held come back (`hold_frees`). Under steady overwrites, a chunk held through a
        // slow walk (a resilver passing over most blocks, pausing for foreground I/O) kept
        // all they freed meanwhile, and filled the pool.
        visits += 1;
        if first > from && visits.is_multiple_of(16) && t.tree_superseded() {
            resume = Some(first);
            return Visit::Skip;
        }
        if bp.birth_txg.get() <= t.born_after {
            return Visit::Skip;
        }
        if let Some(f) = filter {
            let birth = bp.birth_txg.get();
            if f.min().is_none_or(|m| birth < m) {
                // Copy-on-write: nothing below was born later than this block.
                return Visit::Skip;
            }
            if !f.contains(birth) {
                return Visit::Descend; // only its descendants may be owed
            }
        }
        if level > 0 {
            t.yield_to_foreground();
            return if check(t, bp, level, first) {
                Visit::Descend
            } else {
                Visit::Skip
            };
        }
        scrubbed += 1;
        batch.push((*bp, first));
        if batch.len() == BATCH {
            check_batch(t, &mut batch);
        }
        Visit::Skip
    };
    // A subtree the walk could not enter (its indirect block does not read, or its pointer
    // is impossible) is damage like a block that does not read: a resilver has rebuilt
    // nothing below it.
    walk_from(&pool.io, dn, from, visit, &mut |bp, level, first, e| {
        not_rebuilt(t, bp, level, first, &e)
    });
    check_batch(t, &mut batch);
    if stop.load(Ordering::SeqCst) {
        return None;
    }
    resume
}

/// Blocks checked in parallel at a time.
const BATCH: usize = 32;

fn check_batch(t: &TreeScan, batch: &mut Vec<(BlkPtr, u64)>) {
    use rayon::prelude::*;
    t.yield_to_foreground();
    // The scanner is a plain thread, so rayon runs these on its pool and blocks here: the
    // jobs only read, verify and rewrite blocks, and take no lock that waits.
    batch.par_iter().for_each(|(bp, first)| {
        check(t, bp, 0, *first);
    });
    batch.clear();
}

/// Scrubs one block and records what it found; returns whether the block is good.
fn check(t: &TreeScan, bp: &BlkPtr, level: u8, first: u64) -> bool {
    match t.pool.io.zio.scrub(bp) {
        Ok(r) => {
            let mut st = t.pool.scanning.scan.lock();
            st.examined_bytes += bp.asize_total();
            st.repaired_bytes += r.repaired_bytes;
            true
        }
        Err(e) => {
            t.pool.scanning.scan.lock().examined_bytes += bp.asize_total();
            not_rebuilt(t, bp, level, first, &e);
            false
        }
    }
}

/// Records the block `bp` (of `level`, covering block ids from `first`) and everything
/// below it as damage: no copy of it could be had. A resilver has not rebuilt them either:
/// its leaves go on owing the txgs up to the block's birth (`ScanState::unrebuilt_txg`).
fn not_rebuilt(t: &TreeScan, bp: &BlkPtr, level: u8, first: u64, e: &crate::zio::ZioError) {
    let span = (1u64 << crate::dmu::IND_SHIFT).saturating_pow(level as u32);
    let mut st = t.pool.scanning.scan.lock();
    st.errors += 1;
    if t.filter.is_some() {
        st.unrebuilt_txg = st.unrebuilt_txg.max(bp.birth_txg.get());
    }
    if st.damaged.len() < MAX_DAMAGED {
        st.damaged.push(Damage {
            object: t.label.to_string(),
            start: first.saturating_mul(t.block_bytes),
            end: first.saturating_add(span).saturating_mul(t.block_bytes),
            error: e.to_string(),
        });
    }
}

/// A pool's scrub and resilver: the state saved in the config, the thread walking, and when
/// volumes last did I/O (a scan yields to them).
pub(super) struct Scanning {
    /// The last scrub's state (saved in the config) and the thread running one.
    pub(super) scan: parking_lot::Mutex<ScanState>,
    pub(super) scanner: parking_lot::Mutex<ScanSlot>,
    /// When a volume last read or wrote (nanoseconds since `born`): a scrub yields to it.
    pub(super) last_io_nanos: std::sync::atomic::AtomicU64,
    pub(super) born: std::time::Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resilver_that_left_blocks_unrebuilt_starts_again_only_for_new_debt() {
        let st = ScanState {
            func: ScanFunc::Resilver,
            state: ScanPhase::Finished,
            txgs: vec![[5, 9], [12, 12]],
            unrebuilt_txg: 10,
            ..ScanState::default()
        };
        let owed = |r: &[[u64; 2]]| TxgRanges(r.to_vec());
        // What it left owed, or part of it: nothing another resilver would do better.
        assert!(left_owing(&st, &owed(&[[5, 9]])));
        assert!(left_owing(&st, &owed(&[[7, 8]])));
        // A txg it rebuilt, one it never had, or one owed since: a resilver is due.
        assert!(!left_owing(&st, &owed(&[[5, 9], [12, 12]])));
        assert!(!left_owing(&st, &owed(&[[3, 3]])));
        assert!(!left_owing(&st, &owed(&[[5, 9], [20, 20]])));
        // One that rebuilt everything, or a scrub, leaves nothing owed of its own.
        let whole = ScanState {
            unrebuilt_txg: 0,
            ..st.clone()
        };
        assert!(!left_owing(&whole, &owed(&[[5, 9]])));
        let scrub = ScanState {
            func: ScanFunc::Scrub,
            ..st
        };
        assert!(!left_owing(&scrub, &owed(&[[5, 9]])));
    }
}
