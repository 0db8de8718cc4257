//! The doors a careless user can open around a pool, through the `zeta` binary as a user
//! meets them: writing over a live pool's device, creating a pool over someone's data,
//! devices that left a pool, a truncated member, a served pool imported from a second state
//! directory, and identifiers in `--json`.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Output};

use common::cli::{fails_with, ok, words, zeta};
use common::procs::spawn_server;

/// `zeta serve` of `pool` from `home` on a free port; killed when dropped.
struct Server(Child);

impl Server {
    fn start(home: &Path, cwd: &Path, pool: &str) -> Server {
        Self::start_at(home, cwd, pool).0
    }

    /// `start`, with the address it listens on and the lines it printed before.
    fn start_at(home: &Path, cwd: &Path, pool: &str) -> (Server, SocketAddr, Vec<String>) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_zeta"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", pool])
            .env("ZETA_HOME", home)
            .current_dir(cwd);
        let (child, addr, lines) = spawn_server(cmd);
        (Server(child), addr, lines)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn file_bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

#[test]
fn a_served_pools_devices_are_never_written_over_nor_imported_twice() {
    let t = tempfile::tempdir().unwrap();
    let (home, other, d) = (t.path().join("h1"), t.path().join("h2"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=128M tank a")));
    ok(&zeta(&home, d, &words("vol create tank/v 8M")));
    std::fs::write(d.join("img"), vec![0x5a; 1 << 20]).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v img")));
    let _server = Server::start(&home, d, "tank");
    let before = file_bytes(&d.join("a"));

    // `vol get` (run by the server, through its control socket) onto the pool's own device.
    fails_with(&zeta(&home, d, &words("vol get tank/v a")), "--force");
    fails_with(
        &zeta(&home, d, &words("vol get --force tank/v a")),
        "in use as a device of an open pool",
    );
    // Another state directory: every command that would write to the device refuses.
    fails_with(
        &zeta(&other, d, &words("pool create -f other a")),
        "in use as a device of an open pool",
    );
    fails_with(
        &zeta(&other, d, &words("pool labelclear -f a")),
        "in use as a device of an open pool",
    );
    std::fs::create_dir(d.join("sub")).unwrap();
    let dir = d.display().to_string();
    fails_with(
        &zeta(&other, d, &["pool", "import", "-d", &dir, "tank"]),
        "pool 'tank' is in use: a process holds its devices open",
    );
    fails_with(
        &zeta(&other, d, &["pool", "import", "-f", "-d", &dir, "tank"]),
        "is in use",
    );
    let listed = zeta(&other, d, &words("pool list --json"));
    let rows: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(rows, serde_json::json!([]), "nothing imported in {other:?}");
    assert!(
        file_bytes(&d.join("a")) == before,
        "the served device was written to"
    );
}

#[test]
fn vol_get_needs_force_to_overwrite_and_writes_holes_as_holes() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("h"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=256M tank a")));
    ok(&zeta(&home, d, &words("vol create tank/v 96M")));
    // 1M of data at the start and 1M at 64M; the rest was never written.
    std::fs::write(d.join("img"), vec![0xa5; 1 << 20]).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v img")));
    ok(&zeta(&home, d, &words("vol put --offset 64M tank/v img")));
    std::fs::write(d.join("out"), b"precious").unwrap();
    fails_with(&zeta(&home, d, &words("vol get tank/v out")), "out exists");
    assert_eq!(file_bytes(&d.join("out")), b"precious");
    ok(&zeta(&home, d, &words("vol get --force tank/v out")));
    let out = file_bytes(&d.join("out"));
    assert_eq!(out.len(), 96 << 20);
    assert!(out[..1 << 20].iter().all(|&b| b == 0xa5));
    assert!(out[64 << 20..65 << 20].iter().all(|&b| b == 0xa5));
    assert!(out[1 << 20..64 << 20].iter().all(|&b| b == 0));
    use std::os::unix::fs::MetadataExt;
    let on_disk = std::fs::metadata(d.join("out")).unwrap().blocks() * 512;
    assert!(
        on_disk <= 4 << 20,
        "a 96M copy holding 2M of data takes {on_disk} bytes on disk"
    );
    // A device of the pool, even with --force, while the pool is imported here.
    fails_with(
        &zeta(&home, d, &words("vol get --force tank/v a")),
        "is a device of pool 'tank', which is imported here",
    );
}

#[test]
fn pool_create_refuses_someone_elses_data_and_says_what_it_found() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("h"), t.path());
    let mut fs = vec![0u8; 128 << 20];
    fs[1080..1082].copy_from_slice(&[0x53, 0xef]);
    std::fs::write(d.join("ext4"), &fs).unwrap();
    fails_with(
        &zeta(&home, d, &words("pool create p ext4")),
        "ext4 holds an ext2/3/4 file system; give -f",
    );
    let mut data = vec![0u8; 128 << 20];
    data[100 << 20] = 1;
    std::fs::write(d.join("data"), &data).unwrap();
    fails_with(
        &zeta(&home, d, &words("pool create p data")),
        "data holds data (non-zero bytes at offset 104857600)",
    );
    assert_eq!(file_bytes(&d.join("data")), data, "refused, yet changed");
    // Zeros (sparse or written) are free to take; -f takes the rest.
    std::fs::write(d.join("zeros"), vec![0u8; 128 << 20]).unwrap();
    ok(&zeta(&home, d, &words("pool create p zeros")));
    ok(&zeta(&home, d, &words("pool create -f q data")));
    // A device of a pool imported here is refused even with -f.
    fails_with(
        &zeta(&home, d, &words("pool create -f r zeros")),
        "is a device of pool 'p', which is imported here",
    );
}

