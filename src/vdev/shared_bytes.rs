//! Read-only byte slices that share a buffer (`SharedBytes`), and the arena that packs short
//! payloads side by side into shared chunks (`Arena`).
//!
//! A short write becomes a patch piece of the open txg and a record of the intent log, and
//! both keep its bytes until the txg syncs. Held as one heap buffer per write, allocation
//! was about a quarter of the server's samples under 4K sync writes: each payload allocated
//! by a connection, freed by the sync thread (taking the lock of the arena it came from),
//! and, near the memory budget, the freed heap handed back and faulted in again. An `Arena`
//! writes one connection's payloads one after another into a chunk of `CHUNK_BYTES` mapped
//! apart from the heap. A chunk goes back whole when the last slice of it is dropped, which
//! is at the sync of the last txg its writes went into: a few are kept for the next
//! payloads, the rest unmapped. Each live chunk counts in a gauge its arena was given (the
//! pool's), so a chunk that a few surviving pieces keep alive counts in full.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// The size of an arena's chunks: 256 payloads of 4K.
pub const CHUNK_BYTES: usize = 1 << 20;

/// The longest payload an arena takes: a sixteenth of a chunk, so that a chunk given up
/// because the next payload does not fit wastes at most that.
pub const ARENA_MAX_BYTES: usize = CHUNK_BYTES / 16;

/// How many freed chunks are kept for reuse, process-wide. A txg's sync frees its chunks all
/// at once (up to the dirty limit), far more than any number worth keeping idle; these
/// cover the chunks that come and go between syncs.
const SPARE_CHUNKS: usize = 8;

/// Freed chunks kept for reuse, by address.
static SPARE: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// `len` bytes from `start` of a buffer shared with other slices and holders, read-only.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Owner,
    start: usize,
    len: usize,
}

#[derive(Clone)]
enum Owner {
    Heap(Arc<Vec<u8>>),
    Chunk(Arc<Chunk>),
}

impl SharedBytes {
    /// All of `data`.
    pub fn from_vec(data: Vec<u8>) -> SharedBytes {
        let len = data.len();
        SharedBytes::shared(Arc::new(data), 0, len)
    }

    /// `buf[start..start + len]`, without copying.
    pub fn shared(buf: Arc<Vec<u8>>, start: usize, len: usize) -> SharedBytes {
        assert!(start + len <= buf.len());
        SharedBytes {
            owner: Owner::Heap(buf),
            start,
            len,
        }
    }

    /// The whole heap buffer, if this slice is all of one (a whole-block write sharing the
    /// dirty block's buffer).
    pub fn whole_buffer(&self) -> Option<&Arc<Vec<u8>>> {
        match &self.owner {
            Owner::Heap(buf) if self.start == 0 && self.len == buf.len() => Some(buf),
            _ => None,
        }
    }

    /// Bytes this slice keeps alive that no gauge counts: the whole heap buffer it is a
    /// slice of, or nothing for a slice of an arena's chunk (the chunk counts, whole, in
    /// its arena's gauge).
    pub fn held_bytes(&self) -> usize {
        match &self.owner {
            Owner::Heap(buf) => buf.len(),
            Owner::Chunk(_) => 0,
        }
    }

    /// Whether this slice lies in an arena's chunk.
    pub fn in_arena(&self) -> bool {
        matches!(self.owner, Owner::Chunk(_))
    }
}

impl std::ops::Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.owner {
            Owner::Heap(buf) => &buf[self.start..self.start + self.len],
            // SAFETY: `start + len <= CHUNK_BYTES` (checked in `Arena::take`), inside the
            // mapping, which lives as long as this `Arc` to its chunk. The arena wrote these
            // bytes before it made this slice and writes only at or past its fill, which it
            // moved past them then: nothing writes them while any slice of them exists.
            Owner::Chunk(c) => unsafe {
                std::slice::from_raw_parts(c.ptr.add(self.start), self.len)
            },
        }
    }
}

