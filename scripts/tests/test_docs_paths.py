"""Docs that cannot go stale: every repository path that README.md and docs/*.md name
(in `code spans` starting with one of the repository's top-level folders, and in relative
Markdown links) exists. Stdlib only; run by scripts/test.sh."""

import glob
import os
import re
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TOP = ("daemon/", "sandbox/", "proposers/", "sdk/", "scripts/", "docs/", "problems/",
       "deploy/", ".ci/")
# Placeholders a page uses on purpose (a version to come, a glob, an elided part).
PLACEHOLDER = re.compile(r"[*…<>{}$]|X\.Y\.Z|X_Y_Z")


def pages():
    return ["README.md"] + sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def named_paths(text):
    """Repository paths a page's code spans name (the first word, without a trailing
    `:line`, punctuation or arguments)."""
    for m in re.finditer(r"`([^`\n]+)`", text):
        words = m.group(1).strip().split()
        if not words:
            continue
        path = words[0].split(":")[0].rstrip(",.;)")
        if path.startswith(TOP) and not PLACEHOLDER.search(path):
            yield path


def linked_paths(page, text):
    """Targets of a page's relative Markdown links, relative to the repository."""
    for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue
        yield os.path.normpath(os.path.join(os.path.dirname(page), target))


class DocsName(unittest.TestCase):
    def test_every_named_path_exists(self):
        missing = []
        for page in pages():
            with open(os.path.join(ROOT, page), encoding="utf-8") as f:
                text = f.read()
            for path in list(named_paths(text)) + list(linked_paths(page, text)):
                if not os.path.exists(os.path.join(ROOT, path)):
                    missing.append(f"{page}: {path}")
        self.assertEqual(missing, [], "paths named in the docs that do not exist")

    def test_the_checker_sees_paths_and_skips_placeholders(self):
        text = ("see `daemon/src/lib.rs:12`, `scripts/test.sh --x`, `sdk/wit/since_vX.Y.Z/`, "
                "`problems/*/problem.toml`, `kiln status` and [api](api.md#errors)")
        self.assertEqual(list(named_paths(text)), ["daemon/src/lib.rs", "scripts/test.sh"])
        self.assertEqual(list(linked_paths("docs/x.md", text)), ["docs/api.md"])


if __name__ == "__main__":
    unittest.main()
