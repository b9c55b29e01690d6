//! The jail on its own: which layers hold on this machine, the fallback without
//! namespaces, the private root, hidden paths, and the deadline's tree kill.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kiln_sandbox::jail::{self, JailSpec, Limits, Role};
use kiln_types::Verdict;

fn layer<'a>(layers: &'a [kiln_sandbox::LayerStatus], name: &str) -> &'a kiln_sandbox::LayerStatus {
    layers
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no layer {name} in {layers:?}"))
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn jail_probe_reports_every_layer() {
    let (dir, cfg) = common::setup();
    let layers = kiln_sandbox::probe_layers(&cfg);
    for name in [
        "fds-closed",
        "rlimits",
        "no-new-privs",
        "seccomp",
        "parent-death-signal",
        "env-cleared",
        "payload",
    ] {
        assert!(layer(&layers, name).active, "{name}: {layers:#?}");
    }
    if is_root() {
        // As root (this CI machine) the kernel grants every namespace.
        for name in [
            "user-namespace",
            "mount-namespace",
            "network-namespace",
            "ipc-namespace",
            "pid-namespace",
            "private-root",
            "hidden-paths",
        ] {
            assert!(layer(&layers, name).active, "{name}: {layers:#?}");
        }
    }
    let cg = layer(&layers, "cgroup");
    assert!(
        !cg.active && cg.detail.contains("no delegated cgroup"),
        "{cg:?}"
    );
    common::assert_clean(dir.path());
}

#[test]
fn jail_cgroup_v1_machine_degrades_with_a_reason() {
    let (dir, mut cfg) = common::setup();
    // Not a delegated cgroup v2 directory: the layer must be off, with the reason.
    cfg.cgroup_parent = Some(dir.path().to_path_buf());
    let layers = kiln_sandbox::probe_layers(&cfg);
    let cg = layer(&layers, "cgroup");
    assert!(
        !cg.active && cg.detail.contains("not a cgroup v2 directory"),
        "{cg:?}"
    );
    assert!(layer(&layers, "payload").active, "{layers:#?}");
    common::assert_clean(dir.path());
}

#[test]
fn jail_without_namespaces_degrades_and_still_evaluates() {
    let (dir, mut cfg) = common::setup();
    cfg.disable_namespaces = true;
    let layers = kiln_sandbox::probe_layers(&cfg);
    for name in [
        "user-namespace",
        "pid-namespace",
        "network-namespace",
        "mount-namespace",
        "ipc-namespace",
    ] {
        let l = layer(&layers, name);
        assert!(!l.active && l.detail.contains("disabled"), "{l:?}");
    }
    assert!(!layer(&layers, "private-root").active);
    assert!(
        layer(&layers, "seccomp").active && layer(&layers, "payload").active,
        "{layers:#?}"
    );
    let p = common::problem("vecadd-4096");
    let e = common::run(
        &cfg,
        &p,
        &p.seed_candidate("host").expect("seed"),
        &common::plan(),
    );
    assert_eq!(e.verdict, Verdict::Ok, "{e:#?}");
    let inactive = &e.telemetry.as_ref().expect("telemetry")["jail"]["inactive"];
    assert!(inactive.get("pid-namespace").is_some(), "{inactive}");
    // The runner's seccomp filter still holds without namespaces.
    let mut bad = p.seed_candidate("host").expect("seed");
    bad.source = "#include <sys/socket.h>\nvoid vecadd(const float*a,const float*b,float*y,int n){socket(2,1,0);}\n".into();
    let e = common::run(&cfg, &p, &bad, &common::plan());
    assert_eq!(e.verdict, Verdict::RuntimeFault, "{e:#?}");
    common::assert_clean(dir.path());
}

#[test]
fn jail_seccomp_stops_a_forbidden_syscall_in_the_runner() {
    let (dir, cfg) = common::setup();
    let p = common::problem("vecadd-4096");
    let mut c = p.seed_candidate("host").expect("seed");
    c.source = "#include <sys/socket.h>\nvoid vecadd(const float*a,const float*b,float*y,int n){socket(2,1,0);for(int i=0;i<n;i++)y[i]=a[i]+b[i];}\n".into();
    let e = common::run(&cfg, &p, &c, &common::plan());
    assert_eq!(e.verdict, Verdict::RuntimeFault, "{e:#?}");
    assert_eq!(
        e.evidence
            .fault
            .as_deref()
            .map(|f| f.starts_with("forbidden syscall socket")),
        Some(true),
        "{e:#?}"
    );
    common::assert_clean(dir.path());
}

