//! Objects: dnodes, copy-on-write block-pointer trees with indirect blocks, dirty buffers per
//! txg, a bounded cache of recently used blocks, and the one call that writes a byte range
//! into an object (`write::Writer`).
//!
//! Architecture invariant: `dmu` knows nothing of volumes, names or devices. An object is a
//! sparse array of equal-sized blocks; what the blocks mean is its user's business.

pub mod arc;
pub mod cache;
pub mod dnode;
pub mod object;
pub mod range_lock;
pub mod write;
pub mod zfetch;

pub use cache::{BlockCache, CacheStats};
pub use dnode::{DnodePhys, ObjectKind, ObjsetPhys, IND_BLOCK_BYTES, IND_SHIFT};
pub use object::{Dirty, Object, ObjectIo};
pub use range_lock::RangeLocks;
