//! Docs whose commands cannot go stale: every `kiln …` command line that the README and
//! the docs show — in shell code blocks, and in inline `kiln …` code spans — parses with
//! the CLI's own clap definition ([`crate::Args`]). Test-only (`cargo test -p kiln-cli`).
//!
//! Shell blocks are read the way a shell would split them: line continuations, comments,
//! quotes, pipes and `&&`/`;`, `$(…)` and backticks (their inside is read as commands
//! too), redirections, here-documents, environment-variable prefixes and `sudo`. A block
//! command must parse completely. An inline span is often a fragment (`kiln show ID
//! --report [--out FILE]`, `kiln problems baseline|show`): brackets are dropped, `a|b`
//! gives one command per alternative, and a span may leave out required arguments or the
//! subcommand — but every word it does give must be one the CLI takes. Placeholders
//! (`ID`, `<id>`, `$ID`, `$(…)`, `N`, `3f9c…`) stand for a value.

use std::path::{Path, PathBuf};

use clap::Parser;
use clap::error::ErrorKind;

use crate::Args;

#[path = "../../tests/common/doc_pages.rs"]
mod doc_pages;

use doc_pages::pages;

/// The value a placeholder stands for: it parses as a name, a path and a number.
const PLACEHOLDER: &str = "1";

/// One `kiln` command a page shows.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DocCommand {
    /// The page's line the command starts on (1-based).
    line: usize,
    /// The words after `kiln`, placeholders replaced.
    args: Vec<String>,
    /// From an inline span (a fragment: required arguments may be left out).
    inline: bool,
}

impl DocCommand {
    fn shown(&self) -> String {
        format!("kiln {}", self.args.join(" "))
    }
}

/// The repository's root.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `kiln` command `text` (a Markdown page) shows.
fn extract(text: &str) -> Vec<DocCommand> {
    let (blocks, prose) = doc_pages::split(text);
    let mut out: Vec<DocCommand> = blocks
        .iter()
        .filter(|b| b.is_shell())
        .flat_map(|b| shell_commands(&b.body, b.first, b.lang == "console"))
        .collect();
    out.extend(inline_commands(&prose));
    out.sort_by_key(|c| c.line);
    out
}

/// The shell reader's state.
#[derive(Default)]
struct Lexed {
    /// The simple commands read so far: first line, words.
    commands: Vec<(usize, Vec<String>)>,
    /// The words of the command being read, and the word being read.
    words: Vec<String>,
    word: Option<String>,
    /// The line the command being read started on.
    start: usize,
    /// The next word is a redirection's target, not an argument.
    skip_word: bool,
}

impl Lexed {
    fn end_word(&mut self) {
        if let Some(w) = self.word.take() {
            if std::mem::take(&mut self.skip_word) {
                return;
            }
            self.words.push(w);
        }
    }

    fn end_command(&mut self, line: usize) {
        self.end_word();
        if !self.words.is_empty() {
            self.commands
                .push((self.start, std::mem::take(&mut self.words)));
        }
        self.skip_word = false;
        self.start = line;
    }

    /// Starts a word (an empty one for `''`) if none is open.
    fn begin(&mut self, line: usize) -> &mut String {
        if self.word.is_none() && self.words.is_empty() {
            self.start = line;
        }
        self.word.get_or_insert_with(String::new)
    }

    fn push(&mut self, c: char, line: usize) {
        self.begin(line).push(c);
    }

    fn push_str(&mut self, s: &str, line: usize) {
        for c in s.chars() {
            self.push(c, line);
        }
    }
}

