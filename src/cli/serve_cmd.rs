//! `zeta serve` and `zeta up`: serve volumes over NBD until SIGINT, SIGTERM or SIGHUP.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use super::args::{NetArgs, ServeArgs, TlsArg, UpArgs};
use super::pool_cmd::create_pool;
use super::{usage, CliError, Result};
use crate::dsl::Pool;
use crate::nbd::tls::{Tls, TlsMode};
use crate::nbd::ServerConfig;
use zeta_server::fmt::{human, parse_size};
use zeta_server::memory::Limits;
use zeta_server::serve::{close_all, run};
use zeta_server::state::Home;

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
    run(home, cfg, limits, pools, None, answer())
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
        let devs = zeta_server::state::open_devices(&present, false)?;
        // The default pool belongs to its directory, whichever state directory last held
        // it: one still running holds the devices' locks, which `open_devices` respects.
        let opts = crate::dsl::PoolOptions {
            force: true,
            ..home.pool_options()
        };
        let p = Pool::import(devs, Some(UP_POOL), opts)?;
        zeta_server::state::warn_import_notes(&p);
        home.remember(&p, zeta_server::state::device_paths(&p))?;
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
        // Reserved, as `vol create` makes it: the pool keeps room to write it whole.
        if let Err(e) = pool.create_volume_with(UP_VOLUME, 256 << 20, 16384, None, true) {
            close_all(&[pool]);
            return Err(e.into());
        }
        println!("created volume '{UP_POOL}/{UP_VOLUME}' (256M, 16K blocks, reserved)");
    }
    run(
        home,
        cfg,
        limits,
        vec![pool],
        Some(format!("{UP_POOL}/{UP_VOLUME}")),
        answer(),
    )
}

/// The control socket's answers: this command line's operations.
fn answer() -> zeta_server::control::Answer {
    Arc::new(super::control_ops::answer)
}
