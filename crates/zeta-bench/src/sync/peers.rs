//! The references measured beside zeta (fio on three plain files, `nbdkit file` serving them)
//! and the load generators that drive every target.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde_json::Value;

use super::cpustat::CpuUse;
use super::devstat::{mb_per_s, DeviceWrites};
use super::procs::{last_line, wait_accepting, ChildGuard, WorkDir};
use super::{Gen, Measured, Plan, Point, DEPTH, FIO_OVERRUN, VOLUMES};
use crate::load::{self, LoadSpec};
use zeta_server::{usage, Error, Result};

/// Three files of `size` bytes, each written in full and made durable: every target of the
/// run (pool files too) starts as a file in use does, with its blocks allocated. On a sparse
/// file each first write allocates, and a flush then commits the file system's journal too;
/// the copy-on-write pool keeps writing into fresh space, so sparse files measured ext4's
/// allocator (figures: docs/perf/README.md, "Why the benchmarks write every file in full
/// first").
fn make_files(dir: &Path, size: u64) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    (0..VOLUMES)
        .map(|i| {
            let p = dir.join(format!("f{i}"));
            crate::vol::precondition(&p, size)?;
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
/// copy, and short sync writes ran far slower than on files kept from run to run. Which
/// point paid that, and how much, varied with what ran before it (figures:
/// docs/perf/README.md, "Why `bench sync` makes its files once per run").
pub(super) struct Files {
    dir: PathBuf,
    pool: Option<Vec<PathBuf>>,
    plain: Option<Vec<PathBuf>>,
}

impl Files {
    pub(super) fn new(work: &WorkDir) -> Files {
        Files {
            dir: work.0.clone(),
            pool: None,
            plain: None,
        }
    }

    pub(super) fn pool(&mut self, plan: &Plan) -> Result<&[PathBuf]> {
        if self.pool.is_none() {
            self.pool = Some(make_files(&self.dir.join("pool"), plan.leaf_bytes())?);
        }
        Ok(self.pool.as_deref().expect("made above"))
    }

    pub(super) fn plain(&mut self, plan: &Plan) -> Result<&[PathBuf]> {
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

pub(super) fn measure_raw(
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
    let device = DeviceWrites::start(files);
    let cpu = CpuUse::start(None);
    let s = run_fio(&args, &dir.0, plan.runtime, stop)?;
    let mut m = s.measured();
    m.cpu = cpu.finish();
    m.device_write_bytes = device.and_then(DeviceWrites::finish);
    Ok(m)
}

pub(super) fn measure_nbdkit(
    dir: &WorkDir,
    files: &mut Files,
    plan: &Plan,
    point: Point,
    gen: Gen,
    stop: &AtomicBool,
) -> Result<Measured> {
    let (server, addr) = start_nbdkit(dir, files, plan, stop)?;
    let exports: Vec<String> = (0..VOLUMES).map(|i| format!("f{i}")).collect();
    let device = DeviceWrites::start(files.plain(plan)?);
    let cpu = CpuUse::start(server.pid());
    let mut m = drive(gen, addr, &exports, plan, point, &dir.0, stop)?;
    m.cpu = cpu.finish();
    server.stop()?;
    m.device_write_bytes = device.and_then(DeviceWrites::finish);
    Ok(m)
}

/// How long the device's reference (`measure_device`) runs at most.
const DEVICE_RUNTIME: Duration = Duration::from_secs(10);

/// The device's rate for durable writes, in MB/s (10^6 bytes) counted at the block device:
/// fio writing 1 MiB at random offsets of the three plain files past the page cache
/// (`O_DIRECT`), with an `fdatasync` after every 4, one job per file. That is about what a
/// batch of zeta's group commit asks of it (a few MiB of whole blocks made durable, then a log
/// block), and what nbdkit's and the raw files' flushes ask at the larger writes. A target whose
/// device writes (`dev MB/s`) come near this, with processor time to spare, is bound by the
/// device: more writes in flight only wait longer.
///
/// `None` where the files lie on no block device whose writes are counted (tmpfs: no device,
/// and no `O_DIRECT` either).
pub(super) fn measure_device(
    dir: &WorkDir,
    files: &mut Files,
    plan: &Plan,
    stop: &AtomicBool,
) -> Result<Option<f64>> {
    let files = files.plain(plan)?;
    let Some(device) = DeviceWrites::start(files) else {
        return Ok(None);
    };
    let runtime = plan.runtime.min(DEVICE_RUNTIME);
    let mut args: Vec<String> = vec![
        "--rw=randwrite".into(),
        "--bs=1M".into(),
        "--ioengine=psync".into(),
        "--direct=1".into(),
        "--fdatasync=4".into(),
        "--time_based".into(),
        format!("--runtime={}", runtime.as_secs()),
        format!("--size={}", plan.size_bytes),
        "--output-format=json".into(),
        "--group_reporting".into(),
    ];
    for (i, f) in files.iter().enumerate() {
        args.push(format!("--name=d{i}"));
        args.push(format!("--filename={}", f.display()));
    }
    run_fio(&args, &dir.0, runtime, stop)?;
    Ok(device.finish().map(|bytes| mb_per_s(bytes, runtime)))
}

/// `nbdkit file` serving three files of a volume's size as exports `f0`, `f1`, `f2`.
pub(super) fn start_nbdkit(
    dir: &WorkDir,
    files: &mut Files,
    plan: &Plan,
    stop: &AtomicBool,
) -> Result<(ChildGuard, SocketAddr)> {
    files.plain(plan)?;
    let data = files.plain_dir();
    // nbdkit prints no port it picked, so take a free one from the kernel and hand it over.
    let port = {
        let l =
            TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io(Path::new("127.0.0.1"), e))?;
        l.local_addr()
            .map_err(|e| Error::io(Path::new("127.0.0.1"), e))?
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
pub(super) fn drive(
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
            Ok(run_fio(&args, scratch, plan.runtime, stop)?.measured())
        }
        Gen::ZetaLoad => {
            let spec = LoadSpec {
                bs_bytes: point.bs_bytes,
                writes_per_flush: point.writes_per_flush,
                depth: DEPTH,
                runtime: plan.runtime,
                seed: load::SEED,
                fua: false,
                interval: None,
            };
            zeta_load(addr, exports, &spec, stop)
        }
    }
}

/// One run of zeta-load (`nbd_load.rs`) against `exports` of the server at `addr`, one
/// connection each.
pub(super) fn zeta_load(
    addr: SocketAddr,
    exports: &[String],
    spec: &LoadSpec,
    stop: &AtomicBool,
) -> Result<Measured> {
    let r = load::run(addr, exports, spec, stop).map_err(|e| Error::Io {
        path: format!("zeta-load nbd://{addr}/{}", exports.join(",")),
        source: e,
    })?;
    Ok(Measured {
        iops: r.writes_per_sec,
        lat_mean_us: r.lat_mean_us,
        lat_p99_us: r.lat_p99_us,
        // None where no flush was sent (FUA writes).
        writes_per_flush: r.writes_per_flush(),
        // Slices with no writes have no mean: a second with none is not taken for a fast one,
        // and a run with no writes at all has no worst second.
        worst_second_lat_mean_us: r
            .slices
            .iter()
            .filter_map(|s| s.lat_mean_us)
            .max_by(f64::total_cmp),
        ..Measured::default()
    })
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

pub(super) struct FioStats {
    pub(super) iops: f64,
    pub(super) lat_mean_us: Option<f64>,
    pub(super) lat_p99_us: Option<f64>,
    writes: Option<u64>,
    /// Flushes (fsyncs) issued, from fio's `sync` section where it has one.
    syncs: Option<u64>,
}

impl FioStats {
    pub(super) fn measured(&self) -> Measured {
        let wpf = match (self.writes, self.syncs) {
            (Some(w), Some(s)) if s > 0 => Some(w as f64 / s as f64),
            _ => None,
        };
        Measured {
            iops: self.iops,
            lat_mean_us: self.lat_mean_us,
            lat_p99_us: self.lat_p99_us,
            writes_per_flush: wpf,
            ..Measured::default()
        }
    }
}

pub(super) fn run_fio(
    args: &[String],
    scratch: &Path,
    runtime: Duration,
    stop: &AtomicBool,
) -> Result<FioStats> {
    let log = scratch.join("fio.json");
    // fio writes any state files into its working directory: the scratch directory.
    let child = ChildGuard::spawn(
        Command::new("fio").args(args).current_dir(scratch),
        "fio",
        log.clone(),
    )?;
    let (status, last) = child.wait(runtime + FIO_OVERRUN, stop)?;
    if !status.success() {
        return Err(usage(format!("fio exited with {status}: {last}")));
    }
    let text = std::fs::read_to_string(&log).map_err(|e| Error::io(&log, e))?;
    parse_fio(&text)
}

/// fio's JSON result (the nbd engine prints a line before it; anything after it is ignored).
pub(super) fn parse_fio(text: &str) -> Result<FioStats> {
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
