//! Helpers shared by the integration tests: pools on simulated devices.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use zeta::dsl::{Pool, PoolOptions, TopSpec};
use zeta::vdev::mem::{MemDevice, PowerCut};
use zeta::vdev::{BlockDevice, RaidzConfig};
use zeta::zvol::Volume;

pub mod cli;
pub mod nbd_client;
pub mod procs;
pub mod rados;
pub mod rig;

pub const MB: u64 = 1 << 20;

/// Options for a test pool. `ZETA_TEST_FORCE_GANGING=BYTES` makes its txg syncs write every
/// block larger than BYTES as a gang block (`PoolOptions::force_ganging`), so a whole suite
/// runs over the path a fragmented pool takes (`.ci/run` does so for some).
pub fn opts() -> PoolOptions {
    PoolOptions {
        txg_timeout: Duration::from_millis(200),
        dirty_max_bytes: 16 * MB,
        cache_bytes: 8 * MB,
        force_ganging: std::env::var("ZETA_TEST_FORCE_GANGING").ok().map(|v| {
            v.parse()
                .expect("ZETA_TEST_FORCE_GANGING is a size in bytes")
        }),
        ..Default::default()
    }
}

pub fn mem_devs(n: usize, size: u64) -> Vec<Arc<MemDevice>> {
    (0..n)
        .map(|i| Arc::new(MemDevice::new(&format!("mem{i}"), size)))
        .collect()
}

pub fn as_leaves(devs: &[Arc<MemDevice>]) -> Vec<(Arc<dyn BlockDevice>, String)> {
    devs.iter()
        .map(|d| (d.clone() as Arc<dyn BlockDevice>, d.name().to_string()))
        .collect()
}

/// Layouts the model tests run on.
#[derive(Clone, Copy, Debug)]
pub enum Layout {
    Stripe,
    Mirror,
    TwoStripes,
    /// raidz1 of 3 devices.
    Raidz1,
    /// raidz2 (Reed-Solomon) of 6 devices.
    Raidz2,
    /// raidz2 with the RDP code, 6 devices.
    Raidz2Rdp,
    /// raidz3 of 7 devices.
    Raidz3,
}

/// One of each layout (RDP, which places blocks as Reed-Solomon does, aside).
pub const EVERY_LAYOUT: [Layout; 6] = [
    Layout::Stripe,
    Layout::Mirror,
    Layout::TwoStripes,
    Layout::Raidz1,
    Layout::Raidz2,
    Layout::Raidz3,
];

pub fn spec(layout: Layout, devs: &[Arc<MemDevice>]) -> Vec<TopSpec> {
    spec_of(layout, as_leaves(devs))
}

/// The top-level vdevs of `layout` over `leaves` (as many as `devs_for` says).
pub fn spec_of(layout: Layout, leaves: Vec<(Arc<dyn BlockDevice>, String)>) -> Vec<TopSpec> {
    let raidz = |np: u32, rdp: bool| {
        vec![TopSpec::raidz(
            RaidzConfig::new(np, leaves.len(), rdp).unwrap(),
            leaves.clone(),
        )]
    };
    match layout {
        Layout::Stripe => vec![TopSpec::stripe(leaves[0].clone())],
        Layout::Mirror => vec![TopSpec::mirror(leaves)],
        Layout::TwoStripes => leaves.into_iter().map(TopSpec::stripe).collect(),
        Layout::Raidz1 => raidz(1, false),
        Layout::Raidz2 => raidz(2, false),
        Layout::Raidz2Rdp => raidz(2, true),
        Layout::Raidz3 => raidz(3, false),
    }
}

pub fn devs_for(layout: Layout) -> usize {
    match layout {
        Layout::Stripe => 1,
        Layout::Mirror | Layout::TwoStripes => 2,
        Layout::Raidz1 => 3,
        Layout::Raidz2 | Layout::Raidz2Rdp => 6,
        Layout::Raidz3 => 7,
    }
}

/// Cuts the power of every device at one instant and returns fresh devices holding what
/// survived.
pub fn power_cut(devs: &[Arc<MemDevice>], mode: PowerCut) -> Vec<Arc<MemDevice>> {
    let refs: Vec<&MemDevice> = devs.iter().map(|d| d.as_ref()).collect();
    MemDevice::power_cut_together(&refs, mode)
        .into_iter()
        .zip(devs)
        .map(|(image, d)| Arc::new(MemDevice::from_image(d.name(), image)))
        .collect()
}

pub fn import(devs: &[Arc<MemDevice>]) -> Arc<Pool> {
    Pool::import(as_leaves(devs), None, opts()).expect("import")
}

