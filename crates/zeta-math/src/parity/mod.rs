//! RAID-Z parity: the codes, their kernels, and reconstruction.
//!
//! # Codes and column numbering
//! A stripe is `nparity` parity columns followed by the data columns, all numbered in that
//! order (0..nparity are parity, nparity.. data). Every parity column has the same length L
//! (the column length); a data column may be shorter and is then treated as zero-padded to L
//! (raidz's last rows are ragged). Columns are bytes; the codes work byte by byte
//! ([`Code::Xor`], [`Code::Rs`]) or packet by packet ([`Code::Rdp`]).
//!
//! - **Xor** (nparity 1): P = XOR of the data columns.
//! - **Rs** (nparity 2 or 3): Reed-Solomon over GF(2^8) with polynomial 0x11d, as RAID-6 and
//!   ZFS raidz2/3: P = Σ D_i, Q = Σ 2^i·D_i, R = Σ 4^i·D_i, i the data column index from 0.
//!   Any three of the rows restricted to any distinct columns i < 255 form an invertible
//!   matrix (a Vandermonde matrix in 2^i, scaled), so any ≤ nparity erasures are solvable.
//! - **Rdp** (nparity 2): Row-Diagonal Parity (Corbett et al., FAST '04) laid out as seed 001
//!   does: parity columns first (column 0 row parity, column 1 diagonal parity), data column
//!   j is RDP data disk j, data disks ndata..p-2 are absent and all zero (code shortening),
//!   and every column is p-1 packets ("rows") of L/(p-1) bytes. Row parity packet r = XOR of
//!   the data packets of row r. With the row parity as disk p-1, packet (row r, disk j) lies
//!   on diagonal (r + j) mod p; diagonal parity packet d (0..p-2) is the XOR of diagonal d
//!   (diagonal p-1 is not stored).
//!
//! # Accepted lengths (asserted; a violation is a caller bug and panics)
//! - all codes: 1 <= data.len() <= [`Codec::max_data`], `nparity` parity slices of one length
//!   L >= 1, every data slice no longer than L;
//! - Xor and Rs: any L (odd lengths and lengths that are no multiple of the vector width
//!   are finished eight, then one byte at a time);
//! - Rdp: L a multiple of p-1 ([`Codec::column_align`]); packets may have any size
//!   (e.g. 16 bytes for 4 KiB columns with p = 257).
//!
//! # Encoding
//! Both encoders are data-centric: each data byte is loaded once and folded into every parity
//! it feeds. RS keeps P, Q, R of a strip of four vectors in registers and runs Horner's rule
//! down the columns (Q ← 2·Q ⊕ D_i, R ← 4·R ⊕ D_i for i = n-1..0), storing each parity vector
//! once. The GFNI kernel takes the columns two at a time (Q ← 4·Q ⊕ 2·D_i ⊕ D_{i-1}, R with
//! 16 and 4): with one-instruction multiplies and a three-way XOR (`vpternlogq`) that is four
//! operations per pair of columns for P+Q instead of six. RDP goes column-first as the seed describes: one data column's packets in order,
//! each folded into its row and diagonal packet, then the next column; then the row parity is
//! folded into the diagonals (it is disk p-1 of the diagonals). The engine can tile (run the
//! column-first pass over a strip of each packet at a time, so the parity strips stay in L1),
//! but that measured slower on every geometry tried (figures: docs/perf/parity.md, "Why RDP
//! packets are whole, not tiled"): the strided walk defeats the hardware prefetcher, which
//! is the very reason the seed goes column-first. So packets are whole.
//! Column-first RDP is bound by stores: every data vector costs a load-XOR-store of its row
//! packet and of its diagonal packet, where the RS encoder keeps its parity in registers
//! and stores it once per stripe row.
//!
//! # Reconstruction
//! - RS/Xor: the missing data columns come from the first surviving parity rows: one pass
//!   computes, per strip, the row sums with the missing columns taken as zero (the same
//!   Horner kernel), XORs in the stored parity to get the syndromes S = A·D_missing, and
//!   multiplies by A⁻¹ (inverted once per call; multipliers prepared per coefficient). With P
//!   among the rows the last missing column is S_P ⊕ the others, so losing two data columns
//!   costs one generation pass plus two constant multiplies per output byte. Missing parity
//!   columns are then generated from the (now complete) data.
//! - RDP: the row parity and the data disks form a group whose rows XOR to zero: one missing
//!   disk of it is the XOR of the others; two are rebuilt by the two diagonal chains of
//!   Corbett et al. (start on the diagonal that misses one of them, rebuild the other's
//!   packet from it, then the first's from the row, then follow that packet's diagonal until
//!   the unstored diagonal). A missing diagonal parity is recomputed afterwards.
//!
//! # Kernels
//! [`ParityImpl`]: `scalar` (portable, eight bytes at a time), `avx2`, `avx512bw` (GF(2^8)
//! multiply by constant with split-nibble `vpshufb` tables, ×2 by shift and mask), `gfni`
//! (512-bit, every multiply by a constant — ×2 and ×4 included — one `vgf2p8affineqb` with
//! the constant's 8x8 bit matrix; `vgf2p8mulb` is no use, it reduces by 0x11b). All share the
//! code in `engine`, written against `lanes::Lanes`. The kernel for calls that do not name
//! one is picked once per process by a short benchmark among the supported ones;
//! `ZETA_PARITY_IMPL=scalar|avx2|avx512bw|gfni` overrides it (an unknown or unsupported name
//! is an error from [`check_override`], which pools call before opening), and
//! `ZETA_PARITY_IMPL=cycle` rotates through every supported kernel call by call so
//! whole-system tests exercise all of them. Each kernel is tested byte for byte against the
//! log/exp reference in `reference`.

