//! One fill level on zeta: a pool on one file, a volume of 8K blocks filled sequentially in
//! this process, then `zeta serve` and zeta-load's writers overwriting it through NBD.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use rand::{RngCore, SeedableRng};

use super::{Level, Plan, BLOCK};
use crate::load::{self, LoadSpec};
use crate::sync::check_stop;
use crate::sync::zeta::{run_zeta, serve};
use zeta_core::dsl::PoolError;
use zeta_core::zvol::{VolError, Volume};
use zeta_server::state::Home;
use zeta_server::{control, usage, Result};

const POOL: &str = "frag";
const FILL_CHUNK: usize = 1 << 20;

pub(super) fn level(work: &Path, plan: &Plan, fill: u32, stop: &AtomicBool) -> Result<Level> {
    let dir = work.join(format!("z{fill}"));
    std::fs::create_dir(&dir).map_err(|e| zeta_server::Error::io(&dir, e))?;
    let home = dir.join("h");
    let device = dir.join("d0");
    let create = [
        "pool".to_string(),
        "create".into(),
        "-o".into(),
        format!("size={}", plan.size),
        POOL.into(),
        device.display().to_string(),
    ];
    run_zeta(&home, &create, "zeta pool create")?;
    let (filled, occupancy, before) = fill_volume(&home, fill, stop)?;

    let (server, addr) = serve(&home, POOL, &dir.join("serve.log"), stop)?;
    let h = Home::resolve(Some(home.clone()));
    let ask = |what: &str| {
        control::connect(&h, POOL)
            .ok_or_else(|| usage(format!("zeta serve's control socket is gone ({what})")))
    };
    let (bytes_before, sizes_before) =
        device_writes(&control::remote_iostat(ask("iostat")?, POOL)?);
    let spec = LoadSpec {
        bs_bytes: BLOCK as u32,
        // No flushes: the seed's writers wrote without fsync.
        writes_per_flush: 0,
        depth: plan.depth,
        runtime: Duration::from_secs(plan.runtime),
        seed: load::SEED,
        fua: false,
        interval: Some(Duration::from_secs(1)),
    };
    let exports = vec![format!("{POOL}/v"); plan.writers as usize];
    let (samples, error) = match load::run(addr, &exports, &spec, stop) {
        Ok(r) => (
            r.slices
                .iter()
                .map(|s| s.writes_per_sec * BLOCK as f64 / (1 << 20) as f64)
                .collect(),
            None,
        ),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    check_stop(stop)?;
    // The run's last writes reach the devices (and their sizes the counters) with a sync: a
    // short run at a low fill may end before any txg of it commits.
    control::remote_sync(ask("sync")?, POOL)?;
    let (bytes_after, sizes_after) = device_writes(&control::remote_iostat(ask("iostat")?, POOL)?);
    let after = control::remote_map(ask("map")?, POOL)?;
    let status = control::remote_status(ask("status")?, POOL)?;
    let state = status["state"].as_str().unwrap_or("?").to_string();
    let occupancy_after = pct(
        status["alloc"].as_u64().unwrap_or(0),
        status["size"].as_u64().unwrap_or(1),
    );
    drop(server);
    let error = error.or_else(|| (state != "ONLINE").then(|| format!("the pool is {state}")));
    let write_sizes: Vec<(u64, u64)> = sizes_after
        .iter()
        .map(|&(from, n)| {
            let was = sizes_before.iter().find(|b| b.0 == from).map_or(0, |b| b.1);
            (from, n - was.min(n))
        })
        .filter(|&(_, n)| n > 0)
        .collect();
    let mut l = Level::new(
        "zeta",
        fill,
        (occupancy, occupancy_after),
        filled,
        samples,
        error,
    );
    l.frag_before = Some(before.fragmentation);
    l.frag_after = Some(after.fragmentation);
    let n: u64 = write_sizes.iter().map(|s| s.1).sum();
    l.mean_write_kib = (n > 0).then(|| (bytes_after - bytes_before) as f64 / n as f64 / 1024.0);
    l.write_sizes = write_sizes;
    l.maps = Some((before, after));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(l)
}

/// Creates the volume and fills it with random bytes, 1M at a time, until `fill` % of the
/// pool's size is written or the pool has no room; the volume is then cut to what was
/// written, so that every overwrite lands on data. Returns the bytes written, the pool's
/// occupancy then in percent, and its map.
fn fill_volume(
    home: &Path,
    fill: u32,
    stop: &AtomicBool,
) -> Result<(u64, f64, zeta_core::dsl::PoolMap)> {
    let h = Home::resolve(Some(home.to_path_buf()));
    let pool = h.open(POOL)?;
    let size = pool.space().size;
    let target = (size as u128 * fill as u128 / 100) as u64 / FILL_CHUNK as u64 * FILL_CHUNK as u64;
    pool.create_volume("v", target.max(FILL_CHUNK as u64), BLOCK as u32, None)?;
    let vol = Volume::open(&pool, "v")?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(fill as u64);
    let mut chunk = vec![0u8; FILL_CHUNK];
    let mut filled = 0u64;
    while filled < target {
        check_stop(stop)?;
        rng.fill_bytes(&mut chunk);
        match vol.write(filled, &chunk) {
            Ok(()) => filled += FILL_CHUNK as u64,
            Err(VolError::Pool {
                source: PoolError::NoSpace(_),
                ..
            }) => break,
            Err(e) => return Err(e.into()),
        }
    }
    vol.flush()?;
    drop(vol);
    if filled == 0 {
        return Err(usage("the pool took no data at all"));
    }
    if filled < target {
        pool.resize_volume("v", filled)?;
    }
    pool.sync_frees()?;
    let s = pool.space();
    let map = pool.metaslab_map();
    pool.close()?;
    Ok((filled, pct(s.alloc, s.size), map))
}

fn pct(a: u64, b: u64) -> f64 {
    a as f64 * 100.0 / b.max(1) as f64
}

/// `device_writes` of `zeta pool iostat --json`: bytes, and (size class from, writes).
fn device_writes(iostat: &serde_json::Value) -> (u64, Vec<(u64, u64)>) {
    let w = &iostat["device_writes"];
    let sizes = w["by_size"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .filter_map(|r| Some((r["from"].as_u64()?, r["writes"].as_u64()?)))
                .collect()
        })
        .unwrap_or_default();
    (w["bytes"].as_u64().unwrap_or(0), sizes)
}
