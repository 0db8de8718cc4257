//! RAID-Z end to end on simulated devices: every code survives the loss of any `nparity`
//! devices (missing at import, or failing every I/O), silent corruption of columns is found
//! by checksum and repaired, and damage beyond the parity fails with a clear error.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use zeta::dsl::{Pool, PoolError};
use zeta::vdev::mem::{Faults, MemDevice};
use zeta::vdev::RESERVE_BYTES;
use zeta::zvol::Volume;

const LAYOUTS: [(Layout, usize); 4] = [
    (Layout::Raidz1, 1),
    (Layout::Raidz2, 2),
    (Layout::Raidz2Rdp, 2),
    (Layout::Raidz3, 3),
];
const VOL: u64 = 6 * MB;

/// A pool of `layout` holding a volume `v` of random data (blocks of every ragged width),
/// written, synced and closed. Returns the devices and the data.
fn filled(layout: Layout, seed: u64) -> (Vec<Arc<MemDevice>>, Vec<u8>) {
    let devs = mem_devs(devs_for(layout), 64 * MB);
    let pool = Pool::create("tank", spec(layout, &devs), opts()).unwrap();
    pool.create_volume("v", VOL, 16384, None).unwrap();
    let mut data = vec![0u8; VOL as usize];
    StdRng::seed_from_u64(seed).fill_bytes(&mut data);
    // Leave holes, so some blocks are never written.
    for hole in data.chunks_mut(16384).step_by(7) {
        hole.fill(0);
    }
    let vol = Volume::open(&pool, "v").unwrap();
    for (i, chunk) in data.chunks(16384).enumerate() {
        if i % 7 != 0 {
            vol.write(i as u64 * 16384, chunk).unwrap();
        }
    }
    vol.flush().unwrap();
    drop(vol);
    pool.close().unwrap();
    (devs, data)
}

fn cksum_errors(pool: &Pool) -> u64 {
    pool.vdev_status()
        .iter()
        .flat_map(|t| t.leaves.iter())
        .map(|l| l.cksum_errors)
        .sum()
}

/// Every combination of `k` indices out of `n`.
fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for first in 0..n {
        for mut rest in combinations(n - first - 1, k - 1) {
            for r in rest.iter_mut() {
                *r += first + 1;
            }
            rest.insert(0, first);
            out.push(rest);
        }
    }
    out
}

#[test]
fn any_nparity_devices_may_be_missing_at_import() {
    for (layout, np) in LAYOUTS {
        let (devs, data) = filled(layout, 1);
        let sets = combinations(devs.len(), np);
        // raidz3 of 7 has 35 triples; a third of them is plenty.
        let step = if sets.len() > 20 { 3 } else { 1 };
        for gone in sets.iter().step_by(step) {
            let ctx = format!("{layout:?} without devices {gone:?}");
            let present: Vec<Arc<MemDevice>> = (0..devs.len())
                .filter(|i| !gone.contains(i))
                .map(|i| devs[i].clone())
                .collect();
            let pool = Pool::import(as_leaves(&present), None, opts()).expect(&ctx);
            let st = &pool.vdev_status()[0];
            assert_eq!(st.state, "DEGRADED", "{ctx}");
            assert_eq!(st.missing_devices, np, "{ctx}");
            for &g in gone {
                assert_eq!(st.leaves[g].state, "UNAVAIL", "{ctx}");
            }
            pool.verify().expect(&ctx);
            assert!(read_volume(&pool) == data, "{ctx}: data differs");
            drop(pool);
        }
        // One more than the parity covers: a clear refusal, not garbage.
        let present: Vec<Arc<MemDevice>> = devs[np + 1..].to_vec();
        match Pool::import(as_leaves(&present), None, opts()) {
            Err(PoolError::CannotImport { why, .. }) => {
                assert!(why.contains("can lose at most"), "{layout:?}: {why}")
            }
            Err(e) => panic!("{layout:?}: unexpected error {e}"),
            Ok(_) => panic!("{layout:?}: imported without enough devices"),
        }
    }
}

