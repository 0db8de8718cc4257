//! Leaf devices on regular files and block devices, through positioned reads and writes on the
//! page cache; `flush` is `fdatasync`, `write_durable` a write with `RWF_DSYNC` (of whole
//! sectors, past the page cache with `O_DIRECT`, where the file system allows). Each is held
//! under an exclusive `flock`, so two processes (or two leaves of one pool) can never open the
//! same device.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use super::device::{check_range, BlockDevice, VdevError};
use super::layout::SECTOR;

pub struct FileDevice {
    file: File,
    /// The same file opened with `O_DIRECT`, for durable writes (see `write_durable`);
    /// `None` where the file system refuses it (tmpfs, for one).
    direct: Option<File>,
    path: String,
    len_bytes: u64,
    is_block_device: bool,
    /// Bytes of large writes since writeback was last started (see `WRITEBACK_BATCH_BYTES`).
    unstarted: std::sync::atomic::AtomicUsize,
    /// Opened for reading only (`open_read_only`): a pool imported read-only.
    read_only: bool,
    /// Cleared once the kernel refuses `RWF_NOWAIT` reads (`read_at_nowait`).
    nowait_reads: std::sync::atomic::AtomicBool,
}

/// `BLKGETSIZE64` = `_IOR(0x12, 114, size_t)` from `<linux/fs.h>`.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// `BLKDISCARD` = `_IO(0x12, 119)`.
const BLKDISCARD: libc::c_ulong = 0x1277;

impl FileDevice {
    /// Opens an existing file or block device read-write and locks it.
    pub fn open(path: &Path) -> Result<FileDevice, VdevError> {
        let (name, meta) = stat_device(path)?;
        let ft = meta.file_type();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| VdevError::io(&name, e))?;
        lock(&file, &name, libc::LOCK_EX)?;
        let len_bytes = if ft.is_block_device() {
            block_device_size(&file, &name)?
        } else {
            meta.len()
        };
        // The lock on `file` guards the device; this second descriptor shares it.
        let direct = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok();
        Ok(FileDevice {
            file,
            direct,
            path: name,
            len_bytes,
            is_block_device: ft.is_block_device(),
            unstarted: std::sync::atomic::AtomicUsize::new(0),
            nowait_reads: std::sync::atomic::AtomicBool::new(true),
            read_only: false,
        })
    }

    /// Opens an existing file or block device for reading only, under a shared lock: other
    /// read-only opens may share the device, `open` (which takes the lock exclusively) may
    /// not, so nothing writes the device while a read-only pool reads it.
    pub fn open_read_only(path: &Path) -> Result<FileDevice, VdevError> {
        let dev = Self::open_to_inspect(path)?;
        lock(&dev.file, &dev.path, libc::LOCK_SH)?;
        Ok(dev)
    }

    /// Creates a new sparse file of `len_bytes` (refusing to overwrite an existing path) and
    /// opens it.
    pub fn create(path: &Path, len_bytes: u64) -> Result<FileDevice, VdevError> {
        Self::create_with(path, len_bytes, false)
    }

    /// `create`, with every block of the file allocated at once if `prealloc`: the file
    /// system then cannot run out of room under the pool later (a sparse file takes its
    /// blocks on first write, and a full file system suspends the pool). Fails with
    /// `ENOSPC` if the room is not there now, and where the file system cannot allocate
    /// without writing (`fallocate` unsupported) rather than write the whole file.
    pub fn create_with(
        path: &Path,
        len_bytes: u64,
        prealloc: bool,
    ) -> Result<FileDevice, VdevError> {
        let name = path.display().to_string();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| VdevError::io(&name, e))?;
        file.set_len(len_bytes)
            .map_err(|e| VdevError::io(&name, e))?;
        if prealloc && len_bytes > 0 {
            // Checked first: a file system takes the blocks of a failing fallocate one extent
            // at a time and gives them back only when the file goes, so for a moment it
            // would be full for everyone else on it too.
            let free = free_bytes(path);
            let r = if free.is_some_and(|f| f < len_bytes) {
                -1
            } else {
                // SAFETY: fallocate takes the descriptor of a file we hold open and integers.
                unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len_bytes as libc::off_t) }
            };
            if r != 0 {
                let e = match free {
                    Some(f) if f < len_bytes => std::io::Error::from_raw_os_error(libc::ENOSPC),
                    _ => std::io::Error::last_os_error(),
                };
                // The file is ours (create_new): a failed create leaves nothing behind.
                drop(file);
                let _ = std::fs::remove_file(path);
                return Err(VdevError::io(
                    &format!("{name}: preallocating {len_bytes} bytes"),
                    e,
                ));
            }
        }
        drop(file);
        Self::open(path)
    }
}

