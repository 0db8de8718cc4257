//! What a vdev read reports beside its data, and the fan-out of one I/O to several devices.

/// What a verified read had to do to return good data.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadReport {
    pub io_errors: u32,
    pub cksum_errors: u32,
    pub repaired_bytes: u64,
}

/// The copies a speculative read (`TopVdev::read_speculative`) found wrong beside the block
/// it returned, and left as they were: mirror children, or raidz columns, that failed to
/// read or held other bytes. Whether that is a device's fault only the caller can tell (a
/// block whose write a crash cut short left some copies or columns unwritten, and no device
/// is to blame); once it knows the block was written whole, `TopVdev::settle` counts and
/// rewrites them as an ordinary read would have.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unsettled {
    /// Children (by position), or columns (by index in the block's stripe), that read
    /// without error but held other bytes than the block.
    pub mismatched: Vec<usize>,
    /// Those whose read failed: counted as read errors already, since a failed read is the
    /// device's fault whatever the block; only their rewrite waits.
    pub unread: Vec<usize>,
}

impl Unsettled {
    pub fn is_empty(&self) -> bool {
        self.mismatched.is_empty() && self.unread.is_empty()
    }
}

/// Runs `io` on each of a few items at once and returns the results in order: the first on
/// this thread, each other on a scoped thread of its own. For I/Os that each wait for a
/// device, such as the durable writes of a log block's copies or columns: a thread started
/// for the purpose begins sooner than a sleeping rayon worker wakes (a queue-depth-1 client
/// writing and flushing on a raidz2 of six files: 2.5k commits a second through rayon,
/// 2.9-3.3k this way; one after another on this thread, 2.3k).
pub(crate) fn waiting_in_parallel<T: Sync, R: Send>(
    items: &[T],
    io: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let Some((first, rest)) = items.split_first() else {
        return Vec::new();
    };
    let io = &io;
    std::thread::scope(|scope| {
        let others: Vec<_> = rest
            .iter()
            .map(|item| scope.spawn(move || io(item)))
            .collect();
        std::iter::once(io(first))
            .chain(others.into_iter().map(|h| match h.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            }))
            .collect()
    })
}
