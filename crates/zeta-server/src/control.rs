//! The control socket: while `zeta serve` holds a pool (its devices are locked), the admin
//! commands of other `zeta` processes reach it here instead of failing on the lock.
//!
//! Each served pool listens on `$ZETA_HOME/run/POOL.sock`, a Unix socket of mode 0600 in a
//! directory of mode 0700, so only its owner (and root) can connect. A client sends one JSON
//! line and reads one JSON line back:
//!
//! - `{"op": "status"}` → `{"ok": true, "value": <pool status --json object>}`
//! - `{"op": "sync"}` commits a txg, and the txgs that make what was freed reusable →
//!   `{"ok": true}`
//! - `{"op": "iostat"}` → `{"ok": true, "value": <pool iostat --json object>}`
//! - `{"op": "arcstat"}` → `{"ok": true, "value": <pool arcstat --json object>}`
//! - `{"op": "map"}` → `{"ok": true, "value": <pool map --json object>}`
//! - `{"op": "volumes"}` → `{"ok": true, "value": [<vol list --json rows>]}`
//! - `{"op": "scrub", "stop": false|true}` starts or cancels a scrub → `{"ok": true}`
//! - `{"op": "clear"}` zeroes the pool's error counters → `{"ok": true}`
//! - `{"op": "offline", "device": path, "offline": bool}` takes a device offline or brings
//!   it back (which starts a resilver) → `{"ok": true}`
//! - `{"op": "inject", "device", "fail_reads", "fail_writes", "full", "vanished"}` sets injected
//!   faults; `{"op": "corrupt", "device", "count", "seed"}` corrupts allocated sectors →
//!   `{"ok": true, "value": sectors}`
//! - `{"op": "replace", "old": path, "new": path, "force": bool}` replaces a device in place
//!   and starts its rebuild → `{"ok": true}`
//! - `{"op": "add_log", "vdevs": ["log", path | "mirror", ...], "size": bytes|null, "force":
//!   bool}` adds log devices → `{"ok": true, "value": [vdev ids]}`; `{"op": "remove",
//!   "device": path}` removes a log device → `{"ok": true, "value": [paths removed]}`
//! - `{"op": "run", "argv": [...], "cwd": "/dir"}` runs a `zeta vol ...`, `zeta get` or `zeta set` command in the server
//!   against the served pool (relative paths resolved against `cwd`) →
//!   `{"ok": true, "stdout": "..."}`
//!
//! and on failure `{"ok": false, "error": "one line"}`. Before the reply of a `run` that
//! copies (`vol put`, `vol get`), progress lines `{"progress": bytes, "total": bytes}`; a
//! client that goes away stops the copy at the next one. A socket left behind by a server that
//! died is detected (nobody accepts) and replaced by the next server.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};

use crate::progress::Local;
use crate::state::Home;
use crate::{usage, Error, Result};
use zeta_core::dsl::Pool;

/// Longest request accepted; a request is a command line, not data.
const MAX_REQUEST: u64 = 64 * 1024;
/// How long a client waits for a server's reply (a `vol put` of a large file takes a while).
const REPLY_TIMEOUT: Duration = Duration::from_secs(3600);
/// How often a client waiting for a reply looks for Ctrl-C.
const POLL: Duration = Duration::from_millis(200);

pub fn run_dir(home: &Home) -> PathBuf {
    home.dir.join("run")
}

pub fn socket_path(home: &Home, pool: &str) -> PathBuf {
    run_dir(home).join(format!("{pool}.sock"))
}

/// A connection to the server of `pool`, if one is running for this state directory.
pub fn connect(home: &Home, pool: &str) -> Option<UnixStream> {
    let s = UnixStream::connect(socket_path(home, pool)).ok()?;
    s.set_read_timeout(Some(REPLY_TIMEOUT)).ok()?;
    Some(s)
}