mod engine;
pub mod gf;
mod lanes;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use engine::{Dst, Finish, RdpGen, RdpRec, RsJob, Src};

/// A parity code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// nparity = 1: P = XOR of data columns.
    Xor,
    /// nparity = 2 or 3: Reed-Solomon over GF(2^8), polynomial 0x11d.
    /// P = Σ D_i, Q = Σ 2^i·D_i, R = Σ 4^i·D_i, i = data column index from 0.
    Rs,
    /// nparity = 2: Row-Diagonal Parity with prime `p` (p-1 rows of packets per column).
    Rdp { p: u32 },
}

impl Code {
    /// Short lower-case name ("xor", "rs", "rdp").
    pub fn name(self) -> &'static str {
        match self {
            Code::Xor => "xor",
            Code::Rs => "rs",
            Code::Rdp { .. } => "rdp",
        }
    }
}

/// Errors of the parity layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParityError {
    #[error("{code} parity takes {allowed} parity columns, not {nparity}")]
    BadParityCount {
        code: &'static str,
        nparity: usize,
        allowed: &'static str,
    },
    #[error("RDP needs a prime p from 3 to {max}, not {p}", max = RDP_MAX_P)]
    BadPrime { p: u32 },
    #[error("{missing} columns are missing; {nparity} parity columns rebuild at most {nparity}")]
    TooManyMissing { missing: usize, nparity: usize },
    #[error("missing column {column} does not exist (the stripe has {width} columns)")]
    NoSuchColumn { column: usize, width: usize },
    #[error("column {0} is listed as missing twice")]
    DuplicateMissing(usize),
    /// `ZETA_PARITY_IMPL` names no kernel, or one this CPU cannot run.
    #[error("{0}")]
    Override(String),
}

/// The largest RDP prime accepted (p-1 = 256 packets per column).
pub const RDP_MAX_P: u32 = 257;

/// Smallest prime p from {3, 5, 17, 257} with p - 1 >= ndata_max (these make p-1 a power of
/// two, so every 4096-byte-multiple column divides into p-1 equal packets with no padding).
pub fn rdp_prime_for(ndata_max: usize) -> Option<u32> {
    [3u32, 5, 17, 257]
        .into_iter()
        .find(|&p| p as usize > ndata_max)
}

