//! Patched blocks: writes over part of a block, kept as pieces (`Piece`) until a read or a
//! sync lays them over what the block held. At a sync the bases are read, laid over and
//! written in batches, by two threads taking them in turn, and the new block's Fletcher-4
//! follows from the old one's where the pieces are few.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::dmu::dnode::DnodePhys;
use crate::spa::BlkPtr;
use crate::zio::{WriteProps, ZioError};
use zeta_math::fletcher::{fletcher4_update, Fletcher4};
use zeta_math::zero::is_zero;
use zeta_math::{Checksum, ChecksumKind};

use super::tree::Leaves;
use super::{Fetched, ObjectIo};

/// Bytes written over part of a block (`Dirty::Patch`): `data` at offset `at` in it.
#[derive(Clone, Debug)]
pub struct Piece {
    pub at: usize,
    /// `data`'s length, kept here: every write into a patched block sums and compares its
    /// pieces' extents, and reaching each through its `Arc` was a cache miss apiece.
    pub(super) len: usize,
    pub data: Arc<Vec<u8>>,
}

impl Piece {
    pub(super) fn new(at: usize, data: Arc<Vec<u8>>) -> Piece {
        Piece {
            at,
            len: data.len(),
            data,
        }
    }
}

/// The block `pieces` are laid over, in the order they were written (a later piece wins
/// where they overlap): `base`, or zeros for a hole.
pub(super) fn overlay(base: Option<&[u8]>, pieces: &[Piece], block_bytes: usize) -> Vec<u8> {
    let b = match base {
        Some(d) => d.to_vec(),
        None => vec![0u8; block_bytes],
    };
    lay(b, pieces)
}

/// `overlay` over a base the caller gives up: laid over in place when no one else holds it
/// (a block just read for the purpose), saving a block's allocation and copy.
fn overlay_owned(base: Option<Arc<Vec<u8>>>, pieces: &[Piece], block_bytes: usize) -> Vec<u8> {
    match base.map(Arc::try_unwrap) {
        Some(Ok(own)) => lay(own, pieces),
        Some(Err(shared)) => overlay(Some(&shared), pieces, block_bytes),
        None => overlay(None, pieces, block_bytes),
    }
}

/// `overlay_owned` for a patched block at a sync, with the new block's checksum where it
/// follows from the old one's (`None`: the writer computes it): Fletcher-4 over a base of
/// the block's full size, whose pieces cover less than a quarter of it. The base is the
/// block `bp` points to, as verified when read (or cached), so its sums are `bp`'s.
fn overlay_summed(
    base: Option<Arc<Vec<u8>>>,
    bp: &BlkPtr,
    pieces: &[Piece],
    block_bytes: usize,
    kind: ChecksumKind,
) -> (Vec<u8>, Option<Checksum>) {
    let fletcher4 = Some(ChecksumKind::Fletcher4);
    let summable = Some(kind) == fletcher4
        && bp.checksum_kind() == fletcher4
        && bp.lsize.get() as usize == block_bytes
        && bp.psize.get() as usize == block_bytes
        && pieces.iter().map(|p| p.len).sum::<usize>() < block_bytes / 4;
    match base {
        Some(base) if summable && base.len() == block_bytes => {
            let mut b = Arc::try_unwrap(base).unwrap_or_else(|shared| shared.to_vec());
            let sums = lay_summed(&mut b, pieces, bp.checksum().to_words());
            (b, Some(Checksum::from_words(sums)))
        }
        base => (overlay_owned(base, pieces, block_bytes), None),
    }
}

/// Lays `pieces` over `b`, whose Fletcher-4 sums are `sums`, and returns the sums of the
/// result, from the words each piece changes (`fletcher4_update`): for a few 4K pieces a
/// fifth of the work of summing a 128K block anew.
fn lay_summed(b: &mut [u8], pieces: &[Piece], mut sums: Fletcher4) -> Fletcher4 {
    let total = b.len();
    for p in pieces {
        let (at, end) = (p.at, p.at + p.len);
        if at.is_multiple_of(4) && end.is_multiple_of(4) {
            sums = fletcher4_update(sums, total, at, &b[at..end], &p.data);
            b[at..end].copy_from_slice(&p.data);
        } else {
            // The words the piece touches in part, before and after.
            let (from, to) = (at & !3, (end + 3) & !3);
            let old = b[from..to].to_vec();
            b[at..end].copy_from_slice(&p.data);
            sums = fletcher4_update(sums, total, from, &old, &b[from..to]);
        }
    }
    sums
}

fn lay(mut b: Vec<u8>, pieces: &[Piece]) -> Vec<u8> {
    for p in pieces {
        b[p.at..p.at + p.data.len()].copy_from_slice(&p.data);
    }
    b
}

