//! A server-wide budget of bytes in flight (request payloads and read buffers), so memory
//! stays bounded however many connections and queued requests there are.
//!
//! The budget also keeps the payload buffers of finished writes for the next ones. Under a
//! stream of large writes, a fresh buffer per request cost a malloc that searched a heap
//! fragmented by the block cache, and each new one was carved from new heap. A kept buffer
//! still counts against the budget (as if in flight), so payload memory, idle or not, stays
//! within the capacity; a request that needs room the idle buffers hold frees them.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Payload buffers up to this size are kept for reuse; larger ones are rare and freed.
const KEPT_BUFFER_BYTES: usize = 1 << 20;

pub struct Budget {
    capacity: u64,
    state: Mutex<State>,
    freed: Condvar,
}

struct State {
    /// Bytes neither granted nor held by kept buffers.
    available: u64,
    /// Buffers of finished writes, each holding its capacity out of the budget.
    kept: Vec<Vec<u8>>,
}

impl State {
    /// Frees kept buffers until `bytes` are available or none is left.
    fn make_room(&mut self, bytes: u64) {
        while self.available < bytes {
            let Some(b) = self.kept.pop() else { return };
            self.available += b.capacity() as u64;
        }
    }
}

/// Bytes held by one request; returned to the budget on drop.
pub struct Grant {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Budget {
    pub fn new(capacity: u64) -> Arc<Budget> {
        Arc::new(Budget {
            capacity,
            state: Mutex::new(State {
                available: capacity,
                kept: Vec::new(),
            }),
            freed: Condvar::new(),
        })
    }

    /// Waits until `bytes` (at most the whole capacity, so one huge request cannot wait
    /// forever) are available and takes them.
    pub fn acquire(self: &Arc<Self>, bytes: u64) -> Grant {
        self.acquire_or_else(bytes, || {})
    }

    /// `acquire`, calling `before_wait` (without the budget's lock) once if it has to wait:
    /// a caller holding replies it has yet to send sends them there, since their grants may
    /// be the room it waits for.
    pub fn acquire_or_else(self: &Arc<Self>, bytes: u64, before_wait: impl FnOnce()) -> Grant {
        let bytes = bytes.min(self.capacity);
        if bytes == 0 {
            // Most requests carry no data: no lock for them, now or at the drop.
            return Grant {
                budget: self.clone(),
                bytes,
            };
        }
        let mut st = self.state.lock();
        st.make_room(bytes);
        if st.available < bytes {
            drop(st);
            before_wait();
            st = self.state.lock();
            st.make_room(bytes);
        }
        while st.available < bytes {
            self.freed.wait(&mut st);
            st.make_room(bytes);
        }
        st.available -= bytes;
        Grant {
            budget: self.clone(),
            bytes,
        }
    }

    /// A grant and an empty buffer that can hold `len` bytes: a kept one if one fits
    /// (at most twice as large), else a new one once the budget has room for it.
    pub fn acquire_buffer(
        self: &Arc<Self>,
        len: usize,
        before_wait: impl FnOnce(),
    ) -> (Grant, Vec<u8>) {
        let fits = |b: &Vec<u8>| b.capacity() >= len && b.capacity() <= len.max(4096) * 2;
        {
            let mut st = self.state.lock();
            if let Some(i) = st.kept.iter().position(fits) {
                let buf = st.kept.swap_remove(i);
                let grant = Grant {
                    budget: self.clone(),
                    bytes: buf.capacity() as u64,
                };
                return (grant, buf);
            }
        }
        let grant = self.acquire_or_else(len as u64, before_wait);
        (grant, Vec::with_capacity(len))
    }

    /// Bytes neither in flight nor in kept buffers.
    #[cfg(test)]
    pub(super) fn available(&self) -> u64 {
        self.state.lock().available
    }
}

impl Grant {
    /// Keeps `buf`, a payload this grant paid for, for a later request: its bytes stay out
    /// of the budget, held by the kept buffer instead of by this grant.
    pub fn keep(&mut self, buf: Vec<u8>) {
        if buf.capacity() as u64 != self.bytes || buf.capacity() > KEPT_BUFFER_BYTES {
            return; // larger than the budget charged for it (a huge request), or rare
        }
        let mut buf = buf;
        buf.clear();
        self.budget.state.lock().kept.push(buf);
        self.bytes = 0;
        // A request waiting for room can take it from this buffer now: without this, every
        // grant of a busy server could end as a kept buffer and leave its waiters asleep.
        self.budget.freed.notify_all();
    }
}

impl Grant {
    /// Gives the bytes back now (the grant's data is gone), not when the grant is dropped.
    pub fn release(&mut self) {
        if self.bytes > 0 {
            self.budget.state.lock().available += std::mem::take(&mut self.bytes);
            self.budget.freed.notify_all();
        }
    }
}

/// What one request holds until its reply is on the wire: bytes of the server-wide budget
/// for its data (a read's reply, a write's payload until the volume has it), and bytes of
/// its connection's quota for its reply. A reply keeps both until its last byte is written,
/// so a client that stops reading stops its own reader before it holds more than its quota.
pub struct Held {
    pub data: Grant,
    /// Only ever given back (dropped with the reply).
    pub _reply: QuotaGrant,
}

/// One connection's quota of reply bytes it may owe. Taken and given back once per request,
/// by different threads, so without a lock unless someone waits: a mutex per request on
/// the reader and on the thread sending was measurable under 4K writes.
pub struct Quota {
    capacity: u64,
    used: AtomicU64,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    freed: Condvar,
}

/// Bytes of a `Quota`, given back on drop.
pub struct QuotaGrant {
    quota: Arc<Quota>,
    bytes: u64,
}

impl Quota {
    pub fn new(capacity: u64) -> Arc<Quota> {
        assert!(capacity > 0);
        Arc::new(Quota {
            capacity,
            used: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            lock: Mutex::new(()),
            freed: Condvar::new(),
        })
    }