#[test]
fn a_replaced_device_leaves_the_pool_and_labelclear_frees_a_device() {
    let t = tempfile::tempdir().unwrap();
    let (home, other, d) = (t.path().join("h1"), t.path().join("h2"), t.path());
    std::fs::create_dir(d.join("pool")).unwrap();
    let p = d.join("pool");
    ok(&zeta(
        &home,
        &p,
        &words("pool create -o size=128M tank mirror a b"),
    ));
    ok(&zeta(&home, &p, &words("vol create tank/v 8M")));
    let (b, c) = (
        p.join("b").display().to_string(),
        p.join("c").display().to_string(),
    );
    ok(&zeta(&home, &p, &["pool", "replace", "tank", &b, &c]));
    // Given only the device that left, an import finds nothing to take.
    std::fs::create_dir(d.join("old")).unwrap();
    std::fs::rename(p.join("b"), d.join("old/b")).unwrap();
    let old = d.join("old").display().to_string();
    let listed = ok(&zeta(&other, d, &["pool", "import", "-d", &old]));
    assert!(listed.contains("no pools available"), "{listed}");
    ok(&zeta(&home, &p, &words("pool export tank")));

    // labelclear: refused for a member of a pool imported here and for one not exported
    // elsewhere (unless -f); it frees an exported pool's device with -f.
    ok(&zeta(
        &home,
        &p,
        &["pool", "import", "-d", &p.display().to_string()],
    ));
    fails_with(
        &zeta(&home, &p, &words("pool labelclear a")),
        "is a device of pool 'tank', which is imported here",
    );
    ok(&zeta(&home, &p, &words("pool export tank")));
    fails_with(
        &zeta(&home, &p, &words("pool labelclear a")),
        "is a device of the exported pool 'tank' (last imported on ",
    );
    ok(&zeta(&home, &p, &words("pool labelclear -f a")));
    fails_with(
        &zeta(&home, &p, &words("pool labelclear a")),
        "no zeta label",
    );
    // The pool goes on from `c` alone (a mirror may lose one side).
    let out = zeta(
        &home,
        &p,
        &["pool", "import", "-d", &p.display().to_string()],
    );
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("DEGRADED"), "{err}");
}

#[test]
fn a_truncated_member_counts_as_missing_and_the_pool_imports_degraded() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("h"), t.path());
    ok(&zeta(
        &home,
        d,
        &words("pool create -o size=128M tank raidz1 a b c"),
    ));
    ok(&zeta(&home, d, &words("vol create tank/v 8M")));
    std::fs::write(d.join("img"), vec![0x3c; 4 << 20]).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v img")));
    ok(&zeta(&home, d, &words("pool export tank")));
    std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("b"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let dir = d.display().to_string();
    let out = zeta(&home, d, &["pool", "import", "-d", &dir, "tank"]);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("DEGRADED") && err.contains("b: 67108864 bytes") && err.contains("truncated"),
        "{err}"
    );
    ok(&zeta(&home, d, &words("vol get tank/v back")));
    assert!(file_bytes(&d.join("back"))[..4 << 20]
        .iter()
        .all(|&b| b == 0x3c));
    // Two of three truncated is more than a raidz1 can lose: refused, naming why.
    ok(&zeta(&home, d, &words("pool export tank")));
    std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("c"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    fails_with(
        &zeta(&home, d, &["pool", "import", "-d", &dir, "tank"]),
        "is missing 2 of 3 devices",
    );
}

