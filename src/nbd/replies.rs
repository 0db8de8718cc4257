//! A connection's replies on their way to its socket, and the buffers reads are answered from.
//!
//! Any thread may reply (the workers, the connection's reader, a log committer answering a
//! flush), and one at a time may write to the socket. A thread that finds the socket taken
//! does not wait for it: it leaves its reply queued for the holder, which looks at the queue
//! again after letting the socket go. A short reply is copied into the queue; a long read's
//! reply is handed over whole, with its buffer and the budget its read holds.

use std::cell::RefCell;
use std::io::{self, IoSlice, Write};
use std::net::TcpStream;

use parking_lot::Mutex;

use super::budget::Grant;

/// Replies up to this long are copied into the queue and sent together with others;
/// longer ones are written from where they lie, or handed over (`Replies::send_long`).
pub const QUEUED_REPLY_BYTES: usize = 64 << 10;

/// The longest header a read's reply has: a structured chunk's (20 bytes) and the offset.
const MAX_HEAD_BYTES: usize = 28;

pub struct Replies {
    socket: Mutex<TcpStream>,
    /// Replies waiting for whoever holds `socket` to write them.
    queued: Mutex<Queued>,
}

#[derive(Default)]
struct Queued {
    short: Vec<u8>,
    long: Vec<LongReply>,
}

impl Queued {
    fn is_empty(&self) -> bool {
        self.short.is_empty() && self.long.is_empty()
    }
}

/// A long read's reply that found the socket taken: its header, its data (`len` bytes of a
/// buffer from `take_read_buffer`, handed over rather than copied), and the budget the read
/// holds until the reply is on the wire.
struct LongReply {
    head: [u8; MAX_HEAD_BYTES],
    head_len: usize,
    data: Vec<u8>,
    len: usize,
    _grant: Grant,
}

impl LongReply {
    fn parts(&self) -> [&[u8]; 2] {
        [&self.head[..self.head_len], &self.data[..self.len]]
    }
}

impl Replies {
    pub fn new(socket: TcpStream) -> Replies {
        Replies {
            socket: Mutex::new(socket),
            queued: Mutex::new(Queued::default()),
        }
    }

    /// Appends a short reply (its parts, in order) to the queue; `drain` or the next write
    /// sends it.
    pub fn queue(&self, bufs: &[&[u8]]) {
        let mut q = self.queued.lock();
        bufs.iter().for_each(|b| q.short.extend_from_slice(b));
    }

    /// Writes `bufs` as one reply, with everything queued, waiting for the socket if another
    /// thread holds it. A failed write means the client is gone, which the connection's
    /// reader sees too, so the error is dropped here.
    pub fn write_now(&self, bufs: &[&[u8]]) {
        let mut s = self.socket.lock();
        self.write_with_queued(&mut s, bufs);
        drop(s);
        self.drain();
    }

    /// Replies to a read with `head` and `len` bytes of `data`, a buffer from
    /// `take_read_buffer`: written from the buffer if the socket is free, else handed over
    /// with the read's `grant` to the thread writing, and this one goes on. (Waiting for the
    /// socket, workers that had read 128K each queued on its lock, spinning, yielding and
    /// sleeping in turn: more than two task switches per read, and a sixth of the machine
    /// idle under fio's sequential 128K reads.)
    pub fn send_long(&self, head: &[u8], data: Vec<u8>, len: usize, grant: Grant) {
        match self.socket.try_lock() {
            Some(mut s) => {
                self.write_with_queued(&mut s, &[head, &data[..len]]);
                drop(s);
                give_back_read_buffer(data);
                drop(grant);
            }
            None => {
                let mut reply = LongReply {
                    head: [0; MAX_HEAD_BYTES],
                    head_len: head.len(),
                    data,
                    len,
                    _grant: grant,
                };
                reply.head[..head.len()].copy_from_slice(head);
                self.queued.lock().long.push(reply);
            }
        }
        self.drain();
    }

    /// Writes queued replies until the queue is empty or another thread holds the socket.
    /// The queue is looked at again after the socket is let go: a reply queued while this
    /// thread held it found the socket taken and was left to this thread.
    pub fn drain(&self) {
        loop {
            let Some(mut s) = self.socket.try_lock() else {
                return; // the holder will look at the queue after us
            };
            self.write_with_queued(&mut s, &[]);
            drop(s);
            if self.queued.lock().is_empty() {
                return;
            }
        }
    }

    /// Writes what is still queued (every reply is queued or written by now) and shuts the
    /// socket.
    pub fn close(&self) {
        let mut s = self.socket.lock();
        self.write_with_queued(&mut s, &[]);
        let _ = s.shutdown(std::net::Shutdown::Both);
    }

    /// Writes everything queued and then `bufs`, in one system call, on `s` (the locked
    /// socket); hands the long replies' buffers back and their budget with them.
    fn write_with_queued(&self, s: &mut TcpStream, bufs: &[&[u8]]) {
        let queued = std::mem::take(&mut *self.queued.lock());
        let mut all: Vec<&[u8]> = Vec::with_capacity(1 + 2 * queued.long.len() + bufs.len());
        if !queued.short.is_empty() {
            all.push(&queued.short);
        }
        all.extend(queued.long.iter().flat_map(LongReply::parts));
        all.extend_from_slice(bufs);
        if !all.is_empty() {
            let _ = write_all_vectored(s, &all);
        }
        for reply in queued.long {
            give_back_read_buffer(reply.data);
        }
    }
}

fn write_all_vectored(s: &mut TcpStream, bufs: &[&[u8]]) -> io::Result<()> {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let mut done = 0usize;
    while done < total {
        // Rebuild the slice list past what has been written (short writes are rare).
        let mut skip = done;
        let mut slices = Vec::with_capacity(bufs.len());
        for b in bufs {
            if skip >= b.len() {
                skip -= b.len();
                continue;
            }
            slices.push(IoSlice::new(&b[skip..]));
            skip = 0;
        }
        match s.write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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
    use crate::nbd::budget::Budget;
    use std::io::Read;
    use std::net::TcpListener;
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn a_long_reply_is_handed_to_the_thread_holding_the_socket() {
        let (ours, mut client) = pair();
        let replies = Arc::new(Replies::new(ours));
        let budget = Budget::new(1 << 20);
        // Another thread is writing: it holds the socket.
        let held = replies.socket.lock();
        let (done_tx, done_rx) = mpsc::channel();
        let r = replies.clone();
        let b = budget.clone();
        let replier = std::thread::spawn(move || {
            let grant = b.acquire(128 << 10);
            let mut data = take_read_buffer(128 << 10);
            data[..128 << 10].fill(0xab);
            r.queue(&[b"short"]);
            r.send_long(b"head", data, 128 << 10, grant);
            done_tx.send(()).unwrap();
        });
        done_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the replier waited for the socket instead of handing its reply over");
        replier.join().unwrap();
        assert_eq!(
            budget.available(),
            (1 << 20) - (128 << 10),
            "a queued reply holds its read's budget"
        );
        // The holder lets go and looks at the queue: both replies go out whole, in order.
        drop(held);
        replies.drain();
        assert_eq!(
            budget.available(),
            1 << 20,
            "a reply sent gives its budget back"
        );
        let mut got = vec![0u8; 5 + 4 + (128 << 10)];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got[..9], b"shorthead");
        assert!(got[9..].iter().all(|&b| b == 0xab));
    }
}
