//! The NBD server against a raw client: negotiation, every command, durability across
//! connections, and bad input (each case leaves the server up for other connections).

mod common;

use std::io::Write;
use std::sync::Arc;

use common::nbd_client::Client;
use common::rig::{Rig, VOL, VOLSIZE};
use common::*;
use zeta::dsl::Pool;
use zeta::nbd::proto::*;
use zeta::nbd::{PoolExports, Server, ServerConfig};
use zeta::vdev::mem::{Faults, PowerCut};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn list_info_and_every_command() {
    let rig = Rig::default();
    let mut c = Client::connect(rig.addr());
    let list = c.option(OPT_LIST, &[]);
    let names: Vec<String> = list
        .iter()
        .filter(|(k, _)| *k == REP_SERVER)
        .map(|(_, d)| {
            let n = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
            String::from_utf8(d[4..4 + n].to_vec()).unwrap()
        })
        .collect();
    assert_eq!(names, ["tank/v", "tank/w"]);
    // INFO with block sizes, name and description, then GO.
    let info = c.option(
        OPT_INFO,
        &Client::info_data("tank/w", &[INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION]),
    );
    let bs = info
        .iter()
        .find(|(k, d)| *k == REP_INFO && d[0..2] == INFO_BLOCK_SIZE.to_be_bytes())
        .expect("block size info");
    let field = |i: usize| u32::from_be_bytes(bs.1[2 + 4 * i..6 + 4 * i].try_into().unwrap());
    assert_eq!((field(0), field(1), field(2)), (512, 16384, 32 << 20));
    assert!(info
        .iter()
        .any(|(k, d)| *k == REP_INFO && d[2..] == *b"tank/w"));
    c.structured();
    c.set_meta(VOL);
    let (size, flags) = c.go(VOL, &[]).unwrap();
    assert_eq!(size, VOLSIZE);
    for f in [
        TF_HAS_FLAGS,
        TF_SEND_FLUSH,
        TF_SEND_FUA,
        TF_SEND_TRIM,
        TF_SEND_WRITE_ZEROES,
        TF_SEND_CACHE,
        TF_CAN_MULTI_CONN,
        TF_SEND_FAST_ZERO,
    ] {
        assert_ne!(flags & f, 0, "flag {f:#x}");
    }
    assert_eq!(flags & TF_READ_ONLY, 0);

    // Never-written space is a hole.
    let r = c.call(CMD_BLOCK_STATUS, 0, 0, VOLSIZE as u32, &[]);
    assert_eq!(r.extents, vec![(VOLSIZE as u32, STATE_HOLE | STATE_ZERO)]);
    // Unaligned write (no alignment promised) is read-modify-written.
    let data = pattern(10_000, 3);
    assert_eq!(c.write(1000, &data), 0);
    assert_eq!(c.read(1000, 10_000).unwrap(), data);
    assert_eq!(
        c.call(CMD_WRITE, CMD_FLAG_FUA, 65536, 4096, &pattern(4096, 5))
            .error,
        0
    );
    assert_eq!(c.call(CMD_FLUSH, 0, 0, 0, &[]).error, 0);
    let r = c.call(CMD_BLOCK_STATUS, 0, 0, 128 << 10, &[]);
    assert_eq!(
        r.extents,
        vec![(12288, 0), (53248, 3), (4096, 0), (61440, 3)],
        "data at blocks 0-2 and 16"
    );
    let one = c.call(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 128 << 10, &[]);
    assert_eq!(one.extents, vec![(12288, 0)]);
    // TRIM and WRITE_ZEROES read back as zeros and become holes.
    assert_eq!(c.call(CMD_TRIM, 0, 0, 8192, &[]).error, 0);
    assert_eq!(
        c.call(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 65536, 4096, &[])
            .error,
        0
    );
    assert_eq!(c.read(0, 8192).unwrap(), vec![0u8; 8192]);
    assert_eq!(c.read(65536, 4096).unwrap(), vec![0u8; 4096]);
    let r = c.call(CMD_BLOCK_STATUS, 0, 0, 128 << 10, &[]);
    assert_eq!(r.extents, vec![(8192, 3), (4096, 0), (118784, 3)]);
    // NO_HOLE zeroing writes zeros; with FAST_ZERO it refuses rather than be slow.
    assert_eq!(
        c.call(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 8192, 4096, &[])
            .error,
        0
    );
    assert_eq!(c.read(8192, 4096).unwrap(), vec![0u8; 4096]);
    assert_eq!(
        c.call(
            CMD_WRITE_ZEROES,
            CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            0,
            4096,
            &[]
        )
        .error,
        ENOTSUP
    );
    assert_eq!(c.call(CMD_CACHE, 0, 0, 1 << 20, &[]).error, 0);
    // DISC: the server closes after replying to what it started.
    c.send(CMD_DISC, 0, 1, 0, 0, &[]).unwrap();
    assert!(c.closed());
    rig.assert_serving();
}

