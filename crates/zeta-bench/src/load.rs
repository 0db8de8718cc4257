//! `zeta-load`, the sync-write load generator of `zeta bench sync`: a minimal NBD client.
//!
//! One TCP connection per export. Each keeps `depth` requests in flight: writes of `bs_bytes`
//! at random offsets with random data, and exactly one NBD_CMD_FLUSH after every
//! `writes_per_flush`-th write, sent as soon as that write has been sent and holding one of the
//! in-flight slots like a write. A reader thread per connection takes the replies and times each
//! write from request sent to reply read.
//!
//! Why not only fio: fio 3.33's nbd engine, at a queue depth above 1, sends a flush after nearly
//! every write whatever `--fsync` says, so it cannot show what group commit does with N writes
//! per flush. Here the ratio is N by construction, and the counts prove it.

use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use zeta_nbd::proto::*;

/// How long the handshake, and then any one reply, may take before the run fails.
const REPLY_TIMEOUT: Duration = Duration::from_secs(120);
/// The largest write `--bs` allows.
const MAX_BS_BYTES: usize = 4 << 20;
/// Random bytes each connection cuts its payloads from (at 4 KiB-aligned starts), or twice the
/// write size if larger: small enough to stay in the processor's cache. With 4 MiB per
/// connection, the copy of each payload into the socket missed the cache, and sending took
/// time from the server measured (figures: docs/perf/README.md, "Why zeta-load cuts
/// payloads from 256K of data and batches its sends").
const DATA_POOL_BYTES: usize = 256 << 10;
/// The slot of a request lives in the low bits of its cookie (see `cookie`).
const SLOT_BITS: u32 = 8;
/// Requests whose slots are free together are sent in one write of up to about this many bytes.
/// One write per request cost the generator CPU taken from the server it measures (figures:
/// docs/perf/README.md, "Why zeta-load cuts payloads from 256K of data and batches its
/// sends"); a client that queues requests, as QEMU's or the kernel's does, sends them
/// together too.
const SEND_BATCH_BYTES: usize = 64 << 10;
/// Most requests one connection keeps in flight.
pub const MAX_DEPTH: u32 = 1 << SLOT_BITS;

/// Most slices `--interval` may cut a run into: each is a line of output.
const MAX_SLICES: u64 = 100_000;

/// The seed of the offsets and data: the same for every target, so every server a run (or
/// `zeta bench load`) drives sees the same writes.
pub const SEED: u64 = 0x5eed;

#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub bs_bytes: u32,
    /// A FLUSH after every N-th write; 0, none at all (`zeta bench frag`'s writers).
    pub writes_per_flush: u32,
    /// Requests in flight per connection, flushes included.
    pub depth: u32,
    pub runtime: Duration,
    /// Connection i draws its offsets and data from `seed + i`, so every target sees the same.
    pub seed: u64,
    /// Every write carries NBD_CMD_FLAG_FUA (durable when answered) and no FLUSH is sent;
    /// `writes_per_flush` is then ignored.
    pub fua: bool,
    /// Also measure the writes answered in each slice of the run this long (`slices`).
    pub interval: Option<Duration>,
}

/// What one run measured, summed over its connections.
#[derive(Clone, Debug)]
pub struct LoadResult {
    /// Writes whose reply arrived within the run time, per second of it.
    pub writes_per_sec: f64,
    /// Over those same writes; `None` if there were none.
    pub lat_mean_us: Option<f64>,
    pub lat_p99_us: Option<f64>,
    /// Of the flushes answered within the run time, from request sent to reply read.
    pub flush_lat_mean_us: Option<f64>,
    pub flush_lat_p99_us: Option<f64>,
    /// Every request sent, including those of the last group that finished after the run time.
    pub writes_sent: u64,
    pub flushes_sent: u64,
    /// With `LoadSpec::interval`: the writes answered in each slice of the run, in order,
    /// empty slices included. A run's mean hides a stall of a second (a txg's writeback that
    /// every flush waits behind, say); its slice shows it.
    pub slices: Vec<Slice>,
}

/// The writes answered within one slice of a run (`LoadSpec::interval`).
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    /// When the slice starts, in seconds from the start of the run.
    pub start_s: f64,
    pub writes_per_sec: f64,
    pub lat_mean_us: Option<f64>,
    pub lat_p99_us: Option<f64>,
    pub lat_max_us: Option<f64>,
}

