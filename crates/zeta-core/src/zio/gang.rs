//! Gang blocks (OpenZFS's): a block written in pieces because no free segment could take it
//! whole. Its pointer's DVAs are copies of a one-sector header naming the pieces in order,
//! each a block pointer of its own with as many copies; the whole block's checksum stays in
//! the parent, so a read assembles the pieces and verifies them as one block. A pool cut into
//! slivers by random overwrites thus still places a txg's blocks, at the cost of a header and
//! a seek per piece, instead of failing the sync (which suspends the pool).
//!
//! Only a txg sync's own blocks gang (`AllocClass::Recorded`, not durable): blocks written
//! ahead for the intent log are refused cleanly instead, so a log record never points at one.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::spa::{AllocClass, AllocError, Allocator, BlkPtr, Dvas};
use crate::vdev::SECTOR;
use zeta_math::ChecksumKind;

/// A gang header is one sector.
pub const HEADER_BYTES: usize = SECTOR as usize;

/// The most pieces one header names.
pub const MAX_PIECES: usize = 31;

/// Bytes of a header its checksum covers: all before the checksum.
const SUMMED_BYTES: usize = HEADER_BYTES - 32;

const MAGIC: u64 = u64::from_le_bytes(*b"zetagang");

/// The on-disk gang header (`docs/format.md` §4.4), little-endian.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct HeaderPhys {
    magic: U64,
    /// The gang block's birth txg and `psize`: a header is the one its pointer was written
    /// with, not an older one left where a new one was to be.
    birth_txg: U64,
    psize: U32,
    count: U32,
    pieces: [BlkPtr; MAX_PIECES],
    pad: [u8; 72],
    /// The header's first `SUMMED_BYTES` in the gang block's checksum algorithm.
    checksum: [u8; 32],
}

const _: () = assert!(std::mem::size_of::<HeaderPhys>() == HEADER_BYTES);

/// The header of gang block `bp` whose bytes lie in `pieces`, in order.
pub fn header(bp: &BlkPtr, pieces: &[BlkPtr]) -> Vec<u8> {
    assert!(!pieces.is_empty() && pieces.len() <= MAX_PIECES);
    let mut h = HeaderPhys::new_zeroed();
    h.magic = MAGIC.into();
    h.birth_txg = bp.birth_txg;
    h.psize = bp.psize;
    h.count = (pieces.len() as u32).into();
    h.pieces[..pieces.len()].copy_from_slice(pieces);
    let kind = bp.checksum_kind().expect("a written block's algorithm");
    let mut bytes = h.as_bytes().to_vec();
    let sum = kind.compute(&bytes[..SUMMED_BYTES]);
    bytes[SUMMED_BYTES..].copy_from_slice(&sum.0);
    bytes
}

/// The pieces gang block `bp`'s header `bytes` names, if it is that block's header: its
/// checksum holds, it was written with `bp`, and its pieces are plain blocks of `bp`'s birth
/// whose sizes add up to `bp`'s. Anything else is damage (or a crafted image), said how.
pub fn parse(bp: &BlkPtr, bytes: &[u8]) -> Result<Vec<BlkPtr>, String> {
    let h = HeaderPhys::read_from_bytes(bytes).map_err(|_| "a gang header of the wrong size")?;
    let kind: ChecksumKind = bp.checksum_kind().ok_or("unknown checksum algorithm")?;
    if h.magic.get() != MAGIC || kind.compute(&bytes[..SUMMED_BYTES]).0 != h.checksum {
        return Err("not a gang header (or a damaged one)".into());
    }
    if h.birth_txg != bp.birth_txg || h.psize != bp.psize {
        return Err(format!(
            "a gang header of another block (born in txg {}, {} bytes)",
            h.birth_txg.get(),
            h.psize.get()
        ));
    }
    let count = h.count.get() as usize;
    if !(1..=MAX_PIECES).contains(&count) {
        return Err(format!("a gang header of {count} pieces"));
    }
    let pieces = h.pieces[..count].to_vec();
    let mut total = 0u64;
    for p in &pieces {
        let size = p.psize.get() as u64;
        if p.is_hole() || p.is_gang() || p.birth_txg != bp.birth_txg || size == 0 {
            return Err("a gang piece that no writer made".into());
        }
        total += size;
    }
    if total != bp.psize.get() as u64 {
        return Err(format!(
            "gang pieces of {total} bytes for a block of {}",
            bp.psize.get()
        ));
    }
    Ok(pieces)
}

