//! Changes to the pool's devices while it runs: replacing a leaf, taking one offline or
//! back, adding and removing log devices, fault injection for tests, clearing error counts;
//! and building a top-level vdev from its spec.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::dmu::object::walk;
use crate::spa::label::{
    encode_config, fit_config, read_labels, write_config, LabelError, LeafConfig, PoolConfig,
    PoolState, TopConfig,
};
use crate::spa::metaslab::{log_reserve_for, ms_shift_for};
use crate::vdev::{BlockDevice, Leaf, RaidzConfig, TopKind, TopVdev};

use super::{
    config_too_large, invalid, random_guid, Pool, PoolError, Shape, TopSpec, MIN_LEAF_BYTES,
};

/// The answer to a device command that does not apply to log devices.
fn log_device_only(dev: &str, vdev: u32) -> PoolError {
    invalid(format!(
        "{dev} belongs to log device {vdev}: log devices are only added and removed \
         (`zeta pool add POOL log ...`, `zeta pool remove POOL {dev}`)"
    ))
}

/// Opens a new top-level vdev from its spec (a pool being created, or a log device being
/// added) and writes down its config; checks that its devices are big enough and, unless
/// `force`, that none belongs to another pool.
pub(super) fn build_top(
    id: u32,
    top: TopSpec,
    force: bool,
) -> Result<(TopVdev, TopConfig), PoolError> {
    match top.shape {
        Shape::Stripe if top.leaves.len() != 1 => {
            return Err(invalid("a stripe vdev has exactly one device"))
        }
        Shape::Mirror if top.leaves.len() < 2 => {
            return Err(invalid("a mirror needs at least two devices"))
        }
        Shape::Raidz(_) if top.log => {
            return Err(invalid(
                "a log device is a single device or a mirror, not a raidz",
            ))
        }
        // Re-derive the checks the config's constructor makes: a spec may come from
        // elsewhere than the CLI.
        Shape::Raidz(rz) => {
            RaidzConfig::new(rz.nparity, top.leaves.len(), false)?;
        }
        _ => {}
    }
    let mut leaves = Vec::new();
    let mut children = Vec::new();
    for (dev, path) in top.leaves {
        if dev.len_bytes() < MIN_LEAF_BYTES {
            return Err(invalid(format!(
                "{path}: too small ({} bytes); a device needs at least {} MiB",
                dev.len_bytes(),
                MIN_LEAF_BYTES >> 20
            )));
        }
        let leaf = Leaf::new(dev, random_guid());
        if !force {
            check_unused(&leaf, &path)?;
        }
        children.push(LeafConfig {
            guid: leaf.guid(),
            path,
            errors: Default::default(),
            offline: false,
            faulted: false,
            missed: Vec::new(),
        });
        leaves.push(Arc::new(leaf));
    }
    let vdev = match top.shape.raidz() {
        Some(rz) => TopVdev::new_raidz(
            id,
            random_guid(),
            rz,
            leaves.into_iter().map(Some).collect(),
        )?,
        None => TopVdev::new(id, random_guid(), top.shape.kind(), leaves),
    };
    let shift = ms_shift_for(vdev.asize_bytes);
    // A log device is all log space; a data vdev keeps a reserve at its end.
    let log_bytes = if top.log {
        vdev.asize_bytes
    } else {
        log_reserve_for(vdev.asize_bytes, shift)
    };
    let cfg = TopConfig {
        id,
        guid: vdev.guid,
        kind: top.shape.kind(),
        asize: vdev.asize_bytes,
        ms_shift: shift,
        ms_count: (vdev.asize_bytes - log_bytes).div_ceil(1 << shift) as u32,
        children,
        raidz: top.shape.raidz(),
        log_bytes,
        log: top.log,
    };
    Ok((vdev, cfg))
}

