//! Who gets in: serving slots, which only a finished handshake takes, and handshakes in
//! progress, which are capped apart from them, each under one deadline for all of its
//! option haggling.
//!
//! A socket that connects and says nothing costs a thread until its handshake ends. So
//! handshakes in progress are few (`ServerConfig::max_handshakes`); when one more arrives,
//! the oldest gives way. An attacker who keeps opening idle sockets then only ever holds
//! handshake places, never a slot, and a real client's handshake (milliseconds) is over long
//! before enough newer sockets arrive to push it out.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The connections past NBD_OPT_GO / NBD_OPT_EXPORT_NAME, up to a limit.
pub struct Slots {
    limit: usize,
    taken: AtomicUsize,
}

/// One serving slot, given back on drop.
pub struct Slot {
    slots: Arc<Slots>,
}

impl Slots {
    pub fn new(limit: usize) -> Arc<Slots> {
        assert!(limit > 0, "a server that serves no connection");
        Arc::new(Slots {
            limit,
            taken: AtomicUsize::new(0),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A slot, or None if all `limit` are taken.
    pub fn try_take(self: &Arc<Self>) -> Option<Slot> {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()?;
        Some(Slot {
            slots: self.clone(),
        })
    }

    /// Slots taken now.
    #[cfg(test)]
    pub fn taken(&self) -> usize {
        self.taken.load(Ordering::Acquire)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let before = self.slots.taken.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "a slot given back twice");
    }
}

/// Handshakes in progress, oldest first (ids grow with each accepted connection), each with a
/// second handle on its socket to end it from outside.
pub struct Handshakes {
    cap: usize,
    open: Mutex<BTreeMap<u64, TcpStream>>,
}

impl Handshakes {
    pub fn new(cap: usize) -> Handshakes {
        Handshakes {
            cap: cap.max(1),
            open: Mutex::new(BTreeMap::new()),
        }
    }

    /// Registers handshake `id`; at the cap, the oldest one is ended to make room (its
    /// socket shut, so its thread sees the end at once and leaves).
    pub fn begin(&self, id: u64, handle: TcpStream) {
        let evicted = {
            let mut open = self.open.lock();
            let evicted = if open.len() >= self.cap {
                open.pop_first()
            } else {
                None
            };
            open.insert(id, handle);
            assert!(open.len() <= self.cap);
            evicted
        };
        if let Some((_, s)) = evicted {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Handshake `id` is over (it became a connection, or ended); a no-op if it was evicted.
    pub fn end(&self, id: u64) {
        self.open.lock().remove(&id);
    }

    /// Ends every handshake in progress (the server is stopping).
    pub fn end_all(&self) {
        for s in std::mem::take(&mut *self.open.lock()).into_values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    #[cfg(test)]
    pub fn in_progress(&self) -> usize {
        self.open.lock().len()
    }
}

/// A socket whose reads and writes all end by one deadline: each sets the socket's timeout
/// to the time left. (A timeout per read alone lets a client that sends a byte now and then
/// keep its handshake for ever.)
#[derive(Debug)]
pub struct Deadline {
    stream: TcpStream,
    /// None once the handshake is over (`lift`).
    until: Option<Instant>,
}

impl Deadline {
    pub fn new(stream: TcpStream, timeout: Duration) -> Deadline {
        Deadline {
            stream,
            until: Some(Instant::now() + timeout),
        }
    }

    /// The handshake is over: no deadline from now on, and the socket's timeouts cleared.
    /// (A TLS session keeps its socket wrapped in this type for its whole life.)
    pub fn lift(&mut self) -> io::Result<()> {
        self.until = None;
        self.stream.set_read_timeout(None)?;
        self.stream.set_write_timeout(None)
    }

    pub fn socket(&self) -> &TcpStream {
        &self.stream
    }

    /// The socket, its timeouts cleared (clients may then stay idle as long as they like).
    pub fn into_inner(self) -> io::Result<TcpStream> {
        self.stream.set_read_timeout(None)?;
        self.stream.set_write_timeout(None)?;
        Ok(self.stream)
    }

    /// The time left, or None without a deadline.
    fn left(&self) -> io::Result<Option<Duration>> {
        let Some(until) = self.until else {
            return Ok(None);
        };
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "handshake took too long",
            ));
        }
        Ok(Some(left))
    }
}

impl Read for Deadline {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(left) = self.left()? {
            self.stream.set_read_timeout(Some(left))?;
        }
        self.stream.read(buf)
    }
}

impl Write for Deadline {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(left) = self.left()? {
            self.stream.set_write_timeout(Some(left))?;
        }
        self.stream.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(l: &TcpListener) -> (TcpStream, TcpStream) {
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn slots_stop_at_the_limit_and_come_back() {
        let slots = Slots::new(2);
        let a = slots.try_take().unwrap();
        let _b = slots.try_take().unwrap();
        assert!(slots.try_take().is_none());
        drop(a);
        assert_eq!(slots.taken(), 1);
        assert!(slots.try_take().is_some());
    }

    #[test]
    fn the_oldest_handshake_gives_way_at_the_cap() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let h = Handshakes::new(2);
        let mut clients = Vec::new();
        for id in 1..=3 {
            let (client, server) = pair(&l);
            h.begin(id, server);
            clients.push(client);
        }
        assert_eq!(h.in_progress(), 2);
        // The first one's socket was shut: its client sees the end.
        let mut b = [0u8; 1];
        clients[0]
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(clients[0].read(&mut b).unwrap(), 0);
        h.end(1); // evicted already: nothing happens
        h.end(2);
        assert_eq!(h.in_progress(), 1);
    }

    #[test]
    fn a_deadline_covers_all_of_a_trickle() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut client, server) = pair(&l);
        let mut d = Deadline::new(server, Duration::from_millis(300));
        let t = Instant::now();
        // A byte every 100 ms: each read alone is quick, the whole is not.
        let trickle = std::thread::spawn(move || {
            for _ in 0..20 {
                if client.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let mut buf = [0u8; 20];
        let r = d.read_exact(&mut buf);
        assert!(r.is_err(), "the trickle outlived the deadline");
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        drop(d);
        trickle.join().unwrap();
    }
}
