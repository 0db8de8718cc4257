//! `zeta bench compress --json`: every codec is measured inside the pipeline and as the crate,
//! on both data sets and block sizes; the ratios are what the blocks store (random data not
//! at all, the tar of /usr well), beside the command-line tools and btrfs where they run; and
//! the volume rows read back what they wrote (the bench fails otherwise) at every setting.

mod common;
use common::procs::bench_json;

#[test]
fn bench_compress_measures_codecs_ratios_and_volumes_against_their_references() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench_json(&["compress", "--size", "8M", "--runs", "1"], dir.path());
    let key = |r: &serde_json::Value| {
        (
            r["data"].as_str().unwrap().to_string(),
            r["bs"].as_u64().unwrap(),
            r["codec"].as_str().unwrap().to_string(),
        )
    };
    let mut want = Vec::new();
    for data in ["random", "usr-tar"] {
        for bs in [16384, 131072] {
            for codec in ["lz4", "zstd"] {
                want.push((data.to_string(), bs, codec.to_string()));
            }
        }
    }
    let codecs = v["codecs"].as_array().unwrap();
    assert_eq!(codecs.iter().map(key).collect::<Vec<_>>(), want);
    for r in codecs {
        for dir in ["compress", "decompress"] {
            let (p, c) = (
                r[dir]["pipeline_mbps"].as_f64().unwrap(),
                r[dir]["crate_mbps"].as_f64().unwrap(),
            );
            let blocks = r["decompress"]["blocks"].as_u64().unwrap();
            if dir == "compress" || blocks > 0 {
                assert!(p > 0.0 && c > 0.0, "{r}");
                assert!((r[dir]["ratio"].as_f64().unwrap() - p / c).abs() < 1e-9);
            }
        }
    }
    let ratios = v["ratios"].as_array().unwrap();
    assert_eq!(ratios.iter().map(key).collect::<Vec<_>>(), want);
    for r in ratios {
        let stored = r["zeta_stored"].as_f64().unwrap();
        let codec = r["zeta_codec"].as_f64().unwrap();
        if r["data"] == "random" {
            // Nothing saves a sector: every block is stored raw, none larger.
            assert_eq!(stored, 1.0, "{r}");
        } else {
            assert!(stored > 1.3, "a tar of /usr compresses: {r}");
            // Whole sectors cost something, and never more than a sector a block.
            assert!(stored <= codec * 1.0001, "{r}");
        }
        if let Some(cli) = r["cli"].as_f64() {
            assert!(cli > 0.5, "{r}");
            assert!((r["stored_vs_cli"].as_f64().unwrap() - stored / cli).abs() < 1e-9);
        } else {
            assert!(
                r["cli"]["skipped"].as_str().unwrap().contains("not found"),
                "{r}"
            );
        }
    }
    for b in v["btrfs"].as_array().unwrap() {
        if let Some(x) = b["ratio"].as_f64() {
            assert!(x >= 0.99, "{b}");
        } else {
            assert!(!b["skipped"].as_str().unwrap().is_empty(), "{b}");
        }
    }
    let vol = v["volume"].as_array().unwrap();
    assert_eq!(vol.len(), 12);
    for r in vol {
        assert!(r["write_mbps"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["read_mbps"].as_f64().unwrap() > 0.0, "{r}");
        let cr = r["compressratio"].as_f64().unwrap();
        match (
            r["data"].as_str().unwrap(),
            r["compression"].as_str().unwrap(),
        ) {
            (_, "off") | ("random", _) => assert!((0.95..=1.0).contains(&cr), "{r}"),
            _ => assert!(cr > 1.3, "{r}"),
        }
    }
}
