//! `zeta serve` as a real process, driven by real NBD clients: nbdinfo, qemu-img, qemu-io,
//! nbdcopy and fio's nbd engine; and a SIGKILL of the server under a flushing client.
//!
//! The clients come from Debian packages (libnbd-bin, qemu-utils, fio) that `.ci/run`
//! installs. Where one is missing a test says so and passes, unless ZETA_REQUIRE_CLIENTS=1
//! (set by CI), where a missing client is a failure.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use common::nbd_client::Client;
use common::procs::{have, spawn_server};
use zeta::nbd::proto::*;

fn zeta(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zeta"));
    c.env("ZETA_HOME", home);
    c
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A pool `tank` of one 256M file with volumes `tank/a` and `tank/b` (64M each), served by a
/// `zeta serve` child on an ephemeral port.
struct Served {
    dir: tempfile::TempDir,
    child: Option<Child>,
    addr: SocketAddr,
}

impl Served {
    fn new() -> Served {
        Served::with_vdevs(&["leaf"])
    }

    /// As `new`, with the pool's vdevs given as `zeta pool create` words (paths relative to
    /// the test's directory).
    fn with_vdevs(words: &[&str]) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        ok(
            zeta(&home)
                .current_dir(dir.path())
                .args(["pool", "create", "-o", "size=256M", "tank"])
                .args(words)
                .output()
                .unwrap(),
            "pool create",
        );
        for v in ["tank/a", "tank/b"] {
            ok(
                zeta(&home)
                    .args(["vol", "create", v, "64M"])
                    .output()
                    .unwrap(),
                "vol create",
            );
        }
        let mut s = Served {
            dir,
            child: None,
            addr: "127.0.0.1:1".parse().unwrap(),
        };
        s.start();
        s
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn start(&mut self) {
        let mut cmd = zeta(&self.home());
        cmd.args(["serve", "--listen", "127.0.0.1:0"])
            .stderr(Stdio::inherit());
        let (child, addr, _) = spawn_server(cmd);
        self.addr = addr;
        self.child = Some(child);
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.addr)
    }

    fn kill9(&mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// SIGTERM and a clean exit.
    fn stop(&mut self) {
        let mut c = self.child.take().unwrap();
        sigterm(c.id());
        let st = c.wait().unwrap();
        assert!(st.success(), "server exit status {st}");
    }
}

fn sigterm(pid: u32) {
    signal(pid, "TERM");
}

fn signal(pid: u32, sig: &str) {
    let out = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .output()
        .unwrap();
    assert!(out.status.success());
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn run(cmd: &mut Command, what: &str) -> String {
    ok(cmd.output().unwrap(), what)
}

#[test]
fn nbdinfo_size_flags_list_and_map() {
    if !have("nbdinfo") {
        return;
    }
    let mut s = Served::new();
    let uri = s.uri("tank/a");
    let size = run(
        Command::new("nbdinfo").args(["--size", &uri]),
        "nbdinfo --size",
    );
    assert_eq!(size.trim(), (64u64 << 20).to_string());
    for can in [
        "flush",
        "fua",
        "trim",
        "zero",
        "multi-conn",
        "cache",
        "fast-zero",
    ] {
        let st = Command::new("nbdinfo")
            .args(["--can", can, &uri])
            .status()
            .unwrap();
        assert!(st.success(), "nbdinfo --can {can}");
    }
    let st = Command::new("nbdinfo")
        .args(["--is", "read-only", &uri])
        .status()
        .unwrap();
    assert!(!st.success(), "not read-only");
    let list = run(
        Command::new("nbdinfo").args(["--list", &format!("nbd://{}", s.addr)]),
        "nbdinfo --list",
    );
    assert!(
        list.contains("export=\"tank/a\"") && list.contains("export=\"tank/b\""),
        "{list}"
    );
    // Write 1M at 4M, then the map shows exactly that as data.
    let mut c = Client::open(s.addr, "tank/a");
    assert_eq!(c.write(4 << 20, &vec![0x5a; 1 << 20]), 0);
    drop(c);
    let map = run(
        Command::new("nbdinfo").args(["--map", &uri]),
        "nbdinfo --map",
    );
    let rows: Vec<Vec<String>> = map
        .lines()
        .map(|l| l.split_whitespace().take(3).map(String::from).collect())
        .collect();
    let expect = [
        ["0", "4194304", "3"],
        ["4194304", "1048576", "0"],
        ["5242880", "61865984", "3"],
    ];
    assert_eq!(
        rows,
        expect.map(|r| r.map(String::from).to_vec()).to_vec(),
        "{map}"
    );
    s.stop();
}

#[test]
fn qemu_img_convert_in_and_out_and_qemu_io_patterns() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let mut s = Served::new();
    let uri = s.uri("tank/a");
    let img = s.dir.path().join("random.img");
    // A sparse image: random data in two regions, holes between.
    let mut data = vec![0u8; 64 << 20];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for (i, b) in data.iter_mut().enumerate() {
        if i < (8 << 20) || (40 << 20..44 << 20).contains(&i) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
    std::fs::write(&img, &data).unwrap();
    run(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&img)
            .arg(&uri),
        "qemu-img convert in",
    );
    run(
        Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&img)
            .arg(&uri),
        "qemu-img compare",
    );
    let back = s.dir.path().join("back.img");
    run(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(&uri)
            .arg(&back),
        "qemu-img convert out",
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "image read back differs"
    );
    let io = run(
        Command::new("qemu-io")
            .args([
                "-f",
                "raw",
                "-c",
                "write -P 0xab 1M 192k",
                "-c",
                "write -P 0xcd 1500k 3k",
                "-c",
                "read -P 0xab 1M 192k",
                "-c",
                "read -P 0xcd 1500k 3k",
                "-c",
                "write -z 2M 64k",
                "-c",
                "read -P 0 2M 64k",
                "-c",
                "discard 3M 1M",
                "-c",
                "read -P 0 3M 1M",
                "-c",
                "flush",
            ])
            .arg(&uri),
        "qemu-io",
    );
    assert!(!io.contains("Pattern verification failed"), "{io}");
    assert!(!io.to_lowercase().contains("error"), "{io}");
    s.stop();
}

