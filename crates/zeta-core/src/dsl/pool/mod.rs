//! Pool lifecycle and transaction groups.
//!
//! This file holds the pool's state and its lifecycle: create, import, export, status and
//! volumes. The rest is split by concern: `write` (open-context writes, admission, the
//! throttle), `intent` (the intent log's hooks into the pool), `sync` (the sync thread and
//! one sync pass), `labels` (label updates that survive a failing leaf), `devices` (device
//! changes while running) and `mos` (the meta object set's objects).
//!
//! A txg is *open* while writers add dirty blocks to it; the sync thread closes it (so new
//! writes go to the next txg), writes its blocks copy-on-write, then the MOS, flushes every
//! leaf, writes the uberblock into every label, and flushes again. Only then is the txg
//! committed. See docs/format.md for why a crash at any point leaves the previous txg intact.

mod devices;
mod examine;
mod growth;
mod import;
mod intent;
mod labels;
mod mos;
mod prefetch;
mod promote;
mod reserve;
mod scan;
mod send;
mod snapshot;
mod sync;
mod write;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::dmu::dnode::is_data_block_size;
use crate::dmu::object::walk;
use crate::dmu::{BlockCache, Dirty, DnodePhys, Object, ObjectIo, ObjectKind};
use crate::dsl::dir::valid_volume_name;
use crate::spa::label::{
    cut_to, encode_config, fit_config, fits_as_it_grows, read_labels, write_config, ConfigTooLarge,
    LabelError, PoolConfig, PoolState, FORMAT_VERSION, MAX_HOLDER_BYTES, MAX_HOSTNAME_BYTES,
};
use crate::spa::props::{CommitPolicy, Placement};
use crate::spa::scan_state::{ScanPhase, ScanState};
use crate::spa::{AllocClass, AllocError, Allocator, BlkPtr, BlockKind, PoolMap, Space};
use crate::vdev::{BlockDevice, Leaf, RaidzConfig, TopKind, TopVdev, VdevError};
use crate::zil::{Log, Zil};
use crate::zio::{Zio, ZioError};
use zeta_math::ChecksumKind;

use devices::build_top;
use labels::LabelUpdate;
use mos::{alloc_geometry, empty_mos};
use scan::{ScanSlot, Scanning};
use sync::{sync_thread, PoolHooks, Txgs};
use write::Admission;

pub use examine::{examine, examine_labels, labelclear, Contents};
pub use intent::{IN_PLACE_BATCH_BYTES, IN_PLACE_MIN_BYTES};
pub use prefetch::PrefetchStats;
pub use reserve::human;
pub use send::SendSummary;
pub use snapshot::SnapFigures;
pub use write::OpenTxg;

/// Smallest usable leaf: room for a few metaslabs after the labels.
pub const MIN_LEAF_BYTES: u64 = 64 << 20;
const DIR_BLOCK_BYTES: u32 = 16 * 1024;
const MSTABLE_BLOCK_BYTES: u32 = 16 * 1024;
const SM_BLOCK_BYTES: u32 = 4096;
/// The longest a scan waits for busy volumes before its next batch of blocks.
const SCAN_YIELD_MAX: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Vdev(#[from] VdevError),
    #[error(transparent)]
    Label(#[from] LabelError),
    #[error(transparent)]
    Zio(#[from] ZioError),
    #[error(transparent)]
    Shape(#[from] crate::vdev::ShapeError),
    #[error("{0}")]
    Invalid(String),
    #[error("{path}: belongs to pool '{pool}' ({state:?}); use -f to overwrite it")]
    InUse {
        path: String,
        pool: String,
        state: PoolState,
    },
    #[error("{path}: carries a zeta label this zeta cannot read: {why}; use -f to overwrite it")]
    UnreadableLabel { path: String, why: String },
    #[error("no pool found{0}")]
    NotFound(String),
    #[error("pool '{pool}': cannot import: {why}")]
    CannotImport { pool: String, why: String },
    #[error("out of space in pool '{0}'")]
    NoSpace(String),
    #[error(
        "{vol}: a volume of {} reserves {} of raw space, and the pool has {} raw free beside \
         the other volumes' reservations; use -s for a sparse volume, which reserves nothing",
        reserve::human(*volsize),
        reserve::human(*need),
        reserve::human(*avail)
    )]
    CannotReserve {
        vol: String,
        volsize: u64,
        need: u64,
        avail: u64,
    },
    #[error("volume '{0}' does not exist")]
    NoSuchVolume(String),
    #[error("volume '{0}' already exists")]
    VolumeExists(String),
    #[error("snapshot '{0}' does not exist")]
    NoSuchSnapshot(String),
    #[error("snapshot '{0}' already exists")]
    SnapshotExists(String),
    #[error("'{0}' is a snapshot, which cannot be changed")]
    ReadOnlySnapshot(String),
    #[error("volume '{0}' is set readonly=on: zeta set readonly=off to write it")]
    ReadOnlyVolume(String),
    #[error(
        "volume '{0}' is partly received: resume the receive (zeta send -t TOKEN | zeta \
         receive -s; zeta get receive_resume_token gives TOKEN), or give it up (zeta receive -A)"
    )]
    PartlyReceived(String),
    #[error(
        "pool '{0}' is imported read-only: export it and import it again without \
         `-o readonly=on` to change it"
    )]
    ReadOnly(String),
    /// A wait for a sync given up because the pool waits for room (the sync goes on, and
    /// commits once room is made): for the intent log, whose sync requests must not wait.
    #[error("pool '{pool}' waits for room on its devices' file systems: {why}")]
    WaitingForRoom { pool: String, why: String },
    #[error("pool '{pool}' is suspended after an I/O failure and accepts no more writes: {why}")]
    Suspended {
        pool: String,
        why: String,
        /// The failure was the devices' lack of room (`PoolError::out_of_space`).
        out_of_space: bool,
    },
    #[error("vdev {vdev}: no device took {what}: {why}")]
    VdevLost {
        vdev: u32,
        what: String,
        why: String,
        /// Every leaf that failed had no room for the write.
        out_of_space: bool,
    },
}

impl PoolError {
    /// Whether this failure is a device's lack of room (a full file system under file
    /// devices: `VdevError::out_of_space`), which freeing room there cures, as opposed to
    /// a pool with no free space of its own (`NoSpace`) or a device fault.
    pub fn out_of_space(&self) -> bool {
        match self {
            PoolError::Vdev(e) | PoolError::Zio(ZioError::Write(e)) => e.out_of_space(),
            PoolError::Suspended { out_of_space, .. }
            | PoolError::VdevLost { out_of_space, .. } => *out_of_space,
            PoolError::WaitingForRoom { .. } => true,
            _ => false,
        }
    }
}

impl From<AllocError> for PoolError {
    fn from(e: AllocError) -> Self {
        PoolError::Zio(ZioError::Alloc(e))
    }
}

#[derive(Clone, Debug)]
pub struct PoolOptions {
    pub checksum: ChecksumKind,
    pub txg_timeout: Duration,
    /// While every change in the open txg is in the intent log (made durable by a FLUSH or
    /// FUA, or being made so), a timed sync waits up to this many `txg_timeout`s: the
    /// timeout bounds what a crash could lose, and the log already keeps those changes.
    /// See `sync::sync_thread`.
    pub logged_txg_stretch: u32,
    /// Dirty data (open + syncing txgs) above which writers wait for a sync.
    pub dirty_max_bytes: u64,
    pub cache_bytes: u64,
    /// Overwrite devices that belong to another pool.
    pub force: bool,
    /// At create: how the intent log commits and places its blocks.
    pub zil_commit: CommitPolicy,
    pub zil_placement: Placement,
    /// At import: go on when a volume's intent log cannot be read (a missing log device),
    /// dropping what it held.
    pub discard_log: bool,
    /// Who opens the pool (the CLI: its state directory), recorded in the labels with the
    /// host's name. An import with a holder refuses a pool that was not exported and that
    /// another host or holder had last, unless `force`; one without a holder (tests,
    /// tools) takes any pool.
    pub holder: Option<String>,
    /// At import: the pool's new name.
    pub rename: Option<String>,
    /// At import: open the pool read-only (`zpool import -o readonly=on`). Nothing is written
    /// to its devices: no txg, no label, no intent-log replay (its volumes read as of the
    /// last txg), no scrub or resilver, no repair of a bad copy a read finds; every change is
    /// refused with `PoolError::ReadOnly`.
    pub readonly: bool,
    /// Testing: a txg sync writes every block of more than this many bytes as a gang block
    /// of pieces of at most that size (`zio::gang`; OpenZFS's `metaslab_force_ganging`), so
    /// the gang paths run on a pool with room to spare. `None`: blocks gang only where no
    /// free segment takes them whole.
    pub force_ganging: Option<u64>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            checksum: ChecksumKind::Fletcher4,
            txg_timeout: Duration::from_secs(5),
            logged_txg_stretch: 3,
            dirty_max_bytes: 128 << 20,
            cache_bytes: 256 << 20,
            force: false,
            zil_commit: CommitPolicy::default(),
            zil_placement: Placement::default(),
            discard_log: false,
            holder: None,
            rename: None,
            readonly: false,
            force_ganging: None,
        }
    }
}

