//! Import, in named phases: find the pool among the devices' labels (`find`), check its
//! config against this zeta and this host (`admit`), build the vdev tree from the devices
//! found, missing ones kept in their place (`build_tree`), open the newest uberblock whose tree
//! verifies (`open_newest`), then open every volume's intent log (`open_volumes`) and start
//! what was running when the pool closed (`finish`).

use std::collections::HashMap;
use std::sync::Arc;

use super::mos::{alloc_geometry, load_mos, LoadedVolume};
use super::sync::commit_above_skipped;
use super::{check_kernels, hostname, invalid, Mos, Pool, PoolError, PoolOptions, MIN_LEAF_BYTES};
use crate::dmu::{BlockCache, ObjectIo};
use crate::dsl::dir::valid_volume_name;
use crate::spa::feature::{self, FeatureState, SPACE_USED};
use crate::spa::label::{
    cut_to, read_labels, LabelError, PoolConfig, PoolState, Uberblock, FORMAT_VERSION,
    MAX_HOLDER_BYTES,
};
use crate::spa::Allocator;
use crate::vdev::{BlockDevice, Leaf, TopKind, TopVdev};
use crate::zil::Log;
use crate::zio::Zio;

/// One device found at import.
struct Member {
    dev: Arc<dyn BlockDevice>,
    path: String,
    /// The generation of the config its labels hold: the newest one wins.
    generation: u64,
    config: PoolConfig,
    uberblocks: Vec<Uberblock>,
}

/// The pool `find` chose: its devices, and the devices given that could not be used.
struct Found {
    guid: u64,
    members: Vec<Member>,
    unreadable: Vec<String>,
}

/// The vdev tree `build_tree` made, and what it had to note on the way.
struct Tree {
    tops: Vec<Arc<TopVdev>>,
    /// Data vdevs come first, numbered 0..n_data; log devices follow.
    n_data: usize,
    /// The uberblocks every device holds, of this pool.
    uberblocks: Vec<Uberblock>,
    /// The newest txg each leaf took whole (its newest uberblock of this pool).
    took: HashMap<u64, u64>,
    /// A log device given up (`--discard-log`), and the vdevs that import DEGRADED.
    notes: Vec<String>,
}

/// The newest tree that verified, and the txg new commits start above.
struct Opened {
    ub: Uberblock,
    mos: Mos,
    volumes: Vec<LoadedVolume>,
    alloc: Allocator,
    txg: u64,
}

impl Pool {
    /// Imports the pool `name` (or the only one) from `devices`: the newest committed txg whose
    /// tree verifies, its volumes' intent logs opened (replayed by whoever opens a volume).
    pub fn import(
        devices: Vec<(Arc<dyn BlockDevice>, String)>,
        name: Option<&str>,
        opts: PoolOptions,
    ) -> Result<Arc<Pool>, PoolError> {
        check_kernels()?;
        let found = find(devices, name)?;
        let config_gen = found.members.iter().map(|m| m.generation).max().unwrap();
        let mut config = newest_config(&found.members);
        // Refusals name the pool as its devices do, before any rename.
        let found_name = config.name.clone();
        let cannot = cannot_import(&found_name);
        admit(&mut config, &opts).map_err(&cannot)?;
        let tree = build_tree(&mut config, found, &opts).map_err(|e| match e {
            Refused::Why(why) => cannot(why),
            Refused::Pool(e) => e,
        })?;
        let opened = open_newest(&config, &tree, &opts).map_err(|e| match e {
            Refused::Why(why) => cannot(why),
            Refused::Pool(e) => e,
        })?;
        owe_missed_txgs(&tree, &opened.ub);
        if opts.readonly {
            for leaf in tree.tops.iter().flat_map(|t| t.children.iter()) {
                leaf.set_read_only();
            }
        }
        let scan = config.scan.clone().unwrap_or_default();
        let (ub, volumes) = (opened.ub, opened.volumes);
        let pool = Self::assemble(
            config,
            tree.tops,
            opened.alloc,
            opts,
            opened.mos,
            opened.txg,
            config_gen,
        );
        assert!(
            pool.synced_txg() >= opened.txg,
            "the pool opens at the txg import chose"
        );
        pool.open_volumes(volumes, &ub)?;
        pool.index_snapshots();
        *pool.scanning.scan.lock() = scan;
        pool.import_notes.lock().extend(tree.notes);
        pool.upgrade_features()?;
        pool.refresh_reservations();
        pool.finish_import()?;
        Ok(pool)
    }

