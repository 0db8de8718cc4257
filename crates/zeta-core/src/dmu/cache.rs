//! The block cache: an adaptive replacement cache (`dmu::arc`, as OpenZFS's ARC) of blocks
//! keyed by their first copy's address and birth txg. Blocks never change once written, and
//! an address is reused only by a block with a later birth txg, so entries never go stale
//! and need no invalidation. But a block that a txg's sync replaces is dead to every later
//! reader, so the sync drops it (`forget`) rather than leave it to the lists: a txg's sync
//! looks each patched block's old copy up just before it writes the new one, which made the
//! dead copy look used twice, and a working set rewritten every txg took twice its size.
//!
//! A block read from its device that is stored compressed is kept as it is stored (OpenZFS's
//! compressed ARC): it takes its stored size, and each hit decompresses it. Blocks a sync has
//! just written are kept as they were written, uncompressed.
//!
//! The buffers of evicted blocks are kept, a few MiB of them, for the next blocks read
//! (`take_buf`): a txg of short writes into large blocks reads and replaces thousands of
//! blocks, and allocating each buffer anew (zeroed, as a `Vec` must be before a read fills
//! it) cost more than the read's copy out of the page cache, and its free as much again.
//!
//! Memory beyond the cached bytes: about 100 bytes per cached block and per ghost (the lists'
//! nodes and hash slots); ghosts are at most the cache's size in blocks twice over, so at
//! least 4K a block that is under 5 % of `--cache`, at 16K blocks about 1 %.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::arc::{Ghost, Hit, ListSizes, Lists};
use crate::spa::BlkPtr;
use crate::zio::compress;

const SHARDS: usize = 16;

/// The most bytes of evicted blocks' buffers kept for reuse: a few batches of the largest
/// blocks a txg sync reads at once (`dmu::object::patch_batch_bytes`, at most 2 MiB); a
/// small cache keeps fewer (`BlockCache::spare_max`).
const SPARE_MAX_BYTES: usize = 8 << 20;

type Key = (u32, u64, u64);

/// The longest a reader waits for a block being read ahead (`wait_read_ahead`) before it
/// reads the block itself: a stalled device holds up one reader, not every reader after it.
const READ_AHEAD_WAIT: Duration = Duration::from_secs(1);

/// A cached block: its logical bytes, or (`stored`) its compressed bytes as on disk.
#[derive(Clone)]
struct Entry {
    data: Arc<Vec<u8>>,
    stored: bool,
    lsize: u32,
}

impl Entry {
    /// Whether this is the block `bp` names: of its size (see `BlockCache::get`).
    fn fits(&self, bp: &BlkPtr) -> bool {
        if self.stored {
            bp.compression != compress::BP_OFF
                && self.data.len() == bp.psize.get() as usize
                && self.lsize == bp.lsize.get()
        } else {
            self.data.len() == bp.lsize.get() as usize
        }
    }
}

struct Shard {
    arc: Lists<Key, Entry>,
    /// Stored bytes of the entries kept compressed, and what they hold.
    compressed: u64,
    compressed_logical: u64,
}

impl Shard {
    fn account(&mut self, e: &Entry, add: bool) {
        if e.stored {
            let (b, l) = (e.data.len() as u64, e.lsize as u64);
            if add {
                self.compressed += b;
                self.compressed_logical += l;
            } else {
                self.compressed -= b;
                self.compressed_logical -= l;
            }
        }
    }

    fn dropped(&mut self, evicted: &[Entry]) {
        for e in evicted {
            self.account(e, false);
        }
    }
}

/// Evicted blocks' buffers waiting for reuse, and their total size.
#[derive(Default)]
struct Spares {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

/// What the cache counted and holds, summed over its shards (`zeta pool arcstat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Hits on blocks read ahead, on their first use (counted in `hits` too).
    pub prefetch_hits: u64,
    /// Misses whose block was in a ghost list: lately evicted from T1 (B1) or T2 (B2).
    pub ghost_hits_b1: u64,
    pub ghost_hits_b2: u64,
    /// Bytes in each list, the target of T1 (`p`) and the capacity (`c`) now.
    pub lists: ListSizes,
    pub ghost_entries: u64,
    /// Stored bytes of the blocks kept compressed, and the logical bytes they hold.
    pub compressed_bytes: u64,
    pub compressed_logical_bytes: u64,
}

