//! How a report shows things: the colour of each kind of point (by verdict, with raced-out
//! and plain timings apart), the marker shape of each precision tier, and number formats.
//! The HTML legends and the plots both take them from here, so they always agree.

use kiln_types::{PrecisionTier, TrustMode, Verdict};
use plotters::style::RGBColor;

/// What a finished evaluation of a search counts as, for colours and counts. Ordered as
/// legends list them: the correct classes, the verdicts in contract order, not evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// `ok`, and may rank as a best.
    Ok,
    /// `ok`, but timing stopped early: clearly slower than the incumbent it raced.
    RacedOut,
    /// `ok` with a plain (KernelBench-style) timing: never ranked.
    Plain,
    /// Another verdict.
    Failed(Verdict),
    /// kiln could not evaluate it (its job failed).
    NotEvaluated,
}

impl Class {
    fn rank(self) -> (u8, u8) {
        match self {
            Class::Ok => (0, 0),
            Class::RacedOut => (1, 0),
            Class::Plain => (2, 0),
            Class::Failed(v) => (3, v as u8),
            Class::NotEvaluated => (4, 0),
        }
    }

    /// Label for legends and tables.
    pub fn label(self) -> String {
        match self {
            Class::Ok => "ok".into(),
            Class::RacedOut => "ok, raced out".into(),
            Class::Plain => "ok, plain timing".into(),
            Class::Failed(v) => v.as_str().into(),
            Class::NotEvaluated => "not evaluated (job failed)".into(),
        }
    }

    /// Its colour.
    pub fn color(self) -> RGBColor {
        match self {
            Class::Ok => RGBColor(0x1b, 0x9e, 0x45),
            Class::RacedOut => RGBColor(0xe6, 0x8a, 0x00),
            Class::Plain => RGBColor(0x5c, 0x7c, 0xa8),
            Class::NotEvaluated => RGBColor(0xb0, 0xb0, 0xb0),
            Class::Failed(v) => match v {
                Verdict::CompileError => RGBColor(0x7f, 0x7f, 0x7f),
                Verdict::InvalidLaunch => RGBColor(0x94, 0x67, 0xbd),
                Verdict::RuntimeFault => RGBColor(0xd6, 0x27, 0x28),
                Verdict::Timeout => RGBColor(0x8c, 0x56, 0x4b),
                Verdict::WrongAnswer => RGBColor(0xc2, 0x18, 0x5b),
                Verdict::IncompleteOutput => RGBColor(0xe3, 0x77, 0xc2),
                Verdict::InputTampered => RGBColor(0x20, 0x20, 0x20),
                Verdict::Nondeterministic => RGBColor(0x17, 0xbe, 0xcf),
                Verdict::ImplausibleTime => RGBColor(0xbc, 0xbd, 0x22),
                Verdict::UnmeasurableTime => RGBColor(0x55, 0x6b, 0x2f),
                Verdict::NoOwnKernels => RGBColor(0x8c, 0x6d, 0x1f),
                Verdict::Ok => RGBColor(0x1b, 0x9e, 0x45),
            },
        }
    }

    /// True for the classes drawn hollow (timed, but never ranked as a best).
    pub fn hollow(self) -> bool {
        matches!(self, Class::RacedOut | Class::Plain)
    }
}

impl Ord for Class {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

impl PartialOrd for Class {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The marker of a precision tier (`None`: no tier, a failed or untimed evaluation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// fp32-faithful.
    Circle,
    /// tf32-like.
    Triangle,
    /// fp16-like.
    Square,
    /// bf16-like.
    Diamond,
    /// coarse.
    Cross,
    /// No tier.
    Dot,
}

impl Marker {
    /// The marker of `tier`.
    pub fn of(tier: Option<PrecisionTier>) -> Marker {
        match tier {
            Some(PrecisionTier::Fp32Faithful) => Marker::Circle,
            Some(PrecisionTier::Tf32Like) => Marker::Triangle,
            Some(PrecisionTier::Fp16Like) => Marker::Square,
            Some(PrecisionTier::Bf16Like) => Marker::Diamond,
            Some(PrecisionTier::Coarse) => Marker::Cross,
            None => Marker::Dot,
        }
    }

    /// The same shape as a character, for HTML legends and tables.
    pub fn glyph(self) -> &'static str {
        match self {
            Marker::Circle => "●",
            Marker::Triangle => "▲",
            Marker::Square => "■",
            Marker::Diamond => "◆",
            Marker::Cross => "✕",
            Marker::Dot => "·",
        }
    }
}

/// Every tier, most precise first, for legends and counts.
pub const TIERS: [PrecisionTier; 5] = [
    PrecisionTier::Fp32Faithful,
    PrecisionTier::Tf32Like,
    PrecisionTier::Fp16Like,
    PrecisionTier::Bf16Like,
    PrecisionTier::Coarse,
];

/// A tier's wire name (`fp32-faithful`, …).
pub fn tier_name(t: PrecisionTier) -> &'static str {
    match t {
        PrecisionTier::Fp32Faithful => "fp32-faithful",
        PrecisionTier::Tf32Like => "tf32-like",
        PrecisionTier::Fp16Like => "fp16-like",
        PrecisionTier::Bf16Like => "bf16-like",
        PrecisionTier::Coarse => "coarse",
    }
}

