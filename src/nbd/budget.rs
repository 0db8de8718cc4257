//! A server-wide budget of bytes in flight (request payloads and read buffers), so memory
//! stays bounded however many connections and queued requests there are.

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

pub struct Budget {
    capacity: u64,
    available: Mutex<u64>,
    freed: Condvar,
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
            available: Mutex::new(capacity),
            freed: Condvar::new(),
        })
    }

    /// Waits until `bytes` (at most the whole capacity, so one huge request cannot wait
    /// forever) are available and takes them.
    pub fn acquire(self: &Arc<Self>, bytes: u64) -> Grant {
        let bytes = bytes.min(self.capacity);
        let mut avail = self.available.lock();
        while *avail < bytes {
            self.freed.wait(&mut avail);
        }
        *avail -= bytes;
        Grant {
            budget: self.clone(),
            bytes,
        }
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if self.bytes > 0 {
            *self.budget.available.lock() += self.bytes;
            self.budget.freed.notify_all();
        }
    }
}
