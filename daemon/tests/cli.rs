//! The `kiln` CLI and `kilnd`'s own flags, run as the real binaries.

mod common;

use std::process::Command;

use common::{Daemon, write_double_problem};

fn kiln(d: &Daemon, args: &[&str]) -> std::process::Output {
    Command::new(common::kiln_cli())
        .env("KILN_SOCKET", &d.socket)
        .args(args)
        .output()
        .expect("run kiln")
}

#[test]
fn status_json_is_valid_json() {
    let d = Daemon::start("");
    let out = kiln(&d, &["status", "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status -o json is JSON");
    assert_eq!(v["health"]["status"], "ok");
    assert!(v["info"]["backends"].is_array());
}

#[test]
fn status_without_a_daemon_says_how_to_start_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(common::kiln_cli())
        .args(["--socket"])
        .arg(dir.path().join("none.sock"))
        .arg("status")
        .output()
        .expect("run kiln");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kilnd is not running"), "{err}");
    assert!(err.contains("Start it with `kilnd`"), "{err}");
    assert_eq!(err.trim().lines().count(), 2, "short and clear: {err}");
}

/// A folder of problems where kilnd refuses one (its name is taken by another spec):
/// that one is reported with kilnd's reason, every other is registered, and the exit
/// status says something was refused.
#[test]
fn problems_add_goes_on_past_a_refused_problem() {
    let d = Daemon::start("");
    let first = tempfile::tempdir().expect("tempdir");
    write_double_problem(first.path(), "taken");
    let out = kiln(
        &d,
        &["problems", "add", first.path().to_str().expect("utf8")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let folder = tempfile::tempdir().expect("tempdir");
    let changed = write_double_problem(folder.path(), "taken");
    let toml = std::fs::read_to_string(changed.join("problem.toml")).expect("toml");
    std::fs::write(
        changed.join("problem.toml"),
        toml.replace("y = 2x", "y = 2x, again"),
    )
    .expect("rewrite");
    write_double_problem(folder.path(), "fresh");
    let out = kiln(
        &d,
        &["problems", "add", folder.path().to_str().expect("utf8")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "a refusal fails the command: {stdout}"
    );
    assert!(stdout.contains("refused: taken (conflict)"), "{stdout}");
    assert!(stdout.contains("registered: fresh"), "{stdout}");
    let out = kiln(&d, &["problems", "list", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = v["problems"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert!(
        names.contains(&"fresh") && names.contains(&"taken"),
        "{names:?}"
    );
}

#[test]
fn problems_add_list_show_through_the_cli() {
    let d = Daemon::start("");
    let dir = write_double_problem(d.dir.path(), "cli-double");
    let out = kiln(&d, &["problems", "add", dir.to_str().expect("utf8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("registered: cli-double"));
    let out = kiln(&d, &["problems", "list", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["problems"][0]["name"], "cli-double");
    let out = kiln(&d, &["problems", "show", "cli-double"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("input") && text.contains("1024"), "{text}");
    // A folder without problem.toml is a clear error, not a panic.
    let out = kiln(
        &d,
        &[
            "problems",
            "add",
            d.dir.path().join("state").to_str().expect("utf8"),
        ],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("problem.toml"));
    // A problem named only with dots is refused before anything is sent.
    let dots = write_double_problem(d.dir.path(), "dots");
    let toml = std::fs::read_to_string(dots.join("problem.toml")).expect("read");
    std::fs::write(
        dots.join("problem.toml"),
        toml.replace("name = \"dots\"", "name = \"..\""),
    )
    .expect("write");
    let out = kiln(&d, &["problems", "add", dots.to_str().expect("utf8")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("only dots"), "{err}");
}

#[test]
fn submit_refuses_bad_files_clearly() {
    let d = Daemon::start("");
    let bad = d.dir.path().join("bad.json");
    std::fs::write(&bad, "{ not json").expect("write");
    let out = kiln(
        &d,
        &["submit", "--problem", "x", bad.to_str().expect("utf8")],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not JSON"));
    let out = kiln(&d, &["submit", "--problem", "missing", "--seed"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("404"));
}

#[test]
fn print_default_config_is_the_whole_commented_toml() {
    let out = Command::new(env!("CARGO_BIN_EXE_kilnd"))
        .arg("--print-default-config")
        .output()
        .expect("run kilnd");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let cfg = kiln_daemon::config::Config::from_toml(&text, std::path::Path::new("stdout"))
        .expect("printed config parses");
    assert_eq!(cfg, kiln_daemon::config::Config::default());
    for section in [
        "[server]",
        "[access]",
        "[queue]",
        "[evaluation]",
        "[evaluation.timing]",
        "[jail]",
        "[gpu]",
        "[log]",
    ] {
        assert!(text.contains(section), "missing {section}");
    }
}

/// Starts kilnd with `config` as its config file; it must refuse it. Its stderr.
fn refused_config(config: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, config).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_kilnd"))
        .arg("--config")
        .arg(&cfg)
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .expect("run kilnd");
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn kilnd_refuses_a_bad_config_file_by_name() {
    let err = refused_config("[queue]\nmax_attempts = \"three\"\n");
    assert!(
        err.contains("bad.toml") && err.contains("max_attempts"),
        "{err}"
    );
    // The removed fresh_inputs_every cannot be set back silently: refused, with the reason.
    let err = refused_config("[evaluation.timing]\nfresh_inputs_every = 8\n");
    assert!(err.contains("every timed sample"), "{err}");
}

#[test]
fn systemd_hears_ready_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().expect("tempdir");
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).expect("bind notify socket");
    notify
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    let socket = dir.path().join("k.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kilnd"))
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("NOTIFY_SOCKET", &notify_path)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn kilnd");
    let mut buf = [0u8; 512];
    let n = notify.recv(&mut buf).expect("a notification");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.contains("READY=1"), "{msg}");
    assert!(msg.contains("STATUS=serving"), "{msg}");
    // The socket answers once READY has been sent.
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_ok());
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let n = notify.recv(&mut buf).expect("a stopping notification");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
    assert!(child.wait().expect("wait").success());
    assert!(!socket.exists(), "the socket is removed at exit");
}

#[test]
fn doctor_runs_a_known_kernel_end_to_end() {
    let d = Daemon::start("");
    let problems = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../problems/vecadd-4096");
    let out = kiln(&d, &["problems", "add", problems.to_str().expect("utf8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kiln(&d, &["doctor", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor -o json");
    assert!(out.status.success(), "{v:#}");
    let runs = v["known_kernels"].as_array().expect("known kernels");
    let host = runs
        .iter()
        .find(|r| r["backend"] == "host")
        .unwrap_or_else(|| panic!("no host run: {v:#}"));
    assert_eq!(host["verdict"], "ok", "{host:#}");
    assert!(
        host["median_us"].as_f64().is_some_and(|t| t > 0.0),
        "{host:#}"
    );
    // The clock-lock check is read-only and always answers.
    assert!(v["clock_lock"]["permitted"].is_boolean(), "{v:#}");
    let out = kiln(&d, &["doctor", "--no-run"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("clock locking:"), "{text}");
    assert!(!text.contains("known kernels"), "{text}");
}

#[test]
fn doctor_says_which_cuda_headers_cuda_compiles_get() {
    let t = tempfile::tempdir().expect("tempdir");
    let inc = t.path().join("include");
    std::fs::create_dir_all(inc.join("cccl")).expect("mkdir");
    std::fs::write(inc.join("cuda_runtime.h"), "").expect("write");
    std::fs::write(inc.join("cuda.h"), "#define CUDA_VERSION 13000\n").expect("write");
    let d = Daemon::start(&format!(
        "[cuda]\ninclude_dirs = [{:?}]\n",
        inc.to_str().expect("utf8")
    ));
    let out = kiln(&d, &["doctor", "--no-run", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor -o json");
    let h = &v["cuda_headers"];
    assert_eq!(h["found"], true, "{h:#}");
    assert_eq!(h["version"], "13.0", "{h:#}");
    let want = std::fs::canonicalize(&inc).expect("canonical");
    assert_eq!(h["dirs"][0], want.to_str().expect("utf8"), "{h:#}");
    let out = kiln(&d, &["doctor", "--no-run"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("CUDA 13.0 headers at"), "{text}");
    assert!(text.contains("NVRTC "), "{text}");

    // A folder that is not there: kiln says clearly that the headers are unavailable.
    let d = Daemon::start("[cuda]\ninclude_dirs = [\"/nonexistent-kiln-cuda/include\"]\n");
    let out = kiln(&d, &["doctor", "--no-run", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor -o json");
    let h = &v["cuda_headers"];
    assert_eq!(h["found"], false, "{h:#}");
    assert!(
        h["detail"]
            .as_str()
            .is_some_and(|s| s.contains("cuda_fp16.h") && s.contains("unavailable")),
        "{h:#}"
    );
    assert_eq!(h["searched"][0]["note"], "not a directory", "{h:#}");
}

/// The README's own example candidate (the ```json block after "A candidate is a JSON
/// file"), submitted as the README says (`kiln submit --problem vecadd-4096 FILE --wait`)
/// against the repository's vecadd-4096, comes back `ok`: the README cannot drift from the
/// problem it names (it once said output `c`; the problem's is `y`).
#[test]
fn the_readme_example_candidate_is_ok() {
    let root = common::repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let after = readme
        .split_once("A candidate is a JSON file")
        .expect("README.md introduces its example candidate")
        .1;
    let block = after
        .split_once("```json\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .expect("a ```json block follows")
        .0;
    let example: serde_json::Value = serde_json::from_str(block).expect("the example is JSON");
    let problem = example["problem"].as_str().expect("it names a problem");
    let d = Daemon::start("");
    let dir = root.join("problems").join(problem);
    let out = kiln(&d, &["problems", "add", dir.to_str().expect("utf8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = d.dir.path().join("my-candidate.json");
    std::fs::write(&file, block).expect("write");
    let out = kiln(
        &d,
        &[
            "submit",
            "--problem",
            problem,
            file.to_str().expect("utf8"),
            "--wait",
            "-o",
            "json",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the README's candidate: {stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("submit -o json is JSON");
    assert_eq!(v["evaluation"]["verdict"], "ok", "{v}");
}

/// The API's document for candidate `id` (what `-o json` must print unchanged).
fn candidate_document(d: &Daemon, id: &str) -> serde_json::Value {
    let (status, body) = common::raw_request(
        &d.socket,
        format!("GET /v1/candidates/{id} HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("the API's record is JSON")
}

/// Human output is for people: `kiln submit --wait` and `kiln show` print the jail as a
/// labelled summary (namespaces, seccomp, cgroup) and never a JSON object; `-o json` stays
/// the API's document, key for key.
#[test]
fn submit_wait_and_show_print_labelled_lines_and_json_stays_the_document() {
    let d = Daemon::start("");
    let dir = write_double_problem(d.dir.path(), "human-double");
    let out = kiln(&d, &["problems", "add", dir.to_str().expect("utf8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let human = |out: &std::process::Output| {
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            d.log()
        );
        for want in ["  verdict   ok", "  time      median", "  trials    "] {
            assert!(
                text.lines().any(|l| l.starts_with(want)),
                "no {want:?}:\n{text}"
            );
        }
        let jail = text
            .lines()
            .find(|l| l.starts_with("  jail      "))
            .unwrap_or_else(|| panic!("no jail line:\n{text}"));
        assert!(
            jail.contains("namespaces ") && jail.contains("seccomp "),
            "{jail}"
        );
        assert!(
            !text.contains("{\"") && !text.contains("\":"),
            "JSON in:\n{text}"
        );
        text
    };
    let submitted = human(&kiln(
        &d,
        &["submit", "--problem", "human-double", "--seed", "--wait"],
    ));
    let id = submitted
        .split_whitespace()
        .nth(1)
        .expect("`candidate ID …` first")
        .to_string();
    let shown = human(&kiln(&d, &["show", &id]));
    assert_eq!(shown, submitted, "submit --wait and show print the same");

    let doc = candidate_document(&d, &id);
    let out = kiln(&d, &["show", &id, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("show -o json");
    assert_eq!(v, doc, "show -o json is the API's document");
    // submit --wait -o json: the same document (the same candidate again), same keys.
    let out = kiln(
        &d,
        &[
            "submit",
            "--problem",
            "human-double",
            "--seed",
            "--wait",
            "-o",
            "json",
        ],
    );
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("submit -o json");
    let keys = |v: &serde_json::Value| -> Vec<String> {
        v.as_object().expect("an object").keys().cloned().collect()
    };
    assert_eq!(keys(&v), keys(&doc));
    assert_eq!(v["id"], doc["id"]);
    assert_eq!(v["evaluation"], doc["evaluation"]);
    assert!(
        v["evaluation"]["telemetry"]["jail"]["active"].is_array(),
        "{v:#}"
    );
}
