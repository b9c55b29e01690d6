//! The replay provider: recorded replies from a JSONL file, served in order per search.
//!
//! Each line is `{"content": "...", "prompt_tokens": N, "completion_tokens": M}` (token
//! counts optional) or `{"error": "..."}` for a recorded failure. The n-th call of a
//! search gets line n (counted from the calls stored for that search, so a search that
//! resumes after a restart continues where it left off); past the end, calls fail.

use std::path::Path;

use serde::Deserialize;

use super::{ChatReply, LlmError};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    model: Option<String>,
}

/// Recorded replies.
pub struct Replay {
    lines: Vec<Line>,
}

impl Replay {
    /// Reads and checks the whole file.
    pub fn load(path: &Path) -> Result<Self, String> {
        if path.as_os_str().is_empty() {
            return Err("llm.replay_file is not set".into());
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut lines = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            let line: Line = serde_json::from_str(raw)
                .map_err(|e| format!("{} line {}: {e}", path.display(), i + 1))?;
            if line.content.is_none() == line.error.is_none() {
                return Err(format!(
                    "{} line {}: give exactly one of content or error",
                    path.display(),
                    i + 1
                ));
            }
            lines.push(line);
        }
        Ok(Replay { lines })
    }

    /// Number of recorded replies.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// The reply for a search's n-th call (0-based).
    pub fn reply(&self, n: usize) -> Result<ChatReply, LlmError> {
        let line = self.lines.get(n).ok_or_else(|| {
            LlmError::Failed(format!(
                "the replay file has no reply #{} ({} recorded)",
                n + 1,
                self.lines.len()
            ))
        })?;
        if let Some(e) = &line.error {
            return Err(LlmError::Failed(e.clone()));
        }
        let content = line.content.clone().unwrap_or_default();
        Ok(ChatReply {
            completion_tokens: line
                .completion_tokens
                .unwrap_or_else(|| (content.len() as u64).div_ceil(4)),
            prompt_tokens: line.prompt_tokens.unwrap_or(0),
            model: line.model.clone().unwrap_or_else(|| "replay".into()),
            content,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_in_order_then_fails_past_the_end() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("r.jsonl");
        std::fs::write(
            &p,
            "{\"content\":\"one\",\"completion_tokens\":3}\n\n{\"error\":\"rate limited\"}\n",
        )
        .expect("write");
        let r = Replay::load(&p).expect("load");
        assert_eq!(r.len(), 2);
        assert_eq!(r.reply(0).expect("first").content, "one");
        assert_eq!(r.reply(1), Err(LlmError::Failed("rate limited".into())));
        assert!(matches!(r.reply(2), Err(LlmError::Failed(m)) if m.contains("#3")));
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("r.jsonl");
        std::fs::write(
            &p,
            "{\"content\":\"ok\"}\n{\"content\":\"x\",\"error\":\"y\"}\n",
        )
        .expect("write");
        let err = Replay::load(&p).err().unwrap_or_default();
        assert!(err.contains("line 2"), "{err}");
    }
}
