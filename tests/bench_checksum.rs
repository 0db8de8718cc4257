//! `zeta bench checksum --json --quick`: the rows are well formed, and the memory reference,
//! every fletcher2 and fletcher4 kernel this CPU supports, SHA-256 and BLAKE3 each have a row
//! for both buffer sizes.

use std::collections::BTreeSet;
use std::process::Command;

use zeta::math::fletcher::Fletcher4Impl;
use zeta::math::fletcher2::Fletcher2Impl;

#[test]
fn bench_checksum_json_lists_every_algorithm_and_kernel() {
    let out = Command::new(env!("CARGO_BIN_EXE_zeta"))
        .args(["bench", "checksum", "--json", "--quick", "--runs", "1"])
        .env_remove("ZETA_FLETCHER2_IMPL")
        .env_remove("ZETA_FLETCHER4_IMPL")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {err}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    let rows = rows.as_array().expect("a list of rows");
    let mut seen = BTreeSet::new();
    for r in rows {
        let obj = r.as_object().expect("a row is an object");
        let keys: BTreeSet<&str> = obj.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            keys,
            BTreeSet::from([
                "algorithm",
                "impl",
                "buffer_bytes",
                "gbps",
                "ratio_to_memread"
            ]),
            "{r}"
        );
        let algorithm = r["algorithm"].as_str().expect("algorithm is a string");
        let imp = r["impl"].as_str().expect("impl is a string");
        assert!(
            ["memread", "fletcher2", "fletcher4", "sha256", "blake3"].contains(&algorithm),
            "{r}"
        );
        let bytes = r["buffer_bytes"]
            .as_u64()
            .expect("buffer_bytes is a number");
        assert!([4096, 131072].contains(&bytes), "{r}");
        let gbps = r["gbps"].as_f64().expect("gbps is a number");
        assert!(gbps.is_finite() && gbps > 0.0, "{r}");
        let ratio = r["ratio_to_memread"].as_f64().expect("ratio is a number");
        assert!(ratio.is_finite() && ratio > 0.0, "{r}");
        if algorithm == "memread" {
            assert_eq!(ratio, 1.0, "the reference is its own unit: {r}");
            assert!(imp.starts_with("sum-"), "{r}");
        }
        assert!(
            seen.insert((algorithm.to_string(), imp.to_string(), bytes)),
            "duplicate row {r}"
        );
    }
    let mut want: Vec<(&str, &str)> = vec![("memread", ""), ("sha256", ""), ("blake3", "crate")];
    let f2 = Fletcher2Impl::supported_list();
    let f4: Vec<Fletcher4Impl> = Fletcher4Impl::ALL
        .into_iter()
        .filter(|k| k.supported())
        .collect();
    assert!(f2.contains(&Fletcher2Impl::Reference) && f4.contains(&Fletcher4Impl::Reference));
    want.extend(f2.iter().map(|k| ("fletcher2", k.name())));
    want.extend(f4.iter().map(|k| ("fletcher4", k.name())));
    for bytes in [4096u64, 131072] {
        for (algorithm, imp) in &want {
            let found = seen
                .iter()
                .any(|(a, i, b)| a == algorithm && *b == bytes && (imp.is_empty() || i == imp));
            assert!(found, "no row for {algorithm} {imp} at {bytes} bytes");
        }
    }
    // OpenSSL's SHA-256 is the reference row wherever the tool is installed.
    let openssl = seen.iter().filter(|(_, i, _)| i == "openssl").count();
    let have_openssl = Command::new("openssl").arg("version").output().is_ok();
    assert_eq!(openssl, if have_openssl { 2 } else { 0 }, "openssl rows");
    assert_eq!(
        rows.len(),
        2 * want.len() + openssl,
        "one row per contender and size"
    );
    // SHA-256 names the code sha2 takes here.
    let sha = seen
        .iter()
        .find(|(a, i, _)| a == "sha256" && i != "openssl")
        .unwrap();
    assert!(["sha-ni", "soft"].contains(&sha.1.as_str()), "{sha:?}");
}
