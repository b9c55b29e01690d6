//! A test proposer that misbehaves as its config says, for kiln-plugin-host's
//! `plugin_abuse_*` tests. Config words:
//!
//! - `spin`: loop forever without calling the host;
//! - `membomb`: allocate 1 MiB blocks until something stops it;
//! - `panic`: panic with a message (it should reach the captured stderr);
//! - `error`: return `Err("gave up on purpose")`;
//! - `exit`: call `std::process::exit(3)`;
//! - `host-calls`: exercise every import once and report what it saw;
//! - `spam-stderr`: write 1 MiB to stderr, then return ok;
//! - `wait-forever`: ask the host to wait for the seed for an hour, repeatedly;
//! - `flood-log`: write 20,000 log lines of 1 KiB, then return ok;
//! - `checkpoint-limits`: a checkpoint of exactly 16 MiB (restored and compared), then
//!   16 MiB + 1 byte and 40 MiB, and report what each got;
//! - `checkpoint-huge`: an 80 MiB checkpoint, past what wasmtime copies into the host;
//! - `huge-prompt`: a 5 MiB LLM prompt, then a small one, and report both errors.

use std::hint::black_box;
use std::io::Write;
use std::time::Duration;

use kiln_sdk::llm::{ChatOptions, LlmError, Message, chat};
use kiln_sdk::{CandidateBuilder, Proposer, Summary};

struct Abuse;

fn host_calls() -> Result<Summary, String> {
    let problem = kiln_sdk::problem().map_err(|e| e.to_string())?;
    let seed = problem.seed.ok_or("no seed")?;
    let first = kiln_sdk::submit(&seed).map_err(|e| e.to_string())?;
    let again = kiln_sdk::submit(&seed).map_err(|e| e.to_string())?;
    let bad = CandidateBuilder::from(&seed).source("").build();
    let mut invalid = seed.clone();
    invalid.problem = "another-problem".into();
    let refused = kiln_sdk::submit(&invalid);
    let evals = kiln_sdk::wait(std::slice::from_ref(&first.id), Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    let unknown = kiln_sdk::wait(&["nope".to_string()], Duration::from_secs(1));
    let archive = kiln_sdk::archive();
    let llm = chat(&[Message::user("hi")], &ChatOptions::default());
    let restored_before = kiln_sdk::restore();
    kiln_sdk::checkpoint(b"state-1").map_err(|e| e.to_string())?;
    let restored = kiln_sdk::restore();
    let too_big = kiln_sdk::checkpoint(&vec![0u8; 32 << 20]);
    let budget = kiln_sdk::budget();
    let t0 = kiln_sdk::now();
    let r1 = kiln_sdk::random_u64();
    let r2 = kiln_sdk::random_u64();
    let t1 = kiln_sdk::now();
    kiln_sdk::info!("hello from the plugin");
    let report = serde_json_like(&[
        ("search", problem.search_id),
        (
            "dup",
            format!(
                "{}",
                again.duplicate && !first.duplicate && again.id == first.id
            ),
        ),
        ("builder_refuses_empty", format!("{}", bad.is_err())),
        ("refused", format!("{refused:?}")),
        ("evals", format!("{}", evals.len())),
        (
            "verdict",
            format!("{:?}", evals.first().and_then(|e| e.verdict)),
        ),
        (
            "median",
            format!("{:?}", evals.first().and_then(|e| e.median_us)),
        ),
        (
            "full_parses",
            format!("{}", evals.first().and_then(|e| e.full()).is_some()),
        ),
        ("unknown", format!("{unknown:?}")),
        ("archive", format!("{}", archive.len())),
        (
            "llm",
            format!("{}", matches!(llm, Err(LlmError::Unavailable))),
        ),
        ("restored_before", format!("{restored_before:?}")),
        (
            "restored",
            format!("{:?}", restored.as_deref() == Some(&b"state-1"[..])),
        ),
        ("too_big", format!("{too_big:?}")),
        ("candidates_left", format!("{:?}", budget.candidates_left)),
        ("time_left", format!("{}", budget.time_left.is_some())),
        ("clock", format!("{}", t1 >= t0)),
        ("random", format!("{r1},{r2}")),
    ]);
    Ok(Summary::new(Some(first.id), report))
}

fn serde_json_like(pairs: &[(&str, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(";")
}

impl Proposer for Abuse {
    fn run(config: &str) -> Result<Summary, String> {
        match config {
            "spin" => {
                let mut x = 1u64;
                loop {
                    x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
            "membomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(black_box(vec![1u8; 1 << 20]));
                }
            }
            "panic" => panic!("the abuse plugin panicked on purpose"),
            "error" => Err("gave up on purpose".into()),
            "exit" => std::process::exit(3),
            "spam-stderr" => {
                let line = [b'x'; 1023];
                let mut err = std::io::stderr();
                for _ in 0..1024 {
                    let _ = err.write_all(&line);
                    let _ = err.write_all(b"\n");
                }
                let _ = err.write_all(b"the end of the spam\n");
                Ok(Summary::new(None, "spammed"))
            }
            "wait-forever" => {
                let problem = kiln_sdk::problem().map_err(|e| e.to_string())?;
                let seed = problem.seed.ok_or("no seed")?;
                let id = kiln_sdk::submit(&seed).map_err(|e| e.to_string())?.id;
                loop {
                    let _ = kiln_sdk::wait(std::slice::from_ref(&id), Duration::from_secs(3600));
                    let _ = kiln_sdk::wait(&["never-submitted".into()], Duration::from_secs(3600));
                }
            }
            "host-calls" => host_calls(),
            "flood-log" => {
                let filler = "x".repeat(1000);
                for i in 0..20_000 {
                    kiln_sdk::info!("flood line {i} {filler}");
                }
                Ok(Summary::new(None, "flooded"))
            }
            "checkpoint-limits" => {
                let at_limit = vec![7u8; 16 << 20];
                let saved = kiln_sdk::checkpoint(&at_limit);
                let restored = kiln_sdk::restore().as_deref() == Some(&at_limit[..]);
                let over = kiln_sdk::checkpoint(&vec![1u8; (16 << 20) + 1]);
                let big = kiln_sdk::checkpoint(&vec![2u8; 40 << 20]);
                let still = kiln_sdk::restore().as_deref() == Some(&at_limit[..]);
                Ok(Summary::new(
                    None,
                    serde_json_like(&[
                        ("at_limit", format!("{saved:?}")),
                        ("restored", format!("{restored}")),
                        ("over", format!("{over:?}")),
                        ("big", format!("{big:?}")),
                        ("kept", format!("{still}")),
                    ]),
                ))
            }
            "checkpoint-huge" => {
                let r = kiln_sdk::checkpoint(&vec![3u8; 80 << 20]);
                Err(format!("the 80 MiB checkpoint returned {r:?}"))
            }
            "huge-prompt" => {
                let huge = chat(
                    &[Message::user("y".repeat(5 << 20))],
                    &ChatOptions::default(),
                );
                let small = chat(&[Message::user("hi")], &ChatOptions::default());
                Ok(Summary::new(
                    None,
                    serde_json_like(&[
                        ("huge", format!("{:?}", huge.err())),
                        ("small", format!("{:?}", small.err())),
                    ]),
                ))
            }
            other => Err(format!("unknown config {other:?}")),
        }
    }
}

kiln_sdk::export_proposer!(Abuse);
