//! Volumes: byte ranges over a dataset's blocks, written through the object's one range
//! write (`dmu::write::Writer`: patches, merges, streaming placement and holes, under range
//! locks over the volume's bytes).
//!
//! Every change is also queued as a record in the volume's intent log (under the same range
//! lock, so records of overlapping writes queue in the order they were applied); `flush`
//! makes the queue durable. Opening a volume first replays what its log holds from before a
//! crash.
//!
//! Architecture invariant: `zvol` sees blocks only through `dsl`/`dmu`; it never learns where
//! a block lives on disk.

pub mod receive;

use std::sync::Arc;

use crate::dmu::object::{spans, Fetched, Stream};
use crate::dmu::write::{Bytes, Landed, WriteError, Writer};
pub use crate::dmu::RangeLocks;
use crate::dsl::{Dataset, OpenTxg, Pool, PoolError};
use crate::spa::range_tree::RangeSet;
/// What `flush_then` calls, and how such a callback defers work to the end of the batch of
/// requests being answered with it (`zil::wake`).
pub use crate::zil::{after_wakeups, Done};
use crate::zil::{Payload, Record};
use crate::zio::ZioError;

/// Replays every volume's intent log (what `Volume::open` does for one): run after an
/// import by whoever will write to the pool, so no volume is served or copied before its
/// acknowledged writes are back. Returns how many volumes had records to replay.
pub fn replay_logs(pool: &Arc<Pool>) -> Result<usize, PoolError> {
    let mut n = 0;
    for ds in pool.datasets() {
        if pool.pending_replay(&ds).is_some() {
            Volume::open_as(pool, &ds.name, true)?;
            n += 1;
        }
    }
    Ok(n)
}

