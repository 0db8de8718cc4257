//! One object: a sparse array of `data_block_bytes` blocks behind a copy-on-write tree of
//! indirect blocks. Writes land in the open txg's dirty map; `sync` writes a txg's dirty blocks
//! to new places and rewrites the path of indirect blocks above them up to a new root.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use zerocopy::{FromBytes, IntoBytes};

use super::cache::BlockCache;
use super::dnode::{DnodePhys, IND_BLOCK_BYTES, IND_SHIFT};
use crate::math::fletcher::{fletcher4_update, Fletcher4};
use crate::math::zero::is_zero;
use crate::math::{Checksum, ChecksumKind};
use crate::spa::bp::BP_BYTES;
use crate::spa::{AllocClass, BlkPtr, BlockKind};
use crate::zio::{WriteProps, Zio, ZioError};

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
        if let Some(b) = self.cache.get(bp) {
            return Ok(Some(b));
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

/// Bytes written over part of a block (`Dirty::Patch`): `data` at offset `at` in it.
#[derive(Clone, Debug)]
pub struct Piece {
    pub at: usize,
    /// `data`'s length, kept here: every write into a patched block sums and compares its
    /// pieces' extents, and reaching each through its `Arc` was a cache miss apiece.
    len: usize,
    pub data: Arc<Vec<u8>>,
}

impl Piece {
    fn new(at: usize, data: Arc<Vec<u8>>) -> Piece {
        Piece {
            at,
            len: data.len(),
            data,
        }
    }
}

/// The block `pieces` are laid over, in the order they were written (a later piece wins
/// where they overlap): `base`, or zeros for a hole.
fn overlay(base: Option<&[u8]>, pieces: &[Piece], block_bytes: usize) -> Vec<u8> {
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
fn covers(spans: impl Iterator<Item = (usize, usize)>, block_bytes: usize) -> bool {
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
fn lay_pieces(
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
    Placed(BlkPtr),
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

    /// Where a placed change's copy lies.
    fn placed(&self) -> Option<BlkPtr> {
        match self {
            Dirty::Placed(bp) => Some(*bp),
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
}

/// What a txg's changes to an object held when its sync began: all dirty bytes, those of
/// them already written to their place (`Dirty::Placed`), whose space is allocated, and the
/// bytes held in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncBytes {
    pub dirty: u64,
    pub placed: u64,
    pub held: u64,
}

impl std::ops::AddAssign for SyncBytes {
    fn add_assign(&mut self, b: SyncBytes) {
        self.dirty += b.dirty;
        self.placed += b.placed;
        self.held += b.held;
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
    /// What the unsynced txgs say of block `blkid`: the newest change that replaces it whole
    /// (in the open txg, else in the syncing one; `None` if neither has one: the tree holds
    /// it), and the pieces patched over that since, oldest first.
    fn seen(&self, blkid: u64) -> (Option<&Dirty>, Vec<Piece>) {
        let mut layers: Vec<&[Piece]> = Vec::new();
        let mut base = None;
        for map in [Some(&self.open), self.syncing.as_deref()]
            .into_iter()
            .flatten()
        {
            match map.get(&blkid) {
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
    open: BTreeMap<u64, Dirty>,
    syncing: Option<Arc<BTreeMap<u64, Dirty>>>,
    /// Blocks of the open txg written ahead; the sync adopts those whose buffer is still the
    /// dirty one and frees the others.
    overrides: BTreeMap<u64, Override>,
    syncing_overrides: BTreeMap<u64, Override>,
}

pub struct Object {
    data_kind: BlockKind,
    class: AllocClass,
    state: Mutex<State>,
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
                open: BTreeMap::new(),
                syncing: None,
                overrides: BTreeMap::new(),
                syncing_overrides: BTreeMap::new(),
            }),
        }
    }

    pub fn dnode(&self) -> DnodePhys {
        self.state.lock().dnode
    }

    pub fn block_bytes(&self) -> usize {
        self.state.lock().dnode.data_block_bytes.get() as usize
    }

    pub fn set_size_bytes(&self, size: u64) {
        self.state.lock().dnode.size_bytes = size.into();
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
        let count = direct.len() as u64;
        let (seen, dnode) = self.known(first, count);
        let mut out: Vec<Result<Fetched, ZioError>> = Vec::with_capacity(count as usize);
        let mut to_cache: Vec<(usize, BlkPtr)> = Vec::new();
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
                    Some(buf) if buf.len() == bp.psize.get() as usize => {
                        to_direct.push((i, bp, buf))
                    }
                    _ => match io.cache.get(&bp) {
                        Some(b) => return Fetched::Data(b),
                        None => to_cache.push((i, bp)),
                    },
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
                    Dirty::Placed(bp) => Known::At(*bp),
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
    pub fn read_blocks_nowait(
        &self,
        io: &ObjectIo,
        first: u64,
        count: u64,
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
                Ok(Some(bp)) => match io.fetch(&bp, Wait::No) {
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
                    });
                }
                Some(Delta {
                    bytes: 0,
                    held: after as i64 - before as i64,
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
        };
        let old = st.open.insert(blkid, change);
        if let Some(o) = &old {
            delta.bytes -= o.bytes(block_bytes) as i64;
            delta.held -= o.held() as i64;
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
        let map = std::mem::take(&mut st.open);
        st.syncing_overrides = std::mem::take(&mut st.overrides);
        let block_bytes = st.dnode.data_block_bytes.get() as u64;
        let mut bytes = SyncBytes::default();
        for d in map.values() {
            bytes.dirty += d.bytes(block_bytes);
            bytes.held += d.held();
            if matches!(d, Dirty::Placed(_)) {
                bytes.placed += d.bytes(block_bytes);
            }
        }
        st.syncing = Some(Arc::new(map));
        bytes
    }

    /// Writes the syncing changes in txg `txg` and installs the new tree. Old blocks are freed
    /// in `txg` (deferred by the allocator).
    pub fn sync(&self, io: &ObjectIo, txg: u64) -> Result<DnodePhys, ZioError> {
        let (old, dirty, overrides) = {
            let mut st = self.state.lock();
            let overrides = std::mem::take(&mut st.syncing_overrides);
            (st.dnode, st.syncing.clone(), overrides)
        };
        let Some(dirty) = dirty else { return Ok(old) };
        // Blocks written ahead are adopted where the dirty buffer is still theirs; the others
        // were superseded and are freed.
        let mut adopted: BTreeMap<u64, BlkPtr> = BTreeMap::new();
        let mut superseded: Vec<BlkPtr> = Vec::new();
        for (blkid, (data, bp)) in overrides {
            match dirty.get(&blkid) {
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
        };
        let mut new = old;
        let max_blkid = *dirty.keys().next_back().expect("non-empty");
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
        let mut patched: Vec<Patched> = Vec::new();
        let mut patched_slots: Vec<usize> = Vec::new();
        // Adopted together below: a stream's blocks lie one after another.
        let mut to_adopt: Vec<usize> = Vec::new();
        for (&blkid, change) in dirty.iter() {
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
                        io.cache.insert(bp, d.clone());
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
                    *bp
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
        let bufs: Vec<&[u8]> = to_write.iter().map(|(_, d)| d.as_slice()).collect();
        let bps = io.zio.write_batch(&bufs, data_props, txg)?;
        for ((slot, d), bp) in to_write.into_iter().zip(bps) {
            io.cache.insert(&bp, d.clone());
            children[slot].1 = bp;
        }
        let patched_bps = sync_patched(io, &old, &patched, data_props, txg)?;
        for (slot, bp) in patched_slots.into_iter().zip(patched_bps) {
            children[slot].1 = bp;
        }

        // Indirect levels, bottom up.
        let ind_props = WriteProps {
            kind: BlockKind::Indirect,
            level: 0,
            checksum: checksum.for_metadata(),
            copies: (old.copies as usize).clamp(2, 3),
            class: self.class,
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
            // The level's new indirect blocks, then written as one batch: in block order, so
            // neighbours land next to each other and go to the device as a few long writes.
            // Like `children`, `parents` is in block order, the built blocks' slots filled
            // once they are written.
            let mut parents: Vec<(u64, BlkPtr)> = Vec::with_capacity(children.len() / FANOUT + 1);
            let mut built: Vec<(usize, Vec<u8>, u64)> = Vec::new();
            for group in children.chunk_by(|a, b| a.0 >> IND_SHIFT == b.0 >> IND_SHIFT) {
                let pidx = group[0].0 >> IND_SHIFT;
                let old_parent = if level < old.nlevels {
                    lookup(io, &old, level, pidx)?
                } else {
                    BlkPtr::HOLE
                };
                if level == old.nlevels - 1 && pidx == 0 {
                    old_root_replaced = true;
                }
                let mut content = if old_parent.is_hole() {
                    vec![0u8; IND_BLOCK_BYTES]
                } else {
                    io.read_bp(&old_parent)?.to_vec()
                };
                for &(idx, bp) in group {
                    let slot = (idx as usize) & (FANOUT - 1);
                    let prev = bp_at(&content, slot);
                    if !prev.is_hole() && prev != bp {
                        replaced.push(prev);
                    }
                    set_bp(&mut content, slot, &bp);
                }
                io.zio.free_all(&replaced, txg, self.class);
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
        let root = first(&children).unwrap_or(if old_root_replaced {
            BlkPtr::HOLE
        } else {
            old.root
        });
        if old_root_replaced && !old.root.is_hole() && old.root != root {
            io.zio.free(&old.root, txg, self.class);
        }
        new.root = root;

        let mut st = self.state.lock();
        st.dnode.root = new.root;
        st.dnode.nlevels = new.nlevels;
        st.syncing = None;
        Ok(st.dnode)
    }

    /// Frees every block of the object in txg `txg` (the object is being destroyed), and the
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
                .chain(st.syncing.iter().flat_map(|s| s.values()));
            unsynced
                .filter_map(Dirty::placed)
                .chain(open.into_values().chain(syncing.into_values()).map(|o| o.1))
                .collect()
        };
        for bp in ahead {
            io.zio.free(&bp, txg, AllocClass::Mos);
        }
        let dn = self.dnode();
        walk(io, &dn, &mut |bp, _| {
            io.zio.free(bp, txg, self.class);
            Ok(())
        })
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
            let pick = |m: &BTreeMap<u64, Dirty>| -> Vec<(u64, bool)> {
                m.range(from..to)
                    .map(|(&k, d)| (k, !matches!(d, Dirty::Free)))
                    .collect()
            };
            let syncing = st.syncing.as_ref().map(|s| pick(s)).unwrap_or_default();
            (st.dnode, pick(&st.open), syncing)
        };
        let mut on_disk = Vec::new();
        collect_blkids(io, dn.root, dn.nlevels - 1, 0, from, to, &mut on_disk)?;
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
type Patched<'a> = (u64, &'a [Piece]);

/// Reads and verifies blocks (`Zio::read_batch_into`) into buffers the cache has spare
/// (`BlockCache::take_buf`), one per pointer, in order.
fn read_spare(io: &ObjectIo, bps: &[BlkPtr]) -> Vec<Result<Vec<u8>, ZioError>> {
    let mut bufs: Vec<Vec<u8>> = bps
        .iter()
        .map(|bp| io.cache.take_buf(bp.psize.get() as usize))
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

fn read_bases(io: &ObjectIo, at: &[BlkPtr]) -> Bases {
    let mut bases: Bases = at.iter().map(|bp| Ok(io.cache.get(bp))).collect();
    let misses: Vec<usize> = (0..at.len())
        .filter(|&i| !at[i].is_hole() && matches!(bases[i], Ok(None)))
        .collect();
    let bps: Vec<BlkPtr> = misses.iter().map(|&i| at[i]).collect();
    for (i, data) in misses.into_iter().zip(read_spare(io, &bps)) {
        bases[i] = data.map(|d| Some(Arc::new(d)));
    }
    bases
}

/// Writes a syncing txg's patched blocks (`Dirty::Patch`): each is what it held as of the
/// last sync (the tree of `old`) with the txg's pieces laid over it. Built and written a
/// bounded batch at a time: a txg of short writes into large blocks patches many more
/// blocks than the memory it holds. A helper thread reads the next batch's old contents
/// while this one writes the last: done in turn, the reads (a RAID-Z block is read
/// column by column) and the writes each left the other's resources idle, and random 4K
/// writes on raidz2 ran 12 % slower than when writers read their blocks themselves.
fn sync_patched(
    io: &ObjectIo,
    old: &DnodePhys,
    patched: &[Patched],
    props: WriteProps,
    txg: u64,
) -> Result<Vec<BlkPtr>, ZioError> {
    // Each patched block's new pointer, in order.
    let mut out = vec![BlkPtr::HOLE; patched.len()];
    if patched.is_empty() {
        return Ok(out);
    }
    let block_bytes = old.data_block_bytes.get() as usize;
    let mut leaves = Leaves::new(old);
    let mut at = Vec::with_capacity(patched.len());
    for (blkid, _) in patched {
        at.push(leaves.get(io, *blkid)?);
    }
    let per_batch = (patch_batch_bytes(io.cache.capacity()) / block_bytes).max(1);
    let batches: Vec<(&[Patched], &[BlkPtr])> = patched
        .chunks(per_batch)
        .zip(at.chunks(per_batch))
        .collect();
    let outs = out.chunks_mut(per_batch);
    std::thread::scope(|s| {
        // One thread reads the batches after the first, each while this one writes the one
        // before (the channel holds none: the reader waits with each batch until it is
        // taken, so two batches are in memory at most). Named, so a profile tells its reads
        // from the sync thread's own work. Started once per sync: a thread per batch cost
        // its stack's mapping and unmapping, hundreds of times a txg. If no thread can be
        // had, or it stops, this one reads the batches itself.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Bases>(0);
        let ahead = &batches[1..];
        let reader = !ahead.is_empty()
            && std::thread::Builder::new()
                .name("patch-bases".into())
                .spawn_scoped(s, move || {
                    for &(_, at) in ahead {
                        if tx.send(read_bases(io, at)).is_err() {
                            break; // the sync stopped at an error
                        }
                    }
                })
                .is_ok();
        for (k, (&(batch, at), out)) in batches.iter().zip(outs).enumerate() {
            let bases = match k > 0 && reader {
                true => rx.recv().unwrap_or_else(|_| read_bases(io, at)),
                false => read_bases(io, at),
            };
            write_patched(io, batch, at, bases, block_bytes, props, txg, out)?;
        }
        Ok::<(), ZioError>(())
    })?;
    Ok(out)
}

/// Lays one batch of patched blocks over what they held (`bases`) and writes them; their
/// new pointers go to `out`, in order.
#[allow(clippy::too_many_arguments)]
fn write_patched(
    io: &ObjectIo,
    batch: &[Patched],
    at: &[BlkPtr],
    bases: Bases,
    block_bytes: usize,
    props: WriteProps,
    txg: u64,
    out: &mut [BlkPtr],
) -> Result<(), ZioError> {
    // Each block's place in the batch, its bytes, and its checksum if already known.
    let mut built: Vec<(usize, Vec<u8>, Option<Checksum>)> = Vec::new();
    for (i, (((_, pieces), bp), base)) in batch.iter().zip(at).zip(bases).enumerate() {
        match base {
            Ok(base) => {
                let (b, sum) = overlay_summed(base, bp, pieces, block_bytes, props.checksum);
                if is_zero(&b) {
                    out[i] = BlkPtr::HOLE;
                } else {
                    built.push((i, b, sum));
                }
            }
            // No copy of what the block held verifies: the pieces cannot be laid over it
            // without inventing the rest. The block keeps its damaged copy, so reads of it
            // go on failing rather than showing made-up bytes, and the pieces are lost with
            // it (counted; the failed read counted the damage).
            Err(_) => {
                io.zio.stats.lost_patches.fetch_add(1, Ordering::Relaxed);
                out[i] = *bp;
            }
        }
    }
    if built.is_empty() {
        return Ok(());
    }
    let bufs: Vec<&[u8]> = built.iter().map(|(_, b, _)| b.as_slice()).collect();
    let sums: Vec<Option<Checksum>> = built.iter().map(|(_, _, sum)| *sum).collect();
    let bps = io.zio.write_batch_summed(&bufs, &sums, props, txg)?;
    for ((i, b, _), bp) in built.into_iter().zip(bps) {
        io.cache.insert(&bp, Arc::new(b));
        out[i] = bp;
    }
    Ok(())
}

/// The pointer to block `idx` of `level` in the tree of `dn` (a hole when out of its range).
fn lookup(io: &ObjectIo, dn: &DnodePhys, level: u8, idx: u64) -> Result<BlkPtr, ZioError> {
    lookup_in(io, dn, level, idx, Wait::Yes).map(|bp| bp.expect("a waiting read answers"))
}

/// `lookup`, or with `Wait::No` `None` where an indirect block would wait for a device.
fn lookup_in(
    io: &ObjectIo,
    dn: &DnodePhys,
    level: u8,
    idx: u64,
    wait: Wait,
) -> Result<Option<BlkPtr>, ZioError> {
    let top = dn.nlevels - 1;
    if level > top || (idx >> (IND_SHIFT as u64 * (top - level) as u64)) != 0 {
        return Ok(Some(BlkPtr::HOLE));
    }
    let mut bp = dn.root;
    for l in (level + 1..=top).rev() {
        if bp.is_hole() {
            return Ok(Some(bp));
        }
        let Some(block) = io.fetch(&bp, wait)? else {
            return Ok(None);
        };
        let slot = ((idx >> (IND_SHIFT * (l - 1 - level) as u32)) as usize) & (FANOUT - 1);
        bp = bp_at(&block, slot);
    }
    Ok(Some(bp))
}

/// Block pointers of level-0 blocks looked up in order: consecutive blocks under one level-1
/// block take it once, where `lookup` would walk the tree from the root for each.
struct Leaves<'a> {
    dn: &'a DnodePhys,
    /// The level-1 block last walked to (its index; `None` for a hole).
    parent: Option<(u64, Option<Arc<Vec<u8>>>)>,
}

impl<'a> Leaves<'a> {
    fn new(dn: &'a DnodePhys) -> Leaves<'a> {
        Leaves { dn, parent: None }
    }

    fn get(&mut self, io: &ObjectIo, blkid: u64) -> Result<BlkPtr, ZioError> {
        self.get_in(io, blkid, Wait::Yes)
            .map(|bp| bp.expect("a waiting read answers"))
    }

    /// `get`, or with `Wait::No` `None` where an indirect block would wait for a device.
    fn get_in(
        &mut self,
        io: &ObjectIo,
        blkid: u64,
        wait: Wait,
    ) -> Result<Option<BlkPtr>, ZioError> {
        if self.dn.nlevels < 2 {
            return lookup_in(io, self.dn, 0, blkid, wait);
        }
        let pidx = blkid >> IND_SHIFT;
        let block = match &self.parent {
            Some((p, block)) if *p == pidx => block.clone(),
            _ => {
                let Some(pbp) = lookup_in(io, self.dn, 1, pidx, wait)? else {
                    return Ok(None);
                };
                let block = if pbp.is_hole() {
                    None
                } else {
                    let Some(b) = io.fetch(&pbp, wait)? else {
                        return Ok(None);
                    };
                    Some(b)
                };
                self.parent = Some((pidx, block.clone()));
                block
            }
        };
        Ok(Some(block.map_or(BlkPtr::HOLE, |b| {
            bp_at(&b, (blkid as usize) & (FANOUT - 1))
        })))
    }
}

fn collect_blkids(
    io: &ObjectIo,
    bp: BlkPtr,
    level: u8,
    first: u64,
    from: u64,
    to: u64,
    out: &mut Vec<u64>,
) -> Result<(), ZioError> {
    let span = 1u64 << (IND_SHIFT * level as u32);
    if bp.is_hole() || first >= to || first + span <= from {
        return Ok(());
    }
    if level == 0 {
        out.push(first);
        return Ok(());
    }
    let block = io.read_bp(&bp)?;
    let child_span = span >> IND_SHIFT;
    for slot in 0..FANOUT {
        let child = bp_at(&block, slot);
        collect_blkids(
            io,
            child,
            level - 1,
            first + slot as u64 * child_span,
            from,
            to,
            out,
        )?;
    }
    Ok(())
}

/// What a `walk_from` visitor wants done below a block pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Visit {
    Descend,
    /// Do not read the block's children (it is damaged, or of no interest).
    Skip,
}

/// Visits the block pointers of the tree of `dn` in block order, parents before children,
/// telling `f` the first block id each one covers; subtrees that lie wholly before block
/// `from` are passed over without being read, so a scan can resume where it stopped. An
/// indirect block that cannot be read is passed over as if `f` had said `Skip`, after `f`
/// was shown its pointer (a scrub reads and reports it there).
pub fn walk_from(
    io: &ObjectIo,
    dn: &DnodePhys,
    from: u64,
    f: &mut dyn FnMut(&BlkPtr, u8, u64) -> Visit,
) {
    fn go(
        io: &ObjectIo,
        bp: &BlkPtr,
        level: u8,
        first: u64,
        from: u64,
        f: &mut dyn FnMut(&BlkPtr, u8, u64) -> Visit,
    ) {
        let span = (FANOUT as u64).saturating_pow(level as u32);
        if bp.is_hole() || first.saturating_add(span) <= from {
            return;
        }
        if f(bp, level, first) == Visit::Skip || level == 0 {
            return;
        }
        let Ok(block) = io.read_bp(bp) else {
            return;
        };
        let child_span = span / FANOUT as u64;
        for slot in 0..FANOUT {
            go(
                io,
                &bp_at(&block, slot),
                level - 1,
                first + slot as u64 * child_span,
                from,
                f,
            );
        }
    }
    go(io, &dn.root, dn.nlevels - 1, 0, from, f)
}

/// Visits every block pointer of the tree of `dn`, parents before children, reading (and so
/// verifying) every indirect block.
pub fn walk(
    io: &ObjectIo,
    dn: &DnodePhys,
    f: &mut dyn FnMut(&BlkPtr, u8) -> Result<(), ZioError>,
) -> Result<(), ZioError> {
    fn go(
        io: &ObjectIo,
        bp: &BlkPtr,
        level: u8,
        f: &mut dyn FnMut(&BlkPtr, u8) -> Result<(), ZioError>,
    ) -> Result<(), ZioError> {
        if bp.is_hole() {
            return Ok(());
        }
        f(bp, level)?;
        if level > 0 {
            let block = io.read_bp(bp)?;
            for slot in 0..FANOUT {
                go(io, &bp_at(&block, slot), level - 1, f)?;
            }
        }
        Ok(())
    }
    go(io, &dn.root, dn.nlevels - 1, f)
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
        let delta = |bytes, held| Some(Delta { bytes, held });
        // The first piece dirties the whole block and holds its own bytes.
        assert_eq!(o.patch(0, 0, piece(4096, 1)), delta(16384, 4096));
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
}
