//! RAID-Z: a top-level vdev whose children hold data and parity columns.
//!
//! Every block is its own full stripe (variable width): a block of `s` data sectors becomes
//! `ceil(s / ndata)` rows of `ndata` data sectors plus `nparity` parity sectors, its columns on
//! consecutive children. A write never reads or modifies another block's stripe, so there is
//! no read-modify-write and no write hole: copy-on-write gives every block fresh sectors.
//!
//! ## Address space
//! The vdev's offsets count sectors across the children row by row: sector `b` of the vdev is
//! sector `b / width` of child `b % width`. A block allocated at sector `b` starts its first
//! column on child `b % width`; column `c` is on child `(b + c) % width`, one row lower when
//! it wraps past the last child. Its columns cover exactly the vdev sectors `b .. b + total`,
//! so an allocation of `asize(psize)` sectors from the metaslab allocator holds it. The
//! allocation is rounded up to a multiple of `nparity + 1` sectors: the smallest block takes
//! `1 + nparity` sectors, so no free fragment is ever too small for one.
//!
//! ## Columns
//! Parity columns come first (as the RDP paper lays them out, so that the short columns a
//! ragged stripe ends with are data columns, which count as zero-padded in the codes). The
//! first `(s % ndata) + nparity` columns are one sector longer than the rest when `s` is not a
//! multiple of `ndata`; every parity column has the length of the longest column. Data column
//! `k` holds bytes `[start_k, start_k + len_k)` of the block, in order, so reads land directly
//! in the caller's buffer.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::device::VdevError;
use super::io::{waiting_in_parallel, ReadReport, Unsettled};
use super::layout::SECTOR;
use super::leaf::{maybe_fault, Leaf};
use zeta_math::parity::{Code, Codec};

/// The parity code of a raidz vdev, as its label records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "lowercase")]
pub enum RaidzCode {
    /// raidz1: P = XOR.
    Xor,
    /// Reed-Solomon P+Q (raidz2) or P+Q+R (raidz3) over GF(2^8).
    Rs,
    /// Row-diagonal parity (raidz2) with prime `p`.
    Rdp { p: u32 },
}

/// What the label says about a raidz vdev beyond its children.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaidzConfig {
    pub nparity: u32,
    #[serde(flatten)]
    pub code: RaidzCode,
}

/// Widest raidz vdev zeta builds.
pub const MAX_WIDTH: usize = 24;

/// Why a raidz vdev of a given shape cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("raidz{0}: parity must be 1, 2 or 3")]
    Parity(u32),
    #[error("raidz{nparity} needs {min} to {MAX_WIDTH} devices, got {got}")]
    Width {
        nparity: u32,
        min: usize,
        got: usize,
    },
    #[error("no RDP prime for {0} devices")]
    NoRdpPrime(usize),
    #[error("RDP is a double-parity code; raidz3 uses RS")]
    RdpIsDoubleParity,
    #[error("{devices} devices are too many for this code (at most {max_data} data columns)")]
    TooWide { devices: usize, max_data: usize },
    #[error(transparent)]
    Code(#[from] zeta_math::parity::ParityError),
    #[error("a raidz vdev with no devices present")]
    NoDevices,
}

impl RaidzConfig {
    /// The config for a new raidz vdev of `width` children: raidz1 uses XOR, raidz3 RS, and
    /// raidz2 the code asked for (RDP with the smallest prime that fits the widest stripe).
    pub fn new(nparity: u32, width: usize, rdp: bool) -> Result<RaidzConfig, ShapeError> {
        if !(1..=3).contains(&nparity) {
            return Err(ShapeError::Parity(nparity));
        }
        if !(3..=MAX_WIDTH).contains(&width) || width <= nparity as usize + 1 {
            return Err(ShapeError::Width {
                nparity,
                min: (nparity as usize + 2).max(3),
                got: width,
            });
        }
        let code = match (nparity, rdp) {
            (1, _) => RaidzCode::Xor,
            (2, true) => {
                let p = zeta_math::parity::rdp_prime_for(width - 2)
                    .ok_or(ShapeError::NoRdpPrime(width))?;
                RaidzCode::Rdp { p }
            }
            (3, true) => return Err(ShapeError::RdpIsDoubleParity),
            _ => RaidzCode::Rs,
        };
        Ok(RaidzConfig { nparity, code })
    }

