//! `zeta receive`: a send stream (`dsl::stream`) applied to a volume, ending in the snapshot
//! it carries. A full stream makes a new volume; an incremental one applies the changes to
//! the volume whose latest snapshot is the stream's base. Either is all or nothing: a stream
//! refused part-way (damaged, cut short, out of room) leaves no new volume behind, or the
//! volume rolled back to its base, as it was — unless the receive is resumable (`-s`, as
//! `zfs receive -s`): then what was received stays, marked partly received (no client may open
//! it), with its place (`Dataset::receiving`), which a resume token carries to the sender
//! (`zeta send -t`); the resumed stream carries the rest. `abort` gives the partial state up.
//!
//! While records are applied the volume is marked partly received on disk, from before its
//! first write: a crash part-way leaves it so (resumable from its last recorded place, or
//! aborted), never as a volume that looks whole.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::dsl::stream::{Reader, Record, FLAG_INCREMENTAL, FLAG_RESUMED};
use crate::dsl::{Pool, PoolError, RecvState};
use crate::zvol::Volume;
use zeta_math::ChecksumKind;

/// What a receive applied.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ReceiveSummary {
    pub records: u64,
    pub data_bytes: u64,
    pub incremental: bool,
    pub resumed: bool,
}

fn bad(what: impl std::fmt::Display) -> PoolError {
    PoolError::Invalid(format!("receive: {what}"))
}

/// The resume token of a partly received volume: what `zeta send -t` needs to send the rest
/// (the snapshot's and the base's guids, the offset reached), with a check so that a
/// mistyped token is refused rather than sent from the wrong place.
pub fn resume_token(st: &RecvState) -> String {
    let body = format!("{:x}-{:x}-{:x}", st.to_guid, st.from_guid, st.offset);
    format!("zr1-{body}-{}", token_sum(&body))
}

