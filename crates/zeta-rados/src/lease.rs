//! One owner at a time: an exclusive RADOS lock (cls_lock) with a lease on a device's head
//! object, renewed by a heartbeat thread. Writes stop once the lease may have run out, so a
//! host that lost its lease (the cluster out of reach, or the lock broken) suspends its pool
//! instead of writing over a new owner's.
//!
//! A write is let through only while half a lease is left of the last renewal: a write
//! delayed in the network for longer than that could still land after a new owner took
//! over, which only Ceph's blocklisting (not used here yet) would stop.

use std::ffi::{c_char, CString};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::cluster::{check, cstr, IoPool, RadosError, Result};
use crate::ffi::LOCK_FLAG_RENEW;

/// The lock's name on the head object.
pub const LOCK_NAME: &str = "zeta.lease";

/// How long a lease runs without a renewal: `$ZETA_RADOS_LEASE_SECS`, else 20 s. A host that
/// dies holds its devices this long; a shorter lease renews more often.
pub fn lease_duration() -> Duration {
    let secs = std::env::var("ZETA_RADOS_LEASE_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&s| (2..=3600).contains(&s))
        .unwrap_or(20);
    Duration::from_secs(secs)
}

/// One holder of a lock, as `rados_list_lockers` tells (expired ones are not listed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locker {
    /// `client.N`.
    pub client: String,
    pub cookie: String,
    pub addr: String,
}

impl std::fmt::Display for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {}", self.client, self.addr)
    }
}

/// Who holds the lease on `object` now.
pub fn holders(pool: &IoPool, object: &str) -> Result<Vec<Locker>> {
    let api = pool.api();
    let (obj, name) = (cstr(object), cstr(LOCK_NAME));
    let mut lens = [0usize; 4];
    let mut bufs: [Vec<u8>; 4] = Default::default();
    let mut exclusive = 0;
    for _attempt in 0..4 {
        for (b, &l) in bufs.iter_mut().zip(&lens) {
            b.resize(l.max(1), 0);
        }
        let [tag, clients, cookies, addrs] = &mut bufs;
        let [tag_len, clients_len, cookies_len, addrs_len] = &mut lens;
        // SAFETY: each buffer is valid for the length passed beside it; librados writes at
        // most that many bytes and sets the lengths it needs on -ERANGE.
        let ret = unsafe {
            (api.list_lockers)(
                pool.ioctx(),
                obj.as_ptr(),
                name.as_ptr(),
                &mut exclusive,
                tag.as_mut_ptr() as *mut c_char,
                tag_len,
                clients.as_mut_ptr() as *mut c_char,
                clients_len,
                cookies.as_mut_ptr() as *mut c_char,
                cookies_len,
                addrs.as_mut_ptr() as *mut c_char,
                addrs_len,
            )
        };
        if ret == -(libc::ERANGE as isize) {
            continue;
        }
        if ret == -(libc::ENOENT as isize) {
            return Ok(Vec::new());
        }
        let n = check(|| format!("listing the lockers of {object}"), ret as i64)? as usize;
        let split = |b: &[u8], len: usize| -> Vec<String> {
            b[..len.min(b.len())]
                .split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        };
        let clients = split(&bufs[1], lens[1]);
        let cookies = split(&bufs[2], lens[2]);
        let addrs = split(&bufs[3], lens[3]);
        let at = |v: &[String], i: usize| v.get(i).cloned().unwrap_or_else(|| "?".into());
        return Ok((0..n)
            .map(|i| Locker {
                client: at(&clients, i),
                cookie: at(&cookies, i),
                addr: at(&addrs, i),
            })
            .collect());
    }
    Err(RadosError::other(
        format!("listing the lockers of {object}"),
        "the list kept growing",
    ))
}

struct State {
    pool: Arc<IoPool>,
    object: CString,
    cookie: CString,
    desc: CString,
    duration: Duration,
    /// Writes are let through until then.
    valid_until: Mutex<Instant>,
    /// Why the lease is gone for good (another owner took it, or the object went).
    lost: Mutex<Option<String>>,
    stop: Mutex<bool>,
    wake: Condvar,
}

