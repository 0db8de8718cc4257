//! The zeta server under test: started on a new pool, measured with its log counters
//! (`zeta pool iostat`) before and after, and stopped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::cpustat::CpuUse;
use super::devstat::DeviceWrites;
use super::peers::{drive, Files};
use super::procs::{last_line, wait_accepting, ChildGuard, WorkDir};
use super::{check_stop, Gen, Measured, Plan, Point, Zil, POOL, START_TIMEOUT, VOLUMES};
use zeta_server::{usage, Result};

/// `zeta` itself (this executable), with its state in `home`.
pub(crate) fn zeta(home: &Path) -> Result<Command> {
    let exe = std::env::current_exe()
        .map_err(|e| zeta_server::Error::io(Path::new("current executable"), e))?;
    let mut c = Command::new(exe);
    c.env("ZETA_HOME", home);
    Ok(c)
}

/// Runs a short `zeta` command; its stdout, or its one-line error.
pub(crate) fn run_zeta(home: &Path, args: &[String], what: &str) -> Result<String> {
    let out = zeta(home)?
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| zeta_server::Error::io(Path::new("zeta"), e))?;
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
pub(crate) fn served_addr(log: &str) -> Option<SocketAddr> {
    let rest = log.lines().find_map(|l| l.strip_prefix("serving on "))?;
    rest.split([',', ' '])
        .next()?
        .trim_end_matches(':')
        .parse()
        .ok()
}

/// A served pool of three file vdevs with volumes v0..v2.
pub(super) struct ZetaServer {
    server: ChildGuard,
    pub(super) addr: SocketAddr,
    home: PathBuf,
}

pub(super) fn start_zeta(
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
    // txgs of rewritten blocks. With 128K blocks every txg rewrites most of the volumes, and
    // short writes ran faster the more room the pool had (figures: docs/perf/volume.md,
    // "Free room and random overwrites"). (The seed's three 10 GiB volumes sat on three
    // 500 GB disks.)
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
    let (server, addr) = serve(&home, POOL, &dir.join("serve.log"), stop)?;
    Ok(ZetaServer { server, addr, home })
}

/// Starts `zeta serve` on `pool` of `home`, its output to `log`, and waits until it accepts
/// connections: the child and its address.
pub(crate) fn serve(
    home: &Path,
    pool: &str,
    log: &Path,
    stop: &AtomicBool,
) -> Result<(ChildGuard, SocketAddr)> {
    // Port 0: the kernel picks a free port and the server prints it, so runs never collide.
    let mut server = ChildGuard::spawn(
        zeta(home)?.args(["serve", "--listen", "127.0.0.1:0", pool]),
        "zeta serve",
        log.to_path_buf(),
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
    Ok((server, addr))
}

/// `zeta pool iostat POOL --json` of the served pool (through its control socket). `None`
/// where `tolerate` allows its absence (builds without it, under --no-zil-props).
pub(super) fn iostat(home: &Path, tolerate: bool) -> Result<Option<Value>> {
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
pub(super) fn log_blocks_delta(before: &Value, after: &Value) -> Option<Vec<u64>> {
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
pub(super) fn server_writes_per_flush(before: &Value, after: &Value) -> Option<f64> {
    let d = |k: &str| after[k].as_u64()?.checked_sub(before[k].as_u64()?);
    let (w, f) = (d("nbd_writes")?, d("nbd_flushes")?);
    (f > 0).then(|| w as f64 / f as f64)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn measure_zeta(
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
    // Counted until the server has stopped: its last txg holds writes of the measurement.
    let device = DeviceWrites::start(files.pool(plan)?);
    let cpu = CpuUse::start(srv.server.pid());
    let mut m = drive(gen, srv.addr, &exports, plan, point, &dir.0, stop)?;
    m.cpu = cpu.finish();
    let after = iostat(&srv.home, tolerate)?;
    stop_zeta(srv, &dir.0)?;
    m.device_write_bytes = device.and_then(DeviceWrites::finish);
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
pub(super) fn stop_zeta(srv: ZetaServer, dir: &Path) -> Result<()> {
    let status = srv.server.stop()?;
    if !status.success() {
        return Err(usage(format!(
            "zeta serve exited with {status}: {}",
            last_line(&std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default())
        )));
    }
    Ok(())
}
