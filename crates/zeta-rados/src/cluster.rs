//! The process's connection to a Ceph cluster and its I/O contexts, one per Ceph pool.
//!
//! One connection serves every RADOS device of the process (librados multiplexes all of a
//! client's requests over its own threads and sockets); each Ceph pool gets one I/O context,
//! shared by the devices in it. Both are thread-safe in librados, so no lock of ours is held
//! across a request.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::ffi::{self, Api, IoCtx, Rados};

/// A librados error: the failed call and the errno it returned.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct RadosError {
    pub what: String,
    pub source: io::Error,
}

impl RadosError {
    /// From a librados return value (`-errno`).
    pub fn from_ret(what: impl Into<String>, ret: i64) -> RadosError {
        RadosError {
            what: what.into(),
            source: io::Error::from_raw_os_error((-ret) as i32),
        }
    }

    pub fn other(what: impl Into<String>, why: impl Into<String>) -> RadosError {
        RadosError {
            what: what.into(),
            source: io::Error::other(why.into()),
        }
    }

    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

pub type Result<T> = std::result::Result<T, RadosError>;

/// Turns a librados return value into a result: negative is `-errno`.
pub fn check(what: impl FnOnce() -> String, ret: i64) -> Result<i64> {
    if ret < 0 {
        Err(RadosError::from_ret(what(), ret))
    } else {
        Ok(ret)
    }
}

/// A connected cluster handle.
pub struct Cluster {
    api: &'static Api,
    handle: Rados,
    pools: Mutex<HashMap<String, Arc<IoPool>>>,
}

// SAFETY: a connected `rados_t` may be used from any thread at once (librados's own
// contract); it is only shut down in `drop`, when no `IoPool` (each holds an `Arc<Cluster>`)
// is left.
unsafe impl Send for Cluster {}
// SAFETY: as for `Send`: librados serialises what it must inside.
unsafe impl Sync for Cluster {}

/// Timeouts set before the configuration is read, so that a cluster that is gone makes
/// requests fail instead of hanging (librados waits for ever by default). `CEPH_ARGS` and
/// the configuration file may set others; both are read after these.
const DEFAULT_TIMEOUTS: [(&str, &str); 3] = [
    ("client_mount_timeout", "15"),
    ("rados_osd_op_timeout", "30"),
    ("rados_mon_op_timeout", "30"),
];

impl Cluster {
    /// The process's connection, made on first use. The configuration comes from where the
    /// `ceph` tool finds it: `$CEPH_CONF`, else `/etc/ceph/ceph.conf`, with `$CEPH_ARGS` on
    /// top; the user is `client.admin` unless `$CEPH_ARGS` names another. A failed connect is
    /// not kept: the next use tries again (a cluster that comes back is found).
    pub fn get() -> Result<Arc<Cluster>> {
        static CLUSTER: Mutex<Option<Arc<Cluster>>> = Mutex::new(None);
        let mut slot = CLUSTER.lock();
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = Arc::new(Cluster::connect()?);
        *slot = Some(c.clone());
        Ok(c)
    }

    fn connect() -> Result<Cluster> {
        let api = ffi::api().map_err(|e| {
            RadosError::other(
                "rados",
                format!(
                    "cannot load {} ({e}); install Ceph's client library (Debian: \
                     apt-get install librados2)",
                    ffi::LIBRARY
                ),
            )
        })?;
        let mut handle: Rados = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; a null id means client.admin.
        let ret = unsafe { (api.create)(&mut handle, std::ptr::null()) };
        check(|| "rados_create".into(), ret as i64)?;
        // From here `cluster`'s drop shuts the handle down on every error path.
        let cluster = Cluster {
            api,
            handle,
            pools: Mutex::new(HashMap::new()),
        };
        for (k, v) in DEFAULT_TIMEOUTS {
            let (k, v) = (cstr(k), cstr(v));
            // SAFETY: a created handle and two NUL-terminated strings that outlive the call.
            check(|| format!("setting {k:?}"), unsafe {
                (api.conf_set)(handle, k.as_ptr(), v.as_ptr())
            } as i64)?;
        }
        // SAFETY: a null path searches the default locations ($CEPH_CONF first).
        let ret = unsafe { (api.conf_read_file)(handle, std::ptr::null()) };
        check(
            || "reading the Ceph configuration ($CEPH_CONF or /etc/ceph/ceph.conf)".into(),
            ret as i64,
        )?;
        // SAFETY: a null name parses $CEPH_ARGS.
        check(|| "parsing $CEPH_ARGS".into(), unsafe {
            (api.conf_parse_env)(handle, std::ptr::null())
        } as i64)?;
        // SAFETY: a configured handle; blocks until connected or timed out.
        let ret = unsafe { (api.connect)(handle) };
        check(|| "connecting to the Ceph cluster".into(), ret as i64)?;
        Ok(cluster)
    }