#[test]
fn degraded_pool_takes_writes_and_gives_them_back_when_whole_again() {
    for (layout, np) in LAYOUTS {
        let (devs, mut data) = filled(layout, 2);
        let ctx = format!("{layout:?}");
        // Lose the last np devices, write through the degraded pool.
        let present = devs[..devs.len() - np].to_vec();
        let pool = Pool::import(as_leaves(&present), None, opts()).expect(&ctx);
        let vol = Volume::open(&pool, "v").unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..50 {
            let len = rng.gen_range(1..200_000usize);
            let off = rng.gen_range(0..VOL as usize - len);
            rng.fill_bytes(&mut data[off..off + len]);
            vol.write(off as u64, &data[off..off + len]).unwrap();
        }
        vol.flush().unwrap();
        drop(vol);
        pool.close().unwrap();
        drop(pool);
        // The returning devices hold stale columns; reads must still be exact (their blocks
        // were written without them, and old blocks verify or are rebuilt).
        let pool = Pool::import(as_leaves(&devs), None, opts()).expect(&ctx);
        pool.verify().expect(&ctx);
        assert!(
            read_volume(&pool) == data,
            "{ctx}: data differs after the devices came back"
        );
    }
}

#[test]
fn failing_devices_are_read_around() {
    for (layout, np) in LAYOUTS {
        let (devs, data) = filled(layout, 4);
        for bad in combinations(devs.len(), np).iter().step_by(2) {
            let ctx = format!("{layout:?} with failing devices {bad:?}");
            let pool = Pool::import(as_leaves(&devs), None, opts()).expect(&ctx);
            for &b in bad {
                devs[b].set_faults(Faults {
                    fail_reads: true,
                    ..Faults::default()
                });
            }
            assert!(read_volume(&pool) == data, "{ctx}: data differs");
            let st = &pool.vdev_status()[0];
            for &b in bad {
                assert!(st.leaves[b].read_errors > 0, "{ctx}: no read error counted");
            }
            for d in &devs {
                d.set_faults(Faults::default());
            }
            drop(pool);
        }
    }
}

/// Overwrites `count` random sectors in the data area of `dev`, within its first `span` bytes.
fn rot(dev: &MemDevice, rng: &mut StdRng, count: usize, span: u64) -> Vec<u64> {
    (0..count)
        .map(|_| {
            let off = rng.gen_range(0..span / 4096) * 4096;
            let mut junk = vec![0u8; 4096];
            rng.fill_bytes(&mut junk);
            dev.corrupt(RESERVE_BYTES + off, &junk);
            off
        })
        .collect()
}

#[test]
fn silent_corruption_within_parity_is_found_repaired_and_counted() {
    for (layout, np) in LAYOUTS {
        let (devs, data) = filled(layout, 5);
        let ctx = format!("{layout:?}");
        let mut rng = StdRng::seed_from_u64(6);
        // Rot sectors on np devices, the same sectors on each (so some stripes lose np
        // columns at once, which combinatorial reconstruction must find without any device
        // reporting an error).
        let span = 2 * MB;
        let offsets = rot(&devs[0], &mut rng, 40, span);
        for d in &devs[1..np] {
            for &off in &offsets {
                let mut junk = vec![0u8; 4096];
                rng.fill_bytes(&mut junk);
                d.corrupt(RESERVE_BYTES + off, &junk);
            }
        }
        let pool = Pool::import(as_leaves(&devs), None, opts()).expect(&ctx);
        pool.verify().expect(&ctx);
        assert!(read_volume(&pool) == data, "{ctx}: data differs");
        let found = cksum_errors(&pool);
        assert!(found > 0, "{ctx}: corruption went unnoticed");
        let repaired: u64 = pool.vdev_status()[0]
            .leaves
            .iter()
            .map(|l| l.repaired_bytes)
            .sum();
        assert!(
            repaired >= found * 4096,
            "{ctx}: {found} errors, {repaired} bytes repaired"
        );
        // The counters persist across imports: zero them to see whether new errors appear.
        pool.clear_errors().unwrap();
        drop(pool);
        // Repairs reached the media: a fresh import finds nothing wrong.
        let pool = Pool::import(as_leaves(&devs), None, opts()).expect(&ctx);
        pool.verify().expect(&ctx);
        assert!(
            read_volume(&pool) == data,
            "{ctx}: data differs after repair"
        );
        assert_eq!(cksum_errors(&pool), 0, "{ctx}: repair did not stick");
        let leaf = &pool.io.zio.tops[0].children[0];
        assert_eq!(leaf.counters.read_errors.load(Ordering::Relaxed), 0);
    }
}

