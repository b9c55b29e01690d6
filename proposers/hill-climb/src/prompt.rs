//! The prompts hill-climb sends: one focused edit of the current kernel.

use kiln_sdk::llm::{ChatOptions, Message};
use kiln_sdk::search::evidence;
use kiln_sdk::{Candidate, Evaluation, Problem};

use crate::Config;

const SYSTEM: &str = "You are an expert performance engineer optimising one kernel for kiln, \
which compiles, checks against a reference (with adversarial inputs) and times every candidate. \
Make exactly one focused change that should make the kernel faster while staying within the tolerance. \
Answer with a line `IDEA: <the change in one line>`, then the complete kernel source in one fenced code block \
(```c for C, ```cuda for CUDA, ```python for Triton). Keep the kernel's name and signature; \
add a ```json block {\"launches\": [...], \"flags\": [...]} only if the launch plan or flags must change.";

/// Chat options from the config.
pub fn options(cfg: &Config) -> ChatOptions {
    ChatOptions {
        temperature: cfg.temperature,
        max_tokens: cfg.max_tokens,
        ..ChatOptions::default()
    }
}

/// Asks for one edit of `cur`, which has evidence `eval`, other than those in `avoid`.
pub fn improve(
    problem: &Problem,
    cur: &Candidate,
    eval: Option<&Evaluation>,
    avoid: &[String],
) -> Vec<Message> {
    let mut u = evidence::problem(&problem.spec, &problem.device.backend);
    u.push_str(&evidence::language(cur));
    u.push_str(&format!("Device: {}\n\n", problem.device.name));
    u.push_str("Current kernel:\n```\n");
    u.push_str(&cur.source);
    u.push_str("```\nLaunch plan and flags:\n```json\n");
    u.push_str(&evidence::launch_plan(cur));
    u.push_str("\n```\n\nIts evaluation:\n");
    match eval {
        Some(e) => u.push_str(&evidence::evaluation(e)),
        None => u.push_str("not evaluated yet\n"),
    }
    if !avoid.is_empty() {
        u.push_str("\nAlready proposed this step (propose something different):\n");
        for a in avoid {
            u.push_str(&format!("- {a}\n"));
        }
    }
    u.push_str("\nPropose one change that makes it faster.");
    vec![Message::system(SYSTEM), Message::user(u)]
}
