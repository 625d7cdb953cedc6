"""scripts/overhead.py: static analysis timed on the CPU for small nets, the tuner's seconds read
from a tuner-table JSON (profiling = whole tuner less the decision) or, without one, a CSV row."""
import csv
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_run_with_a_tuner_json_and_a_csv(tmp_path):
    tuner = tmp_path / "tuner"
    tuner.mkdir()
    (tuner / "digits.json").write_text(json.dumps(
        {"device": "GPU X", "date": "2026-01-02",
         "tuner": {"seconds": 50.0, "decision_seconds": 2.5, "profiled_ks": [8, 16]}}))
    table = tmp_path / "t.csv"
    table.write_text("net,tuner_s,decision_s\ncifar10_quick,30.0,0.5\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "overhead.py"),
                           "--quick", "--repeat", "1", "--tuner-dir", str(tuner),
                           "--tuner-csv", str(table), "--out-dir", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out / "overhead.csv", newline="") as f:
        rows = {r["net"]: r for r in csv.DictReader(f)}
    d, c = rows["digits"], rows["cifar10_quick"]
    assert float(d["profiling_s"]) == 47.5 and float(d["decision_s"]) == 2.5
    assert float(c["profiling_s"]) == 29.5
    for r in (d, c):
        assert int(r["steps"]) > 10 and int(r["buffers"]) > int(r["steps"])
        assert 0 < float(r["gmap_s"]) < 60
    md = (out / "overhead.md").read_text()
    assert "GPU X, 2026-01-02" in md and "t.csv (no JSON kept)" in md
    assert (out / "overhead.png").stat().st_size > 0
