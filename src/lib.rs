//! zeta: a copy-on-write, checksummed, pooled storage system in user space.
//!
//! The modules are the layers of `ARCHITECTURE.md`, bottom up; each uses only those below it.

pub mod cli;
pub mod dmu;
pub mod dsl;
pub mod math;
pub mod nbd;
pub mod spa;
pub mod vdev;
pub mod zil;
pub mod zio;
pub mod zvol;
