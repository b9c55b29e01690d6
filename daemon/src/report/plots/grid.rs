//! One MAP-Elites island as a heat map: the first descriptor across, the others (joined)
//! down, each occupied cell coloured by its elite's median time on a log scale shared by
//! every island (viridis: dark is fast), with the time written in it; the search's best
//! is outlined. A colour bar on the right gives the scale.

use plotters::prelude::*;
use plotters::style::colors::colormaps::{ColorMap, ViridisRGB};

use super::{Plot, log_ticks, svg};
use crate::report::style::{self, fmt_tick, fmt_us};
use kiln_types::summary::Grid;

/// Most columns and rows drawn (a grid larger than this is listed, not drawn).
pub const MAX_BINS: (usize, usize) = (40, 80);

/// The bins along each side of `grid` (over every island, so the islands line up): the
/// first descriptor's values across, the rest joined down. Sorted value by value, by each
/// value's first number and then as text (`<=32` before `<=64`, `16` before `128`).
pub fn axes(grid: &Grid) -> (Vec<String>, Vec<String>) {
    let mut xs: Vec<String> = Vec::new();
    let mut ys: Vec<String> = Vec::new();
    for c in &grid.cells {
        let (x, y) = split(&c.bins);
        if !xs.contains(&x) {
            xs.push(x);
        }
        if !ys.contains(&y) {
            ys.push(y);
        }
    }
    let order = |a: &String, b: &String| {
        let key = |s: &str| -> Vec<(f64, String)> { s.split(SEP).map(natural).collect() };
        key(a)
            .partial_cmp(&key(b))
            .unwrap_or(std::cmp::Ordering::Equal)
    };
    xs.sort_by(order);
    ys.sort_by(order);
    (xs, ys)
}

/// Between the values of a row's label.
const SEP: &str = ", ";

fn split(bins: &[String]) -> (String, String) {
    let x = bins.first().cloned().unwrap_or_else(|| "-".into());
    let y = if bins.len() > 1 {
        bins[1..].join(SEP)
    } else {
        "all".into()
    };
    (x, y)
}

fn natural(s: &str) -> (f64, String) {
    let digits: String = s
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut n = digits.parse::<f64>().unwrap_or(f64::MAX);
    if s.ends_with('K') {
        n *= 1024.0;
    }
    (n, s.to_string())
}

