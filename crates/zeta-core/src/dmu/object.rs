//! One object: a sparse array of `data_block_bytes` blocks behind a copy-on-write tree of
//! indirect blocks. Writes land in the open txg's dirty map; `sync` writes a txg's dirty blocks
//! to new places and rewrites the path of indirect blocks above them up to a new root.
//! Patched blocks (`patch`) and the walks of the block-pointer tree (`tree`) have files of
//! their own.

mod dirty_map;
mod patch;
mod tree;

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use zerocopy::{FromBytes, IntoBytes};

use super::cache::BlockCache;
use super::dnode::{DnodePhys, IND_BLOCK_BYTES, IND_SHIFT};
use super::zfetch::Zfetch;
use crate::spa::bp::BP_BYTES;
use crate::spa::{AllocClass, BlkPtr, BlockKind};
use crate::zio::compress::Compression;
use crate::zio::{WriteProps, Zio, ZioError};
use zeta_math::zero::is_zero;
use zeta_math::ChecksumKind;

use dirty_map::{open_map_after, open_range, GroupMap, OpenMap, SyncingMap};
use patch::{covers, lay_pieces, overlay, read_spare, sync_patched, Patched};
use tree::{collect_blkids, lookup, Leaves};

pub use patch::Piece;
pub use tree::{dead_between, walk, walk_from, Unwalked, Visit};

const FANOUT: usize = 1 << IND_SHIFT;

/// The part of one block a byte range covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub blkid: u64,
    /// Offset of the span inside its block.
    pub in_block: usize,
    /// Offset of the span inside the caller's buffer.
    pub in_buf: usize,
    pub len: usize,
}

impl Span {
    pub fn is_whole_block(&self, block_bytes: u64) -> bool {
        self.len as u64 == block_bytes
    }
}

/// Bytes a tree takes on the devices, kept as a sync writes and frees its blocks. Saturating:
/// the starting figure comes from disk, and a damaged one must not stop a sync (a recount,
/// `used_recounted`, tells the truth). Beside it, the object's `Retain` as the sync goes: a
/// copy, written back only once the sync has succeeded. `sizes` are what the tree's blocks
/// hold and store (`DnodePhys::logical_bytes`, `physical_bytes`), kept the same way.
struct Used {
    bytes: u64,
    sizes: Sizes,
    retain: Retain,
}

/// The logical and stored bytes of blocks, each block once (`DnodePhys::logical_bytes`,
/// `physical_bytes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sizes {
    pub logical: u64,
    pub physical: u64,
}

impl Sizes {
    /// The sizes of `bps`' blocks.
    pub fn of<'a>(bps: impl IntoIterator<Item = &'a BlkPtr>) -> Sizes {
        let mut s = Sizes::default();
        for bp in bps {
            s.logical += bp.lsize.get() as u64;
            s.physical += bp.psize.get() as u64;
        }
        s
    }

    /// `logical / physical`, the `compressratio` (1 for no blocks).
    pub fn ratio(&self) -> f64 {
        match self.physical {
            0 => 1.0,
            p => self.logical as f64 / p as f64,
        }
    }
}

impl Used {
    fn add<'a>(&mut self, bps: impl IntoIterator<Item = &'a BlkPtr, IntoIter: Clone>) {
        // Every block a sync adds is born in its txg, after any snapshot.
        let bps = bps.into_iter();
        let n: u64 = bps.clone().map(BlkPtr::asize_total).sum();
        self.bytes = self.bytes.saturating_add(n);
        self.retain.fresh = self.retain.fresh.saturating_add(n);
        let s = Sizes::of(bps);
        self.sizes.logical = self.sizes.logical.saturating_add(s.logical);
        self.sizes.physical = self.sizes.physical.saturating_add(s.physical);
    }

    fn sub(&mut self, bps: &[BlkPtr]) {
        let n: u64 = bps.iter().map(BlkPtr::asize_total).sum();
        self.bytes = self.bytes.saturating_sub(n);
        let s = Sizes::of(bps);
        self.sizes.logical = self.sizes.logical.saturating_sub(s.logical);
        self.sizes.physical = self.sizes.physical.saturating_sub(s.physical);
    }

    /// Lets go of blocks a sync's tree no longer reaches, in txg `txg`: out of the cache and
    /// no longer counted, and freed unless a snapshot still holds them (born at or before
    /// `keep_upto`: OpenZFS's `dsl_dataset_block_kill` rule), when they are kept for the
    /// object's owner to put on its deadlist. The one place a tree's blocks leave it.
    fn let_go(&mut self, io: &ObjectIo, bps: &[BlkPtr], txg: u64, class: AllocClass) {
        io.cache.forget(bps);
        self.sub(bps);
        // No snapshot (0): everything goes, whatever a damaged pointer says its birth is.
        let keep_upto = self.retain.keep_upto;
        let kept = |bp: &BlkPtr| keep_upto > 0 && bp.birth_txg.get() <= keep_upto;
        let own: std::borrow::Cow<[BlkPtr]> = if bps.iter().any(kept) {
            let (kept, own): (Vec<BlkPtr>, Vec<BlkPtr>) = bps.iter().partition(|bp| kept(bp));
            self.retain.kept.extend(kept);
            own.into()
        } else {
            bps.into()
        };
        io.zio.free_all(&own, txg, class);
        let freed: u64 = own.iter().map(BlkPtr::asize_total).sum();
        self.retain.fresh = self.retain.fresh.saturating_sub(freed);
    }
}

/// What a sync does with the blocks it lets go, for an object a snapshot shares (a volume's
/// head): blocks born at or before `keep_upto` (the latest snapshot's txg; 0: none) belong to
/// that snapshot too and are handed back (`take_kept`) instead of freed. `fresh` counts the
/// bytes of the tree born after `keep_upto` (`written` since the snapshot).
#[derive(Default)]
struct Retain {
    keep_upto: u64,
    fresh: u64,
    kept: Vec<BlkPtr>,
}

/// `Object::changed_blocks`' answer: the block ids that changed, and the runs `[a, b)` of
/// holes under subtrees born since, which may have held data then.
pub type Changed = (Vec<u64>, Vec<(u64, u64)>);

/// Cuts `len` bytes at `offset` into per-block spans, in order.
pub fn spans(offset: u64, len: usize, block_bytes: u64) -> impl Iterator<Item = Span> {
    let mut done = 0usize;
    std::iter::from_fn(move || {
        if done >= len {
            return None;
        }
        let at = offset + done as u64;
        let in_block = (at % block_bytes) as usize;
        let n = (block_bytes as usize - in_block).min(len - done);
        let span = Span {
            blkid: at / block_bytes,
            in_block,
            in_buf: done,
            len: n,
        };
        done += n;
        Some(span)
    })
}

/// What the objects of a pool need from below: verified, cached block reads and writes.
pub struct ObjectIo {
    pub zio: Arc<Zio>,
    pub cache: Arc<BlockCache>,
}

/// How a read gets a block that is not in memory: from its device, however long that takes,
/// or only if the device has it at once (`Zio::read_nowait`).
#[derive(Clone, Copy, PartialEq)]
enum Wait {
    Yes,
    No,
}

impl ObjectIo {
    /// A verified block, from the cache or else read and cached; with `Wait::No`, `None`
    /// where the read would have to wait for a device.
    fn fetch(&self, bp: &BlkPtr, wait: Wait) -> Result<Option<Arc<Vec<u8>>>, ZioError> {
        self.fetch_as(bp, wait, false)
    }

    /// `fetch`; with `again`, a hit is not a new use of the block (`BlockCache::get_again`).
    fn fetch_as(
        &self,
        bp: &BlkPtr,
        wait: Wait,
        again: bool,
    ) -> Result<Option<Arc<Vec<u8>>>, ZioError> {
        let cached = if again {
            self.cache.get_again(bp)
        } else {
            self.cache.get(bp)
        };
        if let Some(b) = cached {
            return Ok(Some(b));
        }
        if bp.compression != crate::zio::compress::BP_OFF {
            // Kept as stored (the compressed ARC), handed out decompressed.
            let stored = match wait {
                Wait::Yes => self.zio.read_stored(bp)?,
                Wait::No => match self.zio.read_stored_nowait(bp) {
                    Some(data) => data,
                    None => return Ok(None),
                },
            };
            let data = Arc::new(Zio::decode_stored(bp, &stored)?);
            self.cache.insert_stored(bp, Arc::new(stored), false);
            return Ok(Some(data));
        }
        let data = match wait {
            Wait::Yes => self.zio.read(bp)?,
            Wait::No => match self.zio.read_nowait(bp) {
                Some(data) => data,
                None => return Ok(None),
            },
        };
        let data = Arc::new(data);
        self.cache.insert(bp, data.clone());
        Ok(Some(data))
    }

