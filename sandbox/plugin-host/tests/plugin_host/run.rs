//! Well-behaved plugins against the in-memory bridge: the example search, every import,
//! and the plain ways a plugin can end.

use std::time::Duration;

use kiln_plugin_host::bridge::fake::FakeBridge;
use kiln_plugin_host::component;
use kiln_plugin_host::limits::Limits;
use kiln_plugin_host::outcome::{Outcome, Report};
use kiln_plugin_host::protocol::ChatReply;

use crate::guests;

pub fn fake(config: &str) -> FakeBridge {
    let mut ctx = FakeBridge::sample_context();
    ctx.config = config.into();
    FakeBridge::new(ctx, FakeBridge::sample_evaluate())
}

pub fn run_with(krate: &str, bridge: &FakeBridge, limits: &Limits) -> Report {
    component::run(&guests::bytes(krate), Box::new(bridge.clone()), limits)
}

pub fn quick_limits() -> Limits {
    Limits {
        fuel: Some(5_000_000_000),
        memory_bytes: 64 << 20,
        wall: Duration::from_secs(20),
        ..Limits::default()
    }
}

#[test]
fn example_plugin_runs_a_search_and_returns_the_best() {
    let bridge = fake("");
    let report = run_with("kiln-example-minimal", &bridge, &quick_limits());
    let Outcome::Ok(summary) = &report.outcome else {
        panic!("{:?}\nstderr: {}", report.outcome, report.stderr);
    };
    let s = bridge.state();
    assert_eq!(s.candidates.len(), 3, "one candidate per value of BLOCK");
    let (best_id, best, _) = s
        .candidates
        .iter()
        .find(|(_, c, _)| c.source.contains("#define BLOCK 64"))
        .expect("BLOCK=64 was submitted");
    assert_eq!(summary.best.as_ref(), Some(best_id));
    assert_eq!(best.note.as_deref(), Some("BLOCK=64"));
    assert!(summary.message.contains("BLOCK"), "{}", summary.message);
    assert!(
        s.logs
            .iter()
            .any(|l| l.level == "info" && l.message.contains("submitted BLOCK=16"))
    );
    assert!(report.stats.fuel_used > 0);
    assert!(report.stats.peak_memory_bytes > 0);
    assert_eq!(report.outcome.exit_code(), 0);
}

#[test]
fn every_import_reaches_the_bridge_with_typed_errors() {
    let bridge = fake("host-calls");
    bridge.state().candidates_left = Some(10);
    let report = run_with("kiln-test-plugin-abuse", &bridge, &quick_limits());
    let Outcome::Ok(summary) = &report.outcome else {
        panic!("{:?}\nstderr: {}", report.outcome, report.stderr);
    };
    let m = &summary.message;
    for want in [
        "search=s-test",
        "dup=true",
        "builder_refuses_empty=true",
        "refused=Err(Invalid(",
        "evals=1",
        "verdict=Some(Ok)",
        "median=Some(6.25)",
        "full_parses=true",
        "unknown=Err(UnknownCandidate(\"nope\"))",
        "archive=1",
        "llm=true",
        "restored_before=None",
        "restored=true",
        "too_big=Err(TooLarge(16777216))",
        "candidates_left=Some(9)",
        "time_left=true",
        "clock=true",
    ] {
        assert!(m.contains(want), "missing {want:?} in {m}");
    }
    let s = bridge.state();
    assert_eq!(s.checkpoint.as_deref(), Some(&b"state-1"[..]));
    assert!(s.logs.iter().any(|l| l.message == "hello from the plugin"));
    assert_eq!(s.llm_requests.len(), 1);
    assert_eq!(s.llm_requests[0].messages[0].content, "hi");
}

#[test]
fn random_stream_is_deterministic_from_the_search_seed() {
    let random = |seed: u64| {
        let bridge = fake("host-calls");
        bridge.state().context.random_seed = seed;
        let report = run_with("kiln-test-plugin-abuse", &bridge, &quick_limits());
        let Outcome::Ok(s) = report.outcome else {
            panic!("{:?}", report.outcome)
        };
        s.message
            .split(';')
            .find_map(|kv| kv.strip_prefix("random=").map(str::to_string))
            .expect("random reported")
    };
    assert_eq!(random(7), random(7));
    assert_ne!(random(7), random(8));
}

#[test]
fn llm_replies_and_failures_are_passed_through() {
    let bridge = fake("host-calls");
    bridge.state().llm_replies.push_back(Ok(ChatReply {
        content: "use float4".into(),
        model: "m".into(),
        prompt_tokens: 1,
        completion_tokens: 2,
        finish_reason: "stop".into(),
    }));
    let report = run_with("kiln-test-plugin-abuse", &bridge, &quick_limits());
    let Outcome::Ok(s) = report.outcome else {
        panic!("{:?}", report.outcome)
    };
    // The plugin reports `llm=true` only for `unavailable`; a real reply makes it false.
    assert!(s.message.contains("llm=false"), "{}", s.message);
}

#[test]
fn plugin_error_is_reported_with_its_reason() {
    let report = run_with("kiln-test-plugin-abuse", &fake("error"), &quick_limits());
    assert_eq!(
        report.outcome,
        Outcome::PluginError("gave up on purpose".into())
    );
    assert_eq!(report.outcome.exit_code(), 10);
    let finish = report.finish();
    assert_eq!(finish.error.map(|f| f.kind), Some("plugin_error".into()));
}

#[test]
fn panic_is_a_trap_with_the_message_in_stderr() {
    let report = run_with("kiln-test-plugin-abuse", &fake("panic"), &quick_limits());
    assert!(
        matches!(report.outcome, Outcome::Trap(_)),
        "{:?}",
        report.outcome
    );
    assert!(
        report
            .stderr
            .contains("the abuse plugin panicked on purpose"),
        "stderr: {}",
        report.stderr
    );
}

#[test]
fn exit_is_a_trap_naming_the_code() {
    let report = run_with("kiln-test-plugin-abuse", &fake("exit"), &quick_limits());
    // WASI 0.2's `exit` carries only success or failure, so Rust's `exit(3)` arrives as 1.
    assert_eq!(
        report.outcome,
        Outcome::Trap("the plugin called exit(1)".into())
    );
}
