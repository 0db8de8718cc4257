//! The allocator: each top-level vdev's space is cut into metaslabs of 2^ms_shift bytes, each
//! with an in-memory free-range tree; allocations and frees of a txg become space-map records
//! that the sync appends to the metaslab's space map.
//!
//! Two classes of blocks are allocated. *Recorded* blocks (everything outside the meta object
//! set) are logged in space maps. *MOS* blocks (the meta object set, including the space maps
//! themselves) are not: import finds them by walking the MOS and claims them, which breaks the
//! recursion of space maps describing their own blocks. Frees are deferred: space freed in txg N
//! becomes allocatable only after txg N+2 has synced, so the two previous uberblocks' trees
//! stay intact on disk.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::bp::{Dva, Dvas};
use super::frag;
use super::range_tree::{Histogram, RangeSet, RangeTree};
use super::space_map::SmRecord;
use crate::vdev::SECTOR;

/// Metaslabs per top-level vdev the sizing aims for.
pub const TARGET_METASLABS: u64 = 200;
pub const MIN_MS_SHIFT: u32 = 20;

/// Chooses the metaslab size for a vdev of `asize` bytes.
pub fn ms_shift_for(asize: u64) -> u32 {
    let target = (asize / TARGET_METASLABS).max(1 << MIN_MS_SHIFT);
    64 - (target - 1).leading_zeros()
}

/// Bytes at the end of a vdev of `asize` bytes (metaslabs of 2^shift) to keep for the intent
/// log, in whole metaslabs: an eighth of it, at most 1 GiB; the data keeps at least seven
/// eighths of the metaslabs.
///
/// The log holds what the syncing txg and the open one will commit, so this bounds how much
/// sync-written data can wait for a txg; a commit that finds it full waits for a txg to free
/// some. Under steady sync writes the txg sync runs back to back and each txg takes about as
/// long to sync as it took to fill, so the reserve must hold two txgs' log, and a txg may
/// take up to the dirty limit (1G when this was sized). A thirty-second of a small vdev did
/// not, nor did a floor of 256M on mid-size vdevs: commits waited for txgs, and flushes with
/// them.
///
/// `zeta serve`'s dirty limit is now a tenth of memory, up to 4G: at 2.4G, three ~870M
/// reserves (then at least 768M a vdev) filled every txg under sustained 4K sync writes into
/// 16K blocks, and writers waited on the log before the dirty limit, flushes with them. At
/// 1G each no commit waited and the flush tail was much shorter; writes then wait at the
/// dirty limit instead, a little longer each. A short flush tail was worth that: a database
/// waits on its flushes, not on each write.
///
/// At 1G it is again close to full there. The payload arena tried for that path
/// (`zeta_server::memory::tune_allocator`) waited for log space where the build without it
/// did not, and its flush tail was longer. So a change there has to be checked for these
/// waits too (`space_waits` in `zeta pool iostat --json`); writes faster at this point need
/// txgs that sync faster, or a larger reserve. Figures: docs/perf/allocator.md, "Why the log
/// reserve is an eighth of a vdev, at most 1G".
///
/// The reserve is an on-disk choice made at create, so it does not grow with a process's
/// limit; a log device holds more (figures: docs/perf/intent-log.md, "The log reserves and
/// log devices").
pub fn log_reserve_for(asize: u64, shift: u32) -> u64 {
    let ms_size = 1u64 << shift;
    let count = asize / ms_size;
    let want = (asize / 8).min(1 << 30).div_ceil(ms_size).max(1);
    if count < 8 {
        return 0;
    }
    let keep = want.min(count / 8);
    asize - (count - keep) * ms_size
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocClass {
    Recorded,
    Mos,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllocError {
    #[error("out of space: no room for {0} bytes")]
    NoSpace(u64),
    #[error("space map of vdev {vdev} metaslab {ms} is inconsistent: {what}")]
    Corrupt { vdev: u32, ms: usize, what: String },
    /// A free of space that is not a live allocation of its class: only a block pointer no
    /// writer made (a damaged or crafted pool) asks for one. The free is not made; the space,
    /// if any of it was in use, stays taken (a leak, not a corrupt free-space map).
    #[error("refused to free {len} bytes at vdev {vdev} offset {offset}: {why}")]
    BadFree {
        vdev: u32,
        offset: u64,
        len: u64,
        why: &'static str,
    },
}

pub struct Metaslab {
    pub start: u64,
    pub size: u64,
    pub free: RangeTree,
    /// Live MOS blocks in this metaslab (not in the space map).
    pub mos: RangeSet,
    /// Records of the syncing txg, not yet appended to the space map.
    pub pending: Vec<SmRecord>,
    /// Records in the persisted space map (for the condense decision).
    pub sm_records: u64,
    /// Deferred frees in this metaslab (also in `Allocator::deferred`, by txg): the condense
    /// decision and image need them per metaslab, coalesced.
    deferred: RangeSet,
    cursor: u64,
}

impl Metaslab {
    fn new(start: u64, size: u64) -> Metaslab {
        let mut free = RangeTree::new();
        free.add(start, size);
        Metaslab {
            start,
            size,
            free,
            mos: RangeSet::new(),
            pending: Vec::new(),
            sm_records: 0,
            deferred: RangeSet::new(),
            cursor: start,
        }
    }
}

pub struct TopSpace {
    pub vdev: u32,
    pub ms_shift: u32,
    pub metaslabs: Vec<Metaslab>,
    active: usize,
    /// No metaslab had a segment to start a run in when last asked: until space returns
    /// (`Allocator::txg_synced`, `unalloc`), blocks fill holes without asking again.
    runs_exhausted: bool,
    /// Likewise, no metaslab had a free segment of this size class (`alloc_on`'s snug
    /// holes).
    snug_exhausted: Option<usize>,
}

impl TopSpace {
    /// Takes space with `take` from the preferred metaslab (the active one, or for copy
    /// `hint` of `of` one that fraction of the vdev away, so that ditto copies on one vdev
    /// land far apart), else from the one with the largest free segment, the lowest on
    /// ties, which then becomes the active one (for a first copy).
    ///
    /// `take` is the allocator's policy (a run, or best fit); either takes from a metaslab
    /// only what its largest segment holds, so if the largest cannot, none can, and no
    /// ranking of the rest is needed (sorting them all cost the sync thread time on a nearly
    /// full pool, where the preferred one misses often; figures: docs/perf/allocator.md, "Why
    /// the allocator does not rank every metaslab on a miss").
    fn take_somewhere(
        &mut self,
        hint: usize,
        of: usize,
        take: &mut dyn FnMut(&mut Metaslab) -> Option<u64>,
    ) -> Option<u64> {
        let count = self.metaslabs.len();
        let preferred = if hint == 0 {
            self.active
        } else {
            (self.active + hint * count / of) % count
        };
        if let Some(off) = take(&mut self.metaslabs[preferred]) {
            return Some(off);
        }
        let best = (0..count)
            .filter(|&i| i != preferred)
            .max_by_key(|&i| (self.metaslabs[i].free.largest(), std::cmp::Reverse(i)))?;
        let off = take(&mut self.metaslabs[best])?;
        if hint == 0 {
            self.active = best;
        }
        Some(off)
    }

    /// Where the space this allocator manages on the vdev ends: no block lies past it (the
    /// intent log's reserve, if any, follows).
    pub fn data_end(&self) -> u64 {
        self.metaslabs.last().map_or(0, |m| m.start + m.size)
    }
}

/// Space of the whole pool, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Space {
    pub size: u64,
    pub alloc: u64,
    pub free: u64,
    /// Freed but not yet reusable (deferred frees).
    pub freeing: u64,
}

/// One metaslab in `Allocator::map`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MetaslabInfo {
    pub index: usize,
    pub start: u64,
    pub size: u64,
    /// Allocatable bytes (not counting deferred frees).
    pub free: u64,
    /// Freed, allocatable after two more txgs.
    pub freeing: u64,
    pub largest: u64,
    /// Free segments.
    pub segments: u64,
    /// Percent, see `spa::frag`.
    pub fragmentation: u8,
}

