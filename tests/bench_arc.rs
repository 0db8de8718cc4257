//! `zeta bench arc --json`: the block cache and an LRU of the same size get the same
//! requests; on a hot set read while a scan of four times the cache runs through, the ARC
//! keeps the hot set and the LRU does not (the requests are seeded, so this is no timing).

use std::process::Command;

#[test]
fn bench_arc_keeps_a_hot_set_through_a_scan_that_an_lru_loses() {
    // This bench touches no disk, so it takes no --dir (unlike common::procs::bench_json).
    let out = Command::new(env!("CARGO_BIN_EXE_zeta"))
        .args(["bench", "arc", "--cache", "16M", "--runs", "1", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["cache_bytes"], 16 << 20);
    let rows = v["rows"].as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["hot+scan", "zipf-0.9"]);
    for r in rows {
        let (a, l) = (
            r["arc_hit_ratio"].as_f64().unwrap(),
            r["lru_hit_ratio"].as_f64().unwrap(),
        );
        assert!((0.0..=1.0).contains(&a) && (0.0..=1.0).contains(&l), "{r}");
        assert!(r["requests"].as_u64().unwrap() > 0);
        if r["workload"] == "hot+scan" {
            assert!(a >= 1.5 * l, "ARC {a} against LRU {l}");
        } else {
            assert!(a > 0.2 && a >= l * 0.95, "Zipf: ARC {a} against LRU {l}");
        }
    }
}
