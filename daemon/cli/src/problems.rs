//! `kiln problems add DIR | list | show NAME | baseline NAME [--remeasure] [--gpu GPU] |
//! import kernelbench FILE... | check [DIR...]`.

mod check;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;
use kiln_daemon::client::Client;
use kiln_types::ProblemSpec;

use crate::Output;
use crate::output::{print_json, text};

/// Problem subcommands.
#[derive(Debug, Subcommand)]
pub enum ProblemsCmd {
    /// Register the problem in DIR (problem.toml and the sources it names).
    /// A folder holding several problem folders registers each of them.
    Add {
        /// The problem folder.
        dir: PathBuf,
    },
    /// List registered problems.
    List,
    /// Show one problem: tensors, sizes, roofline figures and floor on this GPU, and the
    /// baselines measured here.
    Show {
        /// Problem name.
        name: String,
    },
    /// Check problem folders without a daemon, compiler or GPU: the spec, each launch
    /// plan against its kernel's parameters, the knob grammar and the source rules
    /// (problems/README.md). Exits 1 when any problem fails.
    Check {
        /// Problem folders, or folders of them (default: ./problems).
        dirs: Vec<PathBuf>,
    },
    /// Write problems of another format as kiln problem folders (nothing is registered:
    /// `kiln problems add OUT` does that).
    #[command(subcommand)]
    Import(ImportCmd),
    /// Time the problem's baselines on this machine's GPU (the reference, cuBLAS/cuDNN,
    /// torch eager and torch.compile), or show the cached times. The first measurement
    /// takes minutes.
    Baseline {
        /// Problem name.
        name: String,
        /// Measure again even when cached.
        #[arg(long)]
        remeasure: bool,
        /// On a host with GPUs of different models: the GPU whose model to time them on,
        /// by index or UUID as `kiln devices` lists them (default: lane 0's GPU).
        #[arg(long)]
        gpu: Option<String>,
    },
}

/// Formats `kiln problems import` takes.
#[derive(Debug, Subcommand)]
pub enum ImportCmd {
    /// KernelBench-format Python files (`class Model`, `get_inputs`, `get_init_inputs`), or
    /// folders of them (a KernelBench level). Runs the files' Python with torch, here.
    Kernelbench {
        /// Files or folders.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Where the problem folders are written (one per problem).
        #[arg(long, default_value = "problems/kernelbench")]
        out: PathBuf,
        /// The python that has torch.
        #[arg(long, env = "KILN_PYTHON", default_value = "python3")]
        python: String,
        /// kiln's torch runner (default: kiln_torch.py beside kiln-worker, in share/kiln or
        /// daemon/torch-runner/ above it).
        #[arg(long)]
        helper: Option<PathBuf>,
        /// Run a module once on the CPU (to see whether the tolerance accepts an all-zero
        /// output) only when its tensors take at most this many bytes.
        #[arg(long, default_value_t = 256 << 20)]
        run_limit_bytes: u64,
        /// ... and at most this many flops.
        #[arg(long, default_value_t = 4_000_000_000)]
        run_limit_flops: u64,
        /// The problems' absolute tolerance (default: KernelBench's fp32 1e-4). An honest
        /// fp32 kernel with long reductions (a 4096-deep matmul) misses 1e-4 on outputs
        /// near zero; see problems/README.md.
        #[arg(long, default_value_t = kiln_types::kernelbench::KERNELBENCH_FP32_TOL)]
        atol: f64,
        /// The problems' relative tolerance (default: KernelBench's fp32 1e-4).
        #[arg(long, default_value_t = kiln_types::kernelbench::KERNELBENCH_FP32_TOL)]
        rtol: f64,
    },
}

fn problem_dirs(dir: &std::path::Path) -> Result<Vec<PathBuf>> {
    if dir.join("problem.toml").is_file() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("problem.toml").is_file())
        .collect();
    dirs.sort();
    anyhow::ensure!(
        !dirs.is_empty(),
        "{} holds no problem.toml (nor folders with one)",
        dir.display()
    );
    Ok(dirs)
}

