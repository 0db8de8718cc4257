//! The `zeta` binary as a user runs it: a command in a state directory and a working
//! directory, and checks of what it said.

use std::path::Path;
use std::process::{Command, Output};

/// Runs `zeta ARGS` with `ZETA_HOME=home` in `cwd`.
pub fn zeta(home: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zeta"))
        .args(args)
        .env("ZETA_HOME", home)
        .current_dir(cwd)
        .output()
        .unwrap()
}

/// The command failed, said `needle` on stderr, and did not panic.
pub fn fails_with(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {err}"
    );
    assert!(err.contains(needle), "stderr {err:?} lacks {needle:?}");
    assert!(!err.contains("panicked"), "panic: {err}");
}

/// The words of a command line, split at spaces.
pub fn words(line: &str) -> Vec<&str> {
    line.split(' ').collect()
}

/// The command succeeded; its stdout.
pub fn ok(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed: {err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