    /// Brings a pool written by an older zeta up to this one's features, as a read-write
    /// import finds it. Without `org.zeta:space_used` it keeps no figure of the bytes each
    /// volume's blocks take: they are counted from the trees now (a read-only import keeps
    /// them in memory), written (every volume's objset block anew, in one txg), and the
    /// feature marked active once that txg has committed, so a crash in between leaves the
    /// pool as it was. Every other feature this zeta has is then active too (what an older
    /// pool holds means the same under it: no reservation is a zero one); `finish_import`
    /// writes the config. Without `org.zeta:compression` the dnodes keep no logical and
    /// stored sizes: counted the same way, in the same txg.
    fn upgrade_features(&self) -> Result<(), PoolError> {
        let features = self.config.lock().features.clone();
        let (space_used, compression) = (
            feature::is_active(&features, &SPACE_USED),
            feature::is_active(&features, &feature::COMPRESSION),
        );
        if !space_used || !compression {
            for ds in self.datasets() {
                let (used, sizes) = ds.object.used_recounted(&self.io)?;
                if !space_used {
                    ds.object.set_used_bytes(used);
                }
                ds.object.set_sizes(sizes);
            }
            if !self.opts.readonly {
                let mut mos = self.mos.lock();
                mos.rewrite_objsets = true;
                mos.dir_dirty = true;
                drop(mos);
                self.sync_now()?;
            }
        }
        if self.opts.readonly {
            return Ok(());
        }
        let mut cfg = self.config.lock();
        for f in feature::SUPPORTED {
            if !feature::is_active(&cfg.features, f) {
                cfg.features
                    .insert(f.name.to_string(), FeatureState::active(f));
            }
        }
        Ok(())
    }

    /// Opens every volume's intent log and makes the volumes the pool's. A log with records
    /// newer than the tree keeps them for its replay; the others start a new chain.
    fn open_volumes(&self, volumes: Vec<LoadedVolume>, ub: &Uberblock) -> Result<(), PoolError> {
        let (discard_log, readonly) = (self.opts.discard_log, self.opts.readonly);
        let mut opened = Vec::new();
        // Whether a log waits for its replay: then the first txg to commit, whatever it
        // holds, must carry the txg counted from (`Log::replay_after`). Marked only once the
        // volumes are the pool's: the sync thread runs already, and a txg committed in
        // between wrote a directory without them (a crash then lost every volume).
        let mut replaying = false;
        for LoadedVolume {
            mut ds,
            zil: header,
            replay_after,
        } in volumes
        {
            // Records newer than the tree are replayed; a replay cut short by a crash kept
            // the txg it counted from, which may be older.
            let after = match replay_after {
                0 => ub.tree_txg(),
                t => t.min(ub.tree_txg()),
            };
            let (log, claims) = self.open_log(&ds.name, header, after, discard_log)?;
            if readonly {
                // A replay writes: the volume reads as of the last txg, and the log stays on
                // disk for the next read-write import.
                if let Some(n) = log.pending_replay().map(|r| r.len()) {
                    self.import_notes.lock().push(format!(
                        "{}/{}: read-only: {n} intent-log records written after txg {after} \
                         are not replayed; the volume reads as of that txg until the pool is \
                         imported read-write",
                        self.name, ds.name
                    ));
                }
                ds.log = Log::off();
                opened.push(ds);
                continue;
            }
            replaying |= log.replay_after() != 0;
            ds.log = log;
            *ds.replay_claims.lock() = claims;
            opened.push(ds);
        }
        // Every chain is claimed: the logs with nothing to replay start anew.
        for ds in opened.iter().filter(|_| !readonly) {
            if ds.log.pending_replay().is_none() {
                ds.log.start_chain(&self.zil, 0);
            }
        }
        {
            let mut map = self.datasets.write();
            for ds in opened {
                let name = ds.name.clone();
                let before = map.insert(name.clone(), Arc::new(ds));
                assert!(before.is_none(), "volume {name} loaded twice");
            }
        }
        if replaying {
            self.mos.lock().dir_dirty = true;
        }
        Ok(())
    }

    /// The import's last step: the config recorded as active here, and a scrub or resilver
    /// that was running when the pool closed goes on where it was; leaves owed txgs get a
    /// resilver.
    fn finish_import(self: &Arc<Self>) -> Result<(), PoolError> {
        self.write_config(PoolState::Active)?;
        self.allow_ganging();
        self.resume_scrub();
        self.start_resilver();
        Ok(())
    }
}

/// Why a phase refused the import: words for `CannotImport`, or an error of its own.
enum Refused {
    Why(String),
    Pool(PoolError),
}

impl From<PoolError> for Refused {
    fn from(e: PoolError) -> Refused {
        Refused::Pool(e)
    }
}