/// Whether `spans` (start and end of each piece) together cover all `block_bytes` of their
/// block.
pub(super) fn covers(spans: impl Iterator<Item = (usize, usize)>, block_bytes: usize) -> bool {
    let mut spans: Vec<(usize, usize)> = spans.collect();
    spans.sort_unstable();
    let mut reach = 0;
    for (start, end) in spans {
        if start > reach {
            return false;
        }
        reach = reach.max(end);
    }
    reach >= block_bytes
}

/// Builds each patched block of a read (`read_blocks`) from what was read for it.
pub(super) fn lay_pieces(
    out: &mut [Result<Fetched, ZioError>],
    patched: Vec<(usize, Vec<Piece>)>,
    block_bytes: usize,
) {
    for (i, pieces) in patched {
        if let Ok(base) = &out[i] {
            let base = match base {
                Fetched::Data(d) => Some(d.as_slice()),
                Fetched::Hole => None,
                Fetched::Direct => unreachable!("a patched block is read into no caller's buffer"),
            };
            out[i] = Ok(Fetched::Data(Arc::new(overlay(base, &pieces, block_bytes))));
        }
    }
}

/// How many bytes of patched blocks a sync builds in memory at once (`sync_patched`), with
/// a block cache configured to `cache_bytes`: a 32nd of it, between 256K and 2M. The sync
/// holds two batches (one built and written, the next read), memory that neither the cache
/// nor the dirty limit counts: the memory governor's margin covers it as a 16th of the
/// budget. At a fixed 2M, with a 16M dirty limit and a 32M cache, those two batches were
/// part of the peaks that took `zeta bench vol` over its 48M budget (with the log's encoded
/// blocks, `Zil::write_blocks`); at the default 256M cache a batch is 2M as before.
fn patch_batch_bytes(cache_bytes: u64) -> usize {
    (cache_bytes / 32).clamp(256 << 10, 2 << 20) as usize
}

/// What patched blocks held before their txg (`sync_patched`): a hole, a cached copy, or
/// read and verified now, for each pointer.
type Bases = Vec<Result<Option<Arc<Vec<u8>>>, ZioError>>;

/// A patched block of a syncing txg: its id and its pieces.
pub(super) type Patched<'a> = (u64, &'a [Piece]);

/// Reads and verifies blocks (`Zio::read_batch_into`) into buffers the cache has spare
/// (`BlockCache::take_buf`), one per pointer, in order.
pub(super) fn read_spare(io: &ObjectIo, bps: &[BlkPtr]) -> Vec<Result<Vec<u8>, ZioError>> {
    let mut bufs: Vec<Vec<u8>> = bps
        .iter()
        .map(|bp| io.cache.take_buf(bp.lsize.get() as usize))
        .collect();
    let results = io
        .zio
        .read_batch_into(bps, bufs.iter_mut().map(|b| b.as_mut_slice()).collect());
    results
        .into_iter()
        .zip(bufs)
        .map(|(r, b)| r.map(|()| b))
        .collect()
}

/// Each patched block's pointer as it was, or why it could not be looked up.
type OldPointer = Result<BlkPtr, ZioError>;

/// What each patched block held: `None` for a hole, and for a block whose pointer could
/// not be looked up (`Err` in `at`), which nothing reads (`write_patched` loses its patch).
fn read_bases(io: &ObjectIo, at: &[OldPointer]) -> Bases {
    let mut bases: Bases = (at.iter())
        .map(|bp| Ok(bp.as_ref().ok().and_then(|bp| io.cache.get(bp))))
        .collect();
    let misses: Vec<usize> = (0..at.len())
        .filter(|&i| matches!((&at[i], &bases[i]), (Ok(bp), Ok(None)) if !bp.is_hole()))
        .collect();
    let bps: Vec<BlkPtr> = (misses.iter())
        .filter_map(|&i| at[i].as_ref().ok().copied())
        .collect();
    for (i, data) in misses.into_iter().zip(read_spare(io, &bps)) {
        bases[i] = data.map(|d| Some(Arc::new(d)));
    }
    bases
}