/// A top-level vdev to create: its shape and its leaves, already opened, with their paths.
pub struct TopSpec {
    pub shape: Shape,
    pub leaves: Vec<(Arc<dyn BlockDevice>, String)>,
    /// A separate log device (a stripe or a mirror) rather than a data vdev.
    pub log: bool,
}

/// How a top-level vdev to create keeps its blocks: one shape, so a raidz's parameters
/// cannot be given to another kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Stripe,
    Mirror,
    /// Its parity level and code.
    Raidz(RaidzConfig),
}

impl Shape {
    pub fn kind(&self) -> TopKind {
        match self {
            Shape::Stripe => TopKind::Stripe,
            Shape::Mirror => TopKind::Mirror,
            Shape::Raidz(_) => TopKind::Raidz,
        }
    }

    pub fn raidz(&self) -> Option<RaidzConfig> {
        match self {
            Shape::Raidz(rz) => Some(*rz),
            _ => None,
        }
    }
}

impl TopSpec {
    pub fn stripe(leaf: (Arc<dyn BlockDevice>, String)) -> TopSpec {
        TopSpec {
            shape: Shape::Stripe,
            leaves: vec![leaf],
            log: false,
        }
    }

    pub fn mirror(leaves: Vec<(Arc<dyn BlockDevice>, String)>) -> TopSpec {
        TopSpec {
            shape: Shape::Mirror,
            leaves,
            log: false,
        }
    }

    pub fn raidz(config: RaidzConfig, leaves: Vec<(Arc<dyn BlockDevice>, String)>) -> TopSpec {
        TopSpec {
            shape: Shape::Raidz(config),
            leaves,
            log: false,
        }
    }

    /// The same vdev as a separate log device.
    pub fn as_log(mut self) -> TopSpec {
        self.log = true;
        self
    }
}

/// `Pool::usable_space`: bytes volumes can hold, after parity.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct UsableSpace {
    pub size: u64,
    pub free: u64,
    pub freeing: u64,
    /// What of `free` the volumes' reservations keep for their unwritten blocks.
    pub reserved: u64,
    /// What a new volume or a sparse one's writes may still have: `free` less `reserved`.
    pub avail: u64,
    /// The block size the parity was counted for.
    pub block_bytes: u64,
}

/// The block size `zeta pool list` and `create` count usable space for: `vol create`'s
/// default.
pub const DEFAULT_VOLBLOCKSIZE: u64 = 16 << 10;

/// Serializes a 64-bit identifier as a decimal string (for `--json`: JavaScript and `jq`
/// read numbers as doubles, exact only up to 2^53).
pub fn guid_as_string<S: serde::Serializer>(guid: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&guid.to_string())
}

/// Error counters of one leaf, for status displays.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LeafStatus {
    pub path: String,
    /// As a string in JSON: 64-bit identifiers lose precision as JavaScript numbers.
    #[serde(serialize_with = "guid_as_string")]
    pub guid: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub cksum_errors: u64,
    pub repaired_bytes: u64,
    /// ONLINE; UNAVAIL for a device the config names but import did not find; REMOVED
    /// (vanished, by `zeta inject`), FAULTED, OFFLINE; NOSPACE while its writes fail for lack
    /// of room on the file system under it and its siblings take them.
    pub state: &'static str,
}

/// One top-level vdev as status displays show it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TopStatus {
    pub id: u32,
    pub kind: TopKind,
    /// stripe, mirror, raidz1, raidz2, raidz2-rdp, raidz3.
    pub name: String,
    /// A separate log device.
    pub log: bool,
    /// ONLINE; DEGRADED when devices are missing, out of service or out of room but redundancy
    /// covers them; UNAVAIL when every device is missing.
    pub state: &'static str,
    /// Leaves named in the config but not found at import.
    pub missing_devices: usize,
    /// Every leaf of the config, in order (for a raidz, column order).
    pub leaves: Vec<LeafStatus>,
}

/// The newest valid config on a device's labels, if it carries any: what an import scan
/// needs to know about a device without importing it.
pub fn probe(dev: Arc<dyn BlockDevice>) -> Option<PoolConfig> {
    read_labels(&Leaf::new(dev, 0))
        .ok()?
        .config
        .map(|(_, cfg)| cfg)
}

/// Where an interrupted resumable receive stands (`Dataset::receiving`): what a resume token
/// says (`zvol::receive::ResumeToken`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvState {
    /// The guid of the snapshot being received, and of its base (0 for a full stream).
    pub to_guid: u64,
    pub from_guid: u64,
    /// The volume's bytes below it are received and durable (a multiple of its block size).
    pub offset: u64,
}

/// A volume as the pool tracks it.
pub struct Dataset {
    pub name: String,
    pub guid: u64,
    pub volblocksize: u32,
    pub created_txg: u64,
    volsize: AtomicU64,
    /// Bytes the pool keeps free for the volume (`refreservation`), 0 for a sparse one: what
    /// it would take written whole (`Pool::reservation_for`), less what it takes now.
    refreservation: AtomicU64,
    pub object: Object,
    objset_bp: Mutex<BlkPtr>,
    /// The volume's intent log.
    pub log: Log,
    /// Held while the log is replayed, so a volume opened twice at once replays once.
    pub replay_lock: Mutex<()>,
    /// Blocks that records to replay point at (large writes logged by block pointer): held
    /// allocated until the replay's txg commits, so a crash before then finds them intact.
    replay_claims: Mutex<Vec<BlkPtr>>,
    /// Set when the volume is destroyed: handles still open to it (a connected client) must
    /// not dirty it any more, since no txg would ever sync, and undirty, what they wrote.
    destroyed: AtomicBool,
    /// A head's record in the dataset table (`dsl::dataset`), 0 until its first snapshot.
    dataset_id: AtomicU64,
    /// A snapshot's read-only tree (`VOL@SNAP`), not a volume's head.
    pub snapshot: bool,
    /// An interrupted `zeta receive -s`'s place, while it waits to resume: the volume reads
    /// as nothing yet (every open but the receive's is refused).
    pub(super) recv: Mutex<Option<RecvState>>,
    /// `readonly=on`: clients' writes are refused (`zvol::Volume`); a receive, a rollback
    /// and the intent log's replay still change it.
    readonly: AtomicBool,
    /// A snapshot: the txg of the snapshot before it (0 if none): the blocks it holds born at
    /// or before it are that one's too.
    snap_prev_txg: AtomicU64,
    /// Its dataset record's figures, as of the last sync that changed them.
    space: Mutex<SnapFigures>,
    /// `zvol::Volume`s open on it (`Volume::open` to its drop): a rollback is refused while
    /// any is.
    handles: AtomicUsize,
}

/// What a `Dataset` is made of: its identity, its tree and its log. Everything else starts
/// empty (no handle, no figures until its record is read, not destroyed).
pub(super) struct DatasetParts {
    pub(super) name: String,
    pub(super) guid: u64,
    pub(super) volblocksize: u32,
    pub(super) created_txg: u64,
    pub(super) volsize: u64,
    pub(super) refreservation: u64,
    /// The tree's dnode and the objset block that holds it (a hole until first written).
    pub(super) dnode: DnodePhys,
    pub(super) objset: BlkPtr,
    pub(super) log: Log,
    pub(super) dataset_id: u64,
    pub(super) snapshot: bool,
}

