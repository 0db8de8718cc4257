//! Scrub: every copy of every block is read and checked (raidz parity included), what the
//! redundancy allows is repaired, a second scrub finds nothing, and a paused scrub resumes
//! after export and import where it stopped.

mod common;

use std::sync::Arc;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use zeta::dsl::Pool;
use zeta::dsl::TopSpec;
use zeta::spa::scan_state::{ScanPhase, ScanState};
use zeta::vdev::mem::MemDevice;
use zeta::vdev::{RaidzConfig, RESERVE_BYTES};
use zeta::zvol::Volume;

const VOL: u64 = 4 * MB;

/// Imports the pool on `devs`, each read taking 2 ms more while `slow` is set: a scrub then
/// runs for seconds.
fn import_slowed(devs: &[Arc<MemDevice>], slow: &Arc<std::sync::atomic::AtomicBool>) -> Arc<Pool> {
    use std::sync::atomic::Ordering;
    use zeta::vdev::BlockDevice;
    let leaves = devs
        .iter()
        .map(|d| {
            let slow = slow.clone();
            let tap = Tap {
                on_read: Box::new(move || {
                    if slow.load(Ordering::SeqCst) {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                }),
                ..Tap::new(d.clone())
            };
            (Arc::new(tap) as Arc<dyn BlockDevice>, d.name().to_string())
        })
        .collect();
    Pool::import(leaves, None, opts()).unwrap()
}

fn scrub(pool: &Arc<Pool>) -> ScanState {
    pool.start_scrub().unwrap();
    pool.wait_scrub();
    let st = pool.scan_status();
    assert_eq!(st.state, ScanPhase::Finished, "{st:?}");
    st
}

/// Rots `count` random sectors in `[from, to)` of the data area of each leaf in `which`;
/// with `same`, every leaf gets the same sectors (several columns of one stripe at once).
fn rot(
    devs: &[Arc<MemDevice>],
    which: &[usize],
    count: usize,
    same: bool,
    range: (u64, u64),
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (from, to) = (range.0 / 4096, range.1 / 4096);
    let shared: Vec<u64> = (0..count).map(|_| rng.gen_range(from..to) * 4096).collect();
    for &i in which {
        for &at in &shared {
            let off = if same {
                at
            } else {
                rng.gen_range(from..to) * 4096
            };
            let mut junk = vec![0u8; 4096];
            rng.fill_bytes(&mut junk);
            devs[i].corrupt(RESERVE_BYTES + off, &junk);
        }
    }
}

#[test]
fn scrub_repairs_a_mirror_and_a_second_finds_nothing() {
    let (devs, data) = filled_pool(Layout::Mirror, 64 * MB, VOL, 16384, 1);
    // Different halves on each side: every block keeps one good copy.
    rot(&devs, &[0], 60, false, (0, 3 * MB / 2), 2);
    rot(&devs, &[1], 60, false, (3 * MB / 2, 3 * MB), 3);
    let pool = import(&devs);
    let first = scrub(&pool);
    assert!(first.repaired_bytes > 0, "{first:?}");
    assert_eq!(first.errors, 0, "{first:?}");
    assert!(first.examined_bytes >= VOL, "{first:?}");
    let second = scrub(&pool);
    assert_eq!(second.repaired_bytes, 0, "{second:?}");
    assert_eq!(second.errors, 0);
    assert!(read_volume(&pool) == data);
}

#[test]
fn scrub_repairs_raidz2_columns_and_parity() {
    for layout in [Layout::Raidz2, Layout::Raidz2Rdp] {
        let (devs, data) = filled_pool(layout, 64 * MB, VOL, 131072, 4);
        // The same sectors on two leaves: up to two columns of a stripe, parity columns
        // among them (which plain reads never look at).
        rot(&devs, &[0, 3], 60, true, (0, 3 * MB), 5);
        let pool = import(&devs);
        let first = scrub(&pool);
        assert!(first.repaired_bytes > 0, "{layout:?}: {first:?}");
        assert_eq!(first.errors, 0, "{layout:?}: {first:?}");
        let second = scrub(&pool);
        assert_eq!(
            second.repaired_bytes, 0,
            "{layout:?}: parity left bad: {second:?}"
        );
        assert!(read_volume(&pool) == data);
        drop(pool);
        let pool = import(&devs);
        assert_eq!(
            scrub(&pool).repaired_bytes,
            0,
            "{layout:?}: repairs did not stick"
        );
    }
}

/// A scrub of a degraded raidz finds nothing wrong with blocks that verify. Blocks whose
/// parity lay on the missing devices alone were each reported unrecoverable, as no
/// combination of data columns was left to try.
#[test]
fn a_scrub_of_a_degraded_raidz_finds_no_damage_in_good_blocks() {
    for (layout, gone) in [(Layout::Raidz1, vec![1]), (Layout::Raidz2, vec![1, 4])] {
        let (devs, data) = filled_pool(layout, 64 * MB, VOL, 16384, 9);
        let present: Vec<Arc<MemDevice>> = (devs.iter().enumerate())
            .filter(|(i, _)| !gone.contains(i))
            .map(|(_, d)| d.clone())
            .collect();
        let pool = Pool::import(as_leaves(&present), None, opts()).unwrap();
        let st = scrub(&pool);
        assert_eq!(st.errors, 0, "{layout:?}: first: {:?}", st.damaged.first());
        assert!(
            st.examined_bytes >= VOL,
            "{layout:?}: {}",
            st.examined_bytes
        );
        assert!(read_volume(&pool) == data, "{layout:?}");
    }
}

#[test]
fn scrub_beyond_redundancy_reports_the_lost_range() {
    let (devs, _) = filled_pool(Layout::Raidz1, 64 * MB, VOL, 16384, 7);
    rot(&devs, &[0, 1, 2], 30, true, (0, 3 * MB), 8);
    let pool = match Pool::import(as_leaves(&devs), None, opts()) {
        Ok(p) => p,
        Err(e) => panic!("metadata is kept twice and should survive: {e}"),
    };
    let st = scrub(&pool);
    assert!(st.errors > 0, "{st:?}");
    assert!(!st.damaged.is_empty());
    for d in &st.damaged {
        assert!(d.object == "tank/v" || d.object == "tank", "{d:?}");
        if d.object == "tank/v" {
            assert!(d.start < d.end && d.end <= VOL, "{d:?}");
            assert_eq!(d.start % 16384, 0);
        }
    }
    // The findings are in the config: they outlive the process.
    pool.close().unwrap();
    drop(pool);
    let cfg = zeta::dsl::probe(devs[0].clone()).unwrap();
    assert_eq!(cfg.scan.unwrap().errors, st.errors);
}

#[test]
fn a_paused_scrub_resumes_after_export_and_import() {
    // 4K blocks: 1024 data blocks, several chunks of work.
    let (devs, data) = filled_pool(Layout::Raidz1, 64 * MB, VOL, 4096, 9);
    let pool = import(&devs);
    // The MOS, then two chunks of the volume, then stop there.
    for _ in 0..3 {
        assert!(!pool.scrub_chunk());
    }
    let mid = pool.scan_status();
    assert_eq!(mid.state, ScanPhase::Scanning);
    let mark = mid.bookmark.clone().expect("a bookmark");
    assert_eq!(mark.volume.as_deref(), Some("v"));
    assert!(mark.blkid > 0 && mark.blkid < 1024, "{mark:?}");
    pool.export().unwrap();
    drop(pool);

    let saved = zeta::dsl::probe(devs[1].clone()).unwrap().scan.unwrap();
    assert_eq!(saved.bookmark, Some(mark.clone()));
    assert_eq!(saved.examined_bytes, mid.examined_bytes);

    // Import resumes it on its own.
    let pool = import(&devs);
    pool.wait_scrub();
    let end = pool.scan_status();
    assert_eq!(end.state, ScanPhase::Finished, "{end:?}");
    assert!(end.examined_bytes > mid.examined_bytes);
    // Resumed, not restarted: what was examined adds up to about the pool once.
    assert!(
        end.examined_bytes <= end.to_examine + end.to_examine / 4,
        "examined {} of {}",
        end.examined_bytes,
        end.to_examine
    );
    assert!(end.examined_bytes >= end.to_examine / 2);
    assert!(read_volume(&pool) == data);
}

#[test]
fn scrub_runs_beside_writes_without_harm() {
    let (devs, mut data) = filled_pool(Layout::Mirror, 64 * MB, VOL, 4096, 10);
    let pool = import(&devs);
    pool.start_scrub().unwrap();
    let vol = Volume::open(&pool, "v").unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    for i in 0..300 {
        let len = rng.gen_range(1..40_000usize);
        let off = rng.gen_range(0..VOL as usize - len);
        rng.fill_bytes(&mut data[off..off + len]);
        vol.write(off as u64, &data[off..off + len]).unwrap();
        if i % 25 == 0 {
            vol.flush().unwrap(); // txgs commit and free blocks while the scrub reads
        }
    }
    vol.flush().unwrap();
    pool.wait_scrub();
    let st = pool.scan_status();
    assert_eq!(st.state, ScanPhase::Finished);
    assert_eq!(st.errors, 0, "{st:?}");
    assert_eq!(st.repaired_bytes, 0, "a scrub 'repaired' good data: {st:?}");
    assert!(read_volume(&pool) == data);
    pool.verify().unwrap();
    // A raidz pool too (its scrub rewrites parity it finds wrong: none must be).
    let devs = mem_devs(4, 64 * MB);
    let pool = Pool::create(
        "r",
        vec![TopSpec::raidz(
            RaidzConfig::new(1, 4, false).unwrap(),
            as_leaves(&devs),
        )],
        opts(),
    )
    .unwrap();
    pool.create_volume("v", VOL, 4096, None).unwrap();
    let vol = Volume::open(&pool, "v").unwrap();
    pool.start_scrub().unwrap();
    for i in 0..300u64 {
        vol.write((i * 12_345) % (VOL - 8192), &[i as u8; 8192])
            .unwrap();
        if i % 50 == 0 {
            vol.flush().unwrap();
        }
    }
    vol.flush().unwrap();
    pool.wait_scrub();
    assert_eq!(pool.scan_status().repaired_bytes, 0);
    assert_eq!(scrub(&pool).repaired_bytes, 0);
}

#[test]
fn error_counters_outlive_the_process_until_cleared() {
    let (devs, data) = filled_pool(Layout::Mirror, 64 * MB, VOL, 16384, 12);
    rot(&devs, &[1], 20, false, (0, 3 * MB), 13);
    let pool = import(&devs);
    let found = scrub(&pool);
    assert!(found.repaired_bytes > 0);
    let cksum = |p: &Pool| -> Vec<u64> {
        p.vdev_status()[0]
            .leaves
            .iter()
            .map(|l| l.cksum_errors)
            .collect()
    };
    let before = cksum(&pool);
    assert!(before[1] > 0 && before[0] == 0, "{before:?}");
    pool.close().unwrap();
    drop(pool);
    // A new process (an import) still shows them.
    let pool = import(&devs);
    assert_eq!(cksum(&pool), before);
    assert!(read_volume(&pool) == data);
    pool.clear_errors().unwrap();
    assert_eq!(cksum(&pool), vec![0, 0]);
    pool.close().unwrap();
    drop(pool);
    let pool = import(&devs);
    assert_eq!(cksum(&pool), vec![0, 0], "clear did not reach the labels");
}

/// A client that sees a scrub end (its state no longer `scanning`) may start the next at
/// once: the scanner thread, still saving the end of the last, does not refuse it.
/// (`zeta pool scrub --wait` twice against a served pool failed that way now and then.)
#[test]
fn a_scrub_starts_as_soon_as_the_last_is_seen_to_end() {
    let (devs, _) = filled_pool(Layout::Mirror, 64 * MB, VOL, 4096, 12);
    let pool = import(&devs);
    for round in 0..50 {
        pool.start_scrub()
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        while pool.scan_status().state == ScanPhase::Scanning {
            std::hint::spin_loop();
        }
    }
    pool.wait_scrub();
    assert_eq!(pool.scan_status().state, ScanPhase::Finished);
}

/// A resilver owed while a scrub is under way goes first, as in ZFS: the scrub stops between
/// blocks (or, paused, stays where it is), the resilver restores the copies a device
/// missed, and then the scrub goes on from where it stopped rather than from the start
/// (ZFS would have canceled it).
#[test]
fn a_resilver_owed_during_a_scrub_goes_first_and_the_scrub_goes_on_after_it() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    use zeta::spa::scan_state::ScanFunc;
    use zeta::vdev::mem::Faults;

    for running in [false, true] {
        // 4K blocks: 1024 data blocks, several chunks of work.
        let (devs, data) = filled_pool(Layout::Mirror, 64 * MB, VOL, 4096, 11);
        let slow = Arc::new(AtomicBool::new(false));
        let pool = import_slowed(&devs, &slow);
        let vol = Volume::open(&pool, "v").unwrap();
        if running {
            // Slow reads keep it going for seconds.
            slow.store(true, Ordering::SeqCst);
            pool.start_scrub().unwrap();
            // Past the MOS (scrubbed whole, in one go) and into the volume.
            let deadline = Instant::now() + Duration::from_secs(20);
            while pool
                .scan_status()
                .bookmark
                .is_none_or(|b| b.volume.is_none())
            {
                assert!(Instant::now() < deadline, "{:?}", pool.scan_status());
                std::thread::sleep(Duration::from_millis(5));
            }
        } else {
            // The MOS, then two chunks of the volume; paused there.
            for _ in 0..3 {
                assert!(!pool.scrub_chunk());
            }
        }
        let scrub = pool.scan_status();
        assert_eq!(
            (scrub.func, scrub.state),
            (ScanFunc::Scrub, ScanPhase::Scanning)
        );

        // One side's file system is full for a txg; then it takes whole txgs again.
        let mut want = data.clone();
        devs[1].set_faults(Faults {
            full: true,
            ..Faults::default()
        });
        let missed = pattern(12, 64 << 10);
        vol.write(0, &missed).unwrap();
        want[..missed.len()].copy_from_slice(&missed);
        pool.sync_now().unwrap();
        devs[1].set_faults(Faults::default());
        // The first whole txg asks a running scrub to stop; a later one starts the resilver.
        let deadline = Instant::now() + Duration::from_secs(20);
        let resilver = loop {
            vol.write(MB, &[7u8; 4096]).unwrap();
            want[MB as usize..][..4096].fill(7);
            pool.sync_now().unwrap();
            let st = pool.scan_status();
            if st.func == ScanFunc::Resilver {
                break st;
            }
            assert!(
                Instant::now() < deadline,
                "running={running}: no resilver: {st:?}"
            );
        };
        let waiting = resilver.interrupted.as_deref().expect("the scrub waits");
        assert_eq!(waiting.func, ScanFunc::Scrub);
        assert_eq!(waiting.start_secs, scrub.start_secs, "the same scrub");
        assert!(
            waiting
                .bookmark
                .as_ref()
                .is_some_and(|b| b.volume.is_some()),
            "paused within the volume: {waiting:?}"
        );
        slow.store(false, Ordering::SeqCst);
        pool.wait_scrub();

        let end = pool.scan_status();
        assert_eq!(
            (end.func, end.state),
            (ScanFunc::Scrub, ScanPhase::Finished),
            "running={running}: {end:?}"
        );
        assert_eq!(end.start_secs, scrub.start_secs);
        assert!(end.examined_bytes >= VOL, "{end:?}");
        assert_eq!(end.errors, 0, "{end:?}");
        assert!(end.interrupted.is_none());
        let leaf = &pool.vdev_status()[0].leaves[1];
        assert!(leaf.repaired_bytes > 0, "running={running}: {leaf:?}");
        drop(vol);
        pool.close().unwrap();
        drop(pool);
        // The side that missed a txg holds it now.
        let pool = import(&devs[1..]);
        assert!(read_volume(&pool) == want, "running={running}");
        pool.close().unwrap();
    }
}

