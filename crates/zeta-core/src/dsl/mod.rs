//! The pool as a whole: the meta object set (MOS) with its directory of volumes and its space
//! maps, transaction-group sync, create, import and export. It sits above `dmu` because the MOS
//! is made of objects; the pool primitives it uses live in `spa`.
//!
//! Architecture invariant: only `dsl::pool` writes uberblocks and labels, and only its sync
//! thread moves a txg from open to committed.

pub mod dataset;
pub mod dir;
pub mod pool;
pub mod stream;

pub use crate::dmu::arc::ListSizes;
pub use crate::dmu::CacheStats;
/// What the layers above name when they build, import and inspect a pool, so that they reach
/// the engine through `dsl` and `zvol` alone: the devices a pool is made of, the shape of a
/// vdev, a leaf's injected faults, the label's view of a pool, the scan's phase, the intent
/// log's policies, `Pool::metaslab_map`'s answer, and the free space of the file system under
/// a file device.
pub use crate::spa::label::{PoolConfig, PoolState};
pub use crate::spa::props::{CommitPolicy, Placement};
pub use crate::spa::scan_state::ScanPhase;
pub use crate::spa::PoolMap;
pub use crate::vdev::file::free_bytes;
/// Devices named by a scheme (`rados:`) as well as files: how the front ends open devices.
pub use crate::vdev::{scheme as devices, DeviceOptions};
pub use crate::vdev::{BlockDevice, FileDevice, Injection, RaidzConfig, TopKind, VdevError};
pub use crate::zio::compress::Compression;
pub use pool::{
    examine, examine_labels, human, labelclear, panic_text, probe, Contents, Dataset, LeafStatus,
    OpenTxg, Pool, PoolError, PoolOptions, RecvState, Suspension, TopSpec, TopStatus, UsableSpace,
    DEFAULT_VOLBLOCKSIZE, IN_PLACE_MIN_BYTES,
};
