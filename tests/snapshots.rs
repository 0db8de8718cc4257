//! Snapshots: a snapshot reads as its volume was when it was taken while the head changes,
//! survives export, import and a power cut, is scrubbed and repaired like a volume, and is
//! never written; destroying snapshots in any order frees exactly the blocks no other tree
//! holds (the pool's allocated space equals what its trees reach after every step), with
//! `referenced`, `written`, `unique` and `usedbysnapshots` recounted by `verify`.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use zeta::dsl::{Pool, PoolError};
use zeta::vdev::mem::MemDevice;
use zeta::vdev::RESERVE_BYTES;
use zeta::zvol::{VolError, Volume};

const VOL: u64 = 4 * MB;
const BS: u64 = 16384;

fn mirror_pool() -> (Vec<Arc<MemDevice>>, Arc<Pool>) {
    let devs = mem_devs(2, 64 * MB);
    let pool = Pool::create("tank", spec(Layout::Mirror, &devs), opts()).unwrap();
    pool.create_volume("v", VOL, BS as u32, None).unwrap();
    (devs, pool)
}

/// Commits everything and checks that every allocated byte is reached by exactly one tree
/// (the pool at rest), and every figure `verify` recounts.
fn at_rest(pool: &Pool) {
    pool.sync_frees().unwrap();
    let (reach, space) = pool.verify_space().unwrap();
    assert_eq!(
        reach, space.alloc,
        "allocated space no tree reaches, or reached twice"
    );
}

fn read_all(pool: &Arc<Pool>, name: &str) -> Vec<u8> {
    let vol = Volume::open(pool, name).unwrap();
    read(&vol, 0, vol.size() as usize)
}

#[test]
fn a_snapshot_keeps_what_the_volume_held_while_the_head_changes() {
    let (devs, pool) = mirror_pool();
    let vol = Volume::open(&pool, "v").unwrap();
    let a = pattern(1, VOL as usize);
    vol.write(0, &a).unwrap();
    vol.flush().unwrap();
    pool.snapshot(&["v@a"]).unwrap();
    let b = pattern(2, VOL as usize / 2);
    vol.write(0, &b).unwrap();
    pool.snapshot(&["v@b"]).unwrap();
    let c = pattern(3, VOL as usize / 4);
    vol.write(VOL - VOL / 4, &c).unwrap();
    vol.flush().unwrap();
    let mut at_b = a.clone();
    at_b[..b.len()].copy_from_slice(&b);
    let mut head = at_b.clone();
    head[(VOL - VOL / 4) as usize..].copy_from_slice(&c);
    assert_eq!(read_all(&pool, "v@a"), a);
    assert_eq!(read_all(&pool, "v@b"), at_b);
    assert_eq!(read(&vol, 0, VOL as usize), head);
    at_rest(&pool);

    // Figures (a mirror's space counts once): v@a was written whole, and holds alone the
    // first half, which v@b does not hold (with the indirect blocks over it).
    let fa = pool.snapshot_dataset("v@a").unwrap().figures();
    let fb = pool.snapshot_dataset("v@b").unwrap().figures();
    assert!(
        fa.referenced >= VOL && fa.written == fa.referenced,
        "{fa:?}"
    );
    assert!(
        fa.unique >= VOL / 2 && fa.unique < VOL / 2 + VOL / 8,
        "{fa:?}"
    );
    assert!(
        fb.written >= VOL / 2 && fb.written < fb.referenced,
        "{fb:?}"
    );
    // The head let go of the last quarter since, which v@a holds too: v@b alone holds only
    // indirect blocks.
    assert!(fb.unique > 0 && fb.unique < VOL / 8, "{fb:?}");
    let fh = pool.dataset("v").unwrap().figures();
    assert_eq!(fh.snapshots, 2);
    let shared = fh.usedbysnapshots - fa.unique - fb.unique;
    assert!((VOL / 4..VOL / 4 + VOL / 8).contains(&shared), "{fh:?}");
    assert!(fh.written >= VOL / 4 && fh.written < VOL / 2, "{fh:?}");

    // A snapshot is never written, by any path.
    let snap = Volume::open(&pool, "v@a").unwrap();
    assert!(snap.read_only());
    for r in [
        snap.write(0, &[1u8; 4096]),
        snap.trim(0, BS),
        snap.write_zeroes(0, BS, true),
    ] {
        match r {
            Err(VolError::Pool {
                source: PoolError::ReadOnlySnapshot(_),
                ..
            }) => {}
            other => panic!("a snapshot took a change: {other:?}"),
        }
    }
    drop(snap);
    // Names: taken twice, of no volume, badly formed.
    assert!(matches!(
        pool.snapshot(&["v@a"]),
        Err(PoolError::SnapshotExists(_))
    ));
    assert!(matches!(
        pool.snapshot(&["w@a"]),
        Err(PoolError::NoSuchVolume(_))
    ));
    for bad in ["v", "v@", "v@a b", "v@x@y"] {
        assert!(pool.snapshot(&[bad]).is_err(), "{bad}");
    }
    let e = pool.destroy_volume("v").unwrap_err().to_string();
    assert!(e.contains("has 2 snapshot") && e.contains("v@a"), "{e}");

    drop(vol);
    pool.close().unwrap();
    drop(pool);
    let pool = import(&devs);
    assert_eq!(read_all(&pool, "v@a"), a);
    assert_eq!(read_all(&pool, "v@b"), at_b);
    assert_eq!(read_all(&pool, "v"), head);
    assert_eq!(pool.snapshot_dataset("v@a").unwrap().figures(), fa);
    at_rest(&pool);
    // The head goes on letting go of blocks its snapshots hold after the import.
    let vol = Volume::open(&pool, "v").unwrap();
    vol.write(0, &c).unwrap();
    vol.flush().unwrap();
    drop(vol);
    assert_eq!(read_all(&pool, "v@b"), at_b);
    at_rest(&pool);
}

