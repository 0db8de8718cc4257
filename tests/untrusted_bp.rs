//! Block pointers are untrusted bytes: an indirect block's checksum is in its parent, but a
//! pool image can be crafted whole, every checksum up to the uberblock recomputed. Pointers
//! no writer makes (copies outside their vdev or in its log reserve, sizes no block has,
//! space that is free or freed already) are forged here through the pool's own write path
//! (`Object::forge`), so the chain above them verifies. Reads of them fail naming the volume
//! and the bytes; overwrites, trims, destroys, scrubs and resilvers go on without a panic,
//! leak what they cannot free, and leave the space maps whole (`Pool::verify`, an import).

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use zeta::dmu::object::{walk_from, Forge, ObjectIo, Visit};
use zeta::dsl::{Pool, PoolOptions};
use zeta::spa::scan_state::{ScanFunc, ScanPhase};
use zeta::spa::BlkPtr;
use zeta::vdev::mem::MemDevice;
use zeta::vdev::Injection;
use zeta::zvol::Volume;

const BS: u64 = 4096;
/// 512 blocks of 4K: a tree of three levels, four level-1 blocks of 128 pointers under the
/// root.
const VOL: u64 = 2 * MB;
const DEV: u64 = 64 * MB;

/// No timed txgs: only `sync_now` commits, so each forgery lands in the txg the test means.
fn quiet() -> PoolOptions {
    PoolOptions {
        txg_timeout: Duration::from_secs(3600),
        ..opts()
    }
}

fn reimport(pool: Arc<Pool>, devs: &[Arc<MemDevice>]) -> Arc<Pool> {
    pool.close().unwrap();
    drop(pool);
    Pool::import(as_leaves(devs), None, quiet()).expect("import")
}

/// A pool `tank` of `layout` holding volume `v`, every block written; its devices, and the
/// volume's contents.
fn written(layout: Layout) -> (Vec<Arc<MemDevice>>, Arc<Pool>, Vec<u8>) {
    let devs = mem_devs(devs_for(layout), DEV);
    let pool = Pool::create("tank", spec(layout, &devs), quiet()).unwrap();
    pool.create_volume("v", VOL, BS as u32, None).unwrap();
    let data = pattern(1, VOL as usize);
    let vol = Volume::open(&pool, "v").unwrap();
    vol.write(0, &data).unwrap();
    drop(vol);
    pool.sync_now().unwrap();
    (devs, pool, data)
}

/// Commits one txg in which the pointer to block `idx` of `level` of volume `v` is forged by
/// each `f` (`Object::forge`), the first data block below each rewritten (its first byte
/// flipped in `data`) so that the pointer is written anew.
fn forge_all(pool: &Arc<Pool>, data: &mut [u8], forged: Vec<(u8, u64, Forge)>) {
    let vol = Volume::open(pool, "v").unwrap();
    let ds = pool.dataset("v").unwrap();
    for (level, idx, f) in forged {
        let at = ((idx << (7 * level as u32)) * BS) as usize;
        data[at] ^= 0xff;
        vol.write(at as u64, &data[at..at + BS as usize]).unwrap();
        ds.object.forge(level, idx, f);
    }
    pool.sync_now().unwrap();
    assert_eq!(ds.object.forgeries_pending(), 0, "a forgery missed its txg");
}

/// Where the data area of vdev 0 ends (the log reserve follows).
fn data_end(pool: &Pool) -> u64 {
    pool.io.zio.alloc.lock().tops[0].data_end()
}

/// The offset of 4K that no block takes: the start of the free space of the last metaslab.
fn free_offset(pool: &Pool) -> u64 {
    let alloc = pool.io.zio.alloc.lock();
    let ms = alloc.tops[0].metaslabs.last().unwrap();
    let (start, end) = ms.free.iter().next().expect("free space");
    assert!(end - start >= 4 * BS);
    start
}

/// The current pointer to data block `blkid` of volume `v`.
fn pointer_of(pool: &Arc<Pool>, blkid: u64) -> BlkPtr {
    let dn = pool.dataset("v").unwrap().object.dnode();
    let mut found = None;
    walk_from(
        &pool.io,
        &dn,
        blkid,
        &mut |bp, level, first| {
            if level == 0 && first == blkid {
                found = Some(*bp);
            }
            if found.is_some() {
                Visit::Skip
            } else {
                Visit::Descend
            }
        },
        &mut |_, _, _, e| panic!("{e}"),
    );
    found.expect("block present")
}

