//! The block-pointer tree of an object: looking up a level-0 block's pointer (one walk per
//! level-1 block for blocks in order, `Leaves`), and walking every block of the tree
//! (`walk`, `walk_from`), as scrub, verify and frees do.

use std::sync::Arc;

use crate::dmu::dnode::{DnodePhys, IND_BLOCK_BYTES, IND_SHIFT};
use crate::spa::BlkPtr;
use crate::zio::ZioError;
use zerocopy::IntoBytes;

use super::{bp_at, ObjectIo, Wait, FANOUT};

/// `bp`, the pointer to a block of `level` in the tree of `dn`, if it is a hole or points at
/// a block of the size every such block has (an indirect block's, or the object's block
/// size): pointers come from disk, and one of another size, which no writer makes, would be
/// read past the end of its block (an indirect block of 4K holds 32 pointers, not 128).
/// `zio` checks where each copy lies (`Zio::vdev_of`).
fn sized(bp: BlkPtr, level: u8, dn: &DnodePhys) -> Result<BlkPtr, ZioError> {
    let want = if level > 0 {
        IND_BLOCK_BYTES as u64
    } else {
        dn.data_block_bytes.get() as u64
    };
    let lsize = bp.lsize.get() as u64;
    if bp.is_hole() || lsize == want {
        return Ok(bp);
    }
    Err(ZioError::impossible(
        &bp,
        format!("a level-{level} block of {lsize} bytes, not {want}"),
    ))
}

/// The pointer in `slot` of `block`, a block of `level` + 1 in the tree of `dn` (`sized`).
fn child(block: &[u8], slot: usize, level: u8, dn: &DnodePhys) -> Result<BlkPtr, ZioError> {
    sized(bp_at(block, slot), level, dn)
}

/// The pointer to block `idx` of `level` in the tree of `dn` (a hole when out of its range).
pub(super) fn lookup(
    io: &ObjectIo,
    dn: &DnodePhys,
    level: u8,
    idx: u64,
) -> Result<BlkPtr, ZioError> {
    lookup_in(io, dn, level, idx, Wait::Yes).map(|bp| bp.expect("a waiting read answers"))
}

/// `lookup`, or with `Wait::No` `None` where an indirect block would wait for a device.
fn lookup_in(
    io: &ObjectIo,
    dn: &DnodePhys,
    level: u8,
    idx: u64,
    wait: Wait,
) -> Result<Option<BlkPtr>, ZioError> {
    let top = dn.nlevels - 1;
    if level > top || (idx >> (IND_SHIFT as u64 * (top - level) as u64)) != 0 {
        return Ok(Some(BlkPtr::HOLE));
    }
    let mut bp = sized(dn.root, top, dn)?;
    for l in (level + 1..=top).rev() {
        if bp.is_hole() {
            return Ok(Some(bp));
        }
        let Some(block) = io.fetch(&bp, wait)? else {
            return Ok(None);
        };
        let slot = ((idx >> (IND_SHIFT * (l - 1 - level) as u32)) as usize) & (FANOUT - 1);
        bp = child(&block, slot, l - 1, dn)?;
    }
    Ok(Some(bp))
}

/// Block pointers of level-0 blocks looked up in order: consecutive blocks under one level-1
/// block take it once, where `lookup` would walk the tree from the root for each.
pub(super) struct Leaves<'a> {
    dn: &'a DnodePhys,
    /// The level-1 block last walked to (its index; `None` for a hole).
    parent: Option<(u64, Option<Arc<Vec<u8>>>)>,
}

