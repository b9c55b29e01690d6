//! [`FakeBridge`]: an in-memory kilnd for one search. Candidates are "evaluated" at
//! once by a function the test supplies; logs, checkpoints and the final report are
//! kept for the test to read. It follows the same error codes as kilnd
//! ([`crate::protocol::codes`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use kiln_types::{Candidate, Evaluation, Verdict};

use super::{Bridge, BridgeError};
use crate::protocol::{
    ArchiveEntry, ArchiveReply, Baseline, Budget, ChatReply, ChatRequest, Context, Device, Finish,
    Finished, LogLine, Submitted, WaitReply, WaitRequest, codes,
};

/// Turns a submitted candidate into its evaluation.
pub type Evaluate = Box<dyn Fn(&Candidate) -> Evaluation + Send>;

/// What the fake holds; read it with [`FakeBridge::state`].
pub struct FakeState {
    /// What `context` returns.
    pub context: Context,
    /// Submitted candidates in order: id, candidate, evaluation.
    pub candidates: Vec<(String, Candidate, Evaluation)>,
    /// Candidates that may still be submitted (`None`: unlimited).
    pub candidates_left: Option<u64>,
    /// LLM replies to hand out in order; when empty, `llm_unavailable`.
    pub llm_replies: VecDeque<Result<ChatReply, BridgeError>>,
    /// Chat requests received.
    pub llm_requests: Vec<ChatRequest>,
    /// The stored checkpoint.
    pub checkpoint: Option<Vec<u8>>,
    /// Largest checkpoint accepted.
    pub checkpoint_limit: usize,
    /// Log lines received.
    pub logs: Vec<LogLine>,
    /// The host's final report.
    pub finished: Option<Finish>,
    /// Number of `wait` calls.
    pub waits: usize,
    evaluate: Evaluate,
}

/// An in-memory bridge. Clones share state, so a test keeps one clone and hands
/// another to the host.
#[derive(Clone)]
pub struct FakeBridge {
    inner: Arc<Mutex<FakeState>>,
}

impl FakeBridge {
    /// A fake serving `context`, evaluating each candidate with `evaluate`.
    pub fn new(context: Context, evaluate: Evaluate) -> Self {
        FakeBridge {
            inner: Arc::new(Mutex::new(FakeState {
                context,
                candidates: Vec::new(),
                candidates_left: None,
                llm_replies: VecDeque::new(),
                llm_requests: Vec::new(),
                checkpoint: None,
                checkpoint_limit: 1 << 20,
                logs: Vec::new(),
                finished: None,
                waits: 0,
                evaluate,
            })),
        }
    }

    /// The shared state (poisoning is ignored: a panicking test thread has already
    /// failed the test).
    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A small host-backend problem, `vecadd-64`, whose seed has one knob
    /// (`// @knob BLOCK 16|32|64`, currently 16) and one idea.
    pub fn sample_context() -> Context {
        let seed_source = "// @knob BLOCK 16|32|64\n#define BLOCK 16\n// @idea unroll: unroll the inner loop by 4\nvoid add(const float *a, const float *b, float *c, int n) {\n  for (int i = 0; i < n; i += BLOCK)\n    for (int j = i; j < i + BLOCK && j < n; j++) c[j] = a[j] + b[j];\n}\n";
        let launches = serde_json::json!([{"kernel": "add", "args": ["a", "b", "c", {"i32": 64}]}]);
        let problem = serde_json::json!({
            "name": "vecadd-64",
            "summary": "c = a + b",
            "tensor": [
                {"name": "a", "dtype": "f32", "shape": [64], "role": "input"},
                {"name": "b", "dtype": "f32", "shape": [64], "role": "input"},
                {"name": "c", "dtype": "f32", "shape": [64], "role": "output"}
            ],
            "tolerance": {"atol": 1e-6, "rtol": 1e-6},
            "reference": {"host": {"file": "reference.c", "source": "void add(void) {}", "launches": launches}},
            "seed": {"host": {"file": "seed.c", "source": seed_source, "launches": launches}}
        });
        Context {
            search_id: "s-test".into(),
            problem,
            backend: "host".into(),
            seed: Some(serde_json::json!({
                "problem": "vecadd-64", "language": "c", "source": seed_source,
                "launches": launches, "note": "seed kernel"
            })),
            baselines: vec![Baseline {
                name: "reference".into(),
                median_us: Some(10.0),
            }],
            device: Device {
                backend: "host".into(),
                name: "test cpu".into(),
                compute_capability: None,
                units: Some(2),
                memory_bytes: None,
                extra: serde_json::json!({}),
            },
            config: String::new(),
            random_seed: 42,
        }
    }

