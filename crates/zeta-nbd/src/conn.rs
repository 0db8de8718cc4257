//! The transmission phase of one connection: a reader thread frames requests and hands them
//! to the server's worker pool (or runs one itself when nothing else is in flight, and serves
//! short reads whose blocks it can have without waiting for a device); workers
//! run them against the volume and reply, in whatever order they finish, through the
//! connection's `Replies` (one thread writes to the socket at a time; the others leave
//! their replies to it).
//!
//! Memory is bounded by the server-wide in-flight budget: the reader takes budget for a
//! request's data before reading its payload (or before issuing a read), and a request gives
//! it back once its reply is on the wire. When the budget is spent the reader stops reading
//! the socket, which is TCP's backpressure on the client. Each connection also has a quota
//! of reply bytes not yet written (`ConnConfig::reply_quota_bytes`), taken the same way: a
//! client that sends reads and does not read their replies stops its own reader once its
//! quota is spent, and never holds the budget the other connections need.

use std::cell::{Cell, RefCell};
use std::io::{self, BufReader, Read};
use std::os::fd::OwnedFd;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::budget::{Budget, Held, Quota};
use super::handshake::Session;
use super::proto::*;
use super::replies::{
    give_back_read_buffer, take_read_buffer, with_read_buffer, Replies, QUEUED_REPLY_BYTES,
};
use super::workers::Workers;
use zeta_core::dsl::{panic_text, PoolError};
use zeta_core::zvol::{after_wakeups, Done, VolError, Volume};

/// The longest range one BLOCK_STATUS reply describes; clients ask again for the rest.
const MAX_STATUS_SPAN: u64 = 1 << 30;
/// The most extents one BLOCK_STATUS reply carries (the spec lets a reply cover less than
/// was asked), so that its size, which the reply's quota must cover, is bounded.
const MAX_STATUS_EXTENTS: usize = 1024;
/// The longest range one CACHE request prefetches; the rest is a hint we may ignore.
const MAX_CACHE_SPAN: u64 = 64 << 20;

/// What bounds one connection.
#[derive(Clone, Copy, Debug)]
pub struct ConnConfig {
    /// Bytes of replies a connection may owe (requests admitted whose replies are not yet
    /// written): past it, its reader waits.
    pub reply_quota_bytes: u64,
    /// How long a client may leave its socket full (reading nothing) before it is dropped.
    pub write_timeout: Duration,
}

/// The longest error message a reply carries.
const MAX_ERROR_MESSAGE_BYTES: usize = 200;

/// The quota a request takes for its reply: a read's data, else room for a header and a
/// message.
fn reply_cost(req: &Request) -> u64 {
    const SMALL_REPLY_BYTES: u64 = 256;
    match req.kind {
        CMD_READ => req.length as u64 + SMALL_REPLY_BYTES,
        // One descriptor list per context (`base:allocation`, `zeta:changed:`).
        CMD_BLOCK_STATUS => 2 * (8 * MAX_STATUS_EXTENTS as u64 + SMALL_REPLY_BYTES),
        _ => SMALL_REPLY_BYTES,
    }
}

pub struct Shared {
    pub session: Session,
    replies: Arc<Replies>,
    inflight: Mutex<usize>,
    drained: Condvar,
}

impl Shared {
    fn volume(&self) -> &Volume {
        &self.session.volume
    }

    fn finish_one(&self) {
        let mut n = self.inflight.lock();
        *n -= 1;
        if *n == 0 {
            self.drained.notify_all();
        }
    }

    fn wait_drained(&self) {
        let mut n = self.inflight.lock();
        while *n > 0 {
            self.drained.wait(&mut n);
        }
    }

