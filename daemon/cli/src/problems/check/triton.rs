//! Triton sources: the module level holds only what kiln's compile driver accepts
//! (sandbox/src/engine/triton/driver.py: imports of triton and triton.language, one
//! `@triton.jit` per function, `NAME = tl.constexpr(<literal>)`, a docstring), read
//! without running Python; and each launch fits the `@triton.jit` function it names.
//!
//! The driver resolves names against the real triton package; this check cannot, so it
//! goes by spelling (`triton.jit` or `jit`, a callee ending in `constexpr`). The lists it
//! goes by (which modules may be imported, what `from triton import` may bring in, the
//! keywords `@triton.jit` takes) are kiln's Triton rules, the one file the driver and the
//! hosted extractor read too ([`kiln_types::triton`]).

use kiln_types::Launch;
use kiln_types::triton::TritonRules;

use super::Issue;
use super::python::{self, Statement, Tok};

/// One parameter of a jit function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// Its name.
    pub name: String,
    /// Annotated `tl.constexpr` (or a string naming it).
    pub constexpr: bool,
    /// Has a default value.
    pub has_default: bool,
}

/// A `@triton.jit` function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitFunction {
    /// Its name.
    pub name: String,
    /// The line of its `def`.
    pub line: usize,
    /// Its parameters, positional and keyword-only, in order.
    pub params: Vec<Param>,
}

/// What the module level may hold, for messages.
const HELP: &str = "a triton source holds only imports of triton and triton.language, \
                    @triton.jit functions, NAME = tl.constexpr(<literal>) constants and a \
                    docstring";
/// Python's keywords that start a statement.
const KEYWORDS: &[&str] = &[
    "assert", "async", "await", "break", "class", "continue", "del", "for", "global", "if",
    "lambda", "match", "nonlocal", "pass", "raise", "return", "try", "while", "with", "yield",
];

/// `names`, sorted, as a list for a message.
fn listed(names: &[String]) -> String {
    let mut names: Vec<&str> = names.iter().map(String::as_str).collect();
    names.sort_unstable();
    names.join(", ")
}

/// `a.b.c` at the start of `t`: the dotted name and how many tokens it takes.
fn dotted(t: &[Tok]) -> Option<(String, usize)> {
    let Some(Tok::Name(first)) = t.first() else {
        return None;
    };
    let mut name = first.clone();
    let mut n = 1;
    while let (Some(dot), Some(Tok::Name(part))) = (t.get(n), t.get(n + 1)) {
        if !dot.is_op(".") {
            break;
        }
        name.push('.');
        name.push_str(part);
        n += 2;
    }
    Some((name, n))
}

/// The whole of `t` as a dotted name.
fn whole_dotted(t: &[Tok]) -> Option<String> {
    dotted(t).filter(|(_, n)| *n == t.len()).map(|(s, _)| s)
}

/// A literal as the driver takes it: a number, a (non-bytes, non-f) string, `True`,
/// `False`, `None`, or a signed number.
fn literal(t: &[Tok]) -> bool {
    let number = |t: &Tok| matches!(t, Tok::Number(n) if !n.ends_with(['j', 'J']));
    match t {
        [n] if number(n) => true,
        [sign, n] if (sign.is_op("-") || sign.is_op("+")) && number(n) => true,
        [Tok::Name(n)] => matches!(n.as_str(), "True" | "False" | "None"),
        [] => false,
        strings => strings.iter().all(
            |s| matches!(s, Tok::Str { prefix, .. } if matches!(prefix.as_str(), "" | "r" | "u")),
        ),
    }
}

