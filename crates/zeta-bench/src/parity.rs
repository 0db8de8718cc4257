//! `zeta bench parity`: parity generation and two-column reconstruction with every supported
//! kernel, single core, against ISA-L on the same buffers in the same run.
//!
//! ISA-L is loaded at run time from `libisal.so.2` (the core never links it); when it is not
//! there the table says so and the kernels are measured alone. The references are `xor_gen`
//! (4+1), `pq_gen` (P+Q generation) and `ec_encode_data` with tables from `ec_init_tables`:
//! for 8+3 generation with the matrix of `gf_gen_rs_matrix` (whose parity rows are exactly
//! our P, Q, R: 1, 2^i, 4^i) and for rec2 with the rows of `gf_invert_matrix` of the surviving
//! rows' matrix. Every reference output is checked against ours, so both sides compute the
//! same bytes.

use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use rand::{RngCore, SeedableRng};
use serde_json::json;

use crate::args::BenchParityArgs;
use zeta_math::parity::{Code, Codec, ParityImpl};
use zeta_server::{usage, Result};

/// A zeroed buffer whose bytes start on a 64-byte boundary (ISA-L wants 32).
struct Buf {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl Buf {
    fn new(len: usize) -> Buf {
        let raw = vec![0u8; len + 64];
        let off = raw.as_ptr().align_offset(64);
        assert!(off < 64);
        Buf { raw, off, len }
    }
    fn get(&self) -> &[u8] {
        &self.raw[self.off..self.off + self.len]
    }
    fn get_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.off..self.off + self.len]
    }
    fn ptr(&mut self) -> *mut u8 {
        self.get_mut().as_mut_ptr()
    }
}

type XorGen = unsafe extern "C" fn(c_int, c_int, *mut *mut c_void) -> c_int;
type EcInitTables = unsafe extern "C" fn(c_int, c_int, *mut u8, *mut u8);
type EcEncodeData = unsafe extern "C" fn(c_int, c_int, c_int, *mut u8, *mut *mut u8, *mut *mut u8);
type GfGenMatrix = unsafe extern "C" fn(*mut u8, c_int, c_int);
type GfInvertMatrix = unsafe extern "C" fn(*mut u8, *mut u8, c_int) -> c_int;

/// The ISA-L entry points we compare against (prototypes from isa-l/raid.h and
/// isa-l/erasure_code.h).
struct IsaL {
    xor_gen: XorGen,
    pq_gen: XorGen,
    ec_init_tables: EcInitTables,
    ec_encode_data: EcEncodeData,
    gf_gen_rs_matrix: GfGenMatrix,
    gf_invert_matrix: GfInvertMatrix,
    /// Keeps the functions above mapped; never dropped before them.
    _lib: libloading::Library,
}

impl IsaL {
    fn load() -> std::result::Result<IsaL, String> {
        // SAFETY: libisal is a plain C library whose initialisers only detect CPU features.
        let lib = unsafe { libloading::Library::new("libisal.so.2") }.map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($name:literal, $ty:ty) => {
                // SAFETY: the type is the function's prototype in the ISA-L headers; the
                // pointer is used only while `lib` (stored alongside) is loaded.
                *unsafe { lib.get::<$ty>($name) }.map_err(|e| e.to_string())?
            };
        }
        Ok(IsaL {
            xor_gen: sym!(b"xor_gen", XorGen),
            pq_gen: sym!(b"pq_gen", XorGen),
            ec_init_tables: sym!(b"ec_init_tables", EcInitTables),
            ec_encode_data: sym!(b"ec_encode_data", EcEncodeData),
            gf_gen_rs_matrix: sym!(b"gf_gen_rs_matrix", GfGenMatrix),
            gf_invert_matrix: sym!(b"gf_invert_matrix", GfInvertMatrix),
            _lib: lib,
        })
    }
}

/// One stripe shape of the bench.
struct Geometry {
    name: &'static str,
    ndata: usize,
    nparity: usize,
    codes: &'static [Code],
}

const GEOMETRIES: [Geometry; 5] = [
    Geometry {
        name: "4+1",
        ndata: 4,
        nparity: 1,
        codes: &[Code::Xor],
    },
    Geometry {
        name: "4+2",
        ndata: 4,
        nparity: 2,
        codes: &[Code::Rs, Code::Rdp { p: 17 }],
    },
    Geometry {
        name: "8+2",
        ndata: 8,
        nparity: 2,
        codes: &[Code::Rs, Code::Rdp { p: 17 }],
    },
    Geometry {
        name: "16+2",
        ndata: 16,
        nparity: 2,
        codes: &[Code::Rs, Code::Rdp { p: 17 }],
    },
    Geometry {
        name: "8+3",
        ndata: 8,
        nparity: 3,
        codes: &[Code::Rs],
    },
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Gen,
    Rec2,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Gen => "gen",
            Op::Rec2 => "rec2",
        }
    }
}

