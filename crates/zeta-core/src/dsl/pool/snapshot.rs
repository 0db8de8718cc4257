//! Snapshots: the dataset table as the pool holds it (`Table`, in the MOS), the requests that
//! change it (taken by the next txg's sync, so a snapshot holds exactly a committed txg's
//! tree), and the sync's part: each head's let-go blocks onto its deadlist, snapshots taken and
//! destroyed, deadlists and changed records written. Record layout: `dsl::dataset`.
//!
//! A snapshot costs one objset block and one record whatever the volume's size: its tree is
//! the head's as of its txg, shared block for block. Destroying one reads deadlists only
//! (`merge_on_destroy`), never a tree.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::dmu::dnode::OBJSET_VOLUME;
use crate::dmu::{DnodePhys, Object, ObjectIo, ObjectKind, ObjsetPhys};
use crate::dsl::dataset::{
    bytes_born_in, decode_deadlist, encode_deadlist, merge_on_destroy, split_snapshot,
    valid_snapshot_name, DatasetPhys, KIND_HEAD, KIND_SNAPSHOT, RECORD_BYTES,
};
use crate::spa::{AllocClass, BlkPtr, BlockKind};
use crate::zil::Log;
use zeta_math::ChecksumKind;

use super::mos::{append_object, meta_props, read_object, rewrite_object, write_object_bytes};
use super::{invalid, Dataset, DatasetParts, Pool, PoolError};

/// The dataset table's block size, and its deadlists'.
pub(super) const TABLE_BLOCK_BYTES: u32 = 16 * 1024;
const DEADLIST_BLOCK_BYTES: u32 = 16 * 1024;

/// A record's figures as `zeta list` shows them, kept on the dataset (`Dataset::space`) so
/// that listing takes no MOS lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SnapFigures {
    /// A snapshot: the bytes its tree takes. A head: 0 (its tree says).
    pub referenced: u64,
    /// A snapshot: the bytes it alone holds (`used`).
    pub unique: u64,
    /// Bytes born since the snapshot before (a head: since its latest; 0 is read live).
    pub written: u64,
    /// A head: what its snapshots hold that it does not (`usedbysnapshots`): the sum of
    /// every deadlist of its chain.
    pub usedbysnapshots: u64,
    pub creation_txg: u64,
    pub creation_time: u64,
    /// A head: how many snapshots it has.
    pub snapshots: u64,
    /// A clone's head: the bytes of its tree its origin holds (born at or before it).
    pub origin_shared: u64,
}

/// One record as the pool holds it.
pub(super) struct Record {
    pub(super) phys: DatasetPhys,
    /// The deadlist object (its dnode goes into `phys.deadlist` when the record is written).
    pub(super) deadlist: Object,
    /// To be written by the next sync.
    pub(super) dirty: bool,
    /// A snapshot's tree, read-only, as volumes read it.
    pub(super) snap: Option<Arc<Dataset>>,
}

/// A change asked for, with where its outcome goes.
pub(super) enum Op {
    /// `(volume, snapshot name, guid)`: taken together; a guid is given for a received
    /// snapshot (the sender's), else drawn.
    Snapshot(Vec<(String, String, Option<u64>)>),
    Destroy(String, String),
    /// Back to the volume's latest snapshot.
    Rollback(String, String),
    /// A new volume (the second name) from a snapshot (`VOL@SNAP`).
    Clone(String, String),
    /// A clone takes its origin volume's place.
    Promote(String),
}

type Reply = Arc<Mutex<Option<Result<(), PoolError>>>>;

/// What the requests a sync took leave it to do.
#[derive(Default)]
pub(super) struct Applied {
    /// The directory must be rewritten (a head got its record, or was rolled back).
    pub(super) dir_dirty: bool,
    /// Heads rolled back: their logs are discarded once the txg has committed.
    pub(super) retired: Vec<Arc<Dataset>>,
    /// The dirty bytes of their changes not synced, which no sync will write.
    pub(super) syncing: crate::dmu::object::SyncBytes,
}

/// The dataset table in memory (MOS slot 2).
pub(super) struct Table {
    pub(super) object: Object,
    pub(super) records: BTreeMap<u64, Record>,
    /// Ids of records gone since the last sync: zeroed on disk by the next.
    zeroed: BTreeSet<u64>,
    ops: Vec<(Op, Reply)>,
}

fn deadlist_object(dn: DnodePhys) -> Object {
    Object::new(dn, BlockKind::Deadlist, AllocClass::Recorded)
}

