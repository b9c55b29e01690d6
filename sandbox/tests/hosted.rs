//! Hosted `ModelNew` files on the host backend (`modelnew-cpu`): the jailed python runner
//! under its own filter, kiln's inputs and weights set by name, outputs compared and time
//! taken on the worker's side, and the hacks that need no GPU.
//!
//! Needs a python with torch: `KILN_PYTHON` (CI sets it), else `python3`; skipped with the
//! reason when that python cannot import torch.

mod common;

use common::hosted::{assert_correct, evaluate, hosted_setup, modelnew};
use common::kernelbench::fixture;
use kiln_sandbox::SandboxConfig;
use kiln_types::Verdict;

const SOFTMAX_HONEST: &str = r#"
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        m = x.max(dim=1, keepdim=True).values
        e = torch.exp(x - m)
        return e / e.sum(dim=1, keepdim=True)
"#;

#[test]
fn an_honest_modelnew_is_correct_and_a_wrong_one_is_not() {
    let Some((_d, cfg, mut runner)) = hosted_setup() else {
        return;
    };
    let p = fixture("kb-softmax-8x64");
    let e = evaluate(&cfg, &p, SOFTMAX_HONEST, &mut runner);
    assert_correct(&e);
    // Softmax over the wrong dimension.
    let wrong = SOFTMAX_HONEST.replace("dim=1", "dim=0");
    let e = evaluate(&cfg, &p, &wrong, &mut runner);
    assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
}

/// forward's Python number (a constant of the problem, as KernelBench's level-1 5 has) reaches
/// the reference and the file as it is: a file that uses it is correct, one that assumes
/// another value is not.
#[test]
fn a_constant_among_forwards_arguments_is_passed_as_it_is() {
    let Some((_d, cfg, mut runner)) = hosted_setup() else {
        return;
    };
    let p = fixture("kb-scale-by-constant-8x64");
    let torch = p.reference.torch.as_ref().expect("torch reference");
    assert_eq!(
        torch.constants.get("s"),
        Some(&kiln_types::ForwardConstant::Float(2.5))
    );
    let honest = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, A, s):\n        assert isinstance(s, float)\n        return A * s\n";
    let e = evaluate(&cfg, &p, honest, &mut runner);
    assert_correct(&e);
    let e = evaluate(&cfg, &p, &honest.replace("A * s", "A * 2.0"), &mut runner);
    assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
}

const LINEAR: &str = r#"
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.clamp_min(x @ self.linear.weight.t() + self.linear.bias, 0.0)
"#;

#[test]
fn weights_are_kilns_by_name_or_order_and_a_mismatch_names_them() {
    let Some((_d, cfg, mut runner)) = hosted_setup() else {
        return;
    };
    let p = fixture("kb-linear-relu-4x16x8");
    // Its own layer, under the reference's name: kiln's drawn weights reach it.
    assert_correct(&evaluate(&cfg, &p, LINEAR, &mut runner));
    // The same layer under another name: paired by creation order (as KernelBench's
    // seeding lets it pass), with a note saying so.
    let renamed = LINEAR.replace("self.linear", "self.fc");
    let e = evaluate(&cfg, &p, &renamed, &mut runner);
    assert_correct(&e);
    assert!(
        e.evidence
            .notes
            .iter()
            .any(|n| n.contains("fc.weight<-linear.weight")),
        "{:?}",
        e.evidence.notes
    );
    // A parameter the problem does not have would keep its own random init: refused,
    // named.
    let extra = LINEAR.replace(
        "self.linear = nn.Linear(in_features, out_features)",
        "self.linear = nn.Linear(in_features, out_features)\n        \
         self.scale = nn.Parameter(torch.ones(out_features))",
    );
    let e = evaluate(&cfg, &p, &extra, &mut runner);
    assert_eq!(e.verdict, Verdict::InvalidLaunch, "{e:#?}");
    assert!(e.message.contains("scale"), "{}", e.message);
}

