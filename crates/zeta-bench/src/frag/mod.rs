//! `zeta bench frag`: seed 002's experiment. Per fill level a fresh pool on one file is filled
//! with sequential writes to that share of its size, then writers overwrite random 8K blocks
//! of what was written, throughput sampled every second: the burst is the mean of the first
//! 10 samples, the steady state the mean of the last 50 (the seed's definitions; a shorter
//! run takes the first and last fifth). zeta is driven through NBD by zeta-load (one
//! connection per writer, no flushes); zfs-fuse, the peer, by threads writing into files of a
//! `recordsize=8k,compression=on` file system, as the seed's writers did.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::json;

use crate::args::BenchFragArgs;
use crate::sync::check_stop;
use zeta_core::dsl::PoolMap;
use zeta_plot::{self as plot, Line};
use zeta_server::fmt::parse_size;
use zeta_server::{usage, Result};

mod zeta;
mod zfs_fuse;

/// The seed's record size and write size.
const BLOCK: u64 = 8192;
/// Samples the burst and the steady state average over, at most (the seed's 10 and 50).
const BURST_SAMPLES: usize = 10;
const STEADY_SAMPLES: usize = 50;

/// What a run measures, from the arguments.
pub(crate) struct Plan {
    fills: Vec<u32>,
    runtime: u64,
    writers: u32,
    depth: u32,
    size: u64,
    peer: bool,
    dir: PathBuf,
    out: PathBuf,
    format: &'static str,
}

/// One fill level on one system.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Level {
    system: &'static str,
    /// The share of the pool's size the fill aimed at, in percent.
    fill_pct: u32,
    /// The pool's allocated share after the fill, and after the overwrites (metadata
    /// included), in percent.
    occupancy_pct: f64,
    occupancy_after_pct: f64,
    /// Bytes the fill wrote (and the overwrites range over).
    filled_bytes: u64,
    /// MiB/s of overwrites answered in each second.
    samples: Vec<f64>,
    burst_mib_s: f64,
    steady_mib_s: f64,
    /// The first error a writer met, if any (the run of that level stops there).
    error: Option<String>,
    /// zeta's FRAG after the fill and after the overwrites.
    frag_before: Option<u8>,
    frag_after: Option<u8>,
    /// Writes that reached the device during the overwrites: (size class from, count) for
    /// zeta, from its own counters; zfs-fuse's only as a mean (its loop device's counters).
    write_sizes: Vec<(u64, u64)>,
    mean_write_kib: Option<f64>,
    #[serde(skip)]
    maps: Option<(PoolMap, PoolMap)>,
}

impl Level {
    /// A level measured on `system`: `samples` each second after a fill of `filled_bytes`
    /// that left the pool `occupancy` % and then `after` % allocated; the burst and steady
    /// state follow from the samples, the rest is the caller's to add.
    fn new(
        system: &'static str,
        fill_pct: u32,
        (occupancy_pct, occupancy_after_pct): (f64, f64),
        filled_bytes: u64,
        samples: Vec<f64>,
        error: Option<String>,
    ) -> Level {
        let (burst_mib_s, steady_mib_s) = burst_and_steady(&samples);
        Level {
            system,
            fill_pct,
            occupancy_pct,
            occupancy_after_pct,
            filled_bytes,
            samples,
            burst_mib_s,
            steady_mib_s,
            error,
            frag_before: None,
            frag_after: None,
            write_sizes: Vec::new(),
            mean_write_kib: None,
            maps: None,
        }
    }
}

/// The mean of the first `BURST_SAMPLES` and of the last `STEADY_SAMPLES` samples; a run too
/// short for both takes the first and the last fifth.
fn burst_and_steady(samples: &[f64]) -> (f64, f64) {
    let n = samples.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len().max(1) as f64;
    let (b, s) = if n >= BURST_SAMPLES + STEADY_SAMPLES {
        (BURST_SAMPLES, STEADY_SAMPLES)
    } else {
        ((n / 5).max(1), (n / 5).max(1))
    };
    (mean(&samples[..b]), mean(&samples[n - s..]))
}