/// Who runs an operation.
#[derive(Clone, Copy)]
enum Runner {
    Ours(Codec, ParityImpl),
    IsaL,
}

/// The buffers of one geometry and column size.
struct Stripe {
    len: usize,
    nparity: usize,
    /// The original data, and the working copy rec2 rebuilds columns 0 and 1 of.
    data: Vec<Buf>,
    work: Vec<Buf>,
    /// Parity per code (index in the geometry's codes), generated once up front.
    parity: Vec<Vec<Buf>>,
    /// Our generate's output (scratch), and ISA-L's outputs.
    out: Vec<Buf>,
    isal_out: Vec<Buf>,
    /// ISA-L tables: generation (parity rows) and rec2 (decode rows).
    gen_tables: Vec<u8>,
    rec_tables: Vec<u8>,
}

impl Stripe {
    fn new(g: &Geometry, len: usize, isal: Option<&IsaL>) -> Stripe {
        let mut rng = rand::rngs::StdRng::seed_from_u64(len as u64 * 31 + g.ndata as u64);
        let data: Vec<Buf> = (0..g.ndata)
            .map(|_| {
                let mut b = Buf::new(len);
                rng.fill_bytes(b.get_mut());
                b
            })
            .collect();
        let work: Vec<Buf> = (0..g.ndata)
            .map(|i| {
                let mut b = Buf::new(len);
                b.get_mut().copy_from_slice(data[i].get());
                b
            })
            .collect();
        let parity = g
            .codes
            .iter()
            .map(|&code| {
                let codec = Codec::new(code, g.nparity).expect("bench geometry is valid");
                let mut par: Vec<Buf> = (0..g.nparity).map(|_| Buf::new(len)).collect();
                let d: Vec<&[u8]> = data.iter().map(|b| b.get()).collect();
                let mut p: Vec<&mut [u8]> = par.iter_mut().map(|b| b.get_mut()).collect();
                codec.generate_with(ParityImpl::Scalar, &d, &mut p);
                par
            })
            .collect();
        let (mut gen_tables, mut rec_tables) = (Vec::new(), Vec::new());
        if let Some(isal) = isal {
            (gen_tables, rec_tables) = isal_tables(isal, g.ndata, g.nparity);
        }
        Stripe {
            len,
            nparity: g.nparity,
            data,
            work,
            parity,
            out: (0..g.nparity).map(|_| Buf::new(len)).collect(),
            isal_out: (0..g.nparity).map(|_| Buf::new(len)).collect(),
            gen_tables,
            rec_tables,
        }
    }

    /// Runs `op` once; `code` indexes the geometry's codes (ISA-L always runs RS/XOR).
    fn run(&mut self, runner: Runner, code: usize, op: Op, isal: Option<&IsaL>) {
        match (runner, op) {
            (Runner::Ours(codec, imp), Op::Gen) => {
                let d: Vec<&[u8]> = self.data.iter().map(|b| b.get()).collect();
                let mut p: Vec<&mut [u8]> = self.out.iter_mut().map(|b| b.get_mut()).collect();
                codec.generate_with(imp, &d, &mut p);
            }
            (Runner::Ours(codec, imp), Op::Rec2) => {
                let np = self.nparity;
                let mut p: Vec<&mut [u8]> =
                    self.parity[code].iter_mut().map(|b| b.get_mut()).collect();
                let mut d: Vec<&mut [u8]> = self.work.iter_mut().map(|b| b.get_mut()).collect();
                codec
                    .reconstruct_with(imp, &mut p, &mut d, &[np, np + 1])
                    .expect("two missing columns are within parity");
            }
            (Runner::IsaL, op) => {
                let isal = isal.expect("ISA-L runner without ISA-L");
                self.run_isal(isal, op);
            }
        }
    }

