//! A Ceph cluster for the tests, where there is one: `$CEPH_CONF` names it (`.ci/run` starts
//! one with `../shared/ceph/up.sh`). Without it the RADOS tests say so and pass, unless
//! `ZETA_REQUIRE_CEPH=1` makes that a failure, as CI sets it.

use std::path::PathBuf;

/// The Ceph pool the tests make devices in (created on first use), or None (skip).
pub fn ceph_pool() -> Option<&'static str> {
    const POOL: &str = "zeta-test";
    zeta_rados::register();
    let required = std::env::var("ZETA_REQUIRE_CEPH").is_ok_and(|v| v == "1");
    if std::env::var_os("CEPH_CONF").is_none() {
        assert!(
            !required,
            "ZETA_REQUIRE_CEPH=1 but CEPH_CONF is not set (see .ci/run)"
        );
        eprintln!("SKIPPED: no Ceph cluster (set CEPH_CONF; ../shared/ceph/up.sh starts one)");
        return None;
    }
    match zeta_rados::Cluster::get().and_then(|c| c.create_pool(POOL)) {
        Ok(()) => Some(POOL),
        Err(e) => {
            assert!(
                !required,
                "ZETA_REQUIRE_CEPH=1 but the cluster is out of reach: {e}"
            );
            eprintln!("SKIPPED: {e}");
            None
        }
    }
}

/// `n` new RADOS devices of `size` bytes in `pool`, named after `what` and a random suffix.
pub fn new_devices(pool: &str, what: &str, n: usize, size: u64) -> Vec<PathBuf> {
    let tag: u32 = rand::random();
    (0..n)
        .map(|i| {
            let p = PathBuf::from(format!("rados:{pool}/{what}-{tag:08x}-{i}"));
            let options = zeta::vdev::DeviceOptions {
                object_size: Some(1 << 20),
            };
            zeta::vdev::scheme::create(&p, size, false, options)
                .unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
            p
        })
        .collect()
}
