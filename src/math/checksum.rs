//! Block checksums: the algorithm enum recorded in every block pointer and a 256-bit value.

use sha2::{Digest, Sha256};

use super::fletcher::fletcher4;

/// Checksum algorithm. The numeric values are on-disk (block pointers, labels); never reuse one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChecksumKind {
    Fletcher4 = 1,
    Sha256 = 2,
}

impl ChecksumKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Fletcher4),
            2 => Some(Self::Sha256),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Fletcher4 => "fletcher4",
            Self::Sha256 => "sha256",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fletcher4" | "on" => Some(Self::Fletcher4),
            "sha256" => Some(Self::Sha256),
            _ => None,
        }
    }

    pub fn compute(self, data: &[u8]) -> Checksum {
        match self {
            Self::Fletcher4 => {
                let f = fletcher4(data);
                let mut out = [0u8; 32];
                for (i, word) in f.iter().enumerate() {
                    out[i * 8..i * 8 + 8].copy_from_slice(&word.to_le_bytes());
                }
                Checksum(out)
            }
            Self::Sha256 => Checksum(Sha256::digest(data).into()),
        }
    }
}

/// A 256-bit checksum value as stored on disk (fletcher4's four sums, little-endian).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Checksum(pub [u8; 32]);

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
        // FIPS 180-2 examples.
        let abc = ChecksumKind::Sha256.compute(b"abc");
        assert_eq!(
            hex(&abc.0),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let empty = ChecksumKind::Sha256.compute(b"");
        assert_eq!(
            hex(&empty.0),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn kinds_round_trip_and_differ() {
        for k in [ChecksumKind::Fletcher4, ChecksumKind::Sha256] {
            assert_eq!(ChecksumKind::from_u8(k as u8), Some(k));
            assert_eq!(ChecksumKind::parse(k.name()), Some(k));
        }
        assert_eq!(ChecksumKind::from_u8(0), None);
        let data = vec![7u8; 4096];
        let mut flipped = data.clone();
        flipped[100] ^= 1;
        for k in [ChecksumKind::Fletcher4, ChecksumKind::Sha256] {
            assert_ne!(k.compute(&data), k.compute(&flipped));
        }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
