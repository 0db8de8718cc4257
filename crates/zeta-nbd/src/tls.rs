//! TLS for NBD (`NBD_OPT_STARTTLS`): the server's credentials, the upgrade of a socket, and
//! the pump that carries a connection's transmission phase through TLS.
//!
//! OpenSSL (the `openssl` crate over the system's libssl), not rustls: the clients that speak
//! NBD over TLS (libnbd, qemu, nbd-client) use GnuTLS, and their pre-shared keys are TLS-PSK,
//! which rustls does not offer. OpenSSL takes both credential kinds through one code path.
//!
//! After the handshake the connection's requests are served as any other (`conn::serve`), on
//! one end of a socket pair; a pump thread moves bytes between the other end and the TLS
//! session. So `conn` and `replies` keep their one reader, their non-blocking sends and their
//! flusher, and know nothing of TLS.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use openssl::ssl::{
    ErrorCode, SslAcceptor, SslAcceptorBuilder, SslFiletype, SslMethod, SslStream, SslVerifyMode,
    SslVersion,
};

use super::admission::Deadline;

/// Whether clients may, or must, upgrade to TLS before anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    Off,
    /// STARTTLS is offered; clients may go without.
    On,
    /// Every option but STARTTLS (and ABORT) is refused with NBD_REP_ERR_TLS_REQD until the
    /// upgrade.
    Require,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}: {msg}")]
    Bad { path: String, msg: String },
    #[error("TLS setup: {0}")]
    Ssl(#[from] openssl::error::ErrorStack),
}

/// The server's TLS credentials, ready to accept sessions.
pub struct Tls {
    pub mode: TlsMode,
    acceptor: SslAcceptor,
    /// What the credentials are, for the server's banner.
    pub what: String,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tls({:?}, {})", self.mode, self.what)
    }
}

/// File names in a credentials directory, as nbdkit and qemu lay it out.
const CA_CERT: &str = "ca-cert.pem";
const SERVER_CERT: &str = "server-cert.pem";
const SERVER_KEY: &str = "server-key.pem";

impl Tls {
    /// X.509 from `dir`: `server-cert.pem` and `server-key.pem`; with `ca-cert.pem` there too,
    /// clients must present a certificate that CA signed.
    pub fn x509(mode: TlsMode, dir: &Path) -> Result<Tls, TlsError> {
        let mut b = base()?;
        let cert = dir.join(SERVER_CERT);
        let key = dir.join(SERVER_KEY);
        for p in [&cert, &key] {
            if !p.is_file() {
                return Err(TlsError::Bad {
                    path: p.display().to_string(),
                    msg: "missing (the directory needs server-cert.pem and server-key.pem)".into(),
                });
            }
        }
        let bad = |p: &PathBuf, e: openssl::error::ErrorStack| TlsError::Bad {
            path: p.display().to_string(),
            msg: e.to_string(),
        };
        b.set_certificate_chain_file(&cert)
            .map_err(|e| bad(&cert, e))?;
        b.set_private_key_file(&key, SslFiletype::PEM)
            .map_err(|e| bad(&key, e))?;
        b.check_private_key().map_err(|e| bad(&key, e))?;
        let ca = dir.join(CA_CERT);
        let verify = ca.is_file();
        if verify {
            b.set_ca_file(&ca).map_err(|e| bad(&ca, e))?;
            b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
        }
        Ok(Tls {
            mode,
            acceptor: b.build(),
            what: format!(
                "X.509 from {}{}",
                dir.display(),
                if verify {
                    ", client certificates verified"
                } else {
                    ""
                }
            ),
        })
    }

