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

/// Any JSON value as text for people, on one line and cut to a readable length: strings
/// as they are, arrays as `a, b`, objects as `key value; key value` (nested ones in
/// parentheses), never JSON syntax.
pub fn human(v: &Value) -> String {
    fn render(v: &Value, nested: bool) -> String {
        match v {
            Value::Null => "-".into(),
            Value::String(s) => s.clone(),
            Value::Bool(b) => (if *b { "yes" } else { "no" }).into(),
            Value::Number(n) => n.to_string(),
            Value::Array(a) if a.is_empty() => "none".into(),
            Value::Array(a) => a
                .iter()
                .map(|x| render(x, true))
                .collect::<Vec<_>>()
                .join(", "),
            Value::Object(m) if m.is_empty() => "none".into(),
            Value::Object(m) => {
                let body = m
                    .iter()
                    .map(|(k, x)| format!("{k} {}", render(x, true)))
                    .collect::<Vec<_>>()
                    .join("; ");
                if nested { format!("({body})") } else { body }
            }
        }
    }
    let s = render(v, false);
    if s.chars().count() > 200 {
        let cut: String = s.chars().take(200).collect();
        format!("{cut}… (-o json for all of it)")
    } else {
        s
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn any_value_reads_without_json_syntax() {
        let v = json!({"a": {"b": [1, 2], "c": null}, "d": true, "e": [], "f": "x"});
        assert_eq!(human(&v), "a (b 1, 2; c -); d yes; e none; f x");
        assert_eq!(human(&json!([0, 1, 2])), "0, 1, 2");
        let long = human(&json!({"k": "x".repeat(300)}));
        assert!(
            long.ends_with("(-o json for all of it)") && long.len() < 260,
            "{long}"
        );
    }
}
