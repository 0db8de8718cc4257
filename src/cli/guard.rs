//! Before a command writes to a path it did not create, it looks at what the path holds
//! (`dsl::examine`): a device of an open or imported pool is never written over, and someone
//! else's data only with `-f`.

use std::path::Path;

use super::{usage, Result};
use crate::dsl::PoolState;
use crate::dsl::{examine, Contents};
use zeta_server::state::Home;

/// What the command is about to write to the path.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Writing {
    /// Labels and blocks of a pool: `pool create`, `pool replace`, `pool add`.
    Device,
    /// A volume's contents: `vol get`.
    Copy,
}

/// Refuses to write to `path` where that would damage a pool or lose data the user did not
/// mean to give up. Always refused: a device some process holds open as a pool's device,
/// and a device of a pool imported in this state directory. Refused unless `force`: a
/// device of a pool that was not exported (it may be open elsewhere: another `ZETA_HOME`,
/// another host; never for a copy), of an exported pool, a damaged zeta label, other data,
/// and for a copy, any existing file. A path that does not exist is fine.
pub fn check_overwrite(home: &Home, path: &Path, writing: Writing, force: bool) -> Result<()> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    let shown = path.display();
    let flag = match writing {
        Writing::Device => "-f",
        Writing::Copy => "--force",
    };
    if writing == Writing::Copy && !force {
        return Err(usage(format!(
            "{shown} exists; give --force to overwrite it"
        )));
    }
    let (contents, in_use) = examine(path)?;
    if in_use {
        return Err(usage(format!(
            "{shown} is in use as a device of an open pool (a process holds its device \
             lock); refusing to write to it"
        )));
    }
    if let Some(cfg) = contents.live_pool() {
        if let Some((name, member)) = imported_here(home, path, cfg.pool_guid)? {
            return Err(usage(if member {
                format!(
                    "{shown} is a device of pool '{name}', which is imported here: export or \
                     destroy the pool first"
                )
            } else {
                format!(
                    "{shown} carries the labels of pool '{name}' (imported here), which no \
                     longer uses it: `zeta pool labelclear {shown}` to reuse it"
                )
            }));
        }
        match cfg.state {
            PoolState::Active if writing == Writing::Copy || !force => {
                let cure = match writing {
                    Writing::Device => "give -f to use it anyway".to_string(),
                    Writing::Copy => {
                        format!("if nothing uses it, `zeta pool labelclear -f {shown}` first")
                    }
                };
                return Err(usage(format!(
                    "{shown} is a device of pool '{}'{}, which was not exported: it may be \
                     in use by another zeta (another ZETA_HOME or host); {cure}",
                    cfg.name,
                    host_note(cfg)
                )));
            }
            PoolState::Exported if !force => {
                return Err(usage(format!(
                    "{shown} is a device of the exported pool '{}'; give {flag} to overwrite \
                     it (`zeta pool import` brings the pool back)",
                    cfg.name
                )));
            }
            _ => {}
        }
    }
    match contents {
        Contents::DamagedLabel(why) if !force => Err(usage(format!(
            "{shown} carries a zeta label that cannot be read ({why}): it may belong to a \
             pool; give {flag} to overwrite it"
        ))),
        Contents::Foreign(what) if !force => Err(usage(format!(
            "{shown} holds {what}; give {flag} to overwrite it"
        ))),
        _ => Ok(()),
    }
}

/// " (last imported on HOST)" where the label says so.
fn host_note(cfg: &crate::dsl::PoolConfig) -> String {
    match &cfg.hostname {
        Some(h) => format!(" (last imported on {h})"),
        None => String::new(),
    }
}

/// The name of the pool of GUID `guid` if this state directory has it imported, and whether
/// `path` is among its devices (rather than a device that left it, whose labels remain).
pub fn imported_here(home: &Home, path: &Path, guid: u64) -> Result<Option<(String, bool)>> {
    let cache = home.load()?;
    let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    Ok(cache
        .pools
        .iter()
        .find(|(_, c)| c.guid == guid)
        .map(|(name, c)| {
            let member = c
                .devices
                .iter()
                .any(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.clone()) == abs);
            (name.clone(), member)
        }))
}

/// `zeta pool labelclear`: clears the zeta labels of a device that no pool uses. Refused for
/// a device a process holds open or a member of a pool imported here; a device of a pool not
/// imported here that was not destroyed needs `force`.
pub fn labelclear(home: &Home, path: &Path, force: bool) -> Result<()> {
    let shown = path.display();
    let (contents, in_use) = examine(path)?;
    if in_use {
        return Err(usage(format!(
            "{shown} is in use as a device of an open pool (a process holds its device lock)"
        )));
    }
    match &contents {
        Contents::Zeta(_) | Contents::DamagedLabel(_) => {}
        _ => {
            return Err(usage(format!("{shown} carries no zeta label")));
        }
    }
    if let Some(cfg) = contents.live_pool() {
        match imported_here(home, path, cfg.pool_guid)? {
            Some((name, true)) => {
                return Err(usage(format!(
                    "{shown} is a device of pool '{name}', which is imported here: destroy \
                     the pool, or replace the device, first"
                )))
            }
            Some((_, false)) => {}
            None if !force => {
                let state = match cfg.state {
                    PoolState::Exported => "the exported pool",
                    _ => "the pool, not exported,",
                };
                return Err(usage(format!(
                    "{shown} is a device of {state} '{}'{}; give -f to clear its labels \
                     (the pool loses the device)",
                    cfg.name,
                    host_note(cfg)
                )));
            }
            None => {}
        }
    }
    crate::dsl::labelclear(path)?;
    Ok(())
}
