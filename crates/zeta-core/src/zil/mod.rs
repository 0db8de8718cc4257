//! The intent log (issue 6): what makes a FUA write or a FLUSH durable without committing a
//! whole transaction group.
//!
//! Every write to a volume also becomes a *record* in its log's queue (in memory, sharing the
//! written block's buffer where it can). A FLUSH or FUA write asks the log to make everything
//! queued so far durable: the records are packed into checksummed log blocks (`block`),
//! chained per volume (`log`), written to devices chosen by a rotor, and the devices flushed;
//! then the waiters whose records are now durable are answered. When a txg commits, the
//! records it covers are dropped and the log blocks holding only such records are freed. At
//! import, records newer than the last committed txg are replayed.
//!
//! Two switches reproduce seed 000's experiment: `zil.commit` (`group`: one committer takes
//! everything queued and answers every waiter it covers; `per-request`: each sync request
//! writes and flushes its own block, one at a time, the baseline) and `zil.placement`
//! (`global`: one rotor for all volumes of the pool, seed 000's HPTR; `per-volume`: a rotor
//! per volume, each starting at the first device).
//!
//! Architecture invariant: `zil` reaches devices only through `TopVdev`, and knows nothing of
//! volumes or txg machinery: the pool supplies the txg hooks (`TxgHooks`) and calls back at
//! sync (`Log::prepare_sync`, `Log::txg_committed`).

pub mod block;
pub mod log;
pub mod space;
pub mod wake;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};
use serde::Serialize;

pub use crate::spa::props::{CommitPolicy, Placement};
use crate::vdev::{TopVdev, SECTOR};
use block::HEADER_BYTES;
pub use block::{BlockAddr, Payload, Record};
use log::size_for;
pub use log::{ByValue, Log, Prewrite, ZilHeader};
use space::LogSpace;
pub use wake::after_wakeups;
pub use wake::Done;

/// Why a sync request's records could not be made durable, as every waiter of the batch is
/// answered (hence a copyable message).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    #[error("could not make the write durable: {0}")]
    Failed(String),
    /// The pool waits for room on its devices' file systems (`Log::refuse`): not durable
    /// now, though nothing is lost; a request once room is made succeeds.
    #[error("could not make the write durable now: {0}")]
    OutOfRoom(String),
}

/// Why a log block could not be written, flushed or claimed.
#[derive(Debug, thiserror::Error)]
pub enum LogIoError {
    #[error("no log space")]
    NoSpace,
    #[error("log block on unknown vdev {0}")]
    UnknownVdev(u32),
    #[error("log block write to vdev {vdev}: {source}")]
    Write {
        vdev: u32,
        source: crate::vdev::VdevError,
    },
    /// More leaves of the vdev failed their flush than it can lose.
    #[error("log flush of vdev {vdev}: {}", failed.join("; "))]
    Flush { vdev: u32, failed: Vec<String> },
    #[error("log block on vdev {0}, which has no log space")]
    NoRegion(u32),
    #[error("log block at {off}+{asize} lies outside vdev {vdev}'s log region")]
    OutsideRegion { vdev: u32, off: u64, asize: u64 },
    #[error("log block at {off}+{asize} on vdev {vdev} is claimed twice")]
    ClaimedTwice { vdev: u32, off: u64, asize: u64 },
}

/// The most log blocks of a batch written at once (`Zil::write_blocks`), each with up to
/// `log::MAX_BLOCK` bytes encoded in memory.
pub(crate) const PARALLEL_LOG_WRITES: usize = 4;

/// How long a vdev whose log block write failed gets no new log blocks while another can
/// take them (`Zil::shun`). A write is the only test of room that means anything on a
/// sparse file, so the vdev is tried again after this, at the cost of one batch that falls
/// back to a txg per try while it stays full or failing.
const LOG_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// What the log needs from the pool's txg machinery.
pub trait TxgHooks: Send + Sync {
    /// Commits everything written so far as a txg (the fallback when a log write fails or
    /// log space runs out). `LogError::OutOfRoom` at once if the pool waits for room: the
    /// txg goes on and commits once room is made, but the log must not wait with it.
    fn sync_now(&self) -> Result<(), LogError>;
    /// Asks for an early txg without waiting (log space is filling up).
    fn request_sync(&self);
    /// Returns once a txg commits: the one syncing now, or else one asked for now. Gives the
    /// last committed txg. (`sync_now` waits for a sync that starts after the call, which
    /// can be the second to commit from now.) Gives up as `sync_now` does.
    fn wait_commit(&self) -> Result<u64, LogError>;
}