/// A spec running `/bin/sh -c SCRIPT` under the compile role.
fn shell_spec(
    root: &Path,
    script: &str,
    marker: &str,
    namespaces: bool,
    ro: Vec<PathBuf>,
    hidden: Vec<PathBuf>,
) -> JailSpec {
    let job = root.join("job");
    std::fs::create_dir_all(job.join("root")).expect("root dir");
    std::fs::create_dir_all(job.join("work")).expect("work dir");
    let mut ro_paths: Vec<PathBuf> = ["/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache"]
        .iter()
        .map(PathBuf::from)
        .collect();
    ro_paths.extend(ro);
    JailSpec {
        role: Role::Compile,
        program: std::fs::canonicalize("/bin/sh").expect("sh"),
        args: vec!["-c".into(), script.into(), marker.into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        scratch: job.join("work"),
        root_dir: job.join("root"),
        ro_paths,
        ro_binds: Vec::new(),
        hidden_paths: hidden,
        devices: Vec::new(),
        optional_ro_paths: Vec::new(),
        namespaces,
        limits: Limits {
            cpu_s: 10,
            nofile: 64,
            nproc: 64,
            fsize_bytes: 1 << 20,
            as_bytes: None,
        },
        cgroup: None,
    }
}

fn helper() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kiln-worker"))
}

/// Runs `spec` (which must get a private root) to the end: its stdout and how it ended.
fn run_with_private_root(spec: &JailSpec) -> (String, String) {
    let mut child = jail::spawn(&helper(), spec, Duration::from_secs(10)).expect("spawn");
    assert!(child.report.is_active("private-root"), "{:?}", child.report);
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout, &mut out).expect("read");
    (out, format!("{:?}", child.finish()))
}

#[test]
fn jail_private_root_keeps_writes_in_scratch_and_hides_paths() {
    if !is_root() {
        return; // needs the mount namespace
    }
    let (dir, _cfg) = common::setup();
    let visible = dir.path().join("visible");
    std::fs::create_dir_all(visible.join("state")).expect("dirs");
    std::fs::write(visible.join("public"), "public").expect("write");
    std::fs::write(visible.join("state/secret"), "secret").expect("write");
    let escape = dir.path().join("escape-attempt");
    let script = format!(
        "echo inside > /scratch/ok; \
         (echo x > {esc}) 2>/dev/null && echo WROTE_HOST_PATH; \
         (echo x > /rootfile) 2>/dev/null && echo WROTE_ROOT; \
         (echo x > /usr/kiln-escape) 2>/dev/null && echo WROTE_USR; \
         cat {vis}/public; cat {vis}/state/secret 2>/dev/null && echo READ_HIDDEN; \
         echo done",
        esc = escape.display(),
        vis = visible.display()
    );
    let spec = shell_spec(
        dir.path(),
        &script,
        "kiln-jail-test-fs",
        true,
        vec![visible.clone()],
        vec![visible.join("state")],
    );
    let (out, ended) = run_with_private_root(&spec);
    assert!(
        out.contains("public") && out.contains("done"),
        "{out:?} {ended:?}"
    );
    for bad in ["WROTE_HOST_PATH", "WROTE_ROOT", "WROTE_USR", "READ_HIDDEN"] {
        assert!(!out.contains(bad), "{bad}: {out:?}");
    }
    assert!(!escape.exists() && !Path::new("/usr/kiln-escape").exists());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("job/work/ok")).expect("scratch file"),
        "inside\n"
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("job/root"))
            .expect("root")
            .count(),
        0,
        "mount point stays empty on the host"
    );
}

