//! zeta's serving runtime: what a long-running `zeta` process needs around the engine.
//!
//! The state directory (`state::Home`: which pools this host imported, from which devices),
//! the memory governor, the health watcher, the control socket through which other `zeta`
//! processes reach a served pool, and `serve::run`, which puts pools on the network and stops
//! them cleanly on a signal. The command line (the `zeta` crate) parses arguments and calls in
//! here; the engine (`zeta-core`) and the NBD server (`zeta-nbd`) sit below.

pub mod control;
pub mod error;
pub mod fmt;
pub mod memory;
pub mod progress;
pub mod room;
pub mod serve;
pub mod state;
pub mod watch;

pub use error::{usage, Error, Result};
