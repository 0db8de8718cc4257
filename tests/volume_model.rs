//! Model-based test: random reads, writes, trims, flushes and restarts on a volume, compared
//! byte for byte with a plain in-memory model, on stripe, mirror, two-vdev and raidz pools.
//! A restart is a power cut that drops unflushed writes, so the model keeps the last flushed
//! image and the test checks the volume returns exactly to it. Every read is also made the
//! way that waits for no device (`Volume::read_nowait`), which must agree, and half the
//! writes are offered to `Volume::write_nowait` first.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use zeta::dsl::Pool;
use zeta::vdev::mem::PowerCut;
use zeta::zio::compress::Compression;
use zeta::zvol::Volume;

/// No background commits: a txg syncs only on flush, so the state after a power cut is exactly
/// the last flushed one whatever the machine's load (a timed sync between a flush and the cut
/// would legitimately persist later writes, and the exact comparison below would then fail).
fn model_opts() -> zeta::dsl::PoolOptions {
    zeta::dsl::PoolOptions {
        txg_timeout: std::time::Duration::from_secs(3600),
        dirty_max_bytes: 256 * MB,
        ..opts()
    }
}

fn run(layout: Layout, seed: u64) {
    run_compressed(layout, seed, Compression::Off)
}

/// The devices a model run is on: simulated ones, whose restart is a power cut that drops
/// what was not flushed, or RADOS devices of a real cluster, whose restart drops the pool
/// without closing it. With no background commits nothing reaches a device between
/// flushes, so either way the volume must come back exactly as last flushed.
enum Devices {
    Mem(Vec<std::sync::Arc<zeta::vdev::MemDevice>>),
    Rados(Vec<std::path::PathBuf>),
}

impl Devices {
    fn leaves(&self) -> Vec<(std::sync::Arc<dyn zeta::vdev::BlockDevice>, String)> {
        match self {
            Devices::Mem(devs) => as_leaves(devs),
            // The pool dropped last may still be letting go of them on one of its threads
            // (a prefetch or sync thread that held it for a moment): wait for its leases.
            Devices::Rados(paths) => paths
                .iter()
                .map(|p| {
                    let t0 = std::time::Instant::now();
                    let dev = loop {
                        match zeta::vdev::scheme::open(p, false) {
                            Ok(dev) => break dev,
                            Err(e)
                                if e.to_string().contains("in use")
                                    && t0.elapsed().as_secs() < 10 =>
                            {
                                std::thread::sleep(std::time::Duration::from_millis(50))
                            }
                            Err(e) => panic!("open {}: {e}", p.display()),
                        }
                    };
                    (dev, p.display().to_string())
                })
                .collect(),
        }
    }

    /// Cuts the power of simulated devices: what survives is what the next `leaves` opens.
    /// RADOS devices keep what the cluster acknowledged.
    fn cut(&mut self) {
        if let Devices::Mem(devs) = self {
            *devs = power_cut(devs, PowerCut::DropUnflushed);
        }
    }

    /// Whether every read is served without a wait (memory is; a cluster is not).
    fn instant(&self) -> bool {
        matches!(self, Devices::Mem(_))
    }
}

/// The data a write carries: a ramp (compresses well), random bytes (not at all), or runs of
/// a few bytes with random ones between (partly), so that a compressed volume stores some
/// blocks compressed and some raw, of many stored sizes.
fn data_for(rng: &mut rand::rngs::StdRng, len: usize) -> Vec<u8> {
    let byte: u8 = rng.gen();
    match rng.gen_range(0..4) {
        0 | 1 => (0..len).map(|i| byte.wrapping_add(i as u8)).collect(),
        2 => (0..len).map(|_| rng.gen()).collect(),
        _ => (0..len)
            .map(|i| if i % 97 < 60 { byte } else { rng.gen() })
            .collect(),
    }
}

