"""scripts/conv_algos.py: the rules' workspace limits and the per-batch summary (CPU; the
timings themselves need a GPU)."""
import importlib.util
import os

import pytest

_spec = importlib.util.spec_from_file_location(
    "conv_algos", os.path.join(os.path.dirname(__file__), "..", "..", "scripts",
                               "conv_algos.py"))
conv_algos = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conv_algos)


def test_rule_limits():
    assert conv_algos.rule_limit("find:768M", 64) == (768 << 20, True)
    assert conv_algos.rule_limit("heur:64M", 512) == (64 << 20, False)
    assert conv_algos.rule_limit("per:4M", 100) == (400 << 20, True)   # grows with the batch
    for bad in ("find", "per:", "best:4M"):
        with pytest.raises(ValueError, match="use heur"):
            conv_algos.rule_limit(bad, 8)


def test_summary_per_batch_and_rule():
    rows = [{"batch": 64, "rule": "per:4M", "ms": 1.5, "workspace_bytes": 10},
            {"batch": 64, "rule": "per:4M", "ms": 2.0, "workspace_bytes": 30},
            {"batch": 128, "rule": "per:4M", "ms": 7.0, "workspace_bytes": 60},
            {"batch": 64, "rule": "torch", "ms": 1.0, "workspace_bytes": 0}]
    s = conv_algos.summarize(rows)
    assert s == {(64, "per:4M"): (3.5, 30), (128, "per:4M"): (7.0, 60), (64, "torch"): (1.0, 0)}
