//! Top-level vdevs: a `stripe` of one leaf, a `mirror` of several, or a `raidz` (see
//! `vdev::raidz`). Offsets given to a top-level vdev count from the start of its allocatable
//! area; the leaf adds its label reserve.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::device::{BlockDevice, VdevError};
use super::layout::{label_offset, usable_bytes, LABEL_SIZE, RESERVE_BYTES, SECTOR};
use super::raidz::{Raidz, RaidzConfig};

/// Error counters of one leaf, as `zeta pool status` shows them.
#[derive(Default, Debug)]
pub struct LeafCounters {
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub cksum_errors: AtomicU64,
    pub repaired_bytes: AtomicU64,
    /// Data writes that reached the device, by size: bucket `i` counts those of 4K << i
    /// up to twice that (the last, all larger). What the allocator's contiguity buys shows
    /// here: small random writes that leave in large runs (`zeta pool iostat`).
    pub write_sizes: [AtomicU64; WRITE_SIZE_BUCKETS],
    /// The bytes of those writes.
    pub write_bytes: AtomicU64,
}

/// Buckets of `LeafCounters::write_sizes`: 4K, 8K, ... 64M and up.
pub const WRITE_SIZE_BUCKETS: usize = 15;

impl LeafCounters {
    /// Counts a data write of `len` bytes in `write_sizes`.
    pub fn note_write(&self, len: u64) {
        let b = (63 - len.max(4096).leading_zeros() as usize - 12).min(WRITE_SIZE_BUCKETS - 1);
        self.write_sizes[b].fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(len, Ordering::Relaxed);
    }

    /// (read, write, cksum, repaired bytes) now.
    pub fn snapshot(&self) -> [u64; 4] {
        [
            self.read_errors.load(Ordering::Relaxed),
            self.write_errors.load(Ordering::Relaxed),
            self.cksum_errors.load(Ordering::Relaxed),
            self.repaired_bytes.load(Ordering::Relaxed),
        ]
    }

    pub fn set(&self, v: [u64; 4]) {
        self.read_errors.store(v[0], Ordering::Relaxed);
        self.write_errors.store(v[1], Ordering::Relaxed);
        self.cksum_errors.store(v[2], Ordering::Relaxed);
        self.repaired_bytes.store(v[3], Ordering::Relaxed);
    }
}

pub struct Leaf {
    /// The device and the GUID it carries. Both change only when the leaf is replaced in
    /// place (`Leaf::swap`): the leaf keeps its position in its vdev for the pool's life.
    dev: parking_lot::RwLock<Arc<dyn BlockDevice>>,
    guid: AtomicU64,
    /// Named by the config but not found at import: every I/O fails, nothing is counted.
    missing: AtomicBool,
    pub counters: LeafCounters,
    /// Taken offline by the administrator: no data I/O reaches it (labels neither) until it
    /// is brought online, and the txgs it misses go into `missed`.
    offline: AtomicBool,
    /// Taken out of service after `FAULT_AFTER` failed I/Os in a row, where its vdev could
    /// spare it; like offline until `zeta pool clear`.
    faulted: AtomicBool,
    /// Its last data write failed for lack of room on the file system under it, while its
    /// siblings took the blocks: it stays in service, misses what it cannot take (`missed`)
    /// and is never faulted for it, since freeing room is the cure, not a new device. Its
    /// first write that succeeds ends this; the txg it takes whole resilvers it.
    no_room: AtomicBool,
    /// Failed reads since the last read that succeeded, and the same for writes: a device
    /// that takes writes but returns no reads (or the reverse) is failing all the same.
    streak: [std::sync::atomic::AtomicU32; 2],
    /// Txgs whose writes this leaf missed (offline, or a failed write): what a resilver must
    /// bring it, as inclusive ranges (ZFS's dirty time log).
    pub missed: parking_lot::Mutex<TxgRanges>,
    /// The txgs this leaf came to owe since the running resilver started (`Leaf::owes`),
    /// and all it owed when it came back into service since then (`Leaf::rejoin`): that
    /// resilver may have passed their blocks while the leaf could not take them, so its end
    /// must not count them as done.
    owed_since_scan: parking_lot::Mutex<TxgRanges>,
    /// Faults injected on a live pool (`zeta inject`), for tests and rehearsals.
    pub inject: parking_lot::Mutex<Injection>,
    /// Part of a pool imported read-only: reads that find a bad copy count it but never
    /// rewrite it (`is_read_only`).
    read_only: AtomicBool,
}

/// Faults `zeta inject` sets on a leaf: reads or writes fail with a probability, or the
/// device behaves as if it were pulled (every I/O, labels and flushes included, fails).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Injection {
    /// Probability (0..=1) that a data read fails.
    pub fail_reads: f64,
    /// Probability (0..=1) that a data write fails.
    pub fail_writes: f64,
    /// Data writes fail with ENOSPC, as when the file system under a file device fills.
    pub full: bool,
    pub vanished: bool,
}

/// What an I/O is, for fault injection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IoKind {
    Read,
    Write,
    Other,
}

/// Failed data I/Os in a row after which a leaf is faulted (if its vdev can spare it).
pub const FAULT_AFTER: u32 = 16;

/// Held while a leaf is taken out of service for a reason that needs its siblings in service
/// (a fault, an administrator's offline): the count of those out and the change are one step.
/// Counted apart, two leaves of a vdev that can lose one, failing at the same moment, each saw
/// the other in service, and both went. Process-wide: such changes are rare.
static SERVICE_CHANGE: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// Serializes a change of which leaves are in service with every such decision
/// (`SERVICE_CHANGE`): held by `Pool::set_offline` while it counts and takes a leaf offline.
pub fn service_change() -> parking_lot::MutexGuard<'static, ()> {
    SERVICE_CHANGE.lock()
}

/// Faults `leaf` after a run of failures if, counting it, no more of `siblings` are out of
/// service than `tolerable`; the vdev then stops sending it I/O instead of failing on it.
pub(super) fn maybe_fault<'a>(
    leaf: &Leaf,
    siblings: impl Iterator<Item = Option<&'a Arc<Leaf>>>,
    tolerable: usize,
) {
    let _one_at_a_time = service_change();
    if leaf.is_offline() {
        return;
    }
    let out = siblings
        .filter(|s| s.is_none_or(|l| l.is_offline()))
        .count();
    if out < tolerable {
        leaf.set_faulted(true);
    }
}

/// A set of txgs as sorted, disjoint, inclusive ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxgRanges(pub Vec<[u64; 2]>);

impl TxgRanges {
    pub fn add(&mut self, txg: u64) {
        self.add_range([txg, txg]);
    }

