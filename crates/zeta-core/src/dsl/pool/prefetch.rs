//! The pool's prefetch thread: it reads the stretches `dmu::zfetch` asks for into the cache,
//! so a reader continuing a stream finds its blocks there rather than waiting for them.
//!
//! The queue is bounded (`QUEUE`): a stretch that finds it full is dropped, and its reader
//! then reads those blocks itself, as without prefetch. The thread starts with the first
//! stretch asked for and is stopped and joined when the pool closes, before its last sync.
//! It holds the pool only for one stretch at a time (a weak reference between them), so a
//! pool dropped by everyone else goes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use parking_lot::Mutex;

use super::{Dataset, Pool};

/// Stretches waiting for the thread, at most.
const QUEUE: usize = 32;

struct Stretch {
    ds: Weak<Dataset>,
    first: u64,
    count: u64,
}

/// What `Pool::read_ahead` counted (`zeta pool arcstat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchStats {
    /// Stretches asked for, and those dropped for a full queue.
    pub asked: u64,
    pub dropped: u64,
    /// Blocks the thread read into the cache.
    pub blocks: u64,
}

#[derive(Default)]
pub(super) struct Prefetcher {
    queue: Mutex<Option<SyncSender<Stretch>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Set by `stop`: no thread starts again.
    stopped: AtomicBool,
    /// Cleared by `Pool::set_prefetch(false)`.
    disabled: AtomicBool,
    asked: AtomicU64,
    dropped: AtomicU64,
    blocks: Arc<AtomicU64>,
}

impl Prefetcher {
    /// Stops the thread and waits for it (its stretch in hand done); later requests are
    /// dropped.
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        drop(self.queue.lock().take());
        let handle = self.thread.lock().take();
        if let Some(h) = handle {
            // The thread itself may drop the last reference to the pool; it must not join
            // itself.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    pub(super) fn stats(&self) -> PrefetchStats {
        PrefetchStats {
            asked: self.asked.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            blocks: self.blocks.load(Ordering::Relaxed),
        }
    }
}

fn run(pool: Weak<Pool>, stretches: Receiver<Stretch>, blocks: Arc<AtomicU64>) {
    while let Ok(s) = stretches.recv() {
        let Some(pool) = pool.upgrade() else { return };
        // A closing pool waits for this thread: what is still queued is dropped.
        if pool.prefetcher.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Some(ds) = s.ds.upgrade() else { continue };
        if !ds.destroyed.load(Ordering::Acquire) {
            let n = ds.object.read_ahead(&pool.io, s.first, s.count);
            blocks.fetch_add(n, Ordering::Relaxed);
        }
    }
}

impl Pool {
    /// Has blocks `first..first + count` of `ds` read into the cache in the background
    /// (`Object::read_ahead`), unless prefetch is off, the pool is closing, or the queue is
    /// full.
    pub(crate) fn read_ahead(self: &Arc<Self>, ds: &Arc<Dataset>, first: u64, count: u64) {
        let p = &self.prefetcher;
        if !self.prefetch_enabled() || count == 0 || p.stopped.load(Ordering::SeqCst) {
            return;
        }
        p.asked.fetch_add(1, Ordering::Relaxed);
        let mut queue = p.queue.lock();
        // Checked again under the lock `stop` takes the queue under: no thread starts after.
        if p.stopped.load(Ordering::SeqCst) {
            p.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if queue.is_none() {
            let (tx, rx) = sync_channel(QUEUE);
            let (weak, blocks) = (Arc::downgrade(self), p.blocks.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("prefetch-{}", self.name))
                .spawn(move || run(weak, rx, blocks));
            match spawned {
                Ok(h) => *p.thread.lock() = Some(h),
                // No thread to be had: readers read for themselves.
                Err(_) => {
                    p.dropped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
            *queue = Some(tx);
        }
        let stretch = Stretch {
            ds: Arc::downgrade(ds),
            first,
            count,
        };
        let tx = queue.as_ref().expect("started above");
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = tx.try_send(stretch) {
            p.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What reading ahead asked for and did.
    pub fn prefetch_stats(&self) -> PrefetchStats {
        self.prefetcher.stats()
    }

    /// Whether reads ahead are made (`set_prefetch`; on unless turned off).
    pub fn prefetch_enabled(&self) -> bool {
        !self.prefetcher.disabled.load(Ordering::Relaxed)
    }

    /// Turns reading ahead of sequential readers on or off (`zeta serve --no-prefetch`;
    /// OpenZFS's `zfs_prefetch_disable`). Streams already queued are still read.
    pub fn set_prefetch(&self, on: bool) {
        self.prefetcher.disabled.store(!on, Ordering::Relaxed);
    }
}