impl Dataset {
    pub(super) fn from_parts(p: DatasetParts) -> Dataset {
        Dataset {
            name: p.name,
            guid: p.guid,
            volblocksize: p.volblocksize,
            created_txg: p.created_txg,
            volsize: AtomicU64::new(p.volsize),
            refreservation: AtomicU64::new(p.refreservation),
            object: Object::new(p.dnode, BlockKind::Data, AllocClass::Recorded),
            objset_bp: Mutex::new(p.objset),
            log: p.log,
            replay_lock: Mutex::new(()),
            replay_claims: Mutex::new(Vec::new()),
            destroyed: AtomicBool::new(false),
            dataset_id: AtomicU64::new(p.dataset_id),
            snapshot: p.snapshot,
            readonly: AtomicBool::new(false),
            recv: Mutex::new(None),
            snap_prev_txg: AtomicU64::new(0),
            space: Mutex::new(SnapFigures::default()),
            handles: AtomicUsize::new(0),
        }
    }

    /// Whether the volume may hold data: its tree has a block, or the open txg changes it.
    /// (A tree whose blocks were all trimmed away may still have its indirect blocks.)
    pub fn holds_data(&self) -> bool {
        !self.object.dnode().root.is_hole() || self.object.has_open_changes()
    }

    pub fn volsize(&self) -> u64 {
        self.volsize.load(Ordering::Acquire)
    }

    pub fn refreservation(&self) -> u64 {
        self.refreservation.load(Ordering::Acquire)
    }

    /// Where an interrupted `zeta receive -s` of this volume stands, if one does.
    pub fn receiving(&self) -> Option<RecvState> {
        *self.recv.lock()
    }

    /// The checksum algorithm its new blocks get (`checksum`; each block records its own).
    pub fn checksum(&self) -> ChecksumKind {
        ChecksumKind::from_u8(self.object.dnode().checksum).expect("checked at load")
    }

    /// `readonly`: set, or a snapshot.
    pub fn readonly(&self) -> bool {
        self.snapshot || self.readonly.load(Ordering::Acquire)
    }

    pub(super) fn set_readonly_flag(&self, on: bool) {
        self.readonly.store(on, Ordering::Release);
    }

    /// What of its reservation the volume does not take yet: room no other volume's writes
    /// may have. Once it has a snapshot, only its blocks born since count (OpenZFS's
    /// rule): the snapshot holds the rest, and rewriting them takes new room.
    pub fn unused_reservation(&self) -> u64 {
        let held = if self.object.keep_upto() > 0 {
            self.object.fresh_bytes()
        } else {
            self.object.used_bytes()
        };
        self.refreservation().saturating_sub(held)
    }

    /// How many `zvol::Volume`s are open on it.
    pub fn handles(&self) -> usize {
        self.handles.load(Ordering::Acquire)
    }

    /// A `zvol::Volume` opens on it, or lets go of it.
    pub fn note_handle(&self, open: bool) {
        if open {
            self.handles.fetch_add(1, Ordering::AcqRel);
        } else {
            self.handles.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Its record in the dataset table, 0 if none.
    pub(super) fn dataset_id(&self) -> u64 {
        self.dataset_id.load(Ordering::Acquire)
    }

    /// Its record's figures (`zeta list`): for a snapshot, what it holds and alone holds;
    /// for a head, what its snapshots hold (`written` is read live from the tree).
    pub fn figures(&self) -> SnapFigures {
        let mut f = *self.space.lock();
        if !self.snapshot {
            f.written = if self.object.keep_upto() > 0 {
                self.object.fresh_bytes()
            } else {
                self.object.used_bytes()
            };
            f.referenced = self.object.used_bytes();
        }
        f
    }

    /// The txg at or before which the blocks of its tree are an earlier tree's too: a
    /// snapshot's previous snapshot's, a head's latest snapshot's (0: none). A scan of every
    /// tree, pruned there, reads each block once.
    pub fn born_after(&self) -> u64 {
        if self.snapshot {
            self.snap_prev_txg.load(Ordering::Acquire)
        } else {
            self.object.keep_upto()
        }
    }
}

struct Mos {
    dir: Object,
    mstable: Object,
    /// One space-map object per metaslab, in vdev order.
    sms: Vec<Object>,
    /// Index of each vdev's first metaslab in `sms`.
    ms_base: Vec<usize>,
    objset_bp: BlkPtr,
    /// Volumes destroyed since the last sync; their blocks are freed by the next one.
    destroyed: Vec<Arc<Dataset>>,
    /// The directory must be rewritten (a volume was created, destroyed or resized).
    dir_dirty: bool,
    /// The next sync writes every volume's objset block, changed or not (their dnodes took
    /// figures the disk does not have yet: `Pool::count_space`).
    rewrite_objsets: bool,
    /// The dataset table (slot 2): heads with snapshots, and the snapshots.
    table: snapshot::Table,
}

/// Sync requests are numbered; a request is served once a sync pass that *started* after it
/// has finished (that pass either committed the txg holding the requester's writes or found
/// nothing dirty, which means they were committed earlier).
struct SyncState {
    synced_txg: u64,
    request_seq: u64,
    completed_seq: u64,
    shutdown: bool,
    error: Option<Suspension>,
    /// The txg being committed found no room on its devices and waits for it
    /// (`wait_for_room`): new writes are refused meanwhile, syncs wait.
    waiting: Option<Suspension>,
    /// Set by `close`: a txg that finds no room fails instead of waiting.
    no_waiting: bool,
}

impl SyncState {
    /// Why writes are refused now: a failure for good, or a wait for room.
    fn suspension(&self) -> Option<&Suspension> {
        self.error.as_ref().or(self.waiting.as_ref())
    }
}

/// How long a txg that found no room waits before it tries its write again.
const ROOM_RETRY: Duration = Duration::from_secs(1);

/// Why a pool stopped taking writes. Reads go on; writes fail with `PoolError::Suspended`.
///
/// Either the txg being committed found no room on its devices (a full file system under
/// file vdevs) and waits for it, trying again every `ROOM_RETRY` (`retrying`): syncs wait
/// meanwhile, the intent log's sync requests (FLUSH, FUA) are refused out of room, and the
/// pool resumes by itself once room is made, losing nothing.
/// Or a txg failed for good (a device fault, or the pool closed while waiting): until the
/// pool is imported again, when the intent log replays every acknowledged write the txg did
/// not commit.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Suspension {
    pub why: String,
    /// The devices had no room (`PoolError::out_of_space`): freeing room on their file
    /// system is the cure.
    pub out_of_space: bool,
    /// The pool waits for room and resumes by itself (else: import it again).
    pub retrying: bool,
}

impl Suspension {
    fn of(e: &PoolError) -> Self {
        Suspension {
            why: e.to_string(),
            out_of_space: e.out_of_space(),
            retrying: false,
        }
    }

    fn error(&self, pool: &str) -> PoolError {
        PoolError::Suspended {
            pool: pool.to_string(),
            why: self.why.clone(),
            out_of_space: self.out_of_space,
        }
    }
}

pub struct Pool {
    pub name: String,
    pub guid: u64,
    config: Mutex<PoolConfig>,
    config_gen: AtomicU64,
    pub io: ObjectIo,
    opts: PoolOptions,
    /// The txg machinery: the open txg, the one syncing, and the sync thread.
    txgs: Txgs,
    /// What writes hold and may hold: dirty bytes, memory and space admission.
    admission: Admission,
    /// The last scrub's state and the thread running one.
    scanning: Scanning,
    /// Held for a whole sync, and by admin changes to the MOS.
    mos: Mutex<Mos>,
    datasets: RwLock<BTreeMap<String, Arc<Dataset>>>,
    /// Every snapshot's read-only dataset, by `VOL@SNAP` (kept by the sync as it takes and
    /// destroys them, read without the MOS lock).
    snapshots: RwLock<BTreeMap<String, Arc<Dataset>>>,
    /// The intent log's pool-wide part: log space, rotor, counters.
    pub zil: Zil,
    /// What import had to give up (a volume's unreadable log, with --discard-log).
    pub import_notes: Mutex<Vec<String>>,
    /// The thread that reads ahead of streams (`prefetch`).
    prefetcher: prefetch::Prefetcher,
}

fn random_guid() -> u64 {
    loop {
        let g: u64 = rand::random();
        if g != 0 {
            return g;
        }
    }
}

/// The error for a config too large for the labels: the vdev tree is the part that grows
/// with the user's choices.
fn config_too_large(e: &ConfigTooLarge) -> PoolError {
    invalid(format!(
        "{e}: use fewer devices, or shorter paths to them (each device's path is in every label)"
    ))
}

/// A pool opens only if the checksum and parity kernels the environment selects can run: a bad
/// `ZETA_FLETCHER4_IMPL`, `ZETA_FLETCHER2_IMPL` or `ZETA_PARITY_IMPL` is a clear error here,
/// before anything is read or written.
fn check_kernels() -> Result<(), PoolError> {
    zeta_math::fletcher::selected().map_err(PoolError::Invalid)?;
    zeta_math::fletcher2::selected().map_err(PoolError::Invalid)?;
    zeta_math::parity::check_override().map_err(|e| PoolError::Invalid(e.to_string()))
}

/// What a caught panic said, if it said it as text: for the error that stands in for it (a
/// txg sync's, a request's).
pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    (panic.downcast_ref::<&str>().copied())
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}

