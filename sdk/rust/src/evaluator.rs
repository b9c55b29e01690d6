//! The evaluator: the problem being searched, submitting candidates, waiting for their
//! evaluations, and the search's archive.

use std::time::Duration;

use kiln_types::verdict::KernelResources;
use kiln_types::{Candidate, PrecisionTier, ProblemSpec, Verdict};
use thiserror::Error;

use crate::bindings::kiln::proposer::evaluator as wit;
use crate::bindings::kiln::proposer::types as wit_types;

/// A trusted baseline timed for the problem on the search's device.
#[derive(Debug, Clone, PartialEq)]
pub struct Baseline {
    /// Name (`reference`, `cublas`, `torch-eager`...).
    pub name: String,
    /// Median time, microseconds, when it has been measured.
    pub median_us: Option<f64>,
}

/// Facts about the device candidates are evaluated on.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceFacts {
    /// Backend name: `host` or `cuda`.
    pub backend: String,
    /// Device name.
    pub name: String,
    /// Compute capability such as `9.0` (cuda only).
    pub compute_capability: Option<String>,
    /// Streaming multiprocessors (cuda) or CPU cores (host).
    pub units: Option<u32>,
    /// Device memory in bytes.
    pub memory_bytes: Option<u64>,
    /// Everything kilnd knows about the device.
    pub extra: serde_json::Value,
}

/// What the search works on, as returned by [`problem`].
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// The search's id in kilnd.
    pub search_id: String,
    /// The problem's spec, sources inlined.
    pub spec: ProblemSpec,
    /// The seed kernel for the search's backend, if the problem has one.
    pub seed: Option<Candidate>,
    /// Baselines for the search's backend.
    pub baselines: Vec<Baseline>,
    /// The device candidates run on.
    pub device: DeviceFacts,
}

impl Problem {
    /// The seed a search starts from: the seed in `language` (`c`, `cuda`, `triton`)
    /// when a config names one; else the seed of the search's backend, or — on the cuda
    /// backend, for a problem whose only seed is Triton's — the Triton seed.
    pub fn seed_for(&self, language: Option<&str>) -> Result<Candidate, String> {
        let key = match language {
            None => {
                return self
                    .seed
                    .clone()
                    .or_else(|| {
                        (self.device.backend == "cuda")
                            .then(|| self.spec.seed_candidate("triton"))
                            .flatten()
                    })
                    .ok_or_else(|| format!("problem {} has no seed kernel", self.spec.name));
            }
            Some("triton") => "triton",
            Some("cuda") => "cuda",
            Some("c") => "host",
            Some(other) => {
                return Err(format!("language {other:?}: one of c, cuda, triton"));
            }
        };
        let seed = self.spec.seed_candidate(key).ok_or_else(|| {
            format!(
                "problem {} has no {} seed (a [seed.{key}] table in its problem.toml)",
                self.spec.name,
                language.unwrap_or_default()
            )
        })?;
        if seed.language.backend() != self.device.backend {
            return Err(format!(
                "{} candidates run on the {} backend; this search runs on {}",
                seed.language.as_str(),
                seed.language.backend(),
                self.device.backend
            ));
        }
        Ok(seed)
    }
}

/// Why the problem info from the host could not be read.
#[derive(Debug, Error)]
pub enum ProblemError {
    /// The spec JSON did not parse as a `ProblemSpec`.
    #[error("problem spec from the host does not parse: {0}")]
    Spec(serde_json::Error),
    /// The seed JSON did not parse as a `Candidate`.
    #[error("seed kernel from the host does not parse: {0}")]
    Seed(serde_json::Error),
}

/// A candidate accepted by [`submit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// Its id (content hash).
    pub id: String,
    /// True if and only if the same candidate had already been submitted: nothing new
    /// was queued.
    pub duplicate: bool,
}

/// A finished evaluation of one candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// The candidate it is for.
    pub candidate_id: String,
    /// The verdict; `None` when kiln could not evaluate the candidate (its job failed
    /// for a reason that is kiln's, said in `message`).
    pub verdict: Option<Verdict>,
    /// One line saying why.
    pub message: String,
    /// Median time, microseconds (correct candidates only).
    pub median_us: Option<f64>,
    /// Precision tier delivered (correct candidates only).
    pub tier: Option<PrecisionTier>,
    /// Per-kernel resources, where the backend reports them.
    pub resources: Vec<KernelResources>,
    /// The full evaluation as JSON (`null` when not evaluated).
    pub json: String,
}

impl Evaluation {
    /// True if and only if the candidate is correct and timed.
    pub fn is_ok(&self) -> bool {
        self.verdict == Some(Verdict::Ok)
    }

    /// The full evaluation (evidence, timing statistics, telemetry), when there is one
    /// and it parses.
    pub fn full(&self) -> Option<kiln_types::Evaluation> {
        serde_json::from_str(&self.json).ok()
    }

    /// The timing statistics of a correct candidate, from the full evaluation.
    pub fn timing(&self) -> Option<kiln_types::TimingStats> {
        self.full().and_then(|f| f.timing)
    }
}

