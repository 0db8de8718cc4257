//! The pool's side of the intent log: each volume's `Log` opened at import (and its chain
//! checked), the commit calls the volume layer makes, replay's hand-off, and the whole-block
//! writes a commit places in their txg's stead (`InPlace`).

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use crate::spa::{AllocClass, BlkPtr};
use crate::vdev::{Unsettled, VdevError};
use crate::zil::block::{
    is_block_of, names_block, walk_chain, written_whole_before, EndOfChain, LOOKAHEAD,
};
use crate::zil::log::MAX_BLOCK;
use crate::zil::{BlockAddr, Done, Log, Prewrite, Record, ZilHeader};

use super::{Dataset, Pool, PoolError};

/// Whole-block writes of at least this size are written in place when a sync request needs
/// them, and logged by block pointer: the data is written once instead of into the log and
/// again at the txg. The committer writes a batch's blocks as one durable run per device
/// (`Pool::write_ahead`), so no flush of the data devices is needed, which would also wait for
/// the writeback of the txg in flight. (OpenZFS's `zfs_immediate_write_sz` is 32 KiB, and
/// the log then flushes the devices. Here 16K writes into 16K blocks with a flush every 5,
/// `zeta bench load`, three volumes: 53.3k and 54.8k writes/s in place against 48.6k and
/// 44.5k by value, builds taking turns.)
pub const IN_PLACE_MIN_BYTES: usize = 16 << 10;

/// A batch's whole blocks go in place only if they come to at least this much. Their durable
/// write is a request of its own before the log block's, which costs a lone sync write more
/// than carrying its data in the log block does (one 16K write with a flush at a time: 1.5k
/// and 2.0k round trips a second in place against 2.3k and 2.6k by value); a large batch's
/// data carried in the log would be written again by its txg, and its log block's write takes
/// about as long as the blocks' own.
pub const IN_PLACE_BATCH_BYTES: usize = 256 << 10;

/// How the log writes a volume's whole-block writes in place.
pub(super) struct InPlace<'a> {
    pool: &'a Pool,
    ds: &'a Dataset,
}

impl Prewrite for InPlace<'_> {
    fn prewrite(&self, batch: &mut [(u64, Record)]) -> Vec<u32> {
        let bs = self.ds.volblocksize as u64;
        let mut flush = Vec::new();
        // Blocks to write now: the record's place in the batch, its txg and block.
        let mut ahead: Vec<(usize, u64, u64, Arc<Vec<u8>>)> = Vec::new();
        for (i, (_, rec)) in batch.iter_mut().enumerate() {
            let Record::Write { txg, offset, data } = rec else {
                continue;
            };
            let Some(buf) = data.whole_buffer() else {
                continue;
            };
            if buf.len() as u64 != bs || *offset % bs != 0 {
                continue;
            }
            let blkid = *offset / bs;
            // Written ahead only while the block's change is still in the open txg; once its
            // txg syncs, the sync writes it anyway.
            if !self.ds.object.is_open_dirty(blkid, buf) {
                continue;
            }
            let (txg, offset) = (*txg, *offset);
            *rec = match self.ds.object.override_of(blkid, buf) {
                // Already there (a streaming write put it in place as it came, buffered):
                // that copy, flushed with the batch.
                Some(bp) => {
                    flush.extend(bp.dvas().map(|d| d.vdev.get()));
                    Record::Indirect { txg, offset, bp }
                }
                None if buf.len() < IN_PLACE_MIN_BYTES => continue,
                // Zeros become a hole at the sync: a zero record says the same in 32 bytes.
                None if zeta_math::zero::is_zero(buf) => Record::Zero {
                    txg,
                    offset,
                    len: bs,
                },
                None => {
                    ahead.push((i, txg, blkid, buf.clone()));
                    continue;
                }
            };
        }
        if ahead.iter().map(|(.., buf)| buf.len()).sum::<usize>() < IN_PLACE_BATCH_BYTES {
            return flush;
        }
        // One durable write per txg (a batch mostly holds one): the blocks are allocated
        // together, so they make a run, written as one request per device.
        ahead.sort_by_key(|&(_, txg, ..)| txg);
        for group in ahead.chunk_by(|a, b| a.1 == b.1) {
            let txg = group[0].1;
            let blocks: Vec<(u64, &Arc<Vec<u8>>)> = group
                .iter()
                .map(|(_, _, blkid, buf)| (*blkid, buf))
                .collect();
            // A failed write, or a txg that closed meanwhile (its sync writes the blocks),
            // leaves the records by value: the log takes the data instead.
            let Ok(Some(bps)) = self.pool.write_ahead(self.ds, txg, &blocks) else {
                continue;
            };
            let mut devices: Vec<u32> = bps
                .iter()
                .flatten()
                .flat_map(|bp| bp.dvas().map(|d| d.vdev.get()))
                .collect();
            devices.sort_unstable();
            devices.dedup();
            self.pool.zil.note_durable_data(devices.len());
            for (&(i, txg, blkid, _), bp) in group.iter().zip(bps) {
                let offset = blkid * bs;
                batch[i].1 = match bp {
                    Some(bp) => Record::Indirect { txg, offset, bp },
                    None => Record::Zero {
                        txg,
                        offset,
                        len: bs,
                    },
                };
            }
        }
        flush
    }
}

