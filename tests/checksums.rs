//! The four checksum algorithms in real pools: volumes of each kind side by side survive a
//! power cut and read back exactly, a pool created with `checksum=blake3` stores BLAKE3 block
//! pointers, and a one-bit flip in a data block is caught by every algorithm.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::*;
use zeta::dmu::object::walk;
use zeta::dsl::{Pool, PoolOptions};
use zeta::math::ChecksumKind;
use zeta::spa::bp::BlkPtr;
use zeta::spa::label::read_labels;
use zeta::vdev::mem::{MemDevice, PowerCut};
use zeta::vdev::{BlockDevice, Leaf, RESERVE_BYTES};
use zeta::zvol::{VolError, Volume};

const VOLSIZE: u64 = 4 * MB;
const BLOCK: u32 = 16384;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(37).wrapping_add((i / 5) as u8) | 1)
        .collect()
}

/// Every block pointer of volume `name` with its level (data blocks are level 0, in block
/// order, since the volume is written whole and so has no holes).
fn block_pointers(pool: &Pool, name: &str) -> Vec<(BlkPtr, u8)> {
    let ds = pool.dataset(name).unwrap();
    let mut bps = Vec::new();
    walk(&pool.io, &ds.object.dnode(), &mut |bp, level| {
        bps.push((*bp, level));
        Ok(())
    })
    .unwrap();
    bps
}

fn assert_all_blocks_use(pool: &Pool, name: &str, kind: ChecksumKind) {
    let bps = block_pointers(pool, name);
    let data = bps.iter().filter(|(_, level)| *level == 0).count();
    assert_eq!(data as u64, VOLSIZE / BLOCK as u64, "{name}: data blocks");
    assert!(bps.iter().any(|(_, level)| *level > 0), "{name}: indirect");
    for (bp, level) in &bps {
        // Data blocks carry the volume's algorithm; indirect blocks its metadata algorithm
        // (fletcher4 for a fletcher2 volume, as in ZFS).
        let want = if *level == 0 {
            kind
        } else {
            kind.for_metadata()
        };
        assert_eq!(bp.checksum_kind(), Some(want), "{name}: level {level}");
    }
}

fn read_all(pool: &Arc<Pool>, name: &str) -> Vec<u8> {
    let vol = Volume::open(pool, name).unwrap();
    let mut got = vec![0u8; VOLSIZE as usize];
    vol.read(0, &mut got).unwrap();
    got
}

#[test]
fn volumes_of_every_algorithm_survive_a_power_cut_in_one_pool() {
    let devs = mem_devs(2, 96 * MB);
    // No timed txg: one could commit the unflushed overwrites below just before the cut.
    let opts = PoolOptions {
        txg_timeout: std::time::Duration::from_secs(3600),
        ..opts()
    };
    let pool = Pool::create("tank", spec(Layout::Mirror, &devs), opts).unwrap();
    for (i, kind) in ChecksumKind::ALL.into_iter().enumerate() {
        pool.create_volume(kind.name(), VOLSIZE, BLOCK, Some(kind))
            .unwrap();
        let vol = Volume::open(&pool, kind.name()).unwrap();
        vol.write(0, &pattern(i as u8, VOLSIZE as usize)).unwrap();
        vol.flush().unwrap();
    }
    // Syncs the dirty data asked for are done: none is under way during the overwrites.
    pool.sync_now().unwrap();
    // Unflushed overwrites that the power cut drops.
    for kind in ChecksumKind::ALL {
        let vol = Volume::open(&pool, kind.name()).unwrap();
        vol.write(0, &pattern(200, BLOCK as usize)).unwrap();
    }
    let cut = power_cut(&devs, PowerCut::DropUnflushed);
    drop(pool);
    let pool = import(&cut);
    pool.verify().unwrap();
    for (i, kind) in ChecksumKind::ALL.into_iter().enumerate() {
        assert_eq!(pool.dataset(kind.name()).unwrap().checksum(), kind);
        assert!(
            read_all(&pool, kind.name()) == pattern(i as u8, VOLSIZE as usize),
            "{} reads back wrong",
            kind.name()
        );
        assert_all_blocks_use(&pool, kind.name(), kind);
    }
}

