#!/usr/bin/env python3
"""Turn published AI-generated CUDA kernels into the candidates a user would submit to kiln.

For each published file (read from a git mirror of its repository; the corpus itself never
enters the project) this writes one JSON line: the CUDA device source with only the
torch/pybind host wrapper removed, the `__global__` kernels it defines as kiln launch names
(C++ name expressions), and the nvcc flags its author gave. The extraction itself (what is
removed, how kernels are named) is sandbox/hosted/kiln_extract.py, which kiln's hosted
runner uses too (`kiln_hosted.py device-source`); this script reads the corpora.

Usage: extract.py CORPUS GIT_DIR OUT.jsonl [COMMIT]
  CORPUS: good-kernels | leaderboard | robust-kbench | cuda-l1 | kernelbench-com
  GIT_DIR: the repository's mirror (a bare git directory), read at COMMIT (default HEAD).
"""

import json
import os
import re
import subprocess
import sys

# The extractor lives beside kiln's hosted runner (sandbox/hosted/kiln_extract.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sandbox", "hosted"))
from kiln_extract import Unresolved, extract, kiln_flags, python_sources  # noqa: E402

# ---------------------------------------------------------------- reading the corpora


def git(gitdir, *args):
    return subprocess.run(
        ["git", "--git-dir", gitdir, *args], check=True, capture_output=True
    ).stdout


REV = "HEAD"  # the commit read (argument 4)


def ls(gitdir):
    return git(gitdir, "ls-tree", "-r", "--name-only", REV).decode().splitlines()


def show(gitdir, path):
    return git(gitdir, "show", f"{REV}:{path}").decode("utf-8", "replace")


def published(corpus, gitdir):
    """(id, kind, text) for each published file of the corpus; kind is 'py' or 'cu'."""
    files = ls(gitdir)
    if corpus == "good-kernels":
        for p in sorted(f for f in files if re.fullmatch(r"[^/]+/src\.py", f)):
            yield p, "py", show(gitdir, p)
    elif corpus == "leaderboard":
        for p in sorted(f for f in files if re.fullmatch(r"docs/assets/solutions/[^/]+\.py", f)):
            yield p, "py", show(gitdir, p)
    elif corpus == "robust-kbench":
        for p in sorted(f for f in files if f.endswith(".cu")):
            yield p, "cu", show(gitdir, p)
    elif corpus == "cuda-l1":
        data = json.loads(show(gitdir, "optimized_cuda_code/codes/h100.json"))
        # {"1": [rows of level 1], "2": [...], "3": [...]}, each row a KernelBench task.
        for level, rows in sorted(data.items()):
            for row in rows:
                code = row.get("custom_code")
                if code:
                    yield f"h100.json:L{level}_{row.get('task_id')}", "py", code
    elif corpus == "kernelbench-com":
        for p in sorted(f for f in files if re.fullmatch(r"public/runs/.*_solution\.py\.txt", f)):
            yield p, "py", show(gitdir, p)
    else:
        raise SystemExit(f"unknown corpus {corpus!r}")


def main():
    global REV
    if len(sys.argv) not in (4, 5):
        raise SystemExit(__doc__)
    corpus, gitdir, out_path = sys.argv[1:4]
    REV = sys.argv[4] if len(sys.argv) == 5 else "HEAD"
    commit = git(gitdir, "rev-parse", REV).decode().strip()
    n = 0
    with open(out_path, "w") as out:
        for path, kind, text in published(corpus, gitdir):
            if "__global__" not in text:
                continue
            base = {"corpus": corpus, "commit": commit, "path": path}
            try:
                sources = [(text, ["-O3", "--use_fast_math"])] if kind == "cu" else python_sources(text)
            except Unresolved as e:
                out.write(json.dumps({"id": f"{corpus}/{path}", **base, "extract_error": str(e)}) + "\n")
                n += 1
                continue
            if not sources:
                out.write(json.dumps({"id": f"{corpus}/{path}", **base,
                                      "extract_error": "no CUDA source holding a kernel"}) + "\n")
                n += 1
                continue
            for k, (src, flags) in enumerate(sources):
                sid = f"{corpus}/{path}" + (f"#{k + 1}" if len(sources) > 1 else "")
                device_src, kernels, skipped, removed = extract(src, kiln_flags(flags))
                out.write(json.dumps({
                    "id": sid, **base, "source": device_src, "kernels": kernels,
                    "names_skipped": skipped, "flags": kiln_flags(flags), "removed": removed,
                }) + "\n")
                n += 1
    print(f"{corpus}: {n} candidates -> {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
