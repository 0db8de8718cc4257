//! A connection's replies on their way to its socket, and the buffers reads are answered from.
//!
//! Any thread may reply (the workers, the connection's reader, a log committer answering a
//! flush), and one at a time sends on the socket. None waits for it: a thread that finds
//! another sending leaves its reply queued for that one, which looks at the queue again
//! before it stops, and every send is non-blocking. What a full socket does not take stays
//! queued, in order, for the connection's flusher thread, which waits for room (at most the
//! write timeout: a client that reads nothing for that long is dropped) and sends it. A short
//! reply is copied into the queue; a long read's reply is handed over whole, with its buffer.
//! Each reply keeps what its request holds (`Held`: budget and quota) until its last byte is
//! written, so a client that stops reading holds no more of the server than its quota.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::budget::Held;

/// Replies up to this long are copied into the queue and sent together with others;
/// longer ones are handed over whole (`Replies::send_long`).
pub const QUEUED_REPLY_BYTES: usize = 64 << 10;

/// The longest header a read's reply has: a structured chunk's (20 bytes) and the offset.
const MAX_HEAD_BYTES: usize = 28;

/// Slices one `sendmsg` takes at most (Linux's `UIO_MAXIOV`).
const MAX_SLICES: usize = 1024;

pub struct Replies {
    /// The connection's socket (a second descriptor of it), written only with
    /// `MSG_DONTWAIT`.
    socket: OwnedFd,
    state: Mutex<State>,
    /// Wakes the flusher (the socket filled, or the connection closes) and `close`.
    changed: Condvar,
    write_timeout: Duration,
    flusher: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct State {
    parts: VecDeque<Part>,
    /// Bytes of `parts[0]` already written.
    front_sent: usize,
    /// A thread is sending; others leave their replies queued for it.
    sending: bool,
    /// The socket was full: only the flusher sends until the queue is empty.
    stalled: bool,
    /// The client is gone (a failed send, or no room for the write timeout): replies are
    /// dropped, and what they hold given back.
    dead: bool,
    closing: bool,
}

/// Replies queued: their bytes, and what their requests hold until the bytes are written.
struct Part {
    body: Body,
    held: Vec<Held>,
}

enum Body {
    /// Short replies, copied one after another.
    Copied(Vec<u8>),
    /// A long read's reply: its header and `len` bytes of `data`, a buffer from
    /// `take_read_buffer`, handed over rather than copied.
    Read {
        head: [u8; MAX_HEAD_BYTES],
        head_len: usize,
        data: Vec<u8>,
        len: usize,
    },
}

impl Body {
    fn slices(&self) -> [&[u8]; 2] {
        match self {
            Body::Copied(v) => [v, &[]],
            Body::Read {
                head,
                head_len,
                data,
                len,
            } => [&head[..*head_len], &data[..*len]],
        }
    }

    fn len(&self) -> usize {
        self.slices().iter().map(|s| s.len()).sum()
    }
}

/// How a round of sending ended.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Flow {
    /// Everything taken was written.
    Done,
    /// The socket is full.
    Full,
    /// The send failed: the client is gone.
    Failed,
}

impl Replies {
    /// Replies on `socket`, with a flusher thread for when it fills up.
    pub fn start(socket: OwnedFd, write_timeout: Duration) -> io::Result<Arc<Replies>> {
        let replies = Arc::new(Replies {
            socket,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            write_timeout,
            flusher: Mutex::new(None),
        });
        let r = replies.clone();
        let t = std::thread::Builder::new()
            .name("nbd-flush".into())
            .spawn(move || r.flush_loop())?;
        *replies.flusher.lock() = Some(t);
        Ok(replies)
    }

    /// Appends a short reply (its parts, in order) to the queue; `drain` or the next send
    /// writes it.
    pub fn queue(&self, bufs: &[&[u8]], held: Held) {
        let mut st = self.state.lock();
        if st.dead {
            return; // dropped, `held` with it, once the lock is let go
        }
        // Coalesce into the last part unless it is a read's buffer.
        if let Some(Part {
            body: Body::Copied(v),
            held: hs,
        }) = st.parts.back_mut()
        {
            bufs.iter().for_each(|b| v.extend_from_slice(b));
            hs.push(held);
            return;
        }
        let len = bufs.iter().map(|b| b.len()).sum();
        let mut v = Vec::with_capacity(len);
        bufs.iter().for_each(|b| v.extend_from_slice(b));
        st.parts.push_back(Part {
            body: Body::Copied(v),
            held: vec![held],
        });
    }

