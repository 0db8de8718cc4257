//! x86-64 vector lanes and the `#[target_feature]` entry points that instantiate the engine
//! with them.
//!
//! - [`Y`]: 256-bit AVX2. ×c by split-nibble `vpshufb` tables, ×2 by add + sign compare.
//! - [`Z`]: 512-bit AVX-512 BW. ×c as Y; ×2 by add + sign mask (`vpmovb2m`) + masked blend.
//! - [`G`]: 512-bit AVX-512 BW + GFNI. Every ×c (×2, ×4 included) is one `vgf2p8affineqb`
//!   with c's bit matrix ([`gf::bit_matrix`]); `vgf2p8mulb` reduces by 0x11b, the wrong field.
//!
//! Each type wraps its vector in a private field and is made only by the `unsafe`
//! constructors of [`Lanes`], whose contract is that the CPU has the type's features; that is
//! what the `// SAFETY:` comments on the arithmetic below rely on.

use std::arch::x86_64::*;

use super::gf;
use super::lanes::Lanes;

/// 32 bytes in an AVX2 register.
#[derive(Clone, Copy)]
pub(crate) struct Y(__m256i);

/// Split-nibble multiply tables, each 16-byte table repeated in every 128-bit lane.
#[derive(Clone, Copy)]
pub(crate) struct Nibbles<T> {
    lo: T,
    hi: T,
}