fn plan(a: &BenchFragArgs) -> Result<Plan> {
    let fills_text = a.fills.clone().unwrap_or_else(|| {
        if a.quick {
            "10,50,90".into()
        } else {
            "10,25,50,75,90".into()
        }
    });
    let mut fills = Vec::new();
    for f in fills_text.split(',') {
        match f.trim().parse::<u32>() {
            Ok(v) if (1..=97).contains(&v) => fills.push(v),
            _ => {
                return Err(usage(format!(
                    "--fills {fills_text}: percentages from 1 to 97, comma-separated"
                )))
            }
        }
    }
    let size = parse_size(
        a.size
            .as_deref()
            .unwrap_or(if a.quick { "512M" } else { "4G" }),
    )?;
    if size < 256 << 20 {
        return Err(usage("--size: at least 256M"));
    }
    if a.writers == 0 || a.writers > 64 {
        return Err(usage("--writers: 1 to 64"));
    }
    if a.depth == 0 || a.depth > 64 {
        return Err(usage("--depth: 1 to 64"));
    }
    let runtime = a.runtime.unwrap_or(if a.quick { 8 } else { 150 });
    if runtime < 2 {
        return Err(usage("--runtime: at least 2 seconds"));
    }
    let peer = match a.peer.as_deref() {
        None => false,
        Some("zfs-fuse") => true,
        Some(p) => {
            return Err(usage(format!(
                "--peer {p}: the peer this bench knows is zfs-fuse"
            )))
        }
    };
    let format = match a.format.as_str() {
        "svg" => "svg",
        "png" => "png",
        f => return Err(usage(format!("--format {f}: svg or png"))),
    };
    Ok(Plan {
        fills,
        runtime,
        writers: a.writers,
        depth: a.depth,
        size,
        peer,
        dir: a.dir.clone(),
        out: a.out.clone(),
        format,
    })
}

pub fn frag_bench(a: BenchFragArgs) -> Result<()> {
    let plan = plan(&a)?;
    let stop = crate::sync::stop_on_signals()?;
    std::fs::create_dir_all(&plan.out).map_err(|e| zeta_server::Error::io(&plan.out, e))?;
    std::fs::create_dir_all(&plan.dir).map_err(|e| zeta_server::Error::io(&plan.dir, e))?;
    let work = crate::sync::procs::WorkDir::create(
        &plan
            .dir
            .join(format!("zeta-bench-frag-{}", std::process::id())),
    )?;
    let peer = if plan.peer {
        Some(zfs_fuse::ZfsFuse::start(&work.0, &stop)?)
    } else {
        None
    };
    let mut levels = Vec::new();
    for &fill in &plan.fills {
        check_stop(&stop)?;
        progress(&a, &format!("zeta at {fill} %"));
        let l = zeta::level(&work.0, &plan, fill, &stop)?;
        progress(&a, &line(&l));
        levels.push(l);
        if let Some(p) = &peer {
            check_stop(&stop)?;
            progress(&a, &format!("zfs-fuse at {fill} %"));
            let l = p.level(&work.0, &plan, fill, &stop)?;
            progress(&a, &line(&l));
            levels.push(l);
        }
    }
    drop(peer);
    let files = pictures(&plan, &levels)?;
    let result = json!({
        "size": plan.size, "runtime_s": plan.runtime, "writers": plan.writers,
        "depth": plan.depth, "block": BLOCK, "levels": levels, "files": files,
    });
    let path = plan.out.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&result).unwrap())
        .map_err(|e| zeta_server::Error::io(&path, e))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&result).unwrap());
    } else {
        print!("{}", report(&plan, &levels));
        println!("plots, maps and results.json in {}", plan.out.display());
    }
    Ok(())
}

/// A line on stderr while the bench runs (not with --json, whose stdout is the result).
fn progress(a: &BenchFragArgs, what: &str) {
    if !a.json {
        eprintln!("zeta bench frag: {what}");
    }
}

fn line(l: &Level) -> String {
    format!(
        "{} at {} %: occupancy {:.1} %, burst {:.1} MiB/s, steady {:.1} MiB/s{}",
        l.system,
        l.fill_pct,
        l.occupancy_pct,
        l.burst_mib_s,
        l.steady_mib_s,
        l.error
            .as_deref()
            .map(|e| format!(", ERROR: {e}"))
            .unwrap_or_default()
    )
}

