//! The send stream (`zeta send`, `zeta receive`): a volume snapshot, whole or as the changes
//! since an earlier snapshot, as a byte stream (docs/format.md §11). A header, then records,
//! each closed by a SHA-256 over its fields, its payload and its position in the stream, then
//! an end record that counts them: a stream cut short, reordered, spliced or rotted anywhere
//! is refused before anything it carries is kept.

use sha2::{Digest, Sha256};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

pub const MAGIC: [u8; 8] = *b"ZETASEND";
/// The version written: 2 sums a record's payload with Fletcher-4 under its SHA-256 (the
/// payload's own SHA-256, in version 1, held a send to a fifth of the volume's read rate).
/// Readers take 1 and 2.
pub const VERSION: u32 = 2;
const OLDEST_VERSION: u32 = 1;
pub const HEADER_BYTES: usize = 512;
pub const RECORD_BYTES: usize = 64;
/// The largest payload a record may carry: one data block of the largest size.
pub const MAX_PAYLOAD: u64 = 128 * 1024;
/// `Header::flags`: the stream holds the changes since `from_guid`'s snapshot.
pub const FLAG_INCREMENTAL: u32 = 1;
/// `Header::flags`: the stream resumes an interrupted one (`zeta send -t`): its records are
/// those of the whole stream from `resume_offset` on. Readers before it refuse the flag.
pub const FLAG_RESUMED: u32 = 2;

pub const KIND_WRITE: u32 = 1;
pub const KIND_FREE: u32 = 2;
pub const KIND_END: u32 = 3;

#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: U32,
    pub flags: U32,
    /// The sent snapshot's volume size and block size, and its blocks' checksum kind.
    pub volsize: U64,
    pub volblocksize: U32,
    pub checksum: u8,
    pub pad: [u8; 3],
    /// An incremental stream: the guid of the snapshot it starts from (the receiver's
    /// latest must be that one). 0 for a full stream.
    pub from_guid: U64,
    /// The sent snapshot's guid, which the received snapshot takes.
    pub to_guid: U64,
    /// The sent snapshot's txg and creation time on the sender (for display).
    pub to_txg: U64,
    pub creation_time: U64,
    /// The sent snapshot's name (after the `@`), NUL-padded.
    pub snap_name: [u8; 256],
    /// With `FLAG_RESUMED`: the volume byte offset (a multiple of the block size) the
    /// stream's records start at; those before it were received already. Zero otherwise.
    pub resume_offset: U64,
    pub reserved: [u8; 152],
    /// SHA-256 of the 480 bytes before it.
    pub sha256: [u8; 32],
}
const _: () = assert!(std::mem::size_of::<Header>() == HEADER_BYTES);

/// A record's fixed part; a write's payload (`length` bytes) follows it, and the SHA-256
/// covers both.
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct RecordHead {
    pub kind: U32,
    pub pad: U32,
    /// A write or free: the byte offset in the volume. The end: the number of records before
    /// it.
    pub offset: U64,
    /// A write: its payload's bytes; a free: the bytes freed. The end: the payload bytes of
    /// the whole stream.
    pub length: U64,
    /// SHA-256 of the 24 bytes above, the payload's Fletcher-4 sums (four u64; version 1:
    /// the payload itself), and the record's index (u64, from 0).
    pub sha256: [u8; 32],
    /// Zero (a reader refuses others: no byte of a stream is unchecked).
    pub reserved: [u8; 8],
}
const _: () = assert!(std::mem::size_of::<RecordHead>() == RECORD_BYTES);

impl Header {
    pub fn new() -> Header {
        let mut h = Header::new_zeroed();
        h.magic = MAGIC;
        h.version = VERSION.into();
        h
    }

    pub fn seal(&mut self) {
        self.sha256 = Sha256::digest(&self.as_bytes()[..HEADER_BYTES - 32]).into();
    }

    pub fn snap_name(&self) -> Option<String> {
        let end = self.snap_name.iter().position(|&b| b == 0).unwrap_or(256);
        String::from_utf8(self.snap_name[..end].to_vec()).ok()
    }