    /// Pre-shared keys from `file`, in psktool's format (one `username:hexkey` a line), as
    /// nbdkit and qemu read it.
    pub fn psk(mode: TlsMode, file: &Path) -> Result<Tls, TlsError> {
        let text = std::fs::read_to_string(file).map_err(|e| TlsError::Io {
            path: file.display().to_string(),
            source: e,
        })?;
        let keys = parse_psk_file(&text).map_err(|msg| TlsError::Bad {
            path: file.display().to_string(),
            msg,
        })?;
        let n = keys.len();
        let mut b = base()?;
        // TLS 1.3 takes the key as an external PSK (SHA-256 suites, with (EC)DHE, which is
        // what GnuTLS offers); TLS 1.2 clients get the PSK suites.
        b.set_cipher_list("ECDHE-PSK:DHE-PSK:PSK:!aNULL:!eNULL:!MD5:!RC4:!3DES")?;
        // An external PSK takes a SHA-256 suite; AES-GCM first, which AES-NI makes cheap
        // (GnuTLS otherwise settled on ChaCha20).
        b.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256")?;
        b.set_psk_server_callback(move |_ssl, identity, out| {
            let key = identity
                .and_then(|id| std::str::from_utf8(id).ok())
                .and_then(|id| keys.get(id));
            match key {
                Some(k) if k.len() <= out.len() => {
                    out[..k.len()].copy_from_slice(k);
                    Ok(k.len())
                }
                _ => Ok(0), // unknown user: the handshake fails
            }
        });
        Ok(Tls {
            mode,
            acceptor: b.build(),
            what: format!("pre-shared keys from {} ({n} users)", file.display()),
        })
    }

    /// Runs the TLS handshake on `s` (the client has just been told to start it).
    pub fn accept(&self, s: Deadline) -> io::Result<SslStream<Deadline>> {
        self.acceptor
            .accept(s)
            .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e.to_string()))
    }
}

/// The settings both credential kinds share: TLS 1.2 at least.
fn base() -> Result<SslAcceptorBuilder, TlsError> {
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls())?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    // Read as much of the socket as there is, not a record's header and then its body: two
    // system calls per 16K record otherwise.
    b.set_read_ahead(true);
    Ok(b)
}

/// `username:hexkey` lines (blank lines and `#` comments skipped) into keys by user.
pub fn parse_psk_file(text: &str) -> Result<HashMap<String, Vec<u8>>, String> {
    let mut keys = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((user, hex)) = line.split_once(':') else {
            return Err(format!("line {}: not username:hexkey", i + 1));
        };
        let key = decode_hex(hex)
            .filter(|k| !k.is_empty() && k.len() <= 256)
            .ok_or_else(|| format!("line {}: the key is not 1-256 bytes of hex", i + 1))?;
        if user.is_empty() || keys.insert(user.to_string(), key).is_some() {
            return Err(format!("line {}: empty or repeated username", i + 1));
        }
    }
    if keys.is_empty() {
        return Err("no keys".into());
    }
    Ok(keys)
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Plaintext moved at a time between the TLS session and the socket pair.
const PUMP_CHUNK_BYTES: usize = 256 << 10;

