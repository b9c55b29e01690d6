//! Reports of a real search: the README's main job (a hill-climb search on the host
//! backend through a real kilnd), its page from `GET /v1/searches/{id}/report` and from
//! `kiln search report`, a candidate's page from `kiln show ID --report`, both rendered by
//! headless Chromium into screenshots that must show the plots (coloured pixels where a
//! blank render has none) with no console message.
//!
//! Chromium is Debian's package (`apt-get install chromium`; `.ci/run` installs it). Where
//! it is missing the rendering step is skipped with the reason printed; the pages are
//! still checked. `KILN_CHROMIUM` names another binary. With `KILN_REPORT_OUT=DIR` the
//! pages and screenshots are also copied there (how docs/report-*.png are made).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, register, repo_root};
use kiln_daemon::client::Client;
use serde_json::{Value, json};

/// Runs the `kiln` CLI against the daemon; its stdout, stderr and success.
fn kiln(d: &Daemon, args: &[&str]) -> (String, String, bool) {
    let out = Command::new(common::kiln_cli())
        .arg("--socket")
        .arg(&d.socket)
        .args(args)
        .output()
        .expect("run kiln");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

/// Asserts that a page loads nothing: no URL, script, linked file or CSS import.
fn assert_self_contained(page: &str) {
    let found = kiln_daemon::report::html::outside_references(page);
    assert!(
        found.is_empty(),
        "the page refers outside itself: {found:?}"
    );
}

/// The Chromium binary, or why there is none.
fn chromium() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("KILN_CHROMIUM") {
        return Ok(PathBuf::from(p));
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        let found = std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|d| d.join(name))
            .find(|p| p.is_file());
        if let Some(p) = found {
            return Ok(p);
        }
    }
    Err("no chromium on PATH (apt-get install chromium; .ci/run installs it)".into())
}

/// What a screenshot showed.
#[derive(Debug)]
struct Shot {
    /// Pixels that are clearly coloured (not white, grey or black): plot marks and lines.
    coloured: usize,
    /// Pixels of the best-so-far line's blue.
    best_blue: usize,
    /// Pixels of the `ok` points' green.
    ok_green: usize,
    /// Console lines Chromium printed.
    console: Vec<String>,
}

/// Renders `page` with headless Chromium (no network: every host name resolves to
/// nothing) into `png`, and reads the screenshot back.
fn render(chrome: &Path, page: &Path, png: &Path, height: u32) -> Shot {
    let profile = tempfile::tempdir().expect("profile dir");
    let out = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--window-size=1100,{height}"))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && png.is_file(),
        "chromium failed ({}): {stderr}",
        out.status
    );
    let console = stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE") || l.contains("Failed to load resource"))
        .map(str::to_string)
        .collect();
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(png).expect("open screenshot"),
    ));
    let mut reader = decoder.read_info().expect("png header");
    let mut buf = vec![0; reader.output_buffer_size().expect("png size")];
    let info = reader.next_frame(&mut buf).expect("png frame");
    let channels = info.color_type.samples();
    let mut shot = Shot {
        coloured: 0,
        best_blue: 0,
        ok_green: 0,
        console,
    };
    for px in buf[..info.buffer_size()].chunks(channels) {
        let (r, g, b) = (i32::from(px[0]), i32::from(px[1]), i32::from(px[2]));
        let (hi, lo) = (r.max(g).max(b), r.min(g).min(b));
        if hi - lo > 60 {
            shot.coloured += 1;
        }
        let near = |c: (i32, i32, i32)| (r - c.0).abs() + (g - c.1).abs() + (b - c.2).abs() < 60;
        if near((0x1f, 0x4e, 0x9c)) {
            shot.best_blue += 1;
        }
        if near((0x1b, 0x9e, 0x45)) {
            shot.ok_green += 1;
        }
    }
    shot
}

fn keep(from: &Path, name: &str) {
    if let Ok(dir) = std::env::var("KILN_REPORT_OUT") {
        let to = Path::new(&dir).join(name);
        std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copy to {}: {e}", to.display()));
        eprintln!("kept {}", to.display());
    }
}

