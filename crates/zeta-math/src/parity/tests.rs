use super::*;
use rand::{Rng, RngCore, SeedableRng};

type Rng64 = rand::rngs::StdRng;

/// The codecs a stripe of `width` columns can use (those with at least one data column).
fn codecs_for(width: usize) -> Vec<Codec> {
    let mut v = Vec::new();
    for (code, np) in [(Code::Xor, 1), (Code::Rs, 2), (Code::Rs, 3)] {
        if width > np {
            v.push(Codec::new(code, np).unwrap());
        }
    }
    if width > 2 {
        let p = rdp_prime_for(width - 2).unwrap();
        v.push(Codec::new(Code::Rdp { p }, 2).unwrap());
    }
    v
}

/// `len` rounded up to the codec's alignment.
fn aligned(c: &Codec, len: usize) -> usize {
    len.div_ceil(c.column_align()) * c.column_align()
}

/// Data column lengths for a stripe: 0 = all full, 1 = non-increasing (raidz's ragged last
/// row, in whole sectors when the length allows), 2 = arbitrary lengths <= len (zero included).
fn lengths(rng: &mut Rng64, ndata: usize, len: usize, mode: usize) -> Vec<usize> {
    match mode {
        0 => vec![len; ndata],
        1 => {
            let cut = rng.gen_range(0..ndata);
            let short = if len >= 1024 && len.is_multiple_of(512) {
                len - 512
            } else {
                len - len / 3
            };
            (0..ndata)
                .map(|i| if i < ndata - cut { len } else { short })
                .collect()
        }
        _ => (0..ndata)
            .map(|i| match i % 4 {
                0 => len,
                1 => 0,
                _ => rng.gen_range(0..=len),
            })
            .collect(),
    }
}

fn random_data(rng: &mut Rng64, lens: &[usize]) -> Vec<Vec<u8>> {
    lens.iter()
        .map(|&l| {
            let mut v = vec![0u8; l];
            rng.fill_bytes(&mut v);
            v
        })
        .collect()
}

fn refs(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(|d| &d[..]).collect()
}

fn muts(v: &mut [Vec<u8>]) -> Vec<&mut [u8]> {
    v.iter_mut().map(|d| &mut d[..]).collect()
}

fn parity_with(c: &Codec, imp: ParityImpl, data: &[Vec<u8>], len: usize) -> Vec<Vec<u8>> {
    let mut par = vec![vec![0xa5u8; len]; c.nparity()];
    c.generate_with(imp, &refs(data), &mut muts(&mut par));
    par
}

#[test]
fn small_known_values() {
    let rs3 = Codec::new(Code::Rs, 3).unwrap();
    let data = vec![vec![1u8, 0x80], vec![1u8, 0x80]];
    let par = parity_with(&rs3, ParityImpl::Scalar, &data, 2);
    // P = 1^1, Q = 1 ^ 2·1, R = 1 ^ 4·1; 0x80·2 = 0x1d (the polynomial), 0x80·4 = 0x3a.
    assert_eq!(
        par,
        vec![vec![0, 0], vec![3, 0x80 ^ 0x1d], vec![5, 0x80 ^ 0x3a]]
    );
    // The reference agrees.
    assert_eq!(reference::generate(Code::Rs, 3, &refs(&data), 2), par);
}

#[test]
fn rs_rows_are_the_direct_sums() {
    // Horner in every kernel against Σ g^i·D_i computed with log/exp for each byte.
    let mut rng = Rng64::seed_from_u64(11);
    let rs3 = Codec::new(Code::Rs, 3).unwrap();
    for n in [1usize, 2, 5, 21, 252] {
        let data = random_data(&mut rng, &vec![333; n]);
        for imp in ParityImpl::supported_list() {
            let par = parity_with(&rs3, imp, &data, 333);
            for x in [0usize, 1, 100, 332] {
                for (k, g) in [1u8, 2, 4].into_iter().enumerate() {
                    let want = (0..n).fold(0u8, |a, i| a ^ gf::mul(gf::pow(g, i), data[i][x]));
                    assert_eq!(par[k][x], want, "{} n {n} row {k} byte {x}", imp.name());
                }
            }
        }
    }
}

