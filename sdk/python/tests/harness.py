"""Test harness: a real kilnd on a temporary socket and state directory.

The binary is ``$KILND_BIN``, else ``target/debug/kilnd`` in the repository (build it
with ``cargo build -p kiln-daemon``). The package under test is the source tree next
to this folder, whether or not it is installed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
REPO_ROOT = HERE.parents[2]

import kiln  # noqa: E402

#: The config every test daemon gets: short timing so evaluations are quick (the same as
#: the Rust tests' FAST_CONFIG).
FAST_CONFIG = """
[evaluation]
trials = 2
run_timeout_ms = 2000
compile_timeout_secs = 20
[evaluation.timing]
warmup = 1
min_samples = 5
min_time_ms = 5.0
max_rse = 0.05
max_samples = 200
wall_cap_ms = 500.0
recheck_fraction = 0.2
"""


def kilnd_binary() -> Path:
    """The kilnd to test; raises with the build command when there is none."""
    env = os.environ.get("KILND_BIN")
    path = Path(env) if env else REPO_ROOT / "target" / "debug" / "kilnd"
    if not path.is_file():
        raise RuntimeError(
            f"no kilnd binary at {path}: build it with `cargo build -p kiln-daemon` "
            "(from the repository root) or point KILND_BIN at one"
        )
    return path


class Daemon:
    """A running kilnd, stopped by :meth:`stop`."""

    def __init__(self, extra_config: str = "") -> None:
        # Unix socket paths are limited to ~107 bytes: keep the folder short.
        self.dir = Path(tempfile.mkdtemp(prefix="kiln-py-"))
        self.socket = self.dir / "kiln.sock"
        self.state = self.dir / "state"
        self.config = self.dir / "kiln.toml"
        self.config.write_text(FAST_CONFIG + "\n" + extra_config)
        self.log_path = self.dir / "kilnd.log"
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self._start()

    def _start(self) -> None:
        env = dict(os.environ, KILN_LOG="info,kiln_daemon=debug")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(kilnd_binary()),
                    "--socket", str(self.socket),
                    "--state-dir", str(self.state),
                    "--config", str(self.config),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kilnd exited early ({self.proc.returncode}); log:\n{self.log()}")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(str(self.socket))
                return
            except OSError:
                time.sleep(0.02)
            finally:
                s.close()
        self.stop()
        raise RuntimeError(f"kilnd did not come up; log:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def client(self, **kw: Any) -> kiln.Client:
        return kiln.Client(self.socket, **kw)

    def async_client(self, **kw: Any) -> kiln.AsyncClient:
        return kiln.AsyncClient(self.socket, **kw)

    def host_backend(self) -> Tuple[bool, str]:
        """Whether ``/v1/info`` says the host backend is usable, and its detail."""
        return self.backend("host")

    def backend(self, name: str) -> Tuple[bool, str]:
        """Whether ``/v1/info`` says backend ``name`` is usable, and its detail."""
        b = self.client().info().backend(name)
        return (b.usable, b.detail) if b else (False, f"kilnd has no {name} backend")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


REFERENCE_SOURCE = (
    "void ref_double(const float *x, float *y, int n) "
    "{ for (int i = 0; i < n; i++) y[i] = (float)(2.0 * (double)x[i]); }\n"
)
SEED_SOURCE = "void double_it(const float *x, float *y, int n) { for (int i = 0; i < n; i++) y[i] = 2.0f * x[i]; }\n"


def has_toml_parser() -> bool:
    """Whether problem.toml can be read here (tomllib on 3.11+, or tomli installed)."""
    try:
        kiln.problem_folder._toml_loads()
    except kiln.ProblemFolderError:
        return False
    return True


def write_double_problem(parent: Path, name: str) -> Path:
    """Writes a tiny host problem ``name`` (y = 2x over 1024 floats) into ``parent``."""
    p = parent / name
    p.mkdir(parents=True, exist_ok=True)
    (p / "problem.toml").write_text(
        f'''
name = "{name}"
summary = "y = 2x"
[[tensor]]
name = "x"
dtype = "f32"
shape = [1024]
role = "input"
[[tensor]]
name = "y"
dtype = "f32"
shape = [1024]
role = "output"
[tolerance]
atol = 1e-6
rtol = 1e-6
[reference.host]
file = "reference.c"
launches = [{{ kernel = "ref_double", args = ["x", "y", {{ i32 = 1024 }}] }}]
[seed.host]
file = "seed.c"
launches = [{{ kernel = "double_it", args = ["x", "y", {{ i32 = 1024 }}] }}]
'''
    )
    (p / "reference.c").write_text(REFERENCE_SOURCE)
    (p / "seed.c").write_text(SEED_SOURCE)
    return p


def double_problem_spec(name: str) -> Dict[str, Any]:
    """The spec :func:`kiln.load_problem` reads from :func:`write_double_problem`'s folder."""

    def kernel(file: str, source: str, fn: str) -> Dict[str, Any]:
        return {"file": file, "source": source, "launches": [{"kernel": fn, "args": ["x", "y", {"i32": 1024}]}]}

    return {
        "name": name,
        "summary": "y = 2x",
        "tensor": [
            {"name": "x", "dtype": "f32", "shape": [1024], "role": "input"},
            {"name": "y", "dtype": "f32", "shape": [1024], "role": "output"},
        ],
        "tolerance": {"atol": 1e-6, "rtol": 1e-6},
        "reference": {"host": kernel("reference.c", REFERENCE_SOURCE, "ref_double")},
        "seed": {"host": kernel("seed.c", SEED_SOURCE, "double_it")},
    }


