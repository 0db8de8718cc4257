//! Transaction-group sync: the sync thread, sync requests and waits, one sync pass
//! (`sync_once`: the txg's blocks, the MOS, the flushes, the uberblock in every label), and
//! the label update that tolerates leaves that fail it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::MutexGuard;
use zerocopy::{FromZeros, IntoBytes};

use crate::dmu::dnode::{OBJSET_MOS, OBJSET_VOLUME};
use crate::dmu::object::SyncBytes;
use crate::dmu::ObjsetPhys;
use crate::dsl::dir::{DirEntryPhys, ENTRY_BYTES};
use crate::spa::label::{txg_above_skipped, write_uberblock, Uberblock};
use crate::spa::space_map::encode_all;
use crate::spa::{AllocClass, BlockKind};
use crate::vdev::TopVdev;
use crate::zil::{LogError, TxgHooks};

use super::labels::LabelUpdate;
use super::mos::{append_object, meta_props, rewrite_object, write_object_bytes};
use super::{invalid, Dataset, Mos, Pool, PoolError, Suspension, SyncState};

/// The txg machinery as the log sees it.
pub(super) struct PoolHooks(pub(super) Weak<Pool>);

/// A sync the log asked for, as the log sees its failure: given up while the pool waits
/// for room (records kept, to be committed later), or failed for good.
fn for_log<T>(r: Option<Result<T, PoolError>>) -> Result<T, LogError> {
    match r {
        Some(Ok(v)) => Ok(v),
        Some(Err(PoolError::WaitingForRoom { why, .. })) => Err(LogError::OutOfRoom(why)),
        Some(Err(e)) => Err(LogError::Failed(e.to_string())),
        None => Err(LogError::Failed("the pool is closed".into())),
    }
}

impl TxgHooks for PoolHooks {
    fn sync_now(&self) -> Result<(), LogError> {
        for_log(self.0.upgrade().map(|p| p.sync_until(true)))
    }

    fn request_sync(&self) {
        if let Some(p) = self.0.upgrade() {
            p.request_sync();
        }
    }

    fn wait_commit(&self) -> Result<u64, LogError> {
        for_log(self.0.upgrade().map(|p| p.next_commit(true)))
    }
}

/// How long the idle sync thread holds the pool at a time: a pool dropped without `close`
/// is released (and its devices closed) within this, not only after `txg_timeout`.
const IDLE_SLICE: Duration = Duration::from_millis(100);

