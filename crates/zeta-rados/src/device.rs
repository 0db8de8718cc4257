//! A leaf device whose bytes are striped over RADOS objects, as librbd stripes an image.
//!
//! `rados:POOL/NAME` is a head object `zeta.NAME` in Ceph pool POOL, whose extended
//! attributes give the device's size, object size and id, and data objects
//! `zeta_data.ID.NNNNNNNNNNNNNNNN` (the object number in hex), made as they are first written:
//! an object never written reads as zeros, so a new device is thin.
//!
//! Writes are asynchronous: `write_at` hands the bytes to librados (which copies them) and
//! returns; up to `MAX_IN_FLIGHT` writes per device are in flight at once, completing in any
//! order, and `flush` waits for all of them (RADOS acknowledges a write once every replica
//! has it durably). So a txg's many writes go out together, as the page cache lets a file's.
//! Reads and durable writes send every object's part at once and wait for them together.

use std::ffi::{c_char, c_void};
use std::io::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use zeta_core::vdev::{BlockDevice, VdevError};

use crate::cluster::{check, cstr, Cluster, IoPool, RadosError};
use crate::ffi::{self, Api, Completion, CREATE_EXCLUSIVE};
use crate::lease::{self, Lease};
use crate::spec::Spec;

/// Requests a device keeps in flight at most (writes and discards waiting for `flush`).
pub const MAX_IN_FLIGHT: usize = 128;

/// Object sizes a device may have: a power of two in this range (librbd's default is 4M).
pub const OBJECT_SIZES: std::ops::RangeInclusive<u64> = (1 << 20)..=(16 << 20);
pub const DEFAULT_OBJECT_SIZE: u64 = 4 << 20;

/// The head object's attributes.
const XATTR_VERSION: &str = "zeta.version";
const XATTR_SIZE: &str = "zeta.size";
const XATTR_OBJECT_SIZE: &str = "zeta.object_size";
const XATTR_ID: &str = "zeta.id";
const VERSION: &str = "1";

/// The prefix of every head object's name.
pub const HEAD_PREFIX: &str = "zeta.";

/// What a device's geometry is, as its head object records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub size_bytes: u64,
    pub object_size: u64,
    pub id: u64,
}

/// How a device is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Reads and writes, under the device's lease.
    Owner,
    /// Reads only, no lease (a read-only import, which others may share).
    ReadOnly,
    /// Reads only, to look at labels: no lease, and nobody's lease is disturbed.
    Inspect,
}

/// Writes in flight and the first error one of them met, shared with librados's callbacks.
struct InFlight {
    count: Mutex<usize>,
    changed: Condvar,
    /// The first failed write's `-errno` since the last `flush` reported one.
    failed: Mutex<Option<i32>>,
}

pub struct RadosDevice {
    spec: String,
    pool: Arc<IoPool>,
    geometry: Geometry,
    access: Access,
    in_flight: Arc<InFlight>,
    lease: Option<Lease>,
}

/// A data object's name, NUL-terminated, built without allocating.
struct ObjName {
    buf: [u8; 48],
}

impl ObjName {
    fn ptr(&self) -> *const c_char {
        self.buf.as_ptr() as *const c_char
    }
}

impl RadosDevice {
    /// Makes a new device of `size_bytes` at `spec`; `EEXIST` if one is there.
    pub fn create(spec: &Spec, size_bytes: u64, object_size: u64) -> Result<(), RadosError> {
        if !object_size.is_power_of_two() || !OBJECT_SIZES.contains(&object_size) {
            return Err(RadosError::other(
                spec.to_string(),
                format!(
                    "object_size must be a power of two from 1M to 16M, not {object_size} bytes"
                ),
            ));
        }
        let pool = Cluster::get()?.pool(&spec.pool)?;
        let api = pool.api();
        let head = cstr(&spec.head_object());
        let id = format!("{:016x}", rand::random::<u64>());
        let attrs = [
            (XATTR_VERSION, VERSION.to_string()),
            (XATTR_SIZE, size_bytes.to_string()),
            (XATTR_OBJECT_SIZE, object_size.to_string()),
            (XATTR_ID, id),
        ];
        let names: Vec<_> = attrs.iter().map(|(k, _)| cstr(k)).collect();
        // SAFETY: creates an operation released below on every path.
        let op = unsafe { (api.create_write_op)() };
        // SAFETY: `op` is live; the strings and values outlive `operate`, which copies them.
        let ret = unsafe {
            (api.write_op_create)(op, CREATE_EXCLUSIVE, std::ptr::null());
            for ((_, v), k) in attrs.iter().zip(&names) {
                (api.write_op_setxattr)(op, k.as_ptr(), v.as_ptr() as *const c_char, v.len());
            }
            let ret =
                (api.write_op_operate)(op, pool.ioctx(), head.as_ptr(), std::ptr::null_mut(), 0);
            (api.release_write_op)(op);
            ret
        };
        if ret == -libc::EEXIST {
            return Err(RadosError::other(spec.to_string(), "already exists"));
        }
        check(|| format!("{spec}: creating its head object"), ret as i64).map(|_| ())
    }

