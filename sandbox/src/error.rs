//! The crate's error type: infrastructure failures only. A candidate's misbehaviour is
//! never an error here; it is a verdict inside an `Evaluation`.

use std::path::PathBuf;

use thiserror::Error;

use crate::jail::JailError;
use crate::protocol::ProtocolError;

/// Why the sandbox could not produce a result (not a verdict on the candidate).
#[derive(Debug, Error)]
pub enum SandboxError {
    /// The backend for this language (or, for Triton, the language's own compiler) is not
    /// available in this build or on this machine.
    #[error("backend {0} is not available: {1}")]
    BackendUnavailable(String, String),
    /// The problem cannot be evaluated on this backend (e.g. it has no host reference).
    #[error("problem {0}: {1}")]
    Problem(String, String),
    /// The job's scratch directory could not be prepared or removed.
    #[error("scratch directory {path}: {source}")]
    Scratch {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A path a jailed program needs (its executable, kilnd's socket) cannot be resolved.
    #[error("{what} {path}: {source}")]
    Path {
        /// What the path is.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The jail could not be started.
    #[error(transparent)]
    Jail(#[from] JailError),
    /// The worker's pipes broke or carried something unexpected.
    #[error("worker protocol: {message}")]
    Protocol {
        /// What happened, with the end of the worker's log.
        message: String,
        /// The cause.
        #[source]
        source: Option<ProtocolError>,
    },
    /// The worker reported an internal failure.
    #[error("worker failed: {0}")]
    Worker(String),
}