KNOB_SEED_SOURCE = """// @knob UNROLL 1|2
#define UNROLL 1
void double_it(const float *x, float *y, int n) {
    int i = 0;
    for (; i + UNROLL <= n; i += UNROLL)
        for (int k = 0; k < UNROLL; k++) y[i + k] = 2.0f * x[i + k];
    for (; i < n; i++) y[i] = 2.0f * x[i];
}
"""


def knob_problem_spec(name: str) -> Dict[str, Any]:
    """The double problem with a seed kernel carrying one knob of two values, for the
    example proposer (which tries every value of the seed's first knob)."""
    spec = double_problem_spec(name)
    spec["seed"]["host"]["source"] = KNOB_SEED_SOURCE
    return spec


CUDA_LAUNCH = {"kernel": "k", "grid": [4, 1, 1], "block": [256, 1, 1], "args": ["x", "y", {"i32": 1024}]}


def cuda_problem_spec(name: str) -> Dict[str, Any]:
    """The double problem with a cuda reference too (for the cuda backend's queue)."""
    spec = double_problem_spec(name)
    spec["reference"]["cuda"] = {
        "file": "reference.cu",
        "source": 'extern "C" __global__ void k(const float *x, float *y, int n) '
        "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 2.0f * x[i]; }\n",
        "launches": [CUDA_LAUNCH],
    }
    return spec


def cuda_candidate(problem: str, tag: str) -> Dict[str, Any]:
    """A cuda candidate for :func:`cuda_problem_spec`'s problem; ``tag`` makes it distinct."""
    return {
        "problem": problem,
        "language": "cuda",
        "source": f"/* {tag} */\n"
        'extern "C" __global__ void k(const float *x, float *y, int n) '
        "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] + x[i]; }\n",
        "launches": [CUDA_LAUNCH],
    }


def proposer_wasm() -> Optional[Path]:
    """The example proposer component: ``$KILN_TEST_PROPOSER``, else where the Rust
    tests (target/plugin-guests) or a release build of proposers/example-minimal put it."""
    env = os.environ.get("KILN_TEST_PROPOSER")
    if env:
        return Path(env)
    for sub in ("target/plugin-guests/wasm32-wasip2/release", "target/wasm32-wasip2/release"):
        path = REPO_ROOT / sub / "kiln_example_minimal.wasm"
        if path.is_file():
            return path
    return None


def register_double(client: kiln.Client, parent: Path, name: str) -> Path:
    """Writes the double problem's folder and registers it: from the folder where
    problem.toml can be read here, else from the same spec built in Python."""
    folder = write_double_problem(parent, name)
    added = client.add_problem(folder if has_toml_parser() else double_problem_spec(name))
    assert added.created, added
    return folder


#: A correct body for :func:`double_candidate`.
HONEST = "for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];"
#: A body that does not compile.
BROKEN = "for (int i = 0; i < n; i++) y[i] = 2.0f * x[i]  /* missing semicolon */ }"
#: A body that compiles and computes the wrong thing.
WRONG = "for (int i = 0; i < n; i++) y[i] = 3.0f * x[i];"


def double_source(body: str, tag: str = "") -> str:
    """C source of a kernel ``k(x, y, n)`` with ``body``; ``tag`` makes the source distinct."""
    comment = f"/* {tag} */\n" if tag else ""
    return f"{comment}void k(const float *x, float *y, int n) {{ {body} }}\n"


def double_candidate(problem: str, body: str, tag: str = "") -> Dict[str, Any]:
    """A host candidate for the double problem with a given body."""
    return {
        "problem": problem,
        "language": "c",
        "source": double_source(body, tag),
        "launches": [{"kernel": "k", "args": ["x", "y", {"i32": 1024}]}],
    }


def unique(prefix: str) -> str:
    """A problem name not used before in this test run."""
    unique.counter += 1  # type: ignore[attr-defined]
    return f"{prefix}-{os.getpid()}-{unique.counter}"  # type: ignore[attr-defined]


unique.counter = 0  # type: ignore[attr-defined]
