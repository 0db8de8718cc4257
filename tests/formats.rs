//! Every on-disk format this zeta has written still opens: pool images made by older zetas
//! (`tests/fixtures/`, one per format change) import and read back, and a pool that uses a
//! feature this zeta does not know is refused by the feature's name (or opened read-only when
//! the feature says an older reader may).

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::cli::{fails_with, ok, words, zeta};
use zeta::spa::feature::FeatureState;
use zeta::spa::label::{encode_config, read_labels, write_config};
use zeta::vdev::{BlockDevice, FileDevice, Leaf, LABEL_COUNT};

/// What each image holds: its pools, each with an 8M volume `v` whose first 3 MiB are
/// `(i * 7 + 3) % 251` (written with `vol put`), the rest never written.
const IMAGES: &[(&str, &[&str])] = &[
    ("pool-bb85e97.tar.gz", &["tank"]),
    ("pool-f5e5291.tar.gz", &["tank", "rz"]),
    ("pool-628e488.tar.gz", &["tank", "rz"]),
    ("pool-6cc44ca.tar.gz", &["tank", "rz"]),
    ("pool-c97602d.tar.gz", &["tank", "rz"]),
    ("pool-54060d7.tar.gz", &["tank", "rz"]),
    ("pool-32235df.tar.gz", &["tank", "rz"]),
    ("pool-f333d47.tar.gz", &["tank", "rz"]),
];

/// How many of `IMAGES`, from the first, were made before `org.zeta:space_used`.
const BEFORE_SPACE_USED: usize = 3;

/// How many of `IMAGES`, from the first, were made before `org.zeta:gang_blocks`.
const BEFORE_GANG_BLOCKS: usize = 4;

/// How many of `IMAGES`, from the first, were made before `org.zeta:snapshots`.
const BEFORE_SNAPSHOTS: usize = 5;

/// How many of `IMAGES`, from the first, were made before `org.zeta:volume_flags`.
const BEFORE_VOLUME_FLAGS: usize = 6;

/// How many of `IMAGES`, from the first, were made before `org.zeta:receive_resume`.
const BEFORE_RECEIVE_RESUME: usize = 7;

/// How many of `IMAGES`, from the first, were made before `org.zeta:compression`.
const BEFORE_COMPRESSION: usize = 8;

/// The devices an image unpacked into `d` (named by one letter), as the library opens them.
fn file_leaves(d: &Path) -> Vec<(Arc<dyn BlockDevice>, String)> {
    std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().len() == 1)
        .map(|p| {
            let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&p).unwrap());
            (dev, p.display().to_string())
        })
        .collect()
}

fn unpack(image: &str, into: &Path) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(image);
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(&path)
        .current_dir(into)
        .status()
        .unwrap();
    assert!(st.success(), "unpacking {image}");
}

fn pattern() -> Vec<u8> {
    (0..3usize << 20)
        .map(|i| ((i * 7 + 3) % 251) as u8)
        .collect()
}

/// The volume `pool/v` reads back as the images wrote it.
fn reads_back(home: &Path, d: &Path, pool: &str, what: &str) {
    let back = d.join(format!("{pool}.back"));
    let _ = std::fs::remove_file(&back);
    ok(&zeta(
        home,
        d,
        &["vol", "get", &format!("{pool}/v"), back.to_str().unwrap()],
    ));
    let bytes = std::fs::read(&back).unwrap();
    assert_eq!(bytes.len(), 8 << 20, "{what}: {pool}/v size");
    assert!(
        bytes[..3 << 20] == pattern()[..],
        "{what}: {pool}/v reads back wrong"
    );
    assert!(
        bytes[3 << 20..].iter().all(|&b| b == 0),
        "{what}: {pool}/v tail"
    );
}