#[test]
fn snapshots_of_several_volumes_are_taken_in_one_txg() {
    let (_devs, pool) = mirror_pool();
    pool.create_volume("w", VOL, 8192, None).unwrap();
    for (name, seed) in [("v", 4), ("w", 5)] {
        let vol = Volume::open(&pool, name).unwrap();
        vol.write(0, &pattern(seed, VOL as usize)).unwrap();
        vol.flush().unwrap();
    }
    pool.snapshot(&["v@s", "w@s"]).unwrap();
    let (v, w) = (
        pool.snapshot_dataset("v@s").unwrap(),
        pool.snapshot_dataset("w@s").unwrap(),
    );
    assert_eq!(v.figures().creation_txg, w.figures().creation_txg);
    assert_eq!(pool.snapshots().len(), 2);
    // One bad name refuses them all.
    assert!(pool.snapshot(&["v@t", "w@s"]).is_err());
    assert!(pool.snapshot_dataset("v@t").is_err());
    at_rest(&pool);
}

/// Random writes, snapshots and destroys against a model of every tree: after each step the
/// snapshots read as the model says, and the pool's allocated space is exactly what its
/// trees reach. At the end, with every snapshot gone, the pool holds the head alone.
#[test]
fn destroying_snapshots_in_any_order_frees_exactly_what_they_alone_held() {
    for seed in 0..6u64 {
        let (devs, pool) = mirror_pool();
        let mut rng = StdRng::seed_from_u64(seed);
        let vol = Volume::open(&pool, "v").unwrap();
        let mut head = vec![0u8; VOL as usize];
        let mut snaps: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let mut n = 0;
        for step in 0..40 {
            match rng.gen_range(0..10) {
                0..=5 => {
                    let blocks = VOL / BS;
                    let first = rng.gen_range(0..blocks);
                    let count = rng.gen_range(1..=(blocks - first).min(24));
                    let mut data = vec![0u8; (count * BS) as usize];
                    rng.fill_bytes(&mut data);
                    let at = (first * BS) as usize;
                    vol.write(at as u64, &data).unwrap();
                    head[at..at + data.len()].copy_from_slice(&data);
                    if rng.gen_bool(0.3) {
                        vol.flush().unwrap();
                        pool.sync_now().unwrap();
                    }
                }
                6 | 7 => {
                    n += 1;
                    let name = format!("v@s{n}");
                    pool.snapshot(&[&name]).unwrap();
                    snaps.insert(name, head.clone());
                }
                _ => {
                    if let Some(name) = snaps
                        .keys()
                        .nth(rng.gen_range(0..snaps.len().max(1)))
                        .cloned()
                    {
                        pool.destroy_snapshot(&name).unwrap();
                        snaps.remove(&name);
                        assert!(pool.snapshot_dataset(&name).is_err());
                        at_rest(&pool);
                    }
                }
            }
            if step % 10 == 9 {
                at_rest(&pool);
                for (name, want) in &snaps {
                    assert!(
                        read_all(&pool, name) == *want,
                        "seed {seed} step {step}: {name}"
                    );
                }
            }
        }
        at_rest(&pool);
        // Export and import keep it all.
        drop(vol);
        pool.close().unwrap();
        drop(pool);
        let pool = import(&devs);
        at_rest(&pool);
        for (name, want) in &snaps {
            assert!(
                read_all(&pool, name) == *want,
                "seed {seed}, after import: {name}"
            );
        }
        let names: Vec<String> = snaps.keys().cloned().collect();
        for name in names {
            pool.destroy_snapshot(&name).unwrap();
            at_rest(&pool);
        }
        let f = pool.dataset("v").unwrap().figures();
        assert_eq!(
            (f.usedbysnapshots, f.snapshots),
            (0, 0),
            "seed {seed}: {f:?}"
        );
        assert!(read_all(&pool, "v") == head, "seed {seed}: the head");
        // With no snapshot left, an overwrite frees what it replaces again.
        let before = pool.space().alloc;
        let vol = Volume::open(&pool, "v").unwrap();
        vol.write(0, &pattern(9, VOL as usize)).unwrap();
        vol.flush().unwrap();
        drop(vol);
        at_rest(&pool);
        let after = pool.space().alloc;
        assert!(after <= before + VOL, "seed {seed}: {before} -> {after}");
        pool.destroy_volume("v").unwrap();
        at_rest(&pool);
    }
}