fn read_err(vol: &Volume, blkid: u64) -> String {
    let mut b = vec![0u8; BS as usize];
    match vol.read(blkid * BS, &mut b) {
        Ok(()) => panic!("block {blkid} read back"),
        Err(e) => e.to_string(),
    }
}

fn assert_damaged(err: &str, blkid: u64, span: u64, what: &str) {
    let range = format!("bytes {}..{}", blkid * BS, (blkid + span) * BS);
    assert!(
        err.contains("tank/v") && err.contains(&range) && err.contains(what),
        "block {blkid}: wanted {range} and '{what}' in: {err}"
    );
}

#[test]
fn impossible_copies_read_as_damage_of_the_volume_at_their_bytes() {
    let (devs, pool, mut data) = written(Layout::Stripe);
    let end = data_end(&pool);
    let forged: Vec<(u8, u64, Forge)> = vec![
        // In the log reserve, after the data area.
        (0, 5, Box::new(move |bp, _| bp.dva[0].offset = end.into())),
        (0, 6, Box::new(|bp, _| bp.dva[0].vdev = 9.into())),
        // Its end past the numbers: it wrapped to a small one, and passed.
        (
            0,
            7,
            Box::new(|bp, _| bp.dva[0].offset = (u64::MAX - 4095).into()),
        ),
        (0, 8, Box::new(|bp, _| bp.dva[0].asize = 8192.into())),
        (
            0,
            9,
            Box::new(|bp, _| bp.dva[0].offset = (bp.dva[0].offset.get() + 512).into()),
        ),
    ];
    forge_all(&pool, &mut data, forged);
    // From the devices, not from the cache the sync filled.
    let pool = reimport(pool, &devs);
    let vol = Volume::open(&pool, "v").unwrap();
    assert_damaged(&read_err(&vol, 5), 5, 1, "out of range");
    assert_damaged(&read_err(&vol, 6), 6, 1, "unknown vdev 9");
    assert_damaged(&read_err(&vol, 7), 7, 1, "out of range");
    assert_damaged(&read_err(&vol, 8), 8, 1, "takes 8192 bytes");
    assert_damaged(&read_err(&vol, 9), 9, 1, "out of range");
    assert_eq!(
        read(&vol, 10 * BS, BS as usize),
        data[10 * BS as usize..11 * BS as usize]
    );

    pool.start_scrub().unwrap();
    pool.wait_scrub();
    let scan = pool.scan_status();
    assert_eq!(scan.state, ScanPhase::Finished);
    let mut ranges: Vec<(u64, u64)> = scan
        .damaged
        .iter()
        .filter(|d| d.object == "tank/v")
        .map(|d| (d.start / BS, d.end / BS))
        .collect();
    ranges.sort_unstable();
    assert_eq!(
        ranges,
        [(5, 6), (6, 7), (7, 8), (8, 9), (9, 10)],
        "{scan:?}"
    );
    drop(vol);
    pool.close().unwrap();
}

