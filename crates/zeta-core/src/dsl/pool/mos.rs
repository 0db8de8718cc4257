//! The meta object set: its objects (the volume directory, the metaslab table, one space
//! map per metaslab), built empty for a new pool, loaded at import, and read and rewritten
//! whole.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use zerocopy::FromBytes;

use crate::dmu::dnode::{is_data_block_size, OBJSET_MOS, OBJSET_VOLUME};
use crate::dmu::object::{spans, walk};
use crate::dmu::{Dirty, DnodePhys, Object, ObjectIo, ObjectKind, ObjsetPhys};
use crate::dsl::dir::{DirEntryPhys, ENTRY_BYTES};
use crate::spa::label::{PoolConfig, Uberblock};
use crate::spa::space_map::{decode_all, RECORD_BYTES};
use crate::spa::{AllocClass, BlkPtr, BlockKind};
use crate::zil::{Log, ZilHeader};
use crate::zio::{WriteProps, ZioError};
use zeta_math::ChecksumKind;

use crate::zio::compress::Compression;

use super::{
    check_volsize, invalid, Dataset, DatasetParts, Mos, PoolError, RecvState, DIR_BLOCK_BYTES,
    MSTABLE_BLOCK_BYTES, SM_BLOCK_BYTES,
};

pub(super) fn meta_props(kind: BlockKind, checksum: ChecksumKind, class: AllocClass) -> WriteProps {
    WriteProps {
        kind,
        level: 0,
        checksum: checksum.for_metadata(),
        copies: 2,
        class,
        compress: Compression::Off,
    }
}

pub(super) fn alloc_geometry(cfg: &PoolConfig) -> Vec<(u32, u64, u32)> {
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

pub(super) fn empty_mos(ms_per_top: &[usize]) -> Mos {
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
        rewrite_objsets: false,
        table: super::snapshot::Table::empty(),
    }
}

/// Reads the whole logical content of an object (`size_bytes` of it).
pub(super) fn read_object(obj: &Object, io: &ObjectIo) -> Result<Vec<u8>, ZioError> {
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
pub(super) fn write_object_bytes(
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

pub(super) fn append_object(obj: &Object, io: &ObjectIo, bytes: &[u8]) -> Result<(), ZioError> {
    let size = obj.dnode().size_bytes.get();
    write_object_bytes(obj, io, size, bytes)
}

/// Replaces the whole content of an object.
pub(super) fn rewrite_object(obj: &Object, bytes: &[u8]) -> Result<(), ZioError> {
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
pub(super) struct LoadedVolume {
    pub(super) ds: Dataset,
    pub(super) zil: ZilHeader,
    pub(super) replay_after: u64,
}

/// Loads the MOS of one uberblock: directory, metaslab table, every space map (replayed into
/// the allocator) and every volume's objset, claiming each MOS block. Any checksum failure or
/// inconsistency rejects this uberblock.
pub(super) fn load_mos(
    io: &ObjectIo,
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
        let what = name.clone();
        let checksum = ChecksumKind::from_u8(e.checksum)
            .ok_or_else(|| invalid(format!("volume {name}: unknown checksum")))?;
        let volblocksize = e.volblocksize.get();
        if !is_data_block_size(volblocksize) {
            return Err(invalid(format!(
                "volume {name}: block size {volblocksize} is not one a volume can have"
            )));
        }
        check_volsize(e.volsize.get(), volblocksize)
            .map_err(|_| invalid(format!("volume {name}: bad size")))?;
        if e.flags & !crate::dsl::dir::KNOWN_FLAGS != 0 {
            return Err(invalid(format!(
                "volume {name}: unknown flags {:#04x} in its directory entry",
                e.flags
            )));
        }
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
        let ds = Dataset::from_parts(DatasetParts {
            name,
            guid: e.guid.get(),
            volblocksize,
            created_txg: e.created_txg.get(),
            volsize: e.volsize.get(),
            refreservation: e.refreservation.get(),
            dnode: dn,
            objset: e.objset,
            log: Log::off(),
            dataset_id: e.dataset_id.get(),
            snapshot: false,
        });
        ds.set_readonly_flag(e.flags & crate::dsl::dir::FLAG_READONLY != 0);
        if e.recv_to_guid.get() != 0 {
            if e.recv_offset.get() > e.volsize.get()
                || !e.recv_offset.get().is_multiple_of(volblocksize as u64)
            {
                return Err(invalid(format!(
                    "volume {what}: its interrupted receive's offset is not one it can have"
                )));
            }
            *ds.recv.lock() = Some(RecvState {
                to_guid: e.recv_to_guid.get(),
                from_guid: e.recv_from_guid.get(),
                offset: e.recv_offset.get(),
            });
        }
        datasets.push(LoadedVolume {
            ds,
            zil: ZilHeader::decode(&e.zil),
            replay_after: e.replay_after.get(),
        });
    }
    // The dataset table: heads with snapshots, and the snapshots (slot 2, unused in a pool
    // written before `org.zeta:snapshots`). Its blocks and the deadlists' are in the space
    // maps, like a volume's.
    let mut heads = std::collections::BTreeMap::new();
    for v in &datasets {
        let id = v.ds.dataset_id.load(Ordering::Relaxed);
        if id != 0 {
            if let Some(other) = heads.insert(id, v.ds.name.clone()) {
                return Err(invalid(format!(
                    "volumes {other} and {} name the same dataset record {id}",
                    v.ds.name
                )));
            }
        }
    }
    mos.table = super::snapshot::Table::load(io, &os.dnodes[2], &heads)?;
    // Before any sync can run on them: from their first, a head lets go of the blocks its
    // latest snapshot (or its origin) holds onto its deadlist, never to be freed.
    for v in &datasets {
        mos.table.arm_head(&v.ds);
    }
    Ok((mos, datasets))
}

/// Whether a dnode read from disk is one this pool could have written as an object of `kind`:
/// reading one that is not (a block size of 0, or not a power of two; copies the allocator
/// cannot place) would panic or fail an assert later, in import or in the sync thread.
pub(super) fn check_dnode(dn: &DnodePhys, kind: ObjectKind) -> Result<(), PoolError> {
    if dn.kind != kind as u8
        || dn.nlevels == 0
        || dn.nlevels > 8
        || ChecksumKind::from_u8(dn.checksum).is_none()
        || Compression::from_phys(dn.compress, dn.compress_level).is_none()
        || !is_data_block_size(dn.data_block_bytes.get())
        || !(1..=3).contains(&dn.copies)
    {
        return Err(invalid(format!("malformed {kind:?} dnode")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dnodes_no_writer_makes_are_refused() {
        let good = DnodePhys::new(ObjectKind::VolumeData, 16384, ChecksumKind::Sha256 as u8, 1);
        assert!(check_dnode(&good, ObjectKind::VolumeData).is_ok());
        assert!(check_dnode(&good, ObjectKind::Directory).is_err());
        for bs in [0u32, 2048, 6144, 1 << 20] {
            let mut dn = good;
            dn.data_block_bytes = bs.into();
            assert!(check_dnode(&dn, ObjectKind::VolumeData).is_err(), "{bs}");
        }
        for copies in [0u8, 4] {
            let mut dn = good;
            dn.copies = copies;
            assert!(
                check_dnode(&dn, ObjectKind::VolumeData).is_err(),
                "{copies}"
            );
        }
    }
}