    /// An evaluator for [`FakeBridge::sample_context`]: `ok`, with a median of
    /// `100 / BLOCK` µs (so the largest block wins).
    pub fn sample_evaluate() -> Evaluate {
        Box::new(|c: &Candidate| {
            let block = crate::bridge::fake::define_value(&c.source, "BLOCK")
                .and_then(|v| v.parse::<f64>().ok());
            match block {
                Some(b) if b > 0.0 => {
                    let mut e =
                        Evaluation::early(Verdict::Ok, kiln_types::BackendKind::Host, "correct");
                    e.timing = Some(kiln_types::TimingStats {
                        median_us: 100.0 / b,
                        mean_us: 100.0 / b,
                        n: 10,
                        ..Default::default()
                    });
                    e
                }
                _ => Evaluation::early(
                    Verdict::CompileError,
                    kiln_types::BackendKind::Host,
                    "BLOCK is not defined",
                ),
            }
        })
    }

    fn refuse(status: u16, code: &str, message: impl Into<String>) -> BridgeError {
        BridgeError::Refused {
            status,
            code: code.into(),
            message: message.into(),
        }
    }
}

/// The value of `#define NAME value` in `source`, if any.
pub fn define_value<'a>(source: &'a str, name: &str) -> Option<&'a str> {
    source.lines().find_map(|l| {
        let rest = l.trim_start().strip_prefix("#define")?.trim_start();
        let rest = rest.strip_prefix(name)?;
        rest.starts_with([' ', '\t'])
            .then(|| rest.split_whitespace().next())
            .flatten()
    })
}

impl Bridge for FakeBridge {
    fn context(&mut self) -> Result<Context, BridgeError> {
        Ok(self.state().context.clone())
    }

    fn submit(&mut self, candidate_json: &str) -> Result<Submitted, BridgeError> {
        let mut s = self.state();
        let c: Candidate = serde_json::from_str(candidate_json)
            .map_err(|e| Self::refuse(400, codes::INVALID_FIELD, e.to_string()))?;
        c.validate()
            .map_err(|e| Self::refuse(400, codes::INVALID_CANDIDATE, e.to_string()))?;
        let problem = s.context.problem["name"].as_str().unwrap_or_default();
        if c.problem != problem {
            return Err(Self::refuse(
                400,
                codes::INVALID_CANDIDATE,
                format!(
                    "this search is for problem {problem:?}, not {:?}",
                    c.problem
                ),
            ));
        }
        let id = c.content_hash();
        if s.candidates.iter().any(|(i, _, _)| *i == id) {
            return Ok(Submitted {
                id,
                job_id: None,
                duplicate: true,
            });
        }
        if s.candidates_left == Some(0) {
            return Err(Self::refuse(
                409,
                codes::BUDGET_EXHAUSTED,
                "no candidates left",
            ));
        }
        if let Some(n) = s.candidates_left.as_mut() {
            *n -= 1;
        }
        let e = (s.evaluate)(&c);
        s.candidates.push((id.clone(), c, e));
        let job_id = i64::try_from(s.candidates.len()).ok();
        Ok(Submitted {
            id,
            job_id,
            duplicate: false,
        })
    }