impl Pool {
    /// Queues a record of a change to the volume in its intent log (the pool counts what
    /// queued records keep in memory: `Zil::pinned_bytes`).
    pub fn append_log(&self, ds: &Dataset, rec: Record) {
        ds.log.append(&self.zil, rec);
    }

    /// Whether some volume holds a change that a crash could lose: a record that no sync
    /// request covered at the last look (`seen`, the sync thread's memory of each volume's
    /// oldest such record) and still does not. A record is between its queueing and its
    /// FUA write's commit for some microseconds, so one look alone would often catch one.
    pub(super) fn changes_at_risk(&self, seen: &mut Vec<(usize, u64)>) -> bool {
        let now: Vec<(usize, u64)> = self
            .datasets()
            .iter()
            .filter_map(|ds| Some((Arc::as_ptr(ds) as usize, ds.log.oldest_unrequested()?)))
            .collect();
        let at_risk = now.iter().any(|n| seen.contains(n));
        *seen = now;
        at_risk
    }

    /// Makes every write to the volume so far durable, then calls `done` (maybe on another
    /// thread, maybe before returning).
    pub fn commit_log(&self, ds: &Dataset, done: Done) {
        ds.log.commit(&self.zil, &InPlace { pool: self, ds }, done)
    }

    /// `commit_log` for a thread that must not stay on as the log's committer: true if it
    /// left requests waiting, and someone must call `commit_log` soon (`Log::commit_bounded`).
    pub fn commit_log_bounded(&self, ds: &Dataset, done: Done) -> bool {
        ds.log
            .commit_bounded(&self.zil, &InPlace { pool: self, ds }, done)
    }

    /// `commit_log` only if the volume's log has a committer at work or nothing to commit
    /// (`Log::join`); else gives `done` back.
    pub fn join_log_commit(&self, ds: &Dataset, done: Done) -> Option<Done> {
        ds.log.join(done)
    }

    /// The blocking form of [`commit_log`](Self::commit_log).
    pub fn commit_log_wait(&self, ds: &Dataset) -> Result<(), crate::zil::LogError> {
        ds.log.commit_wait(&self.zil, &InPlace { pool: self, ds })
    }

    /// The volume's log records left from before the last crash, if it has not been
    /// replayed yet. The caller applies them (in order) and then calls `finish_replay`.
    pub fn pending_replay(&self, ds: &Dataset) -> Option<Vec<Record>> {
        ds.log.pending_replay()
    }

    /// Commits a txg that writes every volume's log header, so that each log takes commits
    /// from its first sync request. A log's chain starts at import, but only a txg that
    /// writes the directory puts its header on disk, and until then a FLUSH or FUA write
    /// commits a txg instead (`fallback_syncs`). A server calls this before it serves;
    /// commands that only look at a pool do not, and write nothing.
    pub fn ready_logs(&self) -> Result<(), PoolError> {
        if self.opts.readonly {
            return Ok(());
        }
        self.mos.lock().dir_dirty = true;
        self.sync_now()
    }

    /// After the replayed records are applied: starts a new chain and commits both in one
    /// txg. A crash before that commit replays the old chain again, to the same result.
    ///
    /// The replay's last writes are in the open txg. A sync of an older one, closed before
    /// this and writing its directory after, keeps the old chain's header and the replay's
    /// `replay_after` (`Log::start_chain`): only a txg holding the whole replay may end it.
    pub fn finish_replay(&self, ds: &Dataset) -> Result<(), PoolError> {
        ds.log.start_chain(&self.zil, self.open_txg());
        self.mos.lock().dir_dirty = true;
        self.sync_now()?;
        // The replay's copies are committed: the blocks its records pointed at can go.
        let claims = std::mem::take(&mut *ds.replay_claims.lock());
        let txg = self.open_txg();
        for bp in claims {
            self.io.zio.free(&bp, txg, AllocClass::Mos);
        }
        Ok(())
    }

