//! Whether a buffer holds only zeros: how a block of data becomes a hole.

/// True if every byte of `buf` is zero. Reads 64 bytes per step and stops at the first chunk
/// with a set bit, so a block of data costs a few loads and an all-zero block a pass at memory
/// speed (a byte loop took a cycle per byte, the sync thread's largest cost on fresh volumes).
pub fn is_zero(buf: &[u8]) -> bool {
    let mut chunks = buf.chunks_exact(64);
    for c in &mut chunks {
        // The fold over eight words compiles to a few vector ORs; no early exit inside a
        // chunk keeps it branch-free.
        let any = c.chunks_exact(8).fold(0u64, |acc, w| {
            acc | u64::from_ne_bytes(w.try_into().expect("8 bytes"))
        });
        if any != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_single_set_bit_anywhere() {
        for len in [0usize, 1, 7, 63, 64, 65, 4096, 4099] {
            let mut buf = vec![0u8; len];
            assert!(is_zero(&buf), "len {len}");
            for at in (0..len).step_by(13) {
                buf[at] = 0x10;
                assert!(!is_zero(&buf), "len {len} bit at {at}");
                buf[at] = 0;
            }
            if len > 0 {
                buf[len - 1] = 1;
                assert!(!is_zero(&buf), "len {len} last byte");
            }
        }
    }
}
