//! Docs whose routes cannot go stale: every `curl --unix-socket … http://…/PATH` that the
//! README and the docs show (in shell blocks, and in inline `curl …` spans), and every
//! `` `METHOD /path` `` span they name, is a route kilnd serves: sent to a real kilnd, it
//! gets neither the router's "no route" 404 nor a 405. Placeholder segments (`{id}`,
//! `3f9c…`, `<id>`, `$ID`) stand for any value, optional parts (`[?wait=SECONDS]`) and the
//! query are dropped. POST and PUT carry `{}`, which no route accepts as work to do.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

#[path = "../common/doc_pages.rs"]
mod doc_pages;

pub use doc_pages::pages;

const METHODS: &[&str] = &["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"];

/// A request a page shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocRoute {
    /// The page's line it starts on (1-based).
    pub line: usize,
    /// `GET`, `POST`, ….
    pub method: String,
    /// The path, placeholders replaced by `0`, without the query.
    pub path: String,
    /// From a `curl` command (else from a `METHOD /path` span).
    pub curl: bool,
}

/// Every request `text` (a Markdown page) shows.
pub fn extract(text: &str) -> Vec<DocRoute> {
    let (blocks, prose) = doc_pages::split(text);
    let mut out = Vec::new();
    for b in blocks.iter().filter(|b| b.is_shell()) {
        // A logical line being joined (its first line, its text), and an open here-document.
        let mut joined: Option<(usize, String)> = None;
        let mut heredoc: Option<String> = None;
        for (k, line) in b.body.lines().enumerate() {
            if let Some(delim) = &heredoc {
                if line.trim() == delim {
                    heredoc = None;
                }
                continue;
            }
            if line.trim_start().starts_with('#') {
                continue;
            }
            let (start, mut logical) = joined.take().unwrap_or((b.first + k, String::new()));
            match line.trim_end().strip_suffix('\\') {
                Some(head) => {
                    logical.push_str(head);
                    logical.push(' ');
                    joined = Some((start, logical));
                }
                None => {
                    logical.push_str(line);
                    heredoc = heredoc_delimiter(&logical);
                    out.extend(curl_routes(&words(&logical), start));
                }
            }
        }
    }
    out.extend(span_routes(&prose));
    out.sort_by_key(|r| r.line);
    out
}

/// The delimiter of a here-document `line` starts (`<<'JSON'` → `JSON`).
fn heredoc_delimiter(line: &str) -> Option<String> {
    let after = line.split_once("<<")?.1.trim_start_matches('-');
    let word = after.split_whitespace().next()?.trim_matches(['\'', '"']);
    (!word.is_empty()).then(|| word.to_string())
}

/// A command line's words as a shell splits them (quotes removed; `#` starts a comment).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => out.extend(word.take()),
            '#' if word.is_none() => break,
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                w.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => w.extend(chars.next()),
                        c => w.push(c),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(word);
    out
}

/// The requests of the `curl` commands among `words` (a command line starting at `line`).
fn curl_routes(words: &[String], line: usize) -> Vec<DocRoute> {
    let mut out = Vec::new();
    let mut rest = words;
    while let Some(at) = rest.iter().position(|w| w == "curl") {
        let args = &rest[at + 1..];
        let end = args
            .iter()
            .position(|w| matches!(w.as_str(), "|" | "||" | "&&" | ";"))
            .unwrap_or(args.len());
        let args = &args[..end];
        rest = &rest[at + 1 + end..];
        let mut method = None;
        let mut data = false;
        let mut url = None;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "-X" | "--request" => method = it.next().cloned(),
                m if m.starts_with("-X") && m.len() > 2 => method = Some(m[2..].to_string()),
                "-d" | "--data" | "--data-binary" | "--data-raw" | "--json" | "-F" | "--form" => {
                    data = true;
                }
                u if u.starts_with("http://") || u.starts_with("https://") => {
                    url = Some(u.to_string());
                }
                _ => {}
            }
        }
        let Some(url) = url else { continue };
        let method = method.unwrap_or_else(|| if data { "POST" } else { "GET" }.to_string());
        let path = url
            .split_once("://")
            .and_then(|(_, r)| r.find('/').map(|i| r[i..].to_string()))
            .unwrap_or_else(|| "/".to_string());
        out.push(DocRoute {
            line,
            method,
            path: request_path(&path),
            curl: true,
        });
    }
    out
}

