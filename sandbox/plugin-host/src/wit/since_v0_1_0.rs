//! Host side of `kiln:proposer@0.1.0` (`sdk/wit/since_v0.1.0/`): the generated
//! bindings, and the imports implemented over the [`crate::bridge::Bridge`].
//!
//! Every import first checks the wall-clock deadline. Refusals kilnd reports with a
//! known code become the WIT's typed errors; anything else from the bridge traps with
//! [`HostTrap::Bridge`], which ends the plugin with the outcome `bridge`.

use std::time::Duration;

use kiln_types::PrecisionTier;

use crate::bridge::BridgeError;
use crate::limits::{MAX_CANDIDATE_BYTES, MAX_LOG_BYTES, MAX_PROMPT_BYTES, MAX_WAIT, MAX_WAIT_IDS};
use crate::protocol::{self, codes};
use crate::state::{HostTrap, PluginState};

/// The generated bindings; their documentation is the WIT's.
#[allow(missing_docs)]
mod generated {
    wasmtime::component::bindgen!({
        world: "proposer",
        path: "../../sdk/wit/since_v0.1.0",
        imports: { default: trappable },
    });
}

pub use generated::*;

/// The lowest ABI version this module serves.
pub const MIN_VERSION: crate::abi::AbiVersion = crate::abi::AbiVersion {
    major: 0,
    minor: 1,
    patch: 0,
};

use kiln::proposer::{evaluator, host, llm, types};

type HostResult<T> = wasmtime::Result<T>;

impl PluginState {
    fn bridge_failed(&mut self, e: BridgeError) -> wasmtime::Error {
        self.raise(HostTrap::Bridge(e))
    }
}

fn verdict(v: kiln_types::Verdict) -> types::Verdict {
    use kiln_types::Verdict as V;
    use types::Verdict as W;
    match v {
        V::CompileError => W::CompileError,
        V::InvalidLaunch => W::InvalidLaunch,
        V::RuntimeFault => W::RuntimeFault,
        V::Timeout => W::Timeout,
        V::WrongAnswer => W::WrongAnswer,
        V::IncompleteOutput => W::IncompleteOutput,
        V::InputTampered => W::InputTampered,
        V::Nondeterministic => W::Nondeterministic,
        V::ImplausibleTime => W::ImplausibleTime,
        // ABI 0.1 has no `unmeasurable-time` (sdk/wit/PENDING_CHANGES.md): the nearest
        // verdict that also carries no time to rank; `message` and `json` say which.
        V::UnmeasurableTime => W::ImplausibleTime,
        // Nor `no-own-kernels` (a hosted file that is the reference renamed): also a
        // verdict that never ranks; `message` and `json` say which.
        V::NoOwnKernels => W::ImplausibleTime,
        V::Ok => W::Ok,
    }
}

fn tier(t: PrecisionTier) -> types::PrecisionTier {
    use types::PrecisionTier as W;
    match t {
        PrecisionTier::Fp32Faithful => W::Fp32Faithful,
        PrecisionTier::Tf32Like => W::Tf32Like,
        PrecisionTier::Fp16Like => W::Fp16Like,
        PrecisionTier::Bf16Like => W::Bf16Like,
        PrecisionTier::Coarse => W::Coarse,
    }
}

/// The WIT evaluation of a finished candidate: typed fields from kiln-types'
/// `Evaluation`, the JSON as it came. One that is missing or does not parse is
/// `not-evaluated`, with the reason.
fn evaluation(
    candidate_id: String,
    json: Option<serde_json::Value>,
    error: Option<String>,
) -> types::Evaluation {
    let not_evaluated = |message: String| types::Evaluation {
        candidate_id: candidate_id.clone(),
        verdict: types::Verdict::NotEvaluated,
        message,
        median_us: None,
        tier: None,
        resources: Vec::new(),
        json: "null".into(),
    };
    let Some(json) = json.filter(|j| !j.is_null()) else {
        return not_evaluated(error.unwrap_or_else(|| "not evaluated".into()));
    };
    let text = json.to_string();
    match serde_json::from_value::<kiln_types::Evaluation>(json) {
        Ok(e) => types::Evaluation {
            candidate_id,
            verdict: verdict(e.verdict),
            message: e.message,
            median_us: e.timing.as_ref().map(|t| t.median_us),
            tier: e.tier.map(tier),
            resources: e
                .compile
                .map(|c| c.kernels)
                .unwrap_or_default()
                .into_iter()
                .map(|k| types::KernelResources {
                    name: k.name,
                    registers: k.registers,
                    static_shared_bytes: k.static_shared_bytes,
                    local_bytes: k.local_bytes,
                    max_threads_per_block: k.max_threads_per_block,
                    occupancy: k.occupancy,
                })
                .collect(),
            json: text,
        },
        Err(err) => not_evaluated(format!("kilnd's evaluation does not parse: {err}")),
    }
}

