//! The listener: accepts connections up to a limit, negotiates each on its own thread, and
//! runs requests on a shared worker pool. `shutdown` stops accepting, lets every started
//! request reply, and returns once all connections are closed.

use super::workers::Workers;
use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use super::budget::Budget;
use super::handshake::{negotiate, Outcome, Policy};
use super::{conn, Exports};

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Connections served at once; more are answered with an NBD policy error and closed.
    pub max_connections: usize,
    pub read_only: bool,
    /// Threads running requests (they block on I/O and on the pool's write throttle).
    pub workers: usize,
    /// Bytes of request payloads and read buffers in flight, server-wide.
    pub inflight_bytes: u64,
    /// How long a client may take over option haggling before it is dropped.
    pub handshake_timeout: Duration,
}

pub const DEFAULT_PORT: u16 = 10809;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)),
            max_connections: 64,
            read_only: false,
            workers: 16,
            inflight_bytes: 64 << 20,
            handshake_timeout: Duration::from_secs(30),
        }
    }
}

/// Refusals answered at once; beyond this, surplus connections are simply closed.
const MAX_REFUSING: usize = 8;

struct Inner {
    cfg: ServerConfig,
    exports: Arc<dyn Exports>,
    budget: Arc<Budget>,
    workers: Workers,
    stop: AtomicBool,
    active: AtomicUsize,
    refusing: AtomicUsize,
    /// A second handle on every open connection, to shut it down from outside.
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
            cfg,
            exports,
            workers,
            stop: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            refusing: AtomicUsize::new(0),
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
        if inner.active.load(Ordering::Acquire) >= inner.cfg.max_connections {
            refuse(stream, &inner);
            continue;
        }
        let Ok(handle) = stream.try_clone() else {
            continue;
        };
        next_id += 1;
        let id = next_id;
        inner.active.fetch_add(1, Ordering::AcqRel);
        inner.conns.lock().insert(id, handle);
        let inner2 = inner.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                run_connection(stream, &inner2);
                inner2.conns.lock().remove(&id);
                inner2.active.fetch_sub(1, Ordering::AcqRel);
            });
        match spawned {
            Ok(t) => inner.threads.lock().push(t),
            Err(_) => {
                inner.conns.lock().remove(&id);
                inner.active.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

fn run_connection(mut stream: TcpStream, inner: &Inner) {
    let _ = stream.set_read_timeout(Some(inner.cfg.handshake_timeout));
    let policy = Policy {
        read_only: inner.cfg.read_only,
        refuse: None,
    };
    let session = match negotiate(&mut stream, inner.exports.as_ref(), &policy) {
        Ok(Outcome::Transmit(s)) => s,
        Ok(Outcome::Closed) | Err(_) => return,
    };
    // Clients may sit idle between requests for as long as they like.
    let _ = stream.set_read_timeout(None);
    conn::serve(stream, session, &inner.budget, &inner.workers);
}

/// Over the connection limit: negotiate only far enough to tell the client why, on a
/// short-lived thread, or just close when many refusals are already in progress.
fn refuse(mut stream: TcpStream, inner: &Arc<Inner>) {
    if inner.refusing.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSING {
        inner.refusing.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    let outer = inner.clone();
    let inner = inner.clone();
    let msg = format!(
        "server is at its limit of {} connections; try again later",
        inner.cfg.max_connections
    );
    let spawned = std::thread::Builder::new()
        .name("nbd-refuse".into())
        .spawn(move || {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let policy = Policy {
                read_only: true,
                refuse: Some(&msg),
            };
            let _ = negotiate(&mut stream, inner.exports.as_ref(), &policy);
            inner.refusing.fetch_sub(1, Ordering::AcqRel);
        });
    if spawned.is_err() {
        // The thread never ran (its closure, and the stream, were dropped: the client sees a
        // close), so give its slot back here.
        outer.refusing.fetch_sub(1, Ordering::AcqRel);
    }
}
