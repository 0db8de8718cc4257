//! The byte vectors the engine is written against: `u8` (one byte, for tails), `u64` (eight
//! bytes at a time, portable SWAR: the `scalar` kernel) and, in `x86`, 256- and 512-bit vectors.
//!
//! A value of an implementing type is a witness that the CPU can run its instructions: the
//! only ways to make one are the `unsafe` constructors (`load`, `zero`, `prepare`), whose
//! contract is that the CPU supports the type's features. That is why the arithmetic methods
//! are safe.

use super::gf;

/// A vector of `BYTES` bytes of GF(2^8).
pub(crate) trait Lanes: Copy {
    /// Bytes per vector.
    const BYTES: usize;
    /// A prepared multiply-by-constant.
    type Mul: Copy;

    /// Loads `BYTES` bytes.
    ///
    /// # Safety
    /// `p` is valid for reading `BYTES` bytes, and the CPU supports this type's features.
    unsafe fn load(p: *const u8) -> Self;
    /// Stores `BYTES` bytes.
    ///
    /// # Safety
    /// `p` is valid for writing `BYTES` bytes.
    unsafe fn store(self, p: *mut u8);
    /// All zero bytes.
    ///
    /// # Safety
    /// The CPU supports this type's features.
    unsafe fn zero() -> Self;
    /// Prepares multiplication by `c`.
    ///
    /// # Safety
    /// The CPU supports this type's features.
    unsafe fn prepare(c: u8) -> Self::Mul;

    /// Whether the RS encoder should take data columns two at a time (Q ← 4·Q ⊕ 2·D ⊕ D'):
    /// worth it only where ×4 and ×16 cost no more than ×2 and a three-way XOR is one op.
    const FUSED_PAIRS: bool = false;

    fn xor(self, o: Self) -> Self;
    /// self ^ a ^ b.
    #[inline(always)]
    fn xor3(self, a: Self, b: Self) -> Self {
        self.xor(a).xor(b)
    }
    /// Every byte times 2.
    fn mul2(self) -> Self;
    /// Every byte times 4.
    #[inline(always)]
    fn mul4(self) -> Self {
        self.mul2().mul2()
    }
    /// Every byte times 16.
    #[inline(always)]
    fn mul16(self) -> Self {
        self.mul4().mul4()
    }
    /// Every byte times the prepared constant.
    fn mul(self, m: &Self::Mul) -> Self;
}

impl Lanes for u8 {
    const BYTES: usize = 1;
    type Mul = [u8; 256];

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: the caller guarantees `p` is readable for one byte.
        unsafe { p.read() }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: the caller guarantees `p` is writable for one byte.
        unsafe { p.write(self) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        0
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> [u8; 256] {
        gf::mul_table(c)
    }
    #[inline(always)]
    fn xor(self, o: Self) -> Self {
        self ^ o
    }
    #[inline(always)]
    fn mul2(self) -> Self {
        (self << 1) ^ if self & 0x80 != 0 { 0x1d } else { 0 }
    }
    #[inline(always)]
    fn mul(self, m: &[u8; 256]) -> Self {
        m[self as usize]
    }
}

impl Lanes for u64 {
    const BYTES: usize = 8;
    type Mul = [u8; 256];

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: the caller guarantees 8 readable bytes; read_unaligned has no alignment need.
        unsafe { (p as *const u64).read_unaligned() }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut u8) {
        // SAFETY: the caller guarantees 8 writable bytes; write_unaligned has no alignment need.
        unsafe { (p as *mut u64).write_unaligned(self) }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        0
    }
    #[inline(always)]
    unsafe fn prepare(c: u8) -> [u8; 256] {
        gf::mul_table(c)
    }
    #[inline(always)]
    fn xor(self, o: Self) -> Self {
        self ^ o
    }
    /// Shift every byte left, then XOR 0x1d into the bytes whose top bit fell off.
    #[inline(always)]
    fn mul2(self) -> Self {
        let high = (self >> 7) & 0x0101_0101_0101_0101;
        ((self & 0x7f7f_7f7f_7f7f_7f7f) << 1) ^ high.wrapping_mul(0x1d)
    }
    #[inline(always)]
    fn mul(self, m: &[u8; 256]) -> Self {
        u64::from_ne_bytes(self.to_ne_bytes().map(|b| m[b as usize]))
    }
}
