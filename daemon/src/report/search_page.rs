//! The search page: what the search is and how far it got; best time over evaluations and
//! over wall time with the seed, baselines and roofline floors; every evaluation by
//! verdict; counts by verdict and precision tier; the fastest kernels; the MAP-Elites
//! grid per island; the lineage of the best kernel; the strategy's rounds. While the
//! search runs the page reloads itself every [`REFRESH_SECS`] seconds.

use std::collections::BTreeMap;

use kiln_types::summary::Report;
use kiln_types::{BackendKind, TrustMode};

use super::html::{self, esc, esc_cut, figure, id, swatch};
use super::inputs::{SearchInputs, SummarySource};
use super::lineage;
use super::plots::{self, best::Axis, best::RefLine};
use super::points::{self, Point};
use super::rounds;
use super::style::{self, Marker, TIERS, css, fmt_secs, fmt_us, fmt_x, tier_name, trust_text};

/// Seconds between reloads of a running search's page.
pub const REFRESH_SECS: u32 = 5;
/// Rows of the fastest-kernels table.
pub const FASTEST: usize = 10;
/// Most MAP-Elites islands drawn.
pub const MAX_ISLANDS: usize = 16;

/// Milliseconds since the epoch as an HTTP date (`Tue, 01 Dec 2026 10:00:00 GMT`).
pub fn date(ms: i64) -> String {
    let t =
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    httpdate::fmt_http_date(t)
}

/// The reference lines: the seed, each measured baseline (named as its result names
/// it), the roofline floors.
pub fn ref_lines(inp: &SearchInputs, pts: &[Point]) -> Vec<RefLine> {
    let mut lines = Vec::new();
    let seed_us = inp
        .seed_id
        .as_deref()
        .and_then(|s| pts.iter().find(|p| p.id == s))
        .and_then(|p| p.median_us)
        .or_else(|| inp.summary.as_ref().and_then(|(r, _)| r.seed_us));
    if let Some(us) = seed_us.filter(|u| u.is_finite() && *u > 0.0) {
        lines.push(RefLine {
            label: "seed".into(),
            us,
            color: style::SEED,
            dashed: false,
        });
    }
    if let Some(set) = &inp.baselines {
        for (i, r) in set
            .results
            .iter()
            .filter(|r| r.median_us().is_some())
            .enumerate()
        {
            lines.push(RefLine {
                label: r.name.clone(),
                us: r.median_us().unwrap_or_default(),
                color: style::baseline_color(i),
                dashed: false,
            });
        }
    }
    for f in inp.floors.iter().filter(|f| f.us.is_finite() && f.us > 0.0) {
        lines.push(RefLine {
            label: f.label.clone(),
            us: f.us,
            color: style::FLOOR,
            dashed: true,
        });
    }
    lines
}

/// The search's best: the strategy's own (judged by its statistics) when it named one,
/// else kilnd's fastest ranked median.
fn best_id(inp: &SearchInputs) -> Option<String> {
    inp.summary
        .as_ref()
        .and_then(|(r, _)| r.best.clone())
        .or_else(|| {
            inp.search
                .summary
                .as_ref()?
                .get("best")?
                .as_str()
                .map(str::to_string)
        })
        .or_else(|| inp.search.best.as_ref().map(|b| b.0.clone()))
}

/// How the search's evaluated candidates were run: one mode with what it means, or the
/// count of each when both appear; `-` before any evaluation.
fn trust_of(inp: &SearchInputs) -> String {
    let modes: Vec<TrustMode> = inp
        .timeline
        .iter()
        .filter_map(|e| e.evaluation.as_ref().map(|e| e.trust))
        .collect();
    let hosted = modes.iter().filter(|&&t| t == TrustMode::Hosted).count();
    match (modes.len(), hosted) {
        (0, _) => "-".into(),
        (n, h) if h == 0 || h == n => trust_text(modes[0]).into(),
        (n, h) => format!("{h} evaluations hosted, {} contract", n - h),
    }
}

