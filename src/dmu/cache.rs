//! A bounded cache of blocks keyed by their first copy's address and birth txg. Blocks never
//! change once written, and an address is reused only by a block with a later birth txg, so
//! entries never go stale and need no invalidation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use crate::spa::BlkPtr;

const SHARDS: usize = 16;

type Key = (u32, u64, u64);

struct Shard {
    lru: LruCache<Key, Arc<Vec<u8>>>,
    bytes: u64,
}

impl Shard {
    fn evict_to(&mut self, limit: u64) {
        while self.bytes > limit {
            match self.lru.pop_lru() {
                Some((_, v)) => self.bytes -= v.len() as u64,
                None => break,
            }
        }
    }
}

pub struct BlockCache {
    shards: Vec<Mutex<Shard>>,
    /// The configured size: the most the cache ever holds.
    capacity_bytes: AtomicU64,
    /// What it may hold now (at most `capacity_bytes`): lowered while the process as a whole
    /// is short of memory (see `set_limit`).
    limit_bytes: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
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
        BlockCache {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        lru: LruCache::unbounded(),
                        bytes: 0,
                    })
                })
                .collect(),
            capacity_bytes: AtomicU64::new(capacity_bytes),
            limit_bytes: AtomicU64::new(capacity_bytes),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
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

    pub fn get(&self, bp: &BlkPtr) -> Option<Arc<Vec<u8>>> {
        let k = key(bp);
        let hit = self.shard(&k).lock().lru.get(&k).cloned();
        match hit {
            Some(_) => self.hits.fetch_add(1, Ordering::Relaxed),
            None => self.misses.fetch_add(1, Ordering::Relaxed),
        };
        hit
    }

    fn shard_limit(&self) -> u64 {
        self.limit_bytes.load(Ordering::Relaxed) / SHARDS as u64
    }

    pub fn insert(&self, bp: &BlkPtr, data: Arc<Vec<u8>>) {
        let k = key(bp);
        let limit = self.shard_limit();
        let mut s = self.shard(&k).lock();
        let len = data.len() as u64;
        if len > limit {
            return;
        }
        if let Some(old) = s.lru.put(k, data) {
            s.bytes -= old.len() as u64;
        }
        s.bytes += len;
        s.evict_to(limit);
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

    /// Lets the cache hold `bytes` (at most its capacity) from now on, evicting the least
    /// recently used blocks at once if it holds more. A process short of memory lowers it
    /// and raises it again as memory comes back; blocks never depend on being cached.
    pub fn set_limit(&self, bytes: u64) {
        let bytes = bytes.min(self.capacity());
        // The governor sets the limit 40 times a second; only a lower one has work to do.
        if self.limit_bytes.swap(bytes, Ordering::Relaxed) <= bytes {
            return;
        }
        let limit = bytes / SHARDS as u64;
        for s in &self.shards {
            s.lock().evict_to(limit);
        }
    }

    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().bytes).sum()
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
            c.insert(&bp, Arc::new(vec![0u8; 16384]));
            assert!(c.bytes() <= 16 * 65536);
        }
        let mut bp = BlkPtr::HOLE;
        bp.dva[0] = Dva::new(0, 999 * 65536, 65536);
        bp.birth_txg = 1.into();
        assert!(c.get(&bp).is_some());
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
