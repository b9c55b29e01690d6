"""Building candidates: device code plus a declarative launch plan.

A candidate can always be given as a plain ``dict`` in the wire shape::

    {"problem": "vecadd-4096", "language": "c", "source": "void k(...) {...}",
     "launches": [{"kernel": "k", "args": ["x", "y", {"i32": 4096}]}]}

The dataclasses here build the same thing with names checked by the type checker;
:func:`i32` and friends write typed scalar arguments.

A KernelBench ``ModelNew`` file (``class ModelNew(nn.Module)`` with its ``load_inline``
CUDA, Triton kernels and torch layers) is a *hosted* candidate, run as written in kiln's
jailed hosted runner: :func:`modelnew` builds one from the file or its text::

    kiln.modelnew("kb-l1-19-relu", "answers/relu.py")    # {"language": "modelnew", ...}
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

__all__ = [
    "Launch",
    "Scratch",
    "Candidate",
    "CandidateLike",
    "candidate_dict",
    "modelnew",
    "defines_model_new",
    "HOSTED_LANGUAGES",
    "i32",
    "i64",
    "u32",
    "u64",
    "f32",
    "f64",
]

Arg = Union[str, Dict[str, Union[int, float]]]


def i32(v: int) -> Dict[str, int]:
    """A 32-bit signed integer argument."""
    return {"i32": int(v)}


def i64(v: int) -> Dict[str, int]:
    """A 64-bit signed integer argument."""
    return {"i64": int(v)}


def u32(v: int) -> Dict[str, int]:
    """A 32-bit unsigned integer argument."""
    return {"u32": int(v)}


def u64(v: int) -> Dict[str, int]:
    """A 64-bit unsigned integer argument."""
    return {"u64": int(v)}


def f32(v: float) -> Dict[str, float]:
    """A 32-bit float argument."""
    return {"f32": float(v)}


def f64(v: float) -> Dict[str, float]:
    """A 64-bit float argument."""
    return {"f64": float(v)}


@dataclass
class Launch:
    """One kernel launch: a tensor or scratch name (``str``) or a typed scalar per arg.

    ``grid``, ``block``, ``shared_bytes``, ``cooperative`` and ``cluster`` matter on the cuda
    backend only, where ``kernel`` may be a C++ name (``ns::k``, ``k<256, float>``).
    """

    kernel: str
    args: Sequence[Arg] = ()
    grid: Tuple[int, int, int] = (1, 1, 1)
    block: Tuple[int, int, int] = (1, 1, 1)
    shared_bytes: int = 0
    cooperative: bool = False
    cluster: Optional[Tuple[int, int, int]] = None

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "kernel": self.kernel,
            "grid": list(self.grid),
            "block": list(self.block),
            "shared_bytes": self.shared_bytes,
            "args": list(self.args),
        }
        if self.cooperative:
            d["cooperative"] = True
        if self.cluster is not None:
            d["cluster"] = list(self.cluster)
        return d


@dataclass
class Scratch:
    """A scratch buffer, zeroed before each run, usable by name in launch args."""

    name: str
    dtype: str
    elems: int

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "elems": self.elems}


@dataclass
class Candidate:
    """A candidate kernel: ``language`` is ``"c"`` (host backend), ``"cuda"`` or
    ``"triton"`` (cuda backend). A hosted ``ModelNew`` file has no launches: see
    :func:`modelnew`."""

    problem: str
    source: str
    launches: Sequence[Union[Launch, Mapping[str, Any]]]
    language: str = "c"
    scratch: Sequence[Union[Scratch, Mapping[str, Any]]] = ()
    flags: Sequence[str] = ()
    parent: Optional[str] = None
    note: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {
            "problem": self.problem,
            "language": self.language,
            "source": self.source,
            "launches": [l.to_dict() if isinstance(l, Launch) else dict(l) for l in self.launches],
            "scratch": [s.to_dict() if isinstance(s, Scratch) else dict(s) for s in self.scratch],
            "flags": list(self.flags),
        }
        if self.parent is not None:
            d["parent"] = self.parent
        if self.note is not None:
            d["note"] = self.note
        return d


CandidateLike = Union[Candidate, Mapping[str, Any]]


def candidate_dict(candidate: CandidateLike, problem: Optional[str] = None) -> Dict[str, Any]:
    """The wire form of ``candidate``; ``problem``, when given, overrides its problem.

    Raises ``TypeError`` for something that is not a candidate and ``ValueError`` for a
    candidate that names no problem. Everything else is checked by kilnd, which answers
    a 400 naming the field at fault.
    """
    if isinstance(candidate, Candidate):
        d = candidate.to_dict()
    elif isinstance(candidate, Mapping):
        d = dict(candidate)
    else:
        raise TypeError(
            f"a candidate is a kiln.Candidate or a dict, not {type(candidate).__name__}"
        )
    if problem is not None:
        d["problem"] = problem
    if not d.get("problem"):
        raise ValueError("the candidate names no problem: set its `problem` or pass problem=")
    return d



#: The languages of hosted candidates (a KernelBench ``ModelNew`` file, no launch plan):
#: ``modelnew`` runs on the lane's GPU (cuda backend), ``modelnew-cpu`` on the CPU (host
#: backend). Every other language is launched by kiln from the candidate's plan.
HOSTED_LANGUAGES = ("modelnew", "modelnew-cpu")

_MODEL_NEW = re.compile(r"^class[ \t][^\S\n]*ModelNew[^\S\n]*[(:]", re.MULTILINE)


def defines_model_new(source: str) -> bool:
    """True when ``source`` defines ``class ModelNew`` at the top level (a line starting
    with it, then ``(`` or ``:``): kilnd's own check; the Python itself is judged only by
    the hosted runner."""
    return _MODEL_NEW.search(source) is not None


def _read_model_new(source_or_path: "Union[str, os.PathLike[str]]") -> str:
    if isinstance(source_or_path, os.PathLike):
        with open(source_or_path, encoding="utf-8") as f:
            return f.read()
    if not isinstance(source_or_path, str):
        raise TypeError(
            f"a ModelNew source is a str (the text, or a path) or a path, not {type(source_or_path).__name__}"
        )
    if "\n" not in source_or_path and os.path.isfile(source_or_path):
        with open(source_or_path, encoding="utf-8") as f:
            return f.read()
    return source_or_path


def modelnew(
    problem: str,
    source_or_path: "Union[str, os.PathLike[str]]",
    cpu: bool = False,
    note: Optional[str] = None,
    parent: Optional[str] = None,
) -> Dict[str, Any]:
    """A hosted candidate for ``problem``: a KernelBench ``ModelNew`` file, as written.

    Args:
        problem: the problem's name; it must have a torch reference (a KernelBench import
            or a ``[reference.torch]``), else kilnd refuses it (``no_torch_reference``).
        source_or_path: the file's text, or its path (a ``str`` without a newline naming
            an existing file, or an ``os.PathLike``).
        cpu: run it on the CPU (language ``modelnew-cpu``, the host backend) instead of
            the lane's GPU (``modelnew``, the cuda backend).
        note: what the candidate tries.
        parent: the id of the candidate it derives from.

    Returns the candidate dict (no ``launches``: ``ModelNew.forward`` is the plan), for
    :meth:`Client.submit`, :meth:`Client.submit_many` or :func:`kiln.rewards`.

    Raises ``ValueError`` when the text defines no top-level ``class ModelNew``, before
    anything is sent.
    """
    source = _read_model_new(source_or_path)
    if not defines_model_new(source):
        raise ValueError(
            "the source defines no top-level `class ModelNew(nn.Module)` (a KernelBench answer "
            "defines one); pass the file's text or its path"
        )
    d: Dict[str, Any] = {
        "problem": problem,
        "language": "modelnew-cpu" if cpu else "modelnew",
        "source": source,
    }
    if note is not None:
        d["note"] = note
    if parent is not None:
        d["parent"] = parent
    return d
