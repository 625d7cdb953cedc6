"""scripts/fig1_memory.py --quick: Figure 1's table, plot and markdown for two small nets, checked
against the GMAP of nets built directly at the minibatch (not scaled from k0)."""
import csv
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:            # scripts/ is imported as a package
    sys.path.insert(0, REPO)

KS = (16, 32, 64, 128, 256)
BUDGET = 32 << 20                    # --quick's default budget


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig1")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "fig1_memory.py"),
                           "--quick", "--out-dir", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = list(csv.DictReader(open(out / "fig1_memory_quick.csv")))
    return out, rows, proc.stdout


def _gmap(name, k):
    from minicaffe.net import TRAIN, Net
    from scripts.fig1_memory import net_param
    from swap.gmap import build_gmap
    return build_gmap(Net(net_param(name, k), TRAIN, mode="CPU"))


def _step_peak(g):
    return max(sum(g.buffers[b].caffe_nbytes(g.k) for b in s.touches) for s in g.steps)


def test_rows_match_nets_built_at_each_minibatch(quick):
    from swap.memory import CATEGORIES, caffe_breakdown
    _, rows, _ = quick
    assert [(r["net"], int(r["k"])) for r in rows] == [(n, k) for n in ("cifar10_quick", "digits")
                                                       for k in KS]
    for r in rows:
        cats = {c: int(r[c]) for c, _ in CATEGORIES}
        assert sum(cats.values()) == int(r["total"])
        assert 0 < int(r["layer_peak"]) < int(r["total"])
        assert float(r["layer_peak_share"]) == pytest.approx(
            int(r["layer_peak"]) / int(r["total"]), abs=1e-6)
        assert int(r["budget"]) == BUDGET
    for name in ("cifar10_quick", "digits"):
        mine = [r for r in rows if r["net"] == name]
        totals = [int(r["total"]) for r in mine]
        assert totals == sorted(totals) and totals[0] < totals[-1]
        for r in (mine[0], mine[2]):          # k = 16 and 64, built at that k
            g = _gmap(name, int(r["k"]))
            assert caffe_breakdown(g) == {c: int(r[c]) for c, _ in CATEGORIES}
            assert _step_peak(g) == int(r["layer_peak"])
    # cifar10_quick's feature maps pass 32 MiB between k = 32 and 64
    by = {(r["net"], int(r["k"])): r for r in rows}
    assert int(by[("cifar10_quick", 32)]["total"]) < BUDGET < int(by[("cifar10_quick", 64)]["total"])


def test_max_minibatches_are_the_largest_that_fit(quick):
    from scripts.fig1_memory import LayerPeak
    from swap.memory import caffe_total
    from swap.plan import max_batch
    _, rows, _ = quick
    for name in ("cifar10_quick", "digits"):
        r = next(r for r in rows if r["net"] == name)
        g = _gmap(name, 2)
        caffe_k, bound_k = int(r["caffe_max_k"]), int(r["layer_bound_k"])
        assert caffe_total(g.at(caffe_k)) <= BUDGET < caffe_total(g.at(caffe_k + 1))
        peak = LayerPeak(g)
        assert _step_peak(g.at(bound_k)) == peak.at(bound_k)[0] <= BUDGET
        assert _step_peak(g.at(bound_k + 1)) > BUDGET
        assert int(r["naive_k_max"]) == max_batch(g, "naive", BUDGET)
        # a layer-wise plan holds at least the largest step and every parameter
        assert int(r["naive_k_max"]) <= int(r["layer_bound_resident_k"]) <= bound_k
        assert caffe_k < bound_k


def test_markdown_and_plot(quick):
    out, rows, stdout = quick
    md = (out / "fig1_memory_quick.md").read_text()
    assert "`python3 scripts/fig1_memory.py --quick --out-dir " in md
    assert "static analysis on the CPU" in md and "budget 32.00 MiB" in md
    assert "| net | k = 16 | k = 32 | k = 64 | k = 128 | k = 256 |" in md
    r = rows[0]

    def mib(n):
        return f"{n / 2**20:.2f}" if n >= 2**20 / 10 else f"{n / 2**20:.3f}"
    assert f"| CIFAR-10 quick | {mib(int(r['total']))} ({mib(int(r['layer_peak']))}) |" in md
    assert f"| {r['caffe_max_k']} | - | {r['naive_k_max']} | {r['layer_bound_k']} |" in md
    png = (out / "fig1_memory_quick.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert "Caffe max k" in stdout
