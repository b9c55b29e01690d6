//! The prompts idea-branch sends: first K ideas in plain language across the six
//! families, then one implementation per request; and the parser of the ideas reply.

use kiln_sdk::llm::{ChatOptions, LlmError, Message, chat};
use kiln_sdk::search::families::{self, ALL, Family};
use kiln_sdk::search::{AskError, evidence, reply};
use kiln_sdk::{Candidate, Evaluation, Problem};

use crate::Config;
use crate::ideas::Idea;

const SYSTEM: &str = "You are an expert performance engineer optimising one kernel for kiln, \
which compiles, checks against a reference (with adversarial inputs) and times every candidate.";

/// Chat options from the config.
pub fn options(cfg: &Config) -> ChatOptions {
    ChatOptions {
        temperature: cfg.temperature,
        max_tokens: cfg.max_tokens,
        ..ChatOptions::default()
    }
}

fn context(problem: &Problem, parent: &Candidate, eval: Option<&Evaluation>) -> String {
    let mut u = evidence::problem(&problem.spec, &problem.device.backend);
    u.push_str(&evidence::language(parent));
    u.push_str(&format!(
        "Device: {}\n\nCurrent best kernel:\n```\n",
        problem.device.name
    ));
    u.push_str(&parent.source);
    u.push_str("```\nLaunch plan and flags:\n```json\n");
    u.push_str(&evidence::launch_plan(parent));
    u.push_str("\n```\n\nIts evaluation:\n");
    match eval {
        Some(e) => u.push_str(&evidence::evaluation(e)),
        None => u.push_str("not evaluated\n"),
    }
    u
}

/// Asks for `k` ideas, each from a different family where possible.
pub fn ideas_request(
    problem: &Problem,
    parent: &Candidate,
    eval: Option<&Evaluation>,
    k: usize,
    history: &[String],
) -> Vec<Message> {
    let mut u = context(problem, parent, eval);
    if !history.is_empty() {
        u.push_str("\nIdeas tried so far and their outcomes:\n");
        for h in history.iter().rev().take(20).rev() {
            u.push_str(&format!("- {h}\n"));
        }
    }
    u.push_str(&format!(
        "\nPropose {k} distinct optimisation ideas in plain language (no code yet), each from a different one of these families:\n"
    ));
    for f in ALL {
        u.push_str(&format!("- {}: {}\n", f.name(), f.describe()));
    }
    u.push_str("Answer with one ```json block: a list of {\"family\": \"<family name>\", \"name\": \"<short_name>\", \"idea\": \"<one or two sentences>\"}.");
    vec![Message::system(SYSTEM), Message::user(u)]
}

/// Asks for implementation `j` (1-based) of `idea`.
pub fn implement_request(
    problem: &Problem,
    parent: &Candidate,
    eval: Option<&Evaluation>,
    idea: &Idea,
    j: usize,
) -> Vec<Message> {
    let mut u = context(problem, parent, eval);
    u.push_str(&format!(
        "\nImplement this idea (implementation #{j}; if it is not the first, choose a different way to do it):\n{}\n\n",
        idea.label()
    ));
    u.push_str("Answer with a line `IDEA: <what this implementation does>`, then the complete kernel source in one fenced code block (```c for C, ```cuda for CUDA, ```python for Triton). Keep the kernel's name and signature; add a ```json block {\"launches\": [...], \"flags\": [...]} only if the launch plan or flags change.");
    vec![Message::system(SYSTEM), Message::user(u)]
}

/// Reads the ideas of a reply: a JSON list of `{family, name, idea}` (in a ```json block
/// or bare).
pub fn parse_ideas(text: &str) -> Result<Vec<Idea>, String> {
    let body = reply::blocks(text)
        .into_iter()
        .find(|b| b.lang == "json" || b.lang.is_empty())
        .map(|b| b.body)
        .unwrap_or_else(|| text.to_string());
    let v: serde_json::Value = serde_json::from_str(body.trim())
        .map_err(|e| format!("the ideas are not a JSON list: {e}"))?;
    let list = v.as_array().ok_or("the ideas must be a JSON list")?;
    let mut out = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let text = item["idea"]
            .as_str()
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| format!("idea {} has no \"idea\" text", i + 1))?;
        let family = item["family"]
            .as_str()
            .and_then(Family::from_name)
            .unwrap_or_else(|| families::classify(text));
        let name = item["name"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("idea{}", i + 1));
        out.push(Idea {
            name,
            text: text.trim().to_string(),
            family,
            assign: Vec::new(),
            free: Vec::new(),
            flags: Vec::new(),
        });
    }
    if out.is_empty() {
        return Err("the list of ideas is empty".into());
    }
    Ok(out)
}

/// Asks for ideas, sending an unusable reply back with its error up to `fixes` times.
pub fn ask_ideas(
    mut messages: Vec<Message>,
    fixes: u32,
    options: &ChatOptions,
) -> Result<Vec<Idea>, AskError> {
    let mut last = String::new();
    for _ in 0..=fixes {
        let r = chat(&messages, options).map_err(|e| match e {
            LlmError::Unavailable => AskError::Unavailable,
            LlmError::BudgetExceeded => AskError::BudgetExceeded,
            LlmError::Failed(m) => AskError::Failed(m),
        })?;
        match parse_ideas(&r.content) {
            Ok(v) => return Ok(v),
            Err(e) => {
                kiln_sdk::warn!("ideas reply unusable: {e}");
                messages.push(Message::assistant(r.content));
                messages.push(Message::user(format!(
                    "Your reply could not be used: {e}. Reply again with one ```json block: a list of {{\"family\", \"name\", \"idea\"}}."
                )));
                last = e;
            }
        }
    }
    Err(AskError::Unusable(last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ideas_parse() {
        let r = "Here:\n```json\n[{\"family\": \"precision\", \"name\": \"f32\", \"idea\": \"use float\"}, {\"idea\": \"unroll the loop by 4\"}]\n```";
        let v = parse_ideas(r).expect("parses");
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].family, Family::Precision);
        assert_eq!(v[1].family, Family::ControlFlow);
        assert!(parse_ideas("no json here").is_err());
        assert!(parse_ideas("[]").is_err());
    }
}
