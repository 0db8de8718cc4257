//! `zeta pool …`

use serde_json::json;

use super::args::PoolCmd;
use super::{usage, Result};
use crate::dsl::{Pool, Suspension};
use zeta_server::fmt::human;
use zeta_server::state::Home;

mod create;
mod devices;
mod import;
mod scan;

pub use create::*;
pub use devices::*;
use import::*;
use scan::*;

pub fn run(home: &Home, cmd: PoolCmd) -> Result<()> {
    match cmd {
        PoolCmd::Create {
            force,
            props,
            pool,
            vdevs,
        } => create(home, force, &props, &pool, &vdevs),
        PoolCmd::Import {
            dirs,
            props,
            force,
            pool,
            new_name,
            json,
            discard_log,
        } => {
            let opts = ImportOpts {
                json,
                discard_log,
                force,
                new_name,
                readonly: import_readonly(&props)?,
            };
            import(home, &dirs, pool.as_deref(), &opts)
        }
        PoolCmd::Export { pool } => {
            let p = home.open(&pool)?;
            p.export()?;
            home.forget(&pool)?;
            println!("exported '{pool}'");
            Ok(())
        }
        PoolCmd::List { json } => list(home, json),
        PoolCmd::Scrub { wait, stop, pool } => scrub(home, &pool, wait, stop),
        PoolCmd::Replace {
            force,
            pool,
            old,
            new,
        } => replace(home, force, &pool, &old, &new),
        PoolCmd::Offline { pool, device } => set_offline(home, &pool, &device, true),
        PoolCmd::Online { pool, device } => set_offline(home, &pool, &device, false),
        PoolCmd::Add {
            force,
            size,
            pool,
            vdevs,
        } => add(home, force, size.as_deref(), &pool, &vdevs),
        PoolCmd::Remove { pool, device } => remove(home, &pool, &device),
        PoolCmd::Clear { pool } => {
            match zeta_server::control::connect(home, &pool) {
                Some(conn) => zeta_server::control::remote_clear(conn, &pool)?,
                None => {
                    let p = home.open(&pool)?;
                    let r = p.clear_errors();
                    p.close()?;
                    r?;
                }
            }
            println!("cleared the error counters of '{pool}'");
            Ok(())
        }
        PoolCmd::Status { pool, json } => status(home, pool.as_deref(), json),
        PoolCmd::Map { pool, output, json } => map(home, &pool, output.as_deref(), json),
        PoolCmd::Iostat { pool, json } => iostat(home, &pool, json),
        PoolCmd::Arcstat {
            pool,
            interval,
            count,
            json,
        } => arcstat(home, &pool, interval, count, json),
        PoolCmd::Sync { pool } => {
            match zeta_server::control::connect(home, &pool) {
                Some(conn) => zeta_server::control::remote_sync(conn, &pool)?,
                None => {
                    let p = home.open(&pool)?;
                    p.sync_frees()?;
                    p.close()?;
                }
            }
            println!("synced '{pool}'");
            Ok(())
        }
        PoolCmd::Labelclear { force, device } => {
            super::guard::labelclear(home, &device, force)?;
            println!("cleared the zeta labels of {}", device.display());
            Ok(())
        }
        PoolCmd::Destroy { force, pool } => {
            if !force {
                return Err(usage(format!(
                    "destroying '{pool}' loses all its data; repeat with -f to confirm"
                )));
            }
            let p = home.open(&pool)?;
            p.close()?;
            p.destroy()?;
            home.forget(&pool)?;
            println!("destroyed '{pool}'");
            Ok(())
        }
    }
}