impl PartialEq for SharedBytes {
    fn eq(&self, other: &SharedBytes) -> bool {
        **self == **other
    }
}
impl Eq for SharedBytes {}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} bytes)", self.len)
    }
}

/// `CHUNK_BYTES` of anonymous memory, mapped by `map_chunk`, counted in `gauge` while it lives.
struct Chunk {
    ptr: *mut u8,
    gauge: Arc<AtomicU64>,
}

// SAFETY: a chunk owns its mapping, which no other value frees or maps. Bytes a slice covers
// are only read; the one arena holding the chunk writes only bytes past every slice, through
// its own `&mut`. So sharing and sending chunks between threads races on nothing.
unsafe impl Send for Chunk {}
// SAFETY: as for `Send`.
unsafe impl Sync for Chunk {}

impl Drop for Chunk {
    fn drop(&mut self) {
        self.gauge.fetch_sub(CHUNK_BYTES as u64, Ordering::Relaxed);
        let mut spare = SPARE.lock();
        if spare.len() < SPARE_CHUNKS {
            spare.push(self.ptr as usize);
            return;
        }
        drop(spare);
        // SAFETY: `ptr` is a mapping of `CHUNK_BYTES` made by `map_chunk`, which nothing
        // uses any more: this was its last holder, and it is not kept as a spare.
        unsafe { libc::munmap(self.ptr.cast(), CHUNK_BYTES) };
    }
}

/// A spare chunk, or a new mapping (its pages faulted in at once: one call instead of a fault
/// per page as the payloads arrive). `None` if the system has no memory to map.
fn map_chunk() -> Option<*mut u8> {
    if let Some(addr) = SPARE.lock().pop() {
        return Some(addr as *mut u8);
    }
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
    // existing memory.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            CHUNK_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    (ptr != libc::MAP_FAILED).then_some(ptr.cast())
}

/// Writes short payloads side by side into shared chunks, each taken as a `SharedBytes`.
/// One per writer (an NBD connection); its chunks count in the gauge it was made with.
pub struct Arena {
    chunk: Option<Arc<Chunk>>,
    /// Bytes of `chunk` handed out: slices cover only bytes before it.
    fill: usize,
    gauge: Arc<AtomicU64>,
}

impl Arena {
    pub fn new(gauge: Arc<AtomicU64>) -> Arena {
        Arena {
            chunk: None,
            fill: 0,
            gauge,
        }
    }

