//! `zeta get` and `zeta set`: volumes' properties by name, as `zfs get` and `zfs set`.

use std::io::Write;

use serde_json::{json, Value};

use super::args::{GetArgs, SetArgs};
use super::vol_cmd::split_name;
use super::{stdout_err, usage, CliError, Result};
use crate::dsl::{Compression, Dataset, Pool};
use zeta_math::ChecksumKind;
use zeta_server::fmt::{human, parse_size};
use zeta_server::state::Home;

/// Every property, in the order `get all` shows them.
const PROPERTIES: &[&str] = &[
    "type",
    "volsize",
    "volblocksize",
    "checksum",
    "compression",
    "refreservation",
    "readonly",
    "used",
    "referenced",
    "usedbysnapshots",
    "written",
    "logicalused",
    "logicalreferenced",
    "compressratio",
    "origin",
    "receive_resume_token",
    "guid",
    "createtxg",
];

/// A property's value: a number of bytes (shown as a size unless -p), another number, or text.
enum Val {
    Bytes(u64),
    Number(u64),
    Text(String),
}

impl Val {
    fn shown(&self, parsable: bool) -> String {
        match self {
            Val::Bytes(n) if !parsable => human(*n),
            Val::Bytes(n) | Val::Number(n) => n.to_string(),
            Val::Text(t) => t.clone(),
        }
    }

    fn json(&self) -> Value {
        match self {
            Val::Bytes(n) | Val::Number(n) => json!(n),
            Val::Text(t) => json!(t),
        }
    }
}

/// A property of volume or snapshot `ds` of pool `p`. A volume's `used` is what its blocks
/// take (as `vol list` shows it); a snapshot's, what it alone holds (as `zeta list`).
fn value(p: &Pool, ds: &Dataset, prop: &str) -> Val {
    let f = ds.figures();
    match prop {
        "type" if ds.snapshot => Val::Text("snapshot".into()),
        "type" => Val::Text("volume".into()),
        "volsize" => Val::Bytes(ds.volsize()),
        "volblocksize" => Val::Bytes(ds.volblocksize as u64),
        "checksum" => Val::Text(ds.checksum().name().into()),
        "compression" => Val::Text(ds.object.compression().name()),
        "logicalused" | "logicalreferenced" => Val::Bytes(ds.object.sizes().logical),
        "compressratio" => Val::Text(format!("{:.2}x", ds.object.sizes().ratio())),
        "refreservation" => Val::Bytes(ds.refreservation()),
        "readonly" => Val::Text(if ds.readonly() { "on" } else { "off" }.into()),
        "used" if ds.snapshot => Val::Bytes(f.unique),
        "used" => Val::Bytes(ds.object.used_bytes()),
        "referenced" => Val::Bytes(f.referenced),
        "usedbysnapshots" => Val::Bytes(f.usedbysnapshots),
        "written" => Val::Bytes(f.written),
        "origin" => Val::Text(match ds.snapshot {
            true => "-".into(),
            false => (p.origin_of(&ds.name)).map_or("-".into(), |o| format!("{}/{o}", p.name)),
        }),
        "receive_resume_token" => Val::Text(
            (ds.receiving().as_ref()).map_or("-".into(), crate::zvol::receive::resume_token),
        ),
        "guid" => Val::Number(ds.guid),
        "createtxg" => Val::Number(ds.created_txg),
        _ => unreachable!("properties are checked against PROPERTIES first"),
    }
}

/// The properties `list` names (`all`, or names separated by commas), each known.
fn wanted(list: &str) -> Result<Vec<&'static str>> {
    if list == "all" {
        return Ok(PROPERTIES.to_vec());
    }
    list.split(',')
        .map(|name| {
            PROPERTIES
                .iter()
                .find(|p| **p == name)
                .copied()
                .ok_or_else(|| unknown(name))
        })
        .collect()
}

fn unknown(name: &str) -> CliError {
    usage(format!(
        "unknown property '{name}' (properties: {})",
        PROPERTIES.join(", ")
    ))
}

/// The pool `zeta get` reads: that of its names, which must all be of one pool.
pub fn get_pool(a: &GetArgs) -> Result<&str> {
    let mut pools = a.names.iter().map(|n| split_name(n).map(|(p, _)| p));
    let first = pools.next().expect("clap requires a name")?;
    for p in pools {
        if p? != first {
            return Err(usage(
                "zeta get takes volumes of one pool at a time".to_string(),
            ));
        }
    }
    Ok(first)
}