#[test]
fn every_kernel_matches_the_reference_for_every_width_and_code() {
    let mut rng = Rng64::seed_from_u64(0x9a41);
    // Sampled per width so the test stays fast; the list has aligned, odd and ragged sizes.
    let sizes = [
        512usize,
        1536,
        4096,
        4160,
        12288,
        20480,
        131072,
        1000,
        4097,
        64 * 7,
        77,
        65536,
    ];
    let kernels = ParityImpl::supported_list();
    for width in 3..=24usize {
        for (ci, c) in codecs_for(width).into_iter().enumerate() {
            let ndata = width - c.nparity();
            for t in 0..2 {
                let mut len = sizes[(width * 3 + ci * 5 + t * 7) % sizes.len()];
                if len == 131072 && width % 3 != 0 {
                    len = 16384; // the largest size on a third of the widths is enough
                }
                let len = aligned(&c, len);
                let mode = (width + ci + t) % 3;
                let lens = lengths(&mut rng, ndata, len, mode);
                let data = random_data(&mut rng, &lens);
                let want = reference::generate(c.code(), c.nparity(), &refs(&data), len);
                for &imp in &kernels {
                    let got = parity_with(&c, imp, &data, len);
                    assert!(
                        got == want,
                        "{} {:?}/{} width {width} len {len} lens {lens:?}",
                        imp.name(),
                        c.code(),
                        c.nparity()
                    );
                }
            }
        }
    }
}

#[test]
fn rdp_with_other_primes_matches_the_reference() {
    let mut rng = Rng64::seed_from_u64(0x4d9);
    for p in [3u32, 5, 7, 11, 13, 17, 257] {
        let c = Codec::new(Code::Rdp { p }, 2).unwrap();
        for ndata in [1, (p as usize - 1) / 2, p as usize - 1] {
            for len in [
                (p as usize - 1) * 24,
                (p as usize - 1) * 67,
                4096.max(p as usize - 1),
            ] {
                let len = aligned(&c, len);
                let lens = lengths(&mut rng, ndata, len, ndata % 3);
                let data = random_data(&mut rng, &lens);
                let want = reference::generate(c.code(), 2, &refs(&data), len);
                for imp in ParityImpl::supported_list() {
                    assert!(
                        parity_with(&c, imp, &data, len) == want,
                        "{} p {p} ndata {ndata} len {len}",
                        imp.name()
                    );
                }
            }
        }
    }
}

/// Every set of at most `nparity` columns of the stripe, erased (filled with garbage) and
/// rebuilt with every kernel, must come back byte for byte; survivors must not change.
fn check_all_erasures(rng: &mut Rng64, c: &Codec, lens: &[usize], len: usize) {
    let data = random_data(rng, lens);
    let par = reference::generate(c.code(), c.nparity(), &refs(&data), len);
    let cols: Vec<Vec<u8>> = par.into_iter().chain(data).collect();
    let np = c.nparity();
    let width = cols.len();
    let mut sets: Vec<Vec<usize>> = vec![vec![]];
    let mut frontier: Vec<Vec<usize>> = vec![vec![]];
    for _ in 0..np {
        let mut next = Vec::new();
        for set in &frontier {
            for col in set.last().map_or(0, |&l| l + 1)..width {
                let mut t = set.clone();
                t.push(col);
                next.push(t);
            }
        }
        sets.extend(next.iter().cloned());
        frontier = next;
    }
    let kernels = ParityImpl::supported_list();
    for (n, missing) in sets.iter().enumerate() {
        let imp = kernels[n % kernels.len()];
        let mut work = cols.clone();
        for &m in missing {
            rng.fill_bytes(&mut work[m]);
        }
        let (par, data) = work.split_at_mut(np);
        c.reconstruct_with(imp, &mut muts(par), &mut muts(data), missing)
            .unwrap();
        if work != cols {
            let bad: Vec<usize> = (0..width).filter(|&i| work[i] != cols[i]).collect();
            panic!(
                "{} {:?}/{np} width {width} len {len} lens {lens:?} missing {missing:?}: \
                 columns {bad:?} wrong",
                imp.name(),
                c.code()
            );
        }
    }
}

#[test]
fn every_erasure_combination_reconstructs() {
    let mut rng = Rng64::seed_from_u64(0xe7a5e);
    for width in [3usize, 4, 5, 6, 9, 13, 18, 24] {
        for c in codecs_for(width) {
            let ndata = width - c.nparity();
            for (len, mode) in [(4096, 0), (aligned(&c, 1000), 2), (aligned(&c, 4160), 1)] {
                let lens = lengths(&mut rng, ndata, len, mode);
                check_all_erasures(&mut rng, &c, &lens, len);
            }
        }
    }
}

