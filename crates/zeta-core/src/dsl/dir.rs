//! The directory of volumes: one 512-byte entry per volume in the MOS directory object.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::spa::BlkPtr;

pub const ENTRY_BYTES: usize = 512;
pub const NAME_BYTES: usize = 256;

/// `DirEntryPhys::flags`: the volume takes no write from clients (`readonly=on`).
pub const FLAG_READONLY: u8 = 1;
/// The flags this zeta knows; an entry with another is refused at import.
pub const KNOWN_FLAGS: u8 = FLAG_READONLY;

#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct DirEntryPhys {
    /// UTF-8, NUL-padded; an all-zero name marks an unused entry.
    pub name: [u8; NAME_BYTES],
    pub guid: U64,
    pub volsize: U64,
    pub volblocksize: U32,
    pub checksum: u8,
    pub pad: [u8; 3],
    pub created_txg: U64,
    /// The volume's intent-log header (`zil::ZilHeader`).
    pub zil: [u8; 32],
    /// While the volume's log waits for its replay: the txg its records are counted from
    /// (those of later txgs are replayed). Zero otherwise.
    pub replay_after: U64,
    /// With feature `org.zeta:refreservation`: the bytes kept free for the volume, whether
    /// written yet or not (zero: sparse). Zero in pools written without the feature.
    pub refreservation: U64,
    /// With feature `org.zeta:snapshots`: the volume's head record in the dataset table
    /// (`dsl::dataset`), 0 while it has none (it never had a snapshot).
    pub dataset_id: U64,
    /// With feature `org.zeta:volume_flags`: `FLAG_READONLY`. Zero in pools written
    /// without the feature.
    pub flags: u8,
    pub pad2: [u8; 7],
    /// With feature `org.zeta:receive_resume`, while a `zeta receive -s` is interrupted: the
    /// guid of the snapshot being received (0: none is), the base's guid (0: a full stream),
    /// and the volume byte offset up to which its records are applied and durable.
    pub recv_to_guid: U64,
    pub recv_from_guid: U64,
    pub recv_offset: U64,
    pub reserved: [u8; 8],
    pub objset: BlkPtr,
}
const _: () = assert!(std::mem::size_of::<DirEntryPhys>() == ENTRY_BYTES);

impl DirEntryPhys {
    pub fn name(&self) -> Option<String> {
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(NAME_BYTES);
        if end == 0 {
            return None;
        }
        String::from_utf8(self.name[..end].to_vec()).ok()
    }

    pub fn set_name(&mut self, name: &str) {
        assert!(name.len() < NAME_BYTES);
        self.name = [0; NAME_BYTES];
        self.name[..name.len()].copy_from_slice(name.as_bytes());
    }
}

/// Checks a volume name: 1-200 bytes of letters, digits, `-`, `_`, `.`, `:`.
pub fn valid_volume_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= crate::spa::label::MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}
