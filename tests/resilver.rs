//! Offline, online and resilver: a leaf taken offline misses whole txgs, which are recorded;
//! brought back, it gets exactly the blocks born in those txgs, and then serves every block
//! on its own. A replacement and its resilver survive a power cut at any moment.

mod common;

use std::sync::Arc;

use common::*;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use zeta::dsl::Pool;
use zeta::spa::scan_state::{ScanFunc, ScanPhase};
use zeta::vdev::mem::MemDevice;
use zeta::vdev::BlockDevice;
use zeta::zvol::Volume;

const VOL: u64 = 16 * MB;

fn repaired_on(pool: &Pool, leaf: usize) -> u64 {
    pool.vdev_status()[0].leaves[leaf].repaired_bytes
}

/// Waits for the scan, which must be a resilver that finished, and checks that it rewrote at
/// least `min_repaired` bytes on `mem1`, which alone then serves `expect` (with `mem0`
/// offline).
fn mem1_resilvered(pool: &Arc<Pool>, expect: &[u8], min_repaired: u64, what: &str) {
    pool.wait_scrub();
    let scan = pool.scan_status();
    assert_eq!(
        (scan.func, scan.state),
        (ScanFunc::Resilver, ScanPhase::Finished),
        "{what}: {scan:?}"
    );
    assert!(repaired_on(pool, 1) >= min_repaired, "{what}");
    pool.set_offline("mem0", true).unwrap();
    assert!(
        read_volume(pool) == expect,
        "{what}: mem1 lacks what it missed"
    );
}

/// Takes `leaves` offline, writes 1 MiB of new data, brings them back, waits for the
/// resilver; checks the amount and that the resilvered leaves alone serve the data.
fn offline_write_online(layout: Layout, leaves: &[usize], others: &[usize]) {
    let ctx = format!("{layout:?}");
    let (devs, mut data) = filled_pool(layout, 96 * MB, VOL, 16384, 1);
    let pool = import(&devs);
    for &l in leaves {
        pool.set_offline(devs[l].name(), true).expect(&ctx);
    }
    let st = &pool.vdev_status()[0];
    assert_eq!(st.state, "DEGRADED", "{ctx}");
    for &l in leaves {
        assert_eq!(st.leaves[l].state, "OFFLINE", "{ctx}");
    }
    // 1 MiB of new blocks while they are away.
    let vol = Volume::open(&pool, "v").unwrap();
    let new_bytes = MB as usize;
    StdRng::seed_from_u64(2).fill_bytes(&mut data[4 * MB as usize..4 * MB as usize + new_bytes]);
    vol.write(4 * MB, &data[4 * MB as usize..4 * MB as usize + new_bytes])
        .unwrap();
    vol.flush().unwrap();
    // The flush made the data durable in the intent log; its txg must also commit while
    // they are away, or a txg synced after they return writes it to them directly and the
    // resilver finds less than their share to give them (a flake under a loaded machine).
    pool.sync_now().unwrap();
    assert!(read_volume(&pool) == data, "{ctx}: degraded read");
    let before: Vec<u64> = leaves.iter().map(|&l| repaired_on(&pool, l)).collect();

    for &l in leaves {
        pool.set_offline(devs[l].name(), false).expect(&ctx);
    }
    pool.wait_scrub();
    let scan = pool.scan_status();
    assert_eq!(scan.func, ScanFunc::Resilver, "{ctx}: {scan:?}");
    assert_eq!(scan.state, ScanPhase::Finished, "{ctx}: {scan:?}");
    assert_eq!(scan.errors, 0, "{ctx}: {scan:?}");
    // Only what was born while they were away: the new megabyte and the metadata above it,
    // not the 16 MiB volume.
    assert!(
        scan.examined_bytes < scan.to_examine / 4,
        "{ctx}: resilver examined {} of {}",
        scan.examined_bytes,
        scan.to_examine
    );
    let share = match layout {
        Layout::Mirror => new_bytes as u64,
        // Each of 6 raidz2 children holds a sixth of the data plus parity: a quarter of it.
        _ => new_bytes as u64 / 4,
    };
    for (i, &l) in leaves.iter().enumerate() {
        let got = repaired_on(&pool, l) - before[i];
        eprintln!(
            "{ctx}: resilver examined {} of {} allocated; leaf {l} got {got} bytes (share {share})",
            scan.examined_bytes, scan.to_examine
        );
        assert!(
            got >= share && got <= share * 2 + 2 * MB,
            "{ctx}: leaf {l} got {got} bytes, its share of the new data is {share}"
        );
    }
    let st = &pool.vdev_status()[0];
    assert_eq!(st.state, "ONLINE", "{ctx}");
    drop(vol);

    // Now the resilvered leaves must carry the data without the others.
    for &o in others {
        pool.set_offline(devs[o].name(), true).expect(&ctx);
    }
    assert!(
        read_volume(&pool) == data,
        "{ctx}: resilvered leaves miss data"
    );
    pool.verify().expect(&ctx); // every block from the media, past the cache
    for &o in others {
        pool.set_offline(devs[o].name(), false).expect(&ctx);
    }
    pool.wait_scrub();
    pool.close().unwrap();
}

