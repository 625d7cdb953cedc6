"""scripts/tuner_accuracy.py --quick: the base run, the CPU tuner's k* and the fixed-k rules on
the digits LeNet (200 base iterations), and the content of its CSV and Markdown."""
import csv
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:            # scripts/ is imported as a package
    sys.path.insert(0, REPO)

RUNS = ["base", "tuner", "eq9", "linear", "sqrt", "eq9, gamma per iteration"]
K_BASE, BASE_LR, BASE_GAMMA, ITERS = 64, 0.01, 1e-4, 200


def _have_digits():
    return all(os.path.exists(os.path.join(REPO, "data", "digits", d, "data.mdb"))
               for d in ("train_lmdb", "test_lmdb"))


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    if not _have_digits():
        pytest.skip("no data/digits: python -m minicaffe.tools.make_digits --out data/digits")
    out = tmp_path_factory.mktemp("tuner_accuracy")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "tuner_accuracy.py"),
                           "--quick", "--out-dir", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = list(csv.DictReader(open(out / "tuner_accuracy_quick.csv")))
    return out, rows, proc.stdout


def test_rows_and_rules(quick):
    from swap.lr import scale_lr
    _, rows, _ = quick
    assert [r["run"] for r in rows] == RUNS
    base = rows[0]
    assert (int(base["k"]), float(base["lr"]), int(base["iterations"])) == (K_BASE, BASE_LR, ITERS)
    assert base["rule"] == "base" and base["k_source"] == "base"
    k_star = int(rows[1]["k"])
    assert k_star >= 4 * K_BASE                     # the budget was chosen so that k* >> k_base
    for r in rows[1:]:
        assert int(r["k"]) == k_star
        assert r["k_source"] == "tuner"
        assert float(r["lr"]) == pytest.approx(scale_lr(BASE_LR, k_star, K_BASE, r["rule"]),
                                               rel=1e-5)
    assert [r["rule"] for r in rows[1:]] == ["eq9", "eq9", "linear", "sqrt", "eq9"]
    q = k_star / K_BASE
    for r in rows[1:-1]:                            # inv's gamma follows the epoch
        assert float(r["gamma"]) == pytest.approx(BASE_GAMMA * q, rel=1e-5)
    assert float(rows[-1]["gamma"]) == pytest.approx(BASE_GAMMA, rel=1e-5)
    assert float(rows[1]["tuner_s"]) > 0 and all(r["tuner_s"] == "" for r in rows[2:])


def test_epochs_and_accuracies(quick):
    _, rows, _ = quick
    base = rows[0]
    n_train = int(base["train_images"])
    assert n_train == 1437 and all(int(r["train_images"]) == n_train for r in rows)
    images = int(base["images"])
    assert images == K_BASE * ITERS
    for r in rows:
        k = int(r["k"])
        assert 0 <= int(r["images"]) - images < k, r["run"]   # same epochs within one batch
        assert float(r["epochs"]) == pytest.approx(int(r["images"]) / n_train, rel=1e-5)
        assert int(r["test_images"]) == 360
        acc = float(r["accuracy"])
        assert 0 <= acc <= 1 and acc == pytest.approx(int(r["correct"]) / 360, rel=1e-5)
        assert float(r["diff_points"]) == pytest.approx(100 * (acc - float(base["accuracy"])),
                                                        abs=1e-4)
        assert float(r["wall_s"]) > 0
    for r in rows[2:]:                                # fixed k: ceil(images / k*) iterations
        assert int(r["iterations"]) == -(-images // int(r["k"]))
    assert float(base["accuracy"]) > 0.9              # 200 iterations learn the digits


def test_markdown(quick):
    out, rows, stdout = quick
    md = (out / "tuner_accuracy_quick.md").read_text()
    assert f"`python3 scripts/tuner_accuracy.py --quick --out-dir {out}`" in md
    assert "CPU (" in md and "budget probe" in stdout and "| factor | budget | k_max | k* |" in md
    for r in rows:
        assert f"| {r['seed']} | {r['run']} | {r['k']} | {r['rule']} |" in md
    for run in ("tuner", "eq9", "linear"):
        assert f"- {run} (k {rows[1]['k']}): mean " in md
    assert f"seed {rows[1]['seed']}: AccUDNN decision: k* = {rows[1]['k']}" in md
    assert "| run | k | rule | seeds |" not in md          # one seed: no summary table


def test_summary_and_verdicts():
    from scripts.tuner_accuracy import summarize, verdicts
    rows = [{"seed": s, "run": run, "k": k, "rule": rule, "accuracy": acc, "diff_points": d}
            for s, runs in ((1, (("base", 64, "base", 0.99, 0.0), ("eq9", 400, "eq9", 0.985, -0.5),
                                 ("linear", 400, "linear", 0.98, -1.0))),
                            (2, (("base", 64, "base", 0.98, 0.0), ("eq9", 410, "eq9", 0.98, 0.0),
                                 ("linear", 410, "linear", 0.98, 0.0))))
            for run, k, rule, acc, d in runs]
    summ = {s["run"]: s for s in summarize(rows)}
    assert list(summ) == ["base", "eq9", "linear"]
    assert summ["eq9"]["k"] == [400, 410] and summ["eq9"]["seeds"] == 2
    assert summ["eq9"]["diff"] == pytest.approx(-0.25) and summ["eq9"]["within"] == 2
    assert summ["linear"]["diff"] == pytest.approx(-0.5) and summ["linear"]["within"] == 1
    assert (summ["linear"]["diff_min"], summ["linear"]["diff_max"]) == (-1.0, 0.0)
    v = verdicts(list(summ.values()))
    assert len(v) == 2 and all("**met**" in x for x in v)     # on the mean: -0.25, -0.5