/// A scrub that runs while a client overwrites its volume again and again lets the space
/// freed come back: each chunk holds only what was freed after the tree it reads. (Holding
/// every free for as long as a chunk ran, a scrub under steady writes let none come back,
/// and a pool of 56 MiB refused writes as full after about a dozen overwrites of 4 MiB.)
#[test]
fn a_scrub_beside_steady_overwrites_lets_freed_space_come_back() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let (devs, _) = filled_pool(Layout::Mirror, 64 * MB, VOL, 4096, 12);
    // Slow reads keep the scrub going throughout.
    let slow = Arc::new(AtomicBool::new(true));
    let pool = import_slowed(&devs, &slow);
    let vol = Volume::open(&pool, "v").unwrap();
    pool.start_scrub().unwrap();
    let size = pool.space().size;
    let mut written = 0;
    let mut pass = 0u64;
    while written < 2 * size {
        pass += 1;
        let data = pattern(100 + pass, VOL as usize);
        vol.write(0, &data)
            .unwrap_or_else(|e| panic!("overwrite {pass} of the volume: {e}"));
        pool.sync_now().unwrap();
        written += VOL;
    }
    // Or the test showed nothing.
    let st = pool.scan_status();
    assert_eq!(st.state, ScanPhase::Scanning, "{st:?}");
    slow.store(false, Ordering::SeqCst);
    pool.wait_scrub();
    let st = pool.scan_status();
    assert_eq!((st.state, st.errors), (ScanPhase::Finished, 0), "{st:?}");
    assert!(read_volume(&pool) == pattern(100 + pass, VOL as usize));
    pool.verify().unwrap();
}