#[test]
fn frees_of_impossible_or_free_copies_are_refused_and_the_space_maps_stay_whole() {
    let (devs, pool, mut data) = written(Layout::Stripe);
    let (end, free) = (data_end(&pool), free_offset(&pool));
    let twin = pointer_of(&pool, 9);
    let forged: Vec<(u8, u64, Forge)> = vec![
        (0, 5, Box::new(move |bp, _| bp.dva[0].offset = end.into())),
        (0, 6, Box::new(|bp, _| bp.dva[0].vdev = 9.into())),
        (0, 7, Box::new(move |bp, _| bp.dva[0].offset = free.into())),
        // Block 9's copy, twice in the tree: the second free of it is one too many.
        (0, 8, Box::new(move |bp, _| *bp = twin)),
    ];
    forge_all(&pool, &mut data, forged);
    let pool = reimport(pool, &devs);
    let refused = |pool: &Pool| pool.io.zio.stats.refused_frees.load(Ordering::Relaxed);
    assert_eq!(refused(&pool), 0);

    // Overwrites of 5, 6, 8 and 9 and a trim of 7 free what the tree pointed at.
    let vol = Volume::open(&pool, "v").unwrap();
    let new = pattern(2, 5 * BS as usize);
    vol.write(5 * BS, &new[..2 * BS as usize]).unwrap();
    vol.trim(7 * BS, BS).unwrap();
    vol.write(8 * BS, &new[3 * BS as usize..]).unwrap();
    pool.sync_now().expect("the sync survives the frees");
    let notes = pool.io.zio.refused_frees().join("\n");
    assert_eq!(refused(&pool), 4, "{notes}");
    for what in [
        "out of range",
        "unknown vdev 9",
        "free space",
        "freed already",
    ] {
        assert!(notes.contains(what), "'{what}' not in:\n{notes}");
    }
    assert_eq!(read(&vol, 5 * BS, 2 * BS as usize), new[..2 * BS as usize]);
    assert_eq!(read(&vol, 7 * BS, BS as usize), vec![0u8; BS as usize]);
    assert_eq!(read(&vol, 8 * BS, 2 * BS as usize), new[3 * BS as usize..]);
    drop(vol);
    for _ in 0..3 {
        pool.sync_now().unwrap(); // the deferred frees return
    }
    pool.verify().expect("verify");
    // The space maps replay without a contradiction.
    let pool = reimport(pool, &devs);
    pool.verify().expect("verify after import");

    // A volume destroyed with a pointer into free space in it.
    let free = free_offset(&pool);
    let mut data = read_volume(&pool);
    let forged: Vec<(u8, u64, Forge)> =
        vec![(0, 20, Box::new(move |bp, _| bp.dva[0].offset = free.into()))];
    forge_all(&pool, &mut data, forged);
    let pool = reimport(pool, &devs);
    pool.destroy_volume("v").unwrap();
    pool.sync_now().expect("the destroy's sync survives");
    assert_eq!(refused(&pool), 1, "{:?}", pool.io.zio.refused_frees());
    for _ in 0..3 {
        pool.sync_now().unwrap();
    }
    pool.verify().expect("verify after the destroy");
    let pool = reimport(pool, &devs);
    pool.verify().expect("verify after import");
    pool.close().unwrap();
}

#[test]
fn an_unreadable_indirect_block_loses_the_writes_below_it_and_nothing_else() {
    let (devs, pool, mut data) = written(Layout::Stripe);
    let end = data_end(&pool);
    // The pointer to the level-1 block of blocks 128..256, in the root.
    let forged: Vec<(u8, u64, Forge)> = vec![(
        1,
        1,
        Box::new(move |bp, _| {
            bp.dva[0].offset = end.into();
            bp.dva[1].offset = (end + 16384).into();
        }),
    )];
    forge_all(&pool, &mut data, forged);
    let pool = reimport(pool, &devs);
    let vol = Volume::open(&pool, "v").unwrap();
    assert_damaged(&read_err(&vol, 200), 200, 1, "out of range");
    let whole = |from: u64, to: u64| (from * BS) as usize..(to * BS) as usize;
    assert_eq!(read(&vol, 0, 128 * BS as usize), data[whole(0, 128)]);
    assert_eq!(
        read(&vol, 256 * BS, 256 * BS as usize),
        data[whole(256, 512)]
    );

    // A write below it cannot be made without the block's other pointers: it is lost, and
    // the block still reads as damage, not as zeros; a write elsewhere goes on as ever.
    let new = pattern(3, BS as usize);
    vol.write(130 * BS, &new).unwrap();
    vol.write(10 * BS, &new).unwrap();
    pool.sync_now()
        .expect("the sync survives the unreadable parent");
    assert_eq!(pool.io.zio.stats.lost_writes.load(Ordering::Relaxed), 1);
    assert_damaged(&read_err(&vol, 130), 130, 1, "out of range");
    assert_eq!(read(&vol, 10 * BS, BS as usize), new);
    drop(vol);
    let pool = reimport(pool, &devs);
    let vol = Volume::open(&pool, "v").unwrap();
    assert_eq!(read(&vol, 10 * BS, BS as usize), new);
    assert_damaged(&read_err(&vol, 130), 130, 1, "out of range");
    drop(vol);

    // Destroyed, it leaks what lies below the block, and says so.
    pool.destroy_volume("v").unwrap();
    pool.sync_now().expect("the destroy's sync survives");
    let notes = pool.io.zio.refused_frees().join("\n");
    assert!(notes.contains("leaked"), "{notes}");
    for _ in 0..3 {
        pool.sync_now().unwrap();
    }
    pool.verify().expect("verify");
    let pool = reimport(pool, &devs);
    pool.verify().expect("verify after import");
    pool.close().unwrap();
}