fn list(home: &Home, json: bool) -> Result<()> {
    let cache = home.load()?;
    let mut rows = Vec::new();
    for name in cache.pools.keys() {
        let row = match pool_status(home, name) {
            Ok(st) => {
                let (size, alloc) = (
                    st["size"].as_u64().unwrap_or(0),
                    st["alloc"].as_u64().unwrap_or(0),
                );
                json!({"name": name, "size": size, "alloc": alloc, "free": st["free"],
                       "freeing": st["freeing"], "fragmentation": st["fragmentation"],
                       "capacity_pct": (alloc * 100).checked_div(size).unwrap_or(0),
                       "usable_size": st["usable"]["size"], "usable_free": st["usable"]["free"],
                       "reserved": st["usable"]["reserved"], "avail": st["usable"]["avail"],
                       "health": st["state"], "readonly": st["readonly"],
                       "logicalused": st["logicalused"], "compressratio": st["compressratio"]})
            }
            Err(e) => json!({"name": name, "health": "UNAVAIL", "error": e.to_string()}),
        };
        rows.push(row);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
        return Ok(());
    }
    println!(
        "{:<16} {:>8} {:>8} {:>8} {:>8} {:>5} {:>5} {:>8} {:>8}  HEALTH",
        "NAME", "SIZE", "ALLOC", "FREE", "FREEING", "FRAG", "CAP", "USABLE", "AVAIL"
    );
    for r in rows {
        let n = |k: &str| r[k].as_u64().map(human).unwrap_or_else(|| "-".into());
        let pct = |k: &str| {
            r[k].as_u64()
                .map(|c| format!("{c}%"))
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "{:<16} {:>8} {:>8} {:>8} {:>8} {:>5} {:>5} {:>8} {:>8}  {}",
            r["name"].as_str().unwrap(),
            n("size"),
            n("alloc"),
            n("free"),
            n("freeing"),
            pct("fragmentation"),
            pct("capacity_pct"),
            n("usable_size"),
            n("avail"),
            health(&r)
        );
    }
    Ok(())
}

/// `zeta pool map`: the metaslab map as a picture, as JSON, or as lines.
fn map(home: &Home, name: &str, output: Option<&std::path::Path>, json: bool) -> Result<()> {
    let m = match zeta_server::control::connect(home, name) {
        Some(conn) => zeta_server::control::remote_map(conn, name)?,
        None => {
            let p = home.open(name)?;
            let m = p.metaslab_map();
            p.close()?;
            m
        }
    };
    if let Some(path) = output {
        zeta_plot::draw_map(&m, &format!("pool '{name}'"), path).map_err(usage)?;
        if !json {
            println!("wrote {}", path.display());
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&m).unwrap());
    } else if output.is_none() {
        print!("{}", map_lines(&m));
    }
    Ok(())
}

/// The map as text: a line per vdev, then the free-segment histogram.
fn map_lines(m: &crate::dsl::PoolMap) -> String {
    use std::fmt::Write;
    let pct = |a: u64, b: u64| (a * 100).checked_div(b).unwrap_or(0);
    let mut out = format!(
        "{} free of {} ({}%), {}% fragmented\n",
        human(m.free),
        human(m.size),
        pct(m.free, m.size),
        m.fragmentation
    );
    for v in &m.vdevs {
        let full = v.metaslabs.iter().filter(|ms| ms.free == 0).count();
        let empty = v.metaslabs.iter().filter(|ms| ms.free == ms.size).count();
        let _ = writeln!(
            out,
            "vdev {}: {} metaslabs ({full} full, {empty} empty), {} free, {}% fragmented",
            v.vdev,
            v.metaslabs.len(),
            human(v.free),
            v.fragmentation
        );
    }
    let _ = writeln!(out, "{:>10} {:>10} {:>10}", "SEGMENT", "COUNT", "BYTES");
    for row in &m.histogram {
        let _ = writeln!(
            out,
            "{:>10} {:>10} {:>10}",
            format!("{}+", human(row.from)),
            row.segments,
            human(row.bytes)
        );
    }
    out
}

