//! `zeta bench frag --quick` end to end on zeta (zfs-fuse, the peer, needs root and its
//! package; `docs/perf/frag.md` has the runs against it): every level runs without an error,
//! samples every second, and leaves its plots and maps.

use std::process::Command;

#[test]
fn the_quick_frag_bench_runs_every_level_and_draws_its_pictures() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("out");
    let run = Command::new(env!("CARGO_BIN_EXE_zeta"))
        .args([
            "bench",
            "frag",
            "--quick",
            "--json",
            "--runtime",
            "3",
            "--fills",
            "10,60",
        ])
        .args(["--size", "256M", "--writers", "4"])
        .arg("--dir")
        .arg(t.path())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let levels = v["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    for (l, fill) in levels.iter().zip([10.0, 60.0]) {
        assert_eq!(l["system"], "zeta");
        assert!(l["error"].is_null(), "{l}");
        assert_eq!(l["samples"].as_array().unwrap().len(), 3, "{l}");
        assert!(l["steady_mib_s"].as_f64().unwrap() > 0.0, "{l}");
        let occ = l["occupancy_pct"].as_f64().unwrap();
        assert!(
            (fill - 2.0..fill + 8.0).contains(&occ),
            "occupancy {occ} for {fill}"
        );
        assert!(!l["write_sizes"].as_array().unwrap().is_empty(), "{l}");
    }
    let (before, after) = (&levels[1]["frag_before"], &levels[1]["frag_after"]);
    assert!(
        after.as_u64().unwrap() > before.as_u64().unwrap(),
        "random overwrites left FRAG as it was: {before} -> {after}"
    );
    for f in [
        "series-zeta.svg",
        "steady.svg",
        "map-zeta-10-before.svg",
        "map-zeta-60-after.svg",
        "results.json",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    // Nothing of the pools is left behind.
    let left: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("zeta-bench-frag")
        })
        .collect();
    assert!(left
        .iter()
        .all(|e| std::fs::read_dir(e.path()).unwrap().next().is_none()));
}

#[test]
fn bad_frag_bench_arguments_are_one_clear_line() {
    let t = tempfile::tempdir().unwrap();
    for (args, want) in [
        (vec!["--fills", "10,120"], "percentages from 1 to 97"),
        (vec!["--fills", "ten"], "percentages from 1 to 97"),
        (
            vec!["--peer", "btrfs"],
            "the peer this bench knows is zfs-fuse",
        ),
        (vec!["--format", "jpg"], "svg or png"),
        (vec!["--size", "64M"], "at least 256M"),
        (vec!["--runtime", "1"], "at least 2 seconds"),
    ] {
        let run = Command::new(env!("CARGO_BIN_EXE_zeta"))
            .args(["bench", "frag"])
            .args(&args)
            .arg("--dir")
            .arg(t.path())
            .arg("--out")
            .arg(t.path().join("out"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{args:?} ran");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
