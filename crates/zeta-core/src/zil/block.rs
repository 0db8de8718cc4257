//! The intent log's on-disk unit: a log block of records, and the walk along a chain of them.
//!
//! A volume's log is a chain: each block names where the next one will be written (the
//! address is chosen, and its space reserved, before the block that names it is written), so
//! replay can follow it without any index. Each block's checksum covers its sequence number
//! and the chain's identity, so the chain ends by itself at the first block that was never
//! written, was torn, or is left over from an older chain at that address: no commit record
//! is needed, and a crash at any point leaves a valid prefix.
//!
//! Layout of a block (little-endian), `len` bytes, a multiple of 4096:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `ZETAZIL2` (`ZETAZIL1`: an older block, SHA-256 at 64, still read) |
//! | 8 | 8 | chain id (the volume's GUID, xor the chain's generation) |
//! | 16 | 8 | sequence number, from 1 along the chain |
//! | 24 | 8 | highest txg of the records (records of txgs already synced are skipped) |
//! | 32 | 16 | next block: vdev (u32), length (u32), offset (u64); length 0: none |
//! | 48 | 4 | bytes of records that follow the header |
//! | 52 | 4 | number of records |
//! | 56 | 8 | reserved, zero |
//! | 64 | 32 | checksum (`checksum_v2`): Fletcher-4 of the Fletcher-4s of bytes 0..64 and of the records |
//! | 96 | .. | records, each 8-byte aligned |
//!
//! A record: kind (u8: 1 write, 2 zero/trim, 3 write in place), 7 reserved bytes, txg (u64),
//! offset (u64), length (u64), then for a write `length` bytes of data padded to 8, and for a
//! write in place the 128-byte block pointer of the block already holding the data.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use zerocopy::{FromBytes, IntoBytes};

use crate::spa::bp::{BlkPtr, BP_BYTES};
use crate::vdev::SectorVec;
use zeta_math::fletcher::fletcher4;

/// Blocks written now: a Fletcher-4 checksum (`checksum_v2`).
pub const MAGIC: u64 = u64::from_le_bytes(*b"ZETAZIL2");
/// Blocks of older versions: SHA-256. Read, never written: a log left by one replays.
const MAGIC_V1: u64 = u64::from_le_bytes(*b"ZETAZIL1");
pub const HEADER_BYTES: usize = 96;
const RECORD_HEADER: usize = 32;

/// Where a log block lies: like a DVA, one copy on one top-level vdev.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlockAddr {
    pub vdev: u32,
    pub len: u32,
    pub offset: u64,
}

impl BlockAddr {
    pub fn is_none(&self) -> bool {
        self.len == 0
    }
}

/// A record's bytes: a slice of a buffer that may be shared with the dirty block it was
/// written into, so logging a whole-block write costs no copy.
#[derive(Clone)]
pub struct Payload {
    buf: Arc<Vec<u8>>,
    start: usize,
    len: usize,
}

impl Payload {
    pub fn owned(data: Vec<u8>) -> Payload {
        let len = data.len();
        Payload {
            buf: Arc::new(data),
            start: 0,
            len,
        }
    }

    /// The whole shared buffer, if this payload is all of it (a whole-block write sharing the
    /// dirty block's buffer).
    pub fn whole_buffer(&self) -> Option<&Arc<Vec<u8>>> {
        (self.start == 0 && self.len == self.buf.len()).then_some(&self.buf)
    }

    /// Bytes this payload keeps alive: the whole buffer it is a slice of.
    pub fn held_bytes(&self) -> usize {
        self.buf.len()
    }

    /// `buf[start..start + len]`, without copying.
    pub fn shared(buf: Arc<Vec<u8>>, start: usize, len: usize) -> Payload {
        assert!(start + len <= buf.len());
        Payload { buf, start, len }
    }
}

impl std::ops::Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        **self == **other
    }
}
impl Eq for Payload {}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Payload({} bytes)", self.len)
    }
}

