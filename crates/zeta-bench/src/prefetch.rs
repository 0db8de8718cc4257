//! `zeta bench prefetch`: sequential reads, one at a time, of a volume read cold (its pool
//! just imported, its file dropped from the page cache), with prefetch off and on, beside the
//! same reads of a raw file of the same size, whose reads ahead are the kernel's.
//!
//! Twice: with the volume written in order, so that its blocks lie in order in the pool's
//! file and the kernel's read-ahead of that file serves zeta too; and with every block then
//! rewritten once in a random order, as a VM disk's blocks end up after random overwrites,
//! where only a read-ahead that follows the volume's block order, not the file's, can help.

use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};

use crate::args::BenchPrefetchArgs;
use zeta_core::dsl::{Pool, PoolOptions, TopSpec};
use zeta_core::vdev::{BlockDevice, FileDevice};
use zeta_core::zvol::Volume;
use zeta_server::fmt::{human, parse_size};
use zeta_server::{usage, Error, Result};

/// The request sizes read with: shorter than the volume's block, one block, many blocks.
const REQUESTS: [usize; 3] = [4 << 10, 16 << 10, 128 << 10];
const BLOCK: u32 = 16 << 10;
/// Blocks rewritten per txg by `scatter`.
const SCATTER_TXG: usize = 16;

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Io {
        path: path.display().to_string(),
        source: e,
    }
}

/// Drops the file's clean pages from the page cache (no root needed), so the next reads come
/// from the disk; false where the pages are the file (tmpfs).
fn evict(path: &Path) -> Result<bool> {
    let f = std::fs::File::open(path).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))?;
    // SAFETY: fadvise on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    // SAFETY: statfs is plain old data, for which all-zero bytes are a valid value.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes one statfs into the live local it points at.
    let st = unsafe { libc::fstatfs(f.as_raw_fd(), &mut fs) };
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    Ok(rc == 0 && st == 0 && fs.f_type as i64 != TMPFS_MAGIC)
}

fn leaf_devices(leaf: &Path) -> Result<Vec<(Arc<dyn BlockDevice>, String)>> {
    let dev = FileDevice::open(leaf)?;
    Ok(vec![(
        Arc::new(dev) as Arc<dyn BlockDevice>,
        leaf.display().to_string(),
    )])
}