#[test]
fn every_older_format_imports_reads_back_and_scrubs_clean() {
    for (image, pools) in IMAGES {
        let t = tempfile::tempdir().unwrap();
        let (home, d) = (t.path().join("home"), t.path());
        unpack(image, d);
        let dir = d.display().to_string();
        for pool in *pools {
            // Imported, not exported, when packed (by another state directory): -f.
            ok(&zeta(&home, d, &["pool", "import", "-f", "-d", &dir, pool]));
            reads_back(&home, d, pool, image);
            let out = ok(&zeta(&home, d, &["pool", "scrub", "--wait", pool]));
            assert!(
                out.contains("finished") && out.contains("0B repaired, 0 errors"),
                "{image}: {pool} scrub: {out}"
            );
            // Written back in today's format, it opens again.
            ok(&zeta(&home, d, &["pool", "export", pool]));
            ok(&zeta(&home, d, &["pool", "import", "-d", &dir, pool]));
            reads_back(&home, d, pool, image);
        }
    }
}

/// Adds `feature` to the labels of every device of an exported pool, as a newer zeta that uses
/// it would have written them.
fn add_feature(devices: &[&Path], feature: &str, state: FeatureState) {
    for path in devices {
        let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(path).unwrap());
        let leaf = Leaf::new(dev, 0);
        let (generation, mut cfg) = read_labels(&leaf).unwrap().config.expect("a label");
        cfg.features.insert(feature.to_string(), state);
        let area = encode_config(&cfg, generation + 1).unwrap();
        write_config(&leaf, &area, &(0..LABEL_COUNT).collect::<Vec<_>>()).unwrap();
        leaf.flush().unwrap();
    }
}

fn exported_pool(home: &Path, d: &Path) -> Vec<std::path::PathBuf> {
    ok(&zeta(
        home,
        d,
        &words("pool create -o size=64M tank mirror a b"),
    ));
    ok(&zeta(home, d, &words("vol create tank/v 8M")));
    std::fs::write(d.join("pat"), pattern()).unwrap();
    ok(&zeta(home, d, &words("vol put tank/v pat")));
    ok(&zeta(home, d, &words("pool export tank")));
    vec![d.join("a"), d.join("b")]
}

#[test]
fn an_unknown_active_feature_is_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    let devs = exported_pool(&home, d);
    let dir = d.display().to_string();
    // Enabled but not in use: nothing on disk needs it, so the pool opens.
    let enabled = FeatureState {
        active: false,
        read_compatible: false,
    };
    add_feature(&[&devs[0], &devs[1]], "org.example:later", enabled);
    ok(&zeta(&home, d, &["pool", "import", "-d", &dir, "tank"]));
    reads_back(&home, d, "tank", "enabled feature");
    // Kept as read, and shown.
    let status: serde_json::Value =
        serde_json::from_str(&ok(&zeta(&home, d, &words("pool status --json tank")))).unwrap();
    assert_eq!(
        status[0]["features"]["org.example:later"],
        serde_json::json!({"active": false, "read_compatible": false}),
        "{status}"
    );
    ok(&zeta(&home, d, &words("pool export tank")));
    // In use: refused, named, even read-only.
    let active = FeatureState {
        active: true,
        read_compatible: false,
    };
    add_feature(&[&devs[0], &devs[1]], "org.example:future", active);
    for extra in [&[][..], &["-o", "readonly=on"][..]] {
        let mut args = vec!["pool", "import"];
        args.extend_from_slice(extra);
        args.extend(["-d", &dir, "tank"]);
        fails_with(&zeta(&home, d, &args), "feature 'org.example:future'");
    }
}

#[test]
fn an_unknown_read_compatible_feature_opens_read_only() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    let devs = exported_pool(&home, d);
    let dir = d.display().to_string();
    let state = FeatureState {
        active: true,
        read_compatible: true,
    };
    add_feature(&[&devs[0], &devs[1]], "org.example:readable", state);
    fails_with(
        &zeta(&home, d, &["pool", "import", "-d", &dir, "tank"]),
        "it can be imported read-only",
    );
    ok(&zeta(
        &home,
        d,
        &["pool", "import", "-o", "readonly=on", "-d", &dir, "tank"],
    ));
    reads_back(&home, d, "tank", "read-only import");
}

/// The bytes `pool/v` takes on the devices, as `vol list --json` says.
fn used_of(home: &Path, d: &Path, pool: &str) -> u64 {
    let rows: serde_json::Value =
        serde_json::from_str(&ok(&zeta(home, d, &["vol", "list", "--json", pool]))).unwrap();
    let row = (rows.as_array().unwrap().iter())
        .find(|r| r["name"] == format!("{pool}/v"))
        .expect("the volume is listed");
    row["used"].as_u64().expect("used")
}