    /// Sends bufs as one reply; a failed send means the client is gone, and the reader will
    /// see that too, so the error is dropped here.
    ///
    /// Replies are combined: a short one is appended to a queue, and whoever holds the socket
    /// writes everything queued in one system call. On loopback every send also runs the
    /// receiver's TCP processing, and under 32 requests in flight the workers queued up on
    /// the socket lock, one small send each. A worker that finds the socket taken leaves its
    /// reply to the holder, which looks at the queue again after letting the socket go.
    ///
    /// A reply also stays queued, for one write to carry it with others, while a commit
    /// answers its batch of requests (until the batch is answered: `zvol::after_wakeups`), and
    /// while a worker has more requests queued behind this one (until it runs out of them, or
    /// has run a few: `workers::more_queued`), and while the reader serving a read has more
    /// requests buffered (`read_here`).
    fn send(self: &Arc<Self>, bufs: &[&[u8]], held: Held) {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if len > QUEUED_REPLY_BYTES {
            self.replies.write_now(bufs, held);
        } else {
            self.replies.queue(bufs, held);
            if !hold(self) {
                self.replies.drain();
            }
        }
    }

    /// Replies to a read with `len` bytes of `data`, a buffer from `take_read_buffer`, which
    /// goes back to the buffers (and what the read holds to its budgets) once the reply is on
    /// the wire. A long reply is handed over whole (`Replies::send_long`).
    fn reply_read(self: &Arc<Self>, req: &Request, data: Vec<u8>, len: usize, held: Held) {
        let (head, head_len) = self.read_head(req, len);
        let head = &head[..head_len];
        if len > QUEUED_REPLY_BYTES {
            self.replies.send_long(head, data, len, held);
        } else {
            self.send(&[head, &data[..len]], held);
            give_back_read_buffer(data);
        }
    }

    /// One structured reply chunk flagged DONE.
    fn send_chunk(self: &Arc<Self>, req: &Request, kind: u16, parts: &[&[u8]], held: Held) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let h = chunk_header(req.cookie, REPLY_FLAG_DONE, kind, len as u32);
        let mut bufs: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        bufs.push(&h);
        bufs.extend_from_slice(parts);
        self.send(&bufs, held);
    }

    fn reply_ok(self: &Arc<Self>, req: &Request, held: Held) {
        self.send(&[&simple_reply_header(req.cookie, 0)], held);
    }

    fn reply_err(self: &Arc<Self>, req: &Request, error: u32, msg: &str, held: Held) {
        if self.session.structured {
            // Cut to what the reply's quota covers (`reply_cost`): an export's name in it may
            // be 4K long.
            let mut cut = msg.len().min(MAX_ERROR_MESSAGE_BYTES);
            while !msg.is_char_boundary(cut) {
                cut -= 1;
            }
            let msg = &msg.as_bytes()[..cut];
            let mut p = Vec::with_capacity(6 + msg.len());
            p.extend_from_slice(&error.to_be_bytes());
            p.extend_from_slice(&(msg.len() as u16).to_be_bytes());
            p.extend_from_slice(msg);
            self.send_chunk(req, REPLY_TYPE_ERROR, &[&p], held);
        } else {
            self.send(&[&simple_reply_header(req.cookie, error)], held);
        }
    }

    fn reply_data(self: &Arc<Self>, req: &Request, data: &[u8], held: Held) {
        let (head, head_len) = self.read_head(req, data.len());
        self.send(&[&head[..head_len], data], held);
    }

    /// The header of a read's successful reply carrying `len` bytes, and its length: a
    /// structured OFFSET_DATA chunk with the offset, or a simple reply.
    fn read_head(&self, req: &Request, len: usize) -> ([u8; 28], usize) {
        // A read is answered in one piece of exactly the length asked: a client reads that
        // many bytes after the header, and any other count desynchronizes the stream.
        assert!(
            req.kind == CMD_READ && len == req.length as usize,
            "read reply of {len} bytes for a request of {} (kind {})",
            req.length,
            req.kind
        );
        let mut head = [0u8; 28];
        if self.session.structured {
            let chunk = len as u32 + 8; // the offset, then the data
            let h = chunk_header(req.cookie, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, chunk);
            head[..20].copy_from_slice(&h);
            head[20..].copy_from_slice(&req.offset.to_be_bytes());
            (head, 28)
        } else {
            head[..16].copy_from_slice(&simple_reply_header(req.cookie, 0));
            (head, 16)
        }
    }
}

