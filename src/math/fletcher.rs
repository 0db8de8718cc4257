//! Fletcher-4 as ZFS defines it: four 64-bit running sums over the input read as little-endian
//! 32-bit words. A trailing partial word (length not a multiple of 4) is zero-padded, so every
//! length has a defined checksum (ZFS itself only ever checksums multiples of 512 bytes).

/// The four Fletcher-4 accumulators, `a` = Σ w, `b` = Σ a, `c` = Σ b, `d` = Σ c (all mod 2^64).
pub type Fletcher4 = [u64; 4];

/// Scalar reference: one word at a time, exactly the definition.
pub fn fletcher4_reference(data: &[u8]) -> Fletcher4 {
    let (mut a, mut b, mut c, mut d) = (0u64, 0u64, 0u64, 0u64);
    for chunk in data.chunks(4) {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        a = a.wrapping_add(u32::from_le_bytes(word) as u64);
        b = b.wrapping_add(a);
        c = c.wrapping_add(b);
        d = d.wrapping_add(c);
    }
    [a, b, c, d]
}

/// The production kernel: four words per step with the sums expanded in closed form, which
/// breaks the serial dependency chain of the reference so the CPU can overlap the additions.
///
/// For four words w0..w3 entering state (a, b, c, d):
///   a' = a + w0 + w1 + w2 + w3
///   b' = b + 4a + 4w0 + 3w1 + 2w2 + w3
///   c' = c + 4b + 10a + 10w0 + 6w1 + 3w2 + w3
///   d' = d + 4c + 10b + 20a + 20w0 + 10w1 + 4w2 + w3
/// (the coefficients are the binomial sums of the recurrence; checked against the reference).
pub fn fletcher4(data: &[u8]) -> Fletcher4 {
    let (mut a, mut b, mut c, mut d) = (0u64, 0u64, 0u64, 0u64);
    let mut blocks = data.chunks_exact(16);
    for blk in &mut blocks {
        let w0 = u32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]) as u64;
        let w1 = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]) as u64;
        let w2 = u32::from_le_bytes([blk[8], blk[9], blk[10], blk[11]]) as u64;
        let w3 = u32::from_le_bytes([blk[12], blk[13], blk[14], blk[15]]) as u64;
        let nd = d
            .wrapping_add(c.wrapping_mul(4))
            .wrapping_add(b.wrapping_mul(10))
            .wrapping_add(a.wrapping_mul(20))
            .wrapping_add(w0.wrapping_mul(20))
            .wrapping_add(w1.wrapping_mul(10))
            .wrapping_add(w2.wrapping_mul(4))
            .wrapping_add(w3);
        let nc = c
            .wrapping_add(b.wrapping_mul(4))
            .wrapping_add(a.wrapping_mul(10))
            .wrapping_add(w0.wrapping_mul(10))
            .wrapping_add(w1.wrapping_mul(6))
            .wrapping_add(w2.wrapping_mul(3))
            .wrapping_add(w3);
        let nb = b
            .wrapping_add(a.wrapping_mul(4))
            .wrapping_add(w0.wrapping_mul(4))
            .wrapping_add(w1.wrapping_mul(3))
            .wrapping_add(w2.wrapping_mul(2))
            .wrapping_add(w3);
        let na = a
            .wrapping_add(w0)
            .wrapping_add(w1)
            .wrapping_add(w2)
            .wrapping_add(w3);
        (a, b, c, d) = (na, nb, nc, nd);
    }
    for chunk in blocks.remainder().chunks(4) {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        a = a.wrapping_add(u32::from_le_bytes(word) as u64);
        b = b.wrapping_add(a);
        c = c.wrapping_add(b);
        d = d.wrapping_add(c);
    }
    [a, b, c, d]
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngCore, SeedableRng};

    #[test]
    fn known_values() {
        assert_eq!(fletcher4_reference(&[]), [0, 0, 0, 0]);
        // One word 1: a=1, b=1, c=1, d=1. Two words 1,2: a=3, b=4, c=5, d=6.
        assert_eq!(fletcher4_reference(&1u32.to_le_bytes()), [1, 1, 1, 1]);
        let two = [1u32.to_le_bytes(), 2u32.to_le_bytes()].concat();
        assert_eq!(fletcher4_reference(&two), [3, 4, 5, 6]);
    }

    #[test]
    fn fast_kernel_matches_reference_for_all_small_lengths_and_large_buffers() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xf1e7c4e5);
        let mut buf = vec![0u8; 1 << 20];
        rng.fill_bytes(&mut buf);
        for len in 0..=1031 {
            assert_eq!(
                fletcher4(&buf[..len]),
                fletcher4_reference(&buf[..len]),
                "len {len}"
            );
        }
        for len in [4096, 16384, 131072 + 7, 1 << 20] {
            assert_eq!(
                fletcher4(&buf[..len]),
                fletcher4_reference(&buf[..len]),
                "len {len}"
            );
        }
        // Saturated words exercise the wrapping arithmetic.
        let ones = vec![0xffu8; 65536];
        assert_eq!(fletcher4(&ones), fletcher4_reference(&ones));
    }
}