fn space_used_active(home: &Path, d: &Path, pool: &str) -> bool {
    let status: serde_json::Value =
        serde_json::from_str(&ok(&zeta(home, d, &["pool", "status", "--json", pool]))).unwrap();
    status[0]["features"]["org.zeta:space_used"]["active"] == true
}

/// A pool written before volumes kept the bytes their blocks take (`org.zeta:space_used`) has
/// them counted from its trees at import: a read-only import shows them and writes nothing, a
/// read-write one writes them and marks the feature active, and the figure then equals a
/// recount of every tree (`Pool::verify`).
#[test]
fn a_pool_from_before_space_used_counts_its_volumes_at_import() {
    for (image, pools) in &IMAGES[..BEFORE_SPACE_USED] {
        let t = tempfile::tempdir().unwrap();
        let (home, d) = (t.path().join("home"), t.path());
        unpack(image, d);
        let dir = d.display().to_string();
        for pool in *pools {
            let import = |extra: &[&str]| {
                let mut args = vec!["pool", "import", "-f", "-d", &dir];
                args.extend_from_slice(extra);
                args.push(pool);
                ok(&zeta(&home, d, &args));
            };
            import(&["-o", "readonly=on"]);
            let counted = used_of(&home, d, pool);
            // 3 MiB of data, at least once, plus its indirect blocks; at most the parity and
            // copies of a raidz1 of three and a mirror's indirect copies.
            assert!(
                (3 << 20..=(5 << 20)).contains(&counted),
                "{image}: {pool}/v takes {counted} bytes"
            );
            assert!(
                !space_used_active(&home, d, pool),
                "{image}: read-only wrote it"
            );
            ok(&zeta(&home, d, &["pool", "export", pool]));
            import(&[]);
            assert_eq!(used_of(&home, d, pool), counted, "{image}: {pool}");
            // Its volumes stay as they were made: sparse.
            let rows: serde_json::Value =
                serde_json::from_str(&ok(&zeta(&home, d, &["vol", "list", "--json", pool])))
                    .unwrap();
            assert_eq!(rows[0]["refreservation"], 0, "{image}: {pool}");
            assert!(space_used_active(&home, d, pool), "{image}: {pool}");
            ok(&zeta(&home, d, &["pool", "export", pool]));
        }
        // Read back by the library: the figures kept equal a recount of each tree.
        for pool in *pools {
            let p = zeta::dsl::Pool::import(
                file_leaves(d),
                Some(pool),
                zeta::dsl::PoolOptions::default(),
            )
            .unwrap_or_else(|e| panic!("{image}: {pool}: {e}"));
            p.verify()
                .unwrap_or_else(|e| panic!("{image}: {pool}: {e}"));
            p.export().unwrap();
        }
    }
}

