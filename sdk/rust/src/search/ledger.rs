//! [`Ledger`]: submits batches of candidates within the search's budgets, waits for
//! them, and remembers every evaluation (including those from before a restart).

use std::collections::BTreeMap;
use std::time::Duration;

use kiln_types::Candidate;

use crate::evaluator::{Evaluation, EvaluatorError};

/// What became of one candidate of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Its id (content hash).
    pub id: String,
    /// Its evaluation; `None` when it was not submitted (budget spent, refused) or did
    /// not finish in time.
    pub evaluation: Option<Evaluation>,
}

impl Outcome {
    /// True if and only if it was evaluated `ok`.
    pub fn is_ok(&self) -> bool {
        self.evaluation.as_ref().is_some_and(Evaluation::is_ok)
    }

    /// Its median time when correct.
    pub fn median_us(&self) -> Option<f64> {
        self.evaluation
            .as_ref()
            .filter(|e| e.is_ok())
            .and_then(|e| e.median_us)
    }
}

/// Every evaluation this search has seen, and whether its candidate budget is spent.
#[derive(Debug, Default)]
pub struct Ledger {
    evals: BTreeMap<String, Evaluation>,
    /// Set once kilnd answered `budget-exhausted`: nothing more will be evaluated.
    pub exhausted: bool,
    /// Longest wait for one batch.
    pub batch_timeout: Duration,
}

impl Ledger {
    /// A ledger holding the evaluations already in the search's archive (after a
    /// restart, the candidates finished before it).
    pub fn load() -> Ledger {
        let mut l = Ledger {
            batch_timeout: Duration::from_secs(3600),
            ..Ledger::default()
        };
        for e in crate::evaluator::archive() {
            if let Some(ev) = e.evaluation {
                l.evals.insert(e.id, ev);
            }
        }
        l
    }

    /// The evaluation of `id`, if finished.
    pub fn get(&self, id: &str) -> Option<&Evaluation> {
        self.evals.get(id)
    }

    /// Number of evaluations known.
    pub fn len(&self) -> usize {
        self.evals.len()
    }

    /// True if and only if nothing was evaluated yet.
    pub fn is_empty(&self) -> bool {
        self.evals.is_empty()
    }

    /// True if and only if no more candidates can be evaluated (budget or time spent).
    pub fn done(&mut self) -> bool {
        if self.exhausted {
            return true;
        }
        let b = crate::plugin_host::budget();
        if b.candidates_left == Some(0) || b.time_left.is_some_and(|t| t.is_zero()) {
            self.exhausted = true;
        }
        self.exhausted
    }

    /// Submits `batch` (in order; candidates already evaluated are answered from the
    /// ledger), waits for all of them, and returns one outcome per candidate. A full
    /// queue is waited out; a spent budget stops submitting and sets
    /// [`Ledger::exhausted`].
    pub fn evaluate(&mut self, batch: &[Candidate]) -> Vec<Outcome> {
        let ids: Vec<String> = batch.iter().map(Candidate::content_hash).collect();
        let mut pending: Vec<String> = Vec::new();
        for (i, c) in batch.iter().enumerate() {
            if self.evals.contains_key(&ids[i]) {
                continue;
            }
            if self.exhausted {
                continue;
            }
            loop {
                match crate::evaluator::submit(c) {
                    Ok(s) => {
                        if !pending.contains(&s.id) {
                            pending.push(s.id);
                        }
                        break;
                    }
                    Err(EvaluatorError::QueueFull) if !pending.is_empty() => {
                        self.wait_some(&mut pending, Duration::from_secs(1));
                    }
                    Err(EvaluatorError::QueueFull) => {
                        // This search's jobs from before a restart fill the queue.
                        let mut older: Vec<String> = crate::evaluator::archive()
                            .into_iter()
                            .filter(|e| e.evaluation.is_none())
                            .map(|e| e.id)
                            .collect();
                        if older.is_empty() || !self.wait_some(&mut older, Duration::from_secs(1)) {
                            crate::warn!("the queue stays full; giving up on {}", ids[i]);
                            break;
                        }
                    }
                    Err(EvaluatorError::BudgetExhausted) => {
                        self.exhausted = true;
                        break;
                    }
                    Err(e) => {
                        crate::warn!("candidate {} refused: {e}", ids[i]);
                        break;
                    }
                }
            }
        }
        while !pending.is_empty() {
            if !self.wait_some(&mut pending, Duration::from_secs(30)) {
                break;
            }
        }
        ids.into_iter()
            .map(|id| Outcome {
                evaluation: self.evals.get(&id).cloned(),
                id,
            })
            .collect()
    }

    /// Waits until at least one of `pending` finishes; records and removes the finished
    /// ones. Each host call waits at most `slice` (it returns early once all are done).
    /// False when nothing came back in the batch timeout (or the time budget).
    fn wait_some(&mut self, pending: &mut Vec<String>, slice: Duration) -> bool {
        let timeout = match crate::plugin_host::budget().time_left {
            Some(t) => t.min(self.batch_timeout),
            None => self.batch_timeout,
        };
        let start = crate::plugin_host::now();
        loop {
            let got = match crate::evaluator::wait(pending, slice) {
                Ok(g) => g,
                Err(e) => {
                    crate::warn!("wait failed: {e}");
                    return false;
                }
            };
            if !got.is_empty() {
                for e in got {
                    pending.retain(|p| *p != e.candidate_id);
                    self.evals.insert(e.candidate_id.clone(), e);
                }
                return true;
            }
            if crate::plugin_host::now().saturating_sub(start) >= timeout {
                return false;
            }
        }
    }
}