fn is_prime(p: u32) -> bool {
    p >= 2
        && (2..)
            .take_while(|d| d * d <= p)
            .all(|d| !p.is_multiple_of(d))
}

/// A parity code with its number of parity columns, ready to encode and rebuild stripes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Codec {
    code: Code,
    nparity: usize,
}

impl Codec {
    /// Errors on invalid combos: Xor needs nparity 1, Rs 2 or 3, Rdp 2 and p prime
    /// (3..=[`RDP_MAX_P`]).
    pub fn new(code: Code, nparity: usize) -> Result<Codec, ParityError> {
        let (ok, allowed) = match code {
            Code::Xor => (nparity == 1, "1"),
            Code::Rs => (nparity == 2 || nparity == 3, "2 or 3"),
            Code::Rdp { .. } => (nparity == 2, "2"),
        };
        if !ok {
            return Err(ParityError::BadParityCount {
                code: code.name(),
                nparity,
                allowed,
            });
        }
        if let Code::Rdp { p } = code {
            if !(3..=RDP_MAX_P).contains(&p) || !is_prime(p) {
                return Err(ParityError::BadPrime { p });
            }
        }
        Ok(Codec { code, nparity })
    }

    pub fn nparity(&self) -> usize {
        self.nparity
    }

    pub fn code(&self) -> Code {
        self.code
    }

    /// Largest number of data columns this codec supports (Xor and Rs: 255 - nparity, so a
    /// stripe has at most 255 columns and every 2^i is distinct; Rdp: p-1).
    pub fn max_data(&self) -> usize {
        match self.code {
            Code::Xor | Code::Rs => engine::MAX_DATA - self.nparity,
            Code::Rdp { p } => p as usize - 1,
        }
    }

    /// Alignment every parity-column length must be a multiple of (Rdp: p-1; others 1).
    pub fn column_align(&self) -> usize {
        match self.code {
            Code::Xor | Code::Rs => 1,
            Code::Rdp { p } => p as usize - 1,
        }
    }

    /// Computes the parity columns with the process's kernel (see [`selected`]). Every parity
    /// slice has the same length L (the column length); each data slice has length <= L and
    /// is treated as zero-padded to L. 1 <= data.len() <= max_data(). Panics on lengths the
    /// code does not accept (module doc).
    pub fn generate(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) {
        self.generate_with(current(), data, parity)
    }

    /// [`generate`](Self::generate) with an explicit kernel; panics if the CPU cannot run it.
    pub fn generate_with(&self, imp: ParityImpl, data: &[&[u8]], parity: &mut [&mut [u8]]) {
        assert!(
            imp.supported(),
            "parity kernel {} not supported here",
            imp.name()
        );
        let len = self.column_len(data.iter().map(|d| d.len()), parity);
        match self.code {
            Code::Xor | Code::Rs => {
                let mut out = [std::ptr::null_mut(); 3];
                for (o, p) in out.iter_mut().zip(parity.iter_mut()) {
                    *o = p.as_mut_ptr();
                }
                let job = RsJob {
                    len,
                    data,
                    rows: (1u8 << self.nparity) - 1,
                    finish: Finish::Store(out),
                };
                // SAFETY: the outputs are the parity slices, L bytes each, which (being
                // `&mut`) overlap no data slice; the kernel is supported (asserted above).
                unsafe { run_rs(imp, &job) };
            }
            Code::Rdp { p } => {
                let p = p as usize;
                let (row, diag) = parity.split_at_mut(1);
                let job = RdpGen {
                    p,
                    s: len / (p - 1),
                    data,
                    row: row[0].as_mut_ptr(),
                    diag: diag[0].as_mut_ptr(),
                    tile: rdp_tile(len / (p - 1)),
                };
                // SAFETY: row and diag are the two parity slices of (p-1)·s bytes; data
                // slices are no longer than that and overlap neither; kernel supported.
                unsafe { run_rdp_generate(imp, &job) };
            }
        }
    }