/// One cold sequential read of the volume in `bs` requests: MB/s and, with prefetch on, the
/// blocks read ahead and the hits on them.
fn zeta_run(leaf: &Path, size: u64, bs: usize, prefetch: bool) -> Result<(f64, u64, u64)> {
    evict(leaf)?;
    let opts = PoolOptions {
        force: true,
        ..Default::default()
    };
    let pool = Pool::import(leaf_devices(leaf)?, Some("pbench"), opts)?;
    pool.set_prefetch(prefetch);
    let vol = Volume::open(&pool, "v")?;
    let mut buf = vec![0u8; bs];
    let t = Instant::now();
    for off in (0..size).step_by(bs) {
        vol.read(off, &mut buf)?;
    }
    let mbps = size as f64 / t.elapsed().as_secs_f64() / 1e6;
    // The prefetch thread counts a stretch once it is read whole: let it finish the last.
    let mut last = u64::MAX;
    while pool.prefetch_stats().blocks != last {
        last = pool.prefetch_stats().blocks;
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (pf, cache) = (pool.prefetch_stats(), pool.cache_stats());
    drop(vol);
    pool.close()?;
    Ok((mbps, pf.blocks, cache.prefetch_hits))
}

fn raw_run(raw: &Path, size: u64, bs: usize) -> Result<f64> {
    evict(raw)?;
    let f = std::fs::File::open(raw).map_err(io_err(raw))?;
    let mut buf = vec![0u8; bs];
    let t = Instant::now();
    for off in (0..size).step_by(bs) {
        f.read_exact_at(&mut buf, off).map_err(io_err(raw))?;
    }
    Ok(size as f64 / t.elapsed().as_secs_f64() / 1e6)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Writes the volume (and the raw file) whole with the same bytes, then closes the pool.
fn prepare(leaf: &Path, raw: &Path, size: u64) -> Result<()> {
    crate::vol::precondition(leaf, size * 2 + size / 4 + (64 << 20))?;
    crate::vol::precondition(raw, size)?;
    let opts = PoolOptions {
        force: true,
        ..Default::default()
    };
    let pool = Pool::create(
        "pbench",
        vec![TopSpec::stripe(leaf_devices(leaf)?.remove(0))],
        opts,
    )?;
    pool.create_volume("v", size, BLOCK, None)?;
    let vol = Volume::open(&pool, "v")?;
    let rawf = std::fs::OpenOptions::new()
        .write(true)
        .open(raw)
        .map_err(io_err(raw))?;
    let mut chunk = vec![0u8; 1 << 20];
    for (i, off) in (0..size).step_by(chunk.len()).enumerate() {
        for (j, b) in chunk.iter_mut().enumerate() {
            *b = (i * 31 + j * 7 + j / 4096) as u8;
        }
        vol.write(off, &chunk)?;
        rawf.write_all_at(&chunk, off).map_err(io_err(raw))?;
    }
    vol.flush()?;
    rawf.sync_all().map_err(io_err(raw))?;
    drop(vol);
    pool.close()?;
    Ok(())
}

/// Rewrites every block of the volume once, with the bytes it holds, in a random order: the
/// pool writes each where it allocates next, so the blocks lie in that order in its file. A
/// txg is committed every `SCATTER_TXG` blocks: a txg's sync writes its blocks in block
/// order, and one txg of them all would lay the volume out in order again.
fn scatter(leaf: &Path, size: u64) -> Result<()> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let opts = PoolOptions {
        force: true,
        ..Default::default()
    };
    let pool = Pool::import(leaf_devices(leaf)?, Some("pbench"), opts)?;
    let vol = Volume::open(&pool, "v")?;
    let mut order: Vec<u64> = (0..size / BLOCK as u64).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
    let mut buf = vec![0u8; BLOCK as usize];
    for (i, b) in order.into_iter().enumerate() {
        let off = b * BLOCK as u64;
        vol.read(off, &mut buf)?;
        vol.write(off, &buf)?;
        if i % SCATTER_TXG == SCATTER_TXG - 1 {
            pool.sync_now()?;
        }
    }
    vol.flush()?;
    drop(vol);
    pool.close()?;
    Ok(())
}

pub fn prefetch_bench(args: BenchPrefetchArgs) -> Result<()> {
    let size = parse_size(&args.size)?;
    if size < 16 << 20 || size % (1 << 20) != 0 {
        return Err(usage("--size must be a whole number of MiB, at least 16M"));
    }
    if args.runs == 0 {
        return Err(usage("--runs must be at least 1"));
    }
    let dir = args
        .dir
        .join(format!("zeta-bench-prefetch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let result = bench_in(&dir, size, &args);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn bench_in(dir: &Path, size: u64, args: &BenchPrefetchArgs) -> Result<()> {
    let (leaf, raw) = (dir.join("leaf"), dir.join("raw"));
    prepare(&leaf, &raw, size)?;
    let cold = evict(&leaf)?;
    let t = Instant::now();
    let mut rows: Vec<Value> = Vec::new();
    for layout in ["in order", "scattered"] {
        if layout == "scattered" {
            scatter(&leaf, size)?;
        }
        rows.extend(layout_rows(&leaf, &raw, size, layout, args.runs)?);
    }
    let v = json!({"size_bytes": size, "block_bytes": BLOCK, "runs": args.runs,
                   "cold": cold, "seconds": t.elapsed().as_secs_f64(), "rows": rows});
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
    } else {
        report(size, cold, &rows, args);
    }
    Ok(())
}

/// Each request size's medians for the volume as it lies now (`layout`).
fn layout_rows(
    leaf: &Path,
    raw: &Path,
    size: u64,
    layout: &str,
    runs: usize,
) -> Result<Vec<Value>> {
    let mut rows = Vec::new();
    for bs in REQUESTS {
        let (mut r, mut off, mut on) = (vec![], vec![], vec![]);
        let (mut read_ahead, mut hits) = (0, 0);
        for _ in 0..runs {
            r.push(raw_run(raw, size, bs)?);
            let (m, blocks, h) = zeta_run(leaf, size, bs, false)?;
            if blocks != 0 || h != 0 {
                return Err(usage("prefetch turned off still read ahead"));
            }
            off.push(m);
            let (m, blocks, h) = zeta_run(leaf, size, bs, true)?;
            on.push(m);
            (read_ahead, hits) = (blocks, h);
        }
        let (r, off, on) = (median(&mut r), median(&mut off), median(&mut on));
        rows.push(json!({
            "layout": layout, "bs": bs, "raw_mbps": r, "off_mbps": off, "on_mbps": on,
            "on_vs_off": on / off, "on_vs_raw": on / r,
            "prefetch_blocks": read_ahead, "prefetch_hits": hits,
        }));
    }
    Ok(rows)
}

fn report(size: u64, cold: bool, rows: &[Value], args: &BenchPrefetchArgs) {
    println!(
        "zeta bench prefetch: sequential reads one at a time of a {} volume (16K blocks) read cold, prefetch off and on, and of a raw file; median of {} runs",
        human(size),
        args.runs
    );
    if !cold {
        println!(
            "note: {} is on tmpfs: nothing is read cold",
            args.dir.display()
        );
    }
    println!(
        "{:<9} {:>5} {:>9} {:>9} {:>9} {:>7} {:>7} {:>13}",
        "layout", "bs", "raw MB/s", "off MB/s", "on MB/s", "on/off", "on/raw", "read ahead"
    );
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        println!(
            "{:<9} {:>5} {:>9.1} {:>9.1} {:>9.1} {:>7.2} {:>7.2} {:>13}",
            r["layout"].as_str().unwrap_or(""),
            human(r["bs"].as_u64().unwrap_or(0)),
            f("raw_mbps"),
            f("off_mbps"),
            f("on_mbps"),
            f("on_vs_off"),
            f("on_vs_raw"),
            format!(
                "{}/{}",
                r["prefetch_hits"].as_u64().unwrap_or(0),
                r["prefetch_blocks"].as_u64().unwrap_or(0)
            ),
        );
    }
    println!(
        "in order: the volume written whole in order; scattered: then every block rewritten once in a random order. read ahead: blocks used / read ahead, last run with prefetch on"
    );
}