/// This machine's host name, as a config records it.
pub fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name = name.trim();
    cut_to(
        if name.is_empty() { "unknown" } else { name },
        MAX_HOSTNAME_BYTES,
    )
}

fn invalid(msg: impl Into<String>) -> PoolError {
    PoolError::Invalid(msg.into())
}

impl Pool {
    // ----- creation -----------------------------------------------------------------------

    /// Creates a pool on opened devices and commits its first txg.
    pub fn create(
        name: &str,
        spec: Vec<TopSpec>,
        opts: PoolOptions,
    ) -> Result<Arc<Pool>, PoolError> {
        check_kernels()?;
        if !valid_volume_name(name) || name.contains(':') {
            return Err(invalid(format!(
                "invalid pool name '{name}': use letters, digits, '-', '_', '.'"
            )));
        }
        if spec.is_empty() {
            return Err(invalid("a pool needs at least one device"));
        }
        // Log devices come after the data vdevs, whatever the order given: data vdevs are
        // numbered 0..n, which the allocator and the metaslab table index by.
        let mut spec = spec;
        spec.sort_by_key(|t| t.log);
        if spec.iter().all(|t| t.log) {
            return Err(invalid(
                "a pool needs at least one data device besides its log devices",
            ));
        }
        let mut tops_cfg = Vec::new();
        let mut tops = Vec::new();
        for (id, top) in spec.into_iter().enumerate() {
            let (vdev, cfg) = build_top(id as u32, top, opts.force)?;
            tops_cfg.push(cfg);
            tops.push(Arc::new(vdev));
        }
        let config = PoolConfig {
            name: name.to_string(),
            pool_guid: random_guid(),
            state: PoolState::Active,
            version: FORMAT_VERSION,
            checksum: opts.checksum,
            leaf_guid: 0,
            tops: tops_cfg,
            scan: None,
            zil_commit: opts.zil_commit,
            zil_placement: opts.zil_placement,
            hostname: Some(hostname()),
            holder: opts.holder.as_deref().map(|h| cut_to(h, MAX_HOLDER_BYTES)),
            features: crate::spa::feature::for_new_pool(),
        };
        Pool::check_config_room(&config)?;
        let alloc = Allocator::new(&alloc_geometry(&config));
        let mut mos = empty_mos(
            &alloc
                .tops
                .iter()
                .map(|t| t.metaslabs.len())
                .collect::<Vec<_>>(),
        );
        mos.dir_dirty = true;
        let pool = Self::assemble(config, tops, alloc, opts, mos, 0, 1);
        pool.write_config(PoolState::Active)?;
        pool.allow_ganging();
        pool.sync_now()?;
        Ok(pool)
    }

    fn assemble(
        config: PoolConfig,
        tops: Vec<Arc<TopVdev>>,
        alloc: Allocator,
        opts: PoolOptions,
        mos: Mos,
        synced_txg: u64,
        config_gen: u64,
    ) -> Arc<Pool> {
        let zil = Zil::new(
            tops.iter()
                .zip(&config.tops)
                .map(|(top, t)| (top.clone(), (t.data_bytes(), t.log_bytes), t.log))
                .collect(),
            config.zil_commit,
            config.zil_placement,
        );
        // The data path knows only the data vdevs (numbered 0..n); log devices are the log's.
        let data_tops: Vec<Arc<TopVdev>> = tops
            .iter()
            .zip(&config.tops)
            .filter(|(_, t)| !t.log)
            .map(|(top, _)| top.clone())
            .collect();
        let zio = Arc::new(Zio::new(data_tops, alloc));
        zio.force_ganging(opts.force_ganging);
        let ahead_limit = zio.alloc.lock().space().free / 4;
        let cache = Arc::new(BlockCache::new(opts.cache_bytes));
        let dirty_max = opts.dirty_max_bytes;
        let pool = Arc::new(Pool {
            name: config.name.clone(),
            guid: config.pool_guid,
            config: Mutex::new(config),
            config_gen: AtomicU64::new(config_gen),
            io: ObjectIo { zio, cache },
            opts,
            txgs: Txgs {
                open_txg: RwLock::new(synced_txg + 1),
                syncing_txg: AtomicU64::new(0),
                syncing_held: AtomicU64::new(0),
                growth: growth::Growth::default(),
                sync: Mutex::new(SyncState {
                    synced_txg,
                    request_seq: 0,
                    completed_seq: 0,
                    shutdown: false,
                    error: None,
                    waiting: None,
                    no_waiting: false,
                }),
                sync_cv: Condvar::new(),
                thread: Mutex::new(None),
            },
            admission: Admission {
                reserved: AtomicU64::new(0),
                dirty_bytes: AtomicI64::new(0),
                dirty_max: AtomicU64::new(dirty_max),
                placed_bytes: AtomicI64::new(0),
                held_bytes: AtomicI64::new(0),
                meta_bytes: AtomicI64::new(0),
                ahead_limit: AtomicU64::new(ahead_limit),
                ahead: Mutex::new(BTreeMap::new()),
                ahead_bytes: AtomicU64::new(0),
                slivers: Mutex::new((std::time::Instant::now(), 0, 0)),
                meta_room: Mutex::new(write::MetaRoom::default()),
            },
            scanning: Scanning {
                scan: Mutex::new(ScanState::default()),
                scanner: Mutex::new(ScanSlot::default()),
                last_io_nanos: AtomicU64::new(0),
                born: std::time::Instant::now(),
            },
            mos: Mutex::new(mos),
            datasets: RwLock::new(BTreeMap::new()),
            snapshots: RwLock::new(BTreeMap::new()),
            zil,
            import_notes: Mutex::new(Vec::new()),
            prefetcher: prefetch::Prefetcher::default(),
        });
        pool.zil
            .set_hooks(Box::new(PoolHooks(Arc::downgrade(&pool))));
        let weak = Arc::downgrade(&pool);
        pool.io.zio.set_room_wait(Box::new(move |txg, e| {
            weak.upgrade().is_some_and(|p| p.wait_for_room(txg, e))
        }));
        let weak = Arc::downgrade(&pool);
        let handle = std::thread::Builder::new()
            .name(format!("txg-sync-{}", pool.name))
            .spawn(move || sync_thread(weak))
            .expect("spawn sync thread");
        *pool.txgs.thread.lock() = Some(handle);
        pool
    }

    /// Whether the config with vdev tree `cfg` keeps room in the labels for all the pool
    /// records as it runs (`fits_as_it_grows`): checked before the tree grows.
    pub(super) fn check_config_room(cfg: &PoolConfig) -> Result<(), PoolError> {
        fits_as_it_grows(cfg).map_err(|e| config_too_large(&e))
    }

    /// Writes the config into every label, in two phases (labels 0 and 2, then 1 and 3) so a
    /// crash tears at most one copy of each end.
    fn write_config(&self, state: PoolState) -> Result<(), PoolError> {
        let (tops, required) = self.label_tops();
        self.write_config_on(&tops, required, state)
    }

