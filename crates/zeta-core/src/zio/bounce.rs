//! Bounce buffers for batched reads of compressed blocks: a compressed block's stored bytes are
//! read into one, verified there and decompressed into the caller's buffer. They are kept
//! between batches (up to `KEPT_BYTES`), so a stream of compressed reads does not allocate and
//! zero a buffer per block.

use parking_lot::Mutex;

/// The most bytes of bounce buffers kept between batches: a few batches of 128K blocks.
const KEPT_BYTES: usize = 8 << 20;

struct Kept {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    bufs: Vec::new(),
    bytes: 0,
});

/// Buffers of the lengths `lens`, in order: kept ones where there are (their old bytes
/// left in them; a read overwrites every byte), else new.
pub fn take(lens: impl Iterator<Item = usize>) -> Vec<Vec<u8>> {
    let mut kept = KEPT.lock();
    lens.map(|len| match kept.bufs.pop() {
        Some(mut b) => {
            kept.bytes -= b.capacity();
            b.resize(len, 0);
            b
        }
        None => vec![0u8; len],
    })
    .collect()
}

/// Keeps `bufs` for the next batches, as far as `KEPT_BYTES` allows.
pub fn give_back(bufs: Vec<Vec<u8>>) {
    let mut kept = KEPT.lock();
    for b in bufs {
        if kept.bytes + b.capacity() > KEPT_BYTES {
            continue;
        }
        kept.bytes += b.capacity();
        kept.bufs.push(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_at_the_length_asked_and_the_kept_bytes_stay_bounded() {
        let bufs = take([4096, 8192].into_iter());
        assert_eq!(bufs.iter().map(Vec::len).collect::<Vec<_>>(), [4096, 8192]);
        give_back(bufs);
        let again = take([12288, 4096, 100].into_iter());
        assert_eq!(
            again.iter().map(Vec::len).collect::<Vec<_>>(),
            [12288, 4096, 100]
        );
        give_back(again);
        give_back((0..64).map(|_| vec![0u8; 1 << 20]).collect());
        assert!(KEPT.lock().bytes <= KEPT_BYTES);
    }
}
