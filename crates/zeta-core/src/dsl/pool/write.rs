//! Writes in open context: a volume's block changes entering the open txg, their admission
//! against the pool's free space and dirty limit, the throttle that holds writers back
//! while a sync catches up, the memory limits it works to (dirty data and the block cache),
//! and blocks placed and written ahead of their txg.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLockReadGuard;

use crate::dmu::object::Delta;
use crate::dmu::write::{self, Placed, Writer};
use crate::dmu::{dnode, Dirty, RangeLocks};
use crate::spa::{AllocClass, AllocError, BlkPtr, Space};
use crate::zio::{WriteProps, ZioError};

use super::growth::Point;
use super::{Dataset, Pool, PoolError};

/// How many txg commits a write short of space waits for, one at a time (deferred frees come
/// back two txgs after the one that freed them), before it is refused with ENOSPC: in
/// admission (`reserve_space`) and when the allocator finds no segment (`place_blocks`).
const RESERVE_WAITS: usize = 6;

/// The most commits an admission waits for while frees are still coming back (each is a
/// short txg when the pool is this short of room).
const RESERVE_WAITS_MAX: usize = 64;

/// How long admission trusts a count of the free space in slivers (`Pool::fits`).
const SLIVERS_FOR: Duration = Duration::from_secs(1);

/// The last count of room for indirect blocks (`Pool::fits_meta`).
#[derive(Default)]
pub(super) struct MetaRoom {
    /// When it was counted (never, at first).
    at: Option<std::time::Instant>,
    /// The bytes allocated until then (`SpaceGauge::taken_total`).
    taken: u64,
    /// The free space then in segments an indirect block fits.
    room: u64,
    /// The part of it each metaslab's space map may take in a txg.
    mos: u64,
    /// Room for blocks of `block` bytes in holes too small for an indirect block
    /// (`Allocator::snug_room`).
    snug: u64,
    block: u64,
}

/// A dataset's open txg, as `dmu::write` meets it: the pool admits each change (memory,
/// space, the sync closing the txg) and says which txg it joined.
#[derive(Clone, Copy)]
pub struct OpenTxg<'a> {
    pool: &'a Pool,
    ds: &'a Dataset,
}

