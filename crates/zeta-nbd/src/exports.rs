//! Exports backed by the volumes of imported pools, named `POOL/VOL`, and by their snapshots,
//! read-only, named `POOL/VOL@SNAP`. The list is read from the pools on every request, so
//! volumes and snapshots made while serving become exports at once.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::{ExportInfo, Exports};
use zeta_core::dsl::Pool;
use zeta_core::zvol::Volume;

pub struct PoolExports {
    pools: Vec<Arc<Pool>>,
    /// One `Volume` per export, shared by every connection to it: its range locks are what
    /// keep concurrent partial-block writes from different connections from losing bytes.
    /// Held by the connections alone (weak here), so a volume no client has open counts no
    /// handle (`Dataset::handles`): a rollback then goes ahead.
    open: Mutex<HashMap<String, Weak<Volume>>>,
    /// The export an empty name selects.
    default: Option<String>,
}

impl PoolExports {
    pub fn new(pools: Vec<Arc<Pool>>, default: Option<String>) -> PoolExports {
        PoolExports {
            pools,
            open: Mutex::new(HashMap::new()),
            default,
        }
    }

    /// Every export name, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.list().into_iter().map(|e| e.name).collect();
        v.sort();
        v
    }
}

impl Exports for PoolExports {
    fn list(&self) -> Vec<ExportInfo> {
        let mut out = Vec::new();
        for p in &self.pools {
            for ds in p.datasets() {
                out.push(ExportInfo {
                    name: format!("{}/{}", p.name, ds.name),
                    size: ds.volsize(),
                    description: format!(
                        "zeta volume, {} bytes, {} KiB blocks, {}",
                        ds.volsize(),
                        ds.volblocksize / 1024,
                        ds.checksum().name()
                    ),
                });
            }
            for s in p.snapshots() {
                out.push(ExportInfo {
                    name: format!("{}/{}", p.name, s.name),
                    size: s.volsize(),
                    description: format!(
                        "zeta snapshot (read-only), {} bytes, {} KiB blocks",
                        s.volsize(),
                        s.volblocksize / 1024
                    ),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    fn open(&self, name: &str) -> Option<Arc<Volume>> {
        let name = if name.is_empty() {
            match &self.default {
                Some(d) => d.clone(),
                None => {
                    // With exactly one export, the empty name means it.
                    let names = self.names();
                    if names.len() != 1 {
                        return None;
                    }
                    names.into_iter().next()?
                }
            }
        } else {
            name.to_string()
        };
        let (pool_name, vol) = name.split_once('/')?;
        let pool = self.pools.iter().find(|p| p.name == pool_name)?;
        let mut open = self.open.lock();
        if let Some(v) = open.get(&name).and_then(Weak::upgrade) {
            if v.is_current() {
                return Some(v);
            }
        }
        open.retain(|_, w| w.strong_count() > 0);
        let v = Arc::new(Volume::open(pool, vol).ok()?);
        open.insert(name, Arc::downgrade(&v));
        Some(v)
    }
}
