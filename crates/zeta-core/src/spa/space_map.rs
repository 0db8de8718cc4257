//! Space-map records: the append-only log of allocations and frees of one metaslab. Each
//! record is 16 bytes, little-endian: word 0 = vdev offset in bytes with bit 63 set for a
//! free; word 1 = length in bytes. Replaying a space map from the full range gives the free
//! space as of the txg whose uberblock recorded its length.

pub const RECORD_BYTES: usize = 16;
const FREE_BIT: u64 = 1 << 63;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmRecord {
    pub offset: u64,
    pub len: u64,
    pub free: bool,
}

impl SmRecord {
    pub fn encode(&self, out: &mut Vec<u8>) {
        debug_assert!(self.offset & FREE_BIT == 0);
        let w0 = self.offset | if self.free { FREE_BIT } else { 0 };
        out.extend_from_slice(&w0.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
    }

    pub fn decode(bytes: &[u8]) -> SmRecord {
        let w0 = u64::from_le_bytes(bytes[0..8].try_into().unwrap());
        let len = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
        SmRecord {
            offset: w0 & !FREE_BIT,
            len,
            free: w0 & FREE_BIT != 0,
        }
    }
}

pub fn encode_all(records: &[SmRecord]) -> Vec<u8> {
    let mut out = Vec::with_capacity(records.len() * RECORD_BYTES);
    for r in records {
        r.encode(&mut out);
    }
    out
}

pub fn decode_all(bytes: &[u8]) -> Vec<SmRecord> {
    bytes
        .chunks_exact(RECORD_BYTES)
        .map(SmRecord::decode)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let recs = vec![
            SmRecord {
                offset: 4096,
                len: 8192,
                free: false,
            },
            SmRecord {
                offset: (1 << 40) + 4096,
                len: 4096,
                free: true,
            },
        ];
        let bytes = encode_all(&recs);
        assert_eq!(bytes.len(), 32);
        assert_eq!(decode_all(&bytes), recs);
    }
}