/// One logged operation on a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// `data` was written at `offset`.
    Write {
        txg: u64,
        offset: u64,
        data: Payload,
    },
    /// `len` bytes at `offset` were zeroed (or trimmed).
    Zero { txg: u64, offset: u64, len: u64 },
    /// A whole block was written at `offset`, and its data was written in place before the
    /// record: `bp` points at it (a large write logged by block pointer, not by value).
    Indirect { txg: u64, offset: u64, bp: BlkPtr },
}

impl Record {
    pub fn txg(&self) -> u64 {
        match self {
            Record::Write { txg, .. } | Record::Zero { txg, .. } | Record::Indirect { txg, .. } => {
                *txg
            }
        }
    }

    /// The bytes of the volume the record sets: (offset, length).
    pub fn extent(&self) -> (u64, u64) {
        match self {
            Record::Write { offset, data, .. } => (*offset, data.len() as u64),
            Record::Zero { offset, len, .. } => (*offset, *len),
            Record::Indirect { offset, bp, .. } => (*offset, bp.lsize.get() as u64),
        }
    }

    /// Bytes of memory this record keeps alive while queued (its payload's buffer).
    pub fn held_bytes(&self) -> u64 {
        match self {
            Record::Write { data, .. } => data.held_bytes() as u64,
            Record::Zero { .. } | Record::Indirect { .. } => 0,
        }
    }

    /// Bytes this record takes in a block.
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER
            + match self {
                Record::Write { data, .. } => data.len().next_multiple_of(8),
                Record::Zero { .. } => 0,
                Record::Indirect { .. } => BP_BYTES,
            }
    }

    fn encode(&self, out: &mut SectorVec) {
        let kind = match self {
            Record::Write { .. } => 1u8,
            Record::Zero { .. } => 2,
            Record::Indirect { .. } => 3,
        };
        let (offset, len) = self.extent();
        out.push(kind);
        out.extend_from_slice(&[0u8; 7]);
        out.extend_from_slice(&self.txg().to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        match self {
            Record::Write { data, .. } => {
                out.extend_from_slice(data);
                out.resize(out.len().next_multiple_of(8), 0);
            }
            Record::Indirect { bp, .. } => out.extend_from_slice(bp.as_bytes()),
            Record::Zero { .. } => {}
        }
    }
}

/// A decoded, verified log block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogBlock {
    pub chain: u64,
    pub seq: u64,
    pub max_txg: u64,
    pub next: BlockAddr,
    pub records: Vec<Record>,
}

/// Why a block does not continue a chain (where replay stops).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndOfChain {
    #[error("no log block there (bad magic)")]
    NoBlock,
    #[error("log block checksum mismatch (torn or damaged)")]
    BadChecksum,
    #[error("log block of another chain or an older generation")]
    OtherChain,
    #[error("log block out of sequence (expected {expected}, found {found})")]
    OutOfSequence { expected: u64, found: u64 },
    #[error("malformed log block: {0}")]
    Malformed(&'static str),
    /// The device holding the block could not be read: whether the chain goes on is unknown.
    #[error("log block unreadable: {0}")]
    Unreadable(String),
    /// A block whose header names this chain and the sequence number expected there, but
    /// whose checksum fails: torn by a power cut while it was being written, or damaged
    /// since. `later`: how many blocks go on from the block its header names, counted up to
    /// `LOOKAHEAD` and never replayed (see `written_whole`).
    #[error("log block {seq} fails its checksum (torn or damaged)")]
    Damaged { seq: u64, at: BlockAddr, later: u64 },
}

/// How far past a damaged block `walk_chain` counts the blocks that go on from it.
pub const LOOKAHEAD: u64 = 16;

impl EndOfChain {
    /// Whether a damaged block was certainly written whole before it was damaged, so that
    /// what it held may have been acknowledged. A batch writes its blocks a few at a time
    /// (`zil::PARALLEL_LOG_WRITES`) and starts the next few only once those are all written,
    /// so a block torn by a power cut has at most that many less one written after it; more
    /// than that, and its own write had completed.
    pub fn written_whole(&self) -> bool {
        matches!(self, EndOfChain::Damaged { later, .. } if written_whole_before(*later))
    }
}

