//! Leaf labels: the pool configuration and the uberblock ring, four copies per leaf.
//!
//! A label is `LABEL_SIZE` (256 KiB): a config area of `CONFIG_AREA` bytes (a 64-byte header and
//! a JSON payload, checksummed with SHA-256) followed by a ring of `UB_SLOTS` uberblock slots of
//! `UB_SLOT` bytes; txg N's uberblock goes to slot N mod `UB_SLOTS`. See docs/format.md.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::bp::BlkPtr;
use crate::vdev::layout::FREED_MAGIC;
use crate::vdev::{Leaf, RaidzConfig, TopKind, VdevError, LABEL_COUNT, LABEL_SIZE};
use zeta_math::ChecksumKind;

/// The version written. 2: intent log blocks carry a Fletcher-4 checksum (`ZETAZIL2`), which
/// a version-1 zeta would take for the end of the log, dropping it. 3: the config carries
/// feature flags (`spa::feature`), which a version-2 zeta would ignore. The last bump: later
/// format changes are features.
pub const FORMAT_VERSION: u64 = 3;
/// The oldest version read. A pool of an older version is read as it is; every label and
/// uberblock written from then on says the current one, so an older zeta refuses it.
pub const OLDEST_READABLE_VERSION: u64 = 1;

/// Whether this zeta reads labels and uberblocks of format `version`.
fn readable(version: u64) -> bool {
    (OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version)
}
pub const LABEL_MAGIC: u64 = u64::from_le_bytes(*b"ZETALABL");
pub const UB_MAGIC: u64 = u64::from_le_bytes(*b"ZETAUBER");
pub const CONFIG_AREA: u64 = 32 * 1024;
const CONFIG_HEADER: usize = 64;
pub const UB_SLOT: u64 = 4096;
pub const UB_SLOTS: u64 = (LABEL_SIZE - CONFIG_AREA) / UB_SLOT;

#[derive(Debug, thiserror::Error)]
pub enum LabelError {
    #[error("no zeta label (bad magic)")]
    BadMagic,
    #[error(
        "format version {0} is not supported by this zeta (which reads versions {OLDEST_READABLE_VERSION} to {FORMAT_VERSION})"
    )]
    UnknownVersion(u64),
    #[error("label checksum mismatch")]
    BadChecksum,
    #[error("label config unreadable: {0}")]
    Parse(String),
    #[error(transparent)]
    Io(#[from] VdevError),
}