/// The table of every level, then zeta against the peer and against its own 10 % figure.
fn report(plan: &Plan, levels: &[Level]) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "seed 002's experiment: {} pool, {} writers x {} of random 8K overwrites, {} s per \
         level\n{:<9} {:>5} {:>9} {:>10} {:>10} {:>11} {:>11}  error\n",
        zeta_server::fmt::human(plan.size),
        plan.writers,
        plan.depth,
        plan.runtime,
        "system",
        "fill",
        "occupied",
        "burst",
        "steady",
        "FRAG",
        "dev write"
    );
    for l in levels {
        let frag = match (l.frag_before, l.frag_after) {
            (Some(b), Some(a)) => format!("{b}->{a} %"),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:<9} {:>4}% {:>8.1}% {:>5.1} MiB/s {:>5.1} MiB/s {:>11} {:>11}  {}",
            l.system,
            l.fill_pct,
            l.occupancy_pct,
            l.burst_mib_s,
            l.steady_mib_s,
            frag,
            l.mean_write_kib
                .map(|k| format!("{k:.0}K mean"))
                .unwrap_or_else(|| "-".into()),
            l.error.as_deref().unwrap_or("-")
        );
    }
    let of = |system: &str, fill: u32| {
        levels
            .iter()
            .find(|l| l.system == system && l.fill_pct == fill)
    };
    if plan.peer {
        let _ = writeln!(
            out,
            "{:>5} {:>13} {:>13} {:>8}",
            "fill", "zeta", "zfs-fuse", "ratio"
        );
        for &f in &plan.fills {
            if let (Some(z), Some(p)) = (of("zeta", f), of("zfs-fuse", f)) {
                let _ = writeln!(
                    out,
                    "{:>4}% {:>7.1} MiB/s {:>7.1} MiB/s {:>7.2}x",
                    f,
                    z.steady_mib_s,
                    p.steady_mib_s,
                    z.steady_mib_s / p.steady_mib_s.max(f64::MIN_POSITIVE)
                );
            }
        }
    }
    if let Some(base) = of("zeta", 10) {
        for l in levels
            .iter()
            .filter(|l| l.system == "zeta" && l.fill_pct > 10)
        {
            let _ = writeln!(
                out,
                "zeta at {} %: {:.2}x its steady state at 10 %",
                l.fill_pct,
                l.steady_mib_s / base.steady_mib_s.max(f64::MIN_POSITIVE)
            );
        }
    }
    out
}

/// The time series per system, steady state against occupancy, and zeta's maps before and
/// after each level; returns the files written.
fn pictures(plan: &Plan, levels: &[Level]) -> Result<Vec<String>> {
    let mut files = Vec::new();
    let mut draw = |name: String, f: &dyn Fn(&Path) -> std::result::Result<(), String>| {
        let path = plan.out.join(format!("{name}.{}", plan.format));
        f(&path).map_err(usage)?;
        files.push(path.display().to_string());
        Ok::<(), zeta_server::Error>(())
    };
    let systems: Vec<&str> = ["zeta", "zfs-fuse"]
        .into_iter()
        .filter(|s| levels.iter().any(|l| l.system == *s))
        .collect();
    for sys in &systems {
        let lines: Vec<Line> = levels
            .iter()
            .filter(|l| l.system == *sys)
            .map(|l| Line {
                name: format!("{} % full", l.fill_pct),
                points: l
                    .samples
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| (i as f64 + 1.0, v))
                    .collect(),
            })
            .collect();
        let title = format!("{sys}: random 8K overwrites, MiB/s each second");
        draw(format!("series-{sys}"), &|p| {
            plot::draw_lines(&title, "seconds", "MiB/s", &lines, p)
        })?;
    }
    let steady: Vec<Line> = systems
        .iter()
        .map(|sys| Line {
            name: sys.to_string(),
            points: levels
                .iter()
                .filter(|l| l.system == *sys)
                .map(|l| (l.occupancy_pct, l.steady_mib_s))
                .collect(),
        })
        .collect();
    draw("steady".into(), &|p| {
        plot::draw_lines(
            "steady state (mean of the last samples) against occupancy",
            "pool occupancy, %",
            "MiB/s",
            &steady,
            p,
        )
    })?;
    for l in levels {
        if let Some((before, after)) = &l.maps {
            let t = format!("zeta, {} % full, after the fill", l.fill_pct);
            draw(format!("map-zeta-{}-before", l.fill_pct), &|p| {
                plot::draw_map(before, &t, p)
            })?;
            let t = format!("zeta, {} % full, after the overwrites", l.fill_pct);
            draw(format!("map-zeta-{}-after", l.fill_pct), &|p| {
                plot::draw_map(after, &t, p)
            })?;
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_is_the_first_ten_and_steady_the_last_fifty_samples() {
        let mut s: Vec<f64> = vec![100.0; 10];
        s.extend(vec![7.0; 90]);
        s.extend(vec![40.0; 50]);
        assert_eq!(burst_and_steady(&s), (100.0, 40.0));
        // Short runs: the first and last fifth.
        let s = [10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0];
        assert_eq!(burst_and_steady(&s), (5.0, 1.0));
        assert_eq!(burst_and_steady(&[]), (0.0, 0.0));
    }
}