#[test]
fn mirror_leaf_offline_then_online_gets_exactly_what_it_missed() {
    offline_write_online(Layout::Mirror, &[1], &[0]);
}

#[test]
fn raidz2_two_leaves_offline_then_online_get_what_they_missed() {
    offline_write_online(Layout::Raidz2, &[1, 4], &[0, 2]);
}

#[test]
fn offline_is_refused_beyond_redundancy_and_remembered_across_import() {
    let (devs, data) = filled_pool(Layout::Raidz1, 96 * MB, VOL, 16384, 1);
    let pool = import(&devs);
    pool.set_offline("mem0", true).unwrap();
    let err = pool.set_offline("mem1", true).unwrap_err().to_string();
    assert!(err.contains("more than it can lose"), "{err}");
    let err = pool.set_offline("nosuch", true).unwrap_err().to_string();
    assert!(err.contains("no device nosuch"), "{err}");
    let vol = Volume::open(&pool, "v").unwrap();
    vol.write(0, &[7u8; 65536]).unwrap();
    vol.flush().unwrap();
    drop(vol);
    pool.close().unwrap();
    drop(pool);
    // Still offline after import, still owed its txgs; online resilvers it.
    let pool = import(&devs);
    let st = &pool.vdev_status()[0];
    assert_eq!(st.leaves[0].state, "OFFLINE");
    let mut expect = data.clone();
    expect[..65536].fill(7);
    assert!(read_volume(&pool) == expect);
    pool.set_offline("mem0", false).unwrap();
    pool.wait_scrub();
    assert_eq!(pool.scan_status().func, ScanFunc::Resilver);
    assert_eq!(pool.scan_status().state, ScanPhase::Finished);
    assert!(repaired_on(&pool, 0) >= 65536 / 2);
    pool.set_offline("mem2", true).unwrap();
    assert!(read_volume(&pool) == expect);
}

