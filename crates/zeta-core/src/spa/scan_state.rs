//! The state of a pool's last scan (scrub), as the pool config in every label records it, so
//! that a scrub survives export and import. `dsl::scan` runs the scrub.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanPhase {
    /// No scrub has run on this pool.
    #[default]
    None,
    Scanning,
    Finished,
    Canceled,
}

/// Where a paused scrub goes on: the next block id of `volume` (volumes go in name order,
/// after the MOS); no volume means every volume is done. No bookmark at all: the MOS is next.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bookmark {
    pub volume: Option<String>,
    pub blkid: u64,
}

/// A byte range of a volume (or of the pool's own metadata) that no copy could supply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Damage {
    /// `POOL/VOL`, or `POOL` for the pool's metadata.
    pub object: String,
    pub start: u64,
    pub end: u64,
    pub error: String,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// What a scan does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanFunc {
    /// Every block.
    #[default]
    Scrub,
    /// Only blocks born in `ScanState::txgs`: what leaves that were offline or failed writes
    /// missed.
    Resilver,
}

/// The last scan, as the config records it and `pool status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanState {
    #[serde(default)]
    pub func: ScanFunc,
    /// For a resilver: the txgs whose blocks it rewrites (inclusive ranges).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub txgs: Vec<[u64; 2]>,
    /// For a resilver: the GUIDs of the leaves it rebuilds. A paused resilver is resumed
    /// only for the same leaves: one that joined since (a second replacement, another
    /// device back online) owes the blocks before the bookmark too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaves: Vec<u64>,
    pub state: ScanPhase,
    /// Allocated bytes read so far (every copy counts).
    pub examined_bytes: u64,
    /// Allocated bytes in the pool when the scrub started: the goal for `examined_bytes`.
    pub to_examine: u64,
    pub repaired_bytes: u64,
    /// Blocks no copy could supply.
    pub errors: u64,
    /// Seconds since the epoch.
    pub start_secs: u64,
    pub end_secs: u64,
    #[serde(default)]
    pub bookmark: Option<Bookmark>,
    #[serde(default)]
    pub damaged: Vec<Damage>,
    /// For a resilver: the newest birth txg of the blocks it could not rebuild (no copy of
    /// one could be read, or it lies under an indirect block that could not be read), 0 if
    /// none. Every block is born no later than its parent, so what it left out was born by
    /// then: its leaves go on owing the txgs up to it (`dsl::scan::finish`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unrebuilt_txg: u64,
    /// For a resilver: the scrub it interrupted (paused at its bookmark), which goes on
    /// once the resilver is done. Restoring redundancy comes first, as in ZFS, but a long
    /// scrub's progress is not thrown away for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<Box<ScanState>>,
}
