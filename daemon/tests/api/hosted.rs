//! Hosted candidates (KernelBench `ModelNew` files, languages `modelnew` and
//! `modelnew-cpu`) at the API: accepted for a problem with a torch reference, refused with
//! a typed error for one without, refused when they carry a launch plan; every candidate
//! record says how it is run (`trust`). Registering a problem with a torch reference runs no
//! python, so only the end-to-end evaluation needs one (`KILN_PYTHON`; it skips without).

use std::path::{Path, PathBuf};

use kiln_daemon::client::ClientError;
use serde_json::{Value, json};

use crate::common::{Daemon, double_candidate, register, write_double_problem};

/// A host-sized problem `name` (y = 2x over 1024 floats) whose only reference is a
/// PyTorch module, written into `dir`.
fn write_torch_problem(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::create_dir_all(&p).expect("mkdir");
    std::fs::write(
        p.join("problem.toml"),
        format!(
            r#"
name = "{name}"
summary = "y = 2x, as a torch module"
[[tensor]]
name = "x"
dtype = "f32"
shape = [1024]
role = "input"
[[tensor]]
name = "y"
dtype = "f32"
shape = [1024]
role = "output"
[tolerance]
atol = 1e-6
rtol = 1e-6
[reference.torch]
file = "reference.py"
forward = ["x"]
outputs = ["y"]
"#
        ),
    )
    .expect("problem.toml");
    std::fs::write(
        p.join("reference.py"),
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n        \
         return x * 2\n\n\ndef get_inputs():\n    return [torch.randn(1024)]\n\n\ndef get_init_inputs():\n    return []\n",
    )
    .expect("reference.py");
    p
}

const MODEL_NEW: &str = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    \
                         def forward(self, x):\n        return x + x\n";

fn modelnew(problem: &str, language: &str) -> Value {
    json!({"problem": problem, "language": language, "source": MODEL_NEW, "note": "x + x"})
}

/// The status, code and message of an API error.
fn refusal(e: ClientError) -> (u16, String, String) {
    match e {
        ClientError::Api {
            status,
            code,
            message,
            ..
        } => (status, code, message),
        other => panic!("expected an API error, got {other}"),
    }
}

#[tokio::test]
async fn modelnew_candidates_need_a_torch_reference_and_no_plan() {
    let d = Daemon::start("");
    let c = d.client();
    register(&c, &write_torch_problem(d.dir.path(), "double-torch")).await;
    register(&c, &write_double_problem(d.dir.path(), "double-c")).await;

    // On a host problem with a torch reference: stored and queued, on the host backend.
    let (status, sub) = c
        .post("/v1/candidates", &modelnew("double-torch", "modelnew-cpu"))
        .await
        .expect("a modelnew-cpu candidate is accepted");
    assert_eq!((status, &sub["duplicate"]), (202, &json!(false)), "{sub}");
    assert_eq!(sub["state"], "queued", "{sub}");
    let id = sub["id"].as_str().expect("id");
    let rec = c
        .get(&format!("/v1/candidates/{id}"))
        .await
        .expect("record");
    assert_eq!(rec["trust"], "hosted", "{rec:#}");
    assert_eq!(rec["backend"], "host", "{rec:#}");
    assert_eq!(rec["candidate"]["language"], "modelnew-cpu", "{rec:#}");
    assert_eq!(rec["candidate"]["source"], MODEL_NEW, "{rec:#}");
    let listed = c
        .get("/v1/candidates?problem=double-torch")
        .await
        .expect("list");
    assert_eq!(listed["candidates"][0]["trust"], "hosted", "{listed:#}");
    assert_eq!(
        listed["candidates"][0]["language"], "modelnew-cpu",
        "{listed:#}"
    );
    // Submitted again: the stored record, with its trust mode.
    let (status, again) = c
        .post("/v1/candidates", &modelnew("double-torch", "modelnew-cpu"))
        .await
        .expect("a duplicate");
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["record"]["trust"], "hosted", "{again:#}");

    // A problem without a torch reference: the typed refusal, nothing stored.
    for language in ["modelnew-cpu", "modelnew"] {
        let (status, code, message) = refusal(
            c.post("/v1/candidates", &modelnew("double-c", language))
                .await
                .expect_err("no torch reference"),
        );
        assert_eq!(
            (status, code.as_str()),
            (422, "no_torch_reference"),
            "{message}"
        );
        assert!(
            message.contains(&format!(
                "{language} candidates need a problem with a torch reference (a KernelBench \
                 import or a [reference.torch])"
            )) && message.contains("double-c"),
            "{message}"
        );
    }
    let listed = c
        .get("/v1/candidates?problem=double-c")
        .await
        .expect("list");
    assert_eq!(listed["candidates"].as_array().map(Vec::len), Some(0));

    // A launch plan, or a file without `class ModelNew`: invalid candidates.
    let mut planned = modelnew("double-torch", "modelnew");
    planned["launches"] = json!([{"kernel": "k", "args": ["x", "y"]}]);
    let no_class = json!({"problem": "double-torch", "language": "modelnew",
                          "source": "import torch\nclass Model(torch.nn.Module):\n    pass\n"});
    for (body, needle) in [
        (planned, "launches: a modelnew candidate takes none"),
        (no_class, "class ModelNew"),
    ] {
        let (status, code, message) = refusal(
            c.post("/v1/candidates", &body)
                .await
                .expect_err("an invalid candidate"),
        );
        assert_eq!(
            (status, code.as_str()),
            (400, "invalid_candidate"),
            "{message}"
        );
        assert!(message.contains(needle), "{needle:?} in {message}");
    }

    // A candidate launched from its plan says so too.
    let (_, sub) = c
        .post(
            "/v1/candidates",
            &double_candidate(
                "double-c",
                "for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];",
            ),
        )
        .await
        .expect("a C candidate");
    let rec = c
        .get(&format!(
            "/v1/candidates/{}",
            sub["id"].as_str().expect("id")
        ))
        .await
        .expect("record");
    assert_eq!(rec["trust"], "contract", "{rec:#}");
}

