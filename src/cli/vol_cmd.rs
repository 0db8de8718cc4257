//! `zeta vol …` and `zeta up`.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use super::args::VolCmd;
use super::guard::{check_overwrite, Writing};
use super::{stdout_err, usage, CliError, Result};
use crate::dsl::{Compression, Pool};
use crate::math::ChecksumKind;
use crate::zvol::Volume;
use zeta_server::fmt::{human, parse_size};
use zeta_server::progress::Reporter;
use zeta_server::state::Home;

/// Splits `POOL/VOL`.
pub fn split_name(full: &str) -> Result<(&str, &str)> {
    match full.split_once('/') {
        Some((p, v)) if !p.is_empty() && !v.is_empty() => Ok((p, v)),
        _ => Err(usage(format!("'{full}' is not POOL/VOL"))),
    }
}

const COPY_CHUNK: usize = 1 << 20;

/// The pool a command names, if it names one.
fn target_pool(cmd: &VolCmd) -> Option<&str> {
    match cmd {
        VolCmd::Create { name, .. }
        | VolCmd::Destroy { name, .. }
        | VolCmd::Resize { name, .. }
        | VolCmd::Put { name, .. }
        | VolCmd::Get { name, .. } => split_name(name).ok().map(|(p, _)| p),
        VolCmd::PropGet(a) => super::prop_cmd::get_pool(a).ok(),
        VolCmd::PropSet(a) => split_name(&a.name).ok().map(|(p, _)| p),
        VolCmd::Snapshot(a) => a
            .names
            .first()
            .and_then(|n| split_name(n).ok())
            .map(|(p, _)| p),
        VolCmd::DsDestroy(a) => split_name(&a.name).ok().map(|(p, _)| p),
        VolCmd::DsRollback(a) => split_name(&a.name).ok().map(|(p, _)| p),
        VolCmd::DsSend(a) if a.token.is_some() => a.name.split('/').next(),
        VolCmd::DsSend(a) => split_name(&a.name).ok().map(|(p, _)| p),
        VolCmd::DsReceive(a) => split_name(&a.name).ok().map(|(p, _)| p),
        VolCmd::DsClone(a) => split_name(&a.origin).ok().map(|(p, _)| p),
        VolCmd::DsPromote(a) => split_name(&a.name).ok().map(|(p, _)| p),
        VolCmd::List { .. } | VolCmd::DsList(_) => None,
    }
}

pub fn run(home: &Home, cmd: VolCmd) -> Result<()> {
    // A pool another process serves is reached through its control socket.
    if let Some(pool) = target_pool(&cmd) {
        if !home.served_pools().iter().any(|p| p.name == pool) {
            if let Some(conn) = zeta_server::control::connect(home, pool) {
                return zeta_server::control::remote_run(conn, pool);
            }
        }
    }
    let mut out = std::io::stdout().lock();
    run_to(home, cmd, &mut out, Reporter::Local)
}

