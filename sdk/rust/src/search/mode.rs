//! Which mode a search runs in, and the rule deciding whether a candidate beats another.

use kiln_types::TimingStats;

use crate::evaluator::Evaluation;
use crate::stats::{Comparison, compare};

/// Where a strategy's changes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// From the seed kernel's `@knob` and `@idea` annotations, deterministic given the
    /// search's seed.
    Offline,
    /// From a model through kilnd's LLM gateway.
    Llm,
}

impl Mode {
    /// Reads `"offline"`, `"llm"` or `"auto"` (nothing means auto). `llm` and `auto` give
    /// [`Mode::Llm`] unless the search has no LLM tokens at all; a strategy in LLM mode
    /// falls back to offline when the gateway answers `unavailable` (no model is
    /// configured), so the default searches usefully on any machine.
    pub fn parse(word: Option<&str>) -> Result<Mode, String> {
        match word.unwrap_or("auto") {
            "offline" => Ok(Mode::Offline),
            "llm" | "auto" => Ok(if crate::plugin_host::budget().tokens_left == Some(0) {
                Mode::Offline
            } else {
                Mode::Llm
            }),
            other => Err(format!(
                "config `mode`: {other:?} is not one of offline, llm, auto"
            )),
        }
    }

    /// `offline` or `llm`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Offline => "offline",
            Mode::Llm => "llm",
        }
    }
}

/// When a new timing counts as faster than the incumbent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Accept {
    /// Lower median *and* 95 % confidence intervals of the mean that do not overlap
    /// (kiln's statistics; the default).
    #[default]
    Significant,
    /// Lower median only.
    Median,
}

impl Accept {
    /// Reads `"significant"` (or `"ci"`) and `"median"`; nothing gives the default.
    pub fn parse(word: Option<&str>) -> Result<Accept, String> {
        match word {
            None | Some("significant") | Some("ci") => Ok(Accept::Significant),
            Some("median") => Ok(Accept::Median),
            Some(other) => Err(format!(
                "config `accept`: {other:?} is not one of significant, median"
            )),
        }
    }

    /// True if and only if `new` is correct and faster than `old` by this rule (an
    /// incorrect or untimed `old` is beaten by any correct, timed `new`).
    pub fn faster(self, new: &Evaluation, old: Option<&Evaluation>) -> bool {
        let Some(nt) = new.timing().filter(|_| new.is_ok()) else {
            return false;
        };
        let Some(ot) = old.filter(|o| o.is_ok()).and_then(Evaluation::timing) else {
            return true;
        };
        self.faster_timing(&nt, &ot)
    }

    /// The rule on two timings.
    pub fn faster_timing(self, new: &TimingStats, old: &TimingStats) -> bool {
        let lower = new.median_us < old.median_us;
        match self {
            Accept::Median => lower,
            Accept::Significant => lower && compare(new, old) == Comparison::Faster,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(median: f64, sd: f64) -> TimingStats {
        TimingStats {
            median_us: median,
            mean_us: median,
            stdev_us: sd,
            n: 20,
            ..TimingStats::default()
        }
    }

    #[test]
    fn accept_rules() {
        let a = Accept::parse(None).expect("default");
        assert!(a.faster_timing(&t(10.0, 0.5), &t(20.0, 0.5)));
        assert!(!a.faster_timing(&t(19.0, 5.0), &t(20.0, 5.0)));
        assert!(Accept::Median.faster_timing(&t(19.0, 5.0), &t(20.0, 5.0)));
        assert!(!Accept::Median.faster_timing(&t(21.0, 0.0), &t(20.0, 0.0)));
        assert!(Accept::parse(Some("nope")).is_err());
    }
}
