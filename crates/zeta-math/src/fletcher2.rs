//! Fletcher-2 as ZFS defines it (`fletcher_2_native`): the input is read as little-endian
//! 64-bit words taken in pairs (w0, w1), and two interleaved Fletcher streams of 64-bit sums
//! (all mod 2^64) run over them, one over the even words and one over the odd words:
//!
//! ```text
//! a0 += w0; a1 += w1; b0 += a0; b1 += a1
//! ```
//!
//! The result is `[a0, a1, b0, b1]`. A length that is not a multiple of 16 bytes is
//! zero-padded to the next multiple of 16, so every length has a defined checksum (zeta's
//! blocks are whole sectors of 4096 bytes, and ZFS itself only ever checksums multiples of 512
//! bytes, so no block on disk has a padded pair). Padding means two inputs that differ only by
//! trailing zero bytes within the last pair share a checksum; the block pointer records the
//! length, so that never makes two blocks ambiguous.
//!
//! Fletcher-2 is weak: its sums are as wide as its words, so nothing carries out of the top
//! bit. Flipping the top bit of two words of one stream adds 2·2^63 = 0 to `a` and
//! (m1 + m2)·2^63 to `b` (m = the pairs' distances from the end), which is 0 whenever m1 and
//! m2 have the same parity: half of such double errors go unseen (a test shows one). ZFS
//! keeps it for old pools; zeta offers it for the same comparison, not as a default.
//!
//! Kernels: the reference (one pair at a time), a portable one with eight independent lanes
//! in plain Rust (which the compiler vectorizes with the baseline ISA), and on x86-64 AVX2 and
//! AVX-512 kernels with 16 and 32 lanes. A lane sums the words whose index is its own mod the
//! lane count; [`combine_lanes`] folds the lanes back into the two streams. The kernel in use
//! is picked once per process by a short benchmark among those the CPU supports;
//! `ZETA_FLETCHER2_IMPL=reference|unrolled|avx2|avx512` overrides the choice.

/// The Fletcher-2 sums `[a0, a1, b0, b1]`: `a` sums the even (0) or odd (1) words, `b` sums
/// the running `a` (all mod 2^64).
pub type Fletcher2 = [u64; 4];

/// Bytes per step of the definition: one pair of 64-bit words.
pub const PAIR_BYTES: usize = 16;

/// Scalar reference: one pair of words at a time, exactly the definition.
pub fn fletcher2_reference(data: &[u8]) -> Fletcher2 {
    continue_pairs([0; 4], data)
}

/// Runs the definition over `data` starting from state `s` (used for tails after a kernel):
/// whole pairs, then the zero-padded last one.
fn continue_pairs(s: Fletcher2, data: &[u8]) -> Fletcher2 {
    let [mut a0, mut a1, mut b0, mut b1] = s;
    let mut step = |pair: &[u8]| {
        let (w0, w1) = pair.split_at(8);
        a0 = a0.wrapping_add(u64::from_le_bytes(w0.try_into().expect("8 bytes")));
        a1 = a1.wrapping_add(u64::from_le_bytes(w1.try_into().expect("8 bytes")));
        b0 = b0.wrapping_add(a0);
        b1 = b1.wrapping_add(a1);
    };
    let mut pairs = data.chunks_exact(PAIR_BYTES);
    for pair in &mut pairs {
        step(pair);
    }
    let rest = pairs.remainder();
    if !rest.is_empty() {
        let mut pair = [0u8; PAIR_BYTES];
        pair[..rest.len()].copy_from_slice(rest);
        step(&pair);
    }
    [a0, a1, b0, b1]
}

