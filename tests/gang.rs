//! Gang blocks on every layout: a pool that writes its blocks in pieces (forced here, as
//! OpenZFS's `metaslab_force_ganging` forces them; `zio`'s unit tests make them from a pool
//! cut into slivers) reads them back after import, verifies, scrubs and repairs them, and
//! gives back all of their space when they are overwritten and when the volume goes.

mod common;

use common::{devs_for, mem_devs, opts, read, spec, Layout, EVERY_LAYOUT, MB};
use zeta::dsl::{Pool, PoolOptions};
use zeta::spa::feature::{self, GANG_BLOCKS};
use zeta::zvol::Volume;

fn ganging() -> PoolOptions {
    PoolOptions {
        force_ganging: Some(8192),
        ..opts()
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64 * 31 + seed * 7 + (i as u64 >> 12)) % 251) as u8)
        .collect()
}

/// Writes `data` at 0 in half blocks: each block is then a buffer the txg sync writes (a
/// volume's whole blocks go to their place ahead of the sync, where nothing gangs).
fn write_in_halves(vol: &Volume, data: &[u8]) {
    for (i, half) in data.chunks(8192).enumerate() {
        vol.write(i as u64 * 8192, half).unwrap();
    }
    vol.flush().unwrap();
}

#[test]
fn gang_blocks_read_back_scrub_repair_and_free_on_every_layout() {
    for layout in EVERY_LAYOUT {
        let devs = mem_devs(devs_for(layout), 64 * MB);
        let pool = Pool::create("tank", spec(layout, &devs), ganging()).unwrap();
        assert!(feature::is_active(&pool.config().features, &GANG_BLOCKS));
        pool.create_volume("v", 4 * MB, 16384, None).unwrap();
        let vol = Volume::open(&pool, "v").unwrap();
        let data = pattern(1, 4 * MB as usize);
        write_in_halves(&vol, &data);
        pool.sync_now().unwrap();
        // Every 16K data block and every indirect block took a header and two pieces.
        let used = pool.dataset("v").unwrap().object.used_bytes();
        assert!(
            used >= 4 * MB * 5 / 4,
            "{layout:?}: {used} bytes for 4M of gangs"
        );
        drop(vol);
        pool.export().unwrap();

        // Read from the devices, not a cache: after import.
        let pool = Pool::import(common::as_leaves(&devs), None, ganging()).unwrap();
        let vol = Volume::open(&pool, "v").unwrap();
        assert!(read(&vol, 0, data.len()) == data, "{layout:?}: read back");
        assert!(pool.verify().unwrap() > 0, "{layout:?}");

        // Silent damage on a device the layout can spare: a scrub finds and repairs it.
        if !matches!(layout, Layout::Stripe | Layout::TwoStripes) {
            let hit = pool.corrupt_sectors("mem0", 40, 3).unwrap();
            assert!(hit > 0, "{layout:?}");
            pool.start_scrub().unwrap();
            pool.wait_scrub();
            let st = pool.scan_status();
            assert!(
                st.repaired_bytes > 0 && st.errors == 0,
                "{layout:?}: {st:?}"
            );
            pool.start_scrub().unwrap();
            pool.wait_scrub();
            assert_eq!(pool.scan_status().repaired_bytes, 0, "{layout:?}");
        }

        // Overwritten whole twice and then destroyed, the pool gets its space back: each
        // gang block's header and pieces were freed, and what stays allocated is exactly
        // what the MOS's blocks take.
        for seed in [2, 3] {
            let data = pattern(seed, 4 * MB as usize);
            write_in_halves(&vol, &data);
            pool.sync_now().unwrap();
            assert!(
                read(&vol, 0, data.len()) == data,
                "{layout:?}: overwrite {seed}"
            );
        }
        let (reached, space) = pool.verify_space().unwrap();
        assert_eq!(reached, space.alloc, "{layout:?}: allocated, not reached");
        drop(vol);
        pool.destroy_volume("v").unwrap();
        for _ in 0..4 {
            pool.sync_now().unwrap();
        }
        let (reached, after) = pool.verify_space().unwrap();
        assert_eq!(reached, after.alloc, "{layout:?}: allocated, not reached");
    }
}