#[test]
fn corruption_beyond_parity_is_a_clear_error_naming_the_volume() {
    let mut reads_checked = 0;
    for (layout, np) in LAYOUTS {
        let (devs, _) = filled(layout, 7);
        let ctx = format!("{layout:?}");
        // The same data sectors on np + 1 devices: some blocks lose more than parity covers.
        let mut rng = StdRng::seed_from_u64(8);
        let offsets: Vec<u64> = (0..200).map(|_| rng.gen_range(0..512u64) * 4096).collect();
        for d in &devs[..=np] {
            for &off in &offsets {
                d.corrupt(RESERVE_BYTES + off, &[0xa5; 4096]);
            }
        }
        // The MOS may be hit too; then the import itself must fail cleanly.
        let pool = match Pool::import(as_leaves(&devs), None, opts()) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("{ctx}: import refused: {e}");
                continue;
            }
        };
        let vol = match Volume::open(&pool, "v") {
            Ok(v) => v,
            Err(e) => {
                eprintln!("{ctx}: volume unreadable: {e}");
                continue;
            }
        };
        let mut failures = 0;
        let mut first_error = String::new();
        let mut buf = vec![0u8; 16384];
        for blk in 0..VOL / 16384 {
            if let Err(e) = vol.read(blk * 16384, &mut buf) {
                let msg = e.to_string();
                assert!(
                    msg.contains(&format!(
                        "tank/v: bytes {}..{}",
                        blk * 16384,
                        (blk + 1) * 16384
                    )),
                    "{ctx}: error does not name the volume and range: {msg}"
                );
                if first_error.is_empty() {
                    first_error = msg;
                }
                failures += 1;
            }
        }
        assert!(failures > 0, "{ctx}: no read failed");
        eprintln!("{ctx}: e.g. {first_error}");
        assert!(
            failures < VOL / 16384,
            "{ctx}: every read failed, not only the damaged blocks"
        );
        eprintln!("{ctx}: {failures} of {} blocks unreadable", VOL / 16384);
        reads_checked += 1;
    }
    assert!(
        reads_checked > 0,
        "the damage always hit the pool's metadata"
    );
}

#[test]
fn a_full_raidz_pool_says_so() {
    let devs = mem_devs(3, 64 * MB);
    let pool = Pool::create("tank", spec(Layout::Raidz1, &devs), opts()).unwrap();
    pool.create_volume("v", 512 * MB, 16384, None).unwrap();
    let vol = Volume::open(&pool, "v").unwrap();
    let chunk = vec![0x5au8; MB as usize];
    let mut wrote = 0u64;
    let err = loop {
        match vol.write(wrote, &chunk).and_then(|_| vol.flush()) {
            Ok(()) => wrote += MB,
            Err(e) => break e,
        }
        assert!(wrote < 512 * MB, "wrote more than the devices hold");
    };
    assert!(err.to_string().contains("out of space"), "{err}");
    // 3 x 64 MiB raidz1: about two thirds of the raw space holds data.
    assert!(wrote >= 80 * MB, "only {wrote} bytes fit");
    drop(vol);
    pool.close().unwrap();
    drop(pool);
    let pool = import(&devs);
    pool.verify().unwrap();
}

fn zeta(home: &std::path::Path, cwd: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zeta"))
        .args(args)
        .env("ZETA_HOME", home)
        .current_dir(cwd)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "zeta {args:?} failed: {err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Zeroes a whole file the way a wiped disk looks: same size, every byte zero.
fn wipe(path: &std::path::Path) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(0).unwrap();
    f.set_len(len).unwrap();
}