/// Splits `t` at the top-level (bracket depth 0) occurrences of `op`.
fn split_top<'a>(t: &'a [Tok], op: &str) -> Vec<&'a [Tok]> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, tok) in t.iter().enumerate() {
        match tok {
            Tok::Op("(" | "[" | "{") => depth += 1,
            Tok::Op(")" | "]" | "}") => depth -= 1,
            _ if depth == 0 && tok.is_op(op) => {
                out.push(&t[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&t[start..]);
    out
}

/// The index of the bracket closing the one at `open`.
fn closing(t: &[Tok], open: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (i, tok) in t.iter().enumerate().skip(open) {
        match tok {
            Tok::Op("(" | "[" | "{") => depth += 1,
            Tok::Op(")" | "]" | "}") => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

fn syntax(what: &str) -> String {
    format!("syntax error: {what}")
}

/// Reads the module level of a Triton source: its jit functions (none if it does not
/// parse), and what is wrong, by kiln's Triton rules.
pub fn module(source: &str) -> (Option<Vec<JitFunction>>, Vec<Issue>) {
    module_by(source, TritonRules::get())
}

/// [`module`] by the rules given.
fn module_by(source: &str, rules: &TritonRules) -> (Option<Vec<JitFunction>>, Vec<Issue>) {
    let statements = match python::statements(source) {
        Ok(s) => s,
        Err(e) => return (None, vec![Issue::at(e.line, syntax(&e.message))]),
    };
    let (mut funcs, mut issues) = (Vec::new(), Vec::new());
    let mut decorators: Vec<&Statement> = Vec::new();
    for s in &statements {
        let t = s.tokens.as_slice();
        if t[0].is_op("@") {
            decorators.push(s);
            continue;
        }
        let result = if t[0].is_name("def") {
            function(t, s.line, &decorators, rules).map(|f| funcs.push(f))
        } else {
            if let Some(d) = decorators.first() {
                issues.push(Issue::at(
                    d.line,
                    "a decorator must be followed by a function definition".into(),
                ));
            }
            statement(t, rules)
        };
        decorators.clear();
        if let Err(m) = result {
            issues.push(Issue::at(s.line, m));
        }
    }
    if let Some(d) = decorators.first() {
        issues.push(Issue::at(
            d.line,
            "a decorator must be followed by a function definition".into(),
        ));
    }
    (Some(funcs), issues)
}

/// A top-level statement other than a function definition.
fn statement(t: &[Tok], rules: &TritonRules) -> Result<(), String> {
    if t.iter().all(|x| matches!(x, Tok::Str { .. })) && literal(t) {
        return Ok(()); // a docstring
    }
    if t[0].is_name("import") {
        return import(t, rules);
    }
    if t[0].is_name("from") {
        return import_from(t, rules);
    }
    if matches!(t[0], Tok::Name(_)) && t.get(1).is_some_and(|x| x.is_op("=")) {
        return constant(t);
    }
    let what = match &t[0] {
        Tok::Name(k) if KEYWORDS.contains(&k.as_str()) => format!("`{k}` statements"),
        _ if t.iter().any(|x| matches!(x, Tok::Op(o) if o.ends_with('=') && !matches!(*o, "==" | "!=" | "<=" | ">="))) => {
            "assignments other than NAME = tl.constexpr(<literal>)".to_string()
        }
        _ => "expressions".to_string(),
    };
    Err(format!("{what} are not allowed at module level ({HELP})"))
}

fn import(t: &[Tok], rules: &TritonRules) -> Result<(), String> {
    for part in split_top(&t[1..], ",") {
        let (module, n) = dotted(part).ok_or_else(|| syntax("invalid import"))?;
        match &part[n..] {
            [] => {}
            [r#as, Tok::Name(_)] if r#as.is_name("as") => {}
            _ => return Err(syntax("invalid import")),
        }
        if !rules.importable(&module) {
            return Err(format!("import {module}: {HELP}"));
        }
    }
    Ok(())
}

fn import_from(t: &[Tok], rules: &TritonRules) -> Result<(), String> {
    let rest = &t[1..];
    if rest.first().is_some_and(|x| x.is_op(".") || x.is_op("...")) {
        return Err(format!("relative imports are not allowed: {HELP}"));
    }
    let (module, n) = dotted(rest).ok_or_else(|| syntax("invalid import"))?;
    let Some((import, mut names)) = rest[n..].split_first() else {
        return Err(syntax("invalid import"));
    };
    if !import.is_name("import") {
        return Err(syntax("invalid import"));
    }
    if !rules.importable(&module) {
        return Err(format!("from {module} import ...: {HELP}"));
    }
    if let [open, inner @ .., close] = names
        && open.is_op("(")
        && close.is_op(")")
    {
        names = inner;
    }
    if names.is_empty() {
        return Err(syntax("invalid import"));
    }
    for item in split_top(names, ",") {
        let name = match item {
            [] => continue,
            [Tok::Name(n)] => n,
            [Tok::Name(n), r#as, Tok::Name(_)] if r#as.is_name("as") => n,
            [star] if star.is_op("*") => {
                return Err(format!("from {module} import *: import names one by one"));
            }
            _ => return Err(syntax("invalid import")),
        };
        if name.starts_with('_') {
            return Err(format!("from {module} import {name}: no private names"));
        }
        if module == "triton" && !rules.from_triton_allows(name) {
            return Err(format!(
                "from triton import {name}: from triton only {} may be imported",
                listed(&rules.from_triton)
            ));
        }
    }
    Ok(())
}

fn constant(t: &[Tok]) -> Result<(), String> {
    let msg = || {
        "module-level assignments must read NAME = tl.constexpr(<literal>) (a number, a bool, \
         a string or None)"
            .to_string()
    };
    let rest = &t[2..];
    let (callee, n) = dotted(rest).ok_or_else(msg)?;
    if callee.rsplit('.').next() != Some("constexpr") {
        return Err(msg());
    }
    match &rest[n..] {
        [open, arg @ .., close] if open.is_op("(") && close.is_op(")") && literal(arg) => Ok(()),
        _ => Err(msg()),
    }
}

/// `def NAME(params) [-> ann]: ...` with its decorators.
fn function(
    t: &[Tok],
    line: usize,
    decorators: &[&Statement],
    rules: &TritonRules,
) -> Result<JitFunction, String> {
    let Some(Tok::Name(name)) = t.get(1) else {
        return Err(syntax("invalid function definition"));
    };
    if t.get(2).is_some_and(|x| x.is_op("[")) {
        return Err(format!("{name}: type parameters are not allowed"));
    }
    let close = t
        .get(2)
        .filter(|x| x.is_op("("))
        .and_then(|_| closing(t, 2))
        .ok_or_else(|| syntax("invalid function definition"))?;
    if split_top(&t[close + 1..], ":").len() < 2 {
        return Err(syntax("expected ':'"));
    }
    let [decorator] = decorators else {
        return Err(format!(
            "{name} needs exactly one decorator, @triton.jit (autotune and heuristics \
             configs belong in the launch plan: constexprs, num_warps, num_stages)"
        ));
    };
    jit_decorator(&decorator.tokens, rules)?;
    let mut params = Vec::new();
    for part in split_top(&t[3..close], ",") {
        match part {
            [] => {}
            [marker] if marker.is_op("/") || marker.is_op("*") => {}
            [star, ..] if star.is_op("*") || star.is_op("**") => {
                return Err(format!("{name}: *args and **kwargs are not allowed"));
            }
            [Tok::Name(p), rest @ ..] => params.push(param(p, rest)?),
            _ => return Err(syntax("invalid parameter")),
        }
    }
    Ok(JitFunction {
        name: name.clone(),
        line,
        params,
    })
}

/// One parameter `NAME[: annotation][= default]`; `rest` follows the name.
fn param(name: &str, rest: &[Tok]) -> Result<Param, String> {
    let (annotation, default) = match split_top(rest, "=").as_slice() {
        [ann] => (*ann, None),
        [ann, default] => (*ann, Some(*default)),
        _ => return Err(syntax("invalid parameter")),
    };
    let constexpr = match annotation {
        [] => false,
        [colon, ann @ ..] if colon.is_op(":") => match ann {
            [Tok::Str { body, .. }] => body.contains("constexpr"),
            _ => match whole_dotted(ann) {
                Some(a) => a.rsplit('.').next() == Some("constexpr"),
                None => {
                    return Err(format!(
                        "parameter {name}: annotations must name triton.language types \
                         (tl.constexpr, tl.int32, ...), int, float, bool or str, or be strings"
                    ));
                }
            },
        },
        _ => return Err(syntax("invalid parameter")),
    };
    if let Some(d) = default
        && !(literal(d) || whole_dotted(d).is_some())
    {
        return Err(format!(
            "parameter {name}: default values must be literals, constexpr constants or \
             triton.language objects (tl.float32)"
        ));
    }
    Ok(Param {
        name: name.to_string(),
        constexpr,
        has_default: default.is_some(),
    })
}

/// `@triton.jit`, `@jit`, or either called with literal keyword arguments.
fn jit_decorator(t: &[Tok], rules: &TritonRules) -> Result<(), String> {
    let only = || {
        "only @triton.jit is accepted as a decorator (autotune and heuristics configs belong \
         in the launch plan)"
            .to_string()
    };
    let (callee, n) = dotted(&t[1..]).ok_or_else(only)?;
    if callee != "triton.jit" && callee != "jit" {
        return Err(only());
    }
    let args = match &t[1 + n..] {
        [] => return Ok(()),
        [open, args @ .., close] if open.is_op("(") && close.is_op(")") => args,
        _ => return Err(only()),
    };
    let bad_kwargs = || {
        format!(
            "@triton.jit takes only {}, with literal values",
            listed(&rules.jit_keywords)
        )
    };
    for kw in split_top(args, ",") {
        let [Tok::Name(key), eq, value @ ..] = kw else {
            if kw.is_empty() {
                continue;
            }
            return Err(bad_kwargs());
        };
        let values = match value {
            [open, inner @ .., close]
                if (open.is_op("[") && close.is_op("]"))
                    || (open.is_op("(") && close.is_op(")")) =>
            {
                split_top(inner, ",")
                    .into_iter()
                    .filter(|v| !v.is_empty())
                    .collect()
            }
            v => vec![v],
        };
        if !eq.is_op("=") || !rules.jit_keyword(key) || !values.iter().all(|v| literal(v)) {
            return Err(bad_kwargs());
        }
    }
    Ok(())
}

/// Each launch against the jit function it names: (launch index, line of the function if
/// found, what is wrong).
pub fn check_launches(funcs: &[JitFunction], launches: &[Launch]) -> Vec<(usize, Issue)> {
    let mut out = Vec::new();
    for (i, l) in launches.iter().enumerate() {
        // Python binds a name defined twice to the later definition.
        let Some(f) = funcs.iter().rev().find(|f| f.name == l.kernel) else {
            let found: Vec<&str> = funcs.iter().map(|f| f.name.as_str()).collect();
            let found = if found.is_empty() {
                "none".to_string()
            } else {
                found.join(", ")
            };
            out.push((
                i,
                Issue::new(format!(
                    "no @triton.jit function {} in the source (found: {found})",
                    l.kernel
                )),
            ));
            continue;
        };
        let mut bad = |m: String| out.push((i, Issue::at(f.line, m)));
        let plain: Vec<&str> = f
            .params
            .iter()
            .filter(|p| !p.constexpr)
            .map(|p| p.name.as_str())
            .collect();
        if plain.len() != l.args.len() {
            bad(format!(
                "{} takes {} arguments besides its constexprs ({}), the launch passes {}",
                f.name,
                plain.len(),
                plain.join(", "),
                l.args.len()
            ));
        }
        let constexpr = |name: &str| f.params.iter().find(|p| p.constexpr && p.name == name);
        for k in l.constexprs.keys() {
            if constexpr(k).is_none() {
                bad(format!(
                    "constexprs.{k}: {} has no constexpr parameter {k}",
                    f.name
                ));
            }
        }
        for p in f.params.iter().filter(|p| p.constexpr && !p.has_default) {
            if !l.constexprs.contains_key(&p.name) {
                bad(format!(
                    "{}'s constexpr {} has no default and no value in constexprs",
                    f.name, p.name
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = r#""""A seed."""
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton import jit, cdiv

# @knob BLOCK 1024|2048
BLOCK = tl.constexpr(2048)
EPS = tl.constexpr(-1e-5)


@triton.jit(do_not_specialize=["n"], debug=False)
def rows(x_ptr, y_ptr, n, ACC: "tl.constexpr" = tl.float32, *, W: tl.constexpr):
    pass


@jit
def add(a, b, y, n: tl.int32, BLOCK: tl.constexpr = 4, GROUP: tl.constexpr = None):
    pass
"#;

    fn launch(json: &str) -> Launch {
        serde_json::from_str(json).expect("launch")
    }

    #[test]
    fn a_seed_module_reads_as_its_jit_functions() {
        let (funcs, issues) = module(SEED);
        assert_eq!(issues, Vec::new());
        let funcs = funcs.expect("parses");
        let names: Vec<&str> = funcs.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["rows", "add"]);
        assert_eq!(funcs[0].line, 13);
        let rows: Vec<(&str, bool, bool)> = funcs[0]
            .params
            .iter()
            .map(|p| (p.name.as_str(), p.constexpr, p.has_default))
            .collect();
        assert_eq!(
            rows,
            [
                ("x_ptr", false, false),
                ("y_ptr", false, false),
                ("n", false, false),
                ("ACC", true, true),
                ("W", true, false)
            ]
        );
        assert!(funcs[1].params[3].name == "n" && !funcs[1].params[3].constexpr);
    }

    #[test]
    fn anything_else_at_module_level_is_refused_by_line() {
        for (src, line, needle) in [
            ("import os\n", 1, "import os: a triton source holds only"),
            ("import triton, numpy as np\n", 1, "import numpy"),
            ("from . import x\n", 1, "relative imports"),
            ("from triton import autotune\n", 1, "from triton only"),
            (
                "from triton.language import *\n",
                1,
                "import names one by one",
            ),
            (
                "from triton.language import _private\n",
                1,
                "no private names",
            ),
            ("import torch\nX = tl.constexpr(1)\n", 1, "import torch"),
            ("X = 3\n", 1, "NAME = tl.constexpr(<literal>)"),
            (
                "X = tl.constexpr(os.environ)\n",
                1,
                "NAME = tl.constexpr(<literal>)",
            ),
            ("X = print(1)\n", 1, "NAME = tl.constexpr(<literal>)"),
            ("X += 1\n", 1, "assignments other than"),
            ("print('hi')\n", 1, "expressions are not allowed"),
            ("if True:\n    pass\n", 1, "`if` statements are not allowed"),
            ("class A:\n    pass\n", 1, "`class` statements"),
            ("def f(x):\n    pass\n", 1, "needs exactly one decorator"),
            (
                "@triton.autotune(configs=[])\n@triton.jit\ndef f(x):\n    pass\n",
                3,
                "exactly one decorator",
            ),
            (
                "@triton.heuristics({})\ndef f(x):\n    pass\n",
                2,
                "only @triton.jit",
            ),
            (
                "@triton.jit(launch_hook=1)\ndef f(x):\n    pass\n",
                2,
                "takes only",
            ),
            (
                "@triton.jit\ndef f(*args):\n    pass\n",
                2,
                "*args and **kwargs",
            ),
            (
                "@triton.jit\ndef f(x=os.getcwd()):\n    pass\n",
                2,
                "default values must be",
            ),
            (
                "@triton.jit\ndef f(x: list[int]):\n    pass\n",
                2,
                "annotations must name",
            ),
            (
                "@triton.jit\nX = tl.constexpr(1)\n",
                1,
                "a decorator must be followed",
            ),
            ("b'bytes'\n", 1, "expressions"),
            (
                "@triton.jit\ndef f(x):\n  return (x\n",
                3,
                "syntax error: '(' was never closed",
            ),
        ] {
            let (funcs, issues) = module(src);
            let syntax = issues.iter().any(|i| i.message.starts_with("syntax error"));
            assert_eq!(funcs.is_none(), syntax, "{src:?}");
            assert!(
                issues
                    .iter()
                    .any(|i| i.line == Some(line) && i.message.contains(needle)),
                "{src:?}: {issues:?}"
            );
        }
    }

    #[test]
    fn a_rule_added_to_the_rules_file_is_followed() {
        // The check reads the rules file's lists, not lists of its own: a name added there
        // is allowed here (the scripts' tests add one to the same file).
        let mut v: serde_json::Value =
            serde_json::from_str(kiln_types::triton::RULES_JSON).expect("json");
        v["from_triton"]
            .as_array_mut()
            .expect("a list")
            .push("Config".into());
        v["jit_keywords"]
            .as_array_mut()
            .expect("a list")
            .push("launch_hook".into());
        v["import_trees"]
            .as_array_mut()
            .expect("a list")
            .push("triton.tools".into());
        let more = TritonRules::parse(&v.to_string()).expect("rules");
        let src = "from triton import Config\nimport triton.tools.disasm\n\n\
                   @triton.jit(launch_hook=None)\ndef f(x):\n    pass\n";
        let refused: Vec<String> = module(src).1.into_iter().map(|i| i.message).collect();
        assert_eq!(refused.len(), 3, "{refused:?}");
        assert!(refused[0].contains("from triton only cdiv, jit, language, next_power_of_2"));
        assert_eq!(module_by(src, &more).1, Vec::new());
        assert!(
            module_by("from triton import autotune\n", &more).1[0]
                .message
                .contains("from triton only Config, cdiv, jit, language, next_power_of_2")
        );
    }

    #[test]
    fn launches_fit_their_functions() {
        let funcs = module(SEED).0.expect("parses");
        let ok = [
            launch(r#"{"kernel":"rows","args":["x","y",{"i32":4}],"constexprs":{"W":4}}"#),
            launch(r#"{"kernel":"add","args":["a","b","y",{"i32":4}]}"#),
        ];
        assert_eq!(check_launches(&funcs, &ok), Vec::new());
        for (l, needle) in [
            (
                r#"{"kernel":"nope"}"#,
                "no @triton.jit function nope in the source (found: rows, add)",
            ),
            (
                r#"{"kernel":"add","args":["a","b","y"]}"#,
                "add takes 4 arguments besides its constexprs (a, b, y, n), the launch passes 3",
            ),
            (
                r#"{"kernel":"add","args":["a","b","y",{"i32":4}],"constexprs":{"n":1}}"#,
                "constexprs.n: add has no constexpr parameter n",
            ),
            (
                r#"{"kernel":"rows","args":["x","y",{"i32":4}]}"#,
                "rows's constexpr W has no default and no value in constexprs",
            ),
        ] {
            let got = check_launches(&funcs, &[launch(l)]);
            assert!(
                got.iter()
                    .any(|(i, m)| *i == 0 && m.message.contains(needle)),
                "{l}: {got:?}"
            );
        }
    }
}