/// A pool's state as `pool list` and `pool status` print it: `ONLINE`, `DEGRADED`, … and
/// whether it was imported read-only.
fn health(st: &serde_json::Value) -> String {
    let state = st
        .get("health")
        .or_else(|| st.get("state"))
        .and_then(|s| s.as_str())
        .unwrap_or("?");
    if st["readonly"] == true {
        format!("{state}, read-only")
    } else {
        state.to_string()
    }
}

/// The status of a pool, from the `zeta serve` holding it if one does, else by opening it.
pub(super) fn pool_status(home: &Home, name: &str) -> Result<serde_json::Value> {
    if let Some(conn) = zeta_server::control::connect(home, name) {
        return zeta_server::control::remote_status(conn, name);
    }
    let p = home.open(name)?;
    let st = status_json(&p);
    p.close()?;
    Ok(st)
}

/// The intent log's counters since the pool was opened (`zeta pool iostat --json`).
pub fn iostat_json(p: &Pool) -> serde_json::Value {
    let cfg = p.config();
    let z = p.zil.stats();
    let vdevs: Vec<_> = cfg
        .tops
        .iter()
        .map(|t| {
            let i = t.id as usize;
            let name = match t.children.as_slice() {
                [one] => one.path.clone(),
                _ => format!("{}-{}", t.kind_name(), t.id),
            };
            let at = |v: &[u64]| v.get(i).copied().unwrap_or(0);
            json!({"vdev": t.id, "name": name, "log_device": t.log,
                   "blocks": at(&z.blocks), "bytes": at(&z.bytes)})
        })
        .collect();
    let (mut queued, mut requests) = (0, 0);
    for ds in p.datasets() {
        let (a, r) = ds.log.counts();
        queued += a;
        requests += r;
    }
    let blocks: u64 = z.blocks.iter().sum();
    let (dev_bytes, dev_sizes) = p.device_writes();
    let per = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    json!({"pool": p.name, "txg": p.synced_txg(), "log": {
        "commit": cfg.zil_commit.name(), "placement": cfg.zil_placement.name(),
        "vdevs": vdevs, "records": z.records, "batches": z.batches, "flushes": z.flushes,
        "batch_latency_mean_us": per(z.batch_nanos, z.batches) / 1000.0,
        "records_per_block": per(z.records, blocks), "records_per_batch": per(z.records, z.batches),
        "fallback_syncs": z.fallback_syncs, "space_waits": z.space_waits, "bulk_syncs": z.bulk_syncs, "records_in_place": z.in_place, "sync_requests": requests, "records_queued": queued,
        "space_used": z.space_used, "space_total": z.space_total},
        "device_writes": {"bytes": dev_bytes, "by_size": dev_sizes.iter()
            .map(|&(from, writes)| json!({"from": from, "writes": writes})).collect::<Vec<_>>()}})
}

/// The block cache's counters and lists (`zeta pool arcstat --json`).
pub fn arcstat_json(p: &Pool) -> serde_json::Value {
    let s = p.cache_stats();
    let l = s.lists;
    let f = p.prefetch_stats();
    json!({"pool": p.name, "hits": s.hits, "misses": s.misses, "prefetch_hits": s.prefetch_hits,
           "prefetch": p.prefetch_enabled(), "prefetch_asked": f.asked,
           "prefetch_dropped": f.dropped, "prefetch_blocks": f.blocks,
           "ghost_hits_b1": s.ghost_hits_b1, "ghost_hits_b2": s.ghost_hits_b2,
           "t1": l.t1, "t2": l.t2, "b1": l.b1, "b2": l.b2, "p": l.p, "c": l.c,
           "ghost_entries": s.ghost_entries, "compressed_bytes": s.compressed_bytes,
           "compressed_logical_bytes": s.compressed_logical_bytes})
}