/// With a python with torch (`KILN_PYTHON`), a `modelnew-cpu` candidate is evaluated end to
/// end on the host backend, and its evaluation says `hosted`; skipped without one.
#[tokio::test]
async fn a_modelnew_cpu_candidate_is_evaluated_hosted() {
    let Some(python) = std::env::var("KILN_PYTHON").ok().filter(|p| !p.is_empty()) else {
        eprintln!("SKIP: KILN_PYTHON (a python with torch) is not set");
        return;
    };
    let d = Daemon::start(&format!("[gpu]\npython = {python:?}\n"));
    let c = d.client();
    register(&c, &write_torch_problem(d.dir.path(), "double-torch")).await;
    let (_, sub) = c
        .post("/v1/candidates", &modelnew("double-torch", "modelnew-cpu"))
        .await
        .expect("submit");
    let id = sub["id"].as_str().expect("id");
    let rec = c
        .get(&format!("/v1/candidates/{id}?wait=300"))
        .await
        .expect("wait");
    assert_eq!(rec["evaluation"]["verdict"], "ok", "{rec:#}\n{}", d.log());
    assert_eq!(rec["evaluation"]["trust"], "hosted", "{rec:#}");
    assert_eq!(rec["evaluation"]["backend"], "host", "{rec:#}");
}

/// `[queue] max_waiting`: past it, a new candidate is refused with 429 `queue_full` (a
/// client faster than the lanes is slowed down) and nothing is stored; once there is room
/// again it is accepted. Here the cuda backend is not usable (no GPU in CI), so a
/// `modelnew` job waits in the queue for good.
#[tokio::test]
async fn a_full_queue_answers_429_and_stores_nothing() {
    if std::path::Path::new("/dev/nvidia0").exists() {
        eprintln!("SKIP: a GPU is here, so the cuda job would not wait");
        return;
    }
    let d = Daemon::start("[queue]\nmax_waiting = 1\n");
    let c = d.client();
    register(&c, &write_torch_problem(d.dir.path(), "double-torch")).await;
    let (status, first) = c
        .post("/v1/candidates", &modelnew("double-torch", "modelnew"))
        .await
        .expect("the first candidate is queued");
    assert_eq!(status, 202, "{first}");
    let mut second = modelnew("double-torch", "modelnew");
    second["note"] = json!("another");
    second["source"] = json!(format!("{MODEL_NEW}# another\n"));
    let e = c
        .post("/v1/candidates", &second)
        .await
        .expect_err("the queue is full");
    let (status, code, message) = refusal(e);
    assert_eq!((status, code.as_str()), (429, "queue_full"), "{message}");
    assert!(message.contains("max_waiting"), "{message}");
    let listed = c
        .get("/v1/candidates?problem=double-torch")
        .await
        .expect("list");
    assert_eq!(
        listed["candidates"].as_array().map(Vec::len),
        Some(1),
        "{listed:#}"
    );
}