/// Like `filled_pool`, with volume `v` stored as `compression` asks and filled with data
/// that compresses to about half (each 4K holds 2K of random bytes and 2K of a ramp), so
/// its blocks store in three quarters of their size or less.
fn filled_compressed(
    layout: Layout,
    bs: u32,
    compression: zeta::zio::compress::Compression,
    seed: u64,
) -> (Vec<Arc<MemDevice>>, Vec<u8>) {
    let devs = mem_devs(devs_for(layout), 64 * MB);
    let pool = Pool::create("tank", spec(layout, &devs), opts()).unwrap();
    pool.create_volume("v", VOL, bs, None).unwrap();
    pool.set_compression("v", compression).unwrap();
    let mut data = pattern(seed, VOL as usize);
    for (i, b) in data.iter_mut().enumerate() {
        if i % 4096 >= 2048 {
            *b = i as u8;
        }
    }
    let vol = Volume::open(&pool, "v").unwrap();
    vol.write(0, &data).unwrap();
    vol.flush().unwrap();
    drop(vol);
    // The dnode's sizes are those of the last txg: the flush went to the intent log.
    pool.sync_now().unwrap();
    let sizes = pool.dataset("v").unwrap().object.sizes();
    assert!(sizes.physical * 10 < sizes.logical * 8, "{sizes:?}");
    pool.close().unwrap();
    (devs, data)
}