#[test]
fn a_file_that_fails_to_import_or_to_run_is_a_fault_with_its_reason() {
    let Some((_d, cfg, mut runner)) = hosted_setup() else {
        return;
    };
    let p = fixture("kb-softmax-8x64");
    let broken =
        "import torch\nimport no_such_module_here\nclass ModelNew(torch.nn.Module):\n    pass\n";
    let e = evaluate(&cfg, &p, broken, &mut runner);
    assert_eq!(e.verdict, Verdict::RuntimeFault, "{e:#?}");
    assert!(e.message.contains("no_such_module_here"), "{}", e.message);

    let raises = SOFTMAX_HONEST.replace(
        "m = x.max(dim=1, keepdim=True).values",
        "raise RuntimeError('kernel launch failed: too many resources')",
    );
    let e = evaluate(&cfg, &p, &raises, &mut runner);
    assert_eq!(e.verdict, Verdict::RuntimeFault, "{e:#?}");
    let printed = e.evidence.output_excerpt.clone().unwrap_or_default();
    assert!(printed.contains("too many resources"), "{e:#?}");
}

/// A softmax whose row pass is C++ from `load_inline` (on the CPU: `cpp_sources` only).
const SOFTMAX_LOAD_INLINE: &str = r#"
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = """
#include <torch/extension.h>
torch::Tensor row_softmax(torch::Tensor x) {
    auto m = std::get<0>(x.max(1, true));
    auto e = (x - m).exp();
    return e / e.sum(1, true);
}
"""
ops = load_inline(name="kiln_test_softmax", cpp_sources=CPP, functions=["row_softmax"])

class ModelNew(nn.Module):
    def forward(self, x):
        return ops.row_softmax(x)
"#;

/// A file's `load_inline` library is built at its compile step (a compile jail, processes
/// allowed for ninja and the compiler), carried in its artifact, and loaded by its runner
/// at evaluation, where building is impossible on the host backend (no processes). Needs
/// ninja beside the python (CI installs it); skipped without.
#[test]
fn a_load_inline_library_is_built_at_compile_and_loaded_at_evaluation() {
    let Some((_d, mut cfg, mut runner)) = hosted_setup() else {
        return;
    };
    // Without torch's precompiled header (the test below builds one).
    cfg.pch_dir = None;
    let python = cfg.hosted.as_ref().expect("hosted").python.clone();
    if !python.with_file_name("ninja").is_file() && which_ninja().is_none() {
        eprintln!("SKIP: no ninja beside {} or on PATH", python.display());
        return;
    }
    let p = fixture("kb-softmax-8x64");
    let c = modelnew(&p, SOFTMAX_LOAD_INLINE);
    let out = kiln_sandbox::compile(&cfg, &p, &c).expect("compile step runs");
    let art = out.artifact.expect("an artifact");
    let unpacked = kiln_sandbox::engine::hosted::artifact::unpack(&art).expect("unpacks");
    assert_eq!(unpacked.source, SOFTMAX_LOAD_INLINE);
    assert_eq!(unpacked.libs.len(), 1, "{}", out.info.log);
    assert_eq!(unpacked.libs[0].1, "kiln_test_softmax");
    assert!(out.info.duration_ms > 0.0);
    let e =
        kiln_sandbox::evaluate_with(&cfg, &p, &[], &c, &art, &common::plan(), Some(&mut runner))
            .expect("evaluate runs");
    assert_correct(&e);
    assert!(
        e.evidence
            .notes
            .iter()
            .any(|n| n.contains("kiln_test_softmax") && n.contains("loaded from kiln's cache")),
        "{:#?}",
        e.evidence.notes
    );
    // The same file as written, without its libraries: the runner must build, and a
    // runner on the host backend may not start processes: the reason is the file's fault.
    let e = kiln_sandbox::evaluate_with(
        &cfg,
        &p,
        &[],
        &c,
        SOFTMAX_LOAD_INLINE.as_bytes(),
        &common::plan(),
        Some(&mut runner),
    )
    .expect("evaluate runs");
    assert_eq!(e.verdict, Verdict::RuntimeFault, "{e:#?}");
}