    fn run_isal(&mut self, isal: &IsaL, op: Op) {
        let (k, np, len) = (self.data.len(), self.nparity, self.len as c_int);
        match op {
            Op::Gen if np <= 2 => {
                let mut ptrs: Vec<*mut c_void> = self
                    .data
                    .iter_mut()
                    .chain(self.isal_out.iter_mut())
                    .map(|b| b.ptr() as *mut c_void)
                    .collect();
                let f = if np == 1 { isal.xor_gen } else { isal.pq_gen };
                // SAFETY: k sources and np outputs of len bytes, 64-byte aligned, as xor_gen /
                // pq_gen require; the outputs are distinct buffers.
                let rc = unsafe { f(ptrs.len() as c_int, len, ptrs.as_mut_ptr()) };
                assert_eq!(rc, 0, "ISA-L xor_gen/pq_gen failed");
            }
            Op::Gen => {
                let mut src: Vec<*mut u8> = self.data.iter_mut().map(|b| b.ptr()).collect();
                let mut dst: Vec<*mut u8> = self.isal_out.iter_mut().map(|b| b.ptr()).collect();
                // SAFETY: tables for k sources x np rows (32·k·np bytes), k source and np
                // destination pointers of len bytes each.
                unsafe {
                    (isal.ec_encode_data)(
                        len,
                        k as c_int,
                        np as c_int,
                        self.gen_tables.as_mut_ptr(),
                        src.as_mut_ptr(),
                        dst.as_mut_ptr(),
                    )
                };
            }
            Op::Rec2 => {
                // Survivors in the order of the decode matrix: data 2..k, then parity rows.
                let rs = 0; // ISA-L rebuilds from the RS parity.
                let mut src: Vec<*mut u8> = self.data[2..]
                    .iter_mut()
                    .chain(self.parity[rs].iter_mut().take(2))
                    .map(|b| b.ptr())
                    .collect();
                let mut dst: Vec<*mut u8> =
                    self.isal_out.iter_mut().take(2).map(|b| b.ptr()).collect();
                // SAFETY: tables for k sources x 2 rows, k sources and 2 destinations of len
                // bytes each.
                unsafe {
                    (isal.ec_encode_data)(
                        len,
                        k as c_int,
                        2,
                        self.rec_tables.as_mut_ptr(),
                        src.as_mut_ptr(),
                        dst.as_mut_ptr(),
                    )
                };
            }
        }
    }

    /// Whether the last run of `op` by ISA-L produced the same bytes as our code.
    fn isal_agrees(&self, op: Op) -> bool {
        match op {
            Op::Gen => (0..self.nparity).all(|i| self.isal_out[i].get() == self.parity[0][i].get()),
            Op::Rec2 => (0..2).all(|i| self.isal_out[i].get() == self.data[i].get()),
        }
    }
}

/// ISA-L's expanded tables for generation (the parity rows of `gf_gen_rs_matrix`, i.e. P,
/// Q, R) and for rebuilding data columns 0 and 1 from data 2.. and the first two parity rows.
fn isal_tables(isal: &IsaL, k: usize, np: usize) -> (Vec<u8>, Vec<u8>) {
    let m = k + np;
    let mut a = vec![0u8; m * k];
    // SAFETY: `a` holds the m x k matrix the function fills.
    unsafe { (isal.gf_gen_rs_matrix)(a.as_mut_ptr(), m as c_int, k as c_int) };
    let mut gen = vec![0u8; 32 * k * np];
    // SAFETY: np rows of k coefficients in, 32·k·np bytes of tables out.
    unsafe {
        (isal.ec_init_tables)(
            k as c_int,
            np as c_int,
            a[k * k..].as_mut_ptr(),
            gen.as_mut_ptr(),
        )
    };
    if np < 2 {
        return (gen, Vec::new()); // no rec2 with one parity column
    }
    // Rows of the surviving columns: data 2..k (identity rows), parity rows k and k+1.
    let mut b = Vec::with_capacity(k * k);
    for r in (2..k).chain([k, k + 1]) {
        b.extend_from_slice(&a[r * k..(r + 1) * k]);
    }
    let mut inv = vec![0u8; k * k];
    // SAFETY: two k x k matrices.
    let rc = unsafe { (isal.gf_invert_matrix)(b.as_mut_ptr(), inv.as_mut_ptr(), k as c_int) };
    assert_eq!(rc, 0, "survivor matrix is invertible");
    let mut rec = vec![0u8; 32 * k * 2];
    // SAFETY: the first two rows of the inverse (data 0 and 1), 32·k·2 bytes of tables out.
    unsafe { (isal.ec_init_tables)(k as c_int, 2, inv.as_mut_ptr(), rec.as_mut_ptr()) };
    (gen, rec)
}

/// Seconds per run of `f`, one sample of `iters` repetitions.
pub(super) fn sample(iters: u64, f: &mut dyn FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed().as_secs_f64() / iters as f64
}

/// Repetitions of `f` that take about `budget`.
pub(super) fn calibrate(budget: Duration, f: &mut dyn FnMut()) -> u64 {
    f();
    let mut n = 1u64;
    loop {
        let start = Instant::now();
        for _ in 0..n {
            f();
        }
        let t = start.elapsed();
        if t >= budget / 4 || n >= 1 << 24 {
            let per = t.as_secs_f64() / n as f64;
            return ((budget.as_secs_f64() / per.max(1e-9)) as u64).max(1);
        }
        n *= 2;
    }
}

struct Row {
    geometry: &'static str,
    column_bytes: usize,
    op: Op,
    code: &'static str,
    imp: &'static str,
    gbps: f64,
    ratio: Option<f64>,
}

