//! Where labels live on a leaf. Every leaf carries `LABEL_COUNT` labels of `LABEL_SIZE` bytes:
//! two at the front and two at the back, so that a device overwritten at either end by mistake
//! still identifies itself. Allocatable space lies between them.

/// The smallest unit of I/O zeta issues; every allocation is a multiple of it.
pub const SECTOR: u64 = 4096;
pub const LABEL_SIZE: u64 = 256 * 1024;
pub const LABEL_COUNT: usize = 4;
/// Bytes reserved at each end of a leaf for its two labels.
pub const RESERVE_BYTES: u64 = 2 * LABEL_SIZE;

/// What a label cleared by zeta starts with (`spa::label::clear_labels`: a device removed
/// from a pool, replaced, or given `zeta pool labelclear`): no pool's label, and a sign
/// that the blocks after it were a pool's, not someone's data, so a new pool may take the
/// device without `-f`.
pub const FREED_MAGIC: &[u8; 8] = b"ZETAFREE";

/// Byte offset of label `index` (0..4) on a leaf of `leaf_bytes` bytes (already sector-aligned).
pub fn label_offset(index: usize, leaf_bytes: u64) -> u64 {
    assert!(index < LABEL_COUNT);
    let leaf_bytes = leaf_bytes / SECTOR * SECTOR;
    match index {
        0 => 0,
        1 => LABEL_SIZE,
        2 => leaf_bytes - 2 * LABEL_SIZE,
        _ => leaf_bytes - LABEL_SIZE,
    }
}

/// Usable bytes between the front and back labels, or None if the leaf is too small to hold
/// even its labels.
pub fn usable_bytes(leaf_bytes: u64) -> Option<u64> {
    let aligned = leaf_bytes / SECTOR * SECTOR;
    aligned.checked_sub(2 * RESERVE_BYTES).filter(|&u| u > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_do_not_overlap_data() {
        let leaf = 64 * 1024 * 1024 + 1234;
        let usable = usable_bytes(leaf).unwrap();
        assert_eq!(label_offset(2, leaf), RESERVE_BYTES + usable);
        assert_eq!(label_offset(3, leaf) + LABEL_SIZE, leaf / SECTOR * SECTOR);
        assert_eq!(usable_bytes(2 * RESERVE_BYTES), None);
    }
}