fn header(inp: &SearchInputs, pts: &[Point], lines: &[RefLine]) -> String {
    let s = &inp.search;
    let pending = s.submitted.saturating_sub(pts.len() as u64);
    let state = if s.state == "running" {
        format!("running <span class=\"muted\">(this page reloads every {REFRESH_SECS} s)</span>")
    } else {
        esc(&s.state)
    };
    let mut rows = vec![
        ("search", id(&s.id)),
        ("problem", esc(&s.problem)),
        ("proposer", esc(&s.proposer)),
        ("backend", esc(inp.backend.as_deref().unwrap_or("-"))),
        ("trust", esc(&trust_of(inp))),
        ("state", state),
        (
            "progress",
            format!(
                "{} evaluated of {} submitted ({pending} waiting), budget {}",
                pts.len(),
                s.submitted,
                s.budget_candidates
            ),
        ),
        (
            "time",
            format!(
                "{} used of {}",
                fmt_secs(s.elapsed_ms as f64 / 1e3),
                fmt_secs(s.time_limit_ms as f64 / 1e3)
            ),
        ),
        ("started", esc(&date(s.created_at))),
    ];
    if let Some(e) = &s.error {
        rows.push((
            "error",
            format!("<span class=\"bad\">{}</span>", esc_cut(e, 2000)),
        ));
    }
    let text = inp
        .summary
        .as_ref()
        .map(|(r, _)| r.text.clone())
        .or_else(|| {
            s.summary
                .as_ref()?
                .get("message")?
                .as_str()
                .map(str::to_string)
        });
    if let Some(t) = text {
        rows.push(("summary", esc_cut(&t, 2000)));
    }
    if let Some(b) = best_id(inp) {
        let us = pts.iter().find(|p| p.id == b).and_then(|p| p.median_us);
        let mut vs = String::new();
        if let Some(us) = us {
            for l in lines {
                vs.push_str(&format!(
                    " · {} vs {} ({})",
                    fmt_x(l.us / us),
                    esc(&l.label),
                    esc(&fmt_us(l.us))
                ));
            }
        }
        rows.push((
            "best",
            format!(
                "{} {}{vs}",
                id(&b),
                us.map_or("-".into(), |u| esc(&fmt_us(u)))
            ),
        ));
        if let Some((fid, fus)) = s.best.as_ref().filter(|(f, _)| *f != b) {
            rows.push((
                "fastest median",
                format!(
                    "{} {} <span class=\"muted\">(the best above is the strategy's pick, \
                     judged by its statistics; this one was not significantly faster)</span>",
                    id(fid),
                    esc(&fmt_us(*fus))
                ),
            ));
        }
    }
    format!("<h1>Search {}</h1>{}", esc(&s.id), html::facts(&rows))
}

/// Legend of the point colours and shapes present.
fn legend(pts: &[Point]) -> String {
    let classes = points::class_counts(pts);
    let mut out = String::from("<div class=\"legend\">");
    for c in classes.keys() {
        let glyph = if c.hollow() { "○" } else { "●" };
        out.push_str(&swatch(glyph, &css(c.color()), &c.label()));
    }
    out.push_str("</div><div class=\"legend\">shape: precision tier — ");
    for t in TIERS {
        out.push_str(&swatch(Marker::of(Some(t)).glyph(), "#444", tier_name(t)));
    }
    out.push_str(&swatch(Marker::Dot.glyph(), "#444", "none (not correct)"));
    out.push_str("</div>");
    out
}

fn counts(pts: &[Point]) -> String {
    let rows: Vec<Vec<String>> = points::class_counts(pts)
        .into_iter()
        .map(|(c, n)| {
            vec![
                swatch(
                    if c.hollow() { "○" } else { "●" },
                    &css(c.color()),
                    &c.label(),
                ),
                n.to_string(),
            ]
        })
        .collect();
    let tiers: BTreeMap<_, _> = points::tier_counts(pts);
    let tier_rows: Vec<Vec<String>> = tiers
        .into_iter()
        .map(|(t, n)| {
            vec![
                swatch(
                    Marker::of(t).glyph(),
                    "#444",
                    t.map_or("no tier reported", tier_name),
                ),
                n.to_string(),
            ]
        })
        .collect();
    format!(
        "<div class=\"islands\">{}{}</div>",
        html::table("counts", &["verdict", "evaluations"], &rows),
        html::table(
            "counts",
            &["precision tier (correct ones)", "evaluations"],
            &tier_rows
        )
    )
}

