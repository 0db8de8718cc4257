//! What a device holds that is not zeta's: before `zeta pool create` (or `replace`, `add`)
//! writes labels over a device, it says what would be lost. The common on-disk signatures
//! are named; anything else that is not all zeros is "data".

use super::device::{BlockDevice, VdevError};
use super::layout::FREED_MAGIC;

/// A known format, recognised by its magic bytes at a fixed offset.
struct Signature {
    name: &'static str,
    offset: u64,
    magic: &'static [u8],
}

const SIGNATURES: &[Signature] = &[
    Signature {
        name: "an ext2/3/4 file system",
        offset: 1024 + 56,
        magic: &[0x53, 0xef],
    },
    Signature {
        name: "an XFS file system",
        offset: 0,
        magic: b"XFSB",
    },
    Signature {
        name: "a btrfs file system",
        offset: 65536 + 64,
        magic: b"_BHRfS_M",
    },
    Signature {
        name: "a LUKS encrypted volume",
        offset: 0,
        magic: b"LUKS\xba\xbe",
    },
    Signature {
        name: "a qcow2 disk image",
        offset: 0,
        magic: b"QFI\xfb",
    },
    Signature {
        name: "a GPT partition table",
        offset: 512,
        magic: b"EFI PART",
    },
    Signature {
        name: "Linux swap space",
        offset: 4096 - 10,
        magic: b"SWAPSPACE2",
    },
    // Last: a boot sector's mark is also found under some of the above.
    Signature {
        name: "an MBR partition table or boot sector",
        offset: 510,
        magic: &[0x55, 0xaa],
    },
];

/// How much of a device `foreign_contents` reads from the start of its data: a file or a
/// small disk whole; of a larger one, this much and then `SAMPLES` spread over the rest.
pub const SCAN_PREFIX_BYTES: u64 = 192 << 20;
const SAMPLES: u64 = 64;
const CHUNK: u64 = 1 << 20;

/// What a device holds besides zeta labels, in words ("an ext2/3/4 file system", "data
/// (non-zero bytes at offset 8192)"), or None if every byte read is zero. `extents` are the
/// ranges that may hold data (`FileDevice::data_extents`), in order.
pub fn foreign_contents(
    dev: &dyn BlockDevice,
    extents: &[(u64, u64)],
) -> Result<Option<String>, VdevError> {
    let len = dev.len_bytes();
    let mut head = vec![0u8; len.min(128 << 10) as usize];
    dev.read_at(&mut head, 0)?;
    // A device zeta cleared: what follows was a pool's, and the pool gave it up.
    if head.starts_with(FREED_MAGIC) {
        return Ok(None);
    }
    for sig in SIGNATURES {
        let at = sig.offset as usize;
        if head.get(at..at + sig.magic.len()) == Some(sig.magic) {
            return Ok(Some(sig.name.to_string()));
        }
    }
    let extents: Vec<(u64, u64)> = extents
        .iter()
        .map(|&(s, e)| (s.min(len), e.min(len)))
        .filter(|(s, e)| s < e)
        .collect();
    let mut buf = vec![0u8; CHUNK as usize];
    let mut look = |at: u64, end: u64| -> Result<Option<String>, VdevError> {
        let n = (end - at).min(CHUNK) as usize;
        dev.read_at(&mut buf[..n], at)?;
        Ok(buf[..n]
            .iter()
            .position(|&b| b != 0)
            .map(|i| format!("data (non-zero bytes at offset {})", at + i as u64)))
    };
    // The data's first `SCAN_PREFIX_BYTES`, in full.
    let mut budget = SCAN_PREFIX_BYTES;
    for &(start, end) in &extents {
        let mut at = start;
        while at < end && budget > 0 {
            let stop = end.min(at + budget.min(CHUNK));
            if let Some(found) = look(at, stop)? {
                return Ok(Some(found));
            }
            budget -= stop - at;
            at = stop;
        }
    }
    // Past that, samples spread evenly over all the data.
    let total: u64 = extents.iter().map(|(s, e)| e - s).sum();
    for i in 0..SAMPLES {
        let mut skip = total / SAMPLES * i;
        for &(start, end) in &extents {
            if skip < end - start {
                if let Some(found) = look(start + skip, end)? {
                    return Ok(Some(found));
                }
                break;
            }
            skip -= end - start;
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vdev::MemDevice;

    #[test]
    fn zeros_are_empty_and_signatures_and_data_are_named() {
        let dev = MemDevice::new("m", 4 << 20);
        let all = [(0, 4 << 20)];
        assert_eq!(foreign_contents(&dev, &all).unwrap(), None);
        dev.write_at(&[0x53, 0xef], 1080).unwrap();
        assert_eq!(
            foreign_contents(&dev, &all).unwrap().as_deref(),
            Some("an ext2/3/4 file system")
        );
        let dev = MemDevice::new("m", 4 << 20);
        dev.write_at(b"x", 3 << 20).unwrap();
        assert_eq!(
            foreign_contents(&dev, &all).unwrap().as_deref(),
            Some("data (non-zero bytes at offset 3145728)")
        );
        // Only the extents given are scanned past the signatures' sector.
        assert_eq!(foreign_contents(&dev, &[(0, 1 << 20)]).unwrap(), None);
        // Past the prefix read whole, samples find data spread over a large device.
        let big = MemDevice::new("big", SCAN_PREFIX_BYTES * 2);
        big.write_at(&[7; 4096], SCAN_PREFIX_BYTES * 3 / 2).unwrap();
        let found = foreign_contents(&big, &[(0, SCAN_PREFIX_BYTES * 2)]).unwrap();
        assert!(found.is_some_and(|f| f.starts_with("data")));
        // Labels zeta cleared say the rest is a former pool's, free to take.
        big.write_at(FREED_MAGIC, 0).unwrap();
        assert_eq!(
            foreign_contents(&big, &[(0, SCAN_PREFIX_BYTES * 2)]).unwrap(),
            None
        );
    }
}
