//! TLS (NBD_OPT_STARTTLS): a session with each kind of credential (X.509 with client
//! certificates, pre-shared keys) from a raw client and from real ones (nbdinfo, nbdcopy,
//! qemu-img), and every way in that must be refused (a wrong key, a certificate no trusted CA
//! signed, a plain client against `--tls=require`, STARTTLS twice, garbage where the TLS
//! handshake belongs), each cleanly, while a session already open goes on being served.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslStream, SslVerifyMode};
use openssl::x509::extension::{BasicConstraints, ExtendedKeyUsage, SubjectAlternativeName};
use openssl::x509::{X509NameBuilder, X509};

use common::nbd_client::Client;
use common::procs::have;
use common::rig::{Rig, VOL};
use zeta::nbd::proto::*;
use zeta::nbd::tls::{Tls, TlsMode};
use zeta::nbd::ServerConfig;

// ---- credentials, made here so the test needs no certtool or openssl command ----

fn key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

/// A certificate for `cn` with `key`, signed by `issuer` (None: self-signed, a CA).
fn cert(
    cn: &str,
    key: &PKey<Private>,
    issuer: Option<(&X509, &PKey<Private>)>,
    usage: &str,
) -> X509 {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", cn).unwrap();
    let name = name.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    let serial = BigNum::from_u32(rand::random::<u32>() >> 1)
        .unwrap()
        .to_asn1_integer()
        .unwrap();
    b.set_serial_number(&serial).unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_pubkey(key).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::days_from_now(2).unwrap())
        .unwrap();
    match usage {
        "ca" => {
            b.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
                .unwrap();
        }
        "server" => {
            let san = SubjectAlternativeName::new()
                .ip("127.0.0.1")
                .dns("localhost")
                .build(&b.x509v3_context(issuer.map(|i| &**i.0), None))
                .unwrap();
            b.append_extension(san).unwrap();
            b.append_extension(ExtendedKeyUsage::new().server_auth().build().unwrap())
                .unwrap();
        }
        _ => {
            b.append_extension(ExtendedKeyUsage::new().client_auth().build().unwrap())
                .unwrap();
        }
    }
    let (issuer_name, signer) = match issuer {
        Some((c, k)) => (c.subject_name().to_owned().unwrap(), k),
        None => (name.to_owned().unwrap(), key),
    };
    b.set_issuer_name(&issuer_name).unwrap();
    b.sign(signer, MessageDigest::sha256()).unwrap();
    b.build()
}

fn write_pem(dir: &Path, name: &str, pem: Vec<u8>) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), pem).unwrap();
}

/// A CA, and directories in the layout nbdkit, qemu and libnbd read: `server/` (ca-cert,
/// server-cert, server-key), `client/` (ca-cert, client-cert, client-key), and `rogue/`, a
/// client whose certificate another CA signed (it trusts the real CA, so only the server
/// can refuse it).
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = key();
        let ca = cert("zeta test CA", &ca_key, None, "ca");
        let other_key = key();
        let other_ca = cert("some other CA", &other_key, None, "ca");
        let d = dir.path();
        for (who, issuer) in [
            ("server", (&ca, &ca_key)),
            ("client", (&ca, &ca_key)),
            ("rogue", (&other_ca, &other_key)),
        ] {
            let k = key();
            let role = if who == "server" { "server" } else { "client" };
            let c = cert(who, &k, Some(issuer), role);
            let sub = d.join(who);
            write_pem(&sub, "ca-cert.pem", ca.to_pem().unwrap());
            write_pem(&sub, &format!("{role}-cert.pem"), c.to_pem().unwrap());
            write_pem(
                &sub,
                &format!("{role}-key.pem"),
                k.private_key_to_pem_pkcs8().unwrap(),
            );
        }
        Pki { dir }
    }

    fn path(&self, who: &str) -> PathBuf {
        self.dir.path().join(who)
    }
}

fn rig_with(tls: Tls) -> Rig {
    Rig::new(ServerConfig {
        tls: Some(Arc::new(tls)),
        ..Default::default()
    })
}

// ---- a raw client, over the clear socket or TLS ----

fn send_option(s: &mut impl Write, opt: u32, data: &[u8]) -> std::io::Result<()> {
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m)
}

/// Replies to one option up to the last (an ACK or an error): the last one's type and data.
fn option(s: &mut (impl Read + Write), opt: u32, data: &[u8]) -> (u32, Vec<u8>) {
    send_option(s, opt, data).unwrap();
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        assert_eq!(
            u64::from_be_bytes(h[..8].try_into().unwrap()),
            OPT_REPLY_MAGIC
        );
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        let mut d = vec![0u8; len as usize];
        s.read_exact(&mut d).unwrap();
        if kind == REP_ACK || kind & (1 << 31) != 0 {
            return (kind, d);
        }
    }
}

