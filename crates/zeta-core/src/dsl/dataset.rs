//! The dataset table: one 1024-byte record per volume head that has had a snapshot and one per
//! snapshot, in the MOS object of slot 2 (feature `org.zeta:snapshots`; docs/format.md). A
//! record's place in the table is its id; a directory entry names its head's record
//! (`DirEntryPhys::dataset_id`).
//!
//! The chain of a volume: the head's record names its latest snapshot (`prev_id`), each
//! snapshot the one before it and the one after it. Every record has a deadlist: the blocks
//! of the tree before it (its `prev`) that its own tree no longer holds, each kept alive by
//! that earlier tree alone or with those before it. Blocks are never taken back once let
//! go, so a block's lifetime is a contiguous run of trees: that is what lets a snapshot's
//! destruction work from deadlists alone (`merge_on_destroy`).

use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::dmu::DnodePhys;
use crate::spa::BlkPtr;

pub const RECORD_BYTES: usize = 1024;
pub const SNAP_NAME_BYTES: usize = 256;

/// `DatasetPhys::kind`.
pub const KIND_HEAD: u8 = 1;
pub const KIND_SNAPSHOT: u8 = 2;

#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct DatasetPhys {
    /// 0: an unused record; `KIND_HEAD` or `KIND_SNAPSHOT`.
    pub kind: u8,
    pub pad: [u8; 7],
    /// A head's: its volume's guid. A snapshot's own.
    pub guid: U64,
    /// The head's record id (a head's own).
    pub head_id: U64,
    /// A snapshot: the txg whose state it holds. A head: the txg its record was made in.
    pub creation_txg: U64,
    /// Seconds since the Unix epoch.
    pub creation_time: U64,
    /// The snapshot before this one (for a head: its latest), 0 if none.
    pub prev_id: U64,
    /// That snapshot's txg, 0 if none: blocks born after it are in no earlier tree.
    pub prev_txg: U64,
    /// A snapshot: the next snapshot of its head, 0 if it is the latest (the head is next).
    pub next_id: U64,
    /// A clone's head: the snapshot (of another volume) it was cloned from, 0 if none. Its
    /// oldest record's `prev_txg` is that snapshot's txg: the blocks born at or before it are
    /// the origin's, never the clone's to free.
    pub origin_id: U64,
    /// A snapshot: how many heads were cloned from it (it is not destroyed while any is).
    pub num_clones: U64,
    /// A snapshot: the bytes its tree takes (`DnodePhys::used_bytes` when it was taken).
    pub referenced: U64,
    /// A snapshot: the bytes only it holds, freed if it alone were destroyed.
    pub unique: U64,
    /// The bytes of its tree born after `prev_txg` (a head's: since its latest snapshot,
    /// as of the record's last write).
    pub written: U64,
    /// The bytes the blocks on its deadlist take.
    pub deadlist_bytes: U64,
    /// A snapshot: the volume's size when it was taken.
    pub volsize: U64,
    /// A clone's head: the bytes of its tree born at or before its origin's txg (the
    /// origin's blocks it still shares; not its own space).
    pub origin_shared: U64,
    pub reserved: [u8; 128],
    /// A snapshot's name after the `@`, UTF-8, NUL-padded; empty for a head.
    pub name: [u8; SNAP_NAME_BYTES],
    /// The deadlist: an object (`ObjectKind::Deadlist`) of 128-byte block pointers.
    pub deadlist: DnodePhys,
    /// A snapshot: its object set block (of kind `OBJSET_VOLUME`, its own copy). A hole for
    /// a head, whose object set the directory names.
    pub objset: BlkPtr,
    pub reserved2: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<DatasetPhys>() == RECORD_BYTES);

impl DatasetPhys {
    pub fn name(&self) -> Option<String> {
        let end = (self.name.iter().position(|&b| b == 0)).unwrap_or(SNAP_NAME_BYTES);
        String::from_utf8(self.name[..end].to_vec()).ok()
    }