fn not_ready() -> LogError {
    LogError::Failed("the pool is not ready for log commits".into())
}

/// The largest block size below `want`, in whole 4 KiB sectors, whose space on `top` fits
/// in `room` bytes; `None` if not even a sector does.
fn largest_slot(top: &TopVdev, room: u64, want: u32) -> Option<u32> {
    // A raidz block takes more than its size (parity, padding); `asize_of` never falls as
    // the size grows, so the first size down from the top that fits is the largest. (At
    // most 256 steps: blocks are at most 1M.)
    let mut len = room.min((want as u64).saturating_sub(SECTOR)) / SECTOR * SECTOR;
    while len >= SECTOR && top.asize_of(len) > room {
        len -= SECTOR;
    }
    (len >= SECTOR).then_some(len as u32)
}

/// Counters since the pool was opened.
#[derive(Default)]
struct Stats {
    /// Log blocks and bytes written, by vdev id.
    per_vdev: Mutex<Vec<(u64, u64)>>,
    records: AtomicU64,
    batches: AtomicU64,
    flushes: AtomicU64,
    batch_nanos: AtomicU64,
    fallback_syncs: AtomicU64,
    space_waits: AtomicU64,
    bulk_syncs: AtomicU64,
    in_place: AtomicU64,
}

/// A snapshot of the log counters (`zeta pool iostat`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ZilStats {
    /// Log blocks and bytes written per top-level vdev, by vdev id.
    pub blocks: Vec<u64>,
    pub bytes: Vec<u64>,
    pub records: u64,
    pub batches: u64,
    /// Device flushes issued by log commits: one per log block (each is written durably on
    /// its own), one per device that a streaming write's blocks went to, and one per device
    /// that a batch's blocks written in place went to (their durable write).
    pub flushes: u64,
    pub batch_nanos: u64,
    /// Commits that fell back to a txg sync (log space full, a log write failed, or a
    /// volume whose log header was not yet on disk).
    pub fallback_syncs: u64,
    /// Commits that found log space full and waited for a syncing txg to free some (or to
    /// cover their records).
    pub space_waits: u64,
    /// Commits of batches too large to be worth logging (`log::BULK_SYNC_BYTES`), made by a
    /// txg sync instead.
    pub bulk_syncs: u64,
    /// Records of large writes whose data went to its place, logged by block pointer.
    pub in_place: u64,
    pub space_used: u64,
    pub space_total: u64,
}

/// A top-level vdev as the log sees it.
struct LogVdev {
    top: Arc<TopVdev>,
    /// A separate log device (all of it is log space), as opposed to a data vdev's reserve.
    dedicated: bool,
    /// Being removed: no new log block goes there.
    removing: bool,
    /// Until when (`Zil::now_ms`) new log blocks go elsewhere if they can: a log block
    /// write here failed (`Zil::shun`).
    shunned_until_ms: AtomicU64,
}

impl LogVdev {
    /// Whether a log block written here now could be read back: no more leaves out of
    /// service than the vdev can lose.
    fn usable(&self) -> bool {
        !self.removing
            && self.top.children.iter().filter(|c| c.is_offline()).count() <= self.top.redundancy()
    }

    fn shunned(&self, now_ms: u64) -> bool {
        self.shunned_until_ms.load(Ordering::Relaxed) > now_ms
    }
}

/// Blocks in a row a lone committer's log keeps to one device (`Zil::global_rotor`).
const KEEP_BLOCKS: usize = 16;

