//! `zeta pool scrub`, and following a scan (a scrub, or the resilver of a replace) with its
//! progress line.

use super::{pool_status, status_json};
use crate::cli::Result;
use crate::dsl::Pool;
use zeta_server::control;
use zeta_server::fmt::human;
use zeta_server::state::Home;

pub(super) fn scrub(home: &Home, name: &str, wait: bool, stop: bool) -> Result<()> {
    if let Some(conn) = control::connect(home, name) {
        control::remote_scrub(conn, name, stop)?;
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
    if p.scan_status().state != crate::dsl::ScanPhase::Scanning {
        p.start_scrub()?;
    }
    let last = follow(&p)?;
    p.close()?;
    Progress::finish(name, &last["scan"]);
    Ok(())
}

/// Shows the progress of the scan running in `p` (this process) until it ends; returns the
/// pool's status then.
pub(super) fn follow(p: &Pool) -> Result<serde_json::Value> {
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
pub(super) fn print_damaged(scan: &serde_json::Value, with_error: bool) {
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
pub(super) struct Progress {
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

    pub(super) fn finish(name: &str, scan: &serde_json::Value) {
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