#[test]
fn a_snapshot_survives_a_power_cut_and_the_head_replays_after_it() {
    let (devs, pool) = mirror_pool();
    let vol = Volume::open(&pool, "v").unwrap();
    let a = pattern(6, VOL as usize);
    vol.write(0, &a).unwrap();
    pool.snapshot(&["v@a"]).unwrap();
    let b = pattern(7, 64 * 1024);
    vol.write(0, &b).unwrap();
    vol.flush().unwrap(); // in the log, not yet in a txg
    let cut = power_cut(&devs, zeta::vdev::mem::PowerCut::DropUnflushed);
    drop(vol);
    drop(pool);
    let pool = import(&cut);
    assert_eq!(read_all(&pool, "v@a"), a);
    let mut head = a.clone();
    head[..b.len()].copy_from_slice(&b);
    assert_eq!(read_all(&pool, "v"), head);
    at_rest(&pool);
    assert_eq!(read_all(&pool, "v@a"), a);
}

/// A block only a snapshot holds is scrubbed: rotted on one side of a mirror, the scrub
/// repairs it, and the snapshot reads right with the other side gone.
#[test]
fn a_scrub_checks_and_repairs_blocks_only_a_snapshot_holds() {
    let (devs, pool) = mirror_pool();
    let vol = Volume::open(&pool, "v").unwrap();
    let a = pattern(8, VOL as usize);
    vol.write(0, &a).unwrap();
    pool.snapshot(&["v@a"]).unwrap();
    vol.write(0, &pattern(9, VOL as usize)).unwrap();
    vol.flush().unwrap();
    drop(vol);
    pool.sync_frees().unwrap();
    // Every data block of the snapshot: none is the head's any more.
    let snap = pool.snapshot_dataset("v@a").unwrap();
    let mut offsets = Vec::new();
    zeta::dmu::object::walk(&pool.io, &snap.object.dnode(), &mut |bp, level| {
        if level == 0 {
            offsets.push(bp.dva[0].offset.get());
        }
        Ok(())
    })
    .unwrap();
    drop(snap);
    assert_eq!(offsets.len() as u64, VOL / BS);
    for &off in offsets.iter().step_by(16) {
        devs[0].corrupt(RESERVE_BYTES + off, &[0xA5; 4096]);
    }
    pool.start_scrub().unwrap();
    pool.wait_scrub();
    let st = pool.scan_status();
    assert_eq!(st.errors, 0, "{st:?}");
    assert!(
        st.repaired_bytes >= 4096 * offsets.len() as u64 / 16,
        "{st:?}"
    );
    pool.close().unwrap();
    drop(pool);
    // Side 1 alone: the repaired side 0 must hold every block now.
    let pool = Pool::import(as_leaves(&devs[..1]), None, opts()).unwrap();
    assert_eq!(read_all(&pool, "v@a"), a);
}

