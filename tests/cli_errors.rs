//! The `zeta` binary with bad arguments: one clear line on stderr, a non-zero exit, no panic,
//! and nothing already stored is changed.

mod common;

use std::path::Path;
use std::process::Command;

use common::cli::{fails_with, ok, words, zeta};

#[test]
fn bad_arguments_are_one_clear_line_and_change_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    fails_with(
        &zeta(&home, d, &["pool", "create", "p", "missing"]),
        "does not exist",
    );
    assert!(!d.join("missing").exists());
    fails_with(
        &zeta(
            &home,
            d,
            &["pool", "create", "-o", "size=128M", "p", "a", "a"],
        ),
        "named twice",
    );
    assert!(
        !d.join("a").exists(),
        "a failed create must not leave files"
    );
    fails_with(
        &zeta(&home, d, &["pool", "create", "-o", "size=1M", "p", "a"]),
        "too small",
    );
    assert!(!d.join("a").exists());
    fails_with(
        &zeta(&home, d, &["pool", "create", "-o", "size=12Q", "p", "a"]),
        "invalid size",
    );
    fails_with(
        &zeta(
            &home,
            d,
            &["pool", "create", "-o", "size=128M", "p", "mirror", "a"],
        ),
        "at least two",
    );
    fails_with(
        &zeta(&home, d, &["pool", "create", "-o", "colour=red", "p", "a"]),
        "unknown property",
    );
    fails_with(
        &zeta(
            &home,
            d,
            &["pool", "create", "-o", "checksum=md5", "p", "a"],
        ),
        "checksum 'md5' is not one of fletcher2, fletcher4, sha256, blake3",
    );
    fails_with(
        &zeta(
            &home,
            d,
            &[
                "pool",
                "create",
                "-o",
                "size=128M",
                "p",
                "raidz2",
                "a",
                "b",
                "c",
            ],
        ),
        "raidz2 needs 4 to 24 devices",
    );
    fails_with(
        &zeta(
            &home,
            d,
            &[
                "pool",
                "create",
                "-o",
                "size=128M",
                "-o",
                "raidz2-code=xyz",
                "p",
                "raidz2",
                "a",
                "b",
                "c",
                "d",
            ],
        ),
        "not one of rs, rdp",
    );
    assert!(!d.join("a").exists());

    ok(&zeta(
        &home,
        d,
        &["pool", "create", "-o", "size=128M", "p", "mirror", "a", "b"],
    ));
    ok(&zeta(&home, d, &["vol", "create", "p/v", "1M"]));
    // A pool nobody serves is scrubbed by the command itself, to the end.
    let out = ok(&zeta(&home, d, &["pool", "scrub", "p"]));
    assert!(out.contains("scrub of 'p' finished"), "{out}");
    fails_with(
        &zeta(&home, d, &["pool", "scrub", "--stop", "p"]),
        "not being scrubbed",
    );
    fails_with(
        &zeta(&home, d, &["pool", "scrub", "nosuch"]),
        "no imported pool",
    );
    std::fs::write(d.join("small"), vec![0x42u8; 300_000]).unwrap();
    ok(&zeta(&home, d, &["vol", "put", "p/v", "small"]));

    // Devices of an existing pool are refused without -f, even under another state directory.
    let other = t.path().join("home2");
    fails_with(
        &zeta(&other, d, &["pool", "create", "q", "a"]),
        "is a device of pool 'p'",
    );
    fails_with(
        &zeta(&home, d, &["vol", "create", "p/w", "10000"]),
        "multiple of the block size",
    );
    fails_with(
        &zeta(&home, d, &["vol", "create", "-b", "3K", "p/w", "3M"]),
        "power of two",
    );
    fails_with(
        &zeta(&home, d, &["vol", "create", "nopool", "1M"]),
        "not POOL/VOL",
    );
    fails_with(
        &zeta(
            &home,
            d,
            &["vol", "create", "-o", "checksum=crc32", "p/w", "1M"],
        ),
        "checksum 'crc32' is not one of fletcher2, fletcher4, sha256, blake3",
    );
    fails_with(
        &zeta(&home, d, &["vol", "create", "x/w", "1M"]),
        "no imported pool named 'x'",
    );
    std::fs::write(d.join("big"), vec![1u8; 2 << 20]).unwrap();
    fails_with(
        &zeta(&home, d, &["vol", "put", "p/v", "big"]),
        "does not fit",
    );
    fails_with(
        &zeta(&home, d, &["vol", "put", "p/nope", "small"]),
        "does not exist",
    );
    fails_with(&zeta(&home, d, &["pool", "destroy", "p"]), "-f");

    // Nothing above changed what was stored.
    ok(&zeta(&home, d, &["vol", "get", "p/v", "back"]));
    let back = std::fs::read(d.join("back")).unwrap();
    assert_eq!(back.len(), 1 << 20);
    assert!(back[..300_000].iter().all(|&b| b == 0x42) && back[300_000..].iter().all(|&b| b == 0));
    let status = ok(&zeta(&home, d, &["pool", "status", "p", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v[0]["state"], "ONLINE");
    assert_eq!(v[0]["vdevs"][0]["leaves"].as_array().unwrap().len(), 2);

    // Export, re-import by scanning the directory, and the data is still there.
    ok(&zeta(&home, d, &["pool", "export", "p"]));
    fails_with(&zeta(&home, d, &["vol", "list", "p"]), "no imported pool");
    ok(&zeta(
        &home,
        d,
        &["pool", "import", "-d", d.to_str().unwrap(), "p"],
    ));
    ok(&zeta(&home, d, &["vol", "get", "p/v", "back2"]));
    assert_eq!(std::fs::read(d.join("back2")).unwrap(), back);
}

#[test]
fn a_bad_checksum_kernel_override_refuses_to_open_pools() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    let out = Command::new(env!("CARGO_BIN_EXE_zeta"))
        .args(["pool", "create", "-o", "size=64M", "p", "leaf"])
        .env("ZETA_HOME", &home)
        .env("ZETA_FLETCHER4_IMPL", "bogus")
        .current_dir(d)
        .output()
        .unwrap();
    fails_with(&out, "ZETA_FLETCHER4_IMPL=bogus");
    assert!(
        !d.join("leaf").exists(),
        "nothing created under a bad override"
    );
    ok(&zeta(
        &home,
        d,
        &["pool", "create", "-o", "size=64M", "p", "leaf"],
    ));
    // The parity and fletcher2 kernel overrides are checked the same way, when a pool is
    // imported too.
    let with = |var: &str, value: &str| {
        Command::new(env!("CARGO_BIN_EXE_zeta"))
            .args(["pool", "status", "p"])
            .env("ZETA_HOME", &home)
            .env(var, value)
            .current_dir(d)
            .output()
            .unwrap()
    };
    fails_with(&with("ZETA_PARITY_IMPL", "bogus"), "ZETA_PARITY_IMPL");
    ok(&with("ZETA_PARITY_IMPL", "cycle"));
    ok(&with("ZETA_PARITY_IMPL", "scalar"));
    fails_with(
        &with("ZETA_FLETCHER2_IMPL", "bogus"),
        "ZETA_FLETCHER2_IMPL=bogus",
    );
    ok(&with("ZETA_FLETCHER2_IMPL", "reference"));
    ok(&with("ZETA_FLETCHER2_IMPL", "unrolled"));
}

