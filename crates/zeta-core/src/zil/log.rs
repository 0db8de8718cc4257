//! One volume's log: the queue of records, the chain of log blocks on disk, and the
//! committer that turns one into the other.
//!
//! Records get ids in the order they are queued. "Durable up to id k" means every record with
//! a smaller id is either in a flushed log block or in a committed txg; a sync request
//! queued when the next id was `t` is answered once the log is durable up to `t`.
//!
//! There is no committer thread: the first sync request that finds none at work becomes the
//! committer and goes on until no request is left waiting; the others only leave a callback
//! (so an NBD worker never parks on a flush). A lone request therefore commits at once, with
//! no timer on its path, and under load each batch takes everything that queued up while
//! the previous one was on its way to the disk (group commit).
//!
//! The chain: each block names the next one's address, chosen (and its space taken) before
//! the block naming it is written, with a size predicted from recent batches. The volume's
//! directory entry holds the chain's *header*: its id and its first live block. Each txg sync
//! moves the header past the blocks whose records that txg covers; once the txg commits they
//! are freed. A new chain (fresh id) starts when a volume is created and after each replay,
//! so blocks of an old chain can never be mistaken for a continuation.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};

use super::block::{records_that_fit, BlockAddr, LogBlock, Record, HEADER_BYTES};
use super::wake::{wake_all, Done};
use super::{CommitPolicy, LogError, LogIoError, Zil};

/// The largest log block. Records are at most a volume block (128 KiB) plus their header, so
/// every record fits in one. Each block is a durable write of its own, written one after
/// another (`Zil::write_blocks`), so a large batch wants few of them; in much larger blocks,
/// one block's write took long enough to hold up the next batch (figures:
/// docs/perf/intent-log.md, "Why log blocks are at most 1M").
pub const MAX_BLOCK: u32 = 1 << 20;
const MIN_BLOCK: u32 = 4096;

/// A batch carrying at least this much data, or a quarter of the log space if that is less
/// (`Zil::bulk_sync_bytes`), is committed by a txg sync instead of the log. Logged, its data
/// would be written twice (to the log now, in place at the txg) and the log's copy freed a
/// txg later; a txg sync writes it once, to its place, and the sync is due soon anyway with
/// this much dirty. It arises when a flush follows a burst of buffered writes (a bulk copy).
///
/// A steady stream of sync writes makes large batches too, when a commit takes a while:
/// every write queues its record, not only those a flush waits for. There a txg sync is the
/// worse choice, as it rewrites whole blocks where the records are parts of them, and the
/// next batch, queued while it ran, is larger still. At 64M the log takes the batches of such
/// a stream (figures: docs/perf/intent-log.md, "Why the bulk-sync threshold is 64M").
pub const BULK_SYNC_BYTES: usize = 64 << 20;

/// What the committer may do with a batch's records before logging them: write whole-block
/// writes' blocks in place and log their block pointers instead of their data (the pool knows
/// how).
pub trait Prewrite {
    /// Replaces records of `batch` by the records to log instead (records left alone are
    /// logged as they are). Returns the vdevs that blocks the new records point at went to
    /// and that must be flushed with the batch; none for blocks written durable on their own.
    fn prewrite(&self, batch: &mut [(u64, Record)]) -> Vec<u32>;
}

/// Logs every record by value.
pub struct ByValue;

impl Prewrite for ByValue {
    fn prewrite(&self, _: &mut [(u64, Record)]) -> Vec<u32> {
        Vec::new()
    }
}

/// Where a volume's log starts on disk; kept in its directory entry. `chain == 0`: no log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZilHeader {
    pub chain: u64,
    pub head: BlockAddr,
    pub head_seq: u64,
}

impl ZilHeader {
    pub const BYTES: usize = 32;