/// The heat map of `island`; `range` is the (min, max) median over all islands, `best`
/// the search's best id.
pub fn plot(grid: &Grid, island: u32, range: (f64, f64), best: Option<&str>) -> Plot {
    let (xs, ys) = axes(grid);
    if xs.len() > MAX_BINS.0 || ys.len() > MAX_BINS.1 {
        return Err(format!(
            "{} × {} bins is too many to draw; the cells are listed below",
            xs.len(),
            ys.len()
        ));
    }
    let cells: Vec<(usize, usize, f64, bool)> = grid
        .cells
        .iter()
        .filter(|c| c.island == island && c.median_us.is_finite() && c.median_us > 0.0)
        .filter_map(|c| {
            let (x, y) = split(&c.bins);
            Some((
                xs.iter().position(|v| *v == x)?,
                // The first row at the top (the y axis runs upwards).
                ys.len() - 1 - ys.iter().position(|v| *v == y)?,
                c.median_us,
                best == Some(c.id.as_str()),
            ))
        })
        .collect();
    let (lo, hi) = (range.0.ln(), range.1.ln().max(range.0.ln() + 1e-9));
    let color = |us: f64| ViridisRGB.get_color_normalized(us.ln() as f32, lo as f32, hi as f32);
    let (nx, ny) = (xs.len() as i32, ys.len() as i32);
    let y_label_width = ys.iter().map(|y| y.chars().count()).max().unwrap_or(4) as u32 * 8 + 30;
    let width = (y_label_width + 110 * nx as u32 + 130).clamp(380, 1060);
    let height = (100 + 44 * ny as u32).max(180);
    let x_desc = grid.descriptors.first().cloned().unwrap_or_default();
    let y_desc = if grid.descriptors.len() > 1 {
        grid.descriptors[1..].join(", ")
    } else {
        String::new()
    };
    let ys_up: Vec<String> = ys.iter().rev().cloned().collect();
    svg(width, height, |root| {
        let (main, bar) = root.split_horizontally(width - 110);
        let mut chart = ChartBuilder::on(&main)
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(y_label_width)
            .build_cartesian_2d((0..nx).into_segmented(), (0..ny).into_segmented())?;
        let label = |axis: &[String], v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => usize::try_from(*i)
                .ok()
                .and_then(|i| axis.get(i))
                .cloned()
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        };
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc(x_desc.as_str())
            .y_desc(y_desc.as_str())
            .x_labels(xs.len())
            .y_labels(ys.len())
            .x_label_formatter(&|v| label(&xs, v))
            .y_label_formatter(&|v| label(&ys_up, v))
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .draw()?;
        chart.draw_series(cells.iter().map(|&(x, y, us, _)| {
            Rectangle::new(
                [
                    (SegmentValue::Exact(x as i32), SegmentValue::Exact(y as i32)),
                    (
                        SegmentValue::Exact(x as i32 + 1),
                        SegmentValue::Exact(y as i32 + 1),
                    ),
                ],
                color(us).filled(),
            )
        }))?;
        chart.draw_series(cells.iter().filter(|c| c.3).map(|&(x, y, _, _)| {
            Rectangle::new(
                [
                    (SegmentValue::Exact(x as i32), SegmentValue::Exact(y as i32)),
                    (
                        SegmentValue::Exact(x as i32 + 1),
                        SegmentValue::Exact(y as i32 + 1),
                    ),
                ],
                style::FLOOR.stroke_width(3),
            )
        }))?;
        chart.draw_series(cells.iter().map(|&(x, y, us, _)| {
            let dark = (us.ln() - lo) / (hi - lo) < 0.6;
            let ink = if dark { WHITE } else { BLACK };
            Text::new(
                fmt_us(us),
                (
                    SegmentValue::CenterOf(x as i32),
                    SegmentValue::CenterOf(y as i32),
                ),
                ("sans-serif", 14).into_font().color(&ink).pos(
                    plotters::style::text_anchor::Pos::new(
                        plotters::style::text_anchor::HPos::Center,
                        plotters::style::text_anchor::VPos::Center,
                    ),
                ),
            )
        }))?;
        // The colour bar.
        let top = range.1.max(range.0 * 1.001);
        let mut scale = ChartBuilder::on(&bar)
            .margin_top(10)
            .margin_bottom(40)
            .margin_right(10)
            .y_label_area_size(70)
            .build_cartesian_2d(
                0.0..1.0,
                (range.0..top)
                    .log_scale()
                    .with_key_points(log_ticks(range.0, top)),
            )?;
        scale
            .configure_mesh()
            .disable_mesh()
            .disable_x_axis()
            .y_label_formatter(&|v| fmt_tick(*v))
            .label_style(("sans-serif", 14))
            .draw()?;
        let steps = 40;
        scale.draw_series((0..steps).map(|i| {
            let a = (lo + (hi - lo) * f64::from(i) / f64::from(steps)).exp();
            let b = (lo + (hi - lo) * f64::from(i + 1) / f64::from(steps)).exp();
            Rectangle::new([(0.0, a), (1.0, b)], color((a * b).sqrt()).filled())
        }))?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::summary;

    #[test]
    fn one_cell_per_elite_of_the_island_and_bins_in_order() {
        let grid = summary(1).grid.expect("grid");
        let (xs, ys) = axes(&grid);
        assert_eq!(xs, ["16", "32", "64"]);
        assert_eq!(ys, ["1", "2"]);
        let rows = Grid {
            descriptors: vec!["ACC_T".into(), "EXP".into(), "UNROLL".into()],
            source: "knobs".into(),
            cells: [
                ["float", "expf", "8"],
                ["float", "exp", "8"],
                ["double", "expf", "1"],
                ["float", "exp", "1"],
            ]
            .iter()
            .map(|b| kiln_types::summary::Cell {
                island: 0,
                bins: b.iter().map(|s| s.to_string()).collect(),
                id: "x".into(),
                median_us: 1.0,
            })
            .collect(),
        };
        assert_eq!(axes(&rows).1, ["exp, 1", "exp, 8", "expf, 1", "expf, 8"]);
        for island in [0, 1] {
            let s = plot(&grid, island, (10.0, 30.0), Some("c1")).expect("plot");
            let elites = grid.cells.iter().filter(|c| c.island == island).count();
            for c in grid.cells.iter().filter(|c| c.island == island) {
                assert!(s.contains(&fmt_us(c.median_us)), "{c:?}");
            }
            // One text per elite, plus the axis labels: at least as many as the elites.
            assert!(s.matches("<text").count() >= elites + xs.len() + ys.len());
        }
        let mut big = grid.clone();
        for i in 0..50 {
            let mut c = big.cells[0].clone();
            c.bins[0] = format!("v{i}");
            big.cells.push(c);
        }
        assert!(plot(&big, 0, (10.0, 30.0), None).is_err());
        assert!(natural("<=32") < natural("<=128"));
        assert!(natural("<=16K") > natural("0"));
    }
}