#[test]
fn a_pool_created_with_blake3_stores_blake3_block_pointers() {
    let devs = mem_devs(2, 96 * MB);
    let opts = PoolOptions {
        checksum: ChecksumKind::Blake3,
        ..opts()
    };
    let pool = Pool::create("tank", spec(Layout::Mirror, &devs), opts).unwrap();
    // No checksum given: the volume takes the pool's.
    pool.create_volume("v", VOLSIZE, BLOCK, None).unwrap();
    let data = pattern(9, VOLSIZE as usize);
    let vol = Volume::open(&pool, "v").unwrap();
    vol.write(0, &data).unwrap();
    vol.flush().unwrap();
    drop(vol);
    // The blocks join the volume's tree at a txg (the flush only made them durable).
    pool.sync_now().unwrap();
    assert_all_blocks_use(&pool, "v", ChecksumKind::Blake3);
    let cut = power_cut(&devs, PowerCut::DropUnflushed);
    drop(pool);
    let pool = import(&cut);
    assert_eq!(pool.config().checksum, ChecksumKind::Blake3);
    assert_eq!(pool.dataset("v").unwrap().checksum(), ChecksumKind::Blake3);
    assert!(read_all(&pool, "v") == data);
    assert_all_blocks_use(&pool, "v", ChecksumKind::Blake3);
    // The pool's own metadata: the MOS objset block the newest uberblock points at.
    let labels = read_labels(&Leaf::new(cut[0].clone() as Arc<dyn BlockDevice>, 0)).unwrap();
    let root = labels.uberblocks[0].root;
    assert!(!root.is_hole());
    assert_eq!(root.checksum_kind(), Some(ChecksumKind::Blake3));
}

#[test]
fn a_one_bit_flip_in_a_data_block_is_caught_by_every_algorithm() {
    let devs: Vec<Arc<MemDevice>> = mem_devs(1, 96 * MB);
    let pool = Pool::create("tank", spec(Layout::Stripe, &devs), opts()).unwrap();
    for (i, kind) in ChecksumKind::ALL.into_iter().enumerate() {
        pool.create_volume(kind.name(), VOLSIZE, BLOCK, Some(kind))
            .unwrap();
        Volume::open(&pool, kind.name())
            .unwrap()
            .write(0, &pattern(i as u8 + 50, VOLSIZE as usize))
            .unwrap();
    }
    pool.sync_now().unwrap();
    // Flip one bit in data block 3 of every volume, on the (only) leaf.
    const VICTIM: usize = 3;
    for kind in ChecksumKind::ALL {
        let bps = block_pointers(&pool, kind.name());
        let (bp, _) = bps.iter().filter(|(_, l)| *l == 0).nth(VICTIM).unwrap();
        let dvas: Vec<_> = bp.dvas().collect();
        assert_eq!(dvas.len(), 1, "data has one copy on a stripe");
        let at = RESERVE_BYTES + dvas[0].offset.get() + 1000;
        let mut byte = [0u8; 1];
        devs[0].read_at(&mut byte, at).unwrap();
        byte[0] ^= 0x10;
        devs[0].corrupt(at, &byte);
    }
    pool.close().unwrap();
    drop(pool);
    let pool = import(&devs);
    for (i, kind) in ChecksumKind::ALL.into_iter().enumerate() {
        let vol = Volume::open(&pool, kind.name()).unwrap();
        let want = pattern(i as u8 + 50, VOLSIZE as usize);
        let bs = BLOCK as usize;
        let mut block = vec![0u8; bs];
        // The neighbours read fine; the flipped block is an error, not wrong bytes.
        for good in [VICTIM - 1, VICTIM + 1] {
            vol.read((good * bs) as u64, &mut block).unwrap();
            assert!(block == want[good * bs..(good + 1) * bs], "{kind:?}");
        }
        let err = vol
            .read((VICTIM * bs) as u64, &mut block)
            .expect_err(kind.name());
        assert!(
            matches!(err, VolError::Unreadable { .. }),
            "{kind:?}: {err}"
        );
        assert!(err.to_string().contains("checksum mismatch"), "{err}");
    }
    let leaf = &pool.io.zio.tops[0].children[0];
    assert!(leaf.counters.cksum_errors.load(Ordering::Relaxed) >= 4);
}

#[test]
fn the_cli_takes_every_algorithm_as_pool_and_volume_property() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    let zeta = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_zeta"))
            .args(args)
            .env("ZETA_HOME", &home)
            .current_dir(d)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let props = ["-o", "size=64M", "-o", "checksum=blake3"];
    zeta(&[&["pool", "create"], &props[..], &["p", "leaf"]].concat());
    zeta(&["vol", "create", "p/inherit", "1M"]);
    for kind in ChecksumKind::ALL {
        let prop = format!("checksum={}", kind.name());
        let name = format!("p/{}", kind.name());
        zeta(&["vol", "create", "-o", &prop, &name, "1M"]);
    }
    let list: serde_json::Value = serde_json::from_str(&zeta(&["vol", "list", "--json"])).unwrap();
    let got: Vec<(String, String)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["checksum"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut want: Vec<(String, String)> = ChecksumKind::ALL
        .iter()
        .map(|k| (format!("p/{}", k.name()), k.name().to_string()))
        .collect();
    want.push(("p/inherit".into(), "blake3".into()));
    for w in &want {
        assert!(got.contains(w), "{w:?} not in {got:?}");
    }
    assert_eq!(got.len(), want.len());
}
