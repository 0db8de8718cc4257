//! `zeta pool map` and FRAG in `zeta pool list`: the picture and the numbers agree with the
//! listing, and a bad output name is one clear line.

mod common;

use common::cli::{fails_with, ok, zeta};

#[test]
fn the_map_agrees_with_pool_list_and_draws_every_metaslab() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(
        &home,
        d,
        &["pool", "create", "-o", "size=256M", "p", "a"],
    ));
    ok(&zeta(
        &home,
        d,
        &["vol", "create", "-b", "8K", "p/v", "96M"],
    ));
    let data: Vec<u8> = (0..96u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(d.join("data"), &data).unwrap();
    ok(&zeta(&home, d, &["vol", "put", "p/v", "data"]));
    ok(&zeta(&home, d, &["pool", "sync", "p"]));

    let list: serde_json::Value =
        serde_json::from_str(&ok(&zeta(&home, d, &["pool", "list", "--json"]))).unwrap();
    let map: serde_json::Value =
        serde_json::from_str(&ok(&zeta(&home, d, &["pool", "map", "p", "--json"]))).unwrap();
    assert_eq!(list[0]["fragmentation"], map["fragmentation"]);
    assert_eq!(list[0]["free"], map["free"]);
    assert_eq!(list[0]["size"], map["size"]);
    let metaslabs = map["vdevs"][0]["metaslabs"].as_array().unwrap();
    let sum = |k: &str| {
        metaslabs
            .iter()
            .map(|m| m[k].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(sum("free"), map["free"].as_u64().unwrap());
    assert_eq!(sum("size"), map["size"].as_u64().unwrap());
    let hist: u64 = map["histogram"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(
        hist,
        map["free"].as_u64().unwrap(),
        "the histogram holds every free byte"
    );
    let text = ok(&zeta(&home, d, &["pool", "list"]));
    assert!(text.contains("FRAG"), "{text}");

    ok(&zeta(&home, d, &["pool", "map", "p", "-o", "m.svg"]));
    let svg = std::fs::read_to_string(d.join("m.svg")).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
    assert!(
        svg.matches("<rect").count() > metaslabs.len(),
        "a cell per metaslab (and the background)"
    );
    ok(&zeta(&home, d, &["pool", "map", "p", "-o", "m.png"]));
    let png = std::fs::read(d.join("m.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    fails_with(
        &zeta(&home, d, &["pool", "map", "p", "-o", "m.jpg"]),
        ".svg or .png",
    );
    assert!(ok(&zeta(&home, d, &["pool", "map", "p"])).contains("fragmented"));
}
