//! `zeta get` and `zeta set`, as `zfs get` and `zfs set`: every property of a volume read
//! back as `vol list` and the pool know it, in each output form; volsize set grows the volume
//! (and its reservation) as `vol resize` does; what cannot be set is refused by name.

mod common;

use std::path::Path;

use common::cli::{fails_with, ok, words, zeta};

const MB: u64 = 1 << 20;

fn json(home: &Path, d: &Path, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(&zeta(home, d, args))).unwrap()
}

#[test]
fn get_shows_every_property_as_the_pool_knows_it_and_set_grows_a_volume() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=256M tank a")));
    ok(&zeta(&home, d, &words("vol create tank/v 64M")));
    ok(&zeta(
        &home,
        d,
        &words("vol create -s -b 8K -o checksum=sha256 tank/w 1G"),
    ));
    let bytes: Vec<u8> = (0..3 * MB as usize).map(|i| (i % 251) as u8 + 1).collect();
    std::fs::write(d.join("data"), bytes).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/w data")));

    // --json: every property of every volume named, equal to what vol list says.
    let got = json(&home, d, &words("get --json all tank/v tank/w"));
    let listed = json(&home, d, &words("vol list --json tank"));
    for row in listed.as_array().unwrap() {
        let name = row["name"].as_str().unwrap();
        let p = &got[name];
        assert_eq!(p["type"], "volume", "{got}");
        assert_eq!(p["volsize"], row["size"], "{name}");
        assert_eq!(p["used"], row["used"], "{name}");
        assert_eq!(p["refreservation"], row["refreservation"], "{name}");
        assert_eq!(p["volblocksize"], row["volblocksize"], "{name}");
        assert_eq!(p["checksum"], row["checksum"], "{name}");
        assert!(p["guid"].as_u64().unwrap() > 0 && p["createtxg"].as_u64().is_some());
    }
    assert_eq!(got["tank/w"]["checksum"], "sha256");
    assert_eq!(got["tank/w"]["volblocksize"], 8192);
    assert_eq!(got["tank/w"]["refreservation"], 0, "sparse");
    assert!(got["tank/w"]["used"].as_u64().unwrap() >= 3 * MB);
    assert_ne!(got["tank/v"]["guid"], got["tank/w"]["guid"]);

    // -Hp: tab-separated, exact bytes, no header, in the order asked.
    let out = ok(&zeta(&home, d, &words("get -Hp volsize,used tank/w")));
    let used = got["tank/w"]["used"].as_u64().unwrap();
    assert_eq!(
        out,
        format!("tank/w\tvolsize\t{}\ntank/w\tused\t{used}\n", 1u64 << 30)
    );
    // Without them: a header and sizes as people read them.
    let out = ok(&zeta(&home, d, &words("get volsize tank/v")));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with("NAME") && lines[0].ends_with("VALUE"),
        "{out}"
    );
    assert!(
        lines[1].contains("volsize") && lines[1].ends_with("64.0M"),
        "{out}"
    );

    // set volsize grows the volume and a reserved volume's reservation with it.
    let before = got["tank/v"]["refreservation"].as_u64().unwrap();
    let said = ok(&zeta(&home, d, &words("set volsize=96M tank/v")));
    assert!(
        said.contains("volsize=96.0M") || said.contains("volsize=96M"),
        "{said}"
    );
    let now = json(&home, d, &words("get --json volsize,refreservation tank/v"));
    assert_eq!(now["tank/v"]["volsize"], 96 * MB);
    assert!(now["tank/v"]["refreservation"].as_u64().unwrap() > before);
    // ... and the data of a volume it grows stays.
    ok(&zeta(&home, d, &words("set volsize=2G tank/w")));
    ok(&zeta(&home, d, &words("vol get tank/w back")));
    let back = std::fs::read(d.join("back")).unwrap();
    assert_eq!(back.len() as u64, 2 << 30);
    assert!(back[..3 * MB as usize] == std::fs::read(d.join("data")).unwrap()[..]);
}

