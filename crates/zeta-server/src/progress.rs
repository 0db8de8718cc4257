//! How a long copy (`vol put`, `vol get`) shows how far it got and learns that it should
//! stop: on this terminal, a bar on stderr (bytes, rate, ETA) and Ctrl-C; in a server
//! running the copy for a control client, progress lines on the client's socket, where a
//! write that fails (the client is gone: its user pressed Ctrl-C) stops the copy.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

/// Copies smaller than this show no bar: they are over before one would tell anything.
pub const BAR_MIN_BYTES: u64 = 256 << 20;
/// How often a server tells its client how far a copy got.
const REMOTE_EVERY: Duration = Duration::from_millis(100);

/// One copy's progress.
pub trait Progress {
    /// `done` bytes of the copy are done; false: stop now.
    fn advance(&mut self, done: u64) -> bool;
}

/// Where a command's copies report to.
#[derive(Clone, Copy)]
pub enum Reporter<'a> {
    /// This process's terminal.
    Local,
    /// A control client, over its socket.
    Remote(&'a UnixStream),
}

impl<'a> Reporter<'a> {
    /// Starts reporting a copy of `total` bytes, described as `what`.
    pub fn start(self, what: &str, total: u64) -> Box<dyn Progress + 'a> {
        match self {
            Reporter::Local => Box::new(Local::new(what, total)),
            Reporter::Remote(conn) => Box::new(Remote {
                conn,
                total,
                last: Instant::now(),
            }),
        }
    }
}

/// A bar on stderr, drawn only on a terminal and for large copies, and Ctrl-C caught for
/// as long as the copy runs.
pub struct Local {
    bar: Option<ProgressBar>,
    stop: Arc<AtomicBool>,
    signal: Option<signal_hook::SigId>,
}

impl Local {
    pub fn new(what: &str, total: u64) -> Local {
        let stop = Arc::new(AtomicBool::new(false));
        let signal = signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone()).ok();
        Local {
            bar: (total >= BAR_MIN_BYTES).then(|| bar(what, total)),
            stop,
            signal,
        }
    }

    /// Whether Ctrl-C came.
    pub fn interrupted(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn set(&self, done: u64) {
        if let Some(b) = &self.bar {
            b.set_position(done);
        }
    }
}

/// A bar of `total` bytes on stderr (hidden where stderr is no terminal).
pub fn bar(what: &str, total: u64) -> ProgressBar {
    let b = ProgressBar::new(total);
    b.set_style(
        ProgressStyle::with_template(
            "{msg} {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .expect("template parses"),
    );
    b.set_message(what.to_string());
    b
}

impl Progress for Local {
    fn advance(&mut self, done: u64) -> bool {
        self.set(done);
        !self.interrupted()
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        if let Some(id) = self.signal.take() {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Progress lines `{"progress": done, "total": n}` on a control client's socket.
struct Remote<'a> {
    conn: &'a UnixStream,
    total: u64,
    last: Instant,
}

impl Progress for Remote<'_> {
    fn advance(&mut self, done: u64) -> bool {
        if self.last.elapsed() < REMOTE_EVERY && done < self.total {
            return true;
        }
        self.last = Instant::now();
        let mut line = json!({"progress": done, "total": self.total}).to_string();
        line.push('\n');
        let mut conn = self.conn;
        conn.write_all(line.as_bytes()).is_ok()
    }
}
