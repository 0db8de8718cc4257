//! The I/O pipeline between objects and devices. Write: checksum → allocate → issue to every
//! copy; read: issue → verify against the parent's checksum → on failure try the other copies,
//! and rewrite the bad ones from a good one (self-healing).
//!
//! Architecture invariant: `zio` is the only layer that turns block pointers into device I/O;
//! above it, blocks are addressed only by `BlkPtr`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::math::ChecksumKind;
use crate::spa::{AllocClass, AllocError, Allocator, BlkPtr, BlockKind, Dva};
use crate::vdev::{ReadReport, TopVdev, VdevError, SECTOR};

#[derive(Debug, thiserror::Error)]
pub enum ZioError {
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error("write failed: {0}")]
    Write(VdevError),
    #[error("unrecoverable {what} block (birth txg {birth}): {detail}")]
    Unrecoverable {
        what: String,
        birth: u64,
        detail: String,
    },
}

/// Properties of a block to write.
#[derive(Clone, Copy, Debug)]
pub struct WriteProps {
    pub kind: BlockKind,
    pub level: u8,
    pub checksum: ChecksumKind,
    pub copies: usize,
    pub class: AllocClass,
}

#[derive(Default, Debug)]
pub struct ZioStats {
    pub blocks_written: AtomicU64,
    pub bytes_written: AtomicU64,
    pub blocks_read: AtomicU64,
    pub repaired_bytes: AtomicU64,
}

/// The error for a block no copy could supply.
fn unrecoverable(bp: &BlkPtr, detail: String) -> ZioError {
    ZioError::Unrecoverable {
        what: match bp.kind() {
            Some(k) => format!("{k:?}").to_lowercase(),
            None => format!("kind {}", bp.kind),
        },
        birth: bp.birth_txg.get(),
        detail,
    }
}

/// What a read needs to check a block: its size and a verifier against its checksum.
fn verifier(bp: &BlkPtr) -> Result<(usize, impl Fn(&[u8]) -> bool), ZioError> {
    let Some(kind) = bp.checksum_kind() else {
        return Err(unrecoverable(
            bp,
            format!("unknown checksum algorithm {}", bp.checksum_kind),
        ));
    };
    let expected = bp.checksum();
    Ok((bp.psize.get() as usize, move |b: &[u8]| {
        kind.compute(b) == expected
    }))
}

impl Zio {
    /// The vdev holding copy `d` of a block of `psize` bytes, if the DVA is sane.
    fn vdev_of(&self, d: &Dva, psize: usize) -> Result<&TopVdev, String> {
        let Some(top) = self.tops.get(d.vdev.get() as usize) else {
            return Err(format!("copy on unknown vdev {}", d.vdev.get()));
        };
        let asize = top.asize_of(psize as u64);
        if d.asize.get() as u64 != asize || d.offset.get() + asize > top.asize_bytes {
            return Err(format!(
                "copy at vdev {} offset {} is out of range",
                d.vdev.get(),
                d.offset.get()
            ));
        }
        Ok(top)
    }
}

pub struct Zio {
    pub tops: Vec<Arc<TopVdev>>,
    pub alloc: Mutex<Allocator>,
    pub stats: ZioStats,
}

impl Zio {
    pub fn new(tops: Vec<Arc<TopVdev>>, alloc: Allocator) -> Zio {
        Zio {
            tops,
            alloc: Mutex::new(alloc),
            stats: ZioStats::default(),
        }
    }

    /// Writes one block copy-on-write to newly allocated space and returns its pointer.
    /// `data.len()` must be a whole number of sectors.
    pub fn write(
        &self,
        data: &[u8],
        props: WriteProps,
        txg: u64,
        fill: u64,
    ) -> Result<BlkPtr, ZioError> {
        assert!(
            !data.is_empty() && (data.len() as u64).is_multiple_of(SECTOR),
            "unaligned block of {} bytes",
            data.len()
        );
        let checksum = props.checksum.compute(data);
        let dvas = self.alloc.lock().alloc_sized(
            data.len() as u64,
            props.copies,
            props.class,
            &|v, psize| self.tops[v as usize].asize_of(psize),
        )?;
        let results: Vec<Result<(), VdevError>> = if dvas.len() == 1 {
            vec![self.issue_write(&dvas[0], data)]
        } else {
            use rayon::prelude::*;
            dvas.par_iter().map(|d| self.issue_write(d, data)).collect()
        };
        // Any copy failing fails the write: the caller's txg cannot commit a pointer to a copy
        // that may hold garbage.
        if let Some(e) = results.into_iter().find_map(|r| r.err()) {
            return Err(ZioError::Write(e));
        }
        self.stats.blocks_written.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes_written
            .fetch_add(data.len() as u64 * dvas.len() as u64, Ordering::Relaxed);
        let mut bp = BlkPtr::HOLE;
        for (slot, d) in bp.dva.iter_mut().zip(&dvas) {
            *slot = *d;
        }
        bp.lsize = (data.len() as u32).into();
        bp.psize = (data.len() as u32).into();
        bp.birth_txg = txg.into();
        bp.fill = fill.into();
        bp.checksum_kind = props.checksum as u8;
        bp.level = props.level;
        bp.kind = props.kind as u8;
        bp.checksum = checksum.0;
        debug_assert!(!bp.is_hole());
        Ok(bp)
    }

    fn issue_write(&self, d: &Dva, data: &[u8]) -> Result<(), VdevError> {
        self.tops[d.vdev.get() as usize].write(d.offset.get(), data)
    }