    /// Loads a volume's log at import: walks its chain from the header, claims the blocks in
    /// log space, and keeps the records newer than txg `after` for replay. The blocks that
    /// records of writes made in place point at are verified now and claimed (returned)
    /// until the replay is committed.
    pub(super) fn open_log(
        &self,
        vol: &str,
        header: ZilHeader,
        after: u64,
        discard: bool,
    ) -> Result<(Log, Vec<BlkPtr>), PoolError> {
        if header.chain == 0 {
            return Ok((Log::off(), Vec::new()));
        }
        // Blocks whose read found copies or columns wrong, left as they were for now.
        let unsettled: RefCell<Vec<UnsettledBlock>> = RefCell::default();
        let mut read = |a: BlockAddr, seq: u64| -> Result<Vec<u8>, String> {
            // An address no log block can have (a damaged chain): no block there.
            let Some(top) = self.zil.top(a.vdev) else {
                return Ok(Vec::new());
            };
            let out = top.children.iter().filter(|c| c.is_offline()).count();
            if out > top.redundancy() {
                return Err(format!(
                    "vdev {} has {out} of {} devices missing or offline",
                    a.vdev,
                    top.children.len()
                ));
            }
            if a.len > MAX_BLOCK
                || !lies_within(a.offset, top.asize_of(a.len as u64), top.asize_bytes)
            {
                return Ok(Vec::new());
            }
            let mut buf = vec![0u8; a.len as usize];
            // A block that does not read back whole, as the block the chain expects there,
            // is where the chain ends (never written, torn or damaged); a copy holding
            // another block is passed over for one that holds this one (`is_block_of`).
            // Copies that fail are looked at on the way: the first whose header names the
            // block was written there and is torn or damaged (`EndOfChain::Damaged`, which
            // the import reports), whichever copy the read tries last. The read is
            // speculative: a chain is expected to end in garbage, and a crash may have torn
            // its last blocks, some copies or columns written and others not, so a copy that
            // does not hold the block is counted and rewritten only once the walk shows the
            // block was written whole (below).
            let (read_one, named) = (Cell::new(false), RefCell::new(None));
            let this = |b: &[u8]| {
                read_one.set(true);
                if is_block_of(b, header.chain, seq) {
                    return true;
                }
                if named.borrow().is_none() && names_block(b, header.chain, seq) {
                    *named.borrow_mut() = Some(b.to_vec());
                }
                false
            };
            match top.read_speculative(a.offset, &mut buf, &this) {
                Ok(wrong) => {
                    if !wrong.is_empty() {
                        let good = buf.clone();
                        unsettled.borrow_mut().push(UnsettledBlock {
                            seq,
                            a,
                            wrong,
                            good,
                        });
                    }
                    Ok(buf)
                }
                // If no copy could be read at all (a raidz: more columns than its parity),
                // whether the chain goes on is unknown, as with a missing device: not an end.
                Err(e @ VdevError::ColumnsUnreadable { .. }) => {
                    Err(format!("log block {seq} on vdev {}: {e}", a.vdev))
                }
                Err(e) if !read_one.get() && top.raidz().is_none() => Err(format!(
                    "no copy of log block {seq} on vdev {} could be read ({e})",
                    a.vdev
                )),
                Err(_) => Ok(named.take().unwrap_or(buf)),
            }
        };
        let (blocks, end) = walk_chain(header.chain, header.head, header.head_seq, &mut read);
        // Blocks of the chain written after each one, whole or not: those it holds after
        // it, and a damaged block that ends it with the blocks that go on from there.
        let beyond = match end {
            EndOfChain::Damaged { later, .. } => 1 + later,
            _ => 0,
        };
        for UnsettledBlock {
            seq,
            a,
            wrong,
            good,
        } in unsettled.into_inner()
        {
            // Past the chain's end (`count_later`'s blocks): never replayed, left alone.
            let Some(i) = blocks.iter().position(|b| b.seq == seq) else {
                continue;
            };
            let after = (blocks.len() - 1 - i) as u64 + beyond;
            if let (true, Some(top)) = (written_whole_before(after), self.zil.top(a.vdev)) {
                // Written whole, so a copy without it is its device's fault, as in any read.
                // Only the part of its slot the block took is rewritten: the rest was freed
                // when it was written and may hold a block of another chain now.
                let part = self.zil.written_part(a, blocks[i].body_len());
                top.settle(a.offset, &good[..part.len as usize], &wrong);
            }
        }
        let mut addrs = Vec::new();
        let mut at = header.head;
        let mut records = Vec::new();
        for b in &blocks {
            // Only the part of its slot the block took: the rest was freed when it was
            // written and may hold a block of another chain now.
            let part = self.zil.written_part(at, b.body_len());
            if let Err(why) = self.zil.claim_slot(part) {
                return Err(PoolError::CannotImport {
                    pool: self.name.clone(),
                    why: format!("volume {vol}: intent log: {why}"),
                });
            }
            addrs.push(part);
            at = b.next;
            records.extend(b.records.iter().filter(|r| r.txg() > after).cloned());
        }
        if let EndOfChain::Unreadable(why) = &end {
            if !discard {
                return Err(PoolError::CannotImport {
                    pool: self.name.clone(),
                    why: format!(
                        "volume {vol}: its intent log cannot be read ({why}); it may hold \
                         acknowledged writes. Bring the device back, or import with \
                         --discard-log to lose them"
                    ),
                });
            }
            self.import_notes.lock().push(format!(
                "{}/{vol}: intent log unreadable after {} blocks ({why}): writes acknowledged \
                 after txg {after} and not in those blocks are lost",
                self.name,
                blocks.len()
            ));
        }
        if let EndOfChain::Damaged { seq, at, later } = end {
            let whole = end.written_whole();
            let note = damaged_log_note((&self.name, vol), seq, at, (later, whole), after);
            self.import_notes.lock().push(note);
        }
        let (records, claims) = self.claim_in_place_records(records);
        Ok((Log::imported(header, addrs, records, after), claims))
    }

