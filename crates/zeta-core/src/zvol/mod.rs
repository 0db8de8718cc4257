//! Volumes: byte ranges over a dataset's blocks. Partial blocks are laid over their block
//! as patches, or merged in memory (read-modify-write), under a range lock: a merge holds its
//! whole block, a patch only its bytes, so concurrent requests touching the same block
//! cannot lose each other's bytes.
//!
//! Every change is also queued as a record in the volume's intent log (under the same range
//! lock, so records of overlapping writes queue in the order they were applied); `flush`
//! makes the queue durable. Opening a volume first replays what its log holds from before a
//! crash.
//!
//! Architecture invariant: `zvol` sees blocks only through `dsl`/`dmu`; it never learns where
//! a block lives on disk.

mod range_lock;

use std::sync::Arc;

use crate::dmu::object::{spans, Fetched};
use crate::dmu::Dirty;
use crate::dsl::{Dataset, Pool, PoolError};
use crate::spa::range_tree::RangeSet;
/// What `flush_then` calls, and how such a callback defers work to the end of the batch of
/// requests being answered with it (`zil::wake`).
pub use crate::zil::{after_wakeups, Done};
use crate::zil::{Payload, Record};
use crate::zio::ZioError;
pub use range_lock::RangeLocks;

/// Replays every volume's intent log (what `Volume::open` does for one): run after an
/// import by whoever will write to the pool, so no volume is served or copied before its
/// acknowledged writes are back. Returns how many volumes had records to replay.
pub fn replay_logs(pool: &Arc<Pool>) -> Result<usize, PoolError> {
    let mut n = 0;
    for ds in pool.datasets() {
        if pool.pending_replay(&ds).is_some() {
            Volume::open(pool, &ds.name)?;
            n += 1;
        }
    }
    Ok(n)
}

/// Which records of a log to apply, on a volume of `size` bytes: those within the volume
/// that set some byte no later record sets again. (Skipping the others changes nothing:
/// every byte ends with the value of the last record that sets it, whichever of the earlier
/// ones were applied.) A record past the end cannot come from the volume's history as it
/// stands (it was shrunk since): it is not applied, and hides nothing.
fn surviving(records: &[Record], size: u64) -> Vec<bool> {
    let mut covered = RangeSet::new();
    let mut live = vec![false; records.len()];
    for (i, r) in records.iter().enumerate().rev() {
        let (offset, len) = r.extent();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            continue;
        }
        live[i] = len > 0 && !covered.contains(offset, len);
        covered.union(offset, len);
    }
    live
}

/// Reads of at least this many bytes are streaming reads: whole blocks not in memory go
/// straight into the caller's buffer and are not cached. (At 256 KiB, an NBD client's 128K
/// reads each allocated, zeroed, cached and copied eight blocks: three times the user time
/// of reading them straight in. At 128 KiB, fio's 64K reads over NBD ran at 0.42-0.50 of
/// nbdkit's, against 0.70-0.76 straight in; 32K reads did better cached, 0.69-0.78 against
/// 0.58-0.71.)
pub const STREAMING_READ_BYTES: usize = 64 << 10;

/// Writes of at least this many bytes are streaming writes: their whole blocks are written to
/// their place at once, by the writer's thread, while the data is still in the processor's
/// cache (`Pool::place_blocks`); the txg's sync adopts them. Left to the sync, a stream's data
/// was copied into the kernel cold, long after it came, by one thread for the whole pool.
///
/// Their records point at blocks written as buffered writes, so a commit that covers them
/// flushes their devices, writeback of the txg in flight included; below this size a write
/// rather waits for its commit, which writes its block durably (`dsl::IN_PLACE_MIN_BYTES`),
/// or for its txg. (At 128K: fio over NBD with 16K blocks did 16.3-17.1k random 64K writes/s
/// against 20.4-20.8k at 32K, and `zeta bench load` with 32K writes and a flush every 5 did
/// 23k against 34k, though its p99 rose from 5 to 72 ms.)
pub const STREAMING_WRITE_BYTES: usize = 32 << 10;

