//! Option haggling: from the server's greeting to the start of transmission (or a clean end).

use std::io::{self, Read, Write};
use std::sync::Arc;

use super::admission::{Slot, Slots};
use super::proto::*;
use super::tls::TlsMode;
use super::{ExportInfo, Exports};
use zeta_core::zvol::Volume;

/// What the client and server agreed on for the transmission phase.
pub struct Session {
    pub name: String,
    pub volume: Arc<Volume>,
    pub read_only: bool,
    pub structured: bool,
    /// `base:allocation` was selected for this export.
    pub base_allocation: bool,
    /// `zeta:changed:SNAP` was selected: SNAP. BLOCK_STATUS is allowed when a context is.
    pub changed_since: Option<String>,
    /// The client asked for NBD_INFO_BLOCK_SIZE with NBD_OPT_GO and so promised to honour the
    /// minimum block size: misaligned requests are then errors.
    pub promised_alignment: bool,
    /// The serving slot this connection holds while it lasts (given back on drop).
    pub _slot: Slot,
}

pub enum Outcome {
    Transmit(Session),
    /// The client asked for TLS and was told to go ahead: the caller runs the TLS handshake
    /// and then `negotiate_after_tls` on the TLS session.
    StartTls {
        no_zeroes: bool,
    },
    /// The client aborted, or the session ended as the protocol requires (no such export
    /// with NBD_OPT_EXPORT_NAME, a refused connection).
    Closed,
}

pub struct Policy<'a> {
    pub read_only: bool,
    /// The serving slots: NBD_OPT_GO and NBD_OPT_EXPORT_NAME take one, and are refused
    /// when none is free; every other option is answered whatever the load.
    pub slots: &'a Arc<Slots>,
    pub tls: TlsMode,
}

impl Policy<'_> {
    fn full(&self) -> String {
        format!(
            "server is at its limit of {} connections; try again later",
            self.slots.limit()
        )
    }
}

/// Transmission flags for an export.
pub fn transmission_flags(read_only: bool) -> u16 {
    let mut f = TF_HAS_FLAGS
        | TF_SEND_FLUSH
        | TF_SEND_FUA
        | TF_SEND_CACHE
        // A FLUSH on any connection commits the whole pool's open txg, which holds every
        // write already replied to on every connection: flush semantics hold across
        // connections (tests/nbd_protocol.rs checks it).
        | TF_CAN_MULTI_CONN;
    if read_only {
        f |= TF_READ_ONLY;
    } else {
        f |= TF_SEND_TRIM | TF_SEND_WRITE_ZEROES | TF_SEND_FAST_ZERO;
    }
    f
}

struct State {
    structured: bool,
    /// The export name `base:allocation` was last selected for.
    meta_for: Option<String>,
    /// The export name and base snapshot of the `zeta:changed:` context last selected.
    changed_for: Option<(String, String)>,
}

/// The greeting, then option haggling in the clear.
pub fn negotiate<S: Read + Write>(
    s: &mut S,
    exports: &dyn Exports,
    policy: &Policy,
) -> io::Result<Outcome> {
    let mut greeting = Vec::with_capacity(18);
    greeting.extend_from_slice(&NBDMAGIC.to_be_bytes());
    greeting.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&greeting)?;
    let client_flags = read_u32(s)?;
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        // Unknown client flags: the spec requires us to close.
        return Ok(Outcome::Closed);
    }
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
    haggle(s, exports, policy, no_zeroes, false)
}

/// Option haggling over a TLS session, after NBD_OPT_STARTTLS. What was agreed before the
/// upgrade is forgotten, as the spec asks: the client negotiates it again, protected.
pub fn negotiate_after_tls<S: Read + Write>(
    s: &mut S,
    exports: &dyn Exports,
    policy: &Policy,
    no_zeroes: bool,
) -> io::Result<Outcome> {
    haggle(s, exports, policy, no_zeroes, true)
}

