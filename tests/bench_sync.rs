//! `zeta bench sync --json`: every generator measures every configuration and reference, the
//! figures are real (positive, with latencies), zeta-load sends exactly N writes per flush,
//! nothing is left behind, and bad arguments are one line.
//!
//! fio and nbdkit come from Debian packages that `.ci/run` installs. Where one is missing the
//! test says so and passes, unless ZETA_REQUIRE_CLIENTS=1 (set by CI), where it fails.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Output};

mod common;
use common::procs::have;

use serde_json::Value;

fn zeta(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zeta"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn quick_run_has_a_row_per_generator_and_configuration() {
    if !have("fio") || !have("nbdkit") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let args = vec![
        "bench",
        "sync",
        "--quick",
        "--runtime",
        "2",
        "--json",
        "--size",
        "64M",
        "--dir",
        d,
    ];
    let out = zeta(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {err}");
    let all: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let (latency, rows): (Vec<Value>, Vec<Value>) = all.into_iter().partition(|r| r["fua"] == true);
    let expect = [
        ("fio", "per-request", "per-volume"),
        ("fio", "group", "global"),
        ("fio", "raw", "raw"),
        ("fio", "nbdkit", "nbdkit"),
        ("zeta-load", "per-request", "per-volume"),
        ("zeta-load", "group", "global"),
        ("zeta-load", "nbdkit", "nbdkit"),
    ];
    assert_eq!(rows.len(), expect.len(), "{rows:?}");
    for (gen, commit, placement) in expect {
        let r = rows
            .iter()
            .find(|r| r["generator"] == gen && r["commit"] == commit)
            .unwrap_or_else(|| panic!("no row for {gen} {commit}: {rows:?}"));
        assert_eq!(r["placement"], placement, "{r}");
        assert_eq!(
            (r["bs"].as_u64(), r["fsync"].as_u64(), r["qd"].as_u64()),
            (Some(4096), Some(5), Some(100))
        );
        let zeta_pool = commit != "raw" && commit != "nbdkit";
        let vb = if zeta_pool { Some(131072) } else { None };
        assert_eq!(r["volblocksize"].as_u64(), vb, "{r}");
        assert!(r["iops"].as_f64().unwrap() > 0.0, "{r}");
        // One run by default, numbered from 1.
        assert_eq!(r["run"].as_u64(), Some(1), "{r}");
        let mean = r["lat_mean_us"].as_f64().unwrap();
        let p99 = r["lat_p99_us"].as_f64().unwrap();
        assert!(mean > 0.0 && p99 > 0.0, "{r}");
        // Both generators count flushes: fio in its sync section, zeta-load by construction.
        let wpf = r["writes_per_flush"].as_f64().unwrap();
        if gen == "zeta-load" {
            assert_eq!(wpf, 5.0, "{r}");
        } else {
            // fio's counts can come out a little under one write per flush: at depth 100 it
            // flushes after nearly every write, and its counts of the two need not end on the
            // same request (seen: 0.9993).
            assert!((0.9..=5.5).contains(&wpf), "{r}");
        }
        // The device's writes are counted where the files lie on one block device: every
        // byte at least once on a zeta pool (its log record; then its block, at the sync).
        let amp = r["write_amplification"].as_f64();
        // With them, the device's write rate, and the reference it is read against: the
        // device's rate for durable 1M writes, measured once at the start of the run.
        let rate = r["device_write_mb_per_s"].as_f64();
        let reference = r["device_durable_mb_per_s"].as_f64();
        if on_block_device(dir.path()) {
            let amp = amp.unwrap_or_else(|| panic!("{r}"));
            assert!(r["device_write_bytes"].as_u64().unwrap() > 0, "{r}");
            assert!(amp >= if zeta_pool { 1.0 } else { 0.3 }, "{r}");
            let bytes = r["device_write_bytes"].as_f64().unwrap();
            assert_eq!(rate, Some(bytes / 2.0 / 1e6), "{r}");
            assert!(reference.unwrap_or_else(|| panic!("{r}")) > 0.0, "{r}");
            assert_eq!(
                rows[0]["device_durable_mb_per_s"],
                r["device_durable_mb_per_s"]
            );
        } else {
            assert!(amp.is_none() && r["device_write_bytes"].is_null(), "{r}");
            assert!(rate.is_none() && reference.is_none(), "{r}");
        }
        // The server's processor time is read from its process (zeta's or nbdkit's; the raw
        // files have none), the whole machine's for every row.
        let cpu = r["server_cpu_us_per_write"].as_f64();
        if commit == "raw" {
            assert!(cpu.is_none(), "{r}");
        } else {
            assert!(cpu.unwrap_or_else(|| panic!("{r}")) > 0.0, "{r}");
        }
        let busy = r["machine_busy"].as_f64().unwrap_or_else(|| panic!("{r}"));
        assert!(busy > 0.0 && busy <= 1.0, "{r}");
        let blocks = &r["log_blocks_per_device"];
        if zeta_pool {
            // Log blocks really went to every device (the counters come from the server).
            let per_dev: Vec<u64> = blocks
                .as_array()
                .unwrap_or_else(|| panic!("{r}"))
                .iter()
                .map(|b| b.as_u64().unwrap())
                .collect();
            assert_eq!(per_dev.len(), 3, "{r}");
            assert!(per_dev.iter().all(|&b| b > 0), "{r}");
        } else {
            assert!(blocks.is_null(), "{r}");
        }
    }
    // The latency section: queue depth 1, FUA writes, against the raw file's fdatasync.
    let expect = [
        ("fio", "raw", None),
        ("zeta-load", "group", Some(131072)),
        ("zeta-load", "nbdkit", None),
    ];
    assert_eq!(latency.len(), expect.len(), "{latency:?}");
    for (gen, commit, vb) in expect {
        let r = latency
            .iter()
            .find(|r| r["generator"] == gen && r["commit"] == commit)
            .unwrap_or_else(|| panic!("no latency row for {gen} {commit}: {latency:?}"));
        assert_eq!(r["qd"].as_u64(), Some(1), "{r}");
        assert_eq!(r["volblocksize"].as_u64(), vb, "{r}");
        assert!(r["iops"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["lat_mean_us"].as_f64().unwrap() > 0.0, "{r}");
        if gen == "zeta-load" {
            // Measured per write, so it has a tail too; and no FLUSH was sent.
            assert!(r["lat_p99_us"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["writes_per_flush"].is_null(), "{r}");
            // The run's mean is a weighted mean of its seconds': the slowest is no faster.
            let worst = r["worst_second_lat_mean_us"].as_f64().unwrap();
            assert!(worst >= r["lat_mean_us"].as_f64().unwrap() * 0.999, "{r}");
        } else {
            assert!(r["worst_second_lat_mean_us"].is_null(), "{r}");
        }
    }
    // Nothing left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Whether `dir` is on a block device whose statistics the kernel shows.
fn on_block_device(dir: &Path) -> bool {
    let dev = dir.metadata().unwrap().dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    major != 0 && Path::new(&format!("/sys/dev/block/{major}:{minor}/stat")).exists()
}

#[test]
fn bad_arguments_are_one_line() {
    for (args, needle) in [
        (
            &["--volblocksize", "3K"][..],
            "power of two from 4K to 128K",
        ),
        (&["--size", "10M"], "at least 16M"),
        (&["--runtime", "0"], "from 1 to 3600"),
        (&["--pool-scale", "1"], "from 2 to 64"),
        (&["--runs", "0"], "from 1 to 9"),
        (&["--points", "4K/0"], "from 1 to 1000"),
    ] {
        let out = zeta(&[&["bench", "sync"][..], args].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{err}");
    }
}

/// `zeta bench load` against a served volume: the writes and flushes really reach the pool's
/// intent log (its counters, read through the control socket), in the ratio asked for.
#[test]
fn load_drives_a_served_volume_with_exactly_n_writes_per_flush() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let leaf = dir.path().join("leaf");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_zeta"))
            .env("ZETA_HOME", &home)
            .args(args)
            .output()
            .unwrap()
    };
    // Runs a command that must succeed; its stdout.
    let ok = |args: &[&str]| {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let leaf = leaf.to_str().unwrap();
    ok(&["pool", "create", "-o", "size=256M", "tank", leaf]);
    ok(&["vol", "create", "tank/v", "32M"]);
    let mut serve = Command::new(env!("CARGO_BIN_EXE_zeta"));
    serve
        .env("ZETA_HOME", &home)
        .args(["serve", "--listen", "127.0.0.1:0", "tank"]);
    let (child, addr, _) = common::procs::spawn_server(serve);
    let mut child = KillOnDrop(child);
    let addr = addr.to_string();

    let load = ["bench", "load", "--addr", &addr, "--runtime", "1"];
    let text = ok(&[&load[..], &["--depth", "8", "--flush-every", "4", "tank/v"]].concat());
    let writes_per_sec: f64 = text
        .split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(writes_per_sec > 0.0, "{text}");
    assert!(text.contains("4.00 writes per flush"), "{text}");
    let flush_mean: f64 = text
        .split("flushes: mean ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no flush latency in {text}"));
    assert!(flush_mean > 0.0, "{text}");

    let stats: Value = serde_json::from_str(&ok(&["pool", "iostat", "tank", "--json"])).unwrap();
    let log = &stats["log"];
    let queued = log["records_queued"]
        .as_f64()
        .unwrap_or_else(|| panic!("{stats}"));
    let flushes = log["sync_requests"].as_f64().unwrap();
    assert!(log["batches"].as_u64().unwrap() > 0, "{stats}");
    // The log took every flush, the first ones too: the server put its chain's header on
    // disk before it served the volume.
    assert_eq!(log["fallback_syncs"].as_u64(), Some(0), "{stats}");
    assert!(
        flushes > 0.0 && (3.9..=4.1).contains(&(queued / flushes)),
        "the server saw {queued} writes and {flushes} flushes"
    );

    // Several connections to one volume, each with one FUA write at a time: each reader
    // runs its request itself and may not stay on as the log's committer, so it hands the
    // others' waiting writes to a worker. A write left without a committer would never be
    // answered, and the run would fail on its reply timeout.
    let lone = [
        "--depth", "1", "--fua", "tank/v", "tank/v", "tank/v", "tank/v",
    ];
    let text = ok(&[&load[..], &lone].concat());
    assert!(text.contains("no flushes"), "{text}");

    // Writes larger than the random data a connection sends from (256K) are cut from twice
    // their size of it.
    let big = [
        "--bs",
        "512K",
        "--depth",
        "4",
        "--flush-every",
        "2",
        "tank/v",
    ];
    let text = ok(&[&load[..], &big].concat());
    assert!(text.contains("2.00 writes per flush"), "{text}");

    // --interval: the run's writes, slice by slice; together they are the whole run's.
    let text = ok(&[&load[..], &["--depth", "4", "--interval", "0.5", "tank/v"]].concat());
    let mut lines = text.lines();
    let total: f64 = lines
        .next()
        .and_then(|l| l.split_whitespace().next())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(lines.next().unwrap().contains("from s"), "{text}");
    let slices: Vec<Vec<f64>> = lines
        .map(|l| {
            l.split_whitespace()
                .map(|w| w.parse().unwrap_or(-1.0))
                .collect()
        })
        .collect();
    assert_eq!(slices.len(), 2, "{text}");
    assert_eq!((slices[0][0], slices[1][0]), (0.0, 0.5), "{text}");
    let per_slice: f64 = slices.iter().map(|s| s[1] * 0.5).sum();
    assert!((per_slice - total).abs() <= 2.0, "{text}");
    // A slice may hold no write at all (a stall of half a second is what it is there to
    // show: "-" for its latencies); one that does has a longest write no shorter than its mean.
    assert!(total > 0.0, "{text}");
    assert!(
        slices
            .iter()
            .all(|s| (s[1] == 0.0 && s[2] == -1.0) || (s[1] > 0.0 && s[4] >= s[2])),
        "{text}"
    );

    // Errors: one line each, and the server is unharmed.
    for (args, needle) in [
        (&["--bs", "1000"][..], "a multiple of 4K"),
        (&["--bs", "8M"][..], "up to 4096K"),
        (&["--depth", "0"][..], "0 is not in 1..=256"),
        (&["--interval", "0"][..], "at least 0.001"),
        (&["tank/nope"][..], "tank/nope"),
    ] {
        let mut all = load.to_vec();
        all.extend_from_slice(args);
        if !args[0].starts_with("tank") {
            all.push("tank/v");
        }
        let out = run(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // A slice is a line of output: a run is cut into at most 100000, refused before it starts.
    let many = [
        "bench",
        "load",
        "--addr",
        &addr,
        "--runtime",
        "1000",
        "--interval",
        "0.001",
        "tank/v",
    ];
    let out = run(&many);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("at most 100000 slices"),
        "{err}"
    );
    assert!(child.0.try_wait().unwrap().is_none(), "the server exited");
}

/// The server dies with the test, whether it passes or panics.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