impl FileDevice {
    /// Opens a file or block device read-only and without its lock, to look at what it holds
    /// before a command writes over it (`dsl::examine`). Writes through it fail.
    pub fn open_to_inspect(path: &Path) -> Result<FileDevice, VdevError> {
        let (name, meta) = stat_device(path)?;
        let ft = meta.file_type();
        let file = File::open(path).map_err(|e| VdevError::io(&name, e))?;
        let len_bytes = if ft.is_block_device() {
            block_device_size(&file, &name)?
        } else {
            meta.len()
        };
        Ok(FileDevice {
            file,
            direct: None,
            path: name,
            len_bytes,
            is_block_device: ft.is_block_device(),
            unstarted: std::sync::atomic::AtomicUsize::new(0),
            nowait_reads: std::sync::atomic::AtomicBool::new(true),
            read_only: true,
        })
    }

    /// The byte ranges that may hold data, in order: a regular file's data extents as the
    /// file system reports them (`SEEK_DATA`/`SEEK_HOLE`; the whole file where it cannot
    /// tell), at most `max` of them; a block device, which has no holes, its whole length.
    pub fn data_extents(&self, max: usize) -> Vec<(u64, u64)> {
        let whole = vec![(0, self.len_bytes)];
        if self.is_block_device || self.len_bytes == 0 {
            return if self.len_bytes == 0 {
                Vec::new()
            } else {
                whole
            };
        }
        let fd = self.file.as_raw_fd();
        let seek = |at: u64, whence: libc::c_int| -> Option<u64> {
            // SAFETY: lseek on a descriptor this device owns; no memory is passed. Its file
            // offset is not used by any other call here (all I/O is positioned).
            let r = unsafe { libc::lseek(fd, at as libc::off_t, whence) };
            (r >= 0).then_some(r as u64)
        };
        let mut out = Vec::new();
        let mut at = 0;
        while at < self.len_bytes && out.len() < max {
            let Some(start) = seek(at, libc::SEEK_DATA) else {
                // ENXIO: no data past `at`; any other failure: the file system cannot say.
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                    break;
                }
                return whole;
            };
            let end = seek(start, libc::SEEK_HOLE).unwrap_or(self.len_bytes);
            out.push((start, end.min(self.len_bytes)));
            at = end;
        }
        out
    }
}

/// `path`'s name for errors and its metadata, if it is a regular file or a block device.
fn stat_device(path: &Path) -> Result<(String, std::fs::Metadata), VdevError> {
    let name = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => VdevError::Missing { path: name.clone() },
        _ => VdevError::io(&name, e),
    })?;
    let ft = meta.file_type();
    if !ft.is_file() && !ft.is_block_device() {
        return Err(VdevError::NotAFileOrBlockDevice { path: name });
    }
    Ok((name, meta))
}

/// Whether another open descriptor of `path`, in this process or another, holds the
/// device lock that `FileDevice::open` (exclusive) or `open_read_only` (shared) takes: the
/// path is a device of a pool that is open right now. A path that cannot be opened is not
/// held.
pub fn held_as_device(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    // SAFETY: flock on a descriptor owned here; no memory is passed. An exclusive lock
    // conflicts with either kind, and it goes with `file` at the end of this function (an
    // open that meets it meanwhile waits `LOCK_PATIENCE` for it).
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
}

