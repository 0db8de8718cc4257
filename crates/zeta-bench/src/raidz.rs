//! `zeta bench raidz`: the RDP paper's experiment at pool level. Six file vdevs as raidz1,
//! raidz2 with Reed-Solomon and raidz2 with RDP; a sequential write of the same bytes to a
//! volume on each, and to a raw file as the reference, with throughput and the CPU time the
//! process spent, side by side.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use crate::args::BenchRaidzArgs;
use zeta_core::dsl::{Pool, PoolOptions, TopSpec};
use zeta_core::vdev::{BlockDevice, FileDevice, RaidzConfig};
use zeta_core::zvol::Volume;
use zeta_server::fmt::{human, parse_size};
use zeta_server::{usage, Error, Result};

const WIDTH: usize = 6;
const WRITE_BYTES: usize = 1 << 20;

/// User + system CPU seconds this process has used so far.
fn cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a `rusage` into the pointer it is given, which points at a
    // zeroed, properly aligned `rusage` that lives across the call.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if rc != 0 {
        return 0.0;
    }
    // SAFETY: the struct was zero-initialised (a valid `rusage`) and getrusage succeeded.
    let ru = unsafe { ru.assume_init() };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// The bytes every layout writes, cycled: incompressible and the same for all.
fn payload() -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut buf = vec![0u8; WRITE_BYTES * 8];
    rand::rngs::StdRng::seed_from_u64(17).fill_bytes(&mut buf);
    buf
}

/// One measurement: (MB/s, CPU seconds).
fn write_volume(dir: &Path, layout: &str, size: u64, bs: u32, data: &[u8]) -> Result<(f64, f64)> {
    let (nparity, rdp) = match layout {
        "raidz1" => (1, false),
        "raidz2-rs" => (2, false),
        _ => (2, true),
    };
    let per_leaf = size / (WIDTH as u64 - nparity as u64) * 3 / 2 + (128 << 20);
    let mut leaves = Vec::new();
    for i in 0..WIDTH {
        let p = dir.join(format!("{layout}-{i}"));
        let dev = FileDevice::create(&p, per_leaf)?;
        leaves.push((
            Arc::new(dev) as Arc<dyn BlockDevice>,
            p.display().to_string(),
        ));
    }
    let cfg = RaidzConfig::new(nparity, WIDTH, rdp).map_err(|e| usage(e.to_string()))?;
    let opts = PoolOptions {
        force: true,
        ..Default::default()
    };
    let pool = Pool::create("bench", vec![TopSpec::raidz(cfg, leaves)], opts)?;
    pool.create_volume("v", size, bs, None)?;
    let vol = Volume::open(&pool, "v")?;
    let (t0, c0) = (Instant::now(), cpu_seconds());
    let mut off = 0u64;
    while off < size {
        let at = (off as usize) % data.len();
        vol.write(off, &data[at..at + WRITE_BYTES])?;
        off += WRITE_BYTES as u64;
    }
    vol.flush()?;
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
    drop(vol);
    pool.close()?;
    drop(pool);
    for i in 0..WIDTH {
        let _ = std::fs::remove_file(dir.join(format!("{layout}-{i}")));
    }
    Ok((size as f64 / secs / 1e6, cpu))
}

fn write_raw(dir: &Path, size: u64, data: &[u8]) -> Result<(f64, f64)> {
    use std::os::unix::fs::FileExt;
    let p = dir.join("raw");
    let f = std::fs::File::create(&p).map_err(|e| Error::io(&p, e))?;
    let (t0, c0) = (Instant::now(), cpu_seconds());
    let mut off = 0u64;
    while off < size {
        let at = (off as usize) % data.len();
        f.write_all_at(&data[at..at + WRITE_BYTES], off)
            .map_err(|e| Error::io(&p, e))?;
        off += WRITE_BYTES as u64;
    }
    f.sync_data().map_err(|e| Error::io(&p, e))?;
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
    drop(f);
    let _ = std::fs::remove_file(&p);
    Ok((size as f64 / secs / 1e6, cpu))
}

pub fn raidz(args: BenchRaidzArgs) -> Result<()> {
    let size = parse_size(&args.size)?;
    if size < 64 << 20 || size % (1 << 20) != 0 {
        return Err(usage(
            "bench size must be a whole number of MiB, at least 64M",
        ));
    }
    let bs = parse_size(&args.block_size)?;
    if !(4096..=131072).contains(&bs) || !bs.is_power_of_two() {
        return Err(usage("block size must be a power of two from 4K to 128K"));
    }
    if args.runs == 0 {
        return Err(usage("--runs must be at least 1"));
    }
    let dir = args
        .dir
        .join(format!("zeta-bench-raidz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let data = payload();
    let layouts = ["raw", "raidz1", "raidz2-rs", "raidz2-rdp"];
    if !args.json {
        println!(
            "zeta bench raidz: sequential write of {} in 1M writes to a volume ({} blocks) on {WIDTH} \
             file vdevs, flushed; median of {} runs",
            human(size),
            human(bs),
            args.runs
        );
        println!(
            "{:<11} {:>9} {:>10} {:>12} {:>9}",
            "layout", "MB/s", "CPU s", "CPU s/GiB", "vs raw"
        );
    }
    let mut rows = Vec::new();
    let mut raw_mbps = 0.0;
    for layout in layouts {
        let mut mbps = Vec::new();
        let mut cpu = Vec::new();
        for _ in 0..args.runs {
            let r = if layout == "raw" {
                write_raw(&dir, size, &data)
            } else {
                write_volume(&dir, layout, size, bs as u32, &data)
            };
            let (m, c) = match r {
                Ok(v) => v,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(e);
                }
            };
            mbps.push(m);
            cpu.push(c);
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        let (m, c) = (med(&mut mbps), med(&mut cpu));
        if layout == "raw" {
            raw_mbps = m;
        }
        let per_gib = c / (size as f64 / (1u64 << 30) as f64);
        if args.json {
            rows.push(json!({"layout": layout, "mbps": m, "cpu_seconds": c,
                             "cpu_seconds_per_gib": per_gib, "ratio_to_raw": m / raw_mbps}));
        } else {
            println!(
                "{:<11} {:>9.1} {:>10.2} {:>12.2} {:>9.2}",
                layout,
                m,
                c,
                per_gib,
                m / raw_mbps
            );
            let _ = std::io::stdout().flush();
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json!(rows)).unwrap());
    }
    Ok(())
}
