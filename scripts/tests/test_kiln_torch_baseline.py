"""Tests of scripts/kiln_torch_baseline.py that need no torch and no GPU (stdlib only)."""

import importlib.util
import io
import json
import os
import sys
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("kiln_torch_baseline", os.path.join(HERE, "..", "kiln_torch_baseline.py"))
helper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(helper)


def problem(table, dtype="f32"):
    return {
        "name": "p",
        "tensor": [
            {"name": "x", "dtype": dtype, "shape": [4, 8], "role": "input", "init": {"dist": "normal", "mean": 0.0, "std": 1.0}},
            {"name": "y", "dtype": dtype, "shape": [4, 8], "role": "output"},
        ],
        "tolerance": {"atol": 1e-5, "rtol": 1e-5},
        "baseline": {"torch": table},
    }


class ParseOp(unittest.TestCase):
    def test_known_op_with_tensors(self):
        op, p = helper.parse_op(problem({"op": "softmax", "x": "x", "y": "y"}))
        self.assertEqual((op, p), ("softmax", {"x": "x", "y": "y"}))

    def test_code_is_never_an_op(self):
        for bad in ["__import__('os').system('id')", "eval", None, 3]:
            with self.assertRaises(helper.Refused):
                helper.parse_op(problem({"op": bad, "x": "x", "y": "y"}))

    def test_unknown_keys_tensors_and_types_are_refused(self):
        cases = [
            {"op": "softmax", "x": "x", "y": "y", "dim": 0},
            {"op": "softmax", "x": "nope", "y": "y"},
            {"op": "softmax", "x": "x"},
            {"op": "layer_norm", "x": "x", "y": "y", "dims": "1", "eps": 1e-5},
            {"op": "layer_norm", "x": "x", "y": "y", "dims": True, "eps": 1e-5},
            {"op": "conv2d", "x": "x", "w": "x", "y": "y", "stride": 1, "maxpool": {"kernel": 3}},
        ]
        for table in cases:
            with self.assertRaises(helper.Refused, msg=str(table)):
                helper.parse_op(problem(table))

    def test_int_eps_is_a_float_and_missing_table_refused(self):
        _, p = helper.parse_op(problem({"op": "layer_norm", "x": "x", "y": "y", "dims": 1, "eps": 1}))
        self.assertIsInstance(p["eps"], float)
        with self.assertRaises(helper.Refused):
            helper.parse_op({"tensor": []})

    def test_integer_tensors_refused(self):
        with self.assertRaises(helper.Refused):
            helper.parse_op(problem({"op": "softmax", "x": "x", "y": "y"}, dtype="i32"))


class Timing(unittest.TestCase):
    def test_stats_match_kiln(self):
        s = helper.stats([1.0, 2.0, 3.0, 4.0])
        self.assertEqual((s["n"], s["median_us"], s["mean_us"]), (4, 2.5, 2.5))
        self.assertAlmostEqual(s["stdev_us"], 1.2909944487358056)
        self.assertAlmostEqual(s["rse"], 1.2909944487358056 / 2 / 2.5)

    def test_stop_rule_order(self):
        plan = dict(helper.TIMING_DEFAULTS, min_samples=3, min_time_ms=0.0, max_samples=5, wall_cap_ms=100.0)
        self.assertIsNone(helper.stop_rule([1.0, 1.0], 1.0, plan))
        self.assertEqual(helper.stop_rule([1.0, 1.0, 1.0], 1.0, plan), "converged")
        self.assertEqual(helper.stop_rule([1.0, 9.0, 1.0], 200.0, plan), "wall_cap")
        self.assertEqual(helper.stop_rule([1.0, 9.0, 1.0, 9.0, 1.0], 1.0, plan), "max_samples")

    def test_timing_plan_keeps_known_keys(self):
        plan = helper.timing_plan(json.dumps({"min_samples": 20, "max_rse": 0.001, "recheck_fraction": 0.5}))
        self.assertEqual(plan["min_samples"], 20)
        self.assertEqual(plan["max_rse"], 0.001)
        self.assertNotIn("recheck_fraction", plan)


class Variants(unittest.TestCase):
    def test_conv_default_is_tf32_and_strict_is_added(self):
        self.assertEqual(helper.variants("conv2d", "f32"), [("tf32", True), ("fp32", False)])
        self.assertEqual(helper.variants("matmul", "f32"), [("fp32", False)])
        self.assertEqual(helper.variants("sdpa", "f16"), [("fp16", False)])


class Main(unittest.TestCase):
    def run_main(self, spec, argv=()):
        out = io.StringIO()
        with mock.patch.object(sys, "stdin", io.StringIO(json.dumps(spec))), mock.patch.object(sys, "stdout", out), \
                mock.patch.object(sys, "stderr", io.StringIO()):
            code = helper.main(list(argv))
        return code, json.loads(out.getvalue())

    def test_without_torch_every_variant_is_unavailable(self):
        with mock.patch.dict(sys.modules, {"torch": None}):
            code, out = self.run_main(problem({"op": "softmax", "x": "x", "y": "y"}))
        self.assertEqual(code, 0)
        self.assertEqual([r["status"] for r in out["results"]], ["unavailable"])
        self.assertIn("torch", out["results"][0]["detail"])

    def test_refused_problem_exits_2_with_a_failed_result(self):
        code, out = self.run_main(problem({"op": "rm -rf /", "x": "x", "y": "y"}))
        self.assertEqual(code, 2)
        self.assertEqual(out["results"][0]["status"], "failed")
        self.assertIn("refused", out["results"][0]["detail"])


if __name__ == "__main__":
    unittest.main()
