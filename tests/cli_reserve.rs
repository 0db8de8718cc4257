//! Volume reservations through the CLI, as a user meets them: a volume reserves the room to be
//! written whole unless made sparse (`-s`), a volume the pool cannot hold is refused with the
//! figures, and a reserved volume can be written whole however full sparse volumes made the
//! pool.

mod common;

use std::path::Path;

use common::cli::{fails_with, ok, words, zeta};

const MB: u64 = 1 << 20;

fn json(home: &Path, d: &Path, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(&zeta(home, d, args))).unwrap()
}

/// The pool's AVAIL (usable, after parity, beside the reservations) and RESERVED.
fn avail(home: &Path, d: &Path) -> (u64, u64) {
    let rows = json(home, d, &words("pool list --json"));
    let r = &rows[0];
    (
        r["avail"].as_u64().unwrap(),
        r["reserved"].as_u64().unwrap(),
    )
}

fn volume(home: &Path, d: &Path, name: &str) -> serde_json::Value {
    let rows = json(home, d, &words("vol list --json tank"));
    (rows.as_array().unwrap().iter())
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {rows}"))
        .clone()
}

/// A file of `len` bytes that are never all zero in a block (zeros would be holes).
fn data_file(path: &Path, len: u64) {
    let bytes: Vec<u8> = (0..len as usize).map(|i| (i % 251) as u8 + 1).collect();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_reserved_volume_can_be_written_whole_however_full_sparse_ones_made_the_pool() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(
        &home,
        d,
        &words("pool create -o size=160M tank mirror a b"),
    ));
    let (before, none) = avail(&home, d);
    assert_eq!(none, 0, "nothing reserved yet");

    // More than the pool holds: refused with the figures, and the way out named.
    let out = zeta(&home, d, &words("vol create tank/huge 64T"));
    fails_with(&out, "tank/huge: a volume of 64.0T reserves");
    fails_with(&out, "use -s for a sparse volume");
    // Sparse, it is taken: it reserves nothing.
    let made = ok(&zeta(&home, d, &words("vol create -s tank/thin 64T")));
    assert!(made.contains("sparse"), "{made}");
    assert_eq!(volume(&home, d, "tank/thin")["refreservation"], 0);

    // A reserved volume takes its room out of AVAIL at once.
    let made = ok(&zeta(&home, d, &words("vol create tank/r 48M")));
    assert!(made.contains("reserved"), "{made}");
    let refres = volume(&home, d, "tank/r")["refreservation"]
        .as_u64()
        .unwrap();
    assert!(refres >= 48 * MB, "{refres}");
    let (after, reserved) = avail(&home, d);
    assert_eq!(reserved, refres, "a mirror reserves what it allocates");
    assert!(
        before - after >= 48 * MB,
        "AVAIL {before} -> {after} for a 48M reservation"
    );
    // A second one larger than what is left is refused; one that fits is not.
    let too_big = (after / MB + 8).to_string() + "M";
    fails_with(
        &zeta(&home, d, &["vol", "create", "tank/r2", &too_big]),
        "reserves",
    );
    ok(&zeta(&home, d, &words("vol create tank/small 4M")));

    // The sparse volume fills the pool until it is refused for space...
    data_file(&d.join("big"), 160 * MB);
    let out = zeta(&home, d, &words("vol put tank/thin big"));
    fails_with(&out, "space");
    // ...and the reserved volume is still written whole.
    data_file(&d.join("r.img"), 48 * MB);
    ok(&zeta(&home, d, &words("vol put tank/r r.img")));
    ok(&zeta(&home, d, &words("vol get tank/r r.back")));
    assert!(std::fs::read(d.join("r.back")).unwrap() == std::fs::read(d.join("r.img")).unwrap());
    let used = volume(&home, d, "tank/r")["used"].as_u64().unwrap();
    assert!(
        used >= 48 * MB && used <= refres,
        "used {used} of a {refres} reservation"
    );

    // Kept across export and import.
    ok(&zeta(&home, d, &words("pool export tank")));
    ok(&zeta(
        &home,
        d,
        &["pool", "import", "-d", d.to_str().unwrap(), "tank"],
    ));
    assert_eq!(
        volume(&home, d, "tank/r")["refreservation"].as_u64(),
        Some(refres)
    );
    assert_eq!(volume(&home, d, "tank/thin")["refreservation"], 0);
}

#[test]
fn a_reserved_volume_grows_only_into_room_and_a_sparse_one_freely() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=128M tank a")));
    ok(&zeta(&home, d, &words("vol create tank/r 16M")));
    ok(&zeta(&home, d, &words("vol create -s tank/s 16M")));
    let refres = |home: &Path| {
        volume(home, d, "tank/r")["refreservation"]
            .as_u64()
            .unwrap()
    };
    let small = refres(&home);
    // Grown within the room, its reservation grows with it.
    ok(&zeta(&home, d, &words("vol resize tank/r 32M")));
    assert!(refres(&home) >= 32 * MB && refres(&home) > small);
    // Past the room: refused, and the volume keeps its size.
    fails_with(&zeta(&home, d, &words("vol resize tank/r 1T")), "reserves");
    assert_eq!(volume(&home, d, "tank/r")["size"], 32 * MB);
    // A sparse volume grows whatever the room.
    ok(&zeta(&home, d, &words("vol resize tank/s 1T")));
    assert_eq!(volume(&home, d, "tank/s")["refreservation"], 0);
}