    /// Rebuilds the columns listed in `missing` in place, with the process's kernel. Column
    /// numbering: 0..nparity are the parity columns, nparity.. are data columns in order.
    /// `parity` slices all have length L, data slices length <= L (zero-padded conceptually,
    /// as in generate). The contents of missing slices on entry are garbage; on return they
    /// hold the correct bytes (for a short data column, only its own length). Any
    /// combination of up to nparity missing columns works; more is an error, as is a column
    /// number out of range or listed twice.
    pub fn reconstruct(
        &self,
        parity: &mut [&mut [u8]],
        data: &mut [&mut [u8]],
        missing: &[usize],
    ) -> Result<(), ParityError> {
        self.reconstruct_with(current(), parity, data, missing)
    }

    /// [`reconstruct`](Self::reconstruct) with an explicit kernel; panics if the CPU cannot
    /// run it.
    pub fn reconstruct_with(
        &self,
        imp: ParityImpl,
        parity: &mut [&mut [u8]],
        data: &mut [&mut [u8]],
        missing: &[usize],
    ) -> Result<(), ParityError> {
        assert!(
            imp.supported(),
            "parity kernel {} not supported here",
            imp.name()
        );
        let width = self.nparity + data.len();
        let mut is_missing = [false; engine::MAX_DATA + 3];
        for &c in missing {
            if c >= width {
                return Err(ParityError::NoSuchColumn { column: c, width });
            }
            if std::mem::replace(&mut is_missing[c], true) {
                return Err(ParityError::DuplicateMissing(c));
            }
        }
        if missing.len() > self.nparity {
            return Err(ParityError::TooManyMissing {
                missing: missing.len(),
                nparity: self.nparity,
            });
        }
        let len = self.column_len(data.iter().map(|d| d.len()), parity);
        if missing.is_empty() {
            return Ok(());
        }
        let is_missing = &is_missing[..width];
        match self.code {
            Code::Xor | Code::Rs => self.rs_reconstruct(imp, len, parity, data, is_missing),
            Code::Rdp { p } => rdp_reconstruct(imp, p as usize, len, parity, data, is_missing),
        }
        Ok(())
    }

    /// Checks the geometry (module doc) and returns the column length.
    fn column_len(
        &self,
        data: impl ExactSizeIterator<Item = usize>,
        parity: &[&mut [u8]],
    ) -> usize {
        assert_eq!(
            parity.len(),
            self.nparity,
            "{} parity columns for nparity {}",
            parity.len(),
            self.nparity
        );
        let len = parity[0].len();
        assert!(
            parity.iter().all(|p| p.len() == len),
            "parity columns differ in length"
        );
        assert!(
            len > 0 && len.is_multiple_of(self.column_align()),
            "column length {len} is not a positive multiple of {}",
            self.column_align()
        );
        let n = data.len();
        assert!(
            (1..=self.max_data()).contains(&n),
            "{n} data columns; this codec takes 1..={}",
            self.max_data()
        );
        for (i, l) in data.enumerate() {
            assert!(
                l <= len,
                "data column {i} has {l} bytes, more than the column length {len}"
            );
        }
        len
    }