fn run_compressed(layout: Layout, seed: u64, compression: Compression) {
    // Wide raidz layouts keep two images per device in memory: smaller devices.
    let dev_size = if devs_for(layout) > 2 {
        64 * MB
    } else {
        96 * MB
    };
    let devs = Devices::Mem(mem_devs(devs_for(layout), dev_size));
    run_on(devs, layout, seed, compression)
}

fn run_on(mut devs: Devices, layout: Layout, seed: u64, compression: Compression) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let ctx = format!(
        "layout {layout:?} seed {seed} compression {}",
        compression.name()
    );
    let pool = Pool::create("tank", spec_of(layout, devs.leaves()), model_opts()).expect(&ctx);
    // A compressed volume's blocks are larger than a sector, so that they can save one.
    let sizes: &[u32] = match compression {
        Compression::Off => &[4096, 16384, 65536],
        _ => &[16384, 65536],
    };
    let bs = sizes[rng.gen_range(0..sizes.len())];
    let size = 4 * MB;
    pool.create_volume("v", size, bs, None).expect(&ctx);
    pool.set_compression("v", compression).expect(&ctx);
    let mut pool = pool;
    let mut vol = Volume::open(&pool, "v").unwrap();
    let mut model = vec![0u8; size as usize];
    let mut durable = model.clone();
    for step in 0..400 {
        match rng.gen_range(0..100) {
            0..=44 => {
                let len = rng.gen_range(1..100_000usize);
                let off = rng.gen_range(0..size - len as u64);
                let data = data_for(&mut rng, len);
                // Half the writes go the way an NBD reader tries first, which takes short
                // ones at once and declines the rest untouched.
                match rng
                    .gen_bool(0.5)
                    .then(|| vol.write_nowait(off, &data))
                    .flatten()
                {
                    Some(written) => written.expect(&ctx),
                    None => vol.write(off, &data).expect(&ctx),
                }
                model[off as usize..off as usize + len].copy_from_slice(&data);
            }
            45..=74 => {
                let len = rng.gen_range(1..200_000usize);
                let off = rng.gen_range(0..size - len as u64);
                let mut buf = vec![0u8; len];
                vol.read(off, &mut buf).expect(&ctx);
                assert!(
                    buf == model[off as usize..off as usize + len],
                    "{ctx}: read mismatch at step {step}"
                );
                // A read that waits for no device (memory devices serve at once) sees the
                // same bytes.
                let mut now = vec![0u8; len];
                match vol.read_nowait(off, &mut now) {
                    Some(r) => {
                        r.expect(&ctx);
                        assert!(now == buf, "{ctx}: read_nowait mismatch at step {step}");
                    }
                    None => assert!(!devs.instant(), "memory devices serve every read at once"),
                }
            }
            75..=84 => {
                let len = rng.gen_range(1..300_000u64);
                let off = rng.gen_range(0..size - len);
                vol.trim(off, len).expect(&ctx);
                model[off as usize..(off + len) as usize].fill(0);
            }
            85..=94 => {
                vol.flush().expect(&ctx);
                durable.copy_from_slice(&model);
            }
            _ => {
                // Power cut: what was not flushed may vanish entirely.
                drop(vol);
                if devs.instant() {
                    // Cut before the pool lets go, as a power cut would find it.
                    devs.cut();
                    drop(pool);
                } else {
                    drop(pool);
                    devs.cut();
                }
                pool = Pool::import(devs.leaves(), None, model_opts()).expect(&ctx);
                vol = Volume::open(&pool, "v").expect(&ctx);
                model.copy_from_slice(&durable);
                let mut all = vec![0u8; size as usize];
                vol.read(0, &mut all).expect(&ctx);
                assert!(
                    all == model,
                    "{ctx}: volume differs from last flush after restart at step {step}"
                );
            }
        }
    }
    vol.flush().unwrap();
    pool.verify().expect(&ctx);
    let mut all = vec![0u8; size as usize];
    vol.read(0, &mut all).unwrap();
    assert!(all == model, "{ctx}: final image differs");
    let sizes = pool.dataset("v").unwrap().object.sizes();
    if compression == Compression::Off || bs as u64 <= zeta::vdev::SECTOR {
        // A block of one sector cannot save one: stored raw, as OpenZFS does.
        assert_eq!(sizes.logical, sizes.physical, "{ctx} bs {bs}");
    } else {
        // Half the writes or more compress: the tree stores less than it holds.
        assert!(sizes.physical < sizes.logical, "{ctx} bs {bs}: {sizes:?}");
    }
    pool.close().unwrap();
    drop(pool);
    if let Devices::Rados(paths) = &devs {
        paths.iter().for_each(|p| zeta::vdev::scheme::remove(p));
    }
}