/// One candidate of the search's archive.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The candidate's id.
    pub id: String,
    /// The candidate as submitted, as JSON.
    pub candidate_json: String,
    /// Its evaluation, once finished.
    pub evaluation: Option<Evaluation>,
}

impl Entry {
    /// The candidate, when its JSON parses.
    pub fn candidate(&self) -> Option<Candidate> {
        serde_json::from_str(&self.candidate_json).ok()
    }
}

/// Why the evaluator refused a request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EvaluatorError {
    /// The candidate could not be serialised (never happens for a valid `Candidate`).
    #[error("candidate does not serialise: {0}")]
    Serialise(String),
    /// The candidate is malformed or structurally invalid, or names another problem.
    #[error("candidate refused: {0}")]
    Invalid(String),
    /// The id was never submitted by this search.
    #[error("unknown candidate {0}")]
    UnknownCandidate(String),
    /// The search's candidate budget is spent.
    #[error("the search's candidate budget is spent")]
    BudgetExhausted,
    /// Too many of this search's candidates are waiting; wait, then submit again.
    #[error("too many candidates are waiting; wait for some, then submit again")]
    QueueFull,
}

impl From<wit::EvaluatorError> for EvaluatorError {
    fn from(e: wit::EvaluatorError) -> Self {
        match e {
            wit::EvaluatorError::Invalid(m) => EvaluatorError::Invalid(m),
            wit::EvaluatorError::UnknownCandidate(id) => EvaluatorError::UnknownCandidate(id),
            wit::EvaluatorError::BudgetExhausted => EvaluatorError::BudgetExhausted,
            wit::EvaluatorError::QueueFull => EvaluatorError::QueueFull,
        }
    }
}

fn verdict_from_wit(v: wit_types::Verdict) -> Option<Verdict> {
    use wit_types::Verdict as W;
    Some(match v {
        W::CompileError => Verdict::CompileError,
        W::InvalidLaunch => Verdict::InvalidLaunch,
        W::RuntimeFault => Verdict::RuntimeFault,
        W::Timeout => Verdict::Timeout,
        W::WrongAnswer => Verdict::WrongAnswer,
        W::IncompleteOutput => Verdict::IncompleteOutput,
        W::InputTampered => Verdict::InputTampered,
        W::Nondeterministic => Verdict::Nondeterministic,
        W::ImplausibleTime => Verdict::ImplausibleTime,
        W::Ok => Verdict::Ok,
        W::NotEvaluated => return None,
    })
}

fn tier_from_wit(t: wit_types::PrecisionTier) -> PrecisionTier {
    use wit_types::PrecisionTier as W;
    match t {
        W::Fp32Faithful => PrecisionTier::Fp32Faithful,
        W::Tf32Like => PrecisionTier::Tf32Like,
        W::Fp16Like => PrecisionTier::Fp16Like,
        W::Bf16Like => PrecisionTier::Bf16Like,
        W::Coarse => PrecisionTier::Coarse,
    }
}

impl From<wit_types::Evaluation> for Evaluation {
    fn from(e: wit_types::Evaluation) -> Self {
        Evaluation {
            candidate_id: e.candidate_id,
            verdict: verdict_from_wit(e.verdict),
            message: e.message,
            median_us: e.median_us,
            tier: e.tier.map(tier_from_wit),
            resources: e
                .resources
                .into_iter()
                .map(|r| KernelResources {
                    name: r.name,
                    registers: r.registers,
                    static_shared_bytes: r.static_shared_bytes,
                    local_bytes: r.local_bytes,
                    max_threads_per_block: r.max_threads_per_block,
                    occupancy: r.occupancy,
                })
                .collect(),
            json: e.json,
        }
    }
}

/// The problem, its seed kernel, baselines and device.
pub fn problem() -> Result<Problem, ProblemError> {
    let p = wit::problem();
    let spec = serde_json::from_str(&p.spec_json).map_err(ProblemError::Spec)?;
    let seed = p
        .seed_json
        .map(|s| serde_json::from_str(&s))
        .transpose()
        .map_err(ProblemError::Seed)?;
    Ok(Problem {
        search_id: p.search_id,
        spec,
        seed,
        baselines: p
            .baselines
            .into_iter()
            .map(|b| Baseline {
                name: b.name,
                median_us: b.median_us,
            })
            .collect(),
        device: DeviceFacts {
            backend: p.device.backend,
            name: p.device.name,
            compute_capability: p.device.compute_capability,
            units: p.device.units,
            memory_bytes: p.device.memory_bytes,
            extra: serde_json::from_str(&p.device.json).unwrap_or(serde_json::Value::Null),
        },
    })
}

/// Queues a candidate for evaluation.
pub fn submit(candidate: &Candidate) -> Result<Submission, EvaluatorError> {
    let json =
        serde_json::to_string(candidate).map_err(|e| EvaluatorError::Serialise(e.to_string()))?;
    let s = wit::submit(&json)?;
    Ok(Submission {
        id: s.id,
        duplicate: s.duplicate,
    })
}

