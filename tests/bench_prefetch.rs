//! `zeta bench prefetch --json`: every layout and request size measured for the raw file and
//! the volume with prefetch off and on; short reads are read ahead (and every block read ahead
//! is used, read in order), long reads are not, and with prefetch off nothing is.

mod common;

use common::procs::bench_json;

#[test]
fn bench_prefetch_reads_ahead_of_short_sequential_reads() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench_json(&["prefetch", "--size", "16M", "--runs", "1"], dir.path());
    assert_eq!(v["size_bytes"], 16 << 20);
    let rows = v["rows"].as_array().unwrap();
    let got: Vec<(String, u64)> = (rows.iter())
        .map(|r| {
            (
                r["layout"].as_str().unwrap().to_string(),
                r["bs"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = ["in order", "scattered"]
        .iter()
        .flat_map(|l| [4096, 16384, 131072].map(|bs| (l.to_string(), bs)))
        .collect();
    assert_eq!(got, want);
    for r in rows {
        for k in ["raw_mbps", "off_mbps", "on_mbps", "on_vs_off", "on_vs_raw"] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{k}: {r}");
        }
        let (blocks, hits) = (
            r["prefetch_blocks"].as_u64().unwrap(),
            r["prefetch_hits"].as_u64().unwrap(),
        );
        if r["bs"] == 131072 {
            assert_eq!(blocks, 0, "long reads are not read ahead: {r}");
        } else {
            // How many depends on how the reader and the prefetch thread share the cores.
            assert!(blocks > 0 && hits > 0 && hits <= blocks, "{r}");
        }
    }
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "cleaned up"
    );
}
