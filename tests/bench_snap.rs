//! `zeta bench snap --json`: zeta's figures are measured, each peer's too where it can run
//! here (btrfs needs root, loop devices and btrfs-progs; qcow2 qemu-utils) or skipped with
//! why, and each ratio is its figures'.

mod common;
use common::procs::bench_json;

#[test]
fn bench_snap_measures_zeta_against_btrfs_and_qcow2() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench_json(&["snap", "--size", "64M", "--runs", "1"], dir.path());
    let z = &v["zeta"];
    for k in ["snapshot_ms", "destroy_ms", "send_mbps"] {
        assert!(z[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
    assert!(v["txg_commit_ms"].as_f64().unwrap() > 0.0, "{v}");
    for (peer, keys) in [
        ("btrfs", &["snapshot_ms", "destroy_ms", "send_mbps"][..]),
        ("qcow2", &["snapshot_ms", "destroy_ms"][..]),
    ] {
        let p = &v[peer];
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
        let r = v[format!("ratio_snapshot_{peer}")].as_f64().unwrap();
        let want = z["snapshot_ms"].as_f64().unwrap() / p["snapshot_ms"].as_f64().unwrap();
        assert!((r - want).abs() < 1e-9, "{v}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "left files behind"
    );
}