/// The intent-log record of a change the volume's writer made.
fn record_of(landed: Landed) -> Record {
    match landed {
        Landed::Bytes {
            txg,
            offset,
            buf,
            at,
            len,
        } => Record::Write {
            txg,
            offset,
            data: Payload::shared(buf, at, len),
        },
        Landed::Block { txg, offset, bp } => Record::Indirect { txg, offset, bp },
        Landed::Zeros { txg, offset, len } => Record::Zero { txg, offset, len },
    }
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
/// straight into the caller's buffer and are not cached: through the cache, each read
/// allocated, zeroed, cached and copied its blocks, and 64K reads lost to reading them
/// straight in, while 32K reads did better cached (figures: docs/perf/volume.md, "Why
/// streaming reads start at 64K").
pub const STREAMING_READ_BYTES: usize = 64 << 10;

/// Writes of at least this many bytes write their whole blocks to their place at once.
pub use crate::dmu::write::STREAMING_WRITE_BYTES;

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

/// The byte range `offset..end` cut into maximal runs `(offset, len, listed)`, in order:
/// listed where it lies in one of `blkids` (blocks of `bs` bytes, ascending), not between.
fn runs(
    offset: u64,
    end: u64,
    bs: u64,
    blkids: Vec<u64>,
) -> impl Iterator<Item = (u64, u64, bool)> {
    let mut out: Vec<(u64, u64, bool)> = Vec::new();
    let mut push = |start: u64, stop: u64, listed: bool| match out.last_mut() {
        Some(last) if last.2 == listed && last.0 + last.1 == start => last.1 = stop - last.0,
        _ => out.push((start, stop - start, listed)),
    };
    let mut pos = offset;
    for blkid in blkids {
        let start = (blkid * bs).max(offset);
        let stop = ((blkid + 1) * bs).min(end);
        if start > pos {
            push(pos, start, false);
        }
        push(start, stop, true);
        pos = stop;
    }
    if pos < end {
        push(pos, end, false);
    }
    out.into_iter()
}

/// A run of a volume that changed since a snapshot, or did not (`Volume::changes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub offset: u64,
    pub len: u64,
    pub changed: bool,
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

/// An open volume or snapshot: counted on its dataset while it lives (`Dataset::handles`).
pub struct Volume {
    pool: Arc<Pool>,
    ds: Arc<Dataset>,
    locks: RangeLocks,
    full_name: String,
    vol_name: String,
    /// A receive's handle: it writes a `readonly=on` volume, as `zfs receive` does.
    receiving: bool,
}

impl Drop for Volume {
    fn drop(&mut self) {
        self.ds.note_handle(false);
    }
}

impl Volume {
    /// Opens a volume, replaying its intent log first if it holds writes from before a crash;
    /// or a snapshot (`VOL@SNAP`), read-only.
    pub fn open(pool: &Arc<Pool>, name: &str) -> Result<Volume, PoolError> {
        Volume::open_as(pool, name, false)
    }

    /// `open` for `zeta receive`, which writes a volume set `readonly=on` (a backup target
    /// kept from every other writer).
    pub(crate) fn open_for_receive(pool: &Arc<Pool>, name: &str) -> Result<Volume, PoolError> {
        Volume::open_as(pool, name, true)
    }

    fn open_as(pool: &Arc<Pool>, name: &str, receiving: bool) -> Result<Volume, PoolError> {
        let ds = pool.dataset_or_snapshot(name)?;
        if !receiving && ds.receiving().is_some() {
            return Err(PoolError::PartlyReceived(format!("{}/{name}", pool.name)));
        }
        ds.note_handle(true);
        let vol = Volume {
            full_name: format!("{}/{}", pool.name, name),
            vol_name: name.to_string(),
            pool: pool.clone(),
            ds,
            locks: RangeLocks::new(),
            receiving,
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
            .dataset_or_snapshot(&self.vol_name)
            .is_ok_and(|d| Arc::ptr_eq(&d, &self.ds))
    }

    pub fn name(&self) -> &str {
        &self.full_name
    }

    /// The volume's name in its pool (`VOL`, or `VOL@SNAP`).
    pub(crate) fn vol_name(&self) -> &str {
        &self.vol_name
    }

    /// A snapshot, a volume set `readonly=on`, or any volume of a pool imported read-only:
    /// served with NBD's read-only flag, every write refused.
    pub fn read_only(&self) -> bool {
        self.pool.is_read_only() || self.ds.readonly()
    }

    /// `check` for a client's change: refused while the volume is set `readonly=on` (looked
    /// at on every change, so a client connected before it was set is refused from then on).
    /// A snapshot's refusal, and a read-only pool's, come from the pool.
    fn check_change(&self, op: &'static str, offset: u64, len: u64) -> Result<(), VolError> {
        if !self.receiving && !self.ds.snapshot && self.ds.readonly() {
            return Err(self.err(PoolError::ReadOnlyVolume(self.full_name.clone())));
        }
        self.check(op, offset, len)
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
        let stream = self.note_stream(first, count, len >= STREAMING_READ_BYTES);
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
        let blocks = (self.ds.object).read_blocks_streamed(&self.pool.io, first, direct, stream);
        self.copy_out(offset, buf, blocks)
    }

    /// Tells the volume's stream watcher (`dmu::zfetch`) of a read of blocks
    /// `first..first + count` and has what it asks for read ahead; what the watcher knows of
    /// the read.
    ///
    /// A `long` read (`STREAMING_READ_BYTES` or more) has nothing read ahead for it: it reads
    /// its blocks in one batch shared by two threads already, and where they lie in order
    /// the kernel reads ahead in the device's file; reading ahead for it cost up to a third
    /// of its speed in order and gained a tenth scattered (docs/perf/arc.md, "Why long reads
    /// are not read ahead of"). It still takes blocks read ahead for the short reads before.
    fn note_stream(&self, first: u64, count: u64, long: bool) -> Stream {
        let now = std::time::Instant::now();
        let first_again = self.ds.object.zfetch.rereads(first, now);
        if long || !self.pool.prefetch_enabled() {
            // Streams are still followed for `first_again`; nothing is read ahead.
            let read_ahead = (self.ds.object.zfetch).follow(first, count, now);
            return Stream {
                read_ahead: read_ahead && self.pool.prefetch_enabled(),
                first_again,
            };
        }
        let bs = self.block_size();
        let ahead = self.ds.object.zfetch.note(
            first,
            count,
            self.size().div_ceil(bs),
            bs,
            self.pool.io.cache.limit() / 8,
            now,
        );
        if !ahead.read.is_empty() {
            let n = ahead.read.end - ahead.read.start;
            self.pool.read_ahead(&self.ds, ahead.read.start, n);
        }
        Stream {
            read_ahead: ahead.streamed,
            first_again,
        }
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
        // The stream is told of the read once it is done: a read that would wait goes to
        // `read`, which tells it then.
        let again = (self.ds.object.zfetch).rereads(first, std::time::Instant::now());
        let blocks = (self.ds.object).read_blocks_nowait(&self.pool.io, first, count, again)?;
        self.pool.note_foreground_io();
        self.note_stream(first, count, buf.len() >= STREAMING_READ_BYTES);
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
                Fetched::Data(b) => {
                    dst.copy_from_slice(&b[sp.in_block..sp.in_block + sp.len]);
                    // A block read ahead and taken out for this read is no one else's now.
                    self.pool.io.cache.give_back(b);
                }
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
        match log {
            true => self.check_change("write", offset, data.len() as u64)?,
            false => self.check("write", offset, data.len() as u64)?,
        }
        self.pool.note_foreground_io();
        self.writer()
            .write(offset, data, &mut self.log_to(log))
            .map_err(|e| self.write_error(e))
    }

    /// `write`, if it can be done without waiting: a write of one whole block (below the
    /// streaming size) or a short write inside one block laid over it as a patch, with its
    /// bytes' range lock free and the pool's memory and space admitting it at once. `None`,
    /// with nothing done, if not: the caller hands it to a thread that may wait (`write`).
    /// Lets an NBD connection's reader take small writes itself rather than wake a worker
    /// for a few microseconds of work.
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
        if let Err(e) = self.check_change("write", offset, data.len() as u64) {
            return Ok(Err(e));
        }
        if data.is_empty() {
            return Err(data);
        }
        self.pool.note_foreground_io();
        self.writer()
            .write_nowait(offset, data, &mut self.log_to(true))
            .map(|written| written.map_err(|e| self.write_error(e)))
    }

    /// The writer of the volume's bytes into its dataset's object.
    fn writer(&self) -> Writer<'_, OpenTxg<'_>> {
        self.pool.writer(&self.ds, &self.locks)
    }

    /// What a change's log record says, queued in the volume's intent log (if `log`).
    fn log_to(&self, log: bool) -> impl FnMut(Landed) + '_ {
        move |landed| {
            if log {
                self.pool.append_log(&self.ds, record_of(landed));
            }
        }
    }

    fn write_error(&self, e: WriteError<PoolError>) -> VolError {
        match e {
            WriteError::Txg(e) => self.err(e),
            WriteError::Unreadable { blkid, source } => self.unreadable(blkid, source),
            WriteError::Tree(e) => self.err(e.into()),
        }
    }

    /// Frees the whole blocks inside the range and zeroes the partial ones at its edges, so the
    /// range reads as zeros afterwards.
    pub fn trim(&self, offset: u64, len: u64) -> Result<(), VolError> {
        self.trim_logged(offset, len, true)
    }

    fn trim_logged(&self, offset: u64, len: u64, log: bool) -> Result<(), VolError> {
        match log {
            true => self.check_change("trim", offset, len)?,
            false => self.check("trim", offset, len)?,
        }
        self.writer()
            .zero(offset, len, &mut self.log_to(log))
            .map_err(|e| self.write_error(e))
    }

    /// Writes zeros over the range. With `may_punch` whole blocks become holes (freed, as
    /// [`trim`](Self::trim) does); without it zeros are written as data. Either way the range
    /// reads as zeros. (All-zero blocks are stored as holes when their txg syncs, so on this
    /// copy-on-write pool "not punching" cannot reserve space; it only changes the work done.)
    pub fn write_zeroes(&self, offset: u64, len: u64, may_punch: bool) -> Result<(), VolError> {
        self.check_change("write zeroes", offset, len)?;
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
        out.extend(
            runs(offset, end, bs, present).map(|(offset, len, data)| Extent {
                offset,
                len,
                hole: !data,
            }),
        );
        Ok(out)
    }

    /// The snapshots of this volume older than what it reads now (its head: every snapshot;
    /// a snapshot: those before it), as (name after the `@`, txg), oldest first: the bases a
    /// changed-blocks map (`changes`) may be asked against.
    pub fn change_bases(&self) -> Vec<(String, u64)> {
        let (vol, mine) = match self.vol_name.split_once('@') {
            Some((v, _)) => (v, self.ds.created_txg),
            None => (self.vol_name.as_str(), u64::MAX),
        };
        (self.pool.snapshots_of(vol).into_iter())
            .filter(|s| s.created_txg < mine)
            .filter_map(|s| {
                let name = s.name.split_once('@')?.1.to_string();
                Some((name, s.created_txg))
            })
            .collect()
    }

    /// Which of the range differs from base snapshot `base` (a name from `change_bases`):
    /// runs of blocks, in order, each changed or not. A hole now is changed where the base
    /// held data.
    pub fn changes(&self, base: &str, offset: u64, len: u64) -> Result<Vec<Change>, VolError> {
        self.check("block status", offset, len)?;
        let mut out: Vec<Change> = Vec::new();
        if len == 0 {
            return Ok(out);
        }
        let vol = self.vol_name.split('@').next().unwrap_or_default();
        let snap = self
            .pool
            .snapshot_dataset(&format!("{vol}@{base}"))
            .map_err(|e| self.err(e))?;
        let bs = self.block_size();
        let end = offset + len;
        let io = &self.pool.io;
        let (from, to) = (offset / bs, end.div_ceil(bs));
        let (mut changed, holes) = (self.ds.object)
            .changed_blocks(io, from, to, snap.created_txg)
            .map_err(|e| self.err(e.into()))?;
        for (a, b) in holes {
            let held = snap
                .object
                .allocated_blocks(io, a, b)
                .map_err(|e| self.err(e.into()))?;
            changed.extend(held);
        }
        changed.sort_unstable();
        changed.dedup();
        out.extend(
            runs(offset, end, bs, changed).map(|(offset, len, changed)| Change {
                offset,
                len,
                changed,
            }),
        );
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
