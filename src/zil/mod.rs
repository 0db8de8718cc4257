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

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use serde::Serialize;

pub use crate::spa::props::{CommitPolicy, Placement};
use crate::vdev::TopVdev;
pub use block::{BlockAddr, Payload, Record};
pub use log::{Done, Log, LogError, ZilHeader};
use space::LogSpace;

/// What the log needs from the pool's txg machinery.
pub trait TxgHooks: Send + Sync {
    /// Commits everything written so far as a txg (the fallback when a log write fails or
    /// log space runs out).
    fn sync_now(&self) -> Result<(), String>;
    /// Asks for an early txg without waiting (log space is filling up).
    fn request_sync(&self);
}

/// Counters since the pool was opened.
#[derive(Default)]
struct Stats {
    blocks: Vec<AtomicU64>,
    bytes: Vec<AtomicU64>,
    records: AtomicU64,
    batches: AtomicU64,
    flushes: AtomicU64,
    batch_nanos: AtomicU64,
    fallback_syncs: AtomicU64,
}

/// A snapshot of the log counters (`zeta pool iostat`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ZilStats {
    /// Log blocks and bytes written per top-level vdev, by vdev id.
    pub blocks: Vec<u64>,
    pub bytes: Vec<u64>,
    pub records: u64,
    pub batches: u64,
    /// Device flushes issued by log commits.
    pub flushes: u64,
    pub batch_nanos: u64,
    /// Commits that fell back to a txg sync (log space full, a log write failed, or a
    /// volume whose log header was not yet on disk).
    pub fallback_syncs: u64,
    pub space_used: u64,
    pub space_total: u64,
}

/// The pool-wide part of the log: log space, the shared rotor, policies and counters.
pub struct Zil {
    pub(crate) tops: Vec<Arc<TopVdev>>,
    pub(crate) space: LogSpace,
    vdevs: Vec<u32>,
    rotor: AtomicUsize,
    pub commit: CommitPolicy,
    pub placement: Placement,
    stats: Stats,
    hooks: OnceLock<Box<dyn TxgHooks>>,
}

impl Zil {
    /// `regions[v]`: top-level vdev v's log region (start, length), if it has one.
    pub fn new(
        tops: Vec<Arc<TopVdev>>,
        regions: &[Option<(u64, u64)>],
        commit: CommitPolicy,
        placement: Placement,
    ) -> Zil {
        let space = LogSpace::new(regions);
        let n = tops.len();
        Zil {
            vdevs: space.vdevs(),
            space,
            tops,
            rotor: AtomicUsize::new(0),
            commit,
            placement,
            stats: Stats {
                blocks: (0..n).map(|_| AtomicU64::new(0)).collect(),
                bytes: (0..n).map(|_| AtomicU64::new(0)).collect(),
                ..Stats::default()
            },
            hooks: OnceLock::new(),
        }
    }

    pub fn set_hooks(&self, hooks: Box<dyn TxgHooks>) {
        let _ = self.hooks.set(hooks);
    }

    /// Whether this pool has any log space (pools made before the log existed have none:
    /// their sync requests commit a txg).
    pub fn enabled(&self) -> bool {
        !self.vdevs.is_empty()
    }

    fn sync_now(&self) -> Result<(), String> {
        self.stats.fallback_syncs.fetch_add(1, Ordering::Relaxed);
        match self.hooks.get() {
            Some(h) => h.sync_now(),
            None => Err("the pool is not ready for log commits".into()),
        }
    }