thread_local! {
    /// Connections whose queued replies this thread is to send (see `hold`).
    static HELD: RefCell<Vec<Arc<Shared>>> = const { RefCell::new(Vec::new()) };
}

/// Leaves `sh`'s queued replies for this thread to send soon with `send_held`, if it will:
/// at the end of the batch of requests it is answering, after the next request it runs as a
/// worker with more queued, or (a connection's reader serving a read) before it may wait for
/// the next request. False if none: the caller sends them now.
fn hold(sh: &Arc<Shared>) -> bool {
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        if held.iter().any(|h| Arc::ptr_eq(h, sh)) {
            return true;
        }
        // The batch's end sends them if there is one; else the worker, between requests.
        let later = after_wakeups(send_held)
            || super::workers::more_queued()
            || READER_HAS_MORE.with(Cell::get);
        if later {
            held.push(sh.clone());
        }
        later
    })
}

/// Sends what each held connection queued (`hold`).
pub(super) fn send_held() {
    for sh in HELD.with(|held| std::mem::take(&mut *held.borrow_mut())) {
        sh.replies.drain();
    }
}

/// Serves requests until the client disconnects (DISC, EOF, a framing error) or the socket is
/// shut down for reading by the server; returns after every started request has replied.
/// `stream` is read; `send` is a second descriptor of the same socket, for the replies.
pub fn serve<S: Read + AsRawFd>(
    stream: S,
    send: OwnedFd,
    session: Session,
    budget: &Arc<Budget>,
    workers: &Workers,
    cfg: ConnConfig,
) {
    let Ok(replies) = Replies::start(send, cfg.write_timeout) else {
        return;
    };
    let shared = Arc::new(Shared {
        session,
        replies,
        inflight: Mutex::new(0),
        drained: Condvar::new(),
    });
    let quota = Quota::new(cfg.reply_quota_bytes.max(MIN_BLOCK as u64));
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, stream);
    // Whether the last request was a large write (see `DIRECT_PAYLOAD_BYTES`).
    let mut large_writes = false;
    loop {
        // Replies to reads served here wait while more requests are buffered, to go out in
        // one write (see `hold`); never past a moment when reading the next may wait.
        if !request_buffered(&reader) {
            send_held();
        }
        // EOF, reset, shutdown or a framing error (bad magic) ends the loop.
        // After a large write, with nothing buffered, the next header is read from the socket
        // alone: a fill of the reader's buffer would take in the next payload as well, to be
        // copied out again (see `DIRECT_PAYLOAD_BYTES`).
        let incoming = if large_writes && reader.buffer().is_empty() {
            read_request(reader.get_mut())
        } else {
            read_request(&mut reader)
        };
        let Ok(Incoming::Request(req)) = incoming else {
            break;
        };
        large_writes = req.kind == CMD_WRITE && req.length as usize >= DIRECT_PAYLOAD_BYTES;
        if req.kind == CMD_DISC {
            break;
        }
        // The reply's quota first: a client whose replies wait unread stops here. Replies
        // this thread holds go out before it waits (their grants may be what it waits for).
        let reply = quota.acquire_or_else(reply_cost(&req), send_held);
        match admit(&shared, &req) {
            Admit::Run => {}
            Admit::Refuse(error, msg) => {
                if req.kind == CMD_WRITE && discard(&mut reader, req.length as u64).is_err() {
                    break;
                }
                let held = Held {
                    data: budget.acquire(0),
                    _reply: reply,
                };
                shared.reply_err(&req, error, &msg, held);
                continue;
            }
        }
        let (data, payload) = if req.kind == CMD_WRITE {
            // Read into spare capacity (of a kept buffer, mostly): zeroing a buffer the
            // socket overwrites at once cost as much as a memcpy of every payload.
            let len = req.length as usize;
            let (grant, mut p) = budget.acquire_buffer(len, send_held);
            if read_payload(&mut reader, len, &mut p).is_err() {
                break; // the client went away mid-payload: nothing was written
            }
            (grant, Some(p))
        } else {
            let cost = if req.kind == CMD_READ { req.length } else { 0 };
            (budget.acquire_or_else(cost as u64, send_held), None)
        };
        let held = Held {
            data,
            _reply: reply,
        };
        let alone = {
            let mut n = shared.inflight.lock();
            *n += 1;
            *n == 1
        };
        let sh = shared.clone();
        if alone && reader.buffer().is_empty() && !large_writes {
            // Nothing else in flight and no next request waiting: this thread runs it.
            // Handing it to a worker costs the wake-up of a sleeping thread, in a virtual
            // machine a good part of a queue-depth-1 client's FUA write (figures:
            // docs/perf/nbd.md, "Why a lone request runs on its connection's reader").
            // Never a large write: its payload came past the buffer, so the empty buffer
            // says nothing of what waits in the socket, and a reader running large writes
            // itself starves the connection (see `READ_BUFFER_BYTES`).
            execute(sh, req, payload, held, Some(workers));
        } else if req.kind == CMD_READ && req.length as usize <= READ_HERE_BYTES {
            match read_here(&sh, &req, request_buffered(&reader), held) {
                None => sh.finish_one(),
                Some(held) => workers.spawn(move || execute(sh, req, None, held, None)),
            }
        } else if req.kind == CMD_WRITE
            && req.flags & CMD_FLAG_FUA == 0
            && req.length as usize <= WRITE_HERE_BYTES
        {
            let more = request_buffered(&reader);
            match write_here(&sh, &req, payload.unwrap_or_default(), more, held) {
                Ok(()) => sh.finish_one(),
                Err((p, held)) => workers.spawn(move || execute(sh, req, Some(p), held, None)),
            }
        } else if req.kind == CMD_FLUSH {
            flush(sh, req, held, workers);
        } else {
            workers.spawn(move || execute(sh, req, payload, held, None));
        }
    }
    shared.wait_drained();
    // Every reply is queued or written by now; write what a last holder may have left.
    shared.replies.close();
}