    /// Removes the device at `spec`, data objects first, then its head; refused while
    /// someone holds its lease.
    pub fn remove(spec: &Spec) -> Result<(), RadosError> {
        let pool = Cluster::get()?.pool(&spec.pool)?;
        let geometry = read_geometry(&pool, spec)?;
        if !lease::holders(&pool, &spec.head_object())?.is_empty() {
            return Err(RadosError::other(
                spec.to_string(),
                "in use: its lease is held",
            ));
        }
        let api = pool.api();
        let prefix = format!("zeta_data.{:016x}.", geometry.id);
        for name in pool.list(&prefix)?.iter().chain([&spec.head_object()]) {
            let c = cstr(name);
            // SAFETY: a NUL-terminated name that outlives the call.
            let ret = unsafe { (api.remove)(pool.ioctx(), c.as_ptr()) };
            if ret < 0 && ret != -libc::ENOENT {
                return Err(RadosError::from_ret(
                    format!("{spec}: removing {name}"),
                    ret as i64,
                ));
            }
        }
        Ok(())
    }

    /// Whether a device exists at `spec`.
    pub fn exists(spec: &Spec) -> Result<bool, RadosError> {
        let pool = Cluster::get()?.pool(&spec.pool)?;
        match read_geometry(&pool, spec) {
            Ok(_) => Ok(true),
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn open(spec: &Spec, access: Access) -> Result<RadosDevice, RadosError> {
        let pool = Cluster::get()?.pool(&spec.pool)?;
        let geometry = read_geometry(&pool, spec).map_err(|e| {
            if e.errno() == Some(libc::ENOENT) {
                RadosError::other(spec.to_string(), "does not exist")
            } else {
                e
            }
        })?;
        let lease = match access {
            Access::Owner => Some(Lease::take(
                pool.clone(),
                &spec.head_object(),
                &spec.to_string(),
            )?),
            Access::ReadOnly | Access::Inspect => None,
        };
        Ok(RadosDevice {
            spec: spec.to_string(),
            pool,
            geometry,
            access,
            in_flight: Arc::new(InFlight {
                count: Mutex::new(0),
                changed: Condvar::new(),
                failed: Mutex::new(None),
            }),
            lease,
        })
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Whether some client holds the device's lease now (a pool has it imported).
    pub fn leased(&self) -> Result<bool, RadosError> {
        Ok(!self.holders()?.is_empty())
    }

    /// Breaks the lease of the device at `spec`, whoever holds it (see `lease::break_leases`).
    pub fn break_lease(spec: &Spec) -> Result<usize, RadosError> {
        let pool = Cluster::get()?.pool(&spec.pool)?;
        lease::break_leases(&pool, &spec.head_object())
    }

    /// Who holds the device's lease now.
    pub fn holders(&self) -> Result<Vec<lease::Locker>, RadosError> {
        lease::holders(&self.pool, &format!("{HEAD_PREFIX}{}", self.name_part()))
    }

    fn name_part(&self) -> &str {
        self.spec.rsplit('/').next().unwrap_or("")
    }

    fn api(&self) -> &'static Api {
        self.pool.api()
    }

    fn data_name(&self, objno: u64) -> ObjName {
        let mut name = ObjName { buf: [0; 48] };
        let mut w = &mut name.buf[..47];
        write!(w, "zeta_data.{:016x}.{objno:016x}", self.geometry.id)
            .expect("the name fits: 10 + 16 + 1 + 16 bytes");
        name
    }

    /// The object parts of `len` bytes at `offset`: (object number, offset in it, length).
    fn parts(&self, offset: u64, len: usize) -> impl Iterator<Item = (u64, u64, usize)> {
        let os = self.geometry.object_size;
        let end = offset + len as u64;
        let mut at = offset;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let (objno, in_obj) = (at / os, at % os);
            let n = (os - in_obj).min(end - at);
            at += n;
            Some((objno, in_obj, n as usize))
        })
    }

