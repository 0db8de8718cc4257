//! The I/O pipeline between objects and devices. Write: checksum → allocate → issue to every
//! copy; read: issue → verify against the parent's checksum → on failure try the other copies,
//! and rewrite the bad ones from a good one (self-healing).
//!
//! Architecture invariant: `zio` is the only layer that turns block pointers into device I/O;
//! above it, blocks are addressed only by `BlkPtr`.

mod bounce;
pub mod compress;
pub mod gang;
mod helper;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use self::compress::Compression;
use crate::spa::{AllocClass, AllocError, Allocator, BlkPtr, BlockKind, Dva, Dvas, SpaceGauge};
use crate::vdev::{ReadReport, TopVdev, VdevError, SECTOR};
use zeta_math::{Checksum, ChecksumKind};

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

impl ZioError {
    /// A block that cannot be had because its pointer is impossible (`detail` says how): as
    /// a read that no copy could supply.
    pub fn impossible(bp: &BlkPtr, detail: String) -> ZioError {
        unrecoverable(bp, detail)
    }
}

/// Why a copy's address (DVA) is not one a writer could have made: damage, or a crafted
/// pool image.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadDva {
    #[error("copy on unknown vdev {0}")]
    UnknownVdev(u32),
    #[error(
        "copy at vdev {vdev} offset {off} takes {asize} bytes, not the {expected} a block of \
         {psize} bytes takes there"
    )]
    WrongSize {
        vdev: u32,
        off: u64,
        asize: u64,
        expected: u64,
        psize: usize,
    },
    #[error("copy at vdev {vdev} offset {off} is out of range (data area of {end} bytes)")]
    OutOfRange { vdev: u32, off: u64, end: u64 },
}

/// Properties of a block to write.
#[derive(Clone, Copy, Debug)]
pub struct WriteProps {
    pub kind: BlockKind,
    pub level: u8,
    pub checksum: ChecksumKind,
    pub copies: usize,
    pub class: AllocClass,
    /// How data blocks are stored (`compress`); metadata is written raw.
    pub compress: Compression,
}

#[derive(Default, Debug)]
pub struct ZioStats {
    pub blocks_written: AtomicU64,
    pub bytes_written: AtomicU64,
    pub blocks_read: AtomicU64,
    pub repaired_bytes: AtomicU64,
    /// Changes to blocks a sync could not make, each lost: patched blocks
    /// (`dmu::object::Dirty::Patch`) no copy of whose old contents verified (each kept its
    /// damaged copy), and changes to blocks under an indirect block that could not be read
    /// (no copy verified, or its pointer was impossible), which kept their old pointers.
    pub lost_writes: AtomicU64,
    /// Copies whose free was refused: named by a block pointer no writer made (outside its
    /// vdev, or of space not allocated as such). Their space, if in use, is leaked.
    pub refused_frees: AtomicU64,
}

