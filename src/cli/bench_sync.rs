//! `zeta bench sync`: the sync-write experiment of the group-commit paper. Three volumes on a
//! pool of three file vdevs, served by `zeta serve`; one client per volume keeps 100 random
//! writes in flight with a flush every N writes. Two pool configurations, per-request commits
//! with a log per volume (the baseline) and group commit with one global log, are measured with
//! two load generators (fio's nbd engine and `zeta-load`, `nbd_load.rs`), next to the same
//! jobs on three plain files (fio, libaio: the device's fsync-bound figure) and on `nbdkit file`
//! serving three plain files (a peer NBD server).
//!
//! Every zeta measurement starts from a new pool, on files written in full once (so that their
//! blocks are allocated as a device's are) and kept for the whole run, as the raw and nbdkit
//! files are: no result depends on which files a measurement before it made or deleted
//! (`Files`). Everything runs in a temporary directory under `--dir`; the
//! child processes and that directory are removed on every way out, Ctrl-C included.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::args::BenchSyncArgs;
use super::fmt::{human, parse_size};
use super::nbd_load::{self, LoadSpec};
use super::{usage, CliError, Result};

/// Volumes, vdevs and client jobs (one job per volume).
const VOLUMES: usize = 3;
/// Requests in flight per volume, flushes included.
const DEPTH: u32 = 100;
const POOL: &str = "sync";
/// How long a server may take to start accepting connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server may take to exit after SIGTERM (zeta syncs and closes its pool) before it
/// is killed.
const STOP_GRACE: Duration = Duration::from_secs(60);
/// How long fio may run past its run time (it drains what is in flight) before it is killed.
const FIO_OVERRUN: Duration = Duration::from_secs(120);

/// A pool configuration: the values of the `zil.commit` and `zil.placement` pool properties.
#[derive(Clone, Copy)]
struct Zil {
    commit: &'static str,
    placement: &'static str,
}

const BASELINE: Zil = Zil {
    commit: "per-request",
    placement: "per-volume",
};
const OPTIMIZED: Zil = Zil {
    commit: "group",
    placement: "global",
};
const RAW: Zil = Zil {
    commit: "raw",
    placement: "raw",
};
const NBDKIT: Zil = Zil {
    commit: "nbdkit",
    placement: "nbdkit",
};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Gen {
    Fio,
    ZetaLoad,
}

impl Gen {
    fn name(self) -> &'static str {
        match self {
            Gen::Fio => "fio",
            Gen::ZetaLoad => "zeta-load",
        }
    }
}

#[derive(Clone, Copy)]
struct Point {
    bs_bytes: u32,
    writes_per_flush: u32,
}

struct Plan {
    size_bytes: u64,
    /// Each pool file is this many times `size_bytes` (plus room for metadata and the log).
    pool_scale: u64,
    runtime: Duration,
    volblocksizes: Vec<u32>,
    points: Vec<Point>,
    /// Each target is measured this many times (`--runs`).
    runs: u32,
    zil_props: bool,
}

impl Plan {
    /// The size of each of the pool's files.
    fn leaf_bytes(&self) -> u64 {
        self.pool_scale * self.size_bytes + (256 << 20)
    }
}

/// One measurement's figures. `None` is a figure the source did not provide (printed as `-`,
/// null in JSON), never a guess.
struct Measured {
    iops: f64,
    lat_mean_us: Option<f64>,
    lat_p99_us: Option<f64>,
    writes_per_flush: Option<f64>,
    log_blocks_per_device: Option<Vec<u64>>,
}

struct Row {
    point: Point,
    /// The latency section: one client, one write in flight, each with FUA (`fsync` is then 1:
    /// every write is made durable on its own).
    qd1_fua: bool,
    /// `None` for raw files and nbdkit, which have no volumes.
    volblocksize: Option<u32>,
    gen: Gen,
    zil: Zil,
    /// Which of the plan's runs, from 1.
    run: u32,
    m: Measured,
}

impl Row {
    /// Rows of the same target at the same point: the runs of one measurement.
    fn same_target(&self, o: &Row) -> bool {
        self.point.bs_bytes == o.point.bs_bytes
            && self.point.writes_per_flush == o.point.writes_per_flush
            && self.qd1_fua == o.qd1_fua
            && self.volblocksize == o.volblocksize
            && self.gen == o.gen
            && self.zil.commit == o.zil.commit
    }

    fn json(&self) -> Value {
        json!({
            "bs": self.point.bs_bytes,
            "fsync": self.point.writes_per_flush,
            "qd": if self.qd1_fua { 1 } else { DEPTH },
            "fua": self.qd1_fua,
            "volblocksize": self.volblocksize,
            "generator": self.gen.name(),
            "commit": self.zil.commit,
            "placement": self.zil.placement,
            "iops": self.m.iops,
            "lat_mean_us": self.m.lat_mean_us,
            "lat_p99_us": self.m.lat_p99_us,
            "writes_per_flush": self.m.writes_per_flush,
            "log_blocks_per_device": self.m.log_blocks_per_device,
            "run": self.run,
        })
    }
}

fn io_err(path: &Path, e: std::io::Error) -> CliError {
    CliError::Io {
        path: path.display().to_string(),
        source: e,
    }
}

fn interrupted() -> CliError {
    usage("interrupted; child processes stopped and temporary files removed")
}

fn check_stop(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::SeqCst) {
        return Err(interrupted());
    }
    Ok(())
}