    pub fn read_bp(&self, bp: &BlkPtr) -> Result<Arc<Vec<u8>>, ZioError> {
        self.fetch(bp, Wait::Yes)
            .map(|b| b.expect("a waiting read answers"))
    }
}

/// What the stream watcher (`zfetch`) knows of a read, for `Object::read_blocks_streamed`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stream {
    /// The read continues a stream read ahead of: a block with a buffer in `direct` is
    /// looked for in the cache first (waiting for it if it is being read ahead), and taken
    /// out as it is used (`BlockCache::take_prefetched`).
    pub read_ahead: bool,
    /// Its first block is the one the stream's last read ended in: a hit on it is not a new
    /// use (`BlockCache::get_again`).
    pub first_again: bool,
}

/// What the dirty maps tell `read_blocks` of a block.
enum Known {
    Fetched(Fetched),
    /// Placed there in a txg not yet synced: read like a block of the tree.
    At(BlkPtr),
}

/// What the dirty maps tell of a block: a whole change (`None`: the tree has the block), and
/// the pieces patched over it since, oldest first.
type Seen = (Option<Known>, Vec<Piece>);

/// What `Object::read_blocks` found for one block.
#[derive(Clone, Debug)]
pub enum Fetched {
    /// Never written, or freed: reads as zeros.
    Hole,
    Data(Arc<Vec<u8>>),
    /// Read and verified into the buffer the caller gave for it.
    Direct,
}

#[derive(Clone, Debug)]
pub enum Dirty {
    Data(Arc<Vec<u8>>),
    /// Bytes written over parts of the block in this txg, on top of what it held before, which
    /// was not read for them: the sync reads it once and lays them over it (as do readers,
    /// to show the block meanwhile). A short write into a large block so costs neither a read
    /// before its reply nor a block of memory until its txg (OpenZFS reads the block first).
    Patch(Vec<Piece>),
    Free,
    /// New contents already written to their place (a streaming write, `Pool::place_blocks`)
    /// in this very txg: the sync adopts the copy, and nothing is held in memory meanwhile.
    /// Allocated outside the space map until then, so a copy no sync adopts must be freed by
    /// whoever supersedes it (`dirty` returns it) or destroys the object (`free_all`).
    /// Boxed: a block pointer is 128 bytes, and every change in the dirty maps would take
    /// that much room; the other kinds fit in 24.
    Placed(Box<BlkPtr>),
}

impl Dirty {
    /// The bytes this change counts as dirty: what the sync still has to write for it (and
    /// the space it will take), whatever it holds in memory.
    fn bytes(&self, block_bytes: u64) -> u64 {
        match self {
            Dirty::Data(d) => d.len() as u64,
            Dirty::Placed(bp) => bp.lsize.get() as u64,
            Dirty::Patch(_) => block_bytes,
            Dirty::Free => 0,
        }
    }

    /// The bytes this change holds in memory until its sync.
    fn held(&self) -> u64 {
        match self {
            Dirty::Data(d) => d.len() as u64,
            Dirty::Patch(pieces) => held(pieces),
            Dirty::Placed(_) | Dirty::Free => 0,
        }
    }

    /// Whether the block holds data after this change (it is not freed).
    fn holds_data(&self) -> bool {
        !matches!(self, Dirty::Free)
    }

    /// Where a placed change's copy lies.
    fn placed(&self) -> Option<BlkPtr> {
        match self {
            Dirty::Placed(bp) => Some(**bp),
            _ => None,
        }
    }
}

fn held(pieces: &[Piece]) -> u64 {
    pieces.iter().map(|p| p.len as u64).sum()
}

/// How a change to a block moved an object's dirty counts (`Dirty::bytes`, `Dirty::held`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    pub bytes: i64,
    pub held: i64,
    /// Bytes of level-1 indirect blocks (all their copies) the txg's sync will write anew
    /// for this change: those of a block whose group of `FANOUT` blocks had no other change
    /// in the txg. The sync's other metadata (higher levels, the MOS) is a few blocks.
    pub meta: i64,
}

/// What a txg's changes to an object held when its sync began: all dirty bytes, those of
/// them already written to their place (`Dirty::Placed`), whose space is allocated, and the
/// bytes held in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncBytes {
    pub dirty: u64,
    pub placed: u64,
    pub held: u64,
    /// The level-1 indirect blocks it rewrites (`Delta::meta`).
    pub meta: u64,
}

impl std::ops::AddAssign for SyncBytes {
    fn add_assign(&mut self, b: SyncBytes) {
        self.dirty += b.dirty;
        self.placed += b.placed;
        self.held += b.held;
        self.meta += b.meta;
    }
}

impl std::iter::Sum for SyncBytes {
    fn sum<I: Iterator<Item = SyncBytes>>(iter: I) -> SyncBytes {
        iter.fold(SyncBytes::default(), |mut a, b| {
            a += b;
            a
        })
    }
}

/// A dirty block already written in place (by the intent log, ahead of its txg): the buffer
/// it was written from, and where.
type Override = (Arc<Vec<u8>>, BlkPtr);

impl State {
    /// Bytes a level-1 indirect block takes with all its copies (as `sync` writes them).
    fn indirect_bytes(&self) -> u64 {
        IND_BLOCK_BYTES as u64 * indirect_copies(self.dnode.copies) as u64
    }

    /// Counts a change to block `blkid` new in the open txg in its group; returns the bytes
    /// of indirect block the sync then writes for it (`Delta::meta`): none if its group had
    /// a change already.
    fn note_new_change(&mut self, blkid: u64) -> i64 {
        let n = self.open_groups.entry(blkid >> IND_SHIFT).or_insert(0);
        *n += 1;
        if *n == 1 {
            self.indirect_bytes() as i64
        } else {
            0
        }
    }

    /// What the unsynced txgs say of block `blkid`: the newest change that replaces it whole
    /// (in the open txg, else in the syncing one; `None` if neither has one: the tree holds
    /// it), and the pieces patched over that since, oldest first.
    fn seen(&self, blkid: u64) -> (Option<&Dirty>, Vec<Piece>) {
        let mut layers: Vec<&[Piece]> = Vec::new();
        let mut base = None;
        let syncing = self.syncing.as_deref().and_then(|s| s.get(blkid));
        for change in [self.open.get(&blkid), syncing] {
            match change {
                None => {}
                Some(Dirty::Patch(p)) => layers.push(p),
                Some(d) => {
                    base = Some(d);
                    break;
                }
            }
        }
        let pieces = layers.into_iter().rev().flatten().cloned().collect();
        (base, pieces)
    }
}

struct State {
    dnode: DnodePhys,
    open: OpenMap,
    /// How many changes the open txg holds in each group of `FANOUT` blocks (one level-1
    /// indirect block's children): each group present is an indirect block its sync writes.
    open_groups: GroupMap,
    syncing: Option<Arc<SyncingMap>>,
    /// Blocks of the open txg written ahead; the sync adopts those whose buffer is still the
    /// dirty one and frees the others.
    overrides: BTreeMap<u64, Override>,
    syncing_overrides: BTreeMap<u64, Override>,
    /// Pointers a test has the next syncs forge (`Object::forge`).
    forged: Vec<Forgery>,
    /// Which blocks the syncs let go of stay for a snapshot.
    retain: Retain,
}

/// What a test does to a pointer (`Object::forge`).
pub type Forge = Box<dyn FnOnce(&mut BlkPtr, &ObjectIo) + Send>;

/// A test's change to the pointer to block `.1` of level `.0` (`Object::forge`).
type Forgery = (u8, u64, Forge);

pub struct Object {
    data_kind: BlockKind,
    class: AllocClass,
    state: Mutex<State>,
    /// Its demand reads' streams, for reading ahead (`dmu::zfetch`).
    pub zfetch: Zfetch,
}

/// Copies of an indirect block of an object whose data has `copies`: one more than the
/// data, at least two, at most three (as OpenZFS keeps metadata).
fn indirect_copies(copies: u8) -> usize {
    (copies as usize).clamp(2, 3)
}

fn bp_at(block: &[u8], slot: usize) -> BlkPtr {
    BlkPtr::read_from_bytes(&block[slot * BP_BYTES..(slot + 1) * BP_BYTES]).expect("exact size")
}

