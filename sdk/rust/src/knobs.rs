//! Knob and idea annotations in seed kernels: the parser and the rewriter.
//!
//! Seed kernels carry annotations that let a proposer search without an LLM:
//!
//! ```c
//! // @knob BLOCK 64|128|256|512
//! #define BLOCK 128
//! // @idea vec4: load and store float4 instead of float (needs n % 4 == 0)
//! ```
//!
//! and in Triton's Python, where the knob is a module-level constexpr the kernels read, or
//! a launch option (the autotune space Triton users know: constexprs, `num_warps`,
//! `num_stages`):
//!
//! ```python
//! # @knob BLOCK 1024|2048|4096
//! BLOCK = tl.constexpr(2048)
//! # @knob WARPS 4|8|16 launch:num_warps@softmax_rows
//! WARPS = tl.constexpr(8)
//! ```
//!
//! # Grammar
//!
//! Lines are read one at a time; leading whitespace is ignored everywhere. A comment
//! starts with `//` (C, CUDA) or `#` (Python).
//!
//! - A **knob** is a line `// @knob NAME V1|V2|...` (or `# @knob ...`) directly followed
//!   (next line, no blank line between) by `#define NAME VALUE` or, in Python,
//!   `NAME = tl.constexpr(VALUE)` (`triton.language.constexpr(...)` and a bare
//!   `constexpr(...)` too). `NAME` is an identifier and the same on both lines. The values
//!   are separated by `|`, each non-empty, without whitespace, all different. `VALUE` is
//!   the rest of the `#define` line up to a `//` or `/*` comment, or what the parentheses
//!   hold, trimmed; it need not be one of the values (the knob's `current_index` is then
//!   `None`). A name may be a knob only once.
//! - A knob may end with a **launch binding** `launch:FIELD[,FIELD...][@KERNEL[,KERNEL...]]`:
//!   when the knob is set, those fields of the launches of the named kernels (of every
//!   launch without `@`) take its value. `FIELD` is one of `block.x`, `block.y`,
//!   `block.z`, `grid.x`, `grid.y`, `grid.z`, `num_warps`, `num_stages` (the value must
//!   then be a positive integer — for a `BLOCK` knob the kernel checks against
//!   `blockDim.x`) or `constexprs.NAME` (a Triton launch's constexpr: an integer, a float,
//!   `true`/`false`, or else a string):
//!   `// @knob BLOCK 128|256|512 launch:block.x@ln_stats,ln_apply`.
//!   [`crate::search::moves::apply`] applies bindings; [`set`] rewrites only the source.
//! - An **idea** is a line `// @idea NAME: free text`. `NAME` is an identifier and the
//!   text (trimmed) must not be empty. Ideas are hints for people and LLMs; the
//!   rewriter does not apply them.
//! - `// @WORD` where WORD starts with `knob` or `idea` in any case (`@knobs`, `@Idea`)
//!   is an error, so a misspelt annotation is not silently ignored. Other words
//!   (`@param`, `@brief`) and other comments are ignored.
//!
//! [`set`] rewrites the `#define` (or the constexpr's value) of one knob to one of its
//! values, keeping the indentation, any trailing comment and the line ending; everything
//! else is unchanged.

use thiserror::Error;

/// A tunable `#define` with the values it may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Knob {
    /// The macro's name.
    pub name: String,
    /// The values it may take, in the annotation's order.
    pub values: Vec<String>,
    /// Its value in the source.
    pub current: String,
    /// Index of `current` in `values`, if it is one of them.
    pub current_index: Option<usize>,
    /// 1-based line number of the `#define`.
    pub line: usize,
    /// Launch fields that follow the knob's value, if any.
    pub launch: Option<LaunchBinding>,
}

/// One launch field a knob sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchField {
    /// `block.x` (0), `block.y` (1), `block.z` (2).
    Block(usize),
    /// `grid.x`, `grid.y`, `grid.z`.
    Grid(usize),
    /// A Triton launch's `num_warps`.
    NumWarps,
    /// A Triton launch's `num_stages`.
    NumStages,
    /// A Triton launch's constexpr of this name (`constexprs.BLOCK`).
    Constexpr(String),
}

