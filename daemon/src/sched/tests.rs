//! The scheduler over a fake backend with N lanes (no jail, no GPU): jobs reach every
//! free lane, a lane never runs two evaluations at once, a search's candidates spread
//! over all lanes, a pinned job runs on its lane, and baselines are measured on a lane of
//! the GPU model asked for and cached under that model; a lifted evaluation queues its
//! lifted candidate, marked `lifted_from` and judged `lifted`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kiln_types::{BackendKind, Candidate, JobOptions};

use super::Scheduler;
use super::baseline::BaselineError;
use crate::backends::Backend;
use crate::backends::fake::{FakeLanes, PATIENCE};
use crate::config::Config;
use crate::events::{Event, EventBus};
use crate::gpu::fake_inventory;
use crate::store::{GpuKey, LaneClass, Store, open_temp, sample_search, sample_spec};

fn candidate(note: &str) -> Candidate {
    serde_json::from_value(serde_json::json!({
        "problem": "p", "language": "c",
        "source": format!("void k(const float*x,float*y){{ /* {note} */ }}"),
        "launches": [{"kernel": "k", "args": ["x", "y"]}],
        "note": note,
    }))
    .expect("candidate")
}

/// A scheduler over `backend` on a fresh store with problem `p` (host and cuda
/// references), running in the background.
async fn start(
    backend: Arc<FakeLanes>,
) -> (tempfile::TempDir, Arc<Store>, Arc<Scheduler>, EventBus) {
    let (dir, store) = open_temp();
    let mut spec = sample_spec("p");
    spec.reference.cuda = spec.reference.host.clone();
    store.put_problem(&spec).await.expect("problem");
    let store = Arc::new(store);
    let events = EventBus::new(1024);
    let mut config = Config::default();
    config.queue.compile_workers = 4;
    config.gpu.python = String::new();
    let classes = vec![LaneClass {
        backend: backend.name().into(),
        class: format!("{}/test", backend.name()),
        lanes: u32::try_from(backend.lanes()).unwrap_or(u32::MAX),
    }];
    let sched = Scheduler::new(
        store.clone(),
        events.clone(),
        vec![backend],
        classes,
        config,
    );
    tokio::spawn(sched.clone().run(Duration::from_secs(1)));
    (dir, store, sched, events)
}