pub fn sync_bench(args: BenchSyncArgs) -> Result<()> {
    let plan = plan(&args)?;
    check_tools()?;
    std::fs::create_dir_all(&args.dir).map_err(|e| io_err(&args.dir, e))?;
    // Ctrl-C reaches the whole process group: the servers and fio stop by themselves, and this
    // process notices the flag, stops what is left and removes its files. A second signal
    // exits at once.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let reg = signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, stop.clone())
            .and_then(|_| signal_hook::flag::register(sig, stop.clone()));
        reg.map_err(|e| io_err(Path::new("signal handler"), e))?;
    }
    let work = WorkDir::create(
        &args
            .dir
            .join(format!("zeta-bench-sync-{}", std::process::id())),
    )?;
    let mut files = Files::new(&work);
    if !plan.zil_props {
        eprintln!(
            "zeta bench sync: --no-zil-props: both configurations are the same default pool \
             (the labels name the intended configuration only); log counters are read only \
             if `zeta pool iostat` exists"
        );
    }
    if !args.json {
        print_header(&plan);
    }
    let per_run = plan.points.len() * (2 * (plan.volblocksizes.len() * 2 + 1) + 1)
        + plan.volblocksizes.len()
        + 2;
    let total = per_run * plan.runs as usize;
    let mut done = 0usize;
    for &point in &plan.points {
        let mut rows = Vec::new();
        for run in 1..=plan.runs {
            for gen in [Gen::Fio, Gen::ZetaLoad] {
                for (vb, zil) in targets(&plan, gen) {
                    check_stop(&stop)?;
                    done += 1;
                    progress(done, total, &run_label(&plan, run), point, vb, gen, zil);
                    let dir = work.sub(done)?;
                    let m = match (vb, zil.commit) {
                        (Some(vb), _) => {
                            measure_zeta(&dir, &mut files, &plan, point, vb, zil, gen, &stop)
                        }
                        (None, "raw") => measure_raw(&dir, &mut files, &plan, point, &stop),
                        (None, _) => measure_nbdkit(&dir, &mut files, &plan, point, gen, &stop),
                    };
                    drop(dir);
                    // A failure caused by Ctrl-C (a server that went away) is reported as
                    // such.
                    check_stop(&stop)?;
                    let row = Row {
                        point,
                        qd1_fua: false,
                        volblocksize: vb,
                        gen,
                        zil,
                        run,
                        m: m?,
                    };
                    keep(row, args.json, &mut rows);
                }
            }
        }
        if !args.json {
            let shown = medians(&rows);
            for &vb in &plan.volblocksizes {
                print_table(&plan, point, vb, &shown);
            }
        }
    }
    latency_section(&work, &mut files, &plan, &args, &stop, &mut done, total)?;
    drop(work);
    Ok(())
}

/// What a point measures with generator `gen`: both configurations on each volume block size,
/// the raw files (fio alone drives them: they are not an NBD export), and nbdkit.
fn targets(plan: &Plan, gen: Gen) -> Vec<(Option<u32>, Zil)> {
    let mut t: Vec<(Option<u32>, Zil)> = Vec::new();
    for &vb in &plan.volblocksizes {
        t.push((Some(vb), BASELINE));
        t.push((Some(vb), OPTIMIZED));
    }
    if gen == Gen::Fio {
        t.push((None, RAW));
    }
    t.push((None, NBDKIT));
    t
}

/// The latency goal's measurement: one client, one 4K write in flight, each with FUA, against
/// zeta (group/global, one volume) and `nbdkit file`, both through zeta-load; and the raw
/// file's `pwrite` + `fdatasync` per write (fio, psync, one job), whose mean time per durable
/// write at queue depth 1 is 1 / IOPS.
fn latency_section(
    work: &WorkDir,
    files: &mut Files,
    plan: &Plan,
    args: &BenchSyncArgs,
    stop: &AtomicBool,
    done: &mut usize,
    total: usize,
) -> Result<()> {
    let point = Point {
        bs_bytes: 4096,
        writes_per_flush: 1,
    };
    let mut rows = Vec::new();
    let mut targets: Vec<(Option<u32>, Zil)> = vec![(None, RAW)];
    targets.extend(plan.volblocksizes.iter().map(|&vb| (Some(vb), OPTIMIZED)));
    targets.push((None, NBDKIT));
    for run in 1..=plan.runs {
        for &(vb, zil) in &targets {
            check_stop(stop)?;
            *done += 1;
            eprintln!(
                "[{done}/{total}]{} 4K writes at queue depth 1 with FUA{}: {}",
                run_label(plan, run),
                vb.map_or(String::new(), |v| format!(", volblocksize {}", kib(v))),
                if vb.is_some() {
                    "zeta group/global"
                } else {
                    zil.commit
                }
            );
            let dir = work.sub(*done)?;
            let m = match (vb, zil.commit) {
                (Some(vb), _) => {
                    let srv = start_zeta(&dir.0, files.pool(plan)?, plan, vb, zil, stop)?;
                    let m = fua_qd1(srv.addr, &format!("{POOL}/v0"), plan, stop);
                    stop_zeta(srv, &dir.0)?;
                    m
                }
                (None, "raw") => {
                    let files = files.plain(plan)?;
                    let args: Vec<String> = vec![
                        "--rw=randwrite".into(),
                        "--bs=4096".into(),
                        "--ioengine=psync".into(),
                        "--fdatasync=1".into(),
                        "--time_based".into(),
                        format!("--runtime={}", plan.runtime.as_secs()),
                        format!("--size={}", plan.size_bytes),
                        "--output-format=json".into(),
                        "--name=raw".into(),
                        format!("--filename={}", files[0].display()),
                    ];
                    run_fio(&args, &dir.0, plan, stop).map(|s| Measured {
                        iops: s.iops,
                        // At queue depth 1 a durable write takes 1 / IOPS: the pwrite and the
                        // fdatasync after it (fio's own latency figures count the pwrite only).
                        lat_mean_us: (s.iops > 0.0).then(|| 1e6 / s.iops),
                        lat_p99_us: None,
                        writes_per_flush: s.measured().writes_per_flush,
                        log_blocks_per_device: None,
                    })
                }
                (None, _) => {
                    let (server, addr) = start_nbdkit(&dir, files, plan, stop)?;
                    let m = fua_qd1(addr, "f0", plan, stop);
                    server.stop()?;
                    m
                }
            };
            drop(dir);
            check_stop(stop)?;
            let row = Row {
                point,
                qd1_fua: true,
                volblocksize: vb,
                gen: if zil.commit == "raw" {
                    Gen::Fio
                } else {
                    Gen::ZetaLoad
                },
                zil,
                run,
                m: m?,
            };
            keep(row, args.json, &mut rows);
        }
    }
    if !args.json {
        print_latency_table(&medians(&rows));
    }
    Ok(())
}

/// Prints a measured row at once under `--json` (so a long run shows its progress), and
/// keeps it for the tables.
fn keep(row: Row, json: bool, rows: &mut Vec<Row>) {
    if json {
        println!("{}", row.json());
        let _ = std::io::stdout().flush();
    }
    rows.push(row);
}

