//! `zeta serve` and `zeta up`: serve volumes over NBD until SIGINT, SIGTERM or SIGHUP.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use super::args::{NetArgs, ServeArgs, TlsArg, UpArgs};
use super::fmt::{human, parse_size};
use super::memory::{self, Limits};
use super::pool_cmd::create_pool;
use super::state::Home;
use super::{usage, CliError, Result};
use crate::dsl::Pool;
use crate::nbd::tls::{Tls, TlsMode};
use crate::nbd::{Exports, PoolExports, Server, ServerConfig};

pub const UP_POOL: &str = "zeta";
pub const UP_VOLUME: &str = "vol0";

/// The TLS credentials the flags name, checked and loaded now (a bad file is a usage error
/// at start, not a failed handshake later).
fn tls_config(net: &NetArgs) -> Result<Option<Arc<Tls>>> {
    let mode = match net.tls {
        TlsArg::Off => TlsMode::Off,
        TlsArg::On => TlsMode::On,
        TlsArg::Require => TlsMode::Require,
    };
    let tls = match (&net.tls_certificates, &net.tls_psk, mode) {
        (None, None, TlsMode::Off) => return Ok(None),
        (Some(_), Some(_), _) => {
            return Err(usage(
                "give one of --tls-certificates and --tls-psk, not both",
            ))
        }
        (_, _, TlsMode::Off) => {
            return Err(usage(
                "--tls-certificates and --tls-psk need --tls=on or --tls=require",
            ))
        }
        (None, None, _) => {
            return Err(usage(
                "--tls=on and --tls=require need --tls-certificates DIR or --tls-psk FILE",
            ))
        }
        (Some(dir), None, _) => Tls::x509(mode, dir),
        (None, Some(file), _) => Tls::psk(mode, file),
    };
    tls.map(|t| Some(Arc::new(t)))
        .map_err(|e| usage(format!("TLS: {e}")))
}

fn config(net: &NetArgs) -> Result<ServerConfig> {
    let listen: SocketAddr = net.listen.parse().map_err(|_| {
        usage(format!(
            "--listen '{}' is not an ADDR:PORT such as 127.0.0.1:10809",
            net.listen
        ))
    })?;
    if net.max_connections == 0 {
        return Err(usage("--max-connections must be at least 1"));
    }
    if net.max_handshakes == 0 {
        return Err(usage("--max-handshakes must be at least 1"));
    }
    if net.handshake_timeout == 0 || net.write_timeout == 0 {
        return Err(usage(
            "--handshake-timeout and --write-timeout must be at least 1 second",
        ));
    }
    let inflight = parse_size(&net.max_inflight)?;
    if inflight < crate::nbd::proto::MAX_PAYLOAD as u64 {
        return Err(usage(format!(
            "--max-inflight must be at least {} (the largest request the server accepts)",
            human(crate::nbd::proto::MAX_PAYLOAD as u64)
        )));
    }
    let tls = tls_config(net)?;
    if !listen.ip().is_loopback() && tls.as_ref().is_none_or(|t| t.mode != TlsMode::Require) {
        eprintln!(
            "zeta serve: warning: listening on {listen} without --tls=require: anyone who can \
             reach it reads and writes every volume in clear text"
        );
    }
    Ok(ServerConfig {
        listen,
        tls,
        max_connections: net.max_connections,
        max_handshakes: net.max_handshakes,
        handshake_timeout: std::time::Duration::from_secs(net.handshake_timeout),
        write_timeout: std::time::Duration::from_secs(net.write_timeout),
        read_only: net.read_only,
        inflight_bytes: inflight,
        ..Default::default()
    })
}

pub fn serve(home: &Home, args: ServeArgs) -> Result<()> {
    let cfg = config(&args.net)?;
    let limits = Limits::parse(&args.memory)?;
    let names = if args.pools.is_empty() {
        let mut v: Vec<String> = home.load()?.pools.keys().cloned().collect();
        v.sort();
        if v.is_empty() {
            return Err(usage(
                "no pools to serve: create one (`zeta pool create`) or run `zeta up`",
            ));
        }
        v
    } else {
        args.pools.clone()
    };
    let mut pools = Vec::new();
    for n in &names {
        match home.open(n) {
            Ok(p) => pools.push(p.into_arc()),
            Err(e) => {
                close_all(&pools);
                return Err(e);
            }
        }
    }
    run(home, cfg, limits, pools, None)
}