/// How a refused free of a copy of `bp` is reported.
fn refused_free(bp: &BlkPtr, e: String) -> String {
    format!("free of a block born in txg {}: {e}", bp.birth_txg.get())
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

/// What a read needs to check each copy of a block: the copy's size and a verifier. A copy
/// is the block itself, checked against its checksum, or for a gang block (`gang`) a copy of
/// its header, checked as one (the pieces, and the whole, are checked as they are read).
fn verifier(bp: &BlkPtr) -> Result<(usize, impl Fn(&[u8]) -> bool), ZioError> {
    let Some(kind) = bp.checksum_kind() else {
        return Err(unrecoverable(
            bp,
            format!("unknown checksum algorithm {}", bp.checksum_kind),
        ));
    };
    // Every block is written whole sectors long: another size comes only from a pointer no
    // writer made, and would reach layouts that assume a sector at least (a raidz of a
    // block under 4 KiB has no columns).
    let psize = bp.psize.get() as u64;
    if psize == 0 || !psize.is_multiple_of(SECTOR) {
        return Err(unrecoverable(
            bp,
            format!("impossible size of {psize} bytes"),
        ));
    }
    // What a read decompresses into must be a size a writer makes: the stored size for a
    // block stored as it is, more than it for a compressed one, and at most the largest
    // block (a crafted pointer must not have a read allocate gigabytes).
    let lsize = bp.lsize.get() as u64;
    let Some(codec) = compress::codec_name(bp.compression) else {
        let why = format!("unknown compression {}", bp.compression);
        return Err(unrecoverable(bp, why));
    };
    let sane = match bp.compression {
        compress::BP_OFF => lsize == psize,
        _ => lsize > psize && lsize.is_multiple_of(SECTOR) && lsize <= MAX_BLOCK_BYTES,
    };
    if !sane {
        let why = format!("impossible sizes: {lsize} bytes stored in {psize} ({codec})");
        return Err(unrecoverable(bp, why));
    }
    let expected = bp.checksum();
    let gang = bp.is_gang().then_some(*bp);
    let copy_size = if gang.is_some() {
        gang::HEADER_BYTES
    } else {
        psize as usize
    };
    Ok((copy_size, move |b: &[u8]| match &gang {
        Some(g) => gang::parse(g, b).is_ok(),
        None => kind.compute(b) == expected,
    }))
}

/// The largest block a writer makes (a volume's largest block size); a compressed pointer
/// that claims more is refused before a read allocates room for it.
pub const MAX_BLOCK_BYTES: u64 = 1 << 20;

/// The logical bytes of a block from its verified stored bytes: as they are, or
/// decompressed (`compress::decompress`). Stored bytes that verify but do not decompress are
/// a bug or a crafted pool: an error for this block, never a panic.
fn decode(bp: &BlkPtr, stored: Vec<u8>) -> Result<Vec<u8>, ZioError> {
    if bp.compression == compress::BP_OFF {
        return Ok(stored);
    }
    let mut out = vec![0u8; bp.lsize.get() as usize];
    decode_into(bp, &stored, &mut out)?;
    Ok(out)
}

/// `decode` into the caller's buffer of the block's `lsize`.
fn decode_into(bp: &BlkPtr, stored: &[u8], out: &mut [u8]) -> Result<(), ZioError> {
    compress::decompress(bp.compression, stored, out).map_err(|e| {
        unrecoverable(
            bp,
            format!("its stored bytes verify but do not decompress: {e}"),
        )
    })
}

/// Whether the assembled bytes of a gang block are the block its pointer names.
fn whole_checks(bp: &BlkPtr, bytes: &[u8]) -> bool {
    bp.checksum_kind().is_some_and(|k| {
        bytes.len() == bp.psize.get() as usize && k.compute(bytes) == bp.checksum()
    })
}

/// The bytes of gang block `bp` whose verified header is `header`: each piece it names, had
/// by `piece`, in order, and the whole verified against `bp`'s checksum.
fn assemble(
    bp: &BlkPtr,
    header: &[u8],
    mut piece: impl FnMut(&BlkPtr) -> Result<Vec<u8>, ZioError>,
) -> Result<Vec<u8>, ZioError> {
    let pieces = gang::parse(bp, header).map_err(|e| unrecoverable(bp, e))?;
    let mut whole = Vec::with_capacity(bp.psize.get() as usize);
    for p in &pieces {
        whole.extend_from_slice(&piece(p)?);
    }
    if !whole_checks(bp, &whole) {
        let why = "its gang pieces verify, but not as the whole block";
        return Err(unrecoverable(bp, why.into()));
    }
    Ok(whole)
}

impl Zio {
    /// The vdev holding copy `d` of a block of `psize` bytes, if the DVA is one a writer
    /// could have made: on a data vdev of the pool, sector-aligned, taking what a block of
    /// that size takes there (`TopVdev::asize_of`), and within the vdev's data area (what
    /// its metaslabs cover: not the log reserve after it, nor past the end). Block pointers
    /// come from disk, checksummed only by their parents, and a pool image can be crafted
    /// whole: every read, repair and free asks this before it lets a DVA near a device or
    /// the allocator, so an impossible one is damage, never an index out of bounds.
    fn vdev_of(&self, d: &Dva, psize: usize) -> Result<&TopVdev, BadDva> {
        let (vdev, off) = (d.vdev.get(), d.offset.get());
        let (Some(top), Some(&end)) = (
            self.tops.get(vdev as usize),
            self.data_end.get(vdev as usize),
        ) else {
            return Err(BadDva::UnknownVdev(vdev));
        };
        let expected = top.asize_of(psize as u64);
        if d.asize.get() as u64 != expected {
            return Err(BadDva::WrongSize {
                vdev,
                off,
                asize: d.asize.get() as u64,
                expected,
                psize,
            });
        }
        if !off.is_multiple_of(SECTOR) || off.checked_add(expected).is_none_or(|e| e > end) {
            return Err(BadDva::OutOfRange { vdev, off, end });
        }
        Ok(top)
    }

    /// `vdev_of` for every copy of `bp` (and its size, `verifier`): the copies that a free
    /// may hand to the allocator, in order, with an error for each of the others (no
    /// allocation for a block whose copies are all sane, as a txg frees thousands).
    fn sane_copies<'a>(&self, bp: &'a BlkPtr) -> ([Option<&'a Dva>; 3], Vec<String>) {
        let mut good = [None; 3];
        let psize = match verifier(bp) {
            Ok((psize, _)) => psize,
            Err(e) => return (good, vec![e.to_string()]),
        };
        let mut bad = Vec::new();
        for (slot, d) in good.iter_mut().zip(bp.dvas()) {
            match self.vdev_of(d, psize) {
                Ok(_) => *slot = Some(d),
                Err(e) => bad.push(e.to_string()),
            }
        }
        (good, bad)
    }

    /// Notes frees refused (`Allocator::check_free`, `vdev_of`): each is counted in
    /// `ZioStats::refused_frees`, and the first `MAX_REFUSED` are kept (`refused_frees`).
    fn refused(&self, errors: impl IntoIterator<Item = String>) {
        let mut errors = errors.into_iter().peekable();
        if errors.peek().is_none() {
            return; // not a lock per free
        }
        let mut kept = self.refused.lock();
        for e in errors {
            self.stats.refused_frees.fetch_add(1, Ordering::Relaxed);
            if kept.len() < MAX_REFUSED {
                kept.push(e);
            }
        }
    }

    /// Notes space leaked for a reason other than a refused free (blocks under an indirect
    /// block that could not be read, whose object is destroyed), with the refused frees.
    pub fn leaked(&self, what: String) {
        self.refused([what]);
    }

    /// The first frees refused since the pool was opened (up to `MAX_REFUSED`; all are
    /// counted in `ZioStats::refused_frees`): copies named by block pointers that no writer
    /// made, whose space (if any is in use) stays allocated rather than be freed twice.
    pub fn refused_frees(&self) -> Vec<String> {
        self.refused.lock().clone()
    }
}

/// Refused frees kept for `Zio::refused_frees`.
const MAX_REFUSED: usize = 16;

/// The most bytes of adjacent blocks `write_batch` and `read_batch_into` send to a device as one
/// request: large enough that a 1 MiB stream costs one system call (figures:
/// docs/perf/volume.md, "Why a device request is at most 1 MiB"), small enough that a longer
/// read splits into pieces that proceed in parallel.
pub const MAX_RUN_BYTES: usize = 1 << 20;

/// `read_batch_into` cuts a batch of at least this many bytes into two runs or more, which
/// the caller and the zio helper thread claim in turn (`helper::share`), and reads a smaller
/// one on the calling thread alone. A 1 MiB streaming read then costs about a copy and a
/// checksum of half a megabyte on each core. Handed to a rayon worker instead, half of it
/// waited for the worker's core to wake, and cut into four runs rather than two it cost
/// twice the system calls (figures: docs/perf/volume.md, "Why a streaming read shares its
/// runs with the zio helper thread").
const PARALLEL_READ_BYTES: usize = 512 << 10;

/// A batch of at least this many bytes is compressed by the caller and the zio helper thread
/// together (`compress_all`): lz4 runs at a few hundred MB/s a core on data that compresses,
/// far below what a device takes, and a 64K batch is already several times the helper's
/// wake-up.
const PARALLEL_COMPRESS_BYTES: usize = 64 << 10;

/// Each block of a batch compressed as `c` asks (`compress::compress`), on two cores where
/// the batch is large enough.
fn compress_all(c: Compression, blocks: &[&[u8]]) -> Vec<Option<compress::Compressed>> {
    let bytes: usize = blocks.iter().map(|b| b.len()).sum();
    if blocks.len() < 2 || bytes < PARALLEL_COMPRESS_BYTES {
        return blocks.iter().map(|d| compress::compress(c, d)).collect();
    }
    let next = AtomicUsize::new(0);
    let out: Vec<Mutex<Option<compress::Compressed>>> =
        blocks.iter().map(|_| Mutex::new(None)).collect();
    helper::share(&|| loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(d) = blocks.get(i) else {
            return;
        };
        *out[i].lock() = compress::compress(c, d);
    });
    out.into_iter().map(Mutex::into_inner).collect()
}

/// The copies of `bps`, first copies first, each in the blocks' order: the order in which a
/// batch allocated them, so adjacent ones come together.
fn copies_in_order<'a>(
    bps: impl IntoIterator<Item = &'a BlkPtr, IntoIter: Clone>,
) -> impl Iterator<Item = &'a Dva> {
    let bps = bps.into_iter();
    (0..3).flat_map(move |c| {
        bps.clone()
            .map(move |bp| &bp.dva[c])
            .filter(|d| !d.is_empty())
    })
}

/// A run of blocks whose copies lie one after another on a vdev, from the offset: always
/// consecutive blocks of a batch, so a slice of it (no vector to gather them).
type WriteRun<'a> = (u64, &'a [&'a [u8]]);

/// A block of a batch being written as a gang block: its header, and its pieces' pointers
/// and bytes.
struct Gang<'a> {
    header: Vec<u8>,
    /// The header's copies.
    copies: Vec<Dva>,
    pieces: Vec<BlkPtr>,
    bytes: Vec<&'a [u8]>,
}

impl<'a> Gang<'a> {
    /// Makes `bp` (summed over `data`; its copies are the header's) a gang block of
    /// `pieces`, each a block pointer of the next bytes of `data`, and builds its header.
    fn new(bp: &mut BlkPtr, data: &'a [u8], pieces: Vec<(Dvas, u64)>) -> Gang<'a> {
        let kind = bp.checksum_kind().expect("a written block's algorithm");
        let mut at = 0usize;
        let mut ptrs = Vec::with_capacity(pieces.len());
        let mut bytes = Vec::with_capacity(pieces.len());
        let mut asize: u64 = bp.dvas().map(|d| d.asize.get() as u64).sum();
        for (dvas, len) in pieces {
            let piece = &data[at..at + len as usize];
            at += len as usize;
            let mut p = *bp;
            p.dva = dvas.slots();
            p.lsize = (len as u32).into();
            p.psize = (len as u32).into();
            // A piece is part of the stored bytes, compressed or not: stored as it is.
            p.compression = compress::BP_OFF;
            p.checksum = kind.compute(piece).0;
            asize += p.asize_total();
            ptrs.push(p);
            bytes.push(piece);
        }
        assert_eq!(at, data.len(), "the pieces hold the block");
        bp.flags |= crate::spa::bp::BP_GANG;
        bp.gang_asize = asize.into();
        Gang {
            header: gang::header(bp, &ptrs),
            copies: bp.dvas().copied().collect(),
            pieces: ptrs,
            bytes,
        }
    }
}

/// The end of a run of adjacent blocks being gathered into one request.
struct RunEnd {
    vdev: u32,
    /// Where the next block must start to join the run.
    end: u64,
    bytes: usize,
}

impl RunEnd {
    /// A run that begins with the copy `d` of a block of `len` bytes. The next block's copy
    /// must begin where this one's allocation ends (`d.asize`: on a raidz, its parity and
    /// padding too).
    fn at(d: &Dva, len: usize) -> RunEnd {
        RunEnd {
            vdev: d.vdev.get(),
            end: d.offset.get() + d.asize.get() as u64,
            bytes: len,
        }
    }