/// Free bytes of the file system holding `path`, as an unprivileged writer sees them.
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: all-zero bytes are a valid `statvfs` (plain integers).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a live, writable `statvfs`.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// A copy of a buffer in memory aligned to the pool's `SECTOR`, as `O_DIRECT` requires (4K
/// covers devices of 512-byte and of 4K logical sectors).
struct SectorBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl SectorBuf {
    /// `src` must be a non-empty whole number of sectors.
    fn copy_of(src: &[u8]) -> SectorBuf {
        let sector = SECTOR as usize;
        assert!(!src.is_empty() && src.len().is_multiple_of(sector));
        let layout = std::alloc::Layout::from_size_align(src.len(), sector).expect("sector layout");
        // SAFETY: the layout has a non-zero size (asserted above).
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        // SAFETY: `ptr` is a fresh allocation of `src.len()` bytes, which cannot overlap
        // `src`; both are valid for that many bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr.as_ptr(), src.len()) };
        SectorBuf { ptr, layout }
    }

    fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for SectorBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `copy_of` with this very layout, and freed only here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Vectored writes of at least this many bytes count towards starting writeback.
const WRITEBACK_MIN_BYTES: usize = 64 << 10;

/// Writeback of the whole file is started once this much has been written in large writes
/// since the last start. Started per write (every 128K NBD write, say), each call was a
/// separate kick of the device, in a virtual machine an exit to the host; gathered, one
/// call submits them together and the device sees fewer, larger requests.
const WRITEBACK_BATCH_BYTES: usize = 4 << 20;

/// Which way `vectored` moves the bytes.
#[derive(Clone, Copy, PartialEq)]
enum Op {
    Read,
    /// `pwritev2` with these `RWF_*` flags (0: a plain `pwritev`).
    Write(libc::c_int),
}

/// The most buffers one `preadv`/`pwritev` takes (Linux's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// Buffers of a write that go in an array on the stack rather than a vector.
const STACK_IOVECS: usize = 32;

/// `preadv`/`pwritev2` over all of `iov` from `offset`, in calls of at most `IOV_MAX` buffers,
/// resuming after short transfers and `EINTR`. `iov` describes live buffers the caller holds
/// for the whole call (mutable ones for a read); it is consumed as the transfer advances.
fn vectored(file: &File, iov: &mut [libc::iovec], offset: u64, op: Op) -> std::io::Result<()> {
    let write = op != Op::Read;
    let mut at = 0usize;
    let mut off = offset;
    while at < iov.len() {
        if iov[at].iov_len == 0 {
            at += 1;
            continue;
        }
        let n = (iov.len() - at).min(IOV_MAX);
        let chunk = &iov[at..at + n];
        // SAFETY: every iovec points into a buffer the caller keeps alive and (for a read)
        // exclusively borrowed until this function returns; the kernel touches at most
        // `iov_len` bytes of each. The count passed is the length of that slice.
        let rc = unsafe {
            match op {
                Op::Write(flags) => libc::pwritev2(
                    file.as_raw_fd(),
                    chunk.as_ptr(),
                    n as libc::c_int,
                    off as libc::off_t,
                    flags,
                ),
                Op::Read => libc::preadv(
                    file.as_raw_fd(),
                    chunk.as_ptr(),
                    n as libc::c_int,
                    off as libc::off_t,
                ),
            }
        };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if rc == 0 {
            return Err(if write {
                std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    "failed to write whole buffer",
                )
            } else {
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "failed to fill whole buffer",
                )
            });
        }
        let mut done = rc as usize;
        off += done as u64;
        // Skip the buffers the call finished and move into the one it stopped in.
        while done > 0 {
            let v = &mut iov[at];
            if done >= v.iov_len {
                done -= v.iov_len;
                v.iov_len = 0;
                at += 1;
            } else {
                // SAFETY: `done < iov_len`, so the advanced pointer stays inside the buffer.
                v.iov_base = unsafe { v.iov_base.cast::<u8>().add(done) }.cast();
                v.iov_len -= done;
                done = 0;
            }
        }
    }
    Ok(())
}