/// Space for a gang block of `psize` bytes in `copies` copies: its header's copies, and
/// pieces of at most `largest` bytes (whole sectors; each smaller one tried in halves),
/// `(copies, bytes)` each in order. Fails, with nothing taken, if even single sectors do not
/// hold it in `MAX_PIECES` pieces.
pub fn allocate(
    alloc: &mut Allocator,
    psize: u64,
    largest: u64,
    copies: usize,
    class: AllocClass,
    asize_of: &dyn Fn(u32, u64) -> u64,
    txg: u64,
) -> Result<(Dvas, Vec<(Dvas, u64)>), AllocError> {
    let header = alloc.alloc_sized(HEADER_BYTES as u64, copies, class, asize_of)?;
    let mut pieces: Vec<(Dvas, u64)> = Vec::new();
    let mut size = (largest / SECTOR).max(1) * SECTOR;
    let mut left = psize;
    while left > 0 && pieces.len() < MAX_PIECES {
        let want = size.min(left);
        match alloc.alloc_sized(want, copies, class, asize_of) {
            Ok(d) => {
                pieces.push((d, want));
                left -= want;
            }
            Err(_) if want > SECTOR => size = (want / 2 / SECTOR).max(1) * SECTOR,
            Err(_) => break,
        }
    }
    if left > 0 {
        // Freed in this txg, as any block the txg allocated and then dropped: nothing was
        // written there.
        let copies = header
            .iter()
            .chain(pieces.iter().flat_map(|(d, _)| d.iter()));
        let refused = alloc.free_all(copies, txg, class);
        assert!(refused.is_empty(), "{refused:?}");
        return Err(AllocError::NoSpace(psize));
    }
    Ok((header, pieces))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spa::{BlockKind, Dva};

    fn gang(psize: u32) -> BlkPtr {
        let mut bp = BlkPtr::HOLE;
        bp.psize = psize.into();
        bp.lsize = psize.into();
        bp.birth_txg = 9.into();
        bp.checksum_kind = ChecksumKind::Fletcher4 as u8;
        bp.kind = BlockKind::Indirect as u8;
        bp.flags = crate::spa::bp::BP_GANG;
        bp
    }

    fn piece(bp: &BlkPtr, at: u64, psize: u32) -> BlkPtr {
        let mut p = *bp;
        p.flags = 0;
        p.psize = psize.into();
        p.lsize = psize.into();
        p.dva = [Dva::new(0, at, psize), Dva::default(), Dva::default()];
        p
    }

    #[test]
    fn a_header_names_its_pieces_and_nothing_else_passes_for_it() {
        let bp = gang(16384);
        let pieces = [piece(&bp, 0, 8192), piece(&bp, 65536, 8192)];
        let h = header(&bp, &pieces);
        assert_eq!(h.len(), HEADER_BYTES);
        assert_eq!(parse(&bp, &h).unwrap(), pieces);

        // Any flipped byte the checksum covers is found; so is a flipped checksum.
        for at in [
            0,
            9,
            20,
            100,
            SUMMED_BYTES - 1,
            SUMMED_BYTES,
            HEADER_BYTES - 1,
        ] {
            let mut bad = h.clone();
            bad[at] ^= 1;
            assert!(parse(&bp, &bad).is_err(), "byte {at}");
        }
        // The header of another block (another birth, another size) is not this one's.
        let mut other = bp;
        other.birth_txg = 10.into();
        assert!(parse(&other, &h).unwrap_err().contains("another block"));
        // Pieces that do not add up, or that are gangs themselves, are refused even under a
        // good checksum (a crafted image).
        let short = header(&bp, &pieces[..1]);
        assert!(parse(&bp, &short).unwrap_err().contains("8192 bytes"));
        let mut nested = pieces;
        nested[1].flags = crate::spa::bp::BP_GANG;
        assert!(parse(&bp, &header(&bp, &nested)).is_err());
        assert!(parse(&bp, &h[..100]).is_err());
    }
}