/// The end-to-end case with the real binary and real files: a raidz2 of six file
/// vdevs, data put in, two files wiped, import, data read back exactly (and a column rotted
/// on a third file is repaired by the same read).
#[test]
fn raidz2_of_six_files_survives_two_wiped_files_via_the_cli() {
    for (code, pair) in [("rs", [1usize, 4]), ("rdp", [0, 5])] {
        let t = tempfile::tempdir().unwrap();
        let (home, d) = (t.path().join("home"), t.path());
        let files: Vec<String> = (0..6).map(|i| format!("f{i}")).collect();
        let mut args = vec!["pool", "create", "-o", "size=96M"];
        let prop = format!("raidz2-code={code}");
        args.extend(["-o", &prop, "p", "raidz2"]);
        args.extend(files.iter().map(String::as_str));
        zeta(&home, d, &args);
        let status = zeta(&home, d, &["pool", "status", "--json", "p"]);
        let want = if code == "rdp" {
            "raidz2-rdp"
        } else {
            "raidz2"
        };
        assert!(
            status.contains(&format!("\"name\": \"{want}\"")),
            "{status}"
        );
        zeta(&home, d, &["vol", "create", "p/v", "8M"]);
        let mut data = vec![0u8; 5 * MB as usize + 12345];
        StdRng::seed_from_u64(9).fill_bytes(&mut data);
        std::fs::write(d.join("in"), &data).unwrap();
        zeta(&home, d, &["vol", "put", "p/v", "in"]);
        zeta(&home, d, &["pool", "export", "p"]);

        for &i in &pair {
            wipe(&d.join(&files[i]));
        }
        let listing = zeta(&home, d, &["pool", "import", "-d", ".", "p"]);
        assert!(listing.contains("imported"), "{listing}");
        let status = zeta(&home, d, &["pool", "status", "--json", "p"]);
        let st: serde_json::Value = serde_json::from_str(&status).unwrap();
        assert_eq!(st[0]["state"], "DEGRADED", "{status}");
        assert_eq!(st[0]["vdevs"][0]["missing_devices"], 2, "{status}");
        zeta(&home, d, &["vol", "get", "p/v", "out"]);
        let got = std::fs::read(d.join("out")).unwrap();
        assert!(got[..data.len()] == data[..], "{code}: data differs");
        assert!(got[data.len()..].iter().all(|&b| b == 0));
    }
}

/// Silent rot of one column on file vdevs: found by checksum, rebuilt, rewritten on disk.
#[test]
fn rotten_column_on_a_file_vdev_is_rewritten() {
    use zeta::vdev::{BlockDevice, FileDevice};
    let t = tempfile::tempdir().unwrap();
    let paths: Vec<_> = (0..6).map(|i| t.path().join(format!("d{i}"))).collect();
    let open = |create: bool| -> Vec<(Arc<dyn BlockDevice>, String)> {
        paths
            .iter()
            .map(|p| {
                let dev = if create {
                    FileDevice::create(p, 64 * MB).unwrap()
                } else {
                    FileDevice::open(p).unwrap()
                };
                (
                    Arc::new(dev) as Arc<dyn BlockDevice>,
                    p.display().to_string(),
                )
            })
            .collect()
    };
    let leaves = open(true);
    let cfg = zeta::vdev::RaidzConfig::new(2, 6, false).unwrap();
    let pool = Pool::create("tank", vec![zeta::dsl::TopSpec::raidz(cfg, leaves)], opts()).unwrap();
    pool.create_volume("v", 4 * MB, 131072, None).unwrap();
    let mut data = vec![0u8; 4 * MB as usize];
    StdRng::seed_from_u64(10).fill_bytes(&mut data);
    let vol = Volume::open(&pool, "v").unwrap();
    vol.write(0, &data).unwrap();
    vol.flush().unwrap();
    drop(vol);
    pool.close().unwrap();
    drop(pool);

    // Rot 1 MiB of d2's data area in place.
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&paths[2])
        .unwrap();
    let mut before = vec![0u8; MB as usize];
    f.read_exact_at(&mut before, RESERVE_BYTES).unwrap();
    f.write_all_at(&vec![0x77u8; MB as usize], RESERVE_BYTES)
        .unwrap();
    drop(f);

    let pool = Pool::import(open(false), None, opts()).unwrap();
    assert!(read_all_len(&pool, data.len()) == data);
    let st = &pool.vdev_status()[0];
    assert!(st.leaves[2].cksum_errors > 0, "rot not counted: {st:?}");
    assert!(st
        .leaves
        .iter()
        .enumerate()
        .all(|(i, l)| i == 2 || l.cksum_errors == 0));
    pool.close().unwrap();
    drop(pool);
    let f = std::fs::File::open(&paths[2]).unwrap();
    let mut after = vec![0u8; MB as usize];
    f.read_exact_at(&mut after, RESERVE_BYTES).unwrap();
    // Every sector that held a column of the volume is back; free sectors may keep the rot.
    let restored = before
        .chunks(4096)
        .zip(after.chunks(4096))
        .filter(|(b, a)| b == a)
        .count();
    assert!(restored > 0, "no rotten sector was rewritten");
}