/// A rollback: refused past a newer snapshot and while the volume is open; then the volume
/// reads as the snapshot, takes writes again, frees what it wrote since, and after a power cut
/// nothing of what the old intent log held (written after the snapshot) comes back.
#[test]
fn a_rollback_returns_the_volume_to_its_latest_snapshot_and_forgets_its_log() {
    let (devs, pool) = mirror_pool();
    let vol = Volume::open(&pool, "v").unwrap();
    let a = pattern(10, VOL as usize);
    vol.write(0, &a).unwrap();
    pool.snapshot(&["v@a"]).unwrap();
    vol.write(0, &pattern(11, VOL as usize)).unwrap();
    pool.snapshot(&["v@b"]).unwrap();
    let e = pool.rollback("v@a").unwrap_err().to_string();
    assert!(e.contains("not the latest") && e.contains("v@b"), "{e}");
    pool.destroy_snapshot("v@b").unwrap();
    // Written and flushed: in the intent log, and in no txg the rollback keeps.
    vol.write(VOL / 2, &pattern(12, 256 * 1024)).unwrap();
    vol.flush().unwrap();
    let e = pool.rollback("v@a").unwrap_err().to_string();
    assert!(e.contains("is open (1 handle"), "{e}");
    assert!(pool.dataset("v").unwrap().figures().usedbysnapshots > 0);
    drop(vol);
    pool.rollback("v@a").unwrap();
    assert_eq!(read_all(&pool, "v"), a);
    let f = pool.dataset("v").unwrap().figures();
    assert_eq!((f.written, f.usedbysnapshots), (0, 0), "{f:?}");
    at_rest(&pool);
    // The snapshot stays, and the volume goes on from it.
    let vol = Volume::open(&pool, "v").unwrap();
    let b = pattern(13, 64 * 1024);
    vol.write(0, &b).unwrap();
    vol.flush().unwrap();
    let cut = power_cut(&devs, zeta::vdev::mem::PowerCut::DropUnflushed);
    drop(vol);
    drop(pool);
    let pool = import(&cut);
    let mut head = a.clone();
    head[..b.len()].copy_from_slice(&b);
    assert!(
        read_all(&pool, "v") == head,
        "only the write after the rollback replays"
    );
    assert_eq!(read_all(&pool, "v@a"), a);
    at_rest(&pool);
    // Rolled back again: the write after the first rollback goes too.
    pool.rollback("v@a").unwrap();
    assert_eq!(read_all(&pool, "v"), a);
    at_rest(&pool);
}

