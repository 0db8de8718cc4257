//! Writing a byte range into an object: which blocks it touches, which pieces are laid over
//! their block as patches, which are merged with the block's old bytes (read-modify-write),
//! which whole blocks of a long write go to their place at once, and which blocks a zeroed
//! range frees. Decided here once, for every user of objects (volumes now, files later).
//!
//! The txg a change joins, and whether it may wait for memory or room, belong to the pool
//! above: they come in through [`Txg`]. What landed where comes back through a callback,
//! called under the range lock of its bytes, so the caller's log records of overlapping
//! writes queue in the order the writes were applied.

use std::sync::Arc;

use super::object::{spans, Dirty, Fetched, Object, ObjectIo};
use super::range_lock::RangeLocks;
use crate::spa::BlkPtr;
use crate::zio::ZioError;

/// Writes of at least this many bytes are streaming writes: their whole blocks are written to
/// their place at once, by the writer's thread, while the data is still in the processor's
/// cache ([`Txg::place`]); the txg's sync adopts them. Left to the sync, a stream's data was
/// copied into the kernel cold, long after it came, by one thread for the whole pool.
///
/// Their records point at blocks written as buffered writes, so a commit that covers them
/// flushes their devices; below this size a write rather waits for its commit, which writes
/// its block durably (`dsl::IN_PLACE_MIN_BYTES`), or for its txg. Why 32K:
/// `docs/perf/volume.md`.
pub const STREAMING_WRITE_BYTES: usize = 32 << 10;

/// The open txg of the object's pool, as a writer of the object meets it.
pub trait Txg {
    type Error;

    /// Makes `change` block `blkid`'s change in the open txg; the txg it went into. Without
    /// `wait`, `None`, with nothing done, where new contents would wait (for memory, space, or
    /// the sync closing the txg).
    fn dirty(&self, blkid: u64, change: Dirty, wait: bool) -> Result<Option<u64>, Self::Error>;

    /// Lays `piece` at `at` of block `blkid` over the block's change in the open txg; `None`
    /// if that change cannot take a patch (or, without `wait`, where it would wait).
    fn patch(
        &self,
        blkid: u64,
        at: usize,
        piece: Arc<Vec<u8>>,
        wait: bool,
    ) -> Result<Option<u64>, Self::Error>;

    /// Writes whole blocks to their place now; their txg and pointers (`None`: all zeros, a
    /// hole). `Ok(None)` where a device write failed: the blocks then take the ordinary path,
    /// whose sync writes them or reports the error as for any other block.
    fn place(&self, blocks: &[(u64, &[u8])]) -> Result<Option<Placed>, Self::Error>;

    /// The txg that changes go into now.
    fn open_txg(&self) -> u64;
}

/// Whole blocks a streaming write placed: their txg, and a pointer per block (`None`: a hole).
pub type Placed = (u64, Vec<Option<BlkPtr>>);

/// What a write changed, for the caller's log: enough to apply it again after a crash.
pub enum Landed {
    /// `len` bytes at `at` of `buf` now at `offset` (the buffer the open txg holds: no copy).
    Bytes {
        txg: u64,
        offset: u64,
        buf: Arc<Vec<u8>>,
        at: usize,
        len: usize,
    },
    /// A whole block written to its place, at `offset`.
    Block { txg: u64, offset: u64, bp: BlkPtr },
    /// `len` bytes at `offset` now read as zeros.
    Zeros { txg: u64, offset: u64, len: u64 },
}

#[derive(Debug)]
pub enum WriteError<E> {
    /// The pool refused the change.
    Txg(E),
    /// Block `blkid`, whose old bytes a merge needed, could not be read back intact.
    Unreadable { blkid: u64, source: ZioError },
    /// The object's block tree could not be read.
    Tree(ZioError),
}

/// A write's bytes: borrowed (copied into a buffer of the object's if taken) or in a buffer
/// of their own (kept as it is).
pub enum Bytes<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
}

impl Bytes<'_> {
    pub fn len(&self) -> usize {
        match self {
            Bytes::Borrowed(b) => b.len(),
            Bytes::Owned(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Bytes::Borrowed(b) => b.to_vec(),
            Bytes::Owned(v) => v,
        }
    }
}

