//! Helpers for tests that run real processes: client tools, `zeta serve`, file-vdev pools.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use zeta::dsl::{Pool, PoolOptions};

/// Whether `tool` is on PATH; if not, either skip (returns false) or fail under CI.
pub fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("ZETA_REQUIRE_CLIENTS").is_none(),
            "{tool} is not installed (see .ci/run)"
        );
        eprintln!("SKIPPED: {tool} is not installed (install it as .ci/run does)");
    }
    found
}

/// Spawns `cmd` (a `zeta serve` or `zeta up` with `--listen 127.0.0.1:0`) and returns the
/// child, the address from its line "serving on 127.0.0.1:PORT: ...", and the lines printed
/// before it. Its stdout is drained from then on, so the server never blocks on a full pipe.
pub fn spawn_server(mut cmd: Command) -> (Child, SocketAddr, Vec<String>) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut before = Vec::new();
    let addr = loop {
        let l = lines.next().expect("server output").unwrap();
        if let Some(rest) = l.strip_prefix("serving on ") {
            break rest
                .split(':')
                .take(2)
                .collect::<Vec<_>>()
                .join(":")
                .parse()
                .unwrap_or_else(|e| panic!("unexpected line {l:?}: {e}"));
        }
        before.push(l);
    };
    std::thread::spawn(move || for _ in lines {});
    (child, addr, before)
}

/// Imports pool `name` from file vdevs.
pub fn import_files(paths: &[PathBuf], name: &str, opts: PoolOptions) -> Arc<Pool> {
    let devs = paths
        .iter()
        .map(|p| {
            (
                zeta::vdev::scheme::open(p, false)
                    .unwrap_or_else(|e| panic!("open {}: {e}", p.display())),
                p.display().to_string(),
            )
        })
        .collect();
    Pool::import(devs, Some(name), opts).expect("import")
}

/// A seed from environment variable `var`, or a random one.
pub fn seed_from_env(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

/// Runs `zeta bench ARGS --json --dir DIR`, which must succeed, and returns its JSON output.
pub fn bench_json(args: &[&str], dir: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_zeta"))
        .arg("bench")
        .args(args)
        .arg("--json")
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {err}");
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The `zeta` binary with `ZETA_HOME=home`.
pub fn zeta_in(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zeta"));
    c.env("ZETA_HOME", home);
    c
}

/// `zeta pool create -o size=512M tank leaf` in `dir` (state in `home`), and a volume
/// `tank/v` of `vol_size`: the served pool of the NBD server tests.
pub fn pool_with_volume(dir: &Path, home: &Path, vol_size: &str) {
    let mut c = zeta_in(home);
    c.current_dir(dir)
        .args(["pool", "create", "-o", "size=512M", "tank", "leaf"]);
    run_ok(c, "pool create");
    let mut c = zeta_in(home);
    c.args(["vol", "create", "tank/v", vol_size]);
    run_ok(c, "vol create");
}

/// Runs `c` and fails the test, with its stderr, unless it succeeds.
pub fn run_ok(mut c: Command, what: &str) {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A field of /proc/PID/status in bytes (`VmHWM`, `VmRSS`) or as a count (`Threads`).
pub fn status_field(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let v: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
    if field.starts_with("Vm") {
        v << 10
    } else {
        v
    }
}
