//! `zeta bench rados`: seed 003's table on one Ceph cluster. A zeta volume on a pool whose one
//! device is a RADOS device (at each object size), served over NBD and driven by fio's nbd
//! engine, against an RBD image of the same size on the same cluster driven by fio's rbd
//! engine (librbd): sequential and random reads and writes at each block size, queue depth
//! 32, IOPS, mean and p99 latency, and the zeta/librbd ratio; then random 4K writes with an
//! fsync every 5 writes.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde_json::{json, Value};

use crate::args::BenchRadosArgs;
use crate::sync::procs::{last_line, wait_accepting, ChildGuard, WorkDir};
use crate::sync::zeta::{run_zeta, served_addr, zeta};
use zeta_server::fmt::{human, parse_size};
use zeta_server::{usage, Result};

/// The access patterns of the seed's table, in its order.
const PATTERNS: [&str; 4] = ["write", "randwrite", "read", "randread"];

/// What fio measured of one job.
#[derive(Clone, Copy, Debug)]
struct Stats {
    iops: f64,
    mean_us: f64,
    p99_us: f64,
}

impl Stats {
    fn json(&self) -> Value {
        json!({"iops": self.iops, "lat_mean_us": self.mean_us, "lat_p99_us": self.p99_us})
    }
}

/// One measured point: the pattern, the block size and whether it fsyncs every 5 writes.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Point {
    rw: &'static str,
    bs: u64,
    iodepth: u32,
    fsync_every: Option<u32>,
}

impl Point {
    fn label(&self) -> String {
        match self.fsync_every {
            Some(n) => format!("{} {} fsync/{n}", self.rw, human(self.bs)),
            None => format!("{} {}", self.rw, human(self.bs)),
        }
    }
}

/// How fio reaches the device under test.
enum Target {
    Rbd { pool: String, image: String },
    Nbd { uri: String },
}

impl Target {
    fn engine_args(&self) -> Vec<String> {
        match self {
            Target::Rbd { pool, image } => vec![
                "--ioengine=rbd".into(),
                "--clientname=admin".into(),
                format!("--pool={pool}"),
                format!("--rbdname={image}"),
            ],
            Target::Nbd { uri } => vec!["--ioengine=nbd".into(), format!("--uri={uri}")],
        }
    }
}

pub fn rados_bench(args: BenchRadosArgs) -> Result<()> {
    let size = parse_size(&args.size)?;
    if size < 64 << 20 || size % (1 << 20) != 0 {
        return Err(usage("--size must be a whole number of MiB, at least 64M"));
    }
    let object_sizes = list_of_sizes(&args.object_sizes, "--object-sizes")?;
    let block_sizes = list_of_sizes(&args.block_sizes, "--block-sizes")?;
    if args.runtime == 0 {
        return Err(usage("--runtime must be at least 1 second"));
    }
    check_tools()?;
    let cluster = zeta_rados::Cluster::get().map_err(|e| usage(e.to_string()))?;
    cluster
        .create_pool(&args.ceph_pool)
        .map_err(|e| usage(e.to_string()))?;
    let dir = WorkDir::create(
        &args
            .dir
            .join(format!("zeta-bench-rados-{}", std::process::id())),
    )?;
    let result = bench_in(&dir.0, size, &object_sizes, &block_sizes, &args);
    let _ = std::fs::remove_dir_all(&dir.0);
    result
}

fn list_of_sizes(s: &str, what: &str) -> Result<Vec<u64>> {
    let v: Vec<u64> = s
        .split(',')
        .map(|w| parse_size(w.trim()))
        .collect::<Result<_>>()?;
    if v.is_empty() {
        return Err(usage(format!("{what} names no size")));
    }
    Ok(v)
}

