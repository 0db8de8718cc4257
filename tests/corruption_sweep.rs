//! Random damage to what a pool holds: labels, uberblocks, the MOS, space maps, indirect
//! blocks, intent-log blocks and data, hit at random among the sectors the pool wrote. Import,
//! log replay, reads and a scrub must never panic or hang and never hand back bytes nobody
//! wrote:
//! - damage within the redundancy (one side of a mirror, one column of raidz1) gives back
//!   every acknowledged write exactly, and a scrub repairs it all;
//! - beyond it (one device, no redundancy), each sector reads as a version that was written
//!   there (the last acknowledged one, or an older one when the log or the newest uberblock
//!   is lost) or fails with an error; the import itself may fail, with an error.
//!
//! Each trial's seed is printed on failure; `ZETA_SWEEP_SEED` picks the first trial's seed.

mod common;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use zeta::dsl::{Pool, PoolOptions};
use zeta::spa::scan_state::ScanPhase;
use zeta::vdev::mem::{MemDevice, PowerCut};
use zeta::vdev::BlockDevice;
use zeta::zvol::Volume;

const VOL: u64 = 2 * MB;
const BS: u32 = 16384;
const SECTOR: usize = 4096;

/// What the pool was given: the volume's bytes as acknowledged by the last flush (the log
/// alone holds them), and every version each sector had on the way (zeros at first, then
/// the committed one, then each logged write's), any of which a replay cut short may leave.
struct History {
    acknowledged: Vec<u8>,
    versions: Vec<Vec<Vec<u8>>>,
}

impl History {
    fn record(&mut self, off: u64, data: &[u8]) {
        self.acknowledged[off as usize..][..data.len()].copy_from_slice(data);
        for (i, s) in data.chunks(SECTOR).enumerate() {
            self.versions[off as usize / SECTOR + i].push(s.to_vec());
        }
    }
}

/// A pool of `layout` with volume `v`: filled and committed in a txg, then rewritten in
/// part (4K pieces logged with their data, whole blocks written in place and logged by
/// pointer, a trim) and flushed, so the log holds the newest version; then a power cut.
fn pool_images(layout: Layout, seed: u64) -> (Vec<Vec<u8>>, Vec<String>, History) {
    let create = PoolOptions {
        // No txg commits by itself: the acknowledged version lives in the log alone.
        txg_timeout: Duration::from_secs(3600),
        dirty_max_bytes: 64 * MB,
        cache_bytes: 8 * MB,
        ..Default::default()
    };
    let devs = mem_devs(devs_for(layout), 64 * MB);
    let pool = Pool::create("tank", spec(layout, &devs), create).unwrap();
    pool.create_volume("v", VOL, BS, None).unwrap();
    pool.sync_now().unwrap();
    let vol = Volume::open(&pool, "v").unwrap();
    let mut history = History {
        acknowledged: vec![0; VOL as usize],
        versions: vec![vec![vec![0; SECTOR]]; VOL as usize / SECTOR],
    };
    let committed = pattern(seed, VOL as usize);
    vol.write(0, &committed).unwrap();
    history.record(0, &committed);
    pool.sync_now().unwrap();

    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    for i in 0..40u64 {
        let sector = rng.gen_range(0..VOL / SECTOR as u64);
        let off = sector * SECTOR as u64;
        let piece = pattern(seed * 1000 + i, SECTOR);
        vol.write(off, &piece).unwrap();
        history.record(off, &piece);
        if i % 10 == 9 {
            vol.flush().unwrap();
        }
    }
    for i in 0..4u64 {
        let off = rng.gen_range(0..VOL / BS as u64) * BS as u64;
        let block = pattern(seed * 1000 + 500 + i, BS as usize);
        vol.write(off, &block).unwrap();
        history.record(off, &block);
    }
    let trim = rng.gen_range(0..VOL / BS as u64) * BS as u64;
    vol.trim(trim, BS as u64).unwrap();
    history.record(trim, &[0; BS as usize]);
    vol.flush().unwrap();

    let images: Vec<Vec<u8>> = power_cut(&devs, PowerCut::DropUnflushed)
        .iter()
        .map(|d| d.power_cut(PowerCut::KeepUnflushed))
        .collect();
    let names = devs.iter().map(|d| d.name().to_string()).collect();
    drop(vol);
    drop(pool);
    (images, names, history)
}

/// The sectors of `image` the pool wrote (the simulated device starts out zeroed), those
/// that hold anything but a volume's data first: labels, uberblocks, metadata and log
/// blocks, a small share of the whole that damage should not hit only by chance.
fn written_sectors(image: &[u8], h: &History) -> Written {
    let data: HashSet<&[u8]> = h.versions.iter().flatten().map(|v| &v[..]).collect();
    let mut w = Written::default();
    for (i, s) in image.chunks(SECTOR).enumerate() {
        if data.contains(s) {
            w.data.push(i);
        } else if s.iter().any(|&b| b != 0) {
            w.other.push(i);
        }
    }
    w
}

