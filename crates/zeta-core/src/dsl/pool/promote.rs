//! `zeta promote`: a clone takes its origin volume's place (`zfs promote`). The snapshots of
//! the origin volume up to and including the clone's origin move to the clone, and the origin
//! volume becomes a clone of that snapshot; then the old origin volume can be destroyed while
//! the clone lives on. One txg; no block moves, none is written but the deadlists.
//!
//! With A the origin volume, S1..Sk its snapshots up to the origin Sk (txg `k`), C the clone
//! and O A's own origin if A is a clone (txg `o`, else 0), two rules hold before and must
//! hold after: a record's deadlist holds the blocks of the tree before it its own tree let go
//! of, but a clone's records never hold a block born at or before its origin (that block is
//! the origin's). So:
//! - A's records after Sk drop every entry born at or before `k`: those blocks are Sk's now.
//! - C's records gain the blocks born in `(o, k]` that C let go of, which as a clone it
//!   dropped: found by comparing each of its trees with the one before (Sk's first),
//!   reading only where they differ (`dead_between`).
//! - `origin_shared` (the bytes a clone's tree holds born at or before its origin) is counted
//!   anew for both from the same lists.

use std::sync::Arc;

use crate::dmu::object::dead_between;
use crate::dsl::dataset::{bytes_born_in, encode_deadlist};
use crate::spa::BlkPtr;

use super::mos::{append_object, rewrite_object};
use super::snapshot::{snapshot_dataset_of, Op, Table};
use super::{invalid, Pool, PoolError};

impl Pool {
    /// Promotes clone `vol` (`zfs promote`): the snapshots of its origin's volume up to and
    /// including its origin become its own (named `vol@…`), and that volume becomes a clone
    /// of the origin, which it can now be destroyed apart from. Refused if the clone has a
    /// snapshot of the same name as one that would move, or while a snapshot that would move
    /// is open (served, or being read).
    pub fn promote(&self, vol: &str) -> Result<(), PoolError> {
        self.check_writable()?;
        self.dataset(vol)?;
        if self.origin_of(vol).is_none() {
            return Err(invalid(format!(
                "volume '{}/{vol}' is not a clone: there is nothing to promote it over",
                self.name
            )));
        }
        self.run_op(Op::Promote(vol.to_string()))?;
        self.refresh_reservations();
        Ok(())
    }

