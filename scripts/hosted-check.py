#!/usr/bin/env python3
"""Hosted ModelNew files through a running kilnd, as a user would submit them, on a GPU
host (scripts/gpu-check.sh's `hosted` step runs it).

    hosted-check.py KILN CORPUS [--python PY] [--helper kiln_torch.py] [--out DIR]
                    [--only REGEX] [--parallel] [--no-baselines] [--lift-bench N]

CORPUS holds `manifest.json` (a list of {"file", "problem_file", "kind", "repo", "path",
...}), the files, and the KernelBench problem files they answer (`problem_file`, relative
to CORPUS or to --problems-root, e.g. KernelBench's own `KernelBench/` folder).
Every problem folder is imported (`kiln problems import kernelbench`) and registered, the
torch baselines (eager, torch.compile) of each answered problem are measured, and every
file is submitted as written (`kiln submit --problem NAME FILE --wait`). One `SUMMARY`
line per file: verdict, trust, median, speedups against eager and torch.compile, the
message, and what lifting it came to (the lifted candidate's verdict and median, or why it
stayed hosted); then the counts of verdicts and of lift outcomes. Exit 0 when every file got a verdict (any verdict: judging the
answers is kiln's job here, not this script's) and every entry's `expect` (verdicts it
must get, kiln's own examples), `expect_lift` (`lifted` with the hosted verdict, or the
codes of the reasons it may stay hosted for), `min_median_us` and `min_library_fraction` (the
library kernels' share of the profiled forward's GPU time, `telemetry.hosted`) and
`same_harness_speedup` ([low, high]: its speedup against `torch-eager-hosted`, the problem's
own module timed through the same hosted path) held; 1 otherwise.

With --lift-bench N, every file lifted `ok` is then timed as a contract candidate at
throughput: `kiln bench throughput --candidate LIFTED --count N` (its lifted candidate as
`kiln submit` takes it, varied by a comment tag, compiles fresh), and so is the entry's
`hand_written` candidate (a JSON candidate file relative to CORPUS, the same problem
answered by hand) when it names one. One `LIFTBENCH` line per pass.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time


def problem_name(path):
    """kiln's name of a KernelBench file (kiln_types::kernelbench::problem_name)."""
    stem = os.path.splitext(os.path.basename(path))[0]
    level = os.path.basename(os.path.dirname(path))
    slug = ""
    for c in stem.lower():
        if c.isascii() and c.isalnum():
            slug += c
        elif not slug.endswith("-"):
            slug += "-"
    slug = slug.strip("-")
    if level.startswith("level") and level[5:].isdigit():
        return f"kb-l{level[5:]}-{slug}"[:120].rstrip("-")
    return f"kb-{slug}"[:120].rstrip("-")


def sp_of(base, med):
    """base / med as a speedup, or '-'."""
    return f"{base / med:.2f}x" if (base and med) else "-"


def run(cmd, timeout, log=None):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        out, code = p.stdout, p.returncode
        err = p.stderr
    except subprocess.TimeoutExpired as e:
        out, code, err = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), 124, "timeout"
    if log:
        log.write(f"$ {' '.join(cmd)}  ({time.time() - t0:.1f} s, exit {code})\n{out}\n{err}\n")
        log.flush()
    return code, out, err


BASELINE_KINDS = ("torch-eager", "torch-compile", "torch-eager-hosted", "torch-compile-hosted")


def baseline_medians(kiln, name, log):
    """{kind: µs} of the problem's torch baselines measured by kilnd: in process
    (`torch-eager`, `torch-compile`: their first measured variant, fp32 first) and through
    the hosted path (`torch-eager-hosted`, `torch-compile-hosted`); a kind not measured is
    absent."""
    code, out, _ = run([kiln, "problems", "baseline", name, "-o", "json"], 1200, log)
    if code != 0:
        return {}
    try:
        v = json.loads(out)
    except json.JSONDecodeError:
        return {}
    got = {}
    for r in v.get("results", []):
        m = (r.get("timing") or {}).get("median_us")
        rname = str(r.get("name", ""))
        hosted = r.get("harness") == "hosted"
        for kind in BASELINE_KINDS:
            if hosted != kind.endswith("-hosted"):
                continue
            if r.get("status") == "measured" and m and rname.startswith(kind) and kind not in got:
                got[kind] = m
    return got


def throughput_pass(kiln, candidate_file, count, log):
    """`kiln bench throughput` over CANDIDATE_FILE's variants, fresh compiles only: the
    report's first pass, or None."""
    code, out, _ = run([kiln, "bench", "throughput", "--candidate", candidate_file, "--count",
                        str(count), "--in-flight", "16", "--no-cached", "-o", "json"], 1200, log)
    try:
        passes = json.loads(out).get("passes") or []
    except json.JSONDecodeError:
        return None
    return passes[0] if code == 0 and passes else None