/// A trust mode with what it means, for the pages' fact tables.
pub fn trust_text(t: TrustMode) -> &'static str {
    match t {
        TrustMode::Contract => {
            "contract (kiln launched the candidate's device code from its plan; none of its \
             host code ran)"
        }
        TrustMode::Hosted => {
            "hosted (the candidate's own Python ran in a jailed runner; kiln made the inputs \
             and weights, compared the outputs and timed it from its side)"
        }
        TrustMode::Lifted => {
            "lifted (a ModelNew file's own kernels and launches, recorded in its jailed runner \
             and launched by kiln from a plan: the contract's guarantees, none of the file's \
             host code ran)"
        }
    }
}

/// Colour of the best-so-far line.
pub const BEST: RGBColor = RGBColor(0x1f, 0x4e, 0x9c);
/// Colour of the seed's line.
pub const SEED: RGBColor = RGBColor(0x55, 0x55, 0x55);
/// Colour of the roofline floor lines.
pub const FLOOR: RGBColor = RGBColor(0xb2, 0x18, 0x2b);

/// Colours of baseline lines, in turn (baselines come from the problem's results, so
/// there is no fixed list).
pub fn baseline_color(i: usize) -> RGBColor {
    const C: [RGBColor; 6] = [
        RGBColor(0x99, 0x4f, 0xc8),
        RGBColor(0x00, 0x8b, 0x8b),
        RGBColor(0xd9, 0x5f, 0x02),
        RGBColor(0x66, 0xa6, 0x1e),
        RGBColor(0xe7, 0x29, 0x8a),
        RGBColor(0x8c, 0x6d, 0x31),
    ];
    C[i % C.len()]
}

/// A colour as CSS `#rrggbb`.
pub fn css(c: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// Microseconds for people.
pub fn fmt_us(us: f64) -> String {
    if !us.is_finite() {
        "-".into()
    } else if us >= 1e6 {
        format!("{:.3} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.3} ms", us / 1e3)
    } else if us >= 10.0 {
        format!("{us:.1} µs")
    } else {
        format!("{us:.2} µs")
    }
}

/// Microseconds for axis ticks: three significant digits, no trailing zeros (`10 ms`,
/// `3.35 ms`, `750 µs`).
pub fn fmt_tick(us: f64) -> String {
    if !us.is_finite() {
        return "-".into();
    }
    let (v, unit) = if us >= 1e6 {
        (us / 1e6, "s")
    } else if us >= 1e3 {
        (us / 1e3, "ms")
    } else {
        (us, "µs")
    };
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    let text = format!("{v:.digits$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    };
    format!("{text} {unit}")
}

/// Seconds for people (`42 s`, `3 min 5 s`, `2 h 1 min`).
pub fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0);
    if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        format!("{} min {} s", (s / 60.0).floor(), (s % 60.0).floor())
    } else {
        format!(
            "{} h {} min",
            (s / 3600.0).floor(),
            ((s % 3600.0) / 60.0).floor()
        )
    }
}

/// A speedup for people (`1.93x`).
pub fn fmt_x(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}x")
    } else {
        "-".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_have_distinct_colours_and_tiers_distinct_markers() {
        let mut classes = vec![
            Class::Ok,
            Class::RacedOut,
            Class::Plain,
            Class::NotEvaluated,
        ];
        for v in [
            Verdict::CompileError,
            Verdict::InvalidLaunch,
            Verdict::RuntimeFault,
            Verdict::Timeout,
            Verdict::WrongAnswer,
            Verdict::IncompleteOutput,
            Verdict::InputTampered,
            Verdict::Nondeterministic,
            Verdict::ImplausibleTime,
        ] {
            classes.push(Class::Failed(v));
        }
        let mut colours: Vec<String> = classes.iter().map(|c| css(c.color())).collect();
        colours.sort();
        colours.dedup();
        assert_eq!(colours.len(), classes.len());
        let mut glyphs: Vec<&str> = TIERS.iter().map(|t| Marker::of(Some(*t)).glyph()).collect();
        glyphs.push(Marker::of(None).glyph());
        glyphs.sort();
        glyphs.dedup();
        assert_eq!(glyphs.len(), TIERS.len() + 1);
        assert_eq!(fmt_us(1234.5), "1.234 ms");
        assert_eq!(fmt_tick(10_000.0), "10 ms");
        assert_eq!(fmt_tick(3346.2), "3.35 ms");
        assert_eq!(fmt_tick(750.0), "750 µs");
        assert_eq!(fmt_tick(1.5), "1.5 µs");
        assert_eq!(fmt_secs(125.0), "2 min 5 s");
        // The tier names are the wire names.
        for t in TIERS {
            assert_eq!(serde_json::to_value(t).ok(), Some(tier_name(t).into()));
        }
    }
}