#[test]
fn simple_replies_and_export_name() {
    let rig = Rig::default();
    let mut c = Client::connect(rig.addr());
    c.send_option(OPT_EXPORT_NAME, b"tank/v").unwrap();
    let mut h = [0u8; 10];
    std::io::Read::read_exact(&mut c.s, &mut h).unwrap();
    assert_eq!(u64::from_be_bytes(h[0..8].try_into().unwrap()), VOLSIZE);
    let data = pattern(8192, 1);
    assert_eq!(c.write(4096, &data), 0);
    assert_eq!(c.read(4096, 8192).unwrap(), data);
    // BLOCK_STATUS without a negotiated context is refused, not a crash.
    assert_eq!(c.call(CMD_BLOCK_STATUS, 0, 0, 4096, &[]).error, EINVAL);
    // An export name that does not exist ends the session (EXPORT_NAME cannot carry errors).
    let mut c = Client::connect(rig.addr());
    c.send_option(OPT_EXPORT_NAME, b"tank/nope").unwrap();
    assert!(c.closed());
    rig.assert_serving();
}

#[test]
fn unknown_option_and_unknown_export_keep_the_session() {
    let rig = Rig::default();
    let mut c = Client::connect(rig.addr());
    let r = c.option(999, b"whatever");
    assert_eq!(r.last().unwrap().0, REP_ERR_UNSUP);
    let r = c.option(OPT_LIST, b"junk");
    assert_eq!(r.last().unwrap().0, REP_ERR_INVALID);
    let err = c.go("tank/nope", &[]).unwrap_err();
    assert_eq!(err.0, REP_ERR_UNKNOWN);
    assert!(err.1.contains("tank/nope"), "{}", err.1);
    // Malformed GO data (name length past the end).
    let mut bad = 100u32.to_be_bytes().to_vec();
    bad.extend_from_slice(b"tank/v\0\0");
    assert_eq!(c.option(OPT_GO, &bad).last().unwrap().0, REP_ERR_INVALID);
    // Meta contexts need structured replies first.
    let mut meta = 6u32.to_be_bytes().to_vec();
    meta.extend_from_slice(b"tank/v");
    meta.extend_from_slice(&0u32.to_be_bytes());
    assert_eq!(
        c.option(OPT_SET_META_CONTEXT, &meta).last().unwrap().0,
        REP_ERR_INVALID
    );
    // Still negotiating: GO to a real export works.
    assert!(c.go(VOL, &[]).is_ok());
    assert_eq!(c.write(0, &[1u8; 512]), 0);
    // ABORT is acknowledged.
    let mut a = Client::connect(rig.addr());
    assert_eq!(a.option(OPT_ABORT, &[]), vec![(REP_ACK, vec![])]);
    assert!(a.closed());
}