impl LabelError {
    /// Whether this says that a zeta label is there but cannot be used (damaged, unparsable, or
    /// of a newer format), as opposed to there being none or the device being unreadable.
    pub fn label_present(&self) -> bool {
        matches!(
            self,
            LabelError::UnknownVersion(_) | LabelError::BadChecksum | LabelError::Parse(_)
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolState {
    Active,
    Exported,
    Destroyed,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeafConfig {
    pub guid: u64,
    /// Where the leaf was last seen; a hint, import searches by GUID.
    pub path: String,
    /// Its error counters when the config was written, so `zeta pool status` shows them after
    /// a restart too (`zeta pool clear` zeroes them).
    #[serde(default, skip_serializing_if = "LeafErrors::is_zero")]
    pub errors: LeafErrors,
    /// Taken offline by the administrator.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub offline: bool,
    /// Taken out of service after a run of I/O failures, until `zeta pool clear`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub faulted: bool,
    /// Txgs whose writes the leaf missed, as inclusive ranges: what a resilver owes it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missed: Vec<[u64; 2]>,
}

/// A leaf's error counts, as `zeta pool status` shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeafErrors {
    pub read: u64,
    pub write: u64,
    pub cksum: u64,
    pub repaired_bytes: u64,
}

impl LeafErrors {
    pub fn is_zero(&self) -> bool {
        *self == LeafErrors::default()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopConfig {
    pub id: u32,
    pub guid: u64,
    pub kind: TopKind,
    pub asize: u64,
    pub ms_shift: u32,
    pub ms_count: u32,
    pub children: Vec<LeafConfig>,
    /// Parity level and code of a raidz vdev (children in column order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raidz: Option<RaidzConfig>,
    /// Bytes at the end of the vdev kept for intent-log blocks, out of the data allocator's
    /// reach (whole metaslabs; 0 on pools made before the log existed).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub log_bytes: u64,
    /// A separate log device: the whole vdev is log space (`log_bytes == asize`), it has no
    /// metaslabs and holds no block of the tree. Log vdevs follow the data vdevs in `tops`
    /// (data vdevs are numbered 0..n; a removed log vdev leaves a gap in the ids after them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub log: bool,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl TopConfig {
    /// The part of the vdev the data allocator manages.
    pub fn data_bytes(&self) -> u64 {
        self.asize - self.log_bytes
    }
}

impl TopConfig {
    /// How `zeta pool status` names the vdev: stripe, mirror, raidz2, raidz2-rdp...
    pub fn kind_name(&self) -> String {
        match (&self.raidz, self.kind) {
            (Some(rz), _) => match rz.code {
                crate::vdev::RaidzCode::Rdp { .. } => format!("raidz{}-rdp", rz.nparity),
                _ => format!("raidz{}", rz.nparity),
            },
            (None, k) => format!("{k:?}").to_lowercase(),
        }
    }
}

/// The pool configuration every label carries (the whole vdev tree, so any one leaf can
/// tell what the others are).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolConfig {
    pub name: String,
    pub pool_guid: u64,
    pub state: PoolState,
    pub version: u64,
    pub checksum: ChecksumKind,
    /// The leaf this copy of the label is written on.
    pub leaf_guid: u64,
    pub tops: Vec<TopConfig>,
    /// The last scrub: its progress, bookmark and findings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scan: Option<super::scan_state::ScanState>,
    /// Intent-log behaviour (pool properties `zil.commit` and `zil.placement`).
    #[serde(default)]
    pub zil_commit: super::props::CommitPolicy,
    #[serde(default)]
    pub zil_placement: super::props::Placement,
    /// The host that last created or imported the pool, and who there (`zeta`'s state
    /// directory): an import elsewhere of a pool not exported needs `-f`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The features the pool has enabled, and which of them are in use (version 3 on).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub features: super::feature::Features,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct ConfigHeader {
    magic: U64,
    version: U64,
    generation: U64,
    payload_len: U64,
    /// SHA-256 over the first 32 header bytes followed by the payload.
    checksum: [u8; 32],
}
const _: () = assert!(std::mem::size_of::<ConfigHeader>() == CONFIG_HEADER);

fn config_digest(header_head: &[u8], payload: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(header_head);
    h.update(payload);
    h.finalize().into()
}

/// The longest pool or volume name, in bytes (`dsl::dir::valid_volume_name`): a config
/// records one in a scan's bookmark, and its room is kept.
pub const MAX_NAME_BYTES: usize = 200;

/// The longest host name and holder (`PoolConfig::hostname`, `holder`) a config records;
/// longer ones are cut (`holder_within`).
pub const MAX_HOSTNAME_BYTES: usize = 64;
pub const MAX_HOLDER_BYTES: usize = 256;

/// `s`, cut to its last `max` bytes (at a character boundary): of a long path, the end
/// tells most.
pub fn cut_to(s: &str, max: usize) -> String {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

/// The most bytes of JSON a config area holds.
pub const CONFIG_PAYLOAD_MAX: usize = CONFIG_AREA as usize - CONFIG_HEADER;

/// A config whose JSON is `bytes` long, more than a label's config area holds.
#[derive(Debug, thiserror::Error)]
#[error("the pool's configuration takes {bytes} bytes, more than the {CONFIG_PAYLOAD_MAX} a label holds")]
pub struct ConfigTooLarge {
    pub bytes: usize,
}

fn json_len(cfg: &PoolConfig) -> usize {
    serde_json::to_vec(cfg).map_or(usize::MAX, |v| v.len())
}

/// Ok if a config of `bytes` of JSON fits a config area.
fn within_area(bytes: usize) -> Result<(), ConfigTooLarge> {
    if bytes <= CONFIG_PAYLOAD_MAX {
        Ok(())
    } else {
        Err(ConfigTooLarge { bytes })
    }
}

/// Makes `cfg` fit a config area, if it must, by giving up what a pool can spare, in this
/// order: the byte ranges the last scan found damaged (newest first, those of a scrub a
/// resilver interrupted before the resilver's own; the error counts stay), then the detail
/// of the txgs leaves missed and a resilver covers (each list becomes one range from its
/// first txg to its last: a resilver of them rewrites more blocks, never fewer), then the
/// leaves' error counts (shown by `pool status` after a restart, and nothing else). Any leaf
/// GUID fits in the room left (`leaf_guid` is set per leaf after this). `fits_as_it_grows`
/// keeps the vdev tree small enough for this to succeed.
pub fn fit_config(cfg: &mut PoolConfig) -> Result<(), ConfigTooLarge> {
    // The longest leaf GUID is 20 digits; the one in `cfg` may be shorter.
    let fits = |c: &PoolConfig| within_area(json_len(c) + 20).is_ok();
    while !fits(cfg) {
        let Some(scan) = cfg.scan.as_mut() else { break };
        // A scrub a resilver interrupted first: its list is the older.
        let waiting = scan.interrupted.as_mut().filter(|s| !s.damaged.is_empty());
        match waiting {
            Some(scrub) => scrub.damaged.pop(),
            None => scan.damaged.pop(),
        };
        if scan.damaged.is_empty()
            && scan
                .interrupted
                .as_ref()
                .is_none_or(|s| s.damaged.is_empty())
        {
            break;
        }
    }
    if !fits(cfg) {
        for leaf in cfg.tops.iter_mut().flat_map(|t| t.children.iter_mut()) {
            coarsen(&mut leaf.missed);
        }
        if let Some(scan) = cfg.scan.as_mut() {
            coarsen(&mut scan.txgs);
        }
    }
    if !fits(cfg) {
        for leaf in cfg.tops.iter_mut().flat_map(|t| t.children.iter_mut()) {
            leaf.errors = LeafErrors::default();
        }
    }
    within_area(json_len(cfg) + 20)
}

/// One range covering every range of `ranges` (sorted, inclusive).
fn coarsen(ranges: &mut Vec<[u64; 2]>) {
    if let (Some(first), Some(last)) = (ranges.first(), ranges.last()) {
        *ranges = vec![[first[0], last[1]]];
    }
}

/// Whether a pool of vdev tree `cfg` can keep its config in its labels whatever it records
/// as it runs and `fit_config` cannot give up: every leaf's flags and missed txgs (one
/// range each, as `fit_config` leaves them at most) and a resilver's scan state naming every
/// leaf and holding an interrupted scrub, each with a bookmark in a volume of the longest
/// name. Checked whenever the tree grows (create, replace, log devices added), so that no
/// later config write fails for want of room.
pub fn fits_as_it_grows(cfg: &PoolConfig) -> Result<(), ConfigTooLarge> {
    use super::scan_state::{Bookmark, ScanFunc, ScanPhase, ScanState};
    let mut worst = cfg.clone();
    worst.leaf_guid = u64::MAX;
    // GUIDs are random, and the JSON of a longer one takes more room: count the longest.
    worst.pool_guid = u64::MAX;
    for top in worst.tops.iter_mut() {
        top.guid = u64::MAX;
        for leaf in top.children.iter_mut() {
            leaf.guid = u64::MAX;
        }
    }
    let mut guids = Vec::new();
    for leaf in worst.tops.iter_mut().flat_map(|t| t.children.iter_mut()) {
        leaf.errors = LeafErrors::default();
        leaf.offline = true;
        leaf.faulted = true;
        leaf.missed = vec![[u64::MAX, u64::MAX]];
        guids.push(u64::MAX);
    }
    let scrub = ScanState {
        func: ScanFunc::Scrub,
        txgs: Vec::new(),
        leaves: Vec::new(),
        state: ScanPhase::Scanning,
        examined_bytes: u64::MAX,
        to_examine: u64::MAX,
        repaired_bytes: u64::MAX,
        errors: u64::MAX,
        start_secs: u64::MAX,
        end_secs: u64::MAX,
        bookmark: Some(Bookmark {
            volume: Some("v".repeat(MAX_NAME_BYTES)),
            blkid: u64::MAX,
        }),
        damaged: Vec::new(),
        unrebuilt_txg: u64::MAX,
        interrupted: None,
    };
    worst.scan = Some(ScanState {
        func: ScanFunc::Resilver,
        txgs: vec![[u64::MAX, u64::MAX]],
        leaves: guids,
        interrupted: Some(Box::new(scrub.clone())),
        ..scrub
    });
    worst.hostname = Some("h".repeat(MAX_HOSTNAME_BYTES));
    worst.holder = Some("h".repeat(MAX_HOLDER_BYTES));
    within_area(json_len(&worst))
}

/// Encodes a config area; `generation` orders config copies (higher wins). A config too
/// large for it is refused (`fit_config` makes one fit).
pub fn encode_config(cfg: &PoolConfig, generation: u64) -> Result<Vec<u8>, ConfigTooLarge> {
    let payload = serde_json::to_vec(cfg).expect("config serializes");
    within_area(payload.len())?;
    let mut hdr = ConfigHeader {
        magic: LABEL_MAGIC.into(),
        version: FORMAT_VERSION.into(),
        generation: generation.into(),
        payload_len: (payload.len() as u64).into(),
        checksum: [0; 32],
    };
    hdr.checksum = config_digest(&hdr.as_bytes()[..32], &payload);
    let mut out = vec![0u8; CONFIG_AREA as usize];
    out[..CONFIG_HEADER].copy_from_slice(hdr.as_bytes());
    out[CONFIG_HEADER..CONFIG_HEADER + payload.len()].copy_from_slice(&payload);
    Ok(out)
}

pub fn decode_config(area: &[u8]) -> Result<(u64, PoolConfig), LabelError> {
    let hdr = ConfigHeader::read_from_bytes(&area[..CONFIG_HEADER]).expect("exact size");
    if hdr.magic.get() != LABEL_MAGIC {
        return Err(LabelError::BadMagic);
    }
    let len = hdr.payload_len.get();
    if len > CONFIG_AREA - CONFIG_HEADER as u64 {
        return Err(LabelError::BadChecksum);
    }
    let payload = &area[CONFIG_HEADER..CONFIG_HEADER + len as usize];
    if config_digest(&area[..32], payload) != hdr.checksum {
        return Err(LabelError::BadChecksum);
    }
    // The version is checked only once the header is known intact.
    if !readable(hdr.version.get()) {
        return Err(LabelError::UnknownVersion(hdr.version.get()));
    }
    let cfg = serde_json::from_slice(payload).map_err(|e| LabelError::Parse(e.to_string()))?;
    Ok((hdr.generation.get(), cfg))
}

/// The root of a committed transaction group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Uberblock {
    pub magic: U64,
    pub version: U64,
    pub txg: U64,
    pub pool_guid: U64,
    pub timestamp_ns: U64,
    /// The txg whose tree `root` is: `txg` itself, except in an uberblock that restates an
    /// older tree under a newer number (`restating`). Zero in pools written before the field
    /// existed, meaning `txg`.
    pub tree_txg: U64,
    pub reserved: [u8; 16],
    /// Points at the meta object set (MOS) block of this txg.
    pub root: BlkPtr,
    /// SHA-256 of every byte above.
    pub checksum: [u8; 32],
}
pub const UB_BYTES: usize = 224;
const _: () = assert!(std::mem::size_of::<Uberblock>() == UB_BYTES);

impl Uberblock {
    pub fn new(txg: u64, pool_guid: u64, root: BlkPtr) -> Uberblock {
        Self::with_tree(txg, txg, pool_guid, root)
    }

    /// An uberblock numbered `txg` that points at the tree of `older`: import writes one so
    /// that new txgs outrank uberblocks it skipped. The tree's own txg is kept, since what
    /// the tree holds (and which intent-log records it already covers) is that of the older
    /// txg.
    pub fn restating(txg: u64, older: &Uberblock) -> Uberblock {
        Self::with_tree(txg, older.tree_txg(), older.pool_guid.get(), older.root)
    }

    fn with_tree(txg: u64, tree_txg: u64, pool_guid: u64, root: BlkPtr) -> Uberblock {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut ub = Uberblock {
            magic: UB_MAGIC.into(),
            version: FORMAT_VERSION.into(),
            txg: txg.into(),
            pool_guid: pool_guid.into(),
            timestamp_ns: now.into(),
            tree_txg: tree_txg.into(),
            reserved: [0; 16],
            root,
            checksum: [0; 32],
        };
        ub.checksum = Sha256::digest(&ub.as_bytes()[..UB_BYTES - 32]).into();
        ub
    }

    /// The txg whose changes the tree holds (see the `tree_txg` field).
    pub fn tree_txg(&self) -> u64 {
        match self.tree_txg.get() {
            0 => self.txg.get(),
            t => t,
        }
    }

    pub fn encode_slot(&self) -> Vec<u8> {
        let mut slot = vec![0u8; UB_SLOT as usize];
        slot[..UB_BYTES].copy_from_slice(self.as_bytes());
        slot
    }

    /// Decodes a slot; None for an empty, torn or foreign slot. A known-good slot from a newer
    /// format is an error so import can say why.
    pub fn decode_slot(slot: &[u8]) -> Result<Option<Uberblock>, LabelError> {
        let ub = Uberblock::read_from_bytes(&slot[..UB_BYTES]).expect("exact size");
        if ub.magic.get() != UB_MAGIC {
            return Ok(None);
        }
        let digest: [u8; 32] = Sha256::digest(&slot[..UB_BYTES - 32]).into();
        if digest != ub.checksum {
            return Ok(None);
        }
        if !readable(ub.version.get()) {
            return Err(LabelError::UnknownVersion(ub.version.get()));
        }
        Ok(Some(ub))
    }
}

/// What one leaf's four labels say.
#[derive(Debug)]
pub struct LeafLabels {
    /// The newest config copy that verified, with its generation.
    pub config: Option<(u64, PoolConfig)>,
    /// Every uberblock that verified in any label, newest txg first, one per txg.
    pub uberblocks: Vec<Uberblock>,
    /// Why config copies were rejected, by label index, for messages when none verified.
    pub errors: Vec<(usize, LabelError)>,
}

impl LeafLabels {
    /// The rejections `keep` selects, as "label I: why, ...".
    pub fn describe_errors(&self, keep: impl Fn(&LabelError) -> bool) -> String {
        let each: Vec<String> = self
            .errors
            .iter()
            .filter(|(_, e)| keep(e))
            .map(|(index, e)| format!("label {index}: {e}"))
            .collect();
        each.join(", ")
    }
}

pub fn read_labels(leaf: &Leaf) -> Result<LeafLabels, LabelError> {
    let mut out = LeafLabels {
        config: None,
        uberblocks: Vec::new(),
        errors: Vec::new(),
    };
    let mut buf = vec![0u8; LABEL_SIZE as usize];
    for index in 0..LABEL_COUNT {
        leaf.read_label(index, 0, &mut buf)?;
        match decode_config(&buf[..CONFIG_AREA as usize]) {
            Ok((generation, cfg)) => {
                if out.config.as_ref().is_none_or(|(g, _)| generation > *g) {
                    out.config = Some((generation, cfg));
                }
            }
            Err(LabelError::UnknownVersion(v)) => return Err(LabelError::UnknownVersion(v)),
            Err(e) => out.errors.push((index, e)),
        }
        for slot in buf[CONFIG_AREA as usize..].chunks_exact(UB_SLOT as usize) {
            if let Some(ub) = Uberblock::decode_slot(slot)? {
                out.uberblocks.push(ub);
            }
        }
    }
    out.uberblocks
        .sort_by_key(|u| std::cmp::Reverse(u.txg.get()));
    out.uberblocks.dedup_by_key(|u| u.txg.get());
    Ok(out)
}

/// Writes config area `area` (`encode_config`) to labels `labels` of `leaf` (callers write
/// labels 0 and 2, flush, then 1 and 3, so a crash can tear at most one pair).
pub fn write_config(leaf: &Leaf, area: &[u8], labels: &[usize]) -> Result<(), VdevError> {
    for &index in labels {
        leaf.write_label(index, 0, area)?;
    }
    Ok(())
}

/// The txg under which an import that fell back to txg `imported`, past newer uberblocks up to
/// txg `newest_seen` whose trees did not verify, commits the imported tree again. It numbers
/// above every uberblock still in the ring, so that a later import never prefers a skipped one
/// over what the pool has written since. Its slot (txg mod `UB_SLOTS`) must not be the imported
/// txg's: until it has committed, a crash falls back to that uberblock.
pub fn txg_above_skipped(imported: u64, newest_seen: u64) -> u64 {
    let txg = imported.max(newest_seen) + 1;
    if txg % UB_SLOTS == imported % UB_SLOTS {
        txg + 1
    } else {
        txg
    }
}

/// Writes an uberblock into its ring slot in all four labels.
pub fn write_uberblock(leaf: &Leaf, ub: &Uberblock) -> Result<(), VdevError> {
    let slot = ub.encode_slot();
    let offset = CONFIG_AREA + (ub.txg.get() % UB_SLOTS) * UB_SLOT;
    for index in 0..LABEL_COUNT {
        leaf.write_label(index, offset, &slot)?;
    }
    Ok(())
}

/// Erases all labels of a leaf (pool destroy marks them destroyed instead; this is for tests
/// and for reclaiming a device).
pub fn clear_labels(leaf: &Leaf) -> Result<(), VdevError> {
    let mut cleared = vec![0u8; LABEL_SIZE as usize];
    cleared[..FREED_MAGIC.len()].copy_from_slice(FREED_MAGIC);
    for index in 0..LABEL_COUNT {
        leaf.write_label(index, 0, &cleared)?;
    }
    leaf.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spa::scan_state::{Damage, ScanState};
    use crate::vdev::{BlockDevice, MemDevice};
    use std::sync::Arc;

    fn cfg() -> PoolConfig {
        PoolConfig {
            name: "tank".into(),
            pool_guid: 42,
            state: PoolState::Active,
            version: FORMAT_VERSION,
            checksum: ChecksumKind::Fletcher4,
            leaf_guid: 7,
            scan: None,
            zil_commit: Default::default(),
            zil_placement: Default::default(),
            hostname: None,
            holder: None,
            features: Default::default(),
            tops: vec![TopConfig {
                raidz: None,
                log_bytes: 0,
                log: false,
                id: 0,
                guid: 9,
                kind: TopKind::Stripe,
                asize: 1 << 30,
                ms_shift: 24,
                ms_count: 64,
                children: vec![LeafConfig {
                    guid: 7,
                    path: "/dev/x".into(),
                    errors: LeafErrors::default(),
                    offline: false,
                    faulted: false,
                    missed: Vec::new(),
                }],
            }],
        }
    }

    #[test]
    fn config_round_trip_and_corruption() {
        let area = encode_config(&cfg(), 5).unwrap();
        assert_eq!(decode_config(&area).unwrap(), (5, cfg()));
        let mut bad = area.clone();
        bad[CONFIG_HEADER + 3] ^= 0x40;
        assert!(matches!(decode_config(&bad), Err(LabelError::BadChecksum)));
        let mut bad = area.clone();
        bad[0] = 0;
        assert!(matches!(decode_config(&bad), Err(LabelError::BadMagic)));
        // A newer version with a correct checksum is named, not treated as garbage.
        let mut newer = area.clone();
        newer[8..16].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let digest = config_digest(
            &newer[..32],
            &newer[CONFIG_HEADER
                ..CONFIG_HEADER + u64::from_le_bytes(newer[24..32].try_into().unwrap()) as usize],
        );
        newer[32..64].copy_from_slice(&digest);
        assert!(matches!(
            decode_config(&newer),
            Err(LabelError::UnknownVersion(v)) if v == FORMAT_VERSION + 1
        ));
        // Every older version still read is.
        for v in OLDEST_READABLE_VERSION..FORMAT_VERSION {
            let mut older = area.clone();
            older[8..16].copy_from_slice(&v.to_le_bytes());
            let digest = config_digest(
                &older[..32],
                &older[CONFIG_HEADER
                    ..CONFIG_HEADER
                        + u64::from_le_bytes(older[24..32].try_into().unwrap()) as usize],
            );
            older[32..64].copy_from_slice(&digest);
            assert_eq!(decode_config(&older).unwrap(), (5, cfg()), "version {v}");
        }
    }

    /// `cfg()` with `leaves` leaves of paths `path_len` bytes long, in one stripe vdev each.
    fn wide(leaves: usize, path_len: usize) -> PoolConfig {
        let mut c = cfg();
        // GUIDs as long as random ones may be.
        c.pool_guid = u64::MAX;
        let top = c.tops[0].clone();
        c.tops = (0..leaves)
            .map(|i| {
                let mut t = top.clone();
                t.id = i as u32;
                t.guid = u64::MAX - i as u64;
                t.children[0].guid = u64::MAX - i as u64;
                t.children[0].path = format!("/{:0>1$}", i, path_len - 1);
                t
            })
            .collect();
        c
    }

    #[test]
    fn a_tree_too_large_for_the_labels_is_refused_before_it_is_written() {
        assert!(fits_as_it_grows(&wide(8, 40)).is_ok());
        let err = fits_as_it_grows(&wide(200, 100)).unwrap_err();
        assert!(err.bytes > CONFIG_PAYLOAD_MAX, "{err}");
        assert!(err.to_string().contains("more than the"), "{err}");
        assert!(encode_config(&wide(400, 100), 1).is_err());
        // The largest tree that passes still takes a config at its fullest.
        let mut n = 8;
        while fits_as_it_grows(&wide(n + 1, 60)).is_ok() {
            n += 1;
        }
        let mut full = wide(n, 60);
        for leaf in full.tops.iter_mut().flat_map(|t| t.children.iter_mut()) {
            leaf.errors.cksum = u64::MAX;
            leaf.missed = (0..50)
                .map(|i| [u64::MAX - 4 * i - 1, u64::MAX - 4 * i])
                .rev()
                .collect();
        }
        full.scan = Some(ScanState {
            txgs: vec![[1, 5], [9, 12]],
            damaged: vec![
                Damage {
                    object: "tank/".to_string() + &"v".repeat(MAX_NAME_BYTES),
                    start: u64::MAX,
                    end: u64::MAX,
                    error: "e".repeat(300),
                };
                100
            ],
            ..ScanState::default()
        });
        fit_config(&mut full).unwrap();
        full.leaf_guid = u64::MAX;
        let area = encode_config(&full, 1).unwrap();
        let (_, back) = decode_config(&area).unwrap();
        let leaf = &back.tops[0].children[0];
        assert_eq!(
            leaf.missed,
            vec![[u64::MAX - 197, u64::MAX]],
            "one range covering all"
        );
        assert_eq!(back.scan.unwrap().txgs, vec![[1, 12]]);
        assert_eq!(leaf.errors, LeafErrors::default(), "the counts go last");
        // Paths of 20 bytes: over a hundred devices, each a vdev of its own, and 150 in
        // 25 vdevs of six.
        assert!(fits_as_it_grows(&wide(110, 20)).is_ok());
        let mut six = wide(1, 20);
        let leaf = six.tops[0].children[0].clone();
        six.tops[0].children = vec![leaf; 6];
        six.tops = vec![six.tops[0].clone(); 25];
        assert!(fits_as_it_grows(&six).is_ok());
    }

    #[test]
    fn a_config_that_fits_is_written_whole() {
        let mut c = wide(4, 40);
        c.tops[0].children[0].missed = vec![[3, 4], [8, 9]];
        c.scan = Some(ScanState {
            damaged: vec![
                Damage {
                    object: "tank/v".into(),
                    start: 0,
                    end: 4096,
                    error: "checksum".into(),
                };
                3
            ],
            ..ScanState::default()
        });
        let before = c.clone();
        fit_config(&mut c).unwrap();
        assert_eq!(c, before);
    }

    #[test]
    fn txgs_after_a_fallback_number_above_the_skipped_ones_and_spare_the_imported_slot() {
        assert_eq!(txg_above_skipped(10, 13), 14);
        assert_eq!(txg_above_skipped(10, 11), 12);
        // Txg 10 + UB_SLOTS - 1 + 1 would overwrite txg 10's slot.
        assert_eq!(txg_above_skipped(10, 10 + UB_SLOTS - 1), 10 + UB_SLOTS + 1);
        for imported in [1, 7, UB_SLOTS, 3 * UB_SLOTS - 1] {
            for newest in imported + 1..imported + 3 * UB_SLOTS {
                let txg = txg_above_skipped(imported, newest);
                assert!(txg > newest);
                assert_ne!(txg % UB_SLOTS, imported % UB_SLOTS);
            }
        }
    }

    #[test]
    fn uberblock_ring_keeps_older_txgs_and_skips_torn_slots() {
        let dev = Arc::new(MemDevice::new("m", 8 << 20));
        let leaf = Leaf::new(dev.clone() as Arc<dyn BlockDevice>, 7);
        write_config(&leaf, &encode_config(&cfg(), 1).unwrap(), &[0, 1, 2, 3]).unwrap();
        for txg in 1..=5 {
            write_uberblock(&leaf, &Uberblock::new(txg, 42, BlkPtr::HOLE)).unwrap();
        }
        let labels = read_labels(&leaf).unwrap();
        assert_eq!(labels.config.unwrap().1, cfg());
        let txgs: Vec<u64> = labels.uberblocks.iter().map(|u| u.txg.get()).collect();
        assert_eq!(txgs, vec![5, 4, 3, 2, 1]);
        // Tear txg 5's slot in every label: import must see 4 as newest.
        for index in 0..LABEL_COUNT {
            let off = crate::vdev::layout::label_offset(index, dev.len_bytes())
                + CONFIG_AREA
                + 5 * UB_SLOT
                + 40;
            dev.corrupt(off, &[0xff; 8]);
        }
        let labels = read_labels(&leaf).unwrap();
        assert_eq!(labels.uberblocks[0].txg.get(), 4);
    }
}
