//! The peer: zfs-fuse (ZFS of the seed's era, in user space). Its pool lives on a loop device
//! over a file of the same size as zeta's, so the device's request counters
//! (`/sys/block/loopN/stat`) show the size of the writes it makes; the file system has the
//! seed's `recordsize=8k,compression=on`, and the writers write 8K blocks of random bytes at
//! random offsets of one file each, with plain write(2) calls.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::{Rng, RngCore, SeedableRng};

use super::{Level, Plan, BLOCK};
use crate::sync::check_stop;
use crate::sync::procs::{last_line, ChildGuard};
use zeta_server::{usage, Result};

const POOL: &str = "zetafrag";
const FILL_CHUNK: usize = 1 << 20;
/// How long the daemon may take to answer after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The zfs-fuse daemon: the one already running, or one started here (stopped when dropped).
pub(super) struct ZfsFuse {
    _daemon: Option<ChildGuard>,
}

/// Runs `cmd args`; its stdout, or an error with its last line of stderr.
fn run(cmd: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            usage(format!(
                "{cmd}: {e} (--peer zfs-fuse needs the zfs-fuse package)"
            ))
        })?;
    if !out.status.success() {
        return Err(usage(format!(
            "{cmd} {} failed: {}",
            args.join(" "),
            last_line(&String::from_utf8_lossy(&out.stderr))
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl ZfsFuse {
    pub(super) fn start(work: &Path, stop: &AtomicBool) -> Result<ZfsFuse> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(usage(
                "--peer zfs-fuse needs root: zfs-fuse mounts its file system through FUSE and \
                 its pool sits on a loop device",
            ));
        }
        if run("zpool", &["list"]).is_ok() {
            return Ok(ZfsFuse { _daemon: None });
        }
        let daemon = ChildGuard::spawn(
            Command::new("zfs-fuse").args(["-n", "--no-kstat-mount"]),
            "zfs-fuse",
            work.join("zfs-fuse.log"),
        )?;
        let t = Instant::now();
        while run("zpool", &["list"]).is_err() {
            check_stop(stop)?;
            if t.elapsed() > START_TIMEOUT {
                return Err(usage(format!(
                    "zfs-fuse did not answer `zpool list` within {} s: {}",
                    START_TIMEOUT.as_secs(),
                    daemon.last_words()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(ZfsFuse {
            _daemon: Some(daemon),
        })
    }

    pub(super) fn level(
        &self,
        work: &Path,
        plan: &Plan,
        fill: u32,
        stop: &AtomicBool,
    ) -> Result<Level> {
        let dir = work.join(format!("f{fill}"));
        std::fs::create_dir(&dir).map_err(|e| zeta_server::Error::io(&dir, e))?;
        let vdev = dir.join("vdev");
        File::create(&vdev)
            .and_then(|f| f.set_len(plan.size))
            .map_err(|e| zeta_server::Error::io(&vdev, e))?;
        let loopdev = run("losetup", &["-f", "--show", &vdev.display().to_string()])?;
        let mut cleanup = Cleanup {
            loopdev: loopdev.clone(),
            pool: false,
        };
        let mnt = dir.join("mnt");
        run(
            "zpool",
            &[
                "create",
                "-f",
                "-m",
                &mnt.display().to_string(),
                POOL,
                &loopdev,
            ],
        )?;
        cleanup.pool = true;
        let fs = format!("{POOL}/fs");
        run(
            "zfs",
            &["create", "-o", "recordsize=8k", "-o", "compression=on", &fs],
        )?;
        let size = parse_human(&run("zpool", &["list", "-H", "-o", "size", POOL])?)
            .ok_or_else(|| usage("zpool list printed a size it cannot read"))?;
        let target = size as u128 * fill as u128 / 100;
        let files: Vec<PathBuf> = (0..plan.writers)
            .map(|i| mnt.join("fs").join(format!("f{i}")))
            .collect();
        let per_file =
            (target / files.len() as u128) as u64 / FILL_CHUNK as u64 * FILL_CHUNK as u64;
        let lens = fill_files(&files, per_file.max(FILL_CHUNK as u64), stop)?;
        let filled = lens.iter().sum();
        let occupancy = settled_occupancy(stop)?;
        let dev = loopdev.trim_start_matches("/dev/").to_string();
        let before = loop_writes(&dev);
        let (samples, error) = overwrite(&files, &lens, plan, stop)?;
        let after = loop_writes(&dev);
        let occupancy_after = occupancy_now()?;
        let mean_write_kib = match (before, after) {
            (Some((w0, s0)), Some((w1, s1))) if w1 > w0 => {
                Some((s1 - s0) as f64 * 512.0 / (w1 - w0) as f64 / 1024.0)
            }
            _ => None,
        };
        drop(cleanup);
        let _ = std::fs::remove_dir_all(&dir);
        let mut l = Level::new(
            "zfs-fuse",
            fill,
            (occupancy, occupancy_after),
            filled,
            samples,
            error,
        );
        l.mean_write_kib = mean_write_kib;
        Ok(l)
    }
}

/// Destroys the pool and detaches the loop device, on every way out of a level.
struct Cleanup {
    loopdev: String,
    pool: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.pool {
            // The writers' files close asynchronously through FUSE: a destroy right after
            // may find the file system busy for a moment.
            let mut tries = 0;
            while let Err(e) = run("zpool", &["destroy", "-f", POOL]) {
                tries += 1;
                if tries == 20 {
                    eprintln!("zeta bench frag: {e}");
                    break;
                }
                let _ = run("zfs", &["unmount", "-f", &format!("{POOL}/fs")]);
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        if let Err(e) = run("losetup", &["-d", &self.loopdev]) {
            eprintln!("zeta bench frag: {e}");
        }
    }
}

/// A size as zpool prints it: "1016M", "1.50G", "776K", "0".
fn parse_human(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' => (&s[..s.len() - 1], 1u64 << 10),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        'T' => (&s[..s.len() - 1], 1 << 40),
        'P' => (&s[..s.len() - 1], 1 << 50),
        _ => (s, 1),
    };
    let v: f64 = num.parse().ok()?;
    (v >= 0.0).then_some((v * mult as f64) as u64)
}

/// Writes each file sequentially with random bytes up to `per_file`, 1M at a time, until a
/// write finds no room; fsyncs them. Returns each file's length.
fn fill_files(files: &[PathBuf], per_file: u64, stop: &AtomicBool) -> Result<Vec<u64>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let mut chunk = vec![0u8; FILL_CHUNK];
    let mut lens = Vec::new();
    let mut full = false;
    for path in files {
        let f = File::create(path).map_err(|e| zeta_server::Error::io(path, e))?;
        let mut len = 0u64;
        while !full && len < per_file {
            check_stop(stop)?;
            rng.fill_bytes(&mut chunk);
            match f.write_all_at(&chunk, len) {
                Ok(()) => len += FILL_CHUNK as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => full = true,
                Err(e) => return Err(zeta_server::Error::io(path, e)),
            }
        }
        f.sync_all().map_err(|e| zeta_server::Error::io(path, e))?;
        lens.push(len);
    }
    if lens.iter().all(|&l| l < BLOCK) {
        return Err(usage("zfs-fuse's pool took no data at all"));
    }
    Ok(lens)
}

/// The pool's allocated share of its size in percent, from `zpool list` (3 digits).
fn occupancy_now() -> Result<f64> {
    let out = run("zpool", &["list", "-H", "-o", "allocated,size", POOL])?;
    let mut it = out.split_whitespace().map(parse_human);
    match (it.next().flatten(), it.next().flatten()) {
        (Some(a), Some(s)) if s > 0 => Ok(a as f64 * 100.0 / s as f64),
        _ => Err(usage(format!("zpool list printed '{out}'"))),
    }
}

/// The occupancy once the txgs holding the fill have synced: two readings a txg apart that
/// agree, or the last after 30 s.
fn settled_occupancy(stop: &AtomicBool) -> Result<f64> {
    let mut last = occupancy_now()?;
    for _ in 0..6 {
        check_stop(stop)?;
        std::thread::sleep(Duration::from_secs(5));
        let now = occupancy_now()?;
        if (now - last).abs() < 0.05 {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

/// Writes completed and sectors written of block device `dev` (`/sys/block/DEV/stat`).
fn loop_writes(dev: &str) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/sys/block/{dev}/stat")).ok()?;
    let f: Vec<u64> = stat
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    Some((*f.get(4)?, *f.get(6)?))
}

/// `plan.writers × plan.depth` threads overwriting random 8K blocks of the files (thread i
/// the file i mod files) for the run time: MiB/s in each second, and the first error.
fn overwrite(
    files: &[PathBuf],
    lens: &[u64],
    plan: &Plan,
    stop: &AtomicBool,
) -> Result<(Vec<f64>, Option<String>)> {
    let secs = plan.runtime as usize;
    let counts: Vec<AtomicU64> = (0..secs).map(|_| AtomicU64::new(0)).collect();
    let error: Mutex<Option<String>> = Mutex::new(None);
    let failed = AtomicBool::new(false);
    let handles: Vec<File> = files
        .iter()
        .map(|p| {
            OpenOptions::new()
                .write(true)
                .open(p)
                .map_err(|e| zeta_server::Error::io(p, e))
        })
        .collect::<Result<_>>()?;
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        for t in 0..(plan.writers * plan.depth) as usize {
            let i = t % files.len();
            let (f, blocks) = (&handles[i], lens[i] / BLOCK);
            let (counts, error, failed) = (&counts, &error, &failed);
            if blocks == 0 {
                continue;
            }
            sc.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + t as u64);
                let mut data = vec![0u8; 256 << 10];
                rng.fill_bytes(&mut data);
                loop {
                    let at = t0.elapsed().as_secs() as usize;
                    if at >= secs || failed.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed)
                    {
                        return;
                    }
                    let src = rng.gen_range(0..data.len() / 4096 - 2) * 4096;
                    let off = rng.gen_range(0..blocks) * BLOCK;
                    match f.write_all_at(&data[src..src + BLOCK as usize], off) {
                        Ok(()) => {
                            let done = t0.elapsed().as_secs() as usize;
                            if done < secs {
                                counts[done].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            failed.store(true, Ordering::Relaxed);
                            error.lock().unwrap().get_or_insert(e.to_string());
                            return;
                        }
                    }
                }
            });
        }
    });
    check_stop(stop)?;
    let samples = counts
        .iter()
        .map(|c| c.load(Ordering::Relaxed) as f64 * BLOCK as f64 / (1 << 20) as f64)
        .collect();
    Ok((samples, error.into_inner().unwrap()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_zpool_prints_them() {
        assert_eq!(parse_human("1016M"), Some(1016 << 20));
        assert_eq!(parse_human("1.50G"), Some(3 << 29));
        assert_eq!(parse_human("776K"), Some(776 << 10));
        assert_eq!(parse_human("0"), Some(0));
        assert_eq!(parse_human("lots"), None);
        assert_eq!(parse_human(""), None);
    }
}
