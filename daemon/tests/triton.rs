//! Triton candidates through a real kilnd (no GPU needed): `/v1/info` says whether the
//! configured python has triton; without one a Triton candidate is refused at submission
//! (503 `triton_unavailable`, nothing stored); with one (`KILN_TRITON_PYTHON`, which CI
//! installs) it is accepted and queued for the cuda backend.

mod common;

use common::{Daemon, register};
use kiln_daemon::client::ClientError;
use serde_json::Value;

fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn triton_seed() -> Value {
    let spec = kiln_types::ProblemSpec::load_dir(&repo().join("problems/softmax-4096x65536"))
        .expect("problem");
    serde_json::to_value(spec.seed_candidate("triton").expect("triton seed")).expect("json")
}

#[tokio::test]
async fn without_triton_a_triton_candidate_is_refused_with_the_reason() {
    let d = Daemon::start("[triton]\npython = \"/nonexistent/python3\"\n");
    let c = d.client();
    let info = c.get("/v1/info").await.expect("info");
    assert_eq!(info["triton"]["usable"], false, "{info}");
    assert!(
        info["triton"]["detail"]
            .as_str()
            .is_some_and(|s| s.contains("/nonexistent/python3")),
        "{info}"
    );
    register(&c, &repo().join("problems/softmax-4096x65536")).await;
    match c.post("/v1/candidates", &triton_seed()).await {
        Err(ClientError::Api {
            status,
            code,
            message,
            ..
        }) => {
            assert_eq!((status, code.as_str()), (503, "triton_unavailable"));
            assert!(message.contains("/nonexistent/python3"), "{message}");
        }
        other => panic!("expected 503 triton_unavailable, got {other:?}"),
    }
    let listed = c.get("/v1/candidates").await.expect("list");
    assert_eq!(
        listed["candidates"].as_array().map(Vec::len),
        Some(0),
        "{listed}"
    );
}

#[tokio::test]
async fn with_triton_the_candidate_is_queued_for_the_cuda_backend() {
    let Ok(python) = std::env::var("KILN_TRITON_PYTHON") else {
        println!("SKIP: KILN_TRITON_PYTHON is not set");
        return;
    };
    let d = Daemon::start(&format!("[triton]\npython = {python:?}\n"));
    let c = d.client();
    let info = c.get("/v1/info").await.expect("info");
    assert_eq!(info["triton"]["usable"], true, "{info}");
    assert!(info["triton"]["version"].is_string(), "{info}");
    register(&c, &repo().join("problems/softmax-4096x65536")).await;
    let (status, body) = c
        .post("/v1/candidates", &triton_seed())
        .await
        .expect("accepted");
    assert_eq!(status, 202, "{body}");
    let id = body["id"].as_str().expect("id");
    let shown = c.get(&format!("/v1/candidates/{id}")).await.expect("show");
    assert_eq!(shown["candidate"]["language"], "triton", "{shown}");
    assert_eq!(shown["backend"], "cuda", "{shown}");
    assert_eq!(shown["job"]["state"], "queued", "{shown}");
}