/// Devices of the embedded default pool: six files, raidz2 (any two may be lost).
const UP_DISKS: usize = 6;
const UP_DISK_SIZE: &str = "256M";

/// The embedded default: the pool `zeta` (a raidz2 of six 256M sparse files in `dir`) and its
/// volume `vol0` (256M), created on first use, served on 127.0.0.1:10809.
pub fn up(home: &Home, args: UpArgs) -> Result<()> {
    let cfg = config(&args.net)?;
    let limits = Limits::parse(&args.memory)?;
    let disks: Vec<PathBuf> = (0..UP_DISKS)
        .map(|i| args.dir.join(format!("disk{i}")))
        .collect();
    let pool = if home.load()?.pools.contains_key(UP_POOL) {
        home.open(UP_POOL)?.into_arc()
    } else if disks[0].exists() {
        // The files exist but this state directory does not know them: import from those
        // present (a pool made by an older zeta may have fewer).
        let present: Vec<PathBuf> = disks.iter().filter(|d| d.exists()).cloned().collect();
        let devs = super::state::open_devices(&present, false)?;
        // The default pool belongs to its directory, whichever state directory last held
        // it: one still running holds the devices' locks, which `open_devices` respects.
        let opts = crate::dsl::PoolOptions {
            force: true,
            ..home.pool_options()
        };
        let p = Pool::import(devs, Some(UP_POOL), opts)?;
        super::state::warn_import_notes(&p);
        home.remember(&p, super::state::device_paths(&p))?;
        p
    } else {
        std::fs::create_dir_all(&args.dir).map_err(|e| CliError::Io {
            path: args.dir.display().to_string(),
            source: e,
        })?;
        let words: Vec<String> = std::iter::once("raidz2".to_string())
            .chain(disks.iter().map(|d| d.display().to_string()))
            .collect();
        let size = format!("size={UP_DISK_SIZE}");
        let p = create_pool(home, false, &[size], UP_POOL, &words)?;
        println!(
            "created pool '{UP_POOL}': raidz2 of {UP_DISKS} files of {UP_DISK_SIZE} in {}",
            args.dir.display()
        );
        p
    };
    if pool.dataset(UP_VOLUME).is_err() {
        if let Err(e) = pool.create_volume(UP_VOLUME, 256 << 20, 16384, None) {
            close_all(&[pool]);
            return Err(e.into());
        }
        println!("created volume '{UP_POOL}/{UP_VOLUME}' (256M, 16K blocks)");
    }
    run(
        home,
        cfg,
        limits,
        vec![pool],
        Some(format!("{UP_POOL}/{UP_VOLUME}")),
    )
}

fn close_all(pools: &[Arc<Pool>]) {
    for p in pools {
        if let Err(e) = p.close() {
            eprintln!("zeta: closing pool '{}': {e}", p.name);
        }
    }
}