/// The simple commands (first line, words) of shell text starting at line `first`. The
/// inside of `$(…)` and of backticks is read as commands of its own and stands as a
/// placeholder in its word. A `console` block's commands are its `$ ` lines.
fn shell_words(text: &str, first: usize, console: bool) -> Vec<(usize, Vec<String>)> {
    let chars: Vec<char> = text.chars().collect();
    let mut lx = Lexed {
        start: first,
        ..Lexed::default()
    };
    let mut line = first;
    let mut heredoc: Option<String> = None;
    let mut at_line_start = true;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if at_line_start {
            // A `$ ` prompt is dropped; in a console block, lines without one are output.
            let rest: String = chars[i..].iter().take_while(|&&c| c != '\n').collect();
            match rest.trim_start().strip_prefix("$ ") {
                Some(cmd) => i += rest.chars().count() - cmd.chars().count(),
                None if console => {
                    i += rest.chars().count() + 1;
                    line += 1;
                    continue;
                }
                None => {}
            }
            at_line_start = false;
            continue;
        }
        match c {
            '\n' => {
                lx.end_command(line + 1);
                line += 1;
                at_line_start = true;
                if let Some(delim) = heredoc.take() {
                    // Skip the here-document's body, through its delimiter line.
                    while i + 1 < chars.len() {
                        let rest: String =
                            chars[i + 1..].iter().take_while(|&&c| c != '\n').collect();
                        i += rest.chars().count() + 1;
                        line += 1;
                        if rest.trim() == delim {
                            break;
                        }
                    }
                    lx.start = line;
                }
            }
            ' ' | '\t' => lx.end_word(),
            '\\' if chars.get(i + 1) == Some(&'\n') => {
                i += 1;
                line += 1;
            }
            '\\' => {
                if let Some(&n) = chars.get(i + 1) {
                    lx.push(n, line);
                    i += 1;
                }
            }
            '#' if lx.word.is_none() => {
                while i + 1 < chars.len() && chars[i + 1] != '\n' {
                    i += 1;
                }
            }
            '\'' => {
                lx.begin(line);
                while i + 1 < chars.len() && chars[i + 1] != '\'' {
                    i += 1;
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    lx.push(chars[i], line);
                }
                i += 1;
            }
            '"' => {
                lx.begin(line);
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    match chars[i] {
                        '\\' if i + 1 < chars.len() => {
                            i += 1;
                            lx.push(chars[i], line);
                        }
                        '$' | '`' => {
                            let (end, inner) = substitution(&chars, i);
                            lx.commands.extend(shell_words(&inner, line, false));
                            lx.push_str(PLACEHOLDER, line);
                            line += inner.matches('\n').count();
                            i = end;
                            continue;
                        }
                        '\n' => {
                            line += 1;
                            lx.push('\n', line);
                        }
                        other => lx.push(other, line),
                    }
                    i += 1;
                }
            }
            '$' | '`' => {
                let (end, inner) = substitution(&chars, i);
                lx.commands.extend(shell_words(&inner, line, false));
                lx.push_str(PLACEHOLDER, line);
                line += inner.matches('\n').count();
                i = end;
                continue;
            }
            '|' | ';' | '&' | '(' | ')' => {
                // `2>&1` was taken with its `>`; here `&`, `&&`, `|`, `||`, `;` end a command.
                lx.end_command(line);
                while matches!(chars.get(i + 1), Some('|' | '&')) {
                    i += 1;
                }
            }
            '<' | '>' => {
                // `<id>` is a placeholder; otherwise a redirection, its target skipped.
                let name: String = chars[i + 1..]
                    .iter()
                    .take_while(|c| c.is_alphanumeric() || matches!(c, '_' | '-'))
                    .collect();
                if c == '<' && !name.is_empty() && chars.get(i + 1 + name.len()) == Some(&'>') {
                    lx.push_str(PLACEHOLDER, line);
                    i += name.len() + 2;
                    continue;
                }
                if lx
                    .word
                    .as_deref()
                    .is_some_and(|w| w.chars().all(|c| c.is_ascii_digit()))
                {
                    lx.word = None; // the `2` of `2>`
                }
                lx.end_word();
                if c == '<' && chars.get(i + 1) == Some(&'<') {
                    // A here-document: its delimiter is the next word.
                    i += 1;
                    if chars.get(i + 1) == Some(&'-') {
                        i += 1;
                    }
                    let rest: String = chars[i + 1..].iter().take_while(|&&c| c != '\n').collect();
                    let delim = rest
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .trim_matches(['\'', '"']);
                    heredoc = Some(delim.to_string());
                    lx.skip_word = true;
                } else {
                    if chars.get(i + 1) == Some(&'>') {
                        i += 1;
                    }
                    if chars.get(i + 1) == Some(&'&') {
                        // `>&2`: no target word.
                        i += 1;
                        while chars.get(i + 1).is_some_and(char::is_ascii_digit) {
                            i += 1;
                        }
                    } else {
                        lx.skip_word = true;
                    }
                }
            }
            other => lx.push(other, line),
        }
        i += 1;
    }
    lx.end_command(line);
    lx.commands
}