/// The evaluator error for a refusal kilnd reported with a known code; `None` for any
/// other failure.
fn evaluator_error(e: &BridgeError) -> Option<evaluator::EvaluatorError> {
    let BridgeError::Refused { code, message, .. } = e else {
        return None;
    };
    Some(match code.as_str() {
        codes::INVALID_CANDIDATE
        | codes::INVALID_FIELD
        | codes::INVALID_JSON
        | codes::PAYLOAD_TOO_LARGE => evaluator::EvaluatorError::Invalid(message.clone()),
        codes::UNKNOWN_CANDIDATE => evaluator::EvaluatorError::UnknownCandidate(message.clone()),
        codes::BUDGET_EXHAUSTED => evaluator::EvaluatorError::BudgetExhausted,
        codes::QUEUE_FULL => evaluator::EvaluatorError::QueueFull,
        _ => return None,
    })
}

impl types::Host for PluginState {}

impl evaluator::Host for PluginState {
    fn problem(&mut self) -> HostResult<evaluator::ProblemInfo> {
        self.check_deadline()?;
        let c = &self.context;
        Ok(evaluator::ProblemInfo {
            search_id: c.search_id.clone(),
            name: c.problem["name"].as_str().unwrap_or_default().to_string(),
            spec_json: c.problem.to_string(),
            seed_json: c
                .seed
                .as_ref()
                .filter(|s| !s.is_null())
                .map(|s| s.to_string()),
            baselines: c
                .baselines
                .iter()
                .map(|b| evaluator::Baseline {
                    name: b.name.clone(),
                    median_us: b.median_us,
                })
                .collect(),
            device: evaluator::DeviceFacts {
                backend: c.device.backend.clone(),
                name: c.device.name.clone(),
                compute_capability: c.device.compute_capability.clone(),
                units: c.device.units,
                memory_bytes: c.device.memory_bytes,
                json: serde_json::to_string(&c.device).unwrap_or_default(),
            },
        })
    }

    fn submit(
        &mut self,
        candidate_json: String,
    ) -> HostResult<Result<evaluator::Submission, evaluator::EvaluatorError>> {
        self.check_deadline()?;
        if candidate_json.len() > MAX_CANDIDATE_BYTES {
            return Ok(Err(evaluator::EvaluatorError::Invalid(format!(
                "candidate JSON is {} bytes; the limit is {MAX_CANDIDATE_BYTES}",
                candidate_json.len()
            ))));
        }
        match self.bridge.submit(&candidate_json) {
            Ok(s) => Ok(Ok(evaluator::Submission {
                id: s.id,
                duplicate: s.duplicate,
            })),
            Err(e) => match evaluator_error(&e) {
                Some(typed) => Ok(Err(typed)),
                None => Err(self.bridge_failed(e)),
            },
        }
    }

