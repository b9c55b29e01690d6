//! Hostile candidates (tests/redteam/cases.toml), each through the real jail and worker,
//! each with its own expected verdict and evidence. The daemon's `redteam_*` tests run the
//! same cases through a real kilnd.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kiln_types::{Arg, Candidate, Language, Launch, Verdict};
use serde::Deserialize;

#[derive(Deserialize)]
struct Suite {
    problem: String,
    case: Vec<Case>,
    cache_case: Vec<CacheCase>,
}

/// A content-keyed cache, timed beside the honest kernel (see cases.toml).
#[derive(Deserialize)]
struct CacheCase {
    name: String,
    problem: String,
    file: String,
    kernel: String,
    args: Vec<Arg>,
    cheat: u32,
    scratch_elems: u64,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    file: String,
    kernel: String,
    args: Vec<Arg>,
    #[serde(default)]
    flags: Vec<String>,
    verdict: String,
    evidence: String,
    #[serde(default)]
    must_not_exist: Vec<PathBuf>,
    #[serde(default)]
    placeholder: Option<String>,
    #[serde(default)]
    memory_limit_mib: Option<u64>,
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/redteam")
}

fn suite() -> Suite {
    let text = std::fs::read_to_string(dir().join("cases.toml")).expect("cases.toml");
    toml::from_str(&text).expect("cases.toml parses")
}

fn run_case(name: &str) {
    let suite = suite();
    let case = suite
        .case
        .iter()
        .find(|c| c.name == name)
        .expect("case exists");
    let (tmp, mut cfg) = common::setup();
    cfg.compile_timeout = Duration::from_secs(3);
    if let Some(mib) = case.memory_limit_mib {
        cfg.memory_limit_bytes = mib << 20;
    }
    let hidden = tmp.path().join("state");
    std::fs::create_dir_all(&hidden).expect("state dir");
    std::fs::write(hidden.join("secret"), "secret").expect("secret");
    cfg.hidden_paths = vec![hidden.clone()];
    let mut source = std::fs::read_to_string(dir().join(&case.file)).expect("case source");
    if let Some(p) = &case.placeholder {
        source = source.replace(p, &hidden.join("secret").to_string_lossy());
    }
    let p = common::problem(&suite.problem);
    let candidate = Candidate {
        problem: p.name.clone(),
        language: Language::C,
        source,
        launches: vec![Launch {
            kernel: case.kernel.clone(),
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_bytes: 0,
            args: case.args.clone(),
            ..Launch::default()
        }],
        scratch: vec![],
        flags: case.flags.clone(),
        parent: None,
        note: None,
    };
    let mut plan = common::plan();
    plan.run_timeout_ms = 2000;
    let e = common::run(&cfg, &p, &candidate, &plan);
    let json = serde_json::to_string(&e).expect("json");
    eprintln!("{name}: {json}");
    assert_eq!(e.verdict.as_str(), case.verdict, "{name}: {json}");
    assert!(
        json.contains(&case.evidence),
        "{name}: evidence {:?} not in {json}",
        case.evidence
    );
    for path in &case.must_not_exist {
        assert!(!path.exists(), "{name}: {} was created", path.display());
    }
    std::fs::remove_dir_all(&hidden).expect("remove state");
    common::assert_clean(tmp.path());
}

/// The cheat's median under the contract must be at least this fraction of the honest
/// kernel's (or its verdict a failing one); under plain timing, below it. A cache hit is
/// 80 to 500 times faster than computing, so the median falls below a quarter only when
/// most timed samples hit; load on a shared machine moves honest medians by up to 2×.
const HONEST_FRACTION: f64 = 0.25;

fn cache_candidate(case: &CacheCase, cheat: bool) -> Candidate {
    let source = std::fs::read_to_string(dir().join(&case.file)).expect("case source");
    Candidate {
        problem: case.problem.clone(),
        language: Language::C,
        source,
        launches: vec![Launch {
            kernel: case.kernel.clone(),
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_bytes: 0,
            args: case.args.clone(),
            ..Launch::default()
        }],
        scratch: vec![kiln_types::ScratchBuffer {
            name: "cache".into(),
            dtype: kiln_types::Dtype::F32,
            elems: case.scratch_elems,
        }],
        flags: if cheat {
            vec![format!("-DKILN_CHEAT={}", case.cheat)]
        } else {
            Vec::new()
        },
        parent: None,
        note: None,
    }
}

fn median(e: &kiln_types::Evaluation) -> f64 {
    e.timing.as_ref().map_or(f64::NAN, |t| t.median_us)
}