/// The greeting, then NBD_OPT_STARTTLS, acknowledged: the socket is ready for TLS.
fn start_tls(addr: SocketAddr) -> TcpStream {
    let mut c = Client::connect(addr);
    let (kind, _) = option(&mut c.s, OPT_STARTTLS, &[]);
    assert_eq!(kind, REP_ACK, "STARTTLS refused");
    c.s
}

/// What a raw client presents: a CA to trust and maybe a certificate, or a pre-shared key.
enum Creds<'a> {
    X509 {
        ca: &'a Path,
        cert: Option<&'a Path>,
    },
    Psk {
        user: &'a str,
        key: Vec<u8>,
    },
}

fn tls_connect(addr: SocketAddr, creds: &Creds) -> Result<SslStream<TcpStream>, String> {
    let s = start_tls(addr);
    let mut b = SslConnector::builder(SslMethod::tls()).unwrap();
    match creds {
        Creds::X509 { ca, cert } => {
            b.set_ca_file(ca.join("ca-cert.pem")).unwrap();
            if let Some(dir) = cert {
                b.set_certificate_file(dir.join("client-cert.pem"), SslFiletype::PEM)
                    .unwrap();
                b.set_private_key_file(dir.join("client-key.pem"), SslFiletype::PEM)
                    .unwrap();
            }
        }
        Creds::Psk { user, key } => {
            let (user, key) = (user.to_string(), key.clone());
            b.set_verify(SslVerifyMode::NONE);
            b.set_psk_client_callback(move |_ssl, _hint, id, psk| {
                id[..user.len()].copy_from_slice(user.as_bytes());
                id[user.len()] = 0;
                psk[..key.len()].copy_from_slice(&key);
                Ok(key.len())
            });
        }
    }
    let mut s = b
        .build()
        .connect("127.0.0.1", s)
        .map_err(|e| e.to_string())?;
    // In TLS 1.3 a client certificate is judged after the client's handshake ends: the
    // refusal shows on the first exchange.
    send_option(&mut s, OPT_STRUCTURED_REPLY, &[]).map_err(|e| e.to_string())?;
    let mut h = [0u8; 20];
    s.read_exact(&mut h).map_err(|e| e.to_string())?;
    let mut rest = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
    s.read_exact(&mut rest).map_err(|e| e.to_string())?;
    Ok(s)
}

/// GO on the default rig export, then a write and a read back of `fill` over `s`.
fn go_and_io(s: &mut (impl Read + Write), fill: u8) {
    let (kind, msg) = option(s, OPT_GO, &Client::info_data(VOL, &[]));
    assert_eq!(kind, REP_ACK, "GO: {}", String::from_utf8_lossy(&msg));
    io(s, fill);
}

/// A 64K write and its read back, with structured replies (as `tls_connect` negotiated).
fn io(s: &mut (impl Read + Write), fill: u8) {
    let data = vec![fill; 65536];
    let mut m = request_header(CMD_WRITE, 0, 1, 1 << 20, 65536).to_vec();
    m.extend_from_slice(&data);
    s.write_all(&m).unwrap();
    let mut r = [0u8; 16];
    s.read_exact(&mut r).unwrap();
    assert_eq!(
        u32::from_be_bytes(r[4..8].try_into().unwrap()),
        0,
        "write error"
    );
    s.write_all(&request_header(CMD_READ, 0, 2, 1 << 20, 65536))
        .unwrap();
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(
        u16::from_be_bytes(h[6..8].try_into().unwrap()),
        REPLY_TYPE_OFFSET_DATA
    );
    let mut p = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
    s.read_exact(&mut p).unwrap();
    assert!(p[8..] == data[..], "read back differs");
}

