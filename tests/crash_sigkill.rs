//! Crash test: a child process writes and flushes a volume on file vdevs while this process
//! kills it with SIGKILL at random moments. After every kill the pool must import, verify
//! completely, and hold every write the child reported flushed.
//!
//! Each generation g writes a seeded set of blocks stamped (g, block); the child prints
//! "F g" after the flush of generation g returns. Writes of the generation in progress at the
//! kill may or may not be present, but each block is whole.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use zeta::dsl::{Pool, PoolOptions, TopSpec};
use zeta::vdev::FileDevice;
use zeta::zvol::Volume;

mod common;
use common::procs::seed_from_env;

const BS: usize = 16384;
const BLOCKS: u64 = 256;
const PER_GEN: usize = 24;
const CYCLES: u64 = 50;

fn opts() -> PoolOptions {
    PoolOptions {
        txg_timeout: Duration::from_millis(50),
        dirty_max_bytes: 8 << 20,
        cache_bytes: 4 << 20,
        ..Default::default()
    }
}

fn gen_blocks(g: u64) -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(g * 7919 + 1);
    (0..PER_GEN).map(|_| rng.gen_range(0..BLOCKS)).collect()
}

fn stamp(g: u64, blk: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(BS);
    while b.len() < BS {
        b.extend_from_slice(&g.to_le_bytes());
        b.extend_from_slice(&blk.to_le_bytes());
    }
    b
}

/// Returns the generation stamped in a block (0 for never written), or None if it is torn.
fn read_stamp(data: &[u8], blk: u64) -> Option<u64> {
    if data.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let g = u64::from_le_bytes(data[0..8].try_into().unwrap());
    (data == stamp(g, blk).as_slice()).then_some(g)
}

/// Imports the pool on `devices`. A RADOS device's lease outlives a killed owner by up to
/// a lease (`ZETA_RADOS_LEASE_SECS`, short here): the import waits until it lapses.
fn open(devices: &[PathBuf]) -> Arc<Pool> {
    let t0 = Instant::now();
    loop {
        let opened: Result<Vec<_>, _> = devices
            .iter()
            .map(|p| zeta::vdev::scheme::open(p, false).map(|d| (d, p.display().to_string())))
            .collect();
        match opened {
            Ok(leaves) => return Pool::import(leaves, Some("crash"), opts()).expect("import"),
            Err(e) if e.to_string().contains("in use") && t0.elapsed() < LEASE_WAIT => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(e) => panic!("open the devices: {e}"),
        }
    }
}

const LEASE_WAIT: Duration = Duration::from_secs(30);

/// The child: runs generations from `start` until killed.
fn child(devices: &[PathBuf], start: u64) {
    zeta_rados::register();
    let pool = open(devices);
    let vol = Volume::open(&pool, "v").unwrap();
    let mut g = start;
    loop {
        for blk in gen_blocks(g) {
            vol.write(blk * BS as u64, &stamp(g, blk)).unwrap();
        }
        vol.flush().unwrap();
        println!("F {g}");
        g += 1;
    }
}

/// The child's side of either test: `ZETA_CRASH_CHILD` is "START,DEVICE,DEVICE...".
fn as_child() -> bool {
    let Ok(spec) = std::env::var("ZETA_CRASH_CHILD") else {
        return false;
    };
    let mut words = spec.split(',');
    let start = words.next().unwrap().parse().unwrap();
    let devices: Vec<PathBuf> = words.map(PathBuf::from).collect();
    child(&devices, start);
    true
}

#[test]
fn sigkill_during_writes_and_flushes() {
    if as_child() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let devices = vec![tmp.path().join("a"), tmp.path().join("b")];
    for p in &devices {
        FileDevice::create(p, 96 << 20).unwrap();
    }
    sigkill_loop("sigkill_during_writes_and_flushes", &devices, CYCLES);
}