/// Compressed blocks rotted on disk are found by a scrub (their checksum covers the stored,
/// compressed bytes) and rebuilt from the other mirror side or from raidz parity, and read
/// back whole; a second scrub finds nothing.
#[test]
fn scrub_repairs_compressed_blocks_from_redundancy() {
    use zeta::zio::compress::Compression;
    for (layout, bs, c) in [
        (Layout::Mirror, 16384, Compression::Lz4),
        (Layout::Raidz2, 131072, Compression::Zstd(3)),
    ] {
        let (devs, data) = filled_compressed(layout, bs, c, 9);
        // Within the first 2 MiB of stored bytes: about 2.7 MiB of the volume's.
        match layout {
            Layout::Mirror => {
                rot(&devs, &[0], 40, false, (0, MB), 10);
                rot(&devs, &[1], 40, false, (MB, 2 * MB), 11);
            }
            _ => rot(&devs, &[1, 2], 40, true, (0, MB), 12),
        }
        let pool = import(&devs);
        let first = scrub(&pool);
        assert!(first.repaired_bytes > 0, "{layout:?}: {first:?}");
        assert_eq!(first.errors, 0, "{layout:?}: {first:?}");
        let second = scrub(&pool);
        assert_eq!(second.repaired_bytes, 0, "{layout:?}: {second:?}");
        assert!(read_volume(&pool) == data, "{layout:?}");
        pool.verify().unwrap();
    }
}
