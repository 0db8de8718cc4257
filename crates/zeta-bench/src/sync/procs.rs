//! Child processes of `zeta bench sync`: its temporary directory, and guards that stop each
//! child on every way out.

use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use super::{check_stop, START_TIMEOUT, STOP_GRACE};
use zeta_server::{usage, Result};

/// The temporary directory of the run; removed when dropped.
pub(crate) struct WorkDir(pub(crate) PathBuf);

impl WorkDir {
    pub(crate) fn create(path: &Path) -> Result<WorkDir> {
        std::fs::create_dir(path).map_err(|e| zeta_server::Error::io(path, e))?;
        Ok(WorkDir(path.to_path_buf()))
    }

    /// A fresh directory for one measurement (short names: a pool's control socket lives
    /// under it, and Unix socket paths are limited to 108 bytes).
    pub(super) fn sub(&self, seq: usize) -> Result<WorkDir> {
        WorkDir::create(&self.0.join(format!("m{seq}")))
    }
}

/// A child process that is stopped (SIGTERM, then SIGKILL after `STOP_GRACE`) and reaped
/// whenever this is dropped, so no way out of the bench leaves one running.
pub(crate) struct ChildGuard {
    child: Option<Child>,
    name: &'static str,
    pub(crate) log: PathBuf,
}

impl ChildGuard {
    /// Starts `cmd` with stdout and stderr going to `log`.
    pub(crate) fn spawn(cmd: &mut Command, name: &'static str, log: PathBuf) -> Result<ChildGuard> {
        let out = File::create(&log).map_err(|e| zeta_server::Error::io(&log, e))?;
        let err = out
            .try_clone()
            .map_err(|e| zeta_server::Error::io(&log, e))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| zeta_server::Error::io(Path::new(name), e))?;
        Ok(ChildGuard {
            child: Some(child),
            name,
            log,
        })
    }

    /// The child's process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(crate) fn exited(&mut self) -> Result<Option<ExitStatus>> {
        let c = self.child.as_mut().expect("child present until stopped");
        c.try_wait()
            .map_err(|e| zeta_server::Error::io(Path::new(self.name), e))
    }

    /// The last line the child wrote, for error messages.
    pub(crate) fn last_words(&self) -> String {
        last_line(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    pub(super) fn stop(mut self) -> Result<ExitStatus> {
        let mut c = self.child.take().expect("child present until stopped");
        terminate(&mut c).map_err(|e| zeta_server::Error::io(Path::new(self.name), e))
    }

    /// Waits for the child to exit by itself, up to `limit`; then stops it and fails.
    pub(super) fn wait(
        mut self,
        limit: Duration,
        stop: &AtomicBool,
    ) -> Result<(ExitStatus, String)> {
        let t = Instant::now();
        loop {
            if let Some(st) = self.exited()? {
                self.child = None;
                return Ok((st, self.last_words()));
            }
            check_stop(stop)?;
            if t.elapsed() > limit {
                return Err(usage(format!(
                    "{} did not finish within {} s",
                    self.name,
                    limit.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

pub(super) fn terminate(child: &mut Child) -> std::io::Result<ExitStatus> {
    if let Some(st) = child.try_wait()? {
        return Ok(st);
    }
    let pid = libc::pid_t::try_from(child.id()).expect("a pid fits in pid_t");
    // SAFETY: kill(2) takes two integers and touches no memory of this process. The pid is
    // that of our own child, not yet reaped (only `wait`/`try_wait` reap it, and try_wait just
    // reported it running), so even if it exits now it stays a zombie holding its pid and the
    // signal cannot reach a recycled process.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let t = Instant::now();
    while t.elapsed() < STOP_GRACE {
        if let Some(st) = child.try_wait()? {
            return Ok(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill()?;
    child.wait()
}

pub(crate) fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("(no output)")
        .to_string()
}

/// Polls until `addr` accepts a TCP connection, failing if the server exits first.
pub(crate) fn wait_accepting(
    server: &mut ChildGuard,
    addr: SocketAddr,
    stop: &AtomicBool,
) -> Result<()> {
    let t = Instant::now();
    loop {
        if let Some(st) = server.exited()? {
            return Err(usage(format!(
                "{} exited ({st}) before accepting connections: {}",
                server.name,
                server.last_words()
            )));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
            return Ok(());
        }
        check_stop(stop)?;
        if t.elapsed() > START_TIMEOUT {
            return Err(usage(format!(
                "{} did not accept connections on {addr} within {} s",
                server.name,
                START_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = terminate(&mut c);
        }
    }
}