/// Reads a request's `len` bytes of payload into `p`'s spare capacity: what the reader has
/// buffered, then the rest straight from the socket. Through the reader, a payload shorter
/// than its buffer was received into the buffer and copied again (figures:
/// docs/perf/nbd.md, "Why write payloads go from the socket straight into their buffer");
/// after a large write the header came alone, so little or nothing of the payload is
/// buffered (`DIRECT_PAYLOAD_BYTES`).
fn read_payload<S: Read + AsRawFd>(
    reader: &mut BufReader<S>,
    len: usize,
    p: &mut Vec<u8>,
) -> io::Result<()> {
    let buffered = reader.buffer();
    let n = buffered.len().min(len);
    p.extend_from_slice(&buffered[..n]);
    io::BufRead::consume(reader, n);
    p.reserve_exact(len - n);
    let fd = reader.get_ref().as_raw_fd();
    while p.len() < len {
        let want = len - p.len();
        let spare = p.spare_capacity_mut();
        // One `recv` asked to wait for all of it: `read_to_end` would read in steps growing
        // from 8K, five calls for a 128K payload.
        // SAFETY: the kernel writes at most `want` bytes at the start of `p`'s spare capacity,
        // which `reserve_exact` made at least `len - n >= want` bytes long; no other reference
        // to that memory exists during the call.
        let rc = unsafe { libc::recv(fd, spare.as_mut_ptr().cast(), want, libc::MSG_WAITALL) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if rc == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        // SAFETY: the kernel initialised the first `rc <= want` bytes of the spare capacity.
        unsafe { p.set_len(p.len() + rc as usize) };
    }
    Ok(())
}

enum Admit {
    Run,
    Refuse(u32, String),
}

/// Checks a request against the session before any work or payload read.
fn admit(sh: &Shared, req: &Request) -> Admit {
    let s = &sh.session;
    let known = matches!(
        req.kind,
        CMD_READ
            | CMD_WRITE
            | CMD_FLUSH
            | CMD_TRIM
            | CMD_CACHE
            | CMD_WRITE_ZEROES
            | CMD_BLOCK_STATUS
    );
    if !known {
        return Admit::Refuse(EINVAL, format!("unknown command {}", req.kind));
    }
    let name = command_name(req.kind);
    let writes = matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && s.read_only {
        return Admit::Refuse(EPERM, format!("{name} on read-only export {}", s.name));
    }
    if req.kind == CMD_BLOCK_STATUS && !s.base_allocation && s.changed_since.is_none() {
        return Admit::Refuse(
            EINVAL,
            "BLOCK_STATUS without a negotiated meta context".into(),
        );
    }
    if matches!(req.kind, CMD_READ | CMD_WRITE) && req.length > MAX_PAYLOAD {
        return Admit::Refuse(
            EINVAL,
            format!(
                "{name} of {} bytes exceeds the maximum payload {MAX_PAYLOAD}",
                req.length
            ),
        );
    }
    if req.kind != CMD_FLUSH {
        let size = sh.volume().size();
        if req
            .offset
            .checked_add(req.length as u64)
            .is_none_or(|end| end > size)
        {
            let error = if req.kind == CMD_WRITE || req.kind == CMD_WRITE_ZEROES {
                ENOSPC
            } else {
                EINVAL
            };
            return Admit::Refuse(
                error,
                format!(
                    "{name} of {} bytes at {} lies past the end ({size})",
                    req.length, req.offset
                ),
            );
        }
        let aligned = |v: u64| v.is_multiple_of(MIN_BLOCK as u64);
        if s.promised_alignment
            && req.kind != CMD_BLOCK_STATUS
            && !(aligned(req.offset) && aligned(req.length as u64))
        {
            return Admit::Refuse(
                EINVAL,
                format!(
                    "{name} at {} of {} bytes is not {MIN_BLOCK}-byte aligned",
                    req.offset, req.length
                ),
            );
        }
    }
    if req.kind == CMD_WRITE_ZEROES
        && req.flags & CMD_FLAG_FAST_ZERO != 0
        && req.flags & CMD_FLAG_NO_HOLE != 0
    {
        // Zeroing without punching holes writes every byte: no faster than a plain write.
        return Admit::Refuse(ENOTSUP, "fast zeroing needs holes".into());
    }
    Admit::Run
}

/// ENOSPC where the pool or its devices are out of room (a full pool, or a full file
/// system under its files): a client such as qemu then pauses its guest (`werror=enospc`,
/// its default) instead of handing it an I/O error, and can resume once room is made.
fn error_code(e: &VolError) -> u32 {
    match e {
        VolError::OutOfRange { .. } => EINVAL,
        VolError::Pool {
            source: PoolError::NoSpace(_),
            ..
        } => ENOSPC,
        e if e.out_of_space() => ENOSPC,
        // Set readonly=on while the client was connected (NBD's answer to a write of a
        // read-only export).
        VolError::Pool {
            source: PoolError::ReadOnlyVolume(_),
            ..
        } => EPERM,
        VolError::Pool { .. } | VolError::Unreadable { .. } => EIO,
    }
}

/// Runs a volume operation of a request. A panic in it (a bug below, or bytes no check
/// caught) becomes this request's error, answered EIO: left to unwind, it left the request
/// unanswered, the connection waiting for it to drain and the server's stop waiting for the
/// connection (or, on the connection's own thread, ended the connection and kept its slot).
fn caught<T>(vol: &Volume, op: impl FnOnce() -> Result<T, VolError>) -> Result<T, VolError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(op)).unwrap_or_else(|panic| {
        Err(VolError::Pool {
            vol: vol.name().to_string(),
            source: PoolError::Invalid(format!("internal error: {}", panic_text(panic.as_ref()))),
        })
    })
}