impl LaunchField {
    fn parse(f: &str) -> Option<LaunchField> {
        if let Some(name) = f.strip_prefix("constexprs.") {
            return is_identifier(name).then(|| LaunchField::Constexpr(name.to_string()));
        }
        match f {
            "num_warps" => return Some(LaunchField::NumWarps),
            "num_stages" => return Some(LaunchField::NumStages),
            _ => {}
        }
        let (dim, axis) = f.split_once('.')?;
        let axis = match axis {
            "x" => 0,
            "y" => 1,
            "z" => 2,
            _ => return None,
        };
        match dim {
            "block" => Some(LaunchField::Block(axis)),
            "grid" => Some(LaunchField::Grid(axis)),
            _ => None,
        }
    }
}

/// Launch fields bound to a knob (`launch:block.x@k1,k2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchBinding {
    /// The fields the knob's value goes to.
    pub fields: Vec<LaunchField>,
    /// The kernels whose launches follow it; empty = every launch.
    pub kernels: Vec<String>,
}

/// A knob value as a Triton constexpr: an integer, a float, a boolean, else a string
/// (without surrounding quotes).
fn constexpr_value(value: &str) -> kiln_types::candidate::Constexpr {
    use kiln_types::candidate::Constexpr;
    if let Ok(i) = value.parse::<i64>() {
        return Constexpr::Int(i);
    }
    if let Ok(f) = value.parse::<f64>()
        && f.is_finite()
    {
        return Constexpr::Float(f);
    }
    match value {
        "true" | "True" => Constexpr::Bool(true),
        "false" | "False" => Constexpr::Bool(false),
        _ => Constexpr::Str(value.trim_matches(['"', '\'']).to_string()),
    }
}

impl LaunchBinding {
    fn parse(text: &str) -> Option<LaunchBinding> {
        let spec = text.strip_prefix("launch:")?;
        let (fields, kernels) = match spec.split_once('@') {
            Some((f, k)) => (f, k.split(',').map(str::to_string).collect::<Vec<_>>()),
            None => (spec, Vec::new()),
        };
        if kernels.iter().any(|k| !is_identifier(k)) {
            return None;
        }
        let fields = fields
            .split(',')
            .map(LaunchField::parse)
            .collect::<Option<Vec<_>>>()?;
        Some(LaunchBinding { fields, kernels })
    }

