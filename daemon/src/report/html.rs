//! HTML pieces: escaping, tables, legends, and the page frame (inline CSS, system fonts, a
//! meta refresh while something is still running). Nothing is loaded from anywhere: no
//! scripts, stylesheets, fonts or images outside the page.

use std::fmt::Write;

/// Elements that load something.
const LOADING_TAGS: &[&str] = &[
    "script", "link", "img", "image", "iframe", "frame", "object", "embed", "audio", "video",
    "source", "track", "use", "base", "form", "input",
];

/// Attributes whose value is a URL.
const POINTING_ATTRS: &[&str] = &[
    "src",
    "href",
    "xlink:href",
    "srcset",
    "poster",
    "data",
    "action",
    "formaction",
    "background",
    "ping",
];

/// A tag's name and attributes (name, value), read from just after its `<`; and where
/// the tag ends.
fn tag_at(s: &str) -> (String, Vec<(String, String)>, usize) {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() && b[i] == b'/' {
        i += 1;
    }
    let start = i;
    while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'>' && b[i] != b'/' {
        i += 1;
    }
    let name = s[start..i].to_string();
    let mut attrs = Vec::new();
    loop {
        while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b'/') {
            i += 1;
        }
        if i >= b.len() || b[i] == b'>' {
            return (name, attrs, i);
        }
        let a = i;
        while i < b.len() && !b[i].is_ascii_whitespace() && !matches!(b[i], b'=' | b'>' | b'/') {
            i += 1;
        }
        let key = s[a..i].to_string();
        let mut value = String::new();
        if i < b.len() && b[i] == b'=' {
            i += 1;
            if i < b.len() && (b[i] == b'"' || b[i] == b'\'') {
                let q = b[i];
                let v = i + 1;
                i = v;
                while i < b.len() && b[i] != q {
                    i += 1;
                }
                value = s[v..i.min(b.len())].to_string();
                i = (i + 1).min(b.len());
            } else {
                let v = i;
                while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'>' {
                    i += 1;
                }
                value = s[v..i].to_string();
            }
        }
        if key.is_empty() {
            i += 1;
        } else {
            attrs.push((key, value));
        }
    }
}

