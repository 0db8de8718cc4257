//! `zeta bench parity --json --quick`: the rows are well formed, and every kernel this CPU
//! supports has a row for every geometry, operation and code (ISA-L rows when it is there).

use std::collections::BTreeSet;
use std::process::Command;

use zeta::math::parity::ParityImpl;

#[test]
fn bench_parity_json_lists_every_supported_kernel() {
    let out = Command::new(env!("CARGO_BIN_EXE_zeta"))
        .args(["bench", "parity", "--json", "--quick", "--runs", "1"])
        .env_remove("ZETA_PARITY_IMPL")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {err}");
    assert!(!err.contains("differs"), "ISA-L disagrees with zeta: {err}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    let rows = rows.as_array().expect("a list of rows");
    let mut seen = BTreeSet::new();
    for r in rows {
        let obj = r.as_object().expect("a row is an object");
        let keys: BTreeSet<&str> = obj.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            keys,
            BTreeSet::from(["geometry", "column_bytes", "op", "code", "impl", "gbps"]),
            "{r}"
        );
        let s = |k: &str| {
            r[k].as_str()
                .unwrap_or_else(|| panic!("{k} is a string: {r}"))
        };
        assert!(
            ["4+1", "4+2", "8+2", "16+2", "8+3"].contains(&s("geometry")),
            "{r}"
        );
        assert_eq!(
            r["column_bytes"].as_u64(),
            Some(4096),
            "--quick measures 4 KiB: {r}"
        );
        assert!(["gen", "rec2"].contains(&s("op")), "{r}");
        assert!(["xor", "rs", "rdp"].contains(&s("code")), "{r}");
        let gbps = r["gbps"].as_f64().expect("gbps is a number");
        assert!(gbps.is_finite() && gbps > 0.0, "{r}");
        seen.insert((
            s("geometry").to_string(),
            s("op").to_string(),
            s("code").to_string(),
            s("impl").to_string(),
        ));
    }
    let mut cases = vec![
        ("4+1", "gen", "xor"),
        ("8+3", "gen", "rs"),
        ("8+3", "rec2", "rs"),
    ];
    for g in ["4+2", "8+2", "16+2"] {
        for op in ["gen", "rec2"] {
            for code in ["rs", "rdp"] {
                cases.push((g, op, code));
            }
        }
    }
    let kernels = ParityImpl::supported_list();
    assert!(kernels.contains(&ParityImpl::Scalar));
    for (g, op, code) in &cases {
        for k in &kernels {
            let key = (
                g.to_string(),
                op.to_string(),
                code.to_string(),
                k.name().to_string(),
            );
            assert!(seen.contains(&key), "no row for {key:?}");
        }
    }
    let isal_rows = seen.iter().filter(|k| k.3 == "isa-l").count();
    assert!(
        isal_rows == 0 || isal_rows == 9,
        "ISA-L runs once per geometry and op, or not at all: {isal_rows}"
    );
    assert_eq!(rows.len(), cases.len() * kernels.len() + isal_rows);
}
