//! GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d), the field of RAID-6 and of
//! ZFS raidz2/3, by log/exp tables. 2 generates the multiplicative group (order 255).
//!
//! These are the obviously-correct scalar definitions; the kernels only take prepared
//! multiply-by-constant tables from here ([`mul_table`], [`nibble_tables`], [`bit_matrix`]).

/// The field polynomial, with the x^8 term.
pub const POLY: u16 = 0x11d;

const fn build_tables() -> ([u8; 512], [u8; 256]) {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    (exp, log)
}

const TABLES: ([u8; 512], [u8; 256]) = build_tables();
/// EXP[i] = 2^i for i in 0..510 (the table repeats so LOG[a] + LOG[b] needs no reduction).
pub static EXP: [u8; 512] = TABLES.0;
/// LOG[a] = i with 2^i = a, for a != 0 (LOG[0] is meaningless and never read).
pub static LOG: [u8; 256] = TABLES.1;

/// a · b.
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
    }
}

/// 1 / a; `a` must not be 0.
pub fn inv(a: u8) -> u8 {
    assert_ne!(a, 0, "0 has no inverse in GF(2^8)");
    EXP[255 - LOG[a as usize] as usize]
}

/// g^e.
pub fn pow(g: u8, e: usize) -> u8 {
    if g == 0 {
        return u8::from(e == 0);
    }
    EXP[(LOG[g as usize] as usize * (e % 255)) % 255]
}

/// c·2^j for j in 0..8: the images of the basis bits, from which every prepared table is
/// built (multiplication by a constant is linear over GF(2)), by doubling.
fn basis_images(c: u8) -> [u8; 8] {
    let mut out = [0u8; 8];
    let mut x = c;
    for o in out.iter_mut() {
        *o = x;
        x = (x << 1)
            ^ if x & 0x80 != 0 {
                (POLY & 0xff) as u8
            } else {
                0
            };
    }
    out
}

/// The 256-entry product table of `c` (the scalar kernels' multiply-by-constant).
pub fn mul_table(c: u8) -> [u8; 256] {
    // By linearity: c·(2^b + i) = c·2^b ^ c·i for i < 2^b.
    let img = basis_images(c);
    let mut t = [0u8; 256];
    for (b, &cb) in img.iter().enumerate() {
        for i in 0..1usize << b {
            t[(1 << b) + i] = t[i] ^ cb;
        }
    }
    t
}

/// The split-nibble tables of `c` for `pshufb`: c·x = lo[x & 15] ^ hi[x >> 4].
pub fn nibble_tables(c: u8) -> ([u8; 16], [u8; 16]) {
    let img = basis_images(c);
    let span = |bits: &[u8]| -> [u8; 16] {
        std::array::from_fn(|i| {
            (0..4).fold(0u8, |a, b| if i >> b & 1 == 1 { a ^ bits[b] } else { a })
        })
    };
    (span(&img[..4]), span(&img[4..]))
}

/// Multiplication by `c` as the 8x8 bit matrix `vgf2p8affineqb` takes: output bit i is the
/// parity of (byte 7-i of the matrix) AND x. Multiplication by a constant is linear over GF(2),
/// so output bit i of c·x is the XOR over input bits j of bit i of c·2^j.
pub fn bit_matrix(c: u8) -> u64 {
    let img = basis_images(c);
    let mut m = 0u64;
    for i in 0..8 {
        let row = (0..8).fold(0u8, |row, j| row | ((img[j] >> i) & 1) << j);
        m |= (row as u64) << (8 * (7 - i));
    }
    m
}

/// Inverts the n x n matrix `a` (n <= 3) by Gauss-Jordan elimination; None if singular.
pub fn invert(a: &[[u8; 3]; 3], n: usize) -> Option<[[u8; 3]; 3]> {
    assert!((1..=3).contains(&n));
    let mut m = *a;
    let mut out = [[0u8; 3]; 3];
    for (i, row) in out.iter_mut().enumerate().take(n) {
        row[i] = 1;
    }
    for col in 0..n {
        let pivot = (col..n).find(|&r| m[r][col] != 0)?;
        m.swap(col, pivot);
        out.swap(col, pivot);
        let f = inv(m[col][col]);
        for k in 0..n {
            m[col][k] = mul(m[col][k], f);
            out[col][k] = mul(out[col][k], f);
        }
        for r in 0..n {
            if r != col && m[r][col] != 0 {
                let f = m[r][col];
                for k in 0..n {
                    m[r][k] ^= mul(f, m[col][k]);
                    out[r][k] ^= mul(f, out[col][k]);
                }
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shift-and-add multiplication straight from the polynomial, independent of the tables.
    fn mul_slow(mut a: u8, mut b: u8) -> u8 {
        let mut r = 0u8;
        while b != 0 {
            if b & 1 == 1 {
                r ^= a;
            }
            let carry = a & 0x80 != 0;
            a <<= 1;
            if carry {
                a ^= (POLY & 0xff) as u8;
            }
            b >>= 1;
        }
        r
    }

    #[test]
    fn tables_agree_with_polynomial_multiplication() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul_slow(a, b), "{a} * {b}");
            }
            if a != 0 {
                assert_eq!(mul(a, inv(a)), 1, "inverse of {a}");
            }
        }
        // 2 generates the whole multiplicative group.
        let mut seen = [false; 256];
        for i in 0..255 {
            assert!(!seen[EXP[i] as usize]);
            seen[EXP[i] as usize] = true;
        }
        assert_eq!(pow(2, 255), 1);
        assert_eq!(pow(4, 3), 64);
    }

    #[test]
    fn prepared_tables_multiply() {
        for c in [0u8, 1, 2, 3, 4, 0x1d, 0x8e, 0xff] {
            let t = mul_table(c);
            let (lo, hi) = nibble_tables(c);
            let m = bit_matrix(c);
            for x in 0..=255u8 {
                assert_eq!(t[x as usize], mul(c, x));
                assert_eq!(lo[(x & 15) as usize] ^ hi[(x >> 4) as usize], mul(c, x));
                // Affine transform by the definition in the Intel SDM.
                let mut y = 0u8;
                for i in 0..8 {
                    let row = (m >> (8 * (7 - i))) as u8;
                    y |= (((row & x).count_ones() & 1) as u8) << i;
                }
                assert_eq!(y, mul(c, x), "matrix of {c} on {x}");
            }
        }
    }

    #[test]
    fn inversion() {
        let a = [[1, 1, 1], [1, 2, 4], [1, 4, 16]];
        let b = invert(&a, 3).unwrap();
        let product = |i: usize, j: usize| (0..3).fold(0, |s, k| s ^ mul(a[i][k], b[k][j]));
        for i in 0..3 {
            assert_eq!(
                [product(i, 0), product(i, 1), product(i, 2)],
                std::array::from_fn(|j| u8::from(i == j))
            );
        }
        assert!(invert(&[[1, 1, 0], [1, 1, 0], [0, 0, 1]], 3).is_none());
        assert_eq!(
            invert(&[[7, 0, 0], [0; 3], [0; 3]], 1).unwrap()[0][0],
            inv(7)
        );
    }
}