/// Of each target's runs in `rows`, the one of median IOPS (the lower middle one of an even
/// number), in the order the targets were first measured. A whole run is taken, not each
/// figure's median on its own, so a row's latencies and counts are those of its IOPS.
fn medians(rows: &[Row]) -> Vec<&Row> {
    let mut out: Vec<&Row> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        if rows[..i].iter().any(|o| o.same_target(r)) {
            continue;
        }
        let mut runs: Vec<&Row> = rows[i..].iter().filter(|o| o.same_target(r)).collect();
        runs.sort_by(|a, b| a.m.iops.total_cmp(&b.m.iops));
        out.push(runs[(runs.len() - 1) / 2]);
    }
    out
}

/// One zeta-load connection to `export`: one 4K write in flight, each with FUA.
fn fua_qd1(addr: SocketAddr, export: &str, plan: &Plan, stop: &AtomicBool) -> Result<Measured> {
    let spec = LoadSpec {
        bs_bytes: 4096,
        writes_per_flush: 1,
        depth: 1,
        runtime: plan.runtime,
        seed: nbd_load::SEED,
        fua: true,
    };
    let r = nbd_load::run(addr, &[export.to_string()], &spec, stop).map_err(|e| CliError::Io {
        path: format!("zeta-load nbd://{addr}/{export}"),
        source: e,
    })?;
    Ok(Measured {
        iops: r.writes_per_sec,
        lat_mean_us: r.lat_mean_us,
        lat_p99_us: r.lat_p99_us,
        writes_per_flush: None,
        log_blocks_per_device: None,
    })
}

fn print_latency_table(rows: &[&Row]) {
    let raw = rows
        .iter()
        .find(|r| r.zil.commit == RAW.commit)
        .and_then(|r| r.m.lat_mean_us);
    println!();
    println!(
        "4K random writes at queue depth 1, each durable when answered (NBD FUA; raw: pwrite + \
         fdatasync). xraw: mean latency over the raw file's"
    );
    println!(
        "{:<10} {:<22} {:>9} {:>9} {:>9} {:>6}",
        "generator", "target", "IOPS", "mean us", "p99 us", "xraw"
    );
    for r in rows {
        let target = match r.volblocksize {
            Some(vb) => format!("zeta group/global {}", kib(vb)),
            None => r.zil.commit.to_string(),
        };
        let x = match (r.m.lat_mean_us, raw) {
            (Some(l), Some(b)) if b > 0.0 && r.zil.commit != RAW.commit => format!("{:.2}", l / b),
            _ => String::new(),
        };
        let line = format!(
            "{:<10} {:<22} {:>9.0} {:>9} {:>9} {:>6}",
            r.gen.name(),
            target,
            r.m.iops,
            opt(r.m.lat_mean_us, 0),
            opt(r.m.lat_p99_us, 0),
            x
        );
        println!("{}", line.trim_end());
    }
    let _ = std::io::stdout().flush();
}

fn plan(args: &BenchSyncArgs) -> Result<Plan> {
    let size_bytes = parse_size(&args.size)?;
    if size_bytes < 16 << 20 || !size_bytes.is_multiple_of(1 << 20) {
        return Err(usage("--size must be a whole number of MiB, at least 16M"));
    }
    if !(2..=64).contains(&args.pool_scale) {
        return Err(usage("--pool-scale must be from 2 to 64"));
    }
    let runtime_s = args.runtime.unwrap_or(if args.quick { 10 } else { 30 });
    if !(1..=3600).contains(&runtime_s) {
        return Err(usage("--runtime must be from 1 to 3600 seconds"));
    }
    let list = args
        .volblocksize
        .clone()
        .unwrap_or_else(|| if args.quick { "128K" } else { "128K,16K" }.into());
    let volblocksizes = parse_volblocksizes(&list)?;
    if !(1..=9).contains(&args.runs) {
        return Err(usage("--runs must be from 1 to 9"));
    }
    let points = match (&args.points, args.quick) {
        (Some(list), _) => parse_points(list)?,
        (None, true) => parse_points(QUICK_POINTS)?,
        // 4K writes at four flush intervals, then four write sizes at a flush every 5 (whose
        // 4K point is already in the first set).
        (None, false) => parse_points(ALL_POINTS)?,
    };
    Ok(Plan {
        size_bytes,
        pool_scale: args.pool_scale,
        runtime: Duration::from_secs(runtime_s),
        volblocksizes,
        points,
        runs: args.runs,
        zil_props: !args.no_zil_props,
    })
}

/// The points: 4K writes at four flush intervals, then larger writes at a flush every 5.
const ALL_POINTS: &str = "4K/1,4K/5,4K/10,4K/20,8K/5,16K/5,32K/5";
const QUICK_POINTS: &str = "4K/5";

/// "8K/5,4K/20": write sizes (whole 4K multiples up to 4M, as `zeta-load` takes) and flush
/// intervals (1 to 1000), each point once.
fn parse_points(list: &str) -> Result<Vec<Point>> {
    let mut points: Vec<Point> = Vec::new();
    for item in list.split(',') {
        let bad = || usage(format!("--points '{item}': a point is SIZE/N, as in 8K/5"));
        let (bs, n) = item.trim().split_once('/').ok_or_else(bad)?;
        let bs_bytes = parse_size(bs).map_err(|_| bad())?;
        let writes_per_flush: u32 = n.trim().parse().map_err(|_| bad())?;
        if bs_bytes == 0 || !bs_bytes.is_multiple_of(4096) || bs_bytes > 4 << 20 {
            return Err(usage(format!(
                "--points '{item}': a write size is a multiple of 4K up to 4M"
            )));
        }
        if !(1..=1000).contains(&writes_per_flush) {
            return Err(usage(format!(
                "--points '{item}': a flush interval is from 1 to 1000 writes"
            )));
        }
        let p = Point {
            bs_bytes: bs_bytes as u32,
            writes_per_flush,
        };
        if points
            .iter()
            .any(|q| (q.bs_bytes, q.writes_per_flush) == (p.bs_bytes, p.writes_per_flush))
        {
            return Err(usage(format!("--points '{item}' is named twice")));
        }
        points.push(p);
    }
    Ok(points)
}

fn parse_volblocksizes(list: &str) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for item in list.split(',') {
        let bytes = parse_size(item)?;
        if !(4096..=131072).contains(&bytes) || !bytes.is_power_of_two() {
            return Err(usage(format!(
                "--volblocksize '{item}': a volume block size is a power of two from 4K to 128K"
            )));
        }
        if out.contains(&(bytes as u32)) {
            return Err(usage(format!("--volblocksize '{item}' is named twice")));
        }
        out.push(bytes as u32);
    }
    Ok(out)
}