    pub fn codec(&self) -> Result<Codec, ShapeError> {
        let code = match self.code {
            RaidzCode::Xor => Code::Xor,
            RaidzCode::Rs => Code::Rs,
            RaidzCode::Rdp { p } => Code::Rdp { p },
        };
        Ok(Codec::new(code, self.nparity as usize)?)
    }
}

/// The shape of a raidz vdev: how many children, how many of each stripe's columns are parity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaidzGeom {
    pub width: u64,
    pub nparity: u64,
}

/// One column of a block's stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    /// Index of the child (slot) holding it.
    pub child: usize,
    /// Byte offset in the child's data area.
    pub offset: u64,
    pub len: usize,
}

/// Where a block's columns lie: `cols[..nparity]` parity, the rest data in block order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripeMap {
    pub cols: Vec<Column>,
    pub nparity: usize,
}

impl StripeMap {
    pub fn parity_len(&self) -> usize {
        self.cols[0].len
    }

    pub fn data_cols(&self) -> &[Column] {
        &self.cols[self.nparity..]
    }

    /// Lengths of the data columns, in block order.
    pub fn data_lens(&self) -> Vec<usize> {
        self.data_cols().iter().map(|c| c.len).collect()
    }
}

impl RaidzGeom {
    pub fn new(width: usize, nparity: u32) -> RaidzGeom {
        assert!(width > nparity as usize + 1);
        RaidzGeom {
            width: width as u64,
            nparity: nparity as u64,
        }
    }

    fn ndata(&self) -> u64 {
        self.width - self.nparity
    }

    /// Sectors a block of `psize` bytes occupies with its parity, before rounding.
    fn sectors(&self, psize: u64) -> u64 {
        let s = psize.div_ceil(SECTOR);
        s + self.nparity * s.div_ceil(self.ndata())
    }

    /// Bytes to allocate for a block of `psize` bytes: data plus parity sectors, rounded up
    /// to a multiple of `nparity + 1` sectors.
    pub fn asize(&self, psize: u64) -> u64 {
        let unit = self.nparity + 1;
        self.sectors(psize).div_ceil(unit) * unit * SECTOR
    }

    /// The columns of a block of `psize` bytes (a whole number of sectors) allocated at vdev
    /// byte offset `offset`.
    pub fn map(&self, offset: u64, psize: u64) -> StripeMap {
        debug_assert!(offset.is_multiple_of(SECTOR) && psize.is_multiple_of(SECTOR) && psize > 0);
        let b = offset / SECTOR;
        let s = psize / SECTOR;
        let (q, r) = (s / self.ndata(), s % self.ndata());
        // Columns that get one sector more than the others (parity included).
        let big = if r == 0 { 0 } else { r + self.nparity };
        let ncols = if q == 0 { big } else { self.width };
        let first = b % self.width;
        let row = b / self.width;
        let cols = (0..ncols)
            .map(|c| {
                let pos = first + c;
                let (child, row) = if pos >= self.width {
                    (pos - self.width, row + 1)
                } else {
                    (pos, row)
                };
                let sectors = if c < big { q + 1 } else { q };
                Column {
                    child: child as usize,
                    offset: row * SECTOR,
                    len: (sectors * SECTOR) as usize,
                }
            })
            .collect();
        StripeMap {
            cols,
            nparity: self.nparity as usize,
        }
    }
}

/// The I/O half of a raidz vdev: its children by position (None where a device is missing)
/// and its codec.
pub struct Raidz {
    pub config: RaidzConfig,
    pub geom: RaidzGeom,
    codec: Codec,
    pub slots: Vec<Option<Arc<Leaf>>>,
}

/// A block's columns as they were read, before any rebuild.
struct AsRead {
    data: Vec<u8>,
    parity: Vec<Vec<u8>>,
}

/// How the columns of one read fared.
struct ColumnRead {
    /// Columns that could not be read (device missing or I/O error).
    failed: Vec<usize>,
    errors: Vec<String>,
}

fn split_lens<'a>(mut buf: &'a [u8], lens: &[usize]) -> Vec<&'a [u8]> {
    lens.iter()
        .map(|&n| {
            let (head, rest) = buf.split_at(n);
            buf = rest;
            head
        })
        .collect()
}

fn split_lens_mut<'a>(mut buf: &'a mut [u8], lens: &[usize]) -> Vec<&'a mut [u8]> {
    lens.iter()
        .map(|&n| {
            let (head, rest) = std::mem::take(&mut buf).split_at_mut(n);
            buf = rest;
            head
        })
        .collect()
}