    fn rs_reconstruct(
        &self,
        imp: ParityImpl,
        len: usize,
        parity: &mut [&mut [u8]],
        data: &mut [&mut [u8]],
        is_missing: &[bool],
    ) {
        let np = self.nparity;
        let missing_rows: u8 = (0..np)
            .filter(|&k| is_missing[k])
            .fold(0, |m, k| m | 1 << k);
        let mut lost = [0usize; 3];
        let mut m = 0;
        for i in (0..data.len()).filter(|&i| is_missing[np + i]) {
            lost[m] = i;
            m += 1;
        }
        let lost = &lost[..m];
        // Up to this many data columns the column list lives on the stack.
        const STACK_COLS: usize = 32;
        let mut stack_view: [&[u8]; STACK_COLS] = [&[]; STACK_COLS];
        let mut heap_view: Vec<&[u8]>;
        if !lost.is_empty() {
            // Solve from the first m surviving rows.
            let mut rows = [0usize; 3];
            for (t, k) in (0..np).filter(|&k| !is_missing[k]).take(m).enumerate() {
                rows[t] = k;
            }
            let rows = &rows[..m];
            assert!(
                (0..np).filter(|&k| !is_missing[k]).count() >= m,
                "more columns missing than parity"
            );
            let g = [1u8, 2, 4];
            let mut a = [[0u8; 3]; 3];
            for (t, &k) in rows.iter().enumerate() {
                for (j, &x) in lost.iter().enumerate() {
                    a[t][j] = gf::pow(g[k], x);
                }
            }
            let inv = gf::invert(&a, m).expect("RS erasure matrix is invertible for i < 255");
            let mut coef = [[0u8; 3]; 3];
            for j in 0..m {
                for (t, &k) in rows.iter().enumerate() {
                    coef[j][k] = inv[j][t];
                }
            }
            let mut stored = [std::ptr::null(); 3];
            for &k in rows {
                stored[k] = parity[k].as_ptr();
            }
            let mut outs = [Dst {
                ptr: std::ptr::null_mut(),
                len: 0,
            }; 3];
            let view: &mut [&[u8]] = if data.len() <= STACK_COLS {
                &mut stack_view[..data.len()]
            } else {
                heap_view = vec![&[]; data.len()];
                &mut heap_view
            };
            let mut j = 0;
            for (i, d) in data.iter_mut().enumerate() {
                if is_missing[np + i] {
                    outs[j] = Dst::of(d);
                    j += 1;
                    view[i] = &[];
                } else {
                    view[i] = d;
                }
            }
            let job = RsJob {
                len,
                data: view,
                rows: rows.iter().fold(0, |m, &k| m | 1 << k),
                finish: Finish::Solve {
                    stored,
                    coef,
                    outs,
                    m,
                },
            };
            // SAFETY: outputs are the missing data slices (lengths as given), stored parities
            // are surviving parity slices of L bytes; the missing slices are passed as empty
            // data, so no output overlaps an input.
            unsafe { run_rs(imp, &job) };
        }
        if missing_rows != 0 {
            let mut out = [std::ptr::null_mut(); 3];
            for (k, p) in parity.iter_mut().enumerate() {
                if missing_rows & 1 << k != 0 {
                    out[k] = p.as_mut_ptr();
                }
            }
            let view: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
            let job = RsJob {
                len,
                data: &view,
                rows: missing_rows,
                finish: Finish::Store(out),
            };
            // SAFETY: the outputs are the missing parity slices (L bytes), distinct from the
            // data slices.
            unsafe { run_rs(imp, &job) };
        }
    }
}

fn rdp_reconstruct(
    imp: ParityImpl,
    p: usize,
    len: usize,
    parity: &mut [&mut [u8]],
    data: &mut [&mut [u8]],
    is_missing: &[bool],
) {
    let mut disks = vec![Src::EMPTY; p];
    let mut missing: Vec<(usize, Dst)> = Vec::with_capacity(2);
    for (j, d) in data.iter_mut().enumerate() {
        if is_missing[2 + j] {
            let out = Dst::of(d);
            missing.push((j, out));
            disks[j] = Src {
                ptr: out.ptr,
                len: out.len,
            };
        } else {
            disks[j] = Src::of(d);
        }
    }
    let (row, diag) = parity.split_at_mut(1);
    if is_missing[0] {
        let out = Dst::of(row[0]);
        missing.push((p - 1, out));
        disks[p - 1] = Src {
            ptr: out.ptr,
            len: out.len,
        };
    } else {
        disks[p - 1] = Src::of(row[0]);
    }
    let diag = if is_missing[1] {
        Err(Dst::of(diag[0]))
    } else {
        Ok(Src::of(diag[0]))
    };
    let job = RdpRec {
        p,
        s: len / (p - 1),
        disks: &disks,
        missing: &missing,
        diag,
    };
    // SAFETY: every Src/Dst was taken from a live slice with its length; the outputs are
    // the missing columns' slices, distinct from each other and from the survivors, and the
    // engine reads a missing disk only after rebuilding it.
    unsafe { run_rdp_reconstruct(imp, &job) };
}