/// Writes into one object: its blocks, the reads a merge needs, the range locks of its bytes
/// (a merge holds its whole block, a patch only its bytes, so concurrent writes touching the
/// same block cannot lose each other's bytes) and the open txg of its pool.
pub struct Writer<'a, T> {
    pub object: &'a Object,
    pub io: &'a ObjectIo,
    pub locks: &'a RangeLocks,
    pub txg: T,
}

type WriteResult<T, E> = Result<T, WriteError<E>>;

impl<T: Txg> Writer<'_, T> {
    fn block_bytes(&self) -> u64 {
        self.object.block_bytes() as u64
    }

    /// Writes `data` at `offset`, waiting where the pool has writes wait. The caller has
    /// checked the range against the object's size.
    pub fn write(
        &self,
        offset: u64,
        data: &[u8],
        landed: &mut dyn FnMut(Landed),
    ) -> WriteResult<(), T::Error> {
        if data.is_empty() {
            return Ok(());
        }
        let bs = self.block_bytes();
        let first = offset / bs;
        let last = (offset + data.len() as u64 - 1) / bs;
        // A short write inside one block that can be laid over it as a patch holds only its
        // own bytes: patches of disjoint bytes commute, so sequential short writes into one
        // block go side by side. If the block cannot take a patch (`patch` asks, under this
        // lock), the write waits for the whole block like any merge.
        if first == last && (data.len() as u64) < bs {
            let _guard = self.locks.lock(offset, offset + data.len() as u64 - 1);
            if self.patch(first, (offset % bs) as usize, data, true, landed)? {
                return Ok(());
            }
        }
        let _guard = self.locks.lock(first * bs, (last + 1) * bs - 1);
        let streaming = data.len() >= STREAMING_WRITE_BYTES;
        let mut whole: Vec<(u64, &[u8])> = Vec::with_capacity(if streaming {
            (last - first + 1) as usize
        } else {
            0
        });
        for sp in spans(offset, data.len(), bs) {
            let src = &data[sp.in_buf..sp.in_buf + sp.len];
            if streaming && sp.is_whole_block(bs) {
                whole.push((sp.blkid, src));
                continue;
            }
            self.write_span(sp.blkid, sp.in_block, src, landed)?;
        }
        if !whole.is_empty() {
            self.place(&whole, landed)?;
        }
        Ok(())
    }

    /// `write`, if it can be done without waiting: a write of one whole block (below the
    /// streaming size) or a short write inside one block laid over it as a patch, with its
    /// bytes' range lock free and the pool admitting it at once. If it would wait, the bytes
    /// come back, untouched, as `Err`, with nothing done. A buffer of its own becomes the
    /// block's or the patch's buffer (no copy).
    pub fn write_nowait<'b>(
        &self,
        offset: u64,
        data: Bytes<'b>,
        landed: &mut dyn FnMut(Landed),
    ) -> Result<WriteResult<(), T::Error>, Bytes<'b>> {
        let len = data.len();
        let bs = self.block_bytes();
        let (blkid, in_block) = (offset / bs, (offset % bs) as usize);
        if len == 0 || in_block + len > bs as usize {
            return Err(data);
        }
        let whole = len as u64 == bs;
        if whole && len >= STREAMING_WRITE_BYTES {
            return Err(data);
        }
        // A whole block holds the block; a patch only its bytes (as in `write`).
        let Some(_guard) = self.locks.try_lock(offset, offset + len as u64 - 1) else {
            return Err(data);
        };
        // Asked before the buffer is made: a write that cannot patch costs no copy.
        if !whole && !self.object.patchable(blkid) {
            return Err(data);
        }
        let buf = Arc::new(data.into_vec());
        let written = if whole {
            self.put_block(blkid, buf.clone(), 0, len, false, landed)
        } else {
            self.patch_with(blkid, in_block, buf.clone(), false, landed)
        };
        match written {
            Ok(true) => Ok(Ok(())),
            Err(e) => Ok(Err(e)),
            // Not taken: nothing else holds the buffer now, so it comes back as it was.
            Ok(false) => Err(Bytes::Owned(
                Arc::try_unwrap(buf).unwrap_or_else(|b| b.as_ref().clone()),
            )),
        }
    }

    /// Makes `len` bytes at `offset` read as zeros: the whole blocks inside are freed (holes),
    /// the partial ones at the edges get zeros written over their bytes.
    pub fn zero(
        &self,
        offset: u64,
        len: u64,
        landed: &mut dyn FnMut(Landed),
    ) -> WriteResult<(), T::Error> {
        if len == 0 {
            return Ok(());
        }
        let bs = self.block_bytes();
        let end = offset + len;
        let first_whole = offset.div_ceil(bs);
        let end_whole = end / bs;
        let head_end = end.min(first_whole * bs);
        if !offset.is_multiple_of(bs) {
            self.write(offset, &vec![0u8; (head_end - offset) as usize], landed)?;
        }
        let tail_start = head_end.max(end_whole * bs);
        if tail_start < end {
            self.write(tail_start, &vec![0u8; (end - tail_start) as usize], landed)?;
        }
        if end_whole > first_whole {
            let _guard = self.locks.lock(first_whole * bs, end_whole * bs - 1);
            let present = self
                .object
                .allocated_blocks(self.io, first_whole, end_whole)
                .map_err(WriteError::Tree)?;
            // With nothing to free, the change is still reported: harmless, and it keeps
            // "every change is logged" simple.
            let mut txg = self.txg.open_txg();
            for blkid in present {
                txg = self
                    .txg
                    .dirty(blkid, Dirty::Free, true)
                    .map_err(WriteError::Txg)?
                    .expect("a waiting change is made");
            }
            landed(Landed::Zeros {
                txg,
                offset: first_whole * bs,
                len: (end_whole - first_whole) * bs,
            });
        }
        Ok(())
    }

    /// Writes the whole blocks of a streaming write to their place at once, from the
    /// caller's buffer. If a device write failed they take the ordinary path.
    fn place(
        &self,
        blocks: &[(u64, &[u8])],
        landed: &mut dyn FnMut(Landed),
    ) -> WriteResult<(), T::Error> {
        let bs = self.block_bytes();
        let Some((txg, bps)) = self.txg.place(blocks).map_err(WriteError::Txg)? else {
            for &(blkid, src) in blocks {
                self.write_span(blkid, 0, src, landed)?;
            }
            return Ok(());
        };
        assert_eq!(
            bps.len(),
            blocks.len(),
            "a pointer or a hole per block placed"
        );
        for (&(blkid, _), bp) in blocks.iter().zip(bps) {
            let offset = blkid * bs;
            landed(match bp {
                Some(bp) => Landed::Block { txg, offset, bp },
                None => Landed::Zeros {
                    txg,
                    offset,
                    len: bs,
                },
            });
        }
        Ok(())
    }

    /// Writes `src` at `in_block` of block `blkid` into the open txg (the caller holds the
    /// block's range lock). A partial block is laid over what the block holds without
    /// reading it where it can be (`patch`), else merged with it here.
    fn write_span(
        &self,
        blkid: u64,
        in_block: usize,
        src: &[u8],
        landed: &mut dyn FnMut(Landed),
    ) -> WriteResult<(), T::Error> {
        let bs = self.block_bytes();
        let whole = src.len() as u64 == bs;
        if !whole && self.patch(blkid, in_block, src, true, landed)? {
            return Ok(());
        }
        let block = Arc::new(if whole {
            src.to_vec()
        } else {
            // The old contents are read straight into the new buffer, uncached: the write
            // supersedes them at once (the sync caches the new block).
            let mut b = vec![0u8; bs as usize];
            let old = self.object.read_blocks(self.io, blkid, vec![Some(&mut b)]);
            match old
                .into_iter()
                .next()
                .expect("one block asked, one answered")
            {
                Ok(Fetched::Data(d)) => b.copy_from_slice(&d),
                Ok(Fetched::Hole | Fetched::Direct) => {}
                Err(source) => return Err(WriteError::Unreadable { blkid, source }),
            }
            b[in_block..in_block + src.len()].copy_from_slice(src);
            b
        });
        self.put_block(blkid, block, in_block, src.len(), true, landed)?;
        Ok(())
    }

    /// Makes `block` the new contents of block `blkid` in the open txg and reports the `len`
    /// bytes at `in_block` that the write changed. Without `wait`, false, with nothing done,
    /// where the pool would have the write wait. The caller holds the block's range lock.
    fn put_block(
        &self,
        blkid: u64,
        block: Arc<Vec<u8>>,
        in_block: usize,
        len: usize,
        wait: bool,
        landed: &mut dyn FnMut(Landed),
    ) -> WriteResult<bool, T::Error> {
        assert!(
            in_block + len <= block.len(),
            "the changed bytes lie in the block"
        );
        let Some(txg) = self
            .txg
            .dirty(blkid, Dirty::Data(block.clone()), wait)
            .map_err(WriteError::Txg)?
        else {
            return Ok(false);
        };
        landed(Landed::Bytes {
            txg,
            offset: blkid * self.block_bytes() + in_block as u64,
            buf: block,
            at: in_block,
            len,
        });
        Ok(true)
    }

    /// Lays `src` at `in_block` of block `blkid` over the block in the open txg without
    /// reading it, if the open txg has no whole change to it: the sync reads it once for all
    /// the txg's pieces (`Dirty::Patch`). False if the block cannot take a patch; the caller
    /// merges the block then. Asked first (`patchable`), so a write that cannot patch costs no
    /// copy and no second admission. The caller holds at least `src`'s bytes' range lock.
    fn patch(
        &self,
        blkid: u64,
        in_block: usize,
        src: &[u8],
        wait: bool,
        landed: &mut dyn FnMut(Landed),
    ) -> WriteResult<bool, T::Error> {
        if !self.object.patchable(blkid) {
            return Ok(false);
        }
        self.patch_with(blkid, in_block, Arc::new(src.to_vec()), wait, landed)
    }

    /// `patch` of a piece in a buffer of its own, which becomes the patch's and the caller's
    /// record's (no copy). The caller has asked `patchable`.
    fn patch_with(
        &self,
        blkid: u64,
        in_block: usize,
        piece: Arc<Vec<u8>>,
        wait: bool,
        landed: &mut dyn FnMut(Landed),
    ) -> WriteResult<bool, T::Error> {
        let len = piece.len();
        let patched = self
            .txg
            .patch(blkid, in_block, piece.clone(), wait)
            .map_err(WriteError::Txg)?;
        let Some(txg) = patched else {
            return Ok(false);
        };
        landed(Landed::Bytes {
            txg,
            offset: blkid * self.block_bytes() + in_block as u64,
            buf: piece,
            at: 0,
            len,
        });
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::dmu::dnode::{DnodePhys, ObjectKind};
    use crate::dmu::BlockCache;
    use crate::spa::{AllocClass, Allocator, BlockKind};
    use crate::zio::Zio;
    use zeta_math::ChecksumKind;

    const BS: u64 = 16 << 10;

    /// An open txg that takes every change at once into the object (txg 1), and writes the
    /// blocks of a streaming write as holes or refuses them as a failed device would.
    struct Recorder<'a> {
        object: &'a Object,
        place_fails: bool,
        calls: Mutex<Vec<String>>,
    }

    impl Txg for &Recorder<'_> {
        type Error = String;

        fn dirty(&self, blkid: u64, change: Dirty, _wait: bool) -> Result<Option<u64>, String> {
            let kind = match &change {
                Dirty::Data(_) => "data",
                Dirty::Free => "free",
                _ => "other",
            };
            self.calls.lock().unwrap().push(format!("{kind} {blkid}"));
            self.object.dirty(blkid, change);
            Ok(Some(1))
        }

        fn patch(
            &self,
            blkid: u64,
            at: usize,
            piece: Arc<Vec<u8>>,
            _wait: bool,
        ) -> Result<Option<u64>, String> {
            let taken = self.object.patch(blkid, at, piece).is_some();
            (self.calls.lock().unwrap()).push(format!("patch {blkid} {at} {taken}"));
            Ok(taken.then_some(1))
        }

        fn place(&self, blocks: &[(u64, &[u8])]) -> Result<Option<Placed>, String> {
            let ids: Vec<String> = blocks.iter().map(|b| b.0.to_string()).collect();
            (self.calls.lock().unwrap()).push(format!("place {}", ids.join(",")));
            Ok((!self.place_fails).then(|| (1, vec![None; blocks.len()])))
        }

        fn open_txg(&self) -> u64 {
            1
        }
    }

    fn object() -> Object {
        Object::new(
            DnodePhys::new(
                ObjectKind::VolumeData,
                BS as u32,
                ChecksumKind::Fletcher4 as u8,
                1,
            ),
            BlockKind::Data,
            AllocClass::Recorded,
        )
    }

    /// An object's reads with no devices: a new object's blocks are holes or in memory.
    fn io() -> ObjectIo {
        ObjectIo {
            zio: Arc::new(Zio::new(vec![], Allocator::new(&[]))),
            cache: Arc::new(BlockCache::new(1 << 20)),
        }
    }

    /// Runs `f` with a writer over a new object; the pool's calls and what landed, as words.
    fn run(
        place_fails: bool,
        f: impl FnOnce(&Writer<&Recorder>, &mut dyn FnMut(Landed)),
    ) -> (Vec<String>, Vec<String>, Object) {
        let (object, io, locks) = (object(), io(), RangeLocks::new());
        let rec = Recorder {
            object: &object,
            place_fails,
            calls: Mutex::new(Vec::new()),
        };
        let w = Writer {
            object: &object,
            io: &io,
            locks: &locks,
            txg: &rec,
        };
        let mut landed = Vec::new();
        f(&w, &mut |l| {
            landed.push(match l {
                Landed::Bytes { offset, len, .. } => format!("bytes {offset}+{len}"),
                Landed::Block { offset, .. } => format!("block {offset}"),
                Landed::Zeros { offset, len, .. } => format!("zeros {offset}+{len}"),
            })
        });
        let calls = rec.calls.into_inner().unwrap();
        (calls, landed, object)
    }

    #[test]
    fn a_long_write_places_its_whole_blocks_and_patches_its_edges() {
        let data = vec![5u8; 3 * BS as usize];
        let (calls, landed, _) = run(false, |w, l| {
            w.write(BS / 2, &data, l).unwrap();
        });
        assert_eq!(
            calls,
            ["patch 0 8192 true", "patch 3 0 true", "place 1,2"],
            "edges patched as they come, whole blocks placed together"
        );
        assert_eq!(
            landed,
            [
                "bytes 8192+8192",
                "bytes 49152+8192",
                "zeros 16384+16384",
                "zeros 32768+16384"
            ]
        );
    }

    #[test]
    fn whole_blocks_a_device_refused_take_the_ordinary_path() {
        let data = vec![5u8; 2 * BS as usize];
        let (calls, landed, _) = run(true, |w, l| w.write(0, &data, l).unwrap());
        assert_eq!(calls, ["place 0,1", "data 0", "data 1"]);
        assert_eq!(landed, ["bytes 0+16384", "bytes 16384+16384"]);
    }

    #[test]
    fn a_short_write_into_a_whole_change_is_merged_with_it() {
        let io = io();
        let (calls, _, object) = run(false, |w, l| {
            w.write(0, &vec![1u8; BS as usize], l).unwrap();
            w.write(100, &[2u8; 10], l).unwrap();
        });
        // The second write could not patch (the open txg holds the whole block): it read the
        // block and wrote it whole, with both writes' bytes.
        assert_eq!(calls, ["data 0", "data 0"]);
        let block = object.read_block(&io, 0).unwrap().expect("data");
        assert_eq!(&block[..100], &[1u8; 100][..]);
        assert_eq!(&block[100..110], &[2u8; 10][..]);
        assert_eq!(&block[110..], &vec![1u8; BS as usize - 110][..]);
    }

    #[test]
    fn zeroing_frees_the_whole_blocks_it_covers_and_zeroes_its_edges() {
        let (calls, landed, _) = run(false, |w, l| {
            w.write(BS, &vec![9u8; BS as usize], l).unwrap();
            w.zero(BS / 4, 2 * BS, l).unwrap();
        });
        assert_eq!(
            calls,
            ["data 1", "patch 0 4096 true", "patch 2 0 true", "free 1"],
            "the never-written block 0's edge is patched, block 1 freed"
        );
        assert_eq!(
            landed,
            [
                "bytes 16384+16384",
                "bytes 4096+12288",
                "bytes 32768+4096",
                "zeros 16384+16384"
            ]
        );
    }

    #[test]
    fn a_write_that_would_wait_for_a_lock_comes_back_untouched() {
        let (calls, _, _) = run(false, |w, l| {
            let _held = w.locks.lock(0, 99);
            let back = w.write_nowait(50, Bytes::Owned(vec![3u8; 10]), l);
            match back {
                Err(Bytes::Owned(v)) => assert_eq!(v, vec![3u8; 10]),
                _ => panic!("a write under a held lock must come back"),
            }
            // Elsewhere in the block it goes in as a patch.
            assert!(matches!(
                w.write_nowait(200, Bytes::Borrowed(&[4u8; 10]), l),
                Ok(Ok(()))
            ));
        });
        assert_eq!(calls, ["patch 0 200 true"]);
    }
}
