//! A byte buffer whose contents start on a sector boundary in memory, filled by appending, so
//! a durable write can hand it to an `O_DIRECT` descriptor as it is (`FileDevice::write_durable`
//! copies any other buffer into an aligned one first).
//!
//! It is a `Vec` with up to a sector's worth of spare room in front. `Vec` would move the
//! contents to wherever its allocator puts a larger buffer, off the boundary; so growing
//! past the capacity is done here, into a new buffer aligned the same way. Sized right at
//! `with_capacity` (as a log block is), it never grows.

use super::SECTOR;

pub struct SectorVec {
    buf: Vec<u8>,
    /// Where the contents begin in `buf`: its first sector boundary.
    start: usize,
}

impl SectorVec {
    /// An empty buffer that holds `cap` bytes without moving.
    pub fn with_capacity(cap: usize) -> SectorVec {
        let sector = SECTOR as usize;
        let mut buf: Vec<u8> = Vec::with_capacity(cap + sector);
        // A byte pointer can always be aligned, within `sector - 1` bytes.
        let start = buf.as_ptr().align_offset(sector);
        buf.resize(start, 0);
        SectorVec { buf, start }
    }

    /// Makes room for `n` more bytes, moving the contents into a larger aligned buffer if
    /// `buf` would otherwise reallocate.
    fn reserve(&mut self, n: usize) {
        if self.buf.len() + n <= self.buf.capacity() {
            return;
        }
        let mut grown = SectorVec::with_capacity((self.len() + n).max(2 * self.len()));
        grown.buf.extend_from_slice(self);
        *self = grown;
    }

    pub fn push(&mut self, b: u8) {
        self.reserve(1);
        self.buf.push(b);
    }

    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        self.buf.extend_from_slice(bytes);
    }

    /// Sets the length to `len`, appending `value`s or dropping bytes at the end.
    pub fn resize(&mut self, len: usize, value: u8) {
        self.reserve(len.saturating_sub(self.len()));
        self.buf.resize(self.start + len, value);
    }
}

impl std::ops::Deref for SectorVec {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

impl std::ops::DerefMut for SectorVec {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aligned(v: &SectorVec) -> bool {
        (v.as_ptr() as usize).is_multiple_of(SECTOR as usize)
    }

    #[test]
    fn contents_start_on_a_sector_boundary_and_stay_there() {
        for cap in [1usize, 100, 4096, 5000, 1 << 20] {
            let mut v = SectorVec::with_capacity(cap);
            assert!(v.is_empty());
            let at = v.as_ptr();
            v.push(7);
            v.extend_from_slice(&vec![9u8; cap - 1]);
            assert_eq!(v.len(), cap);
            assert_eq!(v[0], 7);
            // Filled to its capacity, not moved.
            assert_eq!(v.as_ptr(), at);
            assert!(aligned(&v));
            v.resize(1, 0);
            v.resize(cap, 3);
            assert_eq!((v[0], v[cap - 1]), (7, if cap > 1 { 3 } else { 7 }));
            assert_eq!(v.as_ptr(), at);
        }
    }

    #[test]
    fn filling_past_the_capacity_moves_the_contents_to_an_aligned_buffer() {
        let mut v = SectorVec::with_capacity(8);
        v.extend_from_slice(&[1u8; 8]);
        // Past the capacity, several times over, by every way of filling.
        v.extend_from_slice(&[2u8; 5000]);
        v.push(3);
        v.resize(70_000, 4);
        assert!(aligned(&v));
        assert_eq!(v.len(), 70_000);
        assert_eq!(&v[..8], &[1u8; 8]);
        assert_eq!(&v[8..5008], &[2u8; 5000][..]);
        assert_eq!(v[5008], 3);
        assert!(v[5009..].iter().all(|&b| b == 4));
    }
}
