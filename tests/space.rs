//! A pool as it fills: random overwrites of small blocks on a nearly full pool must never
//! suspend it. A write may be refused for space (ENOSPC); the pool stays writable, and frees
//! bring the room back.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{mem_devs, opts, pattern, MB};
use zeta::dsl::{Pool, PoolError, TopSpec};
use zeta::vdev::BlockDevice;
use zeta::zvol::{VolError, Volume};

/// A stripe of one 256M device with an 8K-block volume filled to `fill` of the pool's
/// usable space by one sequential write, then `writers` threads overwriting random 8K blocks
/// of what was filled for `secs`. Returns (writes done, writes refused for space).
fn overwrite_at(fill: f64, writers: usize, secs: u64) -> (u64, u64) {
    let devs = mem_devs(1, 256 * MB);
    let leaf = (devs[0].clone() as Arc<dyn BlockDevice>, "d0".to_string());
    let pool = Pool::create("tank", vec![TopSpec::stripe(leaf)], opts()).unwrap();
    pool.create_volume("v", 256 * MB, 8192, None).unwrap();
    let vol = Arc::new(Volume::open(&pool, "v").unwrap());
    // Sequentially, 1M at a time, until the pool is `fill` allocated (metadata included)
    // or refuses more.
    let mut filled = 0;
    let chunk = pattern(1, MB as usize);
    while (pool.space().alloc as f64) < pool.space().size as f64 * fill {
        match vol.write(filled, &chunk) {
            Ok(()) => filled += MB,
            Err(VolError::Pool {
                source: PoolError::NoSpace(_),
                ..
            }) => break,
            Err(e) => panic!("the fill failed at {filled}: {e}"),
        }
    }
    vol.flush().unwrap();
    pool.sync_frees().unwrap();
    let s = pool.space();
    println!(
        "filled {} MiB: {:.1} % of the pool allocated",
        filled / MB,
        s.alloc as f64 * 100.0 / s.size as f64
    );
    assert!(
        s.alloc as f64 >= s.size as f64 * (fill - 0.03),
        "the fill stopped at {:?}",
        s
    );
    let (done, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let until = Instant::now() + Duration::from_secs(secs);
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let (vol, done, refused) = (vol.clone(), done.clone(), refused.clone());
            let pool = pool.clone();
            std::thread::spawn(move || {
                use rand::{Rng, SeedableRng};
                let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
                let block = pattern(100 + w as u64, 8192);
                while Instant::now() < until {
                    let at = rng.gen_range(0..filled / 8192) * 8192;
                    match vol.write(at, &block) {
                        Ok(()) => done.fetch_add(1, Ordering::Relaxed),
                        Err(VolError::Pool {
                            source: PoolError::NoSpace(_),
                            ..
                        }) => refused.fetch_add(1, Ordering::Relaxed),
                        Err(e) => panic!("an overwrite at {at} failed: {e}; {:?}", pool.space()),
                    };
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    vol.flush().unwrap();
    assert!(
        pool.suspension().is_none(),
        "random overwrites at {fill} full suspended the pool: {:?}",
        pool.suspension()
    );
    // Frees bring the room back: with half the data trimmed, overwrites go through again.
    vol.trim(0, filled / 2).unwrap();
    vol.flush().unwrap();
    pool.sync_frees().unwrap();
    for i in 0..64 {
        let at = filled / 2 + i * 8192 * 97 % (filled / 2);
        vol.write(at / 8192 * 8192, &pattern(7, 8192))
            .unwrap_or_else(|e| panic!("an overwrite after the trim failed: {e}"));
    }
    drop(vol);
    pool.close().unwrap();
    (
        done.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    )
}

#[test]
fn random_overwrites_at_80_percent_full_are_never_refused_nor_suspend_the_pool() {
    let (done, refused) = overwrite_at(0.80, 4, 4);
    println!("80 %: {done} overwrites done, {refused} refused for space");
    assert!(done > 1000, "only {done} overwrites went through");
    assert_eq!(refused, 0, "overwrites at 80 % full were refused for space");
}

/// Nearly full, overwrites may be refused for space (ENOSPC: the pool keeps room for the
/// txg's metadata), but never suspend the pool or fail otherwise.
#[test]
fn random_overwrites_at_95_percent_full_are_refused_cleanly_never_suspend() {
    let (done, refused) = overwrite_at(0.95, 4, 3);
    println!("95 %: {done} overwrites done, {refused} refused for space");
    assert!(
        done + refused > 1000,
        "the writers hardly ran: {done} + {refused}"
    );
}

/// The fragmentation metric is kept as ranges come and go, equals a recount from the free
/// trees (`Pool::verify` compares them), grows under random overwrites of a sequential fill,
/// and is the same after an import, which rebuilds the trees from the space maps.
#[test]
fn fragmentation_follows_random_overwrites_and_survives_import() {
    use rand::{Rng, SeedableRng};
    let devs = mem_devs(1, 128 * MB);
    let pool = Pool::create(
        "tank",
        vec![TopSpec::stripe(common::as_leaves(&devs).remove(0))],
        opts(),
    )
    .unwrap();
    pool.create_volume("v", 64 * MB, 8192, None).unwrap();
    let vol = Volume::open(&pool, "v").unwrap();
    for i in 0..64 {
        vol.write(i * MB, &pattern(i, MB as usize)).unwrap();
    }
    vol.flush().unwrap();
    pool.sync_frees().unwrap();
    pool.verify().unwrap();
    let compact = pool.metaslab_map();
    assert_eq!(compact.fragmentation, pool.fragmentation());
    assert_eq!(compact.free, pool.space().free);
    let mut rng = rand::rngs::StdRng::seed_from_u64(57);
    for round in 0..8 {
        for _ in 0..800 {
            let at = rng.gen_range(0..64 * MB / 8192) * 8192;
            vol.write(at, &pattern(round, 8192)).unwrap();
        }
        vol.flush().unwrap();
        pool.sync_frees().unwrap();
    }
    pool.verify().unwrap();
    let scattered = pool.metaslab_map();
    println!(
        "fragmentation {} % after the fill, {} % after the overwrites",
        compact.fragmentation, scattered.fragmentation
    );
    assert!(
        scattered.fragmentation >= compact.fragmentation + 10,
        "random 8K overwrites left the free space as it was: {} % then {} %",
        compact.fragmentation,
        scattered.fragmentation
    );
    let segments = |m: &zeta::dsl::PoolMap| -> u64 {
        m.vdevs
            .iter()
            .flat_map(|v| &v.metaslabs)
            .map(|ms| ms.segments)
            .sum()
    };
    assert!(segments(&scattered) > segments(&compact));
    drop(vol);
    pool.close().unwrap();
    let pool = common::import(&devs);
    pool.verify().unwrap();
    let imported = pool.metaslab_map();
    assert!(
        imported.fragmentation.abs_diff(scattered.fragmentation) <= 3,
        "fragmentation {} % before the export, {} % after the import",
        scattered.fragmentation,
        imported.fragmentation
    );
    pool.close().unwrap();
}

/// What a volume's blocks take on the devices (`used` in `vol list`) follows its writes, its
/// trims and its overwrites exactly (a recount of the tree, `Pool::verify`), and an import
/// reads it back as it was.
#[test]
fn a_volumes_used_bytes_follow_its_blocks_and_survive_import() {
    let devs = mem_devs(2, 128 * MB);
    let leaves: Vec<(Arc<dyn BlockDevice>, String)> = devs
        .iter()
        .enumerate()
        .map(|(i, d)| (d.clone() as Arc<dyn BlockDevice>, format!("d{i}")))
        .collect();
    let pool = Pool::create("tank", vec![TopSpec::mirror(leaves.clone())], opts()).unwrap();
    pool.create_volume("v", 64 * MB, 16384, None).unwrap();
    let used = |pool: &Pool| pool.dataset("v").unwrap().object.used_bytes();
    assert_eq!(used(&pool), 0, "a new volume takes nothing");
    let vol = Volume::open(&pool, "v").unwrap();
    // 8 MiB streamed, then short writes (patches) and a block of zeros in the middle.
    vol.write(0, &pattern(2, 8 * MB as usize)).unwrap();
    for i in 0..64u64 {
        vol.write(16 * MB + i * 40_000, &pattern(i, 4096)).unwrap();
    }
    vol.write(MB, &vec![0u8; 16384]).unwrap();
    pool.sync_now().unwrap();
    let written = used(&pool);
    // 8 MiB less the zeroed block, 64 blocks of 16K touched, their indirect blocks.
    assert!(
        (8 * MB - 16384 + 64 * 16384..10 * MB).contains(&written),
        "{written}"
    );
    pool.verify().unwrap();
    // A trim of half the stream gives its blocks back.
    vol.trim(0, 4 * MB).unwrap();
    pool.sync_now().unwrap();
    let trimmed = used(&pool);
    assert!(
        trimmed <= written - 4 * MB + 16384,
        "{written} -> {trimmed}"
    );
    pool.verify().unwrap();
    // Overwrites of what is there take what they replace.
    vol.write(4 * MB, &pattern(9, 2 * MB as usize)).unwrap();
    pool.sync_now().unwrap();
    assert_eq!(
        used(&pool),
        trimmed,
        "an overwrite in place of whole blocks"
    );
    pool.verify().unwrap();
    drop(vol);
    pool.export().unwrap();
    drop(pool);
    let pool = Pool::import(leaves, Some("tank"), opts()).unwrap();
    assert_eq!(used(&pool), trimmed, "read back at import");
    pool.verify().unwrap();
}

/// On every layout, a reserved volume is written whole after a sparse one has filled the pool
/// until its writes were refused: the reservation counts each layout's allocation (a raidz's
/// parity), and what it holds no other volume's writes take. Its blocks then fit in what it
/// reserved, and the pool stays writable (the sparse volume's writes are refused, never a
/// suspension).
#[test]
fn a_reserved_volume_is_written_whole_on_every_layout_however_full_the_pool() {
    use common::{devs_for, spec, EVERY_LAYOUT};
    for layout in EVERY_LAYOUT {
        let devs = mem_devs(devs_for(layout), 96 * MB);
        let pool = Pool::create("tank", spec(layout, &devs), opts()).unwrap();
        let size = 24 * MB;
        let r = pool
            .create_volume_with("r", size, 16384, None, true)
            .unwrap();
        pool.create_volume("thin", 1 << 40, 16384, None).unwrap();
        let thin = Volume::open(&pool, "thin").unwrap();
        let mut at = 0;
        loop {
            match thin.write(at, &pattern(at, MB as usize)) {
                Ok(()) => at += MB,
                Err(VolError::Pool {
                    source: PoolError::NoSpace(_),
                    ..
                }) => break,
                Err(e) => panic!("{layout:?}: the sparse fill failed at {at}: {e}"),
            }
        }
        thin.flush().unwrap();
        let vol = Volume::open(&pool, "r").unwrap();
        let data = pattern(7, size as usize);
        vol.write(0, &data)
            .unwrap_or_else(|e| panic!("{layout:?}: after {at} sparse bytes: {e}"));
        vol.flush().unwrap();
        pool.sync_now().unwrap();
        assert!(pool.suspension().is_none(), "{layout:?}");
        let used = r.object.used_bytes();
        // Whole blocks fit what was reserved; gang blocks (forced: ZETA_TEST_FORCE_GANGING)
        // take a header each beyond it, from the pool's reserve.
        let bound = match opts().force_ganging {
            None => r.refreservation(),
            Some(_) => r.refreservation() * 3 / 2,
        };
        assert!(
            used >= size && used <= bound,
            "{layout:?}: used {used} of a {} reservation",
            r.refreservation()
        );
        assert!(common::read(&vol, 0, size as usize) == data, "{layout:?}");
        pool.verify().unwrap();
    }
}
