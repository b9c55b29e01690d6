//! How a plugin run ended ([`Outcome`]), the [`Report`] sent to kilnd and printed as the
//! host's last line, and the process exit codes.

use crate::protocol::{Failure, Finish, RunStats, Summary};

/// How a plugin run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `run` returned `ok` with this summary.
    Ok(Summary),
    /// `run` returned `err` with this reason.
    PluginError(String),
    /// The plugin trapped: a panic, `unreachable`, a bad memory access, `exit`...
    Trap(String),
    /// The plugin used all its fuel.
    OutOfFuel,
    /// The wall-clock budget ran out.
    WallClock,
    /// The plugin grew its memory past the cap.
    MemoryCap(String),
    /// The plugin was refused before it ran: no or unsupported ABI version, not a
    /// component, imports kiln does not grant, does not compile.
    Refused(String),
    /// kilnd could not be reached, or answered something the host cannot use.
    Bridge(String),
    /// A fault in the host itself.
    Host(String),
}

impl Outcome {
    /// The machine-readable kind, as in [`Failure::kind`] (`ok` for success).
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Ok(_) => "ok",
            Outcome::PluginError(_) => "plugin_error",
            Outcome::Trap(_) => "trap",
            Outcome::OutOfFuel => "out_of_fuel",
            Outcome::WallClock => "wall_clock",
            Outcome::MemoryCap(_) => "memory_cap",
            Outcome::Refused(_) => "refused",
            Outcome::Bridge(_) => "bridge",
            Outcome::Host(_) => "host",
        }
    }

    /// The host process's exit status for this outcome (docs/plugins.md).
    pub fn exit_code(&self) -> u8 {
        match self {
            Outcome::Ok(_) => 0,
            Outcome::Host(_) => 1,
            Outcome::PluginError(_) => 10,
            Outcome::Trap(_) => 11,
            Outcome::OutOfFuel => 12,
            Outcome::WallClock => 13,
            Outcome::MemoryCap(_) => 14,
            Outcome::Refused(_) => 15,
            Outcome::Bridge(_) => 16,
        }
    }

    /// One line for people.
    pub fn message(&self) -> String {
        match self {
            Outcome::Ok(s) => s.message.clone(),
            Outcome::PluginError(m) => format!("the plugin gave up: {m}"),
            Outcome::Trap(m) => format!("the plugin trapped: {m}"),
            Outcome::OutOfFuel => "the plugin used all its fuel (CPU budget)".into(),
            Outcome::WallClock => "the plugin ran out of its wall-clock budget".into(),
            Outcome::MemoryCap(m) => m.clone(),
            Outcome::Refused(m) => format!("the plugin was refused: {m}"),
            Outcome::Bridge(m) => format!("lost kilnd: {m}"),
            Outcome::Host(m) => format!("plugin host fault: {m}"),
        }
    }
}

/// Everything known about a finished run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// How it ended.
    pub outcome: Outcome,
    /// The end of the plugin's stderr (and stdout), bounded.
    pub stderr: String,
    /// Resource use.
    pub stats: RunStats,
}

impl Report {
    /// A report for a run that ended before the plugin started.
    pub fn early(outcome: Outcome) -> Self {
        Report {
            outcome,
            stderr: String::new(),
            stats: RunStats::default(),
        }
    }

    /// The body of `POST /finish`.
    pub fn finish(&self) -> Finish {
        let (ok, error) = match &self.outcome {
            Outcome::Ok(s) => (Some(s.clone()), None),
            other => (
                None,
                Some(Failure {
                    kind: other.kind().into(),
                    message: other.message(),
                }),
            ),
        };
        Finish {
            ok,
            error,
            stderr: self.stderr.clone(),
            stats: self.stats,
        }
    }
}
