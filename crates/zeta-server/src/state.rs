//! The state directory ($ZETA_HOME) and its cache of known pools: which devices each
//! imported pool lives on, so commands can open it by name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{usage, Error, Result};
use zeta_core::dsl::BlockDevice;
use zeta_core::dsl::{Pool, PoolOptions};

pub struct Home {
    pub dir: PathBuf,
    /// Pools this process already holds open (a server's): commands it runs on behalf of a
    /// control client use them instead of opening their (locked) devices again.
    served: Vec<Arc<Pool>>,
}

/// A pool a command works on: opened for the command (closed when it is done), or one this
/// process serves (synced instead, and left open).
pub struct PoolRef {
    pool: Arc<Pool>,
    owned: bool,
}

impl std::ops::Deref for PoolRef {
    type Target = Arc<Pool>;
    fn deref(&self) -> &Arc<Pool> {
        &self.pool
    }
}

impl PoolRef {
    /// The pool itself, for a caller that keeps it open and closes it when done (a server).
    pub fn into_arc(self) -> Arc<Pool> {
        self.pool
    }

    /// Ends the command's use of the pool: what it changed is durable when this returns.
    pub fn close(&self) -> Result<()> {
        if self.owned {
            self.pool.close()?;
        } else {
            self.pool.sync_now()?;
        }
        Ok(())
    }
}

#[derive(Default, Serialize, Deserialize)]
pub struct Cache {
    pub pools: BTreeMap<String, CachedPool>,
}

#[derive(Clone, Serialize, Deserialize)]
pub struct CachedPool {
    pub guid: u64,
    pub devices: Vec<PathBuf>,
    /// Imported with `-o readonly=on`: every command opens it read-only, until an export.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub readonly: bool,
}

impl Home {
    pub fn resolve(flag: Option<PathBuf>) -> Home {
        let dir = flag
            .or_else(|| std::env::var_os("ZETA_HOME").map(PathBuf::from))
            .or_else(|| std::env::var_os("XDG_STATE_HOME").map(|d| PathBuf::from(d).join("zeta")))
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state/zeta"))
            })
            .unwrap_or_else(|| PathBuf::from(".zeta"));
        Home {
            dir,
            served: Vec::new(),
        }
    }

    /// The same state directory, for commands run on behalf of control clients against
    /// pools this process serves.
    pub fn serving(&self, pools: Vec<Arc<Pool>>) -> Home {
        Home {
            dir: self.dir.clone(),
            served: pools,
        }
    }

    /// Who this state directory is, as the labels of the pools it imports record it (with
    /// the host's name): its absolute path.
    pub fn holder(&self) -> String {
        std::path::absolute(&self.dir)
            .unwrap_or_else(|_| self.dir.clone())
            .display()
            .to_string()
    }

    /// The options every pool this state directory creates or imports is opened with.
    pub fn pool_options(&self) -> PoolOptions {
        PoolOptions {
            holder: Some(self.holder()),
            ..PoolOptions::default()
        }
    }

    pub fn served_pools(&self) -> &[Arc<Pool>] {
        &self.served
    }

    fn cache_path(&self) -> PathBuf {
        self.dir.join("pools.json")
    }

    pub fn load(&self) -> Result<Cache> {
        let path = self.cache_path();
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                usage(format!(
                    "{}: unreadable pool cache ({e}); remove it and re-import",
                    path.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Cache::default()),
            Err(e) => Err(Error::Io {
                path: path.display().to_string(),
                source: e,
            }),
        }
    }

    /// Writes the cache atomically (temporary file, fsync, rename).
    pub fn save(&self, cache: &Cache) -> Result<()> {
        let io = |p: &Path, e| Error::Io {
            path: p.display().to_string(),
            source: e,
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| io(&self.dir, e))?;
        let path = self.cache_path();
        let tmp = self.dir.join("pools.json.tmp");
        let bytes = serde_json::to_vec_pretty(cache).expect("cache serializes");
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
            f.write_all(&bytes).map_err(|e| io(&tmp, e))?;
            f.sync_all().map_err(|e| io(&tmp, e))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
    }

    pub fn remember(&self, pool: &Pool, devices: Vec<PathBuf>) -> Result<()> {
        let mut cache = self.load()?;
        cache.pools.insert(
            pool.name.clone(),
            CachedPool {
                guid: pool.guid,
                devices,
                readonly: pool.is_read_only(),
            },
        );
        self.save(&cache)
    }

    pub fn forget(&self, name: &str) -> Result<()> {
        let mut cache = self.load()?;
        cache.pools.remove(name);
        self.save(&cache)
    }

    /// Opens an imported pool by name.
    pub fn open(&self, name: &str) -> Result<PoolRef> {
        if let Some(p) = self.served.iter().find(|p| p.name == name) {
            return Ok(PoolRef {
                pool: p.clone(),
                owned: false,
            });
        }
        let cache = self.load()?;
        let entry = cache.pools.get(name).ok_or_else(|| {
            usage(format!(
                "no imported pool named '{name}' (see `zeta pool list`, or `zeta pool import`)"
            ))
        })?;
        // A device that is gone is left to the import to judge (a mirror goes on degraded;
        // a missing log device needs `zeta pool import --discard-log`).
        let present: Vec<PathBuf> = entry
            .devices
            .iter()
            .filter(|p| zeta_core::dsl::devices::is_scheme(p) || p.exists())
            .cloned()
            .collect();
        let devs = match open_devices(&present, entry.readonly) {
            Err(Error::Vdev(zeta_core::dsl::VdevError::Locked { .. }))
                if crate::control::connect(self, name).is_some() =>
            {
                return Err(usage(format!(
                    "pool '{name}' is being served by `zeta serve`: `zeta vol` commands and \
                     `zeta pool` status, list, scrub, clear, offline, online and replace \
                     reach it there; stop the server to export or destroy it"
                )))
            }
            r => r?,
        };
        // A read-only import records no holder in the labels, so the pool still names whoever
        // had it last: the import was the moment to refuse it (or be told -f), not each open.
        let opts = PoolOptions {
            readonly: entry.readonly,
            force: entry.readonly,
            ..self.pool_options()
        };
        let pool = Pool::import(devs, Some(name), opts)?;
        warn_import_notes(&pool);
        if pool.guid != entry.guid {
            return Err(usage(format!(
                "the devices of '{name}' now hold a different pool; re-import it"
            )));
        }
        Ok(PoolRef { pool, owned: true })
    }
}

/// Prints what an import found worth a word (`Pool::import_notes`: what a damaged or
/// discarded intent log lost) to standard error, which a server keeps in its log.
pub fn warn_import_notes(pool: &Pool) {
    for note in pool.import_notes.lock().iter() {
        eprintln!("warning: {note}");
    }
}

/// Opens and locks the devices at `paths`: for reading only if `read_only` (a pool imported
/// read-only), which other read-only opens may share.
pub fn open_devices(
    paths: &[PathBuf],
    read_only: bool,
) -> Result<Vec<(Arc<dyn BlockDevice>, String)>> {
    paths
        .iter()
        .map(|p| {
            let dev = zeta_core::dsl::devices::open(p, read_only)?;
            Ok((dev, p.display().to_string()))
        })
        .collect()
}

/// Every leaf path of an open pool, for the cache.
pub fn device_paths(pool: &Pool) -> Vec<PathBuf> {
    pool.config()
        .tops
        .iter()
        .flat_map(|t| t.children.iter().map(|c| PathBuf::from(&c.path)))
        .collect()
}
