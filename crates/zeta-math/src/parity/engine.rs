//! The codes, written once against [`Lanes`] and instantiated per kernel: `u64` for the
//! portable `scalar` kernel, the x86 vector types inside `#[target_feature]` wrappers (every
//! function here is `#[inline(always)]` so that it is compiled with the wrapper's features).
//!
//! Everything works on raw pointers with explicit lengths; the safe wrappers in `mod.rs`
//! build the jobs from live slices. A source shorter than the range being computed is
//! zero-padded (that is how short data columns and absent RDP disks take part), and the parts
//! of a range that are not a whole number of vectors are finished with `u64` then `u8`.

use super::lanes::Lanes;

/// The most data columns any code takes (RS is limited by the 255 distinct powers of 2).
pub(crate) const MAX_DATA: usize = 255;

/// A read-only run of bytes; reads past `len` are zero.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Src {
    pub ptr: *const u8,
    pub len: usize,
}

impl Src {
    pub const EMPTY: Src = Src {
        ptr: std::ptr::null(),
        len: 0,
    };

    pub fn of(s: &[u8]) -> Src {
        Src {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }

    /// Packet `r` of size `s`: bytes [r·s, (r+1)·s) clipped to `len`.
    #[inline(always)]
    fn packet(self, r: usize, s: usize) -> Src {
        let start = r * s;
        let len = self.len.saturating_sub(start).min(s);
        if len == 0 {
            return Src::EMPTY;
        }
        Src {
            // SAFETY: start < self.len, so the pointer stays inside the run.
            ptr: unsafe { self.ptr.add(start) },
            len,
        }
    }
}

/// A writable run of bytes; bytes past `len` are never written.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dst {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Dst {
    pub fn of(s: &mut [u8]) -> Dst {
        Dst {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    fn src(self) -> Src {
        Src {
            ptr: self.ptr,
            len: self.len,
        }
    }
}

// ----- Reed-Solomon (and XOR, which is its P row) -----------------------------------------

/// Row bits of [`RsJob::rows`].
pub(crate) const ROW_P: u8 = 1;
pub(crate) const ROW_Q: u8 = 2;
pub(crate) const ROW_R: u8 = 4;

/// What to do with the row sums P' = Σ D_i, Q' = Σ 2^i·D_i, R' = Σ 4^i·D_i of a strip.
pub(crate) enum Finish {
    /// Store row k's sum at `out[k]` (length = the job's column length) for every row in
    /// the job's `rows`.
    Store([*mut u8; 3]),
    /// Reconstruction: the sums were taken with the missing data columns as zero, so
    /// S_k = sum_k ^ stored parity k = Σ_{x missing} g_k^x·D_x. Output j (of `m`) is
    /// Σ_k coef[j][k]·S_k, written to `outs[j]` (up to its length). If the P row is among
    /// the rows, the last output is instead S_P ^ (outputs 0..m-1), saving its multiplies.
    Solve {
        stored: [*const u8; 3],
        coef: [[u8; 3]; 3],
        outs: [Dst; 3],
        m: usize,
    },
}

/// One pass of the RS engine over columns of `len` bytes.
pub(crate) struct RsJob<'a> {
    pub len: usize,
    /// Data column i has coefficient g^i in row g; a column shorter than `len` (a missing
    /// column is passed empty) is zero-padded.
    pub data: &'a [&'a [u8]],
    /// Which rows to compute (ROW_P | ROW_Q | ROW_R bits).
    pub rows: u8,
    pub finish: Finish,
}

/// [`Finish`] with its multipliers prepared for one lane type.
enum Prepared<M> {
    Store([*mut u8; 3]),
    Solve {
        stored: [*const u8; 3],
        /// Prepared coef[j][k] where output j needs row k (other entries are unused).
        coef: [[M; 3]; 3],
        outs: [*mut u8; 3],
    },
}

