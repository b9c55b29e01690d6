//! An OpenAI-compatible chat-completions client: timeouts, retries with exponential
//! backoff on rate limits, server errors and network failures; no retry on other 4xx.

use std::time::Duration;

use serde_json::{Value, json};

use super::{ChatReply, ChatRequest, LlmError};
use crate::config::LlmConfig;

/// The client.
pub struct OpenAi {
    http: reqwest::Client,
    base_url: String,
    model: String,
    key: Option<String>,
    max_retries: u32,
    backoff: Duration,
}

fn read_key(config: &LlmConfig) -> Result<Option<String>, String> {
    if !config.api_key_file.is_empty() {
        let k = std::fs::read_to_string(&config.api_key_file)
            .map_err(|e| format!("cannot read llm.api_key_file {}: {e}", config.api_key_file))?;
        return Ok(Some(k.trim().to_string()));
    }
    if !config.api_key_env.is_empty() {
        return Ok(std::env::var(&config.api_key_env)
            .ok()
            .filter(|k| !k.is_empty()));
    }
    Ok(None)
}

impl OpenAi {
    /// Builds the client; the key is read now and kept in the daemon only.
    pub fn new(config: &LlmConfig) -> Result<Self, String> {
        if config.model.is_empty() {
            return Err("llm.model is not set".into());
        }
        if config.base_url.is_empty() {
            return Err("llm.base_url is not set".into());
        }
        let key = read_key(config)?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(config.timeout_secs.max(1)))
            .connect_timeout(Duration::from_secs(config.timeout_secs.clamp(1, 30)))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(OpenAi {
            http,
            base_url: config.base_url.trim_end_matches('/').to_string(),
            model: config.model.clone(),
            key,
            max_retries: config.max_retries,
            backoff: Duration::from_millis(config.backoff_ms),
        })
    }

    /// Model name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Endpoint base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// One completion, retried as configured; returns the result and the attempts made.
    pub async fn chat(&self, req: &ChatRequest) -> (Result<ChatReply, LlmError>, u32) {
        let mut body = json!({"model": self.model, "messages": req.messages});
        if let Some(m) = req.max_tokens {
            body["max_tokens"] = json!(m);
        }
        if let Some(t) = req.temperature {
            body["temperature"] = json!(t);
        }
        let url = format!("{}/chat/completions", self.base_url);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut r = self.http.post(&url).json(&body);
            if let Some(k) = &self.key {
                r = r.bearer_auth(k);
            }
            let msg: String = match r.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    let text = resp.text().await.unwrap_or_default();
                    if status.is_success() {
                        return (parse_reply(&text, &self.model), attempt);
                    }
                    let retryable = status.as_u16() == 429 || status.is_server_error();
                    let msg = format!("{status}: {}", text.chars().take(300).collect::<String>());
                    if !retryable {
                        return (Err(LlmError::Failed(msg)), attempt);
                    }
                    msg
                }
                Err(e) if e.is_timeout() => format!("timed out: {e}"),
                Err(e) => format!("request failed: {e}"),
            };
            if attempt > self.max_retries {
                return (
                    Err(LlmError::Failed(format!(
                        "{msg} (after {attempt} attempts)"
                    ))),
                    attempt,
                );
            }
            let wait = self.backoff.saturating_mul(1 << (attempt - 1).min(6));
            tracing::warn!(attempt, error = %msg, wait_ms = wait.as_millis() as u64, "LLM call failed; retrying");
            tokio::time::sleep(wait).await;
        }
    }
}

fn parse_reply(text: &str, model: &str) -> Result<ChatReply, LlmError> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| LlmError::Failed(format!("reply is not JSON: {e}")))?;
    let content = v["choices"][0]["message"]["content"]
        .as_str()
        .ok_or_else(|| LlmError::Failed("reply has no choices[0].message.content".into()))?
        .to_string();
    Ok(ChatReply {
        content,
        model: v["model"].as_str().unwrap_or(model).to_string(),
        prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
        completion_tokens: v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
    })
}