#[test]
fn a_pool_not_exported_elsewhere_needs_import_f_and_can_take_a_new_name() {
    let t = tempfile::tempdir().unwrap();
    let (home, other, d) = (t.path().join("h1"), t.path().join("h2"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=128M tank a")));
    ok(&zeta(&home, d, &words("vol create tank/v 8M")));
    let dir = d.display().to_string();
    // Imported in `home`, not exported: another state directory needs -f.
    fails_with(
        &zeta(&other, d, &["pool", "import", "-d", &dir, "tank"]),
        "it was not exported, and was last imported on host",
    );
    ok(&zeta(
        &other,
        d,
        &["pool", "import", "-f", "-d", &dir, "tank"],
    ));
    ok(&zeta(&other, d, &words("pool export tank")));
    // Exported: any state directory takes it, and under a new name.
    let out = ok(&zeta(
        &other,
        d,
        &["pool", "import", "-d", &dir, "tank", "data"],
    ));
    assert!(out.contains("imported 'tank' as 'data'"), "{out}");
    let vols = ok(&zeta(&other, d, &words("vol list data")));
    assert!(vols.contains("data/v"), "{vols}");
    ok(&zeta(&other, d, &words("pool export data")));
    let listed = ok(&zeta(&other, d, &["pool", "import", "-d", &dir, "--json"]));
    let rows: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(rows[0]["name"], "data", "{listed}");
}

#[test]
fn json_prints_guids_as_strings() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("h"), t.path());
    ok(&zeta(
        &home,
        d,
        &words("pool create -o size=128M tank mirror a b"),
    ));
    let st: serde_json::Value =
        serde_json::from_str(&ok(&zeta(&home, d, &words("pool status --json tank")))).unwrap();
    let guid = st[0]["guid"].as_str().expect("pool guid is a string");
    assert!(guid.parse::<u64>().is_ok(), "{guid}");
    for leaf in st[0]["vdevs"][0]["leaves"].as_array().unwrap() {
        let g = leaf["guid"].as_str().expect("leaf guid is a string");
        assert!(g.parse::<u64>().is_ok(), "{g}");
    }
    ok(&zeta(&home, d, &words("pool export tank")));
    let dir = d.display().to_string();
    let listed: serde_json::Value = serde_json::from_str(&ok(&zeta(
        &home,
        d,
        &["pool", "import", "-d", &dir, "--json"],
    )))
    .unwrap();
    assert_eq!(listed[0]["guid"].as_str(), Some(guid));
}

#[test]
fn pool_list_shows_usable_space_after_parity_and_a_destroy_frees_at_once() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("h"), t.path());
    let out = ok(&zeta(
        &home,
        d,
        &words("pool create -o size=256M tank raidz2 d0 d1 d2 d3 d4 d5"),
    ));
    assert!(
        out.contains("raw") && out.contains("usable after parity"),
        "{out}"
    );
    let list = |home: &Path| -> serde_json::Value {
        let rows: serde_json::Value =
            serde_json::from_str(&ok(&zeta(home, d, &words("pool list --json")))).unwrap();
        rows[0].clone()
    };
    let row = list(&home);
    let (size, usable) = (
        row["size"].as_u64().unwrap(),
        row["usable_size"].as_u64().unwrap(),
    );
    // A 16K block on a raidz2 of six: 4 data sectors, 2 parity; two thirds of the raw space.
    let expect = size / 3 * 2;
    assert!(
        usable.abs_diff(expect) < expect / 100,
        "usable {usable} of raw {size}"
    );
    ok(&zeta(&home, d, &words("vol create tank/v 128M")));
    std::fs::write(d.join("img"), vec![0x77; 64 << 20]).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v img")));
    let _server = Server::start(&home, d, "tank");
    let full = list(&home);
    ok(&zeta(&home, d, &words("vol destroy -f tank/v")));
    let after = list(&home);
    let freed = after["free"].as_u64().unwrap() - full["free"].as_u64().unwrap();
    assert!(
        freed >= 64 << 20,
        "the destroyed volume's space is not free: {full} then {after}"
    );
    assert!(
        after["freeing"].as_u64().unwrap() < 1 << 20,
        "still freeing: {after}"
    );
    // Overwrites free the old copies; `pool sync` brings the txgs that release them.
    ok(&zeta(&home, d, &words("vol create tank/w 128M")));
    ok(&zeta(&home, d, &words("vol put tank/w img")));
    ok(&zeta(&home, d, &words("vol put tank/w img")));
    ok(&zeta(&home, d, &words("pool sync tank")));
    let synced = list(&home);
    assert!(
        synced["freeing"].as_u64().unwrap() < 1 << 20,
        "still freeing after pool sync: {synced}"
    );
}