#[test]
fn wrong_magic_drops_only_that_connection() {
    let rig = Rig::default();
    let mut other = Client::open(rig.addr(), VOL);
    // Bad option magic during negotiation.
    let mut c = Client::connect(rig.addr());
    c.s.write_all(&[0xde; 16]).unwrap();
    assert!(c.closed());
    // Bad request magic during transmission.
    let mut c = Client::open(rig.addr(), VOL);
    c.s.write_all(&[0xad; 28]).unwrap();
    assert!(c.closed());
    // Unknown client flags.
    let mut s = std::net::TcpStream::connect(rig.addr()).unwrap();
    let mut g = [0u8; 18];
    std::io::Read::read_exact(&mut s, &mut g).unwrap();
    s.write_all(&0xffff_0000u32.to_be_bytes()).unwrap();
    let mut b = [0u8; 1];
    assert!(matches!(
        std::io::Read::read(&mut s, &mut b),
        Ok(0) | Err(_)
    ));
    assert_eq!(other.write(0, &[5u8; 4096]), 0);
    rig.assert_serving();
}

#[test]
fn oversized_option_data() {
    let rig = Rig::default();
    let mut c = Client::connect(rig.addr());
    let r = c.option(OPT_INFO, &vec![0u8; 100_000]);
    assert_eq!(r.last().unwrap().0, REP_ERR_TOO_BIG);
    assert!(
        c.go(VOL, &[]).is_ok(),
        "the session goes on after a too-big option"
    );
    // Absurd lengths end the session without the server reading them.
    let mut c = Client::connect(rig.addr());
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&OPT_GO.to_be_bytes());
    m.extend_from_slice(&u32::MAX.to_be_bytes());
    c.s.write_all(&m).unwrap();
    assert!(c.closed());
    rig.assert_serving();
}

#[test]
fn requests_past_the_end_too_long_or_unknown() {
    let rig = Rig::default();
    let mut c = Client::open(rig.addr(), VOL);
    assert_eq!(c.read(VOLSIZE - 512, 1024).unwrap_err(), EINVAL);
    assert_eq!(c.write(VOLSIZE - 512, &[1u8; 1024]), ENOSPC);
    assert_eq!(c.call(CMD_TRIM, 0, VOLSIZE, 4096, &[]).error, EINVAL);
    assert_eq!(c.call(CMD_READ, 0, u64::MAX - 10, 4096, &[]).error, EINVAL);
    // Above the maximum payload: refused; a write's payload is consumed so framing holds.
    assert_eq!(c.call(CMD_READ, 0, 0, MAX_PAYLOAD + 512, &[]).error, EINVAL);
    let big = vec![7u8; MAX_PAYLOAD as usize + 512];
    assert_eq!(
        c.call(CMD_WRITE, 0, 0, big.len() as u32, &big).error,
        EINVAL
    );
    assert_eq!(c.call(77, 0, 0, 0, &[]).error, EINVAL, "unknown command");
    // Nothing of the refused requests landed; the session still works.
    assert_eq!(c.read(0, 4096).unwrap(), vec![0u8; 4096]);
    assert_eq!(c.read(VOLSIZE - 512, 512).unwrap(), vec![0u8; 512]);
    rig.assert_serving();
}

#[test]
fn misaligned_requests_are_refused_only_when_alignment_was_promised() {
    let rig = Rig::default();
    let mut c = Client::connect(rig.addr());
    c.structured();
    c.go(VOL, &[INFO_BLOCK_SIZE]).unwrap();
    assert_eq!(c.write(100, &[1u8; 512]), EINVAL);
    assert_eq!(c.write(512, &[1u8; 100]), EINVAL);
    assert_eq!(c.read(1, 512).unwrap_err(), EINVAL);
    assert_eq!(c.write(512, &[1u8; 512]), 0);
    // Without the promise the same request is served (read-modify-write).
    let mut d = Client::open(rig.addr(), VOL);
    assert_eq!(d.write(100, &[2u8; 512]), 0);
    assert_eq!(d.read(100, 512).unwrap(), vec![2u8; 512]);
}