fn call(mut s: UnixStream, req: Value, pool: &str) -> Result<Value> {
    let fail = |why: String| {
        usage(format!(
            "pool '{pool}' is served by a running `zeta serve`, and asking it failed: {why}"
        ))
    };
    let mut line = serde_json::to_vec(&req).expect("request serializes");
    line.push(b'\n');
    s.write_all(&line).map_err(|e| fail(e.to_string()))?;
    // Short reads, so that Ctrl-C during a long copy is seen at once.
    s.set_read_timeout(Some(POLL))
        .map_err(|e| fail(e.to_string()))?;
    let started = std::time::Instant::now();
    let mut reader = BufReader::new(s);
    let mut reply = String::new();
    // Created at the first progress line of a copy the server runs for us.
    let mut copy: Option<(Local, u64, u64)> = None;
    let interrupted = |copy: &Option<(Local, u64, u64)>| match copy {
        Some((bar, done, total)) if bar.interrupted() => Some(usage(format!(
            "interrupted: the server had copied {} ({done} of {total} bytes); it stops the \
             copy where it is",
            crate::fmt::human(*done)
        ))),
        _ => None,
    };
    loop {
        match reader.read_line(&mut reply) {
            Ok(0) => return Err(fail("the server closed the connection".into())),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if let Some(e) = interrupted(&copy) {
                    return Err(e);
                }
                if started.elapsed() > REPLY_TIMEOUT {
                    return Err(fail("no reply".into()));
                }
                continue;
            }
            Err(e) => return Err(fail(e.to_string())),
        }
        if !reply.ends_with('\n') {
            continue;
        }
        let v: Value =
            serde_json::from_str(&reply).map_err(|e| fail(format!("bad reply ({e})")))?;
        reply.clear();
        if let Some(done) = v["progress"].as_u64() {
            let total = v["total"].as_u64().unwrap_or(done);
            let (bar, d, _) = copy.get_or_insert_with(|| (Local::new("copying", total), 0, total));
            bar.set(done);
            *d = done;
            if let Some(e) = interrupted(&copy) {
                return Err(e);
            }
            continue;
        }
        return if v["ok"] == json!(true) {
            Ok(v)
        } else {
            Err(usage(
                v["error"]
                    .as_str()
                    .unwrap_or("the server gave no reason")
                    .to_string(),
            ))
        };
    }
}

/// Asks the server of `pool` for its `pool status --json` object.
pub fn remote_status(s: UnixStream, pool: &str) -> Result<Value> {
    Ok(call(s, json!({"op": "status"}), pool)?["value"].take())
}

/// Asks the server of `pool` for its `pool iostat --json` object.
pub fn remote_iostat(s: UnixStream, pool: &str) -> Result<Value> {
    Ok(call(s, json!({"op": "iostat"}), pool)?["value"].take())
}

/// Asks the server of `pool` for its block cache's figures (`pool arcstat --json`).
pub fn remote_arcstat(s: UnixStream, pool: &str) -> Result<Value> {
    Ok(call(s, json!({"op": "arcstat"}), pool)?["value"].take())
}

/// Asks the server of `pool` for its metaslab map (`pool map --json`).
pub fn remote_map(s: UnixStream, pool: &str) -> Result<zeta_core::dsl::PoolMap> {
    let v = call(s, json!({"op": "map"}), pool)?["value"].take();
    serde_json::from_value(v)
        .map_err(|e| usage(format!("the server of '{pool}' sent a bad map: {e}")))
}

/// Has the server of `pool` commit a txg.
pub fn remote_sync(s: UnixStream, pool: &str) -> Result<()> {
    call(s, json!({"op": "sync"}), pool).map(|_| ())
}

/// Asks the server of `pool` for its volume rows.
pub fn remote_volumes(s: UnixStream, pool: &str) -> Result<Vec<Value>> {
    let v = call(s, json!({"op": "volumes"}), pool)?;
    Ok(v["value"].as_array().cloned().unwrap_or_default())
}