/// Carries bytes both ways between the TLS session `tls` (its socket made non-blocking here)
/// and `app`, the pump's end of the connection's socket pair, until both directions end. A
/// client that leaves its socket full for `write_timeout` is dropped, as on a plain socket.
pub fn pump(mut tls: SslStream<Deadline>, app: UnixStream, write_timeout: Duration) {
    if tls.get_ref().socket().set_nonblocking(true).is_err() || app.set_nonblocking(true).is_err() {
        return;
    }
    let mut app = app;
    let mut to_app = Chunk::default();
    let mut to_net = Chunk::default();
    let (mut net_done, mut app_done, mut app_shut) = (false, false, false);
    let mut buf = vec![0u8; PUMP_CHUNK_BYTES];
    loop {
        let mut w = Wants::default();
        let mut moved = false;
        // The client's requests, decrypted, to the connection's reader.
        if to_app.is_empty() && !net_done {
            match tls.ssl_read(&mut buf) {
                Ok(0) => net_done = true,
                Ok(n) => {
                    to_app.fill(&buf[..n]);
                    moved = true;
                }
                Err(e) => match e.code() {
                    ErrorCode::WANT_READ => w.net_read = true,
                    ErrorCode::WANT_WRITE => w.net_write = true,
                    _ => net_done = true, // close_notify, EOF, a reset or a bad record
                },
            }
        }
        if !to_app.is_empty() {
            match app.write(to_app.rest()) {
                Ok(n) => {
                    to_app.advance(n);
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => w.app_write = true,
                Err(_) => break,
            }
        }
        if net_done && to_app.is_empty() && !app_shut {
            // The reader sees the end, finishes what it started, and closes its end.
            let _ = app.shutdown(std::net::Shutdown::Write);
            app_shut = true;
        }
        // The replies, encrypted, to the client.
        if to_net.is_empty() && !app_done {
            match app.read(&mut buf) {
                Ok(0) => app_done = true,
                Ok(n) => {
                    to_net.fill(&buf[..n]);
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => w.app_read = true,
                Err(_) => app_done = true,
            }
        }
        if !to_net.is_empty() {
            match tls.ssl_write(to_net.rest()) {
                Ok(n) => {
                    to_net.advance(n);
                    moved = true;
                }
                Err(e) => match e.code() {
                    ErrorCode::WANT_WRITE => w.net_write = true,
                    ErrorCode::WANT_READ => w.net_read = true,
                    _ => break, // the client is gone: nothing more can reach it
                },
            }
        }
        if app_done && to_net.is_empty() {
            let _ = tls.shutdown(); // close_notify, best effort
            break;
        }
        if moved {
            continue;
        }
        if net_done && !w.net_write && to_net.is_empty() && w.app_read {
            // Only replies can still come: wait for them alone.
            w.net_read = false;
        }
        match wait(
            tls.get_ref().socket().as_raw_fd(),
            app.as_raw_fd(),
            w,
            write_timeout,
        ) {
            Waited::Ready => {}
            Waited::TimedOut if w.net_write => break, // the client stopped reading
            Waited::TimedOut => {}
            Waited::Failed => break,
        }
    }
}

/// Bytes on their way, and how far they went.
#[derive(Default)]
struct Chunk {
    bytes: Vec<u8>,
    sent: usize,
}

impl Chunk {
    fn is_empty(&self) -> bool {
        self.sent == self.bytes.len()
    }
    fn fill(&mut self, b: &[u8]) {
        assert!(self.is_empty());
        self.bytes.clear();
        self.bytes.extend_from_slice(b);
        self.sent = 0;
    }
    fn rest(&self) -> &[u8] {
        &self.bytes[self.sent..]
    }
    fn advance(&mut self, n: usize) {
        self.sent += n;
        assert!(self.sent <= self.bytes.len());
    }
}

/// What the pump waits for.
#[derive(Default, Clone, Copy)]
struct Wants {
    net_read: bool,
    net_write: bool,
    app_read: bool,
    app_write: bool,
}

enum Waited {
    Ready,
    TimedOut,
    Failed,
}

fn wait(net: i32, app: i32, w: Wants, timeout: Duration) -> Waited {
    // A descriptor waited for in neither direction is left out (-1): a closed one would
    // report its hang-up at once, every time.
    let entry = |fd: i32, r: bool, wr: bool| libc::pollfd {
        fd: if r || wr { fd } else { -1 },
        events: (if r { libc::POLLIN } else { 0 }) | (if wr { libc::POLLOUT } else { 0 }),
        revents: 0,
    };
    let mut fds = [
        entry(net, w.net_read, w.net_write),
        entry(app, w.app_read, w.app_write),
    ];
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: `fds` is an array of two valid pollfds that lives across the call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    match rc {
        0 => Waited::TimedOut,
        n if n > 0 => Waited::Ready,
        _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => Waited::Ready,
        _ => Waited::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_files_read_as_psktool_writes_them() {
        let keys = parse_psk_file("# keys\nalice:00ff10\n\nbob:DEADbeef\n").unwrap();
        assert_eq!(keys["alice"], [0x00, 0xff, 0x10]);
        assert_eq!(keys["bob"], [0xde, 0xad, 0xbe, 0xef]);
        for bad in ["alice", "alice:0", "alice:zz", ":00", "a:00\na:11", ""] {
            assert!(parse_psk_file(bad).is_err(), "{bad:?}");
        }
    }
}
