"""kiln's hosted runner's recorder: the `R` command of kiln_hosted.py (beside it).

One forward's CUDA runtime and driver API calls, taken down through CUPTI's callback API
(ctypes, no compiled helper), and its Triton launches (triton.runtime.jit.JITFunction.run
wrapped for the forward): the lift's recording (issue 29, §1). The runner imports this
module from its own folder when `R` comes (on the cpu too: its answer is built here).

Only the standard library and ctypes at import; torch and triton are what the runner
passes in (or, for Triton, what the candidate's file already imported). Nothing is
imported from kiln_hosted: how an exception is described for people is passed in
(`describe`: kiln_hosted's describe_exception).
"""

import ctypes
import os
import re
import sys


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

    def __init__(self, modules, describe):
        """`modules`: sys.modules when None; `describe(exception, limit)`: an exception as
        `error` says it (kiln_hosted's describe_exception)."""
        self.modules = sys.modules if modules is None else modules
        self.describe = describe
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
            self.error = f"a Triton launch could not be recorded: {self.describe(e, 400)}"


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
            text = str(e)
            tried.append(text if len(text) <= 200 else text[:197] + "...")
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

    def __init__(self, torch, sync, describe):
        """`describe(exception, limit)`: an exception as the answer's errors say it
        (kiln_hosted's describe_exception)."""
        self.torch, self.sync, self.describe = torch, sync, describe
        self.error, self.ops = None, []
        self.allocations, self.allocations_error = [], None
        self.history = False
        self.libs, self.subscriber, self.decoder = None, None, None
        self.threads = {}  # thread id -> [depth of API calls, the outermost call's op]
        self.triton = TritonCapture(None, describe)
        import threading

        self.thread_id = threading.get_ident

    def __enter__(self):
        self.start_history()
        try:
            self.subscribe()
        except RecordError as e:
            self.error = str(e)
        except Exception as e:  # noqa: BLE001 - no record is an answer too
            self.error = f"CUPTI: {self.describe(e, 400)}"
        try:
            self.triton.__enter__()
        except Exception as e:  # noqa: BLE001
            self.triton.__exit__(None, None, None)
            self.triton.error = f"Triton launches: {self.describe(e, 400)}"
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
                self.error = f"recording failed: {self.describe(e, 400)}"

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
            self.allocations_error = f"no allocator history: {self.describe(e, 400)}"

    def stop_history(self):
        if not self.history:
            return
        memory = self.torch.cuda.memory
        try:
            traces = memory._snapshot()["device_traces"][self.torch.cuda.current_device()]
            self.allocations, self.allocations_error = allocations_from(traces)
        except Exception as e:  # noqa: BLE001
            self.allocations_error = f"no allocator history: {self.describe(e, 400)}"
        finally:
            try:
                memory._record_memory_history(enabled=None)
            except Exception:  # noqa: BLE001 - it stays on: a cost, not a wrong answer
                pass


def cpu_answer(used):
    """R on the cpu: forward ran unrecorded; `used` is its regions (see `regions`)."""
    return {"error": "launches are recorded on the GPU only", "ops": [], "triton": [],
            "regions": used, "allocations": []}