#[test]
fn model_stripe() {
    for seed in 1..=3 {
        run(Layout::Stripe, seed);
    }
}

#[test]
fn model_mirror() {
    for seed in 11..=13 {
        run(Layout::Mirror, seed);
    }
}

#[test]
fn model_two_vdevs() {
    for seed in 21..=22 {
        run(Layout::TwoStripes, seed);
    }
}

#[test]
fn model_raidz1() {
    run(Layout::Raidz1, 31);
}

#[test]
fn model_raidz2() {
    run(Layout::Raidz2, 41);
}

#[test]
fn model_raidz2_rdp() {
    run(Layout::Raidz2Rdp, 51);
}

#[test]
fn model_raidz3() {
    run(Layout::Raidz3, 61);
}

/// The model on a real Ceph cluster: a mirror of two RADOS leaves, compressed with lz4.
#[test]
fn model_mirror_on_rados() {
    let Some(pool) = common::rados::ceph_pool() else {
        return;
    };
    let devs = common::rados::new_devices(pool, "model", 2, 96 * MB);
    let seed = rand::random();
    run_on(Devices::Rados(devs), Layout::Mirror, seed, Compression::Lz4);
}

#[test]
fn model_mirror_lz4() {
    for seed in 71..=72 {
        run_compressed(Layout::Mirror, seed, Compression::Lz4);
    }
}

#[test]
fn model_raidz1_zstd() {
    run_compressed(Layout::Raidz1, 81, Compression::Zstd(3));
}

#[test]
fn model_stripe_zstd_levels() {
    run_compressed(Layout::Stripe, 91, Compression::Zstd(1));
    run_compressed(Layout::Stripe, 92, Compression::Zstd(19));
}

/// A pool on one hooked device with volume `v` of 4 MiB in blocks of `bs`, its first
/// `filled` bytes written (`pattern(1, ..)`) and synced; returns them too.
fn tapped_volume(tap: Tap, bs: usize, filled: usize) -> (std::sync::Arc<Pool>, Volume, Vec<u8>) {
    let tap: std::sync::Arc<dyn zeta::vdev::BlockDevice> = std::sync::Arc::new(tap);
    let pool = Pool::create(
        "tank",
        vec![zeta::dsl::TopSpec::stripe((tap, "tap".into()))],
        model_opts(),
    )
    .unwrap();
    pool.create_volume("v", 4 * MB, bs as u32, None).unwrap();
    let vol = Volume::open(&pool, "v").unwrap();
    let data = pattern(1, filled);
    vol.write(0, &data).unwrap();
    pool.sync_now().unwrap();
    (pool, vol, data)
}

/// A 4 MiB volume of 16K blocks on a one-device pool, and its model: all zeros.
fn small_volume() -> (std::sync::Arc<Pool>, Volume, Vec<u8>) {
    let pool = Pool::create(
        "tank",
        spec(Layout::Stripe, &mem_devs(1, 64 * MB)),
        model_opts(),
    )
    .unwrap();
    pool.create_volume("v", 4 * MB, 16384, None).unwrap();
    let vol = Volume::open(&pool, "v").unwrap();
    (pool, vol, vec![0u8; 4 * MB as usize])
}

