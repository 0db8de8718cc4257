//! The intent log under real crashes: clients write to two volumes over NBD with FUA and
//! FLUSH while `zeta serve` is killed with SIGKILL at random moments, some of them before it
//! serves (perhaps while it replays what the last one left). After about half the kills the
//! pool is imported here: every write acknowledged as durable reads back exactly, every slot
//! holds a whole version, and replaying the log's records a second time changes nothing. Once with
//! 16K volume blocks (writes logged by value) and once with 128K blocks written whole (written
//! in place and logged by block pointer), on three stripes; and once on a raidz2 of six files,
//! where no crash may leave a leaf with an error counted: a log block a kill tore, its
//! columns partly written, is the crash's doing, not a device's.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::nbd_client::Client;
use common::procs::{import_files, seed_from_env, spawn_server};
use rand::{Rng, SeedableRng};
use zeta::dsl::{Pool, PoolOptions};
use zeta::zil::Record;
use zeta::zvol::Volume;

const SLOTS: u64 = 64;
const CMD_WRITE: u16 = 1;
const CMD_FLUSH: u16 = 3;
const FLAG_FUA: u16 = 1;

fn zeta(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zeta"));
    c.env("ZETA_HOME", home);
    c
}

fn stamp(slot: u64, version: u64, size: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(size);
    while b.len() < size {
        b.extend_from_slice(&slot.to_le_bytes());
        b.extend_from_slice(&version.to_le_bytes());
    }
    b
}

/// Starts `zeta serve` on a free port; returns the child and its address.
fn serve(home: &Path) -> (std::process::Child, SocketAddr) {
    let mut cmd = zeta(home);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "tank"])
        .stderr(Stdio::null());
    let (child, addr, _) = spawn_server(cmd);
    (child, addr)
}

/// The pool's vdevs: three stripes, or one raidz2.
#[derive(Clone, Copy)]
enum Layout {
    Stripes,
    Raidz2,
}

impl Layout {
    fn files(self, dir: &Path) -> Vec<PathBuf> {
        let n = match self {
            Layout::Stripes => 3,
            Layout::Raidz2 => 6,
        };
        (0..n).map(|i| dir.join(format!("d{i}"))).collect()
    }
}

fn import(dir: &Path, layout: Layout) -> Arc<Pool> {
    import_files(&layout.files(dir), "tank", PoolOptions::default())
}

fn version_of(got: &[u8], slot: u64) -> Option<u64> {
    if got.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let v = u64::from_le_bytes(got[8..16].try_into().unwrap());
    (got == stamp(slot, v, got.len())).then_some(v)
}