/// The case: a raidz2 loses two devices; both are replaced by new ones, which are
/// rebuilt in full; the pool is ONLINE and the new devices alone (with two old ones gone)
/// serve every byte.
#[test]
fn raidz2_with_two_devices_gone_gets_both_replaced_and_rebuilt() {
    let (devs, data) = filled_pool(Layout::Raidz2, 96 * MB, VOL, 16384, 1);
    // Two devices are gone: the pool imports degraded, and both are replaced while it runs
    // (and serves reads: the data is checked between the replacements).
    let present: Vec<Arc<MemDevice>> = [0, 2, 3, 5].iter().map(|&i| devs[i].clone()).collect();
    let pool = Pool::import(as_leaves(&present), None, opts()).unwrap();
    let st = &pool.vdev_status()[0];
    assert_eq!(st.state, "DEGRADED");
    assert_eq!(
        (st.leaves[1].state, st.leaves[4].state),
        ("UNAVAIL", "UNAVAIL")
    );
    for (gone, name) in [(1usize, "new1"), (4, "new4")] {
        let fresh = Arc::new(MemDevice::new(name, 96 * MB));
        pool.replace(
            devs[gone].name(),
            fresh as Arc<dyn BlockDevice>,
            name.to_string(),
            false,
        )
        .unwrap();
        assert!(read_volume(&pool) == data);
    }
    pool.wait_scrub();
    let scan = pool.scan_status();
    assert_eq!(scan.func, ScanFunc::Resilver, "{scan:?}");
    assert_eq!(scan.state, ScanPhase::Finished, "{scan:?}");
    assert_eq!(scan.errors, 0, "{scan:?}");
    let st = &pool.vdev_status()[0];
    assert_eq!(st.state, "ONLINE", "{st:?}");
    let paths: Vec<&str> = st.leaves.iter().map(|l| l.path.as_str()).collect();
    assert_eq!(paths, ["mem0", "new1", "mem2", "mem3", "new4", "mem5"]);
    // Rebuilt in full: each new leaf got about a sixth of the raw space in use.
    for i in [1, 4] {
        assert!(
            st.leaves[i].repaired_bytes >= VOL / 4,
            "leaf {i}: {}",
            st.leaves[i].repaired_bytes
        );
    }
    assert!(read_volume(&pool) == data);
    // Without two of the old devices, the new ones must carry their columns.
    pool.set_offline("mem0", true).unwrap();
    pool.set_offline("mem3", true).unwrap();
    assert!(read_volume(&pool) == data, "the new devices lack data");
    pool.verify().unwrap();

    // Refusals: unknown device, too small, already a member.
    let small = Arc::new(MemDevice::new("small", 8 * MB)) as Arc<dyn BlockDevice>;
    let err = pool
        .replace("mem5", small, "small".into(), false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("too small"), "{err}");
    let other = Arc::new(MemDevice::new("x", 96 * MB)) as Arc<dyn BlockDevice>;
    let err = pool
        .replace("nosuch", other.clone(), "x".into(), false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no device nosuch"), "{err}");
    let err = pool
        .replace("mem5", other, "new1".into(), false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("already part of"), "{err}");
}

/// A replacement gets every block the pool needs: after its resilver, it alone imports the
/// pool and serves the volume. The volume's objset block, written once when the volume was
/// and never again while the volume sits unchanged, is one of them, as is the MOS's, which
/// no txg rewrites while nothing changes.
#[test]
fn a_replaced_mirror_side_alone_imports_the_pool_after_its_resilver() {
    let (devs, data) = filled_pool(Layout::Mirror, 64 * MB, VOL, 16384, 11);
    let pool = import(&devs);
    let fresh = Arc::new(MemDevice::new("new1", 64 * MB));
    pool.replace(
        "mem1",
        fresh.clone() as Arc<dyn BlockDevice>,
        "new1".into(),
        false,
    )
    .unwrap();
    pool.wait_scrub();
    let scan = pool.scan_status();
    assert_eq!(
        (scan.func, scan.state, scan.errors),
        (ScanFunc::Resilver, ScanPhase::Finished, 0),
        "{scan:?}"
    );
    pool.close().unwrap();
    drop(pool);
    let pool = match Pool::import(as_leaves(&[fresh]), None, opts()) {
        Ok(p) => p,
        Err(e) => panic!("the replacement alone does not import the pool: {e}"),
    };
    assert!(read_volume(&pool) == data, "the replacement lacks data");
    pool.verify().unwrap();
}

/// A device failing every I/O is faulted once its vdev can spare it (no more I/O is sent to
/// it, the txgs it misses are recorded); `clear` puts it back and resilvers it. A device the
/// pool cannot spare is never faulted.
#[test]
fn a_failing_device_is_faulted_and_clear_brings_it_back() {
    use zeta::vdev::mem::Faults;
    let (devs, mut data) = filled_pool(Layout::Mirror, 96 * MB, VOL, 16384, 1);
    let pool = import(&devs);
    devs[1].set_faults(Faults {
        fail_reads: true,
        fail_writes: true,
        ..Faults::default()
    });
    let vol = Volume::open(&pool, "v").unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    for i in 0..8u64 {
        let off = (i * MB) as usize;
        rng.fill_bytes(&mut data[off..off + 65536]);
        vol.write(i * MB, &data[off..off + 65536]).unwrap();
        vol.flush().unwrap();
    }
    let st = pool.vdev_status();
    assert_eq!(st[0].leaves[1].state, "FAULTED", "{st:?}");
    assert_eq!(st[0].state, "DEGRADED");
    // Faulted: no more I/O goes to it, so its error counts stop growing.
    let errors = st[0].leaves[1].write_errors;
    vol.write(0, &data[..65536]).unwrap();
    vol.flush().unwrap();
    assert_eq!(pool.vdev_status()[0].leaves[1].write_errors, errors);
    assert!(read_volume(&pool) == data);
    drop(vol);
    pool.close().unwrap();
    drop(pool);

    // The device heals (say, a cable reseated); it is still faulted after import, until
    // clear returns it and resilvers it.
    devs[1].set_faults(Faults::default());
    let pool = import(&devs);
    assert_eq!(pool.vdev_status()[0].leaves[1].state, "FAULTED");
    pool.clear_errors().unwrap();
    pool.wait_scrub();
    let scan = pool.scan_status();
    assert_eq!(
        (scan.func, scan.state),
        (ScanFunc::Resilver, ScanPhase::Finished)
    );
    assert_eq!(pool.vdev_status()[0].leaves[1].state, "ONLINE");
    pool.set_offline("mem0", true).unwrap();
    assert!(read_volume(&pool) == data, "the cleared device lacks data");
    pool.verify().unwrap();
    drop(pool);

    // A stripe's only device is never faulted: every error is reported instead.
    let devs = mem_devs(1, 96 * MB);
    let pool = Pool::create("s", spec(Layout::Stripe, &devs), opts()).unwrap();
    pool.create_volume("v", MB, 16384, None).unwrap();
    let vol = Volume::open(&pool, "v").unwrap();
    vol.write(0, &[1u8; 65536]).unwrap();
    vol.flush().unwrap();
    devs[0].set_faults(Faults {
        fail_reads: true,
        ..Faults::default()
    });
    drop(vol);
    pool.close().unwrap();
    drop(pool);
    let err = Pool::import(as_leaves(&devs), None, opts());
    assert!(
        err.is_err(),
        "a pool whose only device fails every read cannot import"
    );
}

/// A second device replaced while the first one's resilver is under way, with no txg in
/// between (so both owe the same txgs): the resilver must start over for both, not go on
/// from its bookmark, past which the second device would never get the blocks before it.
/// Foreground I/O holds the first resilver part-way (a scan yields to it) at a known point.
#[test]
fn a_device_replaced_during_a_resilver_is_rebuilt_in_full() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (devs, data) = filled_pool(Layout::Raidz2, 96 * MB, VOL, 16384, 1);
    let present: Vec<Arc<MemDevice>> = [0, 2, 3, 5].iter().map(|&i| devs[i].clone()).collect();
    let pool = Pool::import(as_leaves(&present), None, opts()).unwrap();
    let hold = Arc::new(AtomicBool::new(true));
    let done = Arc::new(AtomicBool::new(false));
    let busy = {
        let (pool, hold, done) = (pool.clone(), hold.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                if hold.load(Ordering::SeqCst) {
                    pool.note_foreground_io();
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    };
    let replace = |gone: usize, name: &str| {
        let fresh = Arc::new(MemDevice::new(name, 96 * MB)) as Arc<dyn BlockDevice>;
        pool.replace(devs[gone].name(), fresh, name.to_string(), false)
            .unwrap();
    };
    replace(1, "new1");
    // Let the first resilver pass its first chunk of the volume (it moves its bookmark past
    // those blocks), then hold it again.
    hold.store(false, Ordering::SeqCst);
    while pool.scan_status().bookmark.is_none_or(|b| b.blkid == 0) {
        std::thread::yield_now();
    }
    hold.store(true, Ordering::SeqCst);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mid = pool.scan_status();
    assert_eq!(mid.state, ScanPhase::Scanning, "held part-way: {mid:?}");
    assert!(mid.examined_bytes < mid.to_examine / 2, "{mid:?}");
    replace(4, "new4");
    hold.store(false, Ordering::SeqCst);
    pool.wait_scrub();
    done.store(true, Ordering::SeqCst);
    busy.join().unwrap();

    let scan = pool.scan_status();
    assert_eq!(scan.state, ScanPhase::Finished, "{scan:?}");
    for i in [1, 4] {
        assert!(
            repaired_on(&pool, i) >= VOL / 4,
            "leaf {i} got {} bytes",
            repaired_on(&pool, i)
        );
    }
    // The two new devices and two old ones must carry every byte.
    pool.set_offline("mem0", true).unwrap();
    pool.set_offline("mem3", true).unwrap();
    assert!(read_volume(&pool) == data, "a new device lacks data");
}

/// A power cut at a random moment of a replacement and its resilver, while a writer flushes
/// every fourth write: the pool imports from the three devices (its labels name the old
/// device or the new one, whichever the cut left), every flushed write reads back untorn,
/// and once the resilver is done the device in the old one's place holds everything.
#[test]
fn power_cuts_during_a_replacement_lose_nothing_flushed() {
    use std::time::Duration;
    use zeta::vdev::mem::PowerCut;
    const BLOCKS: u64 = 256;
    for seed in 0..16u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let devs = mem_devs(2, 64 * MB);
        let pool = Pool::create("tank", spec(Layout::Mirror, &devs), opts()).unwrap();
        pool.create_volume("v", BLOCKS * STAMP_BS as u64, STAMP_BS as u32, None)
            .unwrap();
        // Another volume, for the resilver to take a while over.
        pool.create_volume("w", VOL, 16384, None).unwrap();
        Volume::open(&pool, "w")
            .unwrap()
            .write(0, &pattern(seed, VOL as usize))
            .unwrap();
        let writer = StampWriter::start(Volume::open(&pool, "v").unwrap(), BLOCKS, seed + 1000);
        writer.wait_for(rng.next_u64() % 10);
        let fresh = Arc::new(MemDevice::new("new1", 64 * MB));
        // Half the cuts within the replacement itself (a sync and two rounds of labels).
        let within = if seed % 2 == 0 { 20 } else { 300 };
        let cut_after = Duration::from_micros(rng.next_u64() % (within * 1000));
        let (cut, stamps) = std::thread::scope(|s| {
            s.spawn(|| {
                // The devices keep working in memory after the cut: it succeeds.
                pool.replace(
                    "mem1",
                    fresh.clone() as Arc<dyn BlockDevice>,
                    "new1".into(),
                    false,
                )
                .unwrap();
            });
            std::thread::sleep(cut_after);
            writer.cut(
                &[devs[0].clone(), devs[1].clone(), fresh.clone()],
                PowerCut::Tear(seed),
            )
        });
        drop(pool);

        let pool = Pool::import(as_leaves(&cut), None, opts())
            .unwrap_or_else(|e| panic!("seed {seed}: import: {e}"));
        let vol = Volume::open(&pool, "v").unwrap();
        stamps.check(&vol, &format!("seed {seed}, after the import"));
        pool.wait_scrub();
        let scan = pool.scan_status();
        assert_ne!(scan.state, ScanPhase::Scanning, "seed {seed}: {scan:?}");
        assert_eq!(scan.errors, 0, "seed {seed}: {scan:?}");
        pool.verify()
            .unwrap_or_else(|e| panic!("seed {seed}: verify: {e}"));
        // Whichever device holds the second place now carries every block alone.
        pool.set_offline("mem0", true).unwrap();
        stamps.check(&vol, &format!("seed {seed}, from the second device alone"));
        drop(vol);
        pool.close().unwrap();
    }
}

/// The txgs an offline leaf misses are owed to it after a power cut too, not only after a
/// clean export: each is in the labels by the time its uberblock is, so that online
/// resilvers every one of them.
#[test]
fn txgs_missed_while_offline_are_owed_after_a_power_cut() {
    use zeta::vdev::mem::PowerCut;
    for cut_mode in [PowerCut::DropUnflushed, PowerCut::KeepUnflushed] {
        let (devs, data) = filled_pool(Layout::Mirror, 96 * MB, VOL, 16384, 3);
        let pool = import(&devs);
        pool.set_offline("mem1", true).unwrap();
        let vol = Volume::open(&pool, "v").unwrap();
        let mut expect = data.clone();
        for round in 0..3u64 {
            let piece = pattern(40 + round, 64 << 10);
            let at = (round * 3 * MB) as usize;
            vol.write(at as u64, &piece).unwrap();
            expect[at..at + piece.len()].copy_from_slice(&piece);
            pool.sync_now().unwrap();
        }
        let cut = power_cut(&devs, cut_mode);
        drop(vol);
        drop(pool);

        let pool = import(&cut);
        assert_eq!(pool.vdev_status()[0].leaves[1].state, "OFFLINE");
        assert!(read_volume(&pool) == expect, "{cut_mode:?}");
        pool.set_offline("mem1", false).unwrap();
        mem1_resilvered(&pool, &expect, 3 * (64 << 10), &format!("{cut_mode:?}"));
        pool.close().unwrap();
    }
}

/// A txg a leaf missed for a failed write is in the other leaves' labels, flushed, before
/// the next txg begins: that leaf may take the next txg whole, after which its own newest
/// uberblock no longer tells an import what it lacks.
#[test]
fn a_txg_a_leaf_missed_is_in_the_labels_before_the_next_one() {
    use zeta::vdev::mem::{Faults, PowerCut};
    let (devs, _) = filled_pool(Layout::Mirror, 96 * MB, VOL, 16384, 4);
    let pool = import(&devs);
    let vol = Volume::open(&pool, "v").unwrap();
    devs[1].set_faults(Faults {
        fail_writes: true,
        ..Faults::default()
    });
    vol.write(0, &pattern(9, 64 << 10)).unwrap();
    pool.sync_now().unwrap();
    let txg = pool.synced_txg();
    let durable = power_cut(&devs[..1], PowerCut::DropUnflushed);
    let cfg = zeta::dsl::probe(durable[0].clone()).expect("a config");
    let missed = &cfg.tops[0].children[1].missed;
    assert!(
        missed.iter().any(|r| r[0] <= txg && txg <= r[1]),
        "txg {txg} not in {missed:?}"
    );
    devs[1].set_faults(Faults::default());
    drop(vol);
    pool.close().unwrap();
}

/// A leaf whose labels are behind the pool's (it missed txgs the other labels never got to
/// record: here, a mirror side that comes back as it was some txgs ago) is owed those txgs at
/// import, found by its newest uberblock, and resilvered.
#[test]
fn a_leaf_behind_the_pool_at_import_is_resilvered() {
    use zeta::vdev::mem::PowerCut;
    let (devs, data) = filled_pool(Layout::Mirror, 96 * MB, VOL, 16384, 5);
    let stale = devs[1].power_cut(PowerCut::KeepUnflushed);
    let pool = import(&devs);
    let vol = Volume::open(&pool, "v").unwrap();
    let mut expect = data.clone();
    let piece = pattern(11, 256 << 10);
    vol.write(MB, &piece).unwrap();
    expect[MB as usize..][..piece.len()].copy_from_slice(&piece);
    vol.flush().unwrap();
    pool.sync_now().unwrap();
    drop(vol);
    pool.close().unwrap();
    drop(pool);

    let back = vec![
        devs[0].clone(),
        Arc::new(MemDevice::from_image("mem1", stale)),
    ];
    let pool = import(&back);
    mem1_resilvered(&pool, &expect, piece.len() as u64 / 2, "the stale side");
    pool.close().unwrap();
}

/// A device faulted by failed reads is in the labels as faulted once the next txg has
/// committed (a faulted device takes no part in it, and a txg some leaf missed writes the
/// config): after a power cut it is still out of service, until `pool clear`.
#[test]
fn a_device_faulted_by_reads_stays_faulted_after_a_power_cut() {
    use zeta::vdev::mem::{Faults, PowerCut};
    let (devs, data) = filled_pool(Layout::Mirror, 96 * MB, VOL, 16384, 6);
    let pool = import(&devs);
    devs[1].set_faults(Faults {
        fail_reads: true,
        ..Faults::default()
    });
    // Reads that go to it fail over to the other side, until it is faulted. (Not a scrub:
    // its end writes the config anyway.)
    for _ in 0..20 {
        if pool.vdev_status()[0].leaves[1].state == "FAULTED" {
            break;
        }
        assert!(read_volume(&pool) == data);
    }
    assert_eq!(pool.vdev_status()[0].leaves[1].state, "FAULTED");
    let vol = Volume::open(&pool, "v").unwrap();
    vol.write(0, &data[..4096]).unwrap();
    pool.sync_now().unwrap();
    let cut = power_cut(&devs, PowerCut::DropUnflushed);
    drop(vol);
    drop(pool);

    let pool = import(&cut);
    assert_eq!(pool.vdev_status()[0].leaves[1].state, "FAULTED");
    assert!(read_volume(&pool) == data);
    pool.close().unwrap();
}

/// Holds the scan thread's device reads at chosen moments, so that a test can change the
/// pool under a resilver that is part-way through its walk. Reads of other threads pass.
#[derive(Default)]
struct ScanGate {
    /// `Some(n)`: n more bytes of scan reads pass, then the next read of the walking thread
    /// waits; `Some(0)` while it waits.
    hold_after: std::sync::Mutex<Option<u64>>,
    moved: std::sync::Condvar,
    held: std::sync::atomic::AtomicBool,
}

impl ScanGate {
    /// Called before each read of `len` bytes.
    fn pass(&self, len: u64) {
        if !scan_thread() {
            return;
        }
        let mut hold = self.hold_after.lock().unwrap();
        match *hold {
            Some(0) if scan_walker() => {}
            Some(n) => {
                *hold = Some(n.saturating_sub(len));
                return;
            }
            None => return,
        }
        self.held.store(true, std::sync::atomic::Ordering::SeqCst);
        self.moved.notify_all();
        while *hold == Some(0) && self.held.load(std::sync::atomic::Ordering::SeqCst) {
            hold = self.moved.wait(hold).unwrap();
        }
    }

    /// Lets `n` bytes of scan reads through (releasing one that waits), then holds the next.
    fn hold_after(&self, n: u64) {
        let mut hold = self.hold_after.lock().unwrap();
        *hold = Some(n);
        self.held.store(false, std::sync::atomic::Ordering::SeqCst);
        self.moved.notify_all();
    }

    /// Waits (at most 30 s) until a scan read is held.
    fn wait_held(&self) {
        let hold = self.hold_after.lock().unwrap();
        let (_hold, timeout) = self
            .moved
            .wait_timeout_while(hold, std::time::Duration::from_secs(30), |_| {
                !self.held.load(std::sync::atomic::Ordering::SeqCst)
            })
            .unwrap();
        assert!(!timeout.timed_out(), "the scan never reached the gate");
    }

    /// `dev` seen through a tap whose reads pass this gate.
    fn tap(self: &Arc<Self>, dev: &Arc<MemDevice>) -> Tap {
        let gate = self.clone();
        Tap {
            fail_read: Box::new(move |_, len| {
                gate.pass(len as u64);
                false
            }),
            ..Tap::new(dev.clone())
        }
    }

    fn open(&self) {
        *self.hold_after.lock().unwrap() = None;
        self.held.store(false, std::sync::atomic::Ordering::SeqCst);
        self.moved.notify_all();
    }
}

/// Whether this thread may be doing a scan's I/O: the scan's own, or one of the (unnamed)
/// rayon workers it checks batches of blocks on.
fn scan_thread() -> bool {
    std::thread::current().name().is_none_or(|_| scan_walker())
}

/// Whether this is the scan's own thread, which walks the trees. Only it is held: a rayon
/// worker held would stall the txg sync, which writes labels on the same workers.
fn scan_walker() -> bool {
    std::thread::current()
        .name()
        .is_some_and(|n| n.starts_with("scrub-"))
}

/// Takes `away` offline and rewrites the whole volume with bytes from `seed` (into `data`)
/// in a txg they miss.
fn rewrite_while_away(pool: &Arc<Pool>, away: &[&str], seed: u64, data: &mut [u8]) {
    for l in away {
        pool.set_offline(l, true).unwrap();
    }
    let vol = Volume::open(pool, "v").unwrap();
    StdRng::seed_from_u64(seed).fill_bytes(data);
    vol.write(0, data).unwrap();
    vol.flush().unwrap();
    pool.sync_now().unwrap();
}

/// The leaves of `devs` for an import, with leaf `at` seen through `tap`.
fn with_tap(devs: &[Arc<MemDevice>], at: usize, tap: Tap) -> Vec<(Arc<dyn BlockDevice>, String)> {
    let mut leaves = as_leaves(devs);
    leaves[at].0 = Arc::new(tap);
    leaves
}

/// A leaf taken offline while its resilver runs and brought back before that resilver ends
/// missed the blocks the walk passed meanwhile: the resilver must start over rather than go
/// on where it was and then call the leaf whole.
#[test]
fn a_leaf_out_during_its_resilver_gets_every_block_when_it_returns() {
    let (devs, mut data) = filled_pool(Layout::Mirror, 96 * MB, VOL, 16384, 1);
    let gate = Arc::new(ScanGate::default());
    let tap = gate.tap(&devs[0]);
    let pool = Pool::import(with_tap(&devs, 0, tap), None, opts()).unwrap();
    // The whole volume is rewritten while mem1 is away: its resilver walks 1024 blocks.
    rewrite_while_away(&pool, &["mem1"], 3, &mut data);

    gate.hold_after(0);
    pool.set_offline("mem1", false).unwrap();
    gate.wait_held();
    // Away again while the resilver walks 8 MiB more (over 256 blocks, a chunk of its walk,
    // so its bookmark moves past them), then back.
    pool.set_offline("mem1", true).unwrap();
    gate.hold_after(8 * MB);
    gate.wait_held();
    gate.open();
    pool.set_offline("mem1", false).unwrap();
    mem1_resilvered(&pool, &data, VOL, "mem1 out during its resilver");
    pool.verify().unwrap();
    pool.close().unwrap();
}

/// A leaf that comes back while another leaf's resilver runs is not rebuilt by that one
/// for the blocks it had passed: when it ends, that leaf must still owe them, and get its
/// own resilver. (The window is between the leaf's return and the resilver that `online`
/// starts; a write hook holds the leaf's label update there until the first one ends.)
#[test]
fn a_resilver_that_ends_as_another_leaf_returns_leaves_that_leaf_owed() {
    let (devs, mut data) = filled_pool(Layout::Raidz2, 96 * MB, VOL, 16384, 1);
    let gate = Arc::new(ScanGate::default());
    let reads = gate.tap(&devs[0]);
    // Once armed, the first write to mem4's labels (as it comes back) opens the gate and
    // waits until the running resilver has finished.
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pool_slot: Arc<std::sync::Mutex<Option<std::sync::Weak<Pool>>>> = Default::default();
    let writes = Tap {
        on_write: {
            let (gate, armed, slot) = (gate.clone(), armed.clone(), pool_slot.clone());
            Box::new(move |_, offset| {
                let label = offset < zeta::vdev::RESERVE_BYTES;
                if !label || !armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let pool = slot.lock().unwrap().as_ref().unwrap().upgrade().unwrap();
                gate.open();
                let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
                while pool.scan_status().state == ScanPhase::Scanning {
                    assert!(
                        std::time::Instant::now() < until,
                        "the resilver never ended"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            })
        },
        ..Tap::new(devs[4].clone())
    };
    let mut leaves = with_tap(&devs, 0, reads);
    leaves[4].0 = Arc::new(writes);
    let pool = Pool::import(leaves, None, opts()).unwrap();
    *pool_slot.lock().unwrap() = Some(Arc::downgrade(&pool));
    rewrite_while_away(&pool, &["mem1", "mem4"], 4, &mut data);

    // mem1's resilver walks part of the volume, then waits while mem4 comes back.
    gate.hold_after(MB);
    pool.set_offline("mem1", false).unwrap();
    gate.wait_held();
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    pool.set_offline("mem4", false).unwrap();
    assert!(
        !armed.load(std::sync::atomic::Ordering::SeqCst),
        "the hook never ran"
    );
    pool.wait_scrub();
    let scan = pool.scan_status();
    assert_eq!(
        (scan.func, scan.state),
        (ScanFunc::Resilver, ScanPhase::Finished)
    );
    // mem4 must carry its columns of every block: with two others away, raidz2 has no
    // parity to spare for a stale one.
    for l in ["mem0", "mem2"] {
        pool.set_offline(l, true).unwrap();
    }
    assert!(read_volume(&pool) == data, "mem4 lacks blocks it missed");
    pool.verify().unwrap();
    pool.close().unwrap();
}

/// A resilver's write to the leaf it rebuilds may fail without the leaf being faulted: the
/// block is still missing there, so the leaf still owes its txg when that resilver ends,
/// and the resilver that follows (here, once the faults are cleared) brings it.
#[test]
fn a_block_whose_resilver_write_failed_is_still_owed() {
    let (devs, mut data) = filled_pool(Layout::Mirror, 96 * MB, VOL, 16384, 1);
    let pool = import(&devs);
    rewrite_while_away(&pool, &["mem1"], 5, &mut data);
    // A quarter of mem1's writes fail: never 16 in a row (`FAULT_AFTER`) over 1024 blocks,
    // but hundreds of the resilver's.
    let flaky = zeta::vdev::Injection {
        fail_writes: 0.25,
        ..Default::default()
    };
    pool.inject("mem1", flaky).unwrap();
    pool.set_offline("mem1", false).unwrap();
    pool.wait_scrub();
    let st = &pool.vdev_status()[0].leaves[1];
    assert!(st.write_errors > 0 && st.state == "ONLINE", "{st:?}");
    pool.inject("mem1", zeta::vdev::Injection::default())
        .unwrap();
    mem1_resilvered(&pool, &data, VOL / 2, "after failed resilver writes");
    pool.verify().unwrap();
    pool.close().unwrap();
}
