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

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::args::BenchSyncArgs;
use crate::load::{self, LoadSpec};
use zeta_server::fmt::parse_size;
use zeta_server::{usage, Error, Result};

mod cpustat;
mod devstat;
mod peers;
pub(crate) mod procs;
mod report;
pub(crate) mod zeta;

use cpustat::CpuFigures;
use peers::{measure_device, measure_nbdkit, measure_raw, run_fio, start_nbdkit, zeta_load, Files};
use procs::WorkDir;
use report::{kib, print_device, print_header, print_latency_table, print_table};
use zeta::{measure_zeta, start_zeta, stop_zeta};

/// Volumes, vdevs and client jobs (one job per volume).
const VOLUMES: usize = 3;
/// Requests in flight per volume, flushes included.
const DEPTH: u32 = 100;
const POOL: &str = "sync";
/// How long a server may take to start accepting connections.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(60);
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
    /// The device's rate for durable writes (`peers::measure_device`), in MB/s: measured at
    /// the start of the run, `None` until then and where the files are on no counted device.
    device_mb_per_s: Option<f64>,
}

impl Plan {
    /// The size of each of the pool's files.
    fn leaf_bytes(&self) -> u64 {
        self.pool_scale * self.size_bytes + (256 << 20)
    }
}

/// One measurement's figures. `None` is a figure the source did not provide (printed as `-`,
/// null in JSON), never a guess; `Default` has none of them.
#[derive(Default)]
struct Measured {
    iops: f64,
    lat_mean_us: Option<f64>,
    lat_p99_us: Option<f64>,
    writes_per_flush: Option<f64>,
    log_blocks_per_device: Option<Vec<u64>>,
    /// Bytes written to the device under the files meanwhile (`devstat`), where counted.
    device_write_bytes: Option<u64>,
    /// The server's and the machine's processor time meanwhile (`cpustat`).
    cpu: CpuFigures,
    /// The latency section's zeta-load rows: the mean latency of the run's slowest second
    /// (`load::Slice`), where a txg's writeback, which every log commit waits behind,
    /// shows; the run's mean spreads it over 30.
    worst_second_lat_mean_us: Option<f64>,
}

impl Measured {
    /// Device bytes written per byte the clients wrote (`runtime` seconds of writes of
    /// `bs_bytes`), where the device's writes were counted.
    fn write_amplification(&self, bs_bytes: u32, runtime: Duration) -> Option<f64> {
        let client = self.client_writes(runtime)? * bs_bytes as f64;
        Some(self.device_write_bytes? as f64 / client)
    }

    /// Microseconds of the server's processor time per write the clients made (`runtime`
    /// seconds of them), where the server has a process and it was read.
    fn server_cpu_us_per_write(&self, runtime: Duration) -> Option<f64> {
        Some(self.cpu.server_secs? * 1e6 / self.client_writes(runtime)?)
    }

    /// The device's writes per second in MB/s (10^6 bytes), over `runtime` seconds, where
    /// they were counted.
    fn device_mb_per_s(&self, runtime: Duration) -> Option<f64> {
        Some(devstat::mb_per_s(self.device_write_bytes?, runtime))
    }

    /// The writes the clients made in `runtime` seconds; `None` if none.
    fn client_writes(&self, runtime: Duration) -> Option<f64> {
        let writes = self.iops * runtime.as_secs_f64();
        (writes > 0.0).then_some(writes)
    }
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

    fn write_amplification(&self, plan: &Plan) -> Option<f64> {
        (self.m).write_amplification(self.point.bs_bytes, plan.runtime)
    }

    fn json(&self, plan: &Plan) -> Value {
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
            "worst_second_lat_mean_us": self.m.worst_second_lat_mean_us,
            "writes_per_flush": self.m.writes_per_flush,
            "log_blocks_per_device": self.m.log_blocks_per_device,
            "device_write_bytes": self.m.device_write_bytes,
            "write_amplification": self.write_amplification(plan),
            "device_write_mb_per_s": self.m.device_mb_per_s(plan.runtime),
            "device_durable_mb_per_s": plan.device_mb_per_s,
            "server_cpu_us_per_write": self.m.server_cpu_us_per_write(plan.runtime),
            "machine_busy": self.m.cpu.machine_busy,
            "run": self.run,
        })
    }
}