#[derive(Default)]
struct Written {
    data: Vec<usize>,
    other: Vec<usize>,
}

impl Written {
    /// A written sector: one not of a volume's data three times in four.
    fn pick(&self, rng: &mut StdRng) -> usize {
        let from = if self.data.is_empty() || (!self.other.is_empty() && rng.gen_ratio(3, 4)) {
            &self.other
        } else {
            &self.data
        };
        from[rng.gen_range(0..from.len())]
    }
}

/// Damages one written sector of `image` in one of the ways disks and file systems do:
/// a flipped bit, a few bytes overwritten, the sector lost (zeroed), or another sector's
/// contents written there (a misdirected write).
fn damage(image: &mut [u8], written: &Written, rng: &mut StdRng) -> String {
    let at = written.pick(rng) * SECTOR;
    match rng.gen_range(0..4) {
        0 => {
            let bit = rng.gen_range(0..SECTOR * 8);
            image[at + bit / 8] ^= 1 << (bit % 8);
            format!("bit {bit} of sector at {at} flipped")
        }
        1 => {
            let len = rng.gen_range(1..64);
            let start = rng.gen_range(0..SECTOR - len);
            rng.fill_bytes(&mut image[at + start..at + start + len]);
            format!("{len} bytes at {} overwritten", at + start)
        }
        2 => {
            image[at..at + SECTOR].fill(0);
            format!("sector at {at} zeroed")
        }
        _ => {
            let from = written.pick(rng) * SECTOR;
            image.copy_within(from..from + SECTOR, at);
            format!("sector at {from} copied over the one at {at}")
        }
    }
}

/// How a trial's pool fared.
enum Outcome {
    /// The import failed, with this error.
    NotImported(String),
    /// Imported: the volume's bytes by sector (`None`: the read failed), the scrub's
    /// unrecoverable error count, and whether `verify` passed.
    Read {
        sectors: Vec<Option<Vec<u8>>>,
        scrub_errors: Option<u64>,
        /// Checksum errors the devices counted (reads and the scrub).
        cksum_errors: u64,
        verified: Result<(), String>,
    },
}

/// Imports `images`, replays the log, reads the volume sector by sector (a failed read is
/// an answer, not a failure), verifies and scrubs.
fn examine(images: Vec<Vec<u8>>, names: &[String]) -> Outcome {
    let devs: Vec<Arc<MemDevice>> = images
        .into_iter()
        .zip(names)
        .map(|(img, name)| Arc::new(MemDevice::from_image(name, img)))
        .collect();
    let pool = match Pool::import(as_leaves(&devs), None, opts()) {
        Ok(p) => p,
        Err(e) => return Outcome::NotImported(e.to_string()),
    };
    let vol = Volume::open(&pool, "v").ok();
    let sectors = (0..VOL as usize / SECTOR)
        .map(|i| {
            let vol = vol.as_ref()?;
            let mut b = vec![0u8; SECTOR];
            vol.read((i * SECTOR) as u64, &mut b).ok().map(|_| b)
        })
        .collect();
    let verified = pool.verify().map(|_| ()).map_err(|e| e.to_string());
    let scrub_errors = pool.start_scrub().ok().map(|_| {
        pool.wait_scrub();
        let st = pool.scan_status();
        assert_eq!(st.state, ScanPhase::Finished, "{st:?}");
        st.errors
    });
    let cksum_errors = pool
        .vdev_status()
        .iter()
        .flat_map(|t| t.leaves.iter())
        .map(|l| l.cksum_errors)
        .sum();
    drop(vol);
    let _ = pool.close();
    Outcome::Read {
        sectors,
        scrub_errors,
        cksum_errors,
        verified,
    }
}

/// Runs `examine` on a thread of its own and fails the test if it takes longer than a
/// minute: a hang is a failure too.
fn examine_in_time(images: Vec<Vec<u8>>, names: Vec<String>, what: &str) -> Outcome {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(examine(images, &names));
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(o) => o,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: hung for a minute"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
    }
}