/// Refuses a device that may be in use: one whose labels name a pool that is not destroyed, or
/// that carries a zeta label this zeta cannot read (a newer format, or every copy damaged), so
/// that nobody can tell whether it is in use. A device without any zeta label is free; `-f`
/// skips this check.
fn check_unused(leaf: &Leaf, path: &str) -> Result<(), PoolError> {
    let unreadable = |why: String| PoolError::UnreadableLabel {
        path: path.to_string(),
        why,
    };
    let labels = match read_labels(leaf) {
        Ok(labels) => labels,
        Err(e) if e.label_present() => return Err(unreadable(e.to_string())),
        // The device itself failed: say so rather than guess what it holds.
        Err(e) => return Err(e.into()),
    };
    match labels.config {
        Some((_, cfg)) if cfg.state != PoolState::Destroyed => Err(PoolError::InUse {
            path: path.to_string(),
            pool: cfg.name,
            state: cfg.state,
        }),
        Some(_) => Ok(()),
        None if labels.errors.iter().any(|(_, e)| e.label_present()) => Err(unreadable(
            labels.describe_errors(LabelError::label_present),
        )),
        None => Ok(()),
    }
}

impl Pool {
    /// Replaces leaf `old` (present or missing; its path as status shows it, or its GUID) by
    /// a new device, in place while the pool runs: the new device takes the leaf's position
    /// with a fresh GUID, owing every txg so far, and a resilver rebuilds it in full while
    /// the pool serves I/O. A stripe has nothing to rebuild from and cannot be replaced.
    pub fn replace(
        self: &Arc<Self>,
        old: &str,
        new_dev: Arc<dyn BlockDevice>,
        new_path: String,
        force: bool,
    ) -> Result<(), PoolError> {
        self.check_writable()?;
        let cfg = self.config.lock().clone();
        let Some((t, ci)) = cfg.tops.iter().enumerate().find_map(|(t, tc)| {
            tc.children
                .iter()
                .position(|c| c.path == old || c.guid.to_string() == old)
                .map(|ci| (t, ci))
        }) else {
            return Err(invalid(format!(
                "pool '{}' has no device {old} (see `zeta pool status`)",
                self.name
            )));
        };
        let tc = &cfg.tops[t];
        if tc.log {
            return Err(log_device_only(old, tc.id));
        }
        if tc.kind == TopKind::Stripe {
            return Err(invalid(format!(
                "{old} is a stripe vdev of its own: there is no redundancy to rebuild it from"
            )));
        }
        if cfg
            .tops
            .iter()
            .flat_map(|t| &t.children)
            .any(|c| c.path == new_path)
        {
            return Err(invalid(format!(
                "{new_path} is already part of pool '{}'",
                self.name
            )));
        }
        let need = match &tc.raidz {
            Some(_) => tc.asize / tc.children.len() as u64,
            None => tc.asize,
        };
        if new_dev.len_bytes() < MIN_LEAF_BYTES
            || crate::vdev::layout::usable_bytes(new_dev.len_bytes()).unwrap_or(0) < need
        {
            return Err(invalid(format!(
                "{new_path}: too small ({} bytes) to replace {old}",
                new_dev.len_bytes()
            )));
        }
        let old_guid = tc.children[ci].guid;
        let Some(leaf) = self.io.zio.tops[t]
            .children
            .iter()
            .find(|l| l.guid() == old_guid)
            .cloned()
        else {
            return Err(invalid(format!("{old}: not in the running vdev tree")));
        };
        let probe = Leaf::new(new_dev.clone(), random_guid());
        if !force {
            check_unused(&probe, &new_path)?;
        }
        let new_guid = probe.guid();
        // The new path may be longer than the old: the labels must still hold the config.
        let mut grown = cfg.clone();
        grown.tops[t].children[ci].path = new_path.clone();
        Pool::check_config_room(&grown)?;
        self.sync_now()?;
        {
            // No sync runs while the MOS lock is held: every txg up to the last synced one
            // is owed to the new device, and every later one is written to it.
            let _mos = self.mos.lock();
            let owed = self.synced_txg().max(1);
            let mut missed = crate::vdev::TxgRanges::default();
            missed.add_range([1, owed]);
            self.config.lock().tops[t].children[ci] = LeafConfig {
                guid: new_guid,
                path: new_path,
                errors: Default::default(),
                offline: false,
                faulted: false,
                missed: missed.0.clone(),
            };
            // The new device's labels first: should the rest not follow, the other leaves'
            // labels still name the old device and nothing is lost.
            let generation = self.config_gen.load(Ordering::SeqCst) + 1;
            let mut c = self.config_to_write(PoolState::Active);
            fit_config(&mut c).map_err(|e| config_too_large(&e))?;
            c.leaf_guid = new_guid;
            let area = encode_config(&c, generation).map_err(|e| config_too_large(&e))?;
            write_config(&probe, &area, &[0, 1, 2, 3])?;
            probe.flush()?;
            let old_dev = (!leaf.is_missing()).then(|| leaf.dev());
            leaf.swap(new_dev, new_guid, missed);
            let state = self.config.lock().state;
            self.write_config(state)?;
            // The device that left reads as free from now on: its labels would otherwise
            // still name it a member, and an import given only it would take the pool
            // with the wrong devices. Best effort: a device that failed may not take it.
            if let Some(dev) = old_dev {
                let _ = crate::spa::label::clear_labels(&Leaf::new(dev, 0));
            }
        }
        self.start_resilver();
        Ok(())
    }