/// Sends SIGINT to `child` after `after`, and returns its output.
fn interrupt(child: Child, after: std::time::Duration) -> Output {
    std::thread::sleep(after);
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    child.wait_with_output().unwrap()
}

fn spawn(home: &Path, cwd: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_zeta"))
        .args(args)
        .env("ZETA_HOME", home)
        .current_dir(cwd)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn ctrl_c_stops_a_long_copy_cleanly_and_says_how_far_it_got() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("h"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=3G tank a")));
    ok(&zeta(&home, d, &words("vol create tank/v 2G")));
    // 1.5 GiB that no block of zeros shortens: a copy of a second or more.
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(d.join("img")).unwrap());
        let mut block = vec![0u8; 1 << 20];
        for i in 0..1536u32 {
            block[..4].copy_from_slice(&i.to_le_bytes());
            block[4..].fill((i % 251 + 1) as u8);
            f.write_all(&block).unwrap();
        }
    }
    let wait = std::time::Duration::from_millis(300);
    let out = interrupt(spawn(&home, d, &words("vol put tank/v img")), wait);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("interrupted: wrote the first") && err.contains("flushed"),
        "{err}"
    );
    // What it says it wrote is there.
    let n: u64 = err
        .split('(')
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {err}"));
    assert!(n > 0 && n < 1536 << 20, "{err}");
    ok(&zeta(&home, d, &words("vol get tank/v back")));
    let (img, back) = (file_bytes(&d.join("img")), file_bytes(&d.join("back")));
    assert!(
        img[..n as usize] == back[..n as usize],
        "the written part differs"
    );
    // Served: the client's Ctrl-C stops the server's copy.
    ok(&zeta(&home, d, &words("vol put tank/v img")));
    let _server = Server::start(&home, d, "tank");
    let out = interrupt(spawn(&home, d, &words("vol get --force tank/v back")), wait);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("interrupted: the server had copied"), "{err}");
}

/// A pool made before labels recorded who imported it: it imports without -f, reads back,
/// and from then on records its holder (another state directory then needs -f).
#[test]
fn a_pool_from_before_holders_were_recorded_imports_and_reads_back() {
    let t = tempfile::tempdir().unwrap();
    let (home, other, d) = (t.path().join("h1"), t.path().join("h2"), t.path());
    let image = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pool-bb85e97.tar.gz");
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(&image)
        .current_dir(d)
        .status()
        .unwrap();
    assert!(st.success());
    let dir = d.display().to_string();
    ok(&zeta(&home, d, &["pool", "import", "-d", &dir, "tank"]));
    ok(&zeta(&home, d, &words("vol get tank/v back")));
    let back = file_bytes(&d.join("back"));
    let pattern: Vec<u8> = (0..3usize << 20)
        .map(|i| ((i * 7 + 3) % 251) as u8)
        .collect();
    assert!(
        back[..3 << 20] == pattern[..],
        "the old pool's volume reads back wrong"
    );
    assert!(back[3 << 20..].iter().all(|&b| b == 0));
    fails_with(
        &zeta(&other, d, &["pool", "import", "-d", &dir, "tank"]),
        "it was not exported",
    );
}

