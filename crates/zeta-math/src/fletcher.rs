//! Fletcher-4 as ZFS defines it: four 64-bit running sums over the input read as little-endian
//! 32-bit words. A trailing partial word (length not a multiple of 4) is zero-padded, so every
//! length has a defined checksum (ZFS itself only ever checksums multiples of 512 bytes).
//!
//! Kernels: the reference (one word at a time), a portable unrolled one, and on x86-64 AVX2
//! and AVX-512 kernels that run N independent lanes (lane i sums words i, i+N, i+2N, ...) and
//! fold the lanes into the single-stream result at the end ([`combine_lanes`]). The kernel in
//! use is picked once per process by a short benchmark among those the CPU supports;
//! `ZETA_FLETCHER4_IMPL=reference|unrolled|avx2|avx512` overrides the choice.

/// The four Fletcher-4 accumulators, `a` = Σ w, `b` = Σ a, `c` = Σ b, `d` = Σ c (all mod 2^64).
pub type Fletcher4 = [u64; 4];

/// Scalar reference: one word at a time, exactly the definition.
pub fn fletcher4_reference(data: &[u8]) -> Fletcher4 {
    continue_words([0; 4], data)
}

/// Runs the definition over `data` starting from state `s` (used for tails after a kernel):
/// whole words, then the zero-padded last one.
fn continue_words(s: Fletcher4, data: &[u8]) -> Fletcher4 {
    let [mut a, mut b, mut c, mut d] = s;
    let mut step = |word: [u8; 4]| {
        a = a.wrapping_add(u32::from_le_bytes(word) as u64);
        b = b.wrapping_add(a);
        c = c.wrapping_add(b);
        d = d.wrapping_add(c);
    };
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        step(w.try_into().expect("4 bytes"));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut word = [0u8; 4];
        word[..rest.len()].copy_from_slice(rest);
        step(word);
    }
    [a, b, c, d]
}

/// The portable kernel: four words per step with the sums expanded in closed form, which
/// breaks the serial dependency chain of the reference so the CPU can overlap the additions.
///
/// For four words w0..w3 entering state (a, b, c, d):
///   a' = a + w0 + w1 + w2 + w3
///   b' = b + 4a + 4w0 + 3w1 + 2w2 + w3
///   c' = c + 4b + 10a + 10w0 + 6w1 + 3w2 + w3
///   d' = d + 4c + 10b + 20a + 20w0 + 10w1 + 4w2 + w3
/// (the coefficients are the binomial sums of the recurrence; checked against the reference).
pub fn fletcher4_unrolled(data: &[u8]) -> Fletcher4 {
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
    continue_words([a, b, c, d], blocks.remainder())
}

/// Folds N lane states into the state a single stream over the same words would have.
///
/// With M words per lane, lane i holds word j = N·k + i at "distance" m = M − k from the end,
/// so its sums weigh it by 1, m, m(m+1)/2 and m(m+1)(m+2)/6. In the single stream the same
/// word is at distance x = N·m − i and weighs 1, x, x(x+1)/2, x(x+1)(x+2)/6. Each of these is
/// an integer-valued cubic in m, so it has integer coordinates (α, β, γ, δ) in the basis of the
/// lane weights ([`lane_coefficients`]); then sum α·D_i + β·C_i + γ·B_i + δ·A_i mod 2^64.
pub fn combine_lanes(lanes: &[Fletcher4]) -> Fletcher4 {
    let n = lanes.len() as i128;
    let coefficients: Vec<LaneCoefficients> = (0..n).map(|i| lane_coefficients(n, i)).collect();
    fold_lanes(lanes, &coefficients)
}

/// Per sum (a, b, c, d), the (α, β, γ, δ) of one lane, as wrapped u64.
type LaneCoefficients = [[u64; 4]; 4];

