//! `zeta receive`: a send stream (`dsl::stream`) applied to a volume, ending in the snapshot
//! it carries. A full stream makes a new volume; an incremental one applies the changes to
//! the volume whose latest snapshot is the stream's base. Either is all or nothing: a stream
//! refused part-way (damaged, cut short, out of room) leaves no new volume behind, or the
//! volume rolled back to its base, as it was.

use std::sync::Arc;

use crate::dsl::stream::{Reader, Record, FLAG_INCREMENTAL};
use crate::dsl::{Pool, PoolError};
use crate::zvol::Volume;
use zeta_math::ChecksumKind;

/// What a receive applied.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ReceiveSummary {
    pub records: u64,
    pub data_bytes: u64,
    pub incremental: bool,
}

fn bad(what: impl std::fmt::Display) -> PoolError {
    PoolError::Invalid(format!("receive: {what}"))
}

/// Receives a stream from `input` into volume `vol` of `pool`. With `force`, an incremental
/// stream is taken by a volume written since its latest snapshot, rolled back first (`zfs
/// receive -F`). `progress` is told the data bytes applied so far; it returns false to stop
/// (the receive then fails and undoes itself).
pub fn receive(
    pool: &Arc<Pool>,
    vol: &str,
    input: &mut dyn std::io::Read,
    force: bool,
    progress: &mut dyn FnMut(u64) -> bool,
) -> Result<ReceiveSummary, PoolError> {
    let (h, mut reader) = Reader::new(input).map_err(bad)?;
    let snap = h.snap_name().expect("checked by decode");
    let target = format!("{vol}@{snap}");
    let incremental = h.flags.get() & FLAG_INCREMENTAL != 0;
    let (volsize, bs) = (h.volsize.get(), h.volblocksize.get());
    let checksum = ChecksumKind::from_u8(h.checksum)
        .ok_or_else(|| bad(format!("unknown checksum kind {}", h.checksum)))?;
    if incremental {
        let head = pool.dataset(vol)?;
        let snaps = pool.snapshots_of(vol);
        let Some(latest) = snaps.last() else {
            return Err(bad(format!(
                "the stream holds the changes since a snapshot of guid {}, and '{}/{vol}' has \
                 no snapshot",
                h.from_guid.get(),
                pool.name
            )));
        };
        if latest.guid != h.from_guid.get() {
            return Err(bad(format!(
                "the stream holds the changes since a snapshot of guid {}; the latest of \
                 '{}/{vol}' is '{}' (guid {})",
                h.from_guid.get(),
                pool.name,
                latest.name,
                latest.guid
            )));
        }
        if head.volblocksize != bs {
            return Err(bad(format!(
                "the stream's block size {bs} is not '{}/{vol}''s ({})",
                pool.name, head.volblocksize
            )));
        }
        if pool.snapshot_dataset(&target).is_ok() {
            return Err(PoolError::SnapshotExists(format!("{}/{target}", pool.name)));
        }
        // Nothing else may write it meanwhile, and what was written counts once synced.
        if head.handles() > 0 {
            return Err(bad(format!(
                "'{}/{vol}' is open ({} handle(s): a connected client, or a copy in or out): \
                 disconnect them first",
                pool.name,
                head.handles()
            )));
        }
        pool.sync_now()?;
        let written = head.figures().written;
        let base = latest.name.clone();
        drop((head, snaps));
        if written > 0 {
            if !force {
                return Err(bad(format!(
                    "'{}/{vol}' was written since its latest snapshot '{base}': give -F to \
                     roll it back first",
                    pool.name
                )));
            }
            pool.rollback(&base)?;
        }
        if pool.dataset(vol)?.volsize() != volsize {
            pool.resize_volume(vol, volsize)?;
        }
        let r = apply(pool, vol, &mut reader, volsize, progress);
        match r.and_then(|s| pool.snapshot_received(&target, h.to_guid.get()).map(|_| s)) {
            Ok(s) => Ok(ReceiveSummary { incremental, ..s }),
            Err(e) => {
                // As it was: the base holds everything the volume held before.
                let _ = pool.rollback(&base);
                Err(e)
            }
        }
    } else {
        if pool.dataset(vol).is_ok() {
            return Err(PoolError::VolumeExists(format!(
                "{}/{vol} (a full stream makes a new volume)",
                pool.name
            )));
        }
        pool.create_volume(vol, volsize, bs, Some(checksum))?;
        let r = apply(pool, vol, &mut reader, volsize, progress);
        match r.and_then(|s| pool.snapshot_received(&target, h.to_guid.get()).map(|_| s)) {
            Ok(s) => Ok(s),
            Err(e) => {
                let _ = pool.destroy_snapshot(&target);
                let _ = pool.destroy_volume(vol);
                Err(e)
            }
        }
    }
}

/// Applies every record to the head, flushes, and checks the end record.
fn apply(
    pool: &Arc<Pool>,
    vol: &str,
    reader: &mut Reader<&mut dyn std::io::Read>,
    volsize: u64,
    progress: &mut dyn FnMut(u64) -> bool,
) -> Result<ReceiveSummary, PoolError> {
    let v = Volume::open_for_receive(pool, vol)?;
    let vol_err = |e: super::VolError| bad(e);
    let mut sum = ReceiveSummary::default();
    // Writes of neighbouring blocks go to the volume together, up to this much: whole
    // blocks of a large write go to their place at once (`STREAMING_WRITE_BYTES`).
    const BATCH: usize = 1 << 20;
    let mut batch: (u64, Vec<u8>) = (0, Vec::with_capacity(BATCH));
    let put = |batch: &mut (u64, Vec<u8>)| -> Result<(), PoolError> {
        if !batch.1.is_empty() {
            v.write(batch.0, &batch.1).map_err(vol_err)?;
            batch.1.clear();
        }
        Ok(())
    };
    loop {
        let rec = reader.next_record().map_err(bad)?;
        let (offset, len) = match &rec {
            Record::Write { offset, data } => (*offset, data.len() as u64),
            Record::Free { offset, length } => (*offset, *length),
            Record::End => break,
        };
        if offset.checked_add(len).is_none_or(|end| end > volsize) {
            return Err(bad(format!(
                "record {} reaches past the volume's {volsize} bytes",
                sum.records
            )));
        }
        match rec {
            Record::Write { offset, data } => {
                if batch.0 + batch.1.len() as u64 != offset || batch.1.len() + data.len() > BATCH {
                    put(&mut batch)?;
                    batch.0 = offset;
                }
                batch.1.extend_from_slice(&data);
                sum.data_bytes += data.len() as u64;
            }
            Record::Free { offset, length } => {
                put(&mut batch)?;
                v.trim(offset, length).map_err(vol_err)?
            }
            Record::End => unreachable!("handled above"),
        }
        sum.records += 1;
        if !progress(sum.data_bytes) {
            return Err(bad("stopped"));
        }
    }
    put(&mut batch)?;
    v.flush().map_err(vol_err)?;
    Ok(sum)
}