    /// Sends `bufs` as one reply, with everything queued, as far as the socket takes it.
    pub fn write_now(&self, bufs: &[&[u8]], held: Held) {
        self.queue(bufs, held);
        self.drain();
    }

    /// Replies to a read with `head` and `len` bytes of `data`, a buffer from
    /// `take_read_buffer`, handed over whole: written from the buffer by this thread if no
    /// other is sending, else by that one, and this one goes on. (Waiting for the socket,
    /// workers that had read 128K each queued on its lock, spinning, yielding and sleeping in
    /// turn: more than two task switches per read, and a sixth of the machine idle under
    /// fio's sequential 128K reads.)
    pub fn send_long(&self, head: &[u8], data: Vec<u8>, len: usize, held: Held) {
        assert!(head.len() <= MAX_HEAD_BYTES && len <= data.len());
        let mut h = [0u8; MAX_HEAD_BYTES];
        h[..head.len()].copy_from_slice(head);
        let part = Part {
            body: Body::Read {
                head: h,
                head_len: head.len(),
                data,
                len,
            },
            held: vec![held],
        };
        {
            let mut st = self.state.lock();
            if st.dead {
                drop(st);
                give_back(part);
                return;
            }
            st.parts.push_back(part);
        }
        self.drain();
    }

    /// Sends what is queued unless another thread is sending (it looks at the queue again
    /// before it stops) or the socket is full (the flusher sends once it has room).
    pub fn drain(&self) {
        self.pump(false);
    }

    /// Bytes queued and not yet written.
    #[cfg(test)]
    fn queued_bytes(&self) -> usize {
        let st = self.state.lock();
        st.parts.iter().map(|p| p.body.len()).sum::<usize>() - st.front_sent
    }

    /// Writes what is still queued (every reply is queued or written by now; a full socket
    /// is waited for up to the write timeout), shuts the socket and ends the flusher.
    pub fn close(&self) {
        self.drain();
        {
            let mut st = self.state.lock();
            st.closing = true;
            self.changed.notify_all();
            while !st.dead && (st.sending || !st.parts.is_empty()) {
                self.changed.wait(&mut st);
            }
        }
        self.shutdown();
        if let Some(t) = self.flusher.lock().take() {
            let _ = t.join();
        }
    }

    fn shutdown(&self) {
        // SAFETY: `socket` is a descriptor this value owns, open until it is dropped;
        // shutdown(2) touches no memory.
        unsafe {
            libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR);
        }
    }

    /// Sends until the queue is empty, the socket is full, or another thread sends. Only
    /// the flusher sends while the socket is stalled.
    fn pump(&self, flusher: bool) -> Flow {
        loop {
            let (batch, front_sent) = {
                let mut st = self.state.lock();
                if st.sending || (st.stalled && !flusher) || st.dead {
                    return Flow::Done;
                }
                if st.parts.is_empty() {
                    st.stalled = false;
                    return Flow::Done;
                }
                st.sending = true;
                (
                    std::mem::take(&mut st.parts),
                    std::mem::take(&mut st.front_sent),
                )
            };
            let (written, flow) = send_nowait(self.socket.as_raw_fd(), &batch, front_sent);
            let done = self.settle(batch, front_sent + written, flow);
            if flow == Flow::Failed {
                self.shutdown(); // the reader stops too
            }
            // Buffers and grants go back outside the lock.
            done.into_iter().for_each(give_back);
            if flow != Flow::Done {
                return flow;
            }
        }
    }

    /// After a send of `batch` that wrote its first `sent` bytes: what is unwritten goes back
    /// to the front of the queue; returns the parts written whole (or every part, if the
    /// client is gone).
    fn settle(&self, mut batch: VecDeque<Part>, mut sent: usize, flow: Flow) -> Vec<Part> {
        let mut done = Vec::new();
        while let Some(p) = batch.front() {
            let len = p.body.len();
            if sent < len {
                break;
            }
            sent -= len;
            done.push(batch.pop_front().unwrap());
        }
        assert!(batch.is_empty() == (flow == Flow::Done) || flow == Flow::Failed);
        let mut st = self.state.lock();
        st.sending = false;
        while let Some(p) = batch.pop_back() {
            st.parts.push_front(p);
        }
        st.front_sent = sent;
        match flow {
            Flow::Done => {}
            Flow::Full => st.stalled = true,
            Flow::Failed => {
                st.dead = true;
                done.extend(st.parts.drain(..));
                st.front_sent = 0;
            }
        }
        self.changed.notify_all();
        done
    }

    /// The flusher: whenever the socket is full, waits for room (at most the write timeout)
    /// and sends what is queued; ends when the connection closes or the client is gone.
    fn flush_loop(&self) {
        loop {
            {
                let mut st = self.state.lock();
                loop {
                    if st.dead || (st.closing && st.parts.is_empty() && !st.sending) {
                        return;
                    }
                    if st.stalled && !st.sending {
                        break;
                    }
                    self.changed.wait(&mut st);
                }
            }
            if !wait_writable(self.socket.as_raw_fd(), self.write_timeout) {
                self.give_up();
                return;
            }
            if self.pump(true) == Flow::Failed {
                return;
            }
        }
    }

    /// No room for the write timeout: the client is dropped, and every queued reply with
    /// it. Shutting the socket also ends the connection's reader.
    fn give_up(&self) {
        let parts: Vec<Part> = {
            let mut st = self.state.lock();
            st.dead = true;
            st.front_sent = 0;
            self.changed.notify_all();
            st.parts.drain(..).collect()
        };
        self.shutdown();
        parts.into_iter().for_each(give_back);
    }
}

