//! Pool properties kept in the config: how the intent log commits and places its blocks.
//! (They live here, with the config, so `spa` does not depend on `zil`, which uses them.)

use serde::{Deserialize, Serialize};

/// How sync requests become log writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CommitPolicy {
    /// Each request writes and flushes its own log block, one request at a time.
    PerRequest,
    /// One committer takes everything queued and answers every request it covers.
    #[default]
    Group,
}

/// How log blocks are spread over devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Each volume has its own rotor, starting at the first device.
    PerVolume,
    /// One rotor shared by every volume of the pool.
    #[default]
    Global,
}

impl CommitPolicy {
    pub fn parse(s: &str) -> Option<CommitPolicy> {
        match s {
            "per-request" => Some(CommitPolicy::PerRequest),
            "group" => Some(CommitPolicy::Group),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            CommitPolicy::PerRequest => "per-request",
            CommitPolicy::Group => "group",
        }
    }
}

impl Placement {
    pub fn parse(s: &str) -> Option<Placement> {
        match s {
            "per-volume" => Some(Placement::PerVolume),
            "global" => Some(Placement::Global),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Placement::PerVolume => "per-volume",
            Placement::Global => "global",
        }
    }
}
