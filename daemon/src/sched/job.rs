//! One job's path: compile (cached) → lane (any free one, or the one the job is pinned
//! to) → job options → evaluate → store → event.

use std::sync::Arc;
use std::time::Instant;

use kiln_types::{Candidate, EvalPlan, Evaluation, ProblemSpec};
use rand::RngCore;
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use super::{Lanes, Scheduler};
use crate::backends::{Backend, BackendError, compile_key};
use crate::events::Event;
use crate::store::{Artifact, JobRecord};

/// Why a job could not produce an evaluation.
enum JobFailure {
    /// The backend or the store broke; the message is stored on the job.
    Infra(String),
}

impl From<BackendError> for JobFailure {
    fn from(e: BackendError) -> Self {
        JobFailure::Infra(format!("backend: {e}"))
    }
}

impl From<crate::store::StoreError> for JobFailure {
    fn from(e: crate::store::StoreError) -> Self {
        JobFailure::Infra(format!("store: {e}"))
    }
}

impl Scheduler {
    fn publish_job(
        &self,
        job: &JobRecord,
        problem: &str,
        state: &str,
        stage: Option<&str>,
        eval: Option<&Evaluation>,
        error: Option<&str>,
    ) {
        self.events.publish(Event::Job {
            job_id: job.id,
            candidate_id: job.candidate_id.clone(),
            problem: problem.to_string(),
            state: state.to_string(),
            stage: stage.map(str::to_string),
            verdict: eval.map(|e| e.verdict.to_string()),
            median_us: eval.and_then(|e| e.timing.as_ref().map(|t| t.median_us)),
            error: error.map(str::to_string),
        });
    }

    /// Runs one claimed job to its end. Never panics on the candidate's account: every
    /// outcome is stored.
    pub(super) async fn run_job(
        self: Arc<Self>,
        job: JobRecord,
        compile_permit: OwnedSemaphorePermit,
    ) {
        let span = tracing::info_span!("job", id = job.id, candidate = %job.candidate_id);
        self.run_job_inner(job, compile_permit)
            .instrument(span)
            .await;
    }

    async fn run_job_inner(self: Arc<Self>, job: JobRecord, compile_permit: OwnedSemaphorePermit) {
        let problem_name = match self.store.get_candidate(&job.candidate_id) {
            Ok(Some(rec)) => rec.candidate.problem.clone(),
            _ => String::new(),
        };
        self.publish_job(
            &job,
            &problem_name,
            "running",
            Some("compiling"),
            None,
            None,
        );
        match self.clone().pipeline(&job, compile_permit).await {
            Ok((eval, compile_ms, eval_ms)) => {
                tracing::info!(verdict = %eval.verdict, message = %eval.message, "job done");
                match self.store.finish_job(job.id, &eval, compile_ms, eval_ms) {
                    Ok(()) => {
                        self.publish_job(&job, &problem_name, "done", None, Some(&eval), None)
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot store the evaluation");
                        let msg = format!("cannot store the evaluation: {e}");
                        let _ = self.store.fail_job(job.id, &msg);
                        self.publish_job(&job, &problem_name, "failed", None, None, Some(&msg));
                    }
                }
            }
            Err(JobFailure::Infra(msg)) => {
                tracing::error!(error = %msg, "job failed");
                if let Err(e) = self.store.fail_job(job.id, &msg) {
                    tracing::error!(error = %e, "cannot mark the job failed");
                }
                self.publish_job(&job, &problem_name, "failed", None, None, Some(&msg));
            }
        }
    }