/// fio with the rbd and nbd engines, and the rbd tool.
fn check_tools() -> Result<()> {
    let engines = Command::new("fio")
        .arg("--enghelp")
        .output()
        .map_err(|_| usage("fio is not installed (apt-get install fio)"))?;
    let list = String::from_utf8_lossy(&engines.stdout);
    for e in ["rbd", "nbd"] {
        if !list.lines().any(|l| l.trim() == e) {
            return Err(usage(format!(
                "this fio has no {e} engine (Debian's fio package has both)"
            )));
        }
    }
    Command::new("rbd")
        .arg("--version")
        .output()
        .map_err(|_| usage("the rbd tool is not installed (apt-get install ceph-common)"))?;
    Ok(())
}

fn points(block_sizes: &[u64]) -> Vec<Point> {
    let mut v = Vec::new();
    for rw in PATTERNS {
        for &bs in block_sizes {
            v.push(Point {
                rw,
                bs,
                iodepth: 32,
                fsync_every: None,
            });
        }
    }
    v.push(Point {
        rw: "randwrite",
        bs: 4096,
        iodepth: 32,
        fsync_every: Some(5),
    });
    v
}

fn bench_in(
    dir: &Path,
    size: u64,
    object_sizes: &[u64],
    block_sizes: &[u64],
    args: &BenchRadosArgs,
) -> Result<()> {
    let points = points(block_sizes);
    let tag = format!("{:08x}", rand::random::<u32>());
    let mut columns: Vec<(String, Vec<Stats>)> = Vec::new();

    // librbd: an image of 4M objects (rbd's default), written whole before measuring.
    let image = format!("zbench-{tag}");
    rbd(&[
        "create",
        "--size",
        &format!("{}M", size >> 20),
        "-p",
        &args.ceph_pool,
        &image,
    ])?;
    let rbd_target = Target::Rbd {
        pool: args.ceph_pool.clone(),
        image: image.clone(),
    };
    let measured = (|| -> Result<Vec<Stats>> {
        eprintln!("[librbd] filling the {} image", human(size));
        fill(&rbd_target, dir, size)?;
        measure_all(&rbd_target, dir, &points, args, "librbd")
    })();
    let _ = rbd(&["rm", "--no-progress", "-p", &args.ceph_pool, &image]);
    columns.push(("librbd 4M".into(), measured?));

    for &os in object_sizes {
        let label = format!("zeta {}", human(os));
        let stats = zeta_column(dir, size, os, &tag, &points, args, &label)?;
        columns.push((label, stats));
    }
    report(&points, &columns, size, args)
}

fn rbd(words: &[&str]) -> Result<()> {
    let out = Command::new("rbd")
        .args(words)
        .output()
        .map_err(|e| usage(format!("rbd: {e}")))?;
    if !out.status.success() {
        return Err(usage(format!(
            "rbd {}: {}",
            words.join(" "),
            last_line(&String::from_utf8_lossy(&out.stderr))
        )));
    }
    Ok(())
}

