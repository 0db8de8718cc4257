//! Crash test: a child process writes and flushes a volume on file vdevs while this process
//! kills it with SIGKILL at random moments. After every kill the pool must import, verify
//! completely, and hold every write the child reported flushed.
//!
//! Each generation g writes a seeded set of blocks stamped (g, block); the child prints
//! "F g" after the flush of generation g returns. Writes of the generation in progress at the
//! kill may or may not be present, but each block is whole.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use zeta::dsl::{Pool, PoolOptions, TopSpec};
use zeta::vdev::{BlockDevice, FileDevice};
use zeta::zvol::Volume;

mod common;
use common::procs::{import_files, seed_from_env};

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

fn devices(dir: &Path) -> Vec<PathBuf> {
    vec![dir.join("a"), dir.join("b")]
}

fn open(dir: &Path) -> Arc<Pool> {
    import_files(&devices(dir), "crash", opts())
}

/// The child: runs generations from `start` until killed.
fn child(dir: &Path, start: u64) {
    let pool = open(dir);
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

#[test]
fn sigkill_during_writes_and_flushes() {
    if let Ok(spec) = std::env::var("ZETA_CRASH_CHILD") {
        let (dir, start) = spec.split_once(',').unwrap();
        child(Path::new(dir), start.parse().unwrap());
        return;
    }
    let seed = seed_from_env("ZETA_CRASH_SEED");
    let cycles: u64 = std::env::var("ZETA_CRASH_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(CYCLES);
    eprintln!(
        "crash test seed {seed} ({cycles} cycles; ZETA_CRASH_SEED / ZETA_CRASH_CYCLES to change)"
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    {
        let leaves = devices(dir)
            .iter()
            .map(|p| {
                (
                    Arc::new(FileDevice::create(p, 96 << 20).unwrap()) as Arc<dyn BlockDevice>,
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
            .args([
                "--exact",
                "sigkill_during_writes_and_flushes",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("ZETA_CRASH_CHILD", format!("{},{next_gen}", dir.display()))
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

        let pool = open(dir);
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