fn empty_deadlist() -> Object {
    deadlist_object(DnodePhys::new(
        ObjectKind::Deadlist,
        DEADLIST_BLOCK_BYTES,
        ChecksumKind::Fletcher4 as u8,
        2,
    ))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Table {
    pub(super) fn empty() -> Table {
        Table::with_object(Object::new(
            DnodePhys::new(
                ObjectKind::DatasetTable,
                TABLE_BLOCK_BYTES,
                ChecksumKind::Fletcher4 as u8,
                2,
            ),
            BlockKind::DatasetTable,
            AllocClass::Recorded,
        ))
    }

    fn with_object(object: Object) -> Table {
        Table {
            object,
            records: BTreeMap::new(),
            zeroed: BTreeSet::new(),
            ops: Vec::new(),
        }
    }

    /// Sets a loaded head's kill rule from its record: blocks born at or before its latest
    /// snapshot's txg (or its origin's) are kept, not freed.
    pub(super) fn arm_head(&self, head: &Dataset) {
        if let Some(r) = self.records.get(&head.dataset_id()) {
            head.object
                .set_keep_upto(r.phys.prev_txg.get(), r.phys.written.get());
        }
    }

    /// Whether the next sync has work here even if no volume changed.
    pub(super) fn has_work(&self) -> bool {
        !self.ops.is_empty() || !self.zeroed.is_empty() || self.records.values().any(|r| r.dirty)
    }

    /// The dnodes of the table and of every deadlist, as of the last sync (for scans).
    pub(super) fn dnodes(&self) -> Vec<DnodePhys> {
        let mut v = vec![self.object.dnode()];
        v.extend(self.records.values().map(|r| r.deadlist.dnode()));
        v
    }

    /// Every snapshot's read-only dataset.
    pub(super) fn snapshot_datasets(&self) -> impl Iterator<Item = &Arc<Dataset>> {
        self.records.values().filter_map(|r| r.snap.as_ref())
    }

    /// The record id of snapshot dataset `d`.
    fn id_of(&self, d: &Arc<Dataset>) -> Option<u64> {
        (self.records.iter())
            .find(|(_, r)| r.snap.as_ref().is_some_and(|s| Arc::ptr_eq(s, d)))
            .map(|(&id, _)| id)
    }

    /// The txg of the origin of head `id`'s volume, if it is a clone (0 if not): its blocks
    /// born at or before it are the origin's.
    pub(super) fn origin_txg(&self, id: u64) -> u64 {
        let origin = self.records.get(&id).map_or(0, |r| r.phys.origin_id.get());
        self.records
            .get(&origin)
            .map_or(0, |o| o.phys.creation_txg.get())
    }

    /// The names of the volumes cloned from snapshot record `id`.
    fn clones_of(&self, id: u64, heads: &[Arc<Dataset>]) -> Vec<String> {
        heads
            .iter()
            .filter(|h| {
                self.records
                    .get(&h.dataset_id())
                    .is_some_and(|r| r.phys.origin_id.get() == id)
            })
            .map(|h| h.name.clone())
            .collect()
    }

    fn new_id(&self) -> u64 {
        (1..)
            .find(|i| !self.records.contains_key(i))
            .expect("ids left")
    }

    pub(super) fn read_deadlist(&self, io: &ObjectIo, id: u64) -> Result<Vec<BlkPtr>, PoolError> {
        let r = &self.records[&id];
        let bytes = read_object(&r.deadlist, io)?;
        decode_deadlist(&bytes).ok_or_else(|| {
            invalid(format!(
                "dataset record {id}: its deadlist has a partial entry"
            ))
        })
    }

    /// Head `id`'s chain: its snapshots' record ids, oldest first, then its own.
    pub(super) fn chain(&self, id: u64) -> Vec<u64> {
        let mut v = vec![id];
        let mut at = self.records[&id].phys.prev_id.get();
        while at != 0 {
            v.push(at);
            at = self.records[&at].phys.prev_id.get();
        }
        v.reverse();
        v
    }

    /// The record after snapshot `id` in its chain: the next snapshot, or the head.
    fn next_of(&self, id: u64) -> u64 {
        let p = &self.records[&id].phys;
        match p.next_id.get() {
            0 => p.head_id.get(),
            n => n,
        }
    }

    /// Loads the table of a pool's MOS slot 2 (`dn`, which may be unused in an older pool)
    /// and checks every record: a snapshot's objset is read, and every link leads where it
    /// must. The snapshots' datasets are named after their heads (`heads`: head record id →
    /// volume name).
    pub(super) fn load(
        io: &ObjectIo,
        dn: &DnodePhys,
        heads: &BTreeMap<u64, String>,
    ) -> Result<Table, PoolError> {
        if dn.kind == 0 {
            return Ok(Table::empty());
        }
        super::mos::check_dnode(dn, ObjectKind::DatasetTable)?;
        let mut t = Table::with_object(Object::new(
            *dn,
            BlockKind::DatasetTable,
            AllocClass::Recorded,
        ));
        let bytes = read_object(&t.object, io)?;
        for (id, chunk) in bytes.chunks_exact(RECORD_BYTES).enumerate() {
            let phys = DatasetPhys::read_from_bytes(chunk).expect("exact size");
            if phys.kind == 0 {
                continue;
            }
            let id = id as u64;
            let bad = |what: &str| invalid(format!("dataset record {id}: {what}"));
            if id == 0 || !(phys.kind == KIND_HEAD || phys.kind == KIND_SNAPSHOT) {
                return Err(bad("unknown kind"));
            }
            super::mos::check_dnode(&phys.deadlist, ObjectKind::Deadlist)?;
            t.records.insert(
                id,
                Record {
                    phys,
                    deadlist: deadlist_object(phys.deadlist),
                    dirty: false,
                    snap: None,
                },
            );
        }
        // Links: every snapshot's head exists and names it in its chain, walked from the
        // head back (at most as many steps as records: no cycle).
        for (&id, vol) in heads {
            let bad = |what: String| invalid(format!("volume {vol}'s dataset record {id}: {what}"));
            let head = t.records.get(&id).ok_or_else(|| bad("missing".into()))?;
            if head.phys.kind != KIND_HEAD || head.phys.head_id.get() != id {
                return Err(bad("not a head's".into()));
            }
            let (mut at, mut after, mut after_txg) = (head.phys.prev_id.get(), 0u64, u64::MAX);
            let mut steps = 0;
            let mut expect_txg = head.phys.prev_txg.get();
            while at != 0 {
                steps += 1;
                let r = t
                    .records
                    .get(&at)
                    .ok_or_else(|| bad(format!("snapshot {at} missing")))?;
                let p = &r.phys;
                if steps > t.records.len()
                    || p.kind != KIND_SNAPSHOT
                    || p.head_id.get() != id
                    || p.next_id.get() != after
                    || p.creation_txg.get() != expect_txg
                    || p.creation_txg.get() >= after_txg
                    || p.prev_txg.get() >= p.creation_txg.get()
                {
                    return Err(bad(format!(
                        "snapshot record {at} is not linked as it must be"
                    )));
                }
                (after, after_txg, expect_txg) = (at, p.creation_txg.get(), p.prev_txg.get());
                at = p.prev_id.get();
            }
            // The oldest names no txg before it, or a clone's its origin's.
            let origin = head.phys.origin_id.get();
            let floor = match origin {
                0 => 0,
                o => match t.records.get(&o) {
                    Some(r) if r.phys.kind == KIND_SNAPSHOT => r.phys.creation_txg.get(),
                    _ => return Err(bad(format!("its origin {o} is no snapshot"))),
                },
            };
            if expect_txg != floor {
                return Err(bad(
                    "its oldest record names a txg before it that is not its origin's".into(),
                ));
            }
        }
        for (&id, r) in &t.records {
            let clones = heads
                .keys()
                .filter(|h| {
                    t.records
                        .get(h)
                        .is_some_and(|c| c.phys.origin_id.get() == id)
                })
                .count() as u64;
            if r.phys.kind == KIND_SNAPSHOT && r.phys.num_clones.get() != clones {
                return Err(invalid(format!(
                    "snapshot record {id}: counts {} clones, {clones} name it",
                    r.phys.num_clones.get()
                )));
            }
        }
        for (&id, r) in t.records.iter_mut() {
            if r.phys.kind != KIND_SNAPSHOT {
                continue;
            }
            let head = r.phys.head_id.get();
            let Some(vol) = heads.get(&head) else {
                return Err(invalid(format!(
                    "snapshot record {id}: its head {head} is no volume's"
                )));
            };
            let name = r
                .phys
                .name()
                .filter(|n| valid_snapshot_name(n))
                .ok_or_else(|| invalid(format!("snapshot record {id} of {vol}: invalid name")))?;
            r.snap = Some(Arc::new(snapshot_dataset(
                io,
                &format!("{vol}@{name}"),
                &r.phys,
            )?));
        }
        Ok(t)
    }
}

/// The read-only dataset of a loaded snapshot record: its objset read and checked.
fn snapshot_dataset(io: &ObjectIo, name: &str, p: &DatasetPhys) -> Result<Dataset, PoolError> {
    let bytes = io.zio.read(&p.objset)?;
    let os = ObjsetPhys::decode(&bytes, OBJSET_VOLUME)
        .ok_or_else(|| invalid(format!("snapshot {name}: malformed objset")))?;
    let dn = os.dnodes[0];
    super::mos::check_dnode(&dn, ObjectKind::VolumeData)?;
    super::check_volsize(p.volsize.get(), dn.data_block_bytes.get())
        .map_err(|_| invalid(format!("snapshot {name}: bad size")))?;
    Ok(snapshot_dataset_of(name, p, dn, p.objset))
}

fn set_snap_figures(ds: &Dataset, p: &DatasetPhys) {
    let mut f = ds.space.lock();
    f.referenced = p.referenced.get();
    f.unique = p.unique.get();
    f.written = p.written.get();
    f.creation_txg = p.creation_txg.get();
    f.creation_time = p.creation_time.get();
    drop(f);
    // For scans: blocks born at or before this are the snapshot before's too.
    ds.snap_prev_txg.store(p.prev_txg.get(), Ordering::Release);
}

impl Pool {
    /// Takes snapshots `VOL@SNAP` of one or more volumes, all in one txg (`zfs snapshot a@s
    /// b@s`): each holds its volume exactly as that txg commits it. Constant in time and space
    /// whatever a volume's size: one objset block and one table record each.
    pub fn snapshot(&self, names: &[&str]) -> Result<(), PoolError> {
        self.snapshot_with(names, None)
    }

    /// `snapshot` of one volume for `zeta receive`: the snapshot takes the sent one's guid,
    /// which the next incremental stream names as its base.
    /// It ends the receive: the volume is no longer partly received from the snapshot's txg
    /// on (`take_snapshots`).
    pub fn snapshot_received(&self, name: &str, guid: u64) -> Result<(), PoolError> {
        self.snapshot_with(&[name], Some(guid))
    }

    fn snapshot_with(&self, names: &[&str], guid: Option<u64>) -> Result<(), PoolError> {
        self.check_writable()?;
        if names.is_empty() {
            return Err(invalid("no snapshot named"));
        }
        let mut pairs = Vec::new();
        for name in names {
            let (vol, snap) = split_snapshot(name)
                .ok_or_else(|| invalid(format!("'{name}' is not a snapshot name (VOL@SNAP)")))?;
            if !valid_snapshot_name(snap) {
                return Err(invalid(format!(
                    "invalid snapshot name '{snap}': use letters, digits, '-', '_', '.', ':'"
                )));
            }
            let ds = self.dataset(vol)?;
            if guid.is_none() && ds.receiving().is_some() {
                return Err(PoolError::PartlyReceived(format!("{}/{vol}", self.name)));
            }
            if pairs.iter().any(|(v, _, _): &(String, String, _)| v == vol) {
                return Err(invalid(format!(
                    "two snapshots of volume '{vol}' at once: take them one after the other"
                )));
            }
            if self.snapshots.read().contains_key(*name) {
                return Err(PoolError::SnapshotExists(format!("{}/{name}", self.name)));
            }
            // A reserved volume keeps room for rewriting everything it holds now (OpenZFS's
            // rule: its reservation then counts from its blocks born after the snapshot).
            if ds.refreservation() > 0 {
                let need = ds.object.used_bytes().min(ds.refreservation());
                let grows = need.saturating_sub(ds.unused_reservation());
                let avail = self.space().free.saturating_sub(self.reserved_bytes());
                if grows > avail {
                    return Err(PoolError::NoSpace(format!(
                        "{} (a snapshot of reserved volume '{vol}' keeps {} more for its \
                         reservation, and {} is free)",
                        self.name,
                        super::human(grows),
                        super::human(avail)
                    )));
                }
            }
            pairs.push((vol.to_string(), snap.to_string(), guid));
        }
        self.run_op(Op::Snapshot(pairs))?;
        self.refresh_reservations();
        Ok(())
    }

    /// Destroys snapshot `VOL@SNAP`: the blocks it alone held are freed, found from the
    /// deadlists of the tree after it (never by walking a tree).
    pub fn destroy_snapshot(&self, name: &str) -> Result<(), PoolError> {
        self.check_writable()?;
        let (vol, snap) = split_snapshot(name)
            .ok_or_else(|| invalid(format!("'{name}' is not a snapshot name (VOL@SNAP)")))?;
        self.snapshot_dataset(name)?;
        self.run_op(Op::Destroy(vol.to_string(), snap.to_string()))?;
        self.sync_frees()
    }

    /// Rolls volume `VOL` back to its latest snapshot `VOL@SNAP` (`zfs rollback`): what was
    /// written since is freed, and the volume reads as the snapshot at once. Refused while
    /// the volume is open (a client connected to its export, a copy in or out): they would
    /// go on from data that is gone. The snapshot stays.
    pub fn rollback(&self, name: &str) -> Result<(), PoolError> {
        self.check_writable()?;
        let (vol, snap) = split_snapshot(name)
            .ok_or_else(|| invalid(format!("'{name}' is not a snapshot name (VOL@SNAP)")))?;
        self.snapshot_dataset(name)?;
        let head = self.dataset(vol)?;
        let snaps = self.snapshots_of(vol);
        if let Some(latest) = snaps.last().filter(|l| l.name != name) {
            return Err(invalid(format!(
                "'{}/{name}' is not the latest snapshot of '{}/{vol}': '{}/{}' and {} more are \
                 newer; destroy them first, or use -r",
                self.name,
                self.name,
                self.name,
                latest.name,
                snaps.iter().rev().take_while(|s| s.name != name).count() - 1
            )));
        }
        drop(snaps);
        self.check_closed(&head)?;
        drop(head);
        self.run_op(Op::Rollback(vol.to_string(), snap.to_string()))?;
        self.refresh_reservations();
        self.sync_frees()
    }

    /// Refuses a volume something has open (a connected client, a copy in or out).
    pub fn check_closed(&self, head: &Dataset) -> Result<(), PoolError> {
        match head.handles() {
            0 => Ok(()),
            n => Err(invalid(format!(
                "volume '{}/{}' is open ({n} handle(s): a connected client, or a copy in or \
                 out): disconnect them first",
                self.name, head.name
            ))),
        }
    }

    /// Makes volume `vol` a clone of snapshot `origin` (`VOL@SNAP`, `zfs clone`): writable,
    /// sharing every block with the snapshot until it rewrites it, in constant time. The
    /// snapshot cannot be destroyed while the clone exists. A clone reserves nothing.
    pub fn clone_snapshot(&self, origin: &str, vol: &str) -> Result<(), PoolError> {
        self.check_writable()?;
        if !crate::dsl::dir::valid_volume_name(vol) {
            return Err(invalid(format!(
                "invalid volume name '{vol}': use letters, digits, '-', '_', '.', ':'"
            )));
        }
        self.snapshot_dataset(origin)?;
        if self.dataset(vol).is_ok() {
            return Err(PoolError::VolumeExists(format!("{}/{vol}", self.name)));
        }
        self.run_op(Op::Clone(origin.to_string(), vol.to_string()))
    }

    /// For `verify`: a clone head's origin txg and the bytes its record says it shares with
    /// the origin; `None` for a volume that is no clone.
    pub(super) fn origin_figures(&self, head: &Dataset) -> Option<(u64, u64)> {
        let mos = self.mos.lock();
        let t = &mos.table;
        let id = head.dataset_id();
        let floor = t.origin_txg(id);
        (floor > 0).then(|| (floor, t.records[&id].phys.origin_shared.get()))
    }

    /// The snapshot volume `vol` was cloned from (`VOL@SNAP`), if it is a clone.
    pub fn origin_of(&self, vol: &str) -> Option<String> {
        let head = self.dataset(vol).ok()?;
        let mos = self.mos.lock();
        let t = &mos.table;
        let origin = t.records.get(&head.dataset_id())?.phys.origin_id.get();
        t.records
            .get(&origin)?
            .snap
            .as_ref()
            .map(|d| d.name.clone())
    }

    /// Queues `op` for the next sync and waits for it.
    pub(super) fn run_op(&self, op: Op) -> Result<(), PoolError> {
        let reply: Reply = Arc::new(Mutex::new(None));
        self.mos.lock().table.ops.push((op, reply.clone()));
        self.sync_now()?;
        let outcome = reply.lock().take();
        outcome.unwrap_or_else(|| Err(invalid("the snapshot request was not taken by a sync")))
    }

    /// A snapshot's read-only dataset (`VOL@SNAP`).
    pub fn snapshot_dataset(&self, name: &str) -> Result<Arc<Dataset>, PoolError> {
        self.snapshots
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| PoolError::NoSuchSnapshot(format!("{}/{name}", self.name)))
    }

    /// A volume's head, or a snapshot's read-only dataset for `VOL@SNAP`.
    pub fn dataset_or_snapshot(&self, name: &str) -> Result<Arc<Dataset>, PoolError> {
        if name.contains('@') {
            self.snapshot_dataset(name)
        } else {
            self.dataset(name)
        }
    }

    /// Every snapshot, by volume and then by txg.
    pub fn snapshots(&self) -> Vec<Arc<Dataset>> {
        let mut v: Vec<Arc<Dataset>> = self.snapshots.read().values().cloned().collect();
        v.sort_by_key(|d| {
            (
                split_snapshot(&d.name).map(|(v, _)| v.to_string()),
                d.created_txg,
            )
        });
        v
    }

    /// The snapshots of volume `vol`, oldest first.
    pub fn snapshots_of(&self, vol: &str) -> Vec<Arc<Dataset>> {
        let mut v: Vec<Arc<Dataset>> = (self.snapshots.read().values())
            .filter(|d| split_snapshot(&d.name).is_some_and(|(v, _)| v == vol))
            .cloned()
            .collect();
        v.sort_by_key(|d| d.created_txg);
        v
    }

    /// Makes the snapshots the loaded table holds the pool's (at import).
    pub(super) fn index_snapshots(&self) {
        let mos = self.mos.lock();
        let mut map = self.snapshots.write();
        for ds in mos.table.snapshot_datasets() {
            map.insert(ds.name.clone(), ds.clone());
        }
        drop(map);
        for head in self.datasets() {
            let id = head.dataset_id.load(Ordering::Acquire);
            if mos.table.records.contains_key(&id) {
                self.set_head_figures(&mos.table, &head, id);
            }
        }
    }

    fn set_head_figures(&self, table: &Table, head: &Dataset, id: u64) {
        let mut used = 0;
        let mut n = 0;
        let mut at = id;
        while let Some(r) = table.records.get(&at) {
            used += r.phys.deadlist_bytes.get();
            at = r.phys.prev_id.get();
            if at == 0 {
                break;
            }
            n += 1;
        }
        let mut f = head.space.lock();
        f.usedbysnapshots = used;
        f.snapshots = n;
        f.creation_txg = head.created_txg;
        f.origin_shared = table
            .records
            .get(&id)
            .map_or(0, |r| r.phys.origin_shared.get());
    }

    /// The sync's part after head `ds`'s tree synced in `txg`: the blocks it let go of that
    /// its latest snapshot holds go onto its deadlist; the latest snapshot alone holds those
    /// born after the snapshot before it.
    pub(super) fn head_synced(&self, table: &mut Table, ds: &Dataset) -> Result<(), PoolError> {
        let id = ds.dataset_id.load(Ordering::Acquire);
        if id == 0 {
            return Ok(());
        }
        let mut kept = ds.object.take_kept();
        let fresh = ds.object.fresh_bytes();
        let floor = table.origin_txg(id);
        let Some(head) = table.records.get_mut(&id) else {
            return Ok(());
        };
        if floor > 0 {
            // A clone's blocks born at or before its origin are the origin's: let go, they
            // go on no deadlist of the clone, and are no longer shared.
            let (theirs, mine): (Vec<BlkPtr>, Vec<BlkPtr>) =
                kept.into_iter().partition(|bp| bp.birth_txg.get() <= floor);
            kept = mine;
            if !theirs.is_empty() {
                let b: u64 = theirs.iter().map(BlkPtr::asize_total).sum();
                head.phys.origin_shared = head.phys.origin_shared.get().saturating_sub(b).into();
                head.dirty = true;
            }
        }
        if head.phys.written.get() != fresh {
            head.phys.written = fresh.into();
            head.dirty = true;
        }
        if kept.is_empty() {
            return Ok(());
        }
        append_object(&head.deadlist, &self.io, &encode_deadlist(&kept))?;
        let bytes: u64 = kept.iter().map(BlkPtr::asize_total).sum();
        head.phys.deadlist_bytes = (head.phys.deadlist_bytes.get() + bytes).into();
        head.dirty = true;
        let latest = head.phys.prev_id.get();
        if let Some(snap) = table.records.get_mut(&latest) {
            let gain = bytes_born_in(&kept, snap.phys.prev_txg.get(), u64::MAX - 1);
            snap.phys.unique = (snap.phys.unique.get() + gain).into();
            snap.dirty = true;
        }
        Ok(())
    }

    /// A destroyed volume's record goes with it (it has no snapshots: those go first).
    pub(super) fn head_destroyed(
        &self,
        table: &mut Table,
        ds: &Dataset,
        txg: u64,
    ) -> Result<(), PoolError> {
        let id = ds.dataset_id.load(Ordering::Acquire);
        if let Some(r) = table.records.remove(&id) {
            r.deadlist.free_all(&self.io, txg)?;
            table.zeroed.insert(id);
            if let Some(o) = table.records.get_mut(&r.phys.origin_id.get()) {
                o.phys.num_clones = o.phys.num_clones.get().saturating_sub(1).into();
                o.dirty = true;
            }
        }
        Ok(())
    }

    /// Makes volume `vol` a clone of snapshot `origin` in txg `txg`: a head whose tree is the
    /// snapshot's, shared block for block (one objset block and one record, whatever the
    /// size), whose own blocks are those born after the origin's txg.
    fn make_clone(
        &self,
        table: &mut Table,
        txg: u64,
        origin: &str,
        vol: &str,
        done: &mut Applied,
    ) -> Result<(), PoolError> {
        if self.dataset(vol).is_ok() {
            return Err(PoolError::VolumeExists(format!("{}/{vol}", self.name)));
        }
        let o = self.snapshot_dataset(origin)?;
        let Some(oid) = table.id_of(&o) else {
            return Err(PoolError::NoSuchSnapshot(format!("{}/{origin}", self.name)));
        };
        let dn = o.object.dnode();
        let objset = self.write_objset(dn, txg)?;
        let id = table.new_id();
        let o_txg = o.created_txg;
        let mut p = DatasetPhys::new_zeroed();
        p.kind = KIND_HEAD;
        let guid = super::random_guid();
        p.guid = guid.into();
        p.head_id = id.into();
        p.creation_txg = txg.into();
        p.creation_time = now_secs().into();
        p.prev_txg = o_txg.into();
        p.origin_id = oid.into();
        p.origin_shared = dn.used_bytes;
        table.records.insert(
            id,
            Record {
                phys: p,
                deadlist: empty_deadlist(),
                dirty: true,
                snap: None,
            },
        );
        let r = table.records.get_mut(&oid).expect("found above");
        r.phys.num_clones = (r.phys.num_clones.get() + 1).into();
        r.dirty = true;
        let ds = Arc::new(Dataset::from_parts(DatasetParts {
            name: vol.to_string(),
            guid,
            volblocksize: o.volblocksize,
            created_txg: txg,
            volsize: o.volsize(),
            refreservation: 0,
            dnode: dn,
            objset,
            log: Log::new_chain(&self.zil),
            dataset_id: id,
            snapshot: false,
        }));
        ds.object.set_keep_upto(o_txg, 0);
        self.datasets.write().insert(vol.to_string(), ds);
        done.dir_dirty = true;
        Ok(())
    }

    /// The requests queued since the last sync, taken in txg `txg`; each one's outcome goes
    /// to its requester. Returns whether the directory must be rewritten (a head got its
    /// record).
    pub(super) fn apply_ops(&self, table: &mut Table, txg: u64) -> Result<Applied, PoolError> {
        let mut done = Applied::default();
        for (op, reply) in std::mem::take(&mut table.ops) {
            let outcome = match op {
                Op::Snapshot(pairs) => self.take_snapshots(table, txg, &pairs, &mut done),
                Op::Destroy(vol, snap) => self.destroy_one(table, txg, &vol, &snap),
                Op::Rollback(vol, snap) => self.roll_back(table, txg, &vol, &snap, &mut done),
                Op::Clone(origin, vol) => self.make_clone(table, txg, &origin, &vol, &mut done),
                Op::Promote(vol) => self.promote_one(table, &vol),
            };
            *reply.lock() = Some(outcome);
        }
        Ok(done)
    }

    /// Rolls head `vol` back to its latest snapshot in txg `txg`: the old head is retired as
    /// a destroyed volume is (its handles, none when this was asked, cannot dirty it), its
    /// blocks born after the snapshot freed; its deadlist's blocks are the snapshot's, back in
    /// the new head, so the list goes and its entries stay. The new head takes the
    /// snapshot's tree, the old one's name, guid and properties, and a new intent-log chain:
    /// what the old log holds was written after the snapshot, and must never replay.
    fn roll_back(
        &self,
        table: &mut Table,
        txg: u64,
        vol: &str,
        snap: &str,
        done: &mut Applied,
    ) -> Result<(), PoolError> {
        let full = format!("{vol}@{snap}");
        let head = self.dataset(vol)?;
        let sds = self.snapshot_dataset(&full)?;
        let hid = head.dataset_id();
        let sid = table.records.get(&hid).map_or(0, |h| h.phys.prev_id.get());
        if !table
            .records
            .get(&sid)
            .and_then(|r| r.snap.as_ref())
            .is_some_and(|d| Arc::ptr_eq(d, &sds))
        {
            return Err(invalid(format!(
                "'{}/{full}' is no longer the latest snapshot of '{}/{vol}'",
                self.name, self.name
            )));
        }
        // Under the open txg's lock, as a destroy marks a volume: a change either sees the
        // flag, or is in the open txg, which the old head never syncs.
        let hold = self.txgs.open_txg.write();
        if let Err(e) = self.check_closed(&head) {
            drop(hold);
            return Err(e);
        }
        head.destroyed.store(true, Ordering::Release);
        drop(hold);
        let s = table.records[&sid].phys;
        let io = &self.io;
        // Its changes since this txg closed die with it; they no longer count as dirty.
        done.syncing += head.object.begin_sync();
        head.object.free_all(io, txg)?;
        let old_os = *head.objset_bp.lock();
        if !old_os.is_hole() {
            io.zio.free(&old_os, txg, AllocClass::Recorded);
        }
        {
            let h = table.records.get_mut(&hid).expect("linked");
            let dl = std::mem::replace(&mut h.deadlist, empty_deadlist());
            dl.free_all(io, txg)?;
            h.phys.deadlist_bytes = 0.into();
            h.phys.written = 0.into();
            h.phys.origin_shared = s.origin_shared;
            h.dirty = true;
        }
        let r = table.records.get_mut(&sid).expect("linked");
        r.phys.unique = 0.into();
        r.dirty = true;

        let dn = sds.object.dnode();
        let objset = self.write_objset(dn, txg)?;
        let new = Dataset::from_parts(DatasetParts {
            name: head.name.clone(),
            guid: head.guid,
            volblocksize: head.volblocksize,
            created_txg: head.created_txg,
            volsize: s.volsize.get(),
            refreservation: head.refreservation(),
            dnode: dn,
            objset,
            log: Log::new_chain(&self.zil),
            dataset_id: hid,
            snapshot: false,
        });
        *new.space.lock() = *head.space.lock();
        new.set_readonly_flag(head.readonly());
        // Properties are the volume's, not the snapshot's.
        new.object.set_checksum(head.checksum());
        let new = Arc::new(new);
        new.object.set_keep_upto(s.creation_txg.get(), 0);
        self.datasets.write().insert(vol.to_string(), new);
        done.dir_dirty = true;
        done.retired.push(head);
        Ok(())
    }

    fn take_snapshots(
        &self,
        table: &mut Table,
        txg: u64,
        pairs: &[(String, String, Option<u64>)],
        done: &mut Applied,
    ) -> Result<(), PoolError> {
        // Checked again in the sync: another request may have come first.
        let mut heads = Vec::new();
        for (vol, snap, _) in pairs {
            let full = format!("{vol}@{snap}");
            if self.snapshots.read().contains_key(&full) {
                return Err(PoolError::SnapshotExists(format!("{}/{full}", self.name)));
            }
            heads.push(self.dataset(vol)?);
        }
        for ((vol, snap, guid), ds) in pairs.iter().zip(heads) {
            if guid.is_some() && ds.recv.lock().take().is_some() {
                // A receive ends in this txg: its snapshot and the volume whole, together.
                done.dir_dirty = true;
            }
            let mut head_id = ds.dataset_id.load(Ordering::Acquire);
            if head_id == 0 {
                head_id = table.new_id();
                let mut p = DatasetPhys::new_zeroed();
                p.kind = KIND_HEAD;
                p.guid = ds.guid.into();
                p.head_id = head_id.into();
                p.creation_txg = txg.into();
                p.creation_time = now_secs().into();
                // Everything the tree holds is born after the (no) snapshot before.
                p.written = ds.object.used_bytes().into();
                table.records.insert(
                    head_id,
                    Record {
                        phys: p,
                        deadlist: empty_deadlist(),
                        dirty: true,
                        snap: None,
                    },
                );
                ds.dataset_id.store(head_id, Ordering::Release);
                done.dir_dirty = true;
            }
            // The head's tree as this txg commits it (its sync ran already), in an objset
            // block of the snapshot's own.
            let dn = ds.object.dnode();
            let objset = self.write_objset(dn, txg)?;
            let id = table.new_id();
            let head = table.records.get_mut(&head_id).expect("made above");
            let mut p = DatasetPhys::new_zeroed();
            p.kind = KIND_SNAPSHOT;
            p.guid = guid.unwrap_or_else(super::random_guid).into();
            p.head_id = head_id.into();
            p.creation_txg = txg.into();
            p.creation_time = now_secs().into();
            p.prev_id = head.phys.prev_id;
            p.prev_txg = head.phys.prev_txg;
            p.referenced = dn.used_bytes;
            p.written = head.phys.written;
            // Every block it holds the head holds too; what it holds alone grows as the
            // head lets go of them.
            p.unique = 0.into();
            p.deadlist_bytes = head.phys.deadlist_bytes;
            p.origin_shared = head.phys.origin_shared;
            p.volsize = ds.volsize().into();
            p.set_name(snap);
            p.objset = objset;
            let deadlist = std::mem::replace(&mut head.deadlist, empty_deadlist());
            let prev = head.phys.prev_id.get();
            head.phys.prev_id = id.into();
            head.phys.prev_txg = txg.into();
            head.phys.deadlist_bytes = 0.into();
            head.phys.written = 0.into();
            head.dirty = true;
            if let Some(r) = table.records.get_mut(&prev) {
                r.phys.next_id = id.into();
                r.dirty = true;
            }
            ds.object.set_keep_upto(txg, 0);
            let full = format!("{vol}@{snap}");
            p.deadlist = deadlist.dnode();
            let snap_ds = Arc::new(snapshot_dataset_of(&full, &p, dn, objset));
            table.records.insert(
                id,
                Record {
                    phys: p,
                    deadlist,
                    dirty: true,
                    snap: Some(snap_ds.clone()),
                },
            );
            self.snapshots.write().insert(full, snap_ds);
        }
        Ok(())
    }

    /// Writes an objset block of its own for tree `dn` in txg `txg` (a snapshot's, or a
    /// rolled-back head's): one 4K block, whatever the tree holds.
    fn write_objset(&self, dn: DnodePhys, txg: u64) -> Result<BlkPtr, PoolError> {
        let mut os = ObjsetPhys::new(OBJSET_VOLUME);
        os.dnodes[0] = dn;
        let checksum = self.config.lock().checksum;
        let props = meta_props(BlockKind::Objset, checksum, AllocClass::Recorded);
        Ok(self
            .io
            .zio
            .write(os.as_bytes(), props, txg, dn.root.fill.get())?)
    }

    /// Destroys snapshot `vol@snap` in txg `txg`. Every deadlist it needs is read before
    /// anything changes: a failed read refuses the request and leaves all as it was.
    fn destroy_one(
        &self,
        table: &mut Table,
        txg: u64,
        vol: &str,
        snap: &str,
    ) -> Result<(), PoolError> {
        let full = format!("{vol}@{snap}");
        let sds = self.snapshot_dataset(&full)?;
        let Some((&sid, _)) = (table.records.iter())
            .find(|(_, r)| r.snap.as_ref().is_some_and(|d| Arc::ptr_eq(d, &sds)))
        else {
            return Err(PoolError::NoSuchSnapshot(format!("{}/{full}", self.name)));
        };
        // A scan reading it meanwhile holds the frees of its chunk (`hold_frees`); a
        // `Volume` open on it could read blocks freed here and reused.
        if sds.handles() > 0 {
            return Err(invalid(format!(
                "snapshot '{}/{full}' is in use (served, or being read): close it first",
                self.name
            )));
        }
        let s = table.records[&sid].phys;
        if s.num_clones.get() > 0 {
            let clones = table.clones_of(sid, &self.datasets());
            let named: Vec<String> = clones
                .iter()
                .map(|c| format!("'{}/{c}'", self.name))
                .collect();
            return Err(invalid(format!(
                "snapshot '{}/{full}' has {} clone(s), which depend on it: {}; destroy them \
                 first",
                self.name,
                s.num_clones.get(),
                named.join(", ")
            )));
        }
        let (pid, p) = (s.prev_id.get(), s.prev_txg.get());
        let pp = table.records.get(&pid).map_or(0, |r| r.phys.prev_txg.get());
        let nid = table.next_of(sid);
        let n_is_snap = s.next_id.get() != 0;
        let s_dl = table.read_deadlist(&self.io, sid)?;
        let n_dl = table.read_deadlist(&self.io, nid)?;
        let nn_dl = if n_is_snap {
            Some(table.read_deadlist(&self.io, table.next_of(nid))?)
        } else {
            None
        };
        let m = merge_on_destroy(s_dl, &n_dl, p, pp);

        if let Some(prev) = table.records.get_mut(&pid) {
            prev.phys.unique = (prev.phys.unique.get() + m.prev_unique_gain).into();
            prev.phys.next_id = s.next_id;
            prev.dirty = true;
        }
        let written = (s.written.get() + table.records[&nid].phys.written.get())
            .saturating_sub(m.freed_bytes);
        {
            let n = table.records.get_mut(&nid).expect("linked");
            if let Some(nn_dl) = &nn_dl {
                let gain = bytes_born_in(nn_dl, p, s.creation_txg.get());
                n.phys.unique = (n.phys.unique.get() + gain).into();
            }
            n.phys.prev_id = s.prev_id;
            n.phys.prev_txg = s.prev_txg;
            n.phys.deadlist_bytes = (s.deadlist_bytes.get() + m.kept_bytes).into();
            n.phys.written = written.into();
            n.dirty = true;
            rewrite_object(&n.deadlist, &encode_deadlist(&m.next_deadlist))?;
        }
        if !n_is_snap {
            let head = self.dataset(vol)?;
            // Blocks born after `p` are now the head's alone to free.
            head.object.set_keep_upto(p, written);
        }
        for bp in &m.freed {
            self.io.zio.free(bp, txg, AllocClass::Recorded);
        }
        let gone = table.records.remove(&sid).expect("found above");
        self.io
            .zio
            .free(&gone.phys.objset, txg, AllocClass::Recorded);
        gone.deadlist.free_all(&self.io, txg)?;
        table.zeroed.insert(sid);
        self.snapshots.write().remove(&full);
        Ok(())
    }

    /// The sync's last part for the table, in txg `txg`: every changed deadlist, then every
    /// changed record, then the table itself. Returns the table's dnode for MOS slot 2.
    pub(super) fn sync_table(&self, table: &mut Table, txg: u64) -> Result<DnodePhys, PoolError> {
        let io = &self.io;
        for r in table.records.values_mut() {
            if r.deadlist.has_open_changes() {
                r.deadlist.begin_sync();
                r.deadlist.sync(io, txg)?;
                r.dirty = true;
            }
        }
        let mut changed_heads = BTreeSet::new();
        for &id in &table.zeroed {
            if !table.records.contains_key(&id) {
                write_object_bytes(
                    &table.object,
                    io,
                    id * RECORD_BYTES as u64,
                    &[0; RECORD_BYTES],
                )?;
            }
        }
        table.zeroed.clear();
        for (&id, r) in table.records.iter_mut().filter(|(_, r)| r.dirty) {
            r.phys.deadlist = r.deadlist.dnode();
            write_object_bytes(
                &table.object,
                io,
                id * RECORD_BYTES as u64,
                r.phys.as_bytes(),
            )?;
            if let Some(ds) = &r.snap {
                set_snap_figures(ds, &r.phys);
            }
            changed_heads.insert(r.phys.head_id.get());
            r.dirty = false;
        }
        // A table left with no record is emptied, rather than kept as zeros.
        if table.records.is_empty() && table.object.dnode().size_bytes.get() > 0 {
            rewrite_object(&table.object, &[])?;
        }
        if table.object.has_open_changes() {
            table.object.begin_sync();
            table.object.sync(io, txg)?;
        }
        if !changed_heads.is_empty() {
            for head in self.datasets() {
                let id = head.dataset_id.load(Ordering::Acquire);
                if changed_heads.contains(&id) {
                    self.set_head_figures(table, &head, id);
                }
            }
        }
        Ok(table.object.dnode())
    }
}

