//! `zeta snapshot`, `zeta list` and `zeta destroy` as a user runs them, on a pool opened by
//! the command and on one a `zeta serve` holds (the commands then run in the server): a
//! snapshot reads back with `vol get` as it was, `list` shows its space, and every refusal
//! says why.

mod common;

use std::path::Path;
use std::process::Command;

use common::cli::{fails_with, ok, words, zeta};
use common::nbd_client::Client;
use common::procs::spawn_server;

const MB: usize = 1 << 20;

fn rows(home: &Path, d: &Path, args: &str) -> Vec<serde_json::Value> {
    let line = format!("list --json {args}");
    let out = ok(&zeta(home, d, &line.split_whitespace().collect::<Vec<_>>()));
    serde_json::from_str::<serde_json::Value>(&out)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn row<'a>(rows: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    rows.iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {rows:?}"))
}

#[test]
fn snapshots_are_taken_listed_read_and_destroyed_from_the_command_line() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(
        &home,
        d,
        &words("pool create -o size=128M tank mirror a b"),
    ));
    ok(&zeta(&home, d, &words("vol create -s tank/v 16M")));
    let first: Vec<u8> = (0..8 * MB).map(|i| (i % 251) as u8).collect();
    std::fs::write(d.join("one"), &first).unwrap();
    std::fs::write(d.join("two"), vec![0x77u8; 8 * MB]).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v one")));
    let out = ok(&zeta(&home, d, &words("snapshot tank/v@s1")));
    assert!(out.contains("created snapshot 'tank/v@s1'"), "{out}");
    ok(&zeta(&home, d, &words("vol put tank/v two")));

    let all = rows(&home, d, "-t all");
    let (head, s1) = (row(&all, "tank/v"), row(&all, "tank/v@s1"));
    let used = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap();
    assert_eq!(s1["type"], "snapshot");
    assert!(
        used(s1, "used") >= 8 * MB as u64,
        "the head rewrote all of it: {s1}"
    );
    assert_eq!(used(head, "usedbysnapshots"), used(s1, "used"));
    assert!(used(head, "written") >= 8 * MB as u64);
    assert_eq!(rows(&home, d, "").len(), 1, "volumes only by default");
    assert_eq!(rows(&home, d, "-t snapshot tank/v").len(), 1);
    let table = ok(&zeta(&home, d, &words("list -t all -Hp tank")));
    let line = table
        .lines()
        .find(|l| l.starts_with("tank/v@s1\t"))
        .unwrap();
    assert_eq!(
        line.split('\t').nth(1).unwrap(),
        used(s1, "used").to_string()
    );

    // The snapshot reads back as it was; it takes no write.
    ok(&zeta(&home, d, &words("vol get tank/v@s1 back")));
    assert!(std::fs::read(d.join("back")).unwrap()[..8 * MB] == first[..]);
    fails_with(
        &zeta(&home, d, &words("vol put tank/v@s1 two")),
        "is a snapshot",
    );

    fails_with(
        &zeta(&home, d, &words("snapshot tank/v@s1")),
        "already exists",
    );
    fails_with(&zeta(&home, d, &words("snapshot tank/v")), "POOL/VOL@SNAP");
    fails_with(
        &zeta(&home, d, &words("snapshot tank/nope@x")),
        "does not exist",
    );
    fails_with(&zeta(&home, d, &words("snapshot tank/v@a b")), "");
    fails_with(
        &zeta(&home, d, &words("list -t bogus")),
        "volume, snapshot and all",
    );
    fails_with(&zeta(&home, d, &words("destroy tank/v")), "give -r");
    fails_with(
        &zeta(&home, d, &words("destroy -r tank/v@s1")),
        "name the volume",
    );
    fails_with(
        &zeta(&home, d, &words("destroy tank/v@nope")),
        "does not exist",
    );

    let out = ok(&zeta(&home, d, &words("destroy tank/v@s1")));
    assert!(out.contains("destroyed 'tank/v@s1'"), "{out}");
    assert_eq!(
        used(row(&rows(&home, d, "-t all"), "tank/v"), "usedbysnapshots"),
        0
    );
    ok(&zeta(&home, d, &words("snapshot tank/v@s2")));
    let out = ok(&zeta(&home, d, &words("destroy -r -f tank/v")));
    assert!(
        out.contains("'tank/v@s2'") && out.contains("'tank/v'"),
        "{out}"
    );
    assert!(rows(&home, d, "-t all").is_empty());
}

