//! The rounds of a strategy's summary document as an HTML table: per round its note, its
//! best and whether it improved, and each idea (or move) with its family and outcome.
//! The document comes from the plugin, so it is bounded: at most [`MAX_ROUNDS`] rounds
//! (the latest), [`MAX_TRIED`] ideas a round, [`MAX_TEXT`] characters a field.

use kiln_types::summary::Round;

use super::html::{self, esc, esc_cut};
use super::style::fmt_us;

/// Most rounds shown (the latest ones).
pub const MAX_ROUNDS: usize = 300;
/// Most ideas shown per round.
pub const MAX_TRIED: usize = 40;
/// Most characters of a note or idea.
pub const MAX_TEXT: usize = 240;

/// The CSS class of an outcome: good for improvements, bad for failures.
fn outcome_class(outcome: &str) -> &'static str {
    if outcome.starts_with("improved") || outcome.starts_with("faster") {
        "good"
    } else if outcome.starts_with("failed") || outcome.starts_with("no usable") {
        "bad"
    } else {
        "muted"
    }
}

/// The table, newest rounds last; a note when rounds were left out.
pub fn table(rounds: &[Round]) -> String {
    let skip = rounds.len().saturating_sub(MAX_ROUNDS);
    let mut rows = Vec::new();
    for r in rounds.iter().skip(skip) {
        let mut ideas = String::new();
        for t in r.tried.iter().take(MAX_TRIED) {
            let family = t
                .family
                .as_deref()
                .map_or(String::new(), |f| format!("<b>[{}]</b> ", esc_cut(f, 40)));
            let best = t
                .best_us
                .map_or(String::new(), |m| format!(" ({})", esc(&fmt_us(m))));
            ideas.push_str(&format!(
                "<div>{family}{} → <span class=\"{}\">{}</span>{best}</div>",
                esc_cut(&t.idea, MAX_TEXT),
                outcome_class(&t.outcome),
                esc_cut(&t.outcome, 80),
            ));
        }
        if r.tried.len() > MAX_TRIED {
            ideas.push_str(&format!(
                "<div class=\"muted\">… {} more</div>",
                r.tried.len() - MAX_TRIED
            ));
        }
        rows.push(vec![
            r.round.to_string(),
            esc_cut(&r.note, MAX_TEXT),
            r.evaluated.to_string(),
            r.best_us.map_or("-".into(), |m| esc(&fmt_us(m))),
            if r.improved {
                "<span class=\"good\">yes</span>".into()
            } else {
                "no".into()
            },
            ideas,
        ]);
    }
    let mut out = String::new();
    if skip > 0 {
        out.push_str(&format!(
            "<p class=\"muted\">The first {skip} rounds are left out; the latest {MAX_ROUNDS} are shown.</p>"
        ));
    }
    out.push_str(&html::table(
        "rounds",
        &[
            "round",
            "what it did",
            "evaluated",
            "best after",
            "improved",
            "ideas → outcome",
        ],
        &rows,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::summary;

    #[test]
    fn every_idea_with_family_and_outcome_and_bounded() {
        let s = summary(3);
        let t = table(&s.rounds);
        assert_eq!(t.matches("<tr>").count(), 1 + 3);
        assert_eq!(t.matches("<b>[memory]</b>").count(), 3);
        assert_eq!(t.matches("class=\"good\">improved").count(), 3);
        assert_eq!(t.matches("class=\"bad\">failed (wrong_answer)").count(), 3);
        let many = summary(MAX_ROUNDS as u32 + 20);
        let t = table(&many.rounds);
        assert_eq!(t.matches("<tr>").count(), 1 + MAX_ROUNDS);
        assert!(t.contains("The first 20 rounds are left out"));
    }
}