/// Waits until `n` jobs have ended (done or failed); their final states by job id.
async fn ended(
    rx: &mut tokio::sync::broadcast::Receiver<Event>,
    n: usize,
) -> BTreeMap<i64, (String, Option<String>)> {
    let mut out = BTreeMap::new();
    let wait = async {
        while out.len() < n {
            match rx.recv().await {
                Ok(Event::Job {
                    job_id,
                    state,
                    error,
                    ..
                }) if state == "done" || state == "failed" => {
                    out.insert(job_id, (state, error));
                }
                Ok(_) => {}
                Err(e) => panic!("event bus: {e}"),
            }
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .expect("the jobs did not end");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_lane_is_used_and_none_runs_two_evaluations_at_once() {
    let fake = FakeLanes::new(BackendKind::Host, 4);
    let (_d, store, sched, events) = start(fake.clone()).await;
    let mut rx = events.subscribe();
    for i in 0..16 {
        store
            .submit(&candidate(&format!("c{i}")), None)
            .await
            .expect("submit");
    }
    sched.wake();
    let states = ended(&mut rx, 16).await;
    assert!(states.values().all(|(s, _)| s == "done"), "{states:?}");
    let seen = fake.seen();
    assert_eq!(
        seen.most_busy, 4,
        "all four lanes evaluated at the same moment"
    );
    assert_eq!(seen.overlaps, 0, "a lane ran two evaluations at once");
    let mut per_lane = [0usize; 4];
    for (_, lane) in &seen.evaluated {
        per_lane[*lane] += 1;
    }
    assert!(per_lane.iter().all(|n| *n > 0), "{per_lane:?}");
    assert_eq!(per_lane.iter().sum::<usize>(), 16);
    sched.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_searchs_candidates_spread_over_all_lanes() {
    let fake = FakeLanes::new(BackendKind::Host, 3);
    let (_d, store, sched, events) = start(fake.clone()).await;
    let search = sample_search(&store, "p").await;
    let mut rx = events.subscribe();
    // A search keeps its queue filled: a round of candidates at once.
    for i in 0..9 {
        store
            .submit(&candidate(&format!("s{i}")), Some(&search))
            .await
            .expect("submit");
    }
    sched.wake();
    ended(&mut rx, 9).await;
    let seen = fake.seen();
    let mut lanes: Vec<usize> = seen
        .evaluated
        .iter()
        .filter(|(note, _)| note.starts_with('s'))
        .map(|(_, l)| *l)
        .collect();
    lanes.sort_unstable();
    lanes.dedup();
    assert_eq!(
        lanes,
        [0, 1, 2],
        "the search's candidates ran on every lane"
    );
    assert_eq!(seen.overlaps, 0);
    sched.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pinned_job_runs_on_its_lane_and_a_missing_lane_fails_clearly() {
    let fake = FakeLanes::new(BackendKind::Host, 2);
    let (_d, store, sched, events) = start(fake.clone()).await;
    let mut rx = events.subscribe();
    // Fill both lanes first (the first wave waits for both), then the pinned ones.
    for i in 0..2 {
        store
            .submit(&candidate(&format!("w{i}")), None)
            .await
            .expect("submit");
    }
    let pinned = |lane: u32| JobOptions {
        lane: Some(lane),
        ..JobOptions::default()
    };
    for i in 0..4 {
        store
            .submit_with(&candidate(&format!("p{i}")), None, Some(&pinned(1)), "")
            .await
            .expect("submit");
    }
    let missing = store
        .submit_with(&candidate("nowhere"), None, Some(&pinned(5)), "")
        .await
        .expect("submit");
    sched.wake();
    let states = ended(&mut rx, 7).await;
    let (state, error) = &states[&missing.job_id];
    assert_eq!(state, "failed");
    let error = error.clone().unwrap_or_default();
    assert!(
        error.contains("lane 5") && error.contains("2 lane(s)"),
        "{error}"
    );
    let seen = fake.seen();
    let on: Vec<usize> = seen
        .evaluated
        .iter()
        .filter(|(note, _)| note.starts_with('p'))
        .map(|(_, l)| *l)
        .collect();
    assert_eq!(on, [1, 1, 1, 1]);
    assert_eq!(seen.overlaps, 0);
    sched.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baselines_are_measured_and_cached_per_lane_gpu_model() {
    // Lane i runs on GPU-fake-i: an H100, then two H200s.
    let fake = FakeLanes::new(BackendKind::Cuda, 3);
    let (_d, store, sched, _events) = start(fake.clone()).await;
    let inv = fake_inventory(&["NVIDIA H100", "NVIDIA H200", "NVIDIA H200"]);
    let key = |model: &str| GpuKey {
        model: model.into(),
        driver: "580.159.04".into(),
    };

    // Asked for GPU 2 (an H200): measured on an H200 lane, stored under the H200.
    let set = sched
        .baselines("p", &inv, false, Some("2"))
        .await
        .expect("h200 baselines");
    assert_eq!(set.gpu_model, "NVIDIA H200");
    let on = fake.seen().baselines_on.clone();
    assert!(matches!(on.as_slice(), [1] | [2]), "measured on {on:?}");
    assert!(
        store
            .get_baselines(&key("NVIDIA H200"), "p")
            .await
            .expect("get")
            .is_some()
    );
    assert!(
        store
            .get_baselines(&key("NVIDIA H100"), "p")
            .await
            .expect("get")
            .is_none()
    );

    // The other H200, by UUID: the cached set, nothing measured.
    let again = sched
        .baselines("p", &inv, false, Some("GPU-fake-1"))
        .await
        .expect("cached");
    assert_eq!(again, set);
    assert_eq!(fake.seen().baselines_on.len(), 1);

    // No GPU named: lane 0's GPU, the H100, measured on lane 0 alone.
    let h100 = sched.baselines("p", &inv, false, None).await.expect("h100");
    assert_eq!(h100.gpu_model, "NVIDIA H100");
    assert_eq!(fake.seen().baselines_on[1], 0);
    assert_eq!(h100.results[0].median_us(), Some(100.0));

    // A GPU this host does not have: not found, and nothing measured.
    let err = sched
        .baselines("p", &inv, true, Some("7"))
        .await
        .expect_err("no GPU 7");
    assert!(
        matches!(&err, BaselineError::NotFound(m) if m.contains("GPU-fake-2")),
        "{err}"
    );
    assert_eq!(fake.seen().baselines_on.len(), 2);
    sched.stop();
}

/// A problem whose reference is a PyTorch module gets its hosted baselines too, measured
/// on the same held lane by evaluating the module as a hosted file (so a hosted
/// candidate's speedup is against a time taken the same way); a cached set from before
/// them is measured again once; speedups say which harness each baseline is of.
#[tokio::test]
async fn a_torch_problem_gets_hosted_baselines_of_its_own_module() {
    let fake = FakeLanes::new(BackendKind::Cuda, 1);
    let (_d, store, sched, _events) = start(fake.clone()).await;
    let mut spec = sample_spec("kb");
    spec.reference.cuda = None;
    spec.reference.torch = Some(kiln_types::problem::TorchReference {
        file: "reference.py".into(),
        source: "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n".into(),
        init_inputs: "[]".into(),
        forward: vec!["x".into()],
        constants: BTreeMap::new(),
        state: BTreeMap::new(),
        outputs: vec!["y".into()],
        bool_tensors: Vec::new(),
        precision: Default::default(),
    });
    spec.baseline
        .insert("torch".into(), kiln_types::BaselineOp::Module {});
    store.put_problem(&spec).await.expect("problem");
    let inv = fake_inventory(&["NVIDIA H200"]);
    let key = GpuKey {
        model: "NVIDIA H200".into(),
        driver: "580.159.04".into(),
    };
    // A set cached before hosted baselines existed: measured again, not served.
    store
        .put_baselines(&key, "kb", &[crate::store::measured_reference(100.0)])
        .await
        .expect("old set");
    let set = sched
        .baselines("kb", &inv, false, None)
        .await
        .expect("baselines");
    use kiln_types::baseline::Harness;
    let hosted: Vec<_> = set
        .results
        .iter()
        .filter(|r| r.harness == Harness::Hosted)
        .collect();
    let names: Vec<&str> = hosted.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["torch-eager-hosted", "torch-compile-hosted"],
        "{set:?}"
    );
    // Each is the fake's time of a hosted evaluation of a ModelNew file made of the
    // module, run on the lane the baselines held.
    assert!(
        hosted.iter().all(|r| r.median_us() == Some(10.0)),
        "{hosted:?}"
    );
    let (files, recorded): (Vec<String>, Vec<bool>) = {
        let seen = fake.seen();
        (
            seen.evaluated
                .iter()
                .map(|(note, _)| note.clone())
                .collect(),
            seen.recorded.iter().map(|(_, rec)| *rec).collect(),
        )
    };
    assert_eq!(
        files,
        [
            "kiln's torch-eager-hosted baseline",
            "kiln's torch-compile-hosted baseline"
        ]
    );
    assert!(recorded.iter().all(|rec| !rec), "baselines are not lifted");
    let file = super::hosted_baseline::candidate(
        &spec,
        kiln_types::baseline::BaselineKind::TorchCompileHosted,
    )
    .expect("a file");
    assert_eq!(file.language, kiln_types::Language::ModelNew);
    assert!(file.source.starts_with("import torch\nclass Model"));
    assert!(file.source.contains("class ModelNew(Model)"));
    assert!(file.source.contains("_kiln_torch.compile("));
    // Now cached with its hosted figures: served without measuring.
    let again = sched
        .baselines("kb", &inv, false, None)
        .await
        .expect("cached");
    assert_eq!(again, set);
    assert_eq!(fake.seen().baselines_on.len(), 1);
    // A hosted candidate at 5 us: 2x the hosted eager, same harness; the reference (in
    // process) is another harness.
    let speedups = set.speedups(5.0, Harness::Hosted);
    let by = |n: &str| speedups.iter().find(|s| s.baseline == n).expect(n);
    assert_eq!(by("torch-eager-hosted").speedup, 2.0);
    assert!(by("torch-eager-hosted").same_harness);
    assert!(!by("reference").same_harness);
    let contract = set.speedups(5.0, Harness::InProcess);
    assert!(
        contract
            .iter()
            .find(|s| s.baseline == "reference")
            .expect("ref")
            .same_harness
    );
    sched.stop();
}

/// Most compiles in flight while 30 candidates go through one lane whose compiles take
/// `compile_ms` and evaluations `eval_ms` (four compile slots), once the scheduler has
/// timed a compile and an evaluation. (Before an evaluation has been timed, the backend
/// compiles as far ahead as the slots allow, by design: the warm-up job is not counted.)
async fn most_compiling(compile_ms: u64, eval_ms: u64) -> usize {
    let fake = FakeLanes::with_delays(
        BackendKind::Host,
        1,
        Duration::from_millis(compile_ms),
        Duration::from_millis(eval_ms),
    );
    let (_d, store, sched, events) = start(fake.clone()).await;
    let mut rx = events.subscribe();
    store
        .submit(&candidate(&format!("d{compile_ms}-warm-up")), None)
        .await
        .expect("submit");
    sched.wake();
    ended(&mut rx, 1).await;
    fake.seen().most_compiling = 0;
    for i in 0..30 {
        store
            .submit(&candidate(&format!("d{compile_ms}-{i}")), None)
            .await
            .expect("submit");
    }
    sched.wake();
    let states = ended(&mut rx, 30).await;
    assert!(states.values().all(|(s, _)| s == "done"), "{states:?}");
    sched.stop();
    let seen = fake.seen();
    assert_eq!(seen.overlaps, 0, "a lane ran two evaluations at once");
    seen.most_compiling
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_compiles_get_more_jobs_compiling_ahead_within_the_compile_slots() {
    // Compiles 20 times longer than evaluations: every compile slot works for the one
    // lane (with a fixed two jobs ahead, at most three jobs are held, so three compiles).
    let slow = most_compiling(100, 5).await;
    // Compiles much shorter than evaluations: the floor of two ahead is plenty.
    let fast = most_compiling(2, 40).await;
    assert_eq!(
        slow, 4,
        "all four compile slots, and no more, for slow compiles"
    );
    assert!(
        fast <= 3,
        "fast compiles stay at the floor (3 held): {fast}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lifted_evaluation_queues_its_contract_candidate_marked_lifted() {
    let fake = FakeLanes::new(BackendKind::Host, 2);
    let (_d, store, sched, events) = start(fake.clone()).await;
    let mut rx = events.subscribe();
    let file = store
        .submit(&candidate("lift-me"), None)
        .await
        .expect("submit");
    let hosted_only = JobOptions {
        lift: Some(false),
        ..Default::default()
    };
    store
        .submit_with(&candidate("plain"), None, Some(&hosted_only), "")
        .await
        .expect("submit");
    sched.wake();
    // The file, the other candidate, and the lifted candidate kilnd queued.
    let states = ended(&mut rx, 3).await;
    assert!(states.values().all(|(s, _)| s == "done"), "{states:?}");
    let file_rec = store
        .get_candidate(&file.id)
        .await
        .expect("store")
        .expect("the file");
    let Some(kiln_types::lift::LiftOutcome::Lifted { candidate_id, .. }) =
        file_rec.evaluation.as_ref().and_then(|e| e.lift.clone())
    else {
        panic!("the file's evaluation names its lifted candidate");
    };
    assert_eq!(file_rec.trust(), kiln_types::TrustMode::Contract);
    let lifted = store
        .get_candidate(&candidate_id)
        .await
        .expect("store")
        .expect("kilnd queued the lifted candidate");
    assert_eq!(lifted.candidate.note.as_deref(), Some("lifted"));
    let job = lifted.job.as_ref().expect("its job");
    assert_eq!(
        job.options.as_ref().and_then(|o| o.lifted_from.as_deref()),
        Some(file.id.as_str()),
        "the lifted job says which file it came from"
    );
    assert_eq!(
        lifted.evaluation.as_ref().map(|e| e.trust),
        Some(kiln_types::TrustMode::Lifted)
    );
    assert_eq!(lifted.trust(), kiln_types::TrustMode::Lifted);
    // Lifting is asked for by default and not when a job says `lift: false`; the lifted
    // candidate's own evaluation queues nothing more (its note is not `lift-me`).
    let seen = fake.seen();
    let asked: BTreeMap<&str, bool> = seen
        .recorded
        .iter()
        .map(|(n, r)| (n.as_str(), *r))
        .collect();
    assert_eq!(asked.get("lift-me"), Some(&true));
    assert_eq!(asked.get("plain"), Some(&false));
    assert_eq!(seen.recorded.len(), 3);
    drop(seen);
    sched.stop();
}
