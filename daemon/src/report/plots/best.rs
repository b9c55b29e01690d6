//! Best time so far over evaluations or over wall time: every timed evaluation as a point
//! (colour: ok, raced out or plain; shape: precision tier), the best-so-far as a step
//! line, and reference lines (the seed, each baseline, the roofline floors) across.

use plotters::prelude::*;

use super::{Plot, legend, log_range, log_ticks, marker, svg};
use crate::report::points::{Point, best_steps};
use crate::report::style::{self, Marker, fmt_secs, fmt_tick, fmt_us};

/// Which x axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// Evaluations, in the order they finished.
    Evaluations,
    /// Seconds since the search started.
    WallTime,
}

/// A horizontal reference line.
#[derive(Debug, Clone, PartialEq)]
pub struct RefLine {
    /// Its legend label.
    pub label: String,
    /// Its time, µs.
    pub us: f64,
    /// Its colour.
    pub color: RGBColor,
    /// Dashed (the roofline floors) or solid.
    pub dashed: bool,
}

/// Width and height of the plot, pixels.
pub const SIZE: (u32, u32) = (960, 400);

/// The plot; `Err` when no evaluation was timed yet.
pub fn plot(points: &[Point], lines: &[RefLine], axis: Axis) -> Plot {
    let x = |p: &Point| match axis {
        Axis::Evaluations => p.order as f64,
        Axis::WallTime => p.wall_s,
    };
    let timed: Vec<&Point> = points.iter().filter(|p| p.median_us.is_some()).collect();
    let (lo, hi) = log_range(
        timed
            .iter()
            .filter_map(|p| p.median_us)
            .chain(lines.iter().map(|l| l.us)),
    )
    .ok_or("no evaluation was timed yet")?;
    if timed.is_empty() {
        return Err("no evaluation was timed yet".into());
    }
    let x_max = match axis {
        Axis::Evaluations => points.len() as f64 + 1.0,
        Axis::WallTime => points.iter().map(|p| p.wall_s).fold(0.0, f64::max) * 1.04 + 0.5,
    };
    let steps = best_steps(points, x);
    svg(SIZE.0, SIZE.1, |root| {
        let mut chart = ChartBuilder::on(root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(
                0.0..x_max,
                (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
            )?;
        chart
            .configure_mesh()
            .x_desc(match axis {
                Axis::Evaluations => "evaluations (in the order they finished)",
                Axis::WallTime => "wall time since the search started",
            })
            .y_desc("median time (log scale)")
            .x_label_formatter(&|v| match axis {
                Axis::Evaluations => format!("{v:.0}"),
                Axis::WallTime => fmt_secs(*v),
            })
            .y_label_formatter(&|v| fmt_tick(*v))
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 17))
            .draw()?;
        for l in lines {
            let pts = vec![(0.0, l.us), (x_max, l.us)];
            let style = l.color.stroke_width(2);
            let label = format!("{} {}", l.label, fmt_us(l.us));
            let color = l.color;
            let anno = if l.dashed {
                chart.draw_series(DashedLineSeries::new(pts, 8, 5, style))?
            } else {
                chart.draw_series(LineSeries::new(pts, style))?
            };
            anno.label(label).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
        chart.draw_series(timed.iter().filter_map(|p| {
            let m = p.median_us?;
            Some(marker((x(p), m), Marker::of(p.tier), p.class))
        }))?;
        if let Some(&(_, last_us, _)) = steps.last() {
            let mut path: Vec<(f64, f64)> = Vec::new();
            for (i, &(sx, us, _)) in steps.iter().enumerate() {
                if i > 0 {
                    path.push((sx, steps[i - 1].1));
                }
                path.push((sx, us));
            }
            path.push((x_max, last_us));
            chart
                .draw_series(LineSeries::new(path, style::BEST.stroke_width(3)))?
                .label(format!("best so far {}", fmt_us(last_us)))
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], style::BEST.stroke_width(3))
                });
        }
        legend(&mut chart)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::timeline;
    use crate::report::points::points;

    #[test]
    fn one_marker_per_timed_point_and_one_line_per_reference() {
        let pts = points(&timeline(40), 1000);
        let timed = pts.iter().filter(|p| p.median_us.is_some()).count();
        let lines = vec![
            RefLine {
                label: "torch-compile".into(),
                us: 20.0,
                color: style::baseline_color(0),
                dashed: false,
            },
            RefLine {
                label: "roofline floor".into(),
                us: 2.0,
                color: style::FLOOR,
                dashed: true,
            },
        ];
        for axis in [Axis::Evaluations, Axis::WallTime] {
            let s = plot(&pts, &lines, axis).expect("plot");
            let markers = s.matches("<circle").count()
                + s.matches("<polygon").count()
                + s.matches("<rect").count()
                + s.matches("<polyline").count();
            assert!(
                markers >= timed,
                "{markers} shapes for {timed} timed points"
            );
            assert!(
                s.contains("torch-compile 20.0 µs"),
                "baseline in the legend"
            );
            assert!(s.contains("roofline floor 2.00 µs"));
            assert!(s.contains("best so far"));
        }
        assert!(plot(&[], &lines, Axis::Evaluations).is_err());
    }
}