/// Runs one request and replies; the request counts as in flight until its reply is sent,
/// which for a FLUSH or FUA write may be after this returns (see `reply_when_durable`).
/// `inline`: run by the connection's reader itself, which must not stay on as the log's
/// committer for other requests; the workers take over from it.
fn execute(
    sh: Arc<Shared>,
    req: Request,
    payload: Option<Vec<u8>>,
    mut held: Held,
    inline: Option<&Workers>,
) {
    let vol = sh.volume();
    let fua = req.flags & CMD_FLAG_FUA != 0;
    if fua || req.kind == CMD_FLUSH {
        // This thread may now commit the log for a while: replies it holds go first.
        send_held();
    }
    let (result, durable) = match req.kind {
        CMD_READ => {
            let len = req.length as usize;
            let mut buf = take_read_buffer(len);
            match caught(vol, || vol.read(req.offset, &mut buf[..len])) {
                Ok(()) => sh.reply_read(&req, buf, len, held),
                Err(e) => {
                    give_back_read_buffer(buf);
                    sh.reply_err(&req, error_code(&e), &e.to_string(), held);
                }
            }
            sh.finish_one();
            return;
        }
        CMD_WRITE => {
            let payload = payload.unwrap_or_default();
            let written = caught(vol, || vol.write(req.offset, &payload));
            // The volume has what it needs of the bytes (copied or placed on disk): their
            // budget goes back now, not once the reply is written.
            held.data.keep(payload);
            held.data.release();
            (written, fua)
        }
        CMD_FLUSH => (Ok(()), true),
        CMD_TRIM => (caught(vol, || vol.trim(req.offset, req.length as u64)), fua),
        CMD_WRITE_ZEROES => {
            let punch = req.flags & CMD_FLAG_NO_HOLE == 0;
            let zeroed = caught(vol, || {
                vol.write_zeroes(req.offset, req.length as u64, punch)
            });
            (zeroed, fua)
        }
        CMD_CACHE => {
            let len = (req.length as u64).min(MAX_CACHE_SPAN);
            match caught(vol, || vol.prefetch(req.offset, len)) {
                Ok(()) => sh.reply_ok(&req, held),
                Err(e) => sh.reply_err(&req, error_code(&e), &e.to_string(), held),
            }
            sh.finish_one();
            return;
        }
        CMD_BLOCK_STATUS => {
            block_status(&sh, &req, held);
            sh.finish_one();
            return;
        }
        _ => unreachable!("admit() refuses unknown commands"),
    };
    reply_when_durable(sh, req, held, result, durable, inline);
}