    /// Takes a block of `len` bytes at `d` into the run if it lies right after it on the
    /// same vdev and the run stays within `MAX_RUN_BYTES`.
    fn extend(&mut self, d: &Dva, len: usize) -> bool {
        self.extend_within(d, len, MAX_RUN_BYTES)
    }

    /// `extend`, for a run of at most `limit` bytes.
    fn extend_within(&mut self, d: &Dva, len: usize, limit: usize) -> bool {
        let joins =
            d.vdev.get() == self.vdev && d.offset.get() == self.end && self.bytes + len <= limit;
        if joins {
            self.end += d.asize.get() as u64;
            self.bytes += len;
        }
        joins
    }
}

pub struct Zio {
    pub tops: Vec<Arc<TopVdev>>,
    pub alloc: Mutex<Allocator>,
    /// `alloc`'s space counters, read without its lock.
    pub gauge: Arc<SpaceGauge>,
    pub stats: ZioStats,
    /// Asked when a batch of txg `txg` found no room on its devices (`RoomWait`).
    room_wait: std::sync::OnceLock<RoomWait>,
    /// Where each data vdev's data area ends (its metaslabs'; the log reserve follows).
    data_end: Vec<u64>,
    /// The first frees refused (`refused_frees`).
    refused: Mutex<Vec<String>>,
    ganging: Ganging,
}

/// Whether a batch of blocks of txg `txg` whose write found no room on its devices
/// (`VdevError::out_of_space`: the file system under file vdevs is full) waits a while and
/// is written again (`true`), or fails (`false`). The pool waits with the txg it is
/// committing: the same blocks go to the same places once room is made, and nothing of the
/// txg has to be undone (`dsl::pool`'s `wait_for_room`).
pub type RoomWait = Box<dyn Fn(u64, &VdevError) -> bool + Send + Sync>;

impl Zio {
    pub fn new(tops: Vec<Arc<TopVdev>>, alloc: Allocator) -> Zio {
        let data_end = alloc.tops.iter().map(|t| t.data_end()).collect();
        Zio {
            tops,
            data_end,
            refused: Mutex::new(Vec::new()),
            gauge: alloc.gauge(),
            alloc: Mutex::new(alloc),
            stats: ZioStats::default(),
            room_wait: std::sync::OnceLock::new(),
            ganging: Ganging::default(),
        }
    }

    /// Sets what a write that found no room does (`RoomWait`); without it, it fails.
    pub fn set_room_wait(&self, wait: RoomWait) {
        let _ = self.room_wait.set(wait);
    }

    /// Writes one block copy-on-write to newly allocated space and returns its pointer, whose
    /// `fill` counts the data blocks below it. `data.len()` must be a whole number of sectors.
    pub fn write(
        &self,
        data: &[u8],
        props: WriteProps,
        txg: u64,
        fill: u64,
    ) -> Result<BlkPtr, ZioError> {
        let mut bp = self.write_batch(&[data], props, txg)?[0];
        bp.fill = fill.into();
        Ok(bp)
    }

    /// Writes many blocks of one kind at once, each copy-on-write to new space, and returns
    /// their pointers in order: `write` for a batch. The space is taken in order under one
    /// allocator lock (so blocks written together lie together), and blocks that land next
    /// to each other go to each device as one request of up to `MAX_RUN_BYTES`. Everything
    /// runs on the calling thread. Any block failing fails the batch.
    pub fn write_batch(
        &self,
        blocks: &[&[u8]],
        props: WriteProps,
        txg: u64,
    ) -> Result<Vec<BlkPtr>, ZioError> {
        self.write_batch_summed(blocks, &[], props, txg)
    }

    /// `write_batch` with the checksums of some blocks already known, in `props.checksum`'s
    /// algorithm (`sums[i]` for `blocks[i]`; where `None` or past the end of `sums`, computed
    /// here): a patched block's sums follow from its old ones and its pieces.
    pub fn write_batch_summed(
        &self,
        blocks: &[&[u8]],
        sums: &[Option<Checksum>],
        props: WriteProps,
        txg: u64,
    ) -> Result<Vec<BlkPtr>, ZioError> {
        self.write_blocks(blocks, sums, props, txg, false)
    }

    /// `write_batch`, returning once every copy survives a crash without a flush of the
    /// devices (`TopVdev::write_run_durable`): blocks an intent log record is about to point
    /// at. A flush would also wait for everything else written to the devices since the last
    /// one, a txg's writeback included.
    pub fn write_batch_durable(
        &self,
        blocks: &[&[u8]],
        props: WriteProps,
        txg: u64,
    ) -> Result<Vec<BlkPtr>, ZioError> {
        self.write_blocks(blocks, &[], props, txg, true)
    }