/// Whether a log block was certainly written whole, given how many blocks of its chain
/// are known to have been written (whole or not) after it: a batch writes its blocks a few
/// at a time (`zil::PARALLEL_LOG_WRITES`) and starts the next few, or the next batch, only
/// once those are all written, so that many later blocks mean that its own write had
/// completed before the crash. Short of that, a crash may have cut its write short.
pub fn written_whole_before(later: u64) -> bool {
    later >= crate::zil::PARALLEL_LOG_WRITES as u64
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// How many of `records` (from the front) fit in a block of `len` bytes.
pub fn records_that_fit(records: &[Record], len: usize) -> usize {
    let mut used = HEADER_BYTES;
    records
        .iter()
        .take_while(|r| {
            used += r.encoded_len();
            used <= len
        })
        .count()
}

impl LogBlock {
    /// Bytes of records after the header (the header's body length).
    pub fn body_len(&self) -> usize {
        self.records.iter().map(Record::encoded_len).sum()
    }

    /// The block's bytes, `len` long (a multiple of 4096 that holds every record), aligned
    /// in memory for a direct write.
    pub fn encode(&self, len: usize) -> SectorVec {
        assert!(len.is_multiple_of(4096) && len >= 4096);
        assert!(
            HEADER_BYTES + self.body_len() <= len,
            "records overflow the log block"
        );
        let mut out = SectorVec::with_capacity(len);
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&self.chain.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.max_txg.to_le_bytes());
        out.extend_from_slice(&self.next.vdev.to_le_bytes());
        out.extend_from_slice(&self.next.len.to_le_bytes());
        out.extend_from_slice(&self.next.offset.to_le_bytes());
        // Body length, count and checksum are filled in once the records are in place
        // (encoded straight into the block: no second copy of a batch's data).
        out.resize(HEADER_BYTES, 0);
        for r in &self.records {
            r.encode(&mut out);
        }
        let body_len = out.len() - HEADER_BYTES;
        out[48..52].copy_from_slice(&(body_len as u32).to_le_bytes());
        out[52..56].copy_from_slice(&(self.records.len() as u32).to_le_bytes());
        let sum = checksum_v2(&out[..64], &out[HEADER_BYTES..]);
        out[64..96].copy_from_slice(&sum);
        out.resize(len, 0);
        out
    }

    /// The checksum `bytes` (a block of either version) should carry, if its header's
    /// lengths are sane.
    fn expected_checksum(bytes: &[u8]) -> Option<[u8; 32]> {
        if bytes.len() < HEADER_BYTES {
            return None;
        }
        let body_len = u32_at(bytes, 48) as usize;
        let body = bytes.get(HEADER_BYTES..HEADER_BYTES.checked_add(body_len)?)?;
        match u64_at(bytes, 0) {
            MAGIC => Some(checksum_v2(&bytes[..64], body)),
            MAGIC_V1 => {
                let mut h = Sha256::new();
                h.update(&bytes[..64]);
                h.update(body);
                Some(h.finalize().into())
            }
            _ => None,
        }
    }

    /// Decodes `bytes` as block `seq` of chain `chain`, or says why the chain ends here.
    pub fn decode(bytes: &[u8], chain: u64, seq: u64) -> Result<LogBlock, EndOfChain> {
        if bytes.len() < HEADER_BYTES || ![MAGIC, MAGIC_V1].contains(&u64_at(bytes, 0)) {
            return Err(EndOfChain::NoBlock);
        }
        if Self::expected_checksum(bytes).is_none_or(|sum| sum != bytes[64..96]) {
            return Err(EndOfChain::BadChecksum);
        }
        let body_len = u32_at(bytes, 48) as usize;
        let body = &bytes[HEADER_BYTES..HEADER_BYTES + body_len];
        if u64_at(bytes, 8) != chain {
            return Err(EndOfChain::OtherChain);
        }
        let found = u64_at(bytes, 16);
        if found != seq {
            return Err(EndOfChain::OutOfSequence {
                expected: seq,
                found,
            });
        }
        let count = u32_at(bytes, 52) as usize;
        let mut records = Vec::with_capacity(count.min(body_len / RECORD_HEADER));
        let mut at = 0;
        for _ in 0..count {
            if at + RECORD_HEADER > body.len() {
                return Err(EndOfChain::Malformed("record header past the end"));
            }
            let (kind, txg, offset, len) = (
                body[at],
                u64_at(body, at + 8),
                u64_at(body, at + 16),
                u64_at(body, at + 24),
            );
            at += RECORD_HEADER;
            records.push(match kind {
                1 => {
                    let n = usize::try_from(len)
                        .ok()
                        .filter(|&n| at.checked_add(n).is_some_and(|end| end <= body.len()))
                        .ok_or(EndOfChain::Malformed("record data past the end"))?;
                    let data = Payload::owned(body[at..at + n].to_vec());
                    at += n.next_multiple_of(8);
                    Record::Write { txg, offset, data }
                }
                2 => Record::Zero { txg, offset, len },
                3 => {
                    let raw = body
                        .get(at..at + BP_BYTES)
                        .ok_or(EndOfChain::Malformed("block pointer past the end"))?;
                    let bp = BlkPtr::read_from_bytes(raw).expect("exact size");
                    at += BP_BYTES;
                    if bp.is_hole() || bp.lsize.get() as u64 != len {
                        return Err(EndOfChain::Malformed("bad block pointer in a record"));
                    }
                    Record::Indirect { txg, offset, bp }
                }
                _ => return Err(EndOfChain::Malformed("unknown record kind")),
            });
        }
        Ok(LogBlock {
            chain,
            seq,
            max_txg: u64_at(bytes, 24),
            next: BlockAddr {
                vdev: u32_at(bytes, 32),
                len: u32_at(bytes, 36),
                offset: u64_at(bytes, 40),
            },
            records,
        })
    }
}

