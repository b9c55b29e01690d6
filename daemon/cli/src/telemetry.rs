//! An evaluation's telemetry as lines a person reads: the jail's layers (namespaces,
//! seccomp, cgroup, then the rest), the GPU and its clocks, power, temperature and
//! throttling over the timing window, the lane and the warm worker. Never a JSON object:
//! a part this kiln does not know reads as `key value` pairs. The raw document (with the
//! per-reading series) stays in `-o json` and in `kiln show --report`.

use serde_json::Value;

use crate::output::human;

/// Labelled lines (`(label, text)`) for the telemetry document `t`; a line that goes on
/// from the one before has an empty label.
pub fn lines(t: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(map) = t.as_object() else {
        if !t.is_null() {
            out.push(("telemetry".into(), human(t)));
        }
        return out;
    };
    // The known parts first, in this order; anything else after them, by name.
    let rank = |k: &str| {
        ["jail", "device", "gpu", "lane", "worker"]
            .iter()
            .position(|x| *x == k)
    };
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort_by_key(|k| (rank(k).unwrap_or(usize::MAX), k.as_str()));
    for key in keys {
        let v = &map[key.as_str()];
        match key.as_str() {
            "jail" => {
                let (summary, also) = jail(v);
                out.push(("jail".into(), summary));
                out.extend(also.map(|a| (String::new(), a)));
            }
            "device" => out.push(("device".into(), device(v))),
            "gpu" => out.push(("gpu".into(), gpu(v))),
            "worker" => out.push(("worker".into(), worker(v))),
            // Listed with the compile step; the report draws them.
            "kernels" => {}
            other => out.push((other.to_string(), human(v))),
        }
    }
    out
}

fn names(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().map(human).collect()
}

/// The jail's layers: namespaces, seccomp and cgroup (and any other layer that is off)
/// on the first line, the other layers that are on after `also on:`.
fn jail(v: &Value) -> (String, Option<String>) {
    if !v.is_object() {
        return (human(v), None);
    }
    let active = names(&v["active"]);
    let inactive: Vec<(String, String)> = v["inactive"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, why)| (name.clone(), human(why)))
        .collect();
    let off = |name: &str, why: &str| {
        if why.is_empty() || why == "-" {
            format!("{name} off")
        } else {
            format!("{name} off ({why})")
        }
    };
    let mut parts = Vec::new();
    let namespaces: Vec<&str> = active
        .iter()
        .filter_map(|n| n.strip_suffix("-namespace"))
        .collect();
    if !namespaces.is_empty() {
        parts.push(format!("namespaces {}", namespaces.join(", ")));
    }
    for (name, why) in inactive.iter().filter(|(n, _)| n.ends_with("-namespace")) {
        parts.push(off(name, why));
    }
    for key in ["seccomp", "cgroup"] {
        if active.iter().any(|n| n == key) {
            parts.push(format!("{key} on"));
        } else if let Some((_, why)) = inactive.iter().find(|(n, _)| n == key) {
            parts.push(off(key, why));
        }
    }
    let known = |n: &str| n.ends_with("-namespace") || n == "seccomp" || n == "cgroup";
    for (name, why) in inactive.iter().filter(|(n, _)| !known(n)) {
        parts.push(off(name, why));
    }
    let also: Vec<&str> = active
        .iter()
        .map(String::as_str)
        .filter(|n| !known(n))
        .collect();
    let summary = if parts.is_empty() {
        "no layers reported".to_string()
    } else {
        parts.join("; ")
    };
    let also = (!also.is_empty()).then(|| format!("also on: {}", also.join(", ")));
    (summary, also)
}

fn device(v: &Value) -> String {
    let parts: Vec<String> = ["name", "arch", "uuid"]
        .iter()
        .filter_map(|k| v[*k].as_str().map(str::to_string))
        .collect();
    if parts.is_empty() {
        human(v)
    } else {
        parts.join("  ")
    }
}

