"""Reading problem folders on the caller's side, as the ``kiln`` CLI does.

A problem folder holds ``problem.toml`` and the reference and seed sources it names
(``[reference.host] file = "reference.c"``). :func:`load_problem` parses the TOML and
inlines each named file into the spec's ``source`` field, giving the JSON that
``POST /v1/problems`` takes. kilnd never reads paths chosen by a caller.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Union

from .errors import ProblemFolderError

__all__ = ["load_problem", "problem_folders", "MAX_SOURCE_BYTES"]

#: Largest source file a problem may ship (the same limit as kilnd's).
MAX_SOURCE_BYTES = 1 << 20

PathLike = Union[str, "os.PathLike[str]"]


def _toml_loads() -> Callable[[str], Dict[str, Any]]:
    """``tomllib.loads`` (Python 3.11+), else ``tomli.loads`` if installed."""
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib  # type: ignore[import-not-found,no-redef]
        except ImportError:
            raise ProblemFolderError(
                "reading problem.toml needs a TOML parser: Python 3.11+ has one built in; on "
                f"Python {sys.version_info.major}.{sys.version_info.minor} run `pip install tomli` "
                "(or install kiln with its extra: `pip install './sdk/python[toml]'`)"
            ) from None
    return tomllib.loads


def load_problem(folder: PathLike) -> Dict[str, Any]:
    """Reads ``folder/problem.toml`` and inlines the sources it names.

    Returns the problem spec as a dict ready to post. Raises
    :class:`~kiln.errors.ProblemFolderError` when a file is missing or unreadable, the
    TOML does not parse, or a source is named by a path rather than a plain file name
    in the folder. The spec's contents are checked by kilnd (a 400 names the fault).
    """
    folder = Path(folder)
    toml_path = folder / "problem.toml"
    try:
        text = toml_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ProblemFolderError(f"cannot read {toml_path}: {e}") from e
    loads = _toml_loads()
    try:
        spec = loads(text)
    except ValueError as e:  # tomllib.TOMLDecodeError and tomli's are ValueErrors
        raise ProblemFolderError(f"{toml_path}: {e}") from e
    for section in ("reference", "seed"):
        kernels = spec.get(section, {})
        if not isinstance(kernels, dict):
            continue
        for backend, ks in kernels.items():
            if not isinstance(ks, dict):
                continue
            ks["source"] = _read_source(folder, f"{section}.{backend}", ks.get("file"))
    return spec


def _read_source(folder: Path, where: str, name: Any) -> str:
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ProblemFolderError(
            f"{folder / 'problem.toml'}: {where}.file = {name!r} must be a plain file name "
            "in the problem folder"
        )
    path = folder / name
    try:
        size = path.stat().st_size
        if size > MAX_SOURCE_BYTES:
            raise ProblemFolderError(f"{path} is larger than {MAX_SOURCE_BYTES} bytes")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ProblemFolderError(f"cannot read {path} (named by {where}.file): {e}") from e


def problem_folders(root: PathLike) -> List[Path]:
    """``root`` itself if it holds a ``problem.toml``, else its sub-folders that do, sorted."""
    root = Path(root)
    if (root / "problem.toml").is_file():
        return [root]
    try:
        found = sorted(p for p in root.iterdir() if (p / "problem.toml").is_file())
    except OSError as e:
        raise ProblemFolderError(f"cannot read {root}: {e}") from e
    if not found:
        raise ProblemFolderError(f"{root} holds no problem.toml (nor folders with one)")
    return found
