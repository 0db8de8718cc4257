//! `zeta bench vol`: a volume on a one-file pool against a raw file of the same size, side by
//! side in one run, with the ratio.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::args::BenchVolArgs;
use zeta_core::dsl::{Pool, PoolOptions, TopSpec};
use zeta_core::vdev::{BlockDevice, FileDevice};
use zeta_core::zvol::Volume;
use zeta_server::fmt::parse_size;
use zeta_server::memory::{self, Limits};
use zeta_server::{usage, Error, Result};

/// One target the workloads run against.
trait Target {
    fn write(&self, off: u64, buf: &[u8]) -> Result<()>;
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()>;
    fn flush(&self) -> Result<()>;
}

struct Raw(std::fs::File, PathBuf);
impl Target for Raw {
    fn write(&self, off: u64, buf: &[u8]) -> Result<()> {
        self.0.write_all_at(buf, off).map_err(|e| Error::Io {
            path: self.1.display().to_string(),
            source: e,
        })
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.0.read_exact_at(buf, off).map_err(|e| Error::Io {
            path: self.1.display().to_string(),
            source: e,
        })
    }
    fn flush(&self) -> Result<()> {
        self.0.sync_data().map_err(|e| Error::Io {
            path: self.1.display().to_string(),
            source: e,
        })
    }
}

impl Target for Volume {
    fn write(&self, off: u64, buf: &[u8]) -> Result<()> {
        Ok(Volume::write(self, off, buf)?)
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        Ok(Volume::read(self, off, buf)?)
    }
    fn flush(&self) -> Result<()> {
        Ok(Volume::flush(self)?)
    }
}

/// Runs one workload; returns bytes per second.
fn run(t: &dyn Target, op: &str, bs: usize, size: u64, ops: u64, seed: u64) -> Result<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut buf: Vec<u8> = (0..bs).map(|i| (i * 131 + seed as usize) as u8).collect();
    let blocks = size / bs as u64;
    let start = Instant::now();
    let mut bytes = 0u64;
    for i in 0..ops {
        let off = if op.starts_with("seq") {
            (i % blocks) * bs as u64
        } else {
            rng.gen_range(0..blocks) * bs as u64
        };
        if op.ends_with("write") {
            buf[0] = i as u8;
            t.write(off, &buf)?;
        } else {
            t.read(off, &mut buf)?;
        }
        bytes += bs as u64;
    }
    if op.ends_with("write") {
        t.flush()?;
    }
    Ok(bytes as f64 / start.elapsed().as_secs_f64())
}