fn haggle<S: Read + Write>(
    s: &mut S,
    exports: &dyn Exports,
    policy: &Policy,
    no_zeroes: bool,
    in_tls: bool,
) -> io::Result<Outcome> {
    let mut st = State {
        structured: false,
        meta_for: None,
        changed_for: None,
    };
    loop {
        let mut h = [0u8; 16];
        s.read_exact(&mut h)?;
        if u64::from_be_bytes(h[0..8].try_into().unwrap()) != IHAVEOPT {
            return Err(invalid("option without IHAVEOPT magic"));
        }
        let opt = u32::from_be_bytes(h[8..12].try_into().unwrap());
        let len = u32::from_be_bytes(h[12..16].try_into().unwrap());
        if len > MAX_OPTION {
            if len > MAX_OPTION_DISCARD {
                return Err(invalid("option data of more than 16 MiB"));
            }
            discard(s, len as u64)?;
            reply_err(s, opt, REP_ERR_TOO_BIG, "option data too long")?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data)?;
        if opt == OPT_ABORT {
            // Best effort: the client may already have gone.
            let _ = write_option_reply(s, opt, REP_ACK, &[]);
            return Ok(Outcome::Closed);
        }
        if opt == OPT_STARTTLS {
            let refusal = if !data.is_empty() {
                Some((REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data"))
            } else if in_tls {
                Some((REP_ERR_INVALID, "TLS is already in use on this connection"))
            } else if policy.tls == TlsMode::Off {
                Some((REP_ERR_UNSUP, "this server is not configured for TLS"))
            } else {
                None
            };
            if let Some((kind, why)) = refusal {
                reply_err(s, opt, kind, why)?;
                continue;
            }
            write_option_reply(s, opt, REP_ACK, &[])?;
            return Ok(Outcome::StartTls { no_zeroes });
        }
        if policy.tls == TlsMode::Require && !in_tls {
            if opt == OPT_EXPORT_NAME {
                return Ok(Outcome::Closed); // it cannot carry an error
            }
            let why = "this server requires TLS: upgrade with NBD_OPT_STARTTLS first";
            reply_err(s, opt, REP_ERR_TLS_REQD, why)?;
            continue;
        }
        match opt {
            OPT_EXPORT_NAME => {
                let Ok(name) = String::from_utf8(data) else {
                    return Ok(Outcome::Closed);
                };
                let Some(volume) = exports.open(&name) else {
                    // NBD_OPT_EXPORT_NAME cannot carry an error: the spec says to close.
                    return Ok(Outcome::Closed);
                };
                let Some(slot) = policy.slots.try_take() else {
                    return Ok(Outcome::Closed); // as above: no way to say why
                };
                let mut m = Vec::with_capacity(134);
                m.extend_from_slice(&volume.size().to_be_bytes());
                m.extend_from_slice(
                    &transmission_flags(policy.read_only || volume.read_only()).to_be_bytes(),
                );
                if !no_zeroes {
                    m.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&m)?;
                return Ok(Outcome::Transmit(session(
                    name, volume, policy, &st, false, slot,
                )));
            }
            OPT_LIST => {
                if !data.is_empty() {
                    reply_err(s, opt, REP_ERR_INVALID, "NBD_OPT_LIST takes no data")?;
                    continue;
                }
                for ExportInfo {
                    name, description, ..
                } in exports.list()
                {
                    let mut d = Vec::new();
                    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
                    d.extend_from_slice(name.as_bytes());
                    d.extend_from_slice(description.as_bytes());
                    write_option_reply(s, opt, REP_SERVER, &d)?;
                }
                write_option_reply(s, opt, REP_ACK, &[])?;
            }
            OPT_INFO | OPT_GO => {
                let Some((name, infos)) = parse_info_request(&data) else {
                    reply_err(s, opt, REP_ERR_INVALID, "malformed NBD_OPT_INFO/GO data")?;
                    continue;
                };
                let Some(volume) = exports.open(&name) else {
                    let msg = format!("no export named '{name}' (try `nbdinfo --list`)");
                    reply_err(s, opt, REP_ERR_UNKNOWN, &msg)?;
                    continue;
                };
                // The slot is taken before anything is sent, so a GO refused for the limit
                // is answered with an error and nothing else (the client may try again).
                let slot = if opt == OPT_GO {
                    match policy.slots.try_take() {
                        Some(slot) => Some(slot),
                        None => {
                            reply_err(s, opt, REP_ERR_POLICY, &policy.full())?;
                            continue;
                        }
                    }
                } else {
                    None
                };
                let read_only = policy.read_only || volume.read_only();
                send_info(s, opt, &name, &volume, &infos, read_only, exports)?;
                write_option_reply(s, opt, REP_ACK, &[])?;
                if let Some(slot) = slot {
                    let promised = infos.contains(&INFO_BLOCK_SIZE);
                    return Ok(Outcome::Transmit(session(
                        name, volume, policy, &st, promised, slot,
                    )));
                }
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    reply_err(
                        s,
                        opt,
                        REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    )?;
                    continue;
                }
                st.structured = true;
                write_option_reply(s, opt, REP_ACK, &[])?;
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                if !st.structured {
                    reply_err(
                        s,
                        opt,
                        REP_ERR_INVALID,
                        "negotiate structured replies first",
                    )?;
                    continue;
                }
                let Some((name, queries)) = parse_meta_request(&data) else {
                    reply_err(s, opt, REP_ERR_INVALID, "malformed meta context request")?;
                    continue;
                };
                if exports.open(&name).is_none() {
                    let msg = format!("no export named '{name}'");
                    reply_err(s, opt, REP_ERR_UNKNOWN, &msg)?;
                    continue;
                }
                let listing = opt == OPT_LIST_META_CONTEXT;
                let selects = |q: &str| q == BASE_ALLOCATION || (listing && q == "base:");
                let chosen = if listing && queries.is_empty() {
                    true
                } else {
                    queries.iter().any(|q| selects(q))
                };
                if chosen {
                    let mut d = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
                    d.extend_from_slice(BASE_ALLOCATION.as_bytes());
                    write_option_reply(s, opt, REP_META_CONTEXT, &d)?;
                }
                // `zeta:changed:SNAP` for each older snapshot SNAP of the export's volume: a
                // listing names them all (for no query, `zeta:` or `zeta:changed:`); a
                // selection takes the first one named that exists (one such context at a
                // time).
                let bases = exports
                    .open(&name)
                    .map(|v| v.change_bases())
                    .unwrap_or_default();
                let wanted = |snap: &str| {
                    let ctx = format!("{ZETA_CHANGED_PREFIX}{snap}");
                    (listing
                        && (queries.is_empty()
                            || queries
                                .iter()
                                .any(|q| q == "zeta:" || q == ZETA_CHANGED_PREFIX)))
                        || queries.contains(&ctx)
                };
                let mut changed = None;
                for (snap, _) in &bases {
                    if !wanted(snap) || (!listing && changed.is_some()) {
                        continue;
                    }
                    let mut d = ZETA_CHANGED_ID.to_be_bytes().to_vec();
                    d.extend_from_slice(format!("{ZETA_CHANGED_PREFIX}{snap}").as_bytes());
                    write_option_reply(s, opt, REP_META_CONTEXT, &d)?;
                    changed = Some(snap.clone());
                }
                if opt == OPT_SET_META_CONTEXT {
                    st.meta_for = chosen.then(|| name.clone());
                    st.changed_for = changed.map(|t| (name, t));
                }
                write_option_reply(s, opt, REP_ACK, &[])?;
            }
            _ => {
                let msg = format!("option {opt} is not supported");
                reply_err(s, opt, REP_ERR_UNSUP, &msg)?;
            }
        }
    }
}

fn session(
    name: String,
    volume: Arc<Volume>,
    policy: &Policy,
    st: &State,
    promised_alignment: bool,
    slot: Slot,
) -> Session {
    let read_only = policy.read_only || volume.read_only();
    Session {
        _slot: slot,
        base_allocation: st.structured && st.meta_for.as_deref() == Some(name.as_str()),
        changed_since: (st.changed_for.as_ref())
            .filter(|(n, _)| st.structured && *n == name)
            .map(|(_, t)| t.clone()),
        name,
        volume,
        read_only,
        structured: st.structured,
        promised_alignment,
    }
}

fn send_info<S: Write>(
    s: &mut S,
    opt: u32,
    name: &str,
    volume: &Volume,
    infos: &[u16],
    read_only: bool,
    exports: &dyn Exports,
) -> io::Result<()> {
    // NBD_INFO_EXPORT is always sent.
    let mut d = INFO_EXPORT.to_be_bytes().to_vec();
    d.extend_from_slice(&volume.size().to_be_bytes());
    d.extend_from_slice(&transmission_flags(read_only).to_be_bytes());
    write_option_reply(s, opt, REP_INFO, &d)?;
    for &info in infos {
        let mut d = info.to_be_bytes().to_vec();
        match info {
            INFO_NAME => d.extend_from_slice(name.as_bytes()),
            INFO_DESCRIPTION => {
                let desc = exports
                    .list()
                    .into_iter()
                    .find(|e| e.name == name)
                    .map(|e| e.description)
                    .unwrap_or_default();
                d.extend_from_slice(desc.as_bytes());
            }
            INFO_BLOCK_SIZE => {
                let preferred = (volume.block_size() as u32).max(MIN_BLOCK);
                d.extend_from_slice(&MIN_BLOCK.to_be_bytes());
                d.extend_from_slice(&preferred.to_be_bytes());
                d.extend_from_slice(&MAX_PAYLOAD.to_be_bytes());
            }
            _ => continue, // unknown requests are ignored, as the spec says
        }
        write_option_reply(s, opt, REP_INFO, &d)?;
    }
    Ok(())
}

/// NBD_OPT_INFO/GO data: u32 name length, name, u16 count, count × u16.
fn parse_info_request(d: &[u8]) -> Option<(String, Vec<u16>)> {
    let mut c = Cursor(d);
    let name = c.string()?;
    let n = c.u16()? as usize;
    let infos: Vec<u16> = (0..n).map(|_| c.u16()).collect::<Option<_>>()?;
    c.0.is_empty().then_some((name, infos))
}

/// NBD_OPT_{LIST,SET}_META_CONTEXT data: export name, u32 count, count × string.
fn parse_meta_request(d: &[u8]) -> Option<(String, Vec<String>)> {
    let mut c = Cursor(d);
    let name = c.string()?;
    let n = c.u32()? as usize;
    if n > 1024 {
        return None;
    }
    let queries: Vec<String> = (0..n).map(|_| c.string()).collect::<Option<_>>()?;
    c.0.is_empty().then_some((name, queries))
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Some(h)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    /// A u32-length-prefixed UTF-8 string of at most MAX_STRING bytes.
    fn string(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        if n > MAX_STRING {
            return None;
        }
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

fn reply_err<S: Write>(s: &mut S, opt: u32, kind: u32, msg: &str) -> io::Result<()> {
    write_option_reply(s, opt, kind, msg.as_bytes())
}

fn read_u32(s: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}
