//! Hostile clients against the NBD server: idle sockets, handshakes left half done and a
//! client that asks for data and never reads it must not keep a well-behaved client out, slow
//! it down, or grow the server's memory; the clients that misbehave are dropped in time.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::nbd_client::Client;
use common::procs::{have, pool_with_volume, spawn_server, status_field, zeta_in as zeta};
use common::rig::{Rig, VOL};
use zeta::nbd::proto::*;
use zeta::nbd::ServerConfig;

/// A socket that has read the greeting and sent its flags and half an option header.
fn stopped_mid_handshake(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    s.write_all(&IHAVEOPT.to_be_bytes()).unwrap();
    s
}

/// A session that sends `n` reads of `len` bytes and never reads a reply; returns the
/// thread sending (it stops sending when the server stops reading it, or drops it).
fn reader_that_never_reads(addr: SocketAddr, n: u64, len: u32) -> std::thread::JoinHandle<()> {
    let c = Client::open(addr, "tank/v");
    let mut s = c.s;
    s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    std::thread::spawn(move || {
        for i in 0..n {
            let off = (i * len as u64) % (60 << 20);
            let h = request_header(CMD_READ, 0, i, off, len);
            if s.write_all(&h).is_err() {
                break; // the server stopped reading us: backpressure
            }
        }
        // Keep the socket open (unread) for the rest of the test.
        std::thread::sleep(Duration::from_secs(3));
    })
}

#[test]
fn a_good_client_gets_in_and_finishes_under_attack_within_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    pool_with_volume(dir.path(), &home, "64M");
    let mut c = zeta(&home);
    c.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--cache",
        "64M",
        "--dirty-max",
        "32M",
        "--max-inflight",
        "32M",
    ])
    .stderr(Stdio::inherit());
    let (child, addr, _) = spawn_server(c);
    let pid = child.id();
    let _child = KillOnDrop(child);
    // Something to read back, so the reads below read data, not holes.
    let mut w = Client::open(addr, "tank/v");
    for i in 0..16u64 {
        assert_eq!(w.write(i << 20, &vec![i as u8 + 1; 1 << 20]), 0);
    }
    drop(w);
    let rss_before = status_field(pid, "VmRSS");

    // 300 idle sockets, 50 handshakes stopped half way, and a reader that never reads.
    let t_attack = Instant::now();
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let half: Vec<TcpStream> = (0..50).map(|_| stopped_mid_handshake(addr)).collect();
    let hostile = reader_that_never_reads(addr, 10_000, 64 << 10);
    // Let the hostile reader fill every buffer between it and the server.
    std::thread::sleep(Duration::from_millis(1500));
    let threads = status_field(pid, "Threads");

    // The good client: connect, negotiate, write, read back and flush, all within 5 s.
    let t = Instant::now();
    let mut good = Client::open(addr, "tank/v");
    let data: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
    for i in 0..8u64 {
        assert_eq!(good.write((32 << 20) + (i << 20), &data), 0);
    }
    for i in 0..8u64 {
        let got = good.read((32 << 20) + (i << 20), 1 << 20).unwrap();
        assert!(got == data, "read back differs at MiB {i}");
    }
    assert_eq!(good.call(CMD_FLUSH, 0, 0, 0, &[]).error, 0);
    let good_secs = t.elapsed().as_secs_f64();
    // And a real client, if there is one.
    let nbdinfo_secs = have("nbdinfo").then(|| {
        let t = Instant::now();
        let out = Command::new("nbdinfo")
            .args(["--size", &format!("nbd://{addr}/tank/v")])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nbdinfo under attack: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "67108864");
        t.elapsed().as_secs_f64()
    });
    let rss_peak = status_field(pid, "VmHWM");
    eprintln!(
        "under 300 idle sockets, 50 half handshakes and a reader of 10000 x 64K that never \
         reads: good client's 8M write + 8M read + flush in {good_secs:.3} s (nbdinfo: \
         {nbdinfo_secs:?} s), server threads {threads}, RSS {} MiB before the attack, peak \
         {} MiB",
        rss_before >> 20,
        rss_peak >> 20
    );
    assert!(good_secs < 5.0, "the good client took {good_secs:.1} s");
    assert!(
        nbdinfo_secs.is_none_or(|s| s < 5.0),
        "nbdinfo: {nbdinfo_secs:?} s"
    );
    // Workers (16), at most 32 handshakes, 3 per connection served, and a few more; not a
    // thread per socket.
    assert!(threads < 96, "{threads} threads for 352 sockets");
    // The hostile reader owes at most its 8M quota (10000 unread 64K replies would be 625M),
    // and the good client's 8M went through the 32M dirty limit.
    assert!(
        rss_peak < 96 << 20,
        "peak RSS {} MiB, over the 96 MiB bound ({} MiB before the attack)",
        rss_peak >> 20,
        rss_before >> 20
    );
    hostile.join().unwrap();
    drop((idle, half));
    assert!(t_attack.elapsed() < Duration::from_secs(25));
}

