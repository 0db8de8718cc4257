//! The fragmentation metric: how much of the free space lies in segments too small to hold
//! large blocks. Each free byte is weighted by the size class of the segment it lies in (a
//! byte in a 512-byte sliver counts 100, one in a segment of 512M or more counts 0), and a
//! metaslab's, vdev's or pool's percentage is the mean over its free bytes. The weights are
//! OpenZFS's (`zfs_frag_table`): a pool that reads 40 % here reads about that in `zpool list`.
//!
//! The metric is exact: it weights each segment's own bytes (`Histogram::bytes`), not the
//! bucket's lower bound times its count as OpenZFS's persisted histogram must. One change:
//! a metaslab wholly free counts 0, whatever its size. OpenZFS's metaslabs are 512M and up,
//! where a whole one weighs 0 by the table; zeta sizes them for about 200 a vdev (32M on a
//! 4G file, 1M on small pools), and by the table alone a fresh pool would read 12-43 %.

use super::range_tree::Histogram;

/// The weight of a free byte in a segment of 2^(9+i) bytes: 512 B, 1K, ... 512M and up.
const WEIGHTS: [u64; 21] = [
    100, 99, 97, 93, 88, 83, 77, 71, 64, 57, 50, 43, 36, 29, 23, 17, 12, 7, 3, 1, 0,
];

/// The weight of bucket `b` (segments of 2^b to 2^(b+1)-1 bytes).
fn weight(b: usize) -> u64 {
    WEIGHTS[b.saturating_sub(9).min(WEIGHTS.len() - 1)]
}

/// The weighted free bytes of `h` (sum of weight × bytes) and its free bytes: the parts of a
/// mean that sums over metaslabs.
pub fn weighted(h: &Histogram) -> (u128, u64) {
    let mut w = 0u128;
    let mut free = 0u64;
    for b in 0..64 {
        w += weight(b) as u128 * h.bytes[b] as u128;
        free += h.bytes[b];
    }
    (w, free)
}

/// `weighted` for the free space of a metaslab of `size` bytes: none of it fragmented if
/// the metaslab is wholly free.
pub fn weighted_in(h: &Histogram, size: u64) -> (u128, u64) {
    match weighted(h) {
        (_, free) if free == size => (0, free),
        wf => wf,
    }
}

/// `w / free`, the mean weight, rounded to the nearest percent; 0 when nothing is free (a
/// full metaslab has no free space to be fragmented, as OpenZFS counts it).
pub fn mean(w: u128, free: u64) -> u8 {
    if free == 0 {
        return 0;
    }
    let pct = (w + free as u128 / 2) / free as u128;
    debug_assert!(pct <= 100);
    pct as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn percent(h: &Histogram) -> u8 {
        let (w, free) = weighted(h);
        mean(w, free)
    }

    #[test]
    fn one_large_segment_is_not_fragmented_and_slivers_are() {
        let mut h = Histogram::default();
        h.add(1 << 30);
        assert_eq!(percent(&h), 0);
        let mut h = Histogram::default();
        h.add(512);
        h.add(700);
        assert_eq!(percent(&h), 100);
        // Half the bytes in 8K holes (88), half in one 16M segment (17): 52.5, rounded up.
        let mut h = Histogram::default();
        for _ in 0..2048 {
            h.add(8192);
        }
        h.add(16 << 20);
        assert_eq!(percent(&h), 53);
        assert_eq!(percent(&Histogram::default()), 0);
    }

    #[test]
    fn sizes_below_a_sector_weigh_as_a_sector_and_above_512m_as_512m() {
        assert_eq!(weight(0), 100);
        assert_eq!(weight(9), 100);
        assert_eq!(weight(13), 88);
        assert_eq!(weight(29), 0);
        assert_eq!(weight(63), 0);
    }
}