fn cannot_import(pool: &str) -> impl Fn(String) -> PoolError + '_ {
    move |why| PoolError::CannotImport {
        pool: pool.to_string(),
        why,
    }
}

fn newest_config(members: &[Member]) -> PoolConfig {
    (members.iter().max_by_key(|m| m.generation))
        .map(|m| m.config.clone())
        .expect("a pool found has a device")
}

/// Reads every device's labels, groups them by pool, and picks the pool named (or the only
/// one that is not destroyed).
fn find(
    devices: Vec<(Arc<dyn BlockDevice>, String)>,
    name: Option<&str>,
) -> Result<Found, PoolError> {
    let mut pools: HashMap<u64, Vec<Member>> = HashMap::new();
    let mut unreadable = Vec::new();
    for (dev, path) in devices {
        let probe = Leaf::new(dev.clone(), 0);
        match read_labels(&probe) {
            Ok(l) => match l.config {
                Some((generation, config)) => {
                    pools.entry(config.pool_guid).or_default().push(Member {
                        dev,
                        path,
                        generation,
                        config,
                        uberblocks: l.uberblocks,
                    })
                }
                None => unreadable.push(format!(
                    "{path}: no valid label ({})",
                    l.describe_errors(|_| true)
                )),
            },
            Err(LabelError::UnknownVersion(v)) => {
                return Err(PoolError::CannotImport {
                    pool: name.unwrap_or("?").to_string(),
                    why: format!(
                        "{path}: format version {v} is newer than this zeta supports \
                         ({FORMAT_VERSION})"
                    ),
                })
            }
            Err(e) => unreadable.push(format!("{path}: {e}")),
        }
    }
    let mut candidates: Vec<u64> = (pools.iter())
        .filter(|(_, v)| {
            let cfg = newest_config(v);
            cfg.state != PoolState::Destroyed && name.is_none_or(|n| n == cfg.name)
        })
        .map(|(g, _)| *g)
        .collect();
    candidates.sort();
    let guid = match candidates.as_slice() {
        [g] => *g,
        [] => {
            let detail = if unreadable.is_empty() {
                String::new()
            } else {
                format!(": {}", unreadable.join("; "))
            };
            return Err(PoolError::NotFound(match name {
                Some(n) => format!(" named '{n}'{detail}"),
                None => detail,
            }));
        }
        _ => {
            let names: Vec<String> = (candidates.iter())
                .map(|g| newest_config(&pools[g]).name)
                .collect();
            return Err(invalid(format!(
                "several pools found ({}); name the one to import",
                names.join(", ")
            )));
        }
    };
    let members = pools.remove(&guid).expect("a candidate is a pool found");
    assert!(members.iter().all(|m| m.config.pool_guid == guid));
    Ok(Found {
        guid,
        members,
        unreadable,
    })
}

/// Checks the config against this zeta (its features) and this host (who had the pool
/// last), and applies the options that change it (a new holder, a new name).
fn admit(config: &mut PoolConfig, opts: &PoolOptions) -> Result<(), String> {
    // A feature this zeta does not know, in use, is a format it cannot read (or must not
    // write): refuse it by name before anything is opened.
    crate::spa::feature::check(&config.features, opts.readonly).map_err(|e| e.to_string())?;
    if opts.readonly && opts.rename.is_some() {
        return Err("a read-only import cannot rename the pool: its labels are not written".into());
    }
    if let Some(holder) = &opts.holder {
        let (host, holder) = (Some(hostname()), Some(cut_to(holder, MAX_HOLDER_BYTES)));
        // A config from before zeta recorded holders tells nothing either way.
        let recorded = config.hostname.is_some() || config.holder.is_some();
        let elsewhere = config.hostname != host || config.holder != holder;
        if config.state == PoolState::Active && recorded && elsewhere && !opts.force {
            return Err(format!(
                "it was not exported, and was last imported on host {} by {}: it may be in use \
                 there. If it is not, import it with -f",
                config.hostname.as_deref().unwrap_or("?"),
                config.holder.as_deref().unwrap_or("?")
            ));
        }
        // A read-only import writes no label, so the pool stays recorded as whoever had it
        // last.
        if !opts.readonly {
            (config.hostname, config.holder) = (host, holder);
        }
    }
    if let Some(new) = &opts.rename {
        if !valid_volume_name(new) || new.contains(':') {
            return Err(format!(
                "invalid pool name '{new}': use letters, digits, '-', '_', '.'"
            ));
        }
        config.name = new.clone();
    }
    Ok(())
}