#[test]
fn a_served_pool_takes_snapshots_through_its_server() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=128M tank a")));
    ok(&zeta(&home, d, &words("vol create -s tank/v 8M")));
    std::fs::write(d.join("one"), vec![0x11u8; MB]).unwrap();
    std::fs::write(d.join("two"), vec![0x22u8; MB]).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zeta"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "tank"])
        .env("ZETA_HOME", &home)
        .current_dir(d);
    let (mut server, _, _) = spawn_server(cmd);
    ok(&zeta(&home, d, &words("vol put tank/v one")));
    ok(&zeta(&home, d, &words("snapshot tank/v@s1")));
    ok(&zeta(&home, d, &words("vol put tank/v two")));
    let snaps = rows(&home, d, "-t snapshot");
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    assert!(row(&snaps, "tank/v@s1")["used"].as_u64().unwrap() >= MB as u64);
    ok(&zeta(&home, d, &words("vol get tank/v@s1 back")));
    assert!(std::fs::read(d.join("back")).unwrap()[..MB]
        .iter()
        .all(|&b| b == 0x11));
    ok(&zeta(&home, d, &words("destroy tank/v@s1")));
    assert!(rows(&home, d, "-t snapshot").is_empty());
    let _ = server.kill();
    let _ = server.wait();
}

/// `zeta rollback` of a served volume: refused while a client is connected to its export,
/// naming why; once the client has gone, the volume reads as the snapshot to the next one.
#[test]
fn a_served_volume_is_rolled_back_only_with_no_client_connected() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=128M tank a")));
    ok(&zeta(&home, d, &words("vol create -s tank/v 8M")));
    std::fs::write(d.join("one"), vec![0x11u8; MB]).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zeta"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "tank"])
        .env("ZETA_HOME", &home)
        .current_dir(d);
    let (mut server, addr, _) = spawn_server(cmd);
    ok(&zeta(&home, d, &words("vol put tank/v one")));
    ok(&zeta(&home, d, &words("snapshot tank/v@s1")));
    ok(&zeta(&home, d, &words("snapshot tank/v@s2")));
    let mut c = Client::open(addr, "tank/v");
    assert_eq!(c.write(0, &vec![0x22u8; 65536]), 0);
    fails_with(
        &zeta(&home, d, &words("rollback tank/v@s1")),
        "not the latest",
    );
    fails_with(
        &zeta(&home, d, &words("rollback -r tank/v@s1")),
        "is open (1 handle",
    );
    fails_with(
        &zeta(&home, d, &words("rollback tank/v@s2")),
        "is open (1 handle",
    );
    drop(c);
    // The server lets go of the volume once it has seen the client go.
    let mut out = zeta(&home, d, &words("rollback -r tank/v@s1"));
    for _ in 0..50 {
        if out.status.success() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        out = zeta(&home, d, &words("rollback -r tank/v@s1"));
    }
    let said = ok(&out);
    assert!(
        said.contains("destroyed 'tank/v@s2'") && said.contains("rolled 'tank/v' back"),
        "{said}"
    );
    let mut c = Client::open(addr, "tank/v");
    assert!(c.read(0, 65536).unwrap().iter().all(|&b| b == 0x11));
    drop(c);
    assert_eq!(rows(&home, d, "-t snapshot").len(), 1);
    let _ = server.kill();
    let _ = server.wait();
}

