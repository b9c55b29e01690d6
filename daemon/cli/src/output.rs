//! Output helpers: `-o json` prints the API's JSON as is; text is for people.

use clap::ValueEnum;
use serde_json::Value;

/// How a command prints what it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Human-readable text.
    Text,
    /// The JSON document, pretty-printed.
    Json,
}

/// Prints a JSON value, pretty.
pub fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

/// A JSON value as short text: strings without quotes, null as `-`.
pub fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Microseconds for people.
pub fn fmt_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.3} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.3} ms", us / 1e3)
    } else {
        format!("{us:.2} µs")
    }
}