/// Builds the vdev tree from the config, matching leaves to the devices found by GUID. A
/// device that is absent, truncated or unusable keeps its place, out of service, as long as
/// its vdev's redundancy covers it; a missing log device only with `--discard-log`.
fn build_tree(config: &mut PoolConfig, found: Found, opts: &PoolOptions) -> Result<Tree, Refused> {
    let Found {
        guid,
        members,
        unreadable,
    } = found;
    let pool_name = config.name.clone();
    let mut by_guid: HashMap<u64, (Arc<dyn BlockDevice>, String)> = HashMap::new();
    let mut uberblocks: Vec<Uberblock> = Vec::new();
    let mut took: HashMap<u64, u64> = HashMap::new();
    for m in members {
        let newest = (m.uberblocks.iter())
            .filter(|u| u.pool_guid.get() == guid)
            .map(|u| u.txg.get());
        took.insert(m.config.leaf_guid, newest.max().unwrap_or(0));
        by_guid.insert(m.config.leaf_guid, (m.dev, m.path));
        uberblocks.extend(m.uberblocks);
    }
    uberblocks.retain(|u| u.pool_guid.get() == guid);
    // Data vdevs are numbered 0..n and log devices follow with rising ids: the allocator,
    // the metaslab table and the log index by these.
    let n_data = config.tops.iter().filter(|t| !t.log).count();
    let well_formed = n_data > 0
        && (config.tops.iter().enumerate())
            .all(|(i, t)| (i < n_data) != t.log && (t.log || t.id == i as u32))
        && config.tops.windows(2).all(|w| w[0].id < w[1].id);
    if !well_formed {
        return Err(Refused::Why(
            "the config's vdev list is malformed (vdev ids out of order)".into(),
        ));
    }
    let mut tops = Vec::new();
    let mut log_notes = Vec::new();
    // Why each device the config names is not part of the import (beside those not found
    // at all), for the notes and for an import that fails for want of them.
    let mut absent_notes = Vec::new();
    for t in config.tops.iter_mut() {
        // Each leaf holds the whole vdev's space, or its share of a raidz's.
        let leaf_asize = match &t.raidz {
            Some(_) => t.asize / t.children.len() as u64,
            None => t.asize,
        };
        let mut slots: Vec<Option<Arc<Leaf>>> = Vec::new();
        let mut missing = Vec::new();
        for c in t.children.iter_mut() {
            match by_guid.get(&c.guid) {
                Some((dev, path))
                    if dev.len_bytes() < MIN_LEAF_BYTES
                        || crate::vdev::layout::usable_bytes(dev.len_bytes()).unwrap_or(0)
                            < leaf_asize =>
                {
                    // Counted as missing: its redundancy may do without it.
                    missing.push(format!(
                        "{path}: {} bytes, smaller than the {} it had when it joined the pool \
                         (truncated?)",
                        dev.len_bytes(),
                        leaf_asize + 2 * crate::vdev::RESERVE_BYTES
                    ));
                    let leaf = Leaf::missing(&c.path, 0, c.guid);
                    leaf.missed.lock().0 = c.missed.clone();
                    slots.push(Some(Arc::new(leaf)));
                }
                Some((dev, _)) if dev.read_only() && !opts.readonly => {
                    return Err(Refused::Why(format!(
                        "{}: opened read-only, for a pool imported read-write",
                        dev.name()
                    )));
                }
                Some((dev, path)) => {
                    c.path = path.clone();
                    let leaf = Leaf::new(dev.clone(), c.guid);
                    let e = c.errors;
                    (leaf.counters).set([e.read, e.write, e.cksum, e.repaired_bytes]);
                    leaf.set_offline(c.offline);
                    leaf.set_faulted(c.faulted);
                    leaf.missed.lock().0 = c.missed.clone();
                    slots.push(Some(Arc::new(leaf)));
                }
                None => {
                    // Its place is kept, out of service, until it returns or is replaced.
                    missing.push(c.path.clone());
                    let leaf = Leaf::missing(&c.path, 0, c.guid);
                    leaf.missed.lock().0 = c.missed.clone();
                    slots.push(Some(Arc::new(leaf)));
                }
            }
        }
        assert_eq!(
            slots.len(),
            t.children.len(),
            "a slot per child the config names"
        );
        let tolerable = match (&t.raidz, t.kind) {
            (Some(rz), _) => rz.nparity as usize,
            (None, TopKind::Mirror) => t.children.len() - 1,
            _ => 0,
        };
        let lost = missing.len() > tolerable;
        if lost && t.log {
            // The log device may hold the only copy of writes acknowledged after the last
            // txg: going on without it must be asked for.
            if !opts.discard_log {
                return Err(Refused::Why(format!(
                    "log device {} is missing: it may hold writes acknowledged after the last \
                     txg. Bring it back, or import with --discard-log to give them up (the pool \
                     then opens at its last txg)",
                    missing.join(", ")
                )));
            }
            log_notes.push(format!(
                "{pool_name}: log device {} missing: writes acknowledged after the last txg and \
                 logged there are lost; `zeta pool remove {pool_name} {}` drops it",
                missing.join(", "),
                missing[0]
            ));
        } else if lost {
            let also = if unreadable.is_empty() {
                String::new()
            } else {
                format!(
                    " (devices given that could not be used: {})",
                    unreadable.join("; ")
                )
            };
            return Err(Refused::Why(format!(
                "vdev {} ({}) is missing {} of {} devices and can lose at most {tolerable}: \
                 {}{also}",
                t.id,
                t.kind_name(),
                missing.len(),
                t.children.len(),
                missing.join(", ")
            )));
        } else if !missing.is_empty() {
            absent_notes.push(format!(
                "vdev {} ({}) is DEGRADED, without {}",
                t.id,
                t.kind_name(),
                missing.join(", ")
            ));
        }
        let vdev = match t.raidz {
            Some(rz) => TopVdev::new_raidz(t.id, t.guid, rz, slots)
                .map_err(|e| Refused::Why(e.to_string()))?,
            None => TopVdev::new(t.id, t.guid, t.kind, slots.into_iter().flatten().collect()),
        };
        // (A log device with every leaf missing has no size of its own to check.)
        if vdev.asize_bytes < t.asize && !lost {
            return Err(Refused::Why(format!(
                "vdev {} is smaller than recorded",
                t.id
            )));
        }
        tops.push(Arc::new(vdev));
    }
    assert_eq!(
        tops.len(),
        config.tops.len(),
        "a vdev per vdev the config names"
    );
    log_notes.extend(absent_notes);
    Ok(Tree {
        tops,
        n_data,
        uberblocks,
        took,
        notes: log_notes,
    })
}