#[test]
fn disconnects_mid_request_and_mid_payload() {
    let rig = Rig::default();
    {
        let mut c = Client::open(rig.addr(), VOL);
        c.s.write_all(&REQUEST_MAGIC.to_be_bytes()[..3]).unwrap();
    }
    {
        let mut c = Client::open(rig.addr(), VOL);
        let mut m = request_header(CMD_WRITE, 0, 1, 1 << 20, 65536).to_vec();
        m.extend_from_slice(&[0xee; 1000]);
        c.s.write_all(&m).unwrap();
    }
    let mut c = Client::open(rig.addr(), VOL);
    // The half-sent write never happened.
    assert_eq!(c.read(1 << 20, 65536).unwrap(), vec![0u8; 65536]);
    rig.assert_serving();
}

#[test]
fn connections_above_the_limit_are_refused_cleanly() {
    let rig = Rig::new(ServerConfig {
        max_connections: 2,
        ..Default::default()
    });
    let a = Client::open(rig.addr(), VOL);
    let mut b = Client::open(rig.addr(), VOL);
    let mut c = Client::connect(rig.addr());
    let err = c.go(VOL, &[]).unwrap_err();
    assert_eq!(err.0, REP_ERR_POLICY);
    assert!(err.1.contains("limit of 2"), "{}", err.1);
    drop(a);
    // The slot frees once the server notices the close.
    let mut ok = false;
    for _ in 0..100 {
        let mut d = Client::connect(rig.addr());
        if d.go(VOL, &[]).is_ok() {
            assert_eq!(d.write(0, &[3u8; 512]), 0);
            ok = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(ok, "a slot came free after a client left");
    assert_eq!(b.write(512, &[4u8; 512]), 0);
}

#[test]
fn read_only_exports_refuse_changes() {
    let rig = Rig::new(ServerConfig {
        read_only: true,
        ..Default::default()
    });
    let mut c = Client::connect(rig.addr());
    c.structured();
    let (_, flags) = c.go(VOL, &[]).unwrap();
    assert_ne!(flags & TF_READ_ONLY, 0);
    assert_eq!(c.write(0, &[1u8; 512]), EPERM);
    assert_eq!(c.call(CMD_TRIM, 0, 0, 4096, &[]).error, EPERM);
    assert_eq!(c.call(CMD_WRITE_ZEROES, 0, 0, 4096, &[]).error, EPERM);
    assert_eq!(c.read(0, 512).unwrap(), vec![0u8; 512]);
    assert_eq!(c.call(CMD_FLUSH, 0, 0, 0, &[]).error, 0);
}

#[test]
fn many_requests_in_flight_reply_by_cookie() {
    let rig = Rig::default();
    let mut c = Client::open(rig.addr(), VOL);
    let n = 64u64;
    for i in 0..n {
        c.send(CMD_WRITE, 0, i, i * 65536, 65536, &pattern(65536, i as u8))
            .unwrap();
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..n {
        let r = c.recv().unwrap();
        assert_eq!(r.error, 0);
        assert!(seen.insert(r.cookie));
    }
    for i in 0..n {
        c.send(CMD_READ, 0, 1000 + i, i * 65536, 65536, &[])
            .unwrap();
    }
    for _ in 0..n {
        let r = c.recv().unwrap();
        assert_eq!(r.error, 0);
        assert_eq!(
            r.data,
            pattern(65536, (r.cookie - 1000) as u8),
            "cookie {}",
            r.cookie
        );
    }
}

/// Large and small writes, reads and a flush sent as one stream, in one `write` and then in
/// pieces cut at odd places: the server reads a header after a large write from the socket on
/// its own (its payload then skips the reader's buffer) and everything else through the
/// buffer. Every request is answered once and every write lands where it was aimed.
#[test]
fn large_and_small_requests_mixed_in_one_stream() {
    let rig = Rig::default();
    let mut c = Client::open(rig.addr(), VOL);
    let sizes = [65536usize, 4096, 131072, 32768, 8192, 40960, 4096, 262144];
    for (round, piece) in [(0u8, usize::MAX), (1, 1000), (2, 28)] {
        let mut stream = Vec::new();
        let mut at = 0u64;
        let mut written = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let data = pattern(len, round * 16 + i as u8);
            stream.extend_from_slice(&request_header(CMD_WRITE, 0, i as u64, at, len as u32));
            stream.extend_from_slice(&data);
            if i % 3 == 2 {
                stream.extend_from_slice(&request_header(CMD_FLUSH, 0, 100 + i as u64, 0, 0));
            }
            written.push((at, data));
            at += len as u64 + 4096;
        }
        let flushes = sizes.len() / 3;
        for chunk in stream.chunks(piece.min(stream.len())) {
            c.s.write_all(chunk).unwrap();
        }
        let mut seen = std::collections::HashSet::new();
        for _ in 0..sizes.len() + flushes {
            let r = c.recv().unwrap();
            assert_eq!(r.error, 0, "round {round} cookie {}", r.cookie);
            assert!(
                seen.insert(r.cookie),
                "round {round}: cookie {} twice",
                r.cookie
            );
        }
        for (at, data) in written {
            assert_eq!(
                c.read(at, data.len() as u32).unwrap(),
                data,
                "round {round} at {at}"
            );
        }
    }
    rig.assert_serving();
}

/// CAN_MULTI_CONN is advertised, so a FLUSH on one connection must make the writes replied
/// to on another durable; FUA must make its own write durable. Checked by a power cut of the
/// simulated devices right after the reply, then an import of what survived.
#[test]
fn flush_and_fua_are_durable_across_connections() {
    let rig = Rig::new(ServerConfig::default());
    // Two connections to one export (what CAN_MULTI_CONN promises): B's FLUSH covers the
    // write A had completed.
    let mut a = Client::open(rig.addr(), VOL);
    let mut b = Client::open(rig.addr(), VOL);
    let da = pattern(65536, 11);
    let db = pattern(65536, 12);
    assert_eq!(a.write(0, &da), 0);
    assert_eq!(b.write(65536, &db), 0);
    assert_eq!(b.call(CMD_FLUSH, 0, 0, 0, &[]).error, 0);
    let survived = power_cut(&rig.devs, PowerCut::DropUnflushed);
    let dfua = pattern(4096, 13);
    assert_eq!(
        a.call(CMD_WRITE, CMD_FLAG_FUA, 1 << 20, 4096, &dfua).error,
        0
    );
    let survived_fua = power_cut(&rig.devs, PowerCut::DropUnflushed);

    let p = import(&survived);
    let v = zeta::zvol::Volume::open(&p, "v").unwrap();
    let mut buf = vec![0u8; 65536];
    v.read(0, &mut buf).unwrap();
    assert_eq!(buf, da, "write on connection A, flushed by B");
    v.read(65536, &mut buf).unwrap();
    assert_eq!(buf, db);
    p.close().unwrap();

    let p = import(&survived_fua);
    let v = zeta::zvol::Volume::open(&p, "v").unwrap();
    let mut buf = vec![0u8; 4096];
    v.read(1 << 20, &mut buf).unwrap();
    assert_eq!(buf, dfua, "FUA write");
    p.close().unwrap();
}

/// A full file system under the pool's devices (simulated: every write gets ENOSPC, as a
/// sparse file's unwritten blocks do there): the txg waits for room, and meanwhile a FUA
/// write whose commit waited with it, other writes and FLUSHes are answered ENOSPC at once,
/// not EIO and not left waiting (so a client such as qemu pauses its guest, `werror=enospc`,
/// and its pause, which drains and flushes, completes), and reads are served. Once room is
/// made the pool resumes by itself: a FLUSH then succeeds, and covers the FUA write that
/// was refused, whose data was kept.
#[test]
fn a_full_file_system_is_answered_enospc_and_resumes_when_room_is_made() {
    let rig = Rig::default();
    let mut c = Client::open(rig.addr(), VOL);
    let kept = pattern(65536, 21);
    assert_eq!(c.write(0, &kept), 0);
    assert_eq!(c.call(CMD_FLUSH, 0, 0, 0, &[]).error, 0);
    for d in &rig.devs {
        d.set_faults(Faults {
            full: true,
            ..Faults::default()
        });
    }
    let fua = pattern(4096, 22);
    c.send(CMD_WRITE, CMD_FLAG_FUA, 7, 1 << 20, 4096, &fua)
        .unwrap();
    let mut suspended = false;
    for _ in 0..500 {
        if rig
            .pool
            .suspension()
            .is_some_and(|s| s.out_of_space && s.retrying)
        {
            suspended = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(suspended, "the FUA write's txg waits for room");
    let r = c.recv().unwrap();
    assert_eq!(
        (r.cookie, r.error),
        (7, ENOSPC),
        "the FUA write, not left waiting"
    );
    assert_eq!(
        c.call(CMD_FLUSH, 0, 0, 0, &[]).error,
        ENOSPC,
        "a FLUSH meanwhile"
    );
    let mut other = Client::open(rig.addr(), VOL);
    assert_eq!(
        other.write(2 << 20, &pattern(4096, 23)),
        ENOSPC,
        "a write meanwhile"
    );
    assert_eq!(other.read(0, 65536).unwrap(), kept, "reads go on");

    for d in &rig.devs {
        d.set_faults(Faults::default());
    }
    for _ in 0..500 {
        if rig.pool.suspension().is_none() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(rig.pool.suspension().is_none(), "resumed");
    assert_eq!(
        c.call(CMD_FLUSH, 0, 0, 0, &[]).error,
        0,
        "a FLUSH, once room is made"
    );
    assert_eq!(
        other.write(2 << 20, &pattern(4096, 24)),
        0,
        "writes are taken again"
    );

    let survived = power_cut(&rig.devs, PowerCut::DropUnflushed);
    let p = import(&survived);
    let v = zeta::zvol::Volume::open(&p, "v").unwrap();
    let mut buf = vec![0u8; 65536];
    v.read(0, &mut buf).unwrap();
    assert_eq!(buf, kept, "flushed before the file system filled");
    let mut buf = vec![0u8; 4096];
    v.read(1 << 20, &mut buf).unwrap();
    assert_eq!(
        buf, fua,
        "the refused FUA write, kept and covered by the FLUSH after"
    );
    drop(v);
    p.close().unwrap();
}

#[test]
fn shutdown_answers_started_requests_then_closes() {
    let mut rig = Rig::default();
    let mut c = Client::open(rig.addr(), VOL);
    for i in 0..16u64 {
        c.send(CMD_WRITE, 0, i, i * 4096, 4096, &pattern(4096, i as u8))
            .unwrap();
    }
    // Wait for the first reply so the server is surely mid-stream, then stop it.
    let first = c.recv().unwrap();
    assert_eq!(first.error, 0);
    rig.server.take().unwrap().shutdown();
    let mut acked = vec![first.cookie];
    while let Ok(r) = c.recv() {
        assert_eq!(r.error, 0);
        acked.push(r.cookie);
    }
    // Everything acknowledged is in the pool.
    let v = zeta::zvol::Volume::open(&rig.pool, "v").unwrap();
    for i in acked {
        let mut buf = vec![0u8; 4096];
        v.read(i * 4096, &mut buf).unwrap();
        assert_eq!(buf, pattern(4096, i as u8));
    }
}

/// Many partial writes in flight to the same few blocks of a volume on raidz2: each one
/// reads its block (a parallel read of the stripe's columns) while holding the block's range
/// lock, and the others queue on that lock. A request worker that ran another request while
/// waiting for its column reads would deadlock on its own lock; every reply must come.
#[test]
fn partial_writes_in_flight_to_one_raidz_block_all_complete() {
    let devs = mem_devs(6, 64 * MB);
    // No block cache to speak of: a partial write must read its block's columns.
    let tiny_cache = zeta::dsl::PoolOptions {
        cache_bytes: 16 * 1024,
        ..opts()
    };
    let pool = Pool::create("tank", spec(Layout::Raidz2, &devs), tiny_cache).unwrap();
    pool.create_volume("v", VOLSIZE, 16384, None).unwrap();
    // Fill, so partial writes must read their blocks back from the columns.
    {
        let vol = zeta::zvol::Volume::open(&pool, "v").unwrap();
        vol.write(0, &pattern(MB as usize, 3)).unwrap();
        vol.flush().unwrap();
    }
    let exports = Arc::new(PoolExports::new(vec![pool.clone()], None));
    let server = Server::start(
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..ServerConfig::default()
        },
        exports,
    )
    .unwrap();
    let mut c = Client::open(server.local_addr(), VOL);
    let mut expect = pattern(MB as usize, 3);
    for round in 0..20u64 {
        // 16 x 4 KiB into the same four 16 KiB blocks, all in flight at once.
        for i in 0..16u64 {
            let off = ((i * 4096) + round * 8192) % (64 * 1024);
            let data = vec![(round * 64 + i) as u8; 4096];
            c.send(CMD_WRITE, 0, i + 1, off, 4096, &data).unwrap();
            expect[off as usize..off as usize + 4096].copy_from_slice(&data);
        }
        // Every write replied (the client's read timeout turns a deadlock into a failure).
        for _ in 0..16 {
            assert_eq!(c.recv().expect("reply before the timeout").error, 0);
        }
        // Commit, so the next round's first write to each block reads it from the columns.
        pool.sync_now().unwrap();
    }
    // Within a round no two writes overlap, so the result is exact.
    let got = c.read(0, 64 * 1024).unwrap();
    assert!(got == expect[..64 * 1024], "data differs");
    drop(c);
    server.shutdown();
    pool.close().unwrap();
}

/// A panic below a request (here a device that panics on read, standing in for a bug or
/// bytes no check caught) answers that request EIO. The connection goes on, and the server
/// stops cleanly: unanswered, the request kept its connection from draining and the server
/// from stopping (or, run by the connection's own thread, ended the connection).
#[test]
fn a_panic_under_a_request_answers_it_eio_and_the_connection_goes_on() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use zeta::vdev::BlockDevice;
    use zeta::zvol::Volume;
    let dev = mem_devs(1, 64 * MB).remove(0);
    let data = pattern(65536, 9);
    {
        let pool = Pool::create(
            "tank",
            spec(Layout::Stripe, std::slice::from_ref(&dev)),
            opts(),
        )
        .unwrap();
        pool.create_volume("v", VOLSIZE, 16384, None).unwrap();
        Volume::open(&pool, "v").unwrap().write(0, &data).unwrap();
        pool.close().unwrap();
    }
    // Imported again, so the volume's blocks are read from the device, not a cache.
    let armed = Arc::new(AtomicBool::new(false));
    let tap = Tap {
        on_read: panics_while(&armed, "injected: a device read panics"),
        ..Tap::new(dev.clone())
    };
    let leaves = vec![(Arc::new(tap) as Arc<dyn BlockDevice>, "mem0".to_string())];
    let pool = Pool::import(leaves, None, opts()).unwrap();
    let exports = Arc::new(PoolExports::new(vec![pool.clone()], None));
    let cfg = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..ServerConfig::default()
    };
    let server = Server::start(cfg, exports).unwrap();
    let mut c = Client::open(server.local_addr(), "tank/v");
    armed.store(true, Ordering::SeqCst);
    assert_eq!(c.read(0, 16384), Err(EIO));
    armed.store(false, Ordering::SeqCst);
    assert_eq!(c.read(0, 65536).unwrap(), data, "the connection goes on");
    drop(c);
    server.shutdown();
    pool.close().unwrap();
}

/// `zeta:changed:SNAP` beside `base:allocation`: listed for every snapshot of the export's
/// volume, selected together, and BLOCK_STATUS answers one descriptor list per context: the
/// changed one flags exactly the blocks written since the snapshot (synced or not), for a
/// volume and for a later snapshot of it; a snapshot that does not exist is not selected.
#[test]
fn block_status_tells_what_changed_since_a_snapshot() {
    let rig = Rig::default();
    let mut c = Client::open(rig.addr(), VOL);
    assert_eq!(c.write(0, &vec![1u8; 64 * 1024]), 0);
    drop(c);
    rig.pool.snapshot(&["v@s1"]).unwrap();
    let mut c = Client::open(rig.addr(), VOL);
    assert_eq!(c.write(16 * 4096, &vec![2u8; 8192]), 0); // blocks 16, 17
    drop(c);
    rig.pool.sync_now().unwrap();
    let mut c = Client::open(rig.addr(), VOL);
    assert_eq!(c.write(100 * 4096, &vec![3u8; 4096]), 0); // block 100, not synced
    drop(c);

    let mut c = Client::connect(rig.addr());
    c.structured();
    let listed = c.meta_contexts(OPT_LIST_META_CONTEXT, VOL, &[]);
    assert!(
        listed.contains(&(ZETA_CHANGED_ID, "zeta:changed:s1".to_string())),
        "{listed:?}"
    );
    assert!(c
        .meta_contexts(OPT_SET_META_CONTEXT, VOL, &["zeta:changed:nope"])
        .is_empty());
    let set = c.meta_contexts(
        OPT_SET_META_CONTEXT,
        VOL,
        &[BASE_ALLOCATION, "zeta:changed:s1"],
    );
    assert_eq!(set.len(), 2, "{set:?}");
    c.go(VOL, &[]).unwrap();
    let r = c.call(CMD_BLOCK_STATUS, 0, 0, 128 * 4096, &[]);
    assert_eq!(r.error, 0);
    let ids: Vec<u32> = r.contexts.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [BASE_ALLOCATION_ID, ZETA_CHANGED_ID]);
    // Expand the changed list to blocks.
    let blocks = |list: &[(u32, u32)]| -> Vec<u64> {
        let mut at = 0u64;
        let mut v = Vec::new();
        for &(len, flags) in list {
            if flags & STATE_CHANGED != 0 {
                v.extend(at / 4096..(at + len as u64) / 4096);
            }
            at += len as u64;
        }
        v
    };
    let changed = blocks(&r.contexts[1].1);
    assert!(
        changed.contains(&16) && changed.contains(&17) && changed.contains(&100),
        "{changed:?}"
    );
    assert!(
        !changed.iter().any(|b| *b < 16),
        "the first 64K is as at s1: {changed:?}"
    );
    // Holes next to them, under indirect blocks rewritten since, were holes at s1 too.
    assert!(
        !changed.iter().any(|b| (18..100).contains(b)),
        "{changed:?}"
    );
    drop(c);

    // A later snapshot against the earlier one.
    rig.pool.snapshot(&["v@s2"]).unwrap();
    let mut c = Client::connect(rig.addr());
    c.structured();
    let set = c.meta_contexts(OPT_SET_META_CONTEXT, "tank/v@s2", &["zeta:changed:s1"]);
    assert_eq!(set.len(), 1);
    // The snapshot itself is no base for itself, nor a later one.
    assert!(c
        .meta_contexts(OPT_LIST_META_CONTEXT, "tank/v@s1", &["zeta:"])
        .is_empty());
    c.meta_contexts(OPT_SET_META_CONTEXT, "tank/v@s2", &["zeta:changed:s1"]);
    c.go("tank/v@s2", &[]).unwrap();
    let r = c.call(CMD_BLOCK_STATUS, 0, 0, 128 * 4096, &[]);
    assert_eq!(r.contexts.len(), 1);
    let changed = blocks(&r.contexts[0].1);
    assert!(
        changed.contains(&16) && changed.contains(&100),
        "{changed:?}"
    );
    assert!(!changed.iter().any(|b| *b < 16), "{changed:?}");
    rig.assert_serving();
}
