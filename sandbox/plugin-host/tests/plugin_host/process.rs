//! The real `kiln-plugin-host` binary against a fake kilnd on a Unix socket: the CLI,
//! the bearer token, the HTTP client, the final report and the exit codes.

use std::path::Path;
use std::process::{Command, Output};

use kiln_plugin_host::bridge::fake::FakeBridge;

use crate::fake_kilnd::FakeKilnd;
use crate::guests;
use crate::run::fake;

const TOKEN: &str = "tok-0123456789abcdef";

fn host(socket: &Path, token_file: &Path, wasm: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln-plugin-host"))
        .arg("--socket")
        .arg(socket)
        .args(["--search", "s-test", "--wall-secs", "30"])
        .arg("--token-file")
        .arg(token_file)
        .arg("--wasm")
        .arg(wasm)
        .args(extra)
        .env("KILN_LOG", "warn")
        .output()
        .expect("run kiln-plugin-host")
}

fn last_line(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "last stdout line is not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn token_file(dir: &tempfile::TempDir, token: &str) -> std::path::PathBuf {
    let p = dir.path().join("token");
    std::fs::write(&p, format!("{token}\n")).expect("write token");
    p
}

#[test]
fn binary_runs_the_example_against_a_fake_kilnd() {
    let kilnd = FakeKilnd::start(fake(""), TOKEN);
    let dir = tempfile::tempdir().expect("tempdir");
    let out = host(
        &kilnd.socket,
        &token_file(&dir, TOKEN),
        &guests::path("kiln-example-minimal"),
        &[],
    );
    let line = last_line(&out);
    assert_eq!(out.status.code(), Some(0), "{line}");
    assert_eq!(line["exit_code"], 0);
    assert_eq!(line["reported"], true);
    let s = kilnd.bridge.state();
    assert_eq!(s.candidates.len(), 3);
    let finished = s.finished.as_ref().expect("finish was posted");
    let ok = finished.ok.as_ref().expect("ok");
    assert_eq!(line["ok"]["best"], serde_json::json!(ok.best));
    assert!(ok.best.is_some());
    assert!(finished.stats.fuel_used > 0);
}

#[test]
fn binary_checkpoint_and_llm_errors_travel_over_http() {
    let kilnd = FakeKilnd::start(fake("host-calls"), TOKEN);
    let dir = tempfile::tempdir().expect("tempdir");
    let out = host(
        &kilnd.socket,
        &token_file(&dir, TOKEN),
        &guests::path("kiln-test-plugin-abuse"),
        &[],
    );
    let line = last_line(&out);
    assert_eq!(out.status.code(), Some(0), "{line}");
    let message = line["ok"]["message"].as_str().unwrap_or_default();
    for want in [
        "restored=true",
        "llm=true",
        "unknown=Err(UnknownCandidate",
        "dup=true",
    ] {
        assert!(message.contains(want), "{want} not in {message}");
    }
    assert_eq!(
        kilnd.bridge.state().checkpoint.as_deref(),
        Some(&b"state-1"[..])
    );
}

#[test]
fn binary_with_a_wrong_token_ends_with_bridge_and_reports_nothing() {
    let kilnd = FakeKilnd::start(fake(""), TOKEN);
    let dir = tempfile::tempdir().expect("tempdir");
    let out = host(
        &kilnd.socket,
        &token_file(&dir, "not-the-token"),
        &guests::path("kiln-example-minimal"),
        &[],
    );
    let line = last_line(&out);
    assert_eq!(out.status.code(), Some(16), "{line}");
    assert_eq!(line["error"]["kind"], "bridge");
    assert!(
        line["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("unauthorized")
    );
    assert_eq!(line["reported"], false);
    assert!(kilnd.bridge.state().finished.is_none());
}

#[test]
fn binary_without_kilnd_exits_16() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = host(
        &dir.path().join("no.sock"),
        &token_file(&dir, TOKEN),
        &guests::path("kiln-example-minimal"),
        &[],
    );
    assert_eq!(out.status.code(), Some(16));
    assert_eq!(last_line(&out)["error"]["kind"], "bridge");
}

#[test]
fn plugin_abuse_binary_reports_each_abuse_and_exits_with_its_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let no_abi = dir.path().join("no-abi.wasm");
    std::fs::write(
        &no_abi,
        guests::patched(
            &guests::bytes("kiln-example-minimal"),
            b"kiln:abi-version",
            b"kiln:abi-versioN",
        ),
    )
    .expect("write");
    let abuse = guests::path("kiln-test-plugin-abuse");
    let cases: Vec<(&str, std::path::PathBuf, Vec<&str>, i32, &str)> = vec![
        (
            "spin",
            abuse.clone(),
            vec!["--fuel", "100000000"],
            12,
            "out_of_fuel",
        ),
        (
            "spin",
            abuse.clone(),
            vec!["--fuel", "0", "--wall-secs", "1"],
            13,
            "wall_clock",
        ),
        (
            "membomb",
            abuse.clone(),
            vec!["--memory-mb", "32"],
            14,
            "memory_cap",
        ),
        ("panic", abuse.clone(), vec![], 11, "trap"),
        ("error", abuse, vec![], 10, "plugin_error"),
        (
            "",
            guests::path("kiln-test-plugin-snoop-fs"),
            vec![],
            15,
            "refused",
        ),
        (
            "",
            guests::path("kiln-test-plugin-snoop-net"),
            vec![],
            15,
            "refused",
        ),
        ("", no_abi, vec![], 15, "refused"),
    ];
    for (config, wasm, extra, code, kind) in cases {
        let bridge: FakeBridge = fake(config);
        let kilnd = FakeKilnd::start(bridge, TOKEN);
        let out = host(&kilnd.socket, &token_file(&dir, TOKEN), &wasm, &extra);
        let line = last_line(&out);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{config} {}: {line}",
            wasm.display()
        );
        assert_eq!(line["error"]["kind"], kind, "{line}");
        let s = kilnd.bridge.state();
        let finished = s.finished.as_ref().expect("the end was reported to kilnd");
        assert_eq!(finished.error.as_ref().map(|f| f.kind.as_str()), Some(kind));
        if config == "panic" {
            assert!(
                finished.stderr.contains("panicked on purpose"),
                "{}",
                finished.stderr
            );
        }
    }
}