fn read_all_len(pool: &Arc<Pool>, len: usize) -> Vec<u8> {
    let vol = Volume::open(pool, "v").unwrap();
    let mut got = vec![0u8; len];
    vol.read(0, &mut got).unwrap();
    got
}

/// Several raidz vdevs in one pool (of different widths and parity), each losing as many
/// devices as its parity covers; and devices failing beyond the parity give errors, not data.
#[test]
fn a_pool_of_several_raidz_vdevs_degrades_per_vdev() {
    use zeta::dsl::TopSpec;
    use zeta::vdev::RaidzConfig;
    let devs = mem_devs(3 + 5, 64 * MB);
    let leaves = as_leaves(&devs);
    let spec = vec![
        TopSpec::raidz(RaidzConfig::new(1, 3, false).unwrap(), leaves[..3].to_vec()),
        TopSpec::raidz(RaidzConfig::new(2, 5, true).unwrap(), leaves[3..].to_vec()),
    ];
    let pool = Pool::create("tank", spec, opts()).unwrap();
    pool.create_volume("v", VOL, 16384, None).unwrap();
    let mut data = vec![0u8; VOL as usize];
    StdRng::seed_from_u64(12).fill_bytes(&mut data);
    let vol = Volume::open(&pool, "v").unwrap();
    vol.write(0, &data).unwrap();
    vol.flush().unwrap();
    drop(vol);
    let names: Vec<String> = pool.vdev_status().iter().map(|t| t.name.clone()).collect();
    assert_eq!(names, ["raidz1", "raidz2-rdp"]);
    pool.close().unwrap();
    drop(pool);

    // Lose device 1 of the raidz1 and devices 3 and 7 of the raidz2.
    let present: Vec<Arc<MemDevice>> = [0, 2, 4, 5, 6].iter().map(|&i| devs[i].clone()).collect();
    let pool = Pool::import(as_leaves(&present), None, opts()).unwrap();
    let st = pool.vdev_status();
    assert_eq!((st[0].state, st[1].state), ("DEGRADED", "DEGRADED"));
    pool.verify().unwrap();
    assert!(read_volume(&pool) == data);
    drop(pool);

    // All devices back, but three of the raidz2's five fail every read: reads that need that
    // vdev fail with an error, those on the raidz1 still succeed, and nothing returns garbage.
    let pool = Pool::import(as_leaves(&devs), None, opts()).unwrap();
    for d in &devs[3..6] {
        d.set_faults(Faults {
            fail_reads: true,
            ..Faults::default()
        });
    }
    let vol = Volume::open(&pool, "v").unwrap();
    let (mut ok, mut failed) = (0, 0);
    let mut buf = vec![0u8; 16384];
    for blk in 0..VOL / 16384 {
        let off = (blk * 16384) as usize;
        match vol.read(off as u64, &mut buf) {
            Ok(()) => {
                assert!(buf[..] == data[off..off + 16384], "block {blk}: wrong data");
                ok += 1;
            }
            Err(e) => {
                assert!(e.to_string().contains("unreadable"), "{e}");
                failed += 1;
            }
        }
    }
    assert!(ok > 0 && failed > 0, "{ok} blocks read, {failed} failed");
}