/// A file that builds CUDA with load_inline and, at import, would write a marker: the
/// compile step reads its device code from its text before anything of it runs.
const LIFTABLE_TEXT: &str = r#"
import pathlib
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

pathlib.Path("kiln-marker-imported").write_text("ran")

cuda_src = r'''
#include <torch/extension.h>
__global__ void scale_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
torch::Tensor scale(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    scale_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
'''

ext = load_inline(name="kiln_test_scale", cpp_sources="torch::Tensor scale(torch::Tensor x);",
                  cuda_sources=cuda_src, functions=["scale"], extra_cuda_cflags=["-O3"])

class ModelNew(nn.Module):
    def forward(self, x):
        return ext.scale(x)
"#;

/// The compile step reads a file's `load_inline` device sources from its text (for
/// lifting, issue 29), whether or not its build succeeds (here it cannot: no CUDA), and
/// keeps them in the artifact: the host wrapper removed, the kernel named, the flags kept.
#[test]
fn a_files_device_sources_are_read_at_its_compile_step_from_its_text() {
    let Some((_d, cfg, _runner)) = hosted_setup() else {
        return;
    };
    let p = fixture("kb-softmax-8x64");
    let c = modelnew(&p, LIFTABLE_TEXT);
    let out = kiln_sandbox::compile(&cfg, &p, &c).expect("compile step runs");
    let art = out.artifact.expect("an artifact");
    let unpacked = kiln_sandbox::engine::hosted::artifact::unpack(&art).expect("unpacks");
    assert_eq!(unpacked.source, LIFTABLE_TEXT);
    let sources = kiln_sandbox::engine::hosted::lift::DeviceSources::parse(unpacked.device)
        .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", unpacked.device, out.info.log));
    assert_eq!(sources.error, None, "{}", out.info.log);
    let [s] = sources.sources.as_slice() else {
        panic!("one source: {sources:?}");
    };
    assert_eq!(s.kernels, vec!["scale_kernel".to_string()]);
    assert!(
        s.source.contains("__global__ void scale_kernel"),
        "{}",
        s.source
    );
    assert!(!s.source.contains("torch/extension.h"), "{}", s.source);
    assert!(!s.source.contains("torch::Tensor"), "{}", s.source);
    assert_eq!(s.flags, vec!["-O3".to_string()]);
}

/// A file whose kernels are Triton's (no `load_inline`).
const TRITON_TEXT: &str = r#"
import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        scale_kernel[lambda m: (triton.cdiv(x.numel(), m["BLOCK"]),)](x, y, x.numel())
        return y
"#;

/// A Triton file has a compile step too, though nothing is built there (Triton compiles
/// at evaluation): its Triton source is read from its text for lifting, the autotune
/// decorator left out, and no library is packed.
#[test]
fn a_triton_files_source_is_read_at_its_compile_step() {
    let Some((_d, cfg, _runner)) = hosted_setup() else {
        return;
    };
    let p = fixture("kb-softmax-8x64");
    let out = kiln_sandbox::compile(&cfg, &p, &modelnew(&p, TRITON_TEXT)).expect("compile step");
    assert!(out.failure.is_none(), "{:?}", out.failure);
    let art = out.artifact.expect("an artifact");
    let unpacked = kiln_sandbox::engine::hosted::artifact::unpack(&art).expect("unpacks");
    assert_eq!(unpacked.source, TRITON_TEXT);
    assert!(unpacked.libs.is_empty(), "{}", out.info.log);
    let sources = kiln_sandbox::engine::hosted::lift::DeviceSources::parse(unpacked.device)
        .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", unpacked.device, out.info.log));
    let t = sources.triton.expect("the Triton source");
    assert_eq!(t.kernels, vec!["scale_kernel".to_string()]);
    assert!(t.source.contains("def scale_kernel"), "{}", t.source);
    assert!(!t.source.contains("autotune"), "{}", t.source);
    assert!(!t.source.contains("class ModelNew"), "{}", t.source);
}