/// Whether output j of a solve over the rows in `rows` multiplies row k. There are as many
/// outputs as rows; with P among them the last output is S_P ^ the others, no multiplies.
#[inline(always)]
const fn needs_coef(rows: u8, j: usize, k: usize) -> bool {
    let m = rows.count_ones() as usize;
    j < m && rows & (1 << k) != 0 && !(rows & ROW_P != 0 && j == m - 1)
}

/// # Safety
/// The CPU supports `V`'s features.
#[inline(always)]
unsafe fn prepare<V: Lanes>(f: &Finish, rows: u8) -> Prepared<V::Mul> {
    match f {
        Finish::Store(out) => Prepared::Store(*out),
        Finish::Solve {
            stored,
            coef,
            outs,
            m,
        } => {
            assert_eq!(*m, rows.count_ones() as usize, "one output per row used");
            // Plain loops, not closures: a closure is compiled without the caller's target
            // features, and the vector constructors must inline into the kernel.
            // SAFETY: the caller guarantees the CPU supports V.
            let unused = unsafe { V::prepare(0) };
            let mut c = [[unused; 3]; 3];
            for (j, cj) in c.iter_mut().enumerate() {
                for (k, ck) in cj.iter_mut().enumerate() {
                    if needs_coef(rows, j, k) {
                        // SAFETY: as above.
                        *ck = unsafe { V::prepare(coef[j][k]) };
                    }
                }
            }
            Prepared::Solve {
                stored: *stored,
                coef: c,
                outs: [outs[0].ptr, outs[1].ptr, outs[2].ptr],
            }
        }
    }
}

/// Computes the rows for `U` vectors at byte offset `off`.
///
/// # Safety
/// The CPU supports `V`; a column of `cols` whose length is >= `end` is readable over the
/// strip (shorter ones are zero here), and `cols.last()` is such a column; the finish's
/// pointers are valid for the strip (outputs whose bit is clear in `store_mask` are not
/// touched).
#[inline(always)]
unsafe fn rs_strip<V: Lanes, const MASK: u8, const U: usize>(
    cols: &[&[u8]],
    end: usize,
    off: usize,
    fin: &Prepared<V::Mul>,
    store_mask: u8,
) {
    let w = V::BYTES;
    // SAFETY: the CPU supports V (caller).
    let zero = unsafe { V::zero() };
    let (mut p, mut q, mut r) = ([zero; U], [zero; U], [zero; U]);
    let present = |c: &&[u8]| c.len() >= end;
    // A macro, not a closure: closures do not inherit the kernel's target features.
    macro_rules! load {
        ($c:expr, $u:expr) => {
            // SAFETY: present columns are readable over the strip (caller).
            unsafe { V::load($c.as_ptr().add(off + $u * w)) }
        };
    }
    if let Some((top, mut rest)) = cols.split_last() {
        for u in 0..U {
            let x = load!(top, u);
            (p[u], q[u], r[u]) = (x, x, x);
        }
        if V::FUSED_PAIRS {
            // Two columns per step: Q ← 4·Q ⊕ 2·D_hi ⊕ D_lo (R alike with 16 and 4), which
            // with one-instruction multiplies and three-way XORs saves a third of the work.
            while let [lower @ .., lo, hi] = rest {
                rest = lower;
                let (ph, pl) = (present(hi), present(lo));
                for u in 0..U {
                    let xh = if ph { load!(hi, u) } else { zero };
                    let xl = if pl { load!(lo, u) } else { zero };
                    if MASK & ROW_P != 0 {
                        p[u] = p[u].xor3(xh, xl);
                    }
                    if MASK & ROW_Q != 0 {
                        q[u] = q[u].mul4().xor3(xh.mul2(), xl);
                    }
                    if MASK & ROW_R != 0 {
                        r[u] = r[u].mul16().xor3(xh.mul4(), xl);
                    }
                }
            }
        }
        for c in rest.iter().rev() {
            if !present(c) {
                for u in 0..U {
                    if MASK & ROW_Q != 0 {
                        q[u] = q[u].mul2();
                    }
                    if MASK & ROW_R != 0 {
                        r[u] = r[u].mul4();
                    }
                }
                continue;
            }
            for u in 0..U {
                let x = load!(c, u);
                if MASK & ROW_P != 0 {
                    p[u] = p[u].xor(x);
                }
                if MASK & ROW_Q != 0 {
                    q[u] = q[u].mul2().xor(x);
                }
                if MASK & ROW_R != 0 {
                    r[u] = r[u].mul4().xor(x);
                }
            }
        }
    }
    match fin {
        Prepared::Store(out) => {
            for u in 0..U {
                let at = off + u * w;
                // SAFETY: the output of every computed row is writable over the strip (caller).
                unsafe {
                    if MASK & ROW_P != 0 {
                        p[u].store(out[0].add(at));
                    }
                    if MASK & ROW_Q != 0 {
                        q[u].store(out[1].add(at));
                    }
                    if MASK & ROW_R != 0 {
                        r[u].store(out[2].add(at));
                    }
                }
            }
        }
        Prepared::Solve { stored, coef, outs } => {
            // Everything below but the store mask is known at compile time from MASK.
            let m = MASK.count_ones() as usize;
            for u in 0..U {
                let at = off + u * w;
                let mut s = [p[u], q[u], r[u]];
                for (k, sk) in s.iter_mut().enumerate() {
                    if MASK & (1 << k) != 0 {
                        // SAFETY: the stored parity of every used row is readable (caller).
                        *sk = sk.xor(unsafe { V::load(stored[k].add(at)) });
                    }
                }
                let mut done = zero;
                for j in 0..m {
                    let v = if MASK & ROW_P != 0 && j == m - 1 {
                        s[0].xor(done)
                    } else {
                        let mut v = zero;
                        for (k, sk) in s.iter().enumerate() {
                            if needs_coef(MASK, j, k) {
                                v = v.xor(sk.mul(&coef[j][k]));
                            }
                        }
                        v
                    };
                    done = done.xor(v);
                    if store_mask & (1 << j) != 0 {
                        // SAFETY: stored outputs are writable over the strip (caller).
                        unsafe { v.store(outs[j].add(at)) };
                    }
                }
            }
        }
    }
}