impl write::Txg for OpenTxg<'_> {
    type Error = PoolError;

    fn dirty(&self, blkid: u64, change: Dirty, wait: bool) -> Result<Option<u64>, PoolError> {
        self.pool.dirty_block(self.ds, blkid, change, wait)
    }

    fn patch(
        &self,
        blkid: u64,
        at: usize,
        piece: Arc<Vec<u8>>,
        wait: bool,
    ) -> Result<Option<u64>, PoolError> {
        self.pool.patch_block(self.ds, blkid, at, piece, wait)
    }

    fn place(&self, blocks: &[(u64, &[u8])]) -> Result<Option<Placed>, PoolError> {
        match self.pool.place_blocks(self.ds, blocks) {
            Ok(placed) => Ok(Some(placed)),
            Err(PoolError::Zio(ZioError::Write(_))) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn open_txg(&self) -> u64 {
        self.pool.open_txg()
    }
}

impl Pool {
    /// The writer of a dataset's object: byte ranges into its blocks, in this pool's open
    /// txg, under `locks` (its user's range locks over the object's bytes).
    pub fn writer<'a>(&'a self, ds: &'a Dataset, locks: &'a RangeLocks) -> Writer<'a, OpenTxg<'a>> {
        Writer {
            object: &ds.object,
            io: &self.io,
            locks,
            txg: OpenTxg { pool: self, ds },
        }
    }

    /// Replaces block `blkid` of a volume in the open txg, waiting first if too much data is
    /// dirty, and refusing with `NoSpace` if the pool could not hold it. Returns the txg the
    /// change went into. Without `wait`, `None`, with nothing done, where new contents
    /// (`Dirty::Data`) would wait (for memory, space, or the sync closing the txg).
    fn dirty_block(
        &self,
        ds: &Dataset,
        blkid: u64,
        change: Dirty,
        wait: bool,
    ) -> Result<Option<u64>, PoolError> {
        self.check_writable()?;
        let hold = if matches!(change, Dirty::Data(_)) {
            match self.admit_block(ds, blkid, wait)? {
                Some(hold) => hold,
                None => return Ok(None),
            }
        } else {
            self.hold_open_txg(ds)?
        };
        let txg = *hold;
        self.record_change(ds, txg, blkid, change);
        drop(hold);
        self.sync_if_much_held(txg);
        Ok(Some(txg))
    }

    /// Admits one more block of the volume into the open txg and holds the txg: waits first
    /// if too much is dirty, and refuses with `NoSpace` if the pool could not hold the block.
    /// Without `wait`, `None` where it would wait.
    fn admit_block(
        &self,
        ds: &Dataset,
        blkid: u64,
        wait: bool,
    ) -> Result<Option<RwLockReadGuard<'_, u64>>, PoolError> {
        self.check_not_snapshot(ds)?;
        let len = ds.volblocksize as u64;
        if wait {
            self.throttle()?;
            self.reserve_space(ds, len, len, || self.overwrites(ds, &[blkid]))?;
            return self.hold_open_txg(ds).map(Some);
        }
        let reserved = self.reservations_for(ds);
        if self.memory_held() >= self.dirty_max()
            || !self.has_room(len, len, reserved, false, false)
        {
            return Ok(None);
        }
        let Some(hold) = self.txgs.open_txg.try_read() else {
            return Ok(None);
        };
        if ds.destroyed.load(Ordering::Acquire) {
            return Ok(None);
        }
        Ok(Some(hold))
    }

    /// A snapshot's tree is never written: every path that would dirty it asks this first.
    fn check_not_snapshot(&self, ds: &Dataset) -> Result<(), PoolError> {
        if ds.snapshot {
            return Err(PoolError::ReadOnlySnapshot(format!(
                "{}/{}",
                self.name, ds.name
            )));
        }
        Ok(())
    }

    /// The open txg, held (a sync cannot close it meanwhile), if the volume still exists.
    fn hold_open_txg(&self, ds: &Dataset) -> Result<RwLockReadGuard<'_, u64>, PoolError> {
        self.check_not_snapshot(ds)?;
        let hold = self.txgs.open_txg.read();
        if ds.destroyed.load(Ordering::Acquire) {
            return Err(PoolError::NoSuchVolume(format!(
                "{}/{} (destroyed while open)",
                self.name, ds.name
            )));
        }
        Ok(hold)
    }

    /// Makes `change` block `blkid`'s change in open txg `txg` (held by the caller), counts
    /// its dirty bytes and frees the placed copy it supersedes, if any.
    pub(super) fn record_change(&self, ds: &Dataset, txg: u64, blkid: u64, change: Dirty) {
        if let Some(bp) = self.record_change_keeping(ds, blkid, change) {
            self.io.zio.free(&bp, txg, AllocClass::Mos);
        }
    }

    /// `record_change`, but the copy written ahead that the change supersedes, if any, is
    /// returned for the caller to free (with its neighbours: `Zio::free_all`).
    fn record_change_keeping(&self, ds: &Dataset, blkid: u64, change: Dirty) -> Option<BlkPtr> {
        let mut placed = match &change {
            Dirty::Placed(bp) => bp.lsize.get() as i64,
            _ => 0,
        };
        let (delta, superseded) = ds.object.dirty(blkid, change);
        if let Some(bp) = &superseded {
            placed -= bp.lsize.get() as i64;
        }
        self.count_dirty(delta);
        self.admission
            .placed_bytes
            .fetch_add(placed, Ordering::AcqRel);
        superseded
    }

    fn count_dirty(&self, delta: Delta) {
        self.admission
            .dirty_bytes
            .fetch_add(delta.bytes, Ordering::AcqRel);
        self.admission
            .held_bytes
            .fetch_add(delta.held, Ordering::AcqRel);
        if delta.meta != 0 {
            self.admission
                .meta_bytes
                .fetch_add(delta.meta, Ordering::AcqRel);
        }
    }

    /// The indirect blocks the unsynced txgs will write (`meta_bytes`).
    fn meta_bytes(&self) -> u64 {
        self.admission.meta_bytes.load(Ordering::Acquire).max(0) as u64
    }

    /// Lays `data` over bytes `at..` of block `blkid` of a volume in the open txg, without
    /// reading the block (`Object::patch`), waiting first if too much is dirty and refusing
    /// with `NoSpace` if the pool could not hold the block. Returns the txg, or `None` if
    /// the block's change in the open txg is not one a patch can extend: the caller writes
    /// the whole block instead. The caller holds the range lock of the bytes.
    ///
    /// Without `wait`, `None` also when the write would wait (for memory, space, or the
    /// sync closing the txg): the caller hands it to a thread that may.
    fn patch_block(
        &self,
        ds: &Dataset,
        blkid: u64,
        at: usize,
        data: Arc<Vec<u8>>,
        wait: bool,
    ) -> Result<Option<u64>, PoolError> {
        self.check_writable()?;
        let Some(hold) = self.admit_block(ds, blkid, wait)? else {
            return Ok(None);
        };
        let txg = *hold;
        let Some(delta) = ds.object.patch(blkid, at, data) else {
            return Ok(None);
        };
        self.count_dirty(delta);
        drop(hold);
        self.sync_if_much_held(txg);
        Ok(Some(txg))
    }

    /// Asks for a sync once a quarter of the dirty limit is held in memory, or once blocks
    /// written ahead of their txg hold a quarter of the free space (they hold no memory, but
    /// they, and the copies they replace, are freed only as txgs commit), or once the dirty
    /// blocks still to place would take a quarter of it: past that, every write's admission
    /// (`reserve_space`) counts usable segments under the allocator's lock, and then forces
    /// syncs itself, and a large dirty limit slowed random writes on a small pool (figures:
    /// docs/perf/allocator.md, "Why a txg syncs before its blocks would take a quarter of the
    /// free space").
    ///
    /// While the open txg's latest writes add less than half a byte to its sync's work per
    /// byte they hold (short writes into blocks it has dirtied already: `Growth`), the txg
    /// grows to half the dirty limit of its own instead: its sync writes those blocks whole
    /// either way, so a later sync rewrites them half as often (figures:
    /// docs/perf/intent-log.md, "A txg that grows to half the dirty limit").
    /// `txg` is the txg just written.
    fn sync_if_much_held(&self, txg: u64) {
        let max = self.dirty_max();
        let now = Point {
            held: self.held_bytes(),
            cost: self.unplaced_bytes(),
        };
        let epoch = (txg, self.txgs.syncing_txg.load(Ordering::Acquire));
        let cheap = (self.txgs.growth.note(epoch, now, max / 16))
            .is_some_and(|(held, cost)| cost.saturating_mul(2) < held);
        // As `memory_held` counts, but of the open txg alone when it may grow to half.
        let (held, share) = if cheap {
            let syncing = self.txgs.syncing_held.load(Ordering::Acquire);
            (now.held.saturating_sub(syncing), 2)
        } else {
            (now.held, 4)
        };
        if held.max(self.zil.pinned_bytes()) > max / share
            || self.admission.ahead_bytes.load(Ordering::Relaxed)
                > self.admission.ahead_limit.load(Ordering::Relaxed)
            || now.cost * self.io.zio.max_inflation() > self.space().free / 4
        {
            self.request_sync();
        }
    }

    pub(super) fn held_bytes(&self) -> u64 {
        self.admission.held_bytes.load(Ordering::Acquire).max(0) as u64
    }

    pub(super) fn placed_bytes(&self) -> u64 {
        self.admission.placed_bytes.load(Ordering::Acquire).max(0) as u64
    }

    /// The dirty bytes whose space is still to be allocated (all but the placed ones).
    fn unplaced_bytes(&self) -> u64 {
        self.dirty_bytes().saturating_sub(self.placed_bytes())
    }

    /// Writes the blocks that are not all zeros to new space outside the space map (the
    /// txg's tree adopts them later) in txg `txg`; returns where each went, `None` for an
    /// all-zero block, which is not written (the sync makes it a hole).
    fn write_nonzero(
        &self,
        ds: &Dataset,
        txg: u64,
        blocks: &[&[u8]],
        durable: bool,
    ) -> Result<Vec<Option<BlkPtr>>, PoolError> {
        let write = |bufs: &[&[u8]], props: WriteProps| {
            if durable {
                self.io.zio.write_batch_durable(bufs, props, txg)
            } else {
                self.io.zio.write_batch(bufs, props, txg)
            }
        };
        let is_data = |b: &&[u8]| b.iter().any(|&x| x != 0);
        let props = WriteProps {
            class: AllocClass::Mos,
            ..ds.object.data_props()
        };
        // Mostly every block holds data: then the batch is the caller's slice as it is.
        let (bps, data) = if blocks.iter().all(is_data) {
            (write(blocks, props)?, None)
        } else {
            let data: Vec<bool> = blocks.iter().map(is_data).collect();
            let bufs: Vec<&[u8]> = (blocks.iter().zip(&data))
                .filter(|(_, &d)| d)
                .map(|(b, _)| *b)
                .collect();
            let bps = if bufs.is_empty() {
                Vec::new()
            } else {
                write(&bufs, props)?
            };
            (bps, Some(data))
        };
        let bytes: u64 = bps.iter().map(|bp| bp.psize.get() as u64).sum();
        if bytes > 0 {
            *self.admission.ahead.lock().entry(txg).or_default() += bytes;
            self.admission
                .ahead_bytes
                .fetch_add(bytes, Ordering::AcqRel);
        }
        let mut bps = bps.into_iter();
        Ok(match data {
            None => bps.map(Some).collect(),
            Some(data) => data
                .into_iter()
                .map(|d| d.then(|| bps.next().expect("a pointer per written block")))
                .collect(),
        })
    }

    /// Writes whole blocks of a volume to their place now, straight from the caller's
    /// buffers, and makes them the blocks' changes in the open txg (`Dirty::Placed`): the
    /// txg's sync adopts them and holds no copy in memory meanwhile. All-zero blocks are not
    /// written; they become holes (`Dirty::Free`, `None` in their place). Returns the txg
    /// and where each block went.
    ///
    /// The open txg is held across the device write, so each copy is born in the txg that
    /// adopts it (a resilver finds a block by its birth txg); a sync that begins meanwhile
    /// waits for the write, as OpenZFS's txg holds do for a copy into the DMU. This is the
    /// path of streaming writes: no copy into a block buffer, and the checksum and the
    /// device write done by the writer's thread while the data is in its cache.
    fn place_blocks(
        &self,
        ds: &Dataset,
        blocks: &[(u64, &[u8])],
    ) -> Result<(u64, Vec<Option<BlkPtr>>), PoolError> {
        self.check_writable()?;
        let bs = ds.volblocksize as u64;
        assert!(blocks.iter().all(|(_, b)| b.len() as u64 == bs));
        let bufs: Vec<&[u8]> = blocks.iter().map(|(_, b)| *b).collect();
        for attempt in 0.. {
            self.throttle()?;
            let ids: Vec<u64> = blocks.iter().map(|b| b.0).collect();
            let len = bs * blocks.len() as u64;
            self.reserve_space(ds, len, bs, || self.overwrites(ds, &ids))?;
            let hold = self.hold_open_txg(ds)?;
            let txg = *hold;
            let bps = match self.write_nonzero(ds, txg, &bufs, false) {
                Ok(bps) => bps,
                // Admission passed, yet the allocator found no segment for a block (the
                // free space moved into deferred frees meanwhile, say): the frees come back
                // a txg or two later. A block left unplaced here would fail the sync
                // instead, which suspends the pool; refuse the write cleanly rather.
                Err(PoolError::Zio(ZioError::Alloc(AllocError::NoSpace(_)))) => {
                    drop(hold);
                    if attempt == RESERVE_WAITS || self.space().freeing == 0 {
                        return Err(PoolError::NoSpace(self.name.clone()));
                    }
                    self.next_commit_releasing_frees()?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let superseded: Vec<BlkPtr> = (blocks.iter().zip(&bps))
                .filter_map(|(&(blkid, _), bp)| {
                    self.record_change_keeping(
                        ds,
                        blkid,
                        bp.map_or(Dirty::Free, |bp| Dirty::Placed(Box::new(bp))),
                    )
                })
                .collect();
            self.io.zio.free_all(&superseded, txg, AllocClass::Mos);
            drop(hold);
            self.sync_if_much_held(txg);
            return Ok((txg, bps));
        }
        unreachable!("the loop returns")
    }

    /// The txg that writes go into now.
    pub fn open_txg(&self) -> u64 {
        *self.txgs.open_txg.read()
    }

    /// What writes hold in memory until a txg syncs, as the throttle counts it: the dirty
    /// blocks' buffers and patches' pieces (`Dirty::held`), or the buffers queued log
    /// records keep alive if those are more (a block rewritten again and again dirties one
    /// block but pins every version of it). Placed blocks are on their devices already: a
    /// txg of them costs its sync only their pointers, and syncing after every 32 MiB of
    /// them rewrote the volume's indirect blocks for every few hundred writes. A patch
    /// counts its pieces, not its block, so a txg of short writes into large blocks takes
    /// in as many writes as the memory allows; what bounds the work its sync then does is
    /// the free-space share in `sync_if_much_held`, which counts whole blocks.
    pub fn memory_held(&self) -> u64 {
        self.held_bytes().max(self.zil.pinned_bytes())
    }

    /// What writes may hold in memory before they wait for a sync.
    pub fn dirty_max(&self) -> u64 {
        self.admission.dirty_max.load(Ordering::Relaxed)
    }

    /// The block cache's configured size.
    pub fn cache_capacity(&self) -> u64 {
        self.io.cache.capacity()
    }

    /// What the block cache holds now.
    pub fn cache_bytes(&self) -> u64 {
        self.io.cache.bytes()
    }

    /// The block cache's counters and lists (`zeta pool arcstat`).
    pub fn cache_stats(&self) -> crate::dmu::CacheStats {
        self.io.cache.stats()
    }

    /// Lets the block cache hold only `bytes` (at most its configured size) for now: a
    /// process short of memory lowers it, and raises it again as memory comes back.
    pub fn set_cache_limit(&self, bytes: u64) {
        self.io.cache.set_limit(bytes);
    }

    /// Sets the block cache's size and the dirty limit for as long as the pool stays open
    /// (they are settings of the process that holds it, not of the pool on disk).
    pub fn set_memory_limits(&self, cache_bytes: u64, dirty_max_bytes: u64) {
        self.io.cache.set_capacity(cache_bytes);
        self.admission
            .dirty_max
            .store(dirty_max_bytes, Ordering::Relaxed);
        // Writers waiting under a lower limit may go on.
        self.txgs.sync_cv.notify_all();
    }

    fn throttle(&self) -> Result<(), PoolError> {
        if self.memory_held() < self.dirty_max() {
            return Ok(());
        }
        let mut st = self.txgs.sync.lock();
        while self.memory_held() >= self.dirty_max() {
            // Waiting for room too: the dirty data will not shrink before room is made.
            if let Some(s) = st.suspension() {
                return Err(s.error(&self.name));
            }
            // Ask for a sync only if none is pending: every waiter shares the condvar, and
            // waking them all to ask again turned each txg into a storm of futex wakeups.
            if st.completed_seq >= st.request_seq {
                st.request_seq += 1;
                self.txgs.sync_cv.notify_all();
            }
            self.txgs
                .sync_cv
                .wait_for(&mut st, Duration::from_millis(100));
        }
        Ok(())
    }

    /// Admission control: a write is accepted only if the pool can still hold every dirty
    /// block plus its metadata and a reserve, so a txg sync never runs out of space.
    ///
    /// Blocks written ahead of their txg hold their space already, but as much room is kept
    /// free again for them (`ahead_bytes`, superseded copies included): after a crash the
    /// intent log points at them, import holds them until the replay commits, and the replay
    /// copies them (one copy per block at most) into that room. Without it, a stream of
    /// writes could leave a log that no replay has room for, and the volume could not be
    /// opened.
    ///
    /// `block` is the size of the blocks being written. Near full, the free space is counted
    /// only in segments such blocks can take (`Zio::usable_space`): a pool of slivers
    /// between blocks has free bytes but no room for one more block, and a txg sync that
    /// cannot place a block suspends the pool.
    ///
    /// A write that only overwrites blocks that hold data grows nothing: it may use three
    /// quarters of the slop that new data must leave (`overwrites`, asked only once the
    /// write does not fit without it), so a nearly full pool keeps taking overwrites.
    fn reserve_space(
        &self,
        ds: &Dataset,
        len: u64,
        block: u64,
        overwrites: impl FnOnce() -> bool,
    ) -> Result<(), PoolError> {
        let mut overwrites = Some(overwrites);
        let mut overwrite = false;
        for attempt in 0..=RESERVE_WAITS_MAX {
            let reserved = self.reservations_for(ds);
            if self.has_room(len, block, reserved, true, overwrite) {
                return Ok(());
            }
            if let Some(ask) = overwrites.take() {
                overwrite = ask();
                if overwrite && self.has_room(len, block, reserved, true, true) {
                    return Ok(());
                }
            }
            // Past `RESERVE_WAITS` commits, only while frees are still to come back: an
            // overwrite near full waits for the room its txgs free, new data is refused.
            let space = self.space();
            let waiting_for_frees = space.freeing > 0 && attempt < RESERVE_WAITS_MAX;
            if attempt >= RESERVE_WAITS && !waiting_for_frees
                || space.freeing == 0 && self.dirty_bytes() == 0
            {
                break;
            }
            // Deferred frees return as txgs commit: wait for the next commit and try again.
            self.next_commit_releasing_frees()?;
        }
        Err(PoolError::NoSpace(self.name.clone()))
    }

    /// Whether every one of `blkids` holds data now: writing them only replaces what is
    /// there. (Read from the block tree, whose indirect blocks a recent write has cached.)
    fn overwrites(&self, ds: &Dataset, blkids: &[u64]) -> bool {
        let (Some(&lo), Some(&hi)) = (blkids.iter().min(), blkids.iter().max()) else {
            return false;
        };
        match ds.object.allocated_blocks(&self.io, lo, hi + 1) {
            Ok(present) => blkids.iter().all(|b| present.binary_search(b).is_ok()),
            Err(_) => false,
        }
    }

    /// `reserve_space`'s test, once: whether the pool has room now for `len` more dirty
    /// bytes in blocks of `block` bytes. Without `count`, a pool with less than twice the
    /// room needed is taken as full rather than counted (`fits` takes the allocator's lock).
    ///
    /// `reserved` is (what other volumes' reservations keep, what is left of the written
    /// volume's own): the first is not this write's to take; the second already holds room
    /// for the volume's own margins (the eighth past its dirty bytes, a replay's copies of
    /// its blocks written ahead), and a write it covers may use most of the slop, so a
    /// reserved volume can be written whole.
    fn has_room(
        &self,
        len: u64,
        block: u64,
        reserved: (u64, u64),
        count: bool,
        overwrite: bool,
    ) -> bool {
        let (others, own) = reserved;
        let mut space = self.space();
        space.free = space.free.saturating_sub(others);
        // Placed blocks already hold their space: only the rest is still to allocate.
        let inflation = self.io.zio.max_inflation();
        // A write the volume's own reservation covers was promised its room, as an overwrite
        // was: it may use three quarters of the slop too. Its blocks are of one known size,
        // so they count as what they take (`raw_bytes`, as the reservation counted them);
        // what else is unplaced counts at the worst inflation of any block.
        let raw = self.raw_bytes(len, block);
        let promised = overwrite || own >= raw;
        let slop = (space.size / 32).max(4 << 20) / if promised { 4 } else { 1 };
        let dirty = self.unplaced_bytes() * inflation + raw;
        let ahead = self.admission.ahead_bytes.load(Ordering::Acquire);
        // The indirect blocks of the txgs not yet synced, and one more for this write.
        let meta = (self.meta_bytes() + 2 * dnode::IND_BLOCK_BYTES as u64) * inflation;
        let margins = dirty / 8 + ahead * inflation;
        let need = dirty + meta + slop + margins - own.min(margins);
        let room =
            space.free >= 2 * need || count && space.free >= need && self.fits(&space, block, need);
        // The indirect blocks need segments of their own size, which the txg's data cuts up
        // where no smaller hole takes it: a block of `block` bytes can spoil a segment of
        // an indirect block's size each.
        let ind = dnode::IND_BLOCK_BYTES as u64;
        let (meta_need, spoilers) = if block >= ind {
            (need, (0, block))
        } else {
            (meta + slop / 4, (self.unplaced_bytes() * inflation, block))
        };
        room && self.fits_meta(&space, meta_need, spoilers, count)
    }

    /// Whether the segments an indirect block fits in hold `need` bytes. Counted under the
    /// allocator's lock at most once a second while the count stays well above the need:
    /// between counts, the room is taken as the last count less what every byte allocated
    /// since could have cut from it (an allocation of one sector can spoil a whole segment
    /// of an indirect block's size), frees returning meanwhile counted as no room (they come
    /// back as holes of the blocks freed). Without `count`, a doubtful answer is no.
    ///
    /// `spoilers` is (bytes, block size) of data still to place in blocks smaller than an
    /// indirect block: each such block may spoil a segment of an indirect block's size, but
    /// not those that go in the snug holes the allocator fills first near full
    /// (`Allocator::snug_room`). Counting every one as a spoiler made txgs near full so
    /// small that each rewrote most of the volume's indirect blocks, and those, not the
    /// data, filled the device (`docs/perf/frag.md`).
    fn fits_meta(&self, space: &Space, need: u64, spoilers: (u64, u64), count: bool) -> bool {
        let (unplaced, block) = spoilers;
        let ind = dnode::IND_BLOCK_BYTES as u64;
        let spoiled = |snug: u64| unplaced.saturating_sub(snug) * ind.div_ceil(block);
        // A third free and twice the need: large segments are not yet scarce (the allocator
        // keeps to them until then, `Allocator::near_full`), and nothing is counted.
        if space.free >= space.size / 3 && space.free / 2 >= need + spoiled(0) {
            return true;
        }
        let piece = dnode::IND_BLOCK_BYTES as u64 * self.io.zio.max_inflation();
        let spoil = piece / crate::vdev::layout::SECTOR;
        let total = self.io.zio.gauge.taken_total();
        let mut last = self.admission.meta_room.lock();
        let taken = total.saturating_sub(last.taken);
        let lower = last.room.saturating_sub(taken.saturating_mul(spoil));
        let snug_lower = last.snug.saturating_sub(taken);
        if last.at.is_some_and(|at| at.elapsed() < SLIVERS_FOR)
            && last.block == block
            && lower >= need + spoiled(snug_lower) + last.mos
        {
            return true;
        }
        if !count {
            return false;
        }
        let (room, metaslabs, snug) = {
            let room = self.io.zio.usable_space(ind);
            let alloc = self.io.zio.alloc.lock();
            let snug = alloc.snug_room(block, ind * self.io.zio.max_inflation());
            (room, alloc.metaslab_count() as u64, snug)
        };
        // Each metaslab's space map may be appended to in a txg: two copies of its last
        // block (or of the indirect block above it), each spoiling such a segment.
        let mos = metaslabs * 2 * piece;
        *last = MetaRoom {
            at: Some(std::time::Instant::now()),
            taken: total,
            room,
            mos,
            snug,
            block,
        };
        room >= need + spoiled(snug) + mos
    }

    /// Whether blocks of `block` bytes still find `need` bytes of room among the free
    /// segments. Counting walks every free segment under the allocator's lock (a pool
    /// fragmented by small random writes has hundreds of thousands), so the slivers found
    /// are taken as still there for `SLIVERS_FOR`; a doubtful answer is counted afresh.
    pub(super) fn fits(&self, space: &Space, block: u64, need: u64) -> bool {
        let mut cached = self.admission.slivers.lock();
        let (at, size, slivers) = *cached;
        if size == block && at.elapsed() < SLIVERS_FOR && space.free.saturating_sub(slivers) >= need
        {
            return true;
        }
        let usable = self.io.zio.usable_space(block);
        *cached = (
            std::time::Instant::now(),
            block,
            space.free.saturating_sub(usable),
        );
        usable >= need
    }

    /// Writes blocks of the volume, dirty in txg `txg`, to their place now rather than at
    /// the txg's sync, and tells the object so (`set_override`): the sync adopts each copy
    /// whose buffer is still the block's change, and writes nothing more for it. Returns
    /// where each went, or `None` (nothing written) if `txg` is no longer open. A copy that
    /// is not adopted (the block was overwritten meanwhile) is freed, but only as frees are:
    /// a txg later than any log record pointing at it can still need it.
    ///
    /// The txg is held open through the write, as `place_blocks` holds it: a batch's durable
    /// write takes milliseconds, and a txg that began to sync meanwhile adopted none of it,
    /// so every block was written twice (a test's 6 MiB of 16K blocks, under a parallel test
    /// run, one time in six: its copies ahead lay dead at the front of the devices).
    ///
    /// All-zero blocks are not written (`None` in their place): the sync makes them holes.
    ///
    /// Used for the whole blocks a sync request needs (`InPlace`), so each copy is durable
    /// when this returns (`Zio::write_batch_durable`). Streaming writes place their blocks
    /// without a buffer at all (`place_blocks`).
    pub fn write_ahead(
        &self,
        ds: &Dataset,
        txg: u64,
        blocks: &[(u64, &Arc<Vec<u8>>)],
    ) -> Result<Option<Vec<Option<BlkPtr>>>, PoolError> {
        let hold = self.hold_open_txg(ds)?;
        if *hold != txg {
            return Ok(None);
        }
        let bufs: Vec<&[u8]> = blocks.iter().map(|(_, b)| b.as_slice()).collect();
        let bps = self.write_nonzero(ds, txg, &bufs, true)?;
        for (&(blkid, buf), bp) in blocks.iter().zip(&bps) {
            if let Some(old) = bp.and_then(|bp| ds.object.set_override(blkid, buf, bp)) {
                // Not `open_txg()`: the lock is held here, and a second read of it waits
                // behind a sync that waits for this one.
                self.io.zio.free(&old, txg, AllocClass::Mos);
            }
        }
        drop(hold);
        Ok(Some(bps))
    }
}

/// What the pool's writes hold and may hold (dirty bytes, memory, written-ahead space), read
/// by admission (`write.rs`) and the throttle.
pub(super) struct Admission {
    /// Every volume's reservation its blocks do not take yet (`Pool::refresh_reservations`).
    pub(super) reserved: std::sync::atomic::AtomicU64,
    pub(super) dirty_bytes: std::sync::atomic::AtomicI64,
    /// What writes may hold in memory before they wait for a sync (`PoolOptions::
    /// dirty_max_bytes` at first; `set_memory_limits` changes it).
    pub(super) dirty_max: std::sync::atomic::AtomicU64,
    /// The part of `dirty_bytes` already written to its place (`Dirty::Placed`): its space
    /// is allocated, so admission must not count it again.
    pub(super) placed_bytes: std::sync::atomic::AtomicI64,
    /// What the dirty changes hold in memory (`Dirty::held`): less than `dirty_bytes` by the
    /// placed blocks and by the unread rest of patched ones.
    pub(super) held_bytes: std::sync::atomic::AtomicI64,
    /// The level-1 indirect blocks the dirty changes make their syncs write (`Delta::meta`):
    /// with small random writes, more than the data itself (an 8K block dirties a 16K
    /// indirect block, two copies of it), and the sync must find room for them.
    pub(super) meta_bytes: std::sync::atomic::AtomicI64,
    /// Bytes written ahead past which a sync is asked: a quarter of the free space when the
    /// last txg committed (kept here so writers need not take the allocator's lock to ask).
    pub(super) ahead_limit: std::sync::atomic::AtomicU64,
    /// Bytes written ahead of their txg (placed, or written in place for the log), by txg,
    /// until that txg commits; superseded copies included: the intent log may point at
    /// every one of them, and after a crash import holds them all until the replay ends.
    pub(super) ahead: parking_lot::Mutex<std::collections::BTreeMap<u64, u64>>,
    pub(super) ahead_bytes: std::sync::atomic::AtomicU64,
    /// The free space admission last found in slivers too small for a block (when, block
    /// size, bytes): reused for a while instead of walking every free segment again.
    pub(super) slivers: parking_lot::Mutex<(std::time::Instant, u64, u64)>,
    /// The last count of room for indirect blocks (`Pool::fits_meta`).
    pub(super) meta_room: parking_lot::Mutex<MetaRoom>,
}