/// At `chars[i]` (`$` or a backtick): the index after the substitution and its inside
/// (`$(…)`, `` `…` ``), or after the variable (`$ID`, `${ID}`) with no inside.
fn substitution(chars: &[char], i: usize) -> (usize, String) {
    if chars[i] == '`' {
        let end = (i + 1..chars.len())
            .find(|&j| chars[j] == '`')
            .unwrap_or(chars.len());
        return (end + 1, chars[i + 1..end].iter().collect());
    }
    match chars.get(i + 1) {
        Some('(') => {
            let (mut depth, mut j, mut quote) = (0usize, i + 1, None);
            while j < chars.len() {
                match (quote, chars[j]) {
                    (Some(q), c) if c == q => quote = None,
                    (Some(_), _) => {}
                    (None, c @ ('\'' | '"')) => quote = Some(c),
                    (None, '(') => depth += 1,
                    (None, ')') => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            let inner = chars[i + 2..j.min(chars.len())].iter().collect();
            (j + 1, inner)
        }
        Some('{') => {
            let end = (i + 1..chars.len())
                .find(|&j| chars[j] == '}')
                .unwrap_or(chars.len());
            (end + 1, String::new())
        }
        _ => {
            let mut j = i + 1;
            while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
                j += 1;
            }
            (j.max(i + 1), String::new())
        }
    }
}

/// The `kiln` commands among the simple commands of a shell block.
fn shell_commands(body: &str, first: usize, console: bool) -> Vec<DocCommand> {
    shell_words(body, first, console)
        .into_iter()
        .filter_map(|(line, words)| {
            let args = command_args(&words)?;
            Some(DocCommand {
                line,
                args: args.iter().filter_map(|w| placeholder(w)).collect(),
                inline: false,
            })
        })
        .collect()
}

/// The words after `kiln` when `words` run it: past `NAME=value` prefixes and `sudo`,
/// `env`, `time`, `exec` with their options.
fn command_args(words: &[String]) -> Option<&[String]> {
    let mut i = 0;
    loop {
        let w = words.get(i)?.as_str();
        let assignment = w.split_once('=').is_some_and(|(name, _)| {
            !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_')
        });
        if assignment {
            i += 1;
        } else if matches!(w, "sudo" | "env" | "time" | "exec" | "command" | "nohup") {
            i += 1;
            while let Some(opt) = words.get(i).filter(|o| o.starts_with('-')) {
                i += if matches!(opt.as_str(), "-u" | "-g" | "-C" | "-D") {
                    2
                } else {
                    1
                };
            }
        } else {
            let name = w.rsplit('/').next().unwrap_or(w);
            return (name == "kiln").then(|| &words[i + 1..]);
        }
    }
}

/// A word as the CLI would get it: placeholders (`ID`, `PATH.wasm`, `<id>`, `3f9c…`)
/// replaced by [`PLACEHOLDER`], an elision (`…`, `...`) dropped.
fn placeholder(word: &str) -> Option<String> {
    let w = word.trim_end_matches('…');
    if w.is_empty() || w == "..." {
        return None;
    }
    let stem = w.split('.').next().unwrap_or(w);
    let caps = stem.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && stem
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    let bracketed = w.len() > 2 && w.starts_with('<') && w.ends_with('>');
    if caps || bracketed || w.len() < word.len() {
        Some(PLACEHOLDER.to_string())
    } else {
        Some(w.to_string())
    }
}

/// `kiln …` code spans in prose (fenced blocks already blanked): a span may run over a
/// line break, not over a blank line.
fn inline_commands(prose: &str) -> Vec<DocCommand> {
    let mut out = Vec::new();
    let mut rest = prose;
    let mut line = 1;
    while let Some(open) = rest.find('`') {
        line += rest[..open].matches('\n').count();
        let ticks = rest[open..].chars().take_while(|&c| c == '`').count();
        let after = &rest[open + ticks..];
        let Some(close) = after.find(&"`".repeat(ticks)) else {
            break;
        };
        let span = &after[..close];
        if !span.contains("\n\n") {
            out.extend(span_commands(span, line));
            line += span.matches('\n').count();
            rest = &after[close + ticks..];
        } else {
            rest = after;
        }
    }
    out
}

/// The commands an inline span shows (none unless it starts `kiln WORD`).
fn span_commands(span: &str, line: usize) -> Vec<DocCommand> {
    let text = span.replace("\\|", "|");
    let mut words = text.split_whitespace();
    if words.next() != Some("kiln") {
        return Vec::new();
    }
    let words: Vec<&str> = words.collect();
    let starts_like_a_command = words.first().is_some_and(|w| {
        w.chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '-')
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '|'))
    });
    if !starts_like_a_command {
        return Vec::new();
    }
    // One command per alternative of each `a|b` word.
    let mut variants: Vec<Vec<String>> = vec![Vec::new()];
    for w in words {
        let w = w.trim_matches(['[', ']']);
        let alternatives: Vec<&str> = w.split('|').filter(|a| !a.is_empty()).collect();
        variants = variants
            .into_iter()
            .flat_map(|v| {
                alternatives.iter().map(move |a| {
                    let mut v = v.clone();
                    v.extend(placeholder(a));
                    v
                })
            })
            .collect();
    }
    variants
        .into_iter()
        .map(|args| DocCommand {
            line,
            args,
            inline: true,
        })
        .collect()
}