/// Folds lane states into the two streams' state.
///
/// `lanes[l] = [A, B]` summed the words with index ≡ l (mod V), V = `lanes.len()` (even), over
/// M full rounds of V words. Lane l belongs to stream s = l mod 2 as its sub-lane i = l / 2 of
/// N = V / 2: it saw the stream's pairs p = N·k + i (k = 0..M). In the stream, the word of pair
/// p weighs 1 in `a` and P − p in `b` (P = N·M pairs); in the lane it weighs 1 and M − k. Since
/// P − p = N·(M − k) − i, the stream's sums are a_s = Σ A and b_s = Σ (N·B − i·A) (mod 2^64).
pub fn combine_lanes(lanes: &[[u64; 2]]) -> Fletcher2 {
    assert!(
        lanes.len().is_multiple_of(2),
        "fletcher2 lanes come in stream pairs, not {}",
        lanes.len()
    );
    let n = (lanes.len() / 2) as u64;
    let mut out = [0u64; 4];
    for (l, &[a, b]) in lanes.iter().enumerate() {
        let (stream, i) = (l % 2, (l / 2) as u64);
        out[stream] = out[stream].wrapping_add(a);
        out[2 + stream] = out[2 + stream]
            .wrapping_add(n.wrapping_mul(b))
            .wrapping_sub(i.wrapping_mul(a));
    }
    out
}

/// Lanes of the portable kernel (64 bytes per step).
const PORTABLE_LANES: usize = 8;

/// The portable kernel: [`PORTABLE_LANES`] independent lanes in plain arrays, so the additions
/// of a step do not wait on each other and the compiler can keep them in vector registers.
pub fn fletcher2_unrolled(data: &[u8]) -> Fletcher2 {
    const STEP: usize = PORTABLE_LANES * 8;
    let mut a = [0u64; PORTABLE_LANES];
    let mut b = [0u64; PORTABLE_LANES];
    let mut steps = data.chunks_exact(STEP);
    for step in &mut steps {
        for (l, w) in step.chunks_exact(8).enumerate() {
            a[l] = a[l].wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        for l in 0..PORTABLE_LANES {
            b[l] = b[l].wrapping_add(a[l]);
        }
    }
    let lanes: [[u64; 2]; PORTABLE_LANES] = std::array::from_fn(|l| [a[l], b[l]]);
    continue_pairs(combine_lanes(&lanes), steps.remainder())
}

/// A Fletcher-2 kernel implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fletcher2Impl {
    Reference,
    Unrolled,
    Avx2,
    Avx512,
}

/// The environment variable that overrides the kernel choice.
pub const OVERRIDE_ENV: &str = "ZETA_FLETCHER2_IMPL";

