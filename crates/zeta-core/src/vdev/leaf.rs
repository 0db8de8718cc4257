//! A leaf: one device of a vdev, with its label reserve, error counters, injected faults and
//! service state (online, offline, faulted, missing), and the txgs it missed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::device::{BlockDevice, VdevError};
use super::layout::{label_offset, usable_bytes, LABEL_SIZE, RESERVE_BYTES};

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