/// A pool from before gang blocks (`org.zeta:gang_blocks`, which an older zeta cannot read) may
/// not hold one until this zeta writes its labels: a read-only import leaves the feature
/// inactive, so the pool still opens where it came from; a read-write import marks it active
/// before the first txg that may gang, and the blocks then written in pieces read back beside
/// the old ones after another import, with every allocated byte reachable.
#[test]
fn a_pool_from_before_gang_blocks_takes_them_only_once_its_labels_say_so() {
    use zeta::dsl::{Pool, PoolOptions};
    use zeta::spa::feature::{self, GANG_BLOCKS};
    for (image, pools) in &IMAGES[..BEFORE_GANG_BLOCKS] {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        unpack(image, d);
        for pool in *pools {
            let what = format!("{image}: {pool}");
            let open = |readonly: bool| {
                let opts = PoolOptions {
                    readonly,
                    force: true,
                    force_ganging: Some(4096),
                    ..PoolOptions::default()
                };
                Pool::import(file_leaves(d), Some(pool), opts)
                    .unwrap_or_else(|e| panic!("{what}: {e}"))
            };
            let p = open(true);
            assert!(
                !feature::is_active(&p.config().features, &GANG_BLOCKS),
                "{what}: made before gang blocks"
            );
            p.export().unwrap();
            drop(p);
            let labels = |dev: &str| {
                let file: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&d.join(dev)).unwrap());
                let (_, cfg) = read_labels(&Leaf::new(file, 0)).unwrap().config.unwrap();
                cfg.features
            };
            let first_dev = if *pool == "tank" { "a" } else { "c" };
            assert!(
                !feature::is_active(&labels(first_dev), &GANG_BLOCKS),
                "{what}: a read-only import wrote the labels"
            );

            let p = open(false);
            assert!(
                feature::is_active(&p.config().features, &GANG_BLOCKS),
                "{what}"
            );
            let vol = zeta::zvol::Volume::open(&p, "v").unwrap();
            let used = || p.dataset("v").unwrap().object.used_bytes();
            let before = used();
            // New data past the old pattern, in half blocks so that the txg sync places
            // (and, forced, gangs) every block.
            let half = vol.block_size() as usize / 2;
            let fresh: Vec<u8> = (0..1usize << 20).map(|i| (i % 239) as u8 ^ 0x5a).collect();
            for (i, piece) in fresh.chunks(half).enumerate() {
                vol.write((4 << 20) + (i * half) as u64, piece).unwrap();
            }
            vol.flush().unwrap();
            p.sync_now().unwrap();
            // Each block took a header beside its pieces: more than the data alone.
            let grown = used() - before;
            assert!(
                grown >= (1 << 20) * 5 / 4,
                "{what}: {grown} bytes for 1M written in pieces"
            );
            drop(vol);
            p.export().unwrap();
            drop(p);
            assert!(
                feature::is_active(&labels(first_dev), &GANG_BLOCKS),
                "{what}"
            );

            let p = open(false);
            let vol = zeta::zvol::Volume::open(&p, "v").unwrap();
            let mut buf = vec![0u8; 8 << 20];
            vol.read(0, &mut buf).unwrap();
            assert!(buf[..3 << 20] == pattern()[..], "{what}: the old pattern");
            assert!(
                buf[4 << 20..5 << 20] == fresh[..],
                "{what}: the ganged data"
            );
            p.verify().unwrap_or_else(|e| panic!("{what}: {e}"));
            let (reached, space) = p.verify_space().unwrap();
            assert_eq!(reached, space.alloc, "{what}: allocated, not reached");
            drop(vol);
            p.export().unwrap();
        }
    }
}