/// A clone reads as its origin, takes writes of its own while the origin's volume goes on
/// apart, keeps the origin from being destroyed (named in the refusal), takes snapshots,
/// rollbacks and snapshot destroys of its own, survives export and import, and once it and
/// every snapshot are gone the pool holds the first volume alone; `verify` recounts what the
/// clone shares with its origin at every step.
#[test]
fn a_clone_shares_its_origin_and_lives_apart_from_it() {
    let (devs, pool) = mirror_pool();
    let vol = Volume::open(&pool, "v").unwrap();
    let a = pattern(20, VOL as usize);
    vol.write(0, &a).unwrap();
    vol.flush().unwrap();
    pool.snapshot(&["v@a"]).unwrap();
    pool.sync_frees().unwrap();
    let before = pool.space().alloc;
    pool.clone_snapshot("v@a", "c").unwrap();
    assert!(
        pool.space().alloc < before + 64 * 1024,
        "a clone takes no copy"
    );
    assert_eq!(pool.origin_of("c").as_deref(), Some("v@a"));
    assert_eq!(read_all(&pool, "c"), a);
    let f = pool.dataset("c").unwrap().figures();
    assert_eq!(
        f.origin_shared, f.referenced,
        "all of it is the origin's: {f:?}"
    );
    at_rest(&pool);

    // Each goes its own way.
    let c = Volume::open(&pool, "c").unwrap();
    let b = pattern(21, VOL as usize / 4);
    c.write(0, &b).unwrap();
    c.flush().unwrap();
    vol.write(VOL / 2, &pattern(22, VOL as usize / 4)).unwrap();
    vol.flush().unwrap();
    let mut want_c = a.clone();
    want_c[..b.len()].copy_from_slice(&b);
    assert!(read(&c, 0, VOL as usize) == want_c);
    assert_eq!(read_all(&pool, "v@a"), a);
    at_rest(&pool);
    let f = pool.dataset("c").unwrap().figures();
    assert!(
        f.origin_shared < f.referenced && f.written >= VOL / 4,
        "{f:?}"
    );

    let e = pool.destroy_snapshot("v@a").unwrap_err().to_string();
    assert!(e.contains("clone") && e.contains("'tank/c'"), "{e}");

    // The clone's own snapshots, destroy and rollback.
    pool.snapshot(&["c@1"]).unwrap();
    c.write(VOL - BS, &[7u8; BS as usize]).unwrap();
    c.flush().unwrap();
    pool.snapshot(&["c@2"]).unwrap();
    c.write(BS, &[8u8; BS as usize]).unwrap();
    c.flush().unwrap();
    at_rest(&pool);
    pool.destroy_snapshot("c@1").unwrap();
    at_rest(&pool);
    drop(c);
    pool.rollback("c@2").unwrap();
    let mut at_2 = want_c.clone();
    at_2[(VOL - BS) as usize..].copy_from_slice(&[7u8; BS as usize]);
    assert!(read_all(&pool, "c") == at_2);
    at_rest(&pool);

    drop(vol);
    pool.close().unwrap();
    drop(pool);
    let pool = import(&devs);
    assert!(read_all(&pool, "c") == at_2);
    assert_eq!(read_all(&pool, "v@a"), a);
    assert_eq!(pool.origin_of("c").as_deref(), Some("v@a"));
    at_rest(&pool);
    // Rewritten whole, the clone shares nothing with its origin any more.
    let c = Volume::open(&pool, "c").unwrap();
    c.write(0, &pattern(23, VOL as usize)).unwrap();
    c.flush().unwrap();
    drop(c);
    at_rest(&pool);
    assert!(pool.snapshot_dataset("c@2").unwrap().figures().unique > 0);

    pool.destroy_snapshot("c@2").unwrap();
    at_rest(&pool);
    assert_eq!(pool.dataset("c").unwrap().figures().origin_shared, 0);
    pool.destroy_volume("c").unwrap();
    at_rest(&pool);
    pool.destroy_snapshot("v@a").unwrap();
    at_rest(&pool);
    assert!(pool.snapshots().is_empty());
    let f = pool.dataset("v").unwrap().figures();
    assert_eq!(f.usedbysnapshots, 0);
    // Names: taken, invalid, of no snapshot.
    pool.snapshot(&["v@b"]).unwrap();
    assert!(matches!(
        pool.clone_snapshot("v@b", "v"),
        Err(PoolError::VolumeExists(_))
    ));
    assert!(pool.clone_snapshot("v@b", "bad name").is_err());
    assert!(matches!(
        pool.clone_snapshot("v@zz", "d"),
        Err(PoolError::NoSuchSnapshot(_))
    ));
}

