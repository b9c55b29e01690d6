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
         and "error" says so. The recorder is kiln_record.py, beside this script (standard
         library and ctypes), imported at the first R; without it forward runs unrecorded
         and "error" names the missing recorder.
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

    def used(self, kr, j, call, got):
        """R's regions: the tensors the last run of slot j used, as kiln_record's
        `regions` (`kr`, the module) lists them (forward's arguments as it got them, the
        parameters kiln set, the module's buffer copies, what forward returned)."""
        params, bufs, _, _, _ = self.plans[j]
        views = self.buffers.views[j]
        args = {n: t for n, t in zip(self.arg_names, call) if isinstance(t, self.torch.Tensor)}
        inputs = [(n, args.get(n, views[n])) for n in self.inputs]
        weights = [(tname, p) for p, _, _, tname in params]
        copies = [(tname, holder[attr]) for holder, attr, _, _, tname in bufs]
        return kr.regions(inputs, weights, copies, list(zip(self.outputs, got)))

    def record(self, j):
        """R: one run of slot j, its CUDA API calls recorded (see kiln_record's `Recorder`,
        imported from beside this script, on the cpu too): the answer of the lift's spec
        (issue 29, §1): {"error", "ops", "regions", "allocations"}. On the cpu the run is
        the same, unrecorded. Without the recorder the run is the same, and the answer's
        error says why nothing was recorded."""
        try:
            kr = import_beside("kiln_record")
        except Exception as e:  # noqa: BLE001 - the run still happens; the answer says why
            self.run(j)
            return {"error": f"no recorder (kiln_record.py) beside the runner: {describe_exception(e, 400)}",
                    "ops": [], "triton": [], "regions": [], "allocations": []}
        if self.buffers.device != "cuda":
            call, got = self.run(j)
            return kr.cpu_answer(self.used(kr, j, call, got))
        recorder = kr.Recorder(self.torch, self.sync, describe_exception)
        call, got = self.run(j, around=recorder)
        answer = recorder.answer()
        answer["regions"] = self.used(kr, j, call, got)
        return answer

    def kernels(self, j):
        """The GPU kernels one run of slot j launched, as torch's profiler saw them in this
        process (a claim: the worker classifies them and never times with them):
        {"kernels": [{"name", "calls", "us"}], "span_us", "error": null} or
        {"kernels": null, "error"}. `span_us` is the forward's span on the GPU, from its
        first kernel's start to its last kernel's end on any stream."""
        if self.buffers.device != "cuda":
            return {"kernels": None, "error": "kernels are recorded on the GPU only"}
        try:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                self.run(j)
                self.sync()
            seen = {}
            first, last = None, None
            for e in prof.events():
                if str(getattr(e, "device_type", "")).endswith("CUDA"):
                    name = str(e.name)[:KERNEL_NAME_CHARS]
                    calls, us = seen.get(name, (0, 0.0))
                    seen[name] = (calls + 1, us + float(e.time_range.elapsed_us()))
                    start, end = float(e.time_range.start), float(e.time_range.end)
                    first = start if first is None else min(first, start)
                    last = end if last is None else max(last, end)
            listed = sorted(seen.items(), key=lambda kv: -kv[1][1])[:KERNELS_MAX]
            span = round(last - first, 3) if first is not None else None
            return {"kernels": [{"name": n, "calls": c, "us": round(u, 3)} for n, (c, u) in listed],
                    "span_us": span, "error": None}
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


# ---- modules beside the script ----------------------------------------------------------


def import_beside(name):
    """The module `name` from this script's folder (kiln_extract, kiln_record: kiln writes
    them beside it), which `-I` leaves off sys.path; ImportError when it is not there."""
    import importlib

    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)  # -I leaves the script's folder off sys.path
    return importlib.import_module(name)


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
    try:
        ke = import_beside("kiln_extract")
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