/// The capacity of a connection's read buffer. Small requests come through it, many per
/// system call; a write's payload is copied out of it as far as it took the payload in, and
/// read straight from the socket past that (`read_payload`). A smaller buffer copies less of
/// the payloads queued behind a request, but then finds itself empty after most large writes,
/// and the reader runs them itself (`serve`: alone, nothing buffered): at 64K, sequential
/// 128K writes on one file ran faster, but on raidz2 of six files random ones fell, the
/// parity and six writes no longer beside the reading (figures: docs/perf/nbd.md, "Why the
/// read buffer is 256K").
const READ_BUFFER_BYTES: usize = 256 << 10;

/// Writes at least this long are taken as a sign that the next request is one too: its header
/// is read on its own, so that its payload goes from the socket straight into the payload's
/// buffer. Through the reader's buffer, each payload was received there with the header and
/// then copied out, which under 128K writes cost the connection's thread as much as the
/// kernel's copy from the socket (figures: docs/perf/nbd.md, "Why write payloads go from the
/// socket straight into their buffer"). The price is a second `recv` per request, which a
/// copy of 32K costs about as much as; from 64K up the saving is clear, and the sync-write
/// benchmark's 32K points keep their measured path.
const DIRECT_PAYLOAD_BYTES: usize = 64 << 10;

