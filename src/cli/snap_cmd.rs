//! `zeta snapshot`, `zeta list` and `zeta destroy`: the dataset commands, named as zfs names
//! them, run where the pool is (here, or by the server that serves it).

use std::io::Write;

use serde_json::{json, Value};

use super::args::{
    CloneArgs, DestroyArgs, ListArgs, PromoteArgs, ReceiveArgs, RollbackArgs, SendArgs,
    SnapshotArgs,
};
use super::vol_cmd::{confirm, split_name};
use super::{stdout_err, usage, CliError, Result};
use crate::dsl::Pool;
use zeta_server::fmt::human;
use zeta_server::progress::Reporter;
use zeta_server::state::Home;

pub fn snapshot(home: &Home, a: SnapshotArgs, out: &mut dyn Write) -> Result<()> {
    let mut pool = None;
    let mut names = Vec::new();
    for full in &a.names {
        let (p, rest) = split_name(full)?;
        if !rest.contains('@') {
            return Err(usage(format!("'{full}' is not POOL/VOL@SNAP")));
        }
        if pool.is_some_and(|q| q != p) {
            return Err(usage(format!(
                "'{full}': snapshots taken together must be of one pool's volumes"
            )));
        }
        pool = Some(p);
        names.push(rest);
    }
    let pool = pool.ok_or_else(|| usage("no snapshot named"))?;
    let p = home.open(pool)?;
    let r = p.snapshot(&names);
    p.close()?;
    r?;
    for full in &a.names {
        writeln!(out, "created snapshot '{full}'").map_err(stdout_err)?;
    }
    Ok(())
}

pub fn clone(home: &Home, a: CloneArgs, out: &mut dyn Write) -> Result<()> {
    let (pool, origin) = split_name(&a.origin)?;
    if !origin.contains('@') {
        return Err(usage(format!("'{}' is not POOL/VOL@SNAP", a.origin)));
    }
    let (to_pool, vol) = split_name(&a.name)?;
    if to_pool != pool {
        return Err(usage(format!(
            "'{}': a clone is made in its origin's pool ('{pool}')",
            a.name
        )));
    }
    let p = home.open(pool)?;
    let r = p.clone_snapshot(origin, vol);
    p.close()?;
    r?;
    writeln!(
        out,
        "created volume '{}', a clone of '{}'",
        a.name, a.origin
    )
    .map_err(stdout_err)?;
    Ok(())
}

pub fn promote(home: &Home, a: PromoteArgs, out: &mut dyn Write) -> Result<()> {
    let (pool, vol) = split_name(&a.name)?;
    if vol.contains('@') {
        return Err(usage(format!(
            "'{}' is a snapshot: promote a clone (POOL/VOL)",
            a.name
        )));
    }
    let p = home.open(pool)?;
    let origin = p.origin_of(vol);
    let r = p.promote(vol);
    p.close()?;
    r?;
    let was = origin.and_then(|o| o.split_once('@').map(|(v, _)| v.to_string()));
    writeln!(
        out,
        "promoted '{}': '{pool}/{}' is now its clone",
        a.name,
        was.unwrap_or_default()
    )
    .map_err(stdout_err)?;
    Ok(())
}

pub fn destroy(home: &Home, a: DestroyArgs, out: &mut dyn Write, reporter: Reporter) -> Result<()> {
    let (pool, name) = split_name(&a.name)?;
    let p = home.open(pool)?;
    let r = destroy_in(&p, &a, name, reporter);
    p.close()?;
    for gone in r? {
        writeln!(out, "destroyed '{pool}/{gone}'").map_err(stdout_err)?;
    }
    Ok(())
}

pub fn rollback(home: &Home, a: RollbackArgs, out: &mut dyn Write) -> Result<()> {
    let (pool, name) = split_name(&a.name)?;
    let Some((vol, _)) = name.split_once('@') else {
        return Err(usage(format!("'{}' is not POOL/VOL@SNAP", a.name)));
    };
    let p = home.open(pool)?;
    let r = rollback_in(&p, &a, vol, name);
    p.close()?;
    for gone in r? {
        writeln!(out, "destroyed '{pool}/{gone}'").map_err(stdout_err)?;
    }
    writeln!(out, "rolled '{pool}/{vol}' back to '{}'", a.name).map_err(stdout_err)?;
    Ok(())
}

