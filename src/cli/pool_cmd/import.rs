//! `zeta pool import`: finding pools among the files of a directory and opening one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;

use super::create::absolute;
use crate::cli::state::{device_paths, open_devices, warn_import_notes, Home};
use crate::cli::{usage, CliError, Result};
use crate::dsl::{probe, Pool, PoolOptions};
use crate::vdev::FileDevice;

/// Files and block devices directly inside `dir`.
fn candidates(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir).map_err(|e| CliError::Io {
        path: dir.display().to_string(),
        source: e,
    })?;
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let p = entry.path();
        if let Ok(meta) = std::fs::metadata(&p) {
            use std::os::unix::fs::FileTypeExt;
            if meta.is_file() || meta.file_type().is_block_device() {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

pub(super) fn import(
    home: &Home,
    dirs: &[PathBuf],
    name: Option<&str>,
    json: bool,
    discard_log: bool,
) -> Result<()> {
    let dirs = if dirs.is_empty() {
        vec![PathBuf::from("/dev")]
    } else {
        dirs.to_vec()
    };
    let mut paths = Vec::new();
    for d in &dirs {
        paths.extend(candidates(d)?);
    }
    // Probe labels, skipping devices that are not zeta leaves or are in use.
    let mut found: Vec<(PathBuf, String, u64, String)> = Vec::new();
    for p in &paths {
        let Ok(dev) = FileDevice::open(p) else {
            continue;
        };
        if let Some(cfg) = probe(Arc::new(dev)) {
            if cfg.state != crate::spa::label::PoolState::Destroyed {
                found.push((
                    p.clone(),
                    cfg.name,
                    cfg.pool_guid,
                    format!("{:?}", cfg.state).to_lowercase(),
                ));
            }
        }
    }
    let mut pools: Vec<(String, u64, String)> = found
        .iter()
        .map(|f| (f.1.clone(), f.2, f.3.clone()))
        .collect();
    pools.sort();
    pools.dedup_by_key(|p| p.1);
    let target = match name {
        Some(n) => n.to_string(),
        None if pools.len() == 1 => pools[0].0.clone(),
        None => {
            if json {
                let rows: Vec<_> = pools
                    .iter()
                    .map(|p| json!({"name": p.0, "guid": p.1, "state": p.2}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows).unwrap());
            } else if pools.is_empty() {
                println!(
                    "no pools available to import in {}",
                    dirs.iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            } else {
                println!("pools available to import:");
                for p in &pools {
                    println!("  {}  (guid {}, {})", p.0, p.1, p.2);
                }
            }
            return Ok(());
        }
    };
    // A pool that cannot open for a missing log device is imported again with --discard-log.
    if home.load()?.pools.contains_key(&target) && !discard_log {
        return Err(usage(format!("pool '{target}' is already imported")));
    }
    let members: Vec<PathBuf> = found
        .iter()
        .filter(|f| f.1 == target)
        .map(|f| absolute(&f.0))
        .collect();
    if members.is_empty() {
        return Err(usage(format!(
            "no pool named '{target}' in {}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let devs = open_devices(&members)?;
    let opts = PoolOptions {
        discard_log,
        ..Default::default()
    };
    let pool = Pool::import(devs, Some(&target), opts)?;
    warn_import_notes(&pool);
    // Replaying now also moves every log off a device that was given up on.
    crate::zvol::replay_logs(&pool)?;
    if discard_log {
        // A log device given up on leaves the pool, so that later imports need no flag.
        let gone: Vec<String> = pool
            .vdev_status()
            .iter()
            .filter(|t| t.log && t.state == "UNAVAIL")
            .filter_map(|t| t.leaves.first().map(|l| l.path.clone()))
            .collect();
        for dev in gone {
            pool.remove_log(&dev)?;
            eprintln!("warning: removed the missing log device {dev} from '{target}'");
        }
    }
    home.remember(&pool, device_paths(&pool))?;
    pool.close()?;
    println!("imported '{target}'");
    Ok(())
}