    pub fn add_range(&mut self, r: [u64; 2]) {
        self.0.push(r);
        self.0.sort();
        let mut out: Vec<[u64; 2]> = Vec::new();
        for r in self.0.drain(..) {
            match out.last_mut() {
                Some(last) if r[0] <= last[1].saturating_add(1) => last[1] = last[1].max(r[1]),
                _ => out.push(r),
            }
        }
        self.0 = out;
    }

    /// Removes every txg of `other` (what a finished resilver covered).
    pub fn remove(&mut self, other: &TxgRanges) {
        let mut out = Vec::new();
        for &[a, b] in &self.0 {
            let mut pieces = vec![[a, b]];
            for &[c, d] in &other.0 {
                pieces = pieces
                    .into_iter()
                    .flat_map(|[x, y]| {
                        let mut v = Vec::new();
                        if x < c {
                            v.push([x, y.min(c - 1)]);
                        }
                        if y > d {
                            v.push([x.max(d + 1), y]);
                        }
                        v.into_iter().filter(|[x, y]| x <= y)
                    })
                    .collect();
            }
            out.extend(pieces);
        }
        self.0 = out;
    }

    /// The txgs of this set up to `last`, inclusive.
    pub fn up_to(&self, last: u64) -> TxgRanges {
        TxgRanges(
            self.0
                .iter()
                .filter(|r| r[0] <= last)
                .map(|&[a, b]| [a, b.min(last)])
                .collect(),
        )
    }

    pub fn contains(&self, txg: u64) -> bool {
        self.0.iter().any(|&[a, b]| a <= txg && txg <= b)
    }

    pub fn min(&self) -> Option<u64> {
        self.0.first().map(|r| r[0])
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Leaf {
    pub fn new(dev: Arc<dyn BlockDevice>, guid: u64) -> Leaf {
        Leaf {
            dev: parking_lot::RwLock::new(dev),
            guid: AtomicU64::new(guid),
            missing: AtomicBool::new(false),
            counters: LeafCounters::default(),
            offline: AtomicBool::new(false),
            faulted: AtomicBool::new(false),
            no_room: AtomicBool::new(false),
            streak: Default::default(),
            missed: parking_lot::Mutex::new(TxgRanges::default()),
            owed_since_scan: parking_lot::Mutex::new(TxgRanges::default()),
            inject: parking_lot::Mutex::new(Injection::default()),
            read_only: AtomicBool::new(false),
        }
    }

    /// In a pool imported read-only: nothing may write the device, not even a repair.
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Relaxed)
    }

    pub fn set_read_only(&self) {
        self.read_only.store(true, Ordering::Relaxed);
    }

    /// Fails this I/O if an injected fault says so.
    fn injected(&self, kind: IoKind) -> Result<(), VdevError> {
        let f = *self.inject.lock();
        if f.full && kind == IoKind::Write && !f.vanished {
            return Err(VdevError::no_room(&self.name()));
        }
        let what = if f.vanished {
            Some("vanished device")
        } else {
            let p = match kind {
                IoKind::Read => f.fail_reads,
                IoKind::Write => f.fail_writes,
                IoKind::Other => 0.0,
            };
            (p > 0.0 && rand::random::<f64>() < p).then_some(match kind {
                IoKind::Read => "read",
                _ => "write",
            })
        };
        match what {
            Some(what) => Err(VdevError::Injected {
                path: self.name().to_string(),
                what,
            }),
            None => Ok(()),
        }
    }

    /// Writes `buf` at `offset` of the data area whatever the leaf's state and injected
    /// faults: fault injection's way of corrupting what is on the device.
    pub fn scribble(&self, buf: &[u8], offset: u64) -> Result<(), VdevError> {
        self.dev().write_at(buf, RESERVE_BYTES + offset)
    }

    /// Flushes the device (unless an injected fault makes it vanish).
    pub fn flush(&self) -> Result<(), VdevError> {
        self.injected(IoKind::Other)?;
        self.dev().flush()
    }

    /// Offline or faulted: out of service, no I/O reaches it.
    pub fn is_offline(&self) -> bool {
        self.offline.load(Ordering::Acquire) || self.is_faulted() || self.is_missing()
    }

    /// Taken offline by the administrator (as opposed to faulted).
    pub fn is_admin_offline(&self) -> bool {
        self.offline.load(Ordering::Acquire)
    }

    pub fn is_faulted(&self) -> bool {
        self.faulted.load(Ordering::Acquire)
    }

    pub fn set_faulted(&self, faulted: bool) {
        for s in &self.streak {
            s.store(0, Ordering::Relaxed);
        }
        if !faulted && self.is_faulted() {
            self.rejoin();
        }
        self.faulted.store(faulted, Ordering::Release);
    }

    /// `write`: 0 for a read, 1 for a write.
    fn note_success(&self, write: usize) {
        if self.streak[write].load(Ordering::Relaxed) != 0 {
            self.streak[write].store(0, Ordering::Relaxed);
        }
        if write == 1 && self.no_room.load(Ordering::Relaxed) {
            self.no_room.store(false, Ordering::Release);
        }
    }

    /// Its writes fail for lack of room while its siblings take them (`no_room`).
    pub fn is_out_of_room(&self) -> bool {
        self.no_room.load(Ordering::Acquire)
    }

    pub fn set_offline(&self, offline: bool) {
        if !offline && self.is_admin_offline() {
            self.rejoin();
        }
        self.offline.store(offline, Ordering::Release);
    }

    /// Back in service (online, cleared, replaced): all it owes is owed anew, as far as a
    /// resilver already running is concerned, since that one skipped the leaf while it was
    /// out. (Recorded before the leaf takes I/O again: a resilver that ends meanwhile must
    /// not clear the debt.)
    fn rejoin(&self) {
        let missed = self.missed.lock().clone();
        let mut since = self.owed_since_scan.lock();
        for r in missed.0 {
            since.add_range(r);
        }
    }

    /// A resilver starts from the beginning: what the leaf owes from now on is what it
    /// must keep at that resilver's end.
    pub fn scan_started(&self) {
        self.owed_since_scan.lock().0.clear();
    }

    /// A resilver of `done` ended having rebuilt this leaf, which was in service throughout:
    /// it owes `done` no more, except the txgs it came to owe while that resilver ran.
    pub fn resilvered(&self, done: &TxgRanges) {
        let mut missed = self.missed.lock();
        missed.remove(done);
        for &r in &self.owed_since_scan.lock().0 {
            missed.add_range(r);
        }
    }

    /// Whether the leaf came to owe txgs, or came back into service, since the running
    /// resilver started: resuming that resilver where it was would leave it short.
    pub fn owes_since_scan(&self) -> bool {
        !self.owed_since_scan.lock().is_empty()
    }

    fn offline_error(&self) -> VdevError {
        let what = if self.is_faulted() {
            "faulted"
        } else {
            "offline"
        };
        VdevError::Offline {
            path: format!("{} ({what})", self.name()),
        }
    }