/// Why the CLI refuses `cmd`, or `None` when it takes it (a fragment from an inline span
/// may leave out required arguments or the subcommand).
fn refusal(cmd: &DocCommand) -> Option<String> {
    let argv = std::iter::once("kiln".to_string()).chain(cmd.args.iter().cloned());
    let err = Args::try_parse_from(argv).err()?;
    let fragment_ok = matches!(
        err.kind(),
        ErrorKind::MissingRequiredArgument
            | ErrorKind::MissingSubcommand
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) || (cmd.inline && fragment_ok)
    {
        return None;
    }
    let msg = err.render().to_string();
    Some(
        msg.lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("refused")
            .to_string(),
    )
}

#[test]
fn every_kiln_command_in_the_docs_parses() {
    let root = repo_root();
    let (mut blocks, mut spans, mut failures) = (0, 0, Vec::new());
    for page in pages(&root) {
        let text = std::fs::read_to_string(root.join(&page))
            .unwrap_or_else(|e| panic!("cannot read {page}: {e}"));
        for cmd in extract(&text) {
            if cmd.inline {
                spans += 1;
            } else {
                blocks += 1;
            }
            if let Some(why) = refusal(&cmd) {
                failures.push(format!("{page}:{}: `{}`: {why}", cmd.line, cmd.shown()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "commands in the docs that kiln refuses ({} of {}):\n{}",
        failures.len(),
        blocks + spans,
        failures.join("\n")
    );
    // Not vacuous: the pages show this many commands at least (31 in shell blocks and
    // 121 from spans when this was written).
    assert!(
        blocks >= 20 && spans >= 60,
        "{blocks} commands in blocks, {spans} in spans"
    );
}

#[test]
fn the_extractor_sees_commands_and_skips_prose() {
    let page = r#"# kiln

kiln is a daemon; `kiln` alone is its CLI and `kiln.toml` its config, `kiln ↔ ABI` a table.
Run `kiln show ID --report [--out FILE]` or `kiln problems baseline|show`, and
`kiln submit --problem
vecadd-4096 --wait` over a line break.

```sh
kiln status                 # is it up?
                            # kiln doctor in a comment
KILN_SOCKET=/tmp/k.sock kiln search start --problem p \
    --proposer hill-climb --budget 30   # continued
ID=$(kiln submit cand.json -o json | jq -r .id) && kiln show "$ID" --wait 60
sudo -u kiln sqlite3 /var/lib/kiln/kiln.db ".backup 'x'"
usermod -aG kiln alice
kiln search report <id> --out report.html 2>&1 > /dev/null
cat > cand.json <<'JSON'
kiln not-a-command
JSON
kiln show 3f9c… --report
```

```text
kiln search start ──POST /v1/searches──▶ api/searches.rs
```

```console
$ kiln watch --count 1
kiln watch: job 1 done
```
"#;
    let got: Vec<(usize, String, bool)> = extract(page)
        .into_iter()
        .map(|c| (c.line, c.shown(), c.inline))
        .collect();
    let want = [
        (4, "kiln show 1 --report --out 1", true),
        (4, "kiln problems baseline", true),
        (4, "kiln problems show", true),
        (5, "kiln submit --problem vecadd-4096 --wait", true),
        (9, "kiln status", false),
        (
            11,
            "kiln search start --problem p --proposer hill-climb --budget 30",
            false,
        ),
        (13, "kiln submit cand.json -o json", false),
        (13, "kiln show 1 --wait 60", false),
        (16, "kiln search report 1 --out report.html", false),
        (20, "kiln show 1 --report", false),
        (28, "kiln watch --count 1", false),
    ];
    let want: Vec<(usize, String, bool)> = want
        .iter()
        .map(|(l, s, i)| (*l, (*s).to_string(), *i))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn a_stale_command_is_refused_and_a_fragment_is_not() {
    let cmd = |text: &str, inline| DocCommand {
        line: 1,
        args: text.split_whitespace().map(str::to_string).collect(),
        inline,
    };
    let why = refusal(&cmd("submit --no-such-flag x.json", false)).expect("refused");
    assert!(why.contains("--no-such-flag"), "{why}");
    assert!(refusal(&cmd("frobnicate", true)).is_some());
    assert!(refusal(&cmd("bench throughput --rounds 3", true)).is_some());
    // A fragment may leave out what is required, not so a block's command.
    assert_eq!(refusal(&cmd("search start --budget 3", true)), None);
    assert!(refusal(&cmd("search start --budget 3", false)).is_some());
    assert_eq!(refusal(&cmd("bench", true)), None);
    assert_eq!(refusal(&cmd("show 1 --report --out x.html", false)), None);
}
