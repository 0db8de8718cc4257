//! Send and receive: a full stream makes a volume that reads as the snapshot did, with the
//! snapshot's guid; an incremental stream carries only what changed (holes made since
//! included) and lands on the copy's matching snapshot; a damaged, cut or misplaced stream
//! is refused, leaving no new volume, or the copy as it was — or, received resumably, the part
//! received kept and marked, which the rest of the stream (`send_resumed`) completes.

mod common;

use std::sync::Arc;

use common::*;
use zeta::dsl::Pool;
use zeta::zvol::receive::receive;
use zeta::zvol::Volume;

const VOL: u64 = 8 * MB;
const BS: u64 = 16384;

fn pool(name: &str) -> Arc<Pool> {
    let devs = mem_devs(2, 64 * MB);
    Pool::create(name, spec(Layout::Mirror, &devs), opts()).unwrap()
}

fn read_all(pool: &Arc<Pool>, name: &str) -> Vec<u8> {
    let vol = Volume::open(pool, name).unwrap();
    read(&vol, 0, vol.size() as usize)
}

fn send(pool: &Pool, name: &str, from: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    pool.send(name, from, &mut out, &mut |_| true).unwrap();
    out
}

fn recv(pool: &Arc<Pool>, vol: &str, stream: &[u8], force: bool) -> Result<(), String> {
    receive(pool, vol, &mut &stream[..], force, false, &mut |_| true)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn at_rest(pool: &Pool) {
    pool.sync_frees().unwrap();
    let (reach, space) = pool.verify_space().unwrap();
    assert_eq!(reach, space.alloc);
}

#[test]
fn full_and_incremental_streams_make_an_exact_copy() {
    let src = pool("src");
    src.create_volume("v", VOL, BS as u32, None).unwrap();
    let vol = Volume::open(&src, "v").unwrap();
    let a = pattern(1, 6 * MB as usize); // the last 2M stay holes
    vol.write(0, &a).unwrap();
    vol.flush().unwrap();
    src.snapshot(&["v@a"]).unwrap();
    let full = send(&src, "v@a", None);

    let dst = pool("dst");
    recv(&dst, "copy", &full, false).unwrap();
    assert_eq!(read_all(&dst, "copy@a"), read_all(&src, "v@a"));
    assert_eq!(read_all(&dst, "copy"), read_all(&src, "v@a"));
    let (sa, ca) = (
        src.snapshot_dataset("v@a").unwrap(),
        dst.snapshot_dataset("copy@a").unwrap(),
    );
    assert_eq!(
        sa.guid, ca.guid,
        "the received snapshot takes the sent one's guid"
    );
    drop((sa, ca));

    // Changes: a few blocks rewritten, a range trimmed to holes, data past the old end.
    vol.write(3 * BS, &pattern(2, 2 * BS as usize)).unwrap();
    vol.trim(MB, MB).unwrap();
    vol.write(7 * MB, &pattern(3, 64 * 1024)).unwrap();
    vol.flush().unwrap();
    drop(vol);
    src.snapshot(&["v@b"]).unwrap();
    let incr = send(&src, "v@b", Some("v@a"));
    assert!(
        incr.len() < full.len() / 8,
        "an incremental stream carries what changed: {} against {}",
        incr.len(),
        full.len()
    );
    recv(&dst, "copy", &incr, false).unwrap();
    assert!(read_all(&dst, "copy") == read_all(&src, "v@b"));
    assert!(read_all(&dst, "copy@b") == read_all(&src, "v@b"));
    assert!(read_all(&dst, "copy@a") == read_all(&src, "v@a"));
    // Received twice: refused (the copy's latest is @b now).
    let e = recv(&dst, "copy", &incr, false).unwrap_err();
    assert!(e.contains("latest"), "{e}");
    at_rest(&src);
    at_rest(&dst);
}

#[test]
fn a_bad_stream_leaves_the_target_as_it_was() {
    let src = pool("src");
    src.create_volume("v", VOL, BS as u32, None).unwrap();
    let vol = Volume::open(&src, "v").unwrap();
    vol.write(0, &pattern(4, 4 * MB as usize)).unwrap();
    vol.flush().unwrap();
    src.snapshot(&["v@a"]).unwrap();
    vol.write(0, &pattern(5, MB as usize)).unwrap();
    vol.flush().unwrap();
    src.snapshot(&["v@b"]).unwrap();
    let full = send(&src, "v@a", None);
    let incr = send(&src, "v@b", Some("v@a"));

    let dst = pool("dst");
    // A full stream damaged in its middle, or cut short: no volume is left behind.
    let mut rotten = full.clone();
    let mid = rotten.len() / 2;
    rotten[mid] ^= 1;
    for bad in [&rotten[..], &full[..full.len() - 1], &full[..600]] {
        let e = recv(&dst, "copy", bad, false).unwrap_err();
        assert!(e.contains("receive"), "{e}");
        assert!(
            dst.dataset("copy").is_err(),
            "a refused stream left a volume: {e}"
        );
    }
    // An incremental stream onto a volume without its base.
    let e = recv(&dst, "copy", &incr, false).unwrap_err();
    assert!(
        e.contains("does not exist") || e.contains("no snapshot"),
        "{e}"
    );

    recv(&dst, "copy", &full, false).unwrap();
    let before = read_all(&dst, "copy");
    // Damaged incremental: the copy is rolled back to its base, nothing else kept.
    let mut rotten = incr.clone();
    let at = rotten.len() - 100;
    rotten[at] ^= 1;
    recv(&dst, "copy", &rotten, false).unwrap_err();
    assert!(read_all(&dst, "copy") == before);
    assert!(dst.snapshot_dataset("copy@b").is_err());
    // The copy written since its latest snapshot: refused, unless forced (rolled back).
    let v = Volume::open(&dst, "copy").unwrap();
    v.write(0, &[9u8; 4096]).unwrap();
    v.flush().unwrap();
    drop(v);
    let e = recv(&dst, "copy", &incr, false).unwrap_err();
    assert!(e.contains("-F"), "{e}");
    recv(&dst, "copy", &incr, true).unwrap();
    assert!(read_all(&dst, "copy") == read_all(&src, "v@b"));
    at_rest(&dst);
}

/// A resumable receive (`-s`) of a full or an incremental stream, cut or damaged anywhere:
/// what it received stays, marked partly received (no client opens it, no snapshot is taken
/// of it), its place survives an export and import, a resumed stream from another place is
/// refused, and the rest of the stream from its place makes the copy exactly the snapshot,
/// no longer marked; or, given up, a full one leaves no volume and an incremental one the
/// copy at its base.
#[test]
fn a_cut_resumable_receive_resumes_where_it_stopped_or_is_given_up() {
    use zeta::dsl::PoolError;
    use zeta::zvol::receive::{abort, parse_token, resume_token};
    let src = pool("src");
    src.create_volume("v", VOL, BS as u32, None).unwrap();
    let vol = Volume::open(&src, "v").unwrap();
    vol.write(0, &pattern(1, 6 * MB as usize)).unwrap();
    vol.flush().unwrap();
    src.snapshot(&["v@a"]).unwrap();
    vol.write(BS, &pattern(2, 3 * MB as usize)).unwrap();
    vol.trim(5 * MB, MB).unwrap();
    vol.flush().unwrap();
    drop(vol);
    src.snapshot(&["v@b"]).unwrap();
    let full = send(&src, "v@a", None);
    let incr = send(&src, "v@b", Some("v@a"));
    let want_a = read_all(&src, "v@a");
    let want_b = read_all(&src, "v@b");
    let mut kept_some = 0;
    for (stream, want, snap) in [(&full, &want_a, "copy@a"), (&incr, &want_b, "copy@b")] {
        let n = stream.len();
        for (i, cut) in [600, n / 3, n / 2, n - 70].into_iter().enumerate() {
            let devs = mem_devs(2, 64 * MB);
            let dst = Pool::create("dst", spec(Layout::Mirror, &devs), opts()).unwrap();
            let base = stream == &incr;
            if base {
                recv(&dst, "copy", &full, false).unwrap();
            }
            // Odd cases: cut short; even: a byte of the part after the cut flipped.
            let mut damaged = stream.to_vec();
            let part: &[u8] = if i % 2 == 0 {
                &stream[..cut]
            } else {
                damaged[cut] ^= 0x10;
                &damaged
            };
            let e = receive(&dst, "copy", &mut &part[..], false, true, &mut |_| true)
                .unwrap_err()
                .to_string();
            let st = dst.dataset("copy").unwrap().receiving().expect("kept");
            assert!(e.contains(&resume_token(&st)), "{e}");
            assert_eq!(parse_token(&resume_token(&st)).unwrap(), st);
            kept_some += usize::from(st.offset > 0);
            assert!(matches!(
                Volume::open(&dst, "copy"),
                Err(PoolError::PartlyReceived(_))
            ));
            assert!(dst.snapshot(&["copy@mine"]).is_err());
            dst.close().unwrap();
            drop(dst);
            let dst = import(&devs);
            assert_eq!(
                dst.dataset("copy").unwrap().receiving(),
                Some(st),
                "kept on disk"
            );
            at_rest(&dst);
            if st.offset > 0 {
                let mut wrong = Vec::new();
                src.send_resumed(st.to_guid, st.from_guid, 0, &mut wrong, &mut |_| true)
                    .unwrap();
                let e = receive(&dst, "copy", &mut &wrong[..], false, false, &mut |_| true)
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("received up to"), "{e}");
            }
            if i == 3 {
                abort(&dst, "copy").unwrap();
                match base {
                    false => assert!(dst.dataset("copy").is_err(), "no volume left"),
                    true => assert_eq!(read_all(&dst, "copy"), want_a),
                }
                at_rest(&dst);
                continue;
            }
            let mut rest = Vec::new();
            let (name, _) = src
                .send_resumed(st.to_guid, st.from_guid, st.offset, &mut rest, &mut |_| {
                    true
                })
                .unwrap();
            assert_eq!(name, snap.replace("copy", "v"));
            assert!(rest.len() <= stream.len(), "only the rest is sent");
            let s = receive(&dst, "copy", &mut &rest[..], false, false, &mut |_| true).unwrap();
            assert!(s.resumed);
            assert!(dst.dataset("copy").unwrap().receiving().is_none());
            assert!(read_all(&dst, snap) == *want, "{snap}, cut {i}");
            assert!(read_all(&dst, "copy") == *want);
            at_rest(&dst);
        }
    }
    assert!(
        kept_some >= 3,
        "cuts past the first records keep what came before them"
    );
}

