//! A candidate's timing samples as a histogram, with its median marked.

use plotters::prelude::*;

use super::{Plot, legend, svg};
use crate::report::style::{self, fmt_tick, fmt_us};

/// Width and height of the plot, pixels.
pub const SIZE: (u32, u32) = (960, 340);

/// Bin counts of `samples` over `[lo, hi)` (the last bin closed): about √n bins, 5 to 60.
pub fn bins(samples: &[f64]) -> Option<(f64, f64, Vec<usize>)> {
    let finite: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    let lo = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if finite.is_empty() {
        return None;
    }
    let (lo, hi) = if hi > lo {
        (lo, hi)
    } else {
        let pad = (lo.abs() * 0.01).max(1e-3);
        (lo - pad, hi + pad)
    };
    let k = ((finite.len() as f64).sqrt().round() as usize).clamp(5, 60);
    let mut counts = vec![0usize; k];
    for v in finite {
        let i = (((v - lo) / (hi - lo)) * k as f64).floor() as usize;
        counts[i.min(k - 1)] += 1;
    }
    Some((lo, hi, counts))
}

/// The histogram; `Err` when there are no samples.
pub fn plot(samples: &[f64], median_us: f64) -> Plot {
    let (lo, hi, counts) = bins(samples).ok_or("no timing samples were kept")?;
    let k = counts.len();
    let width = (hi - lo) / k as f64;
    let top = counts.iter().copied().max().unwrap_or(1) as f64 * 1.1 + 1.0;
    svg(SIZE.0, SIZE.1, |root| {
        let mut chart = ChartBuilder::on(root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(lo..hi, 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc("sample time")
            .y_desc("samples")
            .x_label_formatter(&|v| fmt_tick(*v))
            .y_label_formatter(&|v| format!("{v:.0}"))
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 17))
            .draw()?;
        chart.draw_series(
            counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(i, c)| {
                    let a = lo + width * i as f64;
                    Rectangle::new(
                        [(a, 0.0), (a + width, *c as f64)],
                        style::BEST.mix(0.7).filled(),
                    )
                }),
        )?;
        if median_us.is_finite() && median_us >= lo && median_us <= hi {
            chart
                .draw_series(LineSeries::new(
                    vec![(median_us, 0.0), (median_us, top)],
                    style::FLOOR.stroke_width(2),
                ))?
                .label(format!("median {}", fmt_us(median_us)))
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], style::FLOOR.stroke_width(2))
                });
            legend(&mut chart)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_and_one_bar_per_busy_bin() {
        let samples: Vec<f64> = (0..100).map(|i| 10.0 + f64::from(i % 10)).collect();
        let (lo, hi, counts) = bins(&samples).expect("bins");
        assert_eq!((lo, hi, counts.len()), (10.0, 19.0, 10));
        assert_eq!(counts.iter().sum::<usize>(), 100);
        let s = plot(&samples, 14.5).expect("plot");
        let bar = format!("fill=\"{}\"", style::css(style::BEST).to_uppercase());
        assert_eq!(s.matches(&bar).count(), 10);
        assert!(s.contains("median 14.5 µs"));
        assert_eq!(
            bins(&[3.0, 3.0]).map(|b| b.2.iter().sum::<usize>()),
            Some(2)
        );
        assert!(plot(&[], 1.0).is_err());
    }
}