impl State {
    /// Takes or renews the lock; on success the lease runs from `start`.
    fn lock(&self, renew: bool) -> i32 {
        let api = self.pool.api();
        let name = cstr(LOCK_NAME);
        let mut tv = libc::timeval {
            tv_sec: self.duration.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        // SAFETY: NUL-terminated strings and a timeval that outlive the call.
        unsafe {
            (api.lock_exclusive)(
                self.pool.ioctx(),
                self.object.as_ptr(),
                name.as_ptr(),
                self.cookie.as_ptr(),
                self.desc.as_ptr(),
                &mut tv,
                if renew { LOCK_FLAG_RENEW } else { 0 },
            )
        }
    }

    fn renewed(&self, start: Instant) {
        *self.valid_until.lock() = start + self.duration / 2;
    }
}

/// A lease held on one object; dropped, it stops renewing and unlocks.
pub struct Lease {
    state: Arc<State>,
    heartbeat: Option<JoinHandle<()>>,
}

impl Lease {
    /// Takes the lock on `object` for `spec` (the device, for messages), or says who holds it.
    pub fn take(pool: Arc<IoPool>, object: &str, spec: &str) -> Result<Lease> {
        let host = hostname();
        let state = Arc::new(State {
            object: cstr(object),
            cookie: cstr(&format!("{:016x}", rand::random::<u64>())),
            desc: cstr(&format!("zeta on {host}, pid {}", std::process::id())),
            duration: lease_duration(),
            valid_until: Mutex::new(Instant::now()),
            lost: Mutex::new(None),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            pool,
        });
        let start = Instant::now();
        let ret = state.lock(false);
        if ret == -libc::EBUSY {
            let who = holders(&state.pool, object).unwrap_or_default();
            return Err(RadosError::other(
                spec,
                format!(
                    "in use: {} holds its lease (a pool imported on another host, or by \
                     another process here); it lapses {} s after its holder stops renewing it",
                    if who.is_empty() {
                        "another client".to_string()
                    } else {
                        join(&who)
                    },
                    state.duration.as_secs()
                ),
            ));
        }
        check(|| format!("{spec}: taking its lease"), ret as i64)?;
        state.renewed(start);
        let beat = state.clone();
        let heartbeat = std::thread::Builder::new()
            .name("rados-lease".into())
            .spawn(move || heartbeat(&beat))
            .map_err(|e| RadosError::other(spec, format!("starting the lease thread: {e}")))?;
        Ok(Lease {
            state,
            heartbeat: Some(heartbeat),
        })
    }

    /// Whether a write may go out now; if not, why.
    pub fn check(&self) -> std::result::Result<(), String> {
        if let Some(why) = self.state.lost.lock().as_ref() {
            return Err(why.clone());
        }
        if Instant::now() >= *self.state.valid_until.lock() {
            return Err(
                "its lease could not be renewed in time (the Ceph cluster is out of \
                        reach); writes resume once it is"
                    .into(),
            );
        }
        Ok(())
    }
}

/// Renews the lease four times a lease until told to stop.
fn heartbeat(state: &State) {
    let period = state.duration / 4;
    loop {
        {
            let mut stop = state.stop.lock();
            if !*stop {
                state.wake.wait_for(&mut stop, period);
            }
            if *stop {
                return;
            }
        }
        let start = Instant::now();
        // A lease that ran out while the cluster was away but that no one took is taken
        // anew: nobody else can have written meanwhile.
        let ret = match state.lock(true) {
            r if r == -libc::ENOENT => state.lock(false),
            r => r,
        };
        match ret {
            0 => state.renewed(start),
            r if r == -libc::EBUSY => {
                let who = join(
                    &holders(&state.pool, &state.object.to_string_lossy()).unwrap_or_default(),
                );
                *state.lost.lock() = Some(format!("its lease was taken by another client ({who})"));
            }
            // Out of reach for now: writes stop once the lease is half gone; tried again.
            _ => {}
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        *self.state.stop.lock() = true;
        self.state.wake.notify_all();
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
        if self.state.lost.lock().is_none() {
            let api = self.state.pool.api();
            let name = cstr(LOCK_NAME);
            // SAFETY: NUL-terminated strings that outlive the call. Best effort: a lock left
            // behind lapses with its lease.
            unsafe {
                (api.unlock)(
                    self.state.pool.ioctx(),
                    self.state.object.as_ptr(),
                    name.as_ptr(),
                    self.state.cookie.as_ptr(),
                )
            };
        }
    }
}

fn join(lockers: &[Locker]) -> String {
    lockers
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Breaks every lease on `object`, alive or not: what an administrator does once sure the
/// holder is gone for good (the tests use it to play a second owner).
pub fn break_leases(pool: &IoPool, object: &str) -> Result<usize> {
    let lockers = holders(pool, object)?;
    let (obj, name) = (cstr(object), cstr(LOCK_NAME));
    for l in &lockers {
        let (client, cookie) = (cstr(&l.client), cstr(&l.cookie));
        // SAFETY: NUL-terminated strings that outlive the call.
        let ret = unsafe {
            (pool.api().break_lock)(
                pool.ioctx(),
                obj.as_ptr(),
                name.as_ptr(),
                client.as_ptr(),
                cookie.as_ptr(),
            )
        };
        if ret < 0 && ret != -libc::ENOENT {
            return Err(RadosError::from_ret(
                format!("breaking the lease of {object}"),
                ret as i64,
            ));
        }
    }
    Ok(lockers.len())
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it.
    let ret = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut c_char, buf.len() - 1) };
    if ret != 0 {
        return "an unknown host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