/// One top-level vdev in `Allocator::map`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VdevMap {
    pub vdev: u32,
    pub size: u64,
    pub free: u64,
    pub fragmentation: u8,
    pub metaslabs: Vec<MetaslabInfo>,
}

/// Free segments of `from` to 2×`from`-1 bytes across the pool.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HistogramRow {
    pub from: u64,
    pub segments: u64,
    pub bytes: u64,
}

/// The free space of every metaslab of every data vdev, and its fragmentation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolMap {
    pub size: u64,
    pub free: u64,
    pub fragmentation: u8,
    pub histogram: Vec<HistogramRow>,
    pub vdevs: Vec<VdevMap>,
}

struct Deferred {
    txg: u64,
    extents: Vec<(u32, u64, u64)>,
}

pub struct Allocator {
    pub tops: Vec<TopSpace>,
    deferred: VecDeque<Deferred>,
    /// The tree txg of each scan chunk's hold on frees (`hold_frees`).
    frees_held: Vec<u64>,
    rotor: usize,
    rotor_bytes: u64,
    /// The space counters, shared with readers that do not take this allocator's lock.
    gauge: Arc<SpaceGauge>,
}

/// The pool's space counters, kept as they change: the sizes of all metaslabs, the bytes in
/// their free trees, and the bytes in `deferred` (`space_recounted` checks them). Summing a
/// txg's worth of freed extents each time cost more than the write it was asked for.
///
/// They are atomics so that they can be read without the allocator's lock. Every write to a
/// volume checks the free space (`Pool::reserve_space`), and the txg sync holds the lock for
/// as long as it allocates a txg's blocks: under random 4K writes with a large dirty limit,
/// writers queued behind it by the thousand (figures: docs/perf/allocator.md, "Why writers
/// read the space counters without the allocator's lock"). Only the lock's holder changes
/// them; a reader without the lock may see `free` and `freeing` from a moment apart, a gauge
/// rather than an account.
#[derive(Debug)]
pub struct SpaceGauge {
    size: u64,
    free: AtomicU64,
    freeing: AtomicU64,
    /// Every byte ever allocated: what a reader of `free` cannot tell apart from frees
    /// returning meanwhile (`Pool::fits_meta` bounds what allocations cut up with it).
    taken_total: AtomicU64,
}

impl SpaceGauge {
    pub fn read(&self) -> Space {
        let free = self.free.load(Ordering::Relaxed);
        let freeing = self.freeing.load(Ordering::Relaxed);
        Space {
            size: self.size,
            free,
            freeing,
            alloc: self.size.saturating_sub(free + freeing),
        }
    }

    fn freed(&self, len: u64) {
        self.free.fetch_add(len, Ordering::Relaxed);
    }

    fn taken(&self, len: u64) {
        self.free.fetch_sub(len, Ordering::Relaxed);
        self.taken_total.fetch_add(len, Ordering::Relaxed);
    }

    /// Bytes allocated since the pool was opened (`taken_total`).
    pub fn taken_total(&self) -> u64 {
        self.taken_total.load(Ordering::Relaxed)
    }
}

/// The smallest free segment a run of blocks starts in (`RangeTree::take_run`): smaller
/// ones are holes, filled by best fit once no metaslab of the vdev has a segment this large.
pub const RUN_MIN: u64 = 1 << 20;

/// Bytes allocated on one vdev before the rotor moves to the next.
const ROTOR_STRIDE: u64 = 1 << 20;

impl Allocator {
    /// A pool whose vdevs are wholly free. `tops` is (vdev id, asize, ms_shift), ids dense from 0.
    pub fn new(tops: &[(u32, u64, u32)]) -> Allocator {
        let tops = tops
            .iter()
            .enumerate()
            .map(|(i, &(vdev, asize, shift))| {
                assert_eq!(vdev as usize, i);
                let ms_size = 1u64 << shift;
                let count = asize.div_ceil(ms_size);
                let metaslabs = (0..count)
                    .map(|m| {
                        let start = m * ms_size;
                        Metaslab::new(start, ms_size.min(asize - start) / SECTOR * SECTOR)
                    })
                    .filter(|m| m.size > 0)
                    .collect();
                TopSpace {
                    vdev,
                    ms_shift: shift,
                    metaslabs,
                    active: 0,
                    runs_exhausted: false,
                    snug_exhausted: None,
                }
            })
            .collect::<Vec<TopSpace>>();
        let size = tops.iter().flat_map(|t| &t.metaslabs).map(|m| m.size).sum();
        Allocator {
            tops,
            deferred: VecDeque::new(),
            frees_held: Vec::new(),
            rotor: 0,
            rotor_bytes: 0,
            gauge: Arc::new(SpaceGauge {
                size,
                free: AtomicU64::new(size),
                freeing: AtomicU64::new(0),
                taken_total: AtomicU64::new(0),
            }),
        }
    }

    /// The space counters, for readers that do not take this allocator's lock.
    pub fn gauge(&self) -> Arc<SpaceGauge> {
        self.gauge.clone()
    }

    /// Exact: the holder of this allocator is the only one that changes the counters.
    pub fn space(&self) -> Space {
        self.gauge.read()
    }

    /// `space`, counted afresh from every metaslab (`Pool::verify` compares the two).
    pub fn space_recounted(&self) -> Space {
        let mut s = Space::default();
        for top in &self.tops {
            for ms in &top.metaslabs {
                s.size += ms.size;
                s.free += ms.free.space();
            }
        }
        s.freeing = self.gauge.freeing.load(Ordering::Relaxed);
        s.alloc = s.size - s.free - s.freeing;
        s
    }

    /// The free space of top-level vdev `v` that blocks taking `piece` bytes there can use:
    /// each free segment counts in whole pieces. Near a full pool this, not `space().free`,
    /// says what still fits, for a block needs its bytes in one segment (there are no gang
    /// blocks) and the rest is slivers between blocks.
    pub fn free_in_pieces(&self, v: usize, piece: u64) -> u64 {
        assert!(piece > 0);
        self.tops[v]
            .metaslabs
            .iter()
            .map(|ms| ms.free.space_in_pieces(piece))
            .sum()
    }

    /// Every metaslab's free space and fragmentation (`zeta pool map`, `pool list`'s FRAG),
    /// from the histograms the free trees keep.
    pub fn map(&self) -> PoolMap {
        self.map_with(|ms| *ms.free.histogram())
    }

    /// `map`, with every histogram counted afresh from its tree's segments (tests and
    /// `Pool::verify` compare the two).
    pub fn map_recounted(&self) -> PoolMap {
        self.map_with(|ms| Histogram::of(ms.free.iter()))
    }