    pub fn api(&self) -> &'static Api {
        self.api
    }

    /// This client's id in the cluster (the N of `client.N`), as lockers are named.
    pub fn instance_id(&self) -> u64 {
        // SAFETY: a connected handle.
        unsafe { (self.api.get_instance_id)(self.handle) }
    }

    /// The I/O context of Ceph pool `name`, made on first use.
    pub fn pool(self: &Arc<Self>, name: &str) -> Result<Arc<IoPool>> {
        let mut pools = self.pools.lock();
        if let Some(p) = pools.get(name) {
            return Ok(p.clone());
        }
        let cname = cstr(name);
        let mut ioctx: IoCtx = std::ptr::null_mut();
        // SAFETY: a connected handle, a NUL-terminated name and a valid out-pointer.
        let ret = unsafe { (self.api.ioctx_create)(self.handle, cname.as_ptr(), &mut ioctx) };
        if ret == -libc::ENOENT {
            return Err(RadosError::other(
                format!("Ceph pool '{name}'"),
                "does not exist (create it with `ceph osd pool create`)",
            ));
        }
        check(|| format!("opening Ceph pool '{name}'"), ret as i64)?;
        let p = Arc::new(IoPool {
            cluster: self.clone(),
            ioctx,
            name: name.to_string(),
        });
        pools.insert(name.to_string(), p.clone());
        Ok(p)
    }

    /// Creates Ceph pool `name` (tests and benchmarks; users make pools with `ceph`).
    pub fn create_pool(&self, name: &str) -> Result<()> {
        let cname = cstr(name);
        // SAFETY: a connected handle and a NUL-terminated name.
        let ret = unsafe { (self.api.pool_create)(self.handle, cname.as_ptr()) };
        if ret == -libc::EEXIST {
            return Ok(());
        }
        check(|| format!("creating Ceph pool '{name}'"), ret as i64).map(|_| ())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: reached only for a handle whose connect failed (a connected one lives in
        // `get`'s static for the process), so no I/O context or request uses it.
        unsafe { (self.api.shutdown)(self.handle) }
    }
}

/// An I/O context on one Ceph pool. It lives as long as the process: the cluster keeps it for
/// the next device in the same pool.
pub struct IoPool {
    cluster: Arc<Cluster>,
    ioctx: IoCtx,
    name: String,
}

// SAFETY: librados I/O contexts are thread-safe for the calls made here (aio submission,
// synchronous reads, xattrs, locks, listing with a context of its own).
unsafe impl Send for IoPool {}
// SAFETY: as for `Send`.
unsafe impl Sync for IoPool {}

impl IoPool {
    pub fn api(&self) -> &'static Api {
        self.cluster.api
    }

    pub fn ioctx(&self) -> IoCtx {
        self.ioctx
    }

    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The names of every object in the pool whose name starts with `prefix`.
    pub fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let api = self.api();
        let mut ctx: ffi::ListCtx = std::ptr::null_mut();
        // SAFETY: an open I/O context and a valid out-pointer.
        check(|| format!("listing Ceph pool '{}'", self.name), unsafe {
            (api.nobjects_list_open)(self.ioctx, &mut ctx)
        }
            as i64)?;
        let mut out = Vec::new();
        let result = loop {
            let mut entry: *const std::ffi::c_char = std::ptr::null();
            // SAFETY: an open list context; key and namespace are not asked for.
            let ret = unsafe {
                (api.nobjects_list_next)(
                    ctx,
                    &mut entry,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            if ret == -libc::ENOENT {
                break Ok(());
            }
            if ret < 0 {
                break Err(RadosError::from_ret(
                    format!("listing Ceph pool '{}'", self.name),
                    ret as i64,
                ));
            }
            // SAFETY: librados returns a NUL-terminated name valid until the next call.
            let name = unsafe { CStr::from_ptr(entry) }.to_string_lossy();
            if name.starts_with(prefix) {
                out.push(name.into_owned());
            }
        };
        // SAFETY: the context opened above, closed once.
        unsafe { (api.nobjects_list_close)(ctx) };
        result.map(|()| {
            out.sort();
            out
        })
    }
}

/// A C string of `s`, which holds no NUL (names are checked where they come in).
pub fn cstr(s: &str) -> CString {
    CString::new(s).expect("names with a NUL are refused where they come in")
}