pub(super) fn sync_thread(pool: Weak<Pool>) {
    loop {
        let Some((deadline, latest)) = pool.upgrade().map(|p| {
            let now = std::time::Instant::now();
            let t = p.opts.txg_timeout;
            (now + t, now + t * p.opts.logged_txg_stretch.max(1))
        }) else {
            return;
        };
        // Wait for a request or the timeout in slices, holding the pool only while waiting.
        // Past the timeout, the sync waits on (up to `latest`) while no volume holds a
        // change that is not in its intent log: with small sync writes into large blocks
        // (4K FUA writes into 128K blocks), each txg rewrites whole blocks for a few
        // sectors changed, and its writeback slows every log flush (figures:
        // docs/perf/intent-log.md, "A timed txg that waits while the log holds everything").
        // A crash loses nothing more: the log holds it all; its replay is bounded as before,
        // by the dirty limit and the log's space.
        let mut seen = Vec::new();
        loop {
            let Some(p) = pool.upgrade() else { return };
            let now = std::time::Instant::now();
            if now >= latest || (now >= deadline && p.changes_at_risk(&mut seen)) {
                break;
            }
            let mut st = p.txgs.sync.lock();
            if st.shutdown || st.completed_seq < st.request_seq || st.error.is_some() {
                break;
            }
            let until = if now >= deadline { latest } else { deadline };
            p.txgs.sync_cv.wait_for(
                &mut st,
                IDLE_SLICE.min(until.saturating_duration_since(now)),
            );
        }
        let Some(p) = pool.upgrade() else { return };
        let (seq, shutting_down) = {
            let st = p.txgs.sync.lock();
            if st.error.is_some() {
                // A suspended pool writes nothing more; wake waiters so they see the error.
                p.txgs.sync_cv.notify_all();
                return;
            }
            (st.request_seq, st.shutdown)
        };
        // A panic in a sync (a bug, or on-disk bytes no check caught) suspends the pool as a
        // failed sync does. Left to end the thread, it left every flush, throttled write and
        // close waiting for a sync that would never come. Nothing more is written: what the
        // panic left half done in memory never reaches the disk.
        let mut result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.sync_once()))
            .unwrap_or_else(|panic| {
                Err(PoolError::Invalid(format!(
                    "pool '{}': a txg sync stopped on an internal error ({}); the pool is \
                     suspended and writes nothing more: import it again",
                    p.name,
                    super::panic_text(panic.as_ref())
                )))
            });
        let whole = matches!(&result, Ok(Some(c)) if c.whole);
        if matches!(result, Ok(Some(_))) && !whole && p.labels_behind() {
            // A leaf that missed part of this txg and may take the next whole owes it: into
            // the labels before the next txg. (A crash before this is covered at import:
            // the leaf's newest uberblock is older than the pool's.)
            if let Err(e) = p.save_config() {
                result = Err(e);
            }
        }
        // The txg that waited for room has committed, or failed for good: either way the
        // wait is over, and sync requests are no longer refused as out of room. (Lifted
        // before writes are taken again, so that no FLUSH is refused once the pool says it
        // has resumed; and after a failure they fail as the pool does.)
        if p.txgs.sync.lock().waiting.is_some() {
            p.accept_log_requests();
        }
        if whole {
            p.resilver_owed();
        }
        let mut st = p.txgs.sync.lock();
        let idle = matches!(result, Ok(None));
        match result {
            Ok(Some(Committed { txg, .. })) => {
                // Txgs commit one at a time, in order: the uberblock ring and the frees held
                // for two txgs count on it.
                assert!(
                    txg > st.synced_txg,
                    "txg {txg} committed after txg {}",
                    st.synced_txg
                );
                st.synced_txg = txg;
                st.completed_seq = st.completed_seq.max(seq);
                // Room was made: the txg that waited for it has committed.
                st.waiting = None;
            }
            Ok(None) => st.completed_seq = st.completed_seq.max(seq),
            Err(e) => {
                st.waiting = None;
                st.error = Some(Suspension::of(&e));
            }
        }
        p.txgs.sync_cv.notify_all();
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
pub(super) fn commit_above_skipped(
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

impl Pool {
    /// Asks the sync thread for a pass without waiting for it.
    pub(super) fn request_sync(&self) {
        let mut st = self.txgs.sync.lock();
        if st.completed_seq >= st.request_seq {
            st.request_seq += 1;
            self.txgs.sync_cv.notify_all();
        }
    }

    /// Commits everything written so far: returns once every write that completed before the
    /// call is on stable storage.
    pub fn sync_now(&self) -> Result<(), PoolError> {
        self.sync_until(false)
    }

    /// `sync_now`, then as many txgs as it takes for the space freed until then to be
    /// allocatable again (frees are deferred two txgs: `Allocator::txg_synced`), forced to
    /// commit even with nothing else to write: `zeta pool sync`, and a volume destroy, leave
    /// no freed space waiting for later writes to bring the txgs that release it. The few
    /// metadata blocks those txgs rewrite are themselves freed two txgs later.
    pub fn sync_frees(&self) -> Result<(), PoolError> {
        self.sync_now()?;
        let start = self.synced_txg();
        while self.space().freeing > 0 && self.synced_txg() < start + 2 {
            // Something to write, so that the sync `sync_now` asks for commits a txg.
            self.mos.lock().dir_dirty = true;
            self.sync_now()?;
        }
        Ok(())
    }

    /// `sync_now`; if `give_up_on_room`, returns `PoolError::WaitingForRoom` as soon as the
    /// pool waits for room instead of waiting with it.
    fn sync_until(&self, give_up_on_room: bool) -> Result<(), PoolError> {
        let mut st = self.txgs.sync.lock();
        st.request_seq += 1;
        let mine = st.request_seq;
        self.txgs.sync_cv.notify_all();
        self.wait_sync_until(st, give_up_on_room, |st| st.completed_seq >= mine)
            .map(|_| ())
    }

    /// Returns once a txg commits (or a sync finds nothing to commit): the one syncing now if
    /// there is one, else one asked for now. Gives the last committed txg. Unlike `sync_now`,
    /// which waits for a sync that starts after the call, this does not wait past the sync
    /// in flight: for the log, whose blocks that sync frees as it commits.
    pub fn wait_commit(&self) -> Result<u64, PoolError> {
        self.next_commit(false)
    }

    /// `wait_commit`, giving up as `sync_until` does.
    fn next_commit(&self, give_up_on_room: bool) -> Result<u64, PoolError> {
        let mut st = self.txgs.sync.lock();
        let seen = st.synced_txg;
        if st.completed_seq >= st.request_seq {
            st.request_seq += 1;
            self.txgs.sync_cv.notify_all();
        }
        let mine = st.request_seq;
        self.wait_sync_until(st, give_up_on_room, |st| {
            st.synced_txg > seen || st.completed_seq >= mine
        })
    }

    /// Waits on the sync thread until `done`, and returns the last committed txg; an error
    /// if the pool is suspended meanwhile (`give_up_on_room`: or waits for room), or
    /// exported with its sync thread gone.
    fn wait_sync_until(
        &self,
        mut st: MutexGuard<'_, SyncState>,
        give_up_on_room: bool,
        done: impl Fn(&SyncState) -> bool,
    ) -> Result<u64, PoolError> {
        loop {
            if let Some(s) = &st.error {
                return Err(s.error(&self.name));
            }
            if done(&st) {
                return Ok(st.synced_txg);
            }
            if let Some(w) = st.waiting.as_ref().filter(|_| give_up_on_room) {
                return Err(PoolError::WaitingForRoom {
                    pool: self.name.clone(),
                    why: w.why.clone(),
                });
            }
            if st.shutdown && self.txgs.thread.try_lock().is_some_and(|t| t.is_none()) {
                return Err(invalid(format!("pool '{}' is exported", self.name)));
            }
            self.txgs
                .sync_cv
                .wait_for(&mut st, Duration::from_millis(200));
        }
    }

    /// Waits for the next txg to commit (`wait_commit`), one that commits even if nothing
    /// else is dirty: frees return to use as txgs commit. A writer short of space waits for
    /// the sync in flight rather than for one of its own (`sync_now`), which with a sync
    /// always in flight is the second to commit. Under random 4K writes to 128K blocks on a
    /// half-full pool, writers spent much of their time there (figures:
    /// docs/perf/allocator.md, "Why a writer short of space waits for the sync in flight").
    pub(super) fn next_commit_releasing_frees(&self) -> Result<(), PoolError> {
        // Held by a sync in progress, which will commit: then nothing needs marking. (Waiting
        // for the lock would wait for that sync, and the commit after it.)
        if let Some(mut mos) = self.mos.try_lock() {
            mos.dir_dirty = true;
        }
        self.wait_commit().map(|_| ())
    }

    /// Syncs one txg if anything is dirty. Returns the txg committed, if any.
    fn sync_once(&self) -> Result<Option<Committed>, PoolError> {
        // Nothing can be dirty in a read-only pool but the directory flags that ask for a
        // commit (`commit_soon`, `sync_frees`): there is never a txg to write.
        if self.opts.readonly {
            return Ok(None);
        }
        let mos = self.mos.lock();
        let (txg, syncing_bytes, datasets) = {
            let mut open = self.txgs.open_txg.write();
            let datasets: Vec<Arc<Dataset>> = self.datasets.read().values().cloned().collect();
            let any = mos.dir_dirty
                || !mos.destroyed.is_empty()
                || mos.table.has_work()
                || datasets.iter().any(|d| d.object.has_open_changes());
            if !any {
                return Ok(None);
            }
            let txg = *open;
            *open += 1;
            let bytes: SyncBytes = datasets.iter().map(|d| d.object.begin_sync()).sum();
            (txg, bytes, datasets)
        };
        self.txgs
            .syncing_held
            .store(syncing_bytes.held, Ordering::Release);
        self.txgs.syncing_txg.store(txg, Ordering::Release);
        let result = self.sync_txg(mos, txg, syncing_bytes, &datasets);
        self.txgs.syncing_txg.store(0, Ordering::Release);
        self.txgs.syncing_held.store(0, Ordering::Release);
        result.map(Some)
    }

    /// `sync_once`'s work on txg `txg`, closed already.
    fn sync_txg(
        &self,
        mut mos: MutexGuard<'_, Mos>,
        txg: u64,
        syncing_bytes: SyncBytes,
        datasets: &[Arc<Dataset>],
    ) -> Result<Committed, PoolError> {
        let io = &self.io;
        // Begun now so that it sees which leaves miss a write of this txg.
        let (label_tops, required) = self.label_tops();
        let mut commit =
            LabelUpdate::new(&label_tops, required, format!("the uberblock of txg {txg}"));

        // 1. Volumes: data, indirect blocks, and a new objset block for each changed one.
        for ds in datasets {
            let before = ds.object.dnode();
            let dn = ds.object.sync(io, txg)?;
            self.head_synced(&mut mos.table, ds)?;
            let mut os_bp = ds.objset_bp.lock();
            if dn == before && !os_bp.is_hole() && !mos.rewrite_objsets {
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
        mos.rewrite_objsets = false;
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
            self.head_destroyed(&mut mos.table, ds, txg)?;
        }

        // Snapshots taken and destroyed, on the trees as this txg commits them; then the
        // deadlists and the dataset records they changed.
        let applied = self.apply_ops(&mut mos.table, txg)?;
        mos.dir_dirty |= applied.dir_dirty;
        syncing_bytes += applied.syncing;
        let table_dn = self.sync_table(&mut mos.table, txg)?;

        // 2. The directory (MOS), with each volume's log header moved past the log blocks
        // this txg makes obsolete.
        for ds in datasets {
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
                e.checksum = ds.checksum() as u8;
                e.created_txg = ds.created_txg.into();
                e.objset = *ds.objset_bp.lock();
                e.zil = ds.log.header().encode();
                e.replay_after = ds.log.replay_after().into();
                e.refreservation = ds.refreservation().into();
                e.dataset_id = ds.dataset_id().into();
                if ds.readonly() {
                    e.flags |= crate::dsl::dir::FLAG_READONLY;
                }
                if let Some(r) = ds.receiving() {
                    e.recv_to_guid = r.to_guid.into();
                    e.recv_from_guid = r.from_guid.into();
                    e.recv_offset = r.offset.into();
                }
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
        os.dnodes[2] = table_dn;
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
        // The uberblock reaches only what this txg or an earlier one wrote.
        assert!(
            root.birth_txg.get() == txg
                && datasets
                    .iter()
                    .all(|ds| ds.objset_bp.lock().birth_txg.get() <= txg),
            "txg {txg}: a root born in another txg"
        );
        let ub = Uberblock::new(txg, self.guid, root);
        let kept_missing = commit.drop_leaves_that_missed(txg)?;
        if kept_missing {
            // Every leaf of some vdev missed part of the txg and takes its uberblock all the
            // same: their labels say first that they owe it.
            let state = self.config.lock().state;
            let generation = self.config_gen.fetch_add(1, Ordering::SeqCst) + 1;
            self.config_steps(&mut commit, state, generation, |e| {
                self.wait_for_room(txg, e)
            })?;
        }
        commit.step(|leaf| leaf.flush())?;
        // The uberblock waits for room as the txg's blocks do (a copy-on-write file system
        // under the files needs room even to overwrite a label).
        commit.write_step(
            |leaf| write_uberblock(leaf, &ub),
            |e| self.wait_for_room(txg, e),
        )?;
        commit.step(|leaf| leaf.flush())?;
        // Leaves that missed part of this txg owe it to a resilver.
        let mut whole = !kept_missing;
        for leaf in commit.dropped_leaves() {
            leaf.owes(Some(txg));
            whole = false;
        }
        let free = {
            let mut alloc = io.zio.alloc.lock();
            alloc.txg_synced(txg);
            alloc.space().free
        };
        self.admission
            .ahead_limit
            .store(free / 4, Ordering::Relaxed);
        // The volumes' blocks grew or shrank: so did what their reservations still hold.
        self.refresh_reservations();
        {
            let mut ahead = self.admission.ahead.lock();
            let later = ahead.split_off(&(txg + 1));
            let done: u64 = std::mem::replace(&mut *ahead, later).values().sum();
            self.admission.ahead_bytes.fetch_sub(done, Ordering::AcqRel);
        }
        self.admission
            .dirty_bytes
            .fetch_sub(syncing_bytes.dirty as i64, Ordering::AcqRel);
        self.admission
            .placed_bytes
            .fetch_sub(syncing_bytes.placed as i64, Ordering::AcqRel);
        self.admission
            .held_bytes
            .fetch_sub(syncing_bytes.held as i64, Ordering::AcqRel);
        self.admission
            .meta_bytes
            .fetch_sub(syncing_bytes.meta as i64, Ordering::AcqRel);
        drop(mos);
        // The log blocks this txg covers are free; sync requests it covers are answered.
        for ds in datasets {
            ds.log.txg_committed(&self.zil, txg);
        }
        for ds in destroyed.iter().chain(&applied.retired) {
            ds.log.discard(&self.zil);
        }
        Ok(Committed { txg, whole })
    }
}

/// A txg the sync committed.
struct Committed {
    txg: u64,
    /// Every data leaf took all of it: none is offline, faulted or failing now.
    whole: bool,
}

/// The txg machinery of a pool: the open txg writers join, the txg being committed, and the
/// sync thread that commits them in order.
pub(super) struct Txgs {
    /// The open txg. Writers hold it shared while they dirty blocks; the sync thread takes it
    /// exclusively to close the txg.
    pub(super) open_txg: parking_lot::RwLock<u64>,
    /// The txg the sync thread is committing, 0 between syncs (read without a lock by
    /// `wait_for_room`, whose callers may hold `open_txg`).
    pub(super) syncing_txg: std::sync::atomic::AtomicU64,
    /// What the txg being committed held in memory when its sync began, 0 between syncs:
    /// the rest of `held_bytes` is the open txg's.
    pub(super) syncing_held: std::sync::atomic::AtomicU64,
    /// How the open txg's latest writes grew its sync's work (`sync_if_much_held`).
    pub(super) growth: super::growth::Growth,
    pub(super) sync: parking_lot::Mutex<SyncState>,
    pub(super) sync_cv: parking_lot::Condvar,
    pub(super) thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}
