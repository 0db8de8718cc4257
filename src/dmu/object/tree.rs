//! The block-pointer tree of an object: looking up a level-0 block's pointer (one walk per
//! level-1 block for blocks in order, `Leaves`), and walking every block of the tree
//! (`walk`, `walk_from`), as scrub, verify and frees do.

use std::sync::Arc;

use crate::dmu::dnode::{DnodePhys, IND_SHIFT};
use crate::spa::BlkPtr;
use crate::zio::ZioError;

use super::{bp_at, ObjectIo, Wait, FANOUT};

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
    let mut bp = dn.root;
    for l in (level + 1..=top).rev() {
        if bp.is_hole() {
            return Ok(Some(bp));
        }
        let Some(block) = io.fetch(&bp, wait)? else {
            return Ok(None);
        };
        let slot = ((idx >> (IND_SHIFT * (l - 1 - level) as u32)) as usize) & (FANOUT - 1);
        bp = bp_at(&block, slot);
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
        Ok(Some(block.map_or(BlkPtr::HOLE, |b| {
            bp_at(&b, (blkid as usize) & (FANOUT - 1))
        })))
    }
}

pub(super) fn collect_blkids(
    io: &ObjectIo,
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
    let block = io.read_bp(&bp)?;
    let child_span = span >> IND_SHIFT;
    for slot in 0..FANOUT {
        let child = bp_at(&block, slot);
        collect_blkids(
            io,
            child,
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

/// Visits the block pointers of the tree of `dn` in block order, parents before children,
/// telling `f` the first block id each one covers; subtrees that lie wholly before block
/// `from` are passed over without being read, so a scan can resume where it stopped. An
/// indirect block that cannot be read is passed over as if `f` had said `Skip`, after `f`
/// was shown its pointer (a scrub reads and reports it there).
pub fn walk_from(
    io: &ObjectIo,
    dn: &DnodePhys,
    from: u64,
    f: &mut dyn FnMut(&BlkPtr, u8, u64) -> Visit,
) {
    fn go(
        io: &ObjectIo,
        bp: &BlkPtr,
        level: u8,
        first: u64,
        from: u64,
        f: &mut dyn FnMut(&BlkPtr, u8, u64) -> Visit,
    ) {
        let span = (FANOUT as u64).saturating_pow(level as u32);
        if bp.is_hole() || first.saturating_add(span) <= from {
            return;
        }
        if f(bp, level, first) == Visit::Skip || level == 0 {
            return;
        }
        let Ok(block) = io.read_bp(bp) else {
            return;
        };
        let child_span = span / FANOUT as u64;
        for slot in 0..FANOUT {
            go(
                io,
                &bp_at(&block, slot),
                level - 1,
                first + slot as u64 * child_span,
                from,
                f,
            );
        }
    }
    go(io, &dn.root, dn.nlevels - 1, 0, from, f)
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
        bp: &BlkPtr,
        level: u8,
        f: &mut dyn FnMut(&BlkPtr, u8) -> Result<(), ZioError>,
    ) -> Result<(), ZioError> {
        if bp.is_hole() {
            return Ok(());
        }
        f(bp, level)?;
        if level > 0 {
            let block = io.read_bp(bp)?;
            for slot in 0..FANOUT {
                go(io, &bp_at(&block, slot), level - 1, f)?;
            }
        }
        Ok(())
    }
    go(io, &dn.root, dn.nlevels - 1, f)
}