fn arcstat(
    home: &Home,
    name: &str,
    interval: Option<f64>,
    count: Option<u64>,
    json: bool,
) -> Result<()> {
    if interval.is_some_and(|i| !(i.is_finite() && i > 0.0)) {
        return Err(usage("INTERVAL must be a number of seconds above 0"));
    }
    if count.is_some() && interval.is_none() {
        return Err(usage("COUNT needs an INTERVAL"));
    }
    // A served pool is asked each time; one that is not is opened once and kept open.
    let local = match zeta_server::control::connect(home, name) {
        Some(_) => None,
        None => Some(home.open(name)?),
    };
    let sample = || -> Result<serde_json::Value> {
        match &local {
            Some(p) => Ok(arcstat_json(p)),
            None => match zeta_server::control::connect(home, name) {
                Some(conn) => zeta_server::control::remote_arcstat(conn, name),
                None => Err(usage(format!("pool '{name}': its server went away"))),
            },
        }
    };
    let result = (|| -> Result<()> {
        let Some(secs) = interval else {
            let st = sample()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&st).unwrap());
            } else {
                print_arc_report(&st);
            }
            return Ok(());
        };
        let mut last = sample()?;
        if !json {
            println!(
                "{:>8} {:>8} {:>5} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}",
                "hits/s",
                "miss/s",
                "hit%",
                "pref/s",
                "ghost/s",
                "size",
                "c",
                "t1",
                "t2",
                "b1",
                "b2"
            );
        }
        let mut printed = 0;
        while count.is_none_or(|c| printed < c) {
            std::thread::sleep(std::time::Duration::from_secs_f64(secs));
            let now = sample()?;
            let d = |k: &str| {
                now[k]
                    .as_u64()
                    .unwrap_or(0)
                    .saturating_sub(last[k].as_u64().unwrap_or(0))
            };
            let (h, m) = (d("hits"), d("misses"));
            if json {
                let mut line = now.clone();
                line["interval_hits"] = json!(h);
                line["interval_misses"] = json!(m);
                println!("{line}");
            } else {
                let n = |k: &str| now[k].as_u64().unwrap_or(0);
                let rate = |x: u64| format!("{:.0}", x as f64 / secs);
                let pct = if h + m == 0 {
                    "-".into()
                } else {
                    format!("{:.0}", 100.0 * h as f64 / (h + m) as f64)
                };
                println!(
                    "{:>8} {:>8} {:>5} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}",
                    rate(h),
                    rate(m),
                    pct,
                    rate(d("prefetch_hits")),
                    rate(d("ghost_hits_b1") + d("ghost_hits_b2")),
                    human(n("t1") + n("t2")),
                    human(n("c")),
                    human(n("t1")),
                    human(n("t2")),
                    human(n("b1")),
                    human(n("b2"))
                );
            }
            last = now;
            printed += 1;
        }
        Ok(())
    })();
    if let Some(p) = local {
        p.close()?;
    }
    result
}

fn print_arc_report(st: &serde_json::Value) {
    let n = |k: &str| st[k].as_u64().unwrap_or(0);
    let (h, m) = (n("hits"), n("misses"));
    let pct = if h + m == 0 {
        0.0
    } else {
        100.0 * h as f64 / (h + m) as f64
    };
    println!(
        "pool {}: block cache (ARC) since the pool was opened",
        st["pool"].as_str().unwrap_or("?")
    );
    println!(
        "  hits {h}, misses {m} ({pct:.1} % hits), prefetch hits {}, ghost hits {} (B1) {} (B2)",
        n("prefetch_hits"),
        n("ghost_hits_b1"),
        n("ghost_hits_b2")
    );
    if st["prefetch"].as_bool().unwrap_or(false) {
        println!(
            "  prefetch: {} blocks read ahead in {} stretches ({} dropped, the queue full)",
            n("prefetch_blocks"),
            n("prefetch_asked"),
            n("prefetch_dropped")
        );
    } else {
        println!("  prefetch: off");
    }
    println!(
        "  size {} of {}: T1 {} (target {}), T2 {}; ghosts B1 {}, B2 {} ({} entries)",
        human(n("t1") + n("t2")),
        human(n("c")),
        human(n("t1")),
        human(n("p")),
        human(n("t2")),
        human(n("b1")),
        human(n("b2")),
        n("ghost_entries")
    );
    let (cb, cl) = (n("compressed_bytes"), n("compressed_logical_bytes"));
    if cb > 0 {
        println!(
            "  kept compressed: {} holding {} ({:.2}x)",
            human(cb),
            human(cl),
            cl as f64 / cb as f64
        );
    } else {
        println!("  kept compressed: none");
    }
}