/// Promotion: a clone (of a volume that is itself a clone) takes the snapshots of its
/// origin's volume up to its origin, and that volume becomes its clone, so the old volume
/// can go while the clone lives on; refused for a volume that is no clone, over a snapshot
/// name the clone has already, and while a snapshot that would move is open. Every tree
/// reads as it did, and the accounts are exact after every step and after an import.
#[test]
fn a_promoted_clone_outlives_the_volume_it_was_cloned_from() {
    let (devs, pool) = mirror_pool();
    let write = |name: &str, at: u64, data: &[u8]| {
        let v = Volume::open(&pool, name).unwrap();
        v.write(at, data).unwrap();
        v.flush().unwrap();
    };
    let chunk = VOL as usize / 8;
    write("v", 0, &pattern(30, VOL as usize));
    pool.snapshot(&["v@base"]).unwrap();
    pool.clone_snapshot("v@base", "w").unwrap();
    write("w", 0, &pattern(31, chunk));
    pool.snapshot(&["w@a"]).unwrap();
    write("w", chunk as u64, &pattern(32, chunk));
    pool.snapshot(&["w@b"]).unwrap();
    write("w", 2 * chunk as u64, &pattern(33, chunk));
    pool.snapshot(&["w@c"]).unwrap();
    write("w", 0, &pattern(34, 3 * chunk));
    pool.clone_snapshot("w@b", "c").unwrap();
    write("c", 3 * chunk as u64, &pattern(35, chunk));
    write("c", chunk as u64 / 2, &pattern(36, chunk));
    pool.snapshot(&["c@a"]).unwrap();
    write("c", 5 * chunk as u64, &pattern(37, chunk));
    at_rest(&pool);
    let names = ["v", "v@base", "w", "w@a", "w@b", "w@c", "c", "c@a"];
    let want: BTreeMap<&str, Vec<u8>> = names.iter().map(|&n| (n, read_all(&pool, n))).collect();

    let e = pool.promote("v").unwrap_err().to_string();
    assert!(e.contains("not a clone"), "{e}");
    let e = pool.promote("c").unwrap_err().to_string();
    assert!(e.contains("'tank/c@a' exists"), "{e}");
    pool.destroy_snapshot("c@a").unwrap();
    let open = Volume::open(&pool, "w@a").unwrap();
    let e = pool.promote("c").unwrap_err().to_string();
    assert!(e.contains("in use"), "{e}");
    drop(open);
    let usedsnap = |v: &str| pool.dataset(v).unwrap().figures().usedbysnapshots;
    let (w_snaps, c_snaps) = (usedsnap("w"), usedsnap("c"));

    pool.promote("c").unwrap();
    at_rest(&pool);
    assert_eq!(pool.origin_of("c").as_deref(), Some("v@base"));
    assert_eq!(pool.origin_of("w").as_deref(), Some("c@b"));
    let moved = |n: &str| n.replace("w@a", "c@a").replace("w@b", "c@b");
    for n in names.iter().filter(|&&n| n != "c@a") {
        assert!(read_all(&pool, &moved(n)) == want[n], "{n}");
    }
    assert!(pool.snapshot_dataset("w@a").is_err());
    assert!(
        usedsnap("w") < w_snaps && usedsnap("c") > c_snaps,
        "what the snapshots hold moved with them"
    );
    // Now the old volume goes, and the clone holds what it needs.
    let e = pool.destroy_snapshot("c@b").unwrap_err().to_string();
    assert!(e.contains("'tank/w'"), "{e}");
    pool.destroy_snapshot("w@c").unwrap();
    pool.destroy_volume("w").unwrap();
    at_rest(&pool);
    pool.destroy_snapshot("c@a").unwrap();
    at_rest(&pool);
    pool.close().unwrap();
    drop(pool);
    let pool = import(&devs);
    at_rest(&pool);
    for n in ["v", "v@base", "c", "c@b"] {
        assert!(
            read_all(&pool, n) == want[n.replace("c@b", "w@b").as_str()],
            "{n}"
        );
    }
    // Back the other way: the first volume, promoted over its clone, frees it to go.
    pool.destroy_snapshot("c@b").unwrap();
    pool.promote("c").unwrap();
    assert_eq!(pool.origin_of("v").as_deref(), Some("c@base"));
    at_rest(&pool);
    pool.destroy_volume("v").unwrap();
    at_rest(&pool);
    assert!(read_all(&pool, "c") == want["c"]);
    assert!(read_all(&pool, "c@base") == want["v@base"]);
}

