//! On-disk feature flags (OpenZFS's `feature@…`): the label records each feature a pool has
//! enabled, whether it is in use, and whether a zeta that does not know it can still read the
//! pool. A format change becomes one named feature instead of a global version bump, so an
//! older zeta opens every pool whose active features it knows, and read-only what it can read.
//!
//! Layout in the label's config (JSON, `docs/format.md`): `"features": {"NAME": {"active":
//! bool, "read_compatible": bool}}`, absent while empty.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A feature this zeta knows: its name (`org.zeta:NAME`, as OpenZFS names `com.delphix:…`),
/// and whether a zeta that does not know it can read a pool where it is active.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feature {
    pub name: &'static str,
    pub read_compatible: bool,
}

/// Each volume's dnode keeps the bytes its tree takes on the devices (`DnodePhys::
/// used_bytes`). A zeta that does not know it reads the pool as ever; one that wrote to it
/// would leave the figure stale.
pub const SPACE_USED: Feature = Feature {
    name: "org.zeta:space_used",
    read_compatible: true,
};

/// Directory entries keep each volume's reservation (`DirEntryPhys::refreservation`). A zeta
/// that does not know it reads the pool as ever; one that wrote to it would drop the
/// reservations.
pub const REFRESERVATION: Feature = Feature {
    name: "org.zeta:refreservation",
    read_compatible: true,
};

/// Block pointers may name gang blocks (`BlkPtr::flags`, `zio::gang`): a block written in
/// pieces where no free segment took it whole. A zeta that does not know them would read a
/// gang header as the block, so it may not open such a pool at all.
pub const GANG_BLOCKS: Feature = Feature {
    name: "org.zeta:gang_blocks",
    read_compatible: false,
};

/// Volumes may have snapshots: the dataset table (MOS slot 2, `dsl::dataset`), its deadlists,
/// and each directory entry's `dataset_id`. A zeta that does not know it reads every volume's
/// head as ever (snapshots unseen); one that wrote to the pool would free blocks the
/// snapshots still hold.
pub const SNAPSHOTS: Feature = Feature {
    name: "org.zeta:snapshots",
    read_compatible: true,
};

/// Directory entries keep each volume's flags (`DirEntryPhys::flags`: `readonly`). A zeta
/// that does not know it reads the pool as ever; one that wrote to it would let clients
/// write a read-only volume, and drop the flag.
pub const VOLUME_FLAGS: Feature = Feature {
    name: "org.zeta:volume_flags",
    read_compatible: true,
};

/// Directory entries keep an interrupted `zeta receive -s`'s place (`DirEntryPhys::
/// recv_*`). A zeta that does not know it reads the pool (the partly received volume as a
/// volume); one that wrote would forget the place, and the receive could not resume.
pub const RECEIVE_RESUME: Feature = Feature {
    name: "org.zeta:receive_resume",
    read_compatible: true,
};

/// Data blocks may be stored compressed (`BlkPtr::compression`: lz4 or zstd, `zio::compress`),
/// and dnodes keep the `compression` property and their trees' logical and stored sizes
/// (`DnodePhys::compress`, `logical_bytes`, `physical_bytes`). A zeta that does not know it
/// would hand compressed bytes to its readers as data, so it may not open such a pool.
pub const COMPRESSION: Feature = Feature {
    name: "org.zeta:compression",
    read_compatible: false,
};

/// The features this zeta supports. Each format change adds one here (with a fixture image
/// from before it in `tests/fixtures/`).
pub const SUPPORTED: &[Feature] = &[
    SPACE_USED,
    REFRESERVATION,
    GANG_BLOCKS,
    SNAPSHOTS,
    VOLUME_FLAGS,
    RECEIVE_RESUME,
    COMPRESSION,
];

/// The features a new pool starts with: every one this zeta supports, each active from the
/// first txg (each one's structures are written from then on).
pub fn for_new_pool() -> Features {
    SUPPORTED
        .iter()
        .map(|f| (f.name.to_string(), FeatureState::active(f)))
        .collect()
}

/// Whether `feature` is active in `features`.
pub fn is_active(features: &Features, feature: &Feature) -> bool {
    features.get(feature.name).is_some_and(|st| st.active)
}

/// A feature's state in one pool's label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeatureState {
    /// On-disk structures that need the feature exist now; while false the feature is only
    /// enabled and any zeta can open the pool.
    pub active: bool,
    /// A zeta that does not know the feature may import the pool read-only while it is active.
    pub read_compatible: bool,
}

impl FeatureState {
    pub fn active(f: &Feature) -> FeatureState {
        FeatureState {
            active: true,
            read_compatible: f.read_compatible,
        }
    }
}

/// The features of a pool's label, by name.
pub type Features = BTreeMap<String, FeatureState>;

/// Why a pool's features keep this zeta from opening it as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeatureError {
    #[error("it uses feature '{0}', which this zeta does not support (a newer zeta made it)")]
    Unsupported(String),
    #[error(
        "it uses feature '{0}', which this zeta does not support for writing; it can be \
         imported read-only (-o readonly=on)"
    )]
    ReadOnly(String),
}

/// Why this zeta cannot open a pool with `features` as asked: the first active feature it does
/// not know, named; if every such feature is read-compatible, a read-only import is allowed.
pub fn check(features: &Features, readonly: bool) -> Result<(), FeatureError> {
    check_against(features, readonly, SUPPORTED)
}

fn check_against(
    features: &Features,
    readonly: bool,
    known: &[Feature],
) -> Result<(), FeatureError> {
    let unknown = |name: &str| !known.iter().any(|f| f.name == name);
    let active_unknown: Vec<(&String, &FeatureState)> = features
        .iter()
        .filter(|(name, st)| st.active && unknown(name))
        .collect();
    if let Some((name, _)) = active_unknown.iter().find(|(_, st)| !st.read_compatible) {
        return Err(FeatureError::Unsupported(name.to_string()));
    }
    if let Some((name, _)) = active_unknown.first() {
        if !readonly {
            return Err(FeatureError::ReadOnly(name.to_string()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &str, active: bool, read_compatible: bool) -> Features {
        Features::from([(
            name.to_string(),
            FeatureState {
                active,
                read_compatible,
            },
        )])
    }

    #[test]
    fn an_unknown_active_feature_is_refused_by_name() {
        let f = with("org.example:future", true, false);
        let e = check(&f, false).unwrap_err();
        assert_eq!(e, FeatureError::Unsupported("org.example:future".into()));
        assert!(e.to_string().contains("'org.example:future'"), "{e}");
        assert!(check(&f, true).is_err(), "not even read-only");
    }

    #[test]
    fn an_unknown_read_compatible_feature_allows_read_only() {
        let f = with("org.example:future", true, true);
        let e = check(&f, false).unwrap_err();
        assert_eq!(e, FeatureError::ReadOnly("org.example:future".into()));
        assert_eq!(check(&f, true), Ok(()));
    }

    #[test]
    fn an_enabled_but_unused_feature_stops_nothing() {
        assert_eq!(
            check(&with("org.example:future", false, false), false),
            Ok(())
        );
    }

    #[test]
    fn a_known_feature_is_opened_whatever_its_compatibility() {
        let known = [Feature {
            name: "org.zeta:test",
            read_compatible: false,
        }];
        let f = with("org.zeta:test", true, false);
        assert_eq!(check_against(&f, false, &known), Ok(()));
        assert!(check_against(&f, false, &[]).is_err());
    }
}
