//! `zeta serve`'s watch on its pools' health: a line on stderr when a pool is suspended or a
//! device changes state, at the moment it happens, so whoever reads the server's log learns
//! of a full file system or a failing disk without running `zeta pool status`.
//!
//! The engine does not print; this thread looks every `INTERVAL` and says what changed.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::{Arc, Weak};
use std::time::Duration;

use zeta_core::dsl::{Pool, Suspension};

const INTERVAL: Duration = Duration::from_millis(500);

/// What the watch last saw of one pool.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Health {
    pub suspended: Option<Suspension>,
    /// Each leaf's path and state (ONLINE, OFFLINE, FAULTED, UNAVAIL), with its write and
    /// read error counts for the message.
    pub leaves: BTreeMap<String, (String, u64, u64)>,
}

impl Health {
    pub fn of(pool: &Pool) -> Health {
        let leaves = pool
            .vdev_status()
            .into_iter()
            .flat_map(|t| t.leaves)
            .map(|l| (l.path, (l.state.to_string(), l.write_errors, l.read_errors)))
            .collect();
        Health {
            suspended: pool.suspension(),
            leaves,
        }
    }
}

/// The lines that say how pool `name` went from `before` to `now`.
pub fn changes(name: &str, before: &Health, now: &Health) -> Vec<String> {
    let mut out = Vec::new();
    for (path, (state, werr, rerr)) in &now.leaves {
        let was = before.leaves.get(path).map(|(s, _, _)| s.as_str());
        if was.is_some_and(|w| w != state) {
            let mut line = format!(
                "pool '{name}': {path} is {state} (was {}; {werr} write and {rerr} read errors)",
                was.unwrap_or("?")
            );
            match (was, state.as_str()) {
                // While the pool is suspended the pool's line tells the effect and the cure:
                // "the pool goes on with the other copies" would be untrue.
                (_, "NOSPACE") if now.suspended.is_some() => line += NO_ROOM_SUSPENDED,
                (_, "NOSPACE") => line += &format!(": {NO_ROOM_EFFECT}. To cure: {NO_ROOM_CURE}"),
                (Some("NOSPACE"), "ONLINE") => {
                    line +=
                        ": it takes writes again, and what it missed, if anything, is resilvered"
                }
                _ => {}
            }
            out.push(line);
        }
    }
    match (&before.suspended, &now.suspended) {
        (None, Some(s)) => out.push(suspended(name, s)),
        // A wait for room that ended in a failure for good (the pool was closed meanwhile).
        (Some(b), Some(s)) if b.retrying && !s.retrying => out.push(suspended(name, s)),
        (Some(_), None) => out.push(format!(
            "pool '{name}' RESUMED: room was made, the txg that waited for it has committed, \
             and writes are taken again"
        )),
        _ => {}
    }
    out
}

/// The line that says pool `name` is suspended, what clients are told, and the cure.
fn suspended(name: &str, s: &Suspension) -> String {
    format!(
        "pool '{name}' is SUSPENDED: {}. {}. To resume: {}.",
        s.why,
        effect(s),
        cure(s)
    )
}

/// What a device out of room (NOSPACE) is, said beside a suspension of its pool (whose own
/// line says what follows and what cures it).
pub const NO_ROOM_SUSPENDED: &str = ": the file system under it is full";

/// What a device out of room (NOSPACE) means, and what cures it, for the server's log and
/// `pool status`, while its pool goes on.
pub const NO_ROOM_EFFECT: &str = "the file system under it is full, so it misses the writes \
     it cannot take; the pool goes on with the other copies, with less redundancy";
pub const NO_ROOM_CURE: &str = "free room on that file system; the device then takes writes \
     again and is resilvered by itself with what it missed";

/// What clients meet while pool is suspended `s`, for the server's log and `pool status`.
pub fn effect(s: &Suspension) -> &'static str {
    match (s.retrying, s.out_of_space) {
        (true, _) => {
            "Writes and flushes now fail (ENOSPC), nothing written so far is lost, reads go on"
        }
        (false, true) => "Writes and flushes now fail (ENOSPC); reads go on",
        (false, false) => "Writes and flushes now fail (EIO); reads go on",
    }
}

/// What resumes a pool suspended `s`, for the server's log and `pool status`.
pub fn cure(s: &Suspension) -> &'static str {
    match (s.retrying, s.out_of_space) {
        (true, _) => {
            "free room on the file system under its devices; the pool tries again every \
             second and resumes by itself, losing nothing"
        }
        (false, true) => {
            "free room on the file system under its devices, then restart the server; the \
             intent log replays every acknowledged write"
        }
        (false, false) => {
            "bring its devices back or replace them, then restart the server; the intent log \
             replays every acknowledged write"
        }
    }
}