/// The volumes and snapshots of `pool` with their space (`zeta list`), from its server.
pub fn remote_datasets(s: UnixStream, pool: &str) -> Result<Vec<Value>> {
    let v = call(s, json!({"op": "datasets"}), pool)?;
    Ok(v["value"].as_array().cloned().unwrap_or_default())
}

/// Starts (or with `stop`, cancels) a scrub in the server of `pool`.
pub fn remote_scrub(s: UnixStream, pool: &str, stop: bool) -> Result<()> {
    call(s, json!({"op": "scrub", "stop": stop}), pool).map(|_| ())
}

/// Takes a device of `pool` offline or brings it online, in its server.
pub fn remote_offline(s: UnixStream, pool: &str, device: &str, offline: bool) -> Result<()> {
    call(
        s,
        json!({"op": "offline", "device": device, "offline": offline}),
        pool,
    )
    .map(|_| ())
}

/// Sets the injected faults of a device of `pool` in its server.
pub fn remote_inject(
    s: UnixStream,
    pool: &str,
    device: &str,
    f: &zeta_core::dsl::Injection,
) -> Result<()> {
    let req = json!({"op": "inject", "device": device, "fail_reads": f.fail_reads,
                     "fail_writes": f.fail_writes, "full": f.full, "vanished": f.vanished});
    call(s, req, pool).map(|_| ())
}

/// Corrupts allocated sectors of a device of `pool` in its server; returns how many.
pub fn remote_corrupt(
    s: UnixStream,
    pool: &str,
    device: &str,
    n: usize,
    seed: u64,
) -> Result<usize> {
    let req = json!({"op": "corrupt", "device": device, "count": n, "seed": seed});
    Ok(call(s, req, pool)?["value"].as_u64().unwrap_or(0) as usize)
}

/// Replaces device `old` of `pool` by `new` in its server, which rebuilds it while serving.
pub fn remote_replace(s: UnixStream, pool: &str, old: &str, new: &Path, force: bool) -> Result<()> {
    let req = json!({"op": "replace", "old": old, "new": new, "force": force});
    call(s, req, pool).map(|_| ())
}

/// Adds log devices (`words`: `log ...` with absolute paths) to `pool` in its server.
pub fn remote_add_log(
    s: UnixStream,
    pool: &str,
    words: &[String],
    size: Option<u64>,
    force: bool,
) -> Result<Vec<u32>> {
    let req = json!({"op": "add_log", "vdevs": words, "size": size, "force": force});
    let v = call(s, req, pool)?;
    Ok(v["value"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as u32)
                .collect()
        })
        .unwrap_or_default())
}

/// Removes a log device of `pool` in its server; returns the paths removed.
pub fn remote_remove(s: UnixStream, pool: &str, device: &str) -> Result<Vec<String>> {
    let v = call(s, json!({"op": "remove", "device": device}), pool)?;
    Ok(v["value"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default())
}

/// Zeroes the error counters of `pool` in its server.
pub fn remote_clear(s: UnixStream, pool: &str) -> Result<()> {
    call(s, json!({"op": "clear"}), pool).map(|_| ())
}

/// Runs this process's command line in the server of `pool` and prints what it printed.
pub fn remote_run(s: UnixStream, pool: &str) -> Result<()> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let cwd = std::env::current_dir().map_err(|e| Error::io(Path::new("."), e))?;
    let v = call(s, json!({"op": "run", "argv": argv, "cwd": cwd}), pool)?;
    print!("{}", v["stdout"].as_str().unwrap_or(""));
    Ok(())
}

/// How a server answers one request on a pool's control socket: the command line's own
/// operations (it knows `pool status --json`, `zeta vol`, `zeta get` and `zeta set`), given the state directory of the
/// served pool, the request, and the connection (for progress lines).
pub type Answer = Arc<dyn Fn(&Home, &Value, &UnixStream) -> Result<Value> + Send + Sync>;

/// The control sockets of a running server, one per pool.
pub struct ControlServer {
    stop: Arc<AtomicBool>,
    sockets: Vec<(PathBuf, JoinHandle<()>)>,
}