#[derive(Debug, thiserror::Error)]
pub enum VolError {
    #[error("{op} of {len} bytes at offset {offset} lies past the end of {vol} ({size} bytes)")]
    OutOfRange {
        op: &'static str,
        vol: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("{vol}: {source}")]
    Pool { vol: String, source: PoolError },
    /// A block of the volume could not be read back intact: the range it covers is lost.
    #[error("{vol}: bytes {start}..{end} are unreadable: {source}")]
    Unreadable {
        vol: String,
        start: u64,
        end: u64,
        source: PoolError,
    },
}

impl VolError {
    /// The pool's devices had no room for the write (`PoolError::out_of_space`).
    pub fn out_of_space(&self) -> bool {
        match self {
            VolError::Pool { source, .. } | VolError::Unreadable { source, .. } => {
                source.out_of_space()
            }
            VolError::OutOfRange { .. } => false,
        }
    }
}

/// A run of a volume that is all data or all hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub hole: bool,
}

/// Room past its bytes that a buffer given to `Volume::write_nowait_owned` may have and still
/// be kept as it is: the slack of an allocator's size classes, not a larger buffer reused.
const OWNED_SLACK_BYTES: usize = 512;

/// A write's bytes: borrowed (copied into a buffer of the volume's if taken) or in a buffer
/// of their own (kept as it is).
enum Bytes<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
}

impl Bytes<'_> {
    fn len(&self) -> usize {
        match self {
            Bytes::Borrowed(b) => b.len(),
            Bytes::Owned(v) => v.len(),
        }
    }

    fn into_vec(self) -> Vec<u8> {
        match self {
            Bytes::Borrowed(b) => b.to_vec(),
            Bytes::Owned(v) => v,
        }
    }
}

pub struct Volume {
    pool: Arc<Pool>,
    ds: Arc<Dataset>,
    locks: RangeLocks,
    full_name: String,
    vol_name: String,
}

impl Volume {
    /// Opens a volume, replaying its intent log first if it holds writes from before a crash.
    pub fn open(pool: &Arc<Pool>, name: &str) -> Result<Volume, PoolError> {
        let ds = pool.dataset(name)?;
        let vol = Volume {
            full_name: format!("{}/{}", pool.name, name),
            vol_name: name.to_string(),
            pool: pool.clone(),
            ds,
            locks: RangeLocks::new(),
        };
        vol.replay()?;
        Ok(vol)
    }

    /// Applies the records the log kept from before a crash, in order, then commits them
    /// with a new log chain in one txg. Replaying again (a crash before that commit) gives
    /// the same volume: each record sets bytes to fixed contents.
    ///
    /// A record whose bytes later records all set again is skipped: its effect would not
    /// survive the replay. A log of large writes made in place may point at many versions
    /// of each block (as much as the pool had free when it crashed); copying every one of
    /// them again while the import still holds them all could need more space than the pool
    /// has. Records of writes in place are read one at a time, as they are applied.
    fn replay(&self) -> Result<(), PoolError> {
        let _once = self.ds.replay_lock.lock();
        let Some(records) = self.pool.pending_replay(&self.ds) else {
            return Ok(());
        };
        let live = surviving(&records, self.size());
        for (r, _) in records.iter().zip(&live).filter(|(_, &l)| l) {
            let applied = match r {
                Record::Write { offset, data, .. } => self.write_logged(*offset, data, false),
                Record::Zero { offset, len, .. } => self.trim_logged(*offset, *len, false),
                Record::Indirect { offset, bp, .. } => {
                    let data = self.pool.read_in_place(bp)?;
                    self.write_logged(*offset, &data, false)
                }
            };
            applied.map_err(|e| match e {
                VolError::Pool { source, .. } => source,
                other => PoolError::Invalid(format!("replaying the intent log: {other}")),
            })?;
        }
        self.pool.finish_replay(&self.ds)
    }

    /// Whether the pool still holds this volume (not destroyed, nor destroyed and
    /// re-created under the same name since it was opened).
    pub fn is_current(&self) -> bool {
        self.pool
            .dataset(&self.vol_name)
            .is_ok_and(|d| Arc::ptr_eq(&d, &self.ds))
    }

    pub fn name(&self) -> &str {
        &self.full_name
    }

    /// On a pool imported read-only: served with NBD's read-only flag, every write refused.
    pub fn read_only(&self) -> bool {
        self.pool.is_read_only()
    }

