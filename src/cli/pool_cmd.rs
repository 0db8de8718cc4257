//! `zeta pool …`

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;

use super::args::PoolCmd;
use super::fmt::{human, parse_size};
use super::state::{device_paths, open_devices, Home};
use super::{usage, CliError, Result};
use crate::dsl::{probe, Pool, PoolOptions, TopSpec};
use crate::math::ChecksumKind;
use crate::spa::props::{CommitPolicy, Placement};
use crate::vdev::{BlockDevice, FileDevice, RaidzConfig, TopKind};

pub fn run(home: &Home, cmd: PoolCmd) -> Result<()> {
    match cmd {
        PoolCmd::Create {
            force,
            props,
            pool,
            vdevs,
        } => create(home, force, &props, &pool, &vdevs),
        PoolCmd::Import {
            dirs,
            pool,
            json,
            discard_log,
        } => import(home, &dirs, pool.as_deref(), json, discard_log),
        PoolCmd::Export { pool } => {
            let p = home.open(&pool)?;
            p.export()?;
            home.forget(&pool)?;
            println!("exported '{pool}'");
            Ok(())
        }
        PoolCmd::List { json } => list(home, json),
        PoolCmd::Scrub { wait, stop, pool } => scrub(home, &pool, wait, stop),
        PoolCmd::Replace {
            force,
            pool,
            old,
            new,
        } => replace(home, force, &pool, &old, &new),
        PoolCmd::Offline { pool, device } => set_offline(home, &pool, &device, true),
        PoolCmd::Online { pool, device } => set_offline(home, &pool, &device, false),
        PoolCmd::Add {
            force,
            size,
            pool,
            vdevs,
        } => add(home, force, size.as_deref(), &pool, &vdevs),
        PoolCmd::Remove { pool, device } => remove(home, &pool, &device),
        PoolCmd::Clear { pool } => {
            match super::control::connect(home, &pool) {
                Some(conn) => super::control::remote_clear(conn, &pool)?,
                None => {
                    let p = home.open(&pool)?;
                    let r = p.clear_errors();
                    p.close()?;
                    r?;
                }
            }
            println!("cleared the error counters of '{pool}'");
            Ok(())
        }
        PoolCmd::Status { pool, json } => status(home, pool.as_deref(), json),
        PoolCmd::Iostat { pool, json } => iostat(home, &pool, json),
        PoolCmd::Sync { pool } => {
            match super::control::connect(home, &pool) {
                Some(conn) => super::control::remote_sync(conn, &pool)?,
                None => {
                    let p = home.open(&pool)?;
                    p.sync_now()?;
                    p.close()?;
                }
            }
            println!("synced '{pool}'");
            Ok(())
        }
        PoolCmd::Destroy { force, pool } => {
            if !force {
                return Err(usage(format!(
                    "destroying '{pool}' loses all its data; repeat with -f to confirm"
                )));
            }
            let p = home.open(&pool)?;
            p.close()?;
            p.destroy()?;
            home.forget(&pool)?;
            println!("destroyed '{pool}'");
            Ok(())
        }
    }
}

pub struct CreateProps {
    pub size: Option<u64>,
    pub checksum: ChecksumKind,
    /// raidz2 vdevs use RDP instead of Reed-Solomon.
    pub raidz2_rdp: bool,
    pub zil_commit: CommitPolicy,
    pub zil_placement: Placement,
}

pub fn parse_pool_props(props: &[String]) -> Result<CreateProps> {
    let mut out = CreateProps {
        size: None,
        checksum: ChecksumKind::Fletcher4,
        raidz2_rdp: false,
        zil_commit: CommitPolicy::default(),
        zil_placement: Placement::default(),
    };
    for p in props {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| usage(format!("property '{p}' is not KEY=VALUE")))?;
        match k {
            "size" => out.size = Some(parse_size(v)?),
            "checksum" => {
                out.checksum = ChecksumKind::parse(v).ok_or_else(|| {
                    usage(format!(
                        "checksum '{v}' is not one of {}",
                        ChecksumKind::NAMES
                    ))
                })?
            }
            "raidz2-code" => {
                out.raidz2_rdp = match v {
                    "rs" => false,
                    "rdp" => true,
                    _ => return Err(usage(format!("raidz2-code '{v}' is not one of rs, rdp"))),
                }
            }
            "zil.commit" => {
                out.zil_commit = CommitPolicy::parse(v).ok_or_else(|| {
                    usage(format!("zil.commit '{v}' is not one of group, per-request"))
                })?
            }
            "zil.placement" => {
                out.zil_placement = Placement::parse(v).ok_or_else(|| {
                    usage(format!(
                        "zil.placement '{v}' is not one of global, per-volume"
                    ))
                })?
            }
            _ => {
                return Err(usage(format!(
                    "unknown property '{k}' (pool properties: size, checksum, raidz2-code, \
                     zil.commit, zil.placement)"
                )))
            }
        }
    }
    Ok(out)
}