fn token_sum(body: &str) -> String {
    let d = Sha256::digest(body.as_bytes());
    d[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads a token `resume_token` wrote.
pub fn parse_token(token: &str) -> Result<RecvState, PoolError> {
    let refuse = || PoolError::Invalid(format!("'{token}' is not a resume token (zr1-…)"));
    let rest = token.trim().strip_prefix("zr1-").ok_or_else(refuse)?;
    let (body, sum) = rest.rsplit_once('-').ok_or_else(refuse)?;
    if token_sum(body) != sum {
        return Err(PoolError::Invalid(format!(
            "resume token '{token}' fails its check: copy it whole"
        )));
    }
    let mut parts = body.split('-').map(|p| u64::from_str_radix(p, 16));
    let mut next = || parts.next().and_then(Result::ok).ok_or_else(refuse);
    Ok(RecvState {
        to_guid: next()?,
        from_guid: next()?,
        offset: next()?,
    })
}

/// The error of a resumable receive that stopped, naming how to go on.
fn kept(pool: &Pool, vol: &str, e: PoolError, st: &RecvState) -> PoolError {
    bad(format!(
        "{e}; what was received is kept (up to byte {}): resume with `zeta send -t {} | zeta \
         receive -s {}/{vol}`, or give it up with `zeta receive -A {}/{vol}`",
        st.offset,
        resume_token(st),
        pool.name,
        pool.name
    ))
}

/// Gives up the interrupted receive of `vol` (`zfs receive -A`): a volume a full stream was
/// making is destroyed; one an incremental stream was changing is rolled back to its base.
pub fn abort(pool: &Arc<Pool>, vol: &str) -> Result<(), PoolError> {
    let ds = pool.dataset(vol)?;
    let Some(st) = ds.receiving() else {
        return Err(bad(format!(
            "'{}/{vol}' has no interrupted receive to give up",
            pool.name
        )));
    };
    drop(ds);
    if st.from_guid == 0 {
        return pool.destroy_volume(vol);
    }
    let base = pool.snapshots_of(vol).last().map(|s| s.name.clone());
    match base {
        Some(b) => pool.rollback(&b),
        None => Err(bad(format!(
            "'{}/{vol}' has lost its base snapshot",
            pool.name
        ))),
    }
}

/// Receives a stream from `input` into volume `vol` of `pool`. With `force`, an incremental
/// stream is taken by a volume written since its latest snapshot, rolled back first (`zfs
/// receive -F`). With `resumable` (`-s`), a receive that stops part-way keeps what it
/// received (see the module's doc); a resumed stream (`zeta send -t`) always does.
/// `progress` is told the data bytes applied so far; it returns false to stop (the receive
/// then fails).
pub fn receive(
    pool: &Arc<Pool>,
    vol: &str,
    input: &mut dyn std::io::Read,
    force: bool,
    resumable: bool,
    progress: &mut dyn FnMut(u64) -> bool,
) -> Result<ReceiveSummary, PoolError> {
    let (h, mut reader) = Reader::new(input).map_err(bad)?;
    let snap = h.snap_name().expect("checked by decode");
    let target = format!("{vol}@{snap}");
    let incremental = h.flags.get() & FLAG_INCREMENTAL != 0;
    let resumed = h.flags.get() & FLAG_RESUMED != 0;
    let (volsize, bs) = (h.volsize.get(), h.volblocksize.get());
    let checksum = ChecksumKind::from_u8(h.checksum)
        .ok_or_else(|| bad(format!("unknown checksum kind {}", h.checksum)))?;
    let state = RecvState {
        to_guid: h.to_guid.get(),
        from_guid: h.from_guid.get(),
        offset: 0,
    };
    let summary = |s: ReceiveSummary| ReceiveSummary {
        incremental,
        resumed,
        ..s
    };
    if resumed {
        let ds = pool.dataset(vol)?;
        let Some(st) = ds.receiving() else {
            return Err(bad(format!(
                "the stream resumes an interrupted receive, and '{}/{vol}' has none",
                pool.name
            )));
        };
        if (st.to_guid, st.from_guid) != (state.to_guid, state.from_guid) {
            return Err(bad(format!(
                "the stream resumes the receive of snapshot guid {:#x}; '{}/{vol}' was \
                 receiving guid {:#x}: send with its token (zeta get receive_resume_token)",
                state.to_guid, pool.name, st.to_guid
            )));
        }
        if st.offset != h.resume_offset.get() {
            return Err(bad(format!(
                "the stream resumes at byte {}, and '{}/{vol}' holds what was received up to \
                 byte {}: send with its token as it is now (zeta get receive_resume_token)",
                h.resume_offset.get(),
                pool.name,
                st.offset
            )));
        }
        if ds.volblocksize != bs || ds.volsize() != volsize {
            return Err(bad(format!(
                "the stream's volume ({volsize} bytes, blocks of {bs}) is not the one '{}/{vol}' \
                 was receiving",
                pool.name
            )));
        }
        pool.check_closed(&ds)?;
        drop(ds);
        let s = apply(pool, vol, &mut reader, volsize, progress, st, true)?;
        pool.snapshot_received(&target, state.to_guid)?;
        return Ok(summary(s));
    }
    if incremental {
        let head = pool.dataset(vol)?;
        if head.receiving().is_some() {
            return Err(bad(format!(
                "'{}/{vol}' is partly received already: resume it or give it up (-A)",
                pool.name
            )));
        }
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
        pool.check_closed(&head)?;
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
        pool.set_receiving(vol, Some(state))?;
        let r = apply(pool, vol, &mut reader, volsize, progress, state, resumable);
        match r.and_then(|s| pool.snapshot_received(&target, state.to_guid).map(|_| s)) {
            Ok(s) => Ok(summary(s)),
            Err(e) if resumable => Err(e),
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
        pool.create_volume_receiving(vol, volsize, bs, checksum, state)?;
        let r = apply(pool, vol, &mut reader, volsize, progress, state, resumable);
        match r.and_then(|s| pool.snapshot_received(&target, state.to_guid).map(|_| s)) {
            Ok(s) => Ok(summary(s)),
            Err(e) if resumable => Err(e),
            Err(e) => {
                let _ = pool.destroy_snapshot(&target);
                let _ = pool.destroy_volume(vol);
                Err(e)
            }
        }
    }
}

/// How many data bytes a resumable receive applies between the places it records: each
/// costs a flush.
const MARK_BYTES: u64 = 64 << 20;

/// Applies every record to the head from `st.offset` on, flushes, and checks the end record.
/// With `resumable`, the place reached is recorded every `MARK_BYTES` (once what is before it
/// is flushed), and on a failure what was applied and flushed stays, with its place.
fn apply(
    pool: &Arc<Pool>,
    vol: &str,
    reader: &mut Reader<&mut dyn std::io::Read>,
    volsize: u64,
    progress: &mut dyn FnMut(u64) -> bool,
    mut st: RecvState,
    resumable: bool,
) -> Result<ReceiveSummary, PoolError> {
    let v = Volume::open_for_receive(pool, vol)?;
    // The end of the last record applied: everything of the stream before it is.
    let mut applied_end = st.offset;
    let r = apply_records(
        pool,
        &v,
        reader,
        volsize,
        progress,
        &mut st,
        &mut applied_end,
        resumable,
    );
    match r {
        Err(e) if resumable => {
            if v.flush().is_ok() {
                st.offset = applied_end;
            }
            let _ = pool.set_receiving(vol, Some(st));
            Err(kept(pool, vol, e, &st))
        }
        r => r,
    }
}

#[allow(clippy::too_many_arguments)]
fn apply_records(
    pool: &Arc<Pool>,
    v: &Volume,
    reader: &mut Reader<&mut dyn std::io::Read>,
    volsize: u64,
    progress: &mut dyn FnMut(u64) -> bool,
    st: &mut RecvState,
    applied_end: &mut u64,
    resumable: bool,
) -> Result<ReceiveSummary, PoolError> {
    let vol_err = |e: super::VolError| bad(e);
    let mut sum = ReceiveSummary::default();
    // Writes of neighbouring blocks go to the volume together, up to this much: whole
    // blocks of a large write go to their place at once (`STREAMING_WRITE_BYTES`).
    const BATCH: usize = 1 << 20;
    let mut batch: (u64, Vec<u8>) = (0, Vec::with_capacity(BATCH));
    let put = |batch: &mut (u64, Vec<u8>), applied_end: &mut u64| -> Result<(), PoolError> {
        if !batch.1.is_empty() {
            v.write(batch.0, &batch.1).map_err(vol_err)?;
            *applied_end = batch.0 + batch.1.len() as u64;
            batch.1.clear();
        }
        Ok(())
    };
    let mut marked = 0u64;
    let from = st.offset;
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
        if offset < from {
            return Err(bad(format!(
                "record {} is before the place the stream resumes at",
                sum.records
            )));
        }
        match rec {
            Record::Write { offset, data } => {
                if batch.0 + batch.1.len() as u64 != offset || batch.1.len() + data.len() > BATCH {
                    put(&mut batch, applied_end)?;
                    batch.0 = offset;
                }
                batch.1.extend_from_slice(&data);
                sum.data_bytes += data.len() as u64;
            }
            Record::Free { offset, length } => {
                put(&mut batch, applied_end)?;
                v.trim(offset, length).map_err(vol_err)?;
                *applied_end = offset + length;
            }
            Record::End => unreachable!("handled above"),
        }
        sum.records += 1;
        if resumable && sum.data_bytes - marked >= MARK_BYTES {
            put(&mut batch, applied_end)?;
            v.flush().map_err(vol_err)?;
            st.offset = *applied_end;
            pool.mark_receiving(v.vol_name(), *st);
            marked = sum.data_bytes;
        }
        if !progress(sum.data_bytes) {
            return Err(bad("stopped"));
        }
    }
    put(&mut batch, applied_end)?;
    v.flush().map_err(vol_err)?;
    Ok(sum)
}