/// `zeta send` to stdout and to a file, `zeta receive` from stdin and from a file, locally
/// and through a server: the copy's snapshots read as the originals; a served pool needs a
/// file, since its server writes and reads the stream.
#[test]
fn send_and_receive_copy_snapshots_between_pools() {
    use std::process::Stdio;
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=128M tank a")));
    ok(&zeta(&home, d, &words("pool create -o size=128M bk b")));
    ok(&zeta(&home, d, &words("vol create -s tank/v 8M")));
    std::fs::write(d.join("one"), vec![0x11u8; 2 * MB]).unwrap();
    std::fs::write(d.join("two"), vec![0x22u8; MB / 2]).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v one")));
    ok(&zeta(&home, d, &words("snapshot tank/v@s1")));
    // Full, through stdout and stdin.
    let bin = env!("CARGO_BIN_EXE_zeta");
    let out = std::fs::File::create(d.join("full.zs")).unwrap();
    let st = Command::new(bin)
        .args(["send", "tank/v@s1"])
        .env("ZETA_HOME", &home)
        .current_dir(d)
        .stdout(Stdio::from(out))
        .status()
        .unwrap();
    assert!(st.success());
    let input = std::fs::File::open(d.join("full.zs")).unwrap();
    let o = Command::new(bin)
        .args(["receive", "bk/v"])
        .env("ZETA_HOME", &home)
        .current_dir(d)
        .stdin(Stdio::from(input))
        .output()
        .unwrap();
    let said = ok(&o);
    assert!(said.contains("received 'bk/v@s1' (full"), "{said}");
    fails_with(
        &zeta(&home, d, &words("receive bk/v -f full.zs")),
        "already exists",
    );
    fails_with(
        &zeta(&home, d, &words("send tank/v@s1 -o full.zs")),
        "full.zs",
    );

    // Incremental, through files and a server holding the source pool.
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "tank"])
        .env("ZETA_HOME", &home)
        .current_dir(d);
    let (mut server, _, _) = spawn_server(cmd);
    ok(&zeta(&home, d, &words("vol put tank/v two")));
    ok(&zeta(&home, d, &words("snapshot tank/v@s2")));
    fails_with(
        &zeta(&home, d, &words("send -i @s1 tank/v@s2")),
        "give -o FILE",
    );
    let said = ok(&zeta(&home, d, &words("send -i @s1 tank/v@s2 -o incr.zs")));
    assert!(said.contains("sent 'tank/v@s2'"), "{said}");
    ok(&zeta(&home, d, &words("vol get tank/v@s2 want")));
    let _ = server.kill();
    let _ = server.wait();
    let mut rotten = std::fs::read(d.join("incr.zs")).unwrap();
    let at = rotten.len() / 2;
    rotten[at] ^= 4;
    std::fs::write(d.join("rotten.zs"), &rotten).unwrap();
    fails_with(
        &zeta(&home, d, &words("receive bk/v -f rotten.zs")),
        "checksum",
    );
    let said = ok(&zeta(&home, d, &words("receive bk/v -f incr.zs")));
    assert!(said.contains("received 'bk/v@s2' (incremental"), "{said}");
    ok(&zeta(&home, d, &words("vol get bk/v@s2 got")));
    assert!(std::fs::read(d.join("got")).unwrap() == std::fs::read(d.join("want")).unwrap());
    fails_with(
        &zeta(&home, d, &words("receive bk/v@x -f incr.zs")),
        "name the volume",
    );

    // Resumable: a cut stream leaves its token; the rest, sent from it, completes the copy.
    let whole = std::fs::read(d.join("full.zs")).unwrap();
    std::fs::write(d.join("cut.zs"), &whole[..whole.len() / 2]).unwrap();
    let o = zeta(&home, d, &words("receive -s bk/w -f cut.zs"));
    let said = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        !o.status.success() && said.contains("zeta send -t zr1-"),
        "{said}"
    );
    let token = ok(&zeta(&home, d, &words("get -H receive_resume_token bk/w")));
    let token = token.trim().rsplit('\t').next().unwrap().to_string();
    assert!(said.contains(&token), "{token} in {said}");
    fails_with(
        &zeta(&home, d, &words("vol get bk/w nope")),
        "partly received",
    );
    fails_with(
        &zeta(&home, d, &words("send -t zr1-1-0-0-00000000 tank")),
        "check",
    );
    ok(&zeta(
        &home,
        d,
        &["send", "-t", &token, "tank", "-o", "rest.zs"],
    ));
    let said = ok(&zeta(&home, d, &words("receive -s bk/w -f rest.zs")));
    assert!(said.contains("received 'bk/w@s1'"), "{said}");
    ok(&zeta(&home, d, &words("vol get bk/w@s1 w.img")));
    ok(&zeta(&home, d, &words("vol get tank/v@s1 v.img")));
    assert!(std::fs::read(d.join("w.img")).unwrap() == std::fs::read(d.join("v.img")).unwrap());
    let none = ok(&zeta(&home, d, &words("get -H receive_resume_token bk/w")));
    assert!(none.trim().ends_with('-'), "{none}");
    // Given up: the volume a full stream was making goes.
    assert!(!zeta(&home, d, &words("receive -s bk/x -f cut.zs"))
        .status
        .success());
    let said = ok(&zeta(&home, d, &words("receive -A bk/x")));
    assert!(said.contains("gave up"), "{said}");
    fails_with(
        &zeta(&home, d, &words("get volsize bk/x")),
        "does not exist",
    );
    fails_with(
        &zeta(&home, d, &words("receive -A bk/w")),
        "no interrupted receive",
    );
}