    fn map_with(&self, hist: impl Fn(&Metaslab) -> Histogram) -> PoolMap {
        let mut pool_hist = Histogram::default();
        let mut pool_w = (0u128, 0u64);
        let vdevs = self
            .tops
            .iter()
            .map(|top| {
                let mut vdev_hist = Histogram::default();
                let mut vdev_w = (0u128, 0u64);
                let metaslabs = top
                    .metaslabs
                    .iter()
                    .enumerate()
                    .map(|(index, ms)| {
                        let h = hist(ms);
                        vdev_hist.merge(&h);
                        let (w, f) = frag::weighted_in(&h, ms.size);
                        vdev_w = (vdev_w.0 + w, vdev_w.1 + f);
                        MetaslabInfo {
                            index,
                            start: ms.start,
                            size: ms.size,
                            free: ms.free.space(),
                            freeing: ms.deferred.space(),
                            largest: ms.free.largest(),
                            segments: ms.free.segments() as u64,
                            fragmentation: frag::mean(w, f),
                        }
                    })
                    .collect::<Vec<_>>();
                pool_hist.merge(&vdev_hist);
                pool_w = (pool_w.0 + vdev_w.0, pool_w.1 + vdev_w.1);
                VdevMap {
                    vdev: top.vdev,
                    size: metaslabs.iter().map(|m| m.size).sum(),
                    free: metaslabs.iter().map(|m| m.free).sum(),
                    fragmentation: frag::mean(vdev_w.0, vdev_w.1),
                    metaslabs,
                }
            })
            .collect::<Vec<_>>();
        PoolMap {
            size: vdevs.iter().map(|v| v.size).sum(),
            free: vdevs.iter().map(|v| v.free).sum(),
            fragmentation: frag::mean(pool_w.0, pool_w.1),
            histogram: (0..64)
                .filter(|&b| pool_hist.count[b] > 0)
                .map(|b| HistogramRow {
                    from: 1 << b,
                    segments: pool_hist.count[b],
                    bytes: pool_hist.bytes[b],
                })
                .collect(),
            vdevs,
        }
    }

    /// Free bytes that blocks of `block` bytes can take from holes too small for a block of
    /// `below` bytes: the segments of the size classes from `block`'s up to `below`'s,
    /// each counted as its class's lower bound (at least one such block fits in it).
    pub fn snug_room(&self, block: u64, below: u64) -> u64 {
        let (lo, hi) = (Histogram::bucket(block), Histogram::bucket(below));
        if lo >= hi {
            return 0;
        }
        let mut room = 0;
        for ms in self.tops.iter().flat_map(|t| &t.metaslabs) {
            let h = ms.free.histogram();
            room += (lo..hi).map(|b| h.count[b] << b).sum::<u64>();
        }
        room
    }

    /// How many metaslabs the pool has: each may have its space map rewritten in a txg.
    pub fn metaslab_count(&self) -> usize {
        self.tops.iter().map(|t| t.metaslabs.len()).sum()
    }

    fn ms_index(&self, vdev: u32, offset: u64) -> usize {
        (offset >> self.tops[vdev as usize].ms_shift) as usize
    }

    /// Allocates `copies` copies of `asize` bytes, on distinct top-level vdevs where the pool
    /// has them, else spread apart on the same one. For pools whose vdevs all store a block
    /// in its own size (no raidz); see `alloc_sized`.
    pub fn alloc(
        &mut self,
        asize: u64,
        copies: usize,
        class: AllocClass,
    ) -> Result<Dvas, AllocError> {
        self.alloc_sized(asize, copies, class, &|_, psize| psize)
    }

    /// Allocates `copies` copies of a block of `psize` bytes; `asize_of(vdev, psize)` says how
    /// many bytes it takes on each vdev (a raidz adds its parity).
    pub fn alloc_sized(
        &mut self,
        psize: u64,
        copies: usize,
        class: AllocClass,
        asize_of: &dyn Fn(u32, u64) -> u64,
    ) -> Result<Dvas, AllocError> {
        assert!(psize > 0 && psize.is_multiple_of(SECTOR) && (1..=3).contains(&copies));
        let n = self.tops.len();
        let mut dvas = Dvas::default();
        let first = self.rotor;
        let mut total = 0;
        for copy in 0..copies {
            let mut placed = None;
            // Vdevs no earlier copy took come first; one that did is the last resort, and then
            // the copy keeps its distance from the others there (`alloc_on`'s hint).
            // (Two passes over the rotation, no vector: this runs for every block.)
            let taken = |v: usize| dvas.iter().any(|d| d.vdev.get() as usize == v);
            let rotation = (0..n).map(|k| (first + copy + k) % n);
            let untaken_first = rotation.clone().filter(|&v| !taken(v));
            for v in untaken_first.chain(rotation.filter(|&v| taken(v))) {
                let hint = if copies > 1 && (n == 1 || taken(v)) {
                    copy
                } else {
                    0
                };
                let asize = asize_of(v as u32, psize);
                if let Some(off) = self.alloc_on(v, asize, hint, copies) {
                    self.gauge.taken(asize);
                    total += asize;
                    placed = Some(Dva::new(v as u32, off, asize as u32));
                    break;
                }
            }
            match placed {
                Some(d) => dvas.push(d),
                None => {
                    // Roll back the copies already placed: they were never used.
                    for d in dvas.iter() {
                        self.unalloc(d);
                    }
                    return Err(AllocError::NoSpace(psize));
                }
            }
        }
        if let Some((a, b)) = overlapping_copies(&dvas) {
            panic!("copies of one block overlap: {a:?} and {b:?}");
        }
        for d in dvas.iter() {
            self.note_taken(d.vdev.get(), d.offset.get(), d.asize.get() as u64, class);
        }
        self.advance_rotor(total);
        Ok(dvas)
    }

    /// `count` blocks of `psize` bytes, one copy each, one after another in a single extent
    /// of the vdev the rotor points at, from its active metaslab, if that has room for all
    /// of them in one piece: `(vdev, offset, asize of each)`. `None`, with nothing taken, if
    /// not (the caller then places them one by one with `alloc_sized`, which may move on to
    /// another metaslab). One range-tree update for a 128K write into 16K blocks, not eight;
    /// they would land next to each other anyway.
    pub fn alloc_run(
        &mut self,
        psize: u64,
        count: usize,
        class: AllocClass,
        asize_of: &dyn Fn(u32, u64) -> u64,
    ) -> Option<(u32, u64, u64)> {
        assert!(psize > 0 && psize.is_multiple_of(SECTOR) && count > 0);
        let v = self.rotor;
        let asize = asize_of(v as u32, psize);
        let total = asize * count as u64;
        if self.near_full() {
            return None;
        }
        let top = &mut self.tops[v];
        let ms = &mut top.metaslabs[top.active];
        let off = Self::take_from(ms, total)?;
        self.gauge.taken(total);
        self.note_taken(v as u32, off, total, class);
        self.advance_rotor(total);
        Some((v as u32, off, asize))
    }

    /// Notes `len` bytes just taken at `off` on vdev `v` where `class` keeps them: a record
    /// for the space map, or the metaslab's unrecorded (MOS) allocations.
    fn note_taken(&mut self, v: u32, off: u64, len: u64, class: AllocClass) {
        let ms_i = self.ms_index(v, off);
        let ms = &mut self.tops[v as usize].metaslabs[ms_i];
        match class {
            AllocClass::Recorded => ms.pending.push(SmRecord {
                offset: off,
                len,
                free: false,
            }),
            AllocClass::Mos => ms.mos.add(off, len),
        }
    }