    fn err(&self, what: &str, errno: i32) -> VdevError {
        VdevError::Io {
            path: self.spec.clone(),
            source: io::Error::new(
                io::Error::from_raw_os_error(errno).kind(),
                format!("{what}: {}", io::Error::from_raw_os_error(errno)),
            ),
        }
    }

    fn writable(&self) -> Result<(), VdevError> {
        if self.access != Access::Owner {
            return Err(self.err("opened for reading only", libc::EROFS));
        }
        if let Some(Err(why)) = self.lease.as_ref().map(Lease::check) {
            return Err(VdevError::Io {
                path: self.spec.clone(),
                source: io::Error::other(format!("not written: {why}")),
            });
        }
        Ok(())
    }

    /// Waits for a free slot among the requests in flight and takes it.
    fn take_slot(&self) {
        let mut n = self.in_flight.count.lock();
        while *n >= MAX_IN_FLIGHT {
            self.in_flight.changed.wait(&mut n);
        }
        *n += 1;
    }

    /// A completion whose callback gives back the slot `take_slot` took and notes a
    /// failure; it holds a reference to the shared state until then.
    fn tracked_completion(&self, ignore_enoent: bool) -> Result<Completion, VdevError> {
        let arg = Arc::into_raw(self.in_flight.clone()) as *mut c_void;
        let cb: extern "C" fn(Completion, *mut c_void) =
            if ignore_enoent { removed } else { written };
        let mut c: Completion = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the callback is an `extern "C"` fn of the prototype
        // librados calls (`rados_callback_t`), and `arg` is the reference it takes back.
        let ret = unsafe { (self.api().aio_create_completion2)(arg, cb as *mut c_void, &mut c) };
        if ret < 0 {
            // SAFETY: the reference made above, never handed to librados.
            drop(unsafe { Arc::from_raw(arg as *const InFlight) });
            self.give_back_slot();
            return Err(self.err("creating a completion", -ret));
        }
        Ok(c)
    }

    fn give_back_slot(&self) {
        let mut n = self.in_flight.count.lock();
        *n -= 1;
        self.in_flight.changed.notify_all();
    }

    /// Sends one object's part of a write; it completes on its own.
    fn submit_write(&self, objno: u64, in_obj: u64, data: &[u8]) -> Result<(), VdevError> {
        self.take_slot();
        let c = self.tracked_completion(false)?;
        let name = self.data_name(objno);
        // SAFETY: the name is NUL-terminated, `data` is valid for its length and librados
        // copies it before returning (the C API's `rados_aio_write` builds its own buffer).
        let ret = unsafe {
            (self.api().aio_write)(
                self.pool.ioctx(),
                name.ptr(),
                c,
                data.as_ptr() as *const c_char,
                data.len(),
                in_obj,
            )
        };
        if ret < 0 {
            // Not submitted: the callback will not run, so do its work here.
            // SAFETY: the completion made above, not handed to librados.
            unsafe { (self.api().aio_release)(c) };
            // SAFETY: the reference `tracked_completion` made for the callback.
            drop(unsafe { Arc::from_raw(Arc::as_ptr(&self.in_flight)) });
            self.give_back_slot();
            return Err(self.err("sending a write", -ret));
        }
        Ok(())
    }

