//! Devices named by a scheme rather than a path (`rados:POOL/NAME`). The crate that
//! implements one registers it here at start-up, so the engine and the command line open,
//! create and find such devices as they do files, without linking what they need.
//!
//! Architecture invariant: `zeta-core` knows no scheme by name; a path with a prefix no
//! scheme registered is a file path like any other.

use std::path::Path;
use std::sync::Arc;

use parking_lot::RwLock;

use super::{BlockDevice, FileDevice, VdevError};

/// What a new device may be told beyond its size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceOptions {
    /// The size of the objects a device striped over objects uses (`-o object_size=`).
    pub object_size: Option<u64>,
}

pub trait DeviceScheme: Send + Sync {
    /// The prefix that names the scheme's devices, colon included (`rados:`).
    fn prefix(&self) -> &'static str;
    /// Opens the device for reading and writing under whatever ownership the scheme keeps,
    /// or for reading only (then shared).
    fn open(&self, spec: &str, read_only: bool) -> Result<Arc<dyn BlockDevice>, VdevError>;
    /// Opens the device to look at it, taking and disturbing no ownership; and whether a pool
    /// holds it now.
    fn inspect(&self, spec: &str) -> Result<(Arc<dyn BlockDevice>, bool), VdevError>;
    fn exists(&self, spec: &str) -> Result<bool, VdevError>;
    fn create(&self, spec: &str, size_bytes: u64, options: DeviceOptions) -> Result<(), VdevError>;
    /// The devices in `place` (`rados:POOL`), where an import looks.
    fn list(&self, place: &str) -> Result<Vec<String>, VdevError>;
    /// Removes a device `create` made and nobody holds (a pool's creation that failed).
    fn remove(&self, spec: &str) -> Result<(), VdevError>;
}

static SCHEMES: RwLock<Vec<Arc<dyn DeviceScheme>>> = RwLock::new(Vec::new());

/// Makes `scheme`'s devices known; a second registration of a prefix replaces the first.
pub fn register(scheme: Arc<dyn DeviceScheme>) {
    let mut all = SCHEMES.write();
    all.retain(|s| s.prefix() != scheme.prefix());
    all.push(scheme);
}

/// The scheme `path` names, if a registered one.
pub fn find(path: &Path) -> Option<Arc<dyn DeviceScheme>> {
    let s = path.to_str()?;
    SCHEMES
        .read()
        .iter()
        .find(|sc| s.starts_with(sc.prefix()))
        .cloned()
}

/// Whether `path` names a device of a registered scheme (not a file).
pub fn is_scheme(path: &Path) -> bool {
    find(path).is_some()
}

fn as_str(path: &Path) -> &str {
    path.to_str()
        .expect("scheme paths are UTF-8 (`find` matched one)")
}

/// Opens the device at `path`, file or scheme, for reading and writing (its lock or lease
/// taken) or for reading only.
pub fn open(path: &Path, read_only: bool) -> Result<Arc<dyn BlockDevice>, VdevError> {
    match find(path) {
        Some(s) => s.open(as_str(path), read_only),
        None if read_only => Ok(Arc::new(FileDevice::open_read_only(path)?)),
        None => Ok(Arc::new(FileDevice::open(path)?)),
    }
}

/// Opens the device at `path` to look at it without taking its lock or lease, and whether
/// some pool holds it now.
pub fn inspect(path: &Path) -> Result<(Arc<dyn BlockDevice>, bool), VdevError> {
    match find(path) {
        Some(s) => s.inspect(as_str(path)),
        None => {
            let in_use = super::file::held_as_device(path);
            Ok((Arc::new(FileDevice::open_to_inspect(path)?), in_use))
        }
    }
}

/// Whether a device is at `path`.
pub fn exists(path: &Path) -> Result<bool, VdevError> {
    match find(path) {
        Some(s) => s.exists(as_str(path)),
        None => Ok(path.exists()),
    }
}

/// Makes a new device of `size_bytes` at `path`: a sparse file (allocated at once if
/// `prealloc`), or the scheme's kind, with `options`. Opened for reading and writing.
pub fn create(
    path: &Path,
    size_bytes: u64,
    prealloc: bool,
    options: DeviceOptions,
) -> Result<Arc<dyn BlockDevice>, VdevError> {
    match find(path) {
        Some(s) => {
            s.create(as_str(path), size_bytes, options)?;
            s.open(as_str(path), false)
        }
        None => Ok(Arc::new(FileDevice::create_with(
            path, size_bytes, prealloc,
        )?)),
    }
}

/// Removes a device `create` made, best effort (undoing a creation that failed).
pub fn remove(path: &Path) {
    match find(path) {
        Some(s) => {
            let _ = s.remove(as_str(path));
        }
        None => {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The devices in `place`: for a scheme's place (`rados:POOL`) those it lists, else the
/// files and block devices directly inside the directory.
pub fn list(place: &Path) -> Result<Vec<std::path::PathBuf>, VdevError> {
    if let Some(s) = find(place) {
        return Ok(s.list(as_str(place))?.into_iter().map(Into::into).collect());
    }
    let rd =
        std::fs::read_dir(place).map_err(|e| VdevError::io(&place.display().to_string(), e))?;
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let p = entry.path();
        if let Ok(meta) = std::fs::metadata(&p) {
            use std::os::unix::fs::FileTypeExt;
            if meta.is_file() || meta.file_type().is_block_device() {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `path` made absolute, as a pool's config keeps it: a file's canonical path (or the path
/// under the working directory, if it does not exist yet); a scheme's device as it is named.
pub fn absolute(path: &Path) -> std::path::PathBuf {
    if is_scheme(path) {
        return path.to_path_buf();
    }
    std::fs::canonicalize(path).unwrap_or_else(|_| {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or(path.to_path_buf())
    })
}