/// The coefficients of lane i of n. They depend on neither the data nor its length, so the
/// kernels take them from tables computed at compile time ([`coefficient_table`]): computing
/// them per call (in i128, with divisions) cost more than checksumming a 4 KiB block.
///
/// The weight cubic f(m) = g(n·m − i) is evaluated at m = 0, −1, −2, −3, where the lane basis
/// (1, m, m(m+1)/2, m(m+1)(m+2)/6) is triangular, in exact i128 arithmetic.
const fn lane_coefficients(n: i128, i: i128) -> LaneCoefficients {
    let mut out = [[0u64; 4]; 4];
    let mut order = 0;
    while order < 4 {
        // f(m) at m = 0, −1, −2, −3.
        let f0 = stream_weight(order, -i);
        let f1 = stream_weight(order, -n - i);
        let f2 = stream_weight(order, -2 * n - i);
        let f3 = stream_weight(order, -3 * n - i);
        let delta = f0;
        let gamma = delta - f1;
        let beta = f2 + 2 * gamma - delta;
        let alpha = 3 * beta - 3 * gamma + delta - f3;
        out[order] = [alpha as u64, beta as u64, gamma as u64, delta as u64];
        order += 1;
    }
    out
}

/// The weight of a word at distance x from the end in sum `order` of the single stream.
const fn stream_weight(order: usize, x: i128) -> i128 {
    match order {
        0 => 1,
        1 => x,
        2 => x * (x + 1) / 2,
        _ => x * (x + 1) * (x + 2) / 6,
    }
}

/// [`lane_coefficients`] for every lane of N.
const fn coefficient_table<const N: usize>() -> [LaneCoefficients; N] {
    let mut t = [[[0u64; 4]; 4]; N];
    let mut i = 0;
    while i < N {
        t[i] = lane_coefficients(N as i128, i as i128);
        i += 1;
    }
    t
}

/// Σ over lanes of α·D + β·C + γ·B + δ·A, per sum, mod 2^64.
fn fold_lanes(lanes: &[Fletcher4], coefficients: &[LaneCoefficients]) -> Fletcher4 {
    assert_eq!(lanes.len(), coefficients.len());
    let mut out = [0u64; 4];
    for (&[la, lb, lc, ld], coef) in lanes.iter().zip(coefficients) {
        for (sum, &[alpha, beta, gamma, delta]) in out.iter_mut().zip(coef) {
            *sum = sum
                .wrapping_add(alpha.wrapping_mul(ld))
                .wrapping_add(beta.wrapping_mul(lc))
                .wrapping_add(gamma.wrapping_mul(lb))
                .wrapping_add(delta.wrapping_mul(la));
        }
    }
    out
}

/// A Fletcher-4 kernel implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fletcher4Impl {
    Reference,
    Unrolled,
    Avx2,
    /// Eight lanes, one set of accumulators: the way OpenZFS's AVX-512 kernel works.
    Avx512,
    /// Sixteen lanes as two interleaved sets of eight, so the four dependent adds of one set
    /// overlap with the other's.
    Avx512x2,
}