    pub fn set_snap_name(&mut self, name: &str) {
        assert!(name.len() < 256);
        self.snap_name = [0; 256];
        self.snap_name[..name.len()].copy_from_slice(name.as_bytes());
    }

    /// Decodes and checks a header: magic, version, checksum, and fields a sender writes.
    pub fn decode(bytes: &[u8; HEADER_BYTES]) -> Result<Header, StreamError> {
        let h = Header::read_from_bytes(bytes).expect("exact size");
        if h.magic != MAGIC {
            return Err(StreamError::Bad(
                "not a zeta send stream (bad magic)".into(),
            ));
        }
        if !(OLDEST_VERSION..=VERSION).contains(&h.version.get()) {
            return Err(StreamError::Bad(format!(
                "stream version {} is not one this zeta reads ({OLDEST_VERSION} to {VERSION})",
                h.version.get()
            )));
        }
        let want: [u8; 32] = Sha256::digest(&bytes[..HEADER_BYTES - 32]).into();
        if want != h.sha256 {
            return Err(StreamError::Bad(
                "the stream's header fails its checksum".into(),
            ));
        }
        if h.flags.get() & !(FLAG_INCREMENTAL | FLAG_RESUMED) != 0 {
            return Err(StreamError::Bad(format!(
                "unknown stream flags {:#x}",
                h.flags.get()
            )));
        }
        if (h.flags.get() & FLAG_INCREMENTAL != 0) != (h.from_guid.get() != 0) {
            return Err(StreamError::Bad(
                "an incremental stream names no base, or the reverse".into(),
            ));
        }
        let resumed = h.flags.get() & FLAG_RESUMED != 0;
        let bs = h.volblocksize.get() as u64;
        if (!resumed && h.resume_offset.get() != 0)
            || bs == 0
            || !h.resume_offset.get().is_multiple_of(bs)
            || h.resume_offset.get() > h.volsize.get()
        {
            return Err(StreamError::Bad(
                "the stream's resume offset is not one a sender writes".into(),
            ));
        }
        if h.snap_name()
            .is_none_or(|n| !super::dataset::valid_snapshot_name(&n))
        {
            return Err(StreamError::Bad(
                "the stream's snapshot name is invalid".into(),
            ));
        }
        Ok(h)
    }
}

impl Default for Header {
    fn default() -> Self {
        Header::new()
    }
}

/// Why a stream was refused.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("{0}")]
    Bad(String),
    #[error("reading the stream: {0}")]
    Io(#[from] std::io::Error),
}

fn record_sum(head: &RecordHead, payload: &[u8], index: u64, version: u32) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(&head.as_bytes()[..24]);
    if version == 1 {
        h.update(payload);
    } else {
        for s in zeta_math::fletcher::fletcher4(payload) {
            h.update(s.to_le_bytes());
        }
    }
    h.update(index.to_le_bytes());
    h.finalize().into()
}

/// Writes records after a header, counting them for the end record.
pub struct Writer<W: std::io::Write> {
    out: W,
    records: u64,
    payload: u64,
    /// The header's: how records are summed.
    version: u32,
}

impl<W: std::io::Write> Writer<W> {
    pub fn new(mut out: W, header: &Header) -> std::io::Result<Writer<W>> {
        out.write_all(header.as_bytes())?;
        Ok(Writer {
            out,
            records: 0,
            payload: 0,
            version: header.version.get(),
        })
    }

    fn record(
        &mut self,
        kind: u32,
        offset: u64,
        length: u64,
        payload: &[u8],
    ) -> std::io::Result<()> {
        let mut head = RecordHead::new_zeroed();
        head.kind = kind.into();
        head.offset = offset.into();
        head.length = length.into();
        head.sha256 = record_sum(&head, payload, self.records, self.version);
        self.out.write_all(head.as_bytes())?;
        self.out.write_all(payload)?;
        self.records += 1;
        self.payload += payload.len() as u64;
        Ok(())
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.record(KIND_WRITE, offset, data.len() as u64, data)
    }

