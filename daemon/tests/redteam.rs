//! The red-team suite: each hostile candidate of `sandbox/tests/redteam/cases.toml` is
//! submitted through a real kilnd; the test asserts its specific verdict and evidence,
//! that the daemon still serves afterwards, that no process of the job is left, and that
//! nothing was written outside the job's scratch. `cargo test redteam_` runs exactly these.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Daemon, register};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, Deserialize)]
struct Suite {
    problem: String,
    #[serde(rename = "case")]
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    file: String,
    kernel: String,
    args: Vec<Value>,
    verdict: String,
    evidence: String,
    #[serde(default)]
    flags: Vec<String>,
    #[serde(default)]
    must_not_exist: Vec<String>,
    #[serde(default)]
    memory_limit_mib: Option<u64>,
    #[serde(default)]
    placeholder: Option<String>,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn suite() -> Suite {
    let dir = repo().join("sandbox/tests/redteam");
    let text = std::fs::read_to_string(dir.join("cases.toml")).expect("cases.toml");
    toml::from_str(&text).expect("cases.toml parses")
}

/// Pids of every process descending from `root`.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent = std::collections::HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // The command name may hold spaces: the fields after the last ')' are fixed.
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                continue;
            };
            if let Some(ppid) = rest
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse::<u32>().ok())
            {
                parent.insert(pid, ppid);
            }
        }
    }
    parent
        .keys()
        .copied()
        .filter(|&p| {
            let mut cur = p;
            for _ in 0..64 {
                match parent.get(&cur) {
                    Some(&pp) if pp == root => return true,
                    Some(&pp) if pp > 1 => cur = pp,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

async fn run_case(name: &str) {
    let suite = suite();
    let case = suite
        .cases
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name} in cases.toml"));
    let mem = case.memory_limit_mib.unwrap_or(512);
    let d = Daemon::start_with_config(&format!(
        "[evaluation]\ntrials = 2\nrun_timeout_ms = 5000\ncompile_timeout_secs = 3\nmemory_limit_mb = {mem}\n\
         [evaluation.timing]\nwarmup = 1\nmin_samples = 5\nmin_time_ms = 5.0\nmax_rse = 0.05\nmax_samples = 100\nwall_cap_ms = 300.0\nrecheck_fraction = 0.2\n"
    ));
    let c = d.client();
    register(&c, &repo().join("problems").join(&suite.problem)).await;
    let mut source = std::fs::read_to_string(repo().join("sandbox/tests/redteam").join(&case.file))
        .expect("case source");
    if let Some(ph) = &case.placeholder {
        source = source.replace(ph, &d.state.join("kiln.db").display().to_string());
    }
    let candidate = json!({
        "problem": suite.problem,
        "language": "c",
        "source": source,
        "launches": [{"kernel": case.kernel, "args": case.args}],
        "flags": case.flags,
        "note": format!("red team: {}", case.name),
    });
    let (_, sub) = c.post("/v1/candidates", &candidate).await.expect("submit");
    let id = sub["id"].as_str().expect("id").to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    let record = loop {
        let r = c
            .get(&format!("/v1/candidates/{id}?wait=10"))
            .await
            .expect("candidate");
        if !r["evaluation"].is_null() || r["job"]["state"] == "failed" || Instant::now() > deadline
        {
            break r;
        }
    };
    let eval = &record["evaluation"];
    assert!(
        !eval.is_null(),
        "{name}: no evaluation: {record}\nlog:\n{}",
        d.log()
    );
    assert_eq!(eval["verdict"], case.verdict.as_str(), "{name}: {eval}");
    let text = eval.to_string();
    assert!(
        text.contains(&case.evidence),
        "{name}: evidence {:?} not in {text}",
        case.evidence
    );
    // The daemon still serves.
    assert_eq!(
        c.get("/v1/health").await.expect("health")["status"],
        "ok",
        "{name}"
    );
    // No process of the job is left behind.
    let pid = d.pid().expect("daemon pid");
    let wait_until = Instant::now() + Duration::from_secs(10);
    let mut left = descendants(pid);
    while !left.is_empty() && Instant::now() < wait_until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = descendants(pid);
    }
    assert!(left.is_empty(), "{name}: processes left behind: {left:?}");
    // Nothing written outside scratch: the paths the case aimed at do not exist, and
    // the job's scratch folders are gone.
    for p in &case.must_not_exist {
        assert!(!Path::new(p).exists(), "{name}: {p} was created");
    }
    let scratch = d.state.join("scratch");
    let leftovers: Vec<_> = std::fs::read_dir(&scratch)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        leftovers.is_empty(),
        "{name}: scratch not cleaned: {leftovers:?}"
    );
}

macro_rules! redteam {
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                run_case(stringify!($name).trim_start_matches("redteam_")).await;
            }
        )*

        #[test]
        fn redteam_every_case_has_a_test() {
            let named: Vec<&str> = vec![$(stringify!($name).trim_start_matches("redteam_")),*];
            for c in suite().cases {
                assert!(named.contains(&c.name.as_str()), "case {} has no redteam_ test", c.name);
            }
        }
    };
}

redteam!(
    redteam_infinite_loop,
    redteam_fork_bomb,
    redteam_thread_spawn,
    redteam_memory_hog,
    redteam_output_flood,
    redteam_write_outside_scratch,
    redteam_network_socket,
    redteam_read_hidden_path,
    redteam_kill_parent,
    redteam_ptrace_parent,
    redteam_exec_shell,
    redteam_partial_output,
    redteam_stale_cache,
    redteam_modify_inputs,
    redteam_nondeterministic,
    redteam_stack_overflow,
    redteam_abort_call,
    redteam_segfault,
    redteam_write_past_buffer,
    redteam_exit_early,
    redteam_fake_done_early,
    redteam_constructor_writes_file,
    redteam_override_sigsys,
    redteam_unknown_function,
    redteam_unknown_buffer,
    redteam_disallowed_flag,
    redteam_include_dev_zero,
    redteam_macro_bomb,
    redteam_compile_timeout,
);