/// Rolls `vol` back to `name`, with -r destroying the newer snapshots first (newest first);
/// returns those it destroyed.
fn rollback_in(p: &Pool, a: &RollbackArgs, vol: &str, name: &str) -> Result<Vec<String>> {
    p.snapshot_dataset(name)?;
    let newer: Vec<String> = (p.snapshots_of(vol).into_iter())
        .map(|s| s.name.clone())
        .skip_while(|n| n != name)
        .skip(1)
        .collect();
    let mut gone = Vec::new();
    if a.recursive {
        // Checked before the newer snapshots go: the rollback would be refused after.
        let open = p.dataset(vol)?.handles();
        if open > 0 {
            return Err(usage(format!(
                "volume '{}/{vol}' is open ({open} handle(s): a connected client, or a copy \
                 in or out): disconnect them first",
                p.name
            )));
        }
        for n in newer.into_iter().rev() {
            p.destroy_snapshot(&n)?;
            gone.push(n);
        }
    }
    p.rollback(name)?;
    Ok(gone)
}

/// Destroys `name` in `p` as `a` asks; returns what it destroyed, in order.
fn destroy_in(p: &Pool, a: &DestroyArgs, name: &str, reporter: Reporter) -> Result<Vec<String>> {
    if name.contains('@') {
        if a.recursive {
            return Err(usage(
                "-r destroys a volume's snapshots with it: name the volume",
            ));
        }
        p.destroy_snapshot(name)?;
        return Ok(vec![name.to_string()]);
    }
    let ds = p.dataset(name)?;
    let snaps = p.snapshots_of(name);
    if !snaps.is_empty() && !a.recursive {
        return Err(usage(format!(
            "'{}' has {} snapshot(s), the oldest '{}/{}': give -r to destroy them with it",
            a.name,
            snaps.len(),
            p.name,
            snaps[0].name
        )));
    }
    if !a.force && (ds.holds_data() || !snaps.is_empty()) {
        confirm(
            reporter,
            &a.name,
            &format!("'{}' holds data, which destroying it loses", a.name),
            "destroy it",
        )?;
    }
    drop(ds);
    // Let go of them: a snapshot someone holds is in use, and is not destroyed.
    let names: Vec<String> = snaps.into_iter().map(|s| s.name.clone()).collect();
    let mut gone = Vec::new();
    // Newest first: each destroy then merges into the head's deadlist, the shortest walk.
    for n in names.into_iter().rev() {
        p.destroy_snapshot(&n)?;
        gone.push(n);
    }
    p.destroy_volume(name)?;
    gone.push(name.to_string());
    Ok(gone)
}

/// Every volume and snapshot of `p` with its space, as `zeta list` shows it.
pub fn dataset_rows(p: &Pool) -> Vec<Value> {
    let mut rows = Vec::new();
    for ds in p.datasets() {
        let f = ds.figures();
        // A clone's blocks its origin holds are the origin's space, not its own.
        let own = f.referenced.saturating_sub(f.origin_shared);
        let used = own + f.usedbysnapshots + ds.unused_reservation();
        let origin = p.origin_of(&ds.name).map(|o| format!("{}/{o}", p.name));
        rows.push(json!({
            "name": format!("{}/{}", p.name, ds.name), "type": "volume", "used": used,
            "usedbysnapshots": f.usedbysnapshots, "referenced": f.referenced,
            "written": f.written, "volsize": ds.volsize(), "snapshots": f.snapshots,
            "createtxg": ds.created_txg, "origin": origin,
            "compression": ds.object.compression().name(),
            "logicalused": ds.object.sizes().logical,
            "compressratio": super::pool_cmd::ratio(ds.object.sizes().ratio()),
        }));
        for s in p.snapshots_of(&ds.name) {
            let f = s.figures();
            rows.push(json!({
                "name": format!("{}/{}", p.name, s.name), "type": "snapshot", "used": f.unique,
                "referenced": f.referenced, "written": f.written, "volsize": s.volsize(),
                "createtxg": f.creation_txg, "creation": f.creation_time,
                "logicalreferenced": s.object.sizes().logical,
                "compressratio": super::pool_cmd::ratio(s.object.sizes().ratio()),
            }));
        }
    }
    rows
}