/// Kills the server child when the test ends, a failed assertion included (its inherited
/// stderr would keep the test harness's output open).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn idle_and_half_done_handshakes_are_dropped_and_hold_no_slot() {
    let rig = Rig::new(ServerConfig {
        max_connections: 2,
        max_handshakes: 4,
        handshake_timeout: Duration::from_millis(1500),
        ..Default::default()
    });
    // More idle sockets than handshake places and slots together.
    let mut idle: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(rig.addr()).unwrap())
        .collect();
    let mut half = stopped_mid_handshake(rig.addr());
    // Both slots still serve.
    let mut a = Client::open(rig.addr(), VOL);
    let mut b = Client::open(rig.addr(), VOL);
    assert_eq!(a.write(0, &[1u8; 4096]), 0);
    assert_eq!(b.write(4096, &[2u8; 4096]), 0);
    // A third is refused at GO, and says why.
    let mut c = Client::connect(rig.addr());
    let err = c.go(VOL, &[]).unwrap_err();
    assert_eq!(err.0, REP_ERR_POLICY);
    assert_eq!(
        err.1,
        "server is at its limit of 2 connections; try again later"
    );
    // ...but its session goes on: it may list, and ask again once a slot is free.
    assert!(c.option(OPT_LIST, &[]).last().unwrap().0 == REP_ACK);
    drop(a);
    let t = Instant::now();
    loop {
        match c.go(VOL, &[]) {
            Ok(_) => break,
            Err(e) => assert_eq!(e.0, REP_ERR_POLICY),
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the slot never came back"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(c.read(0, 4096).unwrap(), vec![1u8; 4096]);
    // The oldest idle sockets gave way to newer ones at once; the rest end by the deadline,
    // and so does the half-done handshake, however many bytes it sends in that time.
    let t = Instant::now();
    for s in idle.iter_mut().chain(std::iter::once(&mut half)) {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 64];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {} // the greeting
            }
        }
    }
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(b.write(8192, &[3u8; 4096]), 0);
}

#[test]
fn a_client_that_stops_reading_is_dropped_after_the_write_timeout() {
    let rig = Rig::new(ServerConfig {
        write_timeout: Duration::from_secs(1),
        ..Default::default()
    });
    let mut other = Client::open(rig.addr(), VOL);
    let hostile = reader_that_never_reads_rig(rig.addr());
    // Meanwhile the others are served at once.
    let t = Instant::now();
    for i in 0..32u64 {
        assert_eq!(other.write(i * 65536, &vec![7u8; 65536]), 0);
        assert_eq!(other.read(i * 65536, 65536).unwrap(), vec![7u8; 65536]);
    }
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // The hostile client's socket ends: after what was sent, end-of-file or a reset.
    let (mut s, t) = hostile.join().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0usize;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => {
                let waited = matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
                assert!(!waited, "the server never dropped the client");
                break;
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    assert!(secs < 8.0, "dropped after {secs:.1} s");
    assert!(got < 4000 * 65536, "every reply was sent ({got} bytes)");
    rig.assert_serving();
}

/// As `reader_that_never_reads`, for the rig's export; returns its socket once it stopped
/// sending, and when it started.
fn reader_that_never_reads_rig(addr: SocketAddr) -> std::thread::JoinHandle<(TcpStream, Instant)> {
    let c = Client::open(addr, VOL);
    let mut s = c.s;
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    std::thread::spawn(move || {
        let t = Instant::now();
        for i in 0..4000u64 {
            let h = request_header(CMD_READ, 0, i, (i % 100) * 65536, 65536);
            if s.write_all(&h).is_err() {
                break;
            }
        }
        // Read nothing for well past the write timeout.
        std::thread::sleep(Duration::from_millis(2500));
        (s, t)
    })
}