/// One column of zeta: a pool on one RADOS device of `object_size` objects, a volume of
/// `size` written whole, served over NBD, each point measured; then everything removed.
fn zeta_column(
    dir: &Path,
    size: u64,
    object_size: u64,
    tag: &str,
    points: &[Point],
    args: &BenchRadosArgs,
    label: &str,
) -> Result<Vec<Stats>> {
    let home = dir.join(format!("h{}", object_size >> 20));
    std::fs::create_dir_all(&home).map_err(|e| zeta_server::Error::io(&home, e))?;
    let pool = format!("zb{}m{tag}", object_size >> 20);
    let dev = format!("rados:{}/{pool}", args.ceph_pool);
    // Room beside the volume for the copies a copy-on-write pool writes before it frees.
    let leaf = size * 2 + (256 << 20);
    let s = |v: &str| v.to_string();
    run_zeta(
        &home,
        &[
            s("pool"),
            s("create"),
            s("-o"),
            format!("size={leaf}"),
            s("-o"),
            format!("object_size={object_size}"),
            pool.clone(),
            dev.clone(),
        ],
        "pool create",
    )?;
    let result = (|| -> Result<Vec<Stats>> {
        run_zeta(
            &home,
            &[s("vol"), s("create"), format!("{pool}/v"), size.to_string()],
            "vol create",
        )?;
        let log = home.join("serve.log");
        let mut cmd = zeta(&home)?;
        cmd.args(["serve", "--listen", "127.0.0.1:0", &pool]);
        let mut server = ChildGuard::spawn(&mut cmd, "zeta serve", log.clone())?;
        let stop = AtomicBool::new(false);
        let t = std::time::Instant::now();
        let addr = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(a) = served_addr(&text) {
                break a;
            }
            if let Some(st) = server.exited()? {
                return Err(usage(format!(
                    "zeta serve exited ({st}): {}",
                    last_line(&text)
                )));
            }
            if t.elapsed() > Duration::from_secs(60) {
                return Err(usage("zeta serve did not start within 60 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        wait_accepting(&mut server, addr, &stop)?;
        let target = Target::Nbd {
            uri: format!("nbd://{addr}/{pool}/v"),
        };
        eprintln!("[{label}] filling the {} volume", human(size));
        fill(&target, dir, size)?;
        let stats = measure_all(&target, dir, points, args, label);
        drop(server);
        stats
    })();
    let _ = run_zeta(
        &home,
        &[s("pool"), s("destroy"), pool.clone()],
        "pool destroy",
    );
    if let Ok(spec) = zeta_rados::Spec::parse(&dev) {
        let _ = zeta_rados::RadosDevice::remove(&spec);
    }
    result
}

/// Writes the whole device once, sequentially in 1M requests (so reads read data and writes
/// overwrite, as in the seed's runs).
fn fill(target: &Target, dir: &Path, size: u64) -> Result<()> {
    let mut a = target.engine_args();
    a.extend([
        "--name=fill".into(),
        "--rw=write".into(),
        "--bs=1M".into(),
        "--iodepth=16".into(),
        format!("--size={size}"),
        "--output-format=json".into(),
    ]);
    fio(&a, dir, "write").map(|_| ())
}

fn measure_all(
    target: &Target,
    dir: &Path,
    points: &[Point],
    args: &BenchRadosArgs,
    label: &str,
) -> Result<Vec<Stats>> {
    points
        .iter()
        .map(|p| {
            let mut a = target.engine_args();
            a.extend([
                "--name=point".into(),
                format!("--rw={}", p.rw),
                format!("--bs={}", p.bs),
                format!("--iodepth={}", p.iodepth),
                "--time_based".into(),
                format!("--runtime={}", args.runtime),
                "--ramp_time=1".into(),
                "--lat_percentiles=1".into(),
                "--randrepeat=0".into(),
                "--output-format=json".into(),
            ]);
            if let Some(n) = p.fsync_every {
                a.push(format!("--fsync={n}"));
            }
            let dir_kind = if p.rw.contains("read") {
                "read"
            } else {
                "write"
            };
            let st = fio(&a, dir, dir_kind)?;
            eprintln!(
                "[{label}] {:<24} {:>9.0} IOPS  mean {:>8.0} us  p99 {:>8.0} us",
                p.label(),
                st.iops,
                st.mean_us,
                st.p99_us
            );
            Ok(st)
        })
        .collect()
}

/// Runs fio with `args` and gives the `kind` ("read" or "write") figures of its one job.
fn fio(args: &[String], dir: &Path, kind: &str) -> Result<Stats> {
    let out = Command::new("fio")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| usage(format!("fio: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(usage(format!(
            "fio failed ({}): {}",
            out.status,
            last_line(&String::from_utf8_lossy(&out.stderr))
        )));
    }
    parse(&text, kind)
}

fn parse(text: &str, kind: &str) -> Result<Stats> {
    let start = text
        .find('{')
        .ok_or_else(|| usage(format!("fio printed no JSON: {}", last_line(text))))?;
    let v: Value = serde_json::Deserializer::from_str(&text[start..])
        .into_iter::<Value>()
        .next()
        .ok_or_else(|| usage("fio printed no JSON"))?
        .map_err(|e| usage(format!("fio's JSON does not parse: {e}")))?;
    let job = &v["jobs"][0];
    if job["error"].as_u64() != Some(0) {
        return Err(usage(format!("fio reported error {}", job["error"])));
    }
    let side = &job[kind];
    let iops = side["iops"]
        .as_f64()
        .ok_or_else(|| usage(format!("fio's JSON has no {kind} IOPS")))?;
    let lat = &side["lat_ns"];
    Ok(Stats {
        iops,
        mean_us: lat["mean"].as_f64().unwrap_or(f64::NAN) / 1e3,
        p99_us: lat["percentile"]["99.000000"].as_f64().unwrap_or(f64::NAN) / 1e3,
    })
}

fn report(
    points: &[Point],
    columns: &[(String, Vec<Stats>)],
    size: u64,
    args: &BenchRadosArgs,
) -> Result<()> {
    let rbd = &columns[0].1;
    let zeta_cols = &columns[1..];
    if args.json {
        let rows: Vec<Value> = points
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let zetas: Vec<Value> = zeta_cols
                    .iter()
                    .map(|(l, s)| {
                        json!({"column": l, "stats": s[i].json(),
                               "ratio_iops": s[i].iops / rbd[i].iops})
                    })
                    .collect();
                json!({"rw": p.rw, "block_bytes": p.bs, "iodepth": p.iodepth,
                       "fsync_every": p.fsync_every, "librbd": rbd[i].json(), "zeta": zetas})
            })
            .collect();
        let v = json!({"size_bytes": size, "runtime_s": args.runtime,
                       "ceph_pool": args.ceph_pool, "rows": rows});
        println!("{}", serde_json::to_string_pretty(&v).expect("JSON"));
        return Ok(());
    }
    println!(
        "zeta bench rados: volume and image of {}, queue depth 32, {} s a point, Ceph pool '{}'",
        human(size),
        args.runtime,
        args.ceph_pool
    );
    print!("{:<24} {:>16}", "point", "librbd IOPS/p99");
    for (l, _) in zeta_cols {
        print!(" {:>26}", format!("{l} IOPS/p99 (x)"));
    }
    println!();
    for (i, p) in points.iter().enumerate() {
        print!(
            "{:<24} {:>16}",
            p.label(),
            format!("{:.0}/{:.1}ms", rbd[i].iops, rbd[i].p99_us / 1e3)
        );
        for (_, s) in zeta_cols {
            print!(
                " {:>26}",
                format!(
                    "{:.0}/{:.1}ms ({:.2})",
                    s[i].iops,
                    s[i].p99_us / 1e3,
                    s[i].iops / rbd[i].iops
                )
            );
        }
        println!();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fio_json_gives_the_side_asked_for() {
        let text = "note: nbd engine\n{\"jobs\":[{\"error\":0,\
            \"read\":{\"iops\":1200.5,\"lat_ns\":{\"mean\":26000,\"percentile\":{\"99.000000\":81000}}},\
            \"write\":{\"iops\":0,\"lat_ns\":{\"mean\":0}}}]}";
        let r = parse(text, "read").unwrap();
        assert_eq!(r.iops, 1200.5);
        assert_eq!(r.mean_us, 26.0);
        assert_eq!(r.p99_us, 81.0);
        assert!(parse("{\"jobs\":[{\"error\":5}]}", "read").is_err());
        assert!(parse("nothing", "read").is_err());
    }

    #[test]
    fn the_table_has_every_pattern_at_every_size_and_the_sync_row() {
        let p = points(&[4096, 131072]);
        assert_eq!(p.len(), PATTERNS.len() * 2 + 1);
        assert_eq!(p.last().unwrap().fsync_every, Some(5));
        assert!(p.iter().all(|x| x.iodepth == 32));
    }
}
