//! `zeta bench vol --json`: every workload is measured against the raw file, and the process
//! stays within its configured cache and dirty limit while writing several times that much.

use std::process::Command;

mod common;
use common::procs::bench_json;

#[test]
fn bench_vol_measures_every_workload_within_its_memory_limits() {
    let dir = tempfile::tempdir().unwrap();
    // 256M of sequential writes alone is over 5× the 48M the process is given.
    let args = [
        "vol",
        "--size",
        "256M",
        "--random-ops",
        "5000",
        "--runs",
        "1",
        "--cache",
        "32M",
        "--dirty-max",
        "16M",
    ];
    let v = bench_json(&args, dir.path());
    let rows = v["rows"].as_array().unwrap();
    let ops: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| (r["op"].as_str().unwrap(), r["bs"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        ops,
        [
            ("seqwrite", 1 << 20),
            ("seqread", 1 << 20),
            ("randwrite", 4096),
            ("randread", 4096),
            ("randwrite", 16384),
            ("randread", 16384)
        ]
    );
    for r in rows {
        let (z, raw) = (
            r["zeta_mbps"].as_f64().unwrap(),
            r["raw_mbps"].as_f64().unwrap(),
        );
        assert!(z > 0.0 && raw > 0.0, "{r}");
        assert!((r["ratio"].as_f64().unwrap() - z / raw).abs() < 1e-9, "{r}");
    }
    assert_eq!(v["cache_bytes"], 32 << 20);
    assert_eq!(v["dirty_max_bytes"], 16 << 20);
    // Without the governor the cache, the dirty data and the rest of the process came to
    // 59-64M here.
    let rss = v["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        rss > 0 && rss <= 48 << 20,
        "peak RSS {} MiB over the 48 MiB configured",
        rss >> 20
    );
    // Nothing left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn bench_vol_refuses_memory_limits_that_cannot_work() {
    let out = Command::new(env!("CARGO_BIN_EXE_zeta"))
        .args(["bench", "vol", "--cache", "100K"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim(), "zeta: --cache must be at least 1M");
}
