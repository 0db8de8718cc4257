//! Block checksums: the algorithm enum recorded in every block pointer and a 256-bit value.
//!
//! All four algorithms give 32 bytes. Fletcher-2 and Fletcher-4 store their four 64-bit sums
//! as little-endian words; SHA-256 and BLAKE3 store their digests as is (BLAKE3's default
//! 32-byte output). SHA-256 comes from the `sha2` crate, which on x86-64 uses the SHA
//! extensions when `cpufeatures` finds them at run time (no crate feature needed; `force-soft`
//! would turn them off) and its portable code otherwise. BLAKE3 comes from the `blake3`
//! crate, which picks its SSE2/SSE4.1/AVX2/AVX-512 code at run time.

use sha2::{Digest, Sha256};

use super::fletcher::fletcher4;
use super::fletcher2::fletcher2;

/// Checksum algorithm. The numeric values are on-disk (block pointers, labels); never reuse one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChecksumKind {
    Fletcher4 = 1,
    Sha256 = 2,
    Fletcher2 = 3,
    Blake3 = 4,
}

impl ChecksumKind {
    /// Every algorithm, in the order user-facing lists name them.
    pub const ALL: [ChecksumKind; 4] =
        [Self::Fletcher2, Self::Fletcher4, Self::Sha256, Self::Blake3];

    /// The names `parse` accepts, for messages: "fletcher2, fletcher4, sha256, blake3".
    pub const NAMES: &'static str = "fletcher2, fletcher4, sha256, blake3";

    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Fletcher4),
            2 => Some(Self::Sha256),
            3 => Some(Self::Fletcher2),
            4 => Some(Self::Blake3),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Fletcher2 => "fletcher2",
            Self::Fletcher4 => "fletcher4",
            Self::Sha256 => "sha256",
            Self::Blake3 => "blake3",
        }
    }

    /// A name from [`NAMES`](Self::NAMES), or `on` (the default, fletcher4, as in ZFS).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "on" => Some(Self::Fletcher4),
            _ => Self::ALL.into_iter().find(|k| k.name() == s),
        }
    }

    /// The algorithm for the metadata of a pool or volume that uses `self` for its data:
    /// the same, except that fletcher2's weakness (two flipped top bits can cancel) is not
    /// accepted for the blocks everything else hangs from, as ZFS does too.
    pub fn for_metadata(self) -> Self {
        match self {
            Self::Fletcher2 => Self::Fletcher4,
            other => other,
        }
    }

    pub fn compute(self, data: &[u8]) -> Checksum {
        match self {
            Self::Fletcher2 => Checksum::from_words(fletcher2(data)),
            Self::Fletcher4 => Checksum::from_words(fletcher4(data)),
            Self::Sha256 => Checksum(Sha256::digest(data).into()),
            Self::Blake3 => Checksum(*blake3::hash(data).as_bytes()),
        }
    }
}

/// A 256-bit checksum value as stored on disk (module doc: Fletcher sums or a digest).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Checksum(pub [u8; 32]);

impl Checksum {
    /// Four 64-bit sums as four little-endian words (the Fletcher layout).
    pub fn from_words(words: [u64; 4]) -> Checksum {
        let mut out = [0u8; 32];
        for (slot, word) in out.chunks_exact_mut(8).zip(words) {
            slot.copy_from_slice(&word.to_le_bytes());
        }
        Checksum(out)
    }

    /// The four sums of a Fletcher checksum (`from_words` undone).
    pub fn to_words(&self) -> [u64; 4] {
        std::array::from_fn(|i| {
            u64::from_le_bytes(self.0[8 * i..8 * i + 8].try_into().expect("8 bytes"))
        })
    }
}

