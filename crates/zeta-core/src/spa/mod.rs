//! Pool primitives: block pointers, labels and uberblocks, the metaslab allocator and its
//! space-map records.
//!
//! Architecture invariant: `spa` knows nothing of objects or volumes. It decides where bytes
//! go and how a pool identifies itself; what the bytes mean is decided above it.

pub mod bp;
pub mod feature;
pub mod frag;
pub mod label;
pub mod metaslab;
pub mod props;
pub mod range_tree;
pub mod scan_state;
pub mod space_map;

pub use bp::{BlkPtr, BlockKind, Dva, Dvas};
pub use metaslab::{AllocClass, AllocError, Allocator, PoolMap, Space, SpaceGauge};