fn iostat(home: &Home, name: &str, json: bool) -> Result<()> {
    let st = match zeta_server::control::connect(home, name) {
        Some(conn) => zeta_server::control::remote_iostat(conn, name)?,
        None => {
            let p = home.open(name)?;
            let st = iostat_json(&p);
            p.close()?;
            st
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&st).unwrap());
        return Ok(());
    }
    let l = &st["log"];
    let n = |k: &str| l[k].as_u64().unwrap_or(0);
    let f = |k: &str| l[k].as_f64().unwrap_or(0.0);
    println!(
        "pool {}: intent log zil.commit={} zil.placement={}, log space {} of {} in use",
        st["pool"].as_str().unwrap_or("?"),
        l["commit"].as_str().unwrap_or("?"),
        l["placement"].as_str().unwrap_or("?"),
        human(n("space_used")),
        human(n("space_total"))
    );
    println!(
        "  {:<5} {:<40} {:>12} {:>10}",
        "vdev", "device", "log blocks", "log bytes"
    );
    for v in l["vdevs"].as_array().into_iter().flatten() {
        println!(
            "  {:<5} {:<40} {:>12} {:>10}",
            v["vdev"],
            v["name"].as_str().unwrap_or("?"),
            v["blocks"],
            human(v["bytes"].as_u64().unwrap_or(0))
        );
    }
    println!(
        "  {} sync requests, {} records queued; {} records in {} commit batches \
         ({:.1} per batch, {:.1} per block), mean batch {:.0} us, {} device flushes, \
         {} waited for a txg to free log space, {} fell back to a txg sync, {} too large to log committed by a txg sync; \
         {} large writes made in place, logged by pointer",
        n("sync_requests"),
        n("records_queued"),
        n("records"),
        n("batches"),
        f("records_per_batch"),
        f("records_per_block"),
        f("batch_latency_mean_us"),
        n("flushes"),
        n("space_waits"),
        n("fallback_syncs"),
        n("bulk_syncs"),
        n("records_in_place")
    );
    let w = &st["device_writes"];
    let sizes: Vec<String> = w["by_size"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            format!(
                "{}+ {}",
                human(r["from"].as_u64().unwrap_or(0)),
                r["writes"].as_u64().unwrap_or(0)
            )
        })
        .collect();
    println!(
        "device writes: {} in all; by size: {}",
        human(w["bytes"].as_u64().unwrap_or(0)),
        if sizes.is_empty() {
            "none".to_string()
        } else {
            sizes.join(", ")
        }
    );
    Ok(())
}

/// A `compressratio` as `--json` gives it: a number, two decimals.
pub fn ratio(r: f64) -> f64 {
    (r * 100.0).round() / 100.0
}