/// Adjacent columns of one child, moved as one request; `B` is a column's buffer.
struct Stretch<B> {
    child: usize,
    offset: u64,
    end: u64,
    bufs: Vec<B>,
}

impl<B> Stretch<B> {
    /// Gathers the columns of a run of blocks, in order, into stretches: a column that
    /// begins where its child's last stretch ends joins it.
    fn gather(columns: impl Iterator<Item = (Column, B)>, children: usize) -> Vec<Stretch<B>> {
        let mut stretches: Vec<Stretch<B>> = Vec::new();
        // Each child's last stretch, the only one a later column can extend.
        let mut last: Vec<Option<usize>> = vec![None; children];
        for (c, buf) in columns {
            match last[c.child] {
                Some(i) if stretches[i].end == c.offset => {
                    stretches[i].end += c.len as u64;
                    stretches[i].bufs.push(buf);
                }
                _ => {
                    last[c.child] = Some(stretches.len());
                    stretches.push(Stretch {
                        child: c.child,
                        offset: c.offset,
                        end: c.offset + c.len as u64,
                        bufs: vec![buf],
                    });
                }
            }
        }
        stretches
    }
}

/// Calls `f` with every combination of `k` elements of `items`, in lexicographic order,
/// until it returns true; returns whether it did.
fn any_combination(items: &[usize], k: usize, f: &mut dyn FnMut(&[usize]) -> bool) -> bool {
    fn go(
        items: &[usize],
        k: usize,
        start: usize,
        cur: &mut Vec<usize>,
        f: &mut dyn FnMut(&[usize]) -> bool,
    ) -> bool {
        if cur.len() == k {
            return f(cur);
        }
        for i in start..items.len() {
            cur.push(items[i]);
            if go(items, k, i + 1, cur, f) {
                return true;
            }
            cur.pop();
        }
        false
    }
    go(items, k, 0, &mut Vec::with_capacity(k), f)
}

/// What kind of read `Raidz::read` is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum How {
    /// Until the block verifies; wrong columns are counted and rewritten.
    Verified,
    /// Every column, parity included, checked and mended.
    Scrub,
    /// Until the block verifies; wrong columns are returned, untouched.
    Speculative,
}

impl Raidz {
    pub fn new(config: RaidzConfig, slots: Vec<Option<Arc<Leaf>>>) -> Result<Raidz, ShapeError> {
        let codec = config.codec()?;
        if slots.len() - config.nparity as usize > codec.max_data() {
            return Err(ShapeError::TooWide {
                devices: slots.len(),
                max_data: codec.max_data(),
            });
        }
        Ok(Raidz {
            geom: RaidzGeom::new(slots.len(), config.nparity),
            config,
            codec,
            slots,
        })
    }

    pub fn nparity(&self) -> usize {
        self.config.nparity as usize
    }

    /// Counts a failed I/O against a child and faults it after a run of failures, if the
    /// other children out of service leave room in the parity.
    fn fail(&self, leaf: &Leaf, e: &VdevError, counter: &std::sync::atomic::AtomicU64) {
        if leaf.count_failure(e, counter) {
            maybe_fault(leaf, self.slots.iter().map(Option::as_ref), self.nparity());
        }
    }

    fn missing_error(&self, child: usize) -> VdevError {
        VdevError::Missing {
            path: format!("raidz child {child}"),
        }
    }

    /// The maps of a run of blocks of these lengths lying one after another from `offset`.
    fn run_maps(&self, offset: u64, lens: impl Iterator<Item = usize>) -> Vec<StripeMap> {
        lens.scan(offset, |at, len| {
            let map = self.geom.map(*at, len as u64);
            *at += self.geom.asize(len as u64);
            Some(map)
        })
        .collect()
    }

    /// The parity columns of `data`, a block laid out as `map`.
    fn parity(&self, map: &StripeMap, data: &[u8]) -> Vec<Vec<u8>> {
        let mut parity = vec![vec![0u8; map.parity_len()]; map.nparity];
        let mut prefs: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
        self.codec
            .generate(&split_lens(data, &map.data_lens()), &mut prefs);
        parity
    }

