//! Turning a model's reply into a candidate: the code from a fenced block, an optional
//! JSON launch plan, and a one-line note; errors say what was wrong in words a model can
//! act on (send them back with the next request).

use kiln_types::{Candidate, Language, Launch, ScratchBuffer};

use crate::CandidateBuilder;

/// A fenced block of a reply: its info string (language, lower case) and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The word after the opening fence (`c`, `cuda`, `json`...), lower case; may be empty.
    pub lang: String,
    /// The text between the fences.
    pub body: String,
}

/// Every fenced (```) block of `text`, in order. An unclosed last block is dropped.
pub fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(String, Vec<&str>)> = None;
    for line in text.lines() {
        let t = line.trim_start();
        match open.take() {
            None => {
                if let Some(info) = t.strip_prefix("```") {
                    let lang = info
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_ascii_lowercase();
                    open = Some((lang, Vec::new()));
                }
            }
            Some((lang, mut body)) => {
                if t.trim_end() == "```" {
                    out.push(Block {
                        lang,
                        body: body.join("\n") + "\n",
                    });
                } else {
                    body.push(line);
                    open = Some((lang, body));
                }
            }
        }
    }
    out
}

/// A candidate read from a reply, with the note the model gave (its `IDEA:`,
/// `CHANGE:` or `NOTE:` line), if any.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The candidate (problem, language and, without a JSON plan, the launch plan,
    /// flags and scratch of the parent; no parent or note set).
    pub candidate: Candidate,
    /// The model's one-line description of its change.
    pub note: Option<String>,
}

const C_LANGS: &[&str] = &["c", "h", "cpp", "c++", "cc"];
const CUDA_LANGS: &[&str] = &["cuda", "cu", "cpp", "c++", "c"];
const PYTHON_LANGS: &[&str] = &["python", "py", "triton", "python3"];

/// The code blocks accepted for `language`, and the fence a model is asked for.
fn fences(language: Language) -> (&'static [&'static str], &'static str) {
    match language {
        Language::C => (C_LANGS, "```c"),
        Language::Cuda => (CUDA_LANGS, "```cuda"),
        Language::Triton | Language::ModelNew | Language::ModelNewCpu => {
            (PYTHON_LANGS, "```python")
        }
    }
}

/// The first `IDEA:` / `CHANGE:` / `NOTE:` line of `text` (case-insensitive), trimmed.
pub fn note_line(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let t = l.trim().trim_start_matches(['*', '#', '-', ' ']);
        let lower = t.to_ascii_lowercase();
        ["idea:", "change:", "note:"].iter().find_map(|p| {
            lower
                .starts_with(p)
                .then(|| t[p.len()..].trim().trim_end_matches('*').trim().to_string())
                .filter(|s| !s.is_empty())
        })
    })
}

/// Reads a candidate for the same problem as `parent` from a model's reply: the first
/// fenced code block in the parent's language (```c for C, ```cuda for CUDA, ```python
/// for Triton; an unlabelled block also counts), and, if there is a ```json
/// block, the launch plan from it (`{"launches": [...], "flags": [...], "scratch":
/// [...]}` or just the array of launches); otherwise the parent's plan, flags and
/// scratch are kept.
pub fn candidate(text: &str, parent: &Candidate) -> Result<Parsed, String> {
    let bs = blocks(text);
    let (langs, want) = fences(parent.language);
    let code = bs
        .iter()
        .find(|b| langs.contains(&b.lang.as_str()))
        .or_else(|| bs.iter().find(|b| b.lang.is_empty()))
        .ok_or_else(|| {
            format!("the reply has no fenced {want} code block with the complete kernel source")
        })?;
    if code.body.trim().is_empty() {
        return Err(format!("the {want} block is empty"));
    }
    let mut b = CandidateBuilder::from(parent).source(code.body.clone());
    if let Some(plan) = bs.iter().find(|b| b.lang == "json") {
        let v: serde_json::Value = serde_json::from_str(&plan.body)
            .map_err(|e| format!("the ```json launch plan is not JSON: {e}"))?;
        let (launches, flags, scratch) = match &v {
            serde_json::Value::Array(_) => (Some(v.clone()), None, None),
            serde_json::Value::Object(o) => (
                o.get("launches").cloned(),
                o.get("flags").cloned(),
                o.get("scratch").cloned(),
            ),
            _ => return Err("the ```json launch plan must be an object or an array".into()),
        };
        if let Some(l) = launches {
            let l: Vec<Launch> = serde_json::from_value(l)
                .map_err(|e| format!("`launches` of the JSON plan: {e}"))?;
            b = b.launches(l);
        }
        let mut c = b
            .build()
            .map_err(|e| format!("the candidate is invalid: {e}"))?;
        if let Some(f) = flags {
            c.flags = serde_json::from_value::<Vec<String>>(f)
                .map_err(|e| format!("`flags` of the JSON plan: {e}"))?;
        }
        if let Some(s) = scratch {
            c.scratch = serde_json::from_value::<Vec<ScratchBuffer>>(s)
                .map_err(|e| format!("`scratch` of the JSON plan: {e}"))?;
        }
        b = CandidateBuilder::from(&c);
    }
    let c = b
        .build()
        .map_err(|e| format!("the candidate is invalid: {e}"))?;
    for l in &c.launches {
        if !defines(&c.source, &l.kernel) {
            return Err(format!(
                "the launch plan calls kernel `{}`, but the source does not define it (keep the kernel's name and signature, or give a ```json launch plan)",
                l.kernel
            ));
        }
    }
    Ok(Parsed {
        candidate: c,
        note: note_line(text),
    })
}