impl ControlServer {
    /// Listens for admin commands on behalf of `pools`. A pool whose socket cannot be made
    /// is still served over NBD; the reason is printed.
    pub fn start(home: &Home, pools: &[Arc<Pool>], answer: Answer) -> ControlServer {
        let stop = Arc::new(AtomicBool::new(false));
        let mut sockets = Vec::new();
        for pool in pools {
            match listen(home, &pool.name) {
                Ok((path, listener)) => {
                    let served = home.serving(vec![pool.clone()]);
                    let stop = stop.clone();
                    let answer = answer.clone();
                    let handle = std::thread::Builder::new()
                        .name(format!("control-{}", pool.name))
                        .spawn(move || accept_loop(listener, served, stop, answer))
                        .expect("spawn control thread");
                    sockets.push((path, handle));
                }
                Err(e) => eprintln!(
                    "zeta: no control socket for pool '{}' ({e}); admin commands cannot reach it \
                     while it is served",
                    pool.name
                ),
            }
        }
        ControlServer { stop, sockets }
    }

    /// Stops accepting and removes the sockets. Commands already running finish first.
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::SeqCst);
        for (path, handle) in self.sockets {
            // Wake the accept loop so it sees the flag. If the socket's file is gone (someone
            // cleaned the run directory), nothing can wake it: leave the thread to end with
            // the process rather than wait for it forever.
            if UnixStream::connect(&path).is_ok() {
                let _ = handle.join();
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

fn listen(home: &Home, pool: &str) -> Result<(PathBuf, UnixListener)> {
    let dir = run_dir(home);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| Error::io(&dir, e))?;
    let path = socket_path(home, pool);
    if path.exists() {
        if UnixStream::connect(&path).is_ok() {
            return Err(usage(format!(
                "{}: another server answers there",
                path.display()
            )));
        }
        // Left behind by a server that died: nobody listens.
        std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
    }
    let listener = UnixListener::bind(&path).map_err(|e| Error::io(&path, e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io(&path, e))?;
    Ok((path, listener))
}

fn accept_loop(listener: UnixListener, served: Home, stop: Arc<AtomicBool>, answer: Answer) {
    let served = Arc::new(served);
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(conn) = conn else { continue };
        let served = served.clone();
        let answer = answer.clone();
        // One thread per admin command: they are rare, and a slow `vol put` must not hold
        // up a `pool status`.
        let _ = std::thread::Builder::new()
            .name("control-cmd".into())
            .spawn(move || serve_one(conn, &served, &answer));
    }
}

fn serve_one(conn: UnixStream, home: &Home, answer: &Answer) {
    let mut line = String::new();
    let read = BufReader::new(conn.try_clone().expect("clone socket"))
        .take(MAX_REQUEST)
        .read_line(&mut line);
    let reply = match read {
        Ok(_) => match serde_json::from_str::<Value>(&line) {
            Ok(req) => answer(home, &req, &conn)
                .unwrap_or_else(|e| json!({"ok": false, "error": e.to_string()})),
            Err(e) => json!({"ok": false, "error": format!("malformed request: {e}")}),
        },
        Err(e) => json!({"ok": false, "error": format!("reading request: {e}")}),
    };
    let mut out = serde_json::to_vec(&reply).expect("reply serializes");
    out.push(b'\n');
    let mut conn = conn;
    let _ = conn.write_all(&out);
}

/// A request's string field `key`.
pub fn text<'a>(req: &'a Value, key: &str) -> Result<&'a str> {
    req[key]
        .as_str()
        .ok_or_else(|| usage(format!("request without {key}")))
}

/// A request's field `key`, a list of strings.
pub fn texts(req: &Value, key: &str) -> Result<Vec<String>> {
    req[key]
        .as_array()
        .ok_or_else(|| usage(format!("request without {key}")))?
        .iter()
        .map(|a| {
            a.as_str()
                .map(String::from)
                .ok_or_else(|| usage(format!("{key} holds a non-string")))
        })
        .collect()
}
