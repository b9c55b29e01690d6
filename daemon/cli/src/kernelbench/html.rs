//! The run's document as one self-contained HTML page (`--html FILE`): the answers table,
//! the level's numbers under both views, and the notes; inline CSS, no script, nothing
//! fetched.

use kiln_daemon::report::html::esc;

use super::summary::{KERNELBENCH_CORRECT, KILN_CORRECT, Report};
use super::table::{
    HEADER, NUMBERS_HEADER, answer_cells, missing_baselines, view_rows, why_not_ok,
};

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;margin:1em 0}th,td{padding:3px 9px;border-bottom:1px solid #ddd;\
text-align:left;white-space:nowrap}th{background:#f3f3f3}td.n{text-align:right;\
font-variant-numeric:tabular-nums}tr.ok td.v{color:#176f2c}tr.bad td.v{color:#a11}\
tr.view td{font-weight:600;background:#fafafa}tr.sub td:first-child{padding-left:26px}code{background:#f3f3f3;padding:0 3px}\
li{margin:.2em 0}.muted{color:#666}";

fn row(cells: &[String], numeric: &[bool], class: &str) -> String {
    let tds: Vec<String> = cells
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut classes = Vec::new();
            if numeric.get(i) == Some(&true) {
                classes.push("n");
            }
            if i == 2 {
                classes.push("v");
            }
            if classes.is_empty() {
                format!("<td>{}</td>", esc(c))
            } else {
                format!("<td class=\"{}\">{}</td>", classes.join(" "), esc(c))
            }
        })
        .collect();
    format!("<tr class=\"{class}\">{}</tr>", tds.join(""))
}

fn head(cells: &[&str]) -> String {
    let ths: Vec<String> = cells
        .iter()
        .map(|c| format!("<th>{}</th>", esc(c)))
        .collect();
    format!("<tr>{}</tr>", ths.join(""))
}

/// The page.
pub fn page(r: &Report) -> String {
    let c = &r.summary.counts;
    let mut body = Vec::new();
    body.push(format!(
        "<h1>KernelBench level {} with kiln</h1>",
        esc(&r.level.to_string())
    ));
    body.push(format!(
        "<p>{} problems of <code>{}</code>, {} registered; {} answered by {} answers from \
         <code>{}</code> ({} evaluated, {} refused, {} failed; {} answered from kilnd's \
         store); {} file(s) skipped. Language <code>{}</code>; {:.0} s.</p>",
        c.level_problems,
        esc(&r.problems_dir.display().to_string()),
        c.registered,
        c.answered_problems,
        c.answers,
        esc(&r.answers_dir.display().to_string()),
        c.evaluated,
        c.refused,
        c.failed,
        c.from_store,
        c.skipped,
        esc(&r.language),
        r.wall_s
    ));
    body.push("<h2>The level</h2><table>".into());
    body.push(head(&NUMBERS_HEADER));
    let numeric = [false, false, true, true, true, true, true];
    for (title, view) in [
        ("KernelBench's numbers", &r.summary.kernelbench),
        ("kiln's stricter view (ok only)", &r.summary.kiln),
    ] {
        for cells in view_rows(title, view) {
            let class = if cells[0].starts_with("  ") {
                "sub"
            } else {
                "view"
            };
            body.push(row(&cells, &numeric, class));
        }
    }
    body.push("</table>".into());
    body.push(format!(
        "<p><b>KernelBench-correct</b>: {}.<br><b>kiln-correct</b>: {}.</p>",
        esc(KERNELBENCH_CORRECT),
        esc(KILN_CORRECT)
    ));
    body.push("<h2>Answers</h2><table>".into());
    body.push(head(&HEADER));
    let numeric = super::table::RIGHT;
    for a in &r.answers {
        let class = if a.kiln_correct {
            "ok"
        } else if a.kernelbench_correct {
            ""
        } else {
            "bad"
        };
        body.push(row(&answer_cells(a), &numeric, class));
    }
    body.push("</table>".into());
    body.push(
        "<p class=\"muted\">* answered from kilnd's store. time: kiln's median. lifted: the \
         median of the contract candidate kiln lifted the file into (its verdict when not ok), or \
         why it was not lifted. x eager, x \
         compile: torch's median over this one. lib: library kernels' share of the GPU time. \
         KB: correct on KernelBench's inputs. kiln: ok.</p>"
            .into(),
    );
    let mut notes: Vec<String> = r.summary.notes.iter().map(|n| esc(n)).collect();
    for (note, names) in missing_baselines(r) {
        notes.push(format!(
            "baselines of <code>{}</code>: {}",
            esc(&names.join(", ")),
            esc(&note)
        ));
    }
    for p in &r.problems {
        if let Some(why) = &p.problem.not_registered {
            notes.push(format!(
                "not registered: <code>{}</code>: {}",
                esc(&p.problem.file),
                esc(why)
            ));
        }
    }
    for s in &r.skipped {
        notes.push(format!(
            "skipped: <code>{}</code>: {}",
            esc(&s.file),
            esc(&s.reason)
        ));
    }
    for a in &r.answers {
        if let Some(why) = why_not_ok(a) {
            notes.push(format!("<code>{}</code>: {}", esc(&a.file), esc(&why)));
        }
    }
    body.push("<h2>Notes</h2><ul>".into());
    body.extend(notes.into_iter().map(|n| format!("<li>{n}</li>")));
    body.push("</ul>".into());
    body.push(format!(
        "<p class=\"muted\">The arithmetic follows <code>{}</code> and <code>{}</code> of {} \
         at commit <code>{}</code>.</p>",
        esc(r.arithmetic.files[0]),
        esc(r.arithmetic.files[1]),
        esc(r.arithmetic.repository),
        esc(r.arithmetic.commit)
    ));
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>KernelBench level {} with kiln</title><style>{STYLE}</style></head>\n<body>\n{}\n\
         </body></html>\n",
        r.level,
        body.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_holds_the_table_and_fetches_nothing() {
        let page = page(&crate::kernelbench::table::tests::gpu_report());
        assert!(page.starts_with("<!DOCTYPE html>"));
        for needle in [
            "<td class=\"v\">no_own_kernels</td>",
            "<td class=\"n\">2.50x</td>",
            "KernelBench&#39;s numbers, sample 0",
            "problem_too_large",
            "423217d9fda91e0c2d67e4a43bf62f96f6d104f1",
        ] {
            assert!(page.contains(needle), "{needle:?}");
        }
        assert!(!page.contains("<script") && !page.contains("<link") && !page.contains("src="));
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            esc("<script>\"a\" & 'b'</script>"),
            "&lt;script&gt;&quot;a&quot; &amp; &#39;b&#39;&lt;/script&gt;"
        );
    }
}