/// Whether the server ended the connection (end-of-file or a reset), within 10 s.
fn ended(s: &mut impl Read) -> bool {
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

// ---- the tests ----

#[test]
fn x509_sessions_with_client_certificates_and_every_refusal() {
    let pki = Pki::new();
    let rig = rig_with(Tls::x509(TlsMode::Require, &pki.path("server")).unwrap());
    let addr = rig.addr();
    let good = Creds::X509 {
        ca: &pki.path("client"),
        cert: Some(&pki.path("client")),
    };
    // A session that stays open through every refusal below.
    let mut open = tls_connect(addr, &good).unwrap();
    go_and_io(&mut open, 1);

    // A client whose certificate another CA signed.
    let rogue = Creds::X509 {
        ca: &pki.path("rogue"),
        cert: Some(&pki.path("rogue")),
    };
    assert!(
        tls_connect(addr, &rogue).is_err(),
        "an untrusted certificate got in"
    );
    // A client with no certificate at all.
    let bare = Creds::X509 {
        ca: &pki.path("client"),
        cert: None,
    };
    assert!(
        tls_connect(addr, &bare).is_err(),
        "a client without a certificate got in"
    );
    io(&mut open, 2);

    // A plain client: everything but STARTTLS is refused with TLS_REQD, and the session
    // goes on until it upgrades; EXPORT_NAME, which cannot carry an error, is closed.
    let mut c = Client::connect(addr);
    for opt in [OPT_LIST, OPT_INFO, OPT_GO, OPT_STRUCTURED_REPLY] {
        let data = if matches!(opt, OPT_INFO | OPT_GO) {
            Client::info_data(VOL, &[])
        } else {
            Vec::new()
        };
        let (kind, msg) = option(&mut c.s, opt, &data);
        assert_eq!(kind, REP_ERR_TLS_REQD, "option {opt}");
        assert!(String::from_utf8_lossy(&msg).contains("requires TLS"));
    }
    send_option(&mut c.s, OPT_EXPORT_NAME, VOL.as_bytes()).unwrap();
    assert!(c.closed(), "EXPORT_NAME in the clear was served");

    // STARTTLS twice: the second is refused inside TLS, and the session goes on.
    let mut twice = tls_connect(addr, &good).unwrap();
    let (kind, _) = option(&mut twice, OPT_STARTTLS, &[]);
    assert_eq!(kind, REP_ERR_INVALID);
    go_and_io(&mut twice, 3);

    // Garbage where the client's TLS hello belongs: the connection is closed.
    let mut g = start_tls(addr);
    g.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    g.write_all(&[0x5a; 300]).unwrap();
    assert!(
        ended(&mut g),
        "garbage after STARTTLS left the connection open"
    );
    // STARTTLS with data is refused; so is a TLS hello sent without STARTTLS.
    let mut c = Client::connect(addr);
    assert_eq!(option(&mut c.s, OPT_STARTTLS, b"x").0, REP_ERR_INVALID);
    let mut c = Client::connect(addr);
    c.s.write_all(&[
        0x16, 0x03, 0x01, 0x00, 0x05, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
    ])
    .unwrap();
    assert!(c.closed());

    io(&mut open, 4);
    io(&mut twice, 5);
    // Real clients, through the same doors.
    if have("nbdinfo") {
        let uri = |who: &str| {
            format!(
                "nbds://{addr}/{VOL}?tls-certificates={}",
                pki.path(who).display()
            )
        };
        let ok = Command::new("nbdinfo")
            .args(["--size", &uri("client")])
            .output()
            .unwrap();
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "8388608");
        let bad = Command::new("nbdinfo")
            .args(["--size", &uri("rogue")])
            .output()
            .unwrap();
        assert!(
            !bad.status.success(),
            "nbdinfo with an untrusted certificate got in"
        );
        let plain = Command::new("nbdinfo")
            .args(["--size", &format!("nbd://{addr}/{VOL}")])
            .output()
            .unwrap();
        assert!(!plain.status.success(), "a plain nbdinfo got in");
    }
    if have("qemu-img") {
        let out = qemu_img_info(
            addr,
            &format!(
                "tls-creds-x509,id=tls0,dir={},endpoint=client",
                pki.path("client").display()
            ),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("8388608 bytes"));
    }
    io(&mut open, 6);
}

fn qemu_img_info(addr: SocketAddr, object: &str) -> std::process::Output {
    Command::new("qemu-img")
        .args(["info", "--object", object, "--image-opts"])
        .arg(format!(
            "driver=nbd,host={},port={},export={VOL},tls-creds=tls0",
            addr.ip(),
            addr.port()
        ))
        .output()
        .unwrap()
}