#[test]
fn what_cannot_be_got_or_set_is_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=128M tank a")));
    ok(&zeta(&home, d, &words("vol create tank/v 32M")));
    let cases: &[(&str, &str)] = &[
        ("get foo tank/v", "unknown property 'foo'"),
        ("get volsize,bar tank/v", "unknown property 'bar'"),
        ("get all tank/nope", "'tank/nope' does not exist"),
        ("get all tank/v other/x", "of one pool"),
        ("get all novolume", "is not POOL/VOL"),
        ("set volsize tank/v", "is not PROP=VALUE"),
        ("set foo=1 tank/v", "unknown property 'foo'"),
        ("set used=1 tank/v", "used is read-only"),
        ("set guid=1 tank/v", "guid is read-only"),
        ("set volblocksize=8K tank/v", "zeta vol create -b"),
        ("set checksum=crc tank/v", "give fletcher2"),
        ("set refreservation=1M tank/v", "give auto"),
        ("set volsize=1M tank/v", "zeta vol resize -f"),
        ("set volsize=lots tank/v", "lots"),
        ("set volsize=10G tank/v", "reserves"),
    ];
    for (line, needle) in cases {
        fails_with(&zeta(&home, d, &words(line)), needle);
    }
    // Nothing refused changed the volume.
    let v = json(&home, d, &words("get --json volsize tank/v"));
    assert_eq!(v["tank/v"]["volsize"], 32 * MB);
}

/// `checksum` and `refreservation` are settable as on a ZFS zvol: a new checksum goes to the
/// blocks written from then on while the older ones keep theirs (every block reads back, and
/// a scrub finds nothing), a snapshot keeps the algorithm it was taken with; a volume made
/// sparse reserves nothing, and `auto` reserves it whole again unless the pool lacks the room.
#[test]
fn checksum_and_refreservation_are_set_on_a_volume() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=128M tank a")));
    ok(&zeta(&home, d, &words("vol create tank/v 32M")));
    std::fs::write(d.join("one"), vec![0x11u8; 2 * MB as usize]).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v one")));
    ok(&zeta(&home, d, &words("snapshot tank/v@before")));
    let said = ok(&zeta(&home, d, &words("set checksum=sha256 tank/v")));
    assert!(said.contains("set checksum=sha256"), "{said}");
    let mut two = vec![0x22u8; MB as usize];
    two.extend(vec![0x11u8; MB as usize]);
    std::fs::write(d.join("two"), &two[..MB as usize]).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v two")));
    let v = json(&home, d, &words("get --json checksum tank/v tank/v@before"));
    assert_eq!(v["tank/v"]["checksum"], "sha256");
    assert_eq!(v["tank/v@before"]["checksum"], "fletcher4");
    ok(&zeta(&home, d, &words("pool export tank")));
    ok(&zeta(
        &home,
        d,
        &words(&format!("pool import -d {} tank", d.display())),
    ));
    let v = json(&home, d, &words("get --json checksum tank/v"));
    assert_eq!(v["tank/v"]["checksum"], "sha256", "kept on disk");
    ok(&zeta(&home, d, &words("vol get tank/v back")));
    assert!(std::fs::read(d.join("back")).unwrap()[..2 * MB as usize] == two[..]);
    let out = ok(&zeta(&home, d, &words("pool scrub --wait tank")));
    assert!(out.contains("0 errors"), "{out}");

    let reserved = |home: &Path| {
        json(home, d, &words("get --json refreservation tank/v"))["tank/v"]["refreservation"]
            .as_u64()
            .unwrap()
    };
    let full = reserved(&home);
    assert!(full >= 32 * MB, "{full}");
    ok(&zeta(&home, d, &words("set refreservation=none tank/v")));
    assert_eq!(reserved(&home), 0);
    // Its room taken by another volume, the reservation cannot come back.
    ok(&zeta(&home, d, &words("vol create tank/w 90M")));
    fails_with(
        &zeta(&home, d, &words("set refreservation=auto tank/v")),
        "reserves",
    );
    ok(&zeta(&home, d, &words("vol destroy -f tank/w")));
    ok(&zeta(&home, d, &words("set refreservation=auto tank/v")));
    assert_eq!(reserved(&home), full);
}