pub fn parity(args: BenchParityArgs) -> Result<()> {
    if args.runs == 0 {
        return Err(usage("--runs must be at least 1"));
    }
    if let Some(g) = args
        .geometry
        .iter()
        .find(|g| !GEOMETRIES.iter().any(|x| x.name == g.as_str()))
    {
        return Err(usage(format!(
            "unknown geometry {g}: one of 4+1, 4+2, 8+2, 16+2, 8+3"
        )));
    }
    let isal = IsaL::load();
    let sizes: &[usize] = if args.quick {
        &[4096]
    } else {
        &[4096, 16384, 131072]
    };
    let budget = if args.quick {
        Duration::from_micros(500)
    } else {
        Duration::from_millis(20)
    };
    let kernels = ParityImpl::supported_list();
    if !args.json {
        println!(
            "zeta bench parity: single core, data GB/s (data bytes / time, 1 GB = 1e9 B), median of {} runs",
            args.runs
        );
        match &isal {
            Ok(_) => println!("reference: ISA-L (libisal.so.2) on the same buffers"),
            Err(e) => println!("reference missing: ISA-L not loaded ({e}); kernels measured alone"),
        }
        println!(
            "{:<6} {:>7} {:<5} {:<4} {:<9} {:>8} {:>8}",
            "geom", "column", "op", "code", "impl", "GB/s", "/ISA-L"
        );
    }
    let isal = isal.ok();
    let mut rows = Vec::new();
    for &len in sizes {
        for g in GEOMETRIES
            .iter()
            .filter(|g| args.geometry.is_empty() || args.geometry.iter().any(|n| n == g.name))
        {
            let mut stripe = Stripe::new(g, len, isal.as_ref());
            for op in [Op::Gen, Op::Rec2] {
                if op == Op::Rec2 && g.nparity < 2 {
                    continue;
                }
                // Contenders: (code index, code name, runner, impl name).
                let mut who: Vec<(usize, &'static str, Runner, &'static str)> = Vec::new();
                if isal.is_some() {
                    who.push((0, g.codes[0].name(), Runner::IsaL, "isa-l"));
                }
                for (ci, &code) in g.codes.iter().enumerate() {
                    let codec = Codec::new(code, g.nparity).expect("bench geometry is valid");
                    for &k in &kernels {
                        who.push((ci, code.name(), Runner::Ours(codec, k), k.name()));
                    }
                }
                let mut iters = Vec::with_capacity(who.len());
                for &(ci, _, runner, _) in &who {
                    let mut f = || stripe.run(runner, ci, op, isal.as_ref());
                    iters.push(calibrate(budget, &mut f));
                }
                // Interleaved runs, so drifting machine load hits every contender alike.
                let mut times = vec![Vec::with_capacity(args.runs); who.len()];
                for _ in 0..args.runs {
                    for (w, &(ci, _, runner, _)) in who.iter().enumerate() {
                        let mut f = || stripe.run(runner, ci, op, isal.as_ref());
                        times[w].push(sample(iters[w], &mut f));
                    }
                }
                if isal.is_some() {
                    stripe.run(Runner::IsaL, 0, op, isal.as_ref());
                    if !stripe.isal_agrees(op) {
                        eprintln!(
                            "warning: ISA-L {} {} output differs from zeta's",
                            g.name,
                            op.name()
                        );
                    }
                }
                let data_bytes = (g.ndata * len) as f64;
                let gbps: Vec<f64> = times
                    .iter_mut()
                    .map(|t| {
                        t.sort_by(|a, b| a.total_cmp(b));
                        data_bytes / t[t.len() / 2] / 1e9
                    })
                    .collect();
                let reference = isal.as_ref().map(|_| gbps[0]);
                for (w, &(_, code, _, imp)) in who.iter().enumerate() {
                    rows.push(Row {
                        geometry: g.name,
                        column_bytes: len,
                        op,
                        code,
                        imp,
                        gbps: gbps[w],
                        ratio: reference.map(|r| gbps[w] / r),
                    });
                    if !args.json {
                        let r = rows.last().expect("just pushed");
                        println!(
                            "{:<6} {:>7} {:<5} {:<4} {:<9} {:>8.2} {:>8}",
                            r.geometry,
                            zeta_server::fmt::human(len as u64),
                            op.name(),
                            r.code,
                            r.imp,
                            r.gbps,
                            r.ratio.map_or("-".to_string(), |x| format!("{x:.2}")),
                        );
                    }
                }
            }
        }
    }
    if args.json {
        let list: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "geometry": r.geometry,
                    "column_bytes": r.column_bytes,
                    "op": r.op.name(),
                    "code": r.code,
                    "impl": r.imp,
                    "gbps": r.gbps,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&list).expect("rows serialize")
        );
    }
    Ok(())
}