    fn write_blocks(
        &self,
        blocks: &[&[u8]],
        sums: &[Option<Checksum>],
        props: WriteProps,
        txg: u64,
        durable: bool,
    ) -> Result<Vec<BlkPtr>, ZioError> {
        for d in blocks {
            assert!(
                !d.is_empty() && (d.len() as u64).is_multiple_of(SECTOR),
                "unaligned block of {} bytes",
                d.len()
            );
        }
        // Compressed first: the checksum covers the stored bytes (`compress`). A block that
        // does not save a sector is stored as it is.
        let compressed: Vec<Option<compress::Compressed>> = match props.compress {
            Compression::Off => Vec::new(),
            c => compress_all(c, blocks),
        };
        let packed = |i: usize| compressed.get(i).and_then(Option::as_ref);
        let logical = blocks;
        let stored: Vec<&[u8]> = (logical.iter().enumerate())
            .map(|(i, d)| packed(i).map_or(*d, |z| z.bytes.as_slice()))
            .collect();
        let blocks: &[&[u8]] = &stored;
        // The pointers first, each with its checksum; the copies' addresses follow.
        let bytes: usize = blocks.iter().map(|d| d.len()).sum();
        let pointer = |i: usize, data: &[u8]| {
            let mut bp = BlkPtr::HOLE;
            bp.lsize = (logical[i].len() as u32).into();
            bp.psize = (data.len() as u32).into();
            bp.compression = packed(i).map_or(compress::BP_OFF, |z| z.codec);
            bp.birth_txg = txg.into();
            bp.fill = 1.into();
            bp.checksum_kind = props.checksum as u8;
            bp.level = props.level;
            bp.kind = props.kind as u8;
            // A known sum is of the logical bytes: of no use for a block stored compressed.
            let known = sums
                .get(i)
                .copied()
                .flatten()
                .filter(|_| packed(i).is_none());
            bp.checksum = known.unwrap_or_else(|| props.checksum.compute(data)).0;
            bp
        };
        // All on the calling thread, as are the writes below (see the comment there).
        let mut bps: Vec<BlkPtr> = blocks
            .iter()
            .enumerate()
            .map(|(i, d)| pointer(i, d))
            .collect();
        // A txg sync's block may gang where no segment takes it whole (`gang`); forced
        // above a size, for tests.
        let may_gang = props.class == AllocClass::Recorded
            && !durable
            && self.ganging.allowed.load(Ordering::Acquire);
        let force_above = match may_gang {
            true => self.ganging.force_above.load(Ordering::Acquire),
            false => u64::MAX,
        };
        // Per gang block: its index, and each piece's copies and bytes.
        let mut ganged: Vec<(usize, Vec<(Dvas, u64)>)> = Vec::new();
        {
            let mut alloc = self.alloc.lock();
            let asize_of = |v: u32, psize: u64| self.tops[v as usize].asize_of(psize);
            // Blocks of one size with one copy each (a volume's write, a level of indirect
            // blocks): one extent if the active metaslab has it.
            let psize = blocks.first().map_or(0, |d| d.len());
            let run = (props.copies == 1
                && blocks.len() > 1
                && blocks.iter().all(|d| d.len() == psize)
                && psize as u64 <= force_above)
                .then(|| alloc.alloc_run(psize as u64, blocks.len(), props.class, &asize_of))
                .flatten();
            if let Some((v, off, asize)) = run {
                for (i, bp) in bps.iter_mut().enumerate() {
                    bp.dva[0] = Dva::new(v, off + i as u64 * asize, asize as u32);
                }
            } else {
                for i in 0..bps.len() {
                    let psize = bps[i].psize.get() as u64;
                    let whole = match psize > force_above {
                        true => Err(AllocError::NoSpace(psize)),
                        false => alloc.alloc_sized(psize, props.copies, props.class, &asize_of),
                    };
                    let placed = match whole {
                        Ok(d) => Ok(d),
                        Err(_) if may_gang => gang::allocate(
                            &mut alloc,
                            psize,
                            force_above.min(psize / 2),
                            props.copies,
                            props.class,
                            &asize_of,
                            txg,
                        )
                        .map(|(header, pieces)| {
                            ganged.push((i, pieces));
                            header
                        }),
                        Err(e) => Err(e),
                    };
                    match placed {
                        Ok(d) => bps[i].dva = d.slots(),
                        Err(e) => {
                            // Give back what this batch took (freed in this txg, like any
                            // block the txg allocated and then dropped): none of it was
                            // written.
                            let pieces = ganged.iter().flat_map(|(_, p)| p.iter());
                            let copies = copies_in_order(&bps[..i])
                                .chain(pieces.flat_map(|(d, _)| d.iter()));
                            let refused = alloc.free_all(copies, txg, props.class);
                            assert!(refused.is_empty(), "{refused:?}");
                            return Err(e.into());
                        }
                    }
                }
            }
        }
        // Each gang block's pieces as blocks of their own, and its header (`gang`).
        let gangs: Vec<Gang> = (ganged.into_iter())
            .map(|(i, pieces)| Gang::new(&mut bps[i], blocks[i], pieces))
            .collect();
        // Runs of adjacent copies, each with its vdev; a run never spans two copies of the
        // batch, so it is a slice of `blocks`. A gang block's copies are its header's,
        // written apart below.
        let mut runs: Vec<(usize, WriteRun)> = Vec::new();
        for copy in 0..props.copies {
            let mut open: Option<(RunEnd, usize)> = None;
            for (i, (bp, &data)) in bps.iter().zip(blocks).enumerate() {
                if bp.is_gang() {
                    open = None;
                    continue;
                }
                let dva = bp.dva[copy];
                let joined = open
                    .as_mut()
                    .and_then(|(end, first)| end.extend(&dva, data.len()).then_some(*first));
                if let Some(first) = joined {
                    runs.last_mut().expect("a run is open").1 .1 = &blocks[first..=i];
                } else {
                    open = Some((RunEnd::at(&dva, data.len()), i));
                    runs.push((dva.vdev.get() as usize, (dva.offset.get(), &blocks[i..=i])));
                }
            }
        }
        // Any copy failing fails the batch: the caller's txg cannot commit a pointer to a copy that
        // may hold garbage. Every run is written by the calling thread, in turn. Within a txg sync,
        // handing the checksums and the vdevs' runs to rayon gained nothing measurable on an idle
        // machine (`zeta bench vol`, `zeta bench raidz`: within noise) and cost a loaded one
        // dearly: each hand-over woke the pool's workers, which then yielded their cores many
        // times each before sleeping (figures: docs/perf/intent-log.md, "Why a txg sync writes its
        // runs on its own thread, not through rayon").
        let write = |v: usize, off: u64, bufs: &[&[u8]]| {
            if durable {
                self.tops[v].write_run_durable(off, bufs, Some(txg))
            } else {
                self.tops[v].write_run(off, bufs, Some(txg))
            }
        };
        let write_all = || -> Result<(), VdevError> {
            for (v, (off, bufs)) in &runs {
                write(*v, *off, bufs)?;
            }
            // A gang block's copies of its header, then of each piece.
            for g in &gangs {
                for d in &g.copies {
                    write(d.vdev.get() as usize, d.offset.get(), &[&g.header])?;
                }
                for (p, bytes) in g.pieces.iter().zip(&g.bytes) {
                    for d in p.dvas() {
                        write(d.vdev.get() as usize, d.offset.get(), &[bytes])?;
                    }
                }
            }
            Ok(())
        };
        let mut written = write_all();
        // A txg's batch that found no room may wait for it (`RoomWait`) and go again, whole:
        // rewriting what some devices took already puts the same bytes in the same places.
        // Durable writes are a client's request, answered at once instead.
        while let Err(e) = &written {
            let waits =
                !durable && e.out_of_space() && self.room_wait.get().is_some_and(|w| w(txg, e));
            if !waits {
                break;
            }
            written = write_all();
        }
        if let Err(e) = written {
            // Nothing will point at this batch's copies: give them back as the allocation
            // failure above does (some may hold part of the data; they are free space now).
            let pieces = gangs.iter().flat_map(|g| copies_in_order(&g.pieces));
            let copies = copies_in_order(&bps).chain(pieces);
            let refused = (self.alloc.lock()).free_all(copies, txg, props.class);
            assert!(refused.is_empty(), "{refused:?}");
            return Err(ZioError::Write(e));
        }
        self.stats
            .blocks_written
            .fetch_add(blocks.len() as u64, Ordering::Relaxed);
        self.stats
            .bytes_written
            .fetch_add((bytes * props.copies) as u64, Ordering::Relaxed);
        Ok(bps)
    }

    /// Reads and verifies many blocks into the caller's buffers (one per pointer, of its `lsize`),
    /// in order. A block stored as it is goes straight into its buffer; a compressed one is
    /// read into a buffer of its stored size, verified there and decompressed into the
    /// caller's. Blocks whose first copy lies right after the previous one's are read as a run of
    /// up to `MAX_RUN_BYTES` (one request on a stripe or mirror, one per child on a raidz:
    /// `TopVdev::read_run`), and runs go in parallel. A block of a run that fails to read or to
    /// verify is read again alone, through `read`'s healing path (from the same mirror child first,
    /// so that copy is the one counted and repaired). A buffer whose block fails holds unspecified
    /// bytes.
    pub fn read_batch_into(
        &self,
        bps: &[BlkPtr],
        bufs: Vec<&mut [u8]>,
    ) -> Vec<Result<(), ZioError>> {
        let mut bounces = bounce::take(
            (bps.iter())
                .filter(|bp| bp.compression != compress::BP_OFF)
                .map(|bp| bp.psize.get() as usize),
        );
        let out = self.read_batch_bounced(bps, bufs, &mut bounces);
        bounce::give_back(bounces);
        out
    }

