//! Whether a pool's files fit in what their file system has left.
//!
//! `zeta pool create` makes file vdevs sparse: they take their blocks as the pool first
//! writes them, so a pool of files can be promised more than the file system under it holds.
//! Once that fills, the next txg cannot be written and the pool suspends (ENOSPC to
//! clients). `pool create` and `serve` say so up front, while room can still be made.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

use crate::fmt::human;

/// Files on one file system that may grow past its free space.
#[derive(Debug, PartialEq, Eq)]
pub struct Shortfall {
    /// The first of the files, to name the file system by.
    pub example: PathBuf,
    pub files: usize,
    /// Bytes the files may still take: their length less what is allocated to them.
    pub growth: u64,
    /// Bytes the file system has free for an unprivileged writer.
    pub free: u64,
}

impl Shortfall {
    pub fn message(&self, pool: &str) -> String {
        format!(
            "pool '{pool}': {} sparse file{} on the file system of {} may take {} more, but \
             it has {} free; if it fills, writes fail (ENOSPC) and the pool suspends until \
             room is made (`pool create -o prealloc=on` allocates the files at once)",
            self.files,
            if self.files == 1 { "" } else { "s" },
            self.example.display(),
            human(self.growth),
            human(self.free)
        )
    }
}

/// The file systems under `paths` (regular files; block devices and missing paths are
/// skipped) whose free space is less than the files on them may still take.
pub fn shortfalls(paths: &[PathBuf]) -> Vec<Shortfall> {
    let mut by_fs: BTreeMap<u64, (PathBuf, usize, u64)> = BTreeMap::new();
    for p in paths {
        let Ok(m) = std::fs::metadata(p) else {
            continue;
        };
        if !m.is_file() {
            continue;
        }
        let growth = m.len().saturating_sub(m.blocks() * 512);
        let e = by_fs.entry(m.dev()).or_insert((p.clone(), 0, 0));
        e.1 += 1;
        e.2 += growth;
    }
    by_fs
        .into_values()
        .filter_map(|(example, files, growth)| {
            let free = free_bytes(&example)?;
            (growth > free).then_some(Shortfall {
                example,
                files,
                growth,
                free,
            })
        })
        .collect()
}

pub use zeta_core::dsl::free_bytes;

/// Prints a warning on stderr for each shortfall of `pool`'s files.
/// Whether the files among `paths` (regular files; others are skipped) have all their blocks
/// allocated, as `-o prealloc=on` leaves them: a file made to join them (`pool replace`, `pool
/// add`) is then allocated too, so it cannot be the one the file system fails to fill later.
pub fn allocated(paths: &[PathBuf]) -> bool {
    let files: Vec<std::fs::Metadata> = paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .filter(|m| m.is_file())
        .collect();
    !files.is_empty() && files.iter().all(|m| m.blocks() * 512 >= m.len())
}

pub fn warn(pool: &str, paths: &[PathBuf]) {
    for s in shortfalls(paths) {
        eprintln!("zeta: warning: {}", s.message(pool));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_files_larger_than_the_free_space_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(dir.path()).expect("statvfs of a temporary directory");
        let small = dir.path().join("small");
        std::fs::File::create(&small)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        assert!(shortfalls(std::slice::from_ref(&small)).is_empty());
        // Larger than the free space, as a sparse file can be.
        let big = dir.path().join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(free + (1 << 30))
            .unwrap();
        let found = shortfalls(&[small.clone(), big.clone(), dir.path().join("absent")]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].example, small);
        assert_eq!(found[0].files, 2);
        assert!(found[0].growth >= free + (1 << 30), "{found:?}");
        let msg = found[0].message("tank");
        assert!(msg.contains("pool 'tank': 2 sparse files"), "{msg}");
        assert!(msg.contains("ENOSPC"), "{msg}");
    }

    #[test]
    fn files_allocated_in_full_are_told_from_sparse_ones() {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("full");
        std::fs::write(&full, vec![1u8; 1 << 20]).unwrap();
        let sparse = dir.path().join("sparse");
        std::fs::File::create(&sparse)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let absent = dir.path().join("absent");
        assert!(allocated(&[full.clone(), absent.clone()]));
        assert!(!allocated(&[full, sparse]));
        assert!(!allocated(&[absent]), "no file to go by");
    }
}