/// `Volume::write_nowait` takes a whole small block, or a short write inside one block as a
/// patch, at once, and declines, with nothing changed, what needs a merge or spans blocks.
#[test]
fn short_writes_are_taken_at_once_and_the_rest_declined_untouched() {
    let (pool, vol, mut model) = small_volume();
    let mut taken = |off: usize, data: &[u8]| {
        assert!(matches!(vol.write_nowait(off as u64, data), Some(Ok(()))));
        model[off..off + data.len()].copy_from_slice(data);
    };
    taken(4096, &[1; 4096]);
    taken(12288, &[2; 4096]); // ends at the block's end
    taken(4096 + 100, &[7; 100]); // over an earlier piece
    taken(16384, &[3; 16384]); // a whole block
    assert!(
        vol.write_nowait(16384 + 200, &[4; 300]).is_none(),
        "into a block the open txg holds whole: a merge"
    );
    assert!(
        vol.write_nowait(30000, &[3; 4096]).is_none(),
        "across two blocks"
    );
    assert!(matches!(
        vol.write_nowait(4 * MB - 100, &[3; 4096]),
        Some(Err(_))
    ));
    vol.write(32768, &[5; 16384]).unwrap();
    model[32768..49152].fill(5);
    assert!(
        vol.write_nowait(32768 + 100, &[6; 100]).is_none(),
        "a block the open txg holds whole is merged, not patched"
    );
    let mut all = vec![0u8; model.len()];
    vol.read(0, &mut all).unwrap();
    assert!(all == model, "before the sync");
    vol.flush().unwrap();
    pool.sync_now().unwrap();
    vol.read(0, &mut all).unwrap();
    assert!(all == model, "after the sync");
}

/// `Volume::write_nowait_owned` keeps the buffer it is given as the block's or the patch's
/// (the bytes are not copied: changing them afterwards would be a bug, so the test only
/// checks what it can see), and gives back the very buffer, untouched, where it would wait.
#[test]
fn owned_short_writes_are_taken_whole_and_declined_ones_given_back() {
    let (pool, vol, mut model) = small_volume();
    let mut taken = |off: usize, data: Vec<u8>| {
        model[off..off + data.len()].copy_from_slice(&data);
        assert!(matches!(
            vol.write_nowait_owned(off as u64, data),
            Ok(Ok(()))
        ));
    };
    taken(4096, vec![1; 4096]); // a patch
    taken(16384, vec![3; 16384]); // a whole block

    // A buffer with much more room than its bytes is copied, and taken all the same.
    let mut roomy = Vec::with_capacity(64 << 10);
    roomy.extend_from_slice(&[8u8; 4096]);
    taken(65536, roomy);
    // Declined: the same buffer back, as it was.
    let across = vec![9u8; 4096];
    let at = across.as_ptr();
    let back = vol
        .write_nowait_owned(30000, across)
        .expect_err("across two blocks");
    assert_eq!((back.as_ptr(), back.len()), (at, 4096));
    assert!(back.iter().all(|&b| b == 9));
    let merge = vec![4u8; 300];
    let at = merge.as_ptr();
    let back = vol
        .write_nowait_owned(16384 + 200, merge)
        .expect_err("into a block the open txg holds whole: a merge");
    assert_eq!(back.as_ptr(), at);
    assert!(matches!(
        vol.write_nowait_owned(4 * MB - 100, vec![3; 4096]),
        Ok(Err(_))
    ));
    let mut all = vec![0u8; model.len()];
    vol.read(0, &mut all).unwrap();
    assert!(all == model, "before the sync");
    pool.sync_now().unwrap();
    vol.read(0, &mut all).unwrap();
    assert!(all == model, "after the sync");
}

