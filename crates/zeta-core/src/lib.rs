//! zeta's storage engine: the layers of `ARCHITECTURE.md` from devices up to volumes.
//!
//! Bottom up, the modules are `vdev`, `spa`, `zio`, `dmu`, `zil`, `dsl` and `zvol`; each uses
//! only those below it (and `zeta_math`). The crates above (`zeta-nbd`, `zeta-server`, the CLI)
//! reach the engine through `dsl` (the pool, and what it re-exports to build one) and `zvol`
//! (`tests/layers.rs` checks it).

pub mod dmu;
pub mod dsl;
pub mod spa;
pub mod vdev;
pub mod zil;
pub mod zio;
pub mod zvol;
