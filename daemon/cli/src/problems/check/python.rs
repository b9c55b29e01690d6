//! Just enough of Python's lexical structure to read a Triton source's module level:
//! tokens (names, numbers, string literals with their prefixes, operators), comments,
//! backslash continuations, brackets that span lines, and indentation. The result is the
//! module's top-level statements, each with the tokens of its first logical line (a
//! `def`'s header, say).
//!
//! What is checked is lexical (strings closed, brackets balanced, number literals, no
//! stray characters) and the indentation of every block (a block after each `:`, no other
//! indent, dedents back to an enclosing level, tabs and spaces consistent); expressions
//! and statements inside function bodies are not parsed.

/// One token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tok {
    /// An identifier or a keyword.
    Name(String),
    /// A numeric literal, as written.
    Number(String),
    /// A string literal: its prefix in lowercase (`""`, `"r"`, `"b"`, `"f"`, ...) and the
    /// text between its quotes, escapes as written.
    Str {
        /// `r`, `b`, `f`, `u` and their pairs, lowercased; empty for none.
        prefix: String,
        /// The characters between the quotes.
        body: String,
    },
    /// An operator or a delimiter.
    Op(&'static str),
}

impl Tok {
    /// True if this is the operator `op`.
    pub fn is_op(&self, op: &str) -> bool {
        matches!(self, Tok::Op(o) if *o == op)
    }

    /// True if this is the name (or keyword) `name`.
    pub fn is_name(&self, name: &str) -> bool {
        matches!(self, Tok::Name(n) if n == name)
    }
}

/// A top-level statement: its 1-based line and the tokens of its logical line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The line it starts on.
    pub line: usize,
    /// Its tokens (a compound statement's header and any body on the same line).
    pub tokens: Vec<Tok>,
}

/// A syntax error at a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Operators, longest first so that the first match is the longest.
const OPS: &[&str] = &[
    "**=", "//=", ">>=", "<<=", "...", "->", ":=", "**", "//", "==", "!=", "<=", ">=", "<<", ">>",
    "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "@=", "(", ")", "[", "]", "{", "}", ",", ":",
    ";", ".", "@", "=", "+", "-", "*", "/", "%", "&", "|", "^", "~", "<", ">", "!",
];

/// Keywords that open a compound statement (whose `;` belong to its body).
const COMPOUND: &[&str] = &[
    "def", "class", "if", "elif", "else", "for", "while", "with", "try", "except", "finally",
    "async", "match", "case",
];

/// One logical line: where it starts, its indentation's width, its tokens.
struct Logical {
    line: usize,
    /// Widths with tabs to the next multiple of 8, and with tabs as 1 (Python refuses a
    /// comparison the two disagree on).
    indent: (usize, usize),
    tokens: Vec<Tok>,
}