async fn wait_end(c: &Client, id: &str) -> Value {
    let t0 = Instant::now();
    loop {
        let s = c.get(&format!("/v1/searches/{id}")).await.expect("search");
        if s["state"] != "running" {
            return s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(420),
            "still running: {s}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Shapes drawn in `css` (`#rrggbb`) as a fill or a stroke.
fn marks(page: &str, css: &str) -> usize {
    let up = css.to_uppercase();
    page.matches(&format!("fill=\"{up}\"")).count()
        + page.matches(&format!("stroke=\"{up}\"")).count()
}

#[test]
fn report_of_a_real_search_renders_in_chromium() {
    common::build_search_tools(&["kiln-hill-climb"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let d = Daemon::start_with_config(&common::search_config(""));
    let c = d.client();
    let dir = tempfile::tempdir().expect("tempdir");
    let id = rt.block_on(async {
        register(&c, &repo_root().join("problems/softmax-256x4096")).await;
        let (status, v) = c
            .post(
                "/v1/searches",
                &json!({"problem": "softmax-256x4096", "proposer": "hill-climb", "budget": 14,
                        "seed": 7, "time_limit_secs": 600,
                        "config": {"mode": "offline", "neighbours": 4, "restart_after": 4}}),
            )
            .await
            .expect("start");
        assert_eq!(status, 201, "{v}");
        let id = v["id"].as_str().expect("id").to_string();
        // While it runs, the page reloads itself.
        let before = c.get(&format!("/v1/searches/{id}")).await.expect("search");
        let page = c
            .get_text(&format!("/v1/searches/{id}/report"))
            .await
            .expect("report while running");
        let after = c.get(&format!("/v1/searches/{id}")).await.expect("search");
        if before["state"] == "running" && after["state"] == "running" {
            assert!(
                page.contains("http-equiv=\"refresh\""),
                "a running search's page refreshes"
            );
        } else {
            eprintln!("the search ended before its first page was read; refresh not checked here");
        }
        id
    });
    let search = rt.block_on(wait_end(&c, &id));
    assert_eq!(search["state"], "done", "{search}");

    // The CLI writes the same page the API serves.
    let html = dir.path().join("report.html");
    let (_, err, ok) = kiln(
        &d,
        &[
            "search",
            "report",
            &id,
            "--out",
            html.to_str().expect("path"),
        ],
    );
    assert!(ok, "kiln search report: {err}");
    let page = std::fs::read_to_string(&html).expect("read report");
    assert_self_contained(&page);
    assert!(!page.contains("://"), "no URL at all");
    assert!(
        !page.contains("http-equiv"),
        "an ended search's page does not refresh"
    );
    assert!(page.len() < 2 << 20);
    let (stdout, _, ok) = kiln(&d, &["search", "report", &id]);
    assert!(ok && stdout.contains("<svg"), "report to stdout");

    // Every finished evaluation of the archive is drawn: ok ones in the two time plots
    // and the verdict strip.
    let archive = rt
        .block_on(c.get(&format!("/v1/searches/{id}/archive")))
        .expect("archive");
    let entries = archive["entries"].as_array().cloned().unwrap_or_default();
    let ok = entries
        .iter()
        .filter(|e| {
            e["evaluation"]["verdict"] == "ok" && e["evaluation"]["timing"]["raced_out"] != true
        })
        .count();
    assert!(ok >= 2, "{archive}");
    assert_eq!(
        marks(&page, "#1b9e45"),
        3 * ok,
        "one ok point per plot and evaluation"
    );
    assert_eq!(
        page.matches("<svg").count(),
        3,
        "two time plots and the verdict strip"
    );
    assert!(page.contains(">\nseed "), "the seed's line");
    assert!(page.contains(">\nbest so far"));
    assert!(page.contains("Lineage of the best kernel"));
    assert!(page.contains("Rounds (hill-climb, offline mode)"));
    let best = search["summary"]["best"]
        .as_str()
        .expect("best")
        .to_string();
    assert!(page.contains(&format!("title=\"{best}\"")));

    // The best candidate's page: its samples, no GPU telemetry on the host, its trials.
    let cand = dir.path().join("candidate.html");
    let (_, err, ok) = kiln(
        &d,
        &[
            "show",
            &best,
            "--report",
            "--out",
            cand.to_str().expect("path"),
        ],
    );
    assert!(ok, "kiln show --report: {err}");
    let cpage = std::fs::read_to_string(&cand).expect("read candidate report");
    assert_self_contained(&cpage);
    assert_eq!(cpage.matches("<svg").count(), 1, "the samples histogram");
    assert!(cpage.contains("No GPU telemetry: the host backend reports none"));
    assert!(cpage.contains("Trials and errors"));
    // Unknown ids are errors, not pages.
    let (_, err, ok) = kiln(&d, &["search", "report", "s-nosuchsearch"]);
    assert!(!ok && err.contains("404"), "{err}");
    let (_, err, ok) = kiln(&d, &["show", "nosuch", "--report"]);
    assert!(!ok && err.contains("404"), "{err}");
    keep(&html, "report.html");
    keep(&cand, "candidate.html");

    let chrome = match chromium() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIPPED the headless Chromium render: {why}");
            return;
        }
    };
    let blank = dir.path().join("blank.html");
    std::fs::write(&blank, "<!DOCTYPE html><html><body></body></html>").expect("blank");
    let b = render(&chrome, &blank, &dir.path().join("blank.png"), 2200);
    assert_eq!(b.coloured, 0, "a blank page has no coloured pixel: {b:?}");
    let shot_png = dir.path().join("report.png");
    let s = render(&chrome, &html, &shot_png, 2200);
    eprintln!("search report screenshot: {s:?}");
    assert!(s.console.is_empty(), "console messages: {:?}", s.console);
    assert!(s.coloured > 5000, "the plots are drawn: {s:?}");
    assert!(s.best_blue > 300, "the best-so-far line is drawn: {s:?}");
    assert!(s.ok_green > 100, "the ok points are drawn: {s:?}");
    keep(&shot_png, "report.png");
    let cand_png = dir.path().join("candidate.png");
    let cs = render(&chrome, &cand, &cand_png, 1400);
    eprintln!("candidate report screenshot: {cs:?}");
    assert!(cs.console.is_empty(), "console messages: {:?}", cs.console);
    assert!(cs.coloured > 3000, "the histogram's bars are drawn: {cs:?}");
    keep(&cand_png, "candidate.png");
}
