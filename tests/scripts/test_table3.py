"""scripts/table3.py: the quick run (CPU, a tiny net) measures the swap + recompute baseline,
AccUDNN and vDNN in one process and writes CSV, markdown, PNG and JSON whose values agree; the
table writer puts the paper's figures beside ours."""
import csv
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:            # scripts/ is imported as a package
    sys.path.insert(0, REPO)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("table3")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "table3.py"), "--quick",
                           "--out", str(out)], capture_output=True, text=True, timeout=900,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout


def test_quick_run_measures_every_competitor(quick):
    out, _ = quick
    with open(out / "table3" / "cifar10_quick.json") as f:
        r = json.load(f)
    assert r["baseline"] == "recompute"
    best = r["baseline_best"]
    assert best is not None and 1 <= best["k"] <= r["baseline_k_max"]
    assert best["images_per_s"] == max(p["images_per_s"] for p in r["baseline_points"]
                                       if "ms" in p)
    assert r["accudnn"]["k"] >= 1 and r["accudnn"]["ms"] > 0
    assert r["accudnn"]["high_water"] <= r["budget"]
    for p in r["baseline_points"]:
        if "ms" in p:
            assert p["high_water"] <= r["budget"]
    assert r["fixed"]["k"] == 6 and "vdnn" in r["fixed"] and "dynamic" in r["fixed"]
    with open(out / "table3.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert int(row["baseline_k"]) == best["k"] and int(row["accudnn_k"]) == r["accudnn"]["k"]
    assert float(row["k_gain"]) == pytest.approx(r["accudnn"]["k"] / best["k"])
    assert (out / "table3.md").read_text().count("cifar10_quick") >= 2
    assert (out / "table3.png").stat().st_size > 0


def test_the_table_carries_the_papers_figures(tmp_path):
    from scripts.table3 import write_outputs
    r = {"net": "alexnet", "baseline_k_max": 700, "tuner_seconds": 30.0,
         "baseline_best": {"k": 700, "images_per_s": 2000.0},
         "accudnn": {"k": 1400, "images_per_s": 3000.0}}
    md = write_outputs([r], str(tmp_path), "header")
    line = [ln for ln in md.splitlines() if ln.startswith("| alexnet")][0]
    assert "| 700 (700) | 2000 | 1400 | 3000 | +100% | +50% |" in line
    assert "640, 414" in line and "1032, 853" in line and "+61%, +106%" in line
    with open(tmp_path / "table3.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["img_s_gain"]) == pytest.approx(1.5)


def test_a_saved_profile_is_reused(tmp_path, tuner_quick_run):
    """--profiles: the tuner decides from a profile that tuner_table.py saved, without
    profiling again, and the JSON says which profile it reused."""
    prof = tuner_quick_run                      # `tuner_table.py --quick ... --out prof` (conftest)
    saved = prof / "tuner" / "cifar10_quick_profile.json"
    assert saved.exists()
    out = tmp_path / "t3"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "table3.py"), "--quick",
                           "--out", str(out), "--profiles", str(prof / "tuner")],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out / "table3" / "cifar10_quick.json") as f:
        r = json.load(f)
    assert r["profile_reused"].endswith("cifar10_quick_profile.json")
    assert any("reusing the saved profile" in ln for ln in r["log"])
    assert not any("Profiled minibatch" in ln for ln in r["log"])
    assert r["accudnn"]["k"] >= 1 and r["accudnn"]["ms"] > 0