/// Starts the watch over `pools`; it ends when the last of them is dropped.
pub fn start(pools: &[Arc<Pool>]) {
    let pools: Vec<(String, Weak<Pool>)> = pools
        .iter()
        .map(|p| (p.name.clone(), Arc::downgrade(p)))
        .collect();
    let _ = std::thread::Builder::new()
        .name("health".into())
        .spawn(move || {
            let mut seen: Vec<Option<Health>> = vec![None; pools.len()];
            loop {
                let mut live = 0;
                for ((name, weak), last) in pools.iter().zip(seen.iter_mut()) {
                    let Some(pool) = weak.upgrade() else { continue };
                    live += 1;
                    let now = Health::of(&pool);
                    if let Some(before) = last {
                        for line in changes(name, before, &now) {
                            // Written, not printed: stderr may be closed, and this thread
                            // must not panic over it.
                            let _ = writeln!(std::io::stderr(), "zeta serve: {line}");
                        }
                    }
                    *last = Some(now);
                }
                if live == 0 {
                    return;
                }
                std::thread::sleep(INTERVAL);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(leaves: &[(&str, &str)], suspended: Option<(&str, bool)>) -> Health {
        Health {
            suspended: suspended.map(|(why, out_of_space)| Suspension {
                why: why.into(),
                out_of_space,
                retrying: false,
            }),
            leaves: leaves
                .iter()
                .map(|(p, s)| (p.to_string(), (s.to_string(), 3, 0)))
                .collect(),
        }
    }

    #[test]
    fn nothing_changed_says_nothing() {
        let h = health(&[("/a", "ONLINE"), ("/b", "ONLINE")], None);
        assert!(changes("tank", &h, &h).is_empty());
    }

    #[test]
    fn a_leaf_that_changes_state_is_named_with_its_errors() {
        let before = health(&[("/a", "ONLINE"), ("/b", "ONLINE")], None);
        let now = health(&[("/a", "ONLINE"), ("/b", "FAULTED")], None);
        assert_eq!(
            changes("tank", &before, &now),
            ["pool 'tank': /b is FAULTED (was ONLINE; 3 write and 0 read errors)"]
        );
        // A device added since the last look is no change of state.
        let grown = health(
            &[("/a", "ONLINE"), ("/b", "FAULTED"), ("/c", "ONLINE")],
            None,
        );
        assert!(changes("tank", &now, &grown).is_empty());
    }

    #[test]
    fn a_leaf_out_of_room_is_told_with_its_cure_and_its_return() {
        let before = health(&[("/a", "ONLINE"), ("/b", "ONLINE")], None);
        let full = health(&[("/a", "ONLINE"), ("/b", "NOSPACE")], None);
        let lines = changes("tank", &before, &full);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("pool 'tank': /b is NOSPACE (was ONLINE; 3 write"),
            "{lines:?}"
        );
        assert!(lines[0].contains("less redundancy"), "{lines:?}");
        assert!(lines[0].contains("resilvered by itself"), "{lines:?}");
        let lines = changes("tank", &full, &before);
        assert!(
            lines[0].ends_with("what it missed, if anything, is resilvered"),
            "{lines:?}"
        );
    }

    #[test]
    fn a_leaf_out_of_room_in_a_suspended_pool_promises_no_other_copies() {
        let before = health(&[("/a", "ONLINE"), ("/b", "ONLINE")], None);
        let full = health(
            &[("/a", "NOSPACE"), ("/b", "NOSPACE")],
            Some(("/a: No space left on device", true)),
        );
        let lines = changes("tank", &before, &full);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines[0].ends_with("errors): the file system under it is full"),
            "{lines:?}"
        );
        assert!(
            lines.iter().all(|l| !l.contains("other copies")),
            "{lines:?}"
        );
        assert!(lines[2].contains("'tank' is SUSPENDED"), "{lines:?}");
    }

    #[test]
    fn a_suspension_is_told_once_with_its_cure() {
        let before = health(&[("/a", "ONLINE")], None);
        let full = health(
            &[("/a", "ONLINE")],
            Some(("/a: No space left on device", true)),
        );
        let lines = changes("tank", &before, &full);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].contains("'tank' is SUSPENDED"), "{}", lines[0]);
        assert!(lines[0].contains("No space left"), "{}", lines[0]);
        assert!(lines[0].contains("(ENOSPC)"), "{}", lines[0]);
        assert!(
            lines[0].contains("free room on the file system"),
            "{}",
            lines[0]
        );
        assert!(changes("tank", &full, &full).is_empty());

        let mut waiting = full.clone();
        waiting.suspended.as_mut().unwrap().retrying = true;
        let lines = changes("tank", &before, &waiting);
        assert!(
            lines[0].contains("nothing written so far is lost"),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains("resumes by itself"), "{}", lines[0]);
        assert_eq!(
            changes("tank", &waiting, &before),
            [
                "pool 'tank' RESUMED: room was made, the txg that waited for it has committed, \
              and writes are taken again"
            ]
        );
        // A wait that ends in a failure for good (the server stopping) is told too.
        let lines = changes("tank", &waiting, &full);
        assert!(lines[0].contains("restart the server"), "{lines:?}");

        let broken = health(&[("/a", "ONLINE")], Some(("/a: Input/output error", false)));
        let lines = changes("tank", &before, &broken);
        assert!(lines[0].contains("(EIO)"), "{}", lines[0]);
        assert!(lines[0].contains("replace them"), "{}", lines[0]);
    }
}