    fn wait(
        &mut self,
        ids: Vec<String>,
        timeout_ms: u32,
    ) -> HostResult<Result<Vec<types::Evaluation>, evaluator::EvaluatorError>> {
        self.check_deadline()?;
        if ids.len() > MAX_WAIT_IDS {
            return Ok(Err(evaluator::EvaluatorError::Invalid(format!(
                "{} ids in one wait; the limit is {MAX_WAIT_IDS}",
                ids.len()
            ))));
        }
        // Never wait past the plugin's own deadline: the epoch deadline cannot
        // interrupt a host call.
        let timeout = Duration::from_millis(u64::from(timeout_ms))
            .min(MAX_WAIT)
            .min(self.time_left());
        let request = protocol::WaitRequest {
            ids,
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        match self.bridge.wait(&request) {
            Ok(reply) => Ok(Ok(reply
                .finished
                .into_iter()
                .map(|f| evaluation(f.candidate_id, f.evaluation, f.error))
                .collect())),
            Err(e) => match evaluator_error(&e) {
                Some(typed) => Ok(Err(typed)),
                None => Err(self.bridge_failed(e)),
            },
        }
    }

    fn archive(&mut self) -> HostResult<Vec<evaluator::Entry>> {
        self.check_deadline()?;
        let reply = self.bridge.archive().map_err(|e| self.bridge_failed(e))?;
        Ok(reply
            .entries
            .into_iter()
            .map(|e| {
                let finished = e.evaluation.is_some() || e.error.is_some();
                evaluator::Entry {
                    candidate_json: e.candidate.to_string(),
                    evaluation: finished.then(|| evaluation(e.id.clone(), e.evaluation, e.error)),
                    id: e.id,
                }
            })
            .collect())
    }
}

impl llm::Host for PluginState {
    fn chat(
        &mut self,
        messages: Vec<llm::Message>,
        options: llm::Options,
    ) -> HostResult<Result<llm::Reply, llm::LlmError>> {
        self.check_deadline()?;
        // Refused here, before anything is sent: the call fails, the search goes on.
        let prompt: usize = messages.iter().map(|m| m.content.len()).sum();
        if prompt > MAX_PROMPT_BYTES {
            return Ok(Err(llm::LlmError::Failed(format!(
                "the prompt is {prompt} bytes, over kiln's limit of {MAX_PROMPT_BYTES} bytes"
            ))));
        }
        let request = protocol::ChatRequest {
            messages: messages
                .into_iter()
                .map(|m| protocol::ChatMessage {
                    role: match m.role {
                        llm::Role::System => "system",
                        llm::Role::User => "user",
                        llm::Role::Assistant => "assistant",
                    }
                    .into(),
                    content: m.content,
                })
                .collect(),
            model: options.model,
            max_tokens: options.max_tokens,
            temperature: options.temperature,
            stop: options.stop,
        };
        match self.bridge.chat(&request) {
            Ok(r) => Ok(Ok(llm::Reply {
                content: r.content,
                model: r.model,
                prompt_tokens: r.prompt_tokens,
                completion_tokens: r.completion_tokens,
                finish_reason: r.finish_reason,
            })),
            Err(e) => match e.code() {
                Some(codes::LLM_UNAVAILABLE) => Ok(Err(llm::LlmError::Unavailable)),
                Some(codes::LLM_BUDGET_EXCEEDED) => Ok(Err(llm::LlmError::BudgetExceeded)),
                Some(codes::LLM_FAILED) => Ok(Err(llm::LlmError::Failed(match e {
                    BridgeError::Refused { message, .. } => message,
                    other => other.to_string(),
                }))),
                _ => Err(self.bridge_failed(e)),
            },
        }
    }
}

impl host::Host for PluginState {
    fn log(&mut self, level: host::Level, message: String) -> HostResult<()> {
        self.check_deadline()?;
        let mut message = message;
        const MARK: &str = " [truncated]";
        if message.len() > MAX_LOG_BYTES {
            // Cut so that the line with its mark still fits kilnd's limit.
            let mut cut = MAX_LOG_BYTES - MARK.len();
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str(MARK);
        }
        let level = match level {
            host::Level::Trace => "trace",
            host::Level::Debug => "debug",
            host::Level::Info => "info",
            host::Level::Warn => "warn",
            host::Level::Error => "error",
        };
        let line = protocol::LogLine {
            level: level.into(),
            message,
        };
        self.bridge.log(&line).map_err(|e| self.bridge_failed(e))
    }

    fn monotonic_now_ns(&mut self) -> HostResult<u64> {
        Ok(u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    fn random_u64(&mut self) -> HostResult<u64> {
        Ok(self.next_random())
    }

    fn checkpoint(&mut self, state: Vec<u8>) -> HostResult<Result<(), host::HostError>> {
        self.check_deadline()?;
        let limit = self.limits.checkpoint_bytes;
        if state.len() > limit {
            return Ok(Err(host::HostError::TooLarge(limit as u64)));
        }
        match self.bridge.put_checkpoint(&state) {
            Ok(()) => Ok(Ok(())),
            Err(BridgeError::Refused { code, message, .. })
                if code == codes::CHECKPOINT_TOO_LARGE || code == codes::PAYLOAD_TOO_LARGE =>
            {
                Ok(Err(host::HostError::TooLarge(
                    message.trim().parse().unwrap_or(limit as u64),
                )))
            }
            Err(e) => Err(self.bridge_failed(e)),
        }
    }

    fn restore(&mut self) -> HostResult<Option<Vec<u8>>> {
        self.check_deadline()?;
        self.bridge
            .get_checkpoint()
            .map_err(|e| self.bridge_failed(e))
    }

    fn budget(&mut self) -> HostResult<host::BudgetLeft> {
        self.check_deadline()?;
        let b = self.bridge.budget().map_err(|e| self.bridge_failed(e))?;
        let ours = u64::try_from(self.time_left().as_millis()).unwrap_or(u64::MAX);
        Ok(host::BudgetLeft {
            candidates_left: b.candidates_left,
            ms_left: Some(b.ms_left.map_or(ours, |k| k.min(ours))),
            tokens_left: b.tokens_left,
        })
    }
}
