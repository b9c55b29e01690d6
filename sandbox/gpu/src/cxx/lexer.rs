//! Just enough of C++'s lexical structure to screen a candidate's source: backslash-newline
//! splicing, comments, string and character literals (raw strings included), and digit
//! separators. The result is a list of logical lines, each with the physical line it
//! starts on, in two forms: `code` (comments replaced by a space, literals kept) for
//! reading preprocessor directives, and `bare` (literal contents blanked too) for looking
//! for host code without being fooled by a string such as `"<<<"`.

/// One logical line (physical lines joined by backslash-newline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// 1-based physical line the logical line starts on.
    pub number: usize,
    /// The line with comments replaced by a space.
    pub code: String,
    /// As `code`, with the contents of string and character literals replaced by spaces
    /// (the quotes stay).
    pub bare: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Normal,
    LineComment,
    BlockComment,
    /// Inside a quoted literal; the quote character.
    Quoted(char),
    /// Inside a raw string literal; index into `raw_end` of the closing `)delim"`.
    Raw,
}

/// Splits `source` into logical lines (see the module docs).
pub fn logical_lines(source: &str) -> Vec<Line> {
    let chars: Vec<char> = source.chars().collect();
    let mut lines = Vec::new();
    let (mut code, mut bare) = (String::new(), String::new());
    let mut state = State::Normal;
    let mut raw_end = String::new();
    let mut physical = 1usize;
    let mut start = 1usize;
    let mut i = 0usize;
    while i < chars.len() {
        let c = chars[i];
        // Backslash-newline joins lines everywhere but inside a raw string.
        if c == '\\' && state != State::Raw {
            let next = chars.get(i + 1).copied();
            let after = chars.get(i + 2).copied();
            if next == Some('\n') {
                physical += 1;
                i += 2;
                continue;
            }
            if next == Some('\r') && after == Some('\n') {
                physical += 1;
                i += 3;
                continue;
            }
        }
        if c == '\n' {
            physical += 1;
            match state {
                State::LineComment | State::Quoted(_) => state = State::Normal,
                State::BlockComment | State::Raw => {
                    // The logical line goes on inside the comment or raw string only
                    // for their contents; directives cannot span them, so cut here.
                }
                State::Normal => {}
            }
            lines.push(Line {
                number: start,
                code: std::mem::take(&mut code),
                bare: std::mem::take(&mut bare),
            });
            start = physical;
            i += 1;
            continue;
        }
        match state {
            State::Normal => {
                let next = chars.get(i + 1).copied();
                if c == '/' && next == Some('/') {
                    state = State::LineComment;
                    code.push(' ');
                    bare.push(' ');
                    i += 2;
                    continue;
                }
                if c == '/' && next == Some('*') {
                    state = State::BlockComment;
                    code.push(' ');
                    bare.push(' ');
                    i += 2;
                    continue;
                }
                if c == '"' && raw_prefix(&chars, i) {
                    // R"delim( ... )delim"
                    let mut j = i + 1;
                    let mut delim = String::new();
                    while j < chars.len() && chars[j] != '(' && delim.len() <= 16 {
                        delim.push(chars[j]);
                        j += 1;
                    }
                    raw_end = format!("){delim}\"");
                    state = State::Raw;
                    code.push('"');
                    bare.push('"');
                    i += 1;
                    continue;
                }
                if c == '"' || (c == '\'' && !digit_separator(&chars, i)) {
                    state = State::Quoted(c);
                }
                code.push(c);
                bare.push(c);
            }
            State::LineComment => {}
            State::BlockComment => {
                if c == '*' && chars.get(i + 1) == Some(&'/') {
                    state = State::Normal;
                    i += 2;
                    continue;
                }
            }
            State::Quoted(q) => {
                code.push(c);
                if c == '\\' {
                    if let Some(&n) = chars.get(i + 1)
                        && n != '\n'
                    {
                        code.push(n);
                        bare.push_str("  ");
                        i += 2;
                        continue;
                    }
                } else if c == q {
                    state = State::Normal;
                    bare.push(c);
                    i += 1;
                    continue;
                }
                bare.push(' ');
            }
            State::Raw => {
                if chars[i..].starts_with(&raw_end.chars().collect::<Vec<_>>()) {
                    let n = raw_end.chars().count();
                    code.push('"');
                    bare.push('"');
                    state = State::Normal;
                    i += n;
                    continue;
                }
                code.push(c);
                bare.push(' ');
            }
        }
        i += 1;
    }
    if !code.is_empty() || !bare.is_empty() {
        lines.push(Line {
            number: start,
            code,
            bare,
        });
    }
    lines
}

/// True if the `"` at `i` opens a raw string (`R"`, `u8R"`, `LR"`, `uR"`, `UR"`).
fn raw_prefix(chars: &[char], i: usize) -> bool {
    if i == 0 || chars[i - 1] != 'R' {
        return false;
    }
    let mut j = i - 1;
    // Optional encoding prefix before the R.
    while j > 0 && matches!(chars[j - 1], 'u' | '8' | 'L' | 'U') && i - j < 4 {
        j -= 1;
    }
    j == 0 || !(chars[j - 1].is_ascii_alphanumeric() || chars[j - 1] == '_')
}

/// True if the `'` at `i` is a C++14 digit separator (`1'000'000`), not a character literal.
fn digit_separator(chars: &[char], i: usize) -> bool {
    i > 0
        && chars[i - 1].is_ascii_alphanumeric()
        && chars.get(i + 1).is_some_and(|c| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_go_literals_stay_in_code_and_blank_in_bare() {
        let lines = logical_lines(
            "int a; // <<<x>>>\n/* cudaMalloc(\n  */ int b = 1'000;\nprintf(\"<<<\\\"%d\");\nchar c = '\"';\n",
        );
        let code: Vec<&str> = lines.iter().map(|l| l.code.trim()).collect();
        assert_eq!(code[0], "int a;");
        assert!(!lines[1].code.contains("cudaMalloc"));
        assert_eq!(lines[2].code.trim(), "int b = 1'000;");
        assert_eq!(lines[3].code, "printf(\"<<<\\\"%d\");");
        assert!(!lines[3].bare.contains("<<<"), "{:?}", lines[3].bare);
        assert!(lines[3].bare.starts_with("printf(\"") && lines[3].bare.ends_with("\");"));
        assert_eq!(lines[4].bare.trim(), "char c = ' ';");
    }

    #[test]
    fn continuation_lines_join_and_keep_their_first_line_number() {
        let lines = logical_lines("a\n#inc\\\nlude \"x.h\"\nb\n");
        assert_eq!(lines[1].code, "#include \"x.h\"");
        assert_eq!(lines[1].number, 2);
        assert_eq!(lines[2].number, 4);
        let lines = logical_lines("x\r\n#def\\\r\nine Y 1\r\n");
        assert!(lines.iter().any(|l| l.code.trim_end() == "#define Y 1"));
    }

    #[test]
    fn raw_strings_are_literals() {
        let lines = logical_lines("auto s = R\"k(<<<a>>> \" )\" )k\"; int z;\n");
        assert!(!lines[0].bare.contains("<<<"));
        assert!(lines[0].bare.contains("int z;"));
    }
}