#[test]
fn rdp_erasures_with_every_prime_and_shortening() {
    let mut rng = Rng64::seed_from_u64(0x7d7);
    for p in [3u32, 5, 7, 11, 13, 17] {
        let c = Codec::new(Code::Rdp { p }, 2).unwrap();
        for ndata in 1..p as usize {
            let len = (p as usize - 1) * 40;
            let lens = lengths(&mut rng, ndata, len, ndata % 3);
            check_all_erasures(&mut rng, &c, &lens, len);
        }
    }
}

#[test]
fn rs_every_kernel_rebuilds_two_data_columns_at_every_size() {
    // The rec2 fast path (P+Q, two data columns) on the sizes the pool uses and odd ones.
    let mut rng = Rng64::seed_from_u64(0x2ec2);
    let c = Codec::new(Code::Rs, 2).unwrap();
    for len in [4096usize, 12288, 20480, 131072, 4160, 513, 31] {
        let data = random_data(&mut rng, &[len; 8]);
        let par = reference::generate(Code::Rs, 2, &refs(&data), len);
        for imp in ParityImpl::supported_list() {
            for (x, y) in [(0usize, 1usize), (2, 7), (6, 7)] {
                let mut d = data.clone();
                let mut pp = par.clone();
                rng.fill_bytes(&mut d[x]);
                rng.fill_bytes(&mut d[y]);
                c.reconstruct_with(imp, &mut muts(&mut pp), &mut muts(&mut d), &[2 + x, 2 + y])
                    .unwrap();
                assert!(d == data, "{} len {len} lost {x},{y}", imp.name());
            }
        }
    }
}

#[test]
fn too_many_or_bad_missing_columns_are_errors() {
    for c in codecs_for(8) {
        let np = c.nparity();
        let len = aligned(&c, 4096);
        let mut data = vec![vec![7u8; len]; 8 - np];
        let mut par = vec![vec![0u8; len]; np];
        let too_many: Vec<usize> = (0..=np).collect();
        assert_eq!(
            c.reconstruct(&mut muts(&mut par), &mut muts(&mut data), &too_many),
            Err(ParityError::TooManyMissing {
                missing: np + 1,
                nparity: np
            })
        );
        assert_eq!(
            c.reconstruct(&mut muts(&mut par), &mut muts(&mut data), &[8]),
            Err(ParityError::NoSuchColumn {
                column: 8,
                width: 8
            })
        );
        if np >= 2 {
            assert_eq!(
                c.reconstruct(&mut muts(&mut par), &mut muts(&mut data), &[3, 3]),
                Err(ParityError::DuplicateMissing(3))
            );
        }
        // Nothing was touched by the refused calls.
        assert!(par.iter().all(|p| p.iter().all(|&b| b == 0)));
        assert!(data.iter().all(|d| d.iter().all(|&b| b == 7)));
        // Nothing missing is fine and changes nothing.
        c.reconstruct(&mut muts(&mut par), &mut muts(&mut data), &[])
            .unwrap();
        assert!(par.iter().all(|p| p.iter().all(|&b| b == 0)));
    }
}

#[test]
fn codec_validation() {
    assert!(Codec::new(Code::Xor, 1).is_ok());
    assert!(matches!(
        Codec::new(Code::Xor, 2),
        Err(ParityError::BadParityCount { .. })
    ));
    assert!(Codec::new(Code::Rs, 2).is_ok() && Codec::new(Code::Rs, 3).is_ok());
    assert!(Codec::new(Code::Rs, 1).is_err() && Codec::new(Code::Rs, 4).is_err());
    assert!(Codec::new(Code::Rdp { p: 17 }, 2).is_ok());
    assert!(Codec::new(Code::Rdp { p: 17 }, 3).is_err());
    for p in [0u32, 1, 2, 4, 9, 15, 259, 65537] {
        assert_eq!(
            Codec::new(Code::Rdp { p }, 2),
            Err(ParityError::BadPrime { p })
        );
    }
    let c = Codec::new(Code::Rdp { p: 257 }, 2).unwrap();
    assert_eq!((c.max_data(), c.column_align(), c.nparity()), (256, 256, 2));
    let c = Codec::new(Code::Rs, 3).unwrap();
    assert_eq!((c.max_data(), c.column_align()), (252, 1));
}

