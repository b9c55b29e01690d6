//! One job's path: compile (cached) → `compiled`, waiting for a lane (any free one, or
//! the one the job is pinned to) → `running` on the lane (the attempt counted) → job
//! options → evaluate → store → event.

use std::sync::Arc;
use std::time::Instant;

use kiln_types::{Candidate, EvalPlan, Evaluation, ProblemSpec};
use rand::RngCore;
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use super::{Lanes, Scheduler};
use crate::backends::{Backend, BackendError, compile_key};
use crate::events::Event;
use crate::store::{Artifact, JobRecord, JobState, StoreError};

/// Why a job could not produce an evaluation.
pub(super) enum JobFailure {
    /// The backend or the store broke; the message is stored on the job.
    Infra(String),
    /// The database could not be reached for longer than the scheduler waits: the job is
    /// not failed (that is no fault of its own) but given back to the queue, or left to
    /// its lease when even that cannot be written.
    Unavailable(String),
}

impl From<BackendError> for JobFailure {
    fn from(e: BackendError) -> Self {
        JobFailure::Infra(format!("backend: {e}"))
    }
}

impl From<crate::store::StoreError> for JobFailure {
    fn from(e: crate::store::StoreError) -> Self {
        match e {
            StoreError::Unavailable(why) => JobFailure::Unavailable(why),
            e => JobFailure::Infra(format!("store: {e}")),
        }
    }
}

impl From<JobFailure> for Outcome {
    fn from(f: JobFailure) -> Self {
        match f {
            JobFailure::Infra(msg) => Outcome::Failed(msg),
            JobFailure::Unavailable(why) => Outcome::Unreachable(why),
        }
    }
}

/// What the compile stage left for the lane.
enum Compiled {
    /// The job ends without a lane (the candidate does not compile, or the problem has no
    /// reference for the backend): its evaluation and the compile time.
    Early(Box<Evaluation>, f64),
    /// Both artifacts, ready for a lane.
    Ready(Box<Ready>),
}

/// A compiled job waiting for its lane.
struct Ready {
    problem: ProblemSpec,
    candidate: Candidate,
    backend: Arc<dyn Backend>,
    /// The compiled reference (empty for a torch reference: the backend runs it).
    reference: Vec<u8>,
    artifact: Artifact,
    compile_ms: f64,
}

/// How a job's run ended.
enum Outcome {
    /// An evaluation to store: with the compile and evaluation times.
    Evaluated(Box<Evaluation>, f64, f64),
    /// kiln could not evaluate it.
    Failed(String),
    /// The database was out of reach: the job goes back to the queue, uncounted.
    Unreachable(String),
    /// Stopped before its evaluation started (kilnd is stopping): queued again.
    Requeued,
    /// Another party moved the job on (requeued or finished it): nothing to record.
    Gone,
}

