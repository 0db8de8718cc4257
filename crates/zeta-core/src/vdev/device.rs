//! The device trait every I/O engine implements, and the layer's error type.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum VdevError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}: in use by another process (could not take its exclusive lock)")]
    Locked { path: String },
    #[error("{path}: not a regular file or block device")]
    NotAFileOrBlockDevice { path: String },
    #[error("{path}: does not exist")]
    Missing { path: String },
    #[error("{path}: injected {what} error")]
    Injected { path: String, what: &'static str },
    #[error("{path}: I/O of {len} bytes at offset {offset} lies past the end ({size} bytes)")]
    OutOfRange {
        path: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    /// No child held a copy that verifies; what each one did.
    #[error("no healthy copy: every child failed ({})", failures.join("; "))]
    AllCopiesFailed { failures: Vec<String> },
    /// Every child of the vdev is offline or faulted.
    #[error("no healthy copy: every device is out of service")]
    NoneInService,
    /// The leaf is out of service (offline or faulted); `path` says which.
    #[error("{path}: out of service")]
    Offline { path: String },
    /// More columns of a raidz stripe are lost than its parity can rebuild: none verifies.
    #[error(
        "raidz{nparity}: no combination of up to {nparity} columns rebuilds a block that \
         verifies{}",
        in_parens(errors)
    )]
    Damaged { nparity: usize, errors: Vec<String> },
    /// More columns of a raidz stripe failed to read (I/O errors) than its parity covers:
    /// what the block holds is unknown, as on a missing device.
    #[error("raidz{nparity}: {} of {of} columns unreadable: {}", errors.len(), errors.join("; "))]
    ColumnsUnreadable {
        nparity: usize,
        of: usize,
        /// What each unreadable column's read failed with.
        errors: Vec<String>,
    },
    /// A raidz write lost more columns than its parity covers; `out_of_space` if every
    /// column that failed did so because its device had no room (`VdevError::out_of_space`).
    #[error("raidz{nparity} write lost {lost} of {of} {parts}: {detail}")]
    WriteLost {
        nparity: usize,
        lost: usize,
        of: usize,
        /// What was lost: "columns" of a stripe or "children" of the vdev.
        parts: &'static str,
        detail: String,
        out_of_space: bool,
    },
}

impl VdevError {
    pub fn io(path: &str, source: io::Error) -> Self {
        VdevError::Io {
            path: path.to_string(),
            source,
        }
    }

    /// The `ENOSPC` a write to `path` gets when its file system is full, for the simulated
    /// and injected full devices (`mem::Faults::full`, `Injection::full`).
    pub fn no_room(path: &str) -> Self {
        VdevError::io(path, io::Error::from_raw_os_error(libc::ENOSPC))
    }

    /// A raidz write that lost `failed` of `of` parts, more than its `nparity` covers.
    pub fn write_lost<'a>(
        nparity: usize,
        of: usize,
        parts: &'static str,
        failed: impl ExactSizeIterator<Item = &'a VdevError> + Clone,
    ) -> Self {
        VdevError::WriteLost {
            nparity,
            lost: failed.len(),
            of,
            parts,
            detail: failed
                .clone()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; "),
            out_of_space: failed.clone().all(VdevError::out_of_space),
        }
    }

    /// Whether the device refused the write for want of room, not for a fault of its own:
    /// the file system under a file device is full (`ENOSPC`) or the file's owner is over
    /// quota (`EDQUOT`). Sparse files (`zeta pool create` makes them) take their blocks on
    /// first write, so a pool of files can meet this long after it was created; freeing
    /// room there is the cure, not replacing the device.
    pub fn out_of_space(&self) -> bool {
        match self {
            VdevError::Io { source, .. } => io_out_of_space(source),
            VdevError::WriteLost { out_of_space, .. } => *out_of_space,
            _ => false,
        }
    }
}

/// `ENOSPC` or `EDQUOT`: the error a write gets when its file system has no room for it.
fn io_out_of_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
        || matches!(
            e.kind(),
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
        )
}