pub fn vol(args: BenchVolArgs) -> Result<()> {
    let size = parse_size(&args.size)?;
    let limits = Limits::parse(&args.memory)?;
    if size < 64 << 20 || size % (1 << 20) != 0 {
        return Err(usage(
            "bench size must be a whole number of MiB, at least 64M",
        ));
    }
    std::fs::create_dir_all(&args.dir).map_err(|e| Error::Io {
        path: args.dir.display().to_string(),
        source: e,
    })?;
    let dir = tempfile_dir(&args.dir)?;
    let leaf = dir.join("leaf");
    let raw_path = dir.join("raw");
    let opts = PoolOptions {
        force: true,
        cache_bytes: limits.cache,
        dirty_max_bytes: limits.dirty_max,
        ..Default::default()
    };
    let (cache, dirty) = (opts.cache_bytes, opts.dirty_max_bytes);
    let leaf_len = size + size / 4 + (64 << 20);
    precondition(&leaf, leaf_len)?;
    let dev = FileDevice::open(&leaf)?;
    let spec = vec![TopSpec::stripe((
        Arc::new(dev) as Arc<dyn BlockDevice>,
        leaf.display().to_string(),
    ))];
    let pool = Pool::create("bench", spec, opts)?;
    memory::govern(std::slice::from_ref(&pool), 0);
    pool.create_volume("v", size, 16384, None)?;
    let vol = Volume::open(&pool, "v")?;
    precondition(&raw_path, size)?;
    let raw_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&raw_path)
        .map_err(|e| Error::Io {
            path: raw_path.display().to_string(),
            source: e,
        })?;
    let raw = Raw(raw_file, raw_path.clone());

    let seq_ops = size >> 20;
    let rand_ops = args.random_ops;
    let plan: [(&str, usize, u64); 6] = [
        ("seqwrite", 1 << 20, seq_ops),
        ("seqread", 1 << 20, seq_ops),
        ("randwrite", 4096, rand_ops),
        ("randread", 4096, rand_ops),
        ("randwrite", 16384, rand_ops),
        ("randread", 16384, rand_ops),
    ];
    let mut rows = Vec::new();
    if !args.json {
        println!("zeta bench vol: {} volume (16K blocks) on a one-file pool vs a raw file (both files written in full first), {} runs, median", zeta_server::fmt::human(size), args.runs);
        println!(
            "{:<10} {:>6} {:>12} {:>12} {:>7}",
            "op", "bs", "zeta MB/s", "raw MB/s", "ratio"
        );
    }
    for (i, (op, bs, ops)) in plan.iter().enumerate() {
        if !args.only.is_empty() && !args.only.iter().any(|o| o == op) {
            continue;
        }
        let mut z = Vec::new();
        let mut r = Vec::new();
        for run_i in 0..args.runs {
            let seed = (i * 100 + run_i) as u64;
            z.push(run(&vol, op, *bs, size, *ops, seed)?);
            r.push(run(&raw, op, *bs, size, *ops, seed)?);
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        let (zm, rm) = (med(&mut z), med(&mut r));
        if args.json {
            rows.push(json!({"op": op, "bs": bs, "zeta_mbps": zm / 1e6, "raw_mbps": rm / 1e6, "ratio": zm / rm}));
        } else {
            println!(
                "{:<10} {:>6} {:>12.1} {:>12.1} {:>7.2}",
                op,
                zeta_server::fmt::human(*bs as u64),
                zm / 1e6,
                rm / 1e6,
                zm / rm
            );
        }
    }
    let rss = memory::peak_resident_bytes();
    pool.close()?;
    drop(vol);
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json!({"rows": rows, "peak_rss_bytes": rss, "cache_bytes": cache, "dirty_max_bytes": dirty})).unwrap());
    } else {
        println!(
            "peak RSS {} (cache {} + dirty limit {})",
            zeta_server::fmt::human(rss),
            zeta_server::fmt::human(cache),
            zeta_server::fmt::human(dirty)
        );
    }
    Ok(())
}

/// Writes every byte of the file at `path` once (creating it `len` bytes long) and makes it
/// durable, so both targets start in the steady state of a file in use.
///
/// A file system allocates a block on the first write to it, and on ext4 that first write is
/// several times slower than rewriting an allocated block. Unconditioned, the raw file was
/// allocated by its first run and rewritten by the rest, while the pool, which writes every
/// block somewhere new, kept meeting unallocated space in its file: the ratio measured the
/// file system's allocator more than zeta, and moved from run to run (figures:
/// docs/perf/README.md, "Why the benchmarks write every file in full first").
pub(super) fn precondition(path: &std::path::Path, len: u64) -> Result<()> {
    let io = |e| Error::Io {
        path: path.display().to_string(),
        source: e,
    };
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(io)?;
    let chunk = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < len {
        let n = chunk.len().min((len - off) as usize);
        f.write_all_at(&chunk[..n], off).map_err(io)?;
        off += n as u64;
    }
    f.sync_all().map_err(io)
}

fn tempfile_dir(parent: &std::path::Path) -> Result<PathBuf> {
    let d = parent.join(format!("zeta-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).map_err(|e| Error::Io {
        path: d.display().to_string(),
        source: e,
    })?;
    Ok(d)
}