    /// Writes a block as one full stripe, each column with `Leaf::write_data_durable`, so
    /// the block survives a crash when this returns (an intent log block's commit). Succeeds
    /// when at most `nparity` columns failed (each failure counted against its leaf): the
    /// block is then readable from the rest; a leaf whose column failed then owes txg
    /// `birth` (`Leaf::owes`).
    pub fn write_durable(
        &self,
        offset: u64,
        data: &[u8],
        birth: Option<u64>,
    ) -> Result<(), VdevError> {
        let map = self.geom.map(offset, data.len() as u64);
        let parity = self.parity(&map, data);
        let bufs: Vec<&[u8]> = parity
            .iter()
            .map(|p| &p[..])
            .chain(split_lens(data, &map.data_lens()))
            .collect();
        let write = |(c, buf): (&Column, &&[u8])| match &self.slots[c.child] {
            Some(leaf) => leaf
                .write_data_durable(buf, c.offset)
                .inspect_err(|e| self.fail(leaf, e, &leaf.counters.write_errors)),
            None => Err(self.missing_error(c.child)),
        };
        // A durable column waits for its device: those go in parallel.
        let cols: Vec<(&Column, &&[u8])> = map.cols.iter().zip(&bufs).collect();
        let results = waiting_in_parallel(&cols, |&c| write(c));
        let failed: Vec<(usize, VdevError)> = cols
            .iter()
            .zip(results)
            .filter_map(|((c, _), r)| r.err().map(|e| (c.child, e)))
            .collect();
        if failed.len() > map.nparity {
            return Err(VdevError::write_lost(
                map.nparity,
                map.cols.len(),
                "columns",
                failed.iter().map(|(_, e)| e),
            ));
        }
        for (child, _) in &failed {
            if let Some(leaf) = &self.slots[*child] {
                leaf.owes(birth);
            }
        }
        Ok(())
    }

    /// Writes a run of blocks that lie one after another from `offset` (each the next's
    /// predecessor by `geom.asize` of its length), buffered, with one request per stretch of
    /// adjacent columns on a child (see `read_run`): a run of eight 16K blocks on a raidz2 of
    /// six is six writes of 32K rather than forty-eight of 4K. Succeeds when at most
    /// `nparity` children failed (each failure counted against its leaf): every block is
    /// then readable from the rest. More failed children fail the whole run, even if no one
    /// block lost more than `nparity` columns. A child that failed owes txg `birth` once the
    /// run succeeded without it (`Leaf::owes`).
    pub fn write_run(
        &self,
        offset: u64,
        blocks: &[&[u8]],
        birth: Option<u64>,
    ) -> Result<(), VdevError> {
        let maps = self.run_maps(offset, blocks.iter().map(|b| b.len()));
        let parity: Vec<Vec<Vec<u8>>> = blocks
            .iter()
            .zip(&maps)
            .map(|(data, map)| self.parity(map, data))
            .collect();
        let columns = blocks
            .iter()
            .zip(&maps)
            .zip(&parity)
            .flat_map(|((data, map), parity)| {
                let bufs = parity
                    .iter()
                    .map(|p| &p[..])
                    .chain(split_lens(data, &map.data_lens()));
                map.cols.iter().copied().zip(bufs)
            });
        let stretches = Stretch::gather(columns, self.slots.len());
        // Buffered: copies into page caches, cheaper on this thread than handed to the pool
        // (figures: docs/perf/raidz.md, "Why RAID-Z columns stay on the calling thread").
        // Every error, and the children they came from (a child may fail several stretches).
        let mut failures: Vec<(usize, VdevError)> = Vec::new();
        for s in &stretches {
            let r = match &self.slots[s.child] {
                Some(leaf) => leaf.write_data_vectored(&s.bufs, s.offset),
                None => Err(self.missing_error(s.child)),
            };
            if let Err(e) = r {
                failures.push((s.child, e));
            }
        }
        // The first error of each child that failed: what the vdev lost.
        let mut seen = vec![false; self.slots.len()];
        let lost: Vec<&VdevError> = failures
            .iter()
            .filter(|(c, _)| !std::mem::replace(&mut seen[*c], true))
            .map(|(_, e)| e)
            .collect();
        // Children out of room beyond the parity are the file system's state, not a fault of
        // any device: none is charged with it (as `TopVdev::settle_write` says for a mirror).
        let too_many = lost.len() > self.nparity();
        let all_full = too_many && failures.iter().all(|(_, e)| e.out_of_space());
        for (child, e) in &failures {
            if let (Some(leaf), false) = (&self.slots[*child], all_full) {
                self.fail(leaf, e, &leaf.counters.write_errors);
            }
        }
        if too_many {
            return Err(VdevError::write_lost(
                self.nparity(),
                self.slots.len(),
                "children",
                lost.into_iter(),
            ));
        }
        for (child, leaf) in self.slots.iter().enumerate() {
            if let (Some(leaf), true) = (leaf, seen[child]) {
                leaf.owes(birth);
            }
        }
        Ok(())
    }