/// `zeta pool replace` with real files: a wiped device is replaced by a new file, rebuilt,
/// and the pool is ONLINE with the data intact.
#[test]
fn a_wiped_file_is_replaced_and_rebuilt_via_the_cli() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    zeta(
        &home,
        d,
        &[
            "pool", "create", "-o", "size=96M", "p", "raidz1", "f0", "f1", "f2",
        ],
    );
    zeta(&home, d, &["vol", "create", "p/v", "8M"]);
    let mut data = vec![0u8; 3 * MB as usize];
    StdRng::seed_from_u64(21).fill_bytes(&mut data);
    std::fs::write(d.join("in"), &data).unwrap();
    zeta(&home, d, &["vol", "put", "p/v", "in"]);
    zeta(&home, d, &["pool", "export", "p"]);
    wipe(&d.join("f1"));
    zeta(&home, d, &["pool", "import", "-d", ".", "p"]);
    let f1 = d.join("f1").canonicalize().unwrap().display().to_string();
    let out = zeta(&home, d, &["pool", "replace", "p", &f1, "g1"]);
    assert!(out.contains("resilver of 'p' finished"), "{out}");
    let status = zeta(&home, d, &["pool", "status", "--json", "p"]);
    let st: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(st[0]["state"], "ONLINE", "{status}");
    let leaves = st[0]["vdevs"][0]["leaves"].as_array().unwrap();
    assert!(
        leaves[1]["path"].as_str().unwrap().ends_with("/g1"),
        "{status}"
    );
    zeta(&home, d, &["vol", "get", "p/v", "out"]);
    let got = std::fs::read(d.join("out")).unwrap();
    assert!(got[..data.len()] == data[..]);
}

/// Per device of a tapped raidz2: requests served at once, waiting requests, and whether
/// it serves at once (initially true).
type ReadCounts = Vec<(Arc<AtomicU64>, Arc<AtomicU64>, Arc<AtomicBool>)>;

/// A raidz2 of six tapped devices that count their reads (`ReadCounts`).
fn counted_raidz2() -> (zeta::vdev::TopVdev, ReadCounts) {
    use zeta::vdev::{Leaf, RaidzConfig, TopVdev};
    let counts: ReadCounts = (0..6).map(|_| Default::default()).collect();
    let slots = mem_devs(6, 8 * MB)
        .into_iter()
        .zip(&counts)
        .enumerate()
        .map(|(i, (dev, (at_once, waited, cached)))| {
            cached.store(true, Ordering::SeqCst);
            let (at_once, waited, cached) = (at_once.clone(), waited.clone(), cached.clone());
            let tap = Tap {
                on_read: Box::new(move || {
                    waited.fetch_add(1, Ordering::SeqCst);
                }),
                nowait: Box::new(move || {
                    let yes = cached.load(Ordering::SeqCst);
                    if yes {
                        at_once.fetch_add(1, Ordering::SeqCst);
                    }
                    yes
                }),
                ..Tap::new(dev)
            };
            Some(Arc::new(Leaf::new(Arc::new(tap), i as u64 + 1)))
        })
        .collect();
    let top = TopVdev::new_raidz(0, 99, RaidzConfig::new(2, 6, false).unwrap(), slots).unwrap();
    (top, counts)
}

/// Columns a device can serve at once are read that way, on the reading thread; only the
/// others are read the waiting way (in parallel). Either way the block reads back whole.
#[test]
fn raidz_reads_cached_columns_at_once_and_waits_only_for_the_rest() {
    let (top, counts) = counted_raidz2();
    let mut data = vec![0u8; 128 << 10];
    StdRng::seed_from_u64(5).fill_bytes(&mut data);
    top.write(0, &data).unwrap();
    let verify = |b: &[u8]| b == &data[..];
    let waited = || {
        counts
            .iter()
            .map(|c| c.1.load(Ordering::SeqCst))
            .sum::<u64>()
    };
    let at_once = || {
        counts
            .iter()
            .map(|c| c.0.load(Ordering::SeqCst))
            .sum::<u64>()
    };

    let mut back = vec![0u8; data.len()];
    top.read_verified(0, &mut back, &verify).unwrap();
    assert_eq!(back, data);
    assert_eq!(at_once(), 4, "the four data columns, served at once");
    assert_eq!(waited(), 0);

    // Two devices whose reads would wait: only their columns are read the waiting way.
    counts[1].2.store(false, Ordering::SeqCst);
    counts[4].2.store(false, Ordering::SeqCst);
    let mut back = vec![0u8; data.len()];
    top.read_verified(0, &mut back, &verify).unwrap();
    assert_eq!(back, data);
    let data_cols_waiting = waited();
    assert!(
        (1..=2).contains(&data_cols_waiting),
        "{data_cols_waiting} columns read the waiting way"
    );
    assert_eq!(at_once() + data_cols_waiting, 8);

    // A read that must not wait (an NBD reader's) is declined while a data column would
    // wait, with nothing read the waiting way, and served once every one is at hand.
    let before = waited();
    let mut back = vec![0u8; data.len()];
    assert!(
        !top.read_nowait(0, &mut back),
        "declined: a data column would wait"
    );
    assert_eq!(waited(), before);
    counts[1].2.store(true, Ordering::SeqCst);
    counts[4].2.store(true, Ordering::SeqCst);
    assert!(top.read_nowait(0, &mut back), "every data column at once");
    assert_eq!(back, data);
    assert_eq!(waited(), before);
}