/// A pool `tank` of `layout` on devices of `dev_size` bytes, holding a volume `v` of
/// `vol_size` bytes (blocks of `bs`) filled with random bytes from `seed` in one write,
/// flushed and closed. Returns the devices and the volume's contents.
pub fn filled_pool(
    layout: Layout,
    dev_size: u64,
    vol_size: u64,
    bs: u32,
    seed: u64,
) -> (Vec<Arc<MemDevice>>, Vec<u8>) {
    use rand::{RngCore, SeedableRng};
    let devs = mem_devs(devs_for(layout), dev_size);
    let pool = Pool::create("tank", spec(layout, &devs), opts()).unwrap();
    pool.create_volume("v", vol_size, bs, None).unwrap();
    let mut data = vec![0u8; vol_size as usize];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut data);
    let vol = Volume::open(&pool, "v").unwrap();
    vol.write(0, &data).unwrap();
    vol.flush().unwrap();
    drop(vol);
    pool.close().unwrap();
    (devs, data)
}

/// The whole contents of volume `v`.
pub fn read_volume(pool: &Arc<Pool>) -> Vec<u8> {
    let vol = Volume::open(pool, "v").unwrap();
    let mut got = vec![0u8; vol.size() as usize];
    vol.read(0, &mut got).unwrap();
    got
}

/// `len` bytes of a pseudo-random stream picked by `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Reads `len` bytes at `off` of a volume.
pub fn read(vol: &Volume, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    vol.read(off, &mut b).unwrap();
    b
}

/// A log's records to replay with the data of writes made in place read into them (while
/// the import still holds those blocks), so a test can apply them again after the replay.
pub fn records_with_data(pool: &Pool, records: Vec<zeta::zil::Record>) -> Vec<zeta::zil::Record> {
    use zeta::zil::{Payload, Record};
    records
        .into_iter()
        .map(|r| match r {
            Record::Indirect { txg, offset, bp } => Record::Write {
                txg,
                offset,
                data: Payload::owned(pool.read_in_place(&bp).expect("a claimed block reads")),
            },
            r => r,
        })
        .collect()
}

/// Called with each write's bytes and offset before it happens.
pub type WriteHook = Box<dyn Fn(&[u8], u64) + Send + Sync>;

/// A simulated device seen through hooks, for tests that count or hold its I/O: `on_write`
/// runs before each write (and may block it), `on_read` before each waiting read, and
/// `nowait` says whether `read_at_nowait` serves a read at once (as a page cache would). A
/// vectored read counts as one read. `on_write_request` runs once per write request, before
/// `on_write` runs for each of its buffers (a vectored write is one request). `fail_read`,
/// given a waiting read's offset and length, says whether it fails with an I/O error (a
/// bad sector).
pub struct Tap {
    pub dev: Arc<MemDevice>,
    pub on_write: WriteHook,
    pub on_write_request: Box<dyn Fn() + Send + Sync>,
    pub on_read: Box<dyn Fn() + Send + Sync>,
    pub nowait: Box<dyn Fn() -> bool + Send + Sync>,
    pub fail_read: Box<dyn Fn(u64, usize) -> bool + Send + Sync>,
}

/// A `Tap` hook that panics with `what` while `armed` is set: a bug or unchecked bytes below
/// the code under test, at a moment the test picks.
pub fn panics_while(
    armed: &Arc<std::sync::atomic::AtomicBool>,
    what: &'static str,
) -> Box<dyn Fn() + Send + Sync> {
    let armed = armed.clone();
    Box::new(move || {
        if armed.load(std::sync::atomic::Ordering::SeqCst) {
            panic!("{what}");
        }
    })
}

impl Tap {
    /// No hooks; reads never served at once (the trait's default).
    pub fn new(dev: Arc<MemDevice>) -> Tap {
        Tap {
            dev,
            on_write: Box::new(|_, _| {}),
            on_write_request: Box::new(|| {}),
            on_read: Box::new(|| {}),
            nowait: Box::new(|| false),
            fail_read: Box::new(|_, _| false),
        }
    }

    fn check_read(&self, offset: u64, len: usize) -> Result<(), zeta::vdev::VdevError> {
        if (self.fail_read)(offset, len) {
            let e = std::io::Error::other("injected read error");
            return Err(zeta::vdev::VdevError::io(self.dev.name(), e));
        }
        Ok(())
    }

