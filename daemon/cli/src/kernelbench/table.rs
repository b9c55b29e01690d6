//! The run's document as text for people: one table of answers, the level's numbers under
//! both views, then what a reader must know (notes, problems not registered, files
//! skipped, answers refused or failed). Cells are shared with the HTML page.

use super::records::{Answer, Status};
use super::score::Speed;
use super::summary::{Numbers, Report, View};

/// The answers table's header.
pub const HEADER: [&str; 12] = [
    "answer",
    "problem",
    "verdict",
    "trust",
    "time",
    "lifted",
    "x eager",
    "x compile",
    "tier",
    "lib",
    "KB",
    "kiln",
];

/// Columns aligned right (numbers).
pub const RIGHT: [bool; 12] = [
    false, false, false, false, true, false, true, true, false, true, false, false,
];

/// One answer's cells, in [`HEADER`]'s order.
pub fn answer_cells(a: &Answer) -> [String; 12] {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let verdict = match a.status {
        Status::Evaluated => opt(&a.verdict),
        Status::Refused => "refused".into(),
        Status::Failed => "failed".into(),
    };
    let yes = |b: bool| (if b { "yes" } else { "no" }).to_string();
    let file = if a.from_store {
        format!("{} *", a.file)
    } else {
        a.file.clone()
    };
    [
        file,
        a.problem.clone(),
        verdict,
        opt(&a.trust),
        a.median_us.map_or("-".into(), crate::output::fmt_us),
        lifted_cell(a),
        times(a.speedup_eager),
        times(a.speedup_compile),
        opt(&a.tier),
        a.library_fraction
            .map_or("-".into(), |f| format!("{:.0} %", 100.0 * f)),
        yes(a.kernelbench_correct),
        yes(a.kiln_correct),
    ]
}

/// What lifting a hosted answer came to: the lifted candidate's median and verdict (`ok`
/// alone for the time), or `no: CODE`; `-` when nothing was tried.
fn lifted_cell(a: &Answer) -> String {
    match (&a.lift, a.lifted_median_us) {
        (Some(v), Some(t)) if v == "ok" => crate::output::fmt_us(t),
        (Some(v), Some(t)) => format!("{} {v}", crate::output::fmt_us(t)),
        (Some(v), None) => v.clone(),
        (None, _) => "-".into(),
    }
}

/// Each reason a baseline is missing, with the problems it is missing for.
pub fn missing_baselines(r: &Report) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for p in &r.problems {
        let Some(note) = p.baselines.as_ref().and_then(|b| b.note.as_ref()) else {
            continue;
        };
        let name = p
            .problem
            .name
            .clone()
            .unwrap_or_else(|| p.problem.file.clone());
        match out.iter_mut().find(|(n, _)| n == note) {
            Some((_, names)) => names.push(name),
            None => out.push((note.clone(), vec![name])),
        }
    }
    out
}

/// Why an answer is not `ok`, in a line: refused or failed and why, or its verdict, the
/// trial that decided it and its message (cut to a readable length).
pub fn why_not_ok(a: &Answer) -> Option<String> {
    let cut = |s: &str| {
        if s.chars().count() > 240 {
            format!("{}…", s.chars().take(240).collect::<String>())
        } else {
            s.to_string()
        }
    };
    match (a.status, a.verdict.as_deref()) {
        (Status::Refused, _) => Some(format!(
            "refused: {}",
            cut(a.reason.as_deref().unwrap_or(""))
        )),
        (Status::Failed, _) => Some(format!(
            "failed: {}",
            cut(a.reason.as_deref().unwrap_or(""))
        )),
        (Status::Evaluated, Some("ok")) => None,
        (Status::Evaluated, verdict) => Some(format!(
            "{}: {}",
            verdict.unwrap_or("-"),
            cut(a.message.as_deref().unwrap_or(""))
        )),
    }
}

/// A speedup, `1.52x`.
pub fn times(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{s:.2}x"))
}

/// A rate as a percentage.
pub fn percent(v: Option<f64>) -> String {
    v.map_or("-".into(), |r| format!("{:.1} %", 100.0 * r))
}

/// The numbers' header.
pub const NUMBERS_HEADER: [&str; 7] = [
    "", "correct", "fast_0", "fast_1", "fast_1.5", "fast_2", "geomean",
];

/// The rows of one view: its correctness row, then one row per baseline.
pub fn view_rows(title: &str, v: &View) -> Vec<[String; 7]> {
    let mut rows = numbers_rows(&format!("{title}, sample 0"), &v.first_sample);
    if let Some(best) = &v.best_of_samples {
        rows.extend(numbers_rows(&format!("{title}, best of samples"), best));
    }
    rows
}