    /// Reads and verifies a block. Holes read as zeros of `lsize`... but a hole has no size, so
    /// callers handle holes before calling; this asserts it.
    pub fn read(&self, bp: &BlkPtr) -> Result<Vec<u8>, ZioError> {
        assert!(!bp.is_hole());
        let (psize, verify) = verifier(bp)?;
        let mut buf = vec![0u8; psize];
        let mut failed: Vec<&Dva> = Vec::new();
        let mut errors = Vec::new();
        for d in bp.dvas() {
            let top = match self.vdev_of(d, psize) {
                Ok(t) => t,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            match top.read_verified(d.offset.get(), &mut buf, &verify) {
                Ok(report) => {
                    self.stats
                        .repaired_bytes
                        .fetch_add(report.repaired_bytes, Ordering::Relaxed);
                    // Heal the ditto copies that failed whole before this one.
                    for bad in failed {
                        if self.issue_write(bad, &buf).is_ok() {
                            self.stats
                                .repaired_bytes
                                .fetch_add(psize as u64, Ordering::Relaxed);
                        }
                    }
                    self.stats.blocks_read.fetch_add(1, Ordering::Relaxed);
                    return Ok(buf);
                }
                Err(e) => {
                    errors.push(e.to_string());
                    failed.push(d);
                }
            }
        }
        if errors.is_empty() {
            errors.push("block pointer has no copies".into());
        }
        Err(unrecoverable(bp, errors.join("; ")))
    }

    /// A scrub's read of a block: every copy of it (every DVA, and within each every mirror
    /// child or raidz column) is read and verified, and every bad one rewritten from a good
    /// one. Returns what it found; fails only if no copy holds the block.
    pub fn scrub(&self, bp: &BlkPtr) -> Result<ReadReport, ZioError> {
        assert!(!bp.is_hole());
        let (psize, verify) = verifier(bp)?;
        let mut total = ReadReport::default();
        let mut good: Option<Vec<u8>> = None;
        let mut failed: Vec<&Dva> = Vec::new();
        let mut errors = Vec::new();
        for d in bp.dvas() {
            let top = match self.vdev_of(d, psize) {
                Ok(t) => t,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let mut buf = vec![0u8; psize];
            match top.scrub(d.offset.get(), &mut buf, &verify) {
                Ok(r) => {
                    total.io_errors += r.io_errors;
                    total.cksum_errors += r.cksum_errors;
                    total.repaired_bytes += r.repaired_bytes;
                    good.get_or_insert(buf);
                }
                Err(e) => {
                    errors.push(e.to_string());
                    failed.push(d);
                }
            }
        }
        let Some(good) = good else {
            if errors.is_empty() {
                errors.push("block pointer has no copies".into());
            }
            return Err(unrecoverable(bp, errors.join("; ")));
        };
        for bad in failed {
            if self.issue_write(bad, &good).is_ok() {
                total.repaired_bytes += psize as u64;
            }
        }
        self.stats
            .repaired_bytes
            .fetch_add(total.repaired_bytes, Ordering::Relaxed);
        Ok(total)
    }

    /// Overwrites `count` random sectors of `leaf` that hold copies of the blocks `bps` with
    /// random bytes, behind every check (fault injection: what silent corruption looks like).
    /// Returns how many sectors were hit (fewer if the leaf holds fewer).
    pub fn corrupt_on_leaf(
        &self,
        bps: &[BlkPtr],
        leaf: &crate::vdev::Leaf,
        count: usize,
        seed: u64,
    ) -> Result<usize, VdevError> {
        use rand::seq::SliceRandom;
        use rand::{RngCore, SeedableRng};
        let mut sectors: Vec<u64> = Vec::new();
        for bp in bps {
            for d in bp.dvas() {
                if let Some(top) = self.tops.get(d.vdev.get() as usize) {
                    let psize = bp.psize.get() as u64;
                    sectors.extend(top.sectors_on_leaf(leaf.guid(), d.offset.get(), psize));
                }
            }
        }
        sectors.sort_unstable();
        sectors.dedup();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        sectors.shuffle(&mut rng);
        sectors.truncate(count);
        let mut junk = vec![0u8; SECTOR as usize];
        for &off in &sectors {
            rng.fill_bytes(&mut junk);
            leaf.scribble(&junk, off)?;
        }
        leaf.flush()?;
        Ok(sectors.len())
    }

    /// The most a block can grow on its way to disk, as a factor: a raidz stores the smallest
    /// block with `nparity` parity sectors beside it; other vdevs store blocks as they are.
    pub fn max_inflation(&self) -> u64 {
        self.tops
            .iter()
            .map(|t| t.raidz.as_ref().map_or(1, |r| r.nparity() as u64 + 1))
            .max()
            .unwrap_or(1)
    }

    /// Frees every copy of a block in txg `txg`.
    /// Records in the space map a block allocated unrecorded (`AllocClass::Mos`) and written
    /// ahead of its txg, now that the txg's tree points at it.
    pub fn adopt(&self, bp: &BlkPtr) {
        let mut a = self.alloc.lock();
        for d in bp.dvas() {
            a.record_alloc(d);
        }
    }

    /// Marks a block's space allocated without recording it in the space map (a block an
    /// intent-log record points at, until the replay that copies it is committed).
    pub fn claim(&self, bp: &BlkPtr) -> Result<(), AllocError> {
        let dvas: Vec<Dva> = bp.dvas().copied().collect();
        self.alloc.lock().claim_all_mos(&dvas)
    }

    pub fn free(&self, bp: &BlkPtr, txg: u64, class: AllocClass) {
        let mut a = self.alloc.lock();
        for d in bp.dvas() {
            a.free(d, txg, class);
        }
    }
}