/// Packet bytes per pass of the RDP encoder: the whole packet, i.e. no tiling (module doc).
fn rdp_tile(packet: usize) -> usize {
    packet
}

// ----- kernels and their selection ------------------------------------------------------------

/// A parity kernel implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParityImpl {
    /// Portable, eight bytes at a time.
    Scalar,
    /// 256-bit AVX2.
    Avx2,
    /// 512-bit AVX-512 BW.
    Avx512bw,
    /// 512-bit AVX-512 BW with GFNI multiplies.
    Gfni,
}

impl ParityImpl {
    pub const ALL: [ParityImpl; 4] = [Self::Scalar, Self::Avx2, Self::Avx512bw, Self::Gfni];

    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            Self::Avx512bw => "avx512bw",
            Self::Gfni => "gfni",
        }
    }

    pub fn from_name(name: &str) -> Option<ParityImpl> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether this CPU can run the kernel.
    pub fn supported(self) -> bool {
        match self {
            Self::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => std::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Self::Avx512bw => {
                std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
            }
            #[cfg(target_arch = "x86_64")]
            Self::Gfni => {
                std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("gfni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The supported kernels, in [`ALL`](Self::ALL) order.
    pub fn supported_list() -> Vec<ParityImpl> {
        Self::ALL.into_iter().filter(|k| k.supported()).collect()
    }
}

/// The environment variable that overrides the kernel choice.
pub const OVERRIDE_ENV: &str = "ZETA_PARITY_IMPL";

/// How calls that name no kernel pick one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Always this kernel.
    Fixed(ParityImpl),
    /// The next supported kernel on every call (a test mode).
    Cycle,
}

/// Parses a `ZETA_PARITY_IMPL` value: a kernel name or `cycle`. Unknown or unsupported names
/// are errors, not silent fallbacks.
pub fn parse_override(value: &str) -> Result<Selection, String> {
    if value == "cycle" {
        return Ok(Selection::Cycle);
    }
    let k = crate::select::resolve_override(
        OVERRIDE_ENV,
        value,
        &ParityImpl::ALL,
        ParityImpl::name,
        ParityImpl::supported,
        &["cycle"],
    )?;
    Ok(Selection::Fixed(k))
}

/// The choice this process uses: `ZETA_PARITY_IMPL` if set, else the fastest supported
/// kernel on a short benchmark. Resolved once.
pub fn selected() -> Result<Selection, String> {
    static CHOICE: std::sync::OnceLock<Result<Selection, String>> = std::sync::OnceLock::new();
    CHOICE
        .get_or_init(|| match std::env::var(OVERRIDE_ENV) {
            Ok(v) => parse_override(&v),
            Err(_) => Ok(Selection::Fixed(fastest())),
        })
        .clone()
}

/// Fails with a clear message if `ZETA_PARITY_IMPL` names an unknown kernel or one this CPU
/// cannot run. Pools call this before opening, so nothing is written under a bad setting.
pub fn check_override() -> Result<(), ParityError> {
    selected().map(|_| ()).map_err(ParityError::Override)
}

/// The kernel for the next call that names none. With a bad override (which
/// [`check_override`] reports) the benchmarked choice is used.
fn current() -> ParityImpl {
    static RESOLVED: std::sync::OnceLock<(Selection, Vec<ParityImpl>)> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let (sel, list) = RESOLVED.get_or_init(|| {
        let sel = selected().unwrap_or_else(|_| Selection::Fixed(fastest()));
        (sel, ParityImpl::supported_list())
    });
    pick(*sel, list, || {
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    })
}

/// The kernel a selection gives for one call; `next` numbers the calls (cycle mode).
fn pick(sel: Selection, supported: &[ParityImpl], next: impl FnOnce() -> usize) -> ParityImpl {
    match sel {
        Selection::Fixed(k) => k,
        Selection::Cycle => supported[next() % supported.len()],
    }
}

/// Times RS P+Q generation of a 4+2 stripe of 16 KiB columns with each supported kernel
/// (best of a few passes) and returns the quickest. Takes well under a millisecond.
pub fn fastest() -> ParityImpl {
    const COL: usize = 16384;
    let codec = Codec::new(Code::Rs, 2).expect("rs/2 is valid");
    let data: Vec<Vec<u8>> = (0..4u32)
        .map(|c| {
            (0..COL as u32)
                .map(|i| (i.wrapping_add(c << 16).wrapping_mul(2654435761) >> 24) as u8)
                .collect()
        })
        .collect();
    let data: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
    let (mut p, mut q) = (vec![0u8; COL], vec![0u8; COL]);
    crate::select::fastest(ParityImpl::supported_list(), ParityImpl::Scalar, |k| {
        codec.generate_with(k, std::hint::black_box(&data), &mut [&mut p, &mut q]);
    })
}

/// # Safety
/// `imp` is supported; the job satisfies [`engine::rs_pass`]'s pointer contract.
unsafe fn run_rs(imp: ParityImpl, job: &RsJob) {
    debug_assert!(imp.supported());
    // SAFETY: forwarded contract (the kernel is supported, the job valid).
    unsafe {
        match imp {
            ParityImpl::Scalar => engine::rs_pass::<u64, 2>(job),
            #[cfg(target_arch = "x86_64")]
            ParityImpl::Avx2 => x86::avx2::rs_pass(job),
            #[cfg(target_arch = "x86_64")]
            ParityImpl::Avx512bw => x86::avx512bw::rs_pass(job),
            #[cfg(target_arch = "x86_64")]
            ParityImpl::Gfni => x86::gfni::rs_pass(job),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("not supported"),
        }
    }
}

/// # Safety
/// `imp` is supported; the job satisfies [`engine::rdp_generate`]'s pointer contract.
unsafe fn run_rdp_generate(imp: ParityImpl, job: &RdpGen) {
    debug_assert!(imp.supported());
    // SAFETY: forwarded contract.
    unsafe {
        match imp {
            ParityImpl::Scalar => engine::rdp_generate::<u64, 2>(job),
            #[cfg(target_arch = "x86_64")]
            ParityImpl::Avx2 => x86::avx2::rdp_generate(job),
            #[cfg(target_arch = "x86_64")]
            ParityImpl::Avx512bw => x86::avx512bw::rdp_generate(job),
            #[cfg(target_arch = "x86_64")]
            ParityImpl::Gfni => x86::gfni::rdp_generate(job),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("not supported"),
        }
    }
}

/// # Safety
/// `imp` is supported; the job satisfies [`engine::rdp_reconstruct`]'s pointer contract.
unsafe fn run_rdp_reconstruct(imp: ParityImpl, job: &RdpRec) {
    debug_assert!(imp.supported());
    // SAFETY: forwarded contract.
    unsafe {
        match imp {
            ParityImpl::Scalar => engine::rdp_reconstruct::<u64, 2>(job),
            #[cfg(target_arch = "x86_64")]
            ParityImpl::Avx2 => x86::avx2::rdp_reconstruct(job),
            #[cfg(target_arch = "x86_64")]
            ParityImpl::Avx512bw => x86::avx512bw::rdp_reconstruct(job),
            #[cfg(target_arch = "x86_64")]
            ParityImpl::Gfni => x86::gfni::rdp_reconstruct(job),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("not supported"),
        }
    }
}