/// The pointer to the level-1 block of blocks 256..384 made half its size, with the
/// checksum of its first half: every copy verifies, but it holds 64 pointers, not 128.
fn halved(bp: &mut BlkPtr, io: &ObjectIo) {
    let block = io.read_bp(bp).unwrap();
    let kind = bp.checksum_kind().unwrap();
    bp.psize = 8192.into();
    bp.lsize = 8192.into();
    bp.checksum = kind.compute(&block[..8192]).0;
    for d in bp.dva.iter_mut().filter(|d| !d.is_empty()) {
        d.asize = 8192.into();
    }
}

#[test]
fn an_indirect_block_of_impossible_size_is_damage_to_reads_and_scrubs() {
    let (devs, pool, mut data) = written(Layout::Stripe);
    forge_all(&pool, &mut data, vec![(1, 2, Box::new(halved))]);
    let pool = reimport(pool, &devs);
    let vol = Volume::open(&pool, "v").unwrap();
    // Slot 124 lies past the end of a block of 8K.
    assert_damaged(&read_err(&vol, 380), 380, 1, "8192 bytes");
    drop(vol);
    pool.start_scrub().unwrap();
    pool.wait_scrub();
    let scan = pool.scan_status();
    assert_eq!(scan.state, ScanPhase::Finished);
    assert!(
        scan.damaged.iter().any(|d| d.object == "tank/v"
            && (d.start, d.end) == (256 * BS, 384 * BS)
            && d.error.contains("8192 bytes")),
        "{scan:?}"
    );
    pool.close().unwrap();
}

#[test]
fn a_resilver_that_cannot_read_an_indirect_block_leaves_its_range_owed() {
    let (_devs, pool, mut data) = written(Layout::Mirror);
    // mem1 misses a txg: its file system is full (NOSPACE, not faulted).
    let full = Injection {
        full: true,
        ..Default::default()
    };
    pool.inject("mem1", full).unwrap();
    let vol = Volume::open(&pool, "v").unwrap();
    let new = pattern(4, BS as usize);
    vol.write(130 * BS, &new).unwrap();
    pool.sync_now().unwrap();
    let missed = pool.synced_txg();
    pool.inject("mem1", Injection::default()).unwrap();
    let mem1 = pool.io.zio.tops[0].children[1].clone();
    assert!(mem1.missed.lock().contains(missed));
    // The next txg, which mem1 takes whole, points the root at the level-1 block above
    // block 130 through a pointer that cannot be read. Born after the txg mem1 missed, it
    // is not one the resilver rewrites, but what lies below it may be.
    let end = data_end(&pool);
    let forged: Vec<(u8, u64, Forge)> = vec![(
        1,
        1,
        Box::new(move |bp, _| {
            bp.dva[0].offset = end.into();
            bp.dva[1].offset = (end + 16384).into();
        }),
    )];
    forge_all(&pool, &mut data, forged);
    pool.start_resilver();
    pool.wait_scrub();
    let scan = pool.scan_status();
    assert_eq!(
        (scan.func, scan.state),
        (ScanFunc::Resilver, ScanPhase::Finished),
        "{scan:?}"
    );
    assert!(
        scan.damaged.iter().any(|d| d.object == "tank/v"
            && (d.start, d.end) == (128 * BS, 256 * BS)
            && d.error.contains("out of range")),
        "{scan:?}"
    );
    assert!(
        mem1.missed.lock().contains(missed),
        "mem1 was declared whole for blocks it never got"
    );
    // Later txgs keep it owed (the rule that no resilver starts again by itself for it is
    // `dsl::scan`'s unit test).
    for _ in 0..3 {
        vol.write(0, &new).unwrap();
        pool.sync_now().unwrap();
    }
    pool.wait_scrub();
    assert_eq!(pool.scan_status().state, ScanPhase::Finished);
    assert!(mem1.missed.lock().contains(missed));
    drop(vol);
    pool.close().unwrap();
}