#[test]
fn psk_sessions_and_a_wrong_key() {
    let dir = tempfile::tempdir().unwrap();
    let key: Vec<u8> = (0..32).map(|_| rand::random::<u8>()).collect();
    let hex = |k: &[u8]| k.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let file = dir.path().join("keys.psk");
    std::fs::write(
        &file,
        format!("alice:{}\nbob:{}\n", hex(&key), hex(&[7u8; 32])),
    )
    .unwrap();
    let rig = rig_with(Tls::psk(TlsMode::Require, &file).unwrap());
    let addr = rig.addr();
    let mut open = tls_connect(
        addr,
        &Creds::Psk {
            user: "alice",
            key: key.clone(),
        },
    )
    .unwrap();
    go_and_io(&mut open, 1);
    // A wrong key, and an unknown user.
    let mut wrong = key.clone();
    wrong[0] ^= 1;
    assert!(tls_connect(
        addr,
        &Creds::Psk {
            user: "alice",
            key: wrong
        }
    )
    .is_err());
    assert!(tls_connect(
        addr,
        &Creds::Psk {
            user: "mallory",
            key: key.clone()
        }
    )
    .is_err());
    io(&mut open, 2);

    if have("nbdcopy") {
        let img = dir.path().join("img");
        let back = dir.path().join("back");
        let data: Vec<u8> = (0..(4 << 20)).map(|i| (i * 7 % 253) as u8).collect();
        std::fs::write(&img, &data).unwrap();
        let uri = format!("nbds://alice@{addr}/{VOL}?tls-psk-file={}", file.display());
        for (from, to) in [
            (img.display().to_string(), uri.clone()),
            (uri.clone(), back.display().to_string()),
        ] {
            let out = Command::new("nbdcopy").args([&from, &to]).output().unwrap();
            assert!(
                out.status.success(),
                "nbdcopy: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(std::fs::read(&back).unwrap()[..4 << 20] == data[..]);
        let wrong = dir.path().join("wrong.psk");
        std::fs::write(&wrong, format!("alice:{}\n", hex(&[9u8; 32]))).unwrap();
        let bad = format!("nbds://alice@{addr}/{VOL}?tls-psk-file={}", wrong.display());
        let out = Command::new("nbdinfo")
            .args(["--size", &bad])
            .output()
            .unwrap();
        assert!(!out.status.success(), "nbdinfo with a wrong key got in");
    }
    if have("qemu-img") {
        // qemu reads `keys.psk` from the directory it is given.
        let out = qemu_img_info(
            addr,
            &format!(
                "tls-creds-psk,id=tls0,dir={},username=alice,endpoint=client",
                dir.path().display()
            ),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = qemu_img_info(
            addr,
            &format!(
                "tls-creds-psk,id=tls0,dir={},username=bob,endpoint=client",
                dir.path().display()
            ),
        );
        assert!(
            out.status.success(),
            "bob: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    io(&mut open, 3);
}

#[test]
fn tls_on_lets_plain_clients_in_and_off_refuses_starttls() {
    let pki = Pki::new();
    let rig = rig_with(Tls::x509(TlsMode::On, &pki.path("server")).unwrap());
    let mut plain = Client::open(rig.addr(), VOL);
    assert_eq!(plain.write(0, &[1u8; 4096]), 0);
    let good = Creds::X509 {
        ca: &pki.path("client"),
        cert: Some(&pki.path("client")),
    };
    let mut s = tls_connect(rig.addr(), &good).unwrap();
    go_and_io(&mut s, 9);
    let off = Rig::default();
    let mut c = Client::connect(off.addr());
    assert_eq!(option(&mut c.s, OPT_STARTTLS, &[]).0, REP_ERR_UNSUP);
    off.assert_serving();
}

#[test]
fn bad_credentials_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        Tls::x509(TlsMode::Require, dir.path()).is_err(),
        "no server-cert.pem"
    );
    let file = dir.path().join("k");
    std::fs::write(&file, "alice:nothex\n").unwrap();
    let e = Tls::psk(TlsMode::Require, &file).unwrap_err().to_string();
    assert!(e.contains("line 1"), "{e}");
}

#[test]
fn the_cli_warns_on_open_addresses_without_tls_and_checks_its_flags() {
    let home = tempfile::tempdir().unwrap();
    let serve = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_zeta"))
            .env("ZETA_HOME", home.path())
            .arg("serve")
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}: no pools, so no server");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let warning = "without --tls=require: anyone who can reach it";
    assert!(serve(&["--listen", "0.0.0.0:0"]).contains(warning));
    assert!(!serve(&["--listen", "127.0.0.1:0"]).contains(warning));
    let pki = Pki::new();
    let dir = pki.path("server");
    let dir = dir.to_str().unwrap();
    let e = serve(&[
        "--listen",
        "0.0.0.0:0",
        "--tls=require",
        "--tls-certificates",
        dir,
    ]);
    assert!(
        !e.contains(warning) && e.contains("no pools to serve"),
        "{e}"
    );
    assert!(serve(&[
        "--listen",
        "0.0.0.0:0",
        "--tls=on",
        "--tls-certificates",
        dir
    ])
    .contains(warning));
    for (args, msg) in [
        (
            vec!["--tls=require"],
            "need --tls-certificates DIR or --tls-psk FILE",
        ),
        (
            vec!["--tls-psk", "/nonexistent"],
            "need --tls=on or --tls=require",
        ),
        (
            vec!["--tls=on", "--tls-psk", "/nonexistent"],
            "/nonexistent",
        ),
        (
            vec!["--tls=on", "--tls-certificates", "/nonexistent"],
            "server-cert.pem",
        ),
    ] {
        let e = serve(&args);
        assert!(e.contains(msg), "{args:?}: {e}");
    }
}