/// Reads up to this long are served by the connection's reader itself when the volume has
/// their blocks at once (`read_here`). Handing a 4K read to a worker cost a thread's wake-up
/// for a few microseconds of copying: served here, random 4K and 16K reads ran faster, with
/// a lower p99. From 32K up one thread copying every reply of the connection lost to
/// workers copying on both cores (figures: docs/perf/nbd.md, "Why the reader serves reads
/// up to 16K itself").
const READ_HERE_BYTES: usize = 16 << 10;

/// Whether the reader holds a whole request header, so reading the next request will not wait.
fn request_buffered<S>(reader: &BufReader<S>) -> bool {
    reader.buffer().len() >= REQUEST_BYTES
}

thread_local! {
    /// Set on a connection's reader while it serves a read with another request buffered
    /// behind it: `hold` leaves the reply queued, for the reader's loop to send with the
    /// next ones before it may wait on the socket.
    static READER_HAS_MORE: Cell<bool> = const { Cell::new(false) };
}

/// Serves a short read on the connection's reader if the volume has every block it needs at
/// once (`Volume::read_nowait`); gives `held` back, with nothing sent, if not (a worker then
/// reads it). `more`: another request is buffered behind this one.
fn read_here(sh: &Arc<Shared>, req: &Request, more: bool, held: Held) -> Option<Held> {
    READER_HAS_MORE.with(|m| m.set(more));
    let unserved = with_read_buffer(req.length as usize, |buf| {
        match sh.volume().read_nowait(req.offset, buf) {
            None => Some(held),
            Some(Ok(())) => {
                sh.reply_data(req, buf, held);
                None
            }
            Some(Err(e)) => {
                sh.reply_err(req, error_code(&e), &e.to_string(), held);
                None
            }
        }
    });
    READER_HAS_MORE.with(|m| m.set(false));
    unserved
}

/// Writes up to this long, without FUA, are done by the connection's reader itself when the
/// volume can take them at once (`write_here`), as short reads are (`READ_HERE_BYTES`).
const WRITE_HERE_BYTES: usize = 16 << 10;

/// Does a short write on the connection's reader if the volume takes it without waiting
/// (`Volume::write_nowait_owned`, which keeps the payload's buffer rather than copy it) and
/// replies; gives the payload back, with nothing done or sent, if not (a worker then writes
/// it). `more`: another request is buffered behind this one, so the reply may wait to go
/// out with the next ones.
fn write_here(
    sh: &Arc<Shared>,
    req: &Request,
    data: Vec<u8>,
    more: bool,
    mut held: Held,
) -> Result<(), (Vec<u8>, Held)> {
    let written = match sh.volume().write_nowait_owned(req.offset, data) {
        Ok(w) => w,
        Err(data) => return Err((data, held)),
    };
    // The volume keeps the payload's buffer: its budget goes back now.
    held.data.release();
    READER_HAS_MORE.with(|m| m.set(more));
    match written {
        Ok(()) => sh.reply_ok(req, held),
        Err(e) => sh.reply_err(req, error_code(&e), &e.to_string(), held),
    }
    READER_HAS_MORE.with(|m| m.set(false));
    Ok(())
}

/// Replies to a change: at once if it failed or needs no durability, else once the volume's
/// log has made it durable. The worker does not wait for that: the log calls back (from its
/// committer, which may be this thread or another), so workers stay free for other requests
/// while a flush is on its way to the disk, and the log can gather them into one commit.
fn reply_when_durable(
    sh: Arc<Shared>,
    req: Request,
    held: Held,
    applied: Result<(), VolError>,
    durable: bool,
    inline: Option<&Workers>,
) {
    match applied {
        Err(e) => sh.reply_err(&req, error_code(&e), &e.to_string(), held),
        Ok(()) if !durable => sh.reply_ok(&req, held),
        Ok(()) => {
            let done = reply_once_durable(&sh, req, held);
            match inline {
                None => sh.volume().flush_then(done),
                Some(workers) => {
                    // Other connections' requests may be waiting on this volume's log: a
                    // worker commits them, so this connection's next request is read now.
                    if sh.volume().flush_then_bounded(done) {
                        workers.spawn(move || sh.volume().flush_then(Box::new(|_| {})));
                    }
                }
            }
            return;
        }
    }
    sh.finish_one();
}

