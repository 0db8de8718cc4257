//! `zeta send`: a snapshot as a stream (`dsl::stream`), whole or as the changes since an
//! earlier snapshot of the same volume. An incremental send walks only the subtrees born
//! after the base (copy-on-write: an older subtree holds nothing newer), so its cost grows
//! with what changed, not with the volume. Inside a changed indirect block, a hole may have
//! been data at the base (zeta keeps no birth for holes): it is sent as a free, which a
//! receiver applies to a hole as a no-op.

use std::sync::Arc;

use crate::dmu::object::{walk_from, Visit};
use crate::dmu::IND_SHIFT;
use crate::dsl::dataset::split_snapshot;
use crate::dsl::stream::{Header, Writer, FLAG_INCREMENTAL, FLAG_RESUMED};

use super::{invalid, Dataset, Pool, PoolError};

/// What a send wrote.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct SendSummary {
    pub records: u64,
    /// Data bytes sent (block payloads).
    pub data_bytes: u64,
    /// Bytes of the stream, header and records included.
    pub stream_bytes: u64,
}

/// A snapshot held open for a send (`Dataset::handles`): it cannot be destroyed meanwhile.
struct Held(Arc<Dataset>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.note_handle(false);
    }
}

impl Pool {
    /// Writes snapshot `VOL@SNAP` to `out` as a stream: whole, or with `from` (`VOL@BASE`, an
    /// older snapshot of the same volume) the changes since it. `progress` is told the data
    /// bytes sent so far; it returns false to stop (the send then fails, having written a
    /// stream no receiver takes).
    pub fn send(
        &self,
        name: &str,
        from: Option<&str>,
        out: &mut dyn std::io::Write,
        progress: &mut dyn FnMut(u64) -> bool,
    ) -> Result<SendSummary, PoolError> {
        self.send_from(name, from, None, out, progress)
    }

    /// Resumes an interrupted send (`zeta send -t TOKEN`): the stream of the snapshot of guid
    /// `to_guid` (whole, or since the earlier snapshot of its volume of guid `from_guid`)
    /// from volume byte `offset` on, flagged as resumed, which only the receive it resumes
    /// takes. Returns the snapshot's name beside what was sent.
    pub fn send_resumed(
        &self,
        to_guid: u64,
        from_guid: u64,
        offset: u64,
        out: &mut dyn std::io::Write,
        progress: &mut dyn FnMut(u64) -> bool,
    ) -> Result<(String, SendSummary), PoolError> {
        let snaps = self.snapshots();
        let by_guid = |g: u64| snaps.iter().find(|s| s.guid == g).map(|s| s.name.clone());
        let name = by_guid(to_guid).ok_or_else(|| {
            invalid(format!(
                "pool '{}' has no snapshot of guid {to_guid:#x}, which the token names",
                self.name
            ))
        })?;
        let from = match from_guid {
            0 => None,
            g => Some(by_guid(g).ok_or_else(|| {
                invalid(format!(
                    "pool '{}' has no snapshot of guid {g:#x}, the base the token names",
                    self.name
                ))
            })?),
        };
        let bs = self.snapshot_dataset(&name)?.volblocksize as u64;
        if !offset.is_multiple_of(bs) {
            return Err(invalid(format!(
                "the token's offset {offset} is no block boundary of '{}/{name}'",
                self.name
            )));
        }
        let sent = self.send_from(&name, from.as_deref(), Some(offset), out, progress)?;
        Ok((name, sent))
    }

