"""The GRPO reward example (sdk/python/examples/grpo_reward.py), TRL's and verl's
signatures, against the stand-in daemon: a correct answer earns its speedup over torch
eager, a wrong one and one without code earn nothing."""

from __future__ import annotations

import importlib.util
import unittest
from types import ModuleType
from typing import Any, List

import harness  # noqa: F401 - puts the package on sys.path
import kiln
from fake_kilnd import FakeKilnd

EAGER_US = 40.0


def load_example() -> ModuleType:
    path = harness.HERE.parent / "examples" / "grpo_reward.py"
    spec = importlib.util.spec_from_file_location("grpo_reward", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def answer(body: str, prose: str = "Here is a faster ReLU.") -> str:
    return (
        f"{prose}\n\n```python\nimport torch\nimport torch.nn as nn\n\n\n"
        f"class ModelNew(nn.Module):\n    def forward(self, x):\n        {body}\n```\n"
    )


CORRECT = answer("return torch.clamp_min(x, 0.0)")
WRONG = answer("return x + 1  # WRONG (the fake judges by this marker)")
NO_CODE = "ReLU is max(x, 0); I would write it with torch.relu."
# The original Model quoted first, then the answer: the last ModelNew block counts.
QUOTED = (
    "The original:\n```python\nclass Model(nn.Module):\n    pass\n```\n" + answer("return torch.relu(x)")
)


class GrpoReward(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = FakeKilnd()
        self.addCleanup(self.fake.stop)
        self.fake.register("kb-l1-19-relu", eager_us=EAGER_US, compile_us=20.0)
        self.ex = load_example()
        self.ex.configure(kiln.Client(self.fake.socket), timeout=30.0)

    def expected(self, completion: str) -> float:
        """The fake times a source at 10 + len(source) % 7 µs."""
        code = self.ex.extract_code(completion)
        return EAGER_US / (10.0 + len(code) % 7)

    def check(self, scores: List[float]) -> None:
        correct, wrong, no_code = scores
        self.assertAlmostEqual(correct, self.expected(CORRECT))
        self.assertEqual((wrong, no_code), (0.0, 0.0))
        self.assertGreater(correct, wrong)
        self.assertGreaterEqual(wrong, no_code)

    def test_extract_code(self) -> None:
        code = self.ex.extract_code(CORRECT)
        self.assertTrue(code.startswith("import torch\n") and "class ModelNew" in code)
        self.assertIsNone(self.ex.extract_code(NO_CODE))
        self.assertIsNone(self.ex.extract_code("```cpp\nclass ModelNew {};\n```"))
        self.assertIn("torch.relu", self.ex.extract_code(QUOTED))
        self.assertEqual(self.ex.extract_code([{"role": "assistant", "content": CORRECT}]), code)

    def test_trl_signature(self) -> None:
        completions = [CORRECT, WRONG, NO_CODE]
        scores = self.ex.kernelbench_reward(completions, prompts=["p"] * 3, problem=["level1/19"] * 3,
                                            completion_ids=[[1], [2], [3]])
        self.check(scores)
        self.assertEqual(self.fake.posts, 2, "the completion without code is never sent")
        # Conversational completions, and KernelBench's own dataset columns.
        convo = [[{"role": "assistant", "content": c}] for c in completions]
        self.check(self.ex.kernelbench_reward(convo, level=[1] * 3, problem_id=[19] * 3))
        with self.assertRaisesRegex(ValueError, "problem"):
            self.ex.kernelbench_reward(completions, prompts=["p"] * 3)

    def test_verl_signature(self) -> None:
        self.check([self.ex.compute_score("kernelbench", c, "level1/19") for c in (CORRECT, WRONG, NO_CODE)])
        self.assertAlmostEqual(
            self.ex.compute_score("kernelbench", QUOTED, None, extra_info={"problem": "level1/19_ReLU.py"}),
            self.expected(QUOTED),
        )
        batch: Any = self.ex.compute_score_batch(["kernelbench"] * 3, [CORRECT, WRONG, NO_CODE], ["level1/19"] * 3)
        self.check(batch)


if __name__ == "__main__":
    unittest.main()