fn numbers_rows(title: &str, n: &Numbers) -> Vec<[String; 7]> {
    let c = &n.correctness;
    let blank = || String::new();
    let mut rows = vec![[
        title.to_string(),
        format!("{}/{}  {}", c.correct, c.problems, percent(c.rate)),
        blank(),
        blank(),
        blank(),
        blank(),
        blank(),
    ]];
    for (name, s) in [
        ("vs torch eager (hosted, same harness)", &n.vs_eager),
        ("vs torch.compile (hosted, same harness)", &n.vs_compile),
        ("vs torch eager (in process)", &n.vs_eager_in_process),
        ("vs torch.compile (in process)", &n.vs_compile_in_process),
    ] {
        rows.push(speed_row(name, s));
    }
    rows
}

fn speed_row(name: &str, s: &Speed) -> [String; 7] {
    let f = |i: usize| s.fast_p.get(i).map_or("-".into(), |f| percent(f.value));
    let geomean = match s.geomean_speedup {
        Some(g) => format!("{} (of {})", times(Some(g)), s.geomean_of),
        None => "-".into(),
    };
    let mut label = format!("  {name}");
    if s.fast_p.iter().all(|f| f.value.is_none()) {
        label.push_str(": no baseline times");
        return [
            label,
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ];
    }
    if s.missing_baseline > 0 {
        label.push_str(&format!(" ({} without a baseline)", s.missing_baseline));
    }
    [label, String::new(), f(0), f(1), f(2), f(3), geomean]
}

/// Rows laid out in columns (`right`: which align right), two spaces apart.
fn layout<const N: usize>(header: [&str; N], rows: &[[String; N]], right: [bool; N]) -> String {
    let mut width = header.map(|h| h.chars().count());
    for r in rows {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let pad = " ".repeat(width[i] - c.chars().count());
                if right[i] {
                    format!("{pad}{c}")
                } else {
                    format!("{c}{pad}")
                }
            })
            .collect();
        parts.join("  ").trim_end().to_string()
    };
    let mut out = vec![line(&header.map(str::to_string))];
    out.extend(rows.iter().map(|r| line(r)));
    out.join("\n")
}