impl Scheduler {
    fn publish_job(
        &self,
        job: &JobRecord,
        problem: &str,
        state: JobState,
        lane: Option<u32>,
        eval: Option<&Evaluation>,
        error: Option<&str>,
    ) {
        self.events.publish(Event::Job {
            job_id: job.id,
            candidate_id: job.candidate_id.clone(),
            problem: problem.to_string(),
            state: state.as_str().to_string(),
            lane,
            node: Some(self.store.node().to_string()),
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
        let problem_name = match self
            .persist(|| self.store.get_candidate(&job.candidate_id))
            .await
        {
            Ok(Some(rec)) => rec.candidate.problem.clone(),
            _ => String::new(),
        };
        self.publish_job(&job, &problem_name, JobState::Compiling, None, None, None);
        let (outcome, lane) = self
            .clone()
            .pipeline(&job, &problem_name, compile_permit)
            .await;
        let (id, token) = (job.id, job.lease_token);
        match outcome {
            Outcome::Evaluated(eval, compile_ms, eval_ms) => {
                tracing::info!(verdict = %eval.verdict, message = %eval.message, "job done");
                // The lifted candidate is queued before the file's result is stored, so a
                // client that sees the file done finds its lifted candidate already there.
                self.queue_lifted(&job, &eval).await;
                let stored = self
                    .persist(|| self.store.finish_job(id, token, &eval, compile_ms, eval_ms))
                    .await;
                match stored {
                    Ok(()) => {
                        self.publish_job(
                            &job,
                            &problem_name,
                            JobState::Done,
                            lane,
                            Some(&eval),
                            None,
                        );
                    }
                    Err(StoreError::Fenced(why)) => self.fenced_out(&why),
                    Err(StoreError::Unavailable(why)) => {
                        self.give_back(&job, &problem_name, &why).await;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot store the evaluation");
                        let msg = format!("cannot store the evaluation: {e}");
                        if let Err(StoreError::Fenced(why)) =
                            self.persist(|| self.store.fail_job(id, token, &msg)).await
                        {
                            return self.fenced_out(&why);
                        }
                        self.publish_job(
                            &job,
                            &problem_name,
                            JobState::Failed,
                            lane,
                            None,
                            Some(&msg),
                        );
                    }
                }
            }
            Outcome::Failed(msg) => {
                tracing::error!(error = %msg, "job failed");
                match self.persist(|| self.store.fail_job(id, token, &msg)).await {
                    Ok(()) => self.publish_job(
                        &job,
                        &problem_name,
                        JobState::Failed,
                        lane,
                        None,
                        Some(&msg),
                    ),
                    Err(StoreError::Fenced(why)) => self.fenced_out(&why),
                    Err(e) => tracing::error!(error = %e, "cannot mark the job failed"),
                }
            }
            Outcome::Unreachable(why) => self.give_back(&job, &problem_name, &why).await,
            Outcome::Requeued => {
                tracing::info!("kilnd is stopping: the job goes back to the queue");
                if let Err(e) = self.store.requeue_job(id, token).await {
                    tracing::error!(error = %e, "cannot requeue the job (its lease will run out)");
                }
                self.publish_job(&job, &problem_name, JobState::Queued, None, None, None);
            }
            Outcome::Gone => self.fenced_out("the job was no longer waiting for this claim's lane"),
        }
    }

    /// The database stayed out of reach: the job is queued again uncounted (its evaluation,
    /// if it had one, is dropped), or, when even that cannot be written, left to its
    /// lease, which the reaper releases; never failed for it.
    async fn give_back(&self, job: &JobRecord, problem: &str, why: &str) {
        crate::metrics::count_store_unavailable();
        tracing::warn!(reason = %why, "the database is out of reach: the job goes back to the queue");
        match self
            .persist(|| self.store.requeue_job(job.id, job.lease_token))
            .await
        {
            Ok(()) => self.publish_job(job, problem, JobState::Queued, None, None, None),
            Err(StoreError::Fenced(why)) => self.fenced_out(&why),
            Err(e) => tracing::warn!(
                error = %e,
                "cannot queue the job again either; its lease runs out and another node (or this one) takes it"
            ),
        }
    }

    /// A write refused because the job's lease is no longer this claim's (another node
    /// took it over after the lease ran out): nothing is recorded.
    fn fenced_out(&self, why: &str) {
        crate::metrics::count_fenced();
        tracing::warn!(reason = %why, "fenced_out: this node lost the job's lease; its result is dropped");
    }

    /// Runs a store call again while the database is unavailable (a restart, a
    /// failover), for up to `write_patience`; any other outcome is returned as it is.
    /// Reads are safe to repeat; every write of a job is fenced by its lease token and
    /// finishing one again after a lost answer is recognised (the store answers `Ok`).
    async fn persist<T, F, Fut>(&self, write: F) -> Result<T, StoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let deadline = Instant::now() + self.write_patience;
        let mut pause = std::time::Duration::from_millis(100);
        loop {
            match write().await {
                Err(StoreError::Unavailable(why)) if Instant::now() < deadline => {
                    tracing::warn!(reason = %why, "the database is unavailable; retrying the write");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }

    /// Compile, wait for a lane, evaluate. Stopping kilnd interrupts the first two (the
    /// job goes back to the queue uncounted), never an evaluation that started. Returns
    /// the lane too, once the evaluation started on one.
    async fn pipeline(
        self: Arc<Self>,
        job: &JobRecord,
        problem_name: &str,
        compile_permit: OwnedSemaphorePermit,
    ) -> (Outcome, Option<u32>) {
        let compiled = tokio::select! {
            c = self.compile_stage(job, compile_permit) => c,
            _ = self.shutdown.cancelled() => return (Outcome::Requeued, None),
        };
        let ready = match compiled {
            Ok(Compiled::Early(eval, compile_ms)) => {
                return (Outcome::Evaluated(eval, compile_ms, 0.0), None);
            }
            Ok(Compiled::Ready(ready)) => {
                if let Some(a) = self.ahead.get(ready.backend.name()) {
                    a.observe_compile(ready.compile_ms);
                }
                ready
            }
            Err(e) => return (e.into(), None),
        };
        if let Err(e) = self
            .persist(|| self.store.mark_compiled(job.id, job.lease_token))
            .await
        {
            return (JobFailure::from(e).into(), None);
        }
        self.publish_job(job, problem_name, JobState::Compiled, None, None, None);
        let Some(slots) = self.lane_slots.get(ready.backend.name()).cloned() else {
            return (Outcome::Failed("no lane for backend".into()), None);
        };
        let pinned = job.options.as_ref().and_then(|o| o.lane);
        let lanes = match pinned {
            Some(l) => Lanes::Only(vec![l as usize]),
            None => Lanes::Any,
        };
        let lane = tokio::select! {
            l = slots.acquire(lanes) => l,
            _ = self.shutdown.cancelled() => return (Outcome::Requeued, None),
        };
        let Some(lane) = lane else {
            let why = match pinned {
                Some(l) => format!(
                    "the job asks for lane {l} but the {} backend has {} lane(s) here",
                    ready.backend.name(),
                    slots.count()
                ),
                None => "lane closed".into(),
            };
            return (Outcome::Failed(why), None);
        };
        let index = u32::try_from(lane.index).unwrap_or(u32::MAX);
        match self
            .persist(|| self.store.start_evaluation(job.id, job.lease_token, index))
            .await
        {
            Ok(true) => {}
            Ok(false) => return (Outcome::Gone, None),
            Err(e) => return (JobFailure::from(e).into(), None),
        }
        self.publish_job(
            job,
            problem_name,
            JobState::Running,
            Some(index),
            None,
            None,
        );
        let ahead = self.ahead.get(ready.backend.name()).cloned();
        let outcome = match self.evaluate(job, *ready, lane.index).await {
            Ok((eval, compile_ms, eval_ms)) => {
                if let Some(a) = ahead {
                    a.observe_evaluation(eval_ms);
                }
                Outcome::Evaluated(Box::new(eval), compile_ms, eval_ms)
            }
            Err(e) => e.into(),
        };
        drop(lane);
        (outcome, Some(index))
    }

    /// Compiles the problem's reference (cached after its first use) and the candidate.
    async fn compile_stage(
        &self,
        job: &JobRecord,
        compile_permit: OwnedSemaphorePermit,
    ) -> Result<Compiled, JobFailure> {
        let rec = self
            .persist(|| self.store.get_candidate(&job.candidate_id))
            .await?
            .ok_or_else(|| JobFailure::Infra("candidate vanished from the store".into()))?;
        let problem = self
            .persist(|| self.store.get_problem(&rec.candidate.problem))
            .await?
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

        let t0 = Instant::now();
        if !problem.evaluable_on(backend.kind()) {
            let eval = Evaluation::early(
                kiln_types::Verdict::InvalidLaunch,
                backend.kind(),
                format!(
                    "problem {:?} has no reference for the {} backend",
                    problem.name,
                    backend.name()
                ),
            );
            return Ok(Compiled::Early(Box::new(eval), 0.0));
        }
        // A torch reference (no kernel for this backend) is run by the backend's reference
        // runner: nothing to compile, an empty artifact.
        let reference = match problem.reference_candidate(backend.kind()) {
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
        match artifact {
            Ok(artifact) => Ok(Compiled::Ready(Box::new(Ready {
                problem,
                candidate: rec.candidate,
                backend,
                reference,
                artifact,
                compile_ms,
            }))),
            Err(mut failure) => {
                failure
                    .compile
                    .get_or_insert_with(Default::default)
                    .duration_ms = compile_ms;
                Ok(Compiled::Early(Box::new(failure), compile_ms))
            }
        }
    }

    /// Evaluates a compiled job on the lane it holds.
    async fn evaluate(
        &self,
        job: &JobRecord,
        ready: Ready,
        lane_index: usize,
    ) -> Result<(Evaluation, f64, f64), JobFailure> {
        let Ready {
            problem,
            candidate,
            backend,
            reference,
            artifact,
            compile_ms,
        } = ready;
        let base = self.plan_for(backend.as_ref());
        let plan = self
            .persist(|| {
                super::job_options::apply_job_options(
                    &self.store,
                    &self.config,
                    job,
                    &problem.name,
                    base.clone(),
                )
            })
            .await?;
        let t1 = Instant::now();
        let be = backend.clone();
        let hosted = candidate.language.is_hosted();
        let language = candidate.language;
        let mut eval = tokio::task::spawn_blocking(move || {
            be.evaluate(
                lane_index,
                &problem,
                &reference,
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
            if let Some(reported) = e.compile.take() {
                if info.kernels.is_empty() {
                    info.kernels = reported.kernels;
                }
                // A hosted file's compile is its compile step (the load_inline libraries
                // built ahead, when it has any and they were not cached) and its runner's
                // import at evaluation (torch, Triton's builds, anything built late).
                if hosted && reported.duration_ms > 0.0 {
                    let ahead = if info.cached { 0.0 } else { info.duration_ms };
                    info.duration_ms = ahead + reported.duration_ms;
                    info.log = if info.log.is_empty() {
                        reported.log
                    } else {
                        format!(
                            "{}\n{} ({:.0} ms)",
                            info.log, reported.log, reported.duration_ms
                        )
                    };
                }
            }
            e.compile = Some(info);
            e
        })?;
        let eval_ms = t1.elapsed().as_secs_f64() * 1e3;
        crate::metrics::add_lane_busy(backend.name(), lane_index, eval_ms / 1e3);
        // A candidate kilnd lifted from a `ModelNew` file: kiln launched it (contract),
        // and it says where it came from.
        let trust = kiln_types::TrustMode::of(language, job.options.as_ref());
        if trust == kiln_types::TrustMode::Lifted {
            eval.trust = trust;
        }
        if let Some(c) = eval.compile.as_mut() {
            c.duration_ms = if c.cached {
                c.duration_ms
            } else {
                compile_ms.max(c.duration_ms)
            };
        }
        Ok((eval, compile_ms, eval_ms))
    }

    /// After a hosted file's evaluation that lifted its forward: queues the lifted
    /// contract candidate (no search; the file's GPU class and lane), marked
    /// `lifted_from` the file. A lifted candidate already stored queues nothing. Failing
    /// to queue it leaves the file's hosted result as it is (logged).
    async fn queue_lifted(&self, job: &JobRecord, eval: &Evaluation) {
        let Some(kiln_types::lift::LiftOutcome::Lifted {
            candidate,
            candidate_id,
            ..
        }) = &eval.lift
        else {
            return;
        };
        if let Err(e) = candidate.validate() {
            tracing::warn!(error = %e, "the lifted candidate is not valid: not queued");
            return;
        }
        if candidate.content_hash() != *candidate_id {
            tracing::warn!("the lifted candidate's id does not match its content: not queued");
            return;
        }
        let options = kiln_types::JobOptions {
            lifted_from: Some(job.candidate_id.clone()),
            lane: job.options.as_ref().and_then(|o| o.lane),
            ..Default::default()
        };
        match self
            .persist(|| {
                self.store
                    .submit_with(candidate, None, Some(&options), &job.gpu_class)
            })
            .await
        {
            Ok(s) => {
                tracing::info!(lifted = %s.id, duplicate = s.duplicate, "lifted candidate queued");
                if !s.duplicate {
                    self.events.publish(Event::Job {
                        job_id: s.job_id,
                        candidate_id: s.id.clone(),
                        problem: candidate.problem.clone(),
                        state: JobState::Queued.as_str().to_string(),
                        lane: None,
                        node: None,
                        verdict: None,
                        median_us: None,
                        error: None,
                    });
                    self.wake();
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot queue the lifted candidate"),
        }
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
            record_launches: false,
        }
    }

    /// The artifact for `candidate`, from the cache or a fresh compile. The inner `Err`
    /// is the candidate's `compile_error` evaluation.
    pub(super) async fn compile_cached(
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