/// A new snapshot's read-only dataset, from its record and tree.
pub(super) fn snapshot_dataset_of(
    name: &str,
    p: &DatasetPhys,
    dn: DnodePhys,
    objset: BlkPtr,
) -> Dataset {
    let ds = Dataset::from_parts(DatasetParts {
        name: name.to_string(),
        guid: p.guid.get(),
        volblocksize: dn.data_block_bytes.get(),
        created_txg: p.creation_txg.get(),
        volsize: p.volsize.get(),
        refreservation: 0,
        dnode: dn,
        objset,
        log: Log::off(),
        dataset_id: 0,
        snapshot: true,
    });
    set_snap_figures(&ds, p);
    ds
}

impl Pool {
    /// `verify`'s part for snapshots: each snapshot's tree walked, its blocks born after the
    /// snapshot before counted into `count` (the earlier blocks are that one's), its figures
    /// recounted; every deadlist read and summed; each snapshot's `unique` recounted from
    /// the deadlist after it (its entries born after the snapshot before are in this one
    /// alone).
    pub(super) fn verify_snapshots(
        &self,
        count: &mut dyn FnMut(&BlkPtr, u8) -> Result<(), crate::zio::ZioError>,
    ) -> Result<(), PoolError> {
        let mos = self.mos.lock();
        let t = &mos.table;
        for (&id, r) in &t.records {
            let dl = t.read_deadlist(&self.io, id)?;
            let sum: u64 = dl.iter().map(BlkPtr::asize_total).sum();
            let bad = |what: String| {
                invalid(format!("pool '{}': dataset record {id}: {what}", self.name))
            };
            if sum != r.phys.deadlist_bytes.get() {
                return Err(bad(format!(
                    "its deadlist holds {sum} bytes, its record says {}",
                    r.phys.deadlist_bytes.get()
                )));
            }
            // A clone's blocks born at or before its origin are the origin's to let go.
            let floor = t.origin_txg(r.phys.head_id.get());
            if let Some(bp) = dl.iter().find(|bp| bp.birth_txg.get() <= floor) {
                return Err(bad(format!(
                    "its deadlist holds a block born in txg {}, its clone's origin's (txg \
                     {floor})",
                    bp.birth_txg.get()
                )));
            }
            let Some(ds) = &r.snap else { continue };
            let prev = r.phys.prev_txg.get();
            let (mut all, mut born, mut shared) = (0u64, 0u64, 0u64);
            crate::dmu::object::walk(&self.io, &ds.object.dnode(), &mut |bp, level| {
                all += bp.asize_total();
                if bp.birth_txg.get() <= floor {
                    shared += bp.asize_total();
                }
                if bp.birth_txg.get() > prev {
                    if level == 0 {
                        self.io.zio.read(bp)?;
                    }
                    born += bp.asize_total();
                    count(bp, level)?;
                }
                Ok(())
            })?;
            let next_dl = t.read_deadlist(&self.io, t.next_of(id))?;
            let unique = bytes_born_in(&next_dl, prev, u64::MAX - 1);
            if floor > 0 && shared != r.phys.origin_shared.get() {
                return Err(bad(format!(
                    "snapshot {}: shares {shared} bytes with its origin, its record says {}",
                    ds.name,
                    r.phys.origin_shared.get()
                )));
            }
            let f = (
                r.phys.referenced.get(),
                r.phys.written.get(),
                r.phys.unique.get(),
            );
            if (all, born, unique) != f {
                return Err(bad(format!(
                    "snapshot {}: (referenced, written, unique) counted {:?}, recorded {f:?}",
                    ds.name,
                    (all, born, unique)
                )));
            }
        }
        Ok(())
    }
}
