#!/usr/bin/env python3
"""Count a corpus run (scripts/corpus/run.sh OUT) by outcome, and sort each failure into
why it fails: out of scope by design, the candidate's own error, or not extracted.

Usage: summarize.py OUT [corpus...]   (reads OUT/<corpus>.jsonl and OUT/<corpus>.results.jsonl)

The rules read the compile error and what the extractor recorded; a failure no rule
explains is printed as "unexplained" with its first error, to be looked at.
"""

import collections
import json
import re
import sys

CORPORA = ["good-kernels", "leaderboard", "robust-kbench", "cuda-l1", "kernelbench-com"]

# Failures looked at one by one, by the published file they come from (the rules below
# cannot tell these from a kiln fault): why the code itself fails.
REVIEWED = {
    "cuda-l1/h100.json:L1_52": "__builtin_prefetch (a GCC host builtin) in a kernel",
    "cuda-l1/h100.json:L2_47": "__log1pf does not exist",
    "kernelbench-com/public/runs/20260716_091632_kinetic-claude_kinetic-0715_07_w4a16_gemm_solution.py.txt#2":
        "static shared memory above the GPU's 227 KiB (w4_tc_kernel<8, …>: 258 KiB)",
    "kernelbench-com/public/runs/h100/20260716_091632_kinetic-claude_kinetic-0715_07_w4a16_gemm_solution.py.txt#2":
        "static shared memory above the GPU's 227 KiB (w4_tc_kernel<8, …>: 258 KiB)",
}

# What a failure of main's kiln (before this work's fixes) was, read from its error.
KILN_FIXED = [
    (r"unrecognized option --(expt-relaxed-constexpr|extended-lambda|expt-extended-lambda)",
     "kiln passed nvcc's --expt-relaxed-constexpr/--extended-lambda on to NVRTC"),
    (r'namespace "std" has no member', "a std:: name used without its #include (torch brought it)"),
    (r"Including <cub/cub\.cuh> is not supported", "<cub/cub.cuh> (the toolkit's refuses NVRTC)"),
    (r'"cudaGridDependencySynchronize"|"cudaTriggerProgrammaticLaunchCompletion"',
     "programmatic dependent launch's device calls undeclared under NVRTC"),
    (r'(incomplete type|identifier) "(const )?(__half2?|__nv_bfloat162?|__nv_fp8\w*)"',
     "fp16/bf16/fp8 types used without their #include (torch brought them)"),
    (r'attribute "__global__" does not apply here',
     "fp16/bf16/fp8 types used without their #include (torch brought them)"),
]


def why(entry, result):
    """(scope, reason) of one result."""
    status = result.get("status")
    if status == "ok":
        return "compiled", ""
    if status == "not_extracted":
        cause = result.get("cause", "")
        if "not valid Python" in cause:
            return "not extracted", "the published file is not valid Python"
        if "built at run time" in cause:
            return "not extracted", "the CUDA source is built at run time (f-string, method)"
        return "not extracted", cause
    if result["id"] in REVIEWED:
        return "candidate's own error", REVIEWED[result["id"]]
    err = result.get("error", "")
    cause = result.get("cause", "")
    for pattern, reason in KILN_FIXED:
        if re.search(pattern, err):
            return "kiln's fault (fixed since)", reason
    if "expected an expression" in cause and "({" in entry.get("source", ""):
        return "out of scope", "GNU statement expressions ({ ... }), a GCC extension NVRTC does not take"
    arch = [f for f in result.get("flags_dropped", []) if re.search(r"sm_1\d\d|compute_1\d\d", f)]
    m = re.search(r"header <([^>]+)> not found", cause)
    if m and m.group(1).startswith(("cutlass/", "cute/")):
        return "out of scope", "needs CUTLASS/CuTe headers"
    if m and not m.group(1).startswith(("cuda", "cub/", "thrust/", "nv/", "crt/")):
        return "out of scope", f"multi-file source: includes its own file <{m.group(1)}>"
    if re.search(r"Including <(cub/device|thrust)/", err):
        return "out of scope", "CUB device-wide algorithm / Thrust (launched from host code)"
    if cause == "refused: host code" and re.search(r"\b(at|c10|torch)::", err):
        return "out of scope", "torch types used inside device code"
    if arch:
        return "out of scope", f"written for another GPU ({', '.join(arch)})"
    if "tcgen05" in err or "sm_100" in err:
        return "out of scope", "Blackwell-only instructions (tcgen05)"
    return "unexplained", cause


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    corpora = sys.argv[2:] or CORPORA
    for c in corpora:
        try:
            entries = {json.loads(l)["id"]: json.loads(l) for l in open(f"{out}/{c}.jsonl")}
            results = [json.loads(l) for l in open(f"{out}/{c}.results.jsonl")]
        except FileNotFoundError:
            continue
        summary = next((r["summary"] for r in results if "summary" in r), {})
        results = [r for r in results if "id" in r]
        files = {e["path"] for e in entries.values()}
        counts = collections.Counter()
        reasons = collections.Counter()
        ms = sorted(r["ms"] for r in results if r.get("status") == "ok")
        names = sum(len(e.get("kernels", [])) for e in entries.values())
        skipped = sum(len(e.get("names_skipped", [])) for e in entries.values())
        commit = next(iter(entries.values()))["commit"][:12] if entries else "?"
        for r in results:
            scope, reason = why(entries.get(r["id"], {}), r)
            counts[scope] += 1
            if scope != "compiled":
                reasons[(scope, reason)] += 1
        print(f"== {c} @ {commit}: {len(files)} published files with a kernel, "
              f"{len(results)} candidates, {names} kernel names ({skipped} unnamed), "
              f"NVRTC {summary.get('nvrtc', '?')} {summary.get('arch', '')}")
        print("   " + ", ".join(f"{k}: {v}" for k, v in counts.most_common()))
        if ms:
            p = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
            print(f"   compile ms (ok): median {p(0.5):.0f}, p90 {p(0.9):.0f}, max {ms[-1]:.0f}")
        for (scope, reason), n in sorted(reasons.items(), key=lambda x: (-x[1], x[0])):
            print(f"   {n:4}  {scope}: {reason}")


if __name__ == "__main__":
    main()