    /// Moves the rotor to the next vdev once `ROTOR_STRIDE` bytes have gone to this one.
    fn advance_rotor(&mut self, bytes: u64) {
        self.rotor_bytes += bytes;
        if self.rotor_bytes >= ROTOR_STRIDE {
            self.rotor_bytes = 0;
            self.rotor = (self.rotor + 1) % self.tops.len();
        }
    }

    /// Takes `asize` bytes from vdev `v`; copy `hint` of `of` starts its search that fraction of
    /// the way across the vdev, so ditto copies on one vdev land far apart.
    ///
    /// While the pool is not nearly full, blocks go in runs (`RangeTree::take_run`): on in
    /// the preferred metaslab while it has a segment of `RUN_MIN`, else in the metaslab with
    /// the largest free segment, which becomes the active one. Near full, or where no
    /// metaslab of the vdev has such a segment, blocks fill holes by best fit.
    fn alloc_on(&mut self, v: usize, asize: u64, hint: usize, of: usize) -> Option<u64> {
        let near_full = self.near_full();
        if !near_full && !self.tops[v].runs_exhausted {
            let run = self.tops[v].take_somewhere(hint, of, &mut |ms| Self::take_from(ms, asize));
            if run.is_some() {
                return run;
            }
            self.tops[v].runs_exhausted = true;
        }
        let top = &mut self.tops[v];
        // Near full, holes that fit the block snugly (its own size class) go first,
        // wherever they are: the active metaslab's if it has one, else the metaslab with the
        // most. A block cut from a larger segment may spoil room an indirect block needs
        // (`Pool::fits_meta` counts on these holes being taken first). Not for a ditto copy
        // (`hint` > 0), which must stay far from the first.
        let b = Histogram::bucket(asize);
        if near_full && hint == 0 && top.snug_exhausted != Some(b) {
            let snug = |ms: &Metaslab| ms.free.histogram().count[b];
            let at = Some(top.active)
                .filter(|&i| snug(&top.metaslabs[i]) > 0)
                .or_else(|| {
                    (0..top.metaslabs.len())
                        .filter(|&i| snug(&top.metaslabs[i]) > 0)
                        .max_by_key(|&i| snug(&top.metaslabs[i]))
                });
            match at.and_then(|i| Some((i, top.metaslabs[i].free.take_best_fit(asize)?))) {
                Some((i, off)) => {
                    top.active = i;
                    return Some(off);
                }
                // None left anywhere: until space returns, the search is not made again.
                None => top.snug_exhausted = Some(b),
            }
        }
        top.take_somewhere(hint, of, &mut |ms| ms.free.take_best_fit(asize))
    }

    /// Takes `asize` bytes from one metaslab to go on with its run or start one
    /// (`RangeTree::take_run`).
    fn take_from(ms: &mut Metaslab, asize: u64) -> Option<u64> {
        ms.free.take_run(asize, &mut ms.cursor, RUN_MIN)
    }

    /// Less than a third of the pool free, counting what the last txgs freed: blocks then
    /// take the smallest hole that holds them rather than cut into larger segments. Under
    /// random overwrites of small blocks, next fit spent a nearly full pool's last large
    /// segments on data while the frees came back as holes of the data's size, and a txg's
    /// indirect blocks found no room. The frees waiting count: a large txg of overwrites
    /// holds as much freed as it writes, and at half full that alone turned every block to
    /// best fit in holes, scattered at the device.
    fn near_full(&self) -> bool {
        let s = self.gauge.read();
        s.free + s.freeing < s.size / 3
    }

    fn unalloc(&mut self, d: &Dva) {
        let ms_i = self.ms_index(d.vdev.get(), d.offset.get());
        let top = &mut self.tops[d.vdev.get() as usize];
        top.metaslabs[ms_i]
            .free
            .add(d.offset.get(), d.asize.get() as u64);
        top.runs_exhausted = false;
        top.snug_exhausted = None;
        self.gauge.freed(d.asize.get() as u64);
    }

    /// Frees one copy in txg `txg`; the space returns after txg+2 has synced. A copy that is
    /// not a live allocation of `class` is refused, and nothing changes (`check_free`).
    pub fn free(&mut self, d: &Dva, txg: u64, class: AllocClass) -> Result<(), AllocError> {
        self.free_extent(
            d.vdev.get(),
            d.offset.get(),
            d.asize.get() as u64,
            txg,
            class,
        )
    }