    /// Whether the labels (the config last written) lag what an import could not find out
    /// for itself: a leaf faulted, offlined or back since, or the txgs an in-service leaf
    /// missed (it may take the next txg whole, after which its uberblock no longer tells).
    /// The txgs a leaf out of service misses need no write: it takes no uberblock meanwhile,
    /// and an import owes it every txg past its newest.
    pub(super) fn labels_behind(&self) -> bool {
        let was = self.config.lock().clone();
        let mut now = was.clone();
        self.record_counters(&mut now);
        let leaves = |c: &PoolConfig| -> Vec<LeafConfig> {
            c.tops.iter().flat_map(|t| t.children.clone()).collect()
        };
        leaves(&now).iter().zip(&leaves(&was)).any(|(n, w)| {
            n.faulted != w.faulted
                || n.offline != w.offline
                || (!n.faulted && !n.offline && n.missed != w.missed)
        })
    }

    /// Copies the leaves' live error counters into `cfg` (leaves not present keep theirs).
    pub(super) fn record_counters(&self, cfg: &mut PoolConfig) {
        let (tops, _) = self.label_tops();
        for (top, tc) in tops.iter().zip(cfg.tops.iter_mut()) {
            for c in tc.children.iter_mut() {
                if let Some(leaf) = top
                    .children
                    .iter()
                    .find(|l| l.guid() == c.guid && !l.is_missing())
                {
                    let [read, write, cksum, repaired_bytes] = leaf.counters.snapshot();
                    c.errors = crate::spa::label::LeafErrors {
                        read,
                        write,
                        cksum,
                        repaired_bytes,
                    };
                    c.offline = leaf.is_admin_offline();
                    c.faulted = leaf.is_faulted();
                    c.missed = leaf.missed.lock().0.clone();
                }
            }
        }
    }

    /// Whether the counters moved since the config was last written.
    pub(super) fn counters_changed(&self) -> bool {
        let saved = self.config.lock().clone();
        let mut now = saved.clone();
        self.record_counters(&mut now);
        now != saved
    }

