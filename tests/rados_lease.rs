//! One owner at a time on shared storage, through the `zeta` binary and a real Ceph cluster:
//! a second importer is refused while the first owner's lease lives, takes the pool once a
//! killed owner's lease lapses, and an owner whose lease is taken from it suspends its pool
//! instead of writing. Skipped without a cluster unless `ZETA_REQUIRE_CEPH=1`.

mod common;

use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use common::cli::{fails_with, ok};
use common::procs::{have, spawn_server};

/// Leases this short keep the test quick: renewed every 0.75 s, writes stop 1.5 s after the
/// last renewal, gone 3 s after it.
const LEASE_SECS: &str = "3";

fn zeta(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zeta"))
        .args(args)
        .env("ZETA_HOME", home)
        .env("ZETA_RADOS_LEASE_SECS", LEASE_SECS)
        .output()
        .unwrap()
}

struct Server(Child);

impl Server {
    fn start(home: &Path, pool: &str) -> (Server, std::net::SocketAddr) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_zeta"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", pool])
            .env("ZETA_HOME", home)
            .env("ZETA_RADOS_LEASE_SECS", LEASE_SECS);
        let (child, addr, _) = spawn_server(cmd);
        (Server(child), addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pool with a volume `v` on a new RADOS device, created from `home`: its name (unique,
/// since every test's devices share one Ceph pool, where an import looks) and device.
fn rados_pool(home: &Path, ceph: &str, what: &str) -> (String, String) {
    let name = format!("{what}{:08x}", rand::random::<u32>());
    let dev = format!("rados:{ceph}/{name}");
    ok(&zeta(
        home,
        &["pool", "create", &name, &dev, "-o", "size=256M"],
    ));
    ok(&zeta(home, &["vol", "create", &format!("{name}/v"), "64M"]));
    (name, dev)
}

#[test]
fn a_second_importer_is_refused_until_a_killed_owners_lease_lapses() {
    let Some(ceph) = common::rados::ceph_pool() else {
        return;
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (tank, dev) = rados_pool(a.path(), ceph, "lease");
    let (mut server, _) = Server::start(a.path(), &tank);
    let place = format!("rados:{ceph}");
    let refused = zeta(b.path(), &["pool", "import", "-d", &place, &tank]);
    fails_with(&refused, "lease");
    fails_with(&refused, &dev);

    server.0.kill().unwrap(); // SIGKILL: the lease is not given back
    server.0.wait().unwrap();
    let killed = Instant::now();
    fails_with(
        &zeta(b.path(), &["pool", "import", "-f", "-d", &place, &tank]),
        "lease",
    );
    loop {
        let out = zeta(b.path(), &["pool", "import", "-f", "-d", &place, &tank]);
        if out.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("lease"), "refused for another reason: {err}");
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "the lease never lapsed: {err}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let waited = killed.elapsed();
    assert!(
        waited >= Duration::from_millis(1000),
        "imported {waited:?} after the kill: before the lease could lapse"
    );
    ok(&zeta(b.path(), &["pool", "export", &tank]));
    zeta::vdev::scheme::remove(Path::new(&dev));
}

#[test]
fn an_owner_whose_lease_is_taken_suspends_instead_of_writing() {
    let Some(ceph) = common::rados::ceph_pool() else {
        return;
    };
    if !have("qemu-io") {
        return;
    }
    let a = tempfile::tempdir().unwrap();
    let (tank, dev) = rados_pool(a.path(), ceph, "fence");
    let (server, addr) = Server::start(a.path(), &tank);
    let url = format!("nbd://{addr}/{tank}/v");
    let qemu_io = |cmds: &[&str]| {
        let mut c = Command::new("qemu-io");
        c.args(["-f", "raw"]);
        for cmd in cmds {
            c.args(["-c", cmd]);
        }
        c.arg(&url).output().unwrap()
    };
    let before = qemu_io(&["write -P 7 0 1M", "flush"]);
    assert!(before.status.success(), "{before:?}");

    // Another owner breaks the lease and takes it, as a host sure the first is dead would.
    let spec = zeta_rados::Spec::parse(&dev).unwrap();
    assert_eq!(zeta_rados::RadosDevice::break_lease(&spec).unwrap(), 1);
    let thief = zeta_rados::RadosDevice::open(&spec, zeta_rados::Access::Owner).unwrap();
    // The first owner's heartbeat finds it gone within a renewal period.
    std::thread::sleep(Duration::from_secs(2));
    let after = qemu_io(&["write -P 9 0 1M", "flush"]);
    let said = String::from_utf8_lossy(&after.stdout).to_string()
        + &String::from_utf8_lossy(&after.stderr);
    assert!(
        !after.status.success() || said.contains("failed"),
        "a write went through after the lease was taken: {said}"
    );
    let status = ok(&zeta(a.path(), &["pool", "status", &tank]));
    assert!(
        status.contains("SUSPENDED") && status.contains("lease"),
        "{status}"
    );
    // Nothing of the refused write reached the device: it still holds the 7s.
    drop(server);
    drop(thief);
    let b = tempfile::tempdir().unwrap();
    let place = format!("rados:{ceph}");
    let t0 = Instant::now();
    while !zeta(b.path(), &["pool", "import", "-f", "-d", &place, &tank])
        .status
        .success()
    {
        assert!(t0.elapsed() < Duration::from_secs(20), "no import");
        std::thread::sleep(Duration::from_millis(250));
    }
    let (_server, addr) = Server::start(b.path(), &tank);
    let out = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 7 0 1M"])
        .arg(format!("nbd://{addr}/{tank}/v"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !said.contains("fail") && !said.contains("mismatch"),
        "{said}"
    );
}
