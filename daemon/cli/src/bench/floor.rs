//! The timer floor of `kiln bench agreement`: what each timer reads for a kernel that does
//! nothing.
//!
//! An empty kernel (`kiln_timer_floor<<<1, 1>>>`, no parameters, no memory touched) has no
//! work of its own, so whatever a timer reads for it is that timer's own cost of marking
//! a kernel's start and end. On the H200 (2026-12-01) CUPTI's kernel record of it read
//! 0.64 µs, Nsight Compute's `gpu__time_duration` 1.47 µs (`--cache-control all`), while the
//! SMs were active for 248 cycles (0.13 µs): ncu adds about 0.8 µs to every kernel it
//! profiles that CUPTI's records do not. For kernels of a few microseconds that alone is
//! more than the 0.3 µs the agreement allows. So the bench times the empty kernel under
//! both (ncu through `kiln-worker launch`, kiln through `kiln-worker launch --time`, which
//! takes kiln's own samples), and compares kiln with ncu less the difference of the two
//! floors, once per launch of the launch list. The kernels' own time, including how they
//! meet a cold L2, is what is left to agree. docs/benchmarks.md ("The timer floor") has
//! the measurements.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use kiln_sandbox::engine::cuda::launch_timing::LaunchTiming;
use kiln_sandbox::engine::cuda::launcher::Launched;
use serde_json::Value;

/// The empty kernel's name (also what ncu's kernel filter selects), and its problem (never
/// registered with kilnd).
pub use kiln_sandbox::engine::cuda::launch_timing::{FLOOR_KERNEL as KERNEL, floor_spec as spec};

/// A floor difference larger than this (µs per launch, either way) is not applied: no
/// timer costs that much on a kernel that does nothing, so something else went wrong.
pub const MAX_PER_LAUNCH_US: f64 = 5.0;

/// Both timers' reading of the empty kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct Floor {
    /// ncu's median, µs.
    pub ncu_us: f64,
    /// ncu's runs, µs.
    pub ncu_runs_us: Vec<f64>,
    /// kiln's own samples of it.
    pub kiln: LaunchTiming,
}

impl Floor {
    /// How much more ncu reads than kiln's `figure` from `source` (`cupti`, `events`) for
    /// one launch of no work, µs; or why it cannot be used.
    pub fn per_launch_us(&self, figure: &str, source: &str) -> Result<f64, String> {
        if self.kiln.source != source {
            return Err(format!(
                "kiln timed the empty kernel from {}, the problem from {source}{}",
                self.kiln.source,
                self.kiln
                    .fallback
                    .as_deref()
                    .map(|f| format!(" ({f})"))
                    .unwrap_or_default()
            ));
        }
        let kiln_us = self
            .kiln
            .figure_us(figure)
            .ok_or_else(|| format!("kiln's samples of the empty kernel have no {figure}"))?;
        let d = self.ncu_us - kiln_us;
        if !d.is_finite() || d.abs() > MAX_PER_LAUNCH_US {
            return Err(format!(
                "implausible floor difference {d:.3} µs (ncu {:.3} µs, kiln {kiln_us:.3} µs)",
                self.ncu_us
            ));
        }
        Ok(d)
    }
}

/// ncu's figure of a launch list of `launches` kernels less the floor difference
/// `per_launch_us` for each: the figure to compare kiln's with.
pub fn net_ncu_us(ncu_us: f64, launches: usize, per_launch_us: f64) -> f64 {
    ncu_us - launches as f64 * per_launch_us
}

/// kiln's own samples of `spec`'s seed: `launcher launch --time` (no profiler attached),
/// `runs` samples after one warm-up, on the GPU `gpu_uuid` names.
pub async fn kiln_samples(
    launcher: &Path,
    spec: &Value,
    runs: u32,
    gpu_uuid: Option<&str>,
    timeout: Duration,
) -> Result<LaunchTiming> {
    let dir = tempfile::tempdir().context("a temporary directory for the timer floor")?;
    let spec_path = dir.path().join("floor.json");
    std::fs::write(&spec_path, serde_json::to_vec(spec)?).context("writing the floor spec")?;
    let runs = runs.to_string();
    let out = super::agreement::run_launcher(
        launcher,
        &[
            "launch".as_ref(),
            "--spec".as_ref(),
            spec_path.as_os_str(),
            "--runs".as_ref(),
            runs.as_ref(),
            "--warmup".as_ref(),
            "1".as_ref(),
            "--time".as_ref(),
        ],
        gpu_uuid,
        timeout,
        "timing the empty kernel",
    )
    .await?;
    timing_of(&String::from_utf8_lossy(&out.stdout))
}

