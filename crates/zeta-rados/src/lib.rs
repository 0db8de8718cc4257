//! zeta's Ceph RADOS device: a leaf whose bytes live in RADOS objects of a Ceph pool
//! (`rados:POOL/NAME`), so a pool's devices can be a Ceph cluster's (DESIGN.md, scale-out).
//!
//! librados is loaded at run time (`ffi`), so zeta builds and runs without Ceph installed;
//! only a `rados:` device asks for the library, and gets one clear error without it.
//! `register` makes the scheme known to `zeta-core`, which then opens, creates and finds
//! such devices as it does files.

pub mod cluster;
pub mod device;
pub mod ffi;
pub mod lease;
pub mod spec;

use std::io;
use std::sync::Arc;

use zeta_core::vdev::{BlockDevice, DeviceOptions, DeviceScheme, VdevError};

pub use cluster::{Cluster, RadosError};
pub use device::{Access, RadosDevice, DEFAULT_OBJECT_SIZE};
pub use spec::{Spec, SCHEME};

/// The `rados:` scheme.
pub struct Rados;

/// Makes `rados:` devices known to the engine; call once at start-up.
pub fn register() {
    zeta_core::vdev::scheme::register(Arc::new(Rados));
}

/// A RADOS error as the device layer reports errors: the device first.
fn vdev_err(spec: &str, e: RadosError) -> VdevError {
    let what = e.what.strip_prefix(spec).unwrap_or(&e.what);
    let what = what.trim_start_matches(": ");
    let msg = if what.is_empty() || what == "rados" {
        e.source.to_string()
    } else {
        format!("{what}: {}", e.source)
    };
    VdevError::Io {
        path: spec.to_string(),
        source: io::Error::new(e.source.kind(), msg),
    }
}

fn parse(spec: &str) -> Result<Spec, VdevError> {
    Spec::parse(spec).map_err(|why| VdevError::Io {
        path: spec.to_string(),
        source: io::Error::new(io::ErrorKind::InvalidInput, why),
    })
}

impl DeviceScheme for Rados {
    fn prefix(&self) -> &'static str {
        SCHEME
    }

    fn open(&self, spec: &str, read_only: bool) -> Result<Arc<dyn BlockDevice>, VdevError> {
        let s = parse(spec)?;
        let access = if read_only {
            Access::ReadOnly
        } else {
            Access::Owner
        };
        let dev = RadosDevice::open(&s, access).map_err(|e| vdev_err(spec, e))?;
        Ok(Arc::new(dev))
    }

    fn inspect(&self, spec: &str) -> Result<(Arc<dyn BlockDevice>, bool), VdevError> {
        let s = parse(spec)?;
        let dev = RadosDevice::open(&s, Access::Inspect).map_err(|e| vdev_err(spec, e))?;
        let leased = dev.leased().map_err(|e| vdev_err(spec, e))?;
        Ok((Arc::new(dev), leased))
    }

    fn exists(&self, spec: &str) -> Result<bool, VdevError> {
        RadosDevice::exists(&parse(spec)?).map_err(|e| vdev_err(spec, e))
    }

    fn create(&self, spec: &str, size_bytes: u64, options: DeviceOptions) -> Result<(), VdevError> {
        let object_size = options.object_size.unwrap_or(DEFAULT_OBJECT_SIZE);
        RadosDevice::create(&parse(spec)?, size_bytes, object_size).map_err(|e| vdev_err(spec, e))
    }

    fn remove(&self, spec: &str) -> Result<(), VdevError> {
        RadosDevice::remove(&parse(spec)?).map_err(|e| vdev_err(spec, e))
    }

    fn list(&self, place: &str) -> Result<Vec<String>, VdevError> {
        let pool = Spec::parse_pool(place).map_err(|why| VdevError::Io {
            path: place.to_string(),
            source: io::Error::new(io::ErrorKind::InvalidInput, why),
        })?;
        let io = Cluster::get()
            .and_then(|c| c.pool(&pool))
            .map_err(|e| vdev_err(place, e))?;
        let heads = io
            .list(device::HEAD_PREFIX)
            .map_err(|e| vdev_err(place, e))?;
        Ok(heads
            .iter()
            .filter_map(|h| h.strip_prefix(device::HEAD_PREFIX))
            .map(|name| format!("{SCHEME}{pool}/{name}"))
            .collect())
    }
}
