//! `zeta serve` keeps its resident size within `--cache` + `--dirty-max` + `--max-inflight`
//! under many clients writing and reading at random over NBD (fio's nbd engine). Alone in its
//! binary so that no other test's load shifts the figures.

mod common;

use std::process::Command;

use common::procs::{have, pool_with_volume, spawn_server, status_field, zeta_in as zeta};

#[test]
fn the_server_stays_within_its_memory_limits_under_random_io() {
    if !have("fio") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    pool_with_volume(dir.path(), &home, "256M");
    // 128M + 64M + 32M: the volume is twice the cache, and the writes below are many times
    // the whole budget.
    let mut c = zeta(&home);
    c.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--cache",
        "128M",
        "--dirty-max",
        "64M",
        "--max-inflight",
        "32M",
    ]);
    let (mut child, addr, _) = spawn_server(c);
    let uri = format!("nbd://{addr}/tank/v");
    for (rw, secs) in [("randwrite", "6"), ("randrw", "4")] {
        let out = Command::new("fio")
            .current_dir(dir.path())
            .args([
                "--name=load",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                &format!("--rw={rw}"),
                "--bsrange=4k-128k",
                "--iodepth=32",
                "--numjobs=8",
                "--size=256M",
                &format!("--runtime={secs}"),
                "--time_based",
                "--group_reporting",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "fio {rw}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let rss = status_field(child.id(), "VmHWM");
    let _ = child.kill();
    let _ = child.wait();
    eprintln!("server peak RSS {} MiB", rss >> 20);
    // Without the governor: 283-291 MiB here; with it, 201-208.
    assert!(
        rss <= 224 << 20,
        "peak RSS {} MiB over the 224 MiB configured",
        rss >> 20
    );
}

#[test]
fn the_server_refuses_memory_limits_that_cannot_work() {
    let dir = tempfile::tempdir().unwrap();
    for (args, msg) in [
        (
            ["--max-inflight", "8M"],
            "--max-inflight must be at least 32.0M (the largest request the server accepts)",
        ),
        (["--cache", "0"], "--cache must be at least 1M"),
        (["--dirty-max", "100K"], "--dirty-max must be at least 1M"),
    ] {
        let out = zeta(&dir.path().join("home"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim(),
            format!("zeta: {msg}"),
            "{args:?}"
        );
    }
}