    /// Space for a block of `psize` bytes on the device the rotor points at (or the next
    /// ones, if it is full). `local` is the volume's own rotor, used under `per-volume`.
    fn alloc_slot(&self, local: &mut usize, psize: u32) -> Option<BlockAddr> {
        let n = self.vdevs.len();
        if n == 0 {
            return None;
        }
        let first = match self.placement {
            Placement::Global => self.rotor.fetch_add(1, Ordering::Relaxed),
            Placement::PerVolume => {
                *local = local.wrapping_add(1);
                *local - 1
            }
        };
        for k in 0..n {
            let v = self.vdevs[(first + k) % n];
            let asize = self.tops[v as usize].asize_of(psize as u64);
            if let Some(offset) = self.space.alloc(v, asize) {
                self.note_pressure();
                return Some(BlockAddr {
                    vdev: v,
                    len: psize,
                    offset,
                });
            }
        }
        None
    }

    pub(crate) fn free_slot(&self, a: BlockAddr) {
        if !a.is_none() {
            let asize = self.tops[a.vdev as usize].asize_of(a.len as u64);
            self.space.free(a.vdev, a.offset, asize);
        }
    }

    pub(crate) fn claim_slot(&self, a: BlockAddr) -> Result<(), String> {
        let top = self
            .tops
            .get(a.vdev as usize)
            .ok_or_else(|| format!("log block on unknown vdev {}", a.vdev))?;
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

    pub fn stats(&self) -> ZilStats {
        let (space_used, space_total) = self.space.usage();
        let load = |v: &[AtomicU64]| v.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        ZilStats {
            blocks: load(&self.stats.blocks),
            bytes: load(&self.stats.bytes),
            records: self.stats.records.load(Ordering::Relaxed),
            batches: self.stats.batches.load(Ordering::Relaxed),
            flushes: self.stats.flushes.load(Ordering::Relaxed),
            batch_nanos: self.stats.batch_nanos.load(Ordering::Relaxed),
            fallback_syncs: self.stats.fallback_syncs.load(Ordering::Relaxed),
            space_used,
            space_total,
        }
    }

    /// Writes encoded log blocks (in parallel when there are several), then flushes every
    /// vdev they touched, once each.
    fn write_blocks(&self, blocks: &[(BlockAddr, Vec<u8>)], records: u64) -> Result<(), String> {
        every(blocks, |(a, bytes)| {
            self.tops[a.vdev as usize]
                .write(a.offset, bytes)
                .map_err(|e| format!("log block write to vdev {}: {e}", a.vdev))
        })?;
        let mut touched: Vec<u32> = blocks.iter().map(|(a, _)| a.vdev).collect();
        touched.sort_unstable();
        touched.dedup();
        every(&touched, |&v| self.flush_vdev(v))?;
        for (a, bytes) in blocks {
            self.stats.blocks[a.vdev as usize].fetch_add(1, Ordering::Relaxed);
            self.stats.bytes[a.vdev as usize].fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
        self.stats.records.fetch_add(records, Ordering::Relaxed);
        self.stats
            .flushes
            .fetch_add(touched.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Flushes every leaf of a vdev; it counts as flushed if no more leaves failed than
    /// the vdev can lose.
    fn flush_vdev(&self, v: u32) -> Result<(), String> {
        let top = &self.tops[v as usize];
        let mut failed = Vec::new();
        for leaf in &top.children {
            if leaf.is_offline() {
                failed.push(format!("{}: out of service", leaf.name()));
            } else if let Err(e) = leaf.flush() {
                failed.push(format!("{}: {e}", leaf.name()));
            }
        }
        if failed.len() > top.redundancy() {
            return Err(format!("log flush of vdev {v}: {}", failed.join("; ")));
        }
        Ok(())
    }

    fn note_batch(&self, nanos: u64) {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.batch_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// Runs `f` on every item, on threads of their own when there are several (log blocks go to
/// different devices, whose writes and flushes should overlap); the first error wins.
fn every<T: Sync>(items: &[T], f: impl Fn(&T) -> Result<(), String> + Sync) -> Result<(), String> {
    if let [one] = items {
        return f(one);
    }
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = items.iter().map(|i| s.spawn(move || f(i))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("log I/O thread panicked"))
            .collect::<Result<Vec<()>, String>>()
    })?;
    Ok(())
}