impl<'a> Leaves<'a> {
    pub(super) fn new(dn: &'a DnodePhys) -> Leaves<'a> {
        Leaves { dn, parent: None }
    }

    pub(super) fn get(&mut self, io: &ObjectIo, blkid: u64) -> Result<BlkPtr, ZioError> {
        self.get_in(io, blkid, Wait::Yes)
            .map(|bp| bp.expect("a waiting read answers"))
    }

    /// `get`, or with `Wait::No` `None` where an indirect block would wait for a device.
    pub(super) fn get_in(
        &mut self,
        io: &ObjectIo,
        blkid: u64,
        wait: Wait,
    ) -> Result<Option<BlkPtr>, ZioError> {
        if self.dn.nlevels < 2 {
            return lookup_in(io, self.dn, 0, blkid, wait);
        }
        let pidx = blkid >> IND_SHIFT;
        let block = match &self.parent {
            Some((p, block)) if *p == pidx => block.clone(),
            _ => {
                let Some(pbp) = lookup_in(io, self.dn, 1, pidx, wait)? else {
                    return Ok(None);
                };
                let block = if pbp.is_hole() {
                    None
                } else {
                    let Some(b) = io.fetch(&pbp, wait)? else {
                        return Ok(None);
                    };
                    Some(b)
                };
                self.parent = Some((pidx, block.clone()));
                block
            }
        };
        match block {
            Some(b) => child(&b, (blkid as usize) & (FANOUT - 1), 0, self.dn).map(Some),
            None => Ok(Some(BlkPtr::HOLE)),
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn collect_blkids(
    io: &ObjectIo,
    dn: &DnodePhys,
    bp: BlkPtr,
    level: u8,
    first: u64,
    from: u64,
    to: u64,
    out: &mut Vec<u64>,
) -> Result<(), ZioError> {
    let span = 1u64 << (IND_SHIFT * level as u32);
    if bp.is_hole() || first >= to || first + span <= from {
        return Ok(());
    }
    if level == 0 {
        out.push(first);
        return Ok(());
    }
    let block = io.read_bp(&sized(bp, level, dn)?)?;
    let child_span = span >> IND_SHIFT;
    for slot in 0..FANOUT {
        collect_blkids(
            io,
            dn,
            bp_at(&block, slot),
            level - 1,
            first + slot as u64 * child_span,
            from,
            to,
            out,
        )?;
    }
    Ok(())
}

/// What a `walk_from` visitor wants done below a block pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Visit {
    Descend,
    /// Do not read the block's children (it is damaged, or of no interest).
    Skip,
}

/// What `walk_from` tells of a subtree it could not walk: the pointer to its root, its
/// level, the first block id it covers, and why (its indirect block could not be read, or
/// the pointer is impossible). Nothing below it was visited.
pub type Unwalked<'a> = &'a mut dyn FnMut(&BlkPtr, u8, u64, ZioError);

/// Visits the block pointers of the tree of `dn` in block order, parents before children,
/// telling `f` the first block id each one covers; subtrees that lie wholly before block
/// `from` are passed over without being read, so a scan can resume where it stopped. An
/// indirect block that cannot be read is passed over, after `f` was shown its pointer (a
/// scrub reads and reports it there), and told to `unwalked`, as is a pointer of a size no
/// block of its level has (`sized`), which `f` is not shown: the blocks below are neither
/// visited nor lost without a word (a resilver has not rebuilt them).
pub fn walk_from(
    io: &ObjectIo,
    dn: &DnodePhys,
    from: u64,
    f: &mut dyn FnMut(&BlkPtr, u8, u64) -> Visit,
    unwalked: Unwalked,
) {
    struct Walk<'a, 'b> {
        io: &'a ObjectIo,
        dn: &'a DnodePhys,
        from: u64,
        f: &'a mut dyn FnMut(&BlkPtr, u8, u64) -> Visit,
        unwalked: Unwalked<'b>,
    }
    fn go(w: &mut Walk, bp: BlkPtr, level: u8, first: u64) {
        let span = (FANOUT as u64).saturating_pow(level as u32);
        if bp.is_hole() || first.saturating_add(span) <= w.from {
            return;
        }
        let bp = match sized(bp, level, w.dn) {
            Ok(bp) => bp,
            Err(e) => return (w.unwalked)(&bp, level, first, e),
        };
        if (w.f)(&bp, level, first) == Visit::Skip || level == 0 {
            return;
        }
        let block = match w.io.read_bp(&bp) {
            Ok(b) => b,
            Err(e) => return (w.unwalked)(&bp, level, first, e),
        };
        let child_span = span / FANOUT as u64;
        for slot in 0..FANOUT {
            go(
                w,
                bp_at(&block, slot),
                level - 1,
                first + slot as u64 * child_span,
            );
        }
    }
    let mut w = Walk {
        io,
        dn,
        from,
        f,
        unwalked,
    };
    go(&mut w, dn.root, dn.nlevels - 1, 0)
}

/// Visits every block pointer of the tree of `dn`, parents before children, reading (and so
/// verifying) every indirect block.
pub fn walk(
    io: &ObjectIo,
    dn: &DnodePhys,
    f: &mut dyn FnMut(&BlkPtr, u8) -> Result<(), ZioError>,
) -> Result<(), ZioError> {
    fn go(
        io: &ObjectIo,
        dn: &DnodePhys,
        bp: BlkPtr,
        level: u8,
        f: &mut dyn FnMut(&BlkPtr, u8) -> Result<(), ZioError>,
    ) -> Result<(), ZioError> {
        if bp.is_hole() {
            return Ok(());
        }
        let bp = sized(bp, level, dn)?;
        f(&bp, level)?;
        if level > 0 {
            let block = io.read_bp(&bp)?;
            for slot in 0..FANOUT {
                go(io, dn, bp_at(&block, slot), level - 1, f)?;
            }
        }
        Ok(())
    }
    go(io, dn, dn.root, dn.nlevels - 1, f)
}

/// Visits every block of the tree of `old` that the tree of `new` does not hold, `new` being
/// a later tree of the same object (a snapshot's successor, or a clone of it): a block keeps
/// its place, so a pointer found at the same place in both is one block, and a subtree both
/// point at is shared whole and not entered. Only the indirect blocks where the trees differ
/// are read: the cost follows the change, not the object's size. Parents come before
/// children.
pub fn dead_between(
    io: &ObjectIo,
    old: &DnodePhys,
    new: &DnodePhys,
    f: &mut dyn FnMut(&BlkPtr),
) -> Result<(), ZioError> {
    struct Diff<'a, 'b> {
        io: &'a ObjectIo,
        old: &'a DnodePhys,
        new: &'a DnodePhys,
        f: &'b mut dyn FnMut(&BlkPtr),
    }
    fn read(d: &Diff, bp: BlkPtr, level: u8, dn: &DnodePhys) -> Result<Arc<Vec<u8>>, ZioError> {
        d.io.read_bp(&sized(bp, level, dn)?)
    }
    fn go(d: &mut Diff, old: BlkPtr, new: BlkPtr, level: u8) -> Result<(), ZioError> {
        if old.is_hole() || old.as_bytes() == new.as_bytes() {
            return Ok(());
        }
        let old = sized(old, level, d.old)?;
        (d.f)(&old);
        if level == 0 {
            return Ok(());
        }
        let ob = d.io.read_bp(&old)?;
        let nb = match new.is_hole() {
            true => None,
            false => Some(read(d, new, level, d.new)?),
        };
        for slot in 0..FANOUT {
            let n = nb.as_ref().map_or(BlkPtr::HOLE, |b| bp_at(b, slot));
            go(d, bp_at(&ob, slot), n, level - 1)?;
        }
        Ok(())
    }
    let mut d = Diff { io, old, new, f };
    let (mut o, mut n) = (old.root, new.root);
    let (mut lo, mut ln) = (old.nlevels - 1, new.nlevels - 1);
    // A tree that grew a level holds its old root in the new root's first slot.
    while ln > lo {
        if !n.is_hole() {
            n = bp_at(&read(&d, n, ln, new)?, 0);
        }
        ln -= 1;
    }
    while lo > ln {
        if o.is_hole() {
            return Ok(());
        }
        let block = read(&d, o, lo, old)?;
        (d.f)(&sized(o, lo, old)?);
        for slot in 1..FANOUT {
            go(&mut d, bp_at(&block, slot), BlkPtr::HOLE, lo - 1)?;
        }
        o = bp_at(&block, 0);
        lo -= 1;
    }
    go(&mut d, o, n, lo)
}
