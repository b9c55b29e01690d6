#!/usr/bin/env python3
"""Runs the workspace's Rust test binaries several at a time, one process per binary.

`cargo test` runs its test binaries one after another, so the suite's wall time is the sum
of theirs, although most of them spend it waiting on child processes (kilnd, PostgreSQL,
compilers). This script lets cargo build them (`cargo test --no-run`, the same binaries and
the same features), then runs up to --jobs binaries at once. Each binary runs exactly as
cargo would run it: in its package's folder, with CARGO_MANIFEST_DIR and CARGO set, with
its own test threads, so the tests inside a binary see the same neighbours (and the same
shared fixtures and locks) as under `cargo test`. The doc tests run as one more job.

Each binary's output is printed whole when it ends, with its time; every binary runs even
when another fails (like `cargo test --no-fail-fast`), and the last lines list each
binary's time, slowest first, and the failures. Exit status 0 only when all passed.

Usage: scripts/run-tests.py [--jobs N] [--env K=V ...] [--only PKG:TARGET ...] [--no-doc]
                            -- CARGO_TEST_ARGS...
  CARGO_TEST_ARGS select the binaries as for `cargo test` (e.g. --workspace --locked, or
  -p kiln-gpu --lib --test cxx); --only picks among them without changing the build (a
  narrower -p would resolve other features and rebuild). --env values reach the test processes only, not cargo:
  a variable a build script watches (CUDA_HOME, for one) would otherwise rebuild crates.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

# The order binaries start in. The suite is mostly CPU-bound on small machines, so
# running binaries side by side gains only where one waits while another computes: the
# cluster tests (about 5 minutes alone, mostly waiting on leases and a database restart)
# start first and run beside all the others, one after another; the search tests (about 3
# minutes, also CPU-heavy) start last, when the cluster tests are nearly done. Unlisted
# binaries run in cargo's order between the two.
FIRST = ["cluster"]
LAST = ["search"]


def built_tests(cargo, cargo_args):
    """The test executables cargo builds for CARGO_ARGS, building them if needed."""
    cmd = [cargo, "test", "--no-run", "--message-format=json-render-diagnostics", *cargo_args]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"run-tests: `{' '.join(cmd)}` failed (exit {proc.returncode})")
    tests = []
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        package = msg["package_id"]
        # package_id: "path+file:///…/daemon#kiln-daemon@0.1.0" (or "…#0.1.0" when the
        # folder is named after the package); the manifest path is given too.
        manifest = msg["manifest_path"]
        name = package.rsplit("#", 1)[-1].split("@")[0]
        if name[:1].isdigit():
            name = os.path.basename(os.path.dirname(manifest))
        label = f"{name} {target['kind'][0]} {target['name']}"
        tests.append(
            {
                "keys": {f"{name}:{target['name']}", f"{name}:{target['kind'][0]}"},
                "label": label,
                "target": target["name"],
                "exe": msg["executable"],
                "dir": os.path.dirname(manifest),
            }
        )
    return tests


def order(tests):
    """FIRST, then cargo's order, then LAST."""

    def rank(t):
        if t["target"] in FIRST:
            return (0, FIRST.index(t["target"]))
        if t["target"] in LAST:
            return (2, LAST.index(t["target"]))
        return (1, 0)

    return sorted(tests, key=rank)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("KILN_TEST_JOBS", "2")))
    ap.add_argument("--env", action="append", default=[], metavar="K=V")
    ap.add_argument("--no-doc", action="store_true", help="skip the doc tests")
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PACKAGE:TARGET",
        help="run only these binaries (TARGET: a test target's name, or lib); the build "
        "is still that of CARGO_TEST_ARGS, so the same binaries are reused",
    )
    ap.add_argument("cargo_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cargo_args = [a for a in args.cargo_args if a != "--"]
    if args.jobs < 1:
        sys.exit("run-tests: --jobs must be at least 1")
    extra_env = {}
    for kv in args.env:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            sys.exit(f"run-tests: --env wants K=V, got {kv!r}")
        extra_env[k] = v

    cargo = os.environ.get("CARGO", "cargo")
    jobs = order(built_tests(cargo, cargo_args))
    if args.only:
        unknown = [o for o in args.only if not any(o in t["keys"] for t in jobs)]
        if unknown:
            sys.exit(f"run-tests: no test binary {', '.join(unknown)}")
        jobs = [t for t in jobs if t["keys"] & set(args.only)]
    if not jobs:
        sys.exit("run-tests: no test binaries selected")

    print_lock = threading.Lock()
    results = []  # (label, seconds, exit code)
    queue = list(jobs)
    queue_lock = threading.Lock()

    def run_one(job):
        env = dict(os.environ)
        env.setdefault("CARGO", cargo)
        if "exe" in job:
            env["CARGO_MANIFEST_DIR"] = job["dir"]
            env.update(extra_env)
            cmd = [job["exe"]]
        else:
            cmd = job["cmd"]
        with tempfile.TemporaryFile(mode="w+b") as out:
            start = time.monotonic()
            rc = subprocess.run(cmd, cwd=job["dir"], env=env, stdout=out, stderr=subprocess.STDOUT).returncode
            took = time.monotonic() - start
            out.seek(0)
            text = out.read().decode("utf-8", "replace")
        with print_lock:
            print(f"     Running {job['label']} ({job.get('exe', ' '.join(cmd))})", flush=True)
            sys.stdout.write(text)
            print(f"-- {job['label']}: {took:.1f} s (exit {rc})", flush=True)
            results.append((job["label"], took, rc))

    def worker():
        while True:
            with queue_lock:
                if not queue:
                    return
                job = queue.pop(0)
            run_one(job)

    start = time.monotonic()
    # The doc tests are compiled as they run, under cargo's build lock (which the test
    # binaries that build plugins or tools take too): they run first, alone.
    if not args.no_doc:
        doc_args = [a for a in cargo_args if a not in ("--lib", "--bins", "--tests")]
        run_one({"label": "doc tests", "cmd": [cargo, "test", "--doc", *doc_args], "dir": os.getcwd()})
    threads = [threading.Thread(target=worker) for _ in range(min(args.jobs, len(jobs)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    print(f"== test binaries by time ({len(results)}, {args.jobs} at a time after the doc tests, {time.monotonic() - start:.0f} s in all)")
    for label, took, rc in sorted(results, key=lambda r: -r[1]):
        print(f"{took:8.1f} s  {label}{'' if rc == 0 else f'  FAILED (exit {rc})'}")
    failed = [label for label, _, rc in results if rc != 0]
    if failed:
        print(f"{len(failed)} test binaries failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
