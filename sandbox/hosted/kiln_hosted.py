#!/usr/bin/env python3
"""kiln's hosted runner: a KernelBench `ModelNew` file run as written, in a jailed process.

The process is hostile from the candidate's first import: everything it writes is a claim.
It computes no verdict and no time. kiln's trusted worker (sandbox/src/engine/host/
runner_ctl.rs) spawns it as

    python -I -B kiln_hosted.py serve

through `kiln-worker hosted-runner` (seccomp filters loaded before the exec), writes the
inputs, parameters and buffers into shared memory, sends a one-byte command, takes the
time on its own clock until this process answers `D`, stops it (SIGSTOP) and reads and
compares the outputs itself. kiln's compile step runs it once before, with no GPU and no
descriptors, as

    python -I -B kiln_hosted.py build SOURCE RECORD INIT_INPUTS_JSON

to build the file's load_inline libraries ahead (see "load_inline builds" below), and,
once per torch version and host compiler, with no candidate file at all, as

    python -I -B kiln_hosted.py gch OUTDIR

to precompile torch's extension header into OUTDIR/torch/extension.h.gch (see
"precompiled header" below), which later builds find through CPATH. kiln's lift (a
ModelNew file turned into a kiln launch plan, issue 29) runs it as

    python -I -B kiln_hosted.py device-source FILE [OUT]

to write the CUDA device sources of FILE's load_inline calls and its Triton source as one
JSON object to OUT (stdout without it):
{"error": null or why, "sources": [{"source", "kernels", "flags", "names_skipped"}],
"triton": null or {"source", "kernels"}}, the torch/pybind host wrapper removed, and the
`@triton.jit` functions (less their autotune/heuristics decorators) with the imports and
constexpr constants they use, by kiln_extract.py (beside this script, standard library
only). FILE is read as text: nothing of it is imported or run; a file over 1 MiB is an
error. Exit 0, also when "error" is set (2: bad usage).

Descriptors, set up by the worker before the exec:

  0  /dev/null
  1  the capture pipe (capped by the worker), and 2 the same: prints go there
  3  go (worker -> runner): one setup message, then one-byte commands
  4  done (runner -> worker): one ready message, then one b"D" per command
  5  fault (unused here; left open)
  6  the memfd holding every buffer, mapped shared here (map_len bytes; cpu)
  7… on cuda: one exported allocation per tensor (the setup's "fd"), mapped with the CUDA
     driver, then closed before the candidate's file is imported

Messages use kiln's framing (sandbox/protocol/framing.json, its one spec): a u32
little-endian length and a compact JSON envelope {"blobs": 0, "body": {...}}; the setup
and the ready message carry no blobs.

Setup (body; unknown keys are ignored):

  {"source": "/scratch/candidate.py", "device": "cpu",
   "map_len": N, "slots": S, "slot_bytes": B,
   "tensors": [{"name", "dtype", "shape", "role", "offset", "bytes"}, ...],
   "forward": [names], "outputs": [names], "state": {module name: kiln name},
   "bool_tensors": [names], "init_inputs": "[json]", "threads": 1,
   "prebuilt": "/scratch" (optional: the folder of the compile step's load_inline libraries)}

  A tensor's copy in slot j starts at offset + j * slot_bytes; dtypes are f32 f64 f16
  bf16 i32 i64 u8; a 0-d tensor is [1]. On "device": "cuda" there is one slot, and each
  tensor gives "fd" and "mapped" (the allocation's bytes) instead of "offset"/"bytes".

Order: setup; the buffers mapped and viewed as torch tensors (no copies); the file
imported as module `kiln_candidate`; torch.manual_seed(0); ModelNew(*init_inputs), moved
to the device (left in training mode, as the reference is run); its parameters and buffers checked against `state`; then

Ready (body): {"missing": [what does not match], "error": null or a reason for people,
"notes": [for people: parameters matched by order where their names differ, each
load_inline call and whether its library came from the compile step]}.
After a ready with an error the runner exits 0.

Commands (bytes on fd 3), each answered with b"D" on fd 4:

  G      run slot 0
  T n    run slots 0..n-1 in order (n: one byte, 1..slots)
  E      nothing (the timer's own overhead)
  K      one run of slot 0 under torch's profiler, answered with a message (no D):
         {"kernels": [{"name", "calls", "us"}] or null, "error": null or why}: the GPU
         kernels it launched, a claim the worker only classifies
  R      one run of slot 0 as G, with the CUDA runtime and driver API calls of its
         forward recorded through CUPTI's callback API, answered with a message and then
         D: {"error": null or why, "ops": [...], "regions": [...], "allocations": [...]},
         the lift's recording (issue 29): "ops" the outermost calls in order, each
         {"op": "launch", "api", "symbol", "grid", "block", "shared_bytes", "stream":
         "current"/"other", "cooperative", "cluster", "params": [{"offset", "size",
         "hex"}]}, {"op": "memset"/"copy", "api", "bytes", "kind" (copies)}, {"op": "sync"},
         {"op": "alloc", "api", "ptr", "bytes"} or {"op": "other", "api"}; "regions" kiln's
         tensors and forward's results as forward saw them ({"name", "role": input, weight,
         buffer or output, "ptr", "bytes"}, "contiguous" for outputs); "allocations" the
         blocks torch's allocator handed out during forward ({"ptr", "bytes"}; when they
         cannot be read, "allocations_error" says why); "triton" every Triton launch
         (JITFunction.run, while the file's triton is loaded), in order: {"kernel", "grid"
         (3 dims, a callable grid evaluated as Triton does), "args": [{"name", "constexpr",
         "kind": tensor ("ptr", "contiguous", "dtype"), int, float, bool, str, dtype
         ("value"), none or other ("type")}], "num_warps", "num_stages", "num_ctas",
         "options" (any other compile option given)}. On the cpu, forward runs unrecorded
         and "error" says so.
  Q      answer D, then exit 0 (EOF on fd 3: exit 0)

A run binds slot j's tensors to the module (parameters' .data: no copies; buffers replaced
in their module by copies, since a module may update them in place), calls forward on slot j's inputs under torch.no_grad() and copies what
it returns into slot j's outputs. Exit 1: forward raised (its traceback on stderr). Exit 3:
forward returned the wrong number of tensors, something else, or a tensor of the wrong
size (a `kiln:` line on stderr). Exit 2: a command kiln does not send.

Only torch and the standard library: no network, no subprocess, no threads of its own
(the candidate's file may start compilers: load_inline and Triton do, on cuda).
"""

import ctypes
import json
import mmap
import os
import re
import struct
import sys

GO_FD, DONE_FD, FAULT_FD, MAP_FD = 3, 4, 5, 6
# kiln's framing: sandbox/protocol/framing.json is its one spec.
MAX_FRAME = 512 << 20
MAX_FRAMES_PER_BLOB = 512
MAX_BLOBS = 8
# The ready frame must stay well under the worker's limit for it (1 MiB).
ERROR_CHARS = 4096
MISSING_MAX = 64
# The kernel list a K answers with: its longest names and most entries.
KERNEL_NAME_CHARS = 300
KERNELS_MAX = 200
DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16",
          "i32": "int32", "i64": "int64", "u8": "uint8"}


class SetupError(Exception):
    """Why the runner cannot run the file (the ready message's error)."""

    def __init__(self, error, missing=()):
        super().__init__(error)
        self.missing = list(missing)


# ---- kiln's framing, over raw descriptors -----------------------------------------------


def read_exact(fd, n):
    """`n` bytes of `fd`; EOFError when it ends first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            raise EOFError
        got += k
    return buf


def write_all(fd, data):
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def read_frame(fd, max_frame=MAX_FRAME):
    (n,) = struct.unpack("<I", read_exact(fd, 4))
    if n > max_frame:
        raise ValueError(f"frame of {n} bytes exceeds the limit of {max_frame}")
    return read_exact(fd, n)


def read_message(fd, max_frame=MAX_FRAME):
    """(body, blobs); a blob spans the envelope's `frames` count of frames."""
    env = json.loads(read_frame(fd))
    n = int(env.get("blobs", 0))
    if n > MAX_BLOBS:
        raise ValueError(f"{n} blobs announced; at most {MAX_BLOBS} are allowed")
    frames = env.get("frames") or [1] * n
    if len(frames) != n or any(not 1 <= int(k) <= MAX_FRAMES_PER_BLOB for k in frames):
        raise ValueError(f"bad frame counts {frames} for {n} blobs")
    blobs = []
    for k in frames:
        parts = [read_frame(fd, max_frame) for _ in range(int(k))]
        blobs.append(parts[0] if len(parts) == 1 else bytearray().join(parts))
    return env["body"], blobs