/// Random writes, snapshots, clones, promotions, destroys and rollbacks over a volume and its
/// clones,
/// against a model of every volume and snapshot: each reads as the model says, and after
/// every step the pool's allocated space is what its trees reach, with every figure recounted.
#[test]
fn clones_snapshots_and_rollbacks_in_any_order_keep_the_accounts_exact() {
    let mut promoted = 0;
    for seed in 0..6u64 {
        let (devs, pool) = mirror_pool();
        let mut rng = StdRng::seed_from_u64(100 + seed);
        let mut heads: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let mut snaps: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        heads.insert("v".into(), vec![0u8; VOL as usize]);
        let mut n = 0;
        for step in 0..60 {
            n += 1;
            let vols: Vec<String> = heads.keys().cloned().collect();
            let vol = vols[rng.gen_range(0..vols.len())].clone();
            let snaps_of = |v: &str, s: &BTreeMap<String, Vec<u8>>| -> Vec<String> {
                let mut l: Vec<String> = (s.keys())
                    .filter(|k| k.split('@').next() == Some(v))
                    .cloned()
                    .collect();
                l.sort_by_key(|k| pool.snapshot_dataset(k).unwrap().created_txg);
                l
            };
            match rng.gen_range(0..13) {
                0..=4 => {
                    let first = rng.gen_range(0..VOL / BS);
                    let count = rng.gen_range(1..=(VOL / BS - first).min(16));
                    let mut data = vec![0u8; (count * BS) as usize];
                    rng.fill_bytes(&mut data);
                    let v = Volume::open(&pool, &vol).unwrap();
                    v.write(first * BS, &data).unwrap();
                    v.flush().unwrap();
                    let at = (first * BS) as usize;
                    heads.get_mut(&vol).unwrap()[at..at + data.len()].copy_from_slice(&data);
                }
                5 | 6 => {
                    let name = format!("{vol}@s{n}");
                    pool.snapshot(&[&name]).unwrap();
                    snaps.insert(name, heads[&vol].clone());
                }
                7 if !snaps.is_empty() => {
                    let s = snaps
                        .keys()
                        .nth(rng.gen_range(0..snaps.len()))
                        .unwrap()
                        .clone();
                    let c = format!("c{n}");
                    pool.clone_snapshot(&s, &c).unwrap();
                    heads.insert(c, snaps[&s].clone());
                }
                8 | 9 if !snaps.is_empty() => {
                    let s = snaps
                        .keys()
                        .nth(rng.gen_range(0..snaps.len()))
                        .unwrap()
                        .clone();
                    let has_clones = pool.snapshot_dataset(&s).is_ok()
                        && heads
                            .keys()
                            .any(|h| pool.origin_of(h).as_deref() == Some(&s));
                    match pool.destroy_snapshot(&s) {
                        Ok(()) => {
                            assert!(!has_clones, "{s} went with clones");
                            snaps.remove(&s);
                        }
                        Err(e) => assert!(has_clones, "{s}: {e}"),
                    }
                }
                10 => {
                    if let Some(latest) = snaps_of(&vol, &snaps).last() {
                        pool.rollback(latest).unwrap();
                        heads.insert(vol.clone(), snaps[latest].clone());
                    }
                }
                11 => {
                    if let Some(origin) = pool.origin_of(&vol) {
                        // The snapshots of the origin's volume up to the origin move.
                        let from = origin.split('@').next().unwrap().to_string();
                        let t = pool.snapshot_dataset(&origin).unwrap().created_txg;
                        let of_from = snaps_of(&from, &snaps);
                        pool.promote(&vol).unwrap();
                        promoted += 1;
                        for s in of_from {
                            let moved = format!("{vol}@{}", s.split('@').nth(1).unwrap());
                            if pool.snapshot_dataset(&moved).is_ok() {
                                let data = snaps.remove(&s).unwrap();
                                snaps.insert(moved, data);
                            }
                        }
                        assert!(
                            (snaps.keys()).all(|s| !s.starts_with(&format!("{from}@"))
                                || pool.snapshot_dataset(s).unwrap().created_txg > t),
                            "seed {seed} step {step}: what stays with {from} is after {origin}"
                        );
                        assert_eq!(
                            pool.origin_of(&from).as_deref(),
                            Some(format!("{vol}@{}", origin.split('@').nth(1).unwrap()).as_str())
                        );
                    } else {
                        assert!(pool.promote(&vol).is_err(), "{vol} is no clone");
                    }
                }
                _ if heads.len() > 1 && snaps_of(&vol, &snaps).is_empty() => {
                    pool.destroy_volume(&vol).unwrap();
                    heads.remove(&vol);
                }
                _ => {}
            }
            at_rest(&pool);
            if step % 15 == 14 {
                for (name, want) in heads.iter().chain(snaps.iter()) {
                    assert!(
                        read_all(&pool, name) == *want,
                        "seed {seed} step {step}: {name}"
                    );
                }
            }
        }
        pool.close().unwrap();
        drop(pool);
        let pool = import(&devs);
        at_rest(&pool);
        for (name, want) in heads.iter().chain(snaps.iter()) {
            assert!(
                read_all(&pool, name) == *want,
                "seed {seed}, imported: {name}"
            );
        }
    }
    assert!(promoted >= 3, "the histories promote: {promoted}");
}