/// Runs [`rs_strip`] over [a, b): `U` vectors at a time, then single vectors.
/// Returns where it stopped (the first byte not covered by a whole vector).
///
/// # Safety
/// As [`rs_strip`] with `end` = b, for the whole range.
#[inline(always)]
unsafe fn rs_range<V: Lanes, const MASK: u8, const U: usize>(
    cols: &[&[u8]],
    a: usize,
    b: usize,
    fin: &Prepared<V::Mul>,
    store_mask: u8,
) -> usize {
    let w = V::BYTES;
    let mut off = a;
    while off + U * w <= b {
        // SAFETY: [off, off + U·w) lies in [a, b) (caller's guarantee covers it).
        unsafe { rs_strip::<V, MASK, U>(cols, b, off, fin, store_mask) };
        off += U * w;
    }
    while off + w <= b {
        // SAFETY: as above, one vector.
        unsafe { rs_strip::<V, MASK, 1>(cols, b, off, fin, store_mask) };
        off += w;
    }
    off
}

/// Runs one RS job with vector type `V`, unrolled `U` times.
///
/// # Safety
/// The CPU supports `V`. Every pointer in `job.finish` is valid for its length (outputs: the
/// column length, or `Dst::len` for solve outputs; stored parities: the column length), and
/// outputs overlap nothing else in the job.
#[inline(always)]
pub(crate) unsafe fn rs_pass<V: Lanes, const U: usize>(job: &RsJob) {
    // SAFETY: forwarded contract.
    unsafe {
        match job.rows {
            1 => rs_rows::<V, 1, U>(job),
            2 => rs_rows::<V, 2, U>(job),
            3 => rs_rows::<V, 3, U>(job),
            4 => rs_rows::<V, 4, U>(job),
            5 => rs_rows::<V, 5, U>(job),
            6 => rs_rows::<V, 6, U>(job),
            7 => rs_rows::<V, 7, U>(job),
            r => panic!("bad row set {r}"),
        }
    }
}