    /// Finds a leaf by the path the config shows for it (or its GUID in decimal).
    fn find_leaf(&self, dev: &str) -> Result<(usize, Arc<Leaf>), PoolError> {
        let cfg = self.config.lock().clone();
        for (t, (top, tc)) in self.io.zio.tops.iter().zip(&cfg.tops).enumerate() {
            for c in &tc.children {
                if c.path == dev || c.guid.to_string() == dev {
                    return match top.children.iter().find(|l| l.guid() == c.guid) {
                        Some(l) => Ok((t, l.clone())),
                        None => Err(invalid(format!("{dev}: the device is missing"))),
                    };
                }
            }
        }
        if let Some(log) = cfg.tops.iter().find(|t| {
            t.log
                && t.children
                    .iter()
                    .any(|c| c.path == dev || c.guid.to_string() == dev)
        }) {
            return Err(log_device_only(dev, log.id));
        }
        Err(invalid(format!(
            "pool '{}' has no device {dev} (see `zeta pool status`)",
            self.name
        )))
    }

    /// `find_leaf`'s leaf, or one of a separate log device: faults are injected there too
    /// (a log device whose file system fills, or that fails, is worth rehearsing).
    fn find_leaf_or_log_leaf(&self, dev: &str) -> Result<Arc<Leaf>, PoolError> {
        let err = match self.find_leaf(dev) {
            Ok((_, leaf)) => return Ok(leaf),
            Err(e) => e,
        };
        let cfg = self.config.lock().clone();
        let named = cfg
            .tops
            .iter()
            .filter(|t| t.log)
            .flat_map(|t| &t.children)
            .find(|c| c.path == dev || c.guid.to_string() == dev);
        let Some(c) = named else { return Err(err) };
        self.zil
            .log_devices()
            .iter()
            .flat_map(|t| &t.children)
            .find(|l| l.guid() == c.guid && !l.is_missing())
            .cloned()
            .ok_or_else(|| invalid(format!("{dev}: the device is missing")))
    }

    /// Takes a leaf offline (no I/O reaches it; the txgs it misses are recorded) or brings it
    /// back online, which resilvers what it missed. Offline is refused where the vdev would
    /// be left without the redundancy to serve every block.
    pub fn set_offline(self: &Arc<Self>, dev: &str, offline: bool) -> Result<(), PoolError> {
        self.check_writable()?;
        let (t, leaf) = self.find_leaf(dev)?;
        // Missing devices are leaves out of service too.
        let spare = || -> Result<(), PoolError> {
            let top = &self.io.zio.tops[t];
            let unavailable = top.children.iter().filter(|l| l.is_offline()).count() + 1;
            let tolerable = top.redundancy();
            if unavailable > tolerable {
                let cfg = self.config.lock().clone();
                let tc = &cfg.tops[t];
                return Err(invalid(format!(
                    "cannot take {dev} offline: vdev {} ({}) would have {unavailable} of {} \
                     devices unavailable, more than it can lose ({tolerable})",
                    top.id,
                    tc.kind_name(),
                    tc.children.len()
                )));
            }
            Ok(())
        };
        if offline && !leaf.is_admin_offline() {
            spare()?;
        }
        if leaf.is_admin_offline() == offline {
            return Ok(());
        }
        // Writes already in the open txg must not reach a leaf taken offline half-way: sync
        // first, so the leaf misses whole txgs only.
        self.sync_now()?;
        {
            // Counted again with the change, as one step: a sibling may have been faulted
            // during the sync.
            let _one_at_a_time = crate::vdev::leaf::service_change();
            if offline && !leaf.is_offline() {
                spare()?;
            }
            leaf.set_offline(offline);
        }
        {
            let _mos = self.mos.lock();
            let state = self.config.lock().state;
            self.write_config(state)?;
        }
        if !offline {
            self.start_resilver();
        }
        Ok(())
    }

