//! The RADOS device against a real Ceph cluster (`../shared/ceph/up.sh`, `$CEPH_CONF`): bytes
//! striped over objects read back, unwritten and discarded objects read as zeros, writes in
//! flight all land by `flush`, and a second owner is refused while the first holds the lease.
//! Without a cluster the tests say so and pass, unless `ZETA_REQUIRE_CEPH=1` (CI) makes that
//! a failure.

use rand::{Rng, RngCore};
use zeta_core::vdev::BlockDevice;
use zeta_rados::{Access, Cluster, RadosDevice, Spec};

/// The Ceph pool the tests make devices in, or None if there is no cluster to use.
fn cluster_pool() -> Option<String> {
    let required = std::env::var("ZETA_REQUIRE_CEPH").is_ok_and(|v| v == "1");
    if std::env::var_os("CEPH_CONF").is_none() {
        assert!(!required, "ZETA_REQUIRE_CEPH=1 but CEPH_CONF is not set");
        eprintln!("skipped: no Ceph cluster (set CEPH_CONF, see ../shared/ceph/up.sh)");
        return None;
    }
    let cluster = match Cluster::get() {
        Ok(c) => c,
        Err(e) => {
            assert!(
                !required,
                "ZETA_REQUIRE_CEPH=1 but the cluster is out of reach: {e}"
            );
            eprintln!("skipped: {e}");
            return None;
        }
    };
    cluster
        .create_pool("zeta-test")
        .expect("create the test pool");
    Some("zeta-test".into())
}

fn new_spec(pool: &str, what: &str) -> Spec {
    Spec {
        pool: pool.into(),
        name: format!("{what}-{:08x}", rand::random::<u32>()),
    }
}

#[test]
fn bytes_striped_over_objects_read_back_and_holes_read_as_zeros() {
    let Some(pool) = cluster_pool() else { return };
    let spec = new_spec(&pool, "stripe");
    let os = 1 << 20;
    RadosDevice::create(&spec, 64 << 20, os).unwrap();
    assert!(RadosDevice::exists(&spec).unwrap());
    let err = RadosDevice::create(&spec, 64 << 20, os).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    let dev = RadosDevice::open(&spec, Access::Owner).unwrap();
    assert_eq!(dev.len_bytes(), 64 << 20);
    assert_eq!(dev.geometry().object_size, os);

    // A model of the device, written at random places and sizes, many across objects.
    let mut rng = rand::thread_rng();
    let mut model = vec![0u8; 8 << 20];
    for _ in 0..300 {
        let len = rng.gen_range(1..=300_000usize);
        let off = rng.gen_range(0..model.len() - len);
        rng.fill_bytes(&mut model[off..off + len]);
        if rng.gen_bool(0.1) {
            dev.write_durable(&model[off..off + len], off as u64)
                .unwrap();
        } else {
            dev.write_at(&model[off..off + len], off as u64).unwrap();
        }
    }
    dev.flush().unwrap();
    let mut back = vec![0xAAu8; model.len()];
    dev.read_at(&mut back, 0).unwrap();
    assert!(back == model, "what was written reads back");

    // Vectored reads across object boundaries.
    let (mut a, mut b) = (vec![0u8; 700_000], vec![0u8; 900_000]);
    dev.read_vectored_at(&mut [&mut a, &mut b], 500_000)
        .unwrap();
    assert!(a[..] == model[500_000..1_200_000] && b[..] == model[1_200_000..2_100_000]);

    // Never written: zeros. Past the end: refused.
    let mut far = vec![0xAAu8; 4096];
    dev.read_at(&mut far, 40 << 20).unwrap();
    assert!(far.iter().all(|&x| x == 0));
    assert!(dev.read_at(&mut far, (64 << 20) - 100).is_err());
    assert!(dev.write_at(&far, (64 << 20) - 100).is_err());

    // A discard removes the objects it covers whole; the rest stays.
    dev.discard(os / 2, 3 * os).unwrap();
    dev.flush().unwrap();
    dev.read_at(&mut back, 0).unwrap();
    assert!(back[..os as usize] == model[..os as usize]);
    assert!(back[os as usize..3 * os as usize].iter().all(|&x| x == 0));
    assert!(back[3 * os as usize..] == model[3 * os as usize..]);

    // Another open sees what the first flushed.
    drop(dev);
    let again = RadosDevice::open(&spec, Access::ReadOnly).unwrap();
    let mut head = vec![0u8; os as usize];
    again.read_at(&mut head, 0).unwrap();
    assert!(head[..] == model[..os as usize]);
    assert!(
        again.write_at(&head[..10], 0).is_err(),
        "read-only refuses writes"
    );
}

#[test]
fn a_second_owner_is_refused_while_the_lease_is_held() {
    let Some(pool) = cluster_pool() else { return };
    let spec = new_spec(&pool, "lease");
    RadosDevice::create(&spec, 16 << 20, 4 << 20).unwrap();
    let first = RadosDevice::open(&spec, Access::Owner).unwrap();
    let err = RadosDevice::open(&spec, Access::Owner)
        .err()
        .expect("refused");
    let msg = err.to_string();
    assert!(msg.contains("in use") && msg.contains("client."), "{msg}");
    // Looking is allowed, and sees the holder.
    let look = RadosDevice::open(&spec, Access::Inspect).unwrap();
    assert!(look.leased().unwrap());
    drop(first);
    assert!(!look.leased().unwrap(), "closing gives the lease back");
    RadosDevice::open(&spec, Access::Owner).expect("free again");
}

#[test]
fn a_device_that_is_not_there_and_bad_geometry_get_clear_errors() {
    let Some(pool) = cluster_pool() else { return };
    let spec = new_spec(&pool, "absent");
    let err = RadosDevice::open(&spec, Access::Owner)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("does not exist"), "{err}");
    let err = RadosDevice::create(&spec, 16 << 20, 3 << 20).unwrap_err();
    assert!(err.to_string().contains("power of two"), "{err}");
    let missing = Spec {
        pool: "no-such-pool".into(),
        name: "x".into(),
    };
    let err = RadosDevice::open(&missing, Access::Owner)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("does not exist"), "{err}");
}