fn err(line: usize, message: impl Into<String>) -> SyntaxError {
    SyntaxError {
        line,
        message: message.into(),
    }
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Splits `source` into logical lines of tokens.
fn logical_lines(source: &str) -> Result<Vec<Logical>, SyntaxError> {
    // A byte order mark at the start is not part of the source.
    let chars: Vec<char> = source.trim_start_matches('\u{feff}').chars().collect();
    let mut out = Vec::new();
    let mut tokens: Vec<Tok> = Vec::new();
    // Open brackets and the lines they opened on.
    let mut open: Vec<(char, usize)> = Vec::new();
    let (mut line, mut start_line, mut indent) = (1usize, 1usize, (0usize, 0usize));
    let mut at_line_start = true;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if at_line_start && open.is_empty() && tokens.is_empty() {
            // Measure the indentation of a new logical line.
            // Python's widths: a tab to the next multiple of 8, a form feed resets.
            let mut j = i;
            indent = (0, 0);
            while let Some(&c) = chars.get(j) {
                indent = match c {
                    ' ' => (indent.0 + 1, indent.1 + 1),
                    '\t' => ((indent.0 / 8 + 1) * 8, indent.1 + 1),
                    '\x0c' => (0, 0),
                    _ => break,
                };
                j += 1;
            }
            start_line = line;
            at_line_start = false;
            i = j;
            continue;
        }
        at_line_start = false;
        match c {
            '\n' => {
                line += 1;
                at_line_start = true;
                if open.is_empty() && !tokens.is_empty() {
                    out.push(Logical {
                        line: start_line,
                        indent,
                        tokens: std::mem::take(&mut tokens),
                    });
                }
                i += 1;
            }
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '\\' => {
                // A continuation: backslash, optional carriage return, newline.
                let next = chars.get(i + 1).copied();
                let skip = match (next, chars.get(i + 2).copied()) {
                    (Some('\n'), _) => 2,
                    (Some('\r'), Some('\n')) => 3,
                    _ => return Err(err(line, "unexpected character after line continuation")),
                };
                line += 1;
                i += skip;
            }
            ' ' | '\t' | '\r' | '\x0c' => i += 1,
            '"' | '\'' => {
                let (tok, next, lines) = string(&chars, i, String::new(), line)?;
                tokens.push(tok);
                line += lines;
                i = next;
            }
            c if is_ident_start(c) => {
                let mut j = i;
                while j < chars.len() && is_ident_char(chars[j]) {
                    j += 1;
                }
                let word: String = chars[i..j].iter().collect();
                let lower = word.to_ascii_lowercase();
                let prefix = matches!(
                    lower.as_str(),
                    "r" | "u" | "b" | "f" | "br" | "rb" | "fr" | "rf"
                );
                if prefix && matches!(chars.get(j), Some('"' | '\'')) {
                    let (tok, next, lines) = string(&chars, j, lower, line)?;
                    tokens.push(tok);
                    line += lines;
                    i = next;
                } else {
                    tokens.push(Tok::Name(word));
                    i = j;
                }
            }
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                let hex = c == '0' && matches!(chars.get(i + 1), Some('x' | 'X'));
                let mut j = i + 1;
                while j < chars.len() {
                    let d = chars[j];
                    let exponent_sign =
                        matches!(d, '+' | '-') && !hex && matches!(chars[j - 1], 'e' | 'E');
                    if d.is_ascii_alphanumeric() || d == '_' || d == '.' || exponent_sign {
                        j += 1;
                    } else {
                        break;
                    }
                }
                let number: String = chars[i..j].iter().collect();
                if !valid_number(&number) {
                    return Err(err(line, format!("invalid number literal {number:?}")));
                }
                tokens.push(Tok::Number(number));
                i = j;
            }
            _ => {
                let rest: String = chars[i..chars.len().min(i + 3)].iter().collect();
                let Some(op) = OPS.iter().find(|op| rest.starts_with(**op)) else {
                    return Err(err(line, format!("invalid character {c:?}")));
                };
                match *op {
                    "(" | "[" | "{" => open.push((c, line)),
                    ")" | "]" | "}" => {
                        let want = match c {
                            ')' => '(',
                            ']' => '[',
                            _ => '{',
                        };
                        match open.pop() {
                            Some((o, _)) if o == want => {}
                            _ => return Err(err(line, format!("unmatched {c:?}"))),
                        }
                    }
                    _ => {}
                }
                tokens.push(Tok::Op(op));
                i += op.len();
            }
        }
    }
    if let Some((c, at)) = open.last() {
        return Err(err(*at, format!("{c:?} was never closed")));
    }
    if !tokens.is_empty() {
        out.push(Logical {
            line: start_line,
            indent,
            tokens,
        });
    }
    Ok(out)
}

/// True if `s` is one of Python's numeric literals: decimal (no leading zeros but for 0),
/// hexadecimal, octal or binary integers, floats with an optional exponent, imaginary
/// numbers; single underscores between digits.
fn valid_number(s: &str) -> bool {
    fn digits(t: &str, ok: fn(char) -> bool) -> bool {
        !t.is_empty()
            && !t.starts_with('_')
            && !t.ends_with('_')
            && !t.contains("__")
            && t.chars().all(|c| c == '_' || ok(c))
    }
    let dec = |c: char| c.is_ascii_digit();
    let lower = s.to_ascii_lowercase();
    for (prefix, ok) in [
        ("0x", (|c: char| c.is_ascii_hexdigit()) as fn(char) -> bool),
        ("0o", |c: char| ('0'..='7').contains(&c)),
        ("0b", |c: char| c == '0' || c == '1'),
    ] {
        if let Some(rest) = lower.strip_prefix(prefix) {
            return digits(rest.strip_prefix('_').unwrap_or(rest), ok);
        }
    }
    let (body, imaginary) = match lower.strip_suffix('j') {
        Some(b) => (b, true),
        None => (lower.as_str(), false),
    };
    let (mantissa, exponent) = match body.split_once('e') {
        Some((m, e)) => (m, Some(e.strip_prefix(['+', '-']).unwrap_or(e))),
        None => (body, None),
    };
    if exponent.is_some_and(|e| !digits(e, dec)) {
        return false;
    }
    match mantissa.split_once('.') {
        Some((int, frac)) => {
            (!int.is_empty() || !frac.is_empty())
                && (int.is_empty() || digits(int, dec))
                && (frac.is_empty() || digits(frac, dec))
        }
        None => {
            let plain_int = exponent.is_none() && !imaginary;
            digits(mantissa, dec)
                && !(plain_int
                    && mantissa.starts_with('0')
                    && mantissa.contains(|c| c != '0' && c != '_'))
        }
    }
}