/// One top-level vdev named on the command line.
#[derive(Debug, PartialEq, Eq)]
pub struct VdevGroup {
    pub kind: TopKind,
    /// Parity level of a raidz, 0 otherwise.
    pub nparity: u32,
    pub paths: Vec<PathBuf>,
    /// A separate log device (named after the `log` keyword).
    pub log: bool,
}

/// Splits `a mirror b c raidz2 d e f g log h` into top-level groups: [a], mirror[b c],
/// raidz2[d e f g], log[h]. A group keyword (`mirror`, `raidz`, `raidz1`, `raidz2`,
/// `raidz3`) takes every path up to the next keyword; after `log`, every group is a log
/// device (a path, or `mirror PATH...`).
pub fn parse_vdevs(words: &[String]) -> Result<Vec<VdevGroup>> {
    let mut out: Vec<VdevGroup> = Vec::new();
    let mut in_group = false;
    let mut log = false;
    for w in words {
        if w == "log" {
            if log {
                return Err(usage("`log` given twice"));
            }
            log = true;
            in_group = false;
            continue;
        }
        let group = match w.as_str() {
            "mirror" => Some((TopKind::Mirror, 0)),
            "raidz" | "raidz1" => Some((TopKind::Raidz, 1)),
            "raidz2" => Some((TopKind::Raidz, 2)),
            "raidz3" => Some((TopKind::Raidz, 3)),
            _ => None,
        };
        if let Some((kind, nparity)) = group {
            if log && kind == TopKind::Raidz {
                return Err(usage(
                    "a log device is a single device or a mirror, not a raidz",
                ));
            }
            out.push(VdevGroup {
                kind,
                nparity,
                paths: Vec::new(),
                log,
            });
            in_group = true;
        } else if in_group {
            out.last_mut().unwrap().paths.push(PathBuf::from(w));
        } else {
            out.push(VdevGroup {
                kind: TopKind::Stripe,
                nparity: 0,
                paths: vec![PathBuf::from(w)],
                log,
            });
        }
    }
    if log && !out.iter().any(|g| g.log) {
        return Err(usage(
            "`log` names no device: log PATH, or log mirror PATH PATH",
        ));
    }
    for g in &out {
        match g.kind {
            TopKind::Mirror if g.paths.len() < 2 => {
                return Err(usage(
                    "a mirror needs at least two devices: mirror PATH PATH...",
                ))
            }
            TopKind::Raidz => {
                RaidzConfig::new(g.nparity, g.paths.len(), false).map_err(usage)?;
            }
            _ => {}
        }
    }
    if out.is_empty() {
        return Err(usage("no devices given"));
    }
    Ok(out)
}

fn absolute(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or(p.to_path_buf())
    })
}

pub fn create(
    home: &Home,
    force: bool,
    props: &[String],
    name: &str,
    vdevs: &[String],
) -> Result<()> {
    let pool = create_pool(home, force, props, name, vdevs)?;
    let space = pool.space();
    pool.close()?;
    println!("created pool '{name}' ({} usable)", human(space.size));
    Ok(())
}

