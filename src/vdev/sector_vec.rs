//! A byte buffer whose contents start on a sector boundary in memory, filled by appending, so
//! a durable write can hand it to an `O_DIRECT` descriptor as it is (`FileDevice::write_durable`
//! copies any other buffer into an aligned one first).
//!
//! It is a `Vec` with a sector's worth of spare room in front, never grown past the capacity
//! asked for: a reallocation could move the contents off the boundary.

use super::SECTOR;

pub struct SectorVec {
    buf: Vec<u8>,
    /// Where the contents begin in `buf`: the first sector boundary.
    start: usize,
    /// The most bytes it may hold (`buf` has room for them past `start`).
    cap: usize,
}

impl SectorVec {
    /// An empty buffer that holds up to `cap` bytes.
    pub fn with_capacity(cap: usize) -> SectorVec {
        let sector = SECTOR as usize;
        let mut buf: Vec<u8> = Vec::with_capacity(cap + sector);
        let start = buf.as_ptr().align_offset(sector);
        assert!(
            start < sector,
            "a byte buffer can be aligned to any power of two"
        );
        buf.resize(start, 0);
        SectorVec { buf, start, cap }
    }

    fn room_for(&self, n: usize) {
        assert!(
            self.len() + n <= self.cap,
            "SectorVec filled past the capacity it was made with"
        );
    }

    pub fn push(&mut self, b: u8) {
        self.room_for(1);
        self.buf.push(b);
    }

    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.room_for(bytes.len());
        self.buf.extend_from_slice(bytes);
    }

    /// Sets the length to `len`, appending `value`s or dropping bytes at the end.
    pub fn resize(&mut self, len: usize, value: u8) {
        self.room_for(len.saturating_sub(self.len()));
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

impl std::fmt::Debug for SectorVec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SectorVec({} bytes)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contents_start_on_a_sector_boundary_and_stay_there() {
        for cap in [1usize, 100, 4096, 5000, 1 << 20] {
            let mut v = SectorVec::with_capacity(cap);
            assert!(v.is_empty());
            v.push(7);
            v.extend_from_slice(&vec![9u8; cap - 1]);
            assert_eq!(v.len(), cap);
            assert_eq!(v[0], 7);
            assert!((v.as_ptr() as usize).is_multiple_of(SECTOR as usize));
            v.resize(1, 0);
            v.resize(cap, 3);
            assert_eq!((v[0], v[cap - 1]), (7, if cap > 1 { 3 } else { 7 }));
            assert!((v.as_ptr() as usize).is_multiple_of(SECTOR as usize));
        }
    }

    #[test]
    #[should_panic(expected = "past the capacity")]
    fn filling_past_the_capacity_panics_rather_than_move() {
        let mut v = SectorVec::with_capacity(8);
        v.extend_from_slice(&[0u8; 9]);
    }
}
