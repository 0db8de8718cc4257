//! `zeta bench snap`: snapshots of a filled volume against btrfs (a read-only subvolume
//! snapshot of a file holding the same bytes, on a loop device) and qcow2 (`qemu-img
//! snapshot` of an image holding them), in the same run: the time to take one, to destroy one
//! after a tenth of the volume was rewritten, and a full send's rate (`btrfs send`). Beside
//! them, zeta's txg commit of one 4K write: the floor a snapshot, which is one txg, sits on.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use rand::{RngCore, SeedableRng};
use serde_json::{json, Value};

use crate::args::BenchSnapArgs;
use zeta_core::dsl::{Pool, PoolOptions, TopSpec};
use zeta_core::vdev::{BlockDevice, FileDevice};
use zeta_core::zvol::Volume;
use zeta_server::fmt::{human, parse_size};
use zeta_server::{usage, Error, Result};

const CHUNK: usize = 1 << 20;

/// One peer's medians, in milliseconds and MB/s; `None` where it has no such operation.
#[derive(Default, Clone)]
struct Figures {
    snapshot_ms: Vec<f64>,
    destroy_ms: Vec<f64>,
    send_mbps: Vec<f64>,
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

impl Figures {
    fn json(&self) -> Value {
        json!({"snapshot_ms": median(&self.snapshot_ms), "destroy_ms": median(&self.destroy_ms),
               "send_mbps": median(&self.send_mbps)})
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The offsets of the chunks a run rewrites: a tenth of the volume, spread over it.
fn tenth(size: u64, run: usize) -> impl Iterator<Item = u64> {
    let chunks = size / CHUNK as u64;
    (0..chunks)
        .filter(move |c| (c + run as u64).is_multiple_of(10))
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
    let size = parse_size(&args.size)?;
    if size < 64 << 20 || !size.is_multiple_of(CHUNK as u64) {
        return Err(usage(
            "bench size must be a whole number of MiB, at least 64M",
        ));
    }
    if args.runs == 0 {
        return Err(usage("--runs must be at least 1"));
    }
    let dir = args
        .dir
        .join(format!("zeta-bench-snap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let result = run(&dir, size, &args);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run(dir: &Path, size: u64, args: &BenchSnapArgs) -> Result<()> {
    let mut data = vec![0u8; CHUNK];
    let mut rng = rand::rngs::StdRng::seed_from_u64(59);
    let (z, floor) = zeta(dir, size, args.runs, &mut rng, &mut data)?;
    let b = btrfs(dir, size, args.runs, &mut rng, &mut data);
    let q = qcow2(dir, size, args.runs);
    let row = |r: &std::result::Result<Figures, String>| match r {
        Ok(f) => f.json(),
        Err(why) => json!({"skipped": why}),
    };
    let ratio = |f: fn(&Figures) -> &Vec<f64>, peer: &std::result::Result<Figures, String>| {
        let p = peer.as_ref().ok().and_then(|p| median(f(p)))?;
        Some(median(f(&z))? / p)
    };
    let v = json!({
        "size": size, "runs": args.runs, "txg_commit_ms": floor,
        "zeta": z.json(), "btrfs": row(&b), "qcow2": row(&q),
        "ratio_snapshot_btrfs": ratio(|f| &f.snapshot_ms, &b),
        "ratio_destroy_btrfs": ratio(|f| &f.destroy_ms, &b),
        "ratio_send_btrfs": ratio(|f| &f.send_mbps, &b),
        "ratio_snapshot_qcow2": ratio(|f| &f.snapshot_ms, &q),
        "ratio_destroy_qcow2": ratio(|f| &f.destroy_ms, &q),
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
        return Ok(());
    }
    println!(
        "zeta bench snap: a {} volume (16K blocks) filled, on a file under {}; median of {} runs",
        human(size),
        dir.parent().unwrap_or(dir).display(),
        args.runs
    );
    println!(
        "{:<22} {:>12} {:>20} {:>14}",
        "", "snapshot ms", "destroy ms (10% new)", "send MB/s"
    );
    let show = |name: &str, r: &std::result::Result<Figures, String>| match r {
        Ok(f) => {
            let c =
                |v: &Vec<f64>, p: usize| median(v).map_or("-".to_string(), |x| format!("{x:.p$}"));
            println!(
                "{name:<22} {:>12} {:>20} {:>14}",
                c(&f.snapshot_ms, 1),
                c(&f.destroy_ms, 1),
                c(&f.send_mbps, 0)
            );
        }
        Err(why) => println!("{name:<22} skipped: {why}"),
    };
    show("zeta", &Ok(z.clone()));
    show("btrfs (loop device)", &b);
    show("qcow2 (qemu-img)", &q);
    println!("zeta txg commit of one 4K write: {floor:.1} ms (a snapshot is one txg)");
    for (k, label) in [
        ("ratio_snapshot_btrfs", "snapshot time, zeta / btrfs"),
        ("ratio_destroy_btrfs", "destroy time, zeta / btrfs"),
        ("ratio_send_btrfs", "send rate, zeta / btrfs"),
        ("ratio_snapshot_qcow2", "snapshot time, zeta / qcow2"),
        ("ratio_destroy_qcow2", "destroy time, zeta / qcow2"),
    ] {
        if let Some(r) = v[k].as_f64() {
            println!("{label:<30} {r:>6.2}");
        }
    }
    Ok(())
}

/// zeta: a pool of one file, the volume filled; each run a snapshot, a tenth rewritten, a
/// full send to nowhere, the snapshot destroyed. Also returns the median txg commit.
fn zeta(
    dir: &Path,
    size: u64,
    runs: usize,
    rng: &mut rand::rngs::StdRng,
    data: &mut [u8],
) -> Result<(Figures, f64)> {
    let path = dir.join("zeta-leaf");
    let dev = FileDevice::create(&path, size * 2 + (256 << 20))?;
    let spec = vec![TopSpec::stripe((
        Arc::new(dev) as Arc<dyn BlockDevice>,
        path.display().to_string(),
    ))];
    let opts = PoolOptions {
        force: true,
        ..Default::default()
    };
    let pool = Pool::create("bench", spec, opts)?;
    pool.create_volume("v", size, 16384, None)?;
    let vol = Volume::open(&pool, "v")?;
    for off in (0..size).step_by(CHUNK) {
        rng.fill_bytes(data);
        vol.write(off, data)?;
    }
    vol.flush()?;
    pool.sync_frees()?;
    let mut f = Figures::default();
    let mut floors = Vec::new();
    for run in 0..runs {
        let t = Instant::now();
        vol.write(0, &data[..4096])?;
        pool.sync_now()?;
        floors.push(ms(t));
        let name = format!("v@r{run}");
        let t = Instant::now();
        pool.snapshot(&[&name])?;
        f.snapshot_ms.push(ms(t));
        let t = Instant::now();
        let sent = pool.send(&name, None, &mut std::io::sink(), &mut |_| true)?;
        f.send_mbps
            .push(sent.data_bytes as f64 / 1e6 / t.elapsed().as_secs_f64());
        for off in tenth(size, run) {
            rng.fill_bytes(data);
            vol.write(off, data)?;
        }
        vol.flush()?;
        pool.sync_now()?;
        let t = Instant::now();
        pool.destroy_snapshot(&name)?;
        f.destroy_ms.push(ms(t));
    }
    drop(vol);
    pool.close()?;
    Ok((f, median(&floors).unwrap_or(0.0)))
}

/// Unmounts and detaches a loop mount when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// btrfs on a loop device: a file of the volume's bytes in a subvolume; each run a read-only
/// snapshot (`btrfs subvolume snapshot -r`, which commits a transaction), a tenth rewritten
/// and fsynced, `btrfs send` of the snapshot to /dev/null, and the snapshot deleted with
/// `--commit-after` (so its space is freed, as zeta's destroy frees it).
fn btrfs(
    dir: &Path,
    size: u64,
    runs: usize,
    rng: &mut rand::rngs::StdRng,
    data: &mut [u8],
) -> std::result::Result<Figures, String> {
    use std::os::unix::fs::FileExt;
    // SAFETY: geteuid has no preconditions and only reads the process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (a loop mount)".into());
    }
    if Command::new("mkfs.btrfs")
        .arg("--version")
        .output()
        .is_err()
    {
        return Err("mkfs.btrfs not found (apt-get install btrfs-progs)".into());
    }
    let img = dir.join("btrfs.img");
    let mnt = dir.join("btrfs");
    let s = |e: Error| e.to_string();
    let io = |e: std::io::Error| e.to_string();
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(size * 2 + (512 << 20)))
        .map_err(io)?;
    std::fs::create_dir_all(&mnt).map_err(io)?;
    run_cmd(Command::new("mkfs.btrfs").arg("-f").arg(&img), "mkfs.btrfs").map_err(s)?;
    run_cmd(
        Command::new("mount")
            .args(["-o", "loop"])
            .arg(&img)
            .arg(&mnt),
        "mount",
    )
    .map_err(s)?;
    let _mounted = Mounted(mnt.clone());
    let sub = mnt.join("vol");
    run_cmd(
        Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(&sub),
        "btrfs subvolume create",
    )
    .map_err(s)?;
    let file = std::fs::File::create(sub.join("img")).map_err(io)?;
    for off in (0..size).step_by(CHUNK) {
        rng.fill_bytes(data);
        file.write_all_at(data, off).map_err(io)?;
    }
    file.sync_all().map_err(io)?;
    let mut f = Figures::default();
    for run in 0..runs {
        let snap = mnt.join(format!("r{run}"));
        let t = Instant::now();
        run_cmd(
            Command::new("btrfs")
                .args(["subvolume", "snapshot", "-r"])
                .arg(&sub)
                .arg(&snap),
            "btrfs subvolume snapshot",
        )
        .map_err(s)?;
        f.snapshot_ms.push(ms(t));
        let t = Instant::now();
        run_cmd(Command::new("btrfs").arg("send").arg(&snap), "btrfs send").map_err(s)?;
        f.send_mbps
            .push(size as f64 / 1e6 / t.elapsed().as_secs_f64());
        for off in tenth(size, run) {
            rng.fill_bytes(data);
            file.write_all_at(data, off).map_err(io)?;
        }
        file.sync_all().map_err(io)?;
        let t = Instant::now();
        run_cmd(
            Command::new("btrfs")
                .args(["subvolume", "delete", "--commit-after"])
                .arg(&snap),
            "btrfs subvolume delete",
        )
        .map_err(s)?;
        f.destroy_ms.push(ms(t));
    }
    drop(file);
    Ok(f)
}

/// qcow2: an image of the volume's size written whole with `qemu-io`; each run `qemu-img
/// snapshot -c`, a tenth rewritten with `qemu-io`, and `qemu-img snapshot -d`.
fn qcow2(dir: &Path, size: u64, runs: usize) -> std::result::Result<Figures, String> {
    if Command::new("qemu-img").arg("--version").output().is_err() {
        return Err("qemu-img not found (apt-get install qemu-utils)".into());
    }
    let img = dir.join("img.qcow2");
    let s = |e: Error| e.to_string();
    run_cmd(
        Command::new("qemu-img")
            .args(["create", "-f", "qcow2"])
            .arg(&img)
            .arg(size.to_string()),
        "qemu-img create",
    )
    .map_err(s)?;
    let io = |cmds: Vec<String>| {
        let mut c = Command::new("qemu-io");
        c.args(["-f", "qcow2"]);
        for cmd in cmds {
            c.arg("-c").arg(cmd);
        }
        c.arg(&img);
        run_cmd(&mut c, "qemu-io")
    };
    io(vec![format!("write -P 0x5a 0 {size}")]).map_err(s)?;
    let mut f = Figures::default();
    for run in 0..runs {
        let t = Instant::now();
        run_cmd(
            Command::new("qemu-img")
                .args(["snapshot", "-c", &format!("r{run}")])
                .arg(&img),
            "qemu-img snapshot -c",
        )
        .map_err(s)?;
        f.snapshot_ms.push(ms(t));
        io(tenth(size, run)
            .map(|o| format!("write -P 0x{:x} {o} {CHUNK}", run + 1))
            .collect())
        .map_err(s)?;
        let t = Instant::now();
        run_cmd(
            Command::new("qemu-img")
                .args(["snapshot", "-d", &format!("r{run}")])
                .arg(&img),
            "qemu-img snapshot -d",
        )
        .map_err(s)?;
        f.destroy_ms.push(ms(t));
    }
    Ok(f)
}
