//! `zeta pool create` and `add`/`remove`: pool properties and vdev groups parsed from the
//! command line, devices opened or made, and log devices added to a served pool.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cli::guard::{check_overwrite, Writing};
use crate::cli::{usage, Result};
use crate::dsl::{devices as scheme, DeviceOptions};
use crate::dsl::{BlockDevice, CommitPolicy, Placement, RaidzConfig, TopKind};
use crate::dsl::{Pool, PoolOptions, TopSpec};
use crate::math::ChecksumKind;
use zeta_server::control;
use zeta_server::fmt::{human, parse_size};
use zeta_server::state::{device_paths, Home};

pub struct CreateProps {
    pub size: Option<u64>,
    pub checksum: ChecksumKind,
    /// raidz2 vdevs use RDP instead of Reed-Solomon.
    pub raidz2_rdp: bool,
    pub zil_commit: CommitPolicy,
    pub zil_placement: Placement,
    /// Files created (`size`) get every block allocated at once.
    pub prealloc: bool,
    /// What devices created (`size`) of a scheme are told (`object_size` of `rados:`).
    pub device: DeviceOptions,
}

pub fn parse_pool_props(props: &[String]) -> Result<CreateProps> {
    let mut out = CreateProps {
        size: None,
        checksum: ChecksumKind::Fletcher4,
        raidz2_rdp: false,
        zil_commit: CommitPolicy::default(),
        zil_placement: Placement::default(),
        prealloc: false,
        device: DeviceOptions::default(),
    };
    for p in props {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| usage(format!("property '{p}' is not KEY=VALUE")))?;
        match k {
            "size" => out.size = Some(parse_size(v)?),
            "object_size" => out.device.object_size = Some(parse_size(v)?),
            "prealloc" => {
                out.prealloc = match v {
                    "on" => true,
                    "off" => false,
                    _ => return Err(usage(format!("prealloc '{v}' is not one of on, off"))),
                }
            }
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
                    "unknown property '{k}' (pool properties: size, object_size, prealloc, \
                     checksum, raidz2-code, zil.commit, zil.placement)"
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
                RaidzConfig::new(g.nparity, g.paths.len(), false)
                    .map_err(|e| usage(e.to_string()))?;
            }
            _ => {}
        }
    }
    if out.is_empty() {
        return Err(usage("no devices given"));
    }
    Ok(out)
}

pub(super) fn absolute(p: &Path) -> PathBuf {
    scheme::absolute(p)
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
    let usable = pool.usable_space(crate::dsl::DEFAULT_VOLBLOCKSIZE);
    pool.close()?;
    println!(
        "created pool '{name}' ({} raw, {} usable after parity for {} blocks)",
        human(space.size),
        human(usable.size),
        human(usable.block_bytes)
    );
    // `serve` and `up` warn again at each start (`serve_cmd::run`).
    zeta_server::room::warn(name, &device_paths(&pool));
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
            check_overwrite(home, p, Writing::Device, force)?;
            if !scheme::exists(p)? && props.size.is_none() {
                return Err(usage(format!(
                    "{}: does not exist (give -o size=SIZE to create devices)",
                    p.display()
                )));
            }
        }
    }
    let mut created: Vec<PathBuf> = Vec::new();
    let result = (|| -> Result<Arc<Pool>> {
        let spec = open_groups(&groups, &props, &mut created)?;
        let opts = PoolOptions {
            checksum: props.checksum,
            force,
            zil_commit: props.zil_commit,
            zil_placement: props.zil_placement,
            ..home.pool_options()
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
                scheme::remove(&p);
            }
            Err(e)
        }
    }
}

/// Opens (or creates, at `props.size`, the missing ones among) the devices of parsed vdev
/// groups; records the devices it created in `created`. `props.prealloc` allocates the
/// created files' blocks; `props.device` tells created devices of a scheme their options.
fn open_groups(
    groups: &[VdevGroup],
    props: &CreateProps,
    created: &mut Vec<PathBuf>,
) -> Result<Vec<TopSpec>> {
    let raidz2_rdp = props.raidz2_rdp;
    let mut spec = Vec::new();
    for g in groups {
        let mut leaves = Vec::new();
        for p in &g.paths {
            let dev: Arc<dyn BlockDevice> = match (scheme::exists(p)?, props.size) {
                (true, _) => scheme::open(p, false)?,
                (false, Some(size)) => {
                    let dev = scheme::create(p, size, props.prealloc, props.device)?;
                    created.push(p.clone());
                    dev
                }
                (false, None) => {
                    return Err(usage(format!(
                        "{}: does not exist (give a size to create a device)",
                        p.display()
                    )))
                }
            };
            leaves.push((dev, absolute(p).display().to_string()));
        }
        let top = match g.kind {
            TopKind::Raidz => TopSpec::raidz(
                RaidzConfig::new(g.nparity, leaves.len(), raidz2_rdp)
                    .map_err(|e| usage(e.to_string()))?,
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
pub(super) fn add(
    home: &Home,
    force: bool,
    size: Option<&str>,
    name: &str,
    vdevs: &[String],
) -> Result<()> {
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
    for w in &words[1..] {
        if w != "mirror" {
            check_overwrite(home, Path::new(w), Writing::Device, force)?;
        }
    }
    parse_vdevs(&words)?;
    let ids = match control::connect(home, name) {
        Some(conn) => control::remote_add_log(conn, name, &words, size, force)?,
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
        // New files are allocated at once where the pool's are (`-o prealloc=on`).
        let props = CreateProps {
            size,
            prealloc: zeta_server::room::allocated(&zeta_server::state::device_paths(p)),
            ..parse_pool_props(&[])?
        };
        let spec = open_groups(&groups, &props, &mut created)?;
        let mut ids = Vec::new();
        for top in spec {
            ids.push(p.add_log(top, force)?);
        }
        Ok(ids)
    })();
    if r.is_err() {
        for f in created {
            scheme::remove(&f);
        }
    }
    r
}

/// `zeta pool remove`: a log device, through the pool's server if it is served.
pub(super) fn remove(home: &Home, name: &str, device: &str) -> Result<()> {
    let gone = match control::connect(home, name) {
        Some(conn) => control::remote_remove(conn, name, device)?,
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