    /// `promote`, in the sync of the txg that takes it. Everything is read and checked before anything
    /// changes: a refusal or a failed read leaves the table as it was.
    pub(super) fn promote_one(&self, table: &mut Table, vol: &str) -> Result<(), PoolError> {
        let io = &self.io;
        let c = self.dataset(vol)?;
        let cid = c.dataset_id();
        let sk = table
            .records
            .get(&cid)
            .map_or(0, |r| r.phys.origin_id.get());
        let Some(origin) = table.records.get(&sk).and_then(|r| r.snap.clone()) else {
            return Err(invalid(format!(
                "volume '{}/{vol}' is not a clone: there is nothing to promote it over",
                self.name
            )));
        };
        let s = table.records[&sk].phys;
        let (aid, k) = (s.head_id.get(), s.creation_txg.get());
        let (oid, o) = (
            table.records[&aid].phys.origin_id.get(),
            table.origin_txg(aid),
        );
        let a_name = (self.datasets().into_iter())
            .find(|d| d.dataset_id() == aid)
            .map(|d| d.name.clone())
            .ok_or_else(|| invalid(format!("dataset record {aid} is no volume's")))?;
        let a_chain = table.chain(aid);
        let at = a_chain
            .iter()
            .position(|&id| id == sk)
            .expect("a head's own");
        let (moved, kept) = a_chain.split_at(at + 1);
        let c_chain = table.chain(cid);
        for &id in moved {
            let r = &table.records[&id];
            let name = r.phys.name().unwrap_or_default();
            if self.snapshots.read().contains_key(&format!("{vol}@{name}")) {
                return Err(invalid(format!(
                    "'{}/{vol}@{name}' exists, and '{}/{a_name}@{name}' would move to that \
                     name: rename or destroy one of them first",
                    self.name, self.name
                )));
            }
            if r.snap.as_ref().is_some_and(|d| d.handles() > 0) {
                return Err(invalid(format!(
                    "snapshot '{}/{a_name}@{name}' is in use (served, or being read): close \
                     it first",
                    self.name
                )));
            }
        }

        // A's side: every entry born at or before `k` goes; the bytes its trees hold born in
        // `(o, k]` (Sk's, less what each record let go of) join what they share.
        let mut a_lists = Vec::new();
        let mut part = s.referenced.get() - s.origin_shared.get();
        for &id in kept {
            let list = table.read_deadlist(io, id)?;
            part -= bytes_born_in(&list, o, k);
            let keep: Vec<BlkPtr> = (list.into_iter())
                .filter(|bp| bp.birth_txg.get() > k)
                .collect();
            let shared = table.records[&id].phys.origin_shared.get() + part;
            a_lists.push((id, keep, shared));
        }
        // C's side: each tree against the one before it, from the origin's.
        let mut c_lists = Vec::new();
        let mut before = origin.object.dnode();
        let mut shared_o = s.origin_shared.get();
        for &id in &c_chain {
            let tree = match &table.records[&id].snap {
                Some(d) => d.object.dnode(),
                None => c.object.dnode(),
            };
            let mut gained = Vec::new();
            dead_between(io, &before, &tree, &mut |bp| {
                let birth = bp.birth_txg.get();
                if birth <= o {
                    shared_o -= bp.asize_total();
                } else if birth <= k {
                    gained.push(*bp);
                }
            })?;
            c_lists.push((id, gained, if o > 0 { shared_o } else { 0 }));
            before = tree;
        }
        let first_c = table.read_deadlist(io, c_chain[0])?;

        // Nothing fails from here.
        for (id, keep, shared) in a_lists {
            let r = table.records.get_mut(&id).expect("in the chain");
            rewrite_object(&r.deadlist, &encode_deadlist(&keep))?;
            r.phys.deadlist_bytes = keep.iter().map(BlkPtr::asize_total).sum::<u64>().into();
            r.phys.origin_shared = shared.into();
            r.dirty = true;
        }
        let mut sk_unique = bytes_born_in(&first_c, s.prev_txg.get(), u64::MAX - 1);
        for (n, (id, gained, shared)) in c_lists.into_iter().enumerate() {
            if n == 0 {
                sk_unique += bytes_born_in(&gained, s.prev_txg.get(), u64::MAX - 1);
            }
            let r = table.records.get_mut(&id).expect("in the chain");
            append_object(&r.deadlist, io, &encode_deadlist(&gained))?;
            let bytes: u64 = gained.iter().map(BlkPtr::asize_total).sum();
            r.phys.deadlist_bytes = (r.phys.deadlist_bytes.get() + bytes).into();
            r.phys.origin_shared = shared.into();
            r.dirty = true;
        }
        // The links: Sk is followed by C's oldest record, A's first after Sk starts a clone's
        // chain, and the origins swap.
        let c_oldest = c_chain[0];
        let a_oldest = kept[0];
        {
            let r = table.records.get_mut(&sk).expect("the origin");
            r.phys.next_id = (if c_oldest == cid { 0 } else { c_oldest }).into();
            r.phys.unique = sk_unique.into();
        }
        table.records.get_mut(&c_oldest).expect("C's").phys.prev_id = sk.into();
        table.records.get_mut(&a_oldest).expect("A's").phys.prev_id = 0.into();
        table.records.get_mut(&cid).expect("C's").phys.origin_id = oid.into();
        table.records.get_mut(&aid).expect("A's").phys.origin_id = sk.into();
        // The snapshots that moved take the clone's name.
        let mut map = self.snapshots.write();
        for &id in moved {
            let r = table.records.get_mut(&id).expect("in the chain");
            r.phys.head_id = cid.into();
            r.dirty = true;
            let old = r.snap.take().expect("a snapshot's");
            let name = r.phys.name().unwrap_or_default();
            let full = format!("{vol}@{name}");
            let new = Arc::new(snapshot_dataset_of(
                &full,
                &r.phys,
                old.object.dnode(),
                *old.objset_bp.lock(),
            ));
            map.remove(&old.name);
            map.insert(full, new.clone());
            r.snap = Some(new);
        }
        for id in [sk, c_oldest, a_oldest, cid, aid] {
            table.records.get_mut(&id).expect("linked").dirty = true;
        }
        Ok(())
    }
}