#[test]
fn destroying_a_volume_with_data_or_shrinking_one_needs_force() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("h"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=128M tank a")));
    ok(&zeta(&home, d, &words("vol create tank/empty 8M")));
    ok(&zeta(&home, d, &words("vol create tank/v 8M")));
    std::fs::write(d.join("img"), vec![0x11; 1 << 20]).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v img")));
    // Not on a terminal: refused with the way out, and nothing changes.
    fails_with(
        &zeta(&home, d, &words("vol destroy tank/v")),
        "'tank/v' holds data, which destroying it loses: give -f to destroy it",
    );
    fails_with(
        &zeta(&home, d, &words("vol resize tank/v 4M")),
        "shrinking 'tank/v' from 8.0M to 4.0M discards the data past 4.0M: give -f",
    );
    let vols = ok(&zeta(&home, d, &words("vol list --json")));
    assert!(
        vols.contains("tank/v") && vols.contains("8388608"),
        "{vols}"
    );
    // Growing, and destroying an empty volume, need nothing.
    ok(&zeta(&home, d, &words("vol resize tank/v 16M")));
    ok(&zeta(&home, d, &words("vol destroy tank/empty")));
    ok(&zeta(&home, d, &words("vol resize -f tank/v 4M")));
    ok(&zeta(&home, d, &words("vol destroy -f tank/v")));
    // Through a server, the same.
    ok(&zeta(&home, d, &words("vol create tank/w 8M")));
    ok(&zeta(&home, d, &words("vol put tank/w img")));
    let _server = Server::start(&home, d, "tank");
    fails_with(&zeta(&home, d, &words("vol destroy tank/w")), "give -f");
    ok(&zeta(&home, d, &words("vol destroy -f tank/w")));
}

/// `zeta up`'s pool belongs to its directory: another state directory takes it over once
/// nothing holds it (a killed server's pool was never exported), but not while one runs.
#[test]
fn zeta_up_takes_its_directory_over_from_another_state_directory() {
    let t = tempfile::tempdir().unwrap();
    let (home, other, d) = (t.path().join("h1"), t.path().join("h2"), t.path());
    let up = |home: &Path| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_zeta"));
        cmd.args(["up", "--listen", "127.0.0.1:0"])
            .env("ZETA_HOME", home)
            .current_dir(d);
        cmd
    };
    let first = Server(spawn_server(up(&home)).0);
    let busy = up(&other).output().unwrap();
    assert!(!busy.status.success(), "two servers of one pool");
    drop(first);
    let _second = Server(spawn_server(up(&other)).0);
}

/// Every device file of the pool in `d`, as bytes.
fn snapshot(d: &Path, names: &[&str]) -> Vec<Vec<u8>> {
    names.iter().map(|n| file_bytes(&d.join(n))).collect()
}

