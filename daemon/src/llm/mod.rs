//! The LLM gateway: chat completions for proposer plugins, through the daemon only.
//!
//! Keys never leave kilnd: plugins ask for a completion by search token, the gateway
//! checks the search's token budget, calls the configured provider (an OpenAI-compatible
//! endpoint with timeouts and retries, or a replay file of recorded replies), and stores
//! every call (messages, reply, tokens, latency, cost) with the search.

mod openai;
mod replay;
#[cfg(test)]
mod tests;

use std::time::Instant;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config::LlmConfig;
use crate::store::{LlmCallRecord, Store};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// A chat completion request from a plugin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// The conversation so far.
    pub messages: Vec<ChatMessage>,
    /// Most tokens to generate (capped by `llm.max_tokens_per_call`).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f32>,
}

/// A completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatReply {
    /// The assistant's text.
    pub content: String,
    /// Model that answered.
    pub model: String,
    /// Tokens in the prompt.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
}

/// Why no completion came back.
#[derive(Debug, Clone, PartialEq, Error, Serialize)]
#[serde(tag = "code", content = "message", rename_all = "snake_case")]
pub enum LlmError {
    /// No provider is configured (or it cannot be used).
    #[error("no LLM is available: {0}")]
    Unavailable(String),
    /// The search has used its token budget.
    #[error("the search's LLM token budget is spent ({0})")]
    BudgetExceeded(String),
    /// The provider failed after retries, or the request was invalid.
    #[error("LLM call failed: {0}")]
    Failed(String),
}

/// A provider answers one request (the gateway handles budgets, retries are the
/// provider's own business since only it knows what is retryable).
enum Provider {
    None(String),
    OpenAi(openai::OpenAi),
    Replay(replay::Replay),
}

/// The gateway.
pub struct Gateway {
    provider: Provider,
    config: LlmConfig,
}

impl Gateway {
    /// Builds the gateway from `[llm]`. A misconfigured provider is reported as
    /// unavailable (with the reason) rather than stopping the daemon.
    pub fn from_config(config: &LlmConfig) -> Self {
        let provider = match config.provider.as_str() {
            "none" | "" => Provider::None("llm.provider is \"none\"".into()),
            "openai" => match openai::OpenAi::new(config) {
                Ok(p) => Provider::OpenAi(p),
                Err(e) => {
                    tracing::warn!(error = %e, "the LLM provider cannot be used");
                    Provider::None(e)
                }
            },
            "replay" => match replay::Replay::load(std::path::Path::new(&config.replay_file)) {
                Ok(p) => Provider::Replay(p),
                Err(e) => {
                    tracing::warn!(error = %e, "the replay file cannot be used");
                    Provider::None(e)
                }
            },
            other => Provider::None(format!("unknown llm.provider {other:?}")),
        };
        Gateway {
            provider,
            config: config.clone(),
        }
    }

    /// The provider's name.
    pub fn provider_name(&self) -> &'static str {
        match self.provider {
            Provider::None(_) => "none",
            Provider::OpenAi(_) => "openai",
            Provider::Replay(_) => "replay",
        }
    }

    /// Whether a model can be asked, and why not.
    pub fn status(&self) -> (bool, String) {
        match &self.provider {
            Provider::None(why) => (false, why.clone()),
            Provider::OpenAi(p) => (true, format!("{} at {}", p.model(), p.base_url())),
            Provider::Replay(p) => (true, format!("replay of {} recorded replies", p.len())),
        }
    }

    /// Asks the model on behalf of `search`, within its budget of `token_limit` tokens of
    /// which `tokens_used` are spent. Every call, failed or not, is recorded.
    pub async fn chat(
        &self,
        store: &Store,
        search: &str,
        tokens_used: u64,
        token_limit: u64,
        mut req: ChatRequest,
    ) -> Result<ChatReply, LlmError> {
        if let Provider::None(why) = &self.provider {
            return Err(LlmError::Unavailable(why.clone()));
        }
        if tokens_used >= token_limit {
            return Err(LlmError::BudgetExceeded(format!(
                "{tokens_used} of {token_limit} tokens used"
            )));
        }
        if req.messages.is_empty() {
            return Err(LlmError::Failed("no messages".into()));
        }
        let cap = self.config.max_tokens_per_call;
        let left = u32::try_from(token_limit - tokens_used).unwrap_or(u32::MAX);
        req.max_tokens = Some(req.max_tokens.unwrap_or(cap).min(cap).min(left.max(1)));
        let started = Instant::now();
        let (result, attempts) = match &self.provider {
            Provider::None(_) => unreachable_none(),
            Provider::OpenAi(p) => p.chat(&req).await,
            Provider::Replay(p) => {
                let served = store
                    .llm_calls(search)
                    .await
                    .map(|c| c.len())
                    .map_err(|e| LlmError::Failed(format!("store: {e}")));
                match served {
                    Ok(n) => (p.reply(n), 1),
                    Err(e) => (Err(e), 1),
                }
            }
        };
        let latency_ms = started.elapsed().as_secs_f64() * 1e3;
        let (prompt, completion) = result
            .as_ref()
            .map(|r| (r.prompt_tokens, r.completion_tokens))
            .unwrap_or((0, 0));
        let cost = (self.config.price_prompt_per_1k > 0.0
            || self.config.price_completion_per_1k > 0.0)
            .then(|| {
                prompt as f64 / 1000.0 * self.config.price_prompt_per_1k
                    + completion as f64 / 1000.0 * self.config.price_completion_per_1k
            });
        let record = LlmCallRecord {
            search_id: Some(search.to_string()),
            provider: self.provider_name().into(),
            model: result.as_ref().ok().map(|r| r.model.clone()),
            request: serde_json::to_value(&req).unwrap_or_default(),
            reply: result
                .as_ref()
                .ok()
                .and_then(|r| serde_json::to_value(r).ok()),
            error: result.as_ref().err().map(ToString::to_string),
            prompt_tokens: prompt,
            completion_tokens: completion,
            attempts,
            latency_ms,
            cost,
        };
        if let Err(e) = store.record_llm_call(&record).await {
            tracing::error!(error = %e, "cannot record an LLM call");
        }
        if prompt + completion > 0
            && let Err(e) = store.add_search_tokens(search, prompt + completion).await
        {
            tracing::error!(error = %e, "cannot account LLM tokens");
        }
        result
    }
}

fn unreachable_none() -> (Result<ChatReply, LlmError>, u32) {
    // `chat` returns before this for Provider::None; kept total rather than panicking.
    (Err(LlmError::Unavailable("no provider".into())), 0)
}