impl LoadResult {
    pub fn writes_per_flush(&self) -> Option<f64> {
        (self.flushes_sent > 0).then(|| self.writes_sent as f64 / self.flushes_sent as f64)
    }
}

/// `zeta bench load`: one run against a server the user names, printed as a line.
pub fn load_cmd(a: crate::args::BenchLoadArgs) -> zeta_server::Result<()> {
    let bs = zeta_server::fmt::parse_size(&a.bs)?;
    if bs < 4096 || !bs.is_multiple_of(4096) || bs > MAX_BS_BYTES as u64 {
        return Err(zeta_server::usage(format!(
            "--bs {}: a multiple of 4K up to {}K",
            a.bs,
            MAX_BS_BYTES >> 10
        )));
    }
    if let Some(every) = a.interval {
        if a.runtime as f64 / every > MAX_SLICES as f64 {
            return Err(zeta_server::usage(format!(
                "--interval {every}: at most {MAX_SLICES} slices in a run of {} s",
                a.runtime
            )));
        }
    }
    let spec = LoadSpec {
        bs_bytes: bs as u32,
        writes_per_flush: a.flush_every,
        depth: a.depth,
        runtime: Duration::from_secs(a.runtime),
        seed: SEED,
        fua: a.fua,
        interval: a.interval.map(Duration::from_secs_f64),
    };
    let r = run(a.addr, &a.exports, &spec, &AtomicBool::new(false)).map_err(|e| {
        zeta_server::Error::Io {
            path: format!("nbd://{}", a.addr),
            source: e,
        }
    })?;
    let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    println!(
        "{:.0} writes/s, mean {} us, p99 {} us, {} writes per flush; flushes: mean {} us, p99 {} us",
        r.writes_per_sec,
        us(r.lat_mean_us),
        us(r.lat_p99_us),
        r.writes_per_flush()
            .map_or("no flushes,".to_string(), |w| format!("{w:.2}")),
        us(r.flush_lat_mean_us),
        us(r.flush_lat_p99_us),
    );
    if !r.slices.is_empty() {
        println!(
            "{:>8} {:>10} {:>9} {:>9} {:>9}",
            "from s", "writes/s", "mean us", "p99 us", "max us"
        );
        for sl in &r.slices {
            println!(
                "{:>8.1} {:>10.0} {:>9} {:>9} {:>9}",
                sl.start_s,
                sl.writes_per_sec,
                us(sl.lat_mean_us),
                us(sl.lat_p99_us),
                us(sl.lat_max_us)
            );
        }
    }
    Ok(())
}

/// Runs the load against every export at once for `spec.runtime`. `stop` ends it early (each
/// connection finishes its current group and drains).
pub fn run(
    addr: SocketAddr,
    exports: &[String],
    spec: &LoadSpec,
    stop: &AtomicBool,
) -> io::Result<LoadResult> {
    assert!(
        (1..=MAX_DEPTH).contains(&spec.depth),
        "depth {}",
        spec.depth
    );
    assert!(spec.bs_bytes >= 4096 && spec.bs_bytes.is_multiple_of(4096));
    assert!(spec.bs_bytes as usize <= MAX_BS_BYTES);
    // Handshakes first, so that connection set-up is not part of the measured time.
    let mut conns = Vec::new();
    for e in exports {
        conns.push(handshake(addr, e).map_err(|err| context(e, err))?);
    }
    let t0 = Instant::now();
    let outcomes: Vec<io::Result<Outcome>> = std::thread::scope(|sc| {
        let handles: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(i, (stream, size))| {
                let seed = spec.seed + i as u64;
                sc.spawn(move || run_connection(stream, size, spec, t0, stop, seed))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("load connection thread panicked"))
            .collect()
    });
    let mut total = Outcome::default();
    for (e, o) in exports.iter().zip(outcomes) {
        let o = o.map_err(|err| context(e, err))?;
        total.window_writes += o.window_writes;
        total.lat_ns.extend_from_slice(&o.lat_ns);
        total.done_ns.extend_from_slice(&o.done_ns);
        total.flush_lat_ns.extend_from_slice(&o.flush_lat_ns);
        total.writes_sent += o.writes_sent;
        total.flushes_sent += o.flushes_sent;
    }
    assert_eq!(total.window_writes, total.lat_ns.len() as u64);
    // Before the run's percentile, which reorders the latencies.
    let slices = spec.interval.map_or_else(Vec::new, |every| {
        slices_of(&total.done_ns, &total.lat_ns, every, spec.runtime)
    });
    let (lat_mean_us, lat_p99_us) = mean_and_p99_us(&mut total.lat_ns);
    let (flush_lat_mean_us, flush_lat_p99_us) = mean_and_p99_us(&mut total.flush_lat_ns);
    Ok(LoadResult {
        writes_per_sec: total.window_writes as f64 / spec.runtime.as_secs_f64(),
        lat_mean_us,
        lat_p99_us,
        flush_lat_mean_us,
        flush_lat_p99_us,
        writes_sent: total.writes_sent,
        flushes_sent: total.flushes_sent,
        slices,
    })
}

