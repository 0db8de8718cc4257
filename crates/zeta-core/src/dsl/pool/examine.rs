//! What a path holds, looked at before a command writes over it, without taking the device
//! lock: a zeta label (whose pool and state), a damaged one, someone else's data, or nothing.
//! And `labelclear`, which makes a former device read as free.

use std::path::Path;
use std::sync::Arc;

use crate::spa::label::{clear_labels, read_labels, LabelError, PoolConfig};
use crate::vdev::sniff::foreign_contents;
use crate::vdev::{scheme, BlockDevice, FileDevice, Leaf};

use super::{PoolError, PoolState};

/// What `examine` found on a device.
#[derive(Debug)]
pub enum Contents {
    /// Every byte looked at is zero (or the file is empty).
    Empty,
    /// A zeta label: the newest config on it.
    Zeta(Box<PoolConfig>),
    /// A zeta label that cannot be read (damaged, or of a newer format): nobody can tell
    /// whether its pool is in use.
    DamagedLabel(String),
    /// Something else, in words ("an ext2/3/4 file system", "data (...)").
    Foreign(String),
}

/// Looks at what `path` (an existing file or block device) holds. `in_use` is whether some
/// descriptor, in this process or another, holds its device lock: a pool has it open now.
/// Its bytes are read (`foreign_contents`) only where it carries no zeta label.
pub fn examine(path: &Path) -> Result<(Contents, bool), PoolError> {
    let (dev, in_use, extents) = if scheme::is_scheme(path) {
        let (dev, in_use) = scheme::inspect(path)?;
        let whole = vec![(0, dev.len_bytes())];
        (dev, in_use, whole)
    } else {
        let in_use = crate::vdev::file::held_as_device(path);
        let dev = FileDevice::open_to_inspect(path)?;
        let extents = dev.data_extents(4096);
        (Arc::new(dev) as Arc<dyn BlockDevice>, in_use, extents)
    };
    if dev.len_bytes() == 0 {
        return Ok((Contents::Empty, in_use));
    }
    let judge_bytes = || -> Result<Contents, PoolError> {
        Ok(match foreign_contents(dev.as_ref(), &extents)? {
            Some(what) => Contents::Foreign(what),
            None => Contents::Empty,
        })
    };
    let contents = match read_labels(&Leaf::new(dev.clone(), 0)) {
        Ok(l) => match l.config {
            Some((_, cfg)) => Contents::Zeta(Box::new(cfg)),
            None if l.errors.iter().any(|(_, e)| e.label_present()) => {
                Contents::DamagedLabel(l.describe_errors(LabelError::label_present))
            }
            None => judge_bytes()?,
        },
        Err(e) if e.label_present() => Contents::DamagedLabel(e.to_string()),
        // A device too small for labels, or one that fails reads: judge its bytes.
        Err(LabelError::Io(_)) => judge_bytes()?,
        Err(e) => {
            return Err(PoolError::UnreadableLabel {
                path: path.display().to_string(),
                why: e.to_string(),
            })
        }
    };
    Ok((contents, in_use))
}

/// The newest config on `path`'s labels, if it carries one, read without the device lock,
/// and whether some descriptor holds that lock: what an import scan needs of a device, and
/// no more (`examine` would also read a device without labels for data).
pub fn examine_labels(path: &Path) -> Result<(Option<PoolConfig>, bool), PoolError> {
    let (dev, in_use) = scheme::inspect(path)?;
    Ok((super::probe(dev), in_use))
}

/// Clears the zeta labels of `path` (`zeta pool labelclear`), so that no import finds it and
/// any pool may take it. Refused while a pool has the device open (its lock is held); the
/// caller decides about labels of pools that are not open.
pub fn labelclear(path: &Path) -> Result<(), PoolError> {
    let dev = scheme::open(path, false)?;
    if dev.len_bytes() < 2 * crate::vdev::RESERVE_BYTES {
        return Err(PoolError::Invalid(format!(
            "{}: too small to hold zeta labels",
            path.display()
        )));
    }
    clear_labels(&Leaf::new(dev, 0))?;
    Ok(())
}

impl Contents {
    /// The pool a zeta label names, if it names one that is not destroyed.
    pub fn live_pool(&self) -> Option<&PoolConfig> {
        match self {
            Contents::Zeta(cfg) if cfg.state != PoolState::Destroyed => Some(cfg),
            _ => None,
        }
    }
}