/// Writes a syncing txg's patched blocks (`Dirty::Patch`): each is what it held as of the
/// last sync (the tree of `old`) with the txg's pieces laid over it. Built and written a
/// bounded batch at a time: a txg of short writes into large blocks patches many more
/// blocks than the memory it holds.
///
/// Two threads take the batches in turn, each reading a batch's old contents, then laying
/// and writing it, so one's reads overlap the other's writes and the work, which is most
/// of a sync's under short random writes, has two cores. (A helper that only read ahead,
/// with the sync thread laying and writing every batch, left the sync one core: 4K writes
/// into 16K blocks stalled behind it for seconds at a time. Before that, done in turn, the
/// reads — a RAID-Z block is read column by column — and the writes each left the other's
/// resources idle, and random 4K writes on raidz2 ran slower than when writers read their
/// blocks themselves.) On raidz2 the two threads do no worse than the helper that only read
/// ahead: their reads still overlap writes (figures: docs/perf/volume.md, "Why two threads
/// lay and write a txg's patched blocks"). Two batches are in memory at most, as before.
pub(super) fn sync_patched(
    io: &ObjectIo,
    old: &DnodePhys,
    patched: &[Patched],
    props: WriteProps,
    txg: u64,
) -> Result<Vec<Option<BlkPtr>>, ZioError> {
    // Each patched block's new pointer, in order; `None` where the block keeps the one it
    // has (its patch is lost).
    let mut out = vec![None; patched.len()];
    if patched.is_empty() {
        return Ok(out);
    }
    let block_bytes = old.data_block_bytes.get() as usize;
    let mut leaves = Leaves::new(old);
    // A pointer that cannot be looked up (an impossible one) is a base that cannot be read.
    let at: Vec<OldPointer> = (patched.iter())
        .map(|(blkid, _)| leaves.get(io, *blkid))
        .collect();
    let per_batch = (patch_batch_bytes(io.cache.capacity()) / block_bytes).max(1);
    let batches: Vec<(&[Patched], &[OldPointer])> = patched
        .chunks(per_batch)
        .zip(at.chunks(per_batch))
        .collect();
    let outs: Vec<&mut [Option<BlkPtr>]> = out.chunks_mut(per_batch).collect();
    // The batches not yet taken, each with where its pointers go; a thread that fails
    // takes the rest away, so the other stops after its batch.
    let todo = parking_lot::Mutex::new(batches.into_iter().zip(outs));
    let work = || -> Result<(), ZioError> {
        loop {
            let Some(((batch, at), out)) = todo.lock().next() else {
                return Ok(());
            };
            let bases = read_bases(io, at);
            let written = write_patched(io, batch, at, bases, block_bytes, props, txg, out);
            if written.is_err() {
                todo.lock().by_ref().for_each(drop);
            }
            written?;
        }
    };
    std::thread::scope(|s| {
        // Named, so a profile tells its work from the sync thread's. Started once per sync:
        // a thread per batch cost its stack's mapping and unmapping, hundreds of times a
        // txg. If no thread can be had, this one does every batch.
        let helper = (patched.len() > per_batch)
            .then(|| {
                (std::thread::Builder::new().name("patch-sync".into()))
                    .spawn_scoped(s, work)
                    .ok()
            })
            .flatten();
        let mine = work();
        let theirs = helper.map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        mine.and(theirs.unwrap_or(Ok(())))
    })?;
    Ok(out)
}

/// Lays one batch of patched blocks over what they held (`bases`) and writes them; their
/// new pointers go to `out`, in order.
#[allow(clippy::too_many_arguments)]
fn write_patched(
    io: &ObjectIo,
    batch: &[Patched],
    at: &[OldPointer],
    bases: Bases,
    block_bytes: usize,
    props: WriteProps,
    txg: u64,
    out: &mut [Option<BlkPtr>],
) -> Result<(), ZioError> {
    // Each block's place in the batch, its bytes, and its checksum if already known.
    let mut built: Vec<(usize, Vec<u8>, Option<Checksum>)> = Vec::new();
    for (i, (((_, pieces), bp), base)) in batch.iter().zip(at).zip(bases).enumerate() {
        match (base, bp) {
            (Ok(base), Ok(bp)) => {
                let (b, sum) = overlay_summed(base, bp, pieces, block_bytes, props.checksum);
                if is_zero(&b) {
                    out[i] = Some(BlkPtr::HOLE);
                } else {
                    built.push((i, b, sum));
                }
            }
            // No copy of what the block held verifies (or its pointer is impossible): the
            // pieces cannot be laid over it without inventing the rest. The block keeps its
            // damaged copy, so reads of it go on failing rather than showing made-up bytes,
            // and the pieces are lost with it (counted; the failed read counted the damage).
            _ => {
                io.zio.stats.lost_writes.fetch_add(1, Ordering::Relaxed);
                out[i] = None;
            }
        }
    }
    if built.is_empty() {
        return Ok(());
    }
    let bufs: Vec<&[u8]> = built.iter().map(|(_, b, _)| b.as_slice()).collect();
    let sums: Vec<Option<Checksum>> = built.iter().map(|(_, _, sum)| *sum).collect();
    let bps = io.zio.write_batch_summed(&bufs, &sums, props, txg)?;
    // The copies these replace were just looked up (`read_bases`), which made them as
    // recent as the new ones: dropped first, they cannot push out live blocks.
    let replaced: Vec<BlkPtr> = at
        .iter()
        .filter_map(|bp| bp.as_ref().ok().copied())
        .collect();
    io.cache.forget(&replaced);
    for ((i, b, _), bp) in built.into_iter().zip(bps) {
        io.cache.insert(&bp, Arc::new(b));
        out[i] = Some(bp);
    }
    Ok(())
}