pub struct BlockCache {
    shards: Vec<Mutex<Shard>>,
    /// The configured size: the most the cache ever holds.
    capacity_bytes: AtomicU64,
    /// What it may hold now (at most `capacity_bytes`): lowered while the process as a whole
    /// is short of memory (see `set_limit`).
    limit_bytes: AtomicU64,
    /// Buffers of evicted blocks no one else held, for `take_buf`.
    spares: Mutex<Spares>,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    prefetch_hits: AtomicU64,
    ghost_hits_b1: AtomicU64,
    ghost_hits_b2: AtomicU64,
    /// Blocks being read ahead now (`reading_ahead`), and the wake-up of their waiters.
    in_flight: Mutex<HashSet<Key>>,
    landed: Condvar,
}

/// Blocks marked as being read ahead (`BlockCache::reading_ahead`) until this is dropped.
pub struct ReadingAhead<'a> {
    cache: &'a BlockCache,
    keys: Vec<Key>,
}

impl ReadingAhead<'_> {
    /// No longer marks the blocks `bps` point at (they are not to be read after all), and
    /// wakes whoever waits for them.
    pub fn release<'b>(&mut self, bps: impl IntoIterator<Item = &'b BlkPtr>) {
        let gone: HashSet<Key> = bps.into_iter().map(key).collect();
        if gone.is_empty() {
            return;
        }
        self.keys.retain(|k| !gone.contains(k));
        let mut in_flight = self.cache.in_flight.lock();
        for k in &gone {
            in_flight.remove(k);
        }
        self.cache.landed.notify_all();
    }
}

impl Drop for ReadingAhead<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.cache.in_flight.lock();
        for k in &self.keys {
            in_flight.remove(k);
        }
        self.cache.landed.notify_all();
    }
}

fn key(bp: &BlkPtr) -> Key {
    (
        bp.dva[0].vdev.get(),
        bp.dva[0].offset.get(),
        bp.birth_txg.get(),
    )
}