/// `Volume::read_nowait` serves blocks held in memory and blocks the device has at once (as
/// a file's page cache does), and declines, without any waiting read, a block the device
/// would have to wait for: the NBD reader serves small reads that way and leaves the rest to
/// a worker.
#[test]
fn reads_without_waiting_take_memory_and_ready_devices_only() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::Arc;

    let dev = mem_devs(1, 64 * MB).pop().unwrap();
    let ready = Arc::new(AtomicBool::new(true));
    let (tap, waited) = Tap::counting_reads(dev);
    let tap = Tap {
        nowait: {
            let ready = ready.clone();
            Box::new(move || ready.load(SeqCst))
        },
        ..tap
    };
    let (pool, vol, old) = tapped_volume(tap, 16384, MB as usize);
    // Nothing in the block cache: every block not dirty comes from the device.
    pool.set_cache_limit(0);

    let mut buf = vec![0u8; 8192];
    ready.store(false, SeqCst);
    let before = waited.load(SeqCst);
    assert!(
        vol.read_nowait(12288, &mut buf).is_none(),
        "a block the device would wait for is declined"
    );
    assert_eq!(
        waited.load(SeqCst),
        before,
        "declined without a waiting read"
    );

    ready.store(true, SeqCst);
    // Across a block boundary: two blocks, both served at once.
    vol.read_nowait(12288, &mut buf).unwrap().unwrap();
    assert_eq!(buf, old[12288..12288 + 8192]);
    assert_eq!(waited.load(SeqCst), before, "served without a waiting read");

    // A block dirty in the open txg is served from memory whatever the device says.
    let new = pattern(2, 16384);
    vol.write(65536, &new).unwrap();
    ready.store(false, SeqCst);
    let mut buf = vec![0u8; 4096];
    vol.read_nowait(65536 + 4096, &mut buf).unwrap().unwrap();
    assert_eq!(buf, new[4096..8192]);
    assert_eq!(waited.load(SeqCst), before);

    // Bad requests are answered, not declined.
    let r = vol.read_nowait(4 * MB - 100, &mut buf);
    assert!(matches!(r, Some(Err(_))), "a read past the end is an error");

    // The waiting read of a declined block does reach the device.
    vol.read(12288, &mut buf).unwrap();
    assert_eq!(buf, old[12288..12288 + 4096]);
    assert!(waited.load(SeqCst) > before);
}

/// A short write into a large block is laid over it without reading it (`Dirty::Patch`):
/// no device read before the write returns, and only its own bytes held in memory. Reads
/// see the block with the pieces over it before and after the sync. Pieces that cover
/// their block make it whole without a read; a patch that would hold more than its block is
/// written as a whole block instead (reading it then).
#[test]
fn short_writes_into_large_blocks_read_nothing_until_their_sync() {
    use std::sync::atomic::Ordering::SeqCst;

    const BS: usize = 131072;
    let dev = mem_devs(1, 64 * MB).pop().unwrap();
    let (tap, reads) = Tap::counting_reads(dev);
    let (pool, vol, mut model) = tapped_volume(tap, BS, 16 * BS);
    // Nothing in the block cache: what a block held can only come from the device.
    pool.set_cache_limit(0);
    pool.set_cache_limit(u64::MAX);
    fn write(vol: &Volume, model: &mut [u8], off: usize, len: usize, seed: u64) {
        let data = pattern(seed, len);
        vol.write(off as u64, &data).unwrap();
        model[off..off + len].copy_from_slice(&data);
    }

    let before = reads.load(SeqCst);
    write(&vol, &mut model, 2 * BS + 4096, 4096, 2);
    write(&vol, &mut model, 2 * BS + 6144, 4096, 3); // over part of the first piece
    write(&vol, &mut model, 5 * BS + BS - 512, 1024, 4); // across into block 6
    write(&vol, &mut model, 9 * BS + 8192, 100, 5);
    assert_eq!(reads.load(SeqCst), before, "a short write read its block");
    let held = pool.memory_held();
    assert!(
        (8192..BS as u64).contains(&held),
        "the patches hold {held} bytes, not their blocks'"
    );

    let check = |vol: &Volume, model: &[u8], when: &str| {
        let mut got = vec![0u8; 16 * BS];
        vol.read(0, &mut got).unwrap();
        assert!(got == *model, "{when}: the volume differs from the model");
        // Short reads of patched blocks, the waiting way and the way that waits for none.
        for off in [2 * BS + 4000, 5 * BS + BS - 600, 6 * BS, 9 * BS + 8000] {
            let mut got = vec![0u8; 700];
            vol.read(off as u64, &mut got).unwrap();
            assert!(got == model[off..off + 700], "{when}: read at {off}");
            if let Some(r) = vol.read_nowait(off as u64, &mut got) {
                r.unwrap();
                assert!(got == model[off..off + 700], "{when}: nowait read at {off}");
            }
        }
    };
    check(&vol, &model, "before the sync");

    // Short sequential writes that cover a block make it whole without reading it.
    let before = reads.load(SeqCst);
    for i in 0..8 {
        write(&vol, &mut model, 12 * BS + i * 16384, 16384, 10 + i as u64);
    }
    assert_eq!(reads.load(SeqCst), before, "a covered block was read");
    assert!(pool.memory_held() >= BS as u64);
    check(&vol, &model, "with a covered block");

    // Pieces that overlap in part and would hold more than their block give way to the
    // whole block, which is read for them.
    write(&vol, &mut model, 13 * BS, 49152, 20);
    write(&vol, &mut model, 13 * BS + 40960, 49152, 21);
    let before = reads.load(SeqCst);
    write(&vol, &mut model, 13 * BS + 61440, 49152, 22);
    assert!(
        reads.load(SeqCst) > before,
        "the third piece made a whole block"
    );
    check(&vol, &model, "with a whole block");

    pool.sync_now().unwrap();
    assert_eq!(pool.memory_held(), 0);
    check(&vol, &model, "after the sync");
    pool.set_cache_limit(0);
    pool.set_cache_limit(u64::MAX);
    check(&vol, &model, "read back from the device");
}