pub fn create_pool(
    home: &Home,
    force: bool,
    props: &[String],
    name: &str,
    vdevs: &[String],
) -> Result<Arc<Pool>> {
    let props = parse_pool_props(props)?;
    let groups = parse_vdevs(vdevs)?;
    if home.load()?.pools.contains_key(name) {
        return Err(usage(format!("a pool named '{name}' is already imported")));
    }
    // Check every path before creating anything, so a bad argument leaves no files behind.
    let mut seen = HashSet::new();
    for g in &groups {
        for p in &g.paths {
            let abs = absolute(p);
            if !seen.insert(abs.clone()) {
                return Err(usage(format!("{}: named twice", p.display())));
            }
            if !p.exists() && props.size.is_none() {
                return Err(usage(format!(
                    "{}: does not exist (give -o size=SIZE to create file vdevs)",
                    p.display()
                )));
            }
        }
    }
    let mut created: Vec<PathBuf> = Vec::new();
    let result = (|| -> Result<Arc<Pool>> {
        let spec = open_groups(&groups, props.size, props.raidz2_rdp, &mut created)?;
        let opts = PoolOptions {
            checksum: props.checksum,
            force,
            zil_commit: props.zil_commit,
            zil_placement: props.zil_placement,
            ..Default::default()
        };
        Ok(Pool::create(name, spec, opts)?)
    })();
    match result {
        Ok(pool) => {
            home.remember(&pool, device_paths(&pool))?;
            Ok(pool)
        }
        Err(e) => {
            for p in created {
                let _ = std::fs::remove_file(p);
            }
            Err(e)
        }
    }
}

/// Opens (or creates, at `size`, the missing files among) the devices of parsed vdev groups;
/// records the files it created in `created`.
fn open_groups(
    groups: &[VdevGroup],
    size: Option<u64>,
    raidz2_rdp: bool,
    created: &mut Vec<PathBuf>,
) -> Result<Vec<TopSpec>> {
    let mut spec = Vec::new();
    for g in groups {
        let mut leaves = Vec::new();
        for p in &g.paths {
            let dev = match (p.exists(), size) {
                (true, _) => FileDevice::open(p)?,
                (false, Some(size)) => {
                    let dev = FileDevice::create(p, size)?;
                    created.push(p.clone());
                    dev
                }
                (false, None) => {
                    return Err(usage(format!(
                        "{}: does not exist (give a size to create a file)",
                        p.display()
                    )))
                }
            };
            leaves.push((
                Arc::new(dev) as Arc<dyn BlockDevice>,
                absolute(p).display().to_string(),
            ));
        }
        let top = match g.kind {
            TopKind::Raidz => TopSpec::raidz(
                RaidzConfig::new(g.nparity, leaves.len(), raidz2_rdp).map_err(usage)?,
                leaves,
            ),
            TopKind::Mirror => TopSpec::mirror(leaves),
            TopKind::Stripe => TopSpec::stripe(leaves.pop().expect("one device")),
        };
        spec.push(if g.log { top.as_log() } else { top });
    }
    Ok(spec)
}

/// `zeta pool add`: log devices for a pool, through its server if it is served.
fn add(home: &Home, force: bool, size: Option<&str>, name: &str, vdevs: &[String]) -> Result<()> {
    if vdevs.first().map(String::as_str) != Some("log") {
        return Err(usage(
            "only log devices can be added: zeta pool add POOL log PATH... (or log mirror PATH PATH)",
        ));
    }
    let size = size.map(parse_size).transpose()?;
    // Paths as seen from here: the server's working directory is not ours.
    let words: Vec<String> = vdevs
        .iter()
        .map(|w| match w.as_str() {
            "log" | "mirror" | "raidz" | "raidz1" | "raidz2" | "raidz3" => w.clone(),
            _ => absolute(Path::new(w)).display().to_string(),
        })
        .collect();
    parse_vdevs(&words)?;
    let ids = match super::control::connect(home, name) {
        Some(conn) => super::control::remote_add_log(conn, name, &words, size, force)?,
        None => {
            let p = home.open(name)?;
            let r = add_log_in(&p, &words, size, force);
            p.close()?;
            r?
        }
    };
    let mut cache = home.load()?;
    if let Some(entry) = cache.pools.get_mut(name) {
        for w in &words[1..] {
            let path = PathBuf::from(w);
            if w != "mirror" && !entry.devices.contains(&path) {
                entry.devices.push(path);
            }
        }
        home.save(&cache)?;
    }
    println!(
        "added log device{} {} to '{name}'",
        if ids.len() > 1 { "s" } else { "" },
        words[1..].join(" ")
    );
    Ok(())
}