/// Splits the run into slices `every` long (the last one shorter if the run time is not a
/// multiple) and measures the writes answered in each: `done_ns[i]` is when write i was
/// answered, `lat_ns[i]` how long it took.
fn slices_of(done_ns: &[u64], lat_ns: &[u64], every: Duration, runtime: Duration) -> Vec<Slice> {
    let every_ns = (every.as_nanos() as u64).max(1);
    let run_ns = runtime.as_nanos() as u64;
    let count = run_ns.div_ceil(every_ns).max(1) as usize;
    let mut lats: Vec<Vec<u64>> = vec![Vec::new(); count];
    for (&done, &lat) in done_ns.iter().zip(lat_ns) {
        lats[((done / every_ns) as usize).min(count - 1)].push(lat);
    }
    lats.into_iter()
        .enumerate()
        .map(|(i, mut l)| {
            let start = i as u64 * every_ns;
            let len_s = (run_ns.min(start + every_ns) - start).max(1) as f64 / 1e9;
            let max = l.iter().max().map(|&m| m as f64 / 1e3);
            let (mean, p99) = mean_and_p99_us(&mut l);
            Slice {
                start_s: start as f64 / 1e9,
                writes_per_sec: l.len() as f64 / len_s,
                lat_mean_us: mean,
                lat_p99_us: p99,
                lat_max_us: max,
            }
        })
        .collect()
}

fn context(export: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("export {export}: {e}"))
}

/// Mean and 99th percentile (nearest rank) in microseconds.
fn mean_and_p99_us(lat_ns: &mut [u64]) -> (Option<f64>, Option<f64>) {
    if lat_ns.is_empty() {
        return (None, None);
    }
    let n = lat_ns.len();
    let mean = lat_ns.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let rank = (n * 99).div_ceil(100).max(1);
    let (_, p99, _) = lat_ns.select_nth_unstable(rank - 1);
    (Some(mean / 1e3), Some(*p99 as f64 / 1e3))
}