fn fastest(inp: &SearchInputs, pts: &[Point]) -> String {
    let mut ranked: Vec<&Point> = pts.iter().filter(|p| p.median_us.is_some()).collect();
    ranked.sort_by(|a, b| {
        a.median_us
            .unwrap_or(f64::MAX)
            .total_cmp(&b.median_us.unwrap_or(f64::MAX))
    });
    let seed = inp.seed_id.as_deref();
    let rows: Vec<Vec<String>> = ranked
        .iter()
        .take(FASTEST)
        .map(|p| {
            let e = inp.timeline.iter().find(|e| e.candidate_id == p.id);
            vec![
                format!("#{}", p.order),
                id(&p.id),
                esc(&fmt_us(p.median_us.unwrap_or(f64::NAN))),
                swatch(
                    if p.class.hollow() { "○" } else { "●" },
                    &css(p.class.color()),
                    &p.class.label(),
                ),
                swatch(
                    Marker::of(p.tier).glyph(),
                    "#444",
                    p.tier.map_or("-", tier_name),
                ),
                if Some(p.id.as_str()) == seed {
                    "<i>seed</i>".into()
                } else {
                    esc_cut(e.and_then(|e| e.note.as_deref()).unwrap_or(""), 160)
                },
            ]
        })
        .collect();
    html::table(
        "fastest",
        &[
            "evaluation",
            "candidate",
            "median",
            "verdict",
            "tier",
            "note",
        ],
        &rows,
    )
}

fn grid_section(report: &Report, best: Option<&str>) -> String {
    let Some(grid) = &report.grid else {
        return String::new();
    };
    let mut out = format!(
        "<h2>MAP-Elites archive</h2><p>Descriptors from {}: {}. Each cell holds the fastest \
         correct kernel of its island with those descriptor values; colour is its median \
         time (dark: fast), the search's best is outlined in red.</p><div class=\"islands\">",
        esc(&grid.source),
        esc(&grid.descriptors.join(" × "))
    );
    let medians = grid.cells.iter().map(|c| c.median_us);
    let Some(range) = plots::log_range(medians).map(|(lo, hi)| (lo * 1.25, hi / 1.25)) else {
        return out + "<p class=\"muted\">No elite yet.</p></div>";
    };
    let mut islands: Vec<u32> = grid.cells.iter().map(|c| c.island).collect();
    islands.sort_unstable();
    islands.dedup();
    for i in islands.iter().take(MAX_ISLANDS) {
        let n = grid.cells.iter().filter(|c| c.island == *i).count();
        out.push_str(&figure(
            "island",
            plots::grid::plot(grid, *i, range, best),
            &format!("island {i}: {n} elites"),
        ));
    }
    out.push_str("</div>");
    if islands.len() > MAX_ISLANDS {
        out.push_str(&format!(
            "<p class=\"muted\">{} more islands are not drawn.</p>",
            islands.len() - MAX_ISLANDS
        ));
    }
    out
}