/// Pieces written while a txg with earlier pieces of the same block is syncing read as
/// the block with both laid over it, in order, and end up in the next txg as such.
#[test]
fn a_patch_over_a_syncing_patch_reads_as_both() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::{Arc, Condvar, Mutex};
    use zeta::vdev::RESERVE_BYTES;

    const BS: usize = 65536;
    let dev = mem_devs(1, 64 * MB).pop().unwrap();
    // Closed: data writes (past the labels) wait, so a sync stops at its first block.
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let held = Arc::new(AtomicBool::new(false));
    let tap = Tap {
        on_write: {
            let (gate, held) = (gate.clone(), held.clone());
            Box::new(move |_, offset| {
                if offset < RESERVE_BYTES {
                    return;
                }
                let mut closed = gate.0.lock().unwrap();
                while *closed {
                    held.store(true, SeqCst);
                    closed = gate.1.wait(closed).unwrap();
                }
            })
        },
        ..Tap::new(dev)
    };
    let (pool, vol, mut model) = tapped_volume(tap, BS, 4 * BS);

    let a = pattern(2, 8192);
    vol.write((BS + 4096) as u64, &a).unwrap();
    model[BS + 4096..BS + 4096 + 8192].copy_from_slice(&a);
    *gate.0.lock().unwrap() = true;
    std::thread::scope(|s| {
        let syncing = s.spawn(|| pool.sync_now().unwrap());
        while !held.load(SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // The txg with piece `a` is syncing; `b` overlaps it in the open txg.
        let b = pattern(3, 8192);
        vol.write((BS + 8192) as u64, &b).unwrap();
        model[BS + 8192..BS + 8192 + 8192].copy_from_slice(&b);
        let mut got = vec![0u8; 4 * BS];
        let read = vol.read(0, &mut got);
        // Open before any assertion, so a failure does not leave the sync waiting forever.
        *gate.0.lock().unwrap() = false;
        gate.1.notify_all();
        syncing.join().unwrap();
        read.unwrap();
        assert!(got == model, "read while the first patch syncs");
    });
    pool.sync_now().unwrap();
    pool.set_cache_limit(0);
    pool.set_cache_limit(u64::MAX);
    let mut got = vec![0u8; 4 * BS];
    vol.read(0, &mut got).unwrap();
    assert!(got == model, "read back from the device");
}

