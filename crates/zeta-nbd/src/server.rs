//! The listener: accepts connections up to a limit, negotiates each on its own thread, and
//! runs requests on a shared worker pool. `shutdown` stops accepting, lets every started
//! request reply, and returns once all connections are closed.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use super::admission::{Deadline, Handshakes, Slots};
use super::budget::Budget;
use super::conn::{self, ConnConfig};
use super::handshake::{negotiate, negotiate_after_tls, Outcome, Policy};
use super::tls::{self, Tls, TlsMode};
use super::workers::Workers;
use super::Exports;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Connections served at once (past NBD_OPT_GO or NBD_OPT_EXPORT_NAME); a GO beyond
    /// them is refused with an NBD policy error that says so.
    pub max_connections: usize,
    /// Handshakes in progress at once; one more ends the oldest. They hold no serving slot.
    pub max_handshakes: usize,
    pub read_only: bool,
    /// Threads running requests (they block on I/O and on the pool's write throttle).
    pub workers: usize,
    /// Bytes of request payloads and read buffers in flight, server-wide.
    pub inflight_bytes: u64,
    /// Bytes of replies one connection may owe before its reader waits.
    pub reply_quota_bytes: u64,
    /// How long a client may take over all of its option haggling before it is dropped.
    pub handshake_timeout: Duration,
    /// How long a client may leave its socket full (reading nothing) before it is dropped.
    pub write_timeout: Duration,
    /// TLS credentials and whether clients must use them; None: no TLS.
    pub tls: Option<Arc<Tls>>,
}

pub const DEFAULT_PORT: u16 = 10809;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)),
            max_connections: 64,
            max_handshakes: 32,
            read_only: false,
            workers: 16,
            inflight_bytes: 64 << 20,
            reply_quota_bytes: 8 << 20,
            handshake_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(60),
            tls: None,
        }
    }
}

struct Inner {
    cfg: ServerConfig,
    exports: Arc<dyn Exports>,
    budget: Arc<Budget>,
    workers: Workers,
    stop: AtomicBool,
    slots: Arc<Slots>,
    handshakes: Handshakes,
    /// A second handle on every connection past its handshake, to shut it down from outside.
    conns: Mutex<HashMap<u64, TcpStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

pub struct Server {
    addr: SocketAddr,
    inner: Arc<Inner>,
    acceptor: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start(cfg: ServerConfig, exports: Arc<dyn Exports>) -> io::Result<Server> {
        let listener = TcpListener::bind(cfg.listen)?;
        let addr = listener.local_addr()?;
        let workers = Workers::new(cfg.workers, super::conn::send_held)?;
        let inner = Arc::new(Inner {
            budget: Budget::new(cfg.inflight_bytes.max(super::proto::MAX_PAYLOAD as u64)),
            slots: Slots::new(cfg.max_connections.max(1)),
            handshakes: Handshakes::new(cfg.max_handshakes),
            cfg,
            exports,
            workers,
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("nbd-accept".into())
                .spawn(move || accept_loop(listener, inner))?
        };
        Ok(Server {
            addr,
            inner,
            acceptor: Some(acceptor),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, ends every connection once its started requests have replied, and
    /// waits for all of them.
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        self.inner.stop.store(true, Ordering::Release);
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        let _ = acceptor.join();
        self.inner.handshakes.end_all();
        for s in self.inner.conns.lock().values() {
            // Readers see end-of-file, stop taking requests, and drain what they started.
            let _ = s.shutdown(Shutdown::Read);
        }
        let threads = std::mem::take(&mut *self.inner.threads.lock());
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    let mut next_id = 0u64;
    for stream in listener.incoming() {
        if inner.stop.load(Ordering::Acquire) {
            break;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors or a connection reset before accept: pause, go on.
                eprintln!("zeta serve: accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        inner.threads.lock().retain(|t| !t.is_finished());
        let Ok(handle) = stream.try_clone() else {
            continue;
        };
        next_id += 1;
        let id = next_id;
        // At the cap the oldest handshake ends here, so handshake threads stay within it.
        inner.handshakes.begin(id, handle);
        let inner2 = inner.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || run_connection(stream, id, &inner2));
        match spawned {
            Ok(t) => inner.threads.lock().push(t),
            Err(_) => inner.handshakes.end(id),
        }
    }
}

/// One connection: its handshake (under the handshake deadline, holding no serving slot),
/// then, with a slot, its requests; over TLS if the client asked for it.
fn run_connection(stream: TcpStream, id: u64, inner: &Inner) {
    let Ok(handle) = stream.try_clone() else {
        inner.handshakes.end(id);
        return;
    };
    let mut hs = Deadline::new(stream, inner.cfg.handshake_timeout);
    let policy = Policy {
        read_only: inner.cfg.read_only,
        slots: &inner.slots,
        tls: inner.cfg.tls.as_ref().map_or(TlsMode::Off, |t| t.mode),
    };
    let outcome = negotiate(&mut hs, inner.exports.as_ref(), &policy);
    match (outcome, &inner.cfg.tls) {
        (Ok(Outcome::Transmit(session)), _) => {
            inner.handshakes.end(id);
            let Ok(stream) = hs.into_inner() else {
                return;
            };
            let Ok(send) = stream.try_clone() else {
                return;
            };
            serving(inner, id, handle, || {
                conn::serve(
                    stream,
                    send.into(),
                    session,
                    &inner.budget,
                    &inner.workers,
                    conn_config(&inner.cfg),
                )
            });
        }
        (Ok(Outcome::StartTls { no_zeroes }), Some(tls)) => {
            // The TLS handshake and the haggling after it share the deadline.
            let upgraded = tls.accept(hs).and_then(|mut s| {
                let o = negotiate_after_tls(&mut s, inner.exports.as_ref(), &policy, no_zeroes)?;
                Ok((s, o))
            });
            inner.handshakes.end(id);
            let Ok((mut s, Outcome::Transmit(session))) = upgraded else {
                return;
            };
            if s.get_mut().lift().is_err() {
                return;
            }
            let Ok((ours, theirs)) = std::os::unix::net::UnixStream::pair() else {
                return;
            };
            let Ok(send) = ours.try_clone() else {
                return;
            };
            let timeout = inner.cfg.write_timeout;
            let Ok(pump) = std::thread::Builder::new()
                .name(format!("nbd-tls-{id}"))
                .spawn(move || tls::pump(s, theirs, timeout))
            else {
                return;
            };
            serving(inner, id, handle, || {
                conn::serve(
                    ours,
                    send.into(),
                    session,
                    &inner.budget,
                    &inner.workers,
                    conn_config(&inner.cfg),
                )
            });
            let _ = pump.join();
        }
        _ => inner.handshakes.end(id),
    }
}

fn conn_config(cfg: &ServerConfig) -> ConnConfig {
    ConnConfig {
        reply_quota_bytes: cfg.reply_quota_bytes,
        write_timeout: cfg.write_timeout,
    }
}

/// Runs `serve` as connection `id`, whose TCP socket `handle` the server's stop shuts.
fn serving(inner: &Inner, id: u64, handle: TcpStream, serve: impl FnOnce()) {
    // Stopping began while this handshake finished: the stop's shutdown missed it.
    if inner.stop.load(Ordering::Acquire) {
        let _ = handle.shutdown(Shutdown::Read);
    }
    inner.conns.lock().insert(id, handle);
    serve();
    inner.conns.lock().remove(&id);
}
