//! `zeta bench compress`: block compression inside zeta against its references, in one run —
//! the codec crates called directly on the same blocks (speed), the `lz4` and `zstd` tools fed
//! the same blocks and btrfs's `compress=zstd` (ratio), and a volume with compression off
//! (write and read MB/s).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use rand::{RngCore, SeedableRng};
use serde_json::{json, Value};

use crate::args::BenchCompressArgs;
use zeta_core::dsl::{Pool, PoolOptions, TopSpec};
use zeta_core::vdev::{BlockDevice, FileDevice};
use zeta_core::zio::compress::{self, Compressed, Compression, HEADER_BYTES};
use zeta_core::zvol::Volume;
use zeta_server::fmt::{human, parse_size};
use zeta_server::{usage, Error, Result};

const CHUNK: usize = 1 << 20;
/// The block sizes measured: zeta's default volume block and OpenZFS's default record.
const BLOCKS: [usize; 2] = [16 << 10, 128 << 10];
/// The settings the codec and ratio rows measure (zstd is zstd-3, the property's `zstd`).
const CODECS: [Compression; 2] = [Compression::Lz4, Compression::Zstd(3)];

struct DataSet {
    name: &'static str,
    bytes: Vec<u8>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn mbps(bytes: u64, t: Instant) -> f64 {
    bytes as f64 / 1e6 / t.elapsed().as_secs_f64()
}

fn ratio(a: f64, b: f64) -> Value {
    if b > 0.0 {
        json!(a / b)
    } else {
        Value::Null
    }
}

pub fn compress_bench(args: BenchCompressArgs) -> Result<()> {
    let size = parse_size(&args.size)?;
    if size < 4 << 20 || !size.is_multiple_of(CHUNK as u64) {
        return Err(usage(
            "bench size must be a whole number of MiB, at least 4M",
        ));
    }
    if args.runs == 0 {
        return Err(usage("--runs must be at least 1"));
    }
    let dir = args
        .dir
        .join(format!("zeta-bench-compress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let result = run(&dir, size as usize, &args);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run(dir: &Path, size: usize, args: &BenchCompressArgs) -> Result<()> {
    let sets = [
        DataSet {
            name: "random",
            bytes: random(size),
        },
        DataSet {
            name: "usr-tar",
            bytes: corpus(size)?,
        },
    ];
    let mut codecs = Vec::new();
    let mut ratios = Vec::new();
    for set in &sets {
        for bs in BLOCKS {
            let blocks: Vec<&[u8]> = (set.bytes.chunks(bs))
                .filter(|b| b.iter().any(|&x| x != 0))
                .collect();
            for c in CODECS {
                let m = codec_speed(&blocks, bs, c, args.runs)?;
                let logical = (blocks.len() * bs) as f64;
                let cli = cli_bytes(dir, &blocks, c).map(|b| logical / b as f64);
                let stored = logical / m.stored_bytes as f64;
                ratios.push(json!({
                    "data": set.name, "bs": bs, "codec": c.name(),
                    "zeta_stored": stored,
                    "zeta_codec": logical / m.codec_bytes as f64,
                    "cli": cli.clone().map(Value::from).unwrap_or_else(|why| json!({"skipped": why})),
                    "stored_vs_cli": cli.map(|c| stored / c).ok(),
                }));
                codecs.push(json!({
                    "data": set.name, "bs": bs, "codec": c.name(),
                    "compress": {"pipeline_mbps": m.compress.0, "crate_mbps": m.compress.1,
                                 "ratio": ratio(m.compress.0, m.compress.1)},
                    "decompress": {"pipeline_mbps": m.decompress.0, "crate_mbps": m.decompress.1,
                                   "ratio": ratio(m.decompress.0, m.decompress.1),
                                   "blocks": m.compressed_blocks},
                }));
            }
        }
    }
    let btrfs: Vec<Value> = (sets.iter())
        .map(|s| match btrfs_ratio(dir, s) {
            Ok(r) => json!({"data": s.name, "ratio": r}),
            Err(why) => json!({"data": s.name, "skipped": why.to_string()}),
        })
        .collect();
    let (volume, dropped) = volume_rows(dir, &sets, args.runs)?;
    let v = json!({
        "size": size, "runs": args.runs, "page_cache_dropped": dropped,
        "codecs": codecs, "ratios": ratios, "btrfs": btrfs, "volume": volume,
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
    } else {
        print_tables(&v);
    }
    Ok(())
}

fn random(size: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(60);
    let mut v = vec![0u8; size];
    rng.fill_bytes(&mut v);
    v
}

/// The first `size` bytes of a tar of /usr: binaries, libraries and text, on every machine.
fn corpus(size: usize) -> Result<Vec<u8>> {
    let mut child = Command::new("tar")
        .args(["-cf", "-", "-C", "/", "usr"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Error::io(Path::new("tar"), e))?;
    let mut v = Vec::with_capacity(size);
    let out = child.stdout.take().expect("piped");
    out.take(size as u64)
        .read_to_end(&mut v)
        .map_err(|e| Error::io(Path::new("tar"), e))?;
    let _ = child.kill();
    let _ = child.wait();
    if v.len() < size {
        return Err(usage(format!(
            "a tar of /usr holds only {}; give a smaller --size",
            human(v.len() as u64)
        )));
    }
    Ok(v)
}

/// One codec's figures on one set of blocks: (pipeline, crate) MB/s for each direction, and
/// the bytes stored (whole sectors, raw where compression does not save one) and the codec's
/// own output (capped at the block: a block that grows would be stored raw).
struct CodecFigures {
    compress: (f64, f64),
    decompress: (f64, f64),
    compressed_blocks: usize,
    stored_bytes: u64,
    codec_bytes: u64,
}

/// `zio::compress` against the crate it calls, on the same blocks, single core: the pipeline
/// pays its framing, its output bound (a sector less than the block) and, for zstd, early
/// abort; the crate compresses into a buffer of its worst-case bound. Decompression runs over
/// the blocks the pipeline stored compressed, both from the same payload, and checks that
/// every block comes back.
fn codec_speed(blocks: &[&[u8]], bs: usize, c: Compression, runs: usize) -> Result<CodecFigures> {
    let bytes = (blocks.len() * bs) as u64;
    let mut stored: Vec<Option<Compressed>> = Vec::new();
    let mut codec_bytes = 0u64;
    let (mut pc, mut cc, mut pd, mut cd) = (vec![], vec![], vec![], vec![]);
    let mut out = vec![0u8; bs.max(lz4_flex::block::get_maximum_output_size(bs)) + 1024];
    let mut back = vec![0u8; bs];
    let mut zc = zstd::bulk::Compressor::new(3).map_err(|e| usage(format!("zstd: {e}")))?;
    let mut zd = zstd::bulk::Decompressor::new().map_err(|e| usage(format!("zstd: {e}")))?;
    for _ in 0..runs {
        // The last run's blocks are freed before the clock starts: the crate's loop below
        // frees nothing either.
        drop(std::mem::take(&mut stored));
        let t = Instant::now();
        stored = blocks.iter().map(|b| compress::compress(c, b)).collect();
        pc.push(mbps(bytes, t));

        let t = Instant::now();
        let mut sum = 0u64;
        for b in blocks {
            let n = match c {
                Compression::Lz4 => lz4_flex::block::compress_into(b, &mut out)
                    .map_err(|e| usage(format!("lz4: {e}")))?,
                _ => zc
                    .compress_to_buffer(b, &mut out[..])
                    .map_err(|e| usage(format!("zstd: {e}")))?,
            };
            sum += n.min(bs) as u64;
        }
        cc.push(mbps(bytes, t));
        codec_bytes = sum;

        let packed: Vec<(&[u8], &Compressed)> = (blocks.iter().zip(&stored))
            .filter_map(|(b, s)| s.as_ref().map(|s| (*b, s)))
            .collect();
        let dbytes = (packed.len() * bs) as u64;
        let t = Instant::now();
        for (b, s) in &packed {
            compress::decompress(s.codec, &s.bytes, &mut back)
                .map_err(|e| usage(format!("zeta's {} decompress: {e}", c.name())))?;
            if back != *b {
                return Err(usage(format!(
                    "zeta's {} did not round-trip a block",
                    c.name()
                )));
            }
        }
        pd.push(mbps(dbytes, t));
        let t = Instant::now();
        for (b, s) in &packed {
            let len = u32::from_le_bytes(s.bytes[0..4].try_into().expect("4 bytes")) as usize;
            let payload = &s.bytes[HEADER_BYTES..HEADER_BYTES + len];
            match c {
                Compression::Lz4 => {
                    lz4_flex::block::decompress_into(payload, &mut back)
                        .map_err(|e| usage(format!("lz4: {e}")))?;
                }
                _ => {
                    zd.decompress_to_buffer(payload, &mut back)
                        .map_err(|e| usage(format!("zstd: {e}")))?;
                }
            }
            // The same compare as the pipeline's loop, so both pay it.
            if back != *b {
                return Err(usage(format!(
                    "the {} crate did not round-trip a block",
                    c.name()
                )));
            }
        }
        cd.push(mbps(dbytes, t));
    }
    let stored_bytes = (stored.iter())
        .map(|s| s.as_ref().map_or(bs, |s| s.bytes.len()) as u64)
        .sum();
    let compressed_blocks = stored.iter().filter(|s| s.is_some()).count();
    Ok(CodecFigures {
        compress: (median(&mut pc), median(&mut cc)),
        decompress: (median(&mut pd), median(&mut cd)),
        compressed_blocks,
        stored_bytes,
        codec_bytes,
    })
}

/// What `lz4 -1` or `zstd -3` make of the blocks, each a file of its own: the sum of their
/// outputs (each tool's own frame included).
fn cli_bytes(dir: &Path, blocks: &[&[u8]], c: Compression) -> std::result::Result<u64, String> {
    let (tool, level, ext) = match c {
        Compression::Lz4 => ("lz4", "-1", "lz4"),
        _ => ("zstd", "-3", "zst"),
    };
    if Command::new(tool).arg("--version").output().is_err() {
        return Err(format!("{tool} not found (apt-get install {tool})"));
    }
    let at = dir.join("blocks");
    let _ = std::fs::remove_dir_all(&at);
    std::fs::create_dir_all(&at).map_err(|e| e.to_string())?;
    let names: Vec<PathBuf> = (0..blocks.len())
        .map(|i| at.join(format!("{i:06}")))
        .collect();
    for (name, b) in names.iter().zip(blocks) {
        std::fs::write(name, b).map_err(|e| format!("{}: {e}", name.display()))?;
    }
    for batch in names.chunks(2000) {
        let mut cmd = Command::new(tool);
        cmd.args([level, "-q", "-f"]);
        if tool == "lz4" {
            cmd.arg("-m");
        }
        let out = cmd
            .args(batch)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "{tool} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    let mut sum = 0;
    for name in &names {
        let mut packed = name.clone().into_os_string();
        packed.push(format!(".{ext}"));
        sum += std::fs::metadata(&packed)
            .map_err(|e| format!("{}: {e}", Path::new(&packed).display()))?
            .len();
    }
    let _ = std::fs::remove_dir_all(&at);
    Ok(sum)
}

/// Unmounts a loop mount when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn run_cmd(cmd: &mut Command, what: &str) -> std::result::Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// btrfs with `compress=zstd` (zstd-3, on 128K extents) on a loop device: the data set
/// written as one file and synced, its uncompressed bytes over what it takes on the disk as
/// `compsize` counts them.
fn btrfs_ratio(dir: &Path, set: &DataSet) -> std::result::Result<f64, String> {
    // SAFETY: geteuid has no preconditions and only reads the process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (a loop mount)".into());
    }
    for (tool, package) in [
        ("mkfs.btrfs", "btrfs-progs"),
        ("compsize", "btrfs-compsize"),
    ] {
        if Command::new(tool).arg("--help").output().is_err() {
            return Err(format!("{tool} not found (apt-get install {package})"));
        }
    }
    let img = dir.join("btrfs.img");
    let mnt = dir.join("btrfs");
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(set.bytes.len() as u64 * 2 + (512 << 20)))
        .map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
    run_cmd(Command::new("mkfs.btrfs").arg("-f").arg(&img), "mkfs.btrfs")?;
    run_cmd(
        Command::new("mount")
            .args(["-o", "loop,compress=zstd"])
            .arg(&img)
            .arg(&mnt),
        "mount",
    )?;
    let mounted = Mounted(mnt.clone());
    let file = mnt.join(set.name);
    std::fs::write(&file, &set.bytes).map_err(|e| e.to_string())?;
    run_cmd(Command::new("sync").arg("-f").arg(&file), "sync")?;
    let out = run_cmd(Command::new("compsize").arg("-b").arg(&file), "compsize")?;
    drop(mounted);
    let _ = std::fs::remove_file(&img);
    // "TOTAL  PERC  DISK  UNCOMPRESSED  REFERENCED"
    let total = (out.lines())
        .find(|l| l.starts_with("TOTAL"))
        .ok_or_else(|| format!("compsize printed no TOTAL line: {out}"))?;
    let f: Vec<u64> = (total.split_whitespace())
        .filter_map(|w| w.parse().ok())
        .collect();
    match f[..] {
        [disk, uncompressed, ..] if disk > 0 => Ok(uncompressed as f64 / disk as f64),
        _ => Err(format!("compsize's TOTAL line is not what it was: {total}")),
    }
}

/// Drops the host's page cache (root only), so the next read comes from the disk.
fn drop_page_cache() -> bool {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "1").is_ok()
}

/// Each data set through a volume at each block size with compression off, lz4 and zstd:
/// write MB/s (1M writes, then the txg committed) and read MB/s (after an import, from the
/// disk where the page cache could be dropped), the medians of `runs`, and the volume's
/// compressratio. Every run makes a new pool on the same file, written in full first so its
/// blocks are allocated alike for every setting.
fn volume_rows(dir: &Path, sets: &[DataSet], runs: usize) -> Result<(Vec<Value>, bool)> {
    let size = sets[0].bytes.len() as u64;
    let leaf = dir.join("leaf");
    crate::vol::precondition(&leaf, size + size / 4 + (64 << 20))?;
    let mut rows = Vec::new();
    let mut dropped = true;
    for set in sets {
        for bs in BLOCKS {
            let mut off_figures = (0.0, 0.0);
            for c in [Compression::Off, Compression::Lz4, Compression::Zstd(3)] {
                let (mut w, mut r, mut cr) = (vec![], vec![], 0.0);
                for _ in 0..runs {
                    let (wm, rm, ratio, d) = volume_run(&leaf, set, bs, c)?;
                    w.push(wm);
                    r.push(rm);
                    cr = ratio;
                    dropped &= d;
                }
                let (wm, rm) = (median(&mut w), median(&mut r));
                if c == Compression::Off {
                    off_figures = (wm, rm);
                }
                rows.push(json!({
                    "data": set.name, "bs": bs, "compression": c.name(),
                    "write_mbps": wm, "read_mbps": rm, "compressratio": cr,
                    "write_vs_off": ratio(wm, off_figures.0), "read_vs_off": ratio(rm, off_figures.1),
                }));
            }
        }
    }
    Ok((rows, dropped))
}

fn volume_run(
    leaf: &Path,
    set: &DataSet,
    bs: usize,
    c: Compression,
) -> Result<(f64, f64, f64, bool)> {
    let open = || -> Result<Vec<(Arc<dyn BlockDevice>, String)>> {
        let dev = FileDevice::open(leaf)?;
        Ok(vec![(
            Arc::new(dev) as Arc<dyn BlockDevice>,
            leaf.display().to_string(),
        )])
    };
    let size = set.bytes.len() as u64;
    let opts = PoolOptions {
        force: true,
        ..Default::default()
    };
    let pool = Pool::create("cbench", vec![TopSpec::stripe(open()?.remove(0))], opts)?;
    pool.create_volume("v", size, bs as u32, None)?;
    pool.set_compression("v", c)?;
    let vol = Volume::open(&pool, "v")?;
    let t = Instant::now();
    for (i, chunk) in set.bytes.chunks(CHUNK).enumerate() {
        vol.write((i * CHUNK) as u64, chunk)?;
    }
    pool.sync_now()?;
    let write = mbps(size, t);
    let sizes = pool.dataset("v")?.object.sizes();
    let cr = sizes.logical as f64 / sizes.physical.max(1) as f64;
    drop(vol);
    pool.close()?;
    drop(pool);

    let dropped = drop_page_cache();
    let pool = Pool::import(open()?, Some("cbench"), PoolOptions::default())?;
    let vol = Volume::open(&pool, "v")?;
    let mut back = vec![0u8; set.bytes.len()];
    let t = Instant::now();
    for (i, chunk) in back.chunks_mut(CHUNK).enumerate() {
        vol.read((i * CHUNK) as u64, chunk)?;
    }
    let read = mbps(size, t);
    if back != set.bytes {
        return Err(usage(format!(
            "the {} volume with compression={} read back other bytes than were written",
            set.name,
            c.name()
        )));
    }
    drop(vol);
    pool.close()?;
    Ok((write, read, cr, dropped))
}

fn f(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.2}"))
}

fn print_tables(v: &Value) {
    let size = human(v["size"].as_u64().unwrap_or(0));
    println!(
        "zeta bench compress: {size} of each data set, median of {} runs, single core",
        v["runs"]
    );
    println!("\ncodec speed, MB/s (zio::compress against the crate it calls, same blocks)");
    println!(
        "{:<8} {:>5} {:<6} {:>10} {:>10} {:>6}   {:>10} {:>10} {:>6}",
        "data", "bs", "codec", "comp zeta", "comp crate", "ratio", "dec zeta", "dec crate", "ratio"
    );
    for r in v["codecs"].as_array().into_iter().flatten() {
        println!(
            "{:<8} {:>5} {:<6} {:>10.0} {:>10.0} {:>6}   {:>10.0} {:>10.0} {:>6}",
            r["data"].as_str().unwrap_or(""),
            human(r["bs"].as_u64().unwrap_or(0)),
            r["codec"].as_str().unwrap_or(""),
            r["compress"]["pipeline_mbps"].as_f64().unwrap_or(0.0),
            r["compress"]["crate_mbps"].as_f64().unwrap_or(0.0),
            f(&r["compress"]["ratio"]),
            r["decompress"]["pipeline_mbps"].as_f64().unwrap_or(0.0),
            r["decompress"]["crate_mbps"].as_f64().unwrap_or(0.0),
            f(&r["decompress"]["ratio"]),
        );
    }
    println!("\ncompression ratio (logical / stored; zeros left out)");
    println!(
        "{:<8} {:>5} {:<6} {:>11} {:>11} {:>9} {:>8}",
        "data", "bs", "codec", "zeta stored", "zeta codec", "cli", "vs cli"
    );
    for r in v["ratios"].as_array().into_iter().flatten() {
        let cli = if r["cli"].is_number() {
            f(&r["cli"])
        } else {
            "skipped".into()
        };
        println!(
            "{:<8} {:>5} {:<6} {:>11} {:>11} {:>9} {:>8}",
            r["data"].as_str().unwrap_or(""),
            human(r["bs"].as_u64().unwrap_or(0)),
            r["codec"].as_str().unwrap_or(""),
            f(&r["zeta_stored"]),
            f(&r["zeta_codec"]),
            cli,
            f(&r["stored_vs_cli"]),
        );
    }
    for r in v["btrfs"].as_array().into_iter().flatten() {
        match r["ratio"].as_f64() {
            Some(x) => println!(
                "btrfs compress=zstd, {}: {x:.2}",
                r["data"].as_str().unwrap_or("")
            ),
            None => println!("btrfs: skipped ({})", r["skipped"].as_str().unwrap_or("")),
        }
    }
    for r in v["ratios"].as_array().into_iter().flatten() {
        if let Some(why) = r["cli"]["skipped"].as_str() {
            println!("{}: cli skipped ({why})", r["codec"].as_str().unwrap_or(""));
        }
    }
    println!(
        "\nvolume MB/s, one-file pool (read after import{})",
        if v["page_cache_dropped"] == true {
            ", page cache dropped"
        } else {
            "; the page cache could not be dropped (not root)"
        }
    );
    println!(
        "{:<8} {:>5} {:<6} {:>8} {:>7} {:>8} {:>7} {:>7}",
        "data", "bs", "comp", "write", "vs off", "read", "vs off", "ratio"
    );
    for r in v["volume"].as_array().into_iter().flatten() {
        println!(
            "{:<8} {:>5} {:<6} {:>8.0} {:>7} {:>8.0} {:>7} {:>7}",
            r["data"].as_str().unwrap_or(""),
            human(r["bs"].as_u64().unwrap_or(0)),
            r["compression"].as_str().unwrap_or(""),
            r["write_mbps"].as_f64().unwrap_or(0.0),
            f(&r["write_vs_off"]),
            r["read_mbps"].as_f64().unwrap_or(0.0),
            f(&r["read_vs_off"]),
            f(&r["compressratio"]),
        );
    }
}