fn which_ninja() -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("ninja"))
        .find(|n| n.is_file())
}

/// Hacks that need no GPU: each gets its verdict, and nothing else changes.
mod hacks {
    use super::*;

    /// KernelBench's cached-output hack: the first output is kept in a global and returned
    /// for every later call. kiln draws fresh inputs for every trial and every timed run.
    const CACHED: &str = r#"
import torch
import torch.nn as nn
_CACHE = {}

class ModelNew(nn.Module):
    def forward(self, x):
        key = tuple(x.shape)
        if key not in _CACHE:
            _CACHE[key] = torch.softmax(x, dim=1).clone()
        return _CACHE[key]
"#;

    #[test]
    fn an_output_cached_by_shape_is_wrong() {
        let Some((_d, cfg, mut runner)) = hosted_setup() else {
            return;
        };
        let e = evaluate(&cfg, &fixture("kb-softmax-8x64"), CACHED, &mut runner);
        assert_eq!(e.verdict, Verdict::WrongAnswer, "{e:#?}");
    }

    /// Forking (a process that would outlive the run and write later), new namespaces, a
    /// new session, signals to the worker and network sockets are refused by the hosted
    /// filters: each fails in python, and the failure is the candidate's.
    #[test]
    fn forking_namespaces_signals_and_network_sockets_are_refused() {
        let Some((_d, cfg, mut runner)) = hosted_setup() else {
            return;
        };
        let p = fixture("kb-softmax-8x64");
        for (what, line) in [
            ("fork", "import os; os.fork()"),
            (
                "socket",
                "import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM)",
            ),
            ("kill", "import os; os.kill(os.getppid(), 19)"),
            ("setsid", "import os; os.setsid()"),
            (
                "user namespace",
                "import ctypes\n        \
                 if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:\n            \
                 raise PermissionError(ctypes.get_errno(), 'unshare')",
            ),
        ] {
            let src = SOFTMAX_HONEST.replace(
                "m = x.max(dim=1, keepdim=True).values",
                &format!("{line}\n        m = x.max(dim=1, keepdim=True).values"),
            );
            let e = evaluate(&cfg, &p, &src, &mut runner);
            assert_eq!(e.verdict, Verdict::RuntimeFault, "{what}: {e:#?}");
            let printed = e.evidence.output_excerpt.clone().unwrap_or_default();
            assert!(
                printed.contains("PermissionError") || printed.contains("Operation not permitted"),
                "{what}: {printed}"
            );
        }
    }

    /// Patching the clocks a candidate could reach changes nothing: the time is taken by
    /// the worker. This forward sleeps 3 ms and makes every python clock stand still.
    const SLOW_WITH_FROZEN_CLOCKS: &str = r#"
import time
import torch
import torch.nn as nn
_sleep = time.sleep
_frozen = time.perf_counter()
time.perf_counter = lambda: _frozen
time.monotonic = lambda: _frozen
time.time = lambda: _frozen

class ModelNew(nn.Module):
    def forward(self, x):
        _sleep(0.003)
        return torch.softmax(x, dim=1)
"#;

    #[test]
    fn patched_clocks_do_not_change_the_time() {
        let Some((_d, cfg, mut runner)) = hosted_setup() else {
            return;
        };
        let e = evaluate(
            &cfg,
            &fixture("kb-softmax-8x64"),
            SLOW_WITH_FROZEN_CLOCKS,
            &mut runner,
        );
        assert_eq!(e.verdict, Verdict::Ok, "{e:#?}");
        let t = e.timing.expect("timed");
        assert!(t.median_us >= 3000.0, "{t:?}");
    }

