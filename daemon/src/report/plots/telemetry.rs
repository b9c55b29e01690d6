//! The GPU over a candidate's timing window: SM clock (throttled readings marked) and
//! board power, from the `series` a cuda evaluation's telemetry carries
//! (`telemetry.gpu.series`: columns `t_ms`, `sm_mhz`, `power_w`, `throttled`).

use plotters::prelude::*;
use serde_json::Value;

use super::{Plot, svg};
use crate::report::style;

/// Width and height of the plot, pixels.
pub const SIZE: (u32, u32) = (960, 420);

/// Most readings read from an evaluation (the worker keeps 128).
pub const MAX_READINGS: usize = 4096;

/// The readings of one timing window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Time since sampling started, ms.
    pub t_ms: Vec<f64>,
    /// SM clock, MHz.
    pub sm_mhz: Vec<Option<f64>>,
    /// Board power, W.
    pub power_w: Vec<Option<f64>>,
    /// Whether the reading showed a throttling reason.
    pub throttled: Vec<bool>,
}

/// The series in an evaluation's telemetry, if it has one with at least one reading.
pub fn series(telemetry: Option<&Value>) -> Option<Series> {
    let s = telemetry?.get("gpu")?.get("series")?;
    let col = |k: &str| -> Vec<Value> {
        s.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().take(MAX_READINGS).cloned().collect())
            .unwrap_or_default()
    };
    let t_ms: Vec<f64> = col("t_ms")
        .iter()
        .map(|v| v.as_f64().unwrap_or(f64::NAN))
        .collect();
    if t_ms.is_empty() {
        return None;
    }
    let n = t_ms.len();
    let fill = |k: &str| -> Vec<Option<f64>> {
        let mut v: Vec<Option<f64>> = col(k).iter().map(Value::as_f64).collect();
        v.resize(n, None);
        v
    };
    let mut throttled: Vec<bool> = col("throttled")
        .iter()
        .map(|v| v == &Value::Bool(true))
        .collect();
    throttled.resize(n, false);
    Some(Series {
        sm_mhz: fill("sm_mhz"),
        power_w: fill("power_w"),
        throttled,
        t_ms,
    })
}

fn range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if lo > hi {
        return None;
    }
    let pad = ((hi - lo) * 0.1).max(hi.abs() * 0.02).max(1.0);
    Some(((lo - pad).max(0.0), hi + pad))
}

/// The two panels; `Err` when neither clock nor power was read.
pub fn plot(s: &Series) -> Plot {
    let t_max = s
        .t_ms
        .iter()
        .copied()
        .filter(|t| t.is_finite())
        .fold(0.0, f64::max)
        .max(1.0);
    let clock = range(s.sm_mhz.iter().flatten().copied());
    let power = range(s.power_w.iter().flatten().copied());
    if clock.is_none() && power.is_none() {
        return Err("NVML reported neither SM clock nor power".into());
    }
    svg(SIZE.0, SIZE.1, |root| {
        let (top, bottom) = root.split_vertically(SIZE.1 / 2);
        let panels = [
            (top, clock, &s.sm_mhz, "SM clock (MHz)", style::BEST),
            (
                bottom,
                power,
                &s.power_w,
                "board power (W)",
                style::baseline_color(1),
            ),
        ];
        for (i, (area, r, values, name, color)) in panels.into_iter().enumerate() {
            let Some((lo, hi)) = r else { continue };
            let mut chart = ChartBuilder::on(&area)
                .margin(10)
                .x_label_area_size(34)
                .y_label_area_size(70)
                .build_cartesian_2d(0.0..t_max, lo..hi)?;
            chart
                .configure_mesh()
                .x_desc(if i == 1 {
                    "time in the timing window (ms)"
                } else {
                    ""
                })
                .y_desc(name)
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&|v| format!("{v:.0}"))
                .light_line_style(RGBColor(0xee, 0xee, 0xee))
                .label_style(("sans-serif", 15))
                .axis_desc_style(("sans-serif", 16))
                .draw()?;
            let pts: Vec<(f64, f64)> = s
                .t_ms
                .iter()
                .zip(values.iter())
                .filter_map(|(t, v)| Some((*t, (*v)?)))
                .filter(|(t, _)| t.is_finite())
                .collect();
            chart.draw_series(LineSeries::new(pts, color.stroke_width(2)))?;
            if i == 0 {
                chart.draw_series(
                    s.t_ms
                        .iter()
                        .zip(values.iter())
                        .zip(&s.throttled)
                        .filter(|(_, th)| **th)
                        .filter_map(|((t, v), _)| Some((*t, (*v)?)))
                        .map(|c| Cross::new(c, 5, style::FLOOR.stroke_width(2))),
                )?;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_series_and_marks_throttled_readings() {
        let tel = serde_json::json!({"gpu": {"series": {
            "t_ms": [0.0, 5.0, 10.0, 15.0],
            "sm_mhz": [1980, 1980, 1755, null],
            "power_w": [140.5, 150.0, 160.0, 155.0],
            "throttled": [false, false, true, null]
        }}});
        let s = series(Some(&tel)).expect("series");
        assert_eq!(s.t_ms.len(), 4);
        assert_eq!(s.sm_mhz[3], None);
        assert_eq!(s.throttled, [false, false, true, false]);
        let svg = plot(&s).expect("plot");
        assert!(svg.contains("SM clock (MHz)") && svg.contains("board power (W)"));
        // The one throttled reading is a cross: two lines in the floor colour.
        let red = format!("stroke=\"{}\"", style::css(style::FLOOR).to_uppercase());
        assert_eq!(svg.matches(&red).count(), 2, "{svg}");
        assert_eq!(
            series(Some(&serde_json::json!({"gpu": {"available": false}}))),
            None
        );
        assert_eq!(series(None), None);
        let empty = Series {
            t_ms: vec![0.0],
            sm_mhz: vec![None],
            power_w: vec![None],
            throttled: vec![false],
        };
        assert!(plot(&empty).is_err());
    }
}