def lift_bench(kiln, corpus, args, k, m, name, lifted_id, log):
    """Throughput of a file's lifted candidate beside its entry's hand-written one."""
    code, out, _ = run([kiln, "show", lifted_id, "-o", "json"], 120, log)
    try:
        candidate = json.loads(out).get("candidate")
    except json.JSONDecodeError:
        candidate = None
    if code != 0 or not candidate:
        print(f"LIFTBENCH {m['file']} problem={name} lifted={lifted_id} error='no lifted candidate'",
              flush=True)
        return
    path = os.path.join(args.out, f"lifted-{k}.json")
    with open(path, "w") as f:
        json.dump(candidate, f)
    runs = [("lifted", path)]
    if m.get("hand_written"):
        runs.append(("hand_written", os.path.join(corpus, m["hand_written"])))
    for label, file in runs:
        p = throughput_pass(kiln, file, args.lift_bench, log)
        if p is None:
            print(f"LIFTBENCH {m['file']} problem={name} {label} error='bench failed (see hosted-check.log)'",
                  flush=True)
            continue
        print(f"LIFTBENCH {m['file']} problem={name} {label} candidates={p.get('candidates')} "
              f"per_minute={round(p.get('per_minute') or 0, 1)} busy={round(p.get('busy_fraction') or 0, 3)} "
              f"verdicts={json.dumps(p.get('verdicts'), sort_keys=True)}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln")
    ap.add_argument("corpus")
    ap.add_argument("--python", default=os.environ.get("KILN_PYTHON", "python3"))
    ap.add_argument("--helper", default=None)
    ap.add_argument("--out", default=".")
    ap.add_argument("--only", default=None, help="a regular expression on the file names")
    ap.add_argument("--parallel", action="store_true",
                    help="submit every file first, then wait for each (kilnd evaluates them "
                         "as its lanes and compile slots allow)")
    ap.add_argument("--no-baselines", action="store_true",
                    help="do not measure the torch baselines (no speedups)")
    ap.add_argument("--problems-root", default=None,
                    help="where the manifest's problem_file paths start (default: CORPUS)")
    ap.add_argument("--lift-bench", type=int, default=0, metavar="N",
                    help="time each file lifted ok (and its entry's hand_written candidate) "
                         "with `kiln bench throughput --count N`")
    args = ap.parse_args()
    kiln, corpus = args.kiln, args.corpus
    log = open(os.path.join(args.out, "hosted-check.log"), "a")
    manifest = json.load(open(os.path.join(corpus, "manifest.json")))
    if args.only:
        manifest = [m for m in manifest if re.search(args.only, m["file"])]
    imported = os.path.join(args.out, "kb-hosted")
    # Only the answered problems, copied level by level (an import describes every file of
    # its folder).
    staged = os.path.join(args.out, "kb-problems")
    root = args.problems_root or corpus
    for m in manifest:
        # "./…": a problem file of the corpus itself (its own folder level: "problems").
        own = m["problem_file"].startswith("./")
        src = os.path.join(corpus if own else root, m["problem_file"])
        dst = os.path.join(staged, os.path.basename(os.path.dirname(m["problem_file"])),
                           os.path.basename(m["problem_file"]))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(src, "rb") as f, open(dst, "wb") as g:
            g.write(f.read())
    levels = sorted(os.listdir(staged))
    for level in levels:
        cmd = [kiln, "problems", "import", "kernelbench", os.path.join(staged, level), "--out",
               os.path.join(imported, level), "--python", args.python, "-o", "json"]
        if args.helper:
            cmd += ["--helper", args.helper]
        code, out, _ = run(cmd, 1200, log)
        try:
            refused = json.loads(out).get("refused", [])
        except json.JSONDecodeError:
            refused = [{"file": level, "reason": "no import report"}]
        for r in refused:
            print("import refused:", r.get("file"), "-", str(r.get("reason"))[:200], flush=True)
        run([kiln, "problems", "add", os.path.join(imported, level)], 600, log)
    counts, failed_jobs, baselines, unmet, lifts = {}, 0, {}, [], {}
    lifted_ok = []  # (manifest entry, problem name, lifted candidate id)
    submitted, started = {}, time.time()
    if args.parallel:
        # Every file queued at once; each then waited for in turn.
        for k, m in enumerate(manifest):
            name = problem_name(m["problem_file"])
            code, out, err = run([kiln, "submit", "--problem", name, os.path.join(corpus, m["file"]),
                                  "-o", "json"], 600, log)
            try:
                submitted[k] = json.loads(out).get("id")
            except json.JSONDecodeError:
                submitted[k] = None
    for k, m in enumerate(manifest):
        name = problem_name(m["problem_file"])
        if name not in baselines:
            baselines[name] = {} if args.no_baselines else baseline_medians(kiln, name, log)
        eager, compiled = baselines[name].get("torch-eager"), baselines[name].get("torch-compile")
        eager_h, compiled_h = baselines[name].get("torch-eager-hosted"), baselines[name].get("torch-compile-hosted")
        t0 = time.time()
        if args.parallel and submitted.get(k):
            code, out, err = run([kiln, "show", submitted[k], "--wait", "1800", "-o", "json"], 1900, log)
            t0 = started
        elif args.parallel:
            code, out, err = 1, "", "not submitted (see hosted-check.log)"
        else:
            code, out, err = run([kiln, "submit", "--problem", name, os.path.join(corpus, m["file"]),
                                  "--wait", "-o", "json"], 1800, log)
        wall = time.time() - t0
        try:
            r = json.loads(out)
        except json.JSONDecodeError:
            r = {}
        rec = r.get("record", r)
        e = rec.get("evaluation") or r.get("evaluation") or {}
        job = rec.get("job") or r.get("job") or {}
        verdict = e.get("verdict") or f"job {job.get('state')}: {job.get('error') or err.strip()[-300:]}"
        if not e.get("verdict"):
            failed_jobs += 1
        counts[e.get("verdict") or "failed job"] = counts.get(e.get("verdict") or "failed job", 0) + 1
        med = (e.get("timing") or {}).get("median_us")
        hk = ((e.get("telemetry") or {}).get("hosted") or {})
        kernel_us = (hk.get("own_us") or 0) + (hk.get("library_us") or 0) if hk else None
        sp = lambda base: f"{base / med:.2f}x" if (base and med) else "-"
        # Lifting (issue 29): the lifted candidate's verdict and time beside the hosted ones.
        lift = rec.get("lift") or r.get("lift") or {}
        if lift.get("outcome") == "lifted":
            lifted = (f"lift=lifted lifted_id={lift.get('candidate_id')} lifted_verdict={lift.get('verdict')} "
                      f"lifted_state={lift.get('state')} lifted_median_us={lift.get('median_us')} "
                      f"lifted_speedup_eager={sp_of(eager, lift.get('median_us'))} "
                      f"lifted_msg={(lift.get('message') or '')[:160]!r}")
            lifts[lift.get("verdict") or "no verdict"] = lifts.get(lift.get("verdict") or "no verdict", 0) + 1
            if lift.get("verdict") == "ok":
                lifted_ok.append((m, name, lift.get("candidate_id")))
        elif lift:
            lifted = f"lift=not_lifted lift_code={lift.get('code')} lift_reason={(lift.get('reason') or '')[:200]!r}"
            lifts["not_lifted:" + str(lift.get("code"))] = lifts.get("not_lifted:" + str(lift.get("code")), 0) + 1
        else:
            lifted = "lift=none"
        print(f"SUMMARY {m['file']} problem={name} kind={m.get('kind')} verdict={verdict} "
              f"trust={e.get('trust')} tier={e.get('tier')} median_us={med} eager_us={eager} compile_us={compiled} "
              f"speedup_eager={sp(eager)} speedup_compile={sp(compiled)} "
              f"eager_hosted_us={eager_h} compile_hosted_us={compiled_h} "
              f"speedup_eager_hosted={sp(eager_h)} speedup_compile_hosted={sp(compiled_h)} wall_s={wall:.1f} "
              f"kernels_us={kernel_us} library_fraction={hk.get('library_fraction')} "
              f"overhead_us={(med - kernel_us) if (med and kernel_us) else None} "
              f"msg={(e.get('message') or '')[:240]!r} {lifted}", flush=True)
        # kiln's own examples say what they must get.
        want = m.get("expect")
        if want and e.get("verdict") not in want:
            unmet.append(f"{m['file']}: {e.get('verdict')} (expected one of {want})")
        # ... and what lifting them must come to (`lifted`, or the code of the reason).
        want_lift = m.get("expect_lift")
        got_lift = "lifted" if lift.get("outcome") == "lifted" else lift.get("code")
        if want_lift and got_lift not in want_lift:
            unmet.append(f"{m['file']}: lift {got_lift} (expected one of {want_lift})")
        if want_lift == ["lifted"] and lift.get("verdict") != e.get("verdict"):
            unmet.append(f"{m['file']}: lifted verdict {lift.get('verdict')}, hosted {e.get('verdict')}")
        band = m.get("same_harness_speedup")
        if band and not args.no_baselines:
            ratio = (eager_h / med) if (eager_h and med) else None
            if ratio is None or not band[0] <= ratio <= band[1]:
                unmet.append(f"{m['file']} on {name}: speedup against torch-eager-hosted {ratio} "
                             f"outside {band}")
        if m.get("min_median_us") and med is not None and med < m["min_median_us"]:
            unmet.append(f"{m['file']}: median {med} us below {m['min_median_us']}")
        if m.get("min_library_fraction") is not None and e.get("verdict") == "ok":
            frac = hk.get("library_fraction")
            if frac is None or frac < m["min_library_fraction"]:
                unmet.append(f"{m['file']}: library fraction {frac} below {m['min_library_fraction']}")
    if args.lift_bench > 0:
        for k, (m, name, lifted_id) in enumerate(lifted_ok):
            lift_bench(kiln, corpus, args, k, m, name, lifted_id, log)
    print("COUNTS", json.dumps(counts, sort_keys=True), "failed_jobs", failed_jobs, flush=True)
    print("LIFTS", json.dumps(lifts, sort_keys=True), flush=True)
    for u in unmet:
        print("EXPECTATION NOT MET", u, flush=True)
    return 1 if failed_jobs or unmet else 0


if __name__ == "__main__":
    sys.exit(main())