fn first_seed() -> u64 {
    std::env::var("ZETA_SWEEP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen_range(0..1 << 40))
}

/// `trials` rounds of damage to a fresh copy of one pool's images: up to `hits` sectors
/// each, on at most `devices` devices chosen at random (`None`: any). `check` judges each
/// outcome.
fn sweep(
    layout: Layout,
    trials: u64,
    hits: usize,
    devices: Option<usize>,
    check: impl Fn(&Outcome, &History, &str),
) -> Tally {
    let mut tally = Tally::default();
    let panics = panics();
    let seed = first_seed();
    eprintln!(
        "{layout:?}: seeds {seed}..{} (ZETA_SWEEP_SEED)",
        seed + trials
    );
    let (images, names, history) = pool_images(layout, seed);
    let written: Vec<Written> = images
        .iter()
        .map(|i| written_sectors(i, &history))
        .collect();
    for t in seed..seed + trials {
        let mut rng = StdRng::seed_from_u64(t);
        let mut imgs = images.clone();
        let victims = rand::seq::index::sample(&mut rng, imgs.len(), devices.unwrap_or(imgs.len()));
        let mut done = Vec::new();
        for _ in 0..rng.gen_range(1..=hits) {
            let d = victims.index(rng.gen_range(0..victims.len()));
            let how = damage(&mut imgs[d], &written[d], &mut rng);
            done.push(format!("{}: {how}", names[d]));
        }
        let what = format!("{layout:?} seed {t} ({})", done.join("; "));
        let before = panics.load(Ordering::SeqCst);
        let outcome = examine_in_time(imgs, names.clone(), &what);
        assert_eq!(
            panics.load(Ordering::SeqCst),
            before,
            "{what}: a thread panicked"
        );
        check(&outcome, &history, &what);
        tally.add(&outcome, &history);
    }
    eprintln!("{layout:?}: {tally:?}");
    tally
}

/// What a sweep's trials came to, so a test can tell that its damage hit something.
#[derive(Debug, Default)]
struct Tally {
    not_imported: u64,
    /// Trials where some sector failed to read.
    read_errors: u64,
    /// Trials where some sector read back an older version than the acknowledged one.
    older: u64,
    /// Checksum errors the devices counted.
    cksum_errors: u64,
}

impl Tally {
    fn add(&mut self, outcome: &Outcome, h: &History) {
        let Outcome::Read {
            sectors,
            cksum_errors,
            ..
        } = outcome
        else {
            self.not_imported += 1;
            return;
        };
        self.read_errors += sectors.iter().any(|s| s.is_none()) as u64;
        self.older += sectors.iter().enumerate().any(|(i, s)| {
            s.as_ref()
                .is_some_and(|s| s[..] != h.acknowledged[i * SECTOR..][..SECTOR])
        }) as u64;
        self.cksum_errors += cksum_errors;
    }
}

/// Damage within the redundancy: everything acknowledged reads back, nothing is left
/// unrepaired.
fn check_whole(outcome: &Outcome, h: &History, what: &str) {
    let Outcome::Read {
        sectors,
        scrub_errors,
        verified,
        ..
    } = outcome
    else {
        let Outcome::NotImported(e) = outcome else {
            unreachable!()
        };
        panic!("{what}: import failed: {e}");
    };
    for (i, s) in sectors.iter().enumerate() {
        let want = &h.acknowledged[i * SECTOR..][..SECTOR];
        match s {
            Some(got) => assert!(got == want, "{what}: sector {i} reads wrong bytes"),
            None => panic!("{what}: sector {i} failed to read"),
        }
    }
    assert_eq!(verified, &Ok(()), "{what}");
    assert_eq!(*scrub_errors, Some(0), "{what}: scrub");
}

/// Damage beyond the redundancy: errors are allowed, wrong bytes are not.
fn check_honest(outcome: &Outcome, h: &History, what: &str) {
    let Outcome::Read { sectors, .. } = outcome else {
        return;
    };
    for (i, s) in sectors.iter().enumerate() {
        let Some(got) = s else { continue };
        assert!(
            h.versions[i].contains(got),
            "{what}: sector {i} holds bytes never written there"
        );
    }
}

#[test]
fn damage_on_one_side_of_a_mirror_loses_nothing() {
    let t = sweep(Layout::Mirror, 60, 6, Some(1), check_whole);
    assert!(t.cksum_errors > 0, "the damage hit nothing: {t:?}");
}

#[test]
fn damage_to_one_raidz1_column_loses_nothing() {
    let t = sweep(Layout::Raidz1, 60, 6, Some(1), check_whole);
    assert!(t.cksum_errors > 0, "the damage hit nothing: {t:?}");
}

#[test]
fn damage_to_two_raidz2_columns_loses_nothing() {
    let t = sweep(Layout::Raidz2, 40, 8, Some(2), check_whole);
    assert!(t.cksum_errors > 0, "the damage hit nothing: {t:?}");
}

/// Two vdevs without redundancy: the pool's metadata has a copy on each, so damage to one
/// of them is repaired, but each data or log block has one copy only.
#[test]
fn damage_to_two_plain_vdevs_is_an_error_never_wrong_bytes() {
    let t = sweep(Layout::TwoStripes, 80, 3, None, check_honest);
    assert!(t.cksum_errors > 0, "the damage hit nothing: {t:?}");
}

/// Without redundancy a damaged log block ends the replay there, as a torn one does (no
/// block says whether it was torn in the crash or damaged since): the writes acknowledged
/// in it and after it read back as they were before, the limit README states.
#[test]
fn damage_without_redundancy_is_an_error_never_wrong_bytes() {
    let t = sweep(Layout::Stripe, 150, 3, None, check_honest);
    // Damage found by checksum (a failed read is rarer: most data sectors hit hold
    // versions since replaced), and log blocks hit.
    assert!(
        t.cksum_errors > 0 && t.older > 0,
        "the damage reached neither the blocks nor the log: {t:?}"
    );
}