fn set_bp(block: &mut [u8], slot: usize, bp: &BlkPtr) {
    block[slot * BP_BYTES..(slot + 1) * BP_BYTES].copy_from_slice(bp.as_bytes());
}

impl Object {
    pub fn new(dnode: DnodePhys, data_kind: BlockKind, class: AllocClass) -> Object {
        Object {
            data_kind,
            class,
            state: Mutex::new(State {
                dnode,
                open: OpenMap::default(),
                open_groups: GroupMap::default(),
                syncing: None,
                overrides: BTreeMap::new(),
                syncing_overrides: BTreeMap::new(),
                forged: Vec::new(),
                retain: Retain::default(),
            }),
            zfetch: Zfetch::new(),
        }
    }

    /// From the next sync on, blocks born at or before `txg` that the tree lets go of are kept
    /// for a snapshot (handed back by `take_kept`), not freed; `fresh` is what the tree now
    /// holds born after `txg`.
    pub fn set_keep_upto(&self, txg: u64, fresh: u64) {
        let mut st = self.state.lock();
        st.retain.keep_upto = txg;
        st.retain.fresh = fresh;
    }

    /// The txg set by `set_keep_upto` (0: every block let go is freed).
    pub fn keep_upto(&self) -> u64 {
        self.state.lock().retain.keep_upto
    }

    /// Bytes of the tree born after `keep_upto`, as of the last sync.
    pub fn fresh_bytes(&self) -> u64 {
        self.state.lock().retain.fresh
    }

    /// The blocks the syncs let go of but kept (born at or before `keep_upto`), since the
    /// last call.
    pub fn take_kept(&self) -> Vec<BlkPtr> {
        std::mem::take(&mut self.state.lock().retain.kept)
    }

    pub fn dnode(&self) -> DnodePhys {
        self.state.lock().dnode
    }

    pub fn block_bytes(&self) -> usize {
        self.state.lock().dnode.data_block_bytes.get() as usize
    }

    /// The checksum algorithm of the blocks written from the next sync on (each block
    /// pointer records its own, so the older blocks read as ever).
    pub fn set_checksum(&self, kind: ChecksumKind) {
        self.state.lock().dnode.checksum = kind as u8;
    }

    /// Sets how new data blocks are stored (the `compression` property); blocks written
    /// before keep theirs.
    pub fn set_compression(&self, c: Compression) {
        let (codec, level) = c.to_phys();
        let mut st = self.state.lock();
        st.dnode.compress = codec;
        st.dnode.compress_level = level;
    }

    /// How new data blocks are stored.
    pub fn compression(&self) -> Compression {
        let dn = self.dnode();
        Compression::from_phys(dn.compress, dn.compress_level)
            .expect("dnode compression validated at load")
    }

    pub fn set_size_bytes(&self, size: u64) {
        self.state.lock().dnode.size_bytes = size.into();
    }

    /// Bytes the object's tree takes on the devices as of its last sync (`DnodePhys::
    /// used_bytes`).
    pub fn used_bytes(&self) -> u64 {
        self.state.lock().dnode.used_bytes.get()
    }

    /// What `used_bytes` and `sizes` are, counted from the tree as it is on disk: every copy
    /// of every block the last sync's tree reaches.
    pub fn used_recounted(&self, io: &ObjectIo) -> Result<(u64, Sizes), ZioError> {
        let (mut n, mut sizes) = (0u64, Sizes::default());
        walk(io, &self.dnode(), &mut |bp, _| {
            n += bp.asize_total();
            let s = Sizes::of([bp]);
            sizes.logical += s.logical;
            sizes.physical += s.physical;
            Ok(())
        })?;
        Ok((n, sizes))
    }

    /// The logical and stored bytes of the tree's blocks as of its last sync.
    pub fn sizes(&self) -> Sizes {
        let dn = self.dnode();
        Sizes {
            logical: dn.logical_bytes.get(),
            physical: dn.physical_bytes.get(),
        }
    }

    /// Sets `used_bytes` from a recount (a pool written before the figure was kept).
    pub fn set_used_bytes(&self, bytes: u64) {
        self.state.lock().dnode.used_bytes = bytes.into();
    }

    /// Sets `sizes` from a recount (a pool written before they were kept).
    pub fn set_sizes(&self, s: Sizes) {
        let mut st = self.state.lock();
        st.dnode.logical_bytes = s.logical.into();
        st.dnode.physical_bytes = s.physical.into();
    }

    /// Reads block `blkid` as of the newest write; `None` is a hole (reads as zeros).
    pub fn read_block(&self, io: &ObjectIo, blkid: u64) -> Result<Option<Arc<Vec<u8>>>, ZioError> {
        let read = self.read_blocks(io, blkid, vec![None]);
        match read
            .into_iter()
            .next()
            .expect("one block asked, one answered")?
        {
            Fetched::Data(d) => Ok(Some(d)),
            Fetched::Hole | Fetched::Direct => Ok(None),
        }
    }

    /// Reads blocks `first..first + direct.len()` as of the newest writes (`read_block` for a
    /// range). Dirty blocks come from memory, and so do cached ones without a buffer in
    /// `direct`; the rest are read in batches, so blocks lying next to each other on disk
    /// cost one request. A block with a buffer in `direct` (of the block's size) that is not
    /// dirty is read straight into it and not cached: what a long sequential read wants,
    /// which gets no hits from the cache and would only evict what others use. A patched
    /// block (`Dirty::Patch`) is built in memory from what it held and its pieces. An error
    /// stands for the block it names; the others are still read.
    pub fn read_blocks(
        &self,
        io: &ObjectIo,
        first: u64,
        direct: Vec<Option<&mut [u8]>>,
    ) -> Vec<Result<Fetched, ZioError>> {
        self.read_blocks_streamed(io, first, direct, Stream::default())
    }

    /// `read_blocks` for a read a stream watcher (`zfetch`) has seen, as `stream` says.
    pub fn read_blocks_streamed(
        &self,
        io: &ObjectIo,
        first: u64,
        direct: Vec<Option<&mut [u8]>>,
        stream: Stream,
    ) -> Vec<Result<Fetched, ZioError>> {
        let streamed = stream.read_ahead;
        let count = direct.len() as u64;
        let (seen, dnode) = self.known(first, count);
        let mut out: Vec<Result<Fetched, ZioError>> = Vec::with_capacity(count as usize);
        let mut to_cache: Vec<(usize, BlkPtr)> = Vec::new();
        let mut to_fetch: Vec<(usize, BlkPtr)> = Vec::new();
        let mut to_direct: Vec<(usize, BlkPtr, &mut [u8])> = Vec::new();
        let mut patched: Vec<(usize, Vec<Piece>)> = Vec::new();
        let mut leaves = Leaves::new(&dnode);
        for (i, ((known, pieces), buf)) in seen.into_iter().zip(direct).enumerate() {
            // A patched block is built from a copy of what it held, not in the caller's buffer.
            let buf = if pieces.is_empty() {
                buf
            } else {
                patched.push((i, pieces));
                None
            };
            let at = match known {
                Some(Known::Fetched(f)) => {
                    out.push(Ok(f));
                    continue;
                }
                Some(Known::At(bp)) => Ok(bp),
                None => leaves.get(io, first + i as u64),
            };
            let found = at.map(|bp| {
                if bp.is_hole() {
                    return Fetched::Hole;
                }
                // A block a streaming read takes whole goes straight from its device into
                // the caller's buffer, without a look in the cache first: streaming reads
                // and writes do not fill the cache, so the look almost always missed, and
                // its hash-table misses cost a tenth of a 1 MiB read. The device holds the
                // same verified bytes a cached copy would.
                match buf {
                    Some(buf) if buf.len() == bp.lsize.get() as usize => {
                        let ahead = streamed.then(|| {
                            io.cache.wait_read_ahead(&bp);
                            io.cache.take_prefetched(&bp)
                        });
                        match ahead.flatten() {
                            Some(b) => return Fetched::Data(b),
                            None => to_direct.push((i, bp, buf)),
                        }
                    }
                    _ => {
                        if streamed {
                            io.cache.wait_read_ahead(&bp);
                        }
                        let cached = if i == 0 && stream.first_again {
                            io.cache.get_again(&bp)
                        } else {
                            io.cache.get(&bp)
                        };
                        match cached {
                            Some(b) => return Fetched::Data(b),
                            // Read alone, to be cached as stored (`ObjectIo::fetch`).
                            None if bp.compression != crate::zio::compress::BP_OFF => {
                                to_fetch.push((i, bp))
                            }
                            None => to_cache.push((i, bp)),
                        }
                    }
                }
                // A placeholder: the batch reads below fill it in.
                Fetched::Hole
            });
            out.push(found);
        }
        let bps: Vec<BlkPtr> = to_cache.iter().map(|m| m.1).collect();
        for ((i, bp), data) in to_cache.into_iter().zip(read_spare(io, &bps)) {
            out[i] = data.map(|d| {
                let d = Arc::new(d);
                io.cache.insert(&bp, d.clone());
                Fetched::Data(d)
            });
        }
        for (i, bp) in to_fetch {
            out[i] = io.read_bp(&bp).map(Fetched::Data);
        }
        let bps: Vec<BlkPtr> = to_direct.iter().map(|m| m.1).collect();
        let (idx, bufs): (Vec<usize>, Vec<&mut [u8]>) =
            to_direct.into_iter().map(|(i, _, b)| (i, b)).unzip();
        for (i, r) in idx.into_iter().zip(io.zio.read_batch_into(&bps, bufs)) {
            out[i] = r.map(|()| Fetched::Direct);
        }
        lay_pieces(&mut out, patched, dnode.data_block_bytes.get() as usize);
        out
    }