    /// Reads or durably writes every part at once and waits for them all.
    fn many<'a>(&self, parts: Vec<Part<'a>>) -> Result<(), VdevError> {
        let api = self.api();
        let mut sent = Waiting {
            api,
            items: Vec::with_capacity(parts.len()),
        };
        let mut first_err = None;
        for part in parts {
            let mut c: Completion = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; no callbacks.
            let ret = unsafe {
                (api.aio_create_completion2)(std::ptr::null_mut(), std::ptr::null_mut(), &mut c)
            };
            if ret < 0 {
                first_err = Some(self.err("creating a completion", -ret));
                break;
            }
            let name = self.data_name(part.objno);
            // SAFETY: the name is NUL-terminated; a read's buffer stays borrowed (and so
            // valid) until `sent` has waited for its completion, on every path out of here,
            // unwinding included (`Waiting::drop`); a write's bytes are copied at once.
            let ret = unsafe {
                match &part.buf {
                    PartBuf::Read(b) => (api.aio_read)(
                        self.pool.ioctx(),
                        name.ptr(),
                        c,
                        b.as_ptr() as *mut c_char,
                        b.len(),
                        part.in_obj,
                    ),
                    PartBuf::Write(b) => (api.aio_write)(
                        self.pool.ioctx(),
                        name.ptr(),
                        c,
                        b.as_ptr() as *const c_char,
                        b.len(),
                        part.in_obj,
                    ),
                }
            };
            if ret < 0 {
                // SAFETY: never handed to librados.
                unsafe { (api.aio_release)(c) };
                first_err = Some(self.err("sending a request", -ret));
                break;
            }
            sent.items.push((c, part));
        }
        for (ret, part) in sent.wait_all() {
            match (ret, part.buf) {
                // A short read: the object ends before the part does.
                (n, PartBuf::Read(b)) if n >= 0 => {
                    let read = (n as usize).min(b.len());
                    b[read..].fill(0)
                }
                // No such object: never written, or discarded.
                (n, PartBuf::Read(b)) if n == -libc::ENOENT => b.fill(0),
                (n, PartBuf::Write(_)) if n >= 0 => {}
                (n, buf) => {
                    let what = match buf {
                        PartBuf::Read(_) => "reading",
                        PartBuf::Write(_) => "writing",
                    };
                    first_err.get_or_insert_with(|| {
                        self.err(&format!("{what} object {:x}", part.objno), -n)
                    });
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Waits until every request in flight has completed; the first failure since the last
    /// flush that reported one.
    fn drain(&self) -> Result<(), VdevError> {
        let mut n = self.in_flight.count.lock();
        while *n > 0 {
            self.in_flight.changed.wait(&mut n);
        }
        drop(n);
        match self.in_flight.failed.lock().take() {
            None => Ok(()),
            Some(ret) => Err(self.err("a write in flight failed", -ret)),
        }
    }
}

/// One object's part of a read or a durable write.
struct Part<'a> {
    objno: u64,
    in_obj: u64,
    buf: PartBuf<'a>,
}

enum PartBuf<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

/// Requests sent and not yet waited for; waits for them when dropped, so no borrowed read
/// buffer is given back while librados may still write into it.
struct Waiting<'a> {
    api: &'static Api,
    items: Vec<(Completion, Part<'a>)>,
}

impl<'a> Waiting<'a> {
    fn wait_all(&mut self) -> Vec<(i32, Part<'a>)> {
        let api = self.api;
        self.items
            .drain(..)
            .map(|(c, part)| {
                // SAFETY: a completion of a request sent, waited for and released once.
                let ret = unsafe {
                    (api.aio_wait_for_complete)(c);
                    let r = (api.aio_get_return_value)(c);
                    (api.aio_release)(c);
                    r
                };
                (ret, part)
            })
            .collect()
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.wait_all();
    }
}

/// librados's callback for a write (`rados_callback_t`): notes a failure, gives back the
/// slot. Runs on a librados thread; does nothing that could panic.
extern "C" fn written(c: Completion, arg: *mut c_void) {
    complete(c, arg, false)
}

/// As `written`, for a removal: an object that was not there is no failure.
extern "C" fn removed(c: Completion, arg: *mut c_void) {
    complete(c, arg, true)
}

fn complete(c: Completion, arg: *mut c_void, ignore_enoent: bool) {
    // SAFETY: `arg` is the reference `tracked_completion` made for this callback, taken
    // back exactly once, here.
    let state = unsafe { Arc::from_raw(arg as *const InFlight) };
    if let Ok(api) = ffi::api() {
        // SAFETY: the completion this callback is for; librados keeps its own reference
        // until the callback returns, so releasing ours here is allowed.
        let ret = unsafe {
            let r = (api.aio_get_return_value)(c);
            (api.aio_release)(c);
            r
        };
        if ret < 0 && !(ignore_enoent && ret == -libc::ENOENT) {
            state.failed.lock().get_or_insert(ret);
        }
    }
    let mut n = state.count.lock();
    *n -= 1;
    state.changed.notify_all();
}

fn read_geometry(pool: &IoPool, spec: &Spec) -> Result<Geometry, RadosError> {
    let head = cstr(&spec.head_object());
    let get = |attr: &str| -> Result<String, RadosError> {
        let name = cstr(attr);
        let mut buf = [0u8; 64];
        // SAFETY: the buffer is valid for its length; librados writes at most that much.
        let ret = unsafe {
            (pool.api().getxattr)(
                pool.ioctx(),
                head.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr() as *mut c_char,
                buf.len(),
            )
        };
        let n = check(|| format!("{spec}: reading {attr}"), ret as i64)? as usize;
        Ok(String::from_utf8_lossy(&buf[..n.min(buf.len())]).into_owned())
    };
    let version = get(XATTR_VERSION)?;
    let bad =
        |what: &str| RadosError::other(spec.to_string(), format!("damaged head object: {what}"));
    if version != VERSION {
        return Err(RadosError::other(
            spec.to_string(),
            format!("head object of version {version}: this zeta knows version {VERSION}"),
        ));
    }
    let size_bytes: u64 = get(XATTR_SIZE)?.parse().map_err(|_| bad("size"))?;
    let object_size: u64 = get(XATTR_OBJECT_SIZE)?
        .parse()
        .map_err(|_| bad("object size"))?;
    let id = u64::from_str_radix(&get(XATTR_ID)?, 16).map_err(|_| bad("id"))?;
    if !object_size.is_power_of_two() || !OBJECT_SIZES.contains(&object_size) {
        return Err(bad("object size out of range"));
    }
    Ok(Geometry {
        size_bytes,
        object_size,
        id,
    })
}

impl BlockDevice for RadosDevice {
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> Result<(), VdevError> {
        self.read_vectored_at(&mut [buf], offset_bytes)
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> Result<(), VdevError> {
        zeta_core::vdev::device::check_range(self, offset_bytes, buf.len())?;
        self.writable()?;
        let mut done = 0;
        for (objno, in_obj, n) in self.parts(offset_bytes, buf.len()) {
            self.submit_write(objno, in_obj, &buf[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset_bytes: u64) -> Result<(), VdevError> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        zeta_core::vdev::device::check_range(self, offset_bytes, total)?;
        let mut parts = Vec::new();
        let mut at = offset_bytes;
        for b in bufs.iter_mut() {
            let len = b.len();
            let mut rest: &mut [u8] = b;
            for (objno, in_obj, n) in self.parts(at, len) {
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n);
                rest = tail;
                parts.push(Part {
                    objno,
                    in_obj,
                    buf: PartBuf::Read(piece),
                });
            }
            at += len as u64;
        }
        self.many(parts)
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset_bytes: u64) -> Result<(), VdevError> {
        let mut at = offset_bytes;
        for b in bufs {
            self.write_at(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), VdevError> {
        if self.access != Access::Owner {
            return Ok(());
        }
        self.drain()
    }

    fn write_durable(&self, buf: &[u8], offset_bytes: u64) -> Result<(), VdevError> {
        zeta_core::vdev::device::check_range(self, offset_bytes, buf.len())?;
        self.writable()?;
        let mut parts = Vec::new();
        let mut done = 0;
        for (objno, in_obj, n) in self.parts(offset_bytes, buf.len()) {
            parts.push(Part {
                objno,
                in_obj,
                buf: PartBuf::Write(&buf[done..done + n]),
            });
            done += n;
        }
        self.many(parts)
    }

    /// Removes the objects the range covers whole; parts of objects stay as they are.
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VdevError> {
        zeta_core::vdev::device::check_range(self, offset_bytes, len_bytes as usize)?;
        self.writable()?;
        let os = self.geometry.object_size;
        let first = offset_bytes.div_ceil(os);
        let end = (offset_bytes + len_bytes) / os;
        for objno in first..end {
            self.take_slot();
            let c = self.tracked_completion(true)?;
            let name = self.data_name(objno);
            // SAFETY: a NUL-terminated name; the completion's callback gives the slot back.
            let ret = unsafe { (self.api().aio_remove)(self.pool.ioctx(), name.ptr(), c) };
            if ret < 0 {
                // SAFETY: never handed to librados; the callback's reference is dropped.
                unsafe { (self.api().aio_release)(c) };
                // SAFETY: the reference `tracked_completion` made for the callback.
                drop(unsafe { Arc::from_raw(Arc::as_ptr(&self.in_flight)) });
                self.give_back_slot();
                return Err(self.err("removing an object", -ret));
            }
        }
        Ok(())
    }

    fn len_bytes(&self) -> u64 {
        self.geometry.size_bytes
    }

    fn name(&self) -> &str {
        &self.spec
    }

    fn read_only(&self) -> bool {
        self.access != Access::Owner
    }
}

impl Drop for RadosDevice {
    fn drop(&mut self) {
        // Every callback holds a reference to `in_flight`; waiting here keeps requests from
        // outliving the device's lease, which drops after this.
        let mut n = self.in_flight.count.lock();
        while *n > 0 {
            if self
                .in_flight
                .changed
                .wait_for(&mut n, Duration::from_secs(60))
                .timed_out()
            {
                break;
            }
        }
    }
}