    /// Adds a separate log device (a stripe or a mirror) while the pool runs; log blocks go
    /// there from now on. Returns its vdev id.
    pub fn add_log(self: &Arc<Self>, spec: TopSpec, force: bool) -> Result<u32, PoolError> {
        self.check_writable()?;
        let spec = spec.as_log();
        let mut mos = self.mos.lock();
        let cfg = self.config.lock().clone();
        for (_, path) in &spec.leaves {
            if cfg
                .tops
                .iter()
                .flat_map(|t| &t.children)
                .any(|c| c.path == *path)
            {
                return Err(invalid(format!(
                    "{path} is already in pool '{}'",
                    self.name
                )));
            }
        }
        let id = cfg.tops.last().map_or(0, |t| t.id + 1);
        let (vdev, tc) = build_top(id, spec, force)?;
        let mut grown = cfg.clone();
        grown.tops.push(tc.clone());
        Pool::check_config_room(&grown)?;
        let vdev = Arc::new(vdev);
        // Known to the log (so its labels are written) but not used before they are.
        self.zil
            .add_vdev(vdev.clone(), (0, tc.log_bytes), true, true);
        self.config.lock().tops.push(tc);
        // The new devices' labels first, written and flushed in full: an import takes the
        // newest config it finds, so one naming the new devices must never be found on the
        // old devices alone (found so after a power cut here, the import called the new
        // devices missing and refused to go on without `--discard-log`).
        let written = self
            .write_config_on(std::slice::from_ref(&vdev), 1, cfg.state)
            .and_then(|()| self.write_config(cfg.state));
        if let Err(e) = written {
            self.config.lock().tops.retain(|t| t.id != id);
            let _ = self.zil.remove_vdev(id);
            // Labels that took the new config are overwritten by a newer generation.
            let _ = self.write_config(cfg.state);
            return Err(e);
        }
        self.zil.set_removing(id, false);
        // Volumes of a pool made before the log existed start logging now; their new
        // chains' headers go out with the next txg.
        for ds in self.datasets.read().values() {
            if ds.log.is_off() {
                ds.log.start_chain(&self.zil, 0);
                mos.dir_dirty = true;
            }
        }
        drop(mos);
        self.sync_now()?;
        Ok(id)
    }