pub fn status_json(p: &Pool) -> serde_json::Value {
    let sizes = p.block_sizes();
    let cfg = p.config();
    let s = p.space();
    let tops: Vec<_> = p
        .vdev_status()
        .into_iter()
        .map(|t| serde_json::to_value(&t).expect("status serializes"))
        .collect();
    let degraded = tops.iter().any(|t| t["state"] != "ONLINE");
    let suspended = p.suspension();
    let state = match (&suspended, degraded) {
        (Some(_), _) => "SUSPENDED",
        (None, true) => "DEGRADED",
        (None, false) => "ONLINE",
    };
    let mut scan = serde_json::to_value(p.scan_status()).expect("scan state serializes");
    guids_as_strings(&mut scan);
    json!({"name": p.name, "guid": p.guid.to_string(), "state": state, "suspended": suspended,
           "readonly": p.is_read_only(), "txg": p.synced_txg(), "checksum": cfg.checksum.name(),
           "size": s.size, "alloc": s.alloc, "free": s.free, "freeing": s.freeing,
           "fragmentation": p.fragmentation(), "usable": p.usable_space(crate::dsl::DEFAULT_VOLBLOCKSIZE), "vdevs": tops,
           "logicalused": sizes.logical, "compressratio": ratio(sizes.ratio()),
           "volumes": p.datasets().len(), "scan": scan, "features": cfg.features,
           "lost_writes": p.io.zio.stats.lost_writes.load(std::sync::atomic::Ordering::Relaxed)})
}

/// A scan's leaf GUIDs (`leaves`, and those of the scrub it interrupted) as strings, as
/// every GUID in `--json` output is.
fn guids_as_strings(scan: &mut serde_json::Value) {
    if let Some(leaves) = scan.get_mut("leaves").and_then(|l| l.as_array_mut()) {
        for g in leaves.iter_mut() {
            if let Some(n) = g.as_u64() {
                *g = json!(n.to_string());
            }
        }
    }
    if let Some(inner) = scan.get_mut("interrupted").filter(|i| i.is_object()) {
        guids_as_strings(inner);
    }
}

fn status(home: &Home, name: Option<&str>, json: bool) -> Result<()> {
    let names: Vec<String> = match name {
        Some(n) => vec![n.to_string()],
        None => home.load()?.pools.keys().cloned().collect(),
    };
    if names.is_empty() && !json {
        println!("no pools imported");
        return Ok(());
    }
    let mut all = Vec::new();
    for n in &names {
        all.push(pool_status(home, n)?);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all).unwrap());
        return Ok(());
    }
    for st in all {
        let u = |k: &str| human(st["usable"][k].as_u64().unwrap_or(0));
        println!(
            "  pool: {}\n state: {}\n   txg: {}\n space: {} size, {} alloc, {} free, {} freeing, \
             {}% fragmented (raw, as zpool list counts it)\n        {} usable, {} available beside {} \
             reserved for volumes (after parity, for {} blocks, as zfs list counts it)",
            st["name"].as_str().unwrap(),
            health(&st),
            st["txg"],
            human(st["size"].as_u64().unwrap()),
            human(st["alloc"].as_u64().unwrap()),
            human(st["free"].as_u64().unwrap()),
            human(st["freeing"].as_u64().unwrap_or(0)),
            st["fragmentation"],
            u("size"),
            u("avail"),
            u("reserved"),
            u("block_bytes"),
        );
        if let Some(lines) = status_lines(&st) {
            println!("{lines}");
        }
        let scan = &st["scan"];
        if scan["state"] != "none" {
            let n = |k: &str| scan[k].as_u64().unwrap_or(0);
            println!(
                "  scan: {} {}: {} of {} examined, {} repaired, {} errors",
                scan["func"].as_str().unwrap_or("scrub"),
                scan["state"].as_str().unwrap_or("?"),
                human(n("examined_bytes")),
                human(n("to_examine")),
                human(n("repaired_bytes")),
                n("errors")
            );
            let waiting = &scan["interrupted"];
            if waiting.is_object() {
                let w = |k: &str| waiting[k].as_u64().unwrap_or(0);
                println!(
                    "        then the scrub it interrupted goes on, {} of {} examined so far",
                    human(w("examined_bytes")),
                    human(w("to_examine"))
                );
            }
            print_damaged(scan, false);
        }
        println!("config:");
        println!(
            "    {:<40} {:>8} {:>6} {:>6} {:>6}",
            "NAME", "STATE", "READ", "WRITE", "CKSUM"
        );
        let mut logs_header = false;
        for t in st["vdevs"].as_array().unwrap() {
            if t["log"] == true && !logs_header {
                println!("    logs");
                logs_header = true;
            }
            let indent = if t["kind"] != "stripe" {
                println!(
                    "    {:<40} {:>8}",
                    format!("{}-{}", t["name"].as_str().unwrap(), t["id"]),
                    t["state"].as_str().unwrap()
                );
                "      "
            } else {
                "    "
            };
            // The name column narrows by the indent, so the states line up.
            let w = 44 - indent.len();
            for l in t["leaves"].as_array().unwrap() {
                let n = |k: &str| l[k].as_u64().unwrap_or(0);
                println!(
                    "{indent}{:<w$} {:>8} {:>6} {:>6} {:>6}",
                    l["path"].as_str().unwrap(),
                    l["state"].as_str().unwrap(),
                    n("read_errors"),
                    n("write_errors"),
                    n("cksum_errors")
                );
            }
        }
        let lost = st["lost_writes"].as_u64().unwrap_or(0);
        if lost > 0 {
            println!(
                "errors: {lost} short writes lost, laid over blocks that no copy could supply \
                 (those blocks still fail their reads)"
            );
        }
        println!();
    }
    Ok(())
}