/// A volume's commit under way (`Zil::committing`).
pub(crate) struct Committing<'a>(&'a AtomicUsize);

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The pool-wide part of the log: log space, the shared rotor, policies and counters.
///
/// Log blocks go to the separate log devices when the pool has any (in rotation), and to
/// the data vdevs' reserves when it has none or they are full or out of service.
pub struct Zil {
    /// By vdev id; `None` for an id no vdev has (a removed log device's).
    vdevs: RwLock<Vec<Option<LogVdev>>>,
    pub(crate) space: LogSpace,
    rotor: AtomicUsize,
    /// Volumes whose commit is under way (a batch taken, its blocks not yet written).
    committing: AtomicUsize,
    /// Blocks in a row the global rotor has kept to one device for a lone committer.
    kept: AtomicUsize,
    pub commit: CommitPolicy,
    pub placement: Placement,
    stats: Stats,
    hooks: OnceLock<Box<dyn TxgHooks>>,
    /// Bytes of buffers the queued records of every volume keep alive (`Record::held_bytes`).
    pinned: AtomicU64,
    /// What `now_ms` counts from.
    born: std::time::Instant,
}

impl Zil {
    /// `tops[i]`: a top-level vdev, its log region (start, length; none if the length is 0)
    /// and whether it is a separate log device.
    pub fn new(
        tops: Vec<(Arc<TopVdev>, (u64, u64), bool)>,
        commit: CommitPolicy,
        placement: Placement,
    ) -> Zil {
        let zil = Zil {
            vdevs: RwLock::new(Vec::new()),
            space: LogSpace::new(&[]),
            rotor: AtomicUsize::new(0),
            committing: AtomicUsize::new(0),
            kept: AtomicUsize::new(0),
            commit,
            placement,
            stats: Stats::default(),
            hooks: OnceLock::new(),
            pinned: AtomicU64::new(0),
            born: std::time::Instant::now(),
        };
        for (top, region, dedicated) in tops {
            zil.add_vdev(top, region, dedicated, false);
        }
        zil
    }

