//! The plots, one per file, each drawn with plotters' SVG backend into a string that the
//! page inlines. The browser renders the text (plotters only estimates its size), so no
//! font is embedded or fetched.
//!
//! - [`best`]: best time over evaluations or wall time, every timed evaluation as a point,
//!   with the seed, baselines and roofline floors as lines;
//! - [`verdicts`]: every finished evaluation as a point in its verdict's row;
//! - [`grid`]: one MAP-Elites island as a heat map;
//! - [`histogram`]: a candidate's timing samples;
//! - [`telemetry`]: SM clock and power over a candidate's timing window.

pub mod best;
pub mod grid;
pub mod histogram;
pub mod telemetry;
pub mod verdicts;

use plotters::coord::Shift;
use plotters::element::ComposedElement;
use plotters::prelude::*;

use super::style::{Class, Marker};

/// What a plot function returns: the SVG, or why it could not be drawn.
pub type Plot = Result<String, String>;

/// A drawing closure's result (plotters' errors are boxed).
pub type Drawn = Result<(), Box<dyn std::error::Error>>;

/// Draws an SVG of `w`×`h` pixels with `draw`, and returns it without the XML namespace
/// attribute (inline SVG in HTML needs none, so the page holds no URL at all).
pub fn svg(
    w: u32,
    h: u32,
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Drawn,
) -> Plot {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        draw(&root).map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(buf.replace(" xmlns=\"http://www.w3.org/2000/svg\"", ""))
}

/// Draws the legend of `chart`'s labelled series in its upper right corner.
pub fn legend<'a, DB, CT>(chart: &mut ChartContext<'a, DB, CT>) -> Drawn
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: plotters::coord::CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(0xbb, 0xbb, 0xbb))
        .label_font(("sans-serif", 16))
        .draw()?;
    Ok(())
}

/// A log-scale range around `values` (a little room on both sides); `None` when there is
/// no positive finite value.
pub fn log_range(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if hi <= 0.0 {
        return None;
    }
    if hi / lo < 1.5 {
        let mid = (hi * lo).sqrt();
        return Some((mid / 1.5, mid * 1.5));
    }
    Some((lo / 1.25, hi * 1.25))
}

/// Tick values for a log axis over `[lo, hi]`: 1-2-5 steps per decade, or finer steps
/// (1, 1.5, 2, 3, 5, 7) when that gives fewer than four, or four values evenly spaced on
/// the log scale (rounded to two significant digits, or three where two would repeat a
/// value) when those give fewer than three.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite() && lo > 0.0 && hi > lo) {
        return Vec::new();
    }
    let within = |steps: &[f64]| -> Vec<f64> {
        let mut out = Vec::new();
        let mut decade = 10f64.powf(lo.log10().floor());
        while decade <= hi {
            for s in steps {
                let v = decade * s;
                if v >= lo && v <= hi {
                    out.push(v);
                }
            }
            decade *= 10.0;
        }
        out
    };
    let coarse = within(&[1.0, 2.0, 5.0]);
    if coarse.len() >= 4 {
        return coarse;
    }
    let fine = within(&[1.0, 1.5, 2.0, 3.0, 5.0, 7.0]);
    if fine.len() >= 3 {
        return fine;
    }
    let (a, b) = (lo.ln(), hi.ln());
    let spaced = |digits: f64| -> Vec<f64> {
        let mut v: Vec<f64> = (1..=4)
            .map(|i| {
                let v = (a + (b - a) * f64::from(i) / 5.0).exp();
                let mag = 10f64.powf(v.log10().floor() - digits + 1.0);
                (v / mag).round() * mag
            })
            .collect();
        v.dedup();
        v
    };
    let two = spaced(2.0);
    if two.len() == 4 { two } else { spaced(3.0) }
}

/// A pixel offset from a marker's anchor.
pub type BackendCoord = (i32, i32);

/// A marker: every shape as one element type (a circle, a filled polygon and an outline,
/// the unused parts transparent, which the SVG backend skips), so that points of every
/// shape go in one series.
pub type MarkerElement<C, DB> = ComposedElement<
    C,
    DB,
    Circle<BackendCoord, i32>,
    ComposedElement<BackendCoord, DB, Polygon<BackendCoord>, PathElement<BackendCoord>>,
>;

/// The marker of a point of class `class` and tier marker `m` at `c`: filled, or hollow
/// for timings that never rank (raced out, plain).
pub fn marker<DB: DrawingBackend, C>(c: C, m: Marker, class: Class) -> MarkerElement<C, DB> {
    let color = class.color();
    let hollow = class.hollow();
    let none = TRANSPARENT.stroke_width(0);
    let fill = color.mix(0.85).filled();
    let line = color.stroke_width(2);
    let shape: Vec<BackendCoord> = match m {
        Marker::Circle | Marker::Dot => Vec::new(),
        Marker::Triangle => vec![(0, -5), (5, 4), (-5, 4)],
        Marker::Square => vec![(-4, -4), (4, -4), (4, 4), (-4, 4)],
        Marker::Diamond => vec![(0, -5), (5, 0), (0, 5), (-5, 0)],
        Marker::Cross => Vec::new(),
    };
    let radius = match m {
        Marker::Circle => 4,
        Marker::Dot => 3,
        _ => 0,
    };
    let circle_style = match (radius, hollow) {
        (0, _) => none,
        (_, true) => line,
        (_, false) => fill,
    };
    let outline: Vec<BackendCoord> = match m {
        Marker::Cross => vec![(-4, -4), (4, 4), (0, 0), (4, -4), (-4, 4)],
        _ if hollow && !shape.is_empty() => {
            let mut v = shape.clone();
            v.push(shape[0]);
            v
        }
        _ => Vec::new(),
    };
    let poly_style = if hollow || shape.is_empty() {
        none
    } else {
        fill
    };
    let outline_style = if outline.is_empty() { none } else { line };
    EmptyElement::at(c)
        + Circle::new((0, 0), radius, circle_style)
        + Polygon::new(if hollow { Vec::new() } else { shape }, poly_style)
        + PathElement::new(outline, outline_style)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_namespace_free_svg() {
        assert_eq!(log_range([]), None);
        assert_eq!(log_range([0.0, -1.0, f64::NAN]), None);
        let (lo, hi) = log_range([2.0, 100.0]).expect("range");
        assert!(lo < 2.0 && hi > 100.0);
        let (lo, hi) = log_range([5.0]).expect("one value");
        assert!(lo < 5.0 && hi > 5.0);
        assert_eq!(
            log_ticks(1.0, 100.0),
            [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(log_ticks(2.5, 8.0), [3.0, 5.0, 7.0]);
        let narrow = log_ticks(3.2, 3.5);
        assert_eq!(narrow.len(), 4);
        assert!(narrow.windows(2).all(|w| w[1] > w[0]) && narrow[0] > 3.2 && narrow[3] < 3.5);
        let s = svg(100, 50, |root| {
            root.draw(&Circle::new((10, 10), 3, RED.filled()))?;
            Ok(())
        })
        .expect("svg");
        assert!(s.starts_with("<svg"), "{s}");
        assert!(s.contains("<circle"), "{s}");
        assert!(!s.contains("http"), "{s}");
    }
}