/// Whether `bytes` hold a whole log block whose checksum matches (of any chain).
fn is_intact(bytes: &[u8]) -> bool {
    LogBlock::expected_checksum(bytes).is_some_and(|sum| sum == bytes[64..96])
}

/// Whether `bytes` hold block `seq` of chain `chain`, whole: what a verified read of a log
/// block accepts. An intact block of another chain or sequence number is a wrong copy, as a
/// data block whose checksum is not its pointer's is: a mirror child or raidz column that
/// missed the block's write (its device full or failing while the others took it) still
/// holds what an earlier pass of the log wrote there, intact. Taken as the block, it would
/// end the chain early and lose the records after it, acknowledged as they were; rejected,
/// the read goes on to the copy that took the write, and the stale one is repaired. (An
/// OpenZFS log block is likewise checked against the sequence number its pointer expects.)
pub fn is_block_of(bytes: &[u8], chain: u64, seq: u64) -> bool {
    is_intact(bytes) && u64_at(bytes, 8) == chain && u64_at(bytes, 16) == seq
}

/// A log block's checksum: Fletcher-4 of the header's first 64 bytes and of the records,
/// each with the pool's fastest kernel, then Fletcher-4 of those two sums (so the header's
/// fields, sequence number and chain included, and the records are both covered). Like
/// OpenZFS's log blocks, a torn or damaged block is what it must catch; SHA-256, the first
/// version's, cost a committer a fifth of a millisecond for a 360 KiB batch.
fn checksum_v2(header: &[u8], body: &[u8]) -> [u8; 32] {
    let mut sums = [0u8; 64];
    let words = fletcher4(header).into_iter().chain(fletcher4(body));
    for (slot, w) in sums.chunks_exact_mut(8).zip(words) {
        slot.copy_from_slice(&w.to_le_bytes());
    }
    let mut out = [0u8; 32];
    for (slot, w) in out.chunks_exact_mut(8).zip(fletcher4(&sums)) {
        slot.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// Follows a chain from `first` (block `first_seq`), reading each block with `read`, given
/// its address and the sequence number expected there (an error: the device cannot be read
/// at all, so whether the chain goes on is unknown), and returns the blocks that continue
/// it, in order, with the reason it ends.
pub fn walk_chain(
    chain: u64,
    first: BlockAddr,
    first_seq: u64,
    read: &mut dyn FnMut(BlockAddr, u64) -> Result<Vec<u8>, String>,
) -> (Vec<LogBlock>, EndOfChain) {
    let mut out = Vec::new();
    let (mut at, mut seq) = (first, first_seq);
    loop {
        if at.is_none() {
            return (out, EndOfChain::NoBlock);
        }
        let bytes = match read(at, seq) {
            Ok(b) => b,
            Err(why) => return (out, EndOfChain::Unreadable(why)),
        };
        match LogBlock::decode(&bytes, chain, seq) {
            Ok(b) => {
                at = b.next;
                seq += 1;
                out.push(b);
            }
            Err(EndOfChain::BadChecksum) => {
                let end = match claimed_next(&bytes, chain, seq) {
                    Some(next) => EndOfChain::Damaged {
                        seq,
                        at,
                        later: count_later(chain, next, seq + 1, read),
                    },
                    None => EndOfChain::BadChecksum,
                };
                return (out, end);
            }
            Err(end) => return (out, end),
        }
    }
}

/// Whether the header of `bytes` names it block `seq` of chain `chain`, whatever its
/// checksum says (see `claimed_next`).
pub fn names_block(bytes: &[u8], chain: u64, seq: u64) -> bool {
    claimed_next(bytes, chain, seq).is_some()
}

/// The next block named by `bytes`, if its header names it block `seq` of chain `chain`
/// (whatever its checksum says): a block of this chain whose checksum fails was written
/// there, not left over from an older use of the space, which would name another chain
/// or sequence number.
fn claimed_next(bytes: &[u8], chain: u64, seq: u64) -> Option<BlockAddr> {
    let ours = bytes.len() >= HEADER_BYTES
        && [MAGIC, MAGIC_V1].contains(&u64_at(bytes, 0))
        && u64_at(bytes, 8) == chain
        && u64_at(bytes, 16) == seq;
    ours.then(|| BlockAddr {
        vdev: u32_at(bytes, 32),
        len: u32_at(bytes, 36),
        offset: u64_at(bytes, 40),
    })
}

/// How many blocks continue the chain from `at` (block `seq`), up to `LOOKAHEAD`: past a
/// damaged block, only to tell what its damage lost. Read, never replayed: their records
/// would apply later writes without the damaged block's.
fn count_later(
    chain: u64,
    mut at: BlockAddr,
    mut seq: u64,
    read: &mut dyn FnMut(BlockAddr, u64) -> Result<Vec<u8>, String>,
) -> u64 {
    let mut n = 0;
    while n < LOOKAHEAD && !at.is_none() {
        let Ok(bytes) = read(at, seq) else { break };
        let Ok(b) = LogBlock::decode(&bytes, chain, seq) else {
            break;
        };
        n += 1;
        at = b.next;
        seq += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn write(txg: u64, offset: u64, byte: u8, n: usize) -> Record {
        Record::Write {
            txg,
            offset,
            data: Payload::owned(vec![byte; n]),
        }
    }

    fn addr(i: u64) -> BlockAddr {
        BlockAddr {
            vdev: (i % 3) as u32,
            len: 8192,
            offset: i * 8192,
        }
    }

    /// Reads a simulated disk: space never written reads as zeros.
    fn read_from(
        disk: &HashMap<BlockAddr, Vec<u8>>,
    ) -> impl FnMut(BlockAddr, u64) -> Result<Vec<u8>, String> + '_ {
        |a, _| Ok(disk.get(&a).cloned().unwrap_or(vec![0; a.len as usize]))
    }

    /// A chain of `n` blocks on a simulated disk: block i at addr(i), naming addr(i + 1).
    fn chain_on_disk(chain: u64, n: u64) -> (HashMap<BlockAddr, Vec<u8>>, Vec<LogBlock>) {
        let mut disk = HashMap::new();
        let mut blocks = Vec::new();
        for i in 0..n {
            let b = LogBlock {
                chain,
                seq: i + 1,
                max_txg: 10 + i,
                next: addr(i + 1),
                records: vec![
                    write(10 + i, i * 4096, i as u8, 4096),
                    Record::Zero {
                        txg: 10 + i,
                        offset: 1 << 20,
                        len: 512,
                    },
                    write(10 + i, 7, 0xee, 13),
                ],
            };
            disk.insert(addr(i), b.encode(8192).to_vec());
            blocks.push(b);
        }
        (disk, blocks)
    }

    /// A log left by a version that wrote SHA-256 blocks still replays, and each version's
    /// checksum is only accepted under its own magic.
    #[test]
    fn first_version_blocks_still_decode() {
        let (disk, blocks) = chain_on_disk(42, 1);
        let mut v1 = disk[&addr(0)].clone();
        v1[..8].copy_from_slice(b"ZETAZIL1");
        let body_len = u32_at(&v1, 48) as usize;
        let mut h = Sha256::new();
        h.update(&v1[..64]);
        h.update(&v1[HEADER_BYTES..HEADER_BYTES + body_len]);
        let sha: [u8; 32] = h.finalize().into();
        let v2_sum = v1[64..96].to_vec();
        v1[64..96].copy_from_slice(&sha);
        assert!(is_intact(&v1));
        assert_eq!(LogBlock::decode(&v1, 42, 1), Ok(blocks[0].clone()));
        // The new checksum under the old magic, and the old one under the new magic: torn.
        let mut mixed = v1.clone();
        mixed[64..96].copy_from_slice(&v2_sum);
        assert_eq!(
            LogBlock::decode(&mixed, 42, 1),
            Err(EndOfChain::BadChecksum)
        );
        let mut mixed = disk[&addr(0)].clone();
        mixed[64..96].copy_from_slice(&sha);
        assert_eq!(
            LogBlock::decode(&mixed, 42, 1),
            Err(EndOfChain::BadChecksum)
        );
        // Every header field is covered: the sequence number, say.
        let mut bumped = disk[&addr(0)].clone();
        bumped[16] ^= 1;
        assert!(!is_intact(&bumped));
    }

    #[test]
    fn a_block_round_trips() {
        let (disk, blocks) = chain_on_disk(42, 1);
        assert_eq!(
            LogBlock::decode(&disk[&addr(0)], 42, 1),
            Ok(blocks[0].clone())
        );
    }

    #[test]
    fn the_chain_ends_at_the_first_block_never_written() {
        let (disk, blocks) = chain_on_disk(7, 5);
        let (got, end) = walk_chain(7, addr(0), 1, &mut read_from(&disk));
        assert_eq!(got, blocks);
        assert_eq!(end, EndOfChain::NoBlock);
        // Nothing ever written there (zeros): also the end.
        // A device that cannot be read: the walk says so rather than claiming an end.
        let (got, end) = walk_chain(7, addr(0), 1, &mut |a, seq| {
            if a == addr(3) {
                Err("vdev 0 is missing".into())
            } else {
                read_from(&disk)(a, seq)
            }
        });
        assert_eq!(
            (got.len(), end),
            (3, EndOfChain::Unreadable("vdev 0 is missing".into()))
        );
    }

    #[test]
    fn a_torn_or_damaged_block_ends_the_chain_there() {
        let (mut disk, blocks) = chain_on_disk(7, 5);
        // Block 3 torn: its second sector never reached the disk.
        let b = disk.get_mut(&addr(2)).unwrap();
        b[4096..].fill(0);
        let (got, end) = walk_chain(7, addr(0), 1, &mut read_from(&disk));
        assert_eq!(got, blocks[..2]);
        // Its header still names it: told apart from a block never written, with the two
        // written beside it counted (a batch writes up to four at once: it may be torn).
        let damaged = EndOfChain::Damaged {
            seq: 3,
            at: addr(2),
            later: 2,
        };
        assert_eq!(end, damaged);
        assert!(!end.written_whole());
        // One flipped bit in a header field, with more blocks after it than a batch writes
        // at once: it was written whole, and damaged since.
        let (mut disk, _) = chain_on_disk(7, 8);
        disk.get_mut(&addr(1)).unwrap()[30] ^= 1;
        let (got, end) = walk_chain(7, addr(0), 1, &mut read_from(&disk));
        let damaged = EndOfChain::Damaged {
            seq: 2,
            at: addr(1),
            later: 6,
        };
        assert_eq!((got.len(), &end), (1, &damaged));
        assert!(end.written_whole());
        // The count stops at LOOKAHEAD.
        let (mut disk, _) = chain_on_disk(7, 40);
        disk.get_mut(&addr(0)).unwrap()[200] ^= 1;
        let (_, end) = walk_chain(7, addr(0), 1, &mut read_from(&disk));
        assert!(
            matches!(
                end,
                EndOfChain::Damaged {
                    later: LOOKAHEAD,
                    ..
                }
            ),
            "{end:?}"
        );
        // A header that names another chain or sequence number is not this chain's block,
        // whatever its checksum: the plain end of a chain, as space never written.
        for field in [8, 16] {
            let (mut disk, _) = chain_on_disk(7, 5);
            disk.get_mut(&addr(1)).unwrap()[field] ^= 1;
            let (got, end) = walk_chain(7, addr(0), 1, &mut read_from(&disk));
            assert_eq!((got.len(), end), (1, EndOfChain::BadChecksum), "{field}");
        }
    }

    #[test]
    fn a_stale_block_of_an_older_chain_ends_the_chain() {
        // The new chain's third block was never written; the old chain's block there is valid
        // in itself but belongs to another chain (or an older sequence).
        let (mut disk, blocks) = chain_on_disk(8, 2);
        let (old, _) = chain_on_disk(7, 5);
        disk.insert(addr(2), old[&addr(2)].clone());
        let (got, end) = walk_chain(8, addr(0), 1, &mut read_from(&disk));
        assert_eq!(got, blocks);
        assert_eq!(end, EndOfChain::OtherChain);
        // Same chain id, but a block from an earlier pass of the chain: out of sequence.
        let (mut disk, _) = chain_on_disk(9, 2);
        let (older, _) = chain_on_disk(9, 1);
        disk.insert(addr(2), older[&addr(0)].clone());
        let (got, end) = walk_chain(9, addr(0), 1, &mut read_from(&disk));
        assert_eq!(got.len(), 2);
        assert_eq!(
            end,
            EndOfChain::OutOfSequence {
                expected: 3,
                found: 1
            }
        );
    }

    #[test]
    fn records_that_fit_and_malformed_input() {
        let recs: Vec<Record> = (0..10).map(|i| write(1, i * 4096, 1, 4096)).collect();
        // 96 header + 2 x (32 + 4096) = 8352 > 8192: one fits in 8 KiB, three in 16 KiB.
        assert_eq!(records_that_fit(&recs, 8192), 1);
        assert_eq!(records_that_fit(&recs, 16384), 3);
        assert_eq!(records_that_fit(&recs[..0], 4096), 0);
        // Garbage never panics.
        for len in [0usize, 10, 95, 96, 4096] {
            let junk: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            assert!(LogBlock::decode(&junk, 1, 1).is_err());
        }
        // A block of one write record, its header or record changed by `edit` and its
        // checksum made valid again: what only a crafted block holds.
        let resealed = |edit: &dyn Fn(&mut [u8])| {
            let mut b = LogBlock {
                chain: 1,
                seq: 1,
                max_txg: 1,
                next: BlockAddr::default(),
                records: vec![write(1, 0, 1, 8)],
            }
            .encode(4096);
            edit(&mut b);
            let body_len = u32_at(&b, 48) as usize;
            let sum = checksum_v2(&b[..64], &b[HEADER_BYTES..HEADER_BYTES + body_len]);
            b[64..96].copy_from_slice(&sum);
            b
        };
        // A record count that lies: malformed, not a panic.
        let b = resealed(&|b| b[52] = 5);
        assert!(matches!(
            LogBlock::decode(&b, 1, 1),
            Err(EndOfChain::Malformed(_))
        ));
        // A write record whose length runs past the end of the address space (the offset
        // after it would wrap to the block's start): malformed, not a panic.
        let b = resealed(&|b| {
            let len_at = HEADER_BYTES + 24;
            let len = u64::MAX - RECORD_HEADER as u64 + 1;
            b[len_at..len_at + 8].copy_from_slice(&len.to_le_bytes());
        });
        assert!(matches!(
            LogBlock::decode(&b, 1, 1),
            Err(EndOfChain::Malformed(_))
        ));
    }
}