/// Adds the log devices `words` (`log ...`, absolute paths) to `p`; returns their vdev ids.
/// Files this created are removed again if the add fails.
pub fn add_log_in(
    p: &Arc<Pool>,
    words: &[String],
    size: Option<u64>,
    force: bool,
) -> Result<Vec<u32>> {
    let groups = parse_vdevs(words)?;
    if groups.iter().any(|g| !g.log) {
        return Err(usage("only log devices can be added"));
    }
    let mut created = Vec::new();
    let r = (|| -> Result<Vec<u32>> {
        let spec = open_groups(&groups, size, false, &mut created)?;
        let mut ids = Vec::new();
        for top in spec {
            ids.push(p.add_log(top, force)?);
        }
        Ok(ids)
    })();
    if r.is_err() {
        for f in created {
            let _ = std::fs::remove_file(f);
        }
    }
    r
}

/// `zeta pool remove`: a log device, through the pool's server if it is served.
fn remove(home: &Home, name: &str, device: &str) -> Result<()> {
    let gone = match super::control::connect(home, name) {
        Some(conn) => super::control::remote_remove(conn, name, device)?,
        None => {
            let p = home.open(name)?;
            let r = p.remove_log(device);
            p.close()?;
            r?
        }
    };
    let mut cache = home.load()?;
    if let Some(entry) = cache.pools.get_mut(name) {
        entry
            .devices
            .retain(|d| !gone.iter().any(|g| Path::new(g) == d));
        home.save(&cache)?;
    }
    println!("removed log device {} from '{name}'", gone.join(" "));
    Ok(())
}

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

fn import(
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
    for note in pool.import_notes.lock().iter() {
        eprintln!("warning: {note}");
    }
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

fn list(home: &Home, json: bool) -> Result<()> {
    let cache = home.load()?;
    let mut rows = Vec::new();
    for name in cache.pools.keys() {
        let row = match pool_status(home, name) {
            Ok(st) => {
                let (size, alloc) = (
                    st["size"].as_u64().unwrap_or(0),
                    st["alloc"].as_u64().unwrap_or(0),
                );
                json!({"name": name, "size": size, "alloc": alloc, "free": st["free"],
                       "capacity_pct": (alloc * 100).checked_div(size).unwrap_or(0), "health": st["state"]})
            }
            Err(e) => json!({"name": name, "health": "UNAVAIL", "error": e.to_string()}),
        };
        rows.push(row);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
        return Ok(());
    }
    println!(
        "{:<16} {:>8} {:>8} {:>8} {:>5}  HEALTH",
        "NAME", "SIZE", "ALLOC", "FREE", "CAP"
    );
    for r in rows {
        let n = |k: &str| r[k].as_u64().map(human).unwrap_or_else(|| "-".into());
        let cap = r["capacity_pct"]
            .as_u64()
            .map(|c| format!("{c}%"))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<16} {:>8} {:>8} {:>8} {:>5}  {}",
            r["name"].as_str().unwrap(),
            n("size"),
            n("alloc"),
            n("free"),
            cap,
            r["health"].as_str().unwrap()
        );
    }
    Ok(())
}