    /// Reads columns `which` of `map` into `bufs` (indexed like `map.cols`): those a leaf
    /// can serve at once (from the page cache) on this thread, the rest in parallel. Handing
    /// every column to the thread pool cost more in task switches than the reads themselves
    /// when they were page-cache copies (figures: docs/perf/raidz.md, "Why RAID-Z columns
    /// stay on the calling thread"); a column that waits for a device still waits alongside
    /// the others.
    fn read_columns(
        &self,
        map: &StripeMap,
        which: &[usize],
        bufs: &mut [&mut [u8]],
        out: &mut ColumnRead,
    ) {
        let mut targets: Vec<(usize, &mut [u8])> = bufs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| which.contains(i))
            .map(|(i, b)| (i, &mut **b))
            .collect();
        targets.retain_mut(|(i, buf)| !self.read_column_nowait(&map.cols[*i], buf));
        let read = |(i, buf): &mut (usize, &mut [u8])| -> Result<(), VdevError> {
            let c = map.cols[*i];
            match &self.slots[c.child] {
                Some(leaf) => leaf
                    .read_data(buf, c.offset)
                    .inspect_err(|e| self.fail(leaf, e, &leaf.counters.read_errors)),
                None => Err(self.missing_error(c.child)),
            }
        };
        let results: Vec<Result<(), VdevError>> = if targets.len() <= 1 {
            targets.iter_mut().map(read).collect()
        } else {
            targets.par_iter_mut().map(read).collect()
        };
        for ((i, _), r) in targets.iter().zip(results) {
            if let Err(e) = r {
                out.failed.push(*i);
                out.errors.push(e.to_string());
            }
        }
    }

    /// Reads the data columns of a run of blocks that lie one after another from `offset`
    /// (each of `bufs` one block; the next begins `geom.asize` of its length later),
    /// unverified, with one request per stretch of adjacent columns on a child. Blocks of a
    /// run take the same rows of the children one after another, so a run of eight 16K
    /// blocks on a raidz2 of six is four reads of 32K rather than thirty-two of 4K (figures:
    /// docs/perf/raidz.md, "Why a run of adjacent blocks is one request per child").
    /// Stretches a leaf has at once are read on this thread; the rest in parallel. An error
    /// is returned as is, not counted: the caller reads the run's blocks one by one
    /// (`read_verified`), which rebuilds from parity, counts and repairs.
    pub fn read_run(&self, offset: u64, bufs: &mut [&mut [u8]]) -> Result<(), VdevError> {
        let maps = self.run_maps(offset, bufs.iter().map(|b| b.len()));
        let columns = bufs.iter_mut().zip(&maps).flat_map(|(buf, map)| {
            let data_cols = map.data_cols().iter().copied();
            data_cols.zip(split_lens_mut(buf, &map.data_lens()))
        });
        let mut stretches = Stretch::gather(columns, self.slots.len());
        stretches.retain_mut(|s| {
            !self.slots[s.child]
                .as_ref()
                .is_some_and(|leaf| leaf.read_data_vectored_nowait(&mut s.bufs, s.offset))
        });
        let read = |s: &mut Stretch<&mut [u8]>| -> Result<(), VdevError> {
            match &self.slots[s.child] {
                Some(leaf) => leaf.read_data_vectored(&mut s.bufs, s.offset),
                None => Err(self.missing_error(s.child)),
            }
        };
        if stretches.len() <= 1 {
            stretches.iter_mut().try_for_each(read)
        } else {
            stretches.par_iter_mut().try_for_each(read)
        }
    }

    /// Reads the data columns of the block at `offset` if every one's leaf serves it at once
    /// (`Leaf::read_data_nowait`); false if one would wait, with nothing counted. Unverified:
    /// the caller checks the block, and reads it with `read_verified` if this declines or
    /// the block does not verify.
    pub fn read_nowait(&self, offset: u64, buf: &mut [u8]) -> bool {
        let map = self.geom.map(offset, buf.len() as u64);
        map.data_cols()
            .iter()
            .zip(split_lens_mut(buf, &map.data_lens()))
            .all(|(c, b)| self.read_column_nowait(c, b))
    }

    /// Reads column `c` into `buf` if its leaf is present and serves it at once.
    fn read_column_nowait(&self, c: &Column, buf: &mut [u8]) -> bool {
        self.slots[c.child]
            .as_ref()
            .is_some_and(|leaf| leaf.read_data_nowait(buf, c.offset))
    }

    /// Reads a block and returns it once `verify` approves. Data columns are read straight
    /// into `buf`; parity is read only when a column failed or the block did not verify.
    /// Then the missing columns are rebuilt, and if that does not verify either, every
    /// combination of up to `nparity` suspect columns is rebuilt in turn until one verifies
    /// (combinatorial reconstruction). Columns found wrong are rewritten and counted, except
    /// on a leaf that missed the block's birth txg (`birth`, where the caller knows it).
    pub fn read_verified(
        &self,
        offset: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        birth: Option<u64>,
    ) -> Result<ReadReport, VdevError> {
        Ok(self.read(offset, buf, verify, birth, How::Verified)?.0)
    }

    /// As `read_verified`, but speculative (`TopVdev::read_speculative`): the columns that
    /// held other bytes than the block that verified, and those that could not be read, are
    /// returned rather than counted and rewritten. A torn block (some columns written when a
    /// crash came, others not) rebuilt from the rest is no device's fault.
    pub fn read_speculative(
        &self,
        offset: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Unsettled, VdevError> {
        Ok(self.read(offset, buf, verify, None, How::Speculative)?.1)
    }

    /// Counts and rewrites the columns a speculative read of the block `good` at `offset`
    /// left (`TopVdev::settle`).
    pub fn settle(&self, offset: u64, good: &[u8], unsettled: &Unsettled) -> ReadReport {
        let map = self.geom.map(offset, good.len() as u64);
        let parity = self.parity(&map, good);
        let mut report = ReadReport::default();
        self.mend(&map, good, &parity, unsettled, None, &mut report);
        report
    }

    /// As `read_verified`, but a scrub's read of a block born in txg `birth`: parity is read
    /// and checked against the data even when the data verifies, and wrong parity is
    /// rewritten and counted (not counted on a leaf that missed `birth`).
    pub fn scrub(
        &self,
        offset: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        birth: u64,
    ) -> Result<ReadReport, VdevError> {
        Ok(self.read(offset, buf, verify, Some(birth), How::Scrub)?.0)
    }

    /// The read of a block; a speculative one returns the columns found wrong, untouched
    /// (with nothing counted but failed reads), every other kind returns them settled.
    fn read(
        &self,
        offset: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        birth: Option<u64>,
        how: How,
    ) -> Result<(ReadReport, Unsettled), VdevError> {
        let scrub = how == How::Scrub;
        let map = self.geom.map(offset, buf.len() as u64);
        let np = map.nparity;
        let data_lens = map.data_lens();
        let mut reads = ColumnRead {
            failed: Vec::new(),
            errors: Vec::new(),
        };
        {
            let mut bufs: Vec<&mut [u8]> = std::iter::repeat_with(Default::default)
                .take(np)
                .chain(split_lens_mut(buf, &data_lens))
                .collect();
            let which: Vec<usize> = (np..map.cols.len()).collect();
            self.read_columns(&map, &which, &mut bufs, &mut reads);
        }
        let data_ok = reads.failed.is_empty() && verify(buf);
        if data_ok && !scrub {
            return Ok(Default::default());
        }
        // The slow path: bring in parity and rebuild.
        let mut parity: Vec<Vec<u8>> = vec![vec![0u8; map.parity_len()]; np];
        {
            let mut bufs: Vec<&mut [u8]> = parity
                .iter_mut()
                .map(|p| &mut p[..])
                .chain(std::iter::repeat_with(Default::default).take(data_lens.len()))
                .collect();
            let which: Vec<usize> = (0..np).collect();
            self.read_columns(&map, &which, &mut bufs, &mut reads);
        }
        let mut report = ReadReport {
            io_errors: reads.failed.len() as u32,
            ..ReadReport::default()
        };
        if reads.failed.len() > np {
            assert_eq!(
                reads.errors.len(),
                reads.failed.len(),
                "an error per failed column"
            );
            return Err(VdevError::ColumnsUnreadable {
                nparity: np,
                of: map.cols.len(),
                errors: reads.errors,
            });
        }
        // What the columns held as read, to restore between attempts and to find which ones
        // were wrong once the block verifies.
        let orig = AsRead {
            data: buf.to_vec(),
            parity: parity.clone(),
        };
        if data_ok {
            // A scrub of a good block: only the parity can be wrong, or unread (its device out
            // of service, or failing). There is nothing to rebuild; the parity is recomputed
            // from the data and rewritten where it differs or failed. (Sent on to the search
            // below, a block whose parity alone failed was called damaged: no combination of
            // data columns was left to try.)
            self.repair(&map, buf, &orig, &reads.failed, birth, &mut report);
            return Ok((report, Unsettled::default()));
        }
        let known: Vec<usize> = reads.failed.clone();
        let suspects: Vec<usize> = (0..map.cols.len()).filter(|i| !known.contains(i)).collect();
        let attempt = |missing: &[usize], buf: &mut [u8], parity: &mut [Vec<u8>]| -> bool {
            // Rebuilding only parity cannot change the data: nothing to try.
            if !missing.iter().any(|&i| i >= np) {
                return false;
            }
            let mut prefs: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
            let mut drefs = split_lens_mut(buf, &data_lens);
            if self
                .codec
                .reconstruct(&mut prefs, &mut drefs, missing)
                .is_err()
            {
                return false;
            }
            if verify(buf) {
                return true;
            }
            buf.copy_from_slice(&orig.data);
            for (p, o) in parity.iter_mut().zip(&orig.parity) {
                p.copy_from_slice(o);
            }
            false
        };
        let mut found = attempt(&known, buf, &mut parity);
        for extra in 1..=(np - known.len()) {
            if found {
                break;
            }
            found = any_combination(&suspects, extra, &mut |combo| {
                let mut missing = known.clone();
                missing.extend_from_slice(combo);
                attempt(&missing, buf, &mut parity)
            });
        }
        if !found {
            return Err(VdevError::Damaged {
                nparity: np,
                errors: reads.errors,
            });
        }
        if how == How::Speculative {
            let parity = self.parity(&map, buf);
            return Ok((
                report,
                Self::wrong_columns(&map, buf, &parity, &orig, &known),
            ));
        }
        self.repair(&map, buf, &orig, &known, birth, &mut report);
        Ok((report, Unsettled::default()))
    }

    /// After a block verified: recomputes its parity, compares every column with what was
    /// read, and rewrites the ones that differ or failed (a column that read fine but held
    /// the wrong bytes counts a checksum error against its leaf, unless that leaf missed the
    /// block's `birth`).
    fn repair(
        &self,
        map: &StripeMap,
        good: &[u8],
        orig: &AsRead,
        failed: &[usize],
        birth: Option<u64>,
        report: &mut ReadReport,
    ) {
        let parity = self.parity(map, good);
        let wrong = Self::wrong_columns(map, good, &parity, orig, failed);
        self.mend(map, good, &parity, &wrong, birth, report);
    }

    /// The columns of the block `good` (whose parity is `parity`) that failed to read (the
    /// indexes in `failed`) or were read (`orig`) holding other bytes.
    fn wrong_columns(
        map: &StripeMap,
        good: &[u8],
        parity: &[Vec<u8>],
        orig: &AsRead,
        failed: &[usize],
    ) -> Unsettled {
        let lens = map.data_lens();
        let good_cols = parity.iter().map(|p| &p[..]).chain(split_lens(good, &lens));
        let read_cols = orig
            .parity
            .iter()
            .map(|p| &p[..])
            .chain(split_lens(&orig.data, &lens));
        let mut wrong = Unsettled::default();
        for (i, (g, r)) in good_cols.zip(read_cols).enumerate() {
            if failed.contains(&i) {
                wrong.unread.push(i);
            } else if g != r {
                wrong.mismatched.push(i);
            }
        }
        wrong
    }

    /// Rewrites the columns `wrong` names with those of the block `good` (whose parity is
    /// `parity`), counting a checksum error for each that read without error, unless its
    /// leaf missed the block's `birth`.
    fn mend(
        &self,
        map: &StripeMap,
        good: &[u8],
        parity: &[Vec<u8>],
        wrong: &Unsettled,
        birth: Option<u64>,
        report: &mut ReadReport,
    ) {
        let good_cols: Vec<&[u8]> = parity
            .iter()
            .map(|p| &p[..])
            .chain(split_lens(good, &map.data_lens()))
            .collect();
        let columns = wrong.mismatched.iter().map(|&i| (i, true));
        for (i, mismatched) in columns.chain(wrong.unread.iter().map(|&i| (i, false))) {
            let c = &map.cols[i];
            let Some(leaf) = &self.slots[c.child] else {
                continue;
            };
            if mismatched && leaf.count_mismatch(birth) {
                report.cksum_errors += 1;
            }
            if leaf.is_read_only() {
                continue;
            }
            match leaf.write_data(good_cols[i], c.offset) {
                Ok(()) => {
                    leaf.counters
                        .repaired_bytes
                        .fetch_add(c.len as u64, Ordering::Relaxed);
                    report.repaired_bytes += c.len as u64;
                }
                Err(e) => {
                    self.fail(leaf, &e, &leaf.counters.write_errors);
                    leaf.repair_failed(&e, birth);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_cover_their_allocation_exactly() {
        for width in 3..=12u64 {
            for np in 1..=3u64 {
                if width <= np + 1 {
                    continue;
                }
                let g = RaidzGeom::new(width as usize, np as u32);
                for s in 1..=40u64 {
                    for b in [0u64, 1, width - 1, width, 7 * width + 3] {
                        let map = g.map(b * SECTOR, s * SECTOR);
                        // Every vdev sector the stripe touches, in the linear address space.
                        let mut sectors: Vec<u64> = map
                            .cols
                            .iter()
                            .flat_map(|c| {
                                let first = c.offset / SECTOR * width + c.child as u64;
                                (0..c.len as u64 / SECTOR).map(move |k| first + k * width)
                            })
                            .collect();
                        sectors.sort();
                        let expect: Vec<u64> = (b..b + g.sectors(s * SECTOR)).collect();
                        assert_eq!(sectors, expect, "width {width} np {np} s {s} b {b}");
                        assert!(g.asize(s * SECTOR) >= g.sectors(s * SECTOR) * SECTOR);
                        assert_eq!(g.asize(s * SECTOR) / SECTOR % (np + 1), 0);
                        let data: usize = map.data_lens().iter().sum();
                        assert_eq!(data as u64, s * SECTOR);
                        assert!(map.cols.iter().all(|c| c.len <= map.parity_len()));
                        let mut children: Vec<usize> = map.cols.iter().map(|c| c.child).collect();
                        children.sort();
                        children.dedup();
                        assert_eq!(children.len(), map.cols.len(), "two columns on one child");
                    }
                }
            }
        }
    }

    #[test]
    fn small_blocks_take_one_row() {
        let g = RaidzGeom::new(6, 2);
        // 4K: one data sector and two parity sectors, rounded to 3.
        assert_eq!(g.asize(4096), 3 * 4096);
        // 16K over 4 data columns: one row of 6.
        assert_eq!(g.asize(16384), 6 * 4096);
        // 128K: 32 data sectors in 8 rows, 16 parity sectors: 48.
        assert_eq!(g.asize(131072), 48 * 4096);
        let m = g.map(4096 * 5, 8192);
        assert_eq!(m.cols.len(), 4);
        assert_eq!(m.cols[0].child, 5);
        assert_eq!(
            m.cols[1],
            Column {
                child: 0,
                offset: 4096,
                len: 4096
            }
        );
    }

    #[test]
    fn configs_check_their_shape() {
        assert!(matches!(
            RaidzConfig::new(2, 3, false),
            Err(ShapeError::Width { min: 4, got: 3, .. })
        ));
        assert!(matches!(
            RaidzConfig::new(1, 2, false),
            Err(ShapeError::Width { .. })
        ));
        assert!(matches!(
            RaidzConfig::new(3, 25, false),
            Err(ShapeError::Width { .. })
        ));
        assert_eq!(
            RaidzConfig::new(3, 6, true),
            Err(ShapeError::RdpIsDoubleParity)
        );
        assert_eq!(RaidzConfig::new(4, 6, false), Err(ShapeError::Parity(4)));
        assert_eq!(RaidzConfig::new(1, 3, true).unwrap().code, RaidzCode::Xor);
        assert_eq!(RaidzConfig::new(2, 6, false).unwrap().code, RaidzCode::Rs);
        let rdp = RaidzConfig::new(2, 6, true).unwrap();
        assert!(matches!(rdp.code, RaidzCode::Rdp { p } if p as usize >= 5));
        let json = serde_json::to_string(&rdp).unwrap();
        assert_eq!(serde_json::from_str::<RaidzConfig>(&json).unwrap(), rdp);
    }
}