    /// Reading the worker's memory (where the secret seed and the reference's results
    /// live): the worker is another process, not dumpable, and the jail shows no procfs
    /// on the host. The attempt fails in python, and the failure is the candidate's.
    #[test]
    fn the_workers_memory_cannot_be_read() {
        let Some((_d, cfg, mut runner)) = hosted_setup() else {
            return;
        };
        let src = SOFTMAX_HONEST.replace(
            "m = x.max(dim=1, keepdim=True).values",
            "import os\n        \
             open(f'/proc/{os.getppid()}/mem', 'rb').read(1)\n        \
             m = x.max(dim=1, keepdim=True).values",
        );
        let e = evaluate(&cfg, &fixture("kb-softmax-8x64"), &src, &mut runner);
        assert_eq!(e.verdict, Verdict::RuntimeFault, "{e:#?}");
        let printed = e.evidence.output_excerpt.clone().unwrap_or_default();
        assert!(
            [
                "PermissionError",
                "FileNotFoundError",
                "ProcessLookupError",
                "OSError"
            ]
            .iter()
            .any(|err| printed.contains(err)),
            "{printed}"
        );
    }

    /// The runner's own empty round trip slowed (3 ms) while its forward sleeps 2 ms: were
    /// the overhead taken from the file's runner, most of the time would be subtracted.
    /// kiln times its overhead on its own echo runner, so the time stays.
    const SLOW_EMPTY_ROUND_TRIP: &str = r#"
import sys, time
import torch
import torch.nn as nn
_runner = sys.modules["__main__"]
_sleep = time.sleep
_last = {"forward": False}
_write_all = _runner.write_all

def _slow_write_all(fd, data):
    if data == b"D" and not _last["forward"]:
        _sleep(0.003)
    _last["forward"] = False
    return _write_all(fd, data)

_runner.write_all = _slow_write_all

class ModelNew(nn.Module):
    def forward(self, x):
        _last["forward"] = True
        _sleep(0.002)
        return torch.softmax(x, dim=1)
"#;

    #[test]
    fn a_slow_empty_round_trip_takes_nothing_off_the_time() {
        let Some((_d, cfg, mut runner)) = hosted_setup() else {
            return;
        };
        let e = evaluate(
            &cfg,
            &fixture("kb-softmax-8x64"),
            SLOW_EMPTY_ROUND_TRIP,
            &mut runner,
        );
        assert_eq!(e.verdict, Verdict::Ok, "{e:#?}");
        let t = e.timing.expect("timed");
        assert!(t.median_us >= 2000.0, "{t:?}");
        // Far below the file's 3 ms `E` (a loaded machine can slow kiln's own round trip).
        assert!(t.overhead_us < 2500.0, "{t:?}");
    }

    /// A thread left running after `forward` returns, writing into kiln's inputs: the
    /// runner is stopped before the inputs are checked, and any change is the candidate's.
    const THREAD_AFTER_RETURN: &str = r#"
import threading, time
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.softmax(x, dim=1)
        def later():
            time.sleep(0.0005)
            x.zero_()
        threading.Thread(target=later, daemon=True).start()
        time.sleep(0.002)
        return y
"#;

    #[test]
    fn work_left_running_after_forward_is_caught() {
        let Some((_d, cfg, mut runner)) = hosted_setup() else {
            return;
        };
        let e = evaluate(
            &cfg,
            &fixture("kb-softmax-8x64"),
            THREAD_AFTER_RETURN,
            &mut runner,
        );
        assert_eq!(e.verdict, Verdict::InputTampered, "{e:#?}");
    }

    /// Views returned instead of new tensors: the result computed in place in kiln's input
    /// and that input returned (no output of its own), or a strided view of a result.
    /// kiln copies what `forward` returns into its own outputs and hashes the inputs after
    /// every run: the first is `input_tampered`; the second is values like any other.
    const IN_PLACE_VIEW: &str = r#"
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        x.copy_(torch.softmax(x, dim=1))
        return x.view(x.shape)
"#;