fn cycles(default: u64) -> u64 {
    std::env::var("ZETA_CRASH_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn sigkill_of_the_server_under_fua_and_flush() {
    crash_cycles(16 << 10, cycles(50), Layout::Stripes);
}

#[test]
fn sigkill_under_fua_and_flush_with_large_writes_made_in_place() {
    crash_cycles(128 << 10, cycles(25), Layout::Stripes);
}

#[test]
fn sigkill_of_a_raidz2_server_counts_no_device_errors() {
    crash_cycles(16 << 10, cycles(40), Layout::Raidz2);
}

const VOLS: [&str; 2] = ["v", "w"];

/// Writes of whole `SLOT`-byte slots to two volumes of `SLOT`-byte blocks, through one client
/// each. After some kills the pool is checked here; after the others the next server replays
/// the logs itself when it starts, and some servers are killed before they are up, perhaps
/// in the middle of that replay. A check always ends the run.
#[allow(non_snake_case)]
fn crash_cycles(SLOT: usize, cycles: u64, layout: Layout) {
    let seed = seed_from_env("ZETA_CRASH_SEED");
    eprintln!("zil crash seed {seed}, {cycles} cycles (ZETA_CRASH_SEED / ZETA_CRASH_CYCLES)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let mut args = vec![
        "pool".to_string(),
        "create".into(),
        "-o".into(),
        "size=64M".into(),
    ];
    args.push("tank".into());
    if let Layout::Raidz2 = layout {
        args.push("raidz2".into());
    }
    args.extend(
        layout
            .files(tmp.path())
            .iter()
            .map(|p| p.display().to_string()),
    );
    assert!(zeta(&home).args(&args).status().unwrap().success());
    for vol in VOLS {
        assert!(zeta(&home)
            .args([
                "vol",
                "create",
                "-b",
                &format!("{}K", SLOT >> 10),
                &format!("tank/{vol}"),
                &format!("{}", SLOTS * SLOT as u64)
            ])
            .status()
            .unwrap()
            .success());
    }

    // durable[vol][slot]: the newest version acknowledged durable.
    let mut durable = vec![vec![0u64; SLOTS as usize]; VOLS.len()];
    let mut next_version = 1u64;
    let mut log_writes = 0u64;
    let mut in_place = 0u64;
    for cycle in 0..cycles {
        if rng.gen_ratio(1, 5) {
            // Killed before it serves: maybe while it replays what the last one left.
            let mut cmd = zeta(&home);
            cmd.args(["serve", "--listen", "127.0.0.1:0", "tank"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let mut child = cmd.spawn().unwrap();
            std::thread::sleep(Duration::from_millis(rng.gen_range(0..60)));
            child.kill().unwrap();
            child.wait().unwrap();
            continue;
        }
        let (mut child, addr) = serve(&home);
        let mut clients: Vec<Client> = VOLS
            .iter()
            .map(|v| Client::open(addr, &format!("tank/{v}")))
            .collect();
        let kill_at = Instant::now() + Duration::from_millis(rng.gen_range(20..250));
        // Writes acknowledged but not yet covered by a FLUSH reply, per volume.
        let mut unflushed: Vec<Vec<(u64, u64)>> = vec![Vec::new(); VOLS.len()];
        let mut cookie = 0u64;
        'run: while Instant::now() < kill_at {
            let vi = rng.gen_range(0..VOLS.len());
            let c = &mut clients[vi];
            cookie += 1;
            let slot = rng.gen_range(0..SLOTS);
            let v = next_version;
            next_version += 1;
            let fua = rng.gen_ratio(1, 3);
            let data = stamp(slot, v, SLOT);
            let flags = if fua { FLAG_FUA } else { 0 };
            if c.send(
                CMD_WRITE,
                flags,
                cookie,
                slot * SLOT as u64,
                SLOT as u32,
                &data,
            )
            .is_err()
            {
                break;
            }
            match c.recv() {
                Ok(r) if r.error == 0 => {}
                _ => break,
            }
            if fua {
                durable[vi][slot as usize] = durable[vi][slot as usize].max(v);
            } else {
                unflushed[vi].push((slot, v));
            }
            if rng.gen_ratio(1, 4) {
                cookie += 1;
                if c.send(CMD_FLUSH, 0, cookie, 0, 0, &[]).is_err() {
                    break 'run;
                }
                match c.recv() {
                    Ok(r) if r.error == 0 => {
                        for (s, v) in unflushed[vi].drain(..) {
                            durable[vi][s as usize] = durable[vi][s as usize].max(v);
                        }
                    }
                    _ => break 'run,
                }
            }
        }
        // Counted by the server, asked through its control socket before the kill.
        let iostat = zeta(&home)
            .args(["pool", "iostat", "--json", "tank"])
            .output()
            .unwrap();
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&iostat.stdout) {
            in_place += v["log"]["records_in_place"].as_u64().unwrap_or(0);
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        drop(clients);
        if cycle + 1 == cycles || rng.gen_bool(0.5) {
            log_writes += check(tmp.path(), layout, SLOT, &durable, (seed, cycle));
        }
    }
    log_writes += check(tmp.path(), layout, SLOT, &durable, (seed, cycles));
    // What a user would read: no device has an error to its name after the crashes.
    let status = zeta(&home)
        .args(["pool", "status", "--json", "tank"])
        .output()
        .unwrap();
    assert!(status.status.success());
    let st: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let leaves = st[0]["vdevs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|v| v["leaves"].as_array().unwrap().iter());
    for leaf in leaves {
        for counter in [
            "read_errors",
            "write_errors",
            "cksum_errors",
            "repaired_bytes",
        ] {
            assert_eq!(
                leaf[counter], 0,
                "seed {seed}: {counter} of {}",
                leaf["path"]
            );
        }
    }
    // The crashes must have caught acknowledged writes in the log, or this tested nothing.
    assert!(log_writes > 0, "no cycle left records in the log to replay");
    if SLOT >= 32 << 10 {
        // And those writes went to their place, the log holding only their pointers.
        assert!(
            in_place > 0,
            "no acknowledged write was logged by block pointer"
        );
    }
}

/// Imports the pool, replays each volume's log and checks that every slot holds a whole
/// version, no older than the one acknowledged durable; then that applying the replayed
/// records once more changes nothing, and that no leaf has an error counted (the
/// counters this import and every server's before it kept). Returns how many records were
/// replayed.
#[allow(non_snake_case)]
fn check(
    dir: &Path,
    layout: Layout,
    SLOT: usize,
    durable: &[Vec<u64>],
    (seed, cycle): (u64, u64),
) -> u64 {
    let pool = import(dir, layout);
    let mut replayed = 0;
    for (vi, name) in VOLS.iter().enumerate() {
        let ds = pool.dataset(name).unwrap();
        let records: Vec<Record> = pool.pending_replay(&ds).unwrap_or_default();
        let records = common::records_with_data(&pool, records);
        replayed += records.len() as u64;
        let vol = Volume::open(&pool, name).unwrap();
        let mut once = vec![0u8; (SLOTS * SLOT as u64) as usize];
        vol.read(0, &mut once).unwrap();
        for slot in 0..SLOTS {
            let got = &once[slot as usize * SLOT..(slot as usize + 1) * SLOT];
            let v = version_of(got, slot).unwrap_or_else(|| {
                panic!("seed {seed} cycle {cycle}: {name} slot {slot} is not a whole version")
            });
            assert!(
                v >= durable[vi][slot as usize],
                "seed {seed} cycle {cycle}: {name} slot {slot} holds version {v}, but version \
                 {} was acknowledged durable",
                durable[vi][slot as usize]
            );
        }
        // Replaying the same records once more over the result changes nothing.
        for r in &records {
            match r {
                Record::Write { offset, data, .. } => vol.write(*offset, data).unwrap(),
                Record::Zero { offset, len, .. } => vol.trim(*offset, *len).unwrap(),
                Record::Indirect { .. } => panic!("records_with_data reads writes in place"),
            }
        }
        let mut twice = vec![0u8; once.len()];
        vol.read(0, &mut twice).unwrap();
        assert!(
            once == twice,
            "seed {seed} cycle {cycle}: a second replay changed {name}"
        );
    }
    pool.verify()
        .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: verify failed: {e}"));
    for t in pool.vdev_status() {
        for l in &t.leaves {
            let counted = [
                l.read_errors,
                l.write_errors,
                l.cksum_errors,
                l.repaired_bytes,
            ];
            assert_eq!(counted, [0; 4], "seed {seed} cycle {cycle}: {}", l.path);
        }
    }
    pool.close().unwrap();
    replayed
}

/// A log block that fails its checksum when the server restarts after a SIGKILL (damaged
/// on a pool without redundancy, long after it was written) is named on the server's
/// standard error by the import that finds it, rather than ending the replay without a
/// word: the writes acknowledged in it and after it are lost.
#[test]
fn a_damaged_log_block_is_reported_by_the_server_that_imports_it() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let file = tmp.path().join("d0");
    let f = file.display().to_string();
    for args in [
        vec!["pool", "create", "-o", "size=64M", "tank", &f],
        vec!["vol", "create", "-b", "16K", "tank/v0", "1M"],
    ] {
        assert!(zeta(&home).args(&args).status().unwrap().success());
    }
    let (mut child, addr) = serve(&home);
    let mut c = Client::open(addr, "tank/v0");
    // Each FUA write at queue depth one commits a log block of its own.
    for i in 0..8u64 {
        let r = c.call(CMD_WRITE, FLAG_FUA, i * 16384, 12288, &stamp(i, 1, 12288));
        assert_eq!(r.error, 0);
    }
    child.kill().unwrap();
    child.wait().unwrap();

    // The block holding the second write, found by its data, gets eight bad bytes.
    let img = std::fs::read(&file).unwrap();
    let second = &stamp(1, 1, 64)[..];
    let at = (0..img.len() - 16384)
        .step_by(4096)
        .find(|&at| {
            img[at..at + 8] == zeta::zil::block::MAGIC.to_le_bytes()
                && img[at..at + 16384].windows(64).any(|w| w == second)
        })
        .expect("the second write's log block");
    let dev = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    std::os::unix::fs::FileExt::write_at(&dev, &[0x5a; 8], at as u64 + 300).unwrap();
    drop(dev);

    let errors = tmp.path().join("serve.err");
    let mut cmd = zeta(&home);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "tank"])
        .stderr(std::fs::File::create(&errors).unwrap());
    let (mut child, addr, _) = spawn_server(cmd);
    let mut c = Client::open(addr, "tank/v0");
    assert_eq!(c.read(0, 12288).unwrap(), stamp(0, 1, 12288), "before it");
    assert_eq!(c.read(16384, 12288).unwrap(), vec![0u8; 12288], "in it");
    child.kill().unwrap();
    child.wait().unwrap();
    let said = std::fs::read_to_string(&errors).unwrap();
    assert!(
        said.contains("warning: tank/v0: intent log block")
            && said.contains("fails its checksum")
            && said.contains("damaged since"),
        "{said}"
    );
}