fn run_cache_case(name: &str) {
    let suite = suite();
    let case = suite
        .cache_case
        .iter()
        .find(|c| c.name == name)
        .expect("cache case exists");
    let (tmp, mut cfg) = common::setup();
    cfg.memory_limit_bytes = 512 << 20;
    let p = common::problem(&case.problem);
    let plan = common::plan();
    let honest = common::run(&cfg, &p, &cache_candidate(case, false), &plan);
    assert_eq!(
        honest.verdict,
        Verdict::Ok,
        "{name}: honest kernel: {honest:#?}"
    );
    let cheat = common::run(&cfg, &p, &cache_candidate(case, true), &plan);
    let mut plain_plan = plan.clone();
    plain_plan.plain = Some(20);
    let plain = common::run(&cfg, &p, &cache_candidate(case, true), &plain_plan);
    // The honest kernel twice, the cheat between: other tests share the machine.
    let again = common::run(&cfg, &p, &cache_candidate(case, false), &plan);
    assert_eq!(
        again.verdict,
        Verdict::Ok,
        "{name}: honest kernel: {again:#?}"
    );
    let honest_us = median(&honest).min(median(&again));
    eprintln!(
        "{name}: honest {honest_us:.1} us, cheat {} {:.1} us, cheat with plain timing {} {:.1} us",
        cheat.verdict,
        median(&cheat),
        plain.verdict,
        median(&plain)
    );
    // The cache works where inputs repeat (a hit can be too quick to time at all)...
    let fast = match plain.verdict {
        Verdict::Ok => median(&plain) < HONEST_FRACTION * honest_us,
        Verdict::UnmeasurableTime => true,
        _ => panic!("{name}: plain: {plain:#?}"),
    };
    assert!(
        fast,
        "{name}: the cheat is no faster even on repeated inputs; the case tests nothing"
    );
    // ...and never wins under the contract.
    assert!(
        cheat.verdict != Verdict::Ok || median(&cheat) >= HONEST_FRACTION * honest_us,
        "{name}: the cache won the timing: {cheat:#?}"
    );
    common::assert_clean(tmp.path());
}

#[test]
fn host_hostile_every_cache_case_has_a_test() {
    let named = [
        "cache_static_softmax",
        "cache_scratch_softmax",
        "cache_high_bits_softmax",
        "cache_static_matmul",
        "cache_scratch_matmul",
        "cache_high_bits_matmul",
    ];
    for c in suite().cache_case {
        assert!(named.contains(&c.name.as_str()), "{} has no test", c.name);
        assert!(
            dir().join(&c.file).is_file(),
            "{}: {} missing",
            c.name,
            c.file
        );
    }
}

#[test]
fn host_hostile_cache_static_softmax() {
    run_cache_case("cache_static_softmax");
}

#[test]
fn host_hostile_cache_scratch_softmax() {
    run_cache_case("cache_scratch_softmax");
}

#[test]
fn host_hostile_cache_high_bits_softmax() {
    run_cache_case("cache_high_bits_softmax");
}

#[test]
fn host_hostile_cache_static_matmul() {
    run_cache_case("cache_static_matmul");
}

#[test]
fn host_hostile_cache_scratch_matmul() {
    run_cache_case("cache_scratch_matmul");
}

#[test]
fn host_hostile_cache_high_bits_matmul() {
    run_cache_case("cache_high_bits_matmul");
}

#[test]
fn host_hostile_suite_lists_every_source() {
    let suite = suite();
    assert!(suite.case.len() >= 25);
    for c in &suite.case {
        assert!(
            dir().join(&c.file).is_file(),
            "{}: {} missing",
            c.name,
            c.file
        );
    }
}

macro_rules! hostile {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run_case(stringify!($name).trim_start_matches("host_hostile_"));
            }
        )*
    };
}

hostile!(
    host_hostile_infinite_loop,
    host_hostile_fork_bomb,
    host_hostile_thread_spawn,
    host_hostile_memory_hog,
    host_hostile_output_flood,
    host_hostile_write_outside_scratch,
    host_hostile_network_socket,
    host_hostile_read_hidden_path,
    host_hostile_kill_parent,
    host_hostile_ptrace_parent,
    host_hostile_exec_shell,
    host_hostile_partial_output,
    host_hostile_stale_cache,
    host_hostile_modify_inputs,
    host_hostile_nondeterministic,
    host_hostile_stack_overflow,
    host_hostile_abort_call,
    host_hostile_segfault,
    host_hostile_write_past_buffer,
    host_hostile_exit_early,
    host_hostile_fake_done_early,
    host_hostile_constructor_writes_file,
    host_hostile_override_sigsys,
    host_hostile_unknown_function,
    host_hostile_unknown_buffer,
    host_hostile_disallowed_flag,
    host_hostile_include_dev_zero,
    host_hostile_object_bomb,
    host_hostile_macro_bomb,
    host_hostile_compile_timeout,
);