/// Opens the newest uberblock whose tree loads and verifies; older ones are the fallback. New
/// txgs must outrank every uberblock skipped on the way (a read-only pool has no new txgs,
/// and writes nothing).
fn open_newest(config: &PoolConfig, tree: &Tree, opts: &PoolOptions) -> Result<Opened, Refused> {
    let data_tops: Vec<Arc<TopVdev>> = tree.tops[..tree.n_data].to_vec();
    let mut uberblocks = tree.uberblocks.clone();
    uberblocks.sort_by_key(|u| std::cmp::Reverse(u.txg.get()));
    uberblocks.dedup_by_key(|u| u.txg.get());
    let Some(newest_seen) = uberblocks.first().map(|u| u.txg.get()) else {
        return Err(Refused::Why("no valid uberblock on any device".into()));
    };
    let mut failures = Vec::new();
    for ub in uberblocks {
        let alloc = Allocator::new(&alloc_geometry(config));
        let probe_zio = Arc::new(Zio::new(data_tops.clone(), alloc));
        let probe_io = ObjectIo {
            zio: probe_zio.clone(),
            cache: Arc::new(BlockCache::new(opts.cache_bytes)),
        };
        match load_mos(&probe_io, &ub) {
            Ok((mos, volumes)) => {
                let alloc = std::mem::replace(&mut *probe_zio.alloc.lock(), Allocator::new(&[]));
                let txg = if opts.readonly {
                    ub.txg.get()
                } else {
                    commit_above_skipped(&tree.tops, tree.n_data, &ub, newest_seen)?
                };
                assert!(
                    opts.readonly || txg >= newest_seen,
                    "new txgs start above every uberblock seen"
                );
                return Ok(Opened {
                    ub,
                    mos,
                    volumes,
                    alloc,
                    txg,
                });
            }
            Err(e) => failures.push(format!("txg {}: {e}", ub.txg.get())),
        }
    }
    Err(Refused::Why(format!(
        "no uberblock's tree verifies: {}",
        failures.join("; ")
    )))
}

/// A leaf whose newest uberblock is older than the tree's missed the txgs between: it was
/// offline, or dropped from a txg for a failed write, and the crash came before the labels
/// recorded it (they are written at such moments, not every txg). It is owed them.
fn owe_missed_txgs(tree: &Tree, ub: &Uberblock) {
    for top in &tree.tops[..tree.n_data] {
        for leaf in top.children.iter().filter(|l| !l.is_missing()) {
            let last = tree.took.get(&leaf.guid()).copied().unwrap_or(0);
            if last < ub.txg.get() {
                leaf.missed.lock().add_range([last + 1, ub.txg.get()]);
            }
        }
    }
}