    /// Takes `bytes` (at most the capacity) once they fit, calling `before_wait` first if
    /// it has to wait (see `Budget::acquire_or_else`).
    pub fn acquire_or_else(self: &Arc<Self>, bytes: u64, before_wait: impl FnOnce()) -> QuotaGrant {
        let bytes = bytes.min(self.capacity);
        if !self.try_take(bytes) {
            before_wait();
            let mut g = self.lock.lock();
            self.waiters.fetch_add(1, Ordering::SeqCst);
            while !self.try_take(bytes) {
                self.freed.wait(&mut g);
            }
            self.waiters.fetch_sub(1, Ordering::SeqCst);
        }
        QuotaGrant {
            quota: self.clone(),
            bytes,
        }
    }

    fn try_take(&self, bytes: u64) -> bool {
        let cap = self.capacity;
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                (u + bytes <= cap).then_some(u + bytes)
            })
            .is_ok()
    }

    #[cfg(test)]
    pub(super) fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }
}

impl Drop for QuotaGrant {
    fn drop(&mut self) {
        let before = self.quota.used.fetch_sub(self.bytes, Ordering::SeqCst);
        assert!(before >= self.bytes, "a quota given back twice");
        // A waiter counts itself, under the lock, before it looks: either it sees these
        // bytes back, or this sees it and wakes it (after it let the lock go to wait).
        if self.quota.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.quota.lock.lock();
            self.quota.freed.notify_all();
        }
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_buffers_count_against_the_budget_and_make_room_when_needed() {
        let b = Budget::new(1 << 20);
        let (mut g, buf) = b.acquire_buffer(256 << 10, || {});
        assert_eq!(b.available(), 768 << 10);
        let ptr = buf.as_ptr();
        g.keep(buf);
        drop(g);
        assert_eq!(
            b.available(),
            768 << 10,
            "the kept buffer still holds its bytes"
        );
        // The same size again reuses it.
        let (g, buf) = b.acquire_buffer(200 << 10, || {});
        assert_eq!(buf.as_ptr(), ptr);
        assert!(buf.is_empty() && buf.capacity() >= 200 << 10);
        drop((g, buf));
        assert_eq!(
            b.available(),
            1 << 20,
            "a buffer not kept gives its bytes back"
        );
        // A kept buffer too small to fit is freed when the room is needed.
        let (mut g, buf) = b.acquire_buffer(512 << 10, || {});
        g.keep(buf);
        drop(g);
        let whole = b.acquire(1 << 20);
        assert_eq!(b.available(), 0);
        drop(whole);
        assert_eq!(b.available(), 1 << 20);
    }

    #[test]
    fn a_quota_waits_when_spent_and_wakes_when_given_back() {
        let q = Quota::new(1000);
        let a = q.acquire_or_else(600, || panic!("no wait needed"));
        assert_eq!(q.used(), 600);
        drop(a);
        // More than the capacity takes the capacity, so it does not wait for ever.
        let big = q.acquire_or_else(5000, || panic!("no wait needed"));
        assert_eq!(q.used(), 1000);
        drop(big);
        let held = q.acquire_or_else(900, || {});
        let (tx, rx) = std::sync::mpsc::channel();
        let q2 = q.clone();
        let waiter = std::thread::spawn(move || {
            let called = std::cell::Cell::new(false);
            let _g = q2.acquire_or_else(200, || called.set(true));
            tx.send(called.get()).unwrap();
        });
        assert!(rx
            .recv_timeout(std::time::Duration::from_millis(100))
            .is_err());
        drop(held);
        let called = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the waiter never woke");
        assert!(called, "before_wait was not called before waiting");
        waiter.join().unwrap();
        assert_eq!(q.used(), 0);
    }

    #[test]
    fn a_request_waiting_for_room_wakes_when_a_buffer_is_kept() {
        let b = Budget::new(1 << 20);
        let (mut g, buf) = b.acquire_buffer(1 << 20, || {});
        let (tx, rx) = std::sync::mpsc::channel();
        let b2 = b.clone();
        let waiter = std::thread::spawn(move || {
            // Needs the room the grant holds; a buffer of another size will not fit.
            let _g = b2.acquire(900 << 10);
            tx.send(()).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        g.keep(buf);
        drop(g);
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the waiter never woke: the kept buffer's room stayed out of reach");
        waiter.join().unwrap();
    }
}
