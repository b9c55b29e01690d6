//! [`ask`]: one conversation with the model that ends in a usable candidate. A reply
//! that does not parse goes back to the model with the parse error, up to a number of
//! fixes and within the search's token budget.

use kiln_types::Candidate;

use crate::llm::{ChatOptions, LlmError, Message, chat};
use crate::search::reply::{self, Parsed};

/// Why no candidate came out of the conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskError {
    /// No model is configured: search offline.
    Unavailable,
    /// The token budget is spent.
    BudgetExceeded,
    /// The provider failed (after kilnd's retries).
    Failed(String),
    /// Every reply was unusable; the last parse error.
    Unusable(String),
}

impl std::fmt::Display for AskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AskError::Unavailable => f.write_str("no LLM is configured"),
            AskError::BudgetExceeded => f.write_str("the LLM token budget is spent"),
            AskError::Failed(m) => write!(f, "the LLM call failed: {m}"),
            AskError::Unusable(m) => write!(f, "no usable reply: {m}"),
        }
    }
}

impl From<LlmError> for AskError {
    fn from(e: LlmError) -> Self {
        match e {
            LlmError::Unavailable => AskError::Unavailable,
            LlmError::BudgetExceeded => AskError::BudgetExceeded,
            LlmError::Failed(m) => AskError::Failed(m),
        }
    }
}

/// The message that sends a parse error back to the model.
pub fn fix_request(error: &str) -> String {
    format!(
        "Your reply could not be used as a candidate: {error}.\nReply again with the complete kernel source in one fenced code block (and, only if the launch plan changes, a ```json block with {{\"launches\": [...]}})."
    )
}

/// Sends `messages`, parses the reply into a candidate derived from `parent`, and on a
/// parse error appends the reply and [`fix_request`] and asks again, at most `fixes`
/// times.
pub fn ask(
    mut messages: Vec<Message>,
    parent: &Candidate,
    fixes: u32,
    options: &ChatOptions,
) -> Result<Parsed, AskError> {
    let mut last = String::new();
    for attempt in 0..=fixes {
        if attempt > 0 && crate::plugin_host::budget().tokens_left == Some(0) {
            return Err(AskError::BudgetExceeded);
        }
        let r = chat(&messages, options)?;
        match reply::candidate(&r.content, parent) {
            Ok(p) => return Ok(p),
            Err(e) => {
                crate::warn!("model reply unusable (attempt {}): {e}", attempt + 1);
                messages.push(Message::assistant(r.content));
                messages.push(Message::user(fix_request(&e)));
                last = e;
            }
        }
    }
    Err(AskError::Unusable(last))
}