/// `zeta inject`.
pub fn inject(home: &Home, a: super::args::InjectArgs) -> Result<()> {
    let (pool, dev) = (a.pool.as_str(), a.device.as_str());
    let served = super::control::connect(home, pool);
    if let Some(n) = a.corrupt {
        let done = match served {
            Some(conn) => super::control::remote_corrupt(conn, pool, dev, n, a.seed)?,
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
    let faults = crate::vdev::Injection {
        fail_reads: a.fail_reads.unwrap_or(0.0),
        fail_writes: a.fail_writes.unwrap_or(0.0),
        vanished: a.vanish,
    };
    let Some(conn) = served else {
        return Err(usage(format!(
            "pool '{pool}' is not being served: injected failures live in the process that \
             holds the pool, so run `zeta serve {pool}` first (--corrupt works either way)"
        )));
    };
    super::control::remote_inject(conn, pool, dev, &faults)?;
    if a.clear {
        println!("cleared the injected faults of {dev} in '{pool}'");
    } else {
        println!("injected into {dev} in '{pool}': {faults:?}");
    }
    Ok(())
}

fn replace(home: &Home, force: bool, name: &str, old: &str, new: &Path) -> Result<()> {
    let new_path = absolute(new);
    let created = !new.exists();
    let served = super::control::connect(home, name);
    let is_served = served.is_some();
    let r = match served {
        Some(conn) => {
            // The server opens (or creates) the device itself and rebuilds it while serving.
            super::control::remote_replace(conn, name, old, &new_path, force)
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
            let _ = std::fs::remove_file(&new_path);
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

/// Opens (creating it at the size of the pool's largest device if needed) the new device
/// and replaces `old` by it in `p`.
pub fn replace_in(p: &Arc<Pool>, old: &str, new_path: &Path, force: bool) -> Result<()> {
    let dev = if new_path.exists() {
        FileDevice::open(new_path)?
    } else {
        let size = device_paths(p)
            .iter()
            .filter_map(|d| std::fs::metadata(d).ok().map(|m| m.len()))
            .max()
            .unwrap_or(0);
        FileDevice::create(new_path, size)?
    };
    p.replace(
        old,
        Arc::new(dev) as Arc<dyn BlockDevice>,
        new_path.display().to_string(),
        force,
    )?;
    Ok(())
}

fn set_offline(home: &Home, name: &str, device: &str, offline: bool) -> Result<()> {
    match super::control::connect(home, name) {
        Some(conn) => super::control::remote_offline(conn, name, device, offline)?,
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

fn scrub(home: &Home, name: &str, wait: bool, stop: bool) -> Result<()> {
    if let Some(conn) = super::control::connect(home, name) {
        super::control::remote_scrub(conn, name, stop)?;
        if stop {
            println!("canceled the scrub of '{name}'");
            return Ok(());
        }
        println!("scrubbing '{name}' in the server (see `zeta pool status {name}`)");
        if wait {
            let last = follow_with(&mut || pool_status(home, name))?;
            Progress::finish(name, &last["scan"]);
        }
        return Ok(());
    }
    let p = home.open(name)?;
    if stop {
        let r = p.stop_scrub();
        p.close()?;
        r?;
        println!("canceled the scrub of '{name}'");
        return Ok(());
    }
    // Import resumed a paused scrub already; otherwise start one.
    if p.scan_status().state != crate::spa::scan_state::ScanPhase::Scanning {
        p.start_scrub()?;
    }
    let last = follow(&p)?;
    p.close()?;
    Progress::finish(name, &last["scan"]);
    Ok(())
}

/// Shows the progress of the scan running in `p` (this process) until it ends; returns the
/// pool's status then.
fn follow(p: &Pool) -> Result<serde_json::Value> {
    let last = follow_with(&mut || Ok(status_json(p)))?;
    p.wait_scrub();
    Ok(last)
}

/// Shows the progress of the scan `status` reports (a pool status object) until it ends;
/// returns the last status.
fn follow_with(status: &mut dyn FnMut() -> Result<serde_json::Value>) -> Result<serde_json::Value> {
    let mut progress = Progress::new();
    loop {
        let st = status()?;
        progress.show(&st["scan"]);
        if st["scan"]["state"] != "scanning" {
            progress.end_line();
            return Ok(st);
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// The byte ranges a scan found no copy of, one line each.
fn print_damaged(scan: &serde_json::Value, with_error: bool) {
    for d in scan["damaged"].as_array().into_iter().flatten() {
        let why = match d["error"].as_str() {
            Some(e) if with_error => format!(": {e}"),
            _ => String::new(),
        };
        println!(
            "  lost: {} bytes {}..{}{why}",
            d["object"].as_str().unwrap_or("?"),
            d["start"],
            d["end"]
        );
    }
}

/// A scrub's progress: a line redrawn in place on a terminal, a plain line every few seconds
/// otherwise.
struct Progress {
    tty: bool,
    last_plain: Option<std::time::Instant>,
}

impl Progress {
    fn new() -> Progress {
        use std::io::IsTerminal;
        Progress {
            tty: std::io::stdout().is_terminal(),
            last_plain: None,
        }
    }

    fn line(scan: &serde_json::Value) -> String {
        let n = |k: &str| scan[k].as_u64().unwrap_or(0);
        let (done, goal) = (n("examined_bytes"), n("to_examine").max(1));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let secs = now.saturating_sub(n("start_secs")).max(1);
        let rate = done / secs;
        let eta = match goal.saturating_sub(done).checked_div(rate) {
            Some(s) => format!("{s}s"),
            None => "-".into(),
        };
        format!(
            "{}: {:.1}% ({} of {}), {}/s, ETA {eta}, {} repaired, {} errors",
            scan["func"].as_str().unwrap_or("scrub"),
            (done as f64 * 100.0 / goal as f64).min(100.0),
            human(done),
            human(goal),
            human(rate),
            human(n("repaired_bytes")),
            n("errors")
        )
    }

    fn show(&mut self, scan: &serde_json::Value) {
        use std::io::Write;
        if self.tty {
            print!("\r{:<100}", Self::line(scan));
            let _ = std::io::stdout().flush();
        } else if self
            .last_plain
            .is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(5))
        {
            println!("{}", Self::line(scan));
            self.last_plain = Some(std::time::Instant::now());
        }
    }

    fn end_line(&self) {
        if self.tty {
            println!();
        }
    }

    fn finish(name: &str, scan: &serde_json::Value) {
        let n = |k: &str| scan[k].as_u64().unwrap_or(0);
        println!(
            "{} of '{name}' {}: {} examined, {} repaired, {} errors",
            scan["func"].as_str().unwrap_or("scrub"),
            scan["state"].as_str().unwrap_or("?"),
            human(n("examined_bytes")),
            human(n("repaired_bytes")),
            n("errors")
        );
        print_damaged(scan, true);
    }
}

/// The status of a pool, from the `zeta serve` holding it if one does, else by opening it.
fn pool_status(home: &Home, name: &str) -> Result<serde_json::Value> {
    if let Some(conn) = super::control::connect(home, name) {
        return super::control::remote_status(conn, name);
    }
    let p = home.open(name)?;
    let st = status_json(&p);
    p.close()?;
    Ok(st)
}

/// The intent log's counters since the pool was opened (`zeta pool iostat --json`).
pub fn iostat_json(p: &Pool) -> serde_json::Value {
    let cfg = p.config();
    let z = p.zil.stats();
    let vdevs: Vec<_> = cfg
        .tops
        .iter()
        .map(|t| {
            let i = t.id as usize;
            let name = match t.children.as_slice() {
                [one] => one.path.clone(),
                _ => format!("{}-{}", t.kind_name(), t.id),
            };
            let at = |v: &[u64]| v.get(i).copied().unwrap_or(0);
            json!({"vdev": t.id, "name": name, "log_device": t.log,
                   "blocks": at(&z.blocks), "bytes": at(&z.bytes)})
        })
        .collect();
    let (mut queued, mut requests) = (0, 0);
    for ds in p.datasets() {
        let (a, r) = ds.log.counts();
        queued += a;
        requests += r;
    }
    let blocks: u64 = z.blocks.iter().sum();
    let per = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    json!({"pool": p.name, "txg": p.synced_txg(), "log": {
        "commit": cfg.zil_commit.name(), "placement": cfg.zil_placement.name(),
        "vdevs": vdevs, "records": z.records, "batches": z.batches, "flushes": z.flushes,
        "batch_latency_mean_us": per(z.batch_nanos, z.batches) / 1000.0,
        "records_per_block": per(z.records, blocks), "records_per_batch": per(z.records, z.batches),
        "fallback_syncs": z.fallback_syncs, "space_waits": z.space_waits, "bulk_syncs": z.bulk_syncs, "records_in_place": z.in_place, "sync_requests": requests, "records_queued": queued,
        "space_used": z.space_used, "space_total": z.space_total}})
}

fn iostat(home: &Home, name: &str, json: bool) -> Result<()> {
    let st = match super::control::connect(home, name) {
        Some(conn) => super::control::remote_iostat(conn, name)?,
        None => {
            let p = home.open(name)?;
            let st = iostat_json(&p);
            p.close()?;
            st
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&st).unwrap());
        return Ok(());
    }
    let l = &st["log"];
    let n = |k: &str| l[k].as_u64().unwrap_or(0);
    let f = |k: &str| l[k].as_f64().unwrap_or(0.0);
    println!(
        "pool {}: intent log zil.commit={} zil.placement={}, log space {} of {} in use",
        st["pool"].as_str().unwrap_or("?"),
        l["commit"].as_str().unwrap_or("?"),
        l["placement"].as_str().unwrap_or("?"),
        human(n("space_used")),
        human(n("space_total"))
    );
    println!(
        "  {:<5} {:<40} {:>12} {:>10}",
        "vdev", "device", "log blocks", "log bytes"
    );
    for v in l["vdevs"].as_array().into_iter().flatten() {
        println!(
            "  {:<5} {:<40} {:>12} {:>10}",
            v["vdev"],
            v["name"].as_str().unwrap_or("?"),
            v["blocks"],
            human(v["bytes"].as_u64().unwrap_or(0))
        );
    }
    println!(
        "  {} sync requests, {} records queued; {} records in {} commit batches \
         ({:.1} per batch, {:.1} per block), mean batch {:.0} us, {} device flushes, \
         {} waited for a txg to free log space, {} fell back to a txg sync, {} too large to log committed by a txg sync; \
         {} large writes made in place, logged by pointer",
        n("sync_requests"),
        n("records_queued"),
        n("records"),
        n("batches"),
        f("records_per_batch"),
        f("records_per_block"),
        f("batch_latency_mean_us"),
        n("flushes"),
        n("space_waits"),
        n("fallback_syncs"),
        n("bulk_syncs"),
        n("records_in_place")
    );
    Ok(())
}

pub fn status_json(p: &Pool) -> serde_json::Value {
    let cfg = p.config();
    let s = p.space();
    let tops: Vec<_> = p
        .vdev_status()
        .into_iter()
        .map(|t| serde_json::to_value(&t).expect("status serializes"))
        .collect();
    let degraded = tops.iter().any(|t| t["state"] != "ONLINE");
    json!({"name": p.name, "guid": p.guid, "state": if degraded { "DEGRADED" } else { "ONLINE" },
           "txg": p.synced_txg(), "checksum": cfg.checksum.name(),
           "size": s.size, "alloc": s.alloc, "free": s.free, "vdevs": tops,
           "volumes": p.datasets().len(), "scan": p.scan_status(),
           "lost_writes": p.io.zio.stats.lost_patches.load(std::sync::atomic::Ordering::Relaxed)})
}

fn status(home: &Home, name: Option<&str>, json: bool) -> Result<()> {
    let names: Vec<String> = match name {
        Some(n) => vec![n.to_string()],
        None => home.load()?.pools.keys().cloned().collect(),
    };
    if names.is_empty() && !json {
        println!("no pools imported");
        return Ok(());
    }
    let mut all = Vec::new();
    for n in &names {
        all.push(pool_status(home, n)?);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all).unwrap());
        return Ok(());
    }
    for st in all {
        println!(
            "  pool: {}\n state: {}\n   txg: {}\n space: {} size, {} alloc, {} free\nconfig:",
            st["name"].as_str().unwrap(),
            st["state"].as_str().unwrap(),
            st["txg"],
            human(st["size"].as_u64().unwrap()),
            human(st["alloc"].as_u64().unwrap()),
            human(st["free"].as_u64().unwrap())
        );
        let scan = &st["scan"];
        if scan["state"] != "none" {
            let n = |k: &str| scan[k].as_u64().unwrap_or(0);
            println!(
                "  scan: {} {}: {} of {} examined, {} repaired, {} errors",
                scan["func"].as_str().unwrap_or("scrub"),
                scan["state"].as_str().unwrap_or("?"),
                human(n("examined_bytes")),
                human(n("to_examine")),
                human(n("repaired_bytes")),
                n("errors")
            );
            print_damaged(scan, false);
        }
        println!(
            "    {:<40} {:>8} {:>6} {:>6} {:>6}",
            "NAME", "STATE", "READ", "WRITE", "CKSUM"
        );
        let mut logs_header = false;
        for t in st["vdevs"].as_array().unwrap() {
            if t["log"] == true && !logs_header {
                println!("    logs");
                logs_header = true;
            }
            let indent = if t["kind"] != "stripe" {
                println!(
                    "    {:<40} {:>8}",
                    format!("{}-{}", t["name"].as_str().unwrap(), t["id"]),
                    t["state"].as_str().unwrap()
                );
                "      "
            } else {
                "    "
            };
            for l in t["leaves"].as_array().unwrap() {
                let n = |k: &str| l[k].as_u64().unwrap_or(0);
                println!(
                    "{indent}{:<40} {:>8} {:>6} {:>6} {:>6}",
                    l["path"].as_str().unwrap(),
                    l["state"].as_str().unwrap(),
                    n("read_errors"),
                    n("write_errors"),
                    n("cksum_errors")
                );
            }
        }
        let lost = st["lost_writes"].as_u64().unwrap_or(0);
        if lost > 0 {
            println!(
                "errors: {lost} short writes lost, laid over blocks that no copy could supply \
                 (those blocks still fail their reads)"
            );
        }
        println!();
    }
    Ok(())
}