/// Power cuts (dropped and torn writes) at random moments of receives, full and incremental,
/// without `-s`: every image imports with its space exact, and the copy is there whole with
/// its snapshot, or not there (or at its base), or marked partly received — never a volume
/// that looks whole and is not; a marked one completes from the rest of the stream.
#[test]
fn a_power_cut_amid_a_receive_leaves_the_copy_whole_absent_or_marked() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use zeta::vdev::mem::PowerCut;
    let src = pool("src");
    src.create_volume("v", VOL, BS as u32, None).unwrap();
    let vol = Volume::open(&src, "v").unwrap();
    vol.write(0, &pattern(5, VOL as usize)).unwrap();
    vol.flush().unwrap();
    src.snapshot(&["v@a"]).unwrap();
    vol.write(MB, &pattern(6, 4 * MB as usize)).unwrap();
    vol.flush().unwrap();
    drop(vol);
    src.snapshot(&["v@b"]).unwrap();
    let full = send(&src, "v@a", None);
    let incr = send(&src, "v@b", Some("v@a"));
    let (want_a, want_b) = (read_all(&src, "v@a"), read_all(&src, "v@b"));
    let (mut marked, mut whole) = (0, 0);
    for round in 0..6u64 {
        let devs = mem_devs(2, 64 * MB);
        let dst = Pool::create("dst", spec(Layout::Mirror, &devs), opts()).unwrap();
        let incremental = round % 2 == 1;
        if incremental {
            recv(&dst, "copy", &full, false).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let (dst, stop) = (dst.clone(), stop.clone());
            let stream = if incremental {
                incr.clone()
            } else {
                full.clone()
            };
            std::thread::spawn(move || {
                // Slowed so that the cut falls inside it.
                let _ = receive(&dst, "copy", &mut &stream[..], false, false, &mut |_| {
                    std::thread::sleep(std::time::Duration::from_micros(300));
                    !stop.load(Ordering::Relaxed)
                });
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(5 + 9 * round));
        let mode = match round % 3 {
            0 => PowerCut::DropUnflushed,
            _ => PowerCut::Tear(round),
        };
        let image = power_cut(&devs, mode);
        stop.store(true, Ordering::Relaxed);
        worker.join().unwrap();
        let dst = import(&image);
        at_rest(&dst);
        let (snap, want) = match incremental {
            true => ("copy@b", &want_b),
            false => ("copy@a", &want_a),
        };
        match dst.dataset("copy").ok().and_then(|d| d.receiving()) {
            Some(st) => {
                marked += 1;
                let mut rest = Vec::new();
                src.send_resumed(st.to_guid, st.from_guid, st.offset, &mut rest, &mut |_| {
                    true
                })
                .unwrap();
                receive(&dst, "copy", &mut &rest[..], false, false, &mut |_| true).unwrap();
                assert!(read_all(&dst, snap) == *want, "round {round}");
            }
            None if dst.snapshot_dataset(snap).is_ok() => {
                whole += 1;
                assert!(read_all(&dst, snap) == *want, "round {round}");
                assert!(read_all(&dst, "copy") == *want, "round {round}");
            }
            None if incremental => {
                assert!(
                    read_all(&dst, "copy") == want_a,
                    "round {round}: at its base"
                );
            }
            None => assert!(dst.dataset("copy").is_err(), "round {round}: absent"),
        }
        at_rest(&dst);
    }
    assert!(marked > 0, "no cut fell inside a receive ({whole} whole)");
}