fn interrupted() -> Error {
    usage("interrupted; child processes stopped and temporary files removed")
}

pub(crate) fn check_stop(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::SeqCst) {
        return Err(interrupted());
    }
    Ok(())
}

/// The flag SIGINT and SIGTERM raise. Ctrl-C reaches the whole process group: the servers
/// and fio stop by themselves, and the bench notices the flag, stops what is left and
/// removes its files. A second signal exits at once.
pub(crate) fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let reg = signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, stop.clone())
            .and_then(|_| signal_hook::flag::register(sig, stop.clone()));
        reg.map_err(|e| Error::io(Path::new("signal handler"), e))?;
    }
    Ok(stop)
}

pub fn sync_bench(args: BenchSyncArgs) -> Result<()> {
    let mut plan = plan(&args)?;
    check_tools()?;
    std::fs::create_dir_all(&args.dir).map_err(|e| Error::io(&args.dir, e))?;
    let stop = stop_on_signals()?;
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
    eprintln!("[device] durable 1M writes on the plain files (fio), for the dev MB/s column");
    plan.device_mb_per_s = measure_device(&work.sub(0)?, &mut files, &plan, &stop)?;
    if !args.json {
        print_device(&plan);
    }
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
                    keep(row, &plan, args.json, &mut rows);
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
                    run_fio(&args, &dir.0, plan.runtime, stop).map(|s| Measured {
                        iops: s.iops,
                        // At queue depth 1 a durable write takes 1 / IOPS: the pwrite and the
                        // fdatasync after it (fio's own latency figures count the pwrite only).
                        lat_mean_us: (s.iops > 0.0).then(|| 1e6 / s.iops),
                        lat_p99_us: None,
                        writes_per_flush: s.measured().writes_per_flush,
                        ..Measured::default()
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
            keep(row, plan, args.json, &mut rows);
        }
    }
    if !args.json {
        print_latency_table(&medians(&rows));
    }
    Ok(())
}

/// Prints a measured row at once under `--json` (so a long run shows its progress), and
/// keeps it for the tables.
fn keep(row: Row, plan: &Plan, json: bool, rows: &mut Vec<Row>) {
    if json {
        println!("{}", row.json(plan));
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
        seed: load::SEED,
        fua: true,
        interval: Some(Duration::from_secs(1)),
    };
    zeta_load(addr, &[export.to_string()], &spec, stop)
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
        device_mb_per_s: None,
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

#[cfg(test)]
mod tests {
    use super::peers::parse_fio;
    use super::zeta::{log_blocks_delta, served_addr, server_writes_per_flush};
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
    fn write_amplification_is_device_bytes_over_client_bytes() {
        let m = |iops: f64, device: Option<u64>| Measured {
            iops,
            device_write_bytes: device,
            ..Measured::default()
        };
        let secs = Duration::from_secs(30);
        // 1000 4K writes a second for 30 s: 122.88 MB; the device took twice that.
        let amp = m(1000.0, Some(2 * 1000 * 30 * 4096)).write_amplification(4096, secs);
        assert!((amp.unwrap() - 2.0).abs() < 1e-12);
        assert_eq!(m(1000.0, None).write_amplification(4096, secs), None);
        assert_eq!(m(0.0, Some(1 << 20)).write_amplification(4096, secs), None);
    }

    #[test]
    fn server_cpu_per_write_is_its_time_over_the_writes() {
        let m = |iops: f64, server_secs: Option<f64>| Measured {
            iops,
            cpu: CpuFigures {
                server_secs,
                machine_busy: Some(0.5),
            },
            ..Measured::default()
        };
        let secs = Duration::from_secs(30);
        // 50000 writes a second for 30 s, on 36 s of the server's time: 24 us each.
        let us = m(50_000.0, Some(36.0)).server_cpu_us_per_write(secs);
        assert!((us.unwrap() - 24.0).abs() < 1e-9);
        assert_eq!(m(50_000.0, None).server_cpu_us_per_write(secs), None);
        assert_eq!(m(0.0, Some(1.0)).server_cpu_us_per_write(secs), None);
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
                ..Measured::default()
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
