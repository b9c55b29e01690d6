"""Rewards for GRPO-style RL on KernelBench, measured by kiln.

The policy answers a KernelBench problem with a Python file defining ``class
ModelNew(nn.Module)`` (its ``load_inline`` CUDA, Triton kernels, torch layers) in a
fenced ```python block. The functions here take the last such block of each completion
and score them all with ``kiln.rewards`` in one pipelined batch, language ``modelnew``:
each file runs as written in kiln's jailed hosted runner, on kiln's inputs and weights,
its outputs compared and its time taken by kiln, never by the file.

TRL (``GRPOTrainer(..., reward_funcs=kernelbench_reward)``)::

    kernelbench_reward(completions, **kwargs) -> list[float]

  ``completions`` are strings, or conversations (lists of ``{"role", "content"}``
  messages). TRL passes the dataset's columns as keyword arguments; the problem of each
  completion is its ``problem`` column (``"level1/19"``, ``"level1/19_ReLU.py"`` or a
  kiln problem name), else its ``level`` and ``problem_id`` columns (those of
  KernelBench's own dataset).

verl (``custom_reward_function.path=sdk/python/examples/grpo_reward.py``,
``custom_reward_function.name=compute_score``)::

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float

  The problem is ``ground_truth`` (``"level1/19"``), else ``extra_info["problem"]``.
  verl's default reward manager calls it once per completion; its batch reward manager
  can call ``compute_score_batch(data_sources, solution_strs, ground_truths,
  extra_infos)`` instead, which evaluates the whole batch at once.

The reward is ``kiln.Reward.reward``: for a correct answer, its speedup over torch eager
(the fp32 variant, timed on the same GPU model), or 1.0 while that baseline is not
measured (``kiln problems baseline NAME`` measures it); 0.0 for everything else: no code
block with a ``ModelNew``, a refused file, a compile error, a wrong answer, a forward
that only calls the library the reference calls (``no_own_kernels``), and no verdict
(a timeout, a failed job). kilnd's queue being full is waited out, not punished.

Needs kilnd running with the KernelBench problems registered (``kiln problems import
kernelbench`` then ``kiln problems add``) and the kiln client (``pip install
./sdk/python``); nothing else, no torch on the trainer's side. Settings, from the
environment or :func:`configure`: ``KILN_SOCKET`` (kilnd's socket),
``KILN_REWARD_LANGUAGE`` (``modelnew``; ``modelnew-cpu`` runs the files on the CPU,
where nothing has a speedup), ``KILN_REWARD_TIMEOUT`` (seconds per answer, 600).
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

import kiln

__all__ = ["kernelbench_reward", "compute_score", "compute_score_batch", "extract_code", "configure"]

_settings: Dict[str, Any] = {
    "client": None,
    "language": os.environ.get("KILN_REWARD_LANGUAGE", "modelnew"),
    "timeout": float(os.environ.get("KILN_REWARD_TIMEOUT", "600")),
    "window": 64,
}

#: A fenced block tagged python (or untagged): its body.
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)


def configure(
    client: Optional[kiln.Client] = None,
    *,
    language: Optional[str] = None,
    timeout: Optional[float] = None,
    window: Optional[int] = None,
) -> None:
    """Sets the client (default: ``kiln.Client()``, made at the first call), the
    language (``modelnew`` or ``modelnew-cpu``), the seconds each answer may take and
    the answers in flight at once."""
    for key, value in (("client", client), ("language", language), ("timeout", timeout), ("window", window)):
        if value is not None:
            _settings[key] = value


def _client() -> kiln.Client:
    if _settings["client"] is None:
        _settings["client"] = kiln.Client()
    return _settings["client"]


def _text(completion: Any) -> str:
    """A completion's text: a string, or the contents of a conversation's messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence):
        return "\n".join(
            m["content"] for m in completion if isinstance(m, Mapping) and isinstance(m.get("content"), str)
        )
    return ""


def extract_code(completion: Any) -> Optional[str]:
    """The last fenced python block of ``completion`` that defines ``class ModelNew``
    (an answer often quotes the original ``Model`` first), or ``None``."""
    blocks = [b for b in _FENCE.findall(_text(completion)) if kiln.defines_model_new(b)]
    return blocks[-1] if blocks else None


def score(completions: Sequence[Any], problems: Sequence[Any]) -> List[float]:
    """One reward per completion; ``problems[i]`` is the problem completion ``i``
    answers. Completions without code are 0.0 and never sent."""
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems for {len(completions)} completions")
    codes = [extract_code(c) for c in completions]
    todo = [i for i, code in enumerate(codes) if code is not None]
    out = [0.0] * len(completions)
    if todo:
        records = kiln.rewards(
            _client(),
            [str(problems[i]) for i in todo],
            [codes[i] for i in todo],
            language=_settings["language"],
            timeout=_settings["timeout"],
            window=_settings["window"],
        )
        for i, record in zip(todo, records):
            out[i] = record.reward
    return out


def kernelbench_reward(completions: List[Any], **kwargs: Any) -> List[float]:
    """TRL's reward function: one float per completion (see the module's docstring)."""
    if "problem" in kwargs:
        problems = list(kwargs["problem"])
    elif "level" in kwargs and "problem_id" in kwargs:
        problems = [f"level{int(lv)}/{int(pid)}" for lv, pid in zip(kwargs["level"], kwargs["problem_id"])]
    else:
        raise ValueError(
            "kernelbench_reward needs the problem of each completion: a `problem` column "
            "(`level1/19`) or `level` and `problem_id` columns in the dataset"
        )
    return score(completions, problems)


def _problem(ground_truth: Any, extra_info: Optional[Mapping[str, Any]]) -> Any:
    if ground_truth:
        return ground_truth
    if extra_info and extra_info.get("problem"):
        return extra_info["problem"]
    raise ValueError("compute_score needs the problem: ground_truth `level1/19` (or extra_info['problem'])")


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Optional[Mapping[str, Any]] = None
) -> float:
    """verl's reward function: the reward of one completion (see the module's docstring)."""
    return score([solution_str], [_problem(ground_truth, extra_info)])[0]


def compute_score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Optional[Sequence[Optional[Mapping[str, Any]]]] = None,
    **kwargs: Any,
) -> List[float]:
    """verl's batch reward manager's function: one reward per completion, evaluated as
    one batch."""
    infos = list(extra_infos) if extra_infos is not None else [None] * len(solution_strs)
    return score(solution_strs, [_problem(gt, info) for gt, info in zip(ground_truths, infos)])
