# Sourced by gpu-check.sh and gpu-check-multi.sh (bash): puts the CUDA driver, NVML and
# NVRTC libraries on LD_LIBRARY_PATH when the loader would not find them, and prints which
# of them (and CUPTI) it found. Defines found() and add_dir().
# cudarc dlopens libcuda.so.1 and libnvrtc.so.13 by name, nvml-wrapper libnvidia-ml.so.1.
# When one is not on the loader path (the toolkit's lib64 is often unknown to ldconfig),
# add the usual places, then the pip wheel that PyTorch images carry (nvidia-cuda-nvrtc).
found() { # found LIBNAME: true if the loader would find it
    ldconfig -p 2>/dev/null | grep -q "$1" && return 0
    local IFS=: d
    for d in ${LD_LIBRARY_PATH:-}; do
        [ -n "$d" ] && [ -e "$d/$1" ] && return 0
    done
    return 1
}
add_dir() { export LD_LIBRARY_PATH="$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; }
for lib in libcuda.so.1 libnvidia-ml.so.1 libnvrtc.so.13; do
    found "$lib" && continue
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu \
        /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/targets/x86_64-linux/lib; do
        if [ -e "$d/$lib" ]; then
            add_dir "$d"
            break
        fi
    done
done
if ! found libnvrtc.so.13 && command -v python3 >/dev/null 2>&1; then
    d=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
for base in dirs:
    for hit in glob.glob(os.path.join(base, "nvidia", "**", "libnvrtc.so.13"), recursive=True):
        print(os.path.dirname(hit))
        raise SystemExit
PY
    )
    [ -n "$d" ] && add_dir "$d"
fi
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
py=$(command -v python3 || true)
echo "python3: ${py:-not found}"
[ -n "$py" ] && "$py" -c 'import torch, sys; print("  torch", torch.__version__, "at", torch.__file__, "for", sys.executable)' 2>&1 | head -2
for lib in libcuda.so.1 libnvidia-ml.so.1 libnvrtc.so.13 libcupti.so.13; do
    if found "$lib"; then echo "  $lib: found"; else echo "  $lib: NOT FOUND"; fi
done
# The python with torch (the torch runner: baselines, the torch reference runner, the
# KernelBench import): $KILN_PYTHON, else the first of /opt/torch/.venv/bin/python3 and
# python3 that imports torch. Exported, so the GPU tests' torch cases find it too.
if [ -z "${KILN_PYTHON:-}" ]; then
    for cand in /opt/torch/.venv/bin/python3 python3; do
        if "$cand" -c 'import torch' >/dev/null 2>&1; then
            KILN_PYTHON=$(command -v "$cand")
            break
        fi
    done
fi
[ -n "${KILN_PYTHON:-}" ] && export KILN_PYTHON
echo "KILN_PYTHON=${KILN_PYTHON:-none (torch cases skip)}"
# libcupti (kernel times from CUPTI activity records) is optional: without it kiln times
# with CUDA events, and every GPU evaluation's timing.timer says so.