    /// `write_config` on the labels of `tops` alone, the first `required` of which must take
    /// it: a vdev being added gets the config that names it before any other device does.
    pub(super) fn write_config_on(
        &self,
        tops: &[Arc<TopVdev>],
        required: usize,
        state: PoolState,
    ) -> Result<(), PoolError> {
        // A read-only pool leaves its labels as it found them: an export or close then only
        // lets go of the devices. (Every change that would need a new config is refused.)
        if self.opts.readonly {
            return Ok(());
        }
        let generation = self.config_gen.fetch_add(1, Ordering::SeqCst) + 1;
        let mut update =
            LabelUpdate::new(tops, required, format!("config generation {generation}"));
        self.config_steps(&mut update, state, generation, |_| false)
    }

    /// The steps of a config write, taken by `update`: the leaves that fail one drop out of
    /// it, and the rest go on. A write that finds no room on any leaf of a vdev is tried
    /// again for as long as `wait` says (a txg's commit waits for room; other callers fail).
    /// `generation`: the config's, taken from `config_gen`.
    fn config_steps(
        &self,
        update: &mut LabelUpdate<'_>,
        state: PoolState,
        generation: u64,
        mut wait: impl FnMut(&VdevError) -> bool,
    ) -> Result<(), PoolError> {
        let cfg = self.config_to_write(state);
        // What the labels get: the same, less what a config too large for them can spare.
        let mut written = cfg.clone();
        fit_config(&mut written).map_err(|e| config_too_large(&e))?;
        for phase in [[0usize, 2], [1, 3]] {
            update.write_step(
                |leaf| {
                    let mut c = written.clone();
                    c.leaf_guid = leaf.guid();
                    // `fit_config` left room for any leaf's GUID.
                    let area = encode_config(&c, generation).map_err(|e| {
                        VdevError::io(&leaf.name(), std::io::Error::other(e.to_string()))
                    })?;
                    write_config(leaf, &area, &phase)
                },
                &mut wait,
            )?;
            update.step(|leaf| leaf.flush())?;
        }
        let mut c = self.config.lock();
        c.state = state;
        c.scan = cfg.scan;
        c.tops = cfg.tops;
        Ok(())
    }

    // ----- import -------------------------------------------------------------------------

    // ----- state --------------------------------------------------------------------------

    pub fn config(&self) -> PoolConfig {
        self.config.lock().clone()
    }

    /// Every top-level vdev whose labels carry the pool's config and uberblocks: the data
    /// vdevs, then the log devices; and how many of them are data vdevs.
    fn label_tops(&self) -> (Vec<Arc<TopVdev>>, usize) {
        let mut tops = self.io.zio.tops.clone();
        let required = tops.len();
        tops.extend(self.zil.log_devices());
        (tops, required)
    }

    /// The pool's space, as last counted: read without the allocator's lock, which a txg
    /// sync holds while it allocates (see `SpaceGauge`).
    pub fn space(&self) -> Space {
        self.io.zio.gauge.read()
    }

    /// Every metaslab's free space and fragmentation (`zeta pool map`).
    pub fn metaslab_map(&self) -> PoolMap {
        self.io.zio.alloc.lock().map()
    }

    /// Data writes that reached the pool's devices since it was opened: their bytes, and
    /// by size `(from, writes)` for each size class 4K, 8K, ... that has any
    /// (`LeafCounters::write_sizes`).
    pub fn device_writes(&self) -> (u64, Vec<(u64, u64)>) {
        use std::sync::atomic::Ordering::Relaxed;
        let (tops, _) = self.label_tops();
        let mut sum = [0u64; crate::vdev::leaf::WRITE_SIZE_BUCKETS];
        let mut bytes = 0;
        for leaf in tops.iter().flat_map(|t| &t.children) {
            for (s, c) in sum.iter_mut().zip(&leaf.counters.write_sizes) {
                *s += c.load(Relaxed);
            }
            bytes += leaf.counters.write_bytes.load(Relaxed);
        }
        let sizes = (0..sum.len())
            .filter(|&i| sum[i] > 0)
            .map(|i| (4096u64 << i, sum[i]))
            .collect();
        (bytes, sizes)
    }

    /// The fragmentation of the pool's free space, in percent (`spa::frag`).
    pub fn fragmentation(&self) -> u8 {
        self.io.zio.alloc.lock().map().fragmentation
    }

    /// The pool's space as volumes of `block_bytes` blocks can fill it, as `zfs list` counts
    /// it: a raidz vdev's share after its parity and padding sectors for such a block
    /// (`TopVdev::asize_of`), a mirror's or stripe's as it is (`space` already counts a
    /// mirror once). Free space is shared out in the same proportion, exact when every data
    /// vdev has the same layout.
    pub fn usable_space(&self, block_bytes: u64) -> UsableSpace {
        let space = self.space();
        let cfg = self.config.lock().clone();
        let (mut raw, mut usable) = (0u128, 0u128);
        for (top, tc) in self
            .io
            .zio
            .tops
            .iter()
            .zip(cfg.tops.iter().filter(|t| !t.log))
        {
            let data = tc.data_bytes() as u128;
            raw += data;
            usable += data * block_bytes as u128 / top.asize_of(block_bytes).max(1) as u128;
        }
        let share = |bytes: u64| (bytes as u128 * usable / raw.max(1)) as u64;
        UsableSpace {
            size: share(space.size),
            free: share(space.free),
            freeing: share(space.freeing),
            reserved: share(self.reserved_bytes()),
            avail: share(space.free.saturating_sub(self.reserved_bytes())),
            block_bytes,
        }
    }

    pub fn vdev_status(&self) -> Vec<TopStatus> {
        let cfg = self.config.lock().clone();
        let (tops, _) = self.label_tops();
        tops.iter()
            .zip(&cfg.tops)
            .map(|(t, tc)| {
                let missing = t.children.iter().filter(|l| l.is_missing()).count();
                let offline = t
                    .children
                    .iter()
                    .any(|l| l.is_offline() || l.is_out_of_room() || l.inject.lock().vanished);
                TopStatus {
                    id: t.id,
                    kind: t.kind(),
                    name: tc.kind_name(),
                    log: tc.log,
                    state: if missing == 0 && !offline {
                        "ONLINE"
                    } else if missing == t.children.len() {
                        "UNAVAIL"
                    } else {
                        "DEGRADED"
                    },
                    missing_devices: missing,
                    leaves: tc
                        .children
                        .iter()
                        .map(|c| {
                            let leaf = t.children.iter().find(|l| l.guid() == c.guid);
                            let n = |f: fn(&Leaf) -> &AtomicU64| {
                                leaf.map_or(0, |l| f(l).load(Ordering::Relaxed))
                            };
                            LeafStatus {
                                path: c.path.clone(),
                                guid: c.guid,
                                read_errors: n(|l| &l.counters.read_errors),
                                write_errors: n(|l| &l.counters.write_errors),
                                cksum_errors: n(|l| &l.counters.cksum_errors),
                                repaired_bytes: n(|l| &l.counters.repaired_bytes),
                                state: match leaf {
                                    None => "UNAVAIL",
                                    Some(l) if l.is_missing() => "UNAVAIL",
                                    Some(l) if l.inject.lock().vanished => "REMOVED",
                                    Some(l) if l.is_faulted() => "FAULTED",
                                    Some(l) if l.is_offline() => "OFFLINE",
                                    Some(l) if l.is_out_of_room() => "NOSPACE",
                                    Some(_) => "ONLINE",
                                },
                            }
                        })
                        .collect(),
                }
            })
            .collect()
    }

    pub fn options(&self) -> &PoolOptions {
        &self.opts
    }

    pub fn synced_txg(&self) -> u64 {
        self.txgs.sync.lock().synced_txg
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.admission.dirty_bytes.load(Ordering::Acquire).max(0) as u64
    }

    pub fn datasets(&self) -> Vec<Arc<Dataset>> {
        self.datasets.read().values().cloned().collect()
    }