    /// What the dirty maps say of blocks `first..first + count` (data, a free, or where it
    /// was placed, and the pieces patched over that), and the dnode to look the rest up in,
    /// as of the same moment.
    fn known(&self, first: u64, count: u64) -> (Vec<Seen>, DnodePhys) {
        let st = self.state.lock();
        let seen = (first..first + count)
            .map(|blkid| {
                let (base, pieces) = st.seen(blkid);
                let known = base.map(|d| match d {
                    Dirty::Data(d) => Known::Fetched(Fetched::Data(d.clone())),
                    Dirty::Free => Known::Fetched(Fetched::Hole),
                    Dirty::Placed(bp) => Known::At(**bp),
                    Dirty::Patch(_) => unreachable!("`seen` gives no patch as a base"),
                });
                (known, pieces)
            })
            .collect();
        (seen, st.dnode)
    }

    /// `read_blocks` without buffers, if every block (and every indirect block on the way
    /// to it) is in memory or can be had from its device at once; `None` as soon as one
    /// would wait for a device. For a thread that must not wait: an NBD connection's reader
    /// serves small reads this way itself, and hands the rest to its workers.
    /// With `first_again`, the first block is one the reader's stream read last
    /// (`Stream::first_again`).
    pub fn read_blocks_nowait(
        &self,
        io: &ObjectIo,
        first: u64,
        count: u64,
        first_again: bool,
    ) -> Option<Vec<Result<Fetched, ZioError>>> {
        let (seen, dnode) = self.known(first, count);
        let mut leaves = Leaves::new(&dnode);
        let mut out = Vec::with_capacity(count as usize);
        let mut patched: Vec<(usize, Vec<Piece>)> = Vec::new();
        for (i, (known, pieces)) in seen.into_iter().enumerate() {
            if !pieces.is_empty() {
                patched.push((i, pieces));
            }
            let at = match known {
                Some(Known::Fetched(f)) => {
                    out.push(Ok(f));
                    continue;
                }
                Some(Known::At(bp)) => Ok(Some(bp)),
                None => leaves.get_in(io, first + i as u64, Wait::No),
            };
            out.push(match at {
                Ok(Some(bp)) if bp.is_hole() => Ok(Fetched::Hole),
                Ok(Some(bp)) => match io.fetch_as(&bp, Wait::No, i == 0 && first_again) {
                    Ok(Some(b)) => Ok(Fetched::Data(b)),
                    Ok(None) => return None,
                    Err(e) => Err(e),
                },
                Ok(None) => return None,
                Err(e) => Err(e),
            });
        }
        lay_pieces(&mut out, patched, dnode.data_block_bytes.get() as usize);
        Some(out)
    }

    /// Reads blocks `first..first + count` into the cache ahead of any reader, marked as
    /// read ahead (`BlockCache::insert_prefetched`): the pool's prefetch thread, for a
    /// stream `zfetch` found. It goes 512K at a time from where the stream's reader
    /// has not been yet (`Zfetch::still_ahead`), so blocks a reader that caught up read
    /// itself are not read twice. Blocks in memory (dirty or cached) and holes are skipped;
    /// the rest are read in batches, as `read_blocks` reads. An error is dropped here: the
    /// reader that asks for the block gets it. Returns the blocks read.
    pub fn read_ahead(&self, io: &ObjectIo, first: u64, count: u64) -> u64 {
        let chunk = ((512 << 10) / self.block_bytes().max(1) as u64).max(1);
        let end = first + count;
        let (mut at, mut read) = (first, 0);
        loop {
            at = self.zfetch.still_ahead(at, end);
            if at >= end {
                return read;
            }
            let n = chunk.min(end - at);
            read += self.read_ahead_chunk(io, at, n);
            at += n;
        }
    }

    fn read_ahead_chunk(&self, io: &ObjectIo, first: u64, count: u64) -> u64 {
        let (seen, dnode) = self.known(first, count);
        let mut leaves = Leaves::new(&dnode);
        let mut wanted = Vec::new();
        for (i, (known, pieces)) in seen.into_iter().enumerate() {
            let bp = match known {
                Some(Known::At(bp)) if pieces.is_empty() => bp,
                Some(_) => continue,
                None if pieces.is_empty() => match leaves.get(io, first + i as u64) {
                    Ok(bp) => bp,
                    Err(_) => continue,
                },
                None => continue,
            };
            if !bp.is_hole() && !io.cache.contains(&bp) {
                wanted.push((first + i as u64, bp));
            }
        }
        // Marked in flight before the stream is looked at again: a reader moves its stream
        // on before it looks for blocks in flight, so either it waits for these or they are
        // dropped here as passed, never read by both.
        let bps: Vec<BlkPtr> = wanted.iter().map(|(_, bp)| *bp).collect();
        let mut in_flight = io.cache.reading_ahead(&bps);
        let from = self.zfetch.still_ahead(first, first + count);
        let (passed, wanted): (Vec<_>, Vec<_>) = wanted.into_iter().partition(|(b, _)| *b < from);
        in_flight.release(passed.iter().map(|(_, bp)| bp));
        let (plain, packed): (Vec<BlkPtr>, Vec<BlkPtr>) = (wanted.into_iter().map(|(_, bp)| bp))
            .partition(|bp| bp.compression == crate::zio::compress::BP_OFF);
        let mut read = 0;
        for (bp, data) in plain.iter().zip(read_spare(io, &plain)) {
            if let Ok(d) = data {
                io.cache.insert_prefetched(bp, Arc::new(d));
                read += 1;
            }
        }
        for bp in &packed {
            if let Ok(stored) = io.zio.read_stored(bp) {
                io.cache.insert_stored(bp, Arc::new(stored), true);
                read += 1;
            }
        }
        drop(in_flight);
        read
    }

    /// Whether a short write into block `blkid` can be laid over it as a patch (`patch`):
    /// the open txg has no whole-block change for it. (A patch can still be refused for
    /// holding too much.)
    pub fn patchable(&self, blkid: u64) -> bool {
        matches!(
            self.state.lock().open.get(&blkid),
            None | Some(Dirty::Patch(_))
        )
    }

    /// Lays `data` over bytes `at..` of block `blkid` in the open txg without reading the
    /// block (`Dirty::Patch`), if the open txg has no other change to it and its patch then
    /// holds at most a block's worth (pieces that overlap in part could hold more; past
    /// that, the whole block takes less memory). Pieces the new one covers are dropped, and
    /// a patch whose pieces cover the whole block becomes the block (`Dirty::Data`). Returns
    /// the change in dirty counts, or `None` (nothing changed) where the caller must write
    /// the whole block instead. The caller holds the block's range lock and the open txg.
    pub fn patch(&self, blkid: u64, at: usize, data: Arc<Vec<u8>>) -> Option<Delta> {
        let mut st = self.state.lock();
        let block_bytes = st.dnode.data_block_bytes.get() as u64;
        assert!((at + data.len()) as u64 <= block_bytes);
        let end = at + data.len();
        let covered = |p: &Piece| p.at >= at && p.at + p.len <= end;
        let new = data.len() as u64;
        match st.open.get_mut(&blkid) {
            None => {
                st.open
                    .insert(blkid, Dirty::Patch(vec![Piece::new(at, data)]));
                Some(Delta {
                    bytes: block_bytes as i64,
                    held: new as i64,
                    meta: st.note_new_change(blkid),
                })
            }
            Some(Dirty::Patch(pieces)) => {
                let before = held(pieces);
                let dropped: u64 = (pieces.iter().filter(|p| covered(p)))
                    .map(|p| p.len as u64)
                    .sum();
                let after = before - dropped + new;
                // Only a block's worth of bytes or more can cover the block, or hold too
                // much; below that nothing is checked, and the pieces change in place.
                // (Rebuilt and checked for cover at every write, 4K writes into 128K blocks
                // spent 10 % of the server's samples in this function, 5 % since.)
                let kept = pieces.iter().filter(|p| !covered(p));
                let whole = after >= block_bytes
                    && covers(
                        kept.map(|p| (p.at, p.at + p.len)).chain([(at, end)]),
                        block_bytes as usize,
                    );
                if !whole && after > block_bytes {
                    return None;
                }
                pieces.retain(|p| !covered(p));
                pieces.push(Piece::new(at, data));
                if whole {
                    // Every byte is written: the block is whole without what it held (short
                    // sequential writes never read their blocks).
                    let data = overlay(None, pieces, block_bytes as usize);
                    st.open.insert(blkid, Dirty::Data(Arc::new(data)));
                    return Some(Delta {
                        bytes: 0,
                        held: block_bytes as i64 - before as i64,
                        meta: 0,
                    });
                }
                Some(Delta {
                    bytes: 0,
                    held: after as i64 - before as i64,
                    meta: 0,
                })
            }
            _ => None,
        }
    }