/// Waits until every candidate in `ids` is evaluated or `timeout` has passed, and
/// returns the evaluations that are finished (possibly none).
pub fn wait(ids: &[String], timeout: Duration) -> Result<Vec<Evaluation>, EvaluatorError> {
    let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    Ok(wit::wait(ids, ms)?
        .into_iter()
        .map(Evaluation::from)
        .collect())
}

/// Waits for every candidate in `ids` (calling [`wait`] as often as needed) until all are
/// evaluated or `timeout` has passed; returns the finished evaluations in the order of
/// `ids`.
pub fn wait_all(ids: &[String], timeout: Duration) -> Result<Vec<Evaluation>, EvaluatorError> {
    // The host's clock, not `std::time::Instant`: std's clock would make the component
    // import `wasi:clocks`, which the host does not link.
    let start = crate::plugin_host::now();
    let elapsed = || crate::plugin_host::now().saturating_sub(start);
    let mut done: Vec<Evaluation> = Vec::new();
    loop {
        let pending: Vec<String> = ids
            .iter()
            .filter(|id| !done.iter().any(|e| &e.candidate_id == *id))
            .cloned()
            .collect();
        let left = timeout.saturating_sub(elapsed());
        if pending.is_empty() || left.is_zero() {
            break;
        }
        let got = wait(&pending, left)?;
        if got.is_empty() && elapsed() >= timeout {
            break;
        }
        done.extend(got);
    }
    done.sort_by_key(|e| ids.iter().position(|id| *id == e.candidate_id));
    Ok(done)
}

/// The fastest correct evaluation among `evals`, if any.
pub fn best(evals: &[Evaluation]) -> Option<&Evaluation> {
    evals
        .iter()
        .filter(|e| e.is_ok())
        .filter_map(|e| e.median_us.map(|t| (t, e)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, e)| e)
}

/// Every candidate this search has submitted, oldest first, with evaluations where
/// finished.
pub fn archive() -> Vec<Entry> {
    wit::archive()
        .into_iter()
        .map(|e| Entry {
            id: e.id,
            candidate_json: e.candidate_json,
            evaluation: e.evaluation.map(Evaluation::from),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(id: &str, verdict: Option<Verdict>, t: Option<f64>) -> Evaluation {
        Evaluation {
            candidate_id: id.into(),
            verdict,
            message: String::new(),
            median_us: t,
            tier: None,
            resources: vec![],
            json: "null".into(),
        }
    }

    #[test]
    fn best_is_the_fastest_correct_one() {
        let evals = [
            eval("a", Some(Verdict::Ok), Some(5.0)),
            eval("b", Some(Verdict::WrongAnswer), Some(1.0)),
            eval("c", Some(Verdict::Ok), Some(3.0)),
            eval("d", None, None),
        ];
        assert_eq!(best(&evals).map(|e| e.candidate_id.as_str()), Some("c"));
        assert!(best(&evals[1..2]).is_none());
    }

    fn problem(backend: &str, seeds: &str) -> Problem {
        let spec = ProblemSpec::from_toml(&format!(
            r#"name = "p"
[[tensor]]
name = "y"
dtype = "f32"
shape = [4]
role = "output"
[tolerance]
atol = 0.0
rtol = 0.0
[reference.cuda]
file = "r.cu"
launches = [{{ kernel = "r", args = ["y"] }}]
{seeds}"#
        ))
        .expect("spec");
        Problem {
            search_id: "s".into(),
            seed: spec.seed_candidate(backend),
            spec,
            baselines: Vec::new(),
            device: DeviceFacts {
                backend: backend.into(),
                name: "gpu".into(),
                compute_capability: None,
                units: None,
                memory_bytes: None,
                extra: serde_json::Value::Null,
            },
        }
    }

    #[test]
    fn the_seed_follows_the_config_then_the_backend() {
        let both = "[seed.cuda]\nfile = \"s.cu\"\nlaunches = [{ kernel = \"k\" }]\n\
                    [seed.triton]\nfile = \"s.py\"\nlaunches = [{ kernel = \"k\" }]\n";
        let p = problem("cuda", both);
        assert_eq!(
            p.seed_for(None).map(|c| c.language),
            Ok(kiln_types::Language::Cuda)
        );
        assert_eq!(
            p.seed_for(Some("triton")).map(|c| c.language),
            Ok(kiln_types::Language::Triton)
        );
        assert!(
            p.seed_for(Some("c"))
                .expect_err("no c seed")
                .contains("no c seed")
        );
        assert!(p.seed_for(Some("rust")).is_err());
        // A cuda problem whose only seed is Triton's starts from it.
        let only = problem(
            "cuda",
            "[seed.triton]\nfile = \"s.py\"\nlaunches = [{ kernel = \"k\" }]\n",
        );
        assert_eq!(
            only.seed_for(None).map(|c| c.language),
            Ok(kiln_types::Language::Triton)
        );
    }
}
