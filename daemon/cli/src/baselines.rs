//! Text for baselines: `kiln problems baseline NAME`, the baselines part of
//! `kiln problems show NAME`, and the speedups in `kiln show ID`.

use serde_json::Value;

use crate::output::text;

/// Microseconds, short.
fn us(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.3} ms", v / 1000.0)
    } else {
        format!("{v:.2} us")
    }
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DD HH:MM UTC` (civil-from-days).
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60
    )
}

/// One line per baseline of a stored set (`BaselineSet` JSON), with a header line.
pub fn set_lines(set: &Value) -> Vec<String> {
    let when = set["measured_at"]
        .as_i64()
        .map_or_else(|| text(&set["measured_at"]), utc);
    let mut lines = vec![format!(
        "  on {} (driver {}), measured {when}",
        text(&set["gpu_model"]),
        text(&set["driver"]),
    )];
    for r in set["results"].as_array().into_iter().flatten() {
        let name = text(&r["name"]);
        let prec = text(&r["precision"]);
        let line = match (r["status"].as_str(), r["timing"]["median_us"].as_f64()) {
            (Some("measured"), Some(m)) => {
                let rse = r["timing"]["rse"].as_f64().unwrap_or(0.0) * 100.0;
                let n = text(&r["timing"]["n"]);
                let err = match (r["rel_l2"].as_f64(), r["mismatches"].as_u64()) {
                    (Some(e), Some(0)) => format!("  rel L2 {e:.1e}"),
                    (Some(e), Some(b)) => format!("  rel L2 {e:.1e}, {b} outside tolerance"),
                    _ => String::new(),
                };
                format!(
                    "  {name:<20} {prec:<17} {:>12}  n {n} rse {rse:.2} %{err}",
                    us(m)
                )
            }
            (status, _) => format!(
                "  {name:<20} {prec:<17} {:>12}  {}",
                status.unwrap_or("?"),
                text(&r["detail"])
            ),
        };
        lines.push(line);
    }
    lines
}

/// One line per speedup (`Speedup` JSON list) of a candidate.
pub fn speedup_lines(speedups: &Value) -> Vec<String> {
    speedups
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let precision = text(&s["precision"]);
            // kilnd before harnesses had every figure in process, like its candidates.
            let harness = if s["harness"] == "hosted" {
                "hosted"
            } else {
                "in process"
            };
            let same = if s["same_harness"] == false {
                "; another harness than this candidate's: not comparable"
            } else {
                ""
            };
            format!(
                "  speedup   {:>7.2}x vs {} ({}{harness}, {}{same})",
                s["speedup"].as_f64().unwrap_or(0.0),
                text(&s["baseline"]),
                if precision.is_empty() {
                    String::new()
                } else {
                    format!("{precision}, ")
                },
                us(s["baseline_us"].as_f64().unwrap_or(0.0))
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(1_796_020_062_986), "2026-11-30 06:27 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00 UTC");
    }
    use serde_json::json;

    #[test]
    fn measured_and_unavailable_baselines_read_well() {
        let set = json!({
            "gpu_model": "NVIDIA H200", "driver": "580.159.04", "measured_at": 1,
            "results": [
                {"name": "cublas-fp32", "precision": "fp32", "status": "measured",
                 "timing": {"median_us": 2714.0, "rse": 0.001, "n": 12}, "rel_l2": 1.1e-6, "mismatches": 0},
                {"name": "torch-eager", "precision": "", "status": "unavailable",
                 "detail": "python cannot import torch"}
            ]
        });
        let lines = set_lines(&set);
        assert!(lines[0].contains("NVIDIA H200"), "{lines:?}");
        assert!(
            lines[1].contains("2.714 ms") && lines[1].contains("fp32"),
            "{lines:?}"
        );
        assert!(
            lines[2].contains("unavailable") && lines[2].contains("torch"),
            "{lines:?}"
        );
        let sp = speedup_lines(
            &json!([{"baseline": "cublas-fp32", "precision": "fp32", "baseline_us": 2714.0, "speedup": 0.42}]),
        );
        assert_eq!(sp.len(), 1);
        assert!(
            sp[0].contains("0.42x vs cublas-fp32 (fp32, in process, 2.714 ms)"),
            "{sp:?}"
        );
    }
}
