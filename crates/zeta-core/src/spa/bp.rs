//! Block pointers: how every block is addressed. A block pointer holds up to three addresses
//! (DVAs) of identical copies, the block's sizes, birth txg and the checksum of its contents;
//! the checksum lives in the parent, so the pool is a Merkle tree rooted at the uberblock.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use zeta_math::{Checksum, ChecksumKind};

/// Data virtual address: one copy of a block on one top-level vdev.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct Dva {
    pub vdev: U32,
    /// Allocated bytes (a multiple of the sector size); 0 marks an unused slot.
    pub asize: U32,
    /// Byte offset from the start of the vdev's allocatable area.
    pub offset: U64,
}

impl Dva {
    pub fn new(vdev: u32, offset: u64, asize: u32) -> Dva {
        Dva {
            vdev: vdev.into(),
            asize: asize.into(),
            offset: offset.into(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.asize.get() == 0
    }
}

/// The copies of one block as the allocator hands them out: one to three DVAs, kept inline
/// (a block is allocated for every 16K of a volume's writes, and a heap vector for each was a
/// third of the allocator calls on that path). Reads as the slice of the copies placed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dvas {
    slots: [Dva; 3],
    len: u8,
}

impl Dvas {
    /// Adds a copy; a block has at most three.
    pub fn push(&mut self, d: Dva) {
        assert!(!d.is_empty(), "an empty DVA is not a copy");
        self.slots[self.len as usize] = d;
        self.len += 1;
    }

    /// The copies as a block pointer stores them: unused slots empty.
    pub fn slots(&self) -> [Dva; 3] {
        self.slots
    }
}

impl std::ops::Deref for Dvas {
    type Target = [Dva];
    fn deref(&self) -> &[Dva] {
        &self.slots[..self.len as usize]
    }
}

/// What a block holds; recorded so tools can walk the pool without context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum BlockKind {
    Data = 1,
    Indirect = 2,
    Objset = 3,
    Directory = 4,
    SpaceMap = 5,
    MetaslabTable = 6,
    DatasetTable = 7,
    Deadlist = 8,
}

impl BlockKind {
    pub fn from_u8(v: u8) -> Option<BlockKind> {
        Some(match v {
            1 => BlockKind::Data,
            2 => BlockKind::Indirect,
            3 => BlockKind::Objset,
            4 => BlockKind::Directory,
            5 => BlockKind::SpaceMap,
            6 => BlockKind::MetaslabTable,
            7 => BlockKind::DatasetTable,
            8 => BlockKind::Deadlist,
            _ => return None,
        })
    }
}

pub const BP_BYTES: usize = 128;

/// The on-disk block pointer, 128 bytes, little-endian. A pointer whose `birth_txg` is 0 is a
/// hole: the block was never written (or was freed) and reads as zeros.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct BlkPtr {
    pub dva: [Dva; 3],
    /// Logical bytes (what the reader gets) and physical bytes (what was checksummed and
    /// written before padding to `asize`). Equal until compression exists.
    pub lsize: U32,
    pub psize: U32,
    pub birth_txg: U64,
    /// Number of non-hole data blocks beneath this pointer (1 for a data block).
    pub fill: U64,
    pub checksum_kind: u8,
    pub compression: u8,
    pub level: u8,
    pub kind: u8,
    /// `BP_GANG`, or 0.
    pub flags: u8,
    pub reserved0: [u8; 3],
    /// For a gang block: what its header copies and every copy of its pieces take together
    /// (its `asize_total`, known without reading the header). 0 otherwise.
    pub gang_asize: U64,
    pub reserved1: [u8; 8],
    pub checksum: [u8; 32],
}

/// `BlkPtr::flags`: the block is a gang block. Its DVAs are copies of a gang header
/// (`zio::gang`) naming the pieces its bytes were written in, where no free segment could take
/// them whole; `checksum` is still that of the whole block's `psize` bytes.
pub const BP_GANG: u8 = 1;

const _: () = assert!(std::mem::size_of::<BlkPtr>() == BP_BYTES);
const _: () = assert!(std::mem::size_of::<Dva>() == 16);

impl BlkPtr {
    pub const HOLE: BlkPtr = BlkPtr {
        dva: [Dva {
            vdev: U32::ZERO,
            asize: U32::ZERO,
            offset: U64::ZERO,
        }; 3],
        lsize: U32::ZERO,
        psize: U32::ZERO,
        birth_txg: U64::ZERO,
        fill: U64::ZERO,
        checksum_kind: 0,
        compression: 0,
        level: 0,
        kind: 0,
        flags: 0,
        reserved0: [0; 3],
        gang_asize: U64::ZERO,
        reserved1: [0; 8],
        checksum: [0; 32],
    };

    pub fn is_hole(&self) -> bool {
        self.birth_txg.get() == 0
    }

    pub fn dvas(&self) -> impl Iterator<Item = &Dva> {
        self.dva.iter().filter(|d| !d.is_empty())
    }

    pub fn checksum_kind(&self) -> Option<ChecksumKind> {
        ChecksumKind::from_u8(self.checksum_kind)
    }

    pub fn checksum(&self) -> Checksum {
        Checksum(self.checksum)
    }

    pub fn kind(&self) -> Option<BlockKind> {
        BlockKind::from_u8(self.kind)
    }

    /// Whether the block is a gang block (`BP_GANG`).
    pub fn is_gang(&self) -> bool {
        self.flags & BP_GANG != 0
    }

    /// Allocated bytes over all copies (of a gang block: its headers' and its pieces').
    pub fn asize_total(&self) -> u64 {
        if self.is_gang() {
            return self.gang_asize.get();
        }
        self.dvas().map(|d| d.asize.get() as u64).sum()
    }
}

/// Reads an array of block pointers out of an indirect block.
pub fn bps_from_bytes(bytes: &[u8]) -> Vec<BlkPtr> {
    assert_eq!(bytes.len() % BP_BYTES, 0);
    bytes
        .chunks_exact(BP_BYTES)
        .map(|c| BlkPtr::read_from_bytes(c).expect("exact size"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_hole() {
        let mut bp = BlkPtr::HOLE;
        assert!(bp.is_hole());
        bp.dva[0] = Dva::new(2, 1 << 30, 16384);
        bp.birth_txg = 7.into();
        bp.checksum = [9; 32];
        bp.checksum_kind = ChecksumKind::Sha256 as u8;
        let bytes = bp.as_bytes().to_vec();
        assert_eq!(bytes.len(), 128);
        // Little-endian at fixed offsets: vdev id in bytes 0..4, offset in 8..16.
        assert_eq!(&bytes[0..4], &2u32.to_le_bytes());
        assert_eq!(&bytes[8..16], &(1u64 << 30).to_le_bytes());
        let back = bps_from_bytes(&bytes)[0];
        assert_eq!(back, bp);
        assert_eq!(back.dvas().count(), 1);
        assert_eq!(back.asize_total(), 16384);
        assert_eq!(back.checksum_kind(), Some(ChecksumKind::Sha256));
    }
}
