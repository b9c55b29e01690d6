//! The pages whose commands and requests the docs tests check, and a page split into its
//! fenced blocks and its prose. Shared (by `#[path]`) by kiln-cli's `docs_commands` test
//! (every `kiln` command parses) and kilnd's `docs_routes` test (every route is served).

use std::path::Path;

/// The pages checked, relative to the repository root; `DIR/*.md` is every page of DIR.
pub const PAGES: &[&str] = &[
    "README.md",
    "docs/*.md",
    "problems/README.md",
    "sdk/python/README.md",
    "daemon/packaging/*.md",
];

/// Fenced-block languages read as shell.
pub const SHELL: &[&str] = &["sh", "bash", "shell", "console", "zsh", "shell-session"];

/// The pages of [`PAGES`], relative to `root`, in a stable order.
pub fn pages(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for p in PAGES {
        match p.strip_suffix("/*.md") {
            Some(dir) => {
                let mut found: Vec<String> = std::fs::read_dir(root.join(dir))
                    .unwrap_or_else(|e| panic!("cannot list {dir}: {e}"))
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.ends_with(".md"))
                    .map(|n| format!("{dir}/{n}"))
                    .collect();
                found.sort();
                out.extend(found);
            }
            None => out.push((*p).to_string()),
        }
    }
    out
}

/// A fenced block of a page.
pub struct Block {
    /// Its language (the info string's first word).
    pub lang: String,
    /// The page line (1-based) of its first line of text.
    pub first: usize,
    /// Its text, a newline after every line.
    pub body: String,
}

impl Block {
    /// Whether it is read as shell.
    pub fn is_shell(&self) -> bool {
        SHELL.contains(&self.lang.as_str())
    }
}

/// `text` (a Markdown page) as its fenced blocks and its prose: the page with every
/// fenced block's lines blanked, so that prose line numbers stay the page's.
pub fn split(text: &str) -> (Vec<Block>, String) {
    let mut blocks = Vec::new();
    let mut prose = String::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start();
        let is_fence = fence.starts_with("```") || fence.starts_with("~~~");
        match (&mut open, is_fence) {
            (None, true) => {
                let info = fence.trim_start_matches(['`', '~']).trim();
                let lang = info.split([' ', ',', '{']).next().unwrap_or("");
                open = Some(Block {
                    lang: lang.to_string(),
                    first: i + 2,
                    body: String::new(),
                });
            }
            (Some(_), true) => blocks.extend(open.take()),
            (Some(b), false) => {
                b.body.push_str(line);
                b.body.push('\n');
            }
            (None, false) => prose.push_str(line),
        }
        prose.push('\n');
    }
    (blocks, prose)
}