/// The same on a mirror of two RADOS devices of a real cluster: every flushed generation
/// survives the owner's SIGKILL, and the next owner imports once the lease lapses.
#[test]
fn sigkill_during_writes_and_flushes_on_rados() {
    if as_child() {
        return;
    }
    let Some(ceph) = common::rados::ceph_pool() else {
        return;
    };
    let devices = common::rados::new_devices(ceph, "crash", 2, 96 << 20);
    sigkill_loop(
        "sigkill_during_writes_and_flushes_on_rados",
        &devices,
        RADOS_CYCLES,
    );
    devices.iter().for_each(|p| zeta::vdev::scheme::remove(p));
}

/// Fewer cycles on RADOS: each waits for the killed child's lease to lapse.
const RADOS_CYCLES: u64 = 12;

fn sigkill_loop(test: &str, devices: &[PathBuf], default_cycles: u64) {
    let seed = seed_from_env("ZETA_CRASH_SEED");
    let cycles: u64 = std::env::var("ZETA_CRASH_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_cycles);
    eprintln!(
        "crash test seed {seed} ({cycles} cycles; ZETA_CRASH_SEED / ZETA_CRASH_CYCLES to change)"
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let list: Vec<String> = devices.iter().map(|p| p.display().to_string()).collect();
    {
        let leaves = devices
            .iter()
            .map(|p| {
                (
                    zeta::vdev::scheme::open(p, false).unwrap(),
                    p.display().to_string(),
                )
            })
            .collect();
        let pool = Pool::create("crash", vec![TopSpec::mirror(leaves)], opts()).unwrap();
        pool.create_volume("v", BLOCKS * BS as u64, BS as u32, None)
            .unwrap();
        pool.close().unwrap();
    }
    // model[blk] = generation the block must hold at least; it may hold the in-flight one.
    let mut model = vec![0u64; BLOCKS as usize];
    let mut next_gen = 1u64;
    let exe = std::env::current_exe().unwrap();
    for cycle in 0..cycles {
        let mut c = Command::new(&exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env("ZETA_CRASH_CHILD", format!("{next_gen},{}", list.join(",")))
            .env("ZETA_RADOS_LEASE_SECS", "2")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = c.stdout.take().unwrap();
        let kill_after = Duration::from_millis(rng.gen_range(30..400));
        let reader = std::thread::spawn(move || {
            let mut flushed = Vec::new();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // The first report shares its line with the harness's "test NAME ... ",
                // which --nocapture prints without a newline before the test runs.
                let mut words = line.split_whitespace().skip_while(|w| *w != "F");
                if words.next().is_some() {
                    flushed.push(words.next().unwrap().parse::<u64>().unwrap());
                }
            }
            flushed
        });
        let t0 = Instant::now();
        while t0.elapsed() < kill_after {
            if let Ok(Some(status)) = c.try_wait() {
                panic!("seed {seed} cycle {cycle}: child exited early: {status}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();
        let flushed = reader.join().unwrap();
        let last_flushed = flushed.last().copied().unwrap_or(next_gen - 1);
        let flushed_seen = flushed.len();
        let in_flight = last_flushed + 1;
        for g in next_gen..=last_flushed {
            for blk in gen_blocks(g) {
                model[blk as usize] = g;
            }
        }
        let maybe: Vec<u64> = gen_blocks(in_flight);

        let pool = open(devices);
        pool.verify()
            .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: verify failed: {e}"));
        let vol = Volume::open(&pool, "v").unwrap();
        let mut buf = vec![0u8; BS];
        for blk in 0..BLOCKS {
            vol.read(blk * BS as u64, &mut buf).unwrap();
            let got = read_stamp(&buf, blk)
                .unwrap_or_else(|| panic!("seed {seed} cycle {cycle}: block {blk} torn"));
            let want = model[blk as usize];
            let ok = got == want || (got == in_flight && maybe.contains(&blk));
            assert!(ok, "seed {seed} cycle {cycle}: block {blk} holds generation {got}, expected {want} (last flushed {last_flushed}, started at {next_gen}, flushed {flushed_seen} gens)");
            model[blk as usize] = got;
        }
        pool.close().unwrap();
        drop(pool);
        next_gen = in_flight + 1;
    }
}