    /// Records a whole-block change in the open txg; returns the change in dirty bytes, and
    /// the copy of a placed change this one supersedes, which the caller must free (in the
    /// open txg: an intent-log record may point at it until then).
    /// The caller holds the pool's txg open (so the open map cannot move to syncing meanwhile).
    pub fn dirty(&self, blkid: u64, change: Dirty) -> (Delta, Option<BlkPtr>) {
        let mut st = self.state.lock();
        let block_bytes = st.dnode.data_block_bytes.get() as u64;
        match &change {
            Dirty::Data(d) => assert_eq!(d.len() as u64, block_bytes),
            Dirty::Placed(bp) => assert_eq!(bp.lsize.get() as u64, block_bytes),
            Dirty::Patch(_) => panic!("patches are laid with `Object::patch`"),
            Dirty::Free => {}
        }
        let mut delta = Delta {
            bytes: change.bytes(block_bytes) as i64,
            held: change.held() as i64,
            meta: 0,
        };
        let old = st.open.insert(blkid, change);
        match &old {
            Some(o) => {
                delta.bytes -= o.bytes(block_bytes) as i64;
                delta.held -= o.held() as i64;
            }
            None => delta.meta = st.note_new_change(blkid),
        }
        (delta, old.and_then(|o| o.placed()))
    }

    /// How a data block of this object is written (its pointer's properties).
    pub fn data_props(&self) -> WriteProps {
        let dn = self.dnode();
        WriteProps {
            kind: self.data_kind,
            level: 0,
            checksum: ChecksumKind::from_u8(dn.checksum).expect("dnode checksum validated at load"),
            copies: dn.copies as usize,
            class: self.class,
            compress: Compression::from_phys(dn.compress, dn.compress_level)
                .expect("dnode compression validated at load"),
        }
    }

    /// Whether block `blkid`'s change in the open txg is `data` (this very buffer).
    pub fn is_open_dirty(&self, blkid: u64, data: &Arc<Vec<u8>>) -> bool {
        matches!(self.state.lock().open.get(&blkid), Some(Dirty::Data(d)) if Arc::ptr_eq(d, data))
    }

    /// Tells the open txg that block `blkid`, dirty with `data`, is already written at `bp`, so its
    /// sync points at that copy instead of writing another (even if `data` is all zeros, which the
    /// sync would otherwise make a hole: callers log zeros as such instead). Returns a block the
    /// caller must free: `bp` itself if the block's change in the open txg is no longer `data`, or
    /// an earlier such copy of the same block that this one replaces.
    pub fn set_override(&self, blkid: u64, data: &Arc<Vec<u8>>, bp: BlkPtr) -> Option<BlkPtr> {
        let mut st = self.state.lock();
        match st.open.get(&blkid) {
            Some(Dirty::Data(d)) if Arc::ptr_eq(d, data) => {
                st.overrides.insert(blkid, (data.clone(), bp)).map(|o| o.1)
            }
            _ => Some(bp),
        }
    }

    /// Where block `blkid`'s change in the open txg, `data`, was already written ahead
    /// (`set_override`), if it was.
    pub fn override_of(&self, blkid: u64, data: &Arc<Vec<u8>>) -> Option<BlkPtr> {
        match self.state.lock().overrides.get(&blkid) {
            Some((d, bp)) if Arc::ptr_eq(d, data) => Some(*bp),
            _ => None,
        }
    }

    pub fn has_open_changes(&self) -> bool {
        !self.state.lock().open.is_empty()
    }

    /// Moves the open txg's changes to syncing; returns their dirty bytes.
    pub fn begin_sync(&self) -> SyncBytes {
        let mut st = self.state.lock();
        assert!(st.syncing.is_none(), "a txg is already syncing this object");
        if st.open.is_empty() {
            return SyncBytes::default();
        }
        let next = open_map_after(st.open.len());
        let map = std::mem::replace(&mut st.open, next);
        let groups = std::mem::take(&mut st.open_groups).len() as u64;
        st.syncing_overrides = std::mem::take(&mut st.overrides);
        let block_bytes = st.dnode.data_block_bytes.get() as u64;
        let mut bytes = SyncBytes {
            meta: groups * st.indirect_bytes(),
            ..SyncBytes::default()
        };
        for d in map.values() {
            bytes.dirty += d.bytes(block_bytes);
            bytes.held += d.held();
            if matches!(d, Dirty::Placed(_)) {
                bytes.placed += d.bytes(block_bytes);
            }
        }
        st.syncing = Some(Arc::new(SyncingMap::from_open(map)));
        bytes
    }

    /// For tests of what the pool makes of bytes on disk that no writer makes: the next sync
    /// that writes a new block of `level` at index `idx` (one holding a block changed in its
    /// txg) hands its pointer to `forge` before putting it in the parent, which is then
    /// written and checksummed as ever, so the chain up to the uberblock verifies. The block
    /// it pointed at is leaked. A pool image can be crafted whole; this makes one through the
    /// pool's own write path.
    #[doc(hidden)]
    pub fn forge(&self, level: u8, idx: u64, forge: Forge) {
        self.state.lock().forged.push((level, idx, forge));
    }

    /// How many pointers given to `forge` no sync has forged yet.
    #[doc(hidden)]
    pub fn forgeries_pending(&self) -> usize {
        self.state.lock().forged.len()
    }

    /// Writes the syncing changes in txg `txg` and installs the new tree. Old blocks are freed
    /// in `txg` (deferred by the allocator).
    pub fn sync(&self, io: &ObjectIo, txg: u64) -> Result<DnodePhys, ZioError> {
        let (old, dirty, overrides, mut forged) = {
            let mut st = self.state.lock();
            let overrides = std::mem::take(&mut st.syncing_overrides);
            let forged = std::mem::take(&mut st.forged);
            (st.dnode, st.syncing.clone(), overrides, forged)
        };
        let result = self.sync_forging(io, txg, old, dirty, overrides, &mut forged);
        self.state.lock().forged.extend(forged);
        result
    }