/// The `status:` and `action:` lines of `pool status` for pool status `st`, if its health
/// needs any: a suspension, else devices out of room (NOSPACE). A suspended pool gets its own
/// lines only: the NOSPACE lines' "the pool goes on with the other copies" would be untrue,
/// and the suspension's cure (free room) is theirs too.
fn status_lines(st: &serde_json::Value) -> Option<String> {
    if let Ok(s) = serde_json::from_value::<Suspension>(st["suspended"].clone()) {
        use zeta_server::watch::{cure, effect};
        return Some(format!(
            "status: SUSPENDED. {} ({})\naction: {}",
            effect(&s),
            s.why,
            cure(&s)
        ));
    }
    let no_room: Vec<&str> = st["vdevs"]
        .as_array()?
        .iter()
        .flat_map(|t| t["leaves"].as_array().into_iter().flatten())
        .filter(|l| l["state"] == "NOSPACE")
        .filter_map(|l| l["path"].as_str())
        .collect();
    if no_room.is_empty() {
        return None;
    }
    use zeta_server::watch::{NO_ROOM_CURE, NO_ROOM_EFFECT};
    Some(format!(
        "status: {} cannot take writes: {NO_ROOM_EFFECT}.\naction: {NO_ROOM_CURE}.",
        no_room.join(", ")
    ))
}

#[cfg(test)]
mod status_tests {
    use super::*;
    use serde_json::json;

    fn status(states: &[&str], suspended: bool) -> serde_json::Value {
        let leaves: Vec<_> = states
            .iter()
            .enumerate()
            .map(|(i, s)| json!({"path": format!("/d{i}"), "state": s}))
            .collect();
        let suspension = suspended.then(|| {
            json!({"why": "/d0: No space left on device", "out_of_space": true, "retrying": true})
        });
        json!({"vdevs": [{"leaves": leaves}], "suspended": suspension})
    }

    #[test]
    fn a_healthy_pool_has_no_status_line() {
        assert_eq!(status_lines(&status(&["ONLINE", "ONLINE"], false)), None);
    }

    #[test]
    fn devices_out_of_room_are_named_with_the_cure() {
        let lines = status_lines(&status(&["ONLINE", "NOSPACE"], false)).unwrap();
        assert!(
            lines.starts_with("status: /d1 cannot take writes"),
            "{lines}"
        );
        assert!(lines.contains("\naction: free room"), "{lines}");
    }

    #[test]
    fn a_suspended_pool_says_so_alone() {
        let lines = status_lines(&status(&["NOSPACE", "NOSPACE"], true)).unwrap();
        assert!(lines.starts_with("status: SUSPENDED."), "{lines}");
        assert!(!lines.contains("other copies"), "{lines}");
        assert_eq!(lines.lines().count(), 2, "{lines}");
    }
}