fn lineage_section(inp: &SearchInputs, best: Option<&str>) -> String {
    let Some(b) = best else {
        return "<h2>Lineage of the best kernel</h2><p class=\"muted\">No correct kernel yet.</p>"
            .into();
    };
    let chain = lineage::chain(b, &inp.timeline);
    let rows: Vec<Vec<String>> = chain
        .iter()
        .enumerate()
        .map(|(i, s)| {
            vec![
                (i + 1).to_string(),
                id(&s.id),
                if !s.in_search {
                    "<span class=\"muted\">(not submitted by this search)</span>".into()
                } else if Some(s.id.as_str()) == inp.seed_id.as_deref() {
                    format!(
                        "<i>seed</i> {}",
                        esc_cut(s.note.as_deref().unwrap_or(""), 300)
                    )
                } else {
                    esc_cut(s.note.as_deref().unwrap_or(""), 300)
                },
                s.median_us
                    .map(|m| esc(&fmt_us(m)))
                    .or_else(|| s.verdict.map(|v| esc(v.as_str())))
                    .unwrap_or_else(|| "-".into()),
                s.vs_parent.map_or("-".into(), |x| {
                    let class = if x > 1.0 { "good" } else { "bad" };
                    format!("<span class=\"{class}\">{}</span>", fmt_x(x))
                }),
                s.vs_first.map_or("-".into(), fmt_x),
            ]
        })
        .collect();
    format!(
        "<h2>Lineage of the best kernel</h2><p>From the first ancestor to the best, each step \
         with the proposer's note (its idea or move) and its speedup.</p>{}",
        html::table(
            "lineage",
            &[
                "step",
                "candidate",
                "note (idea or move)",
                "median",
                "vs parent",
                "vs first"
            ],
            &rows
        )
    )
}