    pub fn free(&mut self, offset: u64, length: u64) -> std::io::Result<()> {
        self.record(KIND_FREE, offset, length, &[])
    }

    /// The end record; returns the output, and the records and payload bytes before it.
    pub fn finish(mut self) -> std::io::Result<(W, u64, u64)> {
        let (n, bytes) = (self.records, self.payload);
        self.record(KIND_END, n, bytes, &[])?;
        self.out.flush()?;
        Ok((self.out, n, bytes))
    }
}

/// One record read back.
#[derive(Debug, PartialEq, Eq)]
pub enum Record {
    Write { offset: u64, data: Vec<u8> },
    Free { offset: u64, length: u64 },
    End,
}

/// Reads and checks records one at a time.
pub struct Reader<R: std::io::Read> {
    input: R,
    records: u64,
    payload: u64,
    done: bool,
    version: u32,
}

impl<R: std::io::Read> Reader<R> {
    /// Reads the header.
    pub fn new(mut input: R) -> Result<(Header, Reader<R>), StreamError> {
        let mut bytes = [0u8; HEADER_BYTES];
        read_exact(&mut input, &mut bytes, || "its header")?;
        let h = Header::decode(&bytes)?;
        Ok((
            h,
            Reader {
                input,
                records: 0,
                payload: 0,
                done: false,
                version: h.version.get(),
            },
        ))
    }

    /// The next record, checked; `End` once, after which the stream must end.
    pub fn next_record(&mut self) -> Result<Record, StreamError> {
        if self.done {
            return Err(StreamError::Bad("read past the end record".into()));
        }
        let mut bytes = [0u8; RECORD_BYTES];
        read_exact(&mut self.input, &mut bytes, || {
            format!("record {}", self.records)
        })?;
        let head = RecordHead::read_from_bytes(&bytes).expect("exact size");
        let index = self.records;
        let bad = |what: String| StreamError::Bad(format!("record {index}: {what}"));
        let (kind, offset, length) = (head.kind.get(), head.offset.get(), head.length.get());
        if head.reserved != [0; 8] {
            return Err(bad("reserved bytes are not zero".into()));
        }
        let payload_len = match kind {
            KIND_WRITE if length == 0 || length > MAX_PAYLOAD => {
                return Err(bad(format!("a write of {length} bytes")))
            }
            KIND_WRITE => length as usize,
            KIND_FREE | KIND_END => 0,
            k => return Err(bad(format!("unknown kind {k}"))),
        };
        let mut payload = vec![0u8; payload_len];
        read_exact(&mut self.input, &mut payload, || {
            format!("record {index}'s payload")
        })?;
        if record_sum(&head, &payload, index, self.version) != head.sha256 {
            return Err(bad("fails its checksum (damaged, or out of place)".into()));
        }
        self.records += 1;
        Ok(match kind {
            KIND_WRITE => {
                self.payload += length;
                Record::Write {
                    offset,
                    data: payload,
                }
            }
            KIND_FREE => Record::Free { offset, length },
            _ => {
                if offset != index || length != self.payload {
                    return Err(bad(format!(
                        "the end counts {offset} records and {length} bytes; the stream held \
                         {index} and {}",
                        self.payload
                    )));
                }
                let mut extra = [0u8; 1];
                if self.input.read(&mut extra)? != 0 {
                    return Err(bad("bytes follow the end record".into()));
                }
                self.done = true;
                Record::End
            }
        })
    }
}