/// A run of blocks that lie one after another is read with one request per child for the
/// columns it holds, not one per column: at once where the device has them, the waiting way
/// for a child that would wait. Blocks of every size chain right (each starts where the
/// previous one's allocation, parity and padding included, ends).
#[test]
fn a_run_of_raidz_blocks_reads_each_childs_columns_as_one_request() {
    let (top, counts) = counted_raidz2();
    let reset = || {
        for c in &counts {
            c.0.store(0, Ordering::SeqCst);
            c.1.store(0, Ordering::SeqCst);
        }
    };
    let sum = |k: usize| -> Vec<u64> {
        counts
            .iter()
            .map(|c| [&c.0, &c.1][k].load(Ordering::SeqCst))
            .collect()
    };
    let mut rng = StdRng::seed_from_u64(11);
    // Writes a run of blocks of these sizes from offset `at` and reads it back as one run.
    let mut at = 0u64;
    let mut run = |sizes: &[usize]| -> Vec<Vec<u8>> {
        let blocks: Vec<Vec<u8>> = sizes
            .iter()
            .map(|&n| {
                let mut b = vec![0u8; n];
                rng.fill_bytes(&mut b);
                b
            })
            .collect();
        let start = at;
        for b in &blocks {
            top.write(at, b).unwrap();
            at += top.asize_of(b.len() as u64);
        }
        reset();
        let mut back: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
        let mut bufs: Vec<&mut [u8]> = back.iter_mut().map(|b| &mut b[..]).collect();
        top.read_run(start, &mut bufs).unwrap();
        assert!(back == blocks, "a run of {sizes:?} read back other bytes");
        back
    };

    // Eight 16K blocks: four data columns each, the same four children, rows in turn.
    run(&[16384; 8]);
    assert_eq!(sum(0), [0, 0, 1, 1, 1, 1], "one request per data child");
    assert_eq!(sum(1), [0; 6]);

    // A child that would wait gets one waiting request; the others are served at once.
    counts[3].2.store(false, Ordering::SeqCst);
    run(&[16384; 8]);
    assert_eq!(sum(0), [0, 0, 1, 0, 1, 1]);
    assert_eq!(sum(1), [0, 0, 0, 1, 0, 0]);
    counts[3].2.store(true, Ordering::SeqCst);

    // Sixteen 4K blocks take alternate halves of the row: two children hold all the data.
    run(&[4096; 16]);
    assert_eq!(sum(0).iter().sum::<u64>(), 2, "{:?}", sum(0));
    assert_eq!(sum(1), [0; 6]);

    // Ragged sizes still chain; far fewer requests than columns.
    run(&[4096, 12288, 131072, 8192, 20480, 4096, 65536]);
    let requests: u64 = sum(0).iter().sum();
    assert!((1..=12).contains(&requests), "{requests} requests");
}