pub fn list(home: &Home, a: ListArgs, out: &mut dyn Write) -> Result<()> {
    let (volumes, snapshots) = match a.kind.as_str() {
        "volume" | "vol" => (true, false),
        "snapshot" | "snap" => (false, true),
        "all" => (true, true),
        k => {
            return Err(usage(format!(
                "-t {k}: the types are volume, snapshot and all"
            )))
        }
    };
    // Which pools, and within a pool which volumes (none: all).
    let mut wanted: Vec<(String, Option<String>)> = Vec::new();
    if a.names.is_empty() {
        wanted.extend(home.load()?.pools.keys().map(|p| (p.clone(), None)));
    }
    for n in &a.names {
        match n.split_once('/') {
            Some((p, v)) => wanted.push((p.to_string(), Some(v.to_string()))),
            None => wanted.push((n.clone(), None)),
        }
    }
    let mut rows = Vec::new();
    let mut pools_done: Vec<(String, Vec<Value>)> = Vec::new();
    for (pool, vol) in &wanted {
        let all = match pools_done.iter().find(|(p, _)| p == pool) {
            Some((_, r)) => r.clone(),
            None => {
                let served_here = home.served_pools().iter().any(|p| &p.name == pool);
                let r = match zeta_server::control::connect(home, pool).filter(|_| !served_here) {
                    Some(conn) => zeta_server::control::remote_datasets(conn, pool)?,
                    None => {
                        let p = home.open(pool)?;
                        let r = dataset_rows(&p);
                        p.close()?;
                        r
                    }
                };
                pools_done.push((pool.clone(), r.clone()));
                r
            }
        };
        let mut found = vol.is_none();
        for r in all {
            let name = r["name"].as_str().unwrap_or_default().to_string();
            let head = name.split('@').next().unwrap_or_default().to_string();
            if vol
                .as_ref()
                .is_some_and(|v| head != format!("{pool}/{v}") && name != format!("{pool}/{v}"))
            {
                continue;
            }
            found = true;
            let is_snap = r["type"] == "snapshot";
            if (is_snap && snapshots) || (!is_snap && volumes) {
                rows.push(r);
            }
        }
        if !found {
            return Err(usage(format!(
                "'{pool}/{}' is no volume or snapshot of pool '{pool}'",
                vol.as_deref().unwrap_or_default()
            )));
        }
    }
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows).unwrap()).map_err(stdout_err)?;
        return Ok(());
    }
    let size = |v: &Value| match v.as_u64() {
        None => "-".to_string(),
        Some(n) if a.parsable => n.to_string(),
        Some(n) => human(n),
    };
    let cols = ["NAME", "USED", "USEDSNAP", "REFER", "WRITTEN"];
    let lines: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            [
                r["name"].as_str().unwrap_or_default().to_string(),
                size(&r["used"]),
                size(&r["usedbysnapshots"]),
                size(&r["referenced"]),
                size(&r["written"]),
            ]
        })
        .collect();
    if a.scripted {
        for l in &lines {
            writeln!(out, "{}", l.join("\t")).map_err(stdout_err)?;
        }
        return Ok(());
    }
    let width = (lines.iter().map(|l| l[0].len()))
        .chain(std::iter::once(24))
        .max()
        .unwrap_or(24);
    writeln!(
        out,
        "{:<width$} {:>8} {:>8} {:>8} {:>8}",
        cols[0], cols[1], cols[2], cols[3], cols[4]
    )
    .map_err(stdout_err)?;
    for l in &lines {
        writeln!(
            out,
            "{:<width$} {:>8} {:>8} {:>8} {:>8}",
            l[0], l[1], l[2], l[3], l[4]
        )
        .map_err(stdout_err)?;
    }
    Ok(())
}

