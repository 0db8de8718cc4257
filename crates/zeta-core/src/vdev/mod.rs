//! Device layer: leaf devices behind one small trait, and the top-level vdevs built from them.
//!
//! Architecture invariant: `vdev` knows nothing of checksums, blocks or objects. It moves bytes
//! at offsets; a caller that wants verified reads passes a verifier closure. Only `vdev::file`
//! touches file descriptors.

pub mod device;
pub mod file;
pub mod io;
pub mod layout;
pub mod leaf;
pub mod mem;
pub mod raidz;
pub mod scheme;
pub mod sector_vec;
pub mod sniff;
pub mod top;

pub use device::{BlockDevice, VdevError};
pub use file::FileDevice;
pub(crate) use io::waiting_in_parallel;
pub use io::{ReadReport, Unsettled};
pub use layout::{LABEL_COUNT, LABEL_SIZE, RESERVE_BYTES, SECTOR};
pub use leaf::{Injection, Leaf, LeafCounters, TxgRanges};
pub use mem::MemDevice;
pub use raidz::{RaidzCode, RaidzConfig, ShapeError};
pub use scheme::{DeviceOptions, DeviceScheme};
pub use sector_vec::SectorVec;
pub use top::{TopKind, TopVdev};

pub type Result<T> = std::result::Result<T, VdevError>;