    fn sync_forging(
        &self,
        io: &ObjectIo,
        txg: u64,
        old: DnodePhys,
        dirty: Option<Arc<SyncingMap>>,
        overrides: BTreeMap<u64, Override>,
        forged: &mut Vec<Forgery>,
    ) -> Result<DnodePhys, ZioError> {
        let Some(dirty) = dirty else { return Ok(old) };
        // Blocks written ahead are adopted where the dirty buffer is still theirs; the others
        // were superseded and are freed.
        let mut adopted: BTreeMap<u64, BlkPtr> = BTreeMap::new();
        let mut superseded: Vec<BlkPtr> = Vec::new();
        for (blkid, (data, bp)) in overrides {
            match dirty.get(blkid) {
                Some(Dirty::Data(d)) if Arc::ptr_eq(d, &data) => {
                    adopted.insert(blkid, bp);
                }
                _ => superseded.push(bp),
            }
        }
        io.zio.free_all(&superseded, txg, AllocClass::Mos);
        let checksum =
            ChecksumKind::from_u8(old.checksum).expect("dnode checksum validated at load");
        let data_props = WriteProps {
            kind: self.data_kind,
            level: 0,
            checksum,
            copies: old.copies as usize,
            class: self.class,
            compress: Compression::from_phys(old.compress, old.compress_level)
                .expect("dnode compression validated at load"),
        };
        let mut new = old;
        // What the tree takes on the devices, as its blocks are written and freed.
        let mut used = {
            let st = self.state.lock();
            Used {
                bytes: old.used_bytes.get(),
                sizes: Sizes {
                    logical: old.logical_bytes.get(),
                    physical: old.physical_bytes.get(),
                },
                retain: Retain {
                    keep_upto: st.retain.keep_upto,
                    fresh: st.retain.fresh,
                    kept: Vec::new(),
                },
            }
        };
        let max_blkid = dirty.last_blkid();
        while new.capacity_blocks() <= max_blkid {
            new.nlevels += 1;
        }

        // Level 0: every dirty block to a new place, as one batch in block order, so blocks
        // next to each other in the object land and are written next to each other; all-zero
        // blocks become holes, blocks written ahead are adopted.
        //
        // `children` holds each dirty block's new pointer in block order, the blocks written
        // or patched below filling their slots afterwards: the levels above only walk it in
        // order. (As a map, with vectors of the blocks to adopt and of whether each block
        // held data, a txg of streaming 128K writes into 16K blocks spent a quarter of the
        // sync thread's time allocating, growing and faulting in memory for them.)
        let mut children: Vec<(u64, BlkPtr)> = Vec::with_capacity(dirty.len());
        let mut to_write: Vec<(usize, &Arc<Vec<u8>>)> = Vec::new();
        // Blocks written here go to the cache once the walk up the tree below has dropped
        // the copies they replace (`BlockCache::forget`), so the cache never holds both.
        let mut to_cache: Vec<(BlkPtr, &Arc<Vec<u8>>)> = Vec::new();
        let mut patched: Vec<Patched> = Vec::new();
        let mut patched_slots: Vec<usize> = Vec::new();
        // Adopted together below: a stream's blocks lie one after another.
        let mut to_adopt: Vec<usize> = Vec::new();
        for (blkid, change) in dirty.iter() {
            let slot = children.len();
            let bp = match change {
                // Cached like any written block. (Leaving streams' blocks out, as streaming
                // reads are, raised the NBD server's peak RSS from 455 to 543 MiB in
                // scripts/bench-nbd.sh: freed at the sync, not in LRU order, they fragmented
                // the heap more than the cache held.) Blocks written ahead were checked for
                // zeros then; scanning them again reads a whole txg of cold memory. The scan
                // stays on this thread: that of a block of data ends at its first bytes, and
                // handing it to rayon woke the pool's workers every txg, which then spun
                // (yielding) on cores the NBD server's threads wanted.
                Dirty::Data(d) => match adopted.get(&blkid) {
                    Some(bp) => {
                        to_adopt.push(slot);
                        to_cache.push((*bp, d));
                        *bp
                    }
                    None if !is_zero(d) => {
                        to_write.push((slot, d));
                        BlkPtr::HOLE
                    }
                    None => BlkPtr::HOLE,
                },
                Dirty::Placed(bp) => {
                    to_adopt.push(slot);
                    **bp
                }
                Dirty::Patch(pieces) => {
                    patched.push((blkid, pieces));
                    patched_slots.push(slot);
                    BlkPtr::HOLE
                }
                Dirty::Free => BlkPtr::HOLE,
            };
            children.push((blkid, bp));
        }
        io.zio
            .adopt_all(to_adopt.iter().map(|&slot| &children[slot].1));
        used.add(to_adopt.iter().map(|&slot| &children[slot].1));
        let bufs: Vec<&[u8]> = to_write.iter().map(|(_, d)| d.as_slice()).collect();
        let bps = io.zio.write_batch(&bufs, data_props, txg)?;
        used.add(&bps);
        for ((slot, d), bp) in to_write.into_iter().zip(bps) {
            to_cache.push((bp, d));
            children[slot].1 = bp;
        }
        let patched_bps = sync_patched(io, &old, &patched, data_props, txg)?;
        used.add(patched_bps.iter().flatten());
        let mut kept: Vec<usize> = Vec::new();
        for (slot, bp) in patched_slots.into_iter().zip(patched_bps) {
            match bp {
                Some(bp) => children[slot].1 = bp,
                None => kept.push(slot),
            }
        }
        // A patched block that keeps the pointer it has changes nothing above it.
        if !kept.is_empty() {
            let mut slot = 0;
            children.retain(|_| {
                slot += 1;
                kept.binary_search(&(slot - 1)).is_err()
            });
        }

        // Indirect levels, bottom up.
        let ind_props = WriteProps {
            kind: BlockKind::Indirect,
            level: 0,
            checksum: checksum.for_metadata(),
            copies: indirect_copies(old.copies),
            class: self.class,
            compress: Compression::Off,
        };
        // The pointer at index 0 of the level `children` holds, if it has one.
        let first = |children: &[(u64, BlkPtr)]| children.first().filter(|c| c.0 == 0).map(|c| c.1);
        // (A block 0 kept as it was, `sync_patched`'s damaged block, replaces nothing.)
        let mut old_root_replaced =
            old.nlevels == 1 && first(&children).is_some_and(|bp| bp != old.root);
        // The blocks one indirect block's children replace, freed together (in block order:
        // those of a stream lie one after another).
        let mut replaced: Vec<BlkPtr> = Vec::with_capacity(FANOUT);
        for level in 1..new.nlevels {
            // The tree grew: the old root becomes the first child of the new level.
            if level == old.nlevels && !old.root.is_hole() && first(&children).is_none() {
                children.insert(0, (0, old.root));
            }
            // A test's forgeries of this level's children (`forge`).
            if !forged.is_empty() {
                let mut i = 0;
                while i < forged.len() {
                    let (l, idx) = (forged[i].0, forged[i].1);
                    match children.binary_search_by_key(&idx, |c| c.0) {
                        Ok(c) if l == level - 1 && !children[c].1.is_hole() => {
                            let (_, _, forge) = forged.swap_remove(i);
                            forge(&mut children[c].1, io);
                        }
                        _ => i += 1,
                    }
                }
            }
            // The level's new indirect blocks, then written as one batch: in block order, so
            // neighbours land next to each other and go to the device as a few long writes.
            // Like `children`, `parents` is in block order, the built blocks' slots filled
            // once they are written.
            let mut parents: Vec<(u64, BlkPtr)> = Vec::with_capacity(children.len() / FANOUT + 1);
            let mut built: Vec<(usize, Vec<u8>, u64)> = Vec::new();
            for group in children.chunk_by(|a, b| a.0 >> IND_SHIFT == b.0 >> IND_SHIFT) {
                let pidx = group[0].0 >> IND_SHIFT;
                let old_parent = if level < old.nlevels {
                    lookup(io, &old, level, pidx)
                } else {
                    Ok(BlkPtr::HOLE)
                };
                let old_content = old_parent.and_then(|p| match p.is_hole() {
                    true => Ok(vec![0u8; IND_BLOCK_BYTES]),
                    false => io.read_bp(&p).map(|b| b.to_vec()),
                });
                let mut content = match old_content {
                    Ok(c) => c,
                    // The level-1 block, or one above it, cannot be read (no copy verifies,
                    // or its pointer is impossible): it cannot be rewritten without its
                    // other pointers, and one made without them would turn the blocks it
                    // leaves out into holes. The changes below it are lost (counted) and
                    // their new copies freed; the damaged subtree stays, its reads failing,
                    // nothing made up. Nothing of the group was freed yet: the blocks its
                    // children replace are freed below, and the level-1 blocks are the
                    // first that are read, so a block that cannot be read fails there. (A
                    // block above that read at level 1 and fails now is a fault of the
                    // moment, and fails the sync as ever.)
                    Err(_) if level == 1 => {
                        let lost = group.iter().map(|c| c.1).filter(|bp| !bp.is_hole());
                        let new: Vec<BlkPtr> =
                            lost.filter(|bp| bp.birth_txg.get() == txg).collect();
                        used.let_go(io, &new, txg, self.class);
                        (io.zio.stats.lost_writes)
                            .fetch_add(group.len() as u64, std::sync::atomic::Ordering::Relaxed);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if level == old.nlevels - 1 && pidx == 0 {
                    old_root_replaced = true;
                }
                for &(idx, bp) in group {
                    let slot = (idx as usize) & (FANOUT - 1);
                    let prev = bp_at(&content, slot);
                    if !prev.is_hole() && prev != bp {
                        replaced.push(prev);
                    }
                    set_bp(&mut content, slot, &bp);
                }
                used.let_go(io, &replaced, txg, self.class);
                replaced.clear();
                if (0..FANOUT).any(|s| !bp_at(&content, s).is_hole()) {
                    let fill: u64 = (0..FANOUT).map(|s| bp_at(&content, s).fill.get()).sum();
                    built.push((parents.len(), content, fill));
                }
                parents.push((pidx, BlkPtr::HOLE));
            }
            let props = WriteProps { level, ..ind_props };
            let contents: Vec<&[u8]> = built.iter().map(|(_, c, _)| c.as_slice()).collect();
            let bps = if contents.is_empty() {
                Vec::new()
            } else {
                io.zio.write_batch(&contents, props, txg)?
            };
            used.add(&bps);
            for ((slot, content, fill), mut bp) in built.into_iter().zip(bps) {
                bp.fill = fill.into();
                io.cache.insert(&bp, Arc::new(content));
                parents[slot].1 = bp;
            }
            children = parents;
        }
        if new.nlevels == old.nlevels && old.nlevels > 1 {
            old_root_replaced = true;
        }
        let root = match first(&children) {
            Some(bp) => bp,
            // Every change was lost (under an indirect block that cannot be read): the tree
            // is as it was.
            None if children.is_empty() => old.root,
            None if old_root_replaced => BlkPtr::HOLE,
            None => old.root,
        };
        if old_root_replaced && !old.root.is_hole() && old.root != root {
            used.let_go(io, std::slice::from_ref(&old.root), txg, self.class);
        }
        new.root = root;
        for (bp, d) in to_cache {
            io.cache.insert(&bp, d.clone());
        }

        let mut st = self.state.lock();
        st.dnode.root = new.root;
        st.dnode.nlevels = new.nlevels;
        st.dnode.used_bytes = used.bytes.into();
        st.dnode.logical_bytes = used.sizes.logical.into();
        st.dnode.physical_bytes = used.sizes.physical.into();
        st.retain.fresh = used.retain.fresh;
        st.retain.kept.append(&mut used.retain.kept);
        st.syncing = None;
        Ok(st.dnode)
    }

    /// Frees every block of the object in txg `txg` (the object is being destroyed, or rolled
    /// back) but those born at or before `keep_upto`, which a snapshot holds (a subtree whose
    /// top is that old is not entered: copy-on-write, nothing below it is newer), and the
    /// copies written ahead for changes no sync will adopt now (allocated outside the space
    /// map, they would stay taken until the next import).
    pub fn free_all(&self, io: &ObjectIo, txg: u64) -> Result<(), ZioError> {
        let ahead: Vec<BlkPtr> = {
            let mut st = self.state.lock();
            let open = std::mem::take(&mut st.overrides);
            let syncing = std::mem::take(&mut st.syncing_overrides);
            let unsynced = st
                .open
                .values()
                .chain(st.syncing.iter().flat_map(|s| s.iter().map(|e| e.1)));
            unsynced
                .filter_map(Dirty::placed)
                .chain(open.into_values().chain(syncing.into_values()).map(|o| o.1))
                .collect()
        };
        for bp in ahead {
            io.zio.free(&bp, txg, AllocClass::Mos);
        }
        // Every block the tree reaches. The blocks under an indirect block that cannot be
        // read are not reached: they are leaked (noted with the refused frees), and the
        // destroy goes on.
        let dn = self.dnode();
        let keep_upto = self.keep_upto();
        let free = &mut |bp: &BlkPtr, _, _| {
            if keep_upto > 0 && bp.birth_txg.get() <= keep_upto {
                return Visit::Skip;
            }
            io.zio.free(bp, txg, self.class);
            Visit::Descend
        };
        walk_from(io, &dn, 0, free, &mut |bp, level, first, e| {
            io.zio.leaked(format!(
                "blocks under the level-{level} block for block {first} of an object being \
                 destroyed (born in txg {}) are leaked: {e}",
                bp.birth_txg.get()
            ))
        });
        Ok(())
    }

    /// Block ids in `from..to` that differ from the tree as it stood at txg `after`: data
    /// blocks born since, and every block a txg not yet synced changes; and beside them the
    /// runs of holes inside subtrees born since, which may have been data then (zeta keeps no
    /// birth for a hole: the caller asks the older tree). A subtree born at or before `after`
    /// is not entered: copy-on-write, nothing below it changed.
    pub fn changed_blocks(
        &self,
        io: &ObjectIo,
        from: u64,
        to: u64,
        after: u64,
    ) -> Result<Changed, ZioError> {
        let (dn, mut changed) = {
            let st = self.state.lock();
            let mut pending: std::collections::BTreeSet<u64> = (st.syncing.iter())
                .flat_map(|s| s.range(from..to))
                .map(|(k, _)| *k)
                .collect();
            pending.extend(open_range(&st.open, from..to).into_iter().map(|(k, _)| k));
            (st.dnode, pending)
        };
        let mut cursor = from;
        let mut failed = None;
        let mut gaps: Vec<(u64, u64)> = Vec::new();
        let visit = &mut |bp: &BlkPtr, level: u8, first: u64| {
            if first >= to {
                return Visit::Skip;
            }
            let span = 1u64 << (IND_SHIFT * level as u32);
            if first > cursor {
                // Holes inside a subtree born after `after`: they may have held data then.
                gaps.push((cursor, first));
            }
            cursor = cursor.max(first);
            if bp.birth_txg.get() <= after {
                cursor = cursor.max(first.saturating_add(span));
                return Visit::Skip;
            }
            if level > 0 {
                return Visit::Descend;
            }
            changed.insert(first);
            cursor = first + 1;
            Visit::Skip
        };
        walk_from(io, &dn, from, visit, &mut |_, _, _, e| {
            failed.get_or_insert(e);
        });
        if let Some(e) = failed {
            return Err(e);
        }
        // Past the tree's last block, to the end asked: holes now, data maybe then. Unless
        // the whole tree is as it was (its root born at or before `after`).
        if cursor < to && (dn.root.is_hole() || dn.root.birth_txg.get() > after) {
            gaps.push((cursor, to));
        }
        let gaps = (gaps.into_iter())
            .map(|(a, b)| (a.max(from), b.min(to)))
            .filter(|(a, b)| a < b)
            .collect();
        let changed = changed
            .into_iter()
            .filter(|&b| (from..to).contains(&b))
            .collect();
        Ok((changed, gaps))
    }

    /// Block ids in `from..to` that hold data, as a reader would see them now: on disk,
    /// overridden by the syncing txg's changes, overridden by the open txg's (a block freed in
    /// a txg that has not synced yet is already absent).
    pub fn allocated_blocks(
        &self,
        io: &ObjectIo,
        from: u64,
        to: u64,
    ) -> Result<Vec<u64>, ZioError> {
        let (dn, open, syncing) = {
            let st = self.state.lock();
            let syncing: Vec<(u64, bool)> = (st.syncing.iter())
                .flat_map(|s| s.range(from..to))
                .map(|(k, d)| (*k, d.holds_data()))
                .collect();
            (st.dnode, open_range(&st.open, from..to), syncing)
        };
        let mut on_disk = Vec::new();
        collect_blkids(io, &dn, dn.root, dn.nlevels - 1, 0, from, to, &mut on_disk)?;
        let mut present: std::collections::BTreeSet<u64> = on_disk.into_iter().collect();
        for (blkid, has_data) in syncing.into_iter().chain(open) {
            if has_data {
                present.insert(blkid);
            } else {
                present.remove(&blkid);
            }
        }
        Ok(present.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_a_range_block_by_block() {
        let v: Vec<Span> = spans(4000, 5000, 4096).collect();
        assert_eq!(
            v,
            vec![
                Span {
                    blkid: 0,
                    in_block: 4000,
                    in_buf: 0,
                    len: 96
                },
                Span {
                    blkid: 1,
                    in_block: 0,
                    in_buf: 96,
                    len: 4096
                },
                Span {
                    blkid: 2,
                    in_block: 0,
                    in_buf: 4192,
                    len: 808
                },
            ]
        );
        assert!(v[1].is_whole_block(4096));
        assert_eq!(spans(0, 0, 4096).count(), 0);
    }

    /// `patch`'s dirty counts as pieces come, replace each other, overlap in part (and then
    /// would hold more than the block), and at last cover the block.
    #[test]
    fn patches_count_what_they_hold_until_they_cover_the_block() {
        use super::super::dnode::ObjectKind;
        let o = Object::new(
            DnodePhys::new(
                ObjectKind::VolumeData,
                16384,
                ChecksumKind::Fletcher4 as u8,
                1,
            ),
            BlockKind::Data,
            AllocClass::Recorded,
        );
        let piece = |len: usize, byte: u8| Arc::new(vec![byte; len]);
        let delta = |bytes, held| {
            Some(Delta {
                bytes,
                held,
                meta: 0,
            })
        };
        // The first piece dirties the whole block and holds its own bytes, and its group's
        // indirect block (two copies) for the sync.
        let first = Some(Delta {
            meta: 2 * IND_BLOCK_BYTES as i64,
            ..delta(16384, 4096).unwrap()
        });
        assert_eq!(o.patch(0, 0, piece(4096, 1)), first);
        // Another beside it; then one that covers the first exactly takes its place.
        assert_eq!(o.patch(0, 4096, piece(4096, 2)), delta(0, 4096));
        assert_eq!(o.patch(0, 0, piece(4096, 3)), delta(0, 0));
        // One that covers both and more drops them.
        assert_eq!(o.patch(0, 0, piece(12288, 4)), delta(0, 4096));
        // Overlapping it in part, a piece would make the patch hold more than the block.
        assert_eq!(o.patch(0, 4096, piece(8192, 5)), None);
        assert!(o.patchable(0));
        // The last quarter completes the block: it becomes whole data, held in full.
        assert_eq!(o.patch(0, 12288, piece(4096, 6)), delta(0, 16384 - 12288));
        assert!(!o.patchable(0));
        let st = o.state.lock();
        let Some(Dirty::Data(d)) = st.open.get(&0) else {
            panic!("the covered block is whole data");
        };
        assert_eq!(&d[..12288], &[4u8; 12288][..]);
        assert_eq!(&d[12288..], &[6u8; 4096][..]);
    }

    #[test]
    fn a_txg_counts_one_indirect_block_per_group_of_blocks_it_changes() {
        use super::super::dnode::ObjectKind;
        let o = Object::new(
            DnodePhys::new(
                ObjectKind::VolumeData,
                8192,
                ChecksumKind::Fletcher4 as u8,
                1,
            ),
            BlockKind::Data,
            AllocClass::Recorded,
        );
        let block = || Dirty::Data(Arc::new(vec![7u8; 8192]));
        let ind = 2 * IND_BLOCK_BYTES as i64;
        let group = FANOUT as u64;
        assert_eq!(o.dirty(0, block()).0.meta, ind);
        assert_eq!(o.dirty(1, block()).0.meta, 0, "same group");
        assert_eq!(o.dirty(0, block()).0.meta, 0, "same block again");
        assert_eq!(o.dirty(group, block()).0.meta, ind, "the next group");
        assert_eq!(o.dirty(5 * group + 3, Dirty::Free).0.meta, ind);
        let synced = o.begin_sync();
        assert_eq!(synced.meta, 3 * ind as u64);
        // The next txg counts its groups afresh.
        assert_eq!(o.dirty(1, block()).0.meta, ind);
    }

    /// An empty volume object of 4K blocks on a fresh two-way mirror (its devices returned to
    /// be kept alive).
    fn volume_object_on_mirror(seed: u64) -> (ObjectIo, Object, impl Sized) {
        use super::super::dnode::ObjectKind;
        let (zio, _, devs) = crate::zio::tests::zio_on_mirror(2, seed);
        let io = ObjectIo {
            zio: Arc::new(zio),
            cache: Arc::new(BlockCache::new(1 << 20)),
        };
        let o = Object::new(
            DnodePhys::new(
                ObjectKind::VolumeData,
                4096,
                ChecksumKind::Fletcher4 as u8,
                1,
            ),
            BlockKind::Data,
            AllocClass::Recorded,
        );
        (io, o, devs)
    }

    /// The kill rule (`Used::let_go`): once a snapshot holds the tree of txg 1, a sync that
    /// lets go of blocks born then hands them back instead of freeing them, and frees those
    /// born since; `fresh_bytes` follows what the tree holds born after txg 1; `free_all`
    /// (a destroy or a rollback) frees only those, never entering a subtree the snapshot
    /// holds.
    #[test]
    fn blocks_a_snapshot_holds_are_kept_and_the_rest_freed() {
        let (io, o, _devs) = volume_object_on_mirror(11);
        let freeing = || io.zio.alloc.lock().space().freeing;
        let block = |b: u8| Dirty::Data(Arc::new(vec![b; 4096]));
        let sync = |txg: u64| {
            o.begin_sync();
            o.sync(&io, txg).unwrap()
        };
        // What the tree holds born after `after`, counted from the tree.
        let born_after = |after: u64| {
            let mut n = 0;
            walk(&io, &o.dnode(), &mut |bp, _| {
                if bp.birth_txg.get() > after {
                    n += bp.asize_total();
                }
                Ok(())
            })
            .unwrap();
            n
        };
        for blkid in 0..4 {
            o.dirty(blkid, block(1));
        }
        let first = sync(1);
        assert_eq!(first.nlevels, 2, "four blocks under one indirect block");
        assert_eq!(o.fresh_bytes(), first.used_bytes.get(), "no snapshot yet");
        assert!(o.take_kept().is_empty());

        // A snapshot of txg 1: block 0 rewritten and block 1 freed let go of blocks born in
        // txg 1, and the indirect block above them; none is freed.
        o.set_keep_upto(1, 0);
        o.dirty(0, block(2));
        o.dirty(1, Dirty::Free);
        let second = sync(2);
        assert_eq!(freeing(), 0, "nothing the snapshot holds is freed");
        let kept = o.take_kept();
        assert_eq!(kept.len(), 3, "blocks 0 and 1 and their old indirect block");
        assert!(kept.iter().all(|bp| bp.birth_txg.get() == 1));
        assert!(kept.iter().any(|bp| bp.level == 1) && kept.contains(&first.root));
        assert_eq!(o.fresh_bytes(), born_after(1));
        assert!(o.fresh_bytes() > 0 && o.fresh_bytes() < second.used_bytes.get());
        let fresh = o.fresh_bytes();

        // Block 0 again: what txg 2 wrote is the tree's alone, and is freed.
        o.dirty(0, block(3));
        sync(3);
        assert!(
            o.take_kept().is_empty(),
            "txg 2's blocks are not the snapshot's"
        );
        assert_eq!(freeing(), fresh, "block 0 and the indirect block of txg 2");
        assert_eq!(o.fresh_bytes(), born_after(1));

        // A destroy frees what was born after the snapshot and nothing it holds.
        let before = freeing();
        o.free_all(&io, 4).unwrap();
        assert_eq!(freeing() - before, born_after(1));
    }

    /// `dead_between` of any two trees of one object, one later than the other (a level
    /// grown between them too), names exactly the blocks of the earlier that the later does
    /// not hold, as full walks of both count them.
    #[test]
    fn the_blocks_between_two_trees_are_what_full_walks_say() {
        use rand::{Rng, SeedableRng};
        use std::collections::BTreeSet;
        let (io, o, _devs) = volume_object_on_mirror(13);
        let all = |dn: &DnodePhys| {
            let mut v = BTreeSet::new();
            walk(&io, dn, &mut |bp, _| {
                v.insert(bp.as_bytes().to_vec());
                Ok(())
            })
            .unwrap();
            v
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut trees = Vec::new();
        for txg in 1..=8u64 {
            // Everything earlier stays (as if each tree were a snapshot): all stay readable.
            o.set_keep_upto(txg - 1, 0);
            let top = if txg == 5 { 40_000 } else { 400 };
            for _ in 0..rng.gen_range(1..40) {
                let blkid = rng.gen_range(0..top);
                let change = match rng.gen_bool(0.2) {
                    true => Dirty::Free,
                    false => Dirty::Data(Arc::new(vec![rng.gen::<u8>() | 1; 4096])),
                };
                o.dirty(blkid, change);
            }
            o.begin_sync();
            trees.push(o.sync(&io, txg).unwrap());
            o.take_kept();
        }
        assert!(trees[0].nlevels < trees[7].nlevels, "a level grew");
        for i in 0..trees.len() {
            for j in i..trees.len() {
                let mut dead = Vec::new();
                dead_between(&io, &trees[i], &trees[j], &mut |bp| {
                    dead.push(bp.as_bytes().to_vec())
                })
                .unwrap();
                let want: BTreeSet<Vec<u8>> = all(&trees[i])
                    .difference(&all(&trees[j]))
                    .cloned()
                    .collect();
                assert_eq!(dead.len(), want.len(), "trees {i} and {j}: no block twice");
                assert_eq!(dead.into_iter().collect::<BTreeSet<_>>(), want, "{i} {j}");
            }
        }
    }
}