/// # Safety
/// As [`rs_pass`].
#[inline(always)]
unsafe fn rs_rows<V: Lanes, const MASK: u8, const U: usize>(job: &RsJob) {
    let len = job.len;
    assert!(job.data.len() <= MAX_DATA && len > 0);
    let out_lens: [usize; 3] = match &job.finish {
        Finish::Store(_) => [len; 3],
        Finish::Solve { outs, m, .. } => {
            std::array::from_fn(|j| if j < *m { outs[j].len.min(len) } else { 0 })
        }
    };
    // Region boundaries: every data and output length inside (0, len), then len. Inside a
    // region each column is either wholly present or wholly zero. Usually there is one.
    let inner = |l: &usize| *l > 0 && *l < len;
    let ragged: Vec<usize> = if job
        .data
        .iter()
        .map(|d| d.len())
        .chain(out_lens)
        .any(|l| inner(&l))
    {
        let mut b: Vec<usize> = job
            .data
            .iter()
            .map(|d| d.len())
            .chain(out_lens)
            .filter(inner)
            .collect();
        b.sort_unstable();
        b.dedup();
        b
    } else {
        Vec::new()
    };

    // SAFETY: the CPU supports V (caller).
    let fin = unsafe { prepare::<V>(&job.finish, MASK) };
    let mut fin_scalar: Option<Prepared<[u8; 256]>> = None;
    let mut a = 0;
    for b in ragged.into_iter().chain([len]) {
        // Columns past the last present one contribute nothing.
        let top = job.data.iter().rposition(|d| d.len() >= b);
        let cols = &job.data[..top.map_or(0, |t| t + 1)];
        let store_mask = (0..3).fold(0u8, |m, j| m | (u8::from(out_lens[j] >= b) << j));
        // SAFETY: columns of length >= b are readable over [a, b); outputs with their bit set
        // have length >= b; stored parities and Store outputs have length len >= b (caller).
        unsafe {
            let mut off = rs_range::<V, MASK, U>(cols, a, b, &fin, store_mask);
            if off < b {
                // The rest is less than one vector: finish eight then one byte at a time.
                let fs = fin_scalar.get_or_insert_with(|| prepare::<u64>(&job.finish, MASK));
                off = rs_range::<u64, MASK, 1>(cols, off, b, fs, store_mask);
                rs_range::<u8, MASK, 1>(cols, off, b, fs, store_mask);
            }
        }
        a = b;
    }
}

// ----- XOR runs ---------------------------------------------------------------------------

/// dst[0..n) = XOR of `srcs` (each zero-padded or cut to n).
///
/// # Safety
/// The CPU supports `V`; `dst` is writable for `n` bytes and overlaps no source; each source
/// is readable for its length.
#[inline(always)]
pub(crate) unsafe fn xor_many<V: Lanes, const U: usize>(dst: *mut u8, n: usize, srcs: &[Src]) {
    if n == 0 {
        return;
    }
    if srcs.iter().any(|s| s.len >= n) {
        // SAFETY: forwarded contract; the full-length sources cover [0, n).
        unsafe {
            let off = xor_full::<V, U>(dst, 0, n, srcs);
            let off = xor_full::<u64, 1>(dst, off, n, srcs);
            xor_full::<u8, 1>(dst, off, n, srcs);
        }
    } else {
        // SAFETY: dst is writable for n bytes.
        unsafe { std::ptr::write_bytes(dst, 0, n) };
    }
    for s in srcs.iter().filter(|s| s.len > 0 && s.len < n) {
        // SAFETY: dst is writable for n > s.len bytes; s is readable for s.len bytes.
        unsafe {
            let off = xor_into::<V, U>(dst, s.ptr, 0, s.len);
            let off = xor_into::<u64, 1>(dst, s.ptr, off, s.len);
            xor_into::<u8, 1>(dst, s.ptr, off, s.len);
        }
    }
}