#[test]
fn jail_binds_header_folders_read_only_at_fixed_paths() {
    if !is_root() {
        return; // needs the mount namespace
    }
    let (dir, _cfg) = common::setup();
    let headers = dir.path().join("toolkit/include");
    std::fs::create_dir_all(headers.join("cccl")).expect("dirs");
    std::fs::write(headers.join("cuda_fp16.h"), "half").expect("write");
    let script = format!(
        "cat /kiln/include/0/cuda_fp16.h; echo; ls /kiln/include/0; \
         (echo x > /kiln/include/0/evil.h) 2>/dev/null && echo WROTE_HEADERS; \
         ls {host} 2>/dev/null && echo HOST_PATH_VISIBLE; echo done",
        host = headers.display()
    );
    let mut spec = shell_spec(
        dir.path(),
        &script,
        "kiln-jail-test-binds",
        true,
        vec![],
        vec![],
    );
    spec.ro_binds = vec![(headers.clone(), PathBuf::from("/kiln/include/0"))];
    let (out, ended) = run_with_private_root(&spec);
    assert!(
        out.starts_with("half\n") && out.contains("cccl") && out.contains("done"),
        "{out:?} {ended:?}"
    );
    assert!(!out.contains("WROTE_HEADERS"), "{out:?}");
    assert!(
        !out.contains("HOST_PATH_VISIBLE"),
        "only the fixed path shows it: {out:?}"
    );
    assert!(!headers.join("evil.h").exists());
    // A bind whose inside path climbs out is refused before anything runs.
    spec.ro_binds = vec![(headers, PathBuf::from("/kiln/../etc"))];
    assert!(spec.validate().is_err());
}

fn deadline_kills_tree(namespaces: bool) {
    let (dir, _cfg) = common::setup();
    let marker = format!("kiln-jail-tree-{}-{namespaces}", std::process::id());
    let script = "sh -c 'sleep 60' \"$0\" & sh -c 'sleep 60' \"$0\" & sleep 60; wait";
    let spec = shell_spec(dir.path(), script, &marker, namespaces, vec![], vec![]);
    let started = Instant::now();
    let mut child = jail::spawn(&helper(), &spec, Duration::from_millis(700)).expect("spawn");
    let mut out = Vec::new();
    let _ = std::io::Read::read_to_end(&mut child.stdout, &mut out);
    let ended = child.finish();
    assert!(ended.timed_out, "{ended:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // Every process of the tree is gone (the grandchildren carry the marker in argv).
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let left = common::processes_mentioning(Path::new(&marker));
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < until, "left behind: {left:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn jail_deadline_kills_the_whole_tree() {
    deadline_kills_tree(true);
}

#[test]
fn jail_deadline_kills_the_whole_tree_without_namespaces() {
    deadline_kills_tree(false);
}

#[test]
fn jail_refuses_a_relative_path_in_the_spec() {
    let (dir, _cfg) = common::setup();
    let mut spec = shell_spec(dir.path(), "true", "x", false, vec![], vec![]);
    spec.scratch = PathBuf::from("relative/scratch");
    let err = jail::spawn(&helper(), &spec, Duration::from_secs(5))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("not an absolute path"), "{err}");
}

#[test]
fn jail_payload_holds_no_capabilities() {
    let (dir, _cfg) = common::setup();
    // Without namespaces the payload sees the host's /proc, and its capability sets there
    // are the host's view: all must be empty, whoever started the jail (root here in CI).
    let script = "grep -E '^Cap(Inh|Prm|Eff|Amb):' /proc/self/status; echo done";
    let spec = shell_spec(
        dir.path(),
        script,
        "kiln-jail-test-caps",
        false,
        vec![],
        vec![],
    );
    let mut child = jail::spawn(&helper(), &spec, Duration::from_secs(10)).expect("spawn");
    assert!(child.report.is_active("capabilities"), "{:?}", child.report);
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout, &mut out).expect("read");
    let ended = child.finish();
    assert!(out.contains("done"), "{out:?} {ended:?}");
    let sets: Vec<&str> = out.lines().filter(|l| l.starts_with("Cap")).collect();
    assert_eq!(sets.len(), 4, "{out:?}");
    for line in sets {
        let value = line.split_whitespace().nth(1).unwrap_or("?");
        assert!(
            value.chars().all(|c| c == '0'),
            "a capability survived into the jail: {line}"
        );
    }
}