/// `zeta clone` while the pool is served: the clone is an export at once, reads as its
/// origin, takes writes, and `list` names its origin; the origin's destruction is refused
/// naming the clone; `zeta promote` makes the old volume the clone's, which then goes.
#[test]
fn a_clone_is_served_like_any_volume() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=128M tank a")));
    ok(&zeta(&home, d, &words("vol create -s tank/golden 8M")));
    std::fs::write(d.join("one"), vec![0x33u8; MB]).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zeta"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "tank"])
        .env("ZETA_HOME", &home)
        .current_dir(d);
    let (mut server, addr, _) = spawn_server(cmd);
    ok(&zeta(&home, d, &words("vol put tank/golden one")));
    ok(&zeta(&home, d, &words("snapshot tank/golden@v1")));
    let said = ok(&zeta(&home, d, &words("clone tank/golden@v1 tank/vm7")));
    assert!(said.contains("a clone of 'tank/golden@v1'"), "{said}");
    fails_with(
        &zeta(&home, d, &words("clone tank/golden@v1 tank/vm7")),
        "already exists",
    );
    fails_with(
        &zeta(&home, d, &words("clone tank/golden tank/x")),
        "POOL/VOL@SNAP",
    );
    let mut c = Client::open(addr, "tank/vm7");
    assert!(c.read(0, 65536).unwrap().iter().all(|&b| b == 0x33));
    assert_eq!(c.write(0, &vec![0x44u8; 65536]), 0);
    assert!(c.read(0, 65536).unwrap().iter().all(|&b| b == 0x44));
    drop(c);
    let all = rows(&home, d, "-t all");
    assert_eq!(row(&all, "tank/vm7")["origin"], "tank/golden@v1");
    assert!(row(&all, "tank/golden")["origin"].is_null());
    fails_with(
        &zeta(&home, d, &words("destroy tank/golden@v1")),
        "'tank/vm7'",
    );
    ok(&zeta(&home, d, &words("vol get tank/golden@v1 back")));
    assert!(std::fs::read(d.join("back")).unwrap()[..MB]
        .iter()
        .all(|&b| b == 0x33));
    // Promoted, the clone takes the snapshot, and the old volume can go.
    fails_with(
        &zeta(&home, d, &words("promote tank/golden")),
        "not a clone",
    );
    let said = ok(&zeta(&home, d, &words("promote tank/vm7")));
    assert!(said.contains("'tank/golden' is now its clone"), "{said}");
    let all = rows(&home, d, "-t all");
    assert_eq!(row(&all, "tank/golden")["origin"], "tank/vm7@v1");
    assert!(row(&all, "tank/vm7")["origin"].is_null());
    ok(&zeta(&home, d, &words("destroy -f tank/golden")));
    let mut c = Client::open(addr, "tank/vm7");
    assert!(c.read(0, 65536).unwrap().iter().all(|&b| b == 0x44));
    assert!(c.read(65536, 65536).unwrap().iter().all(|&b| b == 0x33));
    drop(c);
    ok(&zeta(&home, d, &words("vol get tank/vm7@v1 moved")));
    assert!(std::fs::read(d.join("moved")).unwrap()[..MB]
        .iter()
        .all(|&b| b == 0x33));
    let _ = server.kill();
    let _ = server.wait();
}

/// `zeta get` on volumes and snapshots: the dataset properties agree with `zeta list`, a
/// snapshot's `type` says so and `set` refuses it.
#[test]
fn get_shows_a_snapshots_properties_and_set_refuses_them() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=128M tank a")));
    ok(&zeta(&home, d, &words("vol create -s tank/v 8M")));
    std::fs::write(d.join("one"), vec![0x11u8; 2 * MB]).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v one")));
    ok(&zeta(&home, d, &words("snapshot tank/v@s1")));
    ok(&zeta(&home, d, &words("vol put tank/v one")));
    ok(&zeta(&home, d, &words("clone tank/v@s1 tank/c")));
    let out = ok(&zeta(
        &home,
        d,
        &words("get --json all tank/v tank/v@s1 tank/c"),
    ));
    let got: serde_json::Value = serde_json::from_str(&out).unwrap();
    let all = rows(&home, d, "-t all");
    let s1 = row(&all, "tank/v@s1");
    assert_eq!(got["tank/v@s1"]["type"], "snapshot");
    assert_eq!(got["tank/v"]["type"], "volume");
    for k in ["used", "referenced", "written"] {
        assert_eq!(got["tank/v@s1"][k], s1[k], "{k}");
    }
    assert_eq!(
        got["tank/v"]["usedbysnapshots"],
        row(&all, "tank/v")["usedbysnapshots"]
    );
    assert_eq!(got["tank/c"]["origin"], "tank/v@s1");
    assert_eq!(got["tank/v"]["origin"], "-");
    fails_with(
        &zeta(&home, d, &words("set volsize=16M tank/v@s1")),
        "read-only",
    );
    fails_with(
        &zeta(&home, d, &words("get all tank/v@nope")),
        "does not exist",
    );
}