/// The timing in the launcher's JSON line (its last line on stdout).
pub fn timing_of(stdout: &str) -> Result<LaunchTiming> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("the launcher printed no JSON line")?;
    let launched: Launched =
        serde_json::from_str(line).context("the launcher's JSON line does not parse")?;
    launched
        .timing
        .context("the launcher's JSON line has no timing (an older kiln-worker without --time?)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(source: &str, span: Option<f64>, events: f64) -> LaunchTiming {
        LaunchTiming {
            source: source.into(),
            fallback: (source == "events").then(|| "turned off".to_string()),
            samples: 20,
            events_us: events,
            kernel_sum_us: span,
            kernel_span_us: span,
            records_missing: 0,
        }
    }

    #[test]
    fn the_floor_difference_is_taken_once_per_launch() {
        // The H200's readings: ncu 1.472 µs, CUPTI 0.640 µs for the empty kernel.
        let floor = Floor {
            ncu_us: 1.472,
            ncu_runs_us: vec![1.472],
            kiln: timing("cupti", Some(0.640), 3.072),
        };
        let d = floor.per_launch_us("kernel_span", "cupti").expect("usable");
        assert!((d - 0.832).abs() < 1e-9, "{d}");
        // vecadd: ncu 5.856 µs less one floor is 5.024 µs; kiln read 5.152 µs.
        assert!((net_ncu_us(5.856, 1, d) - 5.024).abs() < 1e-9);
        // Three launches pay it three times.
        assert!((net_ncu_us(502.0, 3, d) - (502.0 - 2.496)).abs() < 1e-9);
        // Events: kiln's floor is above ncu's, so ncu's figure goes up.
        let by_events = floor.per_launch_us("events", "cupti").expect("usable");
        assert!((by_events + 1.6).abs() < 1e-9, "{by_events}");
    }

    #[test]
    fn a_floor_from_another_source_or_implausible_is_not_used() {
        let floor = Floor {
            ncu_us: 1.472,
            ncu_runs_us: vec![],
            kiln: timing("events", None, 3.072),
        };
        let e = floor
            .per_launch_us("kernel_span", "cupti")
            .expect_err("sources differ");
        assert!(e.contains("from events") && e.contains("turned off"), "{e}");
        let e = floor
            .per_launch_us("kernel_span", "events")
            .expect_err("no span");
        assert!(e.contains("kernel_span"), "{e}");
        let far = Floor {
            ncu_us: 40.0,
            ncu_runs_us: vec![],
            kiln: timing("cupti", Some(0.6), 3.0),
        };
        let e = far
            .per_launch_us("kernel_span", "cupti")
            .expect_err("implausible");
        assert!(e.contains("implausible"), "{e}");
        let nan = Floor {
            ncu_us: f64::NAN,
            ..far
        };
        assert!(nan.per_launch_us("kernel_span", "cupti").is_err());
    }

    /// A stand-in launcher: a shell script that notes its arguments and the GPU it was
    /// given, then runs `body`.
    fn fake_launcher(dir: &Path, body: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("kiln-worker");
        let script = format!(
            "#!/bin/sh\necho \"$@\" > '{}'\nprintf '%s\\n' \"$CUDA_VISIBLE_DEVICES\" >> '{}'\n{body}\n",
            dir.join("args").display(),
            dir.join("args").display()
        );
        std::fs::write(&path, script).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    #[tokio::test]
    async fn kiln_samples_run_the_launcher_with_time_and_read_its_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let line = r#"{"problem":"kiln-timer-floor","which":"seed","kernels":["kiln_timer_floor"],"warmup":1,"runs":7,"device":"d","timing":{"source":"cupti","samples":7,"events_us":3.0,"kernel_sum_us":0.6,"kernel_span_us":0.6,"records_missing":0}}"#;
        let launcher = fake_launcher(dir.path(), &format!("echo '{line}'"));
        let t = kiln_samples(
            &launcher,
            &spec(),
            7,
            Some("GPU-1"),
            Duration::from_secs(30),
        )
        .await
        .expect("timed");
        assert_eq!((t.samples, t.kernel_span_us), (7, Some(0.6)));
        let args = std::fs::read_to_string(dir.path().join("args")).expect("args");
        let first = args.lines().next().expect("a line");
        assert!(first.starts_with("launch --spec "), "{first}");
        assert!(first.ends_with("--runs 7 --warmup 1 --time"), "{first}");
        assert_eq!(args.lines().nth(1), Some("GPU-1"), "the GPU it was given");
        // A launcher that fails says so, with its error.
        let failing = fake_launcher(dir.path(), "echo 'no GPU here' >&2; exit 1");
        let e = kiln_samples(&failing, &spec(), 7, None, Duration::from_secs(30))
            .await
            .expect_err("fails");
        assert!(format!("{e:#}").contains("no GPU here"), "{e:#}");
    }

    #[test]
    fn the_launchers_json_line_carries_the_timing() {
        let line = r#"{"problem":"kiln-timer-floor","which":"seed","kernels":["kiln_timer_floor"],"warmup":1,"runs":20,"device":"NVIDIA H200","timing":{"source":"cupti","samples":20,"events_us":3.07,"kernel_sum_us":0.64,"kernel_span_us":0.64,"records_missing":0}}"#;
        let t = timing_of(&format!("some log line\n{line}\n")).expect("timing");
        assert_eq!(t.kernel_span_us, Some(0.64));
        assert_eq!(t.source, "cupti");
        let old =
            r#"{"problem":"p","which":"seed","kernels":["k"],"warmup":1,"runs":2,"device":"d"}"#;
        let e = timing_of(old).expect_err("no timing");
        assert!(format!("{e:#}").contains("no timing"), "{e:#}");
        assert!(timing_of("nothing\n").is_err());
        assert!(timing_of("{not json\n").is_err());
    }
}