    const STRIDED_VIEW: &str = r#"
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1).t().contiguous().t()
"#;

    #[test]
    fn views_returned_are_copied_and_an_input_written_in_place_is_caught() {
        let Some((_d, cfg, mut runner)) = hosted_setup() else {
            return;
        };
        let p = fixture("kb-softmax-8x64");
        let e = evaluate(&cfg, &p, IN_PLACE_VIEW, &mut runner);
        assert_eq!(e.verdict, Verdict::InputTampered, "{e:#?}");
        assert_correct(&evaluate(&cfg, &p, STRIDED_VIEW, &mut runner));
    }
}

/// The same softmax from another `load_inline` call (another name, another library).
const SOFTMAX_LOAD_INLINE_2: &str = r#"
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = """
#include <torch/extension.h>
torch::Tensor softmax_rows(torch::Tensor x) {
    return torch::softmax(x, 1);
}
"""
ops = load_inline(name="kiln_test_softmax_two", cpp_sources=CPP, functions=["softmax_rows"])

class ModelNew(nn.Module):
    def forward(self, x):
        return ops.softmax_rows(x)
"#;

/// The first hosted build with the precompiled-header folder configured builds torch's
/// extension header there (`torch-gch-<key>/torch/extension.h.gch`, a jail of its own);
/// later builds compile with it and their libraries load as before. The times are printed
/// (cold, first with the header's build, second with the header), not asserted.
#[test]
fn torchs_header_is_precompiled_once_and_later_builds_use_it() {
    let Some((_d, mut cfg, mut runner)) = hosted_setup() else {
        return;
    };
    let python = cfg.hosted.as_ref().expect("hosted").python.clone();
    if !python.with_file_name("ninja").is_file() && which_ninja().is_none() {
        eprintln!("SKIP: no ninja beside {} or on PATH", python.display());
        return;
    }
    let p = fixture("kb-softmax-8x64");
    let build = |cfg: &SandboxConfig, source: &str| {
        let started = std::time::Instant::now();
        let out = kiln_sandbox::compile(cfg, &p, &modelnew(&p, source)).expect("compile runs");
        let art = out.artifact.expect("an artifact");
        let unpacked = kiln_sandbox::engine::hosted::artifact::unpack(&art).expect("unpacks");
        assert_eq!(unpacked.libs.len(), 1, "{}", out.info.log);
        (art, started.elapsed().as_secs_f64())
    };
    let pch_dir = cfg
        .pch_dir
        .clone()
        .expect("a precompiled-header folder by default");
    cfg.pch_dir = None;
    let (_, cold) = build(&cfg, SOFTMAX_LOAD_INLINE);
    cfg.pch_dir = Some(pch_dir.clone());
    let (_, first) = build(&cfg, SOFTMAX_LOAD_INLINE);
    let folders: Vec<_> = std::fs::read_dir(&pch_dir)
        .expect("the folder")
        .flatten()
        .map(|e| e.path())
        .filter(|f| {
            f.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("torch-gch-"))
        })
        .collect();
    assert_eq!(folders.len(), 1, "{folders:?}");
    let gch = folders[0].join("torch/extension.h.gch");
    let meta = std::fs::symlink_metadata(&gch).expect("the header");
    assert!(meta.is_file() && meta.len() > 0, "{meta:?}");
    let (art, second) = build(&cfg, SOFTMAX_LOAD_INLINE_2);
    eprintln!(
        "hosted load_inline builds: {cold:.1} s cold without the header, {first:.1} s with \
         its build ({} MB), {second:.1} s with it",
        meta.len() >> 20
    );
    let c = modelnew(&p, SOFTMAX_LOAD_INLINE_2);
    let e =
        kiln_sandbox::evaluate_with(&cfg, &p, &[], &c, &art, &common::plan(), Some(&mut runner))
            .expect("evaluate runs");
    assert_correct(&e);
    assert!(
        e.evidence
            .notes
            .iter()
            .any(|n| n.contains("kiln_test_softmax_two") && n.contains("loaded from kiln's cache")),
        "{:#?}",
        e.evidence.notes
    );
}