/// A run of blocks is written with one request per child for the columns it holds (parity
/// included), and reads back whole; up to `nparity` failed children still leave every block
/// readable, more fail the run.
#[test]
fn a_run_of_raidz_blocks_writes_each_childs_columns_as_one_request() {
    use zeta::vdev::{Leaf, RaidzConfig, TopVdev};
    let devs = mem_devs(6, 8 * MB);
    let requests: Vec<Arc<AtomicU64>> = (0..6).map(|_| Default::default()).collect();
    let slots = devs
        .iter()
        .zip(&requests)
        .enumerate()
        .map(|(i, (dev, requests))| {
            let requests = requests.clone();
            let tap = Tap {
                on_write_request: Box::new(move || {
                    requests.fetch_add(1, Ordering::SeqCst);
                }),
                ..Tap::new(dev.clone())
            };
            Some(Arc::new(Leaf::new(Arc::new(tap), i as u64 + 1)))
        })
        .collect();
    let top = TopVdev::new_raidz(0, 99, RaidzConfig::new(2, 6, false).unwrap(), slots).unwrap();
    let counts = || -> Vec<u64> {
        requests
            .iter()
            .map(|r| r.swap(0, Ordering::SeqCst))
            .collect()
    };
    let mut rng = StdRng::seed_from_u64(12);
    let mut at = 0u64;
    let mut write_run = |sizes: &[usize]| -> Result<Vec<(u64, Vec<u8>)>, zeta::vdev::VdevError> {
        let blocks: Vec<(u64, Vec<u8>)> = sizes
            .iter()
            .map(|&n| {
                let mut b = vec![0u8; n];
                rng.fill_bytes(&mut b);
                let off = at;
                at += top.asize_of(n as u64);
                (off, b)
            })
            .collect();
        let bufs: Vec<&[u8]> = blocks.iter().map(|(_, b)| &b[..]).collect();
        top.write_run(blocks[0].0, &bufs, None)?;
        Ok(blocks)
    };
    let reads_back = |blocks: &[(u64, Vec<u8>)]| {
        for (off, b) in blocks {
            let mut back = vec![0u8; b.len()];
            top.read_verified(*off, &mut back, &|x: &[u8]| x == &b[..])
                .unwrap();
        }
    };

    let blocks = write_run(&[16384; 8]).unwrap();
    assert_eq!(counts(), [1; 6], "one request per child");
    reads_back(&blocks);
    let blocks = write_run(&[4096, 12288, 131072, 8192, 20480, 4096, 65536]).unwrap();
    let total: u64 = counts().iter().sum();
    assert!(total <= 12, "{total} requests for a ragged run");
    reads_back(&blocks);

    // Two children failing: written, and readable from the other four.
    for d in &devs[1..3] {
        d.set_faults(Faults {
            fail_writes: true,
            ..Faults::default()
        });
    }
    let blocks = write_run(&[16384; 8]).unwrap();
    reads_back(&blocks);
    // A third: the run fails.
    devs[4].set_faults(Faults {
        fail_writes: true,
        ..Faults::default()
    });
    assert!(write_run(&[16384; 8]).is_err());
}

/// Buffered writes of a raidz stripe's columns and of a mirror's copies run on the writing
/// thread, one after another: handing page-cache copies to the thread pool cost more in task
/// switches than the copies. Durable writes (the log's) wait for devices and go in parallel.
#[test]
fn buffered_column_and_mirror_writes_stay_on_the_writing_thread() {
    use std::sync::Mutex;
    use zeta::vdev::{Leaf, RaidzConfig, TopKind, TopVdev};
    let writers: Arc<Mutex<Vec<std::thread::ThreadId>>> = Arc::default();
    let leaves = |n: usize| -> Vec<Arc<Leaf>> {
        mem_devs(n, 8 * MB)
            .into_iter()
            .enumerate()
            .map(|(i, dev)| {
                let writers = writers.clone();
                let tap = Tap {
                    on_write: Box::new(move |_, _| {
                        writers.lock().unwrap().push(std::thread::current().id());
                    }),
                    ..Tap::new(dev)
                };
                Arc::new(Leaf::new(Arc::new(tap), i as u64 + 1))
            })
            .collect()
    };
    let raidz = TopVdev::new_raidz(
        0,
        1,
        RaidzConfig::new(2, 6, false).unwrap(),
        leaves(6).into_iter().map(Some).collect(),
    )
    .unwrap();
    let mirror = TopVdev::new(1, 2, TopKind::Mirror, leaves(2));
    let data = vec![7u8; 128 << 10];
    raidz.write(0, &data).unwrap();
    mirror.write_run(0, &[&data[..], &data[..]], None).unwrap();
    let me = std::thread::current().id();
    let seen = writers.lock().unwrap().clone();
    // Six columns; two buffers to each of the two copies.
    assert_eq!(seen.len(), 6 + 2 * 2);
    assert!(seen.iter().all(|&t| t == me), "{seen:?}");
}
