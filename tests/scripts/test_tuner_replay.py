"""scripts/tuner_replay.py: measured points predicted again from a run's saved numbers."""
import pytest

from scripts.tuner_replay import replay
from swap.model import IterationOverhead


def test_replay_takes_the_least_host_sum_and_the_larger_bound():
    """H is the least small-k sum; a device-bound point is its device time plus O's tail, a
    host-bound one H + O(k); a run without host sums is refused."""
    o = IterationOverhead(a=0.005, b=0.0, tail=0.001)
    run = {"net": "n", "tuner": {"host_model": {"meta": [{"k": 2, "host": 0.090},
                                                          {"k": 4, "host": 0.080}]}},
           "dynamic": [{"k": 64, "ms": 200.0, "pred_device_ms": 190.0},
                       {"k": 8, "ms": 80.0, "pred_device_ms": 40.0, "none_ms": 79.0,
                        "slowdown": 1.01},
                       {"k": 4, "error": "x"}]}
    rows = replay(run, o)
    assert [r["k"] for r in rows] == [64, 8]
    assert rows[0]["pred_ms"] == pytest.approx(191.0) and rows[0]["host_ms"] == pytest.approx(80)
    assert rows[1]["pred_ms"] == pytest.approx(85.0)
    assert rows[1]["err"] == pytest.approx(5 / 80)
    with pytest.raises(ValueError, match="no small-k host sums"):
        replay({"net": "n", "tuner": {}, "dynamic": []}, o)
