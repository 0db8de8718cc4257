//! The crates' dependencies point down the layers of ARCHITECTURE.md and nowhere else: a lower
//! crate that names a higher one (or a crate the table does not place) fails here, before the
//! cycle or the shortcut can grow.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

/// Each workspace crate's layer, bottom up. A crate may depend only on crates of a lower layer.
const LAYERS: &[(&str, u32)] = &[
    ("zeta-math", 0),
    ("zeta-core", 1),
    ("zeta-nbd", 2),
    ("zeta-plot", 2),
    ("zeta-rados", 2),
    ("zeta-server", 3),
    ("zeta-bench", 4),
    ("zeta", 5),
];

/// Crates for front ends and benchmarks that the engine and the protocol must not pull in.
const FRONT_END_ONLY: &[&str] = &["clap", "libloading", "plotters", "indicatif", "signal-hook"];
const ENGINE: &[&str] = &["zeta-math", "zeta-core", "zeta-nbd"];

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// Each package's name and the names of its normal (not dev or build) dependencies.
fn dependencies(meta: &Value) -> BTreeMap<String, Vec<String>> {
    meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().expect("name").to_string())
                .collect();
            (p["name"].as_str().expect("name").to_string(), deps)
        })
        .collect()
}

fn layer(name: &str) -> Option<u32> {
    LAYERS.iter().find(|(n, _)| *n == name).map(|&(_, l)| l)
}

/// What is wrong with `deps`: upward or unplaced edges, front-end crates in the engine.
fn violations(deps: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    let mut wrong = Vec::new();
    for (krate, names) in deps {
        let Some(own) = layer(krate) else {
            wrong.push(format!("{krate} has no layer in tests/layers.rs"));
            continue;
        };
        for d in names.iter().filter(|d| d.starts_with("zeta")) {
            match layer(d) {
                Some(l) if l < own => {}
                Some(l) => wrong.push(format!("{krate} (layer {own}) depends on {d} (layer {l})")),
                None => wrong.push(format!("{krate} depends on {d}, which has no layer")),
            }
        }
        if ENGINE.contains(&krate.as_str()) {
            for d in names
                .iter()
                .filter(|d| FRONT_END_ONLY.contains(&d.as_str()))
            {
                wrong.push(format!("{krate} is engine but depends on {d}"));
            }
        }
    }
    wrong
}

#[test]
fn every_crate_depends_only_on_lower_layers() {
    let deps = dependencies(&metadata());
    let wrong = violations(&deps);
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
    // The table names every crate of the workspace, so the check covers them all.
    for (name, _) in LAYERS {
        assert!(
            deps.contains_key(*name),
            "{name} is in the table but not the workspace"
        );
    }
}

/// The check sees each kind of wrong edge, so the test above cannot pass by reading nothing.
#[test]
fn wrong_edges_are_caught() {
    let mut deps = dependencies(&metadata());
    assert!(deps["zeta-core"].iter().any(|d| d == "zeta-math"));
    deps.get_mut("zeta-core")
        .unwrap()
        .push("zeta-server".into());
    deps.get_mut("zeta-nbd").unwrap().push("zeta-plot".into());
    deps.get_mut("zeta-math").unwrap().push("libloading".into());
    deps.insert("zeta-extra".into(), vec![]);
    let wrong = violations(&deps);
    for expected in [
        "zeta-core (layer 1) depends on zeta-server (layer 3)",
        "zeta-nbd (layer 2) depends on zeta-plot (layer 2)",
        "zeta-math is engine but depends on libloading",
        "zeta-extra has no layer in tests/layers.rs",
    ] {
        assert!(
            wrong.iter().any(|w| w == expected),
            "missed: {expected} in {wrong:?}"
        );
    }
}

/// The engine's inner layers, which the crates above reach only through `dsl` and `zvol`.
const INNER: &[&str] = &["vdev", "spa", "zio", "dmu", "zil"];

/// The engine modules a line of Rust names through `prefix` (`zeta_core::` or, in the root
/// crate, `crate::`), grouped imports (`zeta_core::{dsl, vdev::X}`) included.
fn named_modules<'a>(line: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find(prefix) {
        let after = &rest[at + prefix.len()..];
        let segments: Vec<&str> = match after.strip_prefix('{') {
            Some(group) => group[..group.find('}').unwrap_or(group.len())]
                .split(',')
                .map(str::trim)
                .collect(),
            None => vec![after],
        };
        for s in segments {
            let end = s
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(s.len());
            out.push(&s[..end]);
        }
        rest = after;
    }
    out
}

/// Lines of `text` (not comments) that name an inner engine module through `prefix`.
fn inner_uses(text: &str, prefix: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .filter(|l| named_modules(l, prefix).iter().any(|m| INNER.contains(m)))
        .map(|l| l.trim().to_string())
        .collect()
}

fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read source dir") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The front ends (the CLI, the serving runtime, NBD, the pictures) reach the engine through
/// `dsl` and `zvol` alone, as `src/cli/mod.rs` and `zeta_core`'s doc say: what they need of the
/// layers below, `dsl` re-exports. (The benchmarks measure the layers themselves and may.)
#[test]
fn front_ends_reach_the_engine_through_dsl_and_zvol() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    for (dir, prefixes) in [
        ("src", &["zeta_core::", "crate::", "zeta::"][..]),
        ("crates/zeta-server/src", &["zeta_core::"][..]),
        ("crates/zeta-nbd/src", &["zeta_core::"][..]),
        ("crates/zeta-plot/src", &["zeta_core::"][..]),
    ] {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        assert!(!files.is_empty(), "no sources under {dir}");
        for f in files {
            // The root crate's lib.rs re-exports the layers for tests and tools.
            if f.ends_with("src/lib.rs") && dir == "src" {
                continue;
            }
            let text = std::fs::read_to_string(&f).expect("read source");
            for p in prefixes {
                for l in inner_uses(&text, p) {
                    wrong.push(format!("{}: {l}", f.display()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "front ends reach below dsl/zvol:\n{}",
        wrong.join("\n")
    );
}

/// The scan sees each way of naming an inner module, so the test above cannot pass by
/// reading nothing.
#[test]
fn inner_uses_are_caught() {
    let text = "use zeta_core::vdev::FileDevice;\n\
                use zeta_core::{dsl::Pool, spa::BlkPtr};\n\
                // zeta_core::zio in a comment\n\
                let x = zeta_core::dsl::Pool::import;\n\
                fn f(_: &zeta_core::zil::Log) {}\n";
    assert_eq!(
        inner_uses(text, "zeta_core::"),
        [
            "use zeta_core::vdev::FileDevice;",
            "use zeta_core::{dsl::Pool, spa::BlkPtr};",
            "fn f(_: &zeta_core::zil::Log) {}",
        ]
    );
    assert_eq!(
        named_modules("crate::{dmu, dsl}", "crate::"),
        ["dmu", "dsl"]
    );
}