    /// No hooks but a count of waiting reads, returned beside it.
    pub fn counting_reads(dev: Arc<MemDevice>) -> (Tap, Arc<std::sync::atomic::AtomicU64>) {
        let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let tap = Tap {
            on_read: {
                let reads = reads.clone();
                Box::new(move || {
                    reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                })
            },
            ..Tap::new(dev)
        };
        (tap, reads)
    }
}

impl BlockDevice for Tap {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), zeta::vdev::VdevError> {
        (self.on_read)();
        self.check_read(offset, buf.len())?;
        self.dev.read_at(buf, offset)
    }
    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> bool {
        (self.nowait)() && self.dev.read_at(buf, offset).is_ok()
    }
    // A vectored read is one request: one waiting read, or one ask whether it is at hand.
    fn read_vectored_at(
        &self,
        bufs: &mut [&mut [u8]],
        offset: u64,
    ) -> Result<(), zeta::vdev::VdevError> {
        (self.on_read)();
        self.check_read(offset, bufs.iter().map(|b| b.len()).sum())?;
        self.dev.read_vectored_at(bufs, offset)
    }
    fn read_vectored_at_nowait(&self, bufs: &mut [&mut [u8]], offset: u64) -> bool {
        (self.nowait)() && self.dev.read_vectored_at(bufs, offset).is_ok()
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), zeta::vdev::VdevError> {
        (self.on_write_request)();
        (self.on_write)(buf, offset);
        self.dev.write_at(buf, offset)
    }
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> Result<(), zeta::vdev::VdevError> {
        (self.on_write_request)();
        let mut at = offset;
        for b in bufs {
            (self.on_write)(b, at);
            self.dev.write_at(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), zeta::vdev::VdevError> {
        self.dev.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<(), zeta::vdev::VdevError> {
        self.dev.discard(offset, len)
    }
    fn len_bytes(&self) -> u64 {
        self.dev.len_bytes()
    }
    fn name(&self) -> &str {
        self.dev.name()
    }
}

/// Counts panics anywhere in the process from the first call on, the pool's own threads
/// included (a panic on the sync thread would not reach the test's thread): tests compare
/// the count before and after what they check.
pub fn panics() -> &'static std::sync::atomic::AtomicUsize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static PANICS: AtomicUsize = AtomicUsize::new(0);
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
    &PANICS
}

/// The size of a `StampWriter` block.
pub const STAMP_BS: usize = 4096;

/// Block `b` at generation `g`: the generation, then bytes drawn from both, so that a read
/// tells which write it saw and whether it is whole.
pub fn stamped(b: u64, g: u64) -> Vec<u8> {
    let mut v = pattern(b * 1_000_003 + g, STAMP_BS);
    v[..8].copy_from_slice(&g.to_le_bytes());
    v
}

/// A writer of stamped blocks (`stamped`) over the first `blocks` blocks of a volume that
/// flushes every fourth write, for power cuts at random moments of some other operation.
/// `cut` takes the devices' snapshot between two flushes, so that a flush counts as
/// acknowledged exactly when it finished before the cut.
pub struct StampWriter {
    gate: Arc<std::sync::RwLock<()>>,
    cut_taken: Arc<std::sync::atomic::AtomicBool>,
    flushes: Arc<std::sync::atomic::AtomicU64>,
    handle: Option<std::thread::JoinHandle<Stamps>>,
}

/// Per block: the generation the last acknowledged flush covered, and the last written; and
/// how many writes or flushes were refused for want of room.
pub struct Stamps {
    pub durable: Vec<u64>,
    pub tried: Vec<u64>,
    pub refused: u64,
}

impl StampWriter {
    /// Writes generation 0 of every block and flushes it, then goes on in a thread.
    pub fn start(vol: Volume, blocks: u64, seed: u64) -> StampWriter {
        Self::spawn(vol, blocks, seed, false)
    }

    /// `start`, for a pool that waits for room at times: a write or flush refused for want
    /// of it is counted and the writer goes on; a later flush covers the writes before it.
    pub fn start_through_room_waits(vol: Volume, blocks: u64, seed: u64) -> StampWriter {
        Self::spawn(vol, blocks, seed, true)
    }

    fn spawn(vol: Volume, blocks: u64, seed: u64, room_waits: bool) -> StampWriter {
        use rand::{RngCore, SeedableRng};
        use std::sync::atomic::Ordering;
        for b in 0..blocks {
            vol.write(b * STAMP_BS as u64, &stamped(b, 0)).unwrap();
        }
        vol.flush().unwrap();
        let gate = Arc::new(std::sync::RwLock::new(()));
        let cut_taken = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flushes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (g8, cut, fl) = (gate.clone(), cut_taken.clone(), flushes.clone());
        let handle = std::thread::spawn(move || {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut s = Stamps {
                durable: vec![0; blocks as usize],
                tried: vec![0; blocks as usize],
                refused: 0,
            };
            let mut pending = Vec::new();
            let mut g = 0;
            while !cut.load(Ordering::SeqCst) {
                g += 1;
                let b = rng.next_u64() % blocks;
                s.tried[b as usize] = g;
                match vol.write(b * STAMP_BS as u64, &stamped(b, g)) {
                    Ok(()) => pending.push((b as usize, g)),
                    Err(e) if room_waits && e.out_of_space() => s.refused += 1,
                    Err(e) => panic!("write: {e}"),
                }
                if g % 4 == 0 {
                    let flushed = {
                        let _held = g8.read().unwrap();
                        if cut.load(Ordering::SeqCst) {
                            break;
                        }
                        match vol.flush() {
                            Ok(()) => {
                                for (b, g) in pending.drain(..) {
                                    s.durable[b] = s.durable[b].max(g);
                                }
                                true
                            }
                            Err(e) if room_waits && e.out_of_space() => false,
                            Err(e) => panic!("flush: {e}"),
                        }
                    };
                    if flushed {
                        fl.fetch_add(1, Ordering::SeqCst);
                    } else {
                        // Refused at once while the pool waits: not in a tight loop.
                        s.refused += 1;
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
            }
            s
        });
        StampWriter {
            gate,
            cut_taken,
            flushes,
            handle: Some(handle),
        }
    }

    /// Returns once `n` more flushes are done.
    pub fn wait_for(&self, n: u64) {
        use std::sync::atomic::Ordering;
        let target = self.flushes.load(Ordering::SeqCst) + n;
        let t = std::time::Instant::now();
        while self.flushes.load(Ordering::SeqCst) < target {
            assert!(t.elapsed() < Duration::from_secs(60), "the writer stalled");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Cuts the power of `devs` together, between two flushes, and stops the writer.
    pub fn cut(mut self, devs: &[Arc<MemDevice>], mode: PowerCut) -> (Vec<Arc<MemDevice>>, Stamps) {
        let images = {
            let _all = self.gate.write().unwrap();
            let images = power_cut(devs, mode);
            self.cut_taken
                .store(true, std::sync::atomic::Ordering::SeqCst);
            images
        };
        let stamps = self.handle.take().unwrap().join().unwrap();
        (images, stamps)
    }
}

impl Stamps {
    /// Checks that each block of `vol` holds, whole, a generation no older than its last
    /// acknowledged flush and no newer than its last write.
    pub fn check(&self, vol: &Volume, what: &str) {
        for (b, (&low, &high)) in self.durable.iter().zip(&self.tried).enumerate() {
            let b = b as u64;
            let got = read(vol, b * STAMP_BS as u64, STAMP_BS);
            let g = u64::from_le_bytes(got[..8].try_into().unwrap());
            assert!(
                g >= low && g <= high && got == stamped(b, g),
                "{what}: block {b}: generation {g}, flushed {low}, last written {high}"
            );
        }
    }
}

/// Until `stop`: the file system under `devs` is full for a moment, then has room for longer
/// than the pool's retry interval (1 s), so that each wait for room ends and writers see both.
/// `some`: each time only a random part of the devices fills (all of them at times), as where
/// each lies on a file system of its own: the others take the writes meanwhile.
pub fn fill_and_free(
    devs: &[Arc<MemDevice>],
    seed: u64,
    stop: &std::sync::atomic::AtomicBool,
    some: bool,
) {
    use rand::{RngCore, SeedableRng};
    use std::sync::atomic::Ordering;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut full = false;
    while !stop.load(Ordering::SeqCst) {
        full = !full;
        let which = match (full, some) {
            (false, _) => 0,
            (true, false) => u64::MAX,
            (true, true) => 1 + rng.next_u64() % ((1 << devs.len()) - 1),
        };
        for (i, d) in devs.iter().enumerate() {
            d.set_faults(zeta::vdev::mem::Faults {
                full: which & (1 << i) != 0,
                ..zeta::vdev::mem::Faults::default()
            });
        }
        let ms = if full {
            50 + rng.next_u32() % 250
        } else {
            1100 + rng.next_u32() % 400
        };
        std::thread::sleep(Duration::from_millis(ms as u64));
    }
    for d in devs {
        d.set_faults(zeta::vdev::mem::Faults::default());
    }
}

/// Sets its flag when dropped, unwinding included.
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