    /// Records that this leaf missed a block of txg `birth` which its vdev took without it:
    /// it owes that txg (to a resilver), and a txg's commit sees it (`LabelUpdate`).
    /// Nothing for a write of no txg.
    pub fn owes(&self, birth: Option<u64>) {
        if let Some(txg) = birth {
            self.missed.lock().add(txg);
            self.owed_since_scan.lock().add(txg);
        }
    }

    /// A repair write to this leaf (of a block born in txg `birth`, where known) failed: the
    /// leaf still lacks the block, so it owes that txg, unless it is out of service (a
    /// leaf taken out owes what it misses already, and it did not miss older blocks).
    pub fn repair_failed(&self, e: &VdevError, birth: Option<u64>) {
        if !matches!(e, VdevError::Offline { .. }) {
            self.owes(birth);
        }
    }

    /// Counts a failed I/O against this leaf, unless it failed only because the leaf is
    /// offline (that is no fault of the device). A write that found no room is counted but
    /// does not bring the leaf nearer a fault: it marks the leaf out of room (`no_room`).
    /// Returns whether the leaf has now failed `FAULT_AFTER` I/Os in a row.
    pub fn count_failure(&self, e: &VdevError, counter: &AtomicU64) -> bool {
        if matches!(e, VdevError::Offline { .. }) {
            return false;
        }
        counter.fetch_add(1, Ordering::Relaxed);
        if e.out_of_space() {
            self.no_room.store(true, Ordering::Release);
            return false;
        }
        let write = usize::from(!std::ptr::eq(counter, &self.counters.read_errors));
        self.streak[write].fetch_add(1, Ordering::Relaxed) + 1 >= FAULT_AFTER
    }

    /// The place of a device the config names but import did not find: it holds the slot
    /// (out of service) until the device comes back or is replaced.
    pub fn missing(path: &str, len_bytes: u64, guid: u64) -> Leaf {
        let leaf = Leaf::new(
            Arc::new(super::device::MissingDevice::new(path, len_bytes)),
            guid,
        );
        leaf.missing.store(true, Ordering::Release);
        leaf
    }

    pub fn is_missing(&self) -> bool {
        self.missing.load(Ordering::Acquire)
    }

    pub fn dev(&self) -> Arc<dyn BlockDevice> {
        self.dev.read().clone()
    }

    pub fn guid(&self) -> u64 {
        self.guid.load(Ordering::Acquire)
    }

    pub fn name(&self) -> String {
        self.dev.read().name().to_string()
    }

    /// Puts a new device in this leaf's place (`zeta pool replace`): a fresh GUID, no
    /// errors, in service, owing `missed` to a resilver.
    pub fn swap(&self, dev: Arc<dyn BlockDevice>, guid: u64, missed: TxgRanges) {
        *self.dev.write() = dev;
        self.guid.store(guid, Ordering::Release);
        self.counters.set([0; 4]);
        *self.missed.lock() = missed;
        self.rejoin();
        *self.inject.lock() = Injection::default();
        self.offline.store(false, Ordering::Release);
        self.set_faulted(false);
        self.missing.store(false, Ordering::Release);
    }

    /// Allocatable bytes on this leaf, or None if it cannot even hold its labels.
    pub fn usable_bytes(&self) -> Option<u64> {
        usable_bytes(self.dev().len_bytes())
    }

    /// A data I/O at `offset` of the data area, unless the leaf is out of service or an
    /// injected fault fails it; a success ends the leaf's run of failures of that kind.
    fn data_io(
        &self,
        kind: IoKind,
        offset: u64,
        io: impl FnOnce(&dyn BlockDevice, u64) -> Result<(), VdevError>,
    ) -> Result<(), VdevError> {
        if self.is_offline() {
            return Err(self.offline_error());
        }
        self.injected(kind)?;
        io(&*self.dev(), RESERVE_BYTES + offset)?;
        self.note_success(usize::from(kind == IoKind::Write));
        Ok(())
    }

    pub fn read_data(&self, buf: &mut [u8], offset: u64) -> Result<(), VdevError> {
        self.data_io(IoKind::Read, offset, |d, at| d.read_at(buf, at))
    }

    /// `read_data` if the device can serve it without waiting (`BlockDevice::read_at_nowait`);
    /// false if not, or if the leaf is out of service or has faults injected. Nothing is
    /// counted then: the caller reads it with `read_data`, which counts.
    pub fn read_data_nowait(&self, buf: &mut [u8], offset: u64) -> bool {
        let f = *self.inject.lock();
        if self.is_offline() || f.vanished || f.fail_reads > 0.0 {
            return false;
        }
        let read = self.dev().read_at_nowait(buf, RESERVE_BYTES + offset);
        if read {
            self.note_success(0);
        }
        read
    }

    /// `read_data_vectored` if the device can serve it all without waiting
    /// (`BlockDevice::read_vectored_at_nowait`); as `read_data_nowait` otherwise.
    pub fn read_data_vectored_nowait(&self, bufs: &mut [&mut [u8]], offset: u64) -> bool {
        let f = *self.inject.lock();
        if self.is_offline() || f.vanished || f.fail_reads > 0.0 {
            return false;
        }
        let read = self
            .dev()
            .read_vectored_at_nowait(bufs, RESERVE_BYTES + offset);
        if read {
            self.note_success(0);
        }
        read
    }

    pub fn write_data(&self, buf: &[u8], offset: u64) -> Result<(), VdevError> {
        self.counters.note_write(buf.len() as u64);
        self.data_io(IoKind::Write, offset, |d, at| d.write_at(buf, at))
    }

    /// `write_data` that returns once the write survives a crash (`BlockDevice::write_durable`).
    pub fn write_data_durable(&self, buf: &[u8], offset: u64) -> Result<(), VdevError> {
        self.counters.note_write(buf.len() as u64);
        self.data_io(IoKind::Write, offset, |d, at| d.write_durable(buf, at))
    }

    /// `read_data` of a run of buffers that lie one after another on the device.
    pub fn read_data_vectored(&self, bufs: &mut [&mut [u8]], offset: u64) -> Result<(), VdevError> {
        self.data_io(IoKind::Read, offset, |d, at| d.read_vectored_at(bufs, at))
    }

    /// `write_data` of a run of buffers that lie one after another on the device.
    pub fn write_data_vectored(&self, bufs: &[&[u8]], offset: u64) -> Result<(), VdevError> {
        self.counters
            .note_write(bufs.iter().map(|b| b.len() as u64).sum());
        self.data_io(IoKind::Write, offset, |d, at| d.write_vectored_at(bufs, at))
    }

