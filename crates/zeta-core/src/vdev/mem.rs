//! An in-memory device for tests that can do what real disks do on a bad day: lose or tear the
//! writes that were not flushed when the power went, fail reads or writes, and rot bytes.

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};

use super::device::{check_range, BlockDevice, VdevError};

/// What happens to writes that were not yet flushed when the power is cut.
#[derive(Clone, Copy, Debug)]
pub enum PowerCut {
    /// Every unflushed write is lost.
    DropUnflushed,
    /// Every unflushed write happens to have reached the media.
    KeepUnflushed,
    /// Each unflushed write is lost, kept, or torn (a random subset of its 512-byte sectors
    /// reaches the media), chosen by a PRNG seeded with this value.
    Tear(u64),
}

#[derive(Default, Clone, Debug)]
pub struct Faults {
    pub fail_reads: bool,
    pub fail_writes: bool,
    pub fail_flush: bool,
    /// Writes fail with `ENOSPC`, as on a file whose file system has filled: a sparse file
    /// cannot take its unwritten blocks (overwrites fail too here, which a copy-on-write pool
    /// hardly does anyway). Flushes and reads go on.
    pub full: bool,
}

impl Faults {
    fn check_room(&self, name: &str) -> Result<(), VdevError> {
        if self.full {
            return Err(VdevError::no_room(name));
        }
        Ok(())
    }
}

struct State {
    /// What survives a power cut.
    durable: Vec<u8>,
    /// What reads see.
    current: Vec<u8>,
    /// Writes since the last flush, in order.
    pending: Vec<(u64, Vec<u8>)>,
    faults: Faults,
}

pub struct MemDevice {
    name: String,
    len_bytes: u64,
    state: Mutex<State>,
}

impl MemDevice {
    pub fn new(name: &str, len_bytes: u64) -> MemDevice {
        Self::from_image(name, vec![0u8; len_bytes as usize])
    }

    pub fn from_image(name: &str, image: Vec<u8>) -> MemDevice {
        MemDevice {
            name: name.to_string(),
            len_bytes: image.len() as u64,
            state: Mutex::new(State {
                durable: image.clone(),
                current: image,
                pending: Vec::new(),
                faults: Faults::default(),
            }),
        }
    }

    pub fn set_faults(&self, faults: Faults) {
        self.state.lock().faults = faults;
    }

    /// The bytes a fresh device would hold after a power cut now.
    pub fn power_cut(&self, mode: PowerCut) -> Vec<u8> {
        Self::image(&self.state.lock(), mode)
    }

    /// A power cut of several devices at one instant (no write or flush reaches any of them
    /// while the images are taken), as a real outage is; cutting them one after another while
    /// I/O goes on could pair one device's state before a txg commit with another's after.
    pub fn power_cut_together(devs: &[&MemDevice], mode: PowerCut) -> Vec<Vec<u8>> {
        let guards: Vec<_> = devs.iter().map(|d| d.state.lock()).collect();
        guards
            .iter()
            .enumerate()
            .map(|(i, st)| {
                let mode = match mode {
                    PowerCut::Tear(seed) => PowerCut::Tear(seed.wrapping_add(i as u64)),
                    m => m,
                };
                Self::image(st, mode)
            })
            .collect()
    }

    fn image(st: &State, mode: PowerCut) -> Vec<u8> {
        let mut image = st.durable.clone();
        let mut rng = rand::rngs::StdRng::seed_from_u64(match mode {
            PowerCut::Tear(seed) => seed,
            _ => 0,
        });
        for (offset, data) in &st.pending {
            let off = *offset as usize;
            match mode {
                PowerCut::DropUnflushed => {}
                PowerCut::KeepUnflushed => image[off..off + data.len()].copy_from_slice(data),
                PowerCut::Tear(_) => match rng.gen_range(0..3) {
                    0 => {}
                    1 => image[off..off + data.len()].copy_from_slice(data),
                    _ => {
                        for (i, sector) in data.chunks(512).enumerate() {
                            if rng.gen_bool(0.5) {
                                let at = off + i * 512;
                                image[at..at + sector.len()].copy_from_slice(sector);
                            }
                        }
                    }
                },
            }
        }
        image
    }

    /// Overwrites bytes directly on the media (durably), as bit rot or a stray writer would.
    pub fn corrupt(&self, offset_bytes: u64, bytes: &[u8]) {
        let mut st = self.state.lock();
        let off = offset_bytes as usize;
        st.current[off..off + bytes.len()].copy_from_slice(bytes);
        st.durable[off..off + bytes.len()].copy_from_slice(bytes);
    }

    pub fn unflushed_writes(&self) -> usize {
        self.state.lock().pending.len()
    }
}

