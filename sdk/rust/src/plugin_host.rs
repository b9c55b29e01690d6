//! Services of the plugin host: logging, monotonic time, the search's seeded
//! randomness, checkpoints of the plugin's own state, and the budget left.

use std::time::Duration;

use thiserror::Error;

use crate::bindings::kiln::proposer::host as wit;

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Details for debugging the strategy.
    Debug,
    /// Progress worth showing to people.
    Info,
    /// Something unexpected the strategy recovered from.
    Warn,
    /// Something that went wrong.
    Error,
}

/// Appends a line to the search's log (`kiln search log`). See also [`crate::info!`].
pub fn log(level: Level, message: &str) {
    let level = match level {
        Level::Trace => wit::Level::Trace,
        Level::Debug => wit::Level::Debug,
        Level::Info => wit::Level::Info,
        Level::Warn => wit::Level::Warn,
        Level::Error => wit::Level::Error,
    };
    wit::log(level, message);
}

/// Logs a formatted line at [`Level::Debug`].
#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => { $crate::log($crate::Level::Debug, &::std::format!($($arg)*)) };
}

/// Logs a formatted line at [`Level::Info`].
#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => { $crate::log($crate::Level::Info, &::std::format!($($arg)*)) };
}

/// Logs a formatted line at [`Level::Warn`].
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => { $crate::log($crate::Level::Warn, &::std::format!($($arg)*)) };
}

/// Logs a formatted line at [`Level::Error`].
#[macro_export]
macro_rules! error {
    ($($arg:tt)*) => { $crate::log($crate::Level::Error, &::std::format!($($arg)*)) };
}

/// Time since the plugin started, from the host's monotonic clock. (`std::time` has no
/// clock inside the plugin: WASI clocks are not linked.)
pub fn now() -> Duration {
    Duration::from_nanos(wit::monotonic_now_ns())
}

/// The next number of the host's stream seeded from the search's seed.
pub fn random_u64() -> u64 {
    wit::random_u64()
}

/// Why the host refused a request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HostError {
    /// The checkpoint is larger than the host accepts.
    #[error("checkpoint is too large: the limit is {0} bytes")]
    TooLarge(u64),
}

/// Stores the plugin's own state, replacing the previous checkpoint. After a daemon
/// restart, `run` is called again and [`restore`] returns this state.
pub fn checkpoint(state: &[u8]) -> Result<(), HostError> {
    wit::checkpoint(state).map_err(|e| match e {
        wit::HostError::TooLarge(n) => HostError::TooLarge(n),
    })
}

/// The last checkpoint of this search, if any.
pub fn restore() -> Option<Vec<u8>> {
    wit::restore()
}

/// What is left of the search's budgets; `None` means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Candidates that may still be submitted.
    pub candidates_left: Option<u64>,
    /// Wall-clock time left to the plugin.
    pub time_left: Option<Duration>,
    /// LLM tokens left.
    pub tokens_left: Option<u64>,
}

/// What is left of the search's budgets.
pub fn budget() -> Budget {
    let b = wit::budget();
    Budget {
        candidates_left: b.candidates_left,
        time_left: b.ms_left.map(Duration::from_millis),
        tokens_left: b.tokens_left,
    }
}

/// A small deterministic generator (SplitMix64), seeded from the search's seed by
/// [`Rng::from_host`]. Its whole state is one `u64` ([`Rng::state`]), so a plugin can
/// keep it in its checkpoint and continue the same stream after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with the next number of the host's seeded stream.
    pub fn from_host() -> Self {
        Rng::from_state(random_u64())
    }

    /// A generator in a given state (from [`Rng::state`] or any seed).
    pub fn from_state(state: u64) -> Self {
        Rng { state }
    }

    /// The generator's state, for checkpoints.
    pub fn state(&self) -> u64 {
        self.state
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` when `n` is 0), without modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// A float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A random element of `items`, `None` when empty.
    pub fn choose<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        let i = usize::try_from(self.below(items.len() as u64)).ok()?;
        items.get(i)
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = usize::try_from(self.below(i as u64 + 1)).unwrap_or(0);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_resumable() {
        let mut a = Rng::from_state(42);
        let first: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let mut b = Rng::from_state(42);
        assert_eq!(first, (0..4).map(|_| b.next_u64()).collect::<Vec<_>>());
        let mut c = Rng::from_state(b.state());
        assert_eq!(a.next_u64(), c.next_u64());
    }

    #[test]
    fn rng_ranges() {
        let mut r = Rng::from_state(7);
        for _ in 0..1000 {
            assert!(r.below(3) < 3);
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
        assert_eq!(r.below(0), 0);
        assert!(r.choose::<u8>(&[]).is_none());
        let mut v: Vec<u32> = (0..10).collect();
        r.shuffle(&mut v);
        v.sort_unstable();
        assert_eq!(v, (0..10).collect::<Vec<_>>());
    }
}