/// dst[a..) = XOR of the sources of length >= n, whole vectors only; returns where it stopped.
///
/// # Safety
/// As [`xor_many`], and at least one source has length >= n.
#[inline(always)]
unsafe fn xor_full<V: Lanes, const U: usize>(
    dst: *mut u8,
    a: usize,
    n: usize,
    srcs: &[Src],
) -> usize {
    let w = V::BYTES;
    let first = srcs.iter().position(|s| s.len >= n).expect("a full source");
    let mut off = a;
    while off + U * w <= n {
        // SAFETY: [off, off + U·w) is inside [0, n), which every used source and dst cover.
        unsafe {
            let mut acc: [V; U] =
                std::array::from_fn(|u| V::load(srcs[first].ptr.add(off + u * w)));
            for s in &srcs[first + 1..] {
                if s.len >= n {
                    for (u, a) in acc.iter_mut().enumerate() {
                        *a = a.xor(V::load(s.ptr.add(off + u * w)));
                    }
                }
            }
            for (u, a) in acc.iter().enumerate() {
                a.store(dst.add(off + u * w));
            }
        }
        off += U * w;
    }
    if U > 1 {
        // SAFETY: forwarded contract.
        return unsafe { xor_full::<V, 1>(dst, off, n, srcs) };
    }
    off
}

/// dst[i] ^= src[i] for i in [a, n), whole vectors only; returns where it stopped.
///
/// # Safety
/// The CPU supports `V`; dst and src are valid for `n` bytes and do not overlap.
#[inline(always)]
unsafe fn xor_into<V: Lanes, const U: usize>(
    dst: *mut u8,
    src: *const u8,
    a: usize,
    n: usize,
) -> usize {
    let w = V::BYTES;
    let mut off = a;
    while off + U * w <= n {
        for u in 0..U {
            let at = off + u * w;
            // SAFETY: at + w <= n.
            unsafe {
                V::load(dst.add(at))
                    .xor(V::load(src.add(at)))
                    .store(dst.add(at))
            };
        }
        off += U * w;
    }
    if U > 1 {
        // SAFETY: forwarded contract.
        return unsafe { xor_into::<V, 1>(dst, src, off, n) };
    }
    off
}

/// Folds one data packet into its row and diagonal parity packets, data-centrically: each
/// source vector is loaded once. With `init`, the packets are set rather than XORed (and
/// the part of them past the source's length is zeroed). `d2` may be null (the packet's
/// diagonal is the unstored one).
///
/// # Safety
/// The CPU supports `V`; d1 and d2 (unless null) are writable for `n` bytes, src readable
/// for `src_len <= n`, no overlaps.
#[inline(always)]
unsafe fn fold2<V: Lanes, const U: usize>(
    d1: *mut u8,
    d2: *mut u8,
    src: *const u8,
    src_len: usize,
    n: usize,
    init: bool,
) {
    // SAFETY: forwarded contract.
    unsafe {
        let off = fold2_range::<V, U>(d1, d2, src, 0, src_len, init);
        let off = fold2_range::<u64, 1>(d1, d2, src, off, src_len, init);
        fold2_range::<u8, 1>(d1, d2, src, off, src_len, init);
        if init && src_len < n {
            std::ptr::write_bytes(d1.add(src_len), 0, n - src_len);
            if !d2.is_null() {
                std::ptr::write_bytes(d2.add(src_len), 0, n - src_len);
            }
        }
    }
}

