//! Random and mutated NBD traffic against a running server: plausible sessions (options,
//! then requests of every command with random flags, offsets and lengths) with bytes
//! flipped, dropped or inserted, and streams cut off anywhere. After each, the server must
//! close the connection once the client stops sending (no hang), no thread may have
//! panicked, and at the end a witness volume no fuzzed session could name still holds what
//! was written to it, the pool verifies, and a fresh session is served.
//!
//! `ZETA_FUZZ_SEED` picks the first session's seed (printed on failure), `ZETA_FUZZ_SESSIONS`
//! how many run (2000).

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;

use common::nbd_client::Client;
use common::rig::{Rig, VOL, VOLSIZE};
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use zeta::nbd::proto::*;

/// The export fuzzed sessions open.
const TARGET: &str = VOL;
/// The witness, made by the test: no generated session names it, and no mutation of one
/// that names the target can. Its name is twice the target's length, so only an insertion of
/// those very bytes with a matching length field could. (The rig's `tank/w` is one flipped
/// bit from `tank/v`: 200000 sessions from seed 578749756008 named it 19 times and wrote
/// over the witness's data.)
const WITNESS: &str = "tank/witness";

fn option(opt: u32, data: &[u8]) -> Vec<u8> {
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    m
}

fn random_bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let mut v = vec![0u8; rng.gen_range(0..=max)];
    rng.fill_bytes(&mut v);
    v
}

/// An export name: mostly the target, sometimes nothing, an unknown one or junk.
fn name(rng: &mut StdRng) -> Vec<u8> {
    match rng.gen_range(0..6) {
        0 => Vec::new(),
        1 => b"tank/nope".to_vec(),
        2 => random_bytes(rng, 40),
        _ => TARGET.as_bytes().to_vec(),
    }
}

/// The data of an `INFO` or `GO` option, its counts sometimes wrong.
fn info_data(rng: &mut StdRng) -> Vec<u8> {
    let n = name(rng);
    let len = if rng.gen_ratio(1, 8) {
        rng.gen()
    } else {
        n.len() as u32
    };
    let mut d = len.to_be_bytes().to_vec();
    d.extend_from_slice(&n);
    let infos: Vec<u16> = (0..rng.gen_range(0..4))
        .map(|_| rng.gen_range(0..6))
        .collect();
    let count = if rng.gen_ratio(1, 8) {
        rng.gen()
    } else {
        infos.len() as u16
    };
    d.extend_from_slice(&count.to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// The data of a `SET_META_CONTEXT` or `LIST_META_CONTEXT` option.
fn meta_data(rng: &mut StdRng) -> Vec<u8> {
    let n = name(rng);
    let mut d = (n.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(&n);
    let queries: Vec<Vec<u8>> = (0..rng.gen_range(0..3))
        .map(|_| match rng.gen_range(0..3) {
            0 => BASE_ALLOCATION.as_bytes().to_vec(),
            1 => b"base:".to_vec(),
            _ => random_bytes(rng, 30),
        })
        .collect();
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(&q);
    }
    d
}

/// One transmission request, with its payload if it is a write.
fn request(rng: &mut StdRng) -> Vec<u8> {
    let kind = if rng.gen_ratio(1, 10) {
        rng.gen()
    } else {
        rng.gen_range(0..8)
    };
    let flags = if rng.gen_ratio(1, 10) {
        rng.gen()
    } else {
        let known = [
            CMD_FLAG_FUA,
            CMD_FLAG_NO_HOLE,
            CMD_FLAG_REQ_ONE,
            CMD_FLAG_FAST_ZERO,
        ];
        known
            .iter()
            .filter(|_| rng.gen_ratio(1, 4))
            .fold(0, |a, f| a | f)
    };
    let offset = match rng.gen_range(0..10) {
        0 => rng.gen(),
        1 => VOLSIZE - rng.gen_range(0..8192),
        _ => rng.gen_range(0..VOLSIZE / 512) * 512,
    };
    let len: u32 = match rng.gen_range(0..10) {
        0 => rng.gen(),
        1 => 0,
        2 => rng.gen_range(1..4096),
        _ => rng.gen_range(1..=32) * 512,
    };
    let mut m = request_header(kind, flags, rng.gen(), offset, len).to_vec();
    if kind == CMD_WRITE {
        // The whole payload when it is small, otherwise a piece (the session ends in it).
        let send = if len <= 65536 {
            len as usize
        } else {
            rng.gen_range(0..4096)
        };
        let at = m.len();
        m.resize(at + send, 0);
        rng.fill_bytes(&mut m[at..]);
    }
    m
}

/// A session as a client might send it, then damaged: flags, options, perhaps a `GO` and
/// requests; then bytes flipped, inserted or the stream cut short.
fn session(rng: &mut StdRng) -> Vec<u8> {
    let flags = if rng.gen_ratio(1, 20) {
        rng.gen()
    } else {
        FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES
    };
    let mut m = flags.to_be_bytes().to_vec();
    for _ in 0..rng.gen_range(0..4) {
        let opt = match rng.gen_range(0..10) {
            0 => rng.gen(),
            n => [
                OPT_LIST,
                OPT_INFO,
                OPT_STRUCTURED_REPLY,
                OPT_LIST_META_CONTEXT,
                OPT_SET_META_CONTEXT,
                OPT_ABORT,
                OPT_EXPORT_NAME,
                OPT_GO,
                OPT_INFO,
            ][n as usize - 1],
        };
        let data = match opt {
            OPT_INFO | OPT_GO => info_data(rng),
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => meta_data(rng),
            OPT_EXPORT_NAME => name(rng),
            _ if rng.gen_ratio(1, 2) => Vec::new(),
            _ => random_bytes(rng, 100),
        };
        m.extend_from_slice(&option(opt, &data));
    }
    if rng.gen_ratio(3, 4) {
        if rng.gen_ratio(1, 2) {
            m.extend_from_slice(&option(OPT_STRUCTURED_REPLY, &[]));
        }
        let mut go = (TARGET.len() as u32).to_be_bytes().to_vec();
        go.extend_from_slice(TARGET.as_bytes());
        go.extend_from_slice(&0u16.to_be_bytes());
        m.extend_from_slice(&option(OPT_GO, &go));
        for _ in 0..rng.gen_range(0..20) {
            m.extend_from_slice(&request(rng));
        }
    }
    if rng.gen_ratio(1, 3) {
        for _ in 0..rng.gen_range(1..=3) {
            if m.is_empty() {
                break;
            }
            let at = rng.gen_range(0..m.len());
            match rng.gen_range(0..3) {
                0 => m[at] ^= 1 << rng.gen_range(0..8),
                1 => {
                    let junk = random_bytes(rng, 16);
                    m.splice(at..at, junk);
                }
                _ => m.truncate(at),
            }
        }
    }
    m
}

/// Sends `bytes` as one session while a thread drains the replies (a client that never
/// read could stall the server's writes, which is its right), then stops sending and
/// waits for the server to close the connection. Returns whether any transmission reply
/// came back (so the session got past the handshake).
fn run_session(addr: SocketAddr, bytes: &[u8]) -> Result<bool, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    let mut r = s.try_clone().map_err(|e| e.to_string())?;
    r.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        let replied = |got: &[u8]| {
            [SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC]
                .iter()
                .any(|m| got.windows(4).any(|w| w == m.to_be_bytes()))
        };
        let end = loop {
            match r.read(&mut buf) {
                Ok(0) => break Ok(replied(&got)),
                // What comes after the first reply need not be kept.
                Ok(n) if got.len() < 1 << 16 => got.extend_from_slice(&buf[..n]),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    break Ok(replied(&got))
                }
                Err(e) => break Err(format!("waiting for the server to close: {e}")),
            }
        };
        let _ = tx.send(end);
    });
    // The server may close first, having refused what it read: a write error is an answer.
    let _ = s.write_all(bytes);
    let _ = s.shutdown(Shutdown::Write);
    rx.recv_timeout(Duration::from_secs(30))
        .map_err(|_| "no end to the session".to_string())?
}

