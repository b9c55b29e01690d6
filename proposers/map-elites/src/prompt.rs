//! The prompt map-elites sends: one edit of an elite, aware of the other elites.

use kiln_sdk::llm::{ChatOptions, Message};
use kiln_sdk::search::evidence;
use kiln_sdk::{Candidate, Evaluation, Problem};

use crate::Config;

const SYSTEM: &str = "You are an expert performance engineer evolving a population of kernels for kiln, \
which compiles, checks against a reference (with adversarial inputs) and times every candidate. \
The population keeps the fastest kernel of each behaviour (registers, shared memory, occupancy, block size), \
so changes that take a different approach are as welcome as small tweaks. \
Answer with a line `IDEA: <the change in one line>`, then the complete kernel source in one fenced code block \
(```c for C, ```cuda for CUDA, ```python for Triton). Keep the kernel's name and signature; \
add a ```json block {\"launches\": [...], \"flags\": [...]} only if the launch plan or flags change.";

/// Chat options from the config.
pub fn options(cfg: &Config) -> ChatOptions {
    ChatOptions {
        temperature: cfg.temperature,
        max_tokens: cfg.max_tokens,
        ..ChatOptions::default()
    }
}

/// Asks for one edit of `parent`; `others` are the island's other elites' notes.
pub fn mutate(
    problem: &Problem,
    parent: &Candidate,
    eval: Option<&Evaluation>,
    others: &[String],
) -> Vec<Message> {
    let mut u = evidence::problem(&problem.spec, &problem.device.backend);
    u.push_str(&evidence::language(parent));
    u.push_str(&format!(
        "Device: {}\n\nParent kernel:\n```\n",
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
    if !others.is_empty() {
        u.push_str("\nOther elites of this island (their changes):\n");
        for o in others {
            u.push_str(&format!("- {o}\n"));
        }
    }
    u.push_str("\nPropose one change that makes it faster or explores a different behaviour.");
    vec![Message::system(SYSTEM), Message::user(u)]
}
