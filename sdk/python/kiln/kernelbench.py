"""KernelBench problem ids: ``level1/19`` (KernelBench's ``level1/19_ReLU.py``) names the
kiln problem that ``kiln problems import kernelbench`` registered for it,
``kb-l1-19-relu`` (``kb-l{level}-{id}-{slug}``).

::

    kb = kiln.KernelBenchProblem.parse("level1/19")     # or KernelBenchProblem(level=1, id=19)
    name = kb.find(client.problems())                   # "kb-l1-19-relu"
    records = kiln.rewards(client, kb, model_new_texts, language="modelnew")
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional, Union

from .errors import NotFound
from .models import ProblemSummary

__all__ = ["KernelBenchProblem"]

#: ``level1/19``, ``level1/19_ReLU.py``, ``KernelBench/level1/19_ReLU.py``.
_PATH = re.compile(r"(?:^|/)level(\d+)/(\d+)(?:_[^/]*)?$")
#: KernelBench's run names: ``level_1_problem_19``, ``level_1_problem_19_sample_0``.
_RUN = re.compile(r"^level_(\d+)_problem_(\d+)(?:_sample_\d+)?$")


@dataclass(frozen=True)
class KernelBenchProblem:
    """KernelBench's problem ``id`` of ``level`` (``level1/19_ReLU.py``: level 1, id 19)."""

    level: int
    id: int

    def __post_init__(self) -> None:
        for what, v in (("level", self.level), ("id", self.id)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"a KernelBench {what} is a positive integer, not {v!r}")

    @classmethod
    def parse(cls, text: str) -> "KernelBenchProblem":
        """Reads ``level1/19`` (also KernelBench's file path, ``level1/19_ReLU.py``, and its
        run names, ``level_1_problem_19[_sample_K]``); ``ValueError`` for anything else."""
        kb = cls.from_text(text)
        if kb is None:
            raise ValueError(
                f"{text!r} is not a KernelBench problem id: write it `level1/19` (or "
                "`level1/19_ReLU.py`, `level_1_problem_19`)"
            )
        return kb

    @classmethod
    def from_text(cls, text: str) -> Optional["KernelBenchProblem"]:
        """:meth:`parse`, or ``None`` when ``text`` is not a KernelBench id (a kiln problem
        name never is: it has no ``/`` and no ``_problem_`` between numbers)."""
        m = _PATH.search(text.strip()) or _RUN.match(text.strip())
        if m is None or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            return None
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"level{self.level}/{self.id}"

    @property
    def prefix(self) -> str:
        """How the names of its kiln problems start: ``kb-l1-19-``."""
        return f"kb-l{self.level}-{self.id}-"

    def find(self, problems: Iterable[Union[str, ProblemSummary]]) -> str:
        """The name of its registered kiln problem among ``problems`` (names, or
        :meth:`kiln.Client.problems`' answer): the one whose name starts with
        :attr:`prefix`.

        Raises :class:`~kiln.errors.NotFound` when none does (the level is not
        imported) and ``ValueError`` naming them when several do (pass the one meant
        by name).
        """
        names = sorted({p if isinstance(p, str) else p.name for p in problems})
        hits = [n for n in names if n.startswith(self.prefix)]
        if not hits:
            raise NotFound(
                404,
                "not_found",
                f"no registered problem is KernelBench {self} (a name starting {self.prefix!r}): "
                "import it with `kiln problems import kernelbench` and `kiln problems add`",
            )
        if len(hits) > 1:
            raise ValueError(
                f"KernelBench {self} matches several registered problems ({', '.join(hits)}): "
                "pass the one meant by its name"
            )
        return hits[0]


def problem_id(problem: Union[str, KernelBenchProblem]) -> Union[str, KernelBenchProblem]:
    """``problem`` as a :class:`KernelBenchProblem` when it is (or reads as) one, else
    the kiln problem name it is."""
    if isinstance(problem, KernelBenchProblem):
        return problem
    if not isinstance(problem, str):
        raise TypeError(
            f"a problem is a kiln problem name or a KernelBench id (`level1/19`, "
            f"kiln.KernelBenchProblem), not {type(problem).__name__}"
        )
    return KernelBenchProblem.from_text(problem) or problem