/// What in `page` would make a browser fetch something: elements that load, attributes
/// whose value is a URL, `url(` in a style attribute, `url(`/`@import`/`@font-face` in a
/// stylesheet, a refresh that goes elsewhere. Text and attribute values such as titles
/// (escaped, so free of markup) are not looked at. Empty for a self-contained page.
pub fn outside_references(page: &str) -> Vec<String> {
    let lower = page.to_ascii_lowercase();
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = lower[at..].find('<') {
        let from = at + i + 1;
        let (name, attrs, len) = tag_at(&lower[from..]);
        let closing = lower[from..].starts_with('/');
        let bare = name.rsplit(':').next().unwrap_or("").to_string();
        if !closing && LOADING_TAGS.contains(&bare.as_str()) {
            found.push(format!("<{bare}>"));
        }
        for (k, v) in &attrs {
            if POINTING_ATTRS.contains(&k.as_str()) || k.ends_with(":href") {
                found.push(format!("{k}= in <{name}>"));
            }
            if k == "style" && v.contains("url(") {
                found.push(format!("url( in <{name}>"));
            }
            if name == "meta" && k == "content" && v.contains("url") {
                found.push("a refresh to another page".into());
            }
        }
        at = from + len;
        if name == "style" && !closing {
            let css = &lower[at..];
            let css = &css[..css.find("</style").unwrap_or(css.len())];
            if css.contains("url(") || css.contains("@import") || css.contains("@font-face") {
                found.push("a fetch in CSS".into());
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// `text` escaped for HTML text and attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// At most `max` characters of `text` (with `…` when cut), escaped.
pub fn esc_cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        esc(text)
    } else {
        let cut: String = text.chars().take(max).collect();
        format!("{}…", esc(&cut))
    }
}

/// A candidate id, shortened, in a `<code>` with the full id as its title.
pub fn id(full: &str) -> String {
    let short: String = full.chars().take(12).collect();
    format!("<code title=\"{}\">{}</code>", esc(full), esc(&short))
}

/// A table; `cells` are already HTML. `class` is set on the table when given.
pub fn table(class: &str, head: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::new();
    let _ = write!(out, "<table class=\"{}\"><thead><tr>", esc(class));
    for h in head {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for c in row {
            let _ = write!(out, "<td>{c}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// A table of facts: a name (plain text) and a value (HTML) per row, no header.
pub fn facts(rows: &[(&str, String)]) -> String {
    let mut out = String::from("<table class=\"facts\"><tbody>");
    for (k, v) in rows {
        let _ = write!(out, "<tr><th>{}</th><td>{v}</td></tr>", esc(k));
    }
    out.push_str("</tbody></table>");
    out
}

/// A coloured glyph (a legend swatch), with `label` after it.
pub fn swatch(glyph: &str, color: &str, label: &str) -> String {
    format!(
        "<span class=\"sw\"><span style=\"color:{}\">{}</span> {}</span>",
        esc(color),
        esc(glyph),
        esc(label)
    )
}

/// A figure: the SVG (or the reason it could not be drawn), with a caption.
pub fn figure(class: &str, svg: Result<String, String>, caption: &str) -> String {
    let inner = match svg {
        Ok(s) => s,
        Err(e) => format!("<p class=\"err\">could not draw this plot: {}</p>", esc(&e)),
    };
    format!(
        "<figure class=\"{}\">{inner}<figcaption>{caption}</figcaption></figure>",
        esc(class)
    )
}

const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;\
margin:1.5em auto;max-width:1100px;padding:0 1em;color:#222;background:#fff}\
h1{font-size:1.4em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.8em;\
border-bottom:1px solid #ddd;padding-bottom:.2em}\
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}\
td,th{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}\
th{background:#f4f4f4}table.facts th{width:12em}table.rounds{width:100%}\
figure{margin:.8em 0}figcaption{font-size:.85em;color:#555}\
svg{max-width:100%;height:auto;display:block}\
.sw{margin-right:1.1em;white-space:nowrap}.legend{font-size:.9em;margin:.3em 0}\
.err{color:#b2182b}.muted{color:#777}.good{color:#1b7a3a}.bad{color:#b2182b}\
.islands{display:flex;flex-wrap:wrap;gap:1em}\
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.92em}";

/// A whole page. With `refresh_secs`, the browser reloads it every that many seconds (a
/// page of something still running); without, it stays as it is.
pub fn page(title: &str, refresh_secs: Option<u32>, body: &str) -> String {
    let refresh = refresh_secs.map_or(String::new(), |s| {
        format!("<meta http-equiv=\"refresh\" content=\"{s}\">")
    });
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">{refresh}\
         <title>{}</title><style>{CSS}</style></head><body>\n{body}\n</body></html>\n",
        esc(title)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_refreshes_only_when_asked() {
        assert_eq!(
            esc("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
        assert_eq!(esc_cut("abcdef", 3), "abc…");
        let running = page("t", Some(5), "<p>x</p>");
        assert!(running.contains("<meta http-equiv=\"refresh\" content=\"5\">"));
        assert!(!page("t", None, "").contains("refresh"));
        let t = table("x", &["a", "b"], &[vec!["1".into(), "2".into()]]);
        assert_eq!(t.matches("<tr>").count(), 2);
        assert!(figure("f", Err("<bad>".into()), "c").contains("&lt;bad&gt;"));
        assert!(outside_references(&page("t", Some(5), "<svg></svg>")).is_empty());
        let escaped = esc("<img src=\"https://x\"> <script>");
        assert!(
            outside_references(&format!("<p>{escaped}</p>")).is_empty(),
            "text is text"
        );
        assert_eq!(
            outside_references("<IMG SRC=\"HTTPS://x\">"),
            ["<img>", "src= in <img>"]
        );
        assert_eq!(
            outside_references("<svg><use xlink:href=\"#a\"/></svg>").len(),
            2
        );
        assert_eq!(
            outside_references("<style>@import 'x.css';</style>"),
            ["a fetch in CSS"]
        );
        assert_eq!(
            outside_references("<meta http-equiv=\"refresh\" content=\"0; url=x\">"),
            ["a refresh to another page"]
        );
        assert_eq!(
            outside_references("<div style=\"background:url(x)\">"),
            ["url( in <div>"]
        );
        let titled = format!("<code title=\"{}\">x</code>", esc("<img src=https://x>"));
        assert!(outside_references(&titled).is_empty(), "a title is text");
    }
}