#[test]
fn nbdcopy_both_ways_and_two_clients_at_once() {
    if !have("nbdcopy") {
        return;
    }
    let mut s = Served::new();
    let src = s.dir.path().join("src.img");
    let data: Vec<u8> = (0..64u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    // Two copies in, to two volumes, at the same time.
    let mut a = Command::new("nbdcopy")
        .arg(&src)
        .arg(s.uri("tank/a"))
        .spawn()
        .unwrap();
    let mut b = Command::new("nbdcopy")
        .arg(&src)
        .arg(s.uri("tank/b"))
        .spawn()
        .unwrap();
    assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
    for v in ["tank/a", "tank/b"] {
        let out = s.dir.path().join("out.img");
        let _ = std::fs::remove_file(&out);
        run(
            Command::new("nbdcopy").arg(s.uri(v)).arg(&out),
            "nbdcopy out",
        );
        assert!(std::fs::read(&out).unwrap() == data, "{v} differs");
    }
    s.stop();
}

#[test]
fn fio_nbd_engine_verifies_at_several_sizes_and_depths() {
    if !have("fio") {
        return;
    }
    let mut s = Served::new();
    for (bs, depth, export) in [
        ("4k", 1, "tank/a"),
        ("4k", 32, "tank/b"),
        ("64k", 16, "tank/a"),
        ("128k", 4, "tank/b"),
        // Many long reads at once: their replies are handed between workers (`Replies`).
        ("128k", 32, "tank/a"),
        ("512k", 16, "tank/b"),
    ] {
        let out = run(
            // fio leaves a verify state file in its working directory: not in the repo.
            Command::new("fio").current_dir(s.dir.path()).args([
                "--name=verify",
                "--ioengine=nbd",
                &format!("--uri={}", s.uri(export)),
                "--rw=randwrite",
                &format!("--bs={bs}"),
                &format!("--iodepth={depth}"),
                "--size=16M",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--output-format=terse",
            ]),
            "fio",
        );
        // Terse field 5 is the error count of the job.
        let err: Vec<&str> = out.trim().split(';').collect();
        assert_eq!(err.get(4), Some(&"0"), "fio {bs} qd{depth}: {out}");
    }
    s.stop();
}

/// 32 connections with 32 large writes in flight each ask for four times the server's
/// in-flight budget: requests wait for room, payload buffers are kept and handed on, and
/// every request must still be answered (a budget that let its waiters sleep through a
/// kept buffer once hung this for good).
#[test]
fn many_connections_past_the_inflight_budget_all_finish() {
    if !have("fio") {
        return;
    }
    let mut s = Served::new();
    let out = run(
        Command::new("timeout").current_dir(s.dir.path()).args([
            "120",
            "fio",
            "--name=many",
            "--ioengine=nbd",
            &format!("--uri={}", s.uri("tank/a")),
            "--rw=randwrite",
            "--bs=128k",
            "--iodepth=32",
            "--numjobs=32",
            "--group_reporting",
            "--size=64M",
            "--time_based",
            "--runtime=3",
            "--output-format=terse",
        ]),
        "fio with 32 connections (killed after 120 s)",
    );
    let err: Vec<&str> = out.trim().split(';').collect();
    assert_eq!(err.get(4), Some(&"0"), "fio: {out}");
    s.stop();
}

/// The server is SIGKILLed while a client writes generations of stamped blocks and flushes
/// after each; after a restart every block the client saw flushed reads back exactly.
#[test]
fn sigkill_under_a_flushing_client_loses_nothing_flushed() {
    const BS: usize = 16384;
    const BLOCKS: u64 = 512;
    let mut s = Served::new();
    let stamp = |g: u64, blk: u64| -> Vec<u8> {
        let mut v = Vec::with_capacity(BS);
        while v.len() < BS {
            v.extend_from_slice(&g.to_le_bytes());
            v.extend_from_slice(&blk.to_le_bytes());
        }
        v
    };
    // What the disk must hold at least: block -> generation last flushed.
    let mut flushed = std::collections::HashMap::<u64, u64>::new();
    let mut g = 0u64;
    for cycle in 0..5u64 {
        let addr = s.addr;
        let (tx, rx) = std::sync::mpsc::channel::<(u64, Vec<u64>)>();
        let start_g = g;
        let writer = std::thread::spawn(move || {
            let Ok(mut c) = std::panic::catch_unwind(|| Client::open(addr, "tank/a")) else {
                return;
            };
            let mut g = start_g;
            loop {
                g += 1;
                let blocks: Vec<u64> = (0..16).map(|i| (g * 37 + i * 101) % BLOCKS).collect();
                // The first block alone with FUA: durable when acknowledged.
                let b0 = blocks[0];
                if c.send(
                    CMD_WRITE,
                    CMD_FLAG_FUA,
                    b0,
                    b0 * BS as u64,
                    BS as u32,
                    &stamp(g, b0),
                )
                .is_err()
                {
                    return;
                }
                match c.recv() {
                    Ok(r) if r.error == 0 => {
                        if tx.send((g, vec![b0])).is_err() {
                            return;
                        }
                    }
                    _ => return,
                }
                // The rest pipelined without FUA: durable once the FLUSH is acknowledged.
                for &b in &blocks[1..] {
                    if c.send(CMD_WRITE, 0, b, b * BS as u64, BS as u32, &stamp(g, b))
                        .is_err()
                    {
                        return;
                    }
                }
                for _ in &blocks[1..] {
                    match c.recv() {
                        Ok(r) if r.error == 0 => {}
                        _ => return,
                    }
                }
                if c.send(CMD_FLUSH, 0, 1 << 40, 0, 0, &[]).is_err() {
                    return;
                }
                match c.recv() {
                    Ok(r) if r.error == 0 => {
                        if tx.send((g, blocks)).is_err() {
                            return;
                        }
                    }
                    _ => return,
                }
            }
        });
        std::thread::sleep(std::time::Duration::from_millis(150 + cycle * 70));
        s.kill9();
        let _ = writer.join();
        for (gen, blocks) in rx.try_iter() {
            for b in blocks {
                flushed.insert(b, gen);
            }
            g = g.max(gen);
        }
        g += 1000; // generations of the killed run that never flushed stay distinguishable
        s.start();
        let mut c = Client::open(s.addr, "tank/a");
        for (&b, &gen) in &flushed {
            let got = c.read(b * BS as u64, BS as u32).unwrap();
            let got_g = u64::from_le_bytes(got[0..8].try_into().unwrap());
            // A later, unflushed generation may have landed too; never an older one, never torn.
            assert!(
                got_g >= gen,
                "cycle {cycle}: block {b} holds gen {got_g}, flushed {gen}"
            );
            assert_eq!(got, stamp(got_g, b), "cycle {cycle}: block {b} torn");
        }
        // Re-stamp what is there now as the floor for the next cycle.
        for (&b, gen) in flushed.iter_mut() {
            let got = c.read(b * BS as u64, BS as u32).unwrap();
            *gen = u64::from_le_bytes(got[0..8].try_into().unwrap());
        }
    }
    assert!(
        !flushed.is_empty(),
        "the client flushed something before the kills"
    );
    s.stop();
}

/// `zeta up`: first run creates the pool and volume and serves them (the empty export name
/// selects the default volume); SIGTERM stops it cleanly; the second run reuses the pool and
/// the data written by the first is there.
#[test]
fn zeta_up_creates_serves_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let data = dir.path().join("data");
    let start = || {
        let mut cmd = zeta(&home);
        cmd.args(["up", "--listen", "127.0.0.1:0", "--dir"])
            .arg(&data);
        let (child, addr, seen) = spawn_server(cmd);
        (child, addr, seen)
    };
    let (mut child, addr, seen) = start();
    assert!(
        seen.iter().any(|l| l.contains("created pool 'zeta'")),
        "{seen:?}"
    );
    let mut c = Client::connect(addr);
    c.structured();
    let (size, _) = c.go("", &[]).expect("default export");
    assert_eq!(size, 256 << 20);
    assert_eq!(c.write(1 << 20, &[0x77; 65536]), 0);
    drop(c);
    sigterm(child.id());
    assert!(child.wait().unwrap().success());

    let (mut child, addr, seen) = start();
    assert!(
        !seen.iter().any(|l| l.contains("created")),
        "second run reuses: {seen:?}"
    );
    let mut c = Client::open(addr, "zeta/vol0");
    assert_eq!(c.read(1 << 20, 65536).unwrap(), vec![0x77; 65536]);
    // Unflushed, then a SIGHUP (its terminal closed): it stops as cleanly as on SIGTERM, so
    // the write is in the pool at the next start without a flush.
    assert_eq!(c.write(2 << 20, &[0x88; 65536]), 0);
    drop(c);
    signal(child.id(), "HUP");
    assert!(child.wait().unwrap().success(), "SIGHUP stops it cleanly");
    let (mut child, addr, _) = start();
    let mut c = Client::open(addr, "zeta/vol0");
    assert_eq!(c.read(2 << 20, 65536).unwrap(), vec![0x88; 65536]);
    drop(c);
    sigterm(child.id());
    assert!(child.wait().unwrap().success());
}