impl std::fmt::Debug for Checksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_published_vectors() {
        // FIPS 180-2, appendix B: one block, empty, two blocks, and a million 'a'.
        let cases: [(&[u8], &str); 3] = [
            (
                b"abc",
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            ),
            (
                b"",
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            ),
            (
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
                "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(hex(&ChecksumKind::Sha256.compute(input).0), want);
        }
        let million = vec![b'a'; 1_000_000];
        assert_eq!(
            hex(&ChecksumKind::Sha256.compute(&million).0),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
    }

    #[test]
    fn blake3_published_vectors() {
        // BLAKE3's test_vectors/test_vectors.json ("hash", first 32 bytes of the extended
        // output): the input is the repeating byte sequence 0, 1, ..., 250, 0, 1, ...
        let cases: [(usize, &str); 8] = [
            (
                0,
                "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
            ),
            (
                1,
                "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213",
            ),
            (
                1023,
                "10108970eeda3eb932baac1428c7a2163b0e924c9a9e25b35bba72b28f70bd11",
            ),
            (
                1024,
                "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7",
            ),
            (
                1025,
                "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444",
            ),
            (
                4096,
                "015094013f57a5277b59d8475c0501042c0b642e531b0a1c8f58d2163229e969",
            ),
            (
                8192,
                "aae792484c8efe4f19e2ca7d371d8c467ffb10748d8a5a1ae579948f718a2a63",
            ),
            (
                102400,
                "bc3e3d41a1146b069abffad3c0d44860cf664390afce4d9661f7902e7943e085",
            ),
        ];
        for (len, want) in cases {
            let input: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            assert_eq!(
                hex(&ChecksumKind::Blake3.compute(&input).0),
                want,
                "len {len}"
            );
        }
    }

    #[test]
    fn fletcher_values_are_their_sums_little_endian() {
        let words: Vec<u8> = [1u64, 2, 3, 4]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let f2 = ChecksumKind::Fletcher2.compute(&words);
        let f4 = ChecksumKind::Fletcher4.compute(&words);
        let sums = |c: Checksum| -> Vec<u64> {
            c.0.chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
                .collect()
        };
        assert_eq!(sums(f2), [4, 6, 5, 8]);
        assert_eq!(
            sums(f4),
            super::super::fletcher::fletcher4_reference(&words)
        );
    }

    #[test]
    fn kinds_round_trip_and_differ() {
        for k in ChecksumKind::ALL {
            assert_eq!(ChecksumKind::from_u8(k as u8), Some(k));
            assert_eq!(ChecksumKind::parse(k.name()), Some(k));
            assert!(ChecksumKind::NAMES.contains(k.name()));
        }
        let names: Vec<&str> = ChecksumKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(ChecksumKind::NAMES, names.join(", "));
        // On-disk numbers never change.
        assert_eq!(ChecksumKind::Fletcher4 as u8, 1);
        assert_eq!(ChecksumKind::Sha256 as u8, 2);
        assert_eq!(ChecksumKind::Fletcher2 as u8, 3);
        assert_eq!(ChecksumKind::Blake3 as u8, 4);
        assert_eq!(ChecksumKind::parse("on"), Some(ChecksumKind::Fletcher4));
        assert_eq!(ChecksumKind::parse("off"), None);
        assert_eq!(ChecksumKind::parse("SHA256"), None);
        for v in [0u8, 5, 255] {
            assert_eq!(ChecksumKind::from_u8(v), None);
        }
        let data = vec![7u8; 4096];
        let mut flipped = data.clone();
        flipped[100] ^= 1;
        for k in ChecksumKind::ALL {
            assert_ne!(k.compute(&data), k.compute(&flipped), "{k:?}");
        }
        // The four algorithms give four different values for the same block.
        let all: std::collections::HashSet<[u8; 32]> = ChecksumKind::ALL
            .iter()
            .map(|k| k.compute(&data).0)
            .collect();
        assert_eq!(all.len(), 4);
    }

    #[test]
    fn fletcher2_misses_half_of_the_double_top_bit_flips_the_others_catch() {
        // Words 0 and 4 are in stream 0, pairs 0 and 2: distances of equal parity, so the two
        // flips cancel in both sums (module doc of fletcher2). Words 0 and 2 (pairs 0 and 1)
        // do not cancel.
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        let flip = |words: [usize; 2]| {
            let mut d = data.clone();
            for w in words {
                d[w * 8 + 7] ^= 0x80;
            }
            d
        };
        let same_parity = flip([0, 4]);
        let other_parity = flip([0, 2]);
        let f2 = ChecksumKind::Fletcher2;
        assert_eq!(f2.compute(&data), f2.compute(&same_parity));
        assert_ne!(f2.compute(&data), f2.compute(&other_parity));
        for k in [
            ChecksumKind::Fletcher4,
            ChecksumKind::Sha256,
            ChecksumKind::Blake3,
        ] {
            assert_ne!(k.compute(&data), k.compute(&same_parity), "{k:?}");
        }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