impl Fletcher4Impl {
    pub const ALL: [Fletcher4Impl; 5] = [
        Self::Reference,
        Self::Unrolled,
        Self::Avx2,
        Self::Avx512,
        Self::Avx512x2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Reference => "reference",
            Self::Unrolled => "unrolled",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
            Self::Avx512x2 => "avx512x2",
        }
    }

    /// Whether this CPU can run the kernel.
    pub fn supported(self) -> bool {
        match self {
            Self::Reference | Self::Unrolled => true,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => std::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 | Self::Avx512x2 => std::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The kernel's entry point, if this CPU can run it.
    pub fn kernel(self) -> Option<fn(&[u8]) -> Fletcher4> {
        if !self.supported() {
            return None;
        }
        Some(match self {
            Self::Reference => fletcher4_reference,
            Self::Unrolled => fletcher4_unrolled,
            // The pointers are handed out only after `supported()` confirmed the CPU feature
            // above, and CPU features do not change while the process runs.
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => |d| {
                // SAFETY: the CPU has AVX2 (checked before this pointer was returned).
                unsafe { x86::fletcher4_avx2(d) }
            },
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 => |d| {
                // SAFETY: the CPU has AVX-512F (checked before this pointer was returned).
                unsafe { x86::fletcher4_avx512(d) }
            },
            #[cfg(target_arch = "x86_64")]
            Self::Avx512x2 => |d| {
                // SAFETY: the CPU has AVX-512F (checked before this pointer was returned).
                unsafe { x86::fletcher4_avx512x2(d) }
            },
            #[cfg(not(target_arch = "x86_64"))]
            _ => return None,
        })
    }

    /// Runs the kernel; panics if the CPU lacks it (check [`supported`](Self::supported)).
    pub fn run(self, data: &[u8]) -> Fletcher4 {
        let k = self.kernel();
        k.unwrap_or_else(|| panic!("fletcher4 {} not supported here", self.name()))(data)
    }
}

/// The kernel this process uses: `ZETA_FLETCHER4_IMPL` if set (an unknown or unsupported name
/// is an error, not a silent fallback), else the fastest supported one on a short benchmark.
pub fn selected() -> Result<Fletcher4Impl, String> {
    static CHOICE: std::sync::OnceLock<Result<Fletcher4Impl, String>> = std::sync::OnceLock::new();
    CHOICE
        .get_or_init(|| match std::env::var("ZETA_FLETCHER4_IMPL") {
            Ok(name) => super::select::resolve_override(
                "ZETA_FLETCHER4_IMPL",
                &name,
                &Fletcher4Impl::ALL,
                Fletcher4Impl::name,
                Fletcher4Impl::supported,
                &[],
            ),
            Err(_) => Ok(fastest()),
        })
        .clone()
}

/// Times each supported kernel on a 64 KiB buffer and returns the quickest. The reference
/// competes too: on a CPU without AVX2 its one-add-per-sum loop can beat the closed-form
/// unrolled kernel (it does on Zen 5).
fn fastest() -> Fletcher4Impl {
    let buf = super::select::timing_buffer();
    let supported = Fletcher4Impl::ALL.into_iter().filter(|k| k.supported());
    super::select::fastest(supported, Fletcher4Impl::Unrolled, |k| {
        std::hint::black_box(k.run(std::hint::black_box(&buf)));
    })
}

/// Fletcher-4 with the selected kernel. If `ZETA_FLETCHER4_IMPL` names a kernel that cannot
/// run, the portable kernel is used (pools refuse to open with the bad setting, so nothing is
/// written under it). The choice is resolved once; each call is one indirect call.
pub fn fletcher4(data: &[u8]) -> Fletcher4 {
    static KERNEL: std::sync::OnceLock<fn(&[u8]) -> Fletcher4> = std::sync::OnceLock::new();
    let k = KERNEL.get_or_init(|| {
        selected()
            .ok()
            .and_then(Fletcher4Impl::kernel)
            .unwrap_or(fletcher4_unrolled)
    });
    k(data)
}

/// The Fletcher-4 sums of a buffer of `total` bytes after its bytes from `at` change from
/// `old` to `new`, given its sums before (`sums`). `at`, `total` and the lengths of `old` and
/// `new` (equal) are multiples of 4.
///
/// Each sum is linear in the words modulo 2^64, a word's weight set by how many words follow
/// it: with k words from it to the end, 1 in a, k in b, k(k+1)/2 in c and k(k+1)(k+2)/6 in
/// d. So the change is the sums of the words' differences run to the end of the range, then
/// carried over the `z` unchanged words after it as if they were zeros. A patched block's
/// sums then cost a pass over its pieces, not over the block.
pub fn fletcher4_update(
    sums: Fletcher4,
    total: usize,
    at: usize,
    old: &[u8],
    new: &[u8],
) -> Fletcher4 {
    assert!(old.len() == new.len() && at + old.len() <= total);
    assert!(at.is_multiple_of(4) && old.len().is_multiple_of(4) && total.is_multiple_of(4));
    let [mut a, mut b, mut c, mut d] = [0u64; 4];
    for (o, n) in old.chunks_exact(4).zip(new.chunks_exact(4)) {
        let o = u32::from_le_bytes(o.try_into().expect("4 bytes")) as u64;
        let n = u32::from_le_bytes(n.try_into().expect("4 bytes")) as u64;
        a = a.wrapping_add(n.wrapping_sub(o));
        b = b.wrapping_add(a);
        c = c.wrapping_add(b);
        d = d.wrapping_add(c);
    }
    let z = ((total - at - old.len()) / 4) as u128;
    // The binomials exactly (z < 2^62, so the products fit in 128 bits), then modulo 2^64.
    let t2 = (z * (z + 1) / 2) as u64;
    let t3 = (z * (z + 1) * (z + 2) / 6) as u64;
    let z = z as u64;
    let delta = [
        a,
        b.wrapping_add(z.wrapping_mul(a)),
        c.wrapping_add(z.wrapping_mul(b))
            .wrapping_add(t2.wrapping_mul(a)),
        d.wrapping_add(z.wrapping_mul(c))
            .wrapping_add(t2.wrapping_mul(b))
            .wrapping_add(t3.wrapping_mul(a)),
    ];
    std::array::from_fn(|i| sums[i].wrapping_add(delta[i]))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{coefficient_table, continue_words, fold_lanes, Fletcher4, LaneCoefficients};
    use std::arch::x86_64::*;

    /// Turns the four accumulator vectors (a, b, c, d, each as N lane values) into N lane
    /// states, folds them, and runs the definition over the bytes the vectors did not cover.
    fn finish<const N: usize>(sums: [[u64; N]; 4], tail: &[u8]) -> Fletcher4 {
        let lanes: [Fletcher4; N] =
            std::array::from_fn(|i| [sums[0][i], sums[1][i], sums[2][i], sums[3][i]]);
        let coefficients: &[LaneCoefficients; N] = &const { coefficient_table::<N>() };
        continue_words(fold_lanes(&lanes, coefficients), tail)
    }

    /// Four lanes of 64-bit sums; each step loads 16 bytes and widens its four words.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn fletcher4_avx2(data: &[u8]) -> Fletcher4 {
        let steps = data.len() / 16;
        let (mut a, mut b, mut c, mut d) = (
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
        );
        let p = data.as_ptr();
        for k in 0..steps {
            // SAFETY: k < steps, so bytes 16k..16k+16 lie inside `data`; loadu has no
            // alignment requirement.
            let w =
                _mm256_cvtepu32_epi64(unsafe { _mm_loadu_si128(p.add(16 * k) as *const __m128i) });
            a = _mm256_add_epi64(a, w);
            b = _mm256_add_epi64(b, a);
            c = _mm256_add_epi64(c, b);
            d = _mm256_add_epi64(d, c);
        }
        let mut sums = [[0u64; 4]; 4];
        for (acc, out) in [a, b, c, d].into_iter().zip(sums.iter_mut()) {
            // SAFETY: `out` is 32 writable bytes; storeu has no alignment requirement.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, acc) };
        }
        finish(sums, &data[steps * 16..])
    }

    /// Eight lanes of 64-bit sums; each step loads 32 bytes and widens its eight words.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fletcher4_avx512(data: &[u8]) -> Fletcher4 {
        let steps = data.len() / 32;
        let (mut a, mut b, mut c, mut d) = (
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
        );
        let p = data.as_ptr();
        for k in 0..steps {
            // SAFETY: k < steps, so bytes 32k..32k+32 lie inside `data`; loadu has no
            // alignment requirement.
            let w = _mm512_cvtepu32_epi64(unsafe {
                _mm256_loadu_si256(p.add(32 * k) as *const __m256i)
            });
            a = _mm512_add_epi64(a, w);
            b = _mm512_add_epi64(b, a);
            c = _mm512_add_epi64(c, b);
            d = _mm512_add_epi64(d, c);
        }
        let mut sums = [[0u64; 8]; 4];
        for (acc, out) in [a, b, c, d].into_iter().zip(sums.iter_mut()) {
            // SAFETY: `out` is 64 writable bytes; storeu has no alignment requirement.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr() as *mut __m512i, acc) };
        }
        finish(sums, &data[steps * 32..])
    }

    /// Sixteen lanes in two sets of eight: each step loads 64 bytes, the first 32 into set 0
    /// and the next 32 into set 1, so word `w` of the buffer goes to lane `w % 16`. The two
    /// chains of dependent adds run side by side.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fletcher4_avx512x2(data: &[u8]) -> Fletcher4 {
        let steps = data.len() / 64;
        let z = _mm512_setzero_si512();
        let (mut a0, mut b0, mut c0, mut d0) = (z, z, z, z);
        let (mut a1, mut b1, mut c1, mut d1) = (z, z, z, z);
        let p = data.as_ptr();
        for k in 0..steps {
            // SAFETY: k < steps, so bytes 64k..64k+64 lie inside `data`; loadu has no
            // alignment requirement.
            let (w0, w1) = unsafe {
                (
                    _mm512_cvtepu32_epi64(_mm256_loadu_si256(p.add(64 * k) as *const __m256i)),
                    _mm512_cvtepu32_epi64(_mm256_loadu_si256(p.add(64 * k + 32) as *const __m256i)),
                )
            };
            a0 = _mm512_add_epi64(a0, w0);
            a1 = _mm512_add_epi64(a1, w1);
            b0 = _mm512_add_epi64(b0, a0);
            b1 = _mm512_add_epi64(b1, a1);
            c0 = _mm512_add_epi64(c0, b0);
            c1 = _mm512_add_epi64(c1, b1);
            d0 = _mm512_add_epi64(d0, c0);
            d1 = _mm512_add_epi64(d1, c1);
        }
        let mut sums = [[0u64; 16]; 4];
        for (i, (lo, hi)) in [(a0, a1), (b0, b1), (c0, c1), (d0, d1)]
            .into_iter()
            .enumerate()
        {
            // SAFETY: each half of `sums[i]` is 64 writable bytes; storeu has no alignment
            // requirement.
            unsafe {
                _mm512_storeu_si512(sums[i].as_mut_ptr() as *mut __m512i, lo);
                _mm512_storeu_si512(sums[i][8..].as_mut_ptr() as *mut __m512i, hi);
            }
        }
        finish(sums, &data[steps * 64..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};

    #[test]
    fn known_values() {
        assert_eq!(fletcher4_reference(&[]), [0, 0, 0, 0]);
        // One word 1: a=1, b=1, c=1, d=1. Two words 1,2: a=3, b=4, c=5, d=6.
        assert_eq!(fletcher4_reference(&1u32.to_le_bytes()), [1, 1, 1, 1]);
        let two = [1u32.to_le_bytes(), 2u32.to_le_bytes()].concat();
        assert_eq!(fletcher4_reference(&two), [3, 4, 5, 6]);
    }

    #[test]
    fn an_update_gives_the_sums_of_the_changed_buffer() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for total in [4usize, 8, 512, 4096, 131072] {
            let mut buf = vec![0u8; total];
            rng.fill_bytes(&mut buf);
            let mut sums = fletcher4_reference(&buf);
            for _ in 0..20 {
                let at = rng.gen_range(0..total / 4) * 4;
                let len = rng.gen_range(0..=(total - at) / 4) * 4;
                let mut new = vec![0u8; len];
                // Random words, and words that wrap when the old one is subtracted.
                match rng.gen_range(0..3) {
                    0 => rng.fill_bytes(&mut new),
                    1 => new.fill(0xff),
                    _ => {}
                }
                sums = fletcher4_update(sums, total, at, &buf[at..at + len], &new);
                buf[at..at + len].copy_from_slice(&new);
                assert_eq!(
                    sums,
                    fletcher4_reference(&buf),
                    "{total} bytes, {len} at {at}"
                );
            }
        }
    }

    #[test]
    fn lane_combination_matches_the_single_stream() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for n in [1usize, 2, 3, 4, 8, 16] {
            for m in [0usize, 1, 2, 5, 33] {
                let words: Vec<u32> = (0..n * m).map(|_| rng.next_u32()).collect();
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                let lanes: Vec<Fletcher4> = (0..n)
                    .map(|i| {
                        let lane: Vec<u8> = words
                            .iter()
                            .skip(i)
                            .step_by(n)
                            .flat_map(|w| w.to_le_bytes())
                            .collect();
                        fletcher4_reference(&lane)
                    })
                    .collect();
                assert_eq!(
                    combine_lanes(&lanes),
                    fletcher4_reference(&bytes),
                    "n {n} m {m}"
                );
            }
        }
    }

    /// Every length up to 1031 bytes, then lengths sampled across 1 MiB: around the kernels'
    /// step sizes, random ones (odd, and not multiples of 4, among them) and the ends.
    fn lengths() -> Vec<usize> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xf1e7c4e4);
        let mut v: Vec<usize> = (0..=1031).collect();
        for k in [64usize, 4096, 16384, 32768, 131072, 524288] {
            v.extend([k - 3, k - 1, k, k + 1, k + 7]);
        }
        for _ in 0..150 {
            let len = rng.gen_range(0..=1usize << 20);
            v.extend([len, len | 1, len & !3]);
        }
        v.extend([(1 << 20) - 3, 1 << 20]);
        v
    }

    #[test]
    fn every_supported_kernel_matches_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xf1e7c4e5);
        let mut buf = vec![0u8; 1 << 20];
        rng.fill_bytes(&mut buf);
        let ones = vec![0xffu8; 1 << 20];
        let lens = lengths();
        assert!(lens.iter().any(|l| l % 2 == 1 && *l > 65536));
        let want: Vec<Fletcher4> = lens
            .iter()
            .map(|&l| fletcher4_reference(&buf[..l]))
            .collect();
        for k in Fletcher4Impl::ALL.into_iter().filter(|k| k.supported()) {
            for (&len, want) in lens.iter().zip(&want) {
                assert_eq!(k.run(&buf[..len]), *want, "{} len {len}", k.name());
            }
            // Saturated words exercise the wrapping arithmetic.
            assert_eq!(
                k.run(&ones),
                fletcher4_reference(&ones),
                "{} saturated",
                k.name()
            );
        }
        assert!(selected().is_ok());
    }

    #[test]
    fn unrolled_kernel_matches_reference_for_all_small_lengths_and_large_buffers() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xf1e7c4e5);
        let mut buf = vec![0u8; 1 << 20];
        rng.fill_bytes(&mut buf);
        for len in 0..=1031 {
            assert_eq!(
                fletcher4_unrolled(&buf[..len]),
                fletcher4_reference(&buf[..len]),
                "len {len}"
            );
        }
        for len in [4096, 16384, 131072 + 7, 1 << 20] {
            assert_eq!(
                fletcher4_unrolled(&buf[..len]),
                fletcher4_reference(&buf[..len]),
                "len {len}"
            );
        }
        // Saturated words exercise the wrapping arithmetic.
        let ones = vec![0xffu8; 65536];
        assert_eq!(fletcher4_unrolled(&ones), fletcher4_reference(&ones));
    }
}
