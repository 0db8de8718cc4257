//! zeta's storage engine: the layers of `ARCHITECTURE.md` from devices up to volumes.
//!
//! The modules are listed bottom up; each uses only those below it (and `zeta_math`). The
//! crates above (`zeta-nbd`, `zeta-server`, the CLI) reach the engine through `dsl::Pool` and
//! `zvol`.

pub mod dmu;
pub mod dsl;
pub mod spa;
pub mod vdev;
pub mod zil;
pub mod zio;
pub mod zvol;