/// Imports pool `pool` of an image unpacked into `d` through the library (forced: the image
/// was packed imported), read-only or not.
fn import_unpacked(d: &Path, pool: &str, readonly: bool, what: &str) -> Arc<zeta::dsl::Pool> {
    let opts = zeta::dsl::PoolOptions {
        readonly,
        force: true,
        ..zeta::dsl::PoolOptions::default()
    };
    zeta::dsl::Pool::import(file_leaves(d), Some(pool), opts)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// A pool from before snapshots (`org.zeta:snapshots`) takes none while imported read-only,
/// and leaves the feature inactive; imported read-write, it takes them: a snapshot of the old
/// volume keeps the old pattern while the head is rewritten, through an export and import,
/// with every allocated byte reached by exactly one tree.
#[test]
fn a_pool_from_before_snapshots_takes_them_once_imported_read_write() {
    use zeta::dsl::PoolError;
    use zeta::spa::feature::{self, SNAPSHOTS};
    for (image, pools) in &IMAGES[..BEFORE_SNAPSHOTS] {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        unpack(image, d);
        for pool in *pools {
            let what = format!("{image}: {pool}");
            let open = |readonly: bool| import_unpacked(d, pool, readonly, &what);
            let p = open(true);
            assert!(
                !feature::is_active(&p.config().features, &SNAPSHOTS),
                "{what}"
            );
            assert!(
                matches!(p.snapshot(&["v@old"]), Err(PoolError::ReadOnly(_))),
                "{what}"
            );
            p.export().unwrap();
            drop(p);

            let p = open(false);
            assert!(
                feature::is_active(&p.config().features, &SNAPSHOTS),
                "{what}"
            );
            p.snapshot(&["v@old"]).unwrap();
            let vol = zeta::zvol::Volume::open(&p, "v").unwrap();
            vol.write(0, &vec![0x5a; 1 << 20]).unwrap();
            vol.flush().unwrap();
            drop(vol);
            p.export().unwrap();
            drop(p);
            let p = open(false);
            let snap = zeta::zvol::Volume::open(&p, "v@old").unwrap();
            let mut back = vec![0u8; 3 << 20];
            snap.read(0, &mut back).unwrap();
            assert!(back == pattern(), "{what}: the snapshot reads back wrong");
            drop(snap);
            p.sync_frees().unwrap();
            let (reach, space) = p.verify_space().unwrap();
            assert_eq!(reach, space.alloc, "{what}");
            p.export().unwrap();
        }
    }
}

/// A pool from before `org.zeta:volume_flags`: read-only it takes no `readonly` setting; once
/// imported read-write the feature is active, the setting is kept across an export and
/// import, refuses a client's write, and the older image's snapshot (where it has one)
/// still reads back.
#[test]
fn a_pool_from_before_volume_flags_keeps_readonly_once_imported_read_write() {
    use zeta::dsl::PoolError;
    use zeta::spa::feature::{self, VOLUME_FLAGS};
    for (image, pools) in &IMAGES[..BEFORE_VOLUME_FLAGS] {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        unpack(image, d);
        for pool in *pools {
            let what = format!("{image}: {pool}");
            let open = |readonly: bool| import_unpacked(d, pool, readonly, &what);
            let p = open(true);
            assert!(
                !feature::is_active(&p.config().features, &VOLUME_FLAGS),
                "{what}"
            );
            assert!(
                matches!(p.set_readonly("v", true), Err(PoolError::ReadOnly(_))),
                "{what}"
            );
            assert!(
                !p.dataset("v").unwrap().readonly(),
                "{what}: off by default"
            );
            p.export().unwrap();
            drop(p);

            let p = open(false);
            assert!(
                feature::is_active(&p.config().features, &VOLUME_FLAGS),
                "{what}"
            );
            p.set_readonly("v", true).unwrap();
            p.export().unwrap();
            drop(p);
            let p = open(false);
            let vol = zeta::zvol::Volume::open(&p, "v").unwrap();
            assert!(vol.read_only(), "{what}: kept");
            let e = vol.write(0, &[1u8; 4096]).unwrap_err().to_string();
            assert!(e.contains("readonly=on"), "{what}: {e}");
            let mut back = vec![0u8; 3 << 20];
            vol.read(0, &mut back).unwrap();
            assert!(back == pattern(), "{what}: reads back wrong");
            drop(vol);
            if let Ok(snap) = zeta::zvol::Volume::open(&p, "v@fixture") {
                snap.read(0, &mut back).unwrap();
                assert!(back == pattern(), "{what}: the snapshot reads back wrong");
            }
            p.export().unwrap();
        }
    }
}

/// A pool from before `org.zeta:receive_resume`: once imported read-write the feature is
/// active, and a resumable receive cut short keeps its place across an export and import,
/// then completes from the rest of the stream.
#[test]
fn a_pool_from_before_receive_resume_keeps_a_receives_place_once_imported_read_write() {
    use zeta::spa::feature::{self, RECEIVE_RESUME};
    use zeta::zvol::receive::receive;
    for (image, pools) in &IMAGES[..BEFORE_RECEIVE_RESUME] {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        unpack(image, d);
        for pool in *pools {
            let what = format!("{image}: {pool}");
            let p = import_unpacked(d, pool, true, &what);
            let known = feature::is_active(&p.config().features, &RECEIVE_RESUME);
            assert!(!known, "{what}");
            p.export().unwrap();
            drop(p);
            let p = import_unpacked(d, pool, false, &what);
            assert!(
                feature::is_active(&p.config().features, &RECEIVE_RESUME),
                "{what}"
            );
            p.snapshot(&["v@send"]).unwrap();
            let mut stream = Vec::new();
            p.send("v@send", None, &mut stream, &mut |_| true).unwrap();
            let cut = &stream[..stream.len() / 2];
            assert!(receive(&p, "copy", &mut &cut[..], false, true, &mut |_| true).is_err());
            let st = p.dataset("copy").unwrap().receiving().expect("kept");
            p.export().unwrap();
            drop(p);
            let p = import_unpacked(d, pool, false, &what);
            assert_eq!(p.dataset("copy").unwrap().receiving(), Some(st), "{what}");
            let mut rest = Vec::new();
            p.send_resumed(st.to_guid, 0, st.offset, &mut rest, &mut |_| true)
                .unwrap();
            receive(&p, "copy", &mut &rest[..], false, false, &mut |_| true).unwrap();
            let vol = zeta::zvol::Volume::open(&p, "copy@send").unwrap();
            let mut back = vec![0u8; 3 << 20];
            vol.read(0, &mut back).unwrap();
            assert!(back == pattern(), "{what}: the copy reads back wrong");
            drop(vol);
            p.export().unwrap();
        }
    }
}

/// A pool from before `org.zeta:compression`: read-only it takes no `compression` setting,
/// and its volumes' logical and stored sizes are counted from their trees (equal: nothing
/// was compressed); imported read-write the feature is active, a volume set to lz4 stores
/// new writes compressed, and both the old and the new blocks read back across an export and
/// import, with the dnode's sizes equal to a recount.
#[test]
fn a_pool_from_before_compression_compresses_new_writes_once_imported_read_write() {
    use zeta::dsl::PoolError;
    use zeta::spa::feature::{self, COMPRESSION};
    use zeta::zio::compress::Compression;
    for (image, pools) in &IMAGES[..BEFORE_COMPRESSION] {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        unpack(image, d);
        for pool in *pools {
            let what = format!("{image}: {pool}");
            let p = import_unpacked(d, pool, true, &what);
            assert!(
                !feature::is_active(&p.config().features, &COMPRESSION),
                "{what}"
            );
            assert!(
                matches!(
                    p.set_compression("v", Compression::Lz4),
                    Err(PoolError::ReadOnly(_))
                ),
                "{what}"
            );
            let sizes = p.dataset("v").unwrap().object.sizes();
            // The pattern's blocks and the indirect blocks above them, none compressed.
            assert!(sizes.logical >= 3 << 20, "{what}: counted at import");
            assert_eq!(sizes.physical, sizes.logical, "{what}");
            let before = sizes.logical;
            p.export().unwrap();
            drop(p);

            let p = import_unpacked(d, pool, false, &what);
            assert!(
                feature::is_active(&p.config().features, &COMPRESSION),
                "{what}"
            );
            p.set_compression("v", Compression::Lz4).unwrap();
            let vol = zeta::zvol::Volume::open(&p, "v").unwrap();
            // Text-like data past the old pattern: compressible, new blocks only.
            let text: Vec<u8> = (0..1usize << 20)
                .map(|i| b"zeta compresses this "[i % 21])
                .collect();
            vol.write(4 << 20, &text).unwrap();
            vol.flush().unwrap();
            drop(vol);
            p.export().unwrap();
            drop(p);

            let p = import_unpacked(d, pool, false, &what);
            let ds = p.dataset("v").unwrap();
            assert_eq!(ds.object.compression(), Compression::Lz4, "{what}: kept");
            let sizes = ds.object.sizes();
            assert!(sizes.logical >= before + (1 << 20), "{what}: {sizes:?}");
            assert!(
                sizes.physical < sizes.logical - (1 << 19),
                "{what}: the new megabyte is stored compressed: {sizes:?}"
            );
            let vol = zeta::zvol::Volume::open(&p, "v").unwrap();
            let mut back = vec![0u8; 3 << 20];
            vol.read(0, &mut back).unwrap();
            assert!(back == pattern(), "{what}: the old blocks read back wrong");
            let mut new = vec![0u8; 1 << 20];
            vol.read(4 << 20, &mut new).unwrap();
            assert!(new == text, "{what}: the compressed blocks read back wrong");
            drop(vol);
            p.verify().unwrap_or_else(|e| panic!("{what}: {e}"));
            p.export().unwrap();
        }
    }
}