    pub fn read_label(
        &self,
        index: usize,
        offset_in_label: u64,
        buf: &mut [u8],
    ) -> Result<(), VdevError> {
        assert!(offset_in_label + buf.len() as u64 <= LABEL_SIZE);
        self.injected(IoKind::Other)?;
        let dev = self.dev();
        dev.read_at(buf, label_offset(index, dev.len_bytes()) + offset_in_label)
    }

    pub fn write_label(
        &self,
        index: usize,
        offset_in_label: u64,
        buf: &[u8],
    ) -> Result<(), VdevError> {
        assert!(offset_in_label + buf.len() as u64 <= LABEL_SIZE);
        self.injected(IoKind::Other)?;
        let dev = self.dev();
        dev.write_at(buf, label_offset(index, dev.len_bytes()) + offset_in_label)
    }

    fn count(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a copy on this leaf that read back wrong, a checksum error, unless the leaf
    /// missed the txg the block was born in (`birth`, where the caller knows it): that copy
    /// was never written, and a resilver rewriting it has found no fault of the device.
    pub(super) fn count_mismatch(&self, birth: Option<u64>) -> bool {
        if birth.is_some_and(|b| self.missed.lock().contains(b)) {
            return false;
        }
        self.count(&self.counters.cksum_errors);
        true
    }

    /// Counts a failed write or flush that the caller tolerated (a label update that went on
    /// without this leaf), as `TopVdev::write` counts a failed mirror child.
    pub fn count_write_error(&self) {
        self.count(&self.counters.write_errors);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopKind {
    Stripe,
    Mirror,
    Raidz,
}

/// How a stripe or mirror read goes through its children.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MirrorRead {
    /// Until one copy verifies, of a block born in the given txg where the caller knows it.
    FirstGood { birth: Option<u64> },
    /// Every copy, checked (a scrub), of a block born in the given txg.
    EveryCopy { birth: u64 },
    /// Until one verifies, counting only failed reads and rewriting nothing: the copies that
    /// failed are returned (`Unsettled`) for the caller to settle if it learns that the
    /// block was written whole (`TopVdev::read_speculative`).
    Speculative,
}

/// What a verified read had to do to return good data.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadReport {
    pub io_errors: u32,
    pub cksum_errors: u32,
    pub repaired_bytes: u64,
}

/// The copies a speculative read (`TopVdev::read_speculative`) found wrong beside the block
/// it returned, and left as they were: mirror children, or raidz columns, that failed to
/// read or held other bytes. Whether that is a device's fault only the caller can tell (a
/// block whose write a crash cut short left some copies or columns unwritten, and no device
/// is to blame); once it knows the block was written whole, `TopVdev::settle` counts and
/// rewrites them as an ordinary read would have.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unsettled {
    /// Children (by position), or columns (by index in the block's stripe), that read
    /// without error but held other bytes than the block.
    pub mismatched: Vec<usize>,
    /// Those whose read failed: counted as read errors already, since a failed read is the
    /// device's fault whatever the block; only their rewrite waits.
    pub unread: Vec<usize>,
}

impl Unsettled {
    pub fn is_empty(&self) -> bool {
        self.mismatched.is_empty() && self.unread.is_empty()
    }
}

pub struct TopVdev {
    pub id: u32,
    pub guid: u64,
    pub kind: TopKind,
    /// The leaves present, in config order (a raidz also knows which positions are missing).
    pub children: Vec<Arc<Leaf>>,
    /// Allocatable bytes: the smallest child's usable area, rounded down to a sector (for a
    /// raidz, that times the number of children).
    pub asize_bytes: u64,
    pub raidz: Option<Raidz>,
    rotor: AtomicUsize,
}

impl TopVdev {
    /// Builds a top-level vdev; the caller has checked that every child can hold its labels.
    pub fn new(id: u32, guid: u64, kind: TopKind, children: Vec<Arc<Leaf>>) -> TopVdev {
        assert!(!children.is_empty());
        assert!(kind == TopKind::Mirror || children.len() == 1);
        let asize = children
            .iter()
            .filter(|c| !c.is_missing())
            .map(|c| c.usable_bytes().expect("leaf too small for its labels"))
            .min()
            // Every leaf missing (a log device imported without it): no space at all.
            .unwrap_or(0);
        TopVdev {
            id,
            guid,
            kind,
            children,
            asize_bytes: asize / SECTOR * SECTOR,
            raidz: None,
            rotor: AtomicUsize::new(0),
        }
    }

    /// Builds a raidz vdev from its children by position, None where a device is missing.
    /// Errors if the code cannot serve this many children.
    pub fn new_raidz(
        id: u32,
        guid: u64,
        config: RaidzConfig,
        slots: Vec<Option<Arc<Leaf>>>,
    ) -> Result<TopVdev, String> {
        let children: Vec<Arc<Leaf>> = slots.iter().flatten().cloned().collect();
        let per_child = children
            .iter()
            .filter(|c| !c.is_missing())
            .map(|c| c.usable_bytes().expect("leaf too small for its labels"))
            .min()
            .ok_or("a raidz vdev with no devices present")?;
        let width = slots.len() as u64;
        Ok(TopVdev {
            id,
            guid,
            kind: TopKind::Raidz,
            children,
            asize_bytes: per_child / SECTOR * SECTOR * width,
            raidz: Some(Raidz::new(config, slots)?),
            rotor: AtomicUsize::new(0),
        })
    }

    /// Counts a failed I/O against a child and faults it after a run of failures, if the
    /// mirror keeps another child in service.
    fn fail(&self, child: &Leaf, e: &VdevError, counter: &AtomicU64) {
        if child.count_failure(e, counter) {
            maybe_fault(child, self.children.iter().map(Some), self.redundancy());
        }
    }

    /// The data-area offsets of the sectors that leaf `guid` holds of a block of `psize`
    /// bytes at `offset` of this vdev: all of them on a mirror child, its column on a raidz,
    /// none if the leaf is not a child here.
    pub fn sectors_on_leaf(&self, guid: u64, offset: u64, psize: u64) -> Vec<u64> {
        let sectors = |start: u64, len: u64| (0..len / SECTOR).map(move |k| start + k * SECTOR);
        match &self.raidz {
            Some(rz) => {
                let Some(slot) = rz
                    .slots
                    .iter()
                    .position(|s| s.as_ref().is_some_and(|l| l.guid() == guid))
                else {
                    return Vec::new();
                };
                rz.geom
                    .map(offset, psize)
                    .cols
                    .iter()
                    .filter(|c| c.child == slot)
                    .flat_map(|c| sectors(c.offset, c.len as u64))
                    .collect()
            }
            None if self.children.iter().any(|l| l.guid() == guid) => {
                sectors(offset, psize).collect()
            }
            None => Vec::new(),
        }
    }