    /// `read_batch_into` with a bounce buffer of its stored size for each compressed block,
    /// in order.
    fn read_batch_bounced(
        &self,
        bps: &[BlkPtr],
        bufs: Vec<&mut [u8]>,
        bounces: &mut [Vec<u8>],
    ) -> Vec<Result<(), ZioError>> {
        assert_eq!(bps.len(), bufs.len());
        // Cut into runs, each with its pointers, the buffers its stored bytes are read into,
        // where each compressed block's decompressed bytes go, and whether it can be read as
        // one request (else its one block is read alone).
        type Run<'a, 'b> = (
            bool,
            Vec<&'a BlkPtr>,
            Vec<&'b mut [u8]>,
            Vec<Option<&'b mut [u8]>>,
        );
        let bytes: usize = bps.iter().map(|bp| bp.psize.get() as usize).sum();
        let mut bounce = bounces.iter_mut();
        // A batch large enough to be worth two cores is cut into at least two runs.
        let limit = if bytes >= PARALLEL_READ_BYTES {
            MAX_RUN_BYTES.min(bytes.div_ceil(2))
        } else {
            MAX_RUN_BYTES
        };
        let mut runs: Vec<Run> = Vec::new();
        let mut open: Option<RunEnd> = None;
        for (bp, buf) in bps.iter().zip(bufs) {
            assert!(!bp.is_hole());
            assert_eq!(buf.len(), bp.lsize.get() as usize);
            let (buf, dest) = match bp.compression {
                compress::BP_OFF => (buf, None),
                _ => (
                    bounce
                        .next()
                        .expect("one per compressed block")
                        .as_mut_slice(),
                    Some(buf),
                ),
            };
            let d = &bp.dva[0];
            let runnable =
                !bp.is_gang() && verifier(bp).is_ok() && self.vdev_of(d, buf.len()).is_ok();
            if runnable
                && open
                    .as_mut()
                    .is_some_and(|e| e.extend_within(d, buf.len(), limit))
            {
                let r = runs.last_mut().expect("a run is open");
                r.1.push(bp);
                r.2.push(buf);
                r.3.push(dest);
            } else {
                open = runnable.then(|| RunEnd::at(d, buf.len()));
                runs.push((runnable, vec![bp], vec![buf], vec![dest]));
            }
        }
        let read_run = |(runnable, run, mut bufs, dests): Run| -> Vec<Result<(), ZioError>> {
            let d = &run[0].dva[0];
            let child = if runnable {
                self.tops[d.vdev.get() as usize]
                    .read_run(d.offset.get(), &mut bufs)
                    .ok()
            } else {
                None
            };
            run.iter()
                .zip(bufs)
                .zip(dests)
                .map(|((bp, buf), dest)| {
                    let good = child.is_some()
                        && bp
                            .checksum_kind()
                            .is_some_and(|k| k.compute(buf) == bp.checksum());
                    if good {
                        self.stats.blocks_read.fetch_add(1, Ordering::Relaxed);
                    } else {
                        let data = self.read_from(bp, child)?;
                        buf.copy_from_slice(&data);
                    }
                    match dest {
                        Some(dest) => decode_into(bp, buf, dest),
                        None => Ok(()),
                    }
                })
                .collect()
        };
        if runs.len() == 1 || bytes < PARALLEL_READ_BYTES {
            return runs.into_iter().flat_map(read_run).collect();
        }
        // The runs are claimed one at a time by this thread and the helper thread, if it is
        // free (see `helper`): this thread never waits for the helper to wake.
        let next = AtomicUsize::new(0);
        let runs: Vec<Mutex<Option<Run>>> = runs.into_iter().map(|r| Mutex::new(Some(r))).collect();
        let done: Vec<Mutex<Vec<Result<(), ZioError>>>> =
            runs.iter().map(|_| Mutex::new(Vec::new())).collect();
        helper::share(&|| loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(run) = runs.get(i).and_then(|r| r.lock().take()) else {
                return;
            };
            *done[i].lock() = read_run(run);
        });
        done.into_iter().flat_map(Mutex::into_inner).collect()
    }

    /// Rewrites a copy a read found bad (`read_from`, `scrub`); true if rewritten. A pool
    /// imported read-only leaves it as it is.
    fn heal(&self, d: &Dva, good: &[u8]) -> bool {
        let top = &self.tops[d.vdev.get() as usize];
        !top.is_read_only() && top.write(d.offset.get(), good).is_ok()
    }

    /// `read`, if the block's first copy can be had at once (on files, from the page cache:
    /// `TopVdev::read_nowait`) and verifies; `None` if not. Nothing is counted or repaired
    /// then: the caller reads the block with `read`, which waits, heals and counts.
    pub fn read_nowait(&self, bp: &BlkPtr) -> Option<Vec<u8>> {
        decode(bp, self.read_stored_nowait(bp)?).ok()
    }

    /// `read_nowait` without the decompression: the verified stored bytes.
    pub fn read_stored_nowait(&self, bp: &BlkPtr) -> Option<Vec<u8>> {
        let first = self.first_copy_nowait(bp)?;
        if !bp.is_gang() {
            return Some(first);
        }
        // A gang block is at once only if its header and every piece are.
        let pieces = gang::parse(bp, &first).ok()?;
        let mut whole = Vec::with_capacity(bp.psize.get() as usize);
        for piece in &pieces {
            whole.extend_from_slice(&self.first_copy_nowait(piece)?);
        }
        whole_checks(bp, &whole).then_some(())?;
        Some(whole)
    }

    /// The verified first copy of `bp` (a gang block's: its header), if it can be had at once.
    fn first_copy_nowait(&self, bp: &BlkPtr) -> Option<Vec<u8>> {
        let (psize, verify) = verifier(bp).ok()?;
        let d = &bp.dva[0];
        let top = self.vdev_of(d, psize).ok()?;
        let mut buf = vec![0u8; psize];
        if !top.read_nowait(d.offset.get(), &mut buf) || !verify(&buf) {
            return None;
        }
        self.stats.blocks_read.fetch_add(1, Ordering::Relaxed);
        Some(buf)
    }

    /// Reads and verifies a block. Holes read as zeros of `lsize`... but a hole has no size, so
    /// callers handle holes before calling; this asserts it.
    pub fn read(&self, bp: &BlkPtr) -> Result<Vec<u8>, ZioError> {
        decode(bp, self.read_from(bp, None)?)
    }

    /// `read` without the decompression: the verified stored bytes (what the block cache
    /// keeps of a compressed block), healed as `read` heals them.
    pub fn read_stored(&self, bp: &BlkPtr) -> Result<Vec<u8>, ZioError> {
        self.read_from(bp, None)
    }

    /// The logical bytes of a block from its verified stored bytes (`read_stored`'s).
    pub fn decode_stored(bp: &BlkPtr, stored: &[u8]) -> Result<Vec<u8>, ZioError> {
        let mut out = vec![0u8; bp.lsize.get() as usize];
        decode_into(bp, stored, &mut out)?;
        Ok(out)
    }