/// The string literal whose opening quote is at `at`: the token, the index after it, and
/// the number of line breaks inside it.
fn string(
    chars: &[char],
    at: usize,
    prefix: String,
    line: usize,
) -> Result<(Tok, usize, usize), SyntaxError> {
    let q = chars[at];
    let triple = chars.get(at + 1) == Some(&q) && chars.get(at + 2) == Some(&q);
    let open = if triple { 3 } else { 1 };
    let mut j = at + open;
    let mut lines = 0;
    loop {
        let Some(&c) = chars.get(j) else {
            return Err(err(line, "unterminated string literal"));
        };
        if c == '\\' {
            // An escape; a backslash before a line break continues the literal.
            match (chars.get(j + 1), chars.get(j + 2)) {
                (Some('\n'), _) => (lines, j) = (lines + 1, j + 2),
                (Some('\r'), Some('\n')) => (lines, j) = (lines + 1, j + 3),
                _ => j += 2,
            }
            continue;
        }
        if c == '\n' {
            if !triple {
                return Err(err(line, "unterminated string literal"));
            }
            lines += 1;
        }
        if c == q && (!triple || (chars.get(j + 1) == Some(&q) && chars.get(j + 2) == Some(&q))) {
            let body = chars[at + open..j].iter().collect();
            return Ok((Tok::Str { prefix, body }, j + open, lines));
        }
        j += 1;
    }
}

/// True if the logical line opens a block (ends with `:`).
fn opens_block(tokens: &[Tok]) -> bool {
    tokens.last().is_some_and(|t| t.is_op(":"))
}

