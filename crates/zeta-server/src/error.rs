//! The errors of the commands and the server runtime: one line for the user, with the engine's
//! typed errors kept matchable beneath.

use zeta_core::{dsl::PoolError, dsl::VdevError, zvol::VolError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A message for the user: bad arguments, a refused request, a reason to stop.
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error(transparent)]
    Vol(#[from] VolError),
    #[error(transparent)]
    Vdev(#[from] VdevError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

impl Error {
    /// An I/O error on `path`, named in the message.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> Error {
        Error::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

pub fn usage(msg: impl Into<String>) -> Error {
    Error::Usage(msg.into())
}
