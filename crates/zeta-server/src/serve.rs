//! `zeta serve` and `zeta up` once their arguments are parsed: the pools on the network until
//! a signal, then a clean stop.

use std::io::Write;
use std::sync::Arc;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use zeta_core::dsl::Pool;
use zeta_nbd::tls::TlsMode;
use zeta_nbd::{Exports, PoolExports, Server, ServerConfig};

use crate::control::{Answer, ControlServer};
use crate::fmt::human;
use crate::memory::{self, Limits};
use crate::state::Home;
use crate::{usage, Error, Result};

/// Closes `pools`, telling each failure on stderr.
pub fn close_all(pools: &[Arc<Pool>]) {
    for p in pools {
        if let Err(e) = p.close() {
            eprintln!("zeta: closing pool '{}': {e}", p.name);
        }
    }
}

/// Serves `pools` over NBD (and on their control sockets, answered by `answer`) until a
/// signal, then drains the requests in flight, syncs and closes every pool. `default` is the
/// export `zeta up` suggests trying.
pub fn run(
    home: &Home,
    cfg: ServerConfig,
    limits: Limits,
    pools: Vec<Arc<Pool>>,
    default: Option<String>,
    answer: Answer,
) -> Result<()> {
    for p in &pools {
        limits.apply(p);
        crate::room::warn(&p.name, &crate::state::device_paths(p));
    }
    // The request buffers in flight are memory configured apart from the pools'.
    memory::govern(&pools, cfg.inflight_bytes);
    // A suspended pool or a failing device is told on stderr when it happens.
    crate::watch::start(&pools);
    // Acknowledged writes from before a crash come back before any client connects.
    for p in &pools {
        if let Err(e) = zeta_core::zvol::replay_logs(p) {
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
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP]).map_err(|e| Error::Io {
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
    let control = ControlServer::start(home, &pools, answer);
    let addr = server.local_addr();
    let host = if addr.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        addr.ip().to_string()
    };
    let scheme = if cfg.tls.is_some() { "nbds" } else { "nbd" };
    let base = if addr.port() == zeta_nbd::DEFAULT_PORT {
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