    /// Sets the bound fields of the matching launches to `value`; an error when a
    /// dimension, `num_warps` or `num_stages` would get anything but a positive integer.
    pub fn apply(&self, launches: &mut [kiln_types::Launch], value: &str) -> Result<(), String> {
        let positive = || {
            value.parse::<u32>().ok().filter(|v| *v > 0).ok_or_else(|| {
                format!("launch-bound knob value {value:?} is not a positive integer")
            })
        };
        for l in launches
            .iter_mut()
            .filter(|l| self.kernels.is_empty() || self.kernels.contains(&l.kernel))
        {
            for f in &self.fields {
                match f {
                    LaunchField::Block(axis) => l.block[*axis] = positive()?,
                    LaunchField::Grid(axis) => l.grid[*axis] = positive()?,
                    LaunchField::NumWarps => l.num_warps = Some(positive()?),
                    LaunchField::NumStages => l.num_stages = Some(positive()?),
                    LaunchField::Constexpr(name) => {
                        l.constexprs.insert(name.clone(), constexpr_value(value));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A free-text optimisation idea.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idea {
    /// Short name.
    pub name: String,
    /// The idea, in words.
    pub text: String,
    /// 1-based line number of the annotation.
    pub line: usize,
}

/// The annotations of one source.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Annotations {
    /// Knobs, in source order.
    pub knobs: Vec<Knob>,
    /// Ideas, in source order.
    pub ideas: Vec<Idea>,
}

impl Annotations {
    /// The knob called `name`.
    pub fn knob(&self, name: &str) -> Option<&Knob> {
        self.knobs.iter().find(|k| k.name == name)
    }
}

/// Why an annotation is malformed, or a rewrite impossible. Lines are 1-based.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KnobError {
    /// `// @knob` without a name or without values.
    #[error("line {line}: `// @knob` needs a name and values: `// @knob NAME V1|V2`")]
    MalformedKnob {
        /// The annotation's line.
        line: usize,
    },
    /// A knob or idea name that is not a C identifier.
    #[error("line {line}: {name:?} is not an identifier")]
    BadName {
        /// The annotation's line.
        line: usize,
        /// The name.
        name: String,
    },
    /// An empty value, or one containing whitespace.
    #[error("line {line}: knob {name}: empty value or value with whitespace in {values:?}")]
    BadValue {
        /// The annotation's line.
        line: usize,
        /// The knob.
        name: String,
        /// The values as written.
        values: String,
    },
    /// The same value listed twice.
    #[error("line {line}: knob {name}: value {value:?} is listed twice")]
    DuplicateValue {
        /// The annotation's line.
        line: usize,
        /// The knob.
        name: String,
        /// The value.
        value: String,
    },
    /// The line after `// @knob NAME` is not `#define NAME ...` (or its Python form).
    #[error(
        "line {line}: `@knob {name}` must be directly followed by `#define {name} VALUE` \
         (C, CUDA) or `{name} = tl.constexpr(VALUE)` (Triton)"
    )]
    MissingDefine {
        /// The annotation's line.
        line: usize,
        /// The knob.
        name: String,
    },
    /// The `#define` has no value.
    #[error("line {line}: `#define {name}` has no value")]
    EmptyDefine {
        /// The `#define`'s line.
        line: usize,
        /// The knob.
        name: String,
    },
    /// The same knob declared twice.
    #[error("line {line}: knob {name} is declared twice")]
    DuplicateKnob {
        /// The second annotation's line.
        line: usize,
        /// The knob.
        name: String,
    },
    /// `// @idea` without `NAME: text`.
    #[error("line {line}: `// @idea` needs a name and text: `// @idea NAME: text`")]
    MalformedIdea {
        /// The annotation's line.
        line: usize,
    },
    /// `// @word` where the word looks like a misspelt `@knob` or `@idea`.
    #[error("line {line}: unknown annotation `@{word}` (known: @knob, @idea)")]
    UnknownAnnotation {
        /// The line.
        line: usize,
        /// The word after `@`.
        word: String,
    },
    /// [`set`] named a knob the source does not have.
    #[error("no knob {0} in the source")]
    UnknownKnob(String),
    /// [`set`] asked for a value the knob does not list.
    #[error("knob {name} has no value {value:?} (values: {values:?})")]
    ValueNotAllowed {
        /// The knob.
        name: String,
        /// The value asked for.
        value: String,
        /// The values it lists.
        values: Vec<String>,
    },
}

fn is_identifier(s: &str) -> bool {
    kiln_types::candidate::is_identifier(s)
}

/// The text after `//` or `#` and optional spaces when it starts with `@`:
/// `Some("knob X 1|2")`.
fn annotation(line: &str) -> Option<&str> {
    let t = line.trim_start();
    t.strip_prefix("//")
        .or_else(|| t.strip_prefix('#'))?
        .trim_start()
        .strip_prefix('@')
}

/// `NAME = tl.constexpr(VALUE)  # comment` → (NAME, VALUE trimmed, byte range of VALUE).
fn py_constant(line: &str) -> Option<(&str, &str, std::ops::Range<usize>)> {
    let body = line.trim_end_matches(['\r', '\n']);
    let start = body.len() - body.trim_start().len();
    let rest = &body[start..];
    let name_len = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    let name = &rest[..name_len];
    let after = rest[name_len..]
        .trim_start()
        .strip_prefix('=')?
        .trim_start();
    let after = ["tl.constexpr", "triton.language.constexpr", "constexpr"]
        .iter()
        .find_map(|callee| after.strip_prefix(callee))?
        .trim_start()
        .strip_prefix('(')?;
    let close = after.find(')')?;
    let tail = after[close + 1..].trim();
    if !(tail.is_empty() || tail.starts_with('#')) {
        return None;
    }
    let inner = &after[..close];
    let value = inner.trim();
    let inner_start = body.len() - after.len();
    let value_start = inner_start + (inner.len() - inner.trim_start().len());
    Some((name, value, value_start..value_start + value.len()))
}

/// The knob's value line, C or Python: (NAME, VALUE, byte range of VALUE).
fn knob_value_line(line: &str) -> Option<(&str, &str, std::ops::Range<usize>)> {
    define(line).or_else(|| py_constant(line))
}

/// `#define NAME rest` → (NAME, value without comment, byte range of the value in `line`).
fn define(line: &str) -> Option<(&str, &str, std::ops::Range<usize>)> {
    let after_hash = line.trim_start().strip_prefix('#')?.trim_start();
    let after_define = after_hash.strip_prefix("define")?;
    if !after_define.starts_with([' ', '\t']) {
        return None;
    }
    let name_part = after_define.trim_start();
    let name_start = line.len() - name_part.len();
    let name_len = name_part
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(name_part.len());
    let name = &line[name_start..name_start + name_len];
    let body = line[name_start + name_len..].trim_end_matches(['\r', '\n']);
    let comment = [body.find("//"), body.find("/*")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(body.len());
    let value_region = &body[..comment];
    let value = value_region.trim();
    let value_start =
        name_start + name_len + (value_region.len() - value_region.trim_start().len());
    Some((name, value, value_start..value_start + value.len()))
}

/// Reads the knob and idea annotations of `source` (grammar: the module docs).
pub fn parse(source: &str) -> Result<Annotations, KnobError> {
    let lines: Vec<&str> = source.split_inclusive('\n').collect();
    let mut out = Annotations::default();
    for (i, raw) in lines.iter().enumerate() {
        let line = i + 1;
        let Some(text) = annotation(raw) else {
            continue;
        };
        let text = text.trim_end();
        let word_len = text
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .unwrap_or(text.len());
        let (word, rest) = text.split_at(word_len);
        match word {
            "knob" => {
                let mut parts = rest.split_whitespace();
                let (Some(name), Some(values), binding, None) =
                    (parts.next(), parts.next(), parts.next(), parts.next())
                else {
                    return Err(KnobError::MalformedKnob { line });
                };
                let launch = match binding {
                    None => None,
                    Some(b) => {
                        Some(LaunchBinding::parse(b).ok_or(KnobError::MalformedKnob { line })?)
                    }
                };
                if !is_identifier(name) {
                    return Err(KnobError::BadName {
                        line,
                        name: name.into(),
                    });
                }
                let vals: Vec<String> = values.split('|').map(str::to_string).collect();
                if vals.iter().any(String::is_empty) {
                    return Err(KnobError::BadValue {
                        line,
                        name: name.into(),
                        values: values.into(),
                    });
                }
                for (j, v) in vals.iter().enumerate() {
                    if vals[..j].contains(v) {
                        return Err(KnobError::DuplicateValue {
                            line,
                            name: name.into(),
                            value: v.clone(),
                        });
                    }
                }
                if out.knob(name).is_some() {
                    return Err(KnobError::DuplicateKnob {
                        line,
                        name: name.into(),
                    });
                }
                let missing = || KnobError::MissingDefine {
                    line,
                    name: name.into(),
                };
                let next = lines.get(i + 1).ok_or_else(missing)?;
                let (def_name, value, _) = knob_value_line(next).ok_or_else(missing)?;
                if def_name != name {
                    return Err(missing());
                }
                if value.is_empty() {
                    return Err(KnobError::EmptyDefine {
                        line: line + 1,
                        name: name.into(),
                    });
                }
                out.knobs.push(Knob {
                    name: name.into(),
                    current_index: vals.iter().position(|v| v == value),
                    current: value.into(),
                    values: vals,
                    line: line + 1,
                    launch,
                });
            }
            "idea" => {
                let (name, text) = rest
                    .split_once(':')
                    .ok_or(KnobError::MalformedIdea { line })?;
                let (name, text) = (name.trim(), text.trim());
                if name.is_empty() || text.is_empty() {
                    return Err(KnobError::MalformedIdea { line });
                }
                if !is_identifier(name) {
                    return Err(KnobError::BadName {
                        line,
                        name: name.into(),
                    });
                }
                out.ideas.push(Idea {
                    name: name.into(),
                    text: text.into(),
                    line,
                });
            }
            other => {
                // Near misses of the two keywords (`@knobs`, `@Idea`) are errors, so a
                // typo is not silently ignored; other words (`@param`, `@brief`) belong
                // to other tools.
                let lower = other.to_ascii_lowercase();
                if lower.starts_with("knob") || lower.starts_with("idea") {
                    return Err(KnobError::UnknownAnnotation {
                        line,
                        word: other.into(),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// Rewrites `source` so that knob `name` is `#define`d to `value`, one of its listed
/// values. Everything else, including the annotation, is kept byte for byte.
pub fn set(source: &str, name: &str, value: &str) -> Result<String, KnobError> {
    set_all(source, &[(name, value)])
}

/// Like [`set`], for several knobs at once.
pub fn set_all(source: &str, assignments: &[(&str, &str)]) -> Result<String, KnobError> {
    let notes = parse(source)?;
    let mut targets = Vec::new();
    for (name, value) in assignments {
        let knob = notes
            .knob(name)
            .ok_or_else(|| KnobError::UnknownKnob((*name).into()))?;
        if !knob.values.iter().any(|v| v == value) {
            return Err(KnobError::ValueNotAllowed {
                name: (*name).into(),
                value: (*value).into(),
                values: knob.values.clone(),
            });
        }
        targets.push((knob.line, *value));
    }
    let mut out = String::with_capacity(source.len() + 16);
    for (i, raw) in source.split_inclusive('\n').enumerate() {
        match targets.iter().rev().find(|(l, _)| *l == i + 1) {
            Some((_, value)) => {
                // parse() has checked that this line is the knob's value line.
                let range = knob_value_line(raw).map(|(_, _, r)| r).unwrap_or(0..0);
                out.push_str(&raw[..range.start]);
                out.push_str(value);
                out.push_str(&raw[range.end..]);
            }
            None => out.push_str(raw),
        }
    }
    Ok(out)
}

/// Every combination of the given knobs' values (the cartesian product), in order: the
/// last knob varies fastest. Stops after `limit` combinations.
pub fn grid(knobs: &[&Knob], limit: usize) -> Vec<Vec<(String, String)>> {
    let mut out = Vec::new();
    if knobs.iter().any(|k| k.values.is_empty()) {
        return out;
    }
    let mut idx = vec![0usize; knobs.len()];
    while out.len() < limit {
        out.push(
            knobs
                .iter()
                .zip(&idx)
                .map(|(k, &i)| (k.name.clone(), k.values[i].clone()))
                .collect(),
        );
        let mut pos = knobs.len();
        loop {
            if pos == 0 {
                return out;
            }
            pos -= 1;
            idx[pos] += 1;
            if idx[pos] < knobs[pos].values.len() {
                break;
            }
            idx[pos] = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = concat!(
        "#include <stddef.h>\n",
        "// @knob BLOCK 64|128|256\n",
        "#define BLOCK 128 // threads per block\n",
        "  // @knob UNROLL 1|2|4\n",
        "  #  define UNROLL 1\r\n",
        "// @idea vec4: use float4 loads (n % 4 == 0)\n",
        "// plain comment @knob is not an annotation here\n",
        "void f(void) {}\n",
    );

    #[test]
    fn parses_knobs_and_ideas() {
        let a = parse(SEED).expect("parses");
        assert_eq!(a.knobs.len(), 2);
        let b = a.knob("BLOCK").expect("BLOCK");
        assert_eq!(b.values, ["64", "128", "256"]);
        assert_eq!(b.current, "128");
        assert_eq!(b.current_index, Some(1));
        assert_eq!(b.line, 3);
        let u = a.knob("UNROLL").expect("UNROLL");
        assert_eq!(u.current, "1");
        assert_eq!(u.line, 5);
        assert_eq!(a.ideas.len(), 1);
        assert_eq!(a.ideas[0].name, "vec4");
        assert_eq!(a.ideas[0].text, "use float4 loads (n % 4 == 0)");
    }

    #[test]
    fn set_rewrites_only_the_define() {
        let out = set(SEED, "BLOCK", "256").expect("rewrites");
        assert!(
            out.contains("#define BLOCK 256 // threads per block\n"),
            "{out}"
        );
        assert_eq!(out.len(), SEED.len());
        let out = set(&out, "UNROLL", "4").expect("rewrites");
        assert!(out.contains("  #  define UNROLL 4\r\n"), "{out:?}");
        assert_eq!(
            parse(&out)
                .expect("parses")
                .knob("BLOCK")
                .map(|k| k.current_index),
            Some(Some(2))
        );
        let back = set_all(&out, &[("BLOCK", "128"), ("UNROLL", "1")]).expect("rewrites");
        assert_eq!(back, SEED);
    }

    #[test]
    fn value_outside_the_list_is_parsed_but_not_set() {
        let src = "// @knob N 1|2\n#define N 3\n";
        assert_eq!(parse(src).expect("parses").knobs[0].current_index, None);
        assert!(matches!(
            set(src, "N", "3"),
            Err(KnobError::ValueNotAllowed { .. })
        ));
        assert_eq!(set(src, "M", "1"), Err(KnobError::UnknownKnob("M".into())));
    }

    #[test]
    fn malformed_annotations_are_typed_errors() {
        type Check = fn(&KnobError) -> bool;
        let cases: &[(&str, Check)] = &[
            ("// @knob\n#define A 1\n", |e| {
                matches!(e, KnobError::MalformedKnob { line: 1 })
            }),
            ("// @knob A\n#define A 1\n", |e| {
                matches!(e, KnobError::MalformedKnob { .. })
            }),
            ("// @knob A 1|2 extra\n#define A 1\n", |e| {
                matches!(e, KnobError::MalformedKnob { .. })
            }),
            ("// @knob 9A 1|2\n#define 9A 1\n", |e| {
                matches!(e, KnobError::BadName { .. })
            }),
            ("// @knob A 1||2\n#define A 1\n", |e| {
                matches!(e, KnobError::BadValue { .. })
            }),
            ("// @knob A 1|1\n#define A 1\n", |e| {
                matches!(e, KnobError::DuplicateValue { .. })
            }),
            ("// @knob A 1|2\n\n#define A 1\n", |e| {
                matches!(e, KnobError::MissingDefine { line: 1, .. })
            }),
            ("// @knob A 1|2\n#define B 1\n", |e| {
                matches!(e, KnobError::MissingDefine { .. })
            }),
            ("// @knob A 1|2\n#define AB 1\n", |e| {
                matches!(e, KnobError::MissingDefine { .. })
            }),
            ("// @knob A 1|2", |e| {
                matches!(e, KnobError::MissingDefine { .. })
            }),
            ("// @knob A 1|2\n#define A // nothing\n", |e| {
                matches!(e, KnobError::EmptyDefine { line: 2, .. })
            }),
            (
                "// @knob A 1|2\n#define A 1\n// @knob A 1|2\n#define A 2\n",
                |e| matches!(e, KnobError::DuplicateKnob { line: 3, .. }),
            ),
            ("// @idea vec4 no colon\n", |e| {
                matches!(e, KnobError::MalformedIdea { .. })
            }),
            ("// @idea vec4:   \n", |e| {
                matches!(e, KnobError::MalformedIdea { .. })
            }),
            ("// @idea: text\n", |e| {
                matches!(e, KnobError::MalformedIdea { .. })
            }),
            ("// @knobs A 1|2\n#define A 1\n", |e| {
                matches!(e, KnobError::UnknownAnnotation { .. })
            }),
            ("// @Idea x: y\n", |e| {
                matches!(e, KnobError::UnknownAnnotation { .. })
            }),
        ];
        for (src, check) in cases {
            let err = parse(src).expect_err(src);
            assert!(check(&err), "{src:?} gave {err:?}");
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn other_tools_annotations_are_ignored() {
        let a = parse("// @param x the input\n// @ brief\n").expect("parses");
        assert!(a.knobs.is_empty() && a.ideas.is_empty());
    }

    #[test]
    fn define_value_stops_at_comments() {
        let src = "// @knob T float|double\n#define T float/* type */\n";
        let k = &parse(src).expect("parses").knobs[0];
        assert_eq!(k.current, "float");
        assert_eq!(
            set(src, "T", "double").expect("rewrites"),
            "// @knob T float|double\n#define T double/* type */\n"
        );
    }

    #[test]
    fn grid_is_the_cartesian_product() {
        let a = parse(SEED).expect("parses");
        let knobs: Vec<&Knob> = a.knobs.iter().collect();
        let g = grid(&knobs, 100);
        assert_eq!(g.len(), 9);
        assert_eq!(
            g[0],
            [("BLOCK".into(), "64".into()), ("UNROLL".into(), "1".into())]
        );
        assert_eq!(g[1][1].1, "2");
        assert_eq!(grid(&knobs, 4).len(), 4);
        assert_eq!(grid(&[], 10), vec![Vec::<(String, String)>::new()]);
    }

    const TRITON: &str = concat!(
        "import triton\n",
        "import triton.language as tl\n",
        "# @knob BLOCK 1024|2048|4096\n",
        "BLOCK = tl.constexpr(2048)  # elements per step\n",
        "    # @knob WARPS 4|8|16 launch:num_warps@softmax_rows\n",
        "WARPS = triton.language.constexpr( 8 )\r\n",
        "# @knob ACT relu|gelu launch:constexprs.ACT\n",
        "ACT = constexpr(\"relu\")\n",
        "# @idea exp2: use tl.math.exp2\n",
        "# a plain comment\n",
    );

    #[test]
    fn python_knobs_parse_and_rewrite() {
        let a = parse(TRITON).expect("parses");
        assert_eq!(a.knobs.len(), 3);
        let b = a.knob("BLOCK").expect("BLOCK");
        assert_eq!(
            (b.current.as_str(), b.current_index, b.line),
            ("2048", Some(1), 4)
        );
        let w = a.knob("WARPS").expect("WARPS");
        assert_eq!(w.current, "8");
        assert_eq!(
            w.launch
                .as_ref()
                .map(|l| (l.fields.clone(), l.kernels.clone())),
            Some((
                vec![LaunchField::NumWarps],
                vec!["softmax_rows".to_string()]
            ))
        );
        assert_eq!(a.knob("ACT").expect("ACT").current, "\"relu\"");
        assert_eq!(a.ideas[0].name, "exp2");
        let out = set_all(TRITON, &[("BLOCK", "4096"), ("WARPS", "16")]).expect("rewrites");
        assert!(
            out.contains("BLOCK = tl.constexpr(4096)  # elements per step\n"),
            "{out}"
        );
        assert!(
            out.contains("WARPS = triton.language.constexpr( 16 )\r\n"),
            "{out:?}"
        );
        assert!(matches!(
            parse("# @knob B 1|2\nB = 3\n"),
            Err(KnobError::MissingDefine { .. })
        ));
        assert!(matches!(
            parse("# @knob B 1|2\nB = tl.constexpr(1) + 1\n"),
            Err(KnobError::MissingDefine { .. })
        ));
    }

    #[test]
    fn triton_launch_fields_take_the_knob() {
        use kiln_types::candidate::Constexpr;
        let mut launches: Vec<kiln_types::Launch> = serde_json::from_str(
            r#"[{"kernel":"softmax_rows","grid":[4,1,1]},{"kernel":"other","num_warps":2}]"#,
        )
        .expect("launches");
        let a = parse(TRITON).expect("parses");
        let warps = a
            .knob("WARPS")
            .and_then(|k| k.launch.clone())
            .expect("bound");
        warps.apply(&mut launches, "16").expect("applies");
        assert_eq!(launches[0].num_warps, Some(16));
        assert_eq!(launches[1].num_warps, Some(2), "other is not bound");
        assert!(warps.apply(&mut launches, "x").is_err());
        let act = a.knob("ACT").and_then(|k| k.launch.clone()).expect("bound");
        act.apply(&mut launches, "gelu").expect("applies");
        assert_eq!(launches[1].constexprs["ACT"], Constexpr::Str("gelu".into()));
        let stages = LaunchBinding::parse("launch:num_stages,constexprs.BLOCK").expect("parses");
        stages.apply(&mut launches, "3").expect("applies");
        assert_eq!(launches[0].num_stages, Some(3));
        assert_eq!(launches[0].constexprs["BLOCK"], Constexpr::Int(3));
        assert_eq!(constexpr_value("1.5"), Constexpr::Float(1.5));
        assert_eq!(constexpr_value("True"), Constexpr::Bool(true));
        assert!(LaunchBinding::parse("launch:constexprs.1x").is_none());
    }
}
