//! `zeta bench snap`: snapshots of a filled volume against btrfs (a read-only subvolume
//! snapshot of a file holding the same bytes, on a loop device) and qcow2 (`qemu-img
//! snapshot` of an image holding them), in the same run, at each size asked for: the time to
//! take one (median of --runs), to destroy one after 1 % and after 50 % of the volume was
//! rewritten, a full send's rate against reading the volume (`vol get`) and `btrfs send`, a
//! receive's rate against writing it (`vol put`), and an incremental stream's size against the
//! bytes changed. Then random 4K overwrites with 0, 1, 10 and 100 snapshots held.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, RngCore, SeedableRng};
use serde_json::{json, Value};

use crate::args::BenchSnapArgs;
use zeta_core::dsl::{Pool, PoolOptions, TopSpec};
use zeta_core::vdev::{BlockDevice, FileDevice};
use zeta_core::zvol::Volume;
use zeta_server::fmt::{human, parse_size};
use zeta_server::{usage, Error, Result};

const CHUNK: usize = 1 << 20;
/// The snapshot counts the overwrite test holds.
const SNAPSHOT_COUNTS: [usize; 4] = [0, 1, 10, 100];

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn mbps(bytes: u64, t: Instant) -> f64 {
    bytes as f64 / 1e6 / t.elapsed().as_secs_f64()
}

/// The offsets of the 1M chunks a rewrite of `percent` of the volume touches, spread over it.
fn share(size: u64, percent: u64, salt: u64) -> impl Iterator<Item = u64> {
    let chunks = size / CHUNK as u64;
    (0..chunks)
        .filter(move |c| (c * 7919 + salt) % 100 < percent)
        .map(|c| c * CHUNK as u64)
}

