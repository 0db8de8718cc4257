//! `zeta bench checksum`: every checksum algorithm, and every Fletcher kernel this CPU runs,
//! single core on cache-resident buffers, against a memory-read reference measured in the same
//! run on the same buffers.
//!
//! The reference reads the buffer once and sums its 64-bit words (wrapping): a plain loop the
//! compiler vectorizes, compiled for the widest of SSE2 / AVX2 / AVX-512 this CPU has. It does
//! the least work a checksum can do (load every byte once), so the ratio says how close an
//! algorithm gets to the cost of merely reading its input. SHA-256 and BLAKE3 run as the pool
//! runs them (`ChecksumKind::compute`), with the code their crates pick at run time.

use std::time::Duration;

use rand::{RngCore, SeedableRng};
use serde_json::json;

use crate::args::BenchChecksumArgs;
use crate::parity::{calibrate, sample};
use zeta_math::fletcher::Fletcher4Impl;
use zeta_math::fletcher2::Fletcher2Impl;
use zeta_math::ChecksumKind;
use zeta_server::{usage, Result};

/// Buffer sizes: a 4 KiB sector-sized block (in L1) and a 128 KiB volume block (in L2 on
/// current x86 cores); each is checksummed over and over, so it stays in cache.
const SIZES: [usize; 2] = [4096, 131072];

/// How a contender computes.
#[derive(Clone, Copy)]
enum Run {
    /// The memory-read reference.
    Read(fn(&[u8]) -> u64),
    /// A Fletcher kernel: four 64-bit sums.
    Sums(fn(&[u8]) -> [u64; 4]),
    /// A digest through `ChecksumKind::compute`.
    Digest(ChecksumKind),
}

impl Run {
    fn once(self, data: &[u8]) {
        match self {
            Run::Read(f) => {
                std::hint::black_box(f(std::hint::black_box(data)));
            }
            Run::Sums(f) => {
                std::hint::black_box(f(std::hint::black_box(data)));
            }
            Run::Digest(k) => {
                std::hint::black_box(k.compute(std::hint::black_box(data)));
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Contender {
    algorithm: &'static str,
    imp: &'static str,
    run: Run,
}

/// The reference loop; inlined into each ISA's wrapper so it is compiled for that ISA.
#[inline(always)]
fn sum_words(data: &[u8]) -> u64 {
    data.chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
        .fold(0, u64::wrapping_add)
}

fn sum_baseline(data: &[u8]) -> u64 {
    sum_words(data)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn sum_avx2(data: &[u8]) -> u64 {
        super::sum_words(data)
    }

    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn sum_avx512(data: &[u8]) -> u64 {
        super::sum_words(data)
    }
}

/// The reference compiled for the widest ISA this CPU has, with its name.
fn memory_reference() -> (&'static str, fn(&[u8]) -> u64) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            return ("sum-avx512", |d| {
                // SAFETY: the CPU has AVX-512F (checked just above, and features do not
                // change while the process runs).
                unsafe { x86::sum_avx512(d) }
            });
        }
        if std::is_x86_feature_detected!("avx2") {
            return ("sum-avx2", |d| {
                // SAFETY: the CPU has AVX2 (checked just above).
                unsafe { x86::sum_avx2(d) }
            });
        }
        ("sum-sse2", sum_baseline)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        ("sum-baseline", sum_baseline)
    }
}

/// Whether `sha2` takes its SHA-extensions path here: sha2 0.10 on x86-64 checks exactly
/// these features (`cpufeatures::new!(shani_cpuid, "sha", "sse2", "ssse3", "sse4.1")`).
fn sha_extensions() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("sha")
            && std::is_x86_feature_detected!("sse2")
            && std::is_x86_feature_detected!("ssse3")
            && std::is_x86_feature_detected!("sse4.1")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The widest BLAKE3 code the `blake3` crate can pick on this CPU (its `Platform::detect`
/// order: AVX-512F+VL, AVX2, SSE4.1, SSE2, portable).
fn blake3_isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vl") {
            return "avx512";
        }
        if std::is_x86_feature_detected!("avx2") {
            return "avx2";
        }
        if std::is_x86_feature_detected!("sse4.1") {
            return "sse41";
        }
        "sse2"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        "portable"
    }
}

