//! `rados:POOL/NAME` (a device) and `rados:POOL` (where an import looks), parsed and checked.

use std::fmt;

/// The prefix that names a RADOS device.
pub const SCHEME: &str = "rados:";

/// A device's place: a Ceph pool and a name in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    pub pool: String,
    pub name: String,
}

fn valid_word(w: &str) -> bool {
    !w.is_empty()
        && w.len() <= 64
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl Spec {
    /// `rados:POOL/NAME`; POOL and NAME of letters, digits, `_`, `-` and `.` (up to 64).
    pub fn parse(s: &str) -> Result<Spec, String> {
        let rest = s
            .strip_prefix(SCHEME)
            .ok_or_else(|| format!("'{s}' is not a RADOS device (rados:POOL/NAME)"))?;
        let (pool, name) = rest
            .split_once('/')
            .ok_or_else(|| format!("'{s}': a RADOS device is rados:POOL/NAME"))?;
        if !valid_word(pool) || !valid_word(name) {
            return Err(format!(
                "'{s}': the Ceph pool and the device name are 1 to 64 letters, digits, '_', '-' \
                 or '.'"
            ));
        }
        Ok(Spec {
            pool: pool.to_string(),
            name: name.to_string(),
        })
    }

    /// `rados:POOL`: the Ceph pool an import looks in.
    pub fn parse_pool(s: &str) -> Result<String, String> {
        let pool = s
            .strip_prefix(SCHEME)
            .ok_or_else(|| format!("'{s}' is not a Ceph pool (rados:POOL)"))?
            .trim_end_matches('/');
        if !valid_word(pool) {
            return Err(format!(
                "'{s}': a Ceph pool name is 1 to 64 letters, digits, '_', '-' or '.'"
            ));
        }
        Ok(pool.to_string())
    }

    /// The head object's name (`zeta.NAME`).
    pub fn head_object(&self) -> String {
        format!("{}{}", crate::device::HEAD_PREFIX, self.name)
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.pool, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        let s = Spec::parse("rados:rbd/tank0").unwrap();
        assert_eq!((s.pool.as_str(), s.name.as_str()), ("rbd", "tank0"));
        assert_eq!(s.to_string(), "rados:rbd/tank0");
        assert_eq!(s.head_object(), "zeta.tank0");
        for bad in [
            "rados:",
            "rados:rbd",
            "rados:/x",
            "rados:rbd/",
            "rados:a/b/c",
            "file:a/b",
        ] {
            assert!(Spec::parse(bad).is_err(), "{bad}");
        }
        assert!(Spec::parse(&format!("rados:p/{}", "x".repeat(65))).is_err());
        assert_eq!(Spec::parse_pool("rados:rbd").unwrap(), "rbd");
        assert_eq!(Spec::parse_pool("rados:rbd/").unwrap(), "rbd");
        assert!(Spec::parse_pool("rados:").is_err());
        assert!(Spec::parse_pool("rados:a b").is_err());
    }
}