impl Fletcher2Impl {
    pub const ALL: [Fletcher2Impl; 4] = [Self::Reference, Self::Unrolled, Self::Avx2, Self::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            Self::Reference => "reference",
            Self::Unrolled => "unrolled",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the kernel.
    pub fn supported(self) -> bool {
        match self {
            Self::Reference | Self::Unrolled => true,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => std::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 => std::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The supported kernels, in [`ALL`](Self::ALL) order.
    pub fn supported_list() -> Vec<Fletcher2Impl> {
        Self::ALL.into_iter().filter(|k| k.supported()).collect()
    }

    /// The kernel's entry point, if this CPU can run it.
    pub fn kernel(self) -> Option<fn(&[u8]) -> Fletcher2> {
        if !self.supported() {
            return None;
        }
        Some(match self {
            Self::Reference => fletcher2_reference,
            Self::Unrolled => fletcher2_unrolled,
            // The pointers are handed out only after `supported()` confirmed the CPU feature
            // above, and CPU features do not change while the process runs.
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => |d| {
                // SAFETY: the CPU has AVX2 (checked before this pointer was returned).
                unsafe { x86::fletcher2_avx2(d) }
            },
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 => |d| {
                // SAFETY: the CPU has AVX-512F (checked before this pointer was returned).
                unsafe { x86::fletcher2_avx512(d) }
            },
            #[cfg(not(target_arch = "x86_64"))]
            _ => return None,
        })
    }

    /// Runs the kernel; panics if the CPU lacks it (check [`supported`](Self::supported)).
    pub fn run(self, data: &[u8]) -> Fletcher2 {
        let k = self.kernel();
        k.unwrap_or_else(|| panic!("fletcher2 {} not supported here", self.name()))(data)
    }
}

/// Parses a `ZETA_FLETCHER2_IMPL` value. Unknown or unsupported names are errors, not silent
/// fallbacks.
pub fn parse_override(value: &str) -> Result<Fletcher2Impl, String> {
    super::select::resolve_override(
        OVERRIDE_ENV,
        value,
        &Fletcher2Impl::ALL,
        Fletcher2Impl::name,
        Fletcher2Impl::supported,
        &[],
    )
}

/// The kernel this process uses: `ZETA_FLETCHER2_IMPL` if set, else the fastest supported one
/// on a short benchmark. Resolved once. Pools call this before opening, so nothing is written
/// under a bad setting.
pub fn selected() -> Result<Fletcher2Impl, String> {
    static CHOICE: std::sync::OnceLock<Result<Fletcher2Impl, String>> = std::sync::OnceLock::new();
    CHOICE
        .get_or_init(|| match std::env::var(OVERRIDE_ENV) {
            Ok(name) => parse_override(&name),
            Err(_) => Ok(fastest()),
        })
        .clone()
}

/// Times each supported kernel on a 64 KiB buffer and returns the quickest.
fn fastest() -> Fletcher2Impl {
    let buf = super::select::timing_buffer();
    super::select::fastest(
        Fletcher2Impl::supported_list(),
        Fletcher2Impl::Unrolled,
        |k| {
            std::hint::black_box(k.run(std::hint::black_box(&buf)));
        },
    )
}

/// Fletcher-2 with the selected kernel. If `ZETA_FLETCHER2_IMPL` names a kernel that cannot
/// run, the portable kernel is used (pools refuse to open with the bad setting, so nothing is
/// written under it). The choice is resolved once; each call is one indirect call.
pub fn fletcher2(data: &[u8]) -> Fletcher2 {
    static KERNEL: std::sync::OnceLock<fn(&[u8]) -> Fletcher2> = std::sync::OnceLock::new();
    let k = KERNEL.get_or_init(|| {
        selected()
            .ok()
            .and_then(Fletcher2Impl::kernel)
            .unwrap_or(fletcher2_unrolled)
    });
    k(data)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{combine_lanes, continue_pairs, Fletcher2};
    use std::arch::x86_64::*;

    /// Accumulator sets per kernel: four independent (a, b) vector pairs per step, so a step's
    /// additions do not wait on one another (each chain is one add per step).
    const SETS: usize = 4;

    /// Folds the sets into one vector pair, as if a single set had run over the same words:
    /// set r is sub-lane r of SETS (the rule of [`combine_lanes`] one level up), so
    /// A = Σ A_r and B = SETS·Σ B_r − Σ r·A_r. Then the W lanes of that pair are folded into
    /// the streams in scalar code, and the bytes the vectors did not cover run through the
    /// definition. Folding in vector registers first keeps the per-call cost at W lanes, not
    /// SETS·W, which matters for 4 KiB blocks.
    macro_rules! fold_sets {
        ($a:expr, $b:expr, $zero:ident, $add:ident, $sub:ident, $shl:ident) => {{
            const _: () = assert!(SETS == 4, "the shift by 2 below multiplies by SETS");
            let (a, b) = ($a, $b);
            let (mut asum, mut bsum) = (a[0], b[0]);
            for r in 1..SETS {
                asum = $add(asum, a[r]);
                bsum = $add(bsum, b[r]);
            }
            // Σ r·A_r as a sum of suffix sums: A3 + (A3 + A2) + (A3 + A2 + A1).
            let (mut suffix, mut weighted) = ($zero(), $zero());
            for r in (1..SETS).rev() {
                suffix = $add(suffix, a[r]);
                weighted = $add(weighted, suffix);
            }
            (asum, $sub($shl::<2>(bsum), weighted))
        }};
    }

    /// Folds the W lanes of the single vector pair into the streams and finishes the tail.
    fn finish<const W: usize>(a: [u64; W], b: [u64; W], tail: &[u8]) -> Fletcher2 {
        let lanes: [[u64; 2]; W] = std::array::from_fn(|e| [a[e], b[e]]);
        continue_pairs(combine_lanes(&lanes), tail)
    }

    /// 16 lanes: four sets of 256-bit vectors, 128 bytes per step.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn fletcher2_avx2(data: &[u8]) -> Fletcher2 {
        const STEP: usize = SETS * 32;
        let steps = data.len() / STEP;
        let mut a = [_mm256_setzero_si256(); SETS];
        let mut b = [_mm256_setzero_si256(); SETS];
        let p = data.as_ptr();
        for k in 0..steps {
            for r in 0..SETS {
                // SAFETY: k < steps, so bytes STEP·k + 32r .. +32 lie inside `data`; loadu has
                // no alignment requirement.
                let w = unsafe { _mm256_loadu_si256(p.add(STEP * k + 32 * r) as *const __m256i) };
                a[r] = _mm256_add_epi64(a[r], w);
                b[r] = _mm256_add_epi64(b[r], a[r]);
            }
        }
        let (fa, fb) = fold_sets!(
            a,
            b,
            _mm256_setzero_si256,
            _mm256_add_epi64,
            _mm256_sub_epi64,
            _mm256_slli_epi64
        );
        let (mut sa, mut sb) = ([0u64; 4], [0u64; 4]);
        // SAFETY: each target is 32 writable bytes; storeu has no alignment requirement.
        unsafe {
            _mm256_storeu_si256(sa.as_mut_ptr() as *mut __m256i, fa);
            _mm256_storeu_si256(sb.as_mut_ptr() as *mut __m256i, fb);
        }
        finish(sa, sb, &data[steps * STEP..])
    }

    /// 32 lanes: four sets of 512-bit vectors, 256 bytes per step.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fletcher2_avx512(data: &[u8]) -> Fletcher2 {
        const STEP: usize = SETS * 64;
        let steps = data.len() / STEP;
        let mut a = [_mm512_setzero_si512(); SETS];
        let mut b = [_mm512_setzero_si512(); SETS];
        let p = data.as_ptr();
        for k in 0..steps {
            for r in 0..SETS {
                // SAFETY: k < steps, so bytes STEP·k + 64r .. +64 lie inside `data`; loadu has
                // no alignment requirement.
                let w = unsafe { _mm512_loadu_si512(p.add(STEP * k + 64 * r) as *const __m512i) };
                a[r] = _mm512_add_epi64(a[r], w);
                b[r] = _mm512_add_epi64(b[r], a[r]);
            }
        }
        let (fa, fb) = fold_sets!(
            a,
            b,
            _mm512_setzero_si512,
            _mm512_add_epi64,
            _mm512_sub_epi64,
            _mm512_slli_epi64
        );
        let (mut sa, mut sb) = ([0u64; 8], [0u64; 8]);
        // SAFETY: each target is 64 writable bytes; storeu has no alignment requirement.
        unsafe {
            _mm512_storeu_si512(sa.as_mut_ptr() as *mut __m512i, fa);
            _mm512_storeu_si512(sb.as_mut_ptr() as *mut __m512i, fb);
        }
        finish(sa, sb, &data[steps * STEP..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};

    fn pairs(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn known_values() {
        assert_eq!(fletcher2_reference(&[]), [0, 0, 0, 0]);
        // Pairs (1, 2), (3, 4): a0 = 1+3, a1 = 2+4, b0 = 1 + 4, b1 = 2 + 6.
        assert_eq!(fletcher2_reference(&pairs(&[1, 2, 3, 4])), [4, 6, 5, 8]);
        // Wrapping: two pairs of all-ones words.
        let m = u64::MAX;
        assert_eq!(
            fletcher2_reference(&pairs(&[m, m, m, m])),
            [m - 1, m - 1, m.wrapping_add(m - 1), m.wrapping_add(m - 1)]
        );
    }

    #[test]
    fn a_short_tail_is_zero_padded_to_a_pair() {
        // 1 byte, 9 bytes and 17 bytes are their zero-padded 16, 16 and 32.
        let data: Vec<u8> = (1..=32).collect();
        for len in [1usize, 9, 15, 17, 31] {
            let mut padded = data[..len].to_vec();
            padded.resize(len.next_multiple_of(PAIR_BYTES), 0);
            assert_eq!(
                fletcher2_reference(&data[..len]),
                fletcher2_reference(&padded),
                "len {len}"
            );
        }
        // Byte 8 of a pair is the low byte of the odd word.
        let mut one = [0u8; 16];
        one[8] = 5;
        assert_eq!(fletcher2_reference(&one[..9]), [0, 5, 0, 5]);
    }

    #[test]
    fn lane_combination_matches_the_streams() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        for v in [2usize, 4, 8, 16, 32] {
            for m in [0usize, 1, 2, 5, 33] {
                let words: Vec<u64> = (0..v * m).map(|_| rng.next_u64()).collect();
                let lanes: Vec<[u64; 2]> = (0..v)
                    .map(|l| {
                        let (mut a, mut b) = (0u64, 0u64);
                        for &w in words.iter().skip(l).step_by(v) {
                            a = a.wrapping_add(w);
                            b = b.wrapping_add(a);
                        }
                        [a, b]
                    })
                    .collect();
                assert_eq!(
                    combine_lanes(&lanes),
                    fletcher2_reference(&pairs(&words)),
                    "lanes {v} rounds {m}"
                );
            }
        }
    }

    /// Every length that is a multiple of 16 up to 1 KiB, then lengths sampled across 1 MiB:
    /// odd multiples of 16, multiples of 16 just around the kernels' step sizes, random
    /// multiples of 16, and a few that are no multiple of 16 (zero-padded).
    fn lengths() -> Vec<usize> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xf1e7c4e2);
        let mut v: Vec<usize> = (0..=1024).step_by(16).collect();
        for step in [64usize, 128, 256] {
            for k in [1usize, 2, 3, 31, 32, 33, 4095, 4096, 4097] {
                v.extend([step * k - 16, step * k, step * k + 16]);
            }
        }
        for _ in 0..120 {
            let pairs = rng.gen_range(0..=(1usize << 16));
            v.push(16 * pairs);
            v.push(16 * (pairs | 1).min((1 << 16) - 1)); // an odd number of pairs
        }
        v.extend([1, 7, 8, 9, 15, 17, 4095, 4097, (1 << 20) - 1, 1 << 20]);
        v.retain(|&l| l <= 1 << 20);
        v
    }

    #[test]
    fn every_supported_kernel_matches_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0xf1e7c4e2);
        let mut buf = vec![0u8; 1 << 20];
        rng.fill_bytes(&mut buf);
        let lens = lengths();
        assert!(lens.iter().any(|l| l % 32 == 16 && *l > 65536));
        let kernels = Fletcher2Impl::supported_list();
        assert!(kernels.contains(&Fletcher2Impl::Unrolled));
        for &len in &lens {
            let want = fletcher2_reference(&buf[..len]);
            for &k in &kernels {
                assert_eq!(k.run(&buf[..len]), want, "{} len {len}", k.name());
            }
        }
        // Saturated words exercise the wrapping arithmetic.
        let ones = vec![0xffu8; 1 << 20];
        let want = fletcher2_reference(&ones);
        for &k in &kernels {
            assert_eq!(k.run(&ones), want, "{} saturated", k.name());
        }
        assert!(selected().is_ok());
        assert_eq!(fletcher2(&buf[..4096]), fletcher2_reference(&buf[..4096]));
    }

    #[test]
    fn overrides_parse_strictly() {
        assert_eq!(parse_override("reference"), Ok(Fletcher2Impl::Reference));
        assert_eq!(parse_override("unrolled"), Ok(Fletcher2Impl::Unrolled));
        let err = parse_override("bogus").unwrap_err();
        assert!(err.contains(OVERRIDE_ENV) && err.contains("bogus"), "{err}");
        for k in Fletcher2Impl::ALL {
            assert_eq!(parse_override(k.name()).is_ok(), k.supported(), "{k:?}");
        }
    }
}