def write_message(fd, body, blobs=(), max_frame=MAX_FRAME):
    """A message (compact JSON envelope, keys in the spec's order, as kiln writes it)."""
    views = [memoryview(b).cast("B") for b in blobs]
    frames = [max(1, -(-len(v) // max_frame)) for v in views]
    env = {"blobs": len(views)}
    if any(k > 1 for k in frames):
        env["frames"] = frames
    env["body"] = body
    head = json.dumps(env, separators=(",", ":")).encode()
    out = [struct.pack("<I", len(head)), head]
    for v in views:
        if len(v) == 0:
            out.append(struct.pack("<I", 0))
        for at in range(0, len(v), max_frame):
            piece = v[at : at + max_frame]
            out += [struct.pack("<I", len(piece)), piece]
    for part in out:
        write_all(fd, part)


# ---- small helpers ----------------------------------------------------------------------


def leave(code):
    """Exits now (no atexit hooks or threads of the candidate's to wait for)."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:  # noqa: BLE001 - a closed or replaced stream: nothing to flush
            pass
    os._exit(code)


def clip(text, limit):
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_exception(e, limit=ERROR_CHARS):
    """`Type: message`, then the traceback's last lines, in at most `limit` characters."""
    import traceback

    try:
        head = clip(f"{type(e).__name__}: {e}", 1024)
        tail = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
    except BaseException:  # noqa: BLE001 - an exception whose str() raises
        return type(e).__name__
    room = max(0, limit - len(head) - 5)
    if len(tail) > room:
        tail = "..." + tail[len(tail) - room + 3 :]
    return f"{head}\n{tail}"


def numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


# ---- the buffers: where kiln's tensors live ---------------------------------------------


class CpuBuffers:
    """kiln's tensors in the worker's memfd (fd 6), mapped shared: `views[j][name]` is slot
    j's copy of tensor `name`, a torch tensor over the mapping itself (no copy)."""

    device = "cpu"

    def __init__(self, torch, setup, fd=MAP_FD):
        map_len = int(setup["map_len"])
        slots, slot_bytes = int(setup["slots"]), int(setup["slot_bytes"])
        if not 1 <= slots <= 255:
            raise SetupError(f"setup: {slots} slots (1..255)")
        self.map = mmap.mmap(fd, map_len, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.views = [{} for _ in range(slots)]
        for t in setup["tensors"]:
            dtype = getattr(torch, DTYPES.get(t["dtype"], ""), None)
            if not isinstance(dtype, torch.dtype):
                raise SetupError(f"setup: tensor {t['name']!r} has dtype {t['dtype']!r}")
            shape = [int(d) for d in t["shape"]] or [1]
            n = numel(shape)
            size = n * torch.empty((), dtype=dtype).element_size()
            offset = int(t["offset"])
            if size != int(t["bytes"]) or offset < 0 or offset + (slots - 1) * slot_bytes + size > map_len:
                raise SetupError(f"setup: tensor {t['name']!r} ({size} bytes at {offset}) does not fit the map")
            for j in range(slots):
                if n == 0:
                    view = torch.empty(shape, dtype=dtype)
                else:
                    view = torch.frombuffer(self.map, dtype=dtype, count=n, offset=offset + j * slot_bytes)
                self.views[j][t["name"]] = view.view(shape)


class CudaBuffers:
    """kiln's tensors on the lane's GPU: the worker's allocations, exported as shareable
    handles (one descriptor each, from fd 7 on, as the setup lists them), imported and
    mapped here with the CUDA driver, then the descriptors closed before the candidate's
    file is imported (so nothing it starts later can map them again). `views[0][name]`
    is a torch tensor over the mapping itself (no copy); there is one slot."""

    device = "cuda"
    POSIX_FD = 1
    LOCATION_DEVICE = 1
    READ_WRITE = 3

    def __init__(self, torch, setup):
        import ctypes

        class Location(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

        class AccessDesc(ctypes.Structure):
            _fields_ = [("location", Location), ("flags", ctypes.c_int)]

        lib = ctypes.CDLL("libcuda.so.1")
        u64, size_t, ptr_t = ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_void_p
        sigs = {
            "cuMemImportFromShareableHandle": [ctypes.POINTER(u64), ptr_t, ctypes.c_int],
            "cuMemAddressReserve": [ctypes.POINTER(u64), size_t, size_t, u64, u64],
            "cuMemMap": [u64, size_t, size_t, u64, u64],
            "cuMemSetAccess": [u64, size_t, ctypes.POINTER(AccessDesc), size_t],
            "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
            "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        }
        cu = {}
        for name, args in sigs.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = args, ctypes.c_int
            cu[name] = f

        def check(what, code):
            if code != 0:
                name = ctypes.c_char_p()
                cu["cuGetErrorName"](code, ctypes.byref(name))
                raise SetupError(f"mapping kiln's tensors: {what}: {(name.value or b'error %d' % code).decode()}")

        if int(setup.get("slots", 1)) != 1:
            raise SetupError("setup: a cuda runner has one slot")
        torch.zeros(1, device="cuda")  # the primary context exists and is current
        dev = ctypes.c_int()
        check("cuDeviceGet", cu["cuDeviceGet"](ctypes.byref(dev), torch.cuda.current_device()))
        desc = AccessDesc(Location(self.LOCATION_DEVICE, dev.value), self.READ_WRITE)
        self.views = [{}]
        fds = []
        try:
            for t in setup["tensors"]:
                fd, mapped = int(t["fd"]), int(t["mapped"])
                fds.append(fd)
                dtype = getattr(torch, DTYPES.get(t["dtype"], ""), None)
                if not isinstance(dtype, torch.dtype):
                    raise SetupError(f"setup: tensor {t['name']!r} has dtype {t['dtype']!r}")
                shape = [int(d) for d in t["shape"]] or [1]
                nbytes = numel(shape) * torch.empty((), dtype=dtype).element_size()
                if nbytes > mapped:
                    raise SetupError(f"setup: tensor {t['name']!r}: {nbytes} bytes exceed its {mapped}-byte mapping")
                handle, ptr = ctypes.c_ulonglong(), ctypes.c_ulonglong()
                check("cuMemImportFromShareableHandle", cu["cuMemImportFromShareableHandle"](
                    ctypes.byref(handle), ctypes.c_void_p(fd), self.POSIX_FD))
                check("cuMemAddressReserve", cu["cuMemAddressReserve"](ctypes.byref(ptr), mapped, 0, 0, 0))
                check("cuMemMap", cu["cuMemMap"](ptr.value, mapped, 0, handle.value, 0))
                check("cuMemSetAccess", cu["cuMemSetAccess"](ptr.value, mapped, ctypes.byref(desc), 1))

                class Span:
                    __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                                "data": (ptr.value, False), "version": 3}

                view = torch.as_tensor(Span(), device="cuda") if nbytes else torch.empty(0, device="cuda")
                self.views[0][t["name"]] = view.view(dtype).reshape(shape)
        finally:
            # The mappings stay; the descriptors go, before any of the candidate's code runs.
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass


# The tensor source by device; the rest of the runner is the same for both.
BUFFERS = {"cpu": CpuBuffers, "cuda": CudaBuffers}


def check_device(device):
    """Decided before torch's import: nothing to load for a device this runner lacks."""
    if device not in BUFFERS:
        raise SetupError(f"hosted runner: unknown device {device!r}")


# ---- load_inline builds: made at compile, loaded at run ---------------------------------
#
# kiln's compile step runs this script as `build` (no GPU, the lane's architecture in
# TORCH_CUDA_ARCH_LIST): the file is imported and ModelNew built on the meta device, and
# every torch.utils.cpp_extension.load_inline call builds into RECORD/<key>/, where <key>
# is a hash of the call's arguments. kiln keeps the <name>.so files as the file's compile
# artifact (its compile cache is keyed on the whole file). At run, `serve` with the
# setup's "prebuilt" folder loads a call's library from PREBUILT/kiln-prebuilt-<key>-
# <name>.so when there is one, and builds as usual when there is none. Both sides are the candidate's own
# process: a library is only ever loaded by the file whose compile made it.

BUILD_KEY_SKIP = ("verbose", "build_directory")
SO_NAME_CHARS = 128


def build_key(arguments):
    """The hash of one load_inline call's arguments (as bound, defaults not filled in),
    leaving out what does not change the library."""
    import hashlib

    doc = {k: v for k, v in arguments.items() if k not in BUILD_KEY_SKIP}
    text = json.dumps(doc, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def prebuilt_name(key, name):
    """A prebuilt library's file name in the setup's "prebuilt" folder (flat: the worker
    writes no folders)."""
    return f"kiln-prebuilt-{key}-{name}.so"


def load_prebuilt(torch, name, path, is_python_module):
    """The library at `path` loaded as load_inline would load what it built."""
    if not is_python_module:
        torch.ops.load_library(path)
        return path
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def keep_builds(torch, prebuilt=None, record=None):
    """Wraps torch.utils.cpp_extension.load_inline (before the file is imported, so that
    `from ... import load_inline` gets the wrapper): a call whose library is in
    `prebuilt` loads it; with `record`, a call builds into record/<key>/. Returns the
    notes (for people) the calls leave: one per call."""
    import inspect
    import torch.utils.cpp_extension as ext

    real = ext.load_inline
    signature = inspect.signature(real)
    notes = []

    def load_inline(*args, **kwargs):
        try:
            arguments = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return real(*args, **kwargs)  # torch says what is wrong with the call
        name = str(arguments.get("name", ""))
        key = build_key(arguments)
        is_module = arguments.get("is_python_module", True)
        so = f"{name}.so"
        if prebuilt and len(so) <= SO_NAME_CHARS:
            path = os.path.join(prebuilt, prebuilt_name(key, name))
            if os.path.isfile(path):
                notes.append(f"load_inline {clip(name, 80)!r}: built at compile, loaded from kiln's cache")
                return load_prebuilt(torch, name, path, is_module)
        if record:
            kwargs = dict(arguments)
            kwargs["build_directory"] = os.path.join(record, key)
            os.makedirs(kwargs["build_directory"], exist_ok=True)
            notes.append(f"load_inline {clip(name, 80)!r}: built into {key}")
            return real(**kwargs)
        if prebuilt is not None:
            notes.append(f"load_inline {clip(name, 80)!r}: not built at compile; built now")
        return real(*args, **kwargs)

    load_inline.__wrapped__ = real
    ext.load_inline = load_inline
    return notes


def build(source, record, init_inputs):
    """`build`: the file imported and ModelNew built (on the meta device) so that its
    load_inline calls build into `record`. Nothing here is a verdict: what failed is
    printed for people, and the run builds it again (and says why it fails)."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"kiln build: python cannot import torch: {describe_exception(e)}")
        return 0
    notes = keep_builds(torch, record=record)
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        pretend_cuda(torch)
    try:
        module = load_candidate(source)
        init = json.loads(init_inputs) if init_inputs else []
        cls = getattr(module, "ModelNew", None)
        if isinstance(cls, type) and isinstance(init, list):
            with torch.device("meta"):
                cls(*(as_args(v) for v in init))
    except BaseException as e:  # noqa: BLE001 - the run reports it
        print(f"kiln build: {clip(str(e), ERROR_CHARS)}")
    for n in notes:
        print(f"kiln build: {n}")
    return 0


# ---- precompiled header -----------------------------------------------------------------
#
# Every C++ file load_inline writes begins with `#include <torch/extension.h>`, and parsing
# it is most of the file's compile. `gch` compiles that header once, with the flags torch
# gives a load_inline C++ file here, into OUTDIR/torch/extension.h.gch; a build with
# CPATH=OUTDIR finds it before the header (GCC tries `<name>.gch` in each include folder
# first) and ignores it silently when it does not fit (a different flag or compiler): a
# mismatch costs time only. kiln runs this in a compile jail of its own, with its own text
# only (no candidate's), and shows OUTDIR read-only to every later build.

GCH_PROBE = "kiln_gch_probe"
GCH_MAX_LOG = 4000


class _NinjaWritten(Exception):
    """Raised in place of torch's ninja run: the probe needs its build file only."""


def probe_cflags(torch_ext, tmp):
    """The flags torch compiles a load_inline C++ file with, read from the build.ninja of a
    trivial load_inline in `tmp` (the extension's name left out), and the compiler torch
    would run. torch's ninja run is skipped when it can be (the file is written first)."""
    real = getattr(torch_ext, "_run_ninja_build", None)

    def written(*args, **kwargs):
        raise _NinjaWritten()

    if real is not None:
        torch_ext._run_ninja_build = written
    try:
        torch_ext.load_inline(name=GCH_PROBE, cpp_sources="int kiln_probe(int x) { return x; }",
                              functions=["kiln_probe"], build_directory=tmp, verbose=False)
    except _NinjaWritten:
        pass
    finally:
        if real is not None:
            torch_ext._run_ninja_build = real
    with open(os.path.join(tmp, "build.ninja")) as f:
        lines = f.read().splitlines()
    values = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and not line.startswith((" ", "\t")):
            values.setdefault(key.strip(), value.strip())
    if "cflags" not in values:
        raise RuntimeError("torch's build.ninja has no cflags line")
    import shlex
    flags = [f for f in shlex.split(values["cflags"]) + shlex.split(values.get("post_cflags", ""))
             if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    return flags


def gch(outdir):
    """`gch`: torch's extension header precompiled into OUTDIR/torch/extension.h.gch. Exit
    0 when the file is there, else nonzero with the reason printed."""
    import tempfile
    import time
    started = time.monotonic()
    try:
        import torch  # noqa: F401
        import torch.utils.cpp_extension as torch_ext
    except Exception as e:  # noqa: BLE001
        print(f"kiln gch: python cannot import torch: {describe_exception(e)}")
        return 1
    header = None
    for d in torch_ext.include_paths():
        if os.path.isfile(os.path.join(d, "torch", "extension.h")):
            header = os.path.join(d, "torch", "extension.h")
            break
    if header is None:
        print("kiln gch: torch/extension.h is not in torch's include folders")
        return 1
    with tempfile.TemporaryDirectory(prefix="kiln-gch-") as tmp:
        try:
            flags = probe_cflags(torch_ext, tmp)
        except Exception as e:  # noqa: BLE001
            print(f"kiln gch: the probe build did not give torch's flags: {describe_exception(e)}")
            return 1
    # As torch picks it (cpp_extension.get_cxx_compiler).
    cxx = os.environ.get("CXX", "c++")
    os.makedirs(os.path.join(outdir, "torch"), exist_ok=True)
    out = os.path.join(outdir, "torch", "extension.h.gch")
    command = [cxx, "-x", "c++-header", *flags, header, "-o", out]
    print("kiln gch: " + " ".join(command))
    sys.stdout.flush()
    import subprocess
    done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace")
    if done.returncode != 0:
        print(clip(done.stdout, GCH_MAX_LOG))
        print(f"kiln gch: {cxx} exited with {done.returncode}")
        return 1
    if not os.path.isfile(out):
        print(f"kiln gch: {cxx} wrote no {out}")
        return 1
    print(f"kiln gch: {os.path.getsize(out)} bytes in {time.monotonic() - started:.1f} s")
    return 0


def pretend_cuda(torch):
    """For a GPU lane's build (no GPU in the compile jail): `torch.cuda.is_available()`
    answers True, so a file that builds its extension only when CUDA is there (`if
    torch.cuda.is_available(): load_inline(...)`) builds it here as it would on the lane.
    Anything that needs the device itself still fails, and the run builds what is missing."""
    torch.cuda.is_available = lambda: True


# ---- the candidate ----------------------------------------------------------------------


def load_candidate(path):
    """The file imported as module `kiln_candidate` (in sys.modules, `__file__` set)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kiln_candidate", path)
    if spec is None or spec.loader is None:
        raise SetupError(f"cannot load {path} as a python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["kiln_candidate"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:  # noqa: BLE001 - SystemExit too: the file failed to import
        raise SetupError(f"the file raised on import: {describe_exception(e)}") from None
    return module


def as_args(value):
    """A stored get_init_inputs() value (JSON) as the file returned it: lists as tuples."""
    if isinstance(value, list):
        return tuple(as_args(v) for v in value)
    return value


def build_model(torch, module, setup, device):
    cls = getattr(module, "ModelNew", None)
    if cls is None:
        raise SetupError("the file defines no ModelNew")
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise SetupError("ModelNew is not a subclass of torch.nn.Module")
    init = setup.get("init_inputs") or "[]"
    init = json.loads(init) if isinstance(init, str) else init
    if not isinstance(init, list):
        raise SetupError(f"setup: init_inputs {clip(repr(init), 200)} is not a list")
    try:
        torch.manual_seed(0)
        # As the trusted runner builds the reference Model: nested lists as tuples, the
        # way KernelBench's get_init_inputs() returns them.
        model = cls(*(as_args(v) for v in init))
        model.to(device)
        # Left in the mode it was built in (training), as the reference Model is run by
        # kiln's torch runner and by KernelBench: BatchNorm then uses the batch's
        # statistics in both.

    except BaseException as e:  # noqa: BLE001 - the reason is the answer
        raise SetupError(f"ModelNew(*get_init_inputs()) raised: {describe_exception(e)}") from None
    return model


def check_state(model, setup, shapes):
    """Where kiln's weights go: {module name: (kind, the module's tensor, kiln's tensor)},
    and notes for people.

    By name first: every key of `state` is a parameter or buffer of the model of the kiln
    tensor's size, and every parameter is set by kiln (else it keeps its own random init);
    extra buffers are the module's own. Where names differ, by order, as KernelBench's own
    check lets them differ (it seeds torch before building each model, so the n-th
    parameter created gets the same values): the problem's tensors the names left unmatched
    (in the problem's order: the reference's parameters, then its floating buffers) pair
    with the model's unmatched parameters, then floating buffers, in creation order, when
    every parameter is paired (extra buffers stay the model's) and each pair has the same
    number of elements."""
    state = setup.get("state") or {}
    try:
        return by_name(model, state, shapes), []
    except SetupError as by_name_failed:
        order = [t["name"] for t in setup.get("tensors", [])]
        paired = by_order(model, state, shapes, order)
        if paired is None:
            raise by_name_failed from None
        renamed = [f"{p}<-{ref}" for p, ref, _ in paired[1]]
        note = ("ModelNew's parameters matched the problem's by order, as their names differ "
                f"({clip(', '.join(renamed), 600)})")
        return paired[0], [note]


def by_name(model, state, shapes):
    params = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers(remove_duplicate=False))
    missing, found = [], {}
    for pname, tname in state.items():
        kind, t = ("parameter", params[pname]) if pname in params else ("buffer", buffers.get(pname))
        if t is None:
            missing.append(f"no parameter or buffer {pname!r}")
        elif tname not in shapes:
            missing.append(f"{kind} {pname!r} is set from {tname!r}, which is no tensor of the problem")
        elif t.numel() != numel(shapes[tname]):
            missing.append(f"{kind} {pname!r} has {t.numel()} elements, kiln's tensor {tname!r} has "
                           f"{numel(shapes[tname])}")
        else:
            found[pname] = (kind, t, tname)
    covered = {id(params[n]) for n in state if n in params}
    for pname, p in model.named_parameters():
        if id(p) not in covered:
            missing.append(f"parameter {pname!r} is not one of the problem's")
    if missing:
        shown = [clip(m, 300) for m in missing[:MISSING_MAX]]
        if len(missing) > MISSING_MAX:
            shown.append(f"... and {len(missing) - MISSING_MAX} more")
        more = f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""
        raise SetupError("ModelNew's parameters and buffers do not match the problem's: "
                         + "; ".join(missing[:8]) + more, shown)
    return found


def by_order(model, state, shapes, order):
    """({module name: (kind, tensor, kiln name)}, [(module name, reference name, kiln
    name)]) pairing by creation order what the names left unmatched, or None."""
    params = list(model.named_parameters())
    buffers = [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]
    named = dict(params)
    named.update(dict(model.named_buffers()))
    inverse = {tname: pname for pname, tname in state.items()}
    found, taken = {}, set()
    for pname, tname in state.items():
        t = named.get(pname)
        if t is not None and tname in shapes and t.numel() == numel(shapes[tname]):
            found[pname] = ("parameter" if any(t is p for _, p in params) else "buffer", t, tname)
            taken.add(id(t))
    pending = [(inverse[t], t) for t in order if t in inverse and inverse[t] not in found]
    free_params = [(n, "parameter", p) for n, p in params if id(p) not in taken]
    free_buffers = [(n, "buffer", b) for n, b in buffers if id(b) not in taken]
    # Every parameter set (none keeps its own init), then buffers for what is left (a model
    # may keep buffers of its own).
    rest = len(pending) - len(free_params)
    if not pending or rest < 0 or rest > len(free_buffers):
        return None
    paired = []
    for (ref, tname), (name, kind, t) in zip(pending, free_params + free_buffers[:rest]):
        if tname not in shapes or t.numel() != numel(shapes[tname]):
            return None
        found[name] = (kind, t, tname)
        paired.append((name, ref, tname))
    return found, paired


class Runs:
    """The model bound to each slot: per slot, precomputed once, what a run sets and reads,
    so the timed window holds little besides forward."""

    def __init__(self, torch, model, buffers, setup, found, sync):
        self.torch, self.model, self.buffers = torch, model, buffers
        # Taken before the file was imported, so a file that replaces
        # torch.cuda.synchronize does not replace this runner's wait (a file can still
        # reach native code: the worker's own checks do not rely on this wait).
        self.sync = sync
        bools = set(setup.get("bool_tensors") or [])
        constants = setup.get("constants") or {}
        self.outputs = list(setup["outputs"])
        # For R's regions: forward's arguments by name, and kiln's inputs that are no
        # parameter or buffer of the module.
        self.arg_names = list(setup["forward"])
        state_names = {tname for _, _, tname in found.values()}
        self.inputs = [t["name"] for t in setup["tensors"]
                       if t.get("role") == "input" and t["name"] not in state_names]
        self.plans = []
        for views in buffers.views:
            params, bufs = [], []
            for pname, (kind, t, tname) in found.items():
                view = views[tname].view(t.shape)
                if kind == "parameter":
                    params.append((t, view, tname in bools, tname))
                else:
                    owner, _, attr = pname.rpartition(".")
                    holder = model.get_submodule(owner)._buffers
                    bufs.append((holder, attr, view, tname in bools, tname))
            # A constant (a Python number forward takes) is passed as it is.
            args = [(constants[n], False) if n in constants else (views[n], n in bools)
                    for n in setup["forward"]]
            dests = [views[n] for n in self.outputs]
            self.plans.append((params, bufs, args, any(b for _, b in args), dests))

    def run(self, j, around=None):
        """One run of slot j; returns (the arguments forward got, the tensors it returned).
        `around`, when given, is a context manager entered just around forward's call
        (R's recorder): the binding before and the copies after stay outside it."""
        torch = self.torch
        params, bufs, args, any_bool, dests = self.plans[j]
        try:
            for p, view, as_bool, _ in params:
                p.data = view.bool() if as_bool else view
            # Buffers as copies: a module updates some in place (BatchNorm's running
            # statistics, in training mode), and kiln's tensors must stay as drawn (the
            # trusted reference gives its module copies too).
            for holder, attr, view, as_bool, _ in bufs:
                holder[attr] = view.bool() if as_bool else view.clone()
            call = [v.bool() if b else v for v, b in args] if any_bool else [v for v, _ in args]
            with torch.no_grad():
                if around is None:
                    out = self.model(*call)
                else:
                    with around:
                        out = self.model(*call)
            got = list(out) if isinstance(out, (tuple, list)) else [out]
        except BaseException:  # noqa: BLE001 - SystemExit too: the run failed
            import traceback

            traceback.print_exc()
            leave(1)
        if len(got) != len(dests):
            print(f"kiln: forward returned {len(got)} values; the problem has {len(dests)} outputs "
                  f"({', '.join(self.outputs)})", file=sys.stderr)
            leave(3)
        for name, dest, r in zip(self.outputs, dests, got):
            if not isinstance(r, torch.Tensor):
                print(f"kiln: output {name}: forward returned a {type(r).__name__}, not a tensor", file=sys.stderr)
                leave(3)
            if r.numel() != dest.numel():
                print(f"kiln: output {name}: forward returned shape {list(r.shape)} ({r.numel()} elements); "
                      f"the problem declares {list(dest.shape)} ({dest.numel()} elements)", file=sys.stderr)
                leave(3)
        try:
            for dest, r in zip(dests, got):
                dest.copy_(r.reshape(dest.shape))
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            leave(1)
        return call, got

    def used(self, j, call, got):
        """R's regions: the tensors the last run of slot j used, as `regions` lists them
        (forward's arguments as it got them, the parameters kiln set, the module's
        buffer copies, what forward returned)."""
        params, bufs, _, _, _ = self.plans[j]
        views = self.buffers.views[j]
        args = {n: t for n, t in zip(self.arg_names, call) if isinstance(t, self.torch.Tensor)}
        inputs = [(n, args.get(n, views[n])) for n in self.inputs]
        weights = [(tname, p) for p, _, _, tname in params]
        copies = [(tname, holder[attr]) for holder, attr, _, _, tname in bufs]
        return regions(inputs, weights, copies, list(zip(self.outputs, got)))

    def record(self, j):
        """R: one run of slot j, its CUDA API calls recorded (see `Recorder`): the answer
        of the lift's spec (issue 29, §1): {"error", "ops", "regions", "allocations"}.
        On the cpu the run is the same, unrecorded."""
        if self.buffers.device != "cuda":
            call, got = self.run(j)
            return {"error": "launches are recorded on the GPU only", "ops": [], "triton": [],
                    "regions": self.used(j, call, got), "allocations": []}
        recorder = Recorder(self.torch, self.sync)
        call, got = self.run(j, around=recorder)
        answer = recorder.answer()
        answer["regions"] = self.used(j, call, got)
        return answer

    def kernels(self, j):
        """The GPU kernels one run of slot j launched, as torch's profiler saw them in this
        process (a claim: the worker classifies them and never times with them):
        {"kernels": [{"name", "calls", "us"}], "error": null} or {"kernels": null, "error"}."""
        if self.buffers.device != "cuda":
            return {"kernels": None, "error": "kernels are recorded on the GPU only"}
        try:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                self.run(j)
                self.sync()
            seen = {}
            for e in prof.events():
                if str(getattr(e, "device_type", "")).endswith("CUDA"):
                    name = str(e.name)[:KERNEL_NAME_CHARS]
                    calls, us = seen.get(name, (0, 0.0))
                    seen[name] = (calls + 1, us + float(e.time_range.elapsed_us()))
            listed = sorted(seen.items(), key=lambda kv: -kv[1][1])[:KERNELS_MAX]
            return {"kernels": [{"name": n, "calls": c, "us": round(u, 3)} for n, (c, u) in listed],
                    "error": None}
        except SystemExit:
            raise
        except BaseException as e:  # noqa: BLE001 - no record is an answer too
            return {"kernels": None, "error": f"no kernel records: {describe_exception(e, 400)}"}

    def finish(self):
        """Before `D`: on a GPU, every run's work is done (an error it raised is exit 1)."""
        if self.sync is not None:
            try:
                self.sync()
            except BaseException:  # noqa: BLE001
                import traceback

                traceback.print_exc()
                leave(1)


# ---- the recorder (R): the forward's CUDA API calls, through CUPTI's callback API -------
#
# R runs forward once like G with CUPTI's callback API subscribed (ctypes, no compiled
# helper): every runtime and driver API call the forward makes reaches `Recorder.on_api`,
# which keeps the outermost call of each nest (a runtime launch calls the driver: one op)
# as an op of the recording (the lift's spec, issue 29, §1). Launches are read at their entry
# (their parameters are valid then); an allocation's pointer at its exit.
#
# Every layout below is the one of the CUDA 13 headers (x86-64 Linux, LP64; the copy under
# triton/backends/nvidia/include): cupti_callbacks.h, generated_cuda_runtime_api_meta.h
# (the runtime's <name>_params), generated_cuda_meta.h (the driver's), cuda.h and
# driver_types.h (launch configurations and attributes); tests/test_kiln_hosted.py
# (RecorderLayouts) compiles them against those headers. Calls are told apart by their
# functionName (CBIDs are renumbered between releases, names are not).

MAX_OPS = 4096
SYMBOL_CHARS = 512
MAX_PARAMS = 256
# A launch configuration's attributes read at most, the bytes of an `extra` parameter
# buffer, and every launch's parameter bytes together (the answer's size).
MAX_ATTRS = 64
MAX_PARAM_BUFFER = 1 << 16
MAX_PARAM_BYTES = 4 << 20
# torch's allocator history kept during the forward (events), and the blocks answered.
HISTORY_ENTRIES = 1 << 16
MAX_ALLOCATIONS = 4096

CUPTI_API_ENTER = 0                                       # CUpti_ApiCallbackSite
CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_CB_DOMAIN_RUNTIME_API = 1, 2   # CUpti_CallbackDomain
LAUNCH_ATTRIBUTE_COOPERATIVE = 2            # CU_LAUNCH_ATTRIBUTE_COOPERATIVE, cudaLaunchAttributeCooperative
LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4      # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, cudaLaunchAttributeClusterDimension
LAUNCH_PARAM_END, LAUNCH_PARAM_BUFFER_POINTER, LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2   # cuda.h
CUDA_ERROR_INVALID_VALUE = 1
# cudaStreamLegacy / CU_STREAM_LEGACY and cudaStreamPerThread / CU_STREAM_PER_THREAD, and
# the null stream: the default stream, "current" as torch's own.
DEFAULT_STREAMS = (0, 1, 2)
MEMCPY_KINDS = {0: "h2h", 1: "h2d", 2: "d2h", 3: "d2d", 4: "default"}   # enum cudaMemcpyKind


class RecordError(Exception):
    """Why the forward's calls cannot be recorded (the answer's `error`)."""


class Dim3(ctypes.Structure):
    """dim3 (vector_types.h)."""
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class CallbackData(ctypes.Structure):
    """CUpti_CallbackData (cupti_callbacks.h); sizeof 72."""
    _fields_ = [("callbackSite", ctypes.c_int),            # 0   CUpti_ApiCallbackSite
                ("functionName", ctypes.c_void_p),         # 8   const char *
                ("functionParams", ctypes.c_void_p),       # 16  const void *
                ("functionReturnValue", ctypes.c_void_p),  # 24  void *
                ("symbolName", ctypes.c_void_p),           # 32  const char *
                ("context", ctypes.c_void_p),              # 40  CUcontext
                ("contextUid", ctypes.c_uint32),           # 48
                ("correlationData", ctypes.c_void_p),      # 56  uint64_t *
                ("correlationId", ctypes.c_uint32)]        # 64


class RtLaunch(ctypes.Structure):
    """cudaLaunchKernel_v7000_params, cudaLaunchKernel_ptsz_v7000_params,
    cudaLaunchCooperativeKernel_v9000_params and its _ptsz_ one; sizeof 56."""
    _fields_ = [("func", ctypes.c_void_p),       # 0   const void *
                ("gridDim", Dim3),               # 8
                ("blockDim", Dim3),              # 20
                ("args", ctypes.c_void_p),       # 32  void **
                ("sharedMem", ctypes.c_size_t),  # 40
                ("stream", ctypes.c_void_p)]     # 48  cudaStream_t


class RtLaunchEx(ctypes.Structure):
    """cudaLaunchKernelExC_v11060_params and its _ptsz_ one."""
    _fields_ = [("config", ctypes.c_void_p),     # 0   const cudaLaunchConfig_t *
                ("func", ctypes.c_void_p),       # 8   const void *
                ("args", ctypes.c_void_p)]       # 16  void **


class RtLaunchConfig(ctypes.Structure):
    """cudaLaunchConfig_t (driver_types.h); sizeof 56."""
    _fields_ = [("gridDim", Dim3),                       # 0
                ("blockDim", Dim3),                      # 12
                ("dynamicSmemBytes", ctypes.c_size_t),   # 24
                ("stream", ctypes.c_void_p),             # 32  cudaStream_t
                ("attrs", ctypes.c_void_p),              # 40  cudaLaunchAttribute *
                ("numAttrs", ctypes.c_uint)]             # 48


class LaunchAttributeValue(ctypes.Union):
    """cudaLaunchAttributeValue (driver_types.h) and CUlaunchAttributeValue (cuda.h): 64
    bytes; the members read here, and a pointer for its alignment."""
    _fields_ = [("pad", ctypes.c_char * 64),
                ("cooperative", ctypes.c_int),
                ("clusterDim", Dim3),
                ("aligned", ctypes.c_void_p)]


class LaunchAttribute(ctypes.Structure):
    """cudaLaunchAttribute (driver_types.h) and CUlaunchAttribute (cuda.h); sizeof 72."""
    _fields_ = [("id", ctypes.c_int),                # 0   cudaLaunchAttributeID / CUlaunchAttributeID
                ("pad", ctypes.c_char * 4),          # 4   char pad[8 - sizeof(id)]
                ("value", LaunchAttributeValue)]     # 8


class DrvLaunch(ctypes.Structure):
    """cuLaunchKernel_params and cuLaunchKernel_ptsz_params; sizeof 64."""
    _fields_ = [("f", ctypes.c_void_p),               # 0   CUfunction
                ("gridDimX", ctypes.c_uint),          # 8
                ("gridDimY", ctypes.c_uint),          # 12
                ("gridDimZ", ctypes.c_uint),          # 16
                ("blockDimX", ctypes.c_uint),         # 20
                ("blockDimY", ctypes.c_uint),         # 24
                ("blockDimZ", ctypes.c_uint),         # 28
                ("sharedMemBytes", ctypes.c_uint),    # 32
                ("hStream", ctypes.c_void_p),         # 40  CUstream
                ("kernelParams", ctypes.c_void_p),    # 48  void **
                ("extra", ctypes.c_void_p)]           # 56  void **


class DrvCoopLaunch(ctypes.Structure):
    """cuLaunchCooperativeKernel_params and its _ptsz_ one: cuLaunchKernel's, without
    `extra`; sizeof 56."""
    _fields_ = DrvLaunch._fields_[:-1]


class DrvLaunchEx(ctypes.Structure):
    """cuLaunchKernelEx_params and cuLaunchKernelEx_ptsz_params."""
    _fields_ = [("config", ctypes.c_void_p),          # 0   const CUlaunchConfig *
                ("f", ctypes.c_void_p),               # 8   CUfunction
                ("kernelParams", ctypes.c_void_p),    # 16  void **
                ("extra", ctypes.c_void_p)]           # 24  void **


class DrvLaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h); sizeof 56."""
    _fields_ = [("gridDimX", ctypes.c_uint),          # 0
                ("gridDimY", ctypes.c_uint),          # 4
                ("gridDimZ", ctypes.c_uint),          # 8
                ("blockDimX", ctypes.c_uint),         # 12
                ("blockDimY", ctypes.c_uint),         # 16
                ("blockDimZ", ctypes.c_uint),         # 20
                ("sharedMemBytes", ctypes.c_uint),    # 24
                ("hStream", ctypes.c_void_p),         # 32  CUstream
                ("attrs", ctypes.c_void_p),           # 40  CUlaunchAttribute *
                ("numAttrs", ctypes.c_uint)]          # 48


class RtMemcpy(ctypes.Structure):
    """cudaMemcpy_v3020_params, cudaMemcpyAsync_v3020_params (a stream follows) and their
    _ptds_/_ptsz_ ones."""
    _fields_ = [("dst", ctypes.c_void_p), ("src", ctypes.c_void_p),
                ("count", ctypes.c_size_t),           # 16
                ("kind", ctypes.c_int)]               # 24  enum cudaMemcpyKind


class RtMemcpySymbol(ctypes.Structure):
    """cudaMemcpyToSymbol_v3020_params (symbol, src, ...), cudaMemcpyFromSymbol_v3020_params
    (dst, symbol, ...), their Async ones (a stream follows) and _ptds_/_ptsz_ ones."""
    _fields_ = [("a", ctypes.c_void_p), ("b", ctypes.c_void_p),
                ("count", ctypes.c_size_t),           # 16
                ("offset", ctypes.c_size_t),          # 24
                ("kind", ctypes.c_int)]               # 32


class RtMemcpyPeer(ctypes.Structure):
    """cudaMemcpyPeer_v4000_params and cudaMemcpyPeerAsync_v4000_params."""
    _fields_ = [("dst", ctypes.c_void_p), ("dstDevice", ctypes.c_int),
                ("src", ctypes.c_void_p), ("srcDevice", ctypes.c_int),
                ("count", ctypes.c_size_t)]           # 32


class RtMemcpy2D(ctypes.Structure):
    """cudaMemcpy2D_v3020_params and cudaMemcpy2DAsync_v3020_params (a stream follows)."""
    _fields_ = [("dst", ctypes.c_void_p), ("dpitch", ctypes.c_size_t),
                ("src", ctypes.c_void_p), ("spitch", ctypes.c_size_t),
                ("width", ctypes.c_size_t),           # 32
                ("height", ctypes.c_size_t),          # 40
                ("kind", ctypes.c_int)]               # 48


class DrvMemcpy(ctypes.Structure):
    """cuMemcpy_params, cuMemcpyAsync_params, cuMemcpyHtoD_v2_params, cuMemcpyDtoH_v2_params,
    cuMemcpyDtoD_v2_params and their Async/_ptds/_ptsz ones (a stream follows)."""
    _fields_ = [("dst", ctypes.c_uint64), ("src", ctypes.c_uint64),   # CUdeviceptr or void *
                ("ByteCount", ctypes.c_size_t)]                        # 16


class DrvMemcpyPeer(ctypes.Structure):
    """cuMemcpyPeer_params and cuMemcpyPeerAsync_params."""
    _fields_ = [("dstDevice", ctypes.c_uint64), ("dstContext", ctypes.c_void_p),
                ("srcDevice", ctypes.c_uint64), ("srcContext", ctypes.c_void_p),
                ("ByteCount", ctypes.c_size_t)]                        # 32


class RtMemset(ctypes.Structure):
    """cudaMemset_v3020_params, cudaMemsetAsync_v3020_params (a stream follows) and their
    _ptds_/_ptsz_ ones."""
    _fields_ = [("devPtr", ctypes.c_void_p), ("value", ctypes.c_int),
                ("count", ctypes.c_size_t)]           # 16


class DrvMemset(ctypes.Structure):
    """cuMemsetD8_v2_params (unsigned char uc), cuMemsetD16_v2_params (unsigned short us),
    cuMemsetD32_v2_params (unsigned int ui), their Async/_ptds/_ptsz ones: N elements at 16."""
    _fields_ = [("dstDevice", ctypes.c_uint64), ("value", ctypes.c_uint),
                ("N", ctypes.c_size_t)]               # 16


class AllocParams(ctypes.Structure):
    """cudaMalloc_v3020_params (void **devPtr, size_t size) and every allocation of the same
    first two fields (ALLOC_LAYOUTS)."""
    _fields_ = [("ptr", ctypes.c_void_p),            # 0   void ** / CUdeviceptr *
                ("size", ctypes.c_size_t)]           # 8


class EventRecordParams(ctypes.Structure):
    """cudaEventRecord_v3020_params, cudaEventRecordWithFlags_v11010_params, cuEventRecord_params,
    cuEventRecordWithFlags_params and their _ptsz ones."""
    _fields_ = [("event", ctypes.c_void_p), ("stream", ctypes.c_void_p)]


# By layout key (`layout_key`): the struct a call's parameters are.
LAUNCH_LAYOUTS = {
    "cudaLaunchKernel": RtLaunch, "cudaLaunchCooperativeKernel": RtLaunch,
    "cudaLaunchKernelExC": RtLaunchEx,
    "cuLaunchKernel": DrvLaunch, "cuLaunchCooperativeKernel": DrvCoopLaunch,
    "cuLaunchKernelEx": DrvLaunchEx,
}
COPY_LAYOUTS = {
    "cudaMemcpy": RtMemcpy, "cudaMemcpyAsync": RtMemcpy,
    "cudaMemcpyToSymbol": RtMemcpySymbol, "cudaMemcpyToSymbolAsync": RtMemcpySymbol,
    "cudaMemcpyFromSymbol": RtMemcpySymbol, "cudaMemcpyFromSymbolAsync": RtMemcpySymbol,
    "cudaMemcpyPeer": RtMemcpyPeer, "cudaMemcpyPeerAsync": RtMemcpyPeer,
    "cudaMemcpy2D": RtMemcpy2D, "cudaMemcpy2DAsync": RtMemcpy2D,
    "cuMemcpy": DrvMemcpy, "cuMemcpyAsync": DrvMemcpy,
    "cuMemcpyHtoD_v2": DrvMemcpy, "cuMemcpyHtoDAsync_v2": DrvMemcpy,
    "cuMemcpyDtoH_v2": DrvMemcpy, "cuMemcpyDtoHAsync_v2": DrvMemcpy,
    "cuMemcpyDtoD_v2": DrvMemcpy, "cuMemcpyDtoDAsync_v2": DrvMemcpy,
    "cuMemcpyPeer": DrvMemcpyPeer, "cuMemcpyPeerAsync": DrvMemcpyPeer,
}
# Memsets: (struct, bytes per counted element).
MEMSET_LAYOUTS = {
    "cudaMemset": (RtMemset, 1), "cudaMemsetAsync": (RtMemset, 1),
    "cuMemsetD8_v2": (DrvMemset, 1), "cuMemsetD8Async": (DrvMemset, 1),
    "cuMemsetD16_v2": (DrvMemset, 2), "cuMemsetD16Async": (DrvMemset, 2),
    "cuMemsetD32_v2": (DrvMemset, 4), "cuMemsetD32Async": (DrvMemset, 4),
}
ALLOC_LAYOUTS = {
    "cudaMalloc", "cudaMallocAsync", "cudaMallocManaged", "cudaMallocFromPoolAsync",
    "cudaMallocHost", "cudaHostAlloc", "cuMemAlloc_v2", "cuMemAllocAsync", "cuMemAllocManaged",
    "cuMemAllocFromPoolAsync", "cuMemAllocHost_v2", "cuMemHostAlloc",
}
EVENT_RECORDS = {"cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord", "cuEventRecordWithFlags"}
# Calls that enqueue GPU work kiln's lift cannot carry (by API name).
OTHER_APIS = {
    "cudaGraphLaunch", "cuGraphLaunch", "cudaGraphUpload", "cuGraphUpload",
    "cudaStreamWaitEvent", "cuStreamWaitEvent", "cudaLaunchHostFunc", "cuLaunchHostFunc",
    "cudaStreamAddCallback", "cuStreamAddCallback", "cudaLaunchCooperativeKernelMultiDevice",
    "cuLaunchCooperativeKernelMultiDevice", "cudaLaunch", "cuLaunch", "cuLaunchGrid",
    "cuLaunchGridAsync", "cudaMemPrefetchAsync", "cuMemPrefetchAsync", "cuStreamWriteValue32",
    "cuStreamWriteValue64", "cuStreamWaitValue32", "cuStreamWaitValue64", "cuStreamBatchMemOp",
}


def api_name(function_name):
    """The API a callback's functionName names, without its version and per-thread
    suffixes: cudaLaunchKernel_ptsz_v7000 -> cudaLaunchKernel, cuMemcpyHtoD_v2_ptds ->
    cuMemcpyHtoD."""
    return re.sub(r"(?:_v\d+|_ptsz|_ptds)+$", "", function_name)


def layout_key(function_name):
    """The name whose <name>_params struct the call's parameters are: the per-thread
    variants share their plain one's, and so do a runtime function's versions; a driver
    function's versions differ (cuMemAlloc's 32-bit sizes, cuMemAlloc_v2's size_t)."""
    key = re.sub(r"_(?:ptsz|ptds)(?=_|$)", "", function_name)
    return re.sub(r"_v\d+$", "", key) if key.startswith("cuda") else key


def op_kind(api):
    """The op an API call is ("launch", "memset", "copy", "sync", "alloc", "other";
    "event" for an event record, decided by its stream), or None: ignored."""
    if api in LAUNCH_LAYOUTS:
        return "launch"
    if api in OTHER_APIS:
        return "other"
    if api in EVENT_RECORDS:
        return "event"
    if api.startswith(("cudaGraph", "cuGraph")):
        return None  # building a graph enqueues nothing; launching one is "other"
    if "Memset" in api:
        return "memset"
    if "Memcpy" in api:
        return "copy"
    if "Synchronize" in api:
        return "sync"
    if api.startswith(("cudaMalloc", "cuMemAlloc")) or api in ("cudaHostAlloc", "cuMemHostAlloc"):
        return "alloc"
    return None


def stream_kind(handle, current):
    """"current" for torch's current stream (`current`) or a default stream, else "other"."""
    handle = int(handle or 0)
    return "current" if handle == int(current or 0) or handle in DEFAULT_STREAMS else "other"


def copy_kind(api, raw=None):
    """A copy's direction: from its cudaMemcpyKind (`raw`) for the runtime, from its name
    for the driver; "symbol" for a copy to or from a `__device__` symbol."""
    if "Symbol" in api:
        return "symbol"
    if raw is not None:
        return MEMCPY_KINDS.get(raw, "unknown")
    if "Peer" in api:
        return "d2d"
    for pattern, kind in ((r"HtoD|HtoA", "h2d"), (r"DtoH|AtoH", "d2h"), (r"DtoD|DtoA|AtoD|AtoA", "d2d")):
        if re.search(pattern, api):
            return kind
    return "default" if api in ("cuMemcpy", "cuMemcpyAsync") else "unknown"


def c_string(address, limit=None):
    """The NUL-terminated string at `address` (None when it is NULL), clipped to `limit`."""
    if not address:
        return None
    text = ctypes.string_at(address).decode("utf-8", "replace")
    return text if limit is None else text[:limit]


def launch_attributes(address, count):
    """(cooperative, cluster) from a launch configuration's attribute array: cooperative
    True/False when the cooperative attribute is there (else None), cluster [x, y, z] when
    a cluster dimension is."""
    if count > MAX_ATTRS:
        raise RecordError(f"a launch with {count} attributes (at most {MAX_ATTRS} are read)")
    cooperative, cluster = None, None
    if not address:
        return cooperative, cluster
    attrs = (LaunchAttribute * count).from_address(address)
    for a in attrs:
        if a.id == LAUNCH_ATTRIBUTE_COOPERATIVE:
            cooperative = a.value.cooperative != 0
        elif a.id == LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
            d = a.value.clusterDim
            cluster = [d.x, d.y, d.z]
    return cooperative, cluster


def extra_buffer(address):
    """The parameter buffer of a driver launch's `extra` array (CU_LAUNCH_PARAM_BUFFER_POINTER,
    CU_LAUNCH_PARAM_BUFFER_SIZE pairs, CU_LAUNCH_PARAM_END last), as bytes."""
    pointer, size = None, None
    for i in range(8):
        key = ctypes.c_void_p.from_address(address + 16 * i).value or 0
        if key == LAUNCH_PARAM_END:
            break
        value = ctypes.c_void_p.from_address(address + 16 * i + 8).value
        if key == LAUNCH_PARAM_BUFFER_POINTER:
            pointer = value
        elif key == LAUNCH_PARAM_BUFFER_SIZE:
            size = ctypes.c_size_t.from_address(value).value if value else None
        else:
            raise RecordError(f"a launch's extra array holds the unknown key {key}")
    else:
        raise RecordError("a launch's extra array has no end")
    if not pointer or size is None:
        raise RecordError("a launch's extra array gives no parameter buffer and size")
    if size > MAX_PARAM_BUFFER:
        raise RecordError(f"a launch's parameter buffer of {size} bytes")
    return ctypes.string_at(pointer, size)


def launch_params(infos, args=None, buffer=None):
    """Each parameter as the spec writes it ({"offset", "size", "hex"}), from its (offset,
    size) in `infos`: read through `args` (the address of the launch's void* array, one
    pointer per parameter) or sliced from `buffer` (an `extra` parameter buffer)."""
    out = []
    for i, (offset, size) in enumerate(infos):
        if args:
            at = ctypes.c_void_p.from_address(args + i * ctypes.sizeof(ctypes.c_void_p)).value
            if not at:
                raise RecordError(f"parameter {i} of a launch is a NULL pointer")
            data = ctypes.string_at(at, size)
        elif buffer is not None:
            if offset + size > len(buffer):
                raise RecordError(f"parameter {i} ({size} bytes at {offset}) is past the launch's "
                                  f"{len(buffer)}-byte parameter buffer")
            data = bytes(buffer[offset:offset + size])
        else:
            raise RecordError(f"a launch gives no parameters for a kernel that takes {len(infos)}")
        out.append({"offset": int(offset), "size": int(size), "hex": data.hex()})
    return out


def read_launch(key, address):
    """What a launch's parameters say: {"grid", "block", "shared_bytes", "stream", "func"
    (runtime: the host stub's address) or "f" (driver: the CUfunction), "args", "extra",
    "cooperative", "cluster"}."""
    layout = LAUNCH_LAYOUTS[key]
    p = layout.from_address(address)
    out = {"args": None, "extra": None, "cooperative": "Cooperative" in key, "cluster": None}
    attrs = (None, 0)
    if layout is RtLaunch:
        out.update(func=p.func, args=p.args, stream=p.stream, shared_bytes=p.sharedMem,
                   grid=[p.gridDim.x, p.gridDim.y, p.gridDim.z],
                   block=[p.blockDim.x, p.blockDim.y, p.blockDim.z])
    elif layout is RtLaunchEx:
        if not p.config:
            raise RecordError(f"{key} without a launch configuration")
        c = RtLaunchConfig.from_address(p.config)
        out.update(func=p.func, args=p.args, stream=c.stream, shared_bytes=c.dynamicSmemBytes,
                   grid=[c.gridDim.x, c.gridDim.y, c.gridDim.z],
                   block=[c.blockDim.x, c.blockDim.y, c.blockDim.z])
        attrs = (c.attrs, c.numAttrs)
    else:
        c = p
        if layout is DrvLaunchEx:
            if not p.config:
                raise RecordError(f"{key} without a launch configuration")
            c = DrvLaunchConfig.from_address(p.config)
            attrs = (c.attrs, c.numAttrs)
        out.update(f=p.f, args=p.kernelParams, extra=getattr(p, "extra", None), stream=c.hStream,
                   shared_bytes=c.sharedMemBytes, grid=[c.gridDimX, c.gridDimY, c.gridDimZ],
                   block=[c.blockDimX, c.blockDimY, c.blockDimZ])
    cooperative, cluster = launch_attributes(*attrs)
    if cooperative is not None:
        out["cooperative"] = cooperative
    out["cluster"] = cluster
    return out


class Decoder:
    """Turns one API call (its functionName, parameters and the launch's symbol) into an
    op of the recording, or None for a call the recording ignores. `kernels` finds what a
    launch needs: .function(host stub address) -> CUfunction (runtime launches),
    .params(CUfunction) -> [(offset, size)], .name(CUfunction) -> symbol or None."""

    def __init__(self, current_stream, kernels):
        self.current, self.kernels = current_stream, kernels
        self.param_bytes = 0

    def enter(self, name, params, symbol=None):
        """The op of a call at its entry (`params`: the address of its <name>_params;
        `symbol`: the address of CUPTI's symbolName), or None."""
        api = api_name(name)
        kind = op_kind(api)
        if kind is None:
            return None
        key = layout_key(name)
        if kind == "launch":
            return self.launch(api, key, params, symbol)
        if kind == "event":
            p = EventRecordParams.from_address(params)
            return None if stream_kind(p.stream, self.current) == "current" else {"op": "other", "api": api}
        op = {"op": kind, "api": api}
        if kind == "memset" and key in MEMSET_LAYOUTS:
            layout, unit = MEMSET_LAYOUTS[key]
            p = layout.from_address(params)
            op["bytes"] = int(p.N if layout is DrvMemset else p.count) * unit
        elif kind == "copy":
            layout = COPY_LAYOUTS.get(key)
            raw = None
            if layout is not None:
                p = layout.from_address(params)
                if layout is RtMemcpy2D:
                    op["bytes"] = int(p.width) * int(p.height)
                else:
                    op["bytes"] = int(p.ByteCount if layout in (DrvMemcpy, DrvMemcpyPeer) else p.count)
                if layout in (RtMemcpy, RtMemcpySymbol, RtMemcpy2D):
                    raw = p.kind
            op["kind"] = copy_kind(api, raw)
        elif kind == "alloc" and key in ALLOC_LAYOUTS:
            op["ptr"] = None  # read at the call's exit
            op["bytes"] = int(AllocParams.from_address(params).size)
        return op

    def exit(self, op, params, status):
        """Completes an op at its call's exit: an allocation's pointer (when it succeeded)."""
        if op.get("op") != "alloc" or "ptr" not in op:
            return
        p = AllocParams.from_address(params)
        if status == 0 and p.ptr:
            op["ptr"] = ctypes.c_uint64.from_address(p.ptr).value
        else:
            del op["ptr"]

    def launch(self, api, key, params, symbol):
        """A launch's op: its kernel (CUfunction, symbol and parameter layout), dimensions,
        stream and parameter bytes."""
        if key not in LAUNCH_LAYOUTS:
            raise RecordError(f"cannot read the parameters of {key}")
        launch = read_launch(key, params)
        name = c_string(symbol, SYMBOL_CHARS)
        if "f" in launch:
            f = launch["f"]
        else:
            try:
                f = self.kernels.function(launch["func"])
            except RecordError as e:
                # The host stub belongs to a CUDA runtime this process cannot ask (an
                # extension's own copy): the driver launch the runtime makes under this
                # call fills the op in (`Recorder.step`).
                return {"op": "launch", "api": api, "symbol": (name or "")[:SYMBOL_CHARS],
                        "grid": launch["grid"], "block": launch["block"],
                        "shared_bytes": int(launch["shared_bytes"]),
                        "stream": stream_kind(launch["stream"], self.current),
                        "cooperative": bool(launch["cooperative"]), "cluster": launch["cluster"],
                        "params": None, "_unresolved": str(e)}
        name = name or self.kernels.name(f) or ""
        infos = self.kernels.params(f)
        buffer = None
        if not launch["args"] and launch["extra"]:
            buffer = extra_buffer(launch["extra"])
        values = launch_params(infos, launch["args"], buffer)
        self.param_bytes += sum(size for _, size in infos)
        if self.param_bytes > MAX_PARAM_BYTES:
            raise RecordError(f"the forward's launches pass more than {MAX_PARAM_BYTES} bytes of parameters")
        return {"op": "launch", "api": api, "symbol": name[:SYMBOL_CHARS], "grid": launch["grid"],
                "block": launch["block"], "shared_bytes": int(launch["shared_bytes"]),
                "stream": stream_kind(launch["stream"], self.current),
                "cooperative": bool(launch["cooperative"]), "cluster": launch["cluster"],
                "params": values}


def regions(inputs, weights, buffers, outputs):
    """The recording's regions from (name, tensor) pairs by role: {"name", "role", "ptr",
    "bytes"}, and "contiguous" for what forward returned."""
    out = []
    for role, pairs in (("input", inputs), ("weight", weights), ("buffer", buffers), ("output", outputs)):
        for name, t in pairs:
            r = {"name": name, "role": role, "ptr": int(t.data_ptr()),
                 "bytes": int(t.numel()) * int(t.element_size())}
            if role == "output":
                r["contiguous"] = bool(t.is_contiguous())
            out.append(r)
    return out


def allocations_from(traces, limit=HISTORY_ENTRIES):
    """([{"ptr", "bytes"}] of the "alloc" events in torch's allocator history `traces`, in
    order), and why that list may be incomplete (or None)."""
    allocs = [{"ptr": int(e["addr"]), "bytes": int(e["size"])} for e in traces if e.get("action") == "alloc"]
    error = None
    if len(traces) >= limit:
        error = f"torch's allocator history overflowed ({limit} events in one forward)"
    if len(allocs) > MAX_ALLOCATIONS:
        allocs = allocs[:MAX_ALLOCATIONS]
        error = f"more than {MAX_ALLOCATIONS} allocations in one forward"
    return allocs, error


# ---- Triton launches (R): JITFunction.run wrapped for the forward ---------------------
#
# CUPTI sees a Triton launch as a cuLaunchKernelEx of a kernel named after the jit function,
# with the arguments packed; what the launch plan needs (which arguments are constexprs,
# their values, the grid as written, num_warps and num_stages) is Triton's. So while R
# records, triton.runtime.jit.JITFunction.run (what `kernel[grid](...)`, the autotuner and
# the heuristics end in, with the chosen config's values) is wrapped: each call that is not
# a warmup is taken down, then the original runs as it would have. Only when the file
# imported triton (this runner never imports it).

TRITON_DEFAULTS = (("num_warps", 4), ("num_stages", 3), ("num_ctas", 1))
TRITON_NAME_CHARS = 200
TRITON_STR_CHARS = 256
TRITON_MAX_OPTIONS = 64
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


def triton_value(v, tensor_type=None, tl=None):
    """One argument of a Triton launch as the recording gives it: {"kind": "tensor", "ptr",
    "contiguous", "dtype"}, {"kind": "int"/"float"/"bool"/"str", "value"} (a float that is
    not finite: "value" null and "text"), {"kind": "dtype", "value": "tl.float16"} (a
    triton.language dtype), {"kind": "none"} or {"kind": "other", "type"}. A
    `tl.constexpr` is read as the value it holds."""
    if tl is not None and isinstance(v, tl.constexpr):
        v = v.value
    if tensor_type is not None and isinstance(v, tensor_type):
        return {"kind": "tensor", "ptr": int(v.data_ptr()), "contiguous": bool(v.is_contiguous()),
                "dtype": str(v.dtype).rpartition(".")[2]}
    if v is None:
        return {"kind": "none"}
    if isinstance(v, bool):
        return {"kind": "bool", "value": v}
    if isinstance(v, int):
        return {"kind": "int", "value": int(v)}
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return {"kind": "float", "value": None, "text": repr(v)}
        return {"kind": "float", "value": float(v)}
    if isinstance(v, str):
        return {"kind": "str", "value": v[:TRITON_STR_CHARS]}
    if tl is not None and isinstance(v, tl.dtype):
        for name, d in vars(tl).items():
            if not name.startswith("_") and isinstance(d, tl.dtype) and d == v:
                return {"kind": "dtype", "value": "tl." + name}
    return {"kind": "other", "type": type(v).__name__[:TRITON_NAME_CHARS]}


def triton_grid(grid, bound):
    """The grid of a launch as Triton computes it (a callable gets the bound arguments),
    padded to three dimensions."""
    import operator

    if callable(grid):
        grid = grid(dict(bound))
    dims = [operator.index(d) for d in grid]
    if not dims:
        raise ValueError("an empty grid")
    dims = (dims + [1, 1])[:3]
    if not all(I64_MIN <= d <= I64_MAX for d in dims):
        raise ValueError(f"a grid dimension out of range: {dims}")
    return dims


def triton_bind(fn, args, kwargs):
    """The jit function's parameters bound to a call's arguments, in order, with their
    defaults (Triton's binder), and the other keywords (the compile options)."""
    import inspect

    sig = getattr(fn, "signature", None) or inspect.signature(fn.fn)
    params = sig.parameters
    options = {k: v for k, v in kwargs.items() if k not in params and k not in ("grid", "warmup")}
    bound = sig.bind(*args, **{k: v for k, v in kwargs.items() if k in params})
    bound.apply_defaults()
    return dict(bound.arguments), options


def triton_launch(fn, args, kwargs, tensor_type=None, tl=None):
    """One call of JITFunction.run as the recording gives it: {"kernel", "grid", "args":
    [{"name", "constexpr", "kind", ...}], "num_warps", "num_stages", "num_ctas", "options"}
    ("options": any other compile option given, by name)."""
    import operator

    bound, options = triton_bind(fn, args, kwargs)
    params = list(getattr(fn, "params", None) or [])
    if len(params) == len(bound):
        constexpr = [bool(p.is_constexpr) for p in params]
    else:
        indices = set(getattr(fn, "constexprs", None) or [])
        constexpr = [i in indices for i in range(len(bound))]
    if len(bound) > MAX_PARAMS:
        raise RecordError(f"a Triton launch with {len(bound)} arguments; at most {MAX_PARAMS} are recorded")
    out_args = []
    for (name, value), c in zip(bound.items(), constexpr):
        a = {"name": str(name)[:TRITON_NAME_CHARS], "constexpr": c}
        a.update(triton_value(value, tensor_type, tl))
        out_args.append(a)
    launch = {"kernel": str(getattr(fn, "__name__", "") or getattr(fn.fn, "__name__", ""))[:TRITON_NAME_CHARS],
              "grid": triton_grid(kwargs.get("grid"), bound), "args": out_args}
    for name, default in TRITON_DEFAULTS:
        v = options.pop(name, None)
        launch[name] = default if v is None else operator.index(v)
    other = {}
    for name, v in list(options.items())[:TRITON_MAX_OPTIONS]:
        if v is None:
            continue  # Triton leaves an option given as None at its default
        value = triton_value(v, tensor_type, tl)
        other[str(name)[:TRITON_NAME_CHARS]] = value.get("value", value.get("type"))
    launch["options"] = other
    return launch


class TritonCapture:
    """A context manager that wraps triton.runtime.jit.JITFunction.run (when the file
    imported triton) and takes down each launch (`triton_launch`) before the original
    runs; the original `run` is back on exit, always. A launch that cannot be taken down
    stops the capture and sets `error`; the launch itself still runs as it would have."""

    def __init__(self, modules=None):
        self.modules = sys.modules if modules is None else modules
        self.launches, self.error = [], None
        self.cls, self.original, self.owned = None, None, True
        self.tensor_type, self.tl = None, None

    def __enter__(self):
        jit = self.modules.get("triton.runtime.jit")
        cls = getattr(jit, "JITFunction", None)
        original = getattr(cls, "run", None) if isinstance(cls, type) else None
        if original is None:
            return self
        # Its own `run` (Triton's), or one it inherits: then the wrapper is removed on exit.
        self.owned = "run" in cls.__dict__
        torch = self.modules.get("torch")
        self.tensor_type = getattr(torch, "Tensor", None)
        self.tl = self.modules.get("triton.language")
        capture = self

        def run(fn, *args, **kwargs):
            if not kwargs.get("warmup", False):
                capture.take(fn, args, kwargs)
            return original(fn, *args, **kwargs)

        run.__wrapped__ = original
        cls.run = run
        self.cls, self.original = cls, original
        return self

    def __exit__(self, kind, value, tb):
        if self.cls is not None:
            if self.owned:
                self.cls.run = self.original
            else:
                del self.cls.run
            self.cls = None
        return False

    def take(self, fn, args, kwargs):
        if self.error is not None:
            return
        if len(self.launches) >= MAX_OPS:
            self.error = f"more than {MAX_OPS} Triton launches in one forward"
            return
        try:
            self.launches.append(triton_launch(fn, args, kwargs, self.tensor_type, self.tl))
        except Exception as e:  # noqa: BLE001 - forward goes on; the recording says why not
            self.error = f"a Triton launch could not be recorded: {describe_exception(e, 400)}"


# ---- the recorder's libraries (on the GPU) ----------------------------------------------

CUPTI_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)
# Every callback CUPTI was given stays alive with the process (CUPTI may hold it past a
# failed unsubscribe).
_CALLBACKS = []
_LIBRARIES = {}


def load_library(names, patterns=()):
    """The first of `names`, then of the files `patterns` (globs) match, that loads; a
    RecordError saying what was tried otherwise."""
    import glob

    tried = []
    for name in list(names) + [f for p in patterns for f in sorted(glob.glob(p), reverse=True)]:
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            tried.append(clip(str(e), 200))
    raise RecordError("; ".join(tried) or "nothing to load")


def declare(lib, name, args, optional=False):
    """lib.name with its argument types and an int result; None when `optional` and missing."""
    try:
        f = getattr(lib, name)
    except AttributeError:
        if optional:
            return None
        raise RecordError(f"{name} is missing from {lib._name}") from None
    f.argtypes, f.restype = args, ctypes.c_int
    return f


def cuda_libraries(torch):
    """{"cupti", "cudart", "cuda"}: the functions the recorder calls, loaded once. libcupti
    by soname (torch's own is loaded already), else beside torch (site-packages/nvidia/*/lib,
    which holds nvidia/cuda_cupti/lib and nvidia/cu13/lib)."""
    if _LIBRARIES:
        return _LIBRARIES
    site = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    try:
        cupti = load_library(["libcupti.so.13", "libcupti.so.12", "libcupti.so"],
                             [os.path.join(site, "nvidia", "*", "lib", "libcupti.so*"),
                              os.path.join(site, "nvidia", "cuda_cupti", "lib", "libcupti.so*")])
    except RecordError as e:
        raise RecordError(f"no CUPTI: {e}") from None
    try:
        cudart = load_library(["libcudart.so.13", "libcudart.so.12"],
                              [os.path.join(site, "nvidia", "*", "lib", "libcudart.so*")])
        cuda = load_library(["libcuda.so.1"])
    except RecordError as e:
        raise RecordError(f"no CUDA library: {e}") from None
    p, size_p = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)
    libs = {
        "cuptiSubscribe": declare(cupti, "cuptiSubscribe", [p, CUPTI_CALLBACK, ctypes.c_void_p]),
        "cuptiEnableDomain": declare(cupti, "cuptiEnableDomain", [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int]),
        "cuptiUnsubscribe": declare(cupti, "cuptiUnsubscribe", [ctypes.c_void_p]),
        "cuptiGetResultString": declare(cupti, "cuptiGetResultString",
                                        [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]),
        "cudaGetFuncBySymbol": declare(cudart, "cudaGetFuncBySymbol", [p, ctypes.c_void_p]),
        "cudaGetLastError": declare(cudart, "cudaGetLastError", []),
        "cuFuncGetParamInfo": declare(cuda, "cuFuncGetParamInfo", [ctypes.c_void_p, ctypes.c_size_t, size_p, size_p]),
        "cuKernelGetParamInfo": declare(cuda, "cuKernelGetParamInfo",
                                        [ctypes.c_void_p, ctypes.c_size_t, size_p, size_p], optional=True),
        "cuFuncGetName": declare(cuda, "cuFuncGetName", [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p],
                                 optional=True),
    }
    _LIBRARIES.update(libs)
    return _LIBRARIES


def param_list(get, f):
    """([(offset, size)] of kernel `f` by `get` (cuFuncGetParamInfo's signature), asked for
    index 0, 1, ... until it fails, and the failing call's result code."""
    infos, offset, size = [], ctypes.c_size_t(), ctypes.c_size_t()
    for i in range(MAX_PARAMS + 1):
        rc = get(ctypes.c_void_p(f), i, ctypes.byref(offset), ctypes.byref(size))
        if rc != 0:
            return infos, rc
        infos.append((offset.value, size.value))
    raise RecordError(f"a kernel with more than {MAX_PARAMS} parameters")


class Kernels:
    """What a launch needs from CUDA (see `Decoder`), cached per kernel."""

    def __init__(self, libs):
        self.libs = libs
        self.functions, self.infos = {}, {}

    def function(self, stub):
        """The CUfunction of a runtime launch's host stub (cudaGetFuncBySymbol of the
        process's CUDA runtime, else of a loaded library that carries its own, as an
        extension linked with the static runtime does)."""
        if stub not in self.functions:
            rc = None
            for get, clear in self.runtimes():
                f = ctypes.c_void_p()
                rc = get(ctypes.byref(f), ctypes.c_void_p(stub))
                if rc == 0 and f.value:
                    self.functions[stub] = f.value
                    break
                clear()  # leaves no error for the candidate to see
            else:
                raise RecordError(f"cudaGetFuncBySymbol found no kernel (cudaError {rc})")
        return self.functions[stub]

    def runtimes(self):
        """(cudaGetFuncBySymbol, cudaGetLastError) of the process's CUDA runtime, then of
        each loaded shared library that exports its own (read from /proc/self/maps)."""
        yield self.libs["cudaGetFuncBySymbol"], self.libs["cudaGetLastError"]
        if getattr(self, "_others", None) is None:
            self._others = []
            try:
                with open("/proc/self/maps") as f:
                    paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
            except OSError:
                paths = set()
            for path in sorted(p for p in paths if p.endswith(".so") or ".so." in p):
                if "libcudart" in os.path.basename(path) or not os.path.isfile(path):
                    continue
                try:
                    lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
                    get, clear = lib.cudaGetFuncBySymbol, lib.cudaGetLastError
                except (OSError, AttributeError):
                    continue
                get.argtypes, get.restype = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p], ctypes.c_int
                clear.argtypes, clear.restype = [], ctypes.c_int
                self._others.append((get, clear))
        yield from self._others

    def params(self, f):
        """[(offset, size)] of the kernel's parameters: cuFuncGetParamInfo, or
        cuKernelGetParamInfo when the handle is a CUkernel."""
        if f not in self.infos:
            self.infos[f] = self.read_params(f)
        return self.infos[f]

    def read_params(self, f):
        answers = []
        for getter in ("cuFuncGetParamInfo", "cuKernelGetParamInfo"):
            get = self.libs.get(getter)
            if get is None:
                continue
            infos, rc = param_list(get, f)
            if infos:
                return infos
            answers.append((getter, rc))
        # No parameter 0: a kernel without parameters when a getter said so ("invalid
        # value": the index), else neither understood the handle.
        if any(rc == CUDA_ERROR_INVALID_VALUE for _, rc in answers):
            return []
        raise RecordError("cannot read a kernel's parameters ("
                          + "; ".join(f"{g}: CUresult {rc}" for g, rc in answers) + ")")

    def name(self, f):
        get = self.libs.get("cuFuncGetName")
        out = ctypes.c_char_p()
        if get is None or get(ctypes.byref(out), ctypes.c_void_p(f)) != 0 or not out.value:
            return None
        return out.value.decode("utf-8", "replace")


class Recorder:
    """R's recorder: a context manager `Runs.run` enters just around forward's call. On
    entry: torch's allocator history, then CUPTI's callback API (runtime and driver
    domains); on exit: the domains off, the device waited for, CUPTI unsubscribed, the
    allocator's history read and turned off. What cannot be recorded is the answer's error:
    forward still runs once."""

    def __init__(self, torch, sync):
        self.torch, self.sync = torch, sync
        self.error, self.ops = None, []
        self.allocations, self.allocations_error = [], None
        self.history = False
        self.libs, self.subscriber, self.decoder = None, None, None
        self.threads = {}  # thread id -> [depth of API calls, the outermost call's op]
        self.triton = TritonCapture()
        import threading

        self.thread_id = threading.get_ident

    def __enter__(self):
        self.start_history()
        try:
            self.subscribe()
        except RecordError as e:
            self.error = str(e)
        except Exception as e:  # noqa: BLE001 - no record is an answer too
            self.error = f"CUPTI: {describe_exception(e, 400)}"
        try:
            self.triton.__enter__()
        except Exception as e:  # noqa: BLE001
            self.triton.__exit__(None, None, None)
            self.triton.error = f"Triton launches: {describe_exception(e, 400)}"
        return self

    def __exit__(self, kind, value, tb):
        try:
            self.triton.__exit__(kind, value, tb)
        finally:
            try:
                self.unsubscribe(wait=kind is None)
            finally:
                self.stop_history()
        return False

    def answer(self):
        out = {"error": self.error or self.triton.error, "ops": self.ops, "triton": self.triton.launches,
               "regions": [], "allocations": self.allocations}
        if self.allocations_error:
            out["allocations_error"] = self.allocations_error
        return out

    def result(self, what, rc):
        text = ctypes.c_char_p()
        self.libs["cuptiGetResultString"](rc, ctypes.byref(text))
        return f"CUPTI: {what}: {(text.value or b'error %d' % rc).decode(errors='replace')}"

    def subscribe(self):
        self.libs = cuda_libraries(self.torch)
        kernels = Kernels(self.libs)
        self.decoder = Decoder(int(self.torch.cuda.current_stream().cuda_stream), kernels)
        callback = CUPTI_CALLBACK(self.on_api)
        _CALLBACKS.append(callback)
        handle = ctypes.c_void_p()
        rc = self.libs["cuptiSubscribe"](ctypes.byref(handle), callback, None)
        if rc != 0:
            raise RecordError(self.result("cuptiSubscribe", rc))
        self.subscriber = handle
        for domain in (CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API):
            rc = self.libs["cuptiEnableDomain"](1, handle, domain)
            if rc != 0:
                raise RecordError(self.result("cuptiEnableDomain", rc))

    def unsubscribe(self, wait):
        if self.subscriber is None:
            return
        try:
            for domain in (CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API):
                self.libs["cuptiEnableDomain"](0, self.subscriber, domain)
            if wait and self.sync is not None:
                self.sync()  # the runner's own wait, not recorded (an error: exit 1)
        finally:
            rc = self.libs["cuptiUnsubscribe"](self.subscriber)
            self.subscriber = None
            if rc != 0 and self.error is None:
                self.error = self.result("cuptiUnsubscribe", rc)

    def on_api(self, userdata, domain, cbid, cbdata):
        """CUPTI's callback, on the thread that made the call; never raises into it."""
        try:
            self.step(CallbackData.from_address(cbdata))
        except BaseException as e:  # noqa: BLE001 - nothing may unwind into CUDA
            if self.error is None:
                self.error = f"recording failed: {describe_exception(e, 400)}"

    def step(self, data):
        """Keeps the outermost call of each thread's nest: entries and exits are counted."""
        state = self.threads.setdefault(self.thread_id(), [0, None])
        if data.callbackSite == CUPTI_API_ENTER:
            state[0] += 1
            if state[0] == 1:
                state[1] = self.enter(data)
            elif state[1] is not None and "_unresolved" in state[1]:
                self.fill_from_driver(state[1], data)
            return
        if state[0] == 1 and state[1] is not None:
            status = ctypes.c_int.from_address(data.functionReturnValue).value if data.functionReturnValue else 0
            self.decoder.exit(state[1], data.functionParams, status)
            if "_unresolved" in state[1] and self.error is None:
                self.error = (f"a runtime launch of {state[1].get('symbol') or 'a kernel'} could not be "
                              f"read ({state[1]['_unresolved']}) and made no driver launch under it")
        if state[0] == 1:
            state[1] = None
        state[0] = max(0, state[0] - 1)

    def fill_from_driver(self, op, data):
        """A runtime launch whose kernel this process could not resolve: the driver launch
        it makes under it (same kernel, same parameter array) gives its parameters."""
        name = c_string(data.functionName) or ""
        if op_kind(api_name(name)) != "launch":
            return
        try:
            inner = self.decoder.launch(api_name(name), layout_key(name), data.functionParams, data.symbolName)
        except RecordError as e:
            if self.error is None:
                self.error = str(e)
            return
        if inner.get("params") is None:
            return
        del op["_unresolved"]
        op["params"] = inner["params"]
        op["symbol"] = op["symbol"] or inner["symbol"]

    def enter(self, data):
        if self.error is not None:
            return None
        try:
            op = self.decoder.enter(c_string(data.functionName) or "", data.functionParams, data.symbolName)
        except RecordError as e:
            self.error = str(e)
            return None
        if op is None:
            return None
        if len(self.ops) >= MAX_OPS:
            self.error = f"more than {MAX_OPS} GPU operations in one forward"
            return None
        self.ops.append(op)
        return op

    def start_history(self):
        try:
            self.torch.cuda.memory._record_memory_history(
                enabled="all", context=None, stacks="python", max_entries=HISTORY_ENTRIES,
                clear_history=True)
            self.history = True
        except Exception as e:  # noqa: BLE001 - allocations are then unknown, and said so
            self.allocations_error = f"no allocator history: {describe_exception(e, 400)}"

    def stop_history(self):
        if not self.history:
            return
        memory = self.torch.cuda.memory
        try:
            traces = memory._snapshot()["device_traces"][self.torch.cuda.current_device()]
            self.allocations, self.allocations_error = allocations_from(traces)
        except Exception as e:  # noqa: BLE001
            self.allocations_error = f"no allocator history: {describe_exception(e, 400)}"
        finally:
            try:
                memory._record_memory_history(enabled=None)
            except Exception:  # noqa: BLE001 - it stays on: a cost, not a wrong answer
                pass


# ---- device sources (device-source): the file read as text, never run ------------------

MAX_SOURCE_BYTES = 1 << 20


def device_source(path):
    """`device-source`: the device sources of a ModelNew file, read as text by
    kiln_extract (never imported or run): {"error": null or why, "sources": [{"source",
    "kernels", "flags", "names_skipped"}], "triton": null or {"source", "kernels"}} (the
    lift's spec, issue 29, §2): "sources" its load_inline CUDA, "triton" its `@triton.jit`
    functions as a Triton contract candidate's source and their names. Either may be read
    when the other cannot: "error" says why the CUDA sources could not ("sources" is then
    empty); a file that is not Python has neither."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)  # -I leaves the script's folder off sys.path
    try:
        import kiln_extract as ke
    except Exception as e:  # noqa: BLE001
        return {"error": f"no extractor beside the runner: {describe_exception(e, 400)}", "sources": [],
                "triton": None}
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
    except OSError as e:
        return {"error": f"cannot read the file: {e}", "sources": [], "triton": None}
    if len(data) > MAX_SOURCE_BYTES:
        return {"error": f"the file is larger than {MAX_SOURCE_BYTES} bytes", "sources": [], "triton": None}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return {"error": f"the file is not UTF-8 text ({e.reason} at byte {e.start})", "sources": [],
                "triton": None}
    triton = None
    try:
        triton = ke.triton_source(text)
    except ke.Unresolved as e:
        return {"error": clip(str(e), ERROR_CHARS), "sources": [], "triton": None}
    except Exception:  # noqa: BLE001 - (RecursionError, MemoryError...): no Triton source
        triton = None
    try:
        sources = []
        for src, flags in ke.python_sources(text):
            flags = ke.kiln_flags(flags)
            device, kernels, skipped, _ = ke.extract(src, flags)
            sources.append({"source": device, "kernels": kernels, "flags": flags,
                            "names_skipped": len(skipped)})
    except ke.Unresolved as e:
        return {"error": clip(str(e), ERROR_CHARS), "sources": [], "triton": triton}
    except Exception as e:  # noqa: BLE001 - (RecursionError, MemoryError...): no sources
        return {"error": f"the extractor failed: {describe_exception(e, 400)}", "sources": [], "triton": triton}
    return {"error": None, "sources": sources, "triton": triton}


# ---- serve ------------------------------------------------------------------------------


def prepare(setup):
    """The runs, once the file is imported and its model built and checked; SetupError
    says why not."""
    if not isinstance(setup, dict):
        raise SetupError("setup: not a JSON object")
    device = setup.get("device", "cpu")
    check_device(device)
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch here"
        raise SetupError(f"python cannot import torch: {describe_exception(e)}") from None
    if device == "cpu":
        torch.set_num_threads(max(1, int(setup.get("threads", 1))))
    buffers = BUFFERS[device](torch, setup)
    shapes = {t["name"]: [int(d) for d in t["shape"]] or [1] for t in setup["tensors"]}
    constants = setup.get("constants") or {}
    if not isinstance(constants, dict) or not all(
            isinstance(v, (bool, int, float)) for v in constants.values()):
        raise SetupError("setup: constants must map names to numbers or bools")
    for n in [f for f in setup["forward"] if f not in constants] + list(setup["outputs"]):
        if n not in shapes:
            raise SetupError(f"setup: forward or outputs name {n!r}, which is no tensor")
    sync = torch.cuda.synchronize if device == "cuda" else None
    built = keep_builds(torch, prebuilt=setup.get("prebuilt") or "")
    module = load_candidate(setup["source"])
    model = build_model(torch, module, setup, device)
    found, notes = check_state(model, setup, shapes)
    return Runs(torch, model, buffers, setup, found, sync), built + notes


# The longest recording sent: the worker reads answers of at most 1 MiB.
MAX_RECORDING_BYTES = 900_000


def bounded_recording(answer):
    """`answer`, or, when its JSON is over MAX_RECORDING_BYTES, an answer that says so
    (the worker then does not lift; the run itself stands)."""
    size = len(json.dumps(answer, separators=(",", ":")))
    if size <= MAX_RECORDING_BYTES:
        return answer
    return {"error": f"the recording is {size} bytes, over the {MAX_RECORDING_BYTES} sent",
            "ops": [], "triton": [], "regions": [], "allocations": []}


def serve():
    # The candidate's prints reach the worker's capture line by line (it keeps an excerpt
    # as evidence; a runner it kills would lose a buffer).
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except Exception:  # noqa: BLE001 - not a text stream: leave it
        pass
    try:
        setup, _ = read_message(GO_FD)
    except EOFError:
        leave(0)
    try:
        runs, notes = prepare(setup)
    except SetupError as e:
        write_message(DONE_FD, {"missing": e.missing, "error": clip(str(e), 2 * ERROR_CHARS)})
        leave(0)
    write_message(DONE_FD, {"missing": [], "error": None, "notes": notes})
    slots = len(runs.plans)
    while True:
        cmd = os.read(GO_FD, 1)
        if cmd == b"G":
            runs.run(0)
        elif cmd == b"T":
            n = os.read(GO_FD, 1)
            if not n:
                leave(0)
            if not 1 <= n[0] <= slots:
                print(f"kiln: T {n[0]}: this runner has {slots} slots", file=sys.stderr)
                leave(2)
            for j in range(n[0]):
                runs.run(j)
        elif cmd == b"E":
            pass
        elif cmd == b"K":
            write_message(DONE_FD, runs.kernels(0))
            continue
        elif cmd == b"R":
            # A run with its GPU work recorded: finished (the outputs complete), then the
            # recording as the answer, which the worker reads in place of `D`.
            answer = runs.record(0)
            runs.finish()
            write_message(DONE_FD, bounded_recording(answer))
            continue
        elif cmd == b"Q":
            write_all(DONE_FD, b"D")
            leave(0)
        elif cmd == b"":
            leave(0)
        else:
            print(f"kiln: unknown command {cmd!r}", file=sys.stderr)
            leave(2)
        runs.finish()
        write_all(DONE_FD, b"D")


def main(argv):
    if argv == ["serve"]:
        serve()
        return 0
    if len(argv) == 4 and argv[0] == "build":
        return build(*argv[1:])
    if len(argv) == 2 and argv[0] == "gch":
        return gch(argv[1])
    if len(argv) in (2, 3) and argv[0] == "device-source":
        text = json.dumps(device_source(argv[1]))
        if len(argv) == 3:
            with open(argv[2], "w", encoding="utf-8") as f:
                f.write(text)
        else:
            print(text)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
