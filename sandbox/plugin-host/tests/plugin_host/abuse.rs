//! `plugin_abuse_*`: plugins that loop, bomb memory, reach for files or sockets, lack
//! or fake their ABI version, spam stderr or wait forever are stopped or refused with
//! the reason, and the host carries on.

use std::time::{Duration, Instant};

use kiln_plugin_host::bridge::fake::FakeBridge;
use kiln_plugin_host::component;
use kiln_plugin_host::limits::Limits;
use kiln_plugin_host::outcome::Outcome;

use crate::guests;
use crate::run::{fake, quick_limits, run_with};

fn assert_refused(outcome: &Outcome, needles: &[&str]) {
    let Outcome::Refused(m) = outcome else {
        panic!("expected refused, got {outcome:?}");
    };
    for n in needles {
        assert!(m.contains(n), "{n:?} not in {m:?}");
    }
    assert_eq!(outcome.exit_code(), 15);
}

/// The plugin never ran: nothing reached the bridge but the context fetch.
fn assert_untouched(bridge: &FakeBridge) {
    let s = bridge.state();
    assert!(s.candidates.is_empty() && s.logs.is_empty() && s.checkpoint.is_none());
}

#[test]
fn plugin_abuse_infinite_loop_is_stopped_by_fuel() {
    let limits = Limits {
        fuel: Some(200_000_000),
        ..quick_limits()
    };
    let start = Instant::now();
    let report = run_with("kiln-test-plugin-abuse", &fake("spin"), &limits);
    assert_eq!(report.outcome, Outcome::OutOfFuel);
    assert_eq!(report.outcome.exit_code(), 12);
    assert_eq!(report.stats.fuel_used, 200_000_000);
    assert!(start.elapsed() < Duration::from_secs(15));
}

#[test]
fn plugin_abuse_infinite_loop_is_stopped_by_the_wall_clock() {
    let limits = Limits {
        fuel: None,
        wall: Duration::from_millis(700),
        ..quick_limits()
    };
    let start = Instant::now();
    let report = run_with("kiln-test-plugin-abuse", &fake("spin"), &limits);
    assert_eq!(report.outcome, Outcome::WallClock);
    assert_eq!(report.outcome.exit_code(), 13);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_secs(10),
        "{took:?}"
    );
}

#[test]
fn plugin_abuse_memory_bomb_is_stopped_at_the_cap() {
    let limits = Limits {
        memory_bytes: 32 << 20,
        ..quick_limits()
    };
    let report = run_with("kiln-test-plugin-abuse", &fake("membomb"), &limits);
    let Outcome::MemoryCap(m) = &report.outcome else {
        panic!("{:?}\nstderr: {}", report.outcome, report.stderr);
    };
    assert!(
        m.contains("memory cap") && m.contains(&(32usize << 20).to_string()),
        "{m}"
    );
    assert_eq!(report.outcome.exit_code(), 14);
    assert!(report.stats.peak_memory_bytes <= 32 << 20);
    assert!(report.stats.peak_memory_bytes > 16 << 20, "it did grow");
}

#[test]
fn plugin_abuse_waiting_forever_ends_at_the_wall_clock() {
    // Host calls cannot be interrupted by the epoch; the host must not wait past the
    // deadline itself, and must stop a plugin that only ever calls the host.
    let limits = Limits {
        fuel: None,
        wall: Duration::from_millis(800),
        ..quick_limits()
    };
    let bridge = fake("wait-forever");
    let start = Instant::now();
    let report = run_with("kiln-test-plugin-abuse", &bridge, &limits);
    assert_eq!(
        report.outcome,
        Outcome::WallClock,
        "stderr: {}",
        report.stderr
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(bridge.state().waits > 1);
}

#[test]
fn plugin_abuse_filesystem_import_is_refused_before_it_runs() {
    let bridge = fake("/etc/passwd");
    let report = run_with("kiln-test-plugin-snoop-fs", &bridge, &quick_limits());
    assert_refused(
        &report.outcome,
        &["wasi:filesystem/types", "wasi:filesystem/preopens"],
    );
    assert_untouched(&bridge);
    assert!(!report.stderr.contains("READ"));
}

#[test]
fn plugin_abuse_socket_and_clock_imports_are_refused_before_it_runs() {
    let bridge = fake("127.0.0.1:22");
    let report = run_with("kiln-test-plugin-snoop-net", &bridge, &quick_limits());
    assert_refused(
        &report.outcome,
        &[
            "wasi:sockets/tcp",
            "wasi:sockets/network",
            "wasi:clocks/wall-clock",
        ],
    );
    assert_untouched(&bridge);
}

#[test]
fn plugin_abuse_missing_abi_version_is_refused() {
    let wasm = guests::patched(
        &guests::bytes("kiln-example-minimal"),
        b"kiln:abi-version",
        b"kiln:abi-versioN",
    );
    let bridge = fake("");
    let report = component::run(&wasm, Box::new(bridge.clone()), &quick_limits());
    assert_refused(&report.outcome, &["no `kiln:abi-version` section"]);
    assert_untouched(&bridge);
}

#[test]
fn plugin_abuse_unsupported_abi_version_is_refused() {
    let mut from = b"kiln:abi-version".to_vec();
    from.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
    let mut to = b"kiln:abi-version".to_vec();
    to.extend_from_slice(&[0, 0, 0, 2, 0, 0]);
    let wasm = guests::patched(&guests::bytes("kiln-example-minimal"), &from, &to);
    let bridge = fake("");
    let report = component::run(&wasm, Box::new(bridge.clone()), &quick_limits());
    assert_refused(&report.outcome, &["needs ABI 0.2.0", "0.1.x"]);
    assert_untouched(&bridge);
}

#[test]
fn plugin_abuse_garbage_core_modules_and_truncated_components_are_refused() {
    let good = guests::bytes("kiln-example-minimal");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"#!/bin/sh\nrm -rf /\n".to_vec(), "not a valid WebAssembly"),
        (vec![0, b'a', b's', b'm', 1, 0, 0, 0], "core wasm module"),
        (good[..good.len() / 2].to_vec(), "not a valid WebAssembly"),
    ];
    for (wasm, want) in cases {
        let report = component::run(&wasm, Box::new(fake("")), &quick_limits());
        assert_refused(&report.outcome, &[want]);
    }
}

#[test]
fn plugin_abuse_stderr_spam_is_bounded_and_keeps_the_end() {
    let limits = Limits {
        stderr_bytes: 4096,
        ..quick_limits()
    };
    let report = run_with("kiln-test-plugin-abuse", &fake("spam-stderr"), &limits);
    assert!(
        matches!(report.outcome, Outcome::Ok(_)),
        "{:?}",
        report.outcome
    );
    assert!(report.stderr.len() < 4096 + 100, "{}", report.stderr.len());
    assert!(report.stderr.starts_with('['), "says what it dropped");
    assert!(report.stderr.ends_with("the end of the spam\n"));
}

#[test]
fn plugin_abuse_one_bad_plugin_does_not_affect_the_next() {
    // The same host process runs a bomb, then a good search.
    let bomb = Limits {
        memory_bytes: 32 << 20,
        ..quick_limits()
    };
    let report = run_with("kiln-test-plugin-abuse", &fake("membomb"), &bomb);
    assert!(matches!(report.outcome, Outcome::MemoryCap(_)));
    let report = run_with("kiln-example-minimal", &fake(""), &quick_limits());
    assert!(
        matches!(report.outcome, Outcome::Ok(_)),
        "{:?}",
        report.outcome
    );
}
