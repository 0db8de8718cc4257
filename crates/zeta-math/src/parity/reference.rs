//! The codes straight from their definitions, one byte at a time with log/exp arithmetic:
//! what every kernel is compared against in the tests.

use super::{gf, Code};

/// Byte `x` of data column `i`, zero past its end.
fn byte(data: &[&[u8]], i: usize, x: usize) -> u8 {
    data[i].get(x).copied().unwrap_or(0)
}

/// The parity columns (each `len` bytes) of `data` under `code` with `nparity` columns.
pub fn generate(code: Code, nparity: usize, data: &[&[u8]], len: usize) -> Vec<Vec<u8>> {
    match code {
        Code::Xor | Code::Rs => (0..nparity)
            .map(|k| {
                let g = [1u8, 2, 4][k];
                (0..len)
                    .map(|x| {
                        (0..data.len())
                            .fold(0u8, |acc, i| acc ^ gf::mul(gf::pow(g, i), byte(data, i, x)))
                    })
                    .collect()
            })
            .collect(),
        Code::Rdp { p } => {
            let p = p as usize;
            let s = len / (p - 1);
            assert_eq!(s * (p - 1), len);
            // Byte o of packet (row r, disk j) of the data disks; absent disks are zero.
            let data_byte = |r: usize, j: usize, o: usize| {
                if j < data.len() {
                    byte(data, j, r * s + o)
                } else {
                    0
                }
            };
            let row: Vec<u8> = (0..len)
                .map(|x| (0..p - 1).fold(0u8, |a, j| a ^ data_byte(x / s, j, x % s)))
                .collect();
            // Disk p-1 is the row parity.
            let disk_byte = |r: usize, k: usize, o: usize| {
                if k == p - 1 {
                    row[r * s + o]
                } else {
                    data_byte(r, k, o)
                }
            };
            let diag: Vec<u8> = (0..len)
                .map(|x| {
                    let (d, o) = (x / s, x % s);
                    (0..p).fold(0u8, |a, k| {
                        let r = (d + p - k) % p;
                        if r == p - 1 {
                            a
                        } else {
                            a ^ disk_byte(r, k, o)
                        }
                    })
                })
                .collect();
            vec![row, diag]
        }
    }
}