/// Sparse files may be promised more than their file system has: `pool create` warns (and
/// succeeds), naming the ENOSPC that filling it would bring; a pool that fits is not warned of.
#[test]
fn a_pool_larger_than_its_file_system_is_warned_of() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    let out = zeta(
        &home,
        d,
        &["pool", "create", "-o", "size=64M", "small", "s"],
    );
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("warning"), "{err}");

    let free = zeta::server::room::free_bytes(d).expect("statvfs");
    let size = format!("size={}M", (free >> 20) + 1024);
    let out = zeta(
        &home,
        d,
        &["pool", "create", "-o", &size, "big", "b1", "b2"],
    );
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: pool 'big': 2 sparse files") && err.contains("ENOSPC"),
        "{err}"
    );
}

/// `-o prealloc=on` allocates every block of the files it creates (no warning then, and the
/// file system cannot fill under the pool); where the room is not there it fails at once,
/// clearly, and leaves no file behind.
#[test]
fn prealloc_allocates_the_files_or_fails_at_once() {
    use std::os::unix::fs::MetadataExt as _;
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    let out = zeta(
        &home,
        d,
        &words("pool create -o size=64M -o prealloc=on p mirror a b"),
    );
    ok(&out);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"));
    for f in ["a", "b"] {
        let m = std::fs::metadata(d.join(f)).unwrap();
        assert_eq!(m.len(), 64 << 20);
        assert!(m.blocks() * 512 >= m.len(), "{f}: {} blocks", m.blocks());
    }
    // Sparse by default.
    ok(&zeta(
        &home,
        d,
        &words("pool create -o size=64M q mirror c g"),
    ));
    let m = std::fs::metadata(d.join("c")).unwrap();
    assert!(
        m.blocks() * 512 < m.len() / 2,
        "sparse: {} blocks",
        m.blocks()
    );
    // A file made to replace a device is made as its siblings were.
    for (pool, old, new, full) in [("p", "a", "a2", true), ("q", "c", "c2", false)] {
        let old = d.join(old).display().to_string();
        let new = d.join(new).display().to_string();
        ok(&zeta(&home, d, &["pool", "replace", pool, &old, &new]));
        let m = std::fs::metadata(&new).unwrap();
        assert_eq!(m.len(), 64 << 20);
        assert_eq!(
            m.blocks() * 512 >= m.len(),
            full,
            "{new}: {} blocks",
            m.blocks()
        );
    }

    let free = zeta::server::room::free_bytes(d).expect("statvfs");
    let size = format!("size={}M", (free >> 20) + 1024);
    fails_with(
        &zeta(
            &home,
            d,
            &["pool", "create", "-o", &size, "-o", "prealloc=on", "r", "e"],
        ),
        "preallocating",
    );
    assert!(
        !d.join("e").exists(),
        "a failed create must not leave files"
    );
    fails_with(
        &zeta(
            &home,
            d,
            &words("pool create -o size=64M -o prealloc=yes s f"),
        ),
        "prealloc 'yes' is not one of on, off",
    );
}

