//! On-disk object descriptions: the dnode (256 bytes) and the object-set block (4 KiB) that
//! holds a fixed table of dnodes. See docs/format.md.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::spa::BlkPtr;

/// Whether an object may have data blocks of `bytes`: a power of two from 4 KiB to 128 KiB.
/// A volume chooses its own (`Pool::create_volume`); the MOS objects' are 4K and 16K. Import
/// holds what it reads from disk to the same rule.
pub fn is_data_block_size(bytes: u32) -> bool {
    bytes.is_power_of_two() && (4096..=131072).contains(&bytes)
}

/// Indirect blocks are 16 KiB: 128 block pointers each.
pub const IND_BLOCK_BYTES: usize = 16 * 1024;
pub const IND_SHIFT: u32 = 7;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ObjectKind {
    VolumeData = 1,
    Directory = 2,
    SpaceMap = 3,
    MetaslabTable = 4,
    /// The dataset table (`dsl::dataset`, MOS slot 2): one record per head and snapshot.
    DatasetTable = 5,
    /// A deadlist: 128-byte block pointers, appended.
    Deadlist = 6,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct DnodePhys {
    pub kind: u8,
    /// Levels of the tree: 1 means the root points at data block 0 directly.
    pub nlevels: u8,
    pub checksum: u8,
    pub copies: u8,
    pub data_block_bytes: U32,
    /// Logical size in bytes (a volume's size, a space map's record bytes).
    pub size_bytes: U64,
    /// Bytes the object's tree takes on the devices: every copy of every data and indirect
    /// block, as allocated (`asize`). Kept by `Object::sync` with feature
    /// `org.zeta:space_used`; zero (unknown) in pools written without it.
    pub used_bytes: U64,
    /// How new data blocks are stored: the `compression` property (`zio::compress::
    /// Compression::to_phys`: codec 0 off, 1 lz4, 2 zstd, and zstd's level). Zero in pools
    /// written before feature `org.zeta:compression`: off.
    pub compress: u8,
    pub compress_level: u8,
    pub reserved0: [u8; 6],
    /// What the tree's blocks hold and what they store, each block counted once (not per
    /// copy): the sum of their `lsize`, and of their `psize`. Their ratio is the
    /// `compressratio`. Kept by `Object::sync` with feature `org.zeta:compression`; counted
    /// once at the upgrade of a pool written without it.
    pub logical_bytes: U64,
    pub physical_bytes: U64,
    pub reserved: [u8; 80],
    pub root: BlkPtr,
}
pub const DNODE_BYTES: usize = 256;
const _: () = assert!(std::mem::size_of::<DnodePhys>() == DNODE_BYTES);

impl DnodePhys {
    pub fn new(kind: ObjectKind, data_block_bytes: u32, checksum: u8, copies: u8) -> DnodePhys {
        DnodePhys {
            kind: kind as u8,
            nlevels: 1,
            checksum,
            copies,
            data_block_bytes: data_block_bytes.into(),
            size_bytes: 0.into(),
            used_bytes: 0.into(),
            compress: 0,
            compress_level: 0,
            reserved0: [0; 6],
            logical_bytes: 0.into(),
            physical_bytes: 0.into(),
            reserved: [0; 80],
            root: BlkPtr::HOLE,
        }
    }

    /// Data blocks addressable with the current number of levels.
    pub fn capacity_blocks(&self) -> u64 {
        1u64.checked_shl(IND_SHIFT * (self.nlevels as u32 - 1))
            .unwrap_or(u64::MAX)
    }
}

pub const OBJSET_BYTES: usize = 4096;
pub const OBJSET_SLOTS: usize = 15;
pub const OBJSET_MAGIC: u64 = u64::from_le_bytes(*b"ZETAOBJS");

#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct ObjsetPhys {
    pub magic: U64,
    /// 1 = meta object set, 2 = volume.
    pub kind: U64,
    /// Reserved for the intent-log header.
    pub reserved: [u8; 240],
    pub dnodes: [DnodePhys; OBJSET_SLOTS],
}
const _: () = assert!(std::mem::size_of::<ObjsetPhys>() == OBJSET_BYTES);

pub const OBJSET_MOS: u64 = 1;
pub const OBJSET_VOLUME: u64 = 2;

impl ObjsetPhys {
    pub fn new(kind: u64) -> ObjsetPhys {
        let mut os = ObjsetPhys::new_zeroed_helper();
        os.magic = OBJSET_MAGIC.into();
        os.kind = kind.into();
        os
    }

    fn new_zeroed_helper() -> ObjsetPhys {
        <ObjsetPhys as zerocopy::FromZeros>::new_zeroed()
    }

    pub fn decode(bytes: &[u8], expect_kind: u64) -> Option<ObjsetPhys> {
        let os = ObjsetPhys::read_from_bytes(bytes.get(..OBJSET_BYTES)?).ok()?;
        (os.magic.get() == OBJSET_MAGIC && os.kind.get() == expect_kind).then_some(os)
    }
}