/// The page.
pub fn page(inp: &SearchInputs) -> String {
    let s = &inp.search;
    let pts = points::points(&inp.timeline, s.created_at);
    let lines = ref_lines(inp, &pts);
    let best = best_id(inp);
    let mut body = header(inp, &pts, &lines);

    body.push_str("<h2>Best time</h2>");
    if inp.baselines.is_none() {
        body.push_str(&format!(
            "<p class=\"muted\">No baselines are drawn: {}.</p>",
            if inp
                .backend
                .as_deref()
                .is_some_and(|b| b == BackendKind::Cuda)
            {
                "none were measured for this problem on this GPU (kiln problems baseline NAME)"
            } else {
                "they are measured on the GPU, and this search ran on another backend"
            }
        ));
    }
    if inp.floors.is_empty() {
        body.push_str(
            "<p class=\"muted\">No roofline floor is drawn: the backend has no peak rates.</p>",
        );
    }
    let note = "Points: every timed evaluation (colour: verdict, hollow: raced out or plain \
                timing, never ranked; shape: precision tier). Line: the best so far.";
    body.push_str(&figure(
        "best",
        plots::best::plot(&pts, &lines, Axis::Evaluations),
        &format!("Best time over evaluations. {note}"),
    ));
    body.push_str(&figure(
        "best",
        plots::best::plot(&pts, &lines, Axis::WallTime),
        &format!("Best time over wall time. {note}"),
    ));
    body.push_str(&legend(&pts));

    body.push_str("<h2>Every evaluation</h2>");
    body.push_str(&figure(
        "verdicts",
        plots::verdicts::plot(&pts),
        "Each finished evaluation in its verdict's row, in the order they finished.",
    ));
    body.push_str(&counts(&pts));

    body.push_str("<h2>Fastest kernels</h2>");
    body.push_str(&fastest(inp, &pts));

    match &inp.summary {
        Some((report, source)) => {
            if *source == SummarySource::Checkpoint {
                body.push_str(
                    "<p class=\"muted\">The archive and rounds below are the strategy's \
                     state at its last checkpoint.</p>",
                );
            }
            body.push_str(&grid_section(report, best.as_deref()));
            body.push_str(&lineage_section(inp, best.as_deref()));
            if !report.rounds.is_empty() {
                body.push_str(&format!(
                    "<h2>Rounds ({}, {} mode)</h2>",
                    esc_cut(&report.strategy, 60),
                    esc_cut(&report.mode, 30)
                ));
                body.push_str(&rounds::table(&report.rounds));
            }
        }
        None => {
            body.push_str(&lineage_section(inp, best.as_deref()));
            body.push_str(
                "<p class=\"muted\">The proposer published no rounds or archive (kiln's bundled \
                 strategies do, in their summary and checkpoints).</p>",
            );
        }
    }
    body.push_str(&format!(
        "<p class=\"muted\">Generated by kilnd {} at {}.</p>",
        env!("CARGO_PKG_VERSION"),
        esc(&date(inp.generated_at))
    ));
    let refresh = (s.state == "running").then_some(REFRESH_SECS);
    html::page(
        &format!("kiln search {} ({})", s.id, s.problem),
        refresh,
        &body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::{assert_self_contained, inputs};
    use crate::report::style::Class;
    use kiln_types::Verdict;

    fn fill(c: Class) -> String {
        format!("fill=\"{}\"", css(c.color()).to_uppercase())
    }

    fn stroke(c: Class) -> String {
        format!("stroke=\"{}\"", css(c.color()).to_uppercase())
    }

    /// SVG shapes in the colour of `c` (filled markers, outlines and crosses).
    fn marks(html: &str, c: Class) -> usize {
        html.matches(&fill(c)).count() + html.matches(&stroke(c)).count()
    }

    #[test]
    fn plots_points_lines_grid_lineage_and_rounds_are_there() {
        let inp = inputs(60);
        let html = page(&inp);
        assert_self_contained(&html);
        assert!(
            !html.contains("://"),
            "no URL at all, not even the SVG namespace"
        );
        let pts = points::points(&inp.timeline, inp.search.created_at);
        assert_eq!(pts.len(), 60, "every entry finished");
        // Two time plots, the verdict strip and one heat map per island.
        assert_eq!(html.matches("<svg").count(), 2 + 1 + 2);
        // Every ok evaluation is a filled point in both time plots and the strip; every
        // raced-out one a hollow point there; every failure a point in the strip only.
        let counts = points::class_counts(&pts);
        let n = |c: Class| counts.get(&c).copied().unwrap_or(0);
        assert!(n(Class::Ok) > 20 && n(Class::RacedOut) > 3);
        assert_eq!(marks(&html, Class::Ok), 3 * n(Class::Ok));
        assert_eq!(marks(&html, Class::RacedOut), 3 * n(Class::RacedOut));
        for v in [
            Verdict::WrongAnswer,
            Verdict::CompileError,
            Verdict::RuntimeFault,
        ] {
            assert!(n(Class::Failed(v)) > 0);
            assert_eq!(marks(&html, Class::Failed(v)), n(Class::Failed(v)));
        }
        assert_eq!(marks(&html, Class::NotEvaluated), n(Class::NotEvaluated));
        // A line per baseline (named from the results), the seed and the floor, in each
        // time plot's legend.
        for label in [
            ">\ntorch-eager 30.0 µs",
            ">\ntorch-compile 20.0 µs",
            ">\nroofline floor 2.00 µs",
            ">\nseed ",
            ">\nbest so far",
        ] {
            assert_eq!(html.matches(label).count(), 2, "{label}");
        }
        // Precision tiers: every tier appears in the legend and the counts.
        for t in TIERS {
            assert!(html.contains(tier_name(t)), "{}", tier_name(t));
        }
        // The lineage of the best (c2: its parent c1, the seed), and the rounds.
        assert!(html.contains("Lineage of the best kernel"));
        assert!(html.contains("<i>seed</i>"));
        assert!(html.contains("Rounds (map-elites, offline mode)"));
        assert_eq!(html.matches("<b>[memory]</b>").count(), 3);
        assert!(html.contains("island 0: ") && html.contains("island 1: "));
        // Notes are escaped.
        assert!(html.contains("vectorise &lt;loads&gt; &amp; stores"));
        assert!(!html.contains("<loads>"));
    }

    #[test]
    fn text_from_the_plugin_is_escaped_in_tables_and_plots() {
        let evil = "</text><script>alert(1)</script><img src=x>";
        let mut inp = inputs(20);
        inp.search.error = Some(evil.into());
        for e in &mut inp.timeline {
            e.note = Some(evil.into());
            e.parent = e.parent.as_ref().map(|_| evil.into());
        }
        if let Some((r, _)) = inp.summary.as_mut() {
            r.text = evil.into();
            r.strategy = evil.into();
            r.best = Some("c2".into());
            r.rounds[0].note = evil.into();
            r.rounds[0].tried[0].idea = evil.into();
            r.rounds[0].tried[0].family = Some(evil.into());
            r.rounds[0].tried[0].outcome = evil.into();
            if let Some(g) = r.grid.as_mut() {
                g.descriptors = vec![evil.into(), evil.into()];
                g.source = evil.into();
                g.cells[0].bins = vec![evil.into(), evil.into()];
            }
        }
        let html = page(&inp);
        assert_self_contained(&html);
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    }

    #[test]
    fn a_running_search_refreshes_and_an_ended_one_does_not() {
        let mut inp = inputs(10);
        assert!(!page(&inp).contains("http-equiv=\"refresh\""));
        inp.search.state = "running".into();
        inp.summary = inp.summary.map(|(r, _)| (r, SummarySource::Checkpoint));
        let html = page(&inp);
        assert!(html.contains(&format!(
            "<meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">"
        )));
        assert!(html.contains("state at its last checkpoint"));
        for state in ["failed", "cancelled"] {
            inp.search.state = state.into();
            assert!(!page(&inp).contains("http-equiv"), "{state}");
        }
    }

    #[test]
    fn a_host_search_says_why_no_baselines_or_floor_are_drawn() {
        let mut inp = inputs(12);
        inp.backend = Some("host".into());
        inp.baselines = None;
        inp.floors.clear();
        inp.summary = None;
        let html = page(&inp);
        assert!(html.contains("this search ran on another backend"));
        assert!(html.contains("No roofline floor is drawn"));
        assert!(html.contains("published no rounds"));
        assert_eq!(html.matches("<svg").count(), 3);
        assert_eq!(
            html.matches(">\nseed ").count(),
            2,
            "the seed's line in both time plots"
        );
        assert_eq!(html.matches(">\ntorch").count(), 0);
    }

    #[test]
    fn the_header_says_how_the_candidates_were_run() {
        let mut inp = inputs(4);
        assert!(page(&inp).contains("contract (kiln launched"));
        for e in inp
            .timeline
            .iter_mut()
            .filter_map(|e| e.evaluation.as_mut())
        {
            e.trust = TrustMode::Hosted;
        }
        assert!(page(&inp).contains("hosted (the candidate&#39;s own Python ran"));
        if let Some(e) = inp.timeline[0].evaluation.as_mut() {
            e.trust = TrustMode::Contract;
        }
        let hosted = inp
            .timeline
            .iter()
            .filter(|e| e.evaluation.is_some())
            .count()
            - 1;
        assert!(
            page(&inp).contains(&format!("{hosted} evaluations hosted, 1 contract")),
            "a mixed search counts both"
        );
        assert_eq!(trust_of(&inputs(0)), "-", "nothing evaluated yet");
    }

    #[test]
    fn nothing_finished_yet_is_said_not_drawn() {
        let mut inp = inputs(0);
        inp.search.state = "running".into();
        inp.summary = None;
        let html = page(&inp);
        assert_self_contained(&html);
        assert_eq!(html.matches("<svg").count(), 0);
        assert!(html.contains("no evaluation was timed yet"));
        assert!(html.contains("no evaluation finished yet"));
    }

    #[test]
    fn a_thousand_evaluations_stay_under_two_megabytes() {
        let mut inp = inputs(1000);
        inp.summary = inp.summary.map(|(mut r, s)| {
            r.rounds = crate::report::fixtures::summary(500).rounds;
            (r, s)
        });
        let html = page(&inp);
        assert_self_contained(&html);
        eprintln!("1000 evaluations: {} bytes", html.len());
        assert!(html.len() < 2 << 20, "{} bytes", html.len());
        let ok =
            points::class_counts(&points::points(&inp.timeline, inp.search.created_at))[&Class::Ok];
        assert_eq!(marks(&html, Class::Ok), 3 * ok);
    }
}
