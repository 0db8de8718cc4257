//! Math layer: checksums, RAID-Z parity kernels, and the zero test that makes holes.
//!
//! Architecture invariant: `math` knows nothing of pools, devices or objects; it maps bytes to
//! bytes. Every kernel has a scalar reference that tests compare against.

pub mod checksum;
pub mod fletcher;
pub mod fletcher2;
pub mod parity;
pub(crate) mod select;
pub mod zero;

pub use checksum::{Checksum, ChecksumKind};
