"""scripts/tuner_table.py --quick: issue 5's measurement script end to end on the CPU."""
import csv
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tuner_table_quick(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "tuner_table.py"),
                           "--quick", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.load(open(tmp_path / "tuner" / "cifar10_quick.json"))
    t = r["tuner"]
    # the tuner's k* lies within its k_max, and the decision alone gives the same k* again
    assert 1 <= t["k_star"] <= t["k_max"] and t["repeat_k_star"] == t["k_star"]
    assert t["seconds"] > t["decision_seconds"] > 0 and len(t["profiled_ks"]) >= 2
    assert (tmp_path / "tuner" / "cifar10_quick_profile.json").exists()
    # none: Caffe's lowering, verified within the budget
    assert r["none"]["lowering"] == "caffe" and r["none"]["k"] >= 1
    assert r["none"]["arena"] <= r["budget"]
    assert r["none_chunked"]["k"] == r["none"]["k"] and r["none_chunked"]["lowering"] == "chunked"
    ks = [d["k"] for d in r["dynamic"]]
    assert ks[0] == t["k_star"] and len(ks) == len(set(ks))
    for d in r["dynamic"]:
        assert "error" not in d, d
        # the measured peak never exceeds the budget; the model's relative errors are computed
        assert d["high_water"] <= d["budget"] == r["budget"]
        assert d["peak_err"] == (d["pred_total"] - d["meas_total"]) / d["meas_total"]
        assert d["time_err"] == (d["pred_ms"] - d["ms"]) / d["ms"]
        assert 0.0 <= d["offload_fraction"] <= 1.0
        assert d["slowdown"] == d["ms"] / d["none_ms"]
    rows = list(csv.DictReader(open(tmp_path / "tuner_table.csv")))
    assert [x["net"] for x in rows] == ["cifar10_quick"]
    assert int(rows[0]["k_star"]) == t["k_star"] and int(rows[0]["k_none"]) == r["none"]["k"]
    md = (tmp_path / "tuner_table.md").read_text()
    assert "**Table 1**" in md and "| cifar10_quick | " in md and "CPU mode" in md


def test_tuner_table_reuses_a_saved_profile(tmp_path):
    """--profiles: the tuner decides from the profile a first run saved, without profiling,
    and the second run's JSON points at it instead of writing a new one."""
    first = tmp_path / "first"
    script = os.path.join(REPO, "scripts", "tuner_table.py")
    proc = subprocess.run([sys.executable, script, "--quick", "--no-torch", "--out", str(first)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    k_star = json.load(open(first / "tuner" / "cifar10_quick.json"))["tuner"]["k_star"]
    second = tmp_path / "second"
    proc = subprocess.run([sys.executable, script, "--quick", "--no-torch", "--out", str(second),
                           "--profiles", str(first / "tuner")],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.load(open(second / "tuner" / "cifar10_quick.json"))
    assert r["profile_reused"] is True
    assert r["profile"].endswith("first/tuner/cifar10_quick_profile.json")
    assert not (second / "tuner" / "cifar10_quick_profile.json").exists()
    assert any("reusing the saved profile" in ln for ln in r["tuner"]["log"])
    assert not any("Profiled minibatch" in ln for ln in r["tuner"]["log"])
    assert r["tuner"]["k_star"] == k_star      # the same profile, the same decision
