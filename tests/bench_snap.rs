//! `zeta bench snap --json`: zeta's figures are measured at each size, each peer's too where
//! it can run here (btrfs needs root, loop devices and btrfs-progs; qcow2 qemu-utils) or
//! skipped with why, each ratio is its figures', and the overwrite rows cover 0 to 100
//! snapshots.

mod common;
use common::procs::bench_json;

#[test]
fn bench_snap_measures_zeta_against_btrfs_and_qcow2() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench_json(
        &["snap", "--size", "64M", "--runs", "1", "--iops-secs", "0.2"],
        dir.path(),
    );
    let row = &v["sizes"][0];
    assert_eq!(row["size"], 64 << 20);
    let z = &row["zeta"];
    for k in [
        "snapshot_ms",
        "destroy_1_ms",
        "destroy_50_ms",
        "send_mbps",
        "read_mbps",
        "receive_mbps",
        "write_mbps",
    ] {
        assert!(z[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
    // An incremental stream carries what changed, and little beside.
    let (stream, changed) = (
        z["incremental_stream_bytes"].as_f64().unwrap(),
        z["incremental_changed_bytes"].as_f64().unwrap(),
    );
    assert!(
        changed > 0.0 && stream >= changed && stream < changed * 1.1 + 4096.0,
        "{v}"
    );
    for (peer, keys) in [
        (
            "btrfs",
            &["snapshot_ms", "destroy_1_ms", "destroy_50_ms", "send_mbps"][..],
        ),
        (
            "qcow2",
            &["snapshot_ms", "destroy_1_ms", "destroy_50_ms"][..],
        ),
    ] {
        let p = &row[peer];
        if let Some(why) = p["skipped"].as_str() {
            // CI installs qemu-utils: there qcow2 must run. btrfs also needs root and loop
            // devices, which a CI machine may lack.
            assert!(
                peer == "btrfs" || std::env::var("ZETA_REQUIRE_CLIENTS").is_err(),
                "{peer} skipped: {why}"
            );
            continue;
        }
        for k in keys {
            assert!(p[k].as_f64().unwrap() > 0.0, "{peer} {k}: {v}");
        }
        let r = row["ratios"][format!("snapshot_vs_{peer}")]
            .as_f64()
            .unwrap();
        let want = z["snapshot_ms"].as_f64().unwrap() / p["snapshot_ms"].as_f64().unwrap();
        assert!((r - want).abs() < 1e-9, "{v}");
    }
    let counts: Vec<u64> = (v["overwrite_4k"].as_array().unwrap().iter())
        .map(|o| o["snapshots"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [0, 1, 10, 100]);
    // Each count ran twice (in order, then in reverse): its figure is their mean.
    for o in v["overwrite_4k"].as_array().unwrap() {
        let runs: Vec<f64> = (o["runs"].as_array().unwrap().iter())
            .map(|r| r.as_f64().unwrap())
            .collect();
        assert_eq!(runs.len(), 2, "{o}");
        let mean = (runs[0] + runs[1]) / 2.0;
        assert!(
            (o["iops"].as_f64().unwrap() - mean).abs() < 1e-6 && mean > 0.0,
            "{o}"
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "left files behind"
    );
}
