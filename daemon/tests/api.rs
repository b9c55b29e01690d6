//! The API against a real kilnd over real HTTP on a temporary socket.

mod common;
#[path = "api/docs_routes.rs"]
mod docs_routes;
#[path = "api/hosted.rs"]
mod hosted;

use common::{Daemon, double_candidate, raw_request, register, write_double_problem};
use kiln_daemon::client::ClientError;
use serde_json::json;

#[tokio::test]
async fn health_and_info_answer() {
    let d = Daemon::start("");
    let c = d.client();
    let h = c.get("/v1/health").await.expect("health");
    assert_eq!(h["status"], "ok");
    assert_eq!(h["version"], env!("CARGO_PKG_VERSION"));
    let info = c.get("/v1/info").await.expect("info");
    let names: Vec<&str> = info["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .filter_map(|b| b["name"].as_str())
        .collect();
    assert!(names.contains(&"host") && names.contains(&"cuda"), "{info}");
    for b in info["backends"].as_array().expect("backends") {
        assert!(b["usable"].is_boolean() && b["detail"].is_string(), "{b}");
    }
    // Without NVML the GPU list is empty and says why; with it, GPUs are listed.
    let gpus = info["gpus"].as_array().expect("gpus");
    assert!(!gpus.is_empty() || info["gpu_error"].is_string(), "{info}");
    assert!(info["host"]["cpus"].as_u64().unwrap_or(0) >= 1, "{info}");
}

#[tokio::test]
async fn a_caller_outside_the_allow_list_gets_403() {
    let d = Daemon::start(
        "[access]\nallow_daemon_user = false\nallow_root = false\ngroup = \"\"\nallow_uids = [4000000]\n",
    );
    let err = d.client().get("/v1/health").await.expect_err("refused");
    match err {
        ClientError::Api { status, code, .. } => {
            assert_eq!((status, code.as_str()), (403, "forbidden"));
        }
        other => panic!("expected 403, got {other}"),
    }
    assert!(
        d.log().contains("refused a connection"),
        "log:\n{}",
        d.log()
    );
}

#[tokio::test]
async fn bad_requests_get_json_errors_and_the_daemon_keeps_serving() {
    let d = Daemon::start("[server]\nmax_body_bytes = 4096\n");
    let c = d.client();
    let cases: Vec<(&[u8], u16, &str)> = vec![
        (b"{not json", 400, "invalid_json"),
        (br#"{"problem":"p","language":"c","source":"x","launches":[],"bogus":true}"#, 400, "bogus"),
        (br#"{"problem":"p","language":"c","source":"x","launches":[{"kernel":"k","grid":"x"}]}"#, 400, "launches[0].grid"),
        (br#"{"problem":"p","language":"fortran","source":"x","launches":[]}"#, 400, "language"),
        (br#"{"problem":"p","language":"c","source":"x","launches":[]}"#, 400, "launches"),
        (br#"{"problem":"nope","language":"c","source":"x","launches":[{"kernel":"k"}]}"#, 404, "nope"),
    ];
    for (body, want_status, needle) in cases {
        let req = format!(
            "POST /v1/candidates HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        let (status, text) = raw_request(&d.socket, &bytes);
        assert_eq!(
            status,
            want_status,
            "body {}: {text}",
            String::from_utf8_lossy(body)
        );
        let v: serde_json::Value = serde_json::from_str(&text).expect("JSON error body");
        assert!(v["error"]["code"].is_string(), "{v}");
        let code = v["error"]["code"].as_str().unwrap_or("");
        let message = v["error"]["message"].as_str().unwrap_or("");
        assert!(
            code == needle || message.contains(needle),
            "expected {needle:?} in {v}"
        );
    }
    // Oversized body.
    let big = vec![b' '; 10_000];
    let req = format!(
        "POST /v1/candidates HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        big.len()
    );
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(&big);
    let (status, text) = raw_request(&d.socket, &bytes);
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("payload_too_large"), "{text}");
    // Garbage that is not HTTP at all, then a bad query string.
    let _ = raw_request(&d.socket, b"\x00\x01garbage\r\n\r\n");
    let (status, text) = raw_request(
        &d.socket,
        b"GET /v1/candidates?limit=lots HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("invalid_query"), "{text}");
    // Still serving.
    assert_eq!(c.get("/v1/health").await.expect("health")["status"], "ok");
}

#[tokio::test]
async fn problems_register_list_show_and_conflict() {
    let d = Daemon::start("");
    let c = d.client();
    let dir = write_double_problem(d.dir.path(), "double-1024");
    let v = register(&c, &dir).await;
    assert_eq!(v["created"], true);
    let again = register(&c, &dir).await;
    assert_eq!(again["created"], false);
    let list = c.get("/v1/problems").await.expect("list");
    assert_eq!(list["problems"][0]["name"], "double-1024");
    let shown = c.get("/v1/problems/double-1024").await.expect("show");
    assert_eq!(shown["derived"]["input_bytes"], 4096);
    assert!(
        shown["spec"]["reference"]["host"]["source"]
            .as_str()
            .unwrap_or("")
            .contains("ref_double")
    );
    // Same name, different spec: conflict.
    let mut spec = shown["spec"].clone();
    spec["summary"] = json!("changed");
    match c.post("/v1/problems", &spec).await {
        Err(ClientError::Api { status, .. }) => assert_eq!(status, 409),
        other => panic!("expected 409, got {other:?}"),
    }
    // An invalid spec names what is wrong.
    spec["name"] = json!("Bad Name");
    match c.post("/v1/problems", &spec).await {
        Err(ClientError::Api {
            status, message, ..
        }) => {
            assert_eq!(status, 400);
            assert!(message.contains("name"), "{message}");
        }
        other => panic!("expected 400, got {other:?}"),
    }
    // Names made of dots, or hidden ones, would read as path segments: refused.
    for bad in [".", "..", "...", ".double"] {
        spec["name"] = json!(bad);
        match c.post("/v1/problems", &spec).await {
            Err(ClientError::Api {
                status, message, ..
            }) => {
                assert_eq!(status, 400, "{bad}");
                assert!(
                    message.contains("starting with a letter or a digit"),
                    "{bad}: {message}"
                );
            }
            other => panic!("{bad}: expected 400, got {other:?}"),
        }
    }
    let list = c.get("/v1/problems").await.expect("list");
    assert_eq!(list["problems"].as_array().map(Vec::len), Some(1), "{list}");
    match c.get("/v1/problems/missing").await {
        Err(ClientError::Api { status, .. }) => assert_eq!(status, 404),
        other => panic!("expected 404, got {other:?}"),
    }
}

#[tokio::test]
async fn a_duplicate_candidate_returns_the_stored_record() {
    let d = Daemon::start("");
    let c = d.client();
    register(&c, &write_double_problem(d.dir.path(), "dup")).await;
    let cand = double_candidate("dup", "for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];");
    let (s1, first) = c.post("/v1/candidates", &cand).await.expect("submit");
    assert_eq!(s1, 202);
    assert_eq!(first["duplicate"], false);
    // Same code with a different note and trailing whitespace: same candidate.
    let mut again = cand.clone();
    again["note"] = json!("resubmitted");
    again["source"] = json!(format!("{}   \n\n", cand["source"].as_str().unwrap_or("")));
    let (s2, second) = c
        .post("/v1/candidates", &again)
        .await
        .expect("submit again");
    assert_eq!(s2, 200);
    assert_eq!(second["duplicate"], true);
    assert_eq!(second["id"], first["id"]);
    assert_eq!(second["job_id"], first["job_id"]);
    assert_eq!(second["record"]["id"], first["id"]);
    let listed = c.get("/v1/candidates?problem=dup").await.expect("list");
    assert_eq!(listed["candidates"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn lanes_are_listed_and_a_job_can_be_pinned_to_one() {
    let d = Daemon::start("");
    let c = d.client();
    register(&c, &write_double_problem(d.dir.path(), "pin")).await;
    let info = c.get("/v1/info").await.expect("info");
    let host: Vec<&serde_json::Value> = info["lanes"]
        .as_array()
        .expect("lanes")
        .iter()
        .filter(|l| l["backend"] == "host")
        .collect();
    assert_eq!(host.len(), 1, "{info:#}");
    assert_eq!(
        (host[0]["lane"].as_u64(), host[0]["label"].as_str()),
        (Some(0), Some("cpu"))
    );
    assert!(info["gpu_devices"].is_array(), "{info:#}");

    // The host has lane 0 only: lane 1 is refused before anything is stored or queued.
    // The kernel repeats its pass so that its time is well above the host timer's
    // overhead (one pass would be `unmeasurable_time` on a loaded machine).
    let cand = double_candidate(
        "pin",
        "for (int r = 0; r < 400; r++) for (int i = 0; i < n; i++) y[i] = x[i] * 2.0f + (float)(r - r);",
    );
    let code = |e: ClientError| match e {
        ClientError::Api {
            status,
            code,
            message,
            ..
        } => (status, code, message),
        other => panic!("expected an API error, got {other}"),
    };
    let (status, code_name, message) = code(
        c.post("/v1/candidates?lane=1", &cand)
            .await
            .expect_err("no lane 1"),
    );
    assert_eq!((status, code_name.as_str()), (400, "invalid_field"));
    assert!(
        message.contains("lane") && message.contains("1 lane(s)"),
        "{message}"
    );
    let listed = c.get("/v1/candidates?problem=pin").await.expect("list");
    assert_eq!(listed["candidates"].as_array().map(Vec::len), Some(0));

    // Lane 0: evaluated there, and the lane's busy time grows.
    let (status, sub) = c
        .post("/v1/candidates?lane=0", &cand)
        .await
        .expect("pinned");
    assert_eq!(status, 202);
    let id = sub["id"].as_str().expect("id");
    let rec = c
        .get(&format!("/v1/candidates/{id}?wait=120"))
        .await
        .expect("wait");
    assert_eq!(rec["evaluation"]["verdict"], "ok", "{rec:#}");
    assert_eq!(rec["job"]["options"]["lane"], 0, "{rec:#}");
    let again = c
        .post(&format!("/v1/candidates/{id}/jobs"), &json!({"lane": 4}))
        .await
        .expect_err("no lane 4");
    assert_eq!(code(again).0, 400);
    let info = c.get("/v1/info").await.expect("info");
    let busy = info["lanes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| l["backend"] == "host")
        .and_then(|l| l["busy_s"].as_f64());
    assert!(busy.is_some_and(|b| b > 0.0), "{info:#}");
}

#[tokio::test]
async fn sse_client_sees_a_state_change() {
    let d = Daemon::start("");
    let c = d.client();
    register(&c, &write_double_problem(d.dir.path(), "sse")).await;
    let mut events = c.events().await.expect("events");
    let (name, _) = events.next().await.expect("hello");
    assert_eq!(name, "hello");
    let (_, sub) = c
        .post(
            "/v1/candidates",
            &double_candidate("sse", "for (int i = 0; i < n; i++) y[i] = x[i] + x[i];"),
        )
        .await
        .expect("submit");
    let (name, data) = tokio::time::timeout(std::time::Duration::from_secs(20), events.next())
        .await
        .expect("an event in time")
        .expect("stream open");
    assert_eq!(name, "job");
    assert_eq!(data["candidate_id"], sub["id"]);
    assert_eq!(data["job_id"], sub["job_id"]);
    assert!(data["state"].is_string(), "{data}");
}

/// Checks one exposition line: `name{label="v",...} value`.
fn valid_sample_line(line: &str) -> bool {
    let (head, value) = match line.rsplit_once(' ') {
        Some(x) => x,
        None => return false,
    };
    if value.parse::<f64>().is_err() {
        return false;
    }
    let name_end = head.find('{').unwrap_or(head.len());
    let name = &head[..name_end];
    let name_ok = !name.is_empty()
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if !name_ok {
        return false;
    }
    if name_end == head.len() {
        return true;
    }
    let labels = &head[name_end..];
    labels.ends_with('}')
        && labels[1..labels.len() - 1]
            .split("\",")
            .all(|kv| kv.split_once("=\"").is_some_and(|(k, _)| !k.is_empty()))
}

#[tokio::test]
async fn metrics_parse_as_prometheus_text() {
    let d = Daemon::start("");
    let c = d.client();
    c.get("/v1/health").await.expect("health");
    let text = c.get_text("/metrics").await.expect("metrics");
    let mut samples = 0;
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            assert!(
                rest.starts_with("HELP ") || rest.starts_with("TYPE "),
                "bad comment {line:?}"
            );
            continue;
        }
        assert!(valid_sample_line(line), "bad sample line {line:?}");
        samples += 1;
    }
    assert!(samples > 0);
    assert!(text.contains("kiln_queue_depth "), "{text}");
    assert!(text.contains("kiln_jobs{state=\"queued\"}"), "{text}");
    assert!(
        text.contains("kiln_requests_total{method=\"GET\",route=\"/v1/health\",status=\"200\"} 1"),
        "{text}"
    );
    assert!(!valid_sample_line("bad line"));
    assert!(!valid_sample_line("m{a=\"1\" 2"));
}

#[tokio::test]
async fn sigkill_and_restart_lose_no_accepted_job() {
    let mut d = Daemon::start("");
    let c = d.client();
    register(&c, &write_double_problem(d.dir.path(), "durable")).await;
    let mut ids = Vec::new();
    for i in 0..12 {
        let body = format!("for (int i = 0; i < n; i++) y[i] = 2.0f * x[i] + 0.0f * {i};");
        let (_, sub) = c
            .post("/v1/candidates", &double_candidate("durable", &body))
            .await
            .expect("submit");
        ids.push((
            sub["id"].as_str().expect("id").to_string(),
            sub["job_id"].as_i64().expect("job"),
        ));
    }
    d.kill9();
    d.spawn();
    let c = d.client();
    for (id, job) in &ids {
        let rec = c
            .get(&format!("/v1/candidates/{id}"))
            .await
            .expect("candidate survives");
        assert_eq!(rec["id"], id.as_str());
        let j = c
            .get(&format!("/v1/jobs/{job}"))
            .await
            .expect("job survives");
        assert!(
            matches!(
                j["state"].as_str(),
                Some("queued" | "compiling" | "compiled" | "running" | "done")
            ),
            "job {job} after restart: {j}"
        );
    }
    assert!(d.terminate(), "SIGTERM exits cleanly; log:\n{}", d.log());
}

#[tokio::test]
async fn a_second_daemon_on_the_same_state_refuses_to_start() {
    let d = Daemon::start("");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kilnd"))
        .arg("--socket")
        .arg(d.dir.path().join("other.sock"))
        .arg("--state-dir")
        .arg(&d.state)
        .output()
        .expect("run kilnd");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another kilnd"), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kilnd"))
        .arg("--socket")
        .arg(&d.socket)
        .arg("--state-dir")
        .arg(d.dir.path().join("other-state"))
        .output()
        .expect("run kilnd");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already serving"));
}
