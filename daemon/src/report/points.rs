//! A search's finished evaluations as points, in the order they finished (with their
//! class, time, precision tier and wall time since the search started), and the best so
//! far along either axis.

use std::collections::BTreeMap;

use kiln_types::{Evaluation, PrecisionTier, Verdict};

use super::style::Class;
use crate::store::TimelineEntry;

/// One finished evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// 1-based position in the order evaluations finished.
    pub order: usize,
    /// Order of submission within the search.
    pub seq: u64,
    /// Candidate id.
    pub id: String,
    /// What it counts as.
    pub class: Class,
    /// Its median time, µs, when it was timed (`ok`, raced out or plain).
    pub median_us: Option<f64>,
    /// Its precision tier, when correct.
    pub tier: Option<PrecisionTier>,
    /// Seconds from the search's start to the end of its evaluation.
    pub wall_s: f64,
}

impl Point {
    /// The time that may rank as a best: `ok`, neither raced out nor plain.
    pub fn ranked_us(&self) -> Option<f64> {
        self.median_us.filter(|_| self.class == Class::Ok)
    }
}

/// The class of an evaluation.
pub fn class_of(e: &Evaluation) -> Class {
    match (e.verdict, &e.timing) {
        (Verdict::Ok, Some(t)) if t.raced_out => Class::RacedOut,
        (Verdict::Ok, Some(t)) if t.plain => Class::Plain,
        (Verdict::Ok, _) => Class::Ok,
        (v, _) => Class::Failed(v),
    }
}

/// The finished entries of `timeline` as points, in the order they finished. A duplicate
/// evaluated before this search submitted it counts as finished when submitted.
pub fn points(timeline: &[TimelineEntry], started_at: i64) -> Vec<Point> {
    let mut out: Vec<(i64, Point)> = timeline
        .iter()
        .filter_map(|e| {
            let (class, median_us, tier, ended) = match (&e.evaluation, e.job_state.as_deref()) {
                (Some(ev), _) => (
                    class_of(ev),
                    ev.timing
                        .as_ref()
                        .map(|t| t.median_us)
                        .filter(|m| m.is_finite() && *m > 0.0 && ev.verdict == Verdict::Ok),
                    ev.tier,
                    e.evaluated_at.or(e.job_finished_at),
                ),
                (None, Some("failed")) => (Class::NotEvaluated, None, None, e.job_finished_at),
                _ => return None,
            };
            let at = ended.unwrap_or(e.submitted_at).max(e.submitted_at);
            Some((
                at,
                Point {
                    order: 0,
                    seq: e.seq,
                    id: e.candidate_id.clone(),
                    class,
                    median_us,
                    tier,
                    wall_s: (at - started_at).max(0) as f64 / 1e3,
                },
            ))
        })
        .collect();
    out.sort_by_key(|(at, p)| (*at, p.seq));
    out.into_iter()
        .enumerate()
        .map(|(i, (_, mut p))| {
            p.order = i + 1;
            p
        })
        .collect()
}

/// Each point that beat every ranked point before it: (x, its time, its id), with x
/// read from the point by `x`.
pub fn best_steps(points: &[Point], x: impl Fn(&Point) -> f64) -> Vec<(f64, f64, &str)> {
    let mut best = f64::INFINITY;
    let mut out = Vec::new();
    for p in points {
        if let Some(m) = p.ranked_us()
            && m < best
        {
            best = m;
            out.push((x(p), m, p.id.as_str()));
        }
    }
    out
}

/// Points per class.
pub fn class_counts(points: &[Point]) -> BTreeMap<Class, usize> {
    let mut m = BTreeMap::new();
    for p in points {
        *m.entry(p.class).or_insert(0) += 1;
    }
    m
}

/// Correct points (any timing) per tier; `None` counts correct points without a tier.
pub fn tier_counts(points: &[Point]) -> BTreeMap<Option<PrecisionTier>, usize> {
    let mut m = BTreeMap::new();
    for p in points
        .iter()
        .filter(|p| matches!(p.class, Class::Ok | Class::RacedOut | Class::Plain))
    {
        *m.entry(p.tier).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::entry;

    #[test]
    fn points_in_finish_order_and_the_best_so_far() {
        let mut raced = entry(4, 1400, Some(Verdict::Ok), 1.0);
        if let Some(t) = raced.evaluation.as_mut().and_then(|e| e.timing.as_mut()) {
            t.raced_out = true;
        }
        let mut pending = entry(6, 0, None, 0.0);
        pending.job_state = Some("running".into());
        let timeline = vec![
            entry(1, 3000, Some(Verdict::Ok), 10.0),
            entry(2, 2000, Some(Verdict::Ok), 12.0),
            entry(3, 4000, Some(Verdict::WrongAnswer), 0.0),
            raced,
            entry(5, 5000, None, 0.0),
            pending,
            entry(7, 6000, Some(Verdict::Ok), 8.0),
        ];
        let p = points(&timeline, 1000);
        let seqs: Vec<u64> = p.iter().map(|p| p.seq).collect();
        assert_eq!(
            seqs,
            [4, 2, 1, 3, 5, 7],
            "finish order; the running one left out"
        );
        assert_eq!(p[0].class, Class::RacedOut);
        assert_eq!(p[0].ranked_us(), None, "raced out never ranks");
        assert_eq!(p[3].class, Class::Failed(Verdict::WrongAnswer));
        assert_eq!(p[4].class, Class::NotEvaluated);
        assert_eq!(p[1].wall_s, 1.0);
        let steps = best_steps(&p, |p| p.order as f64);
        let got: Vec<(f64, f64)> = steps.iter().map(|s| (s.0, s.1)).collect();
        assert_eq!(got, [(2.0, 12.0), (3.0, 10.0), (6.0, 8.0)]);
        let counts = class_counts(&p);
        assert_eq!(counts[&Class::Ok], 3);
        assert_eq!(counts[&Class::RacedOut], 1);
        assert_eq!(tier_counts(&p)[&Some(PrecisionTier::Fp32Faithful)], 4);
    }
}