/// One leaf device: a file, a block device, or the in-memory simulator.
///
/// Contract: `write_at` may be volatile until `flush` returns; after a successful `flush`,
/// every write that completed before it was called survives a crash or power cut. A
/// successful `write_durable` survives one on its own.
pub trait BlockDevice: Send + Sync {
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> Result<(), VdevError>;
    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> Result<(), VdevError>;
    /// Reads consecutive bytes from `offset_bytes` into `bufs` in turn: what a run of blocks
    /// that lie next to each other costs as one request. Engines with a vectored call use it.
    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset_bytes: u64) -> Result<(), VdevError> {
        let mut off = offset_bytes;
        for b in bufs.iter_mut() {
            self.read_at(b, off)?;
            off += b.len() as u64;
        }
        Ok(())
    }
    /// Writes `bufs` one after another from `offset_bytes` (see `read_vectored_at`).
    fn write_vectored_at(&self, bufs: &[&[u8]], offset_bytes: u64) -> Result<(), VdevError> {
        let mut off = offset_bytes;
        for b in bufs {
            self.write_at(b, off)?;
            off += b.len() as u64;
        }
        Ok(())
    }
    /// Reads `buf` at `offset_bytes` only if that needs no wait for the device (a file's
    /// page cache holds it): true if read. False if it would wait, or the engine cannot tell,
    /// or it failed (out of range included); the caller then reads the usual way, which
    /// reports any error. Lets a caller with several small reads to make do the cached ones
    /// itself and hand only the rest to threads.
    fn read_at_nowait(&self, _buf: &mut [u8], _offset_bytes: u64) -> bool {
        false
    }
    /// `read_vectored_at` only if no part of it needs a wait for the device (see
    /// `read_at_nowait`). False says nothing of what the buffers hold.
    fn read_vectored_at_nowait(&self, bufs: &mut [&mut [u8]], offset_bytes: u64) -> bool {
        let mut off = offset_bytes;
        bufs.iter_mut().all(|b| {
            let read = self.read_at_nowait(b, off);
            off += b.len() as u64;
            read
        })
    }
    fn flush(&self) -> Result<(), VdevError>;
    /// Writes `buf` and returns once it survives a crash or power cut, like `write_at` and
    /// `flush` together, but promising nothing of other unflushed writes. Devices that can
    /// make one range durable without waiting for everything else written (the intent log's
    /// case: a small block while a txg's data is in flight) override it.
    fn write_durable(&self, buf: &[u8], offset_bytes: u64) -> Result<(), VdevError> {
        self.write_at(buf, offset_bytes)?;
        self.flush()
    }
    /// Tells the device a range holds nothing of value. Purely advisory: may do nothing.
    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VdevError>;
    fn len_bytes(&self) -> u64;
    /// A name for messages: the path for files, a label for simulated devices.
    fn name(&self) -> &str;
    /// Opened for reading only: every write fails. Only a pool imported read-only takes it.
    fn read_only(&self) -> bool {
        false
    }
}

/// Bounds check shared by every engine, so all report out-of-range I/O the same way.
pub fn check_range(dev: &dyn BlockDevice, offset: u64, len: usize) -> Result<(), VdevError> {
    let size = dev.len_bytes();
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(VdevError::OutOfRange {
            path: dev.name().to_string(),
            offset,
            len: len as u64,
            size,
        }),
    }
}

/// The stand-in for a device the pool config names but import did not find: every I/O fails
/// with `Missing`. It keeps the leaf's place in its vdev until the device is replaced.
pub struct MissingDevice {
    name: String,
    len_bytes: u64,
}

impl MissingDevice {
    pub fn new(name: &str, len_bytes: u64) -> MissingDevice {
        MissingDevice {
            name: name.to_string(),
            len_bytes,
        }
    }

    fn err(&self) -> VdevError {
        VdevError::Missing {
            path: self.name.clone(),
        }
    }
}

impl BlockDevice for MissingDevice {
    fn read_at(&self, _: &mut [u8], _: u64) -> Result<(), VdevError> {
        Err(self.err())
    }
    fn write_at(&self, _: &[u8], _: u64) -> Result<(), VdevError> {
        Err(self.err())
    }
    fn flush(&self) -> Result<(), VdevError> {
        Err(self.err())
    }
    fn discard(&self, _: u64, _: u64) -> Result<(), VdevError> {
        Ok(())
    }
    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// " (a; b)" after a message, or nothing if there is nothing to add.
fn in_parens(errors: &[String]) -> String {
    if errors.is_empty() {
        String::new()
    } else {
        format!(" ({})", errors.join("; "))
    }
}