    /// `len` bytes (at most `ARENA_MAX_BYTES`) that `fill` writes, as a slice of the current
    /// chunk, or of a new one if they do not fit. If `fill` fails, nothing is taken and the
    /// same room goes to the next payload. The bytes `fill` is given hold whatever they held
    /// (zeros, or an earlier payload of a reused chunk): it must write all of them.
    ///
    /// Where no chunk can be mapped, the bytes go into a heap buffer of their own.
    pub fn take<E>(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<SharedBytes, E> {
        assert!(
            len <= ARENA_MAX_BYTES,
            "{len} bytes is too long for an arena"
        );
        if self.chunk.is_none() || self.fill + len > CHUNK_BYTES {
            self.chunk = None;
            self.fill = 0;
            let Some(ptr) = map_chunk() else {
                let mut buf = vec![0u8; len];
                fill(&mut buf)?;
                return Ok(SharedBytes::from_vec(buf));
            };
            self.gauge.fetch_add(CHUNK_BYTES as u64, Ordering::Relaxed);
            self.chunk = Some(Arc::new(Chunk {
                ptr,
                gauge: self.gauge.clone(),
            }));
        }
        let chunk = self
            .chunk
            .as_ref()
            .expect("a chunk was just made if none was held");
        // SAFETY: `fill + len <= CHUNK_BYTES`, inside the mapping, which `chunk` keeps alive
        // for the call. Every slice of the chunk ends at or before `fill`, so no reference to
        // these bytes exists; `&mut self` makes this the only writer. The mapping's bytes are
        // always initialised (zeros when mapped, or what an earlier payload left).
        let room = unsafe { std::slice::from_raw_parts_mut(chunk.ptr.add(self.fill), len) };
        fill(room)?;
        let bytes = SharedBytes {
            owner: Owner::Chunk(chunk.clone()),
            start: self.fill,
            len,
        };
        self.fill += len;
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(arena: &mut Arena, len: usize, byte: u8) -> SharedBytes {
        arena
            .take(len, |b| {
                b.fill(byte);
                Ok::<(), ()>(())
            })
            .unwrap()
    }

    #[test]
    fn payloads_share_a_chunk_and_keep_their_bytes() {
        let gauge = Arc::new(AtomicU64::new(0));
        let mut arena = Arena::new(gauge.clone());
        let a = filled(&mut arena, 4096, 1);
        let b = filled(&mut arena, 100, 2);
        let c = filled(&mut arena, 4096, 3);
        assert_eq!(gauge.load(Ordering::Relaxed), CHUNK_BYTES as u64);
        assert!(a.iter().all(|&x| x == 1) && a.len() == 4096);
        assert!(b.iter().all(|&x| x == 2) && b.len() == 100);
        assert!(c.iter().all(|&x| x == 3) && c.len() == 4096);
        assert_eq!(a.held_bytes(), 0);
        assert!(a.in_arena() && a.whole_buffer().is_none());
        // A failed fill takes nothing: the next payload gets the same room.
        assert!(arena.take(4096, |_| Err("gone")).is_err());
        let d = filled(&mut arena, 8, 4);
        assert_eq!(d.as_ptr() as usize, c.as_ptr() as usize + 4096);
    }

    #[test]
    fn a_chunk_counts_until_its_last_slice_goes() {
        let gauge = Arc::new(AtomicU64::new(0));
        let mut arena = Arena::new(gauge.clone());
        let first = filled(&mut arena, ARENA_MAX_BYTES, 7);
        let rest: Vec<SharedBytes> = (1..16)
            .map(|i| filled(&mut arena, ARENA_MAX_BYTES, i as u8))
            .collect();
        // Sixteen fill the chunk; the seventeenth starts another.
        assert_eq!(gauge.load(Ordering::Relaxed), CHUNK_BYTES as u64);
        let next = filled(&mut arena, 1, 9);
        assert_eq!(gauge.load(Ordering::Relaxed), 2 * CHUNK_BYTES as u64);
        drop(rest);
        // One slice of the first chunk still holds all of it.
        assert_eq!(gauge.load(Ordering::Relaxed), 2 * CHUNK_BYTES as u64);
        assert!(first.iter().all(|&x| x == 7));
        drop(first);
        assert_eq!(gauge.load(Ordering::Relaxed), CHUNK_BYTES as u64);
        drop(arena);
        assert_eq!(*next, [9]);
        drop(next);
        assert_eq!(gauge.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn slices_of_heap_buffers_say_what_they_hold() {
        let buf = Arc::new(vec![5u8; 64]);
        let whole = SharedBytes::shared(buf.clone(), 0, 64);
        let part = SharedBytes::shared(buf.clone(), 8, 16);
        assert!(Arc::ptr_eq(whole.whole_buffer().unwrap(), &buf));
        assert!(part.whole_buffer().is_none());
        assert_eq!((part.len(), part.held_bytes()), (16, 64));
        assert!(!part.in_arena());
        assert_eq!(SharedBytes::from_vec(vec![5u8; 16]), part);
    }

    #[test]
    fn slices_cross_threads_and_outlive_their_arena() {
        let gauge = Arc::new(AtomicU64::new(0));
        let mut arena = Arena::new(gauge.clone());
        let slices: Vec<SharedBytes> = (0..1000)
            .map(|i| filled(&mut arena, 4096, i as u8))
            .collect();
        drop(arena);
        let handle = std::thread::spawn(move || {
            for (i, s) in slices.iter().enumerate() {
                assert!(s.iter().all(|&x| x == i as u8));
            }
        });
        handle.join().unwrap();
        assert_eq!(gauge.load(Ordering::Relaxed), 0);
    }
}