impl Lanes for Y {
    const BYTES: usize = 32;
    type Mul = Nibbles<__m256i>;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: the caller guarantees 32 readable bytes and AVX2; loadu is unaligned.
        Y(unsafe { _mm256_loadu_si256(p as *const __m256i) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: the caller guarantees 32 writable bytes; this value witnesses AVX2.
        unsafe { _mm256_storeu_si256(p as *mut __m256i, self.0) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller guarantees AVX2.
        Y(unsafe { _mm256_setzero_si256() })
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> Self::Mul {
        let (lo, hi) = gf::nibble_tables(c);
        // SAFETY: the caller guarantees AVX2; the loads read the 16-byte local tables.
        unsafe {
            Nibbles {
                lo: _mm256_broadcastsi128_si256(_mm_loadu_si128(lo.as_ptr() as *const __m128i)),
                hi: _mm256_broadcastsi128_si256(_mm_loadu_si128(hi.as_ptr() as *const __m128i)),
            }
        }
    }
    #[inline(always)]
    fn xor(self, o: Self) -> Self {
        // SAFETY: a Y exists only if the CPU has AVX2 (module doc).
        Y(unsafe { _mm256_xor_si256(self.0, o.0) })
    }
    #[inline(always)]
    fn mul2(self) -> Self {
        // SAFETY: a Y exists only if the CPU has AVX2 (module doc).
        unsafe {
            let high = _mm256_cmpgt_epi8(_mm256_setzero_si256(), self.0);
            let shifted = _mm256_add_epi8(self.0, self.0);
            Y(_mm256_xor_si256(
                shifted,
                _mm256_and_si256(high, _mm256_set1_epi8(0x1d)),
            ))
        }
    }
    #[inline(always)]
    fn mul(self, m: &Self::Mul) -> Self {
        // SAFETY: a Y exists only if the CPU has AVX2 (module doc).
        unsafe {
            let mask = _mm256_set1_epi8(0x0f);
            let lo = _mm256_and_si256(self.0, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi64::<4>(self.0), mask);
            Y(_mm256_xor_si256(
                _mm256_shuffle_epi8(m.lo, lo),
                _mm256_shuffle_epi8(m.hi, hi),
            ))
        }
    }
}

/// 64 bytes in an AVX-512 register, AVX-512 BW byte operations.
#[derive(Clone, Copy)]
pub(crate) struct Z(__m512i);

/// # Safety
/// The CPU has AVX-512 F and BW.
#[inline(always)]
unsafe fn nibbles512(c: u8) -> Nibbles<__m512i> {
    let (lo, hi) = gf::nibble_tables(c);
    // SAFETY: the caller guarantees AVX-512F; the loads read the 16-byte local tables.
    unsafe {
        Nibbles {
            lo: _mm512_broadcast_i32x4(_mm_loadu_si128(lo.as_ptr() as *const __m128i)),
            hi: _mm512_broadcast_i32x4(_mm_loadu_si128(hi.as_ptr() as *const __m128i)),
        }
    }
}

impl Lanes for Z {
    const BYTES: usize = 64;
    type Mul = Nibbles<__m512i>;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: the caller guarantees 64 readable bytes and AVX-512; loadu is unaligned.
        Z(unsafe { _mm512_loadu_si512(p as *const __m512i) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: the caller guarantees 64 writable bytes; this value witnesses AVX-512.
        unsafe { _mm512_storeu_si512(p as *mut __m512i, self.0) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller guarantees AVX-512F.
        Z(unsafe { _mm512_setzero_si512() })
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> Self::Mul {
        // SAFETY: the caller guarantees AVX-512.
        unsafe { nibbles512(c) }
    }
    #[inline(always)]
    fn xor(self, o: Self) -> Self {
        // SAFETY: a Z exists only if the CPU has AVX-512 F and BW (module doc).
        Z(unsafe { _mm512_xor_si512(self.0, o.0) })
    }
    #[inline(always)]
    fn mul2(self) -> Self {
        // SAFETY: a Z exists only if the CPU has AVX-512 F and BW (module doc).
        unsafe {
            let high = _mm512_movepi8_mask(self.0);
            let shifted = _mm512_add_epi8(self.0, self.0);
            Z(_mm512_mask_blend_epi8(
                high,
                shifted,
                _mm512_xor_si512(shifted, _mm512_set1_epi8(0x1d)),
            ))
        }
    }
    #[inline(always)]
    fn mul(self, m: &Self::Mul) -> Self {
        // SAFETY: a Z exists only if the CPU has AVX-512 F and BW (module doc).
        unsafe {
            let mask = _mm512_set1_epi8(0x0f);
            let lo = _mm512_and_si512(self.0, mask);
            let hi = _mm512_and_si512(_mm512_srli_epi64::<4>(self.0), mask);
            Z(_mm512_xor_si512(
                _mm512_shuffle_epi8(m.lo, lo),
                _mm512_shuffle_epi8(m.hi, hi),
            ))
        }
    }
}

/// 64 bytes in an AVX-512 register, multiplied with GFNI.
#[derive(Clone, Copy)]
pub(crate) struct G(__m512i);

/// [`gf::bit_matrix`] of 2, 4 and 16 (checked by a test).
pub(crate) const MATRIX_2: u64 = 0x8001_8284_8810_2040;
pub(crate) const MATRIX_4: u64 = 0x4080_41c2_c488_1020;
pub(crate) const MATRIX_16: u64 = 0x1020_50b0_71e2_c488;

impl G {
    #[inline(always)]
    fn affine(self, m: __m512i) -> G {
        // SAFETY: a G exists only if the CPU has AVX-512 F, BW and GFNI (module doc).
        G(unsafe { _mm512_gf2p8affine_epi64_epi8::<0>(self.0, m) })
    }
}

impl Lanes for G {
    const BYTES: usize = 64;
    type Mul = __m512i;
    const FUSED_PAIRS: bool = true;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: the caller guarantees 64 readable bytes and the features; loadu is unaligned.
        G(unsafe { _mm512_loadu_si512(p as *const __m512i) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: the caller guarantees 64 writable bytes; this value witnesses AVX-512.
        unsafe { _mm512_storeu_si512(p as *mut __m512i, self.0) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller guarantees AVX-512F.
        G(unsafe { _mm512_setzero_si512() })
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> Self::Mul {
        // SAFETY: the caller guarantees AVX-512F.
        unsafe { _mm512_set1_epi64(gf::bit_matrix(c) as i64) }
    }
    #[inline(always)]
    fn xor(self, o: Self) -> Self {
        // SAFETY: a G exists only if the CPU has AVX-512 F, BW and GFNI (module doc).
        G(unsafe { _mm512_xor_si512(self.0, o.0) })
    }
    #[inline(always)]
    fn mul2(self) -> Self {
        // SAFETY: a G exists only if the CPU has AVX-512 F, BW and GFNI (module doc).
        self.affine(unsafe { _mm512_set1_epi64(MATRIX_2 as i64) })
    }
    #[inline(always)]
    fn mul4(self) -> Self {
        // SAFETY: a G exists only if the CPU has AVX-512 F, BW and GFNI (module doc).
        self.affine(unsafe { _mm512_set1_epi64(MATRIX_4 as i64) })
    }
    #[inline(always)]
    fn mul16(self) -> Self {
        // SAFETY: a G exists only if the CPU has AVX-512 F, BW and GFNI (module doc).
        self.affine(unsafe { _mm512_set1_epi64(MATRIX_16 as i64) })
    }
    #[inline(always)]
    fn xor3(self, a: Self, b: Self) -> Self {
        // SAFETY: a G exists only if the CPU has AVX-512 F, BW and GFNI (module doc).
        G(unsafe { _mm512_ternarylogic_epi64::<0x96>(self.0, a.0, b.0) })
    }
    #[inline(always)]
    fn mul(self, m: &Self::Mul) -> Self {
        self.affine(*m)
    }
}

/// Stamps out one kernel's entry points: the engine instantiated with the lane type inside a
/// function compiled with the kernel's features.
macro_rules! entries {
    ($name:ident, $features:literal, $lanes:ty, $unroll:literal) => {
        pub(crate) mod $name {
            use super::super::engine::{self, RdpGen, RdpRec, RsJob};

            /// # Safety
            /// The CPU has this kernel's features; the job meets [`engine::rs_pass`]'s contract.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn rs_pass(job: &RsJob) {
                // SAFETY: forwarded contract.
                unsafe { engine::rs_pass::<$lanes, $unroll>(job) }
            }

            /// # Safety
            /// The CPU has this kernel's features; the job meets
            /// [`engine::rdp_generate`]'s contract.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn rdp_generate(job: &RdpGen) {
                // SAFETY: forwarded contract.
                unsafe { engine::rdp_generate::<$lanes, $unroll>(job) }
            }

            /// # Safety
            /// The CPU has this kernel's features; the job meets
            /// [`engine::rdp_reconstruct`]'s contract.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn rdp_reconstruct(job: &RdpRec) {
                // SAFETY: forwarded contract.
                unsafe { engine::rdp_reconstruct::<$lanes, $unroll>(job) }
            }
        }
    };
}

entries!(avx2, "avx2", super::Y, 4);
entries!(avx512bw, "avx512f,avx512bw", super::Z, 4);
entries!(gfni, "avx512f,avx512bw,gfni", super::G, 4);

#[cfg(test)]
mod tests {
    #[test]
    fn gfni_constants_are_the_bit_matrices() {
        assert_eq!(super::MATRIX_2, super::gf::bit_matrix(2));
        assert_eq!(super::MATRIX_4, super::gf::bit_matrix(4));
        assert_eq!(super::MATRIX_16, super::gf::bit_matrix(16));
    }
}