    /// Adds a top-level vdev with its log region; `removing` keeps log blocks off it until
    /// [`set_removing`](Self::set_removing) clears it (a log device whose labels are not
    /// written yet).
    pub fn add_vdev(&self, top: Arc<TopVdev>, region: (u64, u64), dedicated: bool, removing: bool) {
        let v = top.id as usize;
        self.space.add(top.id, region.0, region.1);
        let mut vdevs = self.vdevs.write();
        if vdevs.len() <= v {
            vdevs.resize_with(v + 1, || None);
        }
        vdevs[v] = Some(LogVdev {
            top,
            dedicated,
            removing,
            shunned_until_ms: AtomicU64::new(0),
        });
    }

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// A log block write to vdev `v` failed: for `LOG_RETRY`, new log blocks go to the other
    /// vdevs if any can take them. A separate log device whose file system is full would
    /// otherwise fail every batch, each falling back to a txg, while the data vdevs'
    /// reserves had room (ZFS likewise writes log blocks to the main pool when its log
    /// device fails them).
    fn shun(&self, v: u32) {
        if let Some(Some(lv)) = self.vdevs.read().get(v as usize) {
            let until = self.now_ms() + LOG_RETRY.as_millis() as u64;
            lv.shunned_until_ms.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// Keeps new log blocks off vdev `v` (or lets them back).
    pub fn set_removing(&self, v: u32, removing: bool) {
        if let Some(Some(lv)) = self.vdevs.write().get_mut(v as usize) {
            lv.removing = removing;
        }
    }

    /// Forgets vdev `v`; refused (with the bytes still in use) while log blocks live there.
    pub fn remove_vdev(&self, v: u32) -> Result<(), u64> {
        self.space.remove(v)?;
        if let Some(slot) = self.vdevs.write().get_mut(v as usize) {
            *slot = None;
        }
        Ok(())
    }

    /// Bytes of log blocks (written, being written, or slots taken for the next ones) on
    /// vdev `v`.
    pub fn used_on(&self, v: u32) -> u64 {
        self.space.used(v)
    }

    /// The separate log devices, in id order.
    pub fn log_devices(&self) -> Vec<Arc<TopVdev>> {
        self.vdevs
            .read()
            .iter()
            .flatten()
            .filter(|lv| lv.dedicated)
            .map(|lv| lv.top.clone())
            .collect()
    }

    pub(crate) fn top(&self, v: u32) -> Option<Arc<TopVdev>> {
        self.vdevs
            .read()
            .get(v as usize)?
            .as_ref()
            .map(|lv| lv.top.clone())
    }

    pub fn set_hooks(&self, hooks: Box<dyn TxgHooks>) {
        let _ = self.hooks.set(hooks);
    }

    /// Whether this pool has any log space (pools made before the log existed have none
    /// unless a log device was added: their sync requests commit a txg).
    pub fn enabled(&self) -> bool {
        !self.space.vdevs().is_empty()
    }

    fn sync_now(&self) -> Result<(), LogError> {
        self.stats.fallback_syncs.fetch_add(1, Ordering::Relaxed);
        self.sync_txg()
    }

    /// Log space is full: waits for the next txg to commit (see `TxgHooks::wait_commit`),
    /// which frees the blocks it covers; returns the last committed txg.
    fn wait_for_space(&self) -> Result<u64, LogError> {
        self.stats.space_waits.fetch_add(1, Ordering::Relaxed);
        match self.hooks.get() {
            Some(h) => h.wait_commit(),
            None => Err(not_ready()),
        }
    }

    /// The size from which a batch is committed by a txg sync (`log::BULK_SYNC_BYTES`): a
    /// quarter of the log space if that is less, as a batch that size would crowd out the
    /// other volumes' commits, and one larger than the log waits for txgs and then syncs one.
    pub fn bulk_sync_bytes(&self) -> usize {
        let (_, total) = self.space.usage();
        (total / 4).min(log::BULK_SYNC_BYTES as u64) as usize
    }

    /// Commits a batch too large to be worth logging by a txg sync.
    fn bulk_sync(&self) -> Result<(), LogError> {
        self.stats.bulk_syncs.fetch_add(1, Ordering::Relaxed);
        self.sync_txg()
    }

    fn sync_txg(&self) -> Result<(), LogError> {
        match self.hooks.get() {
            Some(h) => h.sync_now(),
            None => Err(not_ready()),
        }
    }

    /// Space for a block of `want` bytes on the device the rotor points at (or the next
    /// ones, if it is full). Separate log devices come first; the data vdevs' reserves are
    /// the fallback. `local` is the volume's own rotor, used under `per-volume`.
    ///
    /// If no device has `want` bytes in one piece, the largest piece of at least `least`
    /// bytes will do, in the same order: a slot's size is only a guess at the next batch,
    /// and a batch larger than its slot goes on in more blocks. A log whose blocks free
    /// their unwritten ends (`free_tail`) is left, a txg after the ring last wrapped, in
    /// pieces a little smaller than the largest block: commits that asked for a whole one
    /// waited for a txg while much of the log was free (figures: docs/perf/intent-log.md,
    /// "Why a log slot takes the largest free piece when none is as large as asked").
    ///
    /// Vdevs whose last log block write failed a moment ago (`shun`) come last: tried only
    /// when no other has the space.
    fn alloc_slot(&self, local: &mut usize, want: u32, least: u32) -> Option<BlockAddr> {
        self.alloc_slot_for(local, want, least, true)
    }

    /// `alloc_slot` for a further block of the batch being laid out: under global
    /// placement, on the next device (`global_rotor`).
    fn alloc_continuation(&self, local: &mut usize, want: u32, least: u32) -> Option<BlockAddr> {
        self.alloc_slot_for(local, want, least, false)
    }

    fn alloc_slot_for(
        &self,
        local: &mut usize,
        want: u32,
        least: u32,
        keep: bool,
    ) -> Option<BlockAddr> {
        let vdevs = self.vdevs.read();
        let now = self.now_ms();
        let (shunned, trusted): (Vec<&LogVdev>, Vec<&LogVdev>) = vdevs
            .iter()
            .flatten()
            .filter(|lv| lv.usable())
            .partition(|lv| lv.shunned(now));
        let (dedicated, reserves): (Vec<&LogVdev>, Vec<&LogVdev>) =
            trusted.into_iter().partition(|lv| lv.dedicated);
        if dedicated.is_empty() && reserves.is_empty() && shunned.is_empty() {
            return None;
        }
        let first = match self.placement {
            Placement::Global => self.global_rotor(keep),
            Placement::PerVolume => {
                *local = local.wrapping_add(1);
                *local - 1
            }
        };
        // Dedicated log devices first, each class from the rotor's position.
        let order: Vec<&TopVdev> = [&dedicated, &reserves, &shunned]
            .into_iter()
            .flat_map(|class| {
                let n = class.len();
                (0..n).map(move |k| &*class[(first + k) % n].top)
            })
            .collect();
        let take = |top: &TopVdev, len: u32| {
            let offset = self.space.alloc(top.id, top.asize_of(len as u64))?;
            self.note_pressure();
            Some(BlockAddr {
                vdev: top.id,
                len,
                offset,
            })
        };
        if let Some(a) = order.iter().find_map(|top| take(top, want)) {
            return Some(a);
        }
        order.iter().find_map(|top| {
            let len = largest_slot(top, self.space.largest(top.id), want)?;
            (len >= least).then(|| take(top, len)).flatten()
        })
    }

    /// The global rotor's next position. While one volume alone commits (a lone writer: no
    /// other batch under way to spread over the devices), its blocks keep to the device of
    /// the last one, up to `KEEP_BLOCKS` in a row, before the rotor moves on.
    ///
    /// This is for file vdevs: a file system updates a file's modification time once per
    /// clock tick in which it is written, and ext4 without a journal (this machine's) then
    /// writes the file's inode at the next `fdatasync`, a device round trip of its own. A
    /// lone writer's blocks spread over three files met a new tick at most writes, and far
    /// fewer kept to one file for a run of blocks (figures: docs/perf/intent-log.md, "Why a
    /// lone writer keeps its log blocks on one device, 16 at a time").
    ///
    /// Only for the slot of a batch's first block (`keep`): the further blocks of a large
    /// batch go to the next devices, to be written at once.
    fn global_rotor(&self, keep: bool) -> usize {
        let lone = keep && self.committing.load(Ordering::Relaxed) <= 1;
        if lone && self.kept.fetch_add(1, Ordering::Relaxed) < KEEP_BLOCKS {
            return self.rotor.load(Ordering::Relaxed);
        }
        self.kept.store(1, Ordering::Relaxed);
        self.rotor.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
    }

    /// Counts a volume's commit as under way until the guard drops (`global_rotor`).
    pub(crate) fn committing(&self) -> Committing<'_> {
        self.committing.fetch_add(1, Ordering::Relaxed);
        Committing(&self.committing)
    }

    pub(crate) fn free_slot(&self, a: BlockAddr) {
        if a.is_none() {
            return;
        }
        if let Some(top) = self.top(a.vdev) {
            self.space
                .free(a.vdev, a.offset, top.asize_of(a.len as u64));
        }
    }

    /// The part of `slot` a block with `body` bytes of records takes: its whole 4 KiB
    /// sectors, on a vdev where a block's first sectors are a block of their own (a stripe or
    /// mirror, whose addresses map straight onto their leaves). The committer writes only
    /// that part and frees the rest of the slot, so the slack a slot keeps for a batch larger
    /// than the last is neither written nor held. A raidz lays a block's columns out by its
    /// size, so there a block fills its slot.
    pub(crate) fn written_part(&self, slot: BlockAddr, body: usize) -> BlockAddr {
        let linear = self.top(slot.vdev).is_some_and(|t| t.raidz().is_none());
        if !linear {
            return slot;
        }
        BlockAddr {
            len: size_for(HEADER_BYTES + body).min(slot.len),
            ..slot
        }
    }

    /// Frees what of `slot` lies past `part` (from `written_part`).
    pub(crate) fn free_tail(&self, slot: BlockAddr, part: BlockAddr) {
        if part.len < slot.len {
            self.space.free(
                slot.vdev,
                slot.offset + part.len as u64,
                (slot.len - part.len) as u64,
            );
        }
    }

    pub(crate) fn claim_slot(&self, a: BlockAddr) -> Result<(), LogIoError> {
        let top = self.top(a.vdev).ok_or(LogIoError::UnknownVdev(a.vdev))?;
        self.space
            .claim(a.vdev, a.offset, top.asize_of(a.len as u64))
    }

    /// Past half of the log space in use, ask for a txg: it frees the blocks it covers.
    fn note_pressure(&self) {
        let (used, total) = self.space.usage();
        if used * 2 > total {
            if let Some(h) = self.hooks.get() {
                h.request_sync();
            }
        }
    }

    /// Bytes of buffers that records waiting for a log block or a txg keep alive, in every
    /// volume of the pool. Mostly the dirty blocks themselves (a record shares its block's
    /// buffer); more only where a block was rewritten and a record still holds an older
    /// buffer of it. The pool syncs and throttles on this as on dirty bytes, so a client that
    /// rewrites one block without flushing cannot make the log hold unbounded memory.
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned.load(Ordering::Relaxed)
    }