/// A written (or dropped) part's buffer goes back to the read buffers, its grants to their
/// budgets.
fn give_back(p: Part) {
    if let Body::Read { data, .. } = p.body {
        give_back_read_buffer(data);
    }
}

/// Writes the parts, past the first `skip` bytes, with non-blocking `sendmsg` calls until
/// all are written, the socket is full, or a send fails; returns the bytes written.
fn send_nowait(fd: i32, parts: &VecDeque<Part>, skip: usize) -> (usize, Flow) {
    let total: usize = parts.iter().map(|p| p.body.len()).sum::<usize>() - skip;
    let mut written = 0;
    while written < total {
        let mut past = skip + written;
        let mut slices: Vec<IoSlice> = Vec::with_capacity((2 * parts.len()).min(MAX_SLICES));
        'fill: for p in parts {
            for s in p.body.slices() {
                if past >= s.len() {
                    past -= s.len();
                    continue;
                }
                slices.push(IoSlice::new(&s[past..]));
                past = 0;
                if slices.len() == MAX_SLICES {
                    break 'fill;
                }
            }
        }
        // SAFETY: msghdr is plain data; all-zero is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // `IoSlice` is ABI-compatible with `iovec` (std guarantees it on Unix).
        msg.msg_iov = slices.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = slices.len();
        // SAFETY: `msg` points at `slices`, which borrow buffers that stay alive and
        // unchanged across the call; the kernel only reads them.
        let rc = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return (written, Flow::Full),
                _ => return (written, Flow::Failed),
            }
        }
        if rc == 0 {
            return (written, Flow::Failed);
        }
        written += rc as usize;
    }
    (written, Flow::Done)
}

/// Waits until `fd` has room to write, at most `timeout`; false if it has none by then or
/// the connection failed.
fn wait_writable(fd: i32, timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `p` is one valid pollfd that lives across the call.
        let rc = unsafe { libc::poll(&mut p, 1, ms) };
        if rc < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        if rc > 0 {
            return p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) == 0;
        }
    }
}

/// Reads up to this long reuse a buffer (a thread's own, or a spare); longer ones allocate
/// their own.
const REUSED_READ_BYTES: usize = 256 << 10;

thread_local! {
    /// A worker's (or a connection reader's) read buffer: allocating and zeroing a fresh
    /// one per read cost as much as copying the data into it.
    static READ_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Read buffers given back by threads that already have their own, for threads whose own
/// went with a reply handed over (`Replies::send_long`): at most this many (4 MiB), which
/// with the workers' own keeps the buffers the server holds idle within 32 of 256 KiB.
const SPARE_READ_BUFFERS: usize = 16;

static SPARES: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// Runs `f` on a buffer of `len` bytes (contents unspecified: the volume read overwrites
/// every byte).
pub fn with_read_buffer<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let mut buf = take_read_buffer(len);
    let r = f(&mut buf[..len]);
    give_back_read_buffer(buf);
    r
}

