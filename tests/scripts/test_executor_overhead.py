"""scripts/executor_overhead.py: the executor's host time per iteration, apart from the layers'
compute and the copies; the quick run on the CPU reports every strategy with consistent parts
(no timing thresholds: only that the numbers add up and the op counts are the plan's)."""
import os
import sys
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:            # scripts/ is imported as a package
    sys.path.insert(0, REPO)


def test_quick_run_reports_every_strategy(capsys):
    from scripts.executor_overhead import STRATEGIES, install_strategy, main, make_solver
    rows = main(["--quick"])
    out = capsys.readouterr().out
    assert "| strategy | steps | transfers | iteration ms | host ms |" in out
    assert "step loop" in out
    assert [r["strategy"] for r in rows] == list(STRATEGIES)
    for r in rows:
        assert r["steps"] > 0
        assert 0 < r["layers_ms"] <= r["iteration_ms"]
        assert r["copies_ms"] >= 0 and r["overhead_ms"] >= 0
        assert abs(r["host_ms"] - r["layers_ms"] - r["copies_ms"] - r["overhead_ms"]) \
            < 0.1 * r["host_ms"]                        # medians of parts, not exactly additive
        assert r["host_ms"] <= r["iteration_ms"] * 1.1  # on the CPU the host is the iteration
    by = {r["strategy"]: r for r in rows}
    assert by["plain"]["kinds"] == {} and by["plain"]["alone_ms"] is None   # no executor
    assert all(r["alone_ms"] > 0 for r in rows[1:])
    assert set(by["none"]["kinds"]) == {"step loop"}    # everything resident: no per-step ops
    for strategy in ("naive", "vdnn", "dynamic"):
        # per iteration, each kind's count is the plan's number of per-iteration ops of it
        ex = install_strategy(make_solver("cifar10_quick", 1, None), strategy)
        try:
            plan_counts = Counter(op.kind for op in ex.plan.ops if op.step >= 0)
        finally:
            ex.close()
        kinds = by[strategy]["kinds"]
        assert {k: n for k, (n, _) in kinds.items() if k != "step loop"} == dict(plan_counts)
        assert kinds["step loop"][0] == by[strategy]["steps"]


def test_rounds_per_image_and_whole_steps(tmp_path, capsys, monkeypatch):
    """--rounds and --per-image repeat the strategies in turn, each row tagged with its round
    and bound; the bound is restored afterwards; --step times whole solver steps and records
    the process's CPU time and the host's load beside each row."""
    import json
    from minicaffe.cudnn.ops import ENV_WORKSPACE_PER_IMAGE
    from scripts.executor_overhead import main
    monkeypatch.setenv(ENV_WORKSPACE_PER_IMAGE, "3M")
    out = tmp_path / "rows.json"
    rows = main(["--quick", "--strategies", "none,dynamic", "--rounds", "2",
                 "--per-image", "8M,0", "--step", "--brief", "--json", str(out),
                 "--cprofile", "1"])
    assert os.environ[ENV_WORKSPACE_PER_IMAGE] == "3M"
    assert [(r["strategy"], r["tag"]) for r in rows] == [
        (s, f"round {n}, {pi} per image") for pi in ("8M", "0") for n in (1, 2)
        for s in ("none", "dynamic")]
    for r in rows:
        assert r["alone_ms"] is None and r["kinds"] == {}       # --brief
        assert len(r["times_ms"]) == 2 and r["cpu_ms"] > 0
        assert len(r["before"]["loadavg"]) == 3
        prof = r["cprofile"]                                    # --cprofile: own time, sorted
        assert prof and [p[2] for p in prof] == sorted((p[2] for p in prof), reverse=True)
        assert any("forward" in p[0] for p in prof)
    assert json.loads(out.read_text())[0]["tag"] == "round 1, 8M per image"
    text = capsys.readouterr().out
    assert "| dynamic (round 2, 0 per image) |" in text and "whole solver steps" in text