/// `compression` as on a ZFS zvol: chosen at `vol create -o`, changed by `zeta set` for the
/// blocks written from then on; `logicalused` and `compressratio` say what it saved, per
/// volume (`get`, `vol list`, `zeta list`) and per pool (`pool list`, `pool status`), in each
/// output form; what it does not know is refused by name.
#[test]
fn compression_is_chosen_changed_and_its_savings_shown() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=256M tank a")));
    ok(&zeta(
        &home,
        d,
        &words("vol create -o compression=zstd tank/z 32M"),
    ));
    ok(&zeta(&home, d, &words("vol create tank/o 32M")));
    // Text-like: numbered lines, as a log file holds.
    let text: String = (0..200_000)
        .map(|i| format!("line {i} of a log\n"))
        .collect();
    let text = &text.as_bytes()[..3 * MB as usize];
    std::fs::write(d.join("text"), text).unwrap();
    for v in ["tank/z", "tank/o"] {
        ok(&zeta(&home, d, &words(&format!("vol put {v} text"))));
    }
    let got = json(
        &home,
        d,
        &words("get --json compression,used,logicalused,compressratio tank/z tank/o"),
    );
    let (z, o) = (&got["tank/z"], &got["tank/o"]);
    assert_eq!(z["compression"], "zstd", "{got}");
    assert_eq!(o["compression"], "off", "{got}");
    assert_eq!(o["compressratio"], "1.00x", "{got}");
    let zratio: f64 = z["compressratio"]
        .as_str()
        .unwrap()
        .trim_end_matches('x')
        .parse()
        .unwrap();
    assert!(zratio > 3.0, "{got}");
    assert!(z["logicalused"].as_u64().unwrap() >= 3 * MB, "{got}");
    assert!(
        z["used"].as_u64().unwrap() * 3 < o["used"].as_u64().unwrap(),
        "stored in a third or less: {got}"
    );
    let listed = json(&home, d, &words("vol list --json tank"));
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "tank/z")
        .unwrap();
    assert_eq!(row["compression"], "zstd");
    assert_eq!(row["logicalused"], z["logicalused"]);
    assert!(row["compressratio"].as_f64().unwrap() > 3.0, "{row}");
    let pools = json(&home, d, &words("pool list --json"));
    let pool_ratio = pools[0]["compressratio"].as_f64().unwrap();
    assert!(pool_ratio > 1.4 && pool_ratio < zratio, "{pools}");

    // Set off: the new blocks are raw, the old still compressed; everything reads back.
    let said = ok(&zeta(&home, d, &words("set compression=off tank/z")));
    assert!(said.contains("set compression=off"), "{said}");
    let random: Vec<u8> = (0..MB as usize)
        .map(|i| ((i * 2654435761) >> 13) as u8)
        .collect();
    std::fs::write(d.join("more"), &random).unwrap();
    ok(&zeta(&home, d, &words("vol put --offset 8M tank/z more")));
    ok(&zeta(&home, d, &words("pool export tank")));
    ok(&zeta(
        &home,
        d,
        &words(&format!("pool import -d {} tank", d.display())),
    ));
    let now = json(
        &home,
        d,
        &words("get --json compression,logicalused tank/z"),
    );
    assert_eq!(now["tank/z"]["compression"], "off", "kept on disk");
    ok(&zeta(&home, d, &words("vol get tank/z back")));
    let back = std::fs::read(d.join("back")).unwrap();
    assert!(back[..3 * MB as usize] == text[..]);
    assert!(back[8 * MB as usize..9 * MB as usize] == random[..]);
    let out = ok(&zeta(&home, d, &words("pool scrub --wait tank")));
    assert!(out.contains("0 errors"), "{out}");
    let plain = ok(&zeta(&home, d, &words("get compressratio tank/z")));
    assert!(
        plain.contains("compressratio") && plain.trim_end().ends_with('x'),
        "{plain}"
    );

    for (line, needle) in [
        ("set compression=gzip tank/z", "bad compression 'gzip'"),
        ("set compression=zstd-20 tank/z", "zstd-19"),
        (
            "vol create -o compression=lzjb tank/x 8M",
            "bad compression 'lzjb'",
        ),
        ("set compressratio=2 tank/z", "compressratio is read-only"),
        ("set logicalused=2 tank/z", "logicalused is read-only"),
    ] {
        fails_with(&zeta(&home, d, &words(line)), needle);
    }
}