pub fn send(home: &Home, a: SendArgs, out: &mut dyn Write, reporter: Reporter) -> Result<()> {
    use std::io::IsTerminal;
    let resume = match &a.token {
        Some(t) => Some(crate::zvol::receive::parse_token(t)?),
        None => None,
    };
    let (pool, name, vol) = match resume {
        Some(_) => (a.name.split('/').next().unwrap_or_default(), "", ""),
        None => {
            let (pool, name) = split_name(&a.name)?;
            let Some((vol, _)) = name.split_once('@') else {
                return Err(usage(format!("'{}' is not POOL/VOL@SNAP", a.name)));
            };
            (pool, name, vol)
        }
    };
    let from = match a.from.as_deref() {
        None => None,
        Some(f) if f.starts_with('@') => Some(format!("{vol}{f}")),
        Some(f) => match split_name(f) {
            Ok((p, rest)) if p == pool && rest.contains('@') => Some(rest.to_string()),
            _ => return Err(usage(format!("-i {f}: name @SNAP, or {pool}/{vol}@SNAP"))),
        },
    };
    let mut file = match &a.output {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(|e| CliError::io(path, e))?,
        ),
        None if !matches!(reporter, Reporter::Local) => {
            return Err(usage(format!(
                "pool '{pool}' is served: its server writes the stream; give -o FILE"
            )))
        }
        None if std::io::stdout().is_terminal() => {
            return Err(usage(
                "the stream is binary: redirect stdout to a file or a pipe, or give -o FILE",
            ))
        }
        None => None,
    };
    let p = home.open(pool)?;
    let total = p
        .snapshot_dataset(name)
        .map(|d| d.figures().referenced)
        .unwrap_or(0);
    let mut progress = reporter.start(&format!("send {}", a.name), total);
    let mut buffered;
    let sink: &mut dyn Write = match &mut file {
        Some(f) => {
            buffered = std::io::BufWriter::with_capacity(1 << 20, f);
            &mut buffered
        }
        None => out,
    };
    let mut advance = |done| progress.advance(done);
    let r = match resume {
        Some(st) => p
            .send_resumed(st.to_guid, st.from_guid, st.offset, sink, &mut advance)
            .map(|(n, s)| (format!("{pool}/{n}"), s)),
        None => p
            .send(name, from.as_deref(), sink, &mut advance)
            .map(|s| (a.name.clone(), s)),
    };
    drop(progress);
    p.close()?;
    let (sent, sum) = r?;
    if let Some(path) = &a.output {
        writeln!(
            out,
            "sent '{}' to {}: {} records, {} of data, {} of stream",
            sent,
            path.display(),
            sum.records,
            human(sum.data_bytes),
            human(sum.stream_bytes)
        )
        .map_err(stdout_err)?;
    }
    Ok(())
}

pub fn receive(home: &Home, a: ReceiveArgs, out: &mut dyn Write, reporter: Reporter) -> Result<()> {
    use std::io::IsTerminal;
    let (pool, vol) = split_name(&a.name)?;
    if vol.contains('@') {
        return Err(usage(format!(
            "'{}': name the volume (POOL/VOL); the snapshot's name comes from the stream",
            a.name
        )));
    }
    if a.abort {
        let p = home.open(pool)?;
        let r = crate::zvol::receive::abort(&p, vol);
        p.close()?;
        r?;
        return writeln!(out, "gave up the receive of '{}'", a.name).map_err(stdout_err);
    }
    let (mut input, total): (Box<dyn std::io::Read>, u64) = match &a.file {
        Some(path) => {
            let f = std::fs::File::open(path).map_err(|e| CliError::io(path, e))?;
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            (Box::new(std::io::BufReader::with_capacity(1 << 20, f)), len)
        }
        None if !matches!(reporter, Reporter::Local) => {
            return Err(usage(format!(
                "pool '{pool}' is served: its server reads the stream; give -f FILE"
            )))
        }
        None if std::io::stdin().is_terminal() => {
            return Err(usage("redirect stdin from a stream, or give -f FILE"))
        }
        None => (
            Box::new(std::io::BufReader::with_capacity(1 << 20, std::io::stdin())),
            0,
        ),
    };
    let p = home.open(pool)?;
    let mut progress = reporter.start(&format!("receive {}", a.name), total);
    let r = crate::zvol::receive::receive(&p, vol, &mut input, a.force, a.resumable, &mut |done| {
        progress.advance(done)
    });
    drop(progress);
    p.close()?;
    let sum = r?;
    let snap = p
        .snapshots_of(vol)
        .last()
        .map(|s| s.name.clone())
        .unwrap_or_default();
    writeln!(
        out,
        "received '{pool}/{snap}' ({}, {} records, {} of data)",
        if sum.incremental {
            "incremental"
        } else {
            "full"
        },
        sum.records,
        human(sum.data_bytes)
    )
    .map_err(stdout_err)?;
    Ok(())
}