/// `readonly=on`: `vol put` and NBD clients are refused (one connected before it was set from
/// its next write, EPERM; one connecting after sees a read-only export), `zeta receive`
/// still applies a stream (a backup kept from other writers), the property survives an
/// export and import, and `readonly=off` makes the volume writable again.
#[test]
fn a_readonly_volume_refuses_clients_and_takes_receives() {
    let t = tempfile::tempdir().unwrap();
    let (home, d) = (t.path().join("home"), t.path());
    ok(&zeta(&home, d, &words("pool create -o size=128M tank a")));
    ok(&zeta(&home, d, &words("vol create -s tank/v 8M")));
    std::fs::write(d.join("one"), vec![0x11u8; MB]).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v one")));
    ok(&zeta(&home, d, &words("snapshot tank/v@s1")));
    ok(&zeta(&home, d, &words("send tank/v@s1 -o full.zs")));
    ok(&zeta(&home, d, &words("receive tank/bk -f full.zs")));
    let said = ok(&zeta(&home, d, &words("set readonly=on tank/bk")));
    assert!(said.contains("set readonly=on on 'tank/bk'"), "{said}");
    fails_with(
        &zeta(&home, d, &words("set readonly=yes tank/bk")),
        "on or off",
    );
    fails_with(
        &zeta(&home, d, &words("set readonly=on tank/v@s1")),
        "snapshot",
    );
    fails_with(
        &zeta(&home, d, &words("vol put tank/bk one")),
        "readonly=on",
    );
    let get = |what: &str| ok(&zeta(&home, d, &words(&format!("get -H readonly {what}"))));
    assert!(get("tank/bk").trim().ends_with("on"));
    assert!(get("tank/v").trim().ends_with("off"));
    assert!(get("tank/v@s1").trim().ends_with("on"));

    // Incremental receive into the read-only copy.
    std::fs::write(d.join("two"), vec![0x22u8; MB / 2]).unwrap();
    ok(&zeta(&home, d, &words("vol put tank/v two")));
    ok(&zeta(&home, d, &words("snapshot tank/v@s2")));
    ok(&zeta(&home, d, &words("send -i @s1 tank/v@s2 -o incr.zs")));
    ok(&zeta(&home, d, &words("receive tank/bk -f incr.zs")));
    ok(&zeta(&home, d, &words("vol get tank/bk got")));
    assert!(std::fs::read(d.join("got")).unwrap()[..MB / 2]
        .iter()
        .all(|&b| b == 0x22));

    ok(&zeta(&home, d, &words("pool export tank")));
    ok(&zeta(
        &home,
        d,
        &words(&format!("pool import -d {} tank", d.display())),
    ));
    assert!(get("tank/bk").trim().ends_with("on"), "kept on disk");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zeta"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "tank"])
        .env("ZETA_HOME", &home)
        .current_dir(d);
    let (mut server, addr, _) = spawn_server(cmd);
    let mut c = Client::open(addr, "tank/bk");
    assert_eq!(
        c.write(0, &[0x33u8; 4096]),
        1,
        "EPERM on a read-only export"
    );
    drop(c);
    let mut c = Client::open(addr, "tank/v");
    assert_eq!(c.write(0, &[0x33u8; 4096]), 0);
    ok(&zeta(&home, d, &words("set readonly=on tank/v")));
    assert_eq!(
        c.write(0, &[0x44u8; 4096]),
        1,
        "refused from the next write"
    );
    assert!(c.read(0, 4096).unwrap().iter().all(|&b| b == 0x33));
    ok(&zeta(&home, d, &words("set readonly=off tank/v")));
    assert_eq!(c.write(0, &[0x55u8; 4096]), 0);
    drop(c);
    let _ = server.kill();
    let _ = server.wait();
}