    /// A record was queued: it keeps `rec.held_bytes()` alive.
    pub(crate) fn pin(&self, rec: &Record) {
        self.pinned.fetch_add(rec.held_bytes(), Ordering::Relaxed);
    }

    /// Queued records left the queue (logged, covered by a txg, or discarded).
    pub(crate) fn unpin<'a>(&self, records: impl Iterator<Item = &'a Record>) {
        let n: u64 = records.map(Record::held_bytes).sum();
        self.pinned.fetch_sub(n, Ordering::Relaxed);
    }

    pub fn stats(&self) -> ZilStats {
        let (space_used, space_total) = self.space.usage();
        let per_vdev = self.stats.per_vdev.lock().clone();
        let n = per_vdev.len().max(self.vdevs.read().len());
        let at = |v: usize| per_vdev.get(v).copied().unwrap_or_default();
        ZilStats {
            blocks: (0..n).map(|v| at(v).0).collect(),
            bytes: (0..n).map(|v| at(v).1).collect(),
            records: self.stats.records.load(Ordering::Relaxed),
            batches: self.stats.batches.load(Ordering::Relaxed),
            flushes: self.stats.flushes.load(Ordering::Relaxed),
            batch_nanos: self.stats.batch_nanos.load(Ordering::Relaxed),
            fallback_syncs: self.stats.fallback_syncs.load(Ordering::Relaxed),
            space_waits: self.stats.space_waits.load(Ordering::Relaxed),
            bulk_syncs: self.stats.bulk_syncs.load(Ordering::Relaxed),
            in_place: self.stats.in_place.load(Ordering::Relaxed),
            space_used,
            space_total,
        }
    }

    /// Writes a batch's log blocks, each made durable on its own (`TopVdev::write_durable`:
    /// only that range reaches the media, so a commit does not wait for the writeback of the
    /// txg in flight on the same devices); then flushes the `data_vdevs` that blocks written
    /// in place went to, once each.
    ///
    /// Up to `PARALLEL_LOG_WRITES` blocks at once, each encoded and written by a thread of its
    /// own (`waiting_in_parallel`; the first by this one), so the batch waits for about one
    /// write rather than one per block. Order on disk does not matter: each block names the
    /// next, so a crash that leaves a later one written and an earlier one not ends the chain
    /// at the earlier one, and no waiter of the batch has been answered. (A write that fails
    /// while later blocks land ends the chain for good: `log::settle`.) Encoded only there,
    /// and dropped once written: a batch of up to `bulk_sync_bytes` encoded all at once is
    /// memory no limit counts (it raised `zeta bench vol`'s peak, all of it in encoded log
    /// blocks; figures: docs/perf/memory.md, "Why log blocks are encoded one at a time, as
    /// they are written").
    fn write_blocks(
        &self,
        blocks: &[(BlockAddr, block::LogBlock)],
        records: u64,
        data_vdevs: &[u32],
    ) -> Result<(), LogIoError> {
        let write = |(a, b): &(BlockAddr, block::LogBlock)| -> Result<(u32, u64), LogIoError> {
            let bytes = b.encode(a.len as usize);
            self.top(a.vdev)
                .ok_or(LogIoError::UnknownVdev(a.vdev))?
                // No txg's block: a copy some child missed is wanted only until the txg
                // covering its records commits, and no resilver could give it back.
                .write_durable(a.offset, &bytes, None)
                .map_err(|source| {
                    self.shun(a.vdev);
                    LogIoError::Write {
                        vdev: a.vdev,
                        source,
                    }
                })?;
            Ok((a.vdev, bytes.len() as u64))
        };
        let mut written: Vec<(u32, u64)> = Vec::new();
        for group in blocks.chunks(PARALLEL_LOG_WRITES) {
            for w in crate::vdev::waiting_in_parallel(group, write) {
                written.push(w?);
            }
        }
        let mut touched: Vec<u32> = data_vdevs.to_vec();
        touched.sort_unstable();
        touched.dedup();
        touched.iter().try_for_each(|&v| self.flush_vdev(v))?;
        {
            let mut per_vdev = self.stats.per_vdev.lock();
            for &(v, len) in &written {
                let v = v as usize;
                if per_vdev.len() <= v {
                    per_vdev.resize(v + 1, (0, 0));
                }
                per_vdev[v].0 += 1;
                per_vdev[v].1 += len;
            }
        }
        self.stats.records.fetch_add(records, Ordering::Relaxed);
        self.stats
            .flushes
            .fetch_add((written.len() + touched.len()) as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Flushes every leaf of a vdev; it counts as flushed if no more leaves failed than
    /// the vdev can lose.
    fn flush_vdev(&self, v: u32) -> Result<(), LogIoError> {
        let top = self.top(v).ok_or(LogIoError::UnknownVdev(v))?;
        let mut failed = Vec::new();
        for leaf in &top.children {
            if leaf.is_offline() {
                failed.push(format!("{}: out of service", leaf.name()));
            } else if let Err(e) = leaf.flush() {
                failed.push(format!("{}: {e}", leaf.name()));
            }
        }
        if failed.len() > top.redundancy() {
            return Err(LogIoError::Flush { vdev: v, failed });
        }
        Ok(())
    }

    fn note_in_place(&self) {
        self.stats.in_place.fetch_add(1, Ordering::Relaxed);
    }

    /// A commit wrote blocks in place durably, on `devices` top-level vdevs.
    pub(crate) fn note_durable_data(&self, devices: usize) {
        self.stats
            .flushes
            .fetch_add(devices as u64, Ordering::Relaxed);
    }

    fn note_batch(&self, nanos: u64) {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.batch_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::raidz::RaidzConfig;
    use crate::vdev::top::mem_mirror;
    use crate::vdev::Leaf;
    use crate::vdev::{BlockDevice, MemDevice};

    const K: u64 = 1024;

    /// A log on one mirror whose region is the 1 MiB from 1 MiB on.
    fn mirror_log() -> Zil {
        let (top, _devs) = mem_mirror(2, 7);
        Zil::new(
            vec![(Arc::new(top), (1 << 20, 1 << 20), false)],
            CommitPolicy::Group,
            Placement::Global,
        )
    }

    /// Fills the region with 64K slots and frees the last `tail` bytes of each, as blocks that
    /// wrote less than their slot do: what is free is pieces of `tail` bytes.
    fn leave_only_tails(zil: &Zil, tail: u64) {
        let mut rotor = 0;
        while let Some(a) = zil.alloc_slot(&mut rotor, 64 << 10, 64 << 10) {
            let part = BlockAddr {
                len: (64 * K - tail) as u32,
                ..a
            };
            zil.free_tail(a, part);
        }
        assert_eq!(zil.space.largest(0), tail);
    }

    #[test]
    fn a_bulk_sync_starts_at_64m_or_a_quarter_of_the_log() {
        assert_eq!(mirror_log().bulk_sync_bytes(), 256 << 10);
        let (top, _devs) = mem_mirror(2, 7);
        // Only the region's bounds matter here: nothing is written to it.
        let zil = Zil::new(
            vec![(Arc::new(top), (1 << 20, 4 << 30), false)],
            CommitPolicy::Group,
            Placement::Global,
        );
        assert_eq!(zil.bulk_sync_bytes(), log::BULK_SYNC_BYTES);
    }

    /// Three stripes, each with a log region, under global placement.
    fn three_stripe_log() -> Zil {
        let tops = (0..3)
            .map(|i| {
                let (mut top, _devs) = mem_mirror(1, 10 + i);
                top.id = i as u32;
                (Arc::new(top), (1 << 20, 4 << 20), false)
            })
            .collect();
        Zil::new(tops, CommitPolicy::Group, Placement::Global)
    }

    #[test]
    fn a_lone_committer_keeps_to_one_device_for_a_run_of_blocks() {
        let zil = three_stripe_log();
        let vdev = |zil: &Zil| zil.alloc_slot(&mut 0, 4096, 4096).unwrap().vdev;
        // Alone: 16 blocks in a row on one device, then the next.
        let lone = zil.committing();
        let first = vdev(&zil);
        for _ in 1..KEEP_BLOCKS {
            assert_eq!(vdev(&zil), first);
        }
        let after = vdev(&zil);
        assert_ne!(after, first, "the run ends after {KEEP_BLOCKS} blocks");
        // A batch's further blocks go on to the next devices all the same.
        let further = zil.alloc_continuation(&mut 0, 4096, 4096).unwrap().vdev;
        assert_ne!(further, after);
        // Two volumes committing: every block moves on, all devices taken in turn.
        let other = zil.committing();
        let turn: Vec<u32> = (0..3).map(|_| vdev(&zil)).collect();
        let mut sorted = turn.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2], "{turn:?}");
        drop((lone, other));
        assert_eq!(zil.committing.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_slot_takes_the_size_asked_where_a_piece_that_large_is_free() {
        let zil = mirror_log();
        let a = zil.alloc_slot(&mut 0, 64 << 10, 4096).unwrap();
        assert_eq!((a.vdev, a.len), (0, 64 << 10));
    }

    #[test]
    fn without_a_piece_that_large_a_slot_takes_the_largest_that_holds_the_least() {
        let zil = mirror_log();
        leave_only_tails(&zil, 20 * K);
        // Waiting for a txg to free a 64K piece is not needed: 20K pieces are free.
        let a = zil.alloc_slot(&mut 0, 64 << 10, 8192).unwrap();
        assert_eq!(a.len as u64, 20 * K);
        // A record that needs more than any piece holds must wait.
        assert!(zil.alloc_slot(&mut 0, 64 << 10, 24 << 10).is_none());
        let (used, total) = zil.space.usage();
        assert_eq!(total - used, 15 * 20 * K, "the pieces left, one taken");
    }

    #[test]
    fn a_raidz_slot_from_a_piece_is_the_largest_whose_columns_fit() {
        let devs: Vec<Arc<MemDevice>> = (0..6)
            .map(|i| Arc::new(MemDevice::new(&format!("r{i}"), 8 << 20)))
            .collect();
        let leaves = devs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Some(Arc::new(Leaf::new(
                    d.clone() as Arc<dyn BlockDevice>,
                    i as u64 + 1,
                )))
            })
            .collect();
        let config = RaidzConfig::new(2, 6, false).unwrap();
        let top = TopVdev::new_raidz(0, 9, config, leaves).unwrap();
        for room in [24 * K, 100 * K, 250 * K] {
            let len = largest_slot(&top, room, 256 << 10).expect("a sector at least") as u64;
            assert!(top.asize_of(len) <= room, "{room}: {len}");
            assert!(
                top.asize_of(len + 4096) > room,
                "{room}: {len} is not the largest"
            );
        }
        // Less room than one sector's columns take: no slot.
        assert_eq!(largest_slot(&top, top.asize_of(4096) - 1, 256 << 10), None);
        // Never as large as asked for (that was tried first).
        assert_eq!(largest_slot(&top, 1 << 30, 64 << 10), Some(60 << 10));
    }
}