/// A server whose control socket file was removed under it (a cleaned run directory) still
/// stops cleanly on SIGTERM: it used to wait forever for its control thread.
#[test]
fn a_server_whose_control_socket_was_removed_still_stops() {
    let mut s = Served::new();
    let sock = s.home().join("run/tank.sock");
    std::fs::remove_file(&sock).unwrap();
    let mut c = s.child.take().unwrap();
    sigterm(c.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let st = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        if std::time::Instant::now() > deadline {
            let _ = c.kill();
            panic!("the server did not stop within 30 s of SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(st.success(), "server exit status {st}");
}

/// While `zeta serve` holds the pool, admin commands from other processes go through its
/// control socket (mode 0600): status, list, volume create/resize/put/get/destroy work, a new
/// volume is an export at once, and what cannot be done while serving is refused clearly.
#[test]
fn admin_commands_reach_a_served_pool_through_the_control_socket() {
    use std::os::unix::fs::PermissionsExt;
    let mut s = Served::new();
    let home = s.home();
    let sock = home.join("run/tank.sock");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "control socket mode {mode:o}");

    let status = run(
        zeta(&home).args(["pool", "status", "--json", "tank"]),
        "status",
    );
    let st: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(st[0]["state"], "ONLINE", "{status}");
    assert_eq!(st[0]["volumes"], 2, "{status}");
    let list = run(zeta(&home).args(["pool", "list"]), "pool list");
    assert!(list.contains("tank") && list.contains("ONLINE"), "{list}");

    run(
        zeta(&home).args(["vol", "create", "tank/c", "8M"]),
        "vol create",
    );
    let vols = run(zeta(&home).args(["vol", "list", "--json"]), "vol list");
    assert!(vols.contains("tank/c"), "{vols}");
    // The new volume is an export without a restart.
    let mut c = Client::open(s.addr, "tank/c");
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7) as u8).collect();
    c.send(CMD_WRITE, 0, 1, 4096, data.len() as u32, &data)
        .unwrap();
    assert_eq!(c.recv().unwrap().error, 0);
    c.send(CMD_FLUSH, 0, 2, 0, 0, &[]).unwrap();
    assert_eq!(c.recv().unwrap().error, 0);
    drop(c);

    // put/get with paths relative to the client's working directory.
    let work = s.dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("in"), vec![0x3cu8; 100_000]).unwrap();
    run(
        zeta(&home)
            .current_dir(&work)
            .args(["vol", "put", "--offset", "1M", "tank/c", "in"]),
        "vol put",
    );
    run(
        zeta(&home)
            .current_dir(&work)
            .args(["vol", "get", "tank/c", "out"]),
        "vol get",
    );
    let out = std::fs::read(work.join("out")).unwrap();
    assert_eq!(out.len(), 8 << 20);
    assert_eq!(&out[4096..4096 + data.len()], &data[..]);
    assert!(out[1 << 20..(1 << 20) + 100_000].iter().all(|&b| b == 0x3c));

    run(
        zeta(&home).args(["vol", "resize", "tank/c", "16M"]),
        "vol resize",
    );
    let (size, _) = Client::connect(s.addr).go("tank/c", &[]).unwrap();
    assert_eq!(size, 16 << 20);
    // zeta get and set reach it too; a client sees the new size at once.
    run(
        zeta(&home).args(["set", "volsize=20M", "tank/c"]),
        "set volsize",
    );
    let got = run(zeta(&home).args(["get", "-Hp", "volsize", "tank/c"]), "get");
    assert_eq!(got, format!("tank/c\tvolsize\t{}\n", 20 << 20));
    let (size, _) = Client::connect(s.addr).go("tank/c", &[]).unwrap();
    assert_eq!(size, 20 << 20);

    // Exporting a served pool is refused with a clear message; bad commands fail cleanly.
    let exp = zeta(&home)
        .args(["pool", "export", "tank"])
        .output()
        .unwrap();
    assert!(!exp.status.success());
    let err = String::from_utf8_lossy(&exp.stderr);
    assert!(err.contains("being served"), "{err}");
    let dup = zeta(&home)
        .args(["vol", "create", "tank/c", "8M"])
        .output()
        .unwrap();
    assert!(!dup.status.success());
    assert!(String::from_utf8_lossy(&dup.stderr).contains("already exists"));

    // A scrub runs in the server; --wait follows it to the end.
    let out = run(
        zeta(&home).args(["pool", "scrub", "--wait", "tank"]),
        "scrub",
    );
    assert!(out.contains("scrub of 'tank' finished"), "{out}");
    let status = run(
        zeta(&home).args(["pool", "status", "--json", "tank"]),
        "status",
    );
    let st: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(st[0]["scan"]["state"], "finished", "{status}");
    assert_eq!(st[0]["scan"]["errors"], 0, "{status}");
    assert!(
        st[0]["scan"]["examined_bytes"].as_u64().unwrap() > 0,
        "{status}"
    );

    // The only device of a stripe cannot go offline; the server says why.
    let leaf = s.dir.path().join("leaf").display().to_string();
    let off = zeta(&home)
        .args(["pool", "offline", "tank", &leaf])
        .output()
        .unwrap();
    assert!(!off.status.success());
    let err = String::from_utf8_lossy(&off.stderr);
    assert!(err.contains("more than it can lose"), "{err}");
    let out = run(zeta(&home).args(["pool", "clear", "tank"]), "clear");
    assert!(out.contains("cleared"), "{out}");

    run(
        zeta(&home).args(["vol", "destroy", "tank/b"]),
        "vol destroy",
    );
    s.stop();
    assert!(!sock.exists(), "control socket left behind");
    // Everything done through the socket is on disk.
    let vols = run(zeta(&home).args(["vol", "list", "--json"]), "vol list");
    assert!(
        vols.contains("tank/c") && !vols.contains("tank/b"),
        "{vols}"
    );
}