/// Runs a command, printing to `out`; long copies report to `reporter`.
pub fn run_to(home: &Home, cmd: VolCmd, out: &mut dyn Write, reporter: Reporter) -> Result<()> {
    match cmd {
        VolCmd::Create {
            block_size,
            sparse,
            props,
            name,
            size,
        } => {
            let (pool, vol) = split_name(&name)?;
            let bs = parse_size(&block_size)?;
            let size = parse_size(&size)?;
            let mut checksum = None;
            let mut compression = None;
            for p in &props {
                match p.split_once('=') {
                    Some(("compression", v)) => {
                        compression = Some(Compression::parse(v).map_err(usage)?);
                    }
                    Some(("checksum", v)) => {
                        checksum = Some(ChecksumKind::parse(v).ok_or_else(|| {
                            usage(format!(
                                "checksum '{v}' is not one of {}",
                                ChecksumKind::NAMES
                            ))
                        })?)
                    }
                    _ => {
                        return Err(usage(format!(
                            "unknown volume property '{p}' (volume properties: checksum, \
                             compression)"
                        )))
                    }
                }
            }
            if bs > u32::MAX as u64 {
                return Err(usage(format!("block size {bs} is too large")));
            }
            let p = home.open(pool)?;
            let r = p
                .create_volume_with(vol, size, bs as u32, checksum, !sparse)
                .and_then(|ds| match compression {
                    Some(c) => p.set_compression(vol, c).map(|()| ds),
                    None => Ok(ds),
                });
            p.close()?;
            let ds = r?;
            let reserved = match ds.refreservation() {
                0 => "sparse".to_string(),
                n => format!("{} raw reserved", human(n)),
            };
            writeln!(
                out,
                "created volume '{name}' ({}, block size {}, {reserved})",
                human(size),
                human(bs)
            )
            .map_err(stdout_err)?;
            Ok(())
        }
        VolCmd::List { pool, json } => list(home, pool.as_deref(), json, out),
        VolCmd::PropGet(a) => super::prop_cmd::get(home, a, out),
        VolCmd::PropSet(a) => super::prop_cmd::set(home, a, out),
        VolCmd::Snapshot(a) => super::snap_cmd::snapshot(home, a, out),
        VolCmd::DsList(a) => super::snap_cmd::list(home, a, out),
        VolCmd::DsDestroy(a) => super::snap_cmd::destroy(home, a, out, reporter),
        VolCmd::DsRollback(a) => super::snap_cmd::rollback(home, a, out),
        VolCmd::DsSend(a) => super::snap_cmd::send(home, a, out, reporter),
        VolCmd::DsReceive(a) => super::snap_cmd::receive(home, a, out, reporter),
        VolCmd::DsClone(a) => super::snap_cmd::clone(home, a, out),
        VolCmd::DsPromote(a) => super::snap_cmd::promote(home, a, out),
        VolCmd::Destroy { name, force } => {
            let (pool, vol) = split_name(&name)?;
            let p = home.open(pool)?;
            let r = p.dataset(vol).map_err(CliError::from).and_then(|ds| {
                if !force && ds.holds_data() {
                    confirm(
                        reporter,
                        &name,
                        &format!("'{name}' holds data, which destroying it loses"),
                        "destroy it",
                    )?;
                }
                Ok(p.destroy_volume(vol)?)
            });
            p.close()?;
            r?;
            writeln!(out, "destroyed volume '{name}'").map_err(stdout_err)?;
            Ok(())
        }
        VolCmd::Resize { name, size, force } => {
            let (pool, vol) = split_name(&name)?;
            let size = parse_size(&size)?;
            let p = home.open(pool)?;
            let r = p.dataset(vol).map_err(CliError::from).and_then(|ds| {
                if !force && size < ds.volsize() {
                    confirm(
                        reporter,
                        &name,
                        &format!(
                            "shrinking '{name}' from {} to {} discards the data past {}",
                            human(ds.volsize()),
                            human(size),
                            human(size)
                        ),
                        "shrink it",
                    )?;
                }
                Ok(p.resize_volume(vol, size)?)
            });
            p.close()?;
            r?;
            writeln!(out, "resized volume '{name}' to {}", human(size)).map_err(stdout_err)?;
            Ok(())
        }
        VolCmd::Put { name, file, offset } => {
            let (pool, vol) = split_name(&name)?;
            let offset = parse_size(&offset)?;
            let p = home.open(pool)?;
            let r = put(&p, vol, &file, offset, reporter);
            let c = p.close();
            let n = r?;
            c?;
            writeln!(out, "wrote {} to '{name}'", human(n)).map_err(stdout_err)?;
            Ok(())
        }
        VolCmd::Get { name, file, force } => {
            let (pool, vol) = split_name(&name)?;
            check_overwrite(home, &file, Writing::Copy, force)?;
            let p = home.open(pool)?;
            let r = get(&p, vol, &file, reporter);
            p.close()?;
            let n = r?;
            writeln!(
                out,
                "read {} from '{name}' into {}",
                human(n),
                file.display()
            )
            .map_err(stdout_err)?;
            Ok(())
        }
    }
}

/// Asks for a destructive step to be confirmed: on this process's terminal, by typing the
/// volume's name; elsewhere (a script, a command the server runs for a control client) it
/// is refused, and `-f` is the way.
pub(super) fn confirm(reporter: Reporter, name: &str, what: &str, step: &str) -> Result<()> {
    use std::io::IsTerminal;
    let refused = || usage(format!("{what}: give -f to {step}"));
    if !matches!(reporter, Reporter::Local) || !std::io::stdin().is_terminal() {
        return Err(refused());
    }
    eprint!("{what}. Type the volume's name ({name}) to {step}: ");
    let mut typed = String::new();
    std::io::stdin()
        .read_line(&mut typed)
        .map_err(|e| CliError::io(Path::new("stdin"), e))?;
    if typed.trim() == name {
        Ok(())
    } else {
        Err(usage(format!("not confirmed: {what}; nothing was changed")))
    }
}

