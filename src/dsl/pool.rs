//! Pool lifecycle and transaction groups.
//!
//! A txg is *open* while writers add dirty blocks to it; the sync thread closes it (so new
//! writes go to the next txg), writes its blocks copy-on-write, then the MOS, flushes every
//! leaf, writes the uberblock into every label, and flushes again. Only then is the txg
//! committed. See docs/format.md for why a crash at any point leaves the previous txg intact.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use super::dir::{valid_volume_name, DirEntryPhys, ENTRY_BYTES};
use super::scan::Scanner;
use crate::dmu::dnode::{OBJSET_BYTES, OBJSET_MOS, OBJSET_VOLUME};
use crate::dmu::object::{spans, walk};
use crate::dmu::object::{Delta, SyncBytes};
use crate::dmu::{BlockCache, Dirty, DnodePhys, Object, ObjectIo, ObjectKind, ObjsetPhys};
use crate::math::ChecksumKind;
use crate::spa::label::{
    read_labels, txg_above_skipped, write_config, write_uberblock, LabelError, LeafConfig,
    PoolConfig, PoolState, TopConfig, Uberblock, FORMAT_VERSION,
};
use crate::spa::metaslab::{log_reserve_for, ms_shift_for};
use crate::spa::props::{CommitPolicy, Placement};
use crate::spa::scan_state::{ScanPhase, ScanState};
use crate::spa::space_map::{decode_all, encode_all, RECORD_BYTES};
use crate::spa::{AllocClass, AllocError, Allocator, BlkPtr, BlockKind, Space};
use crate::vdev::{BlockDevice, Leaf, RaidzConfig, TopKind, TopVdev, VdevError};
use crate::zil::block::{is_intact, walk_chain, EndOfChain};
use crate::zil::log::MAX_BLOCK;
use crate::zil::{BlockAddr, Done, Log, Prewrite, Record, TxgHooks, Zil, ZilHeader};
use crate::zio::{WriteProps, Zio, ZioError};

/// Smallest usable leaf: room for a few metaslabs after the labels.
pub const MIN_LEAF_BYTES: u64 = 64 << 20;
const DIR_BLOCK_BYTES: u32 = 16 * 1024;
const MSTABLE_BLOCK_BYTES: u32 = 16 * 1024;
const SM_BLOCK_BYTES: u32 = 4096;
/// The longest a scan waits for busy volumes before its next batch of blocks.
const SCAN_YIELD_MAX: Duration = Duration::from_millis(50);
/// How long admission trusts a count of the free space in slivers (`Pool::fits`).
const SLIVERS_FOR: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Vdev(#[from] VdevError),
    #[error(transparent)]
    Label(#[from] LabelError),
    #[error(transparent)]
    Zio(#[from] ZioError),
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
    #[error("volume '{0}' does not exist")]
    NoSuchVolume(String),
    #[error("volume '{0}' already exists")]
    VolumeExists(String),
    #[error("pool '{pool}' is suspended after an I/O failure and accepts no more writes: {why}")]
    Suspended { pool: String, why: String },
    #[error("vdev {vdev}: no device took {what}: {why}")]
    VdevLost {
        vdev: u32,
        what: String,
        why: String,
    },
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
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            checksum: ChecksumKind::Fletcher4,
            txg_timeout: Duration::from_secs(5),
            dirty_max_bytes: 128 << 20,
            cache_bytes: 256 << 20,
            force: false,
            zil_commit: CommitPolicy::default(),
            zil_placement: Placement::default(),
            discard_log: false,
        }
    }
}

/// A top-level vdev to create: its kind and its leaves, already opened, with their paths.
pub struct TopSpec {
    pub kind: TopKind,
    pub leaves: Vec<(Arc<dyn BlockDevice>, String)>,
    /// For a raidz: its parity level and code.
    pub raidz: Option<RaidzConfig>,
    /// A separate log device (a stripe or a mirror) rather than a data vdev.
    pub log: bool,
}

impl TopSpec {
    pub fn stripe(leaf: (Arc<dyn BlockDevice>, String)) -> TopSpec {
        TopSpec {
            kind: TopKind::Stripe,
            leaves: vec![leaf],
            raidz: None,
            log: false,
        }
    }

    pub fn mirror(leaves: Vec<(Arc<dyn BlockDevice>, String)>) -> TopSpec {
        TopSpec {
            kind: TopKind::Mirror,
            leaves,
            raidz: None,
            log: false,
        }
    }

    pub fn raidz(config: RaidzConfig, leaves: Vec<(Arc<dyn BlockDevice>, String)>) -> TopSpec {
        TopSpec {
            kind: TopKind::Raidz,
            leaves,
            raidz: Some(config),
            log: false,
        }
    }

    /// The same vdev as a separate log device.
    pub fn as_log(mut self) -> TopSpec {
        self.log = true;
        self
    }
}

/// Error counters of one leaf, for status displays.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LeafStatus {
    pub path: String,
    pub guid: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub cksum_errors: u64,
    pub repaired_bytes: u64,
    /// ONLINE, or UNAVAIL for a device the config names but import did not find.
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
    /// ONLINE; DEGRADED when devices are missing but redundancy covers them.
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

/// A volume as the pool tracks it.
pub struct Dataset {
    pub name: String,
    pub guid: u64,
    pub volblocksize: u32,
    pub checksum: ChecksumKind,
    pub created_txg: u64,
    volsize: AtomicU64,
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
}

impl Dataset {
    pub fn volsize(&self) -> u64 {
        self.volsize.load(Ordering::Acquire)
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
}

/// Sync requests are numbered; a request is served once a sync pass that *started* after it
/// has finished (that pass either committed the txg holding the requester's writes or found
/// nothing dirty, which means they were committed earlier).
struct SyncState {
    synced_txg: u64,
    request_seq: u64,
    completed_seq: u64,
    shutdown: bool,
    error: Option<String>,
}

/// One device found at import: the device, its path, its config generation and config, and
/// the uberblocks its labels hold.
type Member = (
    Arc<dyn BlockDevice>,
    String,
    u64,
    PoolConfig,
    Vec<Uberblock>,
);

/// How many txg commits a write short of space waits for, one at a time (deferred frees come
/// back two txgs after the one that freed them), before it is refused with ENOSPC: in
/// admission (`reserve_space`) and when the allocator finds no segment (`place_blocks`).
const RESERVE_WAITS: usize = 6;

pub struct Pool {
    pub name: String,
    pub guid: u64,
    config: Mutex<PoolConfig>,
    config_gen: AtomicU64,
    pub io: ObjectIo,
    opts: PoolOptions,
    /// The open txg. Writers hold it shared while they dirty blocks; the sync thread takes it
    /// exclusively to close the txg.
    open_txg: RwLock<u64>,
    sync: Mutex<SyncState>,
    sync_cv: Condvar,
    /// Held for a whole sync, and by admin changes to the MOS.
    mos: Mutex<Mos>,
    datasets: RwLock<BTreeMap<String, Arc<Dataset>>>,
    dirty_bytes: AtomicI64,
    /// What writes may hold in memory before they wait for a sync (`PoolOptions::
    /// dirty_max_bytes` at first; `set_memory_limits` changes it).
    dirty_max: AtomicU64,
    /// The part of `dirty_bytes` already written to its place (`Dirty::Placed`): its space
    /// is allocated, so admission must not count it again.
    placed_bytes: AtomicI64,
    /// What the dirty changes hold in memory (`Dirty::held`): less than `dirty_bytes` by the
    /// placed blocks and by the unread rest of patched ones.
    held_bytes: AtomicI64,
    /// Bytes written ahead past which a sync is asked: a quarter of the free space when the
    /// last txg committed (kept here so writers need not take the allocator's lock to ask).
    ahead_limit: AtomicU64,
    /// Bytes written ahead of their txg (placed, or written in place for the log), by txg,
    /// until that txg commits; superseded copies included: the intent log may point at
    /// every one of them, and after a crash import holds them all until the replay ends.
    ahead: Mutex<BTreeMap<u64, u64>>,
    ahead_bytes: AtomicU64,
    /// The free space admission last found in slivers too small for a block (when, block
    /// size, bytes): reused for a while instead of walking every free segment again.
    slivers: Mutex<(std::time::Instant, u64, u64)>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The last scrub's state (saved in the config) and the thread running one.
    pub(super) scan: Mutex<ScanState>,
    pub(super) scanner: Mutex<Option<Scanner>>,
    /// When a volume last read or wrote (nanoseconds since `born`): a scrub yields to it.
    last_io_nanos: AtomicU64,
    born: std::time::Instant,
    /// The intent log's pool-wide part: log space, rotor, counters.
    pub zil: Zil,
    /// What import had to give up (a volume's unreadable log, with --discard-log).
    pub import_notes: Mutex<Vec<String>>,
}

/// Whole-block writes of at least this size are written in place when a sync request needs
/// them, and logged by block pointer: the data is written once instead of into the log and
/// again at the txg. The committer writes a batch's blocks as one durable run per device
/// (`Pool::write_ahead`), so no flush of the data devices is needed, which would also wait for
/// the writeback of the txg in flight. (OpenZFS's `zfs_immediate_write_sz` is 32 KiB, and
/// the log then flushes the devices. Here 16K writes into 16K blocks with a flush every 5,
/// `zeta bench load`, three volumes: 53.3k and 54.8k writes/s in place against 48.6k and
/// 44.5k by value, builds taking turns.)
pub const IN_PLACE_MIN_BYTES: usize = 16 << 10;

/// A batch's whole blocks go in place only if they come to at least this much. Their durable
/// write is a request of its own before the log block's, which costs a lone sync write more
/// than carrying its data in the log block does (one 16K write with a flush at a time: 1.5k
/// and 2.0k round trips a second in place against 2.3k and 2.6k by value); a large batch's
/// data carried in the log would be written again by its txg, and its log block's write takes
/// about as long as the blocks' own.
pub const IN_PLACE_BATCH_BYTES: usize = 256 << 10;

/// How the log writes a volume's whole-block writes in place.
struct InPlace<'a> {
    pool: &'a Pool,
    ds: &'a Dataset,
}

impl Prewrite for InPlace<'_> {
    fn prewrite(&self, batch: &mut [(u64, Record)]) -> Vec<u32> {
        let bs = self.ds.volblocksize as u64;
        let mut flush = Vec::new();
        // Blocks to write now: the record's place in the batch, its txg and block.
        let mut ahead: Vec<(usize, u64, u64, Arc<Vec<u8>>)> = Vec::new();
        for (i, (_, rec)) in batch.iter_mut().enumerate() {
            let Record::Write { txg, offset, data } = rec else {
                continue;
            };
            let Some(buf) = data.whole_buffer() else {
                continue;
            };
            if buf.len() as u64 != bs || *offset % bs != 0 {
                continue;
            }
            let blkid = *offset / bs;
            // Written ahead only while the block's change is still in the open txg; once its
            // txg syncs, the sync writes it anyway.
            if !self.ds.object.is_open_dirty(blkid, buf) {
                continue;
            }
            let (txg, offset) = (*txg, *offset);
            *rec = match self.ds.object.override_of(blkid, buf) {
                // Already there (a streaming write put it in place as it came, buffered):
                // that copy, flushed with the batch.
                Some(bp) => {
                    flush.extend(bp.dvas().map(|d| d.vdev.get()));
                    Record::Indirect { txg, offset, bp }
                }
                None if buf.len() < IN_PLACE_MIN_BYTES => continue,
                // Zeros become a hole at the sync: a zero record says the same in 32 bytes.
                None if crate::math::zero::is_zero(buf) => Record::Zero {
                    txg,
                    offset,
                    len: bs,
                },
                None => {
                    ahead.push((i, txg, blkid, buf.clone()));
                    continue;
                }
            };
        }
        if ahead.iter().map(|(.., buf)| buf.len()).sum::<usize>() < IN_PLACE_BATCH_BYTES {
            return flush;
        }
        // One durable write per txg (a batch mostly holds one): the blocks are allocated
        // together, so they make a run, written as one request per device.
        ahead.sort_by_key(|&(_, txg, ..)| txg);
        for group in ahead.chunk_by(|a, b| a.1 == b.1) {
            let txg = group[0].1;
            let blocks: Vec<(u64, &Arc<Vec<u8>>)> = group
                .iter()
                .map(|(_, _, blkid, buf)| (*blkid, buf))
                .collect();
            // A failed write, or a txg that closed meanwhile (its sync writes the blocks),
            // leaves the records by value: the log takes the data instead.
            let Ok(Some(bps)) = self.pool.write_ahead(self.ds, txg, &blocks) else {
                continue;
            };
            let mut devices: Vec<u32> = bps
                .iter()
                .flatten()
                .flat_map(|bp| bp.dvas().map(|d| d.vdev.get()))
                .collect();
            devices.sort_unstable();
            devices.dedup();
            self.pool.zil.note_durable_data(devices.len());
            for (&(i, txg, blkid, _), bp) in group.iter().zip(bps) {
                let offset = blkid * bs;
                batch[i].1 = match bp {
                    Some(bp) => Record::Indirect { txg, offset, bp },
                    None => Record::Zero {
                        txg,
                        offset,
                        len: bs,
                    },
                };
            }
        }
        flush
    }
}

/// The txg machinery as the log sees it.
struct PoolHooks(Weak<Pool>);