#[test]
fn rdp_primes() {
    assert_eq!(rdp_prime_for(0), Some(3));
    assert_eq!(rdp_prime_for(2), Some(3));
    assert_eq!(rdp_prime_for(3), Some(5));
    assert_eq!(rdp_prime_for(4), Some(5));
    assert_eq!(rdp_prime_for(5), Some(17));
    assert_eq!(rdp_prime_for(16), Some(17));
    assert_eq!(rdp_prime_for(22), Some(257));
    assert_eq!(rdp_prime_for(256), Some(257));
    assert_eq!(rdp_prime_for(257), None);
    for n in [1usize, 4, 16, 256] {
        let p = rdp_prime_for(n).unwrap();
        assert!(is_prime(p) && (p - 1).is_power_of_two() && 4096 % (p - 1) == 0);
    }
}

#[test]
fn override_values() {
    assert_eq!(
        parse_override("scalar"),
        Ok(Selection::Fixed(ParityImpl::Scalar))
    );
    assert_eq!(parse_override("cycle"), Ok(Selection::Cycle));
    let err = parse_override("avx9000").unwrap_err();
    assert!(
        err.contains("ZETA_PARITY_IMPL=avx9000") && err.contains("not one of"),
        "{err}"
    );
    for k in ParityImpl::ALL {
        assert_eq!(ParityImpl::from_name(k.name()), Some(k));
        match parse_override(k.name()) {
            Ok(sel) => assert!(k.supported() && sel == Selection::Fixed(k)),
            Err(e) => assert!(!k.supported() && e.contains("cannot run"), "{e}"),
        }
    }
    // The process's own choice (whatever the environment says) is usable here.
    if check_override().is_ok() {
        let c = Codec::new(Code::Rs, 2).unwrap();
        let data = vec![vec![1u8; 64]; 3];
        let mut par = vec![vec![0u8; 64]; 2];
        c.generate(&refs(&data), &mut muts(&mut par));
        assert_eq!(par, reference::generate(Code::Rs, 2, &refs(&data), 64));
    }
}

#[test]
fn rdp_refuses_unaligned_columns() {
    let c = Codec::new(Code::Rdp { p: 17 }, 2).unwrap();
    let data = vec![vec![0u8; 100]];
    let mut par = vec![vec![0u8; 100]; 2];
    let r = std::panic::catch_unwind(move || c.generate(&refs(&data), &mut muts(&mut par)));
    let msg = r.expect_err("a 100-byte column is no multiple of 16");
    let msg = msg.downcast_ref::<String>().expect("a formatted message");
    assert!(msg.contains("not a positive multiple of 16"), "{msg}");
}

#[test]
fn rdp_tiled_encoding_matches_the_reference() {
    // The encoder can walk each packet in strips (the codec does not, it measured slower);
    // every strip width must give the same parity.
    let mut rng = Rng64::seed_from_u64(0x711e);
    let p = 17usize;
    let len = 16 * 1000;
    for lens in [vec![len; 9], lengths(&mut rng, 16, len, 2)] {
        let data = random_data(&mut rng, &lens);
        let want = reference::generate(Code::Rdp { p: 17 }, 2, &refs(&data), len);
        for tile in [1usize, 64, 100, 999, 1000, 5000] {
            let (mut row, mut diag) = (vec![0xeeu8; len], vec![0x11u8; len]);
            let job = engine::RdpGen {
                p,
                s: len / (p - 1),
                data: &refs(&data),
                row: row.as_mut_ptr(),
                diag: diag.as_mut_ptr(),
                tile,
            };
            // SAFETY: the scalar lanes need no CPU feature; row and diag are len bytes,
            // distinct, and every data column is at most len bytes.
            unsafe { engine::rdp_generate::<u64, 2>(&job) };
            assert!(vec![row, diag] == want, "tile {tile} lens {lens:?}");
        }
    }
}

#[test]
fn cycle_mode_visits_every_supported_kernel_in_turn() {
    let list = ParityImpl::supported_list();
    let picks: Vec<ParityImpl> = (0..2 * list.len())
        .map(|n| pick(Selection::Cycle, &list, || n))
        .collect();
    assert_eq!(picks[..list.len()], list[..]);
    assert_eq!(picks[list.len()..], list[..]);
    assert_eq!(
        pick(
            Selection::Fixed(ParityImpl::Scalar),
            &list,
            || unreachable!()
        ),
        ParityImpl::Scalar
    );
}