    fn wait(&mut self, request: &WaitRequest) -> Result<WaitReply, BridgeError> {
        let mut s = self.state();
        s.waits += 1;
        let mut finished = Vec::new();
        for id in &request.ids {
            let (_, _, e) = s
                .candidates
                .iter()
                .find(|(i, _, _)| i == id)
                .ok_or_else(|| Self::refuse(404, codes::UNKNOWN_CANDIDATE, id.clone()))?;
            if finished.iter().any(|f: &Finished| &f.candidate_id == id) {
                continue;
            }
            finished.push(Finished {
                candidate_id: id.clone(),
                evaluation: serde_json::to_value(e).ok(),
                error: None,
            });
        }
        Ok(WaitReply { finished })
    }

    fn archive(&mut self) -> Result<ArchiveReply, BridgeError> {
        let s = self.state();
        Ok(ArchiveReply {
            entries: s
                .candidates
                .iter()
                .map(|(id, c, e)| ArchiveEntry {
                    id: id.clone(),
                    candidate: serde_json::to_value(c).unwrap_or_default(),
                    evaluation: serde_json::to_value(e).ok(),
                    error: None,
                })
                .collect(),
        })
    }

    fn chat(&mut self, request: &ChatRequest) -> Result<ChatReply, BridgeError> {
        let mut s = self.state();
        s.llm_requests.push(request.clone());
        s.llm_replies.pop_front().unwrap_or_else(|| {
            Err(Self::refuse(
                503,
                codes::LLM_UNAVAILABLE,
                "no LLM configured",
            ))
        })
    }

    fn put_checkpoint(&mut self, data: &[u8]) -> Result<(), BridgeError> {
        let mut s = self.state();
        if data.len() > s.checkpoint_limit {
            let limit = s.checkpoint_limit;
            return Err(Self::refuse(
                413,
                codes::CHECKPOINT_TOO_LARGE,
                format!("{limit}"),
            ));
        }
        s.checkpoint = Some(data.to_vec());
        Ok(())
    }

    fn get_checkpoint(&mut self) -> Result<Option<Vec<u8>>, BridgeError> {
        Ok(self.state().checkpoint.clone())
    }

    fn log(&mut self, line: &LogLine) -> Result<(), BridgeError> {
        self.state().logs.push(line.clone());
        Ok(())
    }

    fn budget(&mut self) -> Result<Budget, BridgeError> {
        Ok(Budget {
            candidates_left: self.state().candidates_left,
            ms_left: None,
            tokens_left: None,
        })
    }

    fn finish(&mut self, report: &Finish) -> Result<(), BridgeError> {
        self.state().finished = Some(report.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_context_is_a_valid_problem_with_a_valid_seed() {
        let ctx = FakeBridge::sample_context();
        let spec: kiln_types::ProblemSpec =
            serde_json::from_value(ctx.problem.clone()).expect("spec parses");
        spec.validate().expect("spec is valid");
        let seed: Candidate =
            serde_json::from_value(ctx.seed.clone().expect("seed")).expect("seed parses");
        seed.validate().expect("seed is valid");
        assert_eq!(define_value(&seed.source, "BLOCK"), Some("16"));
    }

    #[test]
    fn submit_dedups_and_counts_budget() {
        let mut f = FakeBridge::new(FakeBridge::sample_context(), FakeBridge::sample_evaluate());
        f.state().candidates_left = Some(1);
        let seed = serde_json::to_string(&FakeBridge::sample_context().seed).expect("json");
        let a = f.submit(&seed).expect("accepted");
        assert!(!a.duplicate);
        assert!(f.submit(&seed).expect("duplicate").duplicate);
        let other = seed.replace("#define BLOCK 16", "#define BLOCK 32");
        assert_eq!(
            f.submit(&other).expect_err("budget").code(),
            Some(codes::BUDGET_EXHAUSTED)
        );
        assert_eq!(
            f.submit("{}").expect_err("invalid").code(),
            Some(codes::INVALID_FIELD)
        );
    }
}