impl TxgHooks for PoolHooks {
    fn sync_now(&self) -> Result<(), String> {
        match self.0.upgrade() {
            Some(p) => p.sync_now().map_err(|e| e.to_string()),
            None => Err("the pool is closed".into()),
        }
    }

    fn request_sync(&self) {
        if let Some(p) = self.0.upgrade() {
            p.request_sync();
        }
    }

    fn wait_commit(&self) -> Result<u64, String> {
        match self.0.upgrade() {
            Some(p) => p.wait_commit().map_err(|e| e.to_string()),
            None => Err("the pool is closed".into()),
        }
    }
}

fn random_guid() -> u64 {
    loop {
        let g: u64 = rand::random();
        if g != 0 {
            return g;
        }
    }
}

/// A pool opens only if the checksum and parity kernels the environment selects can run: a bad
/// `ZETA_FLETCHER4_IMPL`, `ZETA_FLETCHER2_IMPL` or `ZETA_PARITY_IMPL` is a clear error here,
/// before anything is read or written.
fn check_kernels() -> Result<(), PoolError> {
    crate::math::fletcher::selected().map_err(PoolError::Invalid)?;
    crate::math::fletcher2::selected().map_err(PoolError::Invalid)?;
    crate::math::parity::check_override().map_err(|e| PoolError::Invalid(e.to_string()))
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
        };
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
            open_txg: RwLock::new(synced_txg + 1),
            sync: Mutex::new(SyncState {
                synced_txg,
                request_seq: 0,
                completed_seq: 0,
                shutdown: false,
                error: None,
            }),
            sync_cv: Condvar::new(),
            mos: Mutex::new(mos),
            datasets: RwLock::new(BTreeMap::new()),
            dirty_bytes: AtomicI64::new(0),
            dirty_max: AtomicU64::new(dirty_max),
            placed_bytes: AtomicI64::new(0),
            held_bytes: AtomicI64::new(0),
            ahead_limit: AtomicU64::new(ahead_limit),
            ahead: Mutex::new(BTreeMap::new()),
            ahead_bytes: AtomicU64::new(0),
            slivers: Mutex::new((std::time::Instant::now(), 0, 0)),
            thread: Mutex::new(None),
            scan: Mutex::new(ScanState::default()),
            scanner: Mutex::new(None),
            last_io_nanos: AtomicU64::new(0),
            born: std::time::Instant::now(),
            zil,
            import_notes: Mutex::new(Vec::new()),
        });
        pool.zil
            .set_hooks(Box::new(PoolHooks(Arc::downgrade(&pool))));
        let weak = Arc::downgrade(&pool);
        let handle = std::thread::Builder::new()
            .name(format!("txg-sync-{}", pool.name))
            .spawn(move || sync_thread(weak))
            .expect("spawn sync thread");
        *pool.thread.lock() = Some(handle);
        pool
    }

    /// Writes the config into every label, in two phases (labels 0 and 2, then 1 and 3) so a
    /// crash tears at most one copy of each end.
    fn write_config(&self, state: PoolState) -> Result<(), PoolError> {
        let generation = self.config_gen.fetch_add(1, Ordering::SeqCst) + 1;
        let cfg = self.config_to_write(state);
        let (tops, required) = self.label_tops();
        let mut update =
            LabelUpdate::new(&tops, required, format!("config generation {generation}"));
        for phase in [[0usize, 2], [1, 3]] {
            update.step(|leaf| {
                let mut c = cfg.clone();
                c.leaf_guid = leaf.guid();
                write_config(leaf, &c, generation, &phase)
            })?;
            update.step(|leaf| leaf.flush())?;
        }
        let mut c = self.config.lock();
        c.state = state;
        c.scan = cfg.scan;
        c.tops = cfg.tops;
        Ok(())
    }

    // ----- import -------------------------------------------------------------------------

    /// Imports the pool named `name` (or the only pool present) from opened devices.
    pub fn import(
        devices: Vec<(Arc<dyn BlockDevice>, String)>,
        name: Option<&str>,
        opts: PoolOptions,
    ) -> Result<Arc<Pool>, PoolError> {
        check_kernels()?;
        // Read every device's labels and group them by pool.
        let mut pools: HashMap<u64, Vec<Member>> = HashMap::new();
        let mut unreadable = Vec::new();
        for (dev, path) in devices {
            let probe = Leaf::new(dev.clone(), 0);
            match read_labels(&probe) {
                Ok(l) => match l.config {
                    Some((generation, cfg)) => {
                        pools.entry(cfg.pool_guid).or_default().push((dev, path, generation, cfg, l.uberblocks))
                    }
                    None => unreadable.push(format!("{path}: no valid label ({})", l.describe_errors(|_| true))),
                },
                Err(LabelError::UnknownVersion(v)) => {
                    return Err(PoolError::CannotImport {
                        pool: name.unwrap_or("?").to_string(),
                        why: format!("{path}: format version {v} is newer than this zeta supports ({FORMAT_VERSION})"),
                    })
                }
                Err(e) => unreadable.push(format!("{path}: {e}")),
            }
        }
        let newest = |v: &Vec<Member>| v.iter().max_by_key(|e| e.2).map(|e| e.3.clone()).unwrap();
        let mut candidates: Vec<u64> = pools
            .iter()
            .filter(|(_, v)| {
                let cfg = newest(v);
                cfg.state != PoolState::Destroyed && name.is_none_or(|n| n == cfg.name)
            })
            .map(|(g, _)| *g)
            .collect();
        candidates.sort();
        let guid = match candidates.as_slice() {
            [g] => *g,
            [] => {
                let detail = if unreadable.is_empty() {
                    String::new()
                } else {
                    format!(": {}", unreadable.join("; "))
                };
                return Err(PoolError::NotFound(match name {
                    Some(n) => format!(" named '{n}'{detail}"),
                    None => detail,
                }));
            }
            _ => {
                let names: Vec<String> =
                    candidates.iter().map(|g| newest(&pools[g]).name).collect();
                return Err(invalid(format!(
                    "several pools found ({}); name the one to import",
                    names.join(", ")
                )));
            }
        };
        let members = pools.remove(&guid).unwrap();
        let config_gen = members.iter().map(|m| m.2).max().unwrap();
        let mut config = newest(&members);
        let pool_name = config.name.clone();
        let cannot = |why: String| PoolError::CannotImport {
            pool: pool_name.clone(),
            why,
        };

        // Assemble the vdev tree from the config, matching leaves by GUID.
        let mut by_guid: HashMap<u64, (Arc<dyn BlockDevice>, String)> = HashMap::new();
        let mut uberblocks: Vec<Uberblock> = Vec::new();
        for (dev, path, _, cfg, ubs) in members {
            by_guid.insert(cfg.leaf_guid, (dev, path));
            uberblocks.extend(ubs);
        }
        // Data vdevs are numbered 0..n and log devices follow with rising ids: the allocator,
        // the metaslab table and the log index by these.
        let n_data = config.tops.iter().filter(|t| !t.log).count();
        let well_formed = n_data > 0
            && config
                .tops
                .iter()
                .enumerate()
                .all(|(i, t)| (i < n_data) != t.log && (t.log || t.id == i as u32))
            && config.tops.windows(2).all(|w| w[0].id < w[1].id);
        if !well_formed {
            return Err(cannot(
                "the config's vdev list is malformed (vdev ids out of order)".into(),
            ));
        }
        let mut tops = Vec::new();
        let mut log_notes = Vec::new();
        for t in config.tops.iter_mut() {
            // Each leaf holds the whole vdev's space, or its share of a raidz's.
            let leaf_asize = match &t.raidz {
                Some(_) => t.asize / t.children.len() as u64,
                None => t.asize,
            };
            let mut slots: Vec<Option<Arc<Leaf>>> = Vec::new();
            let mut missing = Vec::new();
            for c in t.children.iter_mut() {
                match by_guid.get(&c.guid) {
                    Some((dev, path)) => {
                        if dev.len_bytes() < MIN_LEAF_BYTES
                            || crate::vdev::layout::usable_bytes(dev.len_bytes()).unwrap_or(0)
                                < leaf_asize
                        {
                            return Err(cannot(format!("{path}: device is smaller than when the pool was created (truncated?)")));
                        }
                        c.path = path.clone();
                        let leaf = Leaf::new(dev.clone(), c.guid);
                        let e = c.errors;
                        leaf.counters
                            .set([e.read, e.write, e.cksum, e.repaired_bytes]);
                        leaf.set_offline(c.offline);
                        leaf.set_faulted(c.faulted);
                        leaf.missed.lock().0 = c.missed.clone();
                        slots.push(Some(Arc::new(leaf)));
                    }
                    None => {
                        // Its place is kept, out of service, until it returns or is replaced.
                        missing.push(c.path.clone());
                        let leaf = Leaf::missing(&c.path, 0, c.guid);
                        leaf.missed.lock().0 = c.missed.clone();
                        slots.push(Some(Arc::new(leaf)));
                    }
                }
            }
            let tolerable = match (&t.raidz, t.kind) {
                (Some(rz), _) => rz.nparity as usize,
                (None, TopKind::Mirror) => t.children.len() - 1,
                _ => 0,
            };
            let lost = missing.len() > tolerable;
            if lost && t.log {
                // The log device may hold the only copy of writes acknowledged after the
                // last txg: going on without it must be asked for.
                if !opts.discard_log {
                    return Err(cannot(format!(
                        "log device {} is missing: it may hold writes acknowledged after the \
                         last txg. Bring it back, or import with --discard-log to give them up \
                         (the pool then opens at its last txg)",
                        missing.join(", ")
                    )));
                }
                log_notes.push(format!(
                    "{pool_name}: log device {} missing: writes acknowledged after the last txg \
                     and logged there are lost; `zeta pool remove {pool_name} {}` drops it",
                    missing.join(", "),
                    missing[0]
                ));
            } else if lost {
                return Err(cannot(format!(
                    "vdev {} ({}) is missing {} of {} devices and can lose at most {tolerable}: {}",
                    t.id,
                    t.kind_name(),
                    missing.len(),
                    t.children.len(),
                    missing.join(", ")
                )));
            }
            let vdev = match t.raidz {
                Some(rz) => TopVdev::new_raidz(t.id, t.guid, rz, slots).map_err(&cannot)?,
                None => TopVdev::new(t.id, t.guid, t.kind, slots.into_iter().flatten().collect()),
            };
            // (A log device with every leaf missing has no size of its own to check.)
            if vdev.asize_bytes < t.asize && !lost {
                return Err(cannot(format!("vdev {} is smaller than recorded", t.id)));
            }
            tops.push(Arc::new(vdev));
        }
        let tops_arc: Vec<Arc<TopVdev>> = tops;
        let data_tops: Vec<Arc<TopVdev>> = tops_arc[..n_data].to_vec();

        // Newest uberblock whose tree loads and verifies wins; older ones are the fallback.
        uberblocks.retain(|u| u.pool_guid.get() == guid);
        uberblocks.sort_by_key(|u| std::cmp::Reverse(u.txg.get()));
        uberblocks.dedup_by_key(|u| u.txg.get());
        let Some(newest_seen) = uberblocks.first().map(|u| u.txg.get()) else {
            return Err(cannot("no valid uberblock on any device".into()));
        };
        let mut failures = Vec::new();
        for ub in &uberblocks {
            let alloc = Allocator::new(&alloc_geometry(&config));
            let probe_zio = Arc::new(Zio::new(data_tops.clone(), alloc));
            let probe_io = ObjectIo {
                zio: probe_zio.clone(),
                cache: Arc::new(BlockCache::new(opts.cache_bytes)),
            };
            match load_mos(&probe_io, &config, ub) {
                Ok((mos, datasets)) => {
                    let alloc =
                        std::mem::replace(&mut *probe_zio.alloc.lock(), Allocator::new(&[]));
                    // New txgs must outrank every uberblock skipped on the way here.
                    let txg = commit_above_skipped(&tops_arc, n_data, ub, newest_seen)?;
                    let scan = config.scan.clone().unwrap_or_default();
                    let discard_log = opts.discard_log;
                    let pool = Self::assemble(config, tops_arc, alloc, opts, mos, txg, config_gen);
                    let mut opened = Vec::new();
                    for LoadedVolume {
                        mut ds,
                        zil: header,
                        replay_after,
                    } in datasets
                    {
                        // Records newer than the tree are replayed; a replay cut short by a
                        // crash kept the txg it counted from, which may be older.
                        let after = match replay_after {
                            0 => ub.tree_txg(),
                            t => t.min(ub.tree_txg()),
                        };
                        let (log, claims) = pool.open_log(&ds.name, header, after, discard_log)?;
                        if log.replay_after() != 0 {
                            // The first txg to commit, whatever it holds, must carry the
                            // txg counted from (`Log::replay_after`).
                            pool.mos.lock().dir_dirty = true;
                        }
                        ds.log = log;
                        *ds.replay_claims.lock() = claims;
                        opened.push(ds);
                    }
                    // Every chain is claimed: the logs with nothing to replay start anew.
                    for ds in &opened {
                        if ds.log.pending_replay().is_none() {
                            ds.log.start_chain(&pool.zil);
                        }
                    }
                    {
                        let mut map = pool.datasets.write();
                        for ds in opened {
                            map.insert(ds.name.clone(), Arc::new(ds));
                        }
                    }
                    *pool.scan.lock() = scan;
                    pool.import_notes.lock().extend(log_notes);
                    pool.write_config(PoolState::Active)?;
                    // A scrub or resilver that was running when the pool closed goes on
                    // where it was; leaves owed txgs get a resilver.
                    pool.resume_scrub();
                    pool.start_resilver();
                    return Ok(pool);
                }
                Err(e) => failures.push(format!("txg {}: {e}", ub.txg.get())),
            }
        }
        Err(cannot(format!(
            "no uberblock's tree verifies: {}",
            failures.join("; ")
        )))
    }

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
                    .any(|l| l.is_offline() || l.inject.lock().vanished);
                TopStatus {
                    id: t.id,
                    kind: t.kind,
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
        self.sync.lock().synced_txg
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes.load(Ordering::Acquire).max(0) as u64
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

    fn check_healthy(&self) -> Result<(), PoolError> {
        match &self.sync.lock().error {
            Some(why) => Err(PoolError::Suspended {
                pool: self.name.clone(),
                why: why.clone(),
            }),
            None => Ok(()),
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
        self.check_healthy()?;
        if !valid_volume_name(name) {
            return Err(invalid(format!(
                "invalid volume name '{name}': use letters, digits, '-', '_', '.', ':'"
            )));
        }
        if !volblocksize.is_power_of_two() || !(4096..=131072).contains(&volblocksize) {
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
        let checksum = checksum.unwrap_or(self.config.lock().checksum);
        let mut dn = DnodePhys::new(ObjectKind::VolumeData, volblocksize, checksum as u8, 1);
        dn.size_bytes = volsize.into();
        let ds = Arc::new(Dataset {
            name: name.to_string(),
            guid: random_guid(),
            volblocksize,
            checksum,
            created_txg: *self.open_txg.read(),
            volsize: AtomicU64::new(volsize),
            object: Object::new(dn, BlockKind::Data, AllocClass::Recorded),
            objset_bp: Mutex::new(BlkPtr::HOLE),
            // Its header goes to disk with the volume, in the sync below.
            log: Log::new_chain(&self.zil),
            replay_lock: Mutex::new(()),
            replay_claims: Mutex::new(Vec::new()),
            destroyed: AtomicBool::new(false),
        });
        map.insert(name.to_string(), ds.clone());
        mos.dir_dirty = true;
        drop(map);
        drop(mos);
        self.sync_now()?;
        Ok(ds)
    }

    pub fn destroy_volume(&self, name: &str) -> Result<(), PoolError> {
        self.check_healthy()?;
        {
            let mut mos = self.mos.lock();
            let ds = self
                .datasets
                .write()
                .remove(name)
                .ok_or_else(|| PoolError::NoSuchVolume(format!("{}/{name}", self.name)))?;
            // Under the open txg's lock, as `dirty_block` checks it: a change either sees the
            // flag, or lands in the open txg before the sync below takes its destruction.
            let hold = self.open_txg.write();
            ds.destroyed.store(true, Ordering::Release);
            drop(hold);
            mos.destroyed.push(ds);
            mos.dir_dirty = true;
        }
        self.sync_now()
    }

    /// Changes a volume's size; shrinking frees the blocks past the new end.
    pub fn resize_volume(&self, name: &str, volsize: u64) -> Result<(), PoolError> {
        self.check_healthy()?;
        let ds = self.dataset(name)?;
        check_volsize(volsize, ds.volblocksize)?;
        let old = ds.volsize();
        if volsize < old {
            let bs = ds.volblocksize as u64;
            let doomed = ds
                .object
                .allocated_blocks(&self.io, volsize / bs, old.div_ceil(bs))?;
            let hold = self.open_txg.read();
            for blkid in doomed {
                self.record_change(ds.as_ref(), *hold, blkid, Dirty::Free);
            }
            ds.volsize.store(volsize, Ordering::Release);
            drop(hold);
        } else {
            ds.volsize.store(volsize, Ordering::Release);
        }
        ds.object.set_size_bytes(volsize);
        self.mos.lock().dir_dirty = true;
        self.sync_now()
    }

    /// Replaces block `blkid` of a volume in the open txg, waiting first if too much data is
    /// dirty, and refusing with `NoSpace` if the pool could not hold it. Returns the txg the
    /// change went into. Without `wait`, `None`, with nothing done, where new contents
    /// (`Dirty::Data`) would wait (for memory, space, or the sync closing the txg).
    pub fn dirty_block(
        &self,
        ds: &Dataset,
        blkid: u64,
        change: Dirty,
        wait: bool,
    ) -> Result<Option<u64>, PoolError> {
        self.check_healthy()?;
        let hold = if matches!(change, Dirty::Data(_)) {
            match self.admit_block(ds, wait)? {
                Some(hold) => hold,
                None => return Ok(None),
            }
        } else {
            self.hold_open_txg(ds)?
        };
        let txg = *hold;
        self.record_change(ds, txg, blkid, change);
        drop(hold);
        self.sync_if_much_held();
        Ok(Some(txg))
    }

    /// Admits one more block of the volume into the open txg and holds the txg: waits first
    /// if too much is dirty, and refuses with `NoSpace` if the pool could not hold the block.
    /// Without `wait`, `None` where it would wait.
    fn admit_block(
        &self,
        ds: &Dataset,
        wait: bool,
    ) -> Result<Option<RwLockReadGuard<'_, u64>>, PoolError> {
        let len = ds.volblocksize as u64;
        if wait {
            self.throttle()?;
            self.reserve_space(len, len)?;
            return self.hold_open_txg(ds).map(Some);
        }
        if self.memory_held() >= self.dirty_max() || !self.has_room(len, len, false) {
            return Ok(None);
        }
        let Some(hold) = self.open_txg.try_read() else {
            return Ok(None);
        };
        if ds.destroyed.load(Ordering::Acquire) {
            return Ok(None);
        }
        Ok(Some(hold))
    }

    /// The open txg, held (a sync cannot close it meanwhile), if the volume still exists.
    fn hold_open_txg(&self, ds: &Dataset) -> Result<RwLockReadGuard<'_, u64>, PoolError> {
        let hold = self.open_txg.read();
        if ds.destroyed.load(Ordering::Acquire) {
            return Err(PoolError::NoSuchVolume(format!(
                "{}/{} (destroyed while open)",
                self.name, ds.name
            )));
        }
        Ok(hold)
    }

    /// Makes `change` block `blkid`'s change in open txg `txg` (held by the caller), counts
    /// its dirty bytes and frees the placed copy it supersedes, if any.
    fn record_change(&self, ds: &Dataset, txg: u64, blkid: u64, change: Dirty) {
        if let Some(bp) = self.record_change_keeping(ds, blkid, change) {
            self.io.zio.free(&bp, txg, AllocClass::Mos);
        }
    }

    /// `record_change`, but the copy written ahead that the change supersedes, if any, is
    /// returned for the caller to free (with its neighbours: `Zio::free_all`).
    fn record_change_keeping(&self, ds: &Dataset, blkid: u64, change: Dirty) -> Option<BlkPtr> {
        let mut placed = match &change {
            Dirty::Placed(bp) => bp.lsize.get() as i64,
            _ => 0,
        };
        let (delta, superseded) = ds.object.dirty(blkid, change);
        if let Some(bp) = &superseded {
            placed -= bp.lsize.get() as i64;
        }
        self.count_dirty(delta);
        self.placed_bytes.fetch_add(placed, Ordering::AcqRel);
        superseded
    }

    fn count_dirty(&self, delta: Delta) {
        self.dirty_bytes.fetch_add(delta.bytes, Ordering::AcqRel);
        self.held_bytes.fetch_add(delta.held, Ordering::AcqRel);
    }

    /// Lays `data` over bytes `at..` of block `blkid` of a volume in the open txg, without
    /// reading the block (`Object::patch`), waiting first if too much is dirty and refusing
    /// with `NoSpace` if the pool could not hold the block. Returns the txg, or `None` if
    /// the block's change in the open txg is not one a patch can extend: the caller writes
    /// the whole block instead. The caller holds the range lock of the bytes.
    ///
    /// Without `wait`, `None` also when the write would wait (for memory, space, or the
    /// sync closing the txg): the caller hands it to a thread that may.
    pub fn patch_block(
        &self,
        ds: &Dataset,
        blkid: u64,
        at: usize,
        data: Arc<Vec<u8>>,
        wait: bool,
    ) -> Result<Option<u64>, PoolError> {
        self.check_healthy()?;
        let Some(hold) = self.admit_block(ds, wait)? else {
            return Ok(None);
        };
        let txg = *hold;
        let Some(delta) = ds.object.patch(blkid, at, data) else {
            return Ok(None);
        };
        self.count_dirty(delta);
        drop(hold);
        self.sync_if_much_held();
        Ok(Some(txg))
    }

    /// Asks for a sync once a quarter of the dirty limit is held in memory, or once blocks
    /// written ahead of their txg hold a quarter of the free space (they hold no memory, but
    /// they, and the copies they replace, are freed only as txgs commit), or once the dirty
    /// blocks still to place would take a quarter of it: past that, every write's admission
    /// (`reserve_space`) counts usable segments under the allocator's lock, and then forces
    /// syncs itself. (A 512M volume on a 1G pool, random 4K writes: 45k writes/s with a 128M
    /// dirty limit, 33k with 1G before this bound.)
    fn sync_if_much_held(&self) {
        if self.memory_held() > self.dirty_max() / 4
            || self.ahead_bytes.load(Ordering::Relaxed) > self.ahead_limit.load(Ordering::Relaxed)
            || self.unplaced_bytes() * self.io.zio.max_inflation() > self.space().free / 4
        {
            self.request_sync();
        }
    }

    fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Ordering::Acquire).max(0) as u64
    }

    fn placed_bytes(&self) -> u64 {
        self.placed_bytes.load(Ordering::Acquire).max(0) as u64
    }

    /// The dirty bytes whose space is still to be allocated (all but the placed ones).
    fn unplaced_bytes(&self) -> u64 {
        self.dirty_bytes().saturating_sub(self.placed_bytes())
    }

    /// Writes the blocks that are not all zeros to new space outside the space map (the
    /// txg's tree adopts them later) in txg `txg`; returns where each went, `None` for an
    /// all-zero block, which is not written (the sync makes it a hole).
    fn write_nonzero(
        &self,
        ds: &Dataset,
        txg: u64,
        blocks: &[&[u8]],
        durable: bool,
    ) -> Result<Vec<Option<BlkPtr>>, PoolError> {
        let write = |bufs: &[&[u8]], props: WriteProps| {
            if durable {
                self.io.zio.write_batch_durable(bufs, props, txg)
            } else {
                self.io.zio.write_batch(bufs, props, txg)
            }
        };
        let is_data = |b: &&[u8]| b.iter().any(|&x| x != 0);
        let props = WriteProps {
            class: AllocClass::Mos,
            ..ds.object.data_props()
        };
        // Mostly every block holds data: then the batch is the caller's slice as it is.
        let (bps, data) = if blocks.iter().all(is_data) {
            (write(blocks, props)?, None)
        } else {
            let data: Vec<bool> = blocks.iter().map(is_data).collect();
            let bufs: Vec<&[u8]> = (blocks.iter().zip(&data))
                .filter(|(_, &d)| d)
                .map(|(b, _)| *b)
                .collect();
            let bps = if bufs.is_empty() {
                Vec::new()
            } else {
                write(&bufs, props)?
            };
            (bps, Some(data))
        };
        let bytes: u64 = bps.iter().map(|bp| bp.psize.get() as u64).sum();
        if bytes > 0 {
            *self.ahead.lock().entry(txg).or_default() += bytes;
            self.ahead_bytes.fetch_add(bytes, Ordering::AcqRel);
        }
        let mut bps = bps.into_iter();
        Ok(match data {
            None => bps.map(Some).collect(),
            Some(data) => data
                .into_iter()
                .map(|d| d.then(|| bps.next().expect("a pointer per written block")))
                .collect(),
        })
    }

    /// Writes whole blocks of a volume to their place now, straight from the caller's
    /// buffers, and makes them the blocks' changes in the open txg (`Dirty::Placed`): the
    /// txg's sync adopts them and holds no copy in memory meanwhile. All-zero blocks are not
    /// written; they become holes (`Dirty::Free`, `None` in their place). Returns the txg
    /// and where each block went.
    ///
    /// The open txg is held across the device write, so each copy is born in the txg that
    /// adopts it (a resilver finds a block by its birth txg); a sync that begins meanwhile
    /// waits for the write, as OpenZFS's txg holds do for a copy into the DMU. This is the
    /// path of streaming writes: no copy into a block buffer, and the checksum and the
    /// device write done by the writer's thread while the data is in its cache.
    pub fn place_blocks(
        &self,
        ds: &Dataset,
        blocks: &[(u64, &[u8])],
    ) -> Result<(u64, Vec<Option<BlkPtr>>), PoolError> {
        self.check_healthy()?;
        let bs = ds.volblocksize as u64;
        assert!(blocks.iter().all(|(_, b)| b.len() as u64 == bs));
        let bufs: Vec<&[u8]> = blocks.iter().map(|(_, b)| *b).collect();
        for attempt in 0.. {
            self.throttle()?;
            self.reserve_space(bs * blocks.len() as u64, bs)?;
            let hold = self.hold_open_txg(ds)?;
            let txg = *hold;
            let bps = match self.write_nonzero(ds, txg, &bufs, false) {
                Ok(bps) => bps,
                // Admission passed, yet the allocator found no segment for a block (the
                // free space moved into deferred frees meanwhile, say): the frees come back
                // a txg or two later. A block left unplaced here would fail the sync
                // instead, which suspends the pool; refuse the write cleanly rather.
                Err(PoolError::Zio(ZioError::Alloc(AllocError::NoSpace(_)))) => {
                    drop(hold);
                    if attempt == RESERVE_WAITS || self.space().freeing == 0 {
                        return Err(PoolError::NoSpace(self.name.clone()));
                    }
                    self.next_commit_releasing_frees()?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let superseded: Vec<BlkPtr> = (blocks.iter().zip(&bps))
                .filter_map(|(&(blkid, _), bp)| {
                    self.record_change_keeping(ds, blkid, bp.map_or(Dirty::Free, Dirty::Placed))
                })
                .collect();
            self.io.zio.free_all(&superseded, txg, AllocClass::Mos);
            drop(hold);
            self.sync_if_much_held();
            return Ok((txg, bps));
        }
        unreachable!("the loop returns")
    }

    /// The txg that writes go into now.
    pub fn open_txg(&self) -> u64 {
        *self.open_txg.read()
    }

    /// What writes hold in memory until a txg syncs, as the throttle counts it: the dirty
    /// blocks' buffers and patches' pieces (`Dirty::held`), or the buffers queued log
    /// records keep alive if those are more (a block rewritten again and again dirties one
    /// block but pins every version of it). Placed blocks are on their devices already: a
    /// txg of them costs its sync only their pointers, and syncing after every 32 MiB of
    /// them rewrote the volume's indirect blocks for every few hundred writes. A patch
    /// counts its pieces, not its block, so a txg of short writes into large blocks takes
    /// in as many writes as the memory allows; what bounds the work its sync then does is
    /// the free-space share in `sync_if_much_held`, which counts whole blocks.
    pub fn memory_held(&self) -> u64 {
        self.held_bytes().max(self.zil.pinned_bytes())
    }

    /// What writes may hold in memory before they wait for a sync.
    pub fn dirty_max(&self) -> u64 {
        self.dirty_max.load(Ordering::Relaxed)
    }

    /// The block cache's configured size.
    pub fn cache_capacity(&self) -> u64 {
        self.io.cache.capacity()
    }

    /// What the block cache holds now.
    pub fn cache_bytes(&self) -> u64 {
        self.io.cache.bytes()
    }

    /// Lets the block cache hold only `bytes` (at most its configured size) for now: a
    /// process short of memory lowers it, and raises it again as memory comes back.
    pub fn set_cache_limit(&self, bytes: u64) {
        self.io.cache.set_limit(bytes);
    }

    /// Sets the block cache's size and the dirty limit for as long as the pool stays open
    /// (they are settings of the process that holds it, not of the pool on disk).
    pub fn set_memory_limits(&self, cache_bytes: u64, dirty_max_bytes: u64) {
        self.io.cache.set_capacity(cache_bytes);
        self.dirty_max.store(dirty_max_bytes, Ordering::Relaxed);
        // Writers waiting under a lower limit may go on.
        self.sync_cv.notify_all();
    }

    fn throttle(&self) -> Result<(), PoolError> {
        if self.memory_held() < self.dirty_max() {
            return Ok(());
        }
        let mut st = self.sync.lock();
        while self.memory_held() >= self.dirty_max() {
            if let Some(why) = &st.error {
                return Err(PoolError::Suspended {
                    pool: self.name.clone(),
                    why: why.clone(),
                });
            }
            // Ask for a sync only if none is pending: every waiter shares the condvar, and
            // waking them all to ask again turned each txg into a storm of futex wakeups.
            if st.completed_seq >= st.request_seq {
                st.request_seq += 1;
                self.sync_cv.notify_all();
            }
            self.sync_cv.wait_for(&mut st, Duration::from_millis(100));
        }
        Ok(())
    }

    /// Admission control: a write is accepted only if the pool can still hold every dirty
    /// block plus its metadata and a reserve, so a txg sync never runs out of space.
    ///
    /// Blocks written ahead of their txg hold their space already, but as much room is kept
    /// free again for them (`ahead_bytes`, superseded copies included): after a crash the
    /// intent log points at them, import holds them until the replay commits, and the replay
    /// copies them (one copy per block at most) into that room. Without it, a stream of
    /// writes could leave a log that no replay has room for, and the volume could not be
    /// opened.
    ///
    /// `block` is the size of the blocks being written. Near full, the free space is counted
    /// only in segments such blocks can take (`Zio::usable_space`): a pool of slivers
    /// between blocks has free bytes but no room for one more block, and a txg sync that
    /// cannot place a block suspends the pool.
    fn reserve_space(&self, len: u64, block: u64) -> Result<(), PoolError> {
        for attempt in 0..=RESERVE_WAITS {
            if self.has_room(len, block, true) {
                return Ok(());
            }
            let space = self.space();
            if attempt == RESERVE_WAITS || space.freeing == 0 && self.dirty_bytes() == 0 {
                break;
            }
            // Deferred frees return as txgs commit: wait for the next commit and try again.
            self.next_commit_releasing_frees()?;
        }
        Err(PoolError::NoSpace(self.name.clone()))
    }

    /// `reserve_space`'s test, once: whether the pool has room now for `len` more dirty
    /// bytes in blocks of `block` bytes. Without `count`, a pool with less than twice the
    /// room needed is taken as full rather than counted (`fits` takes the allocator's lock).
    fn has_room(&self, len: u64, block: u64, count: bool) -> bool {
        let space = self.space();
        let slop = (space.size / 32).max(4 << 20);
        // Placed blocks already hold their space: only the rest is still to allocate.
        let inflation = self.io.zio.max_inflation();
        let dirty = (self.unplaced_bytes() + len) * inflation;
        let ahead = self.ahead_bytes.load(Ordering::Acquire);
        let need = dirty + dirty / 8 + slop + ahead * inflation;
        space.free >= 2 * need || count && space.free >= need && self.fits(&space, block, need)
    }

    /// Whether blocks of `block` bytes still find `need` bytes of room among the free
    /// segments. Counting walks every free segment under the allocator's lock (a pool
    /// fragmented by small random writes has hundreds of thousands), so the slivers found
    /// are taken as still there for `SLIVERS_FOR`; a doubtful answer is counted afresh.
    fn fits(&self, space: &Space, block: u64, need: u64) -> bool {
        let mut cached = self.slivers.lock();
        let (at, size, slivers) = *cached;
        if size == block && at.elapsed() < SLIVERS_FOR && space.free.saturating_sub(slivers) >= need
        {
            return true;
        }
        let usable = self.io.zio.usable_space(block);
        *cached = (
            std::time::Instant::now(),
            block,
            space.free.saturating_sub(usable),
        );
        usable >= need
    }

    // ----- intent log ---------------------------------------------------------------------

    /// Writes blocks of the volume, dirty in txg `txg`, to their place now rather than at
    /// the txg's sync, and tells the object so (`set_override`): the sync adopts each copy
    /// whose buffer is still the block's change, and writes nothing more for it. Returns
    /// where each went, or `None` (nothing written) if `txg` is no longer open. A copy that
    /// is not adopted (the block was overwritten meanwhile) is freed, but only as frees are:
    /// a txg later than any log record pointing at it can still need it.
    ///
    /// The txg is held open through the write, as `place_blocks` holds it: a batch's durable
    /// write takes milliseconds, and a txg that began to sync meanwhile adopted none of it,
    /// so every block was written twice (a test's 6 MiB of 16K blocks, under a parallel test
    /// run, one time in six: its copies ahead lay dead at the front of the devices).
    ///
    /// All-zero blocks are not written (`None` in their place): the sync makes them holes.
    ///
    /// Used for the whole blocks a sync request needs (`InPlace`), so each copy is durable
    /// when this returns (`Zio::write_batch_durable`). Streaming writes place their blocks
    /// without a buffer at all (`place_blocks`).
    pub fn write_ahead(
        &self,
        ds: &Dataset,
        txg: u64,
        blocks: &[(u64, &Arc<Vec<u8>>)],
    ) -> Result<Option<Vec<Option<BlkPtr>>>, PoolError> {
        let hold = self.hold_open_txg(ds)?;
        if *hold != txg {
            return Ok(None);
        }
        let bufs: Vec<&[u8]> = blocks.iter().map(|(_, b)| b.as_slice()).collect();
        let bps = self.write_nonzero(ds, txg, &bufs, true)?;
        for (&(blkid, buf), bp) in blocks.iter().zip(&bps) {
            if let Some(old) = bp.and_then(|bp| ds.object.set_override(blkid, buf, bp)) {
                // Not `open_txg()`: the lock is held here, and a second read of it waits
                // behind a sync that waits for this one.
                self.io.zio.free(&old, txg, AllocClass::Mos);
            }
        }
        drop(hold);
        Ok(Some(bps))
    }

    /// Queues a record of a change to the volume in its intent log (the pool counts what
    /// queued records keep in memory: `Zil::pinned_bytes`).
    pub fn append_log(&self, ds: &Dataset, rec: Record) {
        ds.log.append(&self.zil, rec);
    }

    /// Makes every write to the volume so far durable, then calls `done` (maybe on another
    /// thread, maybe before returning).
    pub fn commit_log(&self, ds: &Dataset, done: Done) {
        ds.log.commit(&self.zil, &InPlace { pool: self, ds }, done)
    }

    /// `commit_log` for a thread that must not stay on as the log's committer: true if it
    /// left requests waiting, and someone must call `commit_log` soon (`Log::commit_bounded`).
    pub fn commit_log_bounded(&self, ds: &Dataset, done: Done) -> bool {
        ds.log
            .commit_bounded(&self.zil, &InPlace { pool: self, ds }, done)
    }

    /// `commit_log` only if the volume's log has a committer at work or nothing to commit
    /// (`Log::join`); else gives `done` back.
    pub fn join_log_commit(&self, ds: &Dataset, done: Done) -> Option<Done> {
        ds.log.join(done)
    }

    /// The blocking form of [`commit_log`](Self::commit_log).
    pub fn commit_log_wait(&self, ds: &Dataset) -> Result<(), crate::zil::LogError> {
        ds.log.commit_wait(&self.zil, &InPlace { pool: self, ds })
    }

    /// The volume's log records left from before the last crash, if it has not been
    /// replayed yet. The caller applies them (in order) and then calls `finish_replay`.
    pub fn pending_replay(&self, ds: &Dataset) -> Option<Vec<Record>> {
        ds.log.pending_replay()
    }

    /// Commits a txg that writes every volume's log header, so that each log takes commits
    /// from its first sync request. A log's chain starts at import, but only a txg that
    /// writes the directory puts its header on disk, and until then a FLUSH or FUA write
    /// commits a txg instead (`fallback_syncs`). A server calls this before it serves;
    /// commands that only look at a pool do not, and write nothing.
    pub fn ready_logs(&self) -> Result<(), PoolError> {
        self.mos.lock().dir_dirty = true;
        self.sync_now()
    }

    /// After the replayed records are applied: starts a new chain and commits both in one
    /// txg. A crash before that commit replays the old chain again, to the same result.
    pub fn finish_replay(&self, ds: &Dataset) -> Result<(), PoolError> {
        ds.log.start_chain(&self.zil);
        self.mos.lock().dir_dirty = true;
        self.sync_now()?;
        // The replay's copies are committed: the blocks its records pointed at can go.
        let claims = std::mem::take(&mut *ds.replay_claims.lock());
        let txg = self.open_txg();
        for bp in claims {
            self.io.zio.free(&bp, txg, AllocClass::Mos);
        }
        Ok(())
    }

    /// Loads a volume's log at import: walks its chain from the header, claims the blocks in
    /// log space, and keeps the records newer than txg `after` for replay. The blocks that
    /// records of writes made in place point at are verified now and claimed (returned)
    /// until the replay is committed.
    fn open_log(
        &self,
        vol: &str,
        header: ZilHeader,
        after: u64,
        discard: bool,
    ) -> Result<(Log, Vec<BlkPtr>), PoolError> {
        if header.chain == 0 {
            return Ok((Log::off(), Vec::new()));
        }
        let mut read = |a: BlockAddr| -> Result<Vec<u8>, String> {
            // An address no log block can have (a damaged chain): no block there.
            let Some(top) = self.zil.top(a.vdev) else {
                return Ok(Vec::new());
            };
            let out = top.children.iter().filter(|c| c.is_offline()).count();
            if out > top.redundancy() {
                return Err(format!(
                    "vdev {} has {out} of {} devices missing or offline",
                    a.vdev,
                    top.children.len()
                ));
            }
            if a.len > MAX_BLOCK
                || a.offset.checked_add(top.asize_of(a.len as u64)) > Some(top.asize_bytes)
            {
                return Ok(Vec::new());
            }
            let mut buf = vec![0u8; a.len as usize];
            // A block that does not read back intact is where the chain ends (never
            // written, or torn).
            match top.read_maybe_absent(a.offset, &mut buf, &is_intact) {
                Ok(_) => Ok(buf),
                Err(_) => Ok(Vec::new()),
            }
        };
        let (blocks, end) = walk_chain(header.chain, header.head, header.head_seq, &mut read);
        let mut addrs = Vec::new();
        let mut at = header.head;
        let mut records = Vec::new();
        for b in &blocks {
            // Only the part of its slot the block took: the rest was freed when it was
            // written and may hold a block of another chain now.
            let part = self.zil.written_part(at, b.body_len());
            if let Err(why) = self.zil.claim_slot(part) {
                return Err(PoolError::CannotImport {
                    pool: self.name.clone(),
                    why: format!("volume {vol}: intent log: {why}"),
                });
            }
            addrs.push(part);
            at = b.next;
            records.extend(b.records.iter().filter(|r| r.txg() > after).cloned());
        }
        if let EndOfChain::Unreadable(why) = end {
            if !discard {
                return Err(PoolError::CannotImport {
                    pool: self.name.clone(),
                    why: format!(
                        "volume {vol}: its intent log cannot be read ({why}); it may hold \
                         acknowledged writes. Bring the device back, or import with \
                         --discard-log to lose them"
                    ),
                });
            }
            self.import_notes.lock().push(format!(
                "{}/{vol}: intent log unreadable after {} blocks ({why}): writes acknowledged \
                 after txg {after} and not in those blocks are lost",
                self.name,
                blocks.len()
            ));
        }
        let (records, claims) = self.claim_in_place_records(records);
        Ok((Log::imported(header, addrs, records, after), claims))
    }

    /// Verifies the block each record of a write made in place points at, and claims it so
    /// that nothing is allocated over it before the replay has copied what it needs. A block
    /// that does not verify was written by a batch whose flush never completed, so nothing
    /// from that record on was acknowledged: the log ends there, as at a torn log block.
    /// The data is read again at the replay, one block at a time: a log may point at far
    /// more than fits in memory.
    fn claim_in_place_records(&self, mut records: Vec<Record>) -> (Vec<Record>, Vec<BlkPtr>) {
        let mut claims = Vec::new();
        let mut end = records.len();
        for (i, r) in records.iter().enumerate() {
            let Record::Indirect { bp, .. } = r else {
                continue;
            };
            if self.io.zio.read(bp).is_err() || self.io.zio.claim(bp).is_err() {
                end = i;
                break;
            }
            claims.push(*bp);
        }
        records.truncate(end);
        (records, claims)
    }

    /// The data of a block an intent-log record of a write made in place points at (one the
    /// import claimed), for its replay.
    pub fn read_in_place(&self, bp: &BlkPtr) -> Result<Vec<u8>, PoolError> {
        Ok(self.io.zio.read(bp)?)
    }

    // ----- sync ---------------------------------------------------------------------------

    /// Asks the sync thread for a pass without waiting for it.
    fn request_sync(&self) {
        let mut st = self.sync.lock();
        if st.completed_seq >= st.request_seq {
            st.request_seq += 1;
            self.sync_cv.notify_all();
        }
    }

    /// Commits everything written so far: returns once every write that completed before the
    /// call is on stable storage.
    pub fn sync_now(&self) -> Result<(), PoolError> {
        let mut st = self.sync.lock();
        st.request_seq += 1;
        let mine = st.request_seq;
        self.sync_cv.notify_all();
        self.wait_sync_until(st, |st| st.completed_seq >= mine)
            .map(|_| ())
    }

    /// Returns once a txg commits (or a sync finds nothing to commit): the one syncing now if
    /// there is one, else one asked for now. Gives the last committed txg. Unlike `sync_now`,
    /// which waits for a sync that starts after the call, this does not wait past the sync
    /// in flight: for the log, whose blocks that sync frees as it commits.
    pub fn wait_commit(&self) -> Result<u64, PoolError> {
        let mut st = self.sync.lock();
        let seen = st.synced_txg;
        if st.completed_seq >= st.request_seq {
            st.request_seq += 1;
            self.sync_cv.notify_all();
        }
        let mine = st.request_seq;
        self.wait_sync_until(st, |st| st.synced_txg > seen || st.completed_seq >= mine)
    }

    /// Waits on the sync thread until `done`, and returns the last committed txg; an error
    /// if the pool is suspended meanwhile, or exported with its sync thread gone.
    fn wait_sync_until(
        &self,
        mut st: MutexGuard<'_, SyncState>,
        done: impl Fn(&SyncState) -> bool,
    ) -> Result<u64, PoolError> {
        loop {
            if let Some(why) = &st.error {
                return Err(PoolError::Suspended {
                    pool: self.name.clone(),
                    why: why.clone(),
                });
            }
            if done(&st) {
                return Ok(st.synced_txg);
            }
            if st.shutdown && self.thread.try_lock().is_some_and(|t| t.is_none()) {
                return Err(invalid(format!("pool '{}' is exported", self.name)));
            }
            self.sync_cv.wait_for(&mut st, Duration::from_millis(200));
        }
    }

    /// Waits for the next txg to commit (`wait_commit`), one that commits even if nothing
    /// else is dirty: frees return to use as txgs commit. A writer short of space waits for
    /// the sync in flight rather than for one of its own (`sync_now`), which with a sync
    /// always in flight is the second to commit. Under random 4K writes to 128K blocks
    /// on a half-full pool, writers spent half their time there (write p99 220 ms).
    fn next_commit_releasing_frees(&self) -> Result<(), PoolError> {
        // Held by a sync in progress, which will commit: then nothing needs marking. (Waiting
        // for the lock would wait for that sync, and the commit after it.)
        if let Some(mut mos) = self.mos.try_lock() {
            mos.dir_dirty = true;
        }
        self.wait_commit().map(|_| ())
    }

    /// Syncs one txg if anything is dirty. Returns the txg committed, if any.
    fn sync_once(&self) -> Result<Option<u64>, PoolError> {
        let mut mos = self.mos.lock();
        let (txg, syncing_bytes, datasets) = {
            let mut open = self.open_txg.write();
            let datasets: Vec<Arc<Dataset>> = self.datasets.read().values().cloned().collect();
            let any = mos.dir_dirty
                || !mos.destroyed.is_empty()
                || datasets.iter().any(|d| d.object.has_open_changes());
            if !any {
                return Ok(None);
            }
            let txg = *open;
            *open += 1;
            let bytes: SyncBytes = datasets.iter().map(|d| d.object.begin_sync()).sum();
            (txg, bytes, datasets)
        };
        let io = &self.io;
        // Begun now so that it sees which leaves miss a write of this txg.
        let (label_tops, required) = self.label_tops();
        let mut commit =
            LabelUpdate::new(&label_tops, required, format!("the uberblock of txg {txg}"));

        // 1. Volumes: data, indirect blocks, and a new objset block for each changed one.
        for ds in &datasets {
            let before = ds.object.dnode();
            let dn = ds.object.sync(io, txg)?;
            let mut os_bp = ds.objset_bp.lock();
            if dn == before && !os_bp.is_hole() {
                continue;
            }
            let mut os = ObjsetPhys::new(OBJSET_VOLUME);
            os.dnodes[0] = dn;
            let props = meta_props(
                BlockKind::Objset,
                self.config.lock().checksum,
                AllocClass::Recorded,
            );
            let bp = io
                .zio
                .write(os.as_bytes(), props, txg, dn.root.fill.get())?;
            if !os_bp.is_hole() {
                io.zio.free(&os_bp, txg, AllocClass::Recorded);
            }
            *os_bp = bp;
            mos.dir_dirty = true;
        }
        let mut syncing_bytes = syncing_bytes;
        let destroyed = std::mem::take(&mut mos.destroyed);
        for ds in &destroyed {
            // Its unsynced writes die with it; they no longer count as dirty.
            syncing_bytes += ds.object.begin_sync();
            ds.object.free_all(io, txg)?;
            let os_bp = *ds.objset_bp.lock();
            if !os_bp.is_hole() {
                io.zio.free(&os_bp, txg, AllocClass::Recorded);
            }
        }

        // 2. The directory (MOS), with each volume's log header moved past the log blocks
        // this txg makes obsolete.
        for ds in &datasets {
            if ds.log.prepare_sync(txg).1 {
                mos.dir_dirty = true;
            }
        }
        if mos.dir_dirty {
            let map = self.datasets.read();
            let mut bytes = Vec::with_capacity(map.len() * ENTRY_BYTES);
            for ds in map.values() {
                let mut e = DirEntryPhys::new_zeroed();
                e.set_name(&ds.name);
                e.guid = ds.guid.into();
                e.volsize = ds.volsize().into();
                e.volblocksize = ds.volblocksize.into();
                e.checksum = ds.checksum as u8;
                e.created_txg = ds.created_txg.into();
                e.objset = *ds.objset_bp.lock();
                e.zil = ds.log.header().encode();
                e.replay_after = ds.log.replay_after().into();
                bytes.extend_from_slice(e.as_bytes());
            }
            drop(map);
            rewrite_object(&mos.dir, &bytes)?;
            mos.dir.begin_sync();
            mos.dir.sync(io, txg)?;
            mos.dir_dirty = false;
        }

        // 3. Space maps: every allocation and free of this txg outside the MOS.
        let dirty_ms = io.zio.alloc.lock().dirty_metaslabs();
        let mut table_changes = Vec::new();
        for (vdev, ms) in dirty_ms {
            let (records, replace) = io.zio.alloc.lock().take_records(vdev, ms);
            let flat = mos.ms_base[vdev as usize] + ms;
            let sm = &mos.sms[flat];
            let encoded = encode_all(&records);
            if replace {
                rewrite_object(sm, &encoded)?;
            } else {
                append_object(sm, io, &encoded)?;
            }
            sm.begin_sync();
            let dn = sm.sync(io, txg)?;
            table_changes.push((flat, dn));
        }
        if !table_changes.is_empty() {
            for (flat, dn) in table_changes {
                write_object_bytes(&mos.mstable, io, flat as u64 * 256, dn.as_bytes())?;
            }
            mos.mstable.begin_sync();
            mos.mstable.sync(io, txg)?;
        }

        // 4. The MOS objset block.
        let mut os = ObjsetPhys::new(OBJSET_MOS);
        os.dnodes[0] = mos.dir.dnode();
        os.dnodes[1] = mos.mstable.dnode();
        let checksum = self.config.lock().checksum;
        let root = io.zio.write(
            os.as_bytes(),
            meta_props(BlockKind::Objset, checksum, AllocClass::Mos),
            txg,
            0,
        )?;
        if !mos.objset_bp.is_hole() {
            io.zio.free(&mos.objset_bp, txg, AllocClass::Mos);
        }
        mos.objset_bp = root;

        // 5. Commit: flush everything the uberblock points at, write it, flush again. A leaf
        // that missed a write of this txg or fails a step takes no further part (its labels
        // keep an older txg); the txg commits if every top-level vdev still has a leaf that
        // took every write and all three steps.
        let ub = Uberblock::new(txg, self.guid, root);
        commit.drop_leaves_that_missed_writes()?;
        commit.step(|leaf| leaf.flush())?;
        commit.step(|leaf| write_uberblock(leaf, &ub))?;
        commit.step(|leaf| leaf.flush())?;
        // Leaves that missed part of this txg owe it to a resilver.
        for leaf in commit.dropped_leaves() {
            leaf.missed.lock().add(txg);
        }
        let free = {
            let mut alloc = io.zio.alloc.lock();
            alloc.txg_synced(txg);
            alloc.space().free
        };
        self.ahead_limit.store(free / 4, Ordering::Relaxed);
        {
            let mut ahead = self.ahead.lock();
            let later = ahead.split_off(&(txg + 1));
            let done: u64 = std::mem::replace(&mut *ahead, later).values().sum();
            self.ahead_bytes.fetch_sub(done, Ordering::AcqRel);
        }
        self.dirty_bytes
            .fetch_sub(syncing_bytes.dirty as i64, Ordering::AcqRel);
        self.placed_bytes
            .fetch_sub(syncing_bytes.placed as i64, Ordering::AcqRel);
        self.held_bytes
            .fetch_sub(syncing_bytes.held as i64, Ordering::AcqRel);
        drop(mos);
        // The log blocks this txg covers are free; sync requests it covers are answered.
        for ds in &datasets {
            ds.log.txg_committed(&self.zil, txg);
        }
        for ds in &destroyed {
            ds.log.discard(&self.zil);
        }
        Ok(Some(txg))
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
        // A running scrub pauses; its bookmark is saved so the next import resumes it.
        if let Some(s) = self.scanner.lock().take() {
            s.pause();
        }
        let scrubbing = self.scan.lock().state == ScanPhase::Scanning;
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
        let scan = self.scan.lock().clone();
        cfg.scan = (scan.state != ScanPhase::None).then_some(scan);
        self.record_counters(&mut cfg);
        cfg
    }

    /// Replaces leaf `old` (present or missing; its path as status shows it, or its GUID) by
    /// a new device, in place while the pool runs: the new device takes the leaf's position
    /// with a fresh GUID, owing every txg so far, and a resilver rebuilds it in full while
    /// the pool serves I/O. A stripe has nothing to rebuild from and cannot be replaced.
    pub fn replace(
        self: &Arc<Self>,
        old: &str,
        new_dev: Arc<dyn BlockDevice>,
        new_path: String,
        force: bool,
    ) -> Result<(), PoolError> {
        let cfg = self.config.lock().clone();
        let Some((t, ci)) = cfg.tops.iter().enumerate().find_map(|(t, tc)| {
            tc.children
                .iter()
                .position(|c| c.path == old || c.guid.to_string() == old)
                .map(|ci| (t, ci))
        }) else {
            return Err(invalid(format!(
                "pool '{}' has no device {old} (see `zeta pool status`)",
                self.name
            )));
        };
        let tc = &cfg.tops[t];
        if tc.log {
            return Err(log_device_only(old, tc.id));
        }
        if tc.kind == TopKind::Stripe {
            return Err(invalid(format!(
                "{old} is a stripe vdev of its own: there is no redundancy to rebuild it from"
            )));
        }
        if cfg
            .tops
            .iter()
            .flat_map(|t| &t.children)
            .any(|c| c.path == new_path)
        {
            return Err(invalid(format!(
                "{new_path} is already part of pool '{}'",
                self.name
            )));
        }
        let need = match &tc.raidz {
            Some(_) => tc.asize / tc.children.len() as u64,
            None => tc.asize,
        };
        if new_dev.len_bytes() < MIN_LEAF_BYTES
            || crate::vdev::layout::usable_bytes(new_dev.len_bytes()).unwrap_or(0) < need
        {
            return Err(invalid(format!(
                "{new_path}: too small ({} bytes) to replace {old}",
                new_dev.len_bytes()
            )));
        }
        let old_guid = tc.children[ci].guid;
        let Some(leaf) = self.io.zio.tops[t]
            .children
            .iter()
            .find(|l| l.guid() == old_guid)
            .cloned()
        else {
            return Err(invalid(format!("{old}: not in the running vdev tree")));
        };
        let probe = Leaf::new(new_dev.clone(), random_guid());
        if !force {
            check_unused(&probe, &new_path)?;
        }
        let new_guid = probe.guid();
        self.sync_now()?;
        {
            // No sync runs while the MOS lock is held: every txg up to the last synced one
            // is owed to the new device, and every later one is written to it.
            let _mos = self.mos.lock();
            let owed = self.synced_txg().max(1);
            let mut missed = crate::vdev::TxgRanges::default();
            missed.add_range([1, owed]);
            self.config.lock().tops[t].children[ci] = LeafConfig {
                guid: new_guid,
                path: new_path,
                errors: Default::default(),
                offline: false,
                faulted: false,
                missed: missed.0.clone(),
            };
            // The new device's labels first: should the rest not follow, the other leaves'
            // labels still name the old device and nothing is lost.
            let generation = self.config_gen.load(Ordering::SeqCst) + 1;
            let mut c = self.config_to_write(PoolState::Active);
            c.leaf_guid = new_guid;
            write_config(&probe, &c, generation, &[0, 1, 2, 3])?;
            probe.flush()?;
            leaf.swap(new_dev, new_guid, missed);
            let state = self.config.lock().state;
            self.write_config(state)?;
        }
        self.start_resilver();
        Ok(())
    }

    /// Copies the leaves' live error counters into `cfg` (leaves not present keep theirs).
    fn record_counters(&self, cfg: &mut PoolConfig) {
        let (tops, _) = self.label_tops();
        for (top, tc) in tops.iter().zip(cfg.tops.iter_mut()) {
            for c in tc.children.iter_mut() {
                if let Some(leaf) = top
                    .children
                    .iter()
                    .find(|l| l.guid() == c.guid && !l.is_missing())
                {
                    let [read, write, cksum, repaired_bytes] = leaf.counters.snapshot();
                    c.errors = crate::spa::label::LeafErrors {
                        read,
                        write,
                        cksum,
                        repaired_bytes,
                    };
                    c.offline = leaf.is_admin_offline();
                    c.faulted = leaf.is_faulted();
                    c.missed = leaf.missed.lock().0.clone();
                }
            }
        }
    }

    /// Whether the counters moved since the config was last written.
    fn counters_changed(&self) -> bool {
        let saved = self.config.lock().clone();
        let mut now = saved.clone();
        self.record_counters(&mut now);
        now != saved
    }

    /// Finds a leaf by the path the config shows for it (or its GUID in decimal).
    fn find_leaf(&self, dev: &str) -> Result<(usize, Arc<Leaf>), PoolError> {
        let cfg = self.config.lock().clone();
        for (t, (top, tc)) in self.io.zio.tops.iter().zip(&cfg.tops).enumerate() {
            for c in &tc.children {
                if c.path == dev || c.guid.to_string() == dev {
                    return match top.children.iter().find(|l| l.guid() == c.guid) {
                        Some(l) => Ok((t, l.clone())),
                        None => Err(invalid(format!("{dev}: the device is missing"))),
                    };
                }
            }
        }
        if let Some(log) = cfg.tops.iter().find(|t| {
            t.log
                && t.children
                    .iter()
                    .any(|c| c.path == dev || c.guid.to_string() == dev)
        }) {
            return Err(log_device_only(dev, log.id));
        }
        Err(invalid(format!(
            "pool '{}' has no device {dev} (see `zeta pool status`)",
            self.name
        )))
    }

    /// Takes a leaf offline (no I/O reaches it; the txgs it misses are recorded) or brings it
    /// back online, which resilvers what it missed. Offline is refused where the vdev would
    /// be left without the redundancy to serve every block.
    pub fn set_offline(self: &Arc<Self>, dev: &str, offline: bool) -> Result<(), PoolError> {
        let (t, leaf) = self.find_leaf(dev)?;
        if offline && !leaf.is_admin_offline() {
            let top = &self.io.zio.tops[t];
            let cfg = self.config.lock().clone();
            let tc = &cfg.tops[t];
            // Missing devices are leaves out of service too.
            let unavailable = top.children.iter().filter(|l| l.is_offline()).count() + 1;
            let tolerable = top.redundancy();
            if unavailable > tolerable {
                return Err(invalid(format!(
                    "cannot take {dev} offline: vdev {} ({}) would have {unavailable} of {} \
                     devices unavailable, more than it can lose ({tolerable})",
                    top.id,
                    tc.kind_name(),
                    tc.children.len()
                )));
            }
        }
        if leaf.is_admin_offline() == offline {
            return Ok(());
        }
        // Writes already in the open txg must not reach a leaf taken offline half-way: sync
        // first, so the leaf misses whole txgs only.
        self.sync_now()?;
        leaf.set_offline(offline);
        {
            let _mos = self.mos.lock();
            let state = self.config.lock().state;
            self.write_config(state)?;
        }
        if !offline {
            self.start_resilver();
        }
        Ok(())
    }

    /// Adds a separate log device (a stripe or a mirror) while the pool runs; log blocks go
    /// there from now on. Returns its vdev id.
    pub fn add_log(self: &Arc<Self>, spec: TopSpec, force: bool) -> Result<u32, PoolError> {
        let spec = spec.as_log();
        let mut mos = self.mos.lock();
        let cfg = self.config.lock().clone();
        for (_, path) in &spec.leaves {
            if cfg
                .tops
                .iter()
                .flat_map(|t| &t.children)
                .any(|c| c.path == *path)
            {
                return Err(invalid(format!(
                    "{path} is already in pool '{}'",
                    self.name
                )));
            }
        }
        let id = cfg.tops.last().map_or(0, |t| t.id + 1);
        let (vdev, tc) = build_top(id, spec, force)?;
        let vdev = Arc::new(vdev);
        // Known to the log (so its labels are written) but not used before they are.
        self.zil
            .add_vdev(vdev.clone(), (0, tc.log_bytes), true, true);
        self.config.lock().tops.push(tc);
        if let Err(e) = self.write_config(cfg.state) {
            self.config.lock().tops.retain(|t| t.id != id);
            let _ = self.zil.remove_vdev(id);
            // Labels that took the new config are overwritten by a newer generation.
            let _ = self.write_config(cfg.state);
            return Err(e);
        }
        self.zil.set_removing(id, false);
        // Volumes of a pool made before the log existed start logging now; their new
        // chains' headers go out with the next txg.
        for ds in self.datasets.read().values() {
            if ds.log.is_off() {
                ds.log.start_chain(&self.zil);
                mos.dir_dirty = true;
            }
        }
        drop(mos);
        self.sync_now()?;
        Ok(id)
    }

    /// Removes a separate log device (`dev`: one of its devices, by path or GUID; a log
    /// mirror goes as a whole) while the pool runs. Log blocks stop going there; every
    /// volume's chain is moved off it and the txgs covering what it holds are committed,
    /// then the config forgets it and its labels are cleared. Returns the paths of the
    /// devices removed.
    pub fn remove_log(self: &Arc<Self>, dev: &str) -> Result<Vec<String>, PoolError> {
        let cfg = self.config();
        let named = |t: &TopConfig| {
            t.children
                .iter()
                .any(|c| c.path == dev || c.guid.to_string() == dev)
        };
        let Some(tc) = cfg.tops.iter().find(|t| named(t)) else {
            return Err(invalid(format!(
                "pool '{}' has no device {dev} (see `zeta pool status`)",
                self.name
            )));
        };
        if !tc.log {
            return Err(invalid(format!(
                "{dev} is a data device: only log devices can be removed"
            )));
        }
        let v = tc.id;
        let top = self.zil.top(v);
        self.zil.set_removing(v, true);
        let emptied = (|| -> Result<(), PoolError> {
            // A batch being written when the removal began may still be on its way to the
            // device (a slow device, a loaded machine): wait for it, within reason.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let mut pause = Duration::from_millis(1);
            while std::time::Instant::now() < deadline {
                for ds in self.datasets() {
                    ds.log.move_off(&self.zil, v).map_err(|e| {
                        invalid(format!("volume {}: moving its log off {dev}: {e}", ds.name))
                    })?;
                }
                // A txg moves every header past what it covers and frees it.
                self.mos.lock().dir_dirty = true;
                self.sync_now()?;
                if self.zil.used_on(v) == 0 {
                    return Ok(());
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            let waiting: Vec<String> = self
                .datasets()
                .iter()
                .filter(|d| d.log.pending_replay().is_some())
                .map(|d| d.name.clone())
                .collect();
            Err(invalid(if waiting.is_empty() {
                let held: Vec<String> = self
                    .datasets()
                    .iter()
                    .map(|d| (d.name.clone(), d.log.holdings_on(v)))
                    .filter(|(_, h)| !h.is_empty())
                    .map(|(n, h)| format!("volume {n}: {h}"))
                    .collect();
                format!(
                    "log device {dev} still holds {} bytes of log blocks ({}); try again",
                    self.zil.used_on(v),
                    held.join("; ")
                )
            } else {
                format!(
                    "log device {dev} holds records not yet replayed (volumes {}): open \
                     them first (`zeta serve` does)",
                    waiting.join(", ")
                )
            }))
        })();
        if let Err(e) = emptied {
            self.zil.set_removing(v, false);
            return Err(e);
        }
        {
            let _mos = self.mos.lock();
            if let Err(used) = self.zil.remove_vdev(v) {
                self.zil.set_removing(v, false);
                return Err(invalid(format!(
                    "log device {dev} took {used} bytes of log blocks meanwhile; try again"
                )));
            }
            self.config.lock().tops.retain(|t| t.id != v);
            self.write_config(cfg.state)?;
        }
        // So that the device reads as free (another pool may take it without -f).
        for leaf in top.iter().flat_map(|t| &t.children) {
            if !leaf.is_missing() {
                let _ = crate::spa::label::clear_labels(leaf);
            }
        }
        Ok(tc.children.iter().map(|c| c.path.clone()).collect())
    }

    /// Sets the faults injected on a leaf (`zeta inject`); `Injection::default()` clears them.
    pub fn inject(
        self: &Arc<Self>,
        dev: &str,
        faults: crate::vdev::Injection,
    ) -> Result<(), PoolError> {
        let (_, leaf) = self.find_leaf(dev)?;
        if !(0.0..=1.0).contains(&faults.fail_reads) || !(0.0..=1.0).contains(&faults.fail_writes) {
            return Err(invalid("a failure probability lies between 0 and 1"));
        }
        *leaf.inject.lock() = faults;
        // A device whose faults are cleared gets what it missed meanwhile.
        if faults == crate::vdev::Injection::default() && !leaf.missed.lock().is_empty() {
            self.start_resilver();
        }
        Ok(())
    }

    /// Overwrites `count` random allocated sectors of a leaf with random bytes, behind the
    /// pool's back (`zeta inject --corrupt`): what silent corruption looks like. Only sectors
    /// that hold volume blocks (data or indirect) on that leaf are chosen. Returns how many
    /// were corrupted (fewer if the leaf holds fewer).
    pub fn corrupt_sectors(&self, dev: &str, count: usize, seed: u64) -> Result<usize, PoolError> {
        let (_, leaf) = self.find_leaf(dev)?;
        self.sync_now()?;
        let mut bps = Vec::new();
        for ds in self.datasets() {
            walk(&self.io, &ds.object.dnode(), &mut |bp, _| {
                bps.push(*bp);
                Ok(())
            })?;
        }
        Ok(self.io.zio.corrupt_on_leaf(&bps, &leaf, count, seed)?)
    }

    /// Zeroes every leaf's error counters and returns faulted leaves to service (`zeta pool
    /// clear`), in memory and in the labels; those get a resilver of what they missed.
    pub fn clear_errors(self: &Arc<Self>) -> Result<(), PoolError> {
        for top in &self.label_tops().0 {
            for leaf in &top.children {
                leaf.counters.set([0; 4]);
                leaf.set_faulted(false);
            }
        }
        {
            let _mos = self.mos.lock();
            let state = self.config.lock().state;
            self.write_config(state)?;
        }
        self.start_resilver();
        Ok(())
    }

    /// Saves the scrub's progress in the config (serialized with syncs by the MOS lock).
    pub(super) fn save_scan(&self) -> Result<(), PoolError> {
        let _mos = self.mos.lock();
        let state = self.config.lock().state;
        self.write_config(state)
    }

    /// The dnodes of the MOS objects, as of the last sync.
    pub(super) fn mos_dnodes(&self) -> Vec<DnodePhys> {
        let mos = self.mos.lock();
        let mut v = vec![mos.dir.dnode(), mos.mstable.dnode()];
        v.extend(mos.sms.iter().map(|o| o.dnode()));
        v
    }

    /// Records that a volume read or wrote just now.
    pub fn note_foreground_io(&self) {
        let now = self.born.elapsed().as_nanos() as u64;
        self.last_io_nanos.store(now.max(1), Ordering::Relaxed);
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
            let last = self.last_io_nanos.load(Ordering::Relaxed);
            let now = self.born.elapsed().as_nanos() as u64;
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

    /// Marks the pool destroyed in every label (its devices may then be reused without -f).
    pub fn destroy(&self) -> Result<(), PoolError> {
        self.shutdown();
        self.write_config(PoolState::Destroyed)
    }

    fn shutdown(&self) {
        {
            let mut st = self.sync.lock();
            st.shutdown = true;
            self.sync_cv.notify_all();
        }
        let handle = self.thread.lock().take();
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
        let mut n = 0u64;
        let mut count = |_: &BlkPtr, _: u8| -> Result<(), ZioError> {
            n += 1;
            Ok(())
        };
        {
            let mos = self.mos.lock();
            walk(&self.io, &mos.dir.dnode(), &mut count)?;
            walk(&self.io, &mos.mstable.dnode(), &mut count)?;
            for sm in &mos.sms {
                walk(&self.io, &sm.dnode(), &mut count)?;
            }
        }
        for ds in self.datasets() {
            // Data blocks are read uncached so a verify really touches the media.
            walk(&self.io, &ds.object.dnode(), &mut |bp, level| {
                if level == 0 {
                    self.io.zio.read(bp)?;
                }
                count(bp, level)
            })?;
        }
        let alloc = self.io.zio.alloc.lock();
        let (kept, counted) = (alloc.space(), alloc.space_recounted());
        if kept != counted {
            return Err(invalid(format!(
                "pool '{}': the allocator's running totals {kept:?} drifted from its \
                 metaslabs {counted:?}",
                self.name
            )));
        }
        Ok(n)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How long the idle sync thread holds the pool at a time: a pool dropped without `close`
/// is released (and its devices closed) within this, not only after `txg_timeout`.
const IDLE_SLICE: Duration = Duration::from_millis(100);

fn sync_thread(pool: Weak<Pool>) {
    loop {
        let Some(deadline) = pool
            .upgrade()
            .map(|p| std::time::Instant::now() + p.opts.txg_timeout)
        else {
            return;
        };
        // Wait for a request or the timeout in slices, holding the pool only while waiting.
        loop {
            let Some(p) = pool.upgrade() else { return };
            let mut st = p.sync.lock();
            if st.shutdown || st.completed_seq < st.request_seq || st.error.is_some() {
                break;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                break;
            }
            p.sync_cv.wait_for(&mut st, IDLE_SLICE.min(deadline - now));
        }
        let Some(p) = pool.upgrade() else { return };
        let (seq, shutting_down) = {
            let st = p.sync.lock();
            if st.error.is_some() {
                // A suspended pool writes nothing more; wake waiters so they see the error.
                p.sync_cv.notify_all();
                return;
            }
            (st.request_seq, st.shutdown)
        };
        let result = p.sync_once();
        let mut st = p.sync.lock();
        let idle = matches!(result, Ok(None));
        match result {
            Ok(Some(txg)) => {
                st.synced_txg = txg;
                st.completed_seq = st.completed_seq.max(seq);
            }
            Ok(None) => st.completed_seq = st.completed_seq.max(seq),
            Err(e) => st.error = Some(e.to_string()),
        }
        p.sync_cv.notify_all();
        if shutting_down && (idle || st.error.is_some()) {
            return;
        }
    }
}

/// After an import fell back to `imported` past newer uberblocks (up to txg `newest_seen`) whose
/// trees did not verify, commits the imported tree again under a txg above all of them, before
/// the pool allocates anything; returns the txg the pool now stands at. The skipped uberblocks
/// stay in their ring slots and their damage may be transient, so unless something newer
/// outranks them a later import could prefer one even though the pool has reused space its
/// tree references. Later txgs number on from this one.
fn commit_above_skipped(
    tops: &[Arc<TopVdev>],
    required: usize,
    imported: &Uberblock,
    newest_seen: u64,
) -> Result<u64, PoolError> {
    let imported_txg = imported.txg.get();
    if newest_seen <= imported_txg {
        return Ok(imported_txg);
    }
    let txg = txg_above_skipped(imported_txg, newest_seen);
    let ub = Uberblock::restating(txg, imported);
    let what =
        format!("the uberblock of txg {txg} (txg {imported_txg} again, above txg {newest_seen})");
    let mut update = LabelUpdate::new(tops, required, what);
    // As in every commit, flush first: the import may have healed blocks of the tree.
    update.step(|leaf| leaf.flush())?;
    update.step(|leaf| write_uberblock(leaf, &ub))?;
    update.step(|leaf| leaf.flush())?;
    Ok(txg)
}

/// A write to the labels of every leaf (an uberblock or a config), done in steps such as
/// write, then flush. It has the success rule of a mirror write (`TopVdev::write`): a leaf may
/// fail, as long as every data vdev keeps at least one leaf that took every step, so that
/// some label on each vdev describes the update. Log devices (the tops after the first
/// `required`) take part but may drop out entirely: the pool imports without them.
struct LabelUpdate<'a> {
    tops: &'a [Arc<TopVdev>],
    required: usize,
    what: String,
    /// Per top-level vdev and leaf: why the leaf dropped out, or None while it takes part.
    dropped: Vec<Vec<Option<String>>>,
    /// Per top-level vdev and leaf: its write-error count when the update began.
    write_errors_at_start: Vec<Vec<u64>>,
}

impl<'a> LabelUpdate<'a> {
    fn new(tops: &'a [Arc<TopVdev>], required: usize, what: String) -> Self {
        // An offline leaf takes no part: its labels keep describing what it holds.
        let dropped = tops
            .iter()
            .map(|t| {
                t.children
                    .iter()
                    .map(|l| l.is_offline().then(|| format!("{}: offline", l.name())))
                    .collect()
            })
            .collect();
        let write_errors_at_start = tops
            .iter()
            .map(|t| {
                t.children
                    .iter()
                    .map(|l| l.counters.write_errors.load(Ordering::Relaxed))
                    .collect()
            })
            .collect();
        LabelUpdate {
            tops,
            required,
            what,
            dropped,
            write_errors_at_start,
        }
    }

    /// Drops the leaves that failed a write since the update began (a mirror write went on
    /// without them). Such a leaf lacks a block the new labels point at: its labels must not
    /// claim that block, and its flush cannot make that block durable.
    fn drop_leaves_that_missed_writes(&mut self) -> Result<(), PoolError> {
        for (t, top) in self.tops.iter().enumerate() {
            for (l, leaf) in top.children.iter().enumerate() {
                let now = leaf.counters.write_errors.load(Ordering::Relaxed);
                if now > self.write_errors_at_start[t][l] && self.dropped[t][l].is_none() {
                    self.dropped[t][l] = Some(format!("{}: missed a write", leaf.name()));
                }
            }
        }
        self.check()
    }

    /// Runs `op` on every leaf still taking part, in parallel. A leaf it fails on counts a
    /// write error and drops out: after a failed write or flush its earlier writes are in
    /// doubt, so a later flush could not vouch for them (a flush is never retried). Fails
    /// once some top-level vdev has no leaf left.
    fn step(
        &mut self,
        op: impl Fn(&Leaf) -> Result<(), VdevError> + Sync,
    ) -> Result<(), PoolError> {
        use rayon::prelude::*;
        let live: Vec<(usize, usize)> = self
            .dropped
            .iter()
            .enumerate()
            .flat_map(|(t, leaves)| {
                leaves
                    .iter()
                    .enumerate()
                    .filter(|(_, why)| why.is_none())
                    .map(move |(l, _)| (t, l))
            })
            .collect();
        // A lone leaf is served by this thread: rayon would hand it to a worker and wait.
        let results: Vec<Result<(), VdevError>> = if live.len() == 1 {
            live.iter()
                .map(|&(t, l)| op(&self.tops[t].children[l]))
                .collect()
        } else {
            live.par_iter()
                .map(|&(t, l)| op(&self.tops[t].children[l]))
                .collect()
        };
        for (&(t, l), r) in live.iter().zip(results) {
            if let Err(e) = r {
                self.tops[t].children[l].count_write_error();
                self.dropped[t][l] = Some(e.to_string());
            }
        }
        self.check()
    }

    /// The data leaves that did not take every step (offline, or failed a write or a step):
    /// they owe a resilver. (A log device holds nothing a resilver could give back.)
    fn dropped_leaves(&self) -> impl Iterator<Item = &Arc<Leaf>> {
        let data = &self.tops[..self.required];
        data.iter().zip(&self.dropped).flat_map(|(top, why)| {
            top.children
                .iter()
                .zip(why)
                .filter(|(_, w)| w.is_some())
                .map(|(l, _)| l)
        })
    }

    fn check(&self) -> Result<(), PoolError> {
        let data = &self.tops[..self.required];
        for (top, leaves) in data.iter().zip(&self.dropped) {
            if leaves.iter().all(Option::is_some) {
                let why: Vec<&str> = leaves.iter().flatten().map(String::as_str).collect();
                return Err(PoolError::VdevLost {
                    vdev: top.id,
                    what: self.what.clone(),
                    why: why.join("; "),
                });
            }
        }
        Ok(())
    }
}

/// The answer to a device command that does not apply to log devices.
fn log_device_only(dev: &str, vdev: u32) -> PoolError {
    invalid(format!(
        "{dev} belongs to log device {vdev}: log devices are only added and removed \
         (`zeta pool add POOL log ...`, `zeta pool remove POOL {dev}`)"
    ))
}

/// Opens a new top-level vdev from its spec (a pool being created, or a log device being
/// added) and writes down its config; checks that its devices are big enough and, unless
/// `force`, that none belongs to another pool.
fn build_top(id: u32, top: TopSpec, force: bool) -> Result<(TopVdev, TopConfig), PoolError> {
    match top.kind {
        TopKind::Stripe if top.leaves.len() != 1 => {
            return Err(invalid("a stripe vdev has exactly one device"))
        }
        TopKind::Mirror if top.leaves.len() < 2 => {
            return Err(invalid("a mirror needs at least two devices"))
        }
        TopKind::Raidz if top.log => {
            return Err(invalid(
                "a log device is a single device or a mirror, not a raidz",
            ))
        }
        _ => {}
    }
    if (top.kind == TopKind::Raidz) != top.raidz.is_some() {
        return Err(invalid(
            "raidz parameters given for a vdev that is no raidz",
        ));
    }
    if let Some(rz) = &top.raidz {
        // Re-derive the checks the config's constructor makes: a spec may come from
        // elsewhere than the CLI.
        RaidzConfig::new(rz.nparity, top.leaves.len(), false).map_err(PoolError::Invalid)?;
    }
    let mut leaves = Vec::new();
    let mut children = Vec::new();
    for (dev, path) in top.leaves {
        if dev.len_bytes() < MIN_LEAF_BYTES {
            return Err(invalid(format!(
                "{path}: too small ({} bytes); a device needs at least {} MiB",
                dev.len_bytes(),
                MIN_LEAF_BYTES >> 20
            )));
        }
        let leaf = Leaf::new(dev, random_guid());
        if !force {
            check_unused(&leaf, &path)?;
        }
        children.push(LeafConfig {
            guid: leaf.guid(),
            path,
            errors: Default::default(),
            offline: false,
            faulted: false,
            missed: Vec::new(),
        });
        leaves.push(Arc::new(leaf));
    }
    let vdev = match top.raidz {
        Some(rz) => TopVdev::new_raidz(
            id,
            random_guid(),
            rz,
            leaves.into_iter().map(Some).collect(),
        )
        .map_err(PoolError::Invalid)?,
        None => TopVdev::new(id, random_guid(), top.kind, leaves),
    };
    let shift = ms_shift_for(vdev.asize_bytes);
    // A log device is all log space; a data vdev keeps a reserve at its end.
    let log_bytes = if top.log {
        vdev.asize_bytes
    } else {
        log_reserve_for(vdev.asize_bytes, shift)
    };
    let cfg = TopConfig {
        id,
        guid: vdev.guid,
        kind: top.kind,
        asize: vdev.asize_bytes,
        ms_shift: shift,
        ms_count: (vdev.asize_bytes - log_bytes).div_ceil(1 << shift) as u32,
        children,
        raidz: top.raidz,
        log_bytes,
        log: top.log,
    };
    Ok((vdev, cfg))
}

/// Refuses a device that may be in use: one whose labels name a pool that is not destroyed, or
/// that carries a zeta label this zeta cannot read (a newer format, or every copy damaged), so
/// that nobody can tell whether it is in use. A device without any zeta label is free; `-f`
/// skips this check.
fn check_unused(leaf: &Leaf, path: &str) -> Result<(), PoolError> {
    let unreadable = |why: String| PoolError::UnreadableLabel {
        path: path.to_string(),
        why,
    };
    let labels = match read_labels(leaf) {
        Ok(labels) => labels,
        Err(e) if e.label_present() => return Err(unreadable(e.to_string())),
        // The device itself failed: say so rather than guess what it holds.
        Err(e) => return Err(e.into()),
    };
    match labels.config {
        Some((_, cfg)) if cfg.state != PoolState::Destroyed => Err(PoolError::InUse {
            path: path.to_string(),
            pool: cfg.name,
            state: cfg.state,
        }),
        Some(_) => Ok(()),
        None if labels.errors.iter().any(|(_, e)| e.label_present()) => Err(unreadable(
            labels.describe_errors(LabelError::label_present),
        )),
        None => Ok(()),
    }
}

fn meta_props(kind: BlockKind, checksum: ChecksumKind, class: AllocClass) -> WriteProps {
    WriteProps {
        kind,
        level: 0,
        checksum: checksum.for_metadata(),
        copies: 2,
        class,
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

fn alloc_geometry(cfg: &PoolConfig) -> Vec<(u32, u64, u32)> {
    cfg.tops
        .iter()
        .filter(|t| !t.log)
        .map(|t| (t.id, t.data_bytes(), t.ms_shift))
        .collect()
}

fn mos_object(kind: ObjectKind, block: u32, bkind: BlockKind) -> Object {
    Object::new(
        DnodePhys::new(kind, block, ChecksumKind::Fletcher4 as u8, 2),
        bkind,
        AllocClass::Mos,
    )
}

fn empty_mos(ms_per_top: &[usize]) -> Mos {
    let mut ms_base = Vec::new();
    let mut total = 0;
    for &n in ms_per_top {
        ms_base.push(total);
        total += n;
    }
    Mos {
        dir: mos_object(ObjectKind::Directory, DIR_BLOCK_BYTES, BlockKind::Directory),
        mstable: mos_object(
            ObjectKind::MetaslabTable,
            MSTABLE_BLOCK_BYTES,
            BlockKind::MetaslabTable,
        ),
        sms: (0..total)
            .map(|_| mos_object(ObjectKind::SpaceMap, SM_BLOCK_BYTES, BlockKind::SpaceMap))
            .collect(),
        ms_base,
        objset_bp: BlkPtr::HOLE,
        destroyed: Vec::new(),
        dir_dirty: false,
    }
}

/// Reads the whole logical content of an object (`size_bytes` of it).
fn read_object(obj: &Object, io: &ObjectIo) -> Result<Vec<u8>, ZioError> {
    let dn = obj.dnode();
    let bs = dn.data_block_bytes.get() as u64;
    let size = dn.size_bytes.get();
    let mut out = Vec::with_capacity(size as usize);
    for blkid in 0..size.div_ceil(bs) {
        match obj.read_block(io, blkid)? {
            Some(b) => out.extend_from_slice(&b),
            None => out.resize(out.len() + bs as usize, 0),
        }
    }
    out.truncate(size as usize);
    Ok(out)
}

/// Writes `bytes` at `offset` of an object in its open txg (read-modify-write of edge blocks)
/// and grows its size to cover them.
fn write_object_bytes(
    obj: &Object,
    io: &ObjectIo,
    offset: u64,
    bytes: &[u8],
) -> Result<(), ZioError> {
    let bs = obj.block_bytes() as u64;
    let end = offset + bytes.len() as u64;
    for sp in spans(offset, bytes.len(), bs) {
        let mut block = match obj.read_block(io, sp.blkid)? {
            Some(b) => b.to_vec(),
            None => vec![0u8; bs as usize],
        };
        block[sp.in_block..sp.in_block + sp.len]
            .copy_from_slice(&bytes[sp.in_buf..sp.in_buf + sp.len]);
        obj.dirty(sp.blkid, Dirty::Data(Arc::new(block)));
    }
    let size = obj.dnode().size_bytes.get();
    if end > size {
        obj.set_size_bytes(end);
    }
    Ok(())
}

fn append_object(obj: &Object, io: &ObjectIo, bytes: &[u8]) -> Result<(), ZioError> {
    let size = obj.dnode().size_bytes.get();
    write_object_bytes(obj, io, size, bytes)
}

/// Replaces the whole content of an object.
fn rewrite_object(obj: &Object, bytes: &[u8]) -> Result<(), ZioError> {
    let bs = obj.block_bytes() as u64;
    let old_blocks = obj.dnode().size_bytes.get().div_ceil(bs);
    let new_blocks = (bytes.len() as u64).div_ceil(bs);
    for blkid in new_blocks..old_blocks {
        obj.dirty(blkid, Dirty::Free);
    }
    obj.set_size_bytes(0);
    for (i, chunk) in bytes.chunks(bs as usize).enumerate() {
        let mut block = vec![0u8; bs as usize];
        block[..chunk.len()].copy_from_slice(chunk);
        obj.dirty(i as u64, Dirty::Data(Arc::new(block)));
    }
    obj.set_size_bytes(bytes.len() as u64);
    Ok(())
}

/// A volume as its directory entry describes it, with its log not yet opened.
struct LoadedVolume {
    ds: Dataset,
    zil: ZilHeader,
    replay_after: u64,
}

/// Loads the MOS of one uberblock: directory, metaslab table, every space map (replayed into
/// the allocator) and every volume's objset, claiming each MOS block. Any checksum failure or
/// inconsistency rejects this uberblock.
fn load_mos(
    io: &ObjectIo,
    config: &PoolConfig,
    ub: &Uberblock,
) -> Result<(Mos, Vec<LoadedVolume>), PoolError> {
    let root = ub.root;
    if root.is_hole() {
        return Err(invalid("uberblock has no MOS"));
    }
    let os_bytes = io.zio.read(&root)?;
    let os = ObjsetPhys::decode(&os_bytes, OBJSET_MOS)
        .ok_or_else(|| invalid("MOS objset block is malformed"))?;
    let ms_per_top: Vec<usize> = io
        .zio
        .alloc
        .lock()
        .tops
        .iter()
        .map(|t| t.metaslabs.len())
        .collect();
    let mut mos = empty_mos(&ms_per_top);
    let check_dnode = |dn: &DnodePhys, kind: ObjectKind| -> Result<(), PoolError> {
        if dn.kind != kind as u8
            || dn.nlevels == 0
            || dn.nlevels > 8
            || ChecksumKind::from_u8(dn.checksum).is_none()
        {
            return Err(invalid(format!("malformed {kind:?} dnode")));
        }
        Ok(())
    };
    check_dnode(&os.dnodes[0], ObjectKind::Directory)?;
    check_dnode(&os.dnodes[1], ObjectKind::MetaslabTable)?;
    mos.dir = Object::new(os.dnodes[0], BlockKind::Directory, AllocClass::Mos);
    mos.mstable = Object::new(os.dnodes[1], BlockKind::MetaslabTable, AllocClass::Mos);
    mos.objset_bp = root;

    // Space maps.
    let table = read_object(&mos.mstable, io)?;
    let mut mos_bps: Vec<BlkPtr> = vec![root];
    for (vdev, &base) in mos.ms_base.clone().iter().enumerate() {
        for ms in 0..ms_per_top[vdev] {
            let flat = base + ms;
            let off = flat * 256;
            if off + 256 > table.len() {
                continue;
            }
            let dn = DnodePhys::read_from_bytes(&table[off..off + 256]).expect("exact size");
            if dn.kind == 0 {
                continue;
            }
            check_dnode(&dn, ObjectKind::SpaceMap)?;
            let sm = Object::new(dn, BlockKind::SpaceMap, AllocClass::Mos);
            let bytes = read_object(&sm, io)?;
            if bytes.len() % RECORD_BYTES != 0 {
                return Err(invalid(format!(
                    "space map of vdev {vdev} metaslab {ms} has a partial record"
                )));
            }
            io.zio
                .alloc
                .lock()
                .load_records(vdev as u32, ms, &decode_all(&bytes))?;
            mos.sms[flat] = sm;
        }
    }
    for obj in std::iter::once(&mos.dir)
        .chain(std::iter::once(&mos.mstable))
        .chain(mos.sms.iter())
    {
        walk(io, &obj.dnode(), &mut |bp, _| {
            mos_bps.push(*bp);
            Ok(())
        })?;
    }
    {
        let mut alloc = io.zio.alloc.lock();
        for bp in &mos_bps {
            for d in bp.dvas() {
                alloc.claim_mos(d)?;
            }
        }
    }

    // Volumes.
    let dir = read_object(&mos.dir, io)?;
    let mut datasets = Vec::new();
    for chunk in dir.chunks_exact(ENTRY_BYTES) {
        let e = DirEntryPhys::read_from_bytes(chunk).expect("exact size");
        let Some(name) = e.name() else { continue };
        let checksum = ChecksumKind::from_u8(e.checksum)
            .ok_or_else(|| invalid(format!("volume {name}: unknown checksum")))?;
        let volblocksize = e.volblocksize.get();
        check_volsize(e.volsize.get(), volblocksize)
            .map_err(|_| invalid(format!("volume {name}: bad size")))?;
        let dn = if e.objset.is_hole() {
            let mut dn = DnodePhys::new(ObjectKind::VolumeData, volblocksize, checksum as u8, 1);
            dn.size_bytes = e.volsize;
            dn
        } else {
            let bytes = io.zio.read(&e.objset)?;
            let os = ObjsetPhys::decode(&bytes, OBJSET_VOLUME)
                .ok_or_else(|| invalid(format!("volume {name}: malformed objset")))?;
            check_dnode(&os.dnodes[0], ObjectKind::VolumeData)?;
            if os.dnodes[0].data_block_bytes.get() != volblocksize {
                return Err(invalid(format!(
                    "volume {name}: block size disagrees with its directory entry"
                )));
            }
            os.dnodes[0]
        };
        datasets.push(LoadedVolume {
            ds: Dataset {
                name,
                guid: e.guid.get(),
                volblocksize,
                checksum,
                created_txg: e.created_txg.get(),
                volsize: AtomicU64::new(e.volsize.get()),
                object: Object::new(dn, BlockKind::Data, AllocClass::Recorded),
                objset_bp: Mutex::new(e.objset),
                log: Log::off(),
                replay_lock: Mutex::new(()),
                replay_claims: Mutex::new(Vec::new()),
                destroyed: AtomicBool::new(false),
            },
            zil: ZilHeader::decode(&e.zil),
            replay_after: e.replay_after.get(),
        });
    }
    let _ = (config, OBJSET_BYTES);
    Ok((mos, datasets))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::mem::{Faults, MemDevice};
    use std::sync::atomic::AtomicUsize;

    fn mirror(n: usize) -> (Vec<Arc<TopVdev>>, Vec<Arc<MemDevice>>) {
        let (top, devs) = crate::vdev::top::mem_mirror(n, 9);
        (vec![Arc::new(top)], devs)
    }

    fn fail(writes: bool, flush: bool) -> Faults {
        Faults {
            fail_writes: writes,
            fail_flush: flush,
            ..Faults::default()
        }
    }

    #[test]
    fn a_failed_leaf_drops_out_of_a_label_update_and_the_rest_go_on() {
        let (tops, devs) = mirror(2);
        let mut update = LabelUpdate::new(&tops, tops.len(), "test labels".into());
        devs[1].set_faults(fail(true, false));
        let calls = AtomicUsize::new(0);
        let op = |leaf: &Leaf| {
            calls.fetch_add(1, Ordering::Relaxed);
            leaf.write_label(0, 0, &[7u8; 512])
        };
        update.step(op).unwrap();
        // The failed leaf is not asked again, even though it would now succeed.
        devs[1].set_faults(Faults::default());
        update.step(op).unwrap();
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        let errors = |l: usize| {
            tops[0].children[l]
                .counters
                .write_errors
                .load(Ordering::Relaxed)
        };
        assert_eq!((errors(0), errors(1)), (0, 1));
    }

    #[test]
    fn a_label_update_needs_a_leaf_per_vdev_that_took_every_write() {
        let (tops, devs) = mirror(2);
        let mut update = LabelUpdate::new(&tops, tops.len(), "the uberblock of txg 5".into());
        // Leaf 0 misses a data write of the txg, which the mirror survives on leaf 1.
        devs[0].set_faults(fail(true, false));
        tops[0].write(0, &[1u8; 4096]).unwrap();
        devs[0].set_faults(Faults::default());
        update.drop_leaves_that_missed_writes().unwrap();
        // Leaf 1, the only one holding the block, cannot flush: leaf 0's flush would not make
        // the block durable, so the update must fail rather than label leaf 0.
        devs[1].set_faults(fail(false, true));
        let err = update.step(|leaf| leaf.flush()).unwrap_err();
        assert!(matches!(err, PoolError::VdevLost { vdev: 0, .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("the uberblock of txg 5")
                && msg.contains("m0: missed a write")
                && msg.contains("m1: injected flush error"),
            "{msg}"
        );
    }
}