    pub fn size(&self) -> u64 {
        self.ds.volsize()
    }

    /// What a sync request the log could not make durable failed with, as `flush` returns
    /// it and the NBD server answers it: out of room while the pool waits for room; the
    /// pool's suspension, which says whether it was out of room, if it is suspended (the
    /// log's error is only words); else the log's words.
    pub fn log_error(&self, e: crate::zil::LogError) -> VolError {
        use crate::zil::LogError;
        let pool = self.pool.name.clone();
        self.err(match e {
            LogError::OutOfRoom(why) => PoolError::WaitingForRoom { pool, why },
            LogError::Failed(why) => match self.pool.suspension() {
                Some(s) => PoolError::Suspended {
                    pool,
                    why: s.why,
                    out_of_space: s.out_of_space,
                },
                None => PoolError::Invalid(why),
            },
        })
    }

    pub fn block_size(&self) -> u64 {
        self.ds.volblocksize as u64
    }

    fn err(&self, source: PoolError) -> VolError {
        VolError::Pool {
            vol: self.full_name.clone(),
            source,
        }
    }

    fn check(&self, op: &'static str, offset: u64, len: u64) -> Result<(), VolError> {
        let size = self.size();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(VolError::OutOfRange {
                op,
                vol: self.full_name.clone(),
                offset,
                len,
                size,
            }),
        }
    }

    /// The first block and the number of blocks that `len > 0` bytes at `offset` touch.
    fn blocks_of(&self, offset: u64, len: u64) -> (u64, u64) {
        let bs = self.block_size();
        let first = offset / bs;
        (first, (offset + len - 1) / bs - first + 1)
    }

    /// The error for block `blkid`, which no copy could supply.
    fn unreadable(&self, blkid: u64, e: crate::zio::ZioError) -> VolError {
        let bs = self.block_size();
        VolError::Unreadable {
            vol: self.full_name.clone(),
            start: blkid * bs,
            end: (blkid + 1) * bs,
            source: e.into(),
        }
    }

    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), VolError> {
        self.check("read", offset, buf.len() as u64)?;
        self.pool.note_foreground_io();
        let len = buf.len();
        if len == 0 {
            return Ok(());
        }
        let bs = self.block_size();
        let (first, count) = self.blocks_of(offset, len as u64);
        // A long read takes whole blocks that are not in memory straight into `buf`,
        // uncached (see `Object::read_blocks`).
        let streaming = len >= STREAMING_READ_BYTES;
        let mut direct: Vec<Option<&mut [u8]>> = Vec::with_capacity(count as usize);
        let mut rest: &mut [u8] = buf;
        for sp in spans(offset, len, bs) {
            let (this, tail) = std::mem::take(&mut rest).split_at_mut(sp.len);
            rest = tail;
            direct.push((streaming && sp.is_whole_block(bs)).then_some(this));
        }
        let blocks = self.ds.object.read_blocks(&self.pool.io, first, direct);
        self.copy_out(offset, buf, blocks)
    }

    /// `read`, if every block it needs is in memory or its device has it at once (on files,
    /// in the page cache); `None`, with nothing read, if one would wait for a device. For a
    /// thread that must not wait: an NBD connection's reader serves small reads this way.
    pub fn read_nowait(&self, offset: u64, buf: &mut [u8]) -> Option<Result<(), VolError>> {
        if let Err(e) = self.check("read", offset, buf.len() as u64) {
            return Some(Err(e));
        }
        if buf.is_empty() {
            return Some(Ok(()));
        }
        let (first, count) = self.blocks_of(offset, buf.len() as u64);
        let blocks = self
            .ds
            .object
            .read_blocks_nowait(&self.pool.io, first, count)?;
        self.pool.note_foreground_io();
        Some(self.copy_out(offset, buf, blocks))
    }

    /// Copies what `buf` (at `offset`) takes of each block read for it.
    fn copy_out(
        &self,
        offset: u64,
        buf: &mut [u8],
        blocks: Vec<Result<Fetched, ZioError>>,
    ) -> Result<(), VolError> {
        let len = buf.len();
        for (sp, block) in spans(offset, len, self.block_size()).zip(blocks) {
            let dst = &mut buf[sp.in_buf..sp.in_buf + sp.len];
            match block.map_err(|e| self.unreadable(sp.blkid, e))? {
                Fetched::Data(b) => dst.copy_from_slice(&b[sp.in_block..sp.in_block + sp.len]),
                Fetched::Hole => dst.fill(0),
                Fetched::Direct => {}
            }
        }
        Ok(())
    }

    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), VolError> {
        self.write_logged(offset, data, true)
    }

    /// A write, queued in the intent log if `log` (not when it is a replayed record).
    fn write_logged(&self, offset: u64, data: &[u8], log: bool) -> Result<(), VolError> {
        self.check("write", offset, data.len() as u64)?;
        self.pool.note_foreground_io();
        if data.is_empty() {
            return Ok(());
        }
        let bs = self.block_size();
        let first = offset / bs;
        let last = (offset + data.len() as u64 - 1) / bs;
        // A short write inside one block that can be laid over it as a patch holds only its
        // own bytes: patches of disjoint bytes commute, so sequential 4K writes into a 16K
        // block go side by side (queued on the whole block's lock, they spent 46 % of the
        // server's time in futex calls). If the block cannot take a patch (`patch` asks,
        // under this lock), the write waits for the whole block like any merge.
        if first == last && (data.len() as u64) < bs {
            let _guard = self.locks.lock(offset, offset + data.len() as u64 - 1);
            if self.patch(first, (offset % bs) as usize, data, log, true)? {
                return Ok(());
            }
        }
        let _guard = self.locks.lock(first * bs, (last + 1) * bs - 1);
        let streaming = data.len() >= STREAMING_WRITE_BYTES;
        let mut placed: Vec<(u64, &[u8])> = Vec::with_capacity(if streaming {
            (last - first + 1) as usize
        } else {
            0
        });
        for sp in spans(offset, data.len(), bs) {
            let src = &data[sp.in_buf..sp.in_buf + sp.len];
            if streaming && sp.is_whole_block(bs) {
                placed.push((sp.blkid, src));
                continue;
            }
            self.write_span(sp.blkid, sp.in_block, src, log)?;
        }
        if !placed.is_empty() {
            self.place(&placed, log)?;
        }
        Ok(())
    }

    /// `write`, if it can be done without waiting: a write of one whole block (below the
    /// streaming size) or a short write inside one block laid over it as a patch (`patch`),
    /// with its bytes' range lock free and the pool's memory and space admitting it at
    /// once. `None`, with nothing done, if not: the caller hands it to a thread that may wait
    /// (`write`). Lets an NBD connection's reader take small writes itself rather than wake
    /// a worker for a few microseconds of work.
    pub fn write_nowait(&self, offset: u64, data: &[u8]) -> Option<Result<(), VolError>> {
        self.write_nowait_from(offset, Bytes::Borrowed(data)).ok()
    }

    /// `write_nowait` of bytes in a buffer of their own, which the volume keeps as the
    /// block's or the patch's buffer instead of copying it (an NBD write's payload). If it
    /// would wait, the buffer comes back, untouched, as `Err`. A buffer with much more room
    /// than its bytes is copied: the pool counts the bytes a change holds, not its buffer's
    /// capacity.
    pub fn write_nowait_owned(
        &self,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<Result<(), VolError>, Vec<u8>> {
        if data.capacity() > data.len() + OWNED_SLACK_BYTES {
            return self.write_nowait(offset, &data).ok_or(data);
        }
        self.write_nowait_from(offset, Bytes::Owned(data))
            .map_err(Bytes::into_vec)
    }

    fn write_nowait_from<'a>(
        &self,
        offset: u64,
        data: Bytes<'a>,
    ) -> Result<Result<(), VolError>, Bytes<'a>> {
        let len = data.len();
        if let Err(e) = self.check("write", offset, len as u64) {
            return Ok(Err(e));
        }
        let bs = self.block_size();
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
        self.pool.note_foreground_io();
        // Asked before the buffer is made: a write that cannot patch costs no copy.
        if !whole && !self.ds.object.patchable(blkid) {
            return Err(data);
        }
        // The buffer the volume shares with the log record.
        let buf = Arc::new(data.into_vec());
        let written = if whole {
            self.put_block(blkid, buf.clone(), 0, len, true, false)
        } else {
            self.patch_with(blkid, in_block, buf.clone(), true, false)
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

    /// Writes the whole blocks of a streaming write to their place at once, from the
    /// caller's buffer (`Pool::place_blocks`), and logs them by pointer. If they cannot be
    /// placed because a device write failed, they take the ordinary path, whose sync writes
    /// them or reports the error as for any other block. A full pool refuses the write.
    fn place(&self, blocks: &[(u64, &[u8])], log: bool) -> Result<(), VolError> {
        let bs = self.block_size();
        let (txg, bps) = match self.pool.place_blocks(&self.ds, blocks) {
            Ok(placed) => placed,
            Err(PoolError::Zio(ZioError::Write(_))) => {
                for &(blkid, src) in blocks {
                    self.write_span(blkid, 0, src, log)?;
                }
                return Ok(());
            }
            Err(e) => return Err(self.err(e)),
        };
        if log {
            for (&(blkid, _), bp) in blocks.iter().zip(bps) {
                let offset = blkid * bs;
                self.append_log(match bp {
                    Some(bp) => Record::Indirect { txg, offset, bp },
                    None => Record::Zero {
                        txg,
                        offset,
                        len: bs,
                    },
                });
            }
        }
        Ok(())
    }

    /// Queues a change's record in the volume's intent log.
    fn append_log(&self, rec: Record) {
        self.pool.append_log(&self.ds, rec);
    }

    /// Writes `src` at `in_block` of block `blkid` into the open txg (the caller holds the
    /// block's range lock). A partial block is laid over what the block holds without
    /// reading it where it can be (`Pool::patch_block`), else merged with it here.
    fn write_span(
        &self,
        blkid: u64,
        in_block: usize,
        src: &[u8],
        log: bool,
    ) -> Result<(), VolError> {
        let bs = self.block_size();
        let whole = src.len() as u64 == bs;
        if !whole && self.patch(blkid, in_block, src, log, true)? {
            return Ok(());
        }
        let block = Arc::new(if whole {
            src.to_vec()
        } else {
            // The old contents are read straight into the new buffer, uncached: the write
            // supersedes them at once (the sync caches the new block).
            let mut b = vec![0u8; bs as usize];
            let old = self
                .ds
                .object
                .read_blocks(&self.pool.io, blkid, vec![Some(&mut b)]);
            match old
                .into_iter()
                .next()
                .expect("one block asked, one answered")
            {
                Ok(Fetched::Data(d)) => b.copy_from_slice(&d),
                Ok(Fetched::Hole | Fetched::Direct) => {}
                Err(e) => return Err(self.unreadable(blkid, e)),
            }
            b[in_block..in_block + src.len()].copy_from_slice(src);
            b
        });
        self.put_block(blkid, block, in_block, src.len(), log, true)?;
        Ok(())
    }

    /// Makes `block` the new contents of block `blkid` in the open txg and queues the record
    /// of the `len` bytes at `in_block` that the write changed, if `log`. Without `wait`,
    /// false, with nothing done, where the pool would have the write wait. The caller holds
    /// the block's range lock.
    fn put_block(
        &self,
        blkid: u64,
        block: Arc<Vec<u8>>,
        in_block: usize,
        len: usize,
        log: bool,
        wait: bool,
    ) -> Result<bool, VolError> {
        // The record shares the block's buffer, which the open txg holds anyway: no copy.
        // (A record of a block rewritten since keeps an older buffer alive; the pool counts
        // those bytes, `Zil::pinned_bytes`, and syncs and throttles on them.)
        let payload = Payload::shared(block.clone(), in_block, len);
        let Some(txg) = self
            .pool
            .dirty_block(&self.ds, blkid, Dirty::Data(block), wait)
            .map_err(|e| self.err(e))?
        else {
            return Ok(false);
        };
        if log {
            self.append_log(Record::Write {
                txg,
                offset: blkid * self.block_size() + in_block as u64,
                data: payload,
            });
        }
        Ok(true)
    }

    /// Lays `src` at `in_block` of block `blkid` over the block in the open txg without
    /// reading it, if the open txg has no whole change to it: the sync reads it once for all
    /// the txg's pieces (`Dirty::Patch`). False if the block cannot take a patch; the caller
    /// merges the block then. Asked first (`patchable`), so a write that cannot patch costs no
    /// copy and no second admission. The caller holds at least `src`'s bytes' range lock.
    ///
    /// Without `wait`, false also where the pool would have the write wait.
    fn patch(
        &self,
        blkid: u64,
        in_block: usize,
        src: &[u8],
        log: bool,
        wait: bool,
    ) -> Result<bool, VolError> {
        if !self.ds.object.patchable(blkid) {
            return Ok(false);
        }
        self.patch_with(blkid, in_block, Arc::new(src.to_vec()), log, wait)
    }

    /// `patch` of a piece in a buffer of its own, which becomes the patch's and the log
    /// record's (no copy). The caller has asked `patchable`.
    fn patch_with(
        &self,
        blkid: u64,
        in_block: usize,
        piece: Arc<Vec<u8>>,
        log: bool,
        wait: bool,
    ) -> Result<bool, VolError> {
        let len = piece.len();
        let patched = self
            .pool
            .patch_block(&self.ds, blkid, in_block, piece.clone(), wait)
            .map_err(|e| self.err(e))?;
        let Some(txg) = patched else {
            return Ok(false);
        };
        if log {
            self.append_log(Record::Write {
                txg,
                offset: blkid * self.block_size() + in_block as u64,
                data: Payload::shared(piece, 0, len),
            });
        }
        Ok(true)
    }

    /// Frees the whole blocks inside the range and zeroes the partial ones at its edges, so the
    /// range reads as zeros afterwards.
    pub fn trim(&self, offset: u64, len: u64) -> Result<(), VolError> {
        self.trim_logged(offset, len, true)
    }

    fn trim_logged(&self, offset: u64, len: u64, log: bool) -> Result<(), VolError> {
        self.check("trim", offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let bs = self.block_size();
        let end = offset + len;
        let first_whole = offset.div_ceil(bs);
        let end_whole = end / bs;
        let head_end = end.min(first_whole * bs);
        if !offset.is_multiple_of(bs) {
            self.write_logged(offset, &vec![0u8; (head_end - offset) as usize], log)?;
        }
        let tail_start = head_end.max(end_whole * bs);
        if tail_start < end {
            self.write_logged(tail_start, &vec![0u8; (end - tail_start) as usize], log)?;
        }
        if end_whole > first_whole {
            let _guard = self.locks.lock(first_whole * bs, end_whole * bs - 1);
            let present = self
                .ds
                .object
                .allocated_blocks(&self.pool.io, first_whole, end_whole)
                .map_err(|e| self.err(e.into()))?;
            // With nothing to free, the record still goes in the open txg's queue: harmless,
            // and it keeps "every change is queued" simple.
            let mut txg = self.pool.open_txg();
            for blkid in present {
                txg = self
                    .pool
                    .dirty_block(&self.ds, blkid, Dirty::Free, true)
                    .map_err(|e| self.err(e))?
                    .expect("a waiting change is made");
            }
            if log {
                self.append_log(Record::Zero {
                    txg,
                    offset: first_whole * bs,
                    len: (end_whole - first_whole) * bs,
                });
            }
        }
        Ok(())
    }

    /// Writes zeros over the range. With `may_punch` whole blocks become holes (freed, as
    /// [`trim`](Self::trim) does); without it zeros are written as data. Either way the range
    /// reads as zeros. (All-zero blocks are stored as holes when their txg syncs, so on this
    /// copy-on-write pool "not punching" cannot reserve space; it only changes the work done.)
    pub fn write_zeroes(&self, offset: u64, len: u64, may_punch: bool) -> Result<(), VolError> {
        self.check("write zeroes", offset, len)?;
        if may_punch {
            return self.trim(offset, len);
        }
        const CHUNK: u64 = 1 << 20;
        let zeros = vec![0u8; CHUNK.min(len) as usize];
        let mut pos = offset;
        while pos < offset + len {
            let n = CHUNK.min(offset + len - pos);
            self.write(pos, &zeros[..n as usize])?;
            pos += n;
        }
        Ok(())
    }

    /// Which parts of the range hold data and which are holes (never written, trimmed, or
    /// written as zeros and since synced), in order, adjacent extents of a kind merged.
    pub fn allocation(&self, offset: u64, len: u64) -> Result<Vec<Extent>, VolError> {
        self.check("block status", offset, len)?;
        let mut out: Vec<Extent> = Vec::new();
        if len == 0 {
            return Ok(out);
        }
        let bs = self.block_size();
        let end = offset + len;
        let present = self
            .ds
            .object
            .allocated_blocks(&self.pool.io, offset / bs, end.div_ceil(bs))
            .map_err(|e| self.err(e.into()))?;
        let push = |out: &mut Vec<Extent>, start: u64, stop: u64, hole: bool| match out.last_mut() {
            Some(last) if last.hole == hole && last.offset + last.len == start => {
                last.len = stop - last.offset
            }
            _ => out.push(Extent {
                offset: start,
                len: stop - start,
                hole,
            }),
        };
        let mut pos = offset;
        for blkid in present {
            let start = (blkid * bs).max(offset);
            let stop = ((blkid + 1) * bs).min(end);
            if start > pos {
                push(&mut out, pos, start, true);
            }
            push(&mut out, start, stop, false);
            pos = stop;
        }
        if pos < end {
            push(&mut out, pos, end, true);
        }
        Ok(out)
    }

    /// Reads the range's blocks into the cache without returning them (NBD_CMD_CACHE).
    pub fn prefetch(&self, offset: u64, len: u64) -> Result<(), VolError> {
        self.check("cache", offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let (first, count) = self.blocks_of(offset, len);
        let none = (0..count).map(|_| None).collect();
        let blocks = self.ds.object.read_blocks(&self.pool.io, first, none);
        for (blkid, block) in (first..).zip(blocks) {
            block.map_err(|e| self.unreadable(blkid, e))?;
        }
        Ok(())
    }

    /// Makes every write completed before this call durable.
    pub fn flush(&self) -> Result<(), VolError> {
        self.pool
            .commit_log_wait(&self.ds)
            .map_err(|e| self.log_error(e))
    }

    /// Makes every write completed before this call durable, then calls `done` (possibly on
    /// another thread: the caller's thread is not parked while the log commits).
    pub fn flush_then(&self, done: Done) {
        self.pool.commit_log(&self.ds, done)
    }

    /// `flush_then` from a thread that must not stay to commit other requests' records: it
    /// returns true if it left some waiting, and then `flush_then` must be called soon from
    /// a thread that may stay (`Log::commit_bounded`).
    pub fn flush_then_bounded(&self, done: Done) -> bool {
        self.pool.commit_log_bounded(&self.ds, done)
    }

    /// `flush_then` if it costs this thread no wait: the log's committer at work takes
    /// `done` with its next batch, or nothing is left to commit. Otherwise gives `done`
    /// back, for `flush_then` on a thread that may stay to commit (`Log::join`).
    pub fn flush_then_joined(&self, done: Done) -> Option<Done> {
        self.pool.join_log_commit(&self.ds, done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(offset: u64, len: usize) -> Record {
        Record::Write {
            txg: 5,
            offset,
            data: Payload::owned(vec![1; len]),
        }
    }

    #[test]
    fn records_whose_bytes_later_records_all_set_again_are_skipped() {
        let records = vec![
            write(0, 100),  // hidden by the zero below
            write(50, 100), // hidden too: [50, 150) lies inside [0, 200)
            write(300, 10), // nothing later touches it
            Record::Zero {
                txg: 6,
                offset: 0,
                len: 200,
            },
            write(150, 100), // sets [200, 250), which nothing later sets
            write(210, 20),
            write(900, 200), // past the end of a 1000-byte volume: not applied, hides nothing
            write(950, 40),
        ];
        assert_eq!(
            surviving(&records, 1000),
            vec![false, false, true, true, true, true, false, true]
        );
        // Two halves together hide a record neither hides alone.
        let records = vec![write(10, 20), write(0, 20), write(20, 20)];
        assert_eq!(surviving(&records, 1000), vec![false, true, true]);
    }
}
