//! Bytes a measurement wrote to the block device under its files, from the kernel's counters
//! (`/sys/dev/block/MAJOR:MINOR/stat`): with the bytes the clients wrote, the write
//! amplification of each target. zeta writes each synced byte twice at least (its intent-log
//! record, then its block at the txg's sync, a whole block for a short write), `nbdkit file`
//! and the raw files once: where the device's or the kernel's write path is the limit, that
//! bounds how far ahead of them zeta can be.
//!
//! The counter is the whole device's, so anything else writing to it meanwhile counts too.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Bytes per sector in the kernel's block statistics, whatever the device's sector size.
const STAT_SECTOR_BYTES: u64 = 512;

/// A count of device writes begun (`start`) over some files.
pub(super) struct DeviceWrites {
    stat: PathBuf,
    files: Vec<PathBuf>,
    start: u64,
}

impl DeviceWrites {
    /// Writes back what the page cache holds of `files`, then reads the counter of the block
    /// device they are on. `None` where there is none to read (a file system on no single
    /// block device, such as tmpfs or overlayfs, or not Linux).
    pub(super) fn start(files: &[PathBuf]) -> Option<DeviceWrites> {
        let stat = stat_path(files.first()?)?;
        sync_files(files)?;
        let start = sectors_written(&std::fs::read_to_string(&stat).ok()?)?;
        Some(DeviceWrites {
            stat,
            files: files.to_vec(),
            start,
        })
    }

    /// Writes back what the page cache holds of the files (what the measurement wrote and the
    /// kernel has not yet), then returns the bytes written to the device since `start`.
    pub(super) fn finish(self) -> Option<u64> {
        sync_files(&self.files)?;
        let end = sectors_written(&std::fs::read_to_string(&self.stat).ok()?)?;
        Some(end.saturating_sub(self.start) * STAT_SECTOR_BYTES)
    }
}

/// `bytes` written over `over`, in MB/s (10^6 bytes): the scale of both the per-row device
/// rate and the device's reference, so the two read against each other.
pub(super) fn mb_per_s(bytes: u64, over: Duration) -> f64 {
    bytes as f64 / over.as_secs_f64() / 1e6
}

fn sync_files(files: &[PathBuf]) -> Option<()> {
    for f in files {
        std::fs::File::open(f).and_then(|f| f.sync_all()).ok()?;
    }
    Some(())
}

/// The statistics file of the block device holding `path`.
fn stat_path(path: &Path) -> Option<PathBuf> {
    let (major, minor) = split_dev(path.metadata().ok()?.dev());
    // Major 0 is for file systems on no block device.
    if major == 0 {
        return None;
    }
    let p = PathBuf::from(format!("/sys/dev/block/{major}:{minor}/stat"));
    p.exists().then_some(p)
}

/// A `dev_t`'s major and minor numbers, as glibc encodes them.
fn split_dev(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major, minor)
}

/// Sectors written, the seventh field of a block device's `stat`.
fn sectors_written(stat: &str) -> Option<u64> {
    stat.split_whitespace().nth(6)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seventh_field_counts_sectors_written() {
        let stat = "  117283     3171  7838698    47870  1630291   570893 90139840  3261316 \
                    0   830356  3398577";
        assert_eq!(sectors_written(stat), Some(90139840));
        assert_eq!(sectors_written("1 2 3"), None);
        assert_eq!(sectors_written("1 2 3 4 5 6 x"), None);
    }

    #[test]
    fn device_numbers_split_as_glibc_makes_them() {
        // makedev(254, 0) and makedev(259, 65537): small and large minors.
        assert_eq!(split_dev(0xfe00), (254, 0));
        let dev = (259u64 & 0xfff) << 8 | (65537 & 0xff) | (65537 & !0xff) << 12;
        assert_eq!(split_dev(dev), (259, 65537));
    }

    #[test]
    fn a_file_on_a_block_device_has_its_writes_counted() {
        let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"").unwrap();
        let Some(count) = DeviceWrites::start(std::slice::from_ref(&f)) else {
            // No block device under the build directory (overlayfs, tmpfs): nothing to count.
            assert!(stat_path(&f).is_none());
            return;
        };
        std::fs::write(&f, vec![7u8; 1 << 20]).unwrap();
        let written = count.finish().unwrap();
        assert!(
            written >= 1 << 20,
            "{written} bytes counted for 1 MiB written"
        );
    }
}