/// The warm worker that ran the evaluation: how many it has served, whether it retired.
fn worker(v: &Value) -> String {
    let Some(served) = v["evaluations_served"].as_u64() else {
        return human(v);
    };
    let mut s = if v["warm"].as_bool() == Some(true) {
        format!("warm: evaluation {served} on this worker")
    } else {
        format!("fresh: evaluation {served} on this worker")
    };
    if v["retired"].as_bool() == Some(true) {
        s.push_str("; retired after it");
    }
    s
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
    if !parts.is_empty() {
        return parts.join("; ");
    }
    // No summary: what there is, less the per-reading series (the report draws those).
    match v.as_object() {
        Some(m) if m.keys().all(|k| k == "series") => "no readings".into(),
        Some(m) => {
            let mut rest = m.clone();
            rest.remove("series");
            human(&Value::Object(rest))
        }
        None => human(v),
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
                "namespaces user; seccomp on; cgroup off (no delegated cgroup v2 directory \
                 configured)"
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
        assert_eq!(l[1], ("extra".into(), "a 1".into()));
        assert!(l[2].1.ends_with("(-o json for all of it)") && l[2].1.len() < 260);
        assert!(lines(&Value::Null).is_empty());
        // A lane whose GPU gave nothing yet (kilnd's placeholder) says so.
        assert_eq!(
            lines(&json!({"gpu": {}})),
            vec![("gpu".to_string(), "no readings".to_string())]
        );
    }

    /// The telemetry of a cuda evaluation on a warm lane as kilnd stores it (the shape of
    /// docs/gpu-logs/2026-11-30-h200-gpu-check-4.log, whose `kiln submit --wait` printed
    /// the worker as a JSON object).
    #[test]
    fn a_cuda_evaluation_reads_as_labelled_lines_without_json() {
        let l = lines(&json!({
            "jail": {
                "active": ["fds-closed", "user-namespace", "mount-namespace",
                           "network-namespace", "ipc-namespace", "pid-namespace",
                           "parent-death-signal", "private-root", "hidden-paths", "rlimits",
                           "no-new-privs", "capabilities", "env-cleared", "seccomp"],
                "inactive": {"cgroup": "no delegated cgroup v2 directory configured"}
            },
            "device": {"name": "NVIDIA H200", "arch": "sm_90", "uuid": "GPU-58ca"},
            "kernels": [{"name": "softmax", "registers": 32}],
            "gpu": {"available": true, "interval_ms": 5.0,
                    "summary": {"samples": 40, "sm_mhz": {"min": 1980, "median": 1980, "max": 1980},
                                "mem_mhz": {"min": 3201, "median": 3201, "max": 3201},
                                "reasons_seen": [], "throttled_samples": 0,
                                "power_w_avg": 121.4, "power_w_max": 124.0, "temp_c_max": 37},
                    "series": {"t_ms": [0.0, 5.0]},
                    "timing_samples": 68, "throttled_timing_samples": 0,
                    "throttle_policy": "report", "clock_policy": "observe"},
            "lane": 0,
            "worker": {"evaluations_served": 3, "retired": false, "warm": true}
        }));
        let want = [
            (
                "jail",
                "namespaces user, mount, network, ipc, pid; seccomp on; cgroup off (no \
                 delegated cgroup v2 directory configured)",
            ),
            (
                "",
                "also on: fds-closed, parent-death-signal, private-root, hidden-paths, rlimits, \
                 no-new-privs, capabilities, env-cleared",
            ),
            ("device", "NVIDIA H200  sm_90  GPU-58ca"),
            (
                "gpu",
                "SM 1980 MHz; memory 3201 MHz; power 121 W avg, 124 W max; 37 °C max; \
                 0 of 68 timing samples throttled; policy: throttle report, clock observe",
            ),
            ("lane", "0"),
            ("worker", "warm: evaluation 3 on this worker"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        assert_eq!(l, want);
        assert_eq!(
            worker(&json!({"evaluations_served": 1, "warm": false, "retired": true})),
            "fresh: evaluation 1 on this worker; retired after it"
        );
    }

    #[test]
    fn a_jail_that_failed_reads_as_such() {
        let jail = lines(&json!({"jail": {"active": [], "inactive": {"jail": "clone failed"}}}));
        assert_eq!(jail[0].1, "jail off (clone failed)");
    }
}
