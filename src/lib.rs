//! zeta: a copy-on-write, checksummed, pooled storage system in user space.
//!
//! This crate is the `zeta` command line. The layers it drives live in their own crates
//! (`zeta-math`, `zeta-core`, `zeta-nbd`, `zeta-server`; the map is in `ARCHITECTURE.md`); they are re-exported
//! here under their layer names so that tests and embedders reach the whole system by one name.

pub mod cli;

pub use zeta_core::{dmu, dsl, spa, vdev, zil, zio, zvol};
pub use zeta_math as math;
pub use zeta_nbd as nbd;
pub use zeta_server as server;
