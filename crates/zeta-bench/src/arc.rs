//! `zeta bench arc`: the block cache (the ARC of `dmu::arc`, as the pool runs it: sharded,
//! counted in bytes) against a least-recently-used cache of the same size, fed the same
//! requests for 16K blocks, in one run: a hot set of half the cache read over and over while
//! a scan of four times the cache runs through, and a Zipf(0.9) workload.

use std::sync::Arc;
use std::time::Instant;

use lru::LruCache;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::args::BenchArcArgs;
use zeta_core::dmu::BlockCache;
use zeta_core::spa::{BlkPtr, Dva};
use zeta_server::fmt::{human, parse_size};
use zeta_server::{usage, Result};

const BLOCK: u64 = 16 << 10;
/// Rounds of the hot-set workload (`hot_and_scan`).
const ROUNDS: u64 = 4;

fn bp(block: u64) -> BlkPtr {
    let mut bp = BlkPtr::HOLE;
    bp.dva[0] = Dva::new(0, block * BLOCK, BLOCK as u32);
    bp.birth_txg = 1.into();
    bp.lsize = (BLOCK as u32).into();
    bp.psize = (BLOCK as u32).into();
    bp
}

/// Hits of `requests` against the block cache (ARC) and an LRU of `cache` bytes; requests
/// before `warm` fill the caches and are not counted.
fn replay(cache: u64, requests: &[u64], warm: usize) -> (u64, u64) {
    let arc = BlockCache::new(cache);
    let data = Arc::new(vec![0u8; BLOCK as usize]);
    let mut lru: LruCache<u64, ()> = LruCache::unbounded();
    let capacity = (cache / BLOCK) as usize;
    let (mut arc_hits, mut lru_hits) = (0, 0);
    for (i, &b) in requests.iter().enumerate() {
        let p = bp(b);
        let a = arc.get(&p).is_some();
        if !a {
            arc.insert(&p, data.clone());
        }
        let l = lru.get(&b).is_some();
        if !l {
            lru.put(b, ());
            if lru.len() > capacity {
                lru.pop_lru();
            }
        }
        if i >= warm {
            arc_hits += a as u64;
            lru_hits += l as u64;
        }
    }
    (arc_hits, lru_hits)
}

/// Rounds of work on a hot set of half the cache while a scan runs: each round reads the hot
/// set twice, each time in a new random order, then the next cache's worth of a scan that
/// reads every block once; four rounds, so the scan covers four times the cache. An LRU
/// keeps the hot set from the first of a round's passes to the second and loses it to the
/// scan every round; an ARC keeps it in T2 and lets the scan pass through T1.
fn hot_and_scan(blocks: u64, seed: u64) -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let hot = blocks / 2;
    let mut next = 1 << 40;
    let mut v = Vec::new();
    for _ in 0..ROUNDS {
        for _ in 0..2 {
            let mut order: Vec<u64> = (0..hot).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.gen_range(0..=i));
            }
            v.extend(order);
        }
        for _ in 0..blocks {
            v.push(next);
            next += 1;
        }
    }
    v
}

/// `n` requests drawn from a Zipf(`s`) distribution over `items` blocks (block 0 the most
/// popular), by inverting its cumulative weights.
fn zipf(items: u64, s: f64, n: usize, seed: u64) -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut cdf = Vec::with_capacity(items as usize);
    let mut sum = 0.0;
    for k in 1..=items {
        sum += 1.0 / (k as f64).powf(s);
        cdf.push(sum);
    }
    // Popular blocks spread over the volume, not all at its start.
    let spread = |k: u64| (k.wrapping_mul(0x9e37_79b9) ^ (k >> 7)) % (items * 16);
    (0..n)
        .map(|_| {
            let x = rng.gen::<f64>() * sum;
            spread(cdf.partition_point(|&c| c < x) as u64)
        })
        .collect()
}

pub fn arc_bench(args: BenchArcArgs) -> Result<()> {
    let cache = parse_size(&args.cache)?;
    if cache < 64 * BLOCK * 16 {
        return Err(usage("--cache must be at least 16M"));
    }
    if args.runs == 0 {
        return Err(usage("--runs must be at least 1"));
    }
    let blocks = cache / BLOCK;
    let mut rows = Vec::new();
    let t = Instant::now();
    for (name, requests, warm, hot_only) in [
        (
            "hot+scan",
            hot_and_scan(blocks, 1),
            // The first round only fills the caches.
            (2 * blocks) as usize,
            true,
        ),
        (
            "zipf-0.9",
            zipf(blocks * 4, 0.9, blocks as usize * 40, 2),
            blocks as usize * 8,
            false,
        ),
    ] {
        let mut ratios = Vec::new();
        for run in 0..args.runs {
            let reqs = if run == 0 {
                requests.clone()
            } else if hot_only {
                hot_and_scan(blocks, 1 + run as u64)
            } else {
                zipf(blocks * 4, 0.9, blocks as usize * 40, 2 + run as u64)
            };
            let (a, l) = replay(cache, &reqs, warm);
            ratios.push((a, l, (reqs.len() - warm) as u64));
        }
        ratios.sort_by_key(|r| r.0);
        let (a, l, n) = ratios[ratios.len() / 2];
        let (ah, lh) = (a as f64 / n as f64, l as f64 / n as f64);
        rows.push(json!({
            "workload": name, "requests": n, "arc_hit_ratio": ah, "lru_hit_ratio": lh,
            "ratio": if lh > 0.0 { json!(ah / lh) } else { Value::Null },
        }));
    }
    let v = json!({"cache_bytes": cache, "block_bytes": BLOCK, "runs": args.runs,
                   "seconds": t.elapsed().as_secs_f64(), "rows": rows});
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
        return Ok(());
    }
    println!(
        "zeta bench arc: the block cache (ARC) against an LRU, both {} of 16K blocks, same requests, median of {} runs",
        human(cache),
        args.runs
    );
    println!(
        "{:<10} {:>10} {:>8} {:>8} {:>7}",
        "workload", "requests", "ARC", "LRU", "ratio"
    );
    for r in &rows {
        println!(
            "{:<10} {:>10} {:>7.1}% {:>7.1}% {:>7}",
            r["workload"].as_str().unwrap_or(""),
            r["requests"].as_u64().unwrap_or(0),
            100.0 * r["arc_hit_ratio"].as_f64().unwrap_or(0.0),
            100.0 * r["lru_hit_ratio"].as_f64().unwrap_or(0.0),
            r["ratio"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.2}")),
        );
    }
    println!(
        "hot+scan: 4 rounds of a hot set of half the cache read twice, then a cache's worth of a scan (4x the cache in all; the first round not counted); zipf-0.9: 40x the cache's blocks in requests over 4x the cache's blocks (the first fifth not counted)"
    );
    Ok(())
}
