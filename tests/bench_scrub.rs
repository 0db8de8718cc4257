//! `zeta bench scrub --json`: both speeds are measured and the ratio is theirs.

mod common;
use common::procs::bench_json;

#[test]
fn bench_scrub_reports_cat_and_scrub_speeds() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench_json(&["scrub", "--size", "64M", "--runs", "1"], dir.path());
    let cat = v["cat_gbps"].as_f64().unwrap();
    let scrub = v["scrub_gbps"].as_f64().unwrap();
    assert!(cat > 0.0 && scrub > 0.0, "{v}");
    assert!(
        (v["ratio"].as_f64().unwrap() - scrub / cat).abs() < 1e-9,
        "{v}"
    );
    assert_eq!(v["size"], 64 << 20);
    // Nothing left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