fn contenders() -> Vec<Contender> {
    let (mem_name, mem) = memory_reference();
    let mut v = vec![Contender {
        algorithm: "memread",
        imp: mem_name,
        run: Run::Read(mem),
    }];
    for k in Fletcher2Impl::supported_list() {
        v.push(Contender {
            algorithm: "fletcher2",
            imp: k.name(),
            run: Run::Sums(k.kernel().expect("supported kernel")),
        });
    }
    for k in Fletcher4Impl::ALL.into_iter().filter(|k| k.supported()) {
        v.push(Contender {
            algorithm: "fletcher4",
            imp: k.name(),
            run: Run::Sums(k.kernel().expect("supported kernel")),
        });
    }
    v.push(Contender {
        algorithm: "sha256",
        imp: if sha_extensions() { "sha-ni" } else { "soft" },
        run: Run::Digest(ChecksumKind::Sha256),
    });
    v.push(Contender {
        algorithm: "blake3",
        imp: "crate",
        run: Run::Digest(ChecksumKind::Blake3),
    });
    v
}

/// SHA-256 bytes per second (in GB/s) by `openssl speed -evp sha256` on `len`-byte buffers:
/// OpenSSL's own SHA-NI code, the reference the issue names. None without openssl.
fn openssl_sha256(len: usize, quick: bool) -> Option<f64> {
    let out = std::process::Command::new("openssl")
        .args(["speed", "-evp", "sha256", "-mr", "-bytes", &len.to_string()])
        .args(["-seconds", if quick { "1" } else { "2" }])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    // Machine-readable result: "+F:<n>:sha256:<bytes per second>".
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("+F:"))?;
    let bps: f64 = line.rsplit(':').next()?.trim().parse().ok()?;
    Some(bps / 1e9)
}

/// A buffer of random bytes starting on a 64-byte boundary.
struct Buf {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl Buf {
    fn random(len: usize, seed: u64) -> Buf {
        let mut raw = vec![0u8; len + 64];
        rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut raw);
        let off = raw.as_ptr().align_offset(64);
        assert!(off < 64);
        Buf { raw, off, len }
    }
    fn get(&self) -> &[u8] {
        &self.raw[self.off..self.off + self.len]
    }
}

struct Row {
    algorithm: &'static str,
    imp: &'static str,
    buffer_bytes: usize,
    gbps: f64,
    ratio_to_memread: f64,
}