    pub fn set_name(&mut self, name: &str) {
        assert!(name.len() < SNAP_NAME_BYTES);
        self.name = [0; SNAP_NAME_BYTES];
        self.name[..name.len()].copy_from_slice(name.as_bytes());
    }
}

/// Splits `VOL@SNAP` into its volume and snapshot names; `None` without an `@`.
pub fn split_snapshot(name: &str) -> Option<(&str, &str)> {
    name.split_once('@')
}

/// Checks a snapshot's name (after the `@`): as a volume's name, 1-200 bytes of letters,
/// digits, `-`, `_`, `.`, `:`.
pub fn valid_snapshot_name(name: &str) -> bool {
    super::dir::valid_volume_name(name)
}

/// Decodes a deadlist object's bytes into its block pointers; `None` for a partial pointer.
pub fn decode_deadlist(bytes: &[u8]) -> Option<Vec<BlkPtr>> {
    bytes
        .len()
        .is_multiple_of(crate::spa::bp::BP_BYTES)
        .then(|| crate::spa::bp::bps_from_bytes(bytes))
}

pub fn encode_deadlist(bps: &[BlkPtr]) -> Vec<u8> {
    bps.iter()
        .flat_map(|bp| bp.as_bytes().iter().copied())
        .collect()
}

/// What destroying snapshot S does to the deadlist of the tree after it (N: the next
/// snapshot, or the head). With P the snapshot before S (txg `p`; 0 if none) and PP the one
/// before P (txg `pp`):
///
/// N's new deadlist must be P \ N = (P \ S) ∪ ((P ∩ S) \ N). P \ S is S's deadlist. The
/// entries of N's deadlist (S \ N) born at or before `p` were alive at `p`, so P holds them
/// (a block is never taken back once let go): they stay, after S's. Those born after `p` were
/// in S alone: freed. Kept entries born after `pp` were in P and S but in no tree before P
/// nor after S: P alone has them now (`prev_unique_gain`).
pub struct Merge {
    /// S's deadlist, then N's kept entries.
    pub next_deadlist: Vec<BlkPtr>,
    /// N's entries born after `p`: in S alone, freed now.
    pub freed: Vec<BlkPtr>,
    pub freed_bytes: u64,
    pub kept_bytes: u64,
    /// Bytes of kept entries born after `pp`: P's alone now.
    pub prev_unique_gain: u64,
}

pub fn merge_on_destroy(s_deadlist: Vec<BlkPtr>, n_deadlist: &[BlkPtr], p: u64, pp: u64) -> Merge {
    let mut m = Merge {
        next_deadlist: s_deadlist,
        freed: Vec::new(),
        freed_bytes: 0,
        kept_bytes: 0,
        prev_unique_gain: 0,
    };
    for bp in n_deadlist {
        let birth = bp.birth_txg.get();
        if birth > p {
            m.freed.push(*bp);
            m.freed_bytes += bp.asize_total();
        } else {
            m.kept_bytes += bp.asize_total();
            if birth > pp {
                m.prev_unique_gain += bp.asize_total();
            }
            m.next_deadlist.push(*bp);
        }
    }
    m
}

