//! `zeta bench scrub`: how fast a scrub reads a pool on file vdevs, against `cat` reading the
//! same files to /dev/null, in the same run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use crate::args::BenchScrubArgs;
use zeta_core::dsl::{Pool, PoolOptions, TopSpec};
use zeta_core::vdev::{BlockDevice, FileDevice};
use zeta_core::zvol::Volume;
use zeta_server::fmt::{human, parse_size};
use zeta_server::{usage, Error, Result};

const FILES: usize = 2;

fn open_leaves(paths: &[PathBuf]) -> Result<Vec<(Arc<dyn BlockDevice>, String)>> {
    paths
        .iter()
        .map(|p| {
            Ok((
                Arc::new(FileDevice::open(p)?) as Arc<dyn BlockDevice>,
                p.display().to_string(),
            ))
        })
        .collect()
}

/// `cat FILES > /dev/null`: bytes per second over the files' whole length.
fn cat(paths: &[PathBuf]) -> Result<f64> {
    let bytes: u64 = paths
        .iter()
        .map(|p| {
            std::fs::metadata(p)
                .map(|m| m.len())
                .map_err(|e| Error::io(p, e))
        })
        .sum::<Result<u64>>()?;
    let t = Instant::now();
    let st = std::process::Command::new("cat")
        .args(paths)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| Error::io(Path::new("cat"), e))?;
    if !st.success() {
        return Err(usage("cat failed"));
    }
    Ok(bytes as f64 / t.elapsed().as_secs_f64())
}

/// One scrub of the pool: bytes examined per second.
fn scrub(paths: &[PathBuf]) -> Result<f64> {
    let pool = Pool::import(open_leaves(paths)?, Some("bench"), PoolOptions::default())?;
    let t = Instant::now();
    pool.start_scrub()?;
    pool.wait_scrub();
    let secs = t.elapsed().as_secs_f64();
    let st = pool.scan_status();
    pool.close()?;
    if st.errors > 0 {
        return Err(usage(format!("the scrub found {} errors", st.errors)));
    }
    Ok(st.examined_bytes as f64 / secs)
}

pub fn scrub_bench(args: BenchScrubArgs) -> Result<()> {
    let size = parse_size(&args.size)?;
    if size < 64 << 20 || size % (1 << 20) != 0 {
        return Err(usage(
            "bench size must be a whole number of MiB, at least 64M",
        ));
    }
    if args.runs == 0 {
        return Err(usage("--runs must be at least 1"));
    }
    let dir = args
        .dir
        .join(format!("zeta-bench-scrub-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let result = run(&dir, size, &args);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run(dir: &Path, size: u64, args: &BenchScrubArgs) -> Result<()> {
    // Two stripes, so every byte the scrub examines is one byte read from a file, and each
    // file just large enough for its half: `cat` then reads mostly data, not holes.
    let paths: Vec<PathBuf> = (0..FILES).map(|i| dir.join(format!("leaf{i}"))).collect();
    let per_file = size / FILES as u64 + size / 16 + (64 << 20);
    let mut spec = Vec::new();
    for p in &paths {
        let dev = FileDevice::create(p, per_file)?;
        spec.push(TopSpec::stripe((
            Arc::new(dev) as Arc<dyn BlockDevice>,
            p.display().to_string(),
        )));
    }
    let opts = PoolOptions {
        force: true,
        ..Default::default()
    };
    let pool = Pool::create("bench", spec, opts)?;
    pool.create_volume("v", size, 131072, None)?;
    {
        use rand::{RngCore, SeedableRng};
        let vol = Volume::open(&pool, "v")?;
        let mut buf = vec![0u8; 1 << 20];
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for off in (0..size).step_by(1 << 20) {
            rng.fill_bytes(&mut buf);
            vol.write(off, &buf)?;
        }
        vol.flush()?;
    }
    pool.close()?;
    drop(pool);

    let (mut c, mut s) = (Vec::new(), Vec::new());
    for _ in 0..args.runs {
        // Alternate, so both see the same page cache and machine load.
        c.push(cat(&paths)?);
        s.push(scrub(&paths)?);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (cm, sm) = (med(&mut c), med(&mut s));
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"size": size, "cat_gbps": cm / 1e9,
                "scrub_gbps": sm / 1e9, "ratio": sm / cm}))
            .expect("serializes")
        );
    } else {
        println!(
            "zeta bench scrub: {} volume (128K blocks) on {FILES} file vdevs, median of {} runs",
            human(size),
            args.runs
        );
        println!("cat (files to /dev/null)  {:>8.2} GB/s", cm / 1e9);
        println!("zeta pool scrub           {:>8.2} GB/s", sm / 1e9);
        println!("ratio                     {:>8.2}", sm / cm);
    }
    Ok(())
}
