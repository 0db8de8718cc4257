//! Send and receive: a full stream makes a volume that reads as the snapshot did, with the
//! snapshot's guid; an incremental stream carries only what changed (holes made since
//! included) and lands on the copy's matching snapshot; a damaged, cut or misplaced stream
//! is refused, leaving no new volume, or the copy as it was.

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
    receive(pool, vol, &mut &stream[..], force, &mut |_| true)
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