/// Bytes of the entries of a deadlist born in `(after, upto]`.
pub fn bytes_born_in(deadlist: &[BlkPtr], after: u64, upto: u64) -> u64 {
    deadlist
        .iter()
        .filter(|bp| (after + 1..=upto).contains(&bp.birth_txg.get()))
        .map(BlkPtr::asize_total)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// A block of birth `birth` and a size that names it.
    fn block(id: u64, birth: u64) -> BlkPtr {
        let mut bp = BlkPtr::HOLE;
        bp.birth_txg = birth.into();
        bp.dva[0].asize = (4096 * id as u32).into();
        bp.dva[0].offset = id.into();
        bp
    }

    /// Random histories of one volume with snapshots: every merge gives the deadlist a
    /// fresh computation from the trees would, frees exactly the blocks no tree keeps, and
    /// moves `unique` to the snapshot before as the trees say.
    #[test]
    fn merging_deadlists_matches_the_trees() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(59);
        for _round in 0..200 {
            // Trees: txg -> set of block ids; a block's lifetime is contiguous.
            let mut live: BTreeMap<u64, u64> = BTreeMap::new(); // slot -> block id
            let mut births: BTreeMap<u64, u64> = BTreeMap::new();
            let mut next_id = 1u64;
            let mut snaps: Vec<(u64, BTreeSet<u64>)> = Vec::new();
            for txg in 1..=12u64 {
                for _ in 0..rng.gen_range(1..4) {
                    let slot = rng.gen_range(0..6);
                    live.insert(slot, next_id);
                    births.insert(next_id, txg);
                    next_id += 1;
                }
                if rng.gen_bool(0.5) {
                    snaps.push((txg, live.values().copied().collect()));
                }
            }
            if snaps.len() < 2 {
                continue;
            }
            let head: BTreeSet<u64> = live.values().copied().collect();
            let bp = |id: u64| block(id, births[&id]);
            // Deadlist of tree i (i = snaps.len() is the head) = tree(i-1) \ tree(i).
            let tree = |i: usize, snaps: &[(u64, BTreeSet<u64>)]| {
                if i == snaps.len() {
                    head.clone()
                } else {
                    snaps[i].1.clone()
                }
            };
            let deadlist = |i: usize, snaps: &[(u64, BTreeSet<u64>)]| -> Vec<BlkPtr> {
                if i == 0 {
                    return vec![];
                }
                tree(i - 1, snaps)
                    .difference(&tree(i, snaps))
                    .map(|&id| bp(id))
                    .collect()
            };
            let s = rng.gen_range(0..snaps.len());
            let p = if s > 0 { snaps[s - 1].0 } else { 0 };
            let pp = if s > 1 { snaps[s - 2].0 } else { 0 };
            let m = merge_on_destroy(deadlist(s, &snaps), &deadlist(s + 1, &snaps), p, pp);
            let mut after = snaps.clone();
            after.remove(s);
            let ids = |v: &[BlkPtr]| -> BTreeSet<u64> {
                v.iter().map(|b| b.dva[0].offset.get()).collect()
            };
            assert_eq!(ids(&m.next_deadlist), ids(&deadlist(s, &after)));
            assert_eq!(
                m.next_deadlist.len(),
                deadlist(s, &after).len(),
                "no duplicate"
            );
            // Freed: in S and in no other tree.
            let others: BTreeSet<u64> = (0..=after.len()).flat_map(|i| tree(i, &after)).collect();
            let alone: BTreeSet<u64> = snaps[s].1.difference(&others).copied().collect();
            assert_eq!(ids(&m.freed), alone);
            if s > 0 {
                let unique = |i: usize, v: &[(u64, BTreeSet<u64>)]| -> u64 {
                    let mine = &v[i].1;
                    mine.iter()
                        .filter(|id| i == 0 || !v[i - 1].1.contains(id))
                        .filter(|id| !tree(i + 1, v).contains(id))
                        .map(|&id| bp(id).asize_total())
                        .sum()
                };
                assert_eq!(
                    unique(s - 1, &snaps) + m.prev_unique_gain,
                    unique(s - 1, &after)
                );
            }
        }
    }

    #[test]
    fn a_record_keeps_its_name_and_size() {
        let mut r = DatasetPhys::new_zeroed();
        r.set_name("monday");
        assert_eq!(r.name().as_deref(), Some("monday"));
        assert_eq!(r.as_bytes().len(), RECORD_BYTES);
        assert_eq!(split_snapshot("vm0@s1"), Some(("vm0", "s1")));
        assert!(!valid_snapshot_name("a@b") && valid_snapshot_name("s-1.x"));
        let bps = vec![block(1, 3), block(2, 4)];
        assert_eq!(decode_deadlist(&encode_deadlist(&bps)).unwrap(), bps);
        assert!(decode_deadlist(&[0u8; 100]).is_none());
        assert_eq!(bytes_born_in(&bps, 3, 4), block(2, 4).asize_total());
    }

    use zerocopy::FromZeros;
}