/// `zeta inject` on a served mirror: corrupted sectors are found and repaired by a scrub,
/// failing reads and a vanished device are served around, and everything clears.
#[test]
fn inject_faults_into_a_served_mirror() {
    let mut s = Served::with_vdevs(&["mirror", "m0", "m1"]);
    let home = s.home();
    let m0 = s
        .dir
        .path()
        .join("m0")
        .canonicalize()
        .unwrap()
        .display()
        .to_string();
    let m1 = s
        .dir
        .path()
        .join("m1")
        .canonicalize()
        .unwrap()
        .display()
        .to_string();
    // Data to corrupt.
    let mut c = Client::open(s.addr, "tank/a");
    let data: Vec<u8> = (0..(4u32 << 20)).map(|i| (i / 4096 + i) as u8).collect();
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        assert_eq!(c.write((i as u64) << 20, chunk), 0);
    }
    c.send(CMD_FLUSH, 0, 99, 0, 0, &[]).unwrap();
    assert_eq!(c.recv().unwrap().error, 0);

    let out = run(
        zeta(&home).args(["inject", "tank", &m1, "--corrupt", "40"]),
        "inject corrupt",
    );
    assert!(out.contains("corrupted 40 allocated sectors"), "{out}");
    run(
        zeta(&home).args(["pool", "scrub", "--wait", "tank"]),
        "scrub",
    );
    let status = run(
        zeta(&home).args(["pool", "status", "--json", "tank"]),
        "status",
    );
    let st: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(
        st[0]["scan"]["repaired_bytes"].as_u64().unwrap() >= 40 * 4096,
        "{status}"
    );
    assert_eq!(st[0]["scan"]["errors"], 0, "{status}");
    assert!(
        st[0]["vdevs"][0]["leaves"][1]["cksum_errors"]
            .as_u64()
            .unwrap()
            > 0,
        "{status}"
    );

    // m0 fails every read: reads come from m1 (the cache is bypassed by reading fresh data).
    run(
        zeta(&home).args(["inject", "tank", &m0, "--fail-reads", "1"]),
        "inject reads",
    );
    run(
        zeta(&home).args(["pool", "scrub", "--wait", "tank"]),
        "scrub 2",
    );
    let got = c.read(0, 1 << 20).unwrap();
    assert!(got == data[..1 << 20]);
    let status = run(
        zeta(&home).args(["pool", "status", "--json", "tank"]),
        "status",
    );
    let st: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(
        st[0]["vdevs"][0]["leaves"][0]["read_errors"]
            .as_u64()
            .unwrap()
            > 0,
        "{status}"
    );
    assert_eq!(st[0]["scan"]["errors"], 0, "{status}");
    // A device that fails every read is taken out of service once the mirror can spare it.
    assert_eq!(
        st[0]["vdevs"][0]["leaves"][0]["state"], "FAULTED",
        "{status}"
    );
    // Its faults removed, `pool clear` brings it back (and resilvers what it missed).
    run(
        zeta(&home).args(["inject", "tank", &m0, "--clear"]),
        "clear reads",
    );
    run(zeta(&home).args(["pool", "clear", "tank"]), "pool clear");
    let status = run(
        zeta(&home).args(["pool", "status", "--json", "tank"]),
        "status",
    );
    let st: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        st[0]["vdevs"][0]["leaves"][0]["state"], "ONLINE",
        "{status}"
    );

    // m0 vanishes: writes and flushes go on with m1.
    run(
        zeta(&home).args(["inject", "tank", &m0, "--vanish"]),
        "vanish",
    );
    assert_eq!(c.write(0, &[0x5a; 65536]), 0);
    c.send(CMD_FLUSH, 0, 100, 0, 0, &[]).unwrap();
    assert_eq!(c.recv().unwrap().error, 0);
    assert_eq!(c.read(0, 65536).unwrap(), vec![0x5a; 65536]);
    // The flush went to the intent log; a txg while m0 is gone is what it misses.
    run(zeta(&home).args(["pool", "sync", "tank"]), "sync");
    let status = run(
        zeta(&home).args(["pool", "status", "--json", "tank"]),
        "status",
    );
    let st: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        st[0]["vdevs"][0]["leaves"][0]["state"], "REMOVED",
        "{status}"
    );
    assert_eq!(st[0]["state"], "DEGRADED", "{status}");
    run(
        zeta(&home).args(["inject", "tank", &m0, "--clear"]),
        "clear",
    );
    // The writes it failed may have faulted it: `pool clear` returns it to service either way.
    run(zeta(&home).args(["pool", "clear", "tank"]), "pool clear 2");
    // Cleared, m0 is resilvered with the txgs it missed while gone.
    let mut resilvered = false;
    for _ in 0..100 {
        let status = run(
            zeta(&home).args(["pool", "status", "--json", "tank"]),
            "status",
        );
        let st: serde_json::Value = serde_json::from_str(&status).unwrap();
        if st[0]["scan"]["func"] == "resilver" && st[0]["scan"]["state"] == "finished" {
            resilvered = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        resilvered,
        "no resilver after the vanished device came back"
    );

    // Replace m1 by a new file while serving: the server rebuilds it in place.
    let m2 = s.dir.path().join("m2").display().to_string();
    let out = run(
        zeta(&home).args(["pool", "replace", "tank", &m1, &m2]),
        "replace",
    );
    assert!(out.contains("the server rebuilds it"), "{out}");
    let mut rebuilt = None;
    for _ in 0..200 {
        let status = run(
            zeta(&home).args(["pool", "status", "--json", "tank"]),
            "status",
        );
        let st: serde_json::Value = serde_json::from_str(&status).unwrap();
        let leaf = &st[0]["vdevs"][0]["leaves"][1];
        if leaf["path"].as_str().unwrap().ends_with("/m2")
            && st[0]["scan"]["func"] == "resilver"
            && st[0]["scan"]["state"] == "finished"
        {
            rebuilt = Some(st);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let st = rebuilt.expect("the replacement was not rebuilt");
    assert_eq!(st[0]["state"], "ONLINE", "{st}");
    let leaf = &st[0]["vdevs"][0]["leaves"][1];
    assert!(leaf["repaired_bytes"].as_u64().unwrap() >= 4 << 20, "{st}");
    // With m0 offline, m2 alone serves the volume.
    run(
        zeta(&home).args(["pool", "offline", "tank", &m0]),
        "offline m0",
    );
    assert_eq!(c.read(0, 65536).unwrap(), vec![0x5a; 65536]);
    let got = c.read(1 << 20, 1 << 20).unwrap();
    assert!(got == data[1 << 20..2 << 20]);
    run(
        zeta(&home).args(["pool", "online", "tank", &m0]),
        "online m0",
    );
    drop(c);
    s.stop();

    // Without a server, failures have nowhere to live; the message says so.
    let out = zeta(&home)
        .args(["inject", "tank", &m0, "--fail-writes", "0.5"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not being served"));
    // And the pool, whose m0 missed txgs while it was gone, comes back whole.
    let out = run(zeta(&home).args(["pool", "scrub", "tank"]), "scrub 3");
    assert!(out.contains("errors"), "{out}");
}

/// qemu-io's commands against `uri`; stdout and stderr together, whatever its exit status.
fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let out = c.arg(uri).output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The file system under a pool's files fills (rehearsed with `zeta inject --full`; a real
/// full file system needs a mount a test cannot make). Under one device of a mirror: the
/// other takes the writes, and the server and `pool status` say that one is NOSPACE, with
/// its cure. Under both devices: the txg waits for room; qemu-io's FUA write and a raw
/// client's write and FLUSH are answered ENOSPC at once (on which qemu pauses a guest), not left
/// waiting; the server says on stderr, when it happens, that the pool is suspended and that
/// it resumes by itself; `pool status` says SUSPENDED and why; reads go on. Once room is made
/// (`inject --clear`), the pool resumes without a restart, the server says so, the device
/// that missed a txg is resilvered, and every write is there, the refused one too.
#[test]
fn a_full_file_system_suspends_with_enospc_and_resumes_when_room_is_made() {
    if !have("qemu-io") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    run(
        zeta(&home).current_dir(dir.path()).args([
            "pool",
            "create",
            "-o",
            "size=256M",
            "tank",
            "mirror",
            "m0",
            "m1",
        ]),
        "pool create",
    );
    run(
        zeta(&home).args(["vol", "create", "tank/a", "64M"]),
        "vol create",
    );
    let log = dir.path().join("serve.log");
    let mut cmd = zeta(&home);
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .stderr(std::fs::File::create(&log).unwrap());
    let (mut child, addr, _) = spawn_server(cmd);
    let uri = format!("nbd://{addr}/tank/a");
    // The last committed txg, and a wait for a later one (a txg commits within 5 s, or 15 s
    // while the intent log holds every change: here each write was flushed).
    let txg = || {
        let out = run(
            zeta(&home).args(["pool", "status", "tank", "--json"]),
            "status",
        );
        serde_json::from_str::<serde_json::Value>(&out).unwrap()[0]["txg"]
            .as_u64()
            .unwrap()
    };
    let committed_after = |t: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if txg() > t {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("no txg committed after {t}");
    };
    let t = txg();
    let io = qemu_io(&uri, &["write -P 0x3c 0 1M", "flush"]);
    assert!(!io.to_lowercase().contains("fail"), "{io}");
    committed_after(t);

    let devices: Vec<String> = ["m0", "m1"]
        .iter()
        .map(|m| {
            dir.path()
                .join(m)
                .canonicalize()
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    let said_within = |what: &str| {
        let mut said = String::new();
        for _ in 0..100 {
            said = std::fs::read_to_string(&log).unwrap();
            if said.contains(what) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        said
    };
    let said = run(
        zeta(&home).args(["inject", "tank", &devices[0], "--full"]),
        "inject",
    );
    assert!(said.contains("data writes fail with ENOSPC"), "{said}");
    let t = txg();
    let io = qemu_io(&uri, &["write -P 0x21 4M 1M", "flush"]);
    assert!(
        !io.to_lowercase().contains("fail"),
        "the other copy takes it: {io}"
    );
    let said = said_within("NOSPACE");
    let m0 = &devices[0];
    assert!(
        said.contains(&format!("{m0} is NOSPACE (was ONLINE"))
            && said.contains("less redundancy")
            && said.contains("resilvered by itself"),
        "{said}"
    );
    let status = run(zeta(&home).args(["pool", "status", "tank"]), "status");
    assert!(status.contains("state: DEGRADED"), "{status}");
    assert!(
        status.contains(&format!("status: {m0} cannot take writes")),
        "{status}"
    );
    assert!(status.contains("action: free room"), "{status}");
    // Its txg commits on the other device alone: nothing is left for the next txg.
    committed_after(t);

    let said = run(
        zeta(&home).args(["inject", "tank", &devices[1], "--full"]),
        "inject",
    );
    assert!(said.contains("data writes fail with ENOSPC"), "{said}");
    // qemu-io writes through (FUA): the write lands in memory, but its commit finds no room
    // for the log or the txg and is refused at once, not left waiting (qemu would pause its
    // guest on it, and its pause, which drains and flushes, completes).
    let io = qemu_io(&uri, &["write -P 0x7e 2M 4k"]);
    assert!(io.contains("write failed: No space left on device"), "{io}");
    let said = said_within("SUSPENDED");
    assert!(
        said.contains("pool 'tank' is SUSPENDED")
            && said.contains("No space left on device")
            && said.contains("Writes and flushes now fail (ENOSPC)")
            && said.contains("resumes by itself"),
        "{said}"
    );
    // A write meanwhile is refused at once, and so is a FLUSH of what is in memory.
    let mut c = Client::open(addr, "tank/a");
    assert_eq!(c.write(3 << 20, &[0x55; 4096]), ENOSPC);
    assert_eq!(c.call(CMD_FLUSH, 0, 0, 0, &[]).error, ENOSPC);
    drop(c);
    let status = run(zeta(&home).args(["pool", "status", "tank"]), "status");
    assert!(status.contains("state: SUSPENDED"), "{status}");
    assert!(status.contains("tries again every second"), "{status}");
    // The suspension's lines alone: the device's would promise other copies.
    assert!(!status.contains("cannot take writes"), "{status}");
    // Reads go on (qemu-io's flush as it exits is refused, not waited for).
    let io = qemu_io(&uri, &["read -P 0x3c 0 1M"]);
    assert!(io.contains("read 1048576/1048576"), "reads go on: {io}");

    for d in &devices {
        run(zeta(&home).args(["inject", "tank", d, "--clear"]), "clear");
    }
    let said = said_within("RESUMED");
    assert!(said.contains("pool 'tank' RESUMED"), "{said}");
    let said = said_within("was NOSPACE");
    assert!(
        said.contains(&format!("{m0} is ONLINE (was NOSPACE")),
        "{said}"
    );
    let status = run(zeta(&home).args(["pool", "status", "tank"]), "status");
    assert!(status.contains("state: ONLINE"), "{status}");
    // m0, which missed a txg, is resilvered.
    for _ in 0..100 {
        let status = run(zeta(&home).args(["pool", "status", "tank"]), "status");
        if status.contains("resilver finished") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let status = run(zeta(&home).args(["pool", "status", "tank"]), "status");
    assert!(status.contains("resilver finished"), "{status}");
    // Nothing was lost, not even the write that was refused (it was kept in memory).
    let io = qemu_io(
        &uri,
        &[
            "read -P 0x7e 2M 4k",
            "read -P 0x3c 0 1M",
            "read -P 0x21 4M 1M",
            "flush",
        ],
    );
    assert!(!io.contains("Pattern verification failed"), "{io}");
    assert!(!io.to_lowercase().contains("fail"), "{io}");
    sigterm(child.id());
    assert!(child.wait().unwrap().success());
}

/// A snapshot is an export of its own, read-only: listed, read by qemu-img and nbdinfo as the
/// volume was when it was taken, every write refused; it cannot be destroyed while a client
/// is connected to it, and can once the client has gone.
#[test]
fn a_snapshot_is_served_read_only() {
    if !have("nbdinfo") || !have("qemu-io") {
        return;
    }
    let s = Served::new();
    let home = s.home();
    run(
        Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x61 0 1M", &s.uri("tank/a")]),
        "qemu-io write",
    );
    run(zeta(&home).args(["snapshot", "tank/a@s1"]), "snapshot");
    run(
        Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 0x62 0 1M", &s.uri("tank/a")]),
        "qemu-io write",
    );
    let list = run(
        Command::new("nbdinfo").args(["--list", &format!("nbd://{}", s.addr)]),
        "nbdinfo --list",
    );
    assert!(list.contains("tank/a@s1"), "{list}");
    let snap = s.uri("tank/a@s1");
    let can = Command::new("nbdinfo")
        .args(["--can", "write", &snap])
        .status()
        .unwrap();
    assert!(!can.success(), "a snapshot export says it takes writes");
    run(
        Command::new("qemu-io").args(["-f", "raw", "-r", "-c", "read -P 0x61 0 1M", &snap]),
        "qemu-io read of the snapshot",
    );
    run(
        Command::new("qemu-io").args(["-f", "raw", "-c", "read -P 0x62 0 1M", &s.uri("tank/a")]),
        "qemu-io read of the volume",
    );
    let w = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x63 0 4k", &snap])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&w.stdout).to_string() + &String::from_utf8_lossy(&w.stderr);
    assert!(
        !w.status.success() || said.contains("failed") || said.contains("ermission"),
        "{said}"
    );
    // What changed since the snapshot, as a backup tool asks for it.
    let map = run(
        Command::new("nbdinfo").args(["--map=zeta:changed:s1", &s.uri("tank/a")]),
        "nbdinfo --map=zeta:changed:s1",
    );
    let first: Vec<&str> = map
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(first[..3], ["0", "1048576", "1"], "{map}");
    assert!(
        map.lines()
            .skip(1)
            .all(|l| l.split_whitespace().nth(2) == Some("0")),
        "{map}"
    );
    // Held by a client: not destroyed; once it has gone, destroyed.
    let mut c = Client::open(s.addr, "tank/a@s1");
    assert!(c.read(0, 4096).unwrap().iter().all(|&b| b == 0x61));
    let out = zeta(&home).args(["destroy", "tank/a@s1"]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use"),
        "{out:?}"
    );
    drop(c);
    let mut gone = false;
    for _ in 0..50 {
        if zeta(&home)
            .args(["destroy", "tank/a@s1"])
            .output()
            .unwrap()
            .status
            .success()
        {
            gone = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(gone, "the snapshot stayed in use after its client left");
}