/// fio (with its nbd engine) and nbdkit (with its file plugin) are needed; say which package.
fn check_tools() -> Result<()> {
    let engines = Command::new("fio")
        .arg("--enghelp")
        .stderr(Stdio::null())
        .output()
        .map_err(|_| usage("fio is not installed (apt-get install fio)"))?;
    if !String::from_utf8_lossy(&engines.stdout)
        .lines()
        .any(|l| l.trim() == "nbd")
    {
        return Err(usage(
            "this fio has no nbd engine (Debian's fio package has it: apt-get install fio)",
        ));
    }
    let plugin = Command::new("nbdkit")
        .args(["file", "--dump-plugin"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|_| usage("nbdkit is not installed (apt-get install nbdkit)"))?;
    if !plugin.success() {
        return Err(usage("nbdkit has no file plugin (apt-get install nbdkit)"));
    }
    Ok(())
}

/// `run`: the run's label (`run_label`).
fn progress(done: usize, total: usize, run: &str, p: Point, vb: Option<u32>, gen: Gen, zil: Zil) {
    if !std::io::stderr().is_terminal() {
        return;
    }
    let vb = vb.map_or(String::new(), |v| format!(" volblocksize {}", kib(v)));
    eprintln!(
        "[{done}/{total}]{run} {} writes, flush every {}{vb}: {} on {}/{}",
        kib(p.bs_bytes),
        p.writes_per_flush,
        gen.name(),
        zil.commit,
        zil.placement
    );
}

/// " run k/N" when the plan has more than one run.
fn run_label(plan: &Plan, run: u32) -> String {
    if plan.runs > 1 {
        format!(" run {run}/{}:", plan.runs)
    } else {
        String::new()
    }
}

/// The temporary directory of the run; removed when dropped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn create(path: &Path) -> Result<WorkDir> {
        std::fs::create_dir(path).map_err(|e| io_err(path, e))?;
        Ok(WorkDir(path.to_path_buf()))
    }

    /// A fresh directory for one measurement (short names: a pool's control socket lives
    /// under it, and Unix socket paths are limited to 108 bytes).
    fn sub(&self, seq: usize) -> Result<WorkDir> {
        WorkDir::create(&self.0.join(format!("m{seq}")))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process that is stopped (SIGTERM, then SIGKILL after `STOP_GRACE`) and reaped
/// whenever this is dropped, so no way out of the bench leaves one running.
struct ChildGuard {
    child: Option<Child>,
    name: &'static str,
    log: PathBuf,
}

impl ChildGuard {
    /// Starts `cmd` with stdout and stderr going to `log`.
    fn spawn(cmd: &mut Command, name: &'static str, log: PathBuf) -> Result<ChildGuard> {
        let out = File::create(&log).map_err(|e| io_err(&log, e))?;
        let err = out.try_clone().map_err(|e| io_err(&log, e))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| io_err(Path::new(name), e))?;
        Ok(ChildGuard {
            child: Some(child),
            name,
            log,
        })
    }

    fn exited(&mut self) -> Result<Option<ExitStatus>> {
        let c = self.child.as_mut().expect("child present until stopped");
        c.try_wait().map_err(|e| io_err(Path::new(self.name), e))
    }

    /// The last line the child wrote, for error messages.
    fn last_words(&self) -> String {
        last_line(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    fn stop(mut self) -> Result<ExitStatus> {
        let mut c = self.child.take().expect("child present until stopped");
        terminate(&mut c).map_err(|e| io_err(Path::new(self.name), e))
    }

    /// Waits for the child to exit by itself, up to `limit`; then stops it and fails.
    fn wait(mut self, limit: Duration, stop: &AtomicBool) -> Result<(ExitStatus, String)> {
        let t = Instant::now();
        loop {
            if let Some(st) = self.exited()? {
                self.child = None;
                return Ok((st, self.last_words()));
            }
            check_stop(stop)?;
            if t.elapsed() > limit {
                return Err(usage(format!(
                    "{} did not finish within {} s",
                    self.name,
                    limit.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = terminate(&mut c);
        }
    }
}

fn terminate(child: &mut Child) -> std::io::Result<ExitStatus> {
    if let Some(st) = child.try_wait()? {
        return Ok(st);
    }
    let pid = libc::pid_t::try_from(child.id()).expect("a pid fits in pid_t");
    // SAFETY: kill(2) takes two integers and touches no memory of this process. The pid is
    // that of our own child, not yet reaped (only `wait`/`try_wait` reap it, and try_wait just
    // reported it running), so even if it exits now it stays a zombie holding its pid and the
    // signal cannot reach a recycled process.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let t = Instant::now();
    while t.elapsed() < STOP_GRACE {
        if let Some(st) = child.try_wait()? {
            return Ok(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill()?;
    child.wait()
}

fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("(no output)")
        .to_string()
}

/// Polls until `addr` accepts a TCP connection, failing if the server exits first.
fn wait_accepting(server: &mut ChildGuard, addr: SocketAddr, stop: &AtomicBool) -> Result<()> {
    let t = Instant::now();
    loop {
        if let Some(st) = server.exited()? {
            return Err(usage(format!(
                "{} exited ({st}) before accepting connections: {}",
                server.name,
                server.last_words()
            )));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
            return Ok(());
        }
        check_stop(stop)?;
        if t.elapsed() > START_TIMEOUT {
            return Err(usage(format!(
                "{} did not accept connections on {addr} within {} s",
                server.name,
                START_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `zeta` itself (this executable), with its state in `home`.
fn zeta(home: &Path) -> Result<Command> {
    let exe = std::env::current_exe().map_err(|e| io_err(Path::new("current executable"), e))?;
    let mut c = Command::new(exe);
    c.env("ZETA_HOME", home);
    Ok(c)
}

/// Runs a short `zeta` command; its stdout, or its one-line error.
fn run_zeta(home: &Path, args: &[String], what: &str) -> Result<String> {
    let out = zeta(home)?
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io_err(Path::new("zeta"), e))?;
    if !out.status.success() {
        let err = last_line(&String::from_utf8_lossy(&out.stderr));
        return Err(usage(format!(
            "{what} failed: {}",
            err.strip_prefix("zeta: ").unwrap_or(&err)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The address in `zeta serve`'s first line, "serving on 127.0.0.1:PORT: ..." (or
/// "serving on ADDR, read-only: ...").
fn served_addr(log: &str) -> Option<SocketAddr> {
    let rest = log.lines().find_map(|l| l.strip_prefix("serving on "))?;
    rest.split([',', ' '])
        .next()?
        .trim_end_matches(':')
        .parse()
        .ok()
}

/// A served pool of three file vdevs with volumes v0..v2.
struct ZetaServer {
    server: ChildGuard,
    addr: SocketAddr,
    home: PathBuf,
}

fn start_zeta(
    dir: &Path,
    leaves: &[PathBuf],
    plan: &Plan,
    vb: u32,
    zil: Zil,
    stop: &AtomicBool,
) -> Result<ZetaServer> {
    let home = dir.join("h");
    // The three files hold the three volumes in `pool_scale` times their room, plus room for
    // metadata and the log. A copy-on-write pool places a txg's new copies while the frees of
    // the two txgs before are still held, so random overwrites need free room for about five
    // txgs of rewritten blocks. With 128K blocks every txg rewrites most of the volumes:
    // 4K writes with a flush every 20th (`zeta bench load`, 512M volumes) ran 41k writes/s
    // on a pool three times the volumes, 66k at five times and 92k at eight. (The seed's
    // three 10 GiB volumes sat on three 500 GB disks.)
    let leaf_bytes = plan.leaf_bytes();
    // -f: the leaves held the pool of the measurement before (see `Files`).
    let mut create = vec!["pool".into(), "create".into(), "-f".into(), "-o".into()];
    create.push(format!("size={leaf_bytes}"));
    if plan.zil_props {
        create.extend([
            "-o".into(),
            format!("zil.commit={}", zil.commit),
            "-o".into(),
            format!("zil.placement={}", zil.placement),
        ]);
    }
    create.push(POOL.into());
    create.extend(leaves.iter().map(|f| f.display().to_string()));
    let what = if plan.zil_props {
        format!(
            "zeta pool create -o zil.commit={} -o zil.placement={}",
            zil.commit, zil.placement
        )
    } else {
        "zeta pool create".to_string()
    };
    run_zeta(&home, &create, &what)?;
    for i in 0..VOLUMES {
        let args = [
            "vol".into(),
            "create".into(),
            "-b".into(),
            vb.to_string(),
            format!("{POOL}/v{i}"),
            plan.size_bytes.to_string(),
        ];
        run_zeta(&home, &args, "zeta vol create")?;
    }
    // Port 0: the kernel picks a free port and the server prints it, so runs never collide.
    let mut server = ChildGuard::spawn(
        zeta(&home)?.args(["serve", "--listen", "127.0.0.1:0", POOL]),
        "zeta serve",
        dir.join("serve.log"),
    )?;
    let t = Instant::now();
    let addr = loop {
        if let Some(a) = served_addr(&std::fs::read_to_string(&server.log).unwrap_or_default()) {
            break a;
        }
        if let Some(st) = server.exited()? {
            return Err(usage(format!(
                "zeta serve exited ({st}): {}",
                server.last_words()
            )));
        }
        check_stop(stop)?;
        if t.elapsed() > START_TIMEOUT {
            return Err(usage("zeta serve did not start listening"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    wait_accepting(&mut server, addr, stop)?;
    Ok(ZetaServer { server, addr, home })
}

/// `zeta pool iostat POOL --json` of the served pool (through its control socket). `None`
/// where `tolerate` allows its absence (builds without it, under --no-zil-props).
fn iostat(home: &Path, tolerate: bool) -> Result<Option<Value>> {
    let args = ["pool", "iostat", POOL, "--json"].map(String::from);
    match run_zeta(home, &args, "zeta pool iostat") {
        Ok(out) => serde_json::from_str(&out)
            .map(Some)
            .map_err(|e| usage(format!("zeta pool iostat --json printed no JSON: {e}"))),
        Err(_) if tolerate => Ok(None),
        Err(e) => Err(e),
    }
}

/// Log blocks written per device between two iostat snapshots, in vdev order; `None` if either
/// lacks the counters or the devices differ.
fn log_blocks_delta(before: &Value, after: &Value) -> Option<Vec<u64>> {
    let blocks = |v: &Value| -> Option<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        for (i, d) in v["log"]["vdevs"].as_array()?.iter().enumerate() {
            out.push((
                d["vdev"].as_u64().unwrap_or(i as u64),
                d["blocks"].as_u64()?,
            ));
        }
        out.sort_unstable();
        Some(out)
    };
    let (b, a) = (blocks(before)?, blocks(after)?);
    if b.len() != a.len() || b.iter().zip(&a).any(|(x, y)| x.0 != y.0 || y.1 < x.1) {
        return None;
    }
    Some(b.iter().zip(&a).map(|(x, y)| y.1 - x.1).collect())
}

/// Writes per flush the server counted between two iostat snapshots.
fn server_writes_per_flush(before: &Value, after: &Value) -> Option<f64> {
    let d = |k: &str| after[k].as_u64()?.checked_sub(before[k].as_u64()?);
    let (w, f) = (d("nbd_writes")?, d("nbd_flushes")?);
    (f > 0).then(|| w as f64 / f as f64)
}

#[allow(clippy::too_many_arguments)]
fn measure_zeta(
    dir: &WorkDir,
    files: &mut Files,
    plan: &Plan,
    point: Point,
    vb: u32,
    zil: Zil,
    gen: Gen,
    stop: &AtomicBool,
) -> Result<Measured> {
    let srv = start_zeta(&dir.0, files.pool(plan)?, plan, vb, zil, stop)?;
    let tolerate = !plan.zil_props;
    let before = iostat(&srv.home, tolerate)?;
    let exports: Vec<String> = (0..VOLUMES).map(|i| format!("{POOL}/v{i}")).collect();
    let mut m = drive(gen, srv.addr, &exports, plan, point, &dir.0, stop)?;
    let after = iostat(&srv.home, tolerate)?;
    stop_zeta(srv, &dir.0)?;
    if let (Some(b), Some(a)) = (&before, &after) {
        m.log_blocks_per_device = log_blocks_delta(b, a);
        if m.writes_per_flush.is_none() {
            m.writes_per_flush = server_writes_per_flush(b, a);
        }
    }
    Ok(m)
}

/// Stops a `zeta serve` started by `start_zeta` in `dir`; an unclean exit is an error (a
/// measurement of a server that failed is no measurement).
fn stop_zeta(srv: ZetaServer, dir: &Path) -> Result<()> {
    let status = srv.server.stop()?;
    if !status.success() {
        return Err(usage(format!(
            "zeta serve exited with {status}: {}",
            last_line(&std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default())
        )));
    }
    Ok(())
}

/// Three files of `size` bytes, each written in full and made durable: every target of the
/// run (pool files too) starts as a file in use does, with its blocks allocated. On a sparse
/// file each first write allocates, and a flush then commits the file system's journal too;
/// the copy-on-write pool keeps writing into fresh space, so sparse files measured ext4's
/// allocator (zeta's group commit: 11.6k against 13.0k IOPS written first).
fn make_files(dir: &Path, size: u64) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    (0..VOLUMES)
        .map(|i| {
            let p = dir.join(format!("f{i}"));
            super::bench_cmd::precondition(&p, size)?;
            Ok(p)
        })
        .collect()
}

/// The files the run measures on, each set made (`make_files`) when first needed and used by
/// every measurement after: the pool's three leaves (a new pool is created over them with
/// `-f` each time) and three plain files of a volume's size (the raw files, and what `nbdkit`
/// serves). Made afresh per measurement, each zeta point wrote 25 GB of pool files and
/// deleted them after. On this virtual machine the guest hands freed memory back to its host
/// (free page reporting), and a page touched again after that faults on the host: the page
/// cache of the next point's files cost its txg syncs most of their time in the kernel's
/// copy (47 % of the server's samples right after dropping the caches), and 4K writes with a
/// flush every 5th ran 36-44k against 66-68k writes/s on files kept from run to run. Which
/// point paid that, and how much, varied with what ran before it.
struct Files {
    dir: PathBuf,
    pool: Option<Vec<PathBuf>>,
    plain: Option<Vec<PathBuf>>,
}

impl Files {
    fn new(work: &WorkDir) -> Files {
        Files {
            dir: work.0.clone(),
            pool: None,
            plain: None,
        }
    }

    fn pool(&mut self, plan: &Plan) -> Result<&[PathBuf]> {
        if self.pool.is_none() {
            self.pool = Some(make_files(&self.dir.join("pool"), plan.leaf_bytes())?);
        }
        Ok(self.pool.as_deref().expect("made above"))
    }

    fn plain(&mut self, plan: &Plan) -> Result<&[PathBuf]> {
        if self.plain.is_none() {
            self.plain = Some(make_files(&self.plain_dir(), plan.size_bytes)?);
        }
        Ok(self.plain.as_deref().expect("made above"))
    }

    /// The directory of the plain files, which holds nothing else (`nbdkit file dir=`).
    fn plain_dir(&self) -> PathBuf {
        self.dir.join("plain")
    }
}

fn measure_raw(
    dir: &WorkDir,
    files: &mut Files,
    plan: &Plan,
    point: Point,
    stop: &AtomicBool,
) -> Result<Measured> {
    let files = files.plain(plan)?;
    // libaio on buffered files keeps up to 100 writes queued; fio calls fdatasync after every
    // N (its sync section counts them).
    let mut args = fio_common(plan, point);
    args.extend(["--ioengine=libaio".into(), "--direct=0".into()]);
    for (i, f) in files.iter().enumerate() {
        args.push(format!("--name=v{i}"));
        args.push(format!("--filename={}", f.display()));
    }
    let s = run_fio(&args, &dir.0, plan, stop)?;
    Ok(s.measured())
}

fn measure_nbdkit(
    dir: &WorkDir,
    files: &mut Files,
    plan: &Plan,
    point: Point,
    gen: Gen,
    stop: &AtomicBool,
) -> Result<Measured> {
    let (server, addr) = start_nbdkit(dir, files, plan, stop)?;
    let exports: Vec<String> = (0..VOLUMES).map(|i| format!("f{i}")).collect();
    let m = drive(gen, addr, &exports, plan, point, &dir.0, stop)?;
    server.stop()?;
    Ok(m)
}

/// `nbdkit file` serving three files of a volume's size as exports `f0`, `f1`, `f2`.
fn start_nbdkit(
    dir: &WorkDir,
    files: &mut Files,
    plan: &Plan,
    stop: &AtomicBool,
) -> Result<(ChildGuard, SocketAddr)> {
    files.plain(plan)?;
    let data = files.plain_dir();
    // nbdkit prints no port it picked, so take a free one from the kernel and hand it over.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| io_err(Path::new("127.0.0.1"), e))?;
        l.local_addr()
            .map_err(|e| io_err(Path::new("127.0.0.1"), e))?
            .port()
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // One server with one export per file (`dir=`), as zeta serves all three volumes.
    // --exit-with-parent: it dies with this process even if this process is SIGKILLed.
    let mut server = ChildGuard::spawn(
        Command::new("nbdkit")
            .args(["--exit-with-parent", "-f", "-i", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .arg("file")
            .arg(format!("dir={}", data.display())),
        "nbdkit",
        dir.0.join("nbdkit.log"),
    )?;
    wait_accepting(&mut server, addr, stop)?;
    Ok((server, addr))
}

/// Runs one generator against the NBD exports at `addr`.
fn drive(
    gen: Gen,
    addr: SocketAddr,
    exports: &[String],
    plan: &Plan,
    point: Point,
    scratch: &Path,
    stop: &AtomicBool,
) -> Result<Measured> {
    match gen {
        Gen::Fio => {
            let mut args = fio_common(plan, point);
            args.push("--ioengine=nbd".into());
            for (i, e) in exports.iter().enumerate() {
                args.push(format!("--name=v{i}"));
                // libnbd takes everything after the authority as the export name, slash included
                // (as scripts/bench-nbd.sh does).
                args.push(format!("--uri=nbd://{addr}/{e}"));
            }
            Ok(run_fio(&args, scratch, plan, stop)?.measured())
        }
        Gen::ZetaLoad => {
            let spec = LoadSpec {
                bs_bytes: point.bs_bytes,
                writes_per_flush: point.writes_per_flush,
                depth: DEPTH,
                runtime: plan.runtime,
                seed: nbd_load::SEED,
                fua: false,
            };
            let r = nbd_load::run(addr, exports, &spec, stop).map_err(|e| CliError::Io {
                path: format!("zeta-load nbd://{addr}"),
                source: e,
            })?;
            Ok(Measured {
                iops: r.writes_per_sec,
                lat_mean_us: r.lat_mean_us,
                lat_p99_us: r.lat_p99_us,
                writes_per_flush: r.writes_per_flush(),
                log_blocks_per_device: None,
            })
        }
    }
}

/// The job options every fio run shares; the jobs (one per volume or file) follow.
/// `--group_reporting` makes fio merge the three jobs: summed IOPS, and latency percentiles
/// over all writes (percentiles of separate jobs cannot be combined afterwards).
/// `--lat_percentiles` gives percentiles of `lat` (submission to completion, what zeta-load
/// measures as sent to reply) rather than of `clat`.
fn fio_common(plan: &Plan, p: Point) -> Vec<String> {
    vec![
        "--rw=randwrite".into(),
        format!("--bs={}", p.bs_bytes),
        format!("--iodepth={DEPTH}"),
        format!("--fsync={}", p.writes_per_flush),
        "--time_based".into(),
        format!("--runtime={}", plan.runtime.as_secs()),
        format!("--size={}", plan.size_bytes),
        "--output-format=json".into(),
        "--lat_percentiles=1".into(),
        "--group_reporting".into(),
    ]
}

struct FioStats {
    iops: f64,
    lat_mean_us: Option<f64>,
    lat_p99_us: Option<f64>,
    writes: Option<u64>,
    /// Flushes (fsyncs) issued, from fio's `sync` section where it has one.
    syncs: Option<u64>,
}

impl FioStats {
    fn measured(&self) -> Measured {
        let wpf = match (self.writes, self.syncs) {
            (Some(w), Some(s)) if s > 0 => Some(w as f64 / s as f64),
            _ => None,
        };
        Measured {
            iops: self.iops,
            lat_mean_us: self.lat_mean_us,
            lat_p99_us: self.lat_p99_us,
            writes_per_flush: wpf,
            log_blocks_per_device: None,
        }
    }
}

fn run_fio(args: &[String], scratch: &Path, plan: &Plan, stop: &AtomicBool) -> Result<FioStats> {
    let log = scratch.join("fio.json");
    // fio writes any state files into its working directory: the scratch directory.
    let child = ChildGuard::spawn(
        Command::new("fio").args(args).current_dir(scratch),
        "fio",
        log.clone(),
    )?;
    let (status, last) = child.wait(plan.runtime + FIO_OVERRUN, stop)?;
    if !status.success() {
        return Err(usage(format!("fio exited with {status}: {last}")));
    }
    let text = std::fs::read_to_string(&log).map_err(|e| io_err(&log, e))?;
    parse_fio(&text)
}

/// fio's JSON result (the nbd engine prints a line before it; anything after it is ignored).
fn parse_fio(text: &str) -> Result<FioStats> {
    let start = text
        .find('{')
        .ok_or_else(|| usage(format!("fio printed no JSON: {}", last_line(text))))?;
    let v: Value = serde_json::Deserializer::from_str(&text[start..])
        .into_iter::<Value>()
        .next()
        .ok_or_else(|| usage("fio printed no JSON"))?
        .map_err(|e| usage(format!("fio's JSON does not parse: {e}")))?;
    let job = &v["jobs"][0];
    if job["error"].as_u64() != Some(0) {
        return Err(usage(format!("fio reported error {}", job["error"])));
    }
    let w = &job["write"];
    let iops = w["iops"]
        .as_f64()
        .ok_or_else(|| usage("fio's JSON has no write IOPS"))?;
    let us = |v: &Value| v.as_f64().map(|ns| ns / 1e3);
    Ok(FioStats {
        iops,
        lat_mean_us: us(&w["lat_ns"]["mean"]),
        lat_p99_us: us(&w["lat_ns"]["percentile"]["99.000000"]),
        writes: w["total_ios"].as_u64(),
        syncs: job["sync"]["total_ios"].as_u64(),
    })
}

fn print_header(plan: &Plan) {
    println!(
        "zeta bench sync: random writes with a flush every N, {VOLUMES} volumes of {} on a pool \
         of {VOLUMES} file vdevs of {} (--pool-scale {}), one client per volume with {DEPTH} \
         I/Os in flight, {} s per measurement, each zeta one on a new pool",
        human(plan.size_bytes),
        human(plan.leaf_bytes()),
        plan.pool_scale,
        plan.runtime.as_secs()
    );
    if plan.runs > 1 {
        println!(
            "{} runs of every measurement, taking turns; each row is its target's run of median \
             IOPS, and the ratios are between those rows",
            plan.runs
        );
    }
    println!(
        "latency: fio = write lat (submission to completion), zeta-load = request sent to reply \
         read. w/flush: writes per flush actually sent. log blk/dev: log blocks written per \
         device."
    );
    println!(
        "xbase, xraw, xnbdkit: IOPS of group/global over per-request/per-volume, over the raw \
         files (fio, libaio, fdatasync every N; fio is raw's only generator) and over nbdkit \
         file, with the same generator"
    );
}

/// Block and write sizes, all whole KiB here: "4K", "128K".
fn kib(bytes: u32) -> String {
    format!("{}K", bytes / 1024)
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

fn print_table(plan: &Plan, p: Point, vb: u32, rows: &[&Row]) {
    let same = |r: &&&Row| {
        r.point.bs_bytes == p.bs_bytes
            && r.point.writes_per_flush == p.writes_per_flush
            && r.volblocksize.is_none_or(|v| v == vb)
    };
    let find = |gen: Gen, commit: &str| {
        rows.iter()
            .filter(same)
            .find(|r| r.gen == gen && r.zil.commit == commit)
    };
    println!();
    println!(
        "{} random writes, a flush every {}, volblocksize {}{}",
        kib(p.bs_bytes),
        p.writes_per_flush,
        kib(vb),
        if plan.zil_props {
            ""
        } else {
            " (--no-zil-props: both configurations are the default pool)"
        }
    );
    println!(
        "{:<10} {:<12} {:<11} {:>9} {:>9} {:>9} {:>7} {:>16} {:>6} {:>6} {:>8}",
        "generator",
        "commit",
        "placement",
        "IOPS",
        "mean us",
        "p99 us",
        "w/flush",
        "log blk/dev",
        "xbase",
        "xraw",
        "xnbdkit"
    );
    for r in rows.iter().filter(same) {
        let ratio = |other: Option<&&Row>| match (r.zil.commit, other) {
            ("group", Some(o)) if o.m.iops > 0.0 => format!("{:.2}", r.m.iops / o.m.iops),
            _ => String::new(),
        };
        let blocks = r.m.log_blocks_per_device.as_ref().map_or("-".into(), |b| {
            b.iter().map(u64::to_string).collect::<Vec<_>>().join("/")
        });
        let line = format!(
            "{:<10} {:<12} {:<11} {:>9.0} {:>9} {:>9} {:>7} {:>16} {:>6} {:>6} {:>8}",
            r.gen.name(),
            r.zil.commit,
            r.zil.placement,
            r.m.iops,
            opt(r.m.lat_mean_us, 0),
            opt(r.m.lat_p99_us, 0),
            opt(r.m.writes_per_flush, 2),
            if r.volblocksize.is_some() {
                blocks
            } else {
                String::new()
            },
            ratio(find(r.gen, BASELINE.commit)),
            ratio(find(Gen::Fio, RAW.commit)),
            ratio(find(r.gen, NBDKIT.commit)),
        );
        println!("{}", line.trim_end());
    }
    let _ = std::io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fio_json_after_a_banner() {
        let text = "fio: connected to NBD server\n{\"jobs\":[{\"error\":0,\
            \"write\":{\"iops\":1500.5,\"total_ios\":3001,\"lat_ns\":{\"mean\":2500.0,\
            \"percentile\":{\"99.000000\":9000}}},\"sync\":{\"total_ios\":600}}]}\ntrailing";
        let s = parse_fio(text).unwrap();
        assert_eq!(s.iops, 1500.5);
        assert_eq!((s.lat_mean_us, s.lat_p99_us), (Some(2.5), Some(9.0)));
        assert!((s.measured().writes_per_flush.unwrap() - 3001.0 / 600.0).abs() < 1e-12);
        let no_sync = parse_fio("{\"jobs\":[{\"error\":0,\"write\":{\"iops\":1}}]}").unwrap();
        assert_eq!(no_sync.measured().writes_per_flush, None);
        assert_eq!(no_sync.lat_p99_us, None);
        assert!(parse_fio("{\"jobs\":[{\"error\":5,\"write\":{\"iops\":1}}]}").is_err());
        assert!(parse_fio("fio: engine nbd not loadable").is_err());
    }

    #[test]
    fn served_address_from_the_first_line() {
        let log = "serving on 127.0.0.1:39613: (max 64 connections)\n  nbd://...";
        assert_eq!(served_addr(log), Some("127.0.0.1:39613".parse().unwrap()));
        let ro = "serving on 127.0.0.1:5, read-only: (max 1 connections)";
        assert_eq!(served_addr(ro), Some("127.0.0.1:5".parse().unwrap()));
        assert_eq!(served_addr("zeta: cannot listen"), None);
    }

    #[test]
    fn iostat_deltas() {
        let before = json!({"log": {"vdevs": [{"vdev": 1, "blocks": 5}, {"vdev": 0, "blocks": 2}]},
                            "nbd_writes": 10, "nbd_flushes": 2});
        let after = json!({"log": {"vdevs": [{"vdev": 0, "blocks": 7}, {"vdev": 1, "blocks": 9}]},
                           "nbd_writes": 110, "nbd_flushes": 22});
        assert_eq!(log_blocks_delta(&before, &after), Some(vec![5, 4]));
        assert_eq!(server_writes_per_flush(&before, &after), Some(5.0));
        assert_eq!(log_blocks_delta(&json!({}), &after), None);
        assert_eq!(server_writes_per_flush(&json!({}), &after), None);
    }

    #[test]
    fn the_median_run_of_each_target_is_shown() {
        let row = |zil: Zil, run: u32, iops: f64| Row {
            point: Point {
                bs_bytes: 4096,
                writes_per_flush: 5,
            },
            qd1_fua: false,
            volblocksize: Some(131072),
            gen: Gen::ZetaLoad,
            zil,
            run,
            m: Measured {
                iops,
                lat_mean_us: Some(iops / 10.0),
                lat_p99_us: None,
                writes_per_flush: None,
                log_blocks_per_device: None,
            },
        };
        let rows = vec![
            row(BASELINE, 1, 300.0),
            row(OPTIMIZED, 1, 900.0),
            row(BASELINE, 2, 100.0),
            row(OPTIMIZED, 2, 700.0),
            row(BASELINE, 3, 200.0),
            row(OPTIMIZED, 3, 800.0),
        ];
        let shown = medians(&rows);
        let got: Vec<(&str, u32, f64, Option<f64>)> = shown
            .iter()
            .map(|r| (r.zil.commit, r.run, r.m.iops, r.m.lat_mean_us))
            .collect();
        // Whole runs, each target once, in the order first measured.
        assert_eq!(
            got,
            vec![
                ("per-request", 3, 200.0, Some(20.0)),
                ("group", 3, 800.0, Some(80.0))
            ]
        );
        // Two runs: the lower one; one run: itself.
        assert_eq!(medians(&rows[..4])[1].m.iops, 700.0);
        assert_eq!(medians(&rows[..2]).len(), 2);
        assert_eq!(medians(&rows[..1])[0].m.iops, 300.0);
        // Another volume block size is another target.
        let mut other = row(OPTIMIZED, 1, 5.0);
        other.volblocksize = Some(16384);
        let mut more = rows;
        more.push(other);
        assert_eq!(medians(&more).len(), 3);
    }

    #[test]
    fn point_lists() {
        let pairs = |list: &str| -> Vec<(u32, u32)> {
            parse_points(list)
                .unwrap()
                .iter()
                .map(|p| (p.bs_bytes, p.writes_per_flush))
                .collect()
        };
        assert_eq!(pairs("8K/5, 4K/20"), vec![(8192, 5), (4096, 20)]);
        assert_eq!(pairs(QUICK_POINTS), vec![(4096, 5)]);
        assert_eq!(pairs(ALL_POINTS).len(), 7);
        for bad in [
            "8K",
            "8K/0",
            "6K/5",
            "8M/5",
            "x/5",
            "4K/5,4K/5",
            "",
            "4K/1001",
        ] {
            assert!(parse_points(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn volblocksize_lists() {
        assert_eq!(
            parse_volblocksizes("128K,16K").unwrap(),
            vec![131072, 16384]
        );
        assert!(parse_volblocksizes("3K").is_err());
        assert!(parse_volblocksizes("256K").is_err());
        assert!(parse_volblocksizes("16K,16K").is_err());
        assert!(parse_volblocksizes("").is_err());
    }
}