    async fn pipeline(
        self: Arc<Self>,
        job: &JobRecord,
        compile_permit: OwnedSemaphorePermit,
    ) -> Result<(Evaluation, f64, f64), JobFailure> {
        let rec = self
            .store
            .get_candidate(&job.candidate_id)?
            .ok_or_else(|| JobFailure::Infra("candidate vanished from the store".into()))?;
        let problem = self
            .store
            .get_problem(&rec.candidate.problem)?
            .ok_or_else(|| {
                JobFailure::Infra(format!(
                    "problem {:?} is not registered",
                    rec.candidate.problem
                ))
            })?;
        let backend = self
            .backends
            .get(job.backend.as_str())
            .cloned()
            .ok_or_else(|| {
                JobFailure::Infra(format!("backend {:?} is not built in", job.backend))
            })?;

        // Compile stage: the reference (cached after its first use) and the candidate.
        let t0 = Instant::now();
        if !problem.reference.has(backend.name()) {
            let eval = Evaluation::early(
                kiln_types::Verdict::InvalidLaunch,
                backend.name(),
                format!(
                    "problem {:?} has no reference for the {} backend",
                    problem.name,
                    backend.name()
                ),
            );
            return Ok((eval, 0.0, 0.0));
        }
        // A torch reference (no kernel for this backend) is run by the backend's reference
        // runner: nothing to compile, an empty artifact.
        let reference_bytes = match problem.reference_candidate(backend.name()) {
            Some(c) => match self.compile_cached(&backend, &problem, &c).await? {
                Ok(a) => a.bytes,
                Err(failure) => {
                    return Err(JobFailure::Infra(format!(
                        "the problem's reference does not compile: {}",
                        failure.message
                    )));
                }
            },
            None => Vec::new(),
        };
        let artifact = self
            .compile_cached(&backend, &problem, &rec.candidate)
            .await?;
        let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
        drop(compile_permit);
        let artifact = match artifact {
            Ok(a) => a,
            Err(mut failure) => {
                failure
                    .compile
                    .get_or_insert_with(Default::default)
                    .duration_ms = compile_ms;
                return Ok((failure, compile_ms, 0.0));
            }
        };

        // Evaluation stage: one job per lane at a time.
        self.store.set_stage(job.id, "evaluating")?;
        self.publish_job(
            job,
            &problem.name,
            "running",
            Some("evaluating"),
            None,
            None,
        );
        let slots = self
            .lane_slots
            .get(backend.name())
            .cloned()
            .ok_or_else(|| JobFailure::Infra("no lane for backend".into()))?;
        let pinned = job.options.as_ref().and_then(|o| o.lane);
        let lanes = match pinned {
            Some(l) => Lanes::Only(vec![l as usize]),
            None => Lanes::Any,
        };
        let lane = slots.acquire(lanes).await.ok_or_else(|| {
            JobFailure::Infra(format!(
                "the job asks for lane {} but the {} backend has {} lane(s) here",
                pinned.unwrap_or_default(),
                backend.name(),
                slots.count()
            ))
        })?;
        let lane_index = lane.index;
        let plan = super::job_options::apply_job_options(
            &self.store,
            &self.config,
            job,
            &problem.name,
            self.plan_for(backend.as_ref()),
        )?;
        let t1 = Instant::now();
        let candidate = rec.candidate.clone();
        let be = backend.clone();
        let mut eval = tokio::task::spawn_blocking(move || {
            be.evaluate(
                lane_index,
                &problem,
                &reference_bytes,
                &candidate,
                &artifact.bytes,
                &plan,
            )
            .map(|e| (e, artifact.info))
        })
        .await
        .map_err(|e| JobFailure::Infra(format!("evaluation task: {e}")))?
        .map(|(mut e, mut info)| {
            // The backend may learn kernel resources only when it loads the module (cuda):
            // keep what it reported over the compile step's empty list.
            if let Some(reported) = e.compile.take()
                && info.kernels.is_empty()
            {
                info.kernels = reported.kernels;
            }
            e.compile = Some(info);
            e
        })?;
        let eval_ms = t1.elapsed().as_secs_f64() * 1e3;
        crate::metrics::add_lane_busy(backend.name(), lane_index, eval_ms / 1e3);
        drop(lane);
        if let Some(c) = eval.compile.as_mut() {
            c.duration_ms = if c.cached {
                c.duration_ms
            } else {
                compile_ms.max(c.duration_ms)
            };
        }
        Ok((eval, compile_ms, eval_ms))
    }

    pub(super) fn plan_for(&self, backend: &dyn Backend) -> EvalPlan {
        let ev = &self.config.evaluation;
        let (peak_bytes, peak_flops) = backend.peaks();
        EvalPlan {
            seed: rand::rng().next_u64(),
            trials: ev.trials,
            run_timeout_ms: ev.run_timeout_ms,
            timing: ev.timing.clone(),
            peak_bytes_per_s: peak_bytes,
            peak_flops,
            plain: None,
            race: None,
        }
    }

    /// The artifact for `candidate`, from the cache or a fresh compile. The inner `Err`
    /// is the candidate's `compile_error` evaluation.
    async fn compile_cached(
        &self,
        backend: &Arc<dyn Backend>,
        problem: &ProblemSpec,
        candidate: &Candidate,
    ) -> Result<Result<Artifact, Evaluation>, JobFailure> {
        let key = compile_key(backend.as_ref(), problem, candidate);
        if let Some(mut a) = self.store.get_artifact(&key)? {
            a.info.cached = true;
            return Ok(Ok(a));
        }
        let be = backend.clone();
        let (p, c) = (problem.clone(), candidate.clone());
        let outcome = tokio::task::spawn_blocking(move || be.compile(&p, &c))
            .await
            .map_err(|e| JobFailure::Infra(format!("compile task: {e}")))??;
        match (outcome.artifact, outcome.failure) {
            (Some(bytes), None) => {
                let art = Artifact {
                    bytes,
                    info: outcome.info,
                };
                self.store.put_artifact(&key, backend.name(), &art)?;
                Ok(Ok(art))
            }
            (_, Some(mut failure)) => {
                failure.compile = Some(outcome.info);
                Ok(Err(failure))
            }
            (None, None) => Err(JobFailure::Infra(
                "compile returned neither an artifact nor a verdict".into(),
            )),
        }
    }
}