/// The module's top-level statements (see the module docs). The indentation of every
/// line is checked as Python does: a block after each `:`, no other indent, and each
/// dedent back to an enclosing level.
pub fn statements(source: &str) -> Result<Vec<Statement>, SyntaxError> {
    let mut out: Vec<Statement> = Vec::new();
    // The open blocks' indentation widths, and the line before (when it opens a block).
    let mut levels = vec![(0usize, 0usize)];
    let mut opener: Option<usize> = None;
    for l in logical_lines(source)? {
        let top = levels.last().copied().unwrap_or((0, 0));
        let (w, w1) = l.indent;
        let tabs = || err(l.line, "inconsistent use of tabs and spaces in indentation");
        if let Some(at) = opener.take() {
            if w <= top.0 {
                return Err(err(at, "expected an indented block"));
            }
            if w1 <= top.1 {
                return Err(tabs());
            }
            levels.push(l.indent);
        } else if w > top.0 {
            return Err(err(l.line, "unexpected indent"));
        } else {
            while levels.last().is_some_and(|&(lw, _)| lw > w) {
                levels.pop();
            }
            match levels.last() {
                Some(&(lw, _)) if lw != w => {
                    return Err(err(
                        l.line,
                        "unindent does not match any outer indentation level",
                    ));
                }
                Some(&(_, alt)) if alt != w1 => return Err(tabs()),
                _ => {}
            }
        }
        if opens_block(&l.tokens) {
            opener = Some(l.line);
        }
        if w > 0 {
            continue; // inside a block
        }
        let compound = l
            .tokens
            .first()
            .is_some_and(|t| COMPOUND.iter().any(|k| t.is_name(k)));
        if compound {
            out.push(Statement {
                line: l.line,
                tokens: l.tokens,
            });
            continue;
        }
        // Simple statements separated by `;` (the lexer only leaves them at depth 0).
        for part in l.tokens.split(|t| t.is_op(";")) {
            if !part.is_empty() {
                out.push(Statement {
                    line: l.line,
                    tokens: part.to_vec(),
                });
            }
        }
    }
    if let Some(at) = opener {
        return Err(err(at, "expected an indented block"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Tok {
        Tok::Name(s.into())
    }

    #[test]
    fn statements_span_brackets_strings_and_continuations() {
        let src = "\"\"\"Doc with a\n# fake comment and 'quotes'\n\"\"\"\nimport triton; import os\n\
                   X = tl.constexpr(\n    -1.5e-3)  # trailing\n\n@triton.jit\ndef k(a,\n      b: \"tl.constexpr\" = 2):\n\
                   \x20   s = 'x # not a comment'\n# a comment at column 0\n    return a + \\\n        b\n\
                   Y = r'\\'' ; \n";
        let st = statements(src).expect("parses");
        let lines: Vec<usize> = st.iter().map(|s| s.line).collect();
        assert_eq!(lines, [1, 4, 4, 5, 8, 9, 15], "{st:?}");
        assert!(
            matches!(&st[0].tokens[0], Tok::Str { prefix, body } if prefix.is_empty() && body.contains("fake comment"))
        );
        assert_eq!(st[2].tokens, [name("import"), name("os")]);
        assert!(st[3].tokens.contains(&Tok::Number("1.5e-3".into())));
        assert!(st[3].tokens.contains(&Tok::Op("-")));
        assert!(st[5].tokens.ends_with(&[Tok::Op(")"), Tok::Op(":")]));
        assert!(
            matches!(&st[6].tokens[2], Tok::Str { prefix, body } if prefix == "r" && body == "\\'")
        );
        assert_eq!(statements("\u{feff}import triton\n").expect("BOM").len(), 1);
        // A def with its body on the same line needs no block.
        let one = statements("def f(): return 1\nx = 2\n").expect("parses");
        assert_eq!(one.len(), 2);
        assert_eq!(one[0].tokens.last(), Some(&Tok::Number("1".into())));
    }

    #[test]
    fn lexical_and_block_errors_name_their_line() {
        for (src, line, needle) in [
            ("x = 'abc\n", 1, "unterminated string"),
            ("x = \"\"\"abc\n\n", 1, "unterminated string"),
            ("x = (1,\n2\n", 1, "never closed"),
            ("x = 1)\n", 1, "unmatched"),
            ("x = [1)\n", 1, "unmatched"),
            ("import triton\n    import os\n", 2, "unexpected indent"),
            ("def f():\nx = 1\n", 1, "expected an indented block"),
            ("def f():\n", 1, "expected an indented block"),
            ("x = 1 $ 2\n", 1, "invalid character"),
            ("x = 1 \\ 2\n", 1, "continuation"),
            ("def f(): return 1\n    y = 2\n", 2, "unexpected indent"),
            (
                "def f():\n    x = 1\n        y = 2\n",
                3,
                "unexpected indent",
            ),
            (
                "def f():\n    if x:\n    y = 2\n",
                2,
                "expected an indented block",
            ),
            (
                "def f():\n    x = 1\n  y = 2\n",
                3,
                "does not match any outer",
            ),
            (
                "def f():\n\tx = 1\n        y = 2\n",
                3,
                "inconsistent use of tabs",
            ),
        ] {
            let e = statements(src).expect_err(src);
            assert_eq!(e.line, line, "{src:?}: {e:?}");
            assert!(e.message.contains(needle), "{src:?}: {e:?}");
        }
    }

    #[test]
    fn number_literals_are_python_s() {
        for ok in [
            "0",
            "00",
            "7",
            "1_000",
            "0x_1F",
            "0o17",
            "0b1010",
            "1.5",
            ".5",
            "5.",
            "1e-5",
            "1.5E+3",
            "2j",
            "1.5j",
            "0_0",
            "1_0.2_5e1_0",
        ] {
            assert!(valid_number(ok), "{ok}");
        }
        for bad in [
            "8s", "1__0", "1_", "012", "0x", "0b102", "1e", "1.2.3", "1e5e5", "09",
        ] {
            assert!(!valid_number(bad), "{bad}");
        }
        let e = statements("x = 8s\n").expect_err("8s");
        assert!(e.message.contains("invalid number literal \"8s\""), "{e:?}");
    }

    #[test]
    fn hex_numbers_keep_their_minus_apart() {
        let st = statements("x = 0x1e-5\n").expect("parses");
        assert_eq!(
            st[0].tokens,
            [
                name("x"),
                Tok::Op("="),
                Tok::Number("0x1e".into()),
                Tok::Op("-"),
                Tok::Number("5".into())
            ]
        );
    }
}