    /// Verifies the block each record of a write made in place points at, and claims it so
    /// that nothing is allocated over it before the replay has copied what it needs. A block
    /// that does not verify was written by a batch whose flush never completed, so nothing
    /// from that record on was acknowledged: the log ends there, as at a torn log block.
    /// The data is read again at the replay, one block at a time: a log may point at far
    /// more than fits in memory.
    fn claim_in_place_records(&self, mut records: Vec<Record>) -> (Vec<Record>, Vec<BlkPtr>) {
        let mut claims = Vec::new();
        let mut end = records.len();
        for (i, r) in records.iter().enumerate() {
            let Record::Indirect { bp, .. } = r else {
                continue;
            };
            // Speculative: a crash may have cut the block's write short, and a copy without
            // it is then no device's fault.
            if self.io.zio.read_speculative(bp).is_err() || self.io.zio.claim(bp).is_err() {
                end = i;
                break;
            }
            claims.push(*bp);
        }
        records.truncate(end);
        (records, claims)
    }

    /// The data of a block an intent-log record of a write made in place points at (one the
    /// import claimed), for its replay. Speculative, as the claim's read was: a copy the
    /// crash left without the block, passed over then, is passed over again, not counted.
    pub fn read_in_place(&self, bp: &BlkPtr) -> Result<Vec<u8>, PoolError> {
        Ok(self.io.zio.read_speculative(bp)?)
    }
}

/// A log block whose speculative read at import found copies or columns that did not hold
/// it (`TopVdev::read_speculative`): its sequence number and address, what was wrong, and the
/// block.
struct UnsettledBlock {
    seq: u64,
    a: BlockAddr,
    wrong: Unsettled,
    good: Vec<u8>,
}

/// What the import says of a volume's log that ends at block `seq` of its own chain, at `at`,
/// whose checksum fails (`EndOfChain::Damaged`, with `later` blocks after it): the chain is
/// replayed up to it either way, but a block torn by a power cut held nothing acknowledged,
/// and a block damaged since (`whole`) may have. A pool with redundancy reads another copy
/// and never gets here; without it, those writes are gone and the user should know, where
/// a plain end of the chain is silent.
fn damaged_log_note(
    (pool, vol): (&str, &str),
    seq: u64,
    at: BlockAddr,
    (later, whole): (u64, bool),
    after: u64,
) -> String {
    let lost = format!(
        "writes acknowledged after txg {after} that it or the blocks after it held are lost"
    );
    let fate = if whole {
        let more = if later >= LOOKAHEAD { " or more" } else { "" };
        format!(
            "{later}{more} later blocks of the log follow it, more than are written at once, \
             so it was written whole and damaged since: {lost}"
        )
    } else {
        format!(
            "if the machine lost power while it was being written, nothing in it was \
             acknowledged; if it was damaged since, {lost}"
        )
    };
    format!(
        "{pool}/{vol}: intent log block {seq} (vdev {}, offset {}) fails its checksum, so the \
         log was replayed only up to it; {fate}",
        at.vdev, at.offset
    )
}

/// Whether `asize` bytes from `offset` lie within a vdev's `vdev_bytes`. A log block's address
/// comes from disk (a header, or the `next` of a block that may be damaged), so the end may
/// not even be a number: such a block is not there.
fn lies_within(offset: u64, asize: u64, vdev_bytes: u64) -> bool {
    offset
        .checked_add(asize)
        .is_some_and(|end| end <= vdev_bytes)
}

#[cfg(test)]
mod tests {
    use super::lies_within;

    #[test]
    fn a_log_block_address_past_the_end_of_the_numbers_lies_nowhere() {
        assert!(lies_within(0, 4096, 4096));
        assert!(!lies_within(1, 4096, 4096));
        assert!(!lies_within(u64::MAX - 100, 4096, 1 << 30));
        assert!(!lies_within(u64::MAX, 1, u64::MAX));
    }
}
