//! An evaluation's telemetry as lines a person reads: the jail's layers, the GPU and its
//! clocks, power and throttling over the timing window. The raw document (with the
//! per-reading series) stays in `-o json` and in `kiln show --report`.

use serde_json::Value;

/// Labelled lines (`(label, text)`) for the telemetry document `t`.
pub fn lines(t: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(map) = t.as_object() else {
        if !t.is_null() {
            out.push(("telemetry".into(), compact(t)));
        }
        return out;
    };
    // The known parts first, in this order; anything else after them, by name.
    let rank = |k: &str| ["jail", "device", "gpu"].iter().position(|x| *x == k);
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort_by_key(|k| (rank(k).unwrap_or(usize::MAX), k.as_str()));
    for key in keys {
        let v = &map[key.as_str()];
        match key.as_str() {
            "jail" => out.push(("jail".into(), jail(v))),
            "device" => out.push(("device".into(), device(v))),
            "gpu" => out.push(("gpu".into(), gpu(v))),
            // Listed with the compile step; the report draws them.
            "kernels" => {}
            other => out.push((other.to_string(), compact(v))),
        }
    }
    out
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
        .collect()
}

fn jail(v: &Value) -> String {
    let active = names(&v["active"]);
    let mut s = format!("{} layers active ({})", active.len(), active.join(", "));
    if let Some(inactive) = v["inactive"].as_object().filter(|m| !m.is_empty()) {
        let off: Vec<String> = inactive
            .iter()
            .map(|(name, why)| match why.as_str() {
                Some(w) if !w.is_empty() => format!("{name} ({w})"),
                _ => name.clone(),
            })
            .collect();
        s.push_str(&format!("; not active: {}", off.join(", ")));
    }
    s
}

fn device(v: &Value) -> String {
    match v {
        Value::Object(_) => {
            let parts: Vec<String> = ["name", "arch", "uuid"]
                .iter()
                .filter_map(|k| v[*k].as_str().map(str::to_string))
                .collect();
            if parts.is_empty() {
                compact(v)
            } else {
                parts.join("  ")
            }
        }
        other => compact(other),
    }
}

fn range(v: &Value, unit: &str) -> Option<String> {
    let (lo, med, hi) = (v["min"].as_f64()?, v["median"].as_f64(), v["max"].as_f64()?);
    Some(match med {
        Some(m) if lo != hi => format!("{lo:.0}–{hi:.0} {unit} (median {m:.0})"),
        _ if lo != hi => format!("{lo:.0}–{hi:.0} {unit}"),
        _ => format!("{lo:.0} {unit}"),
    })
}

fn gpu(v: &Value) -> String {
    if v["available"] == Value::Bool(false) {
        return format!(
            "no readings: {}",
            v["reason"].as_str().unwrap_or("telemetry unavailable")
        );
    }
    let s = &v["summary"];
    let mut parts = Vec::new();
    if let Some(r) = range(&s["sm_mhz"], "MHz") {
        parts.push(format!("SM {r}"));
    }
    if let Some(r) = range(&s["mem_mhz"], "MHz") {
        parts.push(format!("memory {r}"));
    }
    match (s["power_w_avg"].as_f64(), s["power_w_max"].as_f64()) {
        (Some(a), Some(m)) => parts.push(format!("power {a:.0} W avg, {m:.0} W max")),
        (Some(a), None) => parts.push(format!("power {a:.0} W avg")),
        _ => {}
    }
    if let Some(t) = s["temp_c_max"].as_f64() {
        parts.push(format!("{t:.0} °C max"));
    }
    let reasons = names(&s["reasons_seen"]);
    if !reasons.is_empty() {
        parts.push(format!("clock events: {}", reasons.join(", ")));
    }
    if let (Some(n), Some(flagged)) = (
        v["timing_samples"].as_u64(),
        v["throttled_timing_samples"].as_u64(),
    ) {
        parts.push(format!("{flagged} of {n} timing samples throttled"));
    }
    let policies: Vec<String> = ["throttle_policy", "clock_policy"]
        .iter()
        .filter_map(|k| v[*k].as_str().map(|p| format!("{} {p}", &k[..k.len() - 7])))
        .collect();
    if !policies.is_empty() {
        parts.push(format!("policy: {}", policies.join(", ")));
    }
    if parts.is_empty() {
        compact(v)
    } else {
        parts.join("; ")
    }
}

/// A JSON value on one line, cut to a readable length.
fn compact(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if s.chars().count() > 200 {
        let cut: String = s.chars().take(200).collect();
        format!("{cut}… (-o json for all of it)")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_jail_reads_as_its_layers_and_why_some_are_off() {
        let l = lines(&json!({"jail": {
            "active": ["user-namespace", "seccomp"],
            "inactive": {"cgroup": "no delegated cgroup v2 directory configured"}
        }}));
        assert_eq!(
            l,
            vec![(
                "jail".to_string(),
                "2 layers active (user-namespace, seccomp); not active: cgroup (no delegated \
                 cgroup v2 directory configured)"
                    .to_string()
            )]
        );
    }

    #[test]
    fn a_gpu_window_reads_as_clocks_power_and_throttling_without_its_series() {
        let l = lines(&json!({
            "device": {"name": "NVIDIA H200", "uuid": "GPU-1", "arch": "sm_90"},
            "kernels": [{"name": "k"}],
            "gpu": {
                "available": true,
                "summary": {"sm_mhz": {"min": 1755, "median": 1980, "max": 1980},
                            "power_w_avg": 150.2, "power_w_max": 171.0, "temp_c_max": 41,
                            "reasons_seen": ["sw_power_cap"]},
                "series": {"t_ms": [0, 5, 10], "sm_mhz": [1980, 1980, 1755]},
                "timing_samples": 40, "throttled_timing_samples": 1,
                "throttle_policy": "report", "clock_policy": "observe"
            }
        }));
        let labels: Vec<&str> = l.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(labels, ["device", "gpu"], "{l:?}");
        assert_eq!(l[0].1, "NVIDIA H200  sm_90  GPU-1");
        let gpu = &l[1].1;
        assert_eq!(
            gpu,
            "SM 1755–1980 MHz (median 1980); power 150 W avg, 171 W max; 41 °C max; \
             clock events: sw_power_cap; 1 of 40 timing samples throttled; \
             policy: throttle report, clock observe"
        );
        assert!(!gpu.contains("t_ms"), "{gpu}");
    }

    #[test]
    fn missing_readings_and_unknown_keys_still_read() {
        let l = lines(&json!({
            "gpu": {"available": false, "reason": "NVML is not available"},
            "extra": {"a": 1},
            "long": "x".repeat(300)
        }));
        assert_eq!(
            l[0],
            ("gpu".into(), "no readings: NVML is not available".into())
        );
        assert_eq!(l[1], ("extra".into(), r#"{"a":1}"#.into()));
        assert!(l[2].1.ends_with("(-o json for all of it)") && l[2].1.len() < 260);
        assert!(lines(&Value::Null).is_empty());
    }
}