/// How long opening a device waits for a lock held elsewhere to go before it reports the
/// device in use. A lock can outlive its holder's close by a moment: a process that starts a
/// command gives the child a copy of every descriptor, and the copy (and the lock through it)
/// lasts until the child's exec closes it. A pool closed and imported again while another
/// thread of the process started a command found its device still locked (`tests/raidz.rs`,
/// once in about twenty runs).
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(250);

/// Takes the device lock `how` (`LOCK_EX` to write the device, `LOCK_SH` to read it while
/// no one writes it), waiting up to `LOCK_PATIENCE` for a holder to go.
fn lock(file: &File, name: &str, how: libc::c_int) -> Result<(), VdevError> {
    let started = std::time::Instant::now();
    loop {
        // SAFETY: flock on a file descriptor we own for the duration of the call; no memory
        // is passed to the kernel.
        let rc = unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if started.elapsed() < LOCK_PATIENCE => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Some(libc::EWOULDBLOCK) => {
                return Err(VdevError::Locked {
                    path: name.to_string(),
                })
            }
            _ => return Err(VdevError::io(name, err)),
        }
    }
}

fn block_device_size(file: &File, name: &str) -> Result<u64, VdevError> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes exactly one u64 through the pointer, which points at a live,
    // properly aligned local.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc != 0 {
        return Err(VdevError::io(name, std::io::Error::last_os_error()));
    }
    Ok(size)
}

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> Result<(), VdevError> {
        check_range(self, offset_bytes, buf.len())?;
        self.file
            .read_exact_at(buf, offset_bytes)
            .map_err(|e| VdevError::io(&self.path, e))
    }

    /// `preadv2` with `RWF_NOWAIT`: the kernel copies from the page cache, or answers
    /// `EAGAIN` rather than wait for the device. A short read (part of the range cached)
    /// counts as not read. Kernels or file systems that refuse the flag (`EOPNOTSUPP`,
    /// `EINVAL`) are not asked again.
    fn read_at_nowait(&self, buf: &mut [u8], offset_bytes: u64) -> bool {
        self.read_vectored_at_nowait(&mut [buf], offset_bytes)
    }

    /// One `preadv2` with `RWF_NOWAIT` over all the buffers (at most `IOV_MAX` of them), as
    /// `read_at_nowait`.
    fn read_vectored_at_nowait(&self, bufs: &mut [&mut [u8]], offset_bytes: u64) -> bool {
        use std::sync::atomic::Ordering;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0
            || bufs.len() > IOV_MAX
            || !self.nowait_reads.load(Ordering::Relaxed)
            || check_range(self, offset_bytes, total).is_err()
        {
            return false;
        }
        let to_iov = |b: &mut &mut [u8]| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        };
        // One buffer (a short read served by an NBD reader) needs no allocation.
        let one: [libc::iovec; 1];
        let many: Vec<libc::iovec>;
        let iov: &[libc::iovec] = if let [b] = bufs {
            one = [to_iov(b)];
            &one
        } else {
            many = bufs.iter_mut().map(to_iov).collect();
            &many
        };
        // SAFETY: every iovec points into one of `bufs`, exclusively borrowed for the call;
        // the kernel writes at most `iov_len` bytes into each, and the count passed is the
        // slice's length (at most IOV_MAX, checked above).
        let rc = unsafe {
            libc::preadv2(
                self.file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                offset_bytes as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            if matches!(err.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) {
                self.nowait_reads.store(false, Ordering::Relaxed);
            }
            return false;
        }
        rc as usize == total
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> Result<(), VdevError> {
        check_range(self, offset_bytes, buf.len())?;
        self.file
            .write_all_at(buf, offset_bytes)
            .map_err(|e| VdevError::io(&self.path, e))
    }

    fn read_vectored_at(&self, bufs: &mut [&mut [u8]], offset_bytes: u64) -> Result<(), VdevError> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        check_range(self, offset_bytes, total)?;
        let mut iov: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        vectored(&self.file, &mut iov, offset_bytes, Op::Read)
            .map_err(|e| VdevError::io(&self.path, e))
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset_bytes: u64) -> Result<(), VdevError> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        check_range(self, offset_bytes, total)?;
        // The kernel only reads through these pointers for a write (`pwritev`).
        let to_iov = |b: &&[u8]| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        };
        // A run of a few blocks (a volume's 128K write: eight) needs no allocation.
        let mut few = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; STACK_IOVECS];
        let mut many: Vec<libc::iovec>;
        let iov: &mut [libc::iovec] = if bufs.len() <= STACK_IOVECS {
            for (slot, b) in few.iter_mut().zip(bufs) {
                *slot = to_iov(b);
            }
            &mut few[..bufs.len()]
        } else {
            many = bufs.iter().map(to_iov).collect();
            &mut many
        };
        vectored(&self.file, iov, offset_bytes, Op::Write(0))
            .map_err(|e| VdevError::io(&self.path, e))?;
        // Start writing the run back now, without waiting: the device works while the next
        // runs are copied in, and the flush that ends a txg finds little left to do (it
        // waited for a txg's worth of writeback before, which stalled the sync thread for a
        // third of its time under streaming writes). Only a hint: durability still comes
        // from `flush`, and an error here would show there, so the result is not needed.
        // Not for small writes (a txg's metadata, log blocks about to be flushed anyway):
        // each call kicks the device, which in a virtual machine is an exit to the host.
        if total < WRITEBACK_MIN_BYTES {
            return Ok(());
        }
        use std::sync::atomic::Ordering;
        if self.unstarted.fetch_add(total, Ordering::Relaxed) + total < WRITEBACK_BATCH_BYTES
            || self.unstarted.swap(0, Ordering::Relaxed) < WRITEBACK_BATCH_BYTES
        {
            return Ok(()); // not enough yet, or another writer has just started it
        }
        // SAFETY: sync_file_range takes only integers (0, 0: the whole file).
        unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
        Ok(())
    }

    /// `pwritev2` with `RWF_DSYNC`: the kernel writes this range and flushes the device's
    /// cache (and commits the file system's journal if the range needed new blocks), as
    /// `fdatasync` would, but leaves the rest of the file's dirty pages alone. An intent log
    /// commit then costs one small write, not the writeback of a whole txg.
    ///
    /// Whole 4K sectors go through the `O_DIRECT` descriptor, from the buffer itself if it
    /// starts on a sector boundary in memory (a `SectorVec`), else from an aligned copy
    /// (which with its allocation cost two thirds as much as encoding a log block): these
    /// are log blocks, read back only by a replay, and through the page cache each was
    /// copied in, then written back page by page before the call returned. (The kernel
    /// writes back and drops any cached pages of the range first, so the buffered
    /// descriptor's reads stay coherent.) Where the file system refuses the direct write,
    /// the buffered one is used. Kernels before 4.7 lack `RWF_DSYNC`: a plain write and
    /// `fdatasync` do the same, slower.
    fn write_durable(&self, buf: &[u8], offset_bytes: u64) -> Result<(), VdevError> {
        check_range(self, offset_bytes, buf.len())?;
        if let Some(direct) = &self.direct {
            if !buf.is_empty()
                && offset_bytes.is_multiple_of(SECTOR)
                && (buf.len() as u64).is_multiple_of(SECTOR)
            {
                let aligned = (buf.as_ptr() as usize).is_multiple_of(SECTOR as usize);
                let copy = (!aligned).then(|| SectorBuf::copy_of(buf));
                let from = copy.as_ref().map_or(buf.as_ptr(), SectorBuf::as_ptr);
                let mut iov = [libc::iovec {
                    iov_base: from as *mut libc::c_void,
                    iov_len: buf.len(),
                }];
                match vectored(direct, &mut iov, offset_bytes, Op::Write(libc::RWF_DSYNC)) {
                    Ok(()) => return Ok(()),
                    // Not for this file system or this request: the buffered way below.
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS)
                        ) => {}
                    Err(e) => return Err(VdevError::io(&self.path, e)),
                }
            }
        }
        let mut iov = [libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        }];
        match vectored(
            &self.file,
            &mut iov,
            offset_bytes,
            Op::Write(libc::RWF_DSYNC),
        ) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {
                self.write_at(buf, offset_bytes)?;
                self.flush()
            }
            r => r.map_err(|e| VdevError::io(&self.path, e)),
        }
    }

    fn flush(&self) -> Result<(), VdevError> {
        self.file
            .sync_data()
            .map_err(|e| VdevError::io(&self.path, e))
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VdevError> {
        check_range(self, offset_bytes, len_bytes as usize)?;
        if self.read_only {
            return Ok(());
        }
        let fd = self.file.as_raw_fd();
        let rc = if self.is_block_device {
            let range = [offset_bytes, len_bytes];
            // SAFETY: BLKDISCARD reads two u64s (start, length) from the pointer, which points
            // at a live local array of exactly that shape.
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        } else {
            // SAFETY: fallocate takes only integers; punching a hole keeps the file size.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset_bytes as libc::off_t,
                    len_bytes as libc::off_t,
                )
            }
        };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            // Discard is advisory: a device or file system that cannot do it loses nothing.
            if matches!(
                err.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY)
            ) {
                return Ok(());
            }
            return Err(VdevError::io(&self.path, err));
        }
        Ok(())
    }

    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    fn name(&self) -> &str {
        &self.path
    }

    fn read_only(&self) -> bool {
        self.read_only
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durable_writes_go_direct_where_they_can_and_reads_see_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leaf");
        let dev = FileDevice::create(&path, 1 << 20).unwrap();
        // Where the file system takes O_DIRECT, the device uses it.
        let direct_ok = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .is_ok();
        assert_eq!(dev.direct.is_some(), direct_ok);
        // The page cache holds older bytes of the range: a buffered write, read back.
        dev.write_at(&[1u8; 16384], 8192).unwrap();
        let mut back = vec![0u8; 16384];
        dev.read_at(&mut back, 8192).unwrap();
        // Whole sectors from a buffer that is not aligned in memory (the direct path copies
        // it), then a write of part of a sector (the buffered path).
        let mut src = vec![0u8; 12288 + 1];
        src[1..].fill(2);
        dev.write_durable(&src[1..], 8192).unwrap();
        dev.write_durable(&[3u8; 1000], 20480 + 100).unwrap();
        dev.write_durable(&[], 4096).unwrap();
        let mut want = vec![2u8; 12288];
        want.extend_from_slice(&[1u8; 100]);
        want.extend_from_slice(&[3u8; 1000]);
        want.resize(16384, 1);
        dev.read_at(&mut back, 8192).unwrap();
        assert_eq!(back, want);
        // And from a buffer aligned in memory (taken as it is): over the first sector.
        let mut aligned = crate::vdev::SectorVec::with_capacity(4096);
        aligned.resize(4096, 4);
        dev.write_durable(&aligned, 8192).unwrap();
        want[..4096].fill(4);
        dev.read_at(&mut back, 8192).unwrap();
        assert_eq!(back, want);
        // And through a descriptor of its own, as an import after a crash would read it.
        drop(dev);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[8192..8192 + 16384], &want[..]);
    }

    #[test]
    fn nowait_reads_serve_cached_bytes_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::create(&dir.path().join("leaf"), 1 << 20).unwrap();
        let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
        dev.write_at(&data, 65536).unwrap();
        let mut back = vec![0u8; data.len()];
        // Just written, so in the page cache: served at once where the kernel takes the flag.
        let served = dev.read_at_nowait(&mut back, 65536);
        let supported = dev.nowait_reads.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(served, supported);
        if served {
            assert_eq!(back, data);
        }
        assert!(
            !dev.read_at_nowait(&mut back, (1 << 20) - 4096),
            "past the end"
        );
        // Written back and dropped from the page cache (ext4, xfs: not tmpfs, whose pages are
        // the file): the read would wait for the device, so it is not made.
        dev.flush().unwrap();
        let evict = || {
            // SAFETY: fadvise on a descriptor we own; no memory is passed.
            let rc = unsafe {
                libc::posix_fadvise(dev.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
            };
            assert_eq!(rc, 0);
        };
        evict();
        // SAFETY: statfs is plain old data, for which all-zero bytes are a valid value.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: fstatfs writes one statfs into the live local it points at.
        let rc = unsafe { libc::fstatfs(dev.file.as_raw_fd(), &mut fs) };
        assert_eq!(rc, 0);
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        let mut again = vec![0u8; data.len()];
        let mut served = dev.read_at_nowait(&mut again, 65536);
        // An eviction may leave pages the kernel cannot drop at that moment (not yet on its
        // page lists, say): a run of the suite here saw the first one leave them cached. So
        // it is tried again, a few times; a read served meanwhile caches nothing new, and a
        // kernel that serves evicted pages fails every try.
        for _ in 0..50 {
            if !served {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            evict();
            served = dev.read_at_nowait(&mut again, 65536);
        }
        if supported && fs.f_type as i64 != TMPFS_MAGIC {
            assert!(
                !served,
                "a read of evicted pages was served without waiting"
            );
        }
        dev.read_at(&mut again, 65536).unwrap();
        assert_eq!(again, data);
    }

    #[test]
    fn vectored_io_matches_plain_io_past_the_iov_limit() {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::create(&dir.path().join("leaf"), 4 << 20).unwrap();
        // 1500 buffers of uneven sizes: more than one pwritev/preadv call's worth.
        let bufs: Vec<Vec<u8>> = (0..1500u32)
            .map(|i| vec![(i % 251) as u8; 512 + (i as usize % 3) * 512])
            .collect();
        let refs: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
        dev.write_vectored_at(&refs, 4096).unwrap();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut flat = vec![0u8; total];
        dev.read_at(&mut flat, 4096).unwrap();
        assert_eq!(flat, bufs.concat());
        let mut back: Vec<Vec<u8>> = bufs.iter().map(|b| vec![0u8; b.len()]).collect();
        let mut slices: Vec<&mut [u8]> = back.iter_mut().map(|b| b.as_mut_slice()).collect();
        dev.read_vectored_at(&mut slices, 4096).unwrap();
        assert_eq!(back, bufs);
        let mut past = [vec![0u8; 4096], vec![0u8; 4096]];
        let mut slices: Vec<&mut [u8]> = past.iter_mut().map(|b| b.as_mut_slice()).collect();
        assert!(matches!(
            dev.read_vectored_at(&mut slices, (4 << 20) - 4096),
            Err(VdevError::OutOfRange { .. })
        ));
    }

    #[test]
    fn create_read_write_and_exclusive_lock() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("leaf");
        let dev = FileDevice::create(&p, 1 << 20).unwrap();
        assert_eq!(dev.len_bytes(), 1 << 20);
        dev.write_at(&[5u8; 4096], 8192).unwrap();
        dev.flush().unwrap();
        let mut buf = [0u8; 4096];
        dev.read_at(&mut buf, 8192).unwrap();
        assert_eq!(buf, [5u8; 4096]);
        // A second open, even from this process, is refused while the first holds the lock.
        assert!(matches!(
            FileDevice::open(&p),
            Err(VdevError::Locked { .. })
        ));
        // A lock that goes within LOCK_PATIENCE (a closing holder's descriptor lingering in
        // a child about to exec) is waited for.
        drop(dev);
        let other = File::open(&p).unwrap();
        // SAFETY: flock on a descriptor owned by this test; no memory is passed.
        let rc = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
        assert_eq!(rc, 0);
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(other);
        });
        let dev = FileDevice::open(&p).expect("the lock went within the patience");
        release.join().unwrap();
        assert!(matches!(
            dev.read_at(&mut buf, (1 << 20) - 100),
            Err(VdevError::OutOfRange { .. })
        ));
        dev.discard(8192, 4096).unwrap();
        dev.read_at(&mut buf, 8192).unwrap();
        assert_eq!(buf, [0u8; 4096]);
        drop(dev);
        FileDevice::open(&p).unwrap();
        assert!(matches!(
            FileDevice::open(&dir.path().join("nope")),
            Err(VdevError::Missing { .. })
        ));
        assert!(matches!(
            FileDevice::open(dir.path()),
            Err(VdevError::NotAFileOrBlockDevice { .. })
        ));
    }
}