/// At its sync, a patched block's Fletcher-4 sums follow from its old ones and its pieces'
/// words (`fletcher4_update`), not from a pass over the block. Every block written so must
/// verify from the media after an import, whatever the pieces' alignment and overlap; with
/// another algorithm the sums are computed whole.
#[test]
fn patched_blocks_verify_from_the_media_after_their_sync() {
    use zeta::math::ChecksumKind;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5a);
    for checksum in [None, Some(ChecksumKind::Sha256)] {
        let devs = mem_devs(1, 64 * MB);
        let pool = Pool::create("tank", spec(Layout::Stripe, &devs), opts()).unwrap();
        pool.create_volume("v", 2 * MB, 131072, checksum).unwrap();
        let vol = Volume::open(&pool, "v").unwrap();
        let mut model = vec![0u8; 2 * MB as usize];
        rng.fill(&mut model[..]);
        vol.write(0, &model).unwrap();
        pool.sync_now().unwrap();
        for round in 0..6 {
            for _ in 0..40 {
                // Word-aligned 4K pieces, and pieces at any byte, some overlapping others.
                let (off, len) = if rng.gen_bool(0.5) {
                    (rng.gen_range(0..512u64) * 4096, 4096)
                } else {
                    (rng.gen_range(0..2 * MB - 6000), rng.gen_range(1..6000usize))
                };
                let mut data = vec![0u8; len];
                rng.fill(&mut data[..]);
                vol.write(off, &data).unwrap();
                model[off as usize..off as usize + len].copy_from_slice(&data);
            }
            pool.sync_now()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        pool.close().unwrap();
        drop((vol, pool));
        let pool = import(&devs);
        pool.verify().expect("every block verifies");
        let vol = Volume::open(&pool, "v").unwrap();
        let mut got = vec![0u8; model.len()];
        vol.read(0, &mut got).unwrap();
        assert!(
            got == model,
            "{checksum:?}: the volume reads back as written"
        );
    }
}

/// A pool with a 64M block cache and a volume of 48M in 16K blocks, written (by streaming
/// writes, which leave the cache empty) and synced; returns the data too.
fn cached_volume() -> (std::sync::Arc<Pool>, Volume, Vec<u8>) {
    let pool = Pool::create(
        "tank",
        spec(Layout::Stripe, &mem_devs(1, 256 * MB)),
        zeta::dsl::PoolOptions {
            cache_bytes: 64 * MB,
            ..model_opts()
        },
    )
    .unwrap();
    pool.create_volume("v", 2 * HALF as u64, BS as u32, None)
        .unwrap();
    let vol = Volume::open(&pool, "v").unwrap();
    let model = pattern(1, 2 * HALF);
    vol.write(0, &model).unwrap();
    pool.sync_now().unwrap();
    (pool, vol, model)
}

const BS: usize = 16384;
/// Each half of `cached_volume`'s volume: together they fit its cache, three of them do not.
const HALF: usize = 24 * MB as usize;

/// Reads the first half of `cached_volume`'s volume block by block (a read this long at once
/// would be a streaming one, which does not fill the cache), checks it against `model`, and
/// returns the cache misses it had.
fn read_half(pool: &Pool, vol: &Volume, model: &[u8]) -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    let before = pool.io.cache.misses.load(Relaxed);
    let mut block = vec![0u8; BS];
    for at in (0..HALF).step_by(BS) {
        vol.read(at as u64, &mut block).unwrap();
        assert!(block == model[at..at + BS], "block at {at}");
    }
    pool.io.cache.misses.load(Relaxed) - before
}

/// A sync drops from the block cache the copies it replaces. Its patch of a block looks the
/// old copy up first, which makes that copy as recent as the new one; left to the LRU
/// order, the dead copies of a set rewritten every txg pushed out blocks that readers
/// still use. Here the cache holds 24M that is read and 24M rewritten 4K a block in every
/// txg: the live blocks fit, with the dead copies they would not, and every read of the
/// first 24M after a sync finds it cached.
#[test]
fn blocks_patched_by_a_sync_leave_the_cache_to_live_ones() {
    let (pool, vol, mut model) = cached_volume();
    for round in 0..4u8 {
        let misses = read_half(&pool, &vol, &model);
        if round > 0 {
            assert_eq!(misses, 0, "round {round}: the read half stayed cached");
        }
        for block in (HALF / BS)..(2 * HALF / BS) {
            let at = block * BS + (round as usize % 4) * 4096;
            let piece = [round + 2; 4096];
            vol.write(at as u64, &piece).unwrap();
            model[at..at + 4096].copy_from_slice(&piece);
        }
        pool.sync_now().unwrap();
    }
    let mut all = vec![0u8; 2 * HALF];
    vol.read(0, &mut all).unwrap();
    assert!(all == model);
}