/// Runs a problems subcommand.
pub async fn run(client: &Client, out: Output, cmd: ProblemsCmd) -> Result<std::process::ExitCode> {
    match cmd {
        ProblemsCmd::Add { dir } => {
            // Every problem of the folder is tried: one that kilnd refuses (too large for the
            // GPU, invalid, a name taken by another spec) is reported and the rest go on.
            let mut results = Vec::new();
            let mut refused = 0usize;
            for d in problem_dirs(&dir)? {
                let spec =
                    ProblemSpec::load_dir(&d).with_context(|| format!("in {}", d.display()))?;
                match client
                    .post("/v1/problems", &serde_json::to_value(&spec)?)
                    .await
                {
                    Ok((status, v)) => {
                        if out == Output::Text {
                            let what = if status == 201 {
                                "registered"
                            } else {
                                "already registered"
                            };
                            println!("{what}: {}", spec.name);
                        }
                        results.push(v);
                    }
                    Err(kiln_daemon::client::ClientError::Api { code, message, .. }) => {
                        refused += 1;
                        if out == Output::Text {
                            println!("refused: {} ({code}): {message}", spec.name);
                        }
                        results.push(serde_json::json!({
                            "name": spec.name, "refused": {"code": code, "message": message}
                        }));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if out == Output::Json {
                print_json(&serde_json::Value::Array(results));
            }
            if refused > 0 {
                return Ok(std::process::ExitCode::FAILURE);
            }
        }
        ProblemsCmd::Check { dirs } => return check::run(out, &dirs),
        ProblemsCmd::Import(ImportCmd::Kernelbench {
            paths,
            out: dir,
            python,
            helper,
            run_limit_bytes,
            run_limit_flops,
            atol,
            rtol,
        }) => {
            let limits = (run_limit_bytes, run_limit_flops);
            let tol = kiln_types::Tolerance { atol, rtol };
            return import_kernelbench(out, &paths, &dir, &python, helper, limits, tol);
        }
        ProblemsCmd::List => {
            let v = client.get("/v1/problems").await?;
            if out == Output::Json {
                print_json(&v);
            } else {
                let list = v["problems"].as_array().cloned().unwrap_or_default();
                if list.is_empty() {
                    println!("no problems registered; add one with `kiln problems add DIR`");
                }
                for p in list {
                    let backends: Vec<String> = p["backends"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(text)
                        .collect();
                    println!(
                        "{:<28} [{}]  {}",
                        text(&p["name"]),
                        backends.join(","),
                        text(&p["summary"])
                    );
                }
            }
        }
        ProblemsCmd::Show { name } => {
            let v = client.get(&format!("/v1/problems/{name}")).await?;
            if out == Output::Json {
                print_json(&v);
            } else {
                let spec = &v["spec"];
                println!("{} — {}", text(&spec["name"]), text(&spec["summary"]));
                println!("  tensors, in the order a launch plan names them:");
                for line in tensor_lines(spec) {
                    println!("{line}");
                }
                for line in torch_lines(&spec["reference"]["torch"]) {
                    println!("{line}");
                }
                println!(
                    "  tolerance  atol {}  rtol {}",
                    text(&spec["tolerance"]["atol"]),
                    text(&spec["tolerance"]["rtol"])
                );
                if let Some(tier) = spec.get("required_tier") {
                    println!("  requires   {}", text(tier));
                }
                let d = &v["derived"];
                println!(
                    "  bytes      in {}  out {}  roofline min {}",
                    text(&d["input_bytes"]),
                    text(&d["output_bytes"]),
                    text(&d["min_bytes"])
                );
                println!("  flops      {}", text(&d["flops"]));
                let backends: Vec<String> = d["backends"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(text)
                    .collect();
                println!("  backends   {}", backends.join(", "));
                let f = &d["floor"];
                if let Some(floor) = f["floor_us"].as_f64() {
                    println!(
                        "  floor      {floor:.1} us on this GPU (memory {:.1} us; strict fp32 {:.1} us)",
                        f["memory_us"].as_f64().unwrap_or(0.0),
                        f["floor_fp32_us"].as_f64().unwrap_or(0.0)
                    );
                }
                let sets = v["baselines"].as_array().cloned().unwrap_or_default();
                if sets.is_empty() {
                    println!("  baselines  none measured yet: `kiln problems baseline {name}`");
                }
                for set in &sets {
                    println!("  baselines");
                    for line in crate::baselines::set_lines(set) {
                        println!("  {line}");
                    }
                }
            }
        }
        ProblemsCmd::Baseline {
            name,
            remeasure,
            gpu,
        } => {
            if out == Output::Text {
                eprintln!("timing the baselines of {name} on the GPU (minutes the first time)...");
            }
            let (status, v) = client
                .post(
                    &format!("/v1/problems/{name}/baselines"),
                    &serde_json::json!({ "remeasure": remeasure, "gpu": gpu }),
                )
                .await?;
            if out == Output::Json {
                print_json(&v);
            } else if status >= 400 {
                anyhow::bail!("{}", text(&v["error"]["message"]));
            } else {
                println!("{name}");
                for line in crate::baselines::set_lines(&v) {
                    println!("{line}");
                }
            }
            if status >= 400 {
                return Ok(std::process::ExitCode::from(1));
            }
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// `kiln problems import kernelbench`: describe every file, write the ones taken, report
/// the counts and each refusal's reason.
fn import_kernelbench(
    out: Output,
    paths: &[PathBuf],
    dir: &std::path::Path,
    python: &str,
    helper: Option<PathBuf>,
    run_limits: (u64, u64),
    tol: kiln_types::Tolerance,
) -> Result<std::process::ExitCode> {
    use kiln_types::kernelbench;
    kernelbench::check_tolerance(tol).context("--atol/--rtol")?;
    let files = python_files(paths)?;
    anyhow::ensure!(!files.is_empty(), "no .py files in {paths:?}");
    let script = match helper {
        Some(h) => h,
        None => kiln_torch_runner::TorchRunner::find(
            &kiln_sandbox::default_worker_exe(),
            python,
            std::time::Duration::from_secs(1),
        )
        .map(|h| h.script)
        .context("kiln_torch.py not found beside kiln-worker: pass --helper PATH")?,
    };
    let helper = kiln_torch_runner::TorchRunner {
        python: kiln_torch_runner::process::resolve(python),
        script,
        timeout: std::time::Duration::from_secs(3600),
    };
    if out == Output::Text {
        eprintln!(
            "describing {} file(s) with {} {} ...",
            files.len(),
            helper.python.display(),
            helper.script.display()
        );
    }
    let described = kiln_torch_runner::process::describe(&helper, &files, run_limits, tol)?;
    let (mut taken, mut refused) = (Vec::new(), Vec::new());
    for d in &described {
        match &d.refused {
            Some(why) => refused.push((d.file.clone(), why.clone())),
            None => match kernelbench::write(dir, d, tol) {
                Ok(i) => taken.push(i),
                Err(e) => refused.push((d.file.clone(), format!("{e:#}"))),
            },
        }
    }
    if out == Output::Json {
        print_json(&serde_json::json!({
            "imported": taken.iter().map(|i| serde_json::json!({
                "name": i.name, "dir": i.dir, "warnings": i.warnings})).collect::<Vec<_>>(),
            "refused": refused.iter().map(|(f, why)| serde_json::json!({
                "file": f, "reason": why})).collect::<Vec<_>>(),
        }));
    } else {
        for i in &taken {
            println!("imported  {:<48} {}", i.name, i.dir.display());
            for w in &i.warnings {
                println!("  warning: {w}");
            }
        }
        for (f, why) in &refused {
            println!("refused   {f}: {why}");
        }
        println!(
            "{} of {} imported into {}, {} refused",
            taken.len(),
            described.len(),
            dir.display(),
            refused.len()
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// One line per tensor (role, name, dtype, shape; the module's parameter it holds, for a
/// torch reference), in the problem's order.
fn tensor_lines(spec: &serde_json::Value) -> Vec<String> {
    let state = &spec["reference"]["torch"]["state"];
    spec["tensor"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let name = text(&t["name"]);
            let param = state
                .as_object()
                .and_then(|m| m.iter().find(|(_, v)| v.as_str() == Some(name.as_str())))
                .map(|(p, _)| format!("  (the module's {p})"))
                .unwrap_or_default();
            format!(
                "  {:<7} {:<22} {:<5} {}{param}",
                text(&t["role"]),
                name,
                text(&t["dtype"]),
                t["shape"]
            )
        })
        .collect()
}

/// `forward`'s arguments as `kiln problems show` lists them: tensor names, and a constant
/// as `name=value`.
fn forward_args(torch: &serde_json::Value) -> String {
    torch["forward"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            let name = n.as_str().unwrap_or("?");
            match torch["constants"].get(name) {
                Some(v) => format!("{name}={v}"),
                None => name.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a torch reference runs, for `kiln problems show`.
fn torch_lines(torch: &serde_json::Value) -> Vec<String> {
    if torch.is_null() {
        return Vec::new();
    }
    let list = |v: &serde_json::Value| -> String {
        v.as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect::<Vec<_>>()
            .join(", ")
    };
    vec![
        format!(
            "  reference  PyTorch module {} (KernelBench format): Model(*{}).forward({}) -> {}",
            text(&torch["file"]),
            text(&torch["init_inputs"]),
            forward_args(torch),
            list(&torch["outputs"])
        ),
        format!(
            "             precision {} (float64 where every op supports it, unless declared)",
            torch["precision"].as_str().unwrap_or("auto")
        ),
    ]
}

/// Files to import: each PATH that is a `.py` file, and the `.py` files of each folder
/// (numeric prefix order, as KernelBench numbers them).
fn python_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut in_dir: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("cannot read {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|e| e == "py") && f.is_file())
                .collect();
            in_dir.sort_by_key(|f| {
                let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("");
                let n: u64 = stem
                    .split('_')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(u64::MAX);
                (n, stem.to_string())
            });
            out.extend(in_dir);
        } else if p.is_file() {
            out.push(p.clone());
        } else {
            anyhow::bail!("{} is neither a file nor a folder", p.display());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_list_their_files_in_kernelbench_order() {
        let dir = tempfile::tempdir().expect("tmp");
        for f in ["10_b.py", "2_a.py", "1_c.py", "notes.txt"] {
            std::fs::write(dir.path().join(f), "").expect("write");
        }
        let got = python_files(&[dir.path().to_path_buf()]).expect("files");
        let names: Vec<_> = got
            .iter()
            .map(|p| p.file_name().and_then(|n| n.to_str()).unwrap_or(""))
            .collect();
        assert_eq!(names, ["1_c.py", "2_a.py", "10_b.py"]);
        assert!(python_files(&[dir.path().join("nope")]).is_err());
    }

    #[test]
    fn show_lists_tensors_in_launch_order_with_the_parameters_they_hold() {
        let spec = serde_json::json!({
            "tensor": [
                {"name": "x", "dtype": "f32", "shape": [4, 16], "role": "input"},
                {"name": "linear_weight", "dtype": "f32", "shape": [8, 16], "role": "input"},
                {"name": "out", "dtype": "f32", "shape": [4, 8], "role": "output"}],
            "reference": {"torch": {"file": "reference.py", "init_inputs": "[16, 8]",
                "forward": ["x"], "outputs": ["out"], "state": {"linear.weight": "linear_weight"}}}
        });
        let lines = tensor_lines(&spec);
        assert_eq!(lines.len(), 3);
        assert!(
            lines[0].contains("x") && lines[0].contains("[4,16]"),
            "{lines:?}"
        );
        assert!(
            lines[1].contains("(the module's linear.weight)"),
            "{lines:?}"
        );
        assert!(lines[2].contains("output"), "{lines:?}");
        let torch = torch_lines(&spec["reference"]["torch"]);
        assert!(
            torch[0].contains("Model(*[16, 8]).forward(x) -> out"),
            "{torch:?}"
        );
        assert!(torch_lines(&serde_json::Value::Null).is_empty());
        // A constant among forward's arguments is shown with its value.
        let with = serde_json::json!({"file": "reference.py", "init_inputs": "[]",
            "forward": ["A", "s"], "constants": {"s": 2.75}, "outputs": ["out"]});
        assert!(
            torch_lines(&with)[0].contains("forward(A, s=2.75) -> out"),
            "{:?}",
            torch_lines(&with)
        );
    }
}