/// The whole report as text.
pub fn render(r: &Report) -> String {
    let c = &r.summary.counts;
    let mut out = Vec::new();
    out.push(format!(
        "KernelBench level {}: {} problems, {} registered; {} answered by {} answers \
         ({} evaluated, {} refused, {} failed); {} answered from kilnd's store; {} file(s) \
         skipped; tolerance atol {} rtol {}; {:.0} s",
        r.level,
        c.level_problems,
        c.registered,
        c.answered_problems,
        c.answers,
        c.evaluated,
        c.refused,
        c.failed,
        c.from_store,
        c.skipped,
        r.tolerance.atol,
        r.tolerance.rtol,
        r.wall_s
    ));
    out.push(String::new());
    let rows: Vec<[String; 12]> = r.answers.iter().map(answer_cells).collect();
    out.push(layout(HEADER, &rows, RIGHT));
    out.push(
        "(* answered from kilnd's store; time: kiln's median; x eager, x compile: torch's \
         median / this one; lib: library kernels' share of the GPU time; KB: correct on \
         KernelBench's inputs; kiln: ok)"
            .into(),
    );
    out.push(String::new());
    let mut rows = view_rows("KernelBench's numbers", &r.summary.kernelbench);
    rows.extend(view_rows("kiln's stricter view (ok only)", &r.summary.kiln));
    out.push(layout(
        NUMBERS_HEADER,
        &rows,
        [false, false, true, true, true, true, true],
    ));
    out.push(String::new());
    out.push(format!(
        "KernelBench-correct: {}.",
        super::summary::KERNELBENCH_CORRECT
    ));
    out.push(format!("kiln-correct: {}.", super::summary::KILN_CORRECT));
    for n in &r.summary.notes {
        out.push(format!("note: {n}."));
    }
    for (note, names) in missing_baselines(r) {
        out.push(format!("baselines of {}: {note}", names.join(", ")));
    }
    for p in &r.problems {
        if let Some(why) = &p.problem.not_registered {
            out.push(format!("not registered: {}: {why}", p.problem.file));
        }
    }
    for s in &r.skipped {
        out.push(format!("skipped: {}: {}", s.file, s.reason));
    }
    for a in &r.answers {
        out.extend(why_not_ok(a).map(|why| format!("{}: {why}", a.file)));
    }
    out.join("\n")
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::kernelbench::level::Problem;
    use crate::kernelbench::records::{Baselines, Identity};
    use crate::kernelbench::summary;

    /// A run on a GPU as a report: problem 1 answered by a fast own kernel, problem 2 by
    /// the reference renamed, problem 3 too large to register.
    pub(crate) fn gpu_report() -> Report {
        let problem = |id: u64, name: &str, why: Option<&str>| Problem {
            id,
            file: format!("{id}_P.py"),
            name: Some(name.into()),
            dir: None,
            not_registered: why.map(str::to_string),
        };
        let problems = vec![
            problem(1, "kb-l1-1-p", None),
            problem(2, "kb-l1-2-p", None),
            problem(
                3,
                "kb-l1-3-p",
                Some("kilnd refused it (problem_too_large): 150 GiB"),
            ),
        ];
        let answer = |id: u64, verdict: &str, t: f64, lib: f64| {
            let who = Identity {
                file: format!("level_1_problem_{id}_sample_0_kernel.py"),
                problem_id: id,
                problem: format!("kb-l1-{id}-p"),
                sample: Some(0),
            };
            let record = serde_json::json!({"id": "x", "evaluation": {
                "verdict": verdict, "trust": "hosted", "tier": "fp32-faithful",
                "timing": {"median_us": t},
                "evidence": {"trials_run": 4, "trials_passed": 4},
                "telemetry": {"hosted": {"library_fraction": lib}}}});
            Answer::from_record(&who, &record, id == 2)
        };
        let mut baselines = BTreeMap::new();
        for n in ["kb-l1-1-p", "kb-l1-2-p"] {
            baselines.insert(
                n.to_string(),
                Baselines {
                    eager_us: Some(100.0),
                    compile_us: Some(80.0),
                    eager_in_process_us: Some(50.0),
                    compile_in_process_us: Some(40.0),
                    note: None,
                },
            );
        }
        let answers: Vec<Answer> = vec![
            answer(1, "ok", 40.0, 0.1),
            answer(2, "no_own_kernels", 100.0, 1.0),
        ]
        .into_iter()
        .map(|a| {
            let b = baselines[&a.problem].clone();
            a.with_baselines(&b)
        })
        .collect();
        let summary = summary::summarize(&problems, &answers, &baselines, 0);
        Report {
            level: 1,
            problems_dir: "KernelBench/level1".into(),
            answers_dir: "runs/r".into(),
            state_dir: "runs/r/.kiln-kernelbench/level1".into(),
            language: "modelnew".into(),
            tolerance: kiln_types::kernelbench::KERNELBENCH_TOLERANCE,
            arithmetic: summary::PROVENANCE,
            problems: summary::problem_lines(&problems, &answers, &baselines),
            answers,
            skipped: Vec::new(),
            summary,
            wall_s: 12.0,
        }
    }

    #[test]
    fn a_gpu_run_reads_as_a_table() {
        let text = render(&gpu_report());
        let lines: Vec<&str> = text.lines().collect();
        let row = |needle: &str| {
            lines
                .iter()
                .find(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("{needle:?} in\n{text}"))
                .to_string()
        };
        let first = row("level_1_problem_1_sample_0_kernel.py");
        for cell in [
            "ok",
            "hosted",
            "40.00 µs",
            "2.50x",
            "2.00x",
            "10 %",
            "yes  yes",
        ] {
            assert!(first.contains(cell), "{cell:?} in {first}");
        }
        let second = row("level_1_problem_2_sample_0_kernel.py *");
        assert!(
            second.contains("no_own_kernels") && second.contains("1.00x"),
            "{second}"
        );
        assert!(
            second.contains("0.80x") && second.contains("yes  no"),
            "{second}"
        );
        // KernelBench: 2 of 2 correct, fast_1 vs eager 1/2 (exactly 1x does not count),
        // geomean sqrt(2.5 * 1) over 2; kiln: 1 of 2.
        let kb = row("KernelBench's numbers, sample 0");
        assert!(kb.contains("2/2  100.0 %"), "{kb}");
        let eager = lines
            .iter()
            .find(|l| l.trim_start().starts_with("vs torch eager"))
            .expect("eager row");
        let words = eager.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            words.contains("100.0 % 50.0 % 50.0 % 50.0 % 1.58x (of 2)"),
            "{eager}"
        );
        assert!(row("kiln's stricter view (ok only), sample 0").contains("1/2  50.0 %"));
        assert!(row("not registered: 3_P.py").contains("problem_too_large"));
        assert!(!text.contains("best of samples"), "one sample per problem");
        assert!(text.contains("1 answered from kilnd's store"), "{text}");
    }

    #[test]
    fn columns_line_up_and_numbers_align_right() {
        let rows = [
            ["a".to_string(), "1.5x".to_string()],
            ["longer".to_string(), "10.25x".to_string()],
        ];
        let text = layout(["name", "x"], &rows, [false, true]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "name         x");
        assert_eq!(lines[1], "a         1.5x");
        assert_eq!(lines[2], "longer  10.25x");
        assert_eq!(percent(Some(0.3333)), "33.3 %");
        assert_eq!(times(None), "-");
    }
}