/// A buffer of at least `len` bytes (contents unspecified): this thread's, else a spare,
/// else a new one. Give it back with `give_back_read_buffer` (or with the reply it holds).
pub fn take_read_buffer(len: usize) -> Vec<u8> {
    if len > REUSED_READ_BYTES {
        return vec![0u8; len];
    }
    let mine = READ_BUFFER.with(|b| std::mem::take(&mut *b.borrow_mut()));
    if mine.len() == REUSED_READ_BYTES {
        return mine;
    }
    SPARES
        .lock()
        .pop()
        .unwrap_or_else(|| vec![0u8; REUSED_READ_BYTES])
}

/// Keeps a buffer from `take_read_buffer` for the next read: as this thread's if it has
/// none, else as a spare, or frees it.
pub fn give_back_read_buffer(buf: Vec<u8>) {
    if buf.len() != REUSED_READ_BYTES {
        return;
    }
    let spare = READ_BUFFER.with(|b| {
        let mut b = b.borrow_mut();
        if b.is_empty() {
            *b = buf;
            None
        } else {
            Some(buf)
        }
    });
    if let Some(buf) = spare {
        let mut spares = SPARES.lock();
        if spares.len() < SPARE_READ_BUFFERS {
            spares.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{Budget, Held, Quota};
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn held(b: &Arc<Budget>, bytes: u64) -> Held {
        Held {
            data: b.acquire(bytes),
            _reply: Quota::new(1).acquire_or_else(0, || {}),
        }
    }

    #[test]
    fn a_long_reply_is_handed_to_the_thread_sending() {
        let (ours, mut client) = pair();
        let replies = Replies::start(ours.into(), Duration::from_secs(10)).unwrap();
        let budget = Budget::new(1 << 20);
        // Another thread is sending: replies stay queued for it.
        replies.state.lock().sending = true;
        let mut data = take_read_buffer(128 << 10);
        data[..128 << 10].fill(0xab);
        replies.queue(&[b"short"], held(&budget, 5));
        replies.send_long(b"head", data, 128 << 10, held(&budget, 128 << 10));
        assert_eq!(
            budget.available(),
            (1 << 20) - 5 - (128 << 10),
            "a queued reply holds its request's budget"
        );
        // The sender looks at the queue again: both go out whole, in order.
        replies.state.lock().sending = false;
        replies.drain();
        let mut got = vec![0u8; 5 + 4 + (128 << 10)];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got[..9], b"shorthead");
        assert!(got[9..].iter().all(|&b| b == 0xab));
        assert_eq!(
            budget.available(),
            1 << 20,
            "a reply sent gives its budget back"
        );
        replies.close();
    }

    #[test]
    fn a_client_that_stops_reading_keeps_its_replies_queued_and_is_dropped_in_time() {
        let (ours, mut client) = pair();
        let replies = Replies::start(ours.into(), Duration::from_millis(300)).unwrap();
        let budget = Budget::new(64 << 20);
        // Far more than the socket buffers hold: the rest stays queued, with its budget,
        // and no call waits for the client.
        let t = Instant::now();
        for _ in 0..256 {
            let data = take_read_buffer(128 << 10);
            replies.send_long(b"h", data, 128 << 10, held(&budget, 128 << 10));
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "a send waited for the client"
        );
        let queued = replies.queued_bytes();
        assert!(queued > 8 << 20, "only {queued} bytes queued");
        assert!(budget.available() < (64 << 20) - queued as u64);
        // Past the write timeout the client is dropped and everything given back.
        let t = Instant::now();
        while budget.available() < 64 << 20 {
            assert!(t.elapsed() < Duration::from_secs(10), "never dropped");
            std::thread::sleep(Duration::from_millis(20));
        }
        // What the client then reads ends: the socket was shut.
        let mut sink = Vec::new();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        if let Err(e) = client.read_to_end(&mut sink) {
            let waited = matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            );
            assert!(!waited, "the socket was left open");
        }
        assert!(sink.len() < 256 * (128 << 10), "everything was sent");
        replies.close();
    }
}