/// Fixed newstyle negotiation with NO_ZEROES and NBD_OPT_GO; returns the stream in transmission
/// phase and the export's size. Simple replies only: structured replies are not negotiated, as
/// writes and flushes carry no data back.
fn handshake(addr: SocketAddr, export: &str) -> io::Result<(TcpStream, u64)> {
    let mut s = TcpStream::connect_timeout(&addr, REPLY_TIMEOUT)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(REPLY_TIMEOUT))?;
    let mut g = [0u8; 18];
    s.read_exact(&mut g)?;
    let be64 = |b: &[u8]| u64::from_be_bytes(b.try_into().unwrap());
    if be64(&g[0..8]) != NBDMAGIC || be64(&g[8..16]) != IHAVEOPT {
        return Err(bad("not an NBD newstyle server"));
    }
    let flags = u16::from_be_bytes([g[16], g[17]]);
    let need = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES;
    if flags & need != need {
        return Err(bad("the server offers no fixed newstyle with NO_ZEROES"));
    }
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())?;
    let mut data = (export.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(export.as_bytes());
    data.extend_from_slice(&0u16.to_be_bytes()); // no information requests
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&OPT_GO.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(&data);
    s.write_all(&m)?;
    let mut export_info = None;
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h)?;
        if be64(&h[0..8]) != OPT_REPLY_MAGIC {
            return Err(bad("bad option reply magic"));
        }
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        if len > MAX_OPTION {
            return Err(bad("option reply too long"));
        }
        let mut d = vec![0u8; len as usize];
        s.read_exact(&mut d)?;
        if kind == REP_ACK {
            break;
        }
        if kind & (1 << 31) != 0 {
            return Err(bad(&format!(
                "the server refused the export ({kind:#x}): {}",
                String::from_utf8_lossy(&d)
            )));
        }
        if kind == REP_INFO && d.len() >= 12 && d[0..2] == INFO_EXPORT.to_be_bytes() {
            export_info = Some((be64(&d[2..10]), u16::from_be_bytes([d[10], d[11]])));
        }
    }
    let (size, tflags) = export_info.ok_or_else(|| bad("NBD_OPT_GO without NBD_INFO_EXPORT"))?;
    if tflags & TF_SEND_FLUSH == 0 {
        return Err(bad("the export does not accept flushes"));
    }
    if tflags & TF_READ_ONLY != 0 {
        return Err(bad("the export is read-only"));
    }
    Ok((s, size))
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// A request's cookie carries all its reply needs: the slot it holds (low `SLOT_BITS`), whether
/// it is a flush (the next bit) and when it was sent (ns since the run began, the bits above:
/// 2^55 ns is over a year). Requests in flight hold distinct slots, so their cookies are
/// distinct, and no table of pending requests is shared between the two threads.
fn cookie(slot: u32, flush: bool, sent_ns: u64) -> u64 {
    assert!(slot < MAX_DEPTH && sent_ns < 1 << (63 - SLOT_BITS));
    (sent_ns << (SLOT_BITS + 1)) | (u64::from(flush) << SLOT_BITS) | u64::from(slot)
}

fn decode_cookie(c: u64) -> (u32, bool, u64) {
    let slot = (c & (u64::from(MAX_DEPTH) - 1)) as u32;
    (slot, c >> SLOT_BITS & 1 == 1, c >> (SLOT_BITS + 1))
}

#[derive(Default)]
struct Outcome {
    window_writes: u64,
    lat_ns: Vec<u64>,
    /// When each write of `lat_ns` was answered (with `LoadSpec::interval` only).
    done_ns: Vec<u64>,
    flush_lat_ns: Vec<u64>,
    writes_sent: u64,
    flushes_sent: u64,
}

/// What the reader saw.
#[derive(Default)]
struct Replies {
    count: u64,
    window_writes: u64,
    lat_ns: Vec<u64>,
    done_ns: Vec<u64>,
    flush_lat_ns: Vec<u64>,
}

fn run_connection(
    stream: TcpStream,
    size: u64,
    spec: &LoadSpec,
    t0: Instant,
    stop: &AtomicBool,
    seed: u64,
) -> io::Result<Outcome> {
    if size < u64::from(spec.bs_bytes) {
        return Err(bad("the export is smaller than one write"));
    }
    // The free slots: a counting semaphore that also names each request's slot.
    let (free_tx, free_rx) = sync_channel::<u32>(spec.depth as usize);
    for slot in 0..spec.depth {
        free_tx.send(slot).expect("the channel holds every slot");
    }
    let deadline_ns = spec.runtime.as_nanos() as u64;
    let reader_stream = stream.try_clone()?;
    std::thread::scope(|sc| {
        let reader = sc.spawn(move || read_replies(reader_stream, t0, deadline_ns, spec, free_tx));
        let sent = send_requests(&stream, size, spec, t0, stop, &free_rx, seed);
        if sent.is_err() {
            // Unblock the reader: nothing more will be answered that anyone waits for.
            let _ = stream.shutdown(Shutdown::Both);
        }
        let replies = reader.join().expect("reply reader panicked");
        // The reader's error is the cause when both failed (the writer then only saw the slots
        // stop coming back).
        let replies = replies?;
        let (writes_sent, flushes_sent) = sent?;
        if replies.count != writes_sent + flushes_sent {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the server closed the connection with {} requests unanswered",
                    writes_sent + flushes_sent - replies.count
                ),
            ));
        }
        Ok(Outcome {
            window_writes: replies.window_writes,
            lat_ns: replies.lat_ns,
            done_ns: replies.done_ns,
            flush_lat_ns: replies.flush_lat_ns,
            writes_sent,
            flushes_sent,
        })
    })
}

