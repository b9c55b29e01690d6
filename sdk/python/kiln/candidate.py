"""Building candidates: device code plus a declarative launch plan.

A candidate can always be given as a plain ``dict`` in the wire shape::

    {"problem": "vecadd-4096", "language": "c", "source": "void k(...) {...}",
     "launches": [{"kernel": "k", "args": ["x", "y", {"i32": 4096}]}]}

The dataclasses here build the same thing with names checked by the type checker;
:func:`i32` and friends write typed scalar arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

__all__ = [
    "Launch",
    "Scratch",
    "Candidate",
    "CandidateLike",
    "candidate_dict",
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
    """A candidate kernel: ``language`` is ``"c"`` (host backend) or ``"cuda"``."""

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