impl BlockDevice for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> Result<(), VdevError> {
        check_range(self, offset_bytes, buf.len())?;
        let st = self.state.lock();
        if st.faults.fail_reads {
            return Err(VdevError::Injected {
                path: self.name.clone(),
                what: "read",
            });
        }
        let off = offset_bytes as usize;
        buf.copy_from_slice(&st.current[off..off + buf.len()]);
        Ok(())
    }

    /// Memory never makes a reader wait: read now, unless reads are set to fail (the usual
    /// read then reports it).
    fn read_at_nowait(&self, buf: &mut [u8], offset_bytes: u64) -> bool {
        self.read_at(buf, offset_bytes).is_ok()
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> Result<(), VdevError> {
        check_range(self, offset_bytes, buf.len())?;
        let mut st = self.state.lock();
        if st.faults.fail_writes {
            return Err(VdevError::Injected {
                path: self.name.clone(),
                what: "write",
            });
        }
        st.faults.check_room(&self.name)?;
        let off = offset_bytes as usize;
        st.current[off..off + buf.len()].copy_from_slice(buf);
        st.pending.push((offset_bytes, buf.to_vec()));
        Ok(())
    }

    /// Only this range reaches the media, as a range writeback does: other unflushed writes
    /// stay at the power cut's mercy, so a caller that needed them flushed is caught. Older
    /// unflushed writes that overlap the range now carry its bytes, so none can put stale
    /// bytes over it when a power cut lets them through.
    fn write_durable(&self, buf: &[u8], offset_bytes: u64) -> Result<(), VdevError> {
        check_range(self, offset_bytes, buf.len())?;
        let mut st = self.state.lock();
        if st.faults.fail_writes || st.faults.fail_flush {
            return Err(VdevError::Injected {
                path: self.name.clone(),
                what: "write",
            });
        }
        st.faults.check_room(&self.name)?;
        let (start, end) = (offset_bytes as usize, offset_bytes as usize + buf.len());
        st.current[start..end].copy_from_slice(buf);
        st.durable[start..end].copy_from_slice(buf);
        for (off, data) in st.pending.iter_mut() {
            let (s, e) = (*off as usize, *off as usize + data.len());
            let (lo, hi) = (s.max(start), e.min(end));
            if lo < hi {
                data[lo - s..hi - s].copy_from_slice(&buf[lo - start..hi - start]);
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), VdevError> {
        let mut st = self.state.lock();
        if st.faults.fail_flush {
            return Err(VdevError::Injected {
                path: self.name.clone(),
                what: "flush",
            });
        }
        let pending = std::mem::take(&mut st.pending);
        for (offset, data) in pending {
            let off = offset as usize;
            st.durable[off..off + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VdevError> {
        check_range(self, offset_bytes, len_bytes as usize)
    }

    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_cut_drops_keeps_or_tears_only_unflushed_writes() {
        let dev = MemDevice::new("m", 1 << 16);
        dev.write_at(&[1u8; 4096], 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(&[2u8; 4096], 4096).unwrap();
        assert_eq!(dev.unflushed_writes(), 1);
        let dropped = dev.power_cut(PowerCut::DropUnflushed);
        assert_eq!(&dropped[..4096], &[1u8; 4096][..]);
        assert_eq!(&dropped[4096..8192], &[0u8; 4096][..]);
        let kept = dev.power_cut(PowerCut::KeepUnflushed);
        assert_eq!(&kept[4096..8192], &[2u8; 4096][..]);
        // Across seeds a tear shows every outcome, and never touches flushed data.
        let mut saw_partial = false;
        for seed in 0..64 {
            let img = dev.power_cut(PowerCut::Tear(seed));
            assert_eq!(&img[..4096], &[1u8; 4096][..]);
            let twos = img[4096..8192].iter().filter(|&&b| b == 2).count();
            saw_partial |= twos > 0 && twos < 4096;
        }
        assert!(saw_partial);
    }

    #[test]
    fn a_durable_write_survives_alone_and_is_not_undone_by_older_writes() {
        let dev = MemDevice::new("m", 8192);
        dev.write_at(&[1u8; 4096], 0).unwrap();
        dev.write_at(&[2u8; 1024], 4096).unwrap();
        dev.write_durable(&[3u8; 1024], 1024).unwrap();
        let dropped = dev.power_cut(PowerCut::DropUnflushed);
        assert_eq!(&dropped[1024..2048], &[3u8; 1024][..]);
        assert!(
            dropped[..1024].iter().all(|&b| b == 0),
            "others stay volatile"
        );
        assert!(dropped[4096..5120].iter().all(|&b| b == 0));
        let kept = dev.power_cut(PowerCut::KeepUnflushed);
        assert_eq!(&kept[..1024], &[1u8; 1024][..]);
        assert_eq!(
            &kept[1024..2048],
            &[3u8; 1024][..],
            "the older write must not win"
        );
        assert_eq!(&kept[4096..5120], &[2u8; 1024][..]);
        let mut now = vec![0u8; 2048];
        dev.read_at(&mut now, 0).unwrap();
        assert_eq!(&now[1024..], &[3u8; 1024][..]);
    }

    #[test]
    fn injected_faults_fail_cleanly() {
        let dev = MemDevice::new("m", 1 << 16);
        dev.set_faults(Faults {
            fail_reads: true,
            fail_writes: true,
            fail_flush: true,
            ..Faults::default()
        });
        let mut buf = [0u8; 512];
        assert!(matches!(
            dev.read_at(&mut buf, 0),
            Err(VdevError::Injected { .. })
        ));
        assert!(matches!(
            dev.write_at(&buf, 0),
            Err(VdevError::Injected { .. })
        ));
        assert!(matches!(dev.flush(), Err(VdevError::Injected { .. })));
    }

    /// A full device refuses writes as a full file system does (ENOSPC, told apart from a
    /// fault by `out_of_space`), and still reads and flushes.
    #[test]
    fn a_full_device_refuses_writes_with_enospc() {
        let dev = MemDevice::new("m", 1 << 16);
        dev.write_at(&[5u8; 512], 0).unwrap();
        dev.set_faults(Faults {
            full: true,
            ..Faults::default()
        });
        for r in [
            dev.write_at(&[1u8; 512], 512),
            dev.write_durable(&[1u8; 512], 512),
        ] {
            let e = r.expect_err("a full device takes no write");
            assert!(e.out_of_space(), "{e}");
            assert!(e.to_string().contains("No space left on device"), "{e}");
        }
        let mut buf = [0u8; 512];
        dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [5u8; 512]);
        dev.flush().unwrap();
        let fault = VdevError::Injected {
            path: "m".into(),
            what: "write",
        };
        assert!(!fault.out_of_space());
    }
}
