//! Chat completions through kilnd's LLM gateway. API keys stay in kilnd; every call is
//! recorded and counted against the search's token budget.

use thiserror::Error;

use crate::bindings::kiln::proposer::llm as wit;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Instructions to the model.
    System,
    /// The prompt.
    User,
    /// An earlier reply of the model.
    Assistant,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Its text.
    pub content: String,
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message {
            role: Role::System,
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            content: content.into(),
        }
    }

    /// An assistant message (an earlier reply).
    pub fn assistant(content: impl Into<String>) -> Self {
        Message {
            role: Role::Assistant,
            content: content.into(),
        }
    }
}

/// Per-call settings; `None` takes the gateway's default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatOptions {
    /// Model name, if the gateway offers several.
    pub model: Option<String>,
    /// Most tokens to generate.
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Stop sequences.
    pub stop: Vec<String>,
}

/// The model's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The text of the reply.
    pub content: String,
    /// The model that answered.
    pub model: String,
    /// Tokens in the prompt.
    pub prompt_tokens: u32,
    /// Tokens in the reply.
    pub completion_tokens: u32,
    /// Why generation stopped.
    pub finish_reason: String,
}

/// Why a chat call failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LlmError {
    /// No LLM is configured: search without one.
    #[error("no LLM is configured for this search")]
    Unavailable,
    /// The search's token budget is spent.
    #[error("the search's LLM token budget is spent")]
    BudgetExceeded,
    /// The provider failed after the gateway's retries.
    #[error("LLM call failed: {0}")]
    Failed(String),
}

/// Sends a conversation and returns the model's reply.
pub fn chat(messages: &[Message], options: &ChatOptions) -> Result<Reply, LlmError> {
    let messages: Vec<wit::Message> = messages
        .iter()
        .map(|m| wit::Message {
            role: match m.role {
                Role::System => wit::Role::System,
                Role::User => wit::Role::User,
                Role::Assistant => wit::Role::Assistant,
            },
            content: m.content.clone(),
        })
        .collect();
    let options = wit::Options {
        model: options.model.clone(),
        max_tokens: options.max_tokens,
        temperature: options.temperature,
        stop: options.stop.clone(),
    };
    match wit::chat(&messages, &options) {
        Ok(r) => Ok(Reply {
            content: r.content,
            model: r.model,
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
            finish_reason: r.finish_reason,
        }),
        Err(wit::LlmError::Unavailable) => Err(LlmError::Unavailable),
        Err(wit::LlmError::BudgetExceeded) => Err(LlmError::BudgetExceeded),
        Err(wit::LlmError::Failed(m)) => Err(LlmError::Failed(m)),
    }
}
