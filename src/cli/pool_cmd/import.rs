//! `zeta pool import`: finding pools among the files of a directory and opening one.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::create::absolute;
use crate::cli::{usage, Result};
use crate::dsl::devices as scheme;
use crate::dsl::{examine_labels, Pool, PoolOptions};
use zeta_server::state::{device_paths, open_devices, warn_import_notes, Home};

/// The devices in `dir`: files and block devices directly inside it, or the devices of a
/// Ceph pool (`rados:POOL`).
fn candidates(dir: &Path) -> Result<Vec<PathBuf>> {
    Ok(scheme::list(dir)?)
}

/// How `zeta pool import` takes a pool, beyond which one.
pub(super) struct ImportOpts {
    pub json: bool,
    pub discard_log: bool,
    /// Take a pool whose labels say another host or state directory had it last.
    pub force: bool,
    /// Import it under this name.
    pub new_name: Option<String>,
    /// `-o readonly=on`: write nothing to its devices (`PoolOptions::readonly`).
    pub readonly: bool,
}

/// The `-o PROP=VALUE` of `zeta pool import`: whether it asks for a read-only import, the
/// one property an import takes.
pub(super) fn import_readonly(props: &[String]) -> Result<bool> {
    let mut readonly = false;
    for p in props {
        match p.split_once('=') {
            Some(("readonly", v)) => {
                readonly = match v {
                    "on" => true,
                    "off" => false,
                    _ => return Err(usage(format!("readonly takes on or off, not '{v}'"))),
                }
            }
            _ => {
                return Err(usage(format!(
                    "'{p}': an import takes -o readonly=on|off (set other properties after \
                     the import)"
                )))
            }
        }
    }
    Ok(readonly)
}

pub(super) fn import(
    home: &Home,
    dirs: &[PathBuf],
    name: Option<&str>,
    opts: &ImportOpts,
) -> Result<()> {
    let (json, discard_log) = (opts.json, opts.discard_log);
    let dirs = if dirs.is_empty() {
        vec![PathBuf::from("/dev")]
    } else {
        dirs.to_vec()
    };
    let mut paths = Vec::new();
    for d in &dirs {
        paths.extend(candidates(d)?);
    }
    // Probe labels without taking the devices' locks, skipping devices that are not zeta
    // leaves; note those a process holds open (a pool served or opened elsewhere).
    let mut found: Vec<(PathBuf, String, u64, String)> = Vec::new();
    let mut held: Vec<(PathBuf, u64)> = Vec::new();
    for p in &paths {
        let Ok((Some(cfg), in_use)) = examine_labels(p) else {
            continue;
        };
        if cfg.state != crate::dsl::PoolState::Destroyed {
            if in_use {
                held.push((p.clone(), cfg.pool_guid));
            }
            found.push((
                p.clone(),
                cfg.name.clone(),
                cfg.pool_guid,
                format!("{:?}", cfg.state).to_lowercase(),
            ));
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
        // With --json a script asks for the listing: it imports nothing unnamed.
        None if pools.len() == 1 && !json => pools[0].0.clone(),
        None => {
            if json {
                let rows: Vec<_> = pools
                    .iter()
                    .map(|p| json!({"name": p.0, "guid": p.1.to_string(), "state": p.2}))
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
    let guids: Vec<u64> = found
        .iter()
        .filter(|f| f.1 == target)
        .map(|f| f.2)
        .collect();
    let open_elsewhere: Vec<String> = held
        .iter()
        .filter(|h| guids.contains(&h.1))
        .map(|h| h.0.display().to_string())
        .collect();
    if !open_elsewhere.is_empty()
        && open_elsewhere
            .iter()
            .all(|p| scheme::is_scheme(Path::new(p)))
    {
        return Err(usage(format!(
            "pool '{target}' is in use: the lease of its devices ({}) is held, by a process \
             on another host or this one that has the pool imported, or had it until less \
             than a lease ago (a lease lapses {} s after its holder stops renewing it)",
            open_elsewhere.join(", "),
            zeta_rados::lease::lease_duration().as_secs()
        )));
    }
    if !open_elsewhere.is_empty() {
        return Err(usage(format!(
            "pool '{target}' is in use: a process holds its devices open ({}), `zeta serve` \
             perhaps; stop it, or reach the pool through it",
            open_elsewhere.join(", ")
        )));
    }
    let new_name = opts.new_name.as_deref().unwrap_or(&target).to_string();
    let cache = home.load()?;
    // A pool that cannot open for a missing log device is imported again with --discard-log.
    if cache.pools.contains_key(&new_name) && !(discard_log && new_name == target) {
        return Err(usage(format!(
            "a pool named '{new_name}' is already imported{}",
            if new_name == target { "" } else { " here" }
        )));
    }
    if let Some((name, _)) = cache.pools.iter().find(|(_, c)| guids.contains(&c.guid)) {
        if !(discard_log && *name == target) {
            return Err(usage(format!(
                "pool '{target}' is already imported here, as '{name}'"
            )));
        }
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
    let devs = open_devices(&members, opts.readonly)?;
    let pool_opts = PoolOptions {
        discard_log,
        force: opts.force,
        rename: opts.new_name.clone(),
        readonly: opts.readonly,
        ..home.pool_options()
    };
    let pool = Pool::import(devs, Some(&target), pool_opts)?;
    let (old_name, target) = (target, new_name);
    warn_import_notes(&pool);
    // Replaying now also moves every log off a device that was given up on.
    if !opts.readonly {
        crate::zvol::replay_logs(&pool)?;
    }
    if discard_log && !opts.readonly {
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
    let how = if opts.readonly { " read-only" } else { "" };
    if opts.new_name.is_some() {
        println!("imported '{old_name}' as '{target}'{how}");
    } else {
        println!("imported '{target}'{how}");
    }
    Ok(())
}
