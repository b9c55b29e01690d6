//! Every finished evaluation as a point in its class's row (ok, raced out, plain, each
//! failing verdict, not evaluated), over the order evaluations finished: where the
//! failures came, at a glance. Shape is the precision tier, as in the time plots.

use plotters::prelude::*;

use super::{Plot, marker, svg};
use crate::report::points::Point;
use crate::report::style::{Class, Marker};

/// Width of the plot, pixels (the height grows with the rows).
pub const WIDTH: u32 = 960;

/// The plot; `Err` when nothing finished yet.
pub fn plot(points: &[Point]) -> Plot {
    let mut rows: Vec<Class> = points.iter().map(|p| p.class).collect();
    rows.sort();
    rows.dedup();
    if rows.is_empty() {
        return Err("no evaluation finished yet".into());
    }
    // Top row first: ok at the top.
    rows.reverse();
    let n = rows.len() as i32;
    let height = 70 + 30 * n as u32;
    let x_max = points.len() as f64 + 1.0;
    let labels: Vec<String> = rows.iter().map(|c| c.label()).collect();
    svg(WIDTH, height, |root| {
        let mut chart = ChartBuilder::on(root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(190)
            .build_cartesian_2d(0.0..x_max, (0..n).into_segmented())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("evaluations (in the order they finished)")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_labels(rows.len())
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => usize::try_from(*i)
                    .ok()
                    .and_then(|i| labels.get(i))
                    .cloned()
                    .unwrap_or_default(),
                SegmentValue::Last => String::new(),
            })
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 17))
            .draw()?;
        chart.draw_series(points.iter().filter_map(|p| {
            let row = rows.iter().position(|c| *c == p.class)? as i32;
            Some(marker(
                (p.order as f64, SegmentValue::CenterOf(row)),
                Marker::of(p.tier),
                p.class,
            ))
        }))?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::timeline;
    use crate::report::points::points;
    use crate::report::style::css;
    use kiln_types::Verdict;

    #[test]
    fn every_finished_evaluation_is_a_point_in_its_row() {
        let pts = points(&timeline(50), 1000);
        let s = plot(&pts).expect("plot");
        for class in [Class::Failed(Verdict::WrongAnswer), Class::NotEvaluated] {
            let want = pts.iter().filter(|p| p.class == class).count();
            let fill = format!("fill=\"{}\"", css(class.color()).to_uppercase());
            assert_eq!(s.matches(&fill).count(), want, "{}", class.label());
            assert!(s.contains(&class.label()), "row label");
        }
        assert!(plot(&[]).is_err());
    }
}