pub fn get(home: &Home, a: GetArgs, out: &mut dyn Write) -> Result<()> {
    let props = wanted(&a.props)?;
    let p = home.open(get_pool(&a)?)?;
    let rows = rows(&p, &a.names, &props);
    p.close()?;
    let rows = rows?;
    if a.json {
        let mut by_name = serde_json::Map::new();
        for (name, vals) in &rows {
            let props: serde_json::Map<String, Value> = vals
                .iter()
                .map(|(k, v)| (k.to_string(), v.json()))
                .collect();
            by_name.insert(name.clone(), Value::Object(props));
        }
        let text = serde_json::to_string_pretty(&Value::Object(by_name)).unwrap();
        return writeln!(out, "{text}").map_err(stdout_err);
    }
    if !a.scripted {
        writeln!(out, "{:<32} {:<16} VALUE", "NAME", "PROPERTY").map_err(stdout_err)?;
    }
    for (name, vals) in &rows {
        for (prop, v) in vals {
            let shown = v.shown(a.parsable);
            if a.scripted {
                writeln!(out, "{name}\t{prop}\t{shown}").map_err(stdout_err)?;
            } else {
                writeln!(out, "{name:<32} {prop:<16} {shown}").map_err(stdout_err)?;
            }
        }
    }
    Ok(())
}

type Row = (String, Vec<(&'static str, Val)>);

fn rows(p: &Pool, names: &[String], props: &[&'static str]) -> Result<Vec<Row>> {
    names
        .iter()
        .map(|full| {
            let (_, vol) = split_name(full)?;
            let ds = p.dataset_or_snapshot(vol)?;
            let vals = props.iter().map(|&k| (k, value(p, &ds, k))).collect();
            Ok((full.clone(), vals))
        })
        .collect()
}

fn set_readonly(
    home: &Home,
    full: &str,
    pool: &str,
    vol: &str,
    val: &str,
    out: &mut dyn Write,
) -> Result<()> {
    let on = match val {
        "on" => true,
        "off" => false,
        _ => return Err(usage(format!("readonly={val}: give on or off"))),
    };
    let p = home.open(pool)?;
    let r = p.set_readonly(vol, on);
    p.close()?;
    r?;
    writeln!(out, "set readonly={val} on '{full}'").map_err(stdout_err)
}

pub fn set(home: &Home, a: SetArgs, out: &mut dyn Write) -> Result<()> {
    let Some((prop, val)) = a.assignment.split_once('=') else {
        return Err(usage(format!("'{}' is not PROP=VALUE", a.assignment)));
    };
    let (pool, vol) = split_name(&a.name)?;
    if vol.contains('@') {
        return Err(usage(format!(
            "'{}' is a snapshot: its properties are read-only",
            a.name
        )));
    }
    match prop {
        "volsize" => {}
        "readonly" => return set_readonly(home, &a.name, pool, vol, val, out),
        "checksum" => {
            let kind = ChecksumKind::parse(val).ok_or_else(|| {
                usage(format!(
                    "checksum={val}: give fletcher2, fletcher4, sha256 or blake3"
                ))
            })?;
            let p = home.open(pool)?;
            let r = p.set_checksum(vol, kind);
            p.close()?;
            r?;
            return writeln!(out, "set checksum={val} on '{}' (its new blocks)", a.name)
                .map_err(stdout_err);
        }
        "compression" => {
            let c = Compression::parse(val).map_err(usage)?;
            let p = home.open(pool)?;
            let r = p.set_compression(vol, c);
            p.close()?;
            r?;
            return writeln!(
                out,
                "set compression={val} on '{}' (its new blocks)",
                a.name
            )
            .map_err(stdout_err);
        }
        "refreservation" => {
            let reserve = match val {
                "auto" => true,
                "none" | "0" => false,
                _ => {
                    return Err(usage(format!(
                        "refreservation={val}: give auto (room for the whole volume) or none \
                         (sparse)"
                    )))
                }
            };
            let p = home.open(pool)?;
            let r = p.set_refreservation(vol, reserve);
            p.close()?;
            r?;
            return writeln!(out, "set refreservation={val} on '{}'", a.name).map_err(stdout_err);
        }
        "volblocksize" => {
            return Err(usage(
                "volblocksize is fixed when a volume is created (zeta vol create -b)".to_string(),
            ))
        }
        _ if PROPERTIES.contains(&prop) => {
            return Err(usage(format!("{prop} is read-only")));
        }
        _ => return Err(unknown(prop)),
    }
    let size = parse_size(val)?;
    let p = home.open(pool)?;
    let r = p.dataset(vol).map_err(CliError::from).and_then(|ds| {
        if size < ds.volsize() {
            return Err(usage(format!(
                "volsize={val} would shrink '{}' from {} and discard the data past {}: use \
                 zeta vol resize -f to shrink it",
                a.name,
                human(ds.volsize()),
                human(size)
            )));
        }
        Ok(p.resize_volume(vol, size)?)
    });
    p.close()?;
    r?;
    writeln!(out, "set volsize={} on '{}'", human(size), a.name).map_err(stdout_err)
}