/// # Safety
/// As [`fold2`], for [a, n).
#[inline(always)]
unsafe fn fold2_range<V: Lanes, const U: usize>(
    d1: *mut u8,
    d2: *mut u8,
    src: *const u8,
    a: usize,
    n: usize,
    init: bool,
) -> usize {
    let w = V::BYTES;
    let mut off = a;
    while off + U * w <= n {
        // SAFETY: [off, off + U·w) lies inside [0, n) where all three runs are valid.
        unsafe {
            let mut x = [V::zero(); U];
            for (u, x) in x.iter_mut().enumerate() {
                *x = V::load(src.add(off + u * w));
            }
            for (u, x) in x.iter().enumerate() {
                let at = off + u * w;
                if init {
                    x.store(d1.add(at));
                } else {
                    V::load(d1.add(at)).xor(*x).store(d1.add(at));
                }
                if !d2.is_null() {
                    if init {
                        x.store(d2.add(at));
                    } else {
                        V::load(d2.add(at)).xor(*x).store(d2.add(at));
                    }
                }
            }
        }
        off += U * w;
    }
    if U > 1 {
        // SAFETY: forwarded contract.
        return unsafe { fold2_range::<V, 1>(d1, d2, src, off, n, init) };
    }
    off
}

// ----- RDP ----------------------------------------------------------------------------------

/// RDP encoding of one stripe: `p` prime, packets of `s` bytes, p-1 rows.
pub(crate) struct RdpGen<'a> {
    pub p: usize,
    pub s: usize,
    /// Data disks 0..data.len() (<= p-1); the rest are absent (zero). Each is readable for
    /// its length, at most (p-1)·s.
    pub data: &'a [&'a [u8]],
    /// Row parity and diagonal parity, (p-1)·s bytes each.
    pub row: *mut u8,
    pub diag: *mut u8,
    /// Bytes of each packet processed per pass over the columns (see the module doc).
    pub tile: usize,
}

/// Data-centric, column-first RDP encoding: for each data column in order, each of its
/// packets in order is loaded once and folded into its row parity packet and (unless it lies
/// on the unstored diagonal p-1) its diagonal parity packet; then the row parity, which as
/// RDP's disk p-1 is on diagonals too, is folded into the diagonal parity.
///
/// # Safety
/// The CPU supports `V`; `row` and `diag` are writable for (p-1)·s bytes each, each data
/// source is readable for its length (<= (p-1)·s), nothing overlaps.
#[inline(always)]
pub(crate) unsafe fn rdp_generate<V: Lanes, const U: usize>(job: &RdpGen) {
    let (p, s) = (job.p, job.s);
    assert!(!job.data.is_empty() && job.data.len() < p && s > 0 && job.tile > 0);
    let mut o = 0;
    while o < s {
        let t = job.tile.min(s - o);
        for (j, d) in job.data.iter().enumerate() {
            let d = Src::of(d);
            for r in 0..p - 1 {
                let start = r * s + o;
                let avail = d.len.saturating_sub(start).min(t);
                let diag = (r + j) % p;
                // SAFETY: packet offsets are below (p-1)·s; avail bytes of the source exist.
                unsafe {
                    let d1 = job.row.add(start);
                    let d2 = if diag == p - 1 {
                        std::ptr::null_mut()
                    } else {
                        job.diag.add(diag * s + o)
                    };
                    let src = if avail > 0 { d.ptr.add(start) } else { d.ptr };
                    fold2::<V, U>(d1, d2, src, avail, t, j == 0);
                }
            }
        }
        // Row parity packet r (disk p-1) lies on diagonal r-1; packet 0 on the unstored one.
        for r in 1..p - 1 {
            // SAFETY: both packets lie inside their (p-1)·s-byte columns; row and diag are
            // distinct columns.
            unsafe {
                let at = r * s + o;
                let to = job.diag.add((r - 1) * s + o);
                let off = xor_into::<V, U>(to, job.row.add(at), 0, t);
                let off = xor_into::<u64, 1>(to, job.row.add(at), off, t);
                xor_into::<u8, 1>(to, job.row.add(at), off, t);
            }
        }
        o += t;
    }
}

