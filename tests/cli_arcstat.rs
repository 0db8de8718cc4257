//! `zeta pool arcstat` on a pool `zeta serve` holds: a client's reads show as misses and then
//! hits of the server's block cache, a block read twice moves to T2, blocks stored compressed
//! are kept compressed, and with INTERVAL one line per interval follows the header.

mod common;

use std::process::Command;

use common::cli::{fails_with, ok, words, zeta};
use common::nbd_client::Client;
use common::procs::spawn_server;

#[test]
fn arcstat_shows_the_served_pools_cache_filling_and_hitting() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=128M tank a")));
    ok(&zeta(
        &home,
        d,
        &words("vol create -s -b 16K -o compression=lz4 tank/v 8M"),
    ));
    let text: String = (0..100_000)
        .map(|i| format!("line {i} of a log\n"))
        .collect();
    std::fs::write(d.join("text"), &text.as_bytes()[..1 << 20]).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v text")));
    fails_with(
        &zeta(&home, d, &words("pool arcstat tank 0")),
        "INTERVAL must be",
    );
    fails_with(&zeta(&home, d, &words("pool arcstat nosuch")), "nosuch");

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zeta"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "tank"])
        .env("ZETA_HOME", &home)
        .current_dir(d);
    let (mut server, addr, _) = spawn_server(cmd);
    let stat = || -> serde_json::Value {
        serde_json::from_str(&ok(&zeta(&home, d, &words("pool arcstat --json tank")))).unwrap()
    };
    let before = stat();
    let mut c = Client::open(addr, "tank/v");
    for _ in 0..2 {
        for off in [0u64, 16384, 65536] {
            let got = c.read(off + 100, 4096).unwrap();
            assert_eq!(
                got,
                text.as_bytes()[off as usize + 100..off as usize + 4196]
            );
        }
    }
    drop(c);
    let after = stat();
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    assert!(n(&after, "misses") >= n(&before, "misses") + 3, "{after}");
    assert!(n(&after, "hits") >= n(&before, "hits") + 3, "{after}");
    assert!(n(&after, "t2") >= 3 * 4096, "read twice: in T2: {after}");
    let (cb, cl) = (
        n(&after, "compressed_bytes"),
        n(&after, "compressed_logical_bytes"),
    );
    assert!(
        cb > 0 && cl >= 3 * 16384 && cl > 2 * cb,
        "kept compressed: {after}"
    );
    assert!(n(&after, "c") > 0 && n(&after, "p") <= n(&after, "c"));

    let text_out = ok(&zeta(&home, d, &words("pool arcstat tank")));
    assert!(
        text_out.contains("kept compressed:") && text_out.contains("T2"),
        "{text_out}"
    );
    let lines = ok(&zeta(&home, d, &words("pool arcstat tank 0.1 2")));
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two reports: {lines:?}");
    assert!(
        lines[0].contains("hits/s") && lines[0].contains("b2"),
        "{lines:?}"
    );
    let json_lines = ok(&zeta(&home, d, &words("pool arcstat --json tank 0.1 2")));
    for l in json_lines.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert!(v["interval_hits"].is_u64() && v["t1"].is_u64(), "{v}");
    }
    assert_eq!(json_lines.lines().count(), 2);

    // A client reading on in order is read ahead of.
    let mut c = Client::open(addr, "tank/v");
    for off in (0..1u64 << 20).step_by(4096) {
        c.read(off, 4096).unwrap();
    }
    drop(c);
    let mut read_ahead = stat();
    for _ in 0..50 {
        if n(&read_ahead, "prefetch_blocks") > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        read_ahead = stat();
    }
    assert_eq!(read_ahead["prefetch"], true);
    assert!(n(&read_ahead, "prefetch_asked") > 0, "{read_ahead}");
    assert!(n(&read_ahead, "prefetch_blocks") > 0, "{read_ahead}");
    let text_out = ok(&zeta(&home, d, &words("pool arcstat tank")));
    assert!(text_out.contains("blocks read ahead"), "{text_out}");
    let _ = server.kill();
    let _ = server.wait();

    // --no-prefetch: the same reads are not.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zeta"));
    cmd.args(["serve", "--no-prefetch", "--listen", "127.0.0.1:0", "tank"])
        .env("ZETA_HOME", &home)
        .current_dir(d);
    let (mut server, addr, _) = spawn_server(cmd);
    let mut c = Client::open(addr, "tank/v");
    for off in (0..1u64 << 20).step_by(4096) {
        c.read(off, 4096).unwrap();
    }
    drop(c);
    let off = stat();
    assert_eq!(off["prefetch"], false, "{off}");
    assert_eq!(n(&off, "prefetch_asked"), 0, "{off}");
    let _ = server.kill();
    let _ = server.wait();
}
