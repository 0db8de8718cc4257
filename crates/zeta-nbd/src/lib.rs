//! Serving volumes over NBD (the Network Block Device protocol, fixed newstyle, with
//! structured replies and `base:allocation` block status).
//!
//! Architecture invariant: `nbd` sees volumes only through `zvol::Volume` (and lists them
//! through `dsl::Pool`); it knows nothing of blocks, txgs or devices. Durability comes from
//! `Volume::flush_then`, which commits the volume's intent log, and the log holds the writes
//! replied to on every connection, so a FLUSH on any connection covers them all.

mod admission;
mod budget;
mod conn;
mod exports;
mod handshake;
pub mod proto;
mod replies;
mod server;
pub mod tls;
mod workers;

use std::sync::Arc;

use zeta_core::zvol::Volume;

pub use exports::PoolExports;
pub use server::{Server, ServerConfig, DEFAULT_PORT};

/// One export as `NBD_OPT_LIST` shows it.
#[derive(Clone, Debug)]
pub struct ExportInfo {
    pub name: String,
    pub size: u64,
    pub description: String,
}

/// What a server serves: a listing, and a volume per name (`""` is the default export).
pub trait Exports: Send + Sync {
    fn list(&self) -> Vec<ExportInfo>;
    fn open(&self, name: &str) -> Option<Arc<Volume>>;
}