/// Copies a file into a volume and flushes; returns the bytes written. Stopped (Ctrl-C, or
/// the control client gone), it flushes what it wrote and says how far it got.
pub fn put(
    pool: &Arc<Pool>,
    vol: &str,
    file: &Path,
    offset: u64,
    reporter: Reporter,
) -> Result<u64> {
    let v = Volume::open(pool, vol)?;
    let mut f = std::fs::File::open(file).map_err(|e| CliError::io(file, e))?;
    let len = f.metadata().map_err(|e| CliError::io(file, e))?.len();
    if offset.checked_add(len).is_none_or(|end| end > v.size()) {
        return Err(usage(format!(
            "{} ({} bytes) does not fit in {} ({} bytes) at offset {offset}",
            file.display(),
            len,
            v.name(),
            v.size()
        )));
    }
    let mut progress = reporter.start(&format!("{} -> {}", file.display(), v.name()), len);
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut at = offset;
    loop {
        let n = read_full(&mut f, &mut buf).map_err(|e| CliError::io(file, e))?;
        if n == 0 {
            break;
        }
        v.write(at, &buf[..n])?;
        at += n as u64;
        if !progress.advance(at - offset) {
            v.flush()?;
            return Err(usage(format!(
                "interrupted: wrote the first {} of {} ({} of {} bytes) to '{}' at offset \
                 {offset}, flushed",
                human(at - offset),
                file.display(),
                at - offset,
                len,
                v.name()
            )));
        }
    }
    v.flush()?;
    Ok(at - offset)
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Copies a volume's contents into a file; returns the bytes read. Into a regular file the
/// copy is sparse, as `cp --sparse=always` makes it: the volume's holes, and blocks of
/// zeros, stay holes in the file. A block device gets every byte, zeros too (its old
/// contents would otherwise show through).
pub fn get(pool: &Arc<Pool>, vol: &str, file: &Path, reporter: Reporter) -> Result<u64> {
    use std::os::unix::fs::{FileExt, FileTypeExt};
    let v = Volume::open(pool, vol)?;
    let is_block_device = std::fs::metadata(file).is_ok_and(|m| m.file_type().is_block_device());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(!is_block_device)
        .open(file)
        .map_err(|e| CliError::io(file, e))?;
    let size = v.size();
    if !is_block_device {
        f.set_len(size).map_err(|e| CliError::io(file, e))?;
    }
    let mut progress = reporter.start(&format!("{} -> {}", v.name(), file.display()), size);
    let stopped = |done: u64| {
        usage(format!(
            "interrupted: copied the first {} ({done} of {size} bytes) of '{}' into {}, \
             which is incomplete",
            human(done),
            v.name(),
            file.display()
        ))
    };
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut at = 0;
    while at < size {
        let window = (size - at).min(SPARSE_WINDOW);
        let extents = if is_block_device {
            vec![crate::zvol::Extent {
                offset: at,
                len: window,
                hole: false,
            }]
        } else {
            v.allocation(at, window)?
        };
        for e in extents.iter().filter(|e| !e.hole) {
            let mut pos = e.offset;
            while pos < e.offset + e.len {
                let n = (e.offset + e.len - pos).min(COPY_CHUNK as u64) as usize;
                v.read(pos, &mut buf[..n])?;
                if is_block_device || buf[..n].iter().any(|&b| b != 0) {
                    f.write_all_at(&buf[..n], pos)
                        .map_err(|e| CliError::io(file, e))?;
                }
                pos += n as u64;
                if !progress.advance(pos) {
                    return Err(stopped(pos));
                }
            }
        }
        at += window;
        if !progress.advance(at) {
            return Err(stopped(at));
        }
    }
    f.sync_all().map_err(|e| CliError::io(file, e))?;
    Ok(size)
}

/// How much of a volume `get` asks the data-and-holes map of at once.
const SPARSE_WINDOW: u64 = 1 << 30;

/// The rows `zeta vol list --json` prints for one pool.
pub fn volume_rows(p: &Pool) -> Vec<serde_json::Value> {
    p.datasets()
        .iter()
        .map(|ds| {
            json!({"name": format!("{}/{}", p.name, ds.name), "size": ds.volsize(),
                   "used": ds.object.used_bytes(), "refreservation": ds.refreservation(),
                   "volblocksize": ds.volblocksize, "checksum": ds.checksum().name(),
                   "compression": ds.object.compression().name(),
                   "logicalused": ds.object.sizes().logical,
                   "compressratio": super::pool_cmd::ratio(ds.object.sizes().ratio())})
        })
        .collect()
}

fn list(home: &Home, pool: Option<&str>, json: bool, out: &mut dyn Write) -> Result<()> {
    let names: Vec<String> = match pool {
        Some(p) => vec![p.to_string()],
        None => home.load()?.pools.keys().cloned().collect(),
    };
    let mut rows = Vec::new();
    for n in &names {
        let served_here = home.served_pools().iter().any(|p| &p.name == n);
        match zeta_server::control::connect(home, n).filter(|_| !served_here) {
            Some(conn) => rows.extend(zeta_server::control::remote_volumes(conn, n)?),
            None => {
                let p = home.open(n)?;
                rows.extend(volume_rows(&p));
                p.close()?;
            }
        }
    }
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows).unwrap()).map_err(stdout_err)?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<32} {:>8} {:>8} {:>9} {:>8}  CHECKSUM",
        "NAME", "SIZE", "USED", "REFRESERV", "BLOCK"
    )
    .map_err(stdout_err)?;
    for r in rows {
        writeln!(
            out,
            "{:<32} {:>8} {:>8} {:>9} {:>8}  {}",
            r["name"].as_str().unwrap(),
            human(r["size"].as_u64().unwrap()),
            human(r["used"].as_u64().unwrap_or(0)),
            match r["refreservation"].as_u64() {
                Some(0) | None => "none".to_string(),
                Some(n) => human(n),
            },
            human(r["volblocksize"].as_u64().unwrap()),
            r["checksum"].as_str().unwrap()
        )
        .map_err(stdout_err)?;
    }
    Ok(())
}