fn first_seed() -> u64 {
    std::env::var("ZETA_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen_range(0..1 << 40))
}

#[test]
fn mutated_sessions_never_hang_or_harm_the_server() {
    let panics = panics();
    let rig = Rig::default();
    let addr = rig.addr();

    let witness_vol = WITNESS.strip_prefix("tank/").unwrap();
    rig.pool
        .create_volume(witness_vol, VOLSIZE, 16384, None)
        .unwrap();
    let mut witness = Client::open(addr, WITNESS);
    let kept = pattern(7, 256 << 10);
    assert_eq!(witness.write(MB, &kept), 0);

    let seed = first_seed();
    let sessions = std::env::var("ZETA_FUZZ_SESSIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000u64);
    eprintln!("seeds {seed}..{} (ZETA_FUZZ_SEED)", seed + sessions);
    let mut served = 0;
    for t in seed..seed + sessions {
        let bytes = session(&mut StdRng::seed_from_u64(t));
        let before = panics.load(Ordering::SeqCst);
        match run_session(addr, &bytes) {
            Ok(replied) => served += replied as u64,
            Err(e) => panic!("seed {t}: {e}"),
        }
        assert_eq!(
            panics.load(Ordering::SeqCst),
            before,
            "seed {t}: a thread panicked"
        );
    }

    assert!(
        served > sessions / 5,
        "only {served} of {sessions} sessions got past the handshake"
    );
    // The witness's session lived through it all, and so did its data.
    assert_eq!(witness.read(MB, kept.len() as u32).unwrap(), kept);
    let mut fresh = Client::open(addr, TARGET);
    assert_eq!(fresh.write(0, &[3u8; 4096]), 0);
    assert_eq!(fresh.read(0, 4096).unwrap(), vec![3u8; 4096]);
    drop(fresh);
    drop(witness);
    rig.pool.verify().unwrap();
}
