//! The operations a served pool answers on its control socket (`zeta_server::control` carries
//! the requests; the list of operations is in its header).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use clap::Parser;
use serde_json::{json, Value};
use zeta_server::control::{text, texts};
use zeta_server::progress::Reporter;
use zeta_server::state::Home;
use zeta_server::{usage, Result};

use super::args::{Cli, Command, VolCmd};

/// Answers one control request against the pool `home` serves.
pub fn answer(home: &Home, req: &Value, conn: &UnixStream) -> Result<Value> {
    let pool = home.served_pools()[0].clone();
    match req["op"].as_str() {
        Some("status") => Ok(json!({"ok": true, "value": super::pool_cmd::status_json(&pool)})),
        Some("sync") => {
            pool.sync_frees()?;
            Ok(json!({"ok": true}))
        }
        Some("iostat") => Ok(json!({"ok": true, "value": super::pool_cmd::iostat_json(&pool)})),
        Some("arcstat") => Ok(json!({"ok": true, "value": super::pool_cmd::arcstat_json(&pool)})),
        Some("map") => Ok(json!({"ok": true, "value": pool.metaslab_map()})),
        Some("scrub") => {
            if req["stop"] == json!(true) {
                pool.stop_scrub()?;
            } else {
                pool.start_scrub()?;
            }
            Ok(json!({"ok": true}))
        }
        Some("offline") => {
            let dev = text(req, "device")?;
            pool.set_offline(dev, req["offline"] == json!(true))?;
            Ok(json!({"ok": true}))
        }
        Some("inject") => {
            let dev = text(req, "device")?;
            let faults = zeta_core::dsl::Injection {
                fail_reads: req["fail_reads"].as_f64().unwrap_or(0.0),
                fail_writes: req["fail_writes"].as_f64().unwrap_or(0.0),
                full: req["full"] == json!(true),
                vanished: req["vanished"] == json!(true),
            };
            pool.inject(dev, faults)?;
            Ok(json!({"ok": true}))
        }
        Some("corrupt") => {
            let dev = text(req, "device")?;
            let n = req["count"].as_u64().unwrap_or(0) as usize;
            let done = pool.corrupt_sectors(dev, n, req["seed"].as_u64().unwrap_or(1))?;
            Ok(json!({"ok": true, "value": done}))
        }
        Some("replace") => {
            let old = text(req, "old")?;
            let new = text(req, "new")?;
            super::pool_cmd::replace_in(&pool, old, Path::new(new), req["force"] == json!(true))?;
            Ok(json!({"ok": true}))
        }
        Some("add_log") => {
            let words: Vec<String> = texts(req, "vdevs")?;
            let ids = super::pool_cmd::add_log_in(
                &pool,
                &words,
                req["size"].as_u64(),
                req["force"] == json!(true),
            )?;
            Ok(json!({"ok": true, "value": ids}))
        }
        Some("remove") => {
            let dev = text(req, "device")?;
            Ok(json!({"ok": true, "value": pool.remove_log(dev)?}))
        }
        Some("clear") => {
            pool.clear_errors()?;
            Ok(json!({"ok": true}))
        }
        Some("volumes") => Ok(json!({"ok": true, "value": super::vol_cmd::volume_rows(&pool)})),
        Some("datasets") => Ok(json!({"ok": true, "value": super::snap_cmd::dataset_rows(&pool)})),
        Some("run") => {
            let argv: Vec<String> = texts(req, "argv")?;
            let cwd = PathBuf::from(req["cwd"].as_str().unwrap_or("/"));
            let cli = Cli::try_parse_from(std::iter::once("zeta".to_string()).chain(argv))
                .map_err(|e| {
                    usage(
                        e.to_string()
                            .lines()
                            .next()
                            .unwrap_or("bad arguments")
                            .to_string(),
                    )
                })?;
            let mut cmd = match cli.command {
                Command::Vol(cmd) => cmd,
                Command::Get(a) => VolCmd::PropGet(a),
                Command::Set(a) => VolCmd::PropSet(a),
                Command::Snapshot(a) => VolCmd::Snapshot(a),
                Command::List(a) => VolCmd::DsList(a),
                Command::Destroy(a) => VolCmd::DsDestroy(a),
                Command::Rollback(a) => VolCmd::DsRollback(a),
                Command::Send(a) => VolCmd::DsSend(a),
                Command::Receive(a) => VolCmd::DsReceive(a),
                Command::Clone(a) => VolCmd::DsClone(a),
                Command::Promote(a) => VolCmd::DsPromote(a),
                _ => {
                    return Err(usage(format!(
                        "pool '{}' is served by this `zeta serve`; only `zeta vol`, `zeta \
                         get|set|snapshot|clone|promote|list|destroy|rollback|send|receive` and `zeta pool status|list` reach it (stop the server to \
                         export or destroy it)",
                        pool.name
                    )))
                }
            };
            // The server's working directory is not the client's.
            if let VolCmd::Put { file, .. } | VolCmd::Get { file, .. } = &mut cmd {
                if file.is_relative() {
                    *file = cwd.join(&*file);
                }
            }
            if let VolCmd::DsSend(super::args::SendArgs {
                output: Some(file), ..
            })
            | VolCmd::DsReceive(super::args::ReceiveArgs {
                file: Some(file), ..
            }) = &mut cmd
            {
                if file.is_relative() {
                    *file = cwd.join(&*file);
                }
            }
            let mut out = Vec::new();
            super::vol_cmd::run_to(home, cmd, &mut out, Reporter::Remote(conn))?;
            Ok(json!({"ok": true, "stdout": String::from_utf8_lossy(&out)}))
        }
        _ => Err(usage("unknown control request")),
    }
}
