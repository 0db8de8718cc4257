//! Device commands: `replace`, `offline`/`online`, and `zeta inject` (fault injection).

use std::path::Path;
use std::sync::Arc;

use super::create::absolute;
use super::scan::{follow, Progress};
use crate::cli::args::InjectArgs;
use crate::cli::{usage, Result};
use crate::dsl::Pool;
use zeta_server::control;
use zeta_server::state::{device_paths, Home};

/// `zeta inject`.
pub fn inject(home: &Home, a: InjectArgs) -> Result<()> {
    let (pool, dev) = (a.pool.as_str(), a.device.as_str());
    let served = control::connect(home, pool);
    if let Some(n) = a.corrupt {
        let done = match served {
            Some(conn) => control::remote_corrupt(conn, pool, dev, n, a.seed)?,
            None => {
                let p = home.open(pool)?;
                let r = p.corrupt_sectors(dev, n, a.seed);
                p.close()?;
                r?
            }
        };
        println!("corrupted {done} allocated sectors of {dev} in '{pool}'");
        return Ok(());
    }
    let faults = crate::dsl::Injection {
        fail_reads: a.fail_reads.unwrap_or(0.0),
        fail_writes: a.fail_writes.unwrap_or(0.0),
        full: a.full,
        vanished: a.vanish,
    };
    let Some(conn) = served else {
        return Err(usage(format!(
            "pool '{pool}' is not being served: injected failures live in the process that \
             holds the pool, so run `zeta serve {pool}` first (--corrupt works either way)"
        )));
    };
    control::remote_inject(conn, pool, dev, &faults)?;
    if a.clear {
        println!("cleared the injected faults of {dev} in '{pool}'");
    } else {
        println!("injected into {dev} in '{pool}': {}", describe(&faults));
    }
    Ok(())
}

/// The injected faults in words, for the command's answer.
fn describe(f: &crate::dsl::Injection) -> String {
    let mut what = Vec::new();
    if f.vanished {
        what.push("every I/O fails, as if the device were pulled".to_string());
    }
    if f.fail_reads > 0.0 {
        what.push(format!("data reads fail with probability {}", f.fail_reads));
    }
    if f.fail_writes > 0.0 {
        what.push(format!(
            "data writes fail with probability {}",
            f.fail_writes
        ));
    }
    if f.full {
        what.push("data writes fail with ENOSPC, as on a full file system".to_string());
    }
    if what.is_empty() {
        what.push("nothing fails".to_string());
    }
    what.join("; ")
}

pub(super) fn replace(home: &Home, force: bool, name: &str, old: &str, new: &Path) -> Result<()> {
    let new_path = absolute(new);
    crate::cli::guard::check_overwrite(home, &new_path, crate::cli::guard::Writing::Device, force)?;
    let created = !crate::dsl::devices::exists(&new_path)?;
    let served = control::connect(home, name);
    let is_served = served.is_some();
    let r = match served {
        Some(conn) => {
            // The server opens (or creates) the device itself and rebuilds it while serving.
            control::remote_replace(conn, name, old, &new_path, force)
        }
        None => {
            let p = home.open(name)?;
            let r = replace_in(&p, old, &new_path, force);
            if r.is_ok() {
                println!(
                    "replacing {old} with {} in '{name}': rebuilding",
                    new_path.display()
                );
                let last = follow(&p)?;
                Progress::finish(name, &last["scan"]);
            }
            p.close()?;
            r
        }
    };
    if let Err(e) = r {
        if created {
            crate::dsl::devices::remove(&new_path);
        }
        return Err(e);
    }
    // The pool cache names its devices: the new one instead of the old.
    let mut cache = home.load()?;
    if let Some(entry) = cache.pools.get_mut(name) {
        let old_abs = absolute(Path::new(old));
        entry
            .devices
            .retain(|d| *d != old_abs && d.as_os_str() != old);
        entry.devices.push(new_path.clone());
        home.save(&cache)?;
    }
    if is_served {
        println!(
            "replacing {old} with {} in '{name}': the server rebuilds it (see `zeta pool status {name}`)",
            new_path.display()
        );
    }
    Ok(())
}

/// Opens (creating it if needed, at the size of the pool's largest device, and allocated at
/// once if the pool's files are: `room::allocated`) the new device and replaces `old` by it
/// in `p`.
pub fn replace_in(p: &Arc<Pool>, old: &str, new_path: &Path, force: bool) -> Result<()> {
    use crate::dsl::devices as scheme;
    let dev = if scheme::exists(new_path)? {
        scheme::open(new_path, false)?
    } else {
        let paths = device_paths(p);
        let size = paths
            .iter()
            .filter_map(|d| match scheme::is_scheme(d) {
                true => scheme::inspect(d).ok().map(|(dev, _)| dev.len_bytes()),
                false => std::fs::metadata(d).ok().map(|m| m.len()),
            })
            .max()
            .unwrap_or(0);
        let options = crate::dsl::DeviceOptions::default();
        scheme::create(
            new_path,
            size,
            zeta_server::room::allocated(&paths),
            options,
        )?
    };
    p.replace(old, dev, new_path.display().to_string(), force)?;
    Ok(())
}

pub(super) fn set_offline(home: &Home, name: &str, device: &str, offline: bool) -> Result<()> {
    match control::connect(home, name) {
        Some(conn) => control::remote_offline(conn, name, device, offline)?,
        None => {
            let p = home.open(name)?;
            let r = p.set_offline(device, offline);
            // A resilver started by `online` runs to its end here: nobody else holds the pool.
            p.wait_scrub();
            p.close()?;
            r?;
        }
    }
    if offline {
        println!("{device} of '{name}' is offline");
    } else {
        println!(
            "{device} of '{name}' is online (resilvering what it missed; see `zeta pool status`)"
        );
    }
    Ok(())
}