fn run(
    home: &Home,
    cfg: ServerConfig,
    limits: Limits,
    pools: Vec<Arc<Pool>>,
    default: Option<String>,
) -> Result<()> {
    for p in &pools {
        limits.apply(p);
        super::room::warn(&p.name, &super::state::device_paths(p));
    }
    // The request buffers in flight are memory configured apart from the pools'.
    memory::govern(&pools, cfg.inflight_bytes);
    // A suspended pool or a failing device is told on stderr when it happens.
    super::watch::start(&pools);
    // Acknowledged writes from before a crash come back before any client connects.
    for p in &pools {
        if let Err(e) = crate::zvol::replay_logs(p) {
            close_all(&pools);
            return Err(e.into());
        }
        // The logs' headers go to disk: without that, each volume's first FLUSH or FUA write
        // synced a whole txg (`zeta pool iostat`: fallback_syncs, one per served volume). A
        // pool that cannot commit is still served, for what can be read from it.
        if let Err(e) = p.ready_logs() {
            eprintln!("zeta serve: {e}");
        }
    }
    // Register for the signals before serving, so an early SIGTERM is not lost. SIGHUP (the
    // terminal that ran `zeta up` closed) stops as cleanly: its default would end the
    // process with the open txg unsynced and the pool left for a replay.
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP]).map_err(|e| CliError::Io {
        path: "signal handler".into(),
        source: e,
    })?;
    let exports = Arc::new(PoolExports::new(pools.clone(), default.clone()));
    let server = match Server::start(cfg.clone(), exports.clone()) {
        Ok(s) => s,
        Err(e) => {
            close_all(&pools);
            return Err(usage(format!("cannot listen on {}: {e}", cfg.listen)));
        }
    };
    // Admin commands of other processes reach the pools through their control sockets.
    let control = super::control::ControlServer::start(home, &pools);
    let addr = server.local_addr();
    let host = if addr.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        addr.ip().to_string()
    };
    let scheme = if cfg.tls.is_some() { "nbds" } else { "nbd" };
    let base = if addr.port() == crate::nbd::DEFAULT_PORT {
        format!("{scheme}://{host}")
    } else {
        format!("{scheme}://{host}:{}", addr.port())
    };
    println!(
        "serving on {addr}{}: (max {} connections; per pool: cache {}, dirty limit {})",
        if cfg.read_only { ", read-only" } else { "" },
        cfg.max_connections,
        human(limits.cache),
        human(limits.dirty_max)
    );
    let read_only = |export: &str| {
        let pool = export.split('/').next().unwrap_or("");
        pools.iter().any(|p| p.name == pool && p.is_read_only())
    };
    if let Some(t) = &cfg.tls {
        let how = match t.mode {
            TlsMode::Require => "required",
            _ => "offered",
        };
        println!("TLS {how}: {}", t.what);
    }
    for e in exports.list() {
        let ro = if read_only(&e.name) {
            ", read-only"
        } else {
            ""
        };
        println!("  {base}/{}  ({}{ro})", e.name, human(e.size));
    }
    if let Some(d) = &default {
        println!("\ntry:\n  nbdinfo {base}/{d}\n  qemu-io -f raw -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M' {base}/{d}\n  qemu-img convert -n -O raw disk.img {base}/{d}\n  fio --ioengine=nbd --uri={base}/{d} --name=t --rw=randrw --bs=4k --size=64M\n");
    }
    println!("stop with Ctrl-C (or SIGTERM)");
    // Block until a signal arrives.
    let sig = signals.forever().next();
    // Written, not printed: stdout may be gone by now (a closed terminal or pipe), and a
    // panic here would skip the drain and the pools' final sync.
    let _ = writeln!(
        std::io::stdout(),
        "zeta serve: {} received, finishing in-flight requests",
        match sig {
            Some(SIGINT) => "SIGINT",
            Some(SIGHUP) => "SIGHUP",
            _ => "SIGTERM",
        }
    );
    control.shutdown();
    // In-flight requests end before the pools close; one waiting on a txg that waits for
    // room (a writer short of pool space) would never end.
    for p in &pools {
        p.stop_waiting_for_room();
    }
    server.shutdown();
    let mut failed = Vec::new();
    for p in &pools {
        if let Err(e) = p.close() {
            eprintln!("zeta: closing pool '{}': {e}", p.name);
            failed.push(p.name.clone());
        }
    }
    if failed.is_empty() {
        let _ = writeln!(std::io::stdout(), "zeta serve: pools synced and closed");
        return Ok(());
    }
    // Each failure was told above; the exit status and this line sum them up.
    Err(usage(format!(
        "could not sync and close {}: the next import replays from their intent logs every \
         write that was acknowledged durable",
        failed
            .iter()
            .map(|n| format!("'{n}'"))
            .collect::<Vec<_>>()
            .join(", ")
    )))
}