pub fn checksum(args: BenchChecksumArgs) -> Result<()> {
    if args.runs == 0 {
        return Err(usage("--runs must be at least 1"));
    }
    let budget = if args.quick {
        Duration::from_micros(500)
    } else {
        Duration::from_millis(20)
    };
    let who = contenders();
    assert_eq!(
        who[0].algorithm, "memread",
        "the reference is the first row"
    );
    if !args.json {
        println!(
            "zeta bench checksum: single core, GB/s (bytes / time, 1 GB = 1e9 B), median of {} runs, \
             cache-resident buffers",
            args.runs
        );
        println!(
            "reference: memory read = wrapping sum of the buffer's u64 words, a plain loop the \
             compiler vectorizes ({}), same buffers, same run",
            who[0].imp
        );
        println!(
            "sha256: sha2 crate, SHA extensions {}; blake3: blake3 crate, run-time dispatch (best \
             ISA here: {})",
            if sha_extensions() {
                "in use (sha-ni)"
            } else {
                "absent (portable code)"
            },
            blake3_isa()
        );
        println!(
            "{:<7} {:<10} {:<11} {:>8} {:>8}",
            "buffer", "algorithm", "impl", "GB/s", "/memread"
        );
    }
    let mut rows = Vec::new();
    for (si, &len) in SIZES.iter().enumerate() {
        let buf = Buf::random(len, 0xc5c5 + si as u64);
        let data = buf.get();
        let iters: Vec<u64> = who
            .iter()
            .map(|c| calibrate(budget, &mut || c.run.once(data)))
            .collect();
        // Interleaved runs, so drifting machine load hits every contender alike.
        let mut times = vec![Vec::with_capacity(args.runs); who.len()];
        for _ in 0..args.runs {
            for (w, c) in who.iter().enumerate() {
                times[w].push(sample(iters[w], &mut || c.run.once(data)));
            }
        }
        let gbps: Vec<f64> = times
            .iter_mut()
            .map(|t| {
                t.sort_by(|a, b| a.total_cmp(b));
                len as f64 / t[t.len() / 2] / 1e9
            })
            .collect();
        let mut measured: Vec<(&'static str, &'static str, f64)> = who
            .iter()
            .zip(&gbps)
            .map(|(c, &g)| (c.algorithm, c.imp, g))
            .collect();
        // OpenSSL's SHA-256 on the same size, in the same run, if the tool is there.
        if let Some(g) = openssl_sha256(len, args.quick) {
            measured.push(("sha256", "openssl", g));
        }
        for (algorithm, imp, g) in measured {
            rows.push(Row {
                algorithm,
                imp,
                buffer_bytes: len,
                gbps: g,
                ratio_to_memread: g / gbps[0],
            });
            if !args.json {
                let r = rows.last().expect("just pushed");
                println!(
                    "{:<7} {:<10} {:<11} {:>8.2} {:>8.3}",
                    zeta_server::fmt::human(len as u64),
                    r.algorithm,
                    r.imp,
                    r.gbps,
                    r.ratio_to_memread
                );
            }
        }
    }
    if args.json {
        let list: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "algorithm": r.algorithm,
                    "impl": r.imp,
                    "buffer_bytes": r.buffer_bytes,
                    "gbps": r.gbps,
                    "ratio_to_memread": r.ratio_to_memread,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&list).expect("rows serialize")
        );
        return Ok(());
    }
    // The seed article's comparison: SHA-256's bandwidth as a share of fletcher2's.
    let best = |alg: &str, len: usize| {
        rows.iter()
            .filter(|r| r.algorithm == alg && r.buffer_bytes == len)
            .map(|r| r.gbps)
            .fold(0.0f64, f64::max)
    };
    let shares: Vec<String> = SIZES
        .iter()
        .map(|&len| {
            format!(
                "{} {:.1}%",
                zeta_server::fmt::human(len as u64),
                100.0 * best("sha256", len) / best("fletcher2", len)
            )
        })
        .collect();
    for &len in &SIZES {
        let openzfs = rows
            .iter()
            .find(|r| r.algorithm == "fletcher4" && r.imp == "avx512" && r.buffer_bytes == len)
            .map(|r| r.gbps);
        if let Some(base) = openzfs {
            println!(
                "fletcher4 at {}: fastest kernel {:.1} GB/s = {:.2}x the OpenZFS-style kernel \
                 (avx512: 8 lanes, one set of sums)",
                zeta_server::fmt::human(len as u64),
                best("fletcher4", len),
                best("fletcher4", len) / base
            );
        }
        let ours = rows
            .iter()
            .find(|r| r.algorithm == "sha256" && r.imp != "openssl" && r.buffer_bytes == len);
        let openssl = rows
            .iter()
            .find(|r| r.algorithm == "sha256" && r.imp == "openssl" && r.buffer_bytes == len);
        match (ours, openssl) {
            (Some(o), Some(x)) => println!(
                "sha256 at {}: {:.2} GB/s = {:.2}x openssl speed -evp sha256 ({:.2} GB/s)",
                zeta_server::fmt::human(len as u64),
                o.gbps,
                o.gbps / x.gbps,
                x.gbps
            ),
            _ => println!("sha256: openssl not found, no reference row"),
        }
    }
    println!(
        "sha256 / fletcher2 (fastest kernel): {}. The seed article saw ~70% on Westmere, as \
         end-to-end read bandwidth through ZFS on SSDs, where fletcher2 was bound by the disks \
         rather than the CPU.",
        shares.join(", ")
    );
    Ok(())
}