/// Requests built to go out in one `writev`: their headers, and the range of the random data
/// (`DATA_POOL_BYTES`) each write's payload is. Payloads are sent from the data itself, not
/// copied into one buffer first.
#[derive(Default)]
struct Batch {
    headers: Vec<[u8; REQUEST_BYTES]>,
    payloads: Vec<std::ops::Range<usize>>,
    /// The bytes the batch sends.
    bytes: usize,
}

impl Batch {
    fn push(&mut self, header: [u8; REQUEST_BYTES], payload: std::ops::Range<usize>) {
        self.bytes += REQUEST_BYTES + payload.len();
        self.headers.push(header);
        self.payloads.push(payload);
    }

    /// Writes every request and empties the batch.
    fn send(&mut self, w: &mut impl Write, data: &[u8]) -> io::Result<()> {
        let mut iov: Vec<IoSlice> = Vec::with_capacity(2 * self.headers.len());
        for (h, p) in self.headers.iter().zip(&self.payloads) {
            iov.push(IoSlice::new(h));
            if !p.is_empty() {
                iov.push(IoSlice::new(&data[p.clone()]));
            }
        }
        let mut rest = &mut iov[..];
        while !rest.is_empty() {
            match w.write_vectored(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut rest, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.headers.clear();
        self.payloads.clear();
        self.bytes = 0;
        Ok(())
    }
}

/// Sends until the run time is up (finishing the group in progress, so every write belongs to
/// a flushed group of exactly N), waits for every reply, then disconnects. Returns the writes
/// and flushes sent.
fn send_requests(
    stream: &TcpStream,
    size: u64,
    spec: &LoadSpec,
    t0: Instant,
    stop: &AtomicBool,
    free: &Receiver<u32>,
    seed: u64,
) -> io::Result<(u64, u64)> {
    let take = || {
        free.recv().map_err(|_| {
            io::Error::new(io::ErrorKind::ConnectionAborted, "the reply reader stopped")
        })
    };
    let mut w = stream;
    let mut rng = StdRng::seed_from_u64(seed);
    let bs = spec.bs_bytes as usize;
    let mut data = vec![0u8; DATA_POOL_BYTES.max(2 * bs)];
    rng.fill_bytes(&mut data);
    // Offsets are multiples of the write size (fio's default alignment), hence 4 KiB-aligned.
    let writes_in_volume = size / bs as u64;
    let data_starts = (data.len() - bs) / 4096 + 1;
    let deadline = t0 + spec.runtime;
    let mut msg = Batch::default();
    let write_flags = if spec.fua { CMD_FLAG_FUA } else { 0 };
    let (mut writes, mut flushes, mut in_group) = (0u64, 0u64, 0u32);
    loop {
        if in_group == 0 && (Instant::now() >= deadline || stop.load(Ordering::Relaxed)) {
            break;
        }
        // Wait for one free slot, then take every other one free at once, and send what they
        // allow in one write (see `SEND_BATCH_BYTES`).
        let mut slot = Some(take()?);
        while let Some(s) = slot {
            let offset = rng.gen_range(0..writes_in_volume) * bs as u64;
            let at = rng.gen_range(0..data_starts) * 4096;
            let sent_ns = t0.elapsed().as_nanos() as u64;
            let id = cookie(s, false, sent_ns);
            msg.push(
                request_header(CMD_WRITE, write_flags, id, offset, bs as u32),
                at..at + bs,
            );
            writes += 1;
            in_group += 1;
            if spec.fua || spec.writes_per_flush == 0 {
                // Each write is its own group: durable (FUA), or never flushed.
                in_group = 0;
            } else if in_group == spec.writes_per_flush {
                // The flush follows its group's last write at once, waiting for a slot if
                // none is free (after sending what is built, not to hold it back).
                let s = match free.try_recv() {
                    Ok(s) => s,
                    Err(_) => {
                        msg.send(&mut w, &data)?;
                        take()?
                    }
                };
                let sent_ns = t0.elapsed().as_nanos() as u64;
                let id = cookie(s, true, sent_ns);
                msg.push(request_header(CMD_FLUSH, 0, id, 0, 0), 0..0);
                flushes += 1;
                in_group = 0;
            }
            // Past the run time, a group in progress goes on to its flush; no new one starts.
            let more = msg.bytes < SEND_BATCH_BYTES && (in_group > 0 || Instant::now() < deadline);
            slot = if more { free.try_recv().ok() } else { None };
        }
        msg.send(&mut w, &data)?;
    }
    // Every slot back means every request was answered.
    for _ in 0..spec.depth {
        take()?;
    }
    w.write_all(&request_header(CMD_DISC, 0, 0, 0, 0))?;
    stream.shutdown(Shutdown::Write)?;
    assert!(flushes == 0 || writes == flushes * u64::from(spec.writes_per_flush));
    Ok((writes, flushes))
}

/// Reads simple replies until the server closes the connection (after our NBD_CMD_DISC, or
/// because it failed: the caller tells the two apart by counting).
fn read_replies(
    stream: TcpStream,
    t0: Instant,
    deadline_ns: u64,
    spec: &LoadSpec,
    free: SyncSender<u32>,
) -> io::Result<Replies> {
    let mut r = BufReader::with_capacity(64 << 10, stream);
    let mut out = Replies::default();
    loop {
        let mut h = [0u8; 16];
        match r.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(out),
            Err(e) => return Err(e),
        }
        let now_ns = t0.elapsed().as_nanos() as u64;
        let magic = u32::from_be_bytes(h[0..4].try_into().unwrap());
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(bad(&format!("unexpected reply magic {magic:#x}")));
        }
        let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let (slot, flush, sent_ns) =
            decode_cookie(u64::from_be_bytes(h[8..16].try_into().unwrap()));
        if slot >= spec.depth || sent_ns > now_ns {
            return Err(bad("a reply with a cookie that was never sent"));
        }
        let what = if flush { "FLUSH" } else { "WRITE" };
        if error != 0 {
            return Err(io::Error::other(format!(
                "{what} failed with NBD error {error}"
            )));
        }
        out.count += 1;
        if now_ns <= deadline_ns {
            if flush {
                out.flush_lat_ns.push(now_ns - sent_ns);
            } else {
                out.window_writes += 1;
                out.lat_ns.push(now_ns - sent_ns);
                if spec.interval.is_some() {
                    out.done_ns.push(now_ns);
                }
            }
        }
        // Fails only if the writer already gave up; then no one waits for the slot.
        let _ = free.send(slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_round_trip() {
        for (slot, flush, ns) in [
            (0, false, 0),
            (255, true, 1 << 54),
            (99, false, 123_456_789),
        ] {
            assert_eq!(decode_cookie(cookie(slot, flush, ns)), (slot, flush, ns));
        }
        assert_ne!(cookie(1, false, 5), cookie(2, false, 5));
    }

    #[test]
    fn slices_split_writes_by_when_they_were_answered() {
        // A 2.5 s run in 1 s slices: three writes in the first, none in the second, and two
        // in the last half second, one of them answered exactly at the end of the run.
        let done = [100, 500_000_000, 999_999_999, 2_000_000_000, 2_500_000_000];
        let lat = [10_000, 20_000, 30_000, 4_000_000, 1_000];
        let s = slices_of(
            &done,
            &lat,
            Duration::from_secs(1),
            Duration::from_millis(2500),
        );
        assert_eq!(s.len(), 3);
        assert_eq!(
            s[0],
            Slice {
                start_s: 0.0,
                writes_per_sec: 3.0,
                lat_mean_us: Some(20.0),
                lat_p99_us: Some(30.0),
                lat_max_us: Some(30.0),
            }
        );
        assert_eq!((s[1].start_s, s[1].writes_per_sec), (1.0, 0.0));
        assert_eq!((s[1].lat_mean_us, s[1].lat_max_us), (None, None));
        // The last slice is half a second long: two writes in it are four a second.
        assert_eq!((s[2].start_s, s[2].writes_per_sec), (2.0, 4.0));
        assert_eq!(s[2].lat_max_us, Some(4000.0));
        assert_eq!(s[2].lat_mean_us, Some(2000.5));
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let mut v: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        let (mean, p99) = mean_and_p99_us(&mut v);
        assert_eq!(p99, Some(990.0));
        assert!((mean.unwrap() - 500.5).abs() < 1e-9);
        assert_eq!(mean_and_p99_us(&mut []), (None, None));
        assert_eq!(mean_and_p99_us(&mut [7000]), (Some(7.0), Some(7.0)));
    }
}
