//! Why a plugin host ended without reporting through `POST …/finish`: read from its last
//! stdout line (the same report it tried to post), else from its exit code or signal.

use kiln_sandbox::plugin_host::PluginHostEnd;

/// What each exit code of `kiln-plugin-host` means (docs/plugins.md).
fn exit_meaning(code: i32) -> &'static str {
    match code {
        0 => "the plugin returned a summary",
        10 => "plugin_error: the plugin returned an error",
        11 => "trap: the plugin trapped",
        12 => "out_of_fuel: the plugin used all its fuel",
        13 => "wall_clock: the plugin ran out of its wall-clock budget",
        14 => "memory_cap: the plugin's memory grew past the cap",
        15 => "refused: the plugin was refused",
        16 => "bridge: kilnd was unreachable or refused the token",
        1 => "host: a fault in the plugin host",
        2 => "usage error",
        _ => "unexpected exit code",
    }
}

/// What a signal that ended the host most likely means in the jail.
fn signal_meaning(signal: i32) -> &'static str {
    match signal {
        libc::SIGKILL => "killed (the cgroup's memory limit, or the jail)",
        libc::SIGXCPU => "its CPU-time limit was reached",
        libc::SIGXFSZ => "its file-size limit was reached",
        libc::SIGSYS => "a forbidden system call",
        libc::SIGSEGV | libc::SIGBUS => "a crash in the host",
        libc::SIGABRT => "the host aborted",
        _ => "killed by a signal",
    }
}

/// The `error` of the host's report line, as `kind: message`, when there is one.
fn reported_error(stdout_tail: &str) -> Option<String> {
    let line = stdout_tail.lines().rev().find(|l| !l.trim().is_empty())?;
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let e = v.get("error")?;
    let kind = e.get("kind").and_then(|k| k.as_str()).unwrap_or("error");
    let message = e.get("message").and_then(|m| m.as_str()).unwrap_or("");
    Some(format!("{kind}: {message}"))
}

/// The last few lines of the host's log, on one line.
fn log_tail(stderr_tail: &str) -> String {
    let lines: Vec<&str> = stderr_tail.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// The reason recorded on the search when the host ended without finishing it.
pub fn describe(end: &PluginHostEnd) -> String {
    let how = if end.timed_out {
        "the plugin host outlived its wall-clock budget and the jail killed it".to_string()
    } else if let Some(code) = end.code {
        match reported_error(&end.stdout_tail) {
            Some(err) => format!("{err} (plugin host exit {code})"),
            None => format!("plugin host exit {code}: {}", exit_meaning(code)),
        }
    } else if let Some(sig) = end.signal {
        format!(
            "the plugin host ended on signal {sig}: {}",
            signal_meaning(sig)
        )
    } else {
        "the plugin host ended with an unknown status".to_string()
    };
    let log = log_tail(&end.stderr_tail);
    if log.is_empty() {
        format!("{how}; the search was not finished by the host")
    } else {
        format!("{how}; the search was not finished by the host; its log: {log}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(code: Option<i32>, signal: Option<i32>, stdout: &str) -> PluginHostEnd {
        PluginHostEnd {
            code,
            signal,
            timed_out: false,
            stdout_tail: stdout.into(),
            stderr_tail: String::new(),
        }
    }

    #[test]
    fn the_report_line_wins_over_the_exit_code() {
        let line = r#"{"error":{"kind":"memory_cap","message":"the cap is 64 MiB"},"exit_code":14,"reported":false}"#;
        let why = describe(&end(Some(14), None, &format!("noise\n{line}\n")));
        assert!(
            why.starts_with("memory_cap: the cap is 64 MiB (plugin host exit 14)"),
            "{why}"
        );
    }

    #[test]
    fn without_a_report_the_exit_code_or_signal_explains() {
        let why = describe(&end(Some(16), None, ""));
        assert!(why.contains("exit 16: bridge"), "{why}");
        let why = describe(&end(None, Some(libc::SIGXCPU), "not json"));
        assert!(why.contains("CPU-time limit"), "{why}");
        let mut e = end(None, Some(libc::SIGKILL), "");
        e.timed_out = true;
        e.stderr_tail = "a\nb\n".into();
        let why = describe(&e);
        assert!(
            why.contains("jail killed it") && why.ends_with("its log: a | b"),
            "{why}"
        );
    }
}