/// `POST /v1/candidates/batch`: every candidate admitted as a single submission would be,
/// in order, one result each by index; backpressure per candidate (past `max_waiting` a
/// new one is `429 queue_full`, a duplicate is still answered) and the queue's room in the
/// answer; a bad item is its own error and the rest go on; an empty batch is refused.
/// The cuda backend is not usable here (no GPU in CI), so `modelnew` jobs stay queued.
#[tokio::test]
async fn a_batch_is_admitted_one_by_one_with_the_queues_room() {
    if std::path::Path::new("/dev/nvidia0").exists() {
        eprintln!("SKIP: a GPU is here, so the cuda jobs would not wait");
        return;
    }
    let d = Daemon::start("[queue]\nmax_waiting = 2\n");
    let c = d.client();
    register(&c, &write_torch_problem(d.dir.path(), "double-torch")).await;
    let variant = |tag: &str| {
        let mut m = modelnew("double-torch", "modelnew");
        m["source"] = json!(format!("{MODEL_NEW}# {tag}\n"));
        m
    };
    let mut unknown = variant("elsewhere");
    unknown["problem"] = json!("no-such-problem");
    let batch = json!({"candidates": [
        variant("a"), {"problem": 5}, unknown, variant("b"), variant("c"),
    ]});
    let (status, r) = c
        .post("/v1/candidates/batch", &batch)
        .await
        .expect("a batch answers");
    assert_eq!(status, 200, "{r:#}");
    let results = r["results"].as_array().expect("results");
    let status_of = |i: usize| results[i]["status"].as_u64();
    assert_eq!(
        (0..5).map(status_of).collect::<Vec<_>>(),
        [Some(202), Some(400), Some(404), Some(202), Some(429)],
        "{r:#}"
    );
    assert!(results.iter().enumerate().all(|(i, x)| x["index"] == i));
    assert_eq!(results[1]["error"]["code"], "invalid_field", "{r:#}");
    assert!(
        results[1]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("problem")),
        "{r:#}"
    );
    assert_eq!(results[4]["error"]["code"], "queue_full", "{r:#}");
    assert_eq!(
        (r["accepted"].as_u64(), r["refused"].as_u64()),
        (Some(2), Some(3))
    );
    assert_eq!(r["queue"]["room"], 0, "{r:#}");
    assert_eq!(r["queue"]["waiting"], 2, "{r:#}");
    // Resending: the stored one is a duplicate (answered, nothing queued), the refused one
    // is refused again while the queue stays full.
    let again = json!({"candidates": [variant("a"), variant("c")]});
    let (_, r2) = c.post("/v1/candidates/batch", &again).await.expect("again");
    assert_eq!(r2["results"][0]["status"], 200, "{r2:#}");
    assert_eq!(r2["results"][0]["duplicate"], true, "{r2:#}");
    assert_eq!(r2["results"][0]["id"], results[0]["id"], "{r2:#}");
    assert_eq!(r2["results"][1]["status"], 429, "{r2:#}");
    let listed = c
        .get("/v1/candidates?problem=double-torch")
        .await
        .expect("list");
    assert_eq!(listed["candidates"].as_array().map(Vec::len), Some(2));
    let e = c
        .post("/v1/candidates/batch", &json!({"candidates": []}))
        .await
        .expect_err("empty");
    let (status, code, _) = refusal(e);
    assert_eq!((status, code.as_str()), (400, "invalid_field"));
}