    /// `free` of many copies, each run of adjacent ones as one extent (see `extents`).
    /// Returns the copies refused (`check_free`); the others are freed. A run refused whole
    /// is freed copy by copy, so one bad copy beside good ones leaks only itself.
    pub fn free_all<'a>(
        &mut self,
        dvas: impl IntoIterator<Item = &'a Dva>,
        txg: u64,
        class: AllocClass,
    ) -> Vec<AllocError> {
        let dvas: Vec<&Dva> = dvas.into_iter().collect();
        let mut refused = Vec::new();
        let mut at = 0;
        for (v, off, len, n) in self.extents(dvas.iter().copied()) {
            let run = &dvas[at..at + n];
            at += n;
            match self.free_extent(v, off, len, txg, class) {
                Ok(()) => {}
                Err(e) if n == 1 => refused.push(e),
                Err(_) => refused.extend(run.iter().filter_map(|d| self.free(d, txg, class).err())),
            }
        }
        refused
    }

    /// Whether `len` bytes at `off` of vdev `v` may be freed as a block of `class`: they
    /// must lie within one metaslab of a vdev the allocator has, and be allocated there as
    /// that class (for the MOS class, among its unrecorded allocations; for the recorded
    /// class, neither free, nor freed already and waiting, nor the MOS's). Block pointers
    /// come from disk: a crafted or damaged one may name anything, and a free of free space
    /// would put it in the free tree twice. Returns the metaslab's index.
    fn check_free(
        &self,
        v: u32,
        off: u64,
        len: u64,
        class: AllocClass,
    ) -> Result<usize, AllocError> {
        let refuse = |why| AllocError::BadFree {
            vdev: v,
            offset: off,
            len,
            why,
        };
        let top = self
            .tops
            .get(v as usize)
            .ok_or_else(|| refuse("no such data vdev"))?;
        let ms_i = (off >> top.ms_shift) as usize;
        let ms = top
            .metaslabs
            .get(ms_i)
            .ok_or_else(|| refuse("past the end of the vdev's data area"))?;
        if len == 0 || off.checked_add(len).is_none_or(|e| e > ms.start + ms.size) {
            return Err(refuse("not within one metaslab"));
        }
        if ms.free.overlaps(off, len) {
            return Err(refuse("free space"));
        }
        if ms.deferred.overlaps(off, len) {
            return Err(refuse("freed already"));
        }
        match class {
            AllocClass::Mos if !ms.mos.contains(off, len) => Err(refuse("not a MOS allocation")),
            AllocClass::Recorded if ms.mos.overlaps(off, len) => Err(refuse("a MOS allocation")),
            _ => Ok(ms_i),
        }
    }

    fn free_extent(
        &mut self,
        v: u32,
        off: u64,
        len: u64,
        txg: u64,
        class: AllocClass,
    ) -> Result<(), AllocError> {
        let ms_i = self.check_free(v, off, len, class)?;
        let ms = &mut self.tops[v as usize].metaslabs[ms_i];
        match class {
            AllocClass::Recorded => ms.pending.push(SmRecord {
                offset: off,
                len,
                free: true,
            }),
            AllocClass::Mos => ms.mos.remove(off, len),
        }
        ms.deferred.add(off, len);
        self.gauge.freeing.fetch_add(len, Ordering::Relaxed);
        match self.deferred.back_mut() {
            Some(d) if d.txg == txg => d.extents.push((v, off, len)),
            _ => self.deferred.push_back(Deferred {
                txg,
                extents: vec![(v, off, len)],
            }),
        }
        Ok(())
    }

    /// The copies `dvas` as extents `(vdev, offset, len, copies)`: each run of copies that
    /// follow one another on a vdev within one metaslab becomes one. The blocks of a write
    /// are allocated one after another, and a txg frees and adopts them in the same order:
    /// one range-tree operation and one space-map record for a 128K write, not eight (16K
    /// blocks).
    fn extents<'a>(&self, dvas: impl IntoIterator<Item = &'a Dva>) -> Vec<(u32, u64, u64, usize)> {
        let mut out: Vec<(u32, u64, u64, usize)> = Vec::new();
        for d in dvas {
            let (v, off, len) = (d.vdev.get(), d.offset.get(), d.asize.get() as u64);
            match out.last_mut() {
                Some((lv, lo, ll, n))
                    if *lv == v
                        && lo.checked_add(*ll) == Some(off)
                        && self
                            .tops
                            .get(v as usize)
                            .is_some_and(|t| *lo >> t.ms_shift == off >> t.ms_shift) =>
                {
                    *ll += len;
                    *n += 1;
                }
                _ => out.push((v, off, len, 1)),
            }
        }
        out
    }

    /// Keeps what is freed after txg `tree_txg` out of reuse until `release_frees(tree_txg)`:
    /// a scrub holds it while it works from block pointers it read from a tree of that txg
    /// or later, whose blocks must not be reallocated under it. What was freed by then no
    /// such tree points at, so it returns as ever: were a hold to keep every free, a scan
    /// working chunk after chunk beside steady overwrites would let nothing return for as
    /// long as it ran, and the pool would fill with deferred frees (a 56 MiB pool did in
    /// three seconds of a resilver).
    pub fn hold_frees(&mut self, tree_txg: u64) {
        self.frees_held.push(tree_txg);
    }

    /// Ends a hold of `hold_frees(tree_txg)`.
    pub fn release_frees(&mut self, tree_txg: u64) {
        if let Some(i) = self.frees_held.iter().position(|&t| t == tree_txg) {
            self.frees_held.swap_remove(i);
        }
    }

    /// Called once txg `txg` is committed: frees of txg-2 and older become allocatable,
    /// unless a hold keeps them (`hold_frees`).
    pub fn txg_synced(&mut self, txg: u64) {
        let held_after = self.frees_held.iter().copied().min().unwrap_or(u64::MAX);
        while self
            .deferred
            .front()
            .is_some_and(|d| d.txg + 2 <= txg && d.txg <= held_after)
        {
            let d = self.deferred.pop_front().unwrap();
            for (v, off, len) in d.extents {
                self.gauge.freeing.fetch_sub(len, Ordering::Relaxed);
                let ms_i = self.ms_index(v, off);
                let top = &mut self.tops[v as usize];
                top.runs_exhausted = false;
                top.snug_exhausted = None;
                let ms = &mut top.metaslabs[ms_i];
                ms.deferred.remove(off, len);
                ms.free.add(off, len);
                self.gauge.freed(len);
            }
        }
    }

    /// Replays persisted space-map records of one metaslab (import).
    pub fn load_records(
        &mut self,
        vdev: u32,
        ms: usize,
        records: &[SmRecord],
    ) -> Result<(), AllocError> {
        let m = &mut self.tops[vdev as usize].metaslabs[ms];
        let corrupt = |what: String| AllocError::Corrupt { vdev, ms, what };
        let before = m.free.space();
        let applied = records.iter().try_for_each(|r| {
            // Checked add: the record comes from disk, and a wrapped end passed the test.
            let end = r.offset.checked_add(r.len);
            if r.len == 0 || r.offset < m.start || end.is_none_or(|e| e > m.start + m.size) {
                return Err(corrupt(format!("record {r:?} outside the metaslab")));
            }
            let res = if r.free {
                m.free.try_add(r.offset, r.len)
            } else {
                m.free.try_remove(r.offset, r.len)
            };
            res.map_err(|_| corrupt(format!("record {r:?} contradicts earlier records")))
        });
        let after = m.free.space();
        m.sm_records = records.len() as u64;
        self.gauge.freed(after);
        self.gauge.taken(before);
        applied
    }

    /// Moves unrecorded (`AllocClass::Mos`) allocations into the space map: blocks written
    /// ahead of their txg that this txg's tree now points at. Each run of adjacent copies is
    /// one extent (see `extents`).
    pub fn record_alloc_all<'a>(&mut self, dvas: impl IntoIterator<Item = &'a Dva>) {
        for (v, off, len, _) in self.extents(dvas) {
            let ms_i = self.ms_index(v, off);
            let ms = &mut self.tops[v as usize].metaslabs[ms_i];
            ms.mos.remove(off, len);
            ms.pending.push(SmRecord {
                offset: off,
                len,
                free: false,
            });
        }
    }

    /// Claims a MOS block found by walking the MOS at import (or a block an intent-log
    /// record points at, until its replay is committed): allocated, but not in the space map.
    pub fn claim_mos(&mut self, d: &Dva) -> Result<(), AllocError> {
        let (v, off, len) = (d.vdev.get(), d.offset.get(), d.asize.get() as u64);
        let corrupt = |what: String| AllocError::Corrupt {
            vdev: v,
            ms: 0,
            what,
        };
        let top = self
            .tops
            .get(v as usize)
            .ok_or_else(|| corrupt(format!("MOS block on unknown vdev {v}")))?;
        let ms_i = (off >> top.ms_shift) as usize;
        let ms = self.tops[v as usize]
            .metaslabs
            .get_mut(ms_i)
            .ok_or_else(|| corrupt(format!("MOS block at {off} past the end of the vdev")))?;
        ms.free
            .try_remove(off, len)
            .map_err(|_| corrupt(format!("MOS block at {off}+{len} is not free")))?;
        ms.mos.add(off, len);
        self.gauge.taken(len);
        Ok(())
    }

    /// Claims every copy of a block (`claim_mos`), or none of them.
    pub fn claim_all_mos(&mut self, dvas: &[Dva]) -> Result<(), AllocError> {
        for (i, d) in dvas.iter().enumerate() {
            if let Err(e) = self.claim_mos(d) {
                for done in &dvas[..i] {
                    let (v, off, len) =
                        (done.vdev.get(), done.offset.get(), done.asize.get() as u64);
                    let ms_i = self.ms_index(v, off);
                    let ms = &mut self.tops[v as usize].metaslabs[ms_i];
                    ms.mos.remove(off, len);
                    ms.free.add(off, len);
                    self.gauge.freed(len);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Metaslabs with records waiting for the space map.
    pub fn dirty_metaslabs(&self) -> Vec<(u32, usize)> {
        let mut out = Vec::new();
        for top in &self.tops {
            for (i, ms) in top.metaslabs.iter().enumerate() {
                if !ms.pending.is_empty() {
                    out.push((top.vdev, i));
                }
            }
        }
        out
    }

    /// The records to append for this txg, or — when the space map has grown long compared with
    /// what it describes — a full replacement image (`true` in the second field).
    pub fn take_records(&mut self, vdev: u32, ms_i: usize) -> (Vec<SmRecord>, bool) {
        let ms = &mut self.tops[vdev as usize].metaslabs[ms_i];
        let appended = ms.sm_records + ms.pending.len() as u64;
        // The image has at most one allocated range per gap between holes (free space,
        // deferred frees, MOS blocks): while the space map is short even against that bound,
        // append without building the image, which cost much of a txg's sync under random
        // writes (a copy of the free tree per dirty metaslab, every txg; figures:
        // docs/perf/allocator.md, "Why a space map is appended to without building its image").
        let bound = (ms.free.segments() + ms.deferred.segments() + ms.mos.segments() + 1) as u64;
        if appended <= 4 * bound + 64 {
            ms.sm_records = appended;
            return (std::mem::take(&mut ms.pending), false);
        }
        let pending = std::mem::take(&mut ms.pending);
        let image = condensed_image(ms);
        if appended > 4 * image.len() as u64 + 64 {
            ms.sm_records = image.len() as u64;
            (image, true)
        } else {
            ms.sm_records = appended;
            (pending, false)
        }
    }
}

/// The allocated ranges the space map must describe: the metaslab minus free space, deferred
/// frees and MOS blocks.
fn condensed_image(ms: &Metaslab) -> Vec<SmRecord> {
    let mut holes = ms.free.clone();
    for (s, e) in ms.deferred.iter() {
        holes.add(s, e - s);
    }
    for (s, e) in ms.mos.iter() {
        holes.add(s, e - s);
    }
    let mut out = Vec::new();
    let mut at = ms.start;
    for (s, e) in holes.iter() {
        if s > at {
            out.push(SmRecord {
                offset: at,
                len: s - at,
                free: false,
            });
        }
        at = e;
    }
    if at < ms.start + ms.size {
        out.push(SmRecord {
            offset: at,
            len: ms.start + ms.size - at,
            free: false,
        });
    }
    out
}

/// Two copies of one block that share a byte, if any. The copies of a block must never
/// overlap: that would be one copy that looks like two, and the first damage would lose the
/// block. `alloc_sized` checks every allocation with it.
pub fn overlapping_copies(dvas: &[Dva]) -> Option<(Dva, Dva)> {
    dvas.iter().enumerate().find_map(|(i, a)| {
        dvas[i + 1..].iter().find_map(|b| {
            let (ao, bo) = (a.offset.get(), b.offset.get());
            let overlap = a.vdev.get() == b.vdev.get()
                && ao < bo + b.asize.get() as u64
                && bo < ao + a.asize.get() as u64;
            overlap.then_some((*a, *b))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    /// The post-condition of every allocation finds copies that share bytes, and only those.
    #[test]
    fn overlapping_copies_are_found() {
        let (a, b) = (Dva::new(0, 0, 8192), Dva::new(0, 4096, 8192));
        let c = Dva::new(1, 0, 8192);
        assert_eq!(overlapping_copies(&[c, a, b]), Some((a, b)));
        assert_eq!(overlapping_copies(&[b, a]), Some((b, a)));
        assert_eq!(overlapping_copies(&[a, Dva::new(0, 8192, 8192)]), None);
        assert_eq!(overlapping_copies(&[a, c]), None);
    }

    /// Where one vdev is full, both copies go to the other, kept apart; while both have
    /// room, each copy has a vdev of its own.
    #[test]
    fn ditto_copies_take_distinct_vdevs_while_they_have_room() {
        let mut a = Allocator::new(&[(0, 8 * MB, 20), (1, 8 * MB, 20)]);
        for _ in 0..50 {
            let d = a.alloc(16384, 2, AllocClass::Recorded).unwrap();
            let vdevs: Vec<u32> = d.iter().map(|c| c.vdev.get()).collect();
            assert_ne!(vdevs[0], vdevs[1]);
        }
        // Fill vdev 1: both copies go to vdev 0.
        while a.alloc_on(1, MB, 0, 1).is_some() {}
        while a.alloc_on(1, 4096, 0, 1).is_some() {}
        for _ in 0..20 {
            let d = a.alloc(16384, 2, AllocClass::Recorded).unwrap();
            assert!(d.iter().all(|c| c.vdev.get() == 0));
        }
        // Three vdevs, the first full: a first copy that falls through to the second does not
        // draw the second copy after it while the third has room.
        let mut a = Allocator::new(&[(0, 8 * MB, 20), (1, 8 * MB, 20), (2, 8 * MB, 20)]);
        while a.alloc_on(0, MB, 0, 1).is_some() {}
        while a.alloc_on(0, 4096, 0, 1).is_some() {}
        for _ in 0..60 {
            let d = a.alloc(16384, 2, AllocClass::Recorded).unwrap();
            let vdevs: Vec<u32> = d.iter().map(|c| c.vdev.get()).collect();
            assert!(vdevs[0] != vdevs[1] && !vdevs.contains(&0), "{vdevs:?}");
        }
    }

    #[test]
    fn the_log_reserve_is_whole_metaslabs_at_the_end() {
        for asize in [64u64 << 20, 256 << 20, (4 << 30) + 12345 * 512, 1 << 40] {
            let shift = ms_shift_for(asize);
            let r = log_reserve_for(asize, shift);
            let data = asize - r;
            assert!(data.is_multiple_of(1 << shift), "{asize}");
            assert!(r >= (asize / 64).min(1 << 30), "{asize}: {r}");
            // Room for two txgs' log on small vdevs too.
            assert!(
                r >= ((asize / 8).min(1 << 30)).saturating_sub(1 << shift),
                "{asize}: {r}"
            );
            assert!(r <= asize / 8 + (1 << shift), "{asize}: {r}");
            assert!(r <= (1 << 30) + (2 << shift));
        }
        // Too few metaslabs to spare one: no reserve.
        assert_eq!(log_reserve_for(6 << 20, 20), 0);
    }

    #[test]
    fn sizing_aims_for_about_200_metaslabs() {
        assert_eq!(ms_shift_for(64 * MB), 20);
        let shift = ms_shift_for(1 << 40);
        let count = (1u64 << 40) >> shift;
        assert!((100..=200).contains(&count), "{count}");
    }

    #[test]
    fn a_miss_moves_to_the_largest_free_segment_lowest_metaslab_on_ties() {
        let mut a = Allocator::new(&[(0, 8 * MB, 20)]);
        let at = |a: &mut Allocator, size: u64| {
            a.alloc(size, 1, AllocClass::Recorded)
                .map(|d| d[0].offset.get())
        };
        assert_eq!(at(&mut a, MB).unwrap(), 0, "metaslab 0, whole");
        // Metaslab 0 is full: every other one is wholly free, so the lowest of them.
        assert_eq!(at(&mut a, MB / 2).unwrap(), MB);
        // Metaslab 1, now the active one, has half its room: 768K goes to the next whole one.
        assert_eq!(at(&mut a, 3 * MB / 4).unwrap(), 2 * MB);
        // Metaslab 2 keeps 256K, 1 keeps 512K, 3 and up are whole: 384K fits in 3.
        assert_eq!(at(&mut a, 3 * MB / 8).unwrap(), 3 * MB);
        // No metaslab has a segment this long: refused, nothing taken.
        let before = a.space().alloc;
        assert!(at(&mut a, 2 * MB).is_err());
        assert_eq!(a.space().alloc, before);
    }

    #[test]
    fn adjacent_copies_are_freed_and_recorded_as_one_extent_within_a_metaslab() {
        let mut a = Allocator::new(&[(0, 8 * MB, 20), (1, 8 * MB, 20)]);
        let d = |v: u32, off: u64, len: u32| Dva::new(v, off, len);
        // Written ahead (MOS class), as a volume's streaming writes are: 16K blocks, four
        // following one another, one on the other vdev, one after a gap, and two either side
        // of the boundary between metaslabs 0 and 1.
        let k = 16 << 10;
        let blocks = [
            d(0, 0, k as u32),
            d(0, k, k as u32),
            d(0, 2 * k, k as u32),
            d(0, 3 * k, k as u32),
            d(1, 4 * k, k as u32),
            d(0, 6 * k, k as u32),
            d(0, MB - k, k as u32),
            d(0, MB, k as u32),
        ];
        a.claim_all_mos(&blocks).unwrap();
        a.record_alloc_all(&blocks);
        let records = |a: &mut Allocator, v: u32, ms: usize| -> Vec<(u64, u64, bool)> {
            let (r, _) = a.take_records(v, ms);
            r.iter().map(|r| (r.offset, r.len, r.free)).collect()
        };
        assert_eq!(
            records(&mut a, 0, 0),
            vec![(0, 4 * k, false), (6 * k, k, false), (MB - k, k, false)]
        );
        assert_eq!(records(&mut a, 0, 1), vec![(MB, k, false)]);
        assert_eq!(records(&mut a, 1, 0), vec![(4 * k, k, false)]);
        // Freed in the same order: the same extents, and the space comes back whole.
        assert!(a.free_all(&blocks, 5, AllocClass::Recorded).is_empty());
        assert_eq!(
            records(&mut a, 0, 0),
            vec![(0, 4 * k, true), (6 * k, k, true), (MB - k, k, true)]
        );
        assert_eq!(records(&mut a, 0, 1), vec![(MB, k, true)]);
        assert_eq!(a.space().freeing, 8 * k);
        a.txg_synced(7);
        assert_eq!(a.space().freeing, 0);
        assert_eq!(a.space().alloc, 0);
    }

    #[test]
    fn a_run_of_blocks_takes_one_extent_of_the_active_metaslab_or_nothing() {
        let mut a = Allocator::new(&[(0, 8 * MB, 20)]);
        let k = 16 << 10;
        // Raidz-like: each block takes more than its size.
        let asize_of = |_: u32, psize: u64| psize + 4096;
        let run = a.alloc_run(k, 8, AllocClass::Recorded, &asize_of).unwrap();
        assert_eq!(run, (0, 0, k + 4096));
        assert_eq!(a.space().alloc, 8 * (k + 4096));
        let (records, _) = a.take_records(0, 0);
        assert_eq!(records.len(), 1, "one record for the run: {records:?}");
        assert_eq!((records[0].offset, records[0].len), (0, 8 * (k + 4096)));
        // More than the active metaslab holds in one piece: refused, nothing taken.
        let before = a.space();
        assert!(a
            .alloc_run(k, 64, AllocClass::Recorded, &|_, p| p)
            .is_none());
        assert_eq!(a.space(), before);
        // The blocks come back one by one like any others.
        for i in 0..8 {
            let d = Dva::new(0, i * (k + 4096), (k + 4096) as u32);
            a.free(&d, 3, AllocClass::Recorded).unwrap();
        }
        a.txg_synced(5);
        assert_eq!(a.space().alloc, 0);
    }

    #[test]
    fn held_frees_wait_for_the_release() {
        let mut a = Allocator::new(&[(0, 8 * MB, 20)]);
        let d = a.alloc(8192, 1, AllocClass::Recorded).unwrap();
        a.hold_frees(4);
        a.free(&d[0], 5, AllocClass::Recorded).unwrap();
        a.txg_synced(9);
        assert_eq!(a.space().freeing, 8192, "reused while held");
        a.release_frees(4);
        a.txg_synced(10);
        assert_eq!(a.space().freeing, 0);
        assert_eq!(a.space().alloc, 0);
    }

    #[test]
    fn a_hold_keeps_only_what_was_freed_after_its_tree() {
        let mut a = Allocator::new(&[(0, 8 * MB, 20)]);
        let d: Vec<Dva> = (0..4)
            .map(|_| a.alloc(8192, 1, AllocClass::Recorded).unwrap()[0])
            .collect();
        a.free(&d[0], 3, AllocClass::Recorded).unwrap();
        a.free(&d[1], 4, AllocClass::Recorded).unwrap();
        // Two holds, from trees of txg 4 and 6: frees of txg 4 and before no such tree
        // points at; those of txg 5 and after wait for both holds to end.
        a.hold_frees(6);
        a.hold_frees(4);
        a.free(&d[2], 5, AllocClass::Recorded).unwrap();
        a.free(&d[3], 7, AllocClass::Recorded).unwrap();
        a.txg_synced(9);
        assert_eq!(a.space().freeing, 2 * 8192, "{:?}", a.space());
        a.release_frees(4);
        a.txg_synced(10);
        assert_eq!(
            a.space().freeing,
            8192,
            "the free of txg 5 is not held by txg 6's tree"
        );
        a.release_frees(6);
        a.txg_synced(11);
        assert_eq!(a.space().freeing, 0);
        assert_eq!(a.space().alloc, 0);
    }

    #[test]
    fn the_gauge_follows_every_change_of_the_space() {
        let mut a = Allocator::new(&[(0, 8 * MB, 20), (1, 8 * MB, 20)]);
        let g = a.gauge();
        assert_eq!(g.read(), a.space());
        let d = a.alloc(8192, 2, AllocClass::Recorded).unwrap();
        assert_eq!(g.read(), a.space());
        assert_eq!(g.read().alloc, 2 * 8192);
        a.free(&d[0], 5, AllocClass::Recorded).unwrap();
        assert_eq!(g.read(), a.space());
        assert_eq!(g.read().freeing, 8192);
        a.txg_synced(7);
        assert_eq!(g.read(), a.space());
        assert_eq!(g.read().free, 16 * MB - 8192);
    }

    #[test]
    fn deferred_frees_return_after_two_txgs_and_records_replay() {
        let mut a = Allocator::new(&[(0, 8 * MB, 20)]);
        let d = a.alloc(8192, 1, AllocClass::Recorded).unwrap();
        assert_eq!(a.space().alloc, 8192);
        a.free(&d[0], 5, AllocClass::Recorded).unwrap();
        assert_eq!(a.space().freeing, 8192);
        a.txg_synced(6);
        assert_eq!(a.space().freeing, 8192);
        a.txg_synced(7);
        assert_eq!(
            a.space(),
            Space {
                size: 8 * MB,
                alloc: 0,
                free: 8 * MB,
                freeing: 0
            }
        );
        // The records, replayed on a fresh allocator, give the same free space.
        let ms = a.dirty_metaslabs();
        assert_eq!(ms, vec![(0, 0)]);
        let (recs, full) = a.take_records(0, 0);
        assert!(!full);
        assert_eq!(recs.len(), 2);
        let mut b = Allocator::new(&[(0, 8 * MB, 20)]);
        b.load_records(0, 0, &recs).unwrap();
        assert_eq!(b.space().alloc, 0);
        // A record that frees free space is corruption, reported, not a panic.
        assert!(matches!(
            b.load_records(0, 0, &recs[1..]),
            Err(AllocError::Corrupt { .. })
        ));
        // So is one whose end is past the numbers (wrapped, it looked inside the metaslab).
        let wraps = SmRecord {
            offset: 4096,
            len: u64::MAX - 4095,
            free: true,
        };
        let mut c = Allocator::new(&[(0, 8 * MB, 20)]);
        assert!(matches!(
            c.load_records(0, 0, &[wraps]),
            Err(AllocError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_free_of_space_not_allocated_as_its_class_is_refused_and_changes_nothing() {
        let mut a = Allocator::new(&[(0, 8 * MB, 20)]);
        let d = a.alloc(8192, 1, AllocClass::Recorded).unwrap()[0];
        let mos = a.alloc(8192, 1, AllocClass::Mos).unwrap()[0];
        let before = a.space();
        let why = |a: &mut Allocator, d: Dva, class| match a.free(&d, 5, class) {
            Err(AllocError::BadFree { why, .. }) => why,
            other => panic!("{d:?}: {other:?}"),
        };
        let at = |v: u32, off: u64, len: u32| Dva::new(v, off, len);
        assert_eq!(
            why(&mut a, at(1, 0, 8192), AllocClass::Recorded),
            "no such data vdev"
        );
        assert_eq!(
            why(&mut a, at(0, 8 * MB, 8192), AllocClass::Recorded),
            "past the end of the vdev's data area"
        );
        assert_eq!(
            why(&mut a, at(0, u64::MAX - 4095, 8192), AllocClass::Recorded),
            "past the end of the vdev's data area"
        );
        assert_eq!(
            why(&mut a, at(0, MB - 4096, 8192), AllocClass::Recorded),
            "not within one metaslab"
        );
        assert_eq!(
            why(&mut a, at(0, 4 * MB, 4096), AllocClass::Recorded),
            "free space"
        );
        // Half allocated, half free: still refused, and the allocated half kept.
        let straddles = at(0, mos.offset.get() + 4096, 8192);
        assert_eq!(why(&mut a, straddles, AllocClass::Mos), "free space");
        assert_eq!(why(&mut a, mos, AllocClass::Recorded), "a MOS allocation");
        assert_eq!(why(&mut a, d, AllocClass::Mos), "not a MOS allocation");
        assert_eq!(a.space(), before);
        // Freed once, a second free of it (in this txg or the next) is refused.
        a.free(&d, 5, AllocClass::Recorded).unwrap();
        assert_eq!(why(&mut a, d, AllocClass::Recorded), "freed already");
        // In a batch, a bad copy beside good ones leaks only itself.
        let run = a.alloc(16384, 1, AllocClass::Recorded).unwrap()[0];
        let (first, second) = (
            at(0, run.offset.get(), 8192),
            at(0, run.offset.get() + 8192, 8192),
        );
        let refused = a.free_all([&first, &first, &second], 6, AllocClass::Recorded);
        assert_eq!(refused.len(), 1, "{refused:?}");
        a.txg_synced(8);
        assert_eq!(a.space().alloc, 8192, "only the MOS block is left");
        assert_eq!(a.space(), a.space_recounted());
    }

    #[test]
    fn ditto_copies_go_to_distinct_vdevs_and_full_pool_is_clean() {
        let mut a = Allocator::new(&[(0, 4 * MB, 20), (1, 4 * MB, 20)]);
        let d = a.alloc(4096, 2, AllocClass::Mos).unwrap();
        assert_ne!(d[0].vdev, d[1].vdev);
        let mut one = Allocator::new(&[(0, 4 * MB, 20)]);
        let d = one.alloc(4096, 2, AllocClass::Mos).unwrap();
        assert!(d[0].offset.get().abs_diff(d[1].offset.get()) >= MB);
        let before = one.space();
        let mut n = 0;
        while one.alloc(65536, 1, AllocClass::Recorded).is_ok() {
            n += 1;
        }
        assert!(n > 0);
        assert_eq!(
            one.alloc(65536, 1, AllocClass::Recorded),
            Err(AllocError::NoSpace(65536))
        );
        assert!(one.space().free < 65536 * 2);
        assert!(before.free > one.space().free);
    }

    #[test]
    fn condensing_replaces_a_long_map_with_its_image() {
        let mut a = Allocator::new(&[(0, 8 * MB, 20)]);
        let mut records = Vec::new();
        let mut txg = 1;
        // Churn: allocate and free the same block many times.
        for _ in 0..200 {
            let d = a.alloc(4096, 1, AllocClass::Recorded).unwrap();
            a.free(&d[0], txg, AllocClass::Recorded).unwrap();
            txg += 1;
            a.txg_synced(txg);
            for (v, m) in a.dirty_metaslabs() {
                let (recs, full) = a.take_records(v, m);
                if full {
                    records.clear();
                }
                records.extend(recs);
            }
        }
        let keep = a.alloc(4096, 1, AllocClass::Recorded).unwrap();
        let (recs, _) = a.take_records(0, 0);
        records.extend(recs);
        assert!(
            records.len() < 100,
            "space map never condensed: {}",
            records.len()
        );
        let mut b = Allocator::new(&[(0, 8 * MB, 20)]);
        b.load_records(0, 0, &records).unwrap();
        // Only the kept block is allocated once deferred frees are counted free.
        assert_eq!(b.space().alloc, 4096);
        assert!(!b.tops[0].metaslabs[0]
            .free
            .overlaps(keep[0].offset.get(), 4096));
    }

    #[test]
    fn the_kept_histograms_equal_a_recount_after_random_allocs_and_frees() {
        use rand::{Rng, SeedableRng};
        let seed = 0x5eed_0057u64;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut a = Allocator::new(&[(0, 16 * MB, 20), (1, 8 * MB, 20)]);
        let mut live: Vec<Dva> = Vec::new();
        let fresh = a.map();
        assert_eq!(fresh.fragmentation, 0, "wholly free");
        for txg in 1..400u64 {
            for _ in 0..rng.gen_range(1..40) {
                if rng.gen_bool(0.6) || live.is_empty() {
                    let size = SECTOR * rng.gen_range(1..16u64);
                    if let Ok(d) = a.alloc(size, rng.gen_range(1..=2), AllocClass::Recorded) {
                        live.extend(d.iter().copied());
                    }
                } else {
                    let d = live.swap_remove(rng.gen_range(0..live.len()));
                    a.free(&d, txg, AllocClass::Recorded).unwrap();
                }
            }
            a.txg_synced(txg);
            if txg % 50 == 0 {
                let map = a.map();
                assert_eq!(map, a.map_recounted(), "seed {seed}, txg {txg}");
                assert_eq!(a.map_recounted().fragmentation, map.fragmentation);
                assert_eq!(map.free, a.space().free);
            }
        }
        assert!(
            a.map().fragmentation > 0,
            "random small frees leave small holes"
        );
    }
}