/// True if and only if `name(` follows a word boundary somewhere in `source`.
fn defines(source: &str, name: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    source.match_indices(name).any(|(i, _)| {
        let before_ok = source[..i].chars().next_back().is_none_or(|c| !ident(c));
        let after = source[i + name.len()..].trim_start();
        before_ok && after.starts_with('(')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent() -> Candidate {
        serde_json::from_str(
            r#"{"problem":"p","language":"c","source":"void k(float *x) {}\n",
                "launches":[{"kernel":"k","args":["x"]}],"flags":["-O2"]}"#,
        )
        .expect("parent")
    }

    #[test]
    fn code_block_and_fallback_plan() {
        let r = "IDEA: unroll by 4\n\n```c\nvoid k(float *x) { /* fast */ }\n```\n";
        let p = candidate(r, &parent()).expect("parses");
        assert!(p.candidate.source.contains("fast"));
        assert_eq!(p.candidate.launches, parent().launches);
        assert_eq!(p.candidate.flags, ["-O2"]);
        assert_eq!(p.note.as_deref(), Some("unroll by 4"));
    }

    #[test]
    fn json_plan_replaces_the_parents() {
        let r = "```c\nvoid k2 (float *x) {}\n```\n```json\n{\"launches\": [{\"kernel\": \"k2\", \"args\": [\"x\"]}], \"flags\": [\"-O3\"]}\n```\n";
        let p = candidate(r, &parent()).expect("parses");
        assert_eq!(p.candidate.launches[0].kernel, "k2");
        assert_eq!(p.candidate.flags, ["-O3"]);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let e = candidate("I would unroll the loop.", &parent()).expect_err("no code");
        assert!(e.contains("```c"), "{e}");
        let e = candidate("```c\nvoid other(float *x) {}\n```\n", &parent()).expect_err("name");
        assert!(e.contains("`k`"), "{e}");
        let e = candidate(
            "```c\nvoid k(float *x) {}\n```\n```json\n{oops\n```\n",
            &parent(),
        )
        .expect_err("json");
        assert!(e.contains("not JSON"), "{e}");
        assert!(
            candidate("```c\nvoid k(){}\n", &parent()).is_err(),
            "unclosed"
        );
    }

    #[test]
    fn triton_replies_come_in_python_blocks() {
        let parent: Candidate = serde_json::from_str(
            r#"{"problem":"p","language":"triton","source":"import triton\n",
                "launches":[{"kernel":"k","grid":[4,1,1],"args":["x"],"num_warps":4}]}"#,
        )
        .expect("parent");
        let r = "IDEA: wider blocks\n```python\nimport triton\n@triton.jit\ndef k(x):\n    pass\n```\n\
                 ```json\n{\"launches\": [{\"kernel\": \"k\", \"grid\": [2,1,1], \"args\": [\"x\"], \"num_warps\": 8, \"constexprs\": {\"B\": 64}}]}\n```\n";
        let p = candidate(r, &parent).expect("parses");
        assert_eq!(p.candidate.language, Language::Triton);
        assert_eq!(p.candidate.launches[0].num_warps, Some(8));
        let e = candidate("```cuda\n__global__ void k() {}\n```", &parent).expect_err("cuda");
        assert!(e.contains("```python"), "{e}");
    }

    #[test]
    fn modelnew_replies_are_whole_python_files() {
        let parent: Candidate = serde_json::from_str(
            r#"{"problem":"p","language":"modelnew",
                "source":"import torch.nn as nn\nclass ModelNew(nn.Module):\n    pass\n"}"#,
        )
        .expect("parent");
        let r = "IDEA: fuse\n```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n```\n";
        let p = candidate(r, &parent).expect("parses");
        assert_eq!(p.candidate.language, Language::ModelNew);
        assert!(p.candidate.launches.is_empty());
        assert_eq!(p.note.as_deref(), Some("fuse"));
        let e = candidate("```python\nimport torch\n```", &parent).expect_err("no ModelNew");
        assert!(e.contains("ModelNew"), "{e}");
    }
}