/// RDP reconstruction.
pub(crate) struct RdpRec<'a> {
    pub p: usize,
    pub s: usize,
    /// The p disks of the row group: data disks 0..=p-2 (absent ones empty), row parity as
    /// disk p-1. Missing disks appear here with their output buffer (read only after they
    /// have been rebuilt).
    pub disks: &'a [Src],
    /// Missing disks of the row group (at most two; two only if the diagonal parity is there).
    pub missing: &'a [(usize, Dst)],
    /// The diagonal parity: Ok(stored) or Err(output to recompute).
    pub diag: Result<Src, Dst>,
}

/// Rebuilds the missing row-group disks (one from the rows, which XOR to zero; two by
/// the diagonal chains of Corbett et al.), then the diagonal parity if it is missing.
///
/// # Safety
/// The CPU supports `V`; every `Src` is readable and every `Dst` writable for its length
/// (<= (p-1)·s); outputs overlap nothing else.
#[inline(always)]
pub(crate) unsafe fn rdp_reconstruct<V: Lanes, const U: usize>(job: &RdpRec) {
    let (p, s) = (job.p, job.s);
    assert_eq!(job.disks.len(), p);
    let mut srcs: Vec<Src> = Vec::with_capacity(p + 1);
    match job.missing {
        [] => {}
        [(x, dx)] => {
            srcs.extend(
                (0..p)
                    .filter(|&k| k != *x)
                    .map(|k| job.disks[k])
                    .filter(|d| d.len > 0),
            );
            // SAFETY: forwarded contract; the target is not among the sources.
            unsafe { xor_many::<V, U>(dx.ptr, dx.len, &srcs) };
        }
        [(x, dx), (y, dy)] => {
            let diag = job
                .diag
                .expect("two missing disks need the diagonal parity");
            assert!(x < y && *y < p);
            let mut recovered = 0;
            // The chain that starts on the diagonal missing disk `b` first rebuilds disk `a`
            // from that diagonal, then disk b from the row, then follows b's packet's diagonal.
            for (a, da, b, db) in [(*x, *dx, *y, *dy), (*y, *dy, *x, *dx)] {
                let mut d = (b + p - 1) % p;
                while d != p - 1 {
                    let r = (d + p - a) % p;
                    assert_ne!(r, p - 1, "RDP chain hit the missing row");
                    // Packet (r, a) from diagonal d.
                    srcs.clear();
                    srcs.push(diag.packet(d, s));
                    for k in (0..p).filter(|&k| k != a) {
                        let rk = (d + p - k) % p;
                        if rk != p - 1 {
                            srcs.push(job.disks[k].packet(rk, s));
                        }
                    }
                    srcs.retain(|x| x.len > 0);
                    let out = da.src().packet(r, s);
                    // SAFETY: the packet is inside a's buffer; a is not among the sources.
                    unsafe { xor_many::<V, U>(out.ptr as *mut u8, out.len, &srcs) };
                    // Packet (r, b) from row r.
                    srcs.clear();
                    srcs.extend(
                        (0..p)
                            .filter(|&k| k != b)
                            .map(|k| job.disks[k].packet(r, s))
                            .filter(|x| x.len > 0),
                    );
                    let out = db.src().packet(r, s);
                    // SAFETY: as above, for b.
                    unsafe { xor_many::<V, U>(out.ptr as *mut u8, out.len, &srcs) };
                    recovered += 2;
                    d = (r + b) % p;
                }
            }
            assert_eq!(recovered, 2 * (p - 1), "RDP chains must cover both disks");
        }
        _ => panic!("RDP rebuilds at most two disks of the row group"),
    }
    if let Err(out) = job.diag {
        for d in 0..p - 1 {
            srcs.clear();
            for k in 0..p {
                let rk = (d + p - k) % p;
                if rk != p - 1 {
                    srcs.push(job.disks[k].packet(rk, s));
                }
            }
            srcs.retain(|x| x.len > 0);
            // SAFETY: the diagonal packet is inside the output; outputs overlap no source.
            unsafe { xor_many::<V, U>(out.ptr.add(d * s), s, &srcs) };
        }
    }
}