#[test]
fn a_read_only_import_writes_nothing_replays_nothing_and_refuses_changes() {
    use common::nbd_client::Client;
    use zeta::nbd::proto::{CMD_FLAG_FUA, CMD_WRITE, TF_READ_ONLY};
    let t = tempfile::tempdir().unwrap();
    let (home, other, d) = (t.path().join("h1"), t.path().join("h2"), t.path());
    let dir = d.display().to_string();
    ok(&zeta(
        &home,
        d,
        &words("pool create -o size=128M tank mirror a b"),
    ));
    ok(&zeta(&home, d, &words("vol create tank/v 8M")));
    let old = vec![0x11u8; 1 << 20];
    std::fs::write(d.join("img"), &old).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v img")));
    // A write acknowledged with FUA, then a crash before its txg: only the log holds it.
    let (server, addr, _) = Server::start_at(&home, d, "tank");
    let mut c = Client::open(addr, "tank/v");
    let new = vec![0x22u8; 64 << 10];
    assert_eq!(
        c.call(CMD_WRITE, CMD_FLAG_FUA, 0, new.len() as u32, &new)
            .error,
        0
    );
    drop(server); // SIGKILL
    drop(c);

    // Another state directory takes it read-only: it was not exported, so -f is needed.
    let ro_import = ["pool", "import", "-d", &dir, "-o", "readonly=on", "tank"];
    fails_with(&zeta(&other, d, &ro_import), "import it with -f");
    fails_with(
        &zeta(&other, d, &words("pool import -o readonly=maybe tank")),
        "readonly takes on or off",
    );
    fails_with(
        &zeta(&other, d, &words("pool import -o compression=on tank")),
        "an import takes -o readonly=on|off",
    );
    let before = snapshot(d, &["a", "b"]);
    let mut forced = ro_import.to_vec();
    forced.insert(2, "-f");
    let out = zeta(&other, d, &forced);
    assert!(ok(&out).contains("imported 'tank' read-only"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("intent-log records") && err.contains("not replayed"),
        "the import says what it did not replay: {err}"
    );
    // Its volume reads as of the last txg; status says read-only; changes are refused.
    ok(&zeta(&other, d, &words("vol get tank/v got")));
    assert_eq!(file_bytes(&d.join("got"))[..1 << 20], old[..]);
    assert!(ok(&zeta(&other, d, &words("pool status tank"))).contains("ONLINE, read-only"));
    let st: serde_json::Value =
        serde_json::from_slice(&zeta(&other, d, &words("pool status --json tank")).stdout).unwrap();
    assert_eq!(st[0]["readonly"], true);
    for cmd in [
        "vol create tank/w 8M",
        "vol destroy -f tank/v",
        "vol resize -f tank/v 16M",
        "vol put tank/v img",
        "pool scrub tank",
        "pool clear tank",
        "pool offline tank b",
        "pool sync tank",
    ] {
        let out = zeta(&other, d, &words(cmd));
        if cmd == "pool sync tank" {
            // Nothing to commit: a sync of a read-only pool succeeds and writes nothing.
            ok(&out);
        } else {
            fails_with(&out, "is imported read-only");
        }
    }
    // Served read-only: NBD's read-only flag, writes refused, reads served.
    let (mut server, addr, lines) = Server::start_at(&other, d, "tank");
    let mut c = Client::connect(addr);
    let (_, flags) = c.go("tank/v", &[]).expect("go");
    assert!(flags & TF_READ_ONLY != 0, "not served read-only: {lines:?}");
    assert_ne!(
        c.write(0, &new),
        0,
        "a write to a read-only export succeeded"
    );
    assert_eq!(c.read(0, 4096).unwrap(), old[..4096]);
    drop(c);
    // While it is open read-only, nothing may open its devices to write them.
    fails_with(
        &zeta(&home, d, &words("vol get tank/v got2")),
        "in use by another process",
    );
    sigterm(&server.0);
    assert!(server.0.wait().unwrap().success());
    ok(&zeta(&other, d, &words("pool export tank")));
    assert!(
        snapshot(d, &["a", "b"]) == before,
        "a read-only import wrote to a device"
    );

    // The first state directory still has it: its next open replays the log.
    ok(&zeta(&home, d, &words("vol get --force tank/v got")));
    let got = file_bytes(&d.join("got"));
    assert_eq!(got[..new.len()], new[..], "the logged write was lost");
    assert_eq!(got[new.len()..1 << 20], old[new.len()..]);
}

/// A read-only import reads through a damaged copy without rewriting it.
#[test]
fn a_read_only_import_reads_around_damage_and_leaves_it_for_a_scrub() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("h"), t.path());
    let dir = d.display().to_string();
    ok(&zeta(
        &home,
        d,
        &words("pool create -o size=128M tank mirror a b"),
    ));
    ok(&zeta(&home, d, &words("vol create tank/v 16M")));
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(d.join("img"), &data).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v img")));
    ok(&zeta(&home, d, &words("pool export tank")));
    // Garbage over the first 24M of a's data area: the volume's blocks lie there.
    let mut a = file_bytes(&d.join("a"));
    // Past the front labels, and clear of the first metaslab's start.
    let reserve = 2 * 256 * 1024 + (4 << 20);
    for (i, b) in a[reserve..reserve + (24 << 20)].iter_mut().enumerate() {
        *b = (i as u8) ^ 0x5c;
    }
    std::fs::write(d.join("a"), &a).unwrap();
    let before = snapshot(d, &["a", "b"]);
    ok(&zeta(
        &home,
        d,
        &["pool", "import", "-d", &dir, "-o", "readonly=on", "tank"],
    ));
    ok(&zeta(&home, d, &words("vol get tank/v got")));
    assert_eq!(file_bytes(&d.join("got"))[..data.len()], data[..]);
    ok(&zeta(&home, d, &words("pool export tank")));
    assert!(
        snapshot(d, &["a", "b"]) == before,
        "a read-only import rewrote a bad copy"
    );
    // Imported read-write, a scrub mends it.
    ok(&zeta(&home, d, &["pool", "import", "-d", &dir, "tank"]));
    ok(&zeta(&home, d, &words("pool scrub --wait tank")));
    assert!(snapshot(d, &["a"]) != vec![a], "the scrub repaired nothing");
}

/// SIGTERM to a server: it finishes and closes its pools.
fn sigterm(child: &Child) {
    // SAFETY: kill(2) with a pid of our own child and a signal number; no memory is passed.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
}
