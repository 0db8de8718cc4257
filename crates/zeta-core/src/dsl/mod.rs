//! The pool as a whole: the meta object set (MOS) with its directory of volumes and its space
//! maps, transaction-group sync, create, import and export. It sits above `dmu` because the MOS
//! is made of objects; the pool primitives it uses live in `spa`.
//!
//! Architecture invariant: only `dsl::pool` writes uberblocks and labels, and only its sync
//! thread moves a txg from open to committed.

pub mod dir;
pub mod pool;
pub mod scan;

/// `Pool::metaslab_map`'s answer, for the layers above that do not reach into `spa`.
pub use crate::spa::PoolMap;
pub use pool::{
    examine, examine_labels, labelclear, panic_text, probe, Contents, Dataset, LeafStatus, Pool,
    PoolError, PoolOptions, Suspension, TopSpec, TopStatus, UsableSpace, DEFAULT_VOLBLOCKSIZE,
    IN_PLACE_MIN_BYTES,
};
