//! Top-level vdevs: a `stripe` of one leaf, a `mirror` of several, or a `raidz` (see
//! `vdev::raidz`). Offsets given to a top-level vdev count from the start of its allocatable
//! area; the leaf adds its label reserve.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::device::VdevError;
use super::io::{waiting_in_parallel, ReadReport, Unsettled};
use super::layout::SECTOR;
use super::leaf::{maybe_fault, Leaf};
use super::raidz::{Raidz, RaidzConfig, ShapeError};

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

pub struct TopVdev {
    pub id: u32,
    pub guid: u64,
    /// The leaves present, in config order (a raidz also knows which positions are missing).
    pub children: Vec<Arc<Leaf>>,
    /// Allocatable bytes: the smallest child's usable area, rounded down to a sector (for a
    /// raidz, that times the number of children).
    pub asize_bytes: u64,
    /// Stripe, mirror, or raidz with its geometry: one value, so kind and geometry cannot
    /// disagree.
    pub layout: Layout,
    rotor: AtomicUsize,
}

/// The shape of a top-level vdev.
pub enum Layout {
    Stripe,
    Mirror,
    Raidz(Raidz),
}

impl TopVdev {
    pub fn kind(&self) -> TopKind {
        match self.layout {
            Layout::Stripe => TopKind::Stripe,
            Layout::Mirror => TopKind::Mirror,
            Layout::Raidz(_) => TopKind::Raidz,
        }
    }

    /// The raidz geometry, for a raidz vdev.
    pub fn raidz(&self) -> Option<&Raidz> {
        match &self.layout {
            Layout::Raidz(rz) => Some(rz),
            _ => None,
        }
    }

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
        let layout = match kind {
            TopKind::Stripe => Layout::Stripe,
            TopKind::Mirror => Layout::Mirror,
            TopKind::Raidz => panic!("a raidz vdev is built by TopVdev::new_raidz"),
        };
        TopVdev {
            id,
            guid,
            layout,
            children,
            asize_bytes: asize / SECTOR * SECTOR,
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
    ) -> Result<TopVdev, ShapeError> {
        let children: Vec<Arc<Leaf>> = slots.iter().flatten().cloned().collect();
        let per_child = children
            .iter()
            .filter(|c| !c.is_missing())
            .map(|c| c.usable_bytes().expect("leaf too small for its labels"))
            .min()
            .ok_or(ShapeError::NoDevices)?;
        let width = slots.len() as u64;
        Ok(TopVdev {
            id,
            guid,
            layout: Layout::Raidz(Raidz::new(config, slots)?),
            children,
            asize_bytes: per_child / SECTOR * SECTOR * width,
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
        match self.raidz() {
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
        match (self.raidz(), self.kind()) {
            (Some(rz), _) => rz.nparity(),
            (None, TopKind::Mirror) => self.children.len() - 1,
            _ => 0,
        }
    }

    /// Bytes a block of `psize` bytes takes on this vdev (parity included).
    pub fn asize_of(&self, psize: u64) -> u64 {
        match self.raidz() {
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
        if let Some(rz) = self.raidz() {
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
        if let Some(rz) = self.raidz() {
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
        if let Some(rz) = self.raidz() {
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
        if let Some(rz) = self.raidz() {
            return rz.read_run(offset, bufs).map(|()| 0);
        }
        let Some(i) = self.read_order().find(|&i| !self.children[i].is_offline()) else {
            return Err(VdevError::NoneInService);
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
        if let Some(rz) = self.raidz() {
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
        match self.raidz() {
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
        match self.raidz() {
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
        match self.raidz() {
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
        match self.raidz() {
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
                return Err(VdevError::AllCopiesFailed { failures });
            }
            return Ok((report, wrong));
        }
        if !good {
            // No copy holds the block the tree points at: every one is wrong.
            for &i in &wrong.mismatched {
                self.children[i].count_mismatch(birth);
            }
            return Err(VdevError::AllCopiesFailed { failures });
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

/// A mirror of `n` 8 MiB in-memory leaves (guids 1..=n), for unit tests in this crate.
#[cfg(test)]
pub(crate) fn mem_mirror(n: usize, guid: u64) -> (TopVdev, Vec<Arc<super::mem::MemDevice>>) {
    let devs: Vec<Arc<super::mem::MemDevice>> = (0..n)
        .map(|i| Arc::new(super::mem::MemDevice::new(&format!("m{i}"), 8 << 20)))
        .collect();
    let leaves = devs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            Arc::new(Leaf::new(
                d.clone() as Arc<dyn super::BlockDevice>,
                i as u64 + 1,
            ))
        })
        .collect();
    (TopVdev::new(0, guid, TopKind::Mirror, leaves), devs)
}

#[cfg(test)]
mod tests {
    use super::super::layout::RESERVE_BYTES;
    use super::super::leaf::FAULT_AFTER;
    use super::super::mem::{Faults, MemDevice};
    use super::super::BlockDevice;
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
        let map = top.raidz().unwrap().geom.map(0, good.len() as u64);
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
            Err(VdevError::AllCopiesFailed { .. })
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