    /// `read` of a block that may never have been written whole, and where that is no
    /// device's fault: one an intent-log record points at, written in place by a batch that
    /// a crash may have cut short. Each copy is read speculatively
    /// (`TopVdev::read_speculative`): copies that do not hold the block count no checksum
    /// error and nothing is rewritten (the block lives only until the log's replay has
    /// copied it); failed reads count as ever.
    pub fn read_speculative(&self, bp: &BlkPtr) -> Result<Vec<u8>, ZioError> {
        assert!(!bp.is_hole());
        if bp.is_gang() {
            let why = "a gang block, which is never written ahead of its txg";
            return Err(unrecoverable(bp, why.into()));
        }
        let (psize, verify) = verifier(bp)?;
        let mut buf = vec![0u8; psize];
        let mut errors = Vec::new();
        for d in bp.dvas() {
            let read = self
                .vdev_of(d, psize)
                .map_err(|e| e.to_string())
                .and_then(|top| {
                    top.read_speculative(d.offset.get(), &mut buf, &verify)
                        .map_err(|e| e.to_string())
                });
            match read {
                Ok(_) => {
                    self.stats.blocks_read.fetch_add(1, Ordering::Relaxed);
                    return decode(bp, buf);
                }
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            errors.push("block pointer has no copies".into());
        }
        Err(unrecoverable(bp, errors.join("; ")))
    }

    /// The verified stored bytes of `bp` (`read` before decompression), starting the first
    /// copy's read at mirror child `first` when given (the retry of a block a run read from
    /// that child, which did not verify).
    fn read_from(&self, bp: &BlkPtr, first: Option<usize>) -> Result<Vec<u8>, ZioError> {
        let copy = self.read_copies(bp, first)?;
        if !bp.is_gang() {
            return Ok(copy);
        }
        assemble(bp, &copy, |p| self.read_from(p, None))
    }

    /// The first copy of `bp` that verifies (`verifier`: of a gang block, its header),
    /// healing the copies that failed before it.
    fn read_copies(&self, bp: &BlkPtr, first: Option<usize>) -> Result<Vec<u8>, ZioError> {
        assert!(!bp.is_hole());
        let (psize, verify) = verifier(bp)?;
        let mut buf = vec![0u8; psize];
        let mut failed: Vec<&Dva> = Vec::new();
        let mut errors = Vec::new();
        for (i, d) in bp.dvas().enumerate() {
            let top = match self.vdev_of(d, psize) {
                Ok(t) => t,
                Err(e) => {
                    errors.push(e.to_string());
                    continue;
                }
            };
            let first = if i == 0 { first } else { None };
            let birth = Some(bp.birth_txg.get());
            match top.read_verified_from(d.offset.get(), &mut buf, &verify, birth, first) {
                Ok(report) => {
                    self.stats
                        .repaired_bytes
                        .fetch_add(report.repaired_bytes, Ordering::Relaxed);
                    // Heal the ditto copies that failed whole before this one.
                    for bad in failed {
                        if self.heal(bad, &buf) {
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
        self.scrub_read(bp).map(|(report, _)| report)
    }

    /// `scrub`, returning the block's bytes too. A gang block's header copies are scrubbed,
    /// then each of its pieces, and the whole is verified.
    fn scrub_read(&self, bp: &BlkPtr) -> Result<(ReadReport, Vec<u8>), ZioError> {
        let (mut total, good) = self.scrub_copies(bp)?;
        if !bp.is_gang() {
            return Ok((total, good));
        }
        let whole = assemble(bp, &good, |p| {
            let (r, bytes) = self.scrub_read(p)?;
            total.io_errors += r.io_errors;
            total.cksum_errors += r.cksum_errors;
            total.repaired_bytes += r.repaired_bytes;
            Ok(bytes)
        })?;
        Ok((total, whole))
    }

    /// Every copy of `bp` read and verified (`verifier`), the bad ones rewritten from a good
    /// one: what was found, and the good bytes.
    fn scrub_copies(&self, bp: &BlkPtr) -> Result<(ReadReport, Vec<u8>), ZioError> {
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
                    errors.push(e.to_string());
                    continue;
                }
            };
            let mut buf = vec![0u8; psize];
            match top.scrub(d.offset.get(), &mut buf, &verify, bp.birth_txg.get()) {
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
            if self.heal(bad, &good) {
                total.repaired_bytes += psize as u64;
            }
        }
        self.stats
            .repaired_bytes
            .fetch_add(total.repaired_bytes, Ordering::Relaxed);
        Ok((total, good))
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
        for bp in self.with_pieces(bps).iter() {
            let Ok((psize, _)) = verifier(bp) else {
                continue;
            };
            for d in bp.dvas() {
                if let Ok(top) = self.vdev_of(d, psize) {
                    let psize = psize as u64;
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
            .map(|t| t.raidz().map_or(1, |r| r.nparity() as u64 + 1))
            .max()
            .unwrap_or(1)
    }

    /// The free space that blocks of `psize` bytes can still take: on each top-level vdev,
    /// the free segments counted in whole allocations of such a block there.
    pub fn usable_space(&self, psize: u64) -> u64 {
        let alloc = self.alloc.lock();
        (self.tops.iter().enumerate())
            .take(alloc.tops.len())
            .map(|(v, top)| alloc.free_in_pieces(v, top.asize_of(psize)))
            .sum()
    }

    /// Records in the space map blocks allocated unrecorded (`AllocClass::Mos`) and written
    /// ahead of their txg, now that the txg's tree points at them; under one hold of the
    /// allocator, the copies of blocks written one after another as one extent each
    /// (`Allocator::record_alloc_all`).
    pub fn adopt_all<'a>(&self, bps: impl IntoIterator<Item = &'a BlkPtr, IntoIter: Clone>) {
        let bps = bps.into_iter();
        assert!(
            bps.clone().all(|bp| !bp.is_gang()),
            "a block written ahead of its txg is never a gang block"
        );
        self.alloc.lock().record_alloc_all(copies_in_order(bps));
    }

    /// Marks a block's space allocated without recording it in the space map (a block an
    /// intent-log record points at, until the replay that copies it is committed).
    pub fn claim(&self, bp: &BlkPtr) -> Result<(), AllocError> {
        if let (true, Some(d)) = (bp.is_gang(), bp.dvas().next()) {
            return Err(AllocError::BadFree {
                vdev: d.vdev.get(),
                offset: d.offset.get(),
                len: d.asize.get() as u64,
                why: "a gang block, which is never written ahead of its txg",
            });
        }
        let dvas: Vec<Dva> = bp.dvas().copied().collect();
        self.alloc.lock().claim_all_mos(&dvas)
    }

    /// Frees every copy of a block in txg `txg`. A copy that `vdev_of` refuses, or that the
    /// allocator finds is not an allocation of `class` (`Allocator::free`), is not freed but
    /// refused (`refused_frees`): the pointer came from disk and may be damaged or crafted,
    /// and a leak is better than free space freed twice.
    pub fn free(&self, bp: &BlkPtr, txg: u64, class: AllocClass) {
        if bp.is_gang() {
            return self.free_all(std::slice::from_ref(bp), txg, class);
        }
        // Copy by copy: nothing to merge, and no extent list to build for one block.
        let (good, mut bad) = self.sane_copies(bp);
        {
            let mut a = self.alloc.lock();
            bad.extend(
                (good.into_iter().flatten())
                    .filter_map(|d| a.free(d, txg, class).err().map(|e| e.to_string())),
            );
        }
        self.refused(bad.into_iter().map(|e| refused_free(bp, e)));
    }

    /// `free` of many blocks under one hold of the allocator, adjacent copies as one extent
    /// (`Allocator::free_all`).
    pub fn free_all(&self, bps: &[BlkPtr], txg: u64, class: AllocClass) {
        let bps = self.with_pieces(bps);
        let mut bad = Vec::new();
        let mut sane: Vec<[Option<&Dva>; 3]> = Vec::with_capacity(bps.len());
        for bp in bps.iter() {
            let (good, errors) = self.sane_copies(bp);
            bad.extend(errors.into_iter().map(|e| refused_free(bp, e)));
            sane.push(good);
        }
        // First copies first, each in the blocks' order, as `copies_in_order`.
        let copies = (0..3).flat_map(|c| sane.iter().filter_map(move |g| g[c]));
        let refused = self.alloc.lock().free_all(copies, txg, class);
        bad.extend(refused.into_iter().map(|e| e.to_string()));
        self.refused(bad);
    }
}

impl Zio {
    /// `bps`, each gang block followed by its pieces (read from its header): every block
    /// whose copies a free lets go. The pieces of a gang block whose header no copy of holds
    /// stay allocated, a leak said as such (`leaked`), rather than guessed at.
    fn with_pieces<'a>(&self, bps: &'a [BlkPtr]) -> std::borrow::Cow<'a, [BlkPtr]> {
        if !bps.iter().any(BlkPtr::is_gang) {
            return std::borrow::Cow::Borrowed(bps);
        }
        let mut all = Vec::with_capacity(bps.len() + gang::MAX_PIECES);
        for bp in bps {
            all.push(*bp);
            if !bp.is_gang() {
                continue;
            }
            match self.gang_pieces(bp) {
                Ok(pieces) => all.extend(pieces),
                Err(e) => self.leaked(format!(
                    "the pieces of a gang block born in txg {}: {e}",
                    bp.birth_txg.get()
                )),
            }
        }
        std::borrow::Cow::Owned(all)
    }

    /// The pieces gang block `bp`'s header names.
    pub fn gang_pieces(&self, bp: &BlkPtr) -> Result<Vec<BlkPtr>, ZioError> {
        let header = self.read_copies(bp, None)?;
        gang::parse(bp, &header).map_err(|e| unrecoverable(bp, e))
    }

    /// Makes a txg sync's blocks that no free segment can take whole gang blocks
    /// (`gang`): once the pool has feature `org.zeta:gang_blocks` active.
    pub fn allow_ganging(&self, on: bool) {
        self.ganging.allowed.store(on, Ordering::Release);
    }

    /// Writes every block of more than `bytes` bytes that may gang as a gang block of
    /// pieces of at most that size, as OpenZFS's `metaslab_force_ganging` does: for tests
    /// of the gang paths on any pool. `None` writes blocks whole where they fit.
    pub fn force_ganging(&self, bytes: Option<u64>) {
        let at = bytes.map_or(u64::MAX, |b| b.max(SECTOR));
        self.ganging.force_above.store(at, Ordering::Release);
    }
}

/// When a block may be, or must be, written as a gang block.
struct Ganging {
    allowed: AtomicBool,
    force_above: AtomicU64,
}

impl Default for Ganging {
    fn default() -> Ganging {
        Ganging {
            allowed: AtomicBool::new(false),
            force_above: AtomicU64::new(u64::MAX),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_pointer_to_a_block_of_no_whole_sectors_is_refused_before_any_read() {
        let mut bp = BlkPtr::HOLE;
        bp.birth_txg = 5.into();
        bp.checksum_kind = ChecksumKind::Sha256 as u8;
        bp.kind = BlockKind::Data as u8;
        for bad in [0u32, 100, 4095, 4097] {
            bp.psize = bad.into();
            let err = verifier(&bp).err().expect("refused").to_string();
            assert!(err.contains("impossible size"), "{bad}: {err}");
        }
        bp.psize = 8192.into();
        bp.lsize = 8192.into();
        assert_eq!(verifier(&bp).ok().map(|(n, _)| n), Some(8192));
        // Sizes a compressed or raw block cannot have, and a codec no writer knows.
        let mut bad = bp;
        bad.lsize = 16384.into();
        let err = verifier(&bad)
            .err()
            .expect("raw: lsize must be psize")
            .to_string();
        assert!(err.contains("impossible sizes"), "{err}");
        for (codec, lsize) in [
            (compress::BP_LZ4, 8192u32),
            (compress::BP_LZ4, 4096),
            (compress::BP_ZSTD, 12289),
            (compress::BP_ZSTD, 1 << 30),
        ] {
            let mut bad = bp;
            bad.compression = codec;
            bad.lsize = lsize.into();
            let err = verifier(&bad).err().expect("refused").to_string();
            assert!(err.contains("impossible sizes"), "{codec} {lsize}: {err}");
        }
        bad.compression = 9;
        let err = verifier(&bad).err().expect("unknown codec").to_string();
        assert!(err.contains("unknown compression 9"), "{err}");
        let mut good = bp;
        good.compression = compress::BP_ZSTD;
        good.lsize = 131072.into();
        assert!(verifier(&good).is_ok());
    }

    /// A `Zio` over one in-memory mirror of `n` sides (kept alive by the devices returned),
    /// and its first side.
    pub(crate) fn zio_on_mirror(
        n: usize,
        guid: u64,
    ) -> (
        Zio,
        Arc<crate::vdev::Leaf>,
        Vec<Arc<crate::vdev::mem::MemDevice>>,
    ) {
        let (top, devs) = crate::vdev::top::mem_mirror(n, guid);
        let leaf = top.children[0].clone();
        let asize = top.asize_bytes / (1 << 20) * (1 << 20);
        let zio = Zio::new(vec![Arc::new(top)], Allocator::new(&[(0, asize, 20)]));
        (zio, leaf, devs)
    }

    /// A mirror whose free space is cut into single sectors, and a 16K block to write: the
    /// allocator has no segment for it, so it is written as a gang block of four pieces,
    /// read back, scrubbed and repaired on one side, and freed whole.
    #[test]
    fn a_block_no_free_segment_takes_whole_is_written_read_scrubbed_and_freed_as_a_gang() {
        let (zio, leaf, _devs) = zio_on_mirror(2, 7);
        // Every sector taken, then every other one given back.
        {
            let mut a = zio.alloc.lock();
            let mut taken = Vec::new();
            while let Ok(d) = a.alloc(SECTOR, 1, AllocClass::Recorded) {
                taken.push(d[0]);
            }
            assert!(a
                .free_all(taken.iter().step_by(2), 1, AllocClass::Recorded)
                .is_empty());
            a.txg_synced(3);
        }
        let free = || zio.alloc.lock().space().free;
        let before = free();
        assert!(before >= 64 * SECTOR, "room left: {before}");
        let data: Vec<u8> = (0..16384u32).map(|i| (i * 7 + i / 4096) as u8).collect();
        let props = WriteProps {
            kind: BlockKind::Indirect,
            level: 1,
            checksum: ChecksumKind::Fletcher4,
            copies: 1,
            class: AllocClass::Recorded,
            compress: Compression::Off,
        };
        // Without ganging (a pool without the feature), the block has nowhere to go.
        let refused = zio.write(&data, props, 5, 1);
        assert!(matches!(
            refused,
            Err(ZioError::Alloc(AllocError::NoSpace(16384)))
        ));
        assert_eq!(free(), before, "a refused write takes nothing");
        zio.allow_ganging(true);
        // Nor does a durable write gang (an intent-log record would point at it).
        assert!(zio.write_batch_durable(&[&data], props, 5).is_err());
        let bp = zio.write(&data, props, 5, 1).unwrap();
        assert!(bp.is_gang());
        let pieces = zio.gang_pieces(&bp).unwrap();
        assert_eq!(pieces.len(), 4);
        assert!(pieces.iter().all(|p| p.psize.get() == 4096));
        assert_eq!(bp.asize_total(), 5 * SECTOR, "a header and four pieces");
        assert_eq!(before - free(), bp.asize_total());
        assert_eq!(zio.read(&bp).unwrap(), data);
        // Memory serves the header and every piece at once.
        assert_eq!(zio.read_nowait(&bp), Some(data.clone()));
        assert!(zio.read_speculative(&bp).is_err());
        assert!(zio.claim(&bp).is_err());

        // One side's copies of the header and of every piece go bad: a scrub finds and
        // rewrites each of the five; damaged again, reads still get the block.
        assert_eq!(zio.corrupt_on_leaf(&[bp], &leaf, 100, 9).unwrap(), 5);
        let report = zio.scrub(&bp).unwrap();
        assert_eq!(report.cksum_errors, 5, "{report:?}");
        assert_eq!(report.repaired_bytes, 5 * SECTOR);
        assert_eq!(zio.scrub(&bp).unwrap().cksum_errors, 0);
        assert_eq!(zio.corrupt_on_leaf(&[bp], &leaf, 100, 10).unwrap(), 5);
        for _ in 0..2 {
            assert_eq!(zio.read(&bp).unwrap(), data);
        }

        // Freed, the header's and the pieces' space comes back once the frees are due.
        zio.free(&bp, 6, AllocClass::Recorded);
        zio.alloc.lock().txg_synced(8);
        assert_eq!(free(), before);
        assert!(zio.refused_frees().is_empty());
    }

    /// A gang block whose header no copy holds any more cannot be read (said so, not
    /// guessed at), and its free lets go of the header and keeps the pieces, said as a
    /// leak rather than freeing what the header may not have named.
    #[test]
    fn a_gang_block_without_a_good_header_is_an_error_and_its_pieces_a_leak() {
        let (zio, leaf, _devs) = zio_on_mirror(1, 8);
        zio.allow_ganging(true);
        zio.force_ganging(Some(8192));
        let data = vec![0x5au8; 32768];
        let props = WriteProps {
            kind: BlockKind::Data,
            level: 0,
            checksum: ChecksumKind::Sha256,
            copies: 1,
            class: AllocClass::Recorded,
            compress: Compression::Off,
        };
        let before = zio.alloc.lock().space().free;
        let bp = zio.write(&data, props, 5, 1).unwrap();
        assert!(bp.is_gang());
        assert_eq!(
            zio.gang_pieces(&bp).unwrap().len(),
            4,
            "forced: pieces of 8K"
        );
        assert_eq!(zio.read(&bp).unwrap(), data);
        // The header's one sector scribbled (a single-leaf vdev: no other copy).
        let d = bp.dva[0];
        let header_sector = zio.tops[0].sectors_on_leaf(leaf.guid(), d.offset.get(), 4096);
        leaf.scribble(&[1u8; 4096], header_sector[0]).unwrap();
        let err = zio.read(&bp).unwrap_err().to_string();
        assert!(err.contains("unrecoverable data block"), "{err}");
        zio.free(&bp, 6, AllocClass::Recorded);
        zio.alloc.lock().txg_synced(8);
        let leaked = before - zio.alloc.lock().space().free;
        assert_eq!(leaked, 32768, "the pieces stay taken, the header is free");
        let said = zio.refused_frees();
        assert!(
            said.iter().any(|e| e.contains("pieces of a gang block")),
            "{said:?}"
        );
    }
}

#[cfg(test)]
mod compressed_tests {
    use super::tests::zio_on_mirror;
    use super::*;

    fn props(compress: Compression) -> WriteProps {
        WriteProps {
            kind: BlockKind::Data,
            level: 0,
            checksum: ChecksumKind::Fletcher4,
            copies: 1,
            class: AllocClass::Recorded,
            compress,
        }
    }

    /// Blocks of 16K: text-like (compresses), random (does not), and repeated bytes.
    fn blocks() -> Vec<Vec<u8>> {
        use rand::{RngCore, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut random = vec![0u8; 16384];
        rng.fill_bytes(&mut random);
        let text: Vec<u8> = (0..16384u32)
            .map(|i| b"copy-on-write "[(i as usize * 7 / 5) % 14])
            .collect();
        let same = vec![0x5a; 16384];
        vec![text, random, same]
    }

    /// Every read path gives back the logical bytes of compressed blocks (and of the raw
    /// one between them): alone, in a batch read as one run, at once from memory, and
    /// speculatively; the pointers say what was stored.
    #[test]
    fn compressed_blocks_are_stored_smaller_and_read_back_whole_on_every_path() {
        for c in [
            Compression::Lz4,
            Compression::Zstd(3),
            Compression::Zstd(19),
        ] {
            let (zio, _leaf, _devs) = zio_on_mirror(2, 9);
            let data = blocks();
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let bps = zio.write_batch_durable(&refs, props(c), 5).unwrap();
            let (codec, _) = c.to_phys();
            for (bp, d) in bps.iter().zip(&data) {
                assert_eq!(bp.lsize.get() as usize, d.len());
                assert_eq!(zio.read(bp).unwrap(), *d);
                assert_eq!(zio.read_nowait(bp).as_ref(), Some(d));
                assert_eq!(zio.read_speculative(bp).unwrap(), *d);
            }
            assert_eq!((bps[0].compression, bps[2].compression), (codec, codec));
            assert!(bps[0].psize.get() < 16384 && bps[2].psize.get() == 4096);
            assert_eq!((bps[1].compression, bps[1].psize.get()), (0, 16384));
            // Written in one batch, the three lie one after another: one run read.
            let mut out = vec![vec![0u8; 16384]; 3];
            let bufs: Vec<&mut [u8]> = out.iter_mut().map(Vec::as_mut_slice).collect();
            assert!(zio.read_batch_into(&bps, bufs).iter().all(Result::is_ok));
            assert_eq!(out, data);
            let stored: u64 = bps.iter().map(|bp| bp.asize_total()).sum();
            assert_eq!(
                stored,
                bps.iter().map(|bp| bp.psize.get() as u64).sum::<u64>()
            );
        }
    }

    /// A compressed block damaged on one side of a mirror: the checksum of its stored bytes
    /// finds it, a read returns the good side's decompressed bytes and rewrites the bad
    /// side, and a scrub then finds it clean; damaged on both sides it is an error, not
    /// garbage.
    #[test]
    fn a_damaged_compressed_block_is_found_by_its_checksum_and_healed_from_the_mirror() {
        let (zio, leaf, _devs) = zio_on_mirror(2, 11);
        let data = blocks();
        let bp = zio
            .write(&data[0], props(Compression::Zstd(3)), 5, 1)
            .unwrap();
        assert_ne!(bp.compression, 0);
        assert_eq!(zio.corrupt_on_leaf(&[bp], &leaf, 1, 1).unwrap(), 1);
        let first = zio.scrub(&bp).unwrap();
        assert!(
            first.cksum_errors >= 1 && first.repaired_bytes > 0,
            "{first:?}"
        );
        assert_eq!(zio.scrub(&bp).unwrap().cksum_errors, 0);
        assert_eq!(zio.read(&bp).unwrap(), data[0]);
        // Stored bytes that verify but are not a frame (written raw under a compressed
        // pointer: what a bug would do) are refused as undecodable, not returned.
        let mut lying = zio
            .write(&data[0][..8192], props(Compression::Off), 6, 1)
            .unwrap();
        lying.compression = compress::BP_LZ4;
        lying.lsize = 16384.into();
        let err = zio.read(&lying).unwrap_err().to_string();
        assert!(err.contains("do not decompress"), "{err}");
        let mut out = vec![0u8; 16384];
        let r = zio.read_batch_into(&[lying], vec![out.as_mut_slice()]);
        assert!(r[0].is_err());
    }

    /// A compressed block that no free segment takes whole is ganged by its stored bytes,
    /// and reads back whole.
    #[test]
    fn a_compressed_block_can_be_a_gang_block() {
        let (zio, _leaf, _devs) = zio_on_mirror(2, 13);
        zio.allow_ganging(true);
        zio.force_ganging(Some(4096));
        // Half random, half zeros: stored in about half.
        let mut data = vec![0u8; 65536];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut data[..32768]);
        let bp = zio.write(&data, props(Compression::Lz4), 5, 1).unwrap();
        assert!(bp.is_gang() && bp.compression == compress::BP_LZ4);
        assert!(bp.psize.get() < 65536 && bp.psize.get() > 4096);
        assert_eq!(zio.read(&bp).unwrap(), data);
        assert_eq!(zio.scrub(&bp).unwrap().cksum_errors, 0);
        let mut out = vec![0u8; 65536];
        let r = zio.read_batch_into(&[bp], vec![out.as_mut_slice()]);
        assert!(r[0].is_ok() && out == data);
    }
}
