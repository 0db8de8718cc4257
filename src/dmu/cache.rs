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

pub struct BlockCache {
    shards: Vec<Mutex<Shard>>,
    shard_capacity_bytes: u64,
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
            shard_capacity_bytes: capacity_bytes / SHARDS as u64,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn shard(&self, k: &Key) -> &Mutex<Shard> {
        let h = (k.1 >> 12) ^ k.2.rotate_left(17) ^ k.0 as u64;
        &self.shards[(h as usize) % SHARDS]
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

    pub fn insert(&self, bp: &BlkPtr, data: Arc<Vec<u8>>) {
        let k = key(bp);
        let mut s = self.shard(&k).lock();
        let len = data.len() as u64;
        if len > self.shard_capacity_bytes {
            return;
        }
        if let Some(old) = s.lru.put(k, data) {
            s.bytes -= old.len() as u64;
        }
        s.bytes += len;
        while s.bytes > self.shard_capacity_bytes {
            match s.lru.pop_lru() {
                Some((_, v)) => s.bytes -= v.len() as u64,
                None => break,
            }
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
}