/// Reads `buf` whole; `what` names the part for the error of a stream cut short (only then
/// is it formatted: a receive reads two parts per record).
fn read_exact<W: std::fmt::Display>(
    r: &mut impl std::io::Read,
    buf: &mut [u8],
    what: impl FnOnce() -> W,
) -> Result<(), StreamError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            StreamError::Bad(format!("the stream ends early, in {}", what()))
        }
        _ => StreamError::Io(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header, a write, a free, a second write of the same size, the end.
    fn stream() -> Vec<u8> {
        stream_of(VERSION)
    }

    fn stream_of(version: u32) -> Vec<u8> {
        let mut h = Header::new();
        h.version = version.into();
        h.volsize = (1u64 << 20).into();
        h.volblocksize = 16384.into();
        h.to_guid = 7.into();
        h.set_snap_name("s1");
        h.seal();
        let mut w = Writer::new(Vec::new(), &h).unwrap();
        w.write(0, &[1u8; 16384]).unwrap();
        w.free(16384, 32768).unwrap();
        w.write(65536, &[2u8; 16384]).unwrap();
        let (out, n, bytes) = w.finish().unwrap();
        assert_eq!((n, bytes), (3, 32768));
        out
    }

    fn read_all(bytes: &[u8]) -> Result<Vec<Record>, StreamError> {
        let (_, mut r) = Reader::new(bytes)?;
        let mut v = Vec::new();
        loop {
            let rec = r.next_record()?;
            let end = rec == Record::End;
            v.push(rec);
            if end {
                return Ok(v);
            }
        }
    }

    /// A resumed stream's header names its offset; an offset without the flag, one off a
    /// block boundary or past the volume, and a flag no reader knows are refused.
    #[test]
    fn a_resumed_header_carries_its_offset_and_nothing_else_does() {
        let header = |flags: u32, offset: u64| {
            let mut h = Header::new();
            h.volsize = (1u64 << 20).into();
            h.volblocksize = 16384.into();
            h.to_guid = 7.into();
            h.flags = flags.into();
            h.resume_offset = offset.into();
            h.set_snap_name("s1");
            h.seal();
            let bytes: [u8; HEADER_BYTES] = h.as_bytes().try_into().unwrap();
            Header::decode(&bytes)
        };
        let h = header(FLAG_RESUMED, 65536).unwrap();
        assert_eq!(h.resume_offset.get(), 65536);
        assert!(header(FLAG_RESUMED, 0).is_ok(), "from the start");
        for (flags, offset) in [
            (0, 65536),
            (FLAG_RESUMED, 100),
            (FLAG_RESUMED, 2 << 20),
            (4, 0),
        ] {
            assert!(header(flags, offset).is_err(), "{flags} {offset}");
        }
    }

    /// Version 1 streams (each payload under SHA-256) read as ever; an unknown version is
    /// refused by number.
    #[test]
    fn every_version_this_zeta_wrote_reads_back() {
        assert_eq!(read_all(&stream_of(1)).unwrap().len(), 4);
        assert_ne!(stream_of(1), stream_of(2));
        let e = read_all(&stream_of(3)).expect_err("refused").to_string();
        assert!(e.contains("version 3"), "{e}");
    }

    #[test]
    fn a_stream_reads_back_as_written() {
        let v = read_all(&stream()).unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(
            v[1],
            Record::Free {
                offset: 16384,
                length: 32768
            }
        );
        assert!(matches!(&v[2], Record::Write { offset: 65536, data } if data[0] == 2));
    }

    /// Every cut and every flipped byte is refused with an error, never a panic, and never
    /// taken for a good stream; so are a trailing byte and two records in each other's place.
    #[test]
    fn every_cut_flip_and_reordering_is_refused() {
        let good = stream();
        for cut in 0..good.len() {
            assert!(read_all(&good[..cut]).is_err(), "cut at {cut}");
        }
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            assert!(read_all(&bad).is_err(), "flip at {at}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(read_all(&longer).is_err(), "trailing byte");
        // The two writes (each a head and 16K) swapped, offsets and all.
        let write = RECORD_BYTES + 16384;
        let first = HEADER_BYTES;
        let second = first + write + RECORD_BYTES;
        let mut swapped = good.clone();
        swapped[first..first + write].copy_from_slice(&good[second..second + write]);
        swapped[second..second + write].copy_from_slice(&good[first..first + write]);
        assert!(read_all(&swapped).is_err(), "records out of place");
    }
}