/// A documented path as one to send: optional `[…]` parts, the query and the fragment
/// dropped, placeholder segments (`{id}`, `3f9c…`, `<id>`, `$ID`, `ID`) as `0`.
fn request_path(doc: &str) -> String {
    let mut plain = String::new();
    let mut depth = 0;
    for c in doc.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            c if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    let plain = plain.split(['?', '#']).next().unwrap_or("");
    plain
        .split('/')
        .map(|seg| {
            let caps = seg.starts_with(|c: char| c.is_ascii_uppercase())
                && seg
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if caps || seg.contains(['{', '…', '<', '$']) {
                "0"
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Requests named in prose code spans: `` `GET /v1/info` ``, `` `curl --unix-socket …` ``.
fn span_routes(prose: &str) -> Vec<DocRoute> {
    let mut out = Vec::new();
    let mut rest = prose;
    let mut line = 1;
    while let Some(open) = rest.find('`') {
        line += rest[..open].matches('\n').count();
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else { break };
        let span = &after[..close];
        if span.contains("\n\n") {
            rest = after;
            continue;
        }
        let text = span.replace('\n', " ");
        let w = words(&text);
        if w.first().is_some_and(|f| f == "curl") {
            out.extend(curl_routes(&w, line));
        } else if let Some((method, path)) = text.split_once(' ')
            && METHODS.contains(&method)
            && path.starts_with('/')
        {
            let path = path.split_whitespace().next().unwrap_or(path);
            out.push(DocRoute {
                line,
                method: method.to_string(),
                path: request_path(path),
                curl: false,
            });
        }
        line += span.matches('\n').count();
        rest = &after[close + 1..];
    }
    out
}

/// `Ok` when kilnd on `socket` has a route for `method path` (its answer is neither the
/// router's "no route" 404 nor a 405), else why not.
pub fn served(socket: &Path, method: &str, path: &str) -> Result<(), String> {
    let mut s = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let body = if matches!(method, "POST" | "PUT" | "PATCH") {
        "{}"
    } else {
        ""
    };
    // One write: a route that answers before reading the body (a plugin route without
    // its token) may close the connection, and the answer is still there to read.
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(request.as_bytes());
    // The status line and headers; the body only when it has a length (an event stream
    // does not end).
    let mut r = BufReader::new(s);
    let mut head = String::new();
    let mut length = 0usize;
    loop {
        let mut l = String::new();
        if r.read_line(&mut l).map_err(|e| format!("read: {e}"))? == 0 || l == "\r\n" {
            break;
        }
        if let Some((k, v)) = l.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
        head.push_str(&l);
    }
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no HTTP status in {head:?}"))?;
    let mut body = vec![0; length.min(1 << 20)];
    r.read_exact(&mut body).map_err(|e| format!("read: {e}"))?;
    let body = String::from_utf8_lossy(&body);
    if status == 405 || (status == 404 && body.contains("no route for")) {
        return Err(format!("{status} {body}"));
    }
    Ok(())
}

#[test]
fn the_route_extractor_sees_curl_and_spans_and_skips_the_rest() {
    let page = r#"# API

`GET /v1/candidates/{id}[?wait=SECONDS]` long-polls; `POST /v1/candidates?lane=1` and
`PUT|GET …/checkpoint` (a suffix only), `/v1/info` (no method) and `curl
--unix-socket /run/kiln/kiln.sock http://localhost/metrics`.

```sh
curl -s --unix-socket $SOCK http://localhost/v1/health
# curl -s --unix-socket $SOCK http://localhost/v1/commented-out
curl -s --unix-socket $SOCK -X POST http://localhost/v1/searches \
  -d '{"problem": "p"}'            # continued
curl -s --unix-socket $SOCK "http://localhost/v1/candidates/3f9c…?wait=60" | jq .
cat > cand.json <<'JSON'
curl http://localhost/v1/inside-a-heredoc
JSON
curl -s --unix-socket $SOCK --data-binary @c.json http://localhost/v1/problems/NAME/baselines
curl -s --unix-socket $SOCK "http://localhost/v1/jobs/7?wait=60"
```

```text
client ──POST /v1/candidates──▶ api/candidates.rs
```
"#;
    let got: Vec<(usize, String, String, bool)> = extract(page)
        .into_iter()
        .map(|r| (r.line, r.method, r.path, r.curl))
        .collect();
    let want = [
        (3, "GET", "/v1/candidates/0", false),
        (3, "POST", "/v1/candidates", false),
        (4, "GET", "/metrics", true),
        (8, "GET", "/v1/health", true),
        (10, "POST", "/v1/searches", true),
        (12, "GET", "/v1/candidates/0", true),
        (16, "POST", "/v1/problems/0/baselines", true),
        (17, "GET", "/v1/jobs/7", true),
    ];
    let want: Vec<(usize, String, String, bool)> = want
        .iter()
        .map(|(l, m, p, c)| (*l, (*m).to_string(), (*p).to_string(), *c))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn every_route_the_docs_show_is_served() {
    let root = crate::common::repo_root();
    let d = crate::common::Daemon::start("");
    // The check tells a route from none, and a wrong method.
    assert_eq!(served(&d.socket, "GET", "/v1/health"), Ok(()));
    assert_eq!(
        served(&d.socket, "GET", "/v1/candidates/0"),
        Ok(()),
        "a 404 of its own"
    );
    assert!(served(&d.socket, "GET", "/v1/no-such-route").is_err());
    assert!(served(&d.socket, "DELETE", "/v1/candidates").is_err());
    let (mut curls, mut spans, mut failures) = (0, 0, Vec::new());
    for page in pages(&root) {
        let text = std::fs::read_to_string(root.join(&page))
            .unwrap_or_else(|e| panic!("cannot read {page}: {e}"));
        for r in extract(&text) {
            if r.curl {
                curls += 1;
            } else {
                spans += 1;
            }
            if let Err(why) = served(&d.socket, &r.method, &r.path) {
                failures.push(format!("{page}:{}: {} {}: {why}", r.line, r.method, r.path));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "requests in the docs that kilnd has no route for:\n{}",
        failures.join("\n")
    );
    // Not vacuous: the pages show at least this many (17 curl commands and 58 spans when
    // this was written).
    assert!(
        curls >= 15 && spans >= 40,
        "{curls} curl commands, {spans} spans"
    );
}