/// Power cuts at random moments while one thread writes, snapshots, destroys snapshots and
/// clones, promotes and destroys clones (so some fall inside each one's txg): every image
/// imports, its space is exactly what its trees reach with every figure recounted, and every
/// snapshot it holds reads as the volume was when that snapshot was taken. (That flushed writes survive a cut
/// is `zil_crash`'s and `crash_sigkill`'s to show.)
#[test]
fn power_cuts_amid_snapshots_and_destroys_leave_a_consistent_pool() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    let (devs, pool) = mirror_pool();
    let stop = Arc::new(AtomicBool::new(false));
    // Each snapshot's content, recorded before it is taken.
    let snaps: Arc<Mutex<BTreeMap<String, Vec<u8>>>> = Arc::new(Mutex::new(BTreeMap::new()));
    let writer = {
        let (pool, stop, snaps) = (pool.clone(), stop.clone(), snaps.clone());
        std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(7);
            let vol = Volume::open(&pool, "v").unwrap();
            let mut head = vec![0u8; VOL as usize];
            let mut live: Vec<String> = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let first = rng.gen_range(0..VOL / BS - 8);
                let mut data = vec![0u8; (rng.gen_range(1..8) * BS) as usize];
                rng.fill_bytes(&mut data);
                vol.write(first * BS, &data).unwrap();
                let at = (first * BS) as usize;
                head[at..at + data.len()].copy_from_slice(&data);
                if n % 3 == 0 {
                    let name = format!("v@s{n}");
                    snaps.lock().unwrap().insert(name.clone(), head.clone());
                    pool.snapshot(&[&name]).unwrap();
                    live.push(name);
                }
                if live.len() > 3 {
                    let gone = live.remove(rng.gen_range(0..live.len()));
                    pool.destroy_snapshot(&gone).unwrap();
                }
                if n % 7 == 0 && !live.is_empty() {
                    // A clone of the latest snapshot, promoted over the volume and back,
                    // then gone: the snapshots move to it and back (their names after the
                    // `@` are kept).
                    let c = format!("c{n}");
                    pool.clone_snapshot(live.last().unwrap(), &c).unwrap();
                    Volume::open(&pool, &c).unwrap().write(0, &data).unwrap();
                    pool.promote(&c).unwrap();
                    pool.promote("v").unwrap();
                    pool.destroy_volume(&c).unwrap();
                }
            }
        })
    };
    let mut images = Vec::new();
    for i in 0..6u64 {
        std::thread::sleep(std::time::Duration::from_millis(40 + 25 * i));
        let mode = if i % 2 == 0 {
            zeta::vdev::mem::PowerCut::DropUnflushed
        } else {
            zeta::vdev::mem::PowerCut::Tear(i)
        };
        images.push(power_cut(&devs, mode));
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let snaps = snaps.lock().unwrap().clone();
    let mut seen = 0;
    for (i, image) in images.into_iter().enumerate() {
        let pool = import(&image);
        at_rest(&pool);
        for s in pool.snapshots() {
            let kept = format!("v@{}", s.name.split('@').nth(1).unwrap());
            assert!(
                read_all(&pool, &s.name) == snaps[&kept],
                "cut {i}: {}",
                s.name
            );
            seen += 1;
        }
        read_all(&pool, "v");
        pool.close().unwrap();
    }
    assert!(
        seen > 0,
        "no image held a snapshot: the cuts came too early"
    );
}
