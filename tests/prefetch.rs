//! Sequential read prefetch (`dmu::zfetch` and the pool's prefetch thread) on real volumes: a
//! reader going through a volume in order in short reads finds most of its blocks read ahead;
//! long reads ask for nothing ahead but take what was read ahead for them; random reads read nothing ahead; `set_prefetch(false)` turns it off; and the
//! pool's close stops the thread. A scan in reads shorter than a block leaves the ARC's T2
//! (the blocks used more than once) alone, prefetch or not.
//!
//! The devices wait a little on every read, as a disk does: in memory a reader reads a block
//! as fast as the prefetch thread can, and there is nothing to be ahead of.

mod common;

use std::sync::Arc;

use common::*;
use zeta::dsl::Pool;
use zeta::vdev::mem::MemDevice;
use zeta::vdev::BlockDevice;
use zeta::zvol::Volume;

const VOLSIZE: u64 = 32 * MB;
const BLOCK: u32 = 16384;
const BLOCKS: u64 = VOLSIZE / BLOCK as u64;

/// What each read request of the devices waits (a fast SSD's latency).
const READ_LATENCY: std::time::Duration = std::time::Duration::from_micros(200);

/// A pool `name` holding volume `v` written whole and closed, then imported again on devices
/// that wait `READ_LATENCY` on each read, so its cache is empty: the devices, the open pool
/// and the volume's contents.
fn cold_pool(name: &str) -> (Vec<Arc<MemDevice>>, Arc<Pool>, Vec<u8>) {
    let devs = mem_devs(2, 96 * MB);
    let pool = Pool::create(name, spec(Layout::Mirror, &devs), opts()).unwrap();
    pool.create_volume("v", VOLSIZE, BLOCK, None).unwrap();
    let data = pattern(7, VOLSIZE as usize);
    let vol = Volume::open(&pool, "v").unwrap();
    vol.write(0, &data).unwrap();
    vol.flush().unwrap();
    drop(vol);
    pool.close().unwrap();
    drop(pool);
    let slow: Vec<(Arc<dyn BlockDevice>, String)> = (devs.iter())
        .map(|d| {
            let tap = Tap {
                on_read: Box::new(|| std::thread::sleep(READ_LATENCY)),
                ..Tap::new(d.clone())
            };
            (Arc::new(tap) as Arc<dyn BlockDevice>, d.name().to_string())
        })
        .collect();
    let pool = Pool::import(slow, None, opts()).unwrap();
    assert_eq!(pool.cache_stats().hits + pool.cache_stats().misses, 0);
    (devs, pool, data)
}

/// Reads the whole volume in order, `len` bytes at a time, checking every byte.
fn read_in_order(pool: &Arc<Pool>, data: &[u8], len: usize) {
    let vol = Volume::open(pool, "v").unwrap();
    for off in (0..VOLSIZE as usize).step_by(len) {
        assert!(
            read(&vol, off as u64, len) == data[off..off + len],
            "at {off}"
        );
    }
}

/// Four reads of each block in a row were one use: the scan's blocks are in T1, and T2 holds
/// at most the indirect blocks (read again by every read).
fn assert_scan_stays_in_t1(cache: &zeta::dmu::cache::CacheStats) {
    assert!(cache.lists.t2 <= VOLSIZE / 32, "{cache:?}");
}

fn prefetch_threads(pool: &str) -> usize {
    let want = format!("prefetch-{pool}");
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == want)
        .count()
}

#[test]
fn a_sequential_reader_in_short_reads_finds_its_blocks_read_ahead() {
    let (_devs, pool, data) = cold_pool("pfs");
    read_in_order(&pool, &data, 4096);
    let (pf, cache) = (pool.prefetch_stats(), pool.cache_stats());
    // The first blocks are read before the stream is seen; a reader that catches up with
    // the thread now and then reads a block itself. Most are read ahead all the same.
    assert!(pf.blocks >= BLOCKS / 2, "{pf:?}");
    assert!(cache.prefetch_hits >= BLOCKS / 2, "{cache:?}");
    assert!(cache.misses <= BLOCKS / 2, "{cache:?}");
    assert_scan_stays_in_t1(&cache);
    assert_eq!(
        prefetch_threads("pfs"),
        1,
        "one thread, started by the stream"
    );
    pool.close().unwrap();
    assert_eq!(prefetch_threads("pfs"), 0, "close joins the thread");
}

#[test]
fn long_reads_read_nothing_ahead_but_take_what_short_reads_left_ahead() {
    let (_devs, pool, data) = cold_pool("pfl");
    let vol = Volume::open(&pool, "v").unwrap();
    let half = VOLSIZE as usize / 2;
    for off in (0..half).step_by(4096) {
        assert!(
            read(&vol, off as u64, 4096) == data[off..off + 4096],
            "at {off}"
        );
    }
    // The prefetch thread done with what the short reads asked for (it may lag behind
    // them on a busy machine): the blocks after them are then read ahead, for certain.
    let mut last = u64::MAX;
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let now = pool.prefetch_stats().blocks;
        if now == last {
            break;
        }
        last = now;
    }
    let (asked, hits) = (
        pool.prefetch_stats().asked,
        pool.cache_stats().prefetch_hits,
    );
    assert!(asked > 0 && hits > 0);
    let long = 256 << 10;
    for off in (half..VOLSIZE as usize).step_by(long) {
        assert!(
            read(&vol, off as u64, long) == data[off..off + long],
            "at {off}"
        );
    }
    let (pf, cache) = (pool.prefetch_stats(), pool.cache_stats());
    assert_eq!(pf.asked, asked, "long reads ask for nothing: {pf:?}");
    assert!(
        cache.prefetch_hits > hits,
        "the stream's blocks read ahead are taken: {cache:?}"
    );
    drop(vol);
    pool.close().unwrap();
}

#[test]
fn random_reads_read_nothing_ahead() {
    let (_devs, pool, data) = cold_pool("pfr");
    let vol = Volume::open(&pool, "v").unwrap();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..1000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let block = (x >> 33) % BLOCKS;
        let off = (block * BLOCK as u64) as usize;
        assert!(read(&vol, off as u64, 4096) == data[off..off + 4096]);
    }
    let pf = pool.prefetch_stats();
    // Two reads of neighbouring blocks now and then look like a stream's start.
    assert!(pf.blocks <= 1000 / 10, "{pf:?}");
    drop(vol);
    pool.close().unwrap();
}

#[test]
fn prefetch_turned_off_reads_nothing_ahead() {
    let (_devs, pool, data) = cold_pool("pfo");
    assert!(pool.prefetch_enabled());
    pool.set_prefetch(false);
    read_in_order(&pool, &data, 4096);
    let (pf, cache) = (pool.prefetch_stats(), pool.cache_stats());
    assert_eq!((pf.asked, pf.blocks, cache.prefetch_hits), (0, 0, 0));
    assert!(
        cache.misses >= BLOCKS,
        "every block read by its reader: {cache:?}"
    );
    assert_scan_stays_in_t1(&cache);
    assert_eq!(prefetch_threads("pfo"), 0);
    pool.close().unwrap();
}