/// The same for whole blocks rewritten: each sync drops the copies it replaces before it
/// caches the new ones, so blocks read once, before several txgs of rewrites elsewhere, are
/// still cached after them.
#[test]
fn blocks_rewritten_whole_leave_the_cache_to_live_ones() {
    let (pool, vol, mut model) = cached_volume();
    read_half(&pool, &vol, &model);
    for round in 0..3u8 {
        for block in (HALF / BS)..(2 * HALF / BS) {
            let at = block * BS;
            let data = pattern(round as u64 + 10 + block as u64, BS);
            vol.write(at as u64, &data).unwrap();
            model[at..at + BS].copy_from_slice(&data);
        }
        pool.sync_now().unwrap();
    }
    assert_eq!(
        read_half(&pool, &vol, &model),
        0,
        "the read half stayed cached"
    );
    let mut all = vec![0u8; 2 * HALF];
    vol.read(0, &mut all).unwrap();
    assert!(all == model);
}

/// A txg whose latest short writes land in blocks it has dirtied already grows to half the
/// dirty limit before it asks for a sync (its sync writes those blocks whole either way); one
/// whose writes dirty fresh blocks asks at a quarter, as before.
#[test]
fn a_txg_of_writes_into_its_dirty_blocks_grows_to_half_the_dirty_limit() {
    const DIRTY: u64 = 16 * MB;
    let o = zeta::dsl::PoolOptions {
        dirty_max_bytes: DIRTY,
        ..model_opts()
    };
    let pool = Pool::create("tank", spec(Layout::Stripe, &mem_devs(1, 256 * MB)), o).unwrap();
    pool.create_volume("big", 32 * MB, 131072, None).unwrap();
    pool.create_volume("small", 32 * MB, 16384, None).unwrap();
    let big = Volume::open(&pool, "big").unwrap();
    let small = Volume::open(&pool, "small").unwrap();
    let synced = pool.synced_txg();
    let settled = || std::thread::sleep(std::time::Duration::from_millis(500));
    let came = |txg: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while pool.synced_txg() == txg && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        pool.synced_txg() > txg
    };
    // A 4K piece in each of the 256 blocks (1M held, 32M of blocks for the sync), then more
    // pieces into the same blocks: held grows, the sync's work does not.
    let piece = |k: u64| (k % 256) * 131072 + (k / 256) * 4096;
    for k in 0..6 * MB / 4096 {
        big.write(piece(k), &pattern(k, 4096)).unwrap();
    }
    settled();
    assert_eq!(
        pool.synced_txg(),
        synced,
        "a sync was asked at 6M held (3/8 of the limit) though its work had stopped growing"
    );
    for k in 6 * MB / 4096..9 * MB / 4096 {
        big.write(piece(k), &pattern(k, 4096)).unwrap();
    }
    assert!(came(synced), "no sync past half the dirty limit");
    pool.sync_now().unwrap();
    // Each 4K write a fresh 16K block: 4 bytes of work per byte held.
    let synced = pool.synced_txg();
    for k in 0..6 * MB / 4096 {
        small
            .write(k * 16384 % (32 * MB), &pattern(k, 4096))
            .unwrap();
    }
    assert!(came(synced), "no sync past a quarter of the dirty limit");
    // And what was written reads back.
    for k in [0, 255, 256, 9 * MB / 4096 - 1] {
        assert_eq!(read(&big, piece(k), 4096), pattern(k, 4096));
    }
}