impl BlockCache {
    pub fn new(capacity_bytes: u64) -> BlockCache {
        let per_shard = capacity_bytes / SHARDS as u64;
        BlockCache {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        arc: Lists::new(per_shard),
                        compressed: 0,
                        compressed_logical: 0,
                    })
                })
                .collect(),
            capacity_bytes: AtomicU64::new(capacity_bytes),
            limit_bytes: AtomicU64::new(capacity_bytes),
            spares: Mutex::new(Spares::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            prefetch_hits: AtomicU64::new(0),
            ghost_hits_b1: AtomicU64::new(0),
            ghost_hits_b2: AtomicU64::new(0),
            in_flight: Mutex::new(HashSet::new()),
            landed: Condvar::new(),
        }
    }

    /// Marks the blocks `bps` point at as being read ahead until the guard returned is
    /// dropped (after they are inserted): a reader that needs one meanwhile waits for it
    /// (`wait_read_ahead`) rather than read it a second time, as a demand read in OpenZFS
    /// waits on the prefetch I/O it finds in flight.
    pub fn reading_ahead(&self, bps: &[BlkPtr]) -> ReadingAhead<'_> {
        let keys: Vec<Key> = bps.iter().map(key).collect();
        self.in_flight.lock().extend(keys.iter().copied());
        ReadingAhead { cache: self, keys }
    }

    /// Waits while the block `bp` points at is being read ahead (at most `READ_AHEAD_WAIT`),
    /// so that a `get` after it finds the block. Returns at once for any other block.
    pub fn wait_read_ahead(&self, bp: &BlkPtr) {
        let k = key(bp);
        let deadline = Instant::now() + READ_AHEAD_WAIT;
        let mut in_flight = self.in_flight.lock();
        while in_flight.contains(&k) {
            if self.landed.wait_until(&mut in_flight, deadline).timed_out() {
                return;
            }
        }
    }

    /// The shard of a key: every bit of the address and txg mixed in (multiplied by an odd
    /// constant, the top bits taken). Block addresses are multiples of the block size, so
    /// their low bits are zero: picked by the low bits of `offset >> 12`, 16K blocks used a
    /// quarter of the shards and 128K blocks one, and the cache held that share of its size.
    fn shard(&self, k: &Key) -> &Mutex<Shard> {
        let mixed = (k.1 ^ k.2.rotate_left(40) ^ (k.0 as u64).rotate_left(56))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        &self.shards[(mixed >> 60) as usize % SHARDS]
    }

    /// The cached block `bp` points at, decompressed if it is kept compressed. A block of
    /// another size under the same key is not this pointer's: only a pointer no writer made
    /// (crafted, or damaged behind a valid checksum) names the address and birth txg of
    /// another block, and its block is read, and checked, from the device instead.
    pub fn get(&self, bp: &BlkPtr) -> Option<Arc<Vec<u8>>> {
        self.lookup(bp, false)
    }

    /// `get` for a sequential reader's read in the block its last read ended in: not a new
    /// use of the block (`Lists::get_again`).
    pub fn get_again(&self, bp: &BlkPtr) -> Option<Arc<Vec<u8>>> {
        self.lookup(bp, true)
    }

    fn lookup(&self, bp: &BlkPtr, again: bool) -> Option<Arc<Vec<u8>>> {
        let k = key(bp);
        let found = {
            let mut s = self.shard(&k).lock();
            let hit = if again {
                s.arc.get_again(&k)
            } else {
                s.arc.get(&k)
            };
            hit.map(|(e, hit)| (e.clone(), hit))
        };
        match found {
            Some((e, hit)) => self.hand_out(bp, e, hit == Hit::Prefetched),
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// The logical bytes of an entry found for `bp`, decompressed if kept as stored, counted
    /// as a hit (and a prefetch hit if `prefetched`); a miss if it is not `bp`'s block.
    fn hand_out(&self, bp: &BlkPtr, e: Entry, prefetched: bool) -> Option<Arc<Vec<u8>>> {
        if !e.fits(bp) {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let data = if e.stored {
            let mut out = self.take_buf(e.lsize as usize);
            // The stored bytes verified when they were read; a failure here is a bug, and the
            // block is read from its device instead, where the read reports it.
            if compress::decompress(bp.compression, &e.data, &mut out).is_err() {
                self.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            Arc::new(out)
        } else {
            e.data
        };
        self.hits.fetch_add(1, Ordering::Relaxed);
        if prefetched {
            self.prefetch_hits.fetch_add(1, Ordering::Relaxed);
        }
        Some(data)
    }

    /// `get` for a reader that keeps no copy (a streaming read): a block read ahead for it
    /// and not used yet is taken out of the cache as it is handed over, so a stream's reads
    /// ahead do not stay to crowd out what other readers use.
    pub fn take_prefetched(&self, bp: &BlkPtr) -> Option<Arc<Vec<u8>>> {
        let k = key(bp);
        let taken = {
            let mut s = self.shard(&k).lock();
            let e = s.arc.take_prefetched(&k);
            if let Some(e) = &e {
                s.account(e, false);
            }
            e
        };
        match taken {
            Some(e) => self.hand_out(bp, e, true),
            None => self.get(bp),
        }
    }

    /// Whether the block `bp` points at is cached (its order untouched, nothing counted).
    pub fn contains(&self, bp: &BlkPtr) -> bool {
        let k = key(bp);
        self.shard(&k).lock().arc.contains(&k)
    }

    /// Keeps the logical bytes of the block `bp` points at.
    pub fn insert(&self, bp: &BlkPtr, data: Arc<Vec<u8>>) {
        let lsize = data.len() as u32;
        self.put(
            bp,
            Entry {
                data,
                stored: false,
                lsize,
            },
            false,
        );
    }

    /// Keeps the stored (compressed) bytes of the block `bp` points at, as read and verified;
    /// `prefetch`: read ahead of any reader.
    pub fn insert_stored(&self, bp: &BlkPtr, stored: Arc<Vec<u8>>, prefetch: bool) {
        debug_assert!(bp.compression != compress::BP_OFF);
        let e = Entry {
            data: stored,
            stored: true,
            lsize: bp.lsize.get(),
        };
        self.put(bp, e, prefetch);
    }

    /// Keeps the logical bytes of a block read ahead of any reader.
    pub fn insert_prefetched(&self, bp: &BlkPtr, data: Arc<Vec<u8>>) {
        let lsize = data.len() as u32;
        self.put(
            bp,
            Entry {
                data,
                stored: false,
                lsize,
            },
            true,
        );
    }

    fn put(&self, bp: &BlkPtr, e: Entry, prefetch: bool) {
        let k = key(bp);
        let len = e.data.len() as u64;
        let mut evicted = Vec::new();
        let ghost = {
            let mut s = self.shard(&k).lock();
            s.account(&e, true);
            let ghost = s.arc.insert(k, e.clone(), len, prefetch, &mut evicted);
            if !s.arc.contains(&k) {
                // Larger than the shard: not kept.
                s.account(&e, false);
            }
            s.dropped(&evicted);
            ghost
        };
        match ghost {
            Some(Ghost::B1) => self.ghost_hits_b1.fetch_add(1, Ordering::Relaxed),
            Some(Ghost::B2) => self.ghost_hits_b2.fetch_add(1, Ordering::Relaxed),
            None => 0,
        };
        self.keep_spares(evicted);
    }

    /// Drops the cached blocks among `bps`: copies that a sync has replaced (see the module's
    /// doc). A reader that still walks the tree from before the sync finds them on their
    /// devices, where they stay until their space is reused, txgs later. Their buffers are
    /// kept for the next reads, as evicted ones are.
    pub fn forget(&self, bps: &[BlkPtr]) {
        let mut dropped = Vec::new();
        for bp in bps.iter().filter(|bp| !bp.is_hole()) {
            let k = key(bp);
            let mut s = self.shard(&k).lock();
            if let Some(e) = s.arc.remove(&k) {
                s.account(&e, false);
                dropped.push(e);
            }
        }
        self.keep_spares(dropped);
    }

    /// Keeps the buffers of `evicted` blocks that no reader still holds, up to
    /// `spare_max` in all; the rest are freed (outside any shard's lock).
    fn keep_spares(&self, evicted: Vec<Entry>) {
        if evicted.is_empty() {
            return;
        }
        let max = self.spare_max();
        let mut spares = self.spares.lock();
        for e in evicted {
            if let Ok(b) = Arc::try_unwrap(e.data) {
                if spares.bytes + b.len() <= max {
                    spares.bytes += b.len();
                    spares.bufs.push(b);
                }
            }
        }
    }

    /// The most bytes of spare buffers kept: four of the sync's batches of patched blocks
    /// (`dmu::object::patch_batch_bytes`, a 32nd of the cache), at most `SPARE_MAX_BYTES`.
    /// A small cache keeps fewer: spares are memory outside the cache, and a fixed 8M of them
    /// took `zeta bench vol` (a 32M cache) to its budget and once past it (figures:
    /// docs/perf/memory.md, "Why spare buffers are at most an eighth of the cache").
    fn spare_max(&self) -> usize {
        (self.capacity_bytes.load(Ordering::Relaxed) / 8).min(SPARE_MAX_BYTES as u64) as usize
    }

    /// Keeps a block's buffer that its reader is done with for the next read (`take_buf`),
    /// if no one else holds it (the cache's own blocks stay where they are).
    pub fn give_back(&self, data: Arc<Vec<u8>>) {
        if let Ok(b) = Arc::try_unwrap(data) {
            let max = self.spare_max();
            let mut spares = self.spares.lock();
            if spares.bytes + b.len() <= max {
                spares.bytes += b.len();
                spares.bufs.push(b);
            }
        }
    }

    /// A buffer of `len` bytes for a block about to be read into it: an evicted block's,
    /// holding its old bytes, if one of that size is spare; else a new zeroed one.
    pub fn take_buf(&self, len: usize) -> Vec<u8> {
        let mut spares = self.spares.lock();
        if let Some(i) = spares.bufs.iter().rposition(|b| b.len() == len) {
            spares.bytes -= len;
            return spares.bufs.swap_remove(i);
        }
        drop(spares);
        vec![0u8; len]
    }

    /// The configured size.
    pub fn capacity(&self) -> u64 {
        self.capacity_bytes.load(Ordering::Relaxed)
    }

    /// Sets the configured size; the cache may hold all of it again.
    pub fn set_capacity(&self, bytes: u64) {
        self.capacity_bytes.store(bytes, Ordering::Relaxed);
        self.set_limit(bytes);
    }

    /// What the cache may hold now.
    pub fn limit(&self) -> u64 {
        self.limit_bytes.load(Ordering::Relaxed)
    }

    /// Lets the cache hold `bytes` (at most its capacity) from now on, evicting at once (as
    /// the lists choose: `Lists::set_capacity`) if it holds more. A process short of memory
    /// lowers it and raises it again as memory comes back; blocks never depend on being
    /// cached.
    pub fn set_limit(&self, bytes: u64) {
        let bytes = bytes.min(self.capacity());
        // The governor sets the limit 40 times a second; most calls change nothing.
        if self.limit_bytes.swap(bytes, Ordering::Relaxed) == bytes {
            return;
        }
        let per_shard = bytes / SHARDS as u64;
        for s in &self.shards {
            let mut evicted = Vec::new();
            let mut s = s.lock();
            s.arc.set_capacity(per_shard, &mut evicted);
            s.dropped(&evicted);
        }
        // The spares stay: a few MiB, counted by whoever lowers the limit as memory the
        // process holds outside the cache (`cli::memory`), and taken again by the next reads.
    }

    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().arc.resident()).sum()
    }

    /// The counters and the lists' sizes now.
    pub fn stats(&self) -> CacheStats {
        let mut st = CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            prefetch_hits: self.prefetch_hits.load(Ordering::Relaxed),
            ghost_hits_b1: self.ghost_hits_b1.load(Ordering::Relaxed),
            ghost_hits_b2: self.ghost_hits_b2.load(Ordering::Relaxed),
            ..Default::default()
        };
        for s in &self.shards {
            let s = s.lock();
            let l = s.arc.sizes();
            st.lists.t1 += l.t1;
            st.lists.t2 += l.t2;
            st.lists.b1 += l.b1;
            st.lists.b2 += l.b2;
            st.lists.p += l.p;
            st.lists.c += l.c;
            st.ghost_entries += s.arc.ghost_entries() as u64;
            st.compressed_bytes += s.compressed;
            st.compressed_logical_bytes += s.compressed_logical;
        }
        st
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spa::Dva;

    #[test]
    fn stays_within_its_bound() {
        let c = BlockCache::new(16 * 65536);
        for i in 0..1000u64 {
            let mut bp = BlkPtr::HOLE;
            bp.dva[0] = Dva::new(0, i * 65536, 65536);
            bp.birth_txg = 1.into();
            bp.psize = 16384.into();
            bp.lsize = 16384.into();
            c.insert(&bp, Arc::new(vec![0u8; 16384]));
            assert!(c.bytes() <= 16 * 65536);
        }
        let mut bp = BlkPtr::HOLE;
        bp.dva[0] = Dva::new(0, 999 * 65536, 65536);
        bp.birth_txg = 1.into();
        bp.psize = 16384.into();
        bp.lsize = 16384.into();
        assert!(c.get(&bp).is_some());
        // A pointer of another size under the same key (no writer makes one) is not given
        // this block, which it would read past or short of.
        bp.psize = 65536.into();
        bp.lsize = 65536.into();
        assert!(c.get(&bp).is_none());
        bp.psize = 16384.into();
        bp.lsize = 16384.into();
        bp.birth_txg = 2.into();
        assert!(c.get(&bp).is_none());
    }

    #[test]
    fn fills_to_nearly_its_size_with_blocks_at_aligned_addresses() {
        for bs in [4096u64, 16384, 131072] {
            let c = BlockCache::new(256 * bs);
            for i in 0..4096 {
                let mut bp = BlkPtr::HOLE;
                bp.dva[0] = Dva::new(0, (1 << 22) + i * bs, bs as u32);
                bp.birth_txg = (7 + i / 100).into();
                c.insert(&bp, Arc::new(vec![0u8; bs as usize]));
            }
            assert!(
                c.bytes() >= 256 * bs * 3 / 4,
                "{bs}: {} of {}",
                c.bytes(),
                256 * bs
            );
        }
    }

    #[test]
    fn evicted_buffers_are_reused_unless_someone_still_holds_them() {
        let c = BlockCache::new(SHARDS as u64 * 16384);
        let bp = |i: u64| {
            let mut bp = BlkPtr::HOLE;
            bp.dva[0] = Dva::new(0, i * 16384, 16384);
            bp.birth_txg = 1.into();
            bp
        };
        // Every block is still held here: nothing evicted is spare.
        let held: Vec<Arc<Vec<u8>>> = (0..64u8).map(|i| Arc::new(vec![i + 1; 16384])).collect();
        for (i, b) in held.iter().enumerate() {
            c.insert(&bp(i as u64), b.clone());
        }
        assert!(c.bytes() < 64 * 16384, "some were evicted: {}", c.bytes());
        assert_eq!(c.take_buf(16384), vec![0u8; 16384]);
        drop(held);
        // Let go: an eviction now leaves its buffer, old bytes and all.
        for i in 64..128u64 {
            c.insert(&bp(i), Arc::new(vec![0xa5; 16384]));
        }
        let reused = c.take_buf(16384);
        assert_eq!(reused.len(), 16384);
        assert!(reused[0] != 0 && reused.iter().all(|&x| x == reused[0]));
        // Only a buffer of the size asked for is handed out.
        assert_eq!(c.take_buf(4096), vec![0u8; 4096]);
        // The spares stay within their bound however much is evicted: an eighth of this
        // small cache.
        for i in 128..4096u64 {
            c.insert(&bp(i), Arc::new(vec![0x5a; 16384]));
        }
        let spares = c.spares.lock();
        assert_eq!(c.spare_max(), SHARDS * 16384 / 8);
        assert!(spares.bytes > 0 && spares.bytes <= c.spare_max());
        assert_eq!(BlockCache::new(1 << 30).spare_max(), SPARE_MAX_BYTES);
        assert_eq!(spares.bufs.len() * 16384, spares.bytes);
    }

    #[test]
    fn forgotten_blocks_leave_room_and_their_buffers() {
        let c = BlockCache::new(64 * 16384);
        let bp = |i: u64, txg: u64| {
            let mut bp = BlkPtr::HOLE;
            bp.dva[0] = Dva::new(0, i * 16384, 16384);
            bp.birth_txg = txg.into();
            bp.psize = 16384.into();
            bp.lsize = 16384.into();
            bp
        };
        for i in 0..8 {
            c.insert(&bp(i, 1), Arc::new(vec![i as u8 + 1; 16384]));
        }
        assert_eq!(c.bytes(), 8 * 16384);
        // Two of them replaced (and a hole, and a block never cached, asked for nothing).
        c.forget(&[bp(2, 1), bp(5, 1), BlkPtr::HOLE, bp(9, 1), bp(3, 2)]);
        assert_eq!(c.bytes(), 6 * 16384);
        assert!(c.get(&bp(2, 1)).is_none() && c.get(&bp(5, 1)).is_none());
        assert!((0..8)
            .filter(|i| ![2, 5].contains(i))
            .all(|i| c.get(&bp(i, 1)).is_some()));
        // Their buffers are spare for the next reads.
        let spare = c.take_buf(16384);
        assert!(spare[0] == 3 || spare[0] == 6, "{}", spare[0]);
    }

    #[test]
    fn compressed_blocks_are_kept_as_stored_and_handed_out_decompressed() {
        use crate::zio::compress::{compress, Compression};
        let c = BlockCache::new(SHARDS as u64 * 65536);
        let text: Vec<u8> = (0..65536u32)
            .map(|i| b"a log line\n"[i as usize % 11])
            .collect();
        let packed = compress(Compression::Lz4, &text).expect("text compresses");
        let mut bp = BlkPtr::HOLE;
        bp.dva[0] = Dva::new(0, 1 << 20, packed.bytes.len() as u32);
        bp.birth_txg = 3.into();
        bp.lsize = 65536.into();
        bp.psize = (packed.bytes.len() as u32).into();
        bp.compression = packed.codec;
        c.insert_stored(&bp, Arc::new(packed.bytes.clone()), false);
        assert_eq!(
            c.bytes(),
            packed.bytes.len() as u64,
            "counted at its stored size"
        );
        let st = c.stats();
        assert_eq!(st.compressed_bytes, packed.bytes.len() as u64);
        assert_eq!(st.compressed_logical_bytes, 65536);
        assert_eq!(c.get(&bp).as_deref(), Some(&text), "decompressed on a hit");
        // Under a pointer that says the block is stored as it is, it is not this block.
        let mut raw = bp;
        raw.compression = 0;
        raw.psize = 65536.into();
        assert!(c.get(&raw).is_none());
        c.forget(&[bp]);
        let st = c.stats();
        assert_eq!(
            (c.bytes(), st.compressed_bytes, st.compressed_logical_bytes),
            (0, 0, 0)
        );
        assert_eq!((st.hits, st.misses), (1, 1));
    }

    #[test]
    fn a_read_ahead_block_counts_a_prefetch_hit_once() {
        let c = BlockCache::new(SHARDS as u64 * 65536);
        let mut bp = BlkPtr::HOLE;
        bp.dva[0] = Dva::new(0, 1 << 20, 16384);
        bp.birth_txg = 3.into();
        bp.lsize = 16384.into();
        bp.psize = 16384.into();
        c.insert_prefetched(&bp, Arc::new(vec![7; 16384]));
        assert!(c.contains(&bp));
        assert!(c.get(&bp).is_some() && c.get(&bp).is_some());
        let st = c.stats();
        assert_eq!((st.hits, st.prefetch_hits), (2, 1));
        assert_eq!(st.lists.t2, 16384, "the second use promoted it");
    }

    #[test]
    fn a_streaming_reader_takes_a_read_ahead_block_out_and_leaves_others() {
        let c = BlockCache::new(SHARDS as u64 * 65536);
        let bp = |i: u64| {
            let mut bp = BlkPtr::HOLE;
            bp.dva[0] = Dva::new(0, i << 20, 16384);
            bp.birth_txg = 3.into();
            bp.lsize = 16384.into();
            bp.psize = 16384.into();
            bp
        };
        c.insert_prefetched(&bp(1), Arc::new(vec![7; 16384]));
        c.insert(&bp(2), Arc::new(vec![8; 16384]));
        assert_eq!(c.take_prefetched(&bp(1)).unwrap()[0], 7);
        assert!(!c.contains(&bp(1)), "taken out");
        // A block a demand read cached stays for the next reader.
        assert_eq!(c.take_prefetched(&bp(2)).unwrap()[0], 8);
        assert!(c.contains(&bp(2)));
        assert!(c.take_prefetched(&bp(3)).is_none());
        let st = c.stats();
        assert_eq!((st.hits, st.misses, st.prefetch_hits), (2, 1, 1));
        assert_eq!(
            (st.lists.t1, st.lists.b1),
            (0, 0),
            "no ghost of the taken block"
        );
    }

    #[test]
    fn a_lowered_limit_evicts_at_once_and_caps_later_inserts() {
        let c = BlockCache::new(64 * 16384);
        let bp = |i: u64| {
            let mut bp = BlkPtr::HOLE;
            bp.dva[0] = Dva::new(0, i * 16384, 16384);
            bp.birth_txg = 1.into();
            bp
        };
        for i in 0..1000 {
            c.insert(&bp(i), Arc::new(vec![0u8; 16384]));
        }
        assert!(c.bytes() > 32 * 16384, "filled: {}", c.bytes());
        c.set_limit(16 * 16384);
        assert!(c.bytes() <= 16 * 16384);
        for i in 1000..2000 {
            c.insert(&bp(i), Arc::new(vec![0u8; 16384]));
            assert!(c.bytes() <= 16 * 16384);
        }
        // Never above the configured size, and back to it when raised.
        c.set_limit(1 << 40);
        assert_eq!(c.limit(), 64 * 16384);
        for i in 2000..3000 {
            c.insert(&bp(i), Arc::new(vec![0u8; 16384]));
        }
        assert!(c.bytes() > 32 * 16384 && c.bytes() <= 64 * 16384);
        c.set_capacity(8 * 16384);
        assert!(c.bytes() <= 8 * 16384);
        assert_eq!((c.capacity(), c.limit()), (8 * 16384, 8 * 16384));
    }
}
