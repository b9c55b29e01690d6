//! Names that people and plugins choose (problems, proposers): which characters, how long,
//! and how they must start — never `.`, `..`, `...` or a hidden (`.x`) name, which would
//! read as a path segment in `/v1/problems/NAME` or a file name, and never a flag-like
//! `-x` on the command line.

/// What a name names, and so which characters it may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// A problem: lowercase letters, digits, `-`, `_` and `.`; at most 128 characters.
    Problem,
    /// A proposer (installed as `NAME.wasm`, or given to an uploaded one): letters, digits,
    /// `-` and `_`; at most 64 characters.
    Proposer,
}

impl NameKind {
    fn what(self) -> &'static str {
        match self {
            NameKind::Problem => "problem",
            NameKind::Proposer => "proposer",
        }
    }

    fn max(self) -> usize {
        match self {
            NameKind::Problem => 128,
            NameKind::Proposer => 64,
        }
    }

    fn allows(self, c: char) -> bool {
        match self {
            NameKind::Problem => {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')
            }
            NameKind::Proposer => c.is_ascii_alphanumeric() || matches!(c, '-' | '_'),
        }
    }

    fn rule(self) -> &'static str {
        match self {
            NameKind::Problem => {
                "1-128 characters of a-z, 0-9, '-', '_' and '.', starting with a letter or a digit"
            }
            NameKind::Proposer => {
                "1-64 characters of letters, digits, '-' and '_', starting with a letter or a digit"
            }
        }
    }
}

/// Checks `name` as a name of `kind`; the error says what is wrong and what the rule is.
pub fn check(kind: NameKind, name: &str) -> Result<(), String> {
    let what = kind.what();
    let rule = kind.rule();
    if name.is_empty() || name.len() > kind.max() {
        return Err(format!("{what} name {:?} must be {rule}", truncated(name)));
    }
    if let Some(c) = name.chars().find(|&c| !kind.allows(c)) {
        return Err(format!(
            "{what} name {:?} holds {c:?}; it must be {rule}",
            truncated(name)
        ));
    }
    if name.chars().all(|c| c == '.') {
        return Err(format!(
            "{what} name {name:?} is only dots, which reads as a path; it must be {rule}"
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "{what} name {name:?} starts with {:?}; it must be {rule}",
            name.chars().next().unwrap_or(' ')
        ));
    }
    Ok(())
}

fn truncated(name: &str) -> String {
    name.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dots_and_leading_punctuation_are_refused_with_the_rule() {
        for bad in [".", "..", "...", ".hidden", "-flag", "_x", ""] {
            let e = check(NameKind::Problem, bad).expect_err(bad);
            assert!(
                e.contains("starting with a letter or a digit"),
                "{bad}: {e}"
            );
        }
        assert!(
            check(NameKind::Problem, "..")
                .expect_err("..")
                .contains("only dots")
        );
        assert!(check(NameKind::Problem, "Softmax").is_err());
        assert!(check(NameKind::Problem, &"a".repeat(129)).is_err());
        for ok in ["softmax-256x4096", "v1.2_x", "0abc", "a..b"] {
            assert_eq!(check(NameKind::Problem, ok), Ok(()), "{ok}");
        }
        assert_eq!(check(NameKind::Proposer, "Hill-Climb_2"), Ok(()));
        for bad in ["hill.climb", "../x", ".x", "-x", ""] {
            assert!(check(NameKind::Proposer, bad).is_err(), "{bad}");
        }
    }
}