    /// Part of a pool imported read-only (`Leaf::is_read_only`): nothing rewrites it.
    pub fn is_read_only(&self) -> bool {
        self.children.iter().any(|l| l.is_read_only())
    }

    /// How many children this vdev can have out of service and still serve every block:
    /// its parity for a raidz, all but one for a mirror, none for a stripe.
    pub fn redundancy(&self) -> usize {
        match (&self.raidz, self.kind) {
            (Some(rz), _) => rz.nparity(),
            (None, TopKind::Mirror) => self.children.len() - 1,
            _ => 0,
        }
    }

    /// Bytes a block of `psize` bytes takes on this vdev (parity included).
    pub fn asize_of(&self, psize: u64) -> u64 {
        match &self.raidz {
            Some(rz) => rz.geom.asize(psize),
            None => psize,
        }
    }

    /// Writes to every child in parallel. A mirror write succeeds if at least one child took
    /// it (the others count a write error); a stripe write fails with its leaf.
    ///
    /// Not a txg's block (a repair, a test): a child that misses it owes no txg. A txg's
    /// blocks go through `write_run`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), VdevError> {
        debug_assert!(offset + self.asize_of(data.len() as u64) <= self.asize_bytes);
        self.write_run(offset, &[data], None)
    }

    /// `write`, returning once the block survives a crash on every child that took it, with
    /// no flush of anything else written to them: an intent log block's commit. A child
    /// that misses a txg's block (`birth`) owes that txg (`Leaf::missed`).
    pub fn write_durable(
        &self,
        offset: u64,
        data: &[u8],
        birth: Option<u64>,
    ) -> Result<(), VdevError> {
        debug_assert!(offset + self.asize_of(data.len() as u64) <= self.asize_bytes);
        if let Some(rz) = &self.raidz {
            return rz.write_durable(offset, data, birth);
        }
        let results = waiting_in_parallel(&self.children, |c| c.write_data_durable(data, offset));
        self.settle_write(results, birth)
    }

    /// `write_run`, returning once the run survives a crash, with no flush of anything else
    /// written to the children (`write_durable`): blocks a sync request needs now. On a
    /// stripe or mirror the run is gathered into one sector-aligned buffer and written as one
    /// durable request per child. A raidz gives each block rows of its own, so each block is
    /// a durable write of its own there.
    pub fn write_run_durable(
        &self,
        offset: u64,
        bufs: &[&[u8]],
        birth: Option<u64>,
    ) -> Result<(), VdevError> {
        if let Some(rz) = &self.raidz {
            let mut at = offset;
            for b in bufs {
                rz.write_durable(at, b, birth)?;
                at += self.asize_of(b.len() as u64);
            }
            return Ok(());
        }
        let total = bufs.iter().map(|b| b.len()).sum();
        let mut run = super::SectorVec::with_capacity(total);
        for b in bufs {
            run.extend_from_slice(b);
        }
        self.write_durable(offset, &run, birth)
    }

    /// Writes a run of blocks that lie one after another from `offset`, as one request per
    /// child, with `write`'s rules for a failed child; on a raidz, one request per stretch of
    /// adjacent columns on a child (`Raidz::write_run`). Blocks of txg `birth`: a child that
    /// misses them while the vdev takes the run owes that txg (`Leaf::missed`).
    pub fn write_run(
        &self,
        offset: u64,
        bufs: &[&[u8]],
        birth: Option<u64>,
    ) -> Result<(), VdevError> {
        if let Some(rz) = &self.raidz {
            return rz.write_run(offset, bufs, birth);
        }
        // Buffered: copies into page caches, cheaper in turn on this thread than handed to
        // the pool (see `Raidz::write_run`).
        let results = self
            .children
            .iter()
            .map(|c| c.write_data_vectored(bufs, offset))
            .collect();
        self.settle_write(results, birth)
    }

    /// Reads a run of blocks that lie one after another from `offset` from one child in
    /// service (rotating among a mirror's), unverified: the caller checks each block and
    /// takes any that fail through `read_verified_from` with the child returned here, so the
    /// bad copy is counted and repaired. An error is returned as is, not counted: those
    /// reads are retried block by block, which counts.
    ///
    /// A raidz reads the run's data columns (`Raidz::read_run`); the child returned is then
    /// 0, which its `read_verified_from` does not use.
    pub fn read_run(&self, offset: u64, bufs: &mut [&mut [u8]]) -> Result<usize, VdevError> {
        if let Some(rz) = &self.raidz {
            return rz.read_run(offset, bufs).map(|()| 0);
        }
        let Some(i) = self.read_order().find(|&i| !self.children[i].is_offline()) else {
            return Err(VdevError::AllCopiesFailed(
                "every device is out of service".into(),
            ));
        };
        self.children[i].read_data_vectored(bufs, offset)?;
        Ok(i)
    }

    /// Reads `buf.len()` bytes at `offset` from one child in service (rotating among a
    /// mirror's; a raidz's data columns: `Raidz::read_nowait`) if its device can serve them
    /// without waiting (`Leaf::read_data_nowait`); false if not. Unverified, and nothing is
    /// counted against a child that declines: the caller verifies, and reads the waiting way
    /// what this does not serve.
    pub fn read_nowait(&self, offset: u64, buf: &mut [u8]) -> bool {
        if let Some(rz) = &self.raidz {
            return rz.read_nowait(offset, buf);
        }
        self.read_order()
            .any(|i| self.children[i].read_data_nowait(buf, offset))
    }

    /// The children's indexes in the order a read tries them: a mirror's from the next one
    /// in turn, so reads spread over its copies.
    fn read_order(&self) -> impl Iterator<Item = usize> {
        let n = self.children.len();
        let start = if n > 1 {
            self.rotor.fetch_add(1, Ordering::Relaxed) % n
        } else {
            0
        };
        (0..n).map(move |k| (start + k) % n)
    }

    /// A write's outcome from its children's: it succeeds if one took it; each child that
    /// failed is charged, and owes txg `birth` if the write succeeded without it.
    fn settle_write(
        &self,
        results: Vec<Result<(), VdevError>>,
        birth: Option<u64>,
    ) -> Result<(), VdevError> {
        let mut first_err = None;
        let mut ok = 0;
        // Every child out of room is the file system's state, not a fault of any device: no
        // child is charged with it. The caller has the error; a txg waiting for room writes
        // the same blocks again every second, and charging each try would count errors on
        // every child and mark each NOSPACE, and once room is made and the write taken,
        // drop them all from the txg's labels as leaves that missed a write (`LabelUpdate`).
        let all_full = results
            .iter()
            .all(|r| r.as_ref().is_err_and(VdevError::out_of_space));
        let mut missed = Vec::new();
        for (child, r) in self.children.iter().zip(results) {
            match r {
                Ok(()) => ok += 1,
                Err(e) => {
                    if !all_full {
                        self.fail(child, &e, &child.counters.write_errors);
                    }
                    missed.push(child);
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) if ok == 0 => Err(e),
            _ => {
                for child in missed {
                    child.owes(birth);
                }
                Ok(())
            }
        }
    }

    /// A scrub's read of a block born in txg `birth`: every copy (every mirror child, every
    /// raidz column including parity) is read and checked, not only the first good one; bad
    /// ones are rewritten from a good one and counted, except on leaves that missed `birth`.
    pub fn scrub(
        &self,
        offset: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        birth: u64,
    ) -> Result<ReadReport, VdevError> {
        match &self.raidz {
            Some(rz) => rz.scrub(offset, buf, verify, birth),
            None => {
                let how = MirrorRead::EveryCopy { birth };
                Ok(self.mirror_read(offset, buf, verify, how, None)?.0)
            }
        }
    }

    /// Reads `buf.len()` bytes at `offset`, accepting the first copy `verify` approves. Copies
    /// that failed to read or to verify are rewritten from the good one (self-healing) and
    /// counted against their leaf.
    pub fn read_verified(
        &self,
        offset: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<ReadReport, VdevError> {
        self.read_verified_from(offset, buf, verify, None, None)
    }

    /// `read_verified` of a block born in txg `birth` if known (a copy on a leaf that missed
    /// that txg was never written: rewritten, but no checksum error), on a stripe or mirror
    /// starting with child `first` if given: the retry of a block that `read_run` read from
    /// `first` and that did not verify, so that this copy is the one counted and rewritten.
    pub fn read_verified_from(
        &self,
        offset: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        birth: Option<u64>,
        first: Option<usize>,
    ) -> Result<ReadReport, VdevError> {
        match &self.raidz {
            Some(rz) => rz.read_verified(offset, buf, verify, birth),
            None => {
                let how = MirrorRead::FirstGood { birth };
                Ok(self.mirror_read(offset, buf, verify, how, first)?.0)
            }
        }
    }

    /// A speculative read (OpenZFS's `ZIO_FLAG_SPECULATIVE`): one that may well find no
    /// block, or a block whose write a crash cut short, and where neither is a device's
    /// fault (the intent log's reads at import: the end of a chain, its last blocks, which
    /// may be torn, some mirror copies or raidz columns written and others not, and blocks
    /// its records say were written in place). As `read_verified`, this
    /// returns the first copy (or reconstruction) `verify` approves, and counts failed
    /// reads against their leaves; but copies that held other bytes count no checksum error
    /// and nothing is rewritten. Those copies, and the ones whose read failed, are returned
    /// instead: a caller that learns the block was written whole hands them to `settle`.
    pub fn read_speculative(
        &self,
        offset: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Unsettled, VdevError> {
        match &self.raidz {
            Some(rz) => rz.read_speculative(offset, buf, verify),
            None => Ok(self
                .mirror_read(offset, buf, verify, MirrorRead::Speculative, None)?
                .1),
        }
    }

    /// Settles what `read_speculative` of the block `good` at `offset` left (`unsettled`),
    /// once the caller knows the block was written whole, so that copies not holding it are
    /// their devices' fault: each that read but held other bytes counts a checksum error,
    /// and every one is rewritten from `good`, as `read_verified` would have done.
    pub fn settle(&self, offset: u64, good: &[u8], unsettled: &Unsettled) -> ReadReport {
        match &self.raidz {
            Some(rz) => rz.settle(offset, good, unsettled),
            None => self.mend_children(offset, good, unsettled, None),
        }
    }

    /// The read of a stripe or mirror: children in turn, from a rotating start, until one
    /// verifies (or, for a scrub, through all of them); then the children that failed or held
    /// the wrong bytes are rewritten from the good copy, unless the read is speculative: then
    /// they are returned, untouched. `first` fixes the starting child.
    fn mirror_read(
        &self,
        offset: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        how: MirrorRead,
        first: Option<usize>,
    ) -> Result<(ReadReport, Unsettled), VdevError> {
        let n = self.children.len();
        let (every_copy, birth) = match how {
            MirrorRead::EveryCopy { birth } => (true, Some(birth)),
            MirrorRead::FirstGood { birth } => (false, birth),
            MirrorRead::Speculative => (false, None),
        };
        let start = match first {
            Some(f) => f % n,
            None if n > 1 && !every_copy => self.rotor.fetch_add(1, Ordering::Relaxed) % n,
            None => 0,
        };
        let mut report = ReadReport::default();
        let mut wrong = Unsettled::default();
        let mut failures: Vec<String> = Vec::new();
        let mut good = false;
        // Once `buf` holds the good copy, a scrub reads the other copies here.
        let mut scratch: Vec<u8> = Vec::new();
        for k in 0..n {
            if good && !every_copy {
                break;
            }
            let i = (start + k) % n;
            let child = &self.children[i];
            let dst: &mut [u8] = if good {
                scratch.resize(buf.len(), 0);
                &mut scratch
            } else {
                buf
            };
            match child.read_data(dst, offset) {
                Err(e) => {
                    self.fail(child, &e, &child.counters.read_errors);
                    report.io_errors += 1;
                    failures.push(e.to_string());
                    wrong.unread.push(i);
                }
                Ok(()) if verify(dst) => good = true,
                Ok(()) => {
                    wrong.mismatched.push(i);
                    failures.push(format!("{}: checksum mismatch", child.name()));
                }
            }
        }
        if how == MirrorRead::Speculative {
            if !good {
                return Err(VdevError::AllCopiesFailed(failures.join("; ")));
            }
            return Ok((report, wrong));
        }
        if !good {
            // No copy holds the block the tree points at: every one is wrong.
            for &i in &wrong.mismatched {
                self.children[i].count_mismatch(birth);
            }
            return Err(VdevError::AllCopiesFailed(failures.join("; ")));
        }
        let mended = self.mend_children(offset, buf, &wrong, birth);
        report.cksum_errors += mended.cksum_errors;
        report.repaired_bytes += mended.repaired_bytes;
        Ok((report, Unsettled::default()))
    }

    /// After a read found the block `good` at `offset`: counts a checksum error on each
    /// child that held other bytes (unless it missed `birth`, see `Leaf::count_mismatch`)
    /// and rewrites those and the children whose read failed.
    fn mend_children(
        &self,
        offset: u64,
        good: &[u8],
        wrong: &Unsettled,
        birth: Option<u64>,
    ) -> ReadReport {
        let mut report = ReadReport::default();
        for &i in &wrong.mismatched {
            if self.children[i].count_mismatch(birth) {
                report.cksum_errors += 1;
            }
        }
        for &b in wrong.mismatched.iter().chain(&wrong.unread) {
            let victim = &self.children[b];
            if victim.is_read_only() {
                continue;
            }
            if let Err(e) = victim.write_data(good, offset) {
                self.fail(victim, &e, &victim.counters.write_errors);
                victim.repair_failed(&e, birth);
            } else {
                victim
                    .counters
                    .repaired_bytes
                    .fetch_add(good.len() as u64, Ordering::Relaxed);
                report.repaired_bytes += good.len() as u64;
            }
        }
        report
    }
}

/// Runs `io` on each of a few items at once and returns the results in order: the first on
/// this thread, each other on a scoped thread of its own. For I/Os that each wait for a
/// device, such as the durable writes of a log block's copies or columns: a thread started
/// for the purpose begins sooner than a sleeping rayon worker wakes (a queue-depth-1 client
/// writing and flushing on a raidz2 of six files: 2.5k commits a second through rayon,
/// 2.9-3.3k this way; one after another on this thread, 2.3k).
pub(crate) fn waiting_in_parallel<T: Sync, R: Send>(
    items: &[T],
    io: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let Some((first, rest)) = items.split_first() else {
        return Vec::new();
    };
    let io = &io;
    std::thread::scope(|scope| {
        let others: Vec<_> = rest
            .iter()
            .map(|item| scope.spawn(move || io(item)))
            .collect();
        std::iter::once(io(first))
            .chain(others.into_iter().map(|h| match h.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            }))
            .collect()
    })
}

/// A mirror of `n` 8 MiB in-memory leaves (guids 1..=n), for unit tests in this crate.
#[cfg(test)]
pub(crate) fn mem_mirror(n: usize, guid: u64) -> (TopVdev, Vec<Arc<super::mem::MemDevice>>) {
    let devs: Vec<Arc<super::mem::MemDevice>> = (0..n)
        .map(|i| Arc::new(super::mem::MemDevice::new(&format!("m{i}"), 8 << 20)))
        .collect();
    let leaves = devs
        .iter()
        .enumerate()
        .map(|(i, d)| Arc::new(Leaf::new(d.clone() as Arc<dyn BlockDevice>, i as u64 + 1)))
        .collect();
    (TopVdev::new(0, guid, TopKind::Mirror, leaves), devs)
}

#[cfg(test)]
mod tests {
    use super::super::mem::{Faults, MemDevice};
    use super::*;

    /// Two leaves of a vdev that can lose one reach their fault threshold at the same moment
    /// (a controller reset, parallel column reads): one is faulted at most. Deciding without
    /// a lock, each saw the other in service and both went, and the vdev failed every I/O
    /// until an administrator cleared them.
    #[test]
    fn two_leaves_failing_at_once_are_not_both_faulted_beyond_redundancy() {
        use std::sync::Barrier;
        let leaves: Vec<Arc<Leaf>> = (0..3)
            .map(|i| {
                let dev = Arc::new(MemDevice::new(&format!("m{i}"), 1 << 20));
                Arc::new(Leaf::new(dev as Arc<dyn BlockDevice>, 1 + i as u64))
            })
            .collect();
        const ROUNDS: usize = 20_000;
        let start = Barrier::new(2);
        let end = Barrier::new(2);
        let both = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for me in 0..2 {
                let (leaves, start, end, both) = (&leaves, &start, &end, &both);
                s.spawn(move || {
                    for _ in 0..ROUNDS {
                        start.wait();
                        maybe_fault(&leaves[me], leaves.iter().map(Some), 1);
                        end.wait();
                        if me == 0 {
                            if leaves[0].is_faulted() && leaves[1].is_faulted() {
                                both.fetch_add(1, Ordering::Relaxed);
                            }
                            leaves[0].set_faulted(false);
                            leaves[1].set_faulted(false);
                        }
                        end.wait();
                    }
                });
            }
        });
        assert_eq!(both.load(Ordering::Relaxed), 0, "rounds of {ROUNDS}");
    }

    #[test]
    fn waiting_in_parallel_runs_every_item_at_once_and_keeps_their_order() {
        use std::sync::atomic::AtomicUsize;
        use std::time::{Duration, Instant};
        // Each item waits (up to a deadline, so a serial run fails rather than hangs) until
        // all have started: only a run of all at once sees every one arrive.
        let started = AtomicUsize::new(0);
        let items = [10, 20, 30, 40];
        let out = waiting_in_parallel(&items, |&x| {
            started.fetch_add(1, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(5);
            while started.load(Ordering::SeqCst) < items.len() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            (x, started.load(Ordering::SeqCst) == items.len())
        });
        assert_eq!(out, [(10, true), (20, true), (30, true), (40, true)]);
        assert!(waiting_in_parallel(&[] as &[u8], |_| ()).is_empty());
    }

    fn mirror(n: usize) -> (TopVdev, Vec<Arc<MemDevice>>) {
        mem_mirror(n, 99)
    }

    #[test]
    fn mirror_heals_a_corrupt_copy_from_a_good_one() {
        let (top, devs) = mirror(2);
        let good = vec![0xabu8; 8192];
        top.write(4096, &good).unwrap();
        devs[1].corrupt(RESERVE_BYTES + 4096 + 100, &[0u8; 10]);
        let verify = |b: &[u8]| b == &good[..];
        // Read until the rotor has started at the bad child at least once.
        let mut healed = 0;
        for _ in 0..2 {
            let mut buf = vec![0u8; 8192];
            let r = top.read_verified(4096, &mut buf, &verify).unwrap();
            assert_eq!(buf, good);
            healed += r.repaired_bytes;
        }
        assert_eq!(healed, 8192);
        assert_eq!(
            top.children[1]
                .counters
                .cksum_errors
                .load(Ordering::Relaxed),
            1
        );
        let mut raw = vec![0u8; 8192];
        devs[1].read_at(&mut raw, RESERVE_BYTES + 4096).unwrap();
        assert_eq!(raw, good);
    }

    /// What each leaf counted: (read, write, checksum errors, repaired bytes).
    fn counted(top: &TopVdev) -> Vec<[u64; 4]> {
        top.children.iter().map(|c| c.counters.snapshot()).collect()
    }

    #[test]
    fn a_speculative_read_counts_and_rewrites_nothing_until_settled() {
        let (top, devs) = mirror(2);
        let good = vec![0xcdu8; 8192];
        top.write(4096, &good).unwrap();
        // The second copy never landed, or holds garbage.
        devs[1].corrupt(RESERVE_BYTES + 4096, &[0x11; 8192]);
        let verify = |b: &[u8]| b == &good[..];
        let mut wrong = Vec::new();
        // Whichever child the rotor starts at: the good copy is returned, nothing counted.
        for _ in 0..2 {
            let mut buf = vec![0u8; 8192];
            let u = top.read_speculative(4096, &mut buf, &verify).unwrap();
            assert_eq!(buf, good);
            assert!(u.unread.is_empty());
            wrong.push(u);
        }
        assert_eq!(counted(&top), vec![[0; 4]; 2]);
        let mut raw = vec![0u8; 8192];
        devs[1].read_at(&mut raw, RESERVE_BYTES + 4096).unwrap();
        assert_eq!(raw, vec![0x11; 8192], "rewritten by a speculative read");
        // No copy at all: an error, and still nothing counted.
        let mut buf = vec![0u8; 8192];
        assert!(top.read_speculative(4096, &mut buf, &|_| false).is_err());
        assert_eq!(counted(&top), vec![[0; 4]; 2]);
        // Settled (the block was written whole after all): counted and rewritten once.
        let u = wrong
            .into_iter()
            .find(|u| !u.is_empty())
            .expect("one read tried child 1");
        assert_eq!(u.mismatched, vec![1]);
        let r = top.settle(4096, &good, &u);
        assert_eq!((r.cksum_errors, r.repaired_bytes), (1, 8192));
        assert_eq!(counted(&top), vec![[0; 4], [0, 0, 1, 8192]]);
        devs[1].read_at(&mut raw, RESERVE_BYTES + 4096).unwrap();
        assert_eq!(raw, good);
    }

    #[test]
    fn a_speculative_raidz_read_rebuilds_a_torn_block_and_counts_nothing_until_settled() {
        use super::super::raidz::RaidzConfig;
        let devs: Vec<Arc<MemDevice>> = (0..6)
            .map(|i| Arc::new(MemDevice::new(&format!("r{i}"), 8 << 20)))
            .collect();
        let slots = devs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Some(Arc::new(Leaf::new(
                    d.clone() as Arc<dyn BlockDevice>,
                    i as u64,
                )))
            })
            .collect();
        let config = RaidzConfig::new(2, 6, false).unwrap();
        let top = TopVdev::new_raidz(0, 9, config, slots).unwrap();
        // Four data columns and two of parity, one sector each, on the six children.
        let good: Vec<u8> = (0..4 * SECTOR as usize).map(|i| (i % 251) as u8).collect();
        top.write_durable(0, &good, None).unwrap();
        // Two columns never landed: data column 0 (child 2) and parity column 1 (child 1).
        let map = top.raidz.as_ref().unwrap().geom.map(0, good.len() as u64);
        let torn = [map.cols[2], map.cols[1]];
        for c in &torn {
            devs[c.child].corrupt(RESERVE_BYTES + c.offset, &[0u8; SECTOR as usize]);
        }
        let verify = |b: &[u8]| b == &good[..];
        let mut buf = vec![0u8; good.len()];
        let u = top.read_speculative(0, &mut buf, &verify).unwrap();
        assert_eq!(buf, good, "rebuilt from the other columns");
        let mut mismatched = u.mismatched.clone();
        mismatched.sort_unstable();
        assert_eq!(mismatched, vec![1, 2]);
        assert_eq!(counted(&top), vec![[0; 4]; 6]);
        let column = |c: &super::super::raidz::Column| {
            let mut b = vec![0u8; c.len];
            devs[c.child]
                .read_at(&mut b, RESERVE_BYTES + c.offset)
                .unwrap();
            b
        };
        assert!(torn.iter().all(|c| column(c) == vec![0u8; SECTOR as usize]));
        // Settled: each of the two leaves counts one and gets its column back.
        top.settle(0, &good, &u);
        for (i, c) in counted(&top).into_iter().enumerate() {
            let hit = torn.iter().any(|t| t.child == i);
            let want = if hit { [0, 0, 1, SECTOR] } else { [0; 4] };
            assert_eq!(c, want, "child {i}");
        }
        let mut again = vec![0u8; good.len()];
        assert!(top
            .read_speculative(0, &mut again, &verify)
            .unwrap()
            .is_empty());
        assert_eq!(column(&torn[0]), good[..SECTOR as usize]);
        assert_ne!(column(&torn[1]), vec![0u8; SECTOR as usize]);
    }

    #[test]
    fn mirror_survives_one_failed_leaf_and_reports_when_all_fail() {
        let (top, devs) = mirror(2);
        devs[0].set_faults(Faults {
            fail_writes: true,
            ..Faults::default()
        });
        top.write(0, &[1u8; 4096]).unwrap();
        assert_eq!(
            top.children[0]
                .counters
                .write_errors
                .load(Ordering::Relaxed),
            1
        );
        devs[0].set_faults(Faults {
            fail_reads: true,
            ..Faults::default()
        });
        let mut buf = vec![0u8; 4096];
        top.read_verified(0, &mut buf, &|b| b[0] == 1).unwrap();
        assert!(matches!(
            top.read_verified(0, &mut buf, &|_| false),
            Err(VdevError::AllCopiesFailed(_))
        ));
    }

    /// A mirror whose every child is out of room (a full file system) charges no child with
    /// it, however often the write is tried again: the pool waits for room and resumes
    /// whole. One child out of room while the other takes the write is counted and marked
    /// out of room, but never faulted for it; its first write that succeeds ends the mark.
    #[test]
    fn out_of_room_children_are_never_faulted_for_it() {
        let (top, devs) = mirror(2);
        let full = Faults {
            full: true,
            ..Faults::default()
        };
        for d in &devs {
            d.set_faults(full.clone());
        }
        for _ in 0..2 * FAULT_AFTER {
            let e = top.write(0, &[1u8; 4096]).expect_err("no room anywhere");
            assert!(e.out_of_space(), "{e}");
        }
        for c in &top.children {
            assert!(!c.is_faulted());
            assert_eq!(c.counters.write_errors.load(Ordering::Relaxed), 0);
        }
        devs[1].set_faults(Faults::default());
        for _ in 0..2 * FAULT_AFTER {
            top.write(0, &[1u8; 4096]).unwrap();
        }
        let c = &top.children;
        assert!(!c[0].is_faulted() && c[0].is_out_of_room());
        assert!(!c[1].is_out_of_room());
        assert_eq!(
            c[0].counters.write_errors.load(Ordering::Relaxed),
            2 * FAULT_AFTER as u64
        );
        // Any other failure still counts towards a fault.
        devs[0].set_faults(Faults {
            fail_writes: true,
            ..Faults::default()
        });
        for _ in 0..FAULT_AFTER {
            top.write(0, &[1u8; 4096]).unwrap();
        }
        assert!(c[0].is_faulted());
        // Room made: the first write that lands ends the mark.
        devs[0].set_faults(Faults::default());
        c[0].set_faulted(false);
        top.write(0, &[1u8; 4096]).unwrap();
        assert!(!c[0].is_out_of_room());
    }
}