    /// Removes a separate log device (`dev`: one of its devices, by path or GUID; a log
    /// mirror goes as a whole) while the pool runs. Log blocks stop going there; every
    /// volume's chain is moved off it and the txgs covering what it holds are committed,
    /// then the config forgets it and its labels are cleared. Returns the paths of the
    /// devices removed.
    pub fn remove_log(self: &Arc<Self>, dev: &str) -> Result<Vec<String>, PoolError> {
        self.check_writable()?;
        let cfg = self.config();
        let named = |t: &TopConfig| {
            t.children
                .iter()
                .any(|c| c.path == dev || c.guid.to_string() == dev)
        };
        let Some(tc) = cfg.tops.iter().find(|t| named(t)) else {
            return Err(invalid(format!(
                "pool '{}' has no device {dev} (see `zeta pool status`)",
                self.name
            )));
        };
        if !tc.log {
            return Err(invalid(format!(
                "{dev} is a data device: only log devices can be removed"
            )));
        }
        let v = tc.id;
        let top = self.zil.top(v);
        self.zil.set_removing(v, true);
        let emptied = (|| -> Result<(), PoolError> {
            // A batch being written when the removal began may still be on its way to the
            // device (a slow device, a loaded machine): wait for it, within reason.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let mut pause = Duration::from_millis(1);
            while std::time::Instant::now() < deadline {
                for ds in self.datasets() {
                    ds.log.move_off(&self.zil, v).map_err(|e| {
                        invalid(format!("volume {}: moving its log off {dev}: {e}", ds.name))
                    })?;
                }
                // A txg moves every header past what it covers and frees it.
                self.mos.lock().dir_dirty = true;
                self.sync_now()?;
                if self.zil.used_on(v) == 0 {
                    return Ok(());
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            let waiting: Vec<String> = self
                .datasets()
                .iter()
                .filter(|d| d.log.pending_replay().is_some())
                .map(|d| d.name.clone())
                .collect();
            Err(invalid(if waiting.is_empty() {
                let held: Vec<String> = self
                    .datasets()
                    .iter()
                    .map(|d| (d.name.clone(), d.log.holdings_on(v)))
                    .filter(|(_, h)| !h.is_empty())
                    .map(|(n, h)| format!("volume {n}: {h}"))
                    .collect();
                format!(
                    "log device {dev} still holds {} bytes of log blocks ({}); try again",
                    self.zil.used_on(v),
                    held.join("; ")
                )
            } else {
                format!(
                    "log device {dev} holds records not yet replayed (volumes {}): open \
                     them first (`zeta serve` does)",
                    waiting.join(", ")
                )
            }))
        })();
        if let Err(e) = emptied {
            self.zil.set_removing(v, false);
            return Err(e);
        }
        {
            let _mos = self.mos.lock();
            if let Err(used) = self.zil.remove_vdev(v) {
                self.zil.set_removing(v, false);
                return Err(invalid(format!(
                    "log device {dev} took {used} bytes of log blocks meanwhile; try again"
                )));
            }
            self.config.lock().tops.retain(|t| t.id != v);
            self.write_config(cfg.state)?;
        }
        // So that the device reads as free (another pool may take it without -f).
        for leaf in top.iter().flat_map(|t| &t.children) {
            if !leaf.is_missing() {
                let _ = crate::spa::label::clear_labels(leaf);
            }
        }
        Ok(tc.children.iter().map(|c| c.path.clone()).collect())
    }

    /// Sets the faults injected on a leaf (`zeta inject`); `Injection::default()` clears them.
    pub fn inject(
        self: &Arc<Self>,
        dev: &str,
        faults: crate::vdev::Injection,
    ) -> Result<(), PoolError> {
        let leaf = self.find_leaf_or_log_leaf(dev)?;
        if !(0.0..=1.0).contains(&faults.fail_reads) || !(0.0..=1.0).contains(&faults.fail_writes) {
            return Err(invalid("a failure probability lies between 0 and 1"));
        }
        *leaf.inject.lock() = faults;
        // A device whose faults are cleared gets what it missed meanwhile.
        if faults == crate::vdev::Injection::default() && !leaf.missed.lock().is_empty() {
            self.start_resilver();
        }
        Ok(())
    }

    /// Overwrites `count` random allocated sectors of a leaf with random bytes, behind the
    /// pool's back (`zeta inject --corrupt`): what silent corruption looks like. Only sectors
    /// that hold volume blocks (data or indirect) on that leaf are chosen. Returns how many
    /// were corrupted (fewer if the leaf holds fewer).
    pub fn corrupt_sectors(&self, dev: &str, count: usize, seed: u64) -> Result<usize, PoolError> {
        self.check_writable()?;
        let (_, leaf) = match self.find_leaf(dev) {
            Err(_) if self.find_leaf_or_log_leaf(dev).is_ok() => {
                return Err(invalid(format!(
                    "{dev} is a log device: it holds no volume blocks for --corrupt to pick \
                     (--fail-reads, --fail-writes, --full and --vanish work there)"
                )))
            }
            found => found?,
        };
        self.sync_now()?;
        let mut bps = Vec::new();
        for ds in self.datasets() {
            walk(&self.io, &ds.object.dnode(), &mut |bp, _| {
                bps.push(*bp);
                Ok(())
            })?;
        }
        Ok(self.io.zio.corrupt_on_leaf(&bps, &leaf, count, seed)?)
    }

    /// Zeroes every leaf's error counters and returns faulted leaves to service (`zeta pool
    /// clear`), in memory and in the labels; those get a resilver of what they missed.
    pub fn clear_errors(self: &Arc<Self>) -> Result<(), PoolError> {
        self.check_writable()?;
        for top in &self.label_tops().0 {
            for leaf in &top.children {
                leaf.counters.set([0; 4]);
                leaf.set_faulted(false);
            }
        }
        {
            let _mos = self.mos.lock();
            let state = self.config.lock().state;
            self.write_config(state)?;
        }
        self.start_resilver();
        Ok(())
    }
}
