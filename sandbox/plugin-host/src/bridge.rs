//! The [`Bridge`]: how the plugin's imports reach kilnd.
//!
//! Every import the plugin calls that needs the daemon (the problem, submit, wait,
//! archive, chat, checkpoints, log, budget) goes through this trait, and so does the
//! host's final report. [`kilnd::KilndBridge`] is the real one (HTTP/1.1 on kilnd's
//! Unix socket); [`fake::FakeBridge`] keeps everything in memory, for tests and for
//! trying a plugin without a daemon.
//!
//! Errors come in two kinds. A [`BridgeError::Refused`] with one of the codes in
//! [`crate::protocol::codes`] becomes a typed error the plugin can handle (`queue-full`,
//! `budget-exceeded`...). Everything else (kilnd unreachable, an unknown code, a reply
//! that does not parse) ends the plugin with the outcome `bridge`, because a strategy
//! cannot do anything sensible without its evaluator.

pub mod fake;
pub mod kilnd;

use std::time::Duration;

use thiserror::Error;

use crate::protocol::{
    ArchiveReply, Budget, ChatReply, ChatRequest, Context, Finish, LogLine, Submitted, WaitReply,
    WaitRequest,
};

/// Why a bridge call failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BridgeError {
    /// kilnd answered with an error.
    #[error("kilnd refused ({status} {code}): {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// kilnd's error code.
        code: String,
        /// kilnd's message.
        message: String,
    },
    /// kilnd could not be reached, or the connection broke.
    #[error("cannot reach kilnd: {0}")]
    Transport(String),
    /// kilnd's reply did not parse.
    #[error("kilnd's reply does not parse: {0}")]
    Protocol(String),
}

impl BridgeError {
    /// The error code when kilnd refused, else `None`.
    pub fn code(&self) -> Option<&str> {
        match self {
            BridgeError::Refused { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// The daemon side of a plugin's imports. One bridge serves one search.
pub trait Bridge: Send {
    /// The problem, seed, baselines, device, config and random seed.
    fn context(&mut self) -> Result<Context, BridgeError>;

    /// Queues a candidate (its JSON as the plugin wrote it).
    fn submit(&mut self, candidate_json: &str) -> Result<Submitted, BridgeError>;

    /// Waits for evaluations; must return within about `request.timeout_ms`.
    fn wait(&mut self, request: &WaitRequest) -> Result<WaitReply, BridgeError>;

    /// The search's archive.
    fn archive(&mut self) -> Result<ArchiveReply, BridgeError>;

    /// One chat completion.
    fn chat(&mut self, request: &ChatRequest) -> Result<ChatReply, BridgeError>;

    /// Replaces the search's checkpoint.
    fn put_checkpoint(&mut self, data: &[u8]) -> Result<(), BridgeError>;

    /// The search's checkpoint, if any.
    fn get_checkpoint(&mut self) -> Result<Option<Vec<u8>>, BridgeError>;

    /// Appends a line to the search's log.
    fn log(&mut self, line: &LogLine) -> Result<(), BridgeError>;

    /// What is left of the search's budgets.
    fn budget(&mut self) -> Result<Budget, BridgeError>;

    /// Reports how the plugin ended. Called once, by the host, never by the plugin.
    fn finish(&mut self, report: &Finish) -> Result<(), BridgeError>;
}

/// Extra time given to a `wait` call's transport beyond the wait itself.
pub const WAIT_SLACK: Duration = Duration::from_secs(30);