/// The callback that answers `req` once the log says its changes are durable (or failed).
fn reply_once_durable(sh: &Arc<Shared>, req: Request, held: Held) -> Done {
    let sh = sh.clone();
    Box::new(move |r| {
        match r {
            Ok(()) => sh.reply_ok(&req, held),
            Err(e) => {
                let e = sh.volume().log_error(e);
                sh.reply_err(&req, error_code(&e), &e.to_string(), held)
            }
        }
        sh.finish_one();
    })
}

/// A FLUSH the connection's reader takes itself: it joins the batch of the volume's log
/// committer at work, which answers it (`Volume::flush_then_joined`). With no committer at
/// work, a worker becomes one. Handing every FLUSH to a worker cost a wake-up and two task
/// switches, for a worker that then mostly found a committer at work and only queued it.
fn flush(sh: Arc<Shared>, req: Request, held: Held, workers: &Workers) {
    let done = reply_once_durable(&sh, req, held);
    if let Some(done) = sh.volume().flush_then_joined(done) {
        workers.spawn(move || {
            // This worker may commit for a while: replies it holds go first.
            send_held();
            sh.volume().flush_then(done)
        });
    }
}

fn block_status(sh: &Arc<Shared>, req: &Request, held: Held) {
    let vol = sh.volume();
    let len = (req.length as u64).min(MAX_STATUS_SPAN);
    let take = |n: usize| {
        if req.flags & CMD_FLAG_REQ_ONE != 0 {
            1
        } else {
            n.min(MAX_STATUS_EXTENTS)
        }
    };
    // One descriptor list per context selected, each `(length, flags)`.
    let mut lists: Vec<Vec<u8>> = Vec::new();
    let mut list = |id: u32, runs: &mut dyn Iterator<Item = (u64, u32)>| {
        let mut p = id.to_be_bytes().to_vec();
        for (len, flags) in runs {
            // Each descriptor's length is a u32; runs are at most MAX_STATUS_SPAN (1 GiB).
            p.extend_from_slice(&(len as u32).to_be_bytes());
            p.extend_from_slice(&flags.to_be_bytes());
        }
        lists.push(p);
    };
    if sh.session.base_allocation {
        let extents = match vol.allocation(req.offset, len) {
            Ok(x) => x,
            Err(e) => return sh.reply_err(req, error_code(&e), &e.to_string(), held),
        };
        let n = take(extents.len());
        list(
            BASE_ALLOCATION_ID,
            &mut extents.iter().take(n).map(|x| {
                let flags = if x.hole { STATE_HOLE | STATE_ZERO } else { 0 };
                (x.len, flags)
            }),
        );
    }
    if let Some(base) = &sh.session.changed_since {
        let runs = match vol.changes(base, req.offset, len) {
            Ok(x) => x,
            Err(e) => return sh.reply_err(req, error_code(&e), &e.to_string(), held),
        };
        let n = take(runs.len());
        list(
            ZETA_CHANGED_ID,
            &mut runs
                .iter()
                .take(n)
                .map(|c| (c.len, if c.changed { STATE_CHANGED } else { 0 })),
        );
    }
    // Every list but the last in a chunk of its own; the last one ends the reply.
    let mut headers = Vec::with_capacity(lists.len());
    for (i, p) in lists.iter().enumerate() {
        let flags = if i + 1 == lists.len() {
            REPLY_FLAG_DONE
        } else {
            0
        };
        headers.push(chunk_header(
            req.cookie,
            flags,
            REPLY_TYPE_BLOCK_STATUS,
            p.len() as u32,
        ));
    }
    let mut bufs: Vec<&[u8]> = Vec::with_capacity(2 * lists.len());
    for (h, p) in headers.iter().zip(&lists) {
        bufs.push(h);
        bufs.push(p);
    }
    sh.send(&bufs, held);
}