    pub fn dataset(&self, name: &str) -> Result<Arc<Dataset>, PoolError> {
        self.datasets
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| PoolError::NoSuchVolume(format!("{}/{name}", self.name)))
    }

    /// Refuses every change to a pool imported read-only, and writes while it is suspended.
    pub(super) fn check_writable(&self) -> Result<(), PoolError> {
        if self.opts.readonly {
            return Err(PoolError::ReadOnly(self.name.clone()));
        }
        self.check_healthy()
    }

    /// Imported read-only (`PoolOptions::readonly`).
    pub fn is_read_only(&self) -> bool {
        self.opts.readonly
    }

    /// Refuses writes while the pool is suspended, waiting for room or for good.
    fn check_healthy(&self) -> Result<(), PoolError> {
        match self.txgs.sync.lock().suspension() {
            Some(s) => Err(s.error(&self.name)),
            None => Ok(()),
        }
    }

    /// From now on a txg that finds no room fails instead of waiting for it, and one waiting
    /// now fails within moments: the pool is then suspended for good, and its next import
    /// replays what the log holds. For a pool about to close (`close` calls it), and for a
    /// server stopping, whose requests waiting on that txg must end before it closes.
    pub fn stop_waiting_for_room(&self) {
        let mut st = self.txgs.sync.lock();
        st.no_waiting = true;
        self.txgs.sync_cv.notify_all();
    }

    /// Why the pool takes no writes now, if it is suspended (`Suspension`).
    pub fn suspension(&self) -> Option<Suspension> {
        self.txgs.sync.lock().suspension().cloned()
    }

    /// `RoomWait` for this pool: a write of the txg being committed that found no room
    /// suspends the pool and waits `ROOM_RETRY`, then has the write tried again; writes of
    /// the open txg (written ahead by clients' requests, which hold `open_txg`) fail at once,
    /// as does everything once `close` has begun. Called with the MOS lock held by the sync:
    /// takes the sync state's lock, which nothing holds while taking the MOS lock, and as the
    /// wait begins each volume's log state (`refuse_log_requests`), which is taken under the
    /// MOS lock elsewhere too (`Log::header` in the sync) and never the other way round.
    fn wait_for_room(&self, txg: u64, e: &VdevError) -> bool {
        if txg != self.txgs.syncing_txg.load(Ordering::Acquire) {
            return false;
        }
        let mut st = self.txgs.sync.lock();
        if st.shutdown || st.no_waiting || st.error.is_some() {
            return false;
        }
        if st.waiting.is_none() {
            let why = format!("write failed: {e}");
            st.waiting = Some(Suspension {
                why: why.clone(),
                out_of_space: true,
                retrying: true,
            });
            // Writers throttled on the dirty limit see it and give up.
            self.txgs.sync_cv.notify_all();
            drop(st);
            self.refuse_log_requests(&why);
            st = self.txgs.sync.lock();
        }
        self.txgs.sync_cv.wait_for(&mut st, ROOM_RETRY);
        !(st.shutdown || st.no_waiting)
    }

    /// As the pool begins to wait for room: sync requests (FLUSH, FUA) are answered out of
    /// room instead of waiting with the txg, those waiting now and new ones alike, until
    /// `accept_log_requests` (`Log::refuse`). The answers go out on a thread of their own:
    /// this is the sync thread, and a reply to a client that does not read could block it.
    fn refuse_log_requests(&self, why: &str) {
        let dones: Vec<crate::zil::Done> = self
            .datasets
            .read()
            .values()
            .flat_map(|ds| ds.log.refuse(why))
            .collect();
        if dones.is_empty() {
            return;
        }
        let answer = |dones: Vec<crate::zil::Done>, why: &str| {
            crate::zil::wake::wake_all(dones, || {
                Err(crate::zil::LogError::OutOfRoom(why.to_string()))
            })
        };
        let held = Arc::new(Mutex::new(dones));
        let (theirs, why_then) = (held.clone(), why.to_string());
        let spawned = std::thread::Builder::new()
            .name("room-answers".into())
            .spawn(move || answer(std::mem::take(&mut *theirs.lock()), &why_then));
        if spawned.is_err() {
            answer(std::mem::take(&mut *held.lock()), why);
        }
    }

    /// Room was made: sync requests wait for their records again.
    pub(super) fn accept_log_requests(&self) {
        for ds in self.datasets.read().values() {
            ds.log.accept_again();
        }
    }

    // ----- volumes ------------------------------------------------------------------------

    pub fn create_volume(
        &self,
        name: &str,
        volsize: u64,
        volblocksize: u32,
        checksum: Option<ChecksumKind>,
    ) -> Result<Arc<Dataset>, PoolError> {
        self.create_volume_with(name, volsize, volblocksize, checksum, false)
    }

    /// `create_volume` for a receive: the volume is partly received at `state` from the txg
    /// that makes it, so no crash leaves it looking whole.
    pub fn create_volume_receiving(
        &self,
        name: &str,
        volsize: u64,
        volblocksize: u32,
        checksum: ChecksumKind,
        state: RecvState,
    ) -> Result<Arc<Dataset>, PoolError> {
        self.make_volume(
            name,
            volsize,
            volblocksize,
            Some(checksum),
            false,
            Some(state),
        )
    }

    /// `create_volume`, reserving what the volume would take written whole unless `sparse`
    /// (`zfs create -V` reserves; `-s` does not): refused if the pool has not that much room
    /// beside the other volumes' reservations. (`create_volume` makes sparse volumes, as
    /// tests and benchmarks want.)
    pub fn create_volume_with(
        &self,
        name: &str,
        volsize: u64,
        volblocksize: u32,
        checksum: Option<ChecksumKind>,
        reserve: bool,
    ) -> Result<Arc<Dataset>, PoolError> {
        self.make_volume(name, volsize, volblocksize, checksum, reserve, None)
    }

    fn make_volume(
        &self,
        name: &str,
        volsize: u64,
        volblocksize: u32,
        checksum: Option<ChecksumKind>,
        reserve: bool,
        receiving: Option<RecvState>,
    ) -> Result<Arc<Dataset>, PoolError> {
        self.check_writable()?;
        if !valid_volume_name(name) {
            return Err(invalid(format!(
                "invalid volume name '{name}': use letters, digits, '-', '_', '.', ':'"
            )));
        }
        if !is_data_block_size(volblocksize) {
            return Err(invalid(format!(
                "volblocksize {volblocksize} must be a power of two from 4K to 128K"
            )));
        }
        check_volsize(volsize, volblocksize)?;
        let mut mos = self.mos.lock();
        let mut map = self.datasets.write();
        if map.contains_key(name) {
            return Err(PoolError::VolumeExists(format!("{}/{name}", self.name)));
        }
        let refreservation = if reserve {
            let need = self.reservation_for(volsize, volblocksize);
            self.check_reservation(&format!("{}/{name}", self.name), volsize, need, None, &map)?;
            need
        } else {
            0
        };
        let checksum = checksum.unwrap_or(self.config.lock().checksum);
        let mut dn = DnodePhys::new(ObjectKind::VolumeData, volblocksize, checksum as u8, 1);
        dn.size_bytes = volsize.into();
        let ds = Arc::new(Dataset::from_parts(DatasetParts {
            name: name.to_string(),
            guid: random_guid(),
            volblocksize,
            created_txg: *self.txgs.open_txg.read(),
            volsize,
            refreservation,
            dnode: dn,
            objset: BlkPtr::HOLE,
            // Its header goes to disk with the volume, in the sync below.
            log: Log::new_chain(&self.zil),
            dataset_id: 0,
            snapshot: false,
        }));
        *ds.recv.lock() = receiving;
        map.insert(name.to_string(), ds.clone());
        mos.dir_dirty = true;
        drop(map);
        drop(mos);
        self.refresh_reservations();
        self.sync_now()?;
        Ok(ds)
    }

    pub fn destroy_volume(&self, name: &str) -> Result<(), PoolError> {
        self.check_writable()?;
        {
            let mut mos = self.mos.lock();
            let snaps = self.snapshots_of(name);
            if let Some(first) = snaps.first() {
                return Err(invalid(format!(
                    "volume '{}/{name}' has {} snapshot(s) ({}{}): destroy them first, or use -r",
                    self.name,
                    snaps.len(),
                    first.name,
                    if snaps.len() > 1 { ", …" } else { "" }
                )));
            }
            let ds = self
                .datasets
                .write()
                .remove(name)
                .ok_or_else(|| PoolError::NoSuchVolume(format!("{}/{name}", self.name)))?;
            // Under the open txg's lock, as `dirty_block` checks it: a change either sees the
            // flag, or lands in the open txg before the sync below takes its destruction.
            let hold = self.txgs.open_txg.write();
            ds.destroyed.store(true, Ordering::Release);
            drop(hold);
            mos.destroyed.push(ds);
            mos.dir_dirty = true;
        }
        self.sync_frees()
    }

    /// Sets volume `name`'s `readonly` property (`zfs set readonly=on`): while on, clients'
    /// writes are refused (an NBD client connected before is refused from its next write;
    /// one connecting after sees a read-only export), while `zeta receive`, rollbacks and
    /// resizes still change it. Kept in its directory entry (`org.zeta:volume_flags`).
    pub fn set_readonly(&self, name: &str, on: bool) -> Result<(), PoolError> {
        self.check_writable()?;
        let ds = self.dataset(name)?;
        ds.set_readonly_flag(on);
        self.mos.lock().dir_dirty = true;
        self.sync_now()
    }

    /// Sets volume `name`'s `checksum` (`zfs set checksum=`): the algorithm of the blocks it
    /// writes from now on; the blocks it holds keep theirs (each pointer names its own), and
    /// so do its snapshots.
    pub fn set_checksum(&self, name: &str, kind: ChecksumKind) -> Result<(), PoolError> {
        self.check_writable()?;
        let ds = self.dataset(name)?;
        ds.object.set_checksum(kind);
        // The dnode (in the objset block) says it, whether or not the tree changes meanwhile.
        let mut mos = self.mos.lock();
        mos.dir_dirty = true;
        mos.rewrite_objsets = true;
        drop(mos);
        self.sync_now()
    }

    /// What the volumes' trees hold before compression and what they store, summed (the
    /// pool's `logicalused` and `compressratio`).
    pub fn block_sizes(&self) -> crate::dmu::object::Sizes {
        let mut total = crate::dmu::object::Sizes::default();
        for ds in self.datasets() {
            let s = ds.object.sizes();
            total.logical += s.logical;
            total.physical += s.physical;
        }
        total
    }

    /// Sets how volume `name` stores the data blocks written from now on (the `compression`
    /// property); blocks written before keep theirs. Kept in the volume's dnode, committed
    /// before this returns.
    pub fn set_compression(
        &self,
        name: &str,
        c: crate::zio::compress::Compression,
    ) -> Result<(), PoolError> {
        self.check_writable()?;
        let ds = self.dataset(name)?;
        ds.object.set_compression(c);
        // A txg with nothing else dirty commits nothing: the directory makes it commit.
        let mut mos = self.mos.lock();
        mos.rewrite_objsets = true;
        mos.dir_dirty = true;
        drop(mos);
        self.sync_now()
    }

    /// Sets volume `name`'s `refreservation`: `reserve` keeps room for the volume written
    /// whole (`refreservation=auto`, what `vol create` does; refused if the pool has not that
    /// much beside the other reservations), or none (`refreservation=none`, sparse).
    pub fn set_refreservation(&self, name: &str, reserve: bool) -> Result<(), PoolError> {
        self.check_writable()?;
        let ds = self.dataset(name)?;
        let need = match reserve {
            true => self.reservation_for(ds.volsize(), ds.volblocksize),
            false => 0,
        };
        if need > ds.refreservation() {
            let map = self.datasets.read();
            let full = format!("{}/{name}", self.name);
            self.check_reservation(&full, ds.volsize(), need, Some(&ds), &map)?;
        }
        ds.refreservation.store(need, Ordering::Release);
        self.mos.lock().dir_dirty = true;
        self.refresh_reservations();
        self.sync_now()
    }

    /// Marks volume `name` partly received at `state` (or no longer, `None`) and commits it:
    /// `zvol::receive`'s, from before a receive's first write.
    pub fn set_receiving(&self, name: &str, state: Option<RecvState>) -> Result<(), PoolError> {
        self.check_writable()?;
        let ds = self.dataset(name)?;
        *ds.recv.lock() = state;
        self.mos.lock().dir_dirty = true;
        self.sync_now()
    }

    /// Moves a receive's recorded place to `state`, for the next sync to write (what is
    /// before it is durable already: flushed).
    pub fn mark_receiving(&self, name: &str, state: RecvState) {
        if let Ok(ds) = self.dataset(name) {
            *ds.recv.lock() = Some(state);
            self.mos.lock().dir_dirty = true;
        }
    }

    /// Changes a volume's size; shrinking frees the blocks past the new end.
    pub fn resize_volume(&self, name: &str, volsize: u64) -> Result<(), PoolError> {
        self.check_writable()?;
        let ds = self.dataset(name)?;
        check_volsize(volsize, ds.volblocksize)?;
        // A reserved volume keeps reserving all of itself (`zfs set volsize` grows a
        // refreservation that matched the old size): growing past the room is refused.
        let reserved = ds.refreservation() > 0;
        let need = self.reservation_for(volsize, ds.volblocksize);
        if reserved && need > ds.refreservation() {
            let map = self.datasets.read();
            let full = format!("{}/{name}", self.name);
            self.check_reservation(&full, volsize, need, Some(&ds), &map)?;
        }
        let old = ds.volsize();
        if volsize < old {
            let bs = ds.volblocksize as u64;
            let doomed = ds
                .object
                .allocated_blocks(&self.io, volsize / bs, old.div_ceil(bs))?;
            let hold = self.txgs.open_txg.read();
            for blkid in doomed {
                self.record_change(ds.as_ref(), *hold, blkid, Dirty::Free);
            }
            ds.volsize.store(volsize, Ordering::Release);
            drop(hold);
        } else {
            ds.volsize.store(volsize, Ordering::Release);
        }
        if reserved {
            ds.refreservation.store(need, Ordering::Release);
        }
        ds.object.set_size_bytes(volsize);
        self.refresh_reservations();
        self.mos.lock().dir_dirty = true;
        self.sync_now()
    }

    /// Syncs, marks the labels exported and stops the sync thread. The devices close when the
    /// last reference to the pool goes.
    pub fn export(&self) -> Result<(), PoolError> {
        self.close()?;
        self.write_config(PoolState::Exported)
    }

    /// Syncs and stops the sync thread, leaving the pool marked active (imported) on its
    /// devices: what a command does when it is done with a pool it will open again.
    pub fn close(&self) -> Result<(), PoolError> {
        self.prefetcher.stop();
        // A running scrub pauses; its bookmark is saved so the next import resumes it.
        self.scanning.scanner.lock().close();
        let scrubbing = self.scanning.scan.lock().state == ScanPhase::Scanning;
        self.stop_waiting_for_room();
        self.sync_now()?;
        self.shutdown();
        self.check_healthy()?;
        // Keep a paused scrub's bookmark and the error counters for the next import.
        if scrubbing || self.counters_changed() {
            self.write_config(PoolState::Active)?;
        }
        Ok(())
    }

    /// The config as labels carry it: the current one with the live scan state and leaf
    /// counters, in `state`.
    fn config_to_write(&self, state: PoolState) -> PoolConfig {
        let mut cfg = self.config.lock().clone();
        cfg.state = state;
        let scan = self.scanning.scan.lock().clone();
        cfg.scan = (scan.state != ScanPhase::None).then_some(scan);
        self.record_counters(&mut cfg);
        cfg
    }

    /// Writes the config as it stands (a scan's progress, the txgs leaves missed) to the
    /// labels, serialized with syncs by the MOS lock.
    pub(super) fn save_config(&self) -> Result<(), PoolError> {
        let _mos = self.mos.lock();
        let state = self.config.lock().state;
        self.write_config(state)
    }

    /// The dnodes of the MOS objects, as of the last sync.
    pub(super) fn mos_dnodes(&self) -> Vec<DnodePhys> {
        let mos = self.mos.lock();
        let mut v = vec![mos.dir.dnode(), mos.mstable.dnode()];
        v.extend(mos.sms.iter().map(|o| o.dnode()));
        v.extend(mos.table.dnodes());
        v
    }

    /// Asks for a txg that commits even with nothing else to write (it rewrites the
    /// directory): after a resilver, so that the rebuilt leaves get an uberblock of their own
    /// and the MOS objset block of the txgs they missed is superseded by one they hold. On an
    /// idle pool no txg would come, and a replacement alone could not import the pool.
    pub(super) fn commit_soon(&self) {
        self.mos.lock().dir_dirty = true;
        self.request_sync();
    }

    /// The objset blocks, as of the last sync: the MOS's (labelled with the pool's name) and
    /// each volume's (`POOL/VOL`). No tree walk reaches them (the uberblock and the
    /// directory point at them), so a scan checks them on their own.
    pub(super) fn objset_bps(&self) -> Vec<(String, BlkPtr)> {
        let mut v = vec![(self.name.clone(), self.mos.lock().objset_bp)];
        for ds in self.datasets().into_iter().chain(self.snapshots()) {
            v.push((format!("{}/{}", self.name, ds.name), *ds.objset_bp.lock()));
        }
        v.retain(|(_, bp)| !bp.is_hole());
        v
    }

    /// The objset block `objset_bps` labels `label`, as of the last sync, if there is one.
    pub(super) fn objset_bp_of(&self, label: &str) -> Option<BlkPtr> {
        let bp = if label == self.name {
            self.mos.lock().objset_bp
        } else {
            let vol = label.strip_prefix(&self.name)?.strip_prefix('/')?;
            *self.dataset_or_snapshot(vol).ok()?.objset_bp.lock()
        };
        (!bp.is_hole()).then_some(bp)
    }

    /// Records that a volume read or wrote just now.
    pub fn note_foreground_io(&self) {
        let now = self.scanning.born.elapsed().as_nanos() as u64;
        self.scanning
            .last_io_nanos
            .store(now.max(1), Ordering::Relaxed);
    }

    /// Pauses a scrub briefly while volumes are busy, so it takes what they leave: until
    /// they have been idle for 10 ms, but never more than `SCAN_YIELD_MAX` at a time (a
    /// scan under constant load still advances, if slowly: a resilver that waited for
    /// idleness would leave a pool with busy clients degraded for good) and not once
    /// `stop` is set (a pause, an export, a replacement waits for the scanner to stop).
    pub(super) fn yield_to_foreground(&self, stop: &AtomicBool) {
        const BUSY_WINDOW: u64 = 10_000_000;
        let until = std::time::Instant::now() + SCAN_YIELD_MAX;
        loop {
            let last = self.scanning.last_io_nanos.load(Ordering::Relaxed);
            let now = self.scanning.born.elapsed().as_nanos() as u64;
            if last == 0
                || now.saturating_sub(last) > BUSY_WINDOW
                || stop.load(Ordering::SeqCst)
                || std::time::Instant::now() >= until
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Lets a txg sync write gang blocks (`zio::gang`) once the labels say the pool may hold
    /// them (feature `org.zeta:gang_blocks` active): a zeta that does not know them never
    /// opens a pool that has one.
    pub(super) fn allow_ganging(&self) {
        use crate::spa::feature;
        let active = feature::is_active(&self.config.lock().features, &feature::GANG_BLOCKS);
        self.io.zio.allow_ganging(active && !self.opts.readonly);
    }

    /// Marks the pool destroyed in every label (its devices may then be reused without -f).
    pub fn destroy(&self) -> Result<(), PoolError> {
        self.shutdown();
        self.write_config(PoolState::Destroyed)
    }

    fn shutdown(&self) {
        self.prefetcher.stop();
        {
            let mut st = self.txgs.sync.lock();
            st.shutdown = true;
            self.txgs.sync_cv.notify_all();
        }
        let handle = self.txgs.thread.lock().take();
        if let Some(h) = handle {
            // The sync thread itself may drop the last reference; it must not join itself.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    /// Reads every block of the pool (MOS and every volume), verifying each checksum, and
    /// checks the allocator's running totals against its metaslabs. Returns the number of
    /// blocks verified.
    pub fn verify(&self) -> Result<u64, PoolError> {
        self.verify_counting().map(|(n, _, _)| n)
    }

    /// `verify`, returning also the bytes every block reached from the uberblock takes
    /// (`BlkPtr::asize_total`: a gang block's pieces included) and the allocator's space.
    /// On a pool at rest (synced, nothing written ahead or held by an intent log) the two
    /// agree: `Space::alloc` beyond the blocks reached is leaked space.
    pub fn verify_space(&self) -> Result<(u64, Space), PoolError> {
        self.verify_counting()
            .map(|(_, reach, space)| (reach, space))
    }

    fn verify_counting(&self) -> Result<(u64, u64, Space), PoolError> {
        let mut n = 0u64;
        let mut reach = 0u64;
        let mut count = |bp: &BlkPtr, _: u8| -> Result<(), ZioError> {
            n += 1;
            reach += bp.asize_total();
            Ok(())
        };
        {
            let mos = self.mos.lock();
            walk(&self.io, &mos.dir.dnode(), &mut count)?;
            walk(&self.io, &mos.mstable.dnode(), &mut count)?;
            for sm in &mos.sms {
                walk(&self.io, &sm.dnode(), &mut count)?;
            }
            for dn in mos.table.dnodes() {
                walk(&self.io, &dn, &mut count)?;
            }
        }
        for (_, bp) in self.objset_bps() {
            self.io.zio.read(&bp)?;
            count(&bp, 0)?;
        }
        for ds in self.datasets() {
            // Data blocks are read uncached so a verify really touches the media. Blocks born
            // at or before its latest snapshot are that snapshot's too: counted there.
            let dn = ds.object.dnode();
            let after = ds.born_after();
            let origin = self.origin_figures(&ds);
            let floor = origin.map_or(0, |o| o.0);
            let (mut used, mut fresh, mut shared) = (0u64, 0u64, 0u64);
            let mut sizes = crate::dmu::object::Sizes::default();
            walk(&self.io, &dn, &mut |bp, level| {
                used += bp.asize_total();
                sizes.logical += bp.lsize.get() as u64;
                sizes.physical += bp.psize.get() as u64;
                if bp.birth_txg.get() <= floor {
                    shared += bp.asize_total();
                }
                if bp.birth_txg.get() <= after {
                    return Ok(());
                }
                if level == 0 {
                    self.io.zio.read(bp)?;
                }
                fresh += bp.asize_total();
                count(bp, level)
            })?;
            if used != dn.used_bytes.get() {
                return Err(invalid(format!(
                    "volume '{}/{}': its dnode says its blocks take {} bytes, its tree {used}",
                    self.name,
                    ds.name,
                    dn.used_bytes.get()
                )));
            }
            if sizes != ds.object.sizes() {
                return Err(invalid(format!(
                    "volume '{}/{}': its dnode says its blocks hold {:?}, its tree {sizes:?}",
                    self.name,
                    ds.name,
                    ds.object.sizes()
                )));
            }
            if origin.is_some_and(|o| o.1 != shared) {
                return Err(invalid(format!(
                    "clone '{}/{}': shares {shared} bytes with its origin, its record says {:?}",
                    self.name, ds.name, origin
                )));
            }
            if after > 0 && fresh != ds.object.fresh_bytes() {
                return Err(invalid(format!(
                    "volume '{}/{}': {fresh} bytes born since its latest snapshot, {} counted",
                    self.name,
                    ds.name,
                    ds.object.fresh_bytes()
                )));
            }
        }
        self.verify_snapshots(&mut count)?;
        let alloc = self.io.zio.alloc.lock();
        let (kept, counted) = (alloc.space(), alloc.space_recounted());
        if kept != counted {
            return Err(invalid(format!(
                "pool '{}': the allocator's running totals {kept:?} drifted from its \
                 metaslabs {counted:?}",
                self.name
            )));
        }
        if alloc.map() != alloc.map_recounted() {
            return Err(invalid(format!(
                "pool '{}': a metaslab's free-segment histogram drifted from its free tree",
                self.name
            )));
        }
        Ok((n, reach, kept))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn check_volsize(volsize: u64, volblocksize: u32) -> Result<(), PoolError> {
    if volsize == 0 || !volsize.is_multiple_of(volblocksize as u64) {
        return Err(invalid(format!(
            "volume size {volsize} must be a non-zero multiple of the block size ({volblocksize})"
        )));
    }
    if volsize > 1 << 60 {
        return Err(invalid(format!("volume size {volsize} is too large")));
    }
    Ok(())
}