    pub fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&self.chain.to_le_bytes());
        b[8..12].copy_from_slice(&self.head.vdev.to_le_bytes());
        b[12..16].copy_from_slice(&self.head.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.head.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.head_seq.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> ZilHeader {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        ZilHeader {
            chain: u64_at(0),
            head: BlockAddr {
                vdev: u32_at(8),
                len: u32_at(12),
                offset: u64_at(16),
            },
            head_seq: u64_at(24),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct ChainBlock {
    addr: BlockAddr,
    seq: u64,
    max_txg: u64,
    /// Being written: not yet durable, and never freed while so.
    inflight: bool,
}

enum Mode {
    /// Sync requests commit a txg (no log space, or none could be taken).
    Off,
    /// Found at import with records newer than txg `after`; nothing is written to this log
    /// until they have been replayed and a new chain started.
    NeedsReplay {
        records: Vec<Record>,
        after: u64,
    },
    Active,
}

struct State {
    mode: Mode,
    /// Records not yet taken by a batch, by id.
    queue: VecDeque<(u64, Record)>,
    next_id: u64,
    /// First id of the batch being written.
    inflight_first: Option<u64>,
    committing: bool,
    /// Sync requests: (target id, callback), targets in increasing order.
    waiters: VecDeque<(u64, Done)>,
    /// Every record with an id below this is durable or covered by a sync request made
    /// (the newest request's target): only later ones could be lost in a crash.
    requested: u64,
    chain: u64,
    next_slot: BlockAddr,
    next_seq: u64,
    blocks: VecDeque<ChainBlock>,
    /// The header the last sync wrote into the directory entry.
    header: ZilHeader,
    /// The chain whose header a committed txg holds: only its blocks are found by replay.
    durable_chain: u64,
    /// Per syncing txg: the header it writes and the blocks it lets go.
    syncing: Vec<(u64, ZilHeader, Vec<BlockAddr>)>,
    /// Blocks of the previous chain, freed once a header of the current one commits.
    retired: Vec<BlockAddr>,
    /// A new chain began while the old one held records no committed txg covers: until a txg
    /// that covers them syncs, the old chain's header stays in the directory (`Switch`).
    switch: Option<Switch>,
    rotor: usize,
    /// The bytes of recent batches, as a maximum that decays by an eighth per batch: what
    /// the slot for the next one is sized from (`plan`).
    recent: usize,
    /// A commit failed and its fallback txg sync too: the pool is suspended.
    failed: Option<String>,
    /// The pool waits for room (`Log::refuse`): requests are answered `OutOfRoom` at once.
    refusing: Option<String>,
    /// No log space was left for a new chain (after a failed write, or at import): each
    /// batch tries again to start one (`begin_chain`).
    abandoned: bool,
}

/// The move from one chain to the next, pending until txg `until` syncs.
///
/// Every txg sync writes the header the log gives it. A txg closed before a new chain began
/// may reach its directory write after, and a header naming the new chain would then be
/// committed by a txg that does not hold the old chain's records: a write acknowledged from
/// the old chain (a txg later than the one syncing) or a replay's writes still in the open
/// txg. A crash before the next commit would find an empty chain and lose them. So the old
/// header, with the replay's `replay_after`, is what every txg before `until` writes, and
/// the old chain's blocks are kept until a txg writing the new header commits.
struct Switch {
    /// The first txg whose commit covers every record of the old chain.
    until: u64,
    /// What the directory entry said while the old chain was being replayed (else 0).
    replay_after: u64,
}

impl State {
    /// Every record with an id below this is durable.
    fn frontier(&self) -> u64 {
        let mut f = self.next_id;
        if let Some((id, _)) = self.queue.front() {
            f = f.min(*id);
        }
        if let Some(id) = self.inflight_first {
            f = f.min(id);
        }
        f
    }

    /// Queues a sync request for every record queued so far; returns its target.
    fn add_waiter(&mut self, done: Done) -> u64 {
        let target = self.next_id;
        self.requested = self.requested.max(target);
        self.waiters.push_back((target, done));
        target
    }

    fn take_satisfied(&mut self) -> Vec<Done> {
        let f = self.frontier();
        let mut out = Vec::new();
        while self.waiters.front().is_some_and(|(t, _)| *t <= f) {
            out.push(self.waiters.pop_front().unwrap().1);
        }
        out
    }
}

pub struct Log {
    state: Mutex<State>,
    /// Records queued and sync requests made, since the pool was opened.
    appended: AtomicU64,
    requests: AtomicU64,
}

/// A batch laid out as blocks: (address, block), and the slots taken for it.
struct Plan {
    /// Each block at the part of its slot it takes (`Zil::written_part`).
    blocks: Vec<(BlockAddr, LogBlock)>,
    /// Each block's whole slot, whose tail is freed once the block is written; the first is
    /// the slot the chain's last block named.
    slots: Vec<BlockAddr>,
    /// Slots allocated by this plan (every block after the first, and the new next slot).
    taken: Vec<BlockAddr>,
}

fn random_chain() -> u64 {
    loop {
        let c: u64 = rand::random();
        if c != 0 {
            return c;
        }
    }
}

impl Log {
    fn with_mode(mode: Mode, header: ZilHeader) -> Log {
        Log {
            state: Mutex::new(State {
                mode,
                queue: VecDeque::new(),
                next_id: 1,
                inflight_first: None,
                committing: false,
                waiters: VecDeque::new(),
                requested: 0,
                chain: header.chain,
                next_slot: BlockAddr::default(),
                next_seq: 1,
                blocks: VecDeque::new(),
                header,
                durable_chain: header.chain,
                syncing: Vec::new(),
                retired: Vec::new(),
                switch: None,
                rotor: 0,
                recent: 0,
                failed: None,
                refusing: None,
                abandoned: false,
            }),
            appended: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        }
    }

    /// A log that writes nothing: every sync request commits a txg.
    pub fn off() -> Log {
        Log::with_mode(Mode::Off, ZilHeader::default())
    }

    /// A new, empty chain (a volume just created, or one whose old chain held nothing to
    /// replay). Its header must reach disk in a txg before the log is used; until then sync
    /// requests commit a txg, which writes it.
    pub fn new_chain(zil: &Zil) -> Log {
        let log = Log::with_mode(Mode::Off, ZilHeader::default());
        log.start_chain(zil, 0);
        log
    }

    /// The log found at import: the blocks of its chain (already claimed in log space) and
    /// the records in them newer than txg `after`, the last whose changes the volume's tree
    /// holds. With nothing to replay, the old blocks are retired and the log stays off until
    /// `start_chain`, which import calls once every volume's chain is claimed: a slot taken
    /// for a new chain before then could be a block of a chain still to be found.
    pub fn imported(
        header: ZilHeader,
        blocks: Vec<BlockAddr>,
        records: Vec<Record>,
        after: u64,
    ) -> Log {
        let mode = if records.is_empty() {
            Mode::Off
        } else {
            Mode::NeedsReplay { records, after }
        };
        let log = Log::with_mode(mode, header);
        log.state.lock().retired = blocks;
        log
    }

    /// The id of the oldest record that no sync request covers and that is not durable
    /// (a write since the last FLUSH, not FUA): what a crash now could lose. `None` if
    /// every record queued is durable or on its way to be for a request.
    pub fn oldest_unrequested(&self) -> Option<u64> {
        let st = self.state.lock();
        let from = st.frontier().max(st.requested);
        (st.next_id > from).then_some(from)
    }

    /// Whether the log writes nothing (sync requests commit a txg).
    pub fn is_off(&self) -> bool {
        matches!(self.state.lock().mode, Mode::Off)
    }

    /// The records left to replay, if the log still waits for its replay.
    pub fn pending_replay(&self) -> Option<Vec<Record>> {
        match &self.state.lock().mode {
            Mode::NeedsReplay { records, .. } => Some(records.clone()),
            _ => None,
        }
    }

    /// While the log waits for its replay: the txg its records are counted from, which every
    /// txg committed meanwhile must keep on disk (`DirEntryPhys::replay_after`). A txg that
    /// commits part of the replay, or none of it, holds a newer txg number than the
    /// records', yet only the whole replay covers them: a crash before it ends must find
    /// them all again. 0 once replayed.
    pub fn replay_after(&self) -> u64 {
        let st = self.state.lock();
        if let Some(sw) = &st.switch {
            return sw.replay_after;
        }
        match &st.mode {
            Mode::NeedsReplay { after, .. } => *after,
            _ => 0,
        }
    }

    /// Starts a fresh chain (after a replay, or for a new log). The old chain's header stays
    /// in the directory until txg `covered_by` syncs (the open txg, after a replay: it holds
    /// the replay's last writes; 0 if no txg need wait), and its blocks are freed once a txg
    /// has committed the new header.
    pub fn start_chain(&self, zil: &Zil, covered_by: u64) {
        begin_chain(zil, &mut self.state.lock(), covered_by);
    }

    /// Queues a record (called with the volume's range lock held, so records of overlapping
    /// writes are queued in the order the writes were applied). Returns its id.
    pub fn append(&self, zil: &Zil, rec: Record) -> u64 {
        self.appended.fetch_add(1, Ordering::Relaxed);
        zil.pin(&rec);
        let mut st = self.state.lock();
        let id = st.next_id;
        st.next_id += 1;
        // Queued in every mode: a log that cannot write yet (waiting for its replay, or
        // its header not yet on disk) still answers sync requests, by committing a txg.
        st.queue.push_back((id, rec));
        id
    }

    /// Makes every record queued so far durable, then calls `done`. The calling thread may
    /// become the committer and write batches for other requests too before it returns.
    pub fn commit(&self, zil: &Zil, pre: &dyn Prewrite, done: Done) {
        let left_waiting = self.submit(zil, pre, done, false);
        debug_assert!(!left_waiting);
    }

    /// `commit` for a thread that must not stay on as the committer for other requests (an
    /// NBD connection's reader, running a lone request itself): it drives batches only until
    /// its own records are durable. Returns true if it stopped with requests still waiting
    /// and no committer: the caller must then call `commit` (which may stay) soon, from a
    /// thread that can, or those requests are never answered.
    pub fn commit_bounded(&self, zil: &Zil, pre: &dyn Prewrite, done: Done) -> bool {
        self.submit(zil, pre, done, true)
    }

    /// Queues `done` behind every record queued so far if a committer is at work (it will
    /// answer it), or answers it now if those records are durable already or the log has
    /// failed. Gives `done` back if no committer is at work: the caller then calls `commit`
    /// from a thread that may stay to commit. For a thread that must not wait for a batch
    /// (an NBD connection's reader): under a steady stream of FLUSHes a committer is nearly
    /// always at work, and joining its queue here spares each FLUSH the wake-up of a worker
    /// that would only have queued it.
    pub fn join(&self, done: Done) -> Option<Done> {
        let (mut st, done) = self.unless_answered(done)?;
        if !st.committing {
            return Some(done);
        }
        st.add_waiter(done);
        self.requests.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// A sync request's start: answers `done` now, and counts it, if the log has failed or
    /// every record queued so far is durable already (`None`); else hands `done` back with
    /// the state locked.
    fn unless_answered(&self, done: Done) -> Option<(MutexGuard<'_, State>, Done)> {
        let st = self.state.lock();
        let answer = if let Some(why) = &st.failed {
            Err(LogError::Failed(why.clone()))
        } else if st.frontier() >= st.next_id {
            Ok(())
        } else if let Some(why) = &st.refusing {
            Err(LogError::OutOfRoom(why.clone()))
        } else {
            return Some((st, done));
        };
        drop(st);
        self.requests.fetch_add(1, Ordering::Relaxed);
        done(answer);
        None
    }

    /// While the pool waits for room (`Pool::wait_for_room`): takes every sync request waiting
    /// now, for the caller to answer `OutOfRoom`, and answers every new one so at once, unless
    /// all it covers is durable already. A client told so at once (ENOSPC) can act: qemu
    /// pauses its guest and sends the requests again when resumed, where a request left
    /// waiting kept qemu's pause (which drains and flushes) from completing until room was
    /// made. Nothing is dropped: the records stay queued or in the committer's hands, and a
    /// request answered Ok later covers them. A failed request promises nothing, so telling
    /// it early is safe.
    pub fn refuse(&self, why: &str) -> Vec<Done> {
        let mut st = self.state.lock();
        st.refusing = Some(why.to_string());
        st.waiters.drain(..).map(|(_, d)| d).collect()
    }

    /// Room was made: sync requests wait for their records again.
    pub fn accept_again(&self) {
        self.state.lock().refusing = None;
    }

    /// Queues `done` behind every record queued so far and, if no committer is at work,
    /// becomes it (`bounded`: only until those records are durable). Returns whether it left
    /// requests waiting with no committer.
    fn submit(&self, zil: &Zil, pre: &dyn Prewrite, done: Done, bounded: bool) -> bool {
        let Some((mut st, done)) = self.unless_answered(done) else {
            return false;
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        let target = st.add_waiter(done);
        if st.committing {
            return false;
        }
        st.committing = true;
        self.drive(zil, pre, st, bounded.then_some(target))
    }

    /// The blocking form of [`commit`](Self::commit).
    pub fn commit_wait(&self, zil: &Zil, pre: &dyn Prewrite) -> Result<(), LogError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.commit(
            zil,
            pre,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv()
            .unwrap_or_else(|_| Err(LogError::Failed("the log committer went away".into())))
    }

    /// The committer's loop: batches until no request waits, or (`until`) until the records
    /// below that id are durable; then returns true if requests still wait (see
    /// `commit_bounded`).
    fn drive<'a>(
        &'a self,
        zil: &Zil,
        pre: &dyn Prewrite,
        mut st: MutexGuard<'a, State>,
        until: Option<u64>,
    ) -> bool {
        loop {
            let ready = st.take_satisfied();
            if !ready.is_empty() {
                drop(st);
                wake_all(ready, || Ok(()));
                st = self.state.lock();
                continue;
            }
            if st.waiters.is_empty() {
                st.committing = false;
                return false;
            }
            if until.is_some_and(|t| st.frontier() >= t) {
                st.committing = false;
                return true;
            }
            let upto = match zil.commit {
                CommitPolicy::Group => st.next_id,
                CommitPolicy::PerRequest => st.waiters.front().expect("a waiter").0,
            };
            let n = st.queue.iter().take_while(|(id, _)| *id < upto).count();
            if n == 0 {
                // Cannot happen: a waiter not yet satisfied has a queued record below its
                // target. Answer it rather than spin.
                debug_assert!(false, "log waiter without records");
                let stuck: Vec<Done> = st.waiters.drain(..).map(|(_, d)| d).collect();
                st.committing = false;
                drop(st);
                wake_all(stuck, || Ok(()));
                return false;
            }
            if st.abandoned {
                begin_chain(zil, &mut st, 0);
            }
            let mut batch: Vec<(u64, Record)> = st.queue.drain(..n).collect();
            zil.unpin(batch.iter().map(|(_, r)| r));
            st.inflight_first = Some(batch[0].0);
            let committing = zil.committing();
            let bulk =
                batch.iter().map(|(_, r)| r.encoded_len()).sum::<usize>() >= zil.bulk_sync_bytes();
            let usable = matches!(st.mode, Mode::Active) && st.durable_chain == st.chain && !bulk;
            let started = Instant::now();
            // Whole-block writes go to their place first (outside the lock: it is a device
            // write); their records then carry a block pointer only.
            let mut data_vdevs = Vec::new();
            if usable {
                drop(st);
                for (_, rec) in batch.iter() {
                    if let Record::Indirect { bp, .. } = rec {
                        // Put in place before it was queued, by a streaming write, as
                        // buffered writes: its devices are flushed with the batch.
                        data_vdevs.extend(bp.dvas().map(|d| d.vdev.get()));
                    }
                }
                data_vdevs.extend(pre.prewrite(&mut batch));
                for (_, rec) in batch.iter() {
                    if matches!(rec, Record::Indirect { .. }) {
                        zil.note_in_place();
                    }
                }
                st = self.state.lock();
            }
            let mut plan = if usable {
                self.plan(zil, &mut st, &batch)
            } else {
                None
            };
            drop(st);
            // Log space ran out. Blocks are freed as the txgs covering them commit: wait for
            // the next commit and drop the records it covered, then try again. The second
            // commit from now is of the txg every record of the batch was queued in, so a
            // batch rarely waits longer than that; a sync of its own (the fallback below)
            // could be the second commit to wait for at every turn.
            let mut waits = 0;
            while usable && plan.is_none() && waits < 2 {
                waits += 1;
                let Ok(synced) = zil.wait_for_space() else {
                    break;
                };
                batch.retain(|(_, r)| r.txg() > synced);
                if batch.is_empty() {
                    break;
                }
                st = self.state.lock();
                if matches!(st.mode, Mode::Active) && st.durable_chain == st.chain {
                    plan = self.plan(zil, &mut st, &batch);
                }
                drop(st);
            }

            // Empty only if committed txgs covered every record.
            let written = if batch.is_empty() {
                Ok(())
            } else {
                write_plan(zil, plan.as_ref(), batch.len() as u64, &data_vdevs)
            };
            drop(committing);
            let wrote = written.is_ok();
            if !wrote {
                // Before the fallback sync, so that the txg it commits carries the new chain.
                settle(zil, &mut self.state.lock(), plan.take().as_ref(), false);
            }
            let result = if wrote {
                Ok(())
            } else if bulk {
                zil.bulk_sync()
            } else {
                zil.sync_now()
            };
            zil.note_batch(started.elapsed().as_nanos() as u64);

            st = self.state.lock();
            st.inflight_first = None;
            settle(zil, &mut st, plan.as_ref(), true);
            match result {
                Ok(()) => {}
                Err(LogError::OutOfRoom(why)) => {
                    // The pool waits for room, and its txg will commit these records once
                    // room is made; until then no request can be promised them. They go
                    // back to the head of the queue, so that whatever answers a later
                    // request Ok (this log or a txg) covers them, and this thread is free:
                    // it may be a connection's reader, whose next requests would otherwise
                    // wait unread.
                    for (id, rec) in batch.into_iter().rev() {
                        zil.pin(&rec);
                        st.queue.push_front((id, rec));
                    }
                    // (`refusing` is the pool's to set and clear, in order on its sync
                    // thread: set here it could outlast the wait.)
                    let all: Vec<Done> = st.waiters.drain(..).map(|(_, d)| d).collect();
                    st.committing = false;
                    drop(st);
                    wake_all(all, || Err(LogError::OutOfRoom(why.clone())));
                    return false;
                }
                Err(LogError::Failed(why)) => {
                    // Neither the log nor a txg took the records: nothing queued so far can
                    // be promised durable, now or later.
                    st.failed = Some(why.clone());
                    let all: Vec<Done> = st.waiters.drain(..).map(|(_, d)| d).collect();
                    st.committing = false;
                    drop(st);
                    wake_all(all, || Err(LogError::Failed(why.clone())));
                    return false;
                }
            }
        }
    }

    /// Moves the chain off vdev `v` (a log device being removed): if the slot taken for the
    /// next block is there, an empty block is written into it, naming a slot elsewhere. The
    /// chain stays whole, so a crash at any point still replays everything. Once a txg has
    /// moved the header past that block and committed, nothing of this log is left on `v`.
    /// Does nothing while a batch is being written or the chain's header is not yet on disk
    /// (the caller syncs a txg and tries again).
    pub fn move_off(&self, zil: &Zil, v: u32) -> Result<(), LogError> {
        let mut st = self.state.lock();
        if !matches!(st.mode, Mode::Active)
            || st.next_slot.vdev != v
            || st.committing
            || st.durable_chain != st.chain
        {
            return Ok(());
        }
        st.committing = true;
        let plan = self.plan(zil, &mut st, &[]);
        drop(st);
        let written = write_plan(zil, plan.as_ref(), 0, &[]);
        let mut st = self.state.lock();
        settle(zil, &mut st, plan.as_ref(), written.is_ok());
        // Requests that queued meanwhile found a committer at work: serve them.
        self.drive(zil, &ByValue, st, None);
        written.map_err(|e| LogError::Failed(e.to_string()))
    }

    /// What of this log lies on vdev `v`, in words (empty if nothing): why a removal waits.
    pub fn holdings_on(&self, v: u32) -> String {
        let st = self.state.lock();
        let mut out = Vec::new();
        if matches!(st.mode, Mode::Active) && st.next_slot.vdev == v && !st.next_slot.is_none() {
            out.push(format!(
                "the next block's slot (chain {}durable, {}committing)",
                if st.durable_chain == st.chain {
                    ""
                } else {
                    "not yet "
                },
                if st.committing { "" } else { "not " }
            ));
        }
        let on = |a: &BlockAddr| a.vdev == v && !a.is_none();
        let live: Vec<String> = st
            .blocks
            .iter()
            .filter(|b| on(&b.addr))
            .map(|b| {
                let state = if b.inflight { ", being written" } else { "" };
                format!("seq {} (up to txg {}){state}", b.seq, b.max_txg)
            })
            .collect();
        if !live.is_empty() {
            out.push(format!(
                "blocks [{}] of {}",
                live.join(", "),
                st.blocks.len()
            ));
        }
        let syncing: usize = st
            .syncing
            .iter()
            .map(|(_, _, g)| g.iter().filter(|a| on(a)).count())
            .sum();
        if syncing > 0 {
            out.push(format!("{syncing} blocks freed by a syncing txg"));
        }
        let retired = st.retired.iter().filter(|a| on(a)).count();
        if retired > 0 {
            out.push(format!("{retired} blocks of an old chain"));
        }
        out.join("; ")
    }

    /// Lays a batch out as blocks: the first in the slot named by the chain's last block, the
    /// rest in slots taken now, the last naming a new slot for the next batch. Registers the
    /// blocks as in flight. `None` if log space ran out (nothing is kept).
    fn plan(&self, zil: &Zil, st: &mut State, batch: &[(u64, Record)]) -> Option<Plan> {
        let records: Vec<Record> = batch.iter().map(|(_, r)| r.clone()).collect();
        let total: usize = HEADER_BYTES + records.iter().map(|r| r.encoded_len()).sum::<usize>();
        st.recent = total.max(st.recent - st.recent / 8);
        let expect = st.recent;
        let mut taken = Vec::new();
        let mut blocks = Vec::new();
        let mut slots = Vec::new();
        let (mut slot, mut seq, mut at) = (st.next_slot, st.next_seq, 0usize);
        let mut rotor = st.rotor;
        loop {
            let fit = records_that_fit(&records[at..], slot.len as usize);
            let mine = records[at..at + fit].to_vec();
            at += fit;
            let left: usize = records[at..].iter().map(|r| r.encoded_len()).sum();
            // Short of room for that, a smaller slot: one that holds the next record, or
            // any for a guess (a batch that does not fit goes on in a slot of its size).
            let (next_len, least) = if at < records.len() {
                let one = size_for(HEADER_BYTES + records[at].encoded_len());
                (size_for(HEADER_BYTES + left), one)
            } else {
                // Predict the next batch from the recent ones, with room to grow: a batch
                // that outgrows its slot spills into a second block, a second durable write.
                (size_for(expect * 2), MIN_BLOCK)
            };
            let slot_for = if at < records.len() {
                Zil::alloc_continuation
            } else {
                Zil::alloc_slot
            };
            let Some(next) = slot_for(zil, &mut rotor, next_len, least) else {
                for a in taken {
                    zil.free_slot(a);
                }
                return None;
            };
            taken.push(next);
            let max_txg = mine.iter().map(|r| r.txg()).max().unwrap_or(0);
            let block = LogBlock {
                chain: st.chain,
                seq,
                max_txg,
                next,
                records: mine,
            };
            slots.push(slot);
            blocks.push((zil.written_part(slot, block.body_len()), block));
            slot = next;
            seq += 1;
            if at == records.len() {
                break;
            }
        }
        st.rotor = rotor;
        for (a, b) in &blocks {
            assert!(
                st.blocks.back().is_none_or(|last| last.seq < b.seq),
                "a chain's blocks join it in sequence order"
            );
            st.blocks.push_back(ChainBlock {
                addr: *a,
                seq: b.seq,
                max_txg: b.max_txg,
                inflight: true,
            });
        }
        st.next_slot = slot;
        st.next_seq = seq;
        Some(Plan {
            blocks,
            slots,
            taken,
        })
    }

    /// At the sync of `txg`, before the directory is written: moves the header past the
    /// blocks whose records `txg` covers. Returns the header to write and whether it changed.
    pub fn prepare_sync(&self, txg: u64) -> (ZilHeader, bool) {
        let mut st = self.state.lock();
        if !matches!(st.mode, Mode::Active) {
            return (st.header, false);
        }
        if let Some(sw) = &st.switch {
            if txg < sw.until {
                // The old chain's header, as the last sync wrote it (see `Switch`). The new
                // chain has no blocks yet: nothing is logged on it before its header commits.
                return (st.header, false);
            }
            st.switch = None;
        }
        let k = st
            .blocks
            .iter()
            .position(|b| b.inflight || b.max_txg > txg)
            .unwrap_or(st.blocks.len());
        let gone: Vec<BlockAddr> = st.blocks.drain(..k).map(|b| b.addr).collect();
        let (head, head_seq) = match st.blocks.front() {
            Some(b) => (b.addr, b.seq),
            None => (st.next_slot, st.next_seq),
        };
        let header = ZilHeader {
            chain: st.chain,
            head,
            head_seq,
        };
        // A replay starts at the header's block: one that went back on its chain would apply
        // records a committed txg already covers over newer writes.
        assert!(
            header.chain != st.header.chain || header.head_seq >= st.header.head_seq,
            "a chain's header moves only forward ({} after {})",
            header.head_seq,
            st.header.head_seq
        );
        let changed = header != st.header;
        st.header = header;
        st.syncing.push((txg, header, gone));
        (header, changed)
    }

    /// Once `txg` has committed: frees the blocks it let go, drops the queued records it
    /// covers and answers the requests that are now durable.
    pub fn txg_committed(&self, zil: &Zil, txg: u64) {
        let mut st = self.state.lock();
        let mut i = 0;
        while i < st.syncing.len() {
            if st.syncing[i].0 <= txg {
                let (_, header, gone) = st.syncing.remove(i);
                gone.into_iter().for_each(|a| zil.free_slot(a));
                if header.chain == st.chain && header.chain != 0 {
                    st.durable_chain = header.chain;
                    std::mem::take(&mut st.retired)
                        .into_iter()
                        .for_each(|a| zil.free_slot(a));
                }
            } else {
                i += 1;
            }
        }
        zil.unpin(st.queue.iter().map(|(_, r)| r).filter(|r| r.txg() <= txg));
        st.queue.retain(|(_, r)| r.txg() > txg);
        let ready = st.take_satisfied();
        drop(st);
        wake_all(ready, || Ok(()));
    }

    /// The volume is gone (its destruction committed): every block of its log is freed.
    pub fn discard(&self, zil: &Zil) {
        let mut st = self.state.lock();
        let mut all: Vec<BlockAddr> = st.blocks.drain(..).map(|b| b.addr).collect();
        all.append(&mut st.retired);
        for (_, _, gone) in st.syncing.drain(..) {
            all.extend(gone);
        }
        if matches!(st.mode, Mode::Active) {
            all.push(st.next_slot);
        }
        st.mode = Mode::Off;
        zil.unpin(st.queue.iter().map(|(_, r)| r));
        st.queue.clear();
        let waiting: Vec<Done> = st.waiters.drain(..).map(|(_, d)| d).collect();
        drop(st);
        all.into_iter().for_each(|a| zil.free_slot(a));
        wake_all(waiting, || {
            Err(LogError::Failed("the volume was destroyed".into()))
        });
    }

    /// (records queued, sync requests) since the pool was opened.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.appended.load(Ordering::Relaxed),
            self.requests.load(Ordering::Relaxed),
        )
    }

    /// The header last written (or loaded at import).
    pub fn header(&self) -> ZilHeader {
        self.state.lock().header
    }
}

/// `Log::start_chain` with the state locked. Every slot of the chain left behind (its blocks,
/// and the slot its next block would have taken) is retired: kept until a txg commits the new
/// header, as a crash before then replays the old chain. That header is written by no txg
/// before the one covering the old blocks' records and txg `covered_by` (`Switch`). With no
/// log space for the new chain's first block, the log is off (sync requests commit txgs)
/// until a batch finds some.
fn begin_chain(zil: &Zil, st: &mut State, covered_by: u64) {
    let until = (st.blocks.iter().map(|b| b.max_txg).max())
        .unwrap_or(0)
        .max(covered_by);
    let replay_after = match &st.mode {
        Mode::NeedsReplay { after, .. } => *after,
        _ => 0,
    };
    match &mut st.switch {
        // A switch still pending: the directory holds the chain before it, whatever began since.
        Some(sw) => sw.until = sw.until.max(until),
        None if until > 0 => {
            st.switch = Some(Switch {
                until,
                replay_after,
            })
        }
        None => {}
    }
    let old: Vec<BlockAddr> = st.blocks.drain(..).map(|b| b.addr).collect();
    st.retired.extend(old);
    if matches!(st.mode, Mode::Active) {
        let slot = std::mem::take(&mut st.next_slot);
        st.retired.push(slot);
        st.mode = Mode::Off;
    }
    if !zil.enabled() {
        st.mode = Mode::Off;
        return;
    }
    let mut rotor = st.rotor;
    let Some(slot) = zil.alloc_slot(&mut rotor, MIN_BLOCK, MIN_BLOCK) else {
        st.mode = Mode::Off;
        st.abandoned = true;
        return;
    };
    st.rotor = rotor;
    st.chain = random_chain();
    st.next_slot = slot;
    st.next_seq = 1;
    st.mode = Mode::Active;
    st.abandoned = false;
}

/// Encodes a plan's blocks, each as it is written, and writes them (with their devices'
/// flushes); an error if there is no plan (no log space).
fn write_plan(
    zil: &Zil,
    plan: Option<&Plan>,
    records: u64,
    data_vdevs: &[u32],
) -> Result<(), LogIoError> {
    let Some(p) = plan else {
        return Err(LogIoError::NoSpace);
    };
    zil.write_blocks(&p.blocks, records, data_vdevs)
}

/// After a plan's write: its blocks are durable links of the chain, or (on failure) the chain
/// is abandoned and a new one begins.
///
/// A failed write may still have landed some of the plan's blocks: the blocks are written at
/// once, so a later one can be on disk while an earlier one is not. Such a block is a valid
/// continuation of the chain, with the next sequence number, in a slot about to be freed. Were
/// the chain to go on from the plan's first slot, a later block there could name that slot
/// again before anything overwrote it, and a replay would follow into the stale block and
/// apply its records after newer ones: a write acknowledged since would read back older. (A
/// write refused for want of room keeps its records queued, uncovered by any txg, so nothing
/// skips them at replay.) A new chain has a new id, which no block written for the old one
/// carries. Until a txg commits its header, sync requests commit txgs; the fallback sync that
/// follows a failed write is the first of them.
fn settle(zil: &Zil, st: &mut State, plan: Option<&Plan>, wrote: bool) {
    let Some(p) = plan else { return };
    let addrs: Vec<BlockAddr> = p.blocks.iter().map(|(a, _)| *a).collect();
    if wrote {
        // The plan's blocks were the last pushed (one batch is written at a time, and a
        // sync drains only the front, up to the first block in flight): look from the back
        // and stop once all are found, not through the whole chain for each one.
        let mut left = addrs.len();
        for b in st.blocks.iter_mut().rev() {
            if left == 0 {
                break;
            }
            if addrs.contains(&b.addr) {
                b.inflight = false;
                left -= 1;
            }
        }
        // Only once written: after a failed write the whole slots go to the old chain.
        for (slot, (part, _)) in p.slots.iter().zip(&p.blocks) {
            zil.free_tail(*slot, *part);
        }
    } else {
        st.blocks.retain(|b| !addrs.contains(&b.addr));
        // The plan's slots may hold blocks of the old chain, replayed if a crash comes first:
        // the ones it took, and its first (the chain's next slot, which `begin_chain`
        // retires with the chain's blocks).
        st.retired.extend(p.taken.iter().copied());
        st.next_slot = p.slots[0];
        begin_chain(zil, st, 0);
    }
}

/// A block size for `bytes` of header and records: whole 4 KiB sectors, at most MAX_BLOCK.
pub(crate) fn size_for(bytes: usize) -> u32 {
    (bytes.next_multiple_of(MIN_BLOCK as usize) as u32).clamp(MIN_BLOCK, MAX_BLOCK)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Weak};

    use super::*;
    use crate::vdev::mem::Faults;
    use crate::vdev::{BlockDevice, MemDevice, TopVdev};
    use crate::vdev::{Leaf, TopKind};
    use crate::zil::{Payload, Placement, TxgHooks};

    /// The pool's txgs as one log sees them: each sync commits everything queued so far
    /// (records carry the open txg), unless the pool waits for room, when a sync gives up
    /// at once as the pool's does.
    struct Txgs {
        zil: Weak<Zil>,
        log: Arc<Log>,
        open: Arc<AtomicU64>,
        room: Arc<AtomicBool>,
    }

    impl Txgs {
        fn commit(&self) -> Result<u64, LogError> {
            if !self.room.load(Ordering::SeqCst) {
                return Err(LogError::OutOfRoom("the pool waits for room".into()));
            }
            let zil = self.zil.upgrade().expect("the log space");
            let txg = self.open.fetch_add(1, Ordering::SeqCst);
            self.log.prepare_sync(txg);
            self.log.txg_committed(&zil, txg);
            Ok(txg)
        }
    }

    impl TxgHooks for Txgs {
        fn sync_now(&self) -> Result<(), LogError> {
            self.commit().map(|_| ())
        }
        fn request_sync(&self) {}
        fn wait_commit(&self) -> Result<u64, LogError> {
            self.commit()
        }
    }

    /// Log space on two single-device vdevs (1 MiB each) and a volume's log, its header
    /// committed.
    struct Rig {
        zil: Arc<Zil>,
        log: Arc<Log>,
        devs: Vec<Arc<MemDevice>>,
        /// The open txg, which records carry.
        open: Arc<AtomicU64>,
        /// Whether the pool has room (else its syncs give up at once).
        room: Arc<AtomicBool>,
    }

    fn two_vdev_log() -> Rig {
        let devs: Vec<Arc<MemDevice>> = (0..2)
            .map(|i| Arc::new(MemDevice::new(&format!("d{i}"), 8 << 20)))
            .collect();
        let tops = devs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let leaf = Arc::new(Leaf::new(d.clone() as Arc<dyn BlockDevice>, 10 + i as u64));
                let top = TopVdev::new(i as u32, 20 + i as u64, TopKind::Stripe, vec![leaf]);
                (Arc::new(top), (1 << 20, 1 << 20), false)
            })
            .collect();
        let zil = Arc::new(Zil::new(tops, CommitPolicy::Group, Placement::Global));
        let log = Arc::new(Log::new_chain(&zil));
        let (open, room) = (Arc::new(AtomicU64::new(2)), Arc::new(AtomicBool::new(true)));
        let txgs = Txgs {
            zil: Arc::downgrade(&zil),
            log: log.clone(),
            open: open.clone(),
            room: room.clone(),
        };
        txgs.commit().unwrap();
        zil.set_hooks(Box::new(txgs));
        Rig {
            zil,
            log,
            devs,
            open,
            room,
        }
    }

    fn write(log: &Log, zil: &Zil, open: &AtomicU64, offset: u64, byte: u8, len: usize) {
        let rec = Record::Write {
            txg: open.load(Ordering::SeqCst),
            offset,
            data: Payload::owned(vec![byte; len]),
        };
        log.append(zil, rec);
    }

    /// `len` bytes from `offset` of vdev `v`.
    fn read_vdev(zil: &Zil, v: u32, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        let top = zil.top(v).expect("a vdev");
        top.children[0].read_data(&mut buf, offset).unwrap();
        buf
    }

    /// A batch whose first block fails to write while a later one lands, refused because the
    /// pool waits for room: the records stay queued, and the block that landed holds older
    /// versions of them, a valid-looking next block of the chain in a slot that is then free.
    /// The log must never again write a block that could lead a replay into it: the chain it
    /// writes on has another id, so a replay of it ends at the stale block, whichever block
    /// comes to name that slot. A later commit is logged, and replays as the newest data.
    #[test]
    fn a_block_that_landed_from_a_failed_batch_never_passes_for_part_of_the_chain() {
        let Rig {
            zil,
            log,
            devs,
            open,
            room,
        } = two_vdev_log();
        write(&log, &zil, &open, 0, 1, 512);
        log.commit_wait(&zil, &ByValue).unwrap();
        let (chain, first, seq) = {
            let st = log.state.lock();
            (st.chain, st.next_slot, st.next_seq)
        };
        // More than the next block's slot holds: the batch goes on in a block on the other
        // vdev, which has room; the first slot's vdev has none, and neither has the pool.
        let other = 1 - first.vdev;
        for k in 0..(first.len as u64 / 512 + 4) {
            write(&log, &zil, &open, (k + 1) * 4096, 2, 512);
        }
        write(&log, &zil, &open, 0, 2, 512);
        devs[first.vdev as usize].set_faults(Faults {
            full: true,
            ..Faults::default()
        });
        room.store(false, Ordering::SeqCst);
        let refused = log.commit_wait(&zil, &ByValue);
        assert!(
            matches!(refused, Err(LogError::OutOfRoom(_))),
            "{refused:?}"
        );
        // The later block landed (or the test shows nothing).
        let landed = read_vdev(&zil, other, 1 << 20, 1 << 20);
        let stale = (0..landed.len())
            .step_by(4096)
            .find(|&at| LogBlock::decode(&landed[at..], chain, seq + 1).is_ok())
            .expect("the failed batch's second block is on disk");

        devs[first.vdev as usize].set_faults(Faults::default());
        room.store(true, Ordering::SeqCst);
        write(&log, &zil, &open, 0, 3, 512);
        log.commit_wait(&zil, &ByValue).unwrap();
        let now = log.state.lock().chain;
        assert!(
            LogBlock::decode(&landed[stale..], now, seq + 1).is_err(),
            "the chain goes on with a block of the failed batch as its next"
        );

        // Once its header is committed, the new chain logs commits, and a replay of it
        // gives each offset its newest data.
        write(&log, &zil, &open, 0, 4, 512);
        let blocks_before = zil.stats().blocks.iter().sum::<u64>();
        log.commit_wait(&zil, &ByValue).unwrap();
        assert!(zil.stats().blocks.iter().sum::<u64>() > blocks_before);
        let header = log.header();
        let mut read = |a: BlockAddr, _| Ok(read_vdev(&zil, a.vdev, a.offset, a.len as usize));
        let (blocks, _) =
            super::super::block::walk_chain(header.chain, header.head, header.head_seq, &mut read);
        let last_at_0 = blocks
            .iter()
            .flat_map(|b| &b.records)
            .rfind(|r| r.extent().0 == 0)
            .cloned();
        match last_at_0 {
            Some(Record::Write { data, .. }) => assert_eq!(data[0], 4),
            other => panic!("offset 0 replays as {other:?}"),
        }
    }

    /// A batch's write fails after an earlier batch of the chain was acknowledged, its
    /// records in a txg later than one whose sync is on its way: a new chain begins. That
    /// sync must still write the old chain's header, and its commit must not free the old
    /// blocks: it does not hold the acknowledged write, which a crash before the next commit
    /// could find only in the old chain. The first txg that holds it switches.
    #[test]
    fn a_new_chain_is_not_committed_by_a_txg_older_than_the_records_of_the_old_one() {
        let Rig {
            zil,
            log,
            devs,
            open,
            room,
        } = two_vdev_log();
        // Txg `closed` closes; its sync has yet to write its directory.
        let closed = open.fetch_add(1, Ordering::SeqCst);
        write(&log, &zil, &open, 0, 1, 512);
        log.commit_wait(&zil, &ByValue).unwrap();
        let old = log.header();
        let acked_in = log.state.lock().blocks.back().expect("a logged block").addr;

        // The next batch's write fails, and its fallback sync finds no room: a new chain.
        for d in &devs {
            d.set_faults(Faults {
                full: true,
                ..Faults::default()
            });
        }
        room.store(false, Ordering::SeqCst);
        write(&log, &zil, &open, 4096, 2, 512);
        assert!(log.commit_wait(&zil, &ByValue).is_err());
        assert_ne!(log.state.lock().chain, old.chain, "a new chain began");

        let (header, changed) = log.prepare_sync(closed);
        assert_eq!(header, old, "txg {closed} writes the old chain's header");
        assert!(!changed);
        log.txg_committed(&zil, closed);
        assert!(
            log.state.lock().retired.contains(&acked_in),
            "the block of the acknowledged write is kept"
        );

        for d in &devs {
            d.set_faults(Faults::default());
        }
        room.store(true, Ordering::SeqCst);
        let covering = open.fetch_add(1, Ordering::SeqCst);
        let (header, changed) = log.prepare_sync(covering);
        assert_eq!(header.chain, log.state.lock().chain);
        assert!(changed);
        log.txg_committed(&zil, covering);
        assert!(log.state.lock().retired.is_empty());
        // The new chain takes commits from here.
        write(&log, &zil, &open, 0, 3, 512);
        let blocks_before = zil.stats().blocks.iter().sum::<u64>();
        log.commit_wait(&zil, &ByValue).unwrap();
        assert!(zil.stats().blocks.iter().sum::<u64>() > blocks_before);
    }

    /// The end of a replay: its last writes are in the open txg. A sync of an older txg
    /// that writes its directory after the new chain began keeps the old header and the
    /// txg the replay counts from; only a txg holding the whole replay ends it.
    #[test]
    fn a_replay_ends_only_with_a_txg_that_holds_all_of_it() {
        let Rig { zil, .. } = two_vdev_log();
        let old = ZilHeader {
            chain: 77,
            head: BlockAddr {
                vdev: 0,
                len: 4096,
                offset: 1 << 20,
            },
            head_seq: 1,
        };
        let rec = Record::Write {
            txg: 4,
            offset: 0,
            data: Payload::owned(vec![1; 512]),
        };
        let log = Log::imported(old, vec![old.head], vec![rec], 3);
        assert_eq!(log.replay_after(), 3);
        assert_eq!(log.prepare_sync(9), (old, false));
        // Replayed into txgs up to 10, the open one.
        log.start_chain(&zil, 10);
        assert_eq!(log.prepare_sync(9), (old, false));
        assert_eq!(log.replay_after(), 3);
        log.txg_committed(&zil, 9);
        assert_eq!(log.state.lock().retired.first(), Some(&old.head));

        let (header, changed) = log.prepare_sync(10);
        assert!(changed && header.chain != old.chain);
        assert_eq!(log.replay_after(), 0);
        log.txg_committed(&zil, 10);
        assert!(log.state.lock().retired.is_empty());
    }

    /// What a crash could lose: records that no sync request covers. Records a request
    /// waits for (even behind a committer at work), and records a txg committed, are not.
    #[test]
    fn only_records_no_sync_request_covers_are_at_risk() {
        let Rig { zil, log, open, .. } = two_vdev_log();
        assert_eq!(log.oldest_unrequested(), None);
        write(&log, &zil, &open, 0, 1, 512);
        let first = log
            .oldest_unrequested()
            .expect("an unflushed write is at risk");
        write(&log, &zil, &open, 4096, 1, 512);
        assert_eq!(log.oldest_unrequested(), Some(first));
        log.commit_wait(&zil, &ByValue).unwrap();
        assert_eq!(log.oldest_unrequested(), None);

        write(&log, &zil, &open, 0, 2, 512);
        log.state.lock().committing = true;
        let answered = Arc::new(AtomicBool::new(false));
        let a = answered.clone();
        let joined = log.join(Box::new(move |r| a.store(r.is_ok(), Ordering::SeqCst)));
        assert!(joined.is_none(), "joined the committer at work");
        assert_eq!(log.oldest_unrequested(), None);
        // The stand-in committer steps back; the next commit answers the joined request.
        log.state.lock().committing = false;
        log.commit_wait(&zil, &ByValue).unwrap();
        assert!(answered.load(Ordering::SeqCst));

        write(&log, &zil, &open, 8192, 3, 512);
        assert!(log.oldest_unrequested().is_some());
        let txg = open.fetch_add(1, Ordering::SeqCst);
        log.prepare_sync(txg);
        log.txg_committed(&zil, txg);
        assert_eq!(log.oldest_unrequested(), None);
    }
}