    /// `send`, or with `resume` a resumed stream: its records from that volume byte on.
    fn send_from(
        &self,
        name: &str,
        from: Option<&str>,
        resume: Option<u64>,
        out: &mut dyn std::io::Write,
        progress: &mut dyn FnMut(u64) -> bool,
    ) -> Result<SendSummary, PoolError> {
        let snap = self.snapshot_dataset(name)?;
        snap.note_handle(true);
        let snap = Held(snap);
        let (vol, _) = split_snapshot(name).expect("a snapshot's name");
        let base = match from {
            None => None,
            Some(f) => {
                let b = self.snapshot_dataset(f)?;
                let same = split_snapshot(f).is_some_and(|(v, _)| v == vol);
                if !same || b.created_txg >= snap.0.created_txg {
                    return Err(invalid(format!(
                        "'{}/{f}' is not an earlier snapshot of '{}/{vol}'",
                        self.name, self.name
                    )));
                }
                Some((b.created_txg, b.guid))
            }
        };
        let ds = &snap.0;
        let bs = ds.volblocksize as u64;
        let f = ds.figures();
        let mut h = Header::new();
        h.volsize = ds.volsize().into();
        h.volblocksize = ds.volblocksize.into();
        h.checksum = ds.checksum() as u8;
        if let Some((_, guid)) = base {
            h.flags = FLAG_INCREMENTAL.into();
            h.from_guid = guid.into();
        }
        h.to_guid = ds.guid.into();
        h.to_txg = f.creation_txg.into();
        h.creation_time = f.creation_time.into();
        h.set_snap_name(split_snapshot(name).map(|(_, s)| s).unwrap_or_default());
        if let Some(resume) = resume {
            if resume > ds.volsize() {
                return Err(invalid(format!(
                    "the token's offset {resume} is past the end of '{}/{name}'",
                    self.name
                )));
            }
            h.flags = (h.flags.get() | FLAG_RESUMED).into();
            h.resume_offset = resume.into();
        }
        h.seal();

        let io_err = |e: std::io::Error| invalid(format!("writing the stream: {e}"));
        let mut w = Writer::new(&mut *out, &h).map_err(io_err)?;
        let base_txg = base.map(|(t, _)| t);
        let vol_blocks = ds.volsize() / bs;
        let dn = ds.object.dnode();
        // The next block id the records have accounted for; a gap before a block visited
        // inside a changed subtree is holes, sent as a free.
        let resume_block = resume.unwrap_or(0) / bs;
        let mut cursor = resume_block;
        let mut failed: Option<PoolError> = None;
        let mut unwalked: Option<PoolError> = None;
        let mut data_bytes = 0u64;
        let mut pending_free: Option<(u64, u64)> = None;
        let flush_free = |w: &mut Writer<&mut dyn std::io::Write>,
                          pending: &mut Option<(u64, u64)>| {
            match pending.take() {
                Some((a, b)) if a < b => w.free(a * bs, (b - a) * bs),
                _ => Ok(()),
            }
        };
        if base_txg.is_none() {
            // A full send reads the tree in runs of neighbouring blocks, as a volume's long
            // reads do (`Object::read_blocks`: one device request per run on disk), rather
            // than block by block: holes are skipped, no free is sent.
            const RUN: u64 = 64;
            let mut buf = vec![0u8; (RUN * bs) as usize];
            let mut first = resume_block;
            while first < vol_blocks {
                let n = RUN.min(vol_blocks - first);
                let direct: Vec<Option<&mut [u8]>> = (buf[..(n * bs) as usize])
                    .chunks_mut(bs as usize)
                    .map(Some)
                    .collect();
                let got = ds.object.read_blocks(&self.io, first, direct);
                for (i, r) in got.into_iter().enumerate() {
                    let blkid = first + i as u64;
                    let at = i * bs as usize;
                    let data: std::borrow::Cow<[u8]> = match r {
                        Ok(crate::dmu::object::Fetched::Hole) => continue,
                        Ok(crate::dmu::object::Fetched::Direct) => buf[at..at + bs as usize].into(),
                        Ok(crate::dmu::object::Fetched::Data(d)) => {
                            d[..bs as usize].to_vec().into()
                        }
                        Err(e) => {
                            return Err(PoolError::Invalid(format!(
                                "'{}/{name}': block {blkid} does not read: {e}",
                                self.name
                            )))
                        }
                    };
                    w.write(blkid * bs, &data).map_err(io_err)?;
                    data_bytes += bs;
                }
                if !progress(data_bytes) {
                    return Err(invalid("the send was stopped"));
                }
                first += n;
            }
        } else {
            let mut visit = |bp: &crate::spa::BlkPtr, level: u8, first: u64| {
                if failed.is_some() || first >= vol_blocks {
                    return Visit::Skip;
                }
                let span = 1u64 << (IND_SHIFT * level as u32);
                let end = first.saturating_add(span).min(vol_blocks);
                if base_txg.is_some() && first > cursor {
                    // Holes inside a subtree born after the base.
                    match &mut pending_free {
                        Some((_, b)) if *b == cursor => *b = first,
                        _ => {
                            if let Err(e) = flush_free(&mut w, &mut pending_free) {
                                failed = Some(io_err(e));
                                return Visit::Skip;
                            }
                            pending_free = Some((cursor, first));
                        }
                    }
                }
                cursor = cursor.max(first);
                if base_txg.is_some_and(|b| bp.birth_txg.get() <= b) {
                    cursor = end;
                    return Visit::Skip;
                }
                if level > 0 {
                    return Visit::Descend;
                }
                cursor = end;
                let data = match self.io.zio.read(bp) {
                    Ok(d) => d,
                    Err(e) => {
                        failed = Some(PoolError::Invalid(format!(
                            "'{}/{name}': block {first} does not read: {e}",
                            self.name
                        )));
                        return Visit::Skip;
                    }
                };
                if let Err(e) = flush_free(&mut w, &mut pending_free)
                    .and_then(|_| w.write(first * bs, &data[..bs as usize]))
                {
                    failed = Some(io_err(e));
                    return Visit::Skip;
                }
                data_bytes += bs;
                if !progress(data_bytes) {
                    failed = Some(invalid("the send was stopped"));
                }
                Visit::Skip
            };
            walk_from(
                &self.io,
                &dn,
                resume_block,
                &mut visit,
                &mut |_, level, first, e| {
                    if unwalked.is_none() {
                        unwalked = Some(PoolError::Invalid(format!(
                            "'{}/{name}': the blocks under level {level} from block {first} do \
                         not read: {e}",
                            self.name
                        )));
                    }
                },
            );
        }
        if let Some(e) = failed.or(unwalked) {
            return Err(e);
        }
        if base_txg.is_some() && cursor < vol_blocks {
            match &mut pending_free {
                Some((_, b)) if *b == cursor => *b = vol_blocks,
                _ => {
                    flush_free(&mut w, &mut pending_free).map_err(io_err)?;
                    pending_free = Some((cursor, vol_blocks));
                }
            }
        }
        flush_free(&mut w, &mut pending_free).map_err(io_err)?;
        let (_, records, payload) = w.finish().map_err(io_err)?;
        Ok(SendSummary {
            records,
            data_bytes: payload,
            stream_bytes: crate::dsl::stream::HEADER_BYTES as u64
                + (records + 1) * crate::dsl::stream::RECORD_BYTES as u64
                + payload,
        })
    }
}
