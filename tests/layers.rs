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
