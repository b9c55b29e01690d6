//! The gateway against a fake OpenAI-compatible server on loopback.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Json;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::{Value, json};

use super::*;
use crate::config::LlmConfig;

/// Serves `/v1/chat/completions`: the first `fail_first` calls answer `fail_status`
/// (or hang when it is 0), then a completion echoing the last message.
async fn fake_server(fail_first: u32, fail_status: u16) -> (String, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |Json(body): Json<Value>| {
            let c = c.clone();
            async move {
                let n = c.fetch_add(1, Ordering::SeqCst);
                if n < fail_first {
                    if fail_status == 0 {
                        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
                    }
                    let status = StatusCode::from_u16(fail_status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                    return (status, Json(json!({"error": {"message": "try later"}})));
                }
                let last = body["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
                (
                    StatusCode::OK,
                    Json(json!({
                        "model": body["model"],
                        "choices": [{"message": {"role": "assistant", "content": format!("echo: {}", last["content"].as_str().unwrap_or(""))}}],
                        "usage": {"prompt_tokens": 11, "completion_tokens": 7}
                    })),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/v1"), calls)
}

fn config(base_url: &str) -> LlmConfig {
    LlmConfig {
        provider: "openai".into(),
        base_url: base_url.into(),
        model: "fake-model".into(),
        api_key_env: String::new(),
        timeout_secs: 1,
        max_retries: 2,
        backoff_ms: 10,
        ..LlmConfig::default()
    }
}

fn request(text: &str) -> ChatRequest {
    ChatRequest {
        messages: vec![ChatMessage {
            role: "user".into(),
            content: text.into(),
        }],
        max_tokens: None,
        temperature: None,
    }
}

#[tokio::test]
async fn retries_server_errors_then_answers_and_records_the_call() {
    let (url, calls) = fake_server(2, 500).await;
    let (_d, store) = crate::store::open_temp();
    let gw = Gateway::from_config(&config(&url));
    let reply = gw
        .chat(&store, "s-1", 0, 1000, request("hi"))
        .await
        .expect("reply");
    assert_eq!(reply.content, "echo: hi");
    assert_eq!((reply.prompt_tokens, reply.completion_tokens), (11, 7));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let recorded = store.llm_calls("s-1").await.expect("calls");
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0]["attempts"], 3);
    assert_eq!(recorded[0]["reply"]["content"], "echo: hi");
    assert_eq!(recorded[0]["request"]["messages"][0]["content"], "hi");
}

#[tokio::test]
async fn a_failing_server_gives_a_clean_error_after_the_retries() {
    let (url, calls) = fake_server(u32::MAX, 503).await;
    let (_d, store) = crate::store::open_temp();
    let gw = Gateway::from_config(&config(&url));
    let err = gw
        .chat(&store, "s-1", 0, 1000, request("hi"))
        .await
        .expect_err("fails");
    assert!(
        matches!(&err, LlmError::Failed(m) if m.contains("503") && m.contains("3 attempts")),
        "{err}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert!(store.llm_calls("s-1").await.expect("calls")[0]["error"].is_string());
}

#[tokio::test]
async fn a_hanging_server_times_out_instead_of_hanging() {
    let (url, calls) = fake_server(u32::MAX, 0).await;
    let (_d, store) = crate::store::open_temp();
    let gw = Gateway::from_config(&config(&url));
    let err = gw
        .chat(&store, "s-1", 0, 1000, request("hi"))
        .await
        .expect_err("times out");
    assert!(
        matches!(&err, LlmError::Failed(m) if m.contains("timed out")),
        "{err}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let (url, calls) = fake_server(u32::MAX, 400).await;
    let (_d, store) = crate::store::open_temp();
    let gw = Gateway::from_config(&config(&url));
    assert!(
        gw.chat(&store, "s-1", 0, 1000, request("hi"))
            .await
            .is_err()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn budgets_and_absent_providers_are_typed_errors() {
    let (_d, store) = crate::store::open_temp();
    let none = Gateway::from_config(&LlmConfig::default());
    assert!(matches!(
        none.chat(&store, "s", 0, 10, request("x")).await,
        Err(LlmError::Unavailable(_))
    ));
    let (url, calls) = fake_server(0, 500).await;
    let gw = Gateway::from_config(&config(&url));
    assert!(matches!(
        gw.chat(&store, "s", 10, 10, request("x")).await,
        Err(LlmError::BudgetExceeded(_))
    ));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "no call is made past the budget"
    );
    let missing_model = Gateway::from_config(&LlmConfig {
        provider: "openai".into(),
        ..LlmConfig::default()
    });
    assert!(!missing_model.status().0);
}