fn run_cmd(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| Error::io(Path::new(what), e))?;
    if !out.status.success() {
        return Err(usage(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

pub fn snap_bench(args: BenchSnapArgs) -> Result<()> {
    let sizes: Vec<u64> = (args.size.split(','))
        .map(parse_size)
        .collect::<Result<_>>()?;
    if sizes.is_empty()
        || sizes
            .iter()
            .any(|&s| s < 64 << 20 || !s.is_multiple_of(CHUNK as u64))
    {
        return Err(usage(
            "bench sizes must be whole numbers of MiB, at least 64M",
        ));
    }
    if args.runs == 0 {
        return Err(usage("--runs must be at least 1"));
    }
    let dir = args
        .dir
        .join(format!("zeta-bench-snap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let result = run(&dir, &sizes, &args);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

type Peer = std::result::Result<Value, String>;

fn run(dir: &Path, sizes: &[u64], args: &BenchSnapArgs) -> Result<()> {
    let mut rows = Vec::new();
    for &size in sizes {
        let z = zeta(dir, size, args.runs)?;
        let b = btrfs(dir, size, args.runs).map_err(|e| e.to_string());
        let q = qcow2(dir, size, args.runs).map_err(|e| e.to_string());
        rows.push(json!({"size": size, "zeta": z, "btrfs": peer(b), "qcow2": peer(q)}));
    }
    let overwrite = overwrites(dir, sizes[0], args.iops_secs)?;
    let ratio = |a: &Value, b: &Value| match (a.as_f64(), b.as_f64()) {
        (Some(a), Some(b)) if b > 0.0 => json!(a / b),
        _ => Value::Null,
    };
    for r in rows.iter_mut() {
        let z = r["zeta"].clone();
        let mut ratios = json!({
            "send_vs_read": ratio(&z["send_mbps"], &z["read_mbps"]),
            "receive_vs_write": ratio(&z["receive_mbps"], &z["write_mbps"]),
            "destroy_1_vs_50": ratio(&z["destroy_1_ms"], &z["destroy_50_ms"]),
            "incremental_vs_changed": ratio(&z["incremental_stream_bytes"], &z["incremental_changed_bytes"]),
        });
        for p in ["btrfs", "qcow2"] {
            ratios[format!("snapshot_vs_{p}")] = ratio(&z["snapshot_ms"], &r[p]["snapshot_ms"]);
            ratios[format!("destroy_1_vs_{p}")] = ratio(&z["destroy_1_ms"], &r[p]["destroy_1_ms"]);
        }
        ratios["send_vs_btrfs"] = ratio(&z["send_mbps"], &r["btrfs"]["send_mbps"]);
        r["ratios"] = ratios;
    }
    let base = overwrite[0]["iops"].clone();
    let overwrite: Vec<Value> = (overwrite.into_iter())
        .map(|mut o| {
            o["ratio_to_none"] = ratio(&o["iops"], &base);
            o
        })
        .collect();
    let v = json!({"runs": args.runs, "sizes": rows, "overwrite_4k": overwrite});
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
        return Ok(());
    }
    print_table(&v, dir);
    Ok(())
}

fn peer(p: Peer) -> Value {
    p.unwrap_or_else(|why| json!({"skipped": why}))
}

fn print_table(v: &Value, dir: &Path) {
    let f = |x: &Value, p: usize| x.as_f64().map_or("-".to_string(), |x| format!("{x:.p$}"));
    println!(
        "zeta bench snap: a volume (16K blocks) filled, on files under {}; snapshot times the \
         median of {} runs, the rest one run each",
        dir.parent().unwrap_or(dir).display(),
        v["runs"]
    );
    for r in v["sizes"].as_array().into_iter().flatten() {
        println!("\n{} volume", human(r["size"].as_u64().unwrap_or(0)));
        println!(
            "{:<20} {:>11} {:>12} {:>13} {:>10}",
            "", "snapshot ms", "destroy ms,", "destroy ms,", "send MB/s"
        );
        println!(
            "{:<20} {:>11} {:>12} {:>13} {:>10}",
            "", "", "1% new", "50% new", ""
        );
        for (name, key) in [
            ("zeta", "zeta"),
            ("btrfs (loop)", "btrfs"),
            ("qcow2", "qcow2"),
        ] {
            let p = &r[key];
            if let Some(why) = p["skipped"].as_str() {
                println!("{name:<20} skipped: {why}");
                continue;
            }
            println!(
                "{name:<20} {:>11} {:>12} {:>13} {:>10}",
                f(&p["snapshot_ms"], 1),
                f(&p["destroy_1_ms"], 1),
                f(&p["destroy_50_ms"], 1),
                f(&p["send_mbps"], 0)
            );
        }
        let z = &r["zeta"];
        println!(
            "zeta: read {} MB/s (vol get), write {} MB/s (vol put), receive {} MB/s; \
             incremental stream {} for {} changed",
            f(&z["read_mbps"], 0),
            f(&z["write_mbps"], 0),
            f(&z["receive_mbps"], 0),
            human(z["incremental_stream_bytes"].as_u64().unwrap_or(0)),
            human(z["incremental_changed_bytes"].as_u64().unwrap_or(0))
        );
        for (k, x) in r["ratios"].as_object().into_iter().flatten() {
            println!("  {k:<26} {}", f(x, 2));
        }
    }
    println!("\nrandom 4K overwrites with snapshots held");
    for o in v["overwrite_4k"].as_array().into_iter().flatten() {
        println!(
            "  {:>3} snapshots: {:>8} IOPS  ({}x none)",
            o["snapshots"],
            f(&o["iops"], 0),
            f(&o["ratio_to_none"], 2)
        );
    }
}

/// A pool of one file under `dir`; `prealloc`: its blocks allocated at once, so that writes
/// into new parts of it do not pay the host file system's first-write cost.
fn file_pool(dir: &Path, name: &str, bytes: u64, prealloc: bool) -> Result<Arc<Pool>> {
    let path = dir.join(format!("{name}-leaf"));
    let dev = FileDevice::create_with(&path, bytes, prealloc)?;
    let spec = vec![TopSpec::stripe((
        Arc::new(dev) as Arc<dyn BlockDevice>,
        path.display().to_string(),
    ))];
    let opts = PoolOptions {
        force: true,
        ..Default::default()
    };
    Ok(Pool::create(name, spec, opts)?)
}

fn reopen(dir: &Path, name: &str) -> Result<Arc<Pool>> {
    let path = dir.join(format!("{name}-leaf"));
    let dev = FileDevice::open(&path)?;
    let leaves = vec![(
        Arc::new(dev) as Arc<dyn BlockDevice>,
        path.display().to_string(),
    )];
    Ok(Pool::import(leaves, Some(name), PoolOptions::default())?)
}

fn fill(vol: &Volume, size: u64, rng: &mut rand::rngs::StdRng) -> Result<()> {
    let mut data = vec![0u8; CHUNK];
    for off in (0..size).step_by(CHUNK) {
        rng.fill_bytes(&mut data);
        vol.write(off, &data)?;
    }
    vol.flush()?;
    Ok(())
}

fn rewrite(
    vol: &Volume,
    size: u64,
    percent: u64,
    salt: u64,
    rng: &mut rand::rngs::StdRng,
) -> Result<u64> {
    let mut data = vec![0u8; CHUNK];
    let mut n = 0;
    for off in share(size, percent, salt) {
        rng.fill_bytes(&mut data);
        vol.write(off, &data)?;
        n += CHUNK as u64;
    }
    vol.flush()?;
    Ok(n)
}

/// zeta at one size: a pool of one file holding the volume and room for a received copy.
fn zeta(dir: &Path, size: u64, runs: usize) -> Result<Value> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(59);
    let pool = file_pool(dir, "bench", size * 4 + (512 << 20), false)?;
    pool.create_volume("v", size, 16384, None)?;
    let vol = Volume::open(&pool, "v")?;
    let t = Instant::now();
    fill(&vol, size, &mut rng)?;
    pool.sync_now()?;
    let write = mbps(size, t);
    pool.sync_frees()?;
    let mut snap = Vec::new();
    for run in 0..runs {
        let name = format!("v@r{run}");
        let t = Instant::now();
        pool.snapshot(&[&name])?;
        snap.push(ms(t));
        pool.destroy_snapshot(&name)?;
    }
    // A read of the whole volume, as `vol get` reads it, against a full send: both from a
    // pool opened afresh (nothing in its block cache; the files in the page cache for both).
    drop(vol);
    pool.close()?;
    drop(pool);
    let pool = reopen(dir, "bench")?;
    let vol = Volume::open(&pool, "v")?;
    let t = Instant::now();
    let mut buf = vec![0u8; CHUNK];
    for off in (0..size).step_by(CHUNK) {
        vol.read(off, &mut buf)?;
    }
    let read = mbps(size, t);
    pool.snapshot(&["v@base"])?;
    // A full send to nowhere (`> /dev/null`); then again into a file, for the receive.
    let t = Instant::now();
    pool.send("v@base", None, &mut std::io::sink(), &mut |_| true)?;
    let send = mbps(size, t);
    let stream = dir.join("full.zs");
    {
        let f = std::fs::File::create(&stream).map_err(|e| Error::io(&stream, e))?;
        let mut w = std::io::BufWriter::with_capacity(CHUNK, f);
        pool.send("v@base", None, &mut w, &mut |_| true)?;
    }
    let t = Instant::now();
    {
        let f = std::fs::File::open(&stream).map_err(|e| Error::io(&stream, e))?;
        let mut r = std::io::BufReader::with_capacity(CHUNK, f);
        zeta_core::zvol::receive::receive(&pool, "copy", &mut r, false, false, &mut |_| true)?;
        pool.sync_now()?;
    }
    let receive = mbps(size, t);
    let _ = std::fs::remove_file(&stream);
    pool.destroy_snapshot("copy@base")?;
    pool.destroy_volume("copy")?;
    // Destroys after 1 % and after 50 % rewritten, and the incremental stream of the 1 %.
    let changed = rewrite(&vol, size, 1, 1, &mut rng)?;
    pool.snapshot(&["v@one"])?;
    let mut counter = Counter(0);
    pool.send("v@one", Some("v@base"), &mut counter, &mut |_| true)?;
    pool.destroy_snapshot("v@one")?;
    pool.sync_now()?;
    let t = Instant::now();
    pool.destroy_snapshot("v@base")?;
    let destroy_1 = ms(t);
    pool.snapshot(&["v@half"])?;
    rewrite(&vol, size, 50, 2, &mut rng)?;
    pool.sync_now()?;
    let t = Instant::now();
    pool.destroy_snapshot("v@half")?;
    let destroy_50 = ms(t);
    drop(vol);
    pool.close()?;
    drop(pool);
    let _ = std::fs::remove_file(dir.join("bench-leaf"));
    Ok(json!({
        "snapshot_ms": median(&snap), "destroy_1_ms": destroy_1, "destroy_50_ms": destroy_50,
        "send_mbps": send, "read_mbps": read, "receive_mbps": receive, "write_mbps": write,
        "incremental_stream_bytes": counter.0, "incremental_changed_bytes": changed,
    }))
}

/// Counts the bytes written to it.
struct Counter(u64);

impl std::io::Write for Counter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Random 4K overwrites of a filled volume for `secs` each, with 0, 1, 10 and 100 snapshots
/// held (each taken after its share of the writes, so every one holds blocks the head
/// rewrote since): writes per second, each txg committing as it comes. Each count runs on a
/// pool of its own, filled afresh, so that none runs on a pool the ones before filled up. A
/// first run with none is not counted, and the counts run in order and then in reverse, each
/// figure the mean of its two: whichever ran first ran 0.45-0.6x the others, and later runs
/// ran faster still (the process's memory growing into the cache and dirty buffers),
/// snapshots or not.
fn overwrites(dir: &Path, size: u64, secs: f64) -> Result<Vec<Value>> {
    let mut got: Vec<(usize, f64)> = Vec::new();
    let warm_up = std::iter::once((None, 0));
    let there = SNAPSHOT_COUNTS.iter().map(|&n| (Some(n), n));
    let back = SNAPSHOT_COUNTS.iter().rev().map(|&n| (Some(n), n));
    for (i, (counts, n)) in warm_up.chain(there).chain(back).enumerate() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(61 + i as u64);
        // Room for what the snapshots keep of the overwrites, allocated up front: with
        // snapshots held nothing is freed, every write goes to space never written before,
        // and in a sparse file that costs the host file system a first write the run
        // without snapshots, reusing its freed space, does not pay.
        let name = format!("iops{n}");
        let pool = file_pool(dir, &name, size * 2 + (4 << 30), true)?;
        pool.create_volume("v", size, 16384, None)?;
        let vol = Volume::open(&pool, "v")?;
        fill(&vol, size, &mut rng)?;
        pool.sync_frees()?;
        let blocks = size / 4096;
        let mut data = vec![0u8; 4096];
        for held in 1..=n {
            for _ in 0..64 {
                rng.fill_bytes(&mut data);
                vol.write(rng.gen_range(0..blocks) * 4096, &data)?;
            }
            pool.snapshot(&[&format!("v@h{held}")])?;
        }
        pool.sync_now()?;
        let t = Instant::now();
        let mut done = 0u64;
        while t.elapsed() < Duration::from_secs_f64(secs) {
            for _ in 0..256 {
                rng.fill_bytes(&mut data[..8]);
                vol.write(rng.gen_range(0..blocks) * 4096, &data)?;
            }
            done += 256;
        }
        vol.flush()?;
        pool.sync_now()?;
        let iops = done as f64 / t.elapsed().as_secs_f64();
        if counts.is_some() {
            got.push((n, iops));
        }
        drop(vol);
        pool.close()?;
        drop(pool);
        let _ = std::fs::remove_file(dir.join(format!("{name}-leaf")));
    }
    Ok(SNAPSHOT_COUNTS
        .iter()
        .map(|&n| {
            let runs: Vec<f64> = got.iter().filter(|g| g.0 == n).map(|g| g.1).collect();
            let iops = runs.iter().sum::<f64>() / runs.len() as f64;
            json!({"snapshots": n, "iops": iops, "runs": runs})
        })
        .collect())
}

/// Unmounts a loop mount when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// btrfs on a loop device: a file of the volume's bytes in a subvolume. Snapshots are
/// `btrfs subvolume snapshot -r` (a transaction commit), deletes `subvolume delete
/// --commit-after` (their space freed, as zeta's destroy frees it), and `btrfs send` of a
/// snapshot goes to /dev/null.
fn btrfs(dir: &Path, size: u64, runs: usize) -> Result<Value> {
    use std::os::unix::fs::FileExt;
    // SAFETY: geteuid has no preconditions and only reads the process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return Err(usage("needs root (a loop mount)"));
    }
    if Command::new("mkfs.btrfs")
        .arg("--version")
        .output()
        .is_err()
    {
        return Err(usage("mkfs.btrfs not found (apt-get install btrfs-progs)"));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(59);
    let img = dir.join("btrfs.img");
    let mnt = dir.join("btrfs");
    let io = |e: std::io::Error| Error::io(&img, e);
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(size * 3 + (1 << 30)))
        .map_err(io)?;
    std::fs::create_dir_all(&mnt).map_err(io)?;
    run_cmd(Command::new("mkfs.btrfs").arg("-f").arg(&img), "mkfs.btrfs")?;
    run_cmd(
        Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt),
        "mount",
    )?;
    let _mounted = Mounted(mnt.clone());
    let sub = mnt.join("vol");
    run_cmd(
        Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(&sub),
        "btrfs subvolume create",
    )?;
    let file = std::fs::File::create(sub.join("img")).map_err(io)?;
    let mut data = vec![0u8; CHUNK];
    for off in (0..size).step_by(CHUNK) {
        rng.fill_bytes(&mut data);
        file.write_all_at(&data, off).map_err(io)?;
    }
    file.sync_all().map_err(io)?;
    let snapshot = |name: &str| {
        run_cmd(
            Command::new("btrfs")
                .args(["subvolume", "snapshot", "-r"])
                .arg(&sub)
                .arg(mnt.join(name)),
            "btrfs subvolume snapshot",
        )
    };
    let delete = |name: &str| {
        run_cmd(
            Command::new("btrfs")
                .args(["subvolume", "delete", "--commit-after"])
                .arg(mnt.join(name)),
            "btrfs subvolume delete",
        )
    };
    let mut snap = Vec::new();
    for run in 0..runs {
        let t = Instant::now();
        snapshot(&format!("r{run}"))?;
        snap.push(ms(t));
        delete(&format!("r{run}"))?;
    }
    snapshot("base")?;
    let t = Instant::now();
    run_cmd(
        Command::new("btrfs").arg("send").arg(mnt.join("base")),
        "btrfs send",
    )?;
    let send = mbps(size, t);
    let mut destroys = Vec::new();
    for (percent, salt) in [(1, 1), (50, 2)] {
        if percent == 50 {
            snapshot("half")?;
        }
        for off in share(size, percent, salt) {
            rng.fill_bytes(&mut data);
            file.write_all_at(&data, off).map_err(io)?;
        }
        file.sync_all().map_err(io)?;
        let t = Instant::now();
        delete(if percent == 1 { "base" } else { "half" })?;
        destroys.push(ms(t));
    }
    drop(file);
    drop(_mounted);
    let _ = std::fs::remove_file(&img);
    Ok(
        json!({"snapshot_ms": median(&snap), "destroy_1_ms": destroys[0],
              "destroy_50_ms": destroys[1], "send_mbps": send}),
    )
}

/// qcow2: an image of the volume's size written whole with `qemu-io`; snapshots with
/// `qemu-img snapshot -c`, rewrites with `qemu-io`, deletes with `qemu-img snapshot -d`.
fn qcow2(dir: &Path, size: u64, runs: usize) -> Result<Value> {
    if Command::new("qemu-img").arg("--version").output().is_err() {
        return Err(usage("qemu-img not found (apt-get install qemu-utils)"));
    }
    let img = dir.join("img.qcow2");
    run_cmd(
        Command::new("qemu-img")
            .args(["create", "-f", "qcow2"])
            .arg(&img)
            .arg(size.to_string()),
        "qemu-img create",
    )?;
    let qio = |cmds: Vec<String>| {
        let mut c = Command::new("qemu-io");
        c.args(["-f", "qcow2"]);
        for cmd in cmds {
            c.arg("-c").arg(cmd);
        }
        c.arg(&img);
        run_cmd(&mut c, "qemu-io")
    };
    let snap_cmd = |op: &str, name: &str| {
        run_cmd(
            Command::new("qemu-img")
                .args(["snapshot", op, name])
                .arg(&img),
            "qemu-img snapshot",
        )
    };
    // In pieces of at most 1G: qemu-io refuses longer requests.
    qio((0..size)
        .step_by(1 << 30)
        .map(|o| format!("write -P 0x5a {o} {}", (size - o).min(1 << 30)))
        .collect())?;
    let mut snap = Vec::new();
    for run in 0..runs {
        let t = Instant::now();
        snap_cmd("-c", &format!("r{run}"))?;
        snap.push(ms(t));
        snap_cmd("-d", &format!("r{run}"))?;
    }
    let mut destroys = Vec::new();
    for (percent, salt) in [(1, 1), (50, 2)] {
        snap_cmd("-c", "s")?;
        qio(share(size, percent, salt)
            .map(|o| format!("write -P 0x{percent:x} {o} {CHUNK}"))
            .collect())?;
        let t = Instant::now();
        snap_cmd("-d", "s")?;
        destroys.push(ms(t));
    }
    let _ = std::fs::remove_file(&img);
    Ok(
        json!({"snapshot_ms": median(&snap), "destroy_1_ms": destroys[0],
              "destroy_50_ms": destroys[1]}),
    )
}