/// `pool status`: a mirror's leaves are indented under it, and their STATE column still lines
/// up with the header's and the mirror's.
#[test]
fn status_columns_line_up_under_a_mirror() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(
        &home,
        d,
        &["pool", "create", "-o", "size=64M", "p", "mirror", "a", "b"],
    ));
    let out = ok(&zeta(&home, d, &["pool", "status", "p"]));
    let end_of = |line: &str, word: &str| {
        let l = out.lines().find(|l| l.contains(line)).unwrap_or_else(|| {
            panic!("no line with {line} in {out}");
        });
        l.find(word).expect(word) + word.len()
    };
    let header = end_of("NAME", "STATE");
    assert_eq!(end_of("mirror-0", "ONLINE"), header, "{out}");
    let leaves: Vec<usize> = out
        .lines()
        .filter(|l| l.contains(&d.display().to_string()))
        .map(|l| l.find("ONLINE").expect("leaf state") + "ONLINE".len())
        .collect();
    assert_eq!(leaves, [header, header], "{out}");
    assert!(out.find("config:") < out.find("STATE"), "{out}");
}

/// Output cut short by its reader (`zeta pool status | head -3`) ends the command quietly, as
/// it ends other Unix tools, not with a panic on stderr.
#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(
        &home,
        d,
        &words("pool create -o size=64M tank mirror a b"),
    ));
    for args in ["pool status", "pool list", "vol list"] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_zeta"))
            .args(words(args))
            .env("ZETA_HOME", &home)
            .current_dir(d)
            .stdout(writer)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.is_empty(), "{args}: {err}");
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "{args}: {:?}",
            out.status
        );
    }
}

/// Every label holds the whole vdev tree, paths included: a tree too large for it is refused
/// with the reason before anything is written (it used to panic), and a device whose path
/// would make the tree too large cannot replace another.
#[test]
fn a_pool_too_large_for_its_labels_is_refused_and_leaves_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    let deep = d.join("x".repeat(200));
    std::fs::create_dir(&deep).unwrap();
    let files: Vec<String> = (0..200)
        .map(|i| deep.join(format!("device-{i:03}")).display().to_string())
        .collect();
    let mut args = vec!["pool", "create", "-o", "size=64M", "big"];
    args.extend(files.iter().map(|f| f.as_str()));
    let out = zeta(&home, d, &args);
    fails_with(&out, "more than the 32704 a label holds");
    fails_with(&out, "use fewer devices, or shorter paths");
    assert_eq!(
        std::fs::read_dir(&deep).unwrap().count(),
        0,
        "files left behind"
    );
    ok(&zeta(&home, d, &words("pool list")));

    // The widest mirror that fits, and a replacement whose longer path would take it over:
    // one more device would not fit, and the new path is longer than a device takes.
    let short = |i: usize| d.join(format!("s{i:03}")).display().to_string();
    let create = |n: usize| {
        let paths: Vec<String> = (0..n).map(short).collect();
        let mut args = vec!["pool", "create", "-o", "size=64M", "wide", "mirror"];
        args.extend(paths.iter().map(|p| p.as_str()));
        zeta(&home, d, &args)
    };
    let (mut fits, mut too_many) = (2, 400);
    while too_many - fits > 1 {
        let n = (fits + too_many) / 2;
        let out = create(n);
        if out.status.success() {
            ok(&zeta(&home, d, &words("pool destroy -f wide")));
            fits = n;
        } else {
            fails_with(&out, "a label holds");
            too_many = n;
        }
    }
    assert!(fits >= 100, "only {fits} devices fit");
    ok(&create(fits));
    let long = d
        .join("x".repeat(200))
        .join("y".repeat(250))
        .display()
        .to_string();
    let out = zeta(&home, d, &["pool", "replace", "wide", &short(0), &long]);
    fails_with(&out, "a label holds");
    assert!(!Path::new(&long).exists(), "{long} left behind");
    ok(&zeta(&home, d, &words("pool status wide")));
}
