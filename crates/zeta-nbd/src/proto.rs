//! Wire constants and message layouts of the NBD protocol (NetworkBlockDevice/nbd
//! `doc/proto.md`), fixed newstyle negotiation with structured replies. Everything on the
//! wire is big-endian.

use std::io::{self, Read, Write};

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

// Information types of NBD_OPT_INFO / NBD_OPT_GO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const TF_HAS_FLAGS: u16 = 1 << 0;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TF_SEND_CACHE: u16 = 1 << 10;
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;

// Commands and their flags.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured reply chunks.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

// `base:allocation` flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Its id on the wire.
pub const BASE_ALLOCATION_ID: u32 = 1;
/// `zeta:changed:SNAP`: which ranges may differ from snapshot SNAP of the export's volume
/// (changed-block tracking for incremental backups, as `qemu:dirty-bitmap:` offers it).
pub const ZETA_CHANGED_PREFIX: &str = "zeta:changed:";
pub const ZETA_CHANGED_ID: u32 = 2;
/// `zeta:changed:` flag: the range may differ from the snapshot.
pub const STATE_CHANGED: u32 = 1 << 0;

// Error values.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const ENOTSUP: u32 = 95;

/// The size constraints the server advertises (NBD_INFO_BLOCK_SIZE): requests need only be
/// sector-aligned; the volume block is the efficient unit; 32 MiB payloads at most.
pub const MIN_BLOCK: u32 = 512;
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Strings (export names, queries) longer than this are refused, as the spec allows.
pub const MAX_STRING: usize = 4096;
/// Option payloads above this are discarded unread and answered NBD_REP_ERR_TOO_BIG; above
/// `MAX_OPTION_DISCARD` the session is dropped (a client that sends megabytes of option data is
/// not negotiating in good faith).
pub const MAX_OPTION: u32 = 64 << 10;
pub const MAX_OPTION_DISCARD: u32 = 16 << 20;

/// Bytes of a transmission-phase request header on the wire.
pub const REQUEST_BYTES: usize = 28;

/// A transmission-phase request header (`REQUEST_BYTES` on the wire).
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// Outcome of reading a request header.
pub enum Incoming {
    Request(Request),
    /// The 4 magic bytes were wrong: the stream can no longer be framed.
    BadMagic(u32),
}

/// A request header as a client sends it (`read_request` reads it back); a write's payload
/// follows it.
pub fn request_header(
    kind: u16,
    flags: u16,
    cookie: u64,
    offset: u64,
    length: u32,
) -> [u8; REQUEST_BYTES] {
    let mut h = [0u8; REQUEST_BYTES];
    h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&kind.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..24].copy_from_slice(&offset.to_be_bytes());
    h[24..28].copy_from_slice(&length.to_be_bytes());
    h
}

pub fn read_request(r: &mut impl Read) -> io::Result<Incoming> {
    let mut h = [0u8; REQUEST_BYTES];
    r.read_exact(&mut h)?;
    let magic = u32::from_be_bytes(h[0..4].try_into().unwrap());
    if magic != REQUEST_MAGIC {
        return Ok(Incoming::BadMagic(magic));
    }
    Ok(Incoming::Request(Request {
        flags: u16::from_be_bytes(h[4..6].try_into().unwrap()),
        kind: u16::from_be_bytes(h[6..8].try_into().unwrap()),
        cookie: u64::from_be_bytes(h[8..16].try_into().unwrap()),
        offset: u64::from_be_bytes(h[16..24].try_into().unwrap()),
        length: u32::from_be_bytes(h[24..28].try_into().unwrap()),
    }))
}

/// Reads and drops `n` bytes without holding them in memory.
pub fn discard(r: &mut impl Read, n: u64) -> io::Result<()> {
    let copied = io::copy(&mut r.take(n), &mut io::sink())?;
    if copied < n {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// An option reply header plus payload, sent as one write.
pub fn write_option_reply(w: &mut impl Write, opt: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    let mut m = Vec::with_capacity(20 + data.len());
    m.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&kind.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    w.write_all(&m)
}

pub fn simple_reply_header(cookie: u64, error: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&error.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h
}

pub fn chunk_header(cookie: u64, flags: u16, kind: u16, length: u32) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&kind.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..20].copy_from_slice(&length.to_be_bytes());
    h
}

/// Name of a command for messages.
pub fn command_name(kind: u16) -> &'static str {
    match kind {
        CMD_READ => "READ",
        CMD_WRITE => "WRITE",
        CMD_DISC => "DISC",
        CMD_FLUSH => "FLUSH",
        CMD_TRIM => "TRIM",
        CMD_CACHE => "CACHE",
        CMD_WRITE_ZEROES => "WRITE_ZEROES",
        CMD_BLOCK_STATUS => "BLOCK_STATUS",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_header_reads_back_field_for_field() {
        let h = request_header(
            CMD_WRITE,
            CMD_FLAG_FUA,
            0x0102_0304_0506_0708,
            1 << 40,
            65536,
        );
        let Incoming::Request(r) = read_request(&mut &h[..]).unwrap() else {
            panic!("magic not recognised");
        };
        assert_eq!(
            (r.kind, r.flags, r.cookie, r.offset, r.length),
            (
                CMD_WRITE,
                CMD_FLAG_FUA,
                0x0102_0304_0506_0708,
                1 << 40,
                65536
            )
        );
    }
}
